"""The read-only ceiling of device memory: how many bytes a second a kernel that only reads can move.

:func:`orthros.benchmarks.inference.copy_bandwidth` times a device-to-device copy, which reads and
writes; the decode floors of issue #18 divide a step's bytes by it. A decode step only reads its
weights and cache, and a read-only stream runs past a copy (on an H100 at 106-108% of it, on an
H200 the LM head's GEMV at 109%). :func:`read_bandwidth` measures that ceiling in the same run, so
a step can also be read against ``bytes / read ceiling``: the floor of a kernel that reads those
bytes once.

The stream is one Triton kernel (:func:`read_sum`): one program a run of ``chunk`` contiguous
pieces of ``block`` elements (32-64 KB a program, the way the LM head's GEMV walks its rows), each
program summing what it read into one float32, so no load is dead code. A grid-strided form (a few
programs a multiprocessor) measured 1-2% slower on an H100 and was dropped
(docs/results/s39-2026-12-05). :func:`read_bandwidth` times a few launch configs and
``torch.sum`` on a buffer far past the L2 cache, each call in a CUDA graph, and keeps the fastest.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import torch
import triton
import triton.language as tl

from .inference import capture_graph, replay_seconds, time_call


@triton.jit
def _read_sum_kernel(x_ptr, out_ptr, BLOCK: tl.constexpr, CHUNK: tl.constexpr):
    pid = tl.program_id(0)
    ptr = x_ptr + pid.to(tl.int64) * (CHUNK * BLOCK) + tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for _ in range(CHUNK):
        acc += tl.load(ptr).to(tl.float32)
        ptr += BLOCK
    tl.store(out_ptr + pid, tl.sum(acc, axis=0))


# (block elements, warps, pipeline stages, pieces a program): 32 or 64 KB a program
READ_CONFIGS: Tuple[Tuple[int, int, int, int], ...] = tuple(
    (block, warps, stages, chunk) for block, chunk in ((4096, 8), (8192, 4), (8192, 8))
    for warps in (4, 8) for stages in (2, 3))
BUFFER_QUANTUM = 65536  # read_bandwidth's buffer is a multiple of this many elements: of every config's run


def read_sum(x: torch.Tensor, *, block: int = 8192, warps: int = 8, stages: int = 2, chunk: int = 8,
             out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Float32 sums of the runs of ``chunk * block`` contiguous elements of a contiguous 1-D ``x``
    (its length a multiple of that), one program a run; the result's sum is ``x``'s. ``out``: where
    to write them (float32, one a run, on ``x``'s device)."""
    if block < 1 or block & (block - 1):
        raise ValueError(f"block must be a power of two, got {block}")
    if warps not in (1, 2, 4, 8, 16):
        raise ValueError(f"warps must be one of 1, 2, 4, 8, 16, got {warps}")
    if stages < 1:
        raise ValueError(f"stages must be >= 1, got {stages}")
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    if x.dim() != 1 or not x.is_contiguous():
        raise ValueError(f"x must be a contiguous 1-D tensor, got shape {tuple(x.shape)}")
    if x.numel() % (chunk * block):
        raise ValueError(f"x's length ({x.numel()}) must be a multiple of chunk * block ({chunk * block})")
    grid = x.numel() // (chunk * block)
    if out is None:
        out = torch.empty(grid, dtype=torch.float32, device=x.device)
    elif (out.shape != (grid,) or out.dtype != torch.float32 or out.device != x.device
          or not out.is_contiguous()):  # the kernel writes grid sums, one after the other
        raise ValueError(f"out must be a contiguous float32 tensor of shape ({grid},) on {x.device}, got "
                         f"{out.dtype} {tuple(out.shape)} on {out.device}")
    _read_sum_kernel[(grid,)](x, out, BLOCK=block, CHUNK=chunk, num_warps=warps, num_stages=stages)
    return out


def config_label(block: int, warps: int, stages: int, chunk: int) -> str:
    return f"read_sum {block}x{chunk} w{warps} st{stages}"


def read_bandwidth(device, nbytes: int = 2**31, configs: Sequence[Tuple[int, int, int, int]] = READ_CONFIGS,
                   reps: int = 10) -> Dict:
    """The read-only ceiling of ``device``: ``{"bytes_per_s", "how", "candidates": [(how, bytes/s)]}``,
    ``bytes_per_s`` the fastest candidate's ``nbytes / time``. On CUDA the candidates are
    :func:`read_sum` at each of ``configs`` and ``torch.sum``, each timed as the median of ``reps``
    replays of a CUDA graph of one call; elsewhere ``torch.sum`` alone, by wall clock."""
    device = torch.device(device)
    if nbytes < 2 * BUFFER_QUANTUM:
        raise ValueError(f"nbytes must be >= {2 * BUFFER_QUANTUM}, got {nbytes}")
    for c in configs:
        if BUFFER_QUANTUM % (c[0] * c[3]):
            raise ValueError(f"config {c}: block * chunk must divide {BUFFER_QUANTUM}")
    n = nbytes // 2 // BUFFER_QUANTUM * BUFFER_QUANTUM  # bf16 elements
    x = torch.ones(n, dtype=torch.bfloat16, device=device)
    moved = 2 * n
    cands: List[Tuple[str, float]] = []
    if device.type == "cuda":
        for block, warps, stages, chunk in configs:
            out = torch.empty(n // (block * chunk), dtype=torch.float32, device=device)
            g = capture_graph(lambda: read_sum(x, block=block, warps=warps, stages=stages, chunk=chunk, out=out),
                              device)
            t = replay_seconds(g, reps)
            if float(out.sum()) != n:  # every element is 1: a short read would show
                raise RuntimeError(f"{config_label(block, warps, stages, chunk)} summed {float(out.sum())}, not {n}")
            cands.append((config_label(block, warps, stages, chunk), moved / t))
            del g
        g = capture_graph(lambda: torch.sum(x, dtype=torch.float32), device)
        cands.append(("torch.sum", moved / replay_seconds(g, reps)))
        del g
    else:
        torch.sum(x, dtype=torch.float32)
        ts = sorted(time_call(lambda: torch.sum(x, dtype=torch.float32), device) for _ in range(max(1, reps)))
        cands.append(("torch.sum", moved / ts[len(ts) // 2]))
    how, best = max(cands, key=lambda c: c[1])
    return {"bytes_per_s": best, "how": how, "candidates": cands}


__all__ = ["READ_CONFIGS", "BUFFER_QUANTUM", "read_sum", "read_bandwidth", "config_label"]

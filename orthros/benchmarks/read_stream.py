"""The read-only ceiling of device memory: how many bytes a second a kernel that only reads can move.

:func:`orthros.benchmarks.inference.copy_bandwidth` times a device-to-device copy, which reads and
writes; the decode floors of issue #18 divide a step's bytes by it. A decode step only reads its
weights and cache, and a read-only stream runs past a copy (on an H200 the LM head's GEMV reached
109% of it, on an H100 106.5%). :func:`read_bandwidth` measures that ceiling in the same run, so a
step can also be read against ``bytes / read ceiling``, the floor no kernel that reads those bytes
once can beat.

The stream is one Triton kernel (:func:`read_sum`): a grid of ``programs`` reading a buffer in
``block``-element pieces, grid-strided, each program summing what it read into one float32 (so no
load is dead code). :func:`read_bandwidth` times a few launch configs and ``torch.sum`` on a buffer
far past the L2 cache, each call in a CUDA graph, and keeps the fastest.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import torch
import triton
import triton.language as tl

from ..ops.triton.common import num_sms
from .inference import capture_graph, replay_seconds, time_call


@triton.jit
def _read_sum_kernel(x_ptr, out_ptr, n_blocks, BLOCK: tl.constexpr, CHUNK: tl.constexpr):
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    if CHUNK > 0:  # program p: the CHUNK contiguous pieces from p * CHUNK (a grid of n_blocks / CHUNK)
        ptr = x_ptr + pid.to(tl.int64) * (CHUNK * BLOCK) + offs
        for _ in range(CHUNK):
            acc += tl.load(ptr).to(tl.float32)
            ptr += BLOCK
    else:  # grid-strided: pieces p, p + programs, ...
        nprog = tl.num_programs(0)
        ptr = x_ptr + pid.to(tl.int64) * BLOCK + offs
        step = nprog.to(tl.int64) * BLOCK
        for _ in range(pid, n_blocks, nprog):
            acc += tl.load(ptr).to(tl.float32)
            ptr += step
    tl.store(out_ptr + pid, tl.sum(acc, axis=0))


# (block elements, warps, pipeline stages, programs: "xN" N a multiprocessor, grid-strided; "cN" one program a
# run of N contiguous pieces, as many programs as that takes)
READ_CONFIGS: Tuple[Tuple[int, int, int, str], ...] = (
    tuple((block, warps, 3, f"x{per_sm}") for block in (4096, 8192) for warps in (4, 8) for per_sm in (4, 8))
    + tuple((block, warps, stages, f"c{chunk}") for block, chunk in ((4096, 8), (8192, 4), (8192, 8))
            for warps in (4, 8) for stages in (2, 3)))


def _check_config(block: int, warps: int, stages: int, programs: int) -> None:
    if block < 1 or block & (block - 1):
        raise ValueError(f"block must be a power of two, got {block}")
    if warps not in (1, 2, 4, 8, 16):
        raise ValueError(f"warps must be one of 1, 2, 4, 8, 16, got {warps}")
    if stages < 1:
        raise ValueError(f"stages must be >= 1, got {stages}")
    if programs < 1:
        raise ValueError(f"programs must be >= 1, got {programs}")


def read_sum(x: torch.Tensor, *, block: int = 4096, warps: int = 4, stages: int = 3, programs: int = 8,
             chunk: int = 0, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Per-program float32 sums of a contiguous 1-D ``x`` whose length is a multiple of ``block``
    (with ``chunk``, of ``chunk * block``); the result's sum is ``x``'s. Without ``chunk``,
    ``programs`` programs, program ``p`` summing pieces ``p, p + programs, ...``; with it, one
    program a run of ``chunk`` contiguous pieces (``programs`` is then ignored)."""
    _check_config(block, warps, stages, programs)
    if chunk < 0:
        raise ValueError(f"chunk must be >= 0, got {chunk}")
    if x.dim() != 1 or not x.is_contiguous():
        raise ValueError(f"x must be a contiguous 1-D tensor, got shape {tuple(x.shape)}")
    piece = block * max(1, chunk)
    if x.numel() % piece:
        raise ValueError(f"x's length ({x.numel()}) must be a multiple of {'chunk * ' if chunk else ''}block "
                         f"({piece})")
    grid = x.numel() // piece if chunk else programs
    if out is None:
        out = torch.empty(grid, dtype=torch.float32, device=x.device)
    _read_sum_kernel[(grid,)](x, out, x.numel() // block, BLOCK=block, CHUNK=chunk, num_warps=warps,
                              num_stages=stages)
    return out


def config_label(block: int, warps: int, stages: int, programs: str) -> str:
    where = f"{programs}/SM" if programs.startswith("x") else f"{programs[1:]} pieces a program"
    return f"read_sum {block} w{warps} st{stages} {where}"


def _launch(x: torch.Tensor, sms: int, config) -> Tuple[Dict, int]:
    """read_sum's keyword arguments for ``config`` (a :data:`READ_CONFIGS` entry), and its grid."""
    block, warps, stages, programs = config
    n = int(programs[1:])
    if programs.startswith("x"):
        return dict(block=block, warps=warps, stages=stages, programs=sms * n), sms * n
    return dict(block=block, warps=warps, stages=stages, chunk=n), x.numel() // (block * n)


def read_bandwidth(device, nbytes: int = 2**31, configs: Sequence[Tuple[int, int, int, str]] = READ_CONFIGS,
                   reps: int = 10) -> Dict:
    """The read-only ceiling of ``device``: ``{"bytes_per_s", "how", "candidates": [(how, bytes/s)]}``,
    ``bytes_per_s`` the fastest candidate's ``nbytes / time``. On CUDA the candidates are
    :func:`read_sum` at each of ``configs`` and ``torch.sum``, each timed as the median of ``reps``
    replays of a CUDA graph of one call; elsewhere ``torch.sum`` alone, by wall clock."""
    device = torch.device(device)
    if nbytes < 2 * 65536:
        raise ValueError(f"nbytes must be >= {2 * 65536}, got {nbytes}")
    n = nbytes // 2 // 65536 * 65536  # bf16 elements, a multiple of every block and chunk
    x = torch.ones(n, dtype=torch.bfloat16, device=device)
    moved = 2 * n
    cands: List[Tuple[str, float]] = []
    if device.type == "cuda":
        sms = num_sms(device)
        for config in configs:
            kw, grid = _launch(x, sms, config)
            out = torch.empty(grid, dtype=torch.float32, device=device)
            g = capture_graph(lambda: read_sum(x, out=out, **kw), device)
            t = replay_seconds(g, reps)
            if float(out.sum()) != n:  # every element is 1: a short read would show
                raise RuntimeError(f"{config_label(*config)} summed {float(out.sum())}, not {n}")
            cands.append((config_label(*config), moved / t))
            del g
        g = capture_graph(lambda: torch.sum(x, dtype=torch.float32), device)
        cands.append(("torch.sum", moved / replay_seconds(g, reps)))
        del g
    else:
        torch.sum(x, dtype=torch.float32)
        ts = sorted(time_call(lambda: torch.sum(x, dtype=torch.float32), device) for _ in range(max(1, reps)))
        cands.append(("torch.sum", moved / ts[len(ts) // 2]))
    del x
    how, best = max(cands, key=lambda c: c[1])
    return {"bytes_per_s": best, "how": how, "candidates": cands}


__all__ = ["READ_CONFIGS", "read_sum", "read_bandwidth", "config_label"]

"""W_O's GEMV with its weight read into shared memory while the attention runs (issue #18,
target 1; docs/performance.md, inference change 37). Experimental, off by default.

A pair layer's W_O GEMV at a 1K context starts only when the attention's merge is over, and
through the attention (~6.6 us a layer) HBM carries only the span's 4 MB of K/V. The kernel of
``preload.cu`` streams W_O's rows into a shared-memory ring with the bulk copy engine from a
producer thread that reads nothing another kernel writes, so under programmatic dependent launch
(PDL) its first ``ORTHROS_GEMV_PRELOAD`` rows a block arrive before its wait for the merge
returns. For the blocks to be resident that early the merge launch (at one batch row) may signal
before its own wait (``EARLY_COMBINE``, off unless ``ORTHROS_GEMV_PRELOAD_EARLY=1``;
:func:`orthros.ops.triton.decode._decode_combine`): every kernel ahead of W_O's is resident by
then, so no waiting block holds a slot that one ahead still needs. Measured on an H100
(2026-12-05, docs/performance.md, changes 37-39): no setting is faster than the Triton GEMV.
Without the early signal the plain form is 1.6% slower a 1K pair step, the merge form 3.2%
slower. With it, the plain form gave NaN logits: its ``x`` loads took the non-coherent path
while the kernel ahead still wrote ``x``. They are coherent now (``__ldcg``), which no GPU has
run yet, hence the opt-in.

It writes float32 ``[1, M, N]`` partials; the GEMV's split-K reduce (``_gemv_reduce_norm``)
adds the residual and writes the output's RMSNorm as for the Triton GEMV. Used by
:func:`orthros.ops.gemv.kernel.gemv_triton` for a launch it :func:`applies` to: a PDL launch
(``M >= ORTHROS_PDL_MIN_M``) of ``M <= 2`` bf16 rows with the output's norm (the layer's W_O),
no bias, no prologue, ``K`` in 2048 / 4096 / 8192.

CUDA C++, so it is built with ``nvcc -arch=sm_90`` (on ``PATH`` or ``ORTHROS_NVCC``) at first
use into ``$ORTHROS_CACHE/kernels`` (default ``~/.cache/orthros/kernels``), named by a hash of
the source and flags; there is no CPU form. ``ORTHROS_GEMV_PRELOAD`` (read at import): the
ring's slots a block fills before its wait (a weight row of ``K * 2`` bytes each; in the merge
form 8 rows of one K slice, 8 KB for 4 heads of 128), 0 (the default) turns it off;
``ORTHROS_GEMV_PRELOAD_GROUP`` (:data:`GROUP`, 1 or 2, default 2): the pieces a consumer warp
takes a step, so that two rows' shuffle reductions interleave (inference change 39);
``ORTHROS_GEMV_PRELOAD_EARLY=1``: the merge signals before its wait (default 0: after it, as
without the preload; the W_O blocks then become resident only once the attention is over);
``ORTHROS_GEMV_PRELOAD_MERGE=1``: the merge form, where the attention hands W_O its split
partials unmerged and W_O's blocks merge them after their wait (no merge launch; blocks of K
slices of 4 heads; :func:`defers_merge`, :func:`launch_merge`); ``ORTHROS_QKV_FIT_STAGES``
(:data:`FIT_STAGES`, on with the preload unless set to 0): the split kernel beside the ring gets
no more pipeline stages than its loop has trips (at 1K: one stage, 18 KB of shared memory a
program instead of 66 KB; inference change 38).

How large a ring the blocks can hold while the attention runs: a multiprocessor's 228 KB less
the split program beside it and the merge launch's 2 KB program (1 KB reserved a block). At
Qwen3-8B's shape and 1K (a cache span of up to ~1.1K slots: at most one split program a
multiprocessor) up to 25 pieces with :data:`FIT_STAGES`, 19 without, in either form. Beside two
split programs (a 2048-slot span) their registers leave no room for a block at all. A block
that does not fit still runs, but becomes resident only once the attention's programs leave.
"""

from __future__ import annotations

import ctypes
import os
import shutil
from pathlib import Path

import torch

from ...utils import build_shared_library, cache_root
from ..triton.common import PDL_MIN_M, cdiv, env_number, num_sms, pdl_kwargs

SOURCE = Path(__file__).with_name("preload.cu")
NVCC_FLAGS = ("-O3", "-std=c++17", "-arch=sm_90", "-Xptxas", "-v", "-shared", "-Xcompiler", "-fPIC")
KS = (2048, 4096, 8192)  # the K the kernel is instantiated for (8 warps x 32 lanes x 8, 16, 32)
MAX_ROWS = 2


def _one_of(name: str, default: str, allowed: tuple, what: str) -> int:
    """The integer setting ``name`` (read at import), one of ``allowed``; ``ValueError`` naming the
    variable, what it sets and the values allowed otherwise."""
    must = f"{' or '.join(map(str, allowed))} ({what})"
    value = env_number(name, default, int, must)
    if value not in allowed:
        raise ValueError(f"{name} must be {must}, got {value}")
    return value


PIECES = env_number("ORTHROS_GEMV_PRELOAD", "0", int, "a whole number of weight rows (0: off)")
if PIECES < 0:
    raise ValueError(f"ORTHROS_GEMV_PRELOAD must be >= 0 (rows a block preloads; 0: off), got {PIECES}")
EARLY_COMBINE = PIECES > 0 and env_number("ORTHROS_GEMV_PRELOAD_EARLY", "0", int, "0 or 1") != 0
# the merge form: the decode kernel's split partials merged by W_O's blocks (no merge launch)
MERGE = PIECES > 0 and env_number("ORTHROS_GEMV_PRELOAD_MERGE", "0", int, "0 or 1") != 0
# The attention's split kernel with no more pipeline stages than its loop has trips (at 1K one
# or none: the first key block is loaded ahead of its wait, a split holds one or two): Triton
# sizes 66 KB of shared memory a program at 3 stages, 18 KB at 1 (compiled for sm_90,
# tests/ops/test_decode.py), room the ring of the W_O blocks resident beside it can take
# (orthros.ops.triton.decode.qkv_stages; inference change 38). ORTHROS_QKV_FIT_STAGES: 1 on, 0
# off; unset: on with the preload.
FIT_STAGES = _one_of("ORTHROS_QKV_FIT_STAGES", "1" if PIECES > 0 else "0", (0, 1),
                     "the decode kernel's pipeline stages capped at its loop's trips; unset: on with "
                     "ORTHROS_GEMV_PRELOAD") == 1
# The pieces a consumer warp takes a step (1 or 2): with 2, two rows' shuffle reductions
# interleave (inference change 39). ORTHROS_GEMV_PRELOAD_GROUP (read at import), default 2.
GROUP = _one_of("ORTHROS_GEMV_PRELOAD_GROUP", "2", (1, 2), "the pieces a consumer warp takes a step")

_LIB = None


def build(nvcc: str | None = None, out_dir: Path | None = None) -> Path:
    """The kernel's shared library, built once per source and flags (a hash in its name; ptxas'
    register report beside it), written under a temporary name, then renamed. ``RuntimeError``
    naming ``nvcc`` when it is missing or fails."""
    nvcc = nvcc or os.environ.get("ORTHROS_NVCC") or "nvcc"
    if shutil.which(nvcc) is None:
        raise RuntimeError(f"ORTHROS_GEMV_PRELOAD: the kernel is CUDA C++ and needs nvcc, but {nvcc!r} is not an "
                           f"executable on PATH (set ORTHROS_NVCC, or ORTHROS_GEMV_PRELOAD=0)")
    return build_shared_library(nvcc, SOURCE, NVCC_FLAGS, out_dir if out_dir is not None else cache_root() / "kernels",
                                "preload")


def _lib(device: torch.device):
    global _LIB
    if _LIB is None:
        lib = ctypes.CDLL(str(build()))
        lib.wo_preload_smem_bytes.restype = ctypes.c_longlong
        lib.wo_preload_smem_bytes.argtypes = [ctypes.c_int] * 4
        lib.wo_preload_prepare.argtypes = [ctypes.c_int]
        lib.wo_preload_launch.argtypes = ([ctypes.c_void_p] * 3 + [ctypes.c_int] * 3 + [ctypes.c_longlong]
                                          + [ctypes.c_int] * 5 + [ctypes.c_void_p])
        lib.wo_merge_smem_bytes.restype = ctypes.c_longlong
        lib.wo_merge_smem_bytes.argtypes = [ctypes.c_int] * 2
        lib.wo_merge_prepare.argtypes = [ctypes.c_int]
        lib.wo_merge_launch.argtypes = ([ctypes.c_void_p] * 2 + [ctypes.c_int] * 3 + [ctypes.c_void_p] * 2
                                        + [ctypes.c_int] * 6 + [ctypes.c_void_p])
        lib.wo_preload_error_string.restype = ctypes.c_char_p
        most = torch.cuda.get_device_properties(device).shared_memory_per_block_optin
        _check(lib, lib.wo_preload_prepare(most), "cudaFuncSetAttribute")
        _check(lib, lib.wo_merge_prepare(most), "cudaFuncSetAttribute")
        _LIB = lib
    return _LIB


def _check(lib, rc: int, what: str) -> None:
    if rc:
        raise RuntimeError(f"the W_O preload kernel, {what}: {lib.wo_preload_error_string(rc).decode()} "
                           f"(cudaError {rc})")


def _fits(device: torch.device, need: int, what: str) -> int:
    """The current stream's handle once a block's ``need`` bytes of shared memory fit the device;
    ``ValueError`` naming the setting otherwise."""
    most = torch.cuda.get_device_properties(device).shared_memory_per_block_optin
    if need > most:
        raise ValueError(f"ORTHROS_GEMV_PRELOAD={PIECES}: {what} need {need} B of shared memory a block, more than "
                         f"the {most} of this GPU")
    return torch.cuda.current_stream(device).cuda_stream


def layout(N: int, device: torch.device) -> tuple:
    """``(rows_per_block, blocks)``: one block a multiprocessor at most, whole rows each."""
    rows = cdiv(N, num_sms(device))
    return rows, cdiv(N, rows)


def _group(group: int | None, pieces: int) -> int:
    """The pieces a consumer warp takes a step: ``group`` (default :data:`GROUP`), at most the
    ring's ``pieces`` (a step waits for all of its slots before it releases any)."""
    return max(1, min(GROUP if group is None else int(group), pieces))


def smem_bytes(M: int, K: int, rows_per_block: int, pieces: int) -> int:
    """What ``preload.cu`` asks a block for: the ring, its mbarriers and the warps' row sums."""
    return pieces * K * 2 + 16 * pieces + 4 * rows_per_block * 8 * M


def applies(M: int, K: int, dtype: torch.dtype, *, pdl: bool, plain: bool) -> bool:
    """Whether :func:`gemv_triton` hands this launch to the kernel: the preload is on, the launch
    uses PDL (so it can start before the attention ends), ``M <= 2`` bf16 rows, a supported ``K``
    and no bias or prologue (``plain``)."""
    return PIECES > 0 and pdl and plain and 1 <= M <= MAX_ROWS and K in KS and dtype == torch.bfloat16


def aligned(x2: torch.Tensor, sx: int) -> bool:
    """Whether the kernel's 16-byte loads of ``x2``'s rows (row stride ``sx`` elements) are aligned."""
    return x2.data_ptr() % 16 == 0 and sx % 8 == 0


def launch(x2: torch.Tensor, weight: torch.Tensor, part: torch.Tensor, sx: int, *, pdl: bool,
           pieces: int | None = None, group: int | None = None) -> None:
    """``part[0] = x2 @ weight.T`` (float32) on the current stream; ``x2 [M, K]`` with row stride
    ``sx``, ``weight [N, K]`` contiguous, ``part [1, M, N]`` contiguous float32. ``pieces`` /
    ``group``: the ring's slots and the pieces a warp takes a step (default :data:`PIECES`,
    :data:`GROUP`; the group is kept within the slots)."""
    M, K = x2.shape
    N = weight.shape[0]
    pieces = PIECES if pieces is None else int(pieces)
    dev = x2.device
    lib = _lib(dev)
    rows, blocks = layout(N, dev)
    pieces = max(1, min(pieces, rows))
    stream = _fits(dev, smem_bytes(M, K, rows, pieces), f"{pieces} rows of {K * 2} B")
    _check(lib, lib.wo_preload_launch(weight.data_ptr(), x2.data_ptr(), part.data_ptr(), M, N, K, sx, rows, blocks,
                                      pieces, _group(group, pieces), int(pdl), stream), "launch")


# the merge form (wo_merge_kernel): the heads a block's K slice may hold (MERGE_HEADS of them in
# the engine's launches: 8 slices x 16 row groups for Qwen3-8B's 32 heads), rows a piece, head dim
MERGE_HEAD_COUNTS = (2, 4, 8)
MERGE_HEADS = 4
PIECE_ROWS = 8
HEAD_DIM = 128


def defers_merge(batch: int, num_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether a pair layer's attention hands its split partials to W_O unmerged (the merge form
    on, one batch row, 128-dim bf16 heads in whole slices, a CUDA device whose launches use PDL
    for 2-row GEMVs): what :func:`merged_takes` then accepts."""
    return (MERGE and batch == 1 and head_dim == HEAD_DIM and num_heads % MERGE_HEADS == 0
            and dtype == torch.bfloat16 and device.type == "cuda" and PDL_MIN_M <= 2 and bool(pdl_kwargs(device)))


def merged_takes(o: torch.Tensor, lse: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether :func:`launch_merge` takes these partials and weight (:func:`defers_merge`'s
    conditions, float32 contiguous partials of two rows, a contiguous bf16 ``[N, HQ * 128]``
    weight on their device)."""
    if o.dim() != 5 or lse.shape != o.shape[:-1]:
        return False
    B, R, HQ, _, D = o.shape
    return (R == 2 and defers_merge(B, HQ, D, weight.dtype, o.device) and o.dtype == lse.dtype == torch.float32
            and o.is_contiguous() and lse.is_contiguous() and weight.is_contiguous() and weight.device == o.device
            and weight.dim() == 2 and weight.shape[1] == HQ * D)


def merge_layout(N: int, HQ: int, heads: int, device: torch.device) -> tuple:
    """``(rows_per_block, groups)`` of the merge form: ``HQ / heads`` K slices times ``groups`` row
    groups of whole pieces, about one block a multiprocessor in all."""
    groups = max(1, num_sms(device) // (HQ // heads))
    rows = cdiv(cdiv(N, groups), PIECE_ROWS) * PIECE_ROWS
    return rows, cdiv(N, rows)


def merge_smem_bytes(heads: int, pieces: int) -> int:
    """What ``wo_merge_kernel`` asks a block for: the ring, its mbarriers and the merged rows."""
    return pieces * PIECE_ROWS * heads * HEAD_DIM * 2 + 16 * pieces + 4 * 2 * heads * HEAD_DIM


def launch_merge(op: torch.Tensor, lp: torch.Tensor, weight: torch.Tensor, part: torch.Tensor, *, heads: int,
                 pieces: int, pdl: bool, group: int | None = None) -> None:
    """``part[s] = merge(op, lp)[:, slice s] @ weight[:, slice s].T`` (float32) on the current
    stream, for the decode kernel's partials of one batch row's two query rows: ``op [1, 2, HQ,
    S, 128]`` and ``lp [1, 2, HQ, S]`` float32 contiguous (base-2 log-sum-exps), ``weight [N, HQ *
    128]`` bf16 contiguous, ``part [HQ / heads, 2, N]`` float32 contiguous: K slices of ``heads``
    heads, summed by the split-K reduce. ``group``: as for :func:`launch`."""
    _, _, HQ, S, D = op.shape
    N = weight.shape[0]
    dev = op.device
    lib = _lib(dev)
    rows, groups = merge_layout(N, HQ, heads, dev)
    pieces = max(1, min(int(pieces), cdiv(rows, PIECE_ROWS)))
    stream = _fits(dev, merge_smem_bytes(heads, pieces), f"{pieces} pieces of {PIECE_ROWS} rows x {heads * D * 2} B")
    _check(lib, lib.wo_merge_launch(op.data_ptr(), lp.data_ptr(), S, HQ, heads, weight.data_ptr(), part.data_ptr(),
                                    N, rows, groups, pieces, _group(group, pieces), int(pdl), stream), "merge launch")


__all__ = ["PIECES", "EARLY_COMBINE", "FIT_STAGES", "GROUP", "MERGE", "applies", "aligned", "launch", "build",
           "layout", "smem_bytes", "merge_layout", "merge_smem_bytes", "launch_merge", "defers_merge", "merged_takes"]

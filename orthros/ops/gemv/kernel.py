"""Triton kernel of the weight-streaming GEMV: ``y [M, N] = x [M, K] @ weight[N, K].T (+ bias)``
for the few rows of a decode step (``M <= 8``: one token, an Orthros token pair, a small batch).

At such ``M`` a matmul is a stream of the weight: ``N * K`` elements read once, ``2 * M`` FLOPs
each. So every weight element is read exactly once for all ``M`` rows:

* program ``(n_block, split)`` owns ``BLOCK_N`` output rows (weight rows) and one slice of
  ``K`` (the whole of it unless split-K); it walks its slice in ``BLOCK_K`` tiles, loading a
  ``[BLOCK_N, BLOCK_K]`` weight tile (row-major ``[N, K]``: contiguous along ``K``, so the
  loads coalesce) and the ``M`` rows of ``x`` at the same ``K`` (tiny, L2-resident) once per
  step, and accumulates in float32;
* the K loop is pipelined ``num_stages`` deep (``tl.range``: asynchronous copies through
  shared memory, so ``num_stages - 1`` tiles are in flight while one is reduced; checked in
  the sm_90 PTX of triton 3.9, where a plain ``range`` left the CUDA-core form with one tile
  in flight);
* three inner forms, chosen by the config's ``dot`` / ``defer``: ``dot=False`` multiplies and
  reduces on the CUDA cores (``sum_k w[n, k] * x[m, k]`` per tile and row, ``M`` unrolled);
  ``defer=True`` multiplies on the CUDA cores into a ``[M, BLOCK_N, BLOCK_K]`` float32
  accumulator and reduces over ``K`` once, after the loop (the per-tile form's cross-warp
  reductions, 40 shuffles and 4 barriers a tile at M = 2 in the sm_90 SASS, leave the loop);
  ``dot=True`` feeds the weight tile to the tensor cores as ``w @ x^T`` with ``x`` padded to
  16 rows;
* ``split > 1`` (split-K, for few output rows): each split writes float32 partials
  ``[split, M, N]``; a second kernel sums them in a fixed order (no atomics: deterministic),
  adds the bias and casts. ``split == 1``: one kernel, bias and cast in its epilogue;
* fused (:func:`orthros.ops.gemv.gemv`'s ``norm_weight`` / ``act`` / ``residual``, constexpr
  flags, so the plain GEMV compiles as before): the x tile is transformed as it is loaded
  (RMSNorm with each row's ``rstd`` from a first pass over the whole row; or ``silu(gate) * up``
  from ``x [M, 2K]``), rounded to the dtype where the torch ops round; the residual is added
  after the cast, in the epilogue or in the split-K reduce. Without split-K the RMSNorm runs
  "late" (:func:`late_norm`): x tiles times the norm weight in the loop, which also sums
  ``x^2``, and each row's ``rstd`` applied to its product in the epilogue (no first pass).

Graph-capture safe: the launch configuration depends only on shapes, dtypes and the device
(:data:`CONFIGS`; no autotuning at call time), nothing synchronises with the host, and the only
allocations are the output (and the split-K partials), both through PyTorch's caching
allocator, which CUDA-graph capture supports. Every check runs on the host before any launch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch

import triton
import triton.language as tl

from ..triton import common as _tc
from ..triton.common import (cdiv, env_number, interpreting, pdl_enter, pdl_kwargs, pdl_signal, pdl_wait, pow2,
                             prefetch_l2)
from .naive import DTYPES, MAX_M, check_gemv_inputs



# ============================================================================ kernels

@triton.jit
def _round(x, dt: tl.constexpr, EMU_RNE: tl.constexpr):
    """``x`` (float32) rounded to ``dt``, to nearest even. ``EMU_RNE`` (the interpreter with
    bf16, whose float32 -> bf16 cast truncates: seen with triton 3.9, fp16 is right) rounds the
    bits first so the cast is exact; compiled code casts with round-to-nearest-even itself."""
    if EMU_RNE:
        b = x.to(tl.uint32, bitcast=True)
        b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
        x = b.to(tl.float32, bitcast=True)
    return x.to(dt)


@triton.jit
def _bias_round_res(acc, bias, res, dt: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr,
                    EMU_RNE: tl.constexpr):
    """The GEMV's output from its float32 sum ``acc``: ``+ bias``, rounded to ``dt``, then ``+ res``
    rounded again, as eager ``residual + F.linear(x, w, bias)`` rounds (``bias`` / ``res``
    loaded already, read only with their flags)."""
    if HAS_BIAS:
        acc += bias.to(tl.float32)
    out = _round(acc, dt, EMU_RNE)
    if HAS_RES:
        out = _round(out.to(tl.float32) + res.to(tl.float32), dt, EMU_RNE)
    return out


@triton.jit
def _rms_apply(x, rstd, nw, dt: tl.constexpr, EMU_RNE: tl.constexpr):
    """RMSNorm's output from ``x``, ``rstd`` and the norm weight ``nw``, rounded as the RMSNorm
    module rounds it: ``((x * rstd) -> dt) * nw -> dt`` (float32 products)."""
    xn = _round(x.to(tl.float32) * rstd, dt, EMU_RNE)
    return _round(xn.to(tl.float32) * nw.to(tl.float32), dt, EMU_RNE)


@triton.jit
def _prologue(X, x_offs, x_mask, NW, nw_offs, nw_mask, rstd, K,
              NORM: tl.constexpr, SILU: tl.constexpr, MASK_X: tl.constexpr, MASK_K: tl.constexpr,
              EMU_RNE: tl.constexpr):
    """A tile of the GEMV's input in ``X``'s dtype, rounded as the torch ops of the reference
    (:mod:`.naive`) round it: the raw ``x``; or RMSNorm, ``((x * rstd) -> dtype) * norm_weight ->
    dtype`` (``rstd`` broadcast to the tile); or SwiGLU, ``silu(gate) -> dtype``, ``* up -> dtype``
    with ``gate = x[m, k]``, ``up = x[m, K + k]``. Masked entries are 0 (and stay 0)."""
    dt = X.dtype.element_ty
    if MASK_X:
        x = tl.load(X + x_offs, mask=x_mask, other=0.0)
    else:
        x = tl.load(X + x_offs)
    if NORM:
        if MASK_K:
            nw = tl.load(NW + nw_offs, mask=nw_mask, other=0.0)
        else:
            nw = tl.load(NW + nw_offs)
        x = _rms_apply(x, rstd, nw, dt, EMU_RNE)
    if SILU:
        if MASK_X:
            up = tl.load(X + x_offs + K, mask=x_mask, other=0.0)
        else:
            up = tl.load(X + x_offs + K)
        g = x.to(tl.float32)
        act = _round(g / (1.0 + tl.exp(-g)), dt, EMU_RNE)
        x = _round(act.to(tl.float32) * up.to(tl.float32), dt, EMU_RNE)
    return x


@triton.jit
def _times_norm_weight(x, NW, nw_offs, nw_mask, MASK_K: tl.constexpr, dt: tl.constexpr, ROUND: tl.constexpr,
                       EMU_RNE: tl.constexpr):
    """``x * norm_weight`` in float32 (the late norm's tile; ``ROUND``: rounded to ``dt``, the
    tensor-core form's operand); the row's ``rstd`` is applied to the product in the epilogue."""
    if MASK_K:
        nw = tl.load(NW + nw_offs, mask=nw_mask, other=0.0)
    else:
        nw = tl.load(NW + nw_offs)
    y = x.to(tl.float32) * nw.to(tl.float32)
    if ROUND:
        y = _round(y, dt, EMU_RNE).to(tl.float32)
    return y


@triton.jit
def _gemv_kernel(X, W, B, Y, P, NW, R, M, N, K, sxm, swn, srm, k_per_split, eps,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, M_ROWS: tl.constexpr,
                 DOT: tl.constexpr, SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr, UPCAST: tl.constexpr,
                 PREC: tl.constexpr, EVEN_K: tl.constexpr, NUM_STAGES: tl.constexpr,
                 NORM: tl.constexpr = False, SILU: tl.constexpr = False, HAS_RES: tl.constexpr = False,
                 EMU_RNE: tl.constexpr = False, NORM_M: tl.constexpr = 1, NORM_K: tl.constexpr = 16,
                 DEFER: tl.constexpr = False, NORM_LATE: tl.constexpr = False, PDL: tl.constexpr = False,
                 PF_LINES: tl.constexpr = 0, PF_STEP: tl.constexpr = 64, SIGNAL_END: tl.constexpr = False,
                 W_EVICT: tl.constexpr = ""):
    """Program ``(pid_n, pid_k)``: output rows ``[pid_n * BLOCK_N, +BLOCK_N)`` over ``K`` slice
    ``[pid_k * k_per_split, +k_per_split)``. ``M_ROWS`` (= M, constexpr) unrolls the CUDA-core
    form; ``BLOCK_M`` is the accumulator's row count (pow2 >= M; 16 in the dot form). ``DEFER``
    (the CUDA-core form): a ``[BLOCK_M, BLOCK_N, BLOCK_K]`` float32 accumulator of products,
    summed over ``K`` once after the loop instead of once per tile and row (no reduction's
    shuffles or barriers inside the loop; ``BLOCK_M * BLOCK_N * BLOCK_K / threads`` registers).
    ``SPLIT == 1``: writes ``Y [M, N]`` (+ bias, cast, + residual ``R``); else float32 partials
    ``P [SPLIT, M, N]``. The weight loads carry no row mask (rows past ``N`` re-read row
    ``N - 1``; their results are not stored) and, with ``EVEN_K`` (every slice a whole number of
    tiles), no column mask either, so they compile to full-width vector loads.

    Prologues (constexpr: the plain GEMV compiles as before): ``NORM`` first sums ``x^2`` over
    the whole of ``K`` (every split does: the rows are tiny and L2-resident) for each row's
    ``rstd``, then normalises each x tile as it is loaded (:func:`_prologue`); ``SILU`` reads
    ``x [M, 2K]`` (``gate | up``, row stride ``sxm``). ``HAS_RES``: ``Y = R + (acc -> dtype)``.
    ``NORM_LATE`` (instead of ``NORM``, with one K slice: the program sees whole rows): no first
    pass; the loop multiplies each x tile by the norm weight only and sums ``x^2`` as it goes, and the
    epilogue scales each row's product by its ``rstd`` (``rstd`` is one scalar a row, so it
    factors out of the sum over ``K``); the rounding differs from the two-pass form's by the
    dtype's rounding of the normalised input (within the tests' tolerance of the reference).

    ``PDL`` (launched as a programmatic dependent, :func:`orthros.ops.triton.common.pdl_kwargs`):
    the program may start while the kernel ahead still runs; before waiting for it, it asks L2
    for the first ``PF_LINES`` lines (``PF_STEP`` elements each) of each of its weight rows
    (read-only, so safe to read early), so its K loop starts on L2 hits instead of a cold HBM
    stream; it touches no other memory before its wait. It signals the kernel behind right after
    the wait, or after its K loop with ``SIGNAL_END``.

    ``W_EVICT``: the weight loads' eviction policy (``""``: the default; ``"evict_first"``: the
    streamed weight is the first L2 lets go, as Inductor marks gpt-fast's weights, so the small
    data that is read again, the input rows and the next GEMV's prefetched lines, stays)."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    offs_m = tl.arange(0, BLOCK_M)
    m_ok = offs_m < M
    k_lo = pid_k.to(tl.int64) * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)
    w_rows = W + tl.minimum(offs_n, N - 1)[:, None] * swn
    if PF_LINES > 0:
        prefetch_l2(w_rows + tl.minimum(k_lo + tl.arange(0, PF_LINES) * PF_STEP, K - 1)[None, :])
    pdl_wait(PDL)
    if not SIGNAL_END:
        pdl_signal(PDL)
    dt = X.dtype.element_ty
    # NORM_LATE: each row's sum of x^2, accumulated in the loop elementwise over the x tile's shape
    # and reduced over K once after it (no cross-thread reduction in the loop); the per-tile form,
    # which reduces every tile anyway, sums it into ssq directly
    ssq = tl.zeros([BLOCK_M], tl.float32)
    if NORM_LATE and DOT:
        ssq_t = tl.zeros([BLOCK_K, BLOCK_M], tl.float32)
    elif NORM_LATE and DEFER:
        ssq_t = tl.zeros([BLOCK_M, BLOCK_K], tl.float32)
    else:
        ssq_t = tl.zeros([1, 1], tl.float32)  # unused
    if NORM:  # each row's 1 / rms over the whole of K, as RMSNorm: float32 mean of squares
        # tiles of NORM_M (pow2 >= M) rows x NORM_K (~4096 elements in all): few dependent L2 round
        # trips before the weight stream starts (K = 4096 at M <= 2: one or two)
        offs_r = tl.arange(0, NORM_M)
        ss = tl.zeros([NORM_M], tl.float32)
        for k0 in range(0, K, NORM_K):
            offs_k = k0 + tl.arange(0, NORM_K)
            xs = tl.load(X + offs_r[:, None] * sxm + offs_k[None, :], mask=(offs_r < M)[:, None] & (offs_k < K)[None, :],
                         other=0.0).to(tl.float32)
            ss += tl.sum(xs * xs, axis=1)
        rstd_r = tl.rsqrt(ss / K + eps)  # [NORM_M]
        rstd = tl.zeros([BLOCK_M], tl.float32)  # the accumulator's rows (16 in the dot form)
        for m in tl.static_range(M_ROWS):
            rstd = tl.where(offs_m == m, tl.sum(tl.where(offs_r == m, rstd_r, 0.0), axis=0), rstd)
    else:
        rstd = tl.zeros([BLOCK_M], tl.float32)
    if DOT:
        acc = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)  # y^T: the weight tile is the MMA's M side
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    if DEFER:
        acc3 = tl.zeros([BLOCK_M, BLOCK_N, BLOCK_K], tl.float32)
    else:
        acc3 = tl.zeros([1, 1, 1], tl.float32)  # unused
    for k0 in tl.range(k_lo, k_hi, BLOCK_K, num_stages=NUM_STAGES):  # explicit: pipelines the CUDA-core form too
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_ok = offs_k < k_hi
        if EVEN_K:
            w = tl.load(w_rows + offs_k[None, :], eviction_policy=W_EVICT)
        else:
            w = tl.load(w_rows + offs_k[None, :], mask=k_ok[None, :], other=0.0, eviction_policy=W_EVICT)
        if DOT:
            xt = _prologue(X, offs_m[None, :] * sxm + offs_k[:, None], m_ok[None, :] & k_ok[:, None],
                           NW, offs_k[:, None], k_ok[:, None], rstd[None, :], K, NORM, SILU, True, not EVEN_K, EMU_RNE)
            if NORM_LATE:
                xf = xt.to(tl.float32)
                ssq_t += xf * xf
                xt = _times_norm_weight(xt, NW, offs_k[:, None], k_ok[:, None], not EVEN_K, dt, True,
                                        EMU_RNE).to(dt)
            if UPCAST:  # the interpreter's bf16 tl.dot is wrong (docs: guide); fp32 there
                w = w.to(tl.float32)
                xt = xt.to(tl.float32)
            acc += tl.dot(w, xt, input_precision=PREC)
        elif DEFER:
            xk = _prologue(X, offs_m[:, None] * sxm + offs_k[None, :], m_ok[:, None] & k_ok[None, :], NW,
                           offs_k[None, :], k_ok[None, :], rstd[:, None], K, NORM, SILU, True, not EVEN_K,
                           EMU_RNE).to(tl.float32)
            if NORM_LATE:
                ssq_t += xk * xk
                xk = _times_norm_weight(xk, NW, offs_k[None, :], k_ok[None, :], not EVEN_K, dt, False, EMU_RNE)
            acc3 += w.to(tl.float32)[None, :, :] * xk[:, None, :]
        else:
            wf = w.to(tl.float32)
            for m in tl.static_range(M_ROWS):
                if NORM:
                    rstd_m = tl.sum(tl.where(offs_m == m, rstd, 0.0), axis=0)
                else:
                    rstd_m = 0.0
                xm = _prologue(X, m * sxm + offs_k, k_ok, NW, offs_k, k_ok, rstd_m, K, NORM, SILU,
                               not EVEN_K, not EVEN_K, EMU_RNE).to(tl.float32)
                if NORM_LATE:
                    ssq = tl.where(offs_m == m, ssq + tl.sum(xm * xm, axis=0), ssq)
                    xm = _times_norm_weight(xm, NW, offs_k, k_ok, not EVEN_K, dt, False, EMU_RNE)
                part = tl.sum(wf * xm[None, :], axis=1)  # [BLOCK_N]
                acc = tl.where(offs_m[:, None] == m, acc + part[None, :], acc)
    if SIGNAL_END:
        pdl_signal(PDL)
    if DOT:
        acc = tl.trans(acc)  # [BLOCK_M, BLOCK_N]
    if DEFER:
        acc = tl.sum(acc3, axis=2)
    if NORM_LATE:
        if DOT:
            ssq = tl.sum(ssq_t, axis=0)
        elif DEFER:
            ssq = tl.sum(ssq_t, axis=1)
        acc = acc * tl.rsqrt(ssq / K + eps)[:, None]
    mask = m_ok[:, None] & n_ok[None, :]
    if SPLIT == 1:
        bias = 0.0
        res = 0.0
        if HAS_BIAS:
            bias = tl.load(B + offs_n, mask=n_ok, other=0.0)[None, :]
        if HAS_RES:
            res = tl.load(R + offs_m[:, None] * srm + offs_n[None, :], mask=mask, other=0.0)
        out = _bias_round_res(acc, bias, res, Y.dtype.element_ty, HAS_BIAS, HAS_RES, EMU_RNE)
        tl.store(Y + offs_m[:, None] * N + offs_n[None, :], out, mask=mask)
    else:
        tl.store(P + (pid_k * M + offs_m[:, None]) * N + offs_n[None, :], acc, mask=mask)


@triton.jit
def _gemv_reduce(P, B, Y, R, MN, N, srm, SPLIT: tl.constexpr, BLOCK: tl.constexpr, HAS_BIAS: tl.constexpr,
                 HAS_RES: tl.constexpr = False, EMU_RNE: tl.constexpr = False, PDL: tl.constexpr = False):
    """``Y[m, n] = sum_s P[s, m, n] (+ bias[n])`` rounded (``+ R[m, n]``, rounded), splits
    summed in order (deterministic). ``PDL``: as :func:`_gemv_kernel`'s (no prefetch)."""
    pdl_enter(PDL)
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < MN
    bias = 0.0
    res = 0.0
    if HAS_BIAS:
        bias = tl.load(B + offs % N, mask=ok, other=0.0)
    if HAS_RES:
        res = tl.load(R + (offs // N) * srm + offs % N, mask=ok, other=0.0)
    acc = tl.zeros([BLOCK], tl.float32)
    for s in tl.static_range(SPLIT):
        acc += tl.load(P + s * MN + offs, mask=ok, other=0.0)
    out = _bias_round_res(acc, bias, res, Y.dtype.element_ty, HAS_BIAS, HAS_RES, EMU_RNE)
    tl.store(Y + offs, out, mask=ok)


@triton.jit
def _gemv_reduce_norm(P, B, Y, R, NW, YN, MN, N, srm, eps, SPLIT: tl.constexpr, BLOCK: tl.constexpr,
                      HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, EMU_RNE: tl.constexpr = False,
                      PDL: tl.constexpr = False):
    """Program ``m``: row ``m`` of :func:`_gemv_reduce`'s ``Y``, whole (``BLOCK >= N``), and its
    RMSNorm ``YN[m]`` (:func:`_rms_apply`, as :func:`_prologue`'s norm rounds it),
    so the GEMV behind reads ``YN`` without a norm prologue. Every load is issued before the
    row's reduction: the weights (``NW``, the bias: read-only) even before the PDL wait."""
    cols = tl.arange(0, BLOCK)
    ok = cols < N
    nw = tl.load(NW + cols, mask=ok, other=0.0).to(tl.float32)
    bias = 0.0
    res = 0.0
    if HAS_BIAS:
        bias = tl.load(B + cols, mask=ok, other=0.0)
    pdl_enter(PDL)
    m = tl.program_id(0).to(tl.int64)
    if HAS_RES:
        res = tl.load(R + m * srm + cols, mask=ok, other=0.0)
    acc = tl.zeros([BLOCK], tl.float32)
    for s in tl.static_range(SPLIT):
        acc += tl.load(P + s * MN + m * N + cols, mask=ok, other=0.0)
    out = _bias_round_res(acc, bias, res, Y.dtype.element_ty, HAS_BIAS, HAS_RES, EMU_RNE)
    tl.store(Y + m * N + cols, out, mask=ok)
    yf = tl.where(ok, out.to(tl.float32), 0.0)
    rstd = tl.rsqrt(tl.sum(yf * yf, axis=0) / N + eps)
    yn = _rms_apply(yf, rstd, nw, Y.dtype.element_ty, EMU_RNE)
    tl.store(YN + m * N + cols, yn, mask=ok)


# ============================================================================ configs

@dataclass(frozen=True)
class GemvConfig:
    """One launch configuration: ``block_n`` output rows and ``block_k`` of K per tile
    (powers of two; ``dot`` needs both >= 16), ``split`` K slices (1: no split-K),
    ``dot`` the tensor-core form, ``defer`` the CUDA-core form with its reduction over K
    deferred to after the loop (not with ``dot``), Triton's ``num_warps`` / ``num_stages``, and
    ``evict_first``: the weight loads marked ``evict_first`` (``W_EVICT`` of the kernel)."""

    block_n: int = 16
    block_k: int = 512
    split: int = 1
    dot: bool = False
    num_warps: int = 4
    num_stages: int = 3
    defer: bool = False
    evict_first: bool = False

    def __post_init__(self):
        for name in ("block_n", "block_k", "num_warps"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1 or v & (v - 1):
                raise ValueError(f"GemvConfig.{name} must be a positive power of two, got {v!r}")
        if self.dot and (self.block_n < 16 or self.block_k < 16):
            raise ValueError(f"GemvConfig with dot=True needs block_n and block_k >= 16, got "
                             f"{self.block_n} and {self.block_k}")
        if self.defer and self.dot:
            raise ValueError("GemvConfig: defer (the CUDA-core form's deferred reduction) and dot (the tensor-core "
                             "form) exclude each other")
        if not isinstance(self.split, int) or not 1 <= self.split <= 64:
            raise ValueError(f"GemvConfig.split must be an int in [1, 64], got {self.split!r}")
        if not isinstance(self.num_stages, int) or self.num_stages < 1:
            raise ValueError(f"GemvConfig.num_stages must be a positive int, got {self.num_stages!r}")
        if not isinstance(self.evict_first, bool):
            raise ValueError(f"GemvConfig.evict_first must be a bool, got {self.evict_first!r}")

    @property
    def label(self) -> str:
        """``"<block_n>x<block_k> s<split> <dot|defer|fma> w<num_warps> st<num_stages>[ ef]"``, as
        the benchmarks print a config (:meth:`parse` reads it back; ``ef``: ``evict_first``)."""
        form = "dot" if self.dot else "defer" if self.defer else "fma"
        return (f"{self.block_n}x{self.block_k} s{self.split} {form} w{self.num_warps} st{self.num_stages}"
                + (" ef" if self.evict_first else ""))

    @classmethod
    def parse(cls, text: str) -> "GemvConfig":
        """The config a :attr:`label` names, e.g. ``"2x1024 s1 defer w16 st1"``; the split, form,
        warps and stages may be left out (``s1``, ``fma``, ``w4``, ``st3``), ``ef`` added
        (``evict_first``). ``ValueError`` saying what is wrong."""
        m = re.fullmatch(r"\s*(\d+)x(\d+)((?:\s+(?:s\d+|dot|defer|fma|w\d+|st\d+|ef))*)\s*", str(text))
        if m is None:
            raise ValueError(f"{text!r} is no GEMV config: write '<block_n>x<block_k> [s<split>] [dot|defer|fma] "
                             f"[w<warps>] [st<stages>] [ef]', e.g. '2x1024 s1 defer w16 st1'")
        kw = {"block_n": int(m.group(1)), "block_k": int(m.group(2))}
        for name, digits in re.findall(r"([a-z]+)(\d*)", m.group(3)):
            if digits:  # s / w / st and a count
                kw[{"s": "split", "w": "num_warps", "st": "num_stages"}[name]] = int(digits)
            elif name == "ef":
                kw["evict_first"] = True
            else:  # the form
                kw.update(dot=name == "dot", defer=name == "defer")
        return cls(**kw)


# Shape classes -> config, first match wins: (M at most, N at most, K at most, config).
# Measured on one H200 at Qwen3-8B's decode weights, in two sweeps (every tried config is in the
# raw JSON):
# * 2026-12-02, commit 050c532 (`benchmarks/gemv.py --fused --sweep --m 1,2`,
#   docs/results/gemv-2026-12-02/): the four fused sites of a decode layer (norm + QKV, o +
#   residual, norm + gate/up, SiLU + down + residual) at M = 1 and 2; the roofline's engine ran
#   with exactly these rows in the same call (`roofline.py --gemv-configs`). M = 1: the
#   deferred-reduction form everywhere (8 x 512 for o and down, 16 x 256 for QKV and gate/up).
#   M = 2: the tensor-core form for o (split-K 4), QKV (64 x 256) and gate/up (64 x 128), the
#   deferred form for down.
# * 2026-12-01, commit 900ef0b (`--sweep`, docs/results/gemv-2026-12-01/): the plain GEMV; the
#   rows below the 2026-12-02 ones: the LM head at M = 1 (the CUDA-core form, 16 x 256, 4
#   stages), widths between the measured ones, and M = 3..8 (the tensor-core form, x padded to
#   16 rows, so M up to 8 costs what M = 2 does; only M = 2 was timed).
# * N <= 2048 (no Qwen3-8B weight): not measured; split K 4 so few rows still fill the SMs.
# * 2026-12-05, on an H100, inside the engine's compiled 1K step (`benchmarks/gemv_engine.py`,
#   docs/results/s37-2026-12-05/): at M = 2 these rows were the best of 36 candidates over the four
#   sites (QKV's 8x512 defer 0.34% faster a step: noise); at M = 1 gate/up's 4x2048 defer w8 st3
#   made the step 1.6% faster (not adopted: never timed on an H200, where these rows were measured).
CONFIGS: Tuple[Tuple[int, int, int, GemvConfig], ...] = (
    (MAX_M, 2048, 2 ** 62, GemvConfig(block_n=16, block_k=512, split=4)),                       # few rows
    (1, 4096, 2 ** 62, GemvConfig(block_n=8, block_k=512, num_stages=4, defer=True)),          # o, down
    (1, 24576, 2 ** 62, GemvConfig(block_n=16, block_k=256, num_stages=4, defer=True)),        # QKV, gate/up
    (1, 65536, 2 ** 62, GemvConfig(block_n=32, block_k=256, split=1, num_stages=1)),          # (2026-12-01)
    (1, 2 ** 62, 2 ** 62, GemvConfig(block_n=16, block_k=256, split=1, num_stages=4)),        # LM head
    (2, 4096, 4096, GemvConfig(block_n=64, block_k=128, split=4, dot=True)),                   # o
    (2, 4096, 2 ** 62, GemvConfig(block_n=8, block_k=512, num_stages=4, defer=True)),          # down
    (2, 6144, 2 ** 62, GemvConfig(block_n=64, block_k=256, split=1, dot=True)),                # QKV
    (MAX_M, 8192, 2 ** 62, GemvConfig(block_n=64, block_k=128, split=4, dot=True)),           # (2026-12-01)
    (MAX_M, 2 ** 62, 2 ** 62, GemvConfig(block_n=64, block_k=128, split=1, dot=True)),        # gate/up, LM head
)


# Exact shapes ``(M, N, K)`` -> config, looked up before :data:`CONFIGS`. Empty: a benchmark fills it
# for a block (:func:`configs_overridden`) to time one shape's candidates inside the engine's step.
OVERRIDES: Dict[Tuple[int, int, int], GemvConfig] = {}


# ORTHROS_GEMV_EVICT_FIRST=1 (read at import): every table config with ``evict_first`` (the weight
# stream marked evict_first in L2), for A/B runs of the whole step. On an H100 the pair's 1K step
# was level with it (5.682 / 5.684 against 5.683 / 5.685 ms; docs/performance.md, inference change
# 42), so it is off; not tried on an H200.
EVICT_FIRST = env_number("ORTHROS_GEMV_EVICT_FIRST", "0", int, "0 or 1") != 0


def pick_config(M: int, N: int, K: int) -> GemvConfig:
    """The :data:`CONFIGS` entry for this shape (:data:`OVERRIDES`' first, then the rows of
    :func:`configs_installed`): a pure function of ``(M, N, K)`` (no tuning, no device query).
    The launch lowers ``split`` where ``K`` has fewer ``block_k`` tiles."""
    if OVERRIDES:
        cfg = OVERRIDES.get((M, N, K))
        if cfg is not None:
            return cfg
    cfg = _row(M, N, K, len(_INSTALLED))[3]
    return dataclasses.replace(cfg, evict_first=True) if EVICT_FIRST else cfg


def _first(rows, M: int, N: int, K: int):
    return next((r for r in rows if M <= r[0] and N <= r[1] and K <= r[2]), None)


def _row(M: int, N: int, K: int, layers: int):
    """The row that gives ``(M, N, K)`` its config: :data:`CONFIGS`' first match (its last row
    if none), then through the first ``layers`` installed tables in turn, each of which takes
    the shape when one of its rows covers it and the row below is not of a narrower class."""
    if not layers:
        return _first(CONFIGS, M, N, K) or CONFIGS[-1]
    below = _row(M, N, K, layers - 1)
    rows, m_min, n_min = _INSTALLED[layers - 1]
    if below[0] < m_min or below[1] < n_min:
        return below
    return _first(rows, M, N, K) or below


def class_rows(M: int, measured: Dict[Tuple[int, int], GemvConfig]) -> Tuple[Tuple[int, int, int, GemvConfig], ...]:
    """:data:`CONFIGS` rows for ``M`` rows from the best config measured at some weight shapes
    (``{(N, K): config}``, e.g. a decode layer's four sites): one shape class per measured shape,
    ``n_max = N`` in ascending order; ``k_max = K`` where a measured shape of the same ``N`` with a
    larger ``K`` follows (o before down at Qwen3-8B's 4096 x 4096 / 4096 x 12288), else unbounded.
    A shape wider than every measured one matches none of them (the table's later rows take it)."""
    if not isinstance(M, int) or not 1 <= M <= MAX_M:
        raise ValueError(f"M must be an int in 1..{MAX_M}, got {M!r}")
    rows = []
    keys = sorted(measured)
    for i, (N, K) in enumerate(keys):
        cfg = measured[(N, K)]
        if not isinstance(cfg, GemvConfig):
            raise ValueError(f"measured[{(N, K)}] must be a GemvConfig, got {type(cfg).__name__}")
        bounded = any(n2 == N for n2, _ in keys[i + 1:])
        rows.append((M, N, K if bounded else 2 ** 62, cfg))
    return tuple(rows)


def rows_to_json(rows) -> list:
    """:data:`CONFIGS`-style rows as JSON-able dicts (what ``benchmarks/gemv.py --fused --sweep``
    stores as ``meta["tuned_rows"]``)."""
    return [{"m_max": m, "n_max": n, "k_max": k, "config": dataclasses.asdict(c)} for m, n, k, c in rows]


def rows_from_json(items) -> Tuple[Tuple[int, int, int, GemvConfig], ...]:
    """The inverse of :func:`rows_to_json`; ``ValueError`` naming what is malformed."""
    if not isinstance(items, list) or not items:
        raise ValueError(f"tuned rows must be a non-empty list, got {type(items).__name__}")
    out = []
    for i, it in enumerate(items):
        try:
            m, n, k = (int(it[key]) for key in ("m_max", "n_max", "k_max"))
            cfg = GemvConfig(**it["config"])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"tuned row {i} ({it!r}) is not {{m_max, n_max, k_max, config}}: {e}") from None
        if not 1 <= m <= MAX_M or n < 1 or k < 1:
            raise ValueError(f"tuned row {i}: m_max must be in 1..{MAX_M} and n_max, k_max >= 1, got {m}, {n}, {k}")
        out.append((m, n, k, cfg))
    return tuple(out)


# configs_installed's tables, innermost last: (rows, their least m_max, their least n_max)
_INSTALLED: list = []


@contextlib.contextmanager
def configs_installed(rows):
    """Within the block, ``rows`` (:func:`class_rows`' output) stand in :data:`CONFIGS` for every
    shape they cover except those whose table row is of a narrower class (fewer rows, ``m_max``
    below every new row's, or narrower weights, ``n_max`` below every new row's), so a benchmark
    can run the engine with a table measured earlier in the same run; the table is restored
    afterwards. Blocks nest (the inner table over the outer)."""
    rows = tuple(rows)
    layer = (rows, min((r[0] for r in rows), default=MAX_M), min((r[1] for r in rows), default=0))
    _INSTALLED.append(layer)
    try:
        yield rows
    finally:
        _INSTALLED.remove(layer)


@contextlib.contextmanager
def configs_overridden(shapes: Dict[Tuple[int, int, int], GemvConfig]):
    """Within the block, each exact shape ``(M, N, K)`` of ``shapes`` takes its config; every other
    shape keeps its :data:`CONFIGS` row. (A compiled caller that decided something at trace time
    from a config, :func:`norm_out_fused`, must not see that decision change.)"""
    global OVERRIDES
    for key, cfg in shapes.items():
        if not (isinstance(key, tuple) and len(key) == 3 and all(isinstance(v, int) and v >= 1 for v in key)):
            raise ValueError(f"configs_overridden: keys are (M, N, K) tuples of positive ints, got {key!r}")
        if not isinstance(cfg, GemvConfig):
            raise ValueError(f"configs_overridden: {key} maps to a {type(cfg).__name__}, not a GemvConfig")
    keep = OVERRIDES
    OVERRIDES = {**keep, **shapes}
    try:
        yield OVERRIDES
    finally:
        OVERRIDES = keep


# ============================================================================ host

def gemv_triton(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None, *,
                config: Optional[GemvConfig] = None, norm_weight: Optional[torch.Tensor] = None,
                norm_eps: Optional[float] = None, act: Optional[str] = None,
                residual: Optional[torch.Tensor] = None, out_norm_weight: Optional[torch.Tensor] = None,
                out_norm_eps: Optional[float] = None):
    """``residual + (prologue(x) @ weight[N, K].T (+ bias))`` by the streaming kernel (the
    arguments of :func:`orthros.ops.gemv.gemv`, :mod:`.naive` their meaning); ``[..., N]`` in
    ``x.dtype``. ``M = prod(x.shape[:-1]) <= 8``. ``config``: a :class:`GemvConfig` to use
    instead of :func:`pick_config`'s (benchmark sweeps). Raises ``ValueError`` (naming the
    argument) before launching anything for: shapes, ``M > 8``, dtypes other than
    fp16/bf16/fp32 or differing between ``x``, ``weight``, ``bias``, ``residual`` and ``norm_weight``, tensors on
    different devices or on a CPU outside the Triton interpreter, a ``weight``, ``bias`` or
    ``norm_weight`` that is not contiguous, an ``x`` or ``residual`` whose last dim is not
    contiguous or whose rows cannot be viewed as ``[M, *]``.

    ``out_norm_weight`` / ``out_norm_eps`` (:func:`orthros.ops.gemv.gemv`'s): also the output's
    RMSNorm, computed by the split-K reduce (one program a row): returns ``(y, rms_norm(y))``.
    Only for a launch with split-K (:func:`norm_out_fused`), else ``ValueError``."""
    check_gemv_inputs(x, weight, bias, norm_weight=norm_weight, norm_eps=norm_eps, act=act, residual=residual,
                      out_norm_weight=out_norm_weight, out_norm_eps=out_norm_eps)
    N, K = weight.shape
    Kx = x.shape[-1]  # K, or 2K with act="silu"
    lead = x.shape[:-1]
    M = 1
    for s in lead:
        M *= s
    if M > MAX_M:
        raise ValueError(f"x must have at most {MAX_M} rows (prod of its leading dims) for the triton GEMV, got "
                         f"M = {M} from x {tuple(x.shape)}; use backend 'torch' for larger M")
    if x.dtype not in DTYPES or weight.dtype != x.dtype:
        raise ValueError(f"x and weight must share one dtype of fp16 / bf16 / fp32, got x {x.dtype}, "
                         f"weight {weight.dtype}")
    if bias is not None and bias.dtype not in DTYPES:
        raise ValueError(f"bias must be fp16 / bf16 / fp32, got {bias.dtype}")
    for name, t in (("norm_weight", norm_weight), ("out_norm_weight", out_norm_weight)):
        if t is not None and t.dtype != x.dtype:
            raise ValueError(f"{name} must have x's dtype {x.dtype} for the triton GEMV, got {t.dtype} "
                             f"(backend 'torch' follows the RMSNorm formula with any dtype)")
    dev = x.device
    for name, t in (("weight", weight), ("bias", bias), ("norm_weight", norm_weight), ("residual", residual),
                    ("out_norm_weight", out_norm_weight)):
        if t is not None and t.device != dev:
            raise ValueError(f"{name} must be on x's device {dev}, got {t.device}")
    if dev.type != "cuda" and not (dev.type == "cpu" and interpreting()):
        raise ValueError(f"x must be a CUDA tensor for the triton GEMV (a CPU one only under TRITON_INTERPRET=1), "
                         f"got device {dev}")
    for name, t in (("weight", weight), ("bias", bias), ("norm_weight", norm_weight),
                    ("out_norm_weight", out_norm_weight)):
        if t is not None and not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous, got strides {t.stride()}")
    x2 = _rows(x, "x", M, Kx)
    r2 = _rows(residual, "residual", M, N) if residual is not None else None
    cfg = config if config is not None else pick_config(M, N, K)
    if not isinstance(cfg, GemvConfig):
        raise ValueError(f"config must be a GemvConfig or None, got {type(cfg).__name__}")

    split, k_per_split = split_k(cfg, K)
    norm_out = out_norm_weight is not None
    if norm_out and not (split > 1 and N <= NORM_OUT_MAX_N):
        raise ValueError(f"out_norm_weight: the output's RMSNorm is computed by the split-K reduce, which this launch "
                         f"does not have (split {split} for M={M}, N={N}, K={K}, at most N = {NORM_OUT_MAX_N}); "
                         f"check norm_out_fused(M, N, K) first")
    y = torch.empty(*lead, N, dtype=x.dtype, device=dev)
    yn = torch.empty_like(y) if norm_out else None
    if M == 0 or N == 0:
        return (y, yn) if norm_out else y
    part = torch.empty(split, M, N, dtype=torch.float32, device=dev) if split > 1 else y
    b = bias if bias is not None else y  # placeholder pointers, not read without their flags
    nw = norm_weight if norm_weight is not None else y
    r = r2 if r2 is not None else y
    srm = (r2.stride(0) if M > 1 else N) if r2 is not None else 0
    upcast = interpreting() and x.dtype != torch.float32
    emu_rne = interpreting() and x.dtype == torch.bfloat16
    block_m = 16 if cfg.dot else pow2(M)
    prec = "ieee" if (x.dtype == torch.float32 or upcast) else "tf32"
    sxm = x2.stride(0) if M > 1 else Kx
    flags = dict(NORM=norm_weight is not None, SILU=act == "silu", HAS_RES=residual is not None)
    late = late_norm(cfg, split, x.dtype)
    pdl = pdl_kwargs(dev) if M >= _tc.PDL_MIN_M else {}
    # what a PDL launch does before its wait (the weight prefetch) and where it signals
    early = dict(prefetch_tile(N, k_per_split, split, x.element_size()), SIGNAL_END=_tc.PDL_SIGNAL == "end") \
        if pdl else {}
    _gemv_kernel[(cdiv(N, cfg.block_n), split)](
        x2, weight, b, y, part, nw, r, M, N, K, sxm, weight.stride(0), srm, k_per_split,
        float(norm_eps) if norm_weight is not None else 0.0,
        BLOCK_M=block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, M_ROWS=M, DOT=cfg.dot, SPLIT=split,
        HAS_BIAS=bias is not None, UPCAST=upcast, PREC=prec, EVEN_K=K % cfg.block_k == 0, NUM_STAGES=cfg.num_stages,
        NORM=flags["NORM"] and not late, SILU=flags["SILU"], HAS_RES=split == 1 and flags["HAS_RES"], EMU_RNE=emu_rne,
        **_norm_tile(M, K, flags["NORM"] and not late), DEFER=cfg.defer, NORM_LATE=flags["NORM"] and late,
        W_EVICT="evict_first" if cfg.evict_first else "", num_warps=cfg.num_warps, num_stages=cfg.num_stages, **pdl,
        **early)
    if split > 1 and norm_out:  # one program a row: the whole row for its RMSNorm
        block = pow2(N)
        _gemv_reduce_norm[(M,)](part, b, y, r, out_norm_weight, yn, M * N, N, srm, float(out_norm_eps), SPLIT=split,
                                BLOCK=block, HAS_BIAS=bias is not None, HAS_RES=flags["HAS_RES"], EMU_RNE=emu_rne,
                                num_warps=min(NORM_OUT_WARPS, max(1, block // 256)), **pdl)
    elif split > 1:
        block = 1024
        _gemv_reduce[(cdiv(M * N, block),)](part, b, y, r, M * N, N, srm, SPLIT=split, BLOCK=block,
                                            HAS_BIAS=bias is not None, HAS_RES=flags["HAS_RES"], EMU_RNE=emu_rne,
                                            num_warps=4, **pdl)
    return (y, yn) if norm_out else y


# The widest output whose RMSNorm the split-K reduce computes (one program a row holds it whole).
NORM_OUT_MAX_N = 16384
# ORTHROS_GEMV_NORM_OUT=0 (read at import): never (the next GEMV's prologue normalises, as before
# inference change 25 of docs/performance.md; for A/B runs).
NORM_OUT = env_number("ORTHROS_GEMV_NORM_OUT", "1", int, "0 or 1") != 0
# warps of that reduce's program at N >= 2048: on an H200 the pair's 1K step with 4 / 8 / 16 took
# 4.306 / 4.300-4.305 / 4.330 ms (docs/performance.md, inference change 25, call 3)
NORM_OUT_WARPS = 8


def norm_out_fused(M: int, N: int, K: int) -> bool:
    """Whether :func:`gemv_triton` computes the output's RMSNorm for ``M`` rows of an ``[N, K]``
    weight in its split-K reduce (``out_norm_weight``): the shape's config splits K (so a
    reduce runs anyway) and a row fits one program. A pure function of the shapes and
    :data:`CONFIGS`, so a compiled caller decides at trace time; ``False`` everywhere with
    ``ORTHROS_GEMV_NORM_OUT=0``."""
    if not NORM_OUT or not 1 <= M <= MAX_M or N < 1 or N > NORM_OUT_MAX_N or K < 1:
        return False
    return split_k(pick_config(M, N, K), K)[0] > 1


# Bytes of weight a PDL-launched GEMV asks L2 for before it waits for the kernel ahead
# (prefetch_tile); ORTHROS_GEMV_PREFETCH_MB (MB, read at import) sets it, 0 turns the prefetch off.
# 4 MB: on an H200 the pair's step with 4 / 8 / 16 MB and none: 4.480 / 4.496 / 4.612 (another
# call) / 4.519 ms at 1K (docs/performance.md, inference change 17).
PREFETCH_BYTES = int(env_number("ORTHROS_GEMV_PREFETCH_MB", "4", float, "a number of megabytes") * 2 ** 20)
LINE_BYTES = 128


def prefetch_tile(N: int, k_per_split: int, split: int, elem_bytes: int, budget: Optional[int] = None) -> dict:
    """``PF_LINES`` / ``PF_STEP`` for :func:`_gemv_kernel`: each program prefetches the first
    ``PF_LINES`` 128-byte lines of each of its weight rows in its K slice, a power of two with
    ``N * split * PF_LINES * 128 <= budget`` (default :data:`PREFETCH_BYTES`), at most the
    slice; ``{}`` (no prefetch) where not even one line a row fits the budget. The budget stands
    for the HBM time the kernel's start would otherwise spend waiting for its first bytes (~1 us
    at 4 TB/s is 4 MB) and must stay a small share of the 50 MB L2 that the kernel ahead streams
    through meanwhile: 16 MB measured slower than none."""
    budget = PREFETCH_BYTES if budget is None else int(budget)
    if budget <= 0 or N <= 0 or k_per_split <= 0:
        return {}
    step = max(1, LINE_BYTES // elem_bytes)
    most = max(1, k_per_split // step)
    lines = budget // (N * split * LINE_BYTES)
    if lines < 1:  # not even one line a row fits (a very wide weight, e.g. an LM head)
        return {}
    lines = min(1 << (lines.bit_length() - 1), 1 << (most.bit_length() - 1))
    return {"PF_LINES": lines, "PF_STEP": step}


def split_k(cfg: GemvConfig, K: int) -> Tuple[int, int]:
    """``(split, k_per_split)`` of a launch of ``cfg`` over ``K``: ``cfg.split`` lowered where ``K``
    has fewer ``block_k`` tiles, slices a whole number of tiles, no empty trailing slice."""
    if not K:
        return 1, 0
    split = max(1, min(cfg.split, cdiv(K, cfg.block_k)))
    k_per_split = cdiv(cdiv(K, split), cfg.block_k) * cfg.block_k
    return cdiv(K, k_per_split), k_per_split


def pdl_settings(device) -> dict:
    """What the decode step's launches do on ``device`` (for a benchmark's metadata): PDL on or off
    and, when on, where a GEMV signals, the fewest rows it uses PDL at, and its prefetch budget."""
    if not pdl_kwargs(torch.device(device)):
        return {"on": False}
    return {"on": True, "signal": _tc.PDL_SIGNAL, "min_m": _tc.PDL_MIN_M, "gemv_prefetch_bytes": PREFETCH_BYTES}


def late_norm(cfg: GemvConfig, split: int, dtype: torch.dtype) -> bool:
    """Whether the RMSNorm prologue runs in the K loop (``NORM_LATE``: no first pass over ``x``,
    ``rstd`` applied in the epilogue): with one K slice (each program sees whole rows), and not
    for the tensor-core form in fp16, whose operand ``x * norm_weight`` (not normalised) could
    leave fp16's range where the normalised input does not."""
    return split == 1 and not (cfg.dot and dtype == torch.float16)


def _norm_tile(M: int, K: int, norm: bool) -> dict:
    """The RMSNorm prologue's sum-of-squares tile: pow2(M) rows x up to 4096 / pow2(M) columns
    (fixed values without the norm, so the plain GEMV compiles once per config)."""
    if not norm:
        return dict(NORM_M=1, NORM_K=16)
    return dict(NORM_M=pow2(M), NORM_K=max(16, min(pow2(K), 4096 // pow2(M))))


def _rows(t: torch.Tensor, name: str, M: int, C: int) -> torch.Tensor:
    """``t [..., C]`` as ``[M, C]`` rows without a copy (last dim contiguous), or ``ValueError``."""
    if C > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous along its last dim (stride 1), got strides {t.stride()}")
    try:
        return t.view(M, C)
    except RuntimeError:
        raise ValueError(f"{name}'s leading dims must be viewable as [M, {C}] rows without a copy, got shape "
                         f"{tuple(t.shape)} strides {t.stride()}") from None


__all__ = ["GemvConfig", "CONFIGS", "pick_config", "norm_out_fused", "NORM_OUT_MAX_N", "late_norm", "prefetch_tile",
           "split_k", "pdl_settings",
           "class_rows", "rows_to_json", "rows_from_json", "configs_installed", "configs_overridden",
           "gemv_triton"]

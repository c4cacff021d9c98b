"""The Triton kernel of ``benchmarks/persistent_chain.py`` (the probe of docs/performance.md's
inference change 30): a chain of M = 2 GEMVs, one launch a GEMV or one launch for all of them
with grid barriers in between. Imported after the script has chosen the interpreter or not."""

from __future__ import annotations

import triton
import triton.language as tl

from orthros.ops.gemv.kernel import _round
from orthros.ops.triton.common import pdl_signal, pdl_wait, prefetch_l2


@triton.jit
def _prefetch_rows(W, row0, K, R: tl.constexpr, BN: tl.constexpr, PF: tl.constexpr):
    """Asks L2 for the first ``PF`` lines (64 bf16 each) of rows ``[row0, row0 + R)`` of ``W [*, K]``."""
    if PF > 0:
        for t in tl.static_range(R // BN):
            rows = row0 + t * BN + tl.arange(0, BN)
            prefetch_l2(W + rows[:, None] * K + (tl.arange(0, PF) * 64)[None, :])


@triton.jit
def _gemv_rows(X, sx, W, Y, row0, N, K, R, BN: tl.constexpr, BK: tl.constexpr, STAGES: tl.constexpr,
               EMU_RNE: tl.constexpr, DEFER: tl.constexpr, wh, HOLD: tl.constexpr):
    """Rows ``[row0, row0 + R)`` of ``Y [2, N] = X [2, K] (row stride sx) @ W [N, K].T`` (``BK``
    divides ``K``, ``BN`` divides ``R``): one pipelined loop over the block's (tile, K step) pairs,
    so the weight stream runs on across tiles; each tile's two rows stored after its last step.
    ``DEFER``: ``[BN, BK]`` float32 products accumulated elementwise and summed once a tile (the
    engine's deferred form), instead of a sum across the threads every step. ``HOLD`` (with
    ``DEFER``, ``HOLD < K / BK``): ``wh [HOLD, BN, BK]`` are the first tile's first ``HOLD`` K steps,
    loaded by the caller before its wait; their products start the accumulators and the loop
    starts after them."""
    KT = K // BK
    if DEFER:
        if HOLD > 0:
            offs = (tl.arange(0, HOLD) * BK)[:, None] + tl.arange(0, BK)[None, :]
            xh0 = tl.load(X + offs).to(tl.float32)
            xh1 = tl.load(X + sx + offs).to(tl.float32)
            whf = wh.to(tl.float32)
            acc0 = tl.sum(whf * xh0[:, None, :], axis=0)
            acc1 = tl.sum(whf * xh1[:, None, :], axis=0)
        else:
            acc0 = tl.zeros([BN, BK], tl.float32)
            acc1 = tl.zeros([BN, BK], tl.float32)
    else:
        acc0 = tl.zeros([BN], tl.float32)
        acc1 = tl.zeros([BN], tl.float32)
    for it in tl.range(HOLD, (R // BN) * KT, num_stages=STAGES):
        t = it // KT
        kk = it - t * KT
        rows = row0 + t * BN + tl.arange(0, BN)
        cols = kk * BK + tl.arange(0, BK)
        w = tl.load(W + rows[:, None] * K + cols[None, :]).to(tl.float32)
        x0 = tl.load(X + cols).to(tl.float32)
        x1 = tl.load(X + sx + cols).to(tl.float32)
        if DEFER:
            acc0 += w * x0[None, :]
            acc1 += w * x1[None, :]
            if kk == KT - 1:
                tl.store(Y + rows, _round(tl.sum(acc0, axis=1), Y.dtype.element_ty, EMU_RNE))
                tl.store(Y + N + rows, _round(tl.sum(acc1, axis=1), Y.dtype.element_ty, EMU_RNE))
                acc0 = tl.zeros([BN, BK], tl.float32)
                acc1 = tl.zeros([BN, BK], tl.float32)
        else:
            acc0 += tl.sum(w * x0[None, :], axis=1)
            acc1 += tl.sum(w * x1[None, :], axis=1)
            last = (tl.zeros([BN], tl.int32) + kk) == KT - 1
            tl.store(Y + rows, _round(acc0, Y.dtype.element_ty, EMU_RNE), mask=last)
            tl.store(Y + N + rows, _round(acc1, Y.dtype.element_ty, EMU_RNE), mask=last)
            acc0 = tl.where(last, 0.0, acc0)
            acc1 = tl.where(last, 0.0, acc1)


@triton.jit
def _grid_sync(BAR, ERR, target, POLLS_: tl.constexpr):
    """Every program's stores so far visible to every program after it: arrive (release), then
    spin until ``target`` programs have arrived (acquire). One thread a program does the atomics
    (Triton lowers them so: ``red.release`` and ``ld.acquire`` at gpu scope, the value shared
    through shared memory). Gives up after ``POLLS_`` polls and flags ``ERR`` (the programs
    were not all resident); once ``ERR`` is flagged, no barrier waits (the run ends soon, failed)."""
    tl.debug_barrier()
    tl.atomic_add(BAR, 1, sem="release", scope="gpu")
    seen = tl.atomic_add(BAR, 0, sem="acquire", scope="gpu")
    failed = tl.atomic_add(ERR, 0, sem="relaxed", scope="gpu")
    n = 0
    while (seen < target) & (n < POLLS_) & (failed == 0):
        seen = tl.atomic_add(BAR, 0, sem="acquire", scope="gpu")
        n += 1
    if seen < target:
        tl.atomic_max(ERR, 1)
    tl.debug_barrier()


@triton.jit
def _chain_kernel(ACT, WQKV, WO, WGU, WD, Y1, Y2, Y3, BAR, ERR, s_lo, s_hi,
                  H: tl.constexpr, NQKV: tl.constexpr, INTER: tl.constexpr, P: tl.constexpr,
                  BN: tl.constexpr, BK: tl.constexpr, STAGES: tl.constexpr,
                  PF_QKV: tl.constexpr, PF_O: tl.constexpr, PF_GU: tl.constexpr, PF_D: tl.constexpr,
                  POLLS_: tl.constexpr, EMU_RNE: tl.constexpr = False, DEFER: tl.constexpr = False,
                  HOLD: tl.constexpr = 0, PDL: tl.constexpr = False):
    """GEMVs ``s_lo .. s_hi - 1`` of the chain (GEMV ``s``: layer ``s // 4``, site ``s % 4``);
    ``ACT [layers + 1, 2, H]`` holds each layer's input and the last output. Each program asks
    L2 for the start of its next weight rows, then waits: for the kernel ahead (the launch's first
    GEMV, ``PDL``) or at a grid barrier (every later one); with ``HOLD``, it also loads its first
    ``HOLD`` weight tiles into registers before waiting (weight bytes streamed across the
    dependency). One loop serves the four sites (their shapes are runtime values), so the
    launch holds one pipeline's shared memory."""
    pid = tl.program_id(0)
    zero = pid * 0
    for s in range(s_lo, s_hi):
        layer = tl.cast(s // 4, tl.int64)
        site = s % 4
        if site == 0:
            X = ACT + layer * 2 * H
            W = WQKV + layer * NQKV * H
            Y = Y1 + layer * 2 * NQKV
            sx = zero + H
            N = zero + NQKV
            K = zero + H
            _prefetch_rows(W, pid * (NQKV // P), H, NQKV // P, BN, PF_QKV)
        elif site == 1:
            X = Y1 + layer * 2 * NQKV
            W = WO + layer * H * H
            Y = Y2 + layer * 2 * H
            sx = zero + NQKV
            N = zero + H
            K = zero + H
            _prefetch_rows(W, pid * (H // P), H, H // P, BN, PF_O)
        elif site == 2:
            X = Y2 + layer * 2 * H
            W = WGU + layer * 2 * INTER * H
            Y = Y3 + layer * 2 * 2 * INTER
            sx = zero + H
            N = zero + 2 * INTER
            K = zero + H
            _prefetch_rows(W, pid * (2 * INTER // P), H, 2 * INTER // P, BN, PF_GU)
        else:
            X = Y3 + layer * 2 * 2 * INTER
            W = WD + layer * H * INTER
            Y = ACT + (layer + 1) * 2 * H
            sx = zero + 2 * INTER
            N = zero + H
            K = zero + INTER
            _prefetch_rows(W, pid * (H // P), INTER, H // P, BN, PF_D)
        R = N // P
        if HOLD > 0:  # read-only weight: safe to load before the wait
            hk = (tl.arange(0, HOLD) * BK)[:, None, None] + tl.arange(0, BK)[None, None, :]
            wh = tl.load(W + (pid * R + tl.arange(0, BN))[None, :, None] * K + hk)
        else:
            wh = 0
        if s == s_lo:
            pdl_wait(PDL)
            pdl_signal(PDL)
        else:
            _grid_sync(BAR, ERR, (s - s_lo) * P, POLLS_)
        _gemv_rows(X, sx, W, Y, pid * R, N, K, R, BN, BK, STAGES, EMU_RNE, DEFER, wh, HOLD)

"""Host side of the Triton decode step: window query + full query of every row in one launch.

The cache is split along its length into ``S`` chunks (flash-decoding); program
``(split, kv_head, row)`` reads its chunk of K/V once for all ``G`` query heads of that KV
head and both streams (``2G`` query rows packed into one tile). With ``S == 1`` it writes the
outputs itself. With ``S > 1`` each program writes a partial result per row, merged by
log-sum-exp either by a second tiny kernel (``merge="separate"``, the default) or inside the
split kernel (``merge="inline"``: the last of the ``S`` programs of a (row, KV head) to finish,
found with an atomic ticket on a cached int32 counter it puts back to 0, merges them: one
launch per step). ``S`` depends only on static shapes and the per-row lengths are read on the
device, so a step is CUDA-graph capturable and never synchronises with the host.

Split count (:func:`num_splits`): the programs ``P = S * B * Hkv`` run in waves of
``slots = SMs * occupancy`` (occupancy estimated from the shared memory of the pipelined
K/V tiles). A step costs about ``ceil(P / slots)`` waves times the key blocks of one chunk,
so ``S`` is chosen to minimise ``waves(S) * (blocks_per_chunk(S) + c)``, ``c`` a program's fixed
cost in key blocks (ties: the smaller ``S``,
fewer partials to merge), with chunks of at least ``min_split`` keys. At B=1, Hkv=8 on 132
SMs this is the previous choice (~33 splits); at B=8 it picks S=4 (256 programs, one wave)
instead of S=5 (320 programs: a second, mostly idle wave). ``min_split`` (64) is what bounds
S at short caches: a 1K span gets S=16 (128 programs of one 64-key block each; with 512, the
default until 2026-12-02, S=2: 16 programs of 8 blocks in a row, ~11 us a layer against ~5.5,
measured in the engine's compiled step on an H200, docs/performance.md inference change 14);
with ``merge="inline"`` the model also prices the last program's serial merge
(``merge_tail`` x S x partial bytes per key-block bytes), so it picks fewer splits than with
the parallel merge (1K: 8 instead of 16). ``benchmarks/attention.py --decode-tune`` compares
these choices on a GPU.

The same split programs also come in a second form, ``_decode_split_qkv`` (host:
:func:`decode_qkv_attention_triton`): from the raw rows of the fused QKV projection, each
program applies the q/k RMSNorms, the queries' scale-offset and RoPE itself, attends the new
key from registers, and the program whose chunk holds the new position writes its K/V into the
cache, so the layer's token-wise code launches nothing between the QKV GEMV and this kernel.
Behind a GEMV that launches it early (PDL) it loads the prologue's parameters and its first
key block before its wait (docs/performance.md, inference change 21).
"""

from __future__ import annotations

import contextlib
import math
import os

import torch

import triton
import triton.language as tl

from ..gemv.naive import MAX_M as GEMV_MAX_M
from .common import (LOG2E, PDL_MIN_M, block_d, cdiv, dummy, interpreting, merge_splits, num_sms, pdl_enter,
                     pdl_kwargs, pow2, precision, softmax_result, softmax_step, zeroed_counters)


# ============================================================================ kernels

# what _decode_split does with its result (MERGE)
_PARTIAL, _DIRECT, _INLINE = 0, 1, 2


@triton.jit
def _merge_row(OP, LP, O, OO, b, stream, h, sob, soh, soob, sooh,
               HQ: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, NUM_SPLITS, BLOCK_S: tl.constexpr,
               CACHE: tl.constexpr):
    """Merge the ``NUM_SPLITS`` partials of one query row (``stream`` 0: window, 1: full; head
    ``h`` of batch row ``b``) and store it in the output dtype. ``CACHE``: the partials' load
    cache modifier (".cg" when they were written by other programs of the same launch)."""
    offs_s = tl.arange(0, BLOCK_S)
    s_ok = offs_s < NUM_SPLITS
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    base = ((b * 2 + stream) * HQ + h) * NUM_SPLITS
    lse_s = tl.load(LP + base + offs_s, mask=s_ok, other=float("-inf"), cache_modifier=CACHE)
    o_s = tl.load(OP + (base + offs_s)[:, None] * D + offs_d[None, :], mask=s_ok[:, None] & d_ok[None, :],
                  other=0.0, cache_modifier=CACHE)
    o, _ = merge_splits(lse_s, o_s)
    if stream == 0:
        tl.store(O + b * sob + h * soh + offs_d, o.to(O.dtype.element_ty), mask=d_ok)
    else:
        tl.store(OO + b * soob + h * sooh + offs_d, o.to(OO.dtype.element_ty), mask=d_ok)


@triton.jit
def _query_rows(kvh64, G: tl.constexpr, D: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    """The tile layout of a split program's ``2G`` query rows: rows ``0..G-1`` the window queries
    of the heads sharing KV head ``kvh64``, rows ``G..2G-1`` their full queries. Returns
    ``(is_win, r_ok, head, offs_d, d_ok, qmask)``."""
    r = tl.arange(0, BLOCK_H)
    is_win = r < G
    r_ok = r < 2 * G
    head = kvh64 * G + tl.where(is_win, r, r - G)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    return is_win, r_ok, head, offs_d, d_ok, r_ok[:, None] & d_ok[None, :]


@triton.jit
def _key_block(q, k, v, cols, hi, w_lo, is_win, m_i, l_i, acc, qk_scale, PREC: tl.constexpr, UPCAST: tl.constexpr):
    """One block of keys ``cols`` (``k``, ``v`` loaded, zero past ``hi``) into the online softmax."""
    if UPCAST:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    s = tl.dot(q, tl.trans(k), input_precision=PREC) * qk_scale
    mask = (cols < hi)[None, :] & ((~is_win)[:, None] | (cols[None, :] >= w_lo))
    s = tl.where(mask, s, float("-inf"))
    return softmax_step(m_i, l_i, acc, s, v, PREC)


@triton.jit
def _attend_chunk(q, k_base, v_base, skt, svt, lo, hi, w_lo, is_win, offs_d, d_ok, qk_scale, m_i, l_i, acc,
                  BLOCK_N: tl.constexpr, PREC: tl.constexpr, UPCAST: tl.constexpr):
    """Online softmax of the query tile ``q [BLOCK_H, BLOCK_D]`` (window rows ``is_win``: keys
    ``>= w_lo`` only) over keys ``[lo, hi)`` of one KV head, from the state ``(m_i, l_i, acc)``."""
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N).to(tl.int64)
        kmask = (cols < hi)[:, None] & d_ok[None, :]
        k = tl.load(k_base + cols[:, None] * skt + offs_d[None, :], mask=kmask, other=0.0)
        v = tl.load(v_base + cols[:, None] * svt + offs_d[None, :], mask=kmask, other=0.0)
        m_i, l_i, acc = _key_block(q, k, v, cols, hi, w_lo, is_win, m_i, l_i, acc, qk_scale, PREC=PREC, UPCAST=UPCAST)
    return m_i, l_i, acc


@triton.jit
def _empty_state(BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    return (tl.full([BLOCK_H], float("-inf"), tl.float32), tl.zeros([BLOCK_H], tl.float32),
            tl.zeros([BLOCK_H, BLOCK_D], tl.float32))


@triton.jit
def _finish_split(m_i, l_i, acc, OP, LP, O, OO, CNT, b64, kvh64, split, head, is_win, r_ok, offs_d, qmask,
                  sob, soh, soob, sooh, G: tl.constexpr, HQ: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
                  NUM_SPLITS, MERGE: tl.constexpr, BLOCK_S: tl.constexpr):
    """What a split program does with its result (``MERGE``, see :func:`_decode_split`)."""
    o, lse, _ = softmax_result(m_i, l_i, acc)
    if MERGE == 1:  # _DIRECT: the only split, its result is final
        tl.store(O + b64 * sob + head[:, None] * soh + offs_d[None, :], o.to(O.dtype.element_ty),
                 mask=qmask & is_win[:, None])
        tl.store(OO + b64 * soob + head[:, None] * sooh + offs_d[None, :], o.to(OO.dtype.element_ty),
                 mask=qmask & (~is_win)[:, None])
    else:
        # partial layout: [B, 2, HQ, NUM_SPLITS, (D)]
        prow = ((b64 * 2 + tl.where(is_win, 0, 1)) * HQ + head) * NUM_SPLITS + split
        tl.store(OP + prow[:, None] * D + offs_d[None, :], o, mask=qmask)
        tl.store(LP + prow, lse, mask=r_ok)
        if MERGE == 2:  # _INLINE
            cnt = CNT + b64 * tl.num_programs(1) + kvh64
            # every thread's partial stores happen before the ticket (CTA barrier, then a
            # gpu-scope release); the last program's acquire makes the others' visible, and it
            # reads them from L2 (.cg), not from a possibly stale L1
            tl.debug_barrier()
            ticket = tl.atomic_add(cnt, 1, sem="acq_rel", scope="gpu")
            if ticket == NUM_SPLITS - 1:
                for rr in tl.static_range(2 * G):
                    _merge_row(OP, LP, O, OO, b64, rr // G, kvh64 * G + rr % G, sob, soh, soob, sooh,
                               HQ=HQ, D=D, BLOCK_D=BLOCK_D, NUM_SPLITS=NUM_SPLITS, BLOCK_S=BLOCK_S,
                               CACHE=".cg")
                tl.store(cnt, 0)  # every program of this (b, kvh) has drawn: ready for the next launch


@triton.jit(do_not_specialize=["window", "NUM_SPLITS"])
def _decode_split(
    Q, QO, K, V, SEQ, OP, LP, O, OO, CNT,
    sqb, sqh, sob_, soh_, skb, skt, skh, svb, svt, svh, sob, soh, soob, sooh,
    window, qk_scale, split_len,
    G: tl.constexpr, HQ: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, NUM_SPLITS, PREC: tl.constexpr,
    MERGE: tl.constexpr, BLOCK_S: tl.constexpr, UPCAST: tl.constexpr, PDL: tl.constexpr = False,
):
    """One decode step, both streams: rows 0..G-1 are the window queries of the G heads that
    share KV head ``kvh``, rows G..2G-1 their full queries. Program (split, kvh, b) reads its
    chunk of the cache once. ``MERGE``: _PARTIAL writes partial (o, lse) per row for
    _decode_combine; _DIRECT (one split) writes the normalised o / o_out; _INLINE writes the
    partial, then takes a ticket on the (b, kvh) counter ``CNT``: the program that draws the
    last one merges the ``NUM_SPLITS`` partials of the 2G rows, writes o / o_out and puts the
    counter back to 0. ``NUM_SPLITS`` is a runtime value (a new split count does not recompile,
    except ``BLOCK_S`` of an inline merge). ``UPCAST``: fp32 matmuls (only under the Triton
    interpreter, whose bf16 ``tl.dot`` is wrong). ``PDL``: launched as a programmatic dependent
    (:func:`.common.pdl_kwargs`): waits for the kernel ahead before touching memory."""
    pdl_enter(PDL)
    split = tl.program_id(0)
    kvh = tl.program_id(1)
    b = tl.program_id(2)
    b64 = b.to(tl.int64)
    kvh64 = kvh.to(tl.int64)
    L = tl.load(SEQ + b64).to(tl.int64)
    s_lo = split.to(tl.int64) * split_len
    s_hi = tl.minimum(s_lo + split_len, L)
    is_win, r_ok, head, offs_d, d_ok, qmask = _query_rows(kvh64, G, D, BLOCK_H, BLOCK_D)
    qw = tl.load(Q + b64 * sqb + head[:, None] * sqh + offs_d[None, :], mask=qmask & is_win[:, None], other=0.0)
    qf = tl.load(QO + b64 * sob_ + head[:, None] * soh_ + offs_d[None, :], mask=qmask & (~is_win)[:, None], other=0.0)
    q = qw + qf
    if UPCAST:
        q = q.to(tl.float32)
    m_i, l_i, acc = _empty_state(BLOCK_H, BLOCK_D)
    m_i, l_i, acc = _attend_chunk(q, K + b64 * skb + kvh64 * skh, V + b64 * svb + kvh64 * svh, skt, svt, s_lo, s_hi,
                                  L - window, is_win, offs_d, d_ok, qk_scale, m_i, l_i, acc, BLOCK_N=BLOCK_N,
                                  PREC=PREC, UPCAST=UPCAST)
    _finish_split(m_i, l_i, acc, OP, LP, O, OO, CNT, b64, kvh64, split, head, is_win, r_ok, offs_d, qmask,
                  sob, soh, soob, sooh, G=G, HQ=HQ, D=D, BLOCK_D=BLOCK_D, NUM_SPLITS=NUM_SPLITS, MERGE=MERGE,
                  BLOCK_S=BLOCK_S)


@triton.jit
def _prologue(x, xp, wn, wnp, a, ap, bb, bbp, c, s, sign, eps, D: tl.constexpr, HAS_NORM: tl.constexpr,
              HAS_SO: tl.constexpr, DT: tl.constexpr):
    """The layer's token-wise ops on raw projections (float32 tiles, reduced along the last
    axis: one head per row): RMSNorm (``wn``), scale-offset (``alpha = a``, ``beta = bb``), then
    RoPE (rotate-half: ``xp`` holds each element's partner ``d +- D/2``, ``sign`` -1 for the
    first half). Rounded to ``DT`` where the layer's ops round (the output of each op)."""
    if HAS_NORM:
        rstd = tl.rsqrt(tl.sum(x * x, axis=len(x.shape) - 1, keep_dims=True) / D + eps)
        x = ((x * rstd).to(DT).to(tl.float32) * wn).to(DT).to(tl.float32)
        xp = ((xp * rstd).to(DT).to(tl.float32) * wnp).to(DT).to(tl.float32)
    if HAS_SO:
        x = (x * a + bb).to(DT).to(tl.float32)
        xp = (xp * ap + bbp).to(DT).to(tl.float32)
    # x * cos + rotate_half(x) * sin, each product rounded as the layer's ops round it
    return ((x * c).to(DT).to(tl.float32) + (sign * xp * s).to(DT).to(tl.float32)).to(DT)


@triton.jit(do_not_specialize=["window", "NUM_SPLITS", "QW_ROW", "QF_ROW"])
def _decode_split_qkv(
    QKV, K, V, LENS, COS, SIN, QN, KN, AW, BW, AF, BF, OP, LP, O, OO, CNT,
    sxb, sxr, scb, skb, skt, skh, svb, svt, svh, sob, soh, soob, sooh,
    QW_ROW, QF_ROW, window, qk_scale, split_len, L_MAX, eps,
    G: tl.constexpr, HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, NUM_SPLITS, PREC: tl.constexpr,
    MERGE: tl.constexpr, BLOCK_S: tl.constexpr, UPCAST: tl.constexpr, HAS_QN: tl.constexpr,
    HAS_KN: tl.constexpr, HAS_SO: tl.constexpr, PEEL: tl.constexpr, PDL: tl.constexpr = False,
):
    """:func:`_decode_split` from the fused QKV projection's raw rows ``QKV [B, R, (HQ + 2 HKV) D]``:
    each program computes its queries (rows ``QW_ROW`` / ``QF_ROW``: q-norm, scale-offset,
    RoPE) and the new token's key (row 0: k-norm, RoPE) itself, attends the cached keys before
    ``LENS[b]`` from the cache and the new key from registers, and the program whose chunk
    holds position ``LENS[b]`` writes the new K/V there. Launched with ``PDL`` behind the QKV
    projection, it loads before its wait what that kernel does not write: the prologue's
    parameters (RoPE tables, norm weights, alpha / beta: cold in L2 after a step's weights
    streamed through it) and, with ``PEEL``, its chunk's first key block into registers (the
    rest goes through the pipelined loop after the wait)."""
    split = tl.program_id(0)
    kvh = tl.program_id(1)
    b = tl.program_id(2)
    b64 = b.to(tl.int64)
    kvh64 = kvh.to(tl.int64)
    pos = tl.load(LENS + b64).to(tl.int64)  # the new token's index; written by no kernel of this step
    L = pos + 1
    s_lo = split.to(tl.int64) * split_len
    s_end = s_lo + split_len
    hi = tl.minimum(s_end, pos)  # the chunk's cached keys (the new one comes from registers)
    k_base = K + b64 * skb + kvh64 * skh
    v_base = V + b64 * svb + kvh64 * svh
    DT: tl.constexpr = QKV.dtype.element_ty
    HALF: tl.constexpr = D // 2
    is_win, r_ok, head, offs_d, d_ok, qmask = _query_rows(kvh64, G, D, BLOCK_H, BLOCK_D)
    offs_p = tl.where(offs_d < HALF, offs_d + HALF, offs_d - HALF)
    sign = tl.where(offs_d < HALF, -1.0, 1.0)
    # Until the PDL wait: only what no kernel of this step writes. The chunk's first key block
    # (PEEL; the cache before `pos` was written by earlier steps) and the prologue's parameters.
    if PEEL:
        cols0 = s_lo + tl.arange(0, BLOCK_N).to(tl.int64)
        kmask0 = (cols0 < hi)[:, None] & d_ok[None, :]
        k0 = tl.load(k_base + cols0[:, None] * skt + offs_d[None, :], mask=kmask0, other=0.0)
        v0 = tl.load(v_base + cols0[:, None] * svt + offs_d[None, :], mask=kmask0, other=0.0)
    c = tl.load(COS + b64 * scb + offs_d, mask=d_ok, other=0.0).to(tl.float32)
    s = tl.load(SIN + b64 * scb + offs_d, mask=d_ok, other=0.0).to(tl.float32)
    wn = 1.0
    wnp = 1.0
    kn = 1.0
    knp = 1.0
    if HAS_QN:
        wn = tl.load(QN + offs_d, mask=d_ok, other=0.0).to(tl.float32)[None, :]
        wnp = tl.load(QN + offs_p, mask=d_ok, other=0.0).to(tl.float32)[None, :]
    if HAS_KN:
        kn = tl.load(KN + offs_d, mask=d_ok, other=0.0).to(tl.float32)
        knp = tl.load(KN + offs_p, mask=d_ok, other=0.0).to(tl.float32)
    a = 0.0
    ap = 0.0
    bb = 0.0
    bbp = 0.0
    if HAS_SO:
        so = head[:, None] * D
        wm = qmask & is_win[:, None]
        fm = qmask & (~is_win)[:, None]
        a = (tl.load(AW + so + offs_d[None, :], mask=wm, other=0.0).to(tl.float32)
             + tl.load(AF + so + offs_d[None, :], mask=fm, other=0.0).to(tl.float32))
        ap = (tl.load(AW + so + offs_p[None, :], mask=wm, other=0.0).to(tl.float32)
              + tl.load(AF + so + offs_p[None, :], mask=fm, other=0.0).to(tl.float32))
        bb = (tl.load(BW + so + offs_d[None, :], mask=wm, other=0.0).to(tl.float32)
              + tl.load(BF + so + offs_d[None, :], mask=fm, other=0.0).to(tl.float32))
        bbp = (tl.load(BW + so + offs_p[None, :], mask=wm, other=0.0).to(tl.float32)
               + tl.load(BF + so + offs_p[None, :], mask=fm, other=0.0).to(tl.float32))
    pdl_enter(PDL)
    # the queries: [BLOCK_H, BLOCK_D], row r of head `head` from qkv row QW_ROW (window) / QF_ROW (full)
    row = tl.where(is_win, QW_ROW, QF_ROW).to(tl.int64)
    q_ptr = QKV + b64 * sxb + row[:, None] * sxr + head[:, None] * D
    x = tl.load(q_ptr + offs_d[None, :], mask=qmask, other=0.0).to(tl.float32)
    xp = tl.load(q_ptr + offs_p[None, :], mask=qmask, other=0.0).to(tl.float32)
    q = _prologue(x, xp, wn, wnp, a, ap, bb, bbp, c[None, :], s[None, :], sign[None, :], eps, D=D, HAS_NORM=HAS_QN,
                  HAS_SO=HAS_SO, DT=DT)
    q = tl.where(qmask, q, 0.0).to(DT)
    # the new token's key and value (qkv row 0)
    kv_ptr = QKV + b64 * sxb + (HQ + kvh64) * D
    kx = tl.load(kv_ptr + offs_d, mask=d_ok, other=0.0).to(tl.float32)
    kxp = tl.load(kv_ptr + offs_p, mask=d_ok, other=0.0).to(tl.float32)
    k_new = _prologue(kx, kxp, kn, knp, 0.0, 0.0, 0.0, 0.0, c, s, sign, eps, D=D, HAS_NORM=HAS_KN, HAS_SO=False,
                      DT=DT)
    v_new = tl.load(kv_ptr + HKV * D + offs_d, mask=d_ok, other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    m_i, l_i, acc = _empty_state(BLOCK_H, BLOCK_D)
    lo = s_lo
    if PEEL:
        m_i, l_i, acc = _key_block(q, k0, v0, cols0, hi, L - window, is_win, m_i, l_i, acc, qk_scale, PREC=PREC,
                                   UPCAST=UPCAST)
        lo = s_lo + BLOCK_N
    m_i, l_i, acc = _attend_chunk(q, k_base, v_base, skt, svt, lo, hi, L - window, is_win, offs_d, d_ok, qk_scale,
                                  m_i, l_i, acc, BLOCK_N=BLOCK_N, PREC=PREC, UPCAST=UPCAST)
    # the new key: visible to both streams, folded in by the program whose chunk holds it
    has_new = (s_lo <= pos) & (pos < s_end) & (pos < L_MAX)
    s_new = tl.sum(q.to(tl.float32) * k_new.to(tl.float32)[None, :], 1) * qk_scale
    s_new = tl.where(has_new, s_new, float("-inf"))
    m_new = tl.maximum(m_i, s_new)
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(s_new - m_safe)
    l_i = l_i * alpha + p
    acc = acc * alpha[:, None] + p[:, None] * v_new.to(tl.float32)[None, :]
    m_i = m_new
    new_ok = d_ok & (offs_d < tl.where(has_new, BLOCK_D, 0))
    tl.store(K + b64 * skb + pos * skt + kvh64 * skh + offs_d, k_new, mask=new_ok)
    tl.store(V + b64 * svb + pos * svt + kvh64 * svh + offs_d, v_new, mask=new_ok)
    _finish_split(m_i, l_i, acc, OP, LP, O, OO, CNT, b64, kvh64, split, head, is_win, r_ok, offs_d, qmask,
                  sob, soh, soob, sooh, G=G, HQ=HQ, D=D, BLOCK_D=BLOCK_D, NUM_SPLITS=NUM_SPLITS, MERGE=MERGE,
                  BLOCK_S=BLOCK_S)


@triton.jit(do_not_specialize=["NUM_SPLITS"])
def _decode_combine(OP, LP, O, OO, sob, soh, soob, sooh,
                    HQ: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
                    NUM_SPLITS, BLOCK_S: tl.constexpr, PDL: tl.constexpr = False):
    pdl_enter(PDL)
    _merge_row(OP, LP, O, OO, tl.program_id(2).to(tl.int64), tl.program_id(1), tl.program_id(0).to(tl.int64),
               sob, soh, soob, sooh, HQ=HQ, D=D, BLOCK_D=BLOCK_D, NUM_SPLITS=NUM_SPLITS, BLOCK_S=BLOCK_S,
               CACHE="")


# ============================================================================ host

# (BLOCK_N, num_warps, num_stages, min keys per split); measured on an H200.
# max_splits bounds S (the merge holds all S partials of a row in one tile). merge: "separate"
# (a second launch, _decode_combine, merges the S > 1 partials) or "inline" (the split kernel's
# last program per (row, KV head) merges them: one launch); one split always writes directly.
# merge_tail: weight of the inline merge's serial tail in the split-count model (num_splits).
DECODE_CONFIG = {"block_n": 64, "num_warps": 4, "num_stages": 3, "min_split": 64, "max_splits": 64,
                 "smem_per_sm": 228 * 1024, "max_occupancy": 2, "prog_overhead": 4, "merge": "separate",
                 "merge_tail": 1.0}
MERGES = ("separate", "inline")
_SMEM = {}


def check_decode_config(overrides: dict) -> None:
    """ValueError unless every key of ``overrides`` is a :data:`DECODE_CONFIG` key with an
    allowed value (``merge`` one of :data:`MERGES`, ``merge_tail`` a number >= 0, the rest
    positive integers)."""
    for k, v in overrides.items():
        if k not in DECODE_CONFIG:
            raise ValueError(f"decode config: unknown key {k!r}; allowed: {', '.join(DECODE_CONFIG)}")
        if k == "merge":
            if v not in MERGES:
                raise ValueError(f"decode config: merge {v!r}; allowed: {', '.join(MERGES)}")
        elif k == "merge_tail":
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
                raise ValueError(f"decode config: merge_tail {v!r}; give a number >= 0")
        elif isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"decode config: {k} {v!r}; give a positive integer")


@contextlib.contextmanager
def decode_config(**overrides):
    """Within the block, :data:`DECODE_CONFIG` entries set from ``overrides`` (what a benchmark
    tries against the defaults, e.g. ``min_split=64``); refused by :func:`check_decode_config`
    before anything changes; the defaults come back afterwards."""
    check_decode_config(overrides)
    keep = dict(DECODE_CONFIG)
    DECODE_CONFIG.update(overrides)
    try:
        yield DECODE_CONFIG
    finally:
        DECODE_CONFIG.clear()
        DECODE_CONFIG.update(keep)


def _smem_per_sm(device) -> int:
    if device.type != "cuda":
        return DECODE_CONFIG["smem_per_sm"]
    n = _SMEM.get(device.index)
    if n is None:
        try:
            props = torch.cuda.get_device_properties(device)
            n = int(getattr(props, "shared_memory_per_multiprocessor", 0)) or DECODE_CONFIG["smem_per_sm"]
        except Exception:  # noqa: BLE001
            n = DECODE_CONFIG["smem_per_sm"]
        _SMEM[device.index] = n
    return n


def _smem_per_block(device) -> int:
    """Shared memory one program may use (opt-in limit: 227 KB on the H100/H200)."""
    if device.type != "cuda":
        return DECODE_CONFIG["smem_per_sm"]
    key = ("block", device.index)
    n = _SMEM.get(key)
    if n is None:
        try:
            props = torch.cuda.get_device_properties(device)
            n = int(getattr(props, "shared_memory_per_block_optin", 0)) or _smem_per_sm(device)
        except Exception:  # noqa: BLE001
            n = DECODE_CONFIG["smem_per_sm"]
        _SMEM[key] = n
    return n


def fit_stages(num_stages: int, block_n: int, block_d: int, elem_bytes: int, smem_limit: int) -> int:
    """The most software-pipeline stages ``<= num_stages`` whose shared memory fits one program:
    Triton keeps ``num_stages - 1`` K and V tiles in flight, ``2 (num_stages - 1) block_n block_d
    elem_bytes``, plus 16 KB for the rest. (Checked on the H200: ``block_n = 128``, fp32, 3 stages
    asks for 278,528 B = 2 x 2 x 128 x 128 x 4 + 16,384 against a 232,448 B limit; fp32 and
    ``block_n = 128`` now get 2 stages.)"""
    ns = max(1, int(num_stages))
    while ns > 1 and 2 * (ns - 1) * block_n * block_d * elem_bytes + 16 * 1024 > smem_limit:
        ns -= 1
    return ns


def occupancy(block_n: int, block_d: int, num_stages: int, elem_bytes: int = 2, smem_per_sm: int = 228 * 1024,
              max_occupancy: int = 2) -> int:
    """Programs of ``_decode_split`` resident per SM, from the K/V tiles in flight
    (``num_stages`` x (K + V) x ``block_n`` x ``block_d``) plus ~8 KB of scratch."""
    per = max(1, num_stages) * 2 * block_n * block_d * elem_bytes + 8 * 1024
    return max(1, min(max_occupancy, smem_per_sm // per))


def choose_splits(B: int, HKV: int, L_max: int, sms: int, occ: int, block_n: int, min_split: int,
                  max_splits: int = 64, prog_overhead: int = 4, tail_per_split: float = 0.0) -> int:
    """Split count minimising ``ceil(P / slots) * (blocks_per_chunk + prog_overhead) +
    S * tail_per_split`` (a pure function of static shapes). ``prog_overhead`` (in key blocks)
    is a program's fixed cost (query load, pipeline fill, partial store) and keeps the model
    from trading one wave of long chunks for many exactly-filled waves of short ones.
    ``tail_per_split`` (key blocks): what one more split adds to a serial merge at the end (the
    inline merge's last program reads all S partials; 0 for the separate, parallel merge)."""
    pairs = max(1, B * HKV)
    slots = max(1, sms * occ)
    s_max = max(1, min(max_splits, L_max // max(1, min_split)))
    best, best_cost = 1, None
    for s in range(1, s_max + 1):
        split_len = cdiv(cdiv(L_max, s), block_n) * block_n
        s_eff = cdiv(L_max, split_len)
        if s_eff != s:
            continue  # same chunks as a smaller S
        cost = cdiv(pairs * s, slots) * (split_len // block_n + prog_overhead)
        if s > 1:
            cost += s * tail_per_split
        if best_cost is None or cost < best_cost:
            best, best_cost = s, cost
    return best


def num_splits(B: int, HKV: int, L_max: int, device, cfg=None, elem_bytes: int = 2, block_d: int = 128,
               G: int = 1) -> int:
    """The split count of ``cfg`` (default DECODE_CONFIG) for these static shapes. With
    ``merge="inline"`` the serial merge tail is priced at ``cfg["merge_tail"]`` times the bytes
    of one split's partials (2G rows of fp32 o) over the bytes of one K+V key block; ``G``:
    query heads per KV head."""
    cfg = DECODE_CONFIG if cfg is None else cfg
    occ = occupancy(cfg["block_n"], block_d, cfg["num_stages"], elem_bytes,
                    cfg.get("smem_per_sm") if device.type != "cuda" else _smem_per_sm(device),
                    cfg.get("max_occupancy", 2))
    tail = 0.0
    if cfg.get("merge", "separate") == "inline":
        tail = cfg.get("merge_tail", 1.0) * (2 * G * 4) / (2 * cfg["block_n"] * elem_bytes)
    return choose_splits(B, HKV, L_max, num_sms(device), occ, cfg["block_n"], cfg["min_split"],
                         cfg.get("max_splits", 64), cfg.get("prog_overhead", 4), tail)


class _Plan:
    """What a decode launch needs beyond its inputs, from static shapes only: the config (its
    stages fitted to the shared memory), the split count ``S`` and chunk length, the merge mode
    and its buffers (partials, counters), launch settings. Shared by both split kernels."""

    def __init__(self, B, HQ, HKV, D, L_max, dtype, dev, _config=None):
        cfg = DECODE_CONFIG if _config is None else {**DECODE_CONFIG, **_config}
        merge = cfg["merge"]
        if merge not in MERGES:
            raise ValueError(f"decode config 'merge' must be one of {MERGES}, got {merge!r}")
        es = dtype.itemsize
        BD = block_d(D)
        if dev.type == "cuda":  # fp32 or block_n = 128 would ask for more shared memory than a program has
            ns_fit = fit_stages(cfg["num_stages"], cfg["block_n"], BD, es, _smem_per_block(dev))
            if ns_fit != cfg["num_stages"]:
                cfg = {**cfg, "num_stages": ns_fit}
        G = HQ // HKV
        bn = cfg["block_n"]
        S = cfg.get("splits") or num_splits(B, HKV, L_max, dev, cfg, es, BD, G)
        S = max(1, min(int(S), cdiv(L_max, bn)))
        self.split_len = cdiv(cdiv(L_max, S), bn) * bn
        self.S = S = cdiv(L_max, self.split_len)
        if S == 1:
            self.mode, self.op, self.lp, self.cnt, self.bs = _DIRECT, dummy(dev), dummy(dev), dummy(dev), 2
        else:
            self.op = torch.empty(B, 2, HQ, S, D, dtype=torch.float32, device=dev)
            self.lp = torch.empty(B, 2, HQ, S, dtype=torch.float32, device=dev)
            if merge == "inline":
                self.mode, self.cnt, self.bs = _INLINE, zeroed_counters(dev, B * HKV), max(2, pow2(S))
            else:  # BLOCK_S unused by the split kernel: one compile for every S
                self.mode, self.cnt, self.bs = _PARTIAL, dummy(dev), 2
        self.BD = BD
        self.upcast = interpreting() and dtype == torch.bfloat16
        self.consts = dict(G=G, HQ=HQ, D=D, BLOCK_D=BD, BLOCK_H=max(16, pow2(2 * G)), BLOCK_N=bn, NUM_SPLITS=S,
                           PREC="ieee" if self.upcast else precision(dtype), MERGE=self.mode, BLOCK_S=self.bs,
                           UPCAST=self.upcast)
        nw, ns = (1, 1) if interpreting() else (cfg["num_warps"], cfg["num_stages"])
        self.pdl = pdl_kwargs(dev)
        self.launch = dict(num_warps=nw, num_stages=ns, **self.pdl)

    def combine(self, o, o_out):
        """The merge launch of the partials (``merge="separate"`` with S > 1)."""
        if self.mode == _PARTIAL:
            _decode_combine[(self.consts["HQ"], 2, o.shape[0])](
                self.op, self.lp, o, o_out, o.stride(0), o.stride(2), o_out.stride(0), o_out.stride(2),
                HQ=self.consts["HQ"], D=self.consts["D"], BLOCK_D=self.BD, NUM_SPLITS=self.S,
                BLOCK_S=max(2, pow2(self.S)), **self.pdl)


def decode_attention_triton(q, q_out, k_cache, v_cache, cache_seqlens, *, window_size, scale=None,
                            stacked=False, _config=None):
    """Both streams' rows go into one ``[B, 2, HQ, D]`` buffer; ``stacked``: return it, else
    its two rows ``(o, o_out)`` (views). ``_config`` (internal, for benchmarks/attention.py --decode-tune): a dict overriding
    DECODE_CONFIG keys (e.g. ``merge``, ``min_split``) and/or giving ``splits`` (the split count
    S) explicitly. With S = 1 the split kernel writes the outputs itself (no merge, no partial
    buffers); with S > 1, ``merge`` picks a second merge launch or the in-kernel merge."""
    B, _, HQ, D = q.shape
    L_max, HKV = k_cache.shape[1], k_cache.shape[2]
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    q = q if q.stride(-1) == 1 else q.contiguous()
    q_out = q_out if q_out.stride(-1) == 1 else q_out.contiguous()
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("orthros_decode_attention: k_cache/v_cache need a contiguous last dimension")
    plan = _Plan(B, HQ, HKV, D, L_max, q.dtype, q.device, _config)
    both = torch.empty(B, 2, HQ, v_cache.shape[-1], dtype=q.dtype, device=q.device)
    o, o_out = both[:, :1], both[:, 1:]
    _decode_split[(plan.S, HKV, B)](
        q, q_out, k_cache, v_cache, cache_seqlens, plan.op, plan.lp, o, o_out, plan.cnt,
        q.stride(0), q.stride(2), q_out.stride(0), q_out.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        o.stride(0), o.stride(2), o_out.stride(0), o_out.stride(2),
        int(window_size), scale * LOG2E, plan.split_len, **plan.consts, **plan.launch)
    plan.combine(o, o_out)
    return both if stacked else (o, o_out)


# The raw-projection kernel loads its first key block before its PDL wait (PEEL) when the QKV
# GEMV ahead of it launches it early: a GEMV of PDL_MIN_M..MAX_M rows (the pair at B <= 4, the
# Transformer at 2..8). Measured on an H200 (docs/performance.md, inference change 21): the
# pair's 1K step 0.03 ms faster with it; the one-row Transformer, started only when its GEMV
# ends, 0.03 ms slower (236 registers against 108). ORTHROS_QKV_PEEL=0 turns it off (at import).
QKV_PEEL = os.environ.get("ORTHROS_QKV_PEEL", "1") == "1"


def _launched_early(pdl, rows: int) -> bool:
    """Whether the GEMV producing ``rows`` rows of QKV starts the kernel behind it early (PDL)."""
    return bool(pdl) and PDL_MIN_M <= rows <= GEMV_MAX_M


def decode_qkv_attention_triton(qkv, k_cache, v_cache, lens, *, num_heads, q_rows, rope, window_size, scale=None,
                                q_norm=None, k_norm=None, eps=1e-6, scale_offset=(None, None, None, None),
                                _config=None):
    """:func:`orthros.ops.decode.orthros_decode_qkv_attention` (arguments checked there) in one
    split launch (plus the merge): returns ``[B, 2, HQ, D]``, writes the new K/V."""
    B = qkv.shape[0]
    L_max, HKV, D = k_cache.shape[1], k_cache.shape[2], k_cache.shape[3]
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    if qkv.stride(-1) != 1 or k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("orthros_decode_qkv_attention: qkv, k_cache and v_cache need a contiguous last dimension")
    dev = qkv.device
    cos, sin = rope
    cos = cos if cos.stride(-1) == 1 else cos.contiguous()
    sin = sin if sin.stride(-1) == 1 else sin.contiguous()
    if cos.stride(0) != sin.stride(0):
        cos, sin = cos.contiguous(), sin.contiguous()
    so = tuple(t.contiguous() if t is not None else dummy(dev) for t in scale_offset)
    plan = _Plan(B, num_heads, HKV, D, L_max, qkv.dtype, dev, _config)
    both = torch.empty(B, 2, num_heads, D, dtype=qkv.dtype, device=dev)
    o, o_out = both[:, :1], both[:, 1:]
    _decode_split_qkv[(plan.S, HKV, B)](
        qkv, k_cache, v_cache, lens, cos, sin, dummy(dev) if q_norm is None else q_norm,
        dummy(dev) if k_norm is None else k_norm, *so, plan.op, plan.lp, o, o_out, plan.cnt,
        qkv.stride(0), qkv.stride(1), cos.stride(0) if cos.shape[0] > 1 else 0,
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        o.stride(0), o.stride(2), o_out.stride(0), o_out.stride(2),
        int(q_rows[0]), int(q_rows[1]), int(window_size), scale * LOG2E, plan.split_len, L_max, float(eps),
        HKV=HKV, HAS_QN=q_norm is not None, HAS_KN=k_norm is not None, HAS_SO=scale_offset[0] is not None,
        PEEL=QKV_PEEL and _launched_early(plan.pdl, qkv.shape[0] * qkv.shape[1]), **plan.consts,
        **plan.launch)
    plan.combine(o, o_out)
    return both

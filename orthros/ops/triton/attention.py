"""Host side of the Triton Orthros attention: autograd functions and dispatch.

The op is two streams sharing K and V:

* the window stream (every base query, keys ``t-w+1 .. t``) -> :class:`_StreamAttention`
  with ``window = w`` and positions ``T_k - T + i``;
* the full stream (output queries at ``output_positions``, keys ``0 .. pos``) ->
  SDPA with ``is_causal=True`` when the positions are *all* positions of one plain
  sequence (pre-training: cuDNN / flash are the fastest causal kernels on Hopper), else
  :class:`_StreamAttention` with ``window = 0`` (SFT, prefill's last query, varlen,
  left padding). Long key ranges with few query blocks are split along the keys
  (flash-decoding style) and merged by log-sum-exp.

Autograd sums the two streams' dK/dV.

``FWD_VARIANT`` / ``DQ_VARIANT`` select candidate kernels (edge-only masking, GQA-packed rows)
that ``benchmarks/attention.py --window-tune`` compares on a GPU; the defaults are the measured
kernels.
"""

from __future__ import annotations

import contextlib
import functools
import os

import torch
import triton
import triton.language as tl

from ..backends import reference_instead, triton_runs
from . import common as _common
from .common import (LOG2E, band, bind, block_d, cdiv, dummy, interpreting, last_contig, launch, merge_splits,
                     num_sms, pow2, precision, softmax_result, softmax_step, visible)

# ============================================================================ kernels
# A stream is a set of queries with increasing absolute positions ``qpos`` (either
# ``pos_offset + row`` -- the base stream -- or read from a position tensor -- the output
# stream) attending to keys ``lo(q) .. qpos`` where ``lo`` is ``qpos - window + 1`` for the
# window stream and ``0`` for the full stream, further restricted to the query's document
# (``DOC``/``DOCSTART``) and to keys ``>= kv_start[b]`` (left padding). Every program visits
# only the key blocks that can be visible to its query block (the band near the diagonal for
# the window stream), so no ``T x T`` mask exists anywhere. All row offsets are 64-bit.
# ``LSE`` is ``+inf`` for a row with no visible key (its output is 0 and its gradient
# contributions vanish).

# Integer arguments Triton would otherwise specialise on (== 1, divisible by 16): lengths,
# positions, window, head counts, position-tensor strides. They feed masks, loop bounds and
# scalar loads, not vectorised addresses, so specialising buys nothing but one compiled
# kernel per combination (new sequence lengths would recompile).
_NO_SPEC = ["M", "N", "HQ", "pos_offset", "window", "G", "spb"]


@triton.jit
def _q_block(pid_m, b, h, POS, DOC, DOCSTART, KVSTART, spb, M, pos_offset, window, G,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, POS_PTR: tl.constexpr, HAS_WINDOW: tl.constexpr,
             HAS_DOC: tl.constexpr, HAS_KVS: tl.constexpr, REVERSE: tl.constexpr, ROWS: tl.constexpr):
    """Query-block setup shared by the forward and the dQ backward: the block's rows, their
    absolute positions, and the key range ``[lo, hi)`` (``lo`` rounded down to ``BLOCK_N``)
    that can be visible to it. ``qdoc``/``kvs`` are placeholders (0) without DOC/KVS.
    ``ROWS`` is a multiple of ``BLOCK_M``: the GQA-packed forward stacks ``ROWS // BLOCK_M``
    heads' copies of the same ``BLOCK_M`` queries (``rows`` repeats); otherwise ``ROWS == BLOCK_M``.
    Also returns ``p_first``/``p_last``, the block's first and last query position."""
    if REVERSE:
        pid_m = tl.cdiv(M, BLOCK_M) - 1 - pid_m
    b64 = b.to(tl.int64)
    h64 = h.to(tl.int64)
    kvh64 = (h // G).to(tl.int64)
    start_m = pid_m * BLOCK_M
    if ROWS == BLOCK_M:
        rows = start_m + tl.arange(0, BLOCK_M)
    else:
        rows = start_m + tl.arange(0, ROWS) % BLOCK_M
    row_ok = rows < M
    last = tl.minimum(start_m + BLOCK_M, M) - 1
    if POS_PTR:
        qpos = tl.load(POS + b64 * spb + rows, mask=row_ok, other=-1).to(tl.int64)
        p_first = tl.load(POS + b64 * spb + start_m).to(tl.int64)
        p_last = tl.load(POS + b64 * spb + last).to(tl.int64)
    else:
        qpos = tl.where(row_ok, pos_offset + rows.to(tl.int64), -1)
        p_first = pos_offset + start_m
        p_last = pos_offset + last
    hi = p_last + 1
    lo = p_first * 0
    qdoc = qpos * 0
    kvs = b64 * 0
    if HAS_WINDOW:
        lo = tl.maximum(p_first - window + 1, 0)
    if HAS_DOC:
        qdoc = tl.load(DOC + tl.maximum(qpos, 0))
        lo = tl.maximum(lo, tl.load(DOCSTART + p_first))
    if HAS_KVS:
        kvs = tl.load(KVSTART + b64)
        lo = tl.maximum(lo, kvs)
    lo = (lo // BLOCK_N) * BLOCK_N
    return b64, h64, kvh64, rows, row_ok, qpos, lo, hi, qdoc, kvs, p_first, p_last


@triton.jit(do_not_specialize=_NO_SPEC + ["slb", "slh", "sls"])
def _stream_fwd(
    Q, K, V, O, LSE, POS, DOC, DOCSTART, KVSTART,
    sqb, sqt, sqh, skb, skt, skh, svb, svt, svh,
    sob, sot, soh, sos, slb, slh, sls, spb,
    M, N, HQ, pos_offset, window, qk_scale,
    G, D: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    POS_PTR: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_DOC: tl.constexpr, HAS_KVS: tl.constexpr,
    NUM_SPLITS: tl.constexpr, PARTIAL: tl.constexpr, REVERSE: tl.constexpr, PREC: tl.constexpr,
    GP: tl.constexpr = 1, EDGE_MASK: tl.constexpr = False, REL: tl.constexpr = False,
):
    """One query block of one stream. ``GP == 1`` (the default): program axis 0 is the query
    head and the tile is ``BLOCK_M`` queries of it. ``GP > 1`` (GQA-packed, ``GP = pow2(G)``):
    axis 0 is the KV head and the tile stacks the same ``BLOCK_M`` queries of all ``G`` heads
    of its group (``GP * BLOCK_M`` rows; rows of padding heads ``>= G`` are neither loaded nor
    stored), so each K/V tile is loaded once per group instead of once per query head.
    ``EDGE_MASK``: apply the position mask only to key blocks that are not entirely visible
    to every query of the block (a uniform branch; see ``_interior``); with ``REL`` (the window
    stream of contiguous positions without documents or left padding) that mask is
    :func:`band`."""
    pid0 = tl.program_id(0)
    pid_m = tl.program_id(1)
    bz = tl.program_id(2)
    b = bz // NUM_SPLITS
    split = bz % NUM_SPLITS
    h = pid0
    if GP > 1:
        h = pid0 * G  # the group's first head (so h // G is the KV head)
    b64, h64, kvh64, rows, row_ok, qpos, lo, hi, qdoc, kvs, p_first, p_last = _q_block(
        pid_m, b, h, POS, DOC, DOCSTART, KVSTART, spb, M, pos_offset, window, G,
        BLOCK_M, BLOCK_N, POS_PTR, HAS_WINDOW, HAS_DOC, HAS_KVS, REVERSE, GP * BLOCK_M)
    if NUM_SPLITS > 1:
        per = tl.cdiv(tl.cdiv(hi - lo, BLOCK_N), NUM_SPLITS) * BLOCK_N
        lo = lo + split * per
        hi = tl.minimum(hi, lo + per)

    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    r64 = rows.to(tl.int64)
    if GP == 1:
        io_ok = row_ok
        q_ptrs = Q + b64 * sqb + h64 * sqh + r64[:, None] * sqt + offs_d[None, :]
    else:
        g = tl.arange(0, GP * BLOCK_M) // BLOCK_M
        hrow = kvh64 * G + g  # [GP * BLOCK_M]: the head of each packed row
        io_ok = row_ok & (g < G)
        q_ptrs = Q + b64 * sqb + hrow[:, None] * sqh + r64[:, None] * sqt + offs_d[None, :]
    q = tl.load(q_ptrs, mask=io_ok[:, None] & d_ok[None, :], other=0.0)
    k_base = K + b64 * skb + kvh64 * skh
    v_base = V + b64 * svb + kvh64 * svh
    if EDGE_MASK:
        a_full, b_full = _interior(lo, hi, p_first, p_last, window, DOCSTART, kvs,
                                   BLOCK_N, HAS_WINDOW, HAS_DOC, HAS_KVS)

    m_i = tl.full([GP * BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([GP * BLOCK_M], tl.float32)
    acc = tl.zeros([GP * BLOCK_M, BLOCK_D], tl.float32)
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N).to(tl.int64)
        c_ok = cols < hi
        kT = tl.load(k_base + cols[None, :] * skt + offs_d[:, None], mask=c_ok[None, :] & d_ok[:, None], other=0.0)
        s = tl.dot(q, kT, input_precision=PREC) * qk_scale
        if EDGE_MASK:
            if (start_n < a_full) | (start_n >= b_full):  # an edge block (uniform over the program)
                if REL:  # keys past hi lie after every row's position: d < 0
                    mask = band((pos_offset + rows - start_n)[:, None] - tl.arange(0, BLOCK_N)[None, :], window,
                                HAS_WINDOW)
                else:
                    mask = _edge_mask(start_n, hi, cols, c_ok, qpos, window, DOC, qdoc, kvs,
                                      BLOCK_N, HAS_WINDOW, HAS_DOC, HAS_KVS)
                s = tl.where(mask, s, float("-inf"))
        else:
            mask = _block_mask(cols, c_ok, qpos, window, DOC, qdoc, kvs, HAS_WINDOW, HAS_DOC, HAS_KVS)
            s = tl.where(mask, s, float("-inf"))
        v = tl.load(v_base + cols[:, None] * svt + offs_d[None, :], mask=c_ok[:, None] & d_ok[None, :], other=0.0)
        m_i, l_i, acc = softmax_step(m_i, l_i, acc, s, v, PREC)

    o, lse, has = softmax_result(m_i, l_i, acc)
    if GP == 1:
        o_ptrs = O + split.to(tl.int64) * sos + b64 * sob + h64 * soh + r64[:, None] * sot + offs_d[None, :]
        l_ptrs = LSE + split.to(tl.int64) * sls + b64 * slb + h64 * slh + r64
    else:
        o_ptrs = O + split.to(tl.int64) * sos + b64 * sob + hrow[:, None] * soh + r64[:, None] * sot + offs_d[None, :]
        l_ptrs = LSE + split.to(tl.int64) * sls + b64 * slb + hrow * slh + r64
    tl.store(o_ptrs, o.to(O.dtype.element_ty), mask=io_ok[:, None] & d_ok[None, :])
    if not PARTIAL:  # a final result: +inf marks a row with no visible key for the backward
        lse = tl.where(has, lse, float("inf"))
    tl.store(l_ptrs, lse, mask=io_ok)


@triton.jit
def _block_mask(cols, c_ok, qpos, window, DOC, qdoc, kvs,
                HAS_WINDOW: tl.constexpr, HAS_DOC: tl.constexpr, HAS_KVS: tl.constexpr):
    """``visible`` for the key block at absolute positions ``cols`` (``c_ok``: in range) against
    the rows at ``qpos``, the keys' documents loaded here (-1 out of range)."""
    kdoc = cols
    if HAS_DOC:
        kdoc = tl.load(DOC + cols, mask=c_ok, other=-1)
    return visible(cols[None, :], qpos[:, None], c_ok[None, :], window, kdoc[None, :], qdoc[:, None], kvs,
                   HAS_WINDOW, HAS_DOC, HAS_KVS)


@triton.jit
def _edge_mask(start_n, hi, cols, c_ok, qpos, window, DOC, qdoc, kvs,
               BLOCK_N: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_DOC: tl.constexpr, HAS_KVS: tl.constexpr):
    """``visible`` for the key block at ``start_n`` with positions relative to it: they fit in
    int32, and int32 compares on the tile cost fewer instructions and registers than int64."""
    kdoc = cols
    if HAS_DOC:
        kdoc = tl.load(DOC + cols, mask=c_ok, other=-1)
    krel = tl.arange(0, BLOCK_N)
    qrel = (qpos - start_n).to(tl.int32)
    k_in = krel < (hi - start_n).to(tl.int32)
    return visible(krel[None, :], qrel[:, None], k_in[None, :], window, kdoc[None, :], qdoc[:, None],
                   (kvs - start_n).to(tl.int32), HAS_WINDOW, HAS_DOC, HAS_KVS)


@triton.jit
def _interior(lo, hi, p_first, p_last, window, DOCSTART, kvs,
              BLOCK_N: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_DOC: tl.constexpr, HAS_KVS: tl.constexpr):
    """The key blocks ``[a, b)`` of ``range(lo, hi, BLOCK_N)`` that every query of a block with
    positions in ``[p_first, p_last]`` sees entirely (``lo <= a <= b``, both ``lo + k * BLOCK_N``):
    every key ``<= p_first`` (causal) and ``< hi``; ``> p_last - window``; in ``p_last``'s
    document (keys and queries then all lie in ``[doc_start(p_last), p_last]``, one document);
    ``>= kv_start``. Blocks outside ``[a, b)`` take the full mask."""
    lower = lo
    if HAS_WINDOW:
        lower = tl.maximum(lower, p_last - window + 1)
    if HAS_DOC:
        lower = tl.maximum(lower, tl.load(DOCSTART + p_last))
    if HAS_KVS:
        lower = tl.maximum(lower, kvs)
    upper = tl.minimum(hi, p_first + 1)  # exclusive end of the keys every query sees causally
    b_full = lo + tl.maximum(upper - lo, 0) // BLOCK_N * BLOCK_N
    a_full = tl.minimum(lo + tl.cdiv(lower - lo, BLOCK_N) * BLOCK_N, b_full)
    return a_full, b_full


@triton.jit
def _combine_splits(OP, LP, O, LSE, sob, sot, soh, M, HQ,
                    NUM_SPLITS: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr):
    """Merge ``NUM_SPLITS`` partial results (o_s, lse_s) of one (b, h, row) by log-sum-exp."""
    row = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b = bh // HQ
    h = bh % HQ
    offs_s = tl.arange(0, BLOCK_S)
    s_ok = offs_s < NUM_SPLITS
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    total = tl.num_programs(1).to(tl.int64) * M  # rows per split
    lse_s = tl.load(LP + offs_s.to(tl.int64) * total + bh * M + row, mask=s_ok, other=float("-inf"))
    o_s = tl.load(OP + (offs_s.to(tl.int64)[:, None] * total + bh * M + row) * D + offs_d[None, :],
                  mask=s_ok[:, None] & d_ok[None, :], other=0.0)
    o, lse = merge_splits(lse_s, o_s)
    tl.store(O + b * sob + h * soh + row * sot + offs_d, o.to(O.dtype.element_ty), mask=d_ok)
    tl.store(LSE + bh * M + row, lse)


@triton.jit(do_not_specialize=["M", "HQ"])
def _bwd_delta(O, DO, DELTA, sob, sot, soh, sdb, sdt, sdh, M, HQ,
               D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr):
    """delta[b, h, m] = sum_d dO * O (fp32)."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b = bh // HQ
    h = bh % HQ
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    msk = (rows < M)[:, None] & (offs_d < D)[None, :]
    r64 = rows.to(tl.int64)[:, None]
    o = tl.load(O + b * sob + h * soh + r64 * sot + offs_d[None, :], mask=msk, other=0.0).to(tl.float32)
    do = tl.load(DO + b * sdb + h * sdh + r64 * sdt + offs_d[None, :], mask=msk, other=0.0).to(tl.float32)
    tl.store(DELTA + bh * M + rows, tl.sum(o * do, 1), mask=rows < M)


@triton.jit
def _backward_rows(Q, DO, LSE, DELTA, b64, h2, h1, r64, rows, row_ok, rmask, offs_d,
                   sqb, sqt, sqh, sdb, sdt, sdh, HQ, M):
    """One block of query rows as both backward kernels read it: q, dO, the forward's LSE and
    delta = rowsum(dO * O). The head: ``h2`` broadcast against ``r64`` ([rows, 1]) and ``h1``
    against ``rows`` (the same scalar twice, or a GQA-packed block's per-row heads)."""
    q = tl.load(Q + b64 * sqb + h2 * sqh + r64 * sqt + offs_d[None, :], mask=rmask, other=0.0)
    do = tl.load(DO + b64 * sdb + h2 * sdh + r64 * sdt + offs_d[None, :], mask=rmask, other=0.0)
    lse = tl.load(LSE + (b64 * HQ + h1) * M + rows, mask=row_ok, other=float("inf"))
    delta = tl.load(DELTA + (b64 * HQ + h1) * M + rows, mask=row_ok, other=0.0)
    return q, do, lse, delta


@triton.jit
def _dq_block(
    h, pid_m, b, Q, K, V, DO, DQ, LSE, DELTA, POS, DOC, DOCSTART, KVSTART,
    sqb, sqt, sqh, skb, skt, skh, svb, svt, svh, sdb, sdt, sdh, sgb, sgt, sgh, spb,
    M, N, HQ, pos_offset, window, qk_scale, sm_scale,
    G, D: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    POS_PTR: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_DOC: tl.constexpr, HAS_KVS: tl.constexpr,
    REVERSE: tl.constexpr, PREC: tl.constexpr, GP: tl.constexpr, EDGE: tl.constexpr = False,
    REL: tl.constexpr = False,
):
    """dQ of one query block. ``GP == 1``: ``h`` is the query head. ``GP > 1`` (GQA-packed, as
    the packed forward): ``h`` is the group's first head and the tile stacks the block's queries
    for all ``G`` heads (each K/V tile loaded once per group). ``EDGE`` (DQ_VARIANT "edge" and
    "gqa"): only the key blocks not entirely visible to the block are masked (int32 relative
    positions), as the "edge" forward; ``REL`` (DQ_VARIANT "rel": contiguous positions without
    documents or left padding): every block masked by :func:`band` (keys past ``N`` load zeros,
    so they add nothing to dQ; rows past ``M`` have ``LSE = +inf``); else every block by
    :func:`visible`."""
    b64, h64, kvh64, rows, row_ok, qpos, lo, hi, qdoc, kvs, p_first, p_last = _q_block(
        pid_m, b, h, POS, DOC, DOCSTART, KVSTART, spb, M, pos_offset, window, G,
        BLOCK_M, BLOCK_N, POS_PTR, HAS_WINDOW, HAS_DOC, HAS_KVS, REVERSE, GP * BLOCK_M)

    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    r64 = rows.to(tl.int64)[:, None]
    if GP == 1:
        rmask = row_ok[:, None] & d_ok[None, :]
        q, do, lse, delta = _backward_rows(Q, DO, LSE, DELTA, b64, h64, h64, r64, rows, row_ok, rmask, offs_d,
                                           sqb, sqt, sqh, sdb, sdt, sdh, HQ, M)
    else:
        g = tl.arange(0, GP * BLOCK_M) // BLOCK_M
        hrow = kvh64 * G + g
        row_ok = row_ok & (g < G)
        rmask = row_ok[:, None] & d_ok[None, :]
        q, do, lse, delta = _backward_rows(Q, DO, LSE, DELTA, b64, hrow[:, None], hrow, r64, rows, row_ok, rmask,
                                           offs_d, sqb, sqt, sqh, sdb, sdt, sdh, HQ, M)
    if EDGE:  # the key blocks every query row sees entirely: unmasked in the loop
        a_full, b_full = _interior(lo, hi, p_first, p_last, window, DOCSTART, kvs,
                                   BLOCK_N, HAS_WINDOW, HAS_DOC, HAS_KVS)
    k_base = K + b64 * skb + kvh64 * skh
    v_base = V + b64 * svb + kvh64 * svh
    dq = tl.zeros([GP * BLOCK_M, BLOCK_D], tl.float32)
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N).to(tl.int64)
        c_ok = cols < hi
        kmask = c_ok[:, None] & d_ok[None, :]
        k = tl.load(k_base + cols[:, None] * skt + offs_d[None, :], mask=kmask, other=0.0)
        v = tl.load(v_base + cols[:, None] * svt + offs_d[None, :], mask=kmask, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PREC) * qk_scale
        p = tl.exp2(s - lse[:, None])  # rows without a visible key have lse = +inf: p = 0
        if EDGE:
            if (start_n < a_full) | (start_n >= b_full):  # an edge block
                mask = _edge_mask(start_n, hi, cols, c_ok, qpos, window, DOC, qdoc, kvs,
                                  BLOCK_N, HAS_WINDOW, HAS_DOC, HAS_KVS)
                p = tl.where(mask, p, 0.0)
        elif REL:
            d = (pos_offset + rows - start_n)[:, None] - tl.arange(0, BLOCK_N)[None, :]
            p = tl.where(band(d, window, HAS_WINDOW), p, 0.0)
        else:
            mask = _block_mask(cols, c_ok, qpos, window, DOC, qdoc, kvs, HAS_WINDOW, HAS_DOC, HAS_KVS)
            p = tl.where(mask, p, 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=PREC)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k, input_precision=PREC)
    dq = dq * sm_scale
    if GP == 1:
        tl.store(DQ + b64 * sgb + h64 * sgh + r64 * sgt + offs_d[None, :], dq.to(DQ.dtype.element_ty), mask=rmask)
    else:
        tl.store(DQ + b64 * sgb + hrow[:, None] * sgh + r64 * sgt + offs_d[None, :], dq.to(DQ.dtype.element_ty),
                 mask=rmask)


@triton.jit
def _ds_first(start_m, pos_offset, window, BLOCK_N: tl.constexpr):
    """The first key block whose dK/dV program visits the query block at row ``start_m`` of the
    window stream (contiguous positions from ``pos_offset``): the block of that block's first
    query's oldest key."""
    return tl.maximum(pos_offset + start_m - window + 1, 0) // BLOCK_N


@triton.jit
def _ds_tile(DS, b64, h64, start_m, kb, HQ, nqb, nslot, pos_offset, window,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Address of the dS tile of (batch, query head, query block at row ``start_m``, key block
    ``kb``) in the DQ_VARIANT "ds" buffer: ``[B, HQ, nqb, nslot, BLOCK_N, BLOCK_M]`` (a tile
    key-major, its ``BLOCK_M`` rows contiguous), the slot ``kb - _ds_first(...)``."""
    slot = kb - _ds_first(start_m, pos_offset, window, BLOCK_N)
    return DS + (((b64 * HQ + h64) * nqb + start_m // BLOCK_M) * nslot + slot) * (BLOCK_N * BLOCK_M)


@triton.jit(do_not_specialize=["M", "N", "HQ", "nqb", "nslot", "pos_offset", "window", "G"])
def _dq_from_ds(DS, K, DQ, skb, skt, skh, sgb, sgt, sgh, M, N, HQ, nqb, nslot, pos_offset, window, sm_scale,
                G, D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                GP: tl.constexpr, PREC: tl.constexpr):
    """dQ of one query block of the window stream (contiguous positions) for all ``G`` query
    heads of KV head ``program_id(0)`` (``GP * BLOCK_M`` rows, ``GP = pow2(G)``) from the dS
    tiles the dK/dV programs stored (DQ_VARIANT "ds"): ``dQ = scale * sum_kb dS[:, kb] @ K[kb]``
    over the key blocks whose dK/dV program visited the block, one dot a key block, no
    recomputed scores. Exactly those tiles were written, so none is read unwritten."""
    kvh64 = tl.program_id(0).to(tl.int64)
    qb = tl.program_id(1)
    b64 = tl.program_id(2).to(tl.int64)
    start_m = qb * BLOCK_M
    r = tl.arange(0, GP * BLOCK_M)
    g = r // BLOCK_M
    rows = start_m + r % BLOCK_M
    row_ok = (g < G) & (rows < M)
    h64 = kvh64 * G + g
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    keys = tl.arange(0, BLOCK_N)
    first = _ds_first(start_m, pos_offset, window, BLOCK_N)
    last = tl.minimum((pos_offset + start_m + BLOCK_M - 1) // BLOCK_N, tl.cdiv(N, BLOCK_N) - 1)
    ds_rows = _ds_tile(DS, b64, h64, start_m, first, HQ, nqb, nslot, pos_offset, window, BLOCK_M, BLOCK_N) \
        + r % BLOCK_M
    k_base = K + b64 * skb + kvh64 * skh
    dq = tl.zeros([GP * BLOCK_M, BLOCK_D], tl.float32)
    for kb in range(first, last + 1):
        ds = tl.load(ds_rows[:, None] + (kb - first) * (BLOCK_N * BLOCK_M) + keys[None, :] * BLOCK_M,
                     mask=(g < G)[:, None], other=0.0)  # whole tiles: rows past M hold zeros
        cols = kb * BLOCK_N + keys
        k = tl.load(k_base + cols.to(tl.int64)[:, None] * skt + offs_d[None, :],
                    mask=(cols < N)[:, None] & d_ok[None, :], other=0.0)
        dq += tl.dot(ds, k, input_precision=PREC)
    dq = dq * sm_scale
    tl.store(DQ + b64 * sgb + h64[:, None] * sgh + rows.to(tl.int64)[:, None] * sgt + offs_d[None, :],
             dq.to(DQ.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])


@triton.jit
def _dkdv_block(
    kvh, pid_n, b, Q, K, V, DO, DK, DV, LSE, DELTA, POS, QRANGE, DOC, KVSTART,
    sqb, sqt, sqh, skb, skt, skh, svb, svt, svh, sdb, sdt, sdh,
    skgb, skgt, skgh, svgb, svgt, svgh, spb, srb,
    M, N, HQ, pos_offset, window, qk_scale, sm_scale, DS, nqb, nslot,
    G, D: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    POS_PTR: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_DOC: tl.constexpr, HAS_KVS: tl.constexpr,
    PREC: tl.constexpr, EDGE: tl.constexpr = False, REL: tl.constexpr = False, DS_OUT: tl.constexpr = False,
):
    """dK/dV of one key block (``BLOCK_N`` keys of KV head ``kvh``) over the query blocks that see
    it, for each of the ``G`` query heads. ``EDGE`` (DKDV_VARIANT "edge"; the host sets it only
    for contiguous positions without documents or left padding): a query block that sees every
    key of the block (all rows and columns in range, causal and inside the window for every
    pair) skips the mask. ``REL`` (DKDV_VARIANT "rel", the same condition): every block is
    masked by :func:`band` on int32 relative positions (keys past ``N`` are never stored; rows
    past ``M`` load zeros and ``LSE = +inf``). ``DS_OUT`` (DQ_VARIANT "ds"): every dS tile the
    program computes is also stored in ``DS`` for :func:`_dq_from_ds` (layout in
    :func:`_ds_tile`)."""
    b64 = b.to(tl.int64)
    kvh64 = kvh.to(tl.int64)
    start_n = pid_n * BLOCK_N
    cols = start_n + tl.arange(0, BLOCK_N).to(tl.int64)
    c_ok = cols < N
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    kmask = c_ok[:, None] & d_ok[None, :]
    k = tl.load(K + b64 * skb + kvh64 * skh + cols[:, None] * skt + offs_d[None, :], mask=kmask, other=0.0)
    v = tl.load(V + b64 * svb + kvh64 * svh + cols[:, None] * svt + offs_d[None, :], mask=kmask, other=0.0)
    if POS_PTR:
        qlo = tl.load(QRANGE + b64 * srb + 2 * pid_n).to(tl.int32)
        qhi = tl.load(QRANGE + b64 * srb + 2 * pid_n + 1).to(tl.int32)
    else:
        qlo = tl.maximum(start_n - pos_offset, 0).to(tl.int32)
        if HAS_WINDOW:
            qhi = tl.minimum(start_n + BLOCK_N - 1 + window - pos_offset, M).to(tl.int32)
        else:
            qhi = M
    qlo = (qlo // BLOCK_M) * BLOCK_M
    kdoc = cols
    if HAS_DOC:
        kdoc = tl.load(DOC + cols, mask=c_ok, other=-2)
    kvs = b64 * 0
    if HAS_KVS:
        kvs = tl.load(KVSTART + b64)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    for g in range(G):
        h64 = kvh64 * G + g
        for start_m in range(qlo, qhi, BLOCK_M):
            rows = start_m + tl.arange(0, BLOCK_M)
            row_ok = rows < M
            r64 = rows.to(tl.int64)[:, None]
            rmask = row_ok[:, None] & d_ok[None, :]
            q, do, lse, delta = _backward_rows(Q, DO, LSE, DELTA, b64, h64, h64, r64, rows, row_ok, rmask, offs_d,
                                               sqb, sqt, sqh, sdb, sdt, sdh, HQ, M)
            if POS_PTR:
                qpos = tl.load(POS + b64 * spb + rows, mask=row_ok, other=-1).to(tl.int64)
            else:
                qpos = tl.where(row_ok, pos_offset + rows.to(tl.int64), -1)
            sT = tl.dot(k, tl.trans(q), input_precision=PREC) * qk_scale
            qdoc = qpos
            if HAS_DOC:
                qdoc = tl.load(DOC + tl.maximum(qpos, 0))
            full = False  # an interior block (EDGE): every (key, query) pair attends, no mask
            if EDGE:
                full = ((start_m + BLOCK_M <= M) & (start_n + BLOCK_N <= N)
                        & (start_n + BLOCK_N - 1 <= pos_offset + start_m))
                if HAS_WINDOW:
                    full = full & (start_n > pos_offset + start_m + BLOCK_M - 1 - window)
            if REL:
                d = (pos_offset + rows - start_n)[None, :] - tl.arange(0, BLOCK_N)[:, None]
                pT = tl.where(band(d, window, HAS_WINDOW), tl.exp2(sT - lse[None, :]), 0.0)
            elif full:
                pT = tl.exp2(sT - lse[None, :])
            else:
                mask = visible(cols[:, None], qpos[None, :], c_ok[:, None], window, kdoc[:, None], qdoc[None, :],
                               kvs, HAS_WINDOW, HAS_DOC, HAS_KVS)
                pT = tl.where(mask, tl.exp2(sT - lse[None, :]), 0.0)
            dv += tl.dot(pT.to(do.dtype), do, input_precision=PREC)
            dpT = tl.dot(v, tl.trans(do), input_precision=PREC)
            dsT = (pT * (dpT - delta[None, :])).to(q.dtype)
            dk += tl.dot(dsT, q, input_precision=PREC)
            if DS_OUT:
                tl.store(_ds_tile(DS, b64, h64, start_m, pid_n, HQ, nqb, nslot, pos_offset, window, BLOCK_M, BLOCK_N)
                         + tl.arange(0, BLOCK_N)[:, None] * BLOCK_M + tl.arange(0, BLOCK_M)[None, :], dsT)
    dk = dk * sm_scale
    tl.store(DK + b64 * skgb + kvh64 * skgh + cols[:, None] * skgt + offs_d[None, :], dk.to(DK.dtype.element_ty), mask=kmask)
    tl.store(DV + b64 * svgb + kvh64 * svgh + cols[:, None] * svgt + offs_d[None, :], dv.to(DV.dtype.element_ty), mask=kmask)


@triton.jit(do_not_specialize=_NO_SPEC + ["HKV", "B", "n_kv_progs", "srb", "nqb", "nslot"])
def _stream_bwd(
    Q, K, V, DO, DQ, DK, DV, LSE, DELTA, POS, QRANGE, DOC, DOCSTART, KVSTART, DS,
    sqb, sqt, sqh, skb, skt, skh, svb, svt, svh, sdb, sdt, sdh, sgb, sgt, sgh,
    skgb, skgt, skgh, svgb, svgt, svgh, spb, srb,
    M, N, HQ, HKV, B, n_kv_progs, pos_offset, window, qk_scale, sm_scale, nqb, nslot,
    G, D: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M2: tl.constexpr, BLOCK_N2: tl.constexpr,
    POS_PTR: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_DOC: tl.constexpr, HAS_KVS: tl.constexpr,
    REVERSE: tl.constexpr, PREC: tl.constexpr, GP2: tl.constexpr = 1, EDGE2: tl.constexpr = False,
    EDGE_KV: tl.constexpr = False, PROGS: tl.constexpr = 0, REL_KV: tl.constexpr = False,
    REL_Q: tl.constexpr = False, DS_OUT: tl.constexpr = False,
):
    """dK/dV programs (first ``n_kv_progs``; ``BLOCK_M x BLOCK_N``) and dQ programs (the rest;
    ``BLOCK_M2 x BLOCK_N2``, or ``GP2 * BLOCK_M2`` GQA-packed rows; ``EDGE2``: edge-masked) of
    one stream in a single launch; ``EDGE_KV``: the dK/dV programs skip the mask of interior
    query blocks; ``REL_KV`` / ``REL_Q``: the dK/dV / dQ programs mask by :func:`band`. ``PROGS``
    (the two-launch backward): 1 compiles only the dK/dV programs, 2
    only the dQ programs, so each launch gets the registers of its own kind (0: both, chosen by
    ``pid``; the kernel then holds the larger register count of the two). ``DS_OUT`` (with
    ``PROGS`` 1): the dK/dV programs also store their dS tiles for :func:`_dq_from_ds`."""
    pid = tl.program_id(0)
    if PROGS == 1:
        is_kv = True
    elif PROGS == 2:
        is_kv = False
    else:
        is_kv = pid < n_kv_progs
    if is_kv:
        nkb = tl.cdiv(N, BLOCK_N)
        kvh = pid % HKV
        rest = pid // HKV
        _dkdv_block(kvh, rest % nkb, rest // nkb,
                    Q, K, V, DO, DK, DV, LSE, DELTA, POS, QRANGE, DOC, KVSTART,
                    sqb, sqt, sqh, skb, skt, skh, svb, svt, svh, sdb, sdt, sdh,
                    skgb, skgt, skgh, svgb, svgt, svgh, spb, srb,
                    M, N, HQ, pos_offset, window, qk_scale, sm_scale, DS, nqb, nslot,
                    G, D, BLOCK_D, BLOCK_M, BLOCK_N, POS_PTR, HAS_WINDOW, HAS_DOC, HAS_KVS, PREC, EDGE_KV, REL_KV,
                    DS_OUT)
    else:
        pid = pid - n_kv_progs
        nm = tl.cdiv(M, BLOCK_M2)
        if GP2 == 1:
            h = pid % HQ
            rest = pid // HQ
        else:  # the KV head's first query head
            h = (pid % HKV) * G
            rest = pid // HKV
        _dq_block(h, rest % nm, rest // nm,
                  Q, K, V, DO, DQ, LSE, DELTA, POS, DOC, DOCSTART, KVSTART,
                  sqb, sqt, sqh, skb, skt, skh, svb, svt, svh, sdb, sdt, sdh, sgb, sgt, sgh, spb,
                  M, N, HQ, pos_offset, window, qk_scale, sm_scale,
                  G, D, BLOCK_D, BLOCK_M2, BLOCK_N2, POS_PTR, HAS_WINDOW, HAS_DOC, HAS_KVS, REVERSE, PREC, GP2,
                  EDGE2, REL_Q)


# ============================================================================ host

# Block configurations, keyed by (kind, BLOCK_D): (BLOCK_M, BLOCK_N, num_warps, num_stages).
# Chosen by measurement on an H200 (benchmarks/attention.py --sweep); overridable for sweeps.
CONFIGS = {
    # win_fwd at head dim 128: 64 x 32 with the "edge" variant (FWD_VARIANT), 2026-12-02 (H200,
    # benchmarks/attention.py --window-tune, commit 050c532: 1.57-1.65x Flex at 8K-1M, 1.25x the
    # old 64 x 64 "base"; docs/benchmarks.md "window stream")
    "win_fwd": {64: (64, 64, 4, 3), 128: (64, 32, 4, 3), 256: (64, 32, 4, 2)},
    "full_fwd": {64: (128, 64, 4, 3), 128: (128, 64, 8, 3), 256: (64, 32, 4, 2)},
    "bwd_dq": {64: (64, 64, 4, 2), 128: (64, 64, 4, 2), 256: (32, 32, 4, 1)},
    # bwd_dkdv at head dim 128: 32 x 64 since 2026-12-02 (H200, window_bwd_gpu.sh, fd3deb8: the
    # window fwd+bwd 6-7% faster than 64 x 64 at 32K and 128K, and under a CUDA graph at 8K; the
    # spill-free two-launch blocks were all slower; docs/performance.md kernels change 7)
    "bwd_dkdv": {64: (64, 64, 4, 2), 128: (32, 64, 4, 2), 256: (32, 32, 4, 1)},
    # GQA-packed forward ("gqa" variants below): BLOCK_M is the number of packed rows (all G
    # heads x BLOCK_M // pow2(G) queries); full_fwd_gqa and the head dims 64 / 256 not measured.
    # win_fwd_gqa at head dim 128: 128 x 32 w4 s2 (H200, 2026-12-03, 0abbc51: 1.80-1.92x Flex at
    # 32K-1M, 0.92x the edge 64 x 32 forward at 32K, 0.87x at 128K and 1M; 1.09x at 8K)
    "win_fwd_gqa": {64: (128, 64, 4, 3), 128: (128, 32, 4, 2), 256: (64, 32, 4, 2)},
    "full_fwd_gqa": {64: (128, 64, 4, 3), 128: (128, 64, 8, 3), 256: (64, 32, 4, 2)},
    # GQA-packed dQ (DQ_VARIANT "gqa"): packed rows as above. In the fused launch the dQ programs
    # run with bwd_dkdv's warps (one launch, one num_warps): FUSED_BWD = False uses these.
    "bwd_dq_gqa": {64: (128, 64, 8, 2), 128: (128, 64, 8, 2), 256: (32, 32, 4, 1)},
}
# Forward kernel variant per stream, name -> (GQA-packed, mask only the edge blocks):
#   base:       one query head per program, every visited key block masked (the full stream's);
#   edge:       one query head per program, only blocks not entirely visible are masked (the
#               window stream's since 2026-12-02: measured fastest with 64 x 32 blocks at 8K-1M);
#   gqa:        all G query heads of a KV head in one program (each K/V tile loaded once per
#               group), edge masking;
#   gqa_masked: the same packing, every block masked (separates the two effects);
#   auto:       "gqa" from WIN_FWD_PACKED_TOKENS tokens (B x T) at head dims 65-128 and groups of
#               4 or 8 query heads a KV head (measured at 4), else "edge" (the window stream's since
#               2026-12-03: gqa 128 x 32 is the faster from 32K on, edge 64 x 32 at 8K).
# benchmarks/attention.py --window-tune times them; overridable like CONFIGS.
FWD_VARIANTS = {"base": (False, False), "edge": (False, True), "gqa": (True, True), "gqa_masked": (True, False)}
FWD_VARIANT = {"win_fwd": "auto", "full_fwd": "base"}
WIN_FWD_PACKED_TOKENS = 32768
# FWD_REL: the edge blocks of a window stream of contiguous positions without documents or left
# padding masked by common.band (H200, 2026-12-03: edge 64 x 32 0.94x the time at 128K, level at
# 8K and 32K).
FWD_REL = True
# dQ programs of the backward (both streams): "base" (one query head per program, every block
# masked; measured default), "gqa" (GQA-packed rows, edge masking; bwd_dq_gqa's blocks; slower
# on the H200, 2026-12-02), "edge" (one head a program, only the blocks not entirely visible
# masked, as the "edge" forward; bwd_dq's blocks; level with "base" on the H200, 2026-12-02) or
# "rel" (every block masked by common.band on int32 relative positions: one unsigned compare an
# element instead of int64 range checks; contiguous positions without documents or left
# padding, else "base") or "ds" (no dQ programs: the dK/dV programs, in their own launch, also
# store every dS tile they compute, and :func:`_dq_from_ds` sums dS @ K over each query block's
# key blocks, one dot a block instead of three with the exp and the mask: window streams without
# positions whose query block sees at most DS_MAX_KEYS keys and whose dS buffer, B x HQ x T x that
# many elements for the backward's duration, fits in DS_MAX_BYTES; else "base"; the default).
DQ_VARIANTS = ("base", "gqa", "edge", "rel", "ds")
# "ds": the window fwd+bwd -5.2% / -6.0% / -4.4% at 8K / 32K / 128K eagerly, -8.6% / -11% under CUDA graphs
# at 32K / 128K against "base" (H200, 2026-12-03, f4107e0); "rel": -1.2% / -1.4% at 32K / 128K, within the noise
DQ_VARIANT = "ds"
DS_MAX_KEYS = 512  # "ds": the most key columns (slots x BLOCK_N) a query block's dS row may span
DS_MAX_BYTES = 1 << 32  # "ds": the largest dS buffer (4 GiB; 2x Q's bytes at w = 128), else "base"
DQ_DS_LAUNCH = (4, 3)  # "ds": num_warps, num_stages of _dq_from_ds (tuned, docs/performance.md change 17)
# "ds": shared memory the dS pass's pipeline stages may take. The H200 gives a block 227 KB; the
# pass takes ~1.5 stages more besides (fp32 at head dim 128 and 3 stages of 64 KB asked 288 KB).
DS_STAGE_BYTES = 128 << 10
# dK/dV programs: "base" (every visited query block masked by common.visible), "edge" (interior
# query blocks unmasked, for contiguous positions without documents or left padding: training's
# PT streams; other calls keep the mask; slower than "base" on the H200, 2026-12-02) or "rel" (as
# the dQ's "rel", under the same condition; the measured default, calls with positions,
# documents or left padding take "base").
DKDV_VARIANTS = ("base", "edge", "rel")
DKDV_VARIANT = "rel"  # H200, 2026-12-03 (0abbc51): fwd+bwd -3.5% at 32K, -3.0% at 128K against "base"


def check_bwd_config(overrides: dict) -> None:
    """ValueError unless ``overrides`` holds only ``"bwd_dkdv"`` / ``"bwd_dq"`` (four positive
    integers: BLOCK_M, BLOCK_N, num_warps, num_stages; the blocks powers of two >= 16),
    ``"fused"`` (a bool: :data:`FUSED_BWD`) and ``"dq_variant"`` / ``"dkdv_variant"`` (one of
    :data:`DQ_VARIANTS` / :data:`DKDV_VARIANTS`)."""
    variants = {"dq_variant": DQ_VARIANTS, "dkdv_variant": DKDV_VARIANTS}
    for k, v in overrides.items():
        if k == "fused":
            if not isinstance(v, bool):
                raise ValueError(f"backward config: fused {v!r}; give true or false")
        elif k in variants:
            if v not in variants[k]:
                raise ValueError(f"backward config: {k} {v!r}; give one of {', '.join(variants[k])}")
        elif k in ("bwd_dkdv", "bwd_dq"):
            if (not isinstance(v, (list, tuple)) or len(v) != 4
                    or any(isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in v)
                    or any(x < 16 or x & (x - 1) for x in v[:2])):
                raise ValueError(f"backward config: {k} {v!r}; give [BLOCK_M, BLOCK_N, num_warps, num_stages], "
                                 "blocks powers of two >= 16")
        else:
            raise ValueError(f"backward config: unknown key {k!r}; allowed: bwd_dkdv, bwd_dq, fused, dq_variant, "
                             "dkdv_variant")


@contextlib.contextmanager
def bwd_config(block_d: int = 128, **overrides):
    """Within the block, the backward's launch configs of head dims up to ``block_d`` (its
    :data:`CONFIGS` key) and :data:`FUSED_BWD` set from ``overrides`` (checked first by
    :func:`check_bwd_config`), and :data:`DQ_VARIANT` / :data:`DKDV_VARIANT`; what a benchmark runs
    against the defaults. Restored afterwards."""
    global FUSED_BWD, DQ_VARIANT, DKDV_VARIANT
    check_bwd_config(overrides)
    key = 64 if block_d <= 64 else (128 if block_d <= 128 else 256)
    keep = {kind: CONFIGS[kind][key] for kind in ("bwd_dkdv", "bwd_dq")}
    keep_flags = FUSED_BWD, DQ_VARIANT, DKDV_VARIANT
    try:
        for kind in ("bwd_dkdv", "bwd_dq"):
            if kind in overrides:
                CONFIGS[kind][key] = tuple(overrides[kind])
        FUSED_BWD = overrides.get("fused", FUSED_BWD)
        DQ_VARIANT = overrides.get("dq_variant", DQ_VARIANT)
        DKDV_VARIANT = overrides.get("dkdv_variant", DKDV_VARIANT)
        yield
    finally:
        for kind, cfg in keep.items():
            CONFIGS[kind][key] = cfg
        FUSED_BWD, DQ_VARIANT, DKDV_VARIANT = keep_flags


# Use SDPA (cuDNN first) for the all-positions full stream of fp16/bf16 inputs.
USE_SDPA_CAUSAL = os.environ.get("ORTHROS_NO_SDPA", "0") != "1"
# dQ and dK/dV programs of a stream's backward in one launch (fewer launches: less host overhead).
FUSED_BWD = os.environ.get("ORTHROS_FUSED_BWD", "1") == "1"


def _cfg(kind: str, block_d: int):
    table = CONFIGS[kind]
    key = 64 if block_d <= 64 else (128 if block_d <= 128 else 256)
    bm, bn, nw, ns = table[key]
    if interpreting():
        return bm, bn, 1, 1
    return bm, bn, nw, ns


def _ds_launch(rows: int, bn: int, bd: int, esize: int):
    """(num_warps, num_stages) of :func:`_dq_from_ds`: :data:`DQ_DS_LAUNCH`, its stages cut to
    what fits :data:`DS_STAGE_BYTES` (a stage holds a ``rows x bn`` dS tile and a ``bn x bd`` K
    tile of ``esize``-byte elements: at head dim 128 fp32 takes 64 KB a stage, so 2 stages, bf16
    32 KB, so 3), at least one."""
    nw, ns = DQ_DS_LAUNCH
    per_stage = (rows * bn + bn * bd) * esize
    return nw, max(1, min(ns, DS_STAGE_BYTES // per_stage))


def _fwd_variant(kind: str, tokens: int, block_d: int, group: int):
    """(packed, edge) of the forward variant selected for ``kind`` in ``FWD_VARIANT`` ("auto":
    by the call's ``tokens`` = B x T, its head dim's ``block_d`` and its query heads a KV head)."""
    name = FWD_VARIANT[kind]
    if name == "auto":
        name = "gqa" if tokens >= WIN_FWD_PACKED_TOKENS and 64 < block_d <= 128 and group in (4, 8) else "edge"
    if name not in FWD_VARIANTS:
        raise ValueError(f"FWD_VARIANT[{kind!r}] must be one of {sorted(FWD_VARIANTS) + ['auto']}, got {name!r}")
    return FWD_VARIANTS[name]


# Launch plans (docs/performance.md kernels change 18). A dense stream's forward and backward (no
# positions, documents or left padding: the window stream of training and prefill) spend more host
# time choosing and binding their launches than launching them (~20 us a launch for the key of
# common.launch alone, ~20-40 us of choices a call, on a CPU where an 8K window fwd+bwd's host
# path is ~0.25 ms). The first call of a signature records its launches (_Plan); later calls with
# the same key (_plan_key) allocate their outputs and replay them. ORTHROS_PLANS=0: no plans.
PLANS = os.environ.get("ORTHROS_PLANS", "1") == "1"
_PLANS = {}
_PLANS_MAX = 256  # signatures kept; the memo starts over when full


def _settings(kind: str, bd: int) -> tuple:
    """The module settings the launch choices of a stream's ``kind`` ("fwd" / "bwd") read at head
    dim block ``bd`` (tests and benchmarks change them at run time: a plan must not outlive them)."""
    ck = 64 if bd <= 64 else (128 if bd <= 128 else 256)
    if kind == "fwd":
        return (CONFIGS["win_fwd"][ck], CONFIGS["win_fwd_gqa"][ck], CONFIGS["full_fwd"][ck],
                CONFIGS["full_fwd_gqa"][ck], FWD_VARIANT["win_fwd"], FWD_VARIANT["full_fwd"],
                WIN_FWD_PACKED_TOKENS, FWD_REL, _common.FAST_LAUNCH)
    return (CONFIGS["bwd_dkdv"][ck], CONFIGS["bwd_dq"][ck], CONFIGS["bwd_dq_gqa"][ck], DQ_VARIANT,
            DKDV_VARIANT, FUSED_BWD, DS_MAX_KEYS, DS_MAX_BYTES, DQ_DS_LAUNCH, DS_STAGE_BYTES, _common.FAST_LAUNCH)


def _plan_key(kind: str, q, k, v, *more, scalars=()):
    """The memo key of a dense stream call (None with ``PLANS`` off): the shapes of ``q`` and
    ``k``, the strides of every tensor given, the dtypes of ``q`` and of the backward's ``do``,
    each tensor's 16-byte alignment (what the launches' arguments and Triton's specialisation
    follow), the device, the call's ``scalars`` and the :func:`_settings` of ``kind``. What it
    leaves out is fixed by the rest: ``v`` has ``k``'s shape and ``q``'s dtype (the op checks), and
    the backward's ``more`` = (do, o): ``o`` is the forward's own output (fresh: contiguous and
    aligned, ``q``'s dtype), ``do`` has its shape; the backward's ``lse`` is the forward's too."""
    if not PLANS:
        return None
    ts = (q, k, v, *more)
    return (kind, q.device, q.dtype, more[0].dtype if more else None, q.shape, k.shape, *scalars,
            *[t.stride() for t in ts], *[t.data_ptr() & 15 for t in ts], _settings(kind, q.shape[-1]))


def _remember(key, plan) -> None:
    if len(_PLANS) >= _PLANS_MAX:
        _PLANS.clear()
    _PLANS[key] = plan


class _Plan:
    """The launches of one call, recorded for replay. Each launch names the call's tensors it
    takes (``names``, in order, looked up in ``tensors``) and is launched at once; with ``record``
    each is also bound (:func:`common.bind`) so that :meth:`replay` launches it again with another
    call's tensors of the same names. A plan keeps no tensor of the call that recorded it."""

    def __init__(self, record: bool):
        self.runs = [] if record else None

    def launch(self, tensors: dict, kernel, grid, names, *scalars, **consts):
        args = [tensors[n] for n in names]
        compiled = launch(kernel, grid, *args, *scalars, **consts)
        if self.runs is not None:
            self.runs.append((bind(compiled, kernel, grid, *args, *scalars, **consts), names))

    def replay(self, tensors: dict) -> None:
        for run, names in self.runs:
            run(*[tensors[n] for n in names])


class _Masks:
    """Per-call mask data shared by both streams (documents, left padding)."""

    def __init__(self, doc_ids, kv_start, N, device):
        self.doc = None
        self.doc_start = None
        self.doc_end = None
        if doc_ids is not None:
            doc = doc_ids.to(device=device, dtype=torch.int64).contiguous()
            counts = torch.zeros(int(N) + 1, dtype=torch.int64, device=device)  # doc ids are < N
            counts.scatter_add_(0, doc, torch.ones_like(doc))
            cu = torch.cumsum(counts, 0)
            starts = torch.cat([cu.new_zeros(1), cu[:-1]])
            self.doc = doc
            self.doc_start = starts[doc].contiguous()
            self.doc_end = cu[doc].contiguous()
        self.kv_start = None if kv_start is None else kv_start.to(device=device, dtype=torch.int64).contiguous()


def _stream_forward(q, k, v, pos, pos_offset, window, scale, masks: _Masks, allow_split=True):
    """Returns (o, lse) for one stream. q [B, M, Hq, D]; pos [Bp, M] int64 or None."""
    B, M, HQ, D = q.shape
    N, HKV = k.shape[1], k.shape[2]
    dev = q.device
    dense = M > 0 and pos is None and masks.doc is None and masks.kv_start is None
    key = _plan_key("fwd", q, k, v, scalars=(pos_offset, window, scale, allow_split)) if dense else None
    plan = None if key is None else _PLANS.get(key)
    if plan is not None:
        return plan(q, k, v)
    Dv = v.shape[-1]
    if M == 0:
        return torch.empty(B, 0, HQ, Dv, dtype=q.dtype, device=dev), torch.empty(B, HQ, 0, dtype=torch.float32,
                                                                             device=dev)
    BD = block_d(D)
    kind = "win_fwd" if window else "full_fwd"
    G = HQ // HKV
    packed, edge = _fwd_variant(kind, B * M, BD, G)
    if packed:
        GP = pow2(G)
        rows, BN, nw, ns = _cfg(kind + "_gqa", BD)
        BM = max(1, rows // GP)  # queries per head in a program (G > rows: one query, GP rows)
        heads = HKV  # program axis 0: the KV head
    else:
        GP = 1
        BM, BN, nw, ns = _cfg(kind, BD)
        heads = HQ
    nm = cdiv(M, BM)
    splits = 1
    if allow_split and not window and not interpreting():
        progs = nm * heads * B
        sms = num_sms(dev)
        if progs < sms and N >= 4096:
            splits = max(1, min(cdiv(2 * sms, progs), N // 2048, 64))
    dd = dummy(dev)
    spb = 0 if pos is None or pos.shape[0] == 1 else pos.stride(0)
    common = dict(
        G=G, D=D, BLOCK_D=BD, BLOCK_M=BM, BLOCK_N=BN,
        POS_PTR=pos is not None, HAS_WINDOW=bool(window), HAS_DOC=masks.doc is not None,
        HAS_KVS=masks.kv_start is not None, NUM_SPLITS=splits, PARTIAL=splits > 1, REVERSE=not window,
        PREC=precision(q.dtype), GP=GP, EDGE_MASK=edge, num_warps=nw, num_stages=ns,
        REL=FWD_REL and edge and bool(window) and dense,
    )
    # the call's mask tensors (all the placeholder when dense: what a plan replays with)
    fixed = dict(pos=dd if pos is None else pos, doc=dd if masks.doc is None else masks.doc,
                 dst=dd if masks.doc_start is None else masks.doc_start,
                 kvs=dd if masks.kv_start is None else masks.kv_start)

    dt = q.dtype

    def alloc():  # the call's outputs and scratch: the first call's and every replay's
        t = dict(o=torch.empty(B, M, HQ, Dv, dtype=dt, device=dev),
                 lse=torch.empty(B, HQ, M, dtype=torch.float32, device=dev))
        if splits > 1:
            t["op"] = torch.empty(splits, B, HQ, M, D, dtype=torch.float32, device=dev)
            t["lp"] = torch.empty(splits, B, HQ, M, dtype=torch.float32, device=dev)
        return t

    t = dict(alloc(), q=q, k=k, v=v, **fixed)
    o = t["o"]
    qs, ks, vs, os_ = q.stride(), k.stride(), v.stride(), o.stride()
    qk = scale * LOG2E
    rec = _Plan(record=key is not None)
    if splits == 1:
        rec.launch(t, _stream_fwd, (heads, nm, B), ("q", "k", "v", "o", "lse", "pos", "doc", "dst", "kvs"),
                   qs[0], qs[1], qs[2], ks[0], ks[1], ks[2], vs[0], vs[1], vs[2],
                   os_[0], os_[1], os_[2], 0, HQ * M, M, 0, spb,
                   M, N, HQ, pos_offset, window, qk, **common)
    else:
        rec.launch(t, _stream_fwd, (heads, nm, B * splits), ("q", "k", "v", "op", "lp", "pos", "doc", "dst", "kvs"),
                   qs[0], qs[1], qs[2], ks[0], ks[1], ks[2], vs[0], vs[1], vs[2],
                   HQ * M * D, D, M * D, B * HQ * M * D, HQ * M, M, B * HQ * M, spb,
                   M, N, HQ, pos_offset, window, qk, **common)
        rec.launch(t, _combine_splits, (M, B * HQ), ("op", "lp", "o", "lse"), os_[0], os_[1], os_[2],
                   M, HQ, NUM_SPLITS=splits, D=D, BLOCK_D=BD, BLOCK_S=max(2, pow2(splits)))
    if key is not None:
        def plan(q, k, v):
            t = dict(alloc(), q=q, k=k, v=v, **fixed)
            rec.replay(t)
            return t["o"], t["lse"]
        _remember(key, plan)
    return o, t["lse"]


def _query_ranges(pos, N, BN, masks: _Masks):
    """For each key block [kb*BN, ...) the range of output queries that can see it (pos is increasing)."""
    starts = torch.arange(0, N, BN, device=pos.device, dtype=torch.int64)
    p = pos.contiguous()
    Bp = p.shape[0]
    qlo = torch.searchsorted(p, starts.view(1, -1).expand(Bp, -1).contiguous(), right=False)
    if masks.doc_end is not None:
        ends = masks.doc_end[(starts + BN).clamp(max=N) - 1]
        qhi = torch.searchsorted(p, ends.view(1, -1).expand(Bp, -1).contiguous(), right=False)
    else:
        qhi = torch.full_like(qlo, p.shape[1])
    return torch.stack([qlo, qhi], dim=-1).contiguous()  # [Bp, nkb, 2]


def _stream_backward(do, q, k, v, o, lse, pos, pos_offset, window, scale, masks: _Masks):
    B, M, HQ, D = q.shape
    N, HKV = k.shape[1], k.shape[2]
    dev = q.device
    if M == 0:
        return torch.empty_like(q), torch.zeros_like(k), torch.zeros_like(v)
    if do.stride(-1) != 1:
        do = do.contiguous()
    dense = pos is None and masks.doc is None and masks.kv_start is None
    key = _plan_key("bwd", q, k, v, do, o, scalars=(pos_offset, window, scale)) if dense else None
    plan = None if key is None else _PLANS.get(key)
    if plan is not None:
        return plan(do, q, k, v, o, lse)
    if DQ_VARIANT not in DQ_VARIANTS:
        raise ValueError(f"DQ_VARIANT must be one of {DQ_VARIANTS}, got {DQ_VARIANT!r}")
    if DKDV_VARIANT not in DKDV_VARIANTS:
        raise ValueError(f"DKDV_VARIANT must be one of {DKDV_VARIANTS}, got {DKDV_VARIANT!r}")
    BD = block_d(D)
    G = HQ // HKV
    dd = dummy(dev)
    spb = 0 if pos is None or pos.shape[0] == 1 else pos.stride(0)
    qk = scale * LOG2E
    if DQ_VARIANT == "gqa":
        GP2 = pow2(G)
        rows2, BN2, nw2, ns2 = _cfg("bwd_dq_gqa", BD)
        BM2 = max(1, rows2 // GP2)  # queries per head in a dQ program
    else:
        GP2 = 1
        BM2, BN2, nw2, ns2 = _cfg("bwd_dq", BD)
    edge2 = DQ_VARIANT in ("edge", "gqa")  # the packed dQ is always edge-masked
    edge_kv = DKDV_VARIANT == "edge" and dense
    rel = (DKDV_VARIANT == "rel" and dense, DQ_VARIANT == "rel" and dense)
    BM, BN, nw, ns = _cfg("bwd_dkdv", BD)
    if pos is not None:
        qr = _query_ranges(pos, N, BN, masks)
        srb = 0 if qr.shape[0] == 1 else qr.stride(0)
    else:
        qr, srb = dd, 0
    n_kv = HKV * cdiv(N, BN) * B
    n_q = (HQ if GP2 == 1 else HKV) * cdiv(M, BM2) * B
    nslot = (BM + window - 2) // BN + 2  # the most key blocks whose dK/dV programs visit one query block
    nqb = cdiv(M, BM)
    use_ds = (DQ_VARIANT == "ds" and pos is None and window > 0 and nslot * BN <= DS_MAX_KEYS
              and B * HQ * nqb * nslot * BN * BM * q.element_size() <= DS_MAX_BYTES)
    nqb, nslot = (nqb, nslot) if use_ds else (0, 0)
    ds_numel = B * HQ * nqb * nslot * BN * BM
    # the call's mask tensors (all the placeholder when dense: what a plan replays with)
    fixed = dict(pos=dd if pos is None else pos, qr=qr, doc=dd if masks.doc is None else masks.doc,
                 dst=dd if masks.doc_start is None else masks.doc_start,
                 kvs=dd if masks.kv_start is None else masks.kv_start)

    def alloc(q, k, v):  # the gradients and scratch: the first call's and every replay's
        return dict(dq=torch.empty_like(q), dk=torch.empty_like(k), dv=torch.empty_like(v),
                    delta=torch.empty(B, HQ, M, dtype=torch.float32, device=dev),
                    ds=torch.empty(ds_numel, dtype=q.dtype, device=dev) if use_ds else dd)

    t = dict(alloc(q, k, v), q=q, k=k, v=v, o=o, lse=lse, do=do, **fixed)
    os_, ds = o.stride(), do.stride()
    qs, ks, vs = q.stride(), k.stride(), v.stride()
    gqs, gks, gvs = t["dq"].stride(), t["dk"].stride(), t["dv"].stride()
    rec = _Plan(record=key is not None)
    rec.launch(t, _bwd_delta, (cdiv(M, 64), B * HQ), ("o", "do", "delta"), os_[0], os_[1], os_[2],
               ds[0], ds[1], ds[2], M, HQ, D=D, BLOCK_D=BD, BLOCK_M=64)
    names = ("q", "k", "v", "do", "dq", "dk", "dv", "lse", "delta", "pos", "qr", "doc", "dst", "kvs", "ds")
    args = (qs[0], qs[1], qs[2], ks[0], ks[1], ks[2], vs[0], vs[1], vs[2], ds[0], ds[1], ds[2],
            gqs[0], gqs[1], gqs[2], gks[0], gks[1], gks[2], gvs[0], gvs[1], gvs[2], spb, srb,
            M, N, HQ, HKV, B)
    flags = (pos is not None, bool(window), masks.doc is not None, masks.kv_start is not None, precision(q.dtype))
    shape = (G, D, BD, BM, BN, BM2, BN2, GP2, edge2, edge_kv, rel, flags)
    tail = (pos_offset, window, qk, scale, nqb, nslot)
    if use_ds:  # the dK/dV programs store dS, then one pass sums dS @ K
        rec.launch(t, _stream_bwd, (n_kv,), names, *args, n_kv, *tail, PROGS=1, DS_OUT=True,
                   **_bwd_consts(*shape, nw, ns))
        nw_ds, ns_ds = (1, 1) if interpreting() else _ds_launch(pow2(G) * BM, BN, BD, q.element_size())
        rec.launch(t, _dq_from_ds, (HKV, nqb, B), ("ds", "k", "dq"), ks[0], ks[1], ks[2], gqs[0], gqs[1], gqs[2],
                   M, N, HQ, nqb, nslot, pos_offset, window, scale, G=G, D=D, BLOCK_D=BD, BLOCK_M=BM, BLOCK_N=BN,
                   GP=pow2(G), PREC=flags[-1], num_warps=nw_ds, num_stages=ns_ds)
    elif FUSED_BWD:  # one launch: dK/dV programs first, then dQ programs
        rec.launch(t, _stream_bwd, (n_kv + n_q,), names, *args, n_kv, *tail, **_bwd_consts(*shape, nw, ns))
    else:  # each launch compiled with its own kind of program only (PROGS)
        rec.launch(t, _stream_bwd, (n_kv,), names, *args, n_kv, *tail, PROGS=1, **_bwd_consts(*shape, nw, ns))
        rec.launch(t, _stream_bwd, (n_q,), names, *args, 0, *tail, PROGS=2, **_bwd_consts(*shape, nw2, ns2))
    if key is not None:
        def plan(do, q, k, v, o, lse):
            t = dict(alloc(q, k, v), q=q, k=k, v=v, o=o, lse=lse, do=do, **fixed)
            rec.replay(t)
            return t["dq"], t["dk"], t["dv"]
        _remember(key, plan)
    return t["dq"], t["dk"], t["dv"]


@functools.lru_cache(maxsize=256)
def _bwd_consts(G, D, BD, BM, BN, BM2, BN2, GP2, EDGE2, EDGE_KV, REL, flags, nw, ns):
    """The constexpr/launch keywords of a backward launch (``REL``: (dK/dV, dQ) masked by band);
    one dict a combination, shared: callers only unpack it."""
    pos_ptr, has_window, has_doc, has_kvs, prec = flags
    return dict(G=G, D=D, BLOCK_D=BD, BLOCK_M=BM, BLOCK_N=BN, BLOCK_M2=BM2, BLOCK_N2=BN2, GP2=GP2, EDGE2=EDGE2,
                EDGE_KV=EDGE_KV, REL_KV=REL[0], REL_Q=REL[1], POS_PTR=pos_ptr, HAS_WINDOW=has_window,
                HAS_DOC=has_doc, HAS_KVS=has_kvs, REVERSE=not has_window, PREC=prec, num_warps=nw, num_stages=ns)


class _StreamAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, pos, pos_offset, window, scale, masks):
        o, lse = _stream_forward(q, k, v, pos, pos_offset, window, scale, masks)
        ctx.save_for_backward(q, k, v, o, lse, pos)
        ctx.cfg = (pos_offset, window, scale, masks)
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse, pos = ctx.saved_tensors
        dq, dk, dv = _stream_backward(do, q, k, v, o, lse, pos, *ctx.cfg)
        return dq, dk, dv, None, None, None, None, None


def _run_stream(q, k, v, pos, pos_offset, window, scale, masks):
    needs_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    if needs_grad:
        return _StreamAttention.apply(q, k, v, pos, pos_offset, window, scale, masks)
    return _stream_forward(q, k, v, pos, pos_offset, window, scale, masks)[0]


def _sdpa_causal(q_out, k, v, scale):
    """Full causal attention through SDPA on [B, T, H, D] views (Lq == Lk, so is_causal is exact)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F

    qt, kt, vt = q_out.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    G = q_out.shape[2] // k.shape[2]
    order = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]
    try:
        ctx = sdpa_kernel(order, set_priority=True)
    except TypeError:  # older torch: no priority order
        ctx = sdpa_kernel(order)
    with ctx:
        o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, scale=scale, enable_gqa=G > 1)
    return o.transpose(1, 2)


def orthros_attention_triton(q, k, v, q_out, *, window_size, output_positions, scale, doc_ids=None, kv_start=None):
    """Triton implementation of :func:`orthros.ops.orthros_attention` (arguments already normalised)."""
    if not triton_runs(q, k):
        reference_instead("orthros_attention", q, k)
        from ..reference import orthros_attention_reference

        return orthros_attention_reference(q, k, v, q_out, window_size=window_size, output_positions=output_positions,
                                           scale=scale, doc_ids=doc_ids, kv_start=kv_start)
    q, k, v, q_out = (last_contig(t) for t in (q, k, v, q_out))
    B, T, HQ, D = q.shape
    N = k.shape[1]
    T_out = q_out.shape[1]
    masks = _Masks(doc_ids, kv_start, N, q.device)
    w = min(int(window_size), N)
    o = _run_stream(q, k, v, None, N - T, w, scale, masks) if T else q.new_empty(B, 0, HQ, v.shape[-1])
    if T_out == 0:
        o_out = q_out.new_empty(B, 0, HQ, v.shape[-1])
    elif (USE_SDPA_CAUSAL and T_out == N and doc_ids is None and kv_start is None and q.is_cuda
          and q.dtype in (torch.float16, torch.bfloat16) and D <= 256 and D % 8 == 0):
        # Strictly increasing positions in [0, N) with T_out == N are exactly 0..N-1.
        o_out = _sdpa_causal(q_out, k, v, scale)
    else:
        pos = output_positions.to(device=q.device, dtype=torch.int64).contiguous()
        o_out = _run_stream(q_out, k, v, pos, 0, 0, scale, masks)
    return o, o_out

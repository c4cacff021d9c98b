"""Triton kernels of one attention *stream* (forward, backward) and the decode step.

A stream is a set of queries with increasing absolute positions ``qpos`` (either
``pos_offset + row`` -- the base stream -- or read from a position tensor -- the output
stream) attending to keys ``lo(q) .. qpos`` where ``lo`` is ``qpos - window + 1`` for the
window stream and ``0`` for the full stream, further restricted to the query's document
(``DOC``/``DOCSTART``) and to keys ``>= kv_start[b]`` (left padding). Every program visits
only the key blocks that can be visible to its query block (the band near the diagonal for
the window stream), so no ``T x T`` mask exists anywhere. All row offsets are 64-bit.

Scores are kept in the log2 domain (``qk * scale * log2(e)``); ``LSE`` is stored in that
domain too, and ``+inf`` for a row with no visible key (its output is 0 and its gradient
contributions vanish).
"""

import triton
import triton.language as tl

# Integer arguments Triton would otherwise specialise on (== 1, divisible by 16): lengths,
# positions, window, head counts, position-tensor strides. They feed masks, loop bounds and
# scalar loads, not vectorised addresses, so specialising buys nothing but one compiled
# kernel per combination (new sequence lengths would recompile).
_NO_SPEC = ["M", "N", "HQ", "pos_offset", "window", "G", "spb"]


@triton.jit
def _q_block(pid_m, b, h, POS, DOC, DOCSTART, KVSTART, spb, M, pos_offset, window, G,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, POS_PTR: tl.constexpr, HAS_WINDOW: tl.constexpr,
             HAS_DOC: tl.constexpr, HAS_KVS: tl.constexpr, REVERSE: tl.constexpr):
    """Query-block setup shared by the forward and the dQ backward: the block's rows, their
    absolute positions, and the key range ``[lo, hi)`` (``lo`` rounded down to ``BLOCK_N``)
    that can be visible to it. ``qdoc``/``kvs`` are placeholders (0) without DOC/KVS."""
    if REVERSE:
        pid_m = tl.cdiv(M, BLOCK_M) - 1 - pid_m
    b64 = b.to(tl.int64)
    h64 = h.to(tl.int64)
    kvh64 = (h // G).to(tl.int64)
    start_m = pid_m * BLOCK_M
    rows = start_m + tl.arange(0, BLOCK_M)
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
    return b64, h64, kvh64, rows, row_ok, qpos, lo, hi, qdoc, kvs


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
):
    h = tl.program_id(0)
    pid_m = tl.program_id(1)
    bz = tl.program_id(2)
    b = bz // NUM_SPLITS
    split = bz % NUM_SPLITS
    b64, h64, kvh64, rows, row_ok, qpos, lo, hi, qdoc, kvs = _q_block(
        pid_m, b, h, POS, DOC, DOCSTART, KVSTART, spb, M, pos_offset, window, G,
        BLOCK_M, BLOCK_N, POS_PTR, HAS_WINDOW, HAS_DOC, HAS_KVS, REVERSE)
    if NUM_SPLITS > 1:
        per = tl.cdiv(tl.cdiv(hi - lo, BLOCK_N), NUM_SPLITS) * BLOCK_N
        lo = lo + split * per
        hi = tl.minimum(hi, lo + per)

    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    q_ptrs = Q + b64 * sqb + h64 * sqh + rows.to(tl.int64)[:, None] * sqt + offs_d[None, :]
    q = tl.load(q_ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    k_base = K + b64 * skb + kvh64 * skh
    v_base = V + b64 * svb + kvh64 * svh

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N).to(tl.int64)
        c_ok = cols < hi
        kT = tl.load(k_base + cols[None, :] * skt + offs_d[:, None], mask=c_ok[None, :] & d_ok[:, None], other=0.0)
        s = tl.dot(q, kT, input_precision=PREC) * qk_scale
        mask = (cols[None, :] <= qpos[:, None]) & c_ok[None, :]
        if HAS_WINDOW:
            mask = mask & (cols[None, :] > qpos[:, None] - window)
        if HAS_DOC:
            kdoc = tl.load(DOC + cols, mask=c_ok, other=-1)
            mask = mask & (kdoc[None, :] == qdoc[:, None])
        if HAS_KVS:
            mask = mask & (cols[None, :] >= kvs)
        s = tl.where(mask, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + cols[:, None] * svt + offs_d[None, :], mask=c_ok[:, None] & d_ok[None, :], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
        m_i = m_new

    has = l_i > 0
    o = acc / tl.where(has, l_i, 1.0)[:, None]
    o_ptrs = O + split.to(tl.int64) * sos + b64 * sob + h64 * soh + rows.to(tl.int64)[:, None] * sot + offs_d[None, :]
    tl.store(o_ptrs, o.to(O.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
    if PARTIAL:
        lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))
    else:
        lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("inf"))
    tl.store(LSE + split.to(tl.int64) * sls + b64 * slb + h64 * slh + rows, lse, mask=row_ok)


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
    mx = tl.max(lse_s, 0)
    mx_safe = tl.where(mx == float("-inf"), 0.0, mx)
    wts = tl.exp2(lse_s - mx_safe)
    den = tl.sum(wts, 0)
    o_s = tl.load(OP + (offs_s.to(tl.int64)[:, None] * total + bh * M + row) * D + offs_d[None, :],
                  mask=s_ok[:, None] & d_ok[None, :], other=0.0)
    o = tl.sum(o_s * wts[:, None], 0) / tl.where(den > 0, den, 1.0)
    tl.store(O + b * sob + h * soh + row * sot + offs_d, o.to(O.dtype.element_ty), mask=d_ok)
    lse = tl.where(den > 0, mx_safe + tl.log2(tl.where(den > 0, den, 1.0)), float("inf"))
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
def _dq_block(
    h, pid_m, b, Q, K, V, DO, DQ, LSE, DELTA, POS, DOC, DOCSTART, KVSTART,
    sqb, sqt, sqh, skb, skt, skh, svb, svt, svh, sdb, sdt, sdh, sgb, sgt, sgh, spb,
    M, N, HQ, pos_offset, window, qk_scale, sm_scale,
    G, D: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    POS_PTR: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_DOC: tl.constexpr, HAS_KVS: tl.constexpr,
    REVERSE: tl.constexpr, PREC: tl.constexpr,
):
    b64, h64, kvh64, rows, row_ok, qpos, lo, hi, qdoc, kvs = _q_block(
        pid_m, b, h, POS, DOC, DOCSTART, KVSTART, spb, M, pos_offset, window, G,
        BLOCK_M, BLOCK_N, POS_PTR, HAS_WINDOW, HAS_DOC, HAS_KVS, REVERSE)

    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    r64 = rows.to(tl.int64)[:, None]
    rmask = row_ok[:, None] & d_ok[None, :]
    q = tl.load(Q + b64 * sqb + h64 * sqh + r64 * sqt + offs_d[None, :], mask=rmask, other=0.0)
    do = tl.load(DO + b64 * sdb + h64 * sdh + r64 * sdt + offs_d[None, :], mask=rmask, other=0.0)
    lse = tl.load(LSE + (b64 * HQ + h64) * M + rows, mask=row_ok, other=float("inf"))
    delta = tl.load(DELTA + (b64 * HQ + h64) * M + rows, mask=row_ok, other=0.0)
    k_base = K + b64 * skb + kvh64 * skh
    v_base = V + b64 * svb + kvh64 * svh
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N).to(tl.int64)
        c_ok = cols < hi
        kmask = c_ok[:, None] & d_ok[None, :]
        k = tl.load(k_base + cols[:, None] * skt + offs_d[None, :], mask=kmask, other=0.0)
        v = tl.load(v_base + cols[:, None] * svt + offs_d[None, :], mask=kmask, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PREC) * qk_scale
        mask = (cols[None, :] <= qpos[:, None]) & c_ok[None, :]
        if HAS_WINDOW:
            mask = mask & (cols[None, :] > qpos[:, None] - window)
        if HAS_DOC:
            kdoc = tl.load(DOC + cols, mask=c_ok, other=-1)
            mask = mask & (kdoc[None, :] == qdoc[:, None])
        if HAS_KVS:
            mask = mask & (cols[None, :] >= kvs)
        p = tl.where(mask, tl.exp2(s - lse[:, None]), 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=PREC)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k, input_precision=PREC)
    dq = dq * sm_scale
    tl.store(DQ + b64 * sgb + h64 * sgh + r64 * sgt + offs_d[None, :], dq.to(DQ.dtype.element_ty), mask=rmask)


@triton.jit
def _dkdv_block(
    kvh, pid_n, b, Q, K, V, DO, DK, DV, LSE, DELTA, POS, QRANGE, DOC, KVSTART,
    sqb, sqt, sqh, skb, skt, skh, svb, svt, svh, sdb, sdt, sdh,
    skgb, skgt, skgh, svgb, svgt, svgh, spb, srb,
    M, N, HQ, pos_offset, window, qk_scale, sm_scale,
    G, D: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    POS_PTR: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_DOC: tl.constexpr, HAS_KVS: tl.constexpr,
    PREC: tl.constexpr,
):
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
    if HAS_DOC:
        kdoc = tl.load(DOC + cols, mask=c_ok, other=-2)
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
            q = tl.load(Q + b64 * sqb + h64 * sqh + r64 * sqt + offs_d[None, :], mask=rmask, other=0.0)
            do = tl.load(DO + b64 * sdb + h64 * sdh + r64 * sdt + offs_d[None, :], mask=rmask, other=0.0)
            lse = tl.load(LSE + (b64 * HQ + h64) * M + rows, mask=row_ok, other=float("inf"))
            delta = tl.load(DELTA + (b64 * HQ + h64) * M + rows, mask=row_ok, other=0.0)
            if POS_PTR:
                qpos = tl.load(POS + b64 * spb + rows, mask=row_ok, other=-1).to(tl.int64)
            else:
                qpos = tl.where(row_ok, pos_offset + rows.to(tl.int64), -1)
            sT = tl.dot(k, tl.trans(q), input_precision=PREC) * qk_scale
            mask = (cols[:, None] <= qpos[None, :]) & c_ok[:, None]
            if HAS_WINDOW:
                mask = mask & (cols[:, None] > qpos[None, :] - window)
            if HAS_DOC:
                qdoc = tl.load(DOC + tl.maximum(qpos, 0))
                mask = mask & (kdoc[:, None] == qdoc[None, :])
            if HAS_KVS:
                mask = mask & (cols[:, None] >= kvs)
            pT = tl.where(mask, tl.exp2(sT - lse[None, :]), 0.0)
            dv += tl.dot(pT.to(do.dtype), do, input_precision=PREC)
            dpT = tl.dot(v, tl.trans(do), input_precision=PREC)
            dsT = pT * (dpT - delta[None, :])
            dk += tl.dot(dsT.to(q.dtype), q, input_precision=PREC)
    dk = dk * sm_scale
    tl.store(DK + b64 * skgb + kvh64 * skgh + cols[:, None] * skgt + offs_d[None, :], dk.to(DK.dtype.element_ty), mask=kmask)
    tl.store(DV + b64 * svgb + kvh64 * svgh + cols[:, None] * svgt + offs_d[None, :], dv.to(DV.dtype.element_ty), mask=kmask)


@triton.jit(do_not_specialize=_NO_SPEC + ["HKV", "B", "n_kv_progs", "srb"])
def _stream_bwd(
    Q, K, V, DO, DQ, DK, DV, LSE, DELTA, POS, QRANGE, DOC, DOCSTART, KVSTART,
    sqb, sqt, sqh, skb, skt, skh, svb, svt, svh, sdb, sdt, sdh, sgb, sgt, sgh,
    skgb, skgt, skgh, svgb, svgt, svgh, spb, srb,
    M, N, HQ, HKV, B, n_kv_progs, pos_offset, window, qk_scale, sm_scale,
    G, D: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M2: tl.constexpr, BLOCK_N2: tl.constexpr,
    POS_PTR: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_DOC: tl.constexpr, HAS_KVS: tl.constexpr,
    REVERSE: tl.constexpr, PREC: tl.constexpr,
):
    """dK/dV programs (first ``n_kv_progs``; ``BLOCK_M x BLOCK_N``) and dQ programs (the rest;
    ``BLOCK_M2 x BLOCK_N2``) of one stream in a single launch."""
    pid = tl.program_id(0)
    if pid < n_kv_progs:
        nkb = tl.cdiv(N, BLOCK_N)
        kvh = pid % HKV
        rest = pid // HKV
        _dkdv_block(kvh, rest % nkb, rest // nkb,
                    Q, K, V, DO, DK, DV, LSE, DELTA, POS, QRANGE, DOC, KVSTART,
                    sqb, sqt, sqh, skb, skt, skh, svb, svt, svh, sdb, sdt, sdh,
                    skgb, skgt, skgh, svgb, svgt, svgh, spb, srb,
                    M, N, HQ, pos_offset, window, qk_scale, sm_scale,
                    G, D, BLOCK_D, BLOCK_M, BLOCK_N, POS_PTR, HAS_WINDOW, HAS_DOC, HAS_KVS, PREC)
    else:
        pid = pid - n_kv_progs
        nm = tl.cdiv(M, BLOCK_M2)
        h = pid % HQ
        rest = pid // HQ
        _dq_block(h, rest % nm, rest // nm,
                  Q, K, V, DO, DQ, LSE, DELTA, POS, DOC, DOCSTART, KVSTART,
                  sqb, sqt, sqh, skb, skt, skh, svb, svt, svh, sdb, sdt, sdh, sgb, sgt, sgh, spb,
                  M, N, HQ, pos_offset, window, qk_scale, sm_scale,
                  G, D, BLOCK_D, BLOCK_M2, BLOCK_N2, POS_PTR, HAS_WINDOW, HAS_DOC, HAS_KVS, REVERSE, PREC)


@triton.jit(do_not_specialize=["window", "NUM_SPLITS"])
def _decode_split(
    Q, QO, K, V, SEQ, OP, LP,
    sqb, sqh, sob_, soh_, skb, skt, skh, svb, svt, svh,
    window, qk_scale, split_len,
    G: tl.constexpr, HQ: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, NUM_SPLITS, PREC: tl.constexpr,
):
    """One decode step, both streams: rows 0..G-1 are the window queries of the G heads that
    share KV head ``kvh``, rows G..2G-1 their full queries. Program (split, kvh, b) reads its
    chunk of the cache once and writes partial (o, lse) per row; _decode_combine merges.
    ``NUM_SPLITS`` is a runtime value (a new split count does not recompile)."""
    split = tl.program_id(0)
    kvh = tl.program_id(1)
    b = tl.program_id(2)
    b64 = b.to(tl.int64)
    kvh64 = kvh.to(tl.int64)
    L = tl.load(SEQ + b64).to(tl.int64)
    s_lo = split.to(tl.int64) * split_len
    s_hi = tl.minimum(s_lo + split_len, L)
    w_lo = L - window
    r = tl.arange(0, BLOCK_H)
    is_win = r < G
    r_ok = r < 2 * G
    head = kvh64 * G + tl.where(is_win, r, r - G)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    qmask = r_ok[:, None] & d_ok[None, :]
    qw = tl.load(Q + b64 * sqb + head[:, None] * sqh + offs_d[None, :], mask=qmask & is_win[:, None], other=0.0)
    qf = tl.load(QO + b64 * sob_ + head[:, None] * soh_ + offs_d[None, :], mask=qmask & (~is_win)[:, None], other=0.0)
    q = qw + qf
    k_base = K + b64 * skb + kvh64 * skh
    v_base = V + b64 * svb + kvh64 * svh
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    for start_n in range(s_lo, s_hi, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N).to(tl.int64)
        c_ok = cols < s_hi
        kmask = c_ok[:, None] & d_ok[None, :]
        k = tl.load(k_base + cols[:, None] * skt + offs_d[None, :], mask=kmask, other=0.0)
        v = tl.load(v_base + cols[:, None] * svt + offs_d[None, :], mask=kmask, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PREC) * qk_scale
        mask = c_ok[None, :] & ((~is_win)[:, None] | (cols[None, :] >= w_lo))
        s = tl.where(mask, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
        m_i = m_new
    has = l_i > 0
    o = acc / tl.where(has, l_i, 1.0)[:, None]
    lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))
    # partial layout: [B, 2, HQ, NUM_SPLITS, (D)]
    prow = ((b64 * 2 + tl.where(is_win, 0, 1)) * HQ + head) * NUM_SPLITS + split
    tl.store(OP + prow[:, None] * D + offs_d[None, :], o, mask=qmask)
    tl.store(LP + prow, lse, mask=r_ok)


@triton.jit(do_not_specialize=["NUM_SPLITS"])
def _decode_combine(OP, LP, O, OO, sob, soh, soob, sooh,
                    HQ: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
                    NUM_SPLITS, BLOCK_S: tl.constexpr):
    h = tl.program_id(0).to(tl.int64)
    stream = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    offs_s = tl.arange(0, BLOCK_S)
    s_ok = offs_s < NUM_SPLITS
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    base = ((b * 2 + stream) * HQ + h) * NUM_SPLITS
    lse_s = tl.load(LP + base + offs_s, mask=s_ok, other=float("-inf"))
    mx = tl.max(lse_s, 0)
    mx_safe = tl.where(mx == float("-inf"), 0.0, mx)
    wts = tl.exp2(lse_s - mx_safe)
    den = tl.sum(wts, 0)
    o_s = tl.load(OP + (base + offs_s)[:, None] * D + offs_d[None, :], mask=s_ok[:, None] & d_ok[None, :], other=0.0)
    o = tl.sum(o_s * wts[:, None], 0) / tl.where(den > 0, den, 1.0)
    if stream == 0:
        tl.store(O + b * sob + h * soh + offs_d, o.to(O.dtype.element_ty), mask=d_ok)
    else:
        tl.store(OO + b * soob + h * sooh + offs_d, o.to(OO.dtype.element_ty), mask=d_ok)

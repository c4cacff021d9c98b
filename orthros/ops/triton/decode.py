"""Host side of the Triton decode step: window query + full query of every row in one launch.

The cache is split along its length into ``S`` chunks (flash-decoding); program
``(split, kv_head, row)`` reads its chunk of K/V once for all ``G`` query heads of that KV
head and both streams (``2G`` query rows packed into one tile), and writes a partial result
per row; a second tiny kernel merges the ``S`` partials by log-sum-exp. ``S`` depends only on
static shapes and the per-row lengths are read on the device, so a step is CUDA-graph
capturable and never synchronises with the host.

Split count (:func:`num_splits`): the programs ``P = S * B * Hkv`` run in waves of
``slots = SMs * occupancy`` (occupancy estimated from the shared memory of the pipelined
K/V tiles). A step costs about ``ceil(P / slots)`` waves times the key blocks of one chunk,
so ``S`` is chosen to minimise ``waves(S) * (blocks_per_chunk(S) + c)``, ``c`` a program's fixed
cost in key blocks (ties: the smaller ``S``,
fewer partials to merge), with chunks of at least ``min_split`` keys. At B=1, Hkv=8 on 132
SMs this is the previous choice (~33 splits); at B=8 it picks S=4 (256 programs, one wave)
instead of S=5 (320 programs: a second, mostly idle wave).
"""

from __future__ import annotations

import math

import torch

import triton
import triton.language as tl

from .common import (LOG2E, block_d, cdiv, interpreting, merge_splits, num_sms, pow2, precision, softmax_result,
                     softmax_step)


# ============================================================================ kernels

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
        m_i, l_i, acc = softmax_step(m_i, l_i, acc, s, v, PREC)
    o, lse, _ = softmax_result(m_i, l_i, acc)
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
    o_s = tl.load(OP + (base + offs_s)[:, None] * D + offs_d[None, :], mask=s_ok[:, None] & d_ok[None, :], other=0.0)
    o, _ = merge_splits(lse_s, o_s)
    if stream == 0:
        tl.store(O + b * sob + h * soh + offs_d, o.to(O.dtype.element_ty), mask=d_ok)
    else:
        tl.store(OO + b * soob + h * sooh + offs_d, o.to(OO.dtype.element_ty), mask=d_ok)


# ============================================================================ host

# (BLOCK_N, num_warps, num_stages, min keys per split); measured on an H200.
# max_splits bounds S (the merge kernel holds all S partials of a row in one tile).
DECODE_CONFIG = {"block_n": 64, "num_warps": 4, "num_stages": 3, "min_split": 512, "max_splits": 64,
                 "smem_per_sm": 228 * 1024, "max_occupancy": 2, "prog_overhead": 4}
_SMEM = {}


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


def occupancy(block_n: int, block_d: int, num_stages: int, elem_bytes: int = 2, smem_per_sm: int = 228 * 1024,
              max_occupancy: int = 2) -> int:
    """Programs of ``_decode_split`` resident per SM, from the K/V tiles in flight
    (``num_stages`` x (K + V) x ``block_n`` x ``block_d``) plus ~8 KB of scratch."""
    per = max(1, num_stages) * 2 * block_n * block_d * elem_bytes + 8 * 1024
    return max(1, min(max_occupancy, smem_per_sm // per))


def choose_splits(B: int, HKV: int, L_max: int, sms: int, occ: int, block_n: int, min_split: int,
                  max_splits: int = 64, prog_overhead: int = 4) -> int:
    """Split count minimising ``ceil(P / slots) * (blocks_per_chunk + prog_overhead)`` (a pure
    function of static shapes). ``prog_overhead`` (in key blocks) is a program's fixed cost
    (query load, pipeline fill, partial store) and keeps the model from trading one wave of
    long chunks for many exactly-filled waves of short ones."""
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
        if best_cost is None or cost < best_cost:
            best, best_cost = s, cost
    return best


def num_splits(B: int, HKV: int, L_max: int, device, cfg=None, elem_bytes: int = 2, block_d: int = 128) -> int:
    cfg = DECODE_CONFIG if cfg is None else cfg
    occ = occupancy(cfg["block_n"], block_d, cfg["num_stages"], elem_bytes,
                    cfg.get("smem_per_sm") if device.type != "cuda" else _smem_per_sm(device),
                    cfg.get("max_occupancy", 2))
    return choose_splits(B, HKV, L_max, num_sms(device), occ, cfg["block_n"], cfg["min_split"],
                         cfg.get("max_splits", 64), cfg.get("prog_overhead", 4))


def decode_attention_triton(q, q_out, k_cache, v_cache, cache_seqlens, *, window_size, scale=None,
                                    _config=None):
    """``_config`` (internal, for benchmarks/attention.py --decode-tune): a dict overriding
    DECODE_CONFIG keys and/or giving ``splits`` (the split count S) explicitly."""
    B, _, HQ, D = q.shape
    L_max, HKV = k_cache.shape[1], k_cache.shape[2]
    G = HQ // HKV
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    q = q if q.stride(-1) == 1 else q.contiguous()
    q_out = q_out if q_out.stride(-1) == 1 else q_out.contiguous()
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("orthros_decode_attention: k_cache/v_cache need a contiguous last dimension")
    seq = cache_seqlens
    o = torch.empty(B, 1, HQ, v_cache.shape[-1], dtype=q.dtype, device=q.device)
    o_out = torch.empty_like(o)
    BD = block_d(D)
    cfg = DECODE_CONFIG if _config is None else {**DECODE_CONFIG, **_config}
    bn = cfg["block_n"]
    S = cfg.get("splits") or num_splits(B, HKV, L_max, q.device, cfg, q.element_size(), BD)
    S = max(1, min(int(S), cdiv(L_max, bn)))
    split_len = cdiv(cdiv(L_max, S), bn) * bn
    S = cdiv(L_max, split_len)
    op = torch.empty(B, 2, HQ, S, D, dtype=torch.float32, device=q.device)
    lp = torch.empty(B, 2, HQ, S, dtype=torch.float32, device=q.device)
    nw, ns = (1, 1) if interpreting() else (cfg["num_warps"], cfg["num_stages"])
    _decode_split[(S, HKV, B)](
        q, q_out, k_cache, v_cache, seq, op, lp,
        q.stride(0), q.stride(2), q_out.stride(0), q_out.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        int(window_size), scale * LOG2E, split_len,
        G=G, HQ=HQ, D=D, BLOCK_D=BD, BLOCK_H=max(16, pow2(2 * G)), BLOCK_N=bn,
        NUM_SPLITS=S, PREC=precision(q.dtype), num_warps=nw, num_stages=ns)
    _decode_combine[(HQ, 2, B)](op, lp, o, o_out, o.stride(0), o.stride(2), o_out.stride(0), o_out.stride(2),
                                   HQ=HQ, D=D, BLOCK_D=BD, NUM_SPLITS=S,
                                   BLOCK_S=max(2, pow2(S)))
    return o, o_out

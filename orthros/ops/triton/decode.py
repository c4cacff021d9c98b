"""Host side of the Triton decode step: window query + full query of every row in one launch.

The cache is split along its length into ``S`` chunks (flash-decoding); program
``(split, kv_head, row)`` reads its chunk of K/V once for all ``G`` query heads of that KV
head and both streams (``2G`` query rows packed into one tile), and writes a partial result
per row; a second tiny kernel merges the ``S`` partials by log-sum-exp. ``S`` depends only on
static shapes and the per-row lengths are read on the device, so a step is CUDA-graph
capturable and never synchronises with the host.
"""

from __future__ import annotations

import math

import torch
import triton

from . import _kernels as _k
from .attention import _block_d, _interpreting, _num_sms, _prec

_LOG2E = 1.4426950408889634
# (BLOCK_N, num_warps, num_stages, min keys per split); measured on an H200.
DECODE_CONFIG = {"block_n": 64, "num_warps": 4, "num_stages": 3, "min_split": 512, "waves": 2}


def num_splits(B: int, HKV: int, L_max: int, device) -> int:
    cfg = DECODE_CONFIG
    target = cfg["waves"] * _num_sms(device)
    s = max(1, min(triton.cdiv(target, max(1, B * HKV)), max(1, L_max // cfg["min_split"])))
    return s


def orthros_decode_attention_triton(q, q_out, k_cache, v_cache, cache_seqlens, *, window_size, scale=None):
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
    BD = _block_d(D)
    cfg = DECODE_CONFIG
    bn = cfg["block_n"]
    S = num_splits(B, HKV, L_max, q.device)
    split_len = triton.cdiv(triton.cdiv(L_max, S), bn) * bn
    S = triton.cdiv(L_max, split_len)
    op = torch.empty(B, 2, HQ, S, D, dtype=torch.float32, device=q.device)
    lp = torch.empty(B, 2, HQ, S, dtype=torch.float32, device=q.device)
    nw, ns = (1, 1) if _interpreting() else (cfg["num_warps"], cfg["num_stages"])
    _k._decode_split[(S, HKV, B)](
        q, q_out, k_cache, v_cache, seq, op, lp,
        q.stride(0), q.stride(2), q_out.stride(0), q_out.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        int(window_size), scale * _LOG2E, split_len,
        G=G, HQ=HQ, D=D, BLOCK_D=BD, BLOCK_H=max(16, triton.next_power_of_2(2 * G)), BLOCK_N=bn,
        NUM_SPLITS=S, PREC=_prec(q.dtype), num_warps=nw, num_stages=ns)
    _k._decode_combine[(HQ, 2, B)](op, lp, o, o_out, o.stride(0), o.stride(2), o_out.stride(0), o_out.stride(2),
                                   HQ=HQ, D=D, BLOCK_D=BD, NUM_SPLITS=S,
                                   BLOCK_S=max(2, triton.next_power_of_2(S)))
    return o, o_out

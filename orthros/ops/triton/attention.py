"""Host side of the Triton Orthros attention: autograd functions and dispatch.

The op is two streams sharing K and V:

* the window stream (every base query, keys ``t-w+1 .. t``) -> :class:`_StreamAttention`
  with ``window = w`` and positions ``T_k - T + i``;
* the full stream (output queries at ``out_positions``, keys ``0 .. pos``) ->
  SDPA with ``is_causal=True`` when the positions are *all* positions of one plain
  sequence (pre-training: cuDNN / flash are the fastest causal kernels on Hopper), else
  :class:`_StreamAttention` with ``window = 0`` (SFT, prefill's last query, varlen,
  left padding). Long key ranges with few query blocks are split along the keys
  (flash-decoding style) and merged by log-sum-exp.

Autograd sums the two streams' dK/dV.
"""

from __future__ import annotations

import os
import warnings

import torch

from . import _kernels as _k

_LOG2E = 1.4426950408889634

# Block configurations, keyed by (kind, BLOCK_D): (BLOCK_M, BLOCK_N, num_warps, num_stages).
# Chosen by measurement on an H200 (benchmarks/attention.py --sweep); overridable for sweeps.
CONFIGS = {
    "win_fwd": {64: (64, 64, 4, 3), 128: (64, 64, 4, 3), 256: (64, 32, 4, 2)},
    "full_fwd": {64: (128, 64, 4, 3), 128: (128, 64, 8, 3), 256: (64, 32, 4, 2)},
    "bwd_dq": {64: (64, 64, 4, 2), 128: (64, 64, 4, 2), 256: (32, 32, 4, 1)},
    "bwd_dkdv": {64: (64, 64, 4, 2), 128: (64, 64, 4, 2), 256: (32, 32, 4, 1)},
}
# Use SDPA (cuDNN first) for the all-positions full stream of fp16/bf16 inputs.
USE_SDPA_CAUSAL = os.environ.get("ORTHROS_NO_SDPA", "0") != "1"
# dQ and dK/dV programs of a stream's backward in one launch (fewer launches: less host overhead).
FUSED_BWD = os.environ.get("ORTHROS_FUSED_BWD", "1") == "1"


# Read once: triton decides interpreter mode when the kernels are decorated (import time) too.
_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"


def _interpreting() -> bool:
    return _INTERPRET


def _cfg(kind: str, block_d: int):
    table = CONFIGS[kind]
    key = 64 if block_d <= 64 else (128 if block_d <= 128 else 256)
    bm, bn, nw, ns = table[key]
    if _interpreting():
        return bm, bn, 1, 1
    return bm, bn, nw, ns


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def _block_d(D: int) -> int:
    # plain Python (triton.cdiv / next_power_of_2 may be jit functions: slow from the host)
    return max(16, _pow2(D))


def _prec(dtype) -> str:
    return "ieee" if dtype == torch.float32 else "tf32"


def _last_contig(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


_SMS = {}


def _num_sms(device) -> int:
    if device.type != "cuda":
        return 4
    n = _SMS.get(device.index)
    if n is None:
        n = _SMS[device.index] = torch.cuda.get_device_properties(device).multi_processor_count
    return n


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


_DUMMIES = {}


def _dummy(device):
    """A placeholder int64 tensor for pointer arguments a kernel variant does not read (cached: no launch)."""
    t = _DUMMIES.get(device)
    if t is None:
        t = _DUMMIES[device] = torch.zeros(1, dtype=torch.int64, device=device)
    return t


def _stream_forward(q, k, v, pos, pos_offset, window, scale, masks: _Masks, allow_split=True):
    """Returns (o, lse) for one stream. q [B, M, Hq, D]; pos [Bp, M] int64 or None."""
    B, M, HQ, D = q.shape
    N, HKV = k.shape[1], k.shape[2]
    dev = q.device
    o = torch.empty(B, M, HQ, v.shape[-1], dtype=q.dtype, device=dev)
    lse = torch.empty(B, HQ, M, dtype=torch.float32, device=dev)
    if M == 0:
        return o, lse
    BD = _block_d(D)
    BM, BN, nw, ns = _cfg("win_fwd" if window else "full_fwd", BD)
    nm = _cdiv(M, BM)
    splits = 1
    if allow_split and not window and not _interpreting():
        progs = nm * HQ * B
        sms = _num_sms(dev)
        if progs < sms and N >= 4096:
            splits = max(1, min(_cdiv(2 * sms, progs), N // 2048, 64))
    dd = _dummy(dev)
    pos_t = dd if pos is None else pos
    spb = 0 if pos is None or pos.shape[0] == 1 else pos.stride(0)
    common = dict(
        G=HQ // HKV, D=D, BLOCK_D=BD, BLOCK_M=BM, BLOCK_N=BN,
        POS_PTR=pos is not None, HAS_WINDOW=bool(window), HAS_DOC=masks.doc is not None,
        HAS_KVS=masks.kv_start is not None, NUM_SPLITS=splits, PARTIAL=splits > 1, REVERSE=not window,
        PREC=_prec(q.dtype), num_warps=nw, num_stages=ns,
    )
    doc = dd if masks.doc is None else masks.doc
    dst = dd if masks.doc_start is None else masks.doc_start
    kvs = dd if masks.kv_start is None else masks.kv_start
    qs, ks, vs = q.stride(), k.stride(), v.stride()
    qk = scale * _LOG2E
    if splits == 1:
        os_ = o.stride()
        _k._stream_fwd[(HQ, nm, B)](
            q, k, v, o, lse, pos_t, doc, dst, kvs,
            qs[0], qs[1], qs[2], ks[0], ks[1], ks[2], vs[0], vs[1], vs[2],
            os_[0], os_[1], os_[2], 0, HQ * M, M, 0, spb,
            M, N, HQ, pos_offset, window, qk, **common)
        return o, lse
    op = torch.empty(splits, B, HQ, M, D, dtype=torch.float32, device=dev)
    lp = torch.empty(splits, B, HQ, M, dtype=torch.float32, device=dev)
    _k._stream_fwd[(HQ, nm, B * splits)](
        q, k, v, op, lp, pos_t, doc, dst, kvs,
        qs[0], qs[1], qs[2], ks[0], ks[1], ks[2], vs[0], vs[1], vs[2],
        HQ * M * D, D, M * D, B * HQ * M * D, HQ * M, M, B * HQ * M, spb,
        M, N, HQ, pos_offset, window, qk, **common)
    _k._combine_splits[(M, B * HQ)](op, lp, o, lse, o.stride(0), o.stride(1), o.stride(2), M, HQ,
                                     NUM_SPLITS=splits, D=D, BLOCK_D=BD,
                                     BLOCK_S=max(2, _pow2(splits)))
    return o, lse


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
    dq = torch.empty_like(q)
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    if M == 0:
        return dq, dk.zero_(), dv.zero_()
    if do.stride(-1) != 1:
        do = do.contiguous()
    BD = _block_d(D)
    os_, ds = o.stride(), do.stride()
    delta = torch.empty(B, HQ, M, dtype=torch.float32, device=dev)
    _k._bwd_delta[(_cdiv(M, 64), B * HQ)](o, do, delta, os_[0], os_[1], os_[2], ds[0], ds[1], ds[2], M, HQ,
                                          D=D, BLOCK_D=BD, BLOCK_M=64)
    dd = _dummy(dev)
    pos_t = dd if pos is None else pos
    spb = 0 if pos is None or pos.shape[0] == 1 else pos.stride(0)
    doc = dd if masks.doc is None else masks.doc
    dst = dd if masks.doc_start is None else masks.doc_start
    kvs = dd if masks.kv_start is None else masks.kv_start
    qk = scale * _LOG2E
    BM2, BN2, nw2, ns2 = _cfg("bwd_dq", BD)
    BM, BN, nw, ns = _cfg("bwd_dkdv", BD)
    if pos is not None:
        qr = _query_ranges(pos, N, BN, masks)
        srb = 0 if qr.shape[0] == 1 else qr.stride(0)
    else:
        qr, srb = dd, 0
    n_kv = HKV * _cdiv(N, BN) * B
    n_q = HQ * _cdiv(M, BM2) * B
    qs, ks, vs, gqs, gks, gvs = q.stride(), k.stride(), v.stride(), dq.stride(), dk.stride(), dv.stride()
    args = (q, k, v, do, dq, dk, dv, lse, delta, pos_t, qr, doc, dst, kvs,
            qs[0], qs[1], qs[2], ks[0], ks[1], ks[2], vs[0], vs[1], vs[2], ds[0], ds[1], ds[2],
            gqs[0], gqs[1], gqs[2], gks[0], gks[1], gks[2], gvs[0], gvs[1], gvs[2], spb, srb,
            M, N, HQ, HKV, B)
    tail = (pos_offset, window, qk, scale)
    flags = (pos is not None, bool(window), masks.doc is not None, masks.kv_start is not None, _prec(q.dtype))
    if FUSED_BWD:  # one launch: dK/dV programs first, then dQ programs
        _k._stream_bwd[(n_kv + n_q,)](*args, n_kv, *tail, **_bwd_consts(HQ // HKV, D, BD, BM, BN, BM2, BN2, flags, nw, ns))
    else:
        _k._stream_bwd[(n_kv,)](*args, n_kv, *tail, **_bwd_consts(HQ // HKV, D, BD, BM, BN, BM2, BN2, flags, nw, ns))
        _k._stream_bwd[(n_q,)](*args, 0, *tail, **_bwd_consts(HQ // HKV, D, BD, BM, BN, BM2, BN2, flags, nw2, ns2))
    return dq, dk, dv


def _bwd_consts(G, D, BD, BM, BN, BM2, BN2, flags, nw, ns):
    """The constexpr/launch keywords of a backward launch."""
    pos_ptr, has_window, has_doc, has_kvs, prec = flags
    return dict(G=G, D=D, BLOCK_D=BD, BLOCK_M=BM, BLOCK_N=BN, BLOCK_M2=BM2, BLOCK_N2=BN2,
                   POS_PTR=pos_ptr, HAS_WINDOW=has_window, HAS_DOC=has_doc, HAS_KVS=has_kvs,
                   REVERSE=not has_window, PREC=prec, num_warps=nw, num_stages=ns)


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
        pos_offset, window, scale, masks = ctx.cfg
        dq, dk, dv = _stream_backward(do, q, k, v, o, lse, pos, pos_offset, window, scale, masks)
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


def orthros_attention_triton(q, k, v, q_out, *, window_size, out_positions, scale, doc_ids=None,
                             cu_seqlens=None, kv_start=None):
    """Triton implementation of :func:`orthros.ops.orthros_attention` (arguments already normalised)."""
    from . import supports

    if not supports(q, k) and not (_interpreting() and q.dtype != torch.float64):
        warnings.warn("orthros_attention_triton: input not supported by the Triton kernels "
                      f"(device={q.device}, dtype={q.dtype}, head_dim={q.shape[-1]}); using the reference")
        from ..reference import orthros_attention_reference

        return orthros_attention_reference(q, k, v, q_out, window_size=window_size, out_positions=out_positions,
                                           scale=scale, doc_ids=doc_ids, kv_start=kv_start)
    q, k, v, q_out = (_last_contig(t) for t in (q, k, v, q_out))
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
        pos = out_positions.to(device=q.device, dtype=torch.int64).contiguous()
        o_out = _run_stream(q_out, k, v, pos, 0, 0, scale, masks)
    return o, o_out

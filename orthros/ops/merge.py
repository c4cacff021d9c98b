"""Partial attention with log-sum-exp, and the exact merge of partials (flash-decoding).

The output query of the last token attends to every key of the sequence; with the keys sharded
over ranks, each rank computes softmax attention over its own keys together with the
log-sum-exp of its scores, and the partials merge exactly:

    lse = log sum_r exp(lse_r),    o = sum_r exp(lse_r - lse) * o_r .

Pure PyTorch in float32 (float64 stays float64). Used by the sequence-parallel path
(``orthros.parallel``): the output query's partial over each rank's keys, merged across ranks.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch

from ..utils import check_positive_int
from .attention import check_scale, check_tensor


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def partial_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: Optional[float] = None,
                      key_chunk: int = 65536) -> Tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention of every query over *every* key (no mask), with its log-sum-exp.

    Args:
        q: ``[B, M, Hq, D]``; k, v: ``[B, L, Hkv, D]`` with ``Hq % Hkv == 0`` (GQA); ``L`` may be 0.
        key_chunk: keys processed at a time (online softmax), bounding the float32 copies.

    Returns:
        ``o [B, M, Hq, D]`` and ``lse [B, M, Hq]`` in float32 (float64 for float64 input), where
        ``lse = log sum_j exp(scale * q.k_j)``; ``L == 0`` gives ``o = 0`` and ``lse = -inf``.
    """
    key_chunk = check_positive_int("key_chunk", key_chunk)  # <= 0 skipped every key: o = 0, lse = -inf
    check_scale(scale)
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t, 4)
    B, M, Hq, D = q.shape
    L, Hkv = k.shape[1], k.shape[2]
    if k.shape[0] != B or v.shape[:3] != k.shape[:3] or k.shape[3] != D:
        raise ValueError(f"k and v must be [B={B}, L, Hkv, *] (k's last dim D={D}, q's), got {tuple(k.shape)} and "
                         f"{tuple(v.shape)}")
    if Hkv == 0 or Hq % Hkv:
        raise ValueError(f"query heads ({Hq}) must be a multiple of key/value heads ({Hkv})")
    if D == 0:
        raise ValueError(f"the head dim D of q and k must be >= 1, got q {tuple(q.shape)}")
    if not q.device == k.device == v.device:
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    G = Hq // Hkv
    acc = acc_dtype(q.dtype)
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    Dv = v.shape[-1]
    qf = q.to(acc).view(B, M, Hkv, G, D)
    m = torch.full((B, Hkv, G, M), float("-inf"), dtype=acc, device=q.device)
    den = torch.zeros((B, Hkv, G, M), dtype=acc, device=q.device)
    num = torch.zeros((B, Hkv, G, M, Dv), dtype=acc, device=q.device)
    for s in range(0, L, key_chunk):
        kc = k[:, s:s + key_chunk].to(acc)
        vc = v[:, s:s + key_chunk].to(acc)
        sc = torch.einsum("bmhgd,blhd->bhgml", qf, kc) * scale
        m_new = torch.maximum(m, sc.amax(-1))
        corr = torch.exp(m - m_new)  # m = -inf only before the first chunk: exp(-inf) = 0
        p = torch.exp(sc - m_new.unsqueeze(-1))
        den = den * corr + p.sum(-1)
        num = num * corr.unsqueeze(-1) + torch.einsum("bhgml,blhd->bhgmd", p, vc)
        m = m_new
    has = den > 0
    o = num / torch.where(has, den, torch.ones_like(den)).unsqueeze(-1)
    lse = torch.where(has, m + torch.log(torch.where(has, den, torch.ones_like(den))),
                      torch.full_like(m, float("-inf")))
    o = o.permute(0, 3, 1, 2, 4).reshape(B, M, Hq, Dv)
    lse = lse.permute(0, 3, 1, 2).reshape(B, M, Hq)
    return o, lse


def merge_partials(o: torch.Tensor, lse: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Merge partials stacked on dim 0: ``o [R, ..., D]``, ``lse [R, ...]`` -> ``(o, lse)``.

    Exact (up to rounding) and independent of how the keys were split; rows where every partial
    is empty (``lse = -inf``) give ``o = 0``, ``lse = -inf``, never NaN.
    """
    for name, t in (("o", o), ("lse", lse)):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            raise ValueError(f"merge_partials: {name} must be a floating-point tensor, got "
                             f"{t.dtype if isinstance(t, torch.Tensor) else type(t).__name__}")
    if o.dim() < 2 or o.shape[0] == 0 or lse.shape != o.shape[:-1]:
        raise ValueError(f"merge_partials needs o [R, ..., D] and lse [R, ...] = o's shape without D, R >= 1 "
                         f"partials; got o {tuple(o.shape)} and lse {tuple(lse.shape)}")
    if o.device != lse.device:
        raise ValueError(f"merge_partials: o and lse must be on one device, got {o.device} and {lse.device}")
    mx = lse.amax(0)
    mx_safe = torch.where(torch.isfinite(mx), mx, torch.zeros_like(mx))
    w = torch.exp(lse - mx_safe.unsqueeze(0))  # -inf -> 0
    den = w.sum(0)
    has = den > 0
    wo = w.unsqueeze(-1)
    # an empty partial's o is no data (a kernel may leave NaN there): 0 * NaN would poison the row
    out = (wo * o.masked_fill(wo == 0, 0.0)).sum(0) / torch.where(has, den, torch.ones_like(den)).unsqueeze(-1)
    lse_out = torch.where(has, mx_safe + torch.log(torch.where(has, den, torch.ones_like(den))),
                          torch.full_like(mx, float("-inf")))
    return out, lse_out

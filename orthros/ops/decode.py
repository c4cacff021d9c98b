"""One Orthros decode step against a static KV cache: the window query and the full query of
each batch row, sharing the cached K/V.

``orthros_decode_attention`` dispatches to the Triton kernel on CUDA (when it supports the
inputs) and to :func:`decode_attention_reference` elsewhere. Both have the same signature:

* ``q``, ``q_out``: ``[B, 1, Hq, D]`` window-stream and output-stream queries of the new token;
* ``k_cache``, ``v_cache``: ``[B, L_max, Hkv, D]`` static caches that already hold the new
  token's K/V at index ``cache_seqlens[b] - 1``;
* ``cache_seqlens``: ``[B]`` int32/int64 on the device, valid length of each row (rows may
  differ; nothing is read back to the host, so the step is CUDA-graph capturable).

Returns ``(o, o_out)``, each ``[B, 1, Hq, D]``: ``o`` attends the last ``window_size`` valid
keys, ``o_out`` all ``cache_seqlens[b]`` keys. A row with length 0 gives zeros. With
``stacked=True``: one ``[B, 2, Hq, D]`` tensor, ``o`` in row 0 and ``o_out`` in row 1 (the
layout ``W_O`` reads; the kernel writes it directly, no concatenation).
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from ..utils import check_positive_int
from .backends import check_backend, resolve_backend


def decode_attention_reference(q, q_out, k_cache, v_cache, cache_seqlens, *, window_size: int,
                               scale: Optional[float] = None, stacked: bool = False):
    """Pure-PyTorch decode step (float32 math, fp64 stays fp64); masks by length, no host sync."""
    B, _, Hq, D = q.shape
    L, Hkv = k_cache.shape[1], k_cache.shape[2]
    G = Hq // Hkv
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    kf = k_cache.to(acc)
    vf = v_cache.to(acc)
    lens = cache_seqlens.to(device=q.device, dtype=torch.int64).view(B, 1)
    kpos = torch.arange(L, device=q.device).view(1, L)
    valid = kpos < lens
    in_win = valid & (kpos >= lens - window_size)
    outs = []
    for qq, allowed in ((q, in_win), (q_out, valid)):
        qg = qq[:, 0].to(acc).view(B, Hkv, G, D)
        s = torch.einsum("bhgd,blhd->bhgl", qg, kf) * scale
        s = s.masked_fill(~allowed.view(B, 1, 1, L), float("-inf"))
        m = s.amax(-1, keepdim=True)
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        p = torch.exp(s - m)
        den = p.sum(-1, keepdim=True)
        p = p / torch.where(den > 0, den, torch.ones_like(den))
        o = torch.einsum("bhgl,blhd->bhgd", p, vf).reshape(B, 1, Hq, v_cache.shape[-1])
        outs.append(o.to(q.dtype))
    return torch.cat(outs, dim=1) if stacked else (outs[0], outs[1])


def _check(q, q_out, k_cache, v_cache, cache_seqlens, window_size):
    for name, t in (("q", q), ("q_out", q_out), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"{name} must be a 4-D tensor, got {type(t).__name__} "
                             f"{tuple(t.shape) if isinstance(t, torch.Tensor) else ''}")
    B, one, Hq, D = q.shape
    if one != 1 or q_out.shape != q.shape:
        raise ValueError(f"q and q_out must both be [B, 1, Hq, D], got {tuple(q.shape)} and {tuple(q_out.shape)}")
    if k_cache.shape != v_cache.shape or k_cache.shape[0] != B or k_cache.shape[3] != D:
        raise ValueError(f"k_cache/v_cache must be [B={B}, L_max, Hkv, D={D}], got {tuple(k_cache.shape)} "
                         f"and {tuple(v_cache.shape)}")
    Hkv = k_cache.shape[2]
    if Hkv == 0 or Hq % Hkv:
        raise ValueError(f"query heads ({Hq}) must be a multiple of key/value heads ({Hkv})")
    if not (q.dtype == q_out.dtype == k_cache.dtype == v_cache.dtype):
        raise ValueError("q, q_out, k_cache, v_cache must share one dtype")
    if not isinstance(cache_seqlens, torch.Tensor) or cache_seqlens.dim() != 1 or cache_seqlens.numel() != B \
            or cache_seqlens.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"cache_seqlens must be an int32/int64 tensor of shape [{B}]")
    if cache_seqlens.device != q.device:
        raise ValueError("cache_seqlens must be on the same device as q")
    check_positive_int("window_size", window_size)


def orthros_decode_attention(q, q_out, k_cache, v_cache, cache_seqlens, *, window_size: int,
                             scale: Optional[float] = None, backend: str = "auto", stacked: bool = False):
    """Decode step of Orthros attention; see the module docstring. ``backend`` (one vocabulary
    with the training op, :mod:`orthros.ops.backends`): "auto" (Triton on CUDA when supported,
    else the reference), "triton", or "reference" / "sdpa" (both the PyTorch reference: a
    single-query step has no SDPA form worth its launch)."""
    check_backend(backend)
    if not isinstance(stacked, bool):
        raise ValueError(f"stacked must be True or False, got {stacked!r}")
    _check(q, q_out, k_cache, v_cache, cache_seqlens, window_size)
    if resolve_backend(backend, q, k_cache) == "triton":
        from .triton import decode_attention_triton

        return decode_attention_triton(q, q_out, k_cache, v_cache, cache_seqlens, window_size=window_size, scale=scale,
                                       stacked=stacked)
    return decode_attention_reference(q, q_out, k_cache, v_cache, cache_seqlens, window_size=window_size,
                                      scale=scale, stacked=stacked)


__all__ = ["orthros_decode_attention", "decode_attention_reference"]

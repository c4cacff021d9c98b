"""Fast paths on PyTorch's ``scaled_dot_product_attention`` for devices without the Triton
kernels (the CPU). Same semantics and fp32 accumulation as the reference, several times faster:

* the window stream as SDPA over query blocks, each against its ``C + w - 1`` keys with the
  band mask of :func:`orthros.ops.reference.window_blocks`;
* the full stream when there is an output query at every position: plain causal attention.

``orthros_attention(..., backend="auto")`` uses them when the Triton kernels do not apply.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .reference import _acc, window_blocks


def _heads_first(t: torch.Tensor, G: int) -> torch.Tensor:
    """``[..., T, H, D]`` -> ``[..., H * G, T, D]`` (GQA keys/values repeated for each query head)."""
    t = t.transpose(-3, -2)
    return t.repeat_interleave(G, dim=-3) if G > 1 else t


def window_attention_sdpa(q, k, v, *, window_size: int, scale: float, doc_ids=None, kv_start=None):
    B, Tq, Hq, D = q.shape
    G = Hq // k.shape[2]
    if Tq == 0:
        return q.new_zeros(B, 0, Hq, v.shape[-1])
    C, nb, kidx, allowed = window_blocks(Tq, k.shape[1], window_size, q.device, doc_ids, kv_start)
    acc = _acc(q)
    qb = F.pad(q.to(acc), (0, 0, 0, 0, 0, nb * C - Tq)).view(B, nb, C, Hq, D).transpose(2, 3)
    kb = _heads_first(k.to(acc)[:, kidx], G)  # [B, nb, Hq, K, D]
    vb = _heads_first(v.to(acc)[:, kidx], G)
    empty = ~allowed.any(-1, keepdim=True)  # padding queries: let them see everything, zero them after
    o = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=(allowed | empty)[:, :, None], scale=scale)
    o = o.masked_fill(empty[:, :, None], 0.0)
    return o.transpose(2, 3).reshape(B, nb * C, Hq, v.shape[-1])[:, :Tq].to(q.dtype)


def causal_attention_sdpa(q, k, v, *, scale: float):
    """Causal attention of ``q [B, T, Hq, D]`` over ``k, v [B, T, Hkv, D]`` (GQA)."""
    G = q.shape[2] // k.shape[2]
    acc = _acc(q)
    o = F.scaled_dot_product_attention(q.to(acc).transpose(1, 2), _heads_first(k.to(acc), G),
                                       _heads_first(v.to(acc), G), is_causal=True, scale=scale)
    return o.transpose(1, 2).to(q.dtype)

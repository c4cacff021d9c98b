"""The token-wise ops of the attention block's prologue, as functions: RMSNorm and RoPE.

One home for their math: the layers (:class:`orthros.layers.common.RMSNorm`,
:func:`orthros.layers.common.apply_rope`) call these, and so does the reference of the decode
step that takes raw projections (:func:`orthros.ops.decode.decode_qkv_attention_reference`),
whose Triton kernel computes the same in its prologue.
"""

from __future__ import annotations

import math
import numbers

import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``weight * (x / rms(x))`` over the last dimension: the norm in float32, rounded to
    ``x``'s dtype before the weight multiplies it (Llama's order)."""
    dtype = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


def check_eps(name: str, eps, weight_name: str) -> None:
    """An RMSNorm epsilon must be a finite real >= 0: a negative or NaN one makes the norm (and all
    that reads it) NaN, a string or None fails inside the op."""
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not math.isfinite(eps) or eps < 0:
        raise ValueError(f"{name} must be a finite float >= 0 with {weight_name} (the RMSNorm epsilon), got {eps!r}")


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [B, T, H, D]`` by ``cos/sin [B, T, R]`` (R <= D: partial rotary keeps the rest)."""
    R = cos.shape[-1]
    cos = cos[:, :, None, :].to(x.dtype)
    sin = sin[:, :, None, :].to(x.dtype)
    xr, xp = x[..., :R], x[..., R:]
    x1, x2 = xr[..., : R // 2], xr[..., R // 2:]
    rotated = torch.cat((-x2, x1), dim=-1)
    out = xr * cos + rotated * sin
    return torch.cat((out, xp), dim=-1) if xp.shape[-1] else out


__all__ = ["rms_norm", "apply_rope", "check_eps"]

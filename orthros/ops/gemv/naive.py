"""Reference of the weight-streaming GEMV: ``y = x @ weight.T (+ bias)``, the specification the
kernel of :mod:`orthros.ops.gemv` is tested against (plain PyTorch, any device), and the shape
checks every backend shares."""

from __future__ import annotations

from typing import Optional

import torch

MAX_M = 8  # rows the triton kernel takes (its M is unrolled)
DTYPES = (torch.float16, torch.bfloat16, torch.float32)  # what the triton kernel takes


def gemv_ref(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``x [..., K]`` (leading dims are rows: ``M = prod(x.shape[:-1])``, small in decode),
    ``weight [N, K]`` (``nn.Linear`` layout), ``bias [N]`` or None. Products and the sum over
    ``K`` in float32 (float64 inputs stay float64); the result ``[..., N]`` in ``x.dtype``."""
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    y = x.to(acc) @ weight.to(acc).T
    if bias is not None:
        y = y + bias.to(acc)
    return y.to(x.dtype)


def check_gemv_inputs(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> None:
    """Shape checks every backend shares (``ValueError`` naming the argument)."""
    if not isinstance(x, torch.Tensor) or x.dim() < 1:
        raise ValueError(f"x must be a tensor [..., K] with at least one dimension, got "
                         f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        raise ValueError(f"weight must be a 2-D tensor [N, K] (nn.Linear layout), got "
                         f"{tuple(weight.shape) if isinstance(weight, torch.Tensor) else type(weight).__name__}")
    if weight.shape[1] != x.shape[-1]:
        raise ValueError(f"weight must be [N, K] with K = x.shape[-1] = {x.shape[-1]}, got weight "
                         f"{tuple(weight.shape)} (a transposed [K, N] weight?)")
    if bias is not None and (not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (weight.shape[0],)):
        raise ValueError(f"bias must be None or a tensor [N] = [{weight.shape[0]}], got "
                         f"{tuple(bias.shape) if isinstance(bias, torch.Tensor) else type(bias).__name__}")


__all__ = ["MAX_M", "DTYPES", "gemv_ref", "check_gemv_inputs"]

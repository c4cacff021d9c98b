"""Reference of the weight-streaming GEMV and its fused prologues / epilogue, the specification
the kernel of :mod:`orthros.ops.gemv` is tested against (plain PyTorch, any device), and the
argument checks every backend shares.

``y = residual + (prologue(x) @ weight.T + bias)`` where the prologue is one of

* nothing: ``x [..., K]``;
* RMSNorm (``norm_weight [K]``, ``norm_eps``): exactly ``orthros.layers.common.RMSNorm.forward``:
  ``xf = x.float(); norm_weight * (xf * rsqrt(mean(xf^2) + eps)).to(x.dtype)``;
* SwiGLU (``act="silu"``): ``x [..., 2K] = [gate | up]`` (the fused ``[W_gate; W_up]`` GEMM's
  output) and the input is ``silu(gate) * up``, each op in ``x.dtype`` as
  ``orthros.layers.common.SwiGLUMLP`` computes it;

and the residual (``[..., N]``, ``x.dtype``) is added to the product after the product is rounded
to ``x.dtype`` (as eager ``h + F.linear(...)`` does).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from ..pointwise import check_eps, rms_norm

MAX_M = 8  # rows the triton kernel takes (its M is unrolled)
DTYPES = (torch.float16, torch.bfloat16, torch.float32)  # what the triton kernel takes
ACTS = (None, "silu")  # the activation prologues (``act``)


def prologue_ref(x: torch.Tensor, norm_weight: Optional[torch.Tensor] = None, norm_eps: Optional[float] = None,
                 act: Optional[str] = None) -> torch.Tensor:
    """The GEMV's input after its prologue, with the same torch ops (and so the same roundings)
    as the layers: RMSNorm (``norm_weight``) or SiLU-and-multiply (``act="silu"``) or ``x``."""
    if norm_weight is not None:
        return rms_norm(x, norm_weight, norm_eps)
    if act == "silu":
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up
    return x


def gemv_ref(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None, *,
             norm_weight: Optional[torch.Tensor] = None, norm_eps: Optional[float] = None,
             act: Optional[str] = None, residual: Optional[torch.Tensor] = None,
             out_norm_weight: Optional[torch.Tensor] = None, out_norm_eps: Optional[float] = None):
    """``x [..., K]`` (leading dims are rows: ``M = prod(x.shape[:-1])``, small in decode; ``[..., 2K]``
    with ``act="silu"``), ``weight [N, K]`` (``nn.Linear`` layout), ``bias [N]`` or None. The
    prologue (module docstring) in torch ops, then products and the sum over ``K`` in float32
    (float64 inputs stay float64), the bias in that precision, the result rounded to ``x.dtype``,
    then ``+ residual`` in ``x.dtype``. Returns ``[..., N]`` in ``x.dtype``; with
    ``out_norm_weight`` (and ``out_norm_eps``) the pair ``(y, rms_norm(y))``: the output and its
    RMSNorm (what the next GEMV's norm prologue would compute from it)."""
    dtype = x.dtype
    xp = prologue_ref(x, norm_weight, norm_eps, act)
    acc = torch.float64 if xp.dtype == torch.float64 else torch.float32
    y = xp.to(acc) @ weight.to(acc).T
    if bias is not None:
        y = y + bias.to(acc)
    y = y.to(dtype)
    y = residual + y if residual is not None else y
    return (y, rms_norm(y, out_norm_weight, out_norm_eps)) if out_norm_weight is not None else y


def _shape(t) -> str:
    return str(tuple(t.shape)) if isinstance(t, torch.Tensor) else type(t).__name__


def _check_norm(wname: str, ename: str, w, eps, size: int, dim: str) -> None:
    """An RMSNorm's weight ``[size]`` (floating point) and its epsilon (a finite float >= 0)."""
    if w is None:
        return
    if not isinstance(w, torch.Tensor) or tuple(w.shape) != (size,):
        raise ValueError(f"{wname} must be None or a tensor [{dim}] = [{size}] (the RMSNorm weight), got {_shape(w)}")
    if not w.is_floating_point():
        raise ValueError(f"{wname} must be a floating-point tensor, got {w.dtype}")
    check_eps(ename, eps, wname)


def check_gemv_inputs(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], *,
                      norm_weight: Optional[torch.Tensor] = None, norm_eps: Optional[float] = None,
                      act: Optional[str] = None, residual: Optional[torch.Tensor] = None,
                      out_norm_weight: Optional[torch.Tensor] = None, out_norm_eps: Optional[float] = None) -> None:
    """Checks every backend shares (``ValueError`` naming the argument); nothing reads data: shapes,
    ``x`` / ``weight`` / ``bias`` / ``residual`` of one floating dtype, a ``norm_weight`` that does
    not promote it, every tensor on ``x``'s device."""
    if act not in ACTS:
        raise ValueError(f"act must be one of {ACTS}, got {act!r}")
    if norm_weight is not None and act is not None:
        raise ValueError(f"norm_weight (the RMSNorm prologue) and act={act!r} (the SwiGLU prologue) are mutually "
                         f"exclusive: pass one of them")
    if norm_weight is None and norm_eps is not None:
        raise ValueError(f"norm_eps={norm_eps!r} was given without norm_weight: pass both or neither")
    if not isinstance(x, torch.Tensor) or x.dim() < 1:
        raise ValueError(f"x must be a tensor [..., K] with at least one dimension, got {_shape(x)}")
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        raise ValueError(f"weight must be a 2-D tensor [N, K] (nn.Linear layout), got {_shape(weight)}")
    N, K = weight.shape
    if act == "silu":
        if x.shape[-1] != 2 * K:
            raise ValueError(f"act='silu' needs x [..., 2K] = [gate | up] with K = weight.shape[1] = {K}, so "
                             f"x.shape[-1] = {2 * K}; got x {tuple(x.shape)} and weight {tuple(weight.shape)}")
    elif K != x.shape[-1]:
        raise ValueError(f"weight must be [N, K] with K = x.shape[-1] = {x.shape[-1]}, got weight "
                         f"{tuple(weight.shape)} (a transposed [K, N] weight?)")
    if bias is not None and (not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (N,)):
        raise ValueError(f"bias must be None or a tensor [N] = [{N}], got {_shape(bias)}")
    _check_norm("norm_weight", "norm_eps", norm_weight, norm_eps, K, "K")
    if out_norm_weight is None and out_norm_eps is not None:
        raise ValueError(f"out_norm_eps={out_norm_eps!r} was given without out_norm_weight: pass both or neither")
    _check_norm("out_norm_weight", "out_norm_eps", out_norm_weight, out_norm_eps, N, "N")
    if residual is not None:
        want = (*x.shape[:-1], N)
        if not isinstance(residual, torch.Tensor) or tuple(residual.shape) != want:
            raise ValueError(f"residual must be None or a tensor of the output's shape {want} (x's leading dims, "
                             f"N = {N}), got {_shape(residual)}")
    _check_dtypes_devices(x, weight, bias, norm_weight, residual, out_norm_weight)


def _check_dtypes_devices(x, weight, bias, norm_weight, residual, out_norm_weight) -> None:
    """One floating dtype for the product's operands (what ``F.linear`` needs, so no backend meets
    torch's own dtype error mid-call) and one device for every tensor (metadata only: no sync)."""
    if not x.is_floating_point() or weight.dtype != x.dtype:
        raise ValueError(f"x and weight must share one dtype, a floating-point one, got x {x.dtype}, "
                         f"weight {weight.dtype}")
    for name, t in (("bias", bias), ("residual", residual)):
        if t is not None and t.dtype != x.dtype:
            raise ValueError(f"{name} must have x's dtype {x.dtype} (and weight's), got {t.dtype}")
    if norm_weight is not None and torch.promote_types(norm_weight.dtype, x.dtype) != x.dtype:
        raise ValueError(f"norm_weight's dtype {norm_weight.dtype} would promote the normalised x to "
                         f"{torch.promote_types(norm_weight.dtype, x.dtype)}, not x's and weight's dtype {x.dtype}: "
                         f"pass a norm_weight of x's dtype")
    for name, t in (("weight", weight), ("bias", bias), ("norm_weight", norm_weight), ("residual", residual),
                    ("out_norm_weight", out_norm_weight)):
        if t is not None and t.device != x.device:
            raise ValueError(f"{name} must be on x's device {x.device}, got {t.device}")


__all__ = ["MAX_M", "DTYPES", "ACTS", "prologue_ref", "gemv_ref", "check_gemv_inputs"]

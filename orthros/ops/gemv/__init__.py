"""Weight-streaming GEMV for decode (issue #18): ``y = x @ weight.T (+ bias)`` for the few rows
of a decode step (``x [..., K]`` with ``M = prod(leading dims) <= 8``, ``weight [N, K]`` in
``nn.Linear`` layout), where a matmul is a single pass over the weight and cuBLAS streams it at
~79% of the copy bandwidth on an H200 (docs/benchmarks.md), with the elementwise work around a
decoder layer's GEMMs fused into it (:mod:`.naive` is the specification):

* ``norm_weight`` / ``norm_eps``: RMSNorm of the input rows first (before QKV, before gate/up);
* ``act="silu"``: ``x = [gate | up]`` and the input is ``silu(gate) * up`` (before down);
* ``residual``: ``residual + y`` (after o_proj, after down).

:func:`gemv` is the one entry; backends:

* ``"torch"``: the unfused torch ops the layers run today (the prologue's ops, ``F.linear``
  (cuBLAS on CUDA), ``residual + y``), any ``M``;
* ``"triton"``: the streaming kernel of :mod:`.kernel` (CUDA; on a CPU only under
  ``TRITON_INTERPRET=1``), ``M <= 8``, CUDA-graph capturable, one kernel (two with split-K)
  including the prologue and the residual; called through the custom op ``orthros::gemv``
  (:data:`gemv_op`), so a ``torch.compile``d region sees it as one opaque node;
* ``"naive"``: :func:`.naive.gemv_ref`, the float32-accumulating reference;
* ``"auto"``: ``"triton"`` for CUDA inputs it takes (``M <= 8``, fp16/bf16/fp32, one dtype for
  ``x``, ``weight``, ``norm_weight``, contiguous weight, no gradient wanted: the op has no
  backward), else ``"torch"``.

The engine's decode calls it under ``Engine(gemv=True)`` (through
:func:`orthros.layers.common.linear`; opt-in, ``orthros generate --gemv``: batched decode through
it is not timed yet; measured in docs/benchmarks.md, "the GEMV tuned in the engine");
``benchmarks/gemv.py [--fused]`` times the op itself against cuBLAS and the unfused ops.
"""

from __future__ import annotations

import importlib.util
import math
from typing import Optional

import torch
import torch.nn.functional as F

from .naive import ACTS, DTYPES, MAX_M, check_gemv_inputs, gemv_ref, prologue_ref

GEMV_BACKENDS = ("auto", "torch", "triton", "naive")
_HAS_TRITON = importlib.util.find_spec("triton") is not None  # once: no import inside a compiled region


def _triton_takes(x, weight, bias, norm_weight, residual) -> bool:
    if not (isinstance(x, torch.Tensor) and isinstance(weight, torch.Tensor) and x.dim() >= 1):
        return False
    if not (x.is_cuda and weight.is_cuda and weight.device == x.device):
        return False
    if x.dtype not in DTYPES or weight.dtype != x.dtype:
        return False
    rows = math.prod(x.shape[:-1])
    if not weight.is_contiguous() or (x.shape[-1] > 1 and x.stride(-1) != 1) or rows > MAX_M:
        return False
    for t in (bias, norm_weight):
        if t is not None and (not isinstance(t, torch.Tensor) or t.device != x.device or not t.is_contiguous()):
            return False
    if norm_weight is not None and norm_weight.dtype != x.dtype:
        return False
    if residual is not None and (not isinstance(residual, torch.Tensor) or residual.device != x.device
                                 or (residual.shape[-1] > 1 and residual.stride(-1) != 1)):
        return False
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, bias, norm_weight,
                                                                                   residual)):
        return False  # the kernel has no backward: autograd gets the torch ops
    return _HAS_TRITON


# ---------------------------------------------------------------- the custom op (the triton path)

# the schema spelled out (not inferred from the annotations, which are strings under
# ``from __future__ import annotations``): the same on the GPU image's torch 2.11 and here
@torch.library.custom_op("orthros::gemv", mutates_args=(),
                         schema="(Tensor x, Tensor weight, Tensor? bias, Tensor? norm_weight, float norm_eps, "
                                "str act, Tensor? residual) -> Tensor")
def gemv_op(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
            norm_weight: Optional[torch.Tensor], norm_eps: float, act: str,
            residual: Optional[torch.Tensor]) -> torch.Tensor:
    """``orthros::gemv``: the triton GEMV with its prologue / epilogue as one op, opaque to
    ``torch.compile`` (one graph node, no graph break) and capturable in a CUDA graph. ``act``:
    ``""`` (none) or ``"silu"``; ``norm_eps`` is read only with ``norm_weight``. Use
    :func:`gemv`; this is its ``backend="triton"`` path."""
    from . import kernel  # looked up at call time (tests replace kernel.gemv_triton)

    return kernel.gemv_triton(x, weight, bias, norm_weight=norm_weight,
                              norm_eps=norm_eps if norm_weight is not None else None,
                              act=act or None, residual=residual)


@gemv_op.register_fake
def _gemv_op_fake(x, weight, bias, norm_weight, norm_eps, act, residual):
    check_gemv_inputs(x, weight, bias, norm_weight=norm_weight,
                      norm_eps=norm_eps if norm_weight is not None else None, act=act or None, residual=residual)
    return x.new_empty(*x.shape[:-1], weight.shape[0])


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
         backend: str = "auto", *, norm_weight: Optional[torch.Tensor] = None, norm_eps: Optional[float] = None,
         act: Optional[str] = None, residual: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``residual + (prologue(x) @ weight[N, K].T + bias [N])`` -> ``[..., N]`` in ``x.dtype``
    (:mod:`.naive` defines each part; every part but the matmul optional):

    * ``norm_weight [K]`` with ``norm_eps`` (float): RMSNorm of each row of ``x [..., K]`` first,
      as ``orthros.layers.common.RMSNorm`` computes it (the triton kernel needs
      ``norm_weight.dtype == x.dtype``);
    * ``act="silu"`` (not with ``norm_weight``): ``x [..., 2K] = [gate | up]``, input
      ``silu(gate) * up`` in ``x.dtype``;
    * ``residual [..., N]`` (``x.dtype``): added after the product is rounded to ``x.dtype``.

    Float32 accumulation (the kernel and the reference; ``"torch"`` accumulates as cuBLAS does).
    Bad arguments raise ``ValueError`` naming the argument before anything runs; see
    :func:`.kernel.gemv_triton` for what the ``"triton"`` backend refuses besides."""
    if backend not in GEMV_BACKENDS:
        raise ValueError(f"backend must be one of {GEMV_BACKENDS}, got {backend!r}")
    check_gemv_inputs(x, weight, bias, norm_weight=norm_weight, norm_eps=norm_eps, act=act, residual=residual)
    if backend == "auto":
        backend = "triton" if _triton_takes(x, weight, bias, norm_weight, residual) else "torch"
    if backend == "triton":
        return gemv_op(x, weight, bias, norm_weight, float(norm_eps) if norm_weight is not None else 0.0,
                       act or "", residual)
    if backend == "naive":
        return gemv_ref(x, weight, bias, norm_weight=norm_weight, norm_eps=norm_eps, act=act, residual=residual)
    y = F.linear(prologue_ref(x, norm_weight, norm_eps, act), weight, bias)
    return residual + y if residual is not None else y


__all__ = ["GEMV_BACKENDS", "MAX_M", "ACTS", "gemv", "gemv_op", "gemv_ref", "prologue_ref", "check_gemv_inputs"]

"""Weight-streaming GEMV for decode (issue #18): ``y = x @ weight.T (+ bias)`` for the few rows
of a decode step (``x [..., K]`` with ``M = prod(leading dims) <= 8``, ``weight [N, K]`` in
``nn.Linear`` layout), where a matmul is a single pass over the weight and cuBLAS streams it at
~79% of the copy bandwidth on an H200 (docs/benchmarks.md), with the elementwise work around a
decoder layer's GEMMs fused into it (:mod:`.naive` is the specification):

* ``norm_weight`` / ``norm_eps``: RMSNorm of the input rows first (before QKV, before gate/up);
* ``act="silu"``: ``x = [gate | up]`` and the input is ``silu(gate) * up`` (before down);
* ``residual``: ``residual + y`` (after o_proj, after down);
* ``out_norm_weight`` / ``out_norm_eps``: also the output's RMSNorm (after o_proj and its
  residual: the gate/up GEMV's input), written by the split-K reduce where there is one.

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

The engine's decode calls it through :func:`orthros.layers.common.linear` (``Engine(gemv=...)``:
on by default for a fused CUDA model, ``orthros generate --no-gemv`` turns it off; docs/engine.md,
and docs/issue-18-log.md, "the GEMV tuned in the engine", for its measurements);
``benchmarks/gemv.py [--fused]`` times the op itself against cuBLAS and the unfused ops.
"""

from __future__ import annotations

import importlib.util
import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F

from .naive import ACTS, DTYPES, MAX_M, check_gemv_inputs, gemv_ref, prologue_ref

GEMV_BACKENDS = ("auto", "torch", "triton", "naive")
_HAS_TRITON = importlib.util.find_spec("triton") is not None  # once: no import inside a compiled region


def _triton_takes(x, weight, bias, norm_weight, residual, out_norm_weight=None) -> bool:
    if not (isinstance(x, torch.Tensor) and isinstance(weight, torch.Tensor) and x.dim() >= 1):
        return False
    if not (x.is_cuda and weight.is_cuda and weight.device == x.device):
        return False
    if x.dtype not in DTYPES or weight.dtype != x.dtype:
        return False
    rows = math.prod(x.shape[:-1])
    if not weight.is_contiguous() or (x.shape[-1] > 1 and x.stride(-1) != 1) or rows > MAX_M:
        return False
    for t in (bias, norm_weight, out_norm_weight):
        if t is not None and (not isinstance(t, torch.Tensor) or t.device != x.device or not t.is_contiguous()):
            return False
    if any(t is not None and t.dtype != x.dtype for t in (norm_weight, out_norm_weight)):
        return False
    if residual is not None and (not isinstance(residual, torch.Tensor) or residual.device != x.device
                                 or (residual.shape[-1] > 1 and residual.stride(-1) != 1)):
        return False
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, bias, norm_weight,
                                                                                   residual, out_norm_weight)):
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


@torch.library.custom_op("orthros::gemv_norm_out", mutates_args=(),
                         schema="(Tensor x, Tensor weight, Tensor? bias, Tensor? norm_weight, float norm_eps, "
                                "str act, Tensor? residual, Tensor out_norm_weight, float out_norm_eps) "
                                "-> (Tensor, Tensor)")
def gemv_norm_out_op(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                     norm_weight: Optional[torch.Tensor], norm_eps: float, act: str,
                     residual: Optional[torch.Tensor], out_norm_weight: torch.Tensor,
                     out_norm_eps: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """``orthros::gemv_norm_out``: :data:`gemv_op` that also returns the output's RMSNorm,
    computed by its split-K reduce (:func:`.kernel.norm_out_fused` shapes only). Use
    :func:`gemv` with ``out_norm_weight``."""
    from . import kernel

    return kernel.gemv_triton(x, weight, bias, norm_weight=norm_weight,
                              norm_eps=norm_eps if norm_weight is not None else None, act=act or None,
                              residual=residual, out_norm_weight=out_norm_weight, out_norm_eps=out_norm_eps)


@gemv_norm_out_op.register_fake
def _gemv_norm_out_op_fake(x, weight, bias, norm_weight, norm_eps, act, residual, out_norm_weight, out_norm_eps):
    check_gemv_inputs(x, weight, bias, norm_weight=norm_weight,
                      norm_eps=norm_eps if norm_weight is not None else None, act=act or None, residual=residual,
                      out_norm_weight=out_norm_weight, out_norm_eps=out_norm_eps)
    y = x.new_empty(*x.shape[:-1], weight.shape[0])
    return y, torch.empty_like(y)


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
         backend: str = "auto", *, norm_weight: Optional[torch.Tensor] = None, norm_eps: Optional[float] = None,
         act: Optional[str] = None, residual: Optional[torch.Tensor] = None,
         out_norm_weight: Optional[torch.Tensor] = None, out_norm_eps: Optional[float] = None):
    """``residual + (prologue(x) @ weight[N, K].T + bias [N])`` -> ``[..., N]`` in ``x.dtype``
    (:mod:`.naive` defines each part; every part but the matmul optional):

    * ``norm_weight [K]`` with ``norm_eps`` (float): RMSNorm of each row of ``x [..., K]`` first,
      as ``orthros.layers.common.RMSNorm`` computes it (the triton kernel needs
      ``norm_weight.dtype == x.dtype``);
    * ``act="silu"`` (not with ``norm_weight``): ``x [..., 2K] = [gate | up]``, input
      ``silu(gate) * up`` in ``x.dtype``;
    * ``residual [..., N]`` (``x.dtype``): added after the product is rounded to ``x.dtype``.

    With ``out_norm_weight [N]`` / ``out_norm_eps``: the pair ``(y, yn)``, ``yn`` the RMSNorm of
    ``y`` (``rms_norm(y, out_norm_weight, out_norm_eps)``, the input of the GEMV after a residual
    add: gate/up after o_proj), or ``None`` where the triton backend would need an extra launch
    for it (a shape without split-K, :func:`.kernel.norm_out_fused`): the caller then normalises
    in the next GEMV's prologue, the same computation. With split-K the reduce, which sees each
    whole row, writes it (one program a row), so the next GEMV streams its weight without a
    norm prologue.

    Float32 accumulation (the kernel and the reference; ``"torch"`` accumulates as cuBLAS does).
    Every backend needs ``x``, ``weight``, ``bias`` and ``residual`` of one floating dtype, a
    ``norm_weight`` whose dtype does not promote ``x``'s (``F.linear`` would refuse the result),
    and every tensor on ``x``'s device. Bad arguments raise ``ValueError`` naming the argument
    before anything runs; see
    :func:`.kernel.gemv_triton` for what the ``"triton"`` backend refuses besides."""
    if backend not in GEMV_BACKENDS:
        raise ValueError(f"backend must be one of {GEMV_BACKENDS}, got {backend!r}")
    check_gemv_inputs(x, weight, bias, norm_weight=norm_weight, norm_eps=norm_eps, act=act, residual=residual,
                      out_norm_weight=out_norm_weight, out_norm_eps=out_norm_eps)
    out_norm = out_norm_weight is not None
    if backend == "auto":
        backend = "triton" if _triton_takes(x, weight, bias, norm_weight, residual, out_norm_weight) else "torch"
    eps = float(norm_eps) if norm_weight is not None else 0.0
    if backend == "triton":
        if out_norm:
            from .kernel import norm_out_fused

            if norm_out_fused(math.prod(x.shape[:-1]), *weight.shape):
                return gemv_norm_out_op(x, weight, bias, norm_weight, eps, act or "", residual, out_norm_weight,
                                        float(out_norm_eps))
            return gemv_op(x, weight, bias, norm_weight, eps, act or "", residual), None
        return gemv_op(x, weight, bias, norm_weight, eps, act or "", residual)
    if backend == "naive":
        return gemv_ref(x, weight, bias, norm_weight=norm_weight, norm_eps=norm_eps, act=act, residual=residual,
                        out_norm_weight=out_norm_weight, out_norm_eps=out_norm_eps)
    y = F.linear(prologue_ref(x, norm_weight, norm_eps, act), weight, bias)
    y = residual + y if residual is not None else y
    return (y, prologue_ref(y, out_norm_weight, out_norm_eps)) if out_norm else y


__all__ = ["GEMV_BACKENDS", "MAX_M", "ACTS", "gemv", "gemv_op", "gemv_norm_out_op", "gemv_ref", "prologue_ref", "check_gemv_inputs"]

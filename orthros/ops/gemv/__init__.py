"""Weight-streaming GEMV for decode (issue #18): ``y = x @ weight.T (+ bias)`` for the few rows
of a decode step (``x [..., K]`` with ``M = prod(leading dims) <= 8``, ``weight [N, K]`` in
``nn.Linear`` layout), where a matmul is a single pass over the weight and cuBLAS streams it at
~79% of the copy bandwidth on an H200 (docs/benchmarks.md).

:func:`gemv` is the one entry; backends:

* ``"torch"``: ``F.linear`` (cuBLAS on CUDA), any ``M``;
* ``"triton"``: the streaming kernel of :mod:`.kernel` (CUDA; on a CPU only under
  ``TRITON_INTERPRET=1``), ``M <= 8``, CUDA-graph capturable;
* ``"naive"``: :func:`.naive.gemv_ref`, the float32-accumulating reference;
* ``"auto"``: ``"triton"`` for CUDA inputs it takes (``M <= 8``, fp16/bf16/fp32, contiguous
  weight), else ``"torch"``.

Not wired into the engine: whether it beats cuBLAS is measured by ``benchmarks/gemv.py``
first (docs/benchmarks.md, "Weight-streaming GEMV for decode").
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F

from .naive import DTYPES, MAX_M, check_gemv_inputs, gemv_ref

GEMV_BACKENDS = ("auto", "torch", "triton", "naive")


def _triton_takes(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> bool:
    if not (x.is_cuda and weight.is_cuda and weight.device == x.device):
        return False
    if x.dtype not in DTYPES or weight.dtype != x.dtype:
        return False
    rows = math.prod(x.shape[:-1])
    if not weight.is_contiguous() or (x.shape[-1] > 1 and x.stride(-1) != 1) or rows > MAX_M:
        return False
    if bias is not None and (bias.device != x.device or not bias.is_contiguous()):
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
         backend: str = "auto") -> torch.Tensor:
    """``x [..., K] @ weight[N, K].T (+ bias [N])`` -> ``[..., N]`` in ``x.dtype``, float32
    accumulation (the kernel and the reference; ``"torch"`` accumulates as cuBLAS does).
    Bad shapes raise ``ValueError`` naming the argument before anything runs; see
    :func:`.kernel.gemv_triton` for what the ``"triton"`` backend refuses."""
    if backend not in GEMV_BACKENDS:
        raise ValueError(f"backend must be one of {GEMV_BACKENDS}, got {backend!r}")
    if backend == "auto":
        backend = "triton" if isinstance(x, torch.Tensor) and isinstance(weight, torch.Tensor) and \
            x.dim() >= 1 and _triton_takes(x, weight, bias) else "torch"
    if backend == "triton":
        from .kernel import gemv_triton

        return gemv_triton(x, weight, bias)
    check_gemv_inputs(x, weight, bias)
    if backend == "naive":
        return gemv_ref(x, weight, bias)
    return F.linear(x, weight, bias)


__all__ = ["GEMV_BACKENDS", "MAX_M", "gemv", "gemv_ref", "check_gemv_inputs"]

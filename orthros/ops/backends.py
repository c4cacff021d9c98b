"""Backend names of the attention ops and the one probe for "can the Triton kernels run this".

``backend`` (``OrthrosConfig.attn_backend``, every op's ``backend=`` argument):

* ``"auto"``: the Triton kernels on CUDA when they take the inputs, else ``"sdpa"``;
* ``"sdpa"``: PyTorch SDPA fast paths where one exists (training / prefill), else the reference;
* ``"reference"``: pure PyTorch, the specification;
* ``"triton"``: the Triton kernels (through the interpreter on CPU under ``TRITON_INTERPRET=1``, in fp16 /
  fp32; inputs they do not run, such as CPU tensors without it, or any input without triton installed (the
  ``orthros[kernels]`` extra), take the reference with a warning).

The decode step has no SDPA form: there ``"sdpa"`` runs the reference.
"""

from __future__ import annotations

import functools
import os
import sys
import warnings
from typing import Optional

import torch

from ..utils import install_hint

BACKENDS = ("auto", "reference", "sdpa", "triton")

TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
TRITON_MAX_HEAD_DIM = 256
# Read once: triton decides interpreter mode when the kernels are decorated (import time) too.
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
INTERPRETER_DTYPES = (torch.float16, torch.float32)  # the interpreter's bf16 tl.dot is wrong (triton 3.9)


def check_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    return backend


def triton_supports(q: torch.Tensor, k: torch.Tensor) -> bool:
    """True when the Triton kernels take these inputs: CUDA tensors of fp16/bf16/fp32,
    head_dim <= 256, GQA (Hq a multiple of Hkv), and an importable ``triton``."""
    if not (q.is_cuda and k.is_cuda):
        return False
    ok = (q.dtype in TRITON_DTYPES and k.dtype == q.dtype and q.dim() == 4 and k.dim() == 4
          and 1 <= q.shape[-1] <= TRITON_MAX_HEAD_DIM and k.shape[-1] == q.shape[-1]
          and k.shape[2] > 0 and q.shape[2] % k.shape[2] == 0)
    if not ok:
        return False
    return _importable()


def triton_runs(q: torch.Tensor, k: torch.Tensor) -> bool:
    """Whether the Triton kernels run these inputs: :func:`triton_supports` (CUDA), or fp16 / fp32
    under the interpreter (``TRITON_INTERPRET=1``, CPU)."""
    return triton_supports(q, k) or (INTERPRET and q.dtype in INTERPRETER_DTYPES and _importable())


@functools.cache
def _importable() -> bool:
    """Whether triton imports (asked once: triton_supports runs in every layer's forward on CUDA)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def _why_not_triton(q: torch.Tensor, k: torch.Tensor) -> str:
    """Why :func:`triton_runs` refuses ``q``, ``k`` (for the warning: the user sees what to change)."""
    if not (q.is_cuda and k.is_cuda):
        if INTERPRET and not _importable():
            return f"triton is not importable ({install_hint('kernels')})"
        if INTERPRET:
            return f"dtype {q.dtype}: the Triton interpreter (TRITON_INTERPRET=1) runs fp16 and fp32 only"
        return f"{q.device} tensors: the kernels run on CUDA, on a CPU only with TRITON_INTERPRET=1 set before import"
    if q.dtype not in TRITON_DTYPES or k.dtype != q.dtype:
        return f"dtype {q.dtype} (keys {k.dtype}): the kernels take one of fp16, bf16, fp32"
    if not 1 <= q.shape[-1] <= TRITON_MAX_HEAD_DIM:
        return f"head_dim {q.shape[-1]}: the kernels take 1 to {TRITON_MAX_HEAD_DIM}"
    if k.shape[2] == 0 or q.shape[2] % k.shape[2]:
        return f"{q.shape[2]} query heads for {k.shape[2]} key heads (GQA needs a multiple)"
    return f"triton is not importable ({install_hint('kernels')})"


def stacklevel_outside_ops() -> int:
    """The ``stacklevel`` (counted from the caller) of the first frame outside ``orthros/ops`` and
    torch (a model's layers reach the ops through torch's wrappers): the user's call (or the
    layer's), however many frames lie between."""
    skip = tuple(os.path.dirname(os.path.abspath(f)) + os.sep for f in (__file__, torch.__file__))
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(skip):
        frame, level = frame.f_back, level + 1
    return level


def reference_instead(op: str, q: torch.Tensor, k: Optional[torch.Tensor] = None) -> None:
    """The warning of an op asked for ``"triton"`` on inputs the kernels do not run: it says why, and
    points at the first frame outside the ops (the call to change, not an ops line)."""
    warnings.warn(f"{op}: input not supported by the Triton kernels ({_why_not_triton(q, q if k is None else k)}); "
                  f"using the reference", stacklevel=stacklevel_outside_ops())


def resolve_backend(backend: str, q: torch.Tensor, k: torch.Tensor) -> str:
    """``"auto"`` -> ``"triton"`` or ``"sdpa"`` for these inputs; other names of :data:`BACKENDS`
    unchanged; any other name is a ``ValueError`` listing them."""
    check_backend(backend)
    if backend == "auto":
        return "triton" if triton_supports(q, k) else "sdpa"
    return backend


def use_triton(backend: str, q: torch.Tensor, k: torch.Tensor, op: str) -> bool:
    """Whether an op given ``backend`` runs its Triton kernel: ``"auto"`` where the kernels take the
    inputs; ``"triton"`` where they run (else the reference, with :func:`reference_instead`'s warning:
    ``"triton"`` on a CPU without the interpreter, as the training op does)."""
    if resolve_backend(backend, q, k) != "triton":
        return False
    if backend == "triton" and not triton_runs(q, k):
        reference_instead(op, q, k)
        return False
    return True


__all__ = ["BACKENDS", "INTERPRET", "TRITON_DTYPES", "TRITON_MAX_HEAD_DIM", "check_backend", "reference_instead",
           "resolve_backend", "triton_runs", "triton_supports", "use_triton"]

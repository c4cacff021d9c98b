"""Backend names of the attention ops and the one probe for "can the Triton kernels run this".

``backend`` (``OrthrosConfig.attn_backend``, every op's ``backend=`` argument):

* ``"auto"``: the Triton kernels on CUDA when they take the inputs, else ``"sdpa"``;
* ``"sdpa"``: PyTorch SDPA fast paths where one exists (training / prefill), else the reference;
* ``"reference"``: pure PyTorch, the specification;
* ``"triton"``: the Triton kernels (through the interpreter on CPU under ``TRITON_INTERPRET=1``).

The decode step has no SDPA form: there ``"sdpa"`` runs the reference.
"""

from __future__ import annotations

import torch

BACKENDS = ("auto", "reference", "sdpa", "triton")

TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
TRITON_MAX_HEAD_DIM = 256


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
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def resolve_backend(backend: str, q: torch.Tensor, k: torch.Tensor) -> str:
    """``"auto"`` -> ``"triton"`` or ``"sdpa"`` for these inputs; other names unchanged."""
    if backend == "auto":
        return "triton" if triton_supports(q, k) else "sdpa"
    return backend


__all__ = ["BACKENDS", "TRITON_DTYPES", "TRITON_MAX_HEAD_DIM", "check_backend", "triton_supports", "resolve_backend"]

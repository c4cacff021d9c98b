"""Triton kernels of Orthros attention (training, prefill, decode).

* :func:`orthros_attention_triton` -- same contract as
  :func:`orthros.ops.reference.orthros_attention_reference`, forward and backward.
* :func:`orthros_decode_attention` -- one decode step for a static KV cache (both streams,
  one split-K launch plus a merge, CUDA-graph capturable).
* :func:`supports` -- whether the kernels take these inputs (``backend="auto"`` asks it).
"""

from __future__ import annotations

import torch

from .attention import orthros_attention_triton
from .decode import orthros_decode_attention_triton as orthros_decode_attention

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 256


def supports(q: torch.Tensor, k: torch.Tensor) -> bool:
    """True when the Triton kernels take these inputs: CUDA tensors of fp16/bf16/fp32,
    head_dim <= 256, GQA (Hq a multiple of Hkv). Anything else goes to the reference."""
    return (
        q.is_cuda and k.is_cuda
        and q.dtype in SUPPORTED_DTYPES and k.dtype == q.dtype
        and q.dim() == 4 and k.dim() == 4
        and 1 <= q.shape[-1] <= MAX_HEAD_DIM and k.shape[-1] == q.shape[-1]
        and k.shape[2] > 0 and q.shape[2] % k.shape[2] == 0
    )


__all__ = ["supports", "orthros_attention_triton", "orthros_decode_attention", "SUPPORTED_DTYPES", "MAX_HEAD_DIM"]

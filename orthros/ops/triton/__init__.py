"""Triton kernels of Orthros attention, one file per op (FLA's layout):

* :mod:`.attention` -- training / prefill: the window and full streams' forward and backward
  kernels, their host code and autograd; :func:`orthros_attention_triton` has the contract of
  :func:`orthros.ops.reference.orthros_attention_reference`.
* :mod:`.decode` -- one decode step against a static KV cache (both streams, one split-K
  launch plus a merge, CUDA-graph capturable): :func:`decode_attention_triton`, and
  :func:`decode_qkv_attention_triton` (the same from the raw QKV projection: q/k norm, RoPE
  and the cache write in the kernel).
* :mod:`.common` -- what both share: sizing helpers and the jit building blocks (visibility
  mask, online-softmax step, log-sum-exp merge).

Whether the kernels take an input is :func:`orthros.ops.backends.triton_supports`.
"""

from __future__ import annotations

from .attention import orthros_attention_triton
from .decode import decode_attention_triton, decode_qkv_attention_triton

__all__ = ["orthros_attention_triton", "decode_attention_triton", "decode_qkv_attention_triton"]

"""Functional ops: the Orthros attention op (reference + kernels behind one signature)."""

from .attention import BACKENDS, doc_ids_from_cu_seqlens, normalize_out_positions, orthros_attention
from .reference import full_attention_reference, orthros_attention_reference, window_attention_reference
from .decode import decode_attention_reference, orthros_decode_attention  # decode step (Triton on CUDA)

__all__ = [
    "BACKENDS",
    "orthros_attention",
    "orthros_attention_reference",
    "window_attention_reference",
    "full_attention_reference",
    "normalize_out_positions",
    "doc_ids_from_cu_seqlens",
]

"""Functional ops: the Orthros attention op (reference + kernels behind one signature), the
decode step, and partial attention with log-sum-exp for merging across key shards. Subpackages
with their own reference beside the kernels: ``orthros.ops.gdn`` (the two-stream gated delta
rule) and ``orthros.ops.gemv`` (the weight-streaming GEMV for decode's few rows)."""

from .backends import BACKENDS, resolve_backend, triton_supports
from .attention import doc_ids_from_cu_seqlens, normalize_output_positions, orthros_attention, run_attention
from .decode import decode_attention_reference, orthros_decode_attention
from .merge import merge_partials, partial_attention
from .reference import full_attention_reference, orthros_attention_reference, window_attention_reference

__all__ = [
    "BACKENDS",
    "resolve_backend",
    "triton_supports",
    "orthros_attention",
    "run_attention",
    "orthros_decode_attention",
    "partial_attention",
    "merge_partials",
    "orthros_attention_reference",
    "window_attention_reference",
    "full_attention_reference",
    "decode_attention_reference",
    "normalize_output_positions",
    "doc_ids_from_cu_seqlens",
]

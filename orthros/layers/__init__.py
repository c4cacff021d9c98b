"""Layers: the Orthros attention module and the token-wise backbone blocks."""

from .attention import AttentionInputs, OrthrosAttention
from .common import RMSNorm, RotaryEmbedding, SwiGLUMLP, apply_rope

__all__ = ["AttentionInputs", "OrthrosAttention", "RMSNorm", "RotaryEmbedding", "SwiGLUMLP", "apply_rope"]

"""Layers: the Orthros attention module, the step protocol every execution path shares, the
layer-kind vocabulary, and the token-wise backbone blocks."""

from .attention import SCALE_OFFSET_INIT, OrthrosAttention, Streams
from .common import FusedProjections, ResidualMLP, RMSNorm, RotaryEmbedding, SwiGLUMLP, apply_rope
from ..kinds import ATTENTION_MODES, LAYER_TYPES, MODE_ALIASES, MODE_DISPLAY, resolve_layer_types, resolve_mode
from .step import DenseKV, StepInputs

__all__ = ["OrthrosAttention", "Streams", "SCALE_OFFSET_INIT", "StepInputs", "DenseKV", "FusedProjections", "ResidualMLP", "RMSNorm", "RotaryEmbedding",
           "SwiGLUMLP", "apply_rope", "ATTENTION_MODES", "LAYER_TYPES", "MODE_ALIASES", "MODE_DISPLAY",
           "resolve_layer_types", "resolve_mode"]

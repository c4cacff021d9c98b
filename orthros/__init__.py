"""Orthros: sliding-window attention over every token, full attention only where tokens are predicted.

``import orthros`` registers the ``"orthros"`` model type with transformers' Auto classes, and the
inference engine behind ``OrthrosForCausalLM.generate()`` (on CUDA, where it serves the request).
"""

from .layers import OrthrosAttention
from .models import OrthrosCache, OrthrosConfig, OrthrosForCausalLM, OrthrosModel
from .ops import orthros_attention
from .conversion import convert_from_hf
from . import engine  # noqa: F401  (registers the engine behind OrthrosForCausalLM.generate)

__version__ = "0.1.0"

__all__ = [
    "orthros_attention",
    "OrthrosAttention",
    "OrthrosConfig",
    "OrthrosModel",
    "OrthrosForCausalLM",
    "OrthrosCache",
    "convert_from_hf",
]

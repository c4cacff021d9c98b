"""Conversion of pretrained Llama / Qwen2 / Qwen3 / Mistral checkpoints to Orthros (paper Section 4.3).

``convert_from_hf`` returns an in-memory model; ``convert_checkpoint`` (the ``orthros convert``
command) streams a checkpoint directory into an Orthros checkpoint directory.
"""

from .architectures import SUPPORTED_ARCHITECTURES, UnsupportedModelError
from .convert import convert_checkpoint, convert_from_hf
from .safetensors_io import SafetensorsError

__all__ = ["convert_from_hf", "convert_checkpoint", "SUPPORTED_ARCHITECTURES", "UnsupportedModelError",
           "SafetensorsError"]

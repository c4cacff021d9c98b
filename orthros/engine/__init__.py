"""Fast inference for Orthros models: static KV cache, chunked prefill that runs only what
Orthros needs, CUDA-graph decode, device-side sampling, streaming, multi-turn continuation.
See ``docs/engine.md``."""

from ..models.modeling_orthros import register_generate_backend
from .cache import StaticKVCache
from .engine import DEFAULT_PREFILL_CHUNK, Engine
from .hf_generate import engine_generate, release_engine
from .sampling import SamplingParams, filter_logits, sample

register_generate_backend(engine_generate)  # model.generate() takes the engine where it helps

__all__ = ["Engine", "StaticKVCache", "release_engine", "SamplingParams", "sample", "filter_logits", "DEFAULT_PREFILL_CHUNK"]

"""Fast inference for Orthros models: static KV cache, chunked prefill that runs only what
Orthros needs, CUDA-graph decode, device-side sampling, streaming, multi-turn continuation.
See ``docs/engine.md``."""

from .cache import StaticKVCache
from .engine import DEFAULT_PREFILL_CHUNK, Engine
from .sampling import SamplingParams, filter_logits, sample

__all__ = ["Engine", "StaticKVCache", "SamplingParams", "sample", "filter_logits", "DEFAULT_PREFILL_CHUNK"]

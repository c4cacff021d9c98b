"""Models the inference benchmarks run: the Qwen3-8B architecture with random weights (latency
does not depend on weight values) as an Orthros model and as HF transformers' Qwen3."""

from __future__ import annotations

import torch

QWEN3_8B = dict(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=1048576,
                rms_norm_eps=1e-6, tie_word_embeddings=False)
ROPE_THETA = 1000000.0
# A model small enough for CPU smoke runs of the benchmark code.
TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=65536, rms_norm_eps=1e-6,
            tie_word_embeddings=False)
PRESETS = {"qwen3-8b": QWEN3_8B, "tiny": TINY}


def orthros_model(preset: str = "qwen3-8b", *, path=None, device="cuda", dtype=torch.bfloat16, window_size=128):
    """An OrthrosForCausalLM: loaded from ``path``, else ``preset`` with random weights."""
    from transformers import AutoModelForCausalLM

    from ..models import OrthrosConfig

    if path is not None:
        return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    cfg = OrthrosConfig(**PRESETS[preset], qk_norm=True, window_size=window_size,
                        rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA})
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    return model.eval()


def hf_qwen3_like(orthros_config, *, device="cuda", dtype=torch.bfloat16):
    """HF transformers' Qwen3 with the same shape as ``orthros_config``, random weights."""
    from transformers import AutoModelForCausalLM, Qwen3Config

    c = orthros_config
    cfg = Qwen3Config(vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                      num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
                      num_key_value_heads=c.num_key_value_heads, head_dim=c.head_dim,
                      max_position_embeddings=c.max_position_embeddings, rms_norm_eps=c.rms_norm_eps,
                      rope_theta=c.rope_parameters.get("rope_theta", 10000.0), tie_word_embeddings=False)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    return model.eval()


def register_noattn():
    """An HF attention implementation that does nothing (returns the queries): the 'no-attention
    floor', everything of the model except attention."""
    from transformers import AttentionInterface

    def noattn(module, query, key, value, attention_mask, **kwargs):
        return query.transpose(1, 2).contiguous(), None

    AttentionInterface.register("noattn", noattn)
    return "noattn"


def weight_bytes_per_step(model) -> int:
    """Bytes of weights one decode step reads: every parameter except the embedding table
    (a lookup reads one row)."""
    emb = model.get_input_embeddings().weight
    return sum(p.numel() * p.element_size() for p in model.parameters() if p is not emb)


__all__ = ["PRESETS", "QWEN3_8B", "TINY", "orthros_model", "hf_qwen3_like", "register_noattn",
           "weight_bytes_per_step"]

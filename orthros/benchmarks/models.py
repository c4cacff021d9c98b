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
# Orthros-H (docs/hybrid.md): the Qwen3.5-9B text shape (transformers' ``Qwen3_5TextConfig``
# defaults: 32 layers, GDN:attention 3:1, gated attention 16 q / 4 kv heads of 256, partial RoPE
# 0.25, GDN 16 k / 32 v heads of 128, conv 4), and a tiny one for CPU smoke runs.
QWEN3_5_9B = dict(vocab_size=248320, hidden_size=4096, intermediate_size=12288, num_hidden_layers=32,
                  num_attention_heads=16, num_key_value_heads=4, head_dim=256, max_position_embeddings=262144,
                  rms_norm_eps=1e-6, tie_word_embeddings=False, linear_num_key_heads=16, linear_num_value_heads=32,
                  linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4)
TINY_H = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, max_position_embeddings=65536, rms_norm_eps=1e-6,
              tie_word_embeddings=False, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
              linear_value_head_dim=16, linear_conv_kernel_dim=4)
PRESETS = {"qwen3-8b": QWEN3_8B, "tiny": TINY, "qwen3.5-9b": QWEN3_5_9B, "tiny-h": TINY_H}
HYBRID_PRESETS = ("qwen3.5-9b", "tiny-h")  # Orthros-H: GDN layers, an Orthros attention layer every 4th


def orthros_config(preset: str = "qwen3-8b", *, path=None, window_size=128):
    """The OrthrosConfig :func:`orthros_model` builds: the checkpoint ``path``'s (read, nothing
    loaded), else ``preset``'s."""
    from ..kinds import hybrid_layout
    from ..models import OrthrosConfig

    if path is not None:
        return OrthrosConfig.from_pretrained(str(path), local_files_only=True)
    if preset not in PRESETS:
        raise ValueError(f"preset {preset!r}: choose from {', '.join(PRESETS)}")
    if preset in HYBRID_PRESETS:
        return OrthrosConfig(**PRESETS[preset], qk_norm=True, attn_output_gate=True, window_size=window_size,
                             rope_parameters={"rope_type": "default", "rope_theta": 10000000.0,
                                              "partial_rotary_factor": 0.25},
                             **hybrid_layout("orthros-h", PRESETS[preset]["num_hidden_layers"]))
    return OrthrosConfig(**PRESETS[preset], qk_norm=True, window_size=window_size,
                         rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA})


def orthros_model(preset: str = "qwen3-8b", *, path=None, device="cuda", dtype=torch.bfloat16, window_size=128):
    """An OrthrosForCausalLM: loaded from ``path``, else ``preset`` with random weights (the
    hybrid presets build Orthros-H, whose ``attention_mode="full"`` is the Linear Hybrid)."""
    from transformers import AutoModelForCausalLM

    if path is not None:
        return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(orthros_config(preset, window_size=window_size), dtype=dtype)
    return model.eval()


def meta_model(preset: str = "qwen3-8b", *, path=None, dtype=torch.bfloat16, window_size=128):
    """The model :func:`orthros_model` builds, on the meta device: its shapes, nothing allocated and
    nothing read but ``path``'s config (what a run will need, before it starts)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(orthros_config(preset, path=path, window_size=window_size),
                                                dtype=dtype)


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


__all__ = ["HYBRID_PRESETS", "PRESETS", "QWEN3_5_9B", "QWEN3_8B", "TINY", "TINY_H", "meta_model", "orthros_config", "orthros_model", "hf_qwen3_like", "register_noattn",
           "weight_bytes_per_step"]

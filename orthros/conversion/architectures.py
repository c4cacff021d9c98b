"""What each supported source architecture means in Orthros terms.

A source config becomes an :class:`OrthrosConfig` (same backbone, attention swapped), and each
source tensor name becomes an Orthros tensor name. The four supported families already use
the Llama parameter names Orthros uses, so the name map is the identity; what differs per
family is which biases and norms exist, and that is a config question.
"""

from __future__ import annotations

import re

from . import qwen3_5

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "MistralForCausalLM",
                           qwen3_5.ARCHITECTURE)
_MODEL_TYPES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                "mistral": "MistralForCausalLM", **qwen3_5.MODEL_TYPES}

# source tensors that carry no weights of their own: dropped, and said so in the report
_DROPPABLE = [
    (re.compile(r"^model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq$"), "RoPE buffer, recomputed from the config"),
    *qwen3_5.DROPPABLE,
]


class UnsupportedModelError(ValueError):
    """The source model cannot be converted (architecture, config or tensors)."""


def unsupported_message(arch) -> str:
    if arch in qwen3_5.REFUSED:
        return f"cannot convert architecture {arch!r}: {qwen3_5.REFUSED[arch]}"
    if isinstance(arch, str) and arch.startswith("Orthros"):
        return (f"cannot convert architecture {arch!r}: it is an Orthros checkpoint already; load it as it is "
                f"(AutoModelForCausalLM.from_pretrained, orthros generate)")
    return (f"cannot convert architecture {arch!r}: supported architectures are "
            f"{', '.join(SUPPORTED_ARCHITECTURES)}")


def architecture_of(config_dict: dict) -> str:
    """The source architecture named by a config.json dict (``architectures`` or ``model_type``)."""
    archs = config_dict.get("architectures") or []
    if isinstance(archs, str):
        archs = [archs]
    if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        raise UnsupportedModelError(f"config.json: 'architectures' must be a list of class names, got {archs!r}")
    if len(archs) > 1:
        raise UnsupportedModelError(f"config.json lists several architectures {archs}; expected exactly one of "
                                    f"{', '.join(SUPPORTED_ARCHITECTURES)}")
    if archs:
        return archs[0]
    mt = config_dict.get("model_type")
    if mt in _MODEL_TYPES:
        return _MODEL_TYPES[mt]
    raise UnsupportedModelError(unsupported_message(mt or "<config.json names no architecture>"))


def check_supported(arch: str):
    if arch not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedModelError(unsupported_message(arch))


def orthros_config_from(src, arch: str, *, window_size: int, scale_offset: bool, dtype=None):
    """``(OrthrosConfig, notes)`` for a transformers config ``src`` of architecture ``arch``.

    ``notes``: human-readable facts the user should know (kept in the conversion report).
    """
    from ..models import OrthrosConfig  # here, so `orthros convert --help` starts without torch

    check_supported(arch)
    g = lambda name, default=None: getattr(src, name, default)  # noqa: E731
    notes = []
    extra = {}
    heads = src.num_attention_heads
    head_dim = g("head_dim") or src.hidden_size // heads
    rope = dict(g("rope_parameters") or {})
    if not rope:  # transformers < 5 style config object
        rope = dict(g("rope_scaling") or {})
        rope.setdefault("rope_theta", g("rope_theta", 10000.0))
    rope.setdefault("rope_type", rope.pop("type", "default"))

    if arch == "LlamaForCausalLM":
        qkv_bias = o_bias = bool(g("attention_bias", False))
        mlp_bias, qk_norm = bool(g("mlp_bias", False)), False
    elif arch == "Qwen2ForCausalLM":  # bias on q/k/v, none on o_proj (fixed by the architecture)
        qkv_bias, o_bias, mlp_bias, qk_norm = True, False, False, False
    elif arch == "Qwen3ForCausalLM":  # attention_bias applies to q/k/v/o; per-head RMSNorm on q and k
        qkv_bias = o_bias = bool(g("attention_bias", False))
        mlp_bias, qk_norm = False, True
    elif arch == qwen3_5.ARCHITECTURE:  # GDN + gated attention hybrid -> Orthros-H (conversion/qwen3_5.py)
        extra, more = qwen3_5.config_kwargs(src)
        notes += more
        rope = extra.pop("rope_parameters")
        qkv_bias, o_bias = extra.pop("attention_bias"), extra.pop("o_proj_bias")
        mlp_bias, qk_norm = extra.pop("mlp_bias"), extra.pop("qk_norm")
    else:  # MistralForCausalLM: no biases
        qkv_bias = o_bias = mlp_bias = qk_norm = False
    if arch != qwen3_5.ARCHITECTURE and rope.get("partial_rotary_factor", 1.0) != 1.0:
        notes.append(f"config.json sets partial_rotary_factor={rope.pop('partial_rotary_factor')}, which transformers' "
                     f"{arch} ignores (its RoPE rotates the whole head); so does the converted model")

    if rope["rope_type"] == "longrope" and rope.get("original_max_position_embeddings"):
        n = rope["original_max_position_embeddings"]
        notes.append(f"the source's longrope RoPE switches every position to long_factor once a sequence exceeds "
                     f"original_max_position_embeddings={n} tokens; the converted model keeps short_factor at every "
                     f"length, so it matches the source only for sequences of at most min(window_size, {n}) tokens")
    if rope["rope_type"] == "dynamic":  # transformers' dynamic_rope_update; Orthros's RoPE is computed once
        n = g("max_position_embeddings")
        notes.append(f"the source's dynamic (NTK) RoPE rescales its frequencies once a sequence exceeds "
                     f"max_position_embeddings={n} tokens; the converted model keeps the unscaled frequencies at "
                     f"every length, so beyond {n} tokens it no longer extends the source's RoPE as the source does")

    # Source models that are themselves (partly) sliding-window models
    sw = g("sliding_window")
    layer_types = g("layer_types")
    if arch == "MistralForCausalLM" and sw is not None:
        notes.append(f"the source uses sliding-window attention of {sw} tokens in every layer; the converted "
                     f"model's output stream attends to all tokens, so it matches the source only for "
                     f"sequences of at most min(window_size, {sw}) tokens")
    elif arch in ("Qwen2ForCausalLM", "Qwen3ForCausalLM") and layer_types and sw is not None \
            and "sliding_attention" in layer_types:
        idx = [i for i, t in enumerate(layer_types) if t == "sliding_attention"]
        notes.append(f"the source uses sliding-window attention of {sw} tokens in layers {idx}; the converted "
                     f"model matches it only for sequences of at most min(window_size, {sw}) tokens")

    cfg = OrthrosConfig(
        vocab_size=src.vocab_size,
        hidden_size=src.hidden_size,
        intermediate_size=src.intermediate_size,
        num_hidden_layers=src.num_hidden_layers,
        num_attention_heads=heads,
        num_key_value_heads=g("num_key_value_heads") or heads,
        head_dim=head_dim,
        hidden_act=g("hidden_act", "silu"),
        max_position_embeddings=g("max_position_embeddings", 131072),
        initializer_range=g("initializer_range", 0.02),
        rms_norm_eps=g("rms_norm_eps", 1e-6),
        tie_word_embeddings=bool(g("tie_word_embeddings", False)),
        rope_parameters=rope,
        attention_bias=qkv_bias,
        o_proj_bias=o_bias,
        mlp_bias=mlp_bias,
        qk_norm=qk_norm,
        window_size=window_size,
        scale_offset=scale_offset,
        pad_token_id=g("pad_token_id"),
        bos_token_id=g("bos_token_id"),
        eos_token_id=g("eos_token_id"),
        **extra,
    )
    cfg.architectures = ["OrthrosForCausalLM"]
    if dtype is not None:
        cfg.dtype = dtype
    return cfg, notes


def value_transforms(arch: str, names) -> dict:
    """``{source name: (description, fn)}`` of the tensors whose values change on the way."""
    return qwen3_5.transforms(names) if arch == qwen3_5.ARCHITECTURE else {}


def droppable_reason(name: str):
    for pat, reason in _DROPPABLE:
        if pat.match(name):
            return reason
    return None


__all__ = ["SUPPORTED_ARCHITECTURES", "UnsupportedModelError", "architecture_of", "check_supported",
           "orthros_config_from", "droppable_reason", "unsupported_message",
           "value_transforms"]

"""Qwen3.5 text checkpoints (transformers' ``Qwen3_5ForCausalLM``) -> Orthros-H.

Qwen3.5 is the paper's "Linear Hybrid": Gated DeltaNet layers (``linear_attn``) and gated full
attention layers (``self_attn``), 3:1. Orthros-H keeps every weight and swaps the attention
layers' kind to ``orthros_attention``; its GDN layers gain the output stream (the output
token's query bypasses the short convolution and reads the base stream's state), which has
no weights of its own. Converting to ``attention_mode="full"`` instead gives the Linear Hybrid
baseline in Orthros's code, which computes what the source computes.

What changes besides the kind of the attention layers:

* Qwen3.5's RMSNorms (decoder norms, final norm, q/k norms) are zero-centred, ``x * (1 + w)``;
  Orthros's are ``x * w``: the converted weight is ``1 + w`` (the GDN's gated norm already
  is ``x * w``, copied as is).
* the attention output gate (``q_proj`` holds query and gate per head) maps to
  ``OrthrosConfig.attn_output_gate`` with the same layout: a rename.
* RoPE: Qwen3.5's multimodal RoPE sections coincide with plain RoPE for text (all three
  position grids equal), partial rotary factor kept.
* ``mtp.*`` (multi-token-prediction head, unused by ``Qwen3_5ForCausalLM``) is dropped.

Refused, before anything is written: multimodal checkpoints (``Qwen3_5ForConditionalGeneration``),
the MoE variant, layer kinds other than ``linear_attention`` / ``full_attention``, models
without any attention layer, a missing attention output gate, and ``hidden_act`` other than
silu (the GDN's convolution activation).
"""

from __future__ import annotations

import re

ARCHITECTURE = "Qwen3_5ForCausalLM"
MODEL_TYPES = {"qwen3_5_text": ARCHITECTURE}
REFUSED = {
    "Qwen3_5ForConditionalGeneration": "the multimodal Qwen3.5 checkpoint: convert its text model "
                                       "(Qwen3_5ForCausalLM, `model.language_model`) instead",
    "Qwen3_5MoeForCausalLM": "the mixture-of-experts variant (Orthros has dense MLPs only)",
    "Qwen3_5MoeForConditionalGeneration": "the multimodal mixture-of-experts variant",
    "Qwen3NextForCausalLM": "Qwen3-Next (mixture-of-experts MLPs; Orthros has dense MLPs only)",
}
DROPPABLE = [(re.compile(r"^mtp\."), "multi-token-prediction head, not part of Qwen3_5ForCausalLM")]
# zero-centred RMSNorm weights w (Qwen3.5 computes x * (1 + w)); Orthros stores 1 + w
_ZERO_CENTRED = re.compile(r"^model\.(norm|layers\.\d+\.(input_layernorm|post_attention_layernorm|"
                           r"self_attn\.q_norm|self_attn\.k_norm))\.weight$")
_SOURCE_LAYER_TYPES = {"linear_attention": "linear_attention", "full_attention": None}


def _refuse(msg):
    from .architectures import UnsupportedModelError

    raise UnsupportedModelError(f"cannot convert this Qwen3.5 checkpoint: {msg}")


def config_kwargs(src, attention_mode: str = "orthros") -> tuple[dict, list]:
    """The Qwen3.5-specific ``OrthrosConfig`` fields for a ``Qwen3_5TextConfig`` ``src``, and
    notes for the report. ``attention_mode``: ``"orthros"`` (Orthros-H) or ``"full"`` (the
    Linear Hybrid, the source's own computation)."""
    g = lambda name, default=None: getattr(src, name, default)  # noqa: E731
    types = list(g("layer_types") or [])
    n = src.num_hidden_layers
    if len(types) != n:
        _refuse(f"layer_types has {len(types)} entries for {n} layers")
    bad = sorted(set(types) - set(_SOURCE_LAYER_TYPES))
    if bad:
        _refuse(f"layer kinds {bad} are not supported (supported: {sorted(_SOURCE_LAYER_TYPES)})")
    if "full_attention" not in types:
        _refuse("it has no attention layer (pure GDN): there is nothing for Orthros attention to replace")
    if g("attn_output_gate", True) is False:
        _refuse("attn_output_gate=False is not a Qwen3.5 layout")
    if g("hidden_act", "silu") != "silu":  # transformers' GDN applies it after the short convolution
        _refuse(f"hidden_act={g('hidden_act')!r}: Orthros's Gated DeltaNet applies silu after its short "
                f"convolution (every Qwen3.5 checkpoint uses silu)")
    for name in ("num_experts", "moe_intermediate_size"):
        if g(name):
            _refuse(f"{name}={g(name)} (mixture-of-experts MLPs are not supported)")
    attn_type = {"orthros": "orthros_attention", "full": "full_attention"}[attention_mode]
    layer_types = [attn_type if t == "full_attention" else "linear_attention" for t in types]
    rope = dict(g("rope_parameters") or {})
    rope.setdefault("rope_type", rope.pop("type", "default"))
    for key in ("mrope_section", "mrope_interleaved"):  # text positions: all sections equal plain RoPE
        rope.pop(key, None)
    kw = dict(
        layer_types=layer_types,
        attention_mode=attention_mode,
        attn_output_gate=True,
        qk_norm=True,
        attention_bias=bool(g("attention_bias", False)),
        o_proj_bias=bool(g("attention_bias", False)),
        mlp_bias=False,
        rope_parameters=rope,
        linear_num_key_heads=src.linear_num_key_heads,
        linear_num_value_heads=src.linear_num_value_heads,
        linear_key_head_dim=src.linear_key_head_dim,
        linear_value_head_dim=src.linear_value_head_dim,
        linear_conv_kernel_dim=src.linear_conv_kernel_dim,
    )
    n_attn = types.count("full_attention")
    notes = [f"Qwen3.5 hybrid: {n - n_attn} Gated DeltaNet layer{'s' * (n - n_attn != 1)} and {n_attn} attention "
             f"layer{'s' * (n_attn != 1)} "
             f"(now {attn_type}); zero-centred RMSNorm weights w stored as 1 + w"]
    if attention_mode == "orthros" and n_attn < n:  # without GDN layers it is the source at T <= window_size
        notes.append("GDN layers gain the output stream (the output token's query bypasses the short convolution "
                     "and reads the base stream's state): unlike the attention layers at T <= window_size, this "
                     "changes the model's outputs from the first token on, so expect to train before use")
    return kw, notes


def transforms(names) -> dict:
    """``{source tensor name: (description, fn)}`` for the tensors whose values change. ``fn`` returns
    float32 (1 + w as Qwen3.5 computes it), which the caller casts to the result's dtype once: rounded to
    a bf16 source's dtype first, ``--dtype fp32`` kept that rounding (up to 2^-8)."""
    out = {}
    for n in names:
        if _ZERO_CENTRED.match(n):
            out[n] = ("1 + w (zero-centred RMSNorm)", lambda t: t.float() + 1.0)
    return out


__all__ = ["ARCHITECTURE", "MODEL_TYPES", "REFUSED", "DROPPABLE", "config_kwargs", "transforms"]

"""``train_flops`` (the MFU numerator) against the model it describes: its projection FLOPs are
2 per weight of the real model's linear layers and convolution a token, its attention FLOPs
count the (query, key) pairs a brute-force mask allows, and Gated DeltaNet layers are counted
as GDN layers (they were counted as attention layers: quadratic in the sequence)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from orthros.kinds import hybrid_layout
from orthros.models import OrthrosConfig, OrthrosForCausalLM
from orthros.training.metrics import train_flops

SHAPE = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, window_size=8, linear_num_key_heads=2, linear_num_value_heads=4,
             linear_key_head_dim=8, linear_value_head_dim=12)
ARCHS = {"orthros": {"attention_mode": "orthros"}, "transformer": {"attention_mode": "full"},
         "swa": {"attention_mode": "window"}, **{h: hybrid_layout(h, 4) for h in ("orthros-h", "linear-hybrid", "gdn")}}


def brute_keys(seg_lens, mode, window):
    """(query, key) pairs of the base stream, one segment (document) at a time."""
    n = 0
    for s in seg_lens:
        for t in range(s):
            n += min(t + 1, window) if mode in ("orthros", "window") else t + 1
    return n


@pytest.mark.parametrize("arch", list(ARCHS))
def test_base_tokens_cost_what_the_model_computes(arch):
    cfg = OrthrosConfig(**SHAPE, **ARCHS[arch])
    with torch.device("meta"):
        model = OrthrosForCausalLM(cfg)
    layers = model.model.layers
    linear = sum(m.weight.numel() for m in layers.modules() if isinstance(m, nn.Linear))
    conv = sum(m.weight.numel() for m in layers.modules() if isinstance(m, nn.Conv1d))
    types = list(cfg.layer_types)
    n_attn = sum(t != "linear_attention" for t in types)
    n_gdn = len(types) - n_attn
    seg = [13, 30, 5]
    T = sum(seg)
    want = (2 * T * (linear + conv) + 4 * cfg.num_attention_heads * cfg.head_dim * n_attn *
            brute_keys(seg, cfg.attention_mode, cfg.window_size) + 6 * 4 * 8 * 12 * T * n_gdn)
    assert train_flops(cfg, seg, 0) == 3 * want
    if n_gdn:  # GDN layers are linear in the sequence: doubling it grows the cost less than a Transformer's
        full = OrthrosConfig(**SHAPE, attention_mode="full")
        ratio = train_flops(cfg, [2 * T], 0) / train_flops(cfg, [T], 0)
        assert ratio < train_flops(full, [2 * T], 0) / train_flops(full, [T], 0)


def test_output_tokens_in_gdn_layers_read_the_state_only():
    """Orthros-H: an output token costs a GDN layer its query and gate projections, one state
    read and out_proj (no k, v, beta, decay, convolution or update)."""
    cfg = OrthrosConfig(**SHAPE, **hybrid_layout("orthros-h", 4))
    plain = OrthrosConfig(**SHAPE, **hybrid_layout("linear-hybrid", 4))  # no output stream
    seg, n_out = [40], 7
    d, V = SHAPE["hidden_size"], SHAPE["vocab_size"]
    gdn_out = 2 * d * (2 * 8 + 4 * 12) + 2 * 4 * 12 * d + 2 * 4 * 8 * 12
    attn_layer_out = 2 * (d * 4 * 16 * 2 + d * 2 * 16 * 2)  # the attention layer's projections
    mlp_out = 2 * 3 * d * SHAPE["intermediate_size"]
    full_out_keys = 4 * 4 * 16 * 40 * 41 // 2 * n_out / 40  # output queries' keys (as many as a causal row)
    extra = n_out * (3 * gdn_out + attn_layer_out + 4 * mlp_out) + full_out_keys
    base_orth = train_flops(cfg, seg, 0)
    assert train_flops(cfg, seg, n_out) == pytest.approx(base_orth + 3 * (extra + 2 * d * V * n_out))
    assert train_flops(plain, seg, n_out) - train_flops(plain, seg, 0) == 3 * 2 * d * V * n_out

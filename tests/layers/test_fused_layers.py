"""``FusedProjections`` on the layers themselves: the fused attention ``project`` (every streams
plan: window + output tokens, the output stream alone, K/V only, every row, a Transformer's
last layer with few query rows), the fused MLP and GDN projections equal the separate ones;
the fused path is taken only with autograd off; a group that cannot share one buffer keeps the
whole module unfused (all or nothing)."""

from __future__ import annotations

import pytest
import torch
from conftest import rel, tiny_config

from orthros.layers import DenseKV, OrthrosAttention, StepInputs, SwiGLUMLP
from orthros.layers.gated_deltanet import GatedDeltaNet

pytestmark = pytest.mark.usefixtures("one_thread")


def randomize(mod, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in mod.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3 + (1.0 if "norm" in name else 0.0))
    return mod


def step_of(n_base, out_rel, B=2, R=12, output_tokens=True, mode=None):
    g = torch.Generator().manual_seed(7)
    cos, sin = torch.randn(B, n_base, R, generator=g), torch.randn(B, n_base, R, generator=g)
    idx = torch.tensor([out_rel])
    rope_out = (cos[:, out_rel], sin[:, out_rel])
    return StepInputs(n_base=n_base, rope_base=(cos, sin), rope_out=rope_out, out_rel=idx,
                      output_tokens=output_tokens, cache=DenseKV(), output_positions=idx, mode=mode)


def project_both(attn, x, step, final):
    with torch.no_grad():
        attn.unfuse_projections()
        want = attn.project(x, step, final)
        assert attn.fuse_projections()
        got = attn.project(x, step, final)
    return got, want


@pytest.mark.parametrize("over", [{}, {"qk_norm": True, "attention_bias": True},
                                  {"attn_output_gate": True}, {"num_key_value_heads": 1, "qk_norm": True}])
@pytest.mark.parametrize("mode,final,n_base,out_rel", [
    ("orthros", False, 1, [0]),  # a decode pair: window + output token, one addcmul
    ("orthros", False, 6, [2, 5]),  # window + two output tokens
    ("orthros", True, 1, [0]),  # the last layer of a decode step: one GEMM over both rows
    ("orthros", True, 6, [5]),  # the last layer of a prefill: K/V and Q columns separately
    ("orthros", True, 6, []),  # K/V only
    ("full", False, 6, [5]),  # every row's full query
    ("full", True, 1, [0]),  # a Transformer's last layer in decode
    ("full", True, 6, [1, 5]),  # ... in prefill: queries at the output rows only
    ("window", True, 6, [3, 5]),  # the window stream at the output rows
])
def test_fused_attention_project_equals_separate(over, mode, final, n_base, out_rel):
    cfg = tiny_config(attention_mode="orthros", **over)
    attn = randomize(OrthrosAttention(cfg, layer_idx=0 if not final else cfg.num_hidden_layers - 1).eval())
    tokens = mode == "orthros"
    step = step_of(n_base, out_rel, output_tokens=tokens, mode=mode)
    x = torch.randn(2, n_base + (len(out_rel) if tokens else 0), cfg.hidden_size)
    got, want = project_both(attn, x, step, final)
    for a, b in zip(got, want):
        assert (a is None) == (b is None)
        if a is not None:
            assert a.shape == b.shape and rel(a, b) < 1e-6


def test_fused_attention_forward_with_a_cache_equals_separate():
    cfg = tiny_config(qk_norm=True, attn_output_gate=True)
    attn = randomize(OrthrosAttention(cfg, layer_idx=0).eval())
    step = step_of(6, [4, 5])
    x = torch.randn(2, 8, cfg.hidden_size)
    with torch.no_grad():
        want = attn(x, step)
        attn.fuse_projections()
        got = attn(x, step)
    assert rel(got, want) < 1e-6


@pytest.mark.parametrize("bias", [False, True])
def test_fused_mlp_equals_separate(bias):
    mlp = randomize(SwiGLUMLP(24, 40, bias=bias))
    x = torch.randn(3, 5, 24)
    with torch.no_grad():
        want = mlp(x)
        assert mlp.fuse_projections()
        assert mlp.gate_proj.weight.untyped_storage().data_ptr() == mlp.gate_up_fused.untyped_storage().data_ptr()
        assert (mlp.gate_up_bias_fused is not None) == bias
        got = mlp(x)
    assert rel(got, want) < 1e-6


def test_fused_path_only_without_autograd():
    mlp = randomize(SwiGLUMLP(8, 16))
    mlp.fuse_projections()
    assert mlp.fused("gate_up_fused") is None  # autograd on: the separate projections (gradients)
    with torch.no_grad():
        assert mlp.fused("gate_up_fused") is mlp.gate_up_fused
    with torch.inference_mode():
        assert mlp.fused("gate_up_fused") is mlp.gate_up_fused


def test_fusion_is_all_or_nothing():
    mlp = randomize(SwiGLUMLP(8, 16, bias=True))
    with torch.no_grad():
        mlp.up_proj.bias.data = mlp.up_proj.bias.data.double()  # a bias group that cannot share a buffer
    assert not mlp.fuse_projections()
    assert mlp.gate_up_fused is None and mlp.gate_up_bias_fused is None
    assert mlp.gate_proj.weight.untyped_storage().data_ptr() != mlp.up_proj.weight.untyped_storage().data_ptr()


def test_last_layer_without_alpha_fuses_only_what_it_has():
    cfg = tiny_config()
    last = OrthrosAttention(cfg, layer_idx=cfg.num_hidden_layers - 1)
    assert last.fuse_projections()
    assert last.qkv_fused is not None and last.alpha_fused is None and last.beta_fused is None
    assert last.qkv_bias_fused is None  # no attention_bias


def gdn_config():
    return tiny_config(hidden_size=32, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
                       linear_value_head_dim=8, layer_types=["linear_attention", "orthros_attention", "linear_attention"])


@pytest.mark.parametrize("two", [True, False])
def test_fused_gdn_projections_equal_separate(two):
    gdn = randomize(GatedDeltaNet(gdn_config(), layer_idx=0).eval())
    step = step_of(5, [4] if two else [], R=8, output_tokens=True)
    x = torch.randn(2, 5 + (1 if two else 0), 32)
    with torch.no_grad():
        want = gdn.project(x, step, final=False)
        assert gdn.fuse_projections()
        got = gdn.project(x, step, final=False)
        last = gdn.project(x, step, final=True)  # the last layer keeps separate projections
        gdn.unfuse_projections()
        last_want = gdn.project(x, step, final=True)
    for a, b in list(zip(got, want)) + list(zip(last, last_want)):
        assert (a is None) == (b is None)
        if a is not None:
            assert a.shape == b.shape and rel(a, b) < 1e-6


def test_a_parameter_replaced_by_hand_is_found_at_the_next_forward():
    mlp = randomize(SwiGLUMLP(8, 16))
    x = torch.randn(2, 3, 8)
    mlp.fuse_projections()
    with torch.no_grad():
        mlp.up_proj.weight.data = torch.randn(16, 8)  # new storage: the fused buffer is stale
        mlp.gate_proj.weight = torch.nn.Parameter(torch.randn(16, 8))  # a new parameter object
        got = mlp(x)
        w = mlp.gate_up_fused
        assert w is not None and mlp.up_proj.weight.untyped_storage().data_ptr() == w.untyped_storage().data_ptr()
        mlp.unfuse_projections()
        want = mlp(x)
    assert rel(got, want) < 1e-6


@pytest.mark.parametrize("act", ["bogus", None, 3])
def test_mlp_refuses_an_unknown_activation_by_name(act):
    """``SwiGLUMLP(hidden_act=...)`` was a bare KeyError 'bogus' from transformers' ACT2FN."""
    with pytest.raises(ValueError, match=f"hidden_act must be an activation of transformers' ACT2FN.*got {act!r}"):
        SwiGLUMLP(8, 16, hidden_act=act)

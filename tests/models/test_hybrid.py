"""Orthros-H (GDN layers + Orthros attention, 3:1) and its baselines, the Linear Hybrid (same
layout, full attention, no output stream) and pure GDN, as HF models: the PT form equals
prefix-by-prefix prefill, SFT positions equal the PT rows, packed documents equal separate
ones, cached (batched, left-padded) generation equals uncached recomputation, save/load,
gradients against float64, and bad layer_types refused."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM

import orthros  # noqa: F401  (registers the Auto classes)
from orthros.kinds import hybrid_layout
from orthros.models import OrthrosConfig, OrthrosForCausalLM

pytestmark = pytest.mark.usefixtures("one_thread")
W = 4
KINDS = ("orthros-h", "linear-hybrid", "gdn")


def tiny(kind="orthros-h", seed=0, layers=4, **over):
    torch.manual_seed(seed)
    kw = dict(vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=layers, num_attention_heads=4,
              num_key_value_heads=2, head_dim=8, window_size=W, qk_norm=True, initializer_range=0.2,
              attn_backend="reference", linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
              linear_value_head_dim=6, **hybrid_layout(kind, layers))
    kw.update(over)
    m = OrthrosForCausalLM(OrthrosConfig(**kw)).eval()
    with torch.no_grad():  # trained-looking scale-offsets, so the two streams really differ
        for n, p in m.named_parameters():
            if n.endswith(("alpha", "alpha_out", "beta", "beta_out")):
                p.add_(0.3 * torch.randn_like(p))
    return m


def test_layouts():
    c = tiny("orthros-h", layers=8).config
    assert c.layer_types == ["linear_attention"] * 3 + ["orthros_attention"] + ["linear_attention"] * 3 + \
        ["orthros_attention"]
    assert c.attention_mode == "orthros"
    assert tiny("linear-hybrid").config.layer_types[3] == "full_attention"
    g = tiny("gdn").config
    assert g.layer_types == ["linear_attention"] * 4 and g.attention_mode == "full"
    m = tiny("orthros-h")
    assert hasattr(m.model.layers[0], "linear_attn") and not hasattr(m.model.layers[0], "self_attn")
    assert hasattr(m.model.layers[3], "self_attn") and not hasattr(m.model.layers[3], "linear_attn")
    # the Qwen3.5 field: an attention layer every `full_attention_interval` layers
    c2 = OrthrosConfig(vocab_size=10, hidden_size=16, intermediate_size=16, num_hidden_layers=6, num_attention_heads=2,
                       full_attention_interval=3)
    assert c2.layer_types == ["linear_attention", "linear_attention", "orthros_attention"] * 2


@pytest.mark.parametrize("bad, match", [
    (["linear_attention", "mamba", "linear_attention", "orthros_attention"], "unknown kinds"),
    (["linear_attention", "orthros_attention"], "one entry per layer"),
    (["orthros_attention", "full_attention", "linear_attention", "linear_attention"], "mixes attention kinds"),
    ("linear_attention", "must be a list"),
])
def test_bad_layer_types_rejected(bad, match):
    with pytest.raises(ValueError, match=match):
        OrthrosConfig(vocab_size=10, hidden_size=16, intermediate_size=16, num_hidden_layers=4, num_attention_heads=2,
                      layer_types=bad)


def test_hybrid_layout_needs_an_attention_layer():
    with pytest.raises(ValueError, match="num_layers >= 4"):
        hybrid_layout("orthros-h", 2)
    with pytest.raises(ValueError, match="hybrid model must be one of"):
        hybrid_layout("mamba", 4)


def test_an_interval_beyond_the_layers_is_refused():
    # full_attention_interval=5 over 4 layers built GDN layers only (mode 'full'), without a word
    kw = dict(vocab_size=10, hidden_size=16, intermediate_size=16, num_hidden_layers=4, num_attention_heads=2)
    with pytest.raises(ValueError, match=r"full_attention_interval=5 exceeds num_hidden_layers=4: no layer"):
        OrthrosConfig(**kw, full_attention_interval=5)
    assert OrthrosConfig(**kw, full_attention_interval=4).layer_types[-1] == "orthros_attention"


def test_from_pretrained_takes_full_attention_interval_as_init_does(tmp_path):
    # from_pretrained(path, full_attention_interval=N): AutoConfig dropped it without a word (the saved
    # layer_types kept, interval 0 or 9 passed), OrthrosForCausalLM got a TypeError of its __init__
    from transformers import AutoConfig

    m = tiny("orthros-h", layers=4)  # L L L O: interval 4
    m.save_pretrained(tmp_path)
    assert AutoConfig.from_pretrained(tmp_path, full_attention_interval=2).layer_types == \
        ["linear_attention", "orthros_attention"] * 2
    assert OrthrosConfig.from_pretrained(tmp_path, full_attention_interval=2, attention_mode="full").layer_types == \
        ["linear_attention", "full_attention"] * 2
    assert OrthrosConfig.from_pretrained(tmp_path, full_attention_interval=1, layer_types=m.config.layer_types
                                         ).layer_types == m.config.layer_types  # layer_types wins, as in __init__
    loaded = OrthrosForCausalLM.from_pretrained(tmp_path, full_attention_interval=4).eval()
    ids = torch.randint(0, 61, (1, 9))
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, m(ids).logits, rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"full_attention_interval=5 exceeds num_hidden_layers=4"):
        AutoConfig.from_pretrained(tmp_path, full_attention_interval=5)
    with pytest.raises(ValueError, match=r"full_attention_interval must be an integer >= 1, got 0"):
        OrthrosForCausalLM.from_pretrained(tmp_path, full_attention_interval=0)

def test_bad_gdn_sizes_rejected():
    with pytest.raises(ValueError, match="linear_num_value_heads"):
        OrthrosConfig(vocab_size=10, hidden_size=16, intermediate_size=16, num_hidden_layers=4, num_attention_heads=2,
                      linear_num_key_heads=2, linear_num_value_heads=3, **hybrid_layout("gdn", 4))


@pytest.mark.parametrize("kind", KINDS)
@torch.no_grad()
def test_pt_form_equals_prefix_by_prefix_prefill(kind):
    m = tiny(kind)
    ids = torch.randint(0, 61, (2, 11))
    pt = m(ids).logits  # an output token at every position
    assert pt.shape == (2, 11, 61)
    for t in range(11):
        pre = m(ids[:, :t + 1], logits_to_keep=1, use_cache=False).logits[:, -1]
        torch.testing.assert_close(pre, pt[:, t], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kind", KINDS)
@torch.no_grad()
def test_sft_positions_and_packed_documents(kind):
    m = tiny(kind, seed=1)
    ids = torch.randint(0, 61, (1, 13))
    pt = m(ids).logits
    pos = torch.tensor([[2, 5, 6, 12]])
    torch.testing.assert_close(m(ids, output_positions=pos).logits, pt[:, pos[0]], rtol=1e-4, atol=1e-5)
    cu = torch.tensor([0, 5, 13])
    packed = m(ids, cu_seqlens=cu).logits
    torch.testing.assert_close(packed[:, :5], m(ids[:, :5]).logits, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(packed[:, 5:], m(ids[:, 5:]).logits, rtol=1e-4, atol=1e-5)


@torch.no_grad()
def _greedy_uncached(m, prompt, n):
    seq = list(prompt)
    for _ in range(n):
        logits = m(torch.tensor([seq]), logits_to_keep=1, use_cache=False).logits[0, -1]
        seq.append(int(logits.argmax()))
    return seq[len(prompt):]


@pytest.mark.parametrize("kind", KINDS)
@torch.no_grad()
def test_cached_left_padded_generation_equals_uncached(kind):
    m = tiny(kind, seed=2)
    prompts = [[5, 9, 2, 33, 7, 1, 8, 8, 40], [3, 4, 50], [11, 12, 13, 14, 15, 16]]
    L = max(map(len, prompts))
    pad = 0
    ids = torch.tensor([[pad] * (L - len(p)) + p for p in prompts])
    am = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in prompts])
    out = m.generate(input_ids=ids, attention_mask=am, max_new_tokens=7, do_sample=False, pad_token_id=pad,
                     use_engine=False)
    for i, p in enumerate(prompts):
        assert out[i, L:].tolist() == _greedy_uncached(m, p, 7), f"row {i}"


@pytest.mark.parametrize("kind", KINDS)
@torch.no_grad()
def test_save_load_roundtrip(kind, tmp_path):
    import json

    m = tiny(kind, seed=3)
    m.save_pretrained(tmp_path)
    # vLLM picks its model class by this name (the hybrid one keeps recurrent states); the model's own
    # config is not changed by saving
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == ["OrthrosHybridForCausalLM"]
    assert m.config.architectures == ["OrthrosForCausalLM"]
    m2 = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert m2.config.layer_types == m.config.layer_types
    ids = torch.randint(0, 61, (2, 9))
    torch.testing.assert_close(m2(ids).logits, m(ids).logits, rtol=0, atol=0)


def test_model_gradients_match_float64():
    m = tiny("orthros-h", seed=4)
    m64 = copy.deepcopy(m).double()
    ids = torch.randint(0, 61, (2, 10))
    labels = ids.clone()
    labels[:, :3] = -100  # SFT-style: output tokens on part of the sequence
    m.train(), m64.train()
    m(ids, labels=labels).loss.backward()
    m64(ids, labels=labels).loss.backward()
    for (n, p), (_, p64) in zip(m.named_parameters(), m64.named_parameters()):
        if p64.grad is None:
            assert p.grad is None, n
            continue
        torch.testing.assert_close(p.grad.double(), p64.grad, rtol=1e-3, atol=1e-5, msg=lambda s: f"{n}: {s}")


@pytest.mark.parametrize("kind", ["orthros-h", "gdn"])
@torch.no_grad()
def test_beam_search_and_assisted_decoding_with_gdn_states(kind):
    """Beam search reorders the cache between steps: the GDN layers' states must follow their
    beams (they did not: cached beams differed from uncached ones). A GDN state cannot be
    rolled back, so assisted (prompt-lookup) decoding is refused instead of emitting tokens
    from states that saw the rejected draft."""
    m = tiny(kind, seed=5)
    ids = torch.randint(1, 61, (2, 6))
    kw = dict(max_new_tokens=6, num_beams=3, do_sample=False, use_engine=False)
    torch.testing.assert_close(m.generate(ids, **kw), m.generate(ids, use_cache=False, **kw), rtol=0, atol=0)
    with pytest.raises(ValueError, match="cropped"):
        m.generate(ids[:1].repeat(1, 3), max_new_tokens=6, do_sample=False, prompt_lookup_num_tokens=3,
                   use_engine=False)


@pytest.mark.parametrize("kind", ("orthros",) + KINDS)
def test_a_config_saved_on_its_own_names_its_architecture(kind, tmp_path):
    """The trainer saves its checkpoints' config on its own (no model.save_pretrained, so no architectures):
    config.json had none, and `vllm serve` stopped with 'No model architectures are specified'."""
    import json

    cfg = tiny(kind).config if kind != "orthros" else OrthrosConfig(
        vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4)
    cfg.architectures = None
    cfg.save_pretrained(tmp_path)
    want = "OrthrosForCausalLM" if kind == "orthros" else "OrthrosHybridForCausalLM"
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == [want]
    assert cfg.architectures is None

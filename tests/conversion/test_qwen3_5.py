"""Qwen3.5 text checkpoints (transformers' Qwen3_5ForCausalLM) -> Orthros-H: the converted
weights run as the Linear Hybrid compute what Qwen3.5 computes (logits, greedy tokens), as
Orthros-H they load and generate; the report says what changed; unsupported variants are
refused before anything is written."""

from __future__ import annotations

import importlib
import json
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM

import orthros  # noqa: F401
from orthros.conversion import convert_checkpoint
from orthros.conversion.architectures import UnsupportedModelError

pytestmark = pytest.mark.usefixtures("one_thread")


def qwen3_5_module():
    """transformers' Qwen3.5 modeling module with its pure-PyTorch GDN. With fla-core installed,
    transformers binds fla's Triton kernels at import, which need a GPU: on CPU the module is
    (re)imported with fla hidden."""
    import transformers.models.qwen3_5.modeling_qwen3_5 as mod

    if torch.cuda.is_available():
        return mod
    saved = {k: v for k, v in sys.modules.items() if k == "fla" or k.startswith("fla.")}
    sys.modules["fla"] = None  # import fla -> ImportError
    try:
        return importlib.reload(mod)
    finally:
        del sys.modules["fla"]
        sys.modules.update(saved)


def tiny_qwen3_5(tmp_path, seed=0, **over):
    from transformers import Qwen3_5TextConfig

    mod = qwen3_5_module()
    kw = dict(vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, head_dim=8, linear_num_key_heads=2, linear_num_value_heads=4,
              linear_key_head_dim=8, linear_value_head_dim=6, initializer_range=0.2, tie_word_embeddings=False)
    kw.update(over)
    torch.manual_seed(seed)
    m = mod.Qwen3_5ForCausalLM(Qwen3_5TextConfig(**kw)).eval()
    with torch.no_grad():  # zero-centred norms away from their init, so 1 + w is really tested
        for n, p in m.named_parameters():
            if n.endswith("norm.weight"):
                p.normal_(0.0, 0.3)
    src = tmp_path / "qwen3_5"
    m.save_pretrained(src)
    return m, src


@torch.no_grad()
def test_linear_hybrid_computes_what_qwen3_5_computes(tmp_path):
    ref, src = tiny_qwen3_5(tmp_path)
    dst = tmp_path / "orthros_h"
    report = convert_checkpoint(src, dst, window_size=4, progress=False)
    assert report["architecture"] == "Qwen3_5ForCausalLM"
    assert any("1 + w" in t["transform"] for t in report["mapped"] if "transform" in t)
    assert (dst / "conversion_report.json").is_file()
    cfg = json.loads((dst / "config.json").read_text())
    assert cfg["layer_types"] == ["linear_attention"] * 3 + ["orthros_attention"]
    # the same weights with full attention and no output stream: Qwen3.5's own computation
    n = ref.config.num_hidden_layers
    lh = AutoModelForCausalLM.from_pretrained(
        dst, attention_mode="full", layer_types=["linear_attention"] * 3 + ["full_attention"]).eval()
    assert lh.config.num_hidden_layers == n
    ids = torch.randint(0, 61, (2, 13))
    torch.testing.assert_close(lh(ids).logits, ref(ids).logits, rtol=1e-4, atol=1e-4)
    a = lh.generate(ids[:1, :5], max_new_tokens=6, do_sample=False, use_engine=False)
    b = ref.generate(ids[:1, :5], max_new_tokens=6, do_sample=False)
    assert a.tolist() == b.tolist()
    # Orthros-H itself: loads, PT form and cached generation run
    oh = AutoModelForCausalLM.from_pretrained(dst).eval()
    assert oh.config.attention_mode == "orthros" and oh.config.attn_output_gate
    assert oh(ids).logits.shape == (2, 13, 61)
    assert oh.generate(ids[:1, :5], max_new_tokens=3, do_sample=False, use_engine=False).shape == (1, 8)


def test_dry_run_names_the_result_orthros_h(tmp_path, capsys):
    """The dry run's result row said "Orthros" for a Qwen3.5 source, which becomes Orthros-H."""
    from orthros.conversion.cli import main as convert_main

    _, src = tiny_qwen3_5(tmp_path)
    capsys.readouterr()
    assert convert_main([str(src), str(tmp_path / "out"), "--window-size", "8", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "result       Orthros-H, window 8" in out, out
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("over, match", [
    (dict(layer_types=["linear_attention"] * 4), "no attention layer"),
    (dict(layer_types=["linear_attention", "sliding_attention", "linear_attention", "full_attention"]),
     "not supported"),
    # transformers' GDN applies hidden_act after its short convolution, Orthros's silu: it converted, to other logits
    (dict(hidden_act="gelu"), "hidden_act='gelu'"),
])
def test_unsupported_variants_refused_nothing_written(tmp_path, over, match):
    try:
        _, src = tiny_qwen3_5(tmp_path, **over)
    except Exception as e:  # transformers itself may refuse the layout
        pytest.skip(f"transformers refuses this layout: {e}")
    dst = tmp_path / "out"
    with pytest.raises(UnsupportedModelError, match=match):
        convert_checkpoint(src, dst, window_size=4, progress=False)
    assert not dst.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]


def test_multimodal_checkpoint_refused(tmp_path):
    _, src = tiny_qwen3_5(tmp_path)
    cfg = json.loads((src / "config.json").read_text())
    cfg["architectures"] = ["Qwen3_5ForConditionalGeneration"]
    (src / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedModelError, match="multimodal"):
        convert_checkpoint(src, tmp_path / "out", window_size=4, progress=False)
    assert not (tmp_path / "out").exists()


@torch.no_grad()
def test_convert_from_hf_applies_the_zero_centred_norm_transform(tmp_path):
    """convert_from_hf (a directory or an in-memory model) stores 1 + w for Qwen3.5's zero-centred
    norms, as convert_checkpoint does (it copied w as is: every decoder norm near zero)."""
    from orthros import convert_from_hf

    ref, src = tiny_qwen3_5(tmp_path)
    convert_checkpoint(src, tmp_path / "dst", window_size=4, progress=False)
    want = AutoModelForCausalLM.from_pretrained(tmp_path / "dst").state_dict()
    for got in (convert_from_hf(src, window_size=4), convert_from_hf(ref, window_size=4)):
        sd = got.state_dict()
        assert sorted(sd) == sorted(want)
        assert [k for k in want if not torch.equal(sd[k], want[k])] == []


@torch.no_grad()
def test_zero_centred_norms_of_a_bf16_source_converted_to_fp32_are_exact(tmp_path):
    """--dtype fp32 of a bf16 Qwen3.5: 1 + w in float32, as Qwen3.5 computes it (it was rounded to bf16
    first, then cast: up to 2^-8 off, ~0.1 in the logits of this tiny model)."""
    from safetensors.torch import load_file

    ref, src = tiny_qwen3_5(tmp_path)
    ref.to(torch.bfloat16).save_pretrained(src)
    convert_checkpoint(src, tmp_path / "dst", window_size=4, dtype="fp32", progress=False)
    got, w = load_file(tmp_path / "dst" / "model.safetensors"), load_file(src / "model.safetensors")
    names = [n for n in w if n.endswith(("norm.weight", "q_norm.weight", "k_norm.weight")) and "linear_attn" not in n]
    assert "model.norm.weight" in names and got["model.norm.weight"].dtype == torch.float32
    assert [n for n in names if not torch.equal(got[n], w[n].float() + 1.0)] == []


@torch.no_grad()
def test_without_gdn_layers_orthros_equals_qwen3_5_below_the_window(tmp_path):
    """Attention layers only: Orthros (gated attention, 1 + w norms) computes what Qwen3.5 computes
    for T <= window, and the report does not say the GDN layers change the model (there are none)."""
    ref, src = tiny_qwen3_5(tmp_path, layer_types=["full_attention"] * 4)
    report = convert_checkpoint(src, tmp_path / "dst", window_size=8, progress=False)
    assert not any("GDN layers gain" in n for n in report["notes"]), report["notes"]
    conv = AutoModelForCausalLM.from_pretrained(tmp_path / "dst").eval()
    ids = torch.randint(0, 61, (2, 12), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(conv(ids).logits[:, :8], ref(ids).logits[:, :8], rtol=1e-4, atol=1e-4)

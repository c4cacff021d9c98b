"""Conversion of Llama / Qwen2 / Qwen3 / Mistral checkpoints to Orthros (paper Section 4.3, issue 3).

Backbone: with alpha = alpha' = 1, beta = beta' = 0 the converted model computes exactly what
the source computes for T <= window, and differs beyond it. Each tiny source model has
randomised weights (non-trivial norms, biases and q/k norms), is saved with
``save_pretrained`` (sharded) and goes through the real loading code.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import (
    AutoModelForCausalLM,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

import orthros
from orthros import OrthrosForCausalLM, convert_from_hf
from orthros.checkpoint_files import is_gguf_source
from orthros.conversion import SUPPORTED_ARCHITECTURES, SafetensorsError, UnsupportedModelError, convert_checkpoint
from orthros.conversion.cli import main as convert_main
from orthros.conversion.convert import load_source, plan_conversion
from orthros.conversion.gguf import resolve_gguf_file

W = 16  # window used throughout
VOCAB = 101
TOKENIZER = Path(orthros.__file__).parent / "data" / "tokenizer" / "tokenizer.json"
_COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=512, bos_token_id=1, eos_token_id=2)
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8}

ARCHS = {
    # Llama 3.1 rope scaling (short original context so the scaling touches several frequencies),
    # attention_bias (q/k/v/o) and mlp_bias on
    "llama": lambda: LlamaForCausalLM(LlamaConfig(**_COMMON, attention_bias=True, mlp_bias=True,
                                                  rope_parameters=LLAMA3_ROPE)),
    # q/k/v bias, no o_proj bias; tied embeddings as in the small Qwen2 models
    "qwen2": lambda: Qwen2ForCausalLM(Qwen2Config(**_COMMON, tie_word_embeddings=True)),
    # q/k RMSNorm, head_dim != hidden / heads
    "qwen3": lambda: Qwen3ForCausalLM(Qwen3Config(**_COMMON, head_dim=24, tie_word_embeddings=False)),
    "mistral": lambda: MistralForCausalLM(MistralConfig(**_COMMON, sliding_window=None)),
}


def _randomise(model):
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            # norms become 1 +- 0.25, biases +- 0.25: nothing is left at its trivial init
            p.add_(0.25 * torch.randn(p.shape, generator=g) if p.dim() == 1 else 0.05 * torch.randn(p.shape, generator=g))
    return model.eval()


def _build(arch: str, path: Path, max_shard_size="60KB"):
    torch.manual_seed(0)
    model = _randomise(ARCHS[arch]())
    model.config._attn_implementation = "eager"
    model.save_pretrained(path, max_shard_size=max_shard_size)
    PreTrainedTokenizerFast(tokenizer_file=str(TOKENIZER), eos_token="<|endoftext|>").save_pretrained(path)
    return model


@pytest.fixture(scope="module", params=list(ARCHS))
def source(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(f"src_{request.param}")
    return request.param, _build(request.param, path), path


def _leftovers(parent: Path):
    return sorted(p.name for p in parent.iterdir() if "orthros-tmp" in p.name or "orthros-old" in p.name)


def _scale_offset_params(model) -> dict:
    return {n: p for n, p in model.named_parameters() if n.rsplit(".", 1)[-1] in ("alpha", "beta", "alpha_out", "beta_out")}


def _max_diff(a, b):
    return (a.float() - b.float()).abs().max().item()


# ------------------------------------------------------------------------ equivalence below the window
def test_equivalence_cli_and_python(source, tmp_path):
    arch, src_model, src = source
    dst = tmp_path / "converted"
    assert convert_main([str(src), str(dst), "--window-size", str(W), "-q"]) == 0
    models = {
        "cli": AutoModelForCausalLM.from_pretrained(dst).eval(),  # the Auto classes know "orthros"
        "python(path)": convert_from_hf(src, window_size=W),
        "python(model)": convert_from_hf(src_model, window_size=W),
    }
    g = torch.Generator().manual_seed(1)
    for how, model in models.items():
        assert isinstance(model, OrthrosForCausalLM), how
        assert model.config.window_size == W
        so = _scale_offset_params(model)
        assert any(n.endswith(".alpha_out") for n in so), how
        for name, p in so.items():
            assert torch.equal(p, torch.ones_like(p) if ".alpha" in name else torch.zeros_like(p)), (how, name)
        for T in (1, 7, W):
            ids = torch.randint(0, VOCAB, (2, T), generator=g)
            with torch.no_grad():
                diff = _max_diff(model(ids).logits, src_model(ids).logits)
            assert diff < 1e-4, (arch, how, T, diff)
        ids = torch.randint(0, VOCAB, (2, 2 * W + 3), generator=g)
        with torch.no_grad():
            ref, out = src_model(ids).logits, model(ids).logits
        assert _max_diff(out[:, :W], ref[:, :W]) < 1e-4, (arch, how)  # the first W positions see <= W tokens
        assert _max_diff(out[:, W:], ref[:, W:]) > 1e-3, (arch, how)  # beyond the window: a different model

    # greedy generation runs; within the window it reproduces the source's tokens exactly
    model = models["cli"]
    prompt = torch.randint(3, VOCAB, (1, 5), generator=g)
    kw = dict(max_new_tokens=W - 5, do_sample=False, min_new_tokens=W - 5, pad_token_id=0)
    assert torch.equal(model.generate(prompt, **kw), src_model.generate(prompt, **kw))
    long = model.generate(torch.randint(3, VOCAB, (1, W + 4), generator=g), max_new_tokens=6, do_sample=False,
                          min_new_tokens=6, pad_token_id=0)
    assert long.shape == (1, W + 10)


def test_checkpoint_contents(source, tmp_path):
    arch, src_model, src = source
    dst = tmp_path / "out"
    report = convert_checkpoint(src, dst, window_size=W, progress=False)
    # tokenizer and generation config copied verbatim
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (dst / name).read_bytes() == (src / name).read_bytes(), name
    cfg = json.loads((dst / "config.json").read_text())
    assert cfg["model_type"] == "orthros" and cfg["architectures"] == ["OrthrosForCausalLM"]
    assert cfg["window_size"] == W and "sliding_window" not in cfg
    expect = {"llama": (True, True, True, False), "qwen2": (True, False, False, False),
              "qwen3": (False, False, False, True), "mistral": (False, False, False, False)}[arch]
    assert (cfg["attention_bias"], cfg["o_proj_bias"], cfg["mlp_bias"], cfg["qk_norm"]) == expect
    if arch == "llama":
        assert cfg["rope_parameters"]["rope_type"] == "llama3" and cfg["rope_parameters"]["factor"] == 8.0
    # report: every source tensor accounted for, exactly once
    src_index = json.loads((src / "model.safetensors.index.json").read_text())["weight_map"]
    seen = [m["source"] for m in report["mapped"]] + [d["source"] for d in report["dropped"]]
    assert sorted(seen) == sorted(src_index)
    assert json.loads((dst / "conversion_report.json").read_text())["summary"] == report["summary"]
    added = {a["target"]: a["init"] for a in report["added"]}
    expected = _scale_offset_params(OrthrosForCausalLM.from_pretrained(dst))
    assert set(added) == set(expected) and len(added) >= 2 * src_model.config.num_hidden_layers
    assert all(v == (1.0 if ".alpha" in k else 0.0) for k, v in added.items())
    assert _leftovers(tmp_path) == []
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(dst.stat().st_mode) == 0o777 & ~umask  # not the temporary directory's 0700


# ------------------------------------------------------------------------------ sharding and dtypes
@pytest.mark.parametrize("dtype", [None, "bf16"])
def test_multi_shard_roundtrip(tmp_path, dtype):
    src, dst = tmp_path / "src", tmp_path / "dst"
    _build("llama", src, max_shard_size="40KB")
    src_index = json.loads((src / "model.safetensors.index.json").read_text())
    src_files = sorted(set(src_index["weight_map"].values()))
    assert len(src_files) >= 4
    args = [str(src), str(dst), "--window-size", "8", "-q"] + (["--dtype", dtype] if dtype else [])
    assert convert_main(args) == 0
    index = json.loads((dst / "model.safetensors.index.json").read_text())
    assert sorted(set(index["weight_map"].values())) == src_files  # sharded like the source
    target = torch.bfloat16 if dtype else torch.float32
    total, seen = 0, set()
    for f in src_files:
        a, b = load_file(src / f), load_file(dst / f)  # the real safetensors reader accepts our files
        for name, t in b.items():
            assert index["weight_map"][name] == f
            assert t.dtype == target
            total += t.numel() * t.element_size()
            seen.add(name)
            if name.endswith(("alpha", "alpha_out")):
                assert torch.equal(t, torch.ones_like(t))
                assert name.rsplit(".", 1)[0] + ".q_proj.weight" in b  # beside its layer's W_Q
            elif name.endswith(("beta", "beta_out")):
                assert not t.any()
            else:
                assert torch.equal(t, a[name].to(target)), name
        assert set(a) <= set(b)
    assert index["metadata"]["total_size"] == total
    assert seen == set(index["weight_map"])
    model = OrthrosForCausalLM.from_pretrained(dst)
    assert model.dtype == target and model.config.window_size == 8


def test_single_file_source_and_tied_lm_head_reported(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    model = _build("qwen2", src, max_shard_size="10GB")
    # an older-style checkpoint that also stores the tied head and a RoPE buffer
    sd = {k: v.contiguous() for k, v in load_file(src / "model.safetensors").items()}
    sd["lm_head.weight"] = sd["model.embed_tokens.weight"].clone()
    sd["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(8)
    save_file(sd, src / "model.safetensors", metadata={"format": "pt"})
    report = convert_checkpoint(src, dst, window_size=W, progress=False)
    assert not (dst / "model.safetensors.index.json").exists() and (dst / "model.safetensors").is_file()
    dropped = {d["source"]: d["reason"] for d in report["dropped"]}
    assert set(dropped) == {"lm_head.weight", "model.layers.0.self_attn.rotary_emb.inv_freq"}
    assert "tie_word_embeddings" in dropped["lm_head.weight"] and "RoPE" in dropped[
        "model.layers.0.self_attn.rotary_emb.inv_freq"]
    conv = OrthrosForCausalLM.from_pretrained(dst).eval()
    ids = torch.randint(0, VOCAB, (1, W))
    with torch.no_grad():
        assert _max_diff(conv(ids).logits, model(ids).logits) < 1e-4


def test_python_dtype_and_window(tmp_path):
    model = _randomise(ARCHS["qwen3"]())
    conv = convert_from_hf(model, window_size=4, dtype="bf16")
    assert conv.dtype == torch.bfloat16 and conv.config.window_size == 4
    conv = convert_from_hf(model, window_size=4, scale_offset=False)
    assert not _scale_offset_params(conv)
    ids = torch.randint(0, VOCAB, (1, 4))
    with torch.no_grad():
        assert _max_diff(conv(ids).logits, model(ids).logits) < 1e-4


def test_sliding_window_source_is_noted(tmp_path):
    src = tmp_path / "src"
    MistralForCausalLM(MistralConfig(**_COMMON, sliding_window=32)).save_pretrained(src)
    report = convert_checkpoint(src, tmp_path / "dst", window_size=W, progress=False)
    assert any("sliding-window" in n and "32" in n for n in report["notes"])


def test_convert_from_hf_warns_the_plan_notes(tmp_path):
    """Was: the Python API dropped the notes the CLI prints and the report records (here: the source's own
    sliding window, which the converted model does not keep), in memory and from a directory alike."""
    model = MistralForCausalLM(MistralConfig(**_COMMON, sliding_window=32))
    model.save_pretrained(tmp_path / "src")
    for source in (model, tmp_path / "src"):
        with pytest.warns(UserWarning, match="sliding-window attention of 32 tokens"):
            convert_from_hf(source, window_size=W)


def test_convert_from_hf_refuses_an_on_note_that_is_no_function_before_converting(monkeypatch):
    """on_note="print" (or a list to collect into) failed calling it, after the whole model was converted."""
    from orthros.conversion import convert as C

    monkeypatch.setattr(C, "_convert_from_hf", lambda *a, **k: pytest.fail("converted"))
    for bad in ("print", []):
        with pytest.raises(TypeError, match=f"^on_note must be a function called with each note .*got "
                                            f"{type(bad).__name__}"):
            convert_from_hf(object(), on_note=bad)



@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_partial_rotary_factor_the_source_ignores_is_not_applied(tmp_path, arch):
    """A Llama/Qwen3 config with ``partial_rotary_factor`` (transformers moves it into
    ``rope_parameters``): their default RoPE rotates the whole head regardless, Orthros's honours
    the factor (Qwen3.5's), so the converted model differed at T <= window (logits off by ~0.1)."""
    cls, cfg_cls = {"llama": (LlamaForCausalLM, LlamaConfig), "qwen3": (Qwen3ForCausalLM, Qwen3Config)}[arch]
    torch.manual_seed(0)
    ref = _randomise(cls(cfg_cls(**_COMMON, partial_rotary_factor=0.5)))
    assert ref.config.rope_parameters["partial_rotary_factor"] == 0.5
    ref.save_pretrained(tmp_path / "src")
    report = convert_checkpoint(tmp_path / "src", tmp_path / "dst", window_size=W, progress=False)
    assert any("partial_rotary_factor=0.5" in n for n in report["notes"])
    conv = AutoModelForCausalLM.from_pretrained(tmp_path / "dst")
    ids = torch.arange(W)[None] % VOCAB
    with torch.no_grad():
        assert _max_diff(conv(ids).logits, ref(ids).logits) < 1e-4


# ------------------------------------------------------------------------------------- bad input
@pytest.fixture(scope="module")
def good_src(tmp_path_factory):
    path = tmp_path_factory.mktemp("good")
    _build("mistral", path, max_shard_size="60KB")
    return path


def test_a_numpy_or_tensor_window_size_is_written_as_a_python_int(tmp_path, good_src):
    # check_positive_int takes them (9efdddd); the conversion ran to its end, then failed writing the JSON report
    # ("Object of type int64 is not JSON serializable") and left nothing
    import numpy as np

    for i, w in enumerate((np.int64(16), torch.tensor(16))):
        dst = tmp_path / f"o{i}"
        assert convert_checkpoint(good_src, dst, window_size=w, progress=False)["window_size"] == 16
        assert json.loads((dst / "config.json").read_text())["window_size"] == 16
        assert plan_conversion(good_src, tmp_path / "p", window_size=w)["window_size"] == 16


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _refused(tmp_path, src, *extra, match, dst_name="out"):
    """Both entry points refuse with a clear message and leave nothing behind."""
    dst = tmp_path / dst_name
    existed = dst.exists()
    before = sorted(p.name for p in dst.iterdir()) if existed and dst.is_dir() else None
    with pytest.raises((ValueError, OSError), match=match):
        convert_checkpoint(src, dst, progress=False, **dict(extra))
    rc = convert_main([str(src), str(dst), "-q"] + [a for k, v in extra for a in (f"--{k.replace('_', '-')}", str(v))])
    assert rc == 2  # bad input, as for every orthros command
    if existed:
        assert sorted(p.name for p in dst.iterdir()) == before  # untouched
    else:
        assert not dst.exists()
    assert _leftovers(tmp_path) == []


def test_missing_directory(tmp_path, capsys):
    _refused(tmp_path, tmp_path / "nope", match="does not exist")
    assert "does not exist" in capsys.readouterr().err
    with pytest.raises(FileNotFoundError, match="does not exist"):
        convert_from_hf(str(tmp_path / "nope"))


def test_a_missing_source_is_named_before_a_destination_in_the_way(tmp_path, capsys):
    """A missing local SRC into a non-empty DST said 'pass --overwrite to replace it'; with --overwrite,
    then, that SRC does not exist. Only a hub id (owner/model) has its destination checked first."""
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("x")
    capsys.readouterr()
    for src in (tmp_path / "nope", "nope", "./a/b"):
        assert convert_main([str(src), str(tmp_path / "out"), "-q"]) == 2
        err = capsys.readouterr().err
        assert "does not exist" in err and "--overwrite" not in err, err
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["keep.txt"]


def test_a_source_name_the_file_system_cannot_hold_does_not_exist(tmp_path, capsys):
    """A SRC with a name beyond 255 bytes was '[Errno 36] File name too long', exit 1 (a failure while working)."""
    src = tmp_path / ("s" * 300)
    capsys.readouterr()
    assert convert_main([str(src), str(tmp_path / "out"), "-q"]) == 2
    assert f"source {str(src)!r} does not exist (File name too long)" in capsys.readouterr().err
    for call in (lambda: convert_checkpoint(src, tmp_path / "out", progress=False),
                 lambda: plan_conversion(src, tmp_path / "out"), lambda: convert_from_hf(src)):
        with pytest.raises(FileNotFoundError, match="does not exist"):
            call()
    assert list(tmp_path.iterdir()) == []


def test_a_source_the_file_system_refuses_to_look_up_says_why(tmp_path, capsys, monkeypatch):
    """Every OSError of the first look at SRC was 'source ... does not exist': a folder above it that cannot be
    searched (EACCES) said 'does not exist (Permission denied)', of a source that may well exist. It is bad input
    (exit 2), as a source folder this user may not list or a destination it may not write."""
    import errno

    src = tmp_path / "locked" / "model"

    def refuse(self, *a, **k):
        raise PermissionError(errno.EACCES, "Permission denied", str(self))

    monkeypatch.setattr(Path, "exists", refuse)
    capsys.readouterr()
    assert convert_main([str(src), str(tmp_path / "out"), "-q"]) == 2
    err = capsys.readouterr().err
    assert f"source {str(src)!r}" in err and "Permission denied" in err and "does not exist" not in err, err
    for call in (lambda: convert_checkpoint(src, tmp_path / "out", progress=False),
                 lambda: plan_conversion(src, tmp_path / "out"), lambda: convert_from_hf(src)):
        with pytest.raises(PermissionError, match=rf"^source {re.escape(repr(str(src)))}: .*\(Permission denied\)$"):
            call()
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def unreadable(monkeypatch):
    """``unreadable(file)``: opening ``file`` raises ``PermissionError``, as for a user without read permission
    on it (the tests run as root, whom a mode does not stop): both ``open`` and pathlib's ``io.open``."""
    import builtins
    import errno
    import io

    locked = set()

    def refusing(real):
        def open_(file, *a, **k):
            if isinstance(file, (str, os.PathLike)) and Path(os.fspath(file)).absolute() in locked:
                raise PermissionError(errno.EACCES, "Permission denied", os.fspath(file))
            return real(file, *a, **k)
        return open_

    monkeypatch.setattr(builtins, "open", refusing(builtins.open))
    monkeypatch.setattr(io, "open", refusing(io.open))
    return lambda p: locked.add(Path(p).absolute())


def _refused_unreadable(src: Path, dst: Path, capsys, words: str) -> None:
    """orthros convert (and --dry-run) exits 2 with one line naming SRC and ``words``; the API raises a
    PermissionError (a ValueError too: bad input) saying the same; nothing is written."""
    want = f"source {str(src)!r}: {words} (Permission denied)"
    for extra in ([], ["--dry-run"]):
        capsys.readouterr()
        assert convert_main([str(src), str(dst), "-q", *extra]) == 2, extra
        err = capsys.readouterr().err
        assert err.startswith(f"orthros convert: error: {want}") and "[Errno" not in err, err
    for call in (lambda: convert_checkpoint(src, dst, progress=False), lambda: plan_conversion(src, dst),
                 lambda: convert_from_hf(src)):
        with pytest.raises(PermissionError, match=re.escape(want)) as e:
            call()
        assert isinstance(e.value, ValueError)
    assert not dst.exists() and _leftovers(dst.parent) == []


@pytest.mark.parametrize("what", ["empty", "checkpoint"])
def test_a_source_folder_that_cannot_be_listed_is_bad_input_naming_it(tmp_path, good_src, capsys, unlistable,
                                                                       what):
    """A SRC folder this user may not list (no read permission) was "[Errno 13] Permission denied: '/tmp/lk'",
    exit 1 (a failure while working), naming neither SRC nor what is wrong."""
    src = tmp_path / "lk"
    src.mkdir() if what == "empty" else _copy(good_src, src)
    unlistable(src)
    _refused_unreadable(src, tmp_path / "out", capsys, "this user may not list this folder")


@pytest.mark.parametrize("what", ["gguf file", "folder of a gguf", "config.json", "index", "shard", "tokenizer.json",
                                  "chat template"])
def test_a_source_file_that_cannot_be_read_is_bad_input_naming_it(tmp_path, good_src, capsys, unreadable, what):
    """A .gguf SRC (or one in a SRC folder), a checkpoint's config.json, index or shard this user may not read
    was "[Errno 13] Permission denied: '...'", exit 1; a tokenizer file (copied as it is) failed only after
    every tensor had been converted, as did a named chat template (additional_chat_templates/, copied too)."""
    if what == "chat template":
        src = _copy(good_src, tmp_path / "src")
        (src / "additional_chat_templates").mkdir()
        locked = src / "additional_chat_templates" / "tool_use.jinja"
        locked.write_text("{{ messages }}")
    elif what.startswith(("gguf", "folder")):
        folder = tmp_path / "g"
        folder.mkdir()
        (folder / "m.gguf").write_bytes(b"GGUF" + bytes(60))
        src, locked = (folder / "m.gguf", folder / "m.gguf") if what == "gguf file" else (folder, folder / "m.gguf")
    else:
        src = _copy(good_src, tmp_path / "src")
        name = {"index": "model.safetensors.index.json",
                "shard": sorted(p.name for p in src.glob("*.safetensors"))[0]}.get(what, what)
        locked = src / name
    unreadable(locked)
    words = ("this user may not read this file" if src == locked else
             f"this user may not read its {locked.relative_to(src if src.is_dir() else src.parent).as_posix()}")
    _refused_unreadable(src, tmp_path / "out", capsys, words)


def test_not_a_model_directory(tmp_path):
    (tmp_path / "empty").mkdir()
    _refused(tmp_path, tmp_path / "empty", match="no config.json")


def test_a_file_source_says_what_it_seems_to_be(tmp_path, good_src, capsys):
    """A GGUF file named without its .gguf suffix (a Hugging Face cache blob) was "not a directory
    (expected an HF checkpoint directory)"; a checkpoint's own file names its directory."""
    blob = tmp_path / "3f2a9c"
    blob.write_bytes(b"GGUF" + bytes(60))
    assert convert_main([str(blob), str(tmp_path / "o"), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "is a GGUF file whose name lacks the .gguf suffix" in err and f"{blob.name}.gguf" in err, err
    with pytest.raises(NotADirectoryError, match="lacks the .gguf suffix"):
        convert_from_hf(str(blob))
    assert convert_main([str(good_src / "config.json"), str(tmp_path / "o")]) == 2
    assert f"name the directory that holds it: {str(good_src)!r}" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_unsupported_architecture(tmp_path, capsys):
    src = tmp_path / "gpt2"
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50, n_positions=32))
    gpt2.save_pretrained(src)
    _refused(tmp_path, src, match="GPT2LMHeadModel.*LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, "
                                  "MistralForCausalLM")
    err = capsys.readouterr().err
    assert "GPT2LMHeadModel" in err and all(a in err for a in SUPPORTED_ARCHITECTURES)
    with pytest.raises(UnsupportedModelError, match="GPT2LMHeadModel"):
        convert_from_hf(gpt2)
    with pytest.raises(UnsupportedModelError, match="GPT2LMHeadModel"):
        convert_from_hf(src)


def test_unknown_tensor_is_refused_not_dropped(tmp_path, good_src):
    src = _copy(good_src, tmp_path / "src")
    f = sorted(src.glob("model-*.safetensors"))[0]
    sd = load_file(f)
    sd["model.layers.0.self_attn.mystery_gate.weight"] = torch.ones(3)
    save_file(sd, f, metadata={"format": "pt"})
    index = json.loads((src / "model.safetensors.index.json").read_text())
    index["weight_map"]["model.layers.0.self_attn.mystery_gate.weight"] = f.name
    (src / "model.safetensors.index.json").write_text(json.dumps(index))
    _refused(tmp_path, src, match="mystery_gate.*no counterpart")


def test_shape_mismatch_and_missing_tensor(tmp_path, good_src):
    src = _copy(good_src, tmp_path / "src")
    cfg = json.loads((src / "config.json").read_text())
    cfg["intermediate_size"] = 80  # the stored MLP weights no longer fit
    (src / "config.json").write_text(json.dumps(cfg))
    _refused(tmp_path, src, match="shape")
    # each of the 2 x 3 MLP weights named once: they were also listed as "missing from the source checkpoint"
    with pytest.raises(ValueError) as e:
        convert_checkpoint(src, tmp_path / "out2", progress=False)
    assert "; 6 tensor problem(s):" in str(e.value) and "missing" not in str(e.value), str(e.value)
    cfg["intermediate_size"], cfg["num_hidden_layers"] = 96, 3  # layer 2 missing from the weights
    (src / "config.json").write_text(json.dumps(cfg))
    _refused(tmp_path, src, match="model.layers.2.*missing")


@pytest.mark.parametrize("damage", ["truncated", "corrupt_header", "garbage", "empty"])
def test_bad_safetensors(tmp_path, good_src, damage):
    src = _copy(good_src, tmp_path / "src")
    f = sorted(src.glob("model-*.safetensors"))[-1]
    data = f.read_bytes()
    if damage == "truncated":
        f.write_bytes(data[:-100])
    elif damage == "corrupt_header":
        f.write_bytes(data[:8] + b"{not json" + data[17:])
    elif damage == "garbage":
        f.write_bytes(b"\xff" * 64)
    else:
        f.write_bytes(b"")
    _refused(tmp_path, src, match=f"{f.name}.*(truncated|corrupt|not a safetensors)")
    with pytest.raises(SafetensorsError, match=f.name):
        convert_from_hf(src)


def test_index_naming_missing_shard(tmp_path, good_src):
    src = _copy(good_src, tmp_path / "src")
    sorted(src.glob("model-*.safetensors"))[0].unlink()
    _refused(tmp_path, src, match="do not exist")


def test_source_without_its_weights_is_refused_before_torch_loads(tmp_path):
    """A folder of config.json without the weights the conversion reads (none at all, only
    pytorch_model.bin, a GGUF beside it, an index that is corrupt or names a shard not downloaded) took
    seconds to refuse from orthros convert: torch and transformers loaded and transformers checked the
    config first. Now the command refuses it with the line of the Python API (convert_checkpoint's
    error), exit 2, in one fresh interpreter that loads neither torch nor transformers, nothing written."""
    import subprocess
    import sys

    cases = {"config-only": {}, "bin-only": {"pytorch_model.bin": "x"}, "gguf-beside": {"m.gguf": "x"},
             "corrupt-index": {"model.safetensors.index.json": "{not json"},
             "shard-not-there": {"model.safetensors.index.json": json.dumps(
                 {"weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors"}})}}
    expected = []
    for name, files in cases.items():
        LlamaConfig(**_COMMON).save_pretrained(tmp_path / name)
        for f, text in files.items():
            (tmp_path / name / f).write_text(text)
        with pytest.raises((ValueError, OSError)) as e:  # the API's refusal, after torch and AutoConfig
            convert_checkpoint(tmp_path / name, tmp_path / "out", progress=False)
        expected.append(f"orthros convert: error: {e.value}\n")
    argvs = [["convert", str(tmp_path / name), str(tmp_path / "out"), "-q"] for name in cases]
    code = (f"import contextlib, io, json, sys\nfrom orthros.cli import main\nfor argv in {argvs!r}:\n"
            "    err = io.StringIO()\n"
            "    with contextlib.redirect_stderr(err):\n"
            "        rc = main(argv)\n"
            "    print(json.dumps([rc, err.getvalue(), [m for m in ('torch', 'transformers') if m in sys.modules]]))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    for name, line, out in zip(cases, expected, r.stdout.strip().splitlines()):
        assert json.loads(out) == [2, line, []], (name, out)
    assert not (tmp_path / "out").exists() and _leftovers(tmp_path) == []


def test_non_empty_destination_needs_overwrite(tmp_path, good_src):
    dst = tmp_path / "out"
    dst.mkdir()
    (dst / "keep.txt").write_text("precious")
    _refused(tmp_path, good_src, match="not empty.*overwrite=True")  # the CLI's --overwrite: test_errors_name_...
    assert (dst / "keep.txt").read_text() == "precious"
    assert convert_main([str(good_src), str(dst), "--overwrite", "-q"]) == 0
    assert not (dst / "keep.txt").exists() and (dst / "config.json").is_file()
    assert _leftovers(tmp_path) == []
    empty = tmp_path / "empty_dst"
    empty.mkdir()  # an existing empty directory is fine without --overwrite
    assert convert_main([str(good_src), str(empty), "-q"]) == 0 and (empty / "config.json").is_file()


def test_errors_name_overwrite_as_the_caller_spells_it(tmp_path, good_src, capsys):
    """The refusals said "pass --overwrite (overwrite=True)", "--overwrite or not", "(--dry-run checks without
    writing)" to both: the Python API's errors name its keywords, orthros convert's its options (as the engine's
    length checks do)."""
    dst, fifo = tmp_path / "full", tmp_path / "fifo"
    dst.mkdir()
    (dst / "keep.txt").write_text("x")
    os.mkfifo(fifo)
    for call in (convert_checkpoint, plan_conversion):
        with pytest.raises(FileExistsError, match=r"directory is not empty; pass overwrite=True to replace it$"):
            call(good_src, dst, **({"progress": False} if call is convert_checkpoint else {}))
        with pytest.raises(ValueError) as e:
            call(good_src, fifo, overwrite=True)
        assert "never replaced, overwrite=True or not" in str(e.value) and "plan_conversion checks without " \
            "writing" in str(e.value) and "--" not in str(e.value), e.value
    for extra in ([], ["--dry-run"]):
        capsys.readouterr()
        assert convert_main([str(good_src), str(dst), "-q", *extra]) == 2
        err = capsys.readouterr().err
        assert "directory is not empty; pass --overwrite to replace it\n" in err and "overwrite=True" not in err, err
        assert convert_main([str(good_src), str(fifo), "-q", "--overwrite", *extra]) == 2
        err = capsys.readouterr().err
        assert "never replaced, --overwrite or not" in err and "(--dry-run checks without writing)" in err, err
    with pytest.raises(ValueError, match=r"is the working folder .* never replaced, overwrite=True or not"):
        convert_checkpoint(good_src, os.getcwd(), overwrite=True, progress=False)


def test_destination_inside_source_refused(tmp_path, good_src):
    src = _copy(good_src, tmp_path / "src")
    with pytest.raises(ValueError, match="must not be the source"):
        convert_checkpoint(src, src / "sub", progress=False)
    with pytest.raises(ValueError, match="must not be the source"):
        convert_checkpoint(src, src, overwrite=True, progress=False)
    assert not (src / "sub").exists() and (src / "config.json").is_file()


@pytest.mark.parametrize("window", [0, -3])
def test_bad_window(tmp_path, good_src, window, capsys):
    with pytest.raises(ValueError, match="window_size must be an integer >= 1"):
        convert_checkpoint(good_src, tmp_path / "out", window_size=window)
    assert convert_main([str(good_src), str(tmp_path / "out"), "--window-size", str(window)]) != 0
    assert "--window-size must be >= 1" in capsys.readouterr().err
    with pytest.raises(ValueError, match="window_size"):
        convert_from_hf(good_src, window_size=window)
    assert not (tmp_path / "out").exists() and _leftovers(tmp_path) == []


def test_bad_dtype(tmp_path, good_src, capsys):
    with pytest.raises(ValueError, match="dtype must be"):
        convert_checkpoint(good_src, tmp_path / "out", dtype="int8")
    with pytest.raises(SystemExit) as e:
        convert_main([str(good_src), str(tmp_path / "out"), "--dtype", "fp8"])
    assert e.value.code == 2 and "argument --dtype: invalid choice: 'fp8'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("flag", ["overwrite", "scale_offset", "progress"])
def test_flags_given_as_text_refused_naming_them(tmp_path, good_src, flag):
    """``overwrite="no"`` (a value read from a text config) was true: it replaced a non-empty DST."""
    dst = tmp_path / "out"
    dst.mkdir()
    (dst / "keep.txt").write_text("precious")
    with pytest.raises(ValueError, match=f"{flag} must be True or False, got 'no'"):
        convert_checkpoint(good_src, dst, window_size=W, **{"progress": False, flag: "no"})
    if flag != "progress":
        with pytest.raises(ValueError, match=f"{flag} must be True or False, got 'no'"):
            plan_conversion(good_src, dst, window_size=W, **{flag: "no"})
    assert sorted(p.name for p in dst.iterdir()) == ["keep.txt"] and _leftovers(tmp_path) == []
    with pytest.raises(ValueError, match="scale_offset must be True or False, got 'no'"):
        convert_from_hf(str(good_src), window_size=W, scale_offset="no")


def test_failure_midway_leaves_nothing(tmp_path, good_src, monkeypatch):
    from orthros.conversion import convert as conv_mod

    calls = {"n": 0}
    real_get = conv_mod.TensorReader.get

    def flaky(self, name):
        calls["n"] += 1
        if calls["n"] == 7:
            raise OSError("disk on fire")
        return real_get(self, name)

    monkeypatch.setattr(conv_mod.TensorReader, "get", flaky)
    dst = tmp_path / "deep" / "er" / "out"  # parents that did not exist are removed too
    with pytest.raises(OSError, match="disk on fire"):
        convert_checkpoint(good_src, dst, progress=False)
    assert not (tmp_path / "deep").exists()
    assert _leftovers(tmp_path) == []


def test_not_enough_disk_space(tmp_path, good_src, monkeypatch):
    from collections import namedtuple

    from orthros.conversion import convert as conv_mod

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(conv_mod.shutil, "disk_usage", lambda p: usage(10 << 20, 10 << 20, 1 << 20))
    with pytest.raises(OSError, match="not enough disk space") as e:
        convert_checkpoint(good_src, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists() and _leftovers(tmp_path) == []
    # a small checkpoint's need in readable units, not "needs about 0.00 GiB, 0.00 GiB free"
    assert "0.00 GiB" not in str(e.value) and "1.0 MiB free" in str(e.value), str(e.value)


# ------------------------------------------------------------------------ --dry-run
def test_dry_run_reports_what_the_conversion_writes(good_src, tmp_path, capsys):
    """--dry-run makes the checks and prints the plan; the real run then writes what it said."""
    from orthros.conversion.convert import plan_conversion

    dst = tmp_path / "out"
    capsys.readouterr()
    assert convert_main([str(good_src), str(dst), "--window-size", "16", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("orthros convert --dry-run: every check passed; nothing was written")
    assert not dst.exists() and _leftovers(tmp_path) == []
    plan = plan_conversion(good_src, dst, window_size=16)
    report = convert_checkpoint(good_src, dst, window_size=16, progress=False)
    assert (plan["mapped"], plan["added"], len(plan["dropped"])) == \
        (len(report["mapped"]), len(report["added"]), len(report["dropped"]))
    assert plan["copied_files"] == report["copied_files"] and plan["skipped_files"] == report["skipped_files"]
    assert f"{plan['mapped']} mapped from {plan['files']} files, {plan['added']} added" in out
    assert plan["architecture"] == report["architecture"] and plan["dtype"] == report["dtype"]
    assert "result       Orthros, window 16" in out and "(alpha/beta at 1/0)" in out
    capsys.readouterr()
    assert convert_main([str(good_src), str(tmp_path / "o2"), "--window-size", "16", "--dry-run",
                         "--no-scale-offset"]) == 0
    out = capsys.readouterr().out  # said "0 added (alpha/beta at 1/0)"
    assert ", 0 added, 0 dropped" in out and "alpha/beta" not in out and "no scale-offset" in out, out



def test_dry_run_lists_dropped_tensors_once_a_reason(tmp_path, capsys):
    """An older checkpoint with a RoPE buffer in every layer: the plan's line named each of them with
    the same reason (a line of 32 for a Llama-2 7B)."""
    src = tmp_path / "src"
    _build("llama", src, max_shard_size="10GB")
    sd = load_file(src / "model.safetensors")
    for i in range(_COMMON["num_hidden_layers"]):
        sd[f"model.layers.{i}.self_attn.rotary_emb.inv_freq"] = torch.ones(8)
    save_file(sd, src / "model.safetensors", metadata={"format": "pt"})
    assert convert_main([str(src), str(tmp_path / "out"), "--window-size", str(W), "--dry-run"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.strip().startswith("tensors"))
    assert line.endswith("2 dropped (2 tensors (model.layers.0.self_attn.rotary_emb.inv_freq ...): "
                         "RoPE buffer, recomputed from the config)"), line


def test_dry_run_refuses_what_the_conversion_refuses(good_src, tmp_path, capsys):
    dst = tmp_path / "full"
    dst.mkdir()
    (dst / "keep.txt").write_text("x")
    assert convert_main([str(good_src), str(dst), "--dry-run"]) == 2
    assert "directory is not empty; pass --overwrite" in capsys.readouterr().err
    assert convert_main([str(good_src), str(dst), "--dry-run", "--overwrite"]) == 0
    assert "(replaced: --overwrite)" in capsys.readouterr().out
    assert sorted(p.name for p in dst.iterdir()) == ["keep.txt"]  # nothing replaced by a dry run
    assert convert_main([str(good_src), str(tmp_path / "o"), "--dry-run", "--window-size", "100000"]) == 2
    assert "exceeds the source's max_position_embeddings" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_a_dangling_symlink_at_dst_needs_overwrite(good_src, tmp_path, capsys):
    """A symbolic link at DST to a missing path is something there: it was replaced without --overwrite
    (Path.exists follows the link)."""
    dst = tmp_path / "link"
    dst.symlink_to(tmp_path / "missing")
    assert convert_main([str(good_src), str(dst), "--window-size", "16"]) == 2
    assert "a symbolic link to the missing" in capsys.readouterr().err
    assert dst.is_symlink() and _leftovers(tmp_path) == []
    assert convert_main([str(good_src), str(dst), "--window-size", "16", "--overwrite"]) == 0
    assert not dst.is_symlink() and (dst / "config.json").is_file()



def test_a_symlink_to_an_empty_directory_at_dst_needs_overwrite(good_src, tmp_path, capsys):
    """DST a link to an empty directory (on another disk, say): the link was replaced by a new
    directory without --overwrite, its target left empty (and the disk check measured the target)."""
    (tmp_path / "target").mkdir()
    dst = tmp_path / "link"
    dst.symlink_to(tmp_path / "target")
    for extra in ([], ["--dry-run"]):
        assert convert_main([str(good_src), str(dst), "--window-size", "16", *extra]) == 2
        err = capsys.readouterr().err
        assert "a symbolic link to" in err and "name the target itself" in err and "--overwrite" in err, err
    assert dst.is_symlink() and sorted((tmp_path / "target").iterdir()) == [] and _leftovers(tmp_path) == []
    assert convert_main([str(good_src), str(dst), "--window-size", "16", "--overwrite", "--dry-run"]) == 0
    assert "(replaced: --overwrite)" in capsys.readouterr().out


# ------------------------------------------------------------- paths and odd input found by hunting
def test_destination_equal_to_or_holding_the_source_says_so_without_overwrite(tmp_path, good_src, capsys):
    """Without --overwrite the error used to say "pass --overwrite", which is then refused too."""
    src = _copy(good_src, tmp_path / "src")
    for dst in (src, tmp_path):
        capsys.readouterr()
        assert convert_main([str(src), str(dst), "-q"]) == 2
        err = capsys.readouterr().err
        assert "must not be the source" in err and "--overwrite" not in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"] and _leftovers(tmp_path) == []


def test_destination_below_a_file_is_refused_naming_it(tmp_path, good_src, capsys):
    (tmp_path / "afile").write_text("x")
    for dst in (tmp_path / "afile" / "out", tmp_path / "afile" / "sub" / "out"):
        for extra in ([], ["--dry-run"]):  # the dry run said "every check passed"
            capsys.readouterr()
            assert convert_main([str(good_src), str(dst), "-q", *extra]) == 2, extra
            err = capsys.readouterr().err
            assert f"destination {str(dst)!r}" in err and "afile" in err and "not a directory" in err, err
        with pytest.raises(NotADirectoryError, match="not a directory"):
            convert_checkpoint(good_src, dst, progress=False)
    assert (tmp_path / "afile").read_text() == "x" and _leftovers(tmp_path) == []


def test_destination_in_a_folder_not_writable_is_refused_by_the_checks(tmp_path, good_src, capsys, monkeypatch):
    """A DST in a read-only folder passed --dry-run ("every check passed") and failed only when the
    temporary directory was made, exit 1, with an errno line that named no DST. (Root writes
    anywhere, so the folder's answer to os.access is what the test sets.)"""
    import os as _os

    ro = tmp_path / "ro"
    ro.mkdir()
    real = _os.access
    monkeypatch.setattr(_os, "access", lambda p, mode, **kw: False if Path(p) == ro else real(p, mode, **kw))
    for dst in (ro / "out", ro / "sub" / "out"):
        for extra in ([], ["--dry-run"]):
            capsys.readouterr()
            assert convert_main([str(good_src), str(dst), "-q", *extra]) == 2, extra
            err = capsys.readouterr().err
            assert f"destination {str(dst)!r}" in err and f"{str(ro)!r} is not writable" in err, err
    assert list(ro.iterdir()) == [] and _leftovers(tmp_path) == []


@pytest.mark.parametrize("where", ["dst unlistable", "parent unsearchable", "grandparent unsearchable"])
def test_a_destination_this_user_may_not_list_or_look_into_is_bad_input_naming_it(tmp_path, good_src, capsys,
                                                                                   monkeypatch, unlistable, where):
    """An existing DST folder this user may not list (it cannot be told empty, nor replaced), or a DST in a folder
    it may not search (no x permission), was "[Errno 13] Permission denied: '...'", exit 1, with --dry-run too.
    (Root reads everything: the folder's listing, or the look at what lies in it, is made to fail.)"""
    import errno

    locked = tmp_path / "locked"
    locked.mkdir()
    dst = {"dst unlistable": locked, "parent unsearchable": locked / "out",
           "grandparent unsearchable": locked / "sub" / "out"}[where]
    if where == "dst unlistable":
        unlistable(locked)
        words = f"destination {str(dst)!r}: this user may not list this folder"
    else:
        real = Path.stat

        def stat(self, *a, **k):
            if self.absolute().parent == locked:
                raise PermissionError(errno.EACCES, "Permission denied", str(self))
            return real(self, *a, **k)

        monkeypatch.setattr(Path, "stat", stat)
        words = f"destination {str(dst)!r}: this user may not look into {str(locked)!r}"
    for extra in ([], ["--dry-run"], ["--overwrite"]):
        capsys.readouterr()
        assert convert_main([str(good_src), str(dst), "-q", *extra]) == 2, extra
        err = capsys.readouterr().err
        assert err.startswith(f"orthros convert: error: {words} (Permission denied)") and "[Errno" not in err, err
    for call in (lambda: convert_checkpoint(good_src, dst, progress=False), lambda: plan_conversion(good_src, dst),
                 lambda: convert_checkpoint(good_src, dst, progress=False, overwrite=True)):
        with pytest.raises(ValueError, match=re.escape(words)):
            call()
    monkeypatch.undo()
    assert list(locked.iterdir()) == [] and _leftovers(tmp_path) == []


def test_a_destination_in_a_folder_this_user_may_not_list_converts_as_the_dry_run_said(tmp_path, good_src, capsys,
                                                                                        unlistable):
    """A DST in a folder this user may write into but not list (mode 0300): --dry-run said "every check passed",
    then the conversion failed at once, "[Errno 13] Permission denied: '...'", exit 1, looking beside DST for
    what a killed run left (none it could find)."""
    folder = tmp_path / "wx"
    folder.mkdir()
    unlistable(folder)
    dst = folder / "out"
    assert convert_main([str(good_src), str(dst), "-q", "--dry-run"]) == 0
    assert convert_main([str(good_src), str(dst), "-q"]) == 0, capsys.readouterr().err
    assert convert_main([str(good_src), str(dst), "-q", "--overwrite"]) == 0, capsys.readouterr().err
    assert (dst / "config.json").is_file() and convert_checkpoint(good_src, folder / "o2", progress=False)


def test_destination_ending_in_dotdot_refused_before_any_work(tmp_path, good_src, capsys, monkeypatch):
    """``a/b/..`` with --overwrite: the whole conversion ran, then the rename failed (EBUSY, exit 1)."""
    from orthros.conversion import convert as conv_mod

    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "keep").write_text("x")
    monkeypatch.setattr(conv_mod, "_write_checkpoint", lambda *a, **k: pytest.fail("work started"))
    dst = tmp_path / "a" / "b" / ".."
    assert convert_main([str(good_src), str(dst), "-q", "--overwrite"]) == 2
    assert "'..'" in capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["b", "keep"] and _leftovers(tmp_path / "a") == []


@pytest.mark.parametrize("config", ["[]", '{"architectures": 5}', b"\xff\xfe{", {"num_attention_heads": None},
                                    {"num_attention_heads": 0}],
                         ids=["list", "architectures-int", "not-utf8", "heads-null", "heads-zero"])
def test_malformed_config_json_refused(tmp_path, config):
    """These were tracebacks (AttributeError, TypeError, huggingface_hub's validation error) or
    exit 1 with "integer modulo by zero" (transformers' Llama config checks heads that way)."""
    src = tmp_path / "src"
    _build("llama", src, max_shard_size="10GB")
    cfg = src / "config.json"
    if isinstance(config, dict):
        cfg.write_text(json.dumps({**json.loads(cfg.read_text()), **config}))
    elif isinstance(config, bytes):
        cfg.write_bytes(config)
    else:
        cfg.write_text(config)
    _refused(tmp_path, src, match="config.json")



def test_quantized_checkpoint_refused_naming_it(tmp_path, good_src, capsys):
    """An FP8 checkpoint (weights in float8 with a weight_scale_inv each): refused as a list of
    'unexpected tensor's that never said the checkpoint is quantized."""
    src = _copy(good_src, tmp_path / "src")
    for shard in src.glob("*.safetensors"):
        sd = load_file(shard)
        for k in [k for k in sd if k.endswith("proj.weight")]:
            sd[k] = sd[k].to(torch.float8_e4m3fn)
            sd[k + "_scale_inv"] = torch.ones(1)
        save_file(sd, shard, metadata={"format": "pt"})
    index = json.loads((src / "model.safetensors.index.json").read_text())
    shard_of = index["weight_map"]
    for k in [k for k in shard_of if k.endswith("proj.weight")]:
        shard_of[k + "_scale_inv"] = shard_of[k]
    (src / "model.safetensors.index.json").write_text(json.dumps(index))
    cfg = json.loads((src / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
    (src / "config.json").write_text(json.dumps(cfg))
    for extra in ([], ["--dry-run"]):
        assert convert_main([str(src), str(tmp_path / "out"), "--window-size", str(W), "-q", *extra]) == 2
        err = capsys.readouterr().err
        assert "quantized checkpoint" in err and "quant_method='fp8'" in err and err.count("\n") == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def _index_pointing(src: Path, fname: str, to) -> None:
    index = json.loads((src / "model.safetensors.index.json").read_text())
    index["weight_map"] = {k: (to if v == fname else v) for k, v in index["weight_map"].items()}
    (src / "model.safetensors.index.json").write_text(json.dumps(index))


@pytest.mark.parametrize("where", ["int", "parent", "absolute", "subdirectory"])
def test_index_shard_names_must_be_plain_files_of_the_source(tmp_path, good_src, where):
    """A shard named ``../x.safetensors`` (or an absolute path) was written to that name
    relative to the temporary directory: the conversion truncated the source shard itself (a
    file outside the source) and failed; ``sub/x.safetensors`` failed midway with the
    temporary directory's path; an int was a traceback."""
    src = _copy(good_src, tmp_path / "src")
    shard = sorted(src.glob("model-*.safetensors"))[0]
    outside = tmp_path / "outside" / "shard.safetensors"
    outside.parent.mkdir()
    data = shard.read_bytes()
    if where == "int":
        _index_pointing(src, shard.name, 3)
    elif where == "parent":
        shutil.move(shard, tmp_path / shard.name)
        _index_pointing(src, shard.name, f"../{shard.name}")
    elif where == "absolute":
        shutil.move(shard, outside)
        _index_pointing(src, shard.name, str(outside))
    else:
        (src / "sub").mkdir()
        shutil.move(shard, src / "sub" / shard.name)
        _index_pointing(src, shard.name, f"sub/{shard.name}")
    _refused(tmp_path, src, match="model.safetensors.index.json.*file name")
    for p in (tmp_path / shard.name, outside, src / "sub" / shard.name):
        assert not p.exists() or p.read_bytes() == data  # never written to


def test_dry_run_says_a_file_destination_is_replaced(tmp_path, good_src, capsys):
    (tmp_path / "afile").write_text("x")
    capsys.readouterr()
    assert convert_main([str(good_src), str(tmp_path / "afile"), "--overwrite", "--dry-run"]) == 0
    assert "(replaced: --overwrite)" in capsys.readouterr().out  # it said "(new)"
    assert (tmp_path / "afile").read_text() == "x"


def test_a_fifo_or_device_at_dst_is_never_replaced(tmp_path, good_src, capsys):
    """``--overwrite`` replaced a FIFO (or a device: as root ``/dev/null`` itself) at DST with the result."""
    dst = tmp_path / "fifo"
    os.mkfifo(dst)
    for extra in (["--overwrite"], ["--overwrite", "--dry-run"], []):
        capsys.readouterr()
        assert convert_main([str(good_src), str(dst), "--window-size", "16", "-q", *extra]) == 2
        err = capsys.readouterr().err
        assert "is a device, FIFO or socket" in err and "never replaced" in err, err
    assert stat.S_ISFIFO(os.lstat(dst).st_mode) and _leftovers(tmp_path) == []
    with pytest.raises(ValueError, match="device, FIFO or socket"):
        convert_checkpoint(good_src, dst, window_size=16, overwrite=True, progress=False)
    assert stat.S_ISFIFO(os.lstat(dst).st_mode)


def test_the_home_folder_is_never_replaced(tmp_path, good_src, capsys, monkeypatch):
    """``orthros convert SRC ~/$NAME --overwrite`` with NAME unset replaced the home folder with the
    result (a source outside it: /data/models ...); without --overwrite it said to pass --overwrite."""
    home = tmp_path / "users" / "me"
    home.mkdir(parents=True)
    (home / "keep.txt").write_text("precious")
    monkeypatch.setenv("HOME", str(home))
    for dst, words in ((home, "is the home folder"), (home.parent, "is above the home folder")):
        for extra in (["--overwrite"], ["--overwrite", "--dry-run"], []):
            capsys.readouterr()
            assert convert_main([str(good_src), str(dst), "--window-size", "16", "-q", *extra]) == 2
            err = capsys.readouterr().err
            assert words in err and "never replaced" in err and "pass --overwrite" not in err, err
    assert convert_main([str(good_src), "~/", "--window-size", "16", "-q", "--overwrite"]) == 2
    assert (home / "keep.txt").read_text() == "precious" and sorted(p.name for p in home.iterdir()) == ["keep.txt"]
    assert _leftovers(home.parent) == [] and _leftovers(tmp_path) == []
    assert convert_main([str(good_src), str(home / "model"), "--window-size", "16", "-q"]) == 0  # below it: fine


@pytest.mark.parametrize("dst", [".", "..", "./"])
def test_the_working_folder_or_one_above_it_is_never_replaced(tmp_path, good_src, capsys, monkeypatch, dst):
    """``orthros convert SRC . --overwrite`` moved the working folder aside and deleted it, every file in it, for the
    result; an empty one (``mkdir out; cd out; orthros convert SRC .``) was replaced, the shell left in a deleted
    folder."""
    work = tmp_path / "a" / "work"
    work.mkdir(parents=True)
    (work / "keep.txt").write_text("precious")
    monkeypatch.chdir(work)
    for extra in (["--overwrite"], []):
        capsys.readouterr()
        assert convert_main([str(good_src), dst, "--window-size", "16", "-q", *extra]) == 2
        err = capsys.readouterr().err
        assert "the working folder" in err and "never replaced" in err and "pass --overwrite" not in err, err
    assert (work / "keep.txt").read_text() == "precious" and _leftovers(tmp_path / "a") == []
    (work / "keep.txt").unlink()
    assert convert_main([str(good_src), ".", "--window-size", "16", "-q"]) == 2  # empty, and still refused
    assert list(work.iterdir()) == []


def test_help_says_what_quiet_hides_and_that_src_may_be_a_hub_id():
    from orthros.conversion.cli import _parser

    text = " ".join(_parser().format_help().split())
    assert "-q, --quiet no progress bar, no summary and no notes" in text, text
    assert "hub id" in text, text
    # a GGUF's weights are quantised: the result is float32 (the help said only "keep the source's dtypes")
    assert "--dtype {bf16,fp16,fp32} cast floating-point weights (default: keep the source's dtypes; a GGUF's: " \
           "float32, as de-quantised)" in text, text


def test_empty_src_or_dst_refused(tmp_path, good_src, capsys, monkeypatch):
    """``orthros convert SRC "$OUT" --overwrite`` with $OUT unset replaced the current directory."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "keep.txt").write_text("precious")
    monkeypatch.chdir(work)
    for argv, name in (([str(good_src), "", "--overwrite"], "DST"), (["", str(tmp_path / "o")], "SRC")):
        capsys.readouterr()
        assert convert_main([*argv, "-q"]) == 2
        assert f"{name} is empty" in capsys.readouterr().err
    assert sorted(p.name for p in work.iterdir()) == ["keep.txt"] and _leftovers(tmp_path) == []
    assert not (tmp_path / "o").exists()


def test_additional_chat_templates_copied(tmp_path, good_src):
    """transformers saves a tokenizer's named chat templates (all but "default") in the folder
    ``additional_chat_templates/``; the converted tokenizer lost them (the folder was skipped
    as "not a regular file")."""
    from transformers import AutoTokenizer

    src = _copy(good_src, tmp_path / "src")
    templates = {"default": "{% for m in messages %}{{ m['content'] }}{% endfor %}",
                 "tool_use": "TOOLS {% for m in messages %}{{ m['content'] }}{% endfor %}"}
    tok = AutoTokenizer.from_pretrained(src)
    tok.chat_template = templates
    tok.save_pretrained(src)
    assert (src / "additional_chat_templates" / "tool_use.jinja").is_file()
    (src / "original").mkdir()  # any other folder (Meta's weights in Llama repos, onnx/ ...) is not copied
    (src / "original" / "consolidated.00.pth").write_bytes(b"x")
    report = convert_checkpoint(src, tmp_path / "out", window_size=W, progress=False)
    assert AutoTokenizer.from_pretrained(tmp_path / "out").chat_template == templates
    assert "additional_chat_templates" in report["copied_files"]
    assert {"file": "original", "reason": "not a regular file (directories are not copied)"} in report["skipped_files"]
    assert not (tmp_path / "out" / "original").exists()


def test_tied_config_with_a_different_stored_head_keeps_the_head(tmp_path):
    """config.json says tie_word_embeddings=true but the checkpoint stores an lm_head.weight
    of its own (a fine-tune that untied the head and kept the config): transformers then
    loads the source untied. The conversion dropped the stored head and tied it to the
    embedding: a different model (logits off by ~1) with the report saying "as in the source"."""
    src = tmp_path / "src"
    _build("llama", src, max_shard_size="60KB")
    cfg = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**cfg, "tie_word_embeddings": True}))
    ref = AutoModelForCausalLM.from_pretrained(src).eval()  # transformers: untied
    assert not torch.equal(ref.lm_head.weight, ref.model.embed_tokens.weight)
    report = convert_checkpoint(src, tmp_path / "out", window_size=W, progress=False)
    assert "lm_head.weight" in {m["source"] for m in report["mapped"]} and not report["dropped"]
    assert any("lm_head.weight" in n and "tie_word_embeddings" in n for n in report["notes"]), report["notes"]
    ids = torch.randint(0, VOCAB, (2, W), generator=torch.Generator().manual_seed(3))
    models = (AutoModelForCausalLM.from_pretrained(tmp_path / "out"), convert_from_hf(src, window_size=W),
              convert_from_hf(ref, window_size=W))
    with torch.no_grad():
        for model in models:
            assert not model.config.tie_word_embeddings
            assert _max_diff(model.eval()(ids).logits, ref(ids).logits) < 1e-4


def test_hub_id_that_cannot_be_downloaded_is_one_line(tmp_path, capsys, monkeypatch):
    """Offline, huggingface_hub's error spans two lines; every orthros error is one line."""
    import huggingface_hub

    def offline(repo_id, **kw):
        raise huggingface_hub.errors.LocalEntryNotFoundError(
            "Got: ConnectError: Name or service not known\nAn error happened while trying to locate the files")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert convert_main(["someone/model", "out", "-q"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'someone/model' is not a local directory" in err and "ConnectError" in err, err
    assert sorted(tmp_path.iterdir()) == []


def test_single_file_beside_a_stale_index_is_what_is_converted(tmp_path):
    """transformers loads ``model.safetensors`` when it is there, even beside an index, and its
    save_pretrained leaves the old index behind when it re-saves a sharded model as one file:
    the conversion refused that checkpoint (the index's shards are gone) and, with the shards
    still there, converted them instead of the weights the source loads."""
    _build("mistral", tmp_path / "src")  # sharded: index + shards
    src = tmp_path / "src"
    for p in src.glob("model-*.safetensors"):
        p.unlink()
    ref = _randomise(ARCHS["mistral"]())  # other weights, as the single file
    ref.save_pretrained(src)  # leaves the stale index
    assert (src / "model.safetensors.index.json").is_file() and (src / "model.safetensors").is_file()
    loaded = AutoModelForCausalLM.from_pretrained(src).eval()
    assert convert_main([str(src), str(tmp_path / "out"), "--window-size", str(W), "-q"]) == 0
    out = tmp_path / "out"
    assert sorted(p.name for p in out.glob("*.safetensors*")) == ["model.safetensors"]
    for conv in (AutoModelForCausalLM.from_pretrained(out), convert_from_hf(src, window_size=W)):
        ids = torch.arange(W)[None] % VOCAB
        with torch.no_grad():
            assert _max_diff(conv(ids).logits, loaded(ids).logits) < 1e-4


def test_source_file_named_like_orthros_code_does_not_replace_it(tmp_path, good_src, capsys):
    """The result carries Orthros's remote code (utils.py, layers.py, ...) for loading with
    trust_remote_code; a source file of the same name was copied over it afterwards, and the
    result then loaded the source's file (here: raised). It is skipped, and said so, in the
    conversion and in --dry-run alike."""
    src = _copy(good_src, tmp_path / "src")
    (src / "utils.py").write_text("raise RuntimeError('the source helper')\n")
    (src / "helper.py").write_text("X = 1\n")  # other code is copied as before
    assert convert_main([str(src), str(tmp_path / "o"), "--window-size", str(W), "--dry-run"]) == 0
    plan = capsys.readouterr().out
    assert "skipped utils.py (Orthros's own file of that name" in plan and "helper.py" in plan.split("skipped")[0]
    report = convert_checkpoint(src, tmp_path / "out", window_size=W, progress=False)
    assert "the source helper" not in (tmp_path / "out" / "utils.py").read_text()
    assert (tmp_path / "out" / "helper.py").read_text() == "X = 1\n" and "helper.py" in report["copied_files"]
    assert [s["file"] for s in report["skipped_files"]] == ["utils.py"]


def test_hub_id_downloads_only_the_checkpoint_weights(tmp_path, good_src, monkeypatch):
    """Mistral's hub repos hold the weights twice (``consolidated.safetensors`` beside the HF
    shards); a hub id downloaded every ``*.safetensors`` (twice the model) though the
    conversion reads only the shards its index names (or ``model.safetensors``)."""
    import huggingface_hub
    from huggingface_hub.utils import filter_repo_objects

    repo = _copy(good_src, tmp_path / "repo")
    shutil.copy(sorted(repo.glob("model-*.safetensors"))[0], repo / "consolidated.safetensors")
    (repo / "original").mkdir()
    shutil.copy(repo / "model.safetensors.index.json", repo / "original" / "extra.safetensors")
    cache, fetched = tmp_path / "cache", []

    def snapshot(repo_id, allow_patterns=None, ignore_patterns=None, **kw):
        names = [p.relative_to(repo).as_posix() for p in repo.rglob("*") if p.is_file()]
        for name in filter_repo_objects(names, allow_patterns=allow_patterns, ignore_patterns=ignore_patterns):
            (cache / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(repo / name, cache / name)
            fetched.append(name)
        return str(cache)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot)
    monkeypatch.chdir(tmp_path)
    assert convert_main(["someone/mistral", "out", "--window-size", str(W), "-q"]) == 0
    assert not {"consolidated.safetensors", "original/extra.safetensors"} & set(fetched), fetched
    shards = {p.name for p in repo.glob("model-*.safetensors")}
    assert shards <= set(fetched) and {p.name for p in (tmp_path / "out").glob("model-*.safetensors")} == shards


def test_hub_id_into_a_destination_in_the_way_downloads_nothing(tmp_path, capsys, monkeypatch):
    """The destination was checked only after the hub download (the whole model), then refused."""
    import huggingface_hub

    calls = []
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda repo_id, **kw: calls.append(repo_id))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("x")
    (tmp_path / "afile").write_text("x")
    for dst in ("out", "afile/sub", "x/.."):
        assert convert_main(["someone/model", dst, "-q"]) == 2
        assert dst.split("/")[0] in capsys.readouterr().err
    assert calls == [] and sorted(p.name for p in tmp_path.iterdir()) == ["afile", "out"]


def test_dry_run_of_a_hub_id_reads_the_local_cache_and_downloads_nothing(tmp_path, good_src, capsys, monkeypatch):
    """``--dry-run`` writes nothing, yet for a hub id it downloaded the whole model (every weight
    shard, into the Hugging Face cache) before printing its plan, and offline it waited on the hub.
    It reads the local cache only: a cached model is planned, one not cached is refused at once."""
    import huggingface_hub
    from huggingface_hub import constants

    cache = tmp_path / "hub"
    snap = cache / "models--someone--mistral" / "snapshots" / ("a" * 40)
    _copy(good_src, snap)
    (cache / "models--someone--mistral" / "refs").mkdir()
    (cache / "models--someone--mistral" / "refs" / "main").write_text("a" * 40)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    real, calls = huggingface_hub.snapshot_download, []

    def spy(repo_id, **kw):
        calls.append((repo_id, kw.get("local_files_only")))
        return real(repo_id, **kw) if kw.get("local_files_only") else pytest.fail(f"dry run went online: {kw}")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", spy)
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert convert_main(["someone/mistral", "out", "--window-size", str(W), "--dry-run"]) == 0
    assert "every check passed" in capsys.readouterr().out and calls
    assert convert_main(["someone/other", "out", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "'someone/other'" in err and "(--dry-run downloads nothing: a run without --dry-run downloads it, or " \
        "name a local directory)" in err and err.count("\n") == 1, err
    with pytest.raises(FileNotFoundError, match=r"\(plan_conversion downloads nothing: convert_checkpoint downloads it"):
        plan_conversion("someone/other", "out")  # the Python API's words
    assert all(local for _, local in calls) and not (tmp_path / "out").exists()


def test_interrupt_between_the_renames_puts_the_old_destination_back(tmp_path, good_src, monkeypatch):
    """With --overwrite the old DST is moved aside, then the new one renamed in: a Ctrl-C between
    the two removed the new result and left the old one hidden (DST gone, while the CLI said
    "nothing was written"); the old DST comes back at once."""
    from orthros.conversion import convert as conv_mod

    dst = tmp_path / "out"
    dst.mkdir()
    (dst / "keep.txt").write_text("previous result")
    real_replace = os.replace

    def interrupted(a, b):
        if conv_mod.TMP_TAG in Path(a).name:
            raise KeyboardInterrupt
        real_replace(a, b)

    monkeypatch.setattr(conv_mod.os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        convert_checkpoint(good_src, dst, window_size=W, overwrite=True, progress=False)
    assert sorted(p.name for p in dst.iterdir()) == ["keep.txt"] and _leftovers(tmp_path) == []


def test_tied_checkpoint_storing_only_the_head_converts(tmp_path):
    """A tied checkpoint may store the shared matrix as ``lm_head.weight`` alone (no
    ``model.embed_tokens.weight``): transformers loads it tied; the conversion refused it
    ("model.embed_tokens.weight: missing"). The head becomes the embedding."""
    src = tmp_path / "src"
    ref = _build("qwen2", src, max_shard_size="60KB")  # tied
    index = json.loads((src / "model.safetensors.index.json").read_text())
    shard = index["weight_map"].pop("model.embed_tokens.weight")
    sd = load_file(src / shard)
    sd["lm_head.weight"] = sd.pop("model.embed_tokens.weight")
    save_file(sd, src / shard, metadata={"format": "pt"})
    index["weight_map"]["lm_head.weight"] = shard
    (src / "model.safetensors.index.json").write_text(json.dumps(index))
    report = convert_checkpoint(src, tmp_path / "out", window_size=W, progress=False)
    assert {"source": "lm_head.weight", "target": "model.embed_tokens.weight"}.items() <= \
        next(m for m in report["mapped"] if m["source"] == "lm_head.weight").items()
    ids = torch.arange(W)[None] % VOCAB
    for conv in (AutoModelForCausalLM.from_pretrained(tmp_path / "out"), convert_from_hf(src, window_size=W)):
        assert conv.config.tie_word_embeddings
        with torch.no_grad():
            assert _max_diff(conv(ids).logits, ref(ids).logits) < 1e-4


def test_a_shard_of_dropped_tensors_only_writes_no_file(tmp_path):
    """A shard holding only tensors the conversion drops (here the tied head, stored in a shard of
    its own): an empty safetensors file of that name was written, listed by no index entry."""
    src = tmp_path / "src"
    _build("qwen2", src, max_shard_size="60KB")  # tied
    index = json.loads((src / "model.safetensors.index.json").read_text())
    embed = load_file(src / index["weight_map"]["model.embed_tokens.weight"])["model.embed_tokens.weight"]
    save_file({"lm_head.weight": embed.clone()}, src / "head.safetensors", metadata={"format": "pt"})
    index["weight_map"]["lm_head.weight"] = "head.safetensors"
    (src / "model.safetensors.index.json").write_text(json.dumps(index))
    report = convert_checkpoint(src, tmp_path / "out", window_size=W, progress=False)
    assert [d["source"] for d in report["dropped"]] == ["lm_head.weight"]
    listed = set(json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())["weight_map"].values())
    assert sorted(p.name for p in (tmp_path / "out").glob("*.safetensors")) == sorted(listed)


def test_longrope_source_is_noted(tmp_path):
    """transformers' longrope switches to long_factor for sequences longer than
    original_max_position_embeddings; Orthros's RoPE keeps short_factor: equal only up to that
    length, and the report said nothing (logits ~0.4 off at T = W)."""
    half = _COMMON["hidden_size"] // _COMMON["num_attention_heads"] // 2
    rope = {"rope_type": "longrope", "rope_theta": 1e4, "factor": 4.0, "original_max_position_embeddings": 8,
            "short_factor": [1.0] * half, "long_factor": [float(i + 2) for i in range(half)]}
    torch.manual_seed(0)
    ref = _randomise(LlamaForCausalLM(LlamaConfig(**_COMMON, rope_parameters=rope)))
    ref.save_pretrained(tmp_path / "src")
    report = convert_checkpoint(tmp_path / "src", tmp_path / "dst", window_size=W, progress=False)
    assert any("longrope" in n and "min(window_size, 8)" in n for n in report["notes"]), report["notes"]
    conv = AutoModelForCausalLM.from_pretrained(tmp_path / "dst")
    ids = torch.arange(8)[None] % VOCAB
    with torch.no_grad():
        assert _max_diff(conv(ids).logits, ref(ids).logits) < 1e-4


def test_dynamic_rope_source_is_noted(tmp_path):
    """transformers' ``dynamic`` RoPE rescales its frequencies for sequences longer than
    max_position_embeddings (its whole point: a longer context); Orthros's RoPE keeps the unscaled
    ones at every length, and the report said nothing of it. Up to the window both agree."""
    rope = {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 4.0}
    torch.manual_seed(0)
    ref = _randomise(LlamaForCausalLM(LlamaConfig(**{**_COMMON, "max_position_embeddings": W},
                                                  rope_parameters=rope)))
    ref.save_pretrained(tmp_path / "src")
    report = convert_checkpoint(tmp_path / "src", tmp_path / "dst", window_size=W, progress=False)
    assert any("dynamic (NTK) RoPE" in n and f"max_position_embeddings={W}" in n for n in report["notes"]), \
        report["notes"]
    conv = AutoModelForCausalLM.from_pretrained(tmp_path / "dst")
    ids = torch.arange(W)[None] % VOCAB
    with torch.no_grad():
        assert _max_diff(conv(ids).logits, ref(ids).logits) < 1e-4
    no_dyn = _randomise(LlamaForCausalLM(LlamaConfig(**{**_COMMON, "max_position_embeddings": W})))
    no_dyn.save_pretrained(tmp_path / "src3")
    assert not any("dynamic" in n for n in convert_checkpoint(tmp_path / "src3", tmp_path / "dst3", window_size=W,
                                                             progress=False)["notes"])


def test_an_orthros_checkpoint_is_named_converted_already(tmp_path, good_src):
    convert_checkpoint(good_src, tmp_path / "once", progress=False)
    _refused(tmp_path, tmp_path / "once", match="Orthros checkpoint already")


def _with_a_weight_beyond_fp16(tmp_path, good_src):
    """A copy of the source whose first 2-D float weight holds 1e5 (fp16 ends at 65504), and that weight's name."""
    src = _copy(good_src, tmp_path / "src")
    f = sorted(src.glob("model-*.safetensors"))[0]
    sd = load_file(f)
    name = sorted(n for n in sd if sd[n].is_floating_point() and sd[n].dim() == 2)[0]
    sd[name] = sd[name].float().clone()
    sd[name][0, 0] = 1e5
    save_file(sd, f, metadata={"format": "pt"})
    return src, name


def test_fp16_overflow_refused_naming_the_tensor(tmp_path, good_src):
    """A weight beyond fp16's 65504 became inf under --dtype fp16 without a word; now refused, nothing left."""
    src, name = _with_a_weight_beyond_fp16(tmp_path, good_src)
    _refused(tmp_path, src, ("dtype", "fp16"), match=f"{name}.*1e\\+05.*range")
    convert_checkpoint(src, tmp_path / "bf16", dtype="bf16", progress=False)  # bf16 holds it


def test_fp16_overflow_names_the_dtype_as_the_cli_takes_it(tmp_path, good_src, capsys):
    """`orthros convert --dtype fp16` said "--dtype float16: tensor ... holds values up to ...", a value
    --dtype refuses (bf16 | fp16 | fp32): the CLI's own alias is named, the Python API's keyword as before."""
    src, name = _with_a_weight_beyond_fp16(tmp_path, good_src)
    capsys.readouterr()
    assert convert_main([str(src), str(tmp_path / "out"), "-q", "--dtype", "fp16"]) == 2
    err = capsys.readouterr().err
    assert f"--dtype fp16: tensor {name!r}" in err and "convert with --dtype bf16 or --dtype fp32" in err, err
    assert "float16" not in err, err
    with pytest.raises(ValueError, match=f"^dtype=float16: tensor {name!r}") as e:
        convert_checkpoint(src, tmp_path / "out", dtype="fp16", progress=False)
    assert 'convert with dtype="bf16" or dtype="fp32"' in str(e.value)  # Python (it said dtype=bf16)


def test_a_home_folder_of_no_user_is_refused_naming_the_argument(tmp_path, capsys):
    """`~nosuchuser9/m` reached pathlib's expanduser: `orthros convert` (run as `python -m
    orthros.conversion.cli`, without the dispatcher's catch) and fetch raised a bare
    RuntimeError('Could not determine home directory.') naming neither the path nor the argument.
    Now the argument and the user are named, before any work."""
    from orthros.conversion import fetch as F

    no_user = r"no user 'nosuchuser9' on this machine"
    with pytest.raises(ValueError, match=rf"^cache_dir ~nosuchuser9/c: {no_user}"):
        F.target_path("smollm2", "~nosuchuser9/c")
    capsys.readouterr()
    assert convert_main(["~nosuchuser9/m", str(tmp_path / "out")]) == 2
    assert convert_main([str(tmp_path), "~nosuchuser9/out"]) == 2
    assert F.main(["smollm2", "--cache-dir", "~nosuchuser9/c"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [f"orthros convert: error: SRC ~nosuchuser9/m: {no_user} (a path's ~NAME is NAME's home folder)",
                   f"orthros convert: error: DST ~nosuchuser9/out: {no_user} (a path's ~NAME is NAME's home folder)",
                   f"orthros fetch: error: --cache-dir ~nosuchuser9/c: {no_user} (a path's ~NAME is NAME's home "
                   f"folder)"], err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("call, arg", [
    (lambda t: convert_checkpoint("~nosuchuser9/m", t / "out", progress=False), "src"),
    (lambda t: convert_checkpoint(t, "~nosuchuser9/out", progress=False), "dst"),
    (lambda t: plan_conversion("~nosuchuser9/m", t / "out"), "src"),
    (lambda t: plan_conversion(t, "~nosuchuser9/out"), "dst"),
    (lambda t: convert_from_hf("~nosuchuser9/m"), "model_or_path"),
    (lambda t: load_source("~nosuchuser9/m"), "source"),
    (lambda t: is_gguf_source("~nosuchuser9/m.gguf"), "source"),
    (lambda t: resolve_gguf_file("~nosuchuser9/m.gguf"), "source"),
])
def test_the_api_names_the_argument_of_a_home_folder_of_no_user(tmp_path, call, arg):
    """The functions behind `orthros convert` took `~nosuchuser9/m` to pathlib's expanduser and
    raised a bare RuntimeError('Could not determine home directory.'), naming neither the path nor
    the argument. Now a ValueError names both, before anything is written."""
    with pytest.raises(ValueError, match=rf"^{arg} ~nosuchuser9/\w+(\.gguf)?: no user 'nosuchuser9' on this machine"):
        call(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_convert_from_hf_refuses_an_fp16_overflow_as_convert_checkpoint_does(tmp_path, good_src):
    """convert_from_hf(dtype="fp16") turned a weight beyond 65504 into inf without a word (the model gave
    inf / NaN), from a directory and from an in-memory model; convert_checkpoint refused it, naming the tensor."""
    src, name = _with_a_weight_beyond_fp16(tmp_path, good_src)
    with pytest.raises(ValueError, match=f"^dtype=float16: tensor {name!r} holds values up to 1e\\+05"):
        convert_from_hf(src, window_size=W, dtype="fp16")
    hf = AutoModelForCausalLM.from_pretrained(src)
    with pytest.raises(ValueError, match=f"^dtype=float16: tensor {name!r} holds values up to 1e\\+05"):
        convert_from_hf(hf, window_size=W, dtype="fp16")
    assert convert_from_hf(hf, window_size=W, dtype="bf16").state_dict()[name].isfinite().all()  # bf16 holds it


@pytest.mark.parametrize("call, arg", [
    (lambda src, out: convert_checkpoint("", out, progress=False), "src"),
    (lambda src, out: convert_checkpoint(src, " ", progress=False), "dst"),
    (lambda src, out: plan_conversion("", out), "src"),
    (lambda src, out: plan_conversion(src, ""), "dst"),
    (lambda src, out: convert_from_hf(""), "model_or_path"),
])
def test_the_api_refuses_an_empty_path_naming_the_argument(tmp_path, good_src, monkeypatch, call, arg):
    """``src=""`` (an unset variable) is the working folder to pathlib: convert_checkpoint converted the model
    the caller stood in, and ``dst=""`` was refused as "destination '.'"; orthros convert refuses both."""
    monkeypatch.chdir(good_src)
    with pytest.raises(ValueError, match=rf"^{arg} is empty \('\s*'\): name a path \('\.' for the current directory\)"):
        call(good_src, tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


def test_a_destination_name_the_file_system_cannot_hold_is_refused_by_the_checks(tmp_path, good_src, capsys):
    """DST's temporary directory beside it, .<name>.orthros-tmp-<pid>-<8>, adds 27 bytes or so to its name: a
    240-byte name (the limit is 255) passed every check and --dry-run, then failed with '[Errno 36] File name
    too long' (exit 1); a folder name beyond the limit was that errno line from the first look at DST."""
    long = "d" * 240
    room = 255 - len(f"..orthros-tmp-{os.getpid()}-12345678")
    for dst, words in ((tmp_path / long, f"its name is 240 bytes long and the temporary directory beside it adds "
                                         f"{255 - room}, beyond this file system's 255 bytes for a name: name a DST "
                                         f"of at most {room} bytes"),
                       (tmp_path / ("e" * 300) / "out", f"{'e' * 300!r} is 300 bytes long, beyond this file "
                                                        f"system's 255 bytes for a name")):
        with pytest.raises(ValueError, match=f"^destination {str(dst)!r}: {words}$"):
            convert_checkpoint(good_src, dst, progress=False)
        with pytest.raises(ValueError, match=f"^destination {str(dst)!r}: {words}$"):
            plan_conversion(good_src, dst)
        capsys.readouterr()
        assert convert_main([str(good_src), str(dst), "-q"]) == 2
        assert words in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
    convert_checkpoint(good_src, tmp_path / ("d" * room), progress=False)  # the longest that fits converts

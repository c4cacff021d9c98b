"""GGUF sources (issue 15): ``orthros convert model.gguf DST`` equals the HF model that
transformers loads from the same GGUF for T <= window; damaged GGUF files are refused before
anything is written. The GGUF is written here (``write_llama_gguf``, the ``gguf`` package's
writer) from a tiny randomised Llama and the shipped byte-level BPE tokenizer: no download."""

from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")

from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM  # noqa: E402

import orthros  # noqa: E402
from orthros import OrthrosForCausalLM, convert_from_hf  # noqa: E402
from orthros.conversion import convert_checkpoint  # noqa: E402
from orthros.conversion.cli import main as convert_main  # noqa: E402
from orthros.conversion.gguf import GGUFError, inspect_gguf, write_llama_gguf  # noqa: E402

W = 16
TOKENIZER_DIR = Path(orthros.__file__).parent / "data" / "tokenizer"
NAME = "tiny-llama.gguf"


def _tiny_llama(vocab: int, tied: bool) -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=tied, bos_token_id=0, eos_token_id=0, rope_parameters={
                          "rope_type": "default", "rope_theta": 50000.0})
    model = LlamaForCausalLM(cfg)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():  # norms 1 +- 0.25: nothing left at a trivial value
            p.add_(0.25 * torch.randn(p.shape, generator=g) if p.dim() == 1 else 0.05 * torch.randn(p.shape, generator=g))
    return model.eval()


@pytest.fixture(scope="module", params=[("f32", False), ("f16", True)], ids=["f32-untied", "f16-tied"])
def gguf_source(request, tmp_path_factory):
    dtype, tied = request.param
    tok = AutoTokenizer.from_pretrained(str(TOKENIZER_DIR))
    folder = tmp_path_factory.mktemp(f"gguf_{dtype}")
    write_llama_gguf(_tiny_llama(len(tok), tied), tok, folder / NAME, dtype=dtype)
    hf = AutoModelForCausalLM.from_pretrained(str(folder), gguf_file=NAME, dtype=torch.float32).eval()
    hf_tok = AutoTokenizer.from_pretrained(str(folder), gguf_file=NAME)
    return folder / NAME, hf, hf_tok


def _leftovers(parent: Path):
    return sorted(p.name for p in parent.iterdir() if "orthros-tmp" in p.name or "orthros-old" in p.name)


def test_inspect_reads_header(gguf_source):
    path, hf, _ = gguf_source
    info = inspect_gguf(path)
    assert info.architecture == "LlamaForCausalLM" and info.gguf_architecture == "llama"
    assert info.n_params == sum(t.numel() for n, t in hf.state_dict().items()
                                if not (n == "lm_head.weight" and hf.config.tie_word_embeddings))
    assert info.has_tokenizer and info.size == path.stat().st_size


@pytest.mark.parametrize("how", ["cli-file", "cli-dir", "python"])
def test_gguf_conversion_equals_hf_from_gguf(gguf_source, tmp_path, how):
    path, hf, hf_tok = gguf_source
    dst = tmp_path / "converted"
    if how == "cli-file":
        assert convert_main([str(path), str(dst), "--window-size", str(W), "-q"]) == 0
    elif how == "cli-dir":  # a directory holding one .gguf
        d = tmp_path / "src"
        d.mkdir()
        shutil.copy(path, d / path.name)
        assert convert_main([str(d), str(dst), "--window-size", str(W), "-q"]) == 0
    if how == "python":
        model = convert_from_hf(path, window_size=W)
    else:
        model = AutoModelForCausalLM.from_pretrained(dst).eval()
        report = json.loads((dst / "conversion_report.json").read_text())
        assert report["source_format"] == "gguf" and report["gguf"]["file"] == NAME
        assert report["architecture"] == "LlamaForCausalLM" and report["window_size"] == W
        assert report["gguf"]["tensor_types"] == ({"F32": report["gguf"]["tensors"]} if "f32" in str(path.parent)
                                                  else report["gguf"]["tensor_types"])
        assert not any(p.suffix == ".gguf" for p in dst.iterdir())
        assert not any(p.name.startswith(".") for p in dst.iterdir()), sorted(p.name for p in dst.iterdir())
        assert _leftovers(tmp_path) == []
        # the tokenizer (chat template included) comes along and encodes like the GGUF's
        tok = AutoTokenizer.from_pretrained(dst)
        text = "To be, or not to be: that is the question.\nSo fare thee well."
        assert tok(text)["input_ids"] == hf_tok(text)["input_ids"]
        msgs = [{"role": "user", "content": "Who speaks?"}]
        assert tok.apply_chat_template(msgs, tokenize=False) == hf_tok.apply_chat_template(msgs, tokenize=False)
    assert isinstance(model, OrthrosForCausalLM) and model.config.window_size == W
    # every source weight exactly as transformers de-quantised it
    sd, ref = model.state_dict(), hf.state_dict()
    for name, t in ref.items():
        assert torch.equal(sd[name], t), name
    g = torch.Generator().manual_seed(1)
    V = hf.config.vocab_size
    for T in (1, 7, W):
        ids = torch.randint(0, V, (2, T), generator=g)
        with torch.no_grad():
            diff = (model(ids).logits - hf(ids).logits).abs().max().item()
        assert diff < 1e-4, (T, diff)
    ids = torch.randint(0, V, (1, 2 * W + 5), generator=g)
    with torch.no_grad():
        out, want = model(ids).logits, hf(ids).logits
    assert (out[:, :W] - want[:, :W]).abs().max().item() < 1e-4
    assert (out[:, W:] - want[:, W:]).abs().max().item() > 1e-3  # beyond the window: a different model
    prompt = torch.randint(5, V, (1, 4), generator=g)
    kw = dict(max_new_tokens=W - 4, min_new_tokens=W - 4, do_sample=False, pad_token_id=0)
    assert torch.equal(model.generate(prompt, **kw), hf.generate(prompt, **kw))


@pytest.mark.parametrize("arch,head_dim,tied", [("qwen2", None, False), ("qwen3", 32, True)], ids=["qwen2", "qwen3"])
def test_qwen_gguf_conversion_equals_its_source(tmp_path, arch, head_dim, tied):
    """Qwen2 (q/k/v biases) and Qwen3 (q/k norms) GGUFs convert to the model they were written
    from (same tensors, same logits inside the window, same tokenizer). transformers reads no head
    dim from a Qwen GGUF: a Qwen3 of head dim 32 (hidden 64, 4 heads) got its config's default 128
    and was refused after de-quantising ("k_norm.weight of shape [32], expected [128]")."""
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    tok = AutoTokenizer.from_pretrained(str(TOKENIZER_DIR))
    cfg_cls, model_cls = (Qwen2Config, Qwen2ForCausalLM) if arch == "qwen2" else (Qwen3Config, Qwen3ForCausalLM)
    torch.manual_seed(0)
    cfg = cfg_cls(vocab_size=len(tok), hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=tied, bos_token_id=0,
                  eos_token_id=0, rope_parameters={"rope_type": "default", "rope_theta": 50000.0},
                  **({"head_dim": head_dim} if head_dim else {}))
    src = model_cls(cfg).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in src.parameters():
            p.add_(0.25 * torch.randn(p.shape, generator=g))
    write_llama_gguf(src, tok, tmp_path / "m.gguf")
    dst = tmp_path / "converted"
    assert convert_main([str(tmp_path / "m.gguf"), str(dst), "--window-size", str(W), "-q"]) == 0
    model = AutoModelForCausalLM.from_pretrained(dst).eval()
    sd = model.state_dict()
    for name, t in src.state_dict().items():
        assert torch.equal(sd[name], t), name
    ids = torch.randint(0, len(tok), (2, W), generator=g)
    with torch.no_grad():
        assert (model(ids).logits - src(ids).logits).abs().max().item() < 1e-4
    text = "To be, or not to be: that is the question.\n<|im_start|>user\nSo fare thee well.<|im_end|>"
    assert AutoTokenizer.from_pretrained(dst)(text)["input_ids"] == tok(text)["input_ids"]


def _damaged(src: Path, folder: Path, how: str) -> Path:
    data = bytearray(src.read_bytes())
    if how == "truncated":
        data = data[: len(data) * 2 // 3]
    elif how == "truncated-header":
        data = data[:200]
    elif how == "bad-magic":
        data[:4] = b"GGUX"
    elif how == "garbage-header":  # tensor count / kv count / first key overwritten
        data[8:72] = bytes([0xFF]) * 64
    out = folder / f"{how}.gguf"
    out.write_bytes(bytes(data))
    return out


@pytest.mark.parametrize("how", ["truncated", "truncated-header", "bad-magic", "garbage-header"])
def test_damaged_gguf_refused_nothing_written(gguf_source, tmp_path, capsys, how):
    path, _, _ = gguf_source
    bad = _damaged(path, tmp_path, how)
    dst = tmp_path / "new" / "out"
    assert convert_main([str(bad), str(dst), "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("orthros convert: error: ") and bad.name in err and "\n" not in err, err
    assert any(w in err for w in ("truncated", "corrupted", "not a GGUF")), err
    assert "Traceback" not in err
    assert not (tmp_path / "new").exists()  # not even the parent directory
    assert _leftovers(tmp_path) == []
    with pytest.raises(GGUFError, match=bad.name):
        convert_checkpoint(bad, dst, progress=False)
    with pytest.raises(GGUFError, match=bad.name):
        convert_from_hf(bad)


def test_gguf_argument_refusals(gguf_source, tmp_path, capsys):
    path, _, _ = gguf_source
    two = tmp_path / "two"
    two.mkdir()
    shutil.copy(path, two / "a.gguf")
    shutil.copy(path, two / "b.gguf")
    assert convert_main([str(two), str(tmp_path / "o1"), "-q"]) == 2
    assert "2 .gguf files" in capsys.readouterr().err
    # the destination must not hold the source
    assert convert_main([str(two / "a.gguf"), str(two), "-q", "--overwrite"]) == 2
    assert "must not be the source" in capsys.readouterr().err
    assert sorted(p.name for p in two.iterdir()) == ["a.gguf", "b.gguf"]
    assert convert_main([str(tmp_path / "missing.gguf"), str(tmp_path / "o2"), "-q"]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()


def test_gguf_beside_a_config_json_is_named_not_resaved(gguf_source, tmp_path, capsys):
    """A directory with a config.json is read as an HF checkpoint directory: one holding a .gguf and
    no safetensors was refused with the hint to re-save with save_pretrained(safe_serialization=True);
    the hint names the .gguf file to pass instead."""
    path, _, _ = gguf_source
    folder = tmp_path / "repo"
    folder.mkdir()
    shutil.copy(path, folder / NAME)
    (folder / "config.json").write_text('{"architectures": ["LlamaForCausalLM"], "model_type": "llama"}')
    assert convert_main([str(folder), str(tmp_path / "out"), "-q", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert str(folder / NAME) in err and "save_pretrained" not in err, err


class _Terminal(__import__("io").StringIO):
    def isatty(self):
        return True


@pytest.mark.parametrize("stream,quiet", [("terminal", False), ("terminal", True), ("log", False)])
def test_gguf_progress_display(gguf_source, tmp_path, monkeypatch, stream, quiet):
    """transformers' own bars (de-quantising, loading, writing shards) show at a terminal only,
    and not with -q; in a log, one plain line says what the long step is (no carriage returns).
    Its GGUF loader's bar cannot be switched off by transformers' switch: it was there with -q."""
    import io

    path, _, _ = gguf_source
    err = _Terminal() if stream == "terminal" else io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    assert convert_main([str(path), str(tmp_path / "out"), "--window-size", str(W), *(["-q"] if quiet else [])]) == 0
    text = err.getvalue()
    hf_bars = ("Converting and de-quantizing GGUF tensors", "Loading weights", "Writing model shards")
    if stream == "terminal" and not quiet:
        assert all(b in text for b in hf_bars), text
    else:
        assert not any(b in text for b in hf_bars) and "\r" not in text, text
    assert ("de-quantising tiny-llama.gguf" in text) == (not quiet), text


def test_gguf_dry_run_checks_the_file_and_writes_nothing(gguf_source, tmp_path, capsys):
    path, _, _ = gguf_source
    info = inspect_gguf(path)
    capsys.readouterr()
    assert convert_main([str(path), str(tmp_path / "out"), "--window-size", str(W), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"{info.n_tensors} in the GGUF" in out and f"{info.n_params:,} parameters" in out
    assert list(tmp_path.iterdir()) == []


def test_gguf_dry_run_says_the_disk_peak_and_the_result_apart(gguf_source, tmp_path, capsys):
    """The dry run's disk line said "about 2.5 MiB written" of a GGUF whose result is about half that: the
    float32 staging copy, removed when done, was counted in without a word."""
    from orthros.conversion.convert import plan_conversion
    from orthros.utils import format_bytes

    path, _, _ = gguf_source
    info = inspect_gguf(path)
    for dtype, size in ((None, 4), ("bf16", 2)):
        plan = plan_conversion(path, tmp_path / "out", window_size=W, dtype=dtype)
        staging, result = info.n_params * 4, info.n_params * size
        assert plan["staging_bytes"] == staging and plan["bytes_needed"] == staging + result
        capsys.readouterr()
        assert convert_main([str(path), str(tmp_path / "out"), "--window-size", str(W), "--dry-run"]
                            + (["--dtype", dtype] if dtype else [])) == 0
        disk = next(line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("disk"))
        assert disk.split(None, 1)[1] == (f"about {format_bytes(staging + result)} at the peak: the result, about "
                                          f"{format_bytes(result)}, beside a float32 staging copy "
                                          f"({format_bytes(staging)}) removed when done"), disk
    assert list(tmp_path.iterdir()) == []


def test_gguf_without_accelerate_refused_by_the_check_and_the_dry_run(gguf_source, tmp_path, capsys, monkeypatch):
    """transformers' GGUF loader needs accelerate, which the gguf extra did not install: the dry run passed
    and the conversion failed after de-quantising; the file's check now names the package."""
    import sys

    path, _, _ = gguf_source
    monkeypatch.setitem(sys.modules, "accelerate", None)  # import accelerate -> ImportError
    with pytest.raises(ImportError, match="needs the 'accelerate' package.*pip install gguf accelerate"):
        inspect_gguf(path)
    capsys.readouterr()
    assert convert_main([str(path), str(tmp_path / "out"), "--window-size", str(W), "--dry-run"]) != 0
    assert "accelerate" in capsys.readouterr().err and list(tmp_path.iterdir()) == []


def test_gguf_window_beyond_its_context_refused_before_dequantising(gguf_source, tmp_path, capsys, monkeypatch):
    """The GGUF's context_length is the model's max_position_embeddings: a larger --window-size was
    refused only after transformers had de-quantised the whole file, and --dry-run passed it."""
    from orthros.conversion import gguf as gguf_mod

    path, hf, _ = gguf_source
    limit = hf.config.max_position_embeddings
    monkeypatch.setattr(gguf_mod, "gguf_to_hf_directory", lambda *a, **k: pytest.fail("de-quantised"))
    msg = f"--window-size {limit + 1} exceeds the source's max_position_embeddings={limit}"
    for extra in ([], ["--dry-run"]):
        capsys.readouterr()
        assert convert_main([str(path), str(tmp_path / "out"), "--window-size", str(limit + 1), *extra]) == 2
        err = capsys.readouterr().err
        assert msg in err and "de-quantising" not in err, err
    assert list(tmp_path.iterdir()) == []
    assert inspect_gguf(path).context_length == limit


def test_gguf_without_context_length_is_held_to_transformers_default(gguf_source, tmp_path, capsys, monkeypatch):
    """Without <arch>.context_length transformers builds the model with its config's default
    max_position_embeddings (LlamaConfig: 2048): --dry-run passed a larger --window-size and the real
    run refused it only after de-quantising the whole file."""
    from orthros.conversion import gguf as gguf_mod

    path = _rewritten(gguf_source[0], tmp_path / "noctx.gguf", drop_fields=("llama.context_length",))
    monkeypatch.setattr(gguf_mod, "gguf_to_hf_directory", lambda *a, **k: pytest.fail("de-quantised"))
    for extra in ([], ["--dry-run"]):
        capsys.readouterr()
        assert convert_main([str(path), str(tmp_path / "out"), "--window-size", "2049", *extra]) == 2
        err = capsys.readouterr().err
        assert "--window-size 2049 exceeds the source's max_position_embeddings=2048 (the GGUF has no " \
               "context_length: transformers' LlamaConfig default)" in err, err
    assert convert_main([str(path), str(tmp_path / "out"), "--window-size", "2048", "--dry-run"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["noctx.gguf"]


@functools.lru_cache(maxsize=4)
def _reader(src: Path):
    """The parsed GGUF ``src`` (a module's source file, never changed): parsing its tokenizer arrays takes
    ~1 s, once per source instead of once per rewritten copy."""
    from gguf import GGUFReader

    return GGUFReader(str(src))


def _rewritten(src: Path, out: Path, *, fields: dict | None = None, drop_fields=(), drop_tensors=(),
               tensors: dict | None = None, arch: str | None = None) -> Path:
    """A copy of the GGUF ``src`` with some key-value fields set (key -> (GGUFValueType, value)) or
    dropped, some tensors left out, some added or replaced (name -> (array, raw_dtype or None)),
    and ``general.architecture`` set to ``arch``."""
    from gguf import GGUFValueType, GGUFWriter

    fields, tensors = dict(fields or {}), dict(tensors or {})
    r = _reader(src)
    w = GGUFWriter(str(out), arch or r.fields["general.architecture"].contents())
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key in drop_fields or key in fields:
            continue
        sub = f.types[-1] if f.types[0] == GGUFValueType.ARRAY else None
        w.add_key_value(key, f.contents(), f.types[0], sub_type=sub)
    for key, (vtype, value) in fields.items():
        w.add_key_value(key, value, vtype)
    for t in r.tensors:
        if t.name not in drop_tensors and t.name not in tensors:
            w.add_tensor(t.name, t.data, raw_shape=list(reversed([int(s) for s in t.shape])),
                         raw_dtype=t.tensor_type)
    for name, (data, raw_dtype) in tensors.items():
        w.add_tensor(name, data, raw_dtype=raw_dtype, raw_shape=data.shape if raw_dtype is not None else None)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def _u32(v):
    return (gguf.GGUFValueType.UINT32, v)


@pytest.mark.parametrize("change,words", [
    (dict(fields={"llama.block_count": _u32(3)}), "llama.block_count is 3, its tensors are of layers 0..1"),
    (dict(fields={"llama.block_count": _u32(1)}), "llama.block_count is 1, its tensors are of layers 0..1"),
    (dict(fields={"llama.context_length": (gguf.GGUFValueType.STRING, "abc")}), "llama.context_length"),
    (dict(fields={"llama.context_length": _u32(0)}), "llama.context_length"),
    (dict(fields={"llama.attention.head_count_kv": _u32(0)}), "llama.attention.head_count_kv"),
    (dict(fields={"llama.rope.dimension_count": _u32(0)}), "the llama.rope.dimension_count field is 0, not an integer"),
    (dict(fields={"llama.rope.freq_base": (gguf.GGUFValueType.FLOAT32, 0.0)}),
     "the llama.rope.freq_base field is 0.0, not a finite number > 0"),
    (dict(fields={"llama.attention.layer_norm_rms_epsilon": (gguf.GGUFValueType.STRING, "1e-5")}),
     "the llama.attention.layer_norm_rms_epsilon field is '1e-5', not a finite number > 0"),
    (dict(fields={"split.no": (gguf.GGUFValueType.UINT16, 0), "split.count": (gguf.GGUFValueType.UINT16, 2)},
          drop_tensors=[f"blk.1.{t}.weight" for t in ("attn_norm", "ffn_norm", "attn_q", "attn_k", "attn_v",
                                                       "attn_output", "ffn_gate", "ffn_up", "ffn_down")]),
     "part 1 of 2 of a split GGUF file: merge the parts first"),
    (dict(tensors={"rope_freqs.weight": (np.linspace(1, 8, 8, dtype=np.float32), None)}),
     "RoPE scaling (a rope_freqs.weight tensor) that transformers' GGUF loader ignores"),
    (dict(fields={"llama.rope.scaling.type": (gguf.GGUFValueType.STRING, "linear"),
                  "llama.rope.scaling.factor": (gguf.GGUFValueType.FLOAT32, 4.0)}),
     "RoPE scaling (llama.rope.scaling.type linear, factor 4.0) that transformers' GGUF loader ignores"),
    (dict(fields={"llama.rope.scaling.factor": (gguf.GGUFValueType.FLOAT32, 2.0)}), "factor 2.0"),
    (dict(fields={"llama.rope.scale_linear": (gguf.GGUFValueType.FLOAT32, 2.0)}), "factor 2.0"),
    (dict(tensors={"blk.1.ffn_norm.weight": (np.ones(64), None)}),
     "tensors of type F64 (1, e.g. blk.1.ffn_norm.weight) that the installed gguf package cannot de-quantise"),
    (dict(tensors={"blk.0.ffn_gate.weight": (np.zeros((96, 292), dtype=np.uint8), gguf.GGMLQuantizationType.Q8_K)}),
     "tensors of type Q8_K (1, e.g. blk.0.ffn_gate.weight)"),
    (dict(fields={"tokenizer.chat_template": _u32(5)}),
     "the tokenizer.chat_template field is 5, not a string (a Jinja chat template)"),
    (dict(arch="mistral"), "cannot convert GGUF architecture 'mistral'"),
    (dict(tensors={f"blk.{i}.attn_{x}.bias": (np.ones(64 if x == "q" else 32, dtype=np.float32), None)
                   for i in (0, 1) for x in "qkv"}),
     "tensors that transformers' GGUF loader would leave out of the model: blk.0.attn_k.bias, blk.0.attn_q.bias, "
     "blk.0.attn_v.bias and 3 more"),
], ids=["more-blocks", "fewer-blocks", "context-str", "context-0", "kv-heads-0", "rope-dim-0", "rope-theta-0", "eps-str", "split-part", "rope-freqs",
        "rope-linear", "rope-factor", "rope-scale-linear", "f64-tensor", "q8k-tensor", "chat-template-int", "mistral-arch", "llama-biases"])
def test_gguf_metadata_that_does_not_fit_refused_before_dequantising(gguf_source, tmp_path, capsys, monkeypatch,
                                                                       change, words):
    """A block_count above the layers the tensors hold made transformers initialise the missing
    layers at random (exit 0, a random model); one below dropped the extra layers silently; a
    context_length of text was a StrictDataclass traceback, one of 0 an error asking for a window
    <= 0; a rope.dimension_count of 0 (a Llama's head dim) a ZeroDivisionError naming no file; a rope.freq_base of 0 or an rms epsilon of text passed --dry-run and were refused by the
    model config after de-quantising, naming no GGUF field; the first part of a split GGUF (llama.cpp's gguf-split) was "corrupted". RoPE scaling
    (Llama 3's rope_freqs tensor, rope.scaling.* fields) was dropped by transformers' loader without
    a word: exit 0 and a model of other logits than the GGUF's. A tensor type the gguf package cannot
    de-quantise (F64, Q8_K) and the architecture 'mistral' (no tensor map in gguf-py) passed
    --dry-run and failed only after the tokenizer was built and tensors de-quantised. A tensor the
    loader has no place for (a Llama's q/k/v biases) was dropped: exit 0, a model without them. Now: refused
    with the file's field named, before de-quantising, in --dry-run too."""
    from orthros.conversion import gguf as gguf_mod

    path, _, _ = gguf_source
    bad = _rewritten(path, tmp_path / "bad.gguf", **change)
    monkeypatch.setattr(gguf_mod, "gguf_to_hf_directory", lambda *a, **k: pytest.fail("de-quantised"))
    for extra in ([], ["--dry-run"]):
        capsys.readouterr()
        assert convert_main([str(bad), str(tmp_path / "out"), "--window-size", str(W), "-q", *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("orthros convert: error: ") and "\n" not in err and words in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.gguf"]


@pytest.mark.parametrize("change,words", [
    (dict(drop_tensors=("blk.0.attn_q.weight",)), "model.layers.0.self_attn.q_proj.weight"),
    (dict(drop_tensors=("output_norm.weight",)), "model.norm.weight"),
    (dict(fields={"llama.attention.head_count": _u32(3)}),  # a config error: was "could not build the tokenizer"
     "could not build the model config or the tokenizer from this GGUF file's fields (ValueError: The hidden size "
     "(64) is not a multiple of the number of attention heads (3)"),
    (dict(fields={"tokenizer.ggml.bos_token_id": _u32(99999)}), "tokenizer"),
], ids=["no-q-proj", "no-final-norm", "heads-do-not-divide", "bos-beyond-vocab"])
def test_gguf_that_transformers_cannot_load_whole_refused(gguf_source, tmp_path, capsys, change, words):
    """A tensor missing from the GGUF was initialised at random by transformers' loader, and the
    conversion succeeded (exit 0) with a random tensor in the model; a hidden size that the head
    count does not divide was a traceback (huggingface_hub's StrictDataclass error), a special
    token id beyond the vocabulary an IndexError traceback (merges of tokens the vocabulary lacks:
    test_gguf_tokenizer_fields_refused_by_the_checks). Now: one line, exit 2, nothing written."""
    path, _, _ = gguf_source
    bad = _rewritten(path, tmp_path / "bad.gguf", **change)
    capsys.readouterr()
    assert convert_main([str(bad), str(tmp_path / "out"), "--window-size", str(W), "-q"]) == 2
    out, err = capsys.readouterr()
    err = err.strip()
    assert err.startswith("orthros convert: error: ") and "\n" not in err and words in err, err
    assert "LOAD REPORT" not in out + err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.gguf"]


def test_gguf_without_a_tokenizer_is_said_in_the_plan_and_the_report(gguf_source, tmp_path, capsys):
    """A GGUF without tokenizer.ggml.* fields converted to a checkpoint without a tokenizer, and
    neither --dry-run nor the conversion said so (`orthros generate` then failed on the tokenizer)."""
    import json

    from gguf import GGUFReader

    path, _, _ = gguf_source
    keys = [k for k in GGUFReader(str(path)).fields if k.startswith("tokenizer.")]
    bare = _rewritten(path, tmp_path / "bare.gguf", drop_fields=keys)
    assert not inspect_gguf(bare).has_tokenizer
    capsys.readouterr()
    assert convert_main([str(bare), str(tmp_path / "plan"), "--window-size", str(W), "--dry-run"]) == 0
    assert "note" in (out := capsys.readouterr().out) and "holds no tokenizer" in out, out
    assert convert_main([str(bare), str(tmp_path / "out"), "--window-size", str(W)]) == 0
    assert "note: bare.gguf holds no tokenizer" in capsys.readouterr().out
    report = json.loads((tmp_path / "out" / "conversion_report.json").read_text())
    assert any("holds no tokenizer" in n for n in report["notes"])
    assert not (tmp_path / "out" / "tokenizer.json").exists()
    capsys.readouterr()  # the tokenizer-carrying source: no such note
    assert convert_main([str(path), str(tmp_path / "plan2"), "--window-size", str(W), "--dry-run"]) == 0
    assert "holds no tokenizer" not in capsys.readouterr().out


def test_gguf_merges_checked_against_the_vocabulary_transformers_builds(gguf_source, tmp_path, capsys):
    """The merges check takes a 'gpt2' vocabulary as transformers spells it: a token stored with a
    raw space (" t") is respelled in the byte alphabet ("Ġt"), so the merge "Ġ t" that makes it is
    no bad merge. A file that transformers' tokenizer conversion takes is not refused."""
    from gguf import GGUFReader

    path, _, _ = gguf_source
    tokens = GGUFReader(str(path)).fields["tokenizer.ggml.tokens"].contents()
    assert "Ġt" in tokens and " t" not in tokens
    respelled = [" t" if t == "Ġt" else t for t in tokens]
    ok = _rewritten(path, tmp_path / "spaced.gguf", fields={"tokenizer.ggml.tokens": (gguf.GGUFValueType.ARRAY,
                                                                                       respelled)})
    assert AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=ok.name).tokenize(" the") == ["Ġthe"]
    assert inspect_gguf(ok).has_tokenizer
    capsys.readouterr()
    assert convert_main([str(ok), str(tmp_path / "out"), "--window-size", str(W), "--dry-run"]) == 0
    assert "every check passed" in capsys.readouterr().out


def test_gguf_tensor_type_unknown_to_the_gguf_package_named(gguf_source, tmp_path, capsys):
    """A tensor whose GGML type id the installed gguf package has no name for (a quantisation of a
    newer llama.cpp) was refused as "corrupted or truncated GGUF file", sending the user after a
    damaged download; now the type is named as unknown to the package, with the upgrade to try."""
    import struct

    from gguf import GGUFReader

    path, _, _ = gguf_source
    t = next(t for t in GGUFReader(str(path)).tensors if t.name == "blk.0.ffn_up.weight")
    pos = t.field.offset + 8 + len(t.name.encode()) + 4 + 8 * len(t.shape)  # name, n_dims, dims, then the type
    data = bytearray(path.read_bytes())
    struct.pack_into("<I", data, pos, 200)
    bad = tmp_path / "newtype.gguf"
    bad.write_bytes(bytes(data))
    assert convert_main([str(bad), str(tmp_path / "out"), "--window-size", str(W), "-q", "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert "a tensor of a GGML type that the installed gguf package (gguf " in err and "200" in err, err
    assert "corrupted or truncated" not in err and "\n" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["newtype.gguf"]


@pytest.mark.parametrize("change,words", [
    (dict(fields={"tokenizer.ggml.eos_token_id": _u32(99999)}),
     "the tokenizer.ggml.eos_token_id field is 99999, not a token id of the vocabulary (an integer 0..4095)"),
    (dict(fields={"tokenizer.ggml.padding_token_id": _u32(4096)}),
     "the tokenizer.ggml.padding_token_id field is 4096, not a token id of the vocabulary (an integer 0..4095)"),
    (dict(fields={"tokenizer.ggml.bos_token_id": (gguf.GGUFValueType.STRING, "1")}),
     "the tokenizer.ggml.bos_token_id field is '1', not a token id of the vocabulary"),
    (dict(drop_fields=["tokenizer.ggml.model"]),
     "the tokenizer.ggml.model field is missing: transformers builds a tokenizer from one of "),
    (dict(fields={"tokenizer.ggml.model": (gguf.GGUFValueType.STRING, "bpe")}),
     "the tokenizer.ggml.model field is 'bpe': transformers builds a tokenizer from one of "),
    (dict(drop_fields=["tokenizer.ggml.merges"]),
     "a 'gpt2' tokenizer without tokenizer.ggml.merges (or tokenizer.ggml.scores to derive them from)"),
    (dict(fields={"llama.vocab_size": _u32(1000)}),
     "the llama.vocab_size field is 1000, token_embd.weight has 4096 rows (one per token): they must be equal"),
    (dict(drop_fields=["llama.vocab_size", "tokenizer.ggml.merges"], fields={
        "tokenizer.ggml.tokens": (gguf.GGUFValueType.ARRAY, [f"t{i}" for i in range(4000)])}),
     "no llama.vocab_size field, and tokenizer.ggml.tokens (the vocabulary size transformers takes then) holds "
     "4000 tokens, token_embd.weight has 4096 rows"),
    (dict(fields={"tokenizer.ggml.tokens": (gguf.GGUFValueType.ARRAY, ["a", "b"])}),
     "the tokenizer.ggml.merges field holds 'Ġ t' (merge 0), and 'Ġ' is not a token of the vocabulary: each merge "
     "is 'A B' where A, B and AB are tokens of tokenizer.ggml.tokens"),
    (dict(fields={"tokenizer.ggml.merges": (gguf.GGUFValueType.ARRAY, ["Ġ t", "h zzq"])}),
     "the tokenizer.ggml.merges field holds 'h zzq' (merge 1), and 'zzq' is not a token of the vocabulary"),
    (dict(fields={"tokenizer.ggml.merges": (gguf.GGUFValueType.ARRAY, ["Ġ t", "Ġt Ġt"])}),
     "the tokenizer.ggml.merges field holds 'Ġt Ġt' (merge 1), and 'ĠtĠt' is not a token of the vocabulary"),
    (dict(fields={"tokenizer.ggml.merges": (gguf.GGUFValueType.ARRAY, ["Ġ t", "h e r"])}),
     "the tokenizer.ggml.merges field holds 'h e r' (merge 1), not two tokens joined by one space"),
    (dict(drop_fields=["llama.vocab_size", "tokenizer.ggml.tokens"]),
     "cannot tell the vocabulary size: neither a llama.vocab_size field nor tokenizer.ggml.tokens"),
], ids=["eos-beyond-vocab", "pad-beyond-vocab", "bos-text", "no-tokenizer-model", "unknown-tokenizer-model",
        "no-merges", "vocab-size-not-embd", "tokens-not-embd", "merges-beyond-tokens", "merge-part-not-token",
        "merged-not-token", "merge-of-three", "no-vocab-size-nor-tokens"])
def test_gguf_tokenizer_fields_refused_by_the_checks(gguf_source, tmp_path, capsys, monkeypatch, change, words):
    """--dry-run said "every check passed" for GGUF files whose tokenizer or vocabulary fields the real
    run then refused: a special token id beyond the vocabulary (transformers' two-line warning, then
    "IndexError: list index out of range"), a bos_token_id of text (a StrictDataclass error), a
    tokenizer.ggml.model missing or unknown, no merges ("KeyError: 'scores'"), a vocab_size (or, without
    one, a count of tokens) that is not token_embd's rows (found only after de-quantising), a merge whose
    parts or their join the vocabulary lacks (the tokenizers library's "Error while initializing BPE:
    Token `X` out of vocabulary") or of three parts (a TypeError). Now: one line
    naming the field and what is allowed, exit 2, in --dry-run and before any work, nothing written."""
    from orthros.conversion import gguf as gguf_mod

    path, _, _ = gguf_source
    bad = _rewritten(path, tmp_path / "bad.gguf", **change)
    monkeypatch.setattr(gguf_mod, "gguf_to_hf_directory", lambda *a, **k: pytest.fail("de-quantised"))
    for extra in (["--dry-run"], []):
        capsys.readouterr()
        assert convert_main([str(bad), str(tmp_path / "out"), "--window-size", str(W), "-q", *extra]) == 2, extra
        out, err = capsys.readouterr()
        err = err.strip()
        assert err.startswith(f"orthros convert: error: {bad}: ") and "\n" not in err and words in err, err
        assert "every check passed" not in out
    with pytest.raises(GGUFError, match="tokenizer.ggml|vocab_size"):
        inspect_gguf(bad)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.gguf"]


def _other_arch_gguf(path: Path, arch: str = "phi3", *, arch_last: bool = False, big: bool = False) -> Path:
    """A GGUF of ``arch`` with tokenizer fields (arrays of strings and of integers) and one tensor;
    ``arch_last``: general.architecture written after them (the gguf writer puts it first), ``big``:
    a big-endian file."""
    w = gguf.GGUFWriter(str(path), arch, endianess=gguf.GGUFEndian.BIG if big else gguf.GGUFEndian.LITTLE)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"tok{i}" for i in range(300)])
    w.add_token_types([1] * 300)
    w.add_token_merges(["t o", "to k"])
    w.add_array("test.nested", [[1, 2], ["a", "bc"]])
    if arch_last:
        w.kv_data[0]["general.architecture"] = w.kv_data[0].pop("general.architecture")
    w.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    fields = list(gguf.GGUFReader(str(path)).fields)
    assert (fields.index("general.architecture") > fields.index("tokenizer.ggml.tokens")) == arch_last, fields
    return path


@pytest.mark.parametrize("arch_last,big", [(False, False), (True, False), (True, True)],
                         ids=["arch-first", "arch-last", "arch-last-big-endian"])
def test_unsupported_gguf_architecture_refused_before_torch_loads(tmp_path, arch_last, big):
    """`orthros convert phi3.gguf OUT` was refused by inspect_gguf, after torch, transformers and accelerate had
    loaded (about 6 s; 13 s for a GGUF of a 151k vocabulary, which the gguf package's reader parses whole first):
    now the command's early check reads general.architecture from the header alone (no torch, no gguf package),
    wherever among the fields it stands, and refuses it in the same words, nothing written."""
    import subprocess
    import sys

    src = _other_arch_gguf(tmp_path / "phi3.gguf", arch_last=arch_last, big=big)
    code = ("import sys; from orthros.conversion.cli import main; rc = main(sys.argv[1:]); "
            "print(rc, [m for m in ('torch', 'transformers', 'accelerate', 'gguf') if m in sys.modules])")
    for argv in ([str(src), str(tmp_path / "out")], [str(tmp_path), str(tmp_path / "out"), "--dry-run"]):
        r = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=300)
        assert r.stdout.split("\n")[-2] == "2 []", (r.stdout, r.stderr)
        assert r.stderr == (f"orthros convert: error: {src}: cannot convert GGUF architecture 'phi3': supported are "
                            f"llama, qwen2, qwen3\n"), r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["phi3.gguf"]


def test_the_header_architecture_is_the_gguf_packages(gguf_source, tmp_path):
    """unconvertible_gguf reads general.architecture with the standard library (the gguf reader parses every
    field first): it reads what the gguf package reads, and nothing (``None``: the conversion's checks say
    why) where the file is damaged or no GGUF."""
    from orthros.checkpoint_files import unconvertible_gguf
    from orthros.conversion.gguf import _field_value

    files = [_other_arch_gguf(tmp_path / f"{i}.gguf", arch, arch_last=last, big=big)
             for i, (arch, last, big) in enumerate([("phi3", False, False), ("phi3", True, True), ("gemma2", True, False),
                                                     ("qwen2", True, False)])]
    for f in [gguf_source[0], *files]:
        arch = _field_value(gguf.GGUFReader(str(f)), "general.architecture")
        assert unconvertible_gguf(f) == (None if arch in ("llama", "qwen2") else (f, arch)), f
    whole = files[1].read_bytes()  # general.architecture last: a cut anywhere before its end
    for cut in (3, 10, 30, len(whole) // 2, whole.index(b"phi3") + 2):
        (tmp_path / "cut.gguf").write_bytes(whole[:cut])
        assert unconvertible_gguf(tmp_path / "cut.gguf") is None, cut
    (tmp_path / "junk.gguf").write_bytes(b"GGUF" + bytes(range(256)) * 4)
    assert unconvertible_gguf(tmp_path / "junk.gguf") is None
    assert unconvertible_gguf(tmp_path) is None  # several .gguf files: the conversion names them

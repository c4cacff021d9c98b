"""``orthros eval ppl``: perplexity by token-position bucket (issue 15)."""

from __future__ import annotations

import json
import math

import numpy as np

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoTokenizer

from orthros.evaluation.cli import main as eval_main
from orthros.evaluation.common import make_tiny_checkpoint
from orthros.evaluation.perplexity import (DEFAULT_BUCKETS, check_buckets, default_buckets, load_documents,
                                          make_windows, position_perplexity)

from conftest import checkpoint_missing

# tiny models: one torch thread each (2 per xdist worker on 2 cores ran several times slower)
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("ppl")
    ck = make_tiny_checkpoint(d / "ck", window_size=8, max_position_embeddings=256)
    data = d / "held.jsonl"
    rng = torch.Generator().manual_seed(0)
    words = ["thou", "art", "the", "king", "of", "Denmark", "and", "I", "am", "thy", "servant", "."]
    docs = [" ".join(words[i] for i in torch.randint(0, len(words), (n,), generator=rng).tolist()) for n in (400, 30, 250)]
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in docs))
    return ck, data


def test_buckets_equal_direct_cross_entropy(tiny):
    ck, data = tiny
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(ck)).eval()
    tok = AutoTokenizer.from_pretrained(str(ck))
    windows = make_windows(tok, load_documents(data), 64, max_windows=5)
    assert len(windows) == 5 and all(len(w) == 64 for w in windows)
    out = position_perplexity(model, windows, buckets=[0, 8, 32, 64], chunk=10, progress=False)
    ids = torch.tensor(windows)
    with torch.no_grad():
        nll = F.cross_entropy(model(ids).logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten(),
                              reduction="none").view(5, 63)
    for b, (lo, hi) in zip(out["buckets"], [(1, 8), (8, 32), (32, 64)]):
        want = nll[:, lo - 1:hi - 1].mean().item()
        assert b["tokens"] == 5 * (hi - lo) and math.isclose(b["nll"], want, rel_tol=1e-5), (b, want)
        assert math.isclose(b["ppl"], math.exp(want), rel_tol=1e-5)
    assert math.isclose(out["overall"]["nll"], nll.mean().item(), rel_tol=1e-5)
    assert [b["bucket"] for b in out["buckets"]] == ["0-8", "8-32", "32-64"]


def test_windows_and_bucket_checks(tiny):
    _, data = tiny
    tok = AutoTokenizer.from_pretrained(str(tiny[0]))
    docs = load_documents(data)
    w = make_windows(tok, docs, 100)
    first = tok(docs[0], add_special_tokens=False)["input_ids"]
    assert w[0] == first[:100] and w[1] == first[100:200]  # consecutive, from the document's start
    with pytest.raises(ValueError, match="no held-out document has 100000 tokens"):
        make_windows(tok, docs, 100000)
    with pytest.raises(ValueError, match="increasing"):
        check_buckets([0, 64, 32], 128)
    with pytest.raises(ValueError, match="beyond --seq-len"):
        check_buckets([0, 512], 128)
    # was accepted: the bucket 0-1 (position 0 is never predicted) was dropped, an empty table column
    with pytest.raises(ValueError, match="the bucket 0-1 holds no scored token"):
        check_buckets([0, 1], 128)
    assert check_buckets([1, 64], 128) == [1, 64]


@pytest.mark.parametrize("chunk", [0, -4])
def test_chunk_below_one_is_refused(tiny, chunk):
    """Issue: chunk=-4 scored no position and reported perplexity 1.0 everywhere; chunk=0 ended in range()."""
    from orthros.evaluation.common import load_model

    with pytest.raises(ValueError, match=f"chunk .* must be an integer >= 1, got {chunk}"):
        position_perplexity(load_model(tiny[0]), [[1, 2, 3, 4]], buckets=[0, 4], chunk=chunk, progress=False)


def test_default_buckets_end_at_a_shorter_seq_len(tiny, tmp_path, capsys):
    """Issue: the default --buckets (0,128,512,2048,8192) was refused with any --seq-len below 8192
    ("the last edge (8192) is beyond --seq-len"), an option the user had not given."""
    assert default_buckets(64) == [0, 64] and default_buckets(1000) == [0, 128, 512, 1000]
    assert default_buckets(8192) == default_buckets(16384) == list(DEFAULT_BUCKETS)
    ck, data = tiny
    out = tmp_path / "ppl.json"
    assert eval_main(["ppl", "--model", str(ck), "--data", str(data), "--seq-len", "192", "--windows", "1",
                      "--no-progress", "-o", str(out)]) == 0
    assert [b["bucket"] for b in json.loads(out.read_text())["buckets"]] == ["0-128", "128-192"]
    assert "| model | 0-128 | 128-192 | all |" in capsys.readouterr().out


def test_seq_len_defaults_to_a_shorter_models_positions(tiny, tmp_path, capsys):
    """Issue: --seq-len defaulted to 8192 and refused every model of fewer positions ("--seq-len 8192
    is above the model's max_position_embeddings"), an option the user had not given."""
    ck, data = tiny
    out = tmp_path / "ppl.json"
    assert eval_main(["ppl", "--model", str(ck), "--data", str(data), "--windows", "1", "--no-progress",
                      "-o", str(out)]) == 0
    assert [b["bucket"] for b in json.loads(out.read_text())["buckets"]] == ["0-128", "128-256"]


def test_cli(tiny, tmp_path, capsys):
    ck, data = tiny
    out = tmp_path / "ppl.json"
    args = ["ppl", "--model", str(ck), "--data", str(data), "--seq-len", "64", "--windows", "3",
            "--buckets", "0,8,64", "--no-progress"]
    assert eval_main(args + ["-o", str(out), "--plot", str(tmp_path / "ppl.png")]) == 0
    assert (tmp_path / "ppl.png").read_bytes().startswith(b"\x89PNG")
    r = json.loads(out.read_text())
    assert r["windows"] == 3 and r["attention_mode"] == "orthros" and len(r["buckets"]) == 2
    # what the figures depend on besides the weights (a converted model's window is --window; --dtype)
    assert (r["window_size"], r["data"], r["tokenizer"], r["device"], r["dtype"]) == (8, str(data), str(ck), "cpu",
                                                                                      "fp32")
    # "transformer" is "full" here too, as in OrthrosConfig and the engine (the option took orthros/full/window only)
    assert eval_main(args + ["-o", str(tmp_path / "full.json"), "--attention-mode", "transformer"]) == 0
    f = json.loads((tmp_path / "full.json").read_text())
    assert f["attention_mode"] == "full"
    # positions inside the window (<= 8 tokens seen) are the same model; beyond it they differ
    assert math.isclose(f["buckets"][0]["nll"], r["buckets"][0]["nll"], rel_tol=1e-5)
    assert not math.isclose(f["buckets"][1]["nll"], r["buckets"][1]["nll"], rel_tol=1e-4)
    capsys.readouterr()
    assert eval_main(["ppl", "--model", str(ck), "--data", str(tmp_path / "missing.jsonl")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert eval_main(["ppl", "--model", str(ck), "--data", str(tmp_path)]) == 2  # was: "no such file"
    assert "a folder, not a file" in capsys.readouterr().err
    assert eval_main(["ppl", "--model", str(ck), "--data", str(data), "--buckets", "0,9000"]) == 2
    assert "beyond --seq-len" in capsys.readouterr().err
    assert eval_main(["ppl", "--model", str(ck), "--data", str(data), "--plot", "p.pdf"]) == 2
    assert "--plot p.pdf: a .png path is needed" in capsys.readouterr().err


def test_plot_draws_each_models_curve(tiny, tmp_path):
    """plot_position_perplexity: a line a model, exp of each 64-position bin's NLL."""
    from orthros.evaluation.common import load_model, load_tokenizer
    from orthros.evaluation.perplexity import plot_position_perplexity

    ck, data = tiny
    windows = make_windows(load_tokenizer(ck, None), load_documents(data), 192, 2)
    r = position_perplexity(load_model(ck), windows, buckets=[0, 64, 192], progress=False)
    fig = plot_position_perplexity({"a": r, "b": r}, tmp_path / "p.png")
    lines = fig.axes[0].get_lines()
    assert [line.get_label() for line in lines[:2]] == [f"{n}: {r['overall']['ppl']:.3f} overall" for n in "ab"]
    assert np.allclose(lines[0].get_ydata(), [math.exp(p["nll"]) for p in r["curve"]])
    assert len(r["curve"]) == 3 and (tmp_path / "p.png").is_file()


@pytest.mark.parametrize("seq_len, buckets", [(128, None), (192, [0, 64, 192])])
def test_plot_ticks_are_the_measured_lengths(tiny, tmp_path, seq_len, buckets):
    """Was: with --seq-len 128 the log axis had ticks at 32 and 64 only, the window's end unmarked. Now
    its ticks are the window's end, the bucket edges and powers of two between, each labelled, all shown."""
    from orthros.evaluation.common import load_model, load_tokenizer
    from orthros.evaluation.perplexity import plot_position_perplexity

    ck, data = tiny
    windows = make_windows(load_tokenizer(ck, None), load_documents(data), seq_len, 1)
    r = position_perplexity(load_model(ck), windows, buckets=buckets, progress=False)
    fig = plot_position_perplexity({"a": r}, tmp_path / "p.png")
    ax = fig.axes[0]
    ticks = list(ax.get_xticks())
    lo, hi = ax.get_xlim()
    assert seq_len in ticks and all(lo <= t <= hi for t in ticks), (ticks, lo, hi)
    assert all(b["start"] in ticks for b in r["buckets"][1:])
    assert min(ticks) <= min(ax.get_lines()[0].get_xdata())  # the first point has a tick at or before it
    fig.canvas.draw()
    assert [t.get_text() for t in ax.get_xticklabels()][-1] == str(seq_len)


@pytest.mark.parametrize("extra, says", [
    (["--device", "bogus"], "--device must be cpu, cuda or cuda:N, got 'bogus'"),
    (["--seq-len", "300", "--buckets", "0,300"], "--seq-len 300 is above the model's max_position_embeddings (256)"),
    (["-o", "{tmp}"], "-o {tmp}: is a directory"),  # named as typed (was --output after -o)
    (["--output", "{tmp}"], "--output {tmp}: is a directory"),
    (["-o", "{file}/x.json"], "is a file, not a directory"),
    (["--plot", "{file}/x.png"], "is a file, not a directory"),
    # were run, then the PNG replaced the JSON ('wrote r.png' twice), or the JSON replaced the held-out data
    (["-o", "{tmp}/r.png", "--plot", "{tmp}/r.png"], "-o {tmp}/r.png and --plot {tmp}/r.png name the same file"),
    (["-o", "{data}"], "-o {data} is the --data file"),
    # were written over the checkpoint after the evaluation (its config replaced by the results)
    (["-o", "{ck}/config.json"], "-o {ck}/config.json is a file of the --model checkpoint {ck}"),
    (["--output", "{ck}/tokenizer.json"], "--output {ck}/tokenizer.json is a file of the --model checkpoint"),
    # one message for both said "--seq-len must be >= 2 and --windows >= 1, got None and 0" (--windows 0 alone)
    (["--windows", "0"], "--windows must be >= 1, got 0"),
    (["--seq-len", "1"], "--seq-len must be >= 2, got 1"),
])
def test_cli_bad_input_refused_before_the_model_loads(tiny, tmp_path, capsys, no_model_load, extra, says):
    """Issue: a bad --device, a --seq-len beyond the model, an --output that is a directory (or under a file)
    failed only after loading the model (and, for the paths, after the whole evaluation); an --output that
    was the --plot or the --data file was overwritten after the evaluation."""
    ck, _ = tiny
    data = tmp_path / "long.jsonl"
    data.write_text(json.dumps({"text": " ".join(["thou art the king"] * 300)}) + "\n")
    (tmp_path / "f").write_text("x")
    extra = [x.format(tmp=tmp_path, file=tmp_path / "f", data=data, ck=ck) for x in extra]
    args = ["ppl", "--model", str(ck), "--data", str(data), "--seq-len", "16", "--buckets", "0,16", "--no-progress"]
    config = (ck / "config.json").read_text()
    assert eval_main(args + extra) == 2
    assert says.format(tmp=tmp_path, data=data, ck=ck) in capsys.readouterr().err
    assert (ck / "config.json").read_text() == config
    assert json.loads(data.read_text())["text"].startswith("thou art")


@pytest.mark.parametrize("name", ["bin.txt", "bin.jsonl"])
def test_binary_data_is_named(tiny, tmp_path, capsys, name):
    """Issue: a --data file that is not UTF-8 text gave only `'utf-8' codec can't decode byte ...`."""
    ck, _ = tiny
    data = tmp_path / name
    data.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe" * 8)
    assert eval_main(["ppl", "--model", str(ck), "--data", str(data), "--seq-len", "16", "--buckets", "0,16"]) == 2
    err = capsys.readouterr().err
    assert f"--data {data}: not UTF-8 text" in err


def test_window_is_refused_for_an_orthros_checkpoint_and_reaches_a_conversion(tiny, tmp_path, capsys, monkeypatch):
    """Issue: `--window N` ("window when converting a Transformer checkpoint") was accepted for an Orthros
    checkpoint and silently ignored: the perplexities were those of the checkpoint's own window."""
    import orthros.evaluation.common as common
    from transformers import LlamaConfig, LlamaForCausalLM

    ck, data = tiny
    args = ["ppl", "--data", str(data), "--seq-len", "16", "--buckets", "0,16", "--no-progress", "--device", "cpu"]
    monkeypatch.setattr(common, "load_model", lambda *a, **kw: pytest.fail("the model was loaded"))
    assert eval_main(args + ["--model", str(ck), "--window", "4"]) == 2
    err = capsys.readouterr().err
    assert "--window applies to a Llama / Qwen2 / Qwen3 / Mistral / Qwen3.5 checkpoint converted on the fly" in err
    assert "is an Orthros checkpoint, which keeps its own window (8)" in err
    # a Llama checkpoint is converted with the --window given (default 128)
    tok = AutoTokenizer.from_pretrained(str(ck))
    llama = tmp_path / "llama"
    LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                 num_attention_heads=2, max_position_embeddings=256)).save_pretrained(llama)
    tok.save_pretrained(llama)
    seen = []

    def record(path, **kw):
        seen.append(kw["window_size"])
        raise ValueError("stop here")

    monkeypatch.setattr(common, "load_model", record)
    assert eval_main(args + ["--model", str(llama), "--window", "4"]) == 2
    assert eval_main(args + ["--model", str(llama)]) == 2
    assert seen == [4, 128]
    # a window beyond the model's positions was refused by the conversion as "window_size=300 exceeds the
    # source's max_position_embeddings=256; choose a window_size <= 256", an option `eval` does not have
    assert eval_main(args + ["--model", str(llama), "--window", "300"]) == 2
    assert ("--window 300 exceeds the max_position_embeddings (256) of --model "
            f"{llama}: the window would hold every position (no sliding window); give --window <= 256"
            in capsys.readouterr().err)
    short = tmp_path / "short"
    LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                 num_attention_heads=2, max_position_embeddings=64)).save_pretrained(short)
    tok.save_pretrained(short)
    assert eval_main(args + ["--model", str(short)]) == 2
    assert "--window 128 (the default) exceeds the max_position_embeddings (64)" in capsys.readouterr().err
    assert seen == [4, 128]
    # --attention-mode is for an Orthros checkpoint: refused before the held-out text is tokenized (it was
    # refused only after every window had been cut)
    import orthros.evaluation.perplexity as perplexity

    monkeypatch.setattr(perplexity, "make_windows", lambda *a, **kw: pytest.fail("the windows were cut"))
    capsys.readouterr()
    assert eval_main(args + ["--model", str(llama), "--attention-mode", "swa"]) == 2
    assert "--attention-mode applies to Orthros checkpoints" in capsys.readouterr().err


@pytest.mark.parametrize("mode", [None, "orthros", "swa"])
def test_a_checkpoint_missing_a_tensor_is_refused_with_or_without_attention_mode(tiny, tmp_path, capsys, mode):
    """Issue: with --attention-mode the model was loaded past load_model's check that the weights fit
    config.json, so a checkpoint missing a tensor was scored with that tensor at random (transformers only
    logged it)."""
    ck, data = tiny
    broken = checkpoint_missing(ck, tmp_path / "broken", "model.layers.1.mlp.down_proj.weight")
    args = ["ppl", "--model", str(broken), "--data", str(data), "--seq-len", "16", "--buckets", "0,16",
            "--no-progress", "--device", "cpu"] + (["--attention-mode", mode] if mode else [])
    assert eval_main(args) == 2
    assert "the weights do not fit its config.json: missing model.layers.1.mlp.down_proj.weight" in \
        capsys.readouterr().err


def test_a_tokenizer_beyond_the_models_vocabulary_is_named(tiny, tmp_path, capsys, no_model_load):
    """Issue: ids beyond the model's vocab_size (a --tokenizer of another model) ended in `IndexError: index
    out of range in self` from the embedding, after the model had loaded."""
    ck, data = tiny
    small = make_tiny_checkpoint(tmp_path / "small", vocab_size=300, max_position_embeddings=256)
    args = ["ppl", "--data", str(data), "--seq-len", "16", "--buckets", "0,16", "--no-progress", "--device", "cpu"]
    assert eval_main(args + ["--model", str(small)]) == 2
    err = capsys.readouterr().err
    assert f"the tokenizer of --model {small} gives token ids up to" in err
    assert "beyond the model's vocab_size (300): not this model's tokenizer" in err
    assert eval_main(args + ["--model", str(small), "--tokenizer", str(ck)]) == 2
    assert f"--tokenizer {ck} gives token ids up to" in capsys.readouterr().err


def test_a_jsonl_file_is_read_as_jsonl_whatever_the_case_of_its_suffix(tmp_path):
    """Issue: `held.JSONL` was read as one plain-text document, so its JSON syntax ({"text": ...) was scored."""
    p = tmp_path / "held.JSONL"
    p.write_text(json.dumps({"text": "thou art"}) + "\n" + json.dumps({"text": "the king"}) + "\n")
    assert load_documents(p) == ["thou art", "the king"]


def test_cli_names_the_model_given_as_dot(tiny, capsys, monkeypatch):
    """Issue: `--model .` (run inside the checkpoint) printed the table's row with an empty model name
    (`Path(".").name` is "")."""
    ck, data = tiny
    monkeypatch.chdir(ck)
    assert eval_main(["ppl", "--model", ".", "--data", str(data), "--seq-len", "64", "--windows", "1",
                      "--no-progress"]) == 0
    row = capsys.readouterr().out.splitlines()[2]
    assert row.startswith(f"| {ck.name} | "), row


def test_a_json_file_is_refused_not_scored_as_text(tmp_path):
    """Issue: a `.json` --data (say a list of {"text": ...} records) was read as one plain-text document, its
    brackets, quotes and field names scored as held-out text."""
    p = tmp_path / "held.json"
    p.write_text(json.dumps([{"text": "thou art the king"}]))
    with pytest.raises(ValueError, match=r"--data .*held\.json: a \.json file; give a \.jsonl"):
        load_documents(p)


@pytest.fixture(scope="module")
def mistral_with_sliding_window(tiny):
    """A Mistral checkpoint whose own sliding window (32) the conversion does not keep: a conversion note."""
    from transformers import MistralConfig, MistralForCausalLM

    ck, _ = tiny
    tok = AutoTokenizer.from_pretrained(str(ck))
    src = ck.parent / "mistral"
    torch.manual_seed(0)
    MistralForCausalLM(MistralConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                     num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                                     sliding_window=32)).save_pretrained(src)
    tok.save_pretrained(src)
    return src


def test_notes_of_a_conversion_on_the_fly_print_as_one_line_notes(tiny, mistral_with_sliding_window, capfd):
    """Was: `eval ppl --model <a checkpoint to convert>` showed the conversion's notes as raw Python warnings
    ("convert.py:740: UserWarning: convert_from_hf: ..." and the source line `return _finish_model(...)`)."""
    import warnings

    _, data = tiny
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert eval_main(["ppl", "--model", str(mistral_with_sliding_window), "--window", "8", "--data", str(data),
                          "--seq-len", "16", "--windows", "1", "--no-progress", "--device", "cpu"]) == 0
    out, err = capfd.readouterr()
    assert not [w for w in caught if "convert_from_hf" in str(w.message)]
    notes = [line for line in err.splitlines() if line.startswith("note: ")]
    assert any("sliding-window attention of 32 tokens" in n for n in notes), err
    assert "UserWarning" not in err and "_finish_model" not in err and "note:" not in out


def test_convert_from_hf_notes_warn_at_the_callers_line_or_go_to_on_note(mistral_with_sliding_window):
    """The Python API's warning named convert.py (the `@torch.no_grad` wrapper took a stack level), not
    the caller; ``on_note`` takes the notes instead of warnings."""
    import warnings

    from orthros.conversion import convert_from_hf

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        convert_from_hf(mistral_with_sliding_window, window_size=8)
    mine = [w for w in caught if "convert_from_hf: " in str(w.message)]
    assert mine and all(w.filename == __file__ for w in mine), [(w.filename, w.lineno) for w in mine]
    got = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        convert_from_hf(mistral_with_sliding_window, window_size=8, on_note=got.append)
    assert not [w for w in caught if "convert_from_hf" in str(w.message)]
    assert [f"convert_from_hf: {n}" for n in got] == [str(w.message) for w in mine]


def test_attention_mode_is_refused_for_a_model_with_no_attention_layer(tiny, tmp_path, capsys, no_model_load):
    """Issue: --attention-mode orthros on an all-GDN checkpoint was scored and reported as "(orthros)": with no
    attention layer to override, the mode only turned an output stream through the GDN layers on (its query
    bypasses the convolution), other numbers under another attention's name."""
    _, data = tiny
    gdn = make_tiny_checkpoint(tmp_path / "gdn", max_position_embeddings=256, attention_mode="full",
                               layer_types=["linear_attention"] * 2)
    args = ["ppl", "--model", str(gdn), "--data", str(data), "--seq-len", "16", "--buckets", "0,16",
            "--no-progress", "--device", "cpu"]
    assert eval_main(args + ["--attention-mode", "orthros"]) == 2
    err = capsys.readouterr().err
    assert f"--attention-mode orthros: --model {gdn} has no attention layer" in err
    assert "linear_attention" in err and "drop --attention-mode" in err


def test_cli_a_failed_plot_leaves_no_json_and_names_plot(tiny, tmp_path, capsys, monkeypatch):
    """Issue: the plot's write error named no option, and the results JSON stayed behind although the
    command failed."""
    from matplotlib.figure import Figure

    def full(self, *a, **kw):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Figure, "savefig", full)
    ck, data = tiny
    with pytest.raises(OSError, match=r"--plot .*p\.png: cannot write the figure \(No space left"):
        eval_main(["ppl", "--model", str(ck), "--data", str(data), "--seq-len", "64", "--windows", "1",
                   "--no-progress", "-o", str(tmp_path / "p.json"), "--plot", str(tmp_path / "p.png")])
    assert list(tmp_path.iterdir()) == []

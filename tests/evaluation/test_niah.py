"""NIAH: scorer, prompt construction, grid run on a tiny random model, and bad input."""

import json
import re

import pytest

from orthros.evaluation.niah import (NIAHConfig, PromptBuilder, check_lengths, format_grid, prefix_match, run_niah,
                                    save_heatmap, score_answer, validate)

# tiny models: one torch thread each (2 per xdist worker on 2 cores ran several times slower)
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("pred, answer, want", [
    (" 4821937.", "4821937", 1.0),
    ("The secret number is 4821937", "4821937", 1.0),
    ("4821937", "4821937", 1.0),
    ("\n4821937 is it", " 4821937 ", 1.0),
    ("PassKey", "passkey", 1.0),
    (" 482193", "4821937", 0.0),  # truncated
    (" 48219370", "4821937", 0.0),  # inside a longer number
    (" 14821937", "4821937", 0.0),
    (" 4821 937", "4821937", 0.0),
    ("", "4821937", 0.0),
    (" I do not know.", "4821937", 0.0),
    (" 1234567", "4821937", 0.0),
    (" 4821937.5", "4821937", 0.0),  # another number (was a hit)
    (" 3.4821937", "4821937", 0.0),
    (" 1,4821937", "4821937", 0.0),
    ("It is 4821937, I think.", "4821937", 1.0),
])
def test_scorer_known_right_and_wrong(pred, answer, want):
    assert score_answer(pred, answer) == want


@pytest.mark.parametrize("pred,answer,want", [
    (" 4821937.", "4821937", 1.0),
    (" 525869.\n\n52", "5258698", 6 / 7),  # retrieved, one digit short (a real SmolLM2 answer)
    (" 225.\n\n23:1 And", "5258698", 0.0),  # a different number
    (" the number 48x", "4821937", 2 / 7),  # the first number in the text counts
    (" I do not know.", "4821937", 0.0),
    ("", "4821937", 0.0),
    (" 48219370", "4821937", 1.0),  # prefix-complete although the exact score is 0
])
def test_prefix_match_is_a_diagnostic_of_partial_retrieval(pred, answer, want):
    assert prefix_match(pred, answer) == pytest.approx(want)


def test_scorer_rejects_empty_answer():
    with pytest.raises(ValueError):
        score_answer("x", "  ")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from orthros.evaluation.common import make_tiny_checkpoint

    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "ckpt", max_position_embeddings=512)


@pytest.fixture(scope="module")
def tok(tiny):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny))


@pytest.mark.parametrize("haystack", ["synthetic", "corpus"])
def test_prompts_have_exact_length_and_needle_at_depth(tok, haystack):
    from orthros.evaluation.niah import CORPUS_FILE

    if haystack == "corpus" and not CORPUS_FILE.is_file():
        pytest.skip("shipped corpus not present")
    b = PromptBuilder(tok, haystack, seed=0)
    needle = b._enc(" The secret number is 5551234.")
    for L in (100, 300):
        offs = []
        for d in (0, 50, 100):
            ids, off = b.build(L, d, "5551234")
            assert len(ids) == L
            assert ids[off:off + len(needle)] == needle
            assert ids[-len(b.question):] == b.question
            offs.append(off)
        assert offs[0] <= 1 < offs[1] < offs[2]
        text = tok.decode(ids)
        assert text.count("5551234") == 1


def test_run_niah_on_tiny_model(tiny, tok, tmp_path):
    from orthros.evaluation.common import load_model

    model = load_model(tiny)
    cfg = NIAHConfig(lengths=[64, 128], depths=[0, 50, 100], samples=1, engine="off")
    out = run_niah(model, tok, cfg, progress=False)
    assert len(out["records"]) == 6
    assert len(out["grid"]["accuracy"]) == 3 and len(out["grid"]["accuracy"][0]) == 2
    for r in out["records"]:
        assert r["score"] == score_answer(r["prediction"], r["answer"])
        assert r["prefix"] == pytest.approx(prefix_match(r["prediction"], r["answer"]), abs=1e-4)
    assert out["prefix_accuracy"] == pytest.approx(sum(r["prefix"] for r in out["records"]) / 6, abs=1e-4)
    assert out["run"] == {"generator": "transformers", "device": "cpu", "dtype": "fp32"}  # was: not recorded
    assert "depth" in format_grid(out)
    save_heatmap(out, tmp_path / "h.png")
    assert (tmp_path / "h.png").stat().st_size > 1000
    json.dumps(out)


@pytest.mark.parametrize("engine", ["off", "on"])
def test_context_at_the_model_maximum_fits_the_answer(tiny, tok, engine):
    """A context length equal to max_position_embeddings (8K on SmolLM2) runs with both generators:
    the prompt gives up the answer's positions instead of decoding past the model's maximum
    (which the engine refuses)."""
    from orthros.evaluation.common import load_model

    model = load_model(tiny)
    L = model.config.max_position_embeddings
    logs = []
    out = run_niah(model, tok, NIAHConfig(lengths=[128, L], depths=[50], samples=1, engine=engine),
                   progress=False, log=logs.append)
    by_len = {r["length"]: r for r in out["records"]}
    assert by_len[128]["prompt_tokens"] == 128
    assert L - 16 <= by_len[L]["prompt_tokens"] < L
    assert any("shortened" in m for m in logs)


def test_cli_niah_writes_json_and_png(tiny, tmp_path):
    from orthros.cli import main

    rc = main(["eval", "niah", "--model", str(tiny), "--lengths", "64", "--depths", "0,100", "--samples", "1",
               "--device", "cpu", "--no-progress", "-o", str(tmp_path / "n")])
    assert rc == 0
    res = json.loads((tmp_path / "n" / "niah.json").read_text())
    assert res["grid"]["lengths"] == [64] and res["grid"]["depths"] == [0, 100]
    assert (tmp_path / "n" / "niah.png").is_file()


@pytest.mark.parametrize("args, msg", [
    (["--lengths", "1024"], "--lengths): 1024 is above the model's maximum"),
    (["--lengths", "16"], "lengths (--lengths) must be integers >= 32"),
    (["--depths", "0,120"], "depths (--depths) are percentages and must lie in 0..100"),
    (["--depths", "-5"], "0..100"),
    (["--samples", "0"], "samples (--samples) must be"),
    (["--digits", "19"], "digits (--digits) must be"),
    (["--lengths", "abc"], "comma-separated list of integers"),
    (["--haystack", "nowhere.txt"], "--haystack"),
])
def test_cli_niah_bad_input(tiny, tmp_path, capsys, args, msg):
    from orthros.cli import main

    out = tmp_path / "never"
    rc = main(["eval", "niah", "--model", str(tiny), "--device", "cpu", "--no-progress", "-o", str(out)] + args)
    assert rc == 2
    assert msg in capsys.readouterr().err
    assert not out.exists(), "nothing is written on bad input"


def test_cli_niah_bad_model_path(tmp_path, capsys):
    from orthros.cli import main

    assert main(["eval", "niah", "--model", str(tmp_path / "missing")]) == 2
    assert "no such file or directory" in capsys.readouterr().err
    assert main(["eval", "niah", "--model", str(tmp_path)]) == 2
    assert "no config.json" in capsys.readouterr().err
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    assert main(["eval", "niah", "--model", str(tmp_path)]) == 2
    assert "not an Orthros checkpoint and not convertible" in capsys.readouterr().err


def test_evaluations_take_what_orthros_convert_takes(tmp_path):
    # the evaluations kept their own list of convertible model types, without Qwen3.5 (`orthros eval lm --model` of
    # a Qwen3.5 checkpoint was refused as not convertible); they use the loader's, kept equal to the converter's
    from orthros.evaluation.common import read_model_type
    from orthros.checkpoint_files import CONVERTIBLE

    for mt in CONVERTIBLE:
        (tmp_path / "config.json").write_text(json.dumps({"model_type": mt}))
        assert read_model_type(tmp_path) == mt


def test_validate_context_too_short_for_needle(tiny, tok):
    from orthros.evaluation.common import load_model

    with pytest.raises(ValueError, match="too short"):
        run_niah(load_model(tiny), tok, NIAHConfig(lengths=[33], depths=[50], samples=1), progress=False)
    # the refused length named neither the option nor the shortest length taken (37 + 8 haystack tokens)
    with pytest.raises(ValueError, match=re.escape("lengths (--lengths): context length 44 is too short: the "
                                                   "needle and question alone take 37 tokens; use lengths >= 45")):
        check_lengths(NIAHConfig(lengths=[64, 44]), tok)
    check_lengths(NIAHConfig(lengths=[45]), tok)
    with pytest.raises(ValueError, match="samples"):
        validate(NIAHConfig(samples=0))


@pytest.mark.parametrize("kw", [{"lengths": []}, {"depths": []}])
def test_validate_needs_a_length_and_a_depth(kw):
    with pytest.raises(ValueError, match="at least one context length and one depth"):
        validate(NIAHConfig(**kw))


@pytest.mark.parametrize("args, msg", [
    (["--lengths", "1024"], "--lengths): 1024 is above the model's maximum"),
    (["--lengths", "40"], "context length 40 is too short"),
    (["--seed", "-1"], "seed (--seed) must be an integer >= 0"),
    (["--device", "bogus"], "--device must be cpu, cuda or cuda:N, got 'bogus'"),
    # named the folder only; then the argument, once torch had loaded; now before, as `orthros generate` says it
    (["--tokenizer", "{tmp}"], "--tokenizer {tmp}: no tokenizer files (tokenizer.json"),
    (["--haystack", "{tmp}/digits.txt"], "has no text"),
    (["--haystack", "{tmp}/bad.jsonl"], "--haystack {tmp}/bad.jsonl: line 2 is not JSON"),
    (["--haystack", "{tmp}/bin.txt"], "--haystack {tmp}/bin.txt: not UTF-8 text"),
    # was a TypeError traceback from re.sub (a number, not a string, in 'text')
    (["--haystack", "{tmp}/num.jsonl"], "--haystack {tmp}/num.jsonl: line 2 has no string field 'text'"),
    # said it must be "a path to a .txt/.jsonl file, got 'nowhere.txt'": what is wrong with the path is said
    (["--haystack", "{tmp}/nowhere.txt"], "--haystack {tmp}/nowhere.txt: no such file"),
    (["--haystack", "{tmp}"], "--haystack {tmp}: a folder, not a file"),
    (["-o", "{tmp}/f"], "-o {tmp}/f: {tmp}/f is a file, not a directory"),  # as typed (was --output-dir)
    (["--output-dir", "{tmp}/f"], "--output-dir {tmp}/f: {tmp}/f is a file, not a directory"),
])
def test_cli_niah_bad_input_before_the_model_loads(tiny, tmp_path, capsys, no_model_load, args, msg):
    """Issue: these were refused only after the model had loaded (a bad haystack, --tokenizer, --seed,
    --device or a too-short context length), or after the whole grid had run (--output-dir a file)."""
    from orthros.cli import main

    (tmp_path / "digits.txt").write_text("1234 5678\n")
    (tmp_path / "bad.jsonl").write_text('{"text": "a b c."}\nnot json\n')
    (tmp_path / "num.jsonl").write_text('{"text": "a b c."}\n{"text": 5}\n')
    (tmp_path / "bin.txt").write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe" * 8)
    (tmp_path / "f").write_text("x")
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    rc = main(["eval", "niah", "--model", str(tiny), "--no-progress", "--engine", "off", "--samples", "1",
               "--lengths", "64", "--depths", "50", "-o", str(tmp_path / "out")] + args)
    assert rc == 2
    assert msg.replace("{tmp}", str(tmp_path)) in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_cli_niah_window_refused_for_an_orthros_checkpoint(tiny, tmp_path, capsys, no_model_load):
    """Issue: `--window 64` was accepted for an Orthros checkpoint and ignored (it only sets the window of
    a Transformer checkpoint converted on the fly): the grid was that of the checkpoint's window."""
    from orthros.cli import main

    rc = main(["eval", "niah", "--model", str(tiny), "--window", "64", "--no-progress", "--engine", "off",
               "--lengths", "64", "--depths", "50", "-o", str(tmp_path / "out")])
    assert rc == 2
    assert "--window applies to a Llama / Qwen2 / Qwen3 / Mistral / Qwen3.5 checkpoint" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_tokenizer_beyond_the_models_vocabulary_is_named(tiny, tmp_path, capsys, no_model_load):
    """Issue: a tokenizer that is not the model's (ids beyond its vocab_size, e.g. a --tokenizer of another
    model) ended in `IndexError: index out of range in self` from the embedding, after the model had loaded."""
    from orthros.cli import main
    from orthros.evaluation.common import make_tiny_checkpoint

    small = make_tiny_checkpoint(tmp_path / "small", vocab_size=300, max_position_embeddings=512)
    rc = main(["eval", "niah", "--model", str(small), "--no-progress", "--engine", "off", "--samples", "1",
               "--lengths", "64", "--depths", "50", "-o", str(tmp_path / "out")])
    assert rc == 2
    err = capsys.readouterr().err
    assert f"the tokenizer of --model {small} gives token ids up to" in err
    assert "beyond the model's vocab_size (300): not this model's tokenizer" in err
    assert not (tmp_path / "out").exists()


def test_run_niah_checks_the_tokenizer_against_the_model(tok):
    import torch

    from orthros.evaluation.niah import PromptBuilder
    from orthros.models import OrthrosConfig, OrthrosForCausalLM

    model = OrthrosForCausalLM(OrthrosConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                             num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                             max_position_embeddings=512, window_size=8)).eval()
    assert PromptBuilder(tok, "synthetic").max_id >= 300
    with torch.no_grad(), pytest.raises(ValueError, match=r"beyond the model's vocab_size \(300\)"):
        run_niah(model, tok, NIAHConfig(lengths=[64], depths=[50], samples=1, engine="off"), progress=False)


def test_a_length_at_a_small_models_maximum_is_refused_before_the_model_loads(tmp_path, capsys, no_model_load):
    """Issue: at the model's maximum a prompt gives up the answer's tokens; on a model of 48 positions that
    left 36 tokens for a 37-token needle and question: `context length 36 is too short` (a length never
    asked for) after the model had loaded and the shorter lengths had run."""
    from orthros.cli import main
    from orthros.evaluation.common import make_tiny_checkpoint

    small = make_tiny_checkpoint(tmp_path / "small", max_position_embeddings=48)
    rc = main(["eval", "niah", "--model", str(small), "--no-progress", "--engine", "off", "--samples", "1",
               "--lengths", "48", "--depths", "50", "-o", str(tmp_path / "out")])
    assert rc == 2
    err = capsys.readouterr().err
    assert "context length 48 is too short" in err and "max_position_embeddings (48)" in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kw, says", [({"lengths": [64, 128, 64]}, "lengths (--lengths) names 64 twice"),
                                      ({"depths": [0, 50, 50.0]}, "depths (--depths) names 50 twice")])
def test_validate_refuses_a_repeated_length_or_depth(kw, says):
    """Issue: `--lengths 64,64` ran every needle twice and drew the grid with two identical columns, each the
    mean of both columns' needles (2 x --samples per cell)."""
    with pytest.raises(ValueError, match=re.escape(says)):
        validate(NIAHConfig(**kw))


def test_cli_niah_a_failed_heatmap_leaves_no_json_and_names_the_option(tiny, tmp_path, capsys, monkeypatch):
    """Issue: the heatmap's write error named no option, and niah.json (and the folder made for both)
    stayed behind although the command failed."""
    from matplotlib.figure import Figure

    from orthros.cli import main

    def full(self, *a, **kw):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Figure, "savefig", full)
    rc = main(["eval", "niah", "--model", str(tiny), "--lengths", "64", "--depths", "0", "--samples", "1",
               "--device", "cpu", "--no-progress", "-o", str(tmp_path / "n")])
    assert rc == 1
    err = capsys.readouterr().err
    assert f"-o {tmp_path / 'n' / 'niah.png'}: cannot write the figure (No space left" in err, err  # as typed
    assert list(tmp_path.iterdir()) == []

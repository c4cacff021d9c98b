"""NIAH training data: same prompt as `orthros eval niah` scores, labels only on the answer;
a few training steps lower the loss."""

import re

import numpy as np
import pytest
import torch

from orthros.evaluation.niah import NEEDLE, PromptBuilder, score_answer
from orthros.evaluation.niah_train import IGNORE, NIAHTrainConfig, answer_ids, build_model, make_batch, make_example

# tiny models: one torch thread each (2 per xdist worker on 2 cores ran several times slower)
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tok():
    from orthros.data import load_tokenizer

    return load_tokenizer()


def test_example_is_the_eval_prompt_plus_answer(tok):
    key = "4821937"
    ex = make_example(PromptBuilder(tok, "synthetic", seed=5), 96, 50, key)
    # the prompt part is byte-for-byte what niah.py builds (same builder seed, same call)
    want, at = PromptBuilder(tok, "synthetic", seed=5).build(96, 50, key)
    ids, labels, n = ex["input_ids"], ex["labels"], ex["prompt_len"]
    assert n == 96 and ids[:n] == want and ex["needle_at"] == at
    # the needle sentence sits in the prompt where the builder put it
    needle = tok(NEEDLE.format(key=key), add_special_tokens=False)["input_ids"]
    assert ids[at:at + len(needle)] == needle
    # labels: -100 on the whole prompt, the answer tokens after it, nothing else
    ans = answer_ids(PromptBuilder(tok, "synthetic"), key)
    assert ids[n:] == ans
    assert labels[:n] == [IGNORE] * n and labels[n:] == ans
    # the answer is what the evaluation scores as right
    assert score_answer(tok.decode(ans, skip_special_tokens=True), key) == 1.0
    assert tok.decode(ans) == " 4821937."


def test_batch_labels_only_on_answer_tokens(tok):
    ids, lab = make_batch(PromptBuilder(tok, "synthetic", seed=1), np.random.default_rng(0), 4, 64, digits=7)
    assert ids.shape == lab.shape and ids.shape[1] == 64 + 9  # " " + 7 digits + "."
    set_ = lab != IGNORE
    assert (set_.sum(1) == 9).all() and set_[:, 64:].all() and not set_[:, :64].any()
    assert torch.equal(lab[set_], ids[set_])


def test_a_few_steps_lower_the_loss(tok):
    torch.manual_seed(0)
    cfg = NIAHTrainConfig(hidden_size=32, num_heads=2, num_layers=1, window_size=8)
    model = build_model(cfg, tok)
    ids, lab = make_batch(PromptBuilder(tok, "synthetic", seed=2), np.random.default_rng(1), 8, 48)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(15):
        loss = model(input_ids=ids, labels=lab).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < losses[0] - 1.0


@pytest.mark.parametrize("flag", [[], ["--no-progress"]])
def test_cli_progress_bar_and_no_progress(tmp_path, capsys, flag):
    """Issue 17 #9: `orthros eval niah-train` had no --no-progress (and no progress bar)."""
    import json

    from orthros.evaluation.cli import main

    out = tmp_path / "m"
    rc = main(["niah-train", "--out", str(out), "--steps", "3", "--batch-size", "2", "--hidden-size", "32",
               "--heads", "2", "--layers", "1", "--window", "8", "--min-len", "48", "--max-len", "48",
               "--log-every", "3", "--threads", "1", *flag])
    assert rc == 0
    cap = capsys.readouterr()
    err = cap.err
    assert ("niah-train orthros" in err and "3/3" in err) == (not flag), err
    # the closing line: it went through the closed bar's write (a no-op) and was lost with the bar on
    assert f"saved {out} (" in cap.out + cap.err
    rec = json.loads((out / "niah_train.json").read_text())
    assert rec["history"][-1]["step"] == 3 and (out / "config.json").is_file()


TINY = ["--steps", "2", "--batch-size", "2", "--hidden-size", "32", "--heads", "2", "--layers", "1", "--window", "8",
        "--min-len", "48", "--max-len", "48", "--threads", "1", "--no-progress"]


@pytest.mark.parametrize("args, msg", [
    # named the config field only ('steps must be >= 1'); --max-positions 0 said 'use --max-len <= -11'
    (["--log-every", "0"], "log_every (--log-every) must be >= 1, got 0"),
    (["--steps", "0"], "steps (--steps) must be >= 1, got 0"),
    (["--batch-size", "-2"], "batch_size (--batch-size) must be >= 1, got -2"),
    (["--window", "0"], "window_size (--window) must be >= 1, got 0"),
    (["--max-positions", "0"], "max_position_embeddings (--max-positions) must be >= 1, got 0"),
    (["--heads", "3"], "hidden_size (--hidden-size, 32) must be a multiple of num_heads (--heads, 3)"),
    (["--max-len", "40"], "max_len (--max-len, 40) must be >= min_len (--min-len, 48)"),
    (["--threads", "-1"], "threads (--threads) must be >= 0"),
    (["--digits", "19"], "digits (--digits) must be in 1..18, got 19"),
    (["--seed", "-1"], "seed (--seed) must be >= 0, got -1"),
    (["--seed", str(2 ** 64)], f"seed (--seed) must be <= {2 ** 64 - 1} (the largest seed torch takes)"),
    # NaN passed `lr <= 0`: refused by the optimiser after the prompts and the model were built
    (["--lr", "nan"], "lr (--lr) must be a finite number > 0, got nan"),
    (["--lr", "inf"], "lr (--lr) must be a finite number > 0, got inf"),
    (["--out", "{tmp}/f"], "--out {tmp}/f: {tmp}/f is a file, not a directory"),
    (["--out", "{tmp}/f/m"], "is a file, not a directory"),
    # the option named as typed (it said `--out` after `-o`)
    (["-o", "{tmp}/f"], "-o {tmp}/f: {tmp}/f is a file, not a directory"),
    (["--init", "{tmp}/nowhere"], "--init {tmp}/nowhere: no such file or directory"),
    (["--init", "{tmp}"], "--init {tmp} is not a checkpoint directory"),
    (["--init", "{tmp}/llama"], "--init {tmp}/llama: a 'llama' checkpoint"),
    (["--init", "{tmp}/swa"], "--init {tmp}/swa has attention_mode 'window', not 'orthros'"),
    # said only "max_len plus the answer must fit in max_position_embeddings", no value, no option
    (["--max-len", "2000"], "max_len (--max-len) 2000 plus the answer (7 digits + 4 tokens) must fit in "
                            "max_position_embeddings (1024, --max-positions): use --max-len <= 1013"),
])
def test_cli_bad_input_refused_before_training(tmp_path, capsys, monkeypatch, args, msg):
    """Issue: each of these passed the checks and failed later: inside the training loop (--log-every 0:
    ZeroDivisionError; --digits 19: `high is out of bounds for int64`), at its start (--threads -1, --seed -1,
    --init not an Orthros checkpoint: transformers' OSError), or after training (--out a file)."""
    import json

    import orthros.evaluation.niah_train as nt
    from orthros.evaluation.cli import main

    monkeypatch.setattr(nt, "train", lambda *a, **kw: pytest.fail("training started"))
    (tmp_path / "f").write_text("x")
    (tmp_path / "llama").mkdir()
    (tmp_path / "llama" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (tmp_path / "swa").mkdir()
    (tmp_path / "swa" / "config.json").write_text(json.dumps({"model_type": "orthros", "attention_mode": "window",
                                                              "max_position_embeddings": 1024}))
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    if "--out" not in args and "-o" not in args:
        args += ["--out", str(tmp_path / "m")]
    assert main(["niah-train", *TINY, *args]) == 2
    assert msg.replace("{tmp}", str(tmp_path)) in capsys.readouterr().err
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize("args, msg", [
    (["--min-len", "5"], "--min-len 5 is too short: the needle and question alone take"),
    (["--haystack", "{tmp}/bad.jsonl"], "--haystack {tmp}/bad.jsonl: line 1 is not JSON"),
    (["--haystack", "{tmp}/bin.txt"], "--haystack {tmp}/bin.txt: not UTF-8 text"),
    # a mistyped path read as a wrong kind of value ("must be one of ('synthetic', 'corpus') or a path to a
    # .txt/.jsonl file, got 'nowhere.txt'"), though it was a .txt path: what is wrong with it is said
    (["--haystack", "{tmp}/nowhere.txt"], "--haystack {tmp}/nowhere.txt: no such file"),
    (["--haystack", "{tmp}"], "--haystack {tmp}: a folder, not a file"),
])
def test_cli_bad_input_refused_before_the_model_is_built(tmp_path, capsys, monkeypatch, args, msg):
    """Issue: a --min-len shorter than the needle and question failed inside the training loop, at the
    first step that drew such a length, with `context length 21 is too short ...` (not naming --min-len);
    a .jsonl --haystack with a line that is not JSON, or a file that is not UTF-8, gave only the decoder's
    words (`Expecting value: line 1 column 1 (char 0)`, `'utf-8' codec can't decode ...`)."""
    import orthros.evaluation.niah_train as nt
    from orthros.evaluation.cli import main

    monkeypatch.setattr(nt, "build_model", lambda *a, **kw: pytest.fail("the model was built"))
    (tmp_path / "bad.jsonl").write_text("not json\n")
    (tmp_path / "bin.txt").write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe" * 8)
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    tiny = list(TINY)
    if "--min-len" in args:
        del tiny[tiny.index("--min-len"):tiny.index("--min-len") + 2]
    assert main(["niah-train", *tiny, *args, "--out", str(tmp_path / "m")]) == 2
    out, err = capsys.readouterr()
    assert msg.replace("{tmp}", str(tmp_path)) in err
    # the run's header ("NIAH training: ...") printed first, as if the run had started, then the error
    assert out == ""
    assert not (tmp_path / "m").exists()


def test_init_too_short_for_max_len_names_the_values(tmp_path):
    import json

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "orthros", "max_position_embeddings": 64}))
    with pytest.raises(ValueError, match=re.escape(f"--init {tmp_path}: its max_position_embeddings (64) is too "
                                                   f"small for --max-len 128 plus the answer (7 digits + 4 tokens): "
                                                   f"use --max-len <= 53")):
        NIAHTrainConfig(init=str(tmp_path), max_len=128).validate()


def test_record_is_written_through_a_temporary_name(tmp_path, monkeypatch):
    """Issue: niah_train.json was written in place (Path.write_text): a run killed or a disk filled
    mid-write left half a JSON file behind."""
    import pathlib

    from orthros.evaluation.cli import main

    real = pathlib.Path.write_text

    def half_then_fail(self, data, *a, **kw):
        if "niah_train.json" in self.name:
            real(self, data[: len(data) // 2], *a, **kw)
            raise OSError(28, "No space left on device")
        return real(self, data, *a, **kw)

    monkeypatch.setattr(pathlib.Path, "write_text", half_then_fail)
    out = tmp_path / "m"
    with pytest.raises(OSError):
        main(["niah-train", *TINY, "--out", str(out)])
    assert not out.exists() and list(tmp_path.iterdir()) == []  # nothing of the checkpoint either


def test_a_non_empty_out_is_refused_before_any_work_unless_overwrite(tmp_path, capsys, monkeypatch):
    """Issue: the checkpoint was written straight into --out, over whatever was there (another
    run's checkpoint, files of its own), and a failure mid-save left a mix of the two."""
    import orthros.evaluation.niah_train as nt
    from orthros.evaluation.cli import main

    out = tmp_path / "m"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    monkeypatch.setattr(nt, "build_model", lambda *a, **k: pytest.fail("work started"))
    assert main(["niah-train", *TINY, "--out", str(out)]) == 2
    assert "--out " + str(out) + ": the directory is not empty; pass --overwrite" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["mine.txt"]
    monkeypatch.undo()
    (tmp_path / ".m.orthros-tmp-999999999-x").mkdir()  # what a killed run left: cleaned up by the next
    assert main(["niah-train", *TINY, "--out", str(out), "--overwrite"]) == 0
    assert not (out / "mine.txt").exists() and (out / "niah_train.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]  # no temporary or old copy beside it


@pytest.mark.parametrize("out", [".", "..", "~"])
def test_the_working_folder_or_one_above_it_is_never_replaced(tmp_path, capsys, monkeypatch, out):
    # --out . --overwrite moved the working folder aside and deleted it (and every file in it) for the checkpoint
    import orthros.evaluation.niah_train as nt
    from orthros.evaluation.cli import main

    work = tmp_path / "home" / "work"
    work.mkdir(parents=True)
    (work / "mine.txt").write_text("keep")
    monkeypatch.chdir(work)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path / "elsewhere"))
    monkeypatch.setattr(nt, "build_model", lambda *a, **k: pytest.fail("work started"))
    assert main(["niah-train", *TINY, "--out", out, "--overwrite"]) == 2
    where = {".": "the working folder", "..": "above the working folder", "~": "the home folder"}[out]
    assert f"--out {out}: is {where}" in capsys.readouterr().err
    assert (work / "mine.txt").read_text() == "keep"


def test_cli_init_keeps_its_architecture_and_refuses_other_values(tmp_path, capsys, monkeypatch):
    """Issue: with --init, --window / --layers / --hidden-size / --heads / --max-positions were accepted and
    ignored (the checkpoint's architecture is kept), while the header line and niah_train.json reported the
    ignored values; --window with --mode full (no window) was accepted and ignored too."""
    import orthros.evaluation.niah_train as nt
    from orthros.evaluation.cli import main
    from orthros.evaluation.common import make_tiny_checkpoint

    ck = make_tiny_checkpoint(tmp_path / "s1", window_size=4, max_position_embeddings=512)
    seen = []
    monkeypatch.setattr(nt, "train", lambda cfg, header=None, **kw: (seen.append(cfg), print(header)))
    base = ["niah-train", "--init", str(ck), "--steps", "1", "--min-len", "48", "--max-len", "48", "--no-progress",
            "--out", str(tmp_path / "m")]
    for args, msg in ((["--window", "8"], "--window 8: --init {ck} keeps its architecture (window_size 4); "
                                          "drop --window"),
                      (["--layers", "3"], "(num_hidden_layers 2); drop --layers"),
                      (["--hidden-size", "64"], "(hidden_size 32); drop --hidden-size"),
                      (["--heads", "4"], "(num_attention_heads 2); drop --heads"),
                      (["--max-positions", "1024"], "(max_position_embeddings 512); drop --max-positions")):
        assert main([*base, *args]) == 2, args
        assert msg.replace("{ck}", str(ck)) in capsys.readouterr().err
    assert not seen
    # the checkpoint's values, whether left out or given as they are
    assert main(base) == 0
    assert main([*base, "--window", "4", "--layers", "2", "--hidden-size", "32", "--heads", "2",
                 "--max-positions", "512"]) == 0
    assert "window 4, 2 layers, d=32" in capsys.readouterr().out
    for cfg in seen:
        assert (cfg.window_size, cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.max_position_embeddings) == \
            (4, 2, 32, 2, 512)
    # --window has nothing to set in a full-attention model
    assert main(["niah-train", "--mode", "full", "--window", "8", "--out", str(tmp_path / "f")]) == 2
    assert "--window 8 sets the window of --mode orthros or window (SWA)" in capsys.readouterr().err
    # the aliases of OrthrosConfig and the engine (transformer = full, swa = window) are taken; others named
    assert main(["niah-train", "--mode", "transformer", "--window", "8", "--out", str(tmp_path / "f")]) == 2
    assert "--window 8 sets the window of --mode orthros or window (SWA)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["niah-train", "--mode", "sliding", "--out", str(tmp_path / "f")])
    assert "must be one of orthros, transformer, full, swa, window" in capsys.readouterr().err
    assert len(seen) == 2


def test_init_of_a_smaller_vocabulary_is_refused_before_it_loads(tmp_path, capsys, monkeypatch):
    """Issue: --init of a checkpoint whose vocab_size is below the shipped tokenizer's ids (the one niah-train
    writes its prompts with) loaded the model and ended in the embedding's `IndexError: index out of range in
    self`, a raw traceback."""
    from orthros.evaluation.cli import main
    from orthros.evaluation.common import make_tiny_checkpoint
    from orthros.models import OrthrosForCausalLM

    ck = make_tiny_checkpoint(tmp_path / "small", vocab_size=300, max_position_embeddings=256)
    monkeypatch.setattr(OrthrosForCausalLM, "from_pretrained", lambda *a, **kw: pytest.fail("the model loaded"))
    assert main(["niah-train", "--init", str(ck), "--steps", "1", "--batch-size", "1", "--no-progress",
                 "--out", str(tmp_path / "m")]) == 2
    out, err = capsys.readouterr()
    assert f"--init {ck}: the shipped tokenizer (niah-train's prompts) gives token ids up to" in err, err
    assert "beyond the model's vocab_size (300)" in err
    assert out == ""  # no header before the error
    assert not (tmp_path / "m").exists()

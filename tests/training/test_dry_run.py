"""``orthros train --dry-run``: every check of a real run, then what it would train; nothing is
written, its figures are those of the real run, and a refused config fails as the run would."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("datasets", reason="training needs the `datasets` package")

from orthros.cli import main as orthros_main  # noqa: E402
from orthros.training.config import load_config  # noqa: E402
from orthros.training.trainer import train  # noqa: E402

from test_trainer import corpus, tiny  # noqa: E402,F401  (the module's fixture and arguments)


def listing(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def dry(args, capsys):
    capsys.readouterr()
    rc = orthros_main(["train", *args, "--dry-run"])
    out, err = capsys.readouterr()
    return rc, out, err


def test_dry_run_writes_nothing_and_reports_the_run(tmp_path, corpus, capsys):  # noqa: F811
    out = tmp_path / "run"
    before = listing(tmp_path)
    rc, text, err = dry(tiny(out, corpus, "--max_steps", "6"), capsys)
    assert rc == 0, err
    assert listing(tmp_path) == before and not out.exists()
    assert text.startswith("orthros train --dry-run: every check passed; nothing was written")
    assert "output_dir" in text and "(does not exist yet)" in text
    assert "2 sequences x 32 tokens a step = 64 tokens" in text and "0 -> 6: 6 steps, 384 tokens" in text
    assert "(4 held-out sequences)" in text and "a fresh initialisation" in text
    # the figures are the real run's: its parameter count and the steps it then trains
    train(load_config(None, tiny(out, corpus, "--max_steps", "3", "--checkpoint.every", "3")))
    n_params = int(re.search(r"; ([\d,]+) parameters;", text).group(1).replace(",", ""))
    from orthros import OrthrosForCausalLM

    ckpt = out / "checkpoints" / "step_00000003"
    assert n_params == sum(p.numel() for p in OrthrosForCausalLM.from_pretrained(str(ckpt)).parameters())
    rc, text, err = dry(tiny(out, corpus, "--max_steps", "6"), capsys)  # the run is there now: it resumes
    assert rc == 0, err
    assert f"resumes from {ckpt} (step 3)" in text and "3 -> 6: 3 steps, 192 tokens" in text


def test_dry_run_refuses_what_the_run_refuses(tmp_path, corpus, capsys):  # noqa: F811
    rc, _, err = dry(tiny(tmp_path / "run", corpus, "--seq_len", "64", "--model.max_position_embeddings", "32"),
                     capsys)
    assert rc == 2 and "data.seq_len (64) is larger" in err
    rc, _, err = dry(tiny(tmp_path / "run", corpus, "--data.train", str(tmp_path / "none.jsonl")), capsys)
    assert rc == 2 and "none.jsonl" in err
    assert not (tmp_path / "run").exists()


def test_a_model_config_error_names_the_training_key(tmp_path, corpus, capsys):  # noqa: F811
    """The model's own checks, reached through the training keys, name those keys: it said
    'model: OrthrosConfig.hidden_size must be an integer >= 1' (91db46c's model_config_error, used)."""
    rc, _, err = dry(tiny(tmp_path / "run", corpus, "--model.hidden_size", "0"), capsys)
    assert rc == 2 and "model.hidden_size must be an integer >= 1" in err and "OrthrosConfig" not in err, err


def test_dry_run_under_torchrun_prints_one_plan(tmp_path, corpus):  # noqa: F811
    from test_trainer import run_cli

    r = run_cli([*tiny(tmp_path / "run", corpus, "--max_steps", "4"), "--dry-run"], torchrun=2)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.count("every check passed") == 1, r.stdout
    assert "4 sequences x 32 tokens a step = 128 tokens (micro-batch 2 x grad_accum 1 x 2 processes)" in r.stdout
    assert not (tmp_path / "run").exists()


def test_dry_run_says_when_no_eval_runs(tmp_path, corpus, capsys):  # noqa: F811
    """data.eval null or data.eval_sequences 0: the run evaluates nothing, whatever train.eval_every says."""
    for extra in (["--data.eval", "null"], ["--data.eval_sequences", "0"]):
        rc, text, err = dry(tiny(tmp_path / "run", corpus, "--eval_every", "3", *extra), capsys)
        assert rc == 0, err
        row = next(line for line in text.splitlines() if line.lstrip().startswith("eval "))
        assert "none" in row and "every" not in row, row


def test_a_default_warmup_longer_than_the_run_is_said(tmp_path, corpus, capsys):  # noqa: F811
    """optim.warmup_steps at its default (20), more than a short run's train.max_steps, is accepted
    (a key left at its default), but the dry run said '20 warm-up steps, then cosine' and the run
    nothing, while its last step trained at 2 / 20 of optim.lr. Both say so now."""
    args = tiny(tmp_path / "run", corpus, "--max_steps", "2", "--warmup_steps", "20", "--checkpoint.every", "0")
    note = (r"optim.warmup_steps \(20\) is more than train.max_steps \(2\): the run ends inside its warm-up, "
            r"its last step at 10% of optim.lr \(0.003\); set optim.warmup_steps to at most 2 for the whole schedule")
    rc, text, err = dry(args, capsys)
    assert rc == 0, err
    assert re.search(note, next(line for line in text.splitlines() if line.lstrip().startswith("steps "))), text
    train(load_config(None, args))
    assert re.search(r"\[orthros train\] note: " + note, capsys.readouterr().err)
    rc, text, err = dry(tiny(tmp_path / "other", corpus, "--max_steps", "2"), capsys)
    assert rc == 0 and "note" not in text, err

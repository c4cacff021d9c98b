"""``python -m orthros.training.compare``: the long-range probe of trained runs refuses bad
arguments before any work (it probed every scene for --n 0, and failed with tracebacks)."""

import json
import re

import pytest

pytest.importorskip("datasets", reason="training needs the `datasets` package")

from orthros.training.compare import main  # noqa: E402


def make_run(out, positions=20000):
    """A training output_dir: a tiny random checkpoint and one metrics row."""
    from orthros.data import load_tokenizer
    from orthros.models import OrthrosConfig, OrthrosForCausalLM

    ck = out / "checkpoints" / "step_00000001"
    tok = load_tokenizer()
    cfg = OrthrosConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                        num_attention_heads=2, window_size=8, max_position_embeddings=positions)
    OrthrosForCausalLM(cfg).save_pretrained(ck)
    tok.save_pretrained(ck)
    (ck / "manifest.json").write_text("{}")
    (out / "metrics.jsonl").write_text(json.dumps({"kind": "train", "step": 1, "loss": 8.0, "tokens": 8}) + "\n")
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("run"))


@pytest.mark.parametrize("args, says", [
    (["--n", "0"], "--n must be an integer >= 1, got 0"),
    (["--passage", "0"], "--passage must be an integer >= 2, got 0"),
    (["--passage", "1"], "--passage must be an integer >= 2, got 1"),  # scored nothing: losses of 0.0
    (["--passage", "10001"], "--passage 10001: P P is 20002 tokens, more than .* takes \\(max_position_embeddings "
                             "20000\\)"),
    (["--passage", "9000"], "--passage 9000: no held-out scene has the 9064 tokens it needs"),
])
def test_bad_arguments_are_refused(run, capsys, args, says):
    with pytest.raises(SystemExit) as e:
        main([str(run), *args])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and re.search(f"error: {says}", err), err


def test_a_folder_that_is_not_a_run_is_refused_before_any_probe(run, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main([str(run), str(tmp_path)])
    assert e.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and f"error: {tmp_path}: not a training run's output_dir" in err


def test_probes_n_passages(run, capsys):
    assert main([str(run), "--n", "2", "--passage", "16"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert (r["passages"], r["passage_tokens"], r["step"], r["train_loss_last"]) == (2, 16, 1, 8.0)


def test_a_run_named_twice_is_probed_once_with_a_note(run, capsys):
    # `run run` was probed once without a word (a dict of the names), `run run/` twice
    assert main([str(run), f"{run}/", str(run), "--n", "1", "--passage", "16"]) == 0
    out, err = capsys.readouterr()
    assert len(out.splitlines()) == 1 and err.count("is the same folder as") == 2, (out, err)


def test_step_and_eval_loss_are_the_probed_checkpoints(tmp_path, capsys):
    """"step" and "eval_loss" were the last eval row's, not the probed checkpoint's: a run killed after
    an eval that no checkpoint followed (eval at step 3, latest checkpoint step 1) was reported as
    step 3 with step 3's eval loss, and a run without evals as step None."""
    run = make_run(tmp_path / "run")
    with open(run / "metrics.jsonl", "a") as f:
        for step, loss in ((1, 7.9), (3, 7.5)):
            f.write(json.dumps({"kind": "eval", "step": step, "eval_loss": loss, "tokens": 8 * step}) + "\n")
    assert main([str(run), "--n", "1", "--passage", "16"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert (r["checkpoint"].endswith("step_00000001"), r["step"], r["eval_loss"]) == (True, 1, 7.9)
    assert r["eval_curve"] == [[1, 7.9], [3, 7.5]]


def test_a_passage_too_long_for_a_later_run_is_refused_before_any_probe(run, tmp_path, capsys):
    short = make_run(tmp_path / "short", positions=64)
    with pytest.raises(SystemExit) as e:
        main([str(run), str(short), "--n", "1", "--passage", "40"])
    assert e.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and "--passage 40: P P is 80 tokens, more than" in err, (out, err)


def test_a_quoted_tilde_is_the_home_folder_and_a_checkpoints_folder_names_its_run(run, capsys, monkeypatch):
    """A quoted '~/run' (the shell leaves it as typed) was "not a training run's output_dir", though plot reads it as
    the home folder, as every orthros command does; RUN/checkpoints or one checkpoint were refused without naming
    the run they belong to."""
    monkeypatch.setenv("HOME", str(run.parent))
    assert main([f"~/{run.name}", "--n", "1", "--passage", "16"]) == 0
    assert json.loads(capsys.readouterr().out)["run"] == str(run)
    for inside in (run / "checkpoints", run / "checkpoints" / "step_00000001"):
        with pytest.raises(SystemExit):
            main([str(inside), "--n", "1", "--passage", "16"])
        assert f"error: {inside}: not a training run's output_dir (one with a complete checkpoint and " \
               f"metrics.jsonl); it lies in the run {run}: name that" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["~nosuchuser9/run"])
    assert "error: RUN ~nosuchuser9/run: no user 'nosuchuser9'" in capsys.readouterr().err


def test_a_non_finite_loss_is_written_as_null_standard_json(tmp_path, capsys, monkeypatch):
    """A NaN probe loss (a diverged checkpoint) or an eval loss logged as NaN / Infinity (metrics.jsonl of
    an older run) was printed as NaN / Infinity, which jq and JavaScript refuse; a NaN loss is null
    now, and an eval loss logged as null (how metrics.jsonl holds one now) is read as one."""
    import orthros.training.compare as compare

    def refuse(name):
        raise ValueError(f"not standard JSON: {name}")

    run = make_run(tmp_path / "run")
    with open(run / "metrics.jsonl", "a") as f:  # an old row's NaN (Python's json), an inf, a new row's null
        f.write('{"kind": "eval", "step": 1, "eval_loss": NaN, "tokens": 8}\n'
                '{"kind": "eval", "step": 2, "eval_loss": Infinity, "tokens": 16}\n'
                '{"kind": "eval", "step": 3, "eval_loss": null, "tokens": 24}\n'
                '{"kind": "eval", "step": 4, "eval_loss": 7.25, "tokens": 32}\n')
    real = compare.probe
    monkeypatch.setattr(compare, "probe", lambda *a: {**real(*a), "loss_second_copy": float("nan")})
    assert main([str(run), "--n", "1", "--passage", "16"]) == 0
    r = json.loads(capsys.readouterr().out, parse_constant=refuse)
    assert (r["loss_second_copy"], r["eval_loss"]) == (None, None) and r["loss_first_copy"] > 0
    assert r["eval_curve"] == [[1, None], [2, None], [3, None], [4, 7.25]]


def test_no_weight_loading_bar_when_stderr_is_no_terminal(run, capsys):
    """`python -m orthros.training.compare RUN 2> log` wrote transformers' 'Loading weights: 0%|...|'
    bar for every run into the log: the rule of every command is bars at a terminal only."""
    from transformers.utils import logging as hf_logging

    hf_logging.enable_progress_bar()  # transformers' default, as in a fresh `python -m`
    assert main([str(run), "--n", "1", "--passage", "16"]) == 0
    err = capsys.readouterr().err
    assert "Loading weights" not in err and "it/s" not in err, err
    assert hf_logging.is_progress_bar_enabled()  # as it was after the probe

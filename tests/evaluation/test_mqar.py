"""MQAR generator validity and a tiny end-to-end training run."""

import json
import re
from dataclasses import replace

import numpy as np
import pytest
import torch

from orthros.evaluation.mqar import FILLER, MQARTask, MQARTrain, generate, run_mqar

# tiny models: one torch thread each (2 per xdist worker on 2 cores ran several times slower)
pytestmark = pytest.mark.usefixtures("one_thread")


def _check_sequences(task, d):
    ids, labels, qp, kp, gaps = d["input_ids"], d["labels"], d["query_pos"], d["key_pos"], d["gaps"]
    n, T = ids.shape
    N = task.num_pairs
    v0, v1 = task.value_range
    assert labels.shape == ids.shape and qp.shape == (n, N) and gaps.shape == (n, N)
    for b in range(n):
        keys = ids[b, 0:2 * N:2]
        vals = ids[b, 1:2 * N:2]
        assert len(set(keys.tolist())) == N, "keys of one sequence are distinct"
        assert ((keys >= 1) & (keys <= task.n_keys)).all()
        assert ((vals >= v0) & (vals < v1)).all()
        answer_pos = np.nonzero(labels[b] != -100)[0]
        # labels only at answer positions: exactly one per query, right after it
        assert answer_pos.tolist() == (qp[b] + 1).tolist()
        assert (np.diff(qp[b]) >= 2).all(), "queries do not overlap"
        for j in range(N):
            p = qp[b, j]
            k = ids[b, p]
            # the queried key appeared earlier, at key_pos, and nowhere else before p
            first = np.nonzero(ids[b, :p] == k)[0]
            assert first.tolist() == [kp[b, j]]
            assert kp[b, j] + gaps[b, j] == p
            # the label is that key's value
            assert labels[b, p + 1] == ids[b, kp[b, j] + 1]
            if task.answer_in_input:
                assert ids[b, p + 1] == labels[b, p + 1]
            else:  # the answer is never given away in the input
                assert ids[b, p + 1] != k and (ids[b, p + 1] == FILLER or task.fill == "noise")
            assert gaps[b, j] >= task.min_gap
            assert gaps[b, j] <= (task.max_gap or T)
        other = np.ones(T, bool)
        other[: 2 * N] = False
        other[qp[b]] = False
        if task.answer_in_input:
            other[qp[b] + 1] = False
        if task.fill == "pad":
            assert (ids[b, other] == FILLER).all()
        else:
            assert ((ids[b, other] >= v0) & (ids[b, other] < v1)).all(), "noise never looks like a key"


@pytest.mark.parametrize("task", [
    MQARTask(vocab_size=64, seq_len=64, num_pairs=4, min_gap=16),
    MQARTask(vocab_size=32, seq_len=96, num_pairs=8, power=0.5),
    MQARTask(vocab_size=128, seq_len=200, num_pairs=16, power=2.0, min_gap=3, max_gap=120, fill="noise"),
    MQARTask(vocab_size=9, seq_len=32, num_pairs=4, min_gap=5),
    MQARTask(vocab_size=64, seq_len=64, num_pairs=4, min_gap=16, answer_in_input=True),
    MQARTask(vocab_size=64, seq_len=64, num_pairs=6, fill="noise", answer_in_input=True),
])
def test_generator_sequences_are_valid(task):
    _check_sequences(task, generate(task, 200, seed=1))


def test_gap_distribution_follows_power_law():
    # one pair: nothing else competes for positions, so the gap law is exactly the truncated power law
    task = MQARTask(vocab_size=16, seq_len=256, num_pairs=1, power=1.2, min_gap=4, max_gap=200)
    gaps = generate(task, 40000, seed=3)["gaps"].ravel()
    pmf = task.gap_pmf()
    # the answer slot must fit: a query at position T-1 is impossible; gaps are <= T-2 - key_pos
    pmf[task.seq_len - 1:] = 0
    pmf = pmf / pmf.sum()
    emp = np.bincount(gaps, minlength=len(pmf))[: len(pmf)] / len(gaps)
    tv = 0.5 * np.abs(emp - pmf).sum()
    assert tv < 0.03, tv
    assert gaps.min() >= 4 and gaps.max() <= 200
    # heavier tail for a smaller exponent, with several pairs
    g_steep = generate(MQARTask(vocab_size=64, seq_len=128, num_pairs=4, power=2.0), 3000, seed=0)["gaps"]
    g_flat = generate(MQARTask(vocab_size=64, seq_len=128, num_pairs=4, power=0.0), 3000, seed=0)["gaps"]
    assert np.median(g_steep) < np.median(g_flat)


def test_generator_is_deterministic_per_seed():
    t = MQARTask()
    a, b, c = generate(t, 10, seed=5), generate(t, 10, seed=5), generate(t, 10, seed=6)
    assert (a["input_ids"] == b["input_ids"]).all()
    assert not (a["input_ids"] == c["input_ids"]).all()


@pytest.mark.parametrize("kw, msg", [
    (dict(num_pairs=40, vocab_size=64), "num_pairs"),
    (dict(seq_len=16, num_pairs=4, min_gap=8), "too short"),
    (dict(fill="zeros"), "fill"),
    (dict(power=-1.0), "power"),
    (dict(min_gap=10, max_gap=5), "max_gap"),
    # passed validate, then every sequence failed to generate (in each worker with --jobs)
    (dict(num_pairs=4, max_gap=7), r"max_gap 7 is too short for num_pairs=4 and min_gap=1: .* need max_gap >= 17"),
    (dict(vocab_size=0), "vocab_size"),
    # max_gap unset (seq_len): a short seq_len was refused as "max_gap 4 is too short" (--seq-len 4) or "max_gap
    # must be an integer >= min_gap (10), got None" (--seq-len 8 --min-gap 10), naming a max_gap never given
    (dict(seq_len=4), r"^MQAR seq_len 4 is too short for num_pairs=4 and min_gap=1: need seq_len >= 20 "),
    (dict(seq_len=8, min_gap=10), r"^MQAR seq_len 8 is too short for num_pairs=4 and min_gap=10: need seq_len >= 28 "),
])
def test_bad_task_settings_are_rejected(kw, msg):
    with pytest.raises(ValueError, match=msg):
        MQARTask(**kw).validate()


def test_task_errors_name_what_the_caller_calls_each_field():
    """The Python API's errors name MQARTask's fields; ``names`` maps them to a caller's own (the CLI's options)."""
    with pytest.raises(ValueError, match=re.escape("MQAR num_pairs (40) must be <= the number of keys "
                                                   "(vocab_size - 1) // 2 = 31; raise vocab_size")):
        MQARTask(num_pairs=40).validate()
    with pytest.raises(ValueError, match=re.escape("^N (40) must be <= the number of keys (V - 1) // 2 = 31; raise V")[1:]):
        MQARTask(num_pairs=40).validate(names={"num_pairs": "N", "vocab_size": "V"})
    with pytest.raises(ValueError, match=re.escape("seq 10 is too short for num_pairs=4 and mingap=1: need seq >= 20")):
        MQARTask(seq_len=10).validate(names={"seq_len": "seq", "min_gap": "mingap"})


@pytest.mark.parametrize("num_pairs, min_gap", [(1, 1), (2, 3), (4, 1), (4, 12), (8, 1)])
def test_every_max_gap_that_validates_generates(num_pairs, min_gap):
    """Issue: validate accepted max_gap >= 2 * num_pairs, but the queries, placed one at a time at random,
    need more room: --max-gap 16 with 4 pairs passed, then every run failed while generating its data
    ('leaves no room for a query ... raise seq_len', which does not help). The bound now refused is the
    one below which a query can find every allowed position taken."""
    T = 128
    for max_gap in range(2 * num_pairs, T + 1):
        task = MQARTask(vocab_size=64, seq_len=T, num_pairs=num_pairs, min_gap=min_gap, max_gap=max_gap)
        try:
            task.validate()
        except ValueError as e:
            assert re.search(r"max_gap .*must be|need max_gap >= ", str(e)), str(e)
            continue
        generate(task, 400, seed=max_gap)  # raised for every setting between the old bound and the new


def test_output_stream_trained_only_at_answers():
    """With output_positions = query positions the Orthros model returns one logit row per query."""
    from orthros.evaluation.mqar import build_model

    task = MQARTask(vocab_size=32, seq_len=48, num_pairs=3, min_gap=10)
    tr = MQARTrain(hidden_size=32, num_heads=2, window_size=4)
    d = generate(task, 4, seed=0)
    model = build_model("orthros", task, tr, seed=0)
    ids, labels, qp = (torch.as_tensor(d[k]) for k in ("input_ids", "labels", "query_pos"))
    out = model(input_ids=ids, labels=labels, output_positions=qp)
    assert out.logits.shape == (4, 3, 32)
    # the loss is the cross-entropy of exactly those rows against the answers
    tgt = torch.gather(labels, 1, qp + 1)
    ref = torch.nn.functional.cross_entropy(out.logits.reshape(-1, 32).float(), tgt.reshape(-1))
    assert torch.allclose(out.loss, ref, atol=1e-5)
    # the same rows as the full (every position) forward
    full = model(input_ids=ids).logits
    assert torch.allclose(torch.gather(full, 1, qp[..., None].expand(-1, -1, 32)), out.logits, atol=1e-4)


def test_run_mqar_end_to_end_tiny(tmp_path):
    task = MQARTask(vocab_size=16, seq_len=32, num_pairs=2, min_gap=6)
    tr = MQARTrain(hidden_size=16, num_heads=2, window_size=4, steps=3, batch_size=4, eval_examples=16)
    out = run_mqar(task, tr, progress=False, log=None)
    assert [r["model"] for r in out["results"]] == ["Orthros", "Transformer", "SWA"]
    for r in out["results"]:
        assert 0.0 <= r["acc"] <= 1.0 and r["n_queries"] == 32
    json.dumps(out)  # JSON-able


def test_progress_ends_on_the_last_steps_loss(capsys):
    """Issue: the bar's loss was set every 25th step only, so a run of 20 steps ended on
    'step 20/20 loss <step 1's loss>' (and an 800-step run on step 776's)."""
    task = MQARTask(vocab_size=16, seq_len=32, num_pairs=2, min_gap=6)
    tr = MQARTrain(models=("swa",), hidden_size=16, num_heads=2, window_size=4, steps=3, batch_size=4,
                   eval_examples=8, lr=0.5)
    out = run_mqar(task, tr, progress=True, log=None)  # stderr is no terminal here: plain lines
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == f"[MQAR SWA] step 3/3 loss {out['results'][0]['final_loss']:.3f}"  # the mean of the last step


def test_cli_mqar_writes_json(tmp_path):
    from orthros.cli import main

    out = tmp_path / "m.json"
    rc = main(["eval", "mqar", "--vocab-size", "16", "--seq-len", "32", "--num-pairs", "2", "--min-gap", "6",
               "--hidden-size", "16", "--window", "4", "--steps", "2", "--batch-size", "4", "--eval-examples", "8",
               "--models", "orthros,swa", "--no-progress", "-o", str(out), "--plot", str(tmp_path / "m.png")])
    assert rc == 0
    res = json.loads(out.read_text())
    assert [r["model"] for r in res["results"]] == ["Orthros", "SWA"]
    assert (tmp_path / "m.png").read_bytes().startswith(b"\x89PNG")


def test_cli_mqar_bad_input(capsys):
    from orthros.cli import main

    assert main(["eval", "mqar", "--models", "orthros,lstm"]) == 2
    assert "unknown model 'lstm'" in capsys.readouterr().err
    assert main(["eval", "mqar", "--seq-len", "10", "--num-pairs", "4"]) == 2
    assert "too short" in capsys.readouterr().err
    assert main(["eval", "mqar", "--plot", "r.jpg"]) == 2
    assert "--plot r.jpg: a .png path is needed" in capsys.readouterr().err


def test_linear_heads_size_the_gdn_state_only():
    """``linear_heads`` sets the GDN layers' heads (state heads x (d/heads)^2); the attention
    layers keep ``num_heads``; unset, GDN takes ``num_heads``."""
    from orthros.evaluation.mqar import build_model

    task = MQARTask(vocab_size=16, seq_len=32, num_pairs=2, min_gap=6)
    tr = MQARTrain(hidden_size=32, num_layers=4, num_heads=2, linear_heads=8)
    cfg = build_model("orthros-h", task, tr, seed=0).config
    assert (cfg.num_attention_heads, cfg.head_dim) == (2, 16)
    assert (cfg.linear_num_key_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim) == (8, 4, 4)
    cfg = build_model("gdn", task, MQARTrain(hidden_size=32, num_layers=4, num_heads=2), seed=0).config
    assert (cfg.linear_num_key_heads, cfg.linear_key_head_dim) == (2, 16)
    with pytest.raises(ValueError, match="linear_heads"):
        build_model("gdn", task, MQARTrain(hidden_size=32, num_layers=4, linear_heads=5), seed=0)


def test_cli_mqar_bad_linear_heads(capsys):
    from orthros.cli import main

    assert main(["eval", "mqar", "--hidden-size", "64", "--linear-heads", "5"]) == 2
    assert "--linear-heads must be >= 1 and divide --hidden-size (64), got 5" in capsys.readouterr().err


def test_cli_mqar_linear_heads_refused_without_a_gdn_model(capsys, monkeypatch):
    """Issue: --linear-heads sets only the GDN layers' heads; with --models of attention models only it was
    accepted, ignored, and recorded in the JSON."""
    import orthros.evaluation.mqar as mqar
    from orthros.cli import main

    monkeypatch.setattr(mqar, "run_mqar", lambda *a, **kw: pytest.fail("training started"))
    assert main(["eval", "mqar", "--models", "transformer,orthros", "--linear-heads", "4"]) == 2
    assert ("--linear-heads 4 sets the heads of the GDN layers of orthros-h, linear-hybrid, gdn; --models "
            "transformer,orthros has none") in capsys.readouterr().err


def test_jobs_train_each_model_in_its_own_process_with_the_same_results():
    """``jobs=2``: every model in a spawned worker that regenerates the same data from the same
    seeds; per-model accuracy and losses equal the one-process run's (one thread both ways), in
    the order of ``models``."""
    task = MQARTask(vocab_size=16, seq_len=32, num_pairs=2, min_gap=6)
    tr = MQARTrain(models=("swa", "orthros"), hidden_size=16, num_heads=2, window_size=4, steps=4, batch_size=4,
                   eval_examples=16, threads=1)
    one = run_mqar(task, tr, progress=False, log=None)
    lines = []
    two = run_mqar(task, tr, progress=False, log=lines.append, jobs=2)
    assert [r["model"] for r in two["results"]] == ["SWA", "Orthros"] and two["jobs"] == 2
    assert len(lines) == 2
    for a, b in zip(one["results"], two["results"]):
        assert (a["acc"], a["n_queries"], a["params"]) == (b["acc"], b["n_queries"], b["params"])
        assert a["final_loss"] == pytest.approx(b["final_loss"], rel=1e-6)
    assert one["eval_gap_stats"] == two["eval_gap_stats"]


def test_jobs_on_the_cpu_share_this_process_threads(monkeypatch):
    # each spawned worker took torch's default thread count (all cores): 2 workers on 2 cores ran 40-100x
    # slower a step than one process (the fresh-clone walkthrough); they now share this process's threads
    from orthros.evaluation.mqar import MQARTrain, _worker_threads

    monkeypatch.setattr(torch, "get_num_threads", lambda: 8)
    assert _worker_threads(MQARTrain(device="cpu"), 2) == 4 and _worker_threads(MQARTrain(device="cpu"), 16) == 1
    assert _worker_threads(MQARTrain(device="cpu", threads=3), 2) == 3  # given: kept
    assert _worker_threads(MQARTrain(device="cuda"), 2) is None  # the GPU's runs: torch's choice


@pytest.mark.parametrize("jobs", [0, -1, 1.5, True, np.float64(2.0), "2"])
def test_bad_jobs_rejected(jobs):
    with pytest.raises(ValueError, match=r"^MQAR jobs \(models trained at once, one process each\) must be an "
                                         r"integer >= 1, got "):
        run_mqar(MQARTask(vocab_size=16, seq_len=32, num_pairs=2), MQARTrain(steps=1), progress=False, log=None,
                 jobs=jobs)


def test_jobs_may_be_a_numpy_integer_as_every_other_count():
    """Issue: check_run took jobs only as a Python int (np.int64(2), from a sweep's array, was refused), where
    every other count of the package takes what utils.as_int takes."""
    from orthros.evaluation.mqar import check_run

    assert check_run(MQARTask(), MQARTrain(), np.int64(2)) == ["orthros", "transformer", "swa"]
    with pytest.raises(ValueError, match=r"^--jobs \(models trained at once, one process each\) must be an integer "
                                         r">= 1, got np.int64\(0\) \(a numpy.int64\)$"):
        check_run(MQARTask(), MQARTrain(), np.int64(0), names={"jobs": "--jobs"})


def test_cli_mqar_bad_jobs(capsys):
    from orthros.cli import main

    assert main(["eval", "mqar", "--jobs", "0"]) == 2
    assert "--jobs must be >= 1, got 0" in capsys.readouterr().err


def test_accuracy_by_gap_buckets_add_up_and_plot(tmp_path):
    """evaluate()'s power-of-two gap buckets hold every query once and average back to the
    overall accuracy; plot_recall draws each model's buckets."""
    import numpy as np

    from orthros.evaluation.mqar import MQARTask, MQARTrain, plot_recall, run_mqar

    task = MQARTask(vocab_size=32, seq_len=32, num_pairs=2)
    tr = MQARTrain(models=("orthros", "swa"), hidden_size=32, num_layers=1, num_heads=2, window_size=4, steps=3,
                   batch_size=8, eval_examples=40)
    out = run_mqar(task, tr, progress=False, log=None)
    for r in out["results"]:
        b = r["acc_by_gap"]
        assert sum(x["n"] for x in b) == r["n_queries"]
        assert all(x["hi"] == 2 * x["lo"] and x["lo"] & (x["lo"] - 1) == 0 for x in b)
        assert np.isclose(sum(x["n"] * x["acc"] for x in b) / r["n_queries"], r["acc"])
    fig = plot_recall(out, tmp_path / "r.png")
    assert (tmp_path / "r.png").read_bytes().startswith(b"\x89PNG")
    lines = fig.axes[0].get_lines()
    assert [list(l.get_ydata()) for l in lines[:2]] == [[100 * x["acc"] for x in r["acc_by_gap"]]
                                                         for r in out["results"]]


@pytest.mark.parametrize("args, msg", [
    (["--models", "orthros,orthros-h", "--layers", "2"], "--layers 2: an 'orthros-h' model needs --layers >= 4"),
    (["--models", "linear_hybrid", "--layers", "3"], "--layers 3: a 'linear-hybrid' model needs --layers >= 4"),
    (["--seed", "-5"], "--seed must be >= 0, got -5"),
    # torch.manual_seed's 'Overflow when unpacking long long', after the training data was generated
    (["--seed", str(2 ** 64)], f"--seed must be <= {2 ** 64 - 1} (the largest seed torch takes), got {2 ** 64}"),
    (["--threads", "-1"], "--threads must be >= 0 (0: torch's own choice), got -1"),
    # named as typed: -o, or --output (both were named --output)
    (["-o", "{tmp}"], "-o {tmp}: is a directory"),
    (["--output", "{tmp}"], "--output {tmp}: is a directory"),
    (["-o", "{tmp}/f/m.json"], "-o {tmp}/f/m.json: {tmp}/f is a file, not a directory"),
    (["--plot", "{tmp}/f/m.png"], "is a file, not a directory"),
    # was trained, then the PNG replaced the JSON ('wrote m.png' twice)
    (["-o", "{tmp}/m.png", "--plot", "{tmp}/m.png"], "-o {tmp}/m.png and --plot {tmp}/m.png name the same file"),
    (["--output", "{tmp}/m.png", "--plot", "{tmp}/m.png"], "--output {tmp}/m.png and --plot {tmp}/m.png name the same"),
    # were accepted: no model printed an empty table (exit 0); one model twice trained twice
    (["--models", ","], "--models must name at least one model; choose from orthros, transformer"),
    (["--models", "transformer,swa,full"], "--models names Transformer twice (transformer, full)"),
    # NaN passed `lr <= 0`; the optimiser refused it only after the training data was generated
    (["--lr", "nan"], "--lr must be a finite number > 0, got nan"),
    # the task's errors named MQARTask's fields ("MQAR num_pairs (40) must be <= ...; raise vocab_size"),
    # not the options typed
    (["--vocab-size", "3"], "--vocab-size must be >= 5 (filler + keys + values), got 3"),
    (["--num-pairs", "40"], "--num-pairs (40) must be <= the number of keys (--vocab-size - 1) // 2 = 31; "
                            "raise --vocab-size"),
    (["--seq-len", "10"], "--seq-len 10 is too short for --num-pairs 4 and --min-gap 1: need --seq-len >= 20"),
    (["--max-gap", "3"], "--max-gap 3 is too short for --num-pairs 4 and --min-gap 1: "),
    (["--min-gap", "5", "--max-gap", "3"], "--max-gap must be an integer >= --min-gap (5), got 3"),
    (["--min-gap", "0"], "--min-gap must be an integer >= 1, got 0"),
    (["--power", "-1"], "--power must be a finite number >= 0, got -1.0"),
])
def test_cli_mqar_bad_input_refused_before_training(tmp_path, capsys, monkeypatch, args, msg):
    """Issue: a hybrid with --layers < 4 failed after the models before it had trained; --seed -5 and
    --threads -1 failed at the start with numpy's / torch's words (`expected non-negative integer`,
    RuntimeError, exit 1); an --output that is a directory failed after every model had trained."""
    import orthros.evaluation.mqar as mqar
    from orthros.cli import main

    monkeypatch.setattr(mqar, "run_mqar", lambda *a, **kw: pytest.fail("training started"))
    (tmp_path / "f").write_text("x")
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    assert main(["eval", "mqar", "--no-progress", *args]) == 2
    out, err = capsys.readouterr()
    assert msg.replace("{tmp}", str(tmp_path)) in err
    fields = ("vocab_size", "seq_len", "num_pairs", "min_gap", "max_gap", "num_layers", "hidden_size", "num_heads")
    assert "MQAR " not in err and not [f for f in fields if f in err], err  # options, not the fields they set
    assert out == ""  # nothing before the error (the header is printed once every check has passed)


@pytest.mark.parametrize("args, gaps", [([], "[1, 30]"), (["--max-gap", "100"], "[1, 30]"),
                                         (["--min-gap", "3", "--max-gap", "20"], "[3, 20]")])
def test_cli_mqar_header_names_the_gaps_the_sequences_can_hold(capsys, monkeypatch, args, gaps):
    """Issue: the header said 'gaps ~ gap^-1 in [1, 32]' for --seq-len 32, but a query sits at most at
    position seq_len - 2 (its answer follows it) and a key at 0 or later: no gap exceeds seq_len - 2."""
    import orthros.evaluation.mqar as mqar
    from orthros.evaluation.cli import main

    def stop(*a, **kw):
        raise ValueError("stopped before training")

    monkeypatch.setattr(mqar, "run_mqar", stop)
    assert main(["mqar", "--no-progress", "--seq-len", "32", *args]) == 2
    assert f"gaps ~ gap^-1 in {gaps}, window 8" in capsys.readouterr().out


def test_run_mqar_checks_hybrid_layers_before_training():
    """The library path: run_mqar refuses a hybrid it cannot build before training the models before it."""
    task = MQARTask(vocab_size=16, seq_len=32, num_pairs=2)
    tr = MQARTrain(models=("orthros", "orthros-h"), num_layers=2, steps=1, batch_size=2, eval_examples=2)
    import orthros.evaluation.mqar as mqar

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(mqar, "train_one", lambda *a, **kw: pytest.fail("training started"))
        with pytest.raises(ValueError, match="needs num_layers >= 4"):
            run_mqar(task, tr, progress=False, log=None)


@pytest.mark.parametrize("models, msg", [((), "models must name at least one model"),
                                         (("orthros", "swa", "window"), "models names SWA twice (swa, window)")])
def test_run_mqar_refuses_no_model_and_a_model_twice(models, msg):
    task = MQARTask(vocab_size=16, seq_len=32, num_pairs=2)
    with pytest.raises(ValueError, match=re.escape(msg)):
        run_mqar(task, MQARTrain(models=models, steps=1, batch_size=2, eval_examples=2), progress=False, log=None)


def test_a_split_without_queries_is_none_not_nan(tmp_path):
    """Issue: with every gap inside the window (--window 64, sequences of 64), acc_gap_ge_window was NaN,
    written into the --output JSON as `NaN`, which strict JSON readers (jq, JavaScript) refuse."""
    from orthros.evaluation.mqar import _log_result, build_model, evaluate, format_table
    from orthros.utils import write_json

    task = MQARTask(vocab_size=16, seq_len=32, num_pairs=2)
    tr = MQARTrain(hidden_size=32, num_heads=2, window_size=32)
    res = evaluate(build_model("window", task, tr, seed=0), generate(task, 8, seed=0), tr.window_size)
    assert res["acc_gap_ge_window"] is None and res["acc_gap_lt_window"] is not None
    res.update(model="SWA", params=1, train_seconds=0.0, final_loss=1.0, first_step_seconds=0.1,
               step_ms_after_first=None)
    write_json(tmp_path / "r.json", {"results": [res]})
    json.loads((tmp_path / "r.json").read_text(), parse_constant=lambda c: pytest.fail(f"{c} in the JSON"))
    lines = []
    _log_result(lines.append, res)
    assert "(gap >= window:      -)" in lines[0]  # as wide as "  0.0%"
    row = format_table({"train": {"window_size": 32}, "results": [res]}).splitlines()[2]
    assert row.split()[2] == "-"


@pytest.mark.parametrize("args, says", [
    (["a", "steps=1", "--", "b", "step=1"], "setting b: 'step=1' is not key=value with a key of V T N"),
    (["a", "steps"], "setting a: 'steps' is not key=value"),
    (["--steps", "steps=1"], "setting names must not start with '-', got '--steps'"),
    # values were read only when their setting's turn came, after the settings before it had trained:
    # int('abc') or run_mqar's own error, each as a traceback
    (["a", "steps=1", "--", "b", "V=abc"], "setting b: V=abc is not an integer"),
    (["a", "steps=1", "--", "b", "lr=x"], "setting b: lr=x is not a number"),
    (["a", "steps=1", "--", "b", "V=3"], "setting b: V must be >= 5"),
    (["a", "steps=1", "--", "b", "d=63"], "setting b: d (63) must be a multiple of H (2)"),
    (["a", "steps=1", "--", "b", "lr=nan"], "setting b: lr must be a finite number > 0, got nan"),
    (["a", "steps=1", "--", "b", "steps=0"], "setting b: steps must be an integer >= 1, got 0"),
    (["a", "steps=1", "--", "b", "threads=-1"], "setting b: threads must be >= 0"),
    (["a", "steps=1", "--", "b", "device=tpu"], "setting b: device must be cpu, cuda or cuda:N, got 'tpu'"),
    (["a", "steps=1", "--", "b", "backend=flash"], "setting b: backend must be one of auto, reference"),
    (["a", "steps=1", "--", "b", "maxgap=x"], "setting b: maxgap=x is not an integer"),
    (["a", "steps=1", "--", "b", "mingap=4", "maxgap=3"], "setting b: maxgap must be an integer >= mingap (4)"),
    # the errors named MQARTask / MQARTrain's fields ("seq_len 10 is too short for num_pairs=4"), not the keys given
    (["a", "T=10"], "setting a: T 10 is too short for N=4 and mingap=1: need T >= 20"),
    (["a", "L=0"], "setting a: L must be an integer >= 1, got 0"),
    (["a", "seed=-1"], "setting a: seed must be >= 0, got -1"),
    # a forgotten name: `V=32` was taken for the name and the setting ran at V=64
    (["V=32", "steps=1"], "setting names must not contain '=', got 'V=32' (the name comes first: NAME key=value"),
    # the last of two values was taken silently
    (["a", "V=64", "steps=1", "V=32"], "setting a: V is given twice (V=64, V=32)"),
    # two JSON lines of one name
    (["a", "steps=1", "--", "a", "steps=2"], "two settings are named 'a'"),
])
def test_mqar_sweep_refuses_unknown_keys_before_any_run(args, says, capsys, monkeypatch):
    """Issue: a key not in the list (`step=1` for `steps=1`) was ignored, so the setting ran 800 steps;
    an item without `=` ended in `dictionary update sequence element #0 has length 1`."""
    import orthros.evaluation.mqar_sweep as sweep

    monkeypatch.setattr(sweep, "run_one", lambda *a: pytest.fail("a setting ran"))
    assert sweep.main(args) == 2
    assert says in capsys.readouterr().err


@pytest.mark.parametrize("args, rc", [(["--help"], 0), (["a", "steps=1", "-h"], 0), ([], 2)])
def test_mqar_sweep_help_prints_usage_and_runs_nothing(args, rc, capsys, monkeypatch):
    """Issue: ``--help`` was taken for a setting's name and trained a whole default sweep (~5 min)."""
    import orthros.evaluation.mqar_sweep as sweep

    monkeypatch.setattr(sweep, "run_one", lambda *a: pytest.fail("a setting ran"))
    assert sweep.main(args) == rc
    out = capsys.readouterr()
    assert "python -m orthros.evaluation.mqar_sweep NAME key=value" in (out.out if rc == 0 else out.err)



def test_mqar_sweep_writes_a_non_finite_number_as_null(capsys, monkeypatch):
    """Its JSON lines held NaN for a diverged setting's loss, which jq and JavaScript refuse."""
    import json

    import orthros.evaluation.mqar_sweep as sweep

    monkeypatch.setattr(sweep, "run_one", lambda name, kv: {"name": name, "final_loss": float("nan"), "acc": 0.5})
    assert sweep.main(["a", "steps=1"]) == 0
    line = capsys.readouterr().out
    assert json.loads(line, parse_constant=lambda c: pytest.fail(f"{c} in {line}")) == \
        {"name": "a", "final_loss": None, "acc": 0.5}

def test_cli_mqar_help_on_gdn_layers():
    """Issue: --models's help said every hybrid, gdn included, needs --layers >= 4; gdn (GDN layers only)
    trains with any --layers."""
    from orthros.evaluation.cli import build_parser

    text = " ".join(build_parser()._subparsers._group_actions[0].choices["mqar"].format_help().split())
    assert "gdn: GDN layers only" in text


def test_ctrl_c_stops_the_workers_of_jobs(tmp_path):
    """Issue: a Ctrl-C at a terminal (SIGINT to the whole process group) did not stop `eval mqar
    --jobs 2`: each worker handed its KeyboardInterrupt back as a result and started the next
    model, and the parent waited for them all (still running minutes later). Now the workers
    ignore SIGINT and the parent terminates them: exit 130, no process left."""
    import os
    import signal
    import subprocess
    import sys
    import time

    args = ["--models", "swa,orthros,transformer", "--jobs", "2", "--steps", "100000", "--batch-size", "2",
            "--seq-len", "32", "--vocab-size", "16", "--num-pairs", "2", "--hidden-size", "16", "--heads", "2",
            "--window", "4", "--eval-examples", "8", "--threads", "1", "--no-progress"]
    proc = subprocess.Popen([sys.executable, "-m", "orthros", "eval", "mqar", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert proc.stdout.readline().startswith("MQAR: ")  # the header: the workers start next
        children = f"/proc/{proc.pid}/task/{proc.pid}/children"
        for _ in range(600):  # until two workers have spent a CPU second each (past their imports)
            busy = 0
            for c in open(children).read().split():
                try:
                    busy += int(open(f"/proc/{c}/stat").read().rsplit(")", 1)[1].split()[11]) >= os.sysconf("SC_CLK_TCK")
                except (OSError, IndexError):
                    pass
            if busy >= 2:
                break
            time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=120) == 130, proc.stderr.read()
        assert "interrupted" in proc.stderr.read()
        for _ in range(100):  # the workers (and multiprocessing's resource tracker) go with the parent
            if not _running_in_group(proc.pid):
                break
            time.sleep(0.1)
        assert _running_in_group(proc.pid) == []
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the session this test started, whatever is left of it
        except ProcessLookupError:
            pass
        proc.wait()


def _running_in_group(pgid: int) -> list:
    """Processes of process group ``pgid`` that still run (zombies, which have exited, excepted)."""
    import os

    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(pid))
    return out


_STREAM_TASKS = [MQARTask(), MQARTask(fill="noise"),
                 MQARTask(vocab_size=33, seq_len=96, num_pairs=6, power=0.5, min_gap=3, max_gap=40, fill="noise",
                          answer_in_input=True),
                 MQARTask(vocab_size=5, seq_len=16, num_pairs=2),
                 MQARTask(vocab_size=64, seq_len=33, num_pairs=4, fill="noise")]


@pytest.mark.parametrize("task", _STREAM_TASKS, ids=["pad", "noise", "gaps-answer-in-input", "smallest-vocab",
                                                     "noise-odd-seq-len"])
def test_chunked_stream_is_the_all_at_once_stream(task):
    """Was: the training stream was made whole (`generate(task, steps * batch_size)`, ~25 GB at --steps 20000
    --batch-size 64 --seq-len 512). generate_chunks holds a piece at a time and gives the same rows: every
    draw of generate in its place in the random stream, whatever the piece size."""
    from orthros.evaluation.mqar import generate_chunks

    for n, seed in ((53, 4), (54, 4), (5, 1)):  # n * seq_len odd and even: the noise may leave a half-word
        whole = generate(task, n, seed=seed)
        for rows in (1, 7, 16, n, n + 3):
            pieces = list(generate_chunks(task, n, seed=seed, rows=rows))
            assert [len(p["input_ids"]) for p in pieces] == [min(rows, n - a) for a in range(0, n, rows)]
            for k, v in whole.items():
                assert np.array_equal(np.concatenate([p[k] for p in pieces]), v), (n, rows, k)


def test_training_stream_batches_are_generates():
    """The training stream, made in pieces and kept compact, gives generate's batches, any step in any order."""
    from orthros.evaluation.mqar import _TrainStream

    task = MQARTask(vocab_size=300, seq_len=24, num_pairs=3, fill="noise")  # token ids beyond one byte
    tr = MQARTrain(steps=7, batch_size=3, seed=2)
    whole = generate(task, tr.steps * tr.batch_size, seed=tr.seed + 1)
    stream = _TrainStream(task, tr, tokens=5 * task.seq_len)  # made 5 sequences at a time
    for step in [*range(tr.steps), 0, 4]:
        ids, labels, qp = stream(step)
        sl = slice(step * 3, step * 3 + 3)
        assert ids.dtype == labels.dtype == qp.dtype == torch.int64
        assert np.array_equal(ids.numpy(), whole["input_ids"][sl]) and np.array_equal(labels.numpy(), whole["labels"][sl])
        assert np.array_equal(qp.numpy(), whole["query_pos"][sl])


def test_mqar_sweep_maxgap_is_eval_mqars_max_gap():
    """`eval mqar --max-gap` had no key in the sweep: a setting could not bound the key-to-query distance."""
    from orthros.evaluation.mqar_sweep import build_setting, parse_setting

    task, _ = build_setting(*parse_setting(["a", "T=64", "maxgap=20", "steps=1"]))
    assert task.max_gap == 20
    assert generate(task, 50, seed=0)["gaps"].max() <= 20
    assert build_setting(*parse_setting(["b", "steps=1"]))[0].max_gap is None


def test_recall_plot_legend_covers_no_point(tmp_path):
    """Issue: the legend sat at the lower left whatever the curves were, over the points of models still near
    chance (a short run, --steps 30: every model's first buckets hidden under it)."""
    import matplotlib

    from orthros.evaluation.mqar import plot_recall

    def res(name, accs):
        b = [{"lo": lo, "hi": 2 * lo, "n": 10, "acc": a} for lo, a in zip((2, 4, 8, 16, 32), accs)]
        return {"model": name, "acc": sum(accs) / len(accs), "acc_by_gap": b}

    out = {"train": {"window_size": 8, "steps": 30}, "task": {"num_pairs": 4, "seq_len": 64},
           "results": [res("Orthros", [0.1, 0.16, 0.16, 0.11, 0.08]), res("Transformer", [0.2, 0.05, 0.2, 0.13, 0.23]),
                       res("SWA", [0.0, 0.0, 0.05, 0.03, 0.04])]}
    fig = plot_recall(out, tmp_path / "r.png")
    fig.canvas.draw()
    ax = fig.axes[0]
    box = ax.get_legend().get_window_extent()
    curves = ax.get_lines()[:3]  # the models' curves, else the loop below checks no point
    assert [(line.get_label().split(" (")[0], len(line.get_xydata())) for line in curves] == [
        ("Orthros", 5), ("Transformer", 5), ("SWA", 5)]
    for line in curves:
        for x, y in ax.transData.transform(line.get_xydata()):
            assert not box.contains(x, y), (line.get_label(), x, y)
    matplotlib.pyplot.close(fig)


def _disk_full_on_savefig(monkeypatch):
    """matplotlib's savefig fails as on a full disk (the checks before the run passed)."""
    from matplotlib.figure import Figure

    def full(self, *a, **kw):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Figure, "savefig", full)


@pytest.mark.parametrize("old", [False, True])
def test_cli_mqar_a_failed_plot_leaves_no_json_and_names_plot(tmp_path, capsys, monkeypatch, old):
    """Issues: the figure's write error named the path only (not --plot); the results JSON written before
    it stayed behind (a previous one replaced) although the command failed."""
    from orthros.cli import main

    _disk_full_on_savefig(monkeypatch)
    out = tmp_path / "res" / "m.json"
    if old:
        out.parent.mkdir()
        out.write_text("previous\n")
    rc = main(["eval", "mqar", "--vocab-size", "16", "--seq-len", "32", "--num-pairs", "2", "--hidden-size", "16",
               "--window", "4", "--steps", "1", "--batch-size", "2", "--eval-examples", "4", "--models", "swa",
               "--no-progress", "-o", str(out), "--plot", str(tmp_path / "res" / "m.png")])
    assert rc == 1
    err = capsys.readouterr().err
    assert f"--plot {tmp_path / 'res' / 'm.png'}: cannot write the figure (No space left on device)" in err, err
    if old:
        assert [p.name for p in out.parent.iterdir()] == ["m.json"] and out.read_text() == "previous\n"
    else:
        assert list(tmp_path.iterdir()) == [], "nothing left: no JSON, no temporary, no folder made for them"


GiB = 1 << 30


@pytest.mark.parametrize("args, says", [
    (["--seq-len", "100000000"], "a training step's activations (--batch-size 32 x --seq-len 100000000 x --hidden-size "
                                 "64 x --layers 2) take 11.9 TiB; lower --batch-size, --seq-len, --hidden-size or "
                                 "--layers"),
    (["--eval-examples", "1000000000"], "the held-out sequences (--eval-examples 1000000000 x --seq-len 64) take "
                                        "1.9 TiB; lower --eval-examples or --seq-len"),
    (["--vocab-size", "1000000000"], "key draws (--eval-examples 1000 x --vocab-size 1000000000)"),
    (["--hidden-size", "1000000"], "weights and optimiser state (--vocab-size 64 x --hidden-size 1000000 x --layers 2)"),
    (["--steps", "100000000"], "the training sequences (--steps 100000000 x --batch-size 32 x --seq-len 64)"),
])
def test_cli_mqar_refuses_a_run_too_big_for_memory_before_allocating(capsys, monkeypatch, args, says):
    """Issue: absurd sizes failed deep in the allocator after the header ("MemoryError: Unable to allocate
    745. GiB for an array with shape (1000, 100000000)", a DefaultCPUAllocator RuntimeError for --hidden-size
    1000000), or swapped until killed (--batch-size 100000000, --layers 100000), naming no option."""
    import orthros.evaluation.mqar as mqar
    import orthros.utils as utils
    from orthros.cli import main

    monkeypatch.setattr(utils, "available_memory", lambda device, **kw: 8 * GiB)
    monkeypatch.setattr(mqar, "generate", lambda *a, **kw: pytest.fail("data was generated"))
    monkeypatch.setattr(mqar, "build_model", lambda *a, **kw: pytest.fail("a model was built"))
    assert main(["eval", "mqar", "--no-progress", *args]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "orthros eval mqar: error: this run needs at least " in err and "of host memory, more " \
        "than the 8.0 GiB free: " in err and says in err, err


def test_run_mqar_memory_check_names_fields_and_counts_jobs_and_the_device():
    from orthros.evaluation.mqar import check_memory, check_run, memory_needed

    task, tr = MQARTask(), MQARTrain()
    assert sum(p[2] for p in memory_needed(task, tr)) < 100 << 20  # the default run: tens of MB
    check_memory(task, tr, available=lambda d: 1 * GiB)
    with pytest.raises(ValueError, match=r"^MQAR this run needs at least .* held-out sequences \(eval_examples=1000 "
                                         r"x seq_len=100000000\)"):
        check_memory(MQARTask(seq_len=10 ** 8), replace(tr, batch_size=1), available=lambda d: 8 * GiB)
    # three models at once: three processes, each with its own data and model
    one = sum(p[2] for p in memory_needed(task, tr))
    assert sum(p[2] for p in memory_needed(task, tr, jobs=3)) == 3 * one
    assert sum(p[2] for p in memory_needed(task, replace(tr, models=("swa",)), jobs=3)) == one
    # on a GPU the model and its activations count against the device's memory, the data against the host's
    big = replace(tr, device="cuda", hidden_size=4096, num_layers=8)
    free = {"cpu": 64 * GiB, "cuda": 8 * GiB}
    with pytest.raises(ValueError, match=r"of cuda memory, more than the 8.0 GiB free: a model's weights"):
        check_memory(task, big, available=free.get)
    check_memory(task, replace(big, device="cpu"), available=free.get)  # the host has room for it


def _fake_cgroup(tmp_path, monkeypatch, max_, current, inactive_file, mem_available=64 * GiB):
    import orthros.utils as utils

    (tmp_path / "memory.max").write_text(f"{max_}\n")
    (tmp_path / "memory.current").write_text(f"{current}\n")
    (tmp_path / "memory.stat").write_text(f"anon 123\nfile {inactive_file + 5}\nactive_file 5\n"
                                          f"inactive_file {inactive_file}\nslab 7\n")
    (tmp_path / "meminfo").write_text(f"MemTotal: {2 * mem_available // 1024} kB\n"
                                      f"MemAvailable: {mem_available // 1024} kB\n")
    monkeypatch.setattr(utils, "CGROUP_ROOT", tmp_path)
    monkeypatch.setattr(utils, "MEMINFO", tmp_path / "meminfo")
    return utils.available_memory


def test_available_memory_does_not_count_a_containers_reclaimable_page_cache(tmp_path, monkeypatch):
    """Issue: memory.max - memory.current took the page cache of files read as used, so a container of
    8 GiB that had read 7 GiB of files (0.5 GiB in use) had "0.5 GiB free" and `eval mqar`, the demo and
    the sweep refused runs that fit. The working set (what docker and kubelet count) leaves out
    inactive_file, the cache the kernel drops first."""
    available = _fake_cgroup(tmp_path, monkeypatch, 8 * GiB, 15 * GiB // 2, 7 * GiB)
    assert available("cpu") == 8 * GiB - GiB // 2
    # the host's MemAvailable stays the bound where it is lower
    available = _fake_cgroup(tmp_path, monkeypatch, 8 * GiB, 1 * GiB, 0, mem_available=2 * GiB)
    assert available("cpu") == 2 * GiB
    # no limit (max) or no memory.stat: the host's figure; memory.current alone where memory.stat is unreadable
    available = _fake_cgroup(tmp_path, monkeypatch, "max", 1 * GiB, 0)
    assert available("cpu") == 64 * GiB
    available = _fake_cgroup(tmp_path, monkeypatch, 8 * GiB, 3 * GiB, 2 * GiB)
    (tmp_path / "memory.stat").unlink()
    assert available("cpu") == 5 * GiB
    # a working set above the limit (the kernel reclaiming): nothing free, never a negative size
    available = _fake_cgroup(tmp_path, monkeypatch, 8 * GiB, 9 * GiB, 0)
    assert available("cpu") == 0


@pytest.mark.parametrize("jobs, models, in_parent", [(1, ("swa", "orthros"), True), (2, ("swa",), True),
                                                     (2, ("swa", "orthros"), False)])
def test_memory_check_of_a_pool_on_cuda_makes_no_cuda_context_in_this_process(monkeypatch, jobs, models, in_parent):
    """Issue: with --jobs > 1 on CUDA the models train in spawned workers and this process never touches
    the GPU, but the memory check's torch.cuda.mem_get_info made a CUDA context here (~0.5 GB of device
    memory held for the whole pool). The pool's check asks a short-lived process instead."""
    import subprocess

    import orthros.utils as utils
    from orthros.evaluation.mqar import check_run

    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: calls.append(("here", str(device))) or (GiB, 2 * GiB))

    def run(cmd, **kw):
        calls.append(("subprocess", cmd[-1]))
        return subprocess.CompletedProcess(cmd, 0, stdout=f"{GiB}\n", stderr="")

    monkeypatch.setattr(utils.subprocess, "run", run)
    check_run(MQARTask(), MQARTrain(models=models, device="cuda:1"), jobs)
    assert calls == [("here" if in_parent else "subprocess", "cuda:1")]
    with pytest.raises(ValueError, match=r"of cuda:1 memory, more than the 1.0 GiB free"):
        check_run(MQARTask(), MQARTrain(models=models, device="cuda:1", hidden_size=4096, num_layers=8), jobs)


def test_cuda_memory_asked_of_another_process_is_unknown_where_it_fails(monkeypatch):
    from orthros import utils
    from orthros.utils import available_memory

    free = available_memory("cuda", in_subprocess=True)
    assert free > 0 if torch.cuda.is_available() else free is None
    # without CUDA no process is started to find that out (a fresh Python importing torch: seconds)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(utils.subprocess, "run", lambda *a, **k: pytest.fail("a process was started"))
    assert available_memory("cuda:1", in_subprocess=True) is None

"""``orthros bench prefill|decode|e2e`` run end to end on a tiny CPU model: table, JSON, PNG."""

from __future__ import annotations

import json

import pytest
import torch

from orthros.cli import main as orthros_main

TINY = ["--preset", "tiny", "--device", "cpu", "--dtype", "fp32"]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("what, extra, key", [
    ("prefill", ["--lengths", "32,64", "--budget-s", "0.01", "--chunk", "16"], "system"),
    ("decode", ["--contexts", "16,48", "--steps", "2", "--batch-sizes", "1,2"], "mode"),
    ("e2e", ["--pairs", "8:4,16:3", "--fit", "16:4"], "mode"),
])
def test_bench_writes_table_json_and_plot(tmp_path, capsys, what, extra, key):
    assert orthros_main(["bench", what, *TINY, "--out", str(tmp_path), *extra]) == 0
    data = json.loads((tmp_path / f"{what}.json").read_text())
    assert data["meta"]["dtype"] == "float32" and data["meta"]["model"]["num_hidden_layers"] == 2
    rows = [r for r in data["rows"] if key in r]
    assert rows and all(r.get("ms", r.get("ms_per_step", r.get("e2e_s", 0))) > 0 for r in rows)
    assert (tmp_path / f"{what}.png").stat().st_size > 1000
    out = capsys.readouterr().out
    assert "wrote" in out
    if what == "decode":  # its ratio runs the other way from prefill's (> 1: Orthros faster); was not said
        assert "decode step (vs_full: Orthros's step / the Transformer's, > 1: Orthros slower)" in out
    if what == "prefill":
        assert {r["system"] for r in rows} == {"orthros", "orthros-floor", "full", "hf-sdpa", "hf-floor"}
    if what == "e2e":
        assert any("fit" in r for r in data["rows"])
    # the options the timings depend on (e2e's --chunk and --no-cuda-graphs were left out of its JSON)
    assert data["meta"].get("chunk") == {"prefill": 16, "decode": None, "e2e": 16384}[what]
    assert data["meta"].get("no_cuda_graphs") == (None if what == "prefill" else False)


def test_bench_e2e_no_cuda_graphs_reaches_the_fit_check(tmp_path, monkeypatch):
    """--no-cuda-graphs reaches every Engine of the e2e section, the --fit check's too (it built
    its Engine with the default, so it measured the graphs' memory pool the run had switched off)."""
    from orthros.benchmarks import inference as I

    seen, real = [], I.Engine

    def spy(*args, **kw):
        seen.append((kw.get("max_seq_len"), kw.get("cuda_graphs")))
        return real(*args, **kw)

    monkeypatch.setattr(I, "Engine", spy)
    assert orthros_main(["bench", "e2e", *TINY, "--out", str(tmp_path), "--pairs", "8:3", "--batch", "1",
                         "--fit", "16:4", "--no-cuda-graphs"]) == 0
    assert {s for s, _ in seen} == {8 + 3 - 1, 16 + 4 - 1} and {g for _, g in seen} == {False}  # e2e, fit


def test_bench_rejects_bad_arguments(capsys):
    with pytest.raises(SystemExit):
        orthros_main(["bench", "prefill", "--lengths", "0,5"])
    assert orthros_main(["bench", "prefill", *TINY, "--systems", "orthros,vllm"]) == 2
    assert "vllm" in capsys.readouterr().err


def test_bench_all_runs_the_three_sections_on_one_model(tmp_path):
    argv = ["bench", "all", *TINY, "--out", str(tmp_path), "--lengths", "32", "--budget-s", "0.01",
            "--systems", "orthros,full", "--contexts", "16", "--steps", "2", "--batch-sizes", "1",
            "--pairs", "8:3", "--batch", "1"]
    assert orthros_main(argv) == 0
    for what in ("prefill", "decode", "e2e"):
        assert (tmp_path / f"{what}.json").exists() and (tmp_path / f"{what}.png").exists()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_capture_graph_replays_the_call_and_times_it():
    """The one home of the benchmarks' CUDA-graph timing (gemv.py, attention.py, persistent_chain.py):
    the captured call runs on each replay (after the warm-up calls, not inside the graph twice)."""
    from orthros.benchmarks.inference import capture_graph, replay_seconds

    dev = torch.device("cuda", torch.cuda.current_device())
    x = torch.zeros(1 << 20, device=dev)
    g = capture_graph(lambda: x.add_(1.0), dev, warmup=2)
    assert x[0].item() == 2.0  # the two warm-up calls ran eagerly, capture ran nothing
    g.replay()
    torch.cuda.synchronize(dev)
    assert x[0].item() == 3.0
    t = replay_seconds(g, reps=5, warmup=1)
    assert t > 0 and x[0].item() == 9.0  # 1 warm + 5 timed replays


def test_script_meta_records_the_orthros_switches_of_the_environment(monkeypatch):
    """A benchmark's metadata names every ORTHROS_* setting it ran under (the kernels' A/B
    switches are read at import, so a run's JSON is the only record of them), and no others."""
    from orthros.benchmarks.inference import script_meta

    monkeypatch.setenv("ORTHROS_GEMV_EVICT_FIRST", "1")
    monkeypatch.setenv("NOT_ORTHROS_X", "y")
    meta = script_meta("cpu", ["--a"])
    assert meta["orthros_env"]["ORTHROS_GEMV_EVICT_FIRST"] == "1"
    assert all(k.startswith("ORTHROS_") for k in meta["orthros_env"]) and meta["argv"] == ["--a"]


# ------------------------------------------------ refused before the model is built (issue hunt)

@pytest.fixture
def no_model(monkeypatch):
    """Building the benchmarked model fails the test: these inputs must be refused before it."""
    import socket

    from orthros.benchmarks import models

    def refuse(*a, **k):
        raise AssertionError("the model was built")

    def no_network(*a, **k):
        raise AssertionError("network access attempted")

    monkeypatch.setattr(models, "orthros_model", refuse)
    monkeypatch.setattr(socket.socket, "connect", no_network)


@pytest.mark.parametrize("what, extra, says", [
    # was: ZeroDivisionError (exit 1) after the first point ran; a negative count: "the cache is full"
    ("decode", ["--steps", "0"], "--steps must be >= 1, got 0"),
    ("all", ["--steps", "-3"], "--steps must be >= 1, got -3"),
    # was: torch's RuntimeError (exit 1), not naming --device
    ("decode", ["--device", "nonsense"], "--device must be cpu, cuda or cuda:N, got 'nonsense'"),
    ("decode", ["--device", "meta"], "--device must be cpu, cuda or cuda:N, got 'meta'"),
    # was: OrthrosConfig.window_size's error, not naming --window
    ("e2e", ["--window", "0"], "--window must be >= 1, got 0"),
    # was: no point measured, empty JSON and PNG written, exit 0
    ("prefill", ["--systems", ","], "--systems names no system"),
    # was: "unknown systems in 'orthros,vllm'; choose from ('orthros', ...)": no option named, a tuple's repr
    ("all", ["--systems", "orthros,vllm"], "--systems 'orthros,vllm': unknown vllm; choose from orthros, "
                                           "orthros-floor, full, hf-sdpa, hf-floor"),
    # was: the engine refused the point mid-sweep, after the shorter ones ran
    ("prefill", [], "--lengths needs positions 0..131071, beyond max_position_embeddings=65536 of --preset tiny"),
    ("e2e", ["--pairs", "8:4,60000:6000"], "--pairs needs positions 0..65998"),
    # was: accepted, and the 5 warm-up steps ran past the positions (--steps 3 alone was counted)
    ("decode", ["--contexts", "65533", "--steps", "3"], "--contexts needs positions 0..65537"),
    # was: "--contexts needs positions 0..70015" for a context of 16: the option too big, --steps, not named
    ("decode", ["--contexts", "16", "--steps", "70000"], "--contexts and --steps need positions 0..70015, beyond "
                                                         "max_position_embeddings=65536 of --preset tiny (a context "
                                                         "of 16, then 70000 steps)"),
    # was: "--chunk must be >= 1", "--batch must be >= 1": not what was given
    ("prefill", ["--lengths", "32", "--chunk", "-4"], "--chunk must be >= 1, got -4"),
    ("e2e", ["--batch", "0"], "--batch must be >= 1, got 0"),
    ("e2e", ["--pairs", "8:4", "--fit", "65536:2"], "--fit needs positions 0..65536"),
    # was: accepted and ignored (decode steps run over a cache declared filled: no prefill, no chunk)
    ("decode", ["--chunk", "64"], "--chunk goes with prefill, e2e and all"),
])
def test_bench_refuses_before_building_the_model(tmp_path, capsys, no_model, what, extra, says):
    out = tmp_path / "out"
    assert orthros_main(["bench", what, *TINY, "--out", str(out), *extra]) == 2
    err = capsys.readouterr().err
    assert says in err and err.startswith("orthros bench: error: ") and len(err.strip().splitlines()) == 1, err
    assert not out.exists()


def test_bench_out_that_is_a_file(tmp_path, capsys, no_model):
    """Was: FileExistsError from os.makedirs after the model was built."""
    f = tmp_path / "f"
    f.write_text("keep")
    for out in (f, f / "sub"):
        assert orthros_main(["bench", "decode", *TINY, "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert f"--out {out}: {f} is a file, not a directory" in err, err
    assert f.read_text() == "keep"


def test_bench_model_must_be_a_local_checkpoint(tmp_path, capsys, monkeypatch, no_model):
    """Was: transformers' OSError (exit 1) for a missing path, and a hub lookup (five retries) for
    a name that looks like a repo id."""
    monkeypatch.chdir(tmp_path)
    for name in (str(tmp_path / "nope"), "some-org/nope"):
        assert orthros_main(["bench", "decode", *TINY, "--model", name, "--out", str(tmp_path / "o")]) == 2
        err = capsys.readouterr().err
        assert f"--model {name}: no such directory" in err and "nothing is downloaded" in err, err


def test_bench_lengths_beyond_a_checkpoints_positions(tmp_path, capsys):
    """A checkpoint's own max_position_embeddings bounds the lengths (was: the 60:10 point failed
    after the 8:4 one ran); within it, --model still benchmarks the checkpoint."""
    from orthros.evaluation.common import make_tiny_checkpoint

    d = make_tiny_checkpoint(tmp_path / "ck", max_position_embeddings=64)
    argv = ["bench", "e2e", "--device", "cpu", "--dtype", "fp32", "--model", str(d), "--batch", "1"]
    assert orthros_main(argv + ["--out", str(tmp_path / "o1"), "--pairs", "8:4,60:10"]) == 2
    assert "--pairs needs positions 0..68, beyond the model's max_position_embeddings=64" in capsys.readouterr().err
    assert not (tmp_path / "o1").exists()
    assert orthros_main(argv + ["--out", str(tmp_path / "o2"), "--pairs", "8:4"]) == 0
    assert json.loads((tmp_path / "o2" / "e2e.json").read_text())["meta"]["model_path"] == str(d)


@pytest.mark.parametrize("extra", [["--window", "64"], ["--preset", "tiny"]])
def test_bench_random_weight_options_refused_with_a_checkpoint(tmp_path, capsys, no_model, extra):
    """Was: --window and --preset with --model were accepted and ignored (the checkpoint's own
    window and shape were benchmarked; the JSON recorded neither)."""
    from orthros.evaluation.common import make_tiny_checkpoint

    d = make_tiny_checkpoint(tmp_path / "ck", max_position_embeddings=64)
    out = tmp_path / "o"
    assert orthros_main(["bench", "decode", "--device", "cpu", "--dtype", "fp32", "--model", str(d), *extra,
                         "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{extra[0]} shapes the random-weight model; --model {d}" in err and not out.exists(), err


def test_prefill_floor_of_an_orthros_h_model():
    """The engine's no-attention floor of an Orthros-H model (``--model`` an Orthros-H checkpoint):
    its GDN layers read and write their states through the floor's cache view (was: AttributeError
    '_NoAttention' object has no attribute 'linear_state', a traceback, exit 1)."""
    from orthros.benchmarks.inference import bench_prefill
    from orthros.benchmarks.models import orthros_model

    model = orthros_model("tiny-h", device="cpu", dtype=torch.float32, window_size=8)
    rows = bench_prefill(model, [24], systems=("orthros-floor", "orthros"), chunk=16, budget_s=0)
    assert [r["system"] for r in rows] == ["orthros-floor", "orthros"] and all(r["ms"] > 0 for r in rows)


def test_e2e_plot_puts_each_pair_at_its_own_label(monkeypatch):
    """Pairs of one input length (8:4, 8:2): each mode's point of a pair sits at that pair's tick
    (was: each mode's points sorted by (in, time, out), so a mode whose 8:2 ran slower than its
    8:4 drew them at each other's labels)."""
    from orthros.benchmarks import inference as I

    figs = []
    monkeypatch.setattr(I, "save_figure", lambda fig, path: figs.append(fig))
    rows = [{"mode": m, "in": 8, "out": o, "ttft_s": t, "e2e_s": 10 * t}
            for m, o, t in (("orthros", 4, 1.0), ("orthros", 2, 2.0), ("full", 4, 3.0), ("full", 2, 0.5))]
    I.plot_e2e(rows, "unused.png")
    for ax, key in zip(figs[0].axes, ("ttft_s", "e2e_s")):
        labels = [t.get_text() for t in ax.get_xticklabels()]
        # the loop below checks every mode's curve (a curve drawn otherwise, as a scatter, left it nothing to check)
        assert sorted((line.get_label(), len(line.get_xdata())) for line in ax.get_lines()) == \
            [("Orthros", 2), ("Transformer (same engine)", 2)]
        for line in ax.get_lines():
            mode = "orthros" if line.get_label() == "Orthros" else "full"
            drawn = {labels[int(x)]: y for x, y in zip(line.get_xdata(), line.get_ydata())}
            assert drawn == {f"{r['in']}/{r['out']}": r[key] for r in rows if r["mode"] == mode}


@pytest.mark.parametrize("out", ["", "/proc/orthros-bench-out"])
def test_bench_out_that_cannot_be_made(out, capsys, no_model):
    """Was: os.makedirs failed after the model was built, the message not naming --out
    ("[Errno 2] No such file or directory: ''")."""
    assert orthros_main(["bench", "decode", *TINY, "--contexts", "8", "--out", out]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"orthros bench: error: --out {out!r}: cannot make the directory") and \
        len(err.strip().splitlines()) == 1, err


def _strict_json(path):
    """The file as standard JSON (NaN / Infinity refused, as JSON.parse and other readers refuse them)."""
    def refuse(name):
        raise ValueError(f"{name} is not JSON")
    return json.loads(path.read_text(), parse_constant=refuse)


def test_bench_json_is_standard_json_where_a_figure_is_missing(tmp_path, monkeypatch, capsys):
    """An e2e pair of one output token has no decode throughput, and a prefill point out of memory
    no time: null in the JSON (was NaN, which JSON.parse and other strict readers refuse); the
    table names the error, the plot leaves the point out."""
    import warnings

    from orthros.benchmarks import inference as I

    assert orthros_main(["bench", "e2e", *TINY, "--out", str(tmp_path), "--pairs", "4:1", "--batch", "1"]) == 0
    rows = [r for r in _strict_json(tmp_path / "e2e.json")["rows"] if "mode" in r]
    assert rows and all(r["decode_tok_s"] is None for r in rows)

    def oom(fn, device, **kw):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory")
    monkeypatch.setattr(I, "measure", oom)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="No artists with labels")  # an empty legend
        assert orthros_main(["bench", "prefill", *TINY, "--out", str(tmp_path), "--lengths", "16",
                             "--systems", "orthros,full"]) == 0
    rows = _strict_json(tmp_path / "prefill.json")["rows"]
    assert [(r.get("ms"), r.get("error")) for r in rows if "system" in r] == [(None, "out of memory")] * 2
    assert "out of memory" in capsys.readouterr().out and (tmp_path / "prefill.png").exists()


def test_bench_e2e_on_a_checkpoint_of_few_positions(tmp_path, capsys):
    """Was: the e2e section's warm-up generated 16 + 4 tokens whatever --pairs asked, so a checkpoint of
    fewer than 20 positions failed after the checks had passed its pairs (8:4 needs 11)."""
    from orthros.evaluation.common import make_tiny_checkpoint

    d = make_tiny_checkpoint(tmp_path / "ck", max_position_embeddings=16)
    out = tmp_path / "out"
    rc = orthros_main(["bench", "e2e", "--model", str(d), "--device", "cpu", "--dtype", "fp32", "--out", str(out),
                       "--pairs", "8:4", "--batch", "1"])
    assert rc == 0, capsys.readouterr().err
    rows = json.loads((out / "e2e.json").read_text())["rows"]
    assert {(r["in"], r["out"]) for r in rows if "mode" in r} == {(8, 4)}


def test_bench_runs_a_repeated_value_once():
    """Was: --lengths 32,32 (or --pairs 8:4,8:4, --batch-sizes 1,1) measured the point twice and wrote two rows of
    one key, which the plot drew as one point and the table as two."""
    from orthros.benchmarks.cli import build_parser

    p = build_parser()
    assert p.parse_args(["prefill", "--lengths", "32,64,32"]).lengths == [32, 64]
    assert p.parse_args(["decode", "--batch-sizes", "1,1,2"]).batch_sizes == [1, 2]
    assert p.parse_args(["e2e", "--pairs", "8:4,16:3,8:4"]).pairs == [(8, 4), (16, 3)]


def test_bench_prefill_runs_a_repeated_system_once():
    """Was: --systems orthros,orthros (or bench_prefill(systems=...)) timed Orthros twice: two rows of one
    key in the JSON and the table, the summary keeping the second."""
    from orthros.benchmarks import inference as I
    from orthros.benchmarks.models import orthros_model

    model = orthros_model("tiny", device="cpu", dtype=torch.float32)
    rows = I.bench_prefill(model, [16], systems=["orthros", "full", "orthros"], budget_s=0)
    assert [r["system"] for r in rows] == ["orthros", "full"]


@pytest.mark.parametrize("what, taken", [("decode", "decode.png"), ("all", "e2e.json")])
def test_bench_out_whose_result_name_is_a_folder(tmp_path, capsys, no_model, what, taken):
    """Was: IsADirectoryError at the first save (the first point measured) or at the end (the PNG,
    the whole sweep measured); refused before the model is built."""
    (tmp_path / taken).mkdir()
    assert orthros_main(["bench", what, *TINY, "--contexts", "8", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"orthros bench: error: --out {tmp_path}: {tmp_path / taken} is a folder") and \
        len(err.strip().splitlines()) == 1, err


def test_pair_and_int_lists_read_alike():
    # int_list took a trailing comma ('1024,'), pair_list refused one ('8:4,'): one rule for both
    import argparse

    from orthros.benchmarks.cli import int_list, pair_list

    assert int_list("1024,") == [1024] and pair_list("8:4,") == [(8, 4)]
    assert pair_list("8:4,8:4,16:2") == [(8, 4), (16, 2)]
    for bad in ("", ",", "8", "8:0"):
        with pytest.raises(argparse.ArgumentTypeError):
            pair_list(bad)


def test_bench_hf_baselines_of_a_hybrid_checkpoint_say_what_they_time(tmp_path, capsys):
    # hf-sdpa / hf-floor time an all-attention Qwen3 of the checkpoint's sizes: for an Orthros-H checkpoint the
    # ratios compared other layer kinds, and neither the table nor the JSON said so
    from orthros.evaluation.common import make_tiny_checkpoint
    from orthros.kinds import hybrid_layout

    d = make_tiny_checkpoint(tmp_path / "ck", max_position_embeddings=64, num_hidden_layers=4,
                             linear_key_head_dim=16, linear_value_head_dim=16, **hybrid_layout("orthros-h", 4))
    capsys.readouterr()
    assert orthros_main(["bench", "prefill", "--model", str(d), "--device", "cpu", "--dtype", "fp32", "--out",
                         str(tmp_path / "o"), "--lengths", "32", "--budget-s", "0.01", "--systems",
                         "orthros,hf-sdpa"]) == 0
    assert "hf-sdpa time an all-attention Qwen3" in capsys.readouterr().err
    meta = json.loads((tmp_path / "o" / "prefill.json").read_text())["meta"]
    assert "all-attention Qwen3" in meta["hf_baseline"]



@pytest.mark.parametrize("what", ["prefill", "decode", "e2e", "all"])
def test_bench_on_cpu_needs_a_named_preset(tmp_path, capsys, no_model, what):
    """Was: --device cpu without --preset built the default qwen3-8b shape on the CPU (minutes, 16 GB
    of random weights) before the sweep began."""
    out = tmp_path / "out"
    assert orthros_main(["bench", what, "--device", "cpu", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--device cpu: give --preset tiny" in err and "--preset qwen3-8b" in err, err
    assert not out.exists()


@pytest.mark.parametrize("what, extra", [
    ("decode", ["--contexts", "11", "--steps", "5", "--batch-sizes", "1"]),  # 11 + 5 steps: the 16 positions
    ("decode", ["--contexts", "13", "--steps", "1", "--batch-sizes", "1"]),  # 13 + the 5 warm-up steps: 18 > 16
    ("e2e", ["--pairs", "12:5", "--batch", "1", "--fit", "10:7"]),  # 12 + 5 - 1 = 10 + 7 - 1 = 16
])
def test_bench_at_the_exact_position_limit(tmp_path, capsys, what, extra):
    """What the checks accept runs: the engines were sized a slot or two past the need (decode:
    context + steps + warm-up + 2; e2e: in + out; fit: in + out) and refused by Engine at the limit
    after the checks had passed the request (max_seq_len=18 exceeds the model's
    max_position_embeddings=16)."""
    from orthros.evaluation.common import make_tiny_checkpoint

    d = make_tiny_checkpoint(tmp_path / "ck", max_position_embeddings=16)
    out = tmp_path / "out"
    rc = orthros_main(["bench", what, "--model", str(d), "--device", "cpu", "--dtype", "fp32", "--out", str(out),
                       *extra])
    err = capsys.readouterr().err
    if extra[1] == "13":  # one past: refused by the check, before the model, naming the option
        assert rc == 2 and "--contexts needs positions 0..17, beyond the model's max_position_embeddings=16" in err
        return
    assert rc == 0, err
    rows = json.loads((out / f"{what}.json").read_text())["rows"]
    assert rows and all("error" not in r for r in rows)
    if what == "e2e":
        assert [r["fit"]["in"] for r in rows if "fit" in r] == [10]


def test_bench_stopped_by_sigterm(tmp_path):
    """SIGTERM (a scheduler's preemption, `kill`) mid-sweep: was the default handler's silent death
    (exit -15, a `.decode.json.tmp-<pid>` left where it came mid-save). Now one line, exit 143, the
    JSON of the points done whole and no temporary file."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    out = tmp_path / "out"
    contexts = ",".join(str(n) for n in range(16, 20000))  # runs for minutes: each point is saved when done
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "orthros", "bench", "decode", "--preset", "tiny", "--device", "cpu",
                             "--steps", "1", "--batch-sizes", "1", "--contexts", contexts, "--out", str(out)],
                            cwd=Path(__file__).resolve().parents[2], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300  # a guard against a hang, not a measurement
        while not (out / "decode.json").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None, proc.stderr.read()  # still sweeping: the first points saved
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines = [x for x in err.splitlines() if "terminated" in x or "Traceback" in x]
    assert proc.returncode == 143 and lines == ["orthros bench: terminated (SIGTERM)"], err[-2000:]
    assert sorted(p.name for p in out.iterdir()) == ["decode.json"]  # no .decode.json.tmp-<pid>
    rows = json.loads((out / "decode.json").read_text())["rows"]
    assert rows and all(r["mode"] == "orthros" for r in rows)


@pytest.mark.parametrize("stop, code", [(KeyboardInterrupt, 130), (RuntimeError, 1)])
def test_bench_stopped_early_marks_its_json_and_says_where(tmp_path, capsys, monkeypatch, stop, code):
    """A sweep stopped after its first point (Ctrl-C, a failure): the point is kept, the JSON's meta
    says the sweep stopped and why, and stderr names the file. Was: a JSON like a finished sweep of
    fewer points, and only 'interrupted'."""
    import orthros.benchmarks.inference as I

    real = I.bench_decode

    def one_then_stop(*a, on_row, **kw):
        def row(r):
            on_row(r)
            raise stop("stopped after the first point")
        return real(*a, on_row=row, **kw)

    monkeypatch.setattr(I, "bench_decode", one_then_stop)
    (tmp_path / "decode.png").write_bytes(b"an earlier run's plot")  # was kept beside this run's JSON: other points
    rc = orthros_main(["bench", "decode", *TINY, "--contexts", "16,48", "--steps", "1", "--batch-sizes", "1",
                       "--out", str(tmp_path)])
    assert rc == code
    data = json.loads((tmp_path / "decode.json").read_text())
    assert len(data["rows"]) == 1 and data["meta"]["stopped"].startswith(
        "interrupted" if stop is KeyboardInterrupt else "RuntimeError: stopped after the first point")
    assert f"the 1 points measured so far are in {tmp_path / 'decode.json'}" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["decode.json"]  # and no temporary file
    monkeypatch.setattr(I, "bench_decode", real)  # a whole sweep has no "stopped"
    assert orthros_main(["bench", "decode", *TINY, "--contexts", "16", "--steps", "1", "--batch-sizes", "1",
                         "--out", str(tmp_path)]) == 0
    assert "stopped" not in json.loads((tmp_path / "decode.json").read_text())["meta"]


@pytest.mark.parametrize("what", ["prefill", "decode", "e2e", "all"])
def test_bench_help_names_every_default(what):
    """Was: --chunk (16384), --budget-s (3.0) and --single-shot-s (25.0) ran with a default their help did not
    name (as `orthros eval`'s options must, tests/evaluation/test_eval_cli.py)."""
    import argparse

    from orthros.benchmarks.cli import build_parser

    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    sp = sub.choices[what]
    fmt = sp._get_formatter()
    unsaid = []
    for a in sp._actions:
        if not a.option_strings or a.default in (None, False, argparse.SUPPRESS):
            continue
        text = fmt._expand_help(a) if a.help else ""
        said = {str(a.default), format(a.default, "g")} if isinstance(a.default, float) else {str(a.default)}
        if isinstance(a.default, list):  # comma lists: said as typed, or in words ("8K to 128K")
            said = {",".join(f"{x[0]}:{x[1]}" if isinstance(x, tuple) else str(x) for x in a.default), "K"}
        if a.dest == "systems":
            said.add("all five")
        if "default" not in text or not any(v in text for v in said):
            unsaid.append(f"{a.option_strings[0]} (default {a.default!r}): {text!r}")
    assert not unsaid, unsaid


# ------------------------------------------------ memory: refused up front (issue hunt)

MiB = 1 << 20


@pytest.mark.parametrize("what, extra, says", [
    ("decode", ["--batch-sizes", "1,1000", "--contexts", "1024", "--steps", "2"],
     "the cache of 1000 rows (--batch-sizes 1000) of 1029 tokens (--contexts 1024 + 5 warm-up steps) takes 502.4 MiB; "
     "at most 6 rows of 1029 tokens fit: lower --batch-sizes to at most 6"),
    ("decode", ["--batch-sizes", "1,10", "--contexts", "6000", "--steps", "2"],  # one row: not "1 rows ... fit"
     "(--contexts 6000 + 5 warm-up steps) takes 29.3 MiB; at most 1 row of 6005 tokens fits: lower --batch-sizes "
     "to at most 1"),
    ("e2e", ["--batch", "100000", "--pairs", "8:4,100:29"],
     "the cache of 100000 rows (--batch 100000) of 128 tokens (--pairs 100:29) takes 6.1 GiB; at most 55 rows of "
     "128 tokens fit: lower --batch to at most 55"),
    ("decode", ["--batch-sizes", "4", "--contexts", "60000"],
     "of 4 rows (--batch-sizes 4) of 60050 tokens (--contexts 60000 + 50 steps) takes 117.3 MiB; a row of at most "
     "7098 tokens fits: lower --contexts to at most 7048 (a row holds the context and 50 steps) and --batch-sizes "
     "to 1"),
    ("prefill", ["--lengths", "16,50000", "--systems", "orthros,full"],
     "the cache of a row of 50000 tokens (--lengths 50000) takes 24.4 MiB; a row of at most 7098 tokens fits: "
     "lower --lengths to at most 7098"),
    ("e2e", ["--pairs", "8:4", "--fit", "40000:9000"],
     "the cache of a row of 48999 tokens (--fit 40000:9000) takes 23.9 MiB; a row of at most 7098 tokens fits: "
     "lower --fit to IN+OUT at most 7099"),
    ("e2e", ["--batch", "2", "--pairs", "8:4,40000:9000"],
     "the cache of 2 rows (--batch 2) of 48999 tokens (--pairs 40000:9000) takes 47.9 MiB; a row of at most 7098 "
     "tokens fits: lower --pairs to IN+OUT at most 7099 and --batch to 1"),
])
def test_bench_refuses_a_run_too_big_for_memory_before_allocating(tmp_path, capsys, monkeypatch, no_model, what,
                                                                   extra, says):
    """Issue: an absurd --batch / --batch-sizes (or a context whose cache cannot fit) failed deep in
    the allocator once the model was built and the sweep got there ("DefaultCPUAllocator: can't
    allocate memory: you tried to allocate 384320000000 bytes", exit 1), naming no option. The
    weights and the largest cache are now sized on the meta device and refused up front."""
    import orthros.utils as utils

    monkeypatch.setattr(utils, "available_memory", lambda device, **kw: 4 * MiB)
    out = tmp_path / "out"
    assert orthros_main(["bench", what, *TINY, "--out", str(out), *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("orthros bench: error: this run needs at least ") and "of host memory, more than the " \
        "4.0 MiB free: the model's weights take 547.0 KiB and " in err and says in err, err
    assert len(err.strip().splitlines()) == 1 and not out.exists()


def test_bench_memory_check_names_what_the_option_itself_may_be():
    """A decode row holds --contexts and its steps: 'a row of at most 6 tokens fits: lower --contexts' led to
    --contexts 6, refused again; the option's own bound is said (--contexts 1 here), and a context too short
    for even --contexts 1 and its steps is named as such. One row is 'a row', not '1 rows'."""
    import argparse

    from orthros.benchmarks.cli import check_memory, memory_needed

    args = argparse.Namespace(what="decode", preset="tiny", model=None, window=8, contexts=[100], batch_sizes=[1],
                              steps=2)
    weights, parts = memory_needed(args, torch.float32)
    row = parts[0]["row_bytes"]

    def said(free):
        with pytest.raises(ValueError) as e:
            check_memory(args, torch.device("cpu"), torch.float32, available=lambda device: free)
        return str(e.value)

    err = said(weights + row(6))
    assert "the cache of a row (--batch-sizes 1) of 105 tokens (--contexts 100 + 5 warm-up steps)" in err, err
    assert err.endswith("a row of at most 6 tokens fits: lower --contexts to at most 1 (a row holds the context "
                        "and 5 steps)"), err
    assert said(weights + row(5)).endswith("not even a row of 6 tokens (a context of 1 and 5 warm-up steps) fits "
                                           "beside the weights")


def test_bench_memory_check_of_the_weights_and_the_hf_baseline(tmp_path, capsys, monkeypatch, no_model):
    import orthros.utils as utils

    monkeypatch.setattr(utils, "available_memory", lambda device, **kw: 256 << 10)
    assert orthros_main(["bench", "decode", *TINY, "--out", str(tmp_path / "o"), "--contexts", "8"]) == 2
    assert "the model's weights take 547.0 KiB of host memory, more than the 256.0 KiB free: choose a smaller " \
           "--preset, --model or --dtype" in capsys.readouterr().err
    monkeypatch.setattr(utils, "available_memory", lambda device, **kw: 1 * MiB)
    assert orthros_main(["bench", "prefill", *TINY, "--out", str(tmp_path / "o"), "--lengths", "16",
                         "--systems", "orthros,hf-sdpa"]) == 2
    assert "the model's weights take 547.0 KiB and the HF baseline's own weights (hf-sdpa in --systems) " \
           "another 545.5 KiB; drop them from --systems" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_bench_memory_estimate_is_what_the_engine_allocates():
    """The estimate's cache is the engine's (rows x tokens, GDN states included), its weights the model's."""
    import argparse

    from orthros.benchmarks.cli import memory_needed
    from orthros.benchmarks.models import orthros_model
    from orthros.engine import Engine

    args = argparse.Namespace(what="e2e", preset="tiny", model=None, window=8, pairs=[(20, 5), (8, 4)], batch=3,
                              fit=[(6, 2)])
    weights, parts = memory_needed(args, torch.float32)
    model = orthros_model("tiny", device="cpu", dtype=torch.float32, window_size=8)
    assert weights == sum(p.numel() * p.element_size() for p in model.parameters())
    eng = Engine(model, max_batch_size=3, max_seq_len=24, cuda_graphs=False)
    assert [p["bytes"] for p in parts] == [eng.cache.nbytes + eng.cache.state_nbytes, parts[0]["row_bytes"](7)]


def test_bench_memory_unknown_is_not_checked(tmp_path, monkeypatch):
    import orthros.utils as utils

    monkeypatch.setattr(utils, "available_memory", lambda device, **kw: None)
    assert orthros_main(["bench", "decode", *TINY, "--out", str(tmp_path), "--contexts", "8", "--steps", "1",
                         "--batch-sizes", "1"]) == 0

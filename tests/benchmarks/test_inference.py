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
    assert "wrote" in capsys.readouterr().out
    if what == "prefill":
        assert {r["system"] for r in rows} == {"orthros", "orthros-floor", "full", "hf-sdpa", "hf-floor"}
    if what == "e2e":
        assert any("fit" in r for r in data["rows"])


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

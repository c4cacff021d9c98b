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

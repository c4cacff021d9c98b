"""benchmarks/probe_harness.py, the chain probes' shared run, on the CPU with a stand-in chain: the
rows and the JSON it writes, the error against the ``torch`` system's output, and a failed run
(``failure()``) refused with exit 1 and no file."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import probe_harness  # noqa: E402

torch = pytest.importorskip("torch")


class StandIn:
    """Three systems: ``torch`` (the reference), ``engine`` (equal), ``off`` (10% larger)."""

    bytes_per_layer = 1000

    def __init__(self, why=None):
        self.why, self.resets = why, 0
        self.x = torch.arange(1.0, 9.0)

    def call(self, system):
        return {"torch": lambda: self.x, "engine": lambda: self.x.clone(), "off": lambda: self.x * 1.1}[system]

    def reset(self):
        self.resets += 1

    def failure(self):
        return self.why


def args(tmp_path, systems):
    return argparse.Namespace(out=str(tmp_path / "r.json"), systems=systems, reps=1, layers=2)


def test_rows_errors_and_json(tmp_path, capsys):
    a = args(tmp_path, ["engine", "off"])
    chain = StandIn()
    meta = {"copy_bandwidth_Bps": 1e9}
    rc = probe_harness.run_chain(a, chain, torch.device("cpu"), meta, "title", time.time())
    assert rc == 0 and chain.resets == 2
    data = json.loads(Path(a.out).read_text())
    rows = {r["system"]: r for r in data["rows"]}
    assert rows["engine"]["rel_err_vs_torch"] == 0
    assert rows["off"]["rel_err_vs_torch"] == pytest.approx(0.1, rel=1e-5)
    assert rows["off"]["floor_us_per_layer"] == pytest.approx(1.0)  # 1000 bytes at 1 GB/s
    assert rows["off"]["vs_engine"] is None  # no timing on a CPU
    assert data["meta"]["elapsed_s"] >= 0
    assert "wrote" in capsys.readouterr().out


def test_a_failed_run_exits_1_without_a_file(tmp_path, capsys):
    a = args(tmp_path, ["engine"])
    rc = probe_harness.run_chain(a, StandIn(why="the barrier gave up"), torch.device("cpu"),
                                 {"copy_bandwidth_Bps": 1e9}, "title", time.time())
    assert rc == 1 and not Path(a.out).exists()
    assert "error: engine: the barrier gave up" in capsys.readouterr().err


@pytest.mark.parametrize("argv, needle", [
    (["--out", "x.txt"], "--out"), (["--out", "x.json", "--device", "tpu"], "--device"),
    (["--out", "x.json", "--reps", "0"], "--reps"), (["--out", "x.json", "--systems", "cublas"], "--systems"),
    (["--out", "x.json", "--systems", ","], "--systems"),
])
def test_common_checks_exit_2(argv, needle, capsys):
    p = argparse.ArgumentParser()
    probe_harness.add_common(p, ("engine", "torch"))
    a = p.parse_args(argv)
    with pytest.raises(SystemExit) as e:
        probe_harness.check_common(p, a, ("engine", "torch"))
    assert e.value.code == 2 and needle in capsys.readouterr().err


def test_common_checks_split_the_systems():
    p = argparse.ArgumentParser()
    probe_harness.add_common(p, ("engine", "torch"))
    a = p.parse_args(["--out", "x.json", "--systems", "torch, engine"])
    probe_harness.check_common(p, a, ("engine", "torch"))
    assert a.systems == ["torch", "engine"] and a.device == "cuda" and a.reps == 20

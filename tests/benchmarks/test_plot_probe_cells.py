"""benchmarks/plot_probe_cells.py (issue #18's probes setting by setting) on JSON files written
here in the probes' format: the differences it prints, the plot it writes, and the refusals
before any output."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "plot_probe_cells.py"


def cell(path: Path, engine, fused, torch=100.0) -> Path:
    rows = [{"system": "engine", "us_per_layer": engine}, {"system": "fused", "us_per_layer": fused},
            {"system": "torch", "us_per_layer": torch}]
    path.write_text(json.dumps({"meta": {"commit": "abc1234"}, "rows": rows}))
    return path


def run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                          cwd=REPO, timeout=120)


def test_differences_and_plot(tmp_path):
    a = cell(tmp_path / "1-bi64.json", 78.0, 83.5)
    b = cell(tmp_path / "2-plain_s4.json", 74.5, 76.0)
    png = tmp_path / "cells.png"
    p = run(a, b, "--out", png)
    assert p.returncode == 0, p.stderr
    assert "bi64: engine 78.00 us a layer; fused 83.50 (+5.50)" in p.stdout
    assert "plain_s4: engine 74.50 us a layer; fused 76.00 (+1.50)" in p.stdout
    assert "torch" not in p.stdout  # left out unless named
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(tmp_path.glob("*.tmp*"))
    p = run(a, "--systems", "torch", "--out", png)
    assert p.returncode == 0 and "torch 100.00 (+22.00)" in p.stdout and "fused" not in p.stdout


def test_refusals_before_any_output(tmp_path):
    png = tmp_path / "x.png"
    good = cell(tmp_path / "c.json", 78.0, 80.0)
    cpu = tmp_path / "cpu.json"
    cpu.write_text(json.dumps({"rows": [{"system": "engine", "us_per_layer": None}]}))
    (tmp_path / "list.json").write_text("[1]")
    (tmp_path / "f").write_text("x")
    for args, needle in [((good, "--out", tmp_path / "x.pdf"), "--out"),
                         ((tmp_path / "missing.json", "--out", png), "no such file"),
                         # were tracebacks: AttributeError, FileExistsError after drawing
                         ((tmp_path / "list.json", "--out", png), "list.json: not a probe's JSON"),
                         ((good, "--out", tmp_path / "f" / "x.png"), "is a file, not a directory"),
                         ((cpu, "--out", png), "no 'engine' row"),
                         ((good, "--base", "launch", "--out", png), "no 'launch' row")]:
        p = run(*args)
        assert p.returncode == 2 and needle in p.stderr, (args, p.stderr)
        assert not png.exists()


def test_a_file_named_twice_is_one_cell(tmp_path):
    a = cell(tmp_path / "1-a.json", 78.0, 83.5)
    p = run(a, cell(tmp_path / "2-b.json", 74.5, 76.0), a, "--out", tmp_path / "c.png")
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("a: engine 78.00") == 1 and "b: engine 74.50" in p.stdout

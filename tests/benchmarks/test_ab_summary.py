"""benchmarks/ab_summary.py (the A/B summary of the GPU scripts, issue #18) on folders written
here: medians per (system, context, setting), the difference and ratio to the base setting,
folders without results passed over, and the refusals."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "ab_summary.py"


def process(out: Path, name: str, pair: float, full: float, L: int = 1024):
    d = out / name
    d.mkdir()
    rows = [{"section": "decode", "system": "orthros+gemv", "B": 1, "L": L, "ms_per_step": pair},
            {"section": "decode", "system": "full+gemv", "B": 1, "L": L, "ms_per_step": full},
            {"section": "targets", "target": "decode_frac_of_floor", "value": 0.9}]
    (d / "results.json").write_text(json.dumps({"meta": {}, "rows": rows}))


def run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                          cwd=REPO, timeout=60)


def test_medians_and_differences_to_the_base(tmp_path):
    process(tmp_path, "1-off", 4.2, 4.3)
    process(tmp_path, "2-new", 4.1, 4.35)
    process(tmp_path, "3-off", 4.4, 4.3)
    process(tmp_path, "4-new", 4.0, 4.25)
    (tmp_path / "5-new").mkdir()  # a process stopped by its limit: no results.json
    p = run(tmp_path, "--base", "off")
    assert p.returncode == 0, p.stderr
    out = p.stdout.splitlines()
    assert out[0] == "median ms a step by setting (processes):"
    pair_new = next(line for line in out if "orthros+gemv" in line and " new " in line)
    assert "4.050 ms (4.100, 4.000)" in pair_new and "-0.250 ms, 0.9419x off" in pair_new
    full_new = next(line for line in out if "full+gemv" in line and " new " in line)
    assert "4.300 ms (4.350, 4.250)" in full_new and "+0.000 ms, 1.0000x off" in full_new
    base = [line for line in out if " off " in line]  # the base rows, against themselves
    assert len(base) == 2 and all("+0.000 ms, 1.0000x off" in line for line in base)
    assert "4.300 ms (4.200, 4.400)" in base[1]
    assert "x none" not in run(tmp_path, "--base", "none").stdout  # no such setting: no comparison


def test_refusals(tmp_path):
    p = run(tmp_path / "missing")
    assert p.returncode == 2 and "out must be a folder" in p.stderr
    p = run(tmp_path)
    assert p.returncode == 1 and "no <i>-<setting>/results.json" in p.stderr

"""``benchmarks/attention.py``: its candidate-list refusals, before any work (the tunes themselves
need a CUDA GPU or ``--dry-run``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "attention.py"


@pytest.mark.parametrize("args, message", [
    (["--window-candidates", "base,nope"], "--window-candidates: unknown ['nope']; allowed: base, two-launch"),
    (["--window-candidates", " , "], "--window-candidates: unknown empty list"),
    (["--window-fwd-candidates", "edge 64x32,fast"], "--window-fwd-candidates: unknown ['fast']; allowed: default"),
    (["--window-bwd-only", "--window-fwd-only"], "--window-bwd-only and --window-fwd-only exclude each other"),
])
def test_bad_candidate_lists_exit_2_naming_the_argument(tmp_path, args, message):
    out = tmp_path / "tune.json"
    p = subprocess.run([sys.executable, str(SCRIPT), "--window-tune", "--json", str(out), *args],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and message in p.stderr, p.stderr
    assert not out.exists()

"""``benchmarks/attention.py``: its candidate-list refusals, before any work (the tunes themselves
need a CUDA GPU or ``--dry-run``)."""

from __future__ import annotations

import json
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


@pytest.mark.parametrize("args, message", [
    (["--only", "trian", "--dry-run"], "--only: unknown ['trian']; allowed: train, window, prefill, decode"),
    (["--json", "{f}/x.json", "--dry-run"], "--json {f}/x.json: {f} is a file, not a directory"),
    pytest.param([], "needs a CUDA GPU (--dry-run runs", marks=pytest.mark.skipif(
        __import__("torch").cuda.is_available(), reason="the refusal of a machine without CUDA")),
])
def test_bad_options_and_no_gpu_exit_2_in_one_line(tmp_path, args, message):
    """Were: an unknown --only section measured nothing and said nothing; a --json that cannot be
    written was found at the first save, after the measurements; no CUDA was an AssertionError
    traceback from torch.cuda."""
    f = tmp_path / "f"
    f.write_text("x")
    p = subprocess.run([sys.executable, str(SCRIPT), *(x.format(f=f) for x in args)], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 2 and message.format(f=f) in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_only_with_spaces_runs_the_sections_it_accepted(tmp_path):
    """Was: --only 'train, decode' was checked with its names stripped, then run with them as
    given: ' decode' matched no section, so nothing was measured (exit 0, empty results)."""
    out = tmp_path / "a.json"
    p = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--only", " decode ", "--json", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert any(k.startswith("decode_") for k in json.loads(out.read_text())["results"])

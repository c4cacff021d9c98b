"""``benchmarks/attention.py``: its candidate-list refusals, before any work (the tunes themselves
need a CUDA GPU or ``--dry-run``). The refusals run in-process (``main(argv)``: a fresh Python
costs seconds importing torch); the dry run runs the script itself (exit status, ``__main__``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from bench_script import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "attention.py"


@pytest.fixture(scope="module")
def script():
    return load_script(SCRIPT, "attention_bench_args_script")


def refused(script, capsys, argv):
    """``main(argv)`` in-process, expected to exit 2: its stderr."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        script.main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2, err
    return err


@pytest.mark.parametrize("args, message", [
    (["--window-candidates", "base,nope"], "--window-candidates: unknown ['nope']; allowed: base, two-launch"),
    (["--window-candidates", " , "], "--window-candidates: unknown empty list"),
    (["--window-fwd-candidates", "edge 64x32,fast"], "--window-fwd-candidates: unknown ['fast']; allowed: default"),
    (["--window-bwd-only", "--window-fwd-only"], "--window-bwd-only and --window-fwd-only exclude each other"),
])
def test_bad_candidate_lists_exit_2_naming_the_argument(script, capsys, tmp_path, args, message):
    out = tmp_path / "tune.json"
    assert message in refused(script, capsys, ["--window-tune", "--json", str(out), *args])
    assert not out.exists()


@pytest.mark.parametrize("args, message", [
    (["--only", "trian", "--dry-run"], "--only: unknown ['trian']; allowed: train, window, prefill, decode"),
    (["--json", "{f}/x.json", "--dry-run"], "--json {f}/x.json: {f} is a file, not a directory"),
    pytest.param([], "needs a CUDA GPU (--dry-run runs", marks=pytest.mark.skipif(
        __import__("torch").cuda.is_available(), reason="the refusal of a machine without CUDA")),
])
def test_bad_options_and_no_gpu_exit_2_in_one_line(script, capsys, tmp_path, args, message):
    """Were: an unknown --only section measured nothing and said nothing; a --json that cannot be
    written was found at the first save, after the measurements; no CUDA was an AssertionError
    traceback from torch.cuda (in-process, any exception but the usage error's exit fails the test)."""
    f = tmp_path / "f"
    f.write_text("x")
    assert message.format(f=f) in refused(script, capsys, [x.format(f=f) for x in args])


def test_only_with_spaces_runs_the_sections_it_accepted(tmp_path):
    """Was: --only 'train, decode' was checked with its names stripped, then run with them as
    given: ' decode' matched no section, so nothing was measured (exit 0, empty results)."""
    out = tmp_path / "a.json"
    p = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--only", " decode ", "--json", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert any(k.startswith("decode_") for k in json.loads(out.read_text())["results"])

"""``benchmarks/kernel_sass.py``: the window kernels compiled for sm_90 on this machine (ptxas and
cuobjdump ship in the triton wheel) and their loops counted; the band mask's claim of kernels
change 14 (docs/performance.md) checked on the SASS: fewer instructions a dK/dV trip than the
``visible`` mask, the same 20 HGMMAs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "kernel_sass.py"


def run(*args, tmp_path):
    env = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("TRITON_INTERPRET", None)
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300, env=env)


def test_band_mask_trims_the_dkdv_trip(tmp_path):
    trips = {}
    for mask in ("band", "visible"):
        out = tmp_path / f"{mask}.json"
        p = run("dkdv", "--json", str(out), *(["--visible"] if mask == "visible" else []), tmp_path=tmp_path)
        assert p.returncode == 0, p.stderr[-2000:]
        res = json.loads(out.read_text())
        inner = [lp for lp in res["loops"] if lp["inner"]]
        assert len(inner) == 1 and res["registers"] > 0, res["loops"]
        assert inner[0]["ops"]["HGMMA"] == 20  # 4 dot products of 32 x 64 tiles, head dim 128
        trips[mask] = inner[0]["instructions"]
    assert trips["band"] < 0.9 * trips["visible"], trips


@pytest.mark.parametrize("args, message", [(["dq", "--visible"], "--visible is for fwd / dkdv"),
                                           (["dkdv", "--config", "32,48,4,2"], "powers of two"),
                                           (["fwd", "--variant", "fast"], "--variant: 'fast'")])
def test_bad_arguments_exit_2(tmp_path, args, message):
    p = run(*args, tmp_path=tmp_path)
    assert p.returncode == 2 and message in p.stderr, p.stderr[-2000:]


def test_outputs_checked_before_the_compile(tmp_path):
    """Were: opened after the compile (a missing folder's FileNotFoundError traceback; --sass written in place)."""
    f = tmp_path / "f"
    f.write_text("keep")
    for opt in ("--sass", "--json"):
        p = run("fwd", opt, str(f / "out"), tmp_path=tmp_path)
        assert p.returncode == 2 and f"{opt} {f / 'out'}: {f} is a file, not a directory" in p.stderr, p.stderr[-2000:]
        assert "Traceback" not in p.stderr and not (tmp_path / "cache").exists()  # nothing compiled
    p = run("fwd", "--sass", str(tmp_path / "x"), "--json", str(tmp_path / "x"), tmp_path=tmp_path)
    assert p.returncode == 2 and "--sass and --json name one file" in p.stderr, p.stderr[-2000:]
    assert f.read_text() == "keep"

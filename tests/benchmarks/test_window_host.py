"""``benchmarks/window_host.py``: its refusals (the measurement itself needs a CUDA GPU). The
argument refusals run in-process (``main(argv)``: a fresh Python costs seconds importing torch);
the no-GPU one runs the script itself (its exit status, ``__main__``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from bench_script import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "window_host.py"


def run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)


def test_bad_arguments_exit_2_naming_the_argument(capsys):
    script = load_script(SCRIPT, "window_host_script")
    for args, message in ((["--n", "0"], "--n must be >= 1"), (["--T", "-5"], "--T must be >= 1, got -5"),
                          (["--T", "x"], "--T: invalid int value")):
        with pytest.raises(SystemExit) as e:
            script.main(args)
        err = capsys.readouterr().err
        assert e.value.code == 2 and message in err, (args, err)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_without_a_gpu_it_says_so_before_any_work(tmp_path):
    out = tmp_path / "host.json"
    p = run("--json", str(out))
    assert p.returncode == 2 and "needs a CUDA GPU" in p.stderr, p.stderr
    assert not out.exists()

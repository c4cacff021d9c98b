"""``benchmarks/window_bwd_ncu.py`` (the launches window_bwd_gpu.sh profiles): a bad config or a
machine without CUDA refused in one line, exit 2 (were: a ValueError traceback, torch's
AssertionError "Torch not compiled with CUDA enabled"). Each refusal through the script's
``main`` in this process; the command itself (exit code, stderr without a traceback) once."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from bench_script import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "window_bwd_ncu.py"


@pytest.mark.parametrize("args, says", [
    (["{bad"], "config '{bad': not JSON"),
    (["{}", "extra"], "unrecognized arguments: extra"),
    pytest.param([], "needs a CUDA GPU", marks=pytest.mark.skipif(torch.cuda.is_available(),
                                                                 reason="the refusal of a machine without CUDA")),
])
def test_refused_in_one_line(args, says, capsys):
    with pytest.raises(SystemExit) as e:  # any other exception (a traceback's) fails the test
        load_script(SCRIPT, "window_bwd_ncu_script").main(args)
    err = capsys.readouterr().err
    assert e.value.code == 2 and says in err.strip().splitlines()[-1], err[-2000:]


def test_the_command_refuses_in_one_line():
    p = subprocess.run([sys.executable, str(SCRIPT), "{bad"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and "config '{bad': not JSON" in p.stderr and "Traceback" not in p.stderr, p.stderr[-2000:]

"""``benchmarks/window_bwd_ncu.py`` (the launches window_bwd_gpu.sh profiles): a bad config or a
machine without CUDA refused in one line, exit 2 (were: a ValueError traceback, torch's
AssertionError "Torch not compiled with CUDA enabled")."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "window_bwd_ncu.py"


def _run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("args, says", [
    (["{bad"], "config '{bad': not JSON"),
    (["{}", "extra"], "unrecognized arguments: extra"),
    pytest.param([], "needs a CUDA GPU", marks=pytest.mark.skipif(torch.cuda.is_available(),
                                                                 reason="the refusal of a machine without CUDA")),
])
def test_refused_in_one_line(args, says):
    p = _run(*args)
    assert p.returncode == 2 and says in p.stderr and "Traceback" not in p.stderr, p.stderr[-2000:]

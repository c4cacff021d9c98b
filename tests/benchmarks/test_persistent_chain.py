"""benchmarks/persistent_chain.py (the probe of inference change 30, issue #18) on the CPU: the
whole command through the Triton interpreter (one program, so its grid barriers pass at once),
each system's chain against F.linear's, the JSON it writes, and the refusals of bad arguments
(exit 2, naming the argument, before any work or file)."""

from __future__ import annotations

import json
import os
import sys

import pytest
from probe_runs import BENCH, refused, run_changed, run_cpu, run_gpu
from probe_runs import run as run_script

SCRIPT = BENCH / "persistent_chain.py"
sys.path.insert(0, str(BENCH))

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from persistent_chain import chain_sites, prefetch_lines  # noqa: E402
from persistent_chain_kernel import _grid_sync  # noqa: E402


@triton.jit
def _wait_for(BAR, ERR, target, POLLS_: tl.constexpr):
    _grid_sync(BAR, ERR, target, POLLS_)


def run(*args, timeout=300):
    return run_script(SCRIPT, *args, timeout=timeout)


@pytest.mark.parametrize("form", [(), ("--defer",), ("--defer", "--hold", "1")], ids=["per-step-sum", "defer", "hold"])
def test_cpu_run_every_system_matches_torch(tmp_path, form):
    out = tmp_path / "chain.json"
    run_cpu("persistent_chain", "--layers", "3", *form, "--out", out)
    data = json.loads(out.read_text())
    rows = {r["system"]: r for r in data["rows"]}
    assert set(rows) == {"engine", "launch", "persistent", "torch"}
    for r in rows.values():  # the chain through 12 GEMVs, every output rounded to bf16 as F.linear does
        assert r["rel_err_vs_torch"] < 1e-2, r
    assert data["meta"]["layers"] == 3 and data["meta"]["programs"] == 1
    assert data["meta"]["prefetch_lines"] == {"PF_QKV": 0, "PF_O": 0, "PF_GU": 0, "PF_D": 0}  # no PTX hint here
    assert not list(tmp_path.glob("*.tmp*"))


def test_cpu_run_catches_a_wrong_chain(tmp_path):
    """The check can fail: the kernel run with the down GEMV's input taken from the wrong half of
    gate/up's output (one line of the kernel module changed, in a copy) is far from F.linear's."""
    rows = run_changed(tmp_path, "persistent_chain", "X = Y3 + layer * 2 * 2 * INTER\n",
                       "X = Y3 + layer * 2 * 2 * INTER + INTER\n", "--systems", "persistent")
    assert rows["persistent"]["rel_err_vs_torch"] > 0.3


@pytest.mark.parametrize("args, needle", [
    (("--device", "cpu", "--programs", "2"), "--programs"),
    (("--device", "cpu", "--block-n", "12"), "--block-n"),
    (("--device", "cpu", "--block-k", "128"), "--block-k must divide"),
    (("--device", "cpu", "--stages", "0"), "--stages"),
    (("--device", "cpu", "--systems", "engine,cublas"), "--systems"),
    (("--device", "cpu", "--layers", "0"), "--layers"),
    (("--device", "cpu", "--prefetch-mb", "-1"), "--prefetch-mb"),
    (("--device", "cpu", "--hold", "1"), "--hold needs --defer"),
    (("--device", "cpu", "--defer", "--hold", "2"), "--hold must be below"),
    (("--device", "cpu", "--defer", "--hold", "3"), "--hold"),
    (("--device", "tpu"), "--device"),
    (("--programs", "100",), "--programs x --block-n"),
])
def test_bad_arguments_exit_2_before_any_file(tmp_path, args, needle):
    assert needle in refused(SCRIPT, tmp_path, *args)


def test_out_must_be_a_json_path(tmp_path):
    p = run("--device", "cpu", "--out", str(tmp_path), timeout=60)
    assert p.returncode == 2 and "--out" in p.stderr


def test_prefetch_lines_fit_the_budget():
    for _, n, k in chain_sites(4096, 6144, 12288):
        for mb in (1, 4, 16):
            budget = mb * 2 ** 20
            lines = prefetch_lines(n, k, budget)
            if n * 128 > budget:  # not one line a row fits (gate/up's 24576 rows at 1 MB)
                assert lines == 0
                continue
            assert lines & (lines - 1) == 0 and n * lines * 128 <= budget and lines * 128 <= k * 2
            assert n * 2 * lines * 128 > budget or lines * 128 == k * 2  # the largest power of two that fits
    assert prefetch_lines(151936, 4096, 4 * 2 ** 20) == 0  # not one line a row fits
    assert prefetch_lines(4096, 4096, 0) == 0


@pytest.mark.gpu
@pytest.mark.parametrize("form", [(), ("--defer",), ("--defer", "--programs", "256", "--block-n", "8"),
                                  ("--defer", "--hold", "4")],
                         ids=["per-step-sum", "defer", "defer-256-programs", "hold"])
def test_gpu_run_every_system_matches_torch(tmp_path, form):
    """Compiled, every program resident at once (128, or 256 of 8-row tiles): the grid barriers
    order the GEMVs (a missing or early barrier reads a half-written input; the buffers are
    zeroed before each system's check)."""
    run_gpu(tmp_path, "persistent_chain", *form, tol=1e-2)


def test_grid_sync_gives_up_and_flags_when_programs_are_missing():
    """The barrier's failure path, through the interpreter: one program waiting for three arrivals
    gives up after its polls, flags ERR, and has counted its own arrival."""
    torch = pytest.importorskip("torch")
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the CPU form of this check runs in the Triton interpreter")
    bar = torch.zeros(1, dtype=torch.int32)
    err = torch.zeros(1, dtype=torch.int32)
    _wait_for[(1,)](bar, err, 1, POLLS_=4)
    assert bar.item() == 1 and err.item() == 0  # its own arrival is all it waits for
    _wait_for[(1,)](bar, err, 3, POLLS_=4)
    assert bar.item() == 2 and err.item() == 1

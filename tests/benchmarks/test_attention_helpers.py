"""``benchmarks/attention.py``'s helpers that run without a GPU: the pinned-threads context
(``same_cpu``) and the dS pass's launch override of ``kernel_overrides``."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "attention.py"


@pytest.fixture()
def bench(monkeypatch):
    spec = importlib.util.spec_from_file_location("orthros_bench_attention", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setattr(sys, "argv", ["attention.py"])  # the module reads --dry-run from argv
    spec.loader.exec_module(mod)
    monkeypatch.setattr(mod, "DEV", "cpu")
    monkeypatch.setattr(mod, "DRY", False)
    return mod


needs_affinity = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no sched_setaffinity here")


@needs_affinity
@pytest.mark.parametrize("apart", [False, True])
def test_same_cpu_pins_this_thread_and_gives_its_cpus_back(bench, apart):
    keep = os.sched_getaffinity(0)
    if apart and len(keep) < 2:
        pytest.skip("one CPU: nothing to hold apart")
    with bench.same_cpu(apart) as where:
        main, worker = where
        assert os.sched_getaffinity(0) == {main}
        assert main in keep and worker in keep
        assert (worker != main) == apart
    assert os.sched_getaffinity(0) == keep


@needs_affinity
def test_same_cpu_gives_the_cpus_back_after_an_error(bench):
    keep = os.sched_getaffinity(0)
    with pytest.raises(RuntimeError, match="inside"):
        with bench.same_cpu():
            raise RuntimeError("inside")
    assert os.sched_getaffinity(0) == keep


def test_same_cpu_is_a_no_op_in_a_dry_run(bench, monkeypatch):
    monkeypatch.setattr(bench, "DRY", True)
    keep = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    with bench.same_cpu() as where:
        assert where is None
        if keep is not None:
            assert os.sched_getaffinity(0) == keep


def test_kernel_overrides_sets_and_restores_the_ds_pass_launch(bench):
    from orthros.ops.triton import attention as ta

    before, dq = ta.DQ_DS_LAUNCH, ta.DQ_VARIANT
    with bench.kernel_overrides({"dq_ds": (8, 4)}, dq_variant="ds"):
        assert ta.DQ_DS_LAUNCH == (8, 4) and ta.DQ_VARIANT == "ds"
    assert ta.DQ_DS_LAUNCH == before and ta.DQ_VARIANT == dq


def test_bench_steady_pinned_in_a_dry_run_times_once_unpinned(bench, monkeypatch):
    monkeypatch.setattr(bench, "DRY", True)
    calls = []
    free, pinned = bench.bench_steady_pinned(lambda: calls.append(1))
    assert free >= 0 and pinned is None and calls == [1]

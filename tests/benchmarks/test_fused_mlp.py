"""benchmarks/fused_mlp.py (the probe of inference change 32, issue #18) on the CPU: the whole
command through the Triton interpreter, each system's MLP chain against torch's, a check that
fails when the kernel is wrong, the JSON it writes, and the refusals of bad arguments (exit 2,
naming the argument, before any work or file)."""

from __future__ import annotations

import json

import pytest
from probe_runs import BENCH, refused, run_changed, run_cpu, run_gpu
from probe_runs import run as run_script

SCRIPT = BENCH / "fused_mlp.py"


def run(*args, timeout=300):
    return run_script(SCRIPT, *args, timeout=timeout)


@pytest.mark.parametrize("form", [(), ("--plain",), ("--stack",)], ids=["chain", "plain", "stack"])
def test_cpu_run_every_system_matches_torch(tmp_path, form):
    out = tmp_path / "mlp.json"
    run_cpu("fused_mlp", *form, "--out", out)
    data = json.loads(out.read_text())
    rows = {r["system"]: r for r in data["rows"]}
    assert set(rows) == {"engine", "fused", "torch"}
    for r in rows.values():  # three layers; the late norm rounds apart from torch by ~1e-2
        assert r["rel_err_vs_torch"] < 2e-2, r
    meta = data["meta"]
    assert meta["layers"] == 3 and meta["programs"] == 4 and meta["prefetch_lines"] == 0  # no PTX hint here
    assert not list(tmp_path.glob("*.tmp*"))


@pytest.mark.parametrize("old, new, args", [
    ("+ r.to(tl.float32), dt, EMU_RNE)", ", dt, EMU_RNE)", ()),  # the fold without the residual
    ("u_rows = WGU + (INTER + offs_i)", "u_rows = WGU + offs_i", ()),  # up read from gate's rows
    ("d_rows = WDT + offs_i[:, None] * H", "d_rows = WDT + (offs_i[:, None] // 2) * H", ()),  # down's wrong rows
    ("ssq_t += xf * xf", "ssq_t += 4 * xf * xf", ()),  # the norm off by a factor of two
    ("j = (j + pid) % T", "j = (j + pid) % (T - 1)", ()),  # a column tile skipped, another added twice
    ("acc_g, acc_u = tl.split(", "acc_u, acc_g = tl.split(", ("--stack",)),  # the stacked tile split the wrong way
], ids=["no-residual", "up-rows", "down-rows", "norm", "rotation", "stack-split"])
def test_cpu_run_catches_a_wrong_kernel(tmp_path, old, new, args):
    """The check can fail: the kernel module with one line changed (in a copy) is far from torch."""
    assert run_changed(tmp_path, "fused_mlp", old, new, "--systems", "fused", *args)["fused"]["rel_err_vs_torch"] > 0.1


@pytest.mark.parametrize("args, needle", [
    (("--device", "cpu", "--block-i", "24"), "--block-i"),
    (("--device", "cpu", "--block-i", "256"), "--block-i must divide"),
    (("--device", "cpu", "--block-k", "8"), "--block-k"),
    (("--device", "cpu", "--block-n", "128"), "--block-n must divide"),
    (("--device", "cpu", "--stages", "9"), "--stages"),
    (("--device", "cpu", "--prefetch-lines", "3"), "--prefetch-lines"),
    (("--device", "cpu", "--prefetch-lines", "2"), "--prefetch-lines x 64"),
    (("--device", "cpu", "--systems", "engine,cublas"), "--systems"),
    (("--device", "cpu", "--layers", "0"), "--layers"),
    (("--device", "cpu", "--reps", "0"), "--reps"),
    (("--device", "tpu"), "--device"),
])
def test_bad_arguments_exit_2_before_any_file(tmp_path, args, needle):
    assert needle in refused(SCRIPT, tmp_path, *args)


def test_out_must_be_a_json_path(tmp_path):
    p = run("--device", "cpu", "--out", str(tmp_path), timeout=60)
    assert p.returncode == 2 and "--out" in p.stderr


@pytest.mark.gpu
@pytest.mark.parametrize("form", [(), ("--block-i", "64", "--block-k", "64"), ("--plain", "--block-i", "64"),
                                  ("--stack", "--block-k", "64")], ids=["default", "bi64", "plain", "stack"])
def test_gpu_run_every_system_matches_torch(tmp_path, form):
    """Compiled, with the atomics of 384 (192) programs into each layer's accumulator and the fold
    in the next layer's kernel (an accumulator not zeroed, or a fold that reads a half-written
    one, is far from torch)."""
    run_gpu(tmp_path, "fused_mlp", *form, tol=2e-2)

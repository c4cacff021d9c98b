"""benchmarks/gemv.py (the GEMV vs cuBLAS micro-benchmark, issue #18) in its CPU smoke mode:
the whole command at interpreter sizes, the JSON it writes (atomically), and the refusals of
bad arguments (exit 2, naming the argument, before any work or file). The runs call the
script's ``main`` in this process; the command itself runs once (a refusal's exit code)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from bench_script import load_script

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "gemv.py"


def run(*args, timeout=300):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=REPO)


def test_quick_cpu_run_writes_every_row(tmp_path, capsys):
    out = tmp_path / "sub" / "gemv.json"
    out.parent.mkdir()
    assert _bench().main(["--device", "cpu", "--quick", "--sweep", "--shapes", "o,down", "--m", "1,3", "--reps", "1",
                          "--out", str(out)]) == 0
    stdout = capsys.readouterr().out
    data = json.loads(out.read_text())
    assert [f.name for f in out.parent.iterdir()] == ["gemv.json"]  # no temporary left behind
    meta, rows = data["meta"], data["rows"]
    for key in ("date", "device", "commit", "torch", "triton", "copy_bandwidth_Bps"):
        assert key in meta
    assert meta["copy_bandwidth_Bps"] > 0 and meta["quick"] and meta["sweep"]
    want = {(s, m, sys_) for s in ("o", "down") for m in (1, 3) for sys_ in ("cublas", "triton", "triton-best")}
    assert {(r["shape"], r["M"], r["system"]) for r in rows} == want
    by = {(r["shape"], r["M"], r["system"]): r for r in rows}
    for r in rows:
        assert r["rel_err"] < 1e-2, r  # bf16 outputs against the fp32 reference
        assert r["weight_bytes"] == r["N"] * r["K"] * 2
        assert abs(r["weight_GBps"] * 1e3 * r["us"] - r["weight_bytes"]) < 1e-6 * r["weight_bytes"]
        if r["system"] != "cublas":
            cub = by[(r["shape"], r["M"], "cublas")]
            assert abs(r["speedup_vs_cublas"] - cub["us"] / r["us"]) < 1e-9 * r["speedup_vs_cublas"]
            assert set(r["config"]) == {"block_n", "block_k", "split", "dot", "defer", "num_warps", "num_stages"}
        if r["system"] == "triton-best":  # the best of the configs the sweep timed
            assert len(r["sweep"]) == 3 and r["us"] == min(c["us"] for c in r["sweep"])  # fma, dot, defer
            assert [c["defer"] for c in r["sweep"]] == [False, False, True]
            assert all(c["rel_err"] < 1e-2 for c in r["sweep"])
    assert "wrong_results" not in meta
    assert "GEMV: one call" in stdout and "triton-best" in stdout


def test_fused_dry_run_times_every_system_per_site(tmp_path, capsys):
    """--fused --dry-run: per site and M, the five systems in one run, each right against the
    specification (with its residual / prologue), and the layer sums only where all four ran."""
    out = tmp_path / "gf.json"
    assert _bench().main(["--fused", "--dry-run", "--sweep", "--sites", "norm_qkv,silu_down_res", "--m", "2", "--reps",
                          "1", "--out", str(out)]) == 0
    stdout = capsys.readouterr().out
    data = json.loads(out.read_text())
    meta, rows = data["meta"], data["rows"]
    assert meta["fused"] and meta["quick"] and meta["compile_backend"] == "aot_eager" and "wrong_results" not in meta
    want = {(s, 2, sys_) for s in ("norm_qkv", "silu_down_res")
            for sys_ in ("cublas", "triton-plain", "unfused-eager", "unfused-compiled", "fused", "fused-best")}
    assert {(r["site"], r["M"], r["system"]) for r in rows} == want
    by = {(r["site"], r["system"]): r for r in rows}
    for r in rows:
        assert r["rel_err"] < 1e-2 and r["us"] > 0, r
        comp = by[(r["site"], "unfused-compiled")]["us"]
        assert abs(r["speedup_vs_unfused_compiled"] - comp / r["us"]) < 1e-9 * r["speedup_vs_unfused_compiled"]
    assert by[("norm_qkv", "fused")]["prologue"] == "norm" and not by[("norm_qkv", "fused")]["residual"]
    assert by[("silu_down_res", "fused")]["prologue"] == "silu" and by[("silu_down_res", "fused")]["residual"]
    assert by[("silu_down_res", "fused")]["K"] == 300  # the weight's K (x is [M, 2K])
    for site in ("norm_qkv", "silu_down_res"):  # --sweep: the best of the fused call's candidates
        best = by[(site, "fused-best")]
        assert len(best["sweep"]) == 2 and best["us"] == min(c["us"] for c in best["sweep"])
        assert best["prologue"] == by[(site, "fused")]["prologue"] and all(c["rel_err"] < 1e-2 for c in best["sweep"])
    assert meta["layer_us"] == {}  # two of the four sites: no per-layer sum
    assert "Fused GEMV sites" in stdout
    # the winners as CONFIGS rows, one class per site's weight, for roofline.py --gemv-configs
    from orthros.ops.gemv.kernel import GemvConfig, rows_from_json

    tuned = rows_from_json(meta["tuned_rows"])
    assert [(m, n) for m, n, _, _ in tuned] == [(2, 48), (2, 96)]  # silu_down_res (48 x 300), norm_qkv (96 x 200)
    assert tuned[0][3] == GemvConfig(**by[("silu_down_res", "fused-best")]["config"])
    assert tuned[1][3] == GemvConfig(**by[("norm_qkv", "fused-best")]["config"])
    assert "as CONFIGS rows" in stdout and "(2, 48, 4611686018427387904, GemvConfig(" in stdout


def _bench():
    """benchmarks/gemv.py as a module (a script, not a package)."""
    return load_script(SCRIPT, "gemv_bench")


BAD_ARGS = [
    (["--device", "cpu"], "--device cpu needs --quick"),
    (["--device", "tpu", "--quick"], "--device must be cuda"),
    (["--shapes", "qkv,mlp"], "--shapes must be a comma-separated subset"),
    (["--m", "1,9"], "--m must be comma-separated integers in 1..8"),
    (["--m", "one"], "--m must be comma-separated integers"),
    (["--dtype", "int8"], "--dtype must be one of bf16, fp16, fp32"),
    (["--reps", "0"], "--reps must be >= 1"),
    (["--deadline-s", "-1"], "--deadline-s must be > 0"),
    (["--out", "results.txt"], "--out must be a .json file path"),
    (["--fused", "--sites", "norm_qkv,mlp"], "--sites must be a comma-separated subset of norm_qkv,o_res"),
    (["--device", "cuda:x"], "--device must be cuda, cuda:N or cpu, got 'cuda:x'"),  # was torch's RuntimeError
    (["--quick", "--out", f"{SCRIPT}/g.json"], f"--out {SCRIPT}/g.json: {SCRIPT} is a file"),  # was at the 1st save
]


def test_bad_arguments_exit_2_from_the_command(tmp_path):
    p = run("--m", "1,9", "--out", str(tmp_path / "g.json"), timeout=60)
    assert p.returncode == 2 and "--m must be comma-separated integers in 1..8" in p.stderr
    assert list(tmp_path.iterdir()) == []  # nothing written


@pytest.mark.parametrize("args,message", BAD_ARGS, ids=[m for _, m in BAD_ARGS])
def test_bad_arguments_refused_before_work(tmp_path, capsys, args, message):
    if "--out" not in args:
        args = [*args, "--out", str(tmp_path / "g.json")]
    with pytest.raises(SystemExit) as e:
        _bench().main(args)  # parse_args is main's first step: nothing measured, nothing written
    assert e.value.code == 2
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_a_wrong_config_is_never_the_best(tmp_path, monkeypatch):
    """In-process run with the dot form and the table's config made wrong: the sweep refuses the
    dot config, and the table row is flagged in the metadata."""
    from orthros.ops.gemv import kernel

    bench = _bench()
    real = kernel.gemv_triton
    table = kernel.pick_config(2, 64, 64)  # --quick's "o" is 64 x 64

    def broken(x, w, bias=None, *, config=None):
        y = real(x, w, bias, config=config)
        return -y if config is not None and (config.dot or config == table) else y

    monkeypatch.setattr(kernel, "gemv_triton", broken)
    out = tmp_path / "g.json"
    assert bench.main(["--device", "cpu", "--quick", "--sweep", "--shapes", "o", "--m", "2", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["meta"]["wrong_results"] == ["triton o M=2"]
    best = next(r for r in data["rows"] if r["system"] == "triton-best")
    dot = [c for c in best["sweep"] if c["dot"]]
    assert len(dot) == 1 and "wrong result" in dot[0]["error"] and not best["config"]["dot"]
    assert best["rel_err"] < 1e-2


def test_cuda_without_a_gpu_is_refused(tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert _bench().main(["--out", str(tmp_path / "g.json")]) == 2
    assert "no CUDA device" in capsys.readouterr().err and list(tmp_path.iterdir()) == []


def test_a_wrong_fused_result_is_flagged(tmp_path, monkeypatch):
    """In-process --fused run with the kernel's residual add dropped: the fused row of o_res is
    flagged, the plain rows (no residual) are not, and the layer sums cover all four sites."""
    from orthros.ops.gemv import kernel

    bench = _bench()
    real = kernel.gemv_triton

    def broken(x, w, bias=None, *, residual=None, **kw):
        return real(x, w, bias, **kw)  # drops the residual

    monkeypatch.setattr(kernel, "gemv_triton", broken)
    out = tmp_path / "g.json"
    assert bench.main(["--fused", "--dry-run", "--m", "1", "--reps", "1", "--out", str(out)]) == 0
    meta = json.loads(out.read_text())["meta"]
    assert meta["wrong_results"] == ["fused o_res M=1", "fused silu_down_res M=1", "chain-fused M=1"]
    chain = [r for r in json.loads(out.read_text())["rows"] if r["site"] == "layer_chain"]
    assert [r["system"] for r in chain] == ["chain-unfused-compiled", "chain-fused"]
    assert chain[0]["rel_err"] < 1e-2 and chain[1]["rel_err"] > 1e-2  # the unfused chain is right
    assert set(meta["layer_us"]["1"]) == {"cublas", "triton-plain", "unfused-eager", "unfused-compiled", "fused"}


def test_full_sweeps_time_the_tensor_core_form_deeper_than_three():
    """The full sweeps (not ``--quick``) hold the M = 2 table's tensor-core tiles at depths 4-6
    besides every config at depth 3, with no config twice (docs/performance.md, inference
    change 29)."""
    mod = _bench()
    deep = mod.dot_depth_configs()
    assert deep and all(c.dot and c.num_stages >= 4 for c in deep)
    assert {(c.block_n, c.block_k, c.split) for c in deep} == {(64, 256, 1), (64, 128, 1), (64, 128, 4)}
    peer = mod.peer_tile_configs()  # gpt-fast's tile family (inference change 40): thin, long, deferred
    assert peer and all(c.defer and c.block_n <= 8 and c.block_k >= 1024 for c in peer)
    for configs in (mod.sweep_configs(False), mod.fused_sweep_configs(False)):
        assert all(c in configs for c in deep + peer) and len(set(configs)) == len(configs)


def test_a_repeated_list_value_is_measured_once():
    """Was: --m 1,1 timed M=1 twice (two rows of one key); --shapes and --sites likewise kept each repeat."""
    a = _bench().parse_args(["--quick", "--device", "cpu", "--m", "1,2,1", "--shapes", "o,qkv,o", "--sites",
                             "o_res,o_res", "--out", "g.json"])
    assert a.m == [1, 2] and a.shapes == ["o", "qkv"] and a.sites == ["o_res"]

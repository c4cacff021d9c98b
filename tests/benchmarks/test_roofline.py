"""Issue #18's roofline sweep (benchmarks/roofline.py) on the CPU: the whole command with tiny
shapes (Triton interpreter for the window stream, a stand-in with gpt-fast's model.py
interface for the peer), the floors against hand-computed values, and the refusals."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import engine_compiles_with, tiny_model  # at import: tests/serving's conftest takes the name later in a full run
from bench_script import load_script
from gpt_fast_stand_in import write_stand_in

from orthros.benchmarks import roofline as R
from orthros.benchmarks.inference import bench_decode
from orthros.benchmarks.models import TINY

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "roofline.py"

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def gpt_fast_dir(tmp_path):
    return write_stand_in(tmp_path)


def _run_script(*args, timeout=300):
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=REPO, env=env,
                          timeout=timeout)


# ------------------------------------------------------------------ floors by hand
def test_window_tiles_and_floor_by_hand():
    # T = 128, w = 128, 64 x 64 tiles. Forward / dQ: query block 0 sees key block 0, block 1
    # sees blocks 0-1: 3 tiles per head. dK/dV: key block 0 is seen by query blocks 0-1,
    # key block 1 by query block 1: 3 tiles per query head.
    assert R.query_block_tiles(128, 128, 64, 64) == 3
    assert R.key_block_tiles(128, 128, 64, 64) == 3
    # T = 256: query blocks see 1, 2, 3, 3 key blocks; key blocks are seen by 3, 3, 2, 1 query blocks
    assert R.query_block_tiles(256, 128, 64, 64) == 1 + 2 + 3 + 3
    assert R.key_block_tiles(256, 128, 64, 64) == 3 + 3 + 2 + 1
    blocks = {"win_fwd": (64, 64), "bwd_dq": (64, 64), "bwd_dkdv": (64, 64)}
    Hq, Hkv, D, e = 4, 2, 16, 2
    f = R.window_floor(128, Hq=Hq, Hkv=Hkv, D=D, window=128, elem_bytes=e, bandwidth=1e9, flops_per_s=1e9,
                       blocks=blocks)
    assert f["fwd_flops"] == Hq * 3 * 4 * 64 * 64 * D
    assert f["fb_flops"] == f["fwd_flops"] + Hq * 3 * 6 * 64 * 64 * D + Hq * 3 * 8 * 64 * 64 * D
    q, kv = 128 * Hq * D * e, 128 * Hkv * D * e
    assert f["fwd_bytes"] == 2 * q + 2 * kv + 128 * Hq * 4  # q, k, v in; o, lse out
    assert f["fb_bytes"] - f["fwd_bytes"] == 5 * q + 4 * kv + 3 * 128 * Hq * 4
    assert f["fwd_floor_ms"] == pytest.approx(1000 * max(f["fwd_bytes"], f["fwd_flops"]) / 1e9)
    assert f["fwd_bound"] == "compute"  # 1 FLOP per byte/s-second here: FLOPs win


@pytest.mark.parametrize("T, w, bm, bn", [(63, 8, 16, 16), (300, 128, 64, 64), (1000, 100, 32, 64),
                                         (4096, 128, 64, 32)])
def test_visited_tiles_cover_every_visible_pair(T, w, bm, bn):
    # every (query, key) pair with 0 <= q - k < w must lie in a visited tile, and the tiles hold
    # at most (block span / window) times the visible pairs
    visible = sum(min(q + 1, w) for q in range(T))
    assert R.query_block_tiles(T, w, bm, bn) * bm * bn >= visible
    assert R.key_block_tiles(T, w, bm, bn) * bm * bn >= visible
    assert R.query_block_tiles(T, w, bm, bn) * bm * bn <= visible * (bm + w + bn) / w + bm * bn


def test_decode_floor_bytes_on_the_tiny_shape():
    cfg = R.orthros_model("tiny", device="meta", dtype=torch.float32).config
    # K and V, 2 layers, 2 KV heads, head_dim 16, fp32
    assert R.kv_bytes_per_token(cfg, torch.float32) == 2 * TINY["num_hidden_layers"] * 2 * 16 * 4 == 512
    assert R.kv_bytes_per_token(cfg, torch.bfloat16) == 256
    assert R.decode_floor_ms(10**9, 512, 2, 1000, 2e9) == pytest.approx(1000 * (10**9 + 2 * 1000 * 512) / 2e9)


def test_gpt_fast_loader_and_shape(gpt_fast_dir):
    mod = R.load_gpt_fast(str(gpt_fast_dir))
    assert mod.UPSTREAM == "stand-in for the test"
    cfg = R.orthros_model("tiny", device="meta", dtype=torch.float32).config
    args, notes = R.gpt_fast_args(mod, cfg, 512)
    assert (args.dim, args.n_layer, args.n_head, args.n_local_heads, args.head_dim, args.vocab_size) == \
        (64, 2, 4, 2, 16, 512)
    assert any("qk-norm" in n for n in notes)
    cfg.head_dim = 32  # gpt-fast derives head_dim = dim // n_head: no peer of this shape
    with pytest.raises(ValueError, match="head_dim"):
        R.gpt_fast_args(mod, cfg, 512)


# ------------------------------------------------------------------ the whole command
def test_quick_cpu_sweep_writes_consistent_json_and_plot(tmp_path, gpt_fast_dir, capsys):
    """The whole command, in-process with the script's window timing (a fresh Python costs seconds
    importing torch; test_gpt_fast_dir_without_model_py_and_script_exit_code runs the script itself)."""
    out = tmp_path / "out"
    script = load_script(SCRIPT, "orthros_roofline_script")
    assert R.main(["--device", "cpu", "--quick", "--gpt-fast-dir", str(gpt_fast_dir), "--out", str(out),
                   "--window-lengths", "8192"], window_factory=script.window_factory) == 0
    stdout = capsys.readouterr().out
    data = json.loads((out / "results.json").read_text())
    meta, rows = data["meta"], data["rows"]
    assert meta["issue"] == 18 and meta["device"] and meta["date"] and "commit" in meta and meta["torch"]
    assert meta["gpt_fast"]["upstream"] == "stand-in for the test"
    assert meta["kv_bytes_per_token"] == 512 and meta["copy_bw_tb_s"] > 0 and meta["matmul_tflop_s"] > 0
    assert meta["read_bw_how"] == "torch.sum" and meta["read_bw_candidates"] == {"torch.sum": meta["read_bw_tb_s"]}
    read_bw = meta["read_bw_tb_s"] * 1e12
    assert meta["fuse"] is True  # the engine's default: fused projections
    bw = meta["copy_bw_tb_s"] * 1e12
    dec = [r for r in rows if r["section"] in ("decode", "batched")]
    cells = {(r["section"], r["system"], r["B"], r["L"]) for r in dec}
    # gpt-fast at B=1 only at the smallest context (the target's; --gpt-fast-contexts), in every batched cell
    assert meta["gpt_fast"]["b1_contexts"] == [min(R.QUICK["contexts"])]
    want = {("decode", s, 1, L) for s in ("orthros", "full") for L in R.QUICK["contexts"]} | \
        {("decode", "gpt-fast", 1, min(R.QUICK["contexts"]))} | \
        {("batched", s, B, L) for s in ("orthros", "full", "gpt-fast") for B in R.QUICK["batch_sizes"]
         for L in R.QUICK["batched_contexts"]}
    assert cells == want
    for r in dec:
        assert "skipped" not in r and r["ms_per_step"] > 0
        assert r["kv_bytes"] == r["B"] * r["L"] * 512
        assert r["floor_ms"] == pytest.approx(1000 * (meta["weight_bytes_per_step"] + r["kv_bytes"]) / bw)
        assert r["frac_of_floor"] == pytest.approx(r["floor_ms"] / r["ms_per_step"])
        assert r["read_floor_ms"] == pytest.approx(1000 * (meta["weight_bytes_per_step"] + r["kv_bytes"]) / read_bw)
        assert r["frac_of_read_floor"] == pytest.approx(r["read_floor_ms"] / r["ms_per_step"])
        assert r["tokens_per_s"] == pytest.approx(1000 * r["B"] / r["ms_per_step"], rel=1e-6)
    win = [r for r in rows if r["section"] == "window"]
    assert {r["pass"] for r in win} == {"fwd", "fwd+bwd", "fwd+bwd graph"}
    for r in win:
        s = r["shape"]
        assert (s["T"], s["Hq"], s["Hkv"], s["D"], s["window"]) == (32, 4, 1, 32, 128)  # attention.py's dry run
        fl = R.window_floor(s["T"], Hq=s["Hq"], Hkv=s["Hkv"], D=s["D"], window=s["window"],
                            elem_bytes=s["elem_bytes"], bandwidth=bw, flops_per_s=meta["matmul_tflop_s"] * 1e12)
        key = "fwd" if r["pass"] == "fwd" else "fb"
        assert r["floor_ms"] == pytest.approx(fl[f"{key}_floor_ms"]) and r["bytes"] == fl[f"{key}_bytes"]
        assert r["orthros_ms"] > 0 and r["frac_of_floor"] == pytest.approx(r["floor_ms"] / r["orthros_ms"])
        assert r["flex_ms"] is None  # no Flex on the CPU
    assert (out / "roofline.png").stat().st_size > 10000
    assert not list(out.glob("*.tmp*"))
    summary = {(s["target"], s["point"]) for s in meta["summary"]}
    assert ("batched_vs_full", "B=2 L=64") in summary and ("decode_vs_gpt_fast", "B=1 L=64") in summary
    assert "targets" in stdout and "wrote" in stdout

    # --plot-only redraws from the JSON (and prints the tables), measuring nothing
    again = tmp_path / "again"
    assert R.main(["--plot-only", str(out / "results.json"), "--out", str(again)]) == 0
    assert (again / "roofline.png").stat().st_size > 10000


def test_deadline_skips_the_rest_and_still_writes(tmp_path, capsys):
    out = tmp_path / "late"
    assert R.main(["--device", "cpu", "--quick", "--sections", "batched,decode", "--deadline-s", "1e-9",
                   "--out", str(out)]) == 0
    data = json.loads((out / "results.json").read_text())
    rows = data["rows"]
    assert rows and all(r["skipped"] == "deadline" for r in rows)
    assert [r["section"] for r in rows][0] == "batched"  # the order given
    assert {r["system"] for r in rows} == {"orthros", "full"}  # no --gpt-fast-dir: no gpt-fast rows
    assert "no --gpt-fast-dir" in data["meta"]["gpt_fast"] and "gpt-fast rows are skipped" in capsys.readouterr().out
    assert (out / "roofline.png").exists()


def test_gpt_fast_contexts_all_and_list(tmp_path):
    base = ["--device", "cpu", "--quick", "--out", str(tmp_path / "o")]
    assert R.parse_args([*base, "--gpt-fast-contexts", "all"]).gpt_fast_contexts == R.QUICK["contexts"]
    assert R.parse_args([*base, "--gpt-fast-contexts", "256"]).gpt_fast_contexts == [256]


@pytest.mark.parametrize("args, message", [
    (["--sections", "decode,prefill"], "--sections"),
    (["--sections", "decode,decode"], "--sections"),
    (["--contexts", "1024,0"], "--contexts"),
    (["--batch-sizes", "-8"], "--batch-sizes"),
    (["--steps", "0"], "--steps"),
    (["--deadline-s", "-5"], "--deadline-s"),
    (["--window-reserve-s", "60"], "--window-reserve-s"),
    (["--gpt-fast-dir", "/nonexistent/gpt-fast"], "--gpt-fast-dir"),
    (["--gpt-fast-contexts", "999"], "--gpt-fast-contexts"),
    (["--gpt-fast-contexts", "most"], "--gpt-fast-contexts"),
    (["--gpt-fast-setups", "0"], "--gpt-fast-setups"),
    (["--device", "cpu"], "--quick"),
    (["--device", "tpu", "--quick"], "--device"),
    (["--plot-only", "/nonexistent/results.json"], "--plot-only"),
    (["--gemv-configs", "/nonexistent/gemv.json"], "--gemv-configs needs --gemv"),
    (["--gemv", "--gemv-configs", "/nonexistent/gemv.json"], "no tuned rows"),
    (["--gemv", "--no-fuse"], "--gemv with --no-fuse"),
    (["--decode-config", '{"min_spit": 64}'], "unknown key 'min_spit'"),
    (["--decode-config", "64"], "--decode-config"),
    (["--decode-compile-options", '{"combo_kernel": true}'], "not options of torch._inductor.config: 'combo_kernel'"),
    (["--qkv-kernel", "yes"], "--qkv-kernel"),
    (["--window-bwd-config", '{"bwd_dkdv": [64, 30, 8, 2]}'], "powers of two"),
    (["--window-bwd-config", '{"dkdv": [64, 32, 8, 2]}'], "unknown key 'dkdv'"),
    (["--window-bwd-config", '{"fused": 0}'], "give true or false"),
    (["--window-bwd-config", "{x"], "not JSON"),
    (["--systems", "orthros,flash"], "unknown: flash"),
    (["--systems", "orthros+gemv"], "need --gemv"),
    (["--systems", "full,gpt-fast"], "gpt-fast needs --gpt-fast-dir"),
    (["--systems", ","], "--systems"),
    # the tiny model has 65536 positions: the engine refused max_seq_len=70003 after the bandwidths were measured
    (["--sections", "decode", "--contexts", "70000"], "--contexts needs positions 0..70002 (a context of 70000, then 3 steps), beyond"),
    (["--sections", "batched", "--batched-contexts", "65534"], "--batched-contexts needs positions 0..65536 (a context of 65534, then 3 steps), beyond"),
])
def test_bad_arguments_refused_before_any_work(tmp_path, capsys, args, message):
    out = tmp_path / "never"
    base = [] if "--device" in args else ["--device", "cpu", "--quick"]
    with pytest.raises(SystemExit) as e:
        R.main([*base, *args, "--out", str(out)], window_factory=lambda dev: None)
    assert e.value.code == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("text, message", [
    ('{"rows": [1, 2]}', "rows must be JSON objects"),  # an AttributeError of join_runs
    ('{"rows": [], "meta": 5}', "'meta' is not a JSON object"),  # a TypeError of join_runs
    # another benchmark's results (or an empty run): an empty figure was written without a word
    ('{"rows": [{"name": "x", "ms": 1.0}], "meta": {}}', "no roofline row"),
    ('{"rows": [], "meta": {}}', "no roofline row"),
])
def test_plot_only_refuses_results_of_the_wrong_form(tmp_path, capsys, text, message):
    bad = tmp_path / "results.json"
    bad.write_text(text)
    with pytest.raises(SystemExit) as e:
        R.main(["--plot-only", str(bad), "--out", str(tmp_path / "never")])
    assert e.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "never").exists()


def test_out_below_a_file_refused_before_any_work(tmp_path, capsys):
    """``--out`` below an existing file: a usage error (a NotADirectoryError traceback of
    os.makedirs once the run had started)."""
    (tmp_path / "f").write_text("x")
    for extra in ([], ["--plot-only", str(tmp_path / "f")]):
        with pytest.raises(SystemExit) as e:
            R.main(["--device", "cpu", "--quick", *extra, "--out", str(tmp_path / "f" / "sub")],
                   window_factory=lambda dev: None)
        assert e.value.code == 2 and "is a file, not a directory" in capsys.readouterr().err


@pytest.mark.parametrize("out", ["", "/proc/orthros-roofline-out"])
def test_out_that_cannot_be_made_refused_naming_it(tmp_path, capsys, out):
    """``--out ''`` or a place no directory can be made: a usage error naming --out (was a
    FileNotFoundError traceback of os.makedirs, after the ceilings were measured in a run)."""
    (tmp_path / "results.json").write_text(json.dumps({"rows": [{"section": "decode", "skipped": "x"}]}))
    for extra in ([], ["--plot-only", str(tmp_path / "results.json")]):
        with pytest.raises(SystemExit) as e:
            R.main(["--device", "cpu", "--quick", "--sections", "decode", *extra, "--out", out],
                   window_factory=lambda dev: None)
        assert e.value.code == 2 and f"--out {out!r}: cannot make the directory" in capsys.readouterr().err


def test_gpt_fast_dir_without_model_py_and_script_exit_code(tmp_path):
    (tmp_path / "empty").mkdir()
    p = _run_script("--device", "cpu", "--quick", "--gpt-fast-dir", str(tmp_path / "empty"), "--out",
                    str(tmp_path / "never"), timeout=120)
    assert p.returncode == 2 and "--gpt-fast-dir" in p.stderr and "model.py" in p.stderr
    assert not (tmp_path / "never").exists()
    with pytest.raises(SystemExit):  # the window section needs the script's timing code
        R.parse_args(["--device", "cpu", "--quick", "--sections", "window"], window_available=False)


def test_join_runs_prefers_measured_cells():
    skipped = {"section": "decode", "system": "orthros", "B": 1, "L": 1024, "skipped": "deadline"}
    measured = {"section": "decode", "system": "orthros", "B": 1, "L": 1024, "ms_per_step": 6.0}
    other = {"section": "window", "T": 8192, "pass": "fwd", "orthros_ms": 0.2}
    rows, meta = R.join_runs([{"meta": {"run": 1}, "rows": [measured, other]}, {"meta": {"run": 2}, "rows": [skipped]}])
    assert meta == {"run": 1} and measured in rows and other in rows and skipped not in rows
    rows, _ = R.join_runs([{"rows": [skipped]}, {"rows": [measured]}])
    assert rows == [measured]
    _, meta = R.join_runs([{"meta": {"commit": "a1"}, "rows": []}, {"meta": {"commit": "b2"}, "rows": []},
                           {"meta": {"commit": "a1"}, "rows": []}])
    assert meta["commit"] == "a1 / b2"  # the figure's title names every run's commit
    # a point is never a mix of runs: a later run's point replaces every system of an earlier one
    ours1, peer1 = ({"section": "batched", "system": s, "B": 8, "L": 4096, "ms_per_step": t, "tokens_per_s": 8 / t}
                    for s, t in (("orthros", 10.0), ("gpt-fast", 20.0)))
    ours2, full2 = ({"section": "batched", "system": s, "B": 8, "L": 4096, "ms_per_step": t, "tokens_per_s": 8 / t}
                    for s, t in (("orthros", 9.0), ("full", 9.5)))
    rows, _ = R.join_runs([{"rows": [ours1, peer1]}, {"rows": [ours2, full2]}])
    assert rows == [ours2, full2]
    assert {s["target"] for s in R.summarize(rows)} == {"batched_vs_full"}  # no ratio of run 2 to run 1's peer
    _, meta = R.join_runs([{"meta": {"date": "2026-12-03", "device": "H200", "copy_bw_tb_s": 4.0,
                                     "read_bw_tb_s": 4.5, "matmul_tflop_s": 770.0}, "rows": []},
                           {"meta": {"date": "2026-12-04", "device": "H200", "copy_bw_tb_s": 4.2,
                                     "read_bw_tb_s": 4.4, "matmul_tflop_s": 770.0}, "rows": []}])
    assert meta["date"] == "2026-12-03 / 2026-12-04" and meta["device"] == "H200"
    assert meta["copy_bw_tb_s"] == [4.0, 4.2] and meta["read_bw_tb_s"] == [4.4, 4.5]
    assert meta["matmul_tflop_s"] == 770.0
    assert R._ceiling(meta["copy_bw_tb_s"], ".2f") == "4.00-4.20" and R._ceiling(770.0, ".0f") == "770"
    assert R._ceiling(None, ".2f") == "nan"


def test_window_graph_rows_compare_both_systems_under_cuda_graphs(tmp_path):
    """A window cell with both systems' fwd+bwd replayed from CUDA graphs gives a row of its own
    with the ratio, and a target line told apart from the eager one."""
    def factory(device):
        def bench(T):
            return ({"ours_fwd": 2.0, "flex_fwd": 3.0, "ours_fb": 8.0, "flex_fb": 6.0, "ours_fb_graph": 4.0,
                     "flex_fb_graph": 5.8}, {"T": 64, "Hq": 2, "Hkv": 1, "D": 16, "window": 128, "elem_bytes": 4}, [])
        return bench
    out = tmp_path / "graph"
    assert R.main(["--device", "cpu", "--quick", "--sections", "window", "--window-lengths", "8192", "--out", str(out)],
                  window_factory=factory) == 0
    rows = {r["pass"]: r for r in json.loads((out / "results.json").read_text())["rows"]}
    assert rows["fwd+bwd"]["speedup_vs_flex"] == pytest.approx(0.75)
    assert rows["fwd+bwd graph"]["speedup_vs_flex"] == pytest.approx(1.45)
    lines = {t["point"]: t for t in R.summarize(list(rows.values())) if t["target"] == "window_fb_vs_flex"}
    assert lines["T=8192"]["met"] is False and lines["T=8192 (CUDA graphs, both)"]["met"] is True


def test_window_reserve_skips_decode_cells_but_runs_the_window_section(tmp_path):
    calls = []

    def factory(device):  # a test double for benchmarks/attention.py's timing (the script's real one
        def bench(T):  # runs in test_quick_cpu_sweep_writes_consistent_json_and_plot)
            calls.append(T)
            return ({"ours_fwd": 2.0, "flex_fwd": 3.0},
                    {"T": 64, "Hq": 2, "Hkv": 1, "D": 16, "window": 128, "elem_bytes": 4}, [])
        return bench
    out = tmp_path / "reserve"
    assert R.main(["--device", "cpu", "--quick", "--sections", "decode,window", "--window-lengths", "8192",
                   "--deadline-s", "600", "--window-reserve-s", "600", "--out", str(out)],
                  window_factory=factory) == 0
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert calls == [8192]
    assert all("window section" in r["skipped"] for r in rows if r["section"] == "decode")
    (win,) = [r for r in rows if r["section"] == "window"]
    assert win["speedup_vs_flex"] == pytest.approx(1.5) and win["frac_of_floor"] == pytest.approx(win["floor_ms"] / 2)


def test_progress_counts_the_cells_the_run_has(tmp_path, capsys):
    """The progress total is the run's cells: one a system of each decode cell (--gemv adds two,
    --systems keeps those named) and one a window length, whatever passes it measured (was: two
    systems a decode cell and three rows a length, so this run ended at "point 4/8"; a --gemv
    run of all four systems at "point 4/2")."""
    def factory(device):
        def bench(T):
            return ({"ours_fwd": 2.0, "flex_fwd": 3.0, "ours_fb": 8.0},
                    {"T": 64, "Hq": 2, "Hkv": 1, "D": 16, "window": 128, "elem_bytes": 4}, [])
        return bench
    assert R.main(["--device", "cpu", "--quick", "--sections", "decode,window", "--gemv", "--systems",
                   "orthros,full+gemv", "--contexts", "64", "--steps", "1", "--warmup", "1", "--window-lengths",
                   "8192,16384", "--out", str(tmp_path / "o")], window_factory=factory) == 0
    rows = json.loads((tmp_path / "o" / "results.json").read_text())["rows"]
    assert len(rows) == 2 + 2 * 2  # two decode rows, two passes at each of two lengths
    assert capsys.readouterr().err.splitlines()[-1].startswith("[roofline] point 4/4 ")


def test_bench_decode_builds_its_engines_fused_or_not():
    """``--no-fuse`` reaches the engine: bench_decode(fuse=False) leaves the model unfused (and
    un-fuses one an earlier engine fused), fuse=True fuses it."""
    m = tiny_model()
    attn = m.model.layers[0].self_attn
    for fuse in (True, False, True):
        rows = bench_decode(m, [8], batch_sizes=[1], modes=["orthros"], steps=1, warmup=1, fuse=fuse)
        assert rows[0]["ms_per_step"] > 0 and attn.projections_fused is fuse


def test_a_compile_fallback_is_recorded_and_fails_the_targets(monkeypatch):
    """A compiled engine whose piece fails to compile runs it eagerly (with a warning): the
    decode rows name the piece (``eager_fallbacks``) and no target point built on such a row
    counts as met, however fast it was."""
    import orthros.engine.engine as engine_mod

    real_compile = torch.compile

    def compile_failing_finish(fn, **kw):
        if fn.__name__ != "_finish":
            return real_compile(fn, backend="eager")

        def fail(*a):
            raise RuntimeError("a fake that rejects its inputs")
        return fail

    engine_compiles_with(monkeypatch, compile_failing_finish)
    try:
        with pytest.warns(RuntimeWarning, match="torch.compile of _finish failed"):
            rows = bench_decode(tiny_model(), [8], batch_sizes=[1], modes=["orthros"], steps=1, warmup=1,
                                compile=True)
    finally:
        torch._dynamo.reset()
    assert rows[0]["eager_fallbacks"] == ["_finish"] == engine_mod.compile_fallbacks()
    base = dict(B=1, L=1024, floor_ms=1.0)
    fast = [dict(base, section="decode", system="orthros", ms_per_step=1.1, frac_of_floor=0.91,
                 eager_fallbacks=["_finish"]),
            dict(base, section="decode", system="full", ms_per_step=1.1, frac_of_floor=0.91),
            dict(base, section="decode", system="gpt-fast", ms_per_step=5.0, frac_of_floor=0.2)]
    lines = {(t["target"], t["point"]): t["met"] for t in R.summarize(fast)}
    assert lines == {("decode_frac_of_floor", "orthros B=1 L=1024 (eager fallback: not the compiled engine)"): False,
                     ("decode_frac_of_floor", "full B=1 L=1024"): True,
                     ("decode_vs_gpt_fast", "B=1 L=1024 (eager fallback: not the compiled engine)"): False}


def test_gemv_flag_adds_the_fused_gemv_engine_to_the_decode_section(tmp_path):
    """``--gemv``: the decode and batched sections also time the same engine with
    ``Engine(gemv=True)`` (both modes, same run) where a step has <= 8 GEMV rows (the pair at
    B <= 4, the Transformer at B <= 8; larger cells are skipped with the reason), and the
    summary prints its speed-up over the plain engine and the batched ratio with it."""
    out = tmp_path / "o"
    assert R.main(["--device", "cpu", "--quick", "--sections", "decode,batched", "--gemv", "--batch-sizes", "2,8",
                   "--out", str(out)]) == 0
    data = json.loads((out / "results.json").read_text())
    assert data["meta"]["gemv"] is True
    cells = {(r["section"], r["system"], r["B"]) for r in data["rows"] if "ms_per_step" in r}
    assert {("decode", s, 1) for s in ("orthros", "full", "orthros+gemv", "full+gemv")} <= cells
    assert {("batched", s, 2) for s in ("orthros+gemv", "full+gemv")} <= cells
    assert ("batched", "full+gemv", 8) in cells and ("batched", "orthros+gemv", 8) not in cells
    skipped = [r for r in data["rows"] if r["system"] == "orthros+gemv" and r["B"] == 8]
    assert skipped and all("16 GEMV rows" in r["skipped"] for r in skipped)
    gains = [s for s in data["meta"]["summary"] if s["target"] == "gemv_speedup"]
    assert {g["point"].split()[0] for g in gains} == set(R.GEMV_SYSTEMS) and all(g["value"] > 0 for g in gains)
    assert any(s["target"] == "batched_vs_full" and s["point"].startswith("+gemv B=2") for s in data["meta"]["summary"])


def test_systems_flag_runs_only_the_systems_named(tmp_path):
    """``--systems``: the decode section times only the systems named (an A/B of an engine
    setting across processes needs no other rows); the metadata says which, and whether PDL ran."""
    out = tmp_path / "o"
    assert R.main(["--device", "cpu", "--quick", "--sections", "decode", "--gemv", "--systems", "full+gemv",
                   "--contexts", "256", "--out", str(out)]) == 0
    data = json.loads((out / "results.json").read_text())
    assert {r["system"] for r in data["rows"]} == {"full+gemv"} and all("ms_per_step" in r for r in data["rows"])
    assert data["meta"]["systems"] == ["full+gemv"]
    assert data["meta"]["pdl"] == {"on": False}  # no PDL on a CPU


def test_gpt_fast_setups_row_is_the_fastest_and_records_each(tmp_path, gpt_fast_dir, monkeypatch):
    """``--gpt-fast-setups 3``: the decode section times gpt-fast's step in three setups (a new
    setup before each but the first), its row the fastest, every setup recorded in order; the
    batched section's cells run one setup."""
    calls = []
    real = R.GptFastPeer.new_setup

    def counted(self):
        calls.append(len(self._spacers))
        real(self)  # eager on a CPU: nothing to set up anew
    monkeypatch.setattr(R.GptFastPeer, "new_setup", counted)
    out = tmp_path / "o"
    assert R.main(["--device", "cpu", "--quick", "--sections", "decode,batched", "--systems", "full,gpt-fast",
                   "--gpt-fast-dir", str(gpt_fast_dir), "--gpt-fast-setups", "3", "--contexts", "256",
                   "--batch-sizes", "2", "--batched-contexts", "256", "--out", str(out)]) == 0
    data = json.loads((out / "results.json").read_text())
    dec = [r for r in data["rows"] if r["system"] == "gpt-fast" and r["section"] == "decode"]
    bat = [r for r in data["rows"] if r["system"] == "gpt-fast" and r["section"] == "batched"]
    assert len(dec) == 1 and len(dec[0]["setups_ms"]) == 3 and dec[0]["ms_per_step"] == min(dec[0]["setups_ms"])
    assert len(bat) == 1 and "setups_ms" not in bat[0]
    assert calls == [0, 0] and data["meta"]["gpt_fast"]["setups"] == 3


def test_gpt_fast_time_decode_refuses_no_setups(gpt_fast_dir):
    cfg = R.orthros_model("tiny", device="meta", dtype=torch.float32).config
    peer = R.GptFastPeer(R.load_gpt_fast(str(gpt_fast_dir)), cfg, device="cpu", dtype=torch.float32, block_size=64,
                         compile=False)
    with pytest.raises(ValueError, match="setups 0"):
        peer.time_decode(1, 8, steps=1, warmup=1, setups=0)


def test_gemv_configs_runs_the_fused_engine_with_the_swept_rows(tmp_path, monkeypatch):
    """``--gemv-configs``: the rows a ``gemv.py --fused --sweep`` stored are the GEMV table while the
    decode cells run (the kernel reads ``CONFIGS`` at call time), recorded in the metadata, and the
    built-in table is back afterwards. A file without rows is refused before any work."""
    from orthros.ops.gemv import kernel

    cfg = kernel.GemvConfig(block_n=16, block_k=128, defer=True)
    rows = kernel.class_rows(2, {(4096, 4096): cfg})
    results = tmp_path / "gemv.json"
    results.write_text(json.dumps({"meta": {"tuned_rows": kernel.rows_to_json(rows)}, "rows": []}))
    seen, keep = [], kernel.CONFIGS

    def spy(*args, **kw):
        seen.append((kw.get("gemv"), kernel.pick_config(2, 4096, 4096), kernel.pick_config(1, 4096, 4096)))
        return bench_decode(*args, **kw)

    monkeypatch.setattr(R, "bench_decode", spy)
    out = tmp_path / "o"
    assert R.main(["--device", "cpu", "--quick", "--sections", "decode", "--contexts", "64", "--gemv",
                   "--gemv-configs", str(results), "--out", str(out)]) == 0
    assert kernel.CONFIGS is keep
    assert len(seen) == 4 and all(two == cfg and one is kernel.pick_config(1, 4096, 4096) for _, two, one in seen)
    meta = json.loads((out / "results.json").read_text())["meta"]
    assert meta["gemv_configs"] == {"file": str(results), "rows": kernel.rows_to_json(rows)}
    results.write_text(json.dumps({"meta": {}, "rows": []}))
    with pytest.raises(SystemExit) as e:
        R.main(["--device", "cpu", "--quick", "--gemv", "--gemv-configs", str(results), "--out", str(tmp_path / "n")])
    assert e.value.code == 2 and not (tmp_path / "n").exists()


def test_window_timing_module_is_importable_by_name():
    """torch.compile (Flex in the window section) re-imports the module of a traced function by its
    name: benchmarks/attention.py, loaded from its file by the script, must be in sys.modules under
    that name (the 2026-12-02 GPU run lost every Flex figure to a ModuleNotFoundError here)."""
    import importlib

    script = load_script(SCRIPT, "orthros_roofline_script")
    att = script._attention_module()
    assert importlib.import_module(att.flex_window.__module__) is att


def test_decode_config_is_active_in_the_run_recorded_and_restored(tmp_path, monkeypatch):
    """--decode-config: DECODE_CONFIG holds the overrides while the decode cells run, results.json
    names them, and the defaults are back afterwards."""
    from orthros.ops.triton.decode import DECODE_CONFIG

    keep = dict(DECODE_CONFIG)
    seen = []

    def spy(*args, **kw):
        seen.append(DECODE_CONFIG["min_split"])
        return bench_decode(*args, **kw)
    monkeypatch.setattr(R, "bench_decode", spy)
    out = tmp_path / "dc"
    assert R.main(["--device", "cpu", "--quick", "--sections", "decode", "--contexts", "64", "--steps", "1",
                   "--warmup", "1", "--decode-config", '{"min_split": 256}', "--out", str(out)],
                  window_factory=lambda dev: None) == 0
    assert seen and set(seen) == {256}
    assert json.loads((out / "results.json").read_text())["meta"]["decode_config"] == {"min_split": 256}
    assert DECODE_CONFIG == keep


def test_decode_compile_options_are_active_in_the_run_and_restored(tmp_path, monkeypatch):
    """--decode-compile-options: engines built during the run compile their decode pieces with
    these Inductor options; the engine's own come back afterwards."""
    import orthros.engine.engine as engine_mod

    keep = engine_mod.DECODE_COMPILE_OPTIONS
    seen = []

    def spy(*args, **kw):
        seen.append(dict(engine_mod.DECODE_COMPILE_OPTIONS))
        return bench_decode(*args, **kw)
    monkeypatch.setattr(R, "bench_decode", spy)
    opts = {"realize_reads_threshold": 5, "combo_kernels": True}
    assert R.main(["--device", "cpu", "--quick", "--sections", "decode", "--contexts", "64", "--steps", "1",
                   "--warmup", "1", "--decode-compile-options", json.dumps(opts), "--out", str(tmp_path / "co")],
                  window_factory=lambda dev: None) == 0
    assert seen and all(o == opts for o in seen)
    assert engine_mod.DECODE_COMPILE_OPTIONS is keep


def test_qkv_kernel_flag_sets_the_engines_default_for_the_run_and_restores_it(tmp_path, monkeypatch):
    """--qkv-kernel off: engines built during the run get DECODE_QKV_KERNEL False (what
    Engine(qkv_kernel=None) reads on CUDA); the default comes back afterwards; the CPU run
    records that its engines ran without the kernel."""
    import orthros.engine.engine as engine_mod

    keep = engine_mod.DECODE_QKV_KERNEL
    seen = []

    def spy(*args, **kw):
        seen.append(engine_mod.DECODE_QKV_KERNEL)
        return bench_decode(*args, **kw)
    monkeypatch.setattr(R, "bench_decode", spy)
    out = tmp_path / "qkv"
    assert R.main(["--device", "cpu", "--quick", "--sections", "decode", "--contexts", "64", "--steps", "1",
                   "--warmup", "1", "--qkv-kernel", "off", "--out", str(out)], window_factory=lambda dev: None) == 0
    assert seen and not any(seen)
    assert engine_mod.DECODE_QKV_KERNEL is keep
    assert json.loads((out / "results.json").read_text())["meta"]["qkv_kernel"] is False


def test_gpt_fast_needs_names_the_step_that_1_2x_needs_at_the_shortest_context_only():
    """The summary's "what 1.2x needs" table: for an Orthros system short of 1.2x over gpt-fast at
    the target's context, the step it needs and the fractions of both floors; none where the ratio
    is met, none at longer contexts, and no read fraction from rows measured before the read floor."""
    def row(system, L, t, read=True):
        r = {"section": "decode", "system": system, "B": 1, "L": L, "ms_per_step": t, "floor_ms": 5.2}
        if read:
            r["read_floor_ms"] = 4.85
        return r

    rows = [row("gpt-fast", 1024, 6.246), row("orthros+gemv", 1024, 5.685), row("orthros", 1024, 5.0),
            row("full+gemv", 1024, 5.7), row("gpt-fast", 4096, 9.0), row("orthros+gemv", 4096, 8.0)]
    needs = R.gpt_fast_needs(rows)
    assert [n["point"] for n in needs] == ["orthros+gemv B=1 L=1024"]  # orthros meets 1.2x; full is no pair
    n = needs[0]
    assert n["needs_ms"] == pytest.approx(6.246 / 1.2) and n["cut"] == pytest.approx(1 - 6.246 / 1.2 / 5.685)
    assert n["needs_frac_of_floor"] == pytest.approx(5.2 / (6.246 / 1.2))
    assert n["needs_frac_of_read_floor"] == pytest.approx(4.85 / (6.246 / 1.2))
    assert n["frac_of_read_floor"] == pytest.approx(4.85 / 5.685)
    old = R.gpt_fast_needs([row("gpt-fast", 1024, 6.246, read=False), row("orthros+gemv", 1024, 5.685, read=False)])
    assert old[0]["needs_frac_of_read_floor"] is None and old[0]["frac_of_read_floor"] is None
    assert R.gpt_fast_needs([]) == [] and R.gpt_fast_needs([dict(row("gpt-fast", 1024, 6.0), skipped="deadline")]) == []

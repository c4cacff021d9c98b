"""benchmarks/gemv_engine.py on CPU (the tiny preset, the kernel through the Triton interpreter):
every candidate of the site reaches the kernel's launch inside the engine's step (and no other
site's config changes), the table is timed in every round, the rounds rotate the order, the
summary's ratios are to the same round's table; bad arguments exit 2 before a model is built and
write nothing."""

import json
from pathlib import Path

import pytest
from bench_script import load_script

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gemv_engine.py"


def wide_table(kernel):
    """A GEMV table for the runs through the Triton interpreter, whose cost is one Python run a
    program: its one wide row launches 1-4 programs a GEMV of the tiny preset, the real rows 4-32."""
    return ((kernel.MAX_M, 2 ** 62, 2 ** 62, kernel.GemvConfig.parse("128x128 s1")),)


@pytest.fixture(scope="module")
def script():
    return load_script(SCRIPT, "gemv_engine_script")


def test_site_shapes_of_qwen3_8b(script):
    from orthros.benchmarks.models import QWEN3_8B

    got = {s: script.site_shape(QWEN3_8B, s) for s in script.SITES}
    assert got == {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288),
                   "lm_head": (151936, 4096)}


def test_candidates_reach_the_kernel_inside_the_step(script, tmp_path, monkeypatch):
    from orthros.ops.gemv import kernel

    launched = []  # (N, K, rows, config) of each kernel call
    real = kernel.gemv_triton

    def spy(x, weight, bias=None, **kw):
        M = x.numel() // x.shape[-1]
        launched.append((weight.shape[0], weight.shape[1], M, kernel.pick_config(M, *weight.shape)))
        return real(x, weight, bias, **kw)

    monkeypatch.setattr(kernel, "gemv_triton", spy)
    # wide candidates and table rows: a few programs a GEMV in the interpreter, not 16-256 (88 s -> 10 s);
    # what is checked holds for any rows: each candidate replaces the table's config at the site, only there
    monkeypatch.setattr(kernel, "CONFIGS", wide_table(kernel))
    out = tmp_path / "r.json"
    a = script.parse_args(["--device", "cpu", "--preset", "tiny", "--backend", "triton", "--site", "gate_up",
                           "--configs", "64x64 defer w4 st1;table;32x32 s1 fma w2 st1", "--rounds", "2", "--steps",
                           "1", "--warmup", "1", "--context", "8", "--modes", "orthros,full", "--out", str(out)])
    assert script.run(a) == 0
    data = json.loads(out.read_text())
    N, K = 2 * 128, 64  # the tiny preset's gate/up
    assert data["meta"]["argv"][:2] == ["--device", "cpu"]
    assert (data["meta"]["N"], data["meta"]["K"]) == (N, K)
    rows = data["rows"]
    assert len(rows) == 2 * 2 * 3  # modes x rounds x candidates
    for mode, M in (("orthros", 2), ("full", 1)):
        mine = [r for r in rows if r["mode"] == mode]
        assert {r["M"] for r in mine} == {M}
        assert [r["candidate"] for r in mine if r["round"] == 0] == ["table", "64x64 s1 defer w4 st1",
                                                                     "32x32 s1 fma w2 st1"]
        assert [r["candidate"] for r in mine if r["round"] == 1] == ["64x64 s1 defer w4 st1", "32x32 s1 fma w2 st1",
                                                                     "table"]
        table = kernel.pick_config(M, N, K).label
        assert {r["config"] for r in mine if r["candidate"] == "table"} == {table}
        summ = [s for s in data["summary"] if s["mode"] == mode]
        assert [s["candidate"] for s in summ] == ["table", "64x64 s1 defer w4 st1", "32x32 s1 fma w2 st1"]
        assert summ[0]["vs_table"] == 1.0 and sum(s["best"] for s in summ) == 1
        ratio = [r["ms_per_step"] / next(t["ms_per_step"] for t in mine if t["candidate"] == "table"
                                         and t["round"] == r["round"]) for r in mine if r["candidate"] == summ[1]["candidate"]]
        assert summ[1]["vs_table"] == pytest.approx(sorted(ratio)[0] / 2 + sorted(ratio)[1] / 2)
    # every candidate ran at the site's shape; the other sites kept their table rows
    site = {(M, c.label) for n, k, M, c in launched if (n, k) == (N, K)}
    assert {(2, "64x64 s1 defer w4 st1"), (2, "32x32 s1 fma w2 st1"), (1, "64x64 s1 defer w4 st1"),
            (1, "32x32 s1 fma w2 st1")} <= site
    others = {(n, k, M, c) for n, k, M, c in launched if (n, k) != (N, K)}
    assert others and all(c == kernel.pick_config(M, n, k) for n, k, M, c in others)
    assert kernel.OVERRIDES == {}


def test_table_ef_runs_the_tables_config_with_its_weight_loads_evict_first(script, tmp_path, monkeypatch):
    from orthros.ops.gemv import kernel

    launched = []
    real = kernel.gemv_triton

    def spy(x, weight, bias=None, **kw):
        launched.append((tuple(weight.shape), kernel.pick_config(x.numel() // x.shape[-1], *weight.shape)))
        return real(x, weight, bias, **kw)

    monkeypatch.setattr(kernel, "gemv_triton", spy)
    monkeypatch.setattr(kernel, "CONFIGS", wide_table(kernel))
    out = tmp_path / "r.json"
    a = script.parse_args(["--device", "cpu", "--preset", "tiny", "--backend", "triton", "--site", "down",
                           "--configs", "table;table  ef", "--rounds", "1", "--steps", "1", "--warmup", "1",
                           "--context", "8", "--modes", "full", "--out", str(out)])
    assert list(a.candidates) == ["table", "table ef"]
    assert script.run(a) == 0
    rows = json.loads(out.read_text())["rows"]
    table = kernel.pick_config(1, 64, 128)  # the tiny preset's down: N = hidden 64, K = intermediate 128
    assert {r["candidate"]: r["config"] for r in rows} == {"table": table.label, "table ef": table.label + " ef"}
    site = {c.evict_first for shape, c in launched if shape == (64, 128)}
    assert site == {False, True} and not any(c.evict_first for shape, c in launched if shape != (64, 128))


@pytest.mark.parametrize("args, says", [
    (["--configs", "table"], "at least one config besides 'table'"),
    (["--configs", "3x64 defer"], "power of two"),
    (["--configs", "2x64 bogus"], "is no GEMV config"),
    (["--configs", "2x64", "--rounds", "0"], "--rounds must be >= 1"),
    (["--configs", "2x64", "--modes", "orthros,window"], "--modes"),
    (["--configs", "2x64", "--batch", "5"], "exceed the fused GEMV's 8"),
    (["--configs", "2x64", "--out", "r.txt"], "--out must be a .json"),
    # were tracebacks: torch's RuntimeError, AssertionError (no CUDA), FileExistsError after the run
    (["--configs", "2x64", "--device", "cuda:x"], "--device must be cpu, cuda or cuda:N, got 'cuda:x'"),
    (["--configs", "2x64", "--out", f"{SCRIPT}/r.json"], f"{SCRIPT}/r.json: {SCRIPT} is a file, not a directory"),
    pytest.param(["--configs", "2x64", "--device", "cuda"], "--device cuda: no CUDA device here",
                 marks=pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a machine without CUDA")),
])
def test_bad_arguments_exit_2_before_any_work(script, tmp_path, capsys, args, says):
    argv = ["--device", "cpu", "--preset", "tiny", "--site", "gate_up", "--out", str(tmp_path / "r.json"), *args]
    with pytest.raises(SystemExit) as e:
        script.parse_args(argv)
    assert e.value.code == 2 and says in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_a_config_that_changes_a_trace_time_choice_is_refused(script, capsys, tmp_path):
    """At the o-projection a split-K config computes the next norm in its reduce (norm_out_fused),
    which the compiled step fixes when it is traced: a candidate that flips it is refused."""
    from orthros.benchmarks.models import TINY
    from orthros.ops.gemv import kernel

    N, K = script.site_shape(TINY, "o")
    fused = kernel.norm_out_fused(2, N, K)
    flip = "16x16 s1 fma" if fused else "16x16 s2 fma"
    with pytest.raises(SystemExit) as e:
        script.parse_args(["--device", "cpu", "--preset", "tiny", "--site", "o", "--configs", flip,
                           "--modes", "orthros", "--out", str(tmp_path / "r.json")])
    assert e.value.code == 2 and "split-K reduce" in capsys.readouterr().err


def test_context_at_the_presets_last_position(script, tmp_path, capsys, monkeypatch):
    """--context + max(--warmup, --steps) may reach the preset's last position and no further: was
    unchecked (an engine of --context + --warmup + --steps + 2 slots, refused by Engine after the
    model was built even where every step fitted)."""
    from orthros.benchmarks.models import PRESETS

    monkeypatch.setitem(PRESETS["tiny"], "max_position_embeddings", 24)
    out = tmp_path / "r.json"
    argv = ["--device", "cpu", "--preset", "tiny", "--site", "down", "--configs", "table;2x64", "--rounds", "1",
            "--steps", "3", "--warmup", "2", "--modes", "full", "--out", str(out)]
    a = script.parse_args(argv + ["--context", "21"])  # steps write slots 21..23: the last position
    assert script.cache_slots(a) == 24
    assert script.run(a) == 0 and json.loads(out.read_text())["rows"]
    out.unlink()
    with pytest.raises(SystemExit) as e:
        script.parse_args(argv + ["--context", "22"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--context 22" in err and "max_position_embeddings=24" in err, err
    assert "--context <= 21" in err and list(tmp_path.iterdir()) == []

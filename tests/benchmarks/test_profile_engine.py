"""benchmarks/profile_engine.py on CPU (a smoke run: no kernel trace there): both phases run for
the Transformer presets and the Orthros-H presets, the JSON names both modes, bad counts are
refused before any model is built; and its kernel classes sort real H200 kernel names.

The command runs in-process (``main(argv)``: a fresh Python costs seconds importing torch);
one refusal and the --help of a base install run it as a script."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from bench_script import load_script
from gpt_fast_stand_in import write_stand_in

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "profile_engine.py"


def _run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", *args], capture_output=True, text=True,
                          timeout=600, cwd=ROOT)


@pytest.fixture(scope="module")
def mod():
    return load_script(SCRIPT, "profile_engine_script")


@pytest.fixture
def main(mod, capsys):
    """``main`` runs the command on the CPU in-process: its stdout."""
    def run(*args):
        capsys.readouterr()
        mod.main(["--device", "cpu", *args])
        return capsys.readouterr().out
    return run


@pytest.fixture
def refused(mod, capsys, monkeypatch):
    """``refused`` runs the command in-process, expects exit 2 before any model is built: its stderr."""
    def build(*a, **kw):
        raise AssertionError("a model was built before the arguments were refused")

    def run(*args):
        capsys.readouterr()
        with monkeypatch.context() as m, pytest.raises(SystemExit) as e:
            m.setattr(mod, "orthros_model", build)
            mod.main(["--device", "cpu", *args])
        err = capsys.readouterr().err
        assert e.value.code == 2, err
        return err
    return run


@pytest.mark.parametrize("preset, phase", [("tiny-h", "prefill"), ("tiny-h", "decode")])
def test_smoke_on_cpu(tmp_path, main, preset, phase):
    out = tmp_path / "p.json"
    counts = ["--reps", "1", "--profiled", "1"] if phase == "prefill" else []  # prefill's options
    stdout = main("--preset", preset, "--phase", phase, "--context", "200", *counts, "--json", str(out))
    data = json.loads(out.read_text())
    assert set(data["modes"]) == {"orthros", "full"}
    assert "== orthros" in stdout and "== full" in stdout
    # were: the prefill JSON said neither device nor commit, neither phase's the preset (a tiny run's
    # JSON read as the 8B's); the CPU's eager decode step was printed as "(graph)"
    assert {k: data.get(k) for k in ("phase", "device", "preset")} == {"phase": phase, "device": "cpu",
                                                                       "preset": preset}
    assert "commit" in data and "(graph)" not in stdout
    assert data["date"].startswith("20") and "torch" in data  # was: no date, no torch version


def test_decode_with_fused_gemvs_on_cpu(tmp_path, main):
    """--gemv reaches the engine (Engine(gemv=True): the GEMV op's torch path on a CPU)."""
    out = tmp_path / "g.json"
    main("--preset", "tiny", "--context", "64", "--gemv", "--json", str(out))
    data = json.loads(out.read_text())
    assert data["gemv"] is True and set(data["modes"]) == {"orthros", "full"}


def test_bad_counts_refused():
    """The script itself (its __main__, its exit status): the other refusals run in-process."""
    p = _run("--phase", "prefill", "--reps", "0")
    assert p.returncode == 2 and "--reps 0" in p.stderr and "Traceback" not in p.stderr, p.stderr


@pytest.mark.parametrize("args, message", [
    (["--device", "tpu"], "--device must be cpu, cuda or cuda:N, got 'tpu'"),  # was torch's RuntimeError
    (["--json", "{f}/p.json"], "--json {f}/p.json: {f} is a file, not a directory"),  # was raised after the run
    pytest.param(["--device", "cuda"], "--device cuda: no CUDA device here", marks=pytest.mark.skipif(
        __import__("torch").cuda.is_available(), reason="the refusal of a machine without CUDA")),  # AssertionError
])
def test_device_and_json_refused_in_one_line_before_any_model(tmp_path, refused, args, message):
    f = tmp_path / "f"
    f.write_text("x")
    err = refused("--preset", "tiny", "--context", "64", *(x.format(f=f) for x in args))  # the last --device wins
    assert message.format(f=f) in err, err


def test_decode_config_recorded_and_bad_one_refused(tmp_path, main, refused):
    out = tmp_path / "d.json"
    main("--preset", "tiny", "--context", "64", "--decode-config", '{"min_split": 128}', "--json", str(out))
    assert json.loads(out.read_text())["decode_config"] == {"min_split": 128}
    err = refused("--decode-config", '{"merge": "both"}', "--json", str(tmp_path / "never.json"))
    assert "--decode-config" in err and "separate, inline" in err
    assert not (tmp_path / "never.json").exists()


def test_decode_compile_options_recorded_and_bad_ones_refused(tmp_path, mod, main, refused, monkeypatch):
    """--decode-compile-options replaces the engine's DECODE_COMPILE_OPTIONS for the run (recorded);
    a key that is no Inductor option, or text that is not JSON, stops it before any model is built.
    (The decode step stubbed: compiling it on a CPU takes half a minute.)"""
    import orthros.engine.engine as engine_mod

    seen, out = [], tmp_path / "o.json"
    monkeypatch.setattr(mod, "copy_bandwidth", lambda dev: 1e12)
    monkeypatch.setattr(mod, "decode_modes",
                        lambda a, *rest: seen.append((a.compile, engine_mod.DECODE_COMPILE_OPTIONS)))
    main("--preset", "tiny", "--context", "64", "--compile", "--decode-compile-options", "{}", "--json", str(out))
    assert seen == [(True, {})] and engine_mod.DECODE_COMPILE_OPTIONS != {}  # the default back afterwards
    assert json.loads(out.read_text())["decode_compile_options"] == {}
    for bad, says in (('{"realize_reads": 5}', "'realize_reads'"), ("{5", "not JSON")):
        err = refused("--compile", "--decode-compile-options", bad, "--json", str(tmp_path / "never.json"))
        assert "--decode-compile-options" in err and says in err, err
    assert not (tmp_path / "never.json").exists()


def test_peer_timed_beside_the_engine_on_cpu(tmp_path, main):
    """--peer: gpt-fast's step of the same shape (the stand-in's model.py) is timed after both
    engine modes and recorded with its floor and where the peer came from."""
    out = tmp_path / "p.json"
    stdout = main("--preset", "tiny", "--context", "64", "--peer", str(write_stand_in(tmp_path)), "--json", str(out))
    data = json.loads(out.read_text())
    assert set(data["modes"]) == {"orthros", "full", "gpt-fast"}
    peer = data["modes"]["gpt-fast"]
    assert peer["step_ms"] > 0 and peer["floor_ms"] == data["modes"]["full"]["floor_ms"]
    assert peer["upstream"] == "stand-in for the test" and "== gpt-fast: step" in stdout


@pytest.mark.parametrize("args, says", [
    (["--peer", "/nonexistent/gpt-fast"], "--peer '/nonexistent/gpt-fast' is not a directory"),
    (["--phase", "prefill", "--peer", "."], "--peer: only with --phase decode"),
    (["--modes", "orthros,pair"], "--modes 'orthros,pair': give orthros and/or full"),
    (["--modes", "full,full"], "--modes 'full,full': give orthros and/or full, each once"),
    (["--modes", ""], "--modes '': only with --peer"),
    (["--peer-setups", "3"], "--peer-setups: only with --peer"),
    (["--peer", ".", "--peer-setups", "0"], "--peer-setups 0: give a positive integer"),
])
def test_bad_peer_modes_or_setups_refused_before_any_model(tmp_path, refused, args, says):
    err = refused(*args, "--json", str(tmp_path / "never.json"))
    assert says in err, err
    assert not (tmp_path / "never.json").exists()


@pytest.mark.parametrize("args, says", [
    # was: accepted and ignored (the other phase's options; the JSON of a prefill run did not say)
    (["--phase", "prefill", "--gemv"], "--gemv: only with --phase decode"),
    (["--phase", "prefill", "--timeline"], "--timeline: only with --phase decode"),
    (["--phase", "prefill", "--qkv-kernel", "off"], "--qkv-kernel: only with --phase decode"),
    (["--phase", "prefill", "--decode-config", '{"min_split": 64}'], "--decode-config: only with --phase decode"),
    (["--reps", "5"], "--reps: only with --phase prefill"),
    (["--profiled", "1"], "--profiled: only with --phase prefill"),
    # was: accepted and recorded in the JSON, though the eager engine compiles nothing
    (["--decode-compile-options", "{}"], "--decode-compile-options: only with --compile"),
])
def test_other_phase_options_refused_before_any_model(tmp_path, refused, args, says):
    err = refused("--preset", "tiny", "--context", "64", *args, "--json", str(tmp_path / "never.json"))
    assert says in err, err
    assert not (tmp_path / "never.json").exists()


def test_kernel_classes(mod):
    assert mod.kernel_class("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64") == "matmul"
    assert mod.kernel_class("chunk_gated_delta_rule_fwd_kernel_h_blockdim64") == "GDN (linear attention)"
    assert mod.kernel_class("pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<256>>") == "attention"
    assert mod.kernel_class("_stream_fwd_kernel") == "attention"
    assert mod.kernel_class("triton_red_fused_add_mul_rsqrt_0") == "fused elementwise"
    assert mod.kernel_class("void at::native::index_put_kernel") == "cache write"


def test_timeline_summary_prices_idle_and_overlap(mod):
    """Two replays of a step of three kernels: a GEMV (10 us), an attention kernel launched
    early that overlaps its last 2 us, then 3 us idle, then a merge (2 us): per step a span of
    17 us, 14 busy, 3 idle, 2 overlapped (worked by hand). A trace that does not divide into the
    steps, or whose steps differ, is refused."""
    step = [("gemv", 0.0, 10.0), ("attn", 8.0, 4.0), ("merge", 15.0, 2.0)]
    kernels = step + [(n, t + 100.0, d) for n, t, d in step]
    t = mod.timeline_summary(kernels, 2, window=2)
    assert t["kernels_per_step"] == 3
    assert t["span_us"] == 17.0  # 0 .. 17
    assert t["busy_us"] == 14.0  # [0, 12) and [15, 17)
    assert t["idle_us"] == 3.0 and t["overlap_us"] == 2.0  # 16 us of kernels in 14 busy ones
    assert t["by_name"]["gemv"] == {"calls": 1.0, "mean_us": 10.0, "mean_gap_us": -2.0, "idle_after_us": 0.0}
    assert t["by_name"]["attn"]["mean_gap_us"] == 3.0 and t["by_name"]["attn"]["idle_after_us"] == 3.0
    assert [k["name"] for k in t["window"]] == ["gemv", "attn"] and t["window"][1]["start_us"] == 8.0
    assert t["window"][0]["gap_us"] == -2.0
    with pytest.raises(ValueError, match="do not divide"):
        mod.timeline_summary(kernels[:-1], 2)
    with pytest.raises(ValueError, match="different kernels"):
        mod.timeline_summary(step + [("other", 100.0, 1.0)] + step[1:], 2)


def test_timeline_flag_on_cpu_says_there_is_no_trace(tmp_path, main):
    out = tmp_path / "t.json"
    stdout = main("--preset", "tiny", "--context", "64", "--timeline", "--json", str(out))
    assert "graph timeline: no kernel recorded" in stdout
    assert "timeline" not in json.loads(out.read_text())["modes"]["orthros"]


def test_peer_kernel_sources_copied_with_their_tuned_configs(tmp_path, mod):
    """--peer-sources' copier: each named kernel's own source and its .best_config (here: the
    same stem; Inductor's own rule is checked below) land in the destination, not another kernel's config from the same folder, nor the
    graph module that defines every kernel (found first in sorted order, and taken only for a
    kernel with no file of its own); a name no source defines is left out."""
    root = tmp_path / "inductor"
    for d in ("ab", "aa", "cd"):
        (root / d).mkdir(parents=True)
    (root / "aa" / "module.py").write_text("def triton_red_fused_mm_t_view_11(a):\n    pass\n"
                                           "def triton_poi_only_in_module_3(b):\n    pass\n")
    (root / "ab" / "cabc.py").write_text("import triton\ndef triton_red_fused_mm_t_view_11(in_ptr0):\n    pass\n")
    (root / "ab" / "cabc.best_config").write_text('{"XBLOCK": 1, "R0_BLOCK": 2048, "num_warps": 16}')
    (root / "ab" / "caaa.best_config").write_text('{"XBLOCK": 64, "R0_BLOCK": 4}')  # another kernel's
    (root / "cd" / "ccdd.py").write_text("def triton_red_fused_mm_t_view_111(x):\n    pass\n")  # a longer name only
    dest = tmp_path / "out"
    found = mod.copy_kernel_sources(["triton_red_fused_mm_t_view_11", "triton_missing_1", "triton_poi_only_in_module_3"],
                                    str(root), str(dest), config_of=lambda source: source.with_suffix(".best_config"))
    assert list(found) == ["triton_red_fused_mm_t_view_11", "triton_poi_only_in_module_3"]
    assert (dest / "triton_red_fused_mm_t_view_11.py").read_text().startswith("import triton")
    assert '"R0_BLOCK": 2048' in (dest / "triton_red_fused_mm_t_view_11.best_config").read_text()
    assert (dest / "triton_poi_only_in_module_3.py").read_text().startswith("def triton_red_fused_mm_t_view_11(a)")
    assert sorted(p.name for p in dest.iterdir()) == ["triton_poi_only_in_module_3.py",
                                                      "triton_red_fused_mm_t_view_11.best_config",
                                                      "triton_red_fused_mm_t_view_11.py"]


def test_inductor_best_config_is_where_inductor_writes_it(tmp_path, mod):
    """The config path the copier reads is the one Inductor's autotune cache writes for a
    kernel file (its local cache key), in the kernel's folder."""
    from torch._inductor.runtime.autotune_cache import AutotuneCache

    source = tmp_path / "ab" / "cabcdef.py"
    path = mod.inductor_best_config(source)
    cache = AutotuneCache.create({"autotune_local_cache": True}, str(source), "0" * 64)
    assert path.parent == source.parent and path.suffix == ".best_config"
    assert cache is not None and str(path) == cache.local_cache[1]


def test_peer_sources_needs_the_compiled_traced_peer(tmp_path, refused):
    err = refused("--peer", ".", "--peer-sources", str(tmp_path / "src"), "--json", str(tmp_path / "never.json"))
    assert "--peer-sources: only with --peer, --compile and --timeline" in err, err
    assert not (tmp_path / "never.json").exists() and not (tmp_path / "src").exists()


def test_peer_alone_in_several_setups_on_cpu(tmp_path, main):
    """--modes '' --peer-setups 3: no engine mode is profiled; the peer's step is timed in three
    setups, each recorded, the fastest its step_ms."""
    out = tmp_path / "r.json"
    stdout = main("--preset", "tiny", "--context", "64", "--modes", "", "--peer", str(write_stand_in(tmp_path)),
                  "--peer-setups", "3", "--json", str(out))
    data = json.loads(out.read_text())
    assert set(data["modes"]) == {"gpt-fast"} and "== orthros" not in stdout
    peer = data["modes"]["gpt-fast"]
    assert len(peer["setups_ms"]) == 3 and all(x > 0 for x in peer["setups_ms"])
    assert peer["step_ms"] == min(peer["setups_ms"]) and "the fastest of 3 setups" in stdout


def test_one_engine_mode_only_on_cpu(tmp_path, main):
    out = tmp_path / "f.json"
    main("--preset", "tiny", "--context", "64", "--modes", "full", "--json", str(out))
    assert set(json.loads(out.read_text())["modes"]) == {"full"}


def test_help_without_triton():
    """The GPU tools' --help (and roofline's --plot-only) imported Triton kernels at the top: a base install
    (torch's CPU wheel, no triton) got a ModuleNotFoundError traceback for --help. (Both scripts in one
    fresh Python, triton unimportable from its start: what the first imports, the second finds loaded.)"""
    code = ("import runpy, sys\nsys.modules['triton'] = None\n"
            "for script in ('profile_engine.py', 'roofline.py'):\n"
            "    sys.argv = [script, '--help']\n"
            "    try:\n"
            f"        runpy.run_path({str(ROOT / 'benchmarks')!r} + '/' + script, run_name='__main__')\n"
            "    except SystemExit as e:\n"
            "        assert e.code in (0, None), (script, e.code)\n"
            "    print('== help of', script, flush=True)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.count("usage:") == 2 and "== help of profile_engine.py" in r.stdout, r.stdout[-2000:]
    assert "== help of roofline.py" in r.stdout, r.stdout[-2000:]


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_context_beyond_the_preset_refused_before_any_model(tmp_path, mod, refused, phase):
    """--context was not checked against the preset's positions: the prefill failed in the engine after
    the model was built, the decode ran past max_position_embeddings silently."""
    top = mod.PRESETS["tiny"]["max_position_embeddings"] - mod.CACHE_HEADROOM
    mod.check_context(top, "tiny")  # the largest allowed: the engine's cache ends at the last position
    out = tmp_path / "never.json"
    err = refused("--preset", "tiny", "--phase", phase, "--context", str(top + 1), "--json", str(out))
    assert f"--context {top + 1}: give 1..{top} for --preset tiny" in err, err
    assert not out.exists()


def test_cpu_without_a_preset_refused_before_any_model(tmp_path, refused):
    """Was: --device cpu alone built the default qwen3-8b shape on the CPU (fp32, 32 GB) before profiling it."""
    out = tmp_path / "never.json"
    err = refused("--json", str(out))
    assert "--device cpu: give --preset tiny or tiny-h" in err, err[-2000:]
    assert "--preset qwen3-8b" in err and not out.exists()

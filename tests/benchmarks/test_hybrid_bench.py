"""benchmarks/hybrid.py on CPU at tiny shapes: the --prefill-chunk and --families flags reach the
rows, and bad values are refused before any model is built or any file written."""

import json
from pathlib import Path

import pytest
from bench_script import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "hybrid.py"


@pytest.fixture(scope="module")
def hybrid():
    return load_script(SCRIPT, "hybrid_bench_script")


@pytest.mark.parametrize("chunk, want", [("0", None), ("128", 128)])
def test_prefill_chunk_and_families_reach_the_rows(hybrid, tmp_path, chunk, want):
    out = tmp_path / "h.json"
    hybrid.main(["--tiny", "--sections", "prefill", "--prefill", "256", "--families", "hybrid",
                 "--prefill-chunk", chunk, "--out", str(out)])
    data = json.loads(out.read_text())
    assert data["errors"] == {} and list(data["sections"]) == ["prefill_hybrid"]  # no transformer family
    rows = {r["system"]: r for r in data["sections"]["prefill_hybrid"]}
    assert set(rows) == {"orthros", "full"} and all(r["ms"] > 0 and r["T"] == 256 for r in rows.values())
    assert rows["orthros"]["prefill_chunk"] == want and rows["full"]["prefill_chunk"] is None
    assert rows["orthros"]["system_label"] == "Orthros-H" and rows["full"]["system_label"] == "Linear Hybrid"


@pytest.mark.parametrize("args, message", [
    (["--prefill-chunk", "-1"], "--prefill-chunk"),
    (["--families", "hybrid,moe"], "--families"),
    (["--sections", "prefill,train"], "--sections"),
    (["--mqar-jobs", "0"], "--mqar-jobs: 0; must be >= 1"),
    (["--mqar-steps", "0"], "--mqar-steps: 0; must be >= 1"),
    # were: a traceback (int() of 'abc'), or the section's error after the model was built and other points ran
    (["--prefill", "64,abc"], "argument --prefill: expected comma-separated integers"),
    (["--prefill", "-5"], "argument --prefill: expected positive integers"),
    (["--pairs", "128"], "argument --pairs: expected IN:OUT pairs"),
    (["--pairs", "8:x"], "argument --pairs: expected IN:OUT pairs"),
    (["--decode-context", "0"], "--decode-context: 0; must be >= 1"),
    (["--deadline", "nan"], "--deadline: nan; give seconds >= 0"),
    # was: 'beyond the model's max_position_embeddings' as the prefill section's error, after the shorter lengths
    (["--prefill", "256,131072"], "--prefill needs positions 0..131071 in the prefill section, beyond "
                                  "max_position_embeddings=65536 of the hybrid family's model (tiny-h)"),
    (["--sections", "e2e", "--pairs", "65536:2"], "--pairs needs positions 0..65536 in the e2e section"),
    (["--sections", "decode", "--decode-context", "65500"], "--decode-context needs positions 0..65539"),
])
def test_bad_arguments_refused_before_work(hybrid, tmp_path, capsys, args, message):
    out = tmp_path / "never.json"
    with pytest.raises(SystemExit) as e:
        hybrid.main(["--tiny", *args, "--out", str(out)])
    assert e.value.code == 2 and message in capsys.readouterr().err
    assert not out.exists()


def test_mqar_alone_builds_no_benchmark_model(hybrid, tmp_path, monkeypatch):
    """--sections mqar trains MQAR's own tiny models: the 9B-shape benchmark models are not built."""
    def no_model(*a, **k):
        raise AssertionError("orthros_model called for an MQAR-only run")

    calls = []
    monkeypatch.setattr(hybrid, "orthros_model", no_model)
    monkeypatch.setattr(hybrid, "run_mqar_section", lambda emit, steps, device, compile=False, jobs=1: calls.append(
        (steps, compile, jobs)) or emit({"model": "stub"}))
    out = tmp_path / "m.json"
    hybrid.main(["--sections", "mqar", "--mqar-steps", "7", "--mqar-compile", "--mqar-jobs", "4", "--out", str(out)])
    data = json.loads(out.read_text())
    assert calls == [(7, True, 4)] and data["errors"] == {} and list(data["sections"]) == ["mqar"]


def test_prefill_chunk_reaches_the_e2e_section(hybrid, tmp_path, monkeypatch):
    """Was: the e2e section built its Orthros engine with bench_e2e's default 16K chunk whatever
    --prefill-chunk said (only the prefill section got it)."""
    from orthros.benchmarks import inference as I

    seen, real = [], I.Engine

    def spy(*a, **k):
        seen.append((k.get("attention_mode"), k.get("prefill_chunk")))
        return real(*a, **k)

    monkeypatch.setattr(I, "Engine", spy)
    out = tmp_path / "e.json"
    hybrid.main(["--tiny", "--sections", "e2e", "--families", "transformer", "--pairs", "8:3",
                 "--prefill-chunk", "4", "--out", str(out)])
    data = json.loads(out.read_text())
    assert data["errors"] == {} and seen == [("orthros", 4), ("full", None)]
    assert {(r["mode"], r["prefill_chunk"]) for r in data["sections"]["e2e_transformer"]} == {("orthros", 4),
                                                                                               ("full", None)}


@pytest.mark.parametrize("args, steps", [([], 8), (["--mqar-steps", "100"], 100)])
def test_tiny_keeps_a_given_mqar_steps(hybrid, tmp_path, monkeypatch, args, steps):
    """Was: --tiny ran 8 MQAR steps whatever --mqar-steps said; now 8 is --tiny's default only."""
    calls = []
    monkeypatch.setattr(hybrid, "run_mqar_section", lambda emit, steps, device, compile=False, jobs=1: calls.append(
        steps) or emit({"model": "stub"}))
    hybrid.main(["--tiny", "--sections", "mqar", *args, "--out", str(tmp_path / "m.json")])
    assert calls == [steps]


def test_out_that_cannot_be_written_is_refused_before_work(hybrid, tmp_path, capsys, monkeypatch):
    """Was: a folder or a path below a file as --out ran the section (its error recorded), then the
    final save raised IsADirectoryError / FileExistsError as a traceback."""
    monkeypatch.setattr(hybrid, "orthros_model", lambda *a, **k: pytest.fail("a model was built"))
    blocker = tmp_path / "f.txt"
    blocker.write_text("x")
    for out, message in ((tmp_path, "is a directory"), (blocker / "h.json", "is a file, not a directory")):
        with pytest.raises(SystemExit) as e:
            hybrid.main(["--tiny", "--sections", "prefill", "--out", str(out)])
        err = capsys.readouterr().err
        assert e.value.code == 2 and f"--out {out}: " in err and message in err


def test_tiny_defaults_run_and_a_repeated_length_is_measured_once(hybrid, tmp_path, monkeypatch):
    """Was: --tiny kept the GPU lengths (128K prefill, past the tiny models' 64K positions: an error in
    the prefill section; 8192:1024 e2e, minutes on a CPU), and --prefill 64,64 measured 64 twice."""
    seen = {}
    monkeypatch.setattr(hybrid, "bench_prefill", lambda model, lengths, **k: seen.setdefault("prefill", lengths))
    monkeypatch.setattr(hybrid, "bench_decode", lambda model, contexts, **k: seen.setdefault("decode", contexts))
    monkeypatch.setattr(hybrid, "bench_e2e", lambda model, pairs, **k: seen.setdefault("e2e", pairs))
    out = tmp_path / "t.json"
    hybrid.main(["--tiny", "--sections", "prefill,decode,e2e", "--families", "transformer", "--out", str(out)])
    assert seen == {"prefill": [256, 1024], "decode": [256], "e2e": [(16, 8), (64, 16)]}
    assert json.loads(out.read_text())["errors"] == {}
    seen.clear()
    hybrid.main(["--tiny", "--sections", "prefill,e2e", "--families", "transformer", "--prefill", "64,64,32",
                 "--pairs", "8:3,8:3", "--out", str(out)])
    assert seen == {"prefill": [64, 32], "e2e": [(8, 3)]}


def test_no_gpu_without_tiny_is_refused_before_a_model(hybrid, tmp_path, capsys, monkeypatch):
    """Was: with no CUDA device and no --tiny, the 9B / 8B-shape models were built in fp32 on the
    CPU (32+ GiB: minutes of allocation, then out of memory), no word said; now refused at once."""
    monkeypatch.setattr(hybrid.torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(hybrid, "orthros_model", lambda *a, **k: pytest.fail("a benchmark model was built"))
    out = tmp_path / "never.json"
    with pytest.raises(SystemExit) as e:
        hybrid.main(["--sections", "decode", "--families", "transformer", "--out", str(out)])
    assert e.value.code == 2 and "no CUDA device here: pass --tiny" in capsys.readouterr().err
    assert not out.exists()

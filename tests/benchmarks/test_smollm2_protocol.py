"""The SmolLM2 protocol (benchmarks/smollm2_cpt.py run) end to end on CPU with a tiny Llama GGUF
written in the test and text from the embedded corpus: conversion, the check against the
GGUF-loaded HF model, both CPT runs, perplexity by bucket and passkey retrieval at the model's
maximum length through the engine (the path that failed on the H200 smoke run before NIAH gave
the answer its positions). The real-model run is a GPU measurement (docs/pretrained.md)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from bench_script import load_script

ROOT = Path(__file__).resolve().parents[2]
pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from orthros.conversion.gguf import write_llama_gguf

    d = tmp_path_factory.mktemp("smol")
    tok = AutoTokenizer.from_pretrained(str(ROOT / "orthros/data/tokenizer"))
    torch.manual_seed(0)
    m = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                                     tie_word_embeddings=True, bos_token_id=tok.bos_token_id,
                                     eos_token_id=tok.eos_token_id))
    write_llama_gguf(m, tok, d / "tiny.gguf")
    data = d / "data"
    data.mkdir()
    corpus = ROOT / "orthros/data/corpus"
    (data / "train.jsonl").write_text((corpus / "shakespeare_train.jsonl").read_text())
    (data / "heldout.jsonl").write_text((corpus / "shakespeare_eval.jsonl").read_text())
    plays = [json.loads(x)["text"] for x in (corpus / "shakespeare_eval.jsonl").read_text().splitlines()]
    (data / "haystack.txt").write_text("".join(c for c in "\n".join(plays) if not c.isdigit()))
    return d


def _run(d, out, *args, mod=None):
    """``smollm2_cpt.py run`` on the tiny GGUF: a fresh interpreter, or with ``mod`` (the script
    as a module) its ``main`` in this process (the torch and transformers imports paid once)."""
    argv = ["run", "--gguf", str(d / "tiny.gguf"), "--data", str(d / "data"), "--out", str(out), "--work",
            str(d / "work"), "--seq-len", "1024", "--micro-batch", "1", "--probe-steps", "2", "--curve-points", "2",
            "--ppl-windows", "2", "--eval-sequences", "1", "--niah-max", "1024", "--niah-samples", "1",
            "--niah-engine", "on", "--window", "64", *args]
    if mod is not None:
        assert mod.main(argv) == 0
    else:
        p = subprocess.run([sys.executable, str(ROOT / "benchmarks/smollm2_cpt.py"), *argv],
                           capture_output=True, text=True, timeout=900, cwd=ROOT)
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return json.loads((out / "results.json").read_text())


def _script():
    """benchmarks/smollm2_cpt.py as a module (its ``main`` runs the plot command in-process)."""
    return load_script(ROOT / "benchmarks/smollm2_cpt.py", "smollm2_cpt_script")


def test_protocol_runs_end_to_end_on_a_tiny_gguf(setup, capsys):
    """Split over two calls, as on the lent GPU (one call cannot hold a long CPT of both): the
    first converts, probes, trains Orthros and scores what it has (an Orthros-only run: no Base
    CPT yet); the second (same --work) trains Base CPT with the step count the first chose, then
    scores all four models. The first call is the command itself (a subprocess), the second its
    ``main`` in this process."""
    d = setup
    r1 = _run(d, d / "out1", "--max-steps", "10", "--phases", "convert,probe,train,ppl", "--cpt-runs", "orthros_cpt")
    assert set(r1["cpt"]) == {"orthros_cpt"}
    assert set(r1["perplexity"]) == {"Orthros CPT", "original (Transformer)", "Orthros zero-shot"}
    mod = _script()
    assert mod.main(["plot", str(d / "out1" / "results.json"), str(d / "recovery1.png")]) == 0  # one curve
    out = d / "out"
    r = _run(d, out, "--phases", "train,ppl,niah", "--cpt-runs", "base_cpt", mod=mod)
    assert r["meta"]["earlier_calls"][0]["args"]["cpt_runs"] == "orthros_cpt"
    assert r["cpt"]["orthros_cpt"]["summary"] == r1["cpt"]["orthros_cpt"]["summary"]  # carried, not retrained
    # the step-0 point of each curve comes from the first call's probe
    assert r["cpt"]["base_cpt"]["curve"][0] == {"step": 0, "tokens": 0, **{
        k: v for k, v in r["cpt"]["base_cpt"]["curve"][0].items() if k in ("eval_loss", "ppl")}}
    assert r["cpt"]["base_cpt"]["curve"][0]["eval_loss"] == r1["probe"]["base"]["eval_loss_step0"]
    # the conversion equals the GGUF model up to the window (orthros) and everywhere (full mode)
    for mode in ("orthros", "full"):
        assert r["sanity_vs_gguf_fp32"][mode]["max_abs_diff"] < 1e-4
    assert r["probe"]["steps"] == 10  # the CPT configs warm up for 10 steps: a run of fewer is refused
    for run in ("orthros_cpt", "base_cpt"):
        assert r["cpt"][run]["summary"]["step"] == 10 and r["cpt"][run]["summary"]["tokens"] == 10 * 1024
    models = {"Base CPT", "Orthros CPT", "original (Transformer)", "Orthros zero-shot"}
    assert set(r["perplexity"]) == models and set(r["niah"]) == models
    buckets = [b["bucket"] for b in r["perplexity"]["Base CPT"]["buckets"]]
    assert buckets == ["0-128", "128-512", "512-1K"]
    # zero-shot conversion = the original model inside the window
    z, o = r["perplexity"]["Orthros zero-shot"]["buckets"][0], r["perplexity"]["original (Transformer)"]["buckets"][0]
    assert z["ppl"] == pytest.approx(o["ppl"], rel=1e-3)
    for name in models:  # passkey at the model's maximum (1024 of 1024 positions), answer inside the positions
        assert set(r["niah"][name]["by_length"]) == {"1024"}
        recs = r["niah"][name]["records"]  # every needle is kept, with the prefix diagnostic
        assert len(recs) == 5 and all(e["prompt_tokens"] < 1024 for e in recs)
        assert r["niah"][name]["prefix_accuracy"] == pytest.approx(sum(e["prefix"] for e in recs) / len(recs), abs=1e-3)
    # the plot command reads the same file
    assert mod.main(["plot", str(out / "results.json"), str(d / "recovery.png")]) == 0
    assert (d / "recovery.png").stat().st_size > 10000
    # beside another run (run 4 beside run 3 in docs/pretrained.md); a missing file is refused
    assert mod.main(["plot", str(out / "results.json"), str(d / "both.png"), "--label", "second",
                     "--compare", str(d / "out1" / "results.json"), "first"]) == 0
    assert (d / "both.png").stat().st_size > 10000
    (d / "notes.json").write_text('{"not": "a run"}')
    for bad, says in (("nope.json", "no results file"), ("notes.json", 'is not a results.json of `smollm2_cpt.py run`')):
        capsys.readouterr()
        with pytest.raises(SystemExit) as e:
            mod.main(["plot", str(out / "results.json"), str(d / "x.png"), "--compare", str(d / bad), "x"])
        err = capsys.readouterr().err  # the refusal names the file and why (any exit passed)
        assert e.value.code == 2 and "plot: " in err and str(d / bad) in err and says in err, err
    assert not (d / "x.png").exists()

"""MQAR's compiled training step (``MQARTrain.compile``): the same run as eager, really compiled.

Inductor on the CPU builds C++ kernels with gcc: a cold compile of one tiny model takes ~20-40 s
here, so the file compiles two models (Orthros-H first: Orthros then reuses its cached MLP and
norm kernels) and keeps every other check free of compilation.
"""

import numpy as np
import pytest
import torch
from bench_script import load_script

from orthros.evaluation.mqar import MQARTask, MQARTrain, _batch, generate, model_backend, run_mqar, train_one

TASK = MQARTask(vocab_size=32, seq_len=32, num_pairs=2)
STEPS, BATCH = 5, 4


def _losses(name: str, compile: bool, layers: int) -> tuple[list, dict]:
    tr = MQARTrain(models=(name,), hidden_size=32, num_layers=layers, num_heads=2, linear_heads=4, window_size=8,
                   steps=STEPS, batch_size=BATCH, eval_examples=8, compile=compile)
    train = generate(TASK, STEPS * BATCH, seed=1)
    losses = []
    res = train_one(name, TASK, tr, lambda s: _batch(train, slice(s * BATCH, (s + 1) * BATCH)),
                    generate(TASK, 8, seed=2), progress=lambda _n, _s, loss: losses.append(float(loss)))
    return losses, res


@pytest.mark.parametrize("name, layers", [("orthros-h", 4), ("orthros", 2)])
def test_compiled_training_matches_eager(name, layers, one_thread):
    """Per-step losses of the compiled run equal the eager run's with the same seed, data and
    schedule. Five steps: from the second on, each loss also checks the previous step's
    gradients (through AdamW's update). fp32; inductor fuses and reorders sums, so the two
    differ by float reassociation only (~1e-7 relative seen here): rtol 1e-4."""
    eager, res_e = _losses(name, False, layers)
    torch._dynamo.utils.counters.clear()
    compiled, res_c = _losses(name, True, layers)
    assert len(compiled) == STEPS and np.isfinite(compiled).all()
    np.testing.assert_allclose(compiled, eager, rtol=1e-4)
    assert len(set(eager)) > 1, "the losses move: the optimiser ran"
    # really compiled: Dynamo built graphs, and the only graph break is the attention op, which
    # layers/step.py runs outside the graph (torch.compiler.disable)
    assert res_c["compiled_graphs"] >= 2
    assert len(res_c["graph_breaks"]) == 1 and "run_attention" in res_c["graph_breaks"][0], res_c["graph_breaks"]
    assert "compiled_graphs" not in res_e
    assert res_c["acc"] == pytest.approx(res_e["acc"], abs=1 / res_e["n_queries"])


def test_compile_keeps_explicit_backend_and_maps_auto():
    assert model_backend(MQARTrain(compile=True)) == "sdpa"  # what "auto" runs on the CPU anyway
    assert model_backend(MQARTrain(compile=False)) == "auto"
    assert model_backend(MQARTrain(compile=True, attn_backend="reference")) == "reference"


@pytest.mark.parametrize("bad", ["yes", 1, None, 1.0])
def test_compile_must_be_a_bool(bad):
    with pytest.raises(ValueError, match=r"MQAR compile must be a bool .*got " + repr(bad).replace(".", r"\.")):
        run_mqar(TASK, MQARTrain(compile=bad, steps=1), progress=False, log=None)


def test_cli_compile_and_device_reach_mqar_train(monkeypatch, capsys):
    from orthros.cli import main
    from orthros.evaluation import mqar

    seen = []

    def fake_run(task, tr, progress=True, log=print, jobs=1):
        seen.append((tr, jobs))
        return {"task": {}, "train": {"window_size": tr.window_size}, "results": []}

    monkeypatch.setattr(mqar, "run_mqar", fake_run)
    assert main(["eval", "mqar", "--compile", "--no-progress"]) == 0
    assert main(["eval", "mqar", "--no-progress", "--device", "cpu", "--jobs", "3"]) == 0
    assert [(t.compile, t.device, j) for t, j in seen] == [(True, "cpu", 1), (False, "cpu", 3)]
    assert "compiled" in capsys.readouterr().out
    assert main(["eval", "mqar", "--device", "tpu"]) == 2
    assert "--device must be cpu, cuda or cuda:N, got 'tpu'" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert main(["eval", "mqar", "--device", "cuda"]) == 2
        assert "no CUDA device here" in capsys.readouterr().err
    assert len(seen) == 2, "bad input is refused before any training"


def test_hybrid_bench_mqar_compile_flag_reaches_mqar_train(monkeypatch, tmp_path):
    import json
    from pathlib import Path

    from orthros.evaluation import mqar

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "hybrid.py"
    mod = load_script(script, "hybrid_bench_script_mqar")
    seen = []

    def fake_run(task, tr, progress=True, log=print, jobs=1):
        seen.append((tr, jobs))
        return {"task": {}, "train": {"window_size": tr.window_size}, "eval_gap_stats": {}, "results": []}

    monkeypatch.setattr(mqar, "run_mqar", fake_run)
    for flags in (["--mqar-compile", "--mqar-jobs", "4"], []):
        out = tmp_path / "h.json"
        mod.main(["--tiny", "--sections", "mqar", "--families", "hybrid", *flags, "--out", str(out)])
        assert json.loads(out.read_text())["errors"] == {}
    assert [(t.compile, j) for t, j in seen] == [(True, 4), (False, 1)]

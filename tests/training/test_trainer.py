"""Training loop: learning, exact kill-and-resume, crash-safe checkpoints, 2-process FSDP2 == 1
process, packed batches isolate documents, bad input refused up front, HF Trainer works."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from bench_script import load_script
from forked_cli import run_module

# `datasets` reads the training data; it must be a dependency of the package (pyproject).
pytest.importorskip("datasets", reason="training needs the `datasets` package")

import orthros  # noqa: F401
from orthros.data import CORPUS_TRAIN
from orthros.training.checkpoint import latest_checkpoint, list_checkpoints
from orthros.training.config import ConfigError, _override_texts, load_config, resolve_key
from orthros.training.data import DataError, IGNORE, PackedStream, collate
from orthros.training.metrics import read_metrics
from orthros.training.trainer import dry_run, train

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """40 short documents cut from the embedded corpus (fast to tokenize)."""
    p = tmp_path_factory.mktemp("corpus") / "docs.jsonl"
    with open(CORPUS_TRAIN) as f, open(p, "w") as out:
        for _, line in zip(range(40), f):
            text = json.loads(line)["text"]
            out.write(json.dumps({"text": text[200:200 + 160 + 7 * len(text) % 300]}) + "\n")
    return str(p)


def tiny(out, corpus, *extra):
    """A tiny run's overrides, then ``extra``'s: a key of ``extra`` replaces the tiny run's own (an
    override given twice is refused)."""
    base = ["--output_dir", str(out), "--data.train", corpus, "--data.eval", corpus, "--eval_sequences", "4",
            "--model.hidden_size", "32", "--model.intermediate_size", "64", "--model.num_hidden_layers", "2",
            "--model.num_attention_heads", "2", "--model.window_size", "8", "--seq_len", "32",
            "--micro_batch_size", "2", "--grad_accum", "1", "--threads", "1", "--progress", "false",
            "--tensorboard", "false", "--plot", "false", "--log_every", "1", "--eval_every", "0", "--warmup_steps", "2", "--lr", "3e-3"]
    return replaced(base, *extra)


def replaced(args, *extra):
    """``args`` (overrides), then ``extra``'s: a key of ``extra`` replaces that of ``args``."""
    try:
        mine = {resolve_key(k) for k, _ in _override_texts(list(extra))}
    except ConfigError:  # a test of a bad override: kept as it is
        mine = set()
    return [a for k, v in _override_texts(list(args)) if resolve_key(k) not in mine
            for a in ([f"--{k}"] if v is None else [f"--{k}", v])] + list(extra)


def losses(out):
    """step -> loss, the last record of each step winning (a resumed run rewrites later steps)."""
    return {r["step"]: r["loss"] for r in read_metrics(str(out))}


def run_cli(args, env_extra=None, torchrun=0):
    """``python -m orthros.train ARGS`` in a process of its own: under torchrun's real launcher, or else
    forked from a server that imported torch and orthros once (``forked_cli``)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env_extra or {})}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    if not torchrun:
        return run_module("orthros.train", args, env=env, cwd=REPO)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={torchrun}",
           "-m", "orthros.train", *args]
    return subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, corpus):
    out = tmp_path_factory.mktemp("ref")
    summary = train(load_config(None, tiny(out, corpus, "--max_steps", "8", "--checkpoint.every", "4")))
    return out, losses(out), summary


def test_loss_decreases(tmp_path, corpus):
    train(load_config(None, tiny(tmp_path, corpus, "--max_steps", "40", "--checkpoint.every", "0", "--lr", "1e-2",
                                 "--micro_batch_size", "4")))
    ls = losses(tmp_path)
    first, last = sum(ls[s] for s in (1, 2, 3)) / 3, sum(ls[s] for s in (38, 39, 40)) / 3
    assert last < first - 1.0, (first, last)
    evals = read_metrics(str(tmp_path), "eval")
    assert evals and evals[-1]["eval_loss"] < first


def test_compiled_layers_train_like_eager(tmp_path, corpus):
    """``train.compile`` (torch.compile of each decoder layer, the attention op called as is)
    gives the eager loss trajectory (the op used to break Inductor's tracing)."""
    a, b = tmp_path / "eager", tmp_path / "compiled"
    train(load_config(None, tiny(a, corpus, "--max_steps", "3", "--checkpoint.every", "0")))
    train(load_config(None, tiny(b, corpus, "--max_steps", "3", "--checkpoint.every", "0", "--train.compile")))
    la, lb = losses(a), losses(b)
    assert la.keys() == lb.keys() == {1, 2, 3}
    assert all(abs(la[s] - lb[s]) < 1e-4 for s in la), (la, lb)


@pytest.mark.parametrize("arch", [("transformer",), ("swa",), ("orthros", "--model.scale_offset", "false")])
def test_every_architecture_trains_on_the_same_path(tmp_path, corpus, arch):
    s = train(load_config(None, tiny(tmp_path, corpus, "--max_steps", "3", "--model.architecture", *arch)))
    cfg = json.loads((Path(s["checkpoint"]) / "config.json").read_text())
    assert cfg["attention_mode"] == {"transformer": "full", "swa": "window", "orthros": "orthros"}[arch[0]]
    assert all(torch.isfinite(torch.tensor(v)) for v in losses(tmp_path).values())


def test_kill_and_resume_reproduces_the_trajectory_exactly(tmp_path, corpus, reference):
    _, ref, _ = reference
    r = run_cli(tiny(tmp_path, corpus, "--max_steps", "8", "--checkpoint.every", "4"),
                {"ORTHROS_TRAIN_FAULT": "after_step:6"})
    assert r.returncode == 17, r.stderr[-2000:]
    assert latest_checkpoint(str(tmp_path)).name == "step_00000004"
    assert losses(tmp_path) == {s: ref[s] for s in range(1, 7)}  # the killed run itself matched so far
    train(load_config(None, tiny(tmp_path, corpus, "--max_steps", "8", "--checkpoint.every", "4", "--resume")))
    assert losses(tmp_path) == ref  # bit-exact: steps 5..8 recomputed after resuming at 4
    assert [p.name for p in list_checkpoints(str(tmp_path))] == ["step_00000004", "step_00000008"]
    # the killed run's rows for steps 5 and 6 were dropped on resume: one row per step
    assert [r["step"] for r in read_metrics(str(tmp_path))] == list(range(1, 9))
    assert [r["step"] for r in read_metrics(str(tmp_path), "eval")] == [8]


def test_a_kill_before_the_final_eval_gets_its_eval_on_resume(tmp_path, corpus, reference):
    """The last step's checkpoint was saved before the final eval: a run killed during that eval
    resumed as finished (`done: step 8, loss -, eval_loss -`), and its final eval, which the dry
    run promises, was never logged. The last checkpoint now follows the final eval."""
    _, ref, _ = reference
    args = tiny(tmp_path, corpus, "--max_steps", "8", "--checkpoint.every", "4")
    assert run_cli(args, {"ORTHROS_TRAIN_FAULT": "after_step:8"}).returncode == 17
    assert latest_checkpoint(str(tmp_path)).name == "step_00000004"
    train(load_config(None, args))
    assert losses(tmp_path) == ref
    assert [r["step"] for r in read_metrics(str(tmp_path), "eval")] == [8]
    assert [p.name for p in list_checkpoints(str(tmp_path))] == ["step_00000004", "step_00000008"]


def test_resume_from_a_model_directory_points_to_init_from(tmp_path, corpus, reference):
    """--resume MODEL_DIR (a save_pretrained / converted model: weights, no trainer state) was
    refused as 'not a complete checkpoint (no manifest.json); it was probably interrupted while
    saving', though nothing was interrupted: it is named a model directory, with model.init_from."""
    _, _, summary = reference
    model = tmp_path / "model"
    shutil.copytree(summary["checkpoint"], model, ignore=shutil.ignore_patterns("manifest.json", "trainer_state.pt"))
    with pytest.raises(ConfigError, match=rf"checkpoint.resume: '{model}' is a model directory, not a checkpoint of a "
                                          rf"training run .* --model.init_from {model} \(--mode cpt"):
        train(load_config(None, tiny(tmp_path / "run", corpus, "--resume", str(model))))
    assert not (tmp_path / "run").exists()


def test_crash_mid_save_never_leaves_a_loadable_bad_checkpoint(tmp_path, corpus, reference):
    _, ref, _ = reference
    args = tiny(tmp_path, corpus, "--max_steps", "8", "--checkpoint.every", "2")
    r = run_cli(args, {"ORTHROS_TRAIN_FAULT": "save_mid:4"})
    assert r.returncode == 17, r.stderr[-2000:]
    root = tmp_path / "checkpoints"
    assert [p.name for p in list_checkpoints(str(tmp_path))] == ["step_00000002"]
    assert any(p.name.startswith(".tmp-step_00000004") for p in root.iterdir())  # the torn save
    # a torn directory renamed into place by hand is still not picked up, and refused if named
    torn = next(p for p in root.iterdir() if p.name.startswith(".tmp-"))
    fake = root / "step_00000004"
    shutil.copytree(torn, fake)
    assert latest_checkpoint(str(tmp_path)).name == "step_00000002"
    with pytest.raises(ConfigError, match="not a complete checkpoint"):
        train(load_config(None, replaced(args, "--resume", str(fake))))
    shutil.rmtree(fake)
    # resuming continues from step 2 and matches the uninterrupted run
    train(load_config(None, replaced(args, "--resume")))
    assert losses(tmp_path) == ref
    assert not any(p.name.startswith(".tmp-") for p in root.iterdir())
    # a complete checkpoint whose weights were altered is refused (sha256 in the manifest)
    last = latest_checkpoint(str(tmp_path))
    data = bytearray((last / "model.safetensors").read_bytes())
    data[-5] ^= 0xFF
    (last / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(ConfigError, match="sha256"):
        train(load_config(None, replaced(args, "--max_steps", "10", "--resume")))


def test_checkpoint_loads_with_from_pretrained(reference):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out, _, summary = reference
    path = summary["checkpoint"]
    model = AutoModelForCausalLM.from_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path)
    assert type(model).__name__ == "OrthrosForCausalLM" and model.config.attention_mode == "orthros"
    ids = tok("To be, or not to be", return_tensors="pt")["input_ids"]
    out_ = model(input_ids=ids, labels=ids)
    assert torch.isfinite(out_.loss)
    from safetensors.torch import load_file

    saved = load_file(str(Path(path) / "model.safetensors"))
    for k, v in saved.items():
        assert torch.equal(model.state_dict()[k], v)


def test_two_process_fsdp_matches_one_process(tmp_path, corpus):
    one, two = tmp_path / "one", tmp_path / "two"
    common = ["--max_steps", "4", "--checkpoint.every", "0"]
    train(load_config(None, tiny(one, corpus, *common, "--grad_accum", "2")))
    r = run_cli(tiny(two, corpus, "--max_steps", "4", "--checkpoint.every", "2", "--grad_accum", "1"), torchrun=2)
    assert r.returncode == 0, r.stderr[-3000:]
    l1, l2 = losses(one), losses(two)
    assert l1.keys() == l2.keys() == {1, 2, 3, 4}
    for s in l1:
        assert l2[s] == pytest.approx(l1[s], rel=2e-5, abs=2e-5), (s, l1[s], l2[s])
    e1, e2 = read_metrics(str(one), "eval")[-1], read_metrics(str(two), "eval")[-1]
    assert e2["eval_loss"] == pytest.approx(e1["eval_loss"], rel=2e-5)
    # the FSDP checkpoint is a whole model
    from transformers import AutoModelForCausalLM

    m1 = AutoModelForCausalLM.from_pretrained(str(latest_checkpoint(str(one))))
    m2 = AutoModelForCausalLM.from_pretrained(str(latest_checkpoint(str(two))))
    for (k, a), (_, b) in zip(m1.state_dict().items(), m2.state_dict().items()):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5), k
    # the 2 processes' checkpoint of step 2 resumes in 1 process (docs/training.md, "Several processes")
    resumed = tmp_path / "resumed"
    shutil.copytree(two / "checkpoints" / "step_00000002", resumed / "checkpoints" / "step_00000002")
    train(load_config(None, tiny(resumed, corpus, *common, "--grad_accum", "2", "--resume")))
    l3 = losses(resumed)
    assert l3.keys() == {3, 4}
    for s in l3:
        assert l3[s] == pytest.approx(l1[s], rel=2e-5, abs=2e-5), (s, l1[s], l3[s])


def test_sft_trains_only_on_answers(tmp_path):
    s = train(load_config(None, ["--mode", "sft", "--output_dir", str(tmp_path), "--seq_len", "96",
                                 "--model.hidden_size", "32", "--model.intermediate_size", "64",
                                 "--model.num_hidden_layers", "2", "--model.num_attention_heads", "2",
                                 "--micro_batch_size", "2", "--grad_accum", "1", "--max_steps", "3", "--threads", "1", "--progress", "false",
                                 "--tensorboard", "false", "--log_every", "1", "--eval_sequences", "2",
                                 "--encode_batch", "8"]))
    recs = read_metrics(str(tmp_path))
    assert len(recs) == 3 and all(r["targets"] > 0 for r in recs)
    # far fewer scored tokens than tokens: only answers are targets
    assert all(r["targets"] < 0.6 * 2 * 96 for r in recs)
    assert s["eval_loss"] is not None


@pytest.mark.parametrize("mode", ["orthros", "full", "window"])
def test_packed_batch_equals_documents_run_alone(mode):
    from orthros.models import OrthrosConfig, OrthrosForCausalLM

    torch.manual_seed(0)
    cfg = OrthrosConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=2, window_size=4, attention_mode=mode, use_cache=False)
    model = OrthrosForCausalLM(cfg).eval()
    with torch.no_grad():  # make scale-offset non-trivial
        for n, p in model.named_parameters():
            if p.dim() == 1 and "norm" not in n:
                p.add_(0.1 * torch.randn_like(p))
    docs = [torch.randint(0, 97, (n,)).tolist() for n in (7, 13, 3, 9)]

    class Src:
        name = spec = "t"

        def batches(self, epoch, start, batch):
            yield [(i, d) for i, d in enumerate(docs)][start:]

    rows = PackedStream(Src(), lambda rs: [(list(r), list(r)) for r in rs], 16, split_docs=True, pad_id=0).take(2)
    b = collate(rows)
    with torch.no_grad():
        packed = model(input_ids=b.input_ids, cu_seqlens=b.cu_seqlens, use_cache=False).logits[0]
        alone = torch.cat([model(input_ids=b.input_ids[:, s:e], use_cache=False).logits[0]
                           for s, e in zip(b.cu_seqlens[:-1].tolist(), b.cu_seqlens[1:].tolist())])
        assert (packed - alone).norm() / alone.norm() < 1e-5  # no attention across documents
        # and the packed loss is the token-weighted mean of the per-segment losses (no label crosses)
        loss = model(input_ids=b.input_ids, labels=b.labels, cu_seqlens=b.cu_seqlens, use_cache=False).loss
        tot, cnt = 0.0, 0
        for s, e in zip(b.cu_seqlens[:-1].tolist(), b.cu_seqlens[1:].tolist()):
            if e - s > 1:
                lab = b.labels[:, s:e]
                n = int((lab[:, 1:] != IGNORE).sum())
                tot += float(model(input_ids=b.input_ids[:, s:e], labels=lab, use_cache=False).loss) * n
                cnt += n
        assert float(loss) == pytest.approx(tot / cnt, rel=1e-5)


def test_bad_input_is_refused_before_training(tmp_path, corpus):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    with pytest.raises(ConfigError, match="output_dir .* is not writable"):
        train(load_config(None, tiny(blocker / "sub", corpus)))
    out = tmp_path / "o1"
    with pytest.raises(ConfigError, match=r"data.seq_len \(64\) is larger than the model allows"):
        train(load_config(None, tiny(out, corpus, "--seq_len", "64", "--model.max_position_embeddings", "48")))
    empty = tmp_path / "empty.jsonl"
    empty.write_text('{"text": ""}\n')
    out2 = tmp_path / "o2"
    with pytest.raises(DataError, match="produced no tokens"):
        train(load_config(None, tiny(out2, corpus, "--data.train", str(empty))))
    for o in (out, out2):  # nothing was trained or saved, not even the output directory made
        assert not o.exists()
    with pytest.raises(ConfigError, match="is not a checkpoint directory"):
        train(load_config(None, tiny(tmp_path / "o3", corpus, "--mode", "cpt", "--model.init_from",
                                     str(tmp_path / "no_such_ckpt"))))
    from transformers import LlamaConfig

    LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                num_attention_heads=2).save_pretrained(tmp_path / "llama")
    with pytest.raises(ConfigError, match="is a 'llama' model; convert it to Orthros first"):
        train(load_config(None, tiny(tmp_path / "o4", corpus, "--mode", "cpt", "--model.init_from",
                                     str(tmp_path / "llama"))))


def test_existing_checkpoints_need_resume(reference, corpus):
    out, _, _ = reference
    with pytest.raises(ConfigError, match="already holds checkpoints; pass --resume"):
        train(load_config(None, tiny(out, corpus, "--checkpoint.resume", "false")))


def test_resuming_a_finished_run_says_there_is_nothing_to_train(tmp_path, corpus, reference, capsys):
    """A run resumed at its train.max_steps trained nothing and said only "done: step 8, loss -, eval_loss -"
    (as if it had run and lost its figures); it now says the run is complete and how to go on."""
    out = tmp_path / "run"
    shutil.copytree(reference[0], out)
    before = (out / "metrics.jsonl").read_text()
    capsys.readouterr()
    summary = train(load_config(None, tiny(out, corpus, "--max_steps", "8")))
    err = capsys.readouterr().err
    assert summary["step"] == 8 and "nothing to train: the run is complete at train.max_steps 8; raise " \
        "train.max_steps (e.g. --max_steps 16) to go on" in err, err
    assert (out / "metrics.jsonl").read_text() == before
    assert "0 steps (the run is complete: raise train.max_steps to go on)" in dry_run(
        load_config(None, tiny(out, corpus, "--max_steps", "8")))


def test_resume_with_nothing_to_resume_says_why_and_how_to_start_afresh(tmp_path, corpus):
    """Was: --resume on an output_dir that does not exist (a typo) or holds no checkpoint said only
    "no complete checkpoint under DIR/checkpoints". It now says the folder does not exist (or that
    no checkpoint was saved there) and that dropping --resume starts a fresh run; nothing written."""
    missing = tmp_path / "no_such_run"
    with pytest.raises(ConfigError, match=rf"--resume: output_dir '{re.escape(str(missing))}' does not exist.*"
                                          r"drop --resume to start a fresh run"):
        train(load_config(None, tiny(missing, corpus, "--resume")))
    assert not missing.exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match=r"--resume: no checkpoint under .*checkpoints \(none was saved there\).*"
                                          r"drop --resume to start a fresh run"):
        train(load_config(None, tiny(empty, corpus, "--resume")))
    assert list(empty.iterdir()) == []


def test_cpt_from_a_checkpoint_and_switch_architecture(tmp_path, corpus, reference):
    _, ref, summary = reference
    s = train(load_config(None, tiny(tmp_path, corpus, "--mode", "cpt", "--model.init_from", summary["checkpoint"],
                                     "--max_steps", "2", "--model.architecture", "transformer")))
    cfg = json.loads((Path(s["checkpoint"]) / "config.json").read_text())
    assert cfg["attention_mode"] == "full"
    assert losses(tmp_path)[1] < ref[1] - 0.2  # starts from the trained weights, not from scratch


def test_a_cpt_run_resumes_once_its_init_from_is_gone(tmp_path, corpus, reference):
    """A resume reads the model and its tokenizer from the checkpoint it resumes, yet the cpt / sft
    run's model.init_from was read again: once that folder was gone (pruned by keep_last, moved,
    another machine) the resume was refused ("model.init_from: ... is not a checkpoint directory")."""
    init = tmp_path / "init"
    shutil.copytree(reference[2]["checkpoint"], init)
    a, b = tmp_path / "a", tmp_path / "b"
    args = ("--mode", "cpt", "--model.init_from", str(init), "--max_steps", "3", "--checkpoint.every", "2")
    train(load_config(None, tiny(a, corpus, *args)))
    shutil.copytree(a, b)
    shutil.rmtree(b / "checkpoints" / "step_00000003")  # b: a run killed after its step-2 checkpoint
    shutil.rmtree(init)
    train(load_config(None, tiny(b, corpus, *args, "--resume")))
    assert losses(b) == losses(a)


def test_hf_trainer_trains_orthros(tmp_path):
    from datasets import Dataset
    from transformers import Trainer, TrainingArguments

    from orthros.models import OrthrosConfig, OrthrosForCausalLM

    torch.manual_seed(0)
    model = OrthrosForCausalLM(OrthrosConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                             num_hidden_layers=2, num_attention_heads=2, window_size=4,
                                             use_cache=False))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    g = torch.Generator().manual_seed(1)
    rows = [torch.randint(0, 64, (24,), generator=g).tolist() for _ in range(16)]
    ds = Dataset.from_dict({"input_ids": rows, "labels": rows})
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=4, per_device_train_batch_size=4,
                             learning_rate=3e-3, logging_steps=1, save_strategy="no", report_to=[], use_cpu=True,
                             dataloader_num_workers=0, disable_tqdm=True)
    result = Trainer(model=model, args=args, train_dataset=ds).train()
    assert result.global_step == 4 and torch.isfinite(torch.tensor(result.training_loss))
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_bf16_autocast_step(tmp_path, corpus):
    """bf16 autocast (the CUDA default) on CPU: same loop, finite losses."""
    train(load_config(None, tiny(tmp_path, corpus, "--max_steps", "2", "--train.precision", "bf16")))
    assert all(torch.isfinite(torch.tensor(v)) for v in losses(tmp_path).values())


def test_cli_trains_on_the_embedded_defaults(tmp_path, capsys):
    """`orthros train` with no data/tokenizer keys uses the shipped corpus and tokenizer."""
    from orthros.training.cli import main as cli_main

    rc = cli_main(["--output_dir", str(tmp_path), "--max_steps", "2", "--seq_len", "64", "--grad_accum", "1",
                   "--model.hidden_size", "32", "--model.intermediate_size", "64", "--model.num_hidden_layers", "1",
                   "--model.num_attention_heads", "2", "--eval_sequences", "2", "--threads", "1",
                   "--progress", "false", "--tensorboard", "false", "--log_every", "1"])
    assert rc == 0
    assert sorted(losses(tmp_path)) == [1, 2]
    assert (tmp_path / "checkpoints" / "step_00000002" / "tokenizer.json").is_file()


def test_activation_checkpointing_gives_the_same_losses(tmp_path, corpus, reference):
    _, ref, _ = reference
    train(load_config(None, tiny(tmp_path, corpus, "--max_steps", "3", "--checkpoint.every", "0",
                                 "--train.activation_checkpointing", "true")))
    got = losses(tmp_path)
    for s in (1, 2, 3):  # same computation, recomputed in the backward pass
        assert got[s] == pytest.approx(ref[s], rel=1e-6)


def test_throughput_benchmark_runs_on_cpu(capsys):
    mod = load_script(REPO / "benchmarks" / "train_throughput.py", "train_throughput")
    assert mod.main(["--shape", "tiny", "--device", "cpu", "--dtype", "fp32", "--steps", "1", "--warmup", "0",
                     "--seq-len", "32", "--micro-batch", "1", "--arch", "orthros", "transformer"]) == 0
    lines = [json.loads(l) for l in capsys.readouterr().out.splitlines() if l.startswith("{")]
    assert [l.get("arch") for l in lines[:2]] == ["orthros", "transformer"]
    assert all(l["tokens_per_s"] > 0 and l["model_tflops_per_step"] > 0 for l in lines[:2])
    assert lines[2]["summary"] == "orthros_vs_transformer"
    # Orthros' model FLOPs exceed the Transformer's (doubled tokens through the linear layers)
    assert lines[0]["model_tflops_per_step"] > lines[1]["model_tflops_per_step"]


def _rehash(ckpt_dir: Path, name: str) -> None:
    """Update the manifest entry of a file a test rewrote (so only the file's content is at issue)."""
    import hashlib

    m = json.loads((ckpt_dir / "manifest.json").read_text())
    data = (ckpt_dir / name).read_bytes()
    m["files"][name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (ckpt_dir / "manifest.json").write_text(json.dumps(m))


def test_checkpoints_generate_with_the_kv_cache(reference):
    """Issue 17 #2: checkpoints saved use_cache=false, so transformers' generate() ran uncached."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    _, _, summary = reference
    path = Path(summary["checkpoint"])
    assert json.loads((path / "config.json").read_text()).get("use_cache", True) is True
    assert GenerationConfig.from_pretrained(path).use_cache is True
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    assert model.config.use_cache is True and model.generation_config.use_cache is True
    ids = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12, 13, 14]])
    out = model.generate(ids, max_new_tokens=4, do_sample=False, return_dict_in_generate=True, use_engine=False)
    assert out.past_key_values is not None  # the cache was on by default
    plain = model.generate(ids, max_new_tokens=4, do_sample=False, use_cache=False, use_engine=False)
    assert torch.equal(out.sequences, plain)


def test_trainer_state_loads_weights_only(reference):
    """Issue 17 #8: the optimizer, scheduler, RNG and data state load with weights_only=True."""
    _, _, summary = reference
    st = torch.load(Path(summary["checkpoint"]) / "trainer_state.pt", weights_only=True)
    assert st["format"] == 2 and st["step"] == 8
    assert set(st) >= {"optimizer", "scheduler", "rng", "data", "tokens_seen", "world_size"}
    assert isinstance(st["rng"][0]["numpy"]["key"], torch.Tensor)


def test_old_pickled_trainer_state_is_refused(tmp_path, corpus, reference):
    import numpy as np

    _, _, summary = reference
    out = tmp_path / "old"
    shutil.copytree(Path(summary["checkpoint"]).parents[1], out)
    last = latest_checkpoint(str(out))
    st = torch.load(last / "trainer_state.pt", weights_only=True)
    st.pop("format")
    st["rng"][0]["numpy"] = np.random.get_state()  # what the old format held: numpy arrays
    torch.save(st, last / "trainer_state.pt")
    _rehash(last, "trainer_state.pt")
    with pytest.raises(ConfigError, match="old pickled format .*--mode cpt --model.init_from"):
        train(load_config(None, tiny(out, corpus, "--max_steps", "10", "--checkpoint.every", "4", "--resume")))


def test_a_corrupt_trainer_state_is_not_called_the_old_format(tmp_path, corpus, reference):
    """With checkpoint.verify false (no hashes), a trainer_state.pt of damaged bytes was refused as
    "in the old pickled format (written before 2026-12-01)": no save ever wrote it so."""
    out = tmp_path / "bad"
    shutil.copytree(Path(reference[2]["checkpoint"]).parents[1], out)
    f = latest_checkpoint(str(out)) / "trainer_state.pt"
    f.write_bytes(bytes(range(256)) * (f.stat().st_size // 256) + b"x" * (f.stat().st_size % 256))
    with pytest.raises(ConfigError, match=r"trainer_state.pt is damaged: it is no file torch.save wrote"):
        train(load_config(None, tiny(out, corpus, "--max_steps", "10", "--resume", "--checkpoint.verify", "false")))


def test_resume_refuses_a_changed_model_config(tmp_path, corpus, reference, capsys):
    """Issue 17 #7: a changed window was applied silently, a changed shape gave a traceback."""
    _, ref, summary = reference
    out = tmp_path / "run"
    shutil.copytree(Path(summary["checkpoint"]).parents[1], out)
    shutil.rmtree(out / "checkpoints" / "step_00000008")  # resume from step 4
    base = tiny(out, corpus, "--max_steps", "8", "--checkpoint.every", "4", "--resume")
    with pytest.raises(ConfigError, match=r"differs from the checkpoint's in window_size \(window_size: checkpoint "
                                          r"8, now 16\).*--checkpoint.allow_changes window_size"):
        train(load_config(None, replaced(base, "--model.window_size", "16")))
    with pytest.raises(ConfigError, match=r"differs from the checkpoint's in [^(]*hidden_size, intermediate_size[^(]* \(.*"
                                          r"hidden_size: checkpoint 32, now 48; intermediate_size: checkpoint 64, now 96"):
        train(load_config(None, replaced(base, "--model.hidden_size", "48", "--model.intermediate_size", "96")))
    # allowing a shape change does not help: refused before any work, in a dry run too, naming the weights
    reshape = ["--model.intermediate_size", "96", "--checkpoint.allow_changes", "intermediate_size"]
    says = (r"allow_changes lists intermediate_size, whose new values change the weights' shapes "
            r"\(model.layers.0.mlp.down_proj.weight: checkpoint \[32, 64\], now \[32, 96\]")
    with pytest.raises(ConfigError, match=says):
        train(load_config(None, replaced(base, *reshape)))
    from orthros.cli import main as orthros_main

    capsys.readouterr()
    assert orthros_main(["train", *replaced(base, *reshape), "--dry-run"]) == 2
    assert re.search(says, capsys.readouterr().err)
    with pytest.raises(ConfigError, match=r"allow_changes: \['windw_size'\] are not model config keys"):
        train(load_config(None, replaced(base, "--checkpoint.allow_changes", "windw_size")))
    assert latest_checkpoint(str(out)).name == "step_00000004"  # nothing was trained by the refused runs
    # an allowed change is applied, and said
    s = train(load_config(None, replaced(base, "--model.window_size", "16", "--checkpoint.allow_changes", "[window_size]")))
    assert json.loads((Path(s["checkpoint"]) / "config.json").read_text())["window_size"] == 16
    assert [r["step"] for r in read_metrics(str(out))] == list(range(1, 9))
    got = losses(out)
    assert all(got[k] == ref[k] for k in range(1, 5))


def test_drop_rows_after(tmp_path):
    from orthros.training.metrics import drop_rows_after

    p = tmp_path / "metrics.jsonl"
    rows = [{"kind": "train", "step": s} for s in range(1, 7)] + [{"kind": "eval", "step": 4}, {"note": "x"}]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"kind": "train", "st')  # torn last line
    assert drop_rows_after(str(p), 4) == 3
    kept = [json.loads(l) for l in p.read_text().splitlines()]
    assert kept == [r for r in rows if r.get("step", 0) <= 4]
    assert drop_rows_after(str(tmp_path / "none.jsonl"), 4) == 0


def test_a_fresh_start_drops_the_rows_of_a_start_killed_before_its_first_checkpoint(tmp_path, corpus):
    """metrics.jsonl keeps one row a step: the rows of an earlier start in the same output_dir that
    left no checkpoint (so this start is fresh) are dropped, not followed by steps 1, 2 again."""
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"kind": "train", "step": s, "loss": 9.0}) + "\n"
                                                    for s in (1, 2, 3)))
    train(load_config(None, tiny(tmp_path, corpus, "--max_steps", "2", "--checkpoint.every", "0")))
    rows = read_metrics(str(tmp_path))
    assert [r["step"] for r in rows] == [1, 2] and all(r["loss"] != 9.0 for r in rows)
    assert (tmp_path / "run_config.yaml").is_file() and not list(tmp_path.glob("*.tmp*"))


def test_progress_in_a_log_is_one_plain_line_a_logged_step(tmp_path, corpus, capsys):
    """stderr not a terminal (a log file, a batch job): no bar's carriage returns, a line a logged
    step; at the end the run's loss curves (train.plot)."""
    train(load_config(None, tiny(tmp_path, corpus, "--max_steps", "4", "--progress", "true", "--log_every", "2",
                                 "--eval_every", "2", "--checkpoint.every", "0", "--plot", "true")))
    err = capsys.readouterr().err
    assert "\r" not in err
    steps = [line.split()[2] for line in err.splitlines() if line.startswith("[pt/orthros] step")]
    assert steps == ["2/4", "4/4"], err
    assert "step 2: eval_loss" in err
    assert err.count("loss curves") == 1 and f"loss curves: {tmp_path / 'loss.png'}" in err
    assert f"done: step 4, loss {losses(tmp_path)[4]:.4f}, eval_loss " in err
    assert (tmp_path / "loss.png").read_bytes().startswith(b"\x89PNG")


def test_loss_png_follows_the_run_at_each_eval(tmp_path, corpus, monkeypatch):
    """train.plot: loss.png is redrawn after each eval (a run can be watched, and a crash keeps it)."""
    from orthros.training import trainer

    drawn = []
    real = trainer._plot_run
    monkeypatch.setattr(trainer, "_plot_run",
                        lambda d, say=True, **kw: (drawn.append(max(losses(d))), real(d, say, **kw))[1])
    train(load_config(None, tiny(tmp_path, corpus, "--max_steps", "4", "--eval_every", "2", "--plot", "true",
                                 "--checkpoint.every", "0")))
    assert drawn == [2, 4]  # at step 2's eval, then at the end (whose eval is the end's)
    assert (tmp_path / "loss.png").is_file()


def test_a_loss_png_that_cannot_be_written_is_refused_before_the_run(tmp_path, corpus):
    # a folder named loss.png in output_dir: the run trained to its first eval, then died in the figure's write
    (tmp_path / "loss.png").mkdir()
    with pytest.raises(ConfigError, match=r"train.plot's figure .*loss.png: is a directory .*set train.plot false"):
        train(load_config(None, tiny(tmp_path, corpus, "--max_steps", "2", "--eval_every", "1", "--plot", "true")))
    assert not (tmp_path / "metrics.jsonl").exists() and not (tmp_path / "checkpoints").exists()


def test_a_loss_png_write_that_fails_mid_run_is_said_once_and_the_run_goes_on(tmp_path, corpus, monkeypatch, capsys):
    # checked before the run, the write can still fail later (a full disk): the run went on only for PlotError
    from orthros.training import plot

    def fail(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(plot, "plot_runs", fail)
    train(load_config(None, tiny(tmp_path, corpus, "--max_steps", "3", "--eval_every", "1", "--plot", "true",
                                 "--checkpoint.every", "0")))
    err = capsys.readouterr().err
    assert err.count("no loss curves drawn: [Errno 28] No space left on device") == 2, err  # first eval, end
    assert losses(tmp_path).keys() >= {1, 2, 3}


def test_resume_or_init_from_a_run_dir_names_its_checkpoint(tmp_path, corpus, reference):
    """--resume RUN (an output_dir, not a checkpoint) was refused as a checkpoint 'probably
    interrupted while saving'; model.init_from RUN as a config.json without a model_type."""
    run, _, summary = reference
    out = tmp_path / "run"
    for where in (run, run / "checkpoints"):
        says = (rf"'{where}' is not a checkpoint but holds a training run's checkpoints: name one of them "
                rf"\(the latest: {summary['checkpoint']}\)")
        with pytest.raises(ConfigError, match="checkpoint.resume: " + says):
            train(load_config(None, tiny(out, corpus, "--max_steps", "1", "--warmup_steps", "1", "--resume", str(where))))
        with pytest.raises(ConfigError, match="model.init_from: " + says):
            train(load_config(None, tiny(out, corpus, "--max_steps", "1", "--warmup_steps", "1", "--mode", "cpt", "--model.init_from",
                                         str(where))))
    assert not out.exists()


@pytest.mark.parametrize("key, value, has", [("hidden_size", "64", "32"), ("num_hidden_layers", "3", "2"),
                                             ("qk_norm", "true", "False"), ("scale_offset", "false", "True")])
def test_init_from_refuses_shape_keys_unlike_the_checkpoint(tmp_path, corpus, reference, key, value, has):
    """model.* keys that fix the weights' shapes, set unlike the model.init_from checkpoint, were
    silently ignored (the run trained the checkpoint's shape); they are refused before any work."""
    _, _, summary = reference
    with pytest.raises(ConfigError, match=rf"(?i)model.{key} is {value}, but the checkpoint at model.init_from "
                                          rf".* has {has}; .* drop model.{key}"):
        train(load_config(None, tiny(tmp_path / "run", corpus, "--max_steps", "1", "--warmup_steps", "1", "--mode", "cpt",
                                     "--model.init_from", summary["checkpoint"], f"--model.{key}", value)))
    assert not (tmp_path / "run").exists()


def test_init_from_takes_the_keys_that_change_no_weight(tmp_path, corpus, reference):
    """window_size, max_position_embeddings, rope_theta set on a model.init_from run replace the
    checkpoint's values (they were ignored); keys left at their defaults keep the checkpoint's
    (the tiny runs' window is 8, the default 32); a bad value is refused by the model's own check."""
    _, _, summary = reference
    base = json.loads((Path(summary["checkpoint"]) / "config.json").read_text())
    s = train(load_config(None, tiny(tmp_path / "run", corpus, "--max_steps", "1", "--warmup_steps", "1", "--mode", "cpt", "--model.init_from",
                                     summary["checkpoint"], "--model.window_size", "16", "--model.rope_theta", "5e5",
                                     "--model.max_position_embeddings", "2048")))
    cfg = json.loads((Path(s["checkpoint"]) / "config.json").read_text())
    assert (cfg["window_size"], cfg["rope_parameters"]["rope_theta"], cfg["max_position_embeddings"]) == (16, 5e5, 2048)
    assert (base["window_size"], base["rope_parameters"]["rope_theta"]) == (8, 10000.0)
    args = [a for a in tiny(tmp_path / "run2", corpus) if a not in ("--model.window_size", "8")]
    s = train(load_config(None, replaced(args, "--max_steps", "1", "--warmup_steps", "1", "--mode", "cpt", "--model.init_from", summary["checkpoint"])))
    assert json.loads((Path(s["checkpoint"]) / "config.json").read_text())["window_size"] == 8
    with pytest.raises(ConfigError, match=r"^model.window_size must be an integer >= 1"):
        train(load_config(None, tiny(tmp_path / "run3", corpus, "--max_steps", "1", "--warmup_steps", "1", "--mode", "cpt",
                                     "--model.init_from", summary["checkpoint"], "--model.window_size", "-4")))
    assert not (tmp_path / "run3").exists()


@pytest.mark.parametrize("arch", ["gdn", "orthros-h", "linear-hybrid"])
def test_a_hybrid_architecture_needs_a_checkpoint_of_its_layout(tmp_path, corpus, reference, arch):
    """model.architecture gdn / orthros-h / linear-hybrid with model.init_from an Orthros checkpoint
    trained a full-attention Transformer / plain Orthros (a checkpoint's layers stay as they are)."""
    _, _, summary = reference
    with pytest.raises(ConfigError, match=rf"model.architecture '{arch}' .* but the checkpoint at model.init_from "
                                          rf".* has 2 layers of Orthros attention.* orthros, transformer or swa"):
        train(load_config(None, tiny(tmp_path / "run", corpus, "--max_steps", "1", "--warmup_steps", "1", "--mode", "cpt",
                                     "--model.init_from", summary["checkpoint"], "--model.architecture", arch)))
    assert not (tmp_path / "run").exists()


def test_resume_refuses_a_changed_optimizer_grouping(tmp_path, corpus, reference):
    """optim.scale_offset_lr_mult moved between 1 and not 1 on resume: the checkpoint's optimizer
    and scheduler have another number of parameter groups. It failed in the scheduler after a step
    had run and run_config.yaml had been rewritten (1 -> 2), or with an IndexError traceback (2 -> 1)."""
    _, _, summary = reference
    out = tmp_path / "run"
    shutil.copytree(Path(summary["checkpoint"]).parents[1], out)
    before = (out / "run_config.yaml").read_text()
    with pytest.raises(ConfigError, match=r"cannot resume from .*step_00000008: its optimizer state has 2 parameter "
                                          r"groups \(optim.scale_offset_lr_mult 1\), this config makes 3 "
                                          r"\(optim.scale_offset_lr_mult 2.0\)"):
        train(load_config(None, tiny(out, corpus, "--max_steps", "10", "--resume",
                                     "--optim.scale_offset_lr_mult", "2")))
    assert (out / "run_config.yaml").read_text() == before
    assert latest_checkpoint(str(out)).name == "step_00000008"


def test_text_sample_by_without_text_files_is_refused(tmp_path, corpus):
    """data.text_sample_by splits .txt files only: on JSON lines it was accepted and did nothing."""
    with pytest.raises(ConfigError, match=r"data.text_sample_by \('paragraph'\) splits plain-text files .* no "
                                          r"data of this run is one \(data.train '.*docs.jsonl' is read as 'json'"):
        train(load_config(None, tiny(tmp_path / "run", corpus, "--text_sample_by", "paragraph")))
    assert not (tmp_path / "run").exists()
    txt = tmp_path / "plays.txt"
    txt.write_text("\n\n".join(json.loads(line)["text"] for line in Path(corpus).read_text().splitlines()))
    from orthros.training.trainer import Trainer

    t = Trainer(load_config(None, tiny(tmp_path / "run", corpus, "--data.train", str(txt),
                                       "--text_sample_by", "paragraph")))
    assert t.stream.source.builder == "text" and not (tmp_path / "run").exists()


def test_resume_honours_changed_optimizer_keys(tmp_path, corpus, reference, capsys):
    """The checkpoint's optimizer and scheduler states carry the lr, weight decay, betas and eps
    they were made with, and loading them replaced the config's: `--optim.lr 1e-4` on resume
    trained on at the old lr, silently. An unchanged config resumes bit for bit (the kill-and-resume
    test); a changed one takes effect from the first resumed step and is reported."""
    _, _, summary = reference
    out = tmp_path / "run"
    shutil.copytree(Path(summary["checkpoint"]).parents[1], out)
    capsys.readouterr()
    train(load_config(None, tiny(out, corpus, "--max_steps", "9", "--resume", "--schedule", "constant",
                                 "--lr", "1e-4", "--weight_decay", "0.5", "--beta2", "0.9")))
    rows = {r["step"]: r for r in read_metrics(str(out))}
    assert rows[9]["lr"] == pytest.approx(1e-4)
    st = torch.load(latest_checkpoint(str(out)) / "trainer_state.pt", weights_only=True)
    g = st["optimizer"]["param_groups"][0]
    assert (g["initial_lr"], g["weight_decay"], tuple(g["betas"])) == (1e-4, 0.5, (0.9, 0.9))
    assert st["scheduler"]["base_lrs"] == [1e-4, 1e-4]
    err = capsys.readouterr().err
    assert "resuming with optim.lr = 0.0001 (checkpoint: 0.003), optim.weight_decay = 0.5 (checkpoint: 0.1), " \
           "optim.beta2 = 0.9 (checkpoint: 0.95)" in err


def test_resume_from_an_older_checkpoint_refuses_the_later_ones(tmp_path, corpus, reference):
    """--resume PATH to an older checkpoint of the same output_dir trained on beside the later
    checkpoints of the run it abandons: the run's summary named one of those as its checkpoint, a
    later --resume picked it up, and pruning kept it over the new ones (keep_last 1 deleted every
    checkpoint the resumed run saved). Refused before any work, naming them."""
    _, _, summary = reference
    out = tmp_path / "run"
    shutil.copytree(Path(summary["checkpoint"]).parents[1], out)
    before = (out / "metrics.jsonl").read_text()
    older = out / "checkpoints" / "step_00000004"
    with pytest.raises(ConfigError, match=r"output_dir .* holds checkpoints after step 4, the one resumed from "
                                          r"\(step_00000008\)"):
        train(load_config(None, tiny(out, corpus, "--max_steps", "6", "--checkpoint.every", "0", "--keep_last", "1",
                                     "--resume", str(older))))
    assert [p.name for p in list_checkpoints(str(out))] == ["step_00000004", "step_00000008"]
    assert (out / "metrics.jsonl").read_text() == before
    # into another output_dir, the same checkpoint resumes
    s = train(load_config(None, tiny(tmp_path / "other", corpus, "--max_steps", "6", "--resume", str(older))))
    assert Path(s["checkpoint"]).name == "step_00000006"


def test_python_m_orthros_train_reports_a_failure_as_orthros_train_does(tmp_path, corpus, monkeypatch, capsys):
    """`python -m orthros.train` (documented as the same as `orthros train`; torchrun's entry point)
    called the config's main only: a failure once training ran (here a diverging loss) was a
    traceback, where `orthros train` gives one line and exit code 1."""
    import runpy

    monkeypatch.setattr(sys, "argv", ["orthros.train", *tiny(tmp_path, corpus, "--max_steps", "20", "--lr", "1e30",
                                                              "--warmup_steps", "0", "--grad_clip", "0",
                                                              "--checkpoint.every", "0")])
    with pytest.raises(SystemExit) as e:
        runpy.run_module("orthros.train", run_name="__main__")
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 1, err[-5:]
    assert err[-1].startswith("orthros train: error: FloatingPointError: "), err[-3:]  # (the loss or the gradient)


def test_tokens_per_s_counts_training_time_only(tmp_path, corpus, monkeypatch):
    """tokens/s (and MFU) of a logged step took the time of the evals and checkpoint saves in its
    window for training time: here a step 'takes' 1 s, an eval or a save 100 s (a fake clock)."""
    from orthros.training import trainer

    clock = [0.0]
    monkeypatch.setattr(trainer.time, "perf_counter", lambda: clock[0])

    def taking(seconds, f):
        def g(*a, **k):
            clock[0] += seconds
            return f(*a, **k)
        return g

    for name, seconds in (("train_step", 1.0), ("evaluate", 100.0), ("save", 100.0)):
        monkeypatch.setattr(trainer.Trainer, name, taking(seconds, getattr(trainer.Trainer, name)))
    train(load_config(None, tiny(tmp_path, corpus, "--max_steps", "6", "--log_every", "3", "--eval_every", "2",
                                 "--checkpoint.every", "1")))
    rows = read_metrics(str(tmp_path))
    assert [r["step"] for r in rows] == [3, 6]
    assert [r["tokens_per_s"] for r in rows] == [3 * 64 / 3.0] * 2  # 3 steps of 2 rows x 32 tokens, 3 s


def test_a_bad_record_met_while_training_is_a_failure_while_working(tmp_path, capsys):
    """Bad data the checks before the run did not read (they read the first documents) stopped a
    run that had trained and saved with exit code 2, which says 'refused before any work', and
    without naming the record; it is exit code 1, naming the step and the record's row."""
    from orthros.cli import main

    good = {"messages": [{"role": "user", "content": "Hail!"}, {"role": "assistant", "content": "Well met."}]}
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in [good] * 4 + [{"messages": []}]))
    rc = main(["train", "--mode", "sft", "--output_dir", str(tmp_path / "run"), "--data.train", str(data),
               "--data.eval", "null", "--data.shuffle", "false", "--encode_batch", "2", "--seq_len", "32",
               "--grad_accum", "1", "--model.hidden_size", "32", "--model.intermediate_size", "64",
               "--model.num_hidden_layers", "1", "--model.num_attention_heads", "2", "--max_steps", "10",
               "--threads", "1", "--progress", "false", "--tensorboard", "false", "--plot", "false"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1, err[-3:]
    assert re.match(r"orthros train: error: RuntimeError: at step [2-9]: data.train, row 4 \(from 0\): an SFT "
                    r"example's messages must be a non-empty list", err[-1]), err[-3:]


def test_a_missing_file_met_while_training_is_a_failure_while_working(tmp_path, corpus, monkeypatch, capsys):
    """A file gone while the run works (a data file deleted mid-stream, a folder removed under a
    checkpoint save) raised FileNotFoundError, which `orthros` reads as a path given wrong: exit code
    2, 'refused before any work', after steps had run. It is exit code 1, naming the step."""
    from orthros.cli import main
    from orthros.training import trainer

    def gone(self, *a, **k):
        raise FileNotFoundError(2, "No such file or directory", str(tmp_path / "run" / "vanished"))

    monkeypatch.setattr(trainer.Trainer, "save", gone)
    rc = main(["train", *tiny(tmp_path / "run", corpus, "--max_steps", "3", "--checkpoint.every", "2")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1, err[-3:]
    assert re.match(r"orthros train: error: RuntimeError: at step [23]: \[Errno 2\] No such file or directory: "
                    r".*vanished", err[-1]), err[-3:]


def test_resume_on_other_data_reads_it_from_its_start(tmp_path, corpus, reference, capsys):
    """The checkpoint's data position (epoch, document of the seeded order, token offset) was
    applied to whatever data the resumed config names: on another data.train it pointed into
    other documents, and an offset past the end of one failed with a bare StopIteration traceback.
    A resume whose data keys differ from the checkpoint's run_config.yaml reads its data from
    the start, and says so."""
    from orthros.training.data import build_stream
    from orthros.training.trainer import load_tokenizer

    _, _, summary = reference
    other = tmp_path / "one_token_docs.jsonl"
    other.write_text("".join(json.dumps({"text": w}) + "\n" for w in ("a", "b", "c", "d") * 10))
    capsys.readouterr()
    args = tiny(tmp_path / "run", corpus, "--data.train", str(other), "--max_steps", "9", "--resume",
                summary["checkpoint"])
    s = train(load_config(None, args))
    cfg = load_config(None, args)
    fresh = build_stream(cfg, load_tokenizer(cfg))
    fresh.take(2)  # one step of 2 rows
    st = torch.load(Path(s["checkpoint"]) / "trainer_state.pt", weights_only=True)
    assert st["data"] == fresh.state_dict()
    assert f"resuming with data.train = '{other}' (checkpoint: '{corpus}'): the data is read from its start" \
        in capsys.readouterr().err


def test_resume_past_max_steps_is_refused(tmp_path, corpus, reference):
    """A resume from step 8 with train.max_steps 4 trained nothing, said `done: step 8`, and
    rewrote run_config.yaml with max_steps 4 beside a step-8 checkpoint. Refused before any work."""
    _, _, summary = reference
    out = tmp_path / "run"
    shutil.copytree(Path(summary["checkpoint"]).parents[1], out)
    before = (out / "run_config.yaml").read_text()
    with pytest.raises(ConfigError, match=r"train.max_steps \(4\) is below step 8, that of the checkpoint"):
        train(load_config(None, tiny(out, corpus, "--max_steps", "4")))
    assert (out / "run_config.yaml").read_text() == before


def test_init_from_without_complete_weights_is_refused_before_any_work(tmp_path, corpus, reference, capsys):
    """model.init_from a directory with config.json but no weight file failed after the preflight
    with a bare OSError (exit 1), and --dry-run passed it; a truncated model.safetensors passed the
    dry-run too. Both refused up front, naming the key (exit 2, nothing written)."""
    from orthros.cli import main as orthros_main

    _, _, summary = reference
    ck = tmp_path / "ck"
    shutil.copytree(summary["checkpoint"], ck)
    (ck / "model.safetensors").unlink()
    trunc = tmp_path / "trunc"
    shutil.copytree(summary["checkpoint"], trunc)
    with open(trunc / "model.safetensors", "r+b") as f:
        f.truncate(1000)
    for src, says in ((ck, "holds no weights"), (trunc, "truncated")):
        for dry in ([], ["--dry-run"]):
            capsys.readouterr()
            rc = orthros_main(["train", *tiny(tmp_path / "out", corpus, "--mode", "cpt", "--model.init_from",
                                              str(src)), *dry])
            err = capsys.readouterr().err
            assert rc == 2 and f"model.init_from: " in err and says in err, err
    assert not (tmp_path / "out").exists()


def test_resume_with_a_changed_shape_does_not_suggest_allow_changes(tmp_path, corpus, reference):
    """A resume whose model config changes the weights' shapes was told to pass --checkpoint.allow_changes
    with those keys, which is then refused in turn: it is told the change cannot be made on resume."""
    _, _, summary = reference
    out = tmp_path / "run"
    shutil.copytree(Path(summary["checkpoint"]).parents[1], out)
    with pytest.raises(ConfigError) as e:
        train(load_config(None, tiny(out, corpus, "--max_steps", "9", "--model.hidden_size", "48")))
    msg = str(e.value)
    assert "hidden_size: checkpoint 32, now 48" in msg and "--checkpoint.allow_changes" not in msg, msg
    assert "changes the weights' shapes (" in msg and "another output_dir" in msg, msg


@pytest.mark.parametrize("manifest", ["{}", "[]", '{"step": 4}', '{"step": "4", "files": {}}',
                                      '{"step": 4, "files": {"model.safetensors": 5}}',
                                      '{"step": 4, "files": {"model.safetensors": {"size": 1}}}'])
def test_a_manifest_of_the_wrong_shape_is_a_checkpoint_error(tmp_path, manifest):
    """A manifest.json that parses but is not {step, files: {name: {size, sha256}}} failed with a
    bare KeyError / TypeError traceback where a resume names the checkpoint as corrupt."""
    from orthros.training.checkpoint import CheckpointError, verify

    (tmp_path / "model.safetensors").write_bytes(b"x")
    (tmp_path / "manifest.json").write_text(manifest)
    with pytest.raises(CheckpointError, match="manifest.json is corrupt"):
        verify(tmp_path)


def test_a_manifest_that_leaves_the_weights_out_is_a_checkpoint_error(tmp_path, reference):
    """A manifest of no files ('files': {}), or one that left the weights out, passed verify (`orthros
    info --verify`: 'all 0 files match') though it vouches for nothing of the model."""
    import json

    from orthros.training.checkpoint import CheckpointError, verify

    _, _, summary = reference
    ck = tmp_path / "ck"
    shutil.copytree(summary["checkpoint"], ck)
    good = json.loads((ck / "manifest.json").read_text())
    assert verify(ck)["files"] == good["files"]  # the save's own manifest passes
    for name, missing in (("none", "config.json, model.safetensors"), ("model.safetensors", "model.safetensors")):
        files = {} if name == "none" else {k: v for k, v in good["files"].items() if k != name}
        (ck / "manifest.json").write_text(json.dumps({"step": good["step"], "files": files}))
        with pytest.raises(CheckpointError, match=f"manifest.json is corrupt: it does not list {missing}"):
            verify(ck, hashes=False)


def test_a_tokenizer_file_is_not_said_to_be_missing(tmp_path, corpus, reference, monkeypatch):
    """data.tokenizer naming a file (the checkpoint's tokenizer.json, a YAML) was reported as 'does not
    exist (no such local path ...)' or 'is not a local path' (a hub name): it names the file and its folder."""
    _, _, summary = reference
    f = Path(summary["checkpoint"]) / "tokenizer.json"
    other = tmp_path / "tok.yaml"
    other.write_text("x: 1\n")
    for path in (f, other):
        with pytest.raises(ConfigError, match=rf"data.tokenizer: '{re.escape(str(path))}' is a file, not a "
                                              rf"tokenizer directory \(the folder that holds it: "
                                              rf"{re.escape(str(path.parent))}\)"):
            train(load_config(None, tiny(tmp_path / "out", corpus, "--data.tokenizer", str(path))))
    assert not (tmp_path / "out").exists()
    weights = Path(summary["checkpoint"]) / "model.safetensors"  # 'dir/file' reads as a hub name 'owner/name'
    with pytest.raises(ConfigError, match=rf"model.init_from: '{re.escape(str(weights))}' is a file, not a "
                                          rf"checkpoint directory \(the folder that holds it: "):
        train(load_config(None, tiny(tmp_path / "out", corpus, "--mode", "cpt", "--model.init_from", str(weights))))
    monkeypatch.chdir(weights.parents[1])
    with pytest.raises(ConfigError, match=r"model.init_from: 'step_00000008/model.safetensors' is a file"):
        train(load_config(None, tiny(tmp_path / "out", corpus, "--mode", "cpt", "--model.init_from",
                                     "step_00000008/model.safetensors")))


@pytest.mark.parametrize("env, says", [
    ({"RANK": "1"}, "RANK is 1, outside [0, WORLD_SIZE = 1)"),  # was: 'input_ids must hold at least one token'
    ({"WORLD_SIZE": "2", "RANK": "5", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}, "RANK is 5, outside"),
    ({"WORLD_SIZE": "abc"}, "WORLD_SIZE is 'abc': not an integer >= 1"),
    ({"WORLD_SIZE": "0"}, "WORLD_SIZE is '0': not an integer >= 1"),
    ({"WORLD_SIZE": "2"}, "WORLD_SIZE is 2 but RANK, MASTER_ADDR, MASTER_PORT are not set"),
])
def test_a_bad_launch_environment_is_refused_before_any_work(tmp_path, corpus, monkeypatch, env, says):
    """torchrun's variables, set by hand or left over, were read as they came: RANK past WORLD_SIZE
    trained on no rows (a bare 'input_ids must hold at least one token' after output_dir was made),
    WORLD_SIZE abc was int()'s message, and WORLD_SIZE 2 alone was torch's rendezvous error."""
    for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    out = tmp_path / "run"
    with pytest.raises(ConfigError, match=re.escape(says)) as e:
        train(load_config(None, tiny(out, corpus, "--max_steps", "2")))
    assert "torchrun" in str(e.value)
    assert not out.exists()


def test_processes_started_with_different_configs_are_refused(tmp_path, corpus):
    """Each process reads its own config: one of another optim.lr (or seed, max_steps...) trained its
    shard of the weights with it, silently (or died in a mismatched collective at the end). The
    processes compare their configs and resume points before any work."""
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    args = " ".join(tiny(out, corpus, "--max_steps", "2", "--optim.lr", '"0.00$((RANK + 1))"'))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "--no-python",
           "sh", "-c", f'exec "{sys.executable}" -m orthros.train {args}']
    r = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert r.returncode != 0, r.stderr[-3000:]
    assert "the processes of this run were started with different settings: optim.lr (rank 0: 0.001, rank 1: " \
           "0.002)" in r.stderr, r.stderr[-3000:]
    assert not out.exists()


def test_under_torchrun_an_error_line_goes_to_stderr_in_one_write(tmp_path, monkeypatch):
    """torchrun's processes share one stderr, and each refuses a bad config (every process checks it):
    print's text and its newline were two writes on Python's unbuffered stderr, so two processes'
    lines interleaved mid-line ('... under run/checkpointsorthros train: error: ...'). Under torchrun
    a line of stderr goes out in one write."""
    import io

    from orthros.training.cli import main as cli_main

    class Writes(io.RawIOBase):  # stderr's buffer: a FileIO, one write(2) a call
        def __init__(self):
            self.chunks = []

        def writable(self):
            return True

        def write(self, b):
            self.chunks.append(bytes(b))
            return len(b)

    raw = Writes()
    monkeypatch.setattr(sys, "stderr", io.TextIOWrapper(raw, encoding="utf-8", write_through=True))
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert cli_main(["--output_dir", str(tmp_path / "run"), "--max_stepz", "2"]) == 2
    sys.stderr.flush()
    assert raw.chunks and all(c.endswith(b"\n") for c in raw.chunks), raw.chunks
    assert b"".join(raw.chunks).startswith(b"orthros train: error: unknown config key 'max_stepz'")


def test_a_resume_with_another_global_batch_says_so(tmp_path, corpus, capsys):
    """A checkpoint of N processes resumes in M (docs), and the global batch (micro-batch x grad_accum
    x processes) then changed without a word: 2 GPUs' run resumed on 1 trained on half the batch.
    The run says so, and which grad_accum keeps it."""
    train(load_config(None, tiny(tmp_path, corpus, "--max_steps", "2", "--micro_batch_size", "1", "--grad_accum", "4")))
    capsys.readouterr()
    train(load_config(None, tiny(tmp_path, corpus, "--max_steps", "3", "--micro_batch_size", "1", "--grad_accum", "2")))
    assert ("resuming with a global batch of 2 sequences (micro-batch 1 x grad_accum 2 x 1 process); the checkpoint's "
            "global batch was 4 sequences (micro-batch 1 x grad_accum 4 x 1 process): --grad_accum 4 keeps it"
            ) in capsys.readouterr().err
    train(load_config(None, tiny(tmp_path, corpus, "--max_steps", "4", "--micro_batch_size", "1", "--grad_accum", "2")))
    assert "global batch" not in capsys.readouterr().err  # the same batch: nothing said


@pytest.mark.parametrize("train_spec, out, says", [
    ("data", "data/run", "is inside data.train 'data'"),
    ("data", "data", "is data.train 'data'"),
    ("data/docs.jsonl", "data", "holds data.train 'data/docs.jsonl'"),
    ("data/**/*.jsonl", "data/run", r"is inside data.train 'data/\*\*/\*.jsonl'"),
    ("data/r*/*", "data/run", r"is inside data.train 'data/r\*/\*'"),
    (["data/docs.jsonl", "data"], "data/a/b", "is inside data.train 'data'"),
])
def test_an_output_dir_that_overlaps_the_data_is_refused(tmp_path, corpus, monkeypatch, train_spec, out, says):
    """An output_dir inside a data.train folder (or holding its files) made the run read its own files as
    training data: a second start (a resume) read metrics.jsonl and the checkpoints' JSON files too,
    and failed on their columns (or trained on them). Refused before any work, naming both keys."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    shutil.copy(corpus, tmp_path / "data" / "docs.jsonl")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    spec = train_spec if isinstance(train_spec, str) else "[" + ",".join(train_spec) + "]"
    with pytest.raises(ConfigError, match=f"output_dir '{out}' {says}: the run would read its own files"):
        train(load_config(None, tiny(out, corpus, "--data.train", spec)))
    with pytest.raises(ConfigError, match=f"output_dir 'data/x' is inside data.eval 'data'"):
        train(load_config(None, tiny("data/x", corpus, "--data.eval", "data")))
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before  # nothing written


@pytest.mark.parametrize("train_spec", ["data/*.jsonl", "data/*", "data/x*/*"])
def test_a_glob_that_cannot_reach_the_output_dir_is_accepted(tmp_path, corpus, monkeypatch, train_spec):
    """Files matched at one level only (data/*.jsonl) never include output_dir's: no refusal."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data" / "xs").mkdir(parents=True)
    shutil.copy(corpus, tmp_path / "data" / "docs.jsonl")
    shutil.copy(corpus, tmp_path / "data" / "xs" / "docs.jsonl")
    from orthros.training.trainer import dry_run

    assert "every check passed" in dry_run(load_config(None, tiny("data/run", corpus, "--data.train", train_spec)))


@pytest.mark.parametrize("fault, code, says", [
    ("save_mid:4:SIGTERM", 143, "terminated (SIGTERM)"),  # a scheduler's preemption, mid-save
    ("after_step:3:SIGINT", 130, "interrupted"),  # Ctrl-C between two steps
])
def test_sigterm_or_ctrl_c_stops_the_run_cleanly(tmp_path, corpus, reference, fault, code, says):
    """SIGTERM (a scheduler preempting the job, torchrun stopping its workers) killed a run where it
    stood, without a word, and a save it cut short left its .tmp- folder; it now stops as Ctrl-C does:
    one line naming the checkpoint to go on from, exit 143 (Ctrl-C 130), no half-written checkpoint,
    and --resume goes on as the uninterrupted run."""
    _, ref, _ = reference
    args = tiny(tmp_path, corpus, "--max_steps", "8", "--checkpoint.every", "2")
    r = run_cli(args, {"ORTHROS_TRAIN_FAULT": fault})
    assert r.returncode == code, r.stderr[-2000:]
    last = tmp_path / "checkpoints" / "step_00000002"
    assert f"orthros train: {says}; the latest checkpoint is {last}: --resume goes on from it" in r.stderr
    assert "Traceback" not in r.stderr
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step_00000002"]  # no .tmp- left
    train(load_config(None, replaced(args, "--resume")))
    assert losses(tmp_path) == ref


@pytest.mark.skipif(sys.platform == "win32", reason="the output_dir lock is an flock (POSIX)")
def test_a_second_run_into_an_output_dir_in_use_is_refused(tmp_path, corpus, reference):
    """Two runs into one output_dir (a job started twice, a relaunch while the first still runs) both
    trained: each one's save deleted the other's .tmp- folder mid-write (a crash with a bare ENOENT) and
    both wrote metrics.jsonl. A run now holds output_dir's lock; a second one is refused before any work,
    naming the process, and the lock is free again once the first run ends, however it ended."""
    import fcntl

    from orthros.training.trainer import LOCK, dry_run, lock_output_dir

    _, ref, _ = reference
    args = tiny(tmp_path, corpus, "--max_steps", "8", "--checkpoint.every", "4")
    tmp_path.mkdir(exist_ok=True)
    other = open(tmp_path / LOCK, "a+")  # the first run (an flock is per open file: this process conflicts too)
    fcntl.flock(other, fcntl.LOCK_EX)
    other.write("4242\n")
    other.flush()
    for attempt in (lambda c: train(c), lambda c: dry_run(c)):
        with pytest.raises(ConfigError, match=r"output_dir .* is in use by another training run \(process 4242\)"):
            attempt(load_config(None, args))
    with pytest.raises(ConfigError, match="in use"):  # taken between the other's checks and its start
        lock_output_dir(str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == [LOCK]  # nothing written
    other.close()  # the first run ends
    from orthros.training.trainer import check_output_dir_free

    with open(tmp_path / LOCK) as peer:  # another process's preflight at the same moment (a torchrun's ranks
        fcntl.flock(peer, fcntl.LOCK_SH)  # resuming, a --dry-run beside a starting run): not a run in the way
        check_output_dir_free(str(tmp_path))  # was refused as "in use by another training run"
    train(load_config(None, args))
    assert losses(tmp_path) == ref
    with open(tmp_path / LOCK, "a+") as fh:  # released when the run ended
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_a_resume_with_another_schedule_says_where_its_lr_goes(tmp_path, corpus, reference, capsys):
    """Extending a finished cosine run (--max_steps 8 -> 16) puts its learning rate back up from
    min_lr_ratio x lr to the new schedule's, without a word (a changed optim.lr was said, the schedule
    keys were not): the resume now names the keys and the lr of its first step under both schedules."""
    from orthros.training.optim import lr_multiplier

    _, _, summary = reference
    out = tmp_path / "run"
    shutil.copytree(Path(summary["checkpoint"]).parents[1], out)
    new, old = (3e-3 * lr_multiplier(8, total_steps=n, warmup_steps=2, min_lr_ratio=0.1) for n in (10, 8))
    said = (f"train.max_steps = 10 (checkpoint: 8): step 9 trains at lr {new:.4g} (the checkpoint's "
            f"schedule: {old:.4g})")
    # --dry-run, run first to check the resume, says it too (it said nothing of the lr going back up)
    assert f"  changes      {said}" in dry_run(load_config(None, tiny(out, corpus, "--max_steps", "10", "--resume")))
    capsys.readouterr()
    train(load_config(None, tiny(out, corpus, "--max_steps", "10", "--resume")))
    assert {r["step"]: r["lr"] for r in read_metrics(str(out))}[9] == pytest.approx(new)
    assert f"resuming with {said}" in capsys.readouterr().err
    train(load_config(None, tiny(out, corpus, "--max_steps", "10", "--resume")))  # unchanged: no word
    assert "resuming with" not in capsys.readouterr().err


@pytest.mark.parametrize("key, value, says", [
    ("train.log_every", 0, "train.log_every must be > 0, got 0"),  # was a ZeroDivisionError at step 1
    ("optim.lr", -5.0, "optim.lr must be > 0, got -5.0"),  # was a bare ValueError once the model was built
    ("train.max_steps", "ten", "config key 'train.max_steps' expects int, got 'ten'"),
])
def test_a_run_config_built_in_python_gets_the_checks_of_load_config(tmp_path, corpus, key, value, says):
    """train(cfg) with a RunConfig built or changed in Python skipped load_config's checks: a bad
    value failed once the run had started (output_dir, metrics.jsonl and run_config.yaml written),
    and a pathlib.Path output_dir failed writing run_config.yaml. Now refused before any work, naming
    the key; a Path is taken as its text."""
    def config(out):  # load_config's, then changed in Python
        return load_config(None, tiny(out, corpus, "--max_steps", "2", "--checkpoint.every", "0"))

    bad = config(tmp_path / "bad")
    sec, leaf = key.split(".")
    setattr(getattr(bad, sec), leaf, value)
    with pytest.raises(ConfigError, match=re.escape(says)):
        train(bad)
    assert not (tmp_path / "bad").exists()
    good = config(tmp_path / "good")
    good.output_dir = tmp_path / "good"  # a Path
    assert train(good)["step"] == 2
    assert (tmp_path / "good" / "run_config.yaml").read_text().startswith("mode: pt\noutput_dir: " + str(tmp_path))


def test_a_damaged_latest_checkpoint_names_the_one_to_go_on_from(tmp_path, corpus, reference):
    """A run whose newest checkpoint was damaged (a disk error, a copy cut short) was refused with the
    damage only; going on from the one before needs the damaged one moved away (--resume PATH to the
    older one is refused while a later one is there), which the error now says, naming both."""
    _, _, summary = reference
    out = tmp_path / "run"
    shutil.copytree(Path(summary["checkpoint"]).parents[1], out)
    last, before = out / "checkpoints" / "step_00000008", out / "checkpoints" / "step_00000004"
    with open(last / "model.safetensors", "r+b") as f:
        f.truncate(100)
    args = tiny(out, corpus, "--max_steps", "8", "--checkpoint.every", "4")
    with pytest.raises(ConfigError, match=re.escape(
            f"model.safetensors has 100 bytes, manifest says {(Path(summary['checkpoint']) / 'model.safetensors').stat().st_size}. "
            f"To go on from the checkpoint before it ({before}), move {last} (and any later one) out of {last.parent}")):
        train(load_config(None, args))
    shutil.move(last, tmp_path / "damaged")
    assert train(load_config(None, args))["step"] == 8


def test_a_checkpoint_without_its_manifest_is_named_as_incomplete(tmp_path, corpus, reference):
    """A checkpoint folder whose manifest.json is gone: --resume (or the default, auto) took the
    complete one before it and refused as if the damaged one were another run's ("they belong to
    the run that went on from it"); with no complete one at all, auto started afresh over them
    and --resume said only "no complete checkpoint". Each now names the folder as incomplete
    (no manifest.json) and says what to do, before anything is written."""
    _, _, summary = reference
    out = tmp_path / "run"
    shutil.copytree(Path(summary["checkpoint"]).parents[1], out)
    root = out / "checkpoints"
    (root / "step_00000008" / "manifest.json").unlink()
    before = (out / "metrics.jsonl").read_text()
    base = tiny(out, corpus, "--max_steps", "10", "--checkpoint.every", "2")
    for extra in (["--resume"], []):
        with pytest.raises(ConfigError, match=r"cannot resume from .*step_00000004 \(step 4\): step_00000008 has no "
                                              r"manifest.json \(incomplete or damaged.*move the later folders "
                                              r"\(step_00000008\) out of .*; or start a fresh run") as e:
            train(load_config(None, replaced(base, *extra)))
        assert "belong to the run" not in str(e.value)
    # naming the damaged one: its own error, and where to go on from
    with pytest.raises(ConfigError, match=r"not a complete checkpoint \(no manifest.json\).*the checkpoint before it "
                                          r"\(.*step_00000004\)"):
        train(load_config(None, replaced(base, "--resume", str(root / "step_00000008"))))
    # none complete: neither a resume nor a fresh start over them
    (root / "step_00000004" / "manifest.json").unlink()
    # (resume false said "pass --resume to continue the run", which then refused)
    for extra, who in ((["--resume"], "--resume"), ([], "output_dir"), (["--checkpoint.resume", "false"], "output_dir")):
        with pytest.raises(ConfigError, match=rf"{who}.*no complete checkpoint under .*: step_00000004, step_00000008 "
                                              rf"have no manifest.json.*Start a fresh run in another output_dir"):
            train(load_config(None, replaced(base, *extra)))
    with pytest.raises(ConfigError, match=r"No complete checkpoint comes before it: start a fresh run"):
        train(load_config(None, replaced(base, "--resume", str(root / "step_00000004"))))
    assert sorted(p.name for p in root.iterdir()) == ["step_00000004", "step_00000008"]
    assert (out / "metrics.jsonl").read_text() == before

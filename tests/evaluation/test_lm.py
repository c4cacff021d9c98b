"""lm-evaluation-harness integration, offline: the shipped local task on a tiny random model."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

lm_eval = pytest.importorskip("lm_eval")
pytest.importorskip("accelerate")

from conftest import checkpoint_missing  # noqa: E402
from orthros.evaluation.common import LM_TASKS_DIR, make_tiny_checkpoint  # noqa: E402

# tiny models: one torch thread each (2 per xdist worker on 2 cores ran several times slower)
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("lm") / "ckpt", max_position_embeddings=256)


def test_local_task_end_to_end(tiny):
    from orthros.evaluation.lm import run_lm_eval, summary

    res = run_lm_eval(tiny, ["orthros_tiny_cloze"], limit=4, device="cpu")
    r = summary(res)["results"]["orthros_tiny_cloze"]
    assert 0.0 <= r["acc,none"] <= 1.0 and 0.0 <= r["acc_norm,none"] <= 1.0
    json.dumps(summary(res))


def test_loglikelihood_uses_output_stream_at_every_position(tiny):
    """lm-eval's loglikelihood equals the sum of log-probs from prefills of each prefix (the
    output stream at the prefix's last token), not some base-stream shortcut."""
    import orthros  # noqa: F401
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    lm = HFLM(pretrained=str(tiny), device="cpu", batch_size=2)
    model, tok = lm.model, lm.tokenizer
    # a context longer than the window (16), so window-only logits would differ
    ctx = "The road ran along the river for a while and then turned toward the hills, and the grass was tall"
    cont = " and green."
    reqs = [Instance(request_type="loglikelihood", doc={}, arguments=(ctx, cont), idx=0)]
    ll, _greedy = lm.loglikelihood(reqs, disable_tqdm=True)[0]

    c_ids = tok(ctx, add_special_tokens=False)["input_ids"]
    whole = tok(ctx + cont, add_special_tokens=False)["input_ids"]
    n_cont = len(whole) - len(c_ids)
    assert len(c_ids) > 16 and n_cont >= 1
    want = 0.0
    with torch.no_grad():
        for t in range(len(whole) - n_cont, len(whole)):
            prefix = torch.tensor([whole[:t]])
            logits = model(input_ids=prefix, logits_to_keep=1).logits[0, -1].float()
            want += torch.log_softmax(logits, -1)[whole[t]].item()
    assert math.isclose(ll, want, rel_tol=1e-4, abs_tol=1e-4), (ll, want)


def test_unknown_task_and_bad_model_are_clear_errors(tiny, tmp_path):
    from orthros.evaluation.lm import run_lm_eval

    with pytest.raises(ValueError, match="unknown lm-eval task 'orthros_tiny_clozee'.*orthros_tiny_cloze"):
        run_lm_eval(tiny, ["orthros_tiny_clozee"])
    with pytest.raises(ValueError, match="no config.json"):
        run_lm_eval(tmp_path, ["orthros_tiny_cloze"])
    with pytest.raises(ValueError, match="include_path"):
        run_lm_eval(tiny, ["orthros_tiny_cloze"], include_path=[str(tmp_path / "nope")])
    # a task's YAML file given for the folder was taken and scanned as a folder (no task in it): its
    # task was then "unknown", the path passed without a word
    (tmp_path / "my_task.yaml").write_text("task: my_task\n")
    with pytest.raises(ValueError, match="^include_path .*my_task.yaml: not a directory"):  # the keyword
        run_lm_eval(tiny, ["my_task"], include_path=[str(tmp_path / "my_task.yaml")])


def test_the_shipped_task_alone_reads_no_yaml_of_lm_evals_registry(tiny, monkeypatch):
    """Issue: every `orthros eval lm` indexed lm-eval's whole task registry (~14,000 YAMLs, 5-10 s on 2 CPU
    cores; each refusal after the task check paid it too), also for the shipped task alone. A task of lm-eval's
    registry is still found (the registry is read when the include paths lack a task asked for)."""
    import lm_eval

    from orthros.evaluation.lm import run_lm_eval

    monkeypatch.setattr(lm_eval, "simple_evaluate", lambda model, task_manager, **kw: task_manager)
    monkeypatch.setattr("lm_eval.models.huggingface.HFLM.__init__", lambda self, *a, **kw: None)
    monkeypatch.setattr("orthros.evaluation.lm.model_record", lambda *a: {})
    tm = run_lm_eval(tiny, [" orthros_tiny_cloze "], limit=1, device="cpu")
    assert "orthros_tiny_cloze" in tm.all_tasks and "hellaswag" not in tm.all_tasks, len(tm.all_tasks)
    tm = run_lm_eval(tiny, ["orthros_tiny_cloze", "hellaswag"], limit=1, device="cpu")
    assert {"orthros_tiny_cloze", "hellaswag"} <= set(tm.all_tasks)


def test_lm_without_accelerate_refused_before_any_work(tiny, monkeypatch):
    # lm_eval's HF model imports accelerate: missing, it was a ModuleNotFoundError (exit 1) after the model loaded
    import sys

    from orthros.evaluation import lm

    monkeypatch.setitem(sys.modules, "accelerate", None)
    monkeypatch.setattr(lm, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    with pytest.raises(ValueError, match="needs accelerate .*pip install lm_eval accelerate"):
        lm.run_lm_eval(tiny, ["orthros_tiny_cloze"])


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_short_dtype_names_reach_lm_eval(tiny, dtype, monkeypatch):
    """`--dtype bf16` (the names every orthros command takes) used to reach lm-eval's loader as is,
    which reads torch's names only (getattr(torch, "bf16") failed)."""
    import lm_eval.models.huggingface as hf

    from orthros.evaluation.lm import run_lm_eval

    seen, real = {}, hf.HFLM.__init__
    monkeypatch.setattr(hf.HFLM, "__init__", lambda self, *a, **kw: (seen.update(kw), real(self, *a, **kw))[1])
    run_lm_eval(tiny, ["orthros_tiny_cloze"], limit=2, device="cpu", dtype=dtype)
    assert seen["dtype"] == {"bf16": "bfloat16", "fp32": "float32"}[dtype]


def test_cli_lm_writes_json(tiny, tmp_path, capsys):
    from orthros.cli import main

    out = tmp_path / "lm.json"
    assert main(["eval", "lm", "--model", str(tiny), "--tasks", "orthros_tiny_cloze", "--limit", "3",
                 "--device", "cpu", "-o", str(out)]) == 0
    written = json.loads(out.read_text())
    assert "orthros_tiny_cloze" in written["results"]
    # the run's batch size and device, not lm-eval's null for arguments it was not given
    assert (written["config"]["batch_size"], written["config"]["device"]) == (1, "cpu")
    # the attention and window it ran with (a converted model's window is --window, in no lm-eval field), its dtype
    assert written["orthros"] == {"model_type": "orthros", "converted": False, "attention_mode": "orthros",
                                  "window_size": 16, "dtype": "fp32", "tokenizer": str(tiny)}
    assert main(["eval", "lm", "--model", str(tiny), "--tasks", "no_such_task"]) == 2
    assert "unknown lm-eval task" in capsys.readouterr().err


def test_plain_lm_eval_cli_with_orthros_imported(tiny, tmp_path):
    """`lm_eval --model hf --model_args pretrained=PATH`, through the wrapper that imports orthros."""
    env = dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "orthros.evaluation.harness", "--model", "hf", "--model_args",
           f"pretrained={tiny}", "--tasks", "orthros_tiny_cloze", "--include_path", str(LM_TASKS_DIR),
           "--limit", "2", "--device", "cpu", "--output_path", str(tmp_path / "res")]
    env["GIT_CEILING_DIRECTORIES"] = str(tmp_path.parent)  # git looks no higher than tmp_path
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "orthros_tiny_cloze" in p.stdout
    assert list(Path(tmp_path / "res").rglob("results*.json"))
    # outside a checkout, as `orthros eval lm`: no git 'fatal:', and plain progress lines in a pipe (it wrote
    # 'fatal: not a git repository' and tqdm bars of carriage returns)
    assert "not a git repository" not in p.stderr and "\r" not in p.stderr, p.stderr[-3000:]


@pytest.mark.parametrize("args, msg", [
    (["--seed", "-1"], "--seed must be in 0..4294967295, got -1"),
    (["--batch_size", "0"], "--batch_size must be >= 1, got 0"),
    (["--num_fewshot", "-1"], "--num_fewshot must be >= 0, got -1"),
    # the spelling typed, not the other one (--batch-size 0 was refused as "--batch_size must be >= 1")
    (["--batch-size", "0"], "--batch-size must be >= 1, got 0"),
    (["--num-fewshot", "-1"], "--num-fewshot must be >= 0, got -1"),
    (["--include-path", "{tmp}/nope"], "--include-path {tmp}/nope: no such directory"),
    (["--include_path", "{tmp}/nope"], "--include_path {tmp}/nope: no such directory"),
    (["--limit", "2.5"], "--limit must be an integer >= 1 or a fraction in (0, 1), got 2.5"),
    (["--limit", "inf"], "--limit must be an integer >= 1 or a fraction in (0, 1), got inf"),
    (["--device", "bogus"], "--device must be cpu, cuda or cuda:N, got 'bogus'"),
    (["-o", "{tmp}"], "-o {tmp}: is a directory"),  # named as typed (was --output after -o)
    (["--output", "{tmp}"], "--output {tmp}: is a directory"),
    (["-o", "{ck}/model.safetensors"], "-o {ck}/model.safetensors is a file of the --model checkpoint {ck}"),
])
def test_cli_lm_bad_input_refused_before_the_model_loads(tiny, tmp_path, capsys, monkeypatch, args, msg):
    """Issue: --seed -1 failed after the model had loaded (numpy's `Seed must be between 0 and 2**32 - 1`);
    --batch_size 0, --num_fewshot -1, --limit 2.5 and --device bogus ran without a word; an --output that is
    a directory failed after the whole evaluation."""
    import orthros.evaluation.lm as lm
    from orthros.cli import main

    monkeypatch.setattr(lm, "run_lm_eval", lambda *a, **kw: pytest.fail("the evaluation started"))
    args = [a.replace("{tmp}", str(tmp_path)).replace("{ck}", str(tiny)) for a in args]
    assert main(["eval", "lm", "--model", str(tiny), "--tasks", "orthros_tiny_cloze", *args]) == 2
    assert msg.replace("{tmp}", str(tmp_path)).replace("{ck}", str(tiny)) in capsys.readouterr().err


def test_bad_tokenizer_refused_before_the_model_loads(tiny, tmp_path, monkeypatch):
    """Issue: with --tokenizer (or a converted model) the model loaded before the tokenizer was tried."""
    import orthros.evaluation.lm as lm

    monkeypatch.setattr(lm, "load_model", lambda *a, **kw: pytest.fail("the model was loaded"))
    with pytest.raises(ValueError, match="no usable tokenizer"):
        lm.run_lm_eval(tiny, ["orthros_tiny_cloze"], limit=2, device="cpu", tokenizer=str(tmp_path))


@pytest.mark.parametrize("what", ["missing", "file"])
def test_a_tokenizer_path_that_is_no_directory_is_refused_without_asking_the_hub(tmp_path, monkeypatch, what):
    """Issue: AutoTokenizer takes a name that is no local folder for a hub id, so a mistyped --tokenizer path
    (of `eval lm`, `niah`, `ppl`) spent half a minute in network retries (a dozen 'Retrying in 8s' lines),
    then was refused as "no usable tokenizer in nowhere: OSError: We couldn't connect to
    'https://huggingface.co' ..."; the evaluations download nothing (their --model is local too)."""
    import transformers

    from orthros.evaluation.common import load_tokenizer

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained",
                        lambda *a, **kw: pytest.fail("the name was handed to transformers (a hub look-up)"))
    path = tmp_path / "nowhere"
    if what == "file":
        path.write_text("{}")
    why = "no such directory" if what == "missing" else "a file, not a directory"
    with pytest.raises(ValueError, match=f"--tokenizer {path}: {why} \\(a local tokenizer directory is needed"):
        load_tokenizer(tmp_path, str(path))


def test_a_checkpoint_missing_a_tensor_is_refused_before_lm_eval_loads_it(tiny, tmp_path, monkeypatch):
    """Issue: lm-eval's loader (HFLM) was handed the directory unchecked, and transformers only logs a
    tensor that the weights lack: the task was scored with that tensor at random (as every other
    evaluation refuses)."""
    import lm_eval.models.huggingface as hf

    from orthros.evaluation.lm import run_lm_eval

    broken = checkpoint_missing(tiny, tmp_path / "broken", "model.layers.1.mlp.down_proj.weight")
    monkeypatch.setattr(hf.HFLM, "__init__", lambda *a, **kw: pytest.fail("lm-eval loaded the model"))
    with pytest.raises(ValueError, match="do not fit its config.json: missing model.layers.1.mlp.down_proj.weight"):
        run_lm_eval(broken, ["orthros_tiny_cloze"], limit=2, device="cpu")


def test_a_checkpoint_without_a_tokenizer_is_refused_before_lm_eval_loads_it(tiny, tmp_path, monkeypatch):
    """Issue: an Orthros checkpoint saved without its tokenizer went to lm-eval's loader, which loaded the
    model and then failed with transformers' "Couldn't instantiate the backend tokenizer ..." (no path,
    no --tokenizer hint)."""
    import shutil

    import lm_eval.models.huggingface as hf

    from orthros.evaluation.lm import run_lm_eval

    bare = tmp_path / "bare"
    bare.mkdir()
    for f in ("config.json", "model.safetensors"):
        shutil.copy(tiny / f, bare / f)
    monkeypatch.setattr(hf.HFLM, "__init__", lambda *a, **kw: pytest.fail("lm-eval loaded the model"))
    with pytest.raises(ValueError, match=f"no usable tokenizer in --model {bare} \\(pass --tokenizer DIR\\)"):
        run_lm_eval(bare, ["orthros_tiny_cloze"], limit=2, device="cpu")


def test_a_tokenizer_beyond_the_models_vocab_is_refused_before_lm_eval_loads_it(tmp_path, monkeypatch):
    """Issue: a tokenizer of more tokens than the model's vocab_size (another model's, or --tokenizer of
    one) ran into the embedding's IndexError ("index out of range in self") after the model loaded, a
    raw traceback from `orthros eval lm`; the other evaluations name the tokenizer (check_token_range)."""
    import lm_eval.models.huggingface as hf

    from orthros.evaluation.lm import run_lm_eval

    small = make_tiny_checkpoint(tmp_path / "small", vocab_size=1000)
    monkeypatch.setattr(hf.HFLM, "__init__", lambda *a, **kw: pytest.fail("lm-eval loaded the model"))
    with pytest.raises(ValueError, match=f"the tokenizer of --model {small} gives token ids up to 4095, beyond the "
                                         f"model's vocab_size \\(1000\\)"):
        run_lm_eval(small, ["orthros_tiny_cloze"], limit=2, device="cpu")


def test_a_model_converted_on_the_fly_is_named_in_the_results(tmp_path, monkeypatch):
    """Issue: lm-eval names the model in its results' config by the model's name_or_path, which a
    Llama checkpoint converted on the fly did not have: `-o` wrote "model": "" (which model was it?)."""
    import lm_eval
    from transformers import LlamaConfig, LlamaForCausalLM

    from orthros.data import load_tokenizer
    from orthros.evaluation.lm import run_lm_eval

    tok = load_tokenizer()
    src = tmp_path / "llama"
    LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                 num_attention_heads=2, max_position_embeddings=64)).save_pretrained(src)
    tok.save_pretrained(src)
    monkeypatch.setattr(lm_eval, "simple_evaluate", lambda model, **kw: model)  # the lm-eval model it is given
    lm = run_lm_eval(src, ["orthros_tiny_cloze"], limit=1, device="cpu", window_size=8)
    assert type(lm.model).__name__ == "OrthrosForCausalLM" and lm.config._name_or_path == str(src)
    # what `-o` records of it: converted, with the window given (lm-eval's config names no window)
    from orthros.evaluation.lm import model_record

    assert model_record(lm.model, "llama", src) == {"model_type": "llama", "converted": True,
                                                    "attention_mode": "orthros", "window_size": 8, "dtype": "fp32",
                                                    "tokenizer": str(src)}


def test_cli_lm_window_refused_for_an_orthros_checkpoint(tiny, capsys, monkeypatch):
    """Issue: `--window 4` was accepted for an Orthros checkpoint and ignored (it only sets the window of a
    Transformer checkpoint converted on the fly)."""
    import orthros.evaluation.lm as lm
    from orthros.cli import main

    monkeypatch.setattr(lm, "run_lm_eval", lambda *a, **kw: pytest.fail("the evaluation started"))
    assert main(["eval", "lm", "--model", str(tiny), "--tasks", "orthros_tiny_cloze", "--window", "4"]) == 2
    assert "is an Orthros checkpoint, which keeps its own window (16)" in capsys.readouterr().err


def test_tiny_cloze_does_not_reward_a_model_that_knows_nothing():
    """Issue: every item's answer was its first choice, and lm-eval's argmax keeps the first of tied
    choices, so a model with constant logits (a uniform guess) scored acc 0.60 / acc_norm 0.35 against a
    chance of 0.25. The answers now sit at every position equally often; such a model (log-likelihood
    -n log V for a choice of n tokens) scores below chance."""
    from collections import Counter

    from orthros.data import load_tokenizer

    rows = [json.loads(line) for line in (LM_TASKS_DIR / "orthros_tiny_cloze.jsonl").read_text().splitlines()]
    assert Counter(r["gold"] for r in rows) == {0: 5, 1: 5, 2: 5, 3: 5}
    tok = load_tokenizer()
    acc = acc_norm = 0
    for r in rows:
        n_ctx = len(tok(r["context"], add_special_tokens=False)["input_ids"])
        n = [len(tok(r["context"] + " " + c, add_special_tokens=False)["input_ids"]) - n_ctx for c in r["choices"]]
        acc += min(range(4), key=lambda i: (n[i], i)) == r["gold"]  # argmax of -n log V: first of the fewest
        acc_norm += max(range(4), key=lambda i: (-n[i] / len((" " + r["choices"][i]).encode()), -i)) == r["gold"]
    assert acc / len(rows) <= 0.25 and acc_norm / len(rows) <= 0.25, (acc, acc_norm)


@pytest.mark.parametrize("progress", [True, False])
def test_lm_eval_outside_a_checkout_prints_no_git_error_and_plain_progress_lines(tiny, tmp_path, monkeypatch, capfd,
                                                                                 progress):
    """lm-eval records the git commit of the folder it runs in: outside a checkout git's `fatal: not a
    git repository` must not reach stderr. With stderr not a terminal (captured here), its progress
    comes as plain lines (no carriage returns), as every other command's; progress=False shows none."""
    from orthros.evaluation.lm import run_lm_eval

    run_dir = tmp_path / "not_a_checkout"
    run_dir.mkdir()
    monkeypatch.chdir(run_dir)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))  # git looks no higher than run_dir
    capfd.readouterr()
    res = run_lm_eval(tiny, ["orthros_tiny_cloze"], limit=2, device="cpu", progress=progress)
    err = capfd.readouterr().err
    assert "not a git repository" not in err and "\r" not in err, err
    # nor lm-eval's notes that do not apply: an unknown model type, its --metadata option for the shipped task
    assert "neither marked" not in err and "--metadata" not in err, err
    assert ("[Running loglikelihood requests] it 8/8" in err) == progress, err
    assert "git_hash" in res  # lm-eval's record is still made (None: no checkout here)
    assert res["results"]["orthros_tiny_cloze"]["acc,none"] is not None


def _phi3_gguf(path, arch="phi3"):
    """A GGUF file of architecture phi3 (one orthros convert does not take), or ``arch``: a header and one tensor."""
    gguf = pytest.importorskip("gguf")
    import numpy as np

    path.parent.mkdir()
    w = gguf.GGUFWriter(str(path), arch)
    w.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("model, msg", [
    # Path("") is the current directory: an unset shell variable was reported as "--model  is not ..."
    ("", "--model is empty (''): give the checkpoint directory ('.' for the current one)"),
    ("  ", "--model is empty ('  ')"),
    # a checkpoint's config.json was said to have "no config.json"
    ("{tiny}/config.json", "--model {tiny}/config.json is not a directory (give the directory that holds"),
    # a GGUF file, or a folder holding one (was "it has no config.json", no word of converting it), as `orthros
    # generate` says it (checkpoint_files.gguf_hint)
    ("{tmp}/m.gguf", "--model {tmp}/m.gguf is not a directory; it is a GGUF checkpoint: convert it first: orthros "
                     "convert {tmp}/m.gguf DST\n"),
    ("{tmp}/llama", "--model {tmp}/llama is not a checkpoint directory: it has no config.json; it is a GGUF checkpoint: "
                    "convert it first: orthros convert {tmp}/llama DST\n"),
    # another folder without config.json: as before
    ("{tmp}/empty", "--model {tmp}/empty is not a checkpoint directory: it has no config.json (expected an Orthros "
                    "checkpoint, or a Llama / Qwen2 / Qwen3 / Mistral / Qwen3.5 one to convert)\n"),
    # a GGUF of an architecture orthros convert does not take was also sent to "convert it first" (a folder holding
    # one: "no config.json"): now named as orthros info names it
    ("{tmp}/phi3/p.gguf", "--model {tmp}/phi3/p.gguf: a GGUF file of architecture 'phi3', not an Orthros checkpoint; "
                          "orthros convert cannot make it one (the GGUF architectures it converts: llama, qwen2, qwen3)"),
    ("{tmp}/phi3", "--model {tmp}/phi3: holds the GGUF file p.gguf, of architecture 'phi3', not an Orthros checkpoint"),
])
def test_eval_model_paths_that_name_no_checkpoint_directory(tiny, tmp_path, capsys, monkeypatch, model, msg):
    import orthros.evaluation.lm as lm
    from orthros.cli import main

    monkeypatch.setattr(lm, "run_lm_eval", lambda *a, **kw: pytest.fail("the evaluation started"))
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    (tmp_path / "empty").mkdir()
    if "phi3" in model:
        _phi3_gguf(tmp_path / "phi3" / "p.gguf")
    if "llama" in model:
        _phi3_gguf(tmp_path / "llama" / "l.gguf", "llama")
    fill = lambda t: t.replace("{tiny}", str(tiny)).replace("{tmp}", str(tmp_path))  # noqa: E731
    assert main(["eval", "lm", "--model", fill(model), "--tasks", "orthros_tiny_cloze"]) == 2
    assert fill(msg) in capsys.readouterr().err


def test_every_evaluation_sends_a_gguf_to_orthros_convert_as_generate_does(tmp_path, capsys):
    """Issue: a folder holding a llama GGUF and no config.json was "not a checkpoint directory: it has no
    config.json" to `eval` (`--model` of niah / lm / ppl, `--init` of niah-train), with no word of converting it,
    while `orthros generate --model` on it said to convert it: each says it in generate's words now."""
    from orthros.cli import main

    d, f = tmp_path / "llama", tmp_path / "llama" / "l.gguf"
    _phi3_gguf(f, "llama")
    for path in (d, f):
        assert main(["generate", "--model", str(path), "hi"]) == 2
        hint = f"; it is a GGUF checkpoint: convert it first: orthros convert {path} DST\n"
        assert capsys.readouterr().err.endswith(hint)  # generate's words, the eval commands' below
        for args in (["ppl", "--model", str(path), "--data", str(f)], ["niah", "--model", str(path)],
                     ["lm", "--model", str(path), "--tasks", "orthros_tiny_cloze"],
                     ["niah-train", "--init", str(path), "--out", str(tmp_path / "out")]):
            assert main(["eval", *args]) == 2, args
            err = capsys.readouterr().err
            assert err.startswith(f"orthros eval {args[0]}: error: {args[1]} {path} ") and err.endswith(hint), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["llama"]  # nothing written


def test_a_model_folder_that_cannot_be_listed_is_no_traceback(tmp_path, capsys, unlistable):
    """A --model folder with no config.json that this user may not list (no read permission: the tests run as
    root, so listing it is made to fail) is "no config.json", as before the GGUF hint: not a PermissionError
    traceback from looking for a .gguf file in it."""
    from orthros.cli import main

    d = tmp_path / "locked"
    d.mkdir()
    unlistable(d)
    assert main(["eval", "ppl", "--model", str(d), "--data", str(d / "x.txt")]) == 2
    assert f"error: --model {d} is not a checkpoint directory: it has no config.json (expected" in capsys.readouterr().err


@pytest.mark.parametrize("as_option", [False, True])
def test_a_folder_without_tokenizer_files_is_named_so(tiny, tmp_path, as_option):
    """Issue: a checkpoint saved without its tokenizer (or a --tokenizer folder holding none) was refused with
    transformers' "Couldn't instantiate the backend tokenizer ... You need to have sentencepiece or tiktoken
    installed": it sent users to install a package when the folder simply holds no tokenizer."""
    import shutil

    from orthros.evaluation.common import load_tokenizer

    bare = tmp_path / "bare"
    bare.mkdir()
    for f in ("config.json", "model.safetensors"):
        shutil.copy(tiny / f, bare / f)
    with pytest.raises(ValueError) as e:
        load_tokenizer(tiny, str(bare)) if as_option else load_tokenizer(bare)
    msg = str(e.value)
    # the folder named by its argument (was the folder alone, as if of --model when --tokenizer was the bad one)
    assert f"no usable tokenizer in {'--tokenizer' if as_option else '--model'} {bare}" in msg, msg
    assert "it holds no tokenizer file (none of tokenizer.json" in msg and "sentencepiece" not in msg
    assert ("pass --tokenizer DIR" in msg) is not as_option

"""NIAH training data: same prompt as `orthros eval niah` scores, labels only on the answer;
a few training steps lower the loss."""

import numpy as np
import pytest
import torch

from orthros.evaluation.niah import NEEDLE, PromptBuilder, score_answer
from orthros.evaluation.niah_train import IGNORE, NIAHTrainConfig, answer_ids, build_model, make_batch, make_example


@pytest.fixture(scope="module")
def tok():
    from orthros.data import load_tokenizer

    return load_tokenizer()


def test_example_is_the_eval_prompt_plus_answer(tok):
    key = "4821937"
    ex = make_example(PromptBuilder(tok, "synthetic", seed=5), 96, 50, key)
    # the prompt part is byte-for-byte what niah.py builds (same builder seed, same call)
    want, at = PromptBuilder(tok, "synthetic", seed=5).build(96, 50, key)
    ids, labels, n = ex["input_ids"], ex["labels"], ex["prompt_len"]
    assert n == 96 and ids[:n] == want and ex["needle_at"] == at
    # the needle sentence sits in the prompt where the builder put it
    needle = tok(NEEDLE.format(key=key), add_special_tokens=False)["input_ids"]
    assert ids[at:at + len(needle)] == needle
    # labels: -100 on the whole prompt, the answer tokens after it, nothing else
    ans = answer_ids(PromptBuilder(tok, "synthetic"), key)
    assert ids[n:] == ans
    assert labels[:n] == [IGNORE] * n and labels[n:] == ans
    # the answer is what the evaluation scores as right
    assert score_answer(tok.decode(ans, skip_special_tokens=True), key) == 1.0
    assert tok.decode(ans) == " 4821937."


def test_batch_labels_only_on_answer_tokens(tok):
    ids, lab = make_batch(PromptBuilder(tok, "synthetic", seed=1), np.random.default_rng(0), 4, 64, digits=7)
    assert ids.shape == lab.shape and ids.shape[1] == 64 + 9  # " " + 7 digits + "."
    set_ = lab != IGNORE
    assert (set_.sum(1) == 9).all() and set_[:, 64:].all() and not set_[:, :64].any()
    assert torch.equal(lab[set_], ids[set_])


def test_a_few_steps_lower_the_loss(tok):
    torch.manual_seed(0)
    cfg = NIAHTrainConfig(hidden_size=32, num_heads=2, num_layers=1, window_size=8)
    model = build_model(cfg, tok)
    ids, lab = make_batch(PromptBuilder(tok, "synthetic", seed=2), np.random.default_rng(1), 8, 48)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(15):
        loss = model(input_ids=ids, labels=lab).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < losses[0] - 1.0


@pytest.mark.parametrize("flag", [[], ["--no-progress"]])
def test_cli_progress_bar_and_no_progress(tmp_path, capsys, flag):
    """Issue 17 #9: `orthros eval niah-train` had no --no-progress (and no progress bar)."""
    import json

    from orthros.evaluation.cli import main

    out = tmp_path / "m"
    rc = main(["niah-train", "--out", str(out), "--steps", "3", "--batch-size", "2", "--hidden-size", "32",
               "--heads", "2", "--layers", "1", "--window", "8", "--min-len", "48", "--max-len", "48",
               "--log-every", "3", "--threads", "1", *flag])
    assert rc == 0
    err = capsys.readouterr().err
    assert ("niah-train orthros" in err and "3/3" in err) == (not flag), err
    rec = json.loads((out / "niah_train.json").read_text())
    assert rec["history"][-1]["step"] == 3 and (out / "config.json").is_file()

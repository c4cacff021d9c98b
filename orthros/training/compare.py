"""Compare trained checkpoints on held-out text: plain eval loss, and a long-range probe.

The probe feeds each held-out passage twice in a row (``P P``) and reports the mean loss on
the second copy next to the loss on the first. A model that can look back ``len(P)`` tokens
can copy, so its second-copy loss drops; a sliding window shorter than ``len(P)`` cannot see
the first copy. Used for the CPU comparison recorded in docs/training.md::

    python -m orthros.training.compare runs/tiny_orthros runs/tiny_tf runs/tiny_swa --passage 96
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch


def check_passage(ckpt_dir: str, passage: int, config=None) -> None:
    """``ValueError`` unless the probe of ``passage`` tokens fits the checkpoint: ``P P`` within its
    ``max_position_embeddings`` (``config``: its config, read when not given), and two tokens a copy
    (the first token of each copy is not scored; one token a copy scores nothing)."""
    if isinstance(passage, bool) or not isinstance(passage, int) or passage < 2:
        raise ValueError(f"--passage must be an integer >= 2, got {passage!r}")
    if config is None:
        import orthros  # noqa: F401
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(ckpt_dir)
    if 2 * passage > config.max_position_embeddings:
        raise ValueError(f"--passage {passage}: P P is {2 * passage} tokens, more than {ckpt_dir} takes "
                         f"(max_position_embeddings {config.max_position_embeddings})")


@torch.no_grad()
def probe(ckpt_dir: str, passage: int = 96, n: int = 32) -> dict:
    import orthros  # noqa: F401
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ..data import CORPUS_EVAL
    from ..utils import hf_progress_bars

    with hf_progress_bars(True):  # its 'Loading weights' bar at a terminal only, not into a log
        model = AutoModelForCausalLM.from_pretrained(ckpt_dir).eval()
    check_passage(ckpt_dir, passage, model.config)
    tok = AutoTokenizer.from_pretrained(ckpt_dir)
    docs = [json.loads(l)["text"] for l in open(CORPUS_EVAL, encoding="utf-8")]
    first, second, count = 0.0, 0.0, 0
    for d in docs:
        ids = tok(d, add_special_tokens=False)["input_ids"]
        if len(ids) < passage + 64:
            continue
        p = ids[64:64 + passage]  # skip the scene heading
        x = torch.tensor([p + p])
        lab1 = x.clone()
        lab1[:, passage:] = -100
        lab2 = x.clone()
        lab2[:, :passage + 1] = -100  # scored: tokens 2..P of the second copy
        lab1[:, 0] = -100
        first += float(model(input_ids=x, labels=lab1, use_cache=False).loss)
        second += float(model(input_ids=x, labels=lab2, use_cache=False).loss)
        count += 1
        if count == n:
            break
    if not count:
        raise ValueError(f"--passage {passage}: no held-out scene has the {passage + 64} tokens it needs")
    return {"checkpoint": ckpt_dir, "attention_mode": model.config.attention_mode,
            "window": model.config.window_size, "passage_tokens": passage, "passages": count,
            "loss_first_copy": first / count, "loss_second_copy": second / count}


def _round(loss):
    """A logged loss to 4 places; ``None`` as it is (a non-finite loss, logged as null since 2026-12-07)."""
    return round(loss, 4) if isinstance(loss, (int, float)) and not isinstance(loss, bool) else loss


def main(argv=None) -> int:
    from ..layout import CKPT_RE, METRICS, latest_checkpoint, run_holding_hint
    from ..utils import check_positive_int, distinct_folders, expand_path, to_json
    from .metrics import read_metrics

    p = argparse.ArgumentParser(prog="python -m orthros.training.compare", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", help="output_dir of each run")
    p.add_argument("--passage", type=int, default=96, help="passage length in tokens (>= 2)")
    p.add_argument("--n", type=int, default=32, help="passages probed (at most one a held-out scene)")
    a = p.parse_args(argv)
    try:
        check_positive_int("--n", a.n)
        # a leading ~ (or ~NAME) is a home folder, as in every orthros command (a quoted one reaches here)
        a.runs = [str(expand_path(d, "RUN")) if d.startswith("~") else d for d in a.runs]
    except ValueError as e:
        p.error(str(e))
    runs, repeats = distinct_folders(a.runs)  # one folder named twice was probed twice, or once silently
    for run, first in repeats:
        print(f"{p.prog}: note: {run} is the same folder as {first}: probed once", file=sys.stderr)
    ckpts = {run: latest_checkpoint(run) for run in runs}
    for run, ck in ckpts.items():  # every run checked before the first is probed
        if ck is None or not os.path.isfile(os.path.join(run, METRICS)):
            p.error(f"{run}: not a training run's output_dir (one with a complete checkpoint and {METRICS})"
                    + run_holding_hint(run))
        try:
            check_passage(str(ck), a.passage)
        except ValueError as e:
            p.error(str(e))
    for run, ck in ckpts.items():
        evals = read_metrics(run, "eval")
        train = read_metrics(run, "train")
        try:
            r = probe(str(ck), a.passage, a.n)
        except ValueError as e:
            p.error(str(e))
        step = int(CKPT_RE.match(ck.name)[1])  # the probed checkpoint's, and its eval (a killed run's last
        at_step = [e.get("eval_loss") for e in evals if e.get("step") == step]  # eval may be past its last checkpoint)
        r.update({"run": run, "step": step, "eval_loss": at_step[-1] if at_step else None,
                  "train_loss_last": train[-1].get("loss") if train else None,
                  "eval_curve": [(e.get("step"), _round(e.get("eval_loss"))) for e in evals]})
        print(to_json(r), flush=True)  # a loss that is not finite (NaN, inf) as null: standard JSON
    return 0


if __name__ == "__main__":
    sys.exit(main())

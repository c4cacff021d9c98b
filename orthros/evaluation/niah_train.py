"""Train a small model on passkey retrieval in exactly the prompt format ``orthros eval niah``
scores, so the NIAH grid can be checked on a model that has actually learned the task.

Prompts come from :class:`orthros.evaluation.niah.PromptBuilder` (the same haystack, needle
sentence and question); the training example is ``prompt + " <key>."`` with labels (HF
convention, aligned with ``input_ids``; the model shifts) only on the answer tokens, so an
Orthros model runs its output stream at those ~9 positions only. Training uses a haystack
builder seed and a key stream different from the evaluation's (``NIAHConfig.seed`` 0), so no
evaluation prompt is seen in training.

    python -m orthros.evaluation.niah_train --out runs/niah_orthros            # Orthros
    python -m orthros.evaluation.niah_train --out runs/niah_swa --mode window  # SWA contrast
    orthros eval niah --model runs/niah_orthros --lengths 64,128,256 --engine off
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from ..kinds import ATTENTION_MODES, mode_option
from ..utils import (Progress, atomic_directory, check_output_path, check_replaceable_dir, clean_stale, expand_path,
                     write_json)
from .common import check_seed, typed
from .niah import NEEDLE, PromptBuilder

IGNORE = -100


# the NIAHTrainConfig fields that must be >= 1, and the option of `orthros eval niah-train` that sets each
_FLAGS = {"window_size": "--window", "num_layers": "--layers", "hidden_size": "--hidden-size", "num_heads": "--heads",
          "max_position_embeddings": "--max-positions", "steps": "--steps", "batch_size": "--batch-size",
          "min_len": "--min-len", "digits": "--digits", "log_every": "--log-every"}


@dataclass
class NIAHTrainConfig:
    attention_mode: str = "orthros"  # "orthros" | "window" (SWA) | "full"
    window_size: int = 16
    num_layers: int = 2
    hidden_size: int = 128
    num_heads: int = 4
    max_position_embeddings: int = 1024
    steps: int = 1500
    batch_size: int = 16
    lr: float = 1e-3
    weight_decay: float = 0.1
    warmup: float = 0.05  # share of the steps
    min_len: int = 48  # prompt lengths (tokens) drawn uniformly per step from [min_len, max_len]
    max_len: int = 128
    digits: int = 7
    haystack: str = "synthetic"
    seed: int = 1234  # != the evaluation's seed 0: other haystack orders and keys
    threads: Optional[int] = 1  # 2 threads ran ~10x slower than 1 while another job shared the 2 cores
    log_every: int = 100
    init: Optional[str] = None  # continue from this checkpoint (curriculum stage 2); None: random init

    def validate(self) -> "NIAHTrainConfig":
        if self.attention_mode not in ATTENTION_MODES:
            raise ValueError(f"attention_mode must be one of {', '.join(ATTENTION_MODES)}, got {self.attention_mode!r}")
        for n, flag in _FLAGS.items():
            if getattr(self, n) < 1:
                raise ValueError(f"{n} ({flag}) must be >= 1, got {getattr(self, n)}")
        if self.digits > 18:  # keys are drawn as int64
            raise ValueError(f"digits (--digits) must be in 1..18, got {self.digits}")
        check_seed(self.seed, "seed (--seed)")
        if self.threads is not None and self.threads < 0:
            raise ValueError(f"threads (--threads) must be >= 0 (0: torch's own choice), got {self.threads}")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size (--hidden-size, {self.hidden_size}) must be a multiple of num_heads "
                             f"(--heads, {self.num_heads})")
        if self.max_len < self.min_len:
            raise ValueError(f"max_len (--max-len, {self.max_len}) must be >= min_len (--min-len, {self.min_len})")
        if self.max_len + self.digits + 4 > self.max_position_embeddings:
            raise ValueError(f"max_len (--max-len) {self.max_len} plus the answer ({self.digits} digits + 4 tokens) "
                             f"must fit in max_position_embeddings ({self.max_position_embeddings}, --max-positions): "
                             f"use --max-len <= {self.max_position_embeddings - self.digits - 4}")
        if not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr (--lr) must be a finite number > 0, got {self.lr}")
        if self.init is not None:  # before any data or weights: what from_pretrained would refuse later
            from .common import read_config

            c = read_config(self.init, "--init", expected="an Orthros checkpoint to continue")
            if c.get("model_type") != "orthros":
                raise ValueError(f"--init {self.init}: a {c.get('model_type')!r} checkpoint; --init continues an "
                                 f"Orthros checkpoint (`orthros convert` converts a Llama / Qwen2 / Qwen3 / Mistral one, "
                                 f"Qwen3.5 to Orthros-H)")
            if c.get("attention_mode", self.attention_mode) != self.attention_mode:
                raise ValueError(f"--init {self.init} has attention_mode {c['attention_mode']!r}, "
                                 f"not {self.attention_mode!r}")
            n = c.get("max_position_embeddings")
            if isinstance(n, int) and n < self.max_len + self.digits + 4:
                raise ValueError(f"--init {self.init}: its max_position_embeddings ({n}) is too small for --max-len "
                                 f"{self.max_len} plus the answer ({self.digits} digits + 4 tokens): use --max-len "
                                 f"<= {n - self.digits - 4}")
        return self


def answer_ids(builder: PromptBuilder, key: str) -> list[int]:
    """Tokens of the continuation the evaluation expects after the question: ``" <key>."``, the
    tail of the needle sentence."""
    return builder._enc(" " + key + NEEDLE[-1])


def make_example(builder: PromptBuilder, length: int, depth: float, key: str) -> dict:
    """One training example: the NIAH prompt of ``length`` tokens (needle at ``depth`` %), then
    the answer. ``labels`` are -100 except on the answer tokens."""
    prompt, needle_at = builder.build(length, depth, key)
    ans = answer_ids(builder, key)
    ids = prompt + ans
    labels = [IGNORE] * len(prompt) + ans
    return {"input_ids": ids, "labels": labels, "prompt_len": len(prompt), "needle_at": needle_at, "key": key}


def make_batch(builder: PromptBuilder, rng: np.random.Generator, n: int, length: int, digits: int = 7):
    """``n`` examples of one prompt length and random ``digits``-digit keys. Depths are drawn
    uniformly from [-10, 110] and clipped to [0, 100], so 1/12 of the needles each sit exactly at
    the start or the end: the builder puts depth 100 right before the question (after a cut
    sentence), a placement uniform depths in [0, 100] almost never produce, and the first
    recipe's model missed 1 of 10 needles there."""
    import torch

    lo = 10 ** (digits - 1)
    exs = [make_example(builder, length, float(np.clip(rng.uniform(-10, 110), 0, 100)),
                        str(int(rng.integers(lo, 10 * lo)))) for _ in range(n)]
    width = max(len(e["input_ids"]) for e in exs)  # equal unless the key tokenises oddly
    pad = 0
    ids = torch.full((n, width), pad, dtype=torch.long)
    lab = torch.full((n, width), IGNORE, dtype=torch.long)
    for i, e in enumerate(exs):
        ids[i, :len(e["input_ids"])] = torch.tensor(e["input_ids"])
        lab[i, :len(e["labels"])] = torch.tensor(e["labels"])
    return ids, lab


def build_model(cfg: NIAHTrainConfig, tokenizer):
    import torch

    from ..models import OrthrosConfig, OrthrosForCausalLM

    torch.manual_seed(cfg.seed)
    mc = OrthrosConfig(vocab_size=len(tokenizer), hidden_size=cfg.hidden_size, intermediate_size=2 * cfg.hidden_size,
                       num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
                       num_key_value_heads=cfg.num_heads, max_position_embeddings=cfg.max_position_embeddings,
                       window_size=cfg.window_size, attention_mode=cfg.attention_mode,
                       bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                       pad_token_id=tokenizer.pad_token_id)
    return OrthrosForCausalLM(mc)


def answer_accuracy(model, ids, labels) -> float:
    """Share of examples whose every answer token is the argmax (teacher forced)."""
    import torch

    with torch.no_grad():
        out = model(input_ids=ids, labels=labels)
    # output positions = where the shifted labels are set, in order; targets are those labels
    tgt = labels[:, 1:][labels[:, 1:] != IGNORE].view(ids.shape[0], -1)
    pred = out.logits.argmax(-1)
    return float((pred == tgt).all(-1).float().mean())


def check_out_dir(out_dir, overwrite: bool, name: str = "--out") -> None:
    """Refuse, before any work, an ``--out`` that holds something (a non-empty directory) unless
    ``overwrite``: the checkpoint replaces the whole directory at the end. One that is empty, the working
    folder or the home folder (or above either) is refused either way (:func:`utils.check_replaceable_dir`).
    ``name``: the option as the user typed it (``-o`` or ``--out``)."""
    check_replaceable_dir(out_dir, name)
    check_output_path(name, out_dir, directory=True)
    out = expand_path(out_dir, name)
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise ValueError(f"{name} {out_dir}: the directory is not empty; pass --overwrite to replace it")


def train(cfg: NIAHTrainConfig, out_dir=None, tokenizer=None, log=print, progress: bool = False,
          overwrite: bool = False, header: Optional[str] = None) -> dict:
    """Train on generated passkey data; save the model and tokenizer to ``out_dir`` (if given),
    written whole at the end (a temporary directory renamed into place: a failure leaves nothing);
    a non-empty ``out_dir`` is refused before any work unless ``overwrite``.
    ``progress``: :class:`orthros.utils.Progress` over the steps (on stderr; the log lines print above it).
    ``header``: a line given to ``log`` once every check has passed (the haystack, ``min_len`` against the
    prompt's needle and question, an ``init`` checkpoint's vocabulary), before the model is built."""
    import torch

    from ..data import load_tokenizer
    from ..training.optim import build_optimizer, build_scheduler, warmup_steps_from_fraction

    cfg.validate()
    if out_dir is not None:
        check_out_dir(out_dir, overwrite)
    tok = tokenizer if tokenizer is not None else load_tokenizer()
    builder = PromptBuilder(tok, cfg.haystack, seed=cfg.seed)
    need = builder.overhead(str(10 ** (cfg.digits - 1)))
    if cfg.min_len <= need:  # PromptBuilder.build needs a haystack token besides the needle and question
        raise ValueError(f"--min-len {cfg.min_len} is too short: the needle and question alone take {need} tokens; "
                         f"use --min-len >= {need + 1}")
    if cfg.init:  # the prompts' ids must be rows of its embedding (an IndexError at the first step otherwise)
        from .common import check_token_range, read_config

        try:
            check_token_range(builder.max_id, read_config(cfg.init, "--init").get("vocab_size"),
                              "the shipped tokenizer (niah-train's prompts)" if tokenizer is None else "the tokenizer")
        except ValueError as e:
            raise ValueError(f"--init {cfg.init}: {e}") from None
    if header is not None:
        log(header)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    rng = np.random.default_rng(cfg.seed + 1)
    if cfg.init:
        from ..models import OrthrosForCausalLM

        model = OrthrosForCausalLM.from_pretrained(str(cfg.init), dtype=torch.float32)
        if model.config.attention_mode != cfg.attention_mode:
            raise ValueError(f"--init {cfg.init} has attention_mode {model.config.attention_mode!r}, "
                             f"not {cfg.attention_mode!r}")
        if model.config.max_position_embeddings < cfg.max_len + cfg.digits + 4:
            raise ValueError(f"--init {cfg.init}: max_position_embeddings is below --max-len")
    else:
        model = build_model(cfg, tok)
    model.train()
    opt = build_optimizer(model, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.98))
    sched = build_scheduler(opt, total_steps=cfg.steps, warmup_steps=warmup_steps_from_fraction(cfg.warmup, cfg.steps),
                            schedule="cosine", min_lr_ratio=0.1)

    # held-out check at the longest training length (fresh builder / keys, not the eval's seed)
    vb = PromptBuilder(tok, cfg.haystack, seed=cfg.seed + 7)
    v_ids, v_lab = make_batch(vb, np.random.default_rng(cfg.seed + 8), 64, cfg.max_len, cfg.digits)
    history, t0, losses = [], time.perf_counter(), []
    bar = Progress(cfg.steps, f"niah-train {cfg.attention_mode}", unit="step", enabled=progress)
    step_log = bar.write if progress and log is print else log  # above the bar; `log` again once it is closed
    for step in range(cfg.steps):
        L = int(rng.integers(cfg.min_len, cfg.max_len + 1))
        ids, lab = make_batch(builder, rng, cfg.batch_size, L, cfg.digits)
        loss = model(input_ids=ids, labels=lab).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        bar.update(1, loss=f"{losses[-1]:.3f}")
        if (step + 1) % cfg.log_every == 0 or step + 1 == cfg.steps:
            model.eval()
            acc = answer_accuracy(model, v_ids, v_lab)
            model.train()
            rec = {"step": step + 1, "loss": float(np.mean(losses[-cfg.log_every:])), "heldout_exact": acc,
                   "seconds": round(time.perf_counter() - t0, 1)}
            history.append(rec)
            n = len(losses[-cfg.log_every:])  # the bar shows the last step's loss, this line their mean
            step_log(f"step {rec['step']:5d}  loss {rec['loss']:.4f} (mean of {n} steps)  held-out exact "
                     f"(len {cfg.max_len}) {100 * acc:5.1f}%  {rec['seconds']:.0f}s")
    bar.close()
    secs = round(time.perf_counter() - t0, 1)
    model.eval()
    result = {"config": asdict(cfg), "train_seconds": secs, "history": history,
              "params": sum(p.numel() for p in model.parameters())}
    if out_dir is not None:
        out = expand_path(out_dir, "out_dir")
        clean_stale(out)  # what a killed run left beside it
        with atomic_directory(out, overwrite) as tmp:
            model.save_pretrained(str(tmp))
            tok.save_pretrained(str(tmp))
            write_json(tmp / "niah_train.json", result)
        log(f"saved {out} ({result['params']:,} params, {secs:.0f}s of training)")
    result["model"] = model
    return result


def add_arguments(p: argparse.ArgumentParser) -> None:
    from .cli import spelled

    d = NIAHTrainConfig()
    p.add_argument("--out", "-o", required=True, action=spelled(), help="output checkpoint dir (model + tokenizer + niah_train.json), "
                                                      "written whole at the end")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists and is not empty")
    p.add_argument("--mode", default=d.attention_mode, type=mode_option, metavar="{orthros,full,window}",
                   help="attention_mode: orthros, window (or swa) or full (or transformer) (default: %(default)s)")
    # the architecture options (None: the default, or with --init the checkpoint's own value)
    p.add_argument("--window", type=int, default=None,
                   help=f"window of the base stream (orthros) or of SWA; not for --mode full (default: "
                        f"{d.window_size})")
    p.add_argument("--layers", type=int, default=None, help=f"decoder layers (default: {d.num_layers})")
    p.add_argument("--hidden-size", type=int, default=None, help=f"model width (default: {d.hidden_size})")
    p.add_argument("--heads", type=int, default=None, help=f"attention heads (default: {d.num_heads})")
    p.add_argument("--steps", type=int, default=d.steps, help="training steps (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="prompts per step (default: %(default)s)")
    p.add_argument("--lr", type=float, default=d.lr, help="peak learning rate, cosine schedule (default: %(default)s)")
    p.add_argument("--min-len", type=int, default=d.min_len, help="shortest training prompt in tokens (default: %(default)s)")
    p.add_argument("--max-len", type=int, default=d.max_len, help="longest training prompt in tokens (default: %(default)s)")
    p.add_argument("--digits", type=int, default=d.digits, help="digits of the passkey (default: %(default)s)")
    p.add_argument("--haystack", default=d.haystack,
                   help="synthetic | corpus | PATH.txt | PATH.jsonl, as `orthros eval niah` (default: %(default)s)")
    p.add_argument("--max-positions", type=int, default=None,
                   help=f"the model's max_position_embeddings (default: {d.max_position_embeddings})")
    p.add_argument("--seed", type=int, default=d.seed, help="seed of every random draw (default: %(default)s)")
    p.add_argument("--threads", type=int, default=d.threads, help="torch CPU threads (default: 1; 0 = torch's own choice)")
    p.add_argument("--log-every", type=int, default=d.log_every,
                   help="steps between log lines: loss and held-out accuracy (default: %(default)s)")
    p.add_argument("--init", default=None, help="continue training this checkpoint (e.g. a longer-context stage); "
                                                "its architecture is kept: --mode must match, and --window, "
                                                "--layers, --hidden-size, --heads, --max-positions, when given, "
                                                "must equal the checkpoint's")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (the log lines still print)")


# architecture options: (argument, NIAHTrainConfig field, key of an --init checkpoint's config.json)
_ARCHITECTURE_ARGS = (("window", "window_size", "window_size"), ("layers", "num_layers", "num_hidden_layers"),
                      ("hidden_size", "hidden_size", "hidden_size"), ("heads", "num_heads", "num_attention_heads"),
                      ("max_positions", "max_position_embeddings", "max_position_embeddings"))


def _architecture_from_args(a) -> dict:
    """The architecture fields of the config: the options given, else the defaults; with ``--init``
    the checkpoint's own values (an option given with another value is refused: it would be ignored)."""
    d = NIAHTrainConfig()
    if a.window is not None and a.mode == "full":
        raise ValueError(f"--window {a.window} sets the window of --mode orthros or window (SWA); --mode full "
                         f"attends to every token")
    init = None
    if a.init is not None:
        from .common import read_config

        init = read_config(a.init, "--init", expected="an Orthros checkpoint to continue")
        if init.get("model_type") != "orthros":
            init = None  # refused by NIAHTrainConfig.validate, with the reason
    out = {}
    for arg, name, key in _ARCHITECTURE_ARGS:
        given = getattr(a, arg)
        have = init.get(key) if init is not None else None
        if not isinstance(have, int) or isinstance(have, bool):
            out[name] = getattr(d, name) if given is None else given
        elif given is not None and given != have:
            flag = "--" + arg.replace("_", "-")
            raise ValueError(f"{flag} {given}: --init {a.init} keeps its architecture ({key} {have}); drop {flag}")
        else:
            out[name] = have
    return out


def config_from_args(a) -> NIAHTrainConfig:
    return NIAHTrainConfig(attention_mode=a.mode, **_architecture_from_args(a), steps=a.steps,
                           batch_size=a.batch_size, lr=a.lr, min_len=a.min_len, max_len=a.max_len, digits=a.digits,
                           haystack=a.haystack, seed=a.seed, threads=a.threads, log_every=a.log_every,
                           init=a.init)


def run_cli(a) -> int:
    cfg = config_from_args(a).validate()
    check_out_dir(a.out, a.overwrite, typed(a, "out"))
    header = (f"NIAH training{' from ' + cfg.init if cfg.init else ''}: {cfg.attention_mode}, window "
              f"{cfg.window_size}, {cfg.num_layers} layers, d={cfg.hidden_size}, prompts {cfg.min_len}..{cfg.max_len} "
              f"tokens, {cfg.steps} steps x {cfg.batch_size}, lr {cfg.lr:g}")
    # printed by train once its own checks (the haystack, --min-len, --init's vocabulary) have passed
    train(cfg, out_dir=a.out, progress=not getattr(a, "no_progress", False), overwrite=a.overwrite, header=header)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m orthros.evaluation.niah_train",
                                description="Train a small model on passkey retrieval in the `orthros eval niah` format.")
    add_arguments(p)
    a = p.parse_args(argv)
    try:
        from .common import check_no_empty_values

        check_no_empty_values(p, a)
        return run_cli(a)
    except ValueError as e:
        print(f"niah_train: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

"""Needle-in-a-haystack / passkey retrieval (Kamradt, 2023; RULER-style synthetic variant).

A random number (the needle sentence "The secret number is 4821937.") is hidden at a chosen
depth (0 = start, 100 = end) inside filler text of a chosen total length in tokens; the
prompt ends with a question whose continuation is the number. The model answers greedily and
the answer is scored by exact string match (no LLM judge): right when the number appears in
the generated text as a whole number. A grid of context lengths x depths gives a heatmap like
Figure 3 of the paper.

Haystacks: ``synthetic`` (the shipped plain sentences, shuffled and repeated; RULER's "noise"
haystack), ``corpus`` (the shipped held-out Shakespeare corpus), or a path to a ``.txt`` /
``.jsonl`` (field ``text``) file.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np

from .common import DATA_DIR, check_token_range
from .perplexity import load_documents
from ..utils import Progress, dtype_name, pyplot, save_figure

NEEDLE = " The secret number is {key}."
QUESTION = "\nWhat is the secret number mentioned in the text above? The secret number is"
SYNTHETIC_FILE = DATA_DIR / "niah_filler.txt"
CORPUS_FILE = Path(__file__).resolve().parents[1] / "data" / "corpus" / "shakespeare_eval.jsonl"
HAYSTACKS = ("synthetic", "corpus")


def _checked_answer(prediction, answer) -> str:
    if not isinstance(prediction, str) or not isinstance(answer, str):
        raise TypeError("prediction and answer must be strings")
    answer = answer.strip()
    if not answer:
        raise ValueError("answer must be a non-empty string")
    return answer


def score_answer(prediction: str, answer: str) -> float:
    """1.0 when ``answer`` occurs in ``prediction`` as a whole token (not inside a longer
    number or word: ``4821937.5`` and ``1,4821937`` are other numbers), else 0.0. Case- and
    surrounding-whitespace-insensitive."""
    answer = _checked_answer(prediction, answer)
    pat = r"(?<![0-9A-Za-z])(?<![0-9][.,])" + re.escape(answer.lower()) + r"(?![0-9A-Za-z])(?![.,][0-9])"
    return 1.0 if re.search(pat, prediction.lower()) else 0.0


def prefix_match(prediction: str, answer: str) -> float:
    """A diagnostic next to the exact score, not a replacement: the share of ``answer``'s leading
    characters that the first number in ``prediction`` reproduces (``" 525869."`` for
    ``"5258698"``: 6/7; a wrong first digit: 0). Tells a retrieved but truncated or garbled
    number from one never found."""
    answer = _checked_answer(prediction, answer)
    m = re.search(r"[0-9]+", prediction)
    got = m.group(0) if m else ""
    n = 0
    while n < min(len(got), len(answer)) and got[n] == answer[n]:
        n += 1
    return n / len(answer)


def _check_haystack_file(source: str) -> None:
    """A ``--haystack`` that is not a built-in name must be a file to read: what is there instead (nothing,
    a folder) is said, so that a mistyped path does not read as a wrong kind of value."""
    p = Path(source)
    if not p.is_file():
        why = "a folder, not a file" if p.is_dir() else "no such file"
        raise ValueError(f"--haystack {source}: {why} (the haystack is {' or '.join(HAYSTACKS)}, or a .txt / "
                         f".jsonl file)")


def haystack_sentences(source: str) -> list[str]:
    if source == "synthetic":
        path = SYNTHETIC_FILE
    elif source == "corpus":
        path = CORPUS_FILE
        if not path.is_file():
            raise ValueError(f"haystack 'corpus' needs the shipped corpus at {path}, which is missing; "
                             f"use --haystack synthetic or a text file")
    else:
        path = Path(source)
        _check_haystack_file(source)
    # a .jsonl: one object with a string field 'text' a line, as `eval ppl --data` reads it
    text_lines = load_documents(path, "haystack" if source in HAYSTACKS else "--haystack")
    # remove digits so that no number in the haystack can be mistaken for the needle
    sents = []
    for t in text_lines:
        for s in re.split(r"(?<=[.!?])\s+|\n+", re.sub(r"[0-9]", "", t)):
            s = " ".join(s.split())
            if s:
                sents.append(s)
    if not sents:
        raise ValueError(f"haystack {source!r} has no text")
    return sents


@dataclass
class NIAHConfig:
    lengths: list = field(default_factory=lambda: [256, 512, 1024])
    depths: list = field(default_factory=lambda: [0, 25, 50, 75, 100])
    samples: int = 2  # needles (different numbers and haystack offsets) per cell
    haystack: str = "synthetic"
    digits: int = 7
    seed: int = 0
    engine: str = "auto"  # "auto": the fast engine on CUDA, HF generate elsewhere; "on"; "off"


def validate(cfg: NIAHConfig, max_positions: Optional[int] = None) -> None:
    if not cfg.lengths or not cfg.depths:
        raise ValueError(f"give at least one context length and one depth (lengths / --lengths, depths / --depths), "
                         f"got lengths {list(cfg.lengths)} and depths {list(cfg.depths)}")
    for L in cfg.lengths:
        if isinstance(L, bool) or not isinstance(L, int) or L < 32:
            raise ValueError(f"lengths (--lengths) must be integers >= 32 (context lengths in tokens), got {L!r}")
        if max_positions is not None and L > max_positions:
            raise ValueError(f"lengths (--lengths): {L} is above the model's maximum (max_position_embeddings = "
                             f"{max_positions}); choose lengths <= {max_positions}")
    for d in cfg.depths:
        if isinstance(d, bool) or not isinstance(d, (int, float)) or not 0 <= d <= 100:
            raise ValueError(f"depths (--depths) are percentages and must lie in 0..100, got {d!r}")
    for name, values in (("lengths", cfg.lengths), ("depths", cfg.depths)):
        # a repeated one would run its needles twice and draw two identical rows or columns of the grid,
        # each the mean of both
        repeated = next((v for i, v in enumerate(values) if v in values[:i]), None)
        if repeated is not None:
            raise ValueError(f"{name} (--{name}) names {repeated:g} twice; name each once")
    if isinstance(cfg.samples, bool) or not isinstance(cfg.samples, int) or cfg.samples < 1:
        raise ValueError(f"samples (--samples) must be an integer >= 1, got {cfg.samples!r}")
    if isinstance(cfg.seed, bool) or not isinstance(cfg.seed, int) or cfg.seed < 0:
        raise ValueError(f"seed (--seed) must be an integer >= 0, got {cfg.seed!r}")
    if not isinstance(cfg.digits, int) or not 1 <= cfg.digits <= 18:
        raise ValueError(f"digits (--digits) must be an integer in 1..18, got {cfg.digits!r}")
    if cfg.engine not in ("auto", "on", "off"):
        raise ValueError(f"engine (--engine) must be one of auto, on, off, got {cfg.engine!r}")
    if cfg.haystack not in HAYSTACKS:
        _check_haystack_file(cfg.haystack)


def answer_tokens(tokenizer, digits: int) -> int:
    """Tokens generated per needle: those of the answer ``" <key>"`` and 4 more."""
    return len(tokenizer(" " + str(10 ** (digits - 1)), add_special_tokens=False)["input_ids"]) + 4


def prompt_lengths(cfg: NIAHConfig, tokenizer, max_positions: Optional[int] = None) -> dict:
    """``{context length: prompt tokens}``. A context length is the whole window the model reads, answer
    included: at the model's maximum (e.g. 8K on an 8K model) the prompt gives up the answer's positions,
    so greedy decoding stays inside ``max_positions`` (the engine refuses to go past it)."""
    room = None if max_positions is None else max_positions - answer_tokens(tokenizer, cfg.digits)
    return {L: L if room is None else min(L, room) for L in cfg.lengths}


def check_lengths(cfg: NIAHConfig, tokenizer, max_positions: Optional[int] = None) -> None:
    """Refuse a context length too short for the needle and the question (and a few haystack tokens),
    at the model's maximum (``max_positions``) once the prompt has given up the answer's positions: the
    check that needs the tokenizer but no model."""
    need = prompt_overhead(tokenizer, str(10 ** (cfg.digits - 1)))
    for L, P in prompt_lengths(cfg, tokenizer, max_positions).items():
        if L < need + 8:
            raise ValueError(f"lengths (--lengths): context length {L} is too short: the needle and question alone "
                             f"take {need} tokens; use lengths >= {need + 8}")
        if P < need + 8:
            raise ValueError(f"lengths (--lengths): context length {L} is too short: at the model's "
                             f"max_position_embeddings ({max_positions}) its prompt keeps {P} tokens (the answer "
                             f"takes {max_positions - P}), and the needle and question alone take {need}; NIAH needs "
                             f"a model of at least {need + 8 + max_positions - P} positions")


def prompt_overhead(tokenizer, key: str) -> int:
    """The tokens of a prompt besides its haystack: BOS (if the tokenizer has one), the needle
    holding ``key`` and the question."""
    def n(text):
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    return int(getattr(tokenizer, "bos_token_id", None) is not None) + n(NEEDLE.format(key=key)) + n(QUESTION)


class PromptBuilder:
    """Tokenises the haystack once (sentence by sentence) and builds prompts of exact length."""

    def __init__(self, tokenizer, haystack: str, seed: int = 0):
        self.tok = tokenizer
        self.sents = [self._enc(" " + s) for s in haystack_sentences(haystack)]
        self.question = self._enc(QUESTION)
        self.bos = [tokenizer.bos_token_id] if getattr(tokenizer, "bos_token_id", None) is not None else []
        self.rng = np.random.default_rng(seed)

    def _enc(self, text):
        return list(self.tok(text, add_special_tokens=False)["input_ids"])

    @property
    def max_id(self) -> int:
        """The largest token id a prompt (or its answer) can hold: BOS, the haystack, the question, the
        needle sentence with every digit."""
        parts = [self.bos, self.question, self._enc(NEEDLE.format(key="0123456789")), *self.sents]
        return max(max(p) for p in parts if p)

    def overhead(self, key: str) -> int:
        return prompt_overhead(self.tok, key)

    def build(self, length: int, depth: float, key: str) -> tuple[list[int], int]:
        """Prompt of exactly ``length`` tokens with the needle at ``depth`` percent (moved to the
        nearest sentence boundary). Returns (ids, needle token offset)."""
        needle = self._enc(NEEDLE.format(key=key))
        budget = length - len(self.bos) - len(needle) - len(self.question)
        if budget < 1:
            raise ValueError(f"context length {length} is too short for the needle and question "
                             f"({length - budget + 1} tokens needed)")
        order = self.rng.permutation(len(self.sents))
        hay, bounds, i = [], [0], 0
        while len(hay) < budget:
            hay += self.sents[order[i % len(order)]]
            bounds.append(len(hay))
            i += 1
            if i % len(order) == 0:
                order = self.rng.permutation(len(self.sents))
        hay = hay[:budget]
        bounds = np.array([b for b in bounds if b <= budget])
        target = depth / 100.0 * budget
        at = int(bounds[np.argmin(np.abs(bounds - target))])
        if depth >= 100:
            at = budget
        ids = self.bos + hay[:at] + needle + hay[at:] + self.question
        assert len(ids) == length
        return ids, len(self.bos) + at


def _generator(model, tokenizer, engine_mode: str, max_len: int, max_new: int):
    """``(name, fn)``: which generator runs (``"engine"`` or ``"transformers"``) and a function ids ->
    generated token ids (greedy)."""
    import torch

    dev = next(model.parameters()).device
    use_engine = engine_mode == "on" or (engine_mode == "auto" and dev.type == "cuda")
    if use_engine:
        try:
            from ..engine import Engine
        except ImportError as e:
            if engine_mode == "on":
                raise ValueError(f"--engine on, but the fast engine is unavailable: {e}") from None
        else:
            # a prompt and its answer: the last answer token is never fed back (the engine's check_fits)
            eng = Engine(model, max_batch_size=1, max_seq_len=max_len + max_new - 1)

            def gen_engine(ids):
                eng.reset()
                return list(eng.generate([ids], max_new_tokens=max_new)[0])

            return "engine", gen_engine

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)

    @torch.no_grad()
    def gen_hf(ids):
        x = torch.tensor([ids], device=dev)
        out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new, do_sample=False,
                             pad_token_id=pad)
        return out[0, x.shape[1]:].tolist()

    return "transformers", gen_hf


def run_niah(model, tokenizer, cfg: NIAHConfig, progress: bool = True, log=print, tokenizer_name: str = "the tokenizer",
             builder: Optional[PromptBuilder] = None) -> dict:
    """The grid of ``cfg`` on ``model``. ``builder``: a :class:`PromptBuilder` of ``tokenizer``, the haystack
    and the seed made already (for its checks before the model loaded); ``tokenizer_name`` names the tokenizer
    in errors."""
    max_pos = getattr(model.config, "max_position_embeddings", None)
    validate(cfg, max_pos)
    builder = PromptBuilder(tokenizer, cfg.haystack, seed=cfg.seed) if builder is None else builder
    check_token_range(builder.max_id, getattr(model.config, "vocab_size", None), tokenizer_name)
    rng = np.random.default_rng(cfg.seed + 1)
    lo = 10 ** (cfg.digits - 1)
    check_lengths(cfg, tokenizer, max_pos)
    max_new = answer_tokens(tokenizer, cfg.digits)
    prompt_len = prompt_lengths(cfg, tokenizer, max_pos)
    if any(prompt_len[L] < L for L in cfg.lengths):
        log(f"NIAH: prompts at {[L for L in cfg.lengths if prompt_len[L] < L]} tokens are shortened by up to "
            f"{max_new} tokens so the answer fits in max_position_embeddings = {max_pos}")
    gen_name, gen = _generator(model, tokenizer, cfg.engine, max(prompt_len.values()), max_new)
    cells = [(L, d, s) for L in cfg.lengths for d in cfg.depths for s in range(cfg.samples)]
    bar = Progress(len(cells), "NIAH", unit="needle", enabled=progress)
    records = []
    t0 = time.perf_counter()
    for L, d, s in cells:
        key = str(int(rng.integers(lo, 10 * lo)))
        ids, _ = builder.build(prompt_len[L], d, key)
        new = gen(ids)
        text = tokenizer.decode(new, skip_special_tokens=True)
        sc = score_answer(text, key)
        records.append({"length": L, "prompt_tokens": len(ids), "depth": d, "sample": s, "answer": key,
                        "prediction": text, "score": sc, "prefix": round(prefix_match(text, key), 4)})
        bar.update(1, length=L, depth=d, acc=f"{np.mean([r['score'] for r in records]):.2f}")
    bar.close()
    grid = np.zeros((len(cfg.depths), len(cfg.lengths)))
    for i, d in enumerate(cfg.depths):
        for j, L in enumerate(cfg.lengths):
            grid[i, j] = np.mean([r["score"] for r in records if r["length"] == L and r["depth"] == d])
    return {
        "config": {"lengths": list(cfg.lengths), "depths": list(cfg.depths), "samples": cfg.samples,
                   "haystack": cfg.haystack, "digits": cfg.digits, "seed": cfg.seed},
        "model": {"attention_mode": getattr(model.config, "attention_mode", None),
                  "window_size": getattr(model.config, "window_size", None), "max_position_embeddings": max_pos},
        # what ran (--engine auto picks by device): a figure is read with its generator, device and dtype
        "run": {"generator": gen_name, "device": str(next(model.parameters()).device),
                "dtype": dtype_name(next(model.parameters()).dtype)},
        "accuracy": float(np.mean([r["score"] for r in records])),
        # diagnostic (prefix_match): how much of each number came back, exact or not
        "prefix_accuracy": float(np.mean([r["prefix"] for r in records])),
        "grid": {"depths": list(cfg.depths), "lengths": list(cfg.lengths), "accuracy": grid.tolist()},
        "seconds": round(time.perf_counter() - t0, 1),
        "records": records,
    }


def _fmt_len(L: int) -> str:
    return f"{L // 1024}K" if L >= 1024 and L % 1024 == 0 else str(L)


def format_grid(out: dict) -> str:
    g = out["grid"]
    head = ["depth \\ length"] + [_fmt_len(L) for L in g["lengths"]]
    rows = [head] + [[f"{d:g}%"] + [f"{100 * a:.0f}" for a in row] for d, row in zip(g["depths"], g["accuracy"])]
    w = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.rjust(w[i]) for i, c in enumerate(r)) for r in rows)


def save_heatmap(out: dict, path, title: Optional[str] = None, *, name: Optional[str] = None) -> None:
    """The accuracy grid as a heatmap PNG at ``path``; a failed write is an ``OSError`` naming ``path``
    (after ``name``, the caller's option for it, if given)."""
    plt = pyplot()

    g = out["grid"]
    acc = np.array(g["accuracy"])
    fig, ax = plt.subplots(figsize=(1.2 + 0.9 * len(g["lengths"]), 1.0 + 0.45 * len(g["depths"])))
    im = ax.imshow(acc, cmap="RdYlGn", vmin=0.0, vmax=1.0, aspect="auto")
    ax.set_xticks(range(len(g["lengths"])), [_fmt_len(L) for L in g["lengths"]])
    ax.set_yticks(range(len(g["depths"])), [f"{d:g}%" for d in g["depths"]])
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("needle depth")
    for i in range(acc.shape[0]):
        for j in range(acc.shape[1]):
            ax.text(j, i, f"{100 * acc[i, j]:.0f}", ha="center", va="center", fontsize=8)
    fig.colorbar(im, ax=ax, label="accuracy")
    ax.set_title(title or f"Needle in a haystack: {100 * out['accuracy']:.1f}% overall")
    fig.tight_layout()
    save_figure(fig, path, name=name)

"""Multi-query associative recall (MQAR), in the style of Zoology (Arora et al., 2023).

A sequence starts with ``num_pairs`` key-value pairs ``k1 v1 k2 v2 ...``; later, every key is
queried once: the key appears again at a query position ``p`` and the model must predict its
value, the next token (``labels[p + 1]``; the input there is filler unless
``answer_in_input``). The distance ``gap = p - (position of the key)`` follows a power law
``P(gap) ~ gap ** -power`` truncated to ``[min_gap, max_gap]`` (and to the positions still
free). Everything else is a filler token. Labels follow the HF convention (aligned with
``input_ids``; the model shifts them): ``labels[p + 1] = value`` at answer positions, -100
everywhere else, so an Orthros model trains its output stream at the query positions only.

Vocabulary: token 0 is the filler, keys are ``1 .. n_keys``, values are the rest. Gaps longer
than the window are where a sliding-window model cannot see the key-value pair and must fail,
while Orthros's output stream attends to every earlier token.
"""

from __future__ import annotations

import math
import re
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from typing import Optional

import numpy as np
import torch

from ..kinds import HYBRID_ALIASES, HYBRID_DISPLAY, MODE_ALIASES, MODE_DISPLAY, hybrid_layout
from ..utils import Progress, check_positive_int
from .common import check_seed

FILLER = 0
FILL_CHOICES = ("pad", "noise")
# user-facing model names -> OrthrosConfig.attention_mode, and their table names: orthros/kinds.py
# user-facing model names -> attention mode, or hybrid layout (Orthros-H, Linear Hybrid, GDN: num_layers
# layers, an attention layer every 4th)
MODEL_ALIASES, DISPLAY = {**MODE_ALIASES, **HYBRID_ALIASES}, {**MODE_DISPLAY, **HYBRID_DISPLAY}


@dataclass
class MQARTask:
    vocab_size: int = 64
    seq_len: int = 64
    num_pairs: int = 4
    power: float = 1.0  # P(gap) ~ gap ** -power
    min_gap: int = 1
    max_gap: Optional[int] = None  # default: seq_len
    fill: str = "pad"  # "pad": filler token 0; "noise": random value tokens (never keys)
    # also write the answer into the input after each query ("k ... k v"). Off by default: the
    # repeated values let a model answer the later queries by elimination (the one value not yet
    # repeated) instead of by recall, a shortcut that stalls learning (see docs/evaluation.md).
    answer_in_input: bool = False

    @property
    def n_keys(self) -> int:
        return (self.vocab_size - 1) // 2

    @property
    def value_range(self) -> tuple[int, int]:
        return 1 + self.n_keys, self.vocab_size

    def validate(self, names: Optional[dict] = None) -> "MQARTask":
        """Refuse a setting that cannot be generated; returns ``self``. Errors name the fields
        (``MQAR num_pairs ...``), or, for a field in ``names`` (field -> what the caller calls it,
        e.g. ``{"num_pairs": "--num-pairs"}``), that name."""
        names = names or {}

        def n(field):  # the field as the caller calls it
            return names.get(field, field)

        def nv(field, v=None):  # the field and its value: "num_pairs=4" / "--num-pairs 4"
            v = getattr(self, field) if v is None else v
            return f"{n(field)} {v}" if n(field).startswith("-") else f"{n(field)}={v}"

        pre = "" if names else "MQAR "
        for name in ("vocab_size", "seq_len", "num_pairs", "min_gap"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{pre}{n(name)} must be an integer >= 1, got {v!r}")
        if self.vocab_size < 5:
            raise ValueError(f"{pre}{n('vocab_size')} must be >= 5 (filler + keys + values), got {self.vocab_size}")
        if self.num_pairs > self.n_keys:
            raise ValueError(f"{pre}{n('num_pairs')} ({self.num_pairs}) must be <= the number of keys "
                             f"({n('vocab_size')} - 1) // 2 = {self.n_keys}; raise {n('vocab_size')}")
        if not (isinstance(self.power, (int, float)) and math.isfinite(self.power) and self.power >= 0):
            raise ValueError(f"{pre}{n('power')} must be a finite number >= 0, got {self.power!r}")
        if self.fill not in FILL_CHOICES:
            raise ValueError(f"{pre}{n('fill')} must be one of {FILL_CHOICES}, got {self.fill!r}")
        mx = self.seq_len if self.max_gap is None else self.max_gap
        if self.max_gap is not None and (isinstance(mx, bool) or not isinstance(mx, int) or mx < self.min_gap):
            raise ValueError(f"{pre}{n('max_gap')} must be an integer >= {n('min_gap')} ({self.min_gap}), "
                             f"got {self.max_gap!r}")
        # the last key sits at 2N-2; all N queries (2 tokens each) must fit after the context. Checked before
        # max_gap: an unset max_gap is seq_len, for which this bound is the stricter one, so a short seq_len is
        # named as itself (it was refused as "max_gap 4 is too short", a max_gap never given)
        first = max(2 * self.num_pairs, 2 * self.num_pairs - 2 + self.min_gap)
        if self.seq_len - first < 3 * self.num_pairs:
            raise ValueError(
                f"{pre}{n('seq_len')} {self.seq_len} is too short for {nv('num_pairs')} and {nv('min_gap')}: "
                f"need {n('seq_len')} >= {first + 3 * self.num_pairs} (context of {2 * self.num_pairs} tokens, then "
                f"room for {self.num_pairs} query/answer pairs)")
        # the first key (position 0) is asked at >= max(2N, min_gap); generate places the queries one at a
        # time, and each of the other N - 1 takes up to 3 of its positions (the query, its answer slot, the
        # slot before): with fewer than 3N - 2 allowed positions it can find none left
        earliest = max(2 * self.num_pairs, self.min_gap)
        if mx < earliest + 3 * self.num_pairs - 3:
            raise ValueError(f"{pre}{n('max_gap')} {mx} is too short for {nv('num_pairs')} and {nv('min_gap')}: "
                             f"the first key (position 0) can be asked only from position {earliest} on, and its "
                             f"query needs room beside the other {self.num_pairs - 1} (3 positions each); need "
                             f"{n('max_gap')} >= {earliest + 3 * self.num_pairs - 3}")
        return self

    def gap_pmf(self) -> np.ndarray:
        """Probability of each gap 0..seq_len-1 for a query placed with nothing else in the way."""
        g = np.arange(self.seq_len, dtype=np.float64)
        mx = self.seq_len if self.max_gap is None else self.max_gap
        w = np.where((g >= self.min_gap) & (g <= mx), np.maximum(g, 1) ** -float(self.power), 0.0)
        return w / w.sum()


def generate(task: MQARTask, n: int, seed: int = 0, rng: Optional[np.random.Generator] = None) -> dict:
    """``n`` MQAR sequences. Returns numpy arrays:

    ``input_ids`` / ``labels`` ``[n, T]``; ``query_pos`` ``[n, N]`` (sorted: the positions that
    predict an answer, i.e. the output positions); ``gaps`` ``[n, N]`` (query position minus key
    position, aligned with ``query_pos``); ``key_pos`` ``[n, N]``.
    (:func:`generate_chunks` gives the same rows a piece at a time.)
    """
    task.validate()
    rng = np.random.default_rng(seed) if rng is None else rng
    T, N = task.seq_len, task.num_pairs
    v0, v1 = task.value_range
    # the draws, in this order: noise, key order, values, query order, then each query's place
    noise = rng.integers(v0, v1, size=(n, T)) if task.fill == "noise" else None
    key_u = rng.random((n, task.n_keys))
    vals = rng.integers(v0, v1, size=(n, N))
    order_u = rng.random((n, N))
    return _assemble(task, noise, key_u, vals, order_u, lambda j: rng.random(n))


def _assemble(task: MQARTask, noise, key_u, vals, order_u, place_u) -> dict:
    """The sequences of :func:`generate` from its draws (row ``i`` only from row ``i`` of each):
    ``noise`` ``[n, T]`` (``None``: filler), ``key_u`` ``[n, n_keys]``, ``vals`` / ``order_u``
    ``[n, N]``, ``place_u(j)`` ``[n]`` (the uniforms placing the j-th query, asked in order j = 0, 1, ...)."""
    n = len(key_u)
    T, N = task.seq_len, task.num_pairs
    mx = T if task.max_gap is None else task.max_gap
    ids = np.full((n, T), FILLER, dtype=np.int64)
    if noise is not None:
        ids[:] = noise
    keys = np.argsort(key_u, axis=1)[:, :N] + 1  # distinct keys per row
    ids[:, 0:2 * N:2] = keys
    ids[:, 1:2 * N:2] = vals
    labels = np.full((n, T), -100, dtype=np.int64)
    free = np.ones((n, T), dtype=bool)
    free[:, :2 * N] = False
    free[:, T - 1] = False  # a query needs its answer slot after it
    qpos = np.zeros((n, N), dtype=np.int64)
    kpos = np.zeros((n, N), dtype=np.int64)
    pos = np.arange(T)
    order = np.argsort(order_u, axis=1)  # query keys in random order
    rows = np.arange(n)
    for j in range(N):
        ki = order[:, j]
        kp = 2 * ki  # key position of the key queried j-th
        gap = pos[None, :] - kp[:, None]
        ok = free & np.concatenate([free[:, 1:], np.zeros((n, 1), bool)], axis=1)
        ok &= (gap >= task.min_gap) & (gap <= mx)
        w = np.where(ok, np.maximum(gap, 1).astype(np.float64) ** -float(task.power), 0.0)
        tot = w.sum(axis=1)
        if (tot <= 0).any():
            raise ValueError(f"MQAR setting leaves no room for a query (seq_len={T}, num_pairs={N}, "
                             f"min_gap={task.min_gap}, max_gap={mx}); raise seq_len or max_gap, or lower num_pairs")
        cum = np.cumsum(w, axis=1)
        u = place_u(j) * tot
        p = np.minimum((cum <= u[:, None]).sum(axis=1), T - 2)
        # guard against rounding at the top end: step back to the last allowed position
        bad = ~ok[rows, p]
        if bad.any():
            p[bad] = T - 1 - np.argmax(ok[bad][:, ::-1], axis=1)
        ids[rows, p] = keys[rows, ki]
        if task.answer_in_input:
            ids[rows, p + 1] = vals[rows, ki]
        labels[rows, p + 1] = vals[rows, ki]
        free[rows, p] = False
        free[rows, p + 1] = False
        qpos[:, j] = p
        kpos[:, j] = kp
    srt = np.argsort(qpos, axis=1)
    qpos = np.take_along_axis(qpos, srt, 1)
    kpos = np.take_along_axis(kpos, srt, 1)
    return {"input_ids": ids, "labels": labels, "query_pos": qpos, "key_pos": kpos, "gaps": qpos - kpos}


def _rng_at(state: dict) -> np.random.Generator:
    """A generator that goes on from a saved ``PCG64`` state (a 32-bit half an ``integers`` call
    left buffered included: numpy's next bounded draw, in any later call, starts with it)."""
    bits = np.random.PCG64()
    bits.state = state
    return np.random.Generator(bits)


def _skip(rng: np.random.Generator, words: int) -> None:
    """Past ``words`` 64-bit draws (``random``'s doubles) at no cost; ``advance`` drops a buffered
    32-bit half, which ``random`` never touches and the next ``integers`` call takes: it is kept."""
    before = rng.bit_generator.state
    rng.bit_generator.advance(words)
    after = rng.bit_generator.state
    after["has_uint32"], after["uinteger"] = before["has_uint32"], before["uinteger"]
    rng.bit_generator.state = after


def _skip_integers(rng: np.random.Generator, lo: int, hi: int, k: int, piece: int = 1 << 20) -> None:
    """Past one ``integers(lo, hi, size=k)`` call's draws, ``piece`` values at a time (numpy's bounded
    integers read in pieces are one call's: the buffered half-word carries over)."""
    for a in range(0, k, piece):
        rng.integers(lo, hi, size=min(piece, k - a))


def generate_chunks(task: MQARTask, n: int, seed: int = 0, rows: int = 4096):
    """The ``n`` sequences of ``generate(task, n, seed)``, the same row for row, as dicts of at most
    ``rows`` sequences each (in order): only one piece is held at a time, so a long training stream
    needs the memory of ``rows`` sequences instead of ``n``. Each of generate's draws keeps its own
    place in the random stream (found without holding the draws before it)."""
    task.validate()
    if rows < 1:
        raise ValueError(f"rows must be >= 1, got {rows}")
    T, N, K = task.seq_len, task.num_pairs, task.n_keys
    v0, v1 = task.value_range
    start = np.random.default_rng(seed).bit_generator.state
    noise = _rng_at(start) if task.fill == "noise" else None
    walk = _rng_at(start)  # through generate's draws, to where each one starts
    if noise is not None:
        _skip_integers(walk, v0, v1, n * T)
    key_u = _rng_at(walk.bit_generator.state)
    _skip(walk, n * K)
    vals = _rng_at(walk.bit_generator.state)
    _skip_integers(walk, v0, v1, n * N)
    order_u = _rng_at(walk.bit_generator.state)
    _skip(walk, n * N)
    place = []
    for _ in range(N):
        place.append(_rng_at(walk.bit_generator.state))
        _skip(walk, n)
    for a in range(0, n, rows):
        m = min(rows, n - a)
        yield _assemble(task, None if noise is None else noise.integers(v0, v1, size=(m, T)),
                        key_u.random((m, K)), vals.integers(v0, v1, size=(m, N)), order_u.random((m, N)),
                        lambda j, m=m: place[j].random(m))


# ----------------------------------------------------------------------------------------------
# models and training


@dataclass
class MQARTrain:
    models: tuple = ("orthros", "transformer", "swa")
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 2
    linear_heads: Optional[int] = None  # GDN heads (state heads x (d/heads)^2); None: num_heads
    window_size: int = 8
    steps: int = 800
    batch_size: int = 32
    lr: float = 3e-3
    weight_decay: float = 0.1
    warmup: float = 0.1  # fraction of steps
    eval_examples: int = 1000
    seed: int = 0
    threads: Optional[int] = None
    device: str = "cpu"
    attn_backend: str = "auto"
    # train the decoder layers (forward and backward) through torch.compile, static shapes: the
    # same experiment as eager (optimiser, schedule, clipping, data, seeds), fewer kernel
    # launches per step. See compiled_layers.
    compile: bool = False


def model_backend(tr: MQARTrain) -> str:
    """The ``attn_backend`` the models are built with. A compiled run turns ``"auto"`` into
    ``"sdpa"``: every op the compiled graph traces is then plain PyTorch (SDPA and the reference
    for attention, the pure-PyTorch GDN), the code the CPU tests compile. On the CPU that is what
    ``"auto"`` picks anyway (the same run); on CUDA ``"auto"`` would take the Triton attention
    kernels (run outside the graph either way: ``orthros.layers.step.run_attention`` is
    ``torch.compiler.disable``d) and fla-core's GDN pieces, whose backend checks (an fla import,
    a one-time warning, the Hopper guard that sends training to the pure-PyTorch GDN anyway) would
    be traced by Dynamo untested. An explicit backend is kept as given."""
    return "sdpa" if tr.compile and tr.attn_backend == "auto" else tr.attn_backend


def _check_heads(tr: MQARTrain, names: Optional[dict] = None) -> int:
    """The GDN layers' heads (``linear_heads``, default ``num_heads``), once both divide ``hidden_size``
    (``names``: as :meth:`MQARTask.validate`'s)."""
    names = names or {}
    lin = tr.linear_heads or tr.num_heads
    for name, h in (("num_heads", tr.num_heads), ("linear_heads", lin)):
        if tr.hidden_size % h:
            raise ValueError(f"{names.get('hidden_size', 'hidden_size')} ({tr.hidden_size}) must be a multiple of "
                             f"{names.get(name, name)} ({h})")
    return lin


def build_model(mode: str, task: MQARTask, tr: MQARTrain, seed: int):
    from ..models import OrthrosConfig, OrthrosForCausalLM

    lin = _check_heads(tr)
    cfg = OrthrosConfig(
        vocab_size=task.vocab_size, hidden_size=tr.hidden_size, intermediate_size=2 * tr.hidden_size,
        num_hidden_layers=tr.num_layers, num_attention_heads=tr.num_heads, num_key_value_heads=tr.num_heads,
        head_dim=tr.hidden_size // tr.num_heads, max_position_embeddings=max(task.seq_len, 8),
        window_size=tr.window_size, use_cache=False, initializer_range=0.02,
        linear_num_key_heads=lin, linear_key_head_dim=tr.hidden_size // lin, linear_value_head_dim=tr.hidden_size // lin,
        **(hybrid_layout(mode, tr.num_layers) if mode in HYBRID_DISPLAY else {"attention_mode": mode}),
        attn_backend=model_backend(tr),
    )
    torch.manual_seed(seed)
    return OrthrosForCausalLM(cfg).to(tr.device)


def _batch(data: dict, sl, device="cpu"):
    return (torch.as_tensor(data["input_ids"][sl], device=device), torch.as_tensor(data["labels"][sl], device=device),
            torch.as_tensor(data["query_pos"][sl], device=device))


@torch.no_grad()
def evaluate(model, data: dict, window_size: int, batch_size: int = 250, device="cpu") -> dict:
    """Accuracy of the argmax (over the whole vocabulary) at every answer, overall, split by
    whether the key-value pair lies inside the sliding window of the query (gap < w) or not
    (``None`` for a split that holds no query: JSON has no NaN), and per power-of-two bucket of gaps
    (``acc_by_gap``: ``[lo, hi)``, the queries in it, accuracy)."""
    model.eval()
    n = data["input_ids"].shape[0]
    correct = []
    for s in range(0, n, batch_size):
        ids, labels, qp = _batch(data, slice(s, s + batch_size), device)
        logits = model(input_ids=ids, output_positions=qp).logits  # [B, N, V]
        tgt = torch.gather(labels, 1, qp + 1)
        correct.append((logits.argmax(-1) == tgt).cpu().numpy())
    correct = np.concatenate(correct)
    far = data["gaps"] >= window_size  # key outside the query's window (w keys incl. itself)

    def acc(mask):
        return float(correct[mask].mean()) if mask.any() else None

    gaps, by_gap, lo = data["gaps"], [], 1
    while lo <= gaps.max():
        inside = (gaps >= lo) & (gaps < 2 * lo)
        if inside.any():
            by_gap.append({"lo": lo, "hi": 2 * lo, "n": int(inside.sum()), "acc": acc(inside)})
        lo *= 2
    return {"acc": float(correct.mean()), "acc_gap_ge_window": acc(far), "acc_gap_lt_window": acc(~far),
            "n_queries": int(correct.size), "frac_gap_ge_window": float(far.mean()), "acc_by_gap": by_gap}


@contextmanager
def compiled_layers(model, enabled: bool):
    """With ``enabled``, run ``model``'s decoder layers through ``torch.compile`` inside the
    block (forward and, by AOTAutograd, backward); the eager model again after it.

    What is compiled: ``OrthrosModel.run_layers``, every layer's step (norms, projections,
    RoPE, the GDN layers' short convolution and pure-PyTorch chunked recurrence, the MLPs),
    set on this model object only and removed on exit. What is not:

    * the attention op: ``orthros.layers.step.run_attention`` is ``torch.compiler.disable``d
      (the op runs its own kernels), so each attention layer splits its graph in two around it
      (one graph break per attention layer, none per GDN layer);
    * the model's top-level forward (embedding, output positions, RoPE tables, final norm, LM
      head, loss): ``resolve_output_positions`` checks the positions on the host (``int(...)``,
      host syncs), which Dynamo would turn into a graph break plus a recompile for every new
      maximum query position, i.e. nearly every step. Eager, it is a few dozen ops.

    Choices, for a training loop of a tiny model that is launch-bound on a GPU:

    * ``dynamic=False``: batch, T and the number of queries are fixed within a run, so one
      static graph per piece (a different setting is a new run and a new compile).
    * the default mode. ``"reduce-overhead"`` (CUDA graphs) replays into static output buffers:
      the activations saved for backward and the gradients would be overwritten by the next
      replay unless cloned, and the graph breaks around attention split it into separately
      captured pieces; not worth the risk untested on a GPU. ``"max-autotune-no-cudagraphs"``
      spends minutes benchmarking matmul templates for 64 x 64 matrices, where launches, not
      the matmuls, cost the time.
    * the optimiser step, gradient clipping and the LR schedule stay eager: exactly the eager
      run's AdamW, ``clip_grad_norm_`` and ``LambdaLR`` (a float lr, nothing recompiles); on
      CUDA they are a few dozen foreach kernels, next to the hundreds of the model.
    * evaluation runs after the block: the eager model (other batch size, no grad), nothing
      recompiles.
    * on exit ``torch.compiler.reset()`` drops the compiled code: the layer functions are shared
      by every model of a run, and each model adds its own variants (its modules, its final
      layer), so without it the 4th-6th model of one process could reach Dynamo's per-function
      recompile limit (8) and silently fall back to eager.

    Yields a dict that holds, after the block, ``graphs`` (Dynamo graphs compiled) and
    ``graph_breaks`` (the distinct reasons, one line each) for the record.
    """
    info = {}
    if not enabled:
        yield info
        return
    from torch._dynamo.utils import counters

    counters.clear()
    inner = model.model
    inner.run_layers = torch.compile(inner.run_layers, dynamic=False)  # an instance attribute
    try:
        yield info
    finally:
        info.update(graphs=int(counters["stats"]["unique_graphs"]),
                    graph_breaks=sorted({re.sub(r" at 0x[0-9a-f]+|\s+", " ", " ".join(r.split("\n")[:2]))[:200]
                                         for r in counters["graph_break"]}))
        del inner.run_layers  # the class's method again
        torch.compiler.reset()


def train_one(name: str, task: MQARTask, tr: MQARTrain, train_data_fn, eval_data: dict, progress=None) -> dict:
    from ..training.optim import build_optimizer, build_scheduler, warmup_steps_from_fraction

    mode = MODEL_ALIASES[name]
    model = build_model(mode, task, tr, seed=tr.seed)
    opt = build_optimizer(model, lr=tr.lr, weight_decay=tr.weight_decay, betas=(0.9, 0.98))
    sched = build_scheduler(opt, total_steps=tr.steps, warmup_steps=warmup_steps_from_fraction(tr.warmup, tr.steps),
                            schedule="cosine", min_lr_ratio=0.0)
    model.train()
    sync = torch.cuda.synchronize if str(tr.device).startswith("cuda") else (lambda: None)
    t0 = time.perf_counter()
    first_s = None
    losses = []
    with compiled_layers(model, tr.compile) as compiled:
        for step in range(tr.steps):
            ids, labels, qp = train_data_fn(step)
            loss = model(input_ids=ids, labels=labels, output_positions=qp).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            losses.append(loss.detach())
            if step == 0:  # with compile: includes the compilation (graphs are built on the first call)
                sync()
                first_s = time.perf_counter() - t0
            if progress is not None:
                progress(name, step, losses[-1])
    sync()
    train_s = time.perf_counter() - t0
    res = evaluate(model, eval_data, tr.window_size, device=tr.device)
    res.update(model=DISPLAY[mode], attention_mode=mode, attn_backend=model_backend(tr), train_seconds=round(train_s, 1),
               first_step_seconds=round(first_s, 2), step_ms_after_first=(
                   round(1e3 * (train_s - first_s) / (tr.steps - 1), 2) if tr.steps > 1 else None),
               final_loss=float(torch.stack(losses[-max(1, tr.steps // 20):]).mean()),
               params=sum(p.numel() for p in model.parameters()))
    if tr.compile:
        res.update(compiled_graphs=compiled["graphs"], graph_breaks=compiled["graph_breaks"])
    return res


STREAM_TOKENS = 1 << 22  # tokens (or key draws) of the training stream made at once, in whole sequences


class _TrainStream:
    """``step -> (input_ids, labels, query_pos)`` on ``tr.device``: batch ``step`` of the run's training
    sequences, ``generate(task, steps * batch_size, seed + 1)`` (every model, in every process, sees the
    same). Made once, a piece at a time (:func:`generate_chunks`), and kept compact: the tokens in the
    smallest integer type that holds the vocabulary, the query positions and their answers (the labels
    are -100 but after each query). At --steps 20000 --batch-size 64 --seq-len 512 that is 0.7 GB (1.3 GB
    for a vocabulary above 256 tokens), where the stream made whole took ~25 GB."""

    def __init__(self, task: MQARTask, tr: MQARTrain, tokens: int = STREAM_TOKENS):
        n, T, N = tr.steps * tr.batch_size, task.seq_len, task.num_pairs
        self.batch_size, self.device = tr.batch_size, tr.device
        self.input_ids = np.empty((n, T), np.min_scalar_type(task.vocab_size - 1))
        self.query_pos = np.empty((n, N), np.min_scalar_type(T - 1))
        self.answers = np.empty((n, N), self.input_ids.dtype)
        rows, a = max(1, tokens // max(T, task.n_keys)), 0  # (a row draws n_keys uniforms to pick its keys)
        for piece in generate_chunks(task, n, seed=tr.seed + 1, rows=rows):
            m, qp = len(piece["input_ids"]), piece["query_pos"]
            self.input_ids[a:a + m] = piece["input_ids"]
            self.query_pos[a:a + m] = qp
            self.answers[a:a + m] = np.take_along_axis(piece["labels"], qp + 1, axis=1)
            a += m

    def __call__(self, step: int):
        sl = slice(step * self.batch_size, (step + 1) * self.batch_size)
        qp = self.query_pos[sl].astype(np.int64)
        labels = np.full(self.input_ids[sl].shape, -100, dtype=np.int64)
        np.put_along_axis(labels, qp + 1, self.answers[sl].astype(np.int64), axis=1)
        return _batch({"input_ids": self.input_ids[sl].astype(np.int64), "labels": labels, "query_pos": qp}, slice(None),
                      self.device)


def _train_stream(task: MQARTask, tr: MQARTrain) -> _TrainStream:
    """The run's training batches, ``step -> (input_ids, labels, query_pos)`` (see :class:`_TrainStream`)."""
    return _TrainStream(task, tr)


def _held_out(task: MQARTask, tr: MQARTrain) -> dict:
    """The held-out sequences of the run's seed (the same for every model)."""
    return generate(task, tr.eval_examples, seed=tr.seed + 2)


def _train_alone(name: str, task: MQARTask, tr: MQARTrain) -> dict:
    """One model in a worker process of ``run_mqar(jobs > 1)``: the same data from the same seeds."""
    if tr.threads:
        torch.set_num_threads(tr.threads)
    return train_one(name, task, tr, _train_stream(task, tr), _held_out(task, tr))


def _train_indexed(job: tuple) -> tuple:
    """``(i, name, task, tr) -> (i, result)``: :func:`_train_alone` in a pool of workers."""
    i, name, task, tr = job
    return i, _train_alone(name, task, tr)


def _worker_threads(tr: "MQARTrain", workers: int) -> Optional[int]:
    """Threads of each of ``workers`` processes training at once: ``tr.threads`` when given; on the CPU
    otherwise this process's share (each spawned worker would take torch's default, all cores: two
    workers on two cores ran 40-100x slower a step); elsewhere torch's choice."""
    if tr.threads or not str(tr.device).startswith("cpu"):
        return tr.threads
    return max(1, torch.get_num_threads() // workers)


def _ignore_sigint() -> None:
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _pct(x, width: int = 0) -> str:
    """A share as a percentage; ``-`` for ``None`` (a split of :func:`evaluate` without queries)."""
    return "-".rjust(width + 1) if x is None else f"{100 * x:{width}.1f}%"


def _log_result(log, res: dict):
    if log:
        log(f"  {res['model']:<11} acc {_pct(res['acc'], 5)}  (gap >= window: {_pct(res['acc_gap_ge_window'], 5)})"
            f"  loss {res['final_loss']:.3f}  {res['train_seconds']:.0f}s (first step {res['first_step_seconds']:.1f}s"
            + (f", then {res['step_ms_after_first']:.1f} ms/step)" if res["step_ms_after_first"] is not None else ")"))


def check_models(models, num_layers: int, arg: str = "models", layers_arg: str = "num_layers") -> tuple:
    """``models`` (names of ``MODEL_ALIASES``) checked before any model trains: at least one, each
    known and named once (two names of one model, e.g. ``transformer,full``, would train it twice on
    the same data and seed), every hybrid buildable with ``num_layers``. Errors name ``arg`` /
    ``layers_arg``."""
    if not models:
        raise ValueError(f"{arg} must name at least one model; choose from {', '.join(MODEL_ALIASES)}")
    seen = {}
    for m in models:
        if m not in MODEL_ALIASES:
            raise ValueError(f"{arg}: unknown model {m!r}; choose from {', '.join(MODEL_ALIASES)}")
        mode = MODEL_ALIASES[m]
        if mode in seen:
            raise ValueError(f"{arg} names {DISPLAY[mode]} twice ({seen[mode]}, {m}); name each model once")
        seen[mode] = m
        if mode in HYBRID_DISPLAY:  # before any model trains, not when its turn comes
            try:
                hybrid_layout(mode, num_layers)
            except ValueError as e:
                raise ValueError(f"{layers_arg} {num_layers}: {str(e).replace('num_layers', layers_arg)}") from None
    return tuple(models)


def check_run(task: MQARTask, tr: MQARTrain, jobs: int = 1, names: Optional[dict] = None) -> list:
    """Everything :func:`run_mqar` refuses, checked before it generates data or builds a model (and by
    ``mqar_sweep`` for every setting before the first runs): the task, the models, the sizes, the
    learning rate, seed, threads, compile and ``jobs``, and that the run fits in memory
    (:func:`check_memory`). Returns the model names. Errors name the fields of
    ``task`` and ``tr`` (``MQAR steps ...``), or, for a field in ``names``, that name (the caller's own, as
    :meth:`MQARTask.validate`'s ``names``)."""
    task.validate(names)
    names = names or {}

    def n(field):
        return names.get(field, field)

    pre = "" if names else "MQAR "
    models = list(check_models(tr.models, tr.num_layers, n("models"), n("num_layers")))
    for name in ("hidden_size", "num_layers", "num_heads", "window_size", "steps", "batch_size", "eval_examples"):
        v = getattr(tr, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{pre}{n(name)} must be an integer >= 1, got {v!r}")
    _check_heads(tr, names)
    if not (isinstance(tr.lr, (int, float)) and math.isfinite(tr.lr) and tr.lr > 0):
        raise ValueError(f"{pre}{n('lr')} must be a finite number > 0, got {tr.lr!r}")
    if isinstance(tr.seed, bool) or not isinstance(tr.seed, int):
        raise ValueError(f"{pre}{n('seed')} must be an integer >= 0, got {tr.seed!r}")
    check_seed(tr.seed, f"{pre}{n('seed')}")
    if tr.threads is not None and tr.threads < 0:
        raise ValueError(f"{pre}{n('threads')} must be >= 0 (0 or None: torch's own choice), got {tr.threads!r}")
    from ..ops.backends import BACKENDS

    if tr.attn_backend not in BACKENDS:
        raise ValueError(f"{pre}{n('attn_backend')} must be one of {', '.join(BACKENDS)}, got {tr.attn_backend!r}")
    if not isinstance(tr.compile, bool):
        raise ValueError(f"{pre}{n('compile')} must be a bool (True: train through torch.compile, False: eager), "
                         f"got {tr.compile!r}")
    jobs = check_positive_int(f"{pre}{n('jobs')} (models trained at once, one process each)", jobs)
    check_memory(task, tr, jobs, names)
    return models


def memory_needed(task: MQARTask, tr: MQARTrain, jobs: int = 1) -> list:
    """What a run certainly holds at once, by part: ``(what, fields, bytes, on the device)``, lower bounds
    (each part counts only its largest arrays; ``fields``: the settings that size it). Every model process
    (``jobs`` at once) holds its own data, model and activations."""
    T, N, V, d, L = task.seq_len, task.num_pairs, task.vocab_size, tr.hidden_size, tr.num_layers
    E, procs = tr.eval_examples, min(jobs, len(tr.models)) if jobs > 1 else 1
    tok = np.min_scalar_type(V - 1).itemsize
    return [
        # generate: ids and labels (int64), each query's placement weights and their cumulative sum (float64)
        ("the held-out sequences", ("eval_examples", "seq_len"), procs * E * T * 32, False),
        ("the held-out sequences' key draws", ("eval_examples", "vocab_size"), procs * E * task.n_keys * 16, False),
        ("the training sequences", ("steps", "batch_size", "seq_len"),
         procs * tr.steps * tr.batch_size * (T * tok + N * (np.min_scalar_type(T - 1).itemsize + tok)), False),
        # weights, gradients and AdamW's two moments in fp32: the embedding and every layer's MLP (6 d^2)
        ("a model's weights and optimiser state", ("vocab_size", "hidden_size", "num_layers"),
         procs * 16 * (V * d + L * 6 * d * d), True),
        # a training step keeps at least 8 vectors of d per token and layer for the backward pass
        ("a training step's activations", ("batch_size", "seq_len", "hidden_size", "num_layers"),
         procs * 4 * 8 * tr.batch_size * T * d * L, True),
    ]


def check_memory(task: MQARTask, tr: MQARTrain, jobs: int = 1, names: Optional[dict] = None, available=None) -> None:
    """Refuse, before any allocation, a run that cannot fit: :func:`memory_needed` (a lower bound) against
    the memory free on the host and on ``tr.device`` (``available(device)``, default
    :func:`orthros.utils.available_memory`; ``None``: unknown, not checked). The error names
    the largest part and the settings that size it (``names``: as :meth:`MQARTask.validate`'s)."""
    from ..utils import available_memory, format_bytes

    # (with jobs > 1 the models train in spawned workers and this process never touches CUDA: it asks
    # another process, so as not to hold a CUDA context of its own for the whole run)
    pool = jobs > 1 and len(tr.models) > 1
    available = available or (lambda device: available_memory(device, in_subprocess=pool))
    names, pre = names or {}, "" if names else "MQAR "
    parts = memory_needed(task, tr, jobs)
    values = {**asdict(task), **asdict(tr)}
    on_cpu = str(tr.device).startswith("cpu")
    for device, mine in (("cpu", [p for p in parts if on_cpu or not p[3]]),
                         (tr.device, [] if on_cpu else [p for p in parts if p[3]])):
        need, free = sum(p[2] for p in mine), available(device) if mine else None
        if free is None or need <= free:
            continue
        what, fields, size, _ = max(mine, key=lambda p: p[2])
        said = [names.get(f, f) for f in fields]
        sizes = " x ".join(f"{s} {values[f]}" if s.startswith("-") else f"{s}={values[f]}" for s, f in zip(said, fields))
        raise ValueError(f"{pre}this run needs at least {format_bytes(need)} of {'host' if device == 'cpu' else device} "
                         f"memory, more than the {format_bytes(free)} free: {what} ({sizes}) take "
                         f"{format_bytes(size)}" + (f" ({min(jobs, len(tr.models))} models at once)" if jobs > 1 else "")
                         + f"; lower {', '.join(said[:-1])} or {said[-1]}")


def run_mqar(task: MQARTask, tr: MQARTrain, progress: bool = True, log=print, jobs: int = 1) -> dict:
    """Train each model on the same stream of batches (same seeds, steps, lr, size) and evaluate
    on the same held-out sequences. Returns a JSON-able dict.

    ``jobs > 1`` trains up to that many models at once, each in its own (spawned) process that
    regenerates the same data from the same seeds: on a GPU, where these small models are
    launch-bound, the device interleaves them and the wall time is about that of the slowest
    model. Results (and the table) keep the order of ``tr.models``; no progress bars then, a
    line per model as it finishes."""
    names = check_run(task, tr, jobs)
    if jobs > 1 and len(names) > 1:
        import multiprocessing as mp

        # Workers ignore SIGINT: a Ctrl-C (sent to the whole process group) is the parent's, whose
        # `with` then terminates them. (concurrent.futures' pool handed each worker's
        # KeyboardInterrupt back as a result, started the next model, and waited for them all.)
        results = [None] * len(names)
        workers = min(jobs, len(names))
        tr_w = replace(tr, threads=_worker_threads(tr, workers))
        with mp.get_context("spawn").Pool(workers, initializer=_ignore_sigint) as pool:
            for i, res in pool.imap_unordered(_train_indexed, [(i, name, task, tr_w) for i, name in enumerate(names)]):
                results[i] = res
                _log_result(log, res)
        eval_data = _held_out(task, tr)  # for the gap statistics below
    else:
        if tr.threads:
            torch.set_num_threads(tr.threads)
        eval_data = _held_out(task, tr)
        data_fn = _train_stream(task, tr)
        results = []
        for name in names:
            bar = Progress(tr.steps, f"MQAR {DISPLAY[MODEL_ALIASES[name]]}", unit="step", enabled=progress,
                           leave=False)

            def cb(_n, step, loss, bar=bar):  # the loss read (a device sync) every 25th step and at the last
                bar.update(1, **({"loss": f"{float(loss):.3f}"} if step % 25 == 0 or step == tr.steps - 1 else {}))

            res = train_one(name, task, tr, data_fn, eval_data, progress=cb if progress else None)
            bar.close()
            results.append(res)
            _log_result(log, res)
    gaps = eval_data["gaps"]
    return {
        "task": asdict(task),
        "train": {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(tr).items()},
        "jobs": jobs,
        "eval_gap_stats": {"min": int(gaps.min()), "median": float(np.median(gaps)), "max": int(gaps.max()),
                           "frac_ge_window": float((gaps >= tr.window_size).mean())},
        "results": results,
    }


def plot_recall(out: dict, path, title: Optional[str] = None, *, name: Optional[str] = None):
    """Accuracy against the key-to-query distance, one line a model, the window marked: where a
    sliding window stops recalling and full attention (or Orthros' output stream) does not. A failed
    write is an ``OSError`` naming ``path`` (after ``name``, the caller's option for it, if given)."""
    from matplotlib.ticker import FuncFormatter

    from ..utils import pyplot, save_figure

    plt = pyplot()

    w = out["train"]["window_size"]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for i, r in enumerate(out["results"]):
        b = r["acc_by_gap"]
        ax.plot([(x["lo"] * x["hi"]) ** 0.5 for x in b], [100 * x["acc"] for x in b], "o-", ms=4, color=f"C{i}",
                label=f"{r['model']} ({100 * r['acc']:.1f}% overall)")
    ax.axvline(w, color="0.4", ls="--", lw=1)
    ax.text(w, 2, f" window = {w}", color="0.3", fontsize=8)
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_ylim(0, 103)
    ax.set_xlabel("distance from the key to its query (tokens, power-of-two buckets)")
    ax.set_ylabel("answers right (%)")
    t = out["task"]
    ax.set_title(title or f"MQAR: {t['num_pairs']} pairs, sequences of {t['seq_len']}, "
                          f"{out['train']['steps']} steps a model", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")  # (lower left hid the points of models near chance)
    fig.tight_layout()
    save_figure(fig, path, name=name)
    return fig


def format_table(out: dict) -> str:
    w = out["train"]["window_size"]
    rows = [("model", "accuracy", f"gap >= {w}", f"gap < {w}", "params", "train s")]
    for r in out["results"]:
        rows.append((r["model"], _pct(r["acc"]), _pct(r["acc_gap_ge_window"]), _pct(r["acc_gap_lt_window"]),
                     f"{r['params']:,}", f"{r['train_seconds']:.0f}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(widths[i]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(row)) for row in rows]
    lines.insert(1, "  ".join("-" * x for x in widths))
    return "\n".join(lines)

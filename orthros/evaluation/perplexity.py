"""Perplexity on held-out text by token position (``orthros eval ppl``).

Every scored sequence is a window of exactly ``seq_len`` consecutive tokens of one held-out
document (documents shorter than ``seq_len`` are skipped; a long document gives several
non-overlapping windows, the first one starting at the document's start). The model sees
each window from its first token, so the token at position ``p`` is predicted from the ``p``
tokens before it. Negative log-likelihoods are summed per position and reported per bucket of
positions (default 0-128, 128-512, 512-2K, 2K-8K: a bucket ``[a, b)`` holds the predicted
tokens at positions ``a <= p < b``; position 0 is never predicted). The same windows score
every model, so bucket figures of two models are comparable token for token.

For an Orthros model the logits come from the output stream at every position (the PT
paradigm): at position ``t`` exactly what a prefill of tokens ``0..t`` gives.
"""

from __future__ import annotations

import json
import math
import time
from typing import Optional

from ..utils import Progress, check_input_file, read_text_file

DEFAULT_BUCKETS = (0, 128, 512, 2048, 8192)


def _fmt(n: int) -> str:
    return f"{n // 1024}K" if n >= 1024 and n % 1024 == 0 else str(n)


def bucket_names(edges) -> list[str]:
    return [f"{_fmt(a)}-{_fmt(b)}" for a, b in zip(edges[:-1], edges[1:])]


def default_buckets(seq_len: int) -> list[int]:
    """The bucket edges when none are given: ``DEFAULT_BUCKETS`` up to ``seq_len`` (the edges below it,
    then ``seq_len``), so a shorter ``--seq-len`` needs no ``--buckets`` of its own."""
    if seq_len >= DEFAULT_BUCKETS[-1]:
        return list(DEFAULT_BUCKETS)
    return [e for e in DEFAULT_BUCKETS if e < seq_len] + [seq_len]


def check_buckets(edges, seq_len: int) -> list[int]:
    edges = [int(e) for e in edges]
    if len(edges) < 2 or edges[0] < 0 or any(b <= a for a, b in zip(edges, edges[1:])):
        raise ValueError(f"--buckets must be at least two increasing integers >= 0, got {edges}")
    if edges[-1] > seq_len:
        raise ValueError(f"--buckets: the last edge ({edges[-1]}) is beyond --seq-len ({seq_len})")
    if edges[:2] == [0, 1]:
        raise ValueError("--buckets: the bucket 0-1 holds no scored token (the token at position 0 is never "
                         "predicted); start the edges at 1, or end the first bucket after 1")
    return edges


def load_documents(path, arg: str = "--data") -> list[str]:
    """Documents of a ``.jsonl`` file (field ``text``, one per line) or a ``.txt`` file (one document).
    Errors name the file as the command-line argument ``arg``."""
    p = check_input_file(arg, path, "a .jsonl with a 'text' field per line, or a .txt")
    if p.suffix.lower() == ".json":  # would be read as one plain-text document, brackets and field names too
        raise ValueError(f"{arg} {p}: a .json file; give a .jsonl (one object with a 'text' field a line) or a .txt")
    text = read_text_file(p, arg)
    if p.suffix.lower() == ".jsonl":
        docs = []
        for i, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{arg} {p}: line {i} is not JSON ({e})") from None
            if not isinstance(rec, dict) or not isinstance(rec.get("text"), str):
                raise ValueError(f"{arg} {p}: line {i} has no string field 'text'")
            docs.append(rec["text"])
    else:
        docs = [text]
    docs = [d for d in docs if d.strip()]
    if not docs:
        raise ValueError(f"{arg} {p}: no text")
    return docs


def make_windows(tokenizer, documents, seq_len: int, max_windows: int | None = None) -> list[list[int]]:
    """Non-overlapping windows of exactly ``seq_len`` tokens, each inside one document, in
    document order (``max_windows`` caps the count)."""
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 2:
        raise ValueError(f"seq_len must be an integer >= 2, got {seq_len!r}")
    windows, longest = [], 0
    for doc in documents:
        ids = list(tokenizer(doc, add_special_tokens=False)["input_ids"])
        longest = max(longest, len(ids))
        for s in range(0, len(ids) - seq_len + 1, seq_len):
            windows.append(ids[s:s + seq_len])
            if max_windows is not None and len(windows) >= max_windows:
                return windows
    if not windows:
        raise ValueError(f"no held-out document has {seq_len} tokens (the longest has {longest}); "
                         f"lower --seq-len or give longer documents")
    return windows


def position_perplexity(model, windows, *, buckets=None, device=None, autocast_dtype=None,
                        chunk: int = 2048, progress: bool = True) -> dict:
    """Perplexity of ``model`` per position bucket over ``windows`` (lists of token ids of one length);
    ``buckets``: the edges (default: :func:`default_buckets` of the windows' length)."""
    import torch
    import torch.nn.functional as F

    if not windows:
        raise ValueError("no windows to score")
    T = len(windows[0])
    if any(len(w) != T for w in windows):
        raise ValueError("every window must have the same length")
    edges = check_buckets(default_buckets(T) if buckets is None else buckets, T)
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:  # < 1 scored nothing: ppl 1.0
        raise ValueError(f"chunk (positions per log-softmax) must be an integer >= 1, got {chunk!r}")
    dev = torch.device(device) if device is not None else next(model.parameters()).device
    nll = torch.zeros(T, dtype=torch.float64)  # summed NLL of the token at each position
    was_training = model.training
    model.eval()
    t0 = time.perf_counter()
    bar = Progress(len(windows), "perplexity", unit="window", enabled=progress)
    ctx = (torch.autocast(device_type=dev.type, dtype=autocast_dtype) if autocast_dtype is not None
           else torch.autocast(device_type=dev.type, enabled=False))
    with torch.no_grad():
        for w in windows:
            ids = torch.tensor([w], device=dev)
            with ctx:
                logits = model(input_ids=ids, use_cache=False).logits
            for s in range(0, T - 1, chunk):  # float32 log-softmax a chunk at a time
                e = min(s + chunk, T - 1)
                lp = F.cross_entropy(logits[0, s:e].float(), ids[0, s + 1:e + 1], reduction="none")
                nll[s + 1:e + 1] += lp.double().cpu()
            del logits
            bar.update(1)
    bar.close()
    model.train(was_training)
    n = len(windows)
    out = {"seq_len": T, "windows": n, "buckets": [], "seconds": round(time.perf_counter() - t0, 2)}
    for name, a, b in zip(bucket_names(edges), edges[:-1], edges[1:]):
        lo = max(a, 1)
        if b <= lo:
            continue
        tot, cnt = float(nll[lo:b].sum()), (b - lo) * n
        out["buckets"].append({"bucket": name, "start": a, "end": b, "tokens": cnt, "nll": tot / cnt,
                               "ppl": math.exp(tot / cnt)})
    tot = float(nll[1:].sum())
    out["overall"] = {"tokens": (T - 1) * n, "nll": tot / ((T - 1) * n), "ppl": math.exp(tot / ((T - 1) * n))}
    # per-position NLL in bins of 64 positions (for plots)
    step = 64
    out["curve"] = [{"start": s, "end": min(s + step, T),
                     "nll": float(nll[max(s, 1):min(s + step, T)].sum()) / ((min(s + step, T) - max(s, 1)) * n)}
                    for s in range(0, T, step) if min(s + step, T) > max(s, 1)]
    return out


def _position_ticks(lo: float, seq_len: int, edges) -> list[int]:
    """The x ticks of :func:`plot_position_perplexity`: ``seq_len`` and the bucket ``edges`` (the lengths
    measured), and the powers of two from the one at or below ``lo`` (the first point) up that are not
    within a factor 1.5 of one of them."""
    marks = sorted({int(e) for e in edges if lo <= e < seq_len} | {int(seq_len)})
    p = 2 ** math.floor(math.log2(max(lo, 1)))
    while p < seq_len:
        if all(max(p, m) / min(p, m) >= 1.5 for m in marks):
            marks.append(p)
        p *= 2
    return sorted(marks)


def plot_position_perplexity(results: dict, path, title: Optional[str] = None, *, name: Optional[str] = None):
    """``{name: position_perplexity output}`` -> perplexity against token position (bins of 64,
    log axis), one line a model, the buckets' edges marked: how much the context helps. A failed
    write is an ``OSError`` naming ``path`` (after ``name``, the caller's option for it, if given)."""
    from matplotlib.ticker import FuncFormatter, NullLocator

    from ..utils import pyplot, save_figure

    plt = pyplot()

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for i, (label, r) in enumerate(results.items()):
        c = r["curve"]
        ax.plot([(max(p["start"], 1) + p["end"]) / 2 for p in c], [math.exp(p["nll"]) for p in c], "-", lw=1.4,
                color=f"C{i}", label=f"{label}: {r['overall']['ppl']:.3f} overall")
    first = next(iter(results.values()))
    for b in first["buckets"][1:]:
        ax.axvline(b["start"], color="0.75", lw=0.8)
    ax.set_xscale("log", base=2)
    # ticks at the lengths measured (the bucket edges, the window's end) and powers of two between them:
    # the log axis's own left the window's end unmarked (--seq-len 128: ticks 32 and 64 only)
    lo = min((max(p["start"], 1) + p["end"]) / 2 for r in results.values() for p in r["curve"])
    ticks = _position_ticks(lo, first["seq_len"], [b["start"] for b in first["buckets"][1:]])
    ax.set_xticks(ticks)
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlim(min(lo, ticks[0]) / 1.1, first["seq_len"] * 1.05)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: _fmt(int(v)) if v >= 1 else f"{v:g}"))
    ax.set_xlabel("token position in the window (bins of 64; grey: bucket edges)")
    ax.set_ylabel("perplexity")
    ax.set_title(title or f"held-out perplexity by position: {first['windows']} windows of {first['seq_len']} tokens",
                 fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path, name=name)
    return fig


def format_table(results: dict) -> str:
    """``{model name: position_perplexity output}`` -> a Markdown table of perplexities."""
    names = list(results)
    buckets = [b["bucket"] for b in results[names[0]]["buckets"]]
    lines = ["| model | " + " | ".join(buckets) + " | all |", "|---|" + "---|" * (len(buckets) + 1)]
    for n in names:
        r = results[n]
        lines.append(f"| {n} | " + " | ".join(f"{b['ppl']:.3f}" for b in r["buckets"]) +
                     f" | {r['overall']['ppl']:.3f} |")
    return "\n".join(lines)


__all__ = ["DEFAULT_BUCKETS", "bucket_names", "check_buckets", "default_buckets", "load_documents", "make_windows",
           "position_perplexity", "format_table", "plot_position_perplexity"]

"""Inference benchmarks (paper Sections 4.5, 4.6): prefill latency vs. prompt length, decode
step latency vs. context, and end-to-end generation (TTFT, E2E latency, throughputs).

Every function returns a list of row dicts; :func:`save` writes them as JSON with the run's
metadata, :func:`print_table` prints them and the ``plot_*`` functions draw log-axis PNGs.
Timings: wall clock around the call, synchronised with the device (see :func:`measure`).
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import os
import platform
import statistics
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from ..engine import Engine, SamplingParams
from ..engine.cache import StaticKVCache
from ..engine.engine import compile_fallbacks
from ..layers.step import stack_rows
from ..utils import Progress, commit_id, pyplot, save_figure, write_json
from .models import register_noattn, weight_bytes_per_step

PREFILL_SYSTEMS = ("orthros", "orthros-floor", "full", "hf-sdpa", "hf-floor")
SYSTEM_LABELS = {
    "orthros": "Orthros (engine)",
    "orthros-floor": "no-attention floor (engine)",
    "full": "Transformer (engine, SDPA)",
    "hf-sdpa": "HF Qwen3 (sdpa)",
    "hf-floor": "no-attention floor (HF)",
}


# ------------------------------------------------------------------ the engine's no-attention floor
class _NoAttention:
    """A cache view whose attention is a no-op (its output is the query): K/V are still
    written, so everything but the attention kernels is the engine's own work. The rest of the
    view's protocol (a GDN layer's states, ``out_last``, the decode write) is the view's own."""

    qkv_kernel = False  # no attention kernel to take the q/k prologue and the K/V write

    def __init__(self, view):
        self.view = view

    def __getattr__(self, name):
        return getattr(self.view, name)

    def attend(self, q, q_full, k, v, step, **kw):
        return stack_rows(q, q_full)


class _FloorCache(StaticKVCache):
    def prefill_view(self, *args):
        return _NoAttention(super().prefill_view(*args))

    def decode_view(self, *args):
        return _NoAttention(super().decode_view(*args))


class FloorEngine(Engine):
    """The engine with attention replaced by a no-op: the lower bound a prefill (or a decode
    step) of the same engine can reach. Outputs are meaningless."""

    cache_class = _FloorCache


class CompileFallbacks(list):
    """While entered, collects (live) the engine's "torch.compile of ... failed" warnings: the
    token-wise pieces that ran eagerly, for the run's metadata."""

    def __enter__(self):
        import warnings

        self._orig = warnings.showwarning

        def show(message, category, *args, **kwargs):
            if "torch.compile of" in str(message):
                self.append(str(message))
            return self._orig(message, category, *args, **kwargs)
        warnings.showwarning = show
        return self

    def __exit__(self, *exc):
        import warnings

        warnings.showwarning = self._orig
        return False


# ------------------------------------------------------------------ helpers
def _json_object(text: str, example: str, allow_empty: bool = False) -> Dict:
    """``text`` as a JSON object (a benchmark flag's value), or ValueError saying what to give
    (``example``)."""
    import json

    try:
        d = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"not JSON ({e.msg}); give an object such as '{example}'") from None
    if not isinstance(d, dict) or not (d or allow_empty):
        raise ValueError(f"give a {'' if allow_empty else 'non-empty '}JSON object such as '{example}'")
    return d


def parse_decode_config(text: str) -> Dict:
    """``--decode-config`` of the benchmarks: a JSON object of :data:`DECODE_CONFIG` overrides
    (e.g. ``'{"min_split": 64}'``), checked here (keys and values) so a bad one stops the run
    before any work; ValueError names what is allowed."""
    from ..ops.triton.decode import check_decode_config

    d = _json_object(text, '{"min_split": 64}')
    check_decode_config(d)
    return d


def parse_compile_options(text: str) -> Dict:
    """``--decode-compile-options`` of the benchmarks: a JSON object of Inductor options for the
    engine's decode pieces, in place of ``orthros.engine.engine.DECODE_COMPILE_OPTIONS`` (``{}``:
    Inductor's defaults); every key must be an option of ``torch._inductor.config``."""
    import torch._inductor.config as inductor_config

    d = _json_object(text, '{"realize_reads_threshold": 5}', allow_empty=True)
    unknown = [k for k in d if not hasattr(inductor_config, k)]
    if unknown:
        raise ValueError(f"not options of torch._inductor.config: {', '.join(map(repr, unknown))}")
    return d


def parse_bwd_config(text: str) -> Dict:
    """``--window-bwd-config`` of the benchmarks: a JSON object of the window backward's launch
    configs (``orthros.ops.triton.attention.check_bwd_config``), e.g. ``'{"fused": false}'``."""
    from ..ops.triton.attention import check_bwd_config

    d = _json_object(text, '{"bwd_dkdv": [32, 64, 4, 2], "fused": true}')
    check_bwd_config(d)
    return d


@contextlib.contextmanager
def decode_compile_options(options: Dict):
    """Within the block, engines built use ``options`` (parsed by :func:`parse_compile_options`)
    for their compiled decode pieces; the default comes back afterwards."""
    from ..engine import engine as engine_mod

    keep = engine_mod.DECODE_COMPILE_OPTIONS
    engine_mod.DECODE_COMPILE_OPTIONS = dict(options)
    try:
        yield engine_mod.DECODE_COMPILE_OPTIONS
    finally:
        engine_mod.DECODE_COMPILE_OPTIONS = keep


@contextlib.contextmanager
def decode_qkv_kernel(on: Optional[bool]):
    """Within the block, engines built with ``qkv_kernel=None`` (the default) use ``on`` for
    their CUDA decode steps (``None``: the engine's own :data:`~orthros.engine.engine.DECODE_QKV_KERNEL`)."""
    from ..engine import engine as engine_mod

    keep = engine_mod.DECODE_QKV_KERNEL
    if on is not None:
        engine_mod.DECODE_QKV_KERNEL = bool(on)
    try:
        yield engine_mod.DECODE_QKV_KERNEL
    finally:
        engine_mod.DECODE_QKV_KERNEL = keep


def _sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def time_call(fn: Callable, device) -> float:
    """Seconds of one call, device-synchronised."""
    _sync(device)
    t = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - t


def trace_kernels(fn: Callable, device, reps: int) -> List[Tuple[str, float, float]]:
    """The CUDA kernels of ``reps`` calls of ``fn`` (kernels replayed from a CUDA graph included)
    as the profiler records them: ``[(name, start_us, duration_us)]`` sorted by start, copies
    and memsets left out; ``[]`` off CUDA."""
    if torch.device(device).type != "cuda":
        return []
    _sync(device)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        _sync(device)
    out = [(e.name, float(e.time_range.start), float(e.time_range.elapsed_us())) for e in prof.events()
           if e.device_type == torch.autograd.DeviceType.CUDA and not e.name.lower().startswith(("memcpy", "memset"))]
    return sorted(out, key=lambda k: k[1])


def _environment(device) -> Dict:
    """Where a result was measured: the device's name, the commit, torch / triton / Python
    versions, and the ``ORTHROS_*`` settings of the environment (the kernels' A/B switches, read
    at import: e.g. ``ORTHROS_GEMV_EVICT_FIRST``, ``ORTHROS_PDL_SIGNAL``)."""
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    dev = torch.device(device)
    return {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else (platform.processor() or "cpu"),
            "commit": commit_id(), "torch": torch.__version__, "triton": triton_version,
            "python": platform.python_version(),
            "orthros_env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("ORTHROS_")}}


def script_meta(device, argv) -> Dict:
    """The fields a micro-benchmark script's JSON meta starts with (``benchmarks/gemv.py``,
    ``benchmarks/persistent_chain.py``): UTC time to the second, :func:`_environment` and the
    script's arguments."""
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            **_environment(device), "argv": list(argv)}


def capture_graph(fn: Callable, device, warmup: int = 3) -> "torch.cuda.CUDAGraph":
    """A CUDA graph of one call of ``fn`` on ``device``, captured after ``warmup`` calls on a side
    stream (as capture wants: allocator and kernels warm, nothing captured twice)."""
    s = torch.cuda.Stream(device)
    s.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(s):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream(device).wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g


def replay_seconds(g: "torch.cuda.CUDAGraph", reps: int, warmup: int = 3) -> float:
    """Median seconds of one replay of ``g`` over ``reps`` replays timed by CUDA events, after
    ``warmup`` untimed ones."""
    for _ in range(warmup):
        g.replay()
    ts = []
    for _ in range(max(1, reps)):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        g.replay()
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1) / 1000)
    return statistics.median(ts)


def measure(fn: Callable, device, *, budget_s: float = 3.0, max_reps: int = 10, single_shot_s: float = 25.0) -> Dict:
    """Median milliseconds of ``fn`` and peak memory. The first call warms up (kernel
    compilation for new shapes) and is dropped, unless it alone takes over ``single_shot_s``
    (then it is the only sample, ``n = 1``); then repeats for about ``budget_s``, at least one."""
    cuda = torch.device(device).type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    first = time_call(fn, device)
    if first > single_shot_s:
        times = [first]
    else:
        times = []
        while len(times) < max(1, max_reps) and (not times or sum(times) + times[-1] < budget_s):
            times.append(time_call(fn, device))
    out = {"ms": 1000 * statistics.median(times), "n": len(times)}
    if cuda:
        out["peak_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    return out


def _free(device):
    """Between cells, on CUDA: the last cell's engine and caches back to the allocator (a compiled
    engine's cycles need the collector), its cached blocks back to the device. On a CPU refcounting
    frees an eager engine, and a full ``gc.collect`` costs ~0.4 s there: most of a smoke run of
    tiny cells."""
    if torch.device(device).type == "cuda":
        gc.collect()
        torch.cuda.empty_cache()


def metadata(model, device, dtype, extra=None) -> Dict:
    meta = {
        "date": datetime.date.today().isoformat(),
        **_environment(device),
        "dtype": str(dtype).replace("torch.", ""),
        "model": {k: getattr(model.config, k) for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                                         "num_attention_heads", "num_key_value_heads", "head_dim",
                                                         "vocab_size", "window_size")},
        "params_b": sum(p.numel() for p in model.parameters()) / 1e9,
    }
    try:
        meta["transformers"] = __import__("transformers").__version__
    except ImportError:
        meta["transformers"] = None
    meta.update(extra or {})
    return meta


def save(path, meta, rows):
    """``{"meta": ..., "rows": ...}`` to ``path``, atomically (a temporary name, then rename)."""
    write_json(path, {"meta": meta, "rows": rows}, indent=1)


def print_table(rows: List[Dict], cols: Sequence[str], title: str = ""):
    if title:
        print(f"\n{title}")
    fmt = lambda v: f"{v:.4g}" if isinstance(v, float) else str(v)  # noqa: E731
    cells = [[fmt(r.get(c, "")) for c in cols] for r in rows]
    widths = [max(len(c), *(len(x[i]) for x in cells)) if cells else len(c) for i, c in enumerate(cols)]
    print("  ".join(c.rjust(w) for c, w in zip(cols, widths)))
    for x in cells:
        print("  ".join(v.rjust(w) for v, w in zip(x, widths)))


# ------------------------------------------------------------------ prefill
def _measure_or_oom(run, device, **kw) -> Dict:
    """:func:`measure`, or a point of no time (``None``: JSON has no NaN) marked "out of memory"
    (the sweep goes on)."""
    try:
        return measure(run, device, **kw)
    except torch.cuda.OutOfMemoryError:
        return {"ms": None, "error": "out of memory"}


def _emit(rows: List[Dict], row: Dict, on_row: Optional[Callable], bar, label: str) -> None:
    """Record one measured point: keep it, hand it to ``on_row`` (partial saves), show it."""
    rows.append(row)
    if on_row:
        on_row(row)
    bar.update(1, last=label)


def bench_prefill(model, lengths: Sequence[int], *, systems: Sequence[str] = PREFILL_SYSTEMS,
                  chunk: Optional[int] = 16384, hf_model_fn: Optional[Callable] = None, budget_s: float = 3.0,
                  batch: int = 1, on_row: Optional[Callable] = None, single_shot_s: float = 25.0,
                  compile: bool = False) -> List[Dict]:
    """Prefill latency (prompt in, first-token logits out) per system and prompt length.

    ``orthros`` and ``orthros-floor`` use ``chunk``; the engine's Transformer (``full``) runs
    the prompt unchunked so its attention is one causal SDPA call (the fastest backend);
    ``hf-*`` call HF transformers' model with ``logits_to_keep=1``, ``use_cache=False``."""
    for s in systems:
        if s not in PREFILL_SYSTEMS:
            raise ValueError(f"unknown prefill system {s!r}; choose from {PREFILL_SYSTEMS}")
    systems = list(dict.fromkeys(systems))  # a system named twice is timed once (was: two rows of one key)
    device = next(model.parameters()).device
    V = model.config.vocab_size
    Lmax = max(lengths)
    rows = []
    bar = Progress(len(lengths) * len(systems), "prefill", unit="point")
    gen = torch.Generator(device="cpu").manual_seed(0)
    ids = {T: torch.randint(0, V, (batch, T), generator=gen).to(device) for T in lengths}

    def record(system, T, res):
        said = res["error"] if "error" in res else f"{res['ms']:.1f} ms"
        _emit(rows, {"system": system, "T": T, "batch": batch, **res}, on_row, bar, f"{system} T={T}: {said}")

    for system in [s for s in systems if not s.startswith("hf")]:
        mode = "full" if system == "full" else "orthros"
        cls = FloorEngine if system.endswith("floor") else Engine
        eng = cls(model, max_batch_size=batch, max_seq_len=Lmax, cuda_graphs=False, attention_mode=mode,
                  prefill_chunk=None if system == "full" else chunk, compile=compile)
        for T in lengths:
            def run():
                eng.reset()
                eng.prefill(ids[T])
            res = _measure_or_oom(run, device, budget_s=budget_s, single_shot_s=single_shot_s)
            if "error" not in res:
                res["kv_cache_gib"] = T * batch * eng.cache.bytes_per_token() / 2**30
            record(system, T, res)
            _free(device)
        del eng
        _free(device)

    hf_systems = [s for s in systems if s.startswith("hf")]
    if hf_systems:
        if hf_model_fn is None:
            raise ValueError("hf-* systems need hf_model_fn")
        noattn = register_noattn()
        hf = hf_model_fn()
        for system in hf_systems:
            hf.set_attn_implementation("sdpa" if system == "hf-sdpa" else noattn)
            for T in lengths:
                def run():
                    with torch.no_grad():
                        hf(input_ids=ids[T], use_cache=False, logits_to_keep=1)
                record(system, T, _measure_or_oom(run, device, budget_s=budget_s, single_shot_s=single_shot_s))
                _free(device)
        del hf
        _free(device)
    bar.close()
    return rows


def prefill_summary(rows) -> List[Dict]:
    """One row per length: each system's ms and the ratios the targets are stated in."""
    by = {}
    for r in rows:
        by.setdefault(r["T"], {})[r["system"]] = r.get("ms")
    out = []
    for T in sorted(by):
        d = by[T]
        row = {"T": T, **{s: d[s] for s in PREFILL_SYSTEMS if s in d}}
        o = d.get("orthros")
        for base in ("hf-floor", "hf-sdpa", "full", "orthros-floor"):
            if o and d.get(base):
                row[f"{base}/orthros"] = d[base] / o
        out.append(row)
    return out


# ------------------------------------------------------------------- decode
def copy_bandwidth(device, nbytes: int = 2**30) -> float:
    """Measured device-to-device copy bandwidth (bytes read + written per second)."""
    x = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device)
    y = torch.empty_like(x)
    y.copy_(x)
    ts = [time_call(lambda: y.copy_(x), device) for _ in range(10)]
    del x, y
    return 2 * nbytes / statistics.median(ts)


DECODE_WARMUP = 5  # untimed steps before each decode point's timed ones (from the same context)


def bench_decode(model, contexts: Sequence[int], *, batch_sizes: Sequence[int] = (1, 2),
                 modes: Sequence[str] = ("orthros", "full"), steps: int = 50, warmup: int = DECODE_WARMUP,
                 cuda_graphs: Optional[bool] = None, on_row: Optional[Callable] = None,
                 compile: bool = False, fuse: bool = True, gemv: bool = False) -> List[Dict]:
    """Per-step decode latency at context ``L`` (cache declared filled by :meth:`Engine.set_lengths`:
    latency does not depend on the cached values), and the HBM floor of that step:
    ``(weight bytes + B * L * KV bytes per token) / measured copy bandwidth``. With ``compile``,
    a row whose step ran a piece eagerly after a failed compile names those pieces
    (``eager_fallbacks``): it did not time the compiled engine."""
    device = next(model.parameters()).device
    cuda = device.type == "cuda"
    bw = copy_bandwidth(device) if cuda else None
    wbytes = weight_bytes_per_step(model)
    rows = []
    bar = Progress(len(modes) * len(batch_sizes) * len(contexts), "decode", unit="point")
    for mode in modes:
        # a point's steps (warm-up, then timed) each run from L: the last writes slot L + max(...) - 1
        eng = Engine(model, max_batch_size=max(batch_sizes), max_seq_len=max(contexts) + max(steps, warmup),
                     attention_mode=mode, cuda_graphs=cuda_graphs, compile=compile, fuse=fuse, gemv=gemv)
        kvtok = eng.cache.bytes_per_token()
        for B in batch_sizes:
            for L in contexts:
                eng.set_lengths([L] * B)
                toks = torch.ones(B, dtype=torch.long, device=device)
                for _ in range(warmup):
                    eng.step(toks)
                eng.set_lengths([L] * B)
                dt = time_call(lambda: [eng.step(toks) for _ in range(steps)], device)
                ms = 1000 * dt / steps
                row = {"mode": mode, "B": B, "L": L, "ms_per_step": ms, "tokens_per_s": B / (dt / steps)}
                eager = compile_fallbacks() if compile else []
                if eager:
                    row["eager_fallbacks"] = eager
                if bw:
                    floor_ms = 1000 * (wbytes + B * L * kvtok) / bw
                    row.update(hbm_floor_ms=floor_ms, frac_of_floor=floor_ms / ms)
                _emit(rows, row, on_row, bar, f"{mode} B={B} L={L}: {ms:.2f} ms")
        del eng
        _free(device)
    bar.close()
    for r in rows:  # Orthros' token pair vs the Transformer's single token, same engine
        base = next((x for x in rows if x["mode"] == "full" and x["B"] == r["B"] and x["L"] == r["L"]), None)
        if r["mode"] == "orthros" and base:
            r["vs_full"] = r["ms_per_step"] / base["ms_per_step"]
    if bw:
        for r in rows:
            r["copy_bw_tb_s"] = bw / 1e12
    return rows


# ---------------------------------------------------------------------- e2e
def bench_e2e(model, pairs: Sequence[tuple], *, batch: int = 2, modes: Sequence[str] = ("orthros", "full"),
              chunk: Optional[int] = 16384, cuda_graphs: Optional[bool] = None,
              on_row: Optional[Callable] = None, compile: bool = False) -> List[Dict]:
    """Paper Table 4: batch ``batch``, (input, output) lengths; greedy, no EOS. TTFT = prefill
    + first token on the host; decode-only throughput = ``B * (out - 1) / (E2E - TTFT)``."""
    device = next(model.parameters()).device
    V = model.config.vocab_size
    gen = torch.Generator(device="cpu").manual_seed(0)
    rows = []
    bar = Progress(len(modes) * len(pairs), "e2e", unit="point")
    for mode in modes:
        eng = Engine(model, max_batch_size=batch, max_seq_len=max(i + o - 1 for i, o in pairs), attention_mode=mode,
                     prefill_chunk=None if mode == "full" else chunk, cuda_graphs=cuda_graphs,
                     compile=compile)
        # warm-up, graph capture: at most 16 + 4 tokens, within the first pair (a model may have fewer positions)
        warm_in, warm_out = min(16, pairs[0][0]), min(4, pairs[0][1])
        eng.generate(torch.randint(0, V, (batch, warm_in), generator=gen).tolist(), warm_out)
        for n_in, n_out in pairs:
            prompts = torch.randint(0, V, (batch, n_in), generator=gen).tolist()
            eng.reset()  # warm-up at this prompt length: Triton / torch.compile specialise on shapes,
            eng.generate(prompts, min(n_out, 2))  # and a first call must not count as TTFT
            eng.reset()
            _sync(device)
            t0 = time.perf_counter()
            it = eng.stream(prompts, n_out, SamplingParams())
            next(it)
            ttft = time.perf_counter() - t0
            n = 1 + sum(1 for _ in it)
            e2e = time.perf_counter() - t0
            row = {"mode": mode, "batch": batch, "in": n_in, "out": n_out, "ttft_s": ttft, "e2e_s": e2e,
                   "output_tok_s": batch * n / e2e,
                   "decode_tok_s": batch * (n - 1) / (e2e - ttft) if n > 1 else None}  # no decode step
            _emit(rows, row, on_row, bar, f"{mode} {n_in}/{n_out}: {e2e:.2f} s")
        del eng
        _free(device)
    bar.close()
    return rows


def fit_check(model, n_in: int, n_out: int, *, chunk: int = 16384, steps: int = 32, compile: bool = False,
              cuda_graphs: Optional[bool] = None) -> Dict:
    """Does an ``n_in`` prefill plus ``n_out`` decode fit (batch 1)? The static cache is sized
    for the request up front (``n_in + n_out - 1`` slots: the last token is never fed back), so
    memory after ``steps`` decode steps is the run's peak
    (``cuda_graphs``: the Engine's; the graphs' memory pool counts in that peak)."""
    device = next(model.parameters()).device
    if device.type == "cuda":
        _free(device)
        torch.cuda.reset_peak_memory_stats(device)
    eng = Engine(model, max_batch_size=1, max_seq_len=n_in + n_out - 1, prefill_chunk=chunk, compile=compile,
                 cuda_graphs=cuda_graphs)
    ids = torch.randint(0, model.config.vocab_size, (1, n_in), device=device)
    t = time.perf_counter()
    toks = eng.generate(ids, min(steps, n_out))
    dt = time.perf_counter() - t
    row = {"in": n_in, "out_capacity": n_out, "decoded": len(toks[0]), "seconds": dt,
           "kv_cache_gib": eng.cache.nbytes / 2**30,
           "weights_gib": sum(p.numel() * p.element_size() for p in model.parameters()) / 2**30}
    if device.type == "cuda":
        row["peak_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
        row["device_gib"] = torch.cuda.get_device_properties(device).total_memory / 2**30
        row["activation_gib"] = row["peak_gib"] - row["kv_cache_gib"] - row["weights_gib"]
    del eng
    _free(device)
    return row


# -------------------------------------------------------------------- plots
def _save_loglog(fig, ax, xlabel, ylabel, title, path):
    """Log-log axes (base 2 for lengths), grid, legend (none where no point was measured, e.g.
    every one out of memory), then write the PNG."""
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)


def plot_prefill(rows, path, title="Prefill latency"):
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for s in PREFILL_SYSTEMS:
        pts = sorted((r["T"], r["ms"]) for r in rows if r["system"] == s and r.get("ms") is not None)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=SYSTEM_LABELS[s],
                    linestyle="--" if "floor" in s else "-")
    _save_loglog(fig, ax, "prompt length (tokens)", "prefill latency (ms)", title, path)


def plot_decode(rows, path, title="Decode step latency"):
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for mode in sorted({r["mode"] for r in rows}):
        for B in sorted({r["B"] for r in rows}):
            pts = sorted((r["L"], r["ms_per_step"]) for r in rows if r["mode"] == mode and r["B"] == B)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o",
                        label=f"{'Orthros (token pair)' if mode == 'orthros' else 'Transformer'} B={B}")
    floor = sorted({(r["L"], r["B"], r["hbm_floor_ms"]) for r in rows if "hbm_floor_ms" in r})
    for B in sorted({f[1] for f in floor}):
        pts = [(f[0], f[2]) for f in floor if f[1] == B]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], linestyle=":", color="gray",
                label=f"HBM floor B={B}" if B == min(f[1] for f in floor) else None)
    _save_loglog(fig, ax, "context length (tokens)", "ms per decode step", title, path)


def plot_e2e(rows, path, title="End-to-end generation"):
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
    pairs = sorted({(r["in"], r["out"]) for r in rows})  # one tick each, every mode's point of it there
    for ax, key, lab in ((axes[0], "ttft_s", "time to first token (s)"), (axes[1], "e2e_s", "end-to-end latency (s)")):
        for mode in sorted({r["mode"] for r in rows}):
            pts = sorted((pairs.index((r["in"], r["out"])), r[key]) for r in rows if r["mode"] == mode)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o",
                    label="Orthros" if mode == "orthros" else "Transformer (same engine)")
        ax.set_xticks(range(len(pairs)), [f"{i}/{o}" for i, o in pairs])
        ax.set_yscale("log")
        ax.set_xlabel("input / output tokens")
        ax.set_ylabel(lab)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    save_figure(fig, path)


__all__ = ["bench_prefill", "bench_decode", "bench_e2e", "fit_check", "prefill_summary", "copy_bandwidth",
           "trace_kernels", "measure", "metadata", "save", "print_table", "plot_prefill", "plot_decode", "plot_e2e",
           "PREFILL_SYSTEMS"]

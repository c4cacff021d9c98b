"""Issue #18: where decode, batched decode and the window stream stand against their floors.

One sweep, one process, every baseline in the same run (``benchmarks/roofline.py`` is the
command; ``docs/benchmarks.md``, section "Issue #18", has the method and the exact call):

* **decode** (B = 1, contexts 1K..128K): step latency of the Orthros token pair and of the
  same engine's Transformer (:func:`orthros.benchmarks.inference.bench_decode`, compiled
  engine, CUDA graphs) and of gpt-fast's own ``model.py`` (a peer of the same shape, compiled
  with ``mode="reduce-overhead", fullgraph=True`` as its ``generate.py`` does); each as a
  fraction of the HBM floor ``(weight bytes + B * L * KV bytes per token) / copy bandwidth``,
  and of the read floor, the same bytes over the read-only ceiling measured in the same run
  (:func:`orthros.benchmarks.read_stream.read_bandwidth`: a stream that only reads runs past a
  copy, which also writes). Where the pair misses 1.2x over gpt-fast, the summary says what
  step it would need, as a fraction of each floor.
  gpt-fast's step moves with where its CUDA graph's activations land; ``--gpt-fast-setups N``
  times it in N setups a cell (:meth:`GptFastPeer.new_setup`) and keeps the fastest.
* **batched** (B = 8, 32, 64 at 4K and 32K): tokens/s of the same three systems; a cell whose
  KV cache cannot fit in free device memory is recorded as skipped, not attempted.
* **window** (w = 128, 8K..1M): the Triton window stream and FlexAttention's sliding window,
  forward and fwd+bwd, timed by ``benchmarks/attention.py``'s own code (handed in by the
  script), next to the floor of the blocks the kernels visit: ``max(bytes / copy bandwidth,
  FLOPs / bf16 GEMM throughput)`` per kernel, both measured at the start of the run.

Rows are saved (atomically) after every measured cell, so a run killed at a time limit keeps
what it measured; ``--deadline-s`` skips the cells left once it has passed. One figure,
``roofline.png``, shows every target as a ratio with its target line; ``--plot-only`` redraws
it from a ``results.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import importlib.util
import json
import math
import os
import sys
import time
from typing import Callable, Dict, List, Optional

import torch

from ..engine.cache import StaticKVCache
from ..ops.gemv.naive import MAX_M
from ..utils import Progress, check_output_path, pyplot, save_figure
from .cli import int_list, make_out_dir
from .inference import _free, bench_decode, copy_bandwidth, decode_compile_options, \
    decode_qkv_kernel, measure, metadata, parse_bwd_config, parse_compile_options, parse_decode_config, print_table, \
    save, time_call, trace_kernels
from .models import orthros_model, weight_bytes_per_step

SECTIONS = ("decode", "batched", "window")
SYSTEMS = ("orthros", "full", "gpt-fast")  # the engine's two modes, and the peer
# --gemv: the same engine with Engine(gemv=True) too, in the decode and batched sections (cells of <= 8 GEMV rows)
GEMV_SYSTEMS = ("orthros+gemv", "full+gemv")
LABELS = {"orthros": "Orthros pair (engine)", "full": "Transformer (same engine)", "gpt-fast": "gpt-fast",
          "orthros+gemv": "Orthros pair (engine, fused GEMVs)", "full+gemv": "Transformer (engine, fused GEMVs)"}
# The targets, each a ratio (see summarize()).
TARGETS = {
    "decode_frac_of_floor": 0.80,  # >= at every context, Orthros and the engine's Transformer
    "decode_vs_gpt_fast": 1.20,  # Orthros >= 1.2x faster than gpt-fast at the smallest context (1K)
    "batched_vs_full": 1.10,  # Orthros step time / Transformer step time <= 1.10
    "batched_vs_gpt_fast": 1.00,  # Orthros tokens/s / gpt-fast tokens/s > 1
    "window_fwd_vs_flex": 1.50,  # Flex time / ours >= 1.5
    "window_fb_vs_flex": 1.40,
}
FULL = dict(contexts=[1024, 4096, 32768, 131072], batch_sizes=[8, 32, 64], batched_contexts=[4096, 32768],
            window_lengths=[8192, 32768, 131072, 524288, 1048576], steps=50, warmup=5)
QUICK = dict(contexts=[64, 256], batch_sizes=[2, 3], batched_contexts=[64], window_lengths=[8192, 32768], steps=3,
             warmup=1)
GPT_FAST_NAMES = ("Transformer", "ModelArgs", "KVCache")
FIT_MARGIN = 0.90  # a cell runs when its caches take at most this share of the free device memory


# ------------------------------------------------------------------ floors
def kv_bytes_per_token(config, dtype) -> int:
    """K+V bytes one token occupies over all layers, as the engine's cache stores it."""
    cache = StaticKVCache(config.num_hidden_layers, 1, 1, config.num_key_value_heads, config.head_dim,
                          dtype=dtype, device="meta")
    return cache.bytes_per_token()


def decode_floor_ms(weight_bytes: int, kv_per_token: int, B: int, L: int, bandwidth: float) -> float:
    """HBM floor of one decode step: every weight once plus the K/V of ``B`` rows of ``L``
    tokens, at ``bandwidth`` (bytes/s: the copy's, read + written, as :func:`copy_bandwidth`
    measures, for the targets' floor; the read-only ceiling for the read floor)."""
    return 1000.0 * (weight_bytes + B * L * kv_per_token) / bandwidth


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def query_block_tiles(T: int, window: int, block_m: int, block_n: int) -> int:
    """Key blocks visited by all query blocks of one head of the window stream (forward and
    dQ kernels of ``orthros/ops/triton/attention.py``: keys ``[lo, q_last]`` with ``lo =
    q_first - window + 1`` rounded down to ``block_n``); self-attention, ``T`` queries and keys."""
    n = 0
    for start in range(0, T, block_m):
        last = min(start + block_m, T) - 1
        lo = max(start - window + 1, 0) // block_n * block_n
        n += _cdiv(last + 1 - lo, block_n)
    return n


def key_block_tiles(T: int, window: int, block_m: int, block_n: int) -> int:
    """Query blocks visited by all key blocks of one query head (the dK/dV kernel: queries
    ``[start_n rounded down to block_m, start_n + block_n - 1 + window)``)."""
    n = 0
    for start in range(0, T, block_n):
        qlo = start // block_m * block_m
        qhi = min(start + block_n - 1 + window, T)
        n += _cdiv(qhi - qlo, block_m)
    return n


def window_blocks(D: int) -> Dict[str, tuple]:
    """(BLOCK_M, BLOCK_N) of the window kernels for head dim ``D``, from the kernels' table."""
    from ..ops.triton.attention import _cfg
    from ..ops.triton.common import block_d

    return {kind: _cfg(kind, block_d(D))[:2] for kind in ("win_fwd", "bwd_dq", "bwd_dkdv")}


def window_floor(T: int, *, Hq: int, Hkv: int, D: int, window: int, elem_bytes: int, bandwidth: float,
                 flops_per_s: float, blocks: Optional[Dict[str, tuple]] = None) -> Dict:
    """Bytes, FLOPs and floor (ms) of the window stream's forward and fwd+bwd at ``T`` (batch 1).

    FLOPs are those of every tile the kernels visit (masked parts of boundary tiles
    included): forward ``QK^T, PV`` = 4·BM·BN·D per tile and query head; backward dQ kernel
    ``QK^T, dO V^T, dS K`` = 6, dK/dV kernel ``QK^T, P^T dO, V dO^T, dS^T Q`` = 8. Bytes are
    each tensor read or written once (re-reads of neighbouring tiles are taken as L2 hits):
    forward ``q, k, v`` in, ``o`` and the fp32 log-sum-exp out; backward ``o, dO`` into the
    delta kernel (fp32 delta out), then ``q, k, v, dO``, lse, delta in and ``dq, dk, dv`` out.
    Each kernel's floor is ``max(bytes / bandwidth, FLOPs / flops_per_s)``; fwd+bwd is the sum."""
    blocks = blocks or window_blocks(D)
    (fm, fn), (qm, qn), (km, kn) = blocks["win_fwd"], blocks["bwd_dq"], blocks["bwd_dkdv"]
    q_el, kv_el = T * Hq * D, T * Hkv * D
    fwd_flops = Hq * query_block_tiles(T, window, fm, fn) * 4 * fm * fn * D
    fwd_bytes = elem_bytes * (2 * q_el + 2 * kv_el) + 4 * T * Hq
    bwd_flops = (Hq * query_block_tiles(T, window, qm, qn) * 6 * qm * qn * D
                 + Hq * key_block_tiles(T, window, km, kn) * 8 * km * kn * D)
    bwd_bytes = elem_bytes * (2 * q_el + (2 * q_el + 2 * kv_el) + (q_el + 2 * kv_el)) + 4 * T * Hq * 3

    def floor(b, f):
        return 1000.0 * max(b / bandwidth, f / flops_per_s), ("memory" if b / bandwidth >= f / flops_per_s
                                                              else "compute")
    fwd_ms, fwd_bound = floor(fwd_bytes, fwd_flops)
    bwd_ms, bwd_bound = floor(bwd_bytes, bwd_flops)
    return {"fwd_bytes": fwd_bytes, "fwd_flops": fwd_flops, "fwd_floor_ms": fwd_ms, "fwd_bound": fwd_bound,
            "fb_bytes": fwd_bytes + bwd_bytes, "fb_flops": fwd_flops + bwd_flops, "fb_floor_ms": fwd_ms + bwd_ms,
            "fb_bound": fwd_bound if fwd_bound == bwd_bound else "mixed",
            "blocks": {k: list(v) for k, v in blocks.items()}}


def matmul_throughput(device, dtype, n: int) -> float:
    """Measured FLOP/s of one ``n x n x n`` matmul in ``dtype`` (median, first call dropped)."""
    g = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(n, n, generator=g).to(device=device, dtype=dtype)
    b = torch.randn(n, n, generator=g).to(device=device, dtype=dtype)
    ms = measure(lambda: a @ b, device, budget_s=1.0, max_reps=20)["ms"]
    del a, b
    return 2.0 * n ** 3 / (ms / 1000.0)


# ------------------------------------------------------------------ gpt-fast
def load_gpt_fast(directory: str):
    """gpt-fast's own ``model.py`` from ``directory`` (a checkout of pytorch-labs/gpt-fast, or
    just that file), imported as a module; ``ValueError`` naming ``--gpt-fast-dir`` otherwise."""
    if not os.path.isdir(directory):
        raise ValueError(f"--gpt-fast-dir {directory!r} is not a directory")
    path = os.path.join(directory, "model.py")
    if not os.path.isfile(path):
        raise ValueError(f"--gpt-fast-dir {directory!r} holds no model.py (gpt-fast's model file)")
    spec = importlib.util.spec_from_file_location("gpt_fast_model", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # torch.compile re-imports a traced function's module by name
    try:
        spec.loader.exec_module(mod)
    except Exception as e:  # noqa: BLE001
        del sys.modules[spec.name]
        raise ValueError(f"--gpt-fast-dir: importing {path} failed: {type(e).__name__}: {e}") from e
    missing = [n for n in GPT_FAST_NAMES if not hasattr(mod, n)]
    if missing:
        raise ValueError(f"--gpt-fast-dir: {path} defines no {', '.join(missing)} (not gpt-fast's model.py?)")
    mod.UPSTREAM = None
    upstream = os.path.join(directory, "UPSTREAM")
    if os.path.isfile(upstream):
        with open(upstream) as f:
            mod.UPSTREAM = f.read().strip()
    return mod


def gpt_fast_args(mod, config, block_size: int):
    """gpt-fast ``ModelArgs`` of the Orthros config's shape, and notes on what differs."""
    fields = {f.name for f in dataclasses.fields(mod.ModelArgs)}
    want = dict(block_size=block_size, vocab_size=config.vocab_size, n_layer=config.num_hidden_layers,
                n_head=config.num_attention_heads, dim=config.hidden_size, intermediate_size=config.intermediate_size,
                n_local_heads=config.num_key_value_heads, rope_base=config.rope_parameters.get("rope_theta", 10000.0),
                norm_eps=config.rms_norm_eps)
    missing = sorted(set(want) - fields)
    if missing:
        raise ValueError(f"gpt-fast ModelArgs lacks {missing}: cannot build the peer of the same shape")
    args = mod.ModelArgs(**want)
    if args.head_dim != config.head_dim:
        raise ValueError(f"gpt-fast derives head_dim = dim // n_head = {args.head_dim}, the model has "
                         f"{config.head_dim}: no peer of the same shape")
    notes = []
    if not any("qk" in f or "norm_qk" in f for f in fields):
        notes.append("gpt-fast's ModelArgs has no qk-norm: the peer skips the q/k RMSNorms the Orthros "
                     "model runs (slightly less work per step)")
    notes.append("gpt-fast decodes with the SDPA math backend inside its compiled graph (as its generate.py), "
                 "over the whole cache of max_seq_length = context + steps under a causal mask")
    notes.append("timed step = gpt-fast model forward (logits), no sampling, like the engine's step")
    return args, notes


@contextlib.contextmanager
def _default_dtype(dtype):
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def _decode_one_token(model, x, input_pos):  # gpt-fast's generate.py's, minus its sampling
    return model(x, input_pos)


class GptFastPeer:
    """gpt-fast's Transformer of a given shape, random weights, with its decode step compiled
    the way ``generate.py`` compiles ``decode_one_token``."""

    def __init__(self, mod, config, *, device, dtype, block_size: int, compile: bool):
        self.args, self.notes = gpt_fast_args(mod, config, block_size)
        self.device, self.compile = torch.device(device), compile
        if compile:  # every cell's new cache shape recompiles (module buffers keep static shapes): never
            # let dynamo fall back to eager silently
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        with torch.device(self.device), _default_dtype(dtype):
            self.model = mod.Transformer(self.args).eval()
        self.model.requires_grad_(False)

        self.step = self._compiled_step() if compile else _decode_one_token
        self._spacers = []  # new_setup's allocations, held until time_decode returns

    def new_setup(self) -> None:
        """A new setup of the compiled step: Dynamo's caches dropped and the step compiled again.
        Inductor's cache hands back the same kernels and tuned configs, but the CUDA graph is
        recorded anew. Its activation pool is placed after a new spacer allocation, held until
        :meth:`time_decode` returns, so it does not land in the last pool's memory. gpt-fast's
        step time depends on where that pool lands, mostly through its down projection
        (docs/results/s38-2026-12-05/: 6.25-7.11 ms on one H100). Eager: nothing to do."""
        if not self.compile:
            return
        torch._dynamo.reset()  # the engine's compiled pieces, if any, compile again on next use
        n = len(self._spacers) + 1
        self._spacers.append(torch.empty((11 + 97 * n % 509) << 20, dtype=torch.uint8, device=self.device))
        self.step = self._compiled_step()

    @staticmethod
    def _compiled_step():
        """The step compiled as gpt-fast's ``generate.py`` compiles ``decode_one_token``."""
        return torch.compile(_decode_one_token, mode="reduce-overhead", fullgraph=True)

    def _context(self):
        stack = contextlib.ExitStack()
        stack.enter_context(torch.no_grad())
        from torch.nn.attention import SDPBackend, sdpa_kernel

        stack.enter_context(sdpa_kernel(SDPBackend.MATH))  # generate.py: "better for Inductor to codegen"
        if self.compile:  # the inductor settings generate.py sets at import
            import torch._inductor.config as ic

            stack.enter_context(ic.patch({"coordinate_descent_tuning": True, "triton.unique_kernel_names": True,
                                          "fx_graph_cache": True}))
        return stack

    def cache_bytes(self, B: int, L: int, kv_per_token: int) -> int:
        """Device bytes the caches of one cell take: K/V for ``B`` rows plus the bool causal mask."""
        S = _cdiv(L, 8) * 8
        return B * S * kv_per_token + S * S

    def time_decode(self, B: int, L: int, *, steps: int, warmup: int, trace: int = 0, setups: int = 1) -> Dict:
        """The compiled step's time at ``B`` rows of context ``L``; with ``trace`` (CUDA) also the
        kernels of ``trace`` more steps (:func:`~orthros.benchmarks.inference.trace_kernels`)
        under ``"kernels"``. With ``setups`` > 1 the step is timed in that many setups
        (:meth:`new_setup` before each but the first): ``ms_per_step`` is the fastest setup's (the
        strongest peer), ``setups_ms`` every setup's in order, the trace the first setup's."""
        if setups < 1:
            raise ValueError(f"setups {setups}: give a positive integer")
        try:
            runs = [self._time_once(B, L, steps=steps, warmup=warmup, trace=trace)]
            for _ in range(setups - 1):
                self.new_setup()
                runs.append(self._time_once(B, L, steps=steps, warmup=warmup, trace=0))
        finally:
            self._spacers.clear()
            _free(self.device)
        out = dict(min(runs, key=lambda r: r["ms_per_step"]))
        out["first_call_s"] = runs[0]["first_call_s"]
        if trace:
            out["kernels"] = runs[0]["kernels"]
        if setups > 1:
            out["setups_ms"] = [r["ms_per_step"] for r in runs]
        return out

    def _time_once(self, B: int, L: int, *, steps: int, warmup: int, trace: int) -> Dict:
        m = self.model
        m.max_seq_length = m.max_batch_size = -1  # setup_caches rebuilds for this cell
        with torch.device(self.device):
            m.setup_caches(max_batch_size=B, max_seq_length=L + warmup + steps + 1)
        x = torch.ones(B, 1, dtype=torch.int, device=self.device)
        pos = torch.tensor([L], dtype=torch.int, device=self.device)

        def one():
            self.step(m, x, pos)
            pos.add_(1)
        try:
            with self._context():
                first = time_call(one, self.device)  # compiles (or recompiles for new cache shapes)
                for _ in range(warmup):
                    one()
                pos.fill_(L)
                dt = time_call(lambda: [one() for _ in range(steps)], self.device)
                pos.fill_(L)
                kernels = trace_kernels(one, self.device, trace) if trace else []
        finally:
            self.free_caches()
        out = {"ms_per_step": 1000 * dt / steps, "tokens_per_s": B * steps / dt, "first_call_s": first}
        if trace:
            out["kernels"] = kernels
        return out

    def free_caches(self):
        for layer in getattr(self.model, "layers", []):
            if getattr(getattr(layer, "attention", None), "kv_cache", None) is not None:
                layer.attention.kv_cache = None
        if getattr(self.model, "causal_mask", None) is not None:
            self.model.causal_mask = None
        self.model.max_seq_length = self.model.max_batch_size = -1
        _free(self.device)


# ------------------------------------------------------------------ the sweep
class Sweep:
    """Rows, metadata, saving after every row, the deadline, the progress bar."""

    def __init__(self, args, meta: Dict, total: int):
        self.args, self.meta, self.rows = args, meta, []
        self.path = os.path.join(args.out, "results.json")
        self.t0 = getattr(args, "t_start", None) or time.time()  # the deadline counts from the process' main()
        self.bar = Progress(total, "roofline", unit="point")

    def left_s(self) -> float:
        if self.args.deadline_s is None:
            return math.inf
        return self.args.deadline_s - (time.time() - self.t0)

    def add(self, row: Dict, label: str = "", advance: int = 1):
        """Keep and save ``row``; ``advance``: the cells it completes (a window length's rows: the last)."""
        row["elapsed_s"] = round(time.time() - self.t0, 1)
        self.rows.append(row)
        self.write()
        self.bar.update(advance, last=label[:60])
        self.bar.write(f"  {label}")  # above the bar, on its own line

    def skip(self, row: Dict, why: str):
        self.add({**row, "skipped": why}, f"{_key(row)}: skipped ({why})")

    def write(self):
        self.meta["elapsed_s"] = round(time.time() - self.t0, 1)
        save(self.path, self.meta, self.rows)


def _key(row):
    return " ".join(f"{k}={row[k]}" for k in ("section", "system", "pass", "B", "L", "T") if k in row)


def _fits(device, need_bytes: int):
    """(fits, reason) for caches of ``need_bytes`` against the free device memory (CPU: yes)."""
    if device.type != "cuda":
        return True, ""
    _free(device)
    free = torch.cuda.mem_get_info(device)[0]
    if need_bytes <= FIT_MARGIN * free:
        return True, ""
    return False, f"does not fit: caches need {need_bytes / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free"


def _cell_systems(a, B: int, L: int, peer: bool) -> List[str]:
    """The systems that get a row (measured or skipped) at decode cell (B, L): those of --systems
    (default all; the +gemv ones with --gemv), gpt-fast where a peer is loaded (at B = 1 only at
    --gpt-fast-contexts)."""
    out = []
    for system in SYSTEMS + (GEMV_SYSTEMS if a.gemv else ()):
        if a.systems is not None and system not in a.systems:
            continue  # --systems (recorded in the metadata)
        if system == "gpt-fast" and (not peer or (B == 1 and L not in a.gpt_fast_contexts)):
            continue  # no --gpt-fast-dir: noted once in the metadata; --gpt-fast-contexts: recorded there
        out.append(system)
    return out


def _decode_cells(sweep: Sweep, section: str, pairs, ctx) -> None:
    """One row per (B, L, system): measured, or skipped with the reason."""
    a = sweep.args
    model, dev, bw, wbytes, kvtok, peer = ctx["model"], ctx["device"], ctx["bw"], ctx["wbytes"], ctx["kvtok"], \
        ctx["peer"]
    for B, L in pairs:
        floor = decode_floor_ms(wbytes, kvtok, B, L, bw)
        read_floor = decode_floor_ms(wbytes, kvtok, B, L, ctx["read_bw"])
        for system in _cell_systems(a, B, L, peer is not None):
            base = {"section": section, "system": system, "B": B, "L": L, "floor_ms": floor,
                    "read_floor_ms": read_floor, "weight_bytes": wbytes, "kv_bytes": B * L * kvtok}
            rows = B * (2 if system.startswith("orthros") else 1)  # a step's GEMV rows: the pair has two a sequence
            if system in GEMV_SYSTEMS and rows > MAX_M:
                sweep.skip(base, f"{rows} GEMV rows: the fused GEMV takes <= {MAX_M} (it would run the "
                                 f"unfused ops, as without --gemv)")
                continue
            if sweep.left_s() - ctx["reserve_s"] <= 0:
                sweep.skip(base, "deadline" + (f" (the last {ctx['reserve_s']:g} s kept for the window section)"
                                               if ctx["reserve_s"] else ""))
                continue
            need = (B * (L + a.steps + a.warmup + 2) * kvtok if system != "gpt-fast"
                    else peer.cache_bytes(B, L + a.steps + a.warmup + 1, kvtok))
            ok, why = _fits(dev, need)
            if not ok and system == "gpt-fast" and a.compile:
                # compiled graphs of earlier cells may still hold their caches: drop them once (the
                # engine's compiled pieces then compile again on next use)
                torch._dynamo.reset()
                ok, why = _fits(dev, need)
                why = why and why + " (after torch._dynamo.reset())"
            if not ok:
                sweep.skip(base, why)
                continue
            t = time.time()
            try:
                if system == "gpt-fast":
                    res = peer.time_decode(B, L, steps=a.steps, warmup=a.warmup,
                                           setups=a.gpt_fast_setups if section == "decode" else 1)
                else:
                    mode, _, variant = system.partition("+")
                    r = bench_decode(model, [L], batch_sizes=[B], modes=[mode], steps=a.steps, warmup=a.warmup,
                                     compile=ctx["compile"], fuse=not a.no_fuse, gemv=variant == "gemv")[0]
                    res = {k: r[k] for k in ("ms_per_step", "tokens_per_s", "eager_fallbacks") if k in r}
            except torch.cuda.OutOfMemoryError as e:
                _free(dev)
                sweep.skip(base, f"out of memory: {str(e)[:120]}")
                continue
            row = {**base, **res, "frac_of_floor": floor / res["ms_per_step"],
                   "frac_of_read_floor": read_floor / res["ms_per_step"], "cell_s": round(time.time() - t, 1)}
            eager = (f"; WARNING: not the compiled engine, pieces ran eagerly after a failed torch.compile: "
                     f"{', '.join(row['eager_fallbacks'])}" if row.get("eager_fallbacks") else "")
            setups = (f"; the fastest of {len(row['setups_ms'])} setups: "
                      + " ".join(f"{x:.3f}" for x in row["setups_ms"]) if "setups_ms" in row else "")
            sweep.add(row, f"{section} {system} B={B} L={L}: {row['ms_per_step']:.3f} ms/step, "
                           f"{100 * row['frac_of_floor']:.0f}% of the {floor:.3f} ms floor (cell {row['cell_s']} s)"
                           f"{setups}{eager}")
            _free(dev)


def _window_cells(sweep: Sweep, ctx, bench_window: Callable) -> None:
    bw, flops = ctx["bw"], ctx["flops"]
    for T0 in sweep.args.window_lengths:
        base = {"section": "window", "T": T0}
        if sweep.left_s() <= 0:
            sweep.skip(base, "deadline")
            continue
        t = time.time()
        measured, shape, errors = bench_window(T0)
        rows = []
        fl = window_floor(shape["T"], Hq=shape["Hq"], Hkv=shape["Hkv"], D=shape["D"], window=shape["window"],
                          elem_bytes=shape["elem_bytes"], bandwidth=bw, flops_per_s=flops)
        for pas, ours, flex, key in (("fwd", "ours_fwd", "flex_fwd", "fwd"), ("fwd+bwd", "ours_fb", "flex_fb", "fb"),
                                     ("fwd+bwd graph", "ours_fb_graph", "flex_fb_graph", "fb"),
                                     ("fwd+bwd pinned", "ours_fb_pinned", "flex_fb_pinned", "fb")):
            o, f = measured.get(ours), measured.get(flex)
            if o is None and f is None:
                continue
            row = {**base, "pass": pas, "T_run": shape["T"], "shape": shape, "orthros_ms": o, "flex_ms": f,
                   "floor_ms": fl[f"{key}_floor_ms"], "bytes": fl[f"{key}_bytes"], "flops": fl[f"{key}_flops"],
                   "bound": fl[f"{key}_bound"], "blocks": fl["blocks"], "cell_s": round(time.time() - t, 1)}
            if o:
                row["frac_of_floor"] = row["floor_ms"] / o
            if f:
                row["flex_frac_of_floor"] = row["floor_ms"] / f
            if o and f:
                row["speedup_vs_flex"] = f / o
            if errors:
                row["errors"] = errors
            rows.append((row, f"window {pas} T={T0}: ours {o if o is None else round(o, 4)} ms, Flex "
                              f"{f if f is None else round(f, 4)} ms, floor {row['floor_ms']:.4f} ms ({row['bound']})"))
        for i, (row, label) in enumerate(rows):  # one cell of the progress: the length
            sweep.add(row, label, advance=int(i == len(rows) - 1))
        if not rows:
            sweep.skip({**base, "errors": errors}, "nothing measured")


# ------------------------------------------------------------------ summary and plot
def _by(rows, **kw):
    return [r for r in rows if all(r.get(k) == v for k, v in kw.items()) and "skipped" not in r]


def _steps(rows, section: str) -> Dict:
    """The measured step rows of ``section`` by ``(system, B, L)``."""
    return {(r["system"], r["B"], r["L"]): r for r in _by(rows, section=section) if "ms_per_step" in r}


def summarize(rows: List[Dict]) -> List[Dict]:
    """One line per target and point: the measured ratio, the target, met or not. A point that
    uses a row timed with pieces run eagerly after a failed compile (``eager_fallbacks``) is
    never met, and says why."""
    out = []

    def line(target, point, value, goal, better, *used):
        met = None if goal is None else bool(value >= goal if better == "higher" else value <= goal)
        if any(r.get("eager_fallbacks") for r in used):
            met, point = (None if goal is None else False), point + " (eager fallback: not the compiled engine)"
        out.append({"target": target, "point": point, "value": value, "goal": goal, "met": met})

    ms = {(r["section"], r["system"], r["B"], r["L"]): r for r in rows if "ms_per_step" in r}
    dec = sorted({(r["B"], r["L"]) for r in _by(rows, section="decode") if "ms_per_step" in r})
    for B, L in dec:
        for s in ("orthros", "full") + GEMV_SYSTEMS:
            r = ms.get(("decode", s, B, L))
            if r:
                line("decode_frac_of_floor", f"{s} B={B} L={L}", r["frac_of_floor"], TARGETS["decode_frac_of_floor"],
                     "higher", r)
        g = ms.get(("decode", "gpt-fast", B, L))
        for s in ("orthros", "orthros+gemv"):
            r = ms.get(("decode", s, B, L))
            if g and r:
                goal = TARGETS["decode_vs_gpt_fast"] if L == min(x[1] for x in dec) else None  # the target is at 1K
                line("decode_vs_gpt_fast", f"{'' if s == 'orthros' else s + ' '}B={B} L={L}",
                     g["ms_per_step"] / r["ms_per_step"], goal, "higher", g, r)
        for s in GEMV_SYSTEMS:  # the fused GEMVs against the same engine without them (no target)
            plain, r = ms.get(("decode", s.partition("+")[0], B, L)), ms.get(("decode", s, B, L))
            if plain and r:
                line("gemv_speedup", f"{s} B={B} L={L}", plain["ms_per_step"] / r["ms_per_step"], None, "higher",
                     plain, r)
    for B, L in sorted({(r["B"], r["L"]) for r in _by(rows, section="batched") if "ms_per_step" in r}):
        o = ms.get(("batched", "orthros", B, L))
        f = ms.get(("batched", "full", B, L))
        g = ms.get(("batched", "gpt-fast", B, L))
        if o and f:
            line("batched_vs_full", f"B={B} L={L}", o["ms_per_step"] / f["ms_per_step"], TARGETS["batched_vs_full"],
                 "lower", o, f)
        og, fg = ms.get(("batched", "orthros+gemv", B, L)), ms.get(("batched", "full+gemv", B, L))
        if og and fg:
            line("batched_vs_full", f"+gemv B={B} L={L}", og["ms_per_step"] / fg["ms_per_step"],
                 TARGETS["batched_vs_full"], "lower", og, fg)
        for s, plain in (("orthros+gemv", o), ("full+gemv", f)):
            r = ms.get(("batched", s, B, L))
            if plain and r:
                line("gemv_speedup", f"{s} B={B} L={L}", plain["ms_per_step"] / r["ms_per_step"], None, "higher",
                     plain, r)
        if o and g:
            line("batched_vs_gpt_fast", f"B={B} L={L}", o["tokens_per_s"] / g["tokens_per_s"],
                 TARGETS["batched_vs_gpt_fast"], "higher", o, g)
    for r in _by(rows, section="window"):
        if "speedup_vs_flex" in r:
            t = "window_fwd_vs_flex" if r["pass"] == "fwd" else "window_fb_vs_flex"
            how = {"fwd+bwd graph": " (CUDA graphs, both)",
                   "fwd+bwd pinned": " (eager, both with the caller and the autograd worker on one CPU)"}
            line(t, f"T={r['T']}{how.get(r['pass'], '')}", r["speedup_vs_flex"], TARGETS[t], "higher", r)
    return out


def gpt_fast_needs(rows: List[Dict]) -> List[Dict]:
    """For each decode point where an Orthros system misses 1.2x over gpt-fast (the target at the
    shortest context, :data:`TARGETS`): the step it would need, as milliseconds and as fractions of
    the point's copy floor and read floor (rows without a read floor, from runs before it was
    measured, give ``None`` for it)."""
    ms = _steps(rows, "decode")
    if not ms:
        return []
    first = min(L for _, _, L in ms)
    goal = TARGETS["decode_vs_gpt_fast"]
    out = []
    for (system, B, L), r in sorted(ms.items()):
        g = ms.get(("gpt-fast", B, L))
        if L != first or not system.startswith("orthros") or g is None or g["ms_per_step"] / r["ms_per_step"] >= goal:
            continue
        need = g["ms_per_step"] / goal
        rf = r.get("read_floor_ms")
        out.append({"point": f"{system} B={B} L={L}", "ms_per_step": r["ms_per_step"], "needs_ms": need,
                    "cut": 1 - need / r["ms_per_step"], "needs_frac_of_floor": r["floor_ms"] / need,
                    "needs_frac_of_read_floor": None if rf is None else rf / need,
                    "frac_of_read_floor": None if rf is None else rf / r["ms_per_step"]})
    return out


def join_runs(runs: List[Dict]):
    """Rows of several results.json and the first run's metadata, with what differs between the
    runs: every run's commit, date and device (" / " between them) and the range of the ceilings
    they measured (``copy_bw_tb_s``, ``read_bw_tb_s`` and ``matmul_tflop_s`` become
    ``[lowest, highest]``).

    A point (section, B, L, T and pass: every system compared there) is taken whole from the
    last run that measured any system at it, so that each ratio drawn or summarized is one of
    rows timed in the same run; a point no run measured keeps the last run's skipped rows."""
    points = {}
    for run in runs:
        here = {}
        for r in run["rows"]:
            here.setdefault((r.get("section"), r.get("pass"), r.get("B"), r.get("L"), r.get("T")), []).append(r)
        for key, rs in here.items():
            measured = any("skipped" not in r for r in rs)
            if key not in points or measured or not points[key][1]:
                points[key] = (rs, measured)
    metas = [run.get("meta", {}) for run in runs]
    meta = dict(metas[0])
    for key in ("commit", "date", "device"):
        seen = list(dict.fromkeys(str(m[key]) for m in metas if m.get(key)))
        if len(seen) > 1:
            meta[key] = " / ".join(seen)
    for key in ("copy_bw_tb_s", "read_bw_tb_s", "matmul_tflop_s"):
        seen = [m[key] for m in metas if isinstance(m.get(key), (int, float))]
        if len(set(seen)) > 1:
            meta[key] = [min(seen), max(seen)]
    return [r for rs, _ in points.values() for r in rs], meta


def _ceiling(value, fmt: str) -> str:
    """A measured ceiling for a title: one value, or the range ``[lo, hi]`` of joined runs."""
    if isinstance(value, (list, tuple)):
        return f"{value[0]:{fmt}}-{value[1]:{fmt}}"
    return f"{float('nan') if value is None else value:{fmt}}"


def print_summary(rows: List[Dict]):
    dec = [r for r in rows if r.get("section") in ("decode", "batched")]
    if dec:
        print_table(dec, ["section", "system", "B", "L", "ms_per_step", "tokens_per_s", "floor_ms", "frac_of_floor",
                          "read_floor_ms", "frac_of_read_floor", "skipped"],
                    "decode steps (floor = (weights + B*L*KV bytes) / copy bandwidth; read floor: the same bytes "
                    "/ the read-only ceiling)")
    win = [r for r in rows if r.get("section") == "window"]
    if win:
        print_table(win, ["T", "pass", "orthros_ms", "flex_ms", "speedup_vs_flex", "floor_ms", "bound", "frac_of_floor",
                          "flex_frac_of_floor", "skipped"], "window stream w=128 (floor: visited blocks)")
    summ = summarize(rows)
    if summ:
        print_table([{**s, "goal": "" if s["goal"] is None else s["goal"],
                      "met": {True: "met", False: "NOT met", None: "info"}[s["met"]]} for s in summ],
                    ["target", "point", "value", "goal", "met"], "targets")
    needs = gpt_fast_needs(rows)
    if needs:
        print_table(needs, ["point", "ms_per_step", "needs_ms", "cut", "needs_frac_of_floor", "frac_of_read_floor",
                            "needs_frac_of_read_floor"],
                    f"what {TARGETS['decode_vs_gpt_fast']:g}x over gpt-fast needs (the step, and the fractions of the "
                    f"floors it would run at)")
    return summ


def plot(rows: List[Dict], meta: Dict, path: str) -> None:
    """Six panels, one per target, each a ratio with the target drawn as a dashed line."""
    plt = pyplot()
    fig, axes = plt.subplots(2, 3, figsize=(15, 8.5))
    colors = {"orthros": "C0", "full": "C1", "gpt-fast": "C2", "orthros+gemv": "C3", "full+gemv": "C4"}

    def finish(ax, title, ylabel, goal, xlabel, log2=True):
        measured = bool(ax.lines)
        if goal is not None and measured:
            ax.axhline(goal, color="red", linestyle="--", linewidth=1, label=f"target {goal:g}")
        if log2:
            ax.set_xscale("log", base=2)
        ax.set_title(title, fontsize=10)
        ax.set_ylabel(ylabel)
        ax.set_xlabel(xlabel)
        ax.grid(True, which="both", alpha=0.3)
        if measured:
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "not measured", ha="center", va="center", transform=ax.transAxes, color="gray")

    def curve(ax, pts, **kw):
        pts = sorted(p for p in pts if p[1] is not None)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", **kw)

    ms = _steps(rows, "decode")
    for s in SYSTEMS + GEMV_SYSTEMS:
        curve(axes[0, 0], [(L, r["frac_of_floor"]) for (x, _, L), r in ms.items() if x == s],
              label=LABELS[s], color=colors[s])
    finish(axes[0, 0], "decode B=1: HBM floor / measured step", "fraction of floor", TARGETS["decode_frac_of_floor"],
           "context (tokens)")
    for s in ("orthros", "full") + GEMV_SYSTEMS:
        curve(axes[0, 1], [(L, ms[("gpt-fast", B, L)]["ms_per_step"] / r["ms_per_step"])
                           for (x, B, L), r in ms.items() if x == s and ("gpt-fast", B, L) in ms],
              label=f"{LABELS[s]} vs gpt-fast", color=colors[s])
    finish(axes[0, 1], "decode B=1: speed-up over gpt-fast (target at 1K)", "gpt-fast time / time",
           TARGETS["decode_vs_gpt_fast"], "context (tokens)")
    bms = _steps(rows, "batched")
    Ls = sorted({k[2] for k in bms})
    for i, L in enumerate(Ls):
        curve(axes[0, 2], [(B, r["ms_per_step"] / bms[("full", B, L)]["ms_per_step"])
                           for (s, B, L2), r in bms.items() if s == "orthros" and L2 == L and ("full", B, L) in bms],
              label=f"L={L}", color=f"C{i}")
        curve(axes[1, 0], [(B, r["tokens_per_s"] / bms[("gpt-fast", B, L)]["tokens_per_s"])
                           for (s, B, L2), r in bms.items()
                           if s == "orthros" and L2 == L and ("gpt-fast", B, L) in bms],
              label=f"L={L}", color=f"C{i}")
    finish(axes[0, 2], "batched: Orthros pair / Transformer token (step time)", "ratio (lower is better)",
           TARGETS["batched_vs_full"], "batch size")
    finish(axes[1, 0], "batched: Orthros tokens/s / gpt-fast tokens/s", "ratio", TARGETS["batched_vs_gpt_fast"],
           "batch size")
    win = _by(rows, section="window")
    for pas, goal_key, c in (("fwd", "window_fwd_vs_flex", "C0"), ("fwd+bwd", "window_fb_vs_flex", "C3"),
                             ("fwd+bwd graph", "window_fb_vs_flex", "C4"), ("fwd+bwd pinned", "window_fb_vs_flex", "C5")):
        curve(axes[1, 1], [(r["T"], r.get("speedup_vs_flex")) for r in win if r["pass"] == pas],
              label=f"{pas} (target {TARGETS[goal_key]:g})", color=c)
    for goal_key, c in (("window_fwd_vs_flex", "C0"), ("window_fb_vs_flex", "C3")):
        if axes[1, 1].lines:
            axes[1, 1].axhline(TARGETS[goal_key], color=c, linestyle="--", linewidth=1)
    finish(axes[1, 1], "window stream w=128: speed-up over Flex", "Flex time / ours", None, "T (tokens)")
    for pas, c in (("fwd", "C0"), ("fwd+bwd", "C3"), ("fwd+bwd graph", "C4"), ("fwd+bwd pinned", "C5")):
        curve(axes[1, 2], [(r["T"], r.get("frac_of_floor")) for r in win if r["pass"] == pas], label=f"ours {pas}",
              color=c)
        curve(axes[1, 2], [(r["T"], r.get("flex_frac_of_floor")) for r in win if r["pass"] == pas],
              label=f"Flex {pas}", color=c, linestyle=":")
    finish(axes[1, 2], "window stream: own floor / measured", "fraction of floor", 1.0, "T (tokens)")
    fig.suptitle(f"Issue #18 roofline: {meta.get('device', '?')}, {meta.get('date', '')}, commit "
                 f"{meta.get('commit', '?')}, copy {_ceiling(meta.get('copy_bw_tb_s'), '.2f')} TB/s, "
                 + (f"read {_ceiling(meta['read_bw_tb_s'], '.2f')} TB/s, " if meta.get("read_bw_tb_s") else "")
                 + f"GEMM {_ceiling(meta.get('matmul_tflop_s'), '.0f')} TFLOP/s", fontsize=11)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)


# ------------------------------------------------------------------ command line
def _positive_float(s):
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {s!r}")
    if not v > 0 or v != v:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {s!r}")
    return v


def _positive_int(s):
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {s!r}")
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {s!r}")
    return v


def build_parser():
    p = argparse.ArgumentParser(prog="benchmarks/roofline.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated, run in this order: {SECTIONS}")
    p.add_argument("--device", default="cuda", help="cuda (the measurement) or cpu (needs --quick: a smoke run)")
    p.add_argument("--quick", action="store_true", help="tiny model and sizes (CPU smoke runs)")
    p.add_argument("--eager", action="store_true", help="no torch.compile anywhere (default on CPU)")
    p.add_argument("--no-fuse", action="store_true",
                   help="engine without fused projections (Engine(fuse=False)), to compare with the default")
    p.add_argument("--gemv", action="store_true",
                   help="decode and batched sections: also the engine with Engine(gemv=True) (fused GEMVs, the "
                        "engine's default on CUDA; the orthros / full rows run without them), both modes, same run "
                        "(cells of <= 8 GEMV rows: the pair at B <= 4, the Transformer at B <= 8)")
    p.add_argument("--gemv-configs", default=None, metavar="RESULTS_JSON",
                   help="with --gemv: run the fused GEMVs with the CONFIGS rows a `benchmarks/gemv.py --fused "
                        "--sweep` run stored in this file (meta.tuned_rows), ahead of the built-in table")
    p.add_argument("--systems", default=None,
                   help="decode and batched sections: only these systems, comma-separated, from "
                        f"{', '.join(SYSTEMS + GEMV_SYSTEMS)} (default: all; the +gemv ones need --gemv, gpt-fast "
                        "--gpt-fast-dir), e.g. an A/B of one engine setting in several processes")
    p.add_argument("--decode-config", default=None, metavar="JSON",
                   help="engine decode attention: DECODE_CONFIG overrides for the whole run, e.g. '{\"min_split\": 64}'")
    p.add_argument("--decode-compile-options", default=None, metavar="JSON",
                   help="compiled engine: Inductor options of its decode pieces instead of the engine's "
                        "DECODE_COMPILE_OPTIONS, e.g. '{\"realize_reads_threshold\": 5, \"combo_kernels\": true}' "
                        "('{}': Inductor's defaults)")
    p.add_argument("--qkv-kernel", default=None, choices=("on", "off"),
                   help="engine decode: the q/k prologue and the K/V write inside the attention kernel "
                        "(Engine(qkv_kernel=...)) on or off for the whole run (default: the engine's default)")
    p.add_argument("--window-bwd-config", default=None, metavar="JSON",
                   help="window section: backward launch configs instead of the defaults, e.g. "
                        "'{\"bwd_dkdv\": [64, 32, 8, 2], \"fused\": false}' (keys bwd_dkdv, bwd_dq, fused, dq_variant, "
                        "dkdv_variant)")
    p.add_argument("--gpt-fast-dir", default=None, help="directory holding gpt-fast's model.py (else no gpt-fast rows)")
    p.add_argument("--gpt-fast-contexts", default=None,
                   help="B=1 contexts at which gpt-fast also runs (each new context recompiles it with its "
                        "coordinate-descent tuning, ~110 s on an H200): comma-separated, or 'all' (default: the "
                        "smallest context, where the target is); batched cells always run it")
    p.add_argument("--gpt-fast-setups", type=_positive_int, default=1, metavar="N",
                   help="decode section: time gpt-fast's step in N setups a cell (a new CUDA graph and activation "
                        "pool each, the same kernels and tuned configs; its step moves with where the pool lands); "
                        "the row is the fastest setup's, every setup's time recorded (default 1)")
    p.add_argument("--contexts", type=int_list, default=None, help="decode contexts at B=1 (default 1K,4K,32K,128K)")
    p.add_argument("--batch-sizes", type=int_list, default=None, help="batched decode sizes (default 8,32,64)")
    p.add_argument("--batched-contexts", type=int_list, default=None, help="batched decode contexts (default 4K,32K)")
    p.add_argument("--window-lengths", type=int_list, default=None, help="window stream T (default 8K..1M)")
    p.add_argument("--steps", type=_positive_int, default=None, help="timed decode steps per cell (default 50)")
    p.add_argument("--warmup", type=_positive_int, default=None, help="decode warm-up steps per cell (default 5)")
    p.add_argument("--deadline-s", type=_positive_float, default=None,
                   help="seconds from start after which the remaining cells are skipped (recorded as such)")
    p.add_argument("--window-reserve-s", type=_positive_float, default=None,
                   help="with --deadline-s: decode cells stop this many seconds before it when the window "
                        "section comes later, so it still runs")
    p.add_argument("--out", default="roofline_results", help="directory for results.json and roofline.png")
    p.add_argument("--plot-only", default=None, nargs="+", metavar="RESULTS_JSON",
                   help="print the tables and redraw <out>/roofline.png from these files (rows of several runs, "
                        "e.g. a second call for the sections a deadline skipped, are joined: each point, every "
                        "system compared there, from the last run that measured it); nothing is measured")
    return p


def parse_args(argv=None, *, window_available: bool = True):
    """Parse and check every argument; a bad one exits (code 2) naming it, before any work."""
    p = build_parser()
    a = p.parse_args(argv)
    try:  # a file there, or above it: refused now, not by os.makedirs once the run has started
        check_output_path("--out", a.out, directory=True)
    except ValueError as e:
        p.error(str(e))
    if a.plot_only is not None:
        a.data = []
        for path in a.plot_only:
            try:
                with open(path) as f:
                    data = json.load(f)
                if not isinstance(data.get("rows"), list):
                    raise ValueError("no 'rows' list")
                if not all(isinstance(r, dict) for r in data["rows"]):
                    raise ValueError("its rows must be JSON objects")
                if not isinstance(data.get("meta", {}), dict):
                    raise ValueError("its 'meta' is not a JSON object")
            except (OSError, ValueError, AttributeError) as e:
                p.error(f"--plot-only {path!r}: not a readable results.json ({e})")
            a.data.append(data)
        if not any(r.get("section") in SECTIONS for d in a.data for r in d["rows"]):
            p.error(f"--plot-only: no roofline row (a 'section' of {' / '.join(SECTIONS)}) in "
                    f"{' '.join(map(repr, a.plot_only))}: another benchmark's results, or a run that measured nothing")
        return a
    sections = [s for s in a.sections.split(",") if s]
    bad = [s for s in sections if s not in SECTIONS]
    if bad or not sections or len(set(sections)) != len(sections):
        p.error(f"--sections {a.sections!r}: choose distinct names from {', '.join(SECTIONS)}"
                + (f" (unknown: {', '.join(bad)})" if bad else ""))
    if "window" in sections and not window_available:
        p.error("--sections window: the window stream is timed by benchmarks/attention.py; run benchmarks/roofline.py")
    a.sections = sections
    try:
        a.device = torch.device(a.device)
    except RuntimeError:
        p.error(f"--device {a.device!r}: expected cuda, cuda:N or cpu")
    if a.device.type not in ("cuda", "cpu"):
        p.error(f"--device {a.device}: expected cuda, cuda:N or cpu")
    if a.device.type == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device here (use --device cpu --quick for a smoke run)")
    if a.device.type == "cpu" and not a.quick:
        p.error("--device cpu needs --quick (the Qwen3-8B shape is a GPU measurement)")
    if a.window_reserve_s is not None and a.deadline_s is None:
        p.error("--window-reserve-s needs --deadline-s")
    for k, v in (QUICK if a.quick else FULL).items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    from .models import PRESETS

    preset = "tiny" if a.quick else "qwen3-8b"
    limit = PRESETS[preset]["max_position_embeddings"]
    for opt, section, contexts in (("--contexts", "decode", a.contexts),
                                   ("--batched-contexts", "batched", a.batched_contexts)):
        need = max(contexts) + max(a.steps, a.warmup)  # a cell's steps each run from L (bench_decode's cache)
        if section in sections and need > limit:  # the engine refused it once the bandwidths were measured
            p.error(f"{opt} needs positions 0..{need - 1} (a context of {max(contexts)}, then "
                    f"{max(a.steps, a.warmup)} steps), beyond max_position_embeddings={limit} of the {preset} model")
    if a.gpt_fast_contexts is None:
        a.gpt_fast_contexts = [min(a.contexts)]
    elif a.gpt_fast_contexts == "all":
        a.gpt_fast_contexts = list(a.contexts)
    else:
        try:
            a.gpt_fast_contexts = int_list(a.gpt_fast_contexts)
        except argparse.ArgumentTypeError as e:
            p.error(f"--gpt-fast-contexts: {e}; or 'all'")
        if not set(a.gpt_fast_contexts) <= set(a.contexts):
            p.error(f"--gpt-fast-contexts {a.gpt_fast_contexts}: each must be one of --contexts {a.contexts}")
    if a.gemv and a.no_fuse:
        p.error("--gemv with --no-fuse: the fused GEMVs run over the fused QKV and gate/up weights "
                "(drop one of them; roofline_gpu.sh: GEMV=0 with EXTRA=--no-fuse)")
    if a.systems is not None:
        names = [x for x in a.systems.split(",") if x]
        known = SYSTEMS + GEMV_SYSTEMS
        bad = [x for x in names if x not in known]
        if bad or not names:
            p.error(f"--systems {a.systems!r}: choose from {', '.join(known)}"
                    + (f" (unknown: {', '.join(bad)})" if bad else ""))
        if any(x in GEMV_SYSTEMS for x in names) and not a.gemv:
            p.error(f"--systems {a.systems!r}: the +gemv systems need --gemv")
        if "gpt-fast" in names and a.gpt_fast_dir is None:
            p.error(f"--systems {a.systems!r}: gpt-fast needs --gpt-fast-dir")
        a.systems = tuple(names)
    a.gemv_rows = None
    if a.gemv_configs is not None:
        if not a.gemv:
            p.error("--gemv-configs needs --gemv (it sets the fused GEMVs' launch configs)")
        from ..ops.gemv.kernel import rows_from_json

        try:
            with open(a.gemv_configs) as f:
                a.gemv_rows = rows_from_json(json.load(f).get("meta", {}).get("tuned_rows"))
        except (OSError, ValueError, AttributeError) as e:
            p.error(f"--gemv-configs {a.gemv_configs!r}: no tuned rows of a `benchmarks/gemv.py --fused --sweep` "
                    f"results.json ({e})")
    for flag, text, parse, dest in (("--window-bwd-config", a.window_bwd_config, parse_bwd_config, "bwd_overrides"),
                                    ("--decode-config", a.decode_config, parse_decode_config, "decode_overrides")):
        try:
            setattr(a, dest, {} if text is None else parse(text))
        except ValueError as e:
            p.error(f"{flag} {text!r}: {e}")
    a.compile_options = None  # None: the engine's own DECODE_COMPILE_OPTIONS
    if a.decode_compile_options is not None:
        try:
            a.compile_options = parse_compile_options(a.decode_compile_options)
        except ValueError as e:
            p.error(f"--decode-compile-options {a.decode_compile_options!r}: {e}")
    a.gpt_fast = None
    if a.gpt_fast_dir is not None:
        try:
            a.gpt_fast = load_gpt_fast(a.gpt_fast_dir)
        except ValueError as e:
            p.error(str(e))
    a.compile = a.device.type == "cuda" and not a.eager
    return a


def run(a, window_factory: Optional[Callable] = None) -> int:
    dev = a.device
    cuda = dev.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    preset = "tiny" if a.quick else "qwen3-8b"
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
    os.makedirs(a.out, exist_ok=True)
    from ..ops.gemv.kernel import pdl_settings  # Triton: imported by a run, not by --help or --plot-only
    from .read_stream import read_bandwidth

    shape_model = orthros_model(preset, device="meta", dtype=dtype)  # the shape, no memory
    bw = copy_bandwidth(dev, 2**30 if cuda else 2**24)
    read = read_bandwidth(dev, 2**31 if cuda else 2**24)
    gemm_n = 8192 if cuda else 256
    flops = matmul_throughput(dev, dtype, gemm_n)
    pairs_dec = [(1, L) for L in a.contexts] if "decode" in a.sections else []
    pairs_bat = [(B, L) for L in a.batched_contexts for B in a.batch_sizes] if "batched" in a.sections else []
    total = (sum(len(_cell_systems(a, B, L, a.gpt_fast is not None)) for B, L in pairs_dec + pairs_bat)
             + (len(a.window_lengths) if "window" in a.sections else 0))
    gpt_upstream = getattr(a.gpt_fast, "UPSTREAM", None) if a.gpt_fast else None
    meta = metadata(shape_model, dev, dtype, {
        "issue": 18, "utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
        "argv": sys.argv[1:], "sections": a.sections, "quick": a.quick, "compile": a.compile, "fuse": not a.no_fuse, "gemv": a.gemv,
        "systems": list(a.systems) if a.systems else "all",
        "pdl": pdl_settings(dev),
        "copy_bw_tb_s": bw / 1e12, "read_bw_tb_s": read["bytes_per_s"] / 1e12, "read_bw_how": read["how"],
        "read_bw_candidates": {how: b / 1e12 for how, b in read["candidates"]},
        "matmul_tflop_s": flops / 1e12, "matmul_n": gemm_n,
        "weight_bytes_per_step": weight_bytes_per_step(shape_model),
        "kv_bytes_per_token": kv_bytes_per_token(shape_model.config, dtype),
        "steps": a.steps, "warmup": a.warmup, "targets": TARGETS,
        "gpt_fast": ({"dir": a.gpt_fast_dir, "upstream": gpt_upstream, "b1_contexts": a.gpt_fast_contexts,
                      "setups": a.gpt_fast_setups}
                     if a.gpt_fast
                     else "not run: no --gpt-fast-dir given")})
    if not a.gpt_fast and (pairs_dec or pairs_bat):
        print("note: no --gpt-fast-dir given: the gpt-fast rows are skipped", flush=True)
    print(f"# issue 18 roofline on {meta['device']} (torch {meta['torch']}, triton {meta['triton']}), commit "
          f"{meta['commit']}: copy {bw / 1e12:.3f} TB/s, read {read['bytes_per_s'] / 1e12:.3f} TB/s ({read['how']}), "
          f"{gemm_n}^3 GEMM {flops / 1e12:.1f} TFLOP/s", flush=True)
    sweep = Sweep(a, meta, total)
    sweep.write()
    ctx = {"device": dev, "bw": bw, "read_bw": read["bytes_per_s"], "flops": flops, "compile": a.compile, "peer": None,
           "model": None}
    from .inference import CompileFallbacks

    from ..ops.gemv.kernel import configs_installed, rows_to_json
    from ..ops.triton.decode import decode_config

    if a.gemv_rows:
        meta["gemv_configs"] = {"file": a.gemv_configs, "rows": rows_to_json(a.gemv_rows)}
    gemv_table = configs_installed(a.gemv_rows) if a.gemv_rows else contextlib.nullcontext()
    if a.decode_overrides:
        meta["decode_config"] = a.decode_overrides
    if a.bwd_overrides:
        meta["window_bwd_config"] = a.bwd_overrides
    from ..engine.engine import DECODE_COMPILE_OPTIONS

    compile_options = DECODE_COMPILE_OPTIONS if a.compile_options is None else a.compile_options
    if a.compile:
        meta["decode_compile_options"] = dict(compile_options)
    from ..ops.triton.attention import bwd_config

    qkv = None if a.qkv_kernel is None else a.qkv_kernel == "on"
    with CompileFallbacks() as fallbacks, gemv_table, decode_config(**a.decode_overrides), \
            bwd_config(**a.bwd_overrides), decode_compile_options(compile_options), decode_qkv_kernel(qkv) as qkv_on:
        meta["compile_failures"] = fallbacks
        meta["qkv_kernel"] = bool(qkv_on) and cuda  # what the CUDA engines' default is (the CPU's: off)
        for i, section in enumerate(a.sections):
            print(f"\n## section {section} (at {time.time() - sweep.t0:.0f} s)", flush=True)
            ctx["reserve_s"] = (a.window_reserve_s or 0.0) if "window" in a.sections[i + 1:] else 0.0
            if section in ("decode", "batched"):
                if ctx["model"] is None:
                    ctx["model"] = orthros_model(preset, device=dev, dtype=dtype)
                    ctx["wbytes"] = weight_bytes_per_step(ctx["model"])
                    ctx["kvtok"] = kv_bytes_per_token(ctx["model"].config, dtype)
                    if a.gpt_fast:
                        longest = max([L for _, L in pairs_dec + pairs_bat]) + a.steps + a.warmup + 8
                        ctx["peer"] = GptFastPeer(a.gpt_fast, ctx["model"].config, device=dev, dtype=dtype,
                                                  block_size=longest, compile=a.compile)
                        meta["gpt_fast"]["notes"] = ctx["peer"].notes
                        emb = ctx["peer"].model.tok_embeddings.weight
                        meta["gpt_fast"]["weight_bytes_per_step"] = sum(
                            p.numel() * p.element_size() for p in ctx["peer"].model.parameters() if p is not emb)
                        for n in ctx["peer"].notes:
                            print(f"note (gpt-fast): {n}", flush=True)
                _decode_cells(sweep, section, pairs_dec if section == "decode" else pairs_bat, ctx)
            else:
                ctx["model"] = ctx["peer"] = None  # the 8B models out of the way of 1M-token tensors
                if a.compile and (pairs_dec or pairs_bat):
                    torch._dynamo.reset()  # and the compiled graphs (CUDA-graph pools) that may hold them
                _free(dev)
                if sweep.left_s() <= 0:
                    for T in a.window_lengths:
                        sweep.skip({"section": "window", "T": T}, "deadline")
                    continue
                _window_cells(sweep, ctx, window_factory(dev))
    sweep.bar.close()
    meta["summary"] = print_summary(sweep.rows)
    sweep.write()
    png = os.path.join(a.out, "roofline.png")
    try:
        plot(sweep.rows, meta, png)
        print(f"\nwrote {sweep.path} and {png}")
    except ImportError as e:  # matplotlib missing on the device: redraw later with --plot-only
        print(f"\nwrote {sweep.path}; no plot ({e}): rerun with --plot-only {sweep.path}")
    return 0


def main(argv=None, window_factory: Optional[Callable] = None) -> int:
    """``window_factory(device) -> bench(T) -> (measured, shape, errors)`` times the window
    stream (``benchmarks/roofline.py`` passes benchmarks/attention.py's timing)."""
    t_start = time.time()
    a = parse_args(argv, window_available=window_factory is not None)
    a.t_start = t_start
    try:  # every argument checked: the directory now, before anything is measured
        make_out_dir(a.out)
    except ValueError as e:
        build_parser().error(str(e))
    if a.plot_only is not None:
        rows, meta = join_runs(a.data)
        print_summary(rows)
        png = os.path.join(a.out, "roofline.png")
        plot(rows, meta, png)
        print(f"\nwrote {png}")
        return 0
    return run(a, window_factory)


__all__ = ["SECTIONS", "TARGETS", "kv_bytes_per_token", "decode_floor_ms", "query_block_tiles", "key_block_tiles",
           "window_floor", "matmul_throughput", "load_gpt_fast", "gpt_fast_args", "GptFastPeer", "summarize",
           "gpt_fast_needs", "join_runs", "plot", "build_parser", "parse_args", "run", "main"]

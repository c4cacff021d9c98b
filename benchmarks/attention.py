"""Benchmark of the Orthros attention kernels on one GPU (bf16, B=1, Hq=32, Hkv=8, D=128, w=128).

Baselines are measured in the same run and every figure is reported as a ratio:

* training fwd+bwd of the whole op (both streams, PT: output stream at every position)
  against SDPA cuDNN and flash causal attention alone;
* the window stream alone (fwd, fwd+bwd) against FlexAttention sliding window;
* prefill (window stream + the last token's full query) up to 1M tokens, against SDPA cuDNN
  causal forward where it runs;
* one decode step (window + full query) against SDPA single-query decode, eager and CUDA
  graph, with the KV bandwidth it reaches.

Timings: CUDA events through ``triton.testing.do_bench`` (median). Run on a GPU:

* ``python benchmarks/attention.py --targets [--decode-tune] [--window-tune] --json out.json``:
  exactly the rows behind the issue's targets, with same-run baselines, as markdown tables
  (< 4 min on an H200; ``--decode-tune`` adds ~2-3 min, ``--window-tune`` ~5-8 min: estimates
  written before the tunes grew, run them in separate calls);
* ``--decode-tune``: decode step under CUDA graphs for B in {1, 8} x L in {1K, 2K, 4K} and
  B in {1, 2, 8} x L in {8K, 32K, 128K} over split counts (incl. the heuristic's at each
  ``min_split``), both merges (two launches / inline, one launch) at each split count, and
  (BLOCK_N, num_warps, num_stages), next to SDPA decode;
* ``--window-tune``: window-only fwd+bwd at 8K/32K/128K for several backward configs (block
  sizes, one or two launches, the GQA-packed and the edge-masked dQ, the edge dK/dV), host
  enqueue time, a CUDA-graph replay (GPU time alone), Flex at 8K, and a host profile; then
  every window-forward candidate (``attention.FWD_VARIANT`` x block config, and the packed
  forward + packed dQ) at
  8K/32K/128K/1M, fwd and fwd+bwd, with Flex/ours, ours/floor and the output checked against
  the default's (~3-4 min more);
* ``--dry-run``: every selected code path once on the CPU (Triton interpreter, tiny sizes,
  fp32), to catch errors before a GPU run;
* the older modes: ``[--quick] [--sweep] [--short]``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
import traceback

if "--dry-run" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, ".")
from orthros.benchmarks.inference import capture_graph, replay_seconds  # noqa: E402
from orthros.ops import orthros_attention  # noqa: E402
from orthros.ops.decode import orthros_decode_attention  # noqa: E402

DEV = "cuda"
DT = torch.bfloat16
HQ, HKV, D, W = 32, 8, 128, 128
RES = {}
DRY = False
JSON_PATH = None
META = {}
T_START = time.time()


def sz(n):
    """A size of the real run; tiny in a dry run."""
    return max(16, n // 256) if DRY else n


def bench(fn, rep=100):
    if DRY:
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    from triton.testing import do_bench

    return do_bench(fn, warmup=25, rep=rep, return_mode="median")


def bench_steady(fn, rounds=5, warm_s=0.5, rep=100):
    """The median of ``rounds`` :func:`bench` medians after ``warm_s`` seconds of calls: an eager
    call whose host path is as long as its GPU work (the window stream at 8K) is timed at the
    host's steady state, not at the speed of its first tens of milliseconds (the H200 machines'
    hosts drift by tens of percent within seconds). What the window section times every eager
    cell of both systems with."""
    if DRY:
        return bench(fn)
    _warm_up(fn, warm_s)
    return statistics.median(bench(fn, rep=rep) for _ in range(rounds))


def _warm_up(fn, seconds):
    """Calls of ``fn`` for ``seconds``, then a sync: the host at its steady speed."""
    t = time.perf_counter()
    while time.perf_counter() - t < seconds:
        fn()
    torch.cuda.synchronize()


def bench_steady_pinned(fn, rounds=5, warm_s=0.5, rep=100):
    """``(unpinned, pinned)``: :func:`bench_steady` of ``fn`` as is and under :func:`same_cpu`,
    their rounds alternating (a host's speed drifts within seconds; alternating keeps the drift
    out of the comparison). In a dry run the pinned figure is None."""
    if DRY:
        return bench(fn), None
    _warm_up(fn, warm_s)
    free, pinned = [], []
    for _ in range(rounds):
        free.append(bench(fn, rep=rep))
        with same_cpu() as where:
            if where is None:
                continue
            fn()
            pinned.append(bench(fn, rep=rep))
    return statistics.median(free), (statistics.median(pinned) if pinned else None)


def log(msg):
    print(msg, flush=True)


def guard(name, fn, default=None):
    """Run one measurement; a failure is logged and recorded, the sweep goes on."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001
        log(f"  FAILED {name}: {type(e).__name__}: {str(e)[:200]}")
        if DRY:
            traceback.print_exc()
        RES.setdefault("errors", []).append(f"{name}: {type(e).__name__}: {str(e)[:200]}")
        return default


def save():
    """The results so far to ``--json``, atomically (a temporary name, then a rename): a run
    killed at its time limit leaves the last complete file."""
    if JSON_PATH:
        from orthros.utils import write_json

        try:
            write_json(JSON_PATH, {**META, "elapsed_s": round(time.time() - T_START, 1), "results": RES}, indent=1,
                       default=str)
        except Exception as e:  # noqa: BLE001
            log(f"  (json write failed: {e})")


def sync():
    if not DRY:
        torch.cuda.synchronize()


def empty_cache():
    if not DRY:
        torch.cuda.empty_cache()


def sdpa(be):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if DRY:  # no cuDNN/flash on the CPU: the default backend exercises the same code path
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    b = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[be]

    def f(q, k, v):
        with sdpa_kernel(b):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    return f


def graph_time(fn, reps=None):
    """Median time of one CUDA-graph replay of ``fn`` (captured once). ``reps``: number of
    replays timed (default: do_bench's time-based count)."""
    if DRY:
        fn()
        return bench(fn)
    gr = capture_graph(fn, torch.device("cuda", torch.cuda.current_device()))
    try:
        return bench(gr.replay) if reps is None else 1e3 * replay_seconds(gr, reps)
    finally:
        del gr


def host_time(fn, n=None):
    """Host enqueue time per call (ms): n calls back to back, no synchronisation inside (the
    GPU queue does not fill at these counts), after a sync."""
    n = n or (2 if DRY else 20)
    fn()
    sync()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    dt = (time.perf_counter() - t) / n * 1e3
    sync()
    return dt


def make_flex():
    if DRY:
        return None, None
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        return torch.compile(flex_attention, dynamic=False), create_block_mask
    except Exception as e:  # noqa: BLE001
        log(f"  no flex: {e}")
        return None, None


def rnd(*shape, grad=False):
    return torch.randn(*shape, device=DEV, dtype=DT).requires_grad_(grad)


# ---------------------------------------------------------------------------- training
def training(Ts, flash=True):
    log("\n## training fwd+bwd (PT: window stream + full stream at every position)")
    log(f"{'T':>7} {'cuDNN':>9} {'flash':>9} {'orthros':>9} {'x cuDNN':>8} {'win only':>9}")
    nan = float("nan")
    for T0 in Ts:
        T = sz(T0)
        row = {}
        q, k, v = rnd(1, HQ, T, D, grad=True), rnd(1, HKV, T, D, grad=True), rnd(1, HKV, T, D, grad=True)
        g = rnd(1, HQ, T, D)
        for be in (("cudnn", "flash") if flash else ("cudnn",)):
            f = sdpa(be)
            ms = guard(f"train T={T0} {be}", lambda: bench(lambda: torch.autograd.grad(f(q, k, v), (q, k, v), g)))
            if ms is not None:
                row[be] = ms
        del q, k, v, g
        qb, qo = rnd(1, T, HQ, D, grad=True), rnd(1, T, HQ, D, grad=True)
        kb, vb = rnd(1, T, HKV, D, grad=True), rnd(1, T, HKV, D, grad=True)
        gb = rnd(1, T, HQ, D)

        def whole():
            o, oo = orthros_attention(qb, kb, vb, qo, window_size=W, backend="triton")
            return torch.autograd.grad((o, oo), (qb, kb, vb, qo), (gb, gb))

        def win():
            o, _ = orthros_attention(qb, kb, vb, qo[:, :0], window_size=W, backend="triton")
            return torch.autograd.grad(o, (qb, kb, vb), gb)
        for name, fn in (("orthros", whole), ("window", win)):
            ms = guard(f"train T={T0} {name}", lambda: bench(fn))
            if ms is not None:
                row[name] = ms
        r = row.get("orthros", nan) / row.get("cudnn", nan)
        log(f"{T0:>7} {row.get('cudnn', nan):9.3f} {row.get('flash', nan):9.3f} "
            f"{row.get('orthros', nan):9.3f} {r:8.3f} {row.get('window', nan):9.3f}")
        RES[f"train_T{T0}"] = row
        del qb, qo, kb, vb, gb
        empty_cache()
        save()


# ---------------------------------------------------------------------------- window stream
def _this_cpu():
    """The CPU this thread runs on (Linux: /proc/thread-self/stat), or None."""
    try:
        with open("/proc/thread-self/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[37])  # field 39, "processor"
    except (OSError, ValueError, IndexError):
        return None


@contextlib.contextmanager
def same_cpu(apart=False):
    """Within the block this thread and the autograd engine's worker thread for ``DEV`` run on
    one CPU (the one this thread is on; ``apart``: the worker on another, fixed one); both get
    their CPU set back afterwards. A small eager fwd+bwd hands its backward to that worker and
    waits for it: on the H200 machines' hosts the hand-off between CPUs the scheduler picks cost
    0.1-0.5 ms a call (window_host.py ``--engine``, docs/performance.md change 17), most of what
    kept the 8K window call host-bound. Yields the (caller's, worker's) CPUs, or None where
    threads cannot be pinned (dry run, no ``sched_setaffinity``, one CPU with ``apart``)."""
    keep = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
    if DRY or not hasattr(os, "sched_setaffinity") or (apart and len(keep) < 2):
        yield None
        return
    cpus = sorted(keep)
    main = _this_cpu()
    main = main if main in keep else cpus[-1]  # the CPU this thread runs on now: the scheduler's pick
    worker = cpus[(cpus.index(main) + len(cpus) // 2) % len(cpus)] if apart else main

    class Pin(torch.autograd.Function):  # its backward runs on the engine's worker thread
        cpus = keep

        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            os.sched_setaffinity(0, Pin.cpus)
            return g

    def pin(mine, worker):  # this thread's CPU set and the worker's
        Pin.cpus = worker
        x = torch.zeros(1, device=DEV, requires_grad=True)
        torch.autograd.grad(Pin.apply(x), (x,), torch.ones(1, device=DEV))
        os.sched_setaffinity(0, mine)

    pin({main}, {worker})
    try:
        yield main, worker
    finally:
        pin(keep, keep)


def window_stream(Ts, flex_Ts, graph=False):
    log("\n## window stream alone (w=128): fwd and fwd+bwd vs FlexAttention SWA")
    log(f"{'T':>8} {'flex fwd':>9} {'ours fwd':>9} {'ratio':>6} {'flex f+b':>9} {'ours f+b':>9} {'ratio':>6}"
        f" {'ours f+b graph':>14} {'flex f+b graph':>14}  ours TB/s fwd")
    flex, create_block_mask = make_flex()
    nan = float("nan")
    for T0 in Ts:
        T = sz(T0)
        row = {}
        grad = T0 <= 262144
        q, k, v = rnd(1, T, HQ, D, grad=grad), rnd(1, T, HKV, D, grad=grad), rnd(1, T, HKV, D, grad=grad)
        qo = q[:, :0].detach()
        g = rnd(1, T, HQ, D) if grad else None

        def fwd():
            with torch.no_grad():
                return orthros_attention(q, k, v, qo, window_size=W, backend="triton")

        def fb():
            return torch.autograd.grad(orthros_attention(q, k, v, qo, window_size=W, backend="triton")[0], (q, k, v), g)
        row["ours_fwd"] = guard(f"window T={T0} ours fwd", lambda: bench_steady(fwd))
        if grad:
            if graph:  # eager as is and with the caller and the engine's worker on one CPU, alternating
                row["ours_fb"], row["ours_fb_pinned"] = guard(f"window T={T0} ours fwd+bwd",
                                                              lambda: bench_steady_pinned(fb)) or (None, None)
                row["ours_fb_graph"] = guard(f"window T={T0} ours fwd+bwd graph", lambda: graph_time(fb))
            else:
                row["ours_fb"] = guard(f"window T={T0} ours fwd+bwd", lambda: bench_steady(fb))
        if flex is not None and T0 in flex_Ts:
            row.update(guard(f"window T={T0} flex", lambda: flex_window(flex, create_block_mask, q, k, v, g,
                                                                         graph=graph, pinned=graph)) or {})
        row = {key: val for key, val in row.items() if val is not None}
        byts = T * (2 * HQ + 2 * HKV) * D * 2
        log(f"{T0:>8} {row.get('flex_fwd', nan):9.3f} {row.get('ours_fwd', nan):9.3f} "
            f"{row.get('ours_fwd', nan) / row.get('flex_fwd', nan):6.2f} {row.get('flex_fb', nan):9.3f} "
            f"{row.get('ours_fb', nan):9.3f} {row.get('ours_fb', nan) / row.get('flex_fb', nan):6.2f} "
            f"{row.get('ours_fb_graph', nan):14.3f} {row.get('flex_fb_graph', nan):14.3f}  "
            f"{byts / row.get('ours_fwd', nan) / 1e9:5.2f}")
        if "ours_fb_pinned" in row or "flex_fb_pinned" in row:
            log(f"{'':>8} f+b eager, both threads on one CPU: flex {row.get('flex_fb_pinned', nan):.3f} ours "
                f"{row.get('ours_fb_pinned', nan):.3f} ms, ratio "
                f"{row.get('ours_fb_pinned', nan) / row.get('flex_fb_pinned', nan):.2f}")
        RES[f"window_T{T0}"] = row
        del q, k, v, g
        empty_cache()
        save()


def flex_window(flex, create_block_mask, q, k, v, g, rep=100, graph=False, pinned=False):
    """FlexAttention sliding window (w=W) on [B, T, H, D] inputs: {"flex_fwd": ms} and, when a
    gradient ``g`` is given, {"flex_fb": ms} (fwd+bwd), with ``graph`` {"flex_fb_graph": ms}
    (one CUDA-graph replay of the compiled fwd+bwd: its GPU time without the host's) and with
    ``pinned`` {"flex_fb_pinned": ms} (eager under :func:`same_cpu`, alternating with the
    unpinned rounds: :func:`bench_steady_pinned`)."""
    T = q.shape[1]
    qt, kt, vt = (x.detach().transpose(1, 2).contiguous().requires_grad_(g is not None) for x in (q, k, v))
    bm = create_block_mask(lambda b, h, qi, ki: (qi >= ki) & (qi - ki < W), 1, 1, T, T, device=DEV, _compile=True)
    out = {}
    with torch.no_grad():
        out["flex_fwd"] = bench_steady(lambda: flex(qt, kt, vt, block_mask=bm, enable_gqa=True), rep=rep)
    if g is not None:
        gt = g.transpose(1, 2).contiguous()

        def fb():
            return torch.autograd.grad(flex(qt, kt, vt, block_mask=bm, enable_gqa=True), (qt, kt, vt), gt)
        if pinned:  # (compiled by the warm-up calls, before any thread is pinned)
            out["flex_fb"], out["flex_fb_pinned"] = bench_steady_pinned(fb, rep=rep)
        else:
            out["flex_fb"] = bench_steady(fb, rep=rep)
        if graph:
            out["flex_fb_graph"] = guard(f"window T={T} flex fwd+bwd graph", lambda: graph_time(fb))
    return out


def prefill(Ts):
    log("\n## prefill forward: window stream + the last token's full query (vs SDPA cuDNN causal fwd)")
    log(f"{'T':>8} {'cuDNN fwd':>10} {'orthros':>9} {'speedup':>8} {'last-query only':>15}")
    nan = float("nan")
    for T0 in Ts:
        T = sz(T0)
        row = {}
        q, k, v = rnd(1, T, HQ, D), rnd(1, T, HKV, D), rnd(1, T, HKV, D)
        qo = q[:, -1:].clone()
        with torch.no_grad():
            row["orthros"] = guard("prefill", lambda: bench(
                lambda: orthros_attention(q, k, v, qo, window_size=W, backend="triton")))
            row["last_query"] = guard("prefill last", lambda: bench(
                lambda: orthros_attention(q[:, :0], k, v, qo, window_size=W, backend="triton")))
            if T0 <= 131072:
                f = sdpa("cudnn")
                qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
                row["cudnn"] = guard("prefill cudnn", lambda: bench(lambda: f(qt, kt, vt), rep=50))
        row = {key: val for key, val in row.items() if val is not None}
        log(f"{T0:>8} {row.get('cudnn', nan):10.3f} {row.get('orthros', nan):9.3f} "
            f"{row.get('cudnn', nan) / row.get('orthros', nan):8.1f} {row.get('last_query', nan):15.3f}")
        RES[f"prefill_T{T0}"] = row
        del q, k, v
        empty_cache()
        save()


# ---------------------------------------------------------------------------- decode
def decode_inputs(B, L):
    q, qo = rnd(B, 1, HQ, D), rnd(B, 1, HQ, D)
    kc, vc = rnd(B, L, HKV, D), rnd(B, L, HKV, D)
    lens = torch.full((B,), L, device=DEV, dtype=torch.int32)
    qs, ks, vs = rnd(B, HQ, 1, D), rnd(B, HKV, L, D), rnd(B, HKV, L, D)
    return q, qo, kc, vc, lens, qs, ks, vs


def decode(Ls, B=1, eager=True):
    log(f"\n## decode step (B={B}): window + full query, one split launch + merge, vs SDPA single-query decode")
    log(f"{'L':>8} {'sdpa':>8} {'ours':>8} {'ratio':>6} {'sdpa graph':>10} {'ours graph':>10} {'ratio':>6} "
        f"{'ours TB/s':>9} {'S':>3}")
    from orthros.ops.triton import decode as td
    from orthros.ops.triton.common import block_d

    nan = float("nan")
    for L0 in Ls:
        L = sz(L0)
        row = {}
        q, qo, kc, vc, lens, qs, ks, vs = decode_inputs(B, L)
        sd = lambda: F.scaled_dot_product_attention(qs, ks, vs, enable_gqa=True)  # noqa: E731
        ours = lambda: orthros_decode_attention(q, qo, kc, vc, lens, window_size=W)  # noqa: E731
        if eager:
            row["sdpa"] = guard(f"decode B={B} L={L0} sdpa", lambda: bench(sd))
            row["ours"] = guard(f"decode B={B} L={L0} ours", lambda: bench(ours))
        row["sdpa_graph"] = guard(f"decode B={B} L={L0} sdpa graph", lambda: graph_time(sd))
        row["ours_graph"] = guard(f"decode B={B} L={L0} ours graph", lambda: graph_time(ours))
        row["splits"] = guard("num_splits", lambda: td.num_splits(B, HKV, L, q.device, elem_bytes=q.element_size(),
                                                                  block_d=block_d(D)))
        row = {key: val for key, val in row.items() if val is not None}
        byts = 2 * B * L * HKV * D * 2
        if "ours_graph" in row:
            row["ours_TBps"] = byts / row["ours_graph"] / 1e9
        if "sdpa_graph" in row:
            row["sdpa_TBps"] = byts / row["sdpa_graph"] / 1e9
        log(f"{L0:>8} {row.get('sdpa', nan) * 1e3:8.1f} {row.get('ours', nan) * 1e3:8.1f} "
            f"{row.get('ours', nan) / row.get('sdpa', nan):6.2f} "
            f"{row.get('sdpa_graph', nan) * 1e3:10.1f} {row.get('ours_graph', nan) * 1e3:10.1f} "
            f"{row.get('ours_graph', nan) / row.get('sdpa_graph', nan):6.2f} {row.get('ours_TBps', nan):9.2f} "
            f"{row.get('splits', 0):>3}")
        RES[f"decode_B{B}_L{L0}"] = row
        del kc, vc, ks, vs
        empty_cache()
        save()


def _split_candidates(B, L, sms, heuristic):
    """Split counts filling 1..4 waves of SMs, and the heuristic's, capped by L // 64 (a short
    cache still gets up to 16 splits at 1K)."""
    pairs = B * HKV
    cands = {heuristic}
    for waves in (1, 2, 3, 4):
        cands.add(max(1, round(waves * sms / pairs)))
    cap = max(1, L // 64)
    return sorted({max(1, min(c, cap, 64)) for c in cands})


# the short contexts behind issue #18 (the engine's 1K decode step), then the long ones
DECODE_TUNE_POINTS = ([(B, L) for B in (1, 8) for L in (1024, 2048, 4096)]
                      + [(B, L) for B in (1, 2, 8) for L in (8192, 32768, 131072)])
DECODE_TUNE_MIN_SPLITS = (64, 128, 256, 512)
DECODE_MERGES = ("separate", "inline")


def decode_tune(points=DECODE_TUNE_POINTS, budget_s=120.0, reps=20):
    """Decode step under CUDA graphs at each (B, L): split counts (1-4 waves, the heuristic's,
    and the heuristic's choice for each ``min_split`` in DECODE_TUNE_MIN_SPLITS and each merge:
    with merge="inline" it prices the serial merge tail, DECODE_CONFIG["merge_tail"]), each with
    both merges (``separate``: split + combine launch; ``inline``: one launch) at the default
    block config, then block configs (BLOCK_N, num_warps, num_stages) at the heuristic's and
    the best split count with that count's faster merge; SDPA decode alongside."""
    from orthros.ops.triton import decode as td
    from orthros.ops.triton.common import block_d
    from orthros.ops.triton.common import num_sms as _num_sms

    t0 = time.time()
    blocks = [(64, 4, 3), (64, 4, 2), (64, 8, 3), (64, 8, 2), (128, 4, 3), (128, 4, 2), (128, 8, 3), (128, 8, 2)]
    if DRY:
        blocks = blocks[:2] + blocks[4:5]
    log(f"\n## decode tune (CUDA graphs, {reps} replays each; ours / SDPA graph; budget {budget_s:.0f} s)")
    log(f"{'B':>2} {'L':>7} {'sdpa us':>8} {'heur S':>6} {'heur us':>8} {'ratio':>6} | best: {'S':>3} "
        f"{'BN':>4} {'nw':>3} {'ns':>3} {'merge':>8} {'us':>8} {'ratio':>6}")
    table = {}
    dev = torch.device(DEV)
    sms = _num_sms(dev)
    nan = float("nan")
    for B, L0 in points:
        L = sz(L0)
        key = f"B{B}_L{L0}"
        res = {"configs": {}, "merge": {}, "min_split": {}}
        q, qo, kc, vc, lens, qs, ks, vs = decode_inputs(B, L)
        sd = lambda: F.scaled_dot_product_attention(qs, ks, vs, enable_gqa=True)  # noqa: E731
        res["sdpa"] = guard(f"tune {key} sdpa", lambda: graph_time(sd, reps))
        split_of = lambda cfg=None: td.num_splits(B, HKV, L, dev, cfg, q.element_size(), block_d(D),  # noqa: E731
                                                  HQ // HKV)
        heur = split_of()
        res["heuristic_splits"] = heur

        def ours(cfg):
            return lambda: td.decode_attention_triton(q, qo, kc, vc, lens, window_size=W, _config=cfg)

        def measure(S, bn, nw, ns, merge):
            name = f"S{S}_bn{bn}_w{nw}_s{ns}_{merge}"
            if name not in res["configs"]:
                cfg = {"splits": S, "block_n": bn, "num_warps": nw, "num_stages": ns, "merge": merge}
                ms = guard(f"tune {key} {name}", lambda: graph_time(ours(cfg), reps))
                if ms is not None:
                    res["configs"][name] = ms
            return res["configs"].get(name)
        res["heuristic"] = guard(f"tune {key} heuristic", lambda: graph_time(ours(None), reps))
        for ms_ in DECODE_TUNE_MIN_SPLITS:  # the heuristic's S per merge (inline prices its merge tail)
            res["min_split"][ms_] = {m: {"S": split_of({**td.DECODE_CONFIG, "min_split": ms_, "merge": m})}
                                     for m in DECODE_MERGES}
        d_bn, d_nw, d_ns = td.DECODE_CONFIG["block_n"], td.DECODE_CONFIG["num_warps"], td.DECODE_CONFIG["num_stages"]
        cands = sorted(set(_split_candidates(B, L, sms, heur))
                       | {v["S"] for r in res["min_split"].values() for v in r.values()})
        for S in cands:
            # one split writes its outputs directly in both modes: the same program, timed once
            t_sep = measure(S, d_bn, d_nw, d_ns, "separate")
            t_inl = t_sep if S == 1 else measure(S, d_bn, d_nw, d_ns, "inline")
            res["merge"][S] = {"separate": t_sep, "inline": t_inl}
        for r in res["min_split"].values():
            for m, v in r.items():
                v["ms"] = res["merge"].get(v["S"], {}).get(m)
        # fastest (time, merge) per split count; one split is the direct write ("direct")
        timed = {S: (r["separate"], "direct") if S == 1 else min((t, m) for m, t in r.items() if t is not None)
                 for S, r in res["merge"].items() if r["separate"] is not None or r["inline"] is not None}
        best_S = min(timed, key=lambda s: timed[s][0]) if timed else heur
        for S in sorted({heur, best_S}):
            merge = timed[S][1] if S in timed and timed[S][1] != "direct" else "separate"
            for bn, nw, ns in blocks:
                if time.time() - t0 > budget_s:
                    break
                measure(S, bn, nw, ns, merge)
        if time.time() - t0 > budget_s:
            log(f"  (budget reached at {key}: block-config sweep cut short)")
        if res["configs"]:
            bname = min(res["configs"], key=res["configs"].get)
            res["best"] = bname
            res["best_ms"] = res["configs"][bname]
        both = {S: r for S, r in res["merge"].items() if S > 1 and None not in r.values()}
        res["inline_wins"] = sum(r["inline"] < r["separate"] for r in both.values())
        res["merge_compared"] = len(both)
        table[key] = res
        sdp = res.get("sdpa") or nan
        hms = res.get("heuristic") or nan
        bms = res.get("best_ms", nan)
        parts = res.get("best", "S0_bn0_w0_s0_-").split("_")
        log(f"{B:>2} {L0:>7} {sdp * 1e3:8.1f} {heur:>6} {hms * 1e3:8.1f} {hms / sdp:6.3f} | best: "
            f"{parts[0][1:]:>3} {parts[1][2:]:>4} {parts[2][1:]:>3} {parts[3][1:]:>3} {parts[4]:>8} "
            f"{bms * 1e3:8.1f} {bms / sdp:6.3f}")
        us = lambda t: f"{t * 1e3:.1f}" if t is not None else "-"  # noqa: E731
        log("   merge at equal S (us, separate/inline): "
            + "  ".join(f"S{S} {us(r['separate'])}/{us(r['inline'])}" for S, r in sorted(res["merge"].items()))
            + f"  -> inline faster at {res['inline_wins']} of {res['merge_compared']}"
            + (f"; best S{best_S} {timed[best_S][1]} {us(timed[best_S][0])} us" if timed else ""))
        log("   heuristic at min_split (separate: S, us / inline: S, us): "
            + "  ".join(f"{m}: S{r['separate']['S']} {us(r['separate']['ms'])} / S{r['inline']['S']} "
                        f"{us(r['inline']['ms'])}" for m, r in res["min_split"].items()))
        RES["decode_tune"] = table
        del kc, vc, ks, vs
        empty_cache()
        save()
    log(f"(decode tune: {time.time() - t0:.0f} s)")


# ---------------------------------------------------------------------------- window tune
WINDOW_BWD_CANDIDATES = [
    # (name, {CONFIGS kind: (BLOCK_M, BLOCK_N, num_warps, num_stages)}, fused backward,
    #  attention.DQ_VARIANT[:attention.DKDV_VARIANT])
    ("base", {}, True, "base"),
    ("two-launch", {}, False, "base"),
    ("dkdv 64x128 w8", {"bwd_dkdv": (64, 128, 8, 2)}, True, "base"),
    ("dkdv 32x64 w4", {"bwd_dkdv": (32, 64, 4, 2)}, True, "base"),  # the default at head dim 128 since fd3deb8's run
    ("dkdv 64x64 w4", {"bwd_dkdv": (64, 64, 4, 2)}, True, "base"),  # the default before
    ("dkdv 64x64 w8", {"bwd_dkdv": (64, 64, 8, 2)}, True, "base"),
    ("dkdv 64x64 s3", {"bwd_dkdv": (64, 64, 4, 3)}, True, "base"),
    ("dq 128x64", {"bwd_dq": (128, 64, 4, 2)}, True, "base"),
    ("dkdv 128x64 w8", {"bwd_dkdv": (128, 64, 8, 2)}, True, "base"),
    # GQA-packed dQ (128 rows: 8 warps; in one launch the dK/dV programs run with them too)
    ("dq gqa w8 fused", {"bwd_dkdv": (64, 64, 8, 2), "bwd_dq_gqa": (128, 64, 8, 2)}, True, "gqa"),
    ("dq gqa w8 2-launch", {"bwd_dq_gqa": (128, 64, 8, 2)}, False, "gqa"),
    ("dq gqa 128x32 fused", {"bwd_dkdv": (64, 64, 8, 2), "bwd_dq_gqa": (128, 32, 8, 2)}, True, "gqa"),
    # the edge-masked dQ of one head a program (DQ_VARIANT "edge") and dK/dV without the mask of
    # interior blocks (DKDV_VARIANT "edge"; "dq:dkdv" in this field), alone and with 2026-12-02's
    # best dK/dV blocks
    ("dq edge", {}, True, "edge"),
    ("dkdv edge", {}, True, "base:edge"),
    ("dq+dkdv edge", {}, True, "edge:edge"),
    ("dq+dkdv edge + dkdv 32x64", {"bwd_dkdv": (32, 64, 4, 2)}, True, "edge:edge"),
    ("dq edge + dkdv 32x64", {"bwd_dkdv": (32, 64, 4, 2)}, True, "edge"),
    # two launches, each compiled with its own kind of program (PROGS): the one-launch kernel holds
    # the dK/dV programs' 255 registers and spills (ncu on the H200, 2026-12-02: 7.8M local-memory
    # spill requests a 32K backward, 12.5% occupancy); these dK/dV blocks compile without spills for
    # sm_90 (cuobjdump --dump-resource-usage: 64x32 w8 176 registers, 32x64 w8 229, 32x32 w4 188,
    # 16x64 w4 240, 32x32 w8 166), the dQ programs alone 198. Measured (H200, fd3deb8): every one of
    # them slower than the one-launch 32 x 64 (e.g. 2.07-3.16 against 1.71 ms at 32K)
    ("2-launch dkdv 64x32 w8", {"bwd_dkdv": (64, 32, 8, 2)}, False, "base"),
    ("2-launch dkdv 32x64 w8", {"bwd_dkdv": (32, 64, 8, 2)}, False, "base"),
    ("2-launch dkdv 32x32 w4", {"bwd_dkdv": (32, 32, 4, 2)}, False, "base"),
    ("2-launch dkdv 16x64 w4", {"bwd_dkdv": (16, 64, 4, 2)}, False, "base"),
    ("2-launch dkdv 32x32 w8", {"bwd_dkdv": (32, 32, 8, 2)}, False, "base"),
    # masks by common.band on int32 relative positions (DQ_VARIANT / DKDV_VARIANT "rel"; ninth
    # session): sm_90 SASS of the loop a trip, 32 x 64 dK/dV 556 -> 411 instructions, 64 x 64 dQ
    # 747 -> 570 (cuobjdump, Triton 3.6). Measured (H200, 0abbc51; fwd+bwd against the old "base"
    # at 32K / 128K): the dK/dV programs' -3.5% / -3.0% (the default since), both -5.1% / -0.5%,
    # the dQ programs' alone -1.2% / -1.4%; with 64 x 64 dK/dV blocks +7.6% / +2.5%; in two
    # launches +0.6% / -0.2%. "base" above is now the rel dK/dV.
    ("dq rel", {}, True, "rel"),
    ("dkdv visible", {}, True, "base:base"),
    # no dQ programs (DQ_VARIANT "ds"; thirteenth session, docs/performance.md kernels change 16): the
    # dK/dV programs in their own launch also store their dS tiles, one pass sums dS @ K (4 heads'
    # 32 or 64 rows a program). sm_90 SASS (Triton 3.9 on the CPU): the 32 x 64 w4 dK/dV trip
    # 410 -> 432 instructions, stack 24 bytes either way; 64 x 64 w8 and 32 x 64 w8 without stack;
    # the dS pass 129 instructions a trip (8 warps, 116 registers). Measured (H200, f4107e0): "dq ds"
    # -5.2% / -6.0% / -4.4% at 8K / 32K / 128K against "base" (the default since), the 8-warp
    # dK/dV tiles +25% to +44%
    ("dq ds", {}, True, "ds"),
    ("dq ds + dkdv 64x64 w8", {"bwd_dkdv": (64, 64, 8, 2)}, True, "ds"),
    ("dq ds + dkdv 32x64 w8", {"bwd_dkdv": (32, 64, 8, 2)}, True, "ds"),
    # the dS pass's launch (DQ_DS_LAUNCH; fourteenth session, docs/performance.md change 17). 8 warps
    # 2 stages (the first default) ran it at ~3 TB/s: 62 / 234 / 921 us at 8K / 32K / 128K. Measured
    # (H200, 76d3740), the pass alone: 4 warps 3 stages 56 / 197 / 769 us (the default since), 8 warps
    # 3 stages 57 / 202 / 786, 4 warps 2 stages 62 / 231 / 913, 1 stage and 16 warps slower
    ("ds pass w8 s2", {"dq_ds": (8, 2)}, True, "ds"),
    ("ds pass w8 s3", {"dq_ds": (8, 3)}, True, "ds"),
    ("ds pass w4 s4", {"dq_ds": (4, 4)}, True, "ds"),
    ("ds pass w8 s4", {"dq_ds": (8, 4)}, True, "ds"),
    # Measured and removed (H200, 2026-12-02, seventh session; docs/performance.md kernels changes
    # 9 and 10): dK/dV programs with one loop over (head, query block) and int32 masks ("flat",
    # "flat-edge": -0.4% to +2.3% at 32K / 128K), and delta = rowsum(dO * O) inside the backward's
    # programs instead of its own pass (+10 to +30%); the delta pass over contiguous (token, head)
    # rows instead of one head's tokens a program (kernels change 11: -0.6% at 32K, within noise);
    # GQA-packed dK/dV tiles, every head's copy of the same positions in one tile (kernels change 12:
    # 64 x 64 w4 +2.9% at 32K and -1.0% at 128K, 64 x 32 w4 +12%, 128 x 64 w8 +72%). Eighth session
    # (kernels change 13): delta by the dQ programs, no delta pass, with ready flags for the dK/dV
    # programs in one launch (+4.5% at 32K, -2.9% eagerly / +0.5% under a graph at 128K) or the dQ
    # launch first of two (+2.6% / +1.9%).
]


@contextlib.contextmanager
def kernel_overrides(configs=None, fused=None, fwd_variant=None, dq_variant=None, fwd_rel=None):
    """Within the block: ``attention.CONFIGS[kind]`` entries of this run's head dim set from
    ``{kind: (BLOCK_M, BLOCK_N, warps, stages)}`` (and ``"dq_ds": (warps, stages)``, the dS pass's
    ``DQ_DS_LAUNCH``), ``FUSED_BWD``, the window stream's forward
    variant (``FWD_VARIANT["win_fwd"]``), ``DQ_VARIANT`` and (``dq_variant`` "dq:dkdv")
    ``DKDV_VARIANT`` and ``FWD_REL`` set when given; all restored afterwards."""
    from orthros.ops.triton import attention as ta

    bd = 128 if D > 64 else 64
    configs = dict(configs or {})
    ds_launch = configs.pop("dq_ds", None)  # (warps, stages) of _dq_from_ds: attention.DQ_DS_LAUNCH
    keep_ds = ta.DQ_DS_LAUNCH
    keep = {kind: ta.CONFIGS[kind][bd] for kind in configs}
    keep_fused, keep_variant, keep_dq, keep_dkdv = ta.FUSED_BWD, ta.FWD_VARIANT["win_fwd"], ta.DQ_VARIANT, \
        ta.DKDV_VARIANT
    keep_rel = ta.FWD_REL
    try:
        if ds_launch is not None:
            ta.DQ_DS_LAUNCH = tuple(ds_launch)
        if fwd_rel is not None:
            ta.FWD_REL = fwd_rel
        for kind, cfg in configs.items():
            ta.CONFIGS[kind][bd] = cfg
        if fused is not None:
            ta.FUSED_BWD = fused
        if fwd_variant is not None:
            ta.FWD_VARIANT["win_fwd"] = fwd_variant
        if dq_variant is not None:
            dq, _, dkdv = dq_variant.partition(":")
            ta.DQ_VARIANT = dq
            if dkdv:
                ta.DKDV_VARIANT = dkdv
        yield
    finally:
        for kind, cfg in keep.items():
            ta.CONFIGS[kind][bd] = cfg
        ta.FUSED_BWD, ta.FWD_VARIANT["win_fwd"], ta.DQ_VARIANT, ta.DKDV_VARIANT = keep_fused, keep_variant, keep_dq, \
            keep_dkdv
        ta.FWD_REL = keep_rel
        ta.DQ_DS_LAUNCH = keep_ds


def window_tune(Ts=(8192, 32768, 131072), flex_T=8192, budget_s=150.0, names=None):
    """Window-only fwd+bwd of each backward candidate (WINDOW_BWD_CANDIDATES, or those named in
    ``names``, "base" always first) at each T, host enqueue time, the best one under a CUDA graph."""
    t0 = time.time()
    cands = [c for c in WINDOW_BWD_CANDIDATES if names is None or c[0] == "base" or c[0] in names]
    log("\n## window tune: window-only fwd+bwd (eager do_bench), host enqueue time, CUDA-graph replay")
    log(f"{'T':>6} {'config':>16} {'f+b ms':>8} {'host ms':>8} {'graph ms':>9}")
    out = {}
    nan = float("nan")
    for T0 in Ts:
        T = sz(T0)
        q, k, v = rnd(1, T, HQ, D, grad=True), rnd(1, T, HKV, D, grad=True), rnd(1, T, HKV, D, grad=True)
        g = rnd(1, T, HQ, D)
        qo = q[:, :0].detach()

        def fb():
            return torch.autograd.grad(orthros_attention(q, k, v, qo, window_size=W, backend="triton")[0], (q, k, v), g)

        def fwd():
            with torch.no_grad():
                return orthros_attention(q, k, v, qo, window_size=W, backend="triton")
        rows = {}
        for name, over, fused, dq in cands:
            if time.time() - t0 > budget_s:
                log("  (budget reached: rest skipped)")
                break
            with kernel_overrides(over, fused=fused, dq_variant=dq):
                row = {"fb": guard(f"wtune T={T0} {name}", lambda: bench(fb, rep=50))}
                row["host"] = guard(f"wtune T={T0} {name} host", lambda: host_time(fb))
                row["kernels_us"] = guard(f"wtune T={T0} {name} kernels", lambda: kernel_split(fb))
                if name == "base":
                    row["graph"] = guard(f"wtune T={T0} {name} graph", lambda: graph_time(fb))
                    row["fwd"] = guard(f"wtune T={T0} fwd", lambda: bench(fwd, rep=50))
                    row["fwd_host"] = guard(f"wtune T={T0} fwd host", lambda: host_time(fwd))
                    row["fwd_graph"] = guard(f"wtune T={T0} fwd graph", lambda: graph_time(fwd))
            rows[name] = row
            log(f"{T0:>6} {name:>16} {row['fb'] or nan:8.3f} {row['host'] or nan:8.3f} "
                f"{row.get('graph') or nan:9.3f}  kernels (us) "
                + " ".join(f"{k} {v:.1f}" for k, v in (row["kernels_us"] or {}).items()))
        if rows:
            ok = {n: r["fb"] for n, r in rows.items() if r.get("fb")}
            if ok:
                best = min(ok, key=ok.get)
                log(f"  best at T={T0}: {best} {ok[best]:.3f} ms")
                if best != "base" and time.time() - t0 < budget_s:
                    over, fused, dq = next((o, f, d) for n, o, f, d in WINDOW_BWD_CANDIDATES if n == best)
                    with kernel_overrides(over, fused=fused, dq_variant=dq):
                        rows[best]["graph"] = guard(f"wtune T={T0} {best} graph", lambda: graph_time(fb))
                        log(f"  best under a CUDA graph: {rows[best]['graph'] or nan:.3f} ms")
        if T0 == 8192 or DRY:
            guard("host profile", lambda: host_profile(fb))
        prev = RES.get(f"window_T{T0}", {})
        if T0 == flex_T and "flex_fb" in prev:  # measured by --targets in this run: no second compile
            rows["flex_fwd"], rows["flex_fb"] = prev.get("flex_fwd"), prev["flex_fb"]
            log(f"  flex at T={T0} (from --targets): fwd {rows['flex_fwd']} ms, fwd+bwd {rows['flex_fb']:.3f} ms")
        elif T0 == flex_T and time.time() - t0 < budget_s:
            flex, create_block_mask = make_flex()
            if flex is not None:
                rows.update(guard(f"wtune T={T0} flex",
                                  lambda: flex_window(flex, create_block_mask, q, k, v, g, rep=50)) or {})
                if "flex_fb" in rows:
                    log(f"  flex at T={T0}: fwd {rows['flex_fwd']:.3f} ms, fwd+bwd {rows['flex_fb']:.3f} ms")
        out[f"T{T0}"] = rows
        RES["window_tune"] = out
        del q, k, v, g
        empty_cache()
        save()
    log(f"(window tune: {time.time() - t0:.0f} s)")


# ---------------------------------------------------------------------------- window forward variants
WINDOW_FWD_CANDIDATES = [
    # (name, attention.FWD_VARIANT of the window stream, {CONFIGS kind: (BLOCK_M, BLOCK_N, warps, stages)},
    #  backward overrides (kernel_overrides keywords)). gqa*: BLOCK_M counts packed rows (all G
    # heads x BLOCK_M // G queries). First: the default, the reference of the error column
    # ("auto" since 2026-12-03: edge 64x32 below 32K tokens, gqa 128x32 w4 s2 from 32K; "edge
    # 64x32" since 2026-12-02; "base" 64x64 before).
    ("default", None, {}, {}),
    ("base", "base", {"win_fwd": (64, 64, 4, 3)}, {}),
    ("edge", "edge", {"win_fwd": (64, 64, 4, 3)}, {}),
    ("edge 64x32", "edge", {"win_fwd": (64, 32, 4, 3)}, {}),
    ("gqa 128x64", "gqa", {"win_fwd_gqa": (128, 64, 8, 3)}, {}),
    ("gqa 128x32 w8", "gqa", {"win_fwd_gqa": (128, 32, 8, 3)}, {}),
    ("gqa 128x32 w4 s2", "gqa", {"win_fwd_gqa": (128, 32, 4, 2)}, {}),
    ("gqa_masked 128x64", "gqa_masked", {"win_fwd_gqa": (128, 64, 8, 3)}, {}),
    # the packed forward with the packed dQ in its own 8-warp launch (fwd column: as gqa 128x64)
    ("gqa + dq gqa", "gqa", {"win_fwd_gqa": (128, 64, 8, 3), "bwd_dq_gqa": (128, 64, 8, 2)},
     {"fused": False, "dq_variant": "gqa"}),
    # ninth session: the edge blocks masked by common.band (FWD_REL, the default since then, so
    # "edge 64x32" is that) against the old int64 mask; the lazy rescale of the online softmax
    # (FA4's: the running max moves only when a row's block max passes it by > 8 log2 units) was
    # measured and removed (H200, 0abbc51: at 32K-1M edge 64 x 32 +5 to +8%, gqa +11 to +13%;
    # faster only at 8K)
    ("edge 64x32 visible", "edge", {"win_fwd": (64, 32, 4, 3)}, {"fwd_rel": False}),
    ("gqa 128x32 visible", "gqa", {"win_fwd_gqa": (128, 32, 4, 2)}, {"fwd_rel": False}),
]
FWD_OPTIONS = ("fwd_rel",)  # kernel_overrides keywords of the forward (the others: the backward's)
PEAK_TFLOPS, PEAK_TBPS = 790.0, 4.3  # H200: bf16 matmul, copy (../shared/anchors/h200.md)


def window_floors(T):
    """(fwd, fwd+bwd) floors (ms) of the window stream at T tokens: max(useful FLOPs / peak,
    bytes / bandwidth). fwd: 4·Hq·D·T·w FLOPs, reads Q, K, V and writes O; fwd+bwd: 3.5x those
    FLOPs, and the backward also reads Q, K, V, O, dO and writes dQ, dK, dV (3x the fwd bytes)."""
    flops = 4 * HQ * D * T * W
    byts = T * (2 * HQ + 2 * HKV) * D * torch.empty(0, dtype=DT).element_size()
    return (max(flops / PEAK_TFLOPS, byts / PEAK_TBPS) / 1e9,
            max(3.5 * flops / PEAK_TFLOPS, 3 * byts / PEAK_TBPS) / 1e9)


def window_fwd_variants(Ts=(8192, 32768, 131072, 1048576), grad_max=131072, budget_s=300.0, names=None):
    """Each window-forward candidate (kernel variant x block config) at each T: fwd and, up to
    ``grad_max``, fwd+bwd (the backward is shared: it reads the variant's LSE), next to Flex in the same
    run (or --targets' Flex figures of this run); Flex/ours (target >= 1.5 fwd, >= 1.4 fwd+bwd),
    ours/floor, and ||o - o_base|| / ||o_base||; then the winner. ``names``: only these candidates
    (the default always first: the error column's reference)."""
    t0 = time.time()
    cands = [c for c in WINDOW_FWD_CANDIDATES if names is None or c[0] == "default" or c[0] in names]
    log("\n## window forward variants (w=128): fwd, fwd+bwd (shared backward) vs Flex and the floor")
    log(f"{'T':>6} {'candidate':>18} {'fwd ms':>8} {'Flex/ours':>9} {'/floor':>6} {'f+b ms':>8} {'Flex/ours':>9} "
        f"{'/floor':>6} {'err vs base':>11}")
    out = {}
    nan = float("nan")
    flex, create_block_mask = make_flex()
    for T0 in Ts:
        if time.time() - t0 > budget_s:
            log(f"  (budget reached: T={T0} and beyond skipped)")
            break
        T = sz(T0)
        grad = T0 <= grad_max
        q, k, v = (rnd(1, T, h, D, grad=grad) for h in (HQ, HKV, HKV))
        g = rnd(1, T, HQ, D) if grad else None
        qo = q[:, :0].detach()

        def fwd():
            with torch.no_grad():
                return orthros_attention(q, k, v, qo, window_size=W, backend="triton")[0]

        def fb():
            return torch.autograd.grad(orthros_attention(q, k, v, qo, window_size=W, backend="triton")[0], (q, k, v), g)
        floor_f, floor_fb = window_floors(T)
        prev = RES.get(f"window_T{T0}", {})  # --targets' Flex at this T in this run: no second compile
        res = {key: prev[key] for key in ("flex_fwd", "flex_fb") if key in prev}
        if not res and flex is not None:
            res = guard(f"wfwd T={T0} flex", lambda: flex_window(flex, create_block_mask, q, k, v, g, rep=50)) or {}
        ffwd, ffb = res.get("flex_fwd") or nan, res.get("flex_fb") or nan
        rows, ref = {}, None
        for name, variant, over, bwd in cands:
            if time.time() - t0 > budget_s:
                log("  (budget reached: rest skipped)")
                break
            with kernel_overrides(over, fwd_variant=variant, **bwd):
                row = {"fwd": guard(f"wfwd T={T0} {name}", lambda: bench(fwd, rep=50))}
                o = guard(f"wfwd T={T0} {name} output", fwd)
                if o is not None:
                    ref = o if ref is None else ref  # the first candidate (the default) is the reference
                    row["err"] = ((o.float() - ref.float()).norm() / ref.float().norm()).item()
                if grad:
                    row["fb"] = guard(f"wfwd T={T0} {name} fwd+bwd", lambda: bench(fb, rep=50))
            del o
            rows[name] = row = {key: val for key, val in row.items() if val is not None}
            f_ms, fb_ms = row.get("fwd", nan), row.get("fb", nan)
            bad = "  WRONG" if row.get("err", 0) > (1e-4 if DT == torch.float32 else 2e-2) else ""
            log(f"{T0:>6} {name:>18} {f_ms:8.3f} {ffwd / f_ms:9.2f} {f_ms / floor_f:6.2f} {fb_ms:8.3f} "
                f"{ffb / fb_ms:9.2f} {fb_ms / floor_fb:6.2f} {row.get('err', nan):11.1e}{bad}")
        fwd_only = {n for n, _, _, bwd in cands if set(bwd) <= set(FWD_OPTIONS)}  # the others repeat a forward
        for key in ("fwd", "fb"):
            ok = {n: r[key] for n, r in rows.items()
                  if key in r and r.get("err", 1) <= 2e-2 and (key == "fb" or n in fwd_only)}
            if ok:
                best = min(ok, key=ok.get)
                flex_ms = ffwd if key == "fwd" else ffb
                log(f"  fastest {key} at T={T0}: {best} {ok[best]:.3f} ms = {flex_ms / ok[best]:.2f}x faster than Flex, "
                    f"{ok[best] / (floor_f if key == 'fwd' else floor_fb):.2f}x the floor")
        out[f"T{T0}"] = {"candidates": rows, **res, "floor_fwd": floor_f, "floor_fb": floor_fb}
        RES["window_fwd_variants"] = out
        del q, k, v, g, ref
        empty_cache()
        save()
    # winner: the lowest geometric mean of fwd times over the sizes every correct candidate ran at
    names = [n for n, _, _, bwd in cands
             if set(bwd) <= set(FWD_OPTIONS) and out
             and all("fwd" in r["candidates"].get(n, {}) and r["candidates"][n].get("err", 1) <= 2e-2
                     for r in out.values())]
    if names:
        gm = {n: torch.tensor([r["candidates"][n]["fwd"] for r in out.values()]).log().mean().exp().item()
              for n in names}
        win = min(gm, key=gm.get)
        log(f"  winner (geometric mean of fwd over {len(out)} sizes): {win}, {gm['default'] / gm[win]:.2f}x the default"
            if "default" in gm else f"  winner: {win}")
        RES["window_fwd_winner"] = win
    log(f"(window forward variants: {time.time() - t0:.0f} s)")


def kernel_split(fn, n=None):
    """GPU time (us) a call of each Triton kernel ``fn`` launches (``torch.profiler``, ``n`` calls;
    the kernels of ``orthros/ops/triton``, named after their jit functions), or {} in a dry run."""
    if DRY:
        return {}
    n = n or 20
    fn()
    sync()
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(n):
            fn()
        sync()
    out = {}
    for e in prof.key_averages():
        t = getattr(e, "self_device_time_total", None)
        if t is None:  # older torch
            t = e.self_cuda_time_total
        # the ops' jit kernels (_stream_fwd, _bwd_delta, ...), not the autograd nodes around them
        if t > 0 and e.key.startswith("_") and "Attention" not in e.key:
            out[e.key] = round(t / n, 1)
    return out


def host_profile(fn, n=None, top=14):
    """cProfile of n calls (host side only; the GPU runs asynchronously)."""
    import cProfile
    import io
    import pstats

    n = n or (2 if DRY else 30)
    fn()
    sync()
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(n):
        fn()
    pr.disable()
    sync()
    buf = io.StringIO()
    pstats.Stats(pr, stream=buf).sort_stats("tottime").print_stats(top)
    text = buf.getvalue()
    lines = [ln for ln in text.splitlines() if ln.strip()][:top + 8]
    log("  host profile of window fwd+bwd (%d calls, tottime-sorted):" % n)
    for ln in lines:
        log("    " + ln[:160])
    RES["host_profile"] = "\n".join(lines)


# ---------------------------------------------------------------------------- older modes
def sweep():
    """Block configurations of the window kernels and the decode kernel."""
    from orthros.ops.triton import attention as ta
    from orthros.ops.triton import decode as td
    from orthros.ops.triton.common import block_d

    log("\n## sweep: window stream fwd / fwd+bwd at T=32K")
    T = sz(32768)
    q, k, v = rnd(1, T, HQ, D, grad=True), rnd(1, T, HKV, D, grad=True), rnd(1, T, HKV, D, grad=True)
    g = rnd(1, T, HQ, D)
    qo = q[:, :0].detach()
    base = dict(ta.CONFIGS["win_fwd"])
    for cfg in [(64, 64, 4, 3), (128, 64, 8, 3), (128, 32, 4, 3), (64, 32, 4, 3), (128, 64, 4, 2), (64, 64, 4, 2)]:
        ta.CONFIGS["win_fwd"][128] = cfg
        with torch.no_grad():
            ms = guard(f"sweep win_fwd {cfg}",
                       lambda: bench(lambda: orthros_attention(q, k, v, qo, window_size=W, backend="triton")))
        log(f"  win_fwd {cfg}: {ms} ms")
        RES[f"sweep_win_fwd_{cfg}"] = ms
    ta.CONFIGS["win_fwd"].update(base)
    for kind, cfgs in [("bwd_dq", [(64, 64, 4, 2), (128, 64, 8, 2), (64, 32, 4, 3), (128, 32, 4, 2)]),
                       ("bwd_dkdv", [(64, 64, 4, 2), (64, 128, 8, 2), (32, 64, 4, 3), (64, 32, 4, 2)])]:
        keep = ta.CONFIGS[kind][128]
        for cfg in cfgs:
            ta.CONFIGS[kind][128] = cfg
            ms = guard(f"sweep {kind} {cfg}", lambda: bench(lambda: torch.autograd.grad(
                orthros_attention(q, k, v, qo, window_size=W, backend="triton")[0], (q, k, v), g)))
            log(f"  {kind} {cfg}: fwd+bwd {ms} ms")
            RES[f"sweep_{kind}_{cfg}"] = ms
        ta.CONFIGS[kind][128] = keep
    del q, k, v, g
    save()


def compare_fused(Ts):
    """Window-stream fwd+bwd with the backward in one launch (fused) or two."""
    from orthros.ops.triton import attention as ta

    log("\n## window stream fwd+bwd: backward dQ and dK/dV in one launch vs two")
    log(f"{'T':>8} {'fused':>8} {'two':>8}")
    keep = ta.FUSED_BWD
    for T0 in Ts:
        T = sz(T0)
        q, k, v = rnd(1, T, HQ, D, grad=True), rnd(1, T, HKV, D, grad=True), rnd(1, T, HKV, D, grad=True)
        g = rnd(1, T, HQ, D)
        qo = q[:, :0].detach()
        row = {}
        try:
            for name, fused in (("fused", True), ("two", False)):
                ta.FUSED_BWD = fused
                row[name] = guard(f"fused T={T0} {name}", lambda: bench(lambda: torch.autograd.grad(
                    orthros_attention(q, k, v, qo, window_size=W, backend="triton")[0], (q, k, v), g)))
        finally:
            ta.FUSED_BWD = keep
        log(f"{T0:>8} {row['fused']} {row['two']}")
        RES[f"fused_T{T0}"] = row
    save()


# ---------------------------------------------------------------------------- targets
def targets():
    """Exactly the rows behind the issue's targets, with same-run baselines."""
    training([8192, 16384, 32768], flash=False)
    window_stream([8192, 32768, 131072], flex_Ts={8192, 32768, 131072}, graph=True)
    decode([32768, 131072], B=1, eager=False)
    decode([32768, 131072], B=8, eager=False)


def _f(x, scale=1.0, fmt="{:.3f}"):
    return "n/a" if x is None else fmt.format(x * scale)


def _ratio(a, b):
    return "n/a" if a is None or b is None or not b else f"{a / b:.2f}"


def markdown():
    """The measured rows as markdown tables (ready for docs/benchmarks.md)."""
    out = [f"\nMeasured on {META.get('device', '?')} (torch {META.get('torch', '?')}, triton "
           f"{META.get('triton', '?')}), commit `{META.get('commit', '?')}`, {META.get('date', '')}."]
    tr = [(k, v) for k, v in RES.items() if k.startswith("train_T")]
    if tr:
        out += ["", "| T | SDPA cuDNN causal fwd+bwd | Orthros op fwd+bwd | x cuDNN | window stream alone |",
                "|---|---|---|---|---|"]
        for k, r in tr:
            T = int(k[7:])
            out.append(f"| {T // 1024}K | {_f(r.get('cudnn'))} ms | {_f(r.get('orthros'))} ms | "
                       f"**{_ratio(r.get('orthros'), r.get('cudnn'))}** | {_f(r.get('window'))} ms |")
    wi = [(k, v) for k, v in RES.items() if k.startswith("window_T")]
    if wi:
        out += ["", "| T | Flex fwd | ours fwd | ratio | Flex fwd+bwd | ours fwd+bwd | ratio | ours fwd+bwd (graph) |",
                "|---|---|---|---|---|---|---|---|"]
        for k, r in wi:
            T = int(k[8:])
            out.append(f"| {T // 1024}K | {_f(r.get('flex_fwd'))} ms | {_f(r.get('ours_fwd'))} ms | "
                       f"**{_ratio(r.get('ours_fwd'), r.get('flex_fwd'))}** | {_f(r.get('flex_fb'))} ms | "
                       f"{_f(r.get('ours_fb'))} ms | **{_ratio(r.get('ours_fb'), r.get('flex_fb'))}** | "
                       f"{_f(r.get('ours_fb_graph'))} ms |")
    de = [(k, v) for k, v in RES.items() if k.startswith("decode_B")]
    if de:
        out += ["", "| B | L | SDPA graph | ours graph | ratio (graph) | splits S | ours KV bandwidth |",
                "|---|---|---|---|---|---|---|"]
        for k, r in de:
            B, L = k[8:].split("_L")
            out.append(f"| {B} | {int(L) // 1024}K | {_f(r.get('sdpa_graph'), 1e3, '{:.1f}')} us | "
                       f"{_f(r.get('ours_graph'), 1e3, '{:.1f}')} us | "
                       f"**{_ratio(r.get('ours_graph'), r.get('sdpa_graph'))}** | {r.get('splits', '?')} | "
                       f"{_f(r.get('ours_TBps'), 1, '{:.2f}')} TB/s |")
    dt = RES.get("decode_tune")
    if dt:
        out += ["", "| B | L | SDPA graph | heuristic S | ours (heuristic) | ratio | best config | best | ratio |",
                "|---|---|---|---|---|---|---|---|---|"]
        for k, r in dt.items():
            B, L = k[1:].split("_L")
            out.append(f"| {B} | {int(L) // 1024}K | {_f(r.get('sdpa'), 1e3, '{:.1f}')} us | "
                       f"{r.get('heuristic_splits')} | {_f(r.get('heuristic'), 1e3, '{:.1f}')} us | "
                       f"{_ratio(r.get('heuristic'), r.get('sdpa'))} | {r.get('best', 'n/a')} | "
                       f"{_f(r.get('best_ms'), 1e3, '{:.1f}')} us | {_ratio(r.get('best_ms'), r.get('sdpa'))} |")
        out += ["", "| B | L | S | separate (split + combine) | inline (one launch) | inline / separate |",
                "|---|---|---|---|---|---|"]
        for k, r in dt.items():
            B, L = k[1:].split("_L")
            for S, m in sorted(r.get("merge", {}).items()):
                if S > 1:
                    out.append(f"| {B} | {int(L) // 1024}K | {S} | {_f(m.get('separate'), 1e3, '{:.1f}')} us | "
                               f"{_f(m.get('inline'), 1e3, '{:.1f}')} us | "
                               f"{_ratio(m.get('inline'), m.get('separate'))} |")
    wt = RES.get("window_tune")
    if wt:
        out += ["", "| T | backward config | fwd+bwd | host enqueue | CUDA graph |", "|---|---|---|---|---|"]
        for k, rows in wt.items():
            for name, r in rows.items():
                if isinstance(r, dict):
                    out.append(f"| {int(k[1:]) // 1024}K | {name} | {_f(r.get('fb'))} ms | {_f(r.get('host'))} ms | "
                               f"{_f(r.get('graph'))} ms |")
            if "flex_fb" in rows:
                out.append(f"| {int(k[1:]) // 1024}K | Flex (fwd {_f(rows.get('flex_fwd'))} ms) | "
                           f"{_f(rows.get('flex_fb'))} ms | | |")
    wv = RES.get("window_fwd_variants")
    if wv:
        out += ["", f"Window forward variants (winner: {RES.get('window_fwd_winner', 'n/a')}):", "",
                "| T | candidate | fwd | Flex/ours | ours/floor | fwd+bwd | Flex/ours | ours/floor | err vs base |",
                "|---|---|---|---|---|---|---|---|---|"]
        for k, r in wv.items():
            T = f"{int(k[1:]) // 1024}K"
            out.append(f"| {T} | Flex | {_f(r.get('flex_fwd'))} ms | | | {_f(r.get('flex_fb'))} ms | | | |")
            for name, c in r["candidates"].items():
                out.append(f"| {T} | {name} | {_f(c.get('fwd'))} ms | {_ratio(r.get('flex_fwd'), c.get('fwd'))} | "
                           f"{_ratio(c.get('fwd'), r['floor_fwd'])} | {_f(c.get('fb'))} ms | "
                           f"{_ratio(r.get('flex_fb'), c.get('fb'))} | {_ratio(c.get('fb'), r['floor_fb'])} | "
                           f"{_f(c.get('err'), fmt='{:.1e}')} |")
    text = "\n".join(out)
    log("\n## markdown\n" + text)
    RES["markdown"] = text


def main(argv=None):
    """The command (``argv``: its arguments, default ``sys.argv[1:]``); bad ones exit 2 before any work."""
    global DEV, DT, HQ, HKV, D, DRY, JSON_PATH
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--only", default="train,window,prefill,decode")
    ap.add_argument("--json", default=None)
    ap.add_argument("--short", action="store_true", help="a few sizes of training/window/decode only")
    ap.add_argument("--targets", action="store_true", help="only the rows behind the issue's targets (< 4 min)")
    ap.add_argument("--decode-tune", action="store_true", help="decode split/block configs under CUDA graphs")
    ap.add_argument("--window-tune", action="store_true", help="window fwd+bwd backward configs, host vs GPU time")
    ap.add_argument("--window-candidates", default=None,
                    help="--window-tune: comma-separated backward candidates (names in WINDOW_BWD_CANDIDATES; "
                         "default all)")
    ap.add_argument("--window-bwd-only", action="store_true",
                    help="--window-tune: the backward candidates only, not the forward variants at 8K-1M")
    ap.add_argument("--window-fwd-candidates", default=None,
                    help="--window-tune: comma-separated forward candidates (names in WINDOW_FWD_CANDIDATES; "
                         "default all; the default forward always runs first)")
    ap.add_argument("--window-fwd-only", action="store_true",
                    help="--window-tune: the forward variants only, not the backward candidates")
    ap.add_argument("--dry-run", action="store_true", help="CPU (Triton interpreter), tiny sizes, fp32")
    a = ap.parse_args(argv)

    def candidate_names(flag, text, table):
        """The names of a comma-separated candidate list, each in ``table``; None when not given."""
        if text is None:
            return None
        names = [n.strip() for n in text.split(",") if n.strip()]
        known = [c[0] for c in table]
        bad = [n for n in names if n not in known]
        if bad or not names:
            ap.error(f"{flag}: unknown {bad or 'empty list'}; allowed: {', '.join(known)}")
        return names
    names = candidate_names("--window-candidates", a.window_candidates, WINDOW_BWD_CANDIDATES)
    fwd_names = candidate_names("--window-fwd-candidates", a.window_fwd_candidates, WINDOW_FWD_CANDIDATES)
    if a.window_bwd_only and a.window_fwd_only:
        ap.error("--window-bwd-only and --window-fwd-only exclude each other")
    # an unknown section measured nothing (and the run said nothing of it)
    only = candidate_names("--only", a.only, [(n,) for n in ("train", "window", "prefill", "decode")])
    if a.json:
        from orthros.utils import check_output_path

        try:  # was found at the first save, after the measurements (logged, the results lost)
            check_output_path("--json", a.json)
        except ValueError as e:
            ap.error(str(e))
    if not a.dry_run and not torch.cuda.is_available():
        ap.error("needs a CUDA GPU (--dry-run runs every selected path on the CPU through the Triton interpreter)")
    JSON_PATH = a.json
    if a.dry_run:
        DRY, DEV, DT = True, "cpu", torch.float32
        HQ, HKV, D = 4, 1, 32
        torch.set_num_threads(1)
    from orthros.utils import commit_id

    commit = commit_id()
    import triton

    dev_name = "cpu (dry run)" if DRY else torch.cuda.get_device_name()
    META.update(device=dev_name, torch=torch.__version__, triton=triton.__version__, commit=commit or "?",
                date=time.strftime("%Y-%m-%d %H:%M"), args=vars(a))
    log(f"# {dev_name} torch {torch.__version__} triton {triton.__version__} commit {commit or '?'} "
        f"{META['date']}")
    t0 = time.time()
    special = a.targets or a.decode_tune or a.window_tune
    if a.targets:
        guard("targets", targets)
    if a.decode_tune:
        guard("decode tune", decode_tune)
    if a.window_tune:
        if not a.window_fwd_only:
            guard("window tune", lambda: window_tune(names=names))
        if not a.window_bwd_only:
            # dry run: two sizes, the second without gradients (the path 1M takes on the GPU)
            guard("window forward variants",
                  lambda: window_fwd_variants(names=fwd_names,
                                              **({"Ts": (8192, 32768), "grad_max": 8192} if DRY else {})))
    if special:
        guard("markdown", markdown)
    else:
        if a.sweep:
            guard("sweep", sweep)
        if a.short:
            compare_fused([2048, 8192, 32768])
            training([2048, 8192, 16384])
            window_stream([8192, 32768], flex_Ts={8192})
            decode([8192, 32768])
            only = []
        if "train" in only:
            training([2048, 8192, 16384] if a.quick else [2048, 8192, 16384, 32768, 65536])
        if "window" in only:
            window_stream([8192, 32768] if a.quick else [8192, 32768, 131072, 524288, 1048576],
                          flex_Ts={8192, 32768, 131072})
        if "prefill" in only:
            prefill([32768] if a.quick else [32768, 131072, 1048576])
        if "decode" in only:
            decode([8192, 32768, 131072] if a.quick else [8192, 32768, 131072, 1048576])
            decode([32768], B=8)
    log(f"\n(total {time.time() - t0:.0f} s)")
    save()
    if DRY and RES.get("errors"):
        sys.exit(1)


if __name__ == "__main__":
    main()

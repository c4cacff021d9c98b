"""Where the host time of one eager window-stream fwd+bwd goes (issue #18, target 3 at 8K tokens,
where the eager call can be host-bound: 0.42-0.79 ms on the H200 machines' hosts against 0.42 ms
of GPU work under a CUDA graph).

Every piece is timed on the host clock from an idle GPU (synchronised before each call), median
of ``--n`` calls:

* ``fb``: the whole call the roofline times (``orthros_attention`` + ``torch.autograd.grad``);
* ``forward``: ``orthros_attention`` with gradients enabled (its checks, the autograd node, the
  forward launch); ``grad``: ``torch.autograd.grad`` after it (the engine, the backward's
  allocations and launches); ``backward_only``: ``_stream_backward`` called directly;
* ``grad_trivial``: ``torch.autograd.grad`` through ``x * 2`` of the same size (the engine alone);
* ``fb_nop``: the whole call through a Python ``autograd.Function`` that only allocates its
  outputs and gradients (the floor of any Python-level op's fwd+bwd: the engine, its device
  thread, the Function's node, six allocations);
* ``eager`` / ``graph``: do_bench of the eager fwd+bwd (GPU time, or host time where the host is
  the slower) and of its CUDA-graph replay (GPU time alone).

Each piece is timed both ways of one switch, interleaved call by call (the floors once):
``--compare plans`` (the default) without and with the op's launch plans
(``orthros.ops.triton.attention.PLANS``, the launch cache on), ``--compare launch`` through
Triton's JIT and through the launch cache (``orthros.ops.triton.common.launch``, plans off);
``eager`` is five do_bench medians of each, alternating. Then a cProfile and a ``torch.profiler``
table of the call (defaults). bf16, B=1, Hq 32, Hkv 8, D 128, w 128 (the roofline's shape).
``--engine`` adds :func:`engine_probe` (the autograd engine's device thread against the caller's).

    python benchmarks/window_host.py [--T 8192] [--n 200] [--compare plans|launch] [--engine] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import os
import pstats
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(1, HERE)

from attention import bench, graph_time, same_cpu  # noqa: E402  (benchmarks/attention.py: do_bench median,
#                                                     CUDA-graph replay, the pinned threads)
from orthros.ops import orthros_attention  # noqa: E402
from orthros.ops.triton import attention as A  # noqa: E402
from orthros.ops.triton import common  # noqa: E402
from orthros.utils import commit_id, write_json  # noqa: E402


COMPARE = "plans"  # the switch host_ms / eager_ms flip (--compare)
LABELS = {"plans": ("unplanned", "plans"), "launch": ("jit", "cache")}


def switch(on: bool) -> None:
    """``--compare plans``: launch plans off / on (the launch cache on); ``launch``: Triton's JIT /
    the launch cache (plans off). ``switch(True)`` with ``COMPARE`` "plans" is the defaults."""
    if COMPARE == "plans":
        common.FAST_LAUNCH, A.PLANS = True, on
    else:
        common.FAST_LAUNCH, A.PLANS = on, False


def host_ms(fn, n, before=None, paths=(False, True)):
    """Median host time of ``fn()`` over ``n`` calls, each from an idle GPU, for each side of the
    switch in ``paths`` (:func:`switch`), interleaved call by call (this host's speed drifts by tens
    of percent within seconds; interleaving keeps the drift out of the comparison): one median per
    side, in order."""
    ts = {on: [] for on in paths}
    for _ in range(n):
        for on in paths:
            switch(on)
            arg = before() if before else None
            torch.cuda.synchronize()
            t = time.perf_counter()
            fn(arg) if before else fn()
            ts[on].append(time.perf_counter() - t)
    torch.cuda.synchronize()
    switch(True)
    return tuple(statistics.median(ts[f]) * 1e3 for f in paths)


def eager_ms(fn, rounds):
    """do_bench medians of ``fn``, ``rounds`` of each side of the switch alternating: ``(off, on)``
    lists."""
    out = {False: [], True: []}
    for _ in range(rounds):
        for on in (False, True):
            switch(on)
            out[on].append(bench(fn))
    switch(True)
    return out[False], out[True]


def _busy(n=3000):
    """A fixed piece of pure Python (dict and tuple work, as an op's host code does)."""
    d = {}
    for i in range(n):
        d[(i, i & 7)] = (i * 3, str(i & 15))
    return len(d)


def engine_probe(fb, q, k, v, g, n):
    """Why ``torch.autograd.grad`` costs more than the backward's body called directly: the same
    pure-Python work timed on this thread and inside a backward the engine runs (on its device
    thread); our backward's body and each of its launches timed where the engine runs them and
    when called directly (the switch off: with ``--compare plans`` no plans); then fb / grad (the
    defaults) with this thread and the engine's device thread pinned to one CPU, to two, and not.
    Returns a dict of medians (ms)."""
    import threading

    out = {}
    main_id = threading.get_ident()
    inside = []
    xs = torch.ones(1, device=q.device, requires_grad=True)  # the probes' own autograd inputs (tiny)
    gs = torch.ones(1, device=q.device)

    class Busy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, do):
            t = time.perf_counter()
            _busy()
            inside.append(time.perf_counter() - t)
            return do

    direct = []
    for _ in range(n):
        t = time.perf_counter()
        _busy()
        direct.append(time.perf_counter() - t)
        torch.autograd.grad(Busy.apply(xs), (xs,), gs)
    out["busy_main"] = statistics.median(direct) * 1e3
    out["busy_engine"] = statistics.median(inside) * 1e3

    # our backward: body and launches, by thread
    orig_bwd, orig_launch = A._StreamAttention.backward, A.launch
    rec = {"body": [], "launch": {}}

    def timed_launch(kernel, grid, *args, **consts):
        t = time.perf_counter()
        r = orig_launch(kernel, grid, *args, **consts)
        key = (kernel.__name__, threading.get_ident() == main_id)
        rec["launch"].setdefault(key, []).append(time.perf_counter() - t)
        return r

    def timed_bwd(ctx, do):
        t = time.perf_counter()
        r = orig_bwd(ctx, do)
        rec["body"].append(time.perf_counter() - t)
        return r

    A.launch, A._StreamAttention.backward = timed_launch, staticmethod(timed_bwd)
    switch(False)  # the launches of this section through ``launch`` (a plan's replay bypasses it)
    try:
        for _ in range(n):
            torch.cuda.synchronize()
            fb()
        torch.cuda.synchronize()
        masks = A._Masks(None, None, k.shape[1], q.device)
        with torch.no_grad():
            o, lse = A._stream_forward(q, k, v, None, 0, 128, q.shape[-1] ** -0.5, masks)
        body_direct = []
        for _ in range(n):
            torch.cuda.synchronize()
            t = time.perf_counter()
            A._stream_backward(g, q, k, v, o, lse, None, 0, 128, q.shape[-1] ** -0.5, masks)
            body_direct.append(time.perf_counter() - t)
        torch.cuda.synchronize()
    finally:
        A.launch, A._StreamAttention.backward = orig_launch, staticmethod(orig_bwd)
        switch(True)
    out["body_engine"] = statistics.median(rec["body"]) * 1e3
    out["body_main"] = statistics.median(body_direct) * 1e3
    for (name, on_main), ts in sorted(rec["launch"].items()):
        out[f"launch_{name}_{'main' if on_main else 'engine'}"] = statistics.median(ts) * 1e3

    # pinned: this thread and the engine's device thread on one CPU, then on two fixed ones
    for label, apart in (("same_cpu", False), ("two_cpus", True), ("unpinned", None)):
        with (contextlib.nullcontext() if apart is None else same_cpu(apart)) as where:
            if apart is not None and where is None:
                continue
            for _ in range(5):
                fb()
            out[f"fb_{label}"] = host_ms(fb, n, paths=(True,))[0]
            out[f"eager_{label}"] = bench(fb)
            inside.clear()
            for _ in range(n // 4):
                torch.autograd.grad(Busy.apply(xs), (xs,), gs)
            out[f"busy_engine_{label}"] = statistics.median(inside) * 1e3
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--T", type=int, default=8192, help="tokens (default 8192)")
    ap.add_argument("--n", type=int, default=200, help="calls per host timing (default 200)")
    ap.add_argument("--json", default=None, help="write the figures here")
    ap.add_argument("--compare", choices=sorted(LABELS), default="plans",
                    help="the switch each piece is timed both ways of (default plans: launch plans off / on)")
    ap.add_argument("--engine", action="store_true",
                    help="also probe the autograd engine's share (engine_probe: the same Python on both threads, "
                         "the backward's pieces by thread, both threads pinned to one CPU)")
    a = ap.parse_args(argv)
    for name, value in (("--T", a.T), ("--n", a.n)):
        if value < 1:
            ap.error(f"{name} must be >= 1, got {value}")
    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU (the host path it times is the GPU launch path)")
    global COMPARE
    COMPARE = a.compare
    import triton

    torch.manual_seed(0)
    HQ, HKV, D, W = 32, 8, 128, 128
    dev, dt = "cuda", torch.bfloat16
    q = torch.randn(1, a.T, HQ, D, device=dev, dtype=dt, requires_grad=True)
    k = torch.randn(1, a.T, HKV, D, device=dev, dtype=dt, requires_grad=True)
    v = torch.randn(1, a.T, HKV, D, device=dev, dtype=dt, requires_grad=True)
    qo = q[:, :0].detach()
    g = torch.randn(1, a.T, HQ, D, device=dev, dtype=dt)
    x = torch.randn(1, a.T, HQ, D, device=dev, dtype=dt, requires_grad=True)

    def fwd():
        return orthros_attention(q, k, v, qo, window_size=W, backend="triton")[0]

    def fb():
        return torch.autograd.grad(fwd(), (q, k, v), g)

    masks = A._Masks(None, None, a.T, q.device)
    scale = D ** -0.5
    with torch.no_grad():
        o, lse = A._stream_forward(q, k, v, None, 0, W, scale, masks)

    class Nop(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            ctx.save_for_backward(q, k, v)
            return torch.empty_like(q)

        @staticmethod
        def backward(ctx, do):
            q, k, v = ctx.saved_tensors
            return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

    res = {"T": a.T, "n": a.n, "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
           "triton": triton.__version__, "commit": commit_id(),
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "ms": {}}
    for _ in range(5):
        fb()
    pieces = {
        "fb": host_ms(fb, a.n),
        "forward": host_ms(fwd, a.n),
        "grad": host_ms(lambda out: torch.autograd.grad(out, (q, k, v), g), a.n, before=fwd),
        "backward_only": host_ms(lambda: A._stream_backward(g, q, k, v, o, lse, None, 0, W, scale, masks), a.n),
    }
    floor = {  # no Triton launch in these: timed once
        "grad_trivial": host_ms(lambda y: torch.autograd.grad(y, (x,), g), a.n, before=lambda: x * 2, paths=(True,))[0],
        "fb_nop": host_ms(lambda: torch.autograd.grad(Nop.apply(q, k, v), (q, k, v), g), a.n, paths=(True,))[0],
    }
    eager = eager_ms(fb, 5)
    off, on = LABELS[COMPARE]
    res["compare"] = COMPARE
    res["ms"] = {off: {k: v[0] for k, v in pieces.items()}, on: {k: v[1] for k, v in pieces.items()},
                 "floor": floor, f"eager_{off}": eager[0], f"eager_{on}": eager[1], "graph": graph_time(fb)}
    for label in (off, on):
        print(f"{label:10s}" + "  ".join(f"{k} {v:.3f}" for k, v in res["ms"][label].items()) + "  (ms, host)")
    print("floor " + "  ".join(f"{k} {v:.3f}" for k, v in floor.items()) + "  (ms, host)")
    for label in (f"eager_{off}", f"eager_{on}"):
        print(f"{label}: " + " ".join(f"{v:.3f}" for v in res["ms"][label]) + " ms (do_bench, rounds alternating)")
    print(f"graph {res['ms']['graph']:.3f} ms", flush=True)
    if a.engine:
        res["engine"] = engine_probe(fb, q, k, v, g, a.n)
        print("engine probe (ms, host): " + "  ".join(f"{k} {v:.3f}" for k, v in res["engine"].items()), flush=True)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(50):
        fb()
        torch.cuda.synchronize()
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(18)
    res["profile"] = buf.getvalue()
    print(res["profile"], flush=True)
    # PyTorch's own view of the same calls (its ops, the autograd engine's nodes, the launches' driver calls)
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as tp:
        for _ in range(20):
            fb()
        torch.cuda.synchronize()
    res["torch_profile"] = tp.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)
    print(res["torch_profile"], flush=True)
    if a.json:
        write_json(a.json, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())

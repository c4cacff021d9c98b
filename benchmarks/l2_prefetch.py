"""Does a band of a weight asked of L2 ahead of time make the GEMV that streams it faster? (GPU)

Issue #18, inference change 23 (docs/performance.md): the decode kernel asks L2 for a band of
W_O (the first lines of each of the GEMV's K slices of every row) while the attention leaves
HBM idle. This isolates the mechanism from the engine. Each repetition: L2 flushed (a 256 MB
buffer written), then a prefetch kernel of 128 programs issues the band (or nothing), then an
idle gap on the GPU (``torch.cuda._sleep``; long enough for the band to land), then W_O's GEMV
(the engine's: ``orthros.ops.gemv``, M rows) timed alone with CUDA events. Modes: ``none``,
``last`` / ``normal`` (``prefetch.global.L2`` a 128-byte line, evict-last / normal),
``bulk`` (``cp.async.bulk.prefetch.L2`` a row and K slice), ``load`` (the band read by ordinary
loads, summed: what a demand-fetched band buys, the upper bound). Prints the GEMV's median
time per (mode, band MB) and its ratio to ``none``; ``--json`` writes them.

    python benchmarks/l2_prefetch.py [--mb 8,12,20,32] [--m 2] [--reps 30] [--sleep-us 300] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from orthros.ops.gemv import gemv  # noqa: E402
from orthros.ops.gemv.kernel import l2_band  # noqa: E402
from orthros.ops.triton.common import pow2, prefetch_l2, prefetch_l2_bulk, prefetch_l2_normal  # noqa: E402
from orthros.utils import commit_id  # noqa: E402

MODES = ("none", "last", "normal", "bulk", "load")


@triton.jit
def _band(W, OUT, N, K, stride, kslice, R: tl.constexpr, C: tl.constexpr, NC: tl.constexpr, LINES: tl.constexpr,
          STEP: tl.constexpr, MODE: tl.constexpr):
    p = tl.program_id(0)
    rows = tl.minimum(p.to(tl.int64) * R + tl.arange(0, R), N - 1)
    j = tl.minimum(tl.arange(0, C), NC - 1)
    if MODE == 3:  # bulk: C indexes the K slices
        ptrs = W + rows[:, None] * stride + (j.to(tl.int64) * kslice)[None, :]
        prefetch_l2_bulk(ptrs, tl.full([R, C], LINES * 128, tl.int32))
    else:
        cols = tl.minimum((j // LINES).to(tl.int64) * kslice + (j % LINES) * STEP, K - 1)
        ptrs = W + rows[:, None] * stride + cols[None, :]
        if MODE == 1:
            prefetch_l2(ptrs)
        elif MODE == 2:
            prefetch_l2_normal(ptrs)
        elif MODE == 4:  # a 16-byte vector at each line's start would fetch only a sector: read whole lines
            acc = tl.zeros([R, C], tl.float32)
            for e in tl.static_range(0, STEP, 8):
                acc += tl.load(ptrs + e).to(tl.float32)
            tl.store(OUT + p, tl.sum(tl.sum(acc, 1), 0))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", default="8,12,20,32", help="band budgets (MB), comma-separated")
    ap.add_argument("--m", type=int, default=2, help="the GEMV's rows (2: the pair at B = 1)")
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--sleep-us", type=float, default=300.0,
                    help="idle gap between the band and the GEMV: longer than the host takes to launch the GEMV, "
                         "so the GEMV starts right after its start event (20 us measured the host)")
    ap.add_argument("--programs", type=int, default=128)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    try:
        budgets = [float(x) for x in a.mb.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--mb must be comma-separated numbers, got {a.mb!r}")
    if not budgets or any(b <= 0 for b in budgets):
        ap.error(f"--mb must list positive numbers, got {a.mb!r}")
    for name in ("m", "n", "k", "reps", "programs"):
        if getattr(a, name) < 1:
            ap.error(f"--{name} must be >= 1, got {getattr(a, name)}")
    if not torch.cuda.is_available():
        sys.exit("l2_prefetch.py needs a CUDA GPU")
    dev = torch.device("cuda")
    w = torch.randn(a.n, a.k, device=dev, dtype=torch.bfloat16)
    x = torch.randn(a.m, a.k, device=dev, dtype=torch.bfloat16)
    flush = torch.empty(256 * 2 ** 20, dtype=torch.uint8, device=dev)
    out = torch.empty(a.programs, device=dev, dtype=torch.float32)
    khz = getattr(torch.cuda.get_device_properties(dev), "clock_rate", 0) or 1_980_000  # SM clock, kHz
    cycles = int(a.sleep_us * khz / 1e3)
    gemv(x, w)  # compile
    rows = []
    for mb in budgets:
        band = l2_band(a.m, w, int(mb * 2 ** 20))
        if not band:
            print(f"{mb} MB: not one line a row fits; skipped")
            continue
        got_mb = a.n * band["slices"] * band["lines"] * 128 / 2 ** 20
        R = pow2(triton.cdiv(a.n, a.programs))
        for mode in MODES:
            times = []
            for i in range(a.reps + 3):
                flush.fill_(i & 255)
                if mode != "none":
                    bulk = mode == "bulk"
                    nc = band["slices"] if bulk else band["slices"] * band["lines"]
                    _band[(a.programs,)](w, out, a.n, a.k, w.stride(0), band["k_slice"], R=R, C=pow2(nc), NC=nc,
                                         LINES=band["lines"], STEP=band["step"], MODE=MODES.index(mode))
                torch.cuda._sleep(cycles)
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                gemv(x, w)
                e1.record()
                torch.cuda.synchronize()
                if i >= 3:
                    times.append(e0.elapsed_time(e1) * 1e3)
            rows.append({"mode": mode, "budget_mb": mb, "band_mb": got_mb, "lines": band["lines"],
                         "slices": band["slices"], "gemv_us": statistics.median(times), "min_us": min(times)})
        base = next(r["gemv_us"] for r in rows if r["mode"] == "none" and r["budget_mb"] == mb)
        for r in rows:
            if r["budget_mb"] == mb:
                r["vs_none"] = r["gemv_us"] / base
                print(f"band {got_mb:5.1f} MB ({band['lines']} lines x {band['slices']} slices)  {r['mode']:6s}  "
                      f"GEMV {r['gemv_us']:6.2f} us (min {r['min_us']:6.2f})  {r['vs_none']:.3f}x none", flush=True)
    floor = a.n * a.k * 2 / 4.2e12 * 1e6
    print(f"W [{a.n}, {a.k}] bf16 at M = {a.m}: {a.n * a.k * 2 / 2 ** 20:.1f} MB, {floor:.2f} us at 4.2 TB/s")
    if a.json:
        meta = {"device": torch.cuda.get_device_name(dev), "commit": commit_id(), "torch": torch.__version__,
                "triton": triton.__version__, "argv": sys.argv[1:]}
        tmp = a.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
        os.replace(tmp, a.json)


if __name__ == "__main__":
    main()

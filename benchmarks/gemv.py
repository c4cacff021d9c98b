"""Weight-streaming GEMV (``orthros.ops.gemv``, issue #18) against cuBLAS (``F.linear``) at the
decode shapes of Qwen3-8B with fused projections, M = 1 and 2 rows (a token, an Orthros pair).

One process, every baseline in the same run: the copy bandwidth (a 1 GiB device-to-device
copy, bytes read + written, :func:`orthros.benchmarks.inference.copy_bandwidth`), then per
shape and M the time of one call of cuBLAS and of the Triton kernel (its :data:`CONFIGS` entry;
with ``--sweep`` also every candidate config, best one reported), the weight bytes streamed per
second, the ratio to cuBLAS and to the copy bandwidth, and the error of each against a float32
reference. Timing: a CUDA graph of many calls, cycling through enough copies of the weight
(>= 512 MB) that no call finds its weight in the 60 MB L2, as in a decode step where every
layer's weights are new; median of the replays (CUDA events) / calls per replay.

    python benchmarks/gemv.py --out docs/results/gemv-DATE/results.json [--sweep] [--deadline-s 500]
    python benchmarks/gemv.py --device cpu --quick --out /tmp/gemv.json     # smoke run (interpreter)

``--fused``: instead, the four fused sites of a decoder layer (``orthros.ops.gemv``'s prologues
and residual epilogue), each timed as the fused GEMV (one kernel, two with split-K) against the
unfused ops the layers run today, eager (``gemv(backend="torch")``: the RMSNorm / SiLU ops,
cuBLAS, the add) and ``torch.compile``d (Inductor fuses the elementwise ops into one kernel
around cuBLAS: what the engine's compiled step runs), and against the plain GEMV and cuBLAS alone
(the weight-streaming floor of each site), all in the same run under CUDA graphs; with all four
sites, also the four chained as in a layer (``layer_chain``: Inductor then fuses each residual
add with the next RMSNorm, which the per-site sums count twice), compiled unfused vs fused:

    python benchmarks/gemv.py --fused --out docs/results/gemv-fused-DATE/results.json
    python benchmarks/gemv.py --fused --dry-run --out /tmp/gemv-fused.json  # = --device cpu --quick

With ``--fused --sweep`` the winners also become ``orthros.ops.gemv.kernel.CONFIGS`` rows
(``kernel.class_rows``: one shape class per site), printed and stored as ``meta["tuned_rows"]``;
``benchmarks/roofline.py --gemv-configs results.json`` runs the engine with them later in the
same call, before they are written into ``CONFIGS``.

Writes the JSON (meta: date, GPU, commit, torch / triton versions, copy bandwidth; rows) after
every row, atomically (temporary name, then rename). Bad arguments exit 2 before any work.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from orthros.utils import DTYPE_CHOICES, Progress, check_output_path, parse_dtype  # noqa: E402  (imports no torch: arguments first)

# (N, K) of each weight: Qwen3-8B (hidden 4096, 32 / 8 heads of 128, intermediate 12288, vocab 151936)
SHAPES = {
    "qkv": (6144, 4096),        # q 4096 + k 1024 + v 1024, one fused GEMM
    "o": (4096, 4096),
    "gate_up": (24576, 4096),   # gate 12288 + up 12288, one fused GEMM
    "down": (4096, 12288),
    "lm_head": (151936, 4096),
}
# --quick: the same names at interpreter sizes (odd, not multiples of the blocks)
MAX_REL_ERR = 2e-2  # vs the fp32 reference: bf16 output rounding is ~2e-3; above this a result is wrong
SWEEP_ORDER = ("gate_up", "down", "qkv", "o", "lm_head")  # by share of a decode step (36 layers + the head)
QUICK_SHAPES = {"qkv": (96, 200), "o": (64, 64), "gate_up": (130, 64), "down": (48, 300), "lm_head": (257, 64)}
# --fused: a decoder layer's four fused sites: (weight, prologue, residual)
SITES = {
    "norm_qkv": ("qkv", "norm", False),          # input RMSNorm + QKV
    "o_res": ("o", None, True),                  # o_proj + residual add
    "norm_gate_up": ("gate_up", "norm", False),  # post-attention RMSNorm (of the new residual) + gate/up
    "silu_down_res": ("down", "silu", True),     # SiLU(gate) * up + down + residual add
}
FUSED_SYSTEMS = ("cublas", "triton-plain", "unfused-eager", "unfused-compiled", "fused")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu (only with --quick: the Triton interpreter)")
    p.add_argument("--quick", action="store_true", help="tiny shapes, few repetitions (a smoke run)")
    p.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated subset of {','.join(SHAPES)}")
    p.add_argument("--m", default="1,2", help="comma-separated row counts, each in 1..8 (default 1,2)")
    p.add_argument("--dtype", default="bf16", help=f"one of {', '.join(DTYPE_CHOICES)} (default bf16)")
    p.add_argument("--sweep", action="store_true", help="also time every candidate config and report the best "
                   "(with --fused: the fused call over a short list, fused_sweep_configs)")
    p.add_argument("--fused", action="store_true",
                   help="time the four fused sites of a layer (prologue + GEMV + residual) against the unfused ops")
    p.add_argument("--sites", default=",".join(SITES), help=f"with --fused: comma-separated subset of {','.join(SITES)}")
    p.add_argument("--dry-run", action="store_true", help="= --device cpu --quick (the Triton interpreter, tiny shapes)")
    p.add_argument("--reps", type=int, default=30, help="timed graph replays per measurement (default 30)")
    p.add_argument("--deadline-s", type=float, default=None, help="stop starting new rows after this many seconds")
    p.add_argument("--out", default="gemv-results.json", help="JSON path (default gemv-results.json)")
    a = p.parse_args(argv)
    if a.dry_run:
        a.device, a.quick = "cpu", True
    if not re.fullmatch(r"cpu|cuda(:\d+)?", a.device):  # 'cuda:x' was torch's RuntimeError in the run
        p.error(f"--device must be cuda, cuda:N or cpu, got {a.device!r}")
    if a.device == "cpu" and not a.quick:
        p.error("--device cpu needs --quick (the interpreter runs the real shapes for hours)")
    names = [s.strip() for s in a.shapes.split(",") if s.strip()]
    bad = [s for s in names if s not in SHAPES]
    if not names or bad:
        p.error(f"--shapes must be a comma-separated subset of {','.join(SHAPES)}, got {a.shapes!r}")
    a.shapes = list(dict.fromkeys(names))  # each measured once
    sites = [s.strip() for s in a.sites.split(",") if s.strip()]
    bad = [s for s in sites if s not in SITES]
    if not sites or bad:
        p.error(f"--sites must be a comma-separated subset of {','.join(SITES)}, got {a.sites!r}")
    a.sites = list(dict.fromkeys(sites))
    try:
        a.m = list(dict.fromkeys(int(v) for v in a.m.split(",") if v.strip()))  # '1,1' measured M=1 twice
    except ValueError:
        p.error(f"--m must be comma-separated integers in 1..8, got {a.m!r}")
    if not a.m or any(not 1 <= m <= 8 for m in a.m):
        p.error(f"--m must be comma-separated integers in 1..8, got {a.m}")
    try:
        parse_dtype(a.dtype, "--dtype")
    except ValueError as e:
        p.error(str(e))
    if a.reps < 1:
        p.error(f"--reps must be >= 1, got {a.reps}")
    if a.deadline_s is not None and not a.deadline_s > 0:
        p.error(f"--deadline-s must be > 0, got {a.deadline_s}")
    if os.path.isdir(a.out) or not a.out.endswith(".json"):
        p.error(f"--out must be a .json file path (not a directory), got {a.out!r}")
    try:  # below a file, or not writable: was raised at the first row's save
        check_output_path("--out", a.out)
    except ValueError as e:
        p.error(str(e))
    if a.quick:
        a.reps = min(a.reps, 2)
    return a


def sweep_configs(quick: bool):
    """Candidate launch configs for ``--sweep`` (100): tiles of 4-32 K elements, the three inner
    forms, split-K 1-8 (per shape only the splits that leave >= 2 tiles per slice), pipeline
    depths 1 / 3 / 4 for the CUDA-core form, 3 for the tensor-core form and 4-6 at the M = 2
    table's tiles (:func:`dot_depth_configs`); the deferred-reduction form at tiles whose
    accumulator stays at <= 64 registers a thread for M <= 2 (:func:`defer_configs`)."""
    from orthros.ops.gemv.kernel import GemvConfig

    if quick:
        return [GemvConfig(block_n=16, block_k=64), GemvConfig(block_n=16, block_k=16, split=2, dot=True),
                GemvConfig(block_n=16, block_k=64, defer=True)]
    out = []
    for dot in (False, True):
        for bn, bk in ((8, 512), (16, 256), (16, 512), (16, 1024), (32, 256), (32, 512), (64, 128), (64, 256)):
            if dot and bn < 16:
                continue
            warps = 8 if bn * bk >= 16384 else 4
            for split in (1, 2, 4, 8):
                out.append(GemvConfig(block_n=bn, block_k=bk, split=split, dot=dot, num_warps=warps, num_stages=3))
            if not dot:  # pipeline depth: 1 (plain loads, one tile in flight) and 4, without split-K
                out += [GemvConfig(block_n=bn, block_k=bk, dot=False, num_warps=warps, num_stages=st) for st in (1, 4)]
    return out + dot_depth_configs() + defer_configs() + peer_tile_configs()


def dot_depth_configs():
    """The tensor-core form's tiles of Qwen3-8B's M = 2 table (64 x 128 with split-K 1 / 4: gate/up,
    W_O; 64 x 256: QKV) at pipeline depths 4-6 (every other tensor-core config is timed at 3):
    more weight tiles in flight a program, for the GEMVs of few programs (QKV: 96 programs,
    ~3 TB/s in the engine; whether depth is what holds it back is docs/performance.md's
    inference change 29). Shared memory at sm_90 (Triton's report, bf16, M = 2): 64 x 256 41 KB a
    stage (depth 5 at most of 227 KB), 64 x 128 20 KB; a config that does not fit is skipped by
    the sweep."""
    from orthros.ops.gemv.kernel import GemvConfig

    return [GemvConfig(block_n=bn, block_k=bk, split=sp, dot=True, num_warps=4, num_stages=st)
            for bn, bk, sp, depths in ((64, 256, 1, (4, 5)), (64, 128, 1, (4, 5, 6)), (64, 128, 4, (4, 5, 6)))
            for st in depths]


def defer_configs():
    """The deferred-reduction CUDA-core form (``defer=True``): [M, block_n, block_k] float32
    products in registers (M = 2: 4-16 K elements over 128-256 threads, <= 64 registers a
    thread; 96 in all at 16 x 256, no spills, in the sm_90 ptxas report), depths 3 / 4, split-K
    2 for the narrow weights."""
    from orthros.ops.gemv.kernel import GemvConfig

    return [GemvConfig(block_n=bn, block_k=bk, split=sp, num_warps=w, num_stages=st, defer=True)
            for bn, bk, sp, w, st in ((16, 256, 1, 4, 4), (16, 256, 1, 4, 3), (16, 256, 2, 4, 4), (8, 512, 1, 4, 4),
                                      (16, 128, 1, 4, 4), (32, 128, 1, 4, 4), (32, 256, 1, 8, 3), (32, 256, 2, 8, 3),
                                      (64, 128, 1, 8, 3), (16, 512, 1, 8, 3))]


def peer_tile_configs():
    """The tile family of gpt-fast's GEMVs (Inductor's reduction kernels, tuned by coordinate
    descent): few output rows a program, a long K tile, products summed over K once after the
    loop, so thousands of programs that the hardware scheduler deals out as slots free up. On an
    H100 the peer's gate/up ran 4.9% faster than the table's tensor-core tile (docs/performance.md,
    inference change 40). Our deferred form at 1-8 rows and 1-4K columns, <= 64 accumulator
    registers a thread at M = 2."""
    from orthros.ops.gemv.kernel import GemvConfig

    return [GemvConfig(block_n=bn, block_k=bk, num_warps=w, num_stages=st, defer=True)
            for bn, bk, w, st in ((1, 4096, 8, 2), (2, 2048, 4, 3), (2, 2048, 8, 3), (4, 1024, 4, 3),
                                  (4, 2048, 8, 3), (8, 1024, 8, 3))]


def fused_sweep_configs(quick: bool):
    """``--fused --sweep``: the fused call over the plain GEMV's measured winners and their
    neighbours (the prologue adds per-tile work, which may move the best tile / depth / split):
    the tensor-core form's, every deferred-reduction config, and the M = 1 winners of the
    per-tile CUDA-core form (which lost at M = 2 in the plain sweep of 2026-12-01), and the peer's
    tile family (:func:`peer_tile_configs`)."""
    from orthros.ops.gemv.kernel import GemvConfig

    if quick:
        return [GemvConfig(block_n=16, block_k=64), GemvConfig(block_n=16, block_k=16, split=2, dot=True)]
    fma = [GemvConfig(block_n=bn, block_k=256, num_warps=4, num_stages=st) for bn, st in ((16, 4), (32, 1))]
    dot = [GemvConfig(block_n=bn, block_k=bk, split=sp, dot=True, num_warps=4, num_stages=3)
           for bn, bk, sp in ((64, 128, 1), (64, 128, 2), (64, 128, 4), (32, 256, 2), (32, 256, 4), (64, 256, 1))]
    return dot + dot_depth_configs() + defer_configs() + peer_tile_configs() + fma


def label(c):
    """A row's config (a dict of :class:`GemvConfig` fields) as the tables print it."""
    from orthros.ops.gemv.kernel import GemvConfig

    return GemvConfig(**c).label


def config_dict(cfg):
    return {k: getattr(cfg, k) for k in ("block_n", "block_k", "split", "dot", "defer", "num_warps", "num_stages")}


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.device.startswith("cpu"):  # the kernel runs in the Triton interpreter (set before triton loads)
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch
    import torch.nn.functional as F

    from orthros.benchmarks.inference import (capture_graph, copy_bandwidth, print_table, replay_seconds,
                                              save, script_meta)
    from orthros.ops.gemv import gemv_ref
    from orthros.ops.gemv.kernel import gemv_triton, pick_config

    t0 = time.time()
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    if cuda and not torch.cuda.is_available():
        print("error: --device cuda but no CUDA device is available (use --device cpu --quick)", file=sys.stderr)
        return 2
    if cuda and dev.index is not None:
        torch.cuda.set_device(dev)  # events, streams and graphs below use the current device
    dtype = parse_dtype(a.dtype, "--dtype")
    shapes = {n: (QUICK_SHAPES if a.quick else SHAPES)[n] for n in a.shapes}
    elem = torch.empty(0, dtype=dtype).element_size()
    bw = copy_bandwidth(dev, 2**30 if cuda else 2**22)
    meta = {**script_meta(dev, sys.argv[1:] if argv is None else argv), "dtype": a.dtype, "copy_bandwidth_Bps": bw,
            "quick": a.quick, "sweep": a.sweep, "fused": a.fused}
    rows = []

    def write():
        meta["elapsed_s"] = round(time.time() - t0, 1)
        save(a.out, meta, rows)

    def timed(fn, weights, x):
        """Seconds per call of ``fn(x, w)``, cycling through ``weights`` (CUDA: graph replays)."""
        for w in weights:  # warm-up: compiles the kernel for this shape / config
            fn(x, w)
        if not cuda:
            ts = []
            for _ in range(a.reps):
                t = time.perf_counter()
                for w in weights:
                    fn(x, w)
                ts.append((time.perf_counter() - t) / len(weights))
            return statistics.median(ts)
        w0 = weights[0]  # a weight, or (layer chain) a tuple of one layer's tensors
        nbytes = sum(t.numel() for t in w0) * elem if isinstance(w0, tuple) else w0.numel() * elem
        rounds = max(1, math.ceil(2e9 / (nbytes * len(weights))))  # >= ~2 GB streamed per replay
        torch.cuda.synchronize(dev)
        g = capture_graph(lambda: [fn(x, w) for _ in range(rounds) for w in weights], dev, warmup=1)
        t = replay_seconds(g, a.reps) / (rounds * len(weights))
        del g
        return t

    def rel_err(y, ref):
        return ((y.float() - ref).norm() / ref.norm().clamp_min(1e-30)).item()

    def deadline_passed():
        return a.deadline_s is not None and time.time() - t0 > a.deadline_s

    def sweep(configs, call, x, weights, ref, K, what):
        """Times ``call(x, w, config)`` per config (those leaving >= 2 tiles per split-K slice);
        a config that fails or gives a wrong result is recorded and skipped, never the best.
        Returns ``(best (seconds, config, rel_err) or None, tried, cut by the deadline)``."""
        best, tried = None, []
        for c in configs:
            if c.split > 1 and K // (c.split * c.block_k) < 2:
                continue
            if deadline_passed():
                return best, tried, True
            try:
                err = rel_err(call(x, weights[0], c), ref)
                if not err <= MAX_REL_ERR:  # a wrong result is never the best (NaN included)
                    raise RuntimeError(f"wrong result: rel_err {err:.3g} > {MAX_REL_ERR}")
                t = timed(lambda x_, w_, c=c: call(x_, w_, c), weights, x)
            except Exception as e:  # noqa: BLE001  (a config that does not compile: skip it, say so)
                print(f"  {what} {c}: failed ({type(e).__name__}: {str(e)[:120]})", file=sys.stderr)
                tried.append({**config_dict(c), "error": f"{type(e).__name__}: {str(e)[:200]}"})
                continue
            tried.append({**config_dict(c), "us": t * 1e6, "rel_err": err})
            if best is None or t < best[0]:
                best = (t, c, err)
        return best, tried, False

    def store_tuned_rows():
        """``--fused --sweep``: the swept winners as CONFIGS rows in ``meta["tuned_rows"]``
        (``roofline.py --gemv-configs`` installs them)."""
        if not a.sweep:
            return
        from orthros.ops.gemv.kernel import GemvConfig, class_rows, rows_to_json

        tuned = []
        for M in a.m:
            best = {(r_["N"], r_["K"]): GemvConfig(**r_["config"]) for r_ in rows
                    if r_["M"] == M and r_["system"] == "fused-best"}
            if best:
                tuned += class_rows(M, best)
        meta["tuned_rows"] = rows_to_json(tuned)

    def fused_sites():
        """``--fused``: per site and M, one row per system of :data:`FUSED_SYSTEMS`; returns why
        it stopped early (or None)."""
        from orthros.ops.gemv import gemv, prologue_ref

        compile_backend = "inductor" if cuda else "aot_eager"  # CPU smoke run: no code generation
        meta["compile_backend"] = compile_backend
        table = QUICK_SHAPES if a.quick else SHAPES
        bar = Progress(len(a.sites) * len(a.m), "gemv fused", unit="point")
        try:
            for site in a.sites:
                wname, pro, res = SITES[site]
                N, K = table[wname]
                gen = torch.Generator(device=dev).manual_seed(100 + list(SITES).index(site))
                nbytes = N * K * elem
                copies = 2 if not cuda else max(2, math.ceil(512e6 / nbytes))
                weights = [(torch.randn(N, K, generator=gen, device=dev) * K ** -0.5).to(dtype) for _ in range(copies)]
                nw = (1 + 0.1 * torch.randn(K, generator=gen, device=dev)).to(dtype) if pro == "norm" else None
                for M in a.m:
                    if deadline_passed():
                        return f"deadline {a.deadline_s} s reached before {site} M={M}"
                    x = (torch.randn(M, 2 * K if pro == "silu" else K, generator=gen, device=dev) * 2).to(dtype)
                    r = torch.randn(M, N, generator=gen, device=dev).to(dtype) if res else None
                    kw = dict(norm_weight=nw, norm_eps=1e-6 if nw is not None else None,
                              act="silu" if pro == "silu" else None, residual=r)
                    x_plain = prologue_ref(x, nw, kw["norm_eps"], kw["act"])  # the plain GEMV's input
                    ref = gemv_ref(x, weights[0], **kw).float()  # the specification, x.dtype result
                    ref_plain = gemv_ref(x_plain, weights[0]).float()
                    cfg = pick_config(M, N, K)

                    def unfused(x_, w_, kw=kw):
                        return gemv(x_, w_, backend="torch", **kw)

                    torch._dynamo.reset()
                    compiled = torch.compile(unfused, backend=compile_backend, dynamic=False, fullgraph=True)
                    systems = {
                        "cublas": (lambda x_, w_: F.linear(x_, w_), x_plain, ref_plain),
                        "triton-plain": (lambda x_, w_, cfg=cfg: gemv_triton(x_, w_, config=cfg), x_plain, ref_plain),
                        "unfused-eager": (unfused, x, ref),
                        "unfused-compiled": (compiled, x, ref),
                        "fused": (lambda x_, w_, kw=kw: gemv(x_, w_, backend="triton", **kw), x, ref),
                    }
                    got = {}
                    for system, (fn, xin, want) in systems.items():
                        t = timed(fn, weights, xin)
                        err = rel_err(fn(xin, weights[0]), want)
                        got[system] = t
                        row_ = {"site": site, "weight": wname, "N": N, "K": K, "M": M, "system": system,
                                "prologue": pro or "", "residual": res, "us": t * 1e6,
                                "floor_us": nbytes / bw * 1e6, "weight_bytes": nbytes,
                                "weight_GBps": nbytes / t / 1e9, "of_copy_bw": nbytes / t / bw, "rel_err": err}
                        if system in ("triton-plain", "fused"):
                            row_["config"] = config_dict(cfg)
                        if not err <= MAX_REL_ERR:
                            print(f"WARNING: {system} {site} M={M}: rel_err {err:.3g} > {MAX_REL_ERR} (wrong result)",
                                  file=sys.stderr)
                            meta.setdefault("wrong_results", []).append(f"{system} {site} M={M}")
                        rows.append(row_)
                    if a.sweep:
                        best, tried, cut = sweep(
                            fused_sweep_configs(a.quick), lambda x_, w_, c, kw=kw: gemv_triton(x_, w_, config=c, **kw),
                            x, weights, ref, K, f"{site} M={M}")
                        if cut:
                            meta.setdefault("sweeps_cut", []).append(f"{site} M={M}")
                        if best is not None:
                            rows.append({**rows[-1], "system": "fused-best", "us": best[0] * 1e6,
                                         "weight_GBps": nbytes / best[0] / 1e9, "of_copy_bw": nbytes / best[0] / bw,
                                         "rel_err": best[2], "config": config_dict(best[1]), "sweep": tried})
                            got["fused-best"] = best[0]
                    for r_ in rows[-len(got):]:
                        r_["speedup_vs_unfused_compiled"] = got["unfused-compiled"] / (r_["us"] / 1e6)
                    write()
                    bar.update(1)
                del weights
                if cuda:
                    torch.cuda.empty_cache()
            if len(a.sites) == len(SITES):
                return layer_chain()
        finally:  # every way out (a deadline, a failing layer chain) keeps the sweep's winners
            store_tuned_rows()
            write()
            bar.close()
            torch._dynamo.reset()
        return None

    def layer_chain():
        """The four sites chained as in a layer (the attention stood in for by the first H
        columns of QKV's output), so the unfused baseline is what Inductor makes of the whole
        chain: it fuses each residual add with the RMSNorm after it, which the per-site sums
        count as two kernels. Rows ``chain-unfused-compiled`` / ``chain-fused`` per M."""
        from orthros.ops.gemv import gemv

        H, Q, I = (64, 96, 40) if a.quick else (4096, 6144, 12288)
        gen = torch.Generator(device=dev).manual_seed(200)
        r = lambda *sh, s=1.0: (torch.randn(*sh, generator=gen, device=dev) * s).to(dtype)  # noqa: E731
        layer_bytes = (Q * H + H * H + 2 * I * H + H * I) * elem
        copies = 2 if not cuda else max(2, math.ceil(512e6 / layer_bytes))
        layers = [(1 + 0.1 * r(H), r(Q, H, s=H ** -0.5), r(H, H, s=H ** -0.5), 1 + 0.1 * r(H),
                   r(2 * I, H, s=H ** -0.5), r(H, I, s=I ** -0.5)) for _ in range(copies)]

        def chain(h, ws, backend):
            nw1, wqkv, wo, nw2, wgu, wd = ws
            qkv = gemv(h, wqkv, backend=backend, norm_weight=nw1, norm_eps=1e-6)
            h = gemv(qkv[..., :H], wo, backend=backend, residual=h)
            gu = gemv(h, wgu, backend=backend, norm_weight=nw2, norm_eps=1e-6)
            return gemv(gu, wd, backend=backend, act="silu", residual=h)

        for M in a.m:
            if deadline_passed():
                return f"deadline {a.deadline_s} s reached before the layer chain M={M}"
            h = r(M, H)
            ref = chain(h, layers[0], "naive").float()
            torch._dynamo.reset()
            compiled = torch.compile(lambda h_, ws: chain(h_, ws, "torch"), backend=meta["compile_backend"],
                                     dynamic=False, fullgraph=True)
            got = {}
            for system, fn in (("chain-unfused-compiled", compiled),
                               ("chain-fused", lambda h_, ws: chain(h_, ws, "triton"))):
                t = timed(fn, layers, h)
                err = rel_err(fn(h, layers[0]), ref)
                got[system] = t
                if not err <= MAX_REL_ERR:
                    print(f"WARNING: {system} M={M}: rel_err {err:.3g} > {MAX_REL_ERR} (wrong result)", file=sys.stderr)
                    meta.setdefault("wrong_results", []).append(f"{system} M={M}")
                rows.append({"site": "layer_chain", "weight": "qkv+o+gate_up+down", "N": H, "K": H, "M": M,
                             "system": system, "prologue": "", "residual": True, "us": t * 1e6,
                             "floor_us": layer_bytes / bw * 1e6, "weight_bytes": layer_bytes,
                             "weight_GBps": layer_bytes / t / 1e9, "of_copy_bw": layer_bytes / t / bw, "rel_err": err})
            for r_ in rows[-2:]:
                r_["speedup_vs_unfused_compiled"] = got["chain-unfused-compiled"] / (r_["us"] / 1e6)
            write()
        return None

    if a.fused:
        stopped = fused_sites()
        layer = {}  # per M and system: the four sites summed (when all four ran)
        for M in a.m:
            per = {}
            for r_ in rows:
                if r_["M"] == M and r_["site"] in SITES:
                    per.setdefault(r_["system"], {})[r_["site"]] = r_["us"]
            layer[str(M)] = {k: sum(v.values()) for k, v in per.items() if len(v) == len(SITES)}
        meta["layer_us"] = {M: v for M, v in layer.items() if v}
        if stopped:
            meta["stopped"] = stopped
            print(f"stopped: {stopped}", file=sys.stderr)
        write()
        print(f"\ncopy bandwidth {bw / 1e12:.3f} TB/s ({meta['device']}, {a.dtype}, commit {meta['commit']}, "
              f"compiled baseline: {meta['compile_backend']})")
        table = [{**r_, "config": label(r_["config"]) if "config" in r_ else ""} for r_ in rows]
        print_table(table, ["site", "N", "K", "M", "system", "us", "floor_us", "of_copy_bw",
                            "speedup_vs_unfused_compiled", "rel_err", "config"],
                    "Fused GEMV sites: prologue + GEMV (+ residual), one call each, CUDA graphs, weights past L2")
        for M, v in meta["layer_us"].items():
            print(f"M={M}: one layer's four sites " + ", ".join(f"{k} {t:.2f} us" for k, t in v.items())
                  + (f"; fused saves {v['unfused-compiled'] - v['fused']:.2f} us per layer vs unfused-compiled"
                     if "fused" in v and "unfused-compiled" in v else ""))
        chain = {(r_["M"], r_["system"]): r_["us"] for r_ in rows if r_["site"] == "layer_chain"}
        for M in a.m:
            if (M, "chain-fused") in chain:
                c, f = chain[(M, "chain-unfused-compiled")], chain[(M, "chain-fused")]
                print(f"M={M}: the four sites chained as in a layer: unfused-compiled {c:.2f} us, fused {f:.2f} us "
                      f"(saves {c - f:.2f} us per layer, {36 * (c - f) / 1e3:.3f} ms per 36-layer step)")
        if meta.get("tuned_rows"):
            print("\nthe swept winners as CONFIGS rows (benchmarks/roofline.py --gemv-configs reads them from this file):")
            for r_ in meta["tuned_rows"]:
                c = ", ".join(f"{k}={v}" for k, v in r_["config"].items())
                print(f"    ({r_['m_max']}, {r_['n_max']}, {r_['k_max']}, GemvConfig({c})),")
        print(f"\nwrote {a.out}")
        return 0

    # pass 1: cuBLAS and the table's config at every shape; pass 2 (--sweep): the candidates,
    # in the order of each weight's share of a decode step, so a deadline cuts the least useful
    passes = [("base", list(shapes))] + ([("sweep", [n for n in SWEEP_ORDER if n in shapes])] if a.sweep else [])
    bar = Progress(sum(len(names) for _, names in passes) * len(a.m), "gemv", unit="point")
    stopped = None
    for pass_, names in passes:
        for name in names:
            if stopped:
                break
            N, K = shapes[name]
            gen = torch.Generator(device=dev).manual_seed(list(SHAPES).index(name))  # the same data in both passes
            nbytes = N * K * elem
            copies = 2 if not cuda else max(2, math.ceil(512e6 / nbytes))
            weights = [(torch.randn(N, K, generator=gen, device=dev) * K ** -0.5).to(dtype) for _ in range(copies)]
            floor_s = nbytes / bw
            for M in a.m:
                if deadline_passed():
                    stopped = f"deadline {a.deadline_s} s reached before {pass_} {name} M={M}"
                    break
                x = torch.randn(M, K, generator=gen, device=dev).to(dtype)
                ref = gemv_ref(x.float(), weights[0].float())
                base = {"shape": name, "N": N, "K": K, "M": M, "weight_bytes": nbytes, "floor_us": floor_s * 1e6}

                def row(system, t, err, cfg=None, cublas_s=None, **extra):
                    r = {**base, "system": system, "us": t * 1e6, "weight_GBps": nbytes / t / 1e9,
                         "of_copy_bw": nbytes / t / bw, "rel_err": err}
                    if cfg is not None:
                        r["config"] = config_dict(cfg)
                    if cublas_s is not None:
                        r["speedup_vs_cublas"] = cublas_s / t
                    r.update(extra)
                    if not err <= MAX_REL_ERR:
                        print(f"WARNING: {system} {name} M={M}: rel_err {err:.3g} > {MAX_REL_ERR} (wrong result)",
                              file=sys.stderr)
                        meta.setdefault("wrong_results", []).append(f"{system} {name} M={M}")
                    rows.append(r)
                    write()

                if pass_ == "base":
                    t_cublas = timed(lambda x_, w_: F.linear(x_, w_), weights, x)
                    row("cublas", t_cublas, rel_err(F.linear(x, weights[0]), ref))
                    cfg = pick_config(M, N, K)
                    t_tri = timed(lambda x_, w_: gemv_triton(x_, w_, config=cfg), weights, x)
                    row("triton", t_tri, rel_err(gemv_triton(x, weights[0], config=cfg), ref), cfg, t_cublas)
                else:
                    t_cublas = next(r["us"] for r in rows if r["shape"] == name and r["M"] == M
                                    and r["system"] == "cublas") / 1e6
                    best, tried, cut = sweep(sweep_configs(a.quick), lambda x_, w_, c: gemv_triton(x_, w_, config=c),
                                             x, weights, ref, K, f"{name} M={M}")
                    if cut:
                        stopped = f"deadline {a.deadline_s} s reached in the sweep of {name} M={M}"
                    if best is not None:
                        row("triton-best", best[0], best[2], best[1], t_cublas, sweep=tried)
                bar.update(1)
            del weights
            if cuda:
                torch.cuda.empty_cache()
    bar.close()
    if stopped:
        meta["stopped"] = stopped
        print(f"stopped: {stopped}", file=sys.stderr)
    write()
    print(f"\ncopy bandwidth {bw / 1e12:.3f} TB/s ({meta['device']}, {a.dtype}, commit {meta['commit']})")
    table = [{**r, "config": label(r["config"]) if "config" in r else ""} for r in rows]
    print_table(table, ["shape", "N", "K", "M", "system", "us", "floor_us", "weight_GBps", "of_copy_bw",
                        "speedup_vs_cublas", "rel_err", "config"], "GEMV: one call, weights streamed from HBM")
    print(f"\nwrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

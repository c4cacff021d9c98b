"""Where the engine's time goes (GPU). ``--phase decode`` (default): the engine's decode step on the Qwen3-8B shape (random
weights, bf16), timed under its CUDA graph, then profiled kernel by kernel (the same step run
outside the graph, so every kernel is recorded). Prints the step time, the HBM floor, the sum
of kernel times and a breakdown by kernel class (GEMM/GEMV, fused elementwise, attention,
cache writes, other), for Orthros (token pair) and the Transformer (one token) of the same
engine. Gaps = step time - kernel time (launch latency between kernels inside the graph).

``--phase prefill``: a short prefill (``--context`` tokens per row, ``--batch`` rows), wall time
and the top host (CPU) and device (CUDA) operators, Orthros vs the Transformer.

    python benchmarks/profile_engine.py [--phase decode|prefill] [--compile] [--gemv] [--timeline] [--context 1024]
        [--batch 1] [--json out.json]
        [--preset qwen3-8b|qwen3.5-9b|tiny|tiny-h] [--reps 10] [--profiled 3] [--decode-config JSON]
        [--decode-compile-options JSON] [--modes orthros,full] [--peer GPT_FAST_DIR [--peer-sources DIR]
        [--peer-setups N]]

``--timeline`` (decode, CUDA): the same step replayed from its CUDA graph under the profiler,
kernel by kernel with start times (:func:`graph_kernels`, :func:`timeline_summary`): the step's
span, the time a kernel runs, the idle time and the PDL overlap, the gap after each kernel, and
the middle of the step (about a layer) kernel by kernel.

``--peer DIR`` (decode): also gpt-fast's decode step of the same shape (its ``model.py`` in
``DIR``, compiled as ``roofline.py`` compiles it with ``--compile``), timed, and with
``--timeline`` traced the same way, so the two steps can be read kernel by kernel side by side.

``--peer-setups N``: the peer's step timed in N setups (a new CUDA graph and activation pool
each, the same kernels and configs: :meth:`GptFastPeer.new_setup`), as ``roofline.py
--gpt-fast-setups`` does; the step printed is the fastest, the trace the first setup's.
``--modes ''`` (with ``--peer``) leaves the engine out, the peer alone.

``--peer-sources DIR`` (with ``--peer --compile --timeline``): the Inductor source of gpt-fast's
heaviest kernels (by time a step) and the launch config its coordinate-descent tuning kept for
each (the ``.best_config`` files beside the source in Inductor's cache), copied to ``DIR``.

``--decode-compile-options '{}'``: the compiled decode pieces with Inductor's defaults instead
of the engine's ``DECODE_COMPILE_OPTIONS`` (what those options change, kernel by kernel).

``--preset qwen3.5-9b --phase prefill --context 131072``: where Orthros-H's and the Linear
Hybrid's 128K prefill time goes (kernel classes: matmul, attention, GDN, elementwise, ...).
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from orthros.benchmarks.inference import (copy_bandwidth, decode_compile_options, decode_qkv_kernel,  # noqa: E402
                                          parse_compile_options, parse_decode_config, time_call,
                                          trace_kernels, weight_bytes_per_step)
from orthros.benchmarks.models import PRESETS, orthros_model  # noqa: E402
from orthros.engine import Engine  # noqa: E402
from orthros.utils import check_device, check_output_path, commit_id, write_json, write_text  # noqa: E402


def kernel_class(name: str) -> str:
    n = name.lower()
    if "chunk_" in n or "gated_delta" in n or "delta_rule" in n or "conv1d" in n or "recurrent" in n \
            or "chunk_local_cumsum" in n or "solve_tril" in n or "wy_" in n:
        return "GDN (linear attention)"
    if "flash" in n or "fmha" in n or "cudnn" in n:
        return "attention"
    if "gemv" in n or "gemm" in n or "cutlass" in n or "sm90" in n or "nvjet" in n or "xmma" in n \
            or "splitkreduce" in n:
        return "matmul"
    if "decode_split" in n or "decode_combine" in n or "_stream_fwd" in n:
        return "attention"
    if "index_put" in n or "scatter" in n:
        return "cache write"
    if n.startswith("triton_") or "fused" in n:
        return "fused elementwise"
    return "other"


def profile(eng, B, L, steps=10):
    dev = eng.device
    toks = torch.ones(B, dtype=torch.long, device=dev)
    eng.set_lengths([L] * B)
    for _ in range(5):
        eng.step(toks)
    eng.set_lengths([L] * B)
    dt = time_call(lambda: [eng.step(toks) for _ in range(steps)], dev) / steps
    # the same step outside the graph, so every kernel shows up in the trace
    eng.set_lengths([L] * B)
    lens = eng.cache.seqlens[:B]
    eng._tok_buf[:B].copy_(toks)
    span = eng._span(L + 2)
    with torch.no_grad():
        eng._decode_step(eng._tok_buf[:B], lens, span)
        cuda = dev.type == "cuda"
        if cuda:
            torch.cuda.synchronize()
        acts = [torch.profiler.ProfilerActivity.CUDA if cuda else torch.profiler.ProfilerActivity.CPU]
        with torch.profiler.profile(activities=acts) as prof:
            for _ in range(3):
                eng._decode_step(eng._tok_buf[:B], lens, span)
            if cuda:
                torch.cuda.synchronize()
    by = defaultdict(lambda: [0.0, 0])
    names = defaultdict(lambda: [0.0, 0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            us = e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
            c = kernel_class(e.name)
            by[c][0] += us / 3
            by[c][1] += 1 / 3
            names[e.name][0] += us / 3
            names[e.name][1] += 1 / 3
    return dt, by, names


TIMELINE_REPS = 3  # graph replays --timeline traces


def graph_kernels(eng, B, L, reps=TIMELINE_REPS):
    """The kernels of ``reps`` replays of the engine's captured decode step, as the CUDA trace
    records them inside the graph (PDL overlaps and idle gaps as they happen, unlike
    :func:`profile`'s eager run): ``[(name, start_us, duration_us)]`` sorted by start, copies and
    memsets left out; ``[]`` off CUDA."""
    dev = eng.device
    if dev.type != "cuda":
        return []
    toks = torch.ones(B, dtype=torch.long, device=dev)

    def one():
        eng.set_lengths([L] * B)
        eng.step(toks)
    for _ in range(3):  # captured, replayed
        one()
    return trace_kernels(one, dev, reps)


def timeline_summary(kernels, reps: int, window: int = 16) -> dict:
    """Where a step's time goes between its kernels, from :func:`graph_kernels`' list of ``reps``
    steps (``n = len / reps`` kernels each, in launch order): the step's span (first start to last
    end), the time some kernel runs (the union of their intervals), the idle time (span - busy)
    and the overlap (the sum of durations - busy: PDL's early starts); per kernel name its calls,
    mean duration and the mean gap to the next kernel's start (negative: the next one started
    before it ended), per step; and ``window`` kernels from the middle of the first step (about a
    layer) with their start offset, duration and gap. ``ValueError`` unless the kernels divide
    into ``reps`` steps of one sequence of names."""
    if reps < 1 or not kernels or len(kernels) % reps:
        raise ValueError(f"timeline: {len(kernels)} kernels do not divide into {reps} steps")
    n = len(kernels) // reps
    steps = [kernels[i * n:(i + 1) * n] for i in range(reps)]
    if any([k[0] for k in st] != [k[0] for k in steps[0]] for st in steps[1:]):
        raise ValueError("timeline: the steps launched different kernels (not one replayed graph)")
    span = busy = total = 0.0
    per = {}
    for st in steps:
        span += st[-1][1] + st[-1][2] - st[0][1]
        total += sum(d for _, _, d in st)
        end = None
        for _, t, d in st:  # union of [t, t + d), in start order
            if end is None or t >= end:
                busy += d
                end = t + d
            elif t + d > end:
                busy += t + d - end
                end = t + d
        for j, (name, t, d) in enumerate(st):
            gap = st[j + 1][1] - (t + d) if j + 1 < n else 0.0
            c = per.setdefault(name, [0, 0.0, 0.0, 0.0])
            c[0] += 1
            c[1] += d
            c[2] += gap
            c[3] += max(gap, 0.0)
    first = steps[0]
    mid = max(0, n // 2 - window // 2)
    layer = [{"name": nm, "start_us": t - first[mid][1], "us": d,
              "gap_us": first[j + 1][1] - (t + d) if j + 1 < n else 0.0}
             for j, (nm, t, d) in enumerate(first[mid:mid + window], start=mid)]
    return {"kernels_per_step": n, "span_us": span / reps, "busy_us": busy / reps, "idle_us": (span - busy) / reps,
            "overlap_us": (total - busy) / reps,
            "by_name": {nm: {"calls": c[0] / reps, "mean_us": c[1] / c[0], "mean_gap_us": c[2] / c[0],
                             "idle_after_us": c[3] / reps} for nm, c in per.items()},
            "window": layer}


def print_timeline(t: dict) -> None:
    print(f"   graph timeline: {t['kernels_per_step']} kernels a step, span {t['span_us'] / 1000:.3f} ms, "
          f"busy {t['busy_us'] / 1000:.3f} ms, idle {t['idle_us'] / 1000:.3f} ms, overlapped "
          f"{t['overlap_us'] / 1000:.3f} ms", flush=True)
    print("      calls  mean us  gap after us  idle after us/step  kernel")
    for nm, c in sorted(t["by_name"].items(), key=lambda kv: -kv[1]["calls"] * kv[1]["mean_us"])[:12]:
        print(f"      {c['calls']:5.0f} {c['mean_us']:8.2f} {c['mean_gap_us']:13.2f} {c['idle_after_us']:19.1f}  "
              f"{nm[:70]}")
    print("      the middle of a step (start us, us, gap to the next us):")
    for k in t["window"]:
        print(f"      {k['start_us']:8.2f} {k['us']:7.2f} {k['gap_us']:7.2f}  {k['name'][:70]}")


def profile_prefill(eng, B, L, reps=10, profiled=3):
    dev = eng.device
    ids = torch.randint(0, eng.config.vocab_size, (B, L), device=dev)

    def run():
        eng.reset()
        eng.prefill(ids)
    for _ in range(3):
        run()
    dt = time_call(lambda: [run() for _ in range(reps)], dev) / reps
    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(profiled):
            run()
        if dev.type == "cuda":
            torch.cuda.synchronize()
    ka = prof.key_averages()
    n = float(profiled)
    cpu = sorted(ka, key=lambda e: -e.self_cpu_time_total)[:15]
    dev_t = sorted(ka, key=lambda e: -getattr(e, "self_device_time_total", 0))[:10]
    by = defaultdict(lambda: [0.0, 0])
    for e in ka:
        us = getattr(e, "self_device_time_total", 0)
        if us and e.device_type == torch.autograd.DeviceType.CUDA:
            c = kernel_class(e.key)
            by[c][0] += us / n / 1000
            by[c][1] += e.count / n
    return dt, [(e.key, e.self_cpu_time_total / n / 1e3, e.count / n) for e in cpu], \
        [(e.key, getattr(e, "self_device_time_total", 0) / n / 1e3, e.count / n) for e in dev_t], dict(by)


def run_header(a, dev) -> dict:
    """The JSON's first fields, both phases: what ran, where, when, at which commit."""
    return {"phase": a.phase, "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
            "commit": commit_id(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "torch": torch.__version__, "preset": a.preset, "context": a.context, "batch": a.batch, "compile": a.compile}


CACHE_HEADROOM = 64  # the engines' cache: --context + this many slots (the decode steps past the context)


def check_context(context: int, preset: str) -> None:
    """``--context`` against the preset's positions, before any model is built: both phases build
    the engine with ``context + CACHE_HEADROOM`` cache slots, every one of them a position the
    model must have (a decode step's CUDA graph is captured at the last slot; the prefill was
    refused by the engine only after the model was built, the decode ran past the positions
    silently). ``ValueError`` naming ``--context`` and the allowed range."""
    limit = PRESETS[preset]["max_position_embeddings"]
    if not 1 <= context <= limit - CACHE_HEADROOM:
        raise ValueError(f"--context {context}: give 1..{limit - CACHE_HEADROOM} for --preset {preset} (the engine's "
                         f"cache holds --context + {CACHE_HEADROOM} positions, the preset has "
                         f"max_position_embeddings={limit})")


def main_prefill(a, model, dev):
    out = {**run_header(a, dev), "modes": {}}
    for mode in a.modes:
        eng = Engine(model, max_batch_size=a.batch, max_seq_len=a.context + CACHE_HEADROOM, attention_mode=mode,
                     compile=a.compile, prefill_chunk=None if mode == "full" else 16384)
        dt, cpu, gpu, by = profile_prefill(eng, a.batch, a.context, reps=a.reps, profiled=a.profiled)
        print(f"\n== {mode}: prefill B={a.batch} T={a.context}: {1000 * dt:.2f} ms", flush=True)
        if by:
            print("   device time by kernel class (ms per prefill, kernels):")
            for c, (ms, k) in sorted(by.items(), key=lambda kv: -kv[1][0]):
                print(f"      {c:24s} {ms:9.3f} ms {k:7.0f}")
        print("   top host operators (self CPU ms per prefill, calls):")
        for k, ms, n in cpu:
            print(f"      {ms:8.3f} ms {n:7.0f}x  {k[:100]}")
        print("   top device kernels (self CUDA ms per prefill, calls):")
        for k, ms, n in gpu:
            print(f"      {ms:8.3f} ms {n:7.0f}x  {k[:100]}")
        out["modes"][mode] = {"ms": 1000 * dt, "host_top": cpu, "device_top": gpu,
                              "by_class": {c: {"ms": v[0], "kernels": v[1]} for c, v in by.items()}}
        del eng
    return out


def main(argv=None):
    """The command (``argv``: its arguments, default ``sys.argv[1:]``); bad ones exit 2 before any model."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--phase", default="decode", choices=["decode", "prefill"])
    p.add_argument("--compile", action="store_true", help="the engine's torch.compile'd pieces (and the peer's)")
    p.add_argument("--gemv", action="store_true",
                   help="decode: the engine with Engine(gemv=True) (fused weight-streaming GEMVs)")
    p.add_argument("--context", type=int, default=1024,
                   help=f"decode: cached tokens per row; prefill: prompt tokens per row (default 1024; at most the "
                        f"preset's max_position_embeddings - {CACHE_HEADROOM})")
    p.add_argument("--batch", type=int, default=1, help="rows (default 1)")
    p.add_argument("--json", default=None, help="write the figures here (JSON, with device, commit and date)")
    p.add_argument("--preset", default=None, choices=list(PRESETS),
                   help="the model's shape (default qwen3-8b; --device cpu needs one named, tiny or tiny-h for a "
                        "smoke run); qwen3.5-9b / tiny-h: Orthros-H, whose 'full' mode is the Linear Hybrid")
    p.add_argument("--reps", type=int, default=None, help="prefill: timed repetitions (default 10)")
    p.add_argument("--profiled", type=int, default=None, help="prefill: profiled repetitions (default 3)")
    p.add_argument("--device", default="cuda", help="cpu: a smoke run (no kernel trace)")
    p.add_argument("--decode-config", default=None, metavar="JSON",
                   help="decode: DECODE_CONFIG overrides of the decode attention, e.g. '{\"min_split\": 64}'")
    p.add_argument("--decode-compile-options", default=None, metavar="JSON",
                   help="decode, with --compile: Inductor options of the decode pieces instead of the engine's "
                        "DECODE_COMPILE_OPTIONS ('{}': Inductor's defaults)")
    p.add_argument("--timeline", action="store_true",
                   help="decode: also trace 3 replays of the captured step (CUDA) and print where its time goes "
                        "between kernels: busy, idle, PDL overlap, the gap after each kernel")
    p.add_argument("--qkv-kernel", default=None, choices=("on", "off"),
                   help="decode: the q/k prologue and the K/V write inside the attention kernel on or off "
                        "(default: the engine's default)")
    p.add_argument("--peer", default=None, metavar="DIR",
                   help="decode: also time (and with --timeline trace) gpt-fast's step of the same shape, its "
                        "model.py in DIR (as roofline.py's --gpt-fast-dir)")
    p.add_argument("--peer-sources", default=None, metavar="DIR",
                   help="with --peer --compile --timeline: copy the Inductor source and the tuned launch config "
                        "(.best_config) of gpt-fast's heaviest kernels to DIR")
    p.add_argument("--modes", default="orthros,full",
                   help="the engine's modes profiled, comma-separated (orthros, full); '' (decode, with --peer): "
                        "none, the peer alone")
    p.add_argument("--peer-setups", type=int, default=1, metavar="N",
                   help="with --peer: time the peer's step in N setups (a new CUDA graph and activation pool each, "
                        "the same kernels); the step printed is the fastest")
    a = p.parse_args(argv)
    a.peer_mod = None
    # each phase's own options: the other phase would accept them and run without them
    only = {"prefill": [("--reps", a.reps is not None), ("--profiled", a.profiled is not None)],
            "decode": [("--gemv", a.gemv), ("--decode-config", a.decode_config is not None),
                       ("--decode-compile-options", a.decode_compile_options is not None),
                       ("--timeline", a.timeline), ("--qkv-kernel", a.qkv_kernel is not None)]}
    for phase, opts in only.items():
        for opt, given in opts:
            if given and a.phase != phase:
                p.error(f"{opt}: only with --phase {phase}")
    if a.decode_compile_options is not None and not a.compile:
        p.error("--decode-compile-options: only with --compile (Inductor options of the compiled decode pieces; "
                "the eager engine compiles nothing)")
    a.reps = 10 if a.reps is None else a.reps
    a.profiled = 3 if a.profiled is None else a.profiled
    for name in ("context", "batch", "reps", "profiled", "peer_setups"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} {getattr(a, name)}: give a positive integer")
    a.modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    bad = [m for m in a.modes if m not in ("orthros", "full")]
    if bad or len(set(a.modes)) != len(a.modes):
        p.error(f"--modes {','.join(a.modes)!r}: give orthros and/or full, each once (or '' with --peer)")
    if not a.modes and (a.peer is None or a.phase != "decode"):
        p.error("--modes '': only with --peer and --phase decode (something must be profiled)")
    if a.peer_setups != 1 and a.peer is None:
        p.error("--peer-setups: only with --peer")
    try:  # were: torch's AssertionError (no CUDA) or RuntimeError (a device type), the JSON's after the run
        a.device = check_device(a.device)
        if a.json:
            check_output_path("--json", a.json)
    except ValueError as e:
        p.error(str(e))
    if a.peer_sources is not None and not (a.peer and a.compile and a.timeline):
        p.error("--peer-sources: only with --peer, --compile and --timeline (the kernels' names come from the trace)")
    if a.peer is not None:
        if a.phase != "decode":
            p.error("--peer: only with --phase decode")
        from orthros.benchmarks.roofline import load_gpt_fast

        try:
            a.peer_mod = load_gpt_fast(a.peer)
        except ValueError as e:
            p.error(str(e).replace("--gpt-fast-dir", "--peer", 1))
    overrides = {}
    if a.decode_config is not None:
        try:
            overrides = parse_decode_config(a.decode_config)
        except ValueError as e:
            p.error(f"--decode-config {a.decode_config!r}: {e}")
    import orthros.engine.engine as engine_mod

    compile_options = engine_mod.DECODE_COMPILE_OPTIONS
    if a.decode_compile_options is not None:
        try:
            compile_options = parse_compile_options(a.decode_compile_options)
        except ValueError as e:
            p.error(f"--decode-compile-options {a.decode_compile_options!r}: {e}")
    if a.preset is None:
        if a.device.split(":")[0] == "cpu":  # was: the 8B shape built on the CPU in fp32 (32 GB), then profiled
            p.error(f"--device {a.device}: give --preset tiny or tiny-h for a CPU smoke run (the default preset, "
                    f"qwen3-8b, builds 8B parameters on the CPU; pass --preset qwen3-8b to do so anyway)")
        a.preset = "qwen3-8b"
    try:
        check_context(a.context, a.preset)
    except ValueError as e:
        p.error(str(e))
    dev = torch.device(a.device)
    model = orthros_model(a.preset, device=dev, dtype=torch.bfloat16 if dev.type == "cuda" else torch.float32)
    if a.phase == "prefill":
        out = main_prefill(a, model, dev)
        if a.json:
            write_json(a.json, out, indent=1)
        return
    bw = copy_bandwidth(dev)
    wb = weight_bytes_per_step(model)
    out = {**run_header(a, dev), "gemv": a.gemv, "copy_bw_tb_s": bw / 1e12,
           "decode_config": overrides, "decode_compile_options": compile_options, "modes": {}}
    from orthros.ops.triton.decode import decode_config  # Triton: imported by a run, not by --help

    qkv = None if a.qkv_kernel is None else a.qkv_kernel == "on"
    with decode_config(**overrides), decode_compile_options(compile_options), decode_qkv_kernel(qkv) as qkv_on:
        out["qkv_kernel"] = bool(qkv_on) and dev.type == "cuda"  # the CUDA engines' default (the CPU's: off)
        decode_modes(a, model, dev, bw, wb, out)
    if a.peer_mod is not None:
        decode_peer(a, model, dev, bw, wb, out)
    if a.json:
        write_json(a.json, out, indent=1)


def report_timeline(kernels, dev, out_mode: dict, window: int = 16) -> None:
    """Print :func:`timeline_summary` of a step's traced kernels (``window`` of them from the
    middle of the step) and keep it in ``out_mode``."""
    if not kernels:
        why = "a CPU has no kernel trace" if dev.type != "cuda" else "the profiler saw no kernel of the graph"
        print(f"   graph timeline: no kernel recorded ({why})", flush=True)
        return
    try:
        t = timeline_summary(kernels, TIMELINE_REPS, window=window)
    except ValueError as e:  # e.g. a trace without the graph's kernels
        print(f"   graph timeline: {e}", flush=True)
    else:
        print_timeline(t)
        out_mode["timeline"] = t


PEER_SOURCES = 8  # --peer-sources: the peer's kernels copied, the heaviest first


def inductor_best_config(source: Path) -> Path:
    """Where Inductor's autotune cache keeps the launch config tuned for the kernel in ``source``
    (a hash of the file's name, the cache tag and the torch build, in the same folder)."""
    from torch._inductor.runtime.autotune_cache import AutotuneCache

    return Path(AutotuneCache._make_local_cache_key(str(source.parent), AutotuneCache._prepare_key(str(source))))


def copy_kernel_sources(names, root, dest, config_of=inductor_best_config) -> dict:
    """For each kernel name, the Inductor-generated source under ``root`` that defines it (``def
    NAME(``; the names are unique with ``triton.unique_kernel_names``) and the launch config that
    tuning kept for it (``config_of(source)``: :func:`inductor_best_config`), copied to ``dest``
    as ``NAME.py`` and ``NAME.best_config`` (each through a temporary name). The graph's own
    module also defines every kernel, but has no config of its own: a kernel's file with its
    config is preferred, the module taken only where none is found. Returns ``{name: [files
    written]}`` for the names found."""
    wanted = {f"def {n}(": n for n in names}
    best = {}  # name -> (source, its config or None)
    for source in sorted(Path(root).rglob("*.py")):
        try:
            text = source.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        config = config_of(source)
        config = config if config.is_file() else None
        for marker, name in wanted.items():
            if marker in text and (name not in best or (best[name][1] is None and config is not None)):
                best[name] = (source, config)
    found = {}
    for name in names:
        if name not in best:
            continue
        source, config = best[name]
        written = [os.path.join(dest, f"{name}.py")]
        write_text(written[0], source.read_text(encoding="utf-8", errors="replace"))
        if config is not None:
            written.append(os.path.join(dest, f"{name}.best_config"))
            write_text(written[-1], config.read_text(encoding="utf-8"))
        found[name] = written
    return found


def decode_peer(a, model, dev, bw, wb, out):
    """gpt-fast's step of the model's shape (``a.peer_mod``), timed as ``roofline.py`` times it
    (50 steps after 5), and with ``--timeline`` its kernels over :data:`TIMELINE_REPS` more steps."""
    from orthros.benchmarks.roofline import GptFastPeer, kv_bytes_per_token

    dtype = next(model.parameters()).dtype
    steps, warmup = 50, 5
    peer = GptFastPeer(a.peer_mod, model.config, device=dev, dtype=dtype,
                       block_size=a.context + steps + warmup + TIMELINE_REPS + 8, compile=a.compile)
    r = peer.time_decode(a.batch, a.context, steps=steps, warmup=warmup, trace=TIMELINE_REPS if a.timeline else 0,
                         setups=a.peer_setups)
    floor_ms = 1000 * (wb + a.batch * a.context * kv_bytes_per_token(model.config, dtype)) / bw
    ms = r["ms_per_step"]
    print(f"\n== gpt-fast: step {ms:.3f} ms ({'compiled, CUDA graphs' if a.compile else 'eager'}), HBM floor "
          f"{floor_ms:.3f} ms ({floor_ms / ms:.0%})", flush=True)
    setups = r.get("setups_ms", [ms])
    if len(setups) > 1:
        print(f"   the fastest of {len(setups)} setups: " + " ".join(f"{x:.3f}" for x in setups)
              + f" ms; max / min {max(setups) / min(setups):.4f}" + ("; the trace is the first's" if a.timeline else ""))
    for note in peer.notes:
        print(f"   note: {note}")
    out["modes"]["gpt-fast"] = {"step_ms": ms, "floor_ms": floor_ms, "notes": peer.notes,
                                "upstream": getattr(a.peer_mod, "UPSTREAM", None), "setups_ms": setups}
    if a.timeline:
        report_timeline(r["kernels"], dev, out["modes"]["gpt-fast"], window=40)  # its layer: more, smaller kernels
        by_name = out["modes"]["gpt-fast"].get("timeline", {}).get("by_name", {})
        if a.peer_sources and by_name:
            heavy = sorted(by_name, key=lambda n: -by_name[n]["calls"] * by_name[n]["mean_us"])[:PEER_SOURCES]
            from torch._inductor.runtime.cache_dir_utils import cache_dir

            found = copy_kernel_sources(heavy, cache_dir(), a.peer_sources)
            out["modes"]["gpt-fast"]["sources"] = found
            missing = [n for n in heavy if n not in found]
            print(f"   the sources of {len(found)} of its {len(heavy)} heaviest kernels in {a.peer_sources}"
                  + (f" (not found: {', '.join(missing)})" if missing else ""))
    del peer
    if dev.type == "cuda":
        torch.cuda.empty_cache()


def decode_modes(a, model, dev, bw, wb, out):
    for mode in a.modes:
        eng = Engine(model, max_batch_size=a.batch, max_seq_len=a.context + CACHE_HEADROOM, attention_mode=mode,
                     compile=a.compile, gemv=a.gemv)
        floor_ms = 1000 * (wb + a.batch * a.context * eng.cache.bytes_per_token()) / bw
        dt, by, names = profile(eng, a.batch, a.context)
        tot = sum(v[0] for v in by.values()) / 1000
        print(f"\n== {mode}: step {1000 * dt:.3f} ms ({'graph' if eng.cuda_graphs else 'eager'}), HBM floor {floor_ms:.3f} ms "
              f"({floor_ms / (1000 * dt):.0%}), kernel time {tot:.3f} ms, kernels/step "
              f"{sum(v[1] for v in by.values()):.0f}, gaps {1000 * dt - tot:.3f} ms", flush=True)
        for c, (us, n) in sorted(by.items(), key=lambda kv: -kv[1][0]):
            print(f"   {c:18s} {us / 1000:8.3f} ms  {n:6.0f} kernels")
        top = sorted(names.items(), key=lambda kv: -kv[1][0])[:12]
        for nm, (us, n) in top:
            print(f"      {us / 1000:7.3f} ms {n:5.0f}x  {nm[:110]}")
        out["modes"][mode] = {"step_ms": 1000 * dt, "floor_ms": floor_ms, "kernel_ms": tot,
                              "by_class": {c: {"ms": v[0] / 1000, "kernels": v[1]} for c, v in by.items()},
                              "top": [{"name": nm, "ms": v[0] / 1000, "count": v[1]} for nm, v in top]}
        if a.timeline:
            report_timeline(graph_kernels(eng, a.batch, a.context), dev, out["modes"][mode])
        del eng
        if dev.type == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

"""``orthros bench``: inference benchmarks of paper Sections 4.5 / 4.6.

    orthros bench prefill [--lengths 8192,16384,32768,65536,131072]   # Orthros vs Transformer vs HF vs floors
    orthros bench decode  [--contexts 1024,8192,32768,131072] [--batch-sizes 1,2]
    orthros bench e2e     [--pairs 128:128,1024:1024,8192:8192] [--batch 2] [--fit 131072:8192]
    orthros bench all     (the three above on one model load; takes all their options)

Default model: the Qwen3-8B architecture with random weights (latency does not depend on the
weight values); ``--model PATH`` benchmarks a real Orthros checkpoint; ``--device cpu --preset tiny``
with small sizes (``--contexts 64,128 --steps 2``, ``--lengths 256``: the default sizes pass tiny's
65,536 positions) is a CPU smoke run. Each command prints a table and writes ``<out>/<command>.json`` and
``<out>/<command>.png`` (log axes; ``all`` writes prefill's, decode's and e2e's).

Other benchmarks are their own commands: sequence-parallel prefill
``torchrun --nproc-per-node N -m orthros.parallel.bench`` (docs/parallel.md), serving through vLLM
``python -m orthros.serving.bench_vllm`` (docs/serving.md), and issue #18's roofline
``python benchmarks/roofline.py`` (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

from ..utils import DTYPE_CHOICES, check_device, check_output_path, parse_dtype, stop_on_sigterm, written_in_place


def int_list(s):
    """argparse type: ``"8192,32768"`` -> ``[8192, 32768]``, positive, each value once (the benchmark scripts' too)."""
    try:
        vals = [int(x) for x in s.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {s!r}")
    if not vals or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {s!r}")
    return list(dict.fromkeys(vals))  # a value given twice is one point (it ran twice, two rows of one key)


def pair_list(s):
    """argparse type: ``"128:128,1024:512"`` -> ``[(128, 128), (1024, 512)]``, positive, each pair once."""
    out = []
    for item in filter(None, s.split(",")):  # a trailing comma is nothing, as in int_list
        try:
            a, b = item.split(":")
            out.append((int(a), int(b)))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected IN:OUT pairs like 128:128,1024:1024, got {s!r}")
        if min(out[-1]) < 1:
            raise argparse.ArgumentTypeError(f"lengths must be >= 1, got {item!r}")
    if not out:
        raise argparse.ArgumentTypeError(f"expected IN:OUT pairs like 128:128,1024:1024, got {s!r}")
    return list(dict.fromkeys(out))  # a pair given twice is one point


def build_parser():
    p = argparse.ArgumentParser(prog="orthros bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", metavar="COMMAND", title="commands")  # errors name COMMAND, as usage does

    def common(sp):
        sp.add_argument("--model", default=None, help="Orthros checkpoint directory (default: random weights)")
        sp.add_argument("--preset", default=None, choices=["qwen3-8b", "tiny"],
                        help="architecture for random weights (default: qwen3-8b; tiny: CPU smoke runs with small sizes, e.g. "
                             "--contexts 64,128; --device cpu needs it named); not with --model")
        sp.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (default: cuda)")
        sp.add_argument("--dtype", default="bf16", choices=DTYPE_CHOICES, help="weights and cache (default: bf16)")
        sp.add_argument("--window", type=int, default=None,
                        help="window size of the random-weight model (default: 128); not with --model (a "
                             "checkpoint keeps its own)")
        sp.add_argument("--out", default="bench_results", help="directory for JSON and PNG (default: %(default)s)")
        sp.add_argument("--compile", action="store_true",
                        help="torch.compile the engine's token-wise layer parts (both Orthros and its Transformer)")

    def chunk_arg(sp):  # prefill and e2e only: decode steps run no prefill
        sp.add_argument("--chunk", type=int, default=16384, help="Orthros prefill chunk (tokens; default: %(default)s)")

    def prefill_args(sp):
        sp.add_argument("--lengths", type=int_list, default=[8192, 16384, 32768, 65536, 131072],
                        help="prompt lengths in tokens, comma list (default: 8K to 128K)")
        sp.add_argument("--systems", default="orthros,orthros-floor,full,hf-sdpa,hf-floor",
                        help="comma list of: orthros (the engine), orthros-floor (the engine without attention), "
                             "full (the engine's Transformer), hf-sdpa (HF transformers' Qwen3 of the model's sizes, "
                             "all attention layers), hf-floor (HF without attention) (default: all five)")
        sp.add_argument("--budget-s", type=float, default=3.0, help="seconds of timed repeats per point (10 repeats at most; default: %(default)s)")
        sp.add_argument("--single-shot-s", type=float, default=25.0,
                        help="a point whose first (warm-up) call takes longer is not repeated (default: %(default)s)")

    def decode_args(sp):
        sp.add_argument("--contexts", type=int_list, default=[1024, 8192, 32768, 131072],
                        help="cached tokens per row, comma list (default: 1K, 8K, 32K, 128K)")
        sp.add_argument("--batch-sizes", type=int_list, default=[1, 2], help="rows per step, comma list (default: 1,2)")
        sp.add_argument("--steps", type=int, default=50, help="timed decode steps per point (default: 50)")

    def e2e_args(sp):
        sp.add_argument("--pairs", type=pair_list, default=[(128, 128), (1024, 1024), (8192, 8192)],
                        help="IN:OUT prompt and output lengths, comma list (default: 128:128,1024:1024,8192:8192)")
        sp.add_argument("--batch", type=int, default=2, help="sequences generated together (default: 2)")
        sp.add_argument("--fit", type=pair_list, default=None,
                        help="IN:OUT: check that an IN prefill + OUT decode of one sequence fits (batch 1, whatever "
                             "--batch)")

    for name, help_, adders in (("prefill", "prefill latency vs prompt length", [chunk_arg, prefill_args]),
                                ("decode", "decode step latency vs context, vs the HBM floor", [decode_args]),
                                ("e2e", "end-to-end generation: TTFT, E2E, throughputs (paper Table 4)",
                                 [chunk_arg, e2e_args]),
                                ("all", "prefill, decode and e2e on one model load", [chunk_arg, prefill_args,
                                                                                       decode_args, e2e_args])):
        sp = sub.add_parser(name, help=help_)
        common(sp)
        for add in adders:
            add(sp)
        if name == "decode":  # no prefill runs: refused with a message (_check_args), not "unrecognized arguments"
            sp.add_argument("--chunk", type=int, default=None, help=argparse.SUPPRESS)
        if name != "prefill":
            sp.add_argument("--no-cuda-graphs", action="store_true", help="decode eagerly, without CUDA graphs")
    return p


@stop_on_sigterm("orthros bench")  # a SIGTERM (a scheduler, kill): one line, exit 143, no temporary file left
def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.what is None:  # as `orthros` and `orthros eval` alone: the help, exit 0
        parser.print_help()
        return 0
    try:
        _check_options(args)  # (what needs no torch: a wrong --model is refused at once)
    except ValueError as e:
        print(f"orthros bench: error: {e}", file=sys.stderr)
        return 2
    try:
        dev = check_device(args.device)  # (a misspelt device is refused before torch loads; a valid one loads it)
    except ValueError as e:
        hint = " (pass --device cpu, with --preset tiny for a smoke run)" if args.device.startswith("cuda") else ""
        print(f"orthros bench: error: {e}{hint}", file=sys.stderr)
        return 2
    import torch

    from . import inference as I
    from .models import hf_qwen3_like, orthros_model

    dev = torch.device(dev)
    dtype = parse_dtype(args.dtype, "--dtype")
    try:
        _check_args(args, I.PREFILL_SYSTEMS)
        check_memory(args, dev, dtype)
        make_out_dir(args.out)
    except ValueError as e:
        print(f"orthros bench: error: {e}", file=sys.stderr)
        return 2
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    model = orthros_model(args.preset, path=args.model, device=dev, dtype=dtype, window_size=args.window)
    for what in _sections(args.what):
        _run_section(what, args, model, dev, dtype, I, hf_qwen3_like)
    return 0


def _sections(what):
    return ("prefill", "decode", "e2e") if what == "all" else (what,)


def _outputs(out, what):
    """The JSON and PNG paths section ``what`` writes in ``out``."""
    return tuple(os.path.join(out, f"{what}.{ext}") for ext in ("json", "png"))


def make_out_dir(path, arg: str = "--out") -> None:
    """Make the output directory ``path`` (the option ``arg``) once the arguments are checked and
    before any work: ``ValueError`` naming the option when it cannot be made (``''``, a read-only
    place), not an ``os.makedirs`` error after the model is built."""
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise ValueError(f"{arg} {path!r}: cannot make the directory ({e.strerror or e})") from None


def _check_options(args) -> None:
    """The options checked before torch loads (and so before ``--device``, whose check loads it): their
    values, the output paths, and ``--model``'s directory and weight files; ``ValueError`` naming the
    option. :func:`_check_args` checks the rest once torch is loaded."""
    if args.what == "decode" and args.chunk is not None:
        raise ValueError("--chunk goes with prefill, e2e and all (the prefill chunk): decode times steps over a "
                         "cache declared filled, no prefill runs")
    if args.what != "decode" and args.chunk < 1:
        raise ValueError(f"--chunk must be >= 1, got {args.chunk}")
    if getattr(args, "batch", 1) < 1:
        raise ValueError(f"--batch must be >= 1, got {args.batch}")
    if args.model is None and args.preset is None and args.device.split(":")[0] == "cpu":
        # was: the default preset, the 8B shape (16 GB of random weights in bf16), built on the CPU
        # for minutes, then the 8K..128K sweep; a CPU run is a smoke run unless the 8B is asked for
        raise ValueError(f"--device {args.device}: give --preset tiny for a CPU smoke run (the default preset, qwen3-8b, "
                         "builds 8B parameters on the CPU; pass --preset qwen3-8b to do so anyway)")
    if args.model is None:  # the random-weight model's defaults
        args.preset = args.preset or "qwen3-8b"
        args.window = 128 if args.window is None else args.window
    if args.window is not None and args.window < 1:
        raise ValueError(f"--window must be >= 1, got {args.window}")
    if hasattr(args, "steps") and args.steps < 1:
        raise ValueError(f"--steps must be >= 1, got {args.steps}")
    for opt in ("budget_s", "single_shot_s"):  # nan and negatives timed one call, as 0 does
        if hasattr(args, opt) and not getattr(args, opt) >= 0:
            raise ValueError(f"--{opt.replace('_', '-')} must be a number of seconds >= 0, got {getattr(args, opt)}")
    check_output_path("--out", args.out, directory=True)
    for path in (p for what in _sections(args.what) for p in _outputs(args.out, what)):
        if os.path.isdir(path):  # was found by the first save, after the first point ran (IsADirectoryError)
            raise ValueError(f"--out {args.out}: {path} is a folder, where this command writes a file (move it "
                             f"away or choose another --out)")
    if args.model is not None:  # a local checkpoint directory (never a hub lookup), its weights readable
        from ..checkpoint_files import check_weights, checkpoint_dir

        check_weights(checkpoint_dir(args.model, arg="--model"))
        for opt, val in (("--preset", args.preset), ("--window", args.window)):  # a checkpoint keeps its own
            if val is not None:
                raise ValueError(f"{opt} shapes the random-weight model; --model {args.model} benchmarks a "
                                 f"checkpoint, which keeps its own: drop {opt} or --model")


def _check_args(args, systems):
    """The options checked once torch is loaded, after :func:`_check_options`, before the model is
    built (what the sections would otherwise find out mid-sweep): ``--systems`` and the positions
    the sizes need; ``ValueError`` naming the option."""
    from .models import PRESETS

    if hasattr(args, "systems"):
        unknown = [s for s in args.systems.split(",") if s and s not in systems]
        if unknown:
            raise ValueError(f"--systems {args.systems!r}: unknown {', '.join(unknown)}; choose from "
                             f"{', '.join(systems)}")
        if not any(args.systems.split(",")):
            raise ValueError(f"--systems names no system; choose from {', '.join(systems)}")
    if args.model is not None:
        from ..checkpoint_files import checkpoint_dir
        from ..models import OrthrosConfig

        limit = OrthrosConfig.from_pretrained(str(checkpoint_dir(args.model, arg="--model")),
                                              local_files_only=True).max_position_embeddings
        src = f"the model's max_position_embeddings={limit}"
    else:
        limit = PRESETS[args.preset]["max_position_embeddings"]
        src = f"max_position_embeddings={limit} of --preset {args.preset}"
    # the positions a point runs through: a prompt of T (prefill), a context of L and --steps tokens
    # decoded after it, or the warm-up's steps if more (decode), IN + OUT - 1 (e2e, fit)
    from .inference import DECODE_WARMUP

    steps = max(getattr(args, "steps", 0), DECODE_WARMUP)
    context = max(getattr(args, "contexts", None) or [0])
    checks = [("--lengths needs", max(getattr(args, "lengths", None) or [0]), ""),
              ("--pairs needs", max((i + o - 1 for i, o in getattr(args, "pairs", None) or []), default=0), ""),
              ("--fit needs", max((i + o - 1 for i, o in getattr(args, "fit", None) or []), default=0), "")]
    if hasattr(args, "steps"):  # a --steps past the warm-up's is named too (was: "--contexts needs" at any context)
        checks.insert(1, ("--contexts and --steps need", context + steps, f" (a context of {context}, then {steps} "
                                                                          "steps)")
                      if args.steps > DECODE_WARMUP else
                      ("--contexts needs", context + steps, f" (a context of {context}, then {steps} warm-up steps)"))
    for opt, need, why in checks:
        if need > limit:
            raise ValueError(f"{opt} positions 0..{need - 1}, beyond {src}{why}")


def memory_needed(args, dtype):
    """What the run holds at once on its device, lower bounds (weights and caches, no activations):
    ``(weights, parts)``, ``weights`` the model's bytes, ``parts`` what a section allocates beside
    them, one at a time, largest first: dicts of ``bytes``, ``what``, and for a cache ``rows`` (the
    option and its value, or ``None`` for one row), ``tokens`` (a row's), ``src`` (the options that
    give them, as typed) and ``row_bytes(L)`` (one row of ``L`` tokens). Sized on the meta device:
    nothing is allocated."""
    from ..engine.cache import StaticKVCache, linear_layers
    from .inference import DECODE_WARMUP
    from .models import hf_qwen3_like, meta_model

    model = meta_model(args.preset, path=args.model, dtype=dtype, window_size=args.window)
    cfg, linear = model.config, linear_layers(model)
    nbytes = lambda m: sum(p.numel() * p.element_size() for p in m.parameters())  # noqa: E731

    def row_bytes(L):
        c = StaticKVCache(cfg.num_hidden_layers, 1, L, cfg.num_key_value_heads, cfg.head_dim, dtype=dtype,
                          device="meta", linear=linear)
        return c.nbytes + c.state_nbytes

    def cache(rows, tokens, src, limit, least=1):  # limit(n): what the option may be for rows of n tokens at most;
        return {"bytes": (rows[1] if rows else 1) * row_bytes(tokens), "what": "the cache", "rows": rows,  # least:
                "tokens": tokens, "src": src, "row_bytes": row_bytes, "limit": limit, "least": least}  # shortest row

    def pair_limit(opt):  # a pair's row holds IN+OUT-1 tokens (its last token is never cached)
        return lambda n: f"lower {opt} to IN+OUT at most {n + 1}"

    parts = []
    for what in _sections(args.what):
        if what == "prefill":  # one row of the longest prompt; the HF baseline: a second model
            systems = [x for x in args.systems.split(",") if x]
            if any(not x.startswith("hf-") for x in systems):
                parts.append(cache(None, max(args.lengths), f"--lengths {max(args.lengths)}",
                                   lambda n: f"lower --lengths to at most {n}"))
            hf = [x for x in dict.fromkeys(systems) if x.startswith("hf-")]
            if hf:
                parts.append({"bytes": nbytes(hf_qwen3_like(cfg, device="meta", dtype=dtype)),
                              "what": f"the HF baseline's own weights ({', '.join(hf)} in --systems)"})
        elif what == "decode":  # a point's steps (warm-up, then timed) each run from the context
            steps = max(args.steps, DECODE_WARMUP)
            src = f"--contexts {max(args.contexts)} + {steps} {'' if args.steps >= DECODE_WARMUP else 'warm-up '}steps"
            parts.append(cache(("--batch-sizes", max(args.batch_sizes)), max(args.contexts) + steps, src,
                               lambda n, s=steps: f"lower --contexts to at most {n - s} (a row holds the context "
                                                  f"and {s} steps)", least=1 + steps))
        else:  # e2e: --batch rows of the longest pair; each --fit: one row
            i, o = max(args.pairs, key=lambda p: p[0] + p[1])
            parts.append(cache(("--batch", args.batch), i + o - 1, f"--pairs {i}:{o}", pair_limit("--pairs")))
            parts += [cache(None, i + o - 1, f"--fit {i}:{o}", pair_limit("--fit")) for i, o in args.fit or []]
    return nbytes(model), sorted(parts, key=lambda p: -p["bytes"])


def check_memory(args, dev, dtype, available=None) -> None:
    """Refuse, before the model is built, a run whose weights and largest cache (:func:`memory_needed`,
    lower bounds) cannot fit the memory free on ``dev`` (``available(device)``, default
    :func:`orthros.utils.available_memory`; ``None``: unknown, not checked): ``ValueError`` naming
    the options that size it and what fits (was: a torch allocator error once the run got there)."""
    from ..utils import available_memory, format_bytes

    free = (available or available_memory)(str(dev))
    if free is None:
        return
    weights, parts = memory_needed(args, dtype)
    where = "host" if dev.type == "cpu" else str(dev)
    if weights > free:
        raise ValueError(f"the model's weights take {format_bytes(weights)} of {where} memory, more than the "
                         f"{format_bytes(free)} free: choose a smaller --preset, --model or --dtype")
    if not parts or weights + parts[0]["bytes"] <= free:
        return
    p, room = parts[0], free - weights
    said = (f"this run needs at least {format_bytes(weights + p['bytes'])} of {where} memory, more than the "
            f"{format_bytes(free)} free: the model's weights take {format_bytes(weights)} and {p['what']}")
    if "rows" not in p:
        raise ValueError(f"{said} another {format_bytes(p['bytes'])}; drop them from --systems")
    rows, L, row_bytes = p["rows"], p["tokens"], p["row_bytes"]
    sized = f"{rows[1]} rows ({rows[0]} {rows[1]})" if rows and rows[1] > 1 else f"a row ({rows[0]} 1)" if rows \
        else "a row"
    said += f" of {sized} of {L} tokens ({p['src']}) takes {format_bytes(p['bytes'])}"
    if rows and rows[1] > 1 and row_bytes(L) <= room:
        n = room // row_bytes(L)
        raise ValueError(f"{said}; at most {n} row{'s' if n > 1 else ''} of {L} tokens "
                         f"fit{'' if n > 1 else 's'}: lower {rows[0]} to at most {n}")
    lo, hi = 0, L - 1  # the longest row that fits (a row's bytes grow with its tokens)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if row_bytes(mid) <= room else (lo, mid - 1)
    if lo < p["least"]:  # (decode: even --contexts 1 has its steps)
        least = ("one token" if p["least"] == 1 else
                 f"{p['least']} tokens (a context of 1 and {p['src'].split(' + ')[-1]})")
        raise ValueError(f"{said}; not even a row of {least} fits beside the weights")
    # what the option itself may be (a row holds more than it says: a decode point's steps, a pair's IN+OUT-1)
    raise ValueError(f"{said}; a row of at most {lo} tokens fits: {p['limit'](lo)}"
                     + (f" and {rows[0]} to 1" if rows and rows[1] > 1 else ""))

def _run_section(what, args, model, dev, dtype, I, hf_qwen3_like):
    from ..kinds import LINEAR_LAYER_TYPE

    json_path, png_path = _outputs(args.out, what)
    meta = I.metadata(model, dev, dtype, {"preset": None if args.model else args.preset, "model_path": args.model,
                                          "compile": args.compile})
    if what != "decode":  # the options the section's timings depend on (prefill and e2e run chunked prefills)
        meta["chunk"] = args.chunk
    if what != "prefill":
        meta["no_cuda_graphs"] = args.no_cuda_graphs
    hf = [x for x in getattr(args, "systems", "").split(",") if x.startswith("hf-")]
    if hf and LINEAR_LAYER_TYPE in (getattr(model.config, "layer_types", None) or []):
        # hf_qwen3_like builds an all-attention Qwen3 of the checkpoint's sizes: the ratio is then across layer kinds
        meta["hf_baseline"] = ("an all-attention Qwen3 of the checkpoint's sizes: its Gated DeltaNet layers are "
                               "attention layers there")
        print(f"orthros bench: note: {', '.join(hf)} time {meta['hf_baseline']}", file=sys.stderr)
    with I.CompileFallbacks() as fallbacks:
        if args.compile:  # the live list: pieces that fell back to eager show up in every save
            meta["compile_failures"] = fallbacks
        _run_measurements(what, args, model, dev, dtype, I, hf_qwen3_like, meta, json_path, png_path)


def _run_measurements(what, args, model, dev, dtype, I, hf_qwen3_like, meta, json_path, png_path):
    """Section ``what``'s sweep, its JSON saved after every point. A sweep stopped early (Ctrl-C,
    SIGTERM, a failure) keeps its points, marked: ``meta["stopped"]`` says why, and a line on stderr
    says where they are (a stopped sweep's JSON looked like a finished one of fewer points). The
    section's plot is drawn once the sweep is whole: an earlier run's goes when the first point is
    saved."""
    rows, measured = [], []
    try:
        _measure(what, args, model, dev, dtype, I, hf_qwen3_like, meta, json_path, png_path, rows, measured)
    except BaseException as e:
        if rows and not measured:  # (a failure in the table or plot after the sweep: the JSON is whole)
            from ..utils import Terminated

            meta["stopped"] = ("interrupted (Ctrl-C)" if isinstance(e, KeyboardInterrupt) else "terminated (SIGTERM)"
                               if isinstance(e, Terminated) else f"{type(e).__name__}: {e}")
            I.save(json_path, meta, rows)
            print(f"orthros bench: stopped early: the {len(rows)} points measured so far are in {json_path} "
                  f"(its meta has \"stopped\")", file=sys.stderr, flush=True)
        raise


def _measure(what, args, model, dev, dtype, I, hf_qwen3_like, meta, json_path, png_path, rows, measured):
    """The sweep (``rows`` filled and saved point by point; ``measured`` gets an item once it is whole),
    then its table and plot."""
    def checkpoint(row):  # keep partial results if a long run dies
        if not rows and not written_in_place(png_path):  # this run's JSON replaces an earlier run's: so does
            with contextlib.suppress(FileNotFoundError):  # its plot (an earlier one drew other points; was kept
                os.remove(png_path)  # beside a stopped sweep's JSON)
        rows.append(row)
        I.save(json_path, meta, rows)

    graphs = False if getattr(args, "no_cuda_graphs", False) else None
    if what == "prefill":
        systems = [s for s in args.systems.split(",") if s]
        I.bench_prefill(model, args.lengths, systems=systems, chunk=args.chunk, budget_s=args.budget_s,
                        single_shot_s=args.single_shot_s, hf_model_fn=lambda: hf_qwen3_like(model.config, device=dev, dtype=dtype), on_row=checkpoint,
                        compile=args.compile)
        summary = I.prefill_summary(rows)
        I.save(json_path, meta, rows + [{"summary": summary}])
        measured.append(True)
        I.print_table(rows, ["system", "T", "ms", "n", "peak_gib", "kv_cache_gib"]
                      + (["error"] if any("error" in r for r in rows) else []), "prefill (ms)")
        cols = ["T"] + [s for s in I.PREFILL_SYSTEMS if s in systems] + \
               [c for c in ("hf-floor/orthros", "hf-sdpa/orthros", "full/orthros", "orthros-floor/orthros")
                if any(c in r for r in summary)]
        I.print_table(summary, cols, "prefill summary (ratios > 1: Orthros faster)")
        I.plot_prefill(rows, png_path, f"Prefill, {meta['device']}, {meta['dtype']}")
    elif what == "decode":
        I.bench_decode(model, args.contexts, batch_sizes=args.batch_sizes, steps=args.steps, cuda_graphs=graphs,
                       on_row=checkpoint, compile=args.compile)
        I.save(json_path, meta, rows)
        measured.append(True)
        I.print_table(rows, ["mode", "B", "L", "ms_per_step", "tokens_per_s", "hbm_floor_ms", "frac_of_floor",
                             "vs_full"],
                      "decode step (vs_full: Orthros's step / the Transformer's, > 1: Orthros slower)")
        I.plot_decode(rows, png_path, f"Decode, {meta['device']}, {meta['dtype']}")
    else:
        I.bench_e2e(model, args.pairs, batch=args.batch, chunk=args.chunk, cuda_graphs=graphs, on_row=checkpoint,
                    compile=args.compile)
        if args.fit:
            for n_in, n_out in args.fit:
                fit = I.fit_check(model, n_in, n_out, chunk=args.chunk, compile=args.compile, cuda_graphs=graphs)
                rows.append({"fit": fit})
                I.print_table([fit], list(fit), "fit check")
        I.save(json_path, meta, rows)
        measured.append(True)
        I.print_table([r for r in rows if "mode" in r], ["mode", "batch", "in", "out", "ttft_s", "e2e_s",
                                                         "output_tok_s", "decode_tok_s"], "end-to-end")
        I.plot_e2e([r for r in rows if "mode" in r], png_path, f"End-to-end, batch {args.batch}, {meta['device']}")
    print(f"\nwrote {json_path} and {png_path}")


if __name__ == "__main__":
    sys.exit(main())

"""Orthros-H vs the Linear Hybrid (paper Section 4.6, Table 4) next to Orthros vs the Transformer,
in one run on one GPU (random weights: latency does not depend on weight values).

* Orthros-H: the Qwen3.5-9B text shape (transformers' ``Qwen3_5TextConfig`` defaults: 32 layers,
  GDN:attention 3:1, hidden 4096, gated attention 16 q / 4 kv heads of 256, partial RoPE 0.25,
  GDN 16 k / 32 v heads of 128, conv 4), with Orthros attention (window 128). The Linear Hybrid
  is the SAME model run by the engine in ``attention_mode="full"`` (plain causal attention in
  the attention layers, no output stream): same weights, same engine.
* Orthros / Transformer: the Qwen3-8B shape (``orthros.benchmarks.models``), modes
  ``"orthros"`` / ``"full"`` of one model, as in docs/benchmarks.md.

Sections (each one's rows are saved as soon as measured): ``prefill`` (latency, 8K-128K),
``decode`` (step latency at a context, batch 2), ``e2e`` (Table 4: batch 2, greedy, TTFT, E2E,
output and decode-only throughput).

    python benchmarks/hybrid.py --out results.json [--sections prefill,decode,e2e]
        [--prefill 8192,32768,131072] [--prefill-chunk 16384] [--pairs 128:128,1024:1024,8192:1024] [--compile] [--tiny]

``--compile``: the engine's compiled path (``Engine(compile=True)``: torch.compile of the token-wise
layer parts, as docs/benchmarks.md's Orthros engine figures) for every system of the run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from orthros.benchmarks.cli import int_list, pair_list  # noqa: E402
from orthros.benchmarks.inference import bench_decode, bench_e2e, bench_prefill, metadata  # noqa: E402
from orthros.benchmarks.models import PRESETS, orthros_model  # noqa: E402
from orthros.utils import check_output_path, write_json  # noqa: E402

DECODE_STEPS, DECODE_WARMUP = 40, 5  # the decode section's timed and untimed steps after its context
# the lengths' defaults: (the GPU run's, --tiny's). A --tiny run is a CPU smoke run: the GPU defaults
# take minutes there, and 128K is past the tiny models' 64K positions. A value given is run.
PRESETS_OF = {"hybrid": ("qwen3.5-9b", "tiny-h"), "transformer": ("qwen3-8b", "tiny")}  # (GPU, --tiny) models
LENGTH_DEFAULTS = {"prefill": ([8192, 32768, 131072], [256, 1024]), "decode_context": (8192, 256),
                   "pairs": ([(128, 128), (1024, 1024), (8192, 1024)], [(16, 8), (64, 16)])}

def run_mqar_section(emit, steps: int, device, compile: bool = False, jobs: int = 1):
    """MQAR with every gap past the window (paper Section 4.4's task; docs/evaluation.md):
    Orthros-H, Linear Hybrid, GDN and Transformer, 4 layers each, identical data, steps and
    learning rate. The setting is the one where pure GDN falls far below the Transformer
    (docs/evaluation.md, "Compiled on the GPU": 2.6% vs 100% at 4000 steps): T=32, 4 pairs,
    window 4, min gap 4, a GDN state of 64 heads of 1 x 1. ``compile``: each model's training
    step through torch.compile (``MQARTrain.compile``); ``jobs``: models trained at once, one
    process each (``run_mqar(jobs=...)``)."""
    from orthros.evaluation.mqar import MQARTask, MQARTrain, format_table, run_mqar

    task = MQARTask(vocab_size=64, seq_len=32, num_pairs=4, power=1.0, min_gap=4)
    tr = MQARTrain(models=("orthros-h", "linear-hybrid", "gdn", "transformer"), hidden_size=64, num_layers=4,
                   num_heads=2, linear_heads=64, window_size=4, steps=steps, batch_size=64, lr=1e-3, eval_examples=1000,
                   device=str(device), compile=compile)
    out = run_mqar(task, tr, progress=False, jobs=jobs)
    print(format_table(out), flush=True)
    for r in out["results"]:
        emit({**r, "task": out["task"], "train": out["train"], "eval_gap_stats": out["eval_gap_stats"]})


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--sections", default="prefill,decode,e2e,mqar")
    ap.add_argument("--prefill", type=int_list, default=None,
                    help="prompt lengths, comma list (default 8192,32768,131072; 256,1024 with --tiny)")
    ap.add_argument("--prefill-chunk", type=int, default=16384,
                    help="the Orthros systems' prefill chunk, prefill and e2e sections (0: the whole prompt in one "
                         "call, like the Linear Hybrid)")
    ap.add_argument("--decode-context", type=int, default=None, help="decode section's context (default 8192; "
                    "256 with --tiny)")
    ap.add_argument("--pairs", type=pair_list, default=None, help="e2e section's IN:OUT lengths, comma list (default "
                    "128:128,1024:1024,8192:1024; 16:8,64:16 with --tiny)")
    ap.add_argument("--families", default="hybrid,transformer",
                    help="hybrid (Orthros-H vs Linear Hybrid), transformer (Orthros vs Transformer), or both")
    ap.add_argument("--mqar-steps", type=int, default=None, help="mqar section: training steps (default 4000; 8 with "
                    "--tiny)")
    ap.add_argument("--mqar-compile", action="store_true",
                    help="mqar section: train through torch.compile (MQARTrain.compile; same run, fewer launches)")
    ap.add_argument("--mqar-jobs", type=int, default=1,
                    help="mqar section: train up to this many of the four models at once, one process each")
    ap.add_argument("--deadline", type=float, default=None, help="seconds: skip the sections that start later")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes (CPU smoke run of this script)")
    ap.add_argument("--compile", action="store_true", help="the compiled engine (Engine(compile=True)) for every system")
    args = ap.parse_args(argv)
    sections = [s for s in args.sections.split(",") if s]
    bad = [s for s in sections if s not in ("prefill", "decode", "e2e", "mqar")]
    if bad:
        ap.error(f"--sections: unknown {bad}; choose from prefill, decode, e2e, mqar")
    families = [f for f in args.families.split(",") if f]
    if not families or any(f not in ("hybrid", "transformer") for f in families):
        ap.error(f"--families: {args.families!r}; choose from hybrid, transformer (comma-separated)")
    if args.mqar_steps is None:  # --tiny's default only: a number given is run
        args.mqar_steps = 8 if args.tiny else 4000
    for name, defaults in LENGTH_DEFAULTS.items():  # as --mqar-steps: --tiny's defaults only
        if getattr(args, name) is None:
            setattr(args, name, defaults[args.tiny])
    for name in ("mqar_steps", "mqar_jobs", "decode_context"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')}: {getattr(args, name)}; must be >= 1")
    if args.prefill_chunk < 0:
        ap.error(f"--prefill-chunk: {args.prefill_chunk}; give a positive chunk length, or 0 for unchunked")
    if args.deadline is not None and not args.deadline >= 0:
        ap.error(f"--deadline: {args.deadline}; give seconds >= 0")
    lengths, pairs, chunk = args.prefill, args.pairs, args.prefill_chunk or None
    if not any(s in sections for s in ("prefill", "decode", "e2e")):
        families = []  # MQAR alone trains its own tiny models: do not build the 9B-shape ones
    if families and not args.tiny and not torch.cuda.is_available():  # the 9B / 8B shapes in fp32: 32+ GiB
        ap.error("no CUDA device here: pass --tiny for a CPU smoke run (the benchmark models are the Qwen3.5-9B / "
                 "Qwen3-8B shapes, a GPU measurement), or run --sections mqar alone")
    for fam in families:  # the positions each section runs through, against the model's (the engine refuses more)
        preset = PRESETS_OF[fam][args.tiny]
        limit = PRESETS[preset]["max_position_embeddings"]
        decode_need = args.decode_context + max(DECODE_STEPS, DECODE_WARMUP)  # each from the context
        for opt, section, need in (("--prefill", "prefill", max(lengths)), ("--decode-context", "decode", decode_need),
                                   ("--pairs", "e2e", max(i + o - 1 for i, o in pairs))):
            if section in sections and need > limit:
                ap.error(f"{opt} needs positions 0..{need - 1} in the {section} section, beyond "
                         f"max_position_embeddings={limit} of the {fam} family's model ({preset})")
    try:
        check_output_path("--out", args.out)
    except ValueError as e:
        ap.error(str(e))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    out = {"sections": {}, "errors": {}, "skipped": [], "seconds": {}}
    t_start = time.perf_counter()

    def save():
        write_json(args.out, out, indent=1, default=str)

    def section(name, fn):
        if args.deadline is not None and time.perf_counter() - t_start > args.deadline:
            out["skipped"].append(name)
            print(f"[{name}] skipped (past the deadline)", flush=True)
            return
        t = time.perf_counter()
        try:
            rows = out["sections"].setdefault(name, [])
            fn(lambda r: (rows.append(r), save()))
        except Exception as e:  # keep what was measured; say what failed
            import traceback

            traceback.print_exc()
            out["errors"][name] = f"{type(e).__name__}: {e}"
        out["seconds"][name] = round(time.perf_counter() - t, 1)
        print(f"[{name}] {out['seconds'][name]} s", flush=True)
        save()

    models, labels = {}, {}
    if "hybrid" in families:
        models["hybrid"] = orthros_model(PRESETS_OF["hybrid"][args.tiny], device=device, dtype=dtype)
        labels["hybrid"] = {"orthros": "Orthros-H", "full": "Linear Hybrid"}
    if "transformer" in families:
        models["transformer"] = orthros_model(PRESETS_OF["transformer"][args.tiny], device=device, dtype=dtype)
        labels["transformer"] = {"orthros": "Orthros", "full": "Transformer"}
    for fam, model in models.items():
        out.setdefault("meta", {})[fam] = metadata(model, device, dtype, {"labels": labels[fam],
                                                                         "layer_types": model.config.layer_types,
                                                                         "compile": args.compile})

    def tag(fam):
        return lambda r: {**r, "family": fam, "system_label": labels[fam].get(r.get("system", r.get("mode")), "?")}

    for fam in families:
        model, t = models[fam], tag(fam)
        if "prefill" in sections:
            systems = ("orthros", "full") if fam == "hybrid" else ("orthros",)
            section(f"prefill_{fam}", lambda emit, model=model, t=t, systems=systems: bench_prefill(
                model, lengths, systems=systems, chunk=chunk, budget_s=2.0, single_shot_s=60.0,
                on_row=lambda r: emit({**t(r), "prefill_chunk": None if r.get("system") == "full" else chunk}), compile=args.compile))
        if "decode" in sections:
            section(f"decode_{fam}", lambda emit, model=model, t=t: bench_decode(
                model, [args.decode_context], batch_sizes=(2,), steps=DECODE_STEPS, warmup=DECODE_WARMUP, on_row=lambda r: emit(t(r)),
                compile=args.compile))
    if "e2e" in sections:
        for fam in families:
            model, t = models[fam], tag(fam)
            section(f"e2e_{fam}", lambda emit, model=model, t=t: bench_e2e(model, pairs, batch=2, chunk=chunk,
                                                                        on_row=lambda r: emit(
                {**t(r), "prefill_chunk": None if r.get("mode") == "full" else chunk}), compile=args.compile))
    del models
    import gc

    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    if "mqar" in sections:
        section("mqar", lambda emit: run_mqar_section(emit, args.mqar_steps, device,
                                                            compile=args.mqar_compile, jobs=args.mqar_jobs))
    out["total_seconds"] = round(time.perf_counter() - t_start, 1)
    save()
    print(json.dumps({k: out[k] for k in ("errors", "skipped", "seconds", "total_seconds")}), flush=True)


if __name__ == "__main__":
    main()

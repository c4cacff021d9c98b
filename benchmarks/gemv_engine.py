"""The fused GEMV's launch configs judged inside the engine's decode step (issue #18).

``benchmarks/gemv.py --fused --sweep`` times each site's GEMV alone (one shape, its weight past
L2, no kernel ahead of it). Inside the step each GEMV starts while the kernel ahead still runs
(PDL), with part of its weight already asked of L2, so the two rankings can differ: on an H100
(2026-12-05, docs/results/s37-2026-12-05/) the sweep's M = 2 gate/up winner was 3 us faster
alone and made the pair's step 0.37 ms slower. Here one engine per mode runs its CUDA-graphed
step with each candidate config for one site's exact shape (``kernel.configs_overridden``; every
other GEMV keeps its ``CONFIGS`` row; the graph is captured again for each), in rounds whose
order rotates, so drift spreads over all candidates, and the table's own config is timed in
every round as the baseline.

    python benchmarks/gemv_engine.py --site gate_up --configs "table;2x1024 defer w16 st1;4x2048 defer w8 st3" \\
        [--modes orthros,full] [--rounds 4] [--steps 30] [--context 1024] [--eager] --out results.json
    python benchmarks/gemv_engine.py --device cpu --preset tiny --backend triton ...   # smoke run (interpreter)

A mode's rows ``M`` = batch x (2 for the Orthros pair, 1 for the Transformer's token). Prints per
mode and candidate the median step time, its ratio to the table's in the same round (median over
rounds), and the winner as a ``CONFIGS`` row; writes the JSON (meta: date, GPU, commit,
versions, arguments; a row per timing) after every mode, atomically. Bad arguments exit 2
before any model is built.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from orthros.utils import Progress, write_json  # noqa: E402  (imports no torch: arguments first)

SITES = ("qkv", "o", "gate_up", "down", "lm_head")
MODES = ("orthros", "full")


def site_shape(config, site: str):
    """``(N, K)`` of ``site``'s fused weight in a model of ``config`` (a dict of its fields)."""
    h, d = config["hidden_size"], config["head_dim"]
    return {"qkv": ((config["num_attention_heads"] + 2 * config["num_key_value_heads"]) * d, h),
            "o": (h, config["num_attention_heads"] * d),
            "gate_up": (2 * config["intermediate_size"], h),
            "down": (h, config["intermediate_size"]),
            "lm_head": (config["vocab_size"], h)}[site]


TABLE_EF = "table ef"  # a candidate: the table's config with its weight loads evict_first


def resolve(candidate, table):
    """The config a candidate runs: the table's for ``None``, the table's with ``evict_first`` for
    :data:`TABLE_EF`, else the candidate itself."""
    if candidate is None:
        return table
    if candidate == TABLE_EF:
        return dataclasses.replace(table, evict_first=True)
    return candidate


def cache_slots(a) -> int:
    """The engine's slots a row: the warm-up's steps and the timed ones each run from ``--context``."""
    return a.context + max(a.warmup, a.steps)


def parse_args(argv=None):
    from orthros.benchmarks.models import PRESETS

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--site", required=True, choices=SITES, help="the GEMV whose config is varied")
    p.add_argument("--configs", required=True,
                   help="';'-separated candidates: 'table' (the CONFIGS row, timed anyway), 'table ef' (that row "
                        "with its weight loads evict_first) or a config label "
                        "'<block_n>x<block_k> [s<split>] [dot|defer|fma] [w<warps>] [st<stages>] [ef]'")
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated subset of {','.join(MODES)}")
    p.add_argument("--rounds", type=int, default=4, help="rounds over every candidate (default 4)")
    p.add_argument("--steps", type=int, default=30, help="timed decode steps a candidate and round (default 30)")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps before them, the capture's among them")
    p.add_argument("--context", type=int, default=1024, help="tokens in the cache (default 1024)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--preset", default="qwen3-8b", choices=list(PRESETS))
    p.add_argument("--eager", action="store_true",
                   help="no torch.compile (default on a CPU); on CUDA the engine's compiled step, as the roofline's")
    p.add_argument("--backend", default="auto", choices=("auto", "triton"),
                   help="Engine(gemv=...): auto (default; on a CPU the torch ops, which take no config) or "
                        "triton (on a CPU the interpreter: a smoke run)")
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu (a smoke run)")
    p.add_argument("--out", required=True, help="JSON path")
    a = p.parse_args(argv)
    a.argv = list(sys.argv[1:] if argv is None else argv)
    for name in ("rounds", "steps", "context", "batch"):
        if getattr(a, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(a, name)}")
    if a.warmup < 1:
        p.error(f"--warmup must be >= 1 (the first step captures the graph), got {a.warmup}")
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    if not modes or any(m not in MODES for m in modes) or len(set(modes)) != len(modes):
        p.error(f"--modes must be a comma-separated subset of {','.join(MODES)}, got {a.modes!r}")
    a.modes = modes
    limit = PRESETS[a.preset]["max_position_embeddings"]
    if a.context + max(a.warmup, a.steps) > limit:  # was: Engine's refusal, after the model was built
        p.error(f"--context {a.context}: its steps (--warmup {a.warmup}, then --steps {a.steps}, each from --context) "
                f"reach position {a.context + max(a.warmup, a.steps) - 1}, beyond max_position_embeddings={limit} "
                f"of --preset {a.preset}: give --context <= {limit - max(a.warmup, a.steps)}")
    if os.path.isdir(a.out) or not a.out.endswith(".json"):
        p.error(f"--out must be a .json file path, got {a.out!r}")
    if a.device == "cpu":  # the kernel runs in the Triton interpreter (set before triton loads)
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from orthros.utils import check_device, check_output_path

    try:  # were: torch's AssertionError (no CUDA) or RuntimeError ('cuda:x'), the JSON's after the run
        a.device = check_device(a.device)
        check_output_path("--out", a.out)
    except ValueError as e:
        p.error(str(e))
    a.compile = a.device != "cpu" and not a.eager
    from orthros.ops.gemv.kernel import MAX_M, GemvConfig, norm_out_fused, pick_config, configs_overridden

    labels = [" ".join(c.split()) for c in a.configs.split(";") if c.strip()]
    a.candidates = {"table": None}  # label -> config (None: the table's; TABLE_EF: it with evict_first), the table first
    for text in labels:
        if text == "table":
            continue
        if text == TABLE_EF:
            a.candidates[text] = TABLE_EF
            continue
        try:
            cfg = GemvConfig.parse(text)
        except ValueError as e:
            p.error(f"--configs: {e}")
        a.candidates.setdefault(cfg.label, cfg)
    if len(a.candidates) < 2:
        p.error(f"--configs {a.configs!r}: name at least one config besides 'table'")
    from orthros.benchmarks.models import PRESETS as presets

    a.N, a.K = site_shape(presets[a.preset], a.site)
    a.M = {m: a.batch * (2 if m == "orthros" else 1) for m in a.modes}
    for mode, M in a.M.items():
        if M > MAX_M:
            p.error(f"--batch {a.batch}: the {mode} step's {M} GEMV rows exceed the fused GEMV's {MAX_M}")
        table_fused = norm_out_fused(M, a.N, a.K)
        for label, cfg in a.candidates.items():
            with configs_overridden({(M, a.N, a.K): resolve(cfg, pick_config(M, a.N, a.K))}):
                if norm_out_fused(M, a.N, a.K) != table_fused:
                    p.error(f"--configs {label!r}: at M = {M} it {'drops' if table_fused else 'adds'} the split-K "
                            f"reduce that computes the next norm, which the compiled step decides when it is traced")
    return a


def run(a) -> int:
    import torch

    from orthros.benchmarks.inference import copy_bandwidth, script_meta, time_call
    from orthros.benchmarks.models import orthros_model, weight_bytes_per_step
    from orthros.engine import Engine
    from orthros.ops.gemv.kernel import configs_overridden, pick_config

    dev = torch.device(a.device)
    model = orthros_model(a.preset, device=dev, dtype=torch.bfloat16 if dev.type == "cuda" else torch.float32)
    bw = copy_bandwidth(dev) if dev.type == "cuda" else None
    meta = {**script_meta(dev, a.argv), "site": a.site, "N": a.N, "K": a.K, "context": a.context,
            "batch": a.batch, "compile": a.compile, "backend": a.backend, "steps": a.steps, "rounds": a.rounds,
            "copy_bw_tb_s": bw and bw / 1e12, "weight_bytes": weight_bytes_per_step(model)}
    rows, summary = [], []
    labels = list(a.candidates)
    bar = Progress(len(a.modes) * a.rounds * len(labels), "gemv-engine", unit="timing")
    toks = torch.ones(a.batch, dtype=torch.long, device=dev)
    for mode in a.modes:
        M, shape = a.M[mode], (a.M[mode], a.N, a.K)
        table = pick_config(*shape)
        eng = Engine(model, max_batch_size=a.batch, max_seq_len=cache_slots(a),
                     attention_mode=mode, compile=a.compile, gemv=a.backend if a.backend != "auto" else True)
        for r in range(a.rounds):
            for i in range(len(labels)):
                label = labels[(i + r) % len(labels)]  # each round starts one candidate later
                cfg = resolve(a.candidates[label], table)
                with configs_overridden({shape: cfg}):
                    eng.drop_graphs()  # the next step captures with this config
                    eng.set_lengths([a.context] * a.batch)
                    for _ in range(a.warmup):
                        eng.step(toks)
                    eng.set_lengths([a.context] * a.batch)
                    dt = time_call(lambda: [eng.step(toks) for _ in range(a.steps)], dev)
                    used = pick_config(*shape)
                if used != cfg:  # the override did not reach the kernel's lookup: the timing names the wrong config
                    raise RuntimeError(f"{mode}: the step ran {used.label} at {shape}, not {cfg.label}")
                rows.append({"mode": mode, "M": M, "round": r, "candidate": label, "config": cfg.label,
                             "ms_per_step": 1000 * dt / a.steps})
                bar.update(1, line=True, **{"mode": mode, "config": cfg.label, "ms": f"{1000 * dt / a.steps:.3f}"})
        del eng
        summary += summarize([x for x in rows if x["mode"] == mode], mode, table)
        write_json(a.out, {"meta": meta, "rows": rows, "summary": summary}, indent=1)
    bar.close()
    print_summary(meta, summary)
    print(f"wrote {a.out}")
    return 0


def summarize(rows, mode, table):
    """Per candidate: median ms over the rounds and the median of its ratio to the table's in the
    same round (< 1: faster than the table)."""
    base = {x["round"]: x["ms_per_step"] for x in rows if x["candidate"] == "table"}
    out = []
    for label in dict.fromkeys(x["candidate"] for x in rows):
        mine = [x for x in rows if x["candidate"] == label]
        out.append({"mode": mode, "M": mine[0]["M"], "candidate": label, "config": mine[0]["config"],
                    "ms_median": statistics.median(x["ms_per_step"] for x in mine),
                    "ms_min": min(x["ms_per_step"] for x in mine),
                    "vs_table": statistics.median(x["ms_per_step"] / base[x["round"]] for x in mine),
                    "table": table.label})
    best = min(out, key=lambda s: s["vs_table"])
    for s in out:
        s["best"] = s is best
    return out


def print_summary(meta, summary):
    print(f"\n{meta['site']} ({meta['N']} x {meta['K']}) inside the decode step at {meta['context']} tokens, "
          f"{meta['device']}, commit {meta['commit']}")
    print(f"{'mode':8s} {'M':>2s}  {'candidate':26s} {'ms median':>9s} {'ms min':>8s} {'vs table':>8s}")
    for s in summary:
        print(f"{s['mode']:8s} {s['M']:2d}  {s['config'] + (' (table)' if s['candidate'] == 'table' else ''):26s} "
              f"{s['ms_median']:9.3f} {s['ms_min']:8.3f} {s['vs_table']:8.4f}{'  <- best' if s['best'] else ''}")
    for s in summary:
        if s["best"] and s["candidate"] != "table":
            print(f"   {s['mode']}: as a CONFIGS row for this shape: ({s['M']}, {meta['N']}, {meta['K']}, "
                  f"GemvConfig.parse({s['config']!r}))")


def main(argv=None) -> int:
    return run(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())

"""The summary of an interleaved A/B of decode steps (issue #18): every ``OUT/<i>-<setting>/``
folder of a GPU script holds one process's ``roofline.py`` results.json; this prints, for each
(system, context, setting), the median ms a step over its processes, the processes' own times,
and the difference and ratio against the ``--base`` setting of the same system and context.

    python benchmarks/ab_summary.py OUT [--base off]

Used by ``benchmarks/pdl_gpu.sh`` and the A/B scripts kept with the results in docs/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys


def collect(out: str) -> dict:
    """``{(system, context, setting): [ms a step, one a process]}`` from ``out/<i>-<setting>/results.json``
    (folders in name order; a folder without results.json, e.g. a process stopped by its limit,
    is passed over)."""
    runs = {}
    for d in sorted(os.listdir(out)):
        path = os.path.join(out, d, "results.json")
        if "-" not in d or not os.path.isfile(path):
            continue
        with open(path) as f:
            rows = json.load(f).get("rows", [])
        for r in rows:
            if "ms_per_step" in r:
                runs.setdefault((r["system"], r.get("L"), d.split("-", 1)[1]), []).append(r["ms_per_step"])
    return runs


def lines(runs: dict, base: str) -> list:
    out = []
    for (s, L, v), ms in sorted(runs.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0, kv[0][2])):
        med = statistics.median(ms)
        ref = runs.get((s, L, base))
        rel = f"  {med - statistics.median(ref):+.3f} ms, {med / statistics.median(ref):.4f}x {base}" if ref else ""
        out.append(f"  {s:13s} L={L or 0:6d} {v:15s} {med:.3f} ms ({', '.join(f'{m:.3f}' for m in ms)}){rel}")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="the GPU script's output folder (its <i>-<setting>/results.json)")
    ap.add_argument("--base", default="off", help="the setting the others are compared with (default: off)")
    a = ap.parse_args(argv)
    if not os.path.isdir(a.out):
        ap.error(f"out must be a folder, got {a.out!r}")
    runs = collect(a.out)
    if not runs:
        sys.exit(f"ab_summary.py: no <i>-<setting>/results.json with decode steps under {a.out!r}")
    print("median ms a step by setting (processes):")
    print("\n".join(lines(runs, a.base)))


if __name__ == "__main__":
    main()

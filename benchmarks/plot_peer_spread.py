"""Issue #18, target 1 across processes: the B = 1 decode step of Orthros and of gpt-fast at one
context, each process its own point (``roofline.py`` results.json files that hold both rows), and
the ratio against the 1.2x target (against gpt-fast's fastest setup where the run timed several:
``roofline.py --gpt-fast-setups``, their range drawn as a bar). gpt-fast's step varies between
processes much more than ours, and with the same kernels and tuned configs: it depends on where
its CUDA graph's buffers land, mostly through its down projection (docs/results/s38-2026-12-05/).
One process says little about the ratio.

    python benchmarks/plot_peer_spread.py RESULTS_JSON [RESULTS_JSON ...] --out PNG [--system orthros+gemv]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

from orthros.utils import save_figure  # noqa: E402
from plot_probe_cells import check_inputs  # noqa: E402


def points(paths, system, context):
    """(label, ours ms, gpt-fast ms, gpt-fast's setups ms) of every file holding both rows at B = 1
    and ``context``; the setups are ``roofline.py --gpt-fast-setups``' (the row is the fastest),
    ``[]`` for a run of one setup. ``ValueError`` naming a file that is not a results.json."""
    out = []
    for path in paths:
        try:
            with open(path) as f:
                data = json.load(f)
            rows = {r["system"]: r for r in data["rows"] if r.get("section") == "decode" and r.get("B") == 1
                    and r.get("L") == context and r.get("ms_per_step")}
        except (ValueError, KeyError, TypeError, AttributeError) as e:  # JSONDecodeError is a ValueError
            raise ValueError(f"{path}: not a roofline.py results.json ({e!r})") from None
        if system in rows and "gpt-fast" in rows:
            meta = data.get("meta", {})
            out.append((f"{meta.get('commit', '?')} {meta.get('date', '')}", rows[system]["ms_per_step"],
                        rows["gpt-fast"]["ms_per_step"], rows["gpt-fast"].get("setups_ms", [])))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="+", help="roofline.py results.json files (one a process)")
    ap.add_argument("--out", required=True, help="the plot (.png)")
    ap.add_argument("--system", default="orthros+gemv", help="our row (default orthros+gemv)")
    ap.add_argument("--context", type=int, default=1024, help="context of the rows (default 1024)")
    a = ap.parse_args(argv)
    a.results = check_inputs(ap, a.out, a.results, "results")
    try:
        pts = points(a.results, a.system, a.context)
    except ValueError as e:
        ap.error(f"results: {e}")
    if not pts:
        ap.error(f"no file holds both a {a.system!r} and a gpt-fast row at B=1, L={a.context}")
    import matplotlib

    from orthros.benchmarks.roofline import TARGETS  # imports torch (seconds): after the refusals

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ratios = [g / o for _, o, g, _ in pts]
    for (label, o, g, setups), r in zip(pts, ratios):
        print(f"{label}: {a.system} {o:.3f} ms, gpt-fast {g:.3f} ms"
              + (f" (the fastest of {len(setups)} setups, up to {max(setups):.3f})" if setups else "") + f", {r:.3f}x")
    print(f"median {statistics.median(ratios):.3f}x over {len(pts)} processes; >= {TARGETS['decode_vs_gpt_fast']:g}x "
          f"in {sum(r >= TARGETS['decode_vs_gpt_fast'] for r in ratios)}")
    x = range(1, len(pts) + 1)
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(10, 3.6))
    ax0.plot(x, [o for _, o, _, _ in pts], "o-", color="C3", label=f"Orthros pair ({a.system})")
    ax0.plot(x, [g for _, _, g, _ in pts], "o-", color="C2", label="gpt-fast (its fastest setup)")
    ranged = [(i, min(st), max(st)) for i, (_, _, _, st) in zip(x, pts) if st]
    if ranged:
        ax0.vlines([i for i, _, _ in ranged], [lo for _, lo, _ in ranged], [hi for _, _, hi in ranged], color="C2",
                   alpha=0.4, linewidth=4, label="gpt-fast's setups in the process")
    ax0.set(title=f"decode step, B=1, L={a.context}", xlabel="process", ylabel="ms a step")
    ax1.plot(x, ratios, "o", color="C3")
    ax1.axhline(TARGETS["decode_vs_gpt_fast"], color="red", linestyle="--", linewidth=1, label="target")
    ax1.axhline(statistics.median(ratios), color="gray", linestyle=":", linewidth=1, label="median")
    ax1.set(title="gpt-fast time / ours, one point a process", xlabel="process", ylabel="ratio")
    for ax in (ax0, ax1):
        ax.set_xticks(list(x))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, a.out, dpi=110)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Issue #18's stream chain (``benchmarks/stream_chain.py --trace``), where a layer's time goes:
for each ``.trace.json``, a bar of a layer's time split into the blocks' mean busy time (their
phases' end minus start), what the slowest block adds to it (the imbalance) and the grid
barriers' own latency (the first block's start after the phase before's last end), with the
engine's GEMVs of the same process marked where the cell's JSON (``<stem>.json`` beside the trace)
has them.

    python benchmarks/plot_trace.py TRACE_JSON [TRACE_JSON ...] --out PNG [--title T]

A bar's label is the file name without a leading ``<n>-`` and ``.trace.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

from plot_probe_cells import cell_times, check_inputs, finish_bars, label  # noqa: E402
from stream_chain import read_trace, trace_summary  # noqa: E402

PARTS = ("busy", "imbalance", "barrier")  # a layer's wall, in this order


def layer_parts(path: str) -> dict:
    """A layer's ``wall`` and its ``PARTS`` (us, sums over the four phases), and the ``engine``'s
    time a layer in the cell's JSON beside it (``None`` without one)."""
    rows = trace_summary(read_trace(path))
    out = {k: sum(r[k] for r in rows) for k in ("wall", "busy", "barrier")}
    out["imbalance"] = out["wall"] - out["barrier"] - out["busy"]
    cell = path[:-len(".trace.json")] + ".json"
    times = cell_times(cell) if os.path.isfile(cell) else {}
    out["engine"] = times.get("engine")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", nargs="+", help="stream_chain.py --trace files (<out>.trace.json)")
    ap.add_argument("--out", required=True, help="the plot (.png)")
    ap.add_argument("--title", default="the stream chain's layer: where the time goes (us, one process a bar)")
    a = ap.parse_args(argv)
    for path in a.traces:
        if not path.endswith(".trace.json"):
            ap.error(f"traces: {path!r}: give stream_chain.py's .trace.json files")
    a.traces = check_inputs(ap, a.out, a.traces, "traces")
    try:
        data = [(label(p, ".trace.json"), layer_parts(p)) for p in a.traces]
    except (ValueError, KeyError, IndexError, TypeError, json.JSONDecodeError) as e:
        ap.error(f"traces: not a trace: {e!r}")
    for lab, d in data:
        eng = f", engine {d['engine']:.2f}" if d["engine"] is not None else ""
        print(f"{lab}: wall {d['wall']:.2f} us a layer = busy {d['busy']:.2f} + imbalance {d['imbalance']:.2f} + "
              f"barrier {d['barrier']:.2f}{eng}")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 1.3 + 0.45 * len(data)))
    for i, (_, d) in enumerate(data):
        left = 0.0
        for j, part in enumerate(PARTS):
            ax.barh(i, d[part], left=left, color=f"C{j}", label=part if i == 0 else None)
            left += d[part]
        ax.text(left, i, f" {d['wall']:.1f}", va="center", fontsize=7)
        if d["engine"] is not None:
            ax.plot([d["engine"]] * 2, [i - 0.4, i + 0.4], color="k", lw=1.5,
                    label="engine's GEMVs (same process)" if i == 0 else None)
    finish_bars(fig, ax, [lab for lab, _ in data], a.title, "us a layer (mean over layers 2..L)", a.out,
                loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=4, frameon=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())

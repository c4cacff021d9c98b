"""Issue #18's probes setting by setting: the per-layer time of every system in each JSON that
``benchmarks/persistent_chain.py`` or ``benchmarks/fused_mlp.py`` wrote (one process a setting),
as bars against the engine's time measured in the same process, with the difference printed.

    python benchmarks/plot_probe_cells.py CELL_JSON [CELL_JSON ...] --out PNG [--systems engine,fused] [--title T]

A cell's label is its file name without a leading ``<n>-`` and the ``.json``
(``3-bi64_norot.json`` -> ``bi64_norot``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from orthros.utils import check_png, save_figure  # noqa: E402


def label(path: str, suffix: str = ".json") -> str:
    """A cell's label: its file name without a leading ``<n>-`` and ``suffix``."""
    name = os.path.basename(path)
    return re.sub(r"^\d+-", "", name[:-len(suffix)] if name.endswith(suffix) else name)


def check_inputs(ap, out: str, paths, arg: str) -> list:
    """``paths`` each once, in order (a file named twice would be two cells, or two processes of
    the peer-spread's median), after refusing through ``ap.error`` an ``--out`` that is no .png path
    or cannot be written, and a path (of the positional ``arg``) that is no file."""
    try:
        check_png("--out", out)
    except ValueError as e:
        ap.error(str(e))
    for path in paths:
        if not os.path.isfile(path):
            ap.error(f"{arg}: {path!r}: no such file")
    once: dict = {}
    for path in paths:
        once.setdefault(os.path.realpath(path), path)
    return list(once.values())


def finish_bars(fig, ax, labels, title: str, xlabel: str, out: str, **legend) -> None:
    """A chart of horizontal bars, a row a cell: the rows' ``labels`` top to bottom, the title,
    the x label and grid, the legend (``legend``: its keywords), written to ``out`` atomically."""
    ax.set_yticks(range(len(labels)))
    ax.set_yticklabels(labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel)
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize=8, **legend)
    fig.tight_layout()
    save_figure(fig, out, dpi=110)
    print(f"wrote {out}")


def cell_times(path) -> dict:
    """``{system: us a layer}`` of a probe's JSON (its rows with a time)."""
    with open(path) as f:
        data = json.load(f)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a probe's JSON (no object)")
    return {r["system"]: r["us_per_layer"] for r in data.get("rows", [])
            if isinstance(r, dict) and r.get("us_per_layer") is not None}


def cells(paths, systems, base):
    """``[(label, {system: us a layer})]`` of every file, only ``systems`` (``None``: all but
    ``torch``); ``ValueError`` naming a file without rows or without the ``base`` system."""
    out = []
    for path in paths:
        rows = cell_times(path)
        if base not in rows:
            raise ValueError(f"{path}: no {base!r} row with a time (a CPU run, or not a probe's JSON?)")
        keep = {s: v for s, v in rows.items() if (s in systems if systems else s != "torch")}
        keep[base] = rows[base]
        out.append((label(path), keep))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cells", nargs="+", help="the probes' JSON files (one a process)")
    ap.add_argument("--out", required=True, help="the plot (.png)")
    ap.add_argument("--systems", default=None, help="comma-separated systems to show (default: all but torch)")
    ap.add_argument("--base", default="engine", help="the system the others are compared with (default engine)")
    ap.add_argument("--title", default="us a layer, one process a setting")
    a = ap.parse_args(argv)
    a.cells = check_inputs(ap, a.out, a.cells, "cells")
    systems = [s.strip() for s in a.systems.split(",") if s.strip()] if a.systems else None
    try:
        data = cells(a.cells, systems, a.base)
    except (ValueError, KeyError) as e:  # JSONDecodeError is a ValueError
        ap.error(f"cells: {e}")
    names = [s for s in dict.fromkeys(s for _, row in data for s in row) if s != a.base]
    for lab, row in data:
        rest = ", ".join(f"{s} {row[s]:.2f} ({row[s] - row[a.base]:+.2f})" for s in names if s in row)
        print(f"{lab}: {a.base} {row[a.base]:.2f} us a layer; {rest}")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    order = [a.base] + names
    height = 0.8 / len(order)
    fig, ax = plt.subplots(figsize=(9, 0.5 + 0.45 * len(data) * max(1, len(order) / 2)))
    for j, s in enumerate(order):
        ys = [i + (j - (len(order) - 1) / 2) * height for i, (_, row) in enumerate(data) if s in row]
        xs = [row[s] for _, row in data if s in row]
        ax.barh(ys, xs, height=height, color=f"C{j}", label=s)
        for y, x in zip(ys, xs):
            ax.text(x, y, f" {x:.1f}", va="center", fontsize=7)
    finish_bars(fig, ax, [lab for lab, _ in data], a.title, "us a layer", a.out, loc="lower right")
    return 0


if __name__ == "__main__":
    sys.exit(main())

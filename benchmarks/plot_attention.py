"""Plot the kernel target rows written by ``benchmarks/attention.py --targets --json RESULTS``:
training fwd+bwd vs cuDNN causal, the window stream vs FlexAttention, decode vs SDPA, each
against its same-run baseline (log-log, ratio labelled at every point).

    python benchmarks/plot_attention.py RESULTS.json OUT.png
"""

from __future__ import annotations

import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from orthros.utils import check_png, save_figure  # noqa: E402


def _series(results, prefix):
    """{size: row} for keys ``prefix<size>`` (e.g. ``train_T8192``), sorted by size."""
    out = {}
    for k, v in results.items():
        m = re.fullmatch(re.escape(prefix) + r"(\d+)", k)
        if m and isinstance(v, dict):
            out[int(m.group(1))] = v
    return dict(sorted(out.items()))


def _k(n):
    return f"{n // 1024}K" if n % 1024 == 0 else str(n)


def plot(results: dict, meta: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.4))
    panels = [
        ("training fwd+bwd (both streams)", _series(results, "train_T"),
         [("cudnn", "SDPA cuDNN causal", "--"), ("orthros", "Orthros op", "-")], "ms", "T"),
        ("window stream alone, fwd+bwd", _series(results, "window_T"),
         [("flex_fb", "FlexAttention SWA", "--"), ("ours_fb", "Orthros window (Triton)", "-")], "ms", "T"),
    ]
    for B in (1, 8):
        rows = _series(results, f"decode_B{B}_L")
        if rows:
            panels.append((f"decode step, B={B} (CUDA graph)", rows,
                           [("sdpa_graph", "SDPA 1-query decode", "--"), ("ours_graph", "Orthros window+full", "-")],
                           "ms", "L"))
    # decode: both batch sizes share the third panel
    dec = [p for p in panels if p[0].startswith("decode")]
    panels = [p for p in panels if not p[0].startswith("decode")]
    for ax, (title, rows, lines, unit, xl) in zip(axes, panels):
        for key, label, style in lines:
            xs = [n for n, r in rows.items() if r.get(key)]
            ax.plot(xs, [rows[n][key] for n in xs], style, marker="o", label=label)
        base, ours = lines[0][0], lines[1][0]
        for n, r in rows.items():
            if r.get(base) and r.get(ours):
                ax.annotate(f"{r[ours] / r[base]:.2f}x", (n, r[ours]), textcoords="offset points", xytext=(4, -12),
                            fontsize=8)
        ax.set(xscale="log", yscale="log", title=title, xlabel=f"{xl} (tokens)", ylabel=unit)
        ax.set_xticks(list(rows), [_k(n) for n in rows])
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    ax = axes[2]
    for title, rows, lines, unit, xl in dec:
        B = title.split("B=")[1].split(" ")[0]
        for key, label, style in lines:
            xs = [n for n, r in rows.items() if r.get(key)]
            ax.plot(xs, [1000 * rows[n][key] for n in xs], style, marker="o", label=f"{label}, B={B}")
        for n, r in rows.items():
            if r.get("sdpa_graph") and r.get("ours_graph"):
                ax.annotate(f"{r['ours_graph'] / r['sdpa_graph']:.2f}x", (n, 1000 * r["ours_graph"]),
                            textcoords="offset points", xytext=(4, -12), fontsize=8)
    if dec:
        xs = sorted({n for _, rows, *_ in dec for n in rows})
        ax.set(xscale="log", yscale="log", title="decode step (CUDA graph)", xlabel="cache length L (tokens)",
               ylabel="us")
        ax.set_xticks(xs, [_k(n) for n in xs])
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"Orthros attention kernels vs same-run baselines (ratio = ours / baseline): "
                 f"{meta.get('device', '?')}, commit {meta.get('commit', '?')}, {meta.get('date', '?')}", fontsize=10)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)


def _refuse(message: str) -> int:
    print(f"plot_attention.py: {message}", file=sys.stderr)
    return 2


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    src, dst = argv
    # everything refused before drawing (were: tracebacks, and a PNG of another format after the figure)
    try:
        check_png("OUT.png", dst)
    except ValueError as e:
        return _refuse(str(e))
    try:
        with open(src) as f:
            data = json.load(f)
    except OSError as e:
        return _refuse(f"RESULTS.json {src}: {e.strerror or e}")
    except ValueError as e:  # not JSON, or not UTF-8
        return _refuse(f"RESULTS.json {src}: not JSON ({e})")
    if not isinstance(data, dict) or not isinstance(data.get("results"), dict):
        return _refuse(f"{src}: not a benchmarks/attention.py --json file (no 'results')")
    plot(data["results"], data, dst)
    print(f"wrote {dst}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

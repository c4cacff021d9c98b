"""The figure of this folder's README: gpt-fast's 1K step against its down projection's time a
call, one point a traced process (call 1, and the thirty-sixth session's) or CUDA graph (call 2),
all on H100s with the same kernels. Run from the repository root:

    python docs/results/s38-2026-12-05/plot_down.py
"""

import json
import os
import sys

sys.path.insert(0, os.getcwd())
import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from orthros.utils import save_figure  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DOWN = "mm_mul_silu"


def down_us(by_name):
    return next(v["mean_us"] for n, v in by_name.items() if DOWN in n)


def main():
    pts = {"call 1: a process each": [], "call 2: a CUDA graph each, one process": [],
           "thirty-sixth session's process": []}
    for r in (1, 2, 3):
        with open(os.path.join(HERE, "call1", f"peer-{r}.json")) as f:
            p = json.load(f)["modes"]["gpt-fast"]
        pts["call 1: a process each"].append((down_us(p["timeline"]["by_name"]), p["step_ms"]))
    with open(os.path.join(HERE, "call2", "placement.json")) as f:
        for row in json.load(f):
            pts["call 2: a CUDA graph each, one process"].append((down_us(row["down"]), row["step_ms"]))
    # docs/results/s36-2026-12-05/profile_peer.log: the step and the down kernel's mean a call
    pts["thirty-sixth session's process"].append((54.73, 6.788))
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for (label, xy), marker in zip(pts.items(), "os^"):
        ax.scatter([x for x, _ in xy], [y for _, y in xy], marker=marker, label=label)
    xs = [x for xy in pts.values() for x, _ in xy]
    lo = min(xs)
    base = min(y for xy in pts.values() for x, y in xy if x == lo)
    ax.plot([lo, max(xs)], [base, base + 36 * (max(xs) - lo) / 1000], "k--", lw=0.8,
            label="36 calls a step: the step moves with the kernel")
    ax.axhline(5.685 * 1.2, color="tab:red", lw=0.8, label="1.2x the Orthros pair's step (5.685 ms)")
    ax.set_xlabel("gpt-fast's down projection, us a call (100.7 MB of weight)")
    ax.set_ylabel("gpt-fast's 1K decode step, ms")
    ax.set_title("gpt-fast on an H100: the same kernels, a different down each setup")
    ax.legend(fontsize=7)
    save_figure(fig, os.path.join(HERE, "peer_down_h100.png"))


if __name__ == "__main__":
    main()

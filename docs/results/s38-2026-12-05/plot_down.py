"""The figure of this folder's README: gpt-fast's 1K step against its down projection's time a
call, one point a traced process (call 1, and the thirty-sixth session's) or CUDA graph (calls 2-3),
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
           "call 3: the same, another process": [], "thirty-sixth session's process": []}
    for r in (1, 2, 3):
        with open(os.path.join(HERE, "call1", f"peer-{r}.json")) as f:
            p = json.load(f)["modes"]["gpt-fast"]
        pts["call 1: a process each"].append((down_us(p["timeline"]["by_name"]), p["step_ms"]))
    pair = None
    for call, label in (("call2", "call 2: a CUDA graph each, one process"), ("call3", "call 3: the same, another process")):
        with open(os.path.join(HERE, call, "placement.json")) as f:
            for row in json.load(f):
                if "pair_ms" in row:  # call 3's last row: the pair's two timings in that process
                    pair = max(row["pair_ms"])
                else:
                    pts[label].append((down_us(row["down"]), row["step_ms"]))
    # docs/results/s36-2026-12-05/profile_peer.log: the step and the down kernel's mean a call
    pts["thirty-sixth session's process"].append((54.73, 6.788))
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for (label, xy), marker, color in zip(pts.items(), "osD^", ("tab:blue", "tab:orange", "tab:green", "tab:purple")):
        ax.scatter([x for x, _ in xy], [y for _, y in xy], marker=marker, color=color, label=label)
    allp = [p for xy in pts.values() for p in xy]
    x0, y0 = min(allp, key=lambda p: p[1])  # the fastest setup: the slope of 36 calls a step drawn from it
    x1 = max(x for x, _ in allp)
    ax.plot([x0, x1], [y0, y0 + 36 * (x1 - x0) / 1000], "k--", lw=0.8,
            label="from the fastest setup, 36 calls a step: the step moves with the kernel")
    ax.axhline(pair * 1.2, color="tab:red", lw=0.8, label=f"1.2x the Orthros pair's step ({pair:.3f} ms, call 3)")
    ax.set_xlabel("gpt-fast's down projection, us a call (100.7 MB of weight)")
    ax.set_ylabel("gpt-fast's 1K decode step, ms")
    ax.set_title("gpt-fast on an H100: the same kernels, a different down each setup")
    ax.legend(fontsize=7, loc="lower right")
    save_figure(fig, os.path.join(HERE, "peer_down_h100.png"))


if __name__ == "__main__":
    main()

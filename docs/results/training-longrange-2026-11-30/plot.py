"""Eval loss vs. tokens for the long-range runs, and the probe's first / second-copy loss.

    python docs/results/training-longrange-2026-11-30/plot.py runs/lr2 [runs/lr1 ...]

Each argument is a directory holding orthros/ transformer/ swa/ (output_dir of each run; one
may be missing) and
compare.jsonl (`python -m orthros.training.compare ... --passage 127 --n 46 > compare.jsonl`).
Writes summary.json (the figures, so the plot can be redrawn without the runs) and
eval_loss_vs_tokens.png next to this file.
"""

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = Path(__file__).resolve().parent
ARCHS = {"orthros": ("Orthros", "tab:blue"), "transformer": ("Transformer", "tab:green"),
         "swa": ("SWA (window 32)", "tab:red")}


def collect(group: Path) -> dict:
    probe = {}
    if (group / "compare.jsonl").exists():
        for line in open(group / "compare.jsonl"):
            r = json.loads(line)
            probe[Path(r["run"]).name] = {k: r[k] for k in ("step", "loss_first_copy", "loss_second_copy",
                                                              "passages", "passage_tokens")}
    out = {}
    for arch in ARCHS:
        if not (group / arch / "metrics.jsonl").exists():
            continue
        rs = [json.loads(l) for l in open(group / arch / "metrics.jsonl")]
        out[arch] = {"eval": [(r["step"], r["tokens"], round(r["eval_loss"], 4)) for r in rs if r["kind"] == "eval"],
                     "probe": probe.get(arch)}
    return out


def main(groups):
    summary = {Path(g).name: collect(Path(g)) for g in groups}
    (HERE / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4.6), gridspec_kw={"width_ratios": [3, 2]})
    styles = ["-", "--", ":"]
    for (name, runs), ls in zip(summary.items(), styles):
        for arch, (label, color) in ARCHS.items():
            if arch not in runs:
                continue
            ev = runs[arch]["eval"]
            a.plot([t / 1e6 for _, t, _ in ev], [l for *_, l in ev], ls, marker="o", ms=3, color=color,
                   label=f"{label}, {name}")
    a.set_xlabel("training tokens (M)")
    a.set_ylabel("held-out eval loss (P P EOS units)")
    a.set_title("eval loss at equal tokens")
    a.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3)
    a.grid(alpha=0.3)
    last = list(summary.values())[0]
    xs = range(len(ARCHS))
    first = [last[k]["probe"]["loss_first_copy"] for k in ARCHS]
    second = [last[k]["probe"]["loss_second_copy"] for k in ARCHS]
    b.bar([x - 0.2 for x in xs], first, 0.4, label="1st copy", color="0.7")
    b.bar([0], [0], 0, label="2nd copy (run's colour)", color="0.3")
    b.bar([x + 0.2 for x in xs], second, 0.4, color=[c for _, c in ARCHS.values()])
    b.set_xticks(list(xs), ["Orthros", "Transformer", "SWA"])
    b.set_ylabel("loss")
    b.set_title(f"probe after {list(summary)[0]}:\n{last['orthros']['probe']['passages']} held-out "
                f"passages of {last['orthros']['probe']['passage_tokens']} tokens, fed twice", fontsize=9)
    b.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(HERE / "eval_loss_vs_tokens.png", dpi=110)


if __name__ == "__main__":
    main(sys.argv[1:])

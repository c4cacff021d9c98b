"""Loss curves of training runs, drawn from their ``metrics.jsonl``.

    orthros plot RUN [RUN ...] [-o PNG] [--x tokens|step] [--title TEXT]

A run is a training ``output_dir``. Each run's logged training loss is drawn against the tokens
it has seen (or its step) on the left; its held-out eval loss, where it has one, on the right.
The trainer draws its own run's curves after each eval and at its end (``output_dir/loss.png``;
``train.plot``).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path
from typing import Optional, Sequence

from ..utils import check_png, distinct_folders, expand_path
from ..layout import LOSS_PLOT, METRICS, run_holding_hint
from .metrics import read_metrics

X_AXES = ("tokens", "step")


class PlotError(ValueError):
    """A run that cannot be drawn (no metrics, nothing logged yet)."""


def load_run(run_dir) -> dict:
    """A run's label, its training rows and its eval rows; :class:`PlotError` when it has none."""
    run_dir = Path(run_dir)
    if (run_dir / METRICS).is_dir():
        raise PlotError(f"{run_dir}: its {METRICS} is a folder, not a training run's log")
    if not (run_dir / METRICS).is_file():
        raise PlotError(f"{run_dir}: no {METRICS} (a training output_dir is needed){run_holding_hint(run_dir)}")
    rows = read_metrics(str(run_dir), kind=None)
    train = [r for r in rows if r.get("kind") == "train" and "loss" in r]
    if not train and not rows and (run_dir / METRICS).stat().st_size:  # lines, none of them a record
        raise PlotError(f"{run_dir}: its {METRICS} holds no record a training run writes (no line is a JSON "
                        f"object); not a training run's log?")
    if not train:
        raise PlotError(f"{run_dir}: no training step logged yet")
    evals = [r for r in rows if r.get("kind") == "eval"]
    for r in train + evals:  # what loss_figure draws: a number each (a loss of null: one that was not finite)
        for key in ("step", "tokens", "loss" if r["kind"] == "train" else "eval_loss"):
            if key.endswith("loss") and r.get(key, 0) is None:
                continue
            if isinstance(r.get(key), bool) or not isinstance(r.get(key), (int, float)):
                raise PlotError(f"{run_dir}: {'an' if r['kind'] == 'eval' else 'a'} {r['kind']} row of {METRICS} has no number for {key!r}: {r}")
    return {"label": _label(run_dir), "train": train, "eval": evals}


def _label(run_dir: Path, name: Optional[str] = None) -> str:
    """The folder's name (or ``name``), with the run's mode and architecture when its run_config.yaml says them."""
    import yaml

    name = name or run_dir.resolve().name
    try:
        cfg = yaml.safe_load((run_dir / "run_config.yaml").read_text()) or {}
        arch = (cfg.get("model") or {}).get("architecture")
        mode = cfg.get("mode")
    except (OSError, ValueError, AttributeError, yaml.YAMLError):  # no config, or one we cannot read
        return name
    what = "/".join(str(s) for s in (mode, arch) if s)
    return f"{name} ({what})" if what and what != name else name


def plot_runs(run_dirs: Sequence, out, x: str = "tokens", title: Optional[str] = None, *,
              name: Optional[str] = None) -> Path:
    """Draw the runs' loss curves to ``out`` (a PNG, written through a temporary name); a failed
    write is an ``OSError`` naming ``out`` (after ``name``, the caller's option for it, if given)."""
    from ..utils import save_figure

    out = Path(out)
    runs = [load_run(d) for d in run_dirs]
    labels = [r["label"] for r in runs]
    for d, run in zip(run_dirs, runs):  # runs/a/out and runs/b/out: told apart by their paths as given
        if labels.count(run["label"]) > 1:
            run["label"] = _label(Path(d), os.path.normpath(d))
    save_figure(loss_figure(runs, x, title), out, name=name)
    return out


def loss_figure(runs: Sequence[dict], x: str = "tokens", title: Optional[str] = None):
    """The matplotlib figure of :func:`load_run`'s runs: training loss, and eval loss where logged."""
    if x not in X_AXES:
        raise ValueError(f"x must be one of {X_AXES}, got {x!r}")
    from matplotlib.ticker import EngFormatter

    from ..utils import pyplot

    plt = pyplot()

    with_eval = any(r["eval"] for r in runs)
    fig, axes = plt.subplots(1, 2 if with_eval else 1, figsize=(11 if with_eval else 6.5, 4.2), squeeze=False)
    xlabel = "tokens seen" if x == "tokens" else "step"
    drawn = {0: 0, 1: 0}  # points drawn in each panel
    for i, run in enumerate(runs):
        color = f"C{i % 10}"
        xs, ys, skipped = _finite_points(run["train"], x, "loss")
        drawn[0] += len(xs)
        axes[0, 0].plot(xs, ys, color=color, lw=1.2, label=run["label"] + _skipped_note(skipped), ms=3,
                        marker="o" if len(xs) == 1 else None)  # a line of one point is not drawn
        if run["eval"]:
            xs, ys, skipped = _finite_points(run["eval"], x, "eval_loss")
            drawn[1] += len(xs)
            last = f"{ys[-1]:.4f}" if ys else "none finite"
            axes[0, 1].plot(xs, ys, "o-", color=color, ms=3, lw=1.2,
                            label=f"{run['label']}: {last}{_skipped_note(skipped)}")
    panels = [(axes[0, 0], "training loss (logged steps)")]
    if with_eval:
        panels.append((axes[0, 1], "held-out eval loss (last finite value in the legend)"))
    for j, (ax, name) in enumerate(panels):
        if not drawn[j]:  # every logged loss was NaN / inf: said, not axes of nothing around 0
            ax.text(0.5, 0.5, "no finite loss logged", transform=ax.transAxes, ha="center", va="center")
            ax.set_xticks([])
            ax.set_yticks([])
        ax.set_xlabel(xlabel)
        if x == "tokens":
            ax.xaxis.set_major_formatter(EngFormatter(sep=""))  # 100k, 1.5M: long counts do not collide
        ax.set_ylabel("loss (nats / token)")
        ax.set_title(name, fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def _finite_points(rows: Sequence[dict], x: str, key: str) -> tuple[list, list, int]:
    """The (x, loss) points of ``rows`` where both are finite, and how many were left out: a NaN or
    inf loss (``null`` in metrics.jsonl written since 2026-12-07) is no point of the curve."""
    xs, ys = [], []
    for r in rows:
        if r.get(key) is not None and math.isfinite(r[key]) and math.isfinite(r[x]):
            xs.append(r[x])
            ys.append(r[key])
    return xs, ys, len(rows) - len(xs)


def _skipped_note(skipped: int) -> str:
    return f" ({skipped} not finite, skipped)" if skipped else ""


class _Output(argparse._StoreAction):
    """``-o`` / ``--output``, with the spelling typed kept (``output_typed``) for the errors that name it."""

    def __call__(self, parser, namespace, values, option_string=None):
        namespace.output_typed = option_string
        super().__call__(parser, namespace, values, option_string)


def main(argv: Optional[list] = None) -> int:
    p = argparse.ArgumentParser(prog="orthros plot", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", metavar="RUN", help=f"training output_dir(s), each with its {METRICS}")
    p.add_argument("-o", "--output", default=None, action=_Output,
                   help="the PNG to write (default: RUN/loss.png for one run, ./loss.png for several)")
    p.add_argument("--x", choices=X_AXES, default="tokens", help="the horizontal axis (default: tokens)")
    p.add_argument("--title", default=None, help="a title above the panels")
    p.set_defaults(output_typed="--output")
    args = p.parse_args(argv)
    output = args.output_typed  # -o or --output, as typed
    # an unset shell variable (-o "$OUT"): was RUN/loss.png replaced, or "RUN : no such directory"
    if args.output is not None and not args.output.strip():
        p.error(f"{output} is empty ({args.output!r}): give a .png path, or leave the option out for its default")
    for d in args.runs:
        if not d.strip():
            p.error(f"RUN is empty ({d!r}): give a training output_dir")
    try:  # a leading ~ (or ~NAME) is a home folder, as in every orthros command (a quoted one reaches here)
        args.runs = [str(expand_path(d, "RUN")) if d.startswith("~") else d for d in args.runs]  # else as typed
        if args.output is not None and args.output.startswith("~"):
            args.output = str(expand_path(args.output, output))
    except ValueError as e:
        p.error(str(e))
    for d in args.runs:
        if not os.path.isdir(d):
            p.error(f"RUN {d}: " + (f"is a file, not a training output_dir (the folder of {METRICS}: "
                                    f"{os.path.dirname(d) or '.'})" if os.path.exists(d) else "no such directory"))
    args.runs, repeats = distinct_folders(args.runs)  # one folder named twice was two identical curves
    for d, first in repeats:
        print(f"orthros plot: note: RUN {d} is the same folder as RUN {first}: drawn once", file=sys.stderr)
    out = args.output or (os.path.join(args.runs[0], LOSS_PLOT) if len(args.runs) == 1 else "loss.png")
    try:
        check_png(output, out)  # check_output_path of a .png: a folder is said to be one
    except ValueError as e:
        p.error(str(e))
    try:
        plot_runs(args.runs, out, x=args.x, title=args.title, name=output if args.output else None)
    except PlotError as e:
        p.error(f"RUN {e}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

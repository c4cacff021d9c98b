"""Try several MQAR settings (used to choose and verify the demo setting; see docs/evaluation.md).

    python -m orthros.evaluation.mqar_sweep NAME key=value ... [-- NAME key=value ...]

keys: V T N power mingap maxgap fill repeat d L H w steps B lr neval seed device backend threads compile
(mingap / maxgap: `eval mqar`'s --min-gap / --max-gap, maxgap by default as the sequence allows;
compile=1: MQARTrain.compile, the decoder layers through torch.compile).
Prints one JSON line per setting.
"""

from __future__ import annotations

import sys
import time

from ..utils import to_json
from .mqar import MQARTask, MQARTrain, check_run, format_table, run_mqar

KEYS = ("V", "T", "N", "power", "mingap", "maxgap", "fill", "repeat", "d", "L", "H", "w", "steps", "B", "lr", "neval", "seed",
        "device", "backend", "threads", "compile")


# the MQARTask / MQARTrain fields and the keys that set them: a setting's errors name the key given
FIELD_KEYS = {"vocab_size": "V", "seq_len": "T", "num_pairs": "N", "power": "power", "min_gap": "mingap",
              "max_gap": "maxgap", "fill": "fill", "hidden_size": "d", "num_layers": "L", "num_heads": "H",
              "window_size": "w", "steps": "steps", "batch_size": "B", "lr": "lr", "eval_examples": "neval",
              "seed": "seed", "attn_backend": "backend", "threads": "threads", "compile": "compile"}


def parse_setting(grp: list) -> tuple:
    """``[NAME, key=value, ...]`` -> ``(NAME, {key: value})``; a ``ValueError`` for an item without ``=``,
    a key not in ``KEYS`` (a typo such as ``step=100`` would otherwise be ignored and run the default) or
    given twice, or a name holding ``=`` (a forgotten name: the first ``key=value`` taken for it)."""
    name, kv = grp[0], {}
    if name.startswith("-"):
        raise ValueError(f"setting names must not start with '-', got {name!r}")
    if "=" in name:
        raise ValueError(f"setting names must not contain '=', got {name!r} (the name comes first: NAME key=value "
                         f"...)")
    for item in grp[1:]:
        key, eq, value = item.partition("=")
        if not eq or key not in KEYS:
            raise ValueError(f"setting {name}: {item!r} is not key=value with a key of {' '.join(KEYS)}")
        if key in kv:
            raise ValueError(f"setting {name}: {key} is given twice ({key}={kv[key]}, {item})")
        kv[key] = value
    return name, kv


def build_setting(name: str, kv: dict) -> tuple:
    """``(MQARTask, MQARTrain)`` of a parsed setting, checked as :func:`run_mqar` checks it (and the
    device): a ``ValueError`` naming the setting, so that :func:`main` refuses a bad setting before the
    first one runs."""
    from ..utils import check_device

    def g(k, d, f=int):
        if k not in kv:
            return d
        try:
            return f(kv[k])
        except ValueError:
            raise ValueError(f"setting {name}: {k}={kv[k]} is not {'an integer' if f is int else 'a number'}") \
                from None

    task = MQARTask(vocab_size=g("V", 64), seq_len=g("T", 64), num_pairs=g("N", 4), power=g("power", 1.0, float),
                    min_gap=g("mingap", 1), max_gap=g("maxgap", None), fill=kv.get("fill", "pad"),
                    answer_in_input=bool(g("repeat", 0)))
    tr = MQARTrain(hidden_size=g("d", 64), num_layers=g("L", 2), num_heads=g("H", 2), window_size=g("w", 8),
                   steps=g("steps", 800), batch_size=g("B", 32), lr=g("lr", 3e-3, float), eval_examples=g("neval", 1000),
                   seed=g("seed", 0), device=kv.get("device", "cpu"), attn_backend=kv.get("backend", "auto"),
                   threads=g("threads", 0) or None, compile=bool(g("compile", 0)))
    try:
        check_device(tr.device, "device")
        check_run(task, tr, names=FIELD_KEYS)
    except ValueError as e:
        raise ValueError(f"setting {name}: {e}") from None
    return task, tr


def run_one(name: str, kv: dict) -> dict:
    task, tr = build_setting(name, kv)
    t0 = time.perf_counter()
    out = run_mqar(task, tr, progress=False, log=None)
    out["name"] = name
    out["wall_seconds"] = round(time.perf_counter() - t0, 1)
    print(f"== {name} {kv} ({out['wall_seconds']:.0f}s)\n{format_table(out)}", file=sys.stderr, flush=True)
    return out


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or "-h" in argv or "--help" in argv:
        print(__doc__.strip(), file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    groups, cur = [], []
    for a in argv + ["--"]:
        if a == "--":
            if cur:
                groups.append(cur)
            cur = []
        else:
            cur.append(a)
    try:
        settings = [parse_setting(grp) for grp in groups]  # every setting checked before the first runs
        for i, (name, kv) in enumerate(settings):
            if any(name == other for other, _ in settings[:i]):  # its JSON lines could not be told apart
                raise ValueError(f"two settings are named {name!r}; name each once")
            build_setting(name, kv)
    except ValueError as e:
        print(f"mqar_sweep: error: {e}", file=sys.stderr)
        return 2
    for name, kv in settings:
        print(to_json(run_one(name, kv)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

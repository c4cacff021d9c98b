"""What issue #18's chain probes (``persistent_chain.py``, ``fused_mlp.py``) share: their common
arguments and checks, the device (CUDA, or the CPU under the Triton interpreter), and the run of
every system of a chain in one process: each output against the ``torch`` system's, each time
under a CUDA graph, one row a system, the JSON and the table (:func:`main`, a probe's whole
``main`` given its parser and its chain)."""

from __future__ import annotations

import os
import sys
import time


def add_common(p, systems, cpu_layers=None) -> None:
    """``--out``, ``--device``, ``--systems`` (of ``systems``, default all), ``--reps`` and
    ``--layers`` (default 36 on CUDA, ``cpu_layers`` on the CPU; resolved by :func:`check_common`)."""
    p.add_argument("--out", required=True, help="the JSON to write (a .json path)")
    p.add_argument("--device", default="cuda", help="cuda[:i], or cpu (Triton interpreter, tiny shapes)")
    p.add_argument("--systems", default=",".join(systems), help=f"comma-separated, of {', '.join(systems)}")
    p.add_argument("--reps", type=int, default=20, help="timed graph replays (median)")
    on_cpu = f", {cpu_layers} on the CPU" if cpu_layers else ""
    p.add_argument("--layers", type=int, default=None, help=f"layers in the chain (default 36 on CUDA{on_cpu})")
    p.set_defaults(_cpu_layers=cpu_layers)


def check_common(p, a, systems) -> None:
    """``p.error`` (exit 2) on a bad ``--out``, ``--device``, ``--reps``, ``--systems`` (which
    becomes a list) or ``--layers`` (its default resolved for the device)."""
    if os.path.isdir(a.out) or not a.out.endswith(".json"):
        p.error(f"--out must be a .json file path (not a directory), got {a.out!r}")
    if not (a.device == "cpu" or a.device == "cuda" or a.device.startswith("cuda:")):
        p.error(f"--device must be cuda, cuda:<i> or cpu, got {a.device!r}")
    if a.reps < 1:
        p.error(f"--reps must be >= 1, got {a.reps}")
    a.systems = [s.strip() for s in a.systems.split(",") if s.strip()]
    bad = [s for s in a.systems if s not in systems]
    if bad or not a.systems:
        p.error(f"--systems must name some of {', '.join(systems)}, got {bad or 'none'}")
    if a.layers is None:
        a.layers = a._cpu_layers if a.device == "cpu" and a._cpu_layers else 36
    if a.layers < 1:
        p.error(f"--layers must be >= 1, got {a.layers}")


def interpret_on_cpu(a) -> None:
    """With ``--device cpu`` the kernels run in the Triton interpreter: set before triton loads."""
    if a.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")


def open_device(a):
    """The ``torch.device`` to run on, made current, or ``None`` after printing why not."""
    import torch

    dev = torch.device(a.device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            print("error: --device cuda but no CUDA device is available (use --device cpu)", file=sys.stderr)
            return None
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(dev)
    elif os.environ.get("TRITON_INTERPRET") != "1":
        print("error: --device cpu needs TRITON_INTERPRET=1 (set before anything imports triton)", file=sys.stderr)
        return None
    return dev


def run_chain(a, chain, dev, meta, title, t0, name_width=11) -> int:
    """Every system of ``a.systems`` on ``chain`` in this process, and the JSON at ``a.out``.

    ``chain`` gives ``call(system)`` (a callable returning the chain's output), ``reset()``
    (clears what another system left), ``failure()`` (``None``, or why the last run is invalid),
    ``bytes_per_layer`` and ``a.layers``. Each system's output is compared with the ``torch``
    system's (relative Frobenius error), then timed under a CUDA graph (not on a CPU); rows per
    system: us a layer, weight bytes a second, the share of ``bw`` (copy bandwidth measured in the
    same run), the bytes' floor, the error, and the ratio to ``engine``; ``meta`` gains the
    seconds since ``t0`` (``time.time()`` at the script's start). Returns the exit code."""
    import torch

    from orthros.benchmarks.inference import capture_graph, print_table, replay_seconds, save

    cuda = dev.type == "cuda"
    bw = meta["copy_bandwidth_Bps"]
    ref = chain.call("torch")().float()
    rows = []
    for system in a.systems:
        fn = chain.call(system)
        chain.reset()
        out = fn().float()
        if cuda:
            torch.cuda.synchronize(dev)
        why = chain.failure()
        if why:
            print(f"error: {system}: {why}", file=sys.stderr)
            return 1
        err = ((out - ref).norm() / ref.norm()).item()
        t = replay_seconds(capture_graph(fn, dev, warmup=1), a.reps) if cuda else float("nan")
        per_layer = t / a.layers
        rows.append({"system": system, "us_per_layer": per_layer * 1e6, "ms_chain": t * 1e3,
                     "weight_GBps": chain.bytes_per_layer / per_layer / 1e9 if cuda else None,
                     "of_copy_bw": chain.bytes_per_layer / per_layer / bw if cuda else None,
                     "floor_us_per_layer": chain.bytes_per_layer / bw * 1e6, "rel_err_vs_torch": err})
        print(f"{system:{name_width}s} {per_layer * 1e6:8.2f} us a layer, rel err vs torch {err:.2e}", flush=True)
    base = next((r["us_per_layer"] for r in rows if r["system"] == "engine"), None)
    for r in rows:
        r["vs_engine"] = (base / r["us_per_layer"]) if base and cuda else None
    meta["elapsed_s"] = round(time.time() - t0, 1)
    save(a.out, meta, rows)
    print_table(rows, ["system", "us_per_layer", "floor_us_per_layer", "of_copy_bw", "vs_engine", "rel_err_vs_torch"],
                title)
    print(f"wrote {a.out}")
    return 0


def main(argv, parse_args, make_chain, settings, title, name_width=11) -> int:
    """A probe's ``main``: ``parse_args(argv)`` (``a.shape`` and ``a.layers`` set), the device,
    the copy bandwidth, ``make_chain(a, device, torch.bfloat16)``, the JSON's meta (date, GPU,
    commit, versions, copy bandwidth, shape, layers, ``settings(a, chain)``, the chain's bytes a
    layer), then :func:`run_chain` under ``title(a, meta)``. Returns the exit code."""
    a = parse_args(argv)
    interpret_on_cpu(a)
    import torch

    from orthros.benchmarks.inference import copy_bandwidth, script_meta

    t0 = time.time()
    dev = open_device(a)
    if dev is None:
        return 2
    bw = copy_bandwidth(dev, 2 ** 30 if dev.type == "cuda" else 2 ** 22)
    chain = make_chain(a, dev, torch.bfloat16)
    meta = {**script_meta(dev, sys.argv[1:] if argv is None else argv), "copy_bandwidth_Bps": bw, "shape": a.shape,
            "layers": a.layers, **settings(a, chain), "bytes_per_layer": chain.bytes_per_layer}
    return run_chain(a, chain, dev, meta, title(a, meta), t0, name_width)

"""Runs of issue #18's chain probes (``benchmarks/persistent_chain.py``, ``fused_mlp.py``,
``stream_chain.py``) for their tests: the script as a subprocess (on the CPU through the Triton
interpreter, or compiled on a GPU), or a copy of it whose kernel source has one line changed, to
show the check can fail. Where the tests themselves run in the interpreter (the CPU suite), the
CPU runs call the script's ``main`` in the test's process instead: a fresh interpreter spends
seconds importing torch, triton and the engine, more than the run itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks"


def run(script, *args, timeout=300, gpu=False):
    """``python <script> args`` from the repository root; ``gpu``: without ``TRITON_INTERPRET``."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    if gpu:
        env.pop("TRITON_INTERPRET", None)
    return subprocess.run([sys.executable, str(script), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=REPO)


def run_cpu(name, *args) -> None:
    """``benchmarks/<name>.py --device cpu args`` through the Triton interpreter; fails the test
    unless it exits 0. Its ``main`` in this process where ``TRITON_INTERPRET=1`` is set already
    (the CPU suite, tests/conftest.py), else (a GPU machine) in a fresh interpreter."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        assert main_from(BENCH, name, (), ["--device", "cpu", *map(str, args)]) == 0
        return
    p = run(BENCH / f"{name}.py", "--device", "cpu", *args)
    assert p.returncode == 0, p.stderr[-3000:]


def rows(path) -> dict:
    """``{system: row}`` of a probe's JSON."""
    return {r["system"]: r for r in json.loads(Path(path).read_text())["rows"]}


def run_changed(tmp_path, name, old, new, *args, kernel=None, beside=(), gpu=False):
    """Runs a copy of ``benchmarks/<name>.py`` beside a copy of its kernel source ``kernel``
    (default ``<name>_kernel.py``) in which ``old`` (exactly one occurrence) is replaced by
    ``new``, beside the shared harness and the scripts ``beside``; on the CPU (``--device cpu``),
    or with ``gpu`` compiled on the default device (skipped without one). Returns the JSON's rows;
    fails the test if the run fails."""
    if gpu:
        skip_without_cuda()
    kernel = kernel or f"{name}_kernel.py"
    src = (BENCH / kernel).read_text()
    assert src.count(old) == 1, f"{old!r} is not in {kernel} exactly once"
    d = tmp_path / "bench"
    d.mkdir()
    (d / kernel).write_text(src.replace(old, new))
    for f in (f"{name}.py", "probe_harness.py", *beside):
        (d / f).write_text((BENCH / f).read_text())
    out = tmp_path / "changed.json"
    if not gpu and os.environ.get("TRITON_INTERPRET") == "1":  # the copies' main in this process
        mods = [Path(f).stem for f in (f"{name}.py", kernel, "probe_harness.py", *beside) if f.endswith(".py")]
        assert main_from(d, name, mods, ["--device", "cpu", *map(str, args), "--out", str(out)]) == 0
        return rows(out)
    p = run(d / f"{name}.py", *(() if gpu else ("--device", "cpu")), *args, "--out", out, gpu=gpu)
    assert p.returncode == 0, p.stderr[-3000:]
    return rows(out)


def main_from(folder, name, modules, argv) -> int:
    """``main(argv)`` of the script ``<folder>/<name>.py`` in this process, the ``modules`` it
    imports (itself included) taken afresh from ``folder`` for the run (none: whichever import
    of ``name`` this process has); after it, ``sys.path`` and those modules as they were."""
    import importlib

    path, saved = list(sys.path), {m: sys.modules.pop(m) for m in modules if m in sys.modules}
    sys.path.insert(0, str(folder))
    importlib.invalidate_caches()
    try:
        return importlib.import_module(name).main(argv)
    finally:
        sys.path[:] = path
        for m in modules:
            sys.modules.pop(m, None)
        sys.modules.update(saved)


def skip_without_cuda() -> None:
    """Skips the calling test where torch sees no CUDA device."""
    import pytest

    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")


def run_gpu(tmp_path, name, *args, tol):
    """The probe compiled on a CUDA device (3 layers, 2 replays): every system's output within
    ``tol`` of torch's. Skips without a CUDA device."""
    skip_without_cuda()
    out = tmp_path / "gpu.json"
    p = run(BENCH / f"{name}.py", "--layers", "3", "--reps", "2", *args, "--out", out, gpu=True)
    assert p.returncode == 0, p.stderr[-3000:]
    for r in rows(out).values():
        assert r["rel_err_vs_torch"] < tol, r


def refused(script, tmp_path, *args) -> str:
    """Runs ``script args --out <tmp>/x.json``, checks it exits 2 without writing the file, and
    returns the last line of its stderr (the one-line reason, not the usage above it, which
    names every option)."""
    out = tmp_path / "x.json"
    p = run(script, *args, "--out", out, timeout=60)
    assert p.returncode == 2 and not out.exists(), (p.returncode, p.stderr)
    return p.stderr.strip().splitlines()[-1]

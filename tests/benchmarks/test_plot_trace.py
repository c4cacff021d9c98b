"""benchmarks/plot_trace.py (issue #18's stream chain, ``--trace``) on traces written here in the
format of ``stream_chain.write_trace``: the split of a layer it prints, the plot, and the refusals
before any output."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "plot_trace.py"
sys.path.insert(0, str(REPO / "benchmarks"))

from stream_chain import write_trace  # noqa: E402


def trace(tmp_path: Path, name: str, slow: int, engine=None) -> Path:
    """Two layers of 3 blocks: phase s starts at 1000 s + 100 on every block and ends 500 ns later
    (block 2 ``slow`` ns later still); its producer done at 1000 s. With the cell's JSON beside it
    when ``engine`` is given."""
    stamps = [[[1000 * s + 100, 1000 * s + 600 + (slow if b == 2 else 0), 1000 * s] for s in range(8)]
              for b in range(3)]
    out = tmp_path / f"{name}.json"
    if engine is not None:
        out.write_text(json.dumps({"rows": [{"system": "engine", "us_per_layer": engine},
                                            {"system": "cuda", "us_per_layer": 4.1}]}))
    return write_trace(str(out), stamps)


def run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                          cwd=REPO, timeout=120)


def test_split_and_plot(tmp_path):
    a = trace(tmp_path, "1-claimed", 300, engine=3.5)
    b = trace(tmp_path, "2-static", 0)
    png = tmp_path / "trace.png"
    p = run(a, b, "--out", png)
    assert p.returncode == 0, p.stderr
    # a phase: busy (500 + 500 + 800) / 3 = 600 ns, the barrier 1100 - 900 = 200 ns after the slow block's end,
    # the wall 1000 ns: the slowest block adds 200 ns to the mean; four phases a layer
    assert "claimed: wall 4.00 us a layer = busy 2.40 + imbalance 0.80 + barrier 0.80, engine 3.50" in p.stdout
    assert "static: wall 4.00 us a layer = busy 2.00 + imbalance 0.00 + barrier 2.00\n" in p.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(tmp_path.glob("*.tmp*"))


def test_refusals_before_any_output(tmp_path):
    png = tmp_path / "x.png"
    good = trace(tmp_path, "c", 0)
    bad = tmp_path / "bad.trace.json"
    bad.write_text(json.dumps({"stamps": [[[1, 2]]]}))
    (tmp_path / "f").write_text("x")
    for args, needle in [((good, "--out", tmp_path / "x.pdf"), "--out"),
                         ((tmp_path / "missing.trace.json", "--out", png), "no such file"),
                         ((good, "--out", tmp_path / "f" / "x.png"), "is a file, not a directory"),  # was a traceback
                         ((tmp_path / "c.json", "--out", png), ".trace.json"),
                         ((bad, "--out", png), "not a trace")]:
        p = run(*args)
        assert p.returncode == 2 and needle in p.stderr, (args, p.stderr)
        assert not png.exists()


def test_a_trace_named_twice_is_one_bar(tmp_path):
    a = trace(tmp_path, "1-claimed", 300)
    p = run(a, trace(tmp_path, "2-static", 0), a, "--out", tmp_path / "t.png")
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("claimed: wall") == 1 and "static: wall" in p.stdout

"""benchmarks/plot_peer_spread.py (issue #18, target 1 across processes) on results files written
here: the ratios it prints, the plot it writes, and the refusals before any work. The command runs
as a subprocess where its exit code and stderr are checked; the other runs call its ``main`` in
this process (a fresh interpreter imports torch for the roofline's targets: seconds each)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench_script import load_script

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "plot_peer_spread.py"


def results(path: Path, ours: float, peer: float, commit: str = "abc1234", L: int = 1024, setups=None) -> Path:
    rows = [{"section": "decode", "system": "orthros+gemv", "B": 1, "L": L, "ms_per_step": ours},
            {"section": "decode", "system": "full+gemv", "B": 1, "L": L, "ms_per_step": ours * 0.99},
            {"section": "decode", "system": "gpt-fast", "B": 1, "L": L, "ms_per_step": peer,
             **({"setups_ms": setups} if setups else {})},
            {"section": "decode", "system": "orthros+gemv", "B": 1, "L": 4096, "ms_per_step": 99.0}]
    path.write_text(json.dumps({"meta": {"commit": commit, "date": "2026-12-02"}, "rows": rows}))
    return path


def run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                          cwd=REPO, timeout=120)


def main(capsys, *args) -> str:
    """``main(args)`` of the script in this process: its exit code 0 checked, its stdout returned."""
    assert load_script(SCRIPT, "plot_peer_spread_script").main(list(map(str, args))) == 0
    return capsys.readouterr().out


def test_ratios_median_and_plot(tmp_path):
    files = [results(tmp_path / f"r{i}.json", 4.5, peer) for i, peer in enumerate((5.4, 6.3, 5.0))]
    png = tmp_path / "spread.png"
    p = run(*files, "--out", png)
    assert p.returncode == 0, p.stderr
    assert "4.500 ms, gpt-fast 5.400 ms, 1.200x" in p.stdout and "1.400x" in p.stdout and "1.111x" in p.stdout
    assert "median 1.200x over 3 processes; >= 1.2x in 2" in p.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(tmp_path.glob("*.tmp*"))


def test_a_run_of_several_peer_setups_reads_as_its_fastest(tmp_path, capsys):
    """A roofline run with --gpt-fast-setups: its row (the fastest setup) gives the ratio; the
    printout names the setups' range (the plot draws it as a bar)."""
    files = [results(tmp_path / "r0.json", 4.5, 5.4, setups=[5.6, 5.4, 6.0]), results(tmp_path / "r1.json", 4.5, 5.0)]
    png = tmp_path / "spread.png"
    out = main(capsys, *files, "--out", png)
    assert "gpt-fast 5.400 ms (the fastest of 3 setups, up to 6.000), 1.200x" in out
    assert "gpt-fast 5.000 ms, 1.111x" in out and ">= 1.2x in 1" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_refusals_before_any_output(tmp_path):
    good = results(tmp_path / "r.json", 4.5, 5.4)
    png = tmp_path / "out.png"
    (tmp_path / "text.json").write_text("not json")
    (tmp_path / "norows.json").write_text("{}")
    (tmp_path / "f").write_text("x")
    for args, msg in (((tmp_path / "missing.json", "--out", png), "no such file"),
                      ((good, "--out", tmp_path / "out.svg"), "out.svg: a .png path is needed"),
                      ((good, "--out", png, "--context", "2048"), "no file holds both"),
                      # were tracebacks: JSONDecodeError, KeyError 'rows', FileExistsError after drawing
                      ((good, tmp_path / "text.json", "--out", png), "text.json: not a roofline.py results.json"),
                      ((tmp_path / "norows.json", "--out", png), "norows.json: not a roofline.py results.json"),
                      ((good, "--out", tmp_path / "f" / "o.png"), "is a file, not a directory")):
        p = run(*args)
        assert p.returncode == 2 and msg in p.stderr, (args, p.stderr)
        assert not png.exists()


def test_a_file_named_twice_is_one_process(tmp_path, capsys):
    """Was: each name a point, so one process given twice moved the median and the count."""
    a, b = results(tmp_path / "a.json", 4.5, 5.4), results(tmp_path / "b.json", 4.5, 6.3)
    out = main(capsys, a, b, tmp_path / "." / "a.json", "--out", tmp_path / "s.png")
    assert "median 1.300x over 2 processes" in out and out.count("1.200x") == 1

"""benchmarks/plot_attention.py draws the kernel figure from a real results file (the one
committed under docs/results) and refuses files that are not benchmark results."""

import json
from pathlib import Path

from bench_script import load_script

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "docs/results/kernels-2026-11-30/attention_targets.json"


def load():
    return load_script(REPO / "benchmarks/plot_attention.py", "plot_attention")


def test_plot_from_committed_results(tmp_path):
    mod = load()
    out = tmp_path / "k.png"
    assert mod.main([str(RESULTS), str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    assert not list(tmp_path.glob("*.tmp*"))  # written under a temporary name, then renamed
    rows = mod._series(json.loads(RESULTS.read_text())["results"], "decode_B8_L")
    assert list(rows) == [32768, 131072]


def test_plot_rejects_other_files(tmp_path):
    mod = load()
    bad = tmp_path / "x.json"
    bad.write_text(json.dumps({"rows": []}))
    assert mod.main([str(bad), str(tmp_path / "o.png")]) == 2
    assert not (tmp_path / "o.png").exists()
    assert mod.main([]) == 2


def test_plot_refuses_bad_paths_in_one_line_before_drawing(tmp_path, capsys):
    """Were tracebacks: a missing or non-JSON results file (FileNotFoundError, JSONDecodeError), a
    'results' that is no object (AttributeError), an OUT below a file (FileExistsError, after the
    figure was drawn), an OUT of another format (matplotlib's, after drawing too)."""
    mod = load()
    (tmp_path / "text.json").write_text("not json")
    (tmp_path / "list.json").write_text("[1]")
    (tmp_path / "rows.json").write_text('{"results": [1]}')
    (tmp_path / "f").write_text("x")
    png = str(tmp_path / "o.png")
    for argv, message in (([str(tmp_path / "nope.json"), png], "nope.json: No such file or directory"),
                          ([str(tmp_path / "text.json"), png], "text.json: not JSON (Expecting value"),
                          ([str(tmp_path / "list.json"), png], "list.json: not a benchmarks/attention.py --json"),
                          ([str(tmp_path / "rows.json"), png], "rows.json: not a benchmarks/attention.py --json"),
                          ([str(RESULTS), str(tmp_path / "o.txt")], "o.txt: a .png path is needed"),
                          ([str(RESULTS), str(tmp_path / "f" / "o.png")], "is a file, not a directory")):
        assert mod.main(argv) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not list(tmp_path.glob("o.*"))
    assert mod.main(["--help"]) == 0 and "plot_attention.py RESULTS.json OUT.png" in capsys.readouterr().out

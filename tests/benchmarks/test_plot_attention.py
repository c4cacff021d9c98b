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

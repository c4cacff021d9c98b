"""`orthros demo --quick` runs end to end on CPU (the README's first command)."""

import json

import pytest


def test_demo_quick_runs(tmp_path, capsys):
    from orthros.cli import main

    out = tmp_path / "demo.json"
    assert main(["demo", "--quick", "--device", "cpu", "--no-progress", "-o", str(out),
                 "--plot", str(tmp_path / "recall.png")]) == 0
    text = capsys.readouterr().out
    for want in ("In-context recall", "Orthros", "Transformer", "SWA", "Prefill time", "speed-up"):
        assert want in text
    res = json.loads(out.read_text())
    assert [r["model"] for r in res["mqar"]["results"]] == ["Orthros", "Transformer", "SWA"]
    assert res["mqar"]["eval_gap_stats"]["frac_ge_window"] > 0.5  # most gaps beyond the window
    assert all(r["orthros_ms"] > 0 and r["transformer_ms"] > 0 for r in res["prefill"]["results"])
    assert (tmp_path / "recall.png").read_bytes().startswith(b"\x89PNG")


def test_demo_bad_device(capsys):
    from orthros.cli import main

    assert main(["demo", "--device", "nonsense", "--skip-recall"]) == 2
    assert "--device" in capsys.readouterr().err
    for args, says in ((["--plot", "r.png", "--skip-recall"], "part 1 is skipped"), (["--plot", "r.svg"], ".png")):
        with pytest.raises(SystemExit) as e:
            main(["demo", *args])
        assert e.value.code == 2 and says in capsys.readouterr().err

"""`orthros demo --quick` runs end to end on CPU (the README's first command)."""

import json

import pytest


def test_demo_quick_runs(tmp_path, capsys, monkeypatch, one_thread):
    """The command end to end with --quick's models and data; fewer of its steps, evaluation examples and
    prompt lengths (each step, example or length runs the same code; 150 steps, 300 examples and 1K/4K/8K took
    ~2 min on the loaded 2-core box, and 2 threads a worker made it 6x slower than one)."""
    import orthros.evaluation.demo as demo
    from orthros.cli import main

    monkeypatch.setattr(demo, "QUICK_TRAIN", dict(demo.QUICK_TRAIN, steps=20, eval_examples=96))
    monkeypatch.setattr(demo, "QUICK_PREFILL_LENGTHS", [1024, 2048])  # both beyond the window (128)
    out = tmp_path / "demo.json"
    assert main(["demo", "--quick", "--device", "cpu", "--no-progress", "-o", str(out),
                 "--plot", str(tmp_path / "recall.png")]) == 0
    text = capsys.readouterr().out
    for want in ("In-context recall", "Orthros", "Transformer", "SWA", "Prefill time", "speed-up"):
        assert want in text
    res = json.loads(out.read_text())
    assert [r["model"] for r in res["mqar"]["results"]] == ["Orthros", "Transformer", "SWA"]
    assert res["mqar"]["eval_gap_stats"]["frac_ge_window"] > 0.5  # most gaps beyond the window
    assert [r["tokens"] for r in res["prefill"]["results"]] == [1024, 2048]
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


def test_demo_bad_input_refused_before_the_runs(tmp_path, capsys, monkeypatch):
    """Issue: --seed -2 failed at the start of part 1 with numpy's `expected non-negative integer`; an
    --output that is a directory failed after both parts had run; --skip-recall with --skip-prefill ran
    nothing and wrote an empty result."""
    import orthros.evaluation.demo as demo
    from orthros.cli import main

    monkeypatch.setattr(demo, "run_recall", lambda *a, **kw: pytest.fail("part 1 ran"))
    monkeypatch.setattr(demo, "run_prefill", lambda *a, **kw: pytest.fail("part 2 ran"))
    (tmp_path / "f").write_text("x")
    for args, says in ((["--seed", "-2"], "--seed must be >= 0, got -2"),
                       (["--skip-recall", "--seed", str(2 ** 64)], "--seed must be <= 18446744073709551615"),
                       # named as typed: -o, or --output (both were named --output)
                       (["-o", str(tmp_path)], f"-o {tmp_path}: is a directory"),
                       (["--output", str(tmp_path)], f"--output {tmp_path}: is a directory"),
                       (["--plot", str(tmp_path / "f" / "r.png")], "is a file, not a directory"),
                       (["--skip-recall", "--skip-prefill", "-o", str(tmp_path / "d.json")], "nothing to run"),
                       # was: both parts ran, then the PNG overwrote the JSON ("wrote r.png" twice)
                       (["-o", str(tmp_path / "r.png"), "--plot", str(tmp_path / "." / "r.png")],
                        f"-o {tmp_path / 'r.png'} and --plot"),
                       # an unset $OUT: both parts ran, then nothing was written (exit 0)
                       (["-o", ""], "-o is empty (''): give a value, or leave the option out")):
        with pytest.raises(SystemExit) as e:
            main(["demo", "--device", "cpu", *args])
        assert e.value.code == 2 and says in capsys.readouterr().err, args
    assert not (tmp_path / "d.json").exists()


def test_demo_quick_help_names_the_gpu_lengths():
    """Issue: --quick's help gave the CPU prompt lengths only (1K/4K/8K); on a GPU it times 4K/16K."""
    import io
    from contextlib import redirect_stdout

    from orthros.evaluation import demo

    buf = io.StringIO()
    with redirect_stdout(buf), pytest.raises(SystemExit):
        demo.main(["--help"])
    text = " ".join(buf.getvalue().split())
    assert "/".join(f"{n // 1024}K" for n in demo.QUICK_GPU_PREFILL_LENGTHS) + " on a GPU" in text


def test_demo_device_refused_with_skip_prefill(capsys, monkeypatch):
    """Issue: --device only places part 2 (prefill timing); with --skip-prefill it was accepted and ignored
    (part 1 trains on the CPU whatever --device says)."""
    import orthros.evaluation.demo as demo
    from orthros.cli import main

    monkeypatch.setattr(demo, "run_recall", lambda *a, **kw: pytest.fail("part 1 ran"))
    with pytest.raises(SystemExit) as e:
        main(["demo", "--skip-prefill", "--device", "cpu"])
    assert e.value.code == 2
    assert "--device cpu: it is the device of part 2 (prefill timing), which --skip-prefill skips" in \
        capsys.readouterr().err


def test_prefill_text_reports_what_was_measured(capsys, monkeypatch):
    """Issue: part 2 closed with a fixed claim about its own table ("on short prompts ... the two are close,
    the gap opens as the prompt grows"), printed under a measured 0.36x / 0.38x / 1.34x on a busy CPU; it now
    states the measured speed-ups, and the reasoning as what to expect."""
    import orthros.evaluation.demo as demo

    monkeypatch.setattr(demo, "_time_prefill",
                        lambda model, ids, reps: 0.002 if model.config.attention_mode == "orthros" else 0.001)
    demo.run_prefill(True, "cpu")
    text = " ".join(capsys.readouterr().out.split())
    assert "the two are close, the gap opens" not in text
    n = demo.QUICK_PREFILL_LENGTHS
    assert f"Measured here: Orthros at 0.50x the Transformer's speed at {n[0]} tokens, 0.50x at {n[-1]}." in text
    assert "median of 1 run." in text


def test_part_2s_progress_shows_off_a_terminal_and_no_progress_silences_it(capsys, monkeypatch):
    """Was: part 2's progress ('... N tokens done', redrawn on stdout) only at a terminal: the full demo's
    prefill timing (~40 s on 2 CPU cores) sat silent under its heading in a log or a pipe, as part 1's bars
    did not. Now utils.Progress on stderr, as part 1 (a bar at a terminal, plain lines elsewhere); and
    --no-progress silences it (was: part 2 still redrew its line on a terminal)."""
    import orthros.evaluation.demo as demo

    monkeypatch.setattr(demo, "_time_prefill", lambda model, ids, reps: 0.001)
    monkeypatch.setattr(demo, "QUICK_PREFILL_LENGTHS", [64, 96])
    demo.run_prefill(True, "cpu")
    out, err = capsys.readouterr()
    assert "[demo prefill] length 2/2 last 96 tokens" in err.splitlines() and "\r" not in out + err
    demo.run_prefill(True, "cpu", progress=False)
    assert "[demo prefill]" not in capsys.readouterr().err


def test_a_failed_write_names_the_option_as_typed(tmp_path, capsys, monkeypatch):
    """The write at the end names -o as typed (was --output whichever was typed): here its path became a
    folder while part 1 ran."""
    import orthros.evaluation.demo as demo
    from orthros.cli import main

    out = tmp_path / "d.json"
    monkeypatch.setattr(demo, "run_recall", lambda *a, **kw: out.mkdir() or {})
    assert main(["demo", "--skip-prefill", "-o", str(out)]) == 1
    assert f"-o {out}: cannot write the file" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["d.json"] and not any(out.iterdir())

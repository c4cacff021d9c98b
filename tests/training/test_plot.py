"""Loss curves: `orthros plot` and the trainer's own loss.png draw what metrics.jsonl holds;
bad runs are refused before anything is written."""

import json

import pytest

pytest.importorskip("matplotlib")

from orthros.cli import main  # noqa: E402
from orthros.training.plot import load_run, loss_figure  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"


def fake_run(path, arch, losses, evals=(), torn=False):
    """A training output_dir as the trainer leaves it: metrics.jsonl (and run_config.yaml)."""
    path.mkdir(parents=True)
    rows = [{"kind": "train", "step": 10 * (i + 1), "loss": v, "tokens": 2560 * (i + 1)} for i, v in enumerate(losses)]
    rows += [{"kind": "eval", "step": 10 * (i + 1), "eval_loss": v, "tokens": 2560 * (i + 1)} for i, v in enumerate(evals)]
    text = "".join(json.dumps(r) + "\n" for r in rows) + ('{"kind": "train", "ste' if torn else "")
    (path / "metrics.jsonl").write_text(text)
    (path / "run_config.yaml").write_text(f"mode: pt\nmodel:\n  architecture: {arch}\n")
    return path


def test_the_figure_holds_each_runs_logged_losses(tmp_path):
    a = fake_run(tmp_path / "a", "orthros", [5.0, 4.0, 3.5], evals=[4.5, 3.9], torn=True)
    b = fake_run(tmp_path / "b", "transformer", [5.1, 4.2])
    runs = [load_run(a), load_run(b)]
    assert runs[0]["label"] == "a (pt/orthros)" and runs[1]["label"] == "b (pt/transformer)"
    for x, xs_a in (("tokens", [2560, 5120, 7680]), ("step", [10, 20, 30])):
        fig = loss_figure(runs, x=x)
        train_ax, eval_ax = fig.axes
        (la, lb), (ea,) = train_ax.get_lines(), eval_ax.get_lines()
        assert list(la.get_xdata()) == xs_a and list(la.get_ydata()) == [5.0, 4.0, 3.5]
        assert list(lb.get_ydata()) == [5.1, 4.2]
        assert list(ea.get_ydata()) == [4.5, 3.9] and ea.get_label().endswith("3.9000")
    only_train = loss_figure([runs[1]])
    assert len(only_train.axes) == 1


def test_cli_writes_the_png_and_refuses_bad_runs(tmp_path, capsys):
    a = fake_run(tmp_path / "a", "orthros", [5.0, 4.0])
    b = fake_run(tmp_path / "b", "swa", [5.0, 4.4])
    assert main(["plot", str(a)]) == 0
    assert (a / "loss.png").read_bytes().startswith(PNG)
    out = tmp_path / "figs" / "cmp.png"
    assert main(["plot", str(a), str(b), "-o", str(out), "--x", "step", "--title", "t"]) == 0
    assert out.read_bytes().startswith(PNG)
    assert [p.name for p in out.parent.iterdir()] == ["cmp.png"]  # no temporary left

    empty = tmp_path / "empty"
    empty.mkdir()
    (tmp_path / "evals_only").mkdir()
    (tmp_path / "evals_only" / "metrics.jsonl").write_text('{"kind": "eval", "step": 1, "eval_loss": 3.0}\n')
    (tmp_path / "garbage").mkdir()
    (tmp_path / "garbage" / "metrics.jsonl").write_text("loss 3.0\n{torn\n")  # another program's file
    (tmp_path / "folder" / "metrics.jsonl").mkdir(parents=True)
    capsys.readouterr()
    for args, says in (([str(tmp_path / "nope")], "no such directory"),
                       # the run's metrics.jsonl was said to be 'no such directory'
                       ([str(a / "metrics.jsonl")], f"is a file, not a training output_dir (the folder of "
                                                    f"metrics.jsonl: {a})"),
                       ([str(a), str(empty)], "no metrics.jsonl"),
                       ([str(tmp_path / "evals_only")], "no training step logged"),
                       # both said "no training step logged yet" / "no metrics.jsonl"
                       ([str(tmp_path / "garbage")], "its metrics.jsonl holds no record a training run writes"),
                       ([str(tmp_path / "folder")], "its metrics.jsonl is a folder"),
                       ([str(a), "-o", str(tmp_path / "x.jpg")], "a .png path"),
                       ([str(a), "--x", "time"], "invalid choice")):
        with pytest.raises(SystemExit) as e:
            main(["plot", *args, "-o", str(tmp_path / "bad.png")] if "-o" not in args else ["plot", *args])
        assert e.value.code == 2
        assert says in capsys.readouterr().err
    assert not (tmp_path / "bad.png").exists() and not (tmp_path / "x.jpg").exists()


def test_unreadable_run_files_and_bad_outputs_are_refused_cleanly(tmp_path, capsys):
    """A torn run_config.yaml only loses the label; a metrics row without a number where the plot
    needs one, an --output that is a folder or has no .png name: exit 2 naming it, nothing written
    (they were a KeyError / YAML traceback, or an IsADirectoryError after drawing)."""
    a = fake_run(tmp_path / "a", "orthros", [5.0, 4.0])
    (a / "run_config.yaml").write_text("mode: [pt\n")  # torn mid-write
    assert load_run(a)["label"] == "a"
    for name, row, says in (("no_tokens", {"kind": "train", "step": 1, "loss": 3.0}, "'tokens'"),
                            ("str_loss", {"kind": "train", "step": 1, "loss": "x", "tokens": 5}, "'loss'"),
                            ("no_eval_loss", {"kind": "eval", "step": 1, "tokens": 5}, "an eval row of metrics.jsonl has no number for 'eval_loss'")):
        run = fake_run(tmp_path / name, "orthros", [5.0])
        with open(run / "metrics.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
        capsys.readouterr()
        with pytest.raises(SystemExit) as e:
            main(["plot", str(run), "-o", str(tmp_path / "bad.png")])
        assert e.value.code == 2
        assert says in capsys.readouterr().err
    (tmp_path / "dir.png").mkdir()
    for out, says in ((tmp_path / "dir.png", "is a directory"), (tmp_path / ".png", "a .png path"),
                      # a folder without .png in its name: was "a .png path is needed"
                      (f"{tmp_path / 'dir.png'}/", f"-o {tmp_path / 'dir.png'}/: is a directory"),
                      (tmp_path, f"-o {tmp_path}: is a directory (a .png file path is needed)"),
                      (a / "metrics.jsonl" / "x.png", "is a file, not a directory")):
        with pytest.raises(SystemExit) as e:
            main(["plot", str(a), "-o", str(out)])
        assert e.value.code == 2
        assert says in capsys.readouterr().err
    assert not (tmp_path / "bad.png").exists() and not (tmp_path / ".png").exists()
    assert list((tmp_path / "dir.png").iterdir()) == []


def test_a_run_of_one_logged_step_is_drawn(tmp_path):
    """Was: a line through one point, which matplotlib draws as nothing (an empty panel, the
    trainer's loss.png after its first eval with one train row logged); it gets a marker."""
    one = load_run(fake_run(tmp_path / "one", "orthros", [5.0], evals=[4.5]))
    many = load_run(fake_run(tmp_path / "many", "orthros", [5.0, 4.0]))
    (line_one, line_many), _ = (ax.get_lines() for ax in loss_figure([one, many]).axes)
    assert line_one.get_marker() == "o" and list(line_one.get_ydata()) == [5.0]
    assert line_many.get_marker() in (None, "None", "")  # long curves stay plain lines


def test_runs_of_one_folder_name_are_told_apart(tmp_path, monkeypatch):
    """Was: exp1/out and exp2/out, same mode and architecture, were both labelled 'out (pt/orthros)';
    such runs are labelled with their paths as given."""
    from orthros.training import plot

    seen = []
    monkeypatch.setattr(plot, "loss_figure", lambda runs, *a: seen.extend(r["label"] for r in runs))
    monkeypatch.setattr("orthros.utils.save_figure", lambda *a, **k: None)
    monkeypatch.chdir(tmp_path)
    for exp in ("exp1", "exp2", "exp3"):
        fake_run(tmp_path / exp / "out", "orthros" if exp != "exp3" else "swa", [5.0, 4.0])
    plot.plot_runs(["exp1/out", "exp2/out/", "exp3/out"], tmp_path / "x.png")
    assert seen == ["exp1/out (pt/orthros)", "exp2/out (pt/orthros)", "out (pt/swa)"]


def test_a_corrupt_byte_in_metrics_skips_its_line_as_a_torn_one(tmp_path):
    """A byte that is no UTF-8 (a damaged file) made read_metrics raise for the whole file: `orthros plot`
    said "'utf-8' codec can't decode ..." naming no file. Such a line is skipped, as a torn line is."""
    from orthros.training.metrics import read_metrics

    run = fake_run(tmp_path / "r", "orthros", [5.0, 4.0])
    with open(run / "metrics.jsonl", "ab") as f:
        f.write(b'{"kind": "train", "step": 30, "loss": \xff\n')
    assert [r["step"] for r in read_metrics(str(run))] == [10, 20]
    assert main(["plot", str(run), "-o", str(tmp_path / "p.png")]) == 0



def test_one_run_named_twice_is_drawn_once_with_a_note(tmp_path, monkeypatch, capsys):
    """`orthros plot RUN RUN/` (or RUN and a link to it) drew two identical curves, the second over the
    first, with two legend entries of one name, and said nothing. It is drawn once; stderr says so;
    and as one run it goes to RUN/loss.png by default."""
    import os

    from orthros.training import plot

    a = fake_run(tmp_path / "a", "orthros", [5.0, 4.0])
    b = fake_run(tmp_path / "b", "swa", [5.0, 4.4])
    os.symlink(a, tmp_path / "link")
    drawn = []
    real = plot.plot_runs
    monkeypatch.setattr(plot, "plot_runs", lambda runs, *args, **kw: (drawn.append(list(runs)), real(runs, *args, **kw))[1])
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert main(["plot", "a", "./a/", "b", "link", "-o", "two.png"]) == 0
    assert drawn[-1] == ["a", "b"] and (tmp_path / "two.png").read_bytes().startswith(PNG)
    err = capsys.readouterr().err
    assert "RUN ./a/ is the same folder as RUN a: drawn once" in err and "RUN link is the same folder as RUN a" in err
    assert main(["plot", "a", "a"]) == 0
    assert drawn[-1] == ["a"] and (a / "loss.png").read_bytes().startswith(PNG) and not (tmp_path / "loss.png").exists()
    assert "RUN a is the same folder as RUN a: drawn once" in capsys.readouterr().err


def test_a_home_folder_tilde_is_expanded(tmp_path, monkeypatch, capsys):
    """`orthros plot RUN -o '~/x.png'` (a ~ the shell left, quoted or from a script) was checked as the home
    folder's path but written to a folder named '~' in the working directory; RUN '~/run' was "no such
    directory". Both are the home folder's, as in the other commands; a ~NAME of no user is refused."""
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    cwd.mkdir()
    fake_run(home / "run", "orthros", [5.0, 4.0])
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(cwd)
    assert main(["plot", "~/run", "-o", "~/figs/x.png"]) == 0
    assert (home / "figs" / "x.png").read_bytes().startswith(PNG) and list(cwd.iterdir()) == []
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["plot", "~/run", "-o", "~no_such_user_x/x.png"])
    assert "-o ~no_such_user_x/x.png: no user 'no_such_user_x'" in capsys.readouterr().err  # as typed


def test_an_output_the_checks_let_through_but_cannot_be_written_names_output(tmp_path, monkeypatch, capsys):
    """Was: `orthros plot RUN -o /proc/x.png` (a place the folder checks pass, as root) failed
    naming the temporary file: "error: [Errno 2] No such file or directory: '/proc/x.png.tmp.png'".
    The error names the option as typed (-o here) and the path given; nothing is left behind."""
    import errno
    import os

    from matplotlib.figure import Figure

    a = fake_run(tmp_path / "a", "orthros", [5.0, 4.0])
    out = tmp_path / "figs" / "x.png"

    def fail(self, fname, *args, **kw):
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(fname))

    monkeypatch.setattr(Figure, "savefig", fail)
    capsys.readouterr()
    assert main(["plot", str(a), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"-o {out}: cannot write the figure (No such file or directory)" in err and ".tmp" not in err  # as typed
    assert list(out.parent.iterdir()) == []


def test_a_runs_checkpoints_folder_or_checkpoint_names_the_run(tmp_path, capsys):
    # `orthros plot RUN/checkpoints` said only "no metrics.jsonl"; compare named the run (one home: run_holding)
    run = fake_run(tmp_path / "run", "orthros", [5.0, 4.0])
    (run / "checkpoints" / "step_00000010").mkdir(parents=True)
    (tmp_path / "checkpoints").mkdir()  # a folder of that name outside a run: no run to name
    for where, says in ((run / "checkpoints", f"; it lies in the run {run}: name that"),
                        (run / "checkpoints" / "step_00000010", f"; it lies in the run {run}: name that"),
                        (tmp_path / "checkpoints", "(a training output_dir is needed)\n")):
        with pytest.raises(SystemExit) as e:
            main(["plot", str(where), "-o", str(tmp_path / "x.png")])
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert "no metrics.jsonl" in err and says in err, err
    assert not (tmp_path / "x.png").exists()


def test_non_finite_losses_are_skipped_and_counted(tmp_path):
    """A NaN or inf loss (an older metrics.jsonl's NaN / Infinity, a newer one's null) left an empty panel
    with axes around 0 ("nan" as the last eval loss), or with one finite point an invisible line; now
    the finite points are drawn as usual and the legend says how many were skipped."""
    from orthros.training.metrics import MetricsLogger

    nan, inf = float("nan"), float("inf")
    old = fake_run(tmp_path / "old", "orthros", [5.0, nan, 4.0, inf], evals=[4.5, inf, 3.9, nan])
    new = tmp_path / "new"
    new.mkdir()
    logger = MetricsLogger(str(new), tensorboard=False)
    for step, loss, ev in ((10, 5.0, 4.6), (20, inf, nan), (30, 4.2, -inf)):
        logger.log({"kind": "train", "step": step, "loss": loss, "tokens": 256 * step})
        logger.log({"kind": "eval", "step": step, "eval_loss": ev, "tokens": 256 * step})
    logger.close()
    rows = [json.loads(line, parse_constant=lambda c: pytest.fail(f"{c} in metrics.jsonl"))
            for line in (new / "metrics.jsonl").read_text().splitlines()]  # standard JSON: null
    assert [r.get("loss", r.get("eval_loss")) for r in rows] == [5.0, 4.6, None, None, 4.2, None]

    train_ax, eval_ax = loss_figure([load_run(old), load_run(new)], x="step").axes
    (ta, tb), (ea, eb) = train_ax.get_lines(), eval_ax.get_lines()
    assert (list(ta.get_xdata()), list(ta.get_ydata())) == ([10, 30], [5.0, 4.0])
    assert (list(tb.get_xdata()), list(tb.get_ydata())) == ([10, 30], [5.0, 4.2])
    assert (list(ea.get_xdata()), list(ea.get_ydata())) == ([10, 30], [4.5, 3.9])
    assert list(eb.get_ydata()) == [4.6] and eb.get_marker() == "o"
    assert ta.get_label() == "old (pt/orthros) (2 not finite, skipped)" and tb.get_label() == "new (1 not finite, skipped)"
    assert ea.get_label() == "old (pt/orthros): 3.9000 (2 not finite, skipped)"
    assert eb.get_label() == "new: 4.6000 (2 not finite, skipped)"
    assert train_ax.get_ylim()[0] < 4.0 and 5.0 < train_ax.get_ylim()[1] < 6  # the finite points' range
    assert eval_ax.get_ylim()[0] < 3.9 and 4.6 < eval_ax.get_ylim()[1] < 5

    # one finite training point among infs was an invisible line of one point; no finite eval loss: said
    one = fake_run(tmp_path / "one", "orthros", [5.0, inf], evals=[nan])
    train_ax, eval_ax = loss_figure([load_run(one)]).axes
    (t,), (e,) = train_ax.get_lines(), eval_ax.get_lines()
    assert list(t.get_ydata()) == [5.0] and t.get_marker() == "o"
    assert len(e.get_ydata()) == 0 and e.get_label() == "one (pt/orthros): none finite (1 not finite, skipped)"
    assert [x.get_text() for x in eval_ax.texts] == ["no finite loss logged"] and list(eval_ax.get_yticks()) == []


def test_output_is_named_as_typed(tmp_path, capsys):
    """Issue: `-o DIR` was refused as "--output DIR: is a directory", an option the user had not typed."""
    a = fake_run(tmp_path / "a", "orthros", [5.0, 4.0])
    for args, says in ((["-o", str(tmp_path)], f"-o {tmp_path}: is a directory"),
                       ([f"-o{tmp_path}"], f"-o {tmp_path}: is a directory"),
                       (["--output", str(tmp_path)], f"--output {tmp_path}: is a directory"),
                       (["-o", str(tmp_path / "x.jpg")], f"-o {tmp_path / 'x.jpg'}: a .png path is needed")):
        with pytest.raises(SystemExit) as e:
            main(["plot", str(a), *args])
        assert e.value.code == 2
        assert says in capsys.readouterr().err, args


def test_an_empty_output_or_run_is_refused_before_anything_is_written(tmp_path, capsys):
    """Issue: an empty -o (an unset shell variable: `-o "$OUT"`) was taken as no -o and replaced
    RUN/loss.png (exit 0), and an empty RUN was refused as "RUN : no such directory"."""
    a = fake_run(tmp_path / "a", "orthros", [5.0, 4.0])
    for args, says in ((["-o", ""], "-o is empty (''): give a .png path, or leave the option out for its default"),
                       (["--output", " "], "--output is empty (' ')"),
                       ([""], "RUN is empty (''): give a training output_dir")):
        with pytest.raises(SystemExit) as e:
            main(["plot", str(a), *args])
        assert e.value.code == 2
        assert says in capsys.readouterr().err, args
    assert sorted(p.name for p in a.iterdir()) == ["metrics.jsonl", "run_config.yaml"]  # no loss.png written

"""orthros.utils: save_figure writes through a temporary name and leaves nothing behind on failure."""

import os
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from orthros.utils import save_figure  # noqa: E402


def test_save_figure_writes_a_png_and_no_temporary(tmp_path):
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    out = tmp_path / "sub" / "plot.png"
    save_figure(fig, out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in out.parent.iterdir()) == ["plot.png"]
    assert not plt.fignum_exists(fig.number)  # closed


def test_save_figure_failure_leaves_no_file(tmp_path):
    fig, _ = plt.subplots()
    with pytest.raises(ValueError):
        save_figure(fig, tmp_path / "plot.notaformat")
    assert list(tmp_path.iterdir()) == []


def test_write_json_is_atomic_and_makes_its_folder(tmp_path):
    import json

    from orthros.utils import write_json

    p = tmp_path / "a" / "b" / "r.json"
    write_json(p, {"x": 1, "p": tmp_path}, default=str)
    assert json.loads(p.read_text()) == {"x": 1, "p": str(tmp_path)}
    assert [f.name for f in p.parent.iterdir()] == ["r.json"]  # no temporary left beside it



def _strict(text):
    """``text`` parsed as standard JSON: a NaN / Infinity in it (json.dumps' default) is an error."""
    import json

    def refuse(name):
        raise ValueError(f"not standard JSON: {name}")

    return json.loads(text, parse_constant=refuse)


def test_write_json_and_to_json_write_a_non_finite_float_as_null(tmp_path):
    """json.dumps wrote NaN / Infinity, which jq, JavaScript and most JSON readers refuse."""
    import math

    from orthros.utils import to_json, write_json

    nan, inf = float("nan"), float("inf")
    obj = {"loss": nan, "rows": [{"t": inf}, (1.5, -inf)], "ok": 2.0, "n": 3, "s": "NaN", "b": True, "p": tmp_path}
    want = {"loss": None, "rows": [{"t": None}, [1.5, None]], "ok": 2.0, "n": 3, "s": "NaN", "b": True, "p": None}
    write_json(tmp_path / "r.json", obj, default=lambda o: math.nan)  # what default returns is made finite too
    assert _strict((tmp_path / "r.json").read_text()) == want
    assert _strict(to_json(obj, default=lambda o: None)) == want
    assert obj["loss"] is nan and obj["rows"][1] == (1.5, -inf)  # the caller's object is left as it was

def test_commit_id_prefers_the_environment(monkeypatch):
    from orthros.utils import commit_id

    monkeypatch.setenv("ORTHROS_COMMIT", "abc1234")
    assert commit_id() == "abc1234"
    monkeypatch.delenv("ORTHROS_COMMIT")
    c = commit_id()  # this checkout's HEAD (or None outside git)
    assert c is None or (c and c != "abc1234")


class _Terminal(__import__("io").StringIO):
    def isatty(self):
        return True


def test_progress_is_a_bar_at_a_terminal_and_lines_elsewhere():
    import io

    from orthros.utils import Progress

    for stream, bar in ((_Terminal(), True), (io.StringIO(), False)):
        p = Progress(3, "pt/x", unit="step", every_s=None, stream=stream)
        for step in (1, 2, 3):
            p.update(1, line=step == 3, loss="1.5000", **{"tok/s": "100"})
        p.close()
        out = stream.getvalue()
        assert ("\r" in out and "3/3" in out) == bar, out
        assert (out == "[pt/x] step 3/3 loss 1.5000 tok/s 100\n") == (not bar), out
    quiet = io.StringIO()
    p = Progress(3, "pt/x", enabled=False, stream=quiet)
    p.update(3, line=True)
    p.write("x")
    p.close()
    assert quiet.getvalue() == ""


def test_progress_lines_at_most_every_interval_and_where_it_ended(monkeypatch):
    import io

    from orthros.utils import Progress

    now = [0.0]
    out = io.StringIO()
    with Progress(10_000_000, "extract m.gguf", unit="B", unit_scale=True, every_s=30.0, stream=out) as p:
        p._clock, p._last_t = (lambda: now[0]), 0.0  # a clock the test moves
        for _ in range(4):  # 10 s apart: a line only once 30 s have passed since the last
            now[0] += 10.0
            p.update(2_000_000)
        p.write("note")
    assert out.getvalue().splitlines() == ["[extract m.gguf] B 6.0M/10.0M", "note", "[extract m.gguf] B 8.0M/10.0M"]
    out = io.StringIO()
    p = Progress(None, "NIAH", unit="needle", every_s=30.0, stream=out)
    p.update(2, acc="0.50")
    p.close()
    p.close()  # twice is once
    assert out.getvalue() == "[NIAH] needle 2 acc 0.50\n"


def test_input_checks_name_the_argument(tmp_path, monkeypatch):
    """The shared refusals every CLI and entry point uses: each names its argument, and none
    creates anything."""
    import torch

    from orthros.utils import check_device, check_output_path, check_token_ids, file_in_the_way, read_text_file

    f = tmp_path / "f"
    f.write_text("x")
    assert file_in_the_way(tmp_path / "new" / "deeper") is None and file_in_the_way(f / "a" / "b") == f
    check_output_path("--out", tmp_path / "new" / "r.json")  # a folder to be made: fine
    for path, directory, says in ((tmp_path, False, "is a directory"), (f / "x.json", False, f"{f} is a file"),
                                  (f, True, f"{f} is a file")):
        with pytest.raises(ValueError, match="--out") as e:
            check_output_path("--out", path, directory=directory)
        assert says in str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]
    (tmp_path / "bin.txt").write_bytes(b"\xff\xfe")
    with pytest.raises(ValueError, match="--data .*not UTF-8"):
        read_text_file(tmp_path / "bin.txt", "--data")
    assert check_device("cpu") == "cpu" and check_device("auto", auto=True) in ("cpu", "cuda")
    for bad in ("nonsense", "meta", "auto"):
        with pytest.raises(ValueError, match="--device must be cpu, cuda or cuda:N"):
            check_device(bad)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(ValueError, match="2 CUDA device"):
        check_device("cuda:2")
    check_token_ids(torch.tensor([0, 9]), 10, "ids")
    with pytest.raises(TypeError, match="ids must be integer token ids"):
        check_token_ids(torch.tensor([1.0]), 10, "ids")
    for bad in ([10], [-1]):
        with pytest.raises(ValueError, match=r"ids must be token ids in \[0, vocab_size=10\)"):
            check_token_ids(torch.tensor(bad), 10, "ids")


def test_commit_id_is_none_outside_a_checkout_of_orthros(tmp_path, monkeypatch):
    """Installed into a folder that another repository holds (a project's .venv), the package is
    not a checkout of orthros: no commit, not that project's HEAD."""
    import subprocess

    import orthros.utils as utils

    git = lambda *a: subprocess.run(["git", *a], cwd=tmp_path, check=True, capture_output=True, text=True)  # noqa: E731
    git("init", "-q")
    (tmp_path / ".gitignore").write_text(".venv\n")
    pkg = tmp_path / ".venv" / "site" / "orthros"
    pkg.mkdir(parents=True)
    (pkg / "utils.py").write_text("")
    git("add", ".gitignore")
    git("-c", "user.email=a@b", "-c", "user.name=a", "commit", "-q", "-m", "a project")
    monkeypatch.delenv("ORTHROS_COMMIT", raising=False)
    monkeypatch.setattr(utils, "__file__", str(pkg / "utils.py"))
    assert utils.commit_id() is None
    git("add", "-f", str(pkg / "utils.py"))  # tracked: a checkout
    git("-c", "user.email=a@b", "-c", "user.name=a", "commit", "-q", "-m", "orthros")
    assert utils.commit_id() == git("rev-parse", "--short", "HEAD").stdout.strip()
    (pkg / "utils.py").write_text("# changed\n")  # the code that runs is not HEAD's: said so
    assert utils.commit_id() == git("rev-parse", "--short", "HEAD").stdout.strip() + "+dirty"


def test_writes_go_through_a_link_and_into_a_pipe(tmp_path):
    """``-o LINK`` replaced the symbolic link with a file and left its target as it was; ``-o``
    a pipe or a device (``/dev/stdout``, ``/dev/null``) was replaced by a regular file (as root:
    the system's ``/dev/null``) or refused by /dev's permissions. A link's target is written
    through a temporary name, a pipe or a device in place."""
    import os
    import threading

    from orthros.utils import write_json, write_text

    (tmp_path / "real").mkdir()
    target = tmp_path / "real" / "r.json"
    target.write_text("old")
    link = tmp_path / "r.json"
    link.symlink_to(target)
    write_json(link, {"x": 1})
    assert link.is_symlink() and target.read_text() == '{\n  "x": 1\n}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json", "real"]
    assert sorted(p.name for p in target.parent.iterdir()) == ["r.json"]
    fig, ax = plt.subplots()
    (tmp_path / "real" / "p.png").write_text("old")
    (tmp_path / "p.png").symlink_to(tmp_path / "real" / "p.png")
    save_figure(fig, tmp_path / "p.png")
    assert (tmp_path / "p.png").is_symlink() and (tmp_path / "real" / "p.png").read_bytes()[:4] == b"\x89PNG"
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()), daemon=True)
    reader.start()
    write_text(fifo, "through the pipe\n")
    reader.join(timeout=30)
    assert got == ["through the pipe\n"] and fifo.is_fifo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.png", "pipe", "r.json", "real"]


def test_check_positive_int_takes_numpy_integers_and_refuses_floats_bools_strings():
    """Was: a NumPy integer (``max_new_tokens=np.int64(5)``, a value read from an array or a sweep's
    grid) was refused ("pass a Python int"), though it is an integer. Anything ``operator.index`` takes,
    except a bool, is one now, returned as a Python int; a float (``3.0`` too), a bool (NumPy's and a
    bool tensor too) or a string is refused with the same message, naming the argument."""
    import re

    import numpy as np
    import torch

    from orthros.utils import check_positive_int

    for good in (3, np.int64(3), np.int32(3), np.uint8(3), torch.tensor(3)):
        got = check_positive_int("w", good)
        assert got == 3 and type(got) is int, good
    assert check_positive_int("w", None, allow_none=True) is None
    for bad in (0, -2, np.int64(0), 3.0, np.float64(3), "3", True, np.True_, torch.tensor(True), torch.tensor(3.0),
                None, [3]):
        with pytest.raises(ValueError, match=r"^w must be an integer >= 1, got " + re.escape(repr(bad))):
            check_positive_int("w", bad)
    with pytest.raises(ValueError, match=r"^w must be an integer >= 1 or None, got 2.5$"):
        check_positive_int("w", 2.5, allow_none=True)
    with pytest.raises(ValueError, match=r"got np.float32\(2.0\) \(a numpy.float32\)$"):  # an unusual type is named
        check_positive_int("w", np.float32(2))


def test_atomic_directory_keeps_a_destination_another_run_wrote_meanwhile(tmp_path):
    """Two runs into one new DST at once both passed the check that DST is free; the second to finish
    replaced the first's result without overwrite (a helper's finding). Now it keeps it and leaves
    nothing of its own behind; with overwrite the new result replaces it."""
    from orthros.utils import atomic_directory

    dst = tmp_path / "out"
    with pytest.raises(FileExistsError, match="appeared while this run was writing"):
        with atomic_directory(dst, overwrite=False) as tmp:
            (tmp / "mine.txt").write_text("mine")
            dst.mkdir()
            (dst / "theirs.txt").write_text("theirs")  # the other run finishes first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"] and (dst / "theirs.txt").exists()
    with atomic_directory(dst, overwrite=True) as tmp:
        (tmp / "mine.txt").write_text("mine")
    assert sorted(p.name for p in dst.iterdir()) == ["mine.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_an_interrupt_while_the_replaced_destination_is_removed_is_after_the_commit(tmp_path, monkeypatch):
    """Ctrl-C while an --overwrite run removed the previous DST (the new one already in place) ended the
    run as interrupted, and `orthros convert` said "nothing was written to DST" over the new DST. The
    removal is past the commit: the run completes, says so in a warning, and what is left of the old
    copy is a dot-folder that clean_stale removes at the next run into DST."""
    import shutil

    from orthros import utils
    from orthros.utils import OLD_TAG, atomic_directory, clean_stale

    dst = tmp_path / "out"
    dst.mkdir()
    (dst / "old.txt").write_text("old")
    real = shutil.rmtree

    def interrupted(path, *a, **k):
        if OLD_TAG in str(path) and not k.get("ignore_errors"):
            raise KeyboardInterrupt
        return real(path, *a, **k)

    monkeypatch.setattr(utils.shutil, "rmtree", interrupted)
    with pytest.warns(UserWarning, match="KeyboardInterrupt while the previous .*out.* was removed: the new one is in place"):
        with atomic_directory(dst, overwrite=True) as tmp:
            (tmp / "new.txt").write_text("new")
    monkeypatch.setattr(utils.shutil, "rmtree", real)
    assert sorted(p.name for p in dst.iterdir()) == ["new.txt"]
    left = [p.name for p in tmp_path.iterdir() if p.name != "out"]
    assert len(left) == 1 and OLD_TAG in left[0]
    monkeypatch.setattr(utils, "pid_alive", lambda pid: False)  # the next run, this process gone
    clean_stale(dst)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_an_output_path_that_cannot_be_written_is_refused_before_any_work(tmp_path, monkeypatch):
    """``orthros eval mqar -o /read-only/m.json`` trained every model, printed the table, then
    failed with "OSError: Read-only file system" and exit 1: check_output_path only looked for a
    file in the way. A folder this process may not write into (read-only, or another user's) is
    now bad input, named, before the work."""
    import os
    import stat
    from pathlib import Path

    from orthros.utils import check_output_path

    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(stat.S_IRUSR | stat.S_IXUSR)
    real_access = os.access
    if real_access(ro, os.W_OK):  # root writes anywhere a mode forbids: say what a read-only mount would
        monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if Path(p) == ro and mode & os.W_OK
                            else real_access(p, mode, **kw))
    try:
        for path, directory in ((ro / "m.json", False), (ro / "deep" / "m.json", False), (ro / "out", True)):
            with pytest.raises(ValueError, match=f"--out {path}: {ro} is not writable") as e:
                check_output_path("--out", path, directory=directory)
            assert "--out" in str(e.value)
        check_output_path("--out", tmp_path / "w" / "m.json")  # a writable folder: fine
    finally:
        ro.chmod(stat.S_IRWXU)


def test_a_rewritten_file_keeps_its_mode(tmp_path):
    """write_text / save_figure replace a file through a temporary one: a results file the user had
    made private (0600) came back 0644 (the umask's mode of a new file)."""
    import stat

    from orthros.utils import write_text

    for name, write in (("r.json", lambda p: write_text(p, "{}\n")),
                        ("p.png", lambda p: save_figure(plt.subplots()[0], p))):
        p = tmp_path / name
        write(p)
        p.chmod(0o600)
        write(p)
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, name


def test_format_bytes_rounds_up_into_the_next_unit():
    """A size just under a unit's boundary was shown as 1,024 of the unit below (1,048,575 bytes:
    '1,024.0 KiB'); the unit is chosen after rounding to the digits shown."""
    from orthros.utils import format_bytes

    assert [format_bytes(n) for n in (0, 1023, 1023.6, 1024, 1048575, 1024 * 1023.9, 3 * 2**40)] == [
        "0 B", "1,023 B", "1.0 KiB", "1.0 KiB", "1.0 MiB", "1,023.9 KiB", "3.0 TiB"]


def test_expand_path_names_the_argument_for_a_user_this_machine_lacks(tmp_path, monkeypatch):
    """pathlib's expanduser raised a bare RuntimeError('Could not determine home directory.') for
    `~nosuchuser/x`, naming neither the path nor the argument; os.path.expanduser kept it as typed
    (a folder named '~nosuchuser' in the working directory)."""
    from orthros.utils import expand_path

    monkeypatch.setenv("HOME", str(tmp_path))
    assert expand_path("~/x", "dst") == tmp_path / "x"
    assert expand_path(tmp_path / "a~b", "dst") == tmp_path / "a~b"
    assert expand_path("x/~nosuchuser9", "dst") == Path("x/~nosuchuser9")  # a ~ inside a path is a name
    for value in ("~nosuchuser9/x", "~nosuchuser9"):
        with pytest.raises(ValueError, match=r"^--out ~nosuchuser9.*: no user 'nosuchuser9' on this machine"):
            expand_path(value, "--out")
    from orthros.utils import check_output_path

    with pytest.raises(ValueError, match=r"^--out ~nosuchuser9/r.json: no user 'nosuchuser9'"):
        check_output_path("--out", "~nosuchuser9/r.json")  # every CLI's output check, for API callers too


def test_orthros_cache_with_a_user_this_machine_lacks_is_named(monkeypatch):
    from orthros.utils import cache_root

    monkeypatch.setenv("ORTHROS_CACHE", "~nosuchuser9/cache")
    with pytest.raises(ValueError, match=r"^\$ORTHROS_CACHE ~nosuchuser9/cache: no user 'nosuchuser9'"):
        cache_root()


def test_stop_on_sigterm_runs_cleanups_and_exits_143_with_one_line(tmp_path, capsys):
    """A command's main under @stop_on_sigterm: SIGTERM stops it as Ctrl-C does (its finally blocks run:
    no temporary file stays), one line on stderr, exit 143; the previous SIGTERM handler is back."""
    import os
    import signal

    from orthros.utils import stop_on_sigterm, write_text

    before = signal.getsignal(signal.SIGTERM)

    @stop_on_sigterm("orthros thing")
    def main(argv):
        tmp = tmp_path / ".out.tmp"
        try:
            tmp.write_text("half")
            os.kill(os.getpid(), signal.SIGTERM)
            write_text(tmp_path / "out", "never")
        finally:
            tmp.unlink(missing_ok=True)
        return 0

    assert main([]) == 143
    assert list(tmp_path.iterdir()) == []
    assert capsys.readouterr().err == "orthros thing: terminated (SIGTERM)\n"
    assert signal.getsignal(signal.SIGTERM) is before
    assert stop_on_sigterm("x")(lambda: 7)() == 7  # a run SIGTERM did not reach returns its own code


def test_sigterm_as_interrupt_outside_the_main_thread_changes_nothing():
    """signal.signal raises ValueError outside the main thread: the helper (used by `orthros train`
    main, which a notebook may run in a thread) leaves the handler alone there."""
    import signal
    import threading

    from orthros.utils import sigterm_as_interrupt

    before, seen = signal.getsignal(signal.SIGTERM), []

    def work():
        with sigterm_as_interrupt():
            seen.append(signal.getsignal(signal.SIGTERM))

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert seen == [before] and signal.getsignal(signal.SIGTERM) is before


def test_a_failed_figure_write_names_the_option_and_the_path_given(tmp_path, monkeypatch):
    """Was: a figure that could not be written (`orthros plot -o /proc/x.png`: a place the folder
    checks let through) failed naming the temporary file ('[Errno 2] ...: /proc/x.png.tmp.png'),
    neither the option nor the path the user gave. The error (of the same class, errno kept) names
    both, the figure is closed and no temporary is left."""
    import errno

    from matplotlib.figure import Figure

    out = tmp_path / "figs" / "p.png"
    for code, cls in ((errno.ENOENT, FileNotFoundError), (errno.EACCES, PermissionError), (errno.ENOSPC, OSError)):
        def fail(self, fname, *a, code=code, **k):
            open(fname, "wb").close()  # half written, then the failure
            raise OSError(code, os.strerror(code), str(fname))

        monkeypatch.setattr(Figure, "savefig", fail)
        fig, _ = plt.subplots()
        with pytest.raises(cls) as e:
            save_figure(fig, out, name="--output")
        assert str(e.value) == f"--output {out}: cannot write the figure ({os.strerror(code)})"
        assert e.value.errno == code and ".tmp" not in str(e.value)
        assert not plt.fignum_exists(fig.number) and list(out.parent.iterdir()) == []
    monkeypatch.undo()
    (tmp_path / "file").write_text("x")  # a folder to make where a file is
    fig, _ = plt.subplots()
    with pytest.raises(OSError, match=re.escape(f"{tmp_path / 'file' / 'p.png'}: cannot write the figure")):
        save_figure(fig, tmp_path / "file" / "p.png")  # no option name: the path alone
    assert not plt.fignum_exists(fig.number)


def test_check_png_says_a_folder_is_one(tmp_path):
    """Was: `--plot DIR` / `-o DIR` (an existing folder) said "a .png path is needed"; a folder is
    said to be one (named with the option), even one whose name ends in .png."""
    from orthros.utils import check_png

    (tmp_path / "figs.png").mkdir()
    for folder in (tmp_path, tmp_path / "figs.png"):
        with pytest.raises(ValueError, match=re.escape(f"--plot {folder}: is a directory (a .png file path is needed)")):
            check_png("--plot", folder)
    for bad in (tmp_path / "x.jpg", tmp_path / ".png", "x", f"{tmp_path}/new.png/"):  # new.png/: written as a file
        with pytest.raises(ValueError, match=re.escape(f"--plot {bad}: a .png path is needed")):
            check_png("--plot", bad)
    check_png("--plot", tmp_path / "new.PNG")


def test_check_png_is_check_output_path_for_a_png(tmp_path):
    """One home for 'is a directory' (check_png and check_output_path each tested it): a figure's path is an output
    path of a suffix, so check_png refuses what check_output_path refuses too (a folder it cannot write into)."""
    import os

    from orthros.utils import check_output_path, check_png

    with pytest.raises(ValueError, match=re.escape(f"--plot {tmp_path}: is a directory (a .png file path is needed)")):
        check_output_path("--plot", tmp_path, suffix=".png")
    with pytest.raises(ValueError, match=re.escape(f"--plot {tmp_path / 'x.jpg'}: a .png path is needed")):
        check_output_path("--plot", tmp_path / "x.jpg", suffix=".png")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if not os.access(locked, os.W_OK):  # (root writes anywhere)
            with pytest.raises(ValueError, match="is not writable"):
                check_png("--plot", locked / "p.png")
    finally:
        locked.chmod(0o700)


def test_check_replaceable_dir_in_a_deleted_working_folder(tmp_path, monkeypatch):
    # a shell left in a deleted folder: Path.cwd() raised a bare FileNotFoundError, even for an absolute output
    from orthros.utils import check_replaceable_dir

    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    check_replaceable_dir(str(tmp_path / "out"), "--out")
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(ValueError, match="is the home folder"):
        check_replaceable_dir(str(tmp_path), "--out")


def test_written_together_renames_all_or_none(tmp_path):
    """utils.written_together: a results JSON and its plot are both written or neither is (before, only
    the evaluation tests reached it)."""
    from orthros.utils import write_json, write_text, written_together

    old = tmp_path / "res.json"
    old.write_text("old\n")
    new_folder = tmp_path / "made" / "here"
    with pytest.raises(RuntimeError, match="the plot failed"):
        with written_together():
            write_json(old, {"a": 1})
            write_text(new_folder / "notes.txt", "x")
            assert old.read_text() == "old\n"  # the rename waits for the block's end
            raise RuntimeError("the plot failed")
    assert old.read_text() == "old\n" and not (tmp_path / "made").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["res.json"]  # no temporary left

    with written_together():
        write_json(old, {"a": 1})
        write_text(new_folder / "notes.txt", "x")
    assert old.read_text() == '{\n  "a": 1\n}\n' and (new_folder / "notes.txt").read_text() == "x"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["made", "res.json"]


def test_written_together_after_a_write_error_the_caller_caught(tmp_path, monkeypatch):
    """A write that failed inside the block, caught by its caller (a plot that may fail, the run goes on),
    left its entry behind: the block's end renamed a temporary that was gone (FileNotFoundError)."""
    from orthros.utils import write_text, written_together

    real = Path.write_text

    def full_disk(self, *a, **kw):
        if ".fig.txt.tmp-" in self.name:
            raise OSError(28, "No space left on device")
        return real(self, *a, **kw)

    monkeypatch.setattr(Path, "write_text", full_disk)
    with written_together():
        with pytest.raises(OSError, match="No space left"):
            write_text(tmp_path / "fig.txt", "figure")
        write_text(tmp_path / "res.txt", "results")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["res.txt"]


def test_install_hints_name_each_extras_packages():
    """Messages said "pip install 'orthros[gguf]'", which no package index holds (orthros installs from a
    clone): they name the extra's packages, kept equal to pyproject.toml's lists here."""
    import re
    import tomllib
    from pathlib import Path

    from orthros.utils import EXTRAS, install_hint

    extras = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for extra, packages in EXTRAS.items():
        names = {re.split(r"[<>=!~ ;]", r, maxsplit=1)[0] for r in extras[extra]}
        assert {re.split(r"[<>=!~]", p, maxsplit=1)[0] for p in packages.split()} == names, extra
        pins = {r for r in extras[extra] if "==" in r}  # an exact pin (fla-core) travels with the name
        assert pins <= set(packages.split()), extra
        assert install_hint(extra) == f"pip install {packages} (in a clone of orthros: pip install -e '.[{extra}]')"


def test_clean_stale_in_a_folder_it_may_not_list_finds_nothing(tmp_path, unlistable):
    """A destination in a folder this user may write into but not list (mode 300): clean_stale's look for what
    a killed writer left raised PermissionError, which stopped `orthros convert` (and niah-train) with a bare
    errno line; it can find nothing there, and the write itself goes on."""
    from orthros.utils import clean_stale

    unlistable(tmp_path)
    assert clean_stale(tmp_path / "out") == []

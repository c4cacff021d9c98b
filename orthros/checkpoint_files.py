"""Checks of a local checkpoint directory before anything is loaded from it, each failure a
one-line ``ValueError`` that names the path or file and what is wrong.

* :func:`checkpoint_dir` -- the directory exists, is one, and has a readable ``config.json``;
  ``model_type`` is ``"orthros"`` (a Llama / Qwen / Mistral checkpoint gets "convert it first", a GGUF
  file too, unless its architecture is one ``orthros convert`` does not take: :func:`gguf_refusal`).
* :func:`check_weights` -- every safetensors file transformers would read (``model.safetensors``
  or the shards of ``model.safetensors.index.json``) exists and is complete: its header parses,
  and the tensors' byte ranges match their dtypes and shapes and the file's size. A truncated or
  overwritten file is named here instead of surfacing as a bare ``SafetensorError``. (Flipped
  bytes inside the tensor data cannot be seen without checksums; training checkpoints carry
  those in ``manifest.json``.)
* :func:`check_tokenizer_dir` -- a tokenizer's files are present.

``OrthrosPreTrainedModel.from_pretrained`` runs :func:`check_local_checkpoint` (weights of a
local directory; a local-looking path that does not exist is an error, never a hub lookup);
``orthros generate`` runs all of them. Whether the weights fit the model of ``config.json``
needs the model: :mod:`orthros.models.loading`. Every caller imports these names from here.

Only the standard library is used here, and this module sits outside :mod:`orthros.models`
(whose import loads transformers and torch, seconds): the commands refuse a wrong path with it in
a fraction of a second. It is part of the remote code saved beside every checkpoint
(``remote_code.py``).
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

from .layout import CHECKPOINTS, MANIFEST, latest_checkpoint, list_checkpoints
from .utils import check_not_blank, check_output_path, expand_path

WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
# what transformers also loads, where there are no safetensors files (no header to read without loading it)
PT_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json")
# bytes per element of the safetensors dtype names
DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E4M3FNUZ": 1, "F8_E5M2FNUZ": 1,
               "F8_E8M0": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8,
               "F64": 8, "C64": 8}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt",
                   "spiece.model", "tiktoken.model")
# the model types `orthros convert` takes (conversion/architectures.py; not imported: remote code)
CONVERTIBLE = ("llama", "qwen2", "qwen3", "mistral", "qwen3_5_text")


class CheckpointError(ValueError):
    """A checkpoint directory or file that cannot be loaded, with the reason."""


def _expand(path, arg: str) -> Path:
    """``path`` with ``~`` / ``~NAME`` expanded, or a :class:`CheckpointError` naming ``arg`` for the
    ``~NAME`` of no user (pathlib raises a bare RuntimeError; os.path keeps it as typed)."""
    try:
        return expand_path(path, arg)
    except ValueError as e:
        raise CheckpointError(str(e)) from None


def save_directory(path) -> str:
    """``save_pretrained``'s ``save_directory`` with ``~`` expanded, as ``from_pretrained`` expands it
    (transformers made a folder named ``~`` in the working one, which ``from_pretrained("~/...")``
    then did not find), or a ``ValueError`` naming ``save_directory`` before anything is written:
    empty or blank, an existing file or a path below one (transformers logged an error, wrote
    nothing and returned as if it had saved), or a folder this process may not write into."""
    check_not_blank(path, "save_directory", "output")
    p = expand_path(path, "save_directory")
    check_output_path("save_directory", p, directory=True)
    return os.fspath(p)


def looks_local(path) -> bool:
    """True for a path no hub repo id can be: absolute, ``.``/``~``-relative, a backslash, or
    more than one ``/`` (repo ids are ``name`` or ``org/name``)."""
    s = os.fspath(path)
    return (os.path.isabs(s) or s.startswith((".", "~")) or "\\" in s or s.count("/") > 1
            or s.endswith("/"))


def _check_not_blank(path, arg: str, what: str) -> None:
    """:func:`~orthros.utils.check_not_blank` as a :class:`CheckpointError`."""
    try:
        check_not_blank(path, arg, what)
    except ValueError as e:
        raise CheckpointError(str(e)) from None


def checkpoint_dir(path, *, arg: str = "--model") -> Path:
    """``path`` as a checkpoint directory with a readable ``config.json`` of an Orthros model."""
    _check_not_blank(path, arg, "checkpoint")
    p = _expand(path, arg)
    if not p.exists():
        raise CheckpointError(f"{arg} {path}: no such directory (a local Orthros checkpoint directory is needed; "
                              f"nothing is downloaded)")
    if not p.is_dir():
        why = gguf_refusal(p)
        raise CheckpointError(f"{arg} {path}: {why}" if why else f"{arg} {path}: not a directory (expected a "
                              f"checkpoint directory with config.json and model.safetensors){gguf_hint(p, path)}")
    cfg = p / "config.json"
    if not cfg.is_file():
        hint = _run_hint(p)
        why = not hint and gguf_refusal(p)
        raise CheckpointError(f"{arg} {path}: {why}" if why else f"{arg} {path}: no config.json (not a checkpoint "
                              f"directory){hint or gguf_hint(p, path)}")
    try:
        d = json.loads(cfg.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{arg} {path}: config.json is not readable JSON ({e})") from None
    mt = d.get("model_type") if isinstance(d, dict) else None
    if mt != "orthros":
        raise CheckpointError(f"{arg} {path}: {_not_orthros(mt, path)}")
    return p


def _not_orthros(model_type, path) -> str:
    """Why a checkpoint of another ``model_type`` is refused, and what to do instead."""
    hint = (f"; convert it first: orthros convert {path} DST" if model_type in CONVERTIBLE else
            f" (convertible to Orthros: {', '.join(CONVERTIBLE)})")
    return f"model_type {model_type!r} is not an Orthros checkpoint{hint}"


# --- GGUF files: what a .gguf file is, read from its header without the gguf package
GGUF_SUFFIX = ".gguf"
GGUF_MAGIC = b"GGUF"
# GGUF general.architecture -> the transformers class `orthros convert` maps it to (orthros.conversion.gguf;
# llama.cpp writes Mistral models as `llama`; gguf-py has no `mistral` tensor map to load one by)
GGUF_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}


def gguf_files(d: Path) -> list:
    """The ``.gguf`` files directly in the directory ``d``, sorted."""
    return sorted(c for c in d.iterdir() if c.is_file() and c.suffix.lower() == GGUF_SUFFIX)


def is_gguf_source(path) -> bool:
    """True for a ``.gguf`` file, or a directory that holds a ``.gguf`` file and no config.json."""
    p = expand_path(path, "source")
    if p.is_file() or (not p.exists() and p.suffix.lower() == GGUF_SUFFIX):
        return p.suffix.lower() == GGUF_SUFFIX
    if p.is_dir() and not (p / "config.json").is_file():
        return bool(gguf_files(p))
    return False


# GGUF value types (the file format's numbers; gguf.GGUFValueType) -> bytes of one value, and the two others
_GGUF_SCALAR_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_GGUF_STRING, _GGUF_ARRAY = 8, 9


def gguf_architecture(gguf_file: Path) -> str | None:
    """The ``general.architecture`` of a GGUF file, read from its header with the standard library alone:
    the gguf package's reader parses every field first, the tokenizer's arrays included (7 s for a
    vocabulary of 151k tokens). ``None`` where the file is no GGUF of version 2 or 3 (either byte order)
    or has no such text field, ``EOFError`` / ``ValueError`` for a damaged header
    (``orthros.conversion.gguf.inspect_gguf`` says what is wrong)."""
    size = gguf_file.stat().st_size
    with open(gguf_file, "rb") as f:
        def take(fmt: str):
            n = struct.calcsize(fmt)
            data = f.read(n)
            if len(data) != n:
                raise EOFError
            return struct.unpack(fmt, data)[0]

        def skip(vtype: int) -> None:
            if vtype in _GGUF_SCALAR_BYTES:
                f.seek(_GGUF_SCALAR_BYTES[vtype], 1)
            elif vtype == _GGUF_STRING:
                f.seek(take(order + "Q"), 1)
            elif vtype == _GGUF_ARRAY:
                item, count = take(order + "I"), take(order + "Q")
                if item in _GGUF_SCALAR_BYTES:
                    f.seek(count * _GGUF_SCALAR_BYTES[item], 1)
                elif count > size:  # each item at least 8 bytes: a damaged count
                    raise EOFError
                else:
                    for _ in range(count):
                        skip(item)
            else:
                raise ValueError(f"GGUF value type {vtype}")
            if f.tell() > size:
                raise EOFError

        if f.read(4) != GGUF_MAGIC:
            return None
        raw = f.read(4)  # the version, little-endian; a big-endian file's reads as v << 24
        order = "<" if len(raw) == 4 and struct.unpack("<I", raw)[0] & 0xFFFF else ">"
        if len(raw) != 4 or struct.unpack(order + "I", raw)[0] not in (2, 3):
            return None
        take(order + "Q")  # the tensor count
        for _ in range(take(order + "Q")):  # the fields
            key_len = take(order + "Q")
            if key_len > size:
                return None
            key = f.read(key_len)
            vtype = take(order + "I")
            if key == b"general.architecture":
                if vtype != _GGUF_STRING:
                    return None
                n = take(order + "Q")
                value = f.read(n) if n <= size else b""
                return value.decode("utf-8", errors="replace") if len(value) == n else None
            skip(vtype)
    return None


def unconvertible_gguf(path) -> tuple[Path, str] | None:
    """``(the .gguf file, its general.architecture)`` where ``path`` is a GGUF source
    (:func:`is_gguf_source`: a ``.gguf`` file, or a folder holding exactly one and no config.json) of an
    architecture ``orthros convert`` does not take (:data:`GGUF_ARCHITECTURES`); ``None`` for any other
    path, a GGUF of an architecture it takes, and one whose architecture cannot be read (several .gguf
    files, no GGUF, a damaged header: the conversion says why). Imports neither torch nor the gguf
    package: ``orthros convert`` refuses such a file before torch loads, and
    ``orthros info`` / ``generate`` / ``eval`` / ``bench`` name it (:func:`gguf_refusal`)."""
    try:
        if not is_gguf_source(path):
            return None
        p = expand_path(path, "source")
        found = gguf_files(p) if p.is_dir() else [p]
        if len(found) != 1:
            return None
        gguf_file = found[0]
        arch = gguf_architecture(gguf_file)
    except (OSError, ValueError, EOFError, struct.error, RecursionError):
        return None
    return None if arch is None or arch in GGUF_ARCHITECTURES else (gguf_file, arch)


def gguf_hint(p: Path, path) -> str:
    """For a GGUF file, or a directory holding one and no config.json, how to convert it, as the end
    of an error message; otherwise ``""`` (also for a folder that cannot be listed: the message it ends
    says what is wrong, not a ``PermissionError`` traceback)."""
    try:
        if p.is_file() and p.suffix.lower() == GGUF_SUFFIX or p.is_dir() and gguf_files(p):
            return f"; it is a GGUF checkpoint: convert it first: orthros convert {path} DST"
    except OSError:
        pass
    return ""


def gguf_refusal(p: Path) -> str | None:
    """For a GGUF checkpoint ``p`` (a ``.gguf`` file, or a folder holding one and no config.json) of a
    ``general.architecture`` that ``orthros convert`` does not take, why it is refused, as the words after
    ``ARG PATH: ``: "convert it first" (:func:`gguf_hint`) sent the user to a conversion that refuses it.
    ``None`` otherwise."""
    found = unconvertible_gguf(p)  # (the header only: neither torch nor the gguf package)
    if found is None:
        return None
    file, arch = found
    what = f"holds the GGUF file {file.name}," if p.is_dir() else "a GGUF file"
    return (f"{what} of architecture {arch!r}, not an Orthros checkpoint; orthros convert cannot make it one "
            f"(the GGUF architectures it converts: {', '.join(GGUF_ARCHITECTURES)})")


def _run_hint(d: Path) -> str:
    """For a training run's directory (``output_dir``: no config.json, checkpoints below) or its
    checkpoints folder, the path of its latest complete checkpoint (:mod:`orthros.layout`'s rule,
    as a resume picks it), as the end of an error message; otherwise ``""``."""
    if list_checkpoints(d):
        run, what = d, "it looks like a training run"
    elif d.name == CHECKPOINTS and list_checkpoints(d.parent):
        run, what = d.parent, "it is a training run's checkpoints folder"
    else:
        return ""
    latest = latest_checkpoint(run)
    return (f"; {what}: its latest checkpoint is {latest}" if latest is not None else
            f"; {what}, with no complete checkpoint (none has its {MANIFEST}: saves cut short)")


def _weight_files(d: Path) -> list[Path]:
    """The safetensors files a load of ``d`` reads, as transformers picks them: ``model.safetensors``
    when it is there (even beside an index), else the shards of the index."""
    if (d / WEIGHTS).is_file():
        return [d / WEIGHTS]
    index = d / WEIGHTS_INDEX
    if index.is_file():
        try:
            wm = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            shards = sorted(set(wm.values()))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
            raise CheckpointError(f"{index}: not a safetensors index ({type(e).__name__}: {e})") from None
        missing = [s for s in shards if not (d / s).is_file()]
        if missing:
            raise CheckpointError(f"{index} names shard(s) that are missing: {', '.join(missing)}")
        return [d / s for s in shards]
    return []


def check_safetensors_file(path) -> dict:
    """Raise :class:`CheckpointError` naming ``path`` if its header or size is not that of a
    complete safetensors file; return its tensors' entries (name -> dtype, shape, offsets).
    Reads the header only."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise CheckpointError(f"{path}: truncated safetensors file ({size} bytes, no header)")
        (n,) = struct.unpack("<Q", head)
        if n > size - 8:
            raise CheckpointError(f"{path}: truncated or not a safetensors file (header of {n} bytes announced, "
                                  f"file has {size} bytes)")
        try:
            header = json.loads(f.read(n).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CheckpointError(f"{path}: corrupted safetensors header ({e})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: corrupted safetensors header (not a JSON object)")
    data, end = size - 8 - n, 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            begin, stop = (int(x) for x in info["data_offsets"])
            numel = 1
            for s in info["shape"]:
                numel *= int(s)
            want = numel * DTYPE_BYTES[info["dtype"]]
        except (KeyError, TypeError, ValueError):
            raise CheckpointError(f"{path}: corrupted safetensors header (entry {name!r}: {info!r})") from None
        if not 0 <= begin <= stop or stop - begin != want:
            raise CheckpointError(f"{path}: corrupted safetensors header (tensor {name!r} spans bytes "
                                  f"{begin}..{stop}, its dtype and shape need {want})")
        end = max(end, stop)
    if end > data:
        raise CheckpointError(f"{path}: truncated safetensors file ({data} bytes of tensor data, the header "
                              f"describes {end}; re-save or re-copy the checkpoint)")
    if end < data:
        raise CheckpointError(f"{path}: corrupted safetensors file ({data - end} bytes after the last tensor)")
    header.pop("__metadata__", None)
    return header


def weight_headers(path) -> dict:
    """Check every safetensors file a load of directory ``path`` reads; return each file's
    tensor entries (:func:`check_safetensors_file`), in load order."""
    d = _expand(path, "path")
    return {f: check_safetensors_file(f) for f in _weight_files(d)}


def check_weights(path) -> list[Path]:
    """Check every safetensors file a load of directory ``path`` reads; return them."""
    return list(weight_headers(path))


def check_local_checkpoint(path, subfolder: str = "", *, config_given: bool = False):
    """What ``from_pretrained`` checks first: a local directory's weights are complete and, unless
    the caller passes its own config (``config_given``), it has a ``config.json`` (transformers
    would build the defaults' model) and that is an Orthros one (a Llama / Qwen / Mistral checkpoint
    gets "convert it first"); a file (its ``config.json``, a
    weights or GGUF file) or a local-looking path that does not exist is an error (the latter never
    becomes a hub lookup). Other names (hub repo ids) are left to transformers. Returns the path to
    load: a local directory's with ``~`` expanded (transformers takes ``~/ckpt`` for a repo id)."""
    if not isinstance(path, (str, os.PathLike)):
        return path
    d = _expand(path, "pretrained_model_name_or_path")
    if d.is_dir():
        hint = "" if subfolder or (d / "config.json").is_file() else _run_hint(d)
        if hint:
            raise CheckpointError(f"{path}: no config.json (not a checkpoint directory){hint}")
        d = d / subfolder if subfolder else d
        if not config_given and not (d / "config.json").is_file():  # transformers built OrthrosConfig()'s defaults
            where = f" in subfolder {subfolder!r}" if subfolder else ""
            why = gguf_refusal(d)
            hint = gguf_hint(d, path) or "; weights without their config.json load with config=OrthrosConfig(...)"
            raise CheckpointError(f"{path}: {why}" if why else
                                  f"{path}: no config.json{where} (not a checkpoint directory){hint}")
        if not config_given:
            mt = _model_type(d / "config.json")
            if isinstance(mt, str) and mt != "orthros":
                raise CheckpointError(f"{path}: {_not_orthros(mt, path)}")
        check_weights(d)
        return str(d)  # (expanded above)
    elif d.is_file():  # transformers would read it as a config (JSON) or as torch.load weights
        why = gguf_refusal(d)
        where = gguf_hint(d, path) or f"; pass the directory that holds it: {d.parent}"
        raise CheckpointError(f"{path}: {why}" if why else f"{path}: not a directory (from_pretrained takes a "
                              f"checkpoint directory, with config.json and the weights){where}")
    elif not d.exists() and looks_local(path):
        raise FileNotFoundError(f"{path}: no such checkpoint directory (a local path is never looked up on the hub)")
    return path


def local_config_path(path):
    """``OrthrosConfig.from_pretrained``'s path (a checkpoint directory or a config file): ``~``
    expanded, and a local-looking path that does not exist a ``FileNotFoundError`` (transformers
    took both for hub repo ids: "OSError: Repo id must use alphanumeric chars ..."). Other names
    (hub repo ids) are left to transformers."""
    if not isinstance(path, (str, os.PathLike)):
        return path
    d = _expand(path, "pretrained_model_name_or_path")
    if d.exists():
        return str(d)
    if looks_local(path):
        raise FileNotFoundError(f"{path}: no such checkpoint directory or config file (a local path is never looked "
                                f"up on the hub)")
    return path


def _model_type(config_json: Path):
    """The ``model_type`` of a config.json, or ``None`` where there is none to read (transformers
    then says what is wrong)."""
    try:
        d = json.loads(config_json.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return d.get("model_type") if isinstance(d, dict) else None


def has_tokenizer(directory) -> bool:
    """Whether ``directory`` holds one of a tokenizer's files (:data:`TOKENIZER_FILES`)."""
    return any(os.path.isfile(os.path.join(directory, f)) for f in TOKENIZER_FILES)


def check_tokenizer_dir(path, *, arg: str = "--tokenizer") -> Path:
    """``path`` as a directory holding tokenizer files."""
    _check_not_blank(path, arg, "tokenizer")
    p = _expand(path, arg)
    if p.is_file():  # a tokenizer's own file (tokenizer.json): the folder that holds it is what is meant
        which = f" ({arg} {p.parent})" if p.name in TOKENIZER_FILES else ""
        raise CheckpointError(f"{arg} {path}: a file; {arg} takes the directory that holds the tokenizer's "
                              f"files{which}")
    if not p.is_dir():
        raise CheckpointError(f"{arg} {path}: no such directory")
    if not has_tokenizer(p):
        what = ("give the folder that holds them" if arg == "--tokenizer" else
                "save the tokenizer beside the model or pass --tokenizer DIR")
        raise CheckpointError(f"{arg} {path}: no tokenizer files ({', '.join(TOKENIZER_FILES[:2])}, ...); {what}")
    return p


__all__ = ["CheckpointError", "checkpoint_dir", "check_weights", "weight_headers", "check_safetensors_file",
           "check_local_checkpoint", "check_tokenizer_dir", "has_tokenizer", "looks_local", "local_config_path",
           "save_directory", "GGUF_ARCHITECTURES", "gguf_files", "is_gguf_source", "gguf_architecture",
           "unconvertible_gguf", "gguf_hint", "gguf_refusal"]

"""The checks of ``orthros convert``'s arguments and of a source's ``config.json`` that need neither
torch nor transformers: the command makes them before it imports :mod:`orthros.conversion.convert`
(seconds), so a missing or empty source, a file that is no checkpoint, an unsupported or quantized
architecture, a folder without the weights the conversion reads (none, an index that is corrupt or names
a missing shard) is refused in a fraction of a second; ``convert_checkpoint`` and ``plan_conversion``
make the same checks through :mod:`~orthros.conversion.convert` (the weight files after transformers
has checked the config's values)."""

from __future__ import annotations

import errno
import json
import os
import re
from pathlib import Path

from ..utils import check_not_blank, expand_path, named_os_error, staged_name_bytes
from .architectures import UnsupportedModelError, architecture_of, check_supported

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# the suffixes of weight files (of any format): a source's files of another format are named in its refusal
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf", ".onnx", ".npz")
# the one folder of a source directory that is copied: transformers' tokenizer keeps its named chat
# templates (all but "default") there; other folders (``original/`` weights, ``onnx/`` ...) are not
COPIED_DIRS = {"additional_chat_templates"}


# How the conversion's errors name the settings a caller can change: the Python API's keywords here;
# orthros convert passes its options (cli.CLI_NAMES), as the engine's length checks take a front end's names
API_NAMES = {"overwrite": "overwrite=True", "window_size": "window_size", "dtype": "dtype",
             "dry_run": "plan_conversion", "download": "convert_checkpoint"}


def _names(names) -> dict:
    return {**API_NAMES, **(names or {})}


def _nv(names: dict, key: str, value) -> str:
    """A setting and its value as the caller writes it: ``window_size=64`` / ``--window-size 64``."""
    return f"{names[key]} {value}" if names[key].startswith("-") else f"{names[key]}={value}"


# ----------------------------------------------------------------------------------------- checks
def _path_arg(value, name: str) -> Path:
    """:func:`expand_path`, with ``""`` (or blanks) refused: pathlib reads it as the working folder, so
    ``src=""`` (an unset variable) converted the folder the caller stood in (orthros convert refuses an
    empty SRC / DST too)."""
    check_not_blank(value, name, hint="name a path ('.' for the current directory)")
    return expand_path(value, name)


class SourceNotReadable(PermissionError, ValueError):
    """A source that this user may not look up, list or read (or a file of it that the conversion reads or
    copies): a ``PermissionError``, and bad input (a ``ValueError``: ``orthros convert`` exits 2, as for a
    destination it may not write), raised before any work."""


def _not_readable(p: Path, what: str, e: OSError) -> SourceNotReadable:
    err = SourceNotReadable(f"source {str(p)!r}: {what} ({e.strerror or e})")
    err.errno = e.errno
    return err


def _src_arg(value, name: str) -> Path:
    """:func:`_path_arg` for a source: a name beyond the file system's limit is a source that does not exist,
    not an errno line of the first look at it (exit 1). Another refusal of that look (a folder above it that
    cannot be searched) says what it is, naming the source: such a source may well exist. A source this user
    may not read is refused too (:func:`_check_readable`)."""
    p = _path_arg(value, name)
    try:
        p.exists()
    except OSError as e:
        if e.errno == errno.ENAMETOOLONG:
            raise FileNotFoundError(f"source {str(p)!r} does not exist ({e.strerror})") from None
        if isinstance(e, PermissionError):
            raise _not_readable(p, "cannot be looked up", e) from None
        raise named_os_error(e, f"source {str(p)!r}", "cannot be looked up") from None
    _check_readable(p)
    return p


def _check_readable(p: Path) -> None:
    """Refuse a source this user may not read, before any work (it was an errno line naming neither the
    source nor what is wrong, exit 1; a tokenizer file that could not be copied, after the whole conversion):
    a folder it may not list; a file it may not open; in a checkpoint folder (config.json there), a file it
    may not open of those the conversion reads or copies (the weights: :func:`weight_files`); in a folder
    without config.json, a ``.gguf`` file it may not open."""
    if p.is_file():
        _check_openable(p, p)
    elif p.is_dir():
        hf = (p / "config.json").is_file()
        for f in _listed(p, p):
            weights = f.name.endswith(WEIGHT_SUFFIXES)
            if not f.name.startswith(".") and (not weights if hf else f.suffix.lower() == ".gguf") and f.is_file():
                _check_openable(f, p)
            elif hf and f.name in COPIED_DIRS and f.is_dir():  # (copied at the end, after every tensor)
                for g in _listed(f, p):
                    if g.is_file():
                        _check_openable(g, p)


def _listed(folder: Path, src: Path) -> list:
    """The entries of ``folder`` (the source ``src`` or a folder in it), else :class:`SourceNotReadable`."""
    try:
        return sorted(folder.iterdir())
    except PermissionError as e:
        what = "this folder" if folder == src else f"its {folder.relative_to(src).as_posix()}/"
        raise _not_readable(src, f"this user may not list {what}", e) from None


def _check_openable(f: Path, src: Path) -> None:
    """``f`` (the source ``src`` itself, or a file in it) opens for reading, else :class:`SourceNotReadable`."""
    try:
        open(f, "rb").close()
    except PermissionError as e:
        raise _not_readable(src, "this user may not read this file" if f == src else
                            f"this user may not read its {f.relative_to(src).as_posix()}", e) from None


def _resolve_source(path, download: bool = True, names=None) -> Path:
    """``download=False`` (a dry run): a hub id is looked up in the local Hugging Face cache only."""
    p = expand_path(path, "source")
    if p.is_dir():
        return p
    if p.exists():
        raise NotADirectoryError(_not_a_directory(p))
    s = os.fspath(path)
    if _is_hub_id(s):
        try:  # a hub id; only when the hub is reachable
            from huggingface_hub import snapshot_download

            # config, index and tokenizer first, then only the weights the conversion reads (Mistral's
            # repos also hold a consolidated.safetensors: the whole model a second time)
            root = Path(snapshot_download(s, allow_patterns=["*.json", "*.model", "*.txt", "*.jinja", "*.tiktoken"],
                                          local_files_only=not download))
            return Path(snapshot_download(s, allow_patterns=[SINGLE_FILE, *_index_shards(root / INDEX_FILE)],
                                          local_files_only=not download))
        except Exception as e:  # noqa: BLE001 - any failure means "not found" for the user
            why = f" ({type(e).__name__}: {' '.join(str(e).split())})"
            if download:
                raise FileNotFoundError(f"source {s!r} is not a local directory and could not be downloaded "
                                        f"from the Hugging Face hub{why}") from None
            # huggingface_hub's own words for "not cached" tell to pass local_files_only=False: not for a CLI user
            n = _names(names)
            raise FileNotFoundError(f"source {s!r} is not a local directory and is not in the local Hugging Face "
                                    f"cache ({n['dry_run']} downloads nothing: {n['download']} "
                                    f"downloads it, or name a local directory)"
                                    f"{'' if type(e).__name__ == 'LocalEntryNotFoundError' else why}") from None
    raise FileNotFoundError(f"source directory {s!r} does not exist")


def _is_hub_id(s: str) -> bool:
    """Whether ``s`` (a path that does not exist here) reads as a Hugging Face hub id, ``owner/model``."""
    return bool(re.fullmatch(r"[A-Za-z0-9][\w.\-]*/[\w.\-]+", s)) and not s.startswith((".", "/", "~"))


def _not_a_directory(p: Path) -> str:
    """The error for a source file that is neither a checkpoint directory nor a ``.gguf`` file: a GGUF file
    named without the suffix (a Hugging Face cache blob, a renamed download) is told by that suffix only."""
    try:
        with open(p, "rb") as f:
            magic = f.read(4)
    except OSError:
        magic = b""
    if magic == b"GGUF":
        return (f"source {str(p)!r} is a GGUF file whose name lacks the .gguf suffix (a GGUF source is told by "
                f"it): name a link to it that ends in .gguf, e.g. ln -s {str(p.absolute())!r} {p.name}.gguf")
    hint = (f"; name the directory that holds it: {str(p.absolute().parent)!r}"
            if p.suffix == ".safetensors" or p.name == "config.json" else "")
    return f"source {str(p)!r} is not a directory (expected an HF checkpoint directory or a .gguf file){hint}"


def _index_shards(index_path: Path) -> list:
    """The shard names an index lists; none where it is missing or unreadable (load_source says why)."""
    try:
        return sorted({f for f in json.loads(index_path.read_text())["weight_map"].values() if isinstance(f, str)})
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return []


def _name_max(folder: Path) -> int:
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


def _check_name_lengths(dst: Path) -> None:
    """Refuse a DST with a name the file system cannot hold, before anything reads or writes beside it:
    a folder's name beyond its limit was an errno line (exit 1) from the first look at DST; a last name
    that fits, but not with what the temporary directory beside it adds (``.<name>.orthros-tmp-<pid>-
    <8 characters>``; a replaced DST moves aside as ``.<name>.orthros-old-...``), passed every check and
    the dry run, and failed there."""
    folder = Path(dst.absolute().anchor)
    name_max = _name_max(folder)
    parts = dst.absolute().parts[1:]
    for i, part in enumerate(parts):
        size = len(part.encode())
        if i == len(parts) - 1:
            size = staged_name_bytes(part)
        if size > name_max:
            what = (f"its name is {len(part.encode())} bytes long and the temporary directory beside it adds "
                    f"{size - len(part.encode())}" if i == len(parts) - 1 else f"{part!r} is {size} bytes long")
            raise ValueError(f"destination {str(dst)!r}: {what}, beyond this file system's {name_max} bytes for "
                             f"a name" + (f": name a DST of at most {name_max - size + len(part.encode())} bytes"
                                          if i == len(parts) - 1 else ""))
        try:
            below = (folder / part).is_dir()
        except PermissionError as e:  # was an errno line naming no DST, exit 1 (--dry-run too)
            raise ValueError(f"destination {str(dst)!r}: this user may not look into {str(folder)!r} "
                             f"({e.strerror}); name a DST in a folder you can write to") from None
        if below:
            folder = folder / part
            name_max = _name_max(folder)


def check_paths(src, dst) -> Path:
    """The first checks of ``src`` and ``dst``, before anything is read or written: neither is blank, a
    ``~NAME`` is of a user, ``src`` can be looked up, ``dst``'s names fit the file system. Returns
    ``dst`` expanded."""
    dst = _path_arg(dst, "dst")
    _src_arg(src, "src")  # ~NAME of no user: named before any work
    _check_name_lengths(dst)
    return dst


def read_source_config(root: Path):
    """``(config.json path, its dict, architecture)`` of the source directory ``root``: it has a
    ``config.json``, a JSON object of a supported architecture, not a quantized checkpoint."""
    cfg_path = root / "config.json"
    if not cfg_path.is_file():
        raise FileNotFoundError(f"source {str(root)!r} has no config.json (not an HF model directory)")
    try:
        config_dict = json.loads(cfg_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{cfg_path}: not valid JSON ({e})") from None
    if not isinstance(config_dict, dict):
        raise ValueError(f"{cfg_path}: not a JSON object (got a {type(config_dict).__name__})")
    arch = architecture_of(config_dict)
    check_supported(arch)
    quant = config_dict.get("quantization_config")
    if quant:  # its scales / packed weights were refused one by one as "unexpected tensor", never saying why
        method = quant.get("quant_method") if isinstance(quant, dict) else None
        raise UnsupportedModelError(f"{cfg_path}: a quantized checkpoint (quantization_config, quant_method="
                                    f"{method!r}) cannot be converted; convert the unquantized model")
    return cfg_path, config_dict, arch


def weight_files(root: Path):
    """``(files, weight_map, sharded)``: the safetensors files of the source directory ``root`` that a
    conversion reads, as transformers picks them (``model.safetensors``, even beside an index; else the
    shards of ``model.safetensors.index.json``, whose ``weight_map`` is returned), each of them there.
    Neither file (weights of another format, a GGUF beside a config.json, none at all), an index that is
    corrupt or names a shard that is not a plain file name or does not exist: refused, naming what to do."""
    index_path = root / INDEX_FILE
    if (root / SINGLE_FILE).is_file():
        _check_openable(root / SINGLE_FILE, root)
        return [SINGLE_FILE], None, False
    if index_path.is_file():
        try:
            index = json.loads(index_path.read_text())
            weight_map = index["weight_map"]
            assert isinstance(weight_map, dict) and weight_map
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AssertionError):
            raise ValueError(f"{index_path}: corrupt index (expected JSON with a non-empty 'weight_map')") from None
        # the result keeps the shard names: one that is not a plain file name would be read from, and
        # written to, a path outside the source and the result (``../x`` truncated the source shard)
        bad = sorted({repr(f) for f in weight_map.values()
                      if not isinstance(f, str) or f in ("", ".", "..") or Path(f).name != f})
        if bad:
            raise ValueError(f"{index_path}: shard names must be plain file names in the source directory, "
                             f"got {', '.join(bad[:5])}")
        files = sorted(set(weight_map.values()))
        missing = [f for f in files if not (root / f).is_file()]
        if missing:
            raise FileNotFoundError(f"{index_path} names shard(s) that do not exist: {missing}")
        for f in files:
            _check_openable(root / f, root)
        return files, weight_map, True
    others = sorted(p.name for p in root.iterdir() if p.name.endswith(WEIGHT_SUFFIXES))
    ggufs = [n for n in others if n.lower().endswith(".gguf")]  # read as a GGUF source only without config.json
    hint = (f" (found {others}; to convert the GGUF, name the file itself: {str(root / ggufs[0])!r})" if ggufs
            else f" (found {others}; re-save the model with save_pretrained(..., safe_serialization=True))"
            if others else "")
    raise FileNotFoundError(f"source {str(root)!r} has neither {SINGLE_FILE} nor {INDEX_FILE}{hint}")


def check_local_source(src, dst, names=None) -> None:
    """What ``orthros convert`` refuses before torch loads: :func:`check_paths`, then a local source
    (a hub id is left to the conversion, which checks DST before it downloads; a GGUF source to its
    reader): it exists, is a directory, its ``config.json`` passes :func:`read_source_config`, and the
    weights a conversion reads are there (:func:`weight_files`); a GGUF source's architecture is one the
    conversion takes (read from the file's header: :func:`~orthros.checkpoint_files.unconvertible_gguf`)."""
    check_paths(src, dst)
    from ..checkpoint_files import is_gguf_source, unconvertible_gguf
    from .gguf import architecture_error

    if is_gguf_source(src):
        found = unconvertible_gguf(src)  # was refused by inspect_gguf, after torch had loaded (seconds)
        if found:
            raise architecture_error(*found)
        return
    if not expand_path(src, "src").exists() and _is_hub_id(os.fspath(src)):
        return
    root = _resolve_source(src, download=False, names=names)
    read_source_config(root)
    weight_files(root)  # a folder of config.json alone took seconds (torch, transformers' AutoConfig) to refuse

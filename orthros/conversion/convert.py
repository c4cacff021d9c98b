"""Convert Llama / Qwen2 / Qwen3 / Mistral checkpoints to Orthros (paper Section 4.3).

The Orthros model keeps every weight of the source Transformer (embeddings, W_Q/W_K/W_V/W_O,
biases, q/k norms, MLPs, norms, LM head) and adds, per layer, the query transforms
alpha, beta (base stream) and alpha', beta' (output stream), initialised to 1, 0, 1, 0. The
converted model therefore starts as the source model seen through a window: identical
logits for sequences of at most ``window_size`` tokens, degraded beyond until trained.

Two entry points:

* :func:`convert_checkpoint` (``orthros convert``): directory to directory, streaming one
  tensor at a time, shard by shard, into a temporary directory next to the destination that
  is renamed into place only when complete.
* :func:`convert_from_hf`: an in-memory HF model or a local HF directory to an in-memory
  :class:`OrthrosForCausalLM`.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import sys
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..layers import SCALE_OFFSET_INIT
from ..models import OrthrosConfig, OrthrosForCausalLM
from ..utils import (OLD_TAG, TMP_TAG, Progress, atomic_directory, check_positive_int,  # noqa: F401
                     check_replaceable_dir, clean_stale, dtype_name, expand_path, file_in_the_way, format_bytes,
                     parse_dtype)
from .architectures import (
    SUPPORTED_ARCHITECTURES,
    UnsupportedModelError,
    check_supported,
    droppable_reason,
    orthros_config_from,
    value_transforms,
)
from .checks import (API_NAMES, COPIED_DIRS, INDEX_FILE, SINGLE_FILE, WEIGHT_SUFFIXES, _is_hub_id, _names, _nv,
                     _resolve_source, _src_arg, check_paths, read_source_config, weight_files)
from .safetensors_io import StreamingWriter, TensorReader, read_header

REPORT_FILE = "conversion_report.json"
_NEW_PARAMS = SCALE_OFFSET_INIT  # alpha = alpha' = 1, beta = beta' = 0: the source model exactly
_NEW_RE = re.compile(r"^model\.layers\.(\d+)\.self_attn\.(alpha|beta|alpha_out|beta_out)$")
# files of a source directory that are never copied to the result (weights and what describes them)
_NOT_COPIED = {"config.json", INDEX_FILE, "pytorch_model.bin.index.json", REPORT_FILE}


# ----------------------------------------------------------------------------------------- checks
def _check_window(window_size) -> int:
    return check_positive_int("window_size", window_size)  # a Python int: the report is JSON


def _check_flags(**flags):
    """``overwrite`` / ``scale_offset`` / ``progress`` are True or False: a string such as ``"no"`` or
    ``"false"`` (a value read from a text config) was taken as true, and ``overwrite="no"`` replaced DST."""
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be True or False, got {value!r}")


def resolve_dtype(dtype):
    """``None`` (keep the source's), a ``torch.dtype`` or one of ``bf16 | fp16 | fp32``."""
    if dtype is None or dtype == "auto":
        return None
    return parse_dtype(dtype)


def _dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


# ------------------------------------------------------------------------------------- the plan
@dataclass
class Plan:
    """Where every source tensor goes. Built (and checked) before anything is written."""

    config: OrthrosConfig
    architecture: str
    notes: list
    mapped: dict = field(default_factory=dict)  # source name -> Orthros name
    dropped: dict = field(default_factory=dict)  # source name -> reason
    added: dict = field(default_factory=dict)  # Orthros name -> (init value, shape, source name it sits beside)
    out_dtype: torch.dtype | None = None  # None: keep each tensor's source dtype
    transforms: dict = field(default_factory=dict)  # source name -> (description, fn): values that change

    def cast(self, dtype: torch.dtype) -> torch.dtype:
        return self.out_dtype if (self.out_dtype is not None and dtype.is_floating_point) else dtype

    def value(self, name: str, t: torch.Tensor) -> torch.Tensor:
        """The Orthros value of the source tensor ``name`` (``t``): changed where :attr:`transforms` says
        (then float32: the caller casts it to the result's dtype)."""
        return self.transforms[name][1](t) if name in self.transforms else t


HEAD, EMBED = "lm_head.weight", "model.embed_tokens.weight"


def head_differs(config, shapes: dict, rows) -> bool:
    """Whether ``config`` ties the LM head to the embedding while the source stores an
    ``lm_head.weight`` of another shape or other values. ``rows(name, start, stop)``: rows of a
    source tensor, so that two large tensors are compared a slice at a time."""
    if not getattr(config, "tie_word_embeddings", False) or HEAD not in shapes or EMBED not in shapes:
        return False
    if tuple(shapes[HEAD]) != tuple(shapes[EMBED]):
        return True
    n = shapes[HEAD][0] if shapes[HEAD] else 0
    step = max(1, (16 << 20) // max(1, math.prod(shapes[HEAD][1:]) * 4))  # about 16 MB of float32 a slice
    return any(not torch.equal(rows(HEAD, i, i + step).float(), rows(EMBED, i, i + step).float())
               for i in range(0, n, step))


def expected_tensors(config: OrthrosConfig) -> dict:
    """``{name: shape}`` of an Orthros checkpoint for ``config`` (the model built on the meta device)."""
    with torch.device("meta"):
        model = OrthrosForCausalLM(config)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    if config.tie_word_embeddings:
        shapes.pop("lm_head.weight", None)
    return shapes


def make_plan(src_config, arch: str, src_shapes: dict, *, window_size: int, scale_offset: bool,
              out_dtype, config_dtype, untie_head: bool = False, names=None) -> Plan:
    """Map every source tensor (``src_shapes``: name -> shape) or refuse, listing every reason.

    ``untie_head``: the source's config ties the LM head to the embedding, but the source stores
    an ``lm_head.weight`` of other values (:func:`head_differs`); transformers loads such a
    source untied, and so the result keeps that head."""
    check_supported(arch)
    config, notes = orthros_config_from(src_config, arch, window_size=window_size, scale_offset=scale_offset,
                                        dtype=out_dtype or config_dtype)
    if untie_head and config.tie_word_embeddings:
        config.tie_word_embeddings = False
        notes.append(f"config.json sets tie_word_embeddings=true, but the checkpoint stores an {HEAD} that differs "
                     f"from {EMBED}; transformers loads such a source untied, so the converted model "
                     f"keeps that head (tie_word_embeddings=false)")
    if window_size > config.max_position_embeddings:  # (issue 17.5) refused, not silently accepted
        limit = config.max_position_embeddings
        n = _names(names)
        raise ValueError(f"{_nv(n, 'window_size', window_size)} exceeds the source's max_position_embeddings="
                         f"{limit}: the window would hold every position of the model (no sliding window); choose "
                         f"{n['window_size']} <= {limit}")
    plan = Plan(config, arch, notes, out_dtype=out_dtype)
    expected = expected_tensors(config)
    problems = []
    misshapen = set()  # targets that the source has in another shape: named once, not also as missing
    for name, shape in src_shapes.items():
        shape = tuple(shape)
        if name in expected and not _NEW_RE.match(name):
            if expected[name] != shape:
                misshapen.add(name)
                problems.append(f"{name}: shape {list(shape)} but the Orthros model expects {list(expected[name])}")
            else:
                plan.mapped[name] = name
        elif name == HEAD and config.tie_word_embeddings and EMBED not in src_shapes:
            if expected[EMBED] != shape:  # the tied matrix stored under the head's name only (transformers ties it)
                misshapen.add(EMBED)
                problems.append(f"{name}: shape {list(shape)} but the Orthros model expects {list(expected[EMBED])} "
                                f"(as {EMBED}: tie_word_embeddings=true and the checkpoint stores no {EMBED})")
            else:
                plan.mapped[name] = EMBED
        elif name == HEAD and config.tie_word_embeddings:
            plan.dropped[name] = "tie_word_embeddings=True: the LM head is model.embed_tokens.weight (as in the source)"
        elif (reason := droppable_reason(name)) is not None:
            plan.dropped[name] = reason
        else:
            problems.append(f"{name}: no counterpart in a {arch} -> Orthros conversion (unexpected tensor)")
    targets = set(plan.mapped.values())
    for name, shape in expected.items():
        m = _NEW_RE.match(name)
        if m:
            anchor = f"model.layers.{m.group(1)}.self_attn.q_proj.weight"
            plan.added[name] = (_NEW_PARAMS[m.group(2)], shape, anchor)
        elif name not in targets and name not in misshapen:
            problems.append(f"{name}: missing from the source checkpoint")
    plan.transforms = value_transforms(arch, plan.mapped)
    if problems:
        shown = "\n  ".join(problems[:25])
        more = f"\n  ... and {len(problems) - 25} more" if len(problems) > 25 else ""
        raise UnsupportedModelError(f"cannot convert this {arch} checkpoint; {len(problems)} tensor problem(s):"
                                    f"\n  {shown}{more}")
    return plan


# ----------------------------------------------------------------------------------- the source
@dataclass
class SourceCheckpoint:
    path: Path
    config_dict: dict
    architecture: str
    config: object  # transformers config
    headers: dict  # file name -> SafetensorsHeader, in shard order
    sharded: bool
    extra_weight_files: list  # weight files present but not part of the checkpoint (reported, not copied)

    def shapes(self) -> dict:
        return {n: t.shape for h in self.headers.values() for n, t in h.tensors.items()}

    def head_differs(self) -> bool:
        """:func:`head_differs` for this checkpoint (reads the two tensors a slice at a time)."""
        def rows(name, start, stop):
            header = next(h for h in self.headers.values() if name in h.tensors)
            with TensorReader(header) as reader:
                return reader.get_rows(name, start, stop)

        return head_differs(self.config, self.shapes(), rows)


def load_source(path, *, download: bool = True, names=None) -> SourceCheckpoint:
    """Find, read and validate the source config and every safetensors header (no tensor data).
    ``download=False``: a hub id is read from the local Hugging Face cache only. ``names``: see
    :data:`API_NAMES`."""
    root = _resolve_source(path, download, names)
    cfg_path, config_dict, arch = read_source_config(root)
    files, weight_map, sharded = weight_files(root)  # as orthros convert checks before torch loads
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(root)
    except ImportError:
        raise
    except Exception as e:  # noqa: BLE001 - transformers' checks of the values (validation, ZeroDivisionError)
        raise ValueError(f"{cfg_path}: transformers refuses this {arch} config "
                         f"({type(e).__name__}: {' '.join(str(e).split())})") from None

    index_path = root / INDEX_FILE
    all_st = sorted(p.name for p in root.glob("*.safetensors"))
    headers = {f: read_header(root / f) for f in files}
    if weight_map is not None:
        seen = {}
        for f, h in headers.items():
            for n in h.tensors:
                if n in seen:
                    raise ValueError(f"tensor {n!r} is stored twice, in {seen[n]} and {f}")
                seen[n] = f
        if seen != weight_map:
            bad = sorted(set(seen.items()) ^ set(weight_map.items()))[:5]
            raise ValueError(f"{index_path} does not match the shards' contents (e.g. {bad})")
    extra = [f for f in all_st if f not in headers]
    return SourceCheckpoint(root, config_dict, arch, config, headers, sharded, extra)


def _source_dtype(src: SourceCheckpoint):
    d = src.config_dict.get("dtype") or src.config_dict.get("torch_dtype")
    if isinstance(d, str) and hasattr(torch, d) and isinstance(getattr(torch, d), torch.dtype):
        return getattr(torch, d)
    for h in src.headers.values():
        for t in h.tensors.values():
            if t.dtype.is_floating_point:
                return t.dtype
    return None


# ------------------------------------------------------------------------------- dir -> dir
def _check_destination(src: Path | None, dst: Path, overwrite: bool, names: dict):
    """``src``: ``None`` for the checks that need no source (made before a hub download); ``names``:
    :func:`_names`'."""
    s, d = (src.resolve() if src is not None else None), dst.resolve()
    if s is not None and (s == d or s in d.parents or d in s.parents):  # before "pass --overwrite"
        raise ValueError(f"destination {str(dst)!r} must not be the source directory, inside it, or contain it")
    check_replaceable_dir(dst, "destination", names["overwrite"])
    if dst.name == "..":  # the final rename of a path ending in '..' fails, after the whole conversion
        raise ValueError(f"destination {str(dst)!r}: name the directory itself, not '..' "
                         f"(e.g. {str(dst.absolute().resolve())!r})")
    above = file_in_the_way(dst.parent)
    if above is not None:
        raise NotADirectoryError(f"destination {str(dst)!r}: {str(above)!r} is not a directory")
    # the temporary directory is made beside DST (and missing parents created): a read-only or another
    # user's folder failed only there, after a GGUF's checks, with an errno line that named no DST
    folder = next(a for a in (dst.absolute().parent, *dst.absolute().parent.parents) if a.is_dir())
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"destination {str(dst)!r}: {str(folder)!r} is not writable (read-only or another "
                         f"user's); name a DST in a folder you can write to")
    if not dst.is_symlink() and dst.exists() and not (dst.is_dir() or dst.is_file()):
        # a device, FIFO or socket: --overwrite replaced it with the result (as root, /dev/null itself)
        raise ValueError(f"destination {str(dst)!r} is a device, FIFO or socket, not a directory; it is never "
                         f"replaced, {names['overwrite']} or not: name a directory ({names['dry_run']} checks without "
                         f"writing)")
    if _dst_taken(dst) and not overwrite:
        what = (f"a symbolic link to {os.readlink(dst)!r} (the result would replace the link, not fill its "
                f"target: name the target itself)" if dst.is_symlink() and dst.exists() else
                "directory is not empty" if dst.is_dir() else "path exists and is not a directory"
                if dst.exists() else f"a symbolic link to the missing {os.readlink(dst)!r}")
        raise FileExistsError(f"destination {str(dst)!r}: {what}; pass {names['overwrite']} to replace it")


def _dst_taken(dst: Path) -> bool:
    """Whether writing ``dst`` replaces something: anything there but an empty directory (a symbolic
    link, even to an empty directory, is replaced by the result, not filled). A folder this user may not list
    cannot be told empty, nor replaced: a ``ValueError`` (it was an errno line naming no DST, exit 1)."""
    if not (dst.exists() or dst.is_symlink()):
        return False
    if not dst.is_dir() or dst.is_symlink():
        return True
    try:
        return any(dst.iterdir())
    except PermissionError as e:
        raise ValueError(f"destination {str(dst)!r}: this user may not list this folder ({e.strerror}): it can be "
                         f"neither told empty nor replaced; name a DST you can write to") from None


_PAUSE_ENV = "ORTHROS_CONVERT_TEST_PAUSE"  # test hook: "<shard index>:<seconds>" sleeps after that shard


def _test_pause(index: int) -> None:
    spec = os.environ.get(_PAUSE_ENV, "")
    if spec and spec.split(":")[0] == str(index):
        import time

        time.sleep(float(spec.split(":")[1]))


def convert_checkpoint(src, dst, *, window_size: int = 128, dtype=None, overwrite: bool = False,
                       scale_offset: bool = True, progress: bool = True, names=None) -> dict:
    """Convert the HF checkpoint directory (or GGUF file) ``src`` into an Orthros checkpoint
    directory ``dst``.

    Streams one tensor at a time (peak memory about the largest tensor, independent of model
    size), keeps the source's sharding (same shard names, each Orthros layer's new alpha/beta
    tensors beside that layer's ``q_proj``), copies tokenizer, generation config and other
    non-weight files, and writes ``conversion_report.json``. Every check (arguments,
    architecture, every header, every tensor's mapping, destination) runs before anything is
    written; the result is assembled in a temporary directory next to ``dst`` and renamed
    into place. What a killed earlier run left beside ``dst`` is removed first
    (:func:`clean_stale`). Returns the report.

    ``src`` may also be a ``.gguf`` file (or a directory holding one and no config.json):
    it is checked whole first (:func:`orthros.conversion.gguf.inspect_gguf`), de-quantised by
    transformers' GGUF loader into a staging directory inside the temporary one, and converted
    from there (see :mod:`orthros.conversion.gguf`).

    ``names``: how the errors name the settings (:data:`API_NAMES`: these keywords, by default).
    """
    names = _names(names)
    window_size = _check_window(window_size)
    _check_flags(overwrite=overwrite, scale_offset=scale_offset, progress=progress)
    out_dtype = resolve_dtype(dtype)
    dst = check_paths(src, dst)
    clean_stale(dst)  # before the checks of DST: it may put back a previous DST, which --overwrite must then allow
    from ..checkpoint_files import is_gguf_source

    if is_gguf_source(src):
        return _convert_gguf(src, dst, window_size=window_size, out_dtype=out_dtype, overwrite=overwrite,
                             scale_offset=scale_offset, progress=progress, names=names)
    source, plan, _ = _prepare(src, dst, window_size=window_size, out_dtype=out_dtype, overwrite=overwrite,
                               scale_offset=scale_offset, names=names)
    with atomic_directory(dst, overwrite, names["overwrite"]) as tmp:
        report = _write_checkpoint(source, plan, tmp, window_size=window_size, scale_offset=scale_offset,
                                   progress=progress, names=names)
    return report


def plan_conversion(src, dst, *, window_size: int = 128, dtype=None, overwrite: bool = False,
                    scale_offset: bool = True, names=None) -> dict:
    """Every check :func:`convert_checkpoint` makes before it writes, and what it would write
    (``orthros convert --dry-run``), as a dict. Reads headers only; writes and downloads nothing
    (a hub id is read from the local Hugging Face cache). For a GGUF source the file is checked
    whole, but its tensor plan is only made once transformers has de-quantised it, so the dict
    has the GGUF's figures instead. ``names``: as for :func:`convert_checkpoint`."""
    names = _names(names)
    window_size = _check_window(window_size)
    _check_flags(overwrite=overwrite, scale_offset=scale_offset)
    out_dtype = resolve_dtype(dtype)
    dst = check_paths(src, dst)
    from ..checkpoint_files import is_gguf_source
    from .gguf import gguf_notes

    base = {"dst": str(dst), "dst_exists": _dst_taken(dst),
            "window_size": window_size, "scale_offset": scale_offset}
    if is_gguf_source(src):
        info, need = _prepare_gguf(src, dst, window_size=window_size, out_dtype=out_dtype, overwrite=overwrite,
                                   names=names)
        return {**base, "source": str(info.path), "source_format": "gguf", "architecture": info.architecture,
                "tensors": info.n_tensors, "parameters": info.n_params, "tensor_types": info.tensor_types,
                "dtype": _dtype_name(out_dtype) if out_dtype else "float32", "bytes_needed": need,
                "staging_bytes": info.n_params * 4, "notes": gguf_notes(info)}  # (the de-quantised copy: float32)
    source, plan, need = _prepare(src, dst, window_size=window_size, out_dtype=out_dtype, overwrite=overwrite,
                                  scale_offset=scale_offset, download=False, names=names)
    with tempfile.TemporaryDirectory() as d:  # the names the result's config brings (its remote code)
        plan.config.save_pretrained(d)
        copied, skipped = _other_files(source, taken=set(os.listdir(d)))
    return {**base, "source": str(source.path), "source_format": "safetensors", "architecture": source.architecture,
            "files": len(source.headers), "dtype": _dtype_name(plan.config.dtype) if plan.config.dtype else None,
            "mapped": len(plan.mapped), "added": len(plan.added), "dropped": dict(plan.dropped),
            "notes": list(plan.notes), "copied_files": [f.name for f in copied], "skipped_files": skipped,
            "bytes_needed": need}


def _prepare(src, dst: Path, *, window_size: int, out_dtype, overwrite: bool, scale_offset: bool, names: dict,
             download: bool = True):
    """The checks of a safetensors source before anything is written: ``(source, plan, bytes)``."""
    if not expand_path(src, "src").exists() and _is_hub_id(os.fspath(src)):  # the destination before the download
        _check_destination(None, dst, overwrite, names)
    source = load_source(src, download=download, names=names)
    _check_destination(source.path, dst, overwrite, names)
    plan = make_plan(source.config, source.architecture, source.shapes(), window_size=window_size,
                     scale_offset=scale_offset, out_dtype=out_dtype, config_dtype=_source_dtype(source),
                     untie_head=source.head_differs(), names=names)
    need = sum(t.nbytes * plan.cast(t.dtype).itemsize // t.dtype.itemsize
               for h in source.headers.values() for t in h.tensors.values())
    _check_disk(dst, need)
    return source, plan, need


def _prepare_gguf(src, dst: Path, *, window_size: int, out_dtype, overwrite: bool, names: dict):
    """The checks of a GGUF source before anything is written: ``(GGUFInfo, bytes)`` (the bytes
    of the de-quantised staging copy and of the result)."""
    from .gguf import inspect_gguf, max_positions

    info = inspect_gguf(src)  # the whole file is checked before anything is written
    limit, where = max_positions(info)  # max_position_embeddings once de-quantised: refused now, as make_plan would
    if window_size > limit:
        raise ValueError(f"{_nv(names, 'window_size', window_size)} exceeds the source's max_position_embeddings="
                         f"{limit} ({where}): the window would hold every position of the model "
                         f"(no sliding window); choose {names['window_size']} <= {limit}")
    _check_destination(info.path, dst, overwrite, names)
    need = info.n_params * 4 + info.n_params * (out_dtype.itemsize if out_dtype else 4)
    _check_disk(dst, need)
    return info, need


def _check_disk(dst: Path, need: int) -> None:
    free_at = next(p for p in [dst.absolute(), *dst.absolute().parents] if p.exists())
    free = shutil.disk_usage(free_at).free
    if free < need + (64 << 20):
        raise OSError(f"not enough disk space at {str(free_at)!r}: the conversion needs about "
                      f"{format_bytes(need)} and keeps 64 MiB spare, {format_bytes(free)} free")


def _convert_gguf(src, dst: Path, *, window_size: int, out_dtype, overwrite: bool, scale_offset: bool,
                  progress: bool, names: dict) -> dict:
    from .gguf import gguf_notes, gguf_to_hf_directory

    info, _ = _prepare_gguf(src, dst, window_size=window_size, out_dtype=out_dtype, overwrite=overwrite, names=names)
    extra = {"source": str(info.path.absolute()), "source_format": "gguf",
             "gguf": {"file": info.path.name, "architecture": info.gguf_architecture, "name": info.name,
                      "bytes": info.size, "tensors": info.n_tensors, "parameters": info.n_params,
                      "tensor_types": info.tensor_types,
                      "note": "de-quantised to float32 by transformers' GGUF loader before conversion"}}
    with atomic_directory(dst, overwrite, names["overwrite"]) as tmp:
        stage = tmp / ".gguf-source"
        stage.mkdir()
        if progress:
            print(f"[orthros convert] de-quantising {info.path.name} ({info.n_tensors} tensors) with transformers' "
                  f"GGUF loader", file=sys.stderr, flush=True)
        gguf_to_hf_directory(info.path, stage, progress=progress)
        source = load_source(stage)
        plan = make_plan(source.config, source.architecture, source.shapes(), window_size=window_size,
                         scale_offset=scale_offset, out_dtype=out_dtype, config_dtype=torch.float32,
                         untie_head=source.head_differs(), names=names)
        plan.notes.extend(gguf_notes(info))  # into conversion_report.json with the plan's own
        report = _write_checkpoint(source, plan, tmp, window_size=window_size, scale_offset=scale_offset,
                                   progress=progress, names=names, extra=extra)
        shutil.rmtree(stage)
    return report


def _cast_checked(t: torch.Tensor, dtype: torch.dtype, name: str, names: dict) -> torch.Tensor:
    """``t`` in ``dtype``; a ``ValueError`` naming the tensor where a finite value overflows it (fp16's
    range ends at 65504: such a weight became inf without a word, and the converted model gave inf / NaN)."""
    if t.dtype == dtype:
        return t
    out = t.to(dtype)
    if out.dtype.is_floating_point and torch.finfo(out.dtype).max < torch.finfo(t.dtype).max \
            and bool(torch.isinf(out).any()) and not bool(torch.isinf(t).any()):
        big = float(t.abs().max())
        # as the caller names it: --dtype takes bf16 / fp16 / fp32 (not float16), the API torch's names too
        cli = names["dtype"].startswith("-")
        asked = dtype_name(dtype) if cli else _dtype_name(dtype)
        bf16, fp32 = ("bf16", "fp32") if cli else ('"bf16"', '"fp32"')  # (the API's a str: dtype="bf16")
        raise ValueError(f"{_nv(names, 'dtype', asked)}: tensor {name!r} holds values up to {big:.4g}, "
                         f"beyond its range ({torch.finfo(dtype).max:.6g}); convert with {_nv(names, 'dtype', bf16)} "
                         f"or {_nv(names, 'dtype', fp32)}")
    return out


def _write_checkpoint(source: "SourceCheckpoint", plan: Plan, tmp: Path, *, window_size: int, scale_offset: bool,
                      progress: bool, names: dict, extra: dict | None = None) -> dict:
    """Write the converted checkpoint of ``source`` into the (temporary) directory ``tmp``."""
    # which file each source tensor lives in, and which added tensors go into each file
    file_of = {n: f for f, h in source.headers.items() for n in h.tensors}
    added_in = {f: [] for f in source.headers}
    for name, (_, _, anchor) in plan.added.items():
        added_in[file_of[anchor]].append(name)

    report = {
        "orthros_version": _version(),
        "source": str(source.path.absolute()),
        "architecture": source.architecture,
        "window_size": window_size,
        "scale_offset": scale_offset,
        "dtype": _dtype_name(plan.config.dtype) if plan.config.dtype is not None else None,
        "notes": list(plan.notes),
        "mapped": [], "added": [], "dropped": [], "copied_files": [], "skipped_files": [],
    }
    if extra:
        report.update(extra)
    weight_map, total = {}, 0
    plan.config.save_pretrained(tmp)
    taken = {p.name for p in tmp.iterdir()}  # config.json and Orthros's remote code
    bar = Progress(len(source.headers), "orthros convert", unit="shard", enabled=progress)
    for index, (fname, header) in enumerate(source.headers.items()):
        entries, jobs = [], []
        for name, info in header.tensors.items():
            if name in plan.dropped:
                report["dropped"].append({"source": name, "source_file": fname, "reason": plan.dropped[name]})
                continue
            out = plan.mapped[name]
            od = plan.cast(info.dtype)
            entries.append((out, od, info.shape))
            jobs.append((out, name, od))
            report["mapped"].append({"source": name, "source_file": fname, "target": out, "target_file": fname,
                                     "dtype": _dtype_name(od) if od == info.dtype else
                                     f"{_dtype_name(info.dtype)} -> {_dtype_name(od)}"})
            if name in plan.transforms:
                report["mapped"][-1]["transform"] = plan.transforms[name][0]
        for name in added_in[fname]:
            val, shape, anchor = plan.added[name]
            od = plan.cast(header.tensors[anchor].dtype)
            entries.append((name, od, shape))
            jobs.append((name, None, od))
            report["added"].append({"target": name, "target_file": fname, "init": val, "dtype": _dtype_name(od)})
        if not entries:  # a shard of dropped tensors only (e.g. a tied head stored alone): no file, as no index entry
            bar.update(1)
            continue
        writer = StreamingWriter(tmp / fname, entries)
        try:
            with TensorReader(header) as reader:
                for out, name, od in jobs:  # one tensor in memory at a time
                    if name is None:
                        t = torch.full(plan.added[out][1], plan.added[out][0], dtype=od)
                    else:
                        t = _cast_checked(plan.value(name, reader.get(name)), od, name, names)
                    writer.write(out, t)
                    weight_map[out] = fname
                    del t
        except BaseException:
            writer.abort()
            raise
        writer.close()
        total += writer.nbytes
        bar.update(1)
        _test_pause(index)
    bar.close()
    if source.sharded:
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        (tmp / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    copied, report["skipped_files"] = _other_files(source, taken)
    for p in copied:
        if p.is_dir():
            shutil.copytree(p, tmp / p.name)
        else:
            shutil.copy2(p, tmp / p.name)
        report["copied_files"].append(p.name)
    report["summary"] = (f"{len(report['mapped'])} source tensors mapped, {len(report['dropped'])} dropped "
                         f"(reasons given), {len(report['added'])} Orthros tensors added")
    (tmp / REPORT_FILE).write_text(_report_json(report))
    return report


def _other_files(source: "SourceCheckpoint", taken=frozenset()):
    """The source's files besides its config and weights: ``(files (and the chat-template
    folder) copied as they are, [{"file", "reason"} of those skipped]``). ``taken``: names the
    result's config writes itself (Orthros's remote code), never replaced by a source file."""
    copied, skipped = [], []
    for p in sorted(source.path.iterdir()):
        if p.name in _NOT_COPIED or p.name.startswith(".") or p.name in source.headers:
            continue
        if p.name in taken:
            skipped.append({"file": p.name, "reason": "Orthros's own file of that name is written instead "
                                                      "(its code, for trust_remote_code)"})
        elif p.name.endswith(WEIGHT_SUFFIXES):
            skipped.append({"file": p.name, "reason": "weights not part of the converted checkpoint"})
        elif p.name in COPIED_DIRS and p.is_dir():
            copied.append(p)
        elif not p.is_file():
            skipped.append({"file": p.name, "reason": "not a regular file (directories are not copied)"})
        else:
            copied.append(p)
    return copied, skipped


def _report_json(report: dict) -> str:
    """Indented at the top level, one line per tensor / file: short enough to read."""
    lines = []
    for key, val in report.items():
        if isinstance(val, list) and val:
            items = ",\n".join("    " + json.dumps(v) for v in val)
            lines.append(f"  {json.dumps(key)}: [\n{items}\n  ]")
        else:
            lines.append(f"  {json.dumps(key)}: {json.dumps(val)}")
    return "{\n" + ",\n".join(lines) + "\n}\n"


def _version() -> str:
    from .. import __version__

    return __version__


# ---------------------------------------------------------------------------------- -> in memory
def _no_init():
    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # older transformers
        try:
            from transformers.modeling_utils import no_init_weights
        except ImportError:
            return contextlib.nullcontext()
    return no_init_weights()


def _build_model(plan: Plan, dtype) -> OrthrosForCausalLM:
    with _no_init():
        model = OrthrosForCausalLM._from_config(plan.config, dtype=dtype)
    return model


@torch.no_grad()
def _finish_model(model: OrthrosForCausalLM, plan: Plan, loaded: set) -> tuple[OrthrosForCausalLM, list]:
    """The model with its added tensors set, and the plan's notes (for :func:`convert_from_hf` to pass on)."""
    sd = model.state_dict()
    for name, (val, _, _) in plan.added.items():
        sd[name].fill_(val)
        loaded.add(name)
    if plan.config.tie_word_embeddings:
        model.tie_weights()
        loaded.add("lm_head.weight")
    missing = sorted(set(sd) - loaded)
    if missing:  # make_plan guarantees this cannot happen; never return uninitialised weights
        raise RuntimeError(f"internal error: Orthros tensors left unset after conversion: {missing[:10]}")
    return model.eval(), list(plan.notes)


def convert_from_hf(model_or_path, *, window_size: int = 128, scale_offset: bool = True,
                    dtype=None, on_note=None) -> OrthrosForCausalLM:
    """An :class:`OrthrosForCausalLM` with the weights of a Llama / Qwen2 / Qwen3 / Mistral / Qwen3.5 model.

    ``model_or_path``: an in-memory ``*ForCausalLM`` model of a supported architecture, or a
    local HF checkpoint directory (safetensors), a ``.gguf`` file (de-quantised by
    transformers), or a hub id when the hub is reachable.
    ``window_size``: the base stream's sliding window (the query's own position included).
    ``scale_offset``: add the learnable alpha, beta, alpha', beta' (initialised 1, 0, 1, 0).
    ``dtype``: ``None`` keeps the source's dtype; else ``bf16 | fp16 | fp32`` or a torch dtype.

    With alpha = alpha' = 1, beta = beta' = 0, the result computes exactly what the source
    computes on sequences of at most ``window_size`` tokens (a Qwen3.5 source excepted: its
    GDN layers gain the output stream, see :mod:`orthros.conversion.qwen3_5`).

    The conversion's notes (what ``orthros convert`` prints after ``note:`` and its report records:
    a source feature the result does not keep, a changed layer kind) go to ``on_note`` (called
    with each, one line of text), or, with ``on_note=None``, come as ``UserWarning`` warnings at the
    caller's line.
    """
    if on_note is not None and not callable(on_note):  # (it failed calling it, once the whole model was converted)
        raise TypeError(f"on_note must be a function called with each note (or None: warnings), "
                        f"got {type(on_note).__name__} {on_note!r}")
    model, notes = _convert_from_hf(model_or_path, window_size=window_size, scale_offset=scale_offset, dtype=dtype)
    for note in notes:
        if on_note is None:
            warnings.warn(f"convert_from_hf: {note}", UserWarning, stacklevel=2)
        else:
            on_note(note)
    return model


def _convert_from_hf(model_or_path, *, window_size: int, scale_offset: bool, dtype) -> tuple[OrthrosForCausalLM, list]:
    """:func:`convert_from_hf`'s work: the model and the conversion's notes."""
    window_size = _check_window(window_size)
    _check_flags(scale_offset=scale_offset)
    out_dtype = resolve_dtype(dtype)
    if isinstance(model_or_path, torch.nn.Module):
        src_model = model_or_path
        arch = type(src_model).__name__
        check_supported(arch)
        state = src_model.state_dict()
        src_dtype = next((t.dtype for t in state.values() if t.dtype.is_floating_point), torch.float32)
        shapes = {k: v.shape for k, v in state.items()}
        plan = make_plan(src_model.config, arch, shapes, window_size=window_size, scale_offset=scale_offset,
                         out_dtype=out_dtype, config_dtype=src_dtype,
                         untie_head=head_differs(src_model.config, shapes, lambda n, a, b: state[n][a:b]))
        model = _build_model(plan, out_dtype or src_dtype)
        sd, loaded = model.state_dict(), set()
        with torch.no_grad():
            for name, out in plan.mapped.items():
                sd[out].copy_(_cast_checked(plan.value(name, state[name]), sd[out].dtype, name, API_NAMES))
                loaded.add(out)
        return _finish_model(model, plan, loaded)
    if isinstance(model_or_path, (str, os.PathLike)):
        from ..checkpoint_files import is_gguf_source
        from .gguf import load_gguf_model

        _src_arg(model_or_path, "model_or_path")  # ~NAME of no user: named here, not as a "source"
        if is_gguf_source(model_or_path):
            src_model, _, _ = load_gguf_model(model_or_path, with_tokenizer=False)
            return _convert_from_hf(src_model, window_size=window_size, scale_offset=scale_offset, dtype=dtype)
    if not isinstance(model_or_path, (str, os.PathLike)):
        raise TypeError(f"model_or_path must be a transformers model ({', '.join(SUPPORTED_ARCHITECTURES)}) or a "
                        f"checkpoint directory, got {type(model_or_path).__name__}")
    source = load_source(model_or_path)
    src_dtype = _source_dtype(source) or torch.float32
    plan = make_plan(source.config, source.architecture, source.shapes(), window_size=window_size,
                     scale_offset=scale_offset, out_dtype=out_dtype, config_dtype=src_dtype,
                     untie_head=source.head_differs())
    model = _build_model(plan, out_dtype or src_dtype)
    sd, loaded = model.state_dict(), set()
    with torch.no_grad():
        for header in source.headers.values():  # shard by shard, one tensor at a time
            with TensorReader(header) as reader:
                for name in header.tensors:
                    if name in plan.mapped:
                        out = plan.mapped[name]
                        sd[out].copy_(_cast_checked(plan.value(name, reader.get(name)), sd[out].dtype, name,
                                                    API_NAMES))
                        loaded.add(out)
    return _finish_model(model, plan, loaded)


__all__ = ["convert_from_hf", "convert_checkpoint", "clean_stale", "load_source", "make_plan", "resolve_dtype", "Plan",
           "SUPPORTED_ARCHITECTURES"]

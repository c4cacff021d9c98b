"""GGUF checkpoints (llama.cpp's format) as conversion sources.

A GGUF file holds the weights (often quantised), the model's hyper-parameters and its
tokenizer in one file. ``orthros convert model.gguf DST`` (or a directory holding exactly
one ``.gguf``) goes through three steps:

1. :func:`inspect_gguf` reads and checks the file *before anything is written*: magic and
   header, every key-value field, every tensor's extent inside the file (a truncated or
   corrupted file is refused naming the file), and the architecture (``llama``, ``qwen2``,
   ``qwen3``, ``mistral``).
2. :func:`gguf_to_hf_directory` loads it with transformers' own GGUF loader
   (``from_pretrained(dir, gguf_file=...)``, which de-quantises every tensor to fp32 and
   rebuilds the tokenizer, chat template included) and writes a plain HF checkpoint
   (safetensors + tokenizer) into a staging directory.
3. The staging directory goes through the ordinary safetensors conversion
   (:func:`orthros.conversion.convert.convert_checkpoint`): same plan, report, refusals and
   atomic output.

Needs the ``gguf`` package (``pip install 'orthros[gguf]'``). The de-quantised model is held
in memory once (fp32: 4 bytes per parameter), so a GGUF needs about 4x its parameter count
in bytes of RAM; the staging directory needs as much disk.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

GGUF_SUFFIX = ".gguf"
GGUF_MAGIC = b"GGUF"
# GGUF general.architecture -> the transformers class the conversion maps
GGUF_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                      "mistral": "MistralForCausalLM"}


class GGUFError(ValueError):
    """A GGUF file that cannot be converted (unreadable, truncated, corrupted or unsupported)."""


@dataclass
class GGUFInfo:
    path: Path  # the .gguf file
    architecture: str  # transformers class name, e.g. LlamaForCausalLM
    gguf_architecture: str  # general.architecture, e.g. llama
    name: str | None
    file_type: int | None  # general.file_type (llama.cpp's quantisation id)
    tensor_types: dict  # GGML type name -> tensor count
    n_tensors: int
    n_params: int
    size: int  # bytes
    has_tokenizer: bool


def is_gguf_source(path) -> bool:
    """True for a ``.gguf`` file, or a directory that holds a ``.gguf`` file and no config.json."""
    p = Path(os.fspath(path)).expanduser()
    if p.is_file() or (not p.exists() and p.suffix.lower() == GGUF_SUFFIX):
        return p.suffix.lower() == GGUF_SUFFIX
    if p.is_dir() and not (p / "config.json").is_file():
        return any(c.suffix.lower() == GGUF_SUFFIX for c in p.iterdir() if c.is_file())
    return False


def resolve_gguf_file(path) -> Path:
    """The ``.gguf`` file named by ``path`` (the file itself, or the only one in a directory)."""
    p = Path(os.fspath(path)).expanduser()
    if p.is_dir():
        found = sorted(c for c in p.iterdir() if c.is_file() and c.suffix.lower() == GGUF_SUFFIX)
        if not found:
            raise FileNotFoundError(f"source directory {str(p)!r} holds no .gguf file")
        if len(found) > 1:
            raise GGUFError(f"source directory {str(p)!r} holds {len(found)} .gguf files "
                            f"({[f.name for f in found]}); name the one to convert")
        return found[0]
    if not p.exists():
        raise FileNotFoundError(f"source GGUF file {str(p)!r} does not exist")
    return p


def _require_gguf():
    try:
        import gguf  # noqa: F401
    except ImportError:
        raise ImportError("reading GGUF files needs the 'gguf' package: pip install 'orthros[gguf]' "
                          "(or pip install gguf)") from None
    return gguf


def _field_value(reader, key):
    f = reader.fields.get(key)
    if f is None or not f.data:
        return None
    try:
        v = f.contents()
    except Exception:  # noqa: BLE001 - older gguf versions: decode by hand
        part = f.parts[f.data[0]]
        v = bytes(part).decode("utf-8", errors="replace") if part.dtype.kind == "u" and part.itemsize == 1 \
            else part.tolist()
        if isinstance(v, list) and len(v) == 1:
            v = v[0]
    return v


def inspect_gguf(path) -> GGUFInfo:
    """Read and check a GGUF file without loading its tensors; a :class:`GGUFError` naming the
    file when it is not a complete, readable GGUF of a supported architecture."""
    gguf_file = resolve_gguf_file(path)
    gguf = _require_gguf()
    size = gguf_file.stat().st_size
    with open(gguf_file, "rb") as fh:
        magic = fh.read(4)
    if magic != GGUF_MAGIC:
        raise GGUFError(f"{gguf_file}: not a GGUF file (starts with {magic!r}, expected {GGUF_MAGIC!r})")
    try:
        reader = gguf.GGUFReader(str(gguf_file), "r")
    except Exception as e:  # noqa: BLE001 - numpy / struct errors on a damaged file
        raise GGUFError(f"{gguf_file}: corrupted or truncated GGUF file ({size} bytes; "
                        f"{type(e).__name__}: {e})") from None
    ends = [int(t.data_offset) + int(t.n_bytes) for t in reader.tensors]
    if not ends:
        raise GGUFError(f"{gguf_file}: the GGUF file holds no tensors")
    if max(ends) > size:
        raise GGUFError(f"{gguf_file}: truncated GGUF file: its tensors need {max(ends)} bytes, the file has {size}")
    arch = _field_value(reader, "general.architecture")
    if not isinstance(arch, str):
        raise GGUFError(f"{gguf_file}: corrupted GGUF file: no general.architecture field")
    if arch not in GGUF_ARCHITECTURES:
        raise GGUFError(f"{gguf_file}: cannot convert GGUF architecture {arch!r}: supported are "
                        f"{', '.join(GGUF_ARCHITECTURES)}")
    for key in (f"{arch}.block_count", f"{arch}.embedding_length", f"{arch}.attention.head_count"):
        if not isinstance(_field_value(reader, key), int):
            raise GGUFError(f"{gguf_file}: corrupted GGUF file: the {key} field is missing or not an integer")
    types: dict = {}
    n_params = 0
    for t in reader.tensors:
        name = getattr(t.tensor_type, "name", str(t.tensor_type))
        types[name] = types.get(name, 0) + 1
        n_params += int(t.n_elements)
    name = _field_value(reader, "general.name")
    ft = _field_value(reader, "general.file_type")
    return GGUFInfo(path=gguf_file, architecture=GGUF_ARCHITECTURES[arch], gguf_architecture=arch,
                    name=name if isinstance(name, str) else None, file_type=ft if isinstance(ft, int) else None,
                    tensor_types=types, n_tensors=len(reader.tensors), n_params=n_params, size=size,
                    has_tokenizer="tokenizer.ggml.tokens" in reader.fields)


def load_gguf_model(path, *, with_tokenizer: bool = True):
    """``(model, tokenizer or None, GGUFInfo)``: the de-quantised transformers model (fp32) and
    tokenizer that transformers builds from the GGUF file, after :func:`inspect_gguf`."""
    info = inspect_gguf(path)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(info.path.parent), info.path.name
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype="float32")
    except (OSError, ValueError, KeyError, RuntimeError, TypeError) as e:
        raise GGUFError(f"{info.path}: transformers could not load this GGUF file "
                        f"({type(e).__name__}: {e})") from None
    tok = None
    if with_tokenizer and info.has_tokenizer:
        try:
            tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        except (OSError, ValueError, KeyError, RuntimeError, TypeError) as e:
            raise GGUFError(f"{info.path}: transformers could not build the tokenizer stored in this GGUF file "
                            f"({type(e).__name__}: {e})") from None
    # the weights are plain fp32 tensors now: what describes the GGUF quantisation no longer applies
    for cfg in (model.config, getattr(model, "generation_config", None)):
        if cfg is not None and hasattr(cfg, "quantization_config"):
            try:
                delattr(cfg, "quantization_config")
            except AttributeError:
                cfg.quantization_config = None
    model.hf_quantizer = None
    model.is_quantized = False
    return model.eval(), tok, info


def gguf_to_hf_directory(path, out_dir, *, max_shard_size="2GB") -> GGUFInfo:
    """Write the de-quantised model and its tokenizer as an HF checkpoint (safetensors) into
    ``out_dir`` (which must exist). Returns the file's :class:`GGUFInfo`."""
    model, tok, info = load_gguf_model(path)
    out_dir = Path(out_dir)
    model.save_pretrained(str(out_dir), max_shard_size=max_shard_size)
    if tok is not None:
        tok.save_pretrained(str(out_dir))
    del model
    return info


__all__ = ["GGUFError", "GGUFInfo", "GGUF_ARCHITECTURES", "inspect_gguf", "is_gguf_source", "load_gguf_model",
           "gguf_to_hf_directory", "resolve_gguf_file"]

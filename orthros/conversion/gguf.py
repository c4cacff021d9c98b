"""GGUF checkpoints (llama.cpp's format) as conversion sources.

A GGUF file holds the weights (often quantised), the model's hyper-parameters and its
tokenizer in one file. ``orthros convert model.gguf DST`` (or a directory holding exactly
one ``.gguf``) goes through three steps:

1. :func:`inspect_gguf` reads and checks the file *before anything is written*: magic and
   header, every key-value field, every tensor's extent inside the file (a truncated or
   corrupted file is refused naming the file), the architecture (``llama``, which includes
   llama.cpp's Mistral files, ``qwen2``, ``qwen3``), that every tensor is one the model takes,
   that the gguf package de-quantises every tensor type, and that the file asks for no RoPE
   scaling (transformers' loader drops tensors it has no place for and RoPE scaling).
2. :func:`gguf_to_hf_directory` loads it with transformers' own GGUF loader
   (``from_pretrained(dir, gguf_file=...)``, which de-quantises every tensor to fp32 and
   rebuilds the tokenizer, chat template included) and writes a plain HF checkpoint
   (safetensors + tokenizer) into a staging directory.
3. The staging directory goes through the ordinary safetensors conversion
   (:func:`orthros.conversion.convert.convert_checkpoint`): same plan, report, refusals and
   atomic output.

Needs the ``gguf`` and ``accelerate`` packages (``utils.install_hint("gguf")``). The de-quantised model is held
in memory once (fp32: 4 bytes per parameter), so a GGUF needs about 4x its parameter count
in bytes of RAM; the staging directory needs as much disk.
"""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass
from pathlib import Path

from ..checkpoint_files import GGUF_ARCHITECTURES, GGUF_MAGIC, gguf_files
from ..utils import expand_path, install_hint

# the tensors transformers' loader puts into the model of each architecture (any other it drops);
# rope_freqs.weight is checked by _check_rope_scaling
_GGUF_TOP_TENSORS = {"token_embd.weight", "output_norm.weight", "output.weight", "rope_freqs.weight"}
_LLAMA_LAYER = {f"{n}.weight" for n in ("attn_norm", "ffn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
                                        "ffn_gate", "ffn_up", "ffn_down")}
_GGUF_LAYER_TENSORS = {"llama": _LLAMA_LAYER, "qwen2": _LLAMA_LAYER | {"attn_q.bias", "attn_k.bias", "attn_v.bias"},
                       "qwen3": _LLAMA_LAYER | {"attn_q_norm.weight", "attn_k_norm.weight"}}


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
    context_length: int | None = None  # <arch>.context_length: transformers' max_position_embeddings
    head_dim: int | None = None  # <arch>.attention.key_length


def gguf_notes(info: "GGUFInfo") -> list:
    """What a conversion of ``info``'s file should tell its user beyond the plan (``--dry-run``
    and the notes after the conversion)."""
    if info.has_tokenizer:
        return []
    return [f"{info.path.name} holds no tokenizer (no tokenizer.ggml.* fields): the checkpoint will have none; "
            f"copy the model's tokenizer files into it before `orthros generate` (or pass --tokenizer there)"]


def max_positions(info: "GGUFInfo") -> tuple[int, str]:
    """``(max_position_embeddings, where it comes from)`` of the model transformers builds from
    ``info``'s file: its ``<arch>.context_length``, else the transformers config's default (a
    ``--window-size`` beyond it passed the dry run and failed after the de-quantising)."""
    if info.context_length is not None:
        return info.context_length, "the GGUF's context_length"
    from transformers import CONFIG_MAPPING

    cls = CONFIG_MAPPING[info.gguf_architecture]
    return cls().max_position_embeddings, f"the GGUF has no context_length: transformers' {cls.__name__} default"


def resolve_gguf_file(path) -> Path:
    """The ``.gguf`` file named by ``path`` (the file itself, or the only one in a directory)."""
    p = expand_path(path, "source")
    if p.is_dir():
        found = gguf_files(p)
        if not found:
            raise FileNotFoundError(f"source directory {str(p)!r} holds no .gguf file")
        if len(found) > 1:
            raise GGUFError(f"source directory {str(p)!r} holds {len(found)} .gguf files "
                            f"({[f.name for f in found]}); name the one to convert")
        return found[0]
    if not p.exists():
        raise FileNotFoundError(f"source GGUF file {str(p)!r} does not exist")
    return p


def architecture_error(gguf_file, arch: str) -> GGUFError:
    """The refusal of a GGUF file of an architecture the conversion does not take."""
    return GGUFError(f"{gguf_file}: cannot convert GGUF architecture {arch!r}: supported are "
                     f"{', '.join(GGUF_ARCHITECTURES)}")


def _require_gguf():
    try:
        import gguf  # noqa: F401
    except ImportError:
        raise ImportError(f"reading GGUF files needs the 'gguf' package: {install_hint('gguf')}") from None
    return gguf


def _require_accelerate():
    """transformers' GGUF loader (the de-quantising load) needs accelerate: checked with the file, so a
    dry run says it too, not the load after the work began."""
    try:
        import accelerate  # noqa: F401
    except ImportError:
        raise ImportError("converting a GGUF file needs the 'accelerate' package (transformers' GGUF loader): "
                          f"{install_hint('gguf')}") from None


def _gguf_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"gguf {version('gguf')}"
    except PackageNotFoundError:
        return "gguf"


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


def _dequantizable(gguf, qtype) -> bool:
    """Whether the gguf package de-quantises tensors of GGML type ``qtype`` (tried on one zero block)."""
    import numpy as np

    try:
        gguf.quants.dequantize(np.zeros((1, gguf.GGML_QUANT_SIZES[qtype][1]), dtype=np.uint8), qtype)
    except (NotImplementedError, KeyError):
        return False
    return True


def _check_rope_scaling(reader, arch: str, gguf_file) -> None:
    """Refuse RoPE scaling, which transformers' GGUF loader drops (it reads only rope.freq_base): the
    model it builds would have plain RoPE, other logits than the GGUF's. llama.cpp stores Llama 3's
    scaling as per-dimension divisors (a ``rope_freqs.weight`` tensor), linear / YaRN scaling as
    ``<arch>.rope.scaling.*`` fields (a factor without a type is linear, as llama.cpp reads it; older
    files: ``<arch>.rope.scale_linear``)."""
    import numpy as np

    what = None
    kind = _field_value(reader, f"{arch}.rope.scaling.type")
    factor = _field_value(reader, f"{arch}.rope.scaling.factor")
    if factor is None:
        factor = _field_value(reader, f"{arch}.rope.scale_linear")
    if kind != "none" and isinstance(factor, (int, float)) and factor not in (0, 1):
        what = f"{arch}.rope.scaling.type {kind or 'absent (linear)'}, factor {factor}"
    freqs = next((t for t in reader.tensors if t.name == "rope_freqs.weight"), None)
    if freqs is not None and not np.all(np.asarray(freqs.data) == 1):
        what = "a rope_freqs.weight tensor"
    if what is not None:
        raise GGUFError(f"{gguf_file}: RoPE scaling ({what}) that transformers' GGUF loader ignores: the "
                        f"converted model would use plain RoPE and compute other logits than the GGUF's; "
                        f"convert the model's HF checkpoint (safetensors) instead")


def _tokenizer_models() -> tuple:
    """The ``tokenizer.ggml.model`` values that the installed transformers builds a tokenizer from."""
    try:
        from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_TOKENIZER_TYPES
    except ImportError:  # another layout of transformers' GGUF code: the two of llama / qwen files
        return ("gpt2", "llama")
    return tuple(sorted(GGUF_TOKENIZER_TYPES))


def _check_vocabulary(reader, arch: str, gguf_file) -> None:
    """The fields transformers builds the tokenizer and the model config's vocabulary from: each
    of these passed --dry-run and failed in the real run (a special token id beyond the vocabulary:
    transformers' warning, then an IndexError; one given as text: a StrictDataclass error; an
    unknown or missing tokenizer.ggml.model; no merges nor scores: KeyError 'scores'), a vocab_size
    that does not match token_embd only after de-quantising."""
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    n_tokens = len(tokens.data) if tokens is not None else None
    embd = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
    rows = int(embd.shape[-1]) if embd is not None and len(embd.shape) == 2 else None
    key = f"{arch}.vocab_size"
    vocab = _field_value(reader, key)
    if vocab is not None and (not isinstance(vocab, int) or isinstance(vocab, bool) or vocab < 1):
        raise GGUFError(f"{gguf_file}: corrupted GGUF file: the {key} field is {vocab!r}, not an integer >= 1")
    if rows is not None:
        if vocab is not None and vocab != rows:
            raise GGUFError(f"{gguf_file}: corrupted GGUF file: the {key} field is {vocab}, token_embd.weight "
                            f"has {rows} rows (one per token): they must be equal")
        if vocab is None and n_tokens is not None and n_tokens != rows:
            raise GGUFError(f"{gguf_file}: corrupted GGUF file: no {key} field, and tokenizer.ggml.tokens (the "
                            f"vocabulary size transformers takes then) holds {n_tokens} tokens, token_embd.weight "
                            f"has {rows} rows: add {key} = {rows}")
        if vocab is None and n_tokens is None:
            raise GGUFError(f"{gguf_file}: cannot tell the vocabulary size: neither a {key} field nor "
                            f"tokenizer.ggml.tokens (transformers would build a model of its default vocabulary "
                            f"size, not token_embd.weight's {rows} rows): add {key} = {rows}")
    # special token ids: the model config takes them, the tokenizer looks each up in its tokens
    bound = n_tokens if n_tokens is not None else (vocab or rows)
    for name in ("bos", "eos", "unknown", "padding"):
        key = f"tokenizer.ggml.{name}_token_id"
        if key not in reader.fields:
            continue
        v = _field_value(reader, key)
        if not isinstance(v, int) or isinstance(v, bool) or v < 0 or (bound is not None and v >= bound):
            allowed = f"0..{bound - 1}" if bound else ">= 0"
            raise GGUFError(f"{gguf_file}: corrupted GGUF file: the {key} field is {v!r}, not a token id of "
                            f"the vocabulary (an integer {allowed})")
    if tokens is None:  # no tokenizer: none is built (said in the plan's notes)
        return
    model = _field_value(reader, "tokenizer.ggml.model")
    known = _tokenizer_models()
    if model not in known:
        raise GGUFError(f"{gguf_file}: the tokenizer.ggml.model field is {'missing' if model is None else repr(model)}: "
                        f"transformers builds a tokenizer from one of {', '.join(known)}")
    if "tokenizer.ggml.scores" not in reader.fields and (model == "t5" or "tokenizer.ggml.merges" not in reader.fields):
        need = "tokenizer.ggml.scores" if model == "t5" else \
            "tokenizer.ggml.merges (or tokenizer.ggml.scores to derive them from)"
        raise GGUFError(f"{gguf_file}: corrupted GGUF file: a {model!r} tokenizer without {need}: "
                        f"transformers cannot build it")
    if model != "t5" and "tokenizer.ggml.merges" in reader.fields:  # a unigram (t5) tokenizer takes no merges
        _check_merges(reader, model, gguf_file)


def _check_merges(reader, model: str, gguf_file) -> None:
    """Each merge "A B" of tokenizer.ggml.merges: the tokenizers library's BPE refuses the whole
    tokenizer ("Error while initializing BPE: Token `X` out of vocabulary") unless A, B and AB are
    tokens of the vocabulary, the one transformers builds from tokenizer.ggml.tokens (a 'gpt2'
    vocabulary respelled in the byte alphabet, as transformers' byte_level_tokenizer does); a merge
    of other than two parts is a TypeError."""
    merges, tokens = _field_value(reader, "tokenizer.ggml.merges"), _field_value(reader, "tokenizer.ggml.tokens")
    if merges is None or not isinstance(tokens, list):  # no merges (an empty array); tokens unread: not judged
        return
    field = "the tokenizer.ggml.merges field"
    allowed = "each merge is 'A B' where A, B and AB are tokens of tokenizer.ggml.tokens"
    if not isinstance(merges, list) or not all(isinstance(m, str) for m in merges):
        raise GGUFError(f"{gguf_file}: corrupted GGUF file: {field} is not an array of strings ({allowed})")
    vocab = set(tokens)
    if model == "gpt2":
        try:
            from transformers.convert_slow_tokenizer import bytes_to_unicode
        except ImportError:  # another layout of transformers: its spelling unknown, nothing refused
            return
        spelling = bytes_to_unicode()
        alphabet = set(spelling.values())
        vocab = {t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode("utf-8")) for t in tokens}
    for i, merge in enumerate(merges):
        parts = merge.split(" ")
        if len(parts) != 2:
            raise GGUFError(f"{gguf_file}: corrupted GGUF file: {field} holds {merge!r} (merge {i}), not two "
                            f"tokens joined by one space: {allowed}")
        missing = next((t for t in (parts[0], parts[1], parts[0] + parts[1]) if t not in vocab), None)
        if missing is not None:
            raise GGUFError(f"{gguf_file}: corrupted GGUF file: {field} holds {merge!r} (merge {i}), and "
                            f"{missing!r} is not a token of the vocabulary: {allowed}")


def inspect_gguf(path) -> GGUFInfo:
    """Read and check a GGUF file without loading its tensors; a :class:`GGUFError` naming the
    file when it is not a complete, readable GGUF of a supported architecture."""
    gguf_file = resolve_gguf_file(path)
    gguf = _require_gguf()
    _require_accelerate()
    size = gguf_file.stat().st_size
    with open(gguf_file, "rb") as fh:
        magic = fh.read(4)
    if magic != GGUF_MAGIC:
        raise GGUFError(f"{gguf_file}: not a GGUF file (starts with {magic!r}, expected {GGUF_MAGIC!r})")
    try:
        reader = gguf.GGUFReader(str(gguf_file), "r")
    except Exception as e:  # noqa: BLE001 - numpy / struct errors on a damaged file
        if isinstance(e, ValueError) and "GGMLQuantizationType" in str(e):  # a type id the package has no name for
            raise GGUFError(f"{gguf_file}: a tensor of a GGML type that the installed gguf package "
                            f"({_gguf_version()}) does not know ({e}): a newer llama.cpp quantisation "
                            f"(pip install -U gguf, if a newer release reads it) or a corrupted file") from None
        raise GGUFError(f"{gguf_file}: corrupted or truncated GGUF file ({size} bytes; "
                        f"{type(e).__name__}: {e})") from None
    parts = _field_value(reader, "split.count")  # llama.cpp's gguf-split: each part a GGUF file of some tensors
    if isinstance(parts, int) and parts > 1:
        no = _field_value(reader, "split.no")
        which = f"part {no + 1} of {parts}" if isinstance(no, int) else f"one of {parts} parts"
        raise GGUFError(f"{gguf_file}: {which} of a split GGUF file: merge the parts first (llama.cpp's "
                        f"`llama-gguf-split --merge FIRST-PART OUT.gguf`) and convert OUT.gguf")
    ends = [int(t.data_offset) + int(t.n_bytes) for t in reader.tensors]
    if not ends:
        raise GGUFError(f"{gguf_file}: the GGUF file holds no tensors")
    if max(ends) > size:
        raise GGUFError(f"{gguf_file}: truncated GGUF file: its tensors need {max(ends)} bytes, the file has {size}")
    arch = _field_value(reader, "general.architecture")
    if not isinstance(arch, str):
        raise GGUFError(f"{gguf_file}: corrupted GGUF file: no general.architecture field")
    if arch not in GGUF_ARCHITECTURES:
        raise architecture_error(gguf_file, arch)
    # the sizes transformers builds the model from: required, or optional (its defaults apply)
    sizes = {}
    for key, required in ((f"{arch}.block_count", True), (f"{arch}.embedding_length", True),
                          (f"{arch}.attention.head_count", True), (f"{arch}.attention.head_count_kv", False),
                          (f"{arch}.feed_forward_length", False), (f"{arch}.context_length", False),
                          (f"{arch}.attention.key_length", False), (f"{arch}.rope.dimension_count", False)):
        v = _field_value(reader, key)
        if v is None and not required:
            continue
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise GGUFError(f"{gguf_file}: corrupted GGUF file: the {key} field is "
                            f"{'missing' if v is None else repr(v)}, not an integer >= 1")
        sizes[key] = v
    # optional too; one <= 0, NaN or text failed only after de-quantising (the model config refused it)
    for key in (f"{arch}.rope.freq_base", f"{arch}.attention.layer_norm_rms_epsilon"):
        v = _field_value(reader, key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0):
            raise GGUFError(f"{gguf_file}: corrupted GGUF file: the {key} field is {v!r}, not a finite number > 0")
    # a block_count above the layers stored made transformers initialise the others at random,
    # one below dropped the extra layers without a word
    blocks = sizes[f"{arch}.block_count"]
    stored = {int(t.name.split(".")[1]) for t in reader.tensors
              if t.name.startswith("blk.") and t.name.split(".")[1].isdigit()}
    if stored != set(range(blocks)):
        held = f"of layers {min(stored)}..{max(stored)}" if stored else "of no layer (no blk.N.* tensors)"
        if stored and len(stored) != max(stored) - min(stored) + 1:
            held = f"of layers {sorted(stored)}"
        raise GGUFError(f"{gguf_file}: corrupted GGUF file: {arch}.block_count is {blocks}, its tensors are {held}")
    layer = _GGUF_LAYER_TENSORS[arch]
    dropped = sorted(t.name for t in reader.tensors if t.name not in _GGUF_TOP_TENSORS
                     and not (t.name.startswith("blk.") and t.name.split(".", 2)[-1] in layer))
    if dropped:
        more = f" and {len(dropped) - 3} more" if len(dropped) > 3 else ""
        raise GGUFError(f"{gguf_file}: tensors that transformers' GGUF loader would leave out of the model: "
                        f"{', '.join(dropped[:3])}{more} (the converted model would compute without them)")
    _check_rope_scaling(reader, arch, gguf_file)
    _check_vocabulary(reader, arch, gguf_file)
    # transformers copies a chat template of another type as it is into tokenizer_config.json: the
    # conversion succeeded and `orthros generate --chat` failed later in jinja ("non template nodes")
    for key in [k for k in reader.fields if k == "tokenizer.chat_template" or k.startswith("tokenizer.chat_template.")]:
        v = _field_value(reader, key)
        if not isinstance(v, str):
            raise GGUFError(f"{gguf_file}: corrupted GGUF file: the {key} field is {v!r}, not a string "
                            f"(a Jinja chat template)")
    types: dict = {}
    n_params = 0
    for t in reader.tensors:
        name = getattr(t.tensor_type, "name", str(t.tensor_type))
        types[name] = types.get(name, 0) + 1
        n_params += int(t.n_elements)
    # a type the gguf package cannot de-quantise failed only after the tokenizer and the tensors before it
    unreadable = {q for q in {t.tensor_type for t in reader.tensors} if not _dequantizable(gguf, q)}  # once a type
    if unreadable:
        names = sorted(getattr(q, "name", str(q)) for q in unreadable)
        first = next(t.name for t in reader.tensors if t.tensor_type in unreadable)
        raise GGUFError(f"{gguf_file}: tensors of type {', '.join(names)} ({sum(types[n] for n in names)}, e.g. "
                        f"{first}) that the installed gguf package cannot de-quantise")
    name = _field_value(reader, "general.name")
    ft = _field_value(reader, "general.file_type")
    return GGUFInfo(path=gguf_file, architecture=GGUF_ARCHITECTURES[arch], gguf_architecture=arch,
                    name=name if isinstance(name, str) else None, file_type=ft if isinstance(ft, int) else None,
                    tensor_types=types, n_tensors=len(reader.tensors), n_params=n_params, size=size,
                    has_tokenizer="tokenizer.ggml.tokens" in reader.fields,
                    context_length=sizes.get(f"{arch}.context_length"),
                    head_dim=sizes.get(f"{arch}.attention.key_length"))


@contextlib.contextmanager
def _transformers_bars(progress: bool):
    """transformers' progress bars while it loads or writes, only where ours would draw one
    (:func:`orthros.utils.hf_progress_bars`). Its GGUF loader draws a plain tqdm bar that no
    switch of transformers turns off; it is replaced by a pass-through inside the block then."""
    import sys

    import transformers.modeling_gguf_pytorch_utils as gguf_utils

    from ..utils import hf_progress_bars, isatty

    saved = getattr(gguf_utils, "tqdm", None)
    quiet = saved is not None and not (progress and isatty(sys.stderr))
    if quiet:
        gguf_utils.tqdm = lambda iterable, *args, **kwargs: iterable
    try:
        with hf_progress_bars(progress):
            yield
    finally:
        if quiet:
            gguf_utils.tqdm = saved


def _one_line(e: BaseException) -> str:
    """``Type: message`` of a transformers error on one line; huggingface_hub's config validation
    errors by their cause (the value refused), not the validator's name."""
    cause = e.__cause__ if type(e).__module__.startswith("huggingface_hub") and e.__cause__ else e
    return f"{type(cause).__name__}: {' '.join(str(cause).split())}"


def load_gguf_model(path, *, with_tokenizer: bool = True, progress: bool = True):
    """``(model, tokenizer or None, GGUFInfo)``: the de-quantised transformers model (fp32) and
    tokenizer that transformers builds from the GGUF file, after :func:`inspect_gguf`.
    ``progress``: transformers' bars, at a terminal."""
    info = inspect_gguf(path)
    from huggingface_hub.errors import StrictDataclassError  # a config value transformers refuses
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    errors = (OSError, ValueError, LookupError, RuntimeError, TypeError, StrictDataclassError)
    folder, name = str(info.path.parent), info.path.name
    # transformers reads no head dim of a Qwen3 GGUF (its config then has the default 128): the
    # file's key_length is given to the config
    config_kw = {"head_dim": info.head_dim} if info.head_dim and info.gguf_architecture == "qwen3" else {}
    tok = None
    if with_tokenizer and info.has_tokenizer:  # first: a bad tokenizer is found before the long de-quantising
        try:
            tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        except Exception as e:  # noqa: BLE001 - the tokenizers library raises a bare Exception (merges vs vocab)
            # the tokenizer's loading builds the model config from the file's fields too: either may be wrong
            raise GGUFError(f"{info.path}: transformers could not build the model config or the tokenizer from this "
                            f"GGUF file's fields ({_one_line(e)})") from None
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # its load report: what is wrong is raised below, in one line
    try:
        with _transformers_bars(progress):
            model, loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype="float32",
                                                                 ignore_mismatched_sizes=True,
                                                                 output_loading_info=True, **config_kw)
    except errors as e:
        raise GGUFError(f"{info.path}: transformers could not load this GGUF file ({_one_line(e)})") from None
    finally:
        hf_logging.set_verbosity(verbosity)
    # a tensor the file lacks, or one of another shape than its fields give, would be left at random
    wrong = [f"missing {k}" for k in sorted(loaded["missing_keys"])]
    wrong += [f"{k[0]} of shape {list(k[1])}, expected {list(k[2])}" for k in sorted(loaded["mismatched_keys"])]
    if wrong:
        more = f" and {len(wrong) - 3} more" if len(wrong) > 3 else ""
        raise GGUFError(f"{info.path}: the GGUF's tensors do not fit the model its fields describe: "
                        f"{'; '.join(wrong[:3])}{more}")
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


def gguf_to_hf_directory(path, out_dir, *, max_shard_size="2GB", progress: bool = True) -> GGUFInfo:
    """Write the de-quantised model and its tokenizer as an HF checkpoint (safetensors) into
    ``out_dir`` (which must exist). Returns the file's :class:`GGUFInfo`."""
    model, tok, info = load_gguf_model(path, progress=progress)
    out_dir = Path(out_dir)
    with _transformers_bars(progress):
        model.save_pretrained(str(out_dir), max_shard_size=max_shard_size)
    if tok is not None:
        tok.save_pretrained(str(out_dir))
    del model
    return info


def _permute_qk(w, n_head: int):
    """llama.cpp's row order for q/k projections (what transformers' loader undoes)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


_WRITABLE = {cls: arch for arch, cls in GGUF_ARCHITECTURES.items()}  # class name -> general.architecture


def write_llama_gguf(model, tokenizer, path, *, dtype: str = "f32") -> Path:
    """Write a transformers ``LlamaForCausalLM`` (or ``Qwen2ForCausalLM`` / ``Qwen3ForCausalLM``)
    and its byte-level BPE fast tokenizer as a GGUF file (llama.cpp's tensor names and, for Llama,
    its q/k row order; ``dtype`` ``f32`` or ``f16`` for the matrices, norms and biases stay f32).
    Small models only (the tensors are held in memory); used by the tests and the GPU smoke run to
    make a GGUF without any download."""
    import json

    import numpy as np

    gguf = _require_gguf()
    arch = _WRITABLE.get(type(model).__name__)
    if arch is None:
        raise ValueError(f"model must be a {', '.join(_WRITABLE)}, got {type(model).__name__}")
    if dtype not in ("f32", "f16"):
        raise ValueError(f"dtype must be 'f32' or 'f16', got {dtype!r}")
    c = model.config
    heads, kv = c.num_attention_heads, c.num_key_value_heads or c.num_attention_heads
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
    rope = dict(getattr(c, "rope_parameters", None) or {})
    path = Path(path)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(getattr(c, "name_or_path", None) or f"orthros-test-{arch}")
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_rope_dimension_count(head_dim)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_rope_freq_base(float(rope.get("rope_theta", getattr(c, "rope_theta", 10000.0))))
    w.add_vocab_size(c.vocab_size)
    w.add_file_type(gguf.LlamaFileType.ALL_F32 if dtype == "f32" else gguf.LlamaFileType.MOSTLY_F16)
    # tokenizer: byte-level BPE ("gpt2" in GGUF terms), every id in order
    tj = json.loads(tokenizer.backend_tokenizer.to_str())
    if tj["model"]["type"] != "BPE":
        raise ValueError("only byte-level BPE tokenizers can be written")
    vocab = tokenizer.get_vocab()
    if len(vocab) != c.vocab_size:
        raise ValueError(f"the tokenizer has {len(vocab)} tokens, the model's vocab_size is {c.vocab_size}")
    by_id = sorted(vocab.items(), key=lambda kv_: kv_[1])
    if [i for _, i in by_id] != list(range(len(by_id))):
        raise ValueError("the tokenizer's ids are not 0..N-1")
    special = set(tokenizer.all_special_tokens) | {a["content"] for a in tj.get("added_tokens", [])}
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list([t for t, _ in by_id])
    w.add_token_types([gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL for t, _ in by_id])
    w.add_token_merges(merges)
    for tok_name, add in (("bos_token_id", w.add_bos_token_id), ("eos_token_id", w.add_eos_token_id),
                          ("pad_token_id", w.add_pad_token_id)):
        if getattr(tokenizer, tok_name, None) is not None:
            add(int(getattr(tokenizer, tok_name)))
    if getattr(tokenizer, "chat_template", None):
        w.add_chat_template(tokenizer.chat_template)
    # tensors
    np_dtype = np.float32 if dtype == "f32" else np.float16
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    per_layer = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
                 "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
                 "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
                 "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
                 "mlp.down_proj": "ffn_down"}
    sd = model.state_dict()
    for name, t in sd.items():
        if name == "lm_head.weight" and c.tie_word_embeddings:
            continue
        if name in names:
            out = names[name]
        else:
            parts = name.split(".")  # model.layers.<i>.<module...>.weight|bias
            if parts[:2] != ["model", "layers"]:
                raise ValueError(f"no GGUF name for tensor {name}")
            mod = ".".join(parts[3:-1])
            if mod not in per_layer:
                raise ValueError(f"no GGUF name for tensor {name}")
            out = f"blk.{parts[2]}.{per_layer[mod]}.{parts[-1]}"
        a = t.detach().float().cpu().numpy()
        if arch == "llama" and ".attn_q." in out:  # weight and bias, as transformers' loader undoes it
            a = _permute_qk(a, heads)
        elif arch == "llama" and ".attn_k." in out:
            a = _permute_qk(a, kv)
        a = a.astype(np.float32 if a.ndim == 1 else np_dtype)
        w.add_tensor(out, np.ascontiguousarray(a))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


__all__ = ["GGUFError", "GGUFInfo", "inspect_gguf", "load_gguf_model",
           "max_positions", "gguf_to_hf_directory", "resolve_gguf_file", "write_llama_gguf"]

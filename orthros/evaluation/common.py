"""Shared helpers of the evaluations: loading a checkpoint as an Orthros model, argument checks."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from ..utils import check_not_blank, expand_path, parse_dtype

DATA_DIR = Path(__file__).resolve().parent / "data"
LM_TASKS_DIR = DATA_DIR / "lm_tasks"


def read_config(path, arg: str = "--model",
                expected: str = "an Orthros checkpoint, or a Llama / Qwen2 / Qwen3 / Mistral / Qwen3.5 one to convert") -> dict:
    """The ``config.json`` of a local checkpoint directory, read without loading the model; a clear
    ``ValueError`` naming ``arg`` (and what is ``expected``) when ``path`` is not a checkpoint directory."""
    check_not_blank(path, arg, "checkpoint")
    p = expand_path(path, arg)
    if not p.exists():
        raise ValueError(f"{arg} {path!s}: no such file or directory (a local checkpoint directory is needed; "
                         f"nothing is downloaded)")
    if not (p / "config.json").is_file():
        from ..checkpoint_files import gguf_hint, gguf_refusal  # (standard library only: no torch)

        why = gguf_refusal(p)  # a GGUF that orthros convert does not take: not "convert it first"
        if why:
            raise ValueError(f"{arg} {path!s}: {why}")
        hint = gguf_hint(p, path)  # a GGUF file, or a folder holding one: sent to `orthros convert`, as generate does
        if not p.is_dir():
            raise ValueError(f"{arg} {path!s} is not a directory" + (hint or f" (give the directory that holds "
                             f"config.json and the weights: {expected})"))
        raise ValueError(f"{arg} {path!s} is not a checkpoint directory: it has no config.json"
                         + (hint or f" (expected {expected})"))
    try:
        cfg = json.loads((p / "config.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{arg} {path!s}: config.json is not readable JSON ({e})") from None
    return cfg if isinstance(cfg, dict) else {}


def read_model_type(path, cfg: dict | None = None) -> str:
    """``model_type`` of a local checkpoint directory (from its config.json, or ``cfg`` when read
    already); a clear ``ValueError`` when ``path`` is not one."""
    from ..checkpoint_files import CONVERTIBLE  # here: `orthros eval --help` imports no torch

    mt = (read_config(path) if cfg is None else cfg).get("model_type")
    if mt == "orthros" or mt in CONVERTIBLE:
        return mt
    raise ValueError(f"--model {path!s} has model_type {mt!r}: not an Orthros checkpoint and not convertible "
                     f"(convertible: {', '.join(CONVERTIBLE)})")


def read_max_positions(path):
    """``max_position_embeddings`` of a checkpoint (``--model``) from its config.json (``None`` if it sets
    none), so that a length beyond it is refused before the weights load."""
    cfg = read_config(path)
    read_model_type(path, cfg)
    n = cfg.get("max_position_embeddings")
    return n if isinstance(n, int) and not isinstance(n, bool) else None


def check_attention_mode(path, attention_mode, model_type: str | None = None) -> None:
    """``--attention-mode`` (any but ``None``) overrides an Orthros checkpoint's attention: refused for
    another checkpoint (``model_type``: read from ``path`` when not given)."""
    if attention_mode is None:
        return
    cfg = read_config(path)
    if (model_type or read_model_type(path, cfg)) != "orthros":
        raise ValueError("--attention-mode applies to Orthros checkpoints (convert the model first)")
    from ..kinds import ATTENTION_LAYER_TYPES

    types = cfg.get("layer_types")
    if isinstance(types, list) and types and not any(t in ATTENTION_LAYER_TYPES for t in types):
        # an all-GDN model: the mode would only switch an output stream through its GDN layers on or off
        # (other numbers, read as another attention's)
        raise ValueError(f"--attention-mode {attention_mode}: --model {path} has no attention layer (its "
                         f"layer_types are all {', '.join(sorted(set(map(str, types))))}): there is no attention "
                         f"to override; drop --attention-mode")


def load_model(path, *, device: str = "cpu", dtype=None, window_size: int = 128, attention_mode=None):
    """An ``OrthrosForCausalLM`` from an Orthros checkpoint, or converted on the fly from a
    supported Transformer checkpoint (its base stream window = ``window_size``; the conversion's notes
    print as ``note: ...`` lines on stderr). ``attention_mode``
    (Orthros checkpoints only) overrides the checkpoint's: its attention layers run as ``orthros``,
    ``full`` or ``window`` with the same weights (scale-offset parameters it lacks start at the identity)."""
    import orthros  # noqa: F401  (registers the Auto classes)

    mt = read_model_type(path)
    if isinstance(dtype, str):
        dtype = parse_dtype(dtype)
    check_attention_mode(path, attention_mode, mt)
    if mt == "orthros":
        from transformers import AutoConfig, AutoModelForCausalLM

        from ..models.loading import check_weights_fit

        config = AutoConfig.from_pretrained(str(path))
        check_weights_fit(path, config)  # a missing tensor would be random
        if attention_mode is not None:  # before the layers are built: they fix their mode then
            from ..kinds import with_attention_mode

            config.attention_mode = attention_mode
            if getattr(config, "layer_types", None):
                config.layer_types = with_attention_mode(config.layer_types, attention_mode)
        model = AutoModelForCausalLM.from_pretrained(str(path), config=config, dtype=dtype)
    else:
        from ..conversion import convert_from_hf

        # the conversion's notes as `orthros convert` prints them (not as Python warnings with a source line)
        model = convert_from_hf(str(path), window_size=window_size, dtype=dtype, on_note=print_note)
    return model.to(device).eval()


def print_note(note: str) -> None:
    """A note of a checkpoint converted on the fly, one line on stderr (stdout holds the results)."""
    import sys

    print(f"note: {note}", file=sys.stderr, flush=True)


def load_tokenizer(model_path, tokenizer_path=None):
    from transformers import AutoTokenizer

    src = tokenizer_path or model_path
    if tokenizer_path is not None and not Path(tokenizer_path).is_dir():
        # AutoTokenizer takes a name that is no local folder for a hub id: a mistyped path spent half a minute
        # in network retries, then read as a connection error
        why = "a file, not a directory" if Path(tokenizer_path).exists() else "no such directory"
        raise ValueError(f"--tokenizer {tokenizer_path}: {why} (a local tokenizer directory is needed; nothing is "
                         f"downloaded)")
    try:
        return AutoTokenizer.from_pretrained(str(src))
    except Exception as e:  # noqa: BLE001 - transformers raises many kinds here
        # the folder as the user gave it: --tokenizer DIR, or --model's (named by neither, the error read as if of
        # --model when --tokenizer was the wrong one)
        where = f"--tokenizer {tokenizer_path}" if tokenizer_path else f"--model {model_path} (pass --tokenizer DIR)"
        from ..checkpoint_files import TOKENIZER_FILES, has_tokenizer

        if Path(src).is_dir() and not has_tokenizer(src):
            # transformers' own words for a folder without one ("Couldn't instantiate the backend tokenizer ...
            # You need to have sentencepiece or tiktoken installed") sent users to install a package
            raise ValueError(f"no usable tokenizer in {where}: it holds no tokenizer file (none of "
                             f"{', '.join(TOKENIZER_FILES)})") from None
        raise ValueError(f"no usable tokenizer in {where}: {type(e).__name__}: {e}") from None


def tokenizer_name(model_path, tokenizer_path=None) -> str:
    """How an error names the tokenizer in use: ``--tokenizer DIR``, or the one of ``--model``."""
    return f"--tokenizer {tokenizer_path}" if tokenizer_path else f"the tokenizer of --model {model_path}"


def check_token_range(max_id: int, vocab_size, tokenizer: str = "the tokenizer") -> None:
    """The largest token id of the text to score (``max_id``) must be an id of the model (its
    ``vocab_size``; ``None``: unknown, nothing checked): a tokenizer of another model would end in the
    embedding's ``IndexError``. ``tokenizer`` names it in the error (:func:`tokenizer_name`)."""
    if isinstance(vocab_size, int) and not isinstance(vocab_size, bool) and max_id >= vocab_size:
        raise ValueError(f"{tokenizer} gives token ids up to {max_id}, beyond the model's vocab_size "
                         f"({vocab_size}): not this model's tokenizer")


def check_distinct_files(outputs, inputs=(), checkpoints=()) -> None:
    """Refuse, before any work, two outputs naming one file (the second written would replace the first),
    an output naming an input (it would replace the data read), or an output naming a file of a checkpoint
    folder read (its config, weights, tokenizer or code: ``-o MODEL/config.json`` would spoil the
    checkpoint; another file in that folder, such as an earlier ``MODEL/eval.json``, is allowed).
    ``outputs``, ``inputs`` and ``checkpoints`` (folders) are ``(argument, path)`` pairs, an empty or
    ``None`` path is one not given."""
    from ..utils import same_file

    outs = [(arg, p) for arg, p in outputs if p]
    for i, (arg, p) in enumerate(outs):
        for other, q in outs[:i]:
            if same_file(p, q):
                raise ValueError(f"{other} {q} and {arg} {p} name the same file: each needs its own")
        for other, q in inputs:
            if q and same_file(p, q):
                raise ValueError(f"{arg} {p} is the {other} file: name another file for the results")
        target = Path(os.path.realpath(expand_path(p, arg)))
        for other, d in checkpoints:
            folder = expand_path(d, other) if d else None
            if folder is not None and folder.is_dir() and target.parent == Path(os.path.realpath(folder)) \
                    and _is_checkpoint_file(target.name):
                raise ValueError(f"{arg} {p} is a file of the {other} checkpoint {d} (its config, weights, tokenizer "
                                 f"or code): name another file for the results")


def _is_checkpoint_file(name: str) -> bool:
    """Whether a file of this name in a checkpoint folder belongs to the checkpoint."""
    from ..checkpoint_files import TOKENIZER_FILES

    return (name in ("config.json", "generation_config.json", "special_tokens_map.json", "added_tokens.json",
                     "merges.txt", "chat_template.jinja", *TOKENIZER_FILES)
            or name.endswith((".safetensors", ".safetensors.index.json", ".bin", ".bin.index.json", ".py", ".gguf")))


TYPED = "typed_options"  # the namespace's {dest: the option string typed} of the options given in two spellings


def typed(args, dest: str, default: str | None = None) -> str:
    """The option of ``dest`` as the user typed it (recorded under :data:`TYPED`), else ``default``, else its
    ``--hyphen-spelling``."""
    return (getattr(args, TYPED, None) or {}).get(dest) or default or "--" + dest.replace("_", "-")


def check_no_empty_values(parser, args, skip=("model",)) -> None:
    """Refuse, before any work, an option of ``parser`` given an empty or blank value (``args``: its parsed
    arguments), most likely an unset shell variable (``-o "$OUT"``): no option of the evaluations means
    anything by one, and each was taken as "not given" (``-o ''``: the results written nowhere, ``--device
    ''``: the default device) or as the current folder (``niah-train --out '' --overwrite`` replaced it). ``skip``: the ``dest`` of options refused in
    their own words later, before any work (``--model``: :func:`read_config`)."""
    for action in parser._actions:
        if not action.option_strings or action.dest in skip:
            continue
        value = getattr(args, action.dest, None)
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, str) and not v.strip():  # (named as typed where it has two spellings)
                name = typed(args, action.dest, max(action.option_strings, key=len))
                raise ValueError(f"{name} is empty ({v!r}): give a value"
                                 + ("" if action.required else ", or leave the option out for its default"))


SEED_MAX = 2 ** 64 - 1  # the largest seed torch.manual_seed takes ("Overflow when unpacking long long" above it)


def check_seed(seed: int, arg: str = "--seed") -> None:
    """A ``ValueError`` naming ``arg`` unless ``0 <= seed <= SEED_MAX``, the seeds torch (and numpy) take."""
    if seed < 0:
        raise ValueError(f"{arg} must be >= 0, got {seed}")
    if seed > SEED_MAX:
        raise ValueError(f"{arg} must be <= {SEED_MAX} (the largest seed torch takes), got {seed}")


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def parse_int_list(text: str, name: str) -> list[int]:
    try:
        vals = [int(x) for x in str(text).replace(",", " ").split()]
    except ValueError:
        raise ValueError(f"{name} must be a comma-separated list of integers, got {text!r}") from None
    if not vals:
        raise ValueError(f"{name} must not be empty")
    return vals




def make_tiny_checkpoint(path, *, attention_mode: str = "orthros", window_size: int = 16,
                         max_position_embeddings: int = 2048, seed: int = 0, **overrides):
    """Write a tiny randomly initialised Orthros checkpoint with the shipped tokenizer to
    ``path`` (for tests and for trying the commands without a trained model)."""
    import torch
    from transformers import AutoTokenizer

    from ..models import OrthrosConfig, OrthrosForCausalLM

    tok_dir = Path(__file__).resolve().parents[1] / "data" / "tokenizer"
    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    kw = dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
              num_key_value_heads=1, head_dim=16, max_position_embeddings=max_position_embeddings,
              window_size=window_size, attention_mode=attention_mode, bos_token_id=tok.bos_token_id,
              eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    kw.update(overrides)
    torch.manual_seed(seed)
    model = OrthrosForCausalLM(OrthrosConfig(**kw))
    model.save_pretrained(str(path))
    tok.save_pretrained(str(path))
    return path

"""Training configuration: nested dataclasses, YAML loading, ``--key value`` overrides.

Every field has a default, so an empty YAML file is a valid config (the embedded corpus,
the embedded tokenizer and a tiny Orthros model). Unknown keys are errors that name the
nearest valid key. Overrides use dotted keys (``--optim.lr 3e-4``); a leaf name that is
unique across sections may be given bare (``--lr 3e-4``).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
import shlex
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

import yaml

from ..kinds import HYBRID_ALIASES, HYBRID_KINDS, MODE_ALIASES
from ..utils import expand_path
from .optim import SCHEDULES

MODES = ("pt", "sft", "cpt")
# user-facing names (orthros/kinds.py MODE_ALIASES; the hybrids with GDN layers: HYBRID_ALIASES)
ARCHITECTURES = ("orthros", "transformer", "swa", "orthros-h", "linear-hybrid", "gdn")
ARCH_TO_ATTENTION_MODE = {a: MODE_ALIASES[a] for a in ARCHITECTURES if a not in HYBRID_ALIASES}
PRECISIONS = ("auto", "bf16", "fp32")
FORMATS = ("auto", "text", "json", "parquet", "csv", "arrow", "hub")
SAMPLE_BY = ("document", "paragraph", "line")


class ConfigError(ValueError):
    """A bad configuration, reported before any training work is done."""


@dataclass
class ModelSection:
    architecture: str = "orthros"  # orthros | transformer | swa | orthros-h | linear-hybrid | gdn
    scale_offset: bool = True  # Orthros only: learnable alpha/beta, alpha'/beta' query transforms
    init_from: Optional[str] = None  # checkpoint dir (from_pretrained); required for mode cpt
    hidden_size: int = 128
    intermediate_size: int = 384  # the MLP's width
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: Optional[int] = None  # GQA; null: as many as attention heads
    head_dim: Optional[int] = None  # null: hidden_size / num_attention_heads
    window_size: int = 32  # paper: 128 for Orthros; SWA baseline 512 at 1.3B
    max_position_embeddings: int = 4096
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = True
    qk_norm: bool = False  # RMSNorm on each head's queries and keys (Qwen3)
    attn_backend: str = "auto"  # auto (Triton kernels on CUDA) | reference | sdpa | triton
    initializer_range: float = 0.02  # std of the weights' normal init
    # the hybrids' Gated DeltaNet layers (orthros-h / linear-hybrid / gdn; Qwen3.5's names, docs/hybrid.md):
    linear_num_key_heads: Optional[int] = None  # GDN key heads; null: as many as attention heads
    linear_num_value_heads: Optional[int] = None  # GDN value heads, a multiple of the key heads; null: as many
    linear_key_head_dim: Optional[int] = None  # GDN key head size; null: the attention's head size
    linear_value_head_dim: Optional[int] = None  # GDN value head size; null: the attention's head size
    linear_conv_kernel_dim: int = 4  # the GDN short convolution's width


@dataclass
class DataSection:
    train: Union[str, list] = "embedded"  # "embedded", file/dir/glob path(s), or a hub name (online only)
    eval: Union[str, list, None] = "embedded"  # same; null: no eval
    format: str = "auto"  # auto | text | json | parquet | csv | arrow | hub
    text_field: str = "text"  # the field of a record that holds its text (pt / cpt)
    messages_field: str = "messages"  # the field of a chat record (sft): a list of {role, content}
    text_sample_by: str = "document"  # for .txt files (data.format text) only: document | paragraph | line
    tokenizer: str = "embedded"  # "embedded" or a local tokenizer dir / hub name
    seq_len: int = 256  # tokens per packed training sequence
    streaming: bool = False  # read the data as a stream (datasets' IterableDataset) instead of loading it
    shuffle: bool = True
    shuffle_buffer: int = 10000  # streaming only
    encode_batch: int = 64  # documents tokenized together
    eval_sequences: int = 32  # held-out packed sequences scored at each eval
    # pt/cpt long-range variant, train and eval alike: 0 off; N > 0 cuts every document into
    # passages P of N tokens and trains on documents "P P EOS" (the 2nd copy needs context N back)
    repeat_passage: int = 0


@dataclass
class OptimSection:
    lr: float = 1e-3  # peak learning rate (AdamW)
    min_lr_ratio: float = 0.1  # cosine / linear end at lr x this (constant: refused unless left at 0.1)
    schedule: str = "cosine"  # cosine | constant | linear
    warmup_steps: int = 20
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0  # 0 disables clipping
    # learning rate of Orthros' scale-offset parameters (alpha/beta, alpha'/beta') as a multiple
    # of lr: the only parameters a conversion adds (a Transformer has none)
    scale_offset_lr_mult: float = 1.0


@dataclass
class TrainSection:
    max_steps: int = 200
    # packed rows per micro-batch per process; the rows are concatenated into one packed
    # sequence (B = 1, cu_seqlens), so on CPU (reference attention, cost ~ (rows*seq_len)^2)
    # prefer 1 row and accumulate; on GPU kernels the cost follows the documents
    micro_batch_size: int = 1
    grad_accum: int = 8
    precision: str = "auto"  # auto (bf16 on CUDA, fp32 on CPU) | bf16 | fp32
    activation_checkpointing: bool = False  # recompute each decoder layer in the backward (less memory)
    compile: bool = False  # torch.compile each decoder layer
    device: str = "auto"  # auto | cpu | cuda
    eval_every: int = 50  # 0: only at the end
    log_every: int = 10  # steps between metrics.jsonl rows (and progress lines in a log)
    progress: bool = True  # a bar at a terminal, plain lines in a log or pipe
    tensorboard: bool = True  # if tensorboard is installed
    plot: bool = True  # draw output_dir/loss.png after each eval and at the end (orthros plot)
    peak_tflops: Optional[float] = None  # for MFU; auto-detected for known GPUs
    threads: Optional[int] = None  # torch.set_num_threads on CPU


@dataclass
class CheckpointSection:
    every: int = 100  # 0: only at the end
    keep_last: int = 3  # checkpoints kept; older ones are deleted
    resume: Union[bool, str] = "auto"  # auto | true | false | path to a checkpoint dir
    verify: bool = True  # check sizes and sha256 of every file when loading
    # model-config keys (config.json) that may differ from the checkpoint's when resuming,
    # e.g. [window_size]; any other difference is refused, naming the keys
    allow_changes: Union[list, str] = field(default_factory=list)


@dataclass
class RunConfig:
    mode: str = "pt"  # pt | sft | cpt
    output_dir: str = "runs/orthros"  # checkpoints, metrics.jsonl, loss.png, run_config.yaml
    seed: int = 0
    model: ModelSection = field(default_factory=ModelSection)
    data: DataSection = field(default_factory=DataSection)
    optim: OptimSection = field(default_factory=OptimSection)
    train: TrainSection = field(default_factory=TrainSection)
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# Common names from other trainers, used only to suggest the right key.
ALIASES = {
    "learning_rate": "optim.lr", "lr_warmup_steps": "optim.warmup_steps", "warmup": "optim.warmup_steps",
    "max_grad_norm": "optim.grad_clip", "clip_grad": "optim.grad_clip", "steps": "train.max_steps",
    "num_steps": "train.max_steps", "batch_size": "train.micro_batch_size",
    "per_device_train_batch_size": "train.micro_batch_size",
    "gradient_accumulation_steps": "train.grad_accum", "gradient_checkpointing": "train.activation_checkpointing",
    "sequence_length": "data.seq_len", "max_seq_len": "data.seq_len", "max_length": "data.seq_len",
    "arch": "model.architecture", "attention_mode": "model.architecture", "sliding_window": "model.window_size",
    "save_steps": "checkpoint.every", "save_total_limit": "checkpoint.keep_last", "dataset": "data.train",
    "bf16": "train.precision", "dtype": "train.precision", "out_dir": "output_dir",
}


# keys that name one local path (data.train / data.eval: paths, globs or lists, expanded as read)
PATH_KEYS = ("output_dir", "model.init_from", "data.tokenizer", "checkpoint.resume")


def _section_types() -> dict[str, type]:
    hints = typing.get_type_hints(RunConfig)
    return {k: v for k, v in hints.items() if dataclasses.is_dataclass(v)}


def valid_keys() -> list[str]:
    keys = []
    for f in dataclasses.fields(RunConfig):
        sec = _section_types().get(f.name)
        if sec is None:
            keys.append(f.name)
        else:
            keys.extend(f"{f.name}.{g.name}" for g in dataclasses.fields(sec))
    return keys


def nearest_key(key: str) -> Optional[str]:
    """The valid key closest to ``key`` (its last part compared with key names and common aliases)."""
    keys = valid_keys()
    section, _, leaf = key.rpartition(".")
    by_leaf: dict[str, list[str]] = {}
    for k in keys:
        by_leaf.setdefault(k.split(".")[-1], []).append(k)
    for alias, target in ALIASES.items():
        by_leaf.setdefault(alias, []).append(target)
    m = difflib.get_close_matches(leaf, list(by_leaf), n=1, cutoff=0.6)
    if m:
        cands = by_leaf[m[0]]
        same = [c for c in cands if c.startswith(section + ".")] if section else []
        return (same or cands)[0]
    m = difflib.get_close_matches(key, keys, n=1, cutoff=0.5)
    return m[0] if m else None


_FLAGS = {"dry_run": "--dry-run", "help_config": "--help-config"}  # the command's flags, which take no value


def _unknown(key: str, typed: Optional[str] = None) -> ConfigError:
    """``key`` is no config key; ``typed``: the override's key as typed (--max-stepz), where it differs."""
    shown = typed or key
    key = key.replace("-", "_")
    flag = _FLAGS.get(key)
    if flag is not None:  # --dry_run, --dry-run=true: a flag written as a key
        return ConfigError(f"'{shown}' is not a config key: the flag is {flag}, written as such (no value)")
    flag = difflib.get_close_matches(key, list(_FLAGS), n=1, cutoff=0.8)
    if flag:  # --dryrun: a flag misspelt
        return ConfigError(f"unknown config key '{shown}'; did you mean the flag {_FLAGS[flag[0]]}?")
    near = nearest_key(key)
    hint = f"; did you mean '{near}'?" if near else ""
    return ConfigError(f"unknown config key '{shown}'{hint} (valid keys: see `orthros train --help-config`)")


def resolve_key(key: str) -> str:
    """Map a dotted or unique bare key to its full dotted name, or raise with a suggestion."""
    typed, key = key, key.replace("-", "_")
    keys = valid_keys()
    if key in keys:
        return key
    if "." not in key:
        leaf = [k for k in keys if k.split(".")[-1] == key]
        if len(leaf) == 1:
            return leaf[0]
        if len(leaf) > 1:
            raise ConfigError(f"config key '{key}' is ambiguous: use one of {leaf}")
    if key in _section_types():  # --optim 3
        first = dataclasses.fields(_section_types()[key])[0].name
        raise ConfigError(f"'{key}' is a config section, not a key: set one of its keys, as --{key}.{first} VALUE "
                          f"(its keys: see `orthros train --help-config`)")
    raise _unknown(key, typed)


def _type_of(key: str):
    hints_top = typing.get_type_hints(RunConfig)
    if "." in key:
        sec, leaf = key.split(".", 1)
        return typing.get_type_hints(hints_top[sec])[leaf]
    return hints_top[key]


def _allowed_types(key: str) -> tuple:
    tp = _type_of(key)
    return typing.get_args(tp) if typing.get_origin(tp) is Union else (tp,)


def _coerce(key: str, value: Any):
    allowed = _allowed_types(key)
    if value is None:
        if type(None) in allowed:
            return None
        raise ConfigError(f"config key '{key}' may not be null")
    for t in allowed:
        if t is type(None):
            continue
        if t is bool and isinstance(value, bool):
            return value
        if t is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        if t is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if t is str and isinstance(value, str):
            return value
        if t is list and isinstance(value, (list, tuple)):
            return list(value)
    # strings that spell a number (yaml reads "1e-3" as str)
    if isinstance(value, str):
        for t in allowed:
            try:
                if t is float:
                    return float(value)
                if t is int:
                    return int(value)
            except ValueError:
                pass
    names = ["null" if t is type(None) else getattr(t, "__name__", str(t)) for t in allowed]
    raise ConfigError(f"config key '{key}' expects {' or '.join(names)}, got {value!r}")


def _set(cfg: RunConfig, key: str, value: Any) -> None:
    value = _coerce(key, value)
    if "." in key:
        sec, leaf = key.split(".", 1)
        setattr(getattr(cfg, sec), leaf, value)
    else:
        setattr(cfg, key, value)


def _get(cfg: RunConfig, key: str) -> Any:
    obj = cfg
    for part in key.split("."):
        obj = getattr(obj, part)
    return obj


def _flatten(d: dict, prefix: str = "") -> list[tuple[str, Any]]:
    out = []
    for k, v in d.items():
        full = f"{prefix}{k}"
        if (v is None or isinstance(v, dict)) and full in _section_types():  # None: its keys commented out
            out.extend(_flatten(v or {}, full + "."))
        else:
            out.append((full, v))
    return out


def parse_overrides(argv: list[str]) -> list[tuple[str, Any]]:
    """``--a.b 1 --flag --c x`` -> [("a.b", 1), ("flag", True), ("c", "x")]; ``--resume [PATH]`` too."""
    return [("checkpoint.resume" if key == "resume" else key, True if raw is None else _override_value(raw))
            for key, raw in _override_texts(argv)]


_CONFIG_OPTIONS = ("-c", "--config", "--config-file", "--config_file", "--cfg")  # no options of orthros train


def _override_texts(argv: list[str], config: Optional[str] = None) -> list[tuple[str, Optional[str]]]:
    """``--a.b 1 --flag`` -> [("a.b", "1"), ("flag", None)]: each key with its value as typed;
    ``config``: the config file given before them, if any (for the error on a second one)."""
    out, i = [], 0
    while i < len(argv):
        tok = argv[i]
        if tok.split("=", 1)[0] in _CONFIG_OPTIONS:  # other trainers' spelling: "unknown config key 'config'"
            raise ConfigError(f"{tok.split('=', 1)[0]}: the config file is given by itself, first: "
                              f"orthros train CONFIG.yaml [--key value ...]")
        if not tok.startswith("--") or tok == "--":
            where = ""
            if tok.endswith((".yaml", ".yml")):
                where = (f" (one config file only: {config} is the config; set another's keys as overrides)"
                         if config is not None else
                         " (a config file comes first: orthros train CONFIG.yaml [--key value ...])")
            elif re.fullmatch(r"-[A-Za-z_][\w.-]*(=.*)?", tok):  # -max_steps: one dash
                where = f" (an override takes two dashes: -{tok})"
            elif out and out[-1][1] is not None and tok != "--":  # --data.train a.txt b.txt
                prev, value = out[-1]
                try:
                    several = list in _allowed_types(resolve_key(prev))
                except ConfigError:
                    several = False
                where = " (an override takes one value" + (
                    f"; several are a list: --{prev} '[{value}, {tok}]')" if several else ")")
            raise ConfigError(f"expected an override '--key value', got {tok!r}{where}")
        key = tok[2:]
        if "=" in key:
            key, raw = key.split("=", 1)
            i += 1
        elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            raw = argv[i + 1]
            i += 2
        else:
            raw = None  # a bare --flag: true
            i += 1
        out.append((key, raw))  # (--resume: resolve_key's unique leaf, checkpoint.resume)
    return out


def _override_value(raw: str) -> Any:
    """An override's value as YAML reads it (numbers, true/false, null, lists), or its text where
    YAML would not keep it: '*.jsonl' (an alias to YAML), '@x', 'run #2' (' #2' a comment)."""
    if not raw.strip():  # YAML's null: '' or ' ' is no value given (refused as such), not "none"
        return raw
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw
    if isinstance(value, str) and "#" in raw and not raw.lstrip().startswith(("'", '"')):
        return raw
    return value


class _KeySetTwice(Exception):
    pass


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.safe_load``, refusing a key set twice in one mapping (YAML keeps the last without a
    word: a second ``optim:`` section dropped the whole first one)."""

    def construct_mapping(self, node, deep=False):
        first = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # '<<: *defaults': YAML's own override rule
                continue
            key, line = self.construct_object(key_node, deep=deep), key_node.start_mark.line + 1
            if not isinstance(key, str):  # not a config key: refused as such once loaded
                continue
            if key in first:
                raise _KeySetTwice(f"'{key}' is set twice (lines {first[key]} and {line}); YAML would keep "
                                   f"the second only: keep one")
            first[key] = line
        return super().construct_mapping(node, deep=deep)


def _yaml_error_text(e: yaml.YAMLError) -> str:
    """PyYAML's error on one line, at the line and column of the file (its own text runs over several
    lines and names '<unicode string>')."""
    mark = getattr(e, "problem_mark", None)
    if mark is None or not getattr(e, "problem", None):
        return ": " + " ".join(str(e).split())
    where = f" at line {mark.line + 1}, column {mark.column + 1}: "
    context, cm = getattr(e, "context", None), getattr(e, "context_mark", None)
    if context == "while scanning for the next token":  # says nothing the problem does not
        context = None
    if context and cm is not None and (cm.line, cm.column) != (mark.line, mark.column):
        context = f"{context} (line {cm.line + 1}, column {cm.column + 1})"
    text = ", ".join(t for t in (context, e.problem) if t)
    return where + text + (" (indent with spaces: YAML takes no tabs)" if "'\\t'" in e.problem else "")


def load_config(path: Optional[str] = None, overrides: Optional[list[str]] = None) -> RunConfig:
    """Load a YAML config (or the defaults), apply overrides, validate. Raises ConfigError."""
    cfg = RunConfig()
    set_by: dict[str, str] = {}  # key -> what set it: the YAML file, or the override as typed
    if path is not None:
        p = Path(path)
        if p.is_dir():
            raise ConfigError(f"config file {path} is a directory, not a YAML file")
        if not p.is_file():
            raise ConfigError(f"config file not found: {path}" + (
                " (the shipped configs/ folder is in the repository's root: run from there, or give its full path)"
                if Path(path).parts[:1] == ("configs",) else ""))
        try:
            raw = yaml.load(p.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader) or {}
        except UnicodeDecodeError as e:
            raise ConfigError(f"config file {path} is not UTF-8 text (byte {e.start}): a YAML file is needed") from None
        except OSError as e:
            raise ConfigError(f"config file {path} cannot be read: {e.strerror or e}") from None
        except _KeySetTwice as e:
            raise ConfigError(f"config file {path}: {e}") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"config file {path} is not valid YAML{_yaml_error_text(e)}") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"config file {path} must hold a mapping at the top level")
        for key, value in _flatten(raw):
            set_by[key] = f"config file {path}"
            if key not in valid_keys():
                if key in _section_types():
                    first = dataclasses.fields(_section_types()[key])[0].name
                    raise ConfigError(f"config file {path}: section '{key}' must be a mapping of its keys "
                                      f"({key}.{first}: ..., see `orthros train --help-config`), got {value!r}")
                if isinstance(value, dict) and "." not in key:  # 'trian:' was matched by its leaf: data.train
                    near = difflib.get_close_matches(key, list(_section_types()), n=1, cutoff=0.6)
                    hint = f"; did you mean '{near[0]}'?" if near else ""
                    raise ConfigError(f"unknown config section '{key}'{hint} (sections: {list(_section_types())})")
                raise _unknown(key)
            try:
                _set(cfg, key, value)
            except ConfigError as e:
                raise ConfigError(f"config file {path}: {e}") from None
    given: dict[str, str] = {}  # key -> the override that set it, as typed
    for typed, raw in _override_texts(list(overrides or []), path):
        key = resolve_key(typed)
        shown = f"--{typed}" if raw is None else f"--{typed} {shlex.quote(raw)}"
        if key in given:  # the last would win without a word (--max-steps 5 --max-steps 7 trained 7 steps)
            raise ConfigError(f"{key} is set twice, by {given[key]} and by {shown}: give it once")
        given[key] = set_by[key] = shown
        value = True if raw is None else _override_value(raw)
        try:
            try:
                _set(cfg, key, value)
            except ConfigError:  # '001', 'yes' for a key of text: YAML's number / boolean, the text as typed
                if raw is None or not isinstance(value, (bool, int, float)) or str not in _allowed_types(key):
                    raise
                _set(cfg, key, raw)
        except ConfigError as e:  # the option as typed (--max-steps, --lr), then the key it sets
            if raw is None:
                raise ConfigError(f"--{typed}: {e} (an override with no value after it, as --{typed} alone, is "
                                  f"true: give it one)") from None
            raise ConfigError(f"--{typed} {shlex.quote(raw)}: {e}") from None
    _expand_home(cfg)
    try:
        validate(cfg)
    except ConfigError as e:  # the option as typed that set the key it names first; a YAML value out of range
        first = re.match(r"([\w.]+)(\[\d+\])?( must )?", str(e))  # or of its choices (that key alone): the file
        if first and (first.group(1) in given or (first.group(3) and first.group(1) in set_by)):
            raise ConfigError(f"{set_by[first.group(1)]}: {e}") from None
        raise
    return cfg


def _expand_home(cfg: RunConfig) -> None:
    for key in PATH_KEYS:  # '~/runs' in a YAML file (a shell expands it on the command line only)
        value = _get(cfg, key)
        if isinstance(value, str) and value.startswith("~"):
            try:  # os.path.expanduser kept ~NAME of no user as typed: a folder '~NAME' in the working directory
                _set(cfg, key, str(expand_path(value, key)))
            except ValueError as e:
                raise ConfigError(str(e)) from None


def check_config(cfg: RunConfig) -> RunConfig:
    """The checks :func:`load_config` makes, for a :class:`RunConfig` built or changed in Python
    (``train(cfg)``): every key's type (a ``pathlib.Path`` for a path key becomes its text, an int for
    a float key a float), ``~``, and :func:`validate`. A :class:`ConfigError` names the key."""
    if not isinstance(cfg, RunConfig):
        raise ConfigError(f"a RunConfig is needed (orthros.training.load_config), got {type(cfg).__name__}")
    for sec in _section_types():
        if not isinstance(getattr(cfg, sec), _section_types()[sec]):
            raise ConfigError(f"config section '{sec}' must be a {_section_types()[sec].__name__}, got "
                              f"{type(getattr(cfg, sec)).__name__}")
    for key in valid_keys():
        value = _get(cfg, key)
        if isinstance(value, os.PathLike):
            value = os.fspath(value)
        elif isinstance(value, (list, tuple)):
            value = [os.fspath(v) if isinstance(v, os.PathLike) else v for v in value]
        _set(cfg, key, value)
    _expand_home(cfg)
    validate(cfg)
    return cfg


def _check_head_dim(m: ModelSection) -> None:
    """The head size a fresh model gets, in the keys that make it: ``model.head_dim``, or (null)
    ``model.hidden_size / model.num_attention_heads``, which must divide and be even (RoPE rotates
    pairs of dimensions). The model's own check names only ``head_dim``, a key the user may never have
    set. A model.init_from checkpoint has its own shape (its keys are compared with it when it loads)."""
    def size(v):
        return isinstance(v, int) and not isinstance(v, bool) and v >= 1

    if m.init_from or not (size(m.hidden_size) and size(m.num_attention_heads)):
        return  # (a size out of range: the model's checks name it)
    if m.head_dim is None:
        d, heads = m.hidden_size, m.num_attention_heads
        if d % heads:
            raise ConfigError(f"model.hidden_size ({d}) must be a multiple of model.num_attention_heads ({heads}): "
                              f"model.head_dim is null, so each head gets hidden_size / num_attention_heads "
                              f"dimensions; change one of them, or set model.head_dim")
        if (d // heads) % 2:
            raise ConfigError(f"model.hidden_size / model.num_attention_heads (the head size, model.head_dim being "
                              f"null) must be even for RoPE (it rotates pairs of dimensions), got {d} / {heads} = "
                              f"{d // heads}")
    elif size(m.head_dim) and m.head_dim % 2:
        raise ConfigError(f"model.head_dim must be even for RoPE (it rotates pairs of dimensions), got {m.head_dim}")


LINEAR_KEYS = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
               "linear_conv_kernel_dim")  # the Gated DeltaNet layers' sizes


def linear_key_set(m: ModelSection) -> Optional[str]:
    """The first ``model.linear_*`` key set away from its default (where a model has no GDN layer to
    size, it is refused), else ``None``."""
    unset = ModelSection()
    return next((k for k in LINEAR_KEYS if getattr(m, k) != getattr(unset, k)), None)


# model.* keys that are fields of the same name in the model's config (OrthrosConfig); rope_theta is its
# rope_parameters['rope_theta']
_MODEL_FIELDS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                 "head_dim", "window_size", "max_position_embeddings", "tie_word_embeddings", "qk_norm", "scale_offset",
                 "attn_backend", "initializer_range", *LINEAR_KEYS)
_MODEL_FIELD_RE = re.compile(r"OrthrosConfig\.rope_parameters\['rope_theta'\]|(?:OrthrosConfig\.|(?<![\w.'\"]))"
                             rf"({'|'.join(_MODEL_FIELDS)})(?![\w'\"])")


def model_config_error(e: ValueError) -> ConfigError:
    """A ``ValueError`` of the model's config (its own checks, run on the ``model.*`` keys) as a
    :class:`ConfigError` naming the training keys: ``OrthrosConfig.hidden_size`` is
    ``model.hidden_size``, ``OrthrosConfig.rope_parameters['rope_theta']`` ``model.rope_theta``.
    A field no ``model.*`` key sets (``vocab_size``, from the tokenizer) keeps its name after
    ``model: ``."""
    msg = str(e)
    named = _MODEL_FIELD_RE.sub(lambda m: f"model.{m.group(1) or 'rope_theta'}", msg)
    if named.startswith("model."):
        return ConfigError(named)
    return ConfigError(f"model: {named}")


def validate(cfg: RunConfig) -> None:
    def choice(key, val, allowed):
        if val not in allowed:
            raise ConfigError(f"{key} must be one of {list(allowed)}, got {val!r}")

    def positive(key, val, zero_ok=False):
        if val is None or val < 0 or (val == 0 and not zero_ok):
            raise ConfigError(f"{key} must be {'>= 0' if zero_ok else '> 0'}, got {val!r}")

    for key in valid_keys():  # nan passes every comparison below; inf is no setting (grad_clip: no clipping)
        v = _get(cfg, key)
        if isinstance(v, float) and (math.isnan(v) or (math.isinf(v) and key != "optim.grad_clip")):
            raise ConfigError(f"{key} must be a finite number, got {v!r}")
    if not 0 <= cfg.seed < 2 ** 64:  # numpy's shuffle and torch.manual_seed take these
        raise ConfigError(f"seed must be an integer in [0, 2**64 - 1], got {cfg.seed!r}")
    choice("mode", cfg.mode, MODES)
    choice("model.architecture", cfg.model.architecture, ARCHITECTURES)
    kind = HYBRID_ALIASES.get(cfg.model.architecture)
    every = HYBRID_KINDS[kind][1] if kind else None  # gdn: no attention layer, at least one layer
    if kind and cfg.model.num_hidden_layers < (every or 1) and not cfg.model.init_from:  # else the checkpoint's
        raise ConfigError(f"model.num_hidden_layers must be >= {every or 1} for model.architecture "
                          f"{cfg.model.architecture!r}" + (f" (an attention layer every {every}th layer)" if every else "")
                          + f", got {cfg.model.num_hidden_layers}")
    key = linear_key_set(cfg.model)
    if key and not kind and not cfg.model.init_from:  # (a checkpoint's GDN layers, if any, are compared with them)
        raise ConfigError(f"model.{key} sizes the Gated DeltaNet layers of model.architecture "
                          f"{[a for a in ARCHITECTURES if a in HYBRID_ALIASES]}; {cfg.model.architecture!r} has none: "
                          f"drop model.{key}, or choose a hybrid architecture")
    _check_head_dim(cfg.model)
    choice("train.precision", cfg.train.precision, PRECISIONS)
    choice("optim.schedule", cfg.optim.schedule, SCHEDULES)
    choice("data.format", cfg.data.format, FORMATS)
    choice("data.text_sample_by", cfg.data.text_sample_by, SAMPLE_BY)
    choice("train.device", cfg.train.device, ("auto", "cpu", "cuda"))
    for key in ("data.seq_len", "train.max_steps", "train.micro_batch_size", "train.grad_accum",
                "data.encode_batch", "train.log_every", "checkpoint.keep_last", "data.shuffle_buffer"):
        sec, leaf = key.split(".")
        positive(key, getattr(getattr(cfg, sec), leaf))
    for key in ("train.eval_every", "checkpoint.every", "optim.warmup_steps", "optim.weight_decay",
                "optim.grad_clip", "data.eval_sequences"):
        sec, leaf = key.split(".")
        positive(key, getattr(getattr(cfg, sec), leaf), zero_ok=True)
    if cfg.data.seq_len < 2:
        raise ConfigError(f"data.seq_len must be >= 2 (a row of one token predicts nothing), got {cfg.data.seq_len}")
    positive("optim.lr", cfg.optim.lr)
    positive("optim.scale_offset_lr_mult", cfg.optim.scale_offset_lr_mult)
    if not cfg.optim.eps > 0:  # 0: 0/0, so nan weights, where a gradient is still zero (an unseen token's row)
        raise ConfigError(f"optim.eps must be > 0 (AdamW divides by sqrt(v) + eps, 0/0 for a parameter whose "
                          f"gradient is still zero), got {cfg.optim.eps!r}")
    positive("model.initializer_range", cfg.model.initializer_range, zero_ok=True)
    for key in ("optim.beta1", "optim.beta2"):  # AdamW's range
        if not 0.0 <= _get(cfg, key) < 1.0:
            raise ConfigError(f"{key} must be in [0, 1), got {_get(cfg, key)!r}")
    if cfg.train.threads is not None and cfg.train.threads < 0:
        raise ConfigError(f"train.threads must be >= 1 (or null / 0: torch's default), got {cfg.train.threads!r}")
    if cfg.train.peak_tflops is not None and cfg.train.peak_tflops < 0:
        raise ConfigError(f"train.peak_tflops must be > 0 (or null / 0: auto-detected), got {cfg.train.peak_tflops!r}")
    if cfg.checkpoint.resume == "":
        raise ConfigError("checkpoint.resume must be auto, true, false or a checkpoint directory, got ''")
    rp = cfg.data.repeat_passage
    if rp:
        most = (cfg.data.seq_len - 1) // 2
        if cfg.mode == "sft":
            raise ConfigError("data.repeat_passage applies to modes ['pt', 'cpt'] (plain text); "
                              "set it to 0 for mode 'sft'")
        if not 1 <= rp <= most:
            raise ConfigError(f"data.repeat_passage must be 0 (off) or a passage length N in tokens with "
                              f"2*N+1 <= data.seq_len ({cfg.data.seq_len}), i.e. 1..{most}, got {rp!r}")
    if not 0.0 <= cfg.optim.min_lr_ratio <= 1.0:
        raise ConfigError(f"optim.min_lr_ratio must be in [0, 1], got {cfg.optim.min_lr_ratio}")
    # keys of one mode or schedule only, set away from their default where they would do nothing
    # (a key left at its default is never refused: run_config.yaml, every key, may be fed back)
    unset = RunConfig()
    if cfg.optim.schedule == "constant" and cfg.optim.min_lr_ratio != unset.optim.min_lr_ratio:
        raise ConfigError(f"optim.min_lr_ratio ({cfg.optim.min_lr_ratio:g}) is where schedules "
                          f"['cosine', 'linear'] end; optim.schedule 'constant' stays at the peak lr: drop "
                          f"optim.min_lr_ratio, or choose another schedule")
    if cfg.optim.warmup_steps != unset.optim.warmup_steps and (note := warmup_note(cfg)):
        raise ConfigError(f"{note} (0: no warm-up), or raise train.max_steps")
    field_of = {"data.text_field": ("pt", "cpt"), "data.messages_field": ("sft",)}
    for key, modes in field_of.items():
        if cfg.mode not in modes and _get(cfg, key) != _get(unset, key):
            raise ConfigError(f"{key} ({_get(cfg, key)!r}) applies to mode{'s' if len(modes) > 1 else ''} "
                              f"{list(modes)}; mode {cfg.mode!r} reads "
                              f"{'data.messages_field' if cfg.mode == 'sft' else 'data.text_field'}: drop {key}")
    if cfg.mode == "cpt" and not cfg.model.init_from:
        raise ConfigError("mode 'cpt' continues pre-training from a checkpoint: set model.init_from "
                          "to an Orthros (or converted) checkpoint directory")
    names = {"output_dir": "a directory", "model.init_from": "a checkpoint directory or hub model (null: none)",
             "data.tokenizer": "'embedded', a tokenizer directory or hub name", "data.train": "a dataset",
             "data.eval": "a dataset (null: no eval)"}
    for key in ("data.train", "data.eval"):  # [a.jsonl, 5]: 5 was read as the file '5'
        v = _get(cfg, key)
        for i, item in enumerate(v if isinstance(v, list) else []):
            if not isinstance(item, str):
                raise ConfigError(f"{key}[{i}] must be text (a file, folder, glob or hub dataset), got {item!r}")
    for key, what in names.items():  # '' or ' ': an unset shell variable ('' init_from trained from scratch)
        v = _get(cfg, key)
        for item in (v if isinstance(v, list) else [v]):
            if isinstance(item, str) and not item.strip():
                raise ConfigError(f"{key} is {item!r}: name {what}")
    if not cfg.data.train:  # '' or []
        raise ConfigError(f"data.train must name a dataset, got {cfg.data.train!r}")
    if cfg.data.eval is not None and not cfg.data.eval:
        raise ConfigError(f"data.eval must name a dataset (or be null: no eval), got {cfg.data.eval!r}")


def warmup_note(cfg: RunConfig) -> Optional[str]:
    """Why the run never trains at ``optim.lr``: its warm-up is longer than the run (refused when
    ``optim.warmup_steps`` is set away from its default; the default on a short run is said at its
    start and in its dry run), or None."""
    w, n = cfg.optim.warmup_steps, cfg.train.max_steps
    if w <= n:
        return None
    return (f"optim.warmup_steps ({w}) is more than train.max_steps ({n}): the run ends inside its warm-up, its "
            f"last step at {n / w:.0%} of optim.lr ({cfg.optim.lr:g}); set optim.warmup_steps to at most {n}")


def dump_yaml(cfg: RunConfig) -> str:
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False)


def describe_keys() -> str:
    """Every key with its default and what it means, for ``--help-config``: the comments on and
    above each field of the dataclasses above are the keys' documentation."""
    d = RunConfig().to_dict()
    notes = _field_comments()
    rows = []
    for k in valid_keys():
        v = d
        for part in k.split("."):
            v = v[part]
        rows.append((f"  {k} = {v!r}", notes.get(k, "")))
    width = max(len(r) for r, _ in rows)
    return "\n".join(f"{r:<{width}}  # {n}" if n else r for r, n in rows)


def _field_comments() -> dict[str, str]:
    """key -> the comment block above its field and the comment on its line, from this file."""
    import ast
    import io
    import tokenize

    source = Path(__file__).read_text(encoding="utf-8")
    comments = {tok.start[0]: tok.string.lstrip("# ").rstrip()
                for tok in tokenize.generate_tokens(io.StringIO(source).readline) if tok.type == tokenize.COMMENT}
    section_of = {cls.__name__: name for name, cls in _section_types().items()}
    lines = source.splitlines()
    out = {}
    for node in ast.parse(source).body:
        if not (isinstance(node, ast.ClassDef) and (node.name in section_of or node.name == "RunConfig")):
            continue
        prefix = f"{section_of[node.name]}." if node.name in section_of else ""
        for item in node.body:
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                above, n = [], item.lineno - 1
                while n >= 1 and lines[n - 1].lstrip().startswith("#"):
                    above.insert(0, comments[n])
                    n -= 1
                text = " ".join(above + ([comments[item.lineno]] if item.lineno in comments else []))
                if text:
                    out[prefix + item.target.id] = text
    return out

"""One training loop for pre-training (pt), supervised fine-tuning (sft) and continual
pre-training (cpt), on one CPU/GPU or many (FSDP2 via torchrun; gloo works on CPU).

Entry point: :func:`train` (``orthros train CONFIG.yaml`` and ``python -m orthros.train``).
All checks (config, output dir, tokenizer, data, sequence length, checkpoint) run before the
first step. Loss is the mean cross-entropy over every scored token of the global batch,
identical for any split of that batch into processes x accumulation steps.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import random
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from ..layout import LOSS_PLOT, METRICS
from ..utils import Progress, check_output_path, write_text
from . import checkpoint as ckpt
from .config import (ARCH_TO_ATTENTION_MODE, LINEAR_KEYS, ConfigError, RunConfig, _flatten, _get, check_config,
                     dump_yaml, linear_key_set, model_config_error, warmup_note)
from .data import DataError, PackedBatch, build_stream, collate, count_targets, eval_rows
from .hub import HUB_ID, check_hub_name
from .metrics import MetricsLogger, detect_peak_flops, train_flops
from .optim import build_optimizer, build_scheduler


# --------------------------------------------------------------------------- distributed


LAUNCH = "several processes are started by torchrun --nproc-per-node N -m orthros.train ..., which sets them"


def _env_int(name: str, default: int, low: int) -> int:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = low - 1
    if value < low:
        raise ConfigError(f"environment variable {name} is {raw!r}: not an integer >= {low} ({LAUNCH})")
    return value


class Dist:
    def __init__(self):
        """torchrun's WORLD_SIZE, RANK, LOCAL_RANK, checked (set by hand or left over, they were read
        as they came: a RANK past WORLD_SIZE trained on no rows)."""
        self.world = _env_int("WORLD_SIZE", 1, 1)
        missing = [k for k in ("RANK", "MASTER_ADDR", "MASTER_PORT") if self.world > 1 and not os.environ.get(k)]
        if missing:
            raise ConfigError(f"environment variable WORLD_SIZE is {self.world} but {', '.join(missing)} "
                              f"{'is' if len(missing) == 1 else 'are'} not set ({LAUNCH})")
        self.rank = _env_int("RANK", 0, 0)
        if self.rank >= self.world:
            raise ConfigError(f"environment variable RANK is {self.rank}, outside [0, WORLD_SIZE = {self.world}) "
                              f"({LAUNCH})")
        self.local_rank = _env_int("LOCAL_RANK", 0, 0)
        self.enabled = self.world > 1
        self.comm_device = torch.device("cpu")

    def init(self, device: torch.device) -> None:
        if self.enabled and not torch.distributed.is_initialized():
            backend = "nccl" if device.type == "cuda" else "gloo"
            torch.distributed.init_process_group(backend=backend, device_id=device if device.type == "cuda" else None)
        # NCCL reduces device tensors only; gloo takes CPU tensors
        self.comm_device = device if self.enabled and device.type == "cuda" else torch.device("cpu")

    @property
    def main(self) -> bool:
        return self.rank == 0

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        """Sum of ``t`` over processes, on ``t``'s device (moved through the backend's device)."""
        if self.enabled:
            x = t.to(self.comm_device)
            torch.distributed.all_reduce(x)
            t = x.to(t.device)
        return t

    def barrier(self) -> None:
        if self.enabled:
            torch.distributed.barrier()

    def gather_object(self, obj):
        if not self.enabled:
            return [obj]
        out = [None] * self.world
        torch.distributed.all_gather_object(out, obj)
        return out

    def close(self) -> None:
        if self.enabled and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def _device(cfg: RunConfig, dist: Dist) -> torch.device:
    want = cfg.train.device
    if want == "auto":
        want = "cuda" if torch.cuda.is_available() else "cpu"
    if want == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError("train.device is 'cuda' but no CUDA device is available")
        torch.cuda.set_device(dist.local_rank)
        return torch.device("cuda", dist.local_rank)
    return torch.device("cpu")


# --------------------------------------------------------------------------- checks


def check_output_dir(path: str) -> None:
    """Refuse an output_dir that cannot be written, without creating it (a run refused later,
    e.g. for bad data, must leave nothing behind; :meth:`Trainer.run` creates it)."""
    p = Path(path).absolute()
    probe_dir = p
    while not probe_dir.exists() and probe_dir != probe_dir.parent:
        probe_dir = probe_dir.parent
    if not probe_dir.is_dir():
        raise ConfigError(f"output_dir {path!r} is not writable: {str(probe_dir)!r} is not a directory")
    try:
        fd, probe = tempfile.mkstemp(prefix=".orthros-write-test-", dir=probe_dir)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise ConfigError(f"output_dir {path!r} is not writable: {e.strerror or e}") from None


LOCK = ".orthros-train.lock"  # in output_dir: an flock held by the run that writes there


def _lock_holder(fh) -> str:
    fh.seek(0)
    pid = fh.read().strip()
    return f" (process {pid})" if pid.isdigit() else ""


def _in_use(output_dir: str, holder: str) -> ConfigError:
    return ConfigError(f"output_dir {output_dir!r} is in use by another training run{holder}: two runs in one "
                       f"output_dir delete each other's checkpoint saves and mix their {METRICS}. Wait for it "
                       f"to end (or stop it: its checkpoints stay, --resume goes on), or choose another output_dir")


def check_output_dir_free(path: str) -> None:
    """Refuse an output_dir whose lock another live run holds (writes nothing: a dir without the lock
    file holds no run; a run that died, even by kill -9, released its lock)."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock
        return
    try:
        fh = open(Path(path) / LOCK, encoding="utf-8")
    except OSError:
        return
    with fh:
        try:
            # shared: preflights at once (a torchrun's ranks resuming, a --dry-run beside a starting run) do not
            # take each other for a run; a run's exclusive lock still blocks it. Released when fh closes
            fcntl.flock(fh, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            raise _in_use(path, _lock_holder(fh)) from None
        except OSError:  # a file system without flock
            return


def lock_output_dir(path: str):
    """Take output_dir's lock for this run (an exclusive flock, released when the returned file is
    closed or the process ends, however it ends); :class:`ConfigError` when another run holds it."""
    try:
        import fcntl
    except ImportError:
        return None
    fh = open(Path(path) / LOCK, "a+", encoding="utf-8")
    for attempt in range(20):  # check_output_dir_free (another run's preflight) holds it for a moment
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if attempt == 19:
                holder = _lock_holder(fh)
                fh.close()
                raise _in_use(path, holder) from None
            time.sleep(0.05)
        except OSError:  # a file system without flock
            return fh
    fh.seek(0)
    fh.truncate()
    fh.write(f"{os.getpid()}\n")
    fh.flush()
    return fh


def _glob_reaches(pattern: Path, target: Path) -> bool:
    """Whether the glob ``pattern`` (absolute) may match a path at or under ``target`` (absolute)."""
    import fnmatch

    pat, tgt = pattern.parts, target.parts
    for p, t in zip(pat, tgt):
        if "**" in p:
            return True
        if p != t and not (any(c in p for c in "*?[") and fnmatch.fnmatchcase(t, p)):
            return False
    return len(pat) > len(tgt)  # matches at target's depth: target itself, a directory, is not read as data


def check_data_outside_output_dir(cfg: RunConfig) -> None:
    """Refuse ``data.train`` / ``data.eval`` paths that overlap ``output_dir``: a data folder (or glob)
    that holds it would read the run's own files (metrics.jsonl, the checkpoints' JSON) as data once
    they exist (a resume then trained on other data, or failed on its config.json); data inside
    ``output_dir`` is among the files the run writes and prunes."""
    out = Path(os.path.realpath(os.path.expanduser(cfg.output_dir)))
    for key in ("data.train", "data.eval"):
        spec = _get(cfg, key)
        for s in (spec if isinstance(spec, (list, tuple)) else [spec]):
            if s is None or s == "embedded":
                continue
            text = os.path.expanduser(str(s))
            pattern = any(c in text for c in "*?[")
            if pattern:  # the folders before its first wildcard, and whether the rest may reach output_dir
                parts = Path(os.path.abspath(text)).parts
                fixed = next(i for i, part in enumerate(parts) if any(c in part for c in "*?["))
                root = Path(os.path.realpath(Path(*parts[:fixed])))
                reaches = _glob_reaches(root.joinpath(*parts[fixed:]), out)
            elif os.path.exists(text):
                root = Path(os.path.realpath(text))
                reaches = root.is_dir()  # a folder is read with its subfolders
            else:  # a hub name, or a path the data checks report missing
                continue
            if out == root and not pattern:
                where = f"is {key} {str(s)!r}"
            elif root.is_relative_to(out):
                where = f"holds {key} {str(s)!r}"
            elif out.is_relative_to(root) and reaches:
                where = f"is inside {key} {str(s)!r}"
            else:
                continue
            raise ConfigError(f"output_dir {cfg.output_dir!r} {where}: the run would read its own files "
                              f"({METRICS}, its checkpoints) as data, or write among the data; choose an "
                              f"output_dir outside the data, and data outside output_dir")


def resolve_resume(cfg: RunConfig) -> Optional[Path]:
    r = cfg.checkpoint.resume
    if isinstance(r, str) and r.lower() in ("true", "yes", "latest"):
        r = True
    if isinstance(r, str) and r.lower() in ("false", "no", "none"):
        r = False
    existing = ckpt.latest_checkpoint(cfg.output_dir)
    if existing is None and r in (True, "auto", False) and ckpt.list_checkpoints(cfg.output_dir):
        # checkpoint folders, none of them complete: not a fresh start (it would overwrite them), nor a resume (with
        # resume false it said "pass --resume to continue the run", which then refused)
        root = ckpt.ckpt_root(cfg.output_dir)
        raise ConfigError(f"{'--resume' if r is True else f'output_dir {cfg.output_dir!r}'}: no complete checkpoint "
                          f"under {root}: {_incomplete_note(cfg.output_dir)}. Start a fresh run in another "
                          f"output_dir, or move those folders out of {root}")
    if r is False:
        if ckpt.list_checkpoints(cfg.output_dir):
            raise ConfigError(f"output_dir {cfg.output_dir!r} already holds checkpoints; pass --resume to continue "
                              f"the run, or choose another output_dir")
        return None
    if r == "auto":
        return existing
    if r is True:
        if existing is None:  # (none at all: a complete-less one was refused above)
            where = (f"output_dir {cfg.output_dir!r} does not exist" if not Path(cfg.output_dir).exists() else
                     f"no checkpoint under {ckpt.ckpt_root(cfg.output_dir)} (none was saved there)")
            raise ConfigError(f"--resume: {where}, so there is no run to resume; drop --resume to start a fresh run "
                              f"there, or give the output_dir of the run to resume")
        return existing
    p = Path(r)
    if not p.is_dir():
        raise ConfigError(f"checkpoint.resume: {r!r} is not a directory")
    refuse_run_dir("checkpoint.resume", r)
    if (p / "config.json").is_file() and not (p / ckpt.MANIFEST).is_file() and not (p / TRAINER_STATE).is_file() \
            and not (ckpt.CKPT_RE.match(p.name) or p.name.startswith(".tmp-")):  # else a save cut short
        raise ConfigError(f"checkpoint.resume: {r!r} is a model directory, not a checkpoint of a training run (it has "
                          f"no {TRAINER_STATE} or {ckpt.MANIFEST}); to train from its weights, start a run with "
                          f"--model.init_from {r} (--mode cpt to continue pre-training)")
    return p


def _incomplete_note(output_dir: str, after: int = -1) -> str:
    """What the checkpoint folders of ``output_dir`` after step ``after`` that lack a manifest are."""
    bad = [p.name for p in ckpt.list_checkpoints(output_dir)
           if int(ckpt.CKPT_RE.match(p.name)[1]) > after and not (p / ckpt.MANIFEST).is_file()]
    return (f"{', '.join(bad)} {'has' if len(bad) == 1 else 'have'} no {ckpt.MANIFEST} (incomplete or damaged: a "
            f"save cut short, or files removed since), so {'it is' if len(bad) == 1 else 'they are'} not loaded")


def _older_checkpoint_hint(cfg: RunConfig, bad: Path) -> str:
    """Where a run whose own checkpoint ``bad`` is damaged can go on from: its newest complete one
    before it, once ``bad`` is moved away (a later checkpoint left there is refused, and taken as
    the latest by ``--resume``), or that none is older (start afresh elsewhere); '' when ``bad`` is not of
    ``output_dir``."""
    root = ckpt.ckpt_root(cfg.output_dir)
    if os.path.realpath(Path(bad).parent) != os.path.realpath(root):
        return ""
    older = [p for p in ckpt.list_checkpoints(cfg.output_dir) if p.name < Path(bad).name and (p / ckpt.MANIFEST).is_file()]
    return (f". To go on from the checkpoint before it ({older[-1]}), move {bad} (and any later one) out of {root}"
            if older else f". No complete checkpoint comes before it: start a fresh run in another output_dir")


def refuse_run_dir(key: str, path: str) -> None:
    """A :class:`ConfigError` naming ``key`` when ``path`` is a training run's output_dir (or its
    ``checkpoints`` folder) where one checkpoint directory is needed."""
    p = Path(path)
    run = p.parent if p.name == ckpt.ckpt_root("").name else p
    if p.is_dir() and not (p / ckpt.MANIFEST).is_file() and not (p / "config.json").is_file() \
            and ckpt.list_checkpoints(str(run)):
        latest = ckpt.latest_checkpoint(str(run))
        raise ConfigError(f"{key}: {str(path)!r} is not a checkpoint but holds a training run's checkpoints: name "
                          f"one of them" + (f" (the latest: {latest})" if latest else ""))


def refuse_file(key: str, path: str, need: str) -> None:
    """A :class:`ConfigError` naming ``key`` when ``path`` is a file where a ``need`` (a directory) is
    needed: it is no missing path, nor a hub name."""
    p = Path(path).expanduser()
    if p.exists() and not p.is_dir():
        raise ConfigError(f"{key}: {path!r} is a file, not a {need} (the folder that holds it: {p.parent})")


def load_tokenizer(cfg: RunConfig):
    from ..data import load_tokenizer as _load

    name, key = cfg.data.tokenizer, "data.tokenizer"
    init = cfg.model.init_from
    if name == "embedded" and init:
        p = Path(init).expanduser()
        if (p / "tokenizer_config.json").is_file() or (not p.exists() and HUB_ID.fullmatch(init)):
            # a checkpoint's own tokenizer, local or on the hub, beats the embedded one (a converted
            # or pretrained model has its own vocabulary)
            name, key = init, "model.init_from"
    if name != "embedded" and not Path(name).expanduser().is_dir():
        refuse_file(key, name, "tokenizer directory")
        check_hub_name(key, name, "model" if key == "model.init_from" else "tokenizer")  # init_from names a model
    try:
        tok = _load(name)
    except Exception as e:  # noqa: BLE001
        raise ConfigError(f"{key}: cannot load the tokenizer {name!r}: {type(e).__name__}: {e}") from None
    if tok.eos_token_id is None and cfg.mode != "sft":
        raise ConfigError("data.tokenizer has no eos token; pre-training needs one to mark document ends")
    return tok


# --------------------------------------------------------------------------- model


def model_config_for(cfg: RunConfig, tokenizer):
    """The OrthrosConfig a fresh model gets (or the checkpoint's, for init_from)."""
    import orthros  # noqa: F401 - registers the model type
    from transformers import AutoConfig

    from ..models import OrthrosConfig

    from ..kinds import HYBRID_ALIASES, HYBRID_DISPLAY, HYBRID_KINDS, LINEAR_LAYER_TYPE, describe_layers, hybrid_layout

    m = cfg.model
    arch = m.architecture
    # the attention baselines set the mode of every layer; the hybrids (Orthros-H, Linear Hybrid, GDN)
    # a layout of GDN and attention layers
    kind = HYBRID_ALIASES.get(arch)
    mode = (HYBRID_KINDS[kind][0] or "full") if kind else ARCH_TO_ATTENTION_MODE[arch]
    if m.init_from:
        refuse_run_dir("model.init_from", m.init_from)
        if not os.path.isdir(m.init_from):
            refuse_file("model.init_from", m.init_from, "checkpoint directory")
            if not re.fullmatch(r"[\w.-]+/[\w.-]+", m.init_from):
                raise ConfigError(f"model.init_from: {m.init_from!r} is not a checkpoint directory")
            check_hub_name("model.init_from", m.init_from, "model")
        try:
            mc = AutoConfig.from_pretrained(m.init_from)
        except Exception as e:  # noqa: BLE001
            raise ConfigError(f"model.init_from: cannot read a model config from {m.init_from!r}: {e}") from None
        if getattr(mc, "model_type", None) != "orthros":
            raise ConfigError(f"model.init_from {m.init_from!r} is a {mc.model_type!r} model; convert it to Orthros "
                              f"first (the conversion tool), then continue pre-training with mode cpt")
        if os.path.isdir(m.init_from):  # its weights are there and complete (headers only): else the load
            # fails once the run has started (and --dry-run, which reads no weights, passes)
            from ..checkpoint_files import PT_WEIGHTS, check_weights

            try:
                found = check_weights(m.init_from) or [f for f in PT_WEIGHTS
                                                       if os.path.isfile(os.path.join(m.init_from, f))]
            except ValueError as e:
                raise ConfigError(f"model.init_from: {e}") from None
            if not found:
                raise ConfigError(f"model.init_from: {m.init_from!r} holds no weights (model.safetensors, "
                                  f"model.safetensors.index.json or pytorch_model.bin)")
        if kind:  # a layout of layers, which a run cannot give a checkpoint's layers: it must have it
            have = list(getattr(mc, "layer_types", None) or [])
            try:
                want = hybrid_layout(kind, mc.num_hidden_layers)["layer_types"]
            except ValueError:  # too few layers for it
                want = None
            gdn = lambda types: [t == LINEAR_LAYER_TYPE for t in types]  # noqa: E731
            if not have or want is None or gdn(want) != gdn(have):
                raise ConfigError(
                    f"model.architecture {arch!r} is a layout of layers ({HYBRID_DISPLAY[kind]}), but the checkpoint "
                    f"at model.init_from {m.init_from!r} has {describe_layers(have) if have else 'no layer_types'}; a run "
                    f"keeps a checkpoint's layers: set model.architecture to orthros, transformer or swa to choose the "
                    f"mode of its attention layers")
        _apply_model_keys(m, mc)
        mc.attention_mode = mode
        if getattr(mc, "layer_types", None):  # attention layers take the new mode: the saved config must load
            from ..kinds import with_attention_mode

            mc.layer_types = with_attention_mode(mc.layer_types, mode)
        mc.use_cache = True  # checkpoints generate with a KV cache (training passes use_cache=False)
        return mc
    layout = hybrid_layout(arch, m.num_hidden_layers) if kind else {"attention_mode": mode}
    vocab = len(tokenizer)
    vocab = (vocab + 63) // 64 * 64
    try:
        return OrthrosConfig(
            vocab_size=vocab, hidden_size=m.hidden_size, intermediate_size=m.intermediate_size,
            num_hidden_layers=m.num_hidden_layers, num_attention_heads=m.num_attention_heads,
            num_key_value_heads=m.num_key_value_heads, head_dim=m.head_dim,
            max_position_embeddings=m.max_position_embeddings,
            rope_parameters={"rope_type": "default", "rope_theta": m.rope_theta},
            tie_word_embeddings=m.tie_word_embeddings, window_size=m.window_size, scale_offset=m.scale_offset,
            qk_norm=m.qk_norm, attn_backend=m.attn_backend, **layout,
            initializer_range=m.initializer_range, **{k: getattr(m, k) for k in LINEAR_KEYS},
            bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
    except ValueError as e:
        raise model_config_error(e) from None


# model.* keys on a model.init_from checkpoint: those that fix the weights' shapes must agree with the
# checkpoint (set away from their default and unlike it, they are refused); the rest change no weight
# and, set away from their default, replace the checkpoint's value (a key left at its default keeps it)
SHAPE_KEYS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "head_dim", "tie_word_embeddings", "qk_norm", "scale_offset", *LINEAR_KEYS)
RUNTIME_KEYS = ("window_size", "max_position_embeddings", "rope_theta", "attn_backend", "initializer_range")


def _apply_model_keys(m, mc) -> None:
    defaults = type(m)()

    def have(key):
        return mc.rope_parameters.get("rope_theta") if key == "rope_theta" else getattr(mc, key, None)

    from ..kinds import LINEAR_LAYER_TYPE

    key = linear_key_set(m)
    if key and LINEAR_LAYER_TYPE not in (getattr(mc, "layer_types", None) or []):  # (its values size nothing)
        raise ConfigError(f"model.{key} sizes Gated DeltaNet layers; the checkpoint at model.init_from "
                          f"{m.init_from!r} has none: drop model.{key}")
    for key in SHAPE_KEYS:
        want, ckpt_value = getattr(m, key), have(key)
        if want != getattr(defaults, key) and want != ckpt_value:
            raise ConfigError(
                f"model.{key} is {want!r}, but the checkpoint at model.init_from {m.init_from!r} has {ckpt_value!r}; "
                f"a run keeps a checkpoint's weights, so its shape keys must agree: drop model.{key} (or set it to "
                f"{ckpt_value!r})")
    for key in RUNTIME_KEYS:
        want = getattr(m, key)
        if want != getattr(defaults, key):
            if key == "rope_theta":
                mc.rope_parameters = {**mc.rope_parameters, "rope_theta": want}
            else:
                setattr(mc, key, want)
    try:
        mc._validate()
    except ValueError as e:
        raise model_config_error(e) from None


def build_model(cfg: RunConfig, mc, resume_dir: Optional[Path]):
    import orthros  # noqa: F401
    from transformers import AutoModelForCausalLM

    from ..models import OrthrosForCausalLM

    src = resume_dir or cfg.model.init_from
    if src:
        try:
            model, info = AutoModelForCausalLM.from_pretrained(str(src), config=mc, dtype=torch.float32,
                                                               output_loading_info=True)
        except (RuntimeError, ValueError) as e:
            raise ConfigError(f"the weights in {src} do not fit the model config: {str(e).strip().splitlines()[0]}") from None
        bad = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
        if resume_dir is not None and bad:
            raise ConfigError(f"cannot resume from {resume_dir}: the weights do not fit the model config "
                              f"({'; '.join(f'{k}: {sorted(map(str, v))[:4]}' for k, v in bad.items())}); a key in "
                              f"checkpoint.allow_changes changes the weights' shapes")
    else:
        torch.manual_seed(cfg.seed)
        model = OrthrosForCausalLM(mc)
    return model


def enable_activation_checkpointing(model) -> None:
    """Recompute each decoder layer in the backward pass (newer transformers renamed the method)."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def _shard(model, dist: Dist):
    from torch.distributed.fsdp import fully_shard

    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    return model


# --------------------------------------------------------------------------- RNG


def _rng_state() -> dict:
    """This process's RNG states as tensors and plain numbers (``torch.load(weights_only=True)``)."""
    py_version, py_state, py_gauss = random.getstate()
    kind, key, pos, has_gauss, cached = np.random.get_state()
    st = {"python": [py_version, list(py_state), py_gauss],
          "numpy": {"kind": str(kind), "key": torch.from_numpy(key.astype(np.int64)), "pos": int(pos),
                    "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
          "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def _set_rng_state(st: dict) -> None:
    py_version, py_state, py_gauss = st["python"]
    random.setstate((py_version, tuple(py_state), py_gauss))
    n = st["numpy"]
    np.random.set_state((n["kind"], n["key"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"]))
    torch.set_rng_state(st["torch"])
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(st["cuda"])


# --------------------------------------------------------------------------- resuming

TRAINER_STATE = ckpt.TRAINER_STATE
STATE_FORMAT = 2  # 1: the pickled format before 2026-12-01 (numpy arrays inside), not loaded
# written by transformers or chosen at run time, never a reason to refuse a resume
RUNTIME_CONFIG_KEYS = frozenset({"transformers_version", "_name_or_path", "architectures", "dtype", "torch_dtype",
                                 "use_cache", "auto_map", "attn_backend"})


def load_trainer_state(path: Path) -> dict:
    """``trainer_state.pt`` of a checkpoint, loaded with ``weights_only=True`` (tensors and plain
    types only; nothing is unpickled that could run code)."""
    import pickle

    f = Path(path) / TRAINER_STATE
    try:
        st = torch.load(f, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        import zipfile

        if not zipfile.is_zipfile(f):  # every save, the old format's too, wrote torch's zip archive
            raise ConfigError(f"cannot resume from {path}: {TRAINER_STATE} is damaged: it is no file torch.save "
                              f"wrote (checkpoint.verify true compares every file with the manifest)") from None
        raise ConfigError(
            f"cannot resume from {path}: {TRAINER_STATE} is in the old pickled format (written before "
            f"2026-12-01), which is not loaded because unpickling it could run arbitrary code. Keep the weights by "
            f"starting a new run from them (--mode cpt --model.init_from {path} in a new output_dir); the "
            f"optimizer state is then fresh") from None
    if not isinstance(st, dict) or st.get("format") != STATE_FORMAT:
        got = st.get("format") if isinstance(st, dict) else type(st).__name__
        raise ConfigError(f"cannot resume from {path}: {TRAINER_STATE} has format {got!r}, this version reads "
                          f"format {STATE_FORMAT}")
    return st


def allowed_changes(cfg: RunConfig) -> list[str]:
    a = cfg.checkpoint.allow_changes
    if isinstance(a, str):
        a = [k for k in (x.strip() for x in a.split(",")) if k]
    return [str(k) for k in (a or [])]


def check_resume_config(cfg: RunConfig, mc, resume_dir: Path) -> dict:
    """Compare the resolved model config ``mc`` with the checkpoint's ``config.json``. Differences
    are refused, naming the keys, unless listed in ``checkpoint.allow_changes``. Returns the
    allowed differences as ``{key: (checkpoint value, new value)}``."""
    try:  # config.json holds the non-default values only: complete it through the config class
        old = type(mc).from_dict(json.loads((Path(resume_dir) / "config.json").read_text())).to_dict()
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot resume from {resume_dir}: cannot read its config.json: {e}") from None
    new = mc.to_dict()
    allowed = allowed_changes(cfg)
    unknown = [k for k in allowed if k not in new]
    if unknown:
        raise ConfigError(f"checkpoint.allow_changes: {unknown} are not model config keys; valid keys include "
                          f"{sorted(k for k in new if not k.startswith('_') and k not in RUNTIME_CONFIG_KEYS)}")
    missing = "<absent>"
    diff = {k: (old.get(k, missing), new.get(k, missing)) for k in sorted(set(old) | set(new))
            if k not in RUNTIME_CONFIG_KEYS and old.get(k, missing) != new.get(k, missing)}
    refused = {k: v for k, v in diff.items() if k not in allowed}
    reshaped = _shape_changes(type(mc).from_dict(old), mc) if diff else []
    if refused:
        what = "; ".join(f"{k}: checkpoint {a!r}, now {b!r}" for k, (a, b) in refused.items())
        how = (f"Restore those settings: the new config changes the weights' shapes ({'; '.join(reshaped[:3])}), which a "
               f"resume cannot (for a model of the new shape, start a new run in another output_dir)" if reshaped else
               f"Restore those settings, or, if the change is intended, allow it with --checkpoint.allow_changes "
               f"{','.join(refused)}")
        raise ConfigError(f"cannot resume from {resume_dir}: the model config differs from the checkpoint's in "
                          f"{', '.join(refused)} ({what}). {how}")
    if diff:  # allowed: refused still if they change a weight's shape (the load would fail after the model is built)
        if reshaped:
            raise ConfigError(
                f"cannot resume from {resume_dir}: checkpoint.allow_changes lists {', '.join(diff)}, whose new values "
                f"change the weights' shapes ({'; '.join(reshaped[:3])}); keys that change weight shapes cannot "
                f"change on resume (start a new run, or --mode cpt --model.init_from for one that keeps the shapes)")
    return diff


def _shape_changes(old_config, new_config) -> list[str]:
    """The weights whose shape (or presence) differs between the models of two configs."""
    from ..models.loading import weight_shapes

    a, b = weight_shapes(old_config), weight_shapes(new_config)
    return [f"{k}: checkpoint {a.get(k, 'absent')}, now {b.get(k, 'absent')}" for k in sorted(set(a) | set(b))
            if a.get(k) != b.get(k)]


# what a checkpoint's data position (epoch, document of the seeded order, token offset) refers to
DATA_KEYS = ("mode", "seed", "data.train", "data.format", "data.text_field", "data.messages_field",
             "data.text_sample_by", "data.tokenizer", "data.streaming", "data.shuffle", "data.shuffle_buffer",
             "data.repeat_passage")


# what the learning rate of each step follows (a resume takes the config's: the lr jumps where they moved)
SCHEDULE_KEYS = ("optim.schedule", "optim.warmup_steps", "optim.min_lr_ratio", "train.max_steps")


def changes_since(cfg: RunConfig, resume_dir: Path, keys: tuple) -> dict:
    """The ``keys`` set otherwise than in the checkpoint's ``run_config.yaml``, as ``{key: (checkpoint
    value, new value)}``: a change of :data:`DATA_KEYS` means the checkpoint's data position does not
    apply (it points into other documents), one of :data:`SCHEDULE_KEYS` moves the learning rate."""
    import yaml

    try:
        old = yaml.safe_load((Path(resume_dir) / "run_config.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return {}
    out, missing = {}, object()
    for key in keys:
        v = old
        for part in key.split("."):
            v = v.get(part, missing) if isinstance(v, dict) else missing
        if v is not missing and v != _get(cfg, key):
            out[key] = (v, _get(cfg, key))
    return out


def _batch_text(micro: int, accum: int, world: int) -> str:
    return f"micro-batch {micro} x grad_accum {accum} x {world} process{'es' if world != 1 else ''}"


def batch_note(cfg: RunConfig, world: int, resume_dir: Path, state: dict) -> Optional[str]:
    """The checkpoint's global batch (micro-batch x grad_accum x processes), for a resume to say when
    its own differs, e.g. a run of N processes resumed in M (else the batch changed without a word);
    None when it is the same, or the checkpoint does not say."""
    import yaml

    try:
        train = (yaml.safe_load((Path(resume_dir) / "run_config.yaml").read_text()) or {}).get("train") or {}
        was = (int(train["micro_batch_size"]), int(train["grad_accum"]), int(state["world_size"]))
    except (OSError, yaml.YAMLError, AttributeError, KeyError, TypeError, ValueError):
        return None
    t = cfg.train
    rows, old_rows = t.micro_batch_size * t.grad_accum * world, math.prod(was)
    if rows == old_rows:
        return None
    keep, rest = divmod(old_rows, t.micro_batch_size * world)
    return (f"the checkpoint's global batch was {old_rows} sequences ({_batch_text(*was)})" +
            ("" if rest else f": --grad_accum {keep} keeps it"))


# --------------------------------------------------------------------------- the trainer


class Trainer:
    def __init__(self, cfg: RunConfig):
        self.cfg = check_config(cfg)  # load_config's checks, for a RunConfig built in Python
        self.dist = Dist()
        self.device = _device(cfg, self.dist)
        self.dist.init(self.device)
        if cfg.train.threads and self.device.type == "cpu":
            torch.set_num_threads(cfg.train.threads)
        precision = cfg.train.precision
        if precision == "auto":
            precision = "bf16" if self.device.type == "cuda" else "fp32"
        self.precision = precision
        self.lock = None  # output_dir's lock, taken when the run starts writing there
        self._preflight()

    # ---------------------------------------------------------------- set-up
    def _preflight(self) -> None:
        cfg, dist = self.cfg, self.dist
        check_output_dir(cfg.output_dir)
        if cfg.train.plot:  # drawn at every eval: a loss.png that could not be written ended the run at the first
            try:
                check_output_path("train.plot's figure", Path(cfg.output_dir) / LOSS_PLOT)
            except ValueError as e:
                raise ConfigError(f"{e}; move it away, or set train.plot false") from None
        check_output_dir_free(cfg.output_dir)  # on every process, before the first collective
        check_data_outside_output_dir(cfg)
        self.resume_dir = resolve_resume(cfg)
        self._check_ranks_agree()
        if self.resume_dir is not None:
            try:
                step = ckpt.verify(self.resume_dir, hashes=cfg.checkpoint.verify and dist.main,
                                   progress=cfg.train.progress)["step"]
            except ckpt.CheckpointError as e:
                raise ConfigError(f"cannot resume: {e}{_older_checkpoint_hint(cfg, self.resume_dir)}") from None
            if cfg.train.max_steps < step:  # nothing to train; run_config.yaml would say max_steps < step
                raise ConfigError(f"train.max_steps ({cfg.train.max_steps}) is below step {step}, that of the "
                                  f"checkpoint it resumes from ({self.resume_dir}): set train.max_steps to {step} or "
                                  f"more, or start a new run in another output_dir")
            later = [p.name for p in ckpt.list_checkpoints(cfg.output_dir)
                     if int(ckpt.CKPT_RE.match(p.name)[1]) > step]
            if any(not (ckpt.ckpt_root(cfg.output_dir) / n / ckpt.MANIFEST).is_file() for n in later):
                # a damaged later checkpoint is this run's, not "the run that went on from it"
                root = ckpt.ckpt_root(cfg.output_dir)
                raise ConfigError(
                    f"cannot resume from {self.resume_dir} (step {step}): {_incomplete_note(cfg.output_dir, step)}. "
                    f"To go on from step {step}, move the later folders ({', '.join(later)}) out of {root}; or start "
                    f"a fresh run in another output_dir")
            if later:  # they would be reported and resumed as this run's, and outlive its own when pruned
                raise ConfigError(
                    f"output_dir {cfg.output_dir!r} holds checkpoints after step {step}, the one resumed from "
                    f"({', '.join(later)}): they belong to the run that went on from it. Resume into another "
                    f"output_dir, or move those checkpoints away")
        src = cfg  # a resume's model and tokenizer are its checkpoint's: model.init_from, read when the run
        if self.resume_dir is not None and cfg.model.init_from:  # started, may be gone (pruned, moved) since
            src = copy.deepcopy(cfg)
            src.model.init_from = str(self.resume_dir)
        self.tokenizer = load_tokenizer(src)
        self.model_config = model_config_for(src, self.tokenizer)
        mc = self.model_config
        self.resume_state, self.config_changes, self.data_changes, self.batch_note = None, {}, {}, None
        self.schedule_changes = {}
        if self.resume_dir is not None:
            self.config_changes = check_resume_config(cfg, mc, self.resume_dir)
            changes = changes_since(cfg, self.resume_dir, DATA_KEYS + SCHEDULE_KEYS)  # (one read of the YAML)
            self.data_changes = {k: v for k, v in changes.items() if k in DATA_KEYS}
            self.schedule_changes = {k: v for k, v in changes.items() if k in SCHEDULE_KEYS}
            self.resume_state = load_trainer_state(self.resume_dir)
            self.batch_note = batch_note(cfg, dist.world, self.resume_dir, self.resume_state)
            from .optim import group_count

            have = len(self.resume_state["optimizer"]["param_groups"])
            want = group_count(cfg.optim.scale_offset_lr_mult)
            if have != want:
                raise ConfigError(
                    f"cannot resume from {self.resume_dir}: its optimizer state has {have} parameter groups "
                    f"(optim.scale_offset_lr_mult {'1' if have == 2 else 'not 1'}), this config makes {want} "
                    f"(optim.scale_offset_lr_mult {cfg.optim.scale_offset_lr_mult}); set it back, or start a new run "
                    f"from the weights (--mode cpt --model.init_from {self.resume_dir} in a new output_dir)")
        if cfg.data.seq_len > mc.max_position_embeddings:
            raise ConfigError(f"data.seq_len ({cfg.data.seq_len}) is larger than the model allows "
                              f"(max_position_embeddings = {mc.max_position_embeddings})")
        if len(self.tokenizer) > mc.vocab_size:
            raise ConfigError(f"the tokenizer has {len(self.tokenizer)} tokens but the model's vocab_size is "
                              f"{mc.vocab_size}")
        # data: building the streams and reading their first documents catches empty data
        self.stream = build_stream(cfg, self.tokenizer, "train")
        self.stream._fill()
        self.stream.load_state_dict({"epoch": 0, "doc": 0, "offset": 0, "rows": 0})
        self.eval_rows, read = [], [("data.train", self.stream.source)]
        if cfg.data.eval is not None and cfg.data.eval_sequences > 0:
            es = build_stream(cfg, self.tokenizer, "eval")
            self.eval_rows = eval_rows(es, cfg.data.eval_sequences)
            if not self.eval_rows:
                raise DataError(f"data.eval {cfg.data.eval!r} produced no sequences")
            read.append(("data.eval", es.source))
        if cfg.data.text_sample_by != "document" and not any(src.builder == "text" for _, src in read):
            what = "; ".join(f"{key} {src.spec!r} is read as {src.builder!r}" for key, src in read)
            raise ConfigError(f"data.text_sample_by ({cfg.data.text_sample_by!r}) splits plain-text files (.txt, "
                              f"data.format text) into documents; no data of this run is one ({what}): drop "
                              f"data.text_sample_by")

    def _check_ranks_agree(self) -> None:
        """Every process reads its own config and output_dir: one started with another (another file on
        its node, a node-local output_dir with other checkpoints) trained its shard of the weights by it,
        silently. Refused on every process, naming the keys (one collective, before any work)."""
        if not self.dist.enabled:
            return
        mine = dict(_flatten(self.cfg.to_dict()))
        mine["the resume point"] = str(self.resume_dir) if self.resume_dir else "none (a fresh start)"
        every = self.dist.gather_object(mine)
        differ = [k for k in mine if any(r.get(k) != mine[k] for r in every)]
        if differ:
            def ranks(key):
                by_value = {}
                for rank, r in enumerate(every):
                    by_value.setdefault(repr(r.get(key)), []).append(str(rank))
                return ", ".join(f"rank{'s' if len(rs) > 1 else ''} {' '.join(rs)}: {v}" for v, rs in by_value.items())

            raise ConfigError("the processes of this run were started with different settings: " +
                              "; ".join(f"{k} ({ranks(k)})" for k in differ) + ". Every process must get the same "
                              "config and see the same output_dir")

    def _setup_model(self) -> None:
        cfg, dist = self.cfg, self.dist
        model = build_model(cfg, self.model_config, self.resume_dir)
        if cfg.train.activation_checkpointing:
            enable_activation_checkpointing(model)
        model.to(self.device)
        if dist.enabled:
            _shard(model, dist)
        if cfg.train.compile:
            for layer in model.model.layers:
                layer.compile()
        self.model = model
        o = cfg.optim
        self.optimizer = build_optimizer(model, lr=o.lr, weight_decay=o.weight_decay, betas=(o.beta1, o.beta2),
                                         eps=o.eps, scale_offset_lr_mult=o.scale_offset_lr_mult)
        self.scheduler = build_scheduler(self.optimizer, total_steps=cfg.train.max_steps,
                                         warmup_steps=o.warmup_steps, schedule=o.schedule,
                                         min_lr_ratio=o.min_lr_ratio)
        self.step = 0
        self.tokens_seen = 0
        if self.resume_state is not None:
            self._load_state(self.resume_state)

    # ---------------------------------------------------------------- checkpoints
    def _full_state(self):
        from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                             get_optimizer_state_dict)

        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        if self.dist.enabled:
            msd = get_model_state_dict(self.model, options=opts)
            osd = get_optimizer_state_dict(self.model, self.optimizer, options=opts)
        else:
            msd = {k: v.detach().cpu() for k, v in self.model.state_dict().items()}
            osd = get_optimizer_state_dict(self.model, self.optimizer, options=StateDictOptions(full_state_dict=True))
        return msd, osd

    def save(self) -> Optional[Path]:
        cfg, dist = self.cfg, self.dist
        msd, osd = self._full_state()
        rngs = dist.gather_object(_rng_state())
        final = None
        if dist.main:
            from safetensors.torch import save_file

            tmp = ckpt.begin(cfg.output_dir, self.step)
            part = "model.safetensors"  # what is being written, for a failure's message
            try:
                if getattr(self.model.config, "tie_word_embeddings", False):
                    msd.pop("lm_head.weight", None)
                msd = {k.replace("_orig_mod.", ""): v.contiguous() for k, v in msd.items()}
                save_file(msd, str(tmp / "model.safetensors"), metadata={"format": "pt"})
                part = "config.json, generation_config.json and the tokenizer"
                self.model.config.save_pretrained(str(tmp))
                gen = copy.deepcopy(getattr(self.model, "generation_config", None))
                if gen is not None:  # generate() through transformers uses a KV cache
                    gen.use_cache = True
                    gen.save_pretrained(str(tmp))
                self.tokenizer.save_pretrained(str(tmp))
                ckpt._fault("save_mid", self.step)
                state = {
                    "format": STATE_FORMAT,
                    "step": self.step,
                    "tokens_seen": self.tokens_seen,
                    "optimizer": osd,
                    "scheduler": self.scheduler.state_dict(),
                    "rng": rngs,
                    "data": self.stream.state_dict(),
                    "world_size": dist.world,
                }
                part = TRAINER_STATE
                torch.save(state, tmp / TRAINER_STATE)
                part = "run_config.yaml"
                (tmp / "run_config.yaml").write_text(dump_yaml(cfg))
                part = f"{ckpt.MANIFEST} (and the rename into place)"
                final = ckpt.commit(tmp, cfg.output_dir, self.step, cfg.checkpoint.keep_last)
            except BaseException as e:  # Ctrl-C, SIGTERM, a full disk: no half-written checkpoint stays behind
                shutil.rmtree(tmp, ignore_errors=True)
                if not isinstance(e, Exception):
                    raise
                # a full disk was safetensors' error (no OSError: a traceback) or torch.save's `[enforce fail
                # at inline_container.cc] unexpected pos`, naming no checkpoint
                reason = str(e).strip().splitlines()[0] if str(e).strip() else ""
                raise OSError(f"cannot write the checkpoint of step {self.step} ({part}, in {tmp.parent}; the save "
                              f"was removed, the checkpoints before it stay): {type(e).__name__}: {reason}") from e
        dist.barrier()
        return final

    def _load_state(self, st: dict) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        fresh = [dict(g) for g in self.optimizer.param_groups]  # this config's hyperparameters
        set_optimizer_state_dict(self.model, self.optimizer, st["optimizer"],
                                 options=StateDictOptions(full_state_dict=True))
        self.scheduler.load_state_dict(st["scheduler"])
        self._apply_optim_keys(fresh)
        if not self.data_changes:  # else the data is read from its start
            self.stream.load_state_dict(st["data"])
        self.step, self.tokens_seen = st["step"], st["tokens_seen"]
        rngs = st["rng"]
        _set_rng_state(rngs[self.dist.rank] if len(rngs) == self.dist.world else rngs[0])

    def _apply_optim_keys(self, fresh: list) -> None:
        """The optimizer and scheduler states of a checkpoint carry the hyperparameters they were
        made with (each group's lr, weight decay, betas, eps; the scheduler's base lrs): give them
        this config's ``optim.*`` instead, so a resume honours a changed ``optim.lr``, ``weight_decay``,
        ``beta1`` / ``beta2``, ``eps`` or ``scale_offset_lr_mult`` (and the schedule keys from the first
        resumed step on). Unchanged keys give the same numbers, bit for bit (the lr is the scheduler's
        own base x multiplier at its step)."""
        groups, sched = self.optimizer.param_groups, self.scheduler
        o, old = self.cfg.optim, groups[0]
        was = {"optim.lr": old["initial_lr"], "optim.weight_decay": old["weight_decay"],
               "optim.beta1": old["betas"][0], "optim.beta2": old["betas"][1], "optim.eps": old["eps"]}
        if len(groups) > 2:
            was["optim.scale_offset_lr_mult"] = groups[2]["initial_lr"] / old["initial_lr"]
        for g, f in zip(groups, fresh):
            for k in ("initial_lr", "weight_decay", "betas", "eps"):
                g[k] = f[k]
        sched.base_lrs = [g["initial_lr"] for g in groups]
        for g, fn, base in zip(groups, sched.lr_lambdas, sched.base_lrs):
            g["lr"] = base * fn(sched.last_epoch)
        sched._last_lr = [g["lr"] for g in groups]
        now = {k: float(getattr(o, k.split(".")[1])) for k in was}
        changed = [k for k in was if not math.isclose(was[k], now[k], rel_tol=1e-9)]
        if changed and self.dist.main:
            print("[orthros train] resuming with " + ", ".join(f"{k} = {now[k]:g} (checkpoint: {was[k]:g})"
                                                               for k in changed),
                  file=sys.stderr, flush=True)

    # ---------------------------------------------------------------- steps
    def _autocast(self):
        if self.precision == "bf16":
            return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _forward_sum(self, batch: PackedBatch) -> tuple[torch.Tensor, int]:
        """Sum of token cross-entropies of one packed micro-batch, and how many tokens it scored."""
        n = batch.num_targets
        with self._autocast():
            if n == 0:  # keep collectives in step: run the model, contribute nothing
                out = self.model(input_ids=batch.input_ids, cu_seqlens=batch.cu_seqlens, logits_to_keep=1,
                                 use_cache=False)
                return out.logits.float().sum() * 0.0, 0
            out = self.model(input_ids=batch.input_ids, labels=batch.labels, cu_seqlens=batch.cu_seqlens,
                             use_cache=False)
        return out.loss * n, n

    def train_step(self) -> dict:
        cfg, dist = self.cfg, self.dist
        mb, accum = cfg.train.micro_batch_size, cfg.train.grad_accum
        rows = self.stream.take(dist.world * accum * mb)
        n_global = count_targets(rows)
        mine = rows[dist.rank * accum * mb:(dist.rank + 1) * accum * mb]
        self.model.train()
        loss_sum = torch.zeros((), dtype=torch.float64)
        for a in range(accum):
            batch = collate(mine[a * mb:(a + 1) * mb]).to(self.device)
            if dist.enabled:
                self.model.set_requires_gradient_sync(a == accum - 1)
            ce_sum, _ = self._forward_sum(batch)
            # FSDP averages gradients over processes: scale so the result is sum / n_global
            (ce_sum * (dist.world / max(n_global, 1))).backward()
            loss_sum += ce_sum.detach().double().cpu()
        loss_sum = dist.all_reduce_sum(loss_sum)
        loss = float(loss_sum) / max(n_global, 1)
        if not math.isfinite(loss):  # before the update: the weights stay those of the last step
            raise FloatingPointError(f"loss is {loss} at step {self.step + 1}; lower optim.lr or check data")
        # the norm at every step, also unclipped (optim.grad_clip 0): a non-finite gradient made every weight nan
        # (AdamW's update, or clipping by it), which the checkpoint of that step saved before the next loss told
        if cfg.optim.grad_clip > 0:
            gn = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.optim.grad_clip)
        else:
            gn = torch.nn.utils.get_total_norm([p.grad for p in self.model.parameters() if p.grad is not None])
        grad_norm = float(gn.full_tensor() if hasattr(gn, "full_tensor") else gn)
        if not math.isfinite(grad_norm):
            raise FloatingPointError(f"the gradient norm is {grad_norm} at step {self.step + 1} (loss "
                                     f"{loss:.4f}); lower optim.lr or check data")
        lr = self.scheduler.get_last_lr()[0]
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        n_tok = sum(len(r.input_ids) for r in rows)
        self.tokens_seen += n_tok
        flops = sum(train_flops(self.model_config, collate([r]).seg_lens, count_targets([r])) for r in rows)
        return {"loss": loss, "lr": lr, "grad_norm": grad_norm,
                "step_tokens": n_tok, "step_targets": n_global, "step_flops": flops}

    @torch.no_grad()
    def evaluate(self) -> Optional[float]:
        if not self.eval_rows:
            return None
        cfg, dist = self.cfg, self.dist
        mb = cfg.train.micro_batch_size
        rows = self.eval_rows
        mine = rows[dist.rank::dist.world]
        n_batches = math.ceil(math.ceil(len(rows) / dist.world) / mb)
        self.model.eval()
        tot = torch.zeros(2, dtype=torch.float64)
        for i in range(n_batches):
            part = mine[i * mb:(i + 1) * mb]
            weight = 1.0 if part else 0.0
            batch = collate(part or rows[:1]).to(self.device)
            ce_sum, n = self._forward_sum(batch)
            tot += torch.tensor([float(ce_sum) * weight, n * weight], dtype=torch.float64)
        tot = dist.all_reduce_sum(tot)
        self.model.train()
        return float(tot[0] / tot[1].clamp(min=1))

    def resume_changes(self) -> list:
        """What a resume changes against its checkpoint, one line each (what the run prints after
        "resuming with", and ``--dry-run``'s "changes" row): keys ``checkpoint.allow_changes`` let
        through, data keys (the data is then read from its start), schedule keys (with the lr of the
        first step against the checkpoint's schedule: extending a finished cosine run puts it back up)."""
        from .optim import lr_multiplier

        def said(changes: dict) -> str:
            return ", ".join(f"{k} = {new!r} (checkpoint: {old!r})" for k, (old, new) in changes.items())

        cfg, lines = self.cfg, [f"{k} = {new!r} (checkpoint: {old!r}; allowed by checkpoint.allow_changes)"
                                for k, (old, new) in self.config_changes.items()]
        if self.data_changes:
            lines.append(said(self.data_changes) + ": the data is read from its start")
        if self.schedule_changes:
            step = self.resume_state["step"]
            now = {k.split(".")[1]: _get(cfg, k) for k in SCHEDULE_KEYS}
            was = {**now, **{k.split(".")[1]: old for k, (old, _) in self.schedule_changes.items()}}
            lr = [cfg.optim.lr * lr_multiplier(step, total_steps=sch["max_steps"], warmup_steps=sch["warmup_steps"],
                                               schedule=sch["schedule"], min_lr_ratio=sch["min_lr_ratio"])
                  for sch in (now, was)]
            lines.append(said(self.schedule_changes) + f": step {step + 1} trains at lr {lr[0]:.4g} (the checkpoint's "
                                                        f"schedule: {lr[1]:.4g})")
        return lines

    # ---------------------------------------------------------------- loop
    def run(self) -> dict:
        cfg, dist = self.cfg, self.dist
        self._setup_model()
        start_step = self.step
        Path(cfg.output_dir).mkdir(parents=True, exist_ok=True)  # checked (not created) in the preflight
        taken = None  # held by the first process until the run ends (train() closes it; so does the process's end)
        if dist.main:
            try:
                self.lock = lock_output_dir(cfg.output_dir)
            except ConfigError as e:  # another run started since the preflight
                taken = str(e)
        taken = next((t for t in dist.gather_object(taken) if t), None)  # every process stops, not the first alone
        if taken:
            raise ConfigError(taken)
        # a fresh start drops every step row an earlier start in this output_dir logged (killed before
        # its first checkpoint), so metrics.jsonl keeps one row a step
        logger = MetricsLogger(cfg.output_dir, enabled=dist.main, tensorboard=cfg.train.tensorboard,
                               resume_step=self.step if self.resume_dir else 0)
        if dist.main:
            write_text(Path(cfg.output_dir) / "run_config.yaml", dump_yaml(cfg))
            for line in self.resume_changes():
                print(f"[orthros train] resuming with {line}", file=sys.stderr, flush=True)
            if self.batch_note:
                t = cfg.train
                print(f"[orthros train] resuming with a global batch of {dist.world * t.grad_accum * t.micro_batch_size} "
                      f"sequences ({_batch_text(t.micro_batch_size, t.grad_accum, dist.world)}); {self.batch_note}",
                      file=sys.stderr, flush=True)
        peak = cfg.train.peak_tflops * 1e12 if cfg.train.peak_tflops else detect_peak_flops(self.device, self.precision)
        n_params = sum(p.numel() for p in self.model.parameters())
        if dist.main:
            what = (f"resumed from {self.resume_dir} at step {self.step}" if self.resume_dir else
                    f"weights from {cfg.model.init_from}" if cfg.model.init_from else "fresh start")
            print(f"[orthros train] mode={cfg.mode} arch={cfg.model.architecture} "
                  f"(attention_mode={self.model_config.attention_mode}) params={n_params/1e6:.2f}M "
                  f"world={dist.world} device={self.device} precision={self.precision} "
                  f"global_batch={dist.world * cfg.train.grad_accum * cfg.train.micro_batch_size}x{cfg.data.seq_len} "
                  f"tokens; {what}", file=sys.stderr, flush=True)
            if note := warmup_note(cfg):  # the default warm-up on a short run (set away from it, refused)
                print(f"[orthros train] note: {note} for the whole schedule", file=sys.stderr, flush=True)
            if self.step >= cfg.train.max_steps:  # resumed at its end (the done line said only "loss -")
                print(f"[orthros train] nothing to train: the run is complete at train.max_steps {cfg.train.max_steps}; "
                      f"raise train.max_steps (e.g. --max_steps {2 * cfg.train.max_steps}) to go on",
                      file=sys.stderr, flush=True)
        progress = Progress(cfg.train.max_steps, f"{cfg.mode}/{cfg.model.architecture}", unit="step",
                            initial=self.step, enabled=dist.main and cfg.train.progress, every_s=None)
        last_loss, eval_loss, plot_failed = None, None, False
        last_saved = self.step if self.resume_dir else None
        t_window, tok_window, flop_window = time.perf_counter(), 0, 0.0
        try:
            while self.step < cfg.train.max_steps:
                if self.device.type == "cuda":
                    torch.cuda.synchronize()
                m = self.train_step()
                if self.device.type == "cuda":
                    torch.cuda.synchronize()
                last_loss = m["loss"]  # (finite: train_step stops at one that is not)
                tok_window += m["step_tokens"]
                flop_window += m["step_flops"]
                now = time.perf_counter()
                dt = max(now - t_window, 1e-9)
                tps = tok_window / dt
                mfu = flop_window / dt / (peak * dist.world) if peak else None
                logged = self.step % cfg.train.log_every == 0 or self.step == cfg.train.max_steps
                progress.update(1, line=logged, loss=f"{last_loss:.4f}", **{"tok/s": f"{tps:,.0f}"},
                                mfu=f"{100 * mfu:.1f}%" if mfu is not None else "n/a")
                if logged:
                    logger.log({"kind": "train", "step": self.step, "loss": last_loss, "lr": m["lr"],
                                "grad_norm": m["grad_norm"], "tokens": self.tokens_seen, "tokens_per_s": tps,
                                "mfu": mfu, "targets": m["step_targets"]})
                    t_window, tok_window, flop_window = time.perf_counter(), 0, 0.0
                paused = time.perf_counter()  # evals and saves are not training time (tok/s, MFU)
                if cfg.train.eval_every and self.step % cfg.train.eval_every == 0 and self.step < cfg.train.max_steps:
                    eval_loss = self.evaluate()
                    if eval_loss is not None:
                        logger.log({"kind": "eval", "step": self.step, "eval_loss": eval_loss, "tokens": self.tokens_seen})
                        progress.write(f"step {self.step}: eval_loss {eval_loss:.4f}")
                        if dist.main and cfg.train.plot:  # loss.png follows the run
                            plot_failed = _plot_run(cfg.output_dir, say=False, said_failure=plot_failed)
                # the last step's checkpoint is written after the final eval (below): one saved before
                # it would, after a kill during that eval, be resumed as a finished run that has none
                if cfg.checkpoint.every and self.step % cfg.checkpoint.every == 0 and self.step < cfg.train.max_steps:
                    self.save()
                    last_saved = self.step
                t_window += time.perf_counter() - paused
                ckpt._fault("after_step", self.step)
            if self.eval_rows and self.step > start_step:
                eval_loss = self.evaluate()
                logger.log({"kind": "eval", "step": self.step, "eval_loss": eval_loss, "tokens": self.tokens_seen})
            if last_saved != self.step:
                self.save()
        except (DataError, FileNotFoundError, FileExistsError, NotADirectoryError) as e:
            # a bad record past those the checks read, a file gone while working: a failure while working (exit
            # code 1), not the bad input `orthros` takes these for (2: refused before any work)
            raise RuntimeError(f"at step {self.step + 1}: {e}") from None
        finally:
            progress.close()
            logger.close()
        if dist.main and cfg.train.plot:
            _plot_run(cfg.output_dir)
        summary = {"step": self.step, "loss": last_loss, "eval_loss": eval_loss, "tokens": self.tokens_seen,
                   "output_dir": cfg.output_dir, "checkpoint": str(ckpt.latest_checkpoint(cfg.output_dir))}
        if dist.main:
            num = lambda v: f"{v:.4f}" if v is not None else "-"  # noqa: E731
            print(f"[orthros train] done: step {self.step}, loss {num(last_loss)}, eval_loss {num(eval_loss)}, "
                  f"{self.tokens_seen:,} tokens; checkpoint {summary['checkpoint']}", file=sys.stderr, flush=True)
        return summary


def _plot_run(output_dir: str, say: bool = True, said_failure: bool = False) -> bool:
    """``output_dir/loss.png``, the run's loss curves (:mod:`orthros.training.plot`); ``say``:
    print where it went (at the run's end), or why none was drawn. Returns whether the figure could
    not be written (an ``OSError``: checked before the run, then the disk filled or the folder
    changed; the run goes on), which is printed even without ``say`` unless ``said_failure`` (the
    previous eval's failure, already said)."""
    from .plot import PlotError, plot_runs

    failed = False
    try:
        msg = f"loss curves: {plot_runs([output_dir], Path(output_dir) / LOSS_PLOT)}"
    except PlotError as e:  # nothing logged yet (log_every > eval_every), or a run resumed at its end
        msg = f"no loss curves drawn: {e}"
    except OSError as e:
        msg, failed = f"no loss curves drawn: {e}", True
        say = say or not said_failure
    if say:
        print(f"[orthros train] {msg}", file=sys.stderr, flush=True)
    return failed


def dry_run(cfg: RunConfig) -> str:
    """What ``orthros train --dry-run`` prints: the run ``cfg`` describes, after every check the
    real run makes before it starts (output directory, resume point, tokenizer, model config, the
    data's first documents, the eval sequences). The model is built on the meta device (no
    weights are read or initialised) and nothing is written."""
    from ..data import TOKENIZER_DIR
    from ..kinds import describe_layers, model_kind, window_of
    from ..models import OrthrosForCausalLM

    trainer = Trainer(cfg)
    try:
        mc, dist = trainer.model_config, trainer.dist
        with torch.device("meta"):
            n_params = sum(p.numel() for p in OrthrosForCausalLM(mc).parameters())
    finally:
        trainer.dist.close()
    t, o, d, c = cfg.train, cfg.optim, cfg.data, cfg.checkpoint
    start = trainer.resume_state["step"] if trainer.resume_state else 0
    rows = dist.world * t.grad_accum * t.micro_batch_size
    per_step = rows * d.seq_len
    kind = model_kind(mc.layer_types, mc.attention_mode)
    w = window_of(mc.layer_types, mc.attention_mode, mc.window_size)
    window = f", window {w}" if w else ""
    weights = (f"resumes from {trainer.resume_dir} (step {start})" if trainer.resume_dir else
               f"weights from {cfg.model.init_from}" if cfg.model.init_from else "a fresh initialisation")
    out = Path(cfg.output_dir)
    where = ("does not exist yet" if not out.exists() else
             "holds the checkpoint it resumes from" if trainer.resume_dir else "exists and holds no checkpoint")
    steps_left = max(t.max_steps - start, 0)
    source = trainer.tokenizer.name_or_path
    tokenizer = (repr(d.tokenizer) if d.tokenizer != "embedded" else
                 "'embedded'" if Path(source).resolve() == TOKENIZER_DIR.resolve() else f"of {source}")
    note = warmup_note(cfg)
    schedule = (f"AdamW, lr {o.lr:g}, {o.warmup_steps} warm-up steps, then {o.schedule}" +
                (f" to {o.min_lr_ratio:g}x" if o.schedule != "constant" else "") +
                (f" (note: {note} for the whole schedule)" if note else ""))
    rows_out = [
        ("run", f"{cfg.mode}, seed {cfg.seed}; output_dir {cfg.output_dir} ({where})"),
        ("model", f"{kind}{window}: {describe_layers(mc.layer_types)}, hidden {mc.hidden_size}, "
                  f"vocab {mc.vocab_size:,}; {n_params:,} parameters; {weights}"),
        ("data", f"train {d.train!r}, eval {d.eval!r} ({len(trainer.eval_rows)} held-out sequence{'s' if len(trainer.eval_rows) != 1 else ''}); "
                 f"tokenizer {tokenizer} ({len(trainer.tokenizer):,} tokens)"),
        ("batch", f"{rows} sequences x {d.seq_len} tokens a step = {per_step:,} tokens "
                  f"({_batch_text(t.micro_batch_size, t.grad_accum, dist.world)})"
                  + (f"; {trainer.batch_note}" if trainer.batch_note else "")),
        ("steps", f"{start} -> {t.max_steps}: {steps_left:,} steps" + (
            " (the run is complete: raise train.max_steps to go on)" if not steps_left else "") +
         f", {steps_left * per_step:,} tokens; {schedule}"),
        ("device", f"{trainer.device}, {trainer.precision}" + (", compiled layers" if t.compile else "") +
                   (", activation checkpointing" if t.activation_checkpointing else "")),
        ("eval", ("none (data.eval null)" if d.eval is None else "none (data.eval_sequences 0)")
                 if not trainer.eval_rows else
                 f"every {t.eval_every} steps and at the end" if t.eval_every else "at the end"),
        ("checkpoints", (f"every {c.every} steps and at the end" if c.every else "at the end") +
                        f", the last {c.keep_last} kept"),
    ] + [("changes" if i == 0 else "", line) for i, line in enumerate(trainer.resume_changes())]
    return "\n".join(["orthros train --dry-run: every check passed; nothing was written"] +
                      [f"  {k:<12} {v}" for k, v in rows_out])


def train(cfg: RunConfig) -> dict:
    """Run one training job described by ``cfg``; returns a summary dict (on every process)."""
    trainer = Trainer(cfg)
    try:
        return trainer.run()
    finally:
        trainer.dist.close()
        if trainer.lock is not None:
            trainer.lock.close()

"""Atomic, verifiable training checkpoints.

Layout of ``<output_dir>/checkpoints/step_00000100/``::

    model.safetensors, config.json      # loadable with AutoModelForCausalLM.from_pretrained
    tokenizer files                     # so the directory is a complete HF model dir
    trainer_state.pt                    # optimizer, scheduler, RNG (per process), data position, step
    run_config.yaml                     # the resolved training config
    manifest.json                       # size and sha256 of every file above; written last

(The names, and the rule picking the latest complete checkpoint, are ``orthros/layout.py``'s.)

Everything is written into ``.tmp-step_00000100-<pid>`` first, each file fsynced, the manifest
last; then the directory is renamed to its final name (atomic on POSIX) and the parent fsynced.
A crash at any point leaves either the previous complete checkpoints only, or those plus a
``.tmp-*`` directory that is never loaded (and is deleted by the next save). Loading checks the
manifest, so a directory that is incomplete or altered is refused with a clear error.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

# the layout's names and path rules live in orthros/layout.py (checkpoint_files.py reads them too); re-exported here
from ..layout import (CKPT_RE, MANIFEST, TRAINER_STATE, ckpt_root, latest_checkpoint,  # noqa: F401
                      list_checkpoints, run_holding, step_dir_name)
from ..utils import Progress, sha256_of


class CheckpointError(RuntimeError):
    pass


def _fault(point: str, step: int) -> None:
    """Test hook: ORTHROS_TRAIN_FAULT=<point>:<step> hard-exits the process there (as a kill would);
    <point>:<step>:SIGTERM (or SIGINT) sends the process that signal there instead."""
    spec = os.environ.get("ORTHROS_TRAIN_FAULT", "")
    if spec and spec == f"{point}:{step}":
        os._exit(17)
    if spec.startswith(f"{point}:{step}:"):
        import signal

        os.kill(os.getpid(), getattr(signal, spec.rsplit(":", 1)[1]))


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def begin(output_dir: str, step: int) -> Path:
    root = ckpt_root(output_dir)
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".tmp-{step_dir_name(step)}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    return tmp


def commit(tmp: Path, output_dir: str, step: int, keep_last: int) -> Path:
    """Write the manifest, fsync, rename into place, prune old checkpoints and stale temp dirs."""
    files = sorted(p for p in tmp.rglob("*") if p.is_file())
    manifest = {"step": step, "files": {}}
    for p in files:
        _fsync_file(p)
        manifest["files"][str(p.relative_to(tmp))] = {"size": p.stat().st_size, "sha256": sha256_of(p)}
    _fault("save_before_manifest", step)
    mpath = tmp / MANIFEST
    with open(mpath, "w") as f:
        json.dump(manifest, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    _fsync_dir(tmp)
    _fault("save_before_rename", step)
    final = ckpt_root(output_dir) / step_dir_name(step)
    if final.exists():  # re-saving a step (e.g. after resuming from an older one)
        old = final.with_name(f".old-{final.name}-{os.getpid()}")
        os.rename(final, old)
        os.rename(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, final)
    _fsync_dir(final.parent)
    prune(output_dir, keep_last)
    return final


def prune(output_dir: str, keep_last: int) -> None:
    ckpts = list_checkpoints(output_dir)
    for p in ckpts[: max(0, len(ckpts) - keep_last)]:
        shutil.rmtree(p, ignore_errors=True)
    root = ckpt_root(output_dir)
    for p in root.iterdir():
        if p.name.startswith((".tmp-", ".old-")) and not p.name.endswith(f"-{os.getpid()}"):
            shutil.rmtree(p, ignore_errors=True)


def verify(path: Path, hashes: bool = True, *, progress: bool = False) -> dict:
    """Check a checkpoint directory against its manifest; return the manifest. ``progress`` (with
    ``hashes``): the bytes hashed on stderr (:class:`~orthros.utils.Progress`: a bar at a terminal,
    plain lines elsewhere; a large model's files take tens of seconds)."""
    path = Path(path)
    mpath = path / MANIFEST
    if not mpath.is_file():
        raise CheckpointError(f"{path} is not a complete checkpoint (no {MANIFEST}): incomplete or damaged, "
                              f"probably a save cut short")
    try:
        manifest = json.loads(mpath.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{mpath} is corrupt: {e}") from None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    step = manifest.get("step") if isinstance(manifest, dict) else None
    if not (isinstance(step, int) and not isinstance(step, bool) and isinstance(files, dict) and all(
            isinstance(m, dict) and type(m.get("size")) is int and isinstance(m.get("sha256"), str)
            for m in files.values())):
        raise CheckpointError(f"{mpath} is corrupt: it is not {{step, files: {{name: {{size, sha256}}}}}} as a save "
                              f"writes it")
    # the model's own files must be among those the manifest vouches for (a manifest of no files,
    # or one that leaves the weights out, checked nothing)
    model_files = [p.name for p in sorted(path.iterdir()) if p.is_file()
                   and (p.name == "config.json" or p.name.endswith((".safetensors", ".safetensors.index.json")))]
    unlisted = [n for n in model_files if n not in files]
    if unlisted or not files:
        raise CheckpointError(f"{mpath} is corrupt: it does not list {', '.join(unlisted) or 'any file'} "
                              f"(a save lists every file it writes)")
    for rel, meta in files.items():  # every size first: a missing or cut file is named before any byte is hashed
        p = path / rel
        if not p.is_file():
            raise CheckpointError(f"checkpoint {path} is missing {rel}")
        if p.stat().st_size != meta["size"]:
            raise CheckpointError(f"checkpoint {path}: {rel} has {p.stat().st_size} bytes, manifest says {meta['size']}")
    if hashes:
        total = sum(m["size"] for m in files.values())
        with Progress(total, f"verify {path.name}", unit="B", unit_scale=True, enabled=progress, every_s=10.0) as bar:
            for rel, meta in files.items():
                if sha256_of(path / rel, progress=bar) != meta["sha256"]:
                    raise CheckpointError(f"checkpoint {path}: {rel} does not match its sha256 in the manifest")
    return manifest

"""The folder layout of a training run: the one home of its file and folder names and of the rule
that picks its latest complete checkpoint. Standard library only, as pure path logic, so every
layer can use it: ``training/checkpoint.py`` writes and reads the layout; ``checkpoint_files.py``
(which must not import ``training``, and is part of the remote code saved beside every checkpoint)
names a run's latest checkpoint in its errors::

    <output_dir>/
        metrics.jsonl                       # METRICS: one JSON row per logged step
        loss.png                            # LOSS_PLOT: the loss curves, redrawn at each eval
        checkpoints/                        # CHECKPOINTS (ckpt_root)
            step_00000100/                  # CKPT_RE (step_dir_name)
                model.safetensors, config.json, tokenizer files, run_config.yaml
                trainer_state.pt            # TRAINER_STATE
                manifest.json               # MANIFEST: written last; a folder without it is a save cut short
            .tmp-step_00000200-<pid>/       # a save in progress (never loaded)
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Optional

CHECKPOINTS = "checkpoints"  # the folder of a run's checkpoints, in its output_dir
CKPT_RE = re.compile(r"^step_(\d{8})$")  # a checkpoint's folder name; group 1: its step
MANIFEST = "manifest.json"  # size and sha256 of every file of a checkpoint; written last
TRAINER_STATE = "trainer_state.pt"  # the trainer's state (torch.save): what makes a model directory a checkpoint
METRICS = "metrics.jsonl"  # a run's logged rows, in its output_dir
LOSS_PLOT = "loss.png"  # the trainer's loss curves (orthros plot's), in its output_dir


def ckpt_root(output_dir) -> Path:
    """The checkpoints folder of the run ``output_dir``."""
    return Path(output_dir) / CHECKPOINTS


def step_dir_name(step: int) -> str:
    return f"step_{step:08d}"


def list_checkpoints(output_dir) -> list[Path]:
    """The checkpoint folders of the run ``output_dir`` (complete or not), oldest first."""
    root = ckpt_root(output_dir)
    if not root.is_dir():
        return []
    return sorted((p for p in root.iterdir() if p.is_dir() and CKPT_RE.match(p.name)), key=lambda p: p.name)


def latest_checkpoint(output_dir) -> Optional[Path]:
    """The newest checkpoint folder whose manifest exists (complete by construction), or ``None``."""
    for p in reversed(list_checkpoints(output_dir)):
        if (p / MANIFEST).is_file():
            return p
    return None


def run_holding(path) -> Optional[str]:
    """The training run (its output_dir, with a metrics file) that ``path`` lies in when ``path`` is the
    run's checkpoints folder or one of its checkpoints; otherwise ``None``. For errors that name the
    folder to give instead (``orthros plot RUN/checkpoints``)."""
    p = os.path.normpath(str(path))
    if CKPT_RE.match(os.path.basename(p)):
        p = os.path.dirname(p)
    if os.path.basename(p) != CHECKPOINTS:
        return None
    run = os.path.dirname(p) or "."
    return run if os.path.isfile(os.path.join(run, METRICS)) else None


def run_holding_hint(path) -> str:
    """The end of an error about ``path`` (no run's output_dir): the run to name instead when ``path`` is its
    checkpoints folder or one of its checkpoints (:func:`run_holding`), else ``""``."""
    run = run_holding(path)
    return f"; it lies in the run {run}: name that" if run else ""

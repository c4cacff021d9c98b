"""The one optimiser and learning-rate schedule of the project.

Used by the trainer (``orthros train``), the MQAR evaluation (``orthros eval mqar`` /
``orthros demo``) and the passkey trainer (``orthros eval niah-train``), so the three agree on
what weight decay touches and on the shape of the schedule; each passes its own numbers.

* **Weight decay**: every trainable parameter with two or more dimensions (the projection
  and MLP matrices, the embeddings and an untied LM head) decays; vectors and scalars (norm
  gains, biases, Orthros' scale-offset alpha/beta) do not. This is the rule of GPT-2 /
  nanoGPT and of transformers' ``Trainer`` (which exempts biases and norm weights).
* **Scale-offset learning rate**: ``scale_offset_lr_mult`` (default 1) multiplies the
  learning rate of Orthros' scale-offset parameters (alpha, beta, alpha', beta': the only
  parameters a conversion adds), in their own group; the schedule scales every group alike.
* **Schedule**: linear warm-up from ``1 / warmup_steps`` of the peak to the peak over
  ``warmup_steps`` steps, then ``cosine`` (to ``min_lr_ratio`` x peak at step ``total_steps``,
  one past the last trained step, which runs just above it), ``linear`` (same end point) or
  ``constant``. Step ``s`` (0-based) is trained with
  ``peak * lr_multiplier(s, ...)``.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Iterable

SCHEDULES = ("cosine", "linear", "constant")


def decays(param) -> bool:
    """Whether the one weight-decay rule applies weight decay to ``param``."""
    return param.dim() >= 2


def is_scale_offset(name: str) -> bool:
    """Whether the parameter called ``name`` (``model.named_parameters()``) is one of Orthros'
    scale-offset parameters."""
    from ..layers.attention import SCALE_OFFSET_INIT

    return name.rpartition(".")[2] in SCALE_OFFSET_INIT


def param_groups(model, weight_decay: float, *, lr: float | None = None,
                 scale_offset_lr_mult: float = 1.0) -> list[dict]:
    """AdamW parameter groups of ``model``: decaying parameters (see :func:`decays`) with
    ``weight_decay``, the rest with 0. Frozen parameters are left out; a parameter shared by two
    modules (tied embeddings) appears once. With ``scale_offset_lr_mult != 1`` (and the peak
    ``lr``) the scale-offset parameters form a third group (no decay) at ``lr * mult``."""
    if not (isinstance(weight_decay, (int, float)) and weight_decay >= 0 and math.isfinite(weight_decay)):
        raise ValueError(f"weight_decay must be a finite number >= 0, got {weight_decay!r}")
    if not (isinstance(scale_offset_lr_mult, (int, float)) and scale_offset_lr_mult > 0
            and math.isfinite(scale_offset_lr_mult)):
        raise ValueError(f"scale_offset_lr_mult must be a finite number > 0, got {scale_offset_lr_mult!r}")
    own = scale_offset_lr_mult != 1  # a third group (group_count)
    if own and lr is None:
        raise ValueError("param_groups: scale_offset_lr_mult != 1 needs the peak lr")
    decay, no_decay, so = [], [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (so if own and is_scale_offset(name) else decay if decays(p) else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": float(weight_decay)}, {"params": no_decay, "weight_decay": 0.0}]
    if own:
        groups.append({"params": so, "weight_decay": 0.0, "lr": float(lr) * scale_offset_lr_mult})
    return groups


def group_count(scale_offset_lr_mult: float) -> int:
    """How many groups :func:`param_groups` makes: decay and no decay, and the scale-offset
    parameters' own when ``scale_offset_lr_mult != 1`` (a resumed optimizer state must match it)."""
    return 2 + (scale_offset_lr_mult != 1)


def check_schedule(*, total_steps: int, warmup_steps: int, schedule: str = "cosine", min_lr_ratio: float = 0.0) -> None:
    """Raise ``ValueError`` naming the bad argument and what is allowed."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}; got {schedule!r}")
    for name, v, lo in (("total_steps", total_steps, 1), ("warmup_steps", warmup_steps, 0)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ValueError(f"{name} must be an integer >= {lo}, got {v!r}")
    if not (isinstance(min_lr_ratio, (int, float)) and 0.0 <= min_lr_ratio <= 1.0):
        raise ValueError(f"min_lr_ratio must be a number in [0, 1], got {min_lr_ratio!r}")


def lr_multiplier(step: int, *, total_steps: int, warmup_steps: int, schedule: str = "cosine",
                  min_lr_ratio: float = 0.0) -> float:
    """Learning rate of 0-based ``step`` as a fraction of the peak."""
    if warmup_steps and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    if schedule == "linear":
        return 1.0 - (1.0 - min_lr_ratio) * progress
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def warmup_steps_from_fraction(fraction: float, total_steps: int) -> int:
    """Warm-up length for a warm-up given as a share of the run (at least one step)."""
    if not (isinstance(fraction, (int, float)) and 0.0 <= fraction <= 1.0):
        raise ValueError(f"warmup must be a share of the steps in [0, 1], got {fraction!r}")
    return max(1, int(fraction * total_steps))


def build_optimizer(model, *, lr: float, weight_decay: float, betas: Iterable[float] = (0.9, 0.95),
                    eps: float = 1e-8, scale_offset_lr_mult: float = 1.0):
    """AdamW over :func:`param_groups`."""
    import torch

    if not (isinstance(lr, (int, float)) and lr > 0 and math.isfinite(lr)):
        raise ValueError(f"lr must be a finite number > 0, got {lr!r}")
    groups = param_groups(model, weight_decay, lr=lr, scale_offset_lr_mult=scale_offset_lr_mult)
    return torch.optim.AdamW(groups, lr=lr, betas=tuple(betas), eps=eps)


def build_scheduler(optimizer, *, total_steps: int, warmup_steps: int, schedule: str = "cosine",
                    min_lr_ratio: float = 0.0):
    """A ``LambdaLR`` of :func:`lr_multiplier`; call ``.step()`` once after every optimiser step.
    Its ``state_dict()`` holds plain numbers only (the multiplier is a ``functools.partial``
    of module-level code, rebuilt from the run's settings on resume)."""
    import torch

    check_schedule(total_steps=total_steps, warmup_steps=warmup_steps, schedule=schedule, min_lr_ratio=min_lr_ratio)
    fn = partial(lr_multiplier, total_steps=total_steps, warmup_steps=warmup_steps, schedule=schedule,
                 min_lr_ratio=min_lr_ratio)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, fn)

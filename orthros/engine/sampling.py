"""Token sampling on the device: greedy, temperature, top-k, top-p. No host synchronisation.

Sampling draws with the exponential-race trick (``argmax(p / E)``, ``E ~ Exp(1)``), which picks
index ``i`` with probability ``p_i`` and, unlike ``torch.multinomial``, never reads back to the
host, so a step can be queued ahead of the previous token's transfer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from ..utils import as_float, as_int

if TYPE_CHECKING:  # imported where used: SamplingParams' checks (orthros generate's options) need no torch
    import torch


@dataclass(frozen=True)
class SamplingParams:
    """``temperature == 0`` is greedy (argmax; top_k / top_p are then irrelevant).
    ``top_k == 0`` and ``top_p == 1`` switch those filters off. ``seed`` fixes the draws of a call: the same
    prompts, batched alike, give the same text. One generator serves the whole batch, so a prompt's text also
    depends on the other rows it is batched with (``--batch-size``, the order of ``--prompts``)."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: Optional[int] = None

    def __post_init__(self):
        # NumPy's numbers and 0-d tensors are numbers too (utils.as_float / as_int); each field is kept as a
        # Python float or int (a bool is no number here: True would be temperature 1)
        t = as_float(self.temperature)
        if t is None or not math.isfinite(t) or t < 0:
            raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {self.temperature!r}")
        k = as_int(self.top_k)  # NumPy's integers and 0-d integer tensors too (utils.as_int)
        if k is None or k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        p = as_float(self.top_p)
        if p is None or not (0.0 < p <= 1.0):
            raise ValueError(f"top_p must be a number in (0, 1] (1 = off), got {self.top_p!r}")
        seed = None if self.seed is None else as_int(self.seed)
        if self.seed is not None and (seed is None or not -2**63 <= seed < 2**64):  # torch.Generator's range
            raise ValueError(f"seed must be an integer in [-2**63, 2**64) or None, got {self.seed!r}")
        for name, value in (("temperature", float(t)), ("top_k", k), ("top_p", float(p)), ("seed", seed)):
            object.__setattr__(self, name, value)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def filter_logits(logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Mask (to -inf) everything outside the top-k and outside the smallest top-p nucleus.
    ``logits``: ``[B, V]`` float. The most likely token always survives."""
    import torch

    V = logits.shape[-1]
    if top_k and top_k < V:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # drop a token when the mass strictly before it already reaches top_p
        drop = (probs.cumsum(dim=-1) - probs) >= top_p
        drop[..., 0] = False  # the most likely token: a top_p that is 0 in float32 (1e-300) dropped it too (a NaN row)
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.empty_like(logits).scatter_(-1, order, sorted_logits)
    return logits


def sample(logits: torch.Tensor, params: SamplingParams, generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """Next token of every row: ``logits [B, V]`` -> ``[B]`` int64, on the logits' device."""
    import torch

    if params.greedy:
        return logits.argmax(dim=-1)
    logits = logits.float()
    # the row's maximum first: a temperature so small that max / t overflows would otherwise give
    # inf - inf = NaN in the softmax; now the maximum is 0 and everything below it goes to -inf
    # and times 1 / t, not over t: CUDA divides by a Python number as times its float32 reciprocal, which is inf
    # for t < ~3e-39 (0 * inf = NaN at the maximum). So the reciprocal is clamped to float32's normal range: past
    # its largest it would be inf, and for t > ~7e44 it would be 0, which makes a filtered -inf NaN (-inf * 0)
    f32 = torch.finfo(torch.float32)
    scale = min(max(1.0 / params.temperature, f32.tiny), f32.max)
    logits = (logits - logits.amax(dim=-1, keepdim=True)) * scale
    logits = filter_logits(logits, params.top_k, params.top_p)
    probs = torch.softmax(logits, dim=-1)
    # the exponential race (argmax of p / E, E ~ Exp(1), draws with probabilities p). CUDA's draw can be an
    # exact 0 (pytorch#20179): 0 / 0 = NaN, which argmax takes over the row's maximum; clamped finite and positive
    tiny, big = torch.finfo(probs.dtype).tiny, torch.finfo(probs.dtype).max
    race = torch.empty_like(probs).exponential_(generator=generator).clamp_(tiny, big)
    return (probs / race).argmax(dim=-1)


__all__ = ["SamplingParams", "sample", "filter_logits"]

"""The four paradigms of paper Section 3.2 as one choice: which positions get an output token.

Pre-training (T_in = 0, T_out = T), SFT (T_out = answer tokens), prefill (T_out = 1) and decode
(T = T_out = 1, with a cache) differ only in this set. Nothing else in the code branches on a
"mode": :func:`resolve_output_positions` turns (labels / logits_to_keep / explicit positions)
into positions and the model does the same thing for all of them.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..layers.step import check_position_values
from ..ops.attention import as_int_tensor


def resolve_output_positions(
    seq_len: int,
    *,
    labels: Optional[torch.Tensor] = None,
    logits_to_keep=0,
    output_positions=None,
    device=None,
) -> torch.Tensor:
    """Output positions within the current input, as int64 ``[1 or B, T_out]``, strictly increasing.

    Priority: explicit ``output_positions``; else ``labels`` (HF convention: position t is scored
    against ``labels[:, t+1]``, so t is an output position where that label is not -100, in any
    row of the batch); else ``logits_to_keep`` (an int k > 0: the last k positions, or a 1-D
    tensor of indices); else every position (the PT form, ``logits`` of shape ``[B, T, V]``).
    """
    if output_positions is not None:
        return _checked_positions(output_positions, seq_len, device, "output_positions")
    if labels is not None:
        if labels.dim() != 2 or labels.shape[1] != seq_len:
            raise ValueError(f"labels must be [B, T] = [*, {seq_len}] like input_ids, got {tuple(labels.shape)}")
        scored = (labels[:, 1:] != -100).any(dim=0)  # position t scored against labels[t+1]
        return torch.nonzero(scored).view(1, -1).to(device)
    if isinstance(logits_to_keep, torch.Tensor):
        return _checked_positions(logits_to_keep, seq_len, device, "logits_to_keep")
    if isinstance(logits_to_keep, bool) or not isinstance(logits_to_keep, int) or logits_to_keep < 0:
        raise ValueError(f"logits_to_keep must be an int >= 0 or a tensor of positions, got {logits_to_keep!r}")
    k = seq_len if logits_to_keep == 0 else min(logits_to_keep, seq_len)
    return torch.arange(seq_len - k, seq_len, device=device).view(1, -1)


def _checked_positions(positions, seq_len: int, device, arg: str) -> torch.Tensor:
    """``positions`` (``[T_out]`` or ``[B, T_out]``) as int64 ``[1 or B, T_out]``; a ``ValueError``
    naming ``arg`` (the argument they came as) unless integers in ``[0, seq_len)``, strictly increasing."""
    pos = as_int_tensor(arg, positions, device, "integer positions [T_out] or [B, T_out]")  # ("ab", [1, None])
    if pos.dtype.is_floating_point or pos.dtype == torch.bool:
        raise ValueError(f"{arg} must be integers, got {pos.dtype}")
    pos = pos.long()
    pos = pos.view(1, -1) if pos.dim() == 1 else pos
    if pos.dim() != 2:
        raise ValueError(f"{arg} must be [T_out] or [B, T_out], got shape {tuple(pos.shape)}")
    check_position_values(pos, seq_len, arg)
    return pos

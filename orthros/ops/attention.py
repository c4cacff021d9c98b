"""The public Orthros attention op: argument checking, normalisation and backend dispatch.

One signature for every backend (the pure-PyTorch reference here, Triton kernels in
:mod:`orthros.ops.triton`). See :func:`orthros_attention`.
"""

from __future__ import annotations

import math
import numbers
from typing import Optional, Tuple

import torch

from ..utils import check_positive_int
from .backends import check_backend, use_triton
from .reference import full_attention_reference, orthros_attention_reference
from .sdpa import causal_attention_sdpa, window_attention_sdpa

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_tensor(name, t, ndim):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dims [B, T, H, D], got shape {tuple(t.shape)}")
    if t.dtype not in FLOAT_DTYPES:
        raise ValueError(f"{name} must be a floating tensor (fp16/bf16/fp32/fp64), got {t.dtype}")


def is_int_tensor(t: torch.Tensor) -> bool:
    """An integer dtype (not floating, complex or bool): what positions and document bounds hold."""
    return not (t.dtype.is_floating_point or t.is_complex() or t.dtype == torch.bool)


def as_int_tensor(name: str, value, device, what: str) -> torch.Tensor:
    """``value`` (a tensor, list or array) as a tensor on ``device``; what torch cannot read as one
    (a string, a ragged list, ``None`` inside) is a ``ValueError`` naming ``name`` and ``what`` it must be,
    not torch's ``TypeError``/``RuntimeError`` that names neither. The dtype is the caller's to check."""
    try:
        return torch.as_tensor(value, device=device)
    except (TypeError, ValueError, RuntimeError) as e:
        raise ValueError(f"{name} must be {what}, got {type(value).__name__} {value!r:.80} ({e})") from None


def check_scale(scale, op: str = ""):
    """``scale`` (the softmax scale) must be ``None`` or a finite real number: a string or a
    tensor would fail deep in a kernel, a NaN/inf would silently make every output NaN. ``op``:
    the message's prefix (``"gated_delta_rule: "``)."""
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, numbers.Real)
                              or not math.isfinite(scale)):
        raise ValueError(f"{op}scale must be None (1 / sqrt(D)) or a finite real number, got {scale!r}")


def normalize_output_positions(output_positions, B: int, T_out: int, T_k: int, device) -> torch.Tensor:
    """Return output positions as an int64 tensor ``[B or 1, T_out]``, validated.

    ``None`` means the last ``T_out`` key positions. A 1-D tensor/list applies to every row; a
    2-D tensor gives each row its own positions. Positions must be strictly increasing and in
    ``[0, T_k)``.
    """
    if output_positions is None:
        return torch.arange(T_k - T_out, T_k, device=device).view(1, T_out)
    pos = as_int_tensor("output_positions", output_positions, device, "integer positions [T_out] or [B, T_out]")
    if pos.numel() and not is_int_tensor(pos):  # [] is float32
        raise ValueError(f"output_positions must be an integer tensor, got {pos.dtype}")
    given = tuple(pos.shape)
    pos = pos.long()
    if pos.dim() == 1:
        pos = pos.view(1, -1)
    if pos.dim() != 2 or pos.shape[1] != T_out or pos.shape[0] not in (1, B):
        raise ValueError(f"output_positions must have shape [T_out] or [B, T_out] = [{T_out}] or [{B}, {T_out}] "
                         f"(one position per output query of q_out), got {given}")
    if pos.numel():  # T_out or B may be 0
        if int(pos.min()) < 0 or int(pos.max()) >= T_k:
            raise ValueError(f"output_positions must lie in [0, {T_k}) (key positions), got range "
                             f"[{int(pos.min())}, {int(pos.max())}]")
        if T_out > 1 and not bool((pos[:, 1:] > pos[:, :-1]).all()):
            raise ValueError("output_positions must be strictly increasing along each row")
    return pos


def _show_ints(t: torch.Tensor, edge: int = 5) -> str:
    """A 1-D integer tensor for an error message: whole when short, else its first and last ``edge``."""
    v = t.tolist()
    return str(v) if len(v) <= 2 * edge + 2 else f"[{', '.join(map(str, v[:edge]))}, ..., " \
        f"{', '.join(map(str, v[-edge:]))}] ({len(v)} values)"


def doc_ids_from_cu_seqlens(cu_seqlens, B: int, T_k: int, device) -> torch.Tensor:
    """Validate ``cu_seqlens`` (packed documents) and return the document id of each position."""
    if B != 1:
        raise ValueError(f"cu_seqlens (packed documents) requires batch size 1, got B={B}")
    cu = as_int_tensor("cu_seqlens", cu_seqlens, device, "a 1-D integer tensor [num_docs + 1]")
    if cu.dim() != 1 or cu.numel() < 2 or not is_int_tensor(cu):
        raise ValueError(f"cu_seqlens must be a 1-D integer tensor [num_docs + 1], got {cu.dtype} {tuple(cu.shape)}")
    cu = cu.long()
    if int(cu[0]) != 0 or int(cu[-1]) != T_k:  # was "got [0, 4]...4" for [0, 4]
        raise ValueError(f"cu_seqlens must start at 0 and end at the sequence length {T_k}, got {_show_ints(cu)}")
    if not bool((cu[1:] > cu[:-1]).all()):
        i = int((cu[1:] <= cu[:-1]).nonzero()[0]) + 1  # the first bound that does not rise (read on failure only)
        raise ValueError(f"cu_seqlens must be strictly increasing (no empty documents): {int(cu[i - 1])} then "
                         f"{int(cu[i])} at index {i}, got {_show_ints(cu)}")
    return torch.searchsorted(cu[1:], torch.arange(T_k, device=device), right=True)


def orthros_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_out: torch.Tensor,
    *,
    window_size: int,
    output_positions=None,
    cu_seqlens=None,
    scale: Optional[float] = None,
    backend: str = "auto",
    kv_start: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Orthros attention: a sliding-window stream over every token plus a full-attention
    stream at output positions, sharing K and V.

    Args:
        q: ``[B, T, Hq, D]`` base-stream queries.
        k, v: ``[B, T_k, Hkv, D]`` keys and values with ``Hq % Hkv == 0``. Normally
            ``T_k == T``; with a KV cache ``T_k > T`` and the queries are the *last* ``T``
            positions (decode / continuation).
        q_out: ``[B, T_out, Hq, D]`` output-stream queries.
        window_size: ``w >= 1``; ``o[t]`` attends to keys ``t-w+1 .. t`` (w keys incl. itself).
        output_positions: absolute key position of each output query, ``[T_out]`` or
            ``[B, T_out]``, strictly increasing; default the last ``T_out`` positions.
            ``o_out[i]`` attends to keys ``0 .. output_positions[i]``.
        cu_seqlens: ``[N + 1]`` cumulative document lengths for packed sequences (``B == 1``);
            no attention crosses a document boundary.
        scale: softmax scale, default ``1 / sqrt(D)``.
        backend: ``"auto"`` (Triton kernels on CUDA when they support the input, else
            ``"sdpa"``), ``"sdpa"`` (PyTorch SDPA fast paths: the window stream blockwise, the
            full stream as causal attention when every position has an output query, the
            reference otherwise), ``"reference"`` (pure PyTorch, the specification) or
            ``"triton"``.
        kv_start: ``[B]`` first valid key of each row (left padding), in ``[0, T_k]``; keys
            before it are masked out (their values must be finite: a NaN / inf value there still
            reaches the output through its zero weight).

    Returns:
        ``(o, o_out)`` with shapes ``[B, T, Hq, D]`` and ``[B, T_out, Hq, D]``.
    """
    check_tensor("q", q, 4)
    check_tensor("k", k, 4)
    check_tensor("v", v, 4)
    check_tensor("q_out", q_out, 4)
    check_backend(backend)
    window_size = check_positive_int("window_size", window_size)
    B, T, Hq, D = q.shape
    Bk, T_k, Hkv, Dk = k.shape
    if v.shape != k.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if Bk != B or Dk != D:
        raise ValueError(f"k must be [B={B}, T_k, Hkv, D={D}], got {tuple(k.shape)}")
    if q_out.shape[0] != B or q_out.shape[2] != Hq or q_out.shape[3] != D:
        raise ValueError(f"q_out must be [B={B}, T_out, Hq={Hq}, D={D}], got {tuple(q_out.shape)}")
    if Hq == 0 or Hkv == 0 or Hq % Hkv != 0:
        raise ValueError(f"query heads ({Hq}) must be a positive multiple of key/value heads ({Hkv}) (GQA)")
    if D == 0:
        raise ValueError(f"the head dim D of q, k, v, q_out must be >= 1, got shape {tuple(q.shape)}")
    if T_k < T:
        raise ValueError(f"k/v must cover at least the query length: T_k={T_k} < T={T}")
    T_out = q_out.shape[1]
    if T_out > T_k:
        raise ValueError(f"q_out has T_out={T_out} output positions but k/v have only T_k={T_k} positions")
    if not (q.dtype == k.dtype == v.dtype == q_out.dtype):
        raise ValueError(f"q, k, v, q_out must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}, {q_out.dtype}")
    if not (q.device == k.device == v.device == q_out.device):
        raise ValueError(f"q, k, v, q_out must be on the same device, got {q.device}, {k.device}, {v.device}, "
                         f"{q_out.device}")
    check_scale(scale)
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    pos = normalize_output_positions(output_positions, B, T_out, T_k, q.device)
    doc_ids = None if cu_seqlens is None else doc_ids_from_cu_seqlens(cu_seqlens, B, T_k, q.device)
    if kv_start is not None:
        kv_start = as_int_tensor("kv_start", kv_start, q.device, "an integer tensor [B] (first valid key of each row)")
        if not is_int_tensor(kv_start):
            raise ValueError(f"kv_start must be an integer tensor [B] (first valid key of each row), got {kv_start.dtype}")
        if kv_start.dim() != 1 or kv_start.numel() != B:  # .view(-1) took [[1], [2]] and a 0-d tensor
            raise ValueError(f"kv_start must be a 1-D tensor [B={B}] (one first valid key per batch row), got shape "
                             f"{tuple(kv_start.shape)}")
        kv_start = kv_start.long()
        if B and (int(kv_start.min()) < 0 or int(kv_start.max()) > T_k):
            raise ValueError(f"kv_start must lie in [0, {T_k}] (the first valid key of each row; {T_k}: no key), "
                             f"got range [{int(kv_start.min())}, {int(kv_start.max())}]")

    o, o_out = run_attention(q, k, v, q_out, window_size=window_size, output_positions=pos, scale=scale,
                             doc_ids=doc_ids, kv_start=kv_start, backend=backend)
    # contiguous on every backend, as the Triton kernels write them (the reference's and SDPA's float32 o was a view
    # of the padded key blocks: o.view(B, T, -1) worked on a GPU and failed on the CPU); run_attention, the model's
    # path, leaves that to the layer, which copies the rows anyway
    return o.contiguous(), o_out.contiguous()


def run_attention(q, k, v, q_out, *, window_size: int, output_positions: torch.Tensor, scale: float,
                  doc_ids=None, kv_start=None, backend: str = "auto"):
    """:func:`orthros_attention` on inputs that are already checked and normalised: positions as
    int64 ``[1 or B, T_out]``, ``doc_ids`` from :func:`doc_ids_from_cu_seqlens`, ``kv_start`` int64
    ``[B]``, a float ``scale``. For callers that validate once per forward rather than once per
    layer (the model): it does no host synchronisation of its own."""
    pos, T_out, T_k = output_positions, q_out.shape[1], k.shape[1]
    if use_triton(backend, q, k, "orthros_attention"):  # before the import: triton may not be installed
        from .triton import orthros_attention_triton

        return orthros_attention_triton(q, k, v, q_out, window_size=window_size, output_positions=pos,
                                         scale=scale, doc_ids=doc_ids, kv_start=kv_start)
    if backend in ("auto", "sdpa"):  # "auto" the kernels do not take; "triton" they do not run: the reference
        o = window_attention_sdpa(q, k, v, window_size=window_size, scale=scale, doc_ids=doc_ids, kv_start=kv_start)
        if T_out == T_k and doc_ids is None and kv_start is None:
            # an output query at every position (strictly increasing in [0, T_k): exactly
            # 0..T_k-1) is plain causal attention
            return o, causal_attention_sdpa(q_out, k, v, scale=scale)
        return o, full_attention_reference(q_out, k, v, pos, scale=scale, doc_ids=doc_ids, kv_start=kv_start)
    return orthros_attention_reference(q, k, v, q_out, window_size=window_size, output_positions=pos,
                                       scale=scale, doc_ids=doc_ids, kv_start=kv_start)


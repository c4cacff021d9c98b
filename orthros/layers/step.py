"""What one forward hands every layer: :class:`StepInputs`, and the KV cache protocol.

Every execution path (the HF model, the engine's prefill and decode, sequence-parallel
prefill) runs the same decoder-layer step (``OrthrosDecoderLayer.forward``). What differs
between them is only *where the keys live and which kernel reads them*, and that is the
cache object's business:

* ``cache.update(layer_idx, k, v) -> (k_all, v_all)`` writes the base tokens' K/V ``[B, T, Hkv, D]``
  and returns what attention reads (gpt-fast's ``KVCache.update``: callers never index cache
  tensors themselves);
* ``cache.attend(q, q_full, k_all, v_all, step, every=..., window_size=..., scale=..., backend=...)
  -> o`` runs the window stream for ``q`` (``[B, T, Hq, D]`` base-row queries, or ``None``) and
  the full stream for ``q_full`` (output queries, or ``None``); ``every=True`` says ``q_full``
  has a query at *every* base row of this step (a causal Transformer layer), otherwise at
  ``step``'s output positions. ``o`` is what ``W_O`` reads: the window rows (when ``q`` is
  given) followed by the full-stream rows (when ``q_full`` is), one ``[B, T + T_out, Hq, D]``
  tensor (:func:`stack_rows`), so a kernel that writes both streams into one buffer (the
  engine's decode) hands it over without a copy;
* optional, ``cache.write_slot(layer_idx) -> slot or None`` and ``cache.write(slot, k, v)``: a
  cache whose write is a small scatter (the engine's decode view) hands the layer's buffers to
  the step's first token-wise piece, which writes the K/V there itself, so under
  ``torch.compile`` the write fuses with the RoPE that produced K (no kernels of its own);
  ``update`` then only returns the buffers. A cache without ``write_slot`` writes in ``update``;
* optional, ``cache.qkv_kernel`` (True) and ``cache.attend_qkv(layer_idx, qkv, keep=..., backend=...,
  **prologue)``: a cache whose kernel runs the q/k norms, scale-offset, RoPE and the K/V write
  itself (the engine's decode view under ``Engine(qkv_kernel)``) takes the fused QKV
  projection's raw rows instead (:class:`orthros.layers.attention.RawQKV`); it then hands out no
  write slot, and a layer that does not use it is written by ``update``.

:class:`DenseKV` is the HF path's cache (whole sequences, optionally an HF ``Cache``); the
engine's static cache and the sequence-parallel shard cache implement the same two methods.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from ..ops import run_attention as _run_attention

# The op runs its own kernels (Triton, SDPA or the reference). Under torch.compile of a layer
# (``train.compile``) everything around it is fused and the op is called as it is: Inductor
# must not re-trace the window blocking or the Triton autograd functions.
run_attention = torch.compiler.disable(_run_attention)


def call(fn, *args):
    """How a step runs its token-wise pieces by default: directly."""
    return fn(*args)


@dataclass
class StepInputs:
    """Everything about the current forward that is the same for every layer.

    ``h`` holds ``n_base`` base tokens, followed (``output_tokens``: the model has an output
    stream, paper Algorithm 2) by one output token per output position. ``out_rel [1 or B,
    T_out]`` are the output positions within this step's base rows; ``output_positions`` the
    same as absolute key positions (a cache included; ``None``: :class:`DenseKV` derives them,
    the base rows being the last ``n_base`` keys). ``mode`` (one of ``ATTENTION_MODES``, no
    alias) overrides the attention mode of every attention layer (the engine runs the same
    weights as a Transformer); ``None`` keeps each layer's configured kind. ``run(fn, *args)``
    runs the token-wise pieces of the step (the engine passes a ``torch.compile`` dispatcher).
    ``gemv`` (the engine's decode under ``Engine(gemv=True)``): the projections run as
    :func:`orthros.layers.common.linear` GEMVs with their norms, activation and residual adds
    fused in; ``None``: op by op."""

    n_base: int
    rope_base: tuple  # (cos, sin) [B or 1, n_base, R]
    rope_out: tuple  # (cos, sin) [B or 1, T_out, R] at the output positions
    out_rel: torch.Tensor
    output_tokens: bool
    cache: object
    output_positions: Optional[torch.Tensor] = None
    doc_ids: Optional[torch.Tensor] = None  # [T] document of each position (packed documents)
    cu_seqlens: Optional[torch.Tensor] = None
    kv_start: Optional[torch.Tensor] = None  # [B] first valid key (left padding)
    pad_rows: Optional[torch.Tensor] = None  # [B, n_base] bool: this step's left-padding rows (GDN layers zero them)
    mode: Optional[str] = None
    run: Callable = field(default=call)
    gemv: Optional[str] = None  # a backend of orthros.ops.gemv: the step's projections as fused GEMVs (decode)

    def write_slot(self, layer_idx: int):
        """The cache's buffers for layer ``layer_idx``'s K/V write in its token-wise piece, or
        ``None`` (the cache writes in ``update``; see the module docstring)."""
        ws = getattr(self.cache, "write_slot", None)
        return None if ws is None else ws(layer_idx)

    @property
    def n_out(self) -> int:
        return self.out_rel.shape[1]

    def gather_out_rows(self, x: torch.Tensor) -> torch.Tensor:
        """Rows of ``x [B, n_base, ...]`` at the output positions."""
        return gather_rows(x, self.out_rel)

    def output_rows(self, h: torch.Tensor) -> torch.Tensor:
        """The rows the logits are computed from: the output tokens, or (no output stream) the
        base rows at the output positions."""
        return h[:, self.n_base:] if self.output_tokens else self.gather_out_rows(h[:, :self.n_base])

    def check_rows(self, x: torch.Tensor, rope: bool = False) -> None:
        """A mixer's ``forward`` (outside the layer step: tests, tools) takes ``x [B, rows, d]``
        of :meth:`with_output_tokens`' rows and (``rope``: a layer that reads them) RoPE tables
        of ``n_base`` and ``T_out`` rows; ``ValueError`` otherwise (the pieces would drop or
        broadcast the output stream's rows, or rotate every row by one table row, without a word)."""
        rows = self.n_base + (self.n_out if self.output_tokens else 0)
        if x.dim() != 3 or x.shape[1] != rows:
            what = f" + T_out = {self.n_out} output tokens" if self.output_tokens else " (no output tokens)"
            raise ValueError(f"x must have {rows} rows (n_base = {self.n_base} base tokens{what}) as [B, rows, "
                             f"hidden], got {' x '.join(map(str, x.shape))}")
        check_position_values(self.out_rel, self.n_base, "StepInputs.out_rel")
        for name, table, n in (("rope_base", self.rope_base, self.n_base), ("rope_out", self.rope_out, self.n_out)):
            if rope and n and any(t.dim() != 3 or t.shape[1] != n for t in table):
                raise ValueError(f"StepInputs.{name} must be (cos, sin) of [B or 1, {n}, R] (one row per "
                                 f"{'base row' if name == 'rope_base' else 'output position'}), got "
                                 f"{[tuple(t.shape) for t in table]}")

    def with_output_tokens(self, h: torch.Tensor) -> torch.Tensor:
        """Algorithm 2: append a copy of the base embedding at every output position."""
        return append_output_tokens(h, self.out_rel, self.output_tokens)


def check_position_values(pos: torch.Tensor, seq_len: int, arg: str) -> None:
    """Output positions ``pos [1 or B, T_out]`` (integers) must lie in ``[0, seq_len)``, strictly
    increasing along each row: a ``ValueError`` naming ``arg`` otherwise (a repeated or unordered
    position gave wrong readouts in a GDN layer, one out of range an index error or, in an
    attention layer, keys it should not see). Reads the values (a host sync on CUDA): the model
    checks once per forward (``orthros/models/positions.py``), a mixer's own ``forward`` once per
    call; the layer step and the ops run unchecked."""
    if pos.numel() and (int(pos.min()) < 0 or int(pos.max()) >= seq_len):
        raise ValueError(f"{arg} must lie in [0, {seq_len}), got [{int(pos.min())}, {int(pos.max())}]")
    if pos.dim() == 2 and pos.shape[1] > 1 and not bool((pos[:, 1:] > pos[:, :-1]).all()):
        raise ValueError(f"{arg} must be strictly increasing")


def gather_rows(x: torch.Tensor, rel: torch.Tensor) -> torch.Tensor:
    """Rows ``rel [1 or B, T_out]`` of ``x [B, T, ...]`` along dim 1: ``[B, T_out, ...]``."""
    idx = rel.expand(x.shape[0], -1)
    idx = idx.view(*idx.shape, *([1] * (x.dim() - 2))).expand(-1, -1, *x.shape[2:])
    return torch.gather(x, 1, idx)


def append_output_tokens(h: torch.Tensor, out_rel: torch.Tensor, output_tokens: bool) -> torch.Tensor:
    """Algorithm 2 (:meth:`StepInputs.with_output_tokens`, which a compiled piece that runs before
    its step exists calls as this function): with ``output_tokens``, a copy of the base
    embedding ``h [B, n_base, d]`` at every output position ``out_rel`` appended along dim 1."""
    return torch.cat([h, gather_rows(h, out_rel)], dim=1) if output_tokens else h


class DenseKV:
    """The HF model's cache: the K/V of whole sequences, appended to an HF ``Cache`` when one is
    given (layout ``[B, Hkv, L, D]`` inside it), attention through :func:`orthros.ops.run_attention`."""

    def __init__(self, cache=None):
        self.cache = cache

    def linear_state(self, layer_idx: int):
        """A GDN layer's (conv, recurrent) state from the HF cache (``OrthrosCache``), or None."""
        if self.cache is None:
            return None
        if not hasattr(self.cache, "linear_state"):
            raise TypeError(f"a model with linear_attention (Gated DeltaNet) layers keeps their states in an "
                            f"OrthrosCache, got a {type(self.cache).__name__} (pass no cache, or "
                            f"orthros.models.OrthrosCache())")
        return self.cache.linear_state(layer_idx)

    def set_linear_state(self, layer_idx: int, conv_state, recurrent_state):
        if self.cache is not None:
            self.cache.set_linear_state(layer_idx, conv_state, recurrent_state)

    def update(self, layer_idx: int, k: torch.Tensor, v: torch.Tensor):
        if self.cache is None:
            return k, v
        kc, vc = self.cache.update(k.transpose(1, 2), v.transpose(1, 2), layer_idx)
        return kc.transpose(1, 2), vc.transpose(1, 2)

    def attend(self, q, q_full, k, v, step: StepInputs, *, every: bool, window_size: int, scale: float, backend: str):
        empty = (q if q is not None else q_full)[:, :0]
        if every:  # a query at every base row: the last n_base key positions
            T_k = k.shape[1]
            pos = torch.arange(T_k - step.n_base, T_k, device=k.device).view(1, -1)
        else:
            pos = step.output_positions
            if pos is None:  # a step built by hand: the base rows are the last n_base keys
                pos = step.out_rel + (k.shape[1] - step.n_base)
            pos = pos if q_full is not None else pos[:, :0]
        # inputs were validated once per forward by the model: the op's per-call checks (host
        # syncs) are skipped here
        o, o_full = run_attention(empty if q is None else q, k, v, empty if q_full is None else q_full,
                                  window_size=window_size, output_positions=pos, scale=scale,
                                  doc_ids=step.doc_ids, kv_start=step.kv_start, backend=backend)
        return stack_rows(o if q is not None else None, o_full if q_full is not None else None)


def stack_rows(o: Optional[torch.Tensor], o_full: Optional[torch.Tensor]) -> torch.Tensor:
    """The rows ``W_O`` reads (the ``cache.attend`` protocol): the window stream's rows, then the
    full stream's, along dim 1 (a copy only when both are given)."""
    if o is None or o_full is None:
        return o_full if o is None else o
    return torch.cat([o, o_full], dim=1)


__all__ = ["StepInputs", "DenseKV", "call", "run_attention", "stack_rows"]

"""The engine's static KV cache: pre-allocated once, never resized, never evicted.

Per layer ``k[i], v[i]`` are ``[B_max, L_max, Hkv, D]``; ``seqlens`` (``[B_max]`` int64, on the
device) is the number of valid tokens of each row. Rows may hold different lengths: the
attention ops mask by ``seqlens``, so nothing past a row's length is ever read. Only the base
stream writes K/V (output tokens never do), and every token is kept: the output stream
attends to all of them.

The layer step reaches the cache through a *view* bound to the current forward (the protocol
of :mod:`orthros.layers.step`: ``update`` writes the step's K/V, ``attend`` runs the kernels
over what the view covers):

* :meth:`StaticKVCache.prefill_view` -- rows ``r0:r1``, a chunk of ``T`` tokens at ``P``;
* :meth:`StaticKVCache.decode_view` -- rows ``0:bs``, one token per row at ``lens`` (device
  tensors only: CUDA-graph capturable), over cache slots ``[0, span)``. Its write is a scatter
  of one token per row that the layer step runs inside its first token-wise piece
  (``write_slot`` / ``write``): compiled, it is part of the kernel that applies RoPE to K,
  instead of two ``index_put`` kernels per layer. With ``qkv_kernel`` it goes further: an
  attention layer hands the raw QKV projection to :meth:`DecodeView.attend_qkv`, whose kernel
  applies the q/k norms, scale-offset and RoPE, writes the token's K/V and attends, all in one
  launch (:func:`orthros.ops.decode.orthros_decode_qkv_attention`).
"""

from __future__ import annotations

import functools

import torch

from ..layers.step import stack_rows
from ..ops import orthros_attention
from ..ops.decode import orthros_decode_attention, orthros_decode_qkv_attention


def linear_layers(model) -> dict:
    """The ``linear`` argument of :class:`StaticKVCache` for an ``OrthrosForCausalLM``: the
    state sizes of each of its GDN layers (none in a model of attention layers only)."""
    return {i: (layer.mixer.conv_dim, layer.mixer.conv_kernel_size, layer.mixer.num_v_heads,
                layer.mixer.head_k_dim, layer.mixer.head_v_dim)
            for i, layer in enumerate(model.model.layers) if hasattr(layer, "linear_attn")}


class StaticKVCache:
    """``linear``: ``{layer_idx: (conv_dim, conv_kernel, num_v_heads, k_dim, v_dim)}`` of the GDN
    layers (Orthros-H): they get no K/V (``k[i] is v[i] is None``) but a convolution window
    ``conv[i] [B_max, conv_dim, kernel - 1]`` (model dtype) and a recurrent state ``rec[i]
    [B_max, HV, K, V]`` (float32), both updated in place (CUDA-graph friendly)."""

    def __init__(self, num_layers: int, max_batch_size: int, max_seq_len: int, num_kv_heads: int, head_dim: int,
                 *, dtype: torch.dtype, device, linear=None):
        shape = (max_batch_size, max_seq_len, num_kv_heads, head_dim)
        linear = linear or {}
        kv = lambda i: None if i in linear else torch.zeros(shape, dtype=dtype, device=device)  # noqa: E731
        self.k = [kv(i) for i in range(num_layers)]
        self.v = [kv(i) for i in range(num_layers)]
        self.conv = [None] * num_layers
        self.rec = [None] * num_layers
        for i, (c, w, hv, dk, dv) in linear.items():
            self.conv[i] = torch.zeros(max_batch_size, c, w - 1, dtype=dtype, device=device)
            self.rec[i] = torch.zeros(max_batch_size, hv, dk, dv, dtype=torch.float32, device=device)
        self.seqlens = torch.zeros(max_batch_size, dtype=torch.long, device=device)
        self.max_batch_size = max_batch_size
        self.max_seq_len = max_seq_len

    @property
    def nbytes(self) -> int:
        """Bytes of the K/V tensors (the attention layers' share)."""
        return sum(t.numel() * t.element_size() for t in self.k + self.v if t is not None)

    @property
    def state_nbytes(self) -> int:
        """Bytes of the GDN layers' convolution windows and recurrent states (fixed per row)."""
        return sum(t.numel() * t.element_size() for t in self.conv + self.rec if t is not None)

    def save_linear(self, rows) -> list:
        """A copy of every GDN state of ``rows``: ``bs`` for rows ``0:bs`` (a CUDA-graph capture runs
        decode steps), or a list of row indices (a row that stopped while its batch goes on)."""
        idx = slice(0, rows) if isinstance(rows, int) else rows
        return [(c[idx].clone(), r[idx].clone()) for c, r in zip(self.conv, self.rec) if c is not None]

    def restore_linear(self, rows, saved) -> None:
        """Put back a :meth:`save_linear` copy of the same ``rows``."""
        idx = slice(0, rows) if isinstance(rows, int) else rows
        it = iter(saved)
        for c, r in zip(self.conv, self.rec):
            if c is not None:
                sc, sr = next(it)
                c[idx] = sc
                r[idx] = sr

    def bytes_per_token(self) -> int:
        """K+V bytes one token occupies over all layers."""
        return self.nbytes // (self.max_batch_size * self.max_seq_len)

    def prefill_view(self, r0: int, r1: int, P: int, T: int, window: int) -> "PrefillView":
        return PrefillView(self, r0, r1, P, T, window)

    def decode_view(self, rows: torch.Tensor, lens: torch.Tensor, span: int, qkv_kernel: bool = False) -> "DecodeView":
        return DecodeView(self, rows, lens, span, qkv_kernel)


class PrefillView:
    """Rows ``r0:r1`` of the cache, prefilling tokens ``P .. P + T - 1`` (the same for every row)."""

    out_last = True  # the engine's prefill predicts at most at the chunk's last token

    def __init__(self, cache: StaticKVCache, r0: int, r1: int, P: int, T: int, window: int):
        self.cache, self.r0, self.r1, self.P, self.T = cache, r0, r1, P, T
        self.win0 = max(0, P - window + 1)  # first key any window query of this chunk can see

    def update(self, i: int, k, v):
        r0, r1, P, T = self.r0, self.r1, self.P, self.T
        kc, vc = self.cache.k[i], self.cache.v[i]
        kc[r0:r1, P:P + T] = k
        vc[r0:r1, P:P + T] = v
        return kc[r0:r1, :P + T], vc[r0:r1, :P + T]

    def linear_state(self, i: int):
        if self.P == 0:  # a sequence start: zero states
            return None
        return self.cache.conv[i][self.r0:self.r1], self.cache.rec[i][self.r0:self.r1]

    def set_linear_state(self, i: int, conv, rec):
        self.cache.conv[i][self.r0:self.r1].copy_(conv)
        self.cache.rec[i][self.r0:self.r1].copy_(rec)

    def attend(self, q, q_full, k, v, step, *, every: bool, window_size: int, scale: float, backend: str):
        # the queries are the last positions of k/v; the full stream's default positions (the
        # last T_out keys) are the chunk's last token, or every chunk position when `every`
        if q_full is None:  # window stream only: its keys start at win0
            o, _ = orthros_attention(q, k[:, self.win0:], v[:, self.win0:], q[:, :0], window_size=window_size,
                                     scale=scale, backend=backend)
            return o
        o, o_full = orthros_attention(q_full[:, :0] if q is None else q, k, v, q_full, window_size=window_size,
                                      scale=scale, backend=backend)
        return stack_rows(None if q is None else o, o_full)


class DecodeView:
    """Rows ``0:bs`` of the cache, one new token per row written at ``lens`` (static shapes).
    ``qkv_kernel``: attention layers may hand their raw QKV projection to :meth:`attend_qkv`
    (the layer decides, :class:`orthros.layers.attention.RawQKV`); a layer that does not is
    written by :meth:`update`."""

    def __init__(self, cache: StaticKVCache, rows, lens, span: int, qkv_kernel: bool = False):
        self.cache, self.rows, self.lens, self.span = cache, rows, lens, span
        self.qkv_kernel = qkv_kernel
        self._slotted = set()  # layers whose K/V the token-wise piece writes (write_slot)

    @functools.cached_property
    def new_lens(self) -> torch.Tensor:
        """The rows' lengths once this step's token is written (computed at first use: the
        :meth:`attend_qkv` path reads ``lens`` only, and a step's launches cost time)."""
        return self.lens + 1

    def _buffers(self, i: int):
        bs = self.rows.shape[0]
        return self.cache.k[i][:bs, :self.span], self.cache.v[i][:bs, :self.span]

    def write_slot(self, i: int):
        """Layer ``i``'s cache rows for :meth:`write` (``None`` for a GDN layer: no K/V); from
        here on :meth:`update` of layer ``i`` leaves the writing to the caller of ``write``."""
        if self.cache.k[i] is None or self.qkv_kernel:  # GDN layer; or the kernel writes (else update)
            return None
        self._slotted.add(i)
        return self._buffers(i)

    def write(self, slot, k, v):
        """This step's token of every row (``k``, ``v`` ``[bs, 1, Hkv, D]``) into ``slot`` at ``lens``."""
        kc, vc = slot
        kc[self.rows, self.lens] = k[:, 0]
        vc[self.rows, self.lens] = v[:, 0]

    def linear_state(self, i: int):
        bs = self.rows.shape[0]  # the decode step updates these views of the buffers in place
        return self.cache.conv[i][:bs], self.cache.rec[i][:bs]

    def set_linear_state(self, i: int, conv, rec):
        bs = self.rows.shape[0]
        for buf, new in ((self.cache.conv[i][:bs], conv), (self.cache.rec[i][:bs], rec)):
            if new.data_ptr() != buf.data_ptr():
                buf.copy_(new)

    def update(self, i: int, k, v):
        slot = self._buffers(i)
        if i not in self._slotted:  # a caller that did not take the write into its own piece
            self.write(slot, k, v)
        return slot

    def attend(self, q, q_full, k, v, step, *, every: bool, window_size: int, scale: float, backend: str):
        # one kernel reads the cache once for both queries and writes both rows into one
        # [bs, 2, Hq, D] buffer (W_O's input as it is); a layer without one of the streams passes
        # the other query twice and keeps its own row
        o = orthros_decode_attention(q_full if q is None else q, q if q_full is None else q_full, k, v,
                                     self.new_lens, window_size=window_size, scale=scale, backend=backend,
                                     stacked=True)
        return o[:, 1:] if q is None else o[:, :1] if q_full is None else o

    def attend_qkv(self, i: int, qkv, *, keep, backend: str, **prologue):
        """Layer ``i``'s step from its raw QKV rows (``prologue``: the arguments of
        :func:`~orthros.ops.decode.orthros_decode_qkv_attention`): writes the token's K/V at
        ``lens`` and returns the rows of the streams ``keep = (window, full)`` keeps."""
        kc, vc = self._buffers(i)
        o = orthros_decode_qkv_attention(qkv, kc, vc, self.lens, backend=backend, **prologue)
        window, full = keep
        return o if window and full else o[:, :1] if window else o[:, 1:]


__all__ = ["StaticKVCache", "PrefillView", "DecodeView"]

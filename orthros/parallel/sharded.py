"""Sequence-parallel prefill and sharded decode of an :class:`~orthros.OrthrosForCausalLM`.

The prompt is split into contiguous shards, rank ``r`` holding tokens ``[s_r, e_r)``. Per layer:

1. every rank computes K/V of its own tokens (token-wise) into its shard of the KV cache;
2. the output query of the last prompt token (its hidden state is replicated: one token, every
   rank computes it) attends to the rank's local keys, giving a partial output and its
   log-sum-exp;
3. ONE ``all_gather`` per layer carries, from every rank, its last ``w - 1`` K/V rows (the halo
   its successors need: a halo crosses several shards when shards are shorter than the window)
   and its partial; while it is in flight the rank runs the window stream + MLP of the chunks
   whose window lies inside its own shard;
4. the chunks at the start of the shard get the halo; the partials merge exactly into the
   output query's attention (flash-decoding merge), identical on every rank.

Decode keeps the cache sharded: the new token's K/V is appended on the last rank, the window
query reads the replicated last ``w - 1`` keys (assembled during prefill from the gathered
tails, so it may span ranks, then rolled locally), and the output query merges per-rank
partials with one small ``all_gather`` per layer. No rank ever holds the whole context.

The layer loop calls the model's own layer step in pieces (``pre_attention``, the attention
module's ``keys_values`` / ``queries`` / ``o_proj``, ``post_attention``: the residual + MLP),
reordered because the halo exchange sits between a layer's K/V and its window stream; the
shard cache owns its writes (``update``). Orthros mode only; see ``docs/parallel.md``.
"""

from __future__ import annotations

import hashlib
import json
import weakref
from typing import List, Optional, Tuple

import torch

from ..models.modeling_orthros import warn_beyond_positions
from ..ops import orthros_attention
from ..utils import as_int, check_positive_int, check_token_ids
from .comm import ParallelContext
from ..ops.merge import acc_dtype, merge_partials, partial_attention


# the config fields that change what a rank computes: ranks that differ in one of them computed another model
# (silently, or aborted inside the backend on a gather of another size)
_MODEL_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "head_dim", "hidden_act", "rms_norm_eps", "attention_bias", "o_proj_bias",
                 "mlp_bias", "qk_norm", "window_size", "scale_offset", "attention_mode", "layer_types",
                 "attn_output_gate", "rope_parameters", "tie_word_embeddings")


# model -> (its parameters' identities and in-place versions, their sum of squares): the weights are read again
# only when a parameter was replaced or written to (load_state_dict, an optimizer step...)
_WEIGHTS_SQ: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def shard_bounds(seq_len: int, world_size: int) -> List[Tuple[int, int]]:
    """Contiguous, balanced shards ``[(s_r, e_r)]``: the first ``seq_len % world_size`` ranks hold
    one token more."""
    seq_len = check_positive_int("seq_len", seq_len)
    world_size = check_positive_int("world_size", world_size)
    if seq_len < world_size:
        raise ValueError(f"the prompt ({seq_len} token{'s' if seq_len != 1 else ''}) must have at least one token per rank "
                         f"({world_size} ranks)")
    base, rem = divmod(seq_len, world_size)
    out, s = [], 0
    for r in range(world_size):
        n = base + (1 if r < rem else 0)
        out.append((s, s + n))
        s += n
    return out


def halo_from_tails(tails: torch.Tensor, counts: List[int], upto: int, need: int) -> torch.Tensor:
    """The last ``need`` rows of the concatenation of the valid tails of ranks ``0 .. upto-1``.

    ``tails [R, B, W, ...]`` holds each rank's last ``counts[j] <= W`` rows right-aligned. Walking
    back from rank ``upto - 1``, whole short shards are taken until ``need`` rows are found, so
    the result is the contiguous run of positions just before rank ``upto``'s first token.
    """
    W = tails.shape[2]
    parts, got = [], 0
    for j in range(upto - 1, -1, -1):
        if got >= need:
            break
        take = min(counts[j], need - got)
        if take:
            parts.append(tails[j, :, W - take:])
        got += take
    if not parts:
        return tails.new_zeros((tails.shape[1], 0) + tuple(tails.shape[3:]))
    parts.reverse()
    return torch.cat(parts, dim=1)


class ShardedKVCache:
    """This rank's shard of the base-stream KV cache (every layer), plus, replicated on every
    rank, the last ``w - 1`` keys/values of the whole sequence (the decode window).

    ``k[i]``/``v[i]``: ``[B, capacity, Hkv, D]``, valid rows ``[:length]`` = tokens
    ``start .. start + length - 1``. New tokens are appended on the last rank only.
    """

    def __init__(self, num_layers: int, bounds, rank: int, reserve: int):
        self.num_layers = num_layers
        self.bounds = list(bounds)
        self.rank = rank
        self.start = bounds[rank][0]
        self.reserve = max(0, int(reserve))
        self.k: List[Optional[torch.Tensor]] = [None] * num_layers
        self.v: List[Optional[torch.Tensor]] = [None] * num_layers
        self.window_k: List[Optional[torch.Tensor]] = [None] * num_layers
        self.window_v: List[Optional[torch.Tensor]] = [None] * num_layers
        self.length = 0  # valid local rows
        self.seq_len = 0  # tokens in the whole sequence

    @property
    def is_last(self) -> bool:
        return self.rank == len(self.bounds) - 1

    def allocate(self, layer: int, B: int, n: int, Hkv: int, D: int, dtype, device):
        cap = n + (self.reserve if self.is_last else 0)
        self.k[layer] = torch.empty(B, cap, Hkv, D, dtype=dtype, device=device)
        self.v[layer] = torch.empty(B, cap, Hkv, D, dtype=dtype, device=device)

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor, start: Optional[int] = None):
        """Write ``k, v [B, n, Hkv, D]`` at local row ``start`` (prefill), or append them after
        the valid rows (``start=None``: decode, last rank). Returns the local K/V up to the
        written rows."""
        at = self.length if start is None else start
        end = at + k.shape[1]
        self.k[layer][:, at:end] = k
        self.v[layer][:, at:end] = v
        return self.k[layer][:, :end], self.v[layer][:, :end]

    def local(self, layer: int, extra: int = 0):
        n = self.length + extra
        return self.k[layer][:, :n], self.v[layer][:, :n]

    def ensure_capacity(self, more: int):
        """Grow every layer's buffer (last rank) so ``more`` tokens can be appended."""
        cap = self.k[0].shape[1]
        if self.length + more <= cap:
            return
        grow = max(more, self.reserve, 256)
        for i in range(self.num_layers):
            for buf in (self.k, self.v):
                t = buf[i]
                buf[i] = torch.cat([t[:, :self.length], t.new_empty(t.shape[0], cap - self.length + grow,
                                                                      *t.shape[2:])], dim=1)

    def nbytes(self) -> int:
        """Bytes of the valid K/V rows held by this rank."""
        total = 0
        for t in self.k + self.v:
            if t is not None:
                total += t[:, :self.length].numel() * t.element_size()
        return total


class ShardedOrthros:
    """Sequence-parallel inference of an Orthros model over the ranks of ``ctx``.

    Every rank holds the whole model (weights are replicated; the sequence is what is split) and
    calls the same methods with the same arguments. A world of one is the plain 1-GPU path.

    Args:
        model: an :class:`~orthros.OrthrosForCausalLM` with ``attention_mode == "orthros"``.
        ctx: the ranks sharing the sequence (default: the default process group, or one process).
        chunk_size: tokens per token-wise step (projections, window attention, MLP) within a
            shard: bounds activation memory at long contexts.
        key_chunk: keys per step of the output query's partial attention.
        reserve: spare cache rows on the last rank for decoded tokens (grown when exceeded).
    """

    def __init__(self, model, ctx: Optional[ParallelContext] = None, *, chunk_size: int = 32768,
                 key_chunk: int = 65536, reserve: int = 256):
        core = getattr(model, "model", None)
        if core is None or not hasattr(core, "layers") or not hasattr(model, "lm_head") or \
                not hasattr(model.config, "attention_mode"):  # another architecture's (Llama, ...)
            raise TypeError(f"model must be an OrthrosForCausalLM, got {type(model).__name__}")
        if model.config.attention_mode != "orthros" or any(t != "orthros_attention" for t in model.config.layer_types):
            kinds = sorted(set(model.config.layer_types))
            raise ValueError(f"sequence-parallel inference needs Orthros attention layers only (attention_mode="
                             f"'orthros', every layer 'orthros_attention'), got attention_mode="
                             f"{model.config.attention_mode!r} with layer types {kinds}")
        chunk_size = check_positive_int("chunk_size", chunk_size)
        key_chunk = check_positive_int("key_chunk", key_chunk)
        n = as_int(reserve)  # NumPy's integers and 0-d tensors too, not a bool
        if n is None or n < 0:
            raise ValueError(f"reserve must be an integer >= 0, got {reserve!r}")
        reserve = n
        if ctx is not None and not isinstance(ctx, ParallelContext):
            raise TypeError(f"ctx must be a ParallelContext or None, got {type(ctx).__name__}")
        self.model = model
        self.core = core
        self.ctx = ctx if ctx is not None else ParallelContext.from_group()
        if self.ctx.world_size > 1 and self.device.type != "cuda" and \
                torch.distributed.get_backend(self.ctx.group) == "nccl":  # failed as 'a peer rank exited, crashed...'
            raise ValueError(f"the model is on {self.device}, but the process group's backend is NCCL, which moves "
                             f"GPU tensors only: move the model to this rank's GPU (model.to('cuda'), after "
                             f"init_from_env() picked it)")
        self.chunk_size = chunk_size
        self.key_chunk = key_chunk
        self.reserve = reserve
        self.window = int(model.config.window_size)

    # ------------------------------------------------------------------ helpers
    @property
    def device(self):
        return self.core.embed_tokens.weight.device

    @property
    def dtype(self):
        return self.core.embed_tokens.weight.dtype

    def _rope(self, start: int, end: int):
        pos = torch.arange(start, end, device=self.device).view(1, -1)
        return self.core.rotary_emb(pos)

    def _pack(self, parts, B):
        acc = acc_dtype(self.dtype)
        return torch.cat([p.reshape(B, -1).to(acc) for p in parts], dim=1)

    def _window_chunk(self, layer, attn, h, cs, ce, kbuf, vbuf, halo, rope):
        """Window stream + o_proj + MLP of local tokens ``[cs, ce)``, updating ``h`` in place."""
        B = h.shape[0]
        wm1 = self.window - 1
        hc = h[:, cs:ce]
        q, gate = attn.queries(layer.pre_attention(hc), rope, "base", with_gate=True)
        lo = cs - wm1
        if lo >= 0:
            kk, vv = kbuf[:, lo:ce], vbuf[:, lo:ce]
        elif halo is None:  # rank 0: nothing before the shard
            kk, vv = kbuf[:, :ce], vbuf[:, :ce]
        else:
            hk, hv = halo
            keep = max(0, hk.shape[1] + lo)
            kk = torch.cat([hk[:, keep:], kbuf[:, :ce]], dim=1)
            vv = torch.cat([hv[:, keep:], vbuf[:, :ce]], dim=1)
        o, _ = orthros_attention(q, kk, vv, q[:, :0], window_size=self.window, backend=attn.backend)
        h[:, cs:ce] = layer.post_attention(hc, attn.o_proj(attn.gate_output(o, gate).reshape(B, ce - cs, -1)))

    def _check_ids(self, input_ids):
        if not isinstance(input_ids, torch.Tensor) or input_ids.dtype not in (torch.int32, torch.int64):
            got = input_ids.dtype if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__
            raise TypeError(f"input_ids must be an int32 or int64 torch.Tensor [B, T], got {got}")
        if input_ids.dim() == 1:
            input_ids = input_ids.view(1, -1)
        if input_ids.dim() != 2 or 0 in input_ids.shape:
            raise ValueError(f"input_ids must be [B, T] with B, T >= 1, got {tuple(input_ids.shape)}")
        check_token_ids(input_ids, self.model.config.vocab_size, "input_ids", on_cuda=True)
        if self.ctx.world_size > 1:
            self._check_same_prompt(input_ids)
        return input_ids

    def _model_key(self) -> Tuple[int, torch.Tensor]:
        """(a hash of the config fields that shape the computation and the dtype, the sum of squares of every
        weight in float64): what every rank's model must share. The weights are read (in slices, no copy of a
        large matrix), as a decode step reads them, once until a parameter is replaced, written to, moved or
        cast (``model.to`` / ``.half()`` swap ``p.data`` without a new version: its address and dtype change).
        A write into ``p.data`` in place is not seen (it bumps no version)."""
        cfg = self.model.config
        fields = {f: getattr(cfg, f, None) for f in _MODEL_FIELDS}
        text = json.dumps([fields, str(self.dtype)], sort_keys=True, default=str)
        cfg_hash = int.from_bytes(hashlib.sha256(text.encode()).digest()[:7], "little")
        params = list(self.model.parameters())
        versions = tuple((id(p), p._version, p.data_ptr(), p.dtype, p.device) for p in params)
        seen = _WEIGHTS_SQ.get(self.model)
        if seen is not None and seen[0] == versions:
            return cfg_hash, seen[1]
        sq = torch.zeros((), dtype=torch.float64, device=self.device)
        for p in params:
            for part in p.detach().reshape(-1).split(1 << 24):
                sq += torch.linalg.vector_norm(part, dtype=torch.float64).square()
        _WEIGHTS_SQ[self.model] = (versions, sq)
        return cfg_hash, sq

    def _check_same_prompt(self, ids):
        """Every rank must pass the same prompt: ranks of another length shard it differently (each
        rank's logits differ, silently), another batch breaks the gathers. The model must be the same too: another
        config (layers, window, dtype...) aborted the processes inside the backend or gave other logits without
        a word, other weights (random weights not seeded alike) other logits. One small gather of ``(B, T, a
        weighted sum of the tokens, a hash of the config, the weights' sum of squares)`` per prefill, the same
        ``ValueError`` on every rank."""
        ids = ids.to(self.device).long()
        weights = torch.arange(1, ids.numel() + 1, device=ids.device).view(ids.shape)
        cfg_hash, sq = self._model_key()
        cfg = self.model.config
        dtypes = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
        shape = [cfg.num_hidden_layers, self.window, cfg.hidden_size, dtypes.index(self.dtype) if self.dtype in dtypes else -1]
        key = torch.stack([ids.new_tensor(ids.shape[0]), ids.new_tensor(ids.shape[1]), (ids * weights).sum(),
                           ids.new_tensor(cfg_hash), sq.view(1).view(torch.int64)[0]] + [ids.new_tensor(x) for x in shape])
        g = self.ctx.all_gather(key, "prefill: every rank's prompt (shape and tokens) and model")
        keys = g[:, :3].tolist()
        if any(k != keys[0] for k in keys):
            shapes = ", ".join(f"rank {r}: [{b}, {t}]" for r, (b, t, _) in enumerate(keys))
            same = " (same shape, other tokens)" if all(k[:2] == keys[0][:2] for k in keys) else ""
            raise ValueError(f"input_ids differ across ranks{same}: every rank must pass the same prompt "
                             f"({shapes})")
        if len(set(g[:, 3].tolist())) > 1:
            names = dict(enumerate(["float16", "bfloat16", "float32", "float64"]))
            got = "; ".join(f"rank {r}: {n} layers, window {w}, hidden {d}, {names.get(t, 'another dtype')}"
                            for r, (n, w, d, t) in enumerate(g[:, 5:].tolist()))
            raise ValueError(f"the model differs across ranks: its config (layers, sizes, window, rope...) or dtype is "
                             f"not the same on every rank ({got}); every rank must load the same model")
        bits, sqs = g[:, 4].tolist(), g[:, 4].contiguous().view(torch.float64).tolist()
        # the same bits (a NaN too), or float64 sums that differ by rounding only (~1e-16; other GPUs may sum otherwise)
        if any(b != bits[0] and not abs(x - sqs[0]) <= 1e-9 * abs(sqs[0]) for b, x in zip(bits, sqs)):
            got = ", ".join(f"rank {r}: {x:.10g}" for r, x in enumerate(sqs))
            raise ValueError(f"the model's weights differ across ranks (sum of squares of every weight: {got}): every "
                             f"rank must hold the same weights (random weights: seed every rank alike)")

    # ------------------------------------------------------------------ prefill
    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor):
        """Prefill the whole prompt ``input_ids [B, T]`` (the same full tensor on every rank; each
        rank embeds only its shard). Returns ``(logits [B, 1, V], cache)``: the prediction after
        the last prompt token (identical on every rank) and this rank's :class:`ShardedKVCache`."""
        ids = self._check_ids(input_ids)
        warn_beyond_positions(self.model.config, ids.shape[1], stacklevel=3)  # past torch.no_grad's wrapper: the caller's line
        return self._prefill(ids)

    def _prefill(self, ids: torch.Tensor):  # ids checked (_check_ids)
        ctx, core, dev, dtype = self.ctx, self.core, self.device, self.dtype
        B, T = ids.shape
        bounds = shard_bounds(T, ctx.world_size)
        s, e = bounds[ctx.rank]
        n = e - s
        cfg = self.model.config
        Hkv, Hq, D = cfg.num_key_value_heads, cfg.num_attention_heads, cfg.head_dim
        wm1 = self.window - 1
        counts = [min(b - a, wm1) for a, b in bounds]  # valid tail rows per rank
        slot = max(counts)  # rows of a tail in the gather: w - 1, or the longest shard when shards are shorter
        chunks = [(c, min(n, c + self.chunk_size)) for c in range(0, n, self.chunk_size)]
        layers = core.layers
        L = len(layers)
        cache = ShardedKVCache(L, bounds, ctx.rank, self.reserve)

        h = core.embed_tokens(ids[:, s:e].to(dev))  # [B, n, d] base stream of this shard
        h_out = core.embed_tokens(ids[:, T - 1:T].to(dev))  # output token, replicated
        rope_out = self._rope(T - 1, T)
        ropes = {c: self._rope(s + c[0], s + c[1]) for c in chunks}
        for i, layer in enumerate(layers):
            attn = layer.self_attn
            final = i == L - 1  # the last layer: only the output token continues
            # 1) K/V of every local token, straight into the cache
            cache.allocate(i, B, n, Hkv, D, dtype, dev)
            for c in chunks:
                kl, vl = cache.update(i, *attn.keys_values(layer.pre_attention(h[:, c[0]:c[1]]), ropes[c]), start=c[0])
            kbuf, vbuf = cache.k[i], cache.v[i]
            # 2) the output query's partial attention over the local keys
            q_out, gate_out = attn.queries(layer.pre_attention(h_out), rope_out, "out", with_gate=True)
            o_p, lse_p = partial_attention(q_out, kl, vl, key_chunk=self.key_chunk)
            # 3) one gather: this rank's tail (right-aligned in slot rows) + its partial
            c_me = counts[ctx.rank]
            tail_k = kl.new_zeros(B, slot, Hkv, D)
            tail_v = vl.new_zeros(B, slot, Hkv, D)
            if c_me:
                tail_k[:, slot - c_me:] = kl[:, n - c_me:]
                tail_v[:, slot - c_me:] = vl[:, n - c_me:]
            pending = ctx.all_gather(self._pack([tail_k, tail_v, o_p, lse_p], B),
                                     f"prefill layer {i}: K/V halo + partial output", async_op=True)
            # window stream of the chunks that need no halo, overlapping the gather
            needs_halo = [c for c in chunks if c[0] < wm1 and ctx.rank > 0]
            if not final:
                for c in chunks:
                    if c not in needs_halo:
                        self._window_chunk(layer, attn, h, c[0], c[1], kbuf, vbuf, None, ropes[c])
            g = pending.wait()  # [R, B, P]
            R = g.shape[0]
            nt = slot * Hkv * D
            tails_k = g[:, :, :nt].reshape(R, B, slot, Hkv, D).to(dtype)
            tails_v = g[:, :, nt:2 * nt].reshape(R, B, slot, Hkv, D).to(dtype)
            o_all = g[:, :, 2 * nt:2 * nt + Hq * D].reshape(R, B, 1, Hq, D)
            lse_all = g[:, :, 2 * nt + Hq * D:].reshape(R, B, 1, Hq)
            # the whole sequence's last w-1 K/V: the decode window (replicated)
            cache.window_k[i] = halo_from_tails(tails_k, counts, R, wm1)
            cache.window_v[i] = halo_from_tails(tails_v, counts, R, wm1)
            if not final and needs_halo:
                halo = (halo_from_tails(tails_k, counts, ctx.rank, wm1),
                        halo_from_tails(tails_v, counts, ctx.rank, wm1))
                for c in needs_halo:
                    self._window_chunk(layer, attn, h, c[0], c[1], kbuf, vbuf, halo, ropes[c])
            # 4) exact merge of the partials; the output token's residual + MLP
            o_out, _ = merge_partials(o_all, lse_all)
            o_out = attn.gate_output(o_out.to(dtype), gate_out)
            h_out = layer.post_attention(h_out, attn.o_proj(o_out.reshape(B, 1, -1)))
        del h
        cache.length = n
        cache.seq_len = T
        logits = self.model.lm_head(core.norm(h_out))
        return logits, cache

    # ------------------------------------------------------------------ decode
    @torch.no_grad()
    def decode_step(self, tokens: torch.Tensor, cache: ShardedKVCache, *, check_ranks: bool = True) -> torch.Tensor:
        """One decode step for ``tokens [B]`` (the same on every rank). The base token's K/V is
        appended to the last rank's shard; returns ``logits [B, 1, V]`` (identical on every rank).
        ``check_ranks`` (with more than one rank): first gather every rank's position and tokens and
        refuse a step out of step; it costs a collective and a host sync a step (the CPU waits for the
        GPU before queueing the step): a tested loop may pass ``False`` (``generate`` checks nothing:
        it broadcasts its tokens)."""
        dev = self.device
        if not isinstance(cache, ShardedKVCache):  # was an AttributeError ('... has no attribute seq_len')
            raise TypeError(f"cache must be the ShardedKVCache prefill() returned, got {type(cache).__name__}")
        if cache.seq_len == 0:
            raise ValueError("decode_step needs a cache filled by prefill()")
        cfg = self.model.config
        mine = (len(self.core.layers), self.ctx.rank, self.ctx.world_size, cfg.num_key_value_heads, cfg.head_dim)
        have = (cache.num_layers, cache.rank, len(cache.bounds)) + tuple(cache.k[0].shape[2:])
        if have != mine:  # another model's or another rank's cache: an IndexError, or other logits without a word
            raise ValueError(f"cache is not this model's on this rank: it holds {have[0]} layers of {have[3]} K/V heads "
                             f"of size {have[4]} for rank {have[1]} of {have[2]}, this model and rank need {mine[0]} layers "
                             f"of {mine[3]} heads of size {mine[4]} for rank {mine[1]} of {mine[2]} (pass the cache this "
                             f"rank's prefill() returned)")
        tokens = torch.as_tensor(tokens, device=dev)
        check_token_ids(tokens, self.model.config.vocab_size, "tokens")
        B = cache.k[0].shape[0]
        if tokens.shape not in ((B,), (B, 1)):
            raise ValueError(f"tokens must be [B] or [B, 1] with B = {B} (the cache's batch), got {tuple(tokens.shape)}")
        if check_ranks and self.ctx.world_size > 1:
            self._check_same_step(tokens.long().view(-1), cache)
        warn_beyond_positions(self.model.config, cache.seq_len + 1, stacklevel=3)  # as prefill
        return self._decode_step(tokens.long().view(-1, 1), cache)

    def _check_same_step(self, tokens: torch.Tensor, cache: ShardedKVCache) -> None:
        """Every rank must step the same sequence: its cache at the same position, the same tokens. Ranks that
        differ merged the partials of other queries, or of other positions: every rank returned wrong logits,
        without a word. One gather of ``(position, batch, a weighted sum of the tokens)``, before the step; the
        caches are left as they were. (``generate`` broadcasts its tokens: it needs no such check.)"""
        weights = torch.arange(1, tokens.numel() + 1, device=tokens.device)
        key = torch.stack([tokens.new_tensor(cache.seq_len), tokens.new_tensor(tokens.numel()), (tokens * weights).sum()])
        got = self.ctx.all_gather(key, f"decode (position {cache.seq_len}): every rank's position and tokens").tolist()
        if any(k[:2] != got[0][:2] for k in got):
            batches = any(k[1] != got[0][1] for k in got)
            where = ", ".join(f"rank {r} at position {p}" + (f" (batch {b})" if batches else "")
                              for r, (p, b, _) in enumerate(got))
            raise ValueError(f"the caches differ across ranks: {where}; every rank must pass the cache its prefill() "
                             f"of the same prompt returned, stepped alike")
        if any(k != got[0] for k in got):
            raise ValueError(f"tokens differ across ranks at position {cache.seq_len} (rank {self.ctx.rank}: "
                             f"{tokens.tolist()}): every rank must pass the same tokens (generate() broadcasts them "
                             f"from the last rank)")

    def _decode_step(self, tokens: torch.Tensor, cache: ShardedKVCache) -> torch.Tensor:  # tokens [B, 1], checked
        ctx, core, dtype = self.ctx, self.core, self.dtype
        B = tokens.shape[0]
        pos = cache.seq_len
        wm1 = self.window - 1
        rope = self._rope(pos, pos + 1)
        h = core.embed_tokens(tokens)
        h2 = torch.cat([h, h], dim=1)  # [base token | output token]
        if ctx.is_last:
            cache.ensure_capacity(1)
        L = len(core.layers)
        for i, layer in enumerate(core.layers):
            attn = layer.self_attn
            final = i == L - 1
            x = layer.pre_attention(h2)
            k, v = attn.keys_values(x[:, :1], rope)
            q_out, gate_out = attn.queries(x[:, 1:], rope, "out", with_gate=True)
            kl, vl = cache.update(i, k, v) if ctx.is_last else cache.local(i)
            o_p, lse_p = partial_attention(q_out, kl, vl, key_chunk=self.key_chunk)
            g = ctx.all_gather(self._pack([o_p, lse_p], B), f"decode (position {pos}) layer {i}: partial output")
            Hq, D = o_p.shape[2], o_p.shape[3]
            o_out, _ = merge_partials(g[:, :, :Hq * D].reshape(-1, B, 1, Hq, D), g[:, :, Hq * D:].reshape(-1, B, 1, Hq))
            o_out = attn.gate_output(o_out.to(dtype), gate_out)
            wk = torch.cat([cache.window_k[i], k], dim=1)
            wv = torch.cat([cache.window_v[i], v], dim=1)
            if not final:
                q, gate = attn.queries(x[:, :1], rope, "base", with_gate=True)
                o, _ = orthros_attention(q, wk, wv, q[:, :0], window_size=self.window, backend=attn.backend)
                o = torch.cat([attn.gate_output(o, gate), o_out], dim=1)
                h2 = layer.post_attention(h2, attn.o_proj(o.reshape(B, 2, -1)))
            else:  # the last layer keeps only the output token
                h2 = layer.post_attention(h2[:, 1:], attn.o_proj(o_out.reshape(B, 1, -1)))
            cache.window_k[i] = wk[:, max(0, wk.shape[1] - wm1):]
            cache.window_v[i] = wv[:, max(0, wv.shape[1] - wm1):]
        if ctx.is_last:
            cache.length += 1
        cache.seq_len += 1
        return self.model.lm_head(core.norm(h2))

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int):
        """Greedy generation: prefill, then ``max_new_tokens - 1`` decode steps.

        Returns ``(tokens [B, max_new_tokens], logits [B, max_new_tokens, V], cache)`` where
        ``logits[:, j]`` is the distribution ``tokens[:, j]`` was chosen from. The token is
        broadcast from the last rank, so every rank continues with the same one.
        """
        max_new_tokens = check_positive_int("max_new_tokens", max_new_tokens)
        ids = self._check_ids(input_ids)
        warn_beyond_positions(self.model.config, ids.shape[1] + max_new_tokens - 1, stacklevel=3)  # as prefill
        logits, cache = self._prefill(ids)
        toks, all_logits = [], [logits]
        for step in range(max_new_tokens):
            tok = logits[:, -1].argmax(-1).contiguous()
            tok = self.ctx.broadcast(tok, self.ctx.world_size - 1, f"greedy token {step}")
            toks.append(tok)
            if step == max_new_tokens - 1:
                break
            logits = self._decode_step(tok.long().view(-1, 1), cache)  # generate warned for its positions
            all_logits.append(logits)
        return torch.stack(toks, dim=1), torch.cat(all_logits, dim=1), cache

"""Orthros (paper Algorithm 2) as a vLLM v1 model, built from vLLM's own layers.

Per forward vLLM hands the model a flat batch of N scheduled tokens (prefill chunks and decode
tokens of many requests, continuous batching) and samples one token per request from the row of
its *last scheduled token* (``logits_indices = query_start_loc[1:] - 1``; the logits of a
non-final prefill chunk are discarded). So:

* the **base stream** runs over all N tokens with vLLM's ``Attention`` and a per-layer sliding
  window of ``window_size`` keys (the backend's windowed kernel; prefill stays linear). It
  writes every token's K/V into the paged cache. Its KV-cache spec is *full attention*
  (:class:`WindowAttention`): a sliding-window spec would let vLLM free the blocks that fall
  out of the window, and the output stream reads all of them;
* the **output stream** runs only for the R sampled rows (one per request): an output token is
  a copy of the embedding at that position, and in every layer its query (scale-offset
  alpha', beta') attends to all of the request's cached keys ``0..t``, read through the block
  table after the layer's own K/V were written (:func:`output_stream_attention`). Output tokens
  write no K/V, so cached prefix blocks hold base-stream K/V only and prefix caching and
  chunked prefill give the same tokens;
* the last layer computes only its K/V for the base tokens, and attention plus MLP for the
  output tokens; the logits come from the output tokens' final hidden states, returned in the
  sampled rows of an ``[N, hidden]`` tensor (the other rows are zero and never sampled).

Gated DeltaNet layers (Orthros-H, the Linear Hybrid) are vLLM's own ``QwenGatedDeltaNetAttention``
for the base rows, and their output rows read each request's recurrent state
(:func:`gdn_output_stream`); such checkpoints are served by :class:`OrthrosHybridForCausalLM`,
which vLLM knows to keep states for (CPU backend only, so far).

The weights load from the same names as ``orthros.OrthrosForCausalLM``'s state dict.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from vllm.config import VllmConfig
from vllm.distributed import get_pp_group, get_tensor_model_parallel_world_size
from vllm.forward_context import get_forward_context
from vllm.model_executor.layers.activation import SiluAndMul
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.layers.attention.attention import unified_kv_cache_update
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.rotary_embedding import get_rope
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from vllm.model_executor.models.interfaces import IsHybrid
from vllm.model_executor.models.utils import AutoWeightsLoader, WeightsMapper, maybe_prefix
from vllm.sequence import IntermediateTensors
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheSpec

from . import check_servable
from ..kinds import LINEAR_LAYER_TYPE
from ..layers.common import ResidualMLP
from ..ops.gdn.naive import l2norm


class WindowAttention(Attention):
    """vLLM attention with a sliding window in the kernel but a full-attention KV-cache spec:
    no block is ever evicted (the output stream reads every token's K/V)."""

    def get_kv_cache_spec(self, vllm_config: VllmConfig) -> Optional[KVCacheSpec]:
        spec = super().get_kv_cache_spec(vllm_config)
        if spec is None or self.sliding_window is None:
            return spec
        return FullAttentionSpec(block_size=vllm_config.cache_config.block_size, num_kv_heads=spec.num_kv_heads,
                                 head_size=spec.head_size, head_size_v=spec.head_size_v, dtype=spec.dtype,
                                 kv_quant_mode=spec.kv_quant_mode)


@dataclass
class SampledRows:
    """Where the output stream runs in this forward: the last scheduled token of each request."""

    rows: torch.Tensor  # [R] int64, rows of the flat batch
    write_rows: torch.Tensor  # [R] int64: ``rows``, or the spare row N for a request with no token this step
    metadata: object  # the first attention layer's metadata of this step (None in a dummy run); each layer's
    #                   output stream reads its own (its KV-cache group's block table)
    backend_state: dict  # per-step scratch of the output-stream op (e.g. scheduler metadata)


def rows_from_metadata(metadata, num_tokens: int, device) -> SampledRows:
    """The sampled rows of a step from its attention metadata: ``query_start_loc[1:] - 1``, the
    row vLLM takes each request's logits from (the last row when there is no metadata:
    warm-up / profiling). A request with no token in this step (the padding vLLM adds to reach a
    captured CUDA-graph batch size repeats the last ``query_start_loc``) gets the spare row
    ``num_tokens`` as its ``write_rows`` entry, so it never overwrites a real request's row."""
    if metadata is None:
        rows = torch.tensor([num_tokens - 1], dtype=torch.long, device=device)
        return SampledRows(rows=rows, write_rows=rows, metadata=None, backend_state={})
    qsl = metadata.query_start_loc.long()
    rows = qsl[1:] - 1
    write_rows = torch.where(qsl[1:] > qsl[:-1], rows, torch.full_like(rows, num_tokens))
    return SampledRows(rows=rows, write_rows=write_rows, metadata=metadata, backend_state={})


def layer_metadata(layer_name: str):
    """``layer_name``'s metadata in the current forward context (None outside vLLM's runner, or
    in a dummy run)."""
    try:
        attn_metadata = get_forward_context().attn_metadata
    except AssertionError:  # no forward context (called outside vLLM's runner)
        return None
    if isinstance(attn_metadata, list):  # micro-batches: [0] is the model's own metadata
        attn_metadata = attn_metadata[0]
    return attn_metadata.get(layer_name) if isinstance(attn_metadata, dict) else None


def sampled_rows(layer_name: str, num_tokens: int, device) -> SampledRows:
    """:func:`rows_from_metadata` for ``layer_name``'s metadata in the current forward context."""
    return rows_from_metadata(layer_metadata(layer_name), num_tokens, device)


def _cpu_output_stream(attn: Attention, q: torch.Tensor, out: torch.Tensor, m, st: dict) -> None:
    """``CPU_ATTN``: vLLM's CPU paged-attention op, its cache viewed as the CPU backend lays it
    out (per block and KV head: ``block_size`` key rows, then ``block_size`` value rows)."""
    from vllm import _custom_ops as ops
    from vllm import envs

    R, H, D = q.shape
    if "sched" not in st:  # the same for every layer of this step: built once
        st["sched"] = ops.cpu_attn_get_scheduler_metadata(
            num_reqs=R, num_heads=H, num_kv_heads=attn.num_kv_heads, head_dim=D, seq_lens=m.seq_lens,
            dtype=q.dtype, query_start_loc=st["qsl"], causal=True, sliding_window_size=-1, isa=attn.isa,
            enable_kv_split=envs.VLLM_CPU_ATTN_SPLIT_KV, kv_cache_dtype=attn.kv_cache_dtype)
    kv_cache = attn.kv_cache
    num_blocks, num_kv_heads, block_size, _ = kv_cache.size()
    key_cache, value_cache = kv_cache.view(num_blocks, num_kv_heads, block_size * 2, -1).chunk(2, dim=2)
    ops.cpu_attention_with_kv_cache(
        query=q, key_cache=key_cache, value_cache=value_cache, output=out,
        query_start_loc=st["qsl"], seq_lens=m.seq_lens, scale=attn.impl.scale, causal=True, alibi_slopes=None,
        sliding_window=-1, block_table=m.block_table, softcap=0, scheduler_metadata=st["sched"], s_aux=None,
        k_scale=attn._k_scale_float, v_scale=attn._v_scale_float, kv_cache_dtype=attn.kv_cache_dtype)


def _triton_output_stream(attn: Attention, q: torch.Tensor, out: torch.Tensor, m, st: dict) -> None:
    """``FLASH_ATTN`` and ``TRITON_ATTN`` (GPU): both keep a layer's cache in the logical layout
    ``[blocks, kv_heads, block_size, 2 * head_dim]`` (keys, then values, in the last dim), which
    vLLM's Triton ``unified_attention`` reads through the block table: one query per request
    (``cu_seqlens_q = arange(R + 1)``), causal, no window, the 2D kernel vLLM itself runs for
    decode tokens. The base stream keeps the backend's own kernel."""
    from vllm.v1.attention.ops.triton_unified_attention import unified_attention

    D = q.shape[-1]
    key_cache, value_cache = attn.kv_cache.transpose(1, 2).split(D, dim=-1)
    unified_attention(
        q=q, k=key_cache, v=value_cache, out=out, cu_seqlens_q=st["qsl"], max_seqlen_q=1,
        seqused_k=m.seq_lens, max_seqlen_k=m.max_seq_len, softmax_scale=attn.impl.scale, causal=True,
        window_size=(-1, -1), block_table=m.block_table, softcap=0, q_descale=None, k_descale=None,
        v_descale=None)


#: backend name (``attn.attn_backend.get_name()``) -> the output-stream op for its cache layout
OUTPUT_STREAM_OPS = {"CPU_ATTN": _cpu_output_stream, "FLASH_ATTN": _triton_output_stream,
                     "TRITON_ATTN": _triton_output_stream}


def output_stream_op(attn: Attention):
    """The output-stream op for ``attn``'s backend; a ``ValueError`` naming what is supported
    otherwise (called when the model is built, so an engine that cannot serve it stops at load)."""
    backend = attn.attn_backend.get_name()
    op = OUTPUT_STREAM_OPS.get(backend)
    if op is None:
        raise ValueError(f"the Orthros output stream runs on vLLM's attention backends {sorted(OUTPUT_STREAM_OPS)}; "
                         f"this engine selected {backend!r} (choose one with --attention-backend)")
    if op is _triton_output_stream and attn.kv_cache_dtype != "auto":
        raise ValueError(f"the Orthros output stream on {backend} reads an unquantised KV cache "
                         f"(--kv-cache-dtype auto); this engine uses {attn.kv_cache_dtype!r}")
    return op


def output_stream_attention(attn: Attention, q_out: torch.Tensor, s: SampledRows) -> torch.Tensor:
    """Full causal attention of one output query per request (``q_out [R, Hq * D]``) over all of
    that request's cached keys ``0 .. seq_len - 1`` of ``attn``'s layer, read from the paged KV
    cache through the block table of the layer's own metadata (the cache already holds this
    step's K/V; a hybrid's attention layers may sit in several KV-cache groups, each with its own
    block table). Returns ``[R, Hq * D]``."""
    R = q_out.shape[0]
    H, D = attn.num_heads, attn.head_size
    out = torch.zeros(R, H, D, dtype=q_out.dtype, device=q_out.device)
    if s.metadata is None:  # warm-up / profiling run: no cache, nothing to attend to
        return out.view(R, H * D)
    op = output_stream_op(attn)
    m = layer_metadata(attn.layer_name)
    if m is None:  # called outside vLLM's forward context (the op tests): the step's metadata
        m = s.metadata
    if "qsl" not in s.backend_state:  # one query per request; the same for every layer of this step
        s.backend_state["qsl"] = torch.arange(R + 1, dtype=s.metadata.query_start_loc.dtype, device=q_out.device)
    op(attn, q_out.view(R, H, D), out, m, s.backend_state)
    return out.view(R, H * D)


class OrthrosMLP(nn.Module):
    def __init__(self, config, prefix: str):
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(config.hidden_size, [config.intermediate_size] * 2,
                                                       bias=config.mlp_bias, prefix=f"{prefix}.gate_up_proj")
        self.down_proj = RowParallelLinear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias,
                                           prefix=f"{prefix}.down_proj")
        self.act_fn = SiluAndMul()

    def forward(self, x):
        x, _ = self.gate_up_proj(x)
        x, _ = self.down_proj(self.act_fn(x))
        return x


class OrthrosAttention(nn.Module):
    """Shared W_Q/K/V/O; base queries alpha*q+beta (window), output queries alpha'*q+beta' (full)."""

    def __init__(self, config, cache_config, layer_idx: int, prefix: str):
        super().__init__()
        self.mode = config.attention_mode
        self.final = layer_idx == config.num_hidden_layers - 1
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        # Qwen3.5's attention output gate: q_proj holds [query | gate] per head, and a row's attention
        # output is multiplied by sigmoid(its own gate) before o_proj (as in orthros.layers.OrthrosAttention)
        self.output_gate = bool(getattr(config, "attn_output_gate", False))
        self.q_cols = self.q_size * (2 if self.output_gate else 1)
        self.qkv_proj = QKVParallelLinear(config.hidden_size, self.head_dim,
                                          self.num_heads * (2 if self.output_gate else 1), self.num_kv_heads,
                                          bias=config.attention_bias, prefix=f"{prefix}.qkv_proj")
        self.o_proj = RowParallelLinear(self.q_size, config.hidden_size, bias=config.o_proj_bias,
                                        prefix=f"{prefix}.o_proj")
        if config.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, eps=config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None
        self.scale_offset = bool(config.scale_offset) and self.mode == "orthros"
        if self.scale_offset:  # same parameters (and names) as orthros.layers.OrthrosAttention
            self.alpha_out = nn.Parameter(torch.ones(self.q_size))
            self.beta_out = nn.Parameter(torch.zeros(self.q_size))
            if not self.final:
                self.alpha = nn.Parameter(torch.ones(self.q_size))
                self.beta = nn.Parameter(torch.zeros(self.q_size))
        self.rotary_emb = get_rope(self.head_dim, max_position=config.max_position_embeddings,
                                   rope_parameters=config.rope_parameters, is_neox_style=True)
        window = None if self.mode == "full" else config.window_size
        self.attn = WindowAttention(self.num_heads, self.head_dim, self.head_dim ** -0.5,
                                    num_kv_heads=self.num_kv_heads, cache_config=cache_config,
                                    per_layer_sliding_window=window, prefix=f"{prefix}.attn")
        backend = self.attn.attn_backend
        if not backend.supports_head_size(self.head_dim):  # (its kernel fails at the first request otherwise)
            raise ValueError(f"this checkpoint has head_dim={self.head_dim}, which vLLM's {backend.get_name()} "
                             f"attention does not take (head dims {backend.get_supported_head_sizes()})")
        if self.mode == "orthros":
            output_stream_op(self.attn)  # refuse, at load, a backend or cache dtype it cannot serve

    def _norm_heads(self, norm, x):
        if norm is None:
            return x
        shape = x.shape
        return norm(x.reshape(-1, self.head_dim)).view(shape)

    def forward(self, pos_all, x, s: SampledRows, n_out: int, final: bool):
        """``x``: normalised ``[N + n_out, d]`` (N base rows, then the output rows), ``pos_all`` their
        positions. Returns the attention output of the same rows, or (``final``: the last layer of
        an Orthros model, whose base stream is never read again) of the output rows only."""
        N = x.shape[0] - n_out
        qkv, _ = self.qkv_proj(x)
        q, gate = qkv[:, :self.q_cols], None
        if self.output_gate:
            q, gate = q.view(-1, self.num_heads, 2 * self.head_dim).split(self.head_dim, dim=-1)
            q, gate = q.reshape(-1, self.q_size), gate.reshape(-1, self.q_size)
        q = self._norm_heads(self.q_norm, q)
        # keys of every row (the output rows' are never stored or read): one RoPE call below
        k = self._norm_heads(self.k_norm, qkv[:, self.q_cols:self.q_cols + self.kv_size])
        v = qkv[:N, self.q_cols + self.kv_size:]
        if self.scale_offset:
            q_base = q[:N] if final else torch.addcmul(self.beta, q[:N], self.alpha)
            q = torch.cat([q_base, torch.addcmul(self.beta_out, q[N:], self.alpha_out)])
        q, k = self.rotary_emb(pos_all, q.contiguous(), k.contiguous())
        k = k[:N]
        if not final:
            o = self.attn(q[:N], k, v)  # writes this step's K/V, then windowed attention
        else:  # last layer: only its K/V are needed from the base stream
            unified_kv_cache_update(k.view(N, self.num_kv_heads, self.head_dim),
                                    v.contiguous().view(N, self.num_kv_heads, self.head_dim), self.attn.layer_name)
        if n_out:
            o_out = output_stream_attention(self.attn, q[N:], s)
            o = o_out if final else torch.cat([o, o_out])
        if gate is not None:
            o = o * torch.sigmoid(gate[N:] if final else gate)
        out, _ = self.o_proj(o)
        return out


def gdn_output_stream(layer, x_out: torch.Tensor, s: SampledRows) -> torch.Tensor:
    """The output rows ``x_out [R, d]`` (one a request) of a Gated DeltaNet layer (vLLM's
    ``QwenGatedDeltaNetAttention``): each reads its request's recurrent state after the base
    rows of this step, ``o' = (l2norm(silu(x' W_q)) * scale) . S`` (no convolution, no state
    update), then the gated norm with its own ``z' = x' W_z`` and ``out_proj``, as
    ``orthros.layers.gated_deltanet.GatedDeltaNet`` does for output tokens."""
    R = x_out.shape[0]
    Hk, K, Hv, V = layer.num_k_heads, layer.head_k_dim, layer.num_v_heads, layer.head_v_dim
    qkvz, _ = layer.in_proj_qkvz(x_out)  # [q | k | v | z]: the output rows need q and z
    q = F.silu(qkvz[:, :layer.key_dim].float()).view(R, Hk, K)
    z = qkvz[:, 2 * layer.key_dim + layer.value_dim:].reshape(R, Hv, V)
    o = torch.zeros(R, Hv, V, dtype=x_out.dtype, device=x_out.device)
    metadata = layer_metadata(layer.prefix)
    if metadata is not None and s.metadata is not None:  # (None: warm-up / profiling, nothing cached)
        idx = metadata.non_spec_state_indices_tensor[:R].long()  # one a request, in the batch's order
        state = layer.kv_cache[1]  # [slots, HV, V, K] as allocated; the CPU kernels keep [HV, K, V] in it
        S = state.view(state.shape[0], Hv, K, V)[idx].float()
        q = (l2norm(q) * K ** -0.5).repeat_interleave(Hv // Hk, dim=1)  # key heads -> value heads
        o = torch.einsum("rhk,rhkv->rhv", q, S).to(x_out.dtype)
    return layer._output_projection(o, z)


class OrthrosDecoderLayer(ResidualMLP, nn.Module):
    def __init__(self, config, vllm_config, layer_idx: int, prefix: str):
        super().__init__()
        kinds = getattr(config, "layer_types", None) or []
        if kinds and kinds[layer_idx] == LINEAR_LAYER_TYPE:  # Orthros-H: vLLM's own Gated DeltaNet layer
            from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import QwenGatedDeltaNetAttention

            self.self_attn = None
            self.linear_attn = QwenGatedDeltaNetAttention(config, vllm_config, prefix=f"{prefix}.linear_attn",
                                                          gqa_interleaved_layout=False)
        else:
            self.self_attn = OrthrosAttention(config, vllm_config.cache_config, layer_idx,
                                              prefix=f"{prefix}.self_attn")
        self.mlp = OrthrosMLP(config, prefix=f"{prefix}.mlp")
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.is_orthros = config.attention_mode == "orthros"

    def _mix(self, pos_all, x, s: SampledRows, n_out: int, final: bool):
        if self.self_attn is not None:
            return self.self_attn(pos_all, x, s, n_out, final=final)
        N = x.shape[0] - n_out
        base = self.linear_attn(x[:N])  # the base rows (their states are written even when only read later)
        if not n_out:
            return base
        out = gdn_output_stream(self.linear_attn, x[N:], s)
        return out if final else torch.cat([base, out])

    def forward(self, pos_all, h, s: SampledRows, n_out: int, final: bool):
        if self.is_orthros:  # the last layer's base stream is never read again: K/V only
            attn = self._mix(pos_all, self.input_layernorm(h), s, n_out, final=final)
            if final:
                h = h[h.shape[0] - n_out:]
        else:  # baselines ("full", "window", the Linear Hybrid): logits from the base stream at the sampled rows
            attn = self._mix(pos_all, self.input_layernorm(h), s, 0, final=False)
            if final:
                h, attn = h[s.rows], attn[s.rows]
        return self.post_attention(h, attn)  # the package's one residual + MLP step


def check_rope_positions(rotary_emb, config, max_model_len: int) -> None:
    """Refuse (``ValueError``) a ``max_model_len`` past the positions vLLM's RoPE table covers:
    vLLM allows ``max_position_embeddings * factor`` for ``rope_type`` "dynamic", but its table
    holds ``max_position_embeddings`` rows (and "yarn" ``original_max_position_embeddings *
    factor``, fewer than ``max_position_embeddings`` in some configs); a position past them
    got NaN logits, sampled as token 0, without a word (vLLM's own Llama does the same)."""
    cache = getattr(rotary_emb, "cos_sin_cache", None)
    if cache is None or max_model_len <= cache.shape[0]:
        return
    rope_type = (getattr(config, "rope_parameters", None) or {}).get("rope_type", "default")
    raise ValueError(f"vLLM's RoPE for this checkpoint (rope_type {rope_type!r}, max_position_embeddings="
                     f"{config.max_position_embeddings}) covers positions below {cache.shape[0]}, and max_model_len is "
                     f"{max_model_len}: a longer sequence would get NaN logits. Pass --max-model-len {cache.shape[0]} "
                     f"or less (max_model_len= in vllm.LLM)")


class OrthrosModel(nn.Module):
    hf_to_vllm_mapper = WeightsMapper(orig_to_new_stacked={
        ".q_proj": (".qkv_proj", "q"), ".k_proj": (".qkv_proj", "k"), ".v_proj": (".qkv_proj", "v"),
        ".gate_proj": (".gate_up_proj", 0), ".up_proj": (".gate_up_proj", 1),
        # Gated DeltaNet layers (vLLM's merge of Qwen3.5's projections, whose names are ours)
        ".in_proj_qkv": (".in_proj_qkvz", (0, 1, 2)), ".in_proj_z": (".in_proj_qkvz", 3),
        ".in_proj_b": (".in_proj_ba", 0), ".in_proj_a": (".in_proj_ba", 1)})

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__()
        config = vllm_config.model_config.hf_config
        self.config = config
        self.is_orthros = config.attention_mode == "orthros"
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([
            OrthrosDecoderLayer(config, vllm_config, i, prefix=f"{prefix}.layers.{i}")
            for i in range(config.num_hidden_layers)])
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        # the sampled rows come from an attention layer's metadata (check_servable: there is one)
        first_attn = next(layer.self_attn for layer in self.layers if layer.self_attn is not None)
        self.first_attn_name = first_attn.attn.layer_name
        check_rope_positions(first_attn.rotary_emb, config, vllm_config.model_config.max_model_len)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None) -> torch.Tensor:
        h = self.embed_input_ids(input_ids) if inputs_embeds is None else inputs_embeds
        N = h.shape[0]
        s = sampled_rows(self.first_attn_name, N, h.device)
        n_out = s.rows.shape[0] if self.is_orthros else 0
        pos_all = positions
        if n_out:  # Algorithm 2: the output tokens start as copies of the sampled rows' embeddings
            h = torch.cat([h, h[s.rows]])
            pos_all = torch.cat([positions, positions[s.rows]])
        n = len(self.layers)
        for i, layer in enumerate(self.layers):
            h = layer(pos_all, h, s, n_out, final=(i == n - 1))
        h = self.norm(h)
        # vLLM reads the sampled rows of an [N, d] tensor; rows of padding requests go to row N
        full = h.new_zeros(N + 1, h.shape[-1])
        full.index_copy_(0, s.write_rows, h)
        return full[:N]

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return AutoWeightsLoader(self).load_weights(weights, mapper=self.hf_to_vllm_mapper)


class OrthrosForCausalLM(nn.Module):
    """The architecture ``OrthrosForCausalLM`` for vLLM (text generation)."""

    packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"],
                              "in_proj_qkvz": ["in_proj_qkv", "in_proj_z"], "in_proj_ba": ["in_proj_b", "in_proj_a"]}
    serves_gdn = False  # OrthrosHybridForCausalLM: True

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__()
        config = vllm_config.model_config.hf_config
        self.check_config(config)
        if get_tensor_model_parallel_world_size() != 1 or get_pp_group().world_size != 1:
            raise ValueError("the vLLM Orthros model runs with tensor_parallel_size=1 and pipeline_parallel_size=1 "
                             "(the scale-offset parameters are not sharded yet)")
        # both would read rows other than each request's last scheduled one, which the model leaves zero: wrong
        # numbers, silently (seen: n-gram drafts gave token ids 0, mean pooling the last row's vector)
        if vllm_config.speculative_config is not None:
            raise ValueError("the vLLM Orthros model does not serve speculative decoding (drop --speculative-config): "
                             "vLLM checks draft tokens against the logits of every drafted row, and Orthros computes "
                             "its output stream only at each request's last scheduled row")
        if vllm_config.quant_config is not None:  # (the layers are built without it: it would be ignored, silently)
            raise ValueError(f"the vLLM Orthros model does not serve quantization (got "
                             f"{vllm_config.quant_config.get_name()!r}: drop --quantization, or serve an unquantized "
                             f"checkpoint)")
        runner = vllm_config.model_config.runner_type
        if runner != "generate":
            raise ValueError(f"the vLLM Orthros model serves text generation (--runner generate), not --runner {runner}: "
                             f"pooling reads the hidden states of every prompt row, and Orthros computes its output "
                             f"stream only at each request's last scheduled row")
        self.config = config
        self.model = OrthrosModel(vllm_config=vllm_config, prefix=maybe_prefix(prefix, "model"))
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, prefix=maybe_prefix(prefix, "lm_head"))
        if config.tie_word_embeddings:
            self.lm_head = self.lm_head.tie_weights(self.model.embed_tokens)
        self.logits_processor = LogitsProcessor(config.vocab_size)

    @classmethod
    def check_config(cls, config) -> None:
        """Refuse (``ValueError``) a checkpoint this class does not serve: not an Orthros one, or one
        :func:`~orthros.serving.check_servable` refuses (another class's kind among them)."""
        if getattr(config, "model_type", None) != "orthros":
            raise ValueError(f"{cls.__name__} needs an Orthros config (model_type 'orthros'), got "
                             f"{getattr(config, 'model_type', None)!r}")
        check_servable(config, hybrid=cls.serves_gdn)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_input_ids(input_ids)

    def forward(self, input_ids, positions, intermediate_tensors: Optional[IntermediateTensors] = None,
                inputs_embeds=None) -> torch.Tensor:
        return self.model(input_ids, positions, intermediate_tensors, inputs_embeds)

    def compute_logits(self, hidden_states: torch.Tensor) -> Optional[torch.Tensor]:
        return self.logits_processor(self.lm_head, hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return AutoWeightsLoader(self).load_weights(weights)  # (skips the alias of a tied lm_head)


class OrthrosHybridForCausalLM(OrthrosForCausalLM, IsHybrid):
    """The architecture ``OrthrosHybridForCausalLM``: checkpoints with Gated DeltaNet layers
    (Orthros-H, the Linear Hybrid), whose recurrent states vLLM keeps per request beside the
    attention layers' paged K/V. Their GDN layers are vLLM's own (Qwen3.5's); the output
    stream reads the states (:func:`gdn_output_stream`). Checked on CPU only."""

    serves_gdn = True

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        from vllm.platforms import current_platform

        # the checkpoint first: an attention-only one (served by OrthrosForCausalLM in any dtype) was told to pass
        # --dtype bfloat16, then refused for its kind
        self.check_config(vllm_config.model_config.hf_config)
        if not current_platform.is_cpu():  # the state layout read by gdn_output_stream is the CPU kernels'
            raise ValueError("OrthrosHybridForCausalLM (Gated DeltaNet layers) is checked on vLLM's CPU backend "
                             "only; its GPU kernels keep the recurrent state in another layout, not read yet")
        dtype = vllm_config.model_config.dtype
        if dtype != torch.bfloat16:  # (they assert it at the first forward, taking the engine down)
            raise ValueError(f"OrthrosHybridForCausalLM runs in bfloat16 only (vLLM's CPU Gated DeltaNet kernels); "
                             f"this engine has dtype {str(dtype).removeprefix('torch.')}: pass --dtype bfloat16 "
                             f"(dtype='bfloat16')")
        super().__init__(vllm_config=vllm_config, prefix=prefix)

    @classmethod
    def get_mamba_state_dtype_from_config(cls, vllm_config: VllmConfig):
        from vllm.model_executor.layers.mamba.mamba_utils import MambaStateDtypeCalculator

        c = vllm_config.cache_config
        return MambaStateDtypeCalculator.gated_delta_net_state_dtype(vllm_config.model_config.dtype,
                                                                     c.mamba_cache_dtype, c.mamba_ssm_cache_dtype)

    @classmethod
    def get_mamba_state_shape_from_config(cls, vllm_config: VllmConfig):
        from vllm.model_executor.layers.mamba.mamba_utils import MambaStateShapeCalculator

        c = vllm_config.model_config.hf_text_config
        spec = vllm_config.speculative_config
        return MambaStateShapeCalculator.gated_delta_net_state_shape(
            vllm_config.parallel_config.tensor_parallel_size, c.linear_num_key_heads, c.linear_num_value_heads,
            c.linear_key_head_dim, c.linear_value_head_dim, c.linear_conv_kernel_dim,
            spec.num_speculative_tokens if spec else 0)

    @classmethod
    def get_mamba_state_copy_func(cls):
        from vllm.model_executor.layers.mamba.mamba_utils import MambaStateCopyFuncCalculator

        return MambaStateCopyFuncCalculator.gated_delta_net_state_copy_func()


__all__ = ["OUTPUT_STREAM_OPS", "OrthrosForCausalLM", "OrthrosHybridForCausalLM", "OrthrosModel", "WindowAttention",
           "check_rope_positions", "gdn_output_stream", "layer_metadata", "output_stream_attention", "output_stream_op", "rows_from_metadata", "sampled_rows"]

"""The Orthros attention layer (paper Section 3.1, Algorithm 1).

One set of projections W_Q, W_K, W_V, W_O is shared by both streams. The input is the
concatenation ``h = [x_1..x_T, x'_1..x'_{T_out}]`` of the base tokens and the output-specific
tokens (Algorithm 2 duplicates the embeddings of the output positions). K and V come from the
base tokens only; the queries get stream-specific scale-offset transforms

    q  = alpha  * (x  W_Q) + beta        (base stream:   sliding window of w keys)
    q' = alpha' * (x' W_Q) + beta'       (output stream: every earlier key)

and both outputs are concatenated before W_O. With a cache, the base tokens' K/V are appended
first and both streams read the whole cache.

``config.attention_mode`` selects the ablation baselines through the same code:
``"orthros"`` (both streams), ``"full"`` (standard causal Transformer) and ``"window"``
(sliding window only). The baselines have no output tokens (``T_out == 0`` in ``h``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from ..ops import run_attention as _run_attention

# The op runs its own kernels (Triton, SDPA or the reference). Under torch.compile of a decoder
# layer (``train.compile``) everything around it is fused and the op is called as it is:
# Inductor must not re-trace the window blocking or the Triton autograd functions.
run_attention = torch.compiler.disable(_run_attention)
from .common import RMSNorm, apply_rope


@dataclass
class AttentionInputs:
    """Everything about the current forward that is the same for every layer."""

    n_base: int  # T: number of base tokens in h (the rest are output tokens)
    rope_base: tuple  # (cos, sin) for the base tokens  [B, T, R]
    rope_out: tuple  # (cos, sin) for the output tokens [B, T_out, R]
    out_positions: torch.Tensor  # [B or 1, T_out] absolute key positions (cache included)
    out_rel: Optional[torch.Tensor] = None  # [B or 1, T_out] output positions within this chunk
    cu_seqlens: Optional[torch.Tensor] = None
    doc_ids: Optional[torch.Tensor] = None  # [T] document of each position (from cu_seqlens)
    kv_start: Optional[torch.Tensor] = None
    cache: object = None  # transformers Cache (keys/values stored [B, H, L, D])

    def gather_out_rows(self, x: torch.Tensor) -> torch.Tensor:
        """Rows of ``x [B, T, ...]`` (base tokens of this chunk) at the output positions."""
        idx = self.out_rel.expand(x.shape[0], -1)
        idx = idx.view(*idx.shape, *([1] * (x.dim() - 2))).expand(-1, -1, *x.shape[2:])
        return torch.gather(x, 1, idx)


class OrthrosAttention(nn.Module):
    def __init__(self, config, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.mode = config.attention_mode
        self.window_size = config.window_size
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.backend = config.attn_backend
        qd, kd = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.q_proj = nn.Linear(config.hidden_size, qd, bias=config.attention_bias)
        self.k_proj = nn.Linear(config.hidden_size, kd, bias=config.attention_bias)
        self.v_proj = nn.Linear(config.hidden_size, kd, bias=config.attention_bias)
        self.o_proj = nn.Linear(qd, config.hidden_size, bias=config.o_proj_bias)
        if config.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, eps=config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None
        self.scale_offset = bool(config.scale_offset) and self.mode == "orthros"
        if self.scale_offset:
            # alpha', beta' (output stream) and alpha, beta (base stream), one value per query
            # channel. The last layer's base queries are never computed (nothing reads that
            # stream again), so it has no alpha/beta.
            self.alpha_out = nn.Parameter(torch.ones(qd))
            self.beta_out = nn.Parameter(torch.zeros(qd))
            if layer_idx < config.num_hidden_layers - 1:
                self.alpha = nn.Parameter(torch.ones(qd))
                self.beta = nn.Parameter(torch.zeros(qd))

    def scale_offset_params(self):
        """The scale-offset parameters this layer has, by name."""
        names = ("alpha", "beta", "alpha_out", "beta_out")
        return {n: getattr(self, n) for n in names if isinstance(getattr(self, n, None), nn.Parameter)}

    def reset_scale_offset(self):
        """alpha = alpha' = 1, beta = beta' = 0: both streams see the plain projections."""
        with torch.no_grad():
            for name, p in self.scale_offset_params().items():
                p.fill_(1.0 if name.startswith("alpha") else 0.0)

    def queries(self, x: torch.Tensor, rope, stream: Optional[str] = "base") -> torch.Tensor:
        """Queries ``[B, T, Hq, D]`` of one stream: projection, q-norm, that stream's
        scale-offset (``"base"``: alpha, beta; ``"out"``: alpha', beta'; ``None``: none, as in a
        plain Transformer), RoPE."""
        if stream not in ("base", "out", None):
            raise ValueError(f"stream must be 'base', 'out' or None, got {stream!r}")
        if stream is None:
            B, T, _ = x.shape
            q = self.q_proj(x).view(B, T, self.num_heads, self.head_dim)
            dtype = q.dtype
            if self.q_norm is not None:
                q = self.q_norm(q)
            return apply_rope(q.to(dtype), *rope)
        return self.stream_queries(x, x.shape[1] if stream == "base" else 0, rope, rope)

    def stream_queries(self, x: torch.Tensor, n_base: int, rope, rope_out) -> torch.Tensor:
        """Queries of both streams in one pass (one projection, one q-norm, one RoPE): rows
        ``< n_base`` of ``x [B, T, d]`` are base-stream queries (alpha, beta; RoPE ``rope``
        ``[B, n_base, R]``), the remaining rows output-stream queries (alpha', beta'; RoPE
        ``rope_out``, ``[B, T - n_base or 1, R]``). The engine uses it for a decode pair and
        for prefill's last chunk."""
        B, T, _ = x.shape
        H, D = self.num_heads, self.head_dim
        q = self.q_proj(x).view(B, T, H, D)
        dtype = q.dtype  # under autocast the fp32 norm/scale-offset parameters would promote q
        if self.q_norm is not None:
            q = self.q_norm(q)
        if self.scale_offset:
            parts = []
            if n_base:
                parts.append(q[:, :n_base] * self.alpha.view(H, D) + self.beta.view(H, D))
            if T > n_base:
                parts.append(q[:, n_base:] * self.alpha_out.view(H, D) + self.beta_out.view(H, D))
            if parts:  # (none when x has no rows)
                q = torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]
        if n_base == 0:
            cos, sin = rope_out
        elif n_base == T:
            cos, sin = rope
        else:
            m = T - n_base
            cos = torch.cat([rope[0], rope_out[0].expand(-1, m, -1)], dim=1)
            sin = torch.cat([rope[1], rope_out[1].expand(-1, m, -1)], dim=1)
        return apply_rope(q.to(dtype), cos, sin)

    def keys_values(self, x: torch.Tensor, rope):
        """K (k-norm, RoPE) and V ``[B, T, Hkv, D]`` of base tokens ``x``."""
        B, T, _ = x.shape
        k = self.k_proj(x).view(B, T, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(B, T, self.num_kv_heads, self.head_dim)
        if self.k_norm is not None:
            k = self.k_norm(k).to(v.dtype)
        return apply_rope(k, *rope), v

    def forward(self, h: torch.Tensor, a: AttentionInputs, base_output: bool = True) -> torch.Tensor:
        """``h``: ``[B, T + T_out, d]`` (normalised). Returns the attention output for the
        same tokens, or only for the output tokens when ``base_output`` is False (the last
        layer of an Orthros model, whose base stream is never read again)."""
        B = h.shape[0]
        T = a.n_base
        x = h[:, :T]
        k, v = self.keys_values(x, a.rope_base)
        if a.cache is not None:
            kc, vc = a.cache.update(k.transpose(1, 2), v.transpose(1, 2), self.layer_idx)
            k, v = kc.transpose(1, 2), vc.transpose(1, 2)

        # inputs were validated once per forward by the model: the op's per-call checks (host
        # syncs) are skipped here
        kw = dict(window_size=self.window_size, scale=1.0 / math.sqrt(self.head_dim), doc_ids=a.doc_ids,
                  cu_seqlens=a.cu_seqlens, kv_start=a.kv_start, backend=self.backend)
        if self.mode == "orthros":
            q_out = self.queries(h[:, T:], a.rope_out, "out")
            if base_output:
                q = self.queries(x, a.rope_base)
            else:
                q = q_out[:, :0]
            o, o_out = run_attention(q, k, v, q_out, out_positions=a.out_positions, **kw)
            o = torch.cat([o, o_out], dim=1) if base_output else o_out
        else:
            q = self.queries(x, a.rope_base, stream=None)
            if self.mode == "full":
                # causal attention is the full stream with a query at every base position kept
                if base_output:
                    every = torch.arange(k.shape[1] - T, k.shape[1], device=q.device).view(1, T)
                    _, o = run_attention(q[:, :0], k, v, q, out_positions=every, **kw)
                else:
                    sel = a.gather_out_rows(q)
                    _, o = run_attention(sel[:, :0], k, v, sel, out_positions=a.out_positions, **kw)
            else:  # window
                o, _ = run_attention(q, k, v, q[:, :0], out_positions=a.out_positions[:, :0], **kw)
                if not base_output:
                    o = a.gather_out_rows(o)
        return self.o_proj(o.reshape(B, o.shape[1], self.num_heads * self.head_dim))

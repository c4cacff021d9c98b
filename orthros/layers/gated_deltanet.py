"""The Gated DeltaNet mixer of Orthros-H's linear-attention layers (paper Section 4.6).

Weights and their names are Qwen3.5's (``Qwen3_5GatedDeltaNet``), so converting a checkpoint is
a rename: ``in_proj_qkv`` (q, k, v of every token, concatenated), ``in_proj_z`` (the output
gate), ``in_proj_b`` (beta), ``in_proj_a`` (the decay's input), a depthwise causal ``conv1d``
over q/k/v (SiLU), ``A_log`` and ``dt_bias`` (``g = -exp(A_log) * softplus(a + dt_bias)``), the
gated RMSNorm ``norm`` and ``out_proj``.

The two streams of an Orthros model (``h = [base tokens | output tokens]``):

* **base stream**: an ordinary GDN layer over the base tokens (short convolution, gated delta
  rule), whose state and convolution window are cached;
* **output stream** ("GDN as cross-attention part"): the output token's query reads the state
  at its own position, ``o' = S_p^T q'``. The output token is not part of the base sequence, so
  its query **bypasses the short convolution** (projection and SiLU only); it writes no state
  (its k, v, beta and decay, where a shared projection computes them, are dropped unread) and
  its output gate ``z'`` is its own.

A model without an output stream (the Linear Hybrid, pure GDN) runs the base stream alone.
The layer step calls :meth:`GatedDeltaNet.project` (token-wise projections and gates),
:meth:`~GatedDeltaNet.attend` (cache states, convolution and the delta rule) and
:meth:`~GatedDeltaNet.output` (gated norm, ``out_proj``), like the attention layers.

Cache protocol (every path's cache implements it): ``cache.linear_state(layer_idx)`` returns
``(conv_state [B, C, W-1], recurrent_state [B, HV, K, V] float32)`` or ``None`` (a sequence
start), and ``cache.set_linear_state(layer_idx, conv_state, recurrent_state)`` stores them
(static caches copy in place; a decode step updates the returned buffers in place and hands
the same tensors back). ``step.cache`` may be ``None`` (no cache). A cache whose ``out_last``
is True promises that the step's only output position is its last base row (the engine's
prefill), which the output stream then reads from the final state.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..ops.gdn import FROM_ATTN_BACKEND, causal_conv1d, gated_delta_rule
from ..ops.gdn.naive import gated_delta_rule_step_ref
from .common import FusedProjections, attn_backend_of


class RMSNormGated(nn.Module):
    """Qwen3.5's gated RMSNorm: ``weight * rmsnorm(x) * silu(z)`` over each value head."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        y = self.weight * xf.to(dtype)
        return (y * F.silu(z.float())).to(dtype)


class GDNProjections(NamedTuple):
    """Token-wise results of :meth:`GatedDeltaNet.project` for one step."""

    qkv: torch.Tensor  # [B, n_base, C] base rows' q|k|v before the convolution
    q_out: Optional[torch.Tensor]  # [B, T_out, H, K] output tokens' queries (conv bypassed), or None
    z: torch.Tensor  # [B, rows kept, HV, V] output gate of the rows the layer returns
    g: torch.Tensor  # [B, n_base, HV] log decay (float32)
    beta: torch.Tensor  # [B, n_base, HV]


def _reads_output_tokens(step) -> bool:
    return bool(step.output_tokens) and step.n_out > 0


class GatedDeltaNet(FusedProjections, nn.Module):
    """Fused for inference (the engine's default): ``[in_proj_qkv; in_proj_z; in_proj_b;
    in_proj_a]`` is one GEMM in every layer but the last (whose ``z`` is read at the output rows
    only and which keeps its separate projections)."""

    FUSIONS = {"in_proj_fused": ("in_proj_qkv.weight", "in_proj_z.weight", "in_proj_b.weight", "in_proj_a.weight")}

    def __init__(self, config, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.hidden_size = config.hidden_size
        self.num_k_heads = config.linear_num_key_heads
        self.num_v_heads = config.linear_num_value_heads
        self.head_k_dim = config.linear_key_head_dim
        self.head_v_dim = config.linear_value_head_dim
        self.key_dim = self.num_k_heads * self.head_k_dim
        self.value_dim = self.num_v_heads * self.head_v_dim
        self.conv_kernel_size = config.linear_conv_kernel_dim
        self.conv_dim = 2 * self.key_dim + self.value_dim
        self.backend = FROM_ATTN_BACKEND[attn_backend_of(config)]
        self.scale = self.head_k_dim ** -0.5

        self.in_proj_qkv = nn.Linear(self.hidden_size, self.conv_dim, bias=False)
        self.in_proj_z = nn.Linear(self.hidden_size, self.value_dim, bias=False)
        self.in_proj_b = nn.Linear(self.hidden_size, self.num_v_heads, bias=False)
        self.in_proj_a = nn.Linear(self.hidden_size, self.num_v_heads, bias=False)
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, kernel_size=self.conv_kernel_size, groups=self.conv_dim,
                                padding=self.conv_kernel_size - 1, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(self.num_v_heads))
        self.A_log = nn.Parameter(torch.zeros(self.num_v_heads))
        self.norm = RMSNormGated(self.head_v_dim, eps=config.rms_norm_eps)
        self.out_proj = nn.Linear(self.value_dim, self.hidden_size, bias=False)
        self.init_gdn_parameters()
        self._init_fusions()

    @torch.no_grad()
    def init_gdn_parameters(self, only_uninitialized: bool = False):
        """The GDN recipe (FLA's ``GatedDeltaNet``): ``A ~ U(0, 16)``, ``dt ~ logU(1e-3, 0.1)`` with
        ``dt_bias = softplus^-1(dt)``, PyTorch's default init of the depthwise convolution.
        ``only_uninitialized``: skip what transformers marked as loaded from a checkpoint."""
        def todo(p):
            return not (only_uninitialized and getattr(p, "_is_hf_initialized", False))

        if todo(self.A_log):
            self.A_log.copy_(torch.empty_like(self.A_log).uniform_(1e-4, 16).log())
        if todo(self.dt_bias):
            dt = torch.exp(torch.rand_like(self.dt_bias) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
            self.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))
        if todo(self.conv1d.weight):
            nn.init.kaiming_uniform_(self.conv1d.weight, a=math.sqrt(5))

    # ------------------------------------------------------------ token-wise pieces
    def project(self, x: torch.Tensor, step, final: bool, norm=None) -> GDNProjections:
        """Projections of ``x [B, n_base (+ T_out), d]``, normalised already or by ``norm`` (the
        layer's input norm): q|k|v and the gates of the base rows, the output tokens' queries (no
        convolution: projection + SiLU) and the output gate ``z`` of the rows this layer returns."""
        if norm is not None:
            x = norm(x)
        T = step.n_base
        xb = x[:, :T]
        two = _reads_output_tokens(step)
        w = self.fused("in_proj_fused")
        if w is not None and not final:  # every row of x: q|k|v, z; the base rows: b, a
            C, Vd, Hv = self.conv_dim, self.value_dim, self.num_v_heads
            y = F.linear(x, w)
            q_out = None
            if two:
                q_out = F.silu(y[:, T:, :self.key_dim]).unflatten(-1, (self.num_k_heads, self.head_k_dim))
            z = y[..., C:C + Vd].unflatten(-1, (Hv, self.head_v_dim))
            beta = torch.sigmoid(y[:, :T, C + Vd:C + Vd + Hv])
            g = -self.A_log.float().exp() * F.softplus(y[:, :T, C + Vd + Hv:].float() + self.dt_bias.float())
            return GDNProjections(y[:, :T, :C], q_out, z, g, beta)
        if two:  # one projection for both streams' q|k|v rows
            qkv_all = self.in_proj_qkv(x)
            qkv = qkv_all[:, :T]
            q_out = F.silu(qkv_all[:, T:, :self.key_dim]).unflatten(-1, (self.num_k_heads, self.head_k_dim))
        else:
            qkv, q_out = self.in_proj_qkv(xb), None
        if final:  # only the rows the logits are computed from
            zx = x[:, T:] if two else step.gather_out_rows(xb)
        else:
            zx = x
        z = self.in_proj_z(zx).unflatten(-1, (self.num_v_heads, self.head_v_dim))
        beta = torch.sigmoid(self.in_proj_b(xb))
        g = -self.A_log.float().exp() * F.softplus(self.in_proj_a(xb).float() + self.dt_bias.float())
        return GDNProjections(qkv, q_out, z, g, beta)

    def output(self, o, step, final: bool, residual=None, out_norm=None):
        """Token-wise: the gated norm with each row's own ``z`` and ``out_proj`` (``None`` when
        ``attend`` returned ``None``), plus ``residual`` (the rows of ``h`` it returns); with
        ``out_norm``, ``(that, None)``: the MLP block normalises."""
        if o is None:
            return None
        o, z = o
        B, N = o.shape[:2]
        y = self.norm(o.reshape(B * N, self.num_v_heads, self.head_v_dim), z.reshape(B * N, self.num_v_heads, -1))
        a = self.out_proj(y.reshape(B, N, self.value_dim))
        a = a if residual is None else residual + a
        return (a, None) if out_norm is not None else a

    # ------------------------------------------------------------ cache + kernels
    def attend(self, p: GDNProjections, step, final: bool):
        """Convolution (with the cached window), the gated delta rule over the base rows (from
        the cached state) and the output stream's readout of the same states. Returns
        ``(o, z)``: the outputs of the rows this layer returns and their gates, or ``None`` when
        nothing reads them (the last layer of a step without output positions)."""
        qkv, q_out, z, g, beta = p
        B, T, _ = qkv.shape
        cache = step.cache
        state = cache.linear_state(self.layer_idx) if cache is not None else None
        conv_state, rec_state = state if state is not None else (None, None)
        if getattr(step, "pad_rows", None) is not None:
            # left padding: a pad token contributes nothing (zero inputs: no state change, zero
            # conv taps), so padded rows equal unpadded ones
            keep = (~step.pad_rows)[..., None]
            qkv = qkv * keep.to(qkv.dtype)
            beta = beta * keep.to(beta.dtype)
            g = g * keep.to(g.dtype)
        weight = self.conv1d.weight[:, 0]
        two = q_out is not None
        Hk, K, Hv, V = self.num_k_heads, self.head_k_dim, self.num_v_heads, self.head_v_dim
        decode = T == 1 and rec_state is not None and step.cu_seqlens is None and not torch.is_grad_enabled()
        if decode:  # one token per row: in-place updates of the cached buffers
            x_new = qkv[:, 0]
            window = torch.cat([conv_state, x_new[:, :, None].to(conv_state.dtype)], dim=-1)  # [B, C, W]
            y = F.silu((window * weight.to(window.dtype)).sum(-1)).to(qkv.dtype)
            conv_state.copy_(window[:, :, 1:])
            q, k, v = torch.split(y, [self.key_dim, self.key_dim, self.value_dim], dim=-1)
            # shapes follow from the config: the op's per-call checks (gated_delta_rule_step) skipped
            o, o_out = gated_delta_rule_step_ref(q.view(B, Hk, K), k.view(B, Hk, K), v.view(B, Hv, V), g[:, 0],
                                                 beta[:, 0], rec_state, q_out=q_out[:, 0] if two else None,
                                                 scale=self.scale)
            o, o_out = o[:, None], (o_out[:, None] if two else None)
            new_conv, final_state = conv_state, rec_state
        else:
            y, new_conv = causal_conv1d(qkv, weight, conv_state, cu_seqlens=step.cu_seqlens, backend=self.backend)
            q, k, v = torch.split(y, [self.key_dim, self.key_dim, self.value_dim], dim=-1)
            q, k, v = q.unflatten(-1, (Hk, K)), k.unflatten(-1, (Hk, K)), v.unflatten(-1, (Hv, V))
            if not two:
                pos = None
            elif getattr(cache, "out_last", False):  # the engine's prefill: the chunk's last row only
                pos = "last"
            else:
                pos = step.out_rel
            o, o_out, final_state = gated_delta_rule(
                q, k, v, g, beta, q_out=q_out, output_positions=pos, scale=self.scale, initial_state=rec_state,
                output_final_state=cache is not None, cu_seqlens=step.cu_seqlens, backend=self.backend)
        if cache is not None:
            cache.set_linear_state(self.layer_idx, new_conv, final_state)
        if final and step.n_out == 0:  # nothing reads this layer's output (a prefill chunk that predicts nothing)
            return None
        if final:
            o = o_out if two else step.gather_out_rows(o)
        elif two:
            o = torch.cat([o, o_out], dim=1)
        return o, z

    def forward(self, x: torch.Tensor, step, final: bool = False) -> torch.Tensor:
        """The whole mixer of one step (outside the decoder layer: tests, tools)."""
        step.check_rows(x)
        return self.output(self.attend(self.project(x, step, final), step, final), step, final)


__all__ = ["GatedDeltaNet", "GDNProjections", "RMSNormGated"]

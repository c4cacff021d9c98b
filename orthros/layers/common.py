"""Token-wise building blocks of the Llama/Qwen backbone: RMSNorm, SwiGLU MLP and RoPE."""

from __future__ import annotations

import torch
from torch import nn
from transformers.activations import ACT2FN
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class ResidualMLP:
    """The second half of a decoder layer, mixed into every decoder layer of the package (the
    HF model's and the vLLM plugin's, which build ``mlp`` and ``post_attention_layernorm`` from
    different modules): the residual of the mixer's output, then the MLP block."""

    def post_attention(self, h: torch.Tensor, a) -> torch.Tensor:
        """``a``: the mixer's output for the rows of ``h`` (``None``: nothing to add)."""
        if a is not None:
            h = h + a
        return h + self.mlp(self.post_attention_layernorm(h))


class SwiGLUMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, hidden_act: str = "silu", bias: bool = False):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias)
        self.act_fn = ACT2FN[hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


def _default_rope(config, device=None, **kwargs):
    base = config.rope_parameters["rope_theta"]
    dim = int(config.head_dim * config.rope_parameters.get("partial_rotary_factor", 1.0))
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float, device=device) / dim))
    return inv_freq, 1.0


class RotaryEmbedding(nn.Module):
    """RoPE of any type transformers knows (``config.rope_parameters["rope_type"]``), using its
    init functions (``llama3``, ``yarn``, ``linear``, ``dynamic`` ... ) for the frequencies.

    ``forward(position_ids [B, T]) -> (cos, sin)`` each ``[B, T, rot_dim]`` in float32.
    Dynamic (length-dependent) rope types are computed for ``max_position_embeddings``.
    """

    def __init__(self, config):
        super().__init__()
        self.config = config
        inv_freq, self.attention_scaling = self._compute(config)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    @staticmethod
    def _compute(config):
        rope_type = config.rope_parameters.get("rope_type", "default")
        if rope_type == "default":
            inv_freq, scaling = _default_rope(config)
        else:
            if rope_type not in ROPE_INIT_FUNCTIONS:
                raise ValueError(f"rope_parameters['rope_type']={rope_type!r} is not supported; "
                                 f"known: default, {', '.join(sorted(ROPE_INIT_FUNCTIONS))}")
            inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](config, None)
        return inv_freq.float(), float(scaling)

    @torch.no_grad()
    def reset_buffers(self):
        """Recompute ``inv_freq`` (a non-persistent buffer: after loading from a checkpoint on the
        meta device it holds garbage until recomputed)."""
        self.inv_freq.copy_(self._compute(self.config)[0].to(self.inv_freq.device))

    @torch.no_grad()
    def forward(self, position_ids: torch.Tensor):
        freqs = position_ids[..., None].float() * self.inv_freq.to(position_ids.device)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos() * self.attention_scaling, emb.sin() * self.attention_scaling


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [B, T, H, D]`` by ``cos/sin [B, T, R]`` (R <= D: partial rotary keeps the rest)."""
    R = cos.shape[-1]
    cos = cos[:, :, None, :].to(x.dtype)
    sin = sin[:, :, None, :].to(x.dtype)
    xr, xp = x[..., :R], x[..., R:]
    x1, x2 = xr[..., : R // 2], xr[..., R // 2:]
    rotated = torch.cat((-x2, x1), dim=-1)
    out = xr * cos + rotated * sin
    return torch.cat((out, xp), dim=-1) if xp.shape[-1] else out

"""Token-wise building blocks of the Llama/Qwen backbone: RMSNorm, SwiGLU MLP and RoPE, and
:class:`FusedProjections` (several projections of one input as one GEMM, for inference)."""

from __future__ import annotations

from typing import Dict, Tuple

import torch
import torch.nn.functional as F
from torch import nn
from transformers.activations import ACT2FN
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from ..ops.backends import BACKENDS
from ..ops.pointwise import apply_rope, rms_norm


def attn_backend_of(config) -> str:
    """``config.attn_backend`` (the attention op's backend, which the GDN layers map to theirs),
    checked where a layer is built: a config edited after ``OrthrosConfig.__init__`` is not."""
    name = config.attn_backend
    if not isinstance(name, str) or name not in BACKENDS:
        raise ValueError(f"config.attn_backend must be one of {BACKENDS}, got {name!r}")
    return name


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


def linear(x: torch.Tensor, weight: torch.Tensor, bias=None, *, norm=None, act=None, residual=None, gemv=None,
           out_norm=None):
    """``residual + (prologue(x) @ weight.T + bias)``: a projection of the layer step together
    with the elementwise neighbours a decode GEMV can fuse: before it ``norm`` (an
    :class:`RMSNorm`) or ``act="silu"`` (``x = [gate | up]``: SwiGLU's ``silu(gate) * up``), after
    it the residual add. ``gemv`` (a backend of :func:`orthros.ops.gemv.gemv`, the engine's decode
    under ``Engine(gemv=True)``): one call of the fused GEMV, which runs these same ops where its
    kernel does not take the inputs; ``None``: the ops one by one. ``out_norm`` (an
    :class:`RMSNorm`): returns ``(y, out_norm(y))`` where the GEMV computes that norm in the same
    launch, ``(y, None)`` otherwise (the caller normalises later: same result)."""
    if gemv is not None:
        from ..ops.gemv import gemv as fused_gemv

        return fused_gemv(x, weight, bias, gemv, norm_weight=None if norm is None else norm.weight,
                          norm_eps=None if norm is None else norm.eps, act=act, residual=residual,
                          out_norm_weight=None if out_norm is None else out_norm.weight,
                          out_norm_eps=None if out_norm is None else out_norm.eps)
    if norm is not None:
        x = norm(x)
    if act is not None:
        if act != "silu":
            raise ValueError(f"act must be None or 'silu', got {act!r}")
        gate, up = x.chunk(2, dim=-1)
        x = F.silu(gate) * up
    y = F.linear(x, weight, bias)
    y = y if residual is None else residual + y
    return (y, None) if out_norm is not None else y


class ResidualMLP:
    """The second half of a decoder layer, mixed into every decoder layer of the package (the
    HF model's and the vLLM plugin's, which build ``mlp`` and ``post_attention_layernorm`` from
    different modules): the residual of the mixer's output, then the MLP block."""

    def post_attention(self, h: torch.Tensor, a, gemv=None, normed=None) -> torch.Tensor:
        """``a``: the mixer's output for the rows of ``h`` (``None``: nothing to add, or the
        mixer's output projection added it already). ``gemv``: see :func:`linear`. ``normed``
        (with ``gemv`` and ``a=None``): ``post_attention_layernorm(h)`` when the output
        projection's GEMV computed it already (:func:`linear`'s ``out_norm``)."""
        if a is not None:
            h = h + a
            normed = None
        if gemv is not None and isinstance(self.mlp, SwiGLUMLP) and self.mlp.takes_gemv():
            return self.mlp.gemv_block(h, self.post_attention_layernorm, gemv, normed=normed)
        return h + self.mlp(self.post_attention_layernorm(h) if normed is None else normed)


def _refuse_after_load(module, incompatible_keys):
    """``load_state_dict`` post-hook: an in-place load wrote into the fused buffers already; one
    with ``assign=True`` replaced the parameters, so the buffers are rebuilt from them."""
    if module.projections_fused:
        module.fuse_projections()


class FusedProjections:
    """Mixin of a module whose inference path can run several projections of the same input as
    ONE GEMM (``[W_q; W_k; W_v]``, ``[W_gate; W_up]``).

    ``FUSIONS`` maps a buffer name to the parameter paths it concatenates along dim 0, in order
    (``{"qkv_fused": ("q_proj.weight", "k_proj.weight", "v_proj.weight")}``). A group whose
    parameters do not all exist is skipped (a bias-free layer has no bias group); the others are
    fused all together or not at all: each needs plain floating ``nn.Parameter``s of one dtype
    and device that agree on their trailing shape (a quantized weight keeps the module unfused).

    :meth:`fuse_projections` builds each buffer (non-persistent: not in the state dict) and
    re-points the *same* ``Parameter`` objects at views of it (``p.data = view``): the state
    dict keeps its names and values, no memory is added, and an in-place write to a parameter
    (``load_state_dict``, an optimizer step) is a write into the buffer. The module reads a
    buffer through :meth:`fused`, which returns ``None`` while autograd records (training
    always runs the separate projections, whose gradients reach the parameters).
    ``.to()`` / ``.half()`` / ``.cuda()`` re-fuse after converting; ``load_state_dict(...,
    assign=True)`` rebuilds the buffers from the new parameters. A parameter replaced or moved
    some other way (``module.q_proj.weight = ...``, ``p.data = ...``, FSDP's sharding) is found
    by the next eager :meth:`fused` (each fused parameter's object and address are checked,
    a few microseconds per module), which rebuilds the buffers, or un-fuses when the new
    parameters cannot share one (a ``DTensor``); a compiled forward skips that check (the
    engine makes it at each request). The HF model never fuses itself; the inference engine
    does (``Engine(fuse=True)``)."""

    FUSIONS: Dict[str, Tuple[str, ...]] = {}

    def _init_fusions(self):
        for name in self.FUSIONS:
            self.register_buffer(name, None, persistent=False)
        self._fusion_check = ()  # (owner module, attribute, address) of every fused parameter
        self.register_load_state_dict_post_hook(_refuse_after_load)

    def _fusion_intact(self) -> bool:
        for owner, attr, ptr in self._fusion_check:
            p = owner._parameters.get(attr)
            if type(p) is not nn.Parameter or p.data_ptr() != ptr:
                return False
        return True

    def _fusion_params(self, paths):
        """The parameters of one group, ``None`` when the module lacks one of them (a bias-free
        layer's bias group), or ``False`` when they exist but cannot share one buffer."""
        if not all(_has_param(self, p) for p in paths):
            return None
        params = [self.get_parameter(p) for p in paths]
        p0 = params[0]
        if any(type(p) is not nn.Parameter or type(p.data) is not torch.Tensor or not p.is_floating_point()
               or p.dtype != p0.dtype
               or p.device != p0.device or p.shape[1:] != p0.shape[1:] for p in params):
            return False
        return params

    @property
    def projections_fused(self) -> bool:
        """Whether any group of this module is fused."""
        return any(getattr(self, name) is not None for name in self.FUSIONS)

    def fused(self, name: str):
        """The fused buffer ``name`` for an inference forward, or ``None`` (not fused, or autograd
        is recording)."""
        w = getattr(self, name)
        if w is None or torch.is_grad_enabled():
            return None
        if not torch.compiler.is_compiling() and not self._fusion_intact():
            self.fuse_projections()  # rebuilt from the parameters as they are now (or un-fused)
            w = getattr(self, name)
        return w

    @torch.no_grad()
    def fuse_projections(self) -> bool:
        """Fuse every group this module can fuse (idempotent: an intact group is left as it is, a
        broken one rebuilt from its parameters). Returns :attr:`projections_fused`."""
        groups = {name: self._fusion_params(paths) for name, paths in self.FUSIONS.items()}
        if any(params is False for params in groups.values()):  # all or nothing (a weight without its bias)
            self.unfuse_projections()
            return False
        for name, params in groups.items():
            buf = getattr(self, name)
            if params is None:
                setattr(self, name, None)
                continue
            if buf is not None and _views_of(buf, params):
                continue
            w = torch.cat([p.detach() for p in params], dim=0)
            off = 0
            for p in params:
                p.data = w[off:off + p.shape[0]]
                off += p.shape[0]
            setattr(self, name, w)
        self._fusion_check = tuple(_owner_attr(self, path) + (self.get_parameter(path).data_ptr(),)
                                   for name, paths in self.FUSIONS.items() if groups[name] is not None
                                   for path in paths)
        return self.projections_fused

    @torch.no_grad()
    def unfuse_projections(self) -> None:
        """Give every fused parameter its own storage again and drop the buffers."""
        for name, paths in self.FUSIONS.items():
            if getattr(self, name) is None:
                continue
            for path in paths:
                if _has_param(self, path):
                    p = self.get_parameter(path)
                    p.data = p.detach().clone()
            setattr(self, name, None)
        self._fusion_check = ()

    def _apply(self, fn, recurse=True):
        fused = self.projections_fused
        for name in self.FUSIONS:  # not converted on its own: rebuilt from the converted parameters
            setattr(self, name, None)
        out = super()._apply(fn, recurse)
        if fused:
            self.fuse_projections()
        return out


def _owner_attr(module: nn.Module, path: str):
    mod, _, attr = path.rpartition(".")
    return (module.get_submodule(mod) if mod else module), attr


def _has_param(module: nn.Module, path: str) -> bool:
    mod, _, attr = path.rpartition(".")
    try:
        owner = module.get_submodule(mod) if mod else module
    except AttributeError:
        return False
    return owner._parameters.get(attr) is not None


def _views_of(buf: torch.Tensor, params) -> bool:
    """Whether ``params`` are, in order, the consecutive row blocks of ``buf``."""
    off = 0
    for p in params:
        if (p.dtype != buf.dtype or p.device != buf.device or p.shape[1:] != buf.shape[1:]
                or p.untyped_storage().data_ptr() != buf.untyped_storage().data_ptr()
                or off + p.shape[0] > buf.shape[0] or (p.numel() and p.data_ptr() != buf[off].data_ptr())
                or not p.is_contiguous()):
            return False
        off += p.shape[0]
    return off == buf.shape[0]


class SwiGLUMLP(FusedProjections, nn.Module):
    """``down(act(gate(x)) * up(x))``; fused (:meth:`~FusedProjections.fuse_projections`): one GEMM
    for ``[gate; up]``, then the same activation and product."""

    FUSIONS = {"gate_up_fused": ("gate_proj.weight", "up_proj.weight"),
               "gate_up_bias_fused": ("gate_proj.bias", "up_proj.bias")}

    def __init__(self, hidden_size: int, intermediate_size: int, hidden_act: str = "silu", bias: bool = False):
        super().__init__()
        if not isinstance(hidden_act, str) or hidden_act not in ACT2FN:
            raise ValueError(f"hidden_act must be an activation of transformers' ACT2FN (e.g. 'silu', 'gelu'), "
                             f"got {hidden_act!r}")
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias)
        self.act_fn = ACT2FN[hidden_act]
        self.hidden_act = hidden_act
        self._init_fusions()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.fused("gate_up_fused")
        if w is not None:
            gate, up = F.linear(x, w, self.gate_up_bias_fused).split(self.gate_proj.out_features, dim=-1)
            return self.down_proj(self.act_fn(gate) * up)
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))

    def takes_gemv(self) -> bool:
        """Whether :meth:`gemv_block` applies: ``[gate; up]`` fused into one weight, SiLU."""
        return self.fused("gate_up_fused") is not None and self.hidden_act == "silu"

    def gemv_block(self, h: torch.Tensor, norm, gemv, normed=None) -> torch.Tensor:
        """``h + self(norm(h))`` as two fused GEMVs (see :func:`linear`): the norm in the gate/up
        GEMV (or ``normed``, ``norm(h)`` computed already), SiLU x up and the residual in the
        down GEMV."""
        gu = linear(h if normed is None else normed, self.fused("gate_up_fused"), self.gate_up_bias_fused,
                    norm=norm if normed is None else None, gemv=gemv)
        return linear(gu, self.down_proj.weight, self.down_proj.bias, act="silu", residual=h, gemv=gemv)


def _default_rope(config, device=None, **kwargs):
    base = config.rope_parameters["rope_theta"]
    dim = int(config.head_dim * config.rope_parameters.get("partial_rotary_factor", 1.0))
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float, device=device) / dim))
    return inv_freq, 1.0


class RotaryEmbedding(nn.Module):
    """RoPE of any type transformers knows (``config.rope_parameters["rope_type"]``), using its
    init functions (``llama3``, ``yarn``, ``linear``, ``dynamic`` ... ) for the frequencies.

    ``forward(position_ids [B, T]) -> (cos, sin)`` each ``[B, T, rot_dim]`` in float32.
    The frequencies are computed once, as transformers' init functions give them without a length:
    ``dynamic`` as for ``max_position_embeddings``, ``longrope`` with its short factors at every
    length (transformers switches to the long factors past ``original_max_position_embeddings``;
    ``orthros convert`` notes the difference).
    """

    def __init__(self, config):
        super().__init__()
        self.config = config
        inv_freq, self.attention_scaling = self._compute(config)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    @staticmethod
    def _compute(config):
        rope_type = config.rope_parameters.get("rope_type", "default")  # a known one: OrthrosConfig checks it
        if rope_type == "default":
            inv_freq, scaling = _default_rope(config)
        else:
            inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](config, None)
        return inv_freq.float(), float(scaling)

    @torch.no_grad()
    def reset_buffers(self):
        """Recompute ``inv_freq`` (a non-persistent buffer: after loading from a checkpoint on the
        meta device it holds garbage until recomputed)."""
        self.inv_freq.copy_(self._compute(self.config)[0].to(self.inv_freq.device))

    def _apply(self, fn, recurse=True):
        """``inv_freq`` keeps at least float32 through ``.to(dtype)`` / ``.half()`` (only its device
        follows): rounded to bf16 (2^-9) it is off by radians at long distances, where a model built
        in bf16 computes it in float32."""
        inv_freq = self.inv_freq
        out = super()._apply(fn, recurse)
        if torch.finfo(self.inv_freq.dtype).bits < 32:
            self.inv_freq = inv_freq.to(self.inv_freq.device, torch.float32)
        return out

    @torch.no_grad()
    def forward(self, position_ids: torch.Tensor):
        freqs = position_ids[..., None].float() * self.inv_freq.to(position_ids.device)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos() * self.attention_scaling, emb.sin() * self.attention_scaling

"""Orthros Transformer (paper Algorithm 2) as HF-transformers-native model classes.

The backbone duplicates the embeddings of the output positions and appends them to the
sequence, runs every layer over the concatenation ``[base tokens | output tokens]`` (norms and
MLPs are token-wise; only attention treats the two streams differently), and computes logits
from the output tokens only. The last layer's base stream is never read again, so it computes
only its K/V (for the cache and the output queries); its window attention and MLP are skipped.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer, StaticLayer
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast
from transformers.utils.generic import can_return_tuple

from ..layers import DenseKV, OrthrosAttention, ResidualMLP, RMSNorm, RotaryEmbedding, StepInputs, SwiGLUMLP
from ..layers.gated_deltanet import GatedDeltaNet
from ..kinds import ATTENTION_LAYER_TYPES, LINEAR_LAYER_TYPE, MODE_ALIASES, has_output_stream
from ..ops import doc_ids_from_cu_seqlens
from ..ops.attention import as_int_tensor
from ..utils import first_id_outside, integer_ids
from .configuration_orthros import OrthrosConfig
from .positions import resolve_output_positions


# transformers renamed the cache argument/output field from `past_key_values` to `cache` (5.2x):
# one name, looked up once, used for both the forward's output and generate()'s keyword.
CACHE_KWARG = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


# transformers' caches built from a config (``DynamicCache(config=...)``, ``StaticCache(config=...)``) pick each
# layer's cache class by its ``layer_types`` entry, in mappings that a ``CacheLayerMixin`` subclass with a
# ``_layer_type`` joins when defined; Orthros' attention layer types were in neither (a bare ``KeyError:
# 'orthros_attention'``). Each keeps every token's K/V, as transformers' full-attention layers do: the dynamic
# cache so built is ``DynamicCache()``'s, the static one the forward refuses by name (its empty slots would be
# attended). Defining the classes registers them; nothing else uses them.
for _type in ATTENTION_LAYER_TYPES:
    if _type != "full_attention":  # (transformers' own)
        type(f"Dynamic_{_type}", (DynamicLayer,), {"_layer_type": _type, "__module__": __name__})
        type(f"Static_{_type}", (StaticLayer,), {"_layer_type": _type, "__module__": __name__})


class OrthrosCache(DynamicCache):
    """KV cache of the base stream: every token of every layer, never evicted.

    Output tokens write no K/V. Layout inside is transformers' ``[B, Hkv, L, D]``. It is a
    ``DynamicCache`` built without a config, so it has no sliding-window layers whatever the
    model config says: the output stream attends to all earlier keys.

    GDN layers (Orthros-H) keep their convolution window and recurrent state here too
    (:meth:`linear_state` / :meth:`set_linear_state`, the protocol of
    ``orthros/layers/gated_deltanet.py``); :meth:`get_seq_length` counts the tokens seen even
    when a model has no attention layer.
    """

    def __init__(self):
        super().__init__()
        self.linear_states = {}  # layer_idx -> (conv_state [B, C, W-1], recurrent_state [B, HV, K, V])
        self.linear_seen = 0  # tokens the GDN layers have consumed (set by the model's forward)

    def linear_state(self, layer_idx: int):
        return self.linear_states.get(layer_idx)

    def set_linear_state(self, layer_idx: int, conv_state, recurrent_state):
        self.linear_states[layer_idx] = (conv_state, recurrent_state)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        kv = [layer.get_seq_length() for layer in self.layers if getattr(layer, "is_initialized", True)]
        return max([self.linear_seen, *kv]) if layer_idx == 0 else super().get_seq_length(layer_idx)

    # generate()'s batch edits of the cache (beam search, ...) apply to the GDN states too
    def _edit_linear_states(self, fn):
        self.linear_states = {i: tuple(fn(s) for s in states) for i, states in self.linear_states.items()}

    def reorder_cache(self, beam_idx: torch.LongTensor):
        super().reorder_cache(beam_idx)
        self._edit_linear_states(lambda s: s.index_select(0, beam_idx.to(s.device)))

    def batch_repeat_interleave(self, repeats: int):
        super().batch_repeat_interleave(repeats)
        self._edit_linear_states(lambda s: s.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor):
        super().batch_select_indices(indices)
        self._edit_linear_states(lambda s: s[indices, ...])

    def reset(self):
        super().reset()
        self.linear_states, self.linear_seen = {}, 0

    @property
    def is_croppable(self) -> bool:
        """A GDN state cannot be rolled back (assisted decoding checks this and refuses)."""
        return not self.linear_states and super().is_croppable

    def crop(self, tokens_to_remove: int) -> None:
        if self.linear_states:
            raise ValueError("OrthrosCache.crop: the Gated DeltaNet layers' recurrent states cannot be rolled back "
                             "(no assisted / prompt-lookup decoding for a model with linear_attention layers)")
        super().crop(tokens_to_remove)
        self.linear_seen = 0  # no GDN state: the K/V count the tokens (the old count would outlive the crop)


def _project(layer, h, step: StepInputs, final: bool, slot=None):
    """Token-wise part 1 of the layer step: the input norm, then the mixer's projections (the
    mixer applies the norm: inside its QKV GEMV under ``step.gemv``); with a cache ``slot``
    (:meth:`StepInputs.write_slot`) also the cache write of the K/V (``p[2:4]`` of an attention
    layer's projections), fused with the RoPE that produced them."""
    p = layer.mixer.project(h, step, final, norm=layer.input_layernorm)
    if slot is not None:
        step.cache.write(slot, p[2], p[3])
    return p


def _finish(layer, h, o, step: StepInputs, final: bool):
    """Token-wise part 2: the last layer's rows (it keeps only those the logits are computed
    from), the mixer's output projection with the residual, then the MLP block."""
    if final:
        h = step.output_rows(h)
    if step.gemv is None:
        a = layer.mixer.output(o, step, final, residual=h)  # h + W_O o (None: nothing to add)
        return layer.post_attention(h if a is None else a, None)
    # the GEMVs: W_O's launch may also write the MLP's input norm (its split-K reduce sees whole rows)
    a = layer.mixer.output(o, step, final, residual=h, out_norm=layer.post_attention_layernorm)
    a, normed = (h, None) if a is None else a
    return layer.post_attention(a, None, gemv=step.gemv, normed=normed)


def _one_input(input_ids, inputs_embeds) -> torch.Tensor:
    """The forward's input: exactly one of ``input_ids`` and ``inputs_embeds`` is given."""
    if (input_ids is None) == (inputs_embeds is None):
        raise ValueError("pass exactly one of input_ids or inputs_embeds")
    x, name, shape = (input_ids, "input_ids", "[B, T]") if inputs_embeds is None else \
        (inputs_embeds, "inputs_embeds", "[B, T, hidden_size]")
    if not isinstance(x, torch.Tensor):  # a list failed with AttributeError ('list' object has no attribute 'dim')
        raise TypeError(f"{name} must be a torch.Tensor {shape}, got {type(x).__name__}")
    if x.dim() != shape.count(",") + 1:  # an unbatched input failed deep inside (IndexError, a norm's size)
        raise ValueError(f"{name} must be {shape} (a batch, even of one), got shape {tuple(x.shape)}")
    return x


def _check_embeds_dtype(embeds: torch.Tensor, model_dtype: torch.dtype) -> None:
    """``inputs_embeds`` must be floating (integer or bool ones ran, as embeddings nobody meant) and not wider
    than the model's dtype, which the first projection then failed on (``expected m1 and m2 to have the same
    dtype``); narrower ones are promoted by the first norm, and under autocast any but float64 are cast."""
    if not embeds.is_floating_point():
        raise TypeError(f"inputs_embeds must be a floating tensor of embeddings ({model_dtype}, the model's dtype), "
                        f"got {embeds.dtype}")
    if torch.promote_types(embeds.dtype, model_dtype) != model_dtype and (
            embeds.dtype == torch.float64 or not torch.is_autocast_enabled(embeds.device.type)):
        autocast = "" if embeds.dtype == torch.float64 else " or run under torch.autocast"
        raise ValueError(f"inputs_embeds must be of the model's dtype {model_dtype} (or narrower), got "
                         f"{embeds.dtype}: cast them (.to({model_dtype})){autocast}")


def _checked_ids(ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``input_ids`` as the embedding takes them: integer token ids in ``[0, vocab_size)``. Another
    dtype is a ``TypeError`` (torch named the embedding's ``indices``); integer ids other than int32 /
    int64 (a token file's uint16, an int16 tensor) are widened (``orthros.utils.integer_ids``). An id
    outside the vocabulary is a ``ValueError`` naming the first one
    (``input_ids[b, t] = value``, as ``generate`` names it) instead of the embedding's bare
    ``IndexError``, but only for ids off CUDA and outside ``torch.compile``: reading a CUDA
    tensor's values would synchronise every forward (and break CUDA-graph capture), so there an
    id out of range is left to the embedding's device-side assert."""
    wide = integer_ids(ids, "input_ids")
    if ids.device.type == "cpu" and not torch.compiler.is_compiling():
        bad = first_id_outside(ids, vocab_size)
        if bad is not None:
            (b, t), value = bad
            raise ValueError(f"input_ids has token ids outside the vocabulary [0, vocab_size={vocab_size}): "
                             f"input_ids[{b}, {t}] = {value}")
    return wide


def _cache_rows(cache) -> Optional[int]:
    """The batch size of what a cache holds (its first filled K/V layer, else its GDN states), or None."""
    for layer in cache.layers:
        if getattr(layer, "is_initialized", False) and layer.keys.dim() == 4:
            return layer.keys.shape[0]
    states = getattr(cache, "linear_states", None)
    return next(iter(states.values()))[0].shape[0] if states else None


def _check_cache_fits(model, cache, B: int, past: int) -> None:
    """A cache holding ``past`` tokens continues only with the batch it was filled with, in a model of the
    config that filled it: every attention layer's K/V ``[B, num_key_value_heads, past, head_dim]``, every GDN
    layer's state, nothing for layers the model lacks. Otherwise a ``ValueError`` naming the first layer that
    differs, before any layer runs (other K/V heads or head_dim failed in a layer's torch.cat; other layers
    or layer kinds ran without an error, with wrong logits)."""
    rows = _cache_rows(cache)
    if rows is not None and rows != B:  # failed in the first layer's torch.cat ("Sizes of tensors must match")
        raise ValueError(f"past_key_values (cache) holds {rows} sequences, the input {B} rows: continue a cache "
                         f"with the batch it was filled with")
    states = getattr(cache, "linear_states", None)  # None: no OrthrosCache (a GDN layer names that itself)

    def held(i):
        kv = cache.layers[i] if i < len(cache.layers) else None
        if kv is not None and getattr(kv, "is_initialized", False) and kv.get_seq_length():
            return "K/V", (*kv.keys.shape[:2], kv.get_seq_length(), kv.keys.shape[-1])
        if states and i in states:
            return "GDN", tuple(states[i][0].shape), tuple(states[i][1].shape)
        return ("nothing",)

    def wanted(i):
        if i >= len(model.layers):
            return ("nothing",)
        mixer = model.layers[i].mixer
        if model.layers[i].layer_type != LINEAR_LAYER_TYPE:
            return "K/V", (B, model.config.num_key_value_heads, past, model.config.head_dim)
        if states is None:
            return None
        return "GDN", (B, mixer.conv_dim, mixer.conv_kernel_size - 1), \
            (B, mixer.num_v_heads, mixer.head_k_dim, mixer.head_v_dim)

    def say(entry):  # formatted only for the error
        if entry[0] == "GDN":
            return f"a GDN state (conv {list(entry[1])}, recurrent {list(entry[2])})"
        return f"K/V {list(entry[1])}" if entry[0] == "K/V" else "nothing"

    for i in range(max(len(model.layers), len(cache.layers), *(j + 1 for j in states or ()))):
        want, have = wanted(i), held(i)
        if want is not None and have != want:
            raise ValueError(f"past_key_values (cache) does not fit this model at layer {i}: it holds {say(have)}, "
                             f"the model ({len(model.layers)} layers, num_key_value_heads="
                             f"{model.config.num_key_value_heads}, head_dim={model.config.head_dim}) needs "
                             f"{say(want)} after {past} tokens: continue a cache in the model (config) that filled it")


def _refuse_extra_outputs(config, kwargs) -> None:
    """``output_attentions`` / ``output_hidden_states`` (HF's per-layer outputs) are not computed:
    refused instead of returning ``None`` where the caller expects them."""
    for name in ("output_attentions", "output_hidden_states"):
        if kwargs.get(name) or (kwargs.get(name) is None and getattr(config, name, False)):
            raise ValueError(f"{name}=True is not supported by Orthros models (no per-layer outputs are kept; "
                             f"OrthrosModel returns the final hidden states of the output positions)")


class OrthrosDecoderLayer(ResidualMLP, GradientCheckpointingLayer):
    """One decoder layer; :meth:`forward` is THE layer step of every execution path.

    ``pre_attention(h)`` (input norm) -> ``mixer.project`` (token-wise: queries, K/V) ->
    ``mixer.attend`` (the step's cache: update + kernels) -> ``mixer.output`` (W_O) ->
    ``post_attention(h, a)`` (residual + MLP). The token-wise pieces run through ``step.run``,
    so the engine can compile them (one graph for every layer) while cache writes and kernels
    stay outside. The mixer is the layer's sequence mixer (``self_attn`` for the attention
    kinds of ``config.layer_types``).
    """

    def __init__(self, config: OrthrosConfig, layer_idx: int):
        super().__init__()
        self.layer_type = config.layer_types[layer_idx]
        if self.layer_type == LINEAR_LAYER_TYPE:  # Orthros-H: a Gated DeltaNet layer (Qwen3.5's name)
            self.linear_attn = GatedDeltaNet(config, layer_idx)
        else:
            self.self_attn = OrthrosAttention(config, layer_idx)
        self.mlp = SwiGLUMLP(config.hidden_size, config.intermediate_size, config.hidden_act, bias=config.mlp_bias)
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    @property
    def mixer(self):
        return self.linear_attn if self.layer_type == LINEAR_LAYER_TYPE else self.self_attn

    def pre_attention(self, h: torch.Tensor) -> torch.Tensor:
        """The input norm (the layer step hands ``input_layernorm`` to the mixer's ``project``
        instead, which may fuse it into its GEMV)."""
        return self.input_layernorm(h)

    def forward(self, h: torch.Tensor, step: StepInputs, final: bool = False) -> torch.Tensor:
        """``h [B, n_base (+ T_out), d]`` -> the next hidden states; ``final`` (the last layer):
        only the rows the logits are computed from."""
        p = step.run(_project, self, h, step, final, step.write_slot(self.mixer.layer_idx))
        o = self.mixer.attend(p, step, final)
        return step.run(_finish, self, h, o, step, final)


class OrthrosPreTrainedModel(PreTrainedModel):
    config_class = OrthrosConfig
    config: OrthrosConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["OrthrosDecoderLayer"]
    _supports_sdpa = True

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        """transformers' ``from_pretrained``, after checking a local directory's safetensors files
        (a damaged one is named; a missing local path is never a hub lookup) and, without a
        ``config``, that it is an Orthros checkpoint: ``checkpoint_files.py``."""
        from ..checkpoint_files import check_local_checkpoint

        path = check_local_checkpoint(pretrained_model_name_or_path, kwargs.get("subfolder") or "",
                                      config_given=kwargs.get("config") is not None)
        return super().from_pretrained(path, *args, **kwargs)

    def save_pretrained(self, save_directory, *args, **kwargs):
        """transformers' ``save_pretrained``, after checking the config: one that would not load
        (a field set after its ``__init__``) writes nothing, not even the directory; and the path
        (``checkpoint_files.save_directory``: ``~`` expanded as ``from_pretrained`` expands it, a file refused). The config's
        save writes the flat modeling code and ``auto_map`` (``remote_code.py``), so the package's class,
        registered with ``register_for_auto_class``, is hidden from transformers here: its
        ``custom_object_save`` would copy the package's own file (parent-relative imports) and fail
        scanning them."""
        from ..checkpoint_files import save_directory as checked

        self.config.validate()
        save_directory = checked(save_directory)
        if type(self).__module__.split(".")[0] != "orthros":  # a flat copy (or a user's class) copies itself
            return super().save_pretrained(save_directory, *args, **kwargs)
        from .remote_code import auto_class_hidden

        with auto_class_hidden(type(self)):
            return super().save_pretrained(save_directory, *args, **kwargs)

    @torch.no_grad()
    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, RotaryEmbedding):
            module.reset_buffers()
        if isinstance(module, OrthrosAttention):
            module.reset_scale_offset(only_uninitialized=True)
        if isinstance(module, GatedDeltaNet):
            module.init_gdn_parameters(only_uninitialized=True)


def warn_beyond_positions(config, n: int, stacklevel: int = 2) -> None:
    """Positions ``0 .. n - 1`` past ``config.max_position_embeddings`` are computed anyway
    (transformers' convention) with a warning (once a call site); the engine refuses them
    (docs/checkpoints.md)."""
    if n > config.max_position_embeddings:
        warnings.warn(f"input positions beyond max_position_embeddings={config.max_position_embeddings}: "
                      f"the model was not built for them and may degrade there", UserWarning, stacklevel=stacklevel + 1)


def _layer_fields(config) -> dict:
    """The config fields the layers are built from (and keep): a change after the model is built would
    not reach them."""
    mode = config.attention_mode
    return {"attention_mode": MODE_ALIASES.get(mode, mode), "window_size": config.window_size,  # an alias: that mode
            "layer_types": list(config.layer_types)}


class OrthrosModel(OrthrosPreTrainedModel):
    def __init__(self, config: OrthrosConfig):
        config._validate()  # fields set after the config's __init__ (from_pretrained's keywords, a user's edits)
        super().__init__(config)
        self._built_with = _layer_fields(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, config.pad_token_id)
        self.layers = nn.ModuleList([OrthrosDecoderLayer(config, i) for i in range(config.num_hidden_layers)])
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(config)
        self.gradient_checkpointing = False
        if not any(getattr(layer, "self_attn", None) is not None and layer.self_attn.scale_offset_params()
                   for layer in self.layers):  # an Orthros checkpoint run as full / window attention (a choice):
            # its alpha / beta have no place in these layers, and transformers' load report listed them as UNEXPECTED
            self._keys_to_ignore_on_load_unexpected = [r"self_attn\.(alpha|beta)(_out)?$"]
        self.post_init()

    def get_input_embeddings(self):
        return self.embed_tokens

    def set_input_embeddings(self, value):
        self.embed_tokens = value

    @can_return_tuple  # return_dict=False (or config.return_dict=False): a tuple, as transformers' models
    def forward(
        self,
        input_ids: Optional[torch.LongTensor] = None,
        attention_mask: Optional[torch.Tensor] = None,
        position_ids: Optional[torch.LongTensor] = None,
        past_key_values: Optional[Cache] = None,
        inputs_embeds: Optional[torch.Tensor] = None,
        use_cache: Optional[bool] = None,
        output_positions: Optional[torch.Tensor] = None,
        cu_seqlens: Optional[torch.Tensor] = None,
        cache: Optional[Cache] = None,
        **kwargs,
    ) -> BaseModelOutputWithPast:
        """Returns the final (normed) hidden states of the output tokens ``[B, T_out, d]``.

        ``output_positions``: ``[1 or B, T_out]`` positions within this input (default: all).
        """
        past_key_values = cache if past_key_values is None else past_key_values
        if past_key_values is not None and not isinstance(past_key_values, Cache):  # failed in .get_seq_length
            raise ValueError(f"past_key_values (cache) must be a transformers Cache (an OrthrosCache, or None for a new "
                             f"one), got {type(past_key_values).__name__}: transformers 4.x's tuples of (k, v) are "
                             f"not taken")
        if past_key_values is not None and type(past_key_values) is not OrthrosCache and \
                any(layer.is_sliding or layer.is_compileable for layer in past_key_values.layers):
            # a static layer's empty slots were attended as keys, a sliding one dropped old tokens: wrong logits
            raise ValueError(f"past_key_values (cache) must keep every token's K/V, each once (the output stream "
                             f"attends to all of them), got a {type(past_key_values).__name__} with sliding-window "
                             f"or static layers: pass an OrthrosCache, a DynamicCache() built without a config, "
                             f"or None for a new one")
        _refuse_extra_outputs(self.config, kwargs)
        self.check_layer_fields()
        x = _one_input(input_ids, inputs_embeds)
        if inputs_embeds is None:
            x = _checked_ids(x, getattr(self.embed_tokens, "num_embeddings", self.config.vocab_size))
        h = self.embed_tokens(x) if inputs_embeds is None else x
        if h.shape[-1] != self.config.hidden_size:  # inputs_embeds of another width failed in the first norm
            raise ValueError(f"inputs_embeds must be [B, T, hidden_size] = [*, *, {self.config.hidden_size}], got "
                             f"shape {tuple(h.shape)}")
        if inputs_embeds is not None:
            _check_embeds_dtype(h, self.embed_tokens.weight.dtype)
        B, T = h.shape[:2]
        dev = h.device
        if T == 0:
            raise ValueError(f"{'input_ids' if inputs_embeds is None else 'inputs_embeds'} must hold at least one token")
        if use_cache not in (None, True, False):  # "false" (a string from a command line or JSON) made a cache
            raise ValueError(f"use_cache must be None (config.use_cache), True or False, got {use_cache!r}")
        if cu_seqlens is not None:  # a cache holds one sequence a row; packed rows hold several
            if use_cache or past_key_values is not None:
                raise ValueError("cu_seqlens (packed documents) cannot be combined with a KV cache (use_cache=True "
                                 "or past_key_values): a cache holds one sequence a row")
            use_cache = False
        use_cache = self.config.use_cache if use_cache is None else use_cache
        if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
            # without gradients nothing is recomputed: the cache stays (generate in training mode)
            use_cache, past_key_values = False, None
        cache_given = past_key_values is not None
        if use_cache and past_key_values is None:
            past_key_values = OrthrosCache()
        cache = past_key_values  # a given cache is used (and extended) whatever use_cache, as transformers' models do
        past = cache.get_seq_length() if cache is not None else 0
        if past:
            _check_cache_fits(self, cache, B, past)
        if position_ids is None and cu_seqlens is None:
            warn_beyond_positions(self.config, past + T, stacklevel=3)

        kv_start = pad_rows = None
        if attention_mask is not None:
            attention_mask = as_int_tensor("attention_mask", attention_mask, dev, "a tensor of 0 / 1 [B, past + T]")
            if attention_mask.shape != (B, past + T):
                raise ValueError(f"attention_mask must be [B, past + T] = [{B}, {past + T}], got "
                                 f"{tuple(attention_mask.shape)}")
            am = attention_mask.long()
            if not bool((attention_mask == 1).all()):  # the values as given: .long() cut a float 0.5 to 0, 1.5 to 1
                if not bool(((attention_mask == 0) | (attention_mask == 1)).all()):
                    bad = attention_mask[(attention_mask != 0) & (attention_mask != 1)][0].item()  # (on failure only)
                    raise ValueError(f"attention_mask must hold 1 (token) and 0 (padding) only, got {bad!r} "
                                     f"({attention_mask.dtype})")
                left = bool((am[:, 1:] >= am[:, :-1]).all())
                if not left and not cache_given and bool((am[:, 1:] <= am[:, :-1]).all()):
                    # right padding (tokenizers' default; training, scoring): under causal attention every real
                    # token's output is what it is without the pads, so the mask changes nothing there. A cache
                    # would hold the pads between the prompt and what follows it: none is made.
                    am, cache = None, None
                elif not left:
                    raise ValueError("attention_mask must be 0/1 with padding on the left (0 ... 0 1 ... 1), or on "
                                     "the right (1 ... 1 0 ... 0) when no cache is given (a forward for a loss or "
                                     "scores; generation takes left padding)")
                elif cu_seqlens is not None:
                    raise ValueError("cu_seqlens cannot be combined with a padding attention_mask")
                if am is not None:
                    kv_start = (am == 0).sum(dim=1)
                    pad_rows = am[:, past:] == 0
                    if position_ids is None:
                        position_ids = (am.cumsum(dim=1) - 1).clamp(min=0)[:, past:]
        doc = None
        if cu_seqlens is not None:  # validated once here, not in every layer
            doc = doc_ids_from_cu_seqlens(cu_seqlens, B, T, dev)  # before .long(): floats are refused, not cut
            cu_seqlens = torch.as_tensor(cu_seqlens, device=dev).long()
        if position_ids is None:
            if doc is not None:  # RoPE positions restart in every document
                position_ids = (torch.arange(T, device=dev) - cu_seqlens[doc]).view(1, T)
            else:
                position_ids = torch.arange(past, past + T, device=dev).view(1, T)
        position_ids = as_int_tensor("position_ids", position_ids, dev, "integer positions [T] or [1 or B, T]")
        # 0.5 was cut to 0, True to 1: RoPE at positions nobody asked for
        position_ids = integer_ids(position_ids, "position_ids", what="integers", error=ValueError).long()
        if position_ids.dim() == 1:
            position_ids = position_ids.view(1, -1)
        if position_ids.dim() != 2 or position_ids.shape[0] not in (1, B) or position_ids.shape[1] != T:
            raise ValueError(f"position_ids must be [T] or [1 or B, T] = [1 or {B}, {T}], got {tuple(position_ids.shape)}")

        out_rel = resolve_output_positions(T, output_positions=output_positions, device=dev)
        if out_rel.shape[0] not in (1, B):
            raise ValueError(f"output_positions must be [T_out] or [1 or B, T_out] = [1 or {B}, T_out], "
                             f"got {tuple(out_rel.shape)}")
        pos_out = torch.gather(position_ids.expand(max(B, out_rel.shape[0]), T), 1, out_rel.expand(B, -1))
        step = StepInputs(
            n_base=T,
            rope_base=self.rotary_emb(position_ids),
            rope_out=self.rotary_emb(pos_out),
            out_rel=out_rel,
            output_tokens=has_output_stream(self.config.attention_mode),
            cache=DenseKV(cache),
            output_positions=out_rel + past,
            doc_ids=doc,
            cu_seqlens=cu_seqlens,
            kv_start=kv_start,
            pad_rows=pad_rows,
        )
        h = self.run_layers(step.with_output_tokens(h), step)
        if isinstance(cache, OrthrosCache):
            cache.linear_seen = past + T
        return BaseModelOutputWithPast(last_hidden_state=self.norm(h), **{CACHE_KWARG: cache})

    def check_layer_fields(self, names=("attention_mode", "window_size", "layer_types")) -> None:
        """``config.attention_mode`` / ``window_size`` / ``layer_types`` (those of ``names``) set after the
        model was built: a ``ValueError`` naming the field (the layers keep what they were built with; a
        mode failed in a layer with a tensor size error, a window was ignored). The model's forward checks
        all three; the engine, whose attention mode is its own setting, the other two."""
        built = getattr(self, "_built_with", None)  # (a model built by a path that skipped __init__: unchecked)
        if built is None:
            return
        now = _layer_fields(self.config)
        name = next((k for k in names if now[k] != built[k]), None)
        if name is not None:
            raise ValueError(f"config.{name} was set to {now[name]!r} after the model was built with {built[name]!r}: "
                             f"the layers keep what they were built with. Build the model from the changed config "
                             f"(OrthrosForCausalLM(config), then load_state_dict), or load a checkpoint with "
                             f"from_pretrained(path, {name}=...); the engine takes Engine(model, attention_mode=...)")

    def run_layers(self, h: torch.Tensor, step: StepInputs) -> torch.Tensor:
        """Every layer's step over ``h`` (built by the caller: the model's forward, the engine);
        returns the last layer's rows the logits are computed from."""
        n = len(self.layers)
        for i, layer in enumerate(self.layers):
            h = layer(h, step, final=(i == n - 1))
        return h


_GENERATE_BACKEND = None  # set by orthros.engine (which sits above this module)


def register_generate_backend(fn) -> None:
    """Let ``OrthrosForCausalLM.generate`` hand requests to ``fn(model, args, kwargs, required)``,
    which returns the output ids or ``None`` ("use transformers"). Called by ``orthros.engine``."""
    global _GENERATE_BACKEND
    _GENERATE_BACKEND = fn


def _register_engine() -> None:
    """Register ``orthros.engine`` behind ``generate()``: imported at call time only (the engine sits
    above this module), by name (a checkpoint's remote-code copy of this module collects the modules
    it imports, and has no engine: it runs transformers' generate)."""
    if __name__ == "orthros.models.modeling_orthros":
        importlib.import_module("orthros.engine").register()


def _check_generate_mask(mask, ids, embeds) -> None:
    """``generate``'s ``attention_mask``: a tensor of the prompt's shape ``[B, T]``. transformers drops an
    all-ones mask before the forward sees it, so one of another shape ran (``[B, T + 1]``, ``[1, T]``) or
    failed naming ``position_ids``, which it computes from the mask; a list or a 1-D mask failed inside
    transformers (AttributeError, IndexError). Its values are the forward's to check."""
    if mask is None:
        return
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"attention_mask must be a torch.Tensor [B, T] of 1 (token) / 0 (left padding), got "
                        f"{type(mask).__name__}")
    prompt = ids if isinstance(ids, torch.Tensor) else embeds
    want = tuple(prompt.shape[:2]) if isinstance(prompt, torch.Tensor) else None
    if want is not None and tuple(mask.shape) != want:
        name = "input_ids" if prompt is ids else "inputs_embeds"
        raise ValueError(f"attention_mask must be [B, T] like {name} = {list(want)}, got shape {tuple(mask.shape)}")


class OrthrosForCausalLM(OrthrosPreTrainedModel, GenerationMixin):
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: OrthrosConfig):
        super().__init__(config)
        self.model = OrthrosModel(config)
        self.vocab_size = config.vocab_size
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def set_input_embeddings(self, value):
        self.model.embed_tokens = value

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, value):
        self.lm_head = value

    @can_return_tuple
    def forward(
        self,
        input_ids: Optional[torch.LongTensor] = None,
        attention_mask: Optional[torch.Tensor] = None,
        position_ids: Optional[torch.LongTensor] = None,
        past_key_values: Optional[Cache] = None,
        inputs_embeds: Optional[torch.Tensor] = None,
        labels: Optional[torch.LongTensor] = None,
        use_cache: Optional[bool] = None,
        logits_to_keep=0,
        output_positions=None,
        cu_seqlens: Optional[torch.Tensor] = None,
        cache: Optional[Cache] = None,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        """``logits[:, i]`` is the output-stream prediction at the i-th output position (the
        next token after it). Output positions: ``output_positions`` if given; else where the
        shifted ``labels`` are not -100; else the last ``logits_to_keep`` (old name
        ``num_logits_to_keep``); else every position.
        With packed documents (``cu_seqlens``) no position is scored against the next document's
        first token. ``loss`` is the mean cross-entropy over the scored positions, or their summed cross-entropy
        divided by ``num_items_in_batch`` (at least 1) when given (HF ``Trainer`` passes the scored tokens of all
        its gradient-accumulation micro-batches, and then does not divide the loss itself)."""
        if "num_logits_to_keep" in kwargs:  # transformers < 4.50's name (unread, it kept every position's logits)
            if not (isinstance(logits_to_keep, int) and logits_to_keep == 0):
                raise ValueError("pass logits_to_keep or its old name num_logits_to_keep, not both")
            logits_to_keep = kwargs.pop("num_logits_to_keep")
        x = _one_input(input_ids, inputs_embeds)
        T, dev = x.shape[1], x.device
        if labels is not None:  # int32 ids (NumPy token files) failed in cross_entropy, floats were cut to ids
            if not isinstance(labels, torch.Tensor) or labels.dtype == torch.bool or labels.is_floating_point() \
                    or labels.is_complex():
                what = labels.dtype if isinstance(labels, torch.Tensor) else type(labels).__name__
                raise ValueError(f"labels must be a tensor of integer token ids [B, T] (-100: not scored), got {what}")
            labels = labels.long()
            if labels.device.type == "cpu" and not torch.compiler.is_compiling():  # (CUDA: not read, no sync)
                bad = first_id_outside(labels, self.config.vocab_size, labels != -100)
                if bad is not None:  # cross_entropy's "IndexError: Target 50 is out of bounds" named no argument
                    raise ValueError(f"labels must be token ids in [0, vocab_size={self.config.vocab_size}) or -100 "
                                     f"(not scored), got labels[{', '.join(map(str, bad[0]))}] = {bad[1]}")
        if labels is not None and labels.shape[0] != x.shape[0]:
            raise ValueError(f"labels must be [B, T] like input_ids, got {tuple(labels.shape)} for B = {x.shape[0]}")
        if labels is not None and cu_seqlens is not None and labels.dim() == 2 and labels.shape[1] == T:
            # a document's first token is no target of the one before it (the model validates cu_seqlens)
            starts = as_int_tensor("cu_seqlens", cu_seqlens, labels.device, "a 1-D integer tensor [num_docs + 1]")
            starts = starts.long()[1:-1]
            labels = labels.index_fill(1, starts[(starts > 0) & (starts < T)], -100)
        out_rel = resolve_output_positions(T, labels=labels, logits_to_keep=logits_to_keep,
                                           output_positions=output_positions, device=dev)
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         past_key_values=cache if past_key_values is None else past_key_values, inputs_embeds=inputs_embeds, use_cache=use_cache,
                         output_positions=out_rel, cu_seqlens=cu_seqlens, return_dict=True,
                         **{k: kwargs.get(k) for k in ("output_attentions", "output_hidden_states")})
        logits = self.lm_head(out.last_hidden_state)
        loss = None
        if labels is not None:
            B = logits.shape[0]
            nxt = (out_rel + 1).expand(B, -1)
            targets = torch.gather(labels.to(dev), 1, nxt.clamp(max=T - 1)).masked_fill(nxt >= T, -100)
            valid = targets != -100
            # in float32 at least (a float64 model's loss was rounded to float32, its gradients with it)
            upcast = logits.to(torch.promote_types(logits.dtype, torch.float32))
            ce = F.cross_entropy(upcast.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100,
                                 reduction="sum")
            n = kwargs.get("num_items_in_batch")
            # clamped like the count of scored positions: a Trainer step whose micro-batches score nothing
            # (num_items_in_batch=0) had a NaN loss (0 / 0), where the default path gives 0
            loss = ce / (valid.sum() if n is None else torch.as_tensor(n, device=ce.device)).clamp(min=1)
        return CausalLMOutputWithPast(loss=loss, logits=logits, **{CACHE_KWARG: getattr(out, CACHE_KWARG)})

    def generate(self, *args, use_engine: Optional[bool] = None, **kwargs):
        """transformers' ``generate`` with an :class:`OrthrosCache` unless a cache is given, or
        the inference engine's (``orthros.engine``, registered when it is imported):
        ``use_engine=None`` takes the engine on CUDA for requests it serves exactly,
        ``True`` always (raising for a request it cannot serve), ``False`` never. See
        ``orthros/engine/hf_generate.py``."""
        if use_engine not in (None, True, False):
            raise ValueError(f"use_engine must be None (auto), True or False, got {use_engine!r}")
        ids = args[0] if args else kwargs.get("input_ids", kwargs.get("inputs"))
        if ids is not None and not isinstance(ids, torch.Tensor):  # transformers: AttributeError ('str' ... 'type')
            raise TypeError(f"input_ids must be a torch.Tensor of token ids [B, T] (torch.as_tensor(...) of a NumPy "
                            f"array or a list), got {type(ids).__name__}")
        bad = isinstance(ids, torch.Tensor) and (ids.dim() != 2 or not ids.shape[1])
        if bad and kwargs.get("inputs_embeds") is None:  # transformers' generate fails in its indexing (IndexError)
            raise ValueError(f"input_ids must be [B, T] with T >= 1 (a batch, even of one), got shape "
                             f"{tuple(ids.shape)}")
        _check_generate_mask(kwargs.get("attention_mask"), ids, kwargs.get("inputs_embeds"))
        if use_engine is not False:
            if _GENERATE_BACKEND is None:  # not registered yet (orthros.engine was imported before the models)
                _register_engine()
            if _GENERATE_BACKEND is not None:
                out = _GENERATE_BACKEND(self, args, kwargs, required=use_engine is True)
                if out is not None:
                    return out
            elif use_engine:
                raise RuntimeError("generate(use_engine=True) needs the engine: import orthros.engine first")
        # kwargs over a given generation_config (generate's second parameter) over the model's (which transformers
        # fills unset fields from)
        configs = (args[1] if len(args) > 1 else kwargs.get("generation_config"), self.generation_config)
        impl = kwargs["cache_implementation"] if "cache_implementation" in kwargs else \
            next((c for c in (getattr(g, "cache_implementation", None) for g in configs) if c is not None), None)
        if impl not in (None, "dynamic"):  # transformers' other caches are built from layer_types it does not know
            raise ValueError(f"cache_implementation={impl!r} is not supported by Orthros models: generate() keeps "
                             f"every token's K/V (and the GDN states) in an OrthrosCache; leave it unset or 'dynamic'")
        use_cache = next((u for u in (kwargs.get("use_cache"), *(getattr(g, "use_cache", None) for g in configs))
                          if u is not None), True)
        if kwargs.get("past_key_values") is None and kwargs.get("cache") is None and use_cache:
            kwargs[CACHE_KWARG] = OrthrosCache()
            if impl is not None:  # "dynamic": the OrthrosCache is one (set only then: beside a generation_config
                kwargs["cache_implementation"] = None  # transformers warns of any generation argument)
        return super().generate(*args, **kwargs)


__all__ = ["OrthrosCache", "OrthrosModel", "OrthrosForCausalLM", "OrthrosPreTrainedModel"]

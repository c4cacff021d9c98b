"""Configuration of Orthros models (HF ``PreTrainedConfig``, ``model_type = "orthros"``)."""

from __future__ import annotations

import contextlib
import math
import operator
import os
from collections.abc import Mapping

from transformers import PreTrainedConfig
from transformers.activations import ACT2FN
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from ..kinds import (ATTENTION_LAYER_TYPES, ATTENTION_MODES, LINEAR_LAYER_TYPE, interval_layer_types,
                     resolve_layer_types, resolve_mode, with_attention_mode)
from ..ops.backends import BACKENDS as ATTN_BACKENDS
from ..utils import check_positive_int


# Llama / Qwen config fields an Orthros model does not implement: (name, the value that means "off", what it did
# there), refused at any other value
_NOT_IMPLEMENTED = (("attention_dropout", 0.0, "attention takes no dropout here"),
                    ("use_sliding_window", False, "the base stream's window is `window_size`"))

NO_SLIDING_WINDOW = ("OrthrosConfig has no `sliding_window` (it would make transformers' caches drop tokens the "
                     "output stream needs); use `window_size`")


def _finite_number(x) -> bool:
    return not isinstance(x, bool) and isinstance(x, (int, float)) and math.isfinite(x)


def _check_rope_dict(name: str, value, none: bool = False) -> None:
    if not isinstance(value, Mapping) and not (none and value is None):
        raise ValueError(f"OrthrosConfig.{name} must be a dict (e.g. {{'rope_type': 'default', 'rope_theta': "
                         f"10000.0}}){' or None' if none else ''}, got {type(value).__name__} {value!r:.80}")


class OrthrosConfig(PreTrainedConfig):
    r"""Llama/Qwen-style decoder with Orthros attention.

    Beyond the usual HF fields:

    * ``window_size`` (default 128): keys seen by the base (sliding-window) stream, the query's
      own position included. Deliberately *not* called ``sliding_window``: transformers' caches
      would then drop old tokens, and the output stream needs every token's K/V.
    * ``scale_offset`` (default True): learnable per-stream query transforms alpha, beta,
      alpha', beta' (initialised 1, 0, 1, 0).
    * ``attention_mode``: ``"orthros"`` (default); or the ablation baselines ``"full"`` (causal
      Transformer) and ``"window"`` (sliding window only), same code path (aliases
      ``"transformer"``, ``"swa"``: ``orthros/kinds.py``).
    * ``layer_types``: the kind of every layer (``"orthros_attention"``, ``"full_attention"``,
      ``"window_attention"``), default ``attention_mode``'s kind for every layer. The attention
      layers of one model share one kind, which is then the model's ``attention_mode``.
    * ``attention_bias``: bias on q/k/v (Qwen2); ``o_proj_bias``: bias on the output projection
      (Llama's ``attention_bias=True`` sets both); ``qk_norm``: per-head RMSNorm of q and k (Qwen3).
    * Orthros-H (paper Section 4.6): ``"linear_attention"`` entries of ``layer_types`` are Gated
      DeltaNet layers, sized by Qwen3.5's fields ``linear_num_key_heads``,
      ``linear_num_value_heads`` (a multiple of the key heads), ``linear_key_head_dim``,
      ``linear_value_head_dim`` (defaults: the attention's heads and head_dim) and
      ``linear_conv_kernel_dim`` (4). ``full_attention_interval=N`` (Qwen3.5's name), when
      ``layer_types`` is not given: every N-th layer an attention layer of ``attention_mode``
      (N <= ``num_hidden_layers``), the others GDN (``orthros/kinds.py`` ``hybrid_layout``: ``"orthros-h"``, ``"linear-hybrid"``,
      ``"gdn"``). ``attn_output_gate``: Qwen3.5's sigmoid gate on the attention output (``q_proj``
      holds query and gate per head).
    * ``attn_backend``: ``"auto"`` (Triton kernels on CUDA, SDPA fast paths elsewhere), ``"reference"``,
      ``"sdpa"``, ``"triton"``.
    """

    model_type = "orthros"
    keys_to_ignore_at_inference = ["past_key_values"]

    def __init_subclass__(cls, **kwargs):
        own_init = "__init__" in cls.__dict__
        super().__init_subclass__(**kwargs)
        if not own_init and "__init__" in cls.__dict__:
            # transformers (>= 5.2x) gives a subclass without an __init__ a dataclass one of the declared
            # fields, which would skip this class's __init__ (no window_size, layer_types, checks):
            # a user's subclass inherits ours instead
            del cls.__init__

    def __init__(
        self,
        vocab_size: int = 32000,
        hidden_size: int = 1024,
        intermediate_size: int = 2816,
        num_hidden_layers: int = 16,
        num_attention_heads: int = 16,
        num_key_value_heads: int | None = None,
        head_dim: int | None = None,
        hidden_act: str = "silu",
        max_position_embeddings: int = 131072,
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1e-6,
        use_cache: bool = True,
        tie_word_embeddings: bool = False,
        rope_parameters: dict | None = None,
        attention_bias: bool = False,
        o_proj_bias: bool = False,
        mlp_bias: bool = False,
        qk_norm: bool = False,
        window_size: int = 128,
        scale_offset: bool = True,
        attention_mode: str | None = None,
        layer_types: list | None = None,
        attn_backend: str = "auto",
        full_attention_interval: int | None = None,
        linear_num_key_heads: int | None = None,
        linear_num_value_heads: int | None = None,
        linear_key_head_dim: int | None = None,
        linear_value_head_dim: int | None = None,
        linear_conv_kernel_dim: int = 4,
        attn_output_gate: bool = False,
        pad_token_id: int | None = None,
        bos_token_id: int | None = None,
        eos_token_id: int | list | None = None,
        **kwargs,
    ):
        if "sliding_window" in kwargs:
            raise ValueError(NO_SLIDING_WINDOW)
        for name, off, why in _NOT_IMPLEMENTED:  # kept as extra fields, they did nothing: the model ran without them
            if name in kwargs and kwargs[name] != off:
                raise ValueError(f"OrthrosConfig has no {name} ({why}), got {name}={kwargs[name]!r}; leave it out "
                                 f"(or {off!r})")
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_attention_heads if num_key_value_heads is None else num_key_value_heads
        self.head_dim = head_dim if head_dim is not None else (hidden_size // max(num_attention_heads, 1))
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        self.rms_norm_eps = rms_norm_eps
        self.use_cache = use_cache
        self.attention_bias = attention_bias
        self.o_proj_bias = o_proj_bias
        self.mlp_bias = mlp_bias
        self.qk_norm = qk_norm
        self.window_size = window_size
        self.scale_offset = scale_offset
        num_hidden_layers = check_positive_int("OrthrosConfig.num_hidden_layers", num_hidden_layers)
        if layer_types is None and full_attention_interval is not None:
            if isinstance(full_attention_interval, int) and full_attention_interval > num_hidden_layers:
                raise ValueError(f"OrthrosConfig.full_attention_interval={full_attention_interval} exceeds "
                                 f"num_hidden_layers={num_hidden_layers}: no layer would be an attention layer "
                                 f"(GDN layers only: layer_types=['linear_attention'] * {num_hidden_layers})")
            layer_types = interval_layer_types(num_hidden_layers, full_attention_interval,
                                               resolve_mode("orthros" if attention_mode is None else attention_mode))
        layer_types, self.attention_mode = resolve_layer_types(layer_types, num_hidden_layers, attention_mode)
        self.linear_num_key_heads = num_attention_heads if linear_num_key_heads is None else linear_num_key_heads
        self.linear_num_value_heads = self.linear_num_key_heads if linear_num_value_heads is None \
            else linear_num_value_heads
        self.linear_key_head_dim = self.head_dim if linear_key_head_dim is None else linear_key_head_dim
        self.linear_value_head_dim = self.head_dim if linear_value_head_dim is None else linear_value_head_dim
        self.linear_conv_kernel_dim = linear_conv_kernel_dim
        self.attn_output_gate = attn_output_gate
        self.layer_types = None  # set after transformers' own checks, which know only its layer kinds
        self.attn_backend = attn_backend
        # transformers 4.x's rope_scaling, taken here: passed on, it replaced rope_parameters, rope_theta lost
        legacy_rope = kwargs.pop("rope_scaling", None)
        for name, value in (("rope_parameters", rope_parameters), ("rope_scaling", legacy_rope)):
            _check_rope_dict(name, value, none=True)  # dict() of it failed naming neither
        rope_parameters = dict(rope_parameters or legacy_rope or {})
        rope_parameters.setdefault("rope_type", rope_parameters.pop("type", "default"))
        rope_parameters.setdefault("rope_theta", kwargs.pop("rope_theta", 10000.0))
        if "partial_rotary_factor" in kwargs:  # a flat key (transformers moves it in later): checked below with it
            rope_parameters.setdefault("partial_rotary_factor", kwargs.pop("partial_rotary_factor"))
        self.rope_parameters = rope_parameters
        self.tie_word_embeddings = tie_word_embeddings
        self.pad_token_id = pad_token_id
        self._validate(layer_types)
        super().__init__(
            pad_token_id=pad_token_id,
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            tie_word_embeddings=tie_word_embeddings,
            **kwargs,
        )
        self.layer_types = layer_types

    def save_pretrained(self, save_directory, push_to_hub: bool = False, **kwargs):
        """Also writes the modeling code and an ``auto_map`` beside ``config.json``, so the
        checkpoint loads with ``trust_remote_code=True`` alone (``orthros/models/remote_code.py``)."""
        from .remote_code import remote_code_saved

        if push_to_hub:  # transformers lists the folder before it saves and uploads the files changed since: the
            # remote code, written before that listing, was left out (config.json alone reached the hub). Saved
            # here, then pushed by push_to_hub, which saves again into a fresh folder and uploads all of it
            repo_id = kwargs.pop("repo_id", os.fspath(save_directory).split(os.path.sep)[-1])
            self.save_pretrained(save_directory)
            return self.push_to_hub(repo_id, **kwargs)
        self.validate()  # before any file is written (transformers validates only before config.json)
        from ..checkpoint_files import save_directory as checked

        save_directory = checked(save_directory)  # "~/x" expanded, as from_pretrained expands it
        old = self.__dict__.get("architectures")
        # vLLM picks its model class by this name (a config saved on its own, as the trainer's checkpoints
        # are, has none: vLLM then refuses to start), and keeps recurrent states only for a hybrid class
        # (orthros/serving: OrthrosHybridForCausalLM); transformers goes by model_type
        self.architectures = old or ["OrthrosForCausalLM"]
        if self.architectures == ["OrthrosForCausalLM"] and LINEAR_LAYER_TYPE in (self.layer_types or []):
            self.architectures = ["OrthrosHybridForCausalLM"]
        try:
            with remote_code_saved(self, save_directory):
                super().save_pretrained(save_directory, push_to_hub=push_to_hub, **kwargs)
        finally:
            self.architectures = old

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        """transformers' ``from_pretrained``, with ``~`` expanded and a local-looking path that does not
        exist a ``FileNotFoundError``, never a hub lookup (``checkpoint_files.local_config_path``)."""
        from ..checkpoint_files import local_config_path

        return super().from_pretrained(local_config_path(pretrained_model_name_or_path), *args, **kwargs)

    @classmethod
    def from_dict(cls, config_dict: dict, **kwargs):
        """transformers' ``from_dict`` (``from_pretrained`` / ``AutoConfig`` land here; their keywords
        are set on the config after its ``__init__``), then every field checked: a bad keyword
        (``window_size=0``) is refused here, not left for the model. ``attention_mode`` given
        without ``layer_types`` switches the attention layers' kind with it (GDN layers stay):
        ``from_pretrained(path, attention_mode="full")`` runs a checkpoint as its Transformer
        baseline (it contradicted the saved ``layer_types``); ``layer_types`` with attention kinds
        given without ``attention_mode`` sets the mode to theirs. ``full_attention_interval`` (without
        ``layer_types``) lays the layers out as ``__init__`` does; ``sliding_window`` is refused as there
        (transformers would drop either: they are no attributes of the config)."""
        if "sliding_window" in kwargs:
            raise ValueError(NO_SLIDING_WINDOW)
        mode, types = kwargs.get("attention_mode"), kwargs.get("layer_types")
        interval = kwargs.pop("full_attention_interval", None)
        if interval is not None and types is None:
            config_dict = {**config_dict, "layer_types": None, "full_attention_interval": interval,
                           **{k: kwargs[k] for k in ("num_hidden_layers", "attention_mode") if k in kwargs}}
        elif mode is not None and types is None and isinstance(config_dict.get("layer_types"), list):
            config_dict = {**config_dict, "attention_mode": mode,
                           "layer_types": with_attention_mode(config_dict["layer_types"], resolve_mode(mode))}
        elif types is not None and mode is None and isinstance(types, (list, tuple)) and \
                any(t in ATTENTION_LAYER_TYPES for t in types if isinstance(t, str)):
            # the mode follows them; a layer count given with them goes in too (the list must match it at __init__)
            config_dict = {**config_dict, "attention_mode": None, "layer_types": types,
                           **{k: kwargs[k] for k in ("num_hidden_layers",) if k in kwargs}}
        out = super().from_dict(config_dict, **kwargs)
        (out[0] if isinstance(out, tuple) else out)._validate()
        return out

    def _validate(self, layer_types=None):
        """Check every field as it is now (``layer_types``: the list ``__init__`` resolved, set on the
        config after transformers' checks). Also run by the model's ``__init__`` and by
        ``save_pretrained``, for fields set after ``__init__`` (``from_pretrained(path, window_size=0)``
        sets its keywords on the loaded config, and so may a user); an attention-mode alias set so
        is resolved here, as ``__init__`` resolves it (the layers compare the canonical names)."""
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "head_dim", "max_position_embeddings", "window_size"):
            # stored as a Python int: a NumPy integer passes the check, and config.json could not hold it
            setattr(self, name, check_positive_int(f"OrthrosConfig.{name}", getattr(self, name)))
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"OrthrosConfig.num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                             f"num_key_value_heads ({self.num_key_value_heads})")
        if self.head_dim % 2:
            derived = self.hidden_size // self.num_attention_heads
            why = (f" (hidden_size // num_attention_heads = {self.hidden_size} // {self.num_attention_heads}, the "
                   f"default where head_dim is not given: pass an even head_dim, or sizes that give one)"
                   if self.head_dim == derived else "")
            raise ValueError(f"OrthrosConfig.head_dim must be even for RoPE, got {self.head_dim}{why}")
        for name in ("attention_bias", "o_proj_bias", "mlp_bias", "qk_norm", "scale_offset", "attn_output_gate",
                     "tie_word_embeddings", "use_cache"):
            if getattr(self, name) not in (True, False):  # (1 and 0 are True and False) "false" would be taken as True
                raise ValueError(f"OrthrosConfig.{name} must be True or False, got {getattr(self, name)!r}")
        if self.attn_backend not in ATTN_BACKENDS:
            raise ValueError(f"OrthrosConfig.attn_backend must be one of {ATTN_BACKENDS}, got {self.attn_backend!r}")
        _check_rope_dict("rope_parameters", self.rope_parameters)  # set after __init__: failed in .get
        if not _finite_number(self.rms_norm_eps) or self.rms_norm_eps <= 0:
            raise ValueError(f"OrthrosConfig.rms_norm_eps must be a finite number > 0, got {self.rms_norm_eps!r}")
        if not _finite_number(self.rope_parameters.get("rope_theta")) or self.rope_parameters["rope_theta"] <= 0:
            raise ValueError(f"OrthrosConfig.rope_parameters['rope_theta'] must be a finite number > 0, got "
                             f"{self.rope_parameters.get('rope_theta')!r}")
        self._validate_partial_rotary()
        rope_type = self.rope_parameters.get("rope_type", "default")
        if rope_type != "default" and rope_type not in ROPE_INIT_FUNCTIONS:
            raise ValueError(f"OrthrosConfig.rope_parameters['rope_type']={rope_type!r} is not supported; known: "
                             f"default, {', '.join(sorted(ROPE_INIT_FUNCTIONS))}")
        # transformers' keys of each RoPE type (a 'yarn' without 'factor' was a KeyError building the model),
        # checked on a copy with what PreTrainedConfig.__init__ (later) fills in: llama3 / yarn / longrope's
        # original_max_position_embeddings, max_position_embeddings by default
        given = self.rope_parameters
        if rope_type in ("llama3", "yarn", "longrope"):
            self.rope_parameters = {"original_max_position_embeddings": getattr(
                self, "original_max_position_embeddings", self.max_position_embeddings), **given}
        try:
            getattr(self, "validate_rope", lambda: None)()
        except KeyError as e:
            raise ValueError(f"OrthrosConfig.rope_parameters: {e.args[0]}") from None
        finally:
            self.rope_parameters = given
        factor = self.rope_parameters.get("factor")
        if rope_type != "default" and factor is not None and (not _finite_number(factor) or factor <= 0):
            # transformers only warns (below 1), then divides the frequencies by it: reversed, infinite or NaN
            raise ValueError(f"OrthrosConfig.rope_parameters['factor'] (the {rope_type} RoPE scaling) must be a finite "
                             f"number > 0, got {factor!r}")
        if not isinstance(self.hidden_act, str) or self.hidden_act not in ACT2FN:
            raise ValueError(f"OrthrosConfig.hidden_act must be an activation of transformers' ACT2FN (e.g. 'silu', "
                             f"'gelu'), got {self.hidden_act!r}")
        if not _finite_number(self.initializer_range) or self.initializer_range < 0:
            raise ValueError(f"OrthrosConfig.initializer_range (the init std) must be a finite number >= 0, got "
                             f"{self.initializer_range!r}")
        pad, vocab = getattr(self, "pad_token_id", None), self.vocab_size
        if pad is not None and (isinstance(pad, bool) or not isinstance(pad, int) or not -vocab <= pad < vocab):
            # the embedding's padding_idx: out of range it fails in nn.Embedding without naming the field
            raise ValueError(f"OrthrosConfig.pad_token_id must be None or an id in [-vocab_size, vocab_size) = "
                             f"[{-vocab}, {vocab}) (the embedding's padding_idx), got {pad!r}")
        layer_types, self.attention_mode = resolve_layer_types(
            self.layer_types if layer_types is None else layer_types, self.num_hidden_layers, self.attention_mode)
        self._validate_linear(layer_types)

    def _validate_partial_rotary(self):
        """``rope_parameters["partial_rotary_factor"]``: RoPE turns the first ``int(head_dim * factor)``
        dimensions of each head. Outside (0, 1] the model failed in its forward (a tensor-size error
        above 1, torch's arange error below 0) or, at 0 or a width under 2, ran with no rotation at
        all. An odd width is taken, as transformers takes it (the frequencies of that width, one
        dimension more turned): a config written elsewhere with one still loads."""
        factor = self.rope_parameters.get("partial_rotary_factor", 1.0)
        key = "OrthrosConfig.rope_parameters['partial_rotary_factor']"
        if not _finite_number(factor) or not 0 < factor <= 1:
            raise ValueError(f"{key} must be a number in (0, 1] (the share of each head's dimensions RoPE turns), "
                             f"got {factor!r}")
        width = int(self.head_dim * factor)
        if width < 2:
            raise ValueError(f"{key}={factor!r} gives a rotary width of int(head_dim * factor) = {width} of "
                             f"head_dim={self.head_dim}: it must be >= 2; e.g. {2 / self.head_dim!r} (width 2)")

    def _validate_linear(self, layer_types):
        names = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
                 "linear_conv_kernel_dim")
        if LINEAR_LAYER_TYPE not in layer_types:
            for name in names:  # unused without GDN layers, but config.json keeps them (head_dim's default too)
                value = getattr(self, name)
                if hasattr(value, "__index__") and not isinstance(value, bool):
                    with contextlib.suppress(TypeError):  # a float tensor has __index__ too: left as given, unused
                        setattr(self, name, operator.index(value))
            return
        for name in names:
            setattr(self, name, check_positive_int(f"OrthrosConfig.{name}", getattr(self, name)))
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ValueError(f"OrthrosConfig.linear_num_value_heads ({self.linear_num_value_heads}) must be a multiple "
                             f"of linear_num_key_heads ({self.linear_num_key_heads})")

    def validate_layer_type(self):
        """transformers' check knows only its own layer kinds; ours are checked by
        :func:`orthros.kinds.resolve_layer_types` in ``__init__``."""

    def validate(self):
        """transformers' class validators (>= 5.2x runs them in ``save_pretrained``) except its
        layer-type check, which refuses kinds it does not know (``__init__`` sets
        ``layer_types`` after the base class's own validation for the same reason)."""
        for validator in getattr(PreTrainedConfig, "__class_validators__", ()):
            if validator.__name__ != "validate_layer_type":
                validator(self)
        self._validate()


__all__ = ["OrthrosConfig", "ATTENTION_MODES"]

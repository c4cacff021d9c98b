"""``OrthrosForCausalLM.generate()`` through the engine, where it helps.

The model (``orthros.models``) cannot import the engine at its own import (the engine sits above
it), so the engine registers :func:`engine_generate` with the model class
(``orthros.engine.register``): when ``orthros.engine`` is imported beside the models (``import
orthros`` arranges it whenever the models are imported) or its first public name loads, and at
the latest at ``generate()``'s first call. ``model.generate(...)`` then takes the engine path:

* ``use_engine=None`` (default): on CUDA, when the request is one the engine serves exactly
  (greedy or temperature / top-k / top-p sampling, one sequence per prompt, left padding or
  none, no extra logits processors, no scores or dict output); otherwise transformers'
  ``generate`` as usual. On CPU the engine is not faster, so transformers runs.
* ``use_engine=True``: the engine on any device; a request it cannot serve raises a
  ``ValueError`` naming what is unsupported.
* ``use_engine=False``: always transformers' ``generate``.

The output has transformers' format: ``[B, T + n]`` token ids, the prompt (with its padding)
followed by the new tokens, rows that stopped at EOS padded with ``pad_token_id``.

The engine (its static cache sized for the request, rounded up) is kept on the model as
``model._orthros_engine`` and reused while it is large enough and the parameters have not
moved (nor the layers' attention backends changed); :func:`release_engine` frees it.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..utils import as_int, first_id_outside
from .engine import Engine
from .sampling import SamplingParams

_ENGINE_ATTR = "_orthros_engine"

# generation-config fields and the value(s) under which the engine reproduces transformers
_NEUTRAL = {
    "num_beams": (None, 1), "num_return_sequences": (None, 1), "num_beam_groups": (None, 1), "penalty_alpha": (None,),
    "repetition_penalty": (None, 1.0), "encoder_repetition_penalty": (None, 1.0), "length_penalty": (None, 1.0),
    "no_repeat_ngram_size": (None, 0), "bad_words_ids": (None,), "force_words_ids": (None,),
    "min_length": (None, 0), "min_new_tokens": (None, 0), "typical_p": (None, 1.0), "epsilon_cutoff": (None, 0.0),
    "eta_cutoff": (None, 0.0), "min_p": (None, 0.0), "top_h": (None,), "diversity_penalty": (None, 0.0),
    "sequence_bias": (None,), "suppress_tokens": (None,), "begin_suppress_tokens": (None,),
    "forced_bos_token_id": (None,), "forced_eos_token_id": (None,), "renormalize_logits": (None, False),
    "guidance_scale": (None, 1.0), "watermarking_config": (None,), "stop_strings": (None,),
    "output_scores": (None, False), "output_logits": (None, False), "output_attentions": (None, False),
    "output_hidden_states": (None, False), "return_dict_in_generate": (None, False),
    "exponential_decay_length_penalty": (None,), "max_time": (None,), "prompt_lookup_num_tokens": (None,),
    "assistant_early_exit": (None,), "token_healing": (None, False), "dola_layers": (None,),
}
_MODEL_KWARGS = {"input_ids", "attention_mask", "use_cache"}


def _plan(model, args, kwargs):
    """(prompts as lists, input_ids, max_new_tokens, SamplingParams, eos set, pad id) or a list of
    reasons the engine cannot serve this request."""
    why = []
    kwargs = dict(kwargs)
    inputs = args[0] if args else kwargs.pop("inputs", None)
    gen_cfg = args[1] if len(args) > 1 else kwargs.pop("generation_config", None)
    if len(args) > 2:
        why.append("positional arguments beyond (inputs, generation_config)")
    for k in ("logits_processor", "stopping_criteria", "prefix_allowed_tokens_fn", "assistant_model", "streamer",
              "negative_prompt_ids", "negative_prompt_attention_mask", "synced_gpus", "custom_generate"):
        if kwargs.pop(k, None) is not None:
            why.append(k)
    # transformers' settings: the given config's unset fields from the model's, then its defaults (top_k=50,
    # max_length=20, ...), then the keywords; with no length set anywhere, 20 new tokens (as there)
    default_length = kwargs.get("max_length") is None and getattr(gen_cfg, "max_length", None) is None \
        and model.generation_config.max_length is None
    cfg, rest = model._prepare_generation_config(gen_cfg, **kwargs)
    ids = inputs if inputs is not None else rest.get("input_ids")
    for k in rest:
        if k not in _MODEL_KWARGS:
            why.append(f"model keyword {k!r}")
    if cfg.use_cache is False:
        why.append("use_cache=False")
    for field, ok in _NEUTRAL.items():
        if getattr(cfg, field, None) not in ok:
            why.append(f"{field}={getattr(cfg, field)!r}")
    if getattr(cfg, "cache_implementation", None) is not None:
        why.append(f"cache_implementation={cfg.cache_implementation!r}")
    if (not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.shape[1] == 0 or ids.dtype.is_floating_point
            or ids.dtype.is_complex or ids.dtype == torch.bool):
        why.append("inputs must be a non-empty [B, T] integer tensor of token ids")
        return why
    B, T = ids.shape
    eos = cfg.eos_token_id.tolist() if torch.is_tensor(cfg.eos_token_id) else cfg.eos_token_id
    eos = [] if eos is None else [eos] if as_int(eos) is not None else list(eos)  # a 0-d tensor, NumPy's too
    mask = rest.get("attention_mask")
    if mask is None and cfg.pad_token_id is not None and cfg.pad_token_id not in eos:
        mask = ids != cfg.pad_token_id  # transformers infers the mask from the padding (a pad id that is no EOS)
    prompts = []
    if mask is not None:
        if not isinstance(mask, torch.Tensor) or mask.shape != ids.shape:
            why.append("attention_mask must have the shape of input_ids")
            return why
        m = mask.to(torch.bool)
        n = m.sum(1)
        left_pad = torch.arange(T, device=m.device).view(1, T) >= (T - n).view(B, 1)
        if not bool((m == left_pad).all()):
            why.append("attention_mask with right or inner padding (the engine takes left padding)")
            return why
        if bool((n == 0).any()):
            why.append("a row with no unmasked token")
            return why
        prompts = [ids[b, T - int(n[b]):] for b in range(B)]
    else:
        prompts = [ids[b] for b in range(B)]
    if cfg.max_new_tokens is not None:
        n_new = cfg.max_new_tokens
    elif default_length:  # transformers' max_length = min(T + 20, max_position_embeddings)
        n_new = min(cfg.max_length, model.config.max_position_embeddings - T)
    else:
        n_new = cfg.max_length - T
    if n_new < 1:
        why.append(f"nothing to generate (max_new_tokens={cfg.max_new_tokens}, max_length={cfg.max_length}, "
                   f"prompt length {T})")
    elif T + n_new - 1 > model.config.max_position_embeddings:  # the engine refuses; transformers warns
        why.append(f"prompt length {T} + {n_new} new tokens go beyond max_position_embeddings="
                   f"{model.config.max_position_embeddings}")
    if cfg.do_sample:
        try:
            params = SamplingParams(temperature=float(cfg.temperature if cfg.temperature is not None else 1.0),
                                    top_k=int(cfg.top_k or 0), top_p=float(cfg.top_p if cfg.top_p is not None else 1.0))
        except ValueError as e:
            why.append(str(e))
            params = None
        if params is not None and params.greedy:
            why.append("do_sample=True with temperature 0")
    else:
        params = SamplingParams()
    if why:
        return why
    pad = cfg.pad_token_id if cfg.pad_token_id is not None else (eos[0] if eos else 0)
    return prompts, ids, n_new, params, eos, pad


def _check_vocab(ids: torch.Tensor, prompts, vocab_size: int) -> None:
    """The prompts' ids (``input_ids`` without its left padding) must be in ``[0, vocab_size)``: a
    ``ValueError`` naming the first one outside as ``input_ids[b, t]`` (the caller's argument and
    place; the engine would name its own ``prompts``), before the engine is built."""
    B, T = ids.shape
    lens = torch.tensor([len(p) for p in prompts], device=ids.device)
    used = torch.arange(T, device=ids.device).view(1, T) >= (T - lens).view(B, 1)
    bad = first_id_outside(ids, vocab_size, used)
    if bad is not None:
        (b, t), value = bad
        raise ValueError(f"input_ids has token ids outside the vocabulary [0, vocab_size={vocab_size}): "
                         f"input_ids[{b}, {t}] = {value}")


def _engine_for(model, batch: int, need: int) -> Engine:
    eng = getattr(model, _ENGINE_ATTR, None)
    if eng is not None and eng.serves(model, batch, need):
        eng.reset()
        return eng
    release_engine(model)
    slots = 256
    while slots < need:
        slots *= 2
    limit = getattr(model.config, "max_position_embeddings", None)
    if limit:  # the engine takes no more slots than positions (_plan refused a request beyond them)
        slots = min(slots, limit)
    modes = [(mod, mod.training) for mod in model.modules()]
    eng = Engine(model, max_batch_size=batch, max_seq_len=slots)
    for mod, training in modes:  # the engine puts the model in eval mode; generate() leaves it as it was
        mod.training = training
    object.__setattr__(model, _ENGINE_ATTR, eng)  # not a submodule: never saved, never moved
    return eng


def release_engine(model) -> None:
    """Free the engine (and its static KV cache) that ``model.generate()`` keeps on ``model``."""
    if getattr(model, _ENGINE_ATTR, None) is not None:
        object.__setattr__(model, _ENGINE_ATTR, None)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def engine_generate(model, args, kwargs, required: bool) -> Optional[torch.Tensor]:
    """Serve ``model.generate(*args, **kwargs)`` with the engine; ``None`` means "use
    transformers" (only when not ``required``)."""
    device = next(model.parameters()).device
    if not required and device.type != "cuda":
        return None
    plan = _plan(model, args, kwargs)
    if isinstance(plan, list):
        if required:
            raise ValueError("generate(use_engine=True) cannot serve this request: " + "; ".join(plan) +
                             " (use_engine=None falls back to transformers' generate for it)")
        return None
    prompts, ids, n_new, params, eos, pad = plan
    _check_vocab(ids, prompts, model.config.vocab_size)
    need = max(len(p) for p in prompts) + n_new - 1  # cache slots: the last new token is never fed back
    eng = _engine_for(model, len(prompts), need)
    # an id the model cannot sample never stops a row (transformers runs with it; the engine refuses it)
    stops = [e for e in eos if 0 <= e < model.config.vocab_size]
    new = eng.generate([p.tolist() for p in prompts], n_new, params, eos_token_id=stops or None)
    width = max(len(r) for r in new)
    out = torch.full((len(new), width), pad, dtype=ids.dtype, device=ids.device)
    for b, r in enumerate(new):
        if r:
            out[b, :len(r)] = torch.tensor(r, dtype=ids.dtype)
    return torch.cat([ids, out], dim=1)


__all__ = ["engine_generate", "release_engine"]

"""The vocabulary of layer kinds and attention modes: the one home for these names.

* **Attention modes** (``OrthrosConfig.attention_mode``, ``Engine(attention_mode=...)``):
  ``"orthros"`` (window stream + output stream, paper Algorithm 2), ``"full"`` (a causal
  Transformer) and ``"window"`` (sliding window only). Where :func:`resolve_mode` reads the name
  (``OrthrosConfig``, ``Engine``, MQAR, and through :func:`mode_option` the ``--mode`` /
  ``--attention-mode`` options of niah-train and eval), users may also write the aliases in
  :data:`MODE_ALIASES` (``"transformer"``, ``"swa"``).
* **Layer types** (``OrthrosConfig.layer_types``, one per layer, the name transformers'
  hybrid models use): the attention kinds ``"orthros_attention"``, ``"full_attention"`` and
  ``"window_attention"``. All attention layers of one model share one kind, which is the
  model's attention mode; whether the model has an output stream follows from it.
  ``"linear_attention"`` is a Gated DeltaNet layer (Orthros-H, ``orthros/layers/gated_deltanet.py``);
  a model of GDN layers only has no output stream (its mode reads ``"full"``) unless its
  ``attention_mode`` is given as ``"orthros"``: its GDN layers then read one (the output tokens'
  queries against each position's state), another model of the same weights.
* **Hybrid layouts** (:data:`HYBRID_ALIASES`, user-facing model names of configs and MQAR):
  ``"orthros-h"`` (three GDN layers, then one Orthros attention layer, repeated: paper Section
  4.6), its baseline ``"linear-hybrid"`` (the same with full attention: Qwen3.5's layout) and
  ``"gdn"`` (GDN layers only); :func:`hybrid_layout` turns a name into config fields.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

ATTENTION_MODES = ("orthros", "full", "window")
# every name resolve_mode takes (OrthrosConfig / Engine attention_mode, MQAR models, the --mode /
# --attention-mode options of niah_train and eval) -> attention mode; `orthros train`
# model.architecture takes orthros/transformer/swa (and the hybrids' names)
MODE_ALIASES = {"orthros": "orthros", "transformer": "full", "full": "full", "swa": "window", "window": "window"}
# how tables and plots name each mode
MODE_DISPLAY = {"orthros": "Orthros", "full": "Transformer", "window": "SWA"}

# layer type -> the attention mode it runs
ATTENTION_LAYER_TYPES = {"orthros_attention": "orthros", "full_attention": "full", "window_attention": "window"}
LINEAR_LAYER_TYPE = "linear_attention"  # a Gated DeltaNet layer
LAYER_TYPES = (*ATTENTION_LAYER_TYPES, LINEAR_LAYER_TYPE)
# hybrid model name -> (attention mode of its attention layers or None, one attention layer every N)
HYBRID_KINDS = {"orthros-h": ("orthros", 4), "linear-hybrid": ("full", 4), "gdn": (None, None)}
HYBRID_ALIASES = {"orthros-h": "orthros-h", "orthros_h": "orthros-h", "linear-hybrid": "linear-hybrid",
                  "linear_hybrid": "linear-hybrid", "gdn": "gdn"}
HYBRID_DISPLAY = {"orthros-h": "Orthros-H", "linear-hybrid": "Linear Hybrid", "gdn": "GDN"}


def resolve_mode(name, arg: str = "attention_mode") -> str:
    """The attention mode for ``name`` (a mode or an alias); ``ValueError`` naming ``arg`` otherwise."""
    mode = MODE_ALIASES.get(name) if isinstance(name, str) else None
    if mode is None:
        raise ValueError(f"{arg} must be one of {', '.join(MODE_ALIASES)}, got {name!r}")
    return mode


def mode_option(value: str) -> str:
    """An argparse ``type`` for an attention-mode option: a mode or an alias -> the mode (argparse
    names the option in its error)."""
    import argparse

    try:
        return resolve_mode(value, "it")
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def has_output_stream(mode: str) -> bool:
    """Whether a model of this attention mode appends output tokens (Algorithm 2)."""
    return mode == "orthros"


def layer_type_for(mode: str) -> str:
    return f"{mode}_attention"


def with_attention_mode(layer_types, mode: str) -> List[str]:
    """``layer_types`` with every attention layer switched to ``mode``'s kind, GDN layers kept: one
    checkpoint run as its Transformer / SWA baseline (``mode`` resolved: a name of :data:`ATTENTION_MODES`)."""
    return [layer_type_for(mode) if t in ATTENTION_LAYER_TYPES else t for t in layer_types]


def interval_layer_types(num_layers: int, interval: int, mode: str) -> List[str]:
    """Qwen3.5's ``full_attention_interval`` pattern: layer ``i`` is an attention layer of ``mode``
    when ``(i + 1) % interval == 0``, a GDN layer otherwise."""
    if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
        raise ValueError(f"full_attention_interval must be an integer >= 1, got {interval!r}")
    return [layer_type_for(mode) if (i + 1) % interval == 0 else LINEAR_LAYER_TYPE for i in range(num_layers)]


def hybrid_layout(name: str, num_layers: int) -> dict:
    """``OrthrosConfig`` fields (``layer_types``, ``attention_mode``) of a hybrid model name
    (:data:`HYBRID_ALIASES`): ``"orthros-h"``, ``"linear-hybrid"`` or ``"gdn"`` (mode ``"full"``: no
    output stream, whatever mode the fields are merged over)."""
    kind = HYBRID_ALIASES.get(name) if isinstance(name, str) else None
    if kind is None:
        raise ValueError(f"hybrid model must be one of {', '.join(HYBRID_ALIASES)}, got {name!r}")
    mode, every = HYBRID_KINDS[kind]
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < (every or 1):
        why = f"; an attention layer every {every}th layer" if every else ""
        article = "an" if kind[0] in "aeiou" else "a"
        raise ValueError(f"{article} {kind!r} model needs num_layers >= {every or 1} (an integer{why}), got {num_layers!r}")
    if mode is None:
        return {"layer_types": [LINEAR_LAYER_TYPE] * num_layers, "attention_mode": "full"}
    return {"layer_types": interval_layer_types(num_layers, every, mode), "attention_mode": mode}


# layer type -> how tables name it
LAYER_DISPLAY = {"orthros_attention": "Orthros attention", "full_attention": "full attention",
                 "window_attention": "window attention", LINEAR_LAYER_TYPE: "Gated DeltaNet"}


def describe_layers(layer_types: Sequence[str]) -> str:
    """``"4 layers of Orthros attention"`` or ``"8 layers (6 Gated DeltaNet + 2 Orthros attention)"``."""
    counts: dict = {}
    for t in layer_types:
        counts[t] = counts.get(t, 0) + 1
    what = (f"of {LAYER_DISPLAY[next(iter(counts))]}" if len(counts) == 1 else
            "(" + " + ".join(f"{n} {LAYER_DISPLAY[t]}" for t, n in counts.items()) + ")")
    return f"{len(layer_types)} layer{'s' if len(layer_types) != 1 else ''} {what}"


def model_kind(layer_types: Sequence[str], mode: str) -> str:
    """How tables name a model of these layer types and attention mode: ``"Orthros"``,
    ``"Transformer"`` or ``"SWA"``; with GDN layers ``"Orthros-H"``, ``"Linear Hybrid"`` or
    ``"GDN"`` (GDN layers with window attention: ``"SWA + GDN"``; GDN layers only in mode
    ``"orthros"``, which read an output stream: ``"GDN with output stream"``)."""
    if LINEAR_LAYER_TYPE not in layer_types:
        return MODE_DISPLAY[mode]
    if all(t == LINEAR_LAYER_TYPE for t in layer_types):
        return HYBRID_DISPLAY["gdn"] + (" with output stream" if has_output_stream(mode) else "")
    kind = next((k for k, (m, _) in HYBRID_KINDS.items() if m == mode), None)
    return HYBRID_DISPLAY[kind] if kind else f"{MODE_DISPLAY[mode]} + GDN"


def window_of(layer_types: Sequence[str], mode: str, window_size: int) -> Optional[int]:
    """The window a model of these layer types and attention mode slides (``window_size``), or None:
    mode ``"full"``, or no attention layer (GDN layers only, in any mode)."""
    return window_size if mode != "full" and any(t in ATTENTION_LAYER_TYPES for t in layer_types) else None


def resolve_layer_types(layer_types: Optional[Sequence[str]], num_layers: int,
                        attention_mode: Optional[str]) -> tuple[List[str], str]:
    """Validate ``layer_types`` against ``num_layers`` and ``attention_mode`` and return
    ``(layer_types, attention_mode)``. Without ``layer_types`` every layer is an attention layer
    of ``attention_mode``; without ``attention_mode`` it is read off the attention layers."""
    if layer_types is None:
        mode = resolve_mode("orthros" if attention_mode is None else attention_mode)
        return [layer_type_for(mode)] * num_layers, mode
    if isinstance(layer_types, str) or not isinstance(layer_types, (list, tuple)):
        raise ValueError(f"layer_types must be a list of {num_layers} layer types, got {layer_types!r}")
    types = list(layer_types)
    if len(types) != num_layers:
        raise ValueError(f"layer_types must have one entry per layer (num_hidden_layers={num_layers}), "
                         f"got {len(types)}")
    bad = sorted([t for i, t in enumerate(types) if t not in LAYER_TYPES and t not in types[:i]], key=str)
    if bad:
        raise ValueError(f"layer_types has unknown kinds {bad}; known: {', '.join(LAYER_TYPES)}")
    modes = {ATTENTION_LAYER_TYPES[t] for t in types if t in ATTENTION_LAYER_TYPES}
    if len(modes) > 1:
        raise ValueError(f"layer_types mixes attention kinds {sorted(modes)}: the attention layers of one model "
                         f"share one kind")
    mode = modes.pop() if modes else None
    if attention_mode is not None:
        given = resolve_mode(attention_mode)
        if mode is not None and given != mode:
            raise ValueError(f"attention_mode={attention_mode!r} contradicts layer_types (attention layers are "
                             f"{layer_type_for(mode)!r})")
        mode = given
    return types, mode or "full"


__all__ = ["window_of", "ATTENTION_MODES", "MODE_ALIASES", "MODE_DISPLAY", "ATTENTION_LAYER_TYPES", "LAYER_TYPES",
           "resolve_mode", "has_output_stream", "layer_type_for", "resolve_layer_types", "LINEAR_LAYER_TYPE",
           "HYBRID_KINDS", "HYBRID_ALIASES", "HYBRID_DISPLAY", "interval_layer_types", "hybrid_layout",
           "model_kind", "describe_layers", "LAYER_DISPLAY"]

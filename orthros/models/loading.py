"""The checks of a checkpoint before its weights load that need the model: whether the weight files
hold every tensor of the model ``config.json`` describes, in its shape (:func:`check_weights_fit`).

The checks of the directory and its files alone (``checkpoint_dir``, ``check_weights``,
``check_tokenizer_dir``, ``check_local_checkpoint``, ...) live in :mod:`orthros.checkpoint_files`,
outside this package (whose import loads transformers and torch): import them from there.
"""

from __future__ import annotations

from typing import Optional

from ..checkpoint_files import PT_WEIGHTS, WEIGHTS, WEIGHTS_INDEX, CheckpointError, _expand, weight_headers


def weight_shapes(config, model=None) -> dict:
    """``{name: shape}`` of every weight of the model ``config`` describes (``model``: that model,
    if already built; else it is built on the meta device, with no memory)."""
    if model is None:
        import torch

        from .modeling_orthros import OrthrosForCausalLM

        with torch.device("meta"):
            model = OrthrosForCausalLM(config)
    return {k: list(v.shape) for k, v in model.state_dict().items()}


def check_weights_fit(path, config, *, arg: str = "--model", headers: Optional[dict] = None, model=None) -> None:
    """:class:`CheckpointError` naming ``arg`` when the weight files of directory ``path`` lack a
    tensor of the model ``config`` describes, or hold one of another shape: a load would leave
    that tensor at random (transformers only logs it) or fail. Reads the headers only (pass
    ``headers`` from :func:`weight_headers` if already read, ``model`` if built: see
    :func:`weight_shapes`). A directory with no weights at all is named as such; one with
    ``pytorch_model.bin`` weights only (which transformers loads, but which have no header to read)
    is left to the load."""
    headers = weight_headers(path) if headers is None else headers
    if not headers:
        d = _expand(path, arg)
        if any((d / f).is_file() for f in PT_WEIGHTS):
            return
        raise CheckpointError(f"{arg} {path}: no weights ({WEIGHTS}, {WEIGHTS_INDEX} or {PT_WEIGHTS[0]}): "
                              f"not a complete checkpoint")
    want = weight_shapes(config, model)
    if config.tie_word_embeddings:
        want.pop("lm_head.weight", None)  # the embedding: need not be stored
    have = {k: [int(s) for s in info["shape"]] for entries in headers.values() for k, info in entries.items()}
    wrong = [f"missing {k}" for k in sorted(want.keys() - have.keys())]
    wrong += [f"{k} of shape {have[k]}, config.json gives {want[k]}" for k in want if k in have and have[k] != want[k]]
    if wrong:
        more = f" and {len(wrong) - 3} more" if len(wrong) > 3 else ""
        raise CheckpointError(f"{arg} {path}: the weights do not fit its config.json: {'; '.join(wrong[:3])}{more}")


__all__ = ["weight_shapes", "check_weights_fit"]

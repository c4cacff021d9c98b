"""Orthros: sliding-window attention over every token, full attention only where tokens are predicted.

``import orthros`` is cheap (no torch, no transformers): the public names below load on first
use (PEP 562), so ``orthros --help`` starts in a fraction of a second. It still registers the
``"orthros"`` model type with transformers' Auto classes before they are used: the first call
of ``AutoConfig.from_pretrained`` / ``AutoConfig.for_model`` (which ``AutoModel*.from_pretrained``,
``AutoTokenizer``, ``pipeline`` and lm-eval go through) first imports :mod:`orthros.models`,
whose import does the registration. Whenever :mod:`orthros.models` is imported, the inference
engine behind ``OrthrosForCausalLM.generate()`` (:mod:`orthros.engine`) is registered too
(``generate()`` also registers it at its first call, for a models module imported on its own).
:func:`register` does both at once.
"""

from __future__ import annotations

import importlib
import importlib.abc
import sys

__version__ = "0.1.0"

# public name -> the subpackage that defines it
_EXPORTS = {
    "orthros_attention": "ops",
    "OrthrosAttention": "layers",
    "OrthrosConfig": "models",
    "OrthrosModel": "models",
    "OrthrosForCausalLM": "models",
    "OrthrosCache": "models",
    "convert_from_hf": "conversion",
}
_SUBPACKAGES = ("benchmarks", "conversion", "data", "engine", "evaluation", "layers", "models", "ops", "parallel",
                "training")

__all__ = list(_EXPORTS) + ["register"]


def register() -> None:
    """Register the ``"orthros"`` model type with transformers' Auto classes and the engine behind
    ``generate()`` now (both happen on their own when needed; calling this is never required)."""
    importlib.import_module(".models", __name__)
    importlib.import_module(".engine", __name__).register()  # (an engine imported before the models registered nothing)


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
        globals()[name] = value
        return value
    if name in _SUBPACKAGES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'orthros' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS) | set(_SUBPACKAGES))


# --------------------------------------------------------------------------- deferred registration


def _wrap_auto_config(auto_config) -> None:
    """Make the first ``AutoConfig.from_pretrained`` / ``for_model`` call import orthros.models
    (which registers the Auto classes), put the original methods back, then run the call."""
    names = [n for n in ("from_pretrained", "for_model") if isinstance(auto_config.__dict__.get(n), classmethod)]
    originals = {n: auto_config.__dict__[n] for n in names}
    if not originals or getattr(auto_config, "_orthros_deferred", False):
        return

    def restore():
        for n, orig in originals.items():
            setattr(auto_config, n, orig)
        auto_config._orthros_deferred = False

    def deferred(n):
        def call(cls, *args, **kwargs):
            restore()
            importlib.import_module(".models", __name__)
            return getattr(cls, n)(*args, **kwargs)

        call.__name__, call.__doc__ = n, originals[n].__func__.__doc__
        return classmethod(call)

    for n in names:
        setattr(auto_config, n, deferred(n))
    auto_config._orthros_deferred = True


def _on_config_auto(module) -> None:
    _wrap_auto_config(module.AutoConfig)


def _on_models(_module) -> None:
    importlib.import_module(".engine", __name__).register()  # the engine behind generate()


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs a callback once a named module has finished executing (a one-shot post-import hook);
    it finds nothing itself and steps out of ``sys.meta_path`` when no callback is left."""

    def __init__(self, callbacks: dict):
        self.callbacks = dict(callbacks)

    def find_spec(self, fullname, path, target=None):
        callback = self.callbacks.get(fullname)
        if callback is None:
            return None
        spec = None
        for finder in list(sys.meta_path):
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        del self.callbacks[fullname]
        if not self.callbacks and self in sys.meta_path:
            sys.meta_path.remove(self)
        run = loader.exec_module

        def exec_module(module):
            try:
                run(module)
            finally:
                loader.__dict__.pop("exec_module", None)
            callback(module)

        loader.exec_module = exec_module
        return spec


def _install_hooks() -> None:
    pending = {}
    auto = sys.modules.get("transformers.models.auto.configuration_auto")
    if auto is not None and hasattr(auto, "AutoConfig"):
        _on_config_auto(auto)
    else:
        pending["transformers.models.auto.configuration_auto"] = _on_config_auto
    if "orthros.models" in sys.modules:
        _on_models(sys.modules["orthros.models"])
    else:
        pending["orthros.models"] = _on_models
    if pending:
        sys.meta_path.insert(0, _AfterImport(pending))


_install_hooks()

"""Training: one loop for pt / sft / cpt over Orthros, Transformer and SWA architectures.

``ConfigError`` and the config names load with the package (they need only PyYAML); ``DataError``
(and the torch-based data pipeline behind it) on first use, so ``orthros train --help`` starts
without torch."""

from .config import ARCHITECTURES, MODES, ConfigError, RunConfig, load_config

__all__ = ["ARCHITECTURES", "MODES", "ConfigError", "DataError", "RunConfig", "load_config", "train"]


def __getattr__(name):
    if name == "DataError":
        from .data import DataError

        return DataError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def train(cfg):
    """See :func:`orthros.training.trainer.train`."""
    from .trainer import train as _train

    return _train(cfg)

"""Training: one loop for pt / sft / cpt over Orthros, Transformer and SWA architectures."""

from .config import ARCHITECTURES, MODES, ConfigError, RunConfig, load_config
from .data import DataError

__all__ = ["ARCHITECTURES", "MODES", "ConfigError", "DataError", "RunConfig", "load_config", "train"]


def train(cfg):
    """See :func:`orthros.training.trainer.train`."""
    from .trainer import train as _train

    return _train(cfg)

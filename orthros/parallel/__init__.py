"""Sequence-parallel inference: prefill over N ranks with a K/V halo exchange, and sharded
decode with an exact log-sum-exp merge of per-rank partials (flash-decoding). See
``docs/parallel.md``; benchmark: ``torchrun --nproc-per-node N -m orthros.parallel.bench``."""

from .comm import ParallelContext, ParallelError, init_from_env
from ..ops.merge import merge_partials, partial_attention
from .sharded import ShardedKVCache, ShardedOrthros, halo_from_tails, shard_bounds

__all__ = [
    "ParallelContext",
    "ParallelError",
    "init_from_env",
    "partial_attention",
    "merge_partials",
    "ShardedKVCache",
    "ShardedOrthros",
    "halo_from_tails",
    "shard_bounds",
]

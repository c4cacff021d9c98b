"""The engine's static KV cache: pre-allocated once, never resized, never evicted.

Per layer ``k[i], v[i]`` are ``[B_max, L_max, Hkv, D]``; ``seqlens`` (``[B_max]`` int64, on the
device) is the number of valid tokens of each row. Rows may hold different lengths: the
attention ops mask by ``seqlens``, so nothing past a row's length is ever read. Only the base
stream writes K/V (output tokens never do), and every token is kept: the output stream
attends to all of them.
"""

from __future__ import annotations

import torch


class StaticKVCache:
    def __init__(self, num_layers: int, max_batch_size: int, max_seq_len: int, num_kv_heads: int, head_dim: int,
                 *, dtype: torch.dtype, device):
        shape = (max_batch_size, max_seq_len, num_kv_heads, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.seqlens = torch.zeros(max_batch_size, dtype=torch.long, device=device)
        self.max_batch_size = max_batch_size
        self.max_seq_len = max_seq_len

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

    def bytes_per_token(self) -> int:
        """K+V bytes one token occupies over all layers."""
        return self.nbytes // (self.max_batch_size * self.max_seq_len)


__all__ = ["StaticKVCache"]

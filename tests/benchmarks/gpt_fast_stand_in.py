"""gpt-fast's ``model.py`` interface in a few lines, for the CPU tests of the benchmarks that run
gpt-fast as the peer (``roofline.py --gpt-fast-dir``, ``profile_engine.py --peer``)."""

import textwrap
from pathlib import Path

# gpt-fast's interface (model.py of pytorch-labs/gpt-fast: ModelArgs, KVCache, Transformer with
# setup_caches(max_batch_size, max_seq_length) and forward(idx, input_pos) over a static cache
# under a causal mask), a few lines of it: the real file is carried to the GPU, never vendored.
STAND_IN = textwrap.dedent('''
    from dataclasses import dataclass
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    @dataclass
    class ModelArgs:
        block_size: int = 2048
        vocab_size: int = 32000
        n_layer: int = 2
        n_head: int = 4
        dim: int = 64
        intermediate_size: int = 128
        n_local_heads: int = -1
        head_dim: int = 16
        rope_base: float = 10000
        norm_eps: float = 1e-5

        def __post_init__(self):
            if self.n_local_heads == -1:
                self.n_local_heads = self.n_head
            self.head_dim = self.dim // self.n_head

    class KVCache(nn.Module):
        def __init__(self, B, S, H, D, dtype):
            super().__init__()
            self.register_buffer("k_cache", torch.zeros(B, H, S, D, dtype=dtype))
            self.register_buffer("v_cache", torch.zeros(B, H, S, D, dtype=dtype))

        def update(self, pos, k, v):
            self.k_cache[:, :, pos] = k
            self.v_cache[:, :, pos] = v
            return self.k_cache, self.v_cache

    class Attention(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.c, self.kv_cache = c, None
            self.wqkv = nn.Linear(c.dim, (c.n_head + 2 * c.n_local_heads) * c.head_dim, bias=False)
            self.wo = nn.Linear(c.dim, c.dim, bias=False)

        def forward(self, x, mask, pos):
            c, (B, S, _) = self.c, x.shape
            kv = c.n_local_heads * c.head_dim
            q, k, v = (t.view(B, S, -1, c.head_dim).transpose(1, 2) for t in self.wqkv(x).split([c.dim, kv, kv], -1))
            k, v = self.kv_cache.update(pos, k, v)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
            return self.wo(y.transpose(1, 2).reshape(B, S, c.dim))

    class Block(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.attention = Attention(c)
            self.w1 = nn.Linear(c.dim, c.intermediate_size, bias=False)
            self.w2 = nn.Linear(c.intermediate_size, c.dim, bias=False)

        def forward(self, x, pos, mask):
            h = x + self.attention(x, mask, pos)
            return h + self.w2(F.silu(self.w1(h)))

    class Transformer(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.config = config
            self.tok_embeddings = nn.Embedding(config.vocab_size, config.dim)
            self.layers = nn.ModuleList(Block(config) for _ in range(config.n_layer))
            self.output = nn.Linear(config.dim, config.vocab_size, bias=False)
            self.max_batch_size = self.max_seq_length = -1

        def setup_caches(self, max_batch_size, max_seq_length):
            if self.max_seq_length >= max_seq_length and self.max_batch_size >= max_batch_size:
                return
            c, dt = self.config, self.output.weight.dtype
            self.max_batch_size, self.max_seq_length = max_batch_size, max_seq_length
            for b in self.layers:
                b.attention.kv_cache = KVCache(max_batch_size, max_seq_length, c.n_local_heads, c.head_dim, dt)
            self.causal_mask = torch.tril(torch.ones(max_seq_length, max_seq_length, dtype=torch.bool))

        def forward(self, idx, input_pos):
            mask = self.causal_mask[None, None, input_pos]
            x = self.tok_embeddings(idx)
            for b in self.layers:
                x = b(x, input_pos, mask)
            return self.output(x)
''')


def write_stand_in(parent: Path) -> Path:
    """A ``gpt-fast`` folder under ``parent`` holding the stand-in ``model.py`` and an ``UPSTREAM`` file."""
    d = parent / "gpt-fast"
    d.mkdir()
    (d / "model.py").write_text(STAND_IN)
    (d / "UPSTREAM").write_text("stand-in for the test")
    return d

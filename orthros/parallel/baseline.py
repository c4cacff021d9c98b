"""The Transformer baseline of the sequence-parallel benchmark: the same weights run as a plain
causal Transformer (no scale-offset, full attention through PyTorch SDPA), on one GPU or over N
GPUs with PyTorch's context parallelism (``torch.distributed.tensor.experimental.
context_parallel``: ring attention with head-tail load balancing).

Only the benchmark uses this; it is not a second model implementation to keep in sync, just a
layer loop that calls the model's own layer pieces (``pre_attention``, projections,
``post_attention``) with ``F.scaled_dot_product_attention`` as attention.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F



@torch.no_grad()
def transformer_prefill(model, input_ids: torch.Tensor, position_ids: torch.Tensor, *, chunk_size: int = 32768,
                        keep_cache: bool = True):
    """Causal-Transformer prefill of ``input_ids [B, n]`` at ``position_ids [B, n]``; returns the
    last row's logits and the per-layer K/V. Under ``context_parallel`` the ids and positions
    are this rank's (load-balanced) shard and SDPA is ring attention."""
    core = model.model
    B, n = input_ids.shape
    h = core.embed_tokens(input_ids)
    rope = core.rotary_emb(position_ids)
    cache = []
    for layer in core.layers:
        attn = layer.self_attn
        x = layer.pre_attention(h)
        q, gate = attn.queries(x, rope, stream=None, with_gate=True)
        k, v = attn.keys_values(x, rope)
        del x
        if keep_cache:
            cache.append((k, v))
        G = q.shape[2] // k.shape[2]
        kt = k.transpose(1, 2).repeat_interleave(G, dim=1)
        vt = v.transpose(1, 2).repeat_interleave(G, dim=1)
        # looked up at call time: context_parallel patches torch.nn.functional
        o = F.scaled_dot_product_attention(q.transpose(1, 2), kt, vt, is_causal=True)
        del q, kt, vt
        a = attn.o_proj(attn.gate_output(o.transpose(1, 2), gate).reshape(B, n, -1))
        del o, gate
        for c in range(0, n, chunk_size):  # the layer's own residual + MLP, chunked (activation memory)
            h[:, c:c + chunk_size] = layer.post_attention(h[:, c:c + chunk_size], a[:, c:c + chunk_size])
        del a
    return model.lm_head(core.norm(h[:, -1:])), cache


@torch.no_grad()
def transformer_cp_prefill(model, input_ids: torch.Tensor, mesh, *, chunk_size: int = 32768):
    """The same prefill over the ranks of ``mesh`` with PyTorch context parallelism."""
    from torch.distributed.tensor.experimental import context_parallel

    B, T = input_ids.shape
    ids = input_ids.clone()
    pos = torch.arange(T, device=ids.device).view(1, T).expand(B, T).contiguous()
    with context_parallel(mesh, buffers=[ids, pos], buffer_seq_dims=[1, 1], no_restore_buffers={ids, pos}):
        return transformer_prefill(model, ids, pos, chunk_size=chunk_size)

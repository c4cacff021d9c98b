"""OrthrosAttention, the layer step's attention mixer (paper Algorithm 1), against brute-force
masked softmax written here in float64: every mode ("orthros", "full", "window"), the last layer
and the others, T = 1, T = w, T = w + 1, sparse and every-position outputs, left padding
(kv_start), packed documents, and q/k norm + biases + Qwen3.5's output gate; values and
gradients."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import rel, tiny_config

from orthros.layers import DenseKV, OrthrosAttention, RotaryEmbedding, StepInputs

pytestmark = pytest.mark.usefixtures("one_thread")
W = 4


def _rot(x, cos, sin):
    R = cos.shape[-1]
    xr, xp = x[..., :R], x[..., R:]
    x1, x2 = xr[..., :R // 2], xr[..., R // 2:]
    return torch.cat([xr * cos[:, :, None] + torch.cat([-x2, x1], -1) * sin[:, :, None], xp], -1)


def brute(attn, x, T, out_rel, pos_ids, final, mode, kv_start=None, doc=None):
    """The layer's output rows: [window rows of the base tokens (not in the last layer) | output
    rows] for Orthros, every base row (the last layer: those at the output positions) otherwise."""
    B = x.shape[0]
    H, D, Hk = attn.num_heads, attn.head_dim, attn.num_kv_heads
    cos, sin = (t.double() for t in RotaryEmbedding(attn.config)(pos_ids.expand(B, -1)))
    pick = lambda t, rows: torch.gather(t, 1, rows.expand(B, -1)[..., None].expand(-1, -1, t.shape[-1]))  # noqa: E731
    xb = x[:, :T]
    k = attn.k_proj(xb).view(B, T, Hk, D)
    k = _rot(attn.k_norm(k) if attn.k_norm is not None else k, cos, sin).repeat_interleave(H // Hk, 2)
    v = attn.v_proj(xb).view(B, T, Hk, D).repeat_interleave(H // Hk, 2)

    def attend(xq, qpos, window, alpha=None, beta=None):
        q = attn.q_proj(xq)
        gate = None
        if attn.output_gate:
            q, gate = q.view(B, -1, H, 2 * D).split(D, -1)
        q = q.reshape(B, -1, H, D)
        q = attn.q_norm(q) if attn.q_norm is not None else q
        if alpha is not None:
            q = q * alpha.view(H, D) + beta.view(H, D)
        q = _rot(q, pick(cos, qpos), pick(sin, qpos))
        s = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(D)
        kp, qp = torch.arange(T)[None, None, :], qpos.expand(B, -1)[:, :, None]
        mask = (kp <= qp) & ((kp > qp - W) if window else True)
        if kv_start is not None:
            mask = mask & (kp >= kv_start[:, None, None])
        if doc is not None:
            mask = mask & (doc[kp] == doc[qp])
        p = torch.softmax(s.masked_fill(~mask[:, None], float("-inf")), -1).nan_to_num(0.0)  # padding rows: 0
        o = torch.einsum("bhqk,bkhd->bqhd", p, v)
        return o if gate is None else o * torch.sigmoid(gate)

    base = torch.arange(T).view(1, T)
    so = attn.has_scale_offset
    if mode == "orthros":
        rows = [] if final else [attend(xb, base, True, *((attn.alpha, attn.beta) if so else ()))]
        rows.append(attend(x[:, T:], out_rel, False, *((attn.alpha_out, attn.beta_out) if so else ())))
        o = torch.cat(rows, 1)
    else:
        o = attend(xb, base, mode == "window")
        o = pick(o.flatten(2), out_rel) if final else o.flatten(2)
    return attn.o_proj(o.flatten(2))


def _run(mode, T, out, final, *, B=2, kv_start=None, cu=None, backend="reference", grads=False, **over):
    cfg = tiny_config(attention_mode=mode, window_size=W, attn_backend=backend, **over)
    attn = OrthrosAttention(cfg, cfg.num_hidden_layers - 1 if final else 0).double()
    attn.config = cfg
    g = torch.Generator().manual_seed(T * 7 + len(out))
    with torch.no_grad():
        for p in attn.parameters():
            p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.3)
    out_rel = torch.tensor([out], dtype=torch.long).view(1, -1)
    doc = None
    pos_ids = torch.arange(T).view(1, T)
    if cu is not None:
        cu = torch.tensor(cu)
        doc = torch.searchsorted(cu[1:], torch.arange(T), right=True)
        pos_ids = (torch.arange(T) - cu[doc]).view(1, T)
    rope = RotaryEmbedding(cfg)
    tokens = mode == "orthros"
    x = torch.randn(B, T + (len(out) if tokens else 0), cfg.hidden_size, generator=g, dtype=torch.float64)
    step = StepInputs(n_base=T, rope_base=tuple(t.double() for t in rope(pos_ids)),
                      rope_out=tuple(t.double() for t in rope(torch.gather(pos_ids.expand(B, -1), 1,
                                                                           out_rel.expand(B, -1)))),
                      out_rel=out_rel, output_tokens=tokens, cache=DenseKV(), output_positions=out_rel,
                      kv_start=kv_start, doc_ids=doc, cu_seqlens=cu)
    res = []
    for f in (lambda x: attn(x, step, final), lambda x: brute(attn, x, T, out_rel, pos_ids, final, mode, kv_start, doc)):
        xi = x.clone().requires_grad_(grads)
        with torch.set_grad_enabled(grads):
            y = f(xi)
            if not grads:
                res.append([y])
                continue
            attn.zero_grad()
            (y * torch.randn(y.shape, generator=torch.Generator().manual_seed(1), dtype=y.dtype)).sum().backward()
            res.append([y.detach(), xi.grad] + [p.grad for p in attn.parameters() if p.grad is not None])
    assert len(res[0]) == len(res[1])
    for a, b in zip(*res):
        assert rel(a, b, floor=1e-6) < 1e-10


MODES = [(m, f) for m in ("orthros", "full", "window") for f in (False, True)]


@pytest.mark.parametrize("mode,final", MODES)
@pytest.mark.parametrize("T,out", [(1, [0]), (W, [W - 1]), (W + 1, [0, W]), (11, list(range(11))), (11, [2, 5, 10])])
def test_layer_equals_brute_force(mode, final, T, out):
    _run(mode, T, out, final)


@pytest.mark.parametrize("mode,final", MODES)
def test_left_padding_and_documents(mode, final):
    _run(mode, 10, [1, 6, 9], final, kv_start=torch.tensor([0, 3]), backend="sdpa")
    _run(mode, 12, [3, 4, 11], final, B=1, cu=[0, 4, 5, 12])


@pytest.mark.parametrize("mode,final", MODES)
def test_gradients_with_qk_norm_biases_and_output_gate(mode, final):
    # q/k norms compute in float32 (Llama's order), so only the gate and biases run at float64 here
    _run(mode, W + 2, [1, W + 1], final, grads=True, attention_bias=True, o_proj_bias=True, attn_output_gate=True)
    _run(mode, W + 2, [1, W + 1], final, qk_norm=True)

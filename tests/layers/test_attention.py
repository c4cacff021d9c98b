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
        mask = (kp <= qp) & ((kp > qp - attn.window_size) if window else True)
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
    cfg = tiny_config(**{"attention_mode": mode, "window_size": W, "attn_backend": backend, **over})
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
@pytest.mark.parametrize("w,heads", [(1, (4, 2)), (2, (8, 1)), (32, (3, 3))])
def test_window_one_window_beyond_the_sequence_and_gqa_ratios(mode, final, w, heads):
    _run(mode, 9, [0, w, 8] if w < 8 else [0, 8], final, window_size=w, num_attention_heads=heads[0],
         num_key_value_heads=heads[1], head_dim=4 if heads[0] == 8 else 12)


@pytest.mark.parametrize("mode,final", MODES)
def test_left_padding_and_documents(mode, final):
    _run(mode, 10, [1, 6, 9], final, kv_start=torch.tensor([0, 3]), backend="sdpa")
    _run(mode, 12, [3, 4, 11], final, B=1, cu=[0, 4, 5, 12])


@pytest.mark.parametrize("mode,final", MODES)
def test_gradients_with_qk_norm_biases_and_output_gate(mode, final):
    # q/k norms compute in float32 (Llama's order), so only the gate and biases run at float64 here
    _run(mode, W + 2, [1, W + 1], final, grads=True, attention_bias=True, o_proj_bias=True, attn_output_gate=True)
    _run(mode, W + 2, [1, W + 1], final, qk_norm=True)


def _bare_step(cfg, tokens, T, out, **kw):
    """A step of ``T`` base rows (positions 0..T-1) with outputs at ``out``, built by hand."""
    rope = RotaryEmbedding(cfg)(torch.arange(T).view(1, T))
    return StepInputs(n_base=T, rope_base=rope, rope_out=tuple(t[:, out] for t in rope), out_rel=torch.tensor([out]),
                      output_tokens=tokens, **kw)


@pytest.mark.parametrize("mode", ["orthros", "full", "window"])
def test_dense_kv_derives_output_positions_when_the_step_has_none(mode):
    """``StepInputs.output_positions`` is optional: the HF path's cache derives them from
    ``out_rel`` and its key length (was a TypeError / AttributeError on None inside DenseKV)."""
    from orthros.models import OrthrosCache

    cfg = tiny_config(attention_mode=mode)
    attn = OrthrosAttention(cfg, 0).eval()
    tok = mode == "orthros"
    x = torch.randn(2, 7, cfg.hidden_size)
    with torch.no_grad():
        for past in (0, 3):  # without a cache, and after 3 cached tokens
            want, got = [], []
            for positions, res in ((torch.tensor([[past + 1, past + 3]]), want), (None, got)):
                cache = DenseKV(OrthrosCache())
                if past:
                    attn(x[:, :past], _bare_step(cfg, False, past, [past - 1], cache=cache, mode="full",
                                                 output_positions=torch.tensor([[past - 1]])))
                step = _bare_step(cfg, tok, 4, [1, 3], cache=cache, output_positions=positions)
                res.append(attn(torch.cat([x[:, past:past + 4], x[:, past:past + 4][:, [1, 3]]], 1) if tok
                                else x[:, past:past + 4], step))
            assert rel(got[0], want[0]) == 0.0


@pytest.mark.parametrize("mode,arg", [("transformer", None), ("swa", None), ("Full", "config.attention_mode"),
                                      ("causal", "config.attention_mode")])
def test_attention_mode_is_resolved_at_construction(mode, arg):
    """A config's attention mode set after ``OrthrosConfig.__init__`` (which resolves aliases) is
    resolved by the layer: an alias runs its mode, an unknown name is refused naming the field
    (both ran a sliding-window layer without a word)."""
    cfg = tiny_config()
    cfg.attention_mode = mode
    if arg is None:
        assert OrthrosAttention(cfg, 0).mode == {"transformer": "full", "swa": "window"}[mode]
    else:
        with pytest.raises(ValueError, match=f"{arg} must be one of .*got '{mode}'"):
            OrthrosAttention(cfg, 0)


def test_an_unknown_step_mode_is_refused():
    cfg = tiny_config()
    attn = OrthrosAttention(cfg, 0)
    with pytest.raises(ValueError, match="StepInputs.mode must be None or one of .*got 'transformer'"):
        attn(torch.randn(1, 4, cfg.hidden_size), _bare_step(cfg, False, 4, [3], cache=DenseKV(), mode="transformer"))


@pytest.mark.parametrize("idx", [-1, 3, 1.0, True, None])
def test_layer_idx_out_of_range_is_refused_at_construction(idx):
    """``layer_idx`` decides which scale-offset parameters the layer has (the last one has no
    alpha/beta) and keys the cache: outside [0, num_hidden_layers) it was taken as it was."""
    with pytest.raises(ValueError, match=r"layer_idx must be an integer in \[0, 3\)"):
        OrthrosAttention(tiny_config(), idx)


def test_layer_idx_takes_numpy_integers_and_0d_tensors_as_ints():
    """One answer to "is this an int" (utils.as_int): a NumPy integer or a 0-d tensor was refused here while
    the engine's max_new_tokens took it; it is the Python int it equals (it keys the cache)."""
    import numpy as np

    for idx in (np.int64(2), torch.tensor(2)):
        attn = OrthrosAttention(tiny_config(), idx)
        assert attn.layer_idx == 2 and type(attn.layer_idx) is int
    with pytest.raises(ValueError, match=r"layer_idx must be an integer in \[0, 3\)"):
        OrthrosAttention(tiny_config(), np.True_)


def test_base_queries_of_the_last_layer_are_refused_by_name():
    """The last layer has no base stream (no alpha, beta): asking for its base queries was an
    AttributeError 'alpha' deep in the scale-offset."""
    cfg = tiny_config()
    last = OrthrosAttention(cfg, cfg.num_hidden_layers - 1)
    rope = RotaryEmbedding(cfg)(torch.arange(3).view(1, 3))
    x = torch.randn(1, 3, cfg.hidden_size)
    with pytest.raises(ValueError, match="last layer.*no base stream"):
        last.queries(x, rope, "base")
    assert last.queries(x, rope, "out").shape == last.queries(x, rope, None).shape == (1, 3, 4, 12)


@pytest.mark.parametrize("final", [False, True])
@pytest.mark.parametrize("tokens,rows", [(True, 5), (True, 6), (True, 8), (False, 7)])
def test_forward_refuses_rows_that_do_not_match_the_step(tokens, rows, final):
    """``x`` of a layer's forward holds the step's base rows, then (``output_tokens``) one output
    token per output position. Without the output tokens the output stream was silently dropped
    (5 rows out for 5 + 2 expected); one output token for two output positions was broadcast by
    RoPE into two rows."""
    cfg = tiny_config(attention_mode="orthros" if tokens else "full")
    attn = OrthrosAttention(cfg, cfg.num_hidden_layers - 1 if final else 0)
    step = _bare_step(cfg, tokens, 5, [2, 4], cache=DenseKV())
    want = 5 + 2 * tokens
    with pytest.raises(ValueError, match=rf"x must have {want} rows \(n_base = 5.*got 1 x {rows}"):
        attn(torch.randn(1, rows, cfg.hidden_size), step, final)
    assert attn(torch.randn(1, want, cfg.hidden_size), step, final).shape[1] == (2 if final else want)


@pytest.mark.parametrize("final", [False, True])
@pytest.mark.parametrize("mode", ["orthros", "full"])
@pytest.mark.parametrize("out,match", [([1, 1, 2], "must be strictly increasing"),
                                       ([3, 1], "must be strictly increasing"),
                                       ([0, 9], r"must lie in \[0, 8\), got \[0, 9\]"),
                                       ([-1, 2], r"must lie in \[0, 8\), got \[-1, 2\]")])
def test_forward_refuses_repeated_or_out_of_range_output_positions(mode, final, out, match):
    """A step's ``out_rel`` built by hand ran unchecked: a repeated or unordered position gave rows
    without a word, and in an Orthros layer one out of range too (its queries saw keys they should
    not); a full layer's failed in torch's gather. Refused with the model's messages, naming the field."""
    cfg = tiny_config(attention_mode=mode)
    attn = OrthrosAttention(cfg, cfg.num_hidden_layers - 1 if final else 0)
    step = _bare_step(cfg, mode == "orthros", 8, [p % 8 for p in out], cache=DenseKV())
    step.out_rel = torch.tensor([out])
    rows = 8 + (len(out) if mode == "orthros" else 0)
    with pytest.raises(ValueError, match=rf"^StepInputs.out_rel {match}"):
        attn(torch.randn(1, rows, cfg.hidden_size), step, final)


@pytest.mark.parametrize("which,rows", [("rope_out", 1), ("rope_out", 3), ("rope_base", 1), ("rope_base", 6)])
def test_forward_refuses_rope_tables_that_do_not_match_the_step(which, rows):
    """A RoPE table of one row for two output positions was broadcast: both output queries were
    rotated to one position without a word (the others failed in a broadcast deep in RoPE)."""
    cfg = tiny_config()
    attn = OrthrosAttention(cfg, 0)
    step = _bare_step(cfg, True, 5, [2, 4], cache=DenseKV())
    setattr(step, which, tuple(t[:, :1].expand(-1, rows, -1) for t in getattr(step, which)))
    with pytest.raises(ValueError, match=rf"StepInputs.{which} must be \(cos, sin\) of \[B or 1, {5 if which == 'rope_base' else 2}, R\]"):
        attn(torch.randn(1, 7, cfg.hidden_size), step)


def test_an_unknown_attn_backend_is_refused_at_construction():
    """``config.attn_backend`` set after ``OrthrosConfig.__init__`` (which checks it): an unknown
    name ran the reference op without a word."""
    cfg = tiny_config()
    cfg.attn_backend = "triton2"
    with pytest.raises(ValueError, match=r"config.attn_backend must be one of \('auto', 'reference', 'sdpa', 'triton'\), "
                                         r"got 'triton2'"):
        OrthrosAttention(cfg, 0)


@pytest.mark.parametrize("w", [0, -1, 2.5, None, True])
def test_a_bad_window_size_is_refused_at_construction(w):
    """``config.window_size`` edited after ``OrthrosConfig.__init__``: 0 or -1 zeroed every window
    row without a word; a float or None failed deep in the op."""
    cfg = tiny_config()
    cfg.window_size = w
    with pytest.raises(ValueError, match=rf"config.window_size must be an integer >= 1, got {w!r}"):
        OrthrosAttention(cfg, 0)

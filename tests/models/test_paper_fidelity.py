"""The paper's stated properties, pinned against code written here from the paper's text alone.

Every test cites the section of ``/work/shared/paper/orthros-paper.txt`` (the specification) it
pins. The brute force below is Algorithm 2 written from Section 3.1's equations with T x T masks
in float64; it shares nothing with the package but the weights it reads from ``state_dict()``.
The model runs its RMSNorm and RoPE in float32 (as transformers' Llama does), so agreement is
~1e-7 relative, while a window one key too wide or too narrow moves the logits by ~1e-2.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import cpu_triton, rel, tiny_config, tiny_model

from orthros import OrthrosCache
from orthros.kinds import LINEAR_LAYER_TYPE, hybrid_layout
from orthros.ops import orthros_attention

pytestmark = pytest.mark.usefixtures("one_thread")
V = 97  # tiny_config's vocabulary
TOL = 1e-6  # float32 norms and RoPE inside the model; a wrong window gives ~1e-2
HYBRID = dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=6)


# ------------------------------------------------------------------ Algorithm 2, from the paper
def _rms(x, w, eps):
    return w * (x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rope(x, pos, theta):
    """Llama's RoPE (rotate-half) of ``x [B, n, H, D]`` at absolute positions ``pos [n]``."""
    D = x.shape[-1]
    ang = pos.double()[:, None] / theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D)[None]
    emb = torch.cat([ang, ang], -1)
    x1, x2 = x[..., :D // 2], x[..., D // 2:]
    return x * emb.cos()[None, :, None] + torch.cat([-x2, x1], -1) * emb.sin()[None, :, None]


def _orthros_attention(g, c, hb, ho, out_pos, w):
    """Section 3.1: k, v from the base tokens only; q = alpha (x W_Q) + beta over keys
    max(1, t-w+1) .. t; q' = alpha' (x' W_Q) + beta' over keys 1 .. t; outputs concatenated
    along the sequence, then W_O. The last layer has no alpha/beta in the package (its base
    queries are never read): any value gives the same logits, 1 and 0 are used here."""
    B, T, _ = hb.shape
    H, Hk, D = c.num_attention_heads, c.num_key_value_heads, c.head_dim
    theta = c.rope_parameters["rope_theta"]
    pos = torch.arange(T)
    k = _rope((hb @ g("k_proj.weight").T).view(B, T, Hk, D), pos, theta).repeat_interleave(H // Hk, 2)
    v = (hb @ g("v_proj.weight").T).view(B, T, Hk, D).repeat_interleave(H // Hk, 2)
    ones, zeros = torch.ones(H * D, dtype=torch.float64), torch.zeros(H * D, dtype=torch.float64)
    a, b = g("alpha", ones), g("beta", zeros)
    q = _rope((a * (hb @ g("q_proj.weight").T) + b).view(B, T, H, D), pos, theta)
    # an output token has the RoPE position of the token it duplicates
    qo = _rope((g("alpha_out") * (ho @ g("q_proj.weight").T) + g("beta_out")).view(B, -1, H, D), out_pos, theta)

    def attend(qq, t, window):
        j = torch.arange(T)[None]
        t = t[:, None]
        visible = (j <= t) & ((j >= t - w + 1) if window else True)
        s = (torch.einsum("bqhd,bkhd->bhqk", qq, k) / math.sqrt(D)).masked_fill(~visible, float("-inf"))
        return torch.einsum("bhqk,bkhd->bqhd", s.softmax(-1), v).flatten(2)

    return torch.cat([attend(q, pos, True), attend(qo, out_pos, False)], 1) @ g("o_proj.weight").T


def _gdn(g, c, hb, ho, out_pos):
    """Section 4.6 (Orthros-H): the base stream is Qwen3.5's Gated DeltaNet over the base tokens
    (causal depthwise conv + SiLU on q|k|v, l2-normed q/k, gated delta rule, S_t after token t);
    the output stream is "GDN as cross-attention part": the output token's own query, which
    bypasses the convolution (projection + SiLU), reads the state at its position. Output tokens
    write no state. Each row keeps its own output gate z."""
    B, T, _ = hb.shape
    Hk, Hv, K, Vd = c.linear_num_key_heads, c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim
    kd = Hk * K
    Wqkv, conv = g("in_proj_qkv.weight"), g("conv1d.weight")[:, 0]  # [C, taps]
    taps = conv.shape[1]
    x = F.pad(hb @ Wqkv.T, (0, 0, taps - 1, 0))
    y = F.silu(sum(conv[:, i] * x[:, i:i + T] for i in range(taps)))
    l2 = lambda t: t / torch.sqrt((t * t).sum(-1, keepdim=True) + 1e-6)  # noqa: E731
    heads = lambda t: l2(t.view(B, -1, Hk, K)).repeat_interleave(Hv // Hk, 2)  # noqa: E731
    q, k, v = heads(y[..., :kd]), heads(y[..., kd:2 * kd]), y[..., 2 * kd:].view(B, T, Hv, Vd)
    qo = heads(F.silu(ho @ Wqkv.T)[..., :kd])
    beta = torch.sigmoid(hb @ g("in_proj_b.weight").T)
    decay = torch.exp(-g("A_log").exp() * F.softplus(hb @ g("in_proj_a.weight").T + g("dt_bias")))
    S = torch.zeros(B, Hv, K, Vd, dtype=torch.float64)
    states, o = [], []
    for t in range(T):
        S = decay[:, t, :, None, None] * S
        err = v[:, t] - torch.einsum("bhkv,bhk->bhv", S, k[:, t])
        S = S + torch.einsum("bhk,bhv->bhkv", k[:, t], beta[:, t, :, None] * err)
        states.append(S)
        o.append(torch.einsum("bhkv,bhk->bhv", S, q[:, t]) / math.sqrt(K))
    o = torch.stack(o, 1)
    oo = torch.stack([torch.einsum("bhkv,bhk->bhv", states[p], qo[:, i]) / math.sqrt(K)
                      for i, p in enumerate(out_pos.tolist())], 1)
    z = torch.cat([hb, ho], 1) @ g("in_proj_z.weight").T
    oc = torch.cat([o, oo], 1)
    gated = _rms(oc, g("norm.weight"), c.rms_norm_eps) * F.silu(z.view(*oc.shape))
    return gated.flatten(2) @ g("out_proj.weight").T


def algorithm2(model, ids, out_pos, w=None, params=None):
    """Logits ``[B, T_out, V]`` of the output tokens at ``out_pos`` (0-based), Algorithm 2: the
    embeddings of the output positions are duplicated and appended, every layer runs over the
    concatenation (norms and MLPs token-wise), logits come from the output tokens only.
    ``params``: tensors used in place of the model's (by state-dict name), e.g. leaves to
    differentiate."""
    c = model.config
    sd = {k: t.double() for k, t in {**model.state_dict(), **(params or {})}.items()}
    w = c.window_size if w is None else w
    T = ids.shape[1]
    out_pos = torch.as_tensor(out_pos)
    e = sd["model.embed_tokens.weight"][ids]
    h = torch.cat([e, e[:, out_pos]], 1)  # [x_1 .. x_T | x'_{T_in+1} .. x'_T]
    for i, kind in enumerate(c.layer_types):
        p = f"model.layers.{i}."
        n = _rms(h, sd[p + "input_layernorm.weight"], c.rms_norm_eps)
        if kind == LINEAR_LAYER_TYPE:
            a = _gdn(lambda name, d=None: sd.get(p + "linear_attn." + name, d), c, n[:, :T], n[:, T:], out_pos)
        else:
            a = _orthros_attention(lambda name, d=None: sd.get(p + "self_attn." + name, d), c, n[:, :T], n[:, T:],
                                   out_pos, w)
        h = h + a
        n = _rms(h, sd[p + "post_attention_layernorm.weight"], c.rms_norm_eps)
        gate, up = n @ sd[p + "mlp.gate_proj.weight"].T, n @ sd[p + "mlp.up_proj.weight"].T
        h = h + (F.silu(gate) * up) @ sd[p + "mlp.down_proj.weight"].T
    return _rms(h[:, T:], sd["model.norm.weight"], c.rms_norm_eps) @ sd["lm_head.weight"].T


def _model(**kw):
    return tiny_model(dtype=torch.float64, **kw)  # window 8, 3 layers, GQA 4/2, random alpha/beta


# ------------------------------------------------------------------ Section 3.1: the two streams
@pytest.mark.parametrize("backend", ["reference", "sdpa", pytest.param("triton", marks=cpu_triton)])
@pytest.mark.parametrize("w", [1, 4, 13, 20])
def test_window_stream_sees_w_keys_including_itself_and_output_stream_every_earlier_key(backend, w):
    """Section 3.1: o_t sums over j = max(1, t-w+1) .. t (w keys, the query's own included);
    o'_t over j = 1 .. t (its own position's base key included). With zero queries the softmax
    is uniform over the visible keys, and one-hot values (v_j = e_j) show exactly which."""
    T = 13
    dt = torch.float32 if backend == "triton" else torch.float64
    q, q_out = torch.zeros(1, T, 1, 16, dtype=dt), torch.zeros(1, T, 1, 16, dtype=dt)
    k = torch.randn(1, T, 1, 16, dtype=dt)
    v = torch.eye(16, dtype=dt)[:T].view(1, T, 1, 16)
    o, o_out = orthros_attention(q, k, v, q_out, window_size=w, backend=backend)
    for t in range(T):
        assert torch.nonzero(o[0, t, 0]).view(-1).tolist() == list(range(max(0, t - w + 1), t + 1))
        assert torch.nonzero(o_out[0, t, 0]).view(-1).tolist() == list(range(t + 1))


@pytest.mark.parametrize("backend", ["reference", "sdpa"])
def test_model_is_algorithm_2_beyond_the_window(backend):
    """Sections 3.1 / 3.2 (PT, T_in = 0, T_out = T): the model's logits are Algorithm 2's at
    T = 30 > w = 8 with random alpha, beta, alpha', beta'; a window of w - 1 or w + 1 keys is not."""
    model = _model(attn_backend=backend)
    ids = torch.randint(0, V, (2, 30), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got = model(ids).logits
    assert rel(got, algorithm2(model, ids, range(30))) < TOL
    for w in (7, 9):
        assert rel(got, algorithm2(model, ids, range(30), w=w)) > 1e-3


def test_sft_and_prefill_are_algorithm_2_with_their_output_positions():
    """Section 3.2: SFT (T_out = the response length: from the last prompt token to the token
    before the last response token) and prefill (T_out = 1, the last prompt token) are the same
    computation with other output positions."""
    model = _model()
    ids = torch.randint(0, V, (2, 30), generator=torch.Generator().manual_seed(1))
    labels = torch.full_like(ids, -100)
    labels[:, 21:] = ids[:, 21:]  # the response: tokens 21 .. 29
    with torch.no_grad():
        sft = model(ids, labels=labels).logits
        pre = model(ids, logits_to_keep=1).logits
    assert sft.shape[1] == 9  # positions 20 .. 28 predict tokens 21 .. 29
    assert rel(sft, algorithm2(model, ids, range(20, 29))) < TOL
    assert rel(pre, algorithm2(model, ids, [29])) < TOL


@pytest.mark.parametrize("kind", ["orthros", "orthros-h"])
def test_sft_loss_and_its_gradient_are_algorithm_2s(kind):
    """Section 3.2 (SFT; strict training-inference consistency): the loss is the cross-entropy of
    Algorithm 2's output tokens over the response only, and its gradient (here with respect to
    the embeddings, which reach the loss through both streams and the shared K/V) is the brute
    force's."""
    model = _model() if kind == "orthros" else _model(num_hidden_layers=4, **HYBRID, **hybrid_layout(kind, 4))
    model.train()
    ids = torch.randint(0, V, (2, 20), generator=torch.Generator().manual_seed(6))
    labels = ids.clone()
    labels[:, :5] = -100  # the prompt: tokens 0 .. 4
    emb = model.model.embed_tokens.weight
    loss = model(ids, labels=labels).loss
    grad = torch.autograd.grad(loss, emb)[0]
    leaf = emb.detach().double().requires_grad_(True)
    logits = algorithm2(model, ids, range(4, 19), params={"model.embed_tokens.weight": leaf})
    want = F.cross_entropy(logits.reshape(-1, V), ids[:, 5:].reshape(-1))
    assert abs(loss.item() - want.item()) < TOL * want.item()
    assert rel(grad, torch.autograd.grad(want, leaf)[0]) < 10 * TOL


def _rows_through_first_mlp(model, **kw):
    seen = []
    hook = model.model.layers[0].mlp.register_forward_hook(lambda m, i, o: seen.append(i[0].shape[1]))
    try:
        with torch.no_grad():
            model(**kw)
    finally:
        hook.remove()
    return seen[0]


def test_each_paradigm_appends_exactly_t_out_output_tokens():
    """Section 3.2 / Algorithm 2: the backbone runs over T base + T_out output tokens; PT
    T_out = T, SFT the response length, prefill 1, decode 1 (T = 1 with a cache)."""
    model = _model()
    ids = torch.randint(0, V, (1, 20), generator=torch.Generator().manual_seed(2))
    labels = torch.full_like(ids, -100)
    labels[:, 15:] = ids[:, 15:]
    assert _rows_through_first_mlp(model, input_ids=ids) == 20 + 20
    assert _rows_through_first_mlp(model, input_ids=ids, labels=labels) == 20 + 5
    assert _rows_through_first_mlp(model, input_ids=ids, logits_to_keep=1) == 20 + 1
    cache = OrthrosCache()
    with torch.no_grad():
        model(ids, logits_to_keep=1, past_key_values=cache, use_cache=True)
    assert _rows_through_first_mlp(model, input_ids=ids[:, :1], past_key_values=cache, use_cache=True) == 1 + 1
    # output tokens write no K/V: the cache holds one entry per token
    assert cache.get_seq_length() == 21


@pytest.mark.parametrize("kind", ["orthros", "orthros-h"])
def test_decode_token_pairs_are_algorithm_2_at_the_last_position(kind):
    """Section 3.2 (Decoding, T_in = 0, T_out = 1): each step's base token appends its K/V (a
    GDN layer: updates its state) and runs the window stream, its output copy attends to the
    whole cache including itself (reads the state after its token); both the HF cache path and
    the inference engine (chunked prefill) give Algorithm 2's logits of the whole sequence."""
    from orthros.engine import Engine

    model = _model() if kind == "orthros" else _model(num_hidden_layers=4, **HYBRID, **hybrid_layout(kind, 4))
    ids = torch.randint(0, V, (2, 22), generator=torch.Generator().manual_seed(3))
    P = 10
    want = [algorithm2(model, ids[:, :t + 1], [t])[:, 0] for t in range(P - 1, 22)]
    cache = OrthrosCache()
    with torch.no_grad():
        got = [model(ids[:, :P], logits_to_keep=1, past_key_values=cache, use_cache=True).logits[:, 0]]
        got += [model(ids[:, t:t + 1], past_key_values=cache, use_cache=True).logits[:, 0] for t in range(P, 22)]
    assert max(rel(a, b) for a, b in zip(got, want)) < TOL
    eng = Engine(model, max_batch_size=2, max_seq_len=32, prefill_chunk=4)
    got = [eng.prefill([ids[0, :P], ids[1, :P]])] + [eng.step(ids[:, t]) for t in range(P, 22)]
    assert max(rel(a, b) for a, b in zip(got, want)) < TOL


@pytest.mark.parametrize("kind", ["orthros", "orthros-h"])
def test_a_continuation_of_a_cache_is_algorithm_2_of_the_whole_sequence(kind):
    """Section 3.2: the paradigms differ only in T_in / T_out. A new turn appended to a cache
    (several base tokens at once, output tokens at a few of them, one with a left-padded row)
    is Algorithm 2 over the whole sequence at those positions: the new base tokens read the
    cached keys (the window crosses the cache boundary; a GDN layer continues its state) and
    each output token every key up to its own position, cache included."""
    model = _model() if kind == "orthros" else _model(num_hidden_layers=4, **HYBRID, **hybrid_layout(kind, 4))
    ids = torch.randint(1, V, (2, 26), generator=torch.Generator().manual_seed(7))
    pad = 3  # row 1: its first 3 tokens are left padding
    mask = torch.ones_like(ids)
    mask[1, :pad] = 0
    cache = OrthrosCache()
    with torch.no_grad():
        model(ids[:, :11], attention_mask=mask[:, :11], logits_to_keep=1, past_key_values=cache, use_cache=True)
        got = model(ids[:, 11:], attention_mask=mask, output_positions=[0, 4, 14], past_key_values=cache,
                    use_cache=True).logits
    assert rel(got[:1], algorithm2(model, ids[:1], [11, 15, 25])) < TOL
    assert rel(got[1:], algorithm2(model, ids[1:, pad:], [11 - pad, 15 - pad, 25 - pad])) < TOL


# ------------------------------------------------------------------ scale-offset (3.1, 4.1)
def test_scale_offset_vectors_per_query_channel_initialised_to_the_plain_projection():
    """Section 3.1: alpha, beta, alpha', beta' in R^{1 x d} (d = the query projection's width),
    learnable; Section 4.1's "w/o SO" variant has none. Their initial values (1, 0, 1, 0: both
    streams start as the shared W_Q) are the package's choice, the paper gives none. The last
    layer has only alpha', beta' (its base queries are never read: docs/design.md)."""
    from orthros import OrthrosForCausalLM

    cfg = tiny_config()
    model = OrthrosForCausalLM(cfg)
    d = cfg.num_attention_heads * cfg.head_dim
    n = cfg.num_hidden_layers
    for i, layer in enumerate(model.model.layers):
        params = layer.self_attn.scale_offset_params()
        assert set(params) == ({"alpha_out", "beta_out"} if i == n - 1 else {"alpha", "beta", "alpha_out", "beta_out"})
        for name, p in params.items():
            assert p.shape == (d,) and p.requires_grad
            assert bool((p == (1.0 if name.startswith("alpha") else 0.0)).all())
    assert not any(OrthrosForCausalLM(tiny_config(scale_offset=False)).model.layers[0].self_attn.scale_offset_params())


# ------------------------------------------------------------------ conversion (4.3)
@pytest.mark.parametrize("arch", ["Llama", "Qwen3"])
def test_converted_model_starts_at_the_source(arch):
    """Section 4.3 (conversion by replacing the attention modules): with the new parameters at
    alpha = alpha' = 1, beta = beta' = 0, a converted model computes its source's logits at every
    position t < w (the window still covers every key), for any length, and (Llama) Algorithm 2
    beyond. Qwen3's q-norm comes before the scale-offset (docs/design.md, Algorithm 1 step 2)."""
    import transformers

    from orthros.conversion import convert_from_hf

    torch.manual_seed(0)
    cfg = getattr(transformers, f"{arch}Config")(vocab_size=V, hidden_size=48, intermediate_size=96,
                                                 num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                                                 head_dim=12, max_position_embeddings=128, tie_word_embeddings=False)
    src = getattr(transformers, f"{arch}ForCausalLM")(cfg).double().eval()
    with torch.no_grad():
        for p in src.parameters():
            if p.dim() == 1:  # norms (Qwen3's q/k norms too) away from 1
                p.add_(torch.randn_like(p) * 0.3)
    model = convert_from_hf(src, window_size=8)
    for layer in model.model.layers:
        for name, p in layer.self_attn.scale_offset_params().items():
            assert bool((p == (1.0 if name.startswith("alpha") else 0.0)).all())
    ids = torch.randint(0, V, (2, 24), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        got, source = model(ids).logits, src(ids).logits
    assert rel(got[:, :8], source[:, :8]) < TOL
    assert rel(got[:, 8:], source[:, 8:]) > 1e-3  # beyond the window the base stream forgets
    if arch == "Llama":
        assert rel(got, algorithm2(model, ids, range(24))) < TOL


# ------------------------------------------------------------------ Orthros-H (4.6)
def test_orthros_h_is_one_attention_layer_to_three_gdn_layers_in_qwen3_5s_order():
    """Section 4.6: Orthros-H mixes attention and linear-attention (GDN) layers at 1:3; the
    Linear Hybrid baseline follows Qwen3.5, whose layer order Orthros-H shares (every 4th layer
    attention), with full attention in place of Orthros attention."""
    from transformers import Qwen3_5TextConfig

    qwen = Qwen3_5TextConfig(num_hidden_layers=12).layer_types
    orthros_h, hybrid = hybrid_layout("orthros-h", 12), hybrid_layout("linear-hybrid", 12)
    assert [t.replace("orthros_", "full_") for t in orthros_h["layer_types"]] == qwen
    assert hybrid["layer_types"] == qwen and hybrid["attention_mode"] == "full"
    assert orthros_h["layer_types"].count(LINEAR_LAYER_TYPE) == 3 * orthros_h["layer_types"].count("orthros_attention")


@pytest.mark.parametrize("layer_types", [
    hybrid_layout("orthros-h", 4)["layer_types"],
    [LINEAR_LAYER_TYPE, "orthros_attention", LINEAR_LAYER_TYPE],  # a GDN layer last
])
def test_orthros_h_is_algorithm_2_with_gdn_as_the_cross_attention_part(layer_types):
    """Section 4.6: in Orthros-H's GDN layers the output query bypasses the convolution and reads
    the base stream's state at its position; PT and SFT logits equal the brute force above."""
    model = _model(num_hidden_layers=len(layer_types), layer_types=layer_types, **HYBRID)
    with torch.no_grad():
        for layer in model.model.layers:
            if layer.layer_type == LINEAR_LAYER_TYPE:
                layer.linear_attn.norm.weight.add_(torch.randn(6, dtype=torch.float64) * 0.3)
    ids = torch.randint(0, V, (2, 20), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        pt, sft = model(ids).logits, model(ids, output_positions=[3, 11, 19]).logits
    assert rel(pt, algorithm2(model, ids, range(20))) < TOL
    assert rel(sft, algorithm2(model, ids, [3, 11, 19])) < TOL


# ------------------------------------------------------------------ complexity (3.3)
def test_attention_flops_follow_section_3_3():
    """Section 3.3: sliding window O(T W) plus cross-attention O(T_out T): with T_out = 1
    (prefill) the attention FLOPs grow linearly in T; with T_out = T (pre-training) they are a
    Transformer's causal attention plus the window stream."""

    from orthros.training.metrics import forward_flops

    cfg = tiny_config(window_size=128, attn_backend="reference")
    full = tiny_config(window_size=128, attention_mode="full")
    per_key = 4 * cfg.num_attention_heads * cfg.head_dim * cfg.num_hidden_layers
    for T in (4096, 8192):
        pre = forward_flops(cfg, [T], 1, out_keys=T)["attention"]
        assert pre == per_key * (128 * 129 // 2 + (T - 128) * 128 + T)  # window keys + one full row
    assert forward_flops(cfg, [8192], 1, out_keys=8192)["attention"] < 2.02 * forward_flops(cfg, [4096], 1,
                                                                                          out_keys=4096)["attention"]
    T = 4096
    pt, tr = forward_flops(cfg, [T], T)["attention"], forward_flops(full, [T], T)["attention"]
    assert pt == tr + per_key * (128 * 129 // 2 + (T - 128) * 128)

"""The GDN mixer (orthros/layers/gated_deltanet.py): the output stream reads the base stream's
state at its own position with UNCONVOLVED queries (brute force), writes nothing, and a cached
chunk-by-chunk / token-by-token run equals one pass."""

import copy
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from orthros.layers.gated_deltanet import GatedDeltaNet
from orthros.layers.step import StepInputs


def _config(**kw):
    base = dict(hidden_size=32, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
                linear_value_head_dim=6, linear_conv_kernel_dim=4, rms_norm_eps=1e-6, attn_backend="reference")
    base.update(kw)
    return SimpleNamespace(**base)


class StateCache:
    """The linear-state half of the cache protocol, as a dict."""

    def __init__(self):
        self.states = {}

    def linear_state(self, i):
        return self.states.get(i)

    def set_linear_state(self, i, conv, rec):
        self.states[i] = (conv, rec)


def _step(n_base, out_rel, output_tokens=True, cache=None):
    z = torch.zeros(1, n_base, 2)
    return StepInputs(n_base=n_base, rope_base=(z, z), rope_out=(z, z), out_rel=out_rel, output_tokens=output_tokens,
                      cache=cache)


def _brute(m, x_base, x_out, pos):
    """Base GDN outputs (before the gated norm) and the output tokens' readouts, by the plain
    recurrence over explicit states, float64."""
    m = copy.deepcopy(m).double()
    xb, xo = x_base.double(), x_out.double()
    B, T, _ = xb.shape
    Hk, K, Hv, V = m.num_k_heads, m.head_k_dim, m.num_v_heads, m.head_v_dim
    W = m.conv_kernel_size
    qkv = m.in_proj_qkv(xb)
    conv = F.silu(F.conv1d(F.pad(qkv.transpose(1, 2), (W - 1, 0)), m.conv1d.weight, groups=m.conv_dim)).transpose(1, 2)
    q, k, v = conv.split([m.key_dim, m.key_dim, m.value_dim], -1)
    nrm = lambda t, h: (t.view(B, -1, h, K) / torch.sqrt((t.view(B, -1, h, K) ** 2).sum(-1, keepdim=True) + 1e-6))
    q, k = nrm(q, Hk).repeat_interleave(Hv // Hk, 2), nrm(k, Hk).repeat_interleave(Hv // Hk, 2)
    v = v.view(B, T, Hv, V)
    qo = nrm(F.silu(m.in_proj_qkv(xo)[..., :m.key_dim]), Hk).repeat_interleave(Hv // Hk, 2)  # NO convolution
    beta = torch.sigmoid(m.in_proj_b(xb))
    g = -m.A_log.exp() * F.softplus(m.in_proj_a(xb) + m.dt_bias)
    S = torch.zeros(B, Hv, K, V, dtype=torch.float64)
    o, states = [], []
    for t in range(T):
        S = S * g[:, t].exp()[..., None, None]
        S = S + k[:, t, :, :, None] * (beta[:, t, :, None] * (v[:, t] - torch.einsum("bhk,bhkv->bhv", k[:, t], S)))[:, :, None]
        states.append(S)
        o.append(torch.einsum("bhk,bhkv->bhv", q[:, t] * K ** -0.5, S))
    states = torch.stack(states, 1)
    Sp = states[:, pos]
    o_out = torch.einsum("bjhk,bjhkv->bjhv", qo * K ** -0.5, Sp)
    return torch.stack(o, 1), o_out


def test_output_stream_is_a_readout_with_unconvolved_queries():
    torch.manual_seed(0)
    m = GatedDeltaNet(_config(), layer_idx=0)
    B, T = 2, 21
    pos = torch.tensor([0, 3, 4, 11, 20])
    x = torch.randn(B, T, 32)
    h = torch.cat([x, x[:, pos] + 0.3 * torch.randn(B, len(pos), 32)], 1)  # output tokens differ from base rows
    step = _step(T, pos.view(1, -1))
    o, z = m.attend(m.project(h, step, False), step, False)
    ob, oo = _brute(m, x, h[:, T:], pos)
    torch.testing.assert_close(o[:, :T].double(), ob, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(o[:, T:].double(), oo, rtol=1e-4, atol=1e-5)
    # the base stream does not see the output tokens: same base rows without them
    ob2, _ = m.attend(m.project(x, _step(T, pos.view(1, -1), output_tokens=False), False),
                      _step(T, pos.view(1, -1), output_tokens=False), False)
    torch.testing.assert_close(ob2, o[:, :T], rtol=1e-6, atol=1e-6)
    # the whole mixer: gated norm of each row with its own gate, out_proj
    y = m(h, step)
    assert y.shape == (B, T + len(pos), 32)
    torch.testing.assert_close(m.output((o, z), step, False), y)


def test_final_layer_keeps_output_rows_only():
    torch.manual_seed(1)
    m = GatedDeltaNet(_config(), 0)
    x = torch.randn(1, 9, 32)
    pos = torch.tensor([[2, 8]])
    h = torch.cat([x, x[:, pos[0]]], 1)
    full = m(h, _step(9, pos))
    last = m(h, _step(9, pos), final=True)
    torch.testing.assert_close(last, full[:, 9:], rtol=1e-5, atol=1e-6)
    nos = m(x, _step(9, pos, output_tokens=False))
    nos_last = m(x, _step(9, pos, output_tokens=False), final=True)
    torch.testing.assert_close(nos_last, nos[:, pos[0]], rtol=1e-5, atol=1e-6)


@torch.no_grad()
def test_cached_chunks_and_decode_pairs_equal_one_pass():
    torch.manual_seed(2)
    m = GatedDeltaNet(_config(), 3)
    B, T = 2, 30
    x = torch.randn(B, T, 32)
    pos = torch.arange(T).view(1, -1)
    ref = m(torch.cat([x, x], 1), _step(T, pos))  # PT form: an output token at every position
    cache = StateCache()
    outs = []
    for s, e in ((0, 11), (11, 20)):  # chunked prefill, output at each chunk's last row
        n = e - s
        h = torch.cat([x[:, s:e], x[:, e - 1:e]], 1)
        y = m(h, _step(n, torch.tensor([[n - 1]]), cache=cache))
        torch.testing.assert_close(y[:, :n], ref[:, s:e], rtol=1e-4, atol=1e-5)
        outs.append(y[:, n:])
    torch.testing.assert_close(outs[-1], ref[:, T + 19:T + 20], rtol=1e-4, atol=1e-5)
    for t in range(20, T):  # decode pairs: base token + its output token
        y = m(torch.cat([x[:, t:t + 1], x[:, t:t + 1]], 1), _step(1, torch.tensor([[0]]), cache=cache))
        torch.testing.assert_close(y[:, 0], ref[:, t], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(y[:, 1], ref[:, T + t], rtol=1e-4, atol=1e-5)


def test_an_hf_cache_without_gdn_states_is_named():
    """The HF path keeps GDN states in an OrthrosCache; a plain transformers cache (HF's usual
    ``past_key_values=DynamicCache()``) is refused by name (was AttributeError 'linear_state')."""
    import pytest
    from transformers import DynamicCache

    from orthros.layers.step import DenseKV

    m = GatedDeltaNet(_config(), 0)
    x = torch.randn(1, 4, 32)
    step = _step(3, torch.tensor([[2]]), cache=DenseKV(DynamicCache()))
    with pytest.raises(TypeError, match="DynamicCache.*OrthrosCache"):
        m(x, step)


def test_forward_refuses_rows_that_do_not_match_the_step():
    """Rows of ``x`` other than n_base (+ one output token per output position) were refused by
    the delta rule's check of ``output_positions``, which named the wrong argument."""
    import pytest

    m = GatedDeltaNet(_config(), 0)
    for tokens, rows in ((True, 5), (True, 8), (False, 7)):
        with pytest.raises(ValueError, match=rf"x must have {5 + 2 * tokens} rows \(n_base = 5"):
            m(torch.randn(1, rows, 32), _step(5, torch.tensor([[2, 4]]), output_tokens=tokens))


def test_an_unknown_attn_backend_is_refused_at_construction():
    """It was mapped to the GDN's ``"auto"`` without a word."""
    import pytest

    with pytest.raises(ValueError, match="config.attn_backend must be one of .*got 'fla'"):
        GatedDeltaNet(_config(attn_backend="fla"), 0)
    assert GatedDeltaNet(_config(attn_backend="sdpa"), 0).backend == "torch"


def test_forward_refuses_repeated_or_out_of_range_output_positions():
    """A repeated position gave wrong readouts without a word (the delta rule's output queries share one
    slot per token) and an unordered one ran; one out of range failed in torch's gather. Refused with the
    model's messages (orthros/models/positions.py), naming the step's field."""
    import pytest

    m = GatedDeltaNet(_config(), 0)
    for pos, match in (([1, 1, 2], "must be strictly increasing"), ([3, 1], "must be strictly increasing"),
                       ([0, 9], r"must lie in \[0, 8\), got \[0, 9\]"),
                       ([-1, 2], r"must lie in \[0, 8\), got \[-1, 2\]")):
        step = _step(8, torch.tensor([pos]))
        with pytest.raises(ValueError, match=rf"^StepInputs.out_rel {match}"):
            m(torch.randn(1, 8 + len(pos), 32), step)

"""The inference engine against the model: greedy tokens equal ``model.generate()`` and an
uncached reference recomputation; chunked prefill equals unchunked; a multi-turn
continuation equals a from-scratch run; bad input is rejected before any work."""

from __future__ import annotations

import copy
import re

import pytest
import torch

from orthros.engine import Engine, SamplingParams, filter_logits, release_engine, sample

from conftest import interrupted_at, tiny_model as _tiny_model

W = 5


pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_model(mode="orthros", seed=0, dtype=torch.float32, **over):
    return _tiny_model(seed, dtype, **{**dict(hidden_size=64, intermediate_size=96, head_dim=16, window_size=W,
                                              qk_norm=True, initializer_range=0.2, attention_mode=mode,
                                              attn_backend="reference"), **over})


# prompt lengths around the window (T < w, T = w, T > w, chunks not dividing T)
PROMPTS = [[1, 5, 7, 9, 11, 13, 2, 4, 6, 8, 10, 3], [4, 3, 2, 8, 9], [7, 7, 1], [50, 60, 70, 80, 90, 20, 30, 40]]


@torch.no_grad()
def reference_greedy(model, prompt, n):
    """Uncached recomputation: the whole sequence through the model for every new token."""
    seq = list(prompt)
    for _ in range(n):
        logits = model(input_ids=torch.tensor([seq]), use_cache=False, logits_to_keep=1).logits
        seq.append(int(logits[0, -1].argmax()))
    return seq[len(prompt):]


def hf_generate(model, prompt, n):
    out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("mode", ["orthros", "full", "window"])
def test_greedy_equals_generate_and_reference(mode):
    m = tiny_model(mode)
    n = 10
    eng = Engine(m, max_batch_size=4, max_seq_len=32, prefill_chunk=4)
    got = eng.generate(PROMPTS, n)
    for p, g in zip(PROMPTS, got):
        assert g == hf_generate(m, p, n)
        assert g == reference_greedy(m, p, n)


def test_greedy_equals_left_padded_batched_generate():
    m = tiny_model()
    prompts = PROMPTS[:3]
    n = 8
    T = max(map(len, prompts))
    ids = torch.tensor([[0] * (T - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (T - len(p)) + [1] * len(p) for p in prompts])
    hf = m.generate(ids, attention_mask=mask, max_new_tokens=n, do_sample=False, pad_token_id=0)[:, T:].tolist()
    assert Engine(m, max_batch_size=3, max_seq_len=32).generate(prompts, n) == hf


def test_prefill_logits_match_model_forward():
    m = tiny_model()
    eng = Engine(m, max_batch_size=4, max_seq_len=32, prefill_chunk=3)
    logits = eng.prefill(PROMPTS)
    for p, lg in zip(PROMPTS, logits):
        ref = m(input_ids=torch.tensor([p]), use_cache=False, logits_to_keep=1).logits[0, -1]
        torch.testing.assert_close(lg, ref, rtol=1e-5, atol=1e-5)
    assert eng.lengths() == [len(p) for p in PROMPTS]


@pytest.mark.parametrize("mode", ["orthros", "full", "window"])
def test_chunked_prefill_equals_unchunked(mode):
    m = tiny_model(mode, seed=1)
    base = Engine(m, max_batch_size=4, max_seq_len=40, prefill_chunk=None)
    ref_logits = base.prefill(PROMPTS)
    ref_tokens = base.generate(PROMPTS, 6)
    for chunk in (1, 2, W, W + 2):
        eng = Engine(m, max_batch_size=4, max_seq_len=40, prefill_chunk=chunk)
        torch.testing.assert_close(eng.prefill(PROMPTS), ref_logits, rtol=1e-5, atol=1e-5)
        assert eng.generate(PROMPTS, 6) == ref_tokens
        for i in range(m.config.num_hidden_layers):  # the caches hold the same K/V
            for r, p in enumerate(PROMPTS):
                torch.testing.assert_close(eng.cache.k[i][r, :len(p) + 5], base.cache.k[i][r, :len(p) + 5])


@pytest.mark.parametrize("mode", ["orthros", "full"])
def test_multi_turn_continuation_equals_from_scratch(mode):
    m = tiny_model(mode, seed=2)
    turn1 = [PROMPTS[0], PROMPTS[1]]
    turn2 = [[21, 22, 23], [31, 32, 33, 34, 35, 36, 37]]
    eng = Engine(m, max_batch_size=2, max_seq_len=64, prefill_chunk=4)
    gen1 = eng.generate(turn1, 7)
    assert eng.lengths() == [len(p) + 6 for p in turn1]  # the last generated token is pending
    gen2 = eng.generate(turn2, 7, continue_=True)
    fresh = Engine(m, max_batch_size=2, max_seq_len=64)
    convo = [p + g + t for p, g, t in zip(turn1, gen1, turn2)]
    assert gen2 == fresh.generate(convo, 7)
    for c, g in zip(convo, gen2):
        assert g == reference_greedy(m, c, 7)
    # a third turn still continues correctly
    turn3 = [[5], [6, 7]]
    gen3 = eng.generate(turn3, 4, continue_=True)
    convo3 = [c + g + t for c, g, t in zip(convo, gen2, turn3)]
    assert gen3 == Engine(m, max_batch_size=2, max_seq_len=64).generate(convo3, 4)


def test_a_later_request_closes_an_unfinished_stream():
    """A stream not run to its end is closed by the engine's next request, as ``close()`` would: its
    tokens so far stay in the conversation, and it can neither decode into a later conversation's
    cache nor, garbage-collected after it, set that conversation's lengths."""
    import gc

    m = tiny_model()
    eng = Engine(m, max_batch_size=1, max_seq_len=32)
    it = eng.stream([PROMPTS[1]], 6)
    seen = [next(it)[0], next(it)[0]]
    assert eng.generate([[7]], 3, continue_=True) == [reference_greedy(m, PROMPTS[1] + seen + [7], 3)]
    old = eng.stream([PROMPTS[2]], 6)
    next(old)
    new = eng.generate([[9, 9, 9]], 2)
    assert next(old, None) is None
    del old
    gc.collect()
    assert eng.lengths() == [4]
    assert eng.generate([[1]], 2, continue_=True) == [reference_greedy(m, [9, 9, 9] + new[0] + [1], 2)]


@pytest.mark.parametrize("continue_", [False, True])
def test_a_prefill_cut_short_leaves_no_conversation_to_continue(monkeypatch, continue_):
    """Was: a request whose prefill was cut short (Ctrl-C, an out-of-memory error in a long prompt)
    kept the earlier conversation's lengths over a cache its chunks had overwritten, so the next
    ``continue_=True`` silently continued a corrupted conversation. Now it is refused by name."""
    m = tiny_model()
    eng = Engine(m, max_batch_size=1, max_seq_len=64, prefill_chunk=4)
    eng.generate([PROMPTS[0][:6]], 3)
    chunk = eng._forward_chunk
    monkeypatch.setattr(eng, "_forward_chunk", interrupted_at(chunk, 2))
    with pytest.raises(KeyboardInterrupt):
        eng.generate([[9] * 9], 3, continue_=continue_)
    monkeypatch.setattr(eng, "_forward_chunk", chunk)
    assert eng.batch_size == 0
    with pytest.raises(ValueError, match="continue_=True needs an earlier generate"):
        eng.generate([[7, 8]], 2, continue_=True)
    assert eng.generate([PROMPTS[1]], 4) == [reference_greedy(m, PROMPTS[1], 4)]  # a new request runs


def test_a_decode_cut_short_keeps_an_attention_conversation(monkeypatch):
    """A generation cut short inside its decode loop keeps what it fed: K/V past a row's length is
    never read, so (unlike a GDN state, tests/engine/test_engine_hybrid.py) the conversation of the
    tokens seen so far continues correctly."""
    import orthros.engine.engine as engine_module

    m = tiny_model()
    eng = Engine(m, max_batch_size=1, max_seq_len=64)
    sample, seen = engine_module.sample, []
    monkeypatch.setattr(engine_module, "sample", interrupted_at(sample, 4))
    with pytest.raises(KeyboardInterrupt):
        eng.generate([PROMPTS[0]], 8, callback=lambda t: seen.append(t[0]))
    monkeypatch.setattr(engine_module, "sample", sample)
    assert len(seen) == 2 and eng.lengths() == [len(PROMPTS[0]) + 2]
    assert eng.generate([[21, 22]], 3, continue_=True) == [reference_greedy(m, PROMPTS[0] + seen + [21, 22], 3)]


def test_continuation_runs_only_new_tokens():
    m = tiny_model()
    eng = Engine(m, max_batch_size=1, max_seq_len=64, prefill_chunk=None)
    eng.generate([PROMPTS[0]], 3)
    seen = []
    handle = m.model.embed_tokens.register_forward_hook(lambda mod, inp, out: seen.append(inp[0].shape))
    try:
        eng.generate([[8, 9, 10]], 1, continue_=True)
    finally:
        handle.remove()
    assert seen == [torch.Size([1, 4])]  # the pending token + 3 new ones, never the old context


def test_eos_stops_rows_and_stream_yields_each_step():
    m = tiny_model()
    eng = Engine(m, max_batch_size=2, max_seq_len=32)
    free = eng.generate(PROMPTS[:2], 6)
    eos = free[0][2]
    steps = list(Engine(m, max_batch_size=2, max_seq_len=32).stream(PROMPTS[:2], 6, eos_token_id=eos))
    assert steps[0] == [free[0][0], free[1][0]]
    row0 = [s[0] for s in steps if s[0] is not None]
    assert row0 == free[0][:free[0].index(eos) + 1]
    got = Engine(m, max_batch_size=2, max_seq_len=32).generate(PROMPTS[:2], 6, eos_token_id=[eos])
    assert got[0] == row0
    if eos not in free[1]:
        assert got[1] == free[1]


def test_sampling_is_reproducible_and_respects_filters():
    m = tiny_model()
    eng = Engine(m, max_batch_size=2, max_seq_len=40)
    sp = SamplingParams(temperature=0.8, top_k=5, top_p=0.9, seed=3)
    a = eng.generate(PROMPTS[:2], 8, sp)
    b = Engine(m, max_batch_size=2, max_seq_len=40).generate(PROMPTS[:2], 8, sp)
    assert a == b
    greedy = eng.generate(PROMPTS[:2], 8)
    assert eng.generate(PROMPTS[:2], 8, SamplingParams(temperature=1.0, top_k=1, seed=0)) == greedy
    assert eng.generate(PROMPTS[:2], 8, SamplingParams(temperature=1.0, top_p=1e-6, seed=0)) == greedy


def test_filter_logits_and_sample():
    torch.manual_seed(0)
    logits = torch.randn(3, 50)
    f = filter_logits(logits, top_k=4)
    assert (torch.isfinite(f).sum(-1) == 4).all()
    assert torch.equal(f.argmax(-1), logits.argmax(-1))
    probs = torch.softmax(logits, -1)
    f = filter_logits(logits, top_p=0.5)
    kept = torch.isfinite(f)
    for r in range(3):  # the nucleus: the smallest top set whose mass reaches 0.5
        p = probs[r][kept[r]].sum()
        assert p >= 0.5 and p - probs[r][kept[r]].min() < 0.5
    g = torch.Generator().manual_seed(0)
    draws = torch.stack([sample(logits, SamplingParams(temperature=1.0, top_k=3), g) for _ in range(200)])
    top3 = torch.topk(logits, 3).indices
    assert all(bool(torch.isin(draws[:, r], top3[r]).all()) for r in range(3))
    # the exponential race draws with the softmax probabilities
    one = torch.tensor([[0.0, 1.0, 2.0]])
    d = torch.stack([sample(one, SamplingParams(temperature=1.0), g) for _ in range(4000)]).view(-1)
    freq = torch.bincount(d, minlength=3).float() / d.numel()
    assert torch.allclose(freq, torch.softmax(one[0], -1), atol=0.03)


@pytest.mark.parametrize("top_p", [1e-300, 1e-46, 1e-8])
def test_a_top_p_below_float32_keeps_the_most_likely_token(top_p):
    """Was: a ``top_p`` that rounds to 0 in float32 (1e-300, 1e-46: a valid (0, 1] value) dropped every token,
    the most likely too (``mass before >= 0`` everywhere): a NaN softmax, and every draw was token 0."""
    torch.manual_seed(0)
    logits = torch.randn(3, 50)
    f = filter_logits(logits, top_p=top_p)
    assert (torch.isfinite(f).sum(-1) == 1).all() and torch.equal(f.argmax(-1), logits.argmax(-1))
    g = torch.Generator().manual_seed(0)
    assert torch.equal(sample(logits, SamplingParams(temperature=1.0, top_p=top_p), g), logits.argmax(-1))


@pytest.mark.parametrize("t", [1e-45, 1e-30, 1e-6])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sample_tiny_temperature_is_greedy(t, dtype):
    """A temperature so small that ``logits / t`` overflows (1e-45: every logit to +-inf) still
    samples the argmax, with top-k and top-p on or off; it gave index 0 (a NaN softmax) before."""
    logits = torch.tensor([[1.0, 3.0, 2.0, -4.0], [0.5, 0.1, 0.7, 0.2], [-3.0, -1.0, -2.0, -5.0]], dtype=dtype)
    g = torch.Generator().manual_seed(0)
    for kw in ({}, dict(top_k=2), dict(top_p=0.9)):
        for _ in range(5):
            assert sample(logits, SamplingParams(temperature=t, **kw), g).tolist() == [1, 2, 1]


def test_tiny_temperature_under_cuda_s_scalar_division(monkeypatch):
    """CUDA divides a tensor by a Python number as a product with the number's float32 reciprocal, which is
    inf for a temperature of 1e-45: (x - max) * inf made the maximum NaN, and every row's pick token 0 (an H100,
    the forty-fourth session). The CPU divides, so here the division is CUDA's, emulated."""
    real_div = torch.Tensor.__truediv__

    def cuda_div(self, other):
        if isinstance(other, (int, float)):
            return self * (torch.tensor(1.0) / torch.tensor(float(other), dtype=torch.float32))
        return real_div(self, other)

    monkeypatch.setattr(torch.Tensor, "__truediv__", cuda_div)
    logits = torch.tensor([[1.0, 3.0, 2.0, -4.0], [0.5, 0.1, 0.7, 0.2], [-3.0, -1.0, -2.0, -5.0]])
    g = torch.Generator().manual_seed(0)
    for t in (1e-45, 1e-39, 1e-30):
        for kw in ({}, dict(top_k=2), dict(top_p=0.9)):
            assert sample(logits, SamplingParams(temperature=t, **kw), g).tolist() == [1, 2, 1], (t, kw)


def test_huge_temperature_samples_the_kept_tokens():
    """t = 1e46: 1 / t is 0 in float32, and -inf * 0 (a logit top-k removed, or an fp16 overflow) was NaN: every
    pick token 0. The scale is clamped to float32's smallest normal, so a huge temperature is uniform over the
    tokens the filters keep."""
    logits = torch.tensor([[float("-inf"), 1.0, 3.0, 2.0, -4.0]]).repeat(400, 1)
    g = torch.Generator().manual_seed(0)
    picks = sample(logits, SamplingParams(temperature=1e46, top_k=2), g)
    assert set(picks.tolist()) == {2, 3}
    assert set(sample(logits, SamplingParams(temperature=1e46), g).tolist()) == {1, 2, 3, 4}


@pytest.mark.parametrize("draw", [0.0, float("inf")])
def test_sample_survives_the_race_s_extreme_draws(monkeypatch, draw):
    """CUDA's ``exponential_`` can draw an exact 0 (pytorch#20179): 0 / 0 = NaN, which ``argmax`` takes.
    A draw of inf at the maximum would leave the row all zeros (index 0). The race is clamped to finite,
    positive values, so a pick is always a token the filters kept."""
    real = torch.Tensor.exponential_

    def extreme(self, *a, **kw):  # the real draws, with the extreme value at every third token
        out = real(self, *a, **kw)
        out[..., ::3] = draw
        return out

    monkeypatch.setattr(torch.Tensor, "exponential_", extreme)
    logits = torch.tensor([[1.0, 2.0, 0.0, 3.0, -4.0, 0.5], [0.5, 0.1, 0.7, 0.2, 0.9, -1.0]])
    g = torch.Generator().manual_seed(0)
    for t in (1e-45, 1e-6):  # every probability but the maximum's is exactly 0
        assert sample(logits, SamplingParams(temperature=t), g).tolist() == [3, 4]
    for _ in range(20):  # top-k 2 keeps tokens 3 and 1 in the first row
        assert sample(logits, SamplingParams(temperature=1.0, top_k=2), g).tolist()[0] in (3, 1)


@pytest.mark.parametrize("kwargs, match", [
    (dict(temperature=-1.0), "temperature"),
    (dict(temperature=float("nan")), "temperature"),
    (dict(top_k=-2), "top_k"),
    (dict(top_k=1.5), "top_k"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(seed="x"), "seed"),
    (dict(seed=2**64), "seed"),  # beyond torch.Generator.manual_seed's range
])
def test_invalid_sampling_params(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


def test_sampling_params_take_numpy_numbers():
    """Was: ``SamplingParams(temperature=np.float32(0.7))`` (a value read from an array, a sweep's grid)
    was refused as no "finite number >= 0". NumPy numbers and 0-d tensors are kept as Python ones (a 0-d
    tensor was taken for top_k / seed but refused for temperature / top_p: utils.as_float beside as_int);
    bools, complex numbers and tensors of one element but a dimension stay refused."""
    import numpy as np

    p = SamplingParams(temperature=np.float32(0.5), top_k=np.int64(3), top_p=np.float64(0.25), seed=np.uint32(7))
    assert p == SamplingParams(temperature=0.5, top_k=3, top_p=0.25, seed=7)
    assert [type(v) for v in (p.temperature, p.top_k, p.top_p, p.seed)] == [float, int, float, int]
    p = SamplingParams(temperature=torch.tensor(0.5), top_p=torch.tensor(0.25, dtype=torch.float64), top_k=np.int8(3))
    assert p == SamplingParams(temperature=0.5, top_k=3, top_p=0.25) and type(p.temperature) is float
    for bad, match in ((dict(temperature=torch.tensor([0.5])), "temperature"), (dict(top_k=np.float32(2)), "top_k"),
                       (dict(top_p=torch.tensor(True)), "top_p"), (dict(temperature=1 + 0j), "temperature"),
                       (dict(top_p=torch.tensor(0.5 + 0j)), "top_p"),
                       (dict(seed=np.bool_(True)), "seed"), (dict(temperature=np.float64("nan")), "temperature")):
        with pytest.raises(ValueError, match=match):
            SamplingParams(**bad)


def test_bad_input_is_rejected_before_any_work():
    m = tiny_model()
    eng = Engine(m, max_batch_size=2, max_seq_len=16)
    with pytest.raises(ValueError, match="max_seq_len=16"):
        eng.generate([list(range(1, 15))], 5)  # 14 + 5 - 1 > 16
    with pytest.raises(ValueError, match="max_batch_size=2"):
        eng.generate([[1], [2], [3]], 2)
    with pytest.raises(ValueError, match="empty"):
        eng.generate([[1, 2], []], 2)
    with pytest.raises(ValueError, match="vocab_size"):
        eng.generate([[1, 200]], 2)
    with pytest.raises(ValueError, match="max_new_tokens"):
        eng.generate([[1, 2]], 0)
    with pytest.raises(TypeError, match="sampling"):
        eng.generate([[1, 2]], 2, {"temperature": 1.0})
    with pytest.raises(ValueError, match="continue_"):
        eng.generate([[1, 2]], 2, continue_=True)
    assert eng.batch_size == 0 and int(eng.cache.seqlens.abs().sum()) == 0  # nothing ran
    eng.generate([[1, 2], [3]], 2)
    with pytest.raises(ValueError, match="one new turn per row"):
        eng.generate([[4]], 2, continue_=True)
    with pytest.raises(ValueError, match="max_seq_len"):
        eng.generate([[4] * 12, [5]], 3, continue_=True)
    with pytest.raises(ValueError, match="graph_batch_sizes"):
        Engine(m, max_batch_size=2, max_seq_len=16, graph_batch_sizes=[3])
    with pytest.raises(ValueError, match="attention_mode"):
        Engine(m, attention_mode="linear")
    with pytest.raises(ValueError, match="cuda_graphs"):
        Engine(m, cuda_graphs=True)
    with pytest.raises(ValueError, match="prefill_chunk"):
        Engine(m, prefill_chunk=0)


def test_bad_argument_types_are_rejected_before_any_work():
    """Wrongly typed or shaped arguments get an error naming the argument, before prefill (not a
    torch or Python internal message, and not after the work: the cache stays untouched)."""
    m = tiny_model()
    with pytest.raises(TypeError, match="model must be an OrthrosForCausalLM"):
        Engine(None)
    with pytest.raises(TypeError, match="graph_batch_sizes"):
        Engine(m, max_batch_size=2, max_seq_len=16, graph_batch_sizes=2)
    for bad in ("no", "False", 2):  # was: truthy, so CUDA graphs on (off CUDA: "cuda_graphs=True needs ...")
        with pytest.raises(ValueError, match=f"cuda_graphs must be None, True or False, got {bad!r}"):
            Engine(m, max_batch_size=2, max_seq_len=16, cuda_graphs=bad)
    # an iterator is read once: its sizes are kept, not consumed by the check
    assert Engine(m, max_batch_size=2, max_seq_len=16, graph_batch_sizes=iter([2, 1])).graph_batch_sizes == (1, 2)
    eng = Engine(m, max_batch_size=2, max_seq_len=16)
    for bad in ([1, [2, 3]], [[1, 2], 3], [torch.tensor([[5]])]):  # ([torch.tensor(5)] is one row of one id)
        with pytest.raises(TypeError, match="prompts"):
            eng.generate(bad, 2)
    with pytest.raises(ValueError, match="prompts"):
        eng.generate(torch.ones(1, 3, dtype=torch.complex64), 2)
    for bad in ("3", 3.0, True, [None], [2, 1.5]):
        with pytest.raises(TypeError, match="eos_token_id"):
            eng.generate([[1, 2]], 2, eos_token_id=bad)
    with pytest.raises(ValueError, match="eos_token_id"):
        eng.generate([[1, 2]], 2, eos_token_id=-1)
    with pytest.raises(TypeError, match="continue_"):
        eng.generate([[1, 2]], 2, continue_="no")
    with pytest.raises(TypeError, match="continue_"):
        eng.prefill([[1, 2]], continue_=1)
    with pytest.raises(TypeError, match="callback"):
        eng.generate([[1, 2]], 2, callback=5)
    assert eng.batch_size == 0 and int(eng.cache.seqlens.abs().sum()) == 0  # nothing ran


def test_eos_token_id_as_a_tensor_stops_rows():
    """``eos_token_id`` as a tensor (what a generation config may hold) stops a row like the same
    ids as ints (a set of tensors matched no generated int)."""
    m = tiny_model()
    free = Engine(m, max_batch_size=1, max_seq_len=32).generate(PROMPTS[:1], 6)
    eos = free[0][2]
    want = free[0][:free[0].index(eos) + 1]
    for e in (torch.tensor([eos]), torch.tensor(eos)):
        assert Engine(m, max_batch_size=1, max_seq_len=32).generate(PROMPTS[:1], 6, eos_token_id=e) == [want]


def test_a_model_moved_to_another_dtype_is_refused_by_its_engine():
    """The static cache and the RoPE table are the engine's, built in the model's dtype: a request
    after ``model.to(dtype)`` is refused before any work, naming the change; a ``.to()`` back to the
    engine's dtype serves again."""
    m = tiny_model()
    eng = Engine(m, max_batch_size=1, max_seq_len=16)
    want = eng.generate([[3, 4, 5]], 3)
    m.to(torch.bfloat16)
    with pytest.raises(ValueError, match=r"now torch.bfloat16 on cpu.*built for it in torch.float32 on cpu"):
        eng.generate([[3, 4, 5]], 3)
    m.to(torch.float32)
    assert eng.generate([[3, 4, 5]], 3) == want


def test_a_window_set_in_the_config_after_the_model_was_built_is_refused():
    """``model.config.window_size = w`` after the model was built: its layers keep the old window (the
    model's forward refuses it), but the engine's chunked prefill took the new one for the keys a
    chunk's window queries see, and gave other tokens without a word. Refused now, naming the field,
    when the engine is built and at a request after the change; set back, the engine serves again."""
    m = tiny_model()
    prompt = [[1, 5, 7, 9, 11, 13, 2, 4, 6, 8, 10, 3]]
    eng = Engine(m, max_batch_size=1, max_seq_len=32, prefill_chunk=4)
    want = eng.generate(prompt, 4)
    m.config.window_size = 2
    with pytest.raises(ValueError, match=r"config.window_size was set to 2 after the model was built with 5"):
        Engine(m, max_batch_size=1, max_seq_len=32, prefill_chunk=4)
    with pytest.raises(ValueError, match=r"config.window_size was set to 2"):
        eng.generate(prompt, 4)
    m.config.window_size = W
    assert eng.generate(prompt, 4) == want == Engine(m, max_seq_len=32, prefill_chunk=4).generate(prompt, 4)


def test_step_rejects_bad_tokens():
    m = tiny_model()
    eng = Engine(m, max_batch_size=2, max_seq_len=32)
    with pytest.raises(ValueError, match="prefill"):
        eng.step(torch.zeros(0, dtype=torch.long))  # no conversation yet
    eng.set_lengths([10])
    with pytest.raises(TypeError, match="integer token ids"):
        eng.step([1.7])  # was truncated to token 1
    with pytest.raises(ValueError, match="vocab_size"):
        eng.step([500])
    with pytest.raises(ValueError, match="vocab_size"):
        eng.step(torch.tensor([-1]))
    assert eng.lengths() == [10] and eng.cache.seqlens[0] == 10


def test_token_lists_refuse_bools_and_take_numpy_integers():
    """Was: ``step([1, True])`` fed token 1 for ``True`` (``torch.as_tensor`` casts a mixed list to int64),
    ``step("ab")`` / ``step(None)`` failed inside torch, and NumPy integers in a prompt list were refused as
    no "list of token ids". A bool or float in a token list is a ``TypeError`` naming the argument and the
    element, before any work; NumPy integers are token ids like Python ints."""
    import numpy as np

    m = tiny_model()
    eng = Engine(m, max_batch_size=2, max_seq_len=32)
    eng.set_lengths([10, 10])
    for bad, says in (([1, True], "tokens[1] = True"), ((True, 2), "tokens[0] = True"),
                      ([1, 2.0], "tokens[1] = 2.0"), ([np.int64(1), np.float32(2)], "tokens[1] = "),
                      ([[1], [2]], "tokens[0] = [1]")):
        with pytest.raises(TypeError, match=re.escape(f"step() tokens must hold integer token ids, got {says}")):
            eng.step(bad)
    for bad in ("ab", None, object()):
        with pytest.raises(TypeError, match="step\\(\\) tokens must be a tensor or a list of integer token ids"):
            eng.step(bad)
    assert eng.lengths() == [10, 10] and eng.cache.seqlens[:2].tolist() == [10, 10]  # nothing ran
    want = Engine(m, max_batch_size=2, max_seq_len=32)
    want.set_lengths([10, 10])
    assert torch.equal(eng.step([np.int64(1), np.int32(2)]), want.step([1, 2]))
    for bad, says in (([[1, True]], "prompts[0] must hold integer token ids, got prompts[0][1] = True"),
                      ([[1, 2], [3, False]], "prompts[1] must hold integer token ids, got prompts[1][1] = False"),
                      ([torch.tensor([True, False])], "prompts[0][0] = True")):
        with pytest.raises(TypeError, match=re.escape(says)):
            eng.generate(bad, 2)
    assert eng.generate([np.int64(3), np.int64(4)], 3) == Engine(m, max_seq_len=32).generate([3, 4], 3)
    assert eng.generate([[np.int16(3), 4]], 3, eos_token_id=np.int64(5)) == \
        Engine(m, max_seq_len=32).generate([[3, 4]], 3, eos_token_id=5)


def test_integer_arguments_take_numpy_integers():
    """Was: ``generate(..., max_new_tokens=np.int64(5))``, ``Engine(max_batch_size=np.int32(2))``,
    ``set_lengths`` of a NumPy array and NumPy ``graph_batch_sizes`` were refused as no integers (a
    value read from an array or a sweep's grid). They are taken as the Python ints they equal; a
    float, a bool or a string is still refused, naming the argument, before any work."""
    import numpy as np

    m = tiny_model()
    want = Engine(m, max_batch_size=2, max_seq_len=32, prefill_chunk=4).generate([[3, 4], [5, 6]], 5)
    eng = Engine(m, max_batch_size=np.int32(2), max_seq_len=np.int64(32), prefill_chunk=np.int64(4),
                 graph_batch_sizes=[np.int64(1), np.int64(2)])
    assert (eng.max_batch_size, eng.max_seq_len, eng.prefill_chunk, eng.graph_batch_sizes) == (2, 32, 4, (1, 2))
    assert all(type(v) is int for v in (eng.max_batch_size, eng.max_seq_len, eng.prefill_chunk))
    assert eng.generate([[3, 4], [5, 6]], np.int64(5)) == want
    assert [len(t) for t in eng.stream([[3, 4]], np.uint16(3))] == [1, 1, 1]
    eng.set_lengths(np.array([10, 12]))
    assert eng.lengths() == [10, 12] and all(type(n) is int for n in eng.lengths())
    eng.reset()
    for bad in (5.0, np.float32(5), True, np.True_, "5", torch.tensor(True)):
        with pytest.raises(ValueError, match=re.escape(f"max_new_tokens must be an integer >= 1, got {bad!r}")):
            eng.generate([[3, 4]], bad)
    with pytest.raises(ValueError, match=re.escape("max_batch_size must be an integer >= 1, got 2.0")):
        Engine(m, max_batch_size=2.0)
    with pytest.raises(ValueError, match="graph_batch_sizes must hold integers"):
        Engine(m, max_batch_size=2, max_seq_len=16, graph_batch_sizes=[np.float64(1)])
    assert eng.batch_size == 0 and int(eng.cache.seqlens.abs().sum()) == 0  # nothing ran


def test_integer_arguments_take_0d_tensors_alike_and_refuse_bools_and_floats():
    """Was: ``max_new_tokens=torch.tensor(3)`` was taken (``operator.index``) while ``set_lengths([torch.tensor(3)])``,
    a 0-d tensor in a prompt, in ``eos_token_id``'s list or in ``graph_batch_sizes``, and ``top_k`` / ``seed`` of
    ``SamplingParams`` were refused (``numbers.Integral``): one answer (``utils.as_int``) everywhere now. A 0-d
    integer tensor or a NumPy integer is an int; a bool (of any kind), a float or a one-element 1-D tensor is none."""
    import numpy as np

    m = tiny_model()
    want = Engine(m, max_batch_size=2, max_seq_len=32).generate([[3, 4]], 3, eos_token_id=[9])
    eng = Engine(m, max_batch_size=2, max_seq_len=32, graph_batch_sizes=[torch.tensor(1), np.int64(2)])
    assert eng.graph_batch_sizes == (1, 2)
    assert eng.generate([[torch.tensor(3), np.int64(4)]], torch.tensor(3), eos_token_id=[torch.tensor(9)]) == want
    # one flat row of 0-d tensors / arrays: each element was taken for a row and refused
    assert eng.generate([torch.tensor(3), np.array(4)], 3, eos_token_id=[9]) == want
    eng.set_lengths([torch.tensor(10), np.int32(12)])
    assert eng.lengths() == [10, 12] and all(type(n) is int for n in eng.lengths())
    p = SamplingParams(temperature=1.0, top_k=torch.tensor(3), seed=torch.tensor(7))
    assert (p.top_k, p.seed) == (3, 7) and type(p.top_k) is int and type(p.seed) is int
    eng.reset()
    for bad in (True, np.True_, torch.tensor(True), 10.0, torch.tensor(10.0), torch.tensor([10])):
        with pytest.raises(ValueError, match="set_lengths needs 1..2 integer lengths"):
            eng.set_lengths([bad])
        with pytest.raises(TypeError, match=r"prompts\[0\] must hold integer token ids, got prompts\[0\]\[1\]"):
            eng.generate([[3, bad]], 2)
        with pytest.raises(ValueError, match="top_k must be an integer >= 0"):
            SamplingParams(temperature=1.0, top_k=bad)
        with pytest.raises(ValueError, match="seed must be an integer"):
            SamplingParams(temperature=1.0, seed=bad)
        with pytest.raises(ValueError, match="graph_batch_sizes must hold integers"):
            Engine(m, max_batch_size=2, max_seq_len=16, graph_batch_sizes=[bad])
    with pytest.raises(ValueError, match=re.escape("max_new_tokens must be an integer >= 1, got tensor([3])")):
        eng.generate([[3, 4]], torch.tensor([3]))
    assert eng.batch_size == 0 and int(eng.cache.seqlens.abs().sum()) == 0  # nothing ran


def test_an_empty_prompt_is_named_as_the_caller_gave_it():
    """An empty prompt named ``prompts`` as the caller indexes it and said what is allowed: a flat empty
    prompt (``[]``, ``torch.tensor([])``) was "prompts[0] is empty" or "must hold at least one row"."""
    import numpy as np

    eng = Engine(tiny_model(), max_batch_size=2, max_seq_len=32)
    allowed = "give one list of token ids (a prompt) or a list of rows, each of at least one token id"
    for prompts, named in (([], "prompts is empty"), (torch.zeros(0, dtype=torch.long), "prompts is empty"),
                           (np.zeros(0, dtype=np.int64), "prompts is empty"),
                           (torch.zeros(0, 3, dtype=torch.long), "prompts has no row (shape (0, 3))"),
                           ([[1], []], "prompts[1] is empty"), (torch.zeros(2, 0, dtype=torch.long), "prompts[0] is empty"),
                           ([np.zeros(0, dtype=np.int64)], "prompts[0] is empty")):
        with pytest.raises(ValueError, match=re.escape(f"{named}: {allowed}")):
            eng.generate(prompts, 2)
    assert eng.batch_size == 0


def test_prompts_take_numpy_arrays_and_name_a_float_in_one_row():
    """Was: a NumPy array (a tokenizer's ``return_tensors="np"``) or a list of 1-D arrays refused as
    'got ndarray' though ``step()`` takes one, and ``[1, 2.5]`` said 'got prompts[0] = 1' (the row was read
    as a list of rows); a bool or float in one row of ids is named as in a list of rows."""
    import numpy as np

    m = tiny_model()
    want = Engine(m, max_batch_size=2, max_seq_len=32).generate([[3, 4], [5, 6]], 3)
    eng = Engine(m, max_batch_size=2, max_seq_len=32)
    assert eng.generate(np.array([[3, 4], [5, 6]]), 3) == want
    assert eng.generate([np.array([3, 4]), np.array([5, 6], dtype=np.int32)], 3) == want
    assert eng.generate(np.array([3, 4]), 3) == want[:1]
    for bad, err, says in (([1, 2.5], TypeError, "prompts must hold integer token ids, got prompts[1] = 2.5"),
                           ((True, 2), TypeError, "prompts must hold integer token ids, got prompts[0] = True"),
                           ([[1, 2], 3], TypeError, "got prompts[1] = 3"),
                           ([np.array([1.0, 2.0])], TypeError, "prompts[0] must hold integer token ids"),
                           (np.array([[1.0, 2.0]]), ValueError, "must be an integer [B, T] tensor"),
                           (np.array([["a", "b"]]), TypeError, "prompts as an array must be an integer [B, T] array")):
        with pytest.raises(err, match=re.escape(says)):
            eng.generate(bad, 2)


def test_prompts_in_unsigned_dtypes_and_ids_outside_the_vocabulary():
    """Was: a uint16 / uint32 array of prompt ids (a tokenized dataset's memmap, nanoGPT-style) failed
    inside torch ('"min_all" not implemented for \'UInt16\'') in generate() and step(); and an id
    outside the vocabulary was refused without saying which. They are taken now, and an id outside
    [0, vocab_size) is a ValueError naming where it is and its value, before any work."""
    import numpy as np

    m = tiny_model()
    eng = Engine(m, max_batch_size=2, max_seq_len=32)
    want = Engine(m, max_batch_size=2, max_seq_len=32).generate([[3, 4], [5, 6]], 3)
    for dt in (np.uint16, np.uint32, np.uint64):
        assert eng.generate(np.array([[3, 4], [5, 6]], dtype=dt), 3) == want, dt
    assert eng.generate(torch.tensor([[3, 4], [5, 6]], dtype=torch.uint32), 3) == want
    V = m.config.vocab_size
    for bad, says in (([[3, 4], [5, V]], f"prompts[1] has token ids outside the vocabulary [0, vocab_size={V}): "
                                         f"prompts[1][1] = {V}"),
                      ([3, -1, 4], "prompts has token ids outside the vocabulary [0, vocab_size=97): prompts[1] = -1"),
                      (np.array([[3, 4], [V + 3, 6]], dtype=np.uint16), f"prompts[1, 0] = {V + 3}"),
                      (torch.tensor([[3, -4]]), "prompts[0, 1] = -4"),
                      # one row as a 1-D tensor / array: indexed as the caller holds it (was prompts[0, 1])
                      (torch.tensor([3, V, 4]), f"vocab_size={V}): prompts[1] = {V}"),
                      (np.array([3, V], dtype=np.uint16), f"vocab_size={V}): prompts[1] = {V}")):
        eng.reset()
        with pytest.raises(ValueError, match=re.escape(says)):
            eng.generate(bad, 2)
        assert eng.batch_size == 0 and int(eng.cache.seqlens.abs().sum()) == 0  # nothing ran
    eng, want = Engine(m, max_batch_size=2, max_seq_len=32), Engine(m, max_batch_size=2, max_seq_len=32)
    eng.set_lengths([10, 10])
    want.set_lengths([10, 10])
    assert torch.equal(eng.step(np.array([3, 4], dtype=np.uint16)), want.step([3, 4]))
    with pytest.raises(ValueError, match=re.escape(f"step() tokens must be token ids in [0, vocab_size={V}), got ids "
                                                   f"from 3 to {V}")):
        eng.step(np.array([3, V], dtype=np.uint32))


def test_uint64_ids_beyond_int64_are_named_by_their_own_value():
    """Was: a uint64 prompt id >= 2**63 (a corrupt token file) was refused, but named by its int64
    wrap, a negative number (prompts[0, 1] = -9223372036854775803); step() said "ids from
    -9223372036854775807". Both name the id as given now."""
    import numpy as np

    eng = Engine(tiny_model(), max_batch_size=2, max_seq_len=32)
    big = 2**63 + 5
    for bad, says in ((np.array([[3, big]], dtype=np.uint64), f"prompts[0, 1] = {big}"),
                      (np.array([2**64 - 1, 3], dtype=np.uint64), f"prompts[0] = {2**64 - 1}"),  # one row, 1-D
                      (torch.from_numpy(np.array([[3, 4], [5, big]], dtype=np.uint64)), f"prompts[1, 1] = {big}")):
        with pytest.raises(ValueError, match=re.escape(says)):
            eng.generate(bad, 2)
    eng.set_lengths([10, 10])
    for toks, lo, hi in (([big, 3], 3, big), ([big, 2**64 - 1], big, 2**64 - 1)):
        with pytest.raises(ValueError, match=re.escape(f"got ids from {lo} to {hi}")):
            eng.step(np.array(toks, dtype=np.uint64))


def test_set_lengths_and_step_api():
    m = tiny_model()
    eng = Engine(m, max_batch_size=2, max_seq_len=32)
    eng.set_lengths([10, 20])
    assert eng.step([1, 2]).shape == (2, 97) and eng.cache.seqlens[:2].tolist() == [11, 21]
    for bad in (10, None, "10", [0], [32], [10, 10, 10]):  # was: 10 and None a TypeError "'int' object is not iterable"
        with pytest.raises(ValueError, match=re.escape(f"set_lengths needs 1..2 integer lengths in [1, 32), got {bad!r}")):
            eng.set_lengths(bad)
    assert eng.lengths() == [11, 21]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_rope_rows_come_from_the_table(dtype):
    """A decode step's first piece gathers its RoPE rows from the table the engine builds once:
    the values the step computed before (``_rope`` at each row's position, cast as the fused
    layers' ``q``/``k``), for every position of the cache; and the pair's embeddings."""
    from orthros.engine.engine import _decode_inputs

    m = tiny_model(dtype=dtype)
    eng = Engine(m, max_batch_size=2, max_seq_len=48)
    pos = torch.tensor([[0], [47]])
    ids = torch.tensor([[3], [5]])
    h, rope = _decode_inputs(m, ids, *eng._rope_table, pos, eng._last_row, True)
    emb = m.model.embed_tokens(ids)
    assert torch.equal(h, torch.cat([emb, emb], 1))  # the pair: [base token, output token]
    for got, want in zip(rope, eng._rope(pos)):
        assert got.shape == want.shape == (2, 1, m.config.head_dim) and got.dtype == want.dtype == dtype
        torch.testing.assert_close(got, want, atol=0, rtol=0)
    cos, sin = eng._rope_table
    assert cos.shape == sin.shape == (48, m.config.head_dim)


def test_generation_builds_no_autograd_graph():
    """The streaming generator runs its prefill under no_grad: nothing in the cache may keep
    an autograd graph (and with it every activation) alive."""
    m = tiny_model()
    eng = Engine(m, max_batch_size=2, max_seq_len=32)
    eng.generate(PROMPTS[:2], 3)
    assert not any(t.requires_grad for t in eng.cache.k + eng.cache.v)
    eng.generate([[1], [2]], 2, continue_=True)
    assert not any(t.requires_grad for t in eng.cache.k + eng.cache.v)


def test_decode_spans_grow_with_the_context(monkeypatch):
    """Decode steps read only a power-of-two span of the cache that covers the longest row;
    crossing span boundaries mid-generation changes nothing."""
    import orthros.engine.engine as engine_mod

    monkeypatch.setattr(engine_mod, "MIN_SPAN", 2)
    m = tiny_model()
    eng = Engine(m, max_batch_size=4, max_seq_len=40, prefill_chunk=4)
    assert [eng._span(n) for n in (1, 2, 3, 9, 17, 33, 40)] == [2, 2, 4, 16, 32, 40, 40]
    got = eng.generate(PROMPTS, 10)
    for p, g in zip(PROMPTS, got):
        assert g == reference_greedy(m, p, 10)
    turn2 = [[3, 4]] * 4
    cont = eng.generate(turn2, 6, continue_=True)
    fresh = Engine(m, max_batch_size=4, max_seq_len=40).generate([p + g + t for p, g, t in zip(PROMPTS, got, turn2)], 6)
    assert cont == fresh


def test_compiled_engine_equals_eager():
    """``compile=True`` fuses the token-wise layer parts: same greedy tokens and (to rounding)
    the same logits as the eager engine, also for a continuation and a second engine (which
    reuses the compiled graphs)."""
    m = tiny_model("orthros")
    eager = Engine(m, max_batch_size=4, max_seq_len=40, prefill_chunk=4)
    comp = Engine(m, max_batch_size=4, max_seq_len=40, prefill_chunk=4, compile=True)
    assert comp.generate(PROMPTS, 6) == eager.generate(PROMPTS, 6)
    turn = [[3, 4], [5], [6, 7, 8], [9]]
    assert comp.generate(turn, 4, continue_=True) == eager.generate(turn, 4, continue_=True)
    comp2 = Engine(m, max_batch_size=2, max_seq_len=40, prefill_chunk=None, compile=True)
    ref = Engine(m, max_batch_size=2, max_seq_len=40, prefill_chunk=None)
    torch.testing.assert_close(comp2.prefill(PROMPTS[:2]), ref.prefill(PROMPTS[:2]), atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="compile"):
        Engine(m, compile="yes")


def _left_padded(prompts, pad=0):
    T = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (T - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (T - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


@pytest.mark.parametrize("mode", ["orthros", "full"])
def test_generate_through_engine_equals_transformers(mode):
    """``model.generate(use_engine=True)`` returns transformers' output format and tokens: the
    padded prompt, then the new tokens, rows that hit EOS padded with pad_token_id."""
    m = tiny_model(mode)
    ids, mask = _left_padded(PROMPTS)
    hf = m.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False, use_engine=False)
    eos = int(hf[1, ids.shape[1] + 2])  # a token row 1 produces early: rows stop at different steps
    kw = dict(attention_mask=mask, max_new_tokens=8, do_sample=False, eos_token_id=eos, pad_token_id=0)
    want = m.generate(ids, use_engine=False, **kw)
    got = m.generate(ids, use_engine=True, **kw)
    assert got.shape == want.shape and torch.equal(got, want)
    assert torch.equal(m.generate(ids, **kw), want)  # auto on CPU: transformers (no engine kept)
    # a second request reuses the engine kept on the model
    eng = m._orthros_engine
    m.generate(ids[:2], attention_mask=mask[:2], max_new_tokens=4, use_engine=True)
    assert m._orthros_engine is eng


def test_generate_through_engine_takes_a_0d_tensor_or_numpy_eos_token_id_as_transformers():
    """Was: ``model.generate(..., eos_token_id=torch.tensor(58), use_engine=True)`` (or ``np.int64(58)``), which
    transformers' own loop takes, was a bare "TypeError: 'int' object is not iterable"."""
    import numpy as np

    m = tiny_model()
    ids, mask = _left_padded(PROMPTS[:2])
    hf = m.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False, use_engine=False)
    eos = int(hf[1, ids.shape[1] + 1])
    for e in (torch.tensor(eos), np.int64(eos), torch.tensor([eos])):
        kw = dict(attention_mask=mask, max_new_tokens=6, eos_token_id=e, pad_token_id=0)
        assert torch.equal(m.generate(ids, use_engine=True, **kw), m.generate(ids, use_engine=False, **kw))


def test_generate_through_engine_infers_the_mask_from_pad_token_id_as_transformers():
    """Without an ``attention_mask``, transformers masks the ``pad_token_id`` tokens of the input
    (when the pad id is no EOS id); the engine took the padding as prompt tokens (other tokens).
    Inner padding so inferred goes to transformers (and ``use_engine=True`` says why)."""
    m = tiny_model()
    ids, _ = _left_padded(PROMPTS[:3], pad=96)
    for kw in (dict(pad_token_id=96), dict(pad_token_id=96, eos_token_id=3)):
        want = m.generate(ids, max_new_tokens=6, use_engine=False, **kw)
        assert torch.equal(m.generate(ids, max_new_tokens=6, use_engine=True, **kw), want)
    # the pad id is an EOS id: transformers infers nothing, nor does the engine
    kw = dict(pad_token_id=96, eos_token_id=[3, 96])
    assert torch.equal(m.generate(ids, max_new_tokens=6, use_engine=True, **kw),
                       m.generate(ids, max_new_tokens=6, use_engine=False, **kw))
    with pytest.raises(ValueError, match="right or inner padding"):
        m.generate(torch.tensor([[5, 96, 6]]), max_new_tokens=2, pad_token_id=96, use_engine=True)


def test_generate_through_engine_takes_the_settings_transformers_takes(monkeypatch):
    """As transformers: a ``generation_config`` argument's unset fields come from the model's
    generation config (was: lost, e.g. its eos_token_id: rows ran past it), then transformers'
    defaults (was: sampling without top_k ran unfiltered where transformers keeps the top 50), and
    with no length given, 20 new tokens within max_position_embeddings (was: refused)."""
    from transformers import GenerationConfig

    m = tiny_model(max_position_embeddings=24)
    ids = torch.tensor([PROMPTS[0]])
    first = m.generate(ids, max_new_tokens=8, use_engine=False)[0, ids.shape[1]:].tolist()
    m.generation_config.eos_token_id = first[2]
    want = m.generate(ids, generation_config=GenerationConfig(max_new_tokens=8), use_engine=False)
    got = m.generate(ids, generation_config=GenerationConfig(max_new_tokens=8), use_engine=True)
    assert want.shape[1] == ids.shape[1] + 3 and torch.equal(got, want)
    m.generation_config.eos_token_id = None
    assert torch.equal(m.generate(ids, use_engine=True), m.generate(ids, use_engine=False))  # 12 new: position 23
    seen = []
    real = Engine.generate
    monkeypatch.setattr(Engine, "generate", lambda self, p, n, s=None, **kw: seen.append(s) or real(self, p, n, s, **kw))
    m.generate(ids, do_sample=True, max_new_tokens=2, use_engine=True)
    m.generation_config.top_k = 7
    m.generate(ids, generation_config=GenerationConfig(do_sample=True, max_new_tokens=2),
               use_engine=True)
    assert [s.top_k for s in seen] == [50, 7]


def test_generate_through_engine_sampling_and_unsupported():
    m = tiny_model("orthros")
    ids, mask = _left_padded(PROMPTS[:2])
    torch.manual_seed(0)
    out = m.generate(ids, attention_mask=mask, max_new_tokens=5, do_sample=True, top_k=5, top_p=0.9,
                     temperature=0.7, use_engine=True)
    assert out.shape == (2, ids.shape[1] + 5) and torch.equal(out[:, :ids.shape[1]], ids)
    for bad, what in ((dict(num_beams=2), "num_beams"), (dict(repetition_penalty=1.3), "repetition_penalty"),
                      (dict(output_scores=True, return_dict_in_generate=True), "output_scores")):
        with pytest.raises(ValueError, match=what):
            m.generate(ids, attention_mask=mask, max_new_tokens=3, use_engine=True, **bad)
    right = torch.tensor([[1, 1, 0]])
    with pytest.raises(ValueError, match="right or inner padding"):
        m.generate(torch.tensor([[5, 6, 0]]), attention_mask=right, max_new_tokens=2, use_engine=True)
    with pytest.raises(ValueError, match="use_engine"):
        m.generate(ids, max_new_tokens=2, use_engine="yes")
    # beam search still works through transformers under the default (auto), with the engine (one row, kept
    # on the model: it fused the projections) left in place, as on a model that never had an engine
    release_engine(m)
    fresh = copy.deepcopy(m)
    m.generate(ids[:1], attention_mask=mask[:1], max_new_tokens=3, use_engine=True)
    assert m._orthros_engine.max_batch_size == 1
    for kw in (dict(num_beams=2), dict(num_beams=3, num_return_sequences=2)):
        want = fresh.generate(ids, attention_mask=mask, max_new_tokens=3, use_engine=False, **kw)
        assert torch.equal(m.generate(ids, attention_mask=mask, max_new_tokens=3, **kw), want), kw
    # input_ids of bools are no token ids (was: the engine's "prompts[0] must hold integer token ids")
    with pytest.raises(ValueError, match="inputs must be a non-empty \\[B, T\\] integer tensor"):
        m.generate(torch.ones(1, 3, dtype=torch.bool), max_new_tokens=2, use_engine=True)


def test_generate_through_engine_refuses_top_h():
    """transformers' Top-H sampling (``top_h``, a logits warper of newer versions, which keeps at most
    100 tokens even at 1.0) is no filter of the engine's. Was: ``use_engine=True`` sampled without it
    (not transformers' distribution, without a word); it is refused now, and ``None`` leaves it to
    transformers."""
    from transformers import GenerationConfig

    if not hasattr(GenerationConfig(), "top_h"):
        pytest.skip("this transformers has no top_h")
    m = tiny_model()
    ids = torch.tensor([[1, 2, 3]])
    for top_h in (0.3, 1.0):
        with pytest.raises(ValueError, match="top_h"):
            m.generate(ids, max_new_tokens=2, do_sample=True, top_h=top_h, use_engine=True)


def test_generate_through_engine_serves_min_p_0():
    """``min_p=0.0`` (min-p switched off, as vLLM's default and many recommended settings write it) keeps
    every token in transformers. Was: ``use_engine=True`` refused it ("cannot serve this request:
    min_p=0.0") and ``None`` sent it to transformers' slower loop; a min-p above 0 is still refused."""
    m = tiny_model()
    ids = torch.tensor([[1, 2, 3]])
    outs = []
    for kw in (dict(), dict(min_p=0.0)):
        torch.manual_seed(0)
        outs.append(m.generate(ids, max_new_tokens=4, do_sample=True, use_engine=True, **kw))
    assert torch.equal(*outs)
    with pytest.raises(ValueError, match="min_p=0.1"):
        m.generate(ids, max_new_tokens=2, do_sample=True, min_p=0.1, use_engine=True)


def test_generate_through_engine_names_input_ids_for_an_id_outside_the_vocabulary():
    """Was: ``model.generate(input_ids, use_engine=True)`` with an id >= vocab_size (or < 0) raised
    the engine's "prompts[0] has token ids outside the vocabulary ...: prompts[0][2] = 97", the
    engine's argument and, under left padding, a place in the unpadded row. It names the caller's
    ``input_ids`` and the place in it now, before the engine is built; the engine's own message is
    unchanged for its own callers."""
    m = tiny_model()
    V = m.config.vocab_size
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    for ids, says in ((torch.tensor([[3, 4, 5, V], [5, 6, 7, 8]]), f"input_ids[0, 3] = {V}"),
                      (torch.tensor([[0, 3, V + 2, 4], [5, 6, 7, 8]]), f"input_ids[0, 2] = {V + 2}"),
                      (torch.tensor([[0, 3, 4, 5], [5, -1, 7, 8]]), "input_ids[1, 1] = -1")):
        with pytest.raises(ValueError, match=re.escape(f"input_ids has token ids outside the vocabulary "
                                                       f"[0, vocab_size={V}): {says}")):
            m.generate(ids, attention_mask=mask, max_new_tokens=2, use_engine=True)
        assert getattr(m, "_orthros_engine", None) is None  # refused before the engine was built
    # a masked (padding) position is no prompt token: the engine never reads it
    ok = torch.tensor([[V + 9, 3, 4, 5]])
    out = m.generate(ok, attention_mask=torch.tensor([[0, 1, 1, 1]]), max_new_tokens=2, use_engine=True)
    assert out.shape == (1, 6) and torch.equal(out[:, :4], ok)
    with pytest.raises(ValueError, match=re.escape(f"prompts[0][2] = {V}")):  # the engine's, to its own callers
        Engine(m, max_batch_size=1, max_seq_len=16).generate([[3, 4, V]], 2)


def test_generate_through_engine_leaves_the_model_s_mode():
    """``model.generate()`` leaves a model in training mode as it was, as transformers' does. Was:
    building the engine put it in eval mode, which turns gradient checkpointing off for the
    training that follows."""
    m = tiny_model().train()
    m.generate(torch.tensor([PROMPTS[0]]), max_new_tokens=2, use_engine=True)
    assert m.training and all(mod.training for mod in m.modules())
    m.eval().generate(torch.tensor([PROMPTS[0]]), max_new_tokens=2, use_engine=True)
    assert not m.training


def test_eos_token_id_outside_the_vocabulary_is_refused_before_any_work():
    """An EOS id the model can never sample (>= vocab_size) would never stop a row: it is refused,
    naming the argument and the vocabulary size, before prefill."""
    m = tiny_model()
    eng = Engine(m, max_batch_size=1, max_seq_len=32)
    V = m.config.vocab_size
    for bad in (V, [2, V + 5], torch.tensor([V])):
        with pytest.raises(ValueError, match=rf"eos_token_id.*\[0, vocab_size={V}\)"):
            eng.generate(PROMPTS[:1], 3, eos_token_id=bad)
    assert eng.batch_size == 0 and int(eng.cache.seqlens.abs().sum()) == 0  # nothing ran
    assert eng.generate(PROMPTS[:1], 2, eos_token_id=V - 1)  # the last id is fine


def test_generate_through_engine_with_eos_ids_the_model_cannot_sample():
    """An EOS id outside the vocabulary (a generation config written for a larger tokenizer):
    transformers' ``generate`` runs, such an id never stopping a row. Was: ``generate()`` through
    the engine raised the engine's ValueError (under ``use_engine=None`` on CUDA too, where
    transformers would have served the request); now those ids are left out of the engine's stops,
    which gives transformers' tokens and padding."""
    m = tiny_model()
    ids, mask = _left_padded(PROMPTS[:2])
    V = m.config.vocab_size
    free = m.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False, use_engine=False)
    stop = int(free[0, ids.shape[1] + 1])  # row 0 stops at its second token, row 1 later or never
    for eos in (V + 3, [stop, V]):  # [V, stop]: transformers pads with V, which its next step cannot embed
        kw = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, eos_token_id=eos)
        want = m.generate(ids, use_engine=False, **kw)
        got = m.generate(ids, use_engine=True, **kw)
        assert got.shape == want.shape and torch.equal(got, want), eos


@pytest.mark.parametrize("kw, what", [(dict(cuda_graphs=True), "cuda_graphs"),
                                      (dict(graph_batch_sizes=[3]), "graph_batch_sizes"),
                                      (dict(graph_batch_sizes=2), "graph_batch_sizes")])
def test_bad_engine_arguments_are_refused_before_the_cache_is_allocated(kw, what):
    """Was: ``cuda_graphs=True`` off CUDA and a bad ``graph_batch_sizes`` were refused only after
    the static cache (``max_batch_size x max_seq_len`` slots a layer, GBs for a real model) had been
    allocated (and the model put in eval mode), so a big request could run out of memory before
    the error naming the argument."""
    class NoCache(Engine):
        def cache_class(*a, **k):
            raise AssertionError("the cache was allocated before the bad argument was refused")

    m = tiny_model().train()
    with pytest.raises((ValueError, TypeError), match=what):
        NoCache(m, max_batch_size=2, max_seq_len=16, **kw)
    assert m.training  # nor was the model put in eval mode

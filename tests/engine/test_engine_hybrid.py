"""The inference engine on Orthros-H and its baselines (Linear Hybrid, pure GDN): greedy tokens
equal the HF model's cached generate() and an uncached recomputation; chunked prefill equals
unchunked (conv window and recurrent state carried across chunks); a multi-turn continuation
equals a from-scratch run; the engine's "full" mode of an Orthros-H model is the Linear
Hybrid with the same weights; on CUDA, CUDA-graph decode equals eager decode."""

from __future__ import annotations

import pytest
import torch

from orthros.engine import Engine
from orthros.kinds import hybrid_layout
from orthros.models import OrthrosConfig, OrthrosForCausalLM

from conftest import interrupted_at

pytestmark = pytest.mark.usefixtures("one_thread")
W = 4
PROMPTS = [[1, 5, 7, 9, 11, 13, 2, 4, 6, 8, 10, 3], [4, 3, 2, 8, 9], [7, 7, 1], [50, 60, 70, 80, 90, 20, 30, 40]]


def tiny(kind="orthros-h", seed=0, device="cpu", dtype=torch.float32, backend="reference"):
    torch.manual_seed(seed)
    cfg = OrthrosConfig(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=8, window_size=W, qk_norm=True,
                        initializer_range=0.2, attn_backend=backend, linear_num_key_heads=2, linear_num_value_heads=4,
                        linear_key_head_dim=8, linear_value_head_dim=8, **hybrid_layout(kind, 4))
    m = OrthrosForCausalLM(cfg).eval()
    with torch.no_grad():
        for n, p in m.named_parameters():
            if n.endswith(("alpha", "alpha_out", "beta", "beta_out")):
                p.add_(0.3 * torch.randn_like(p))
    return m.to(device=device, dtype=dtype)


@torch.no_grad()
def reference_greedy(model, prompt, n):
    seq = list(prompt)
    for _ in range(n):
        logits = model(input_ids=torch.tensor([seq], device=model.device), use_cache=False, logits_to_keep=1).logits
        seq.append(int(logits[0, -1].argmax()))
    return seq[len(prompt):]


@pytest.mark.parametrize("kind", ["orthros-h", "linear-hybrid", "gdn"])
def test_greedy_equals_generate_and_reference(kind):
    m = tiny(kind)
    eng = Engine(m, max_batch_size=4, max_seq_len=32, prefill_chunk=5)
    got = eng.generate(PROMPTS, 8)
    for p, g in zip(PROMPTS, got):
        hf = m.generate(torch.tensor([p]), max_new_tokens=8, do_sample=False, use_engine=False)[0, len(p):].tolist()
        assert g == hf
        assert g == reference_greedy(m, p, 8)


@pytest.mark.parametrize("kind", ["orthros-h", "gdn"])
def test_chunked_prefill_equals_unchunked(kind):
    m = tiny(kind, seed=1)
    base = Engine(m, max_batch_size=4, max_seq_len=40, prefill_chunk=None)
    ref_logits = base.prefill(PROMPTS)
    ref_tokens = base.generate(PROMPTS, 6)
    for chunk in (1, 3, W + 2):
        eng = Engine(m, max_batch_size=4, max_seq_len=40, prefill_chunk=chunk)
        torch.testing.assert_close(eng.prefill(PROMPTS), ref_logits, rtol=1e-4, atol=1e-4)
        assert eng.generate(PROMPTS, 6) == ref_tokens


def test_multi_turn_continuation_equals_from_scratch():
    m = tiny(seed=2)
    turn1, turn2 = [PROMPTS[0], PROMPTS[1]], [[21, 22, 23], [31, 32, 33, 34, 35, 36, 37]]
    eng = Engine(m, max_batch_size=2, max_seq_len=64, prefill_chunk=4)
    gen1 = eng.generate(turn1, 7)
    gen2 = eng.generate(turn2, 7, continue_=True)
    convo = [p + g + t for p, g, t in zip(turn1, gen1, turn2)]
    assert gen2 == Engine(m, max_batch_size=2, max_seq_len=64).generate(convo, 7)
    for c, g in zip(convo, gen2):
        assert g == reference_greedy(m, c, 7)


@pytest.mark.parametrize("stop", ["eos", "eos in a batch", "consumer"])
def test_continuation_after_a_stop_with_a_step_in_flight(stop):
    """A row that stops while the step queued ahead has already fed its last token (at EOS, alone or
    in a batch whose other row goes on; when the consumer stops reading) continues from the state
    before that token: a GDN state cannot be rewound, so the engine keeps the one it needs."""
    m = tiny(seed=2)
    prompts = [PROMPTS[0], PROMPTS[1]] if stop == "eos in a batch" else [PROMPTS[0]]
    eng = Engine(m, max_batch_size=2, max_seq_len=64)
    if stop == "consumer":
        it = eng.stream(prompts, 8)
        gen1 = [[next(it)[0] for _ in range(2)]]
        it.close()
    else:
        gen1 = eng.generate(prompts, 8, eos_token_id=reference_greedy(m, PROMPTS[0], 4)[3])
        assert len(gen1[0]) == 4 and len(gen1[-1]) in ((4,) if len(prompts) == 1 else range(5, 9))
    turn2 = [[21, 22, 23]] * len(prompts)
    gen2 = eng.generate(turn2, 6, continue_=True)
    for p, g, t, g2 in zip(prompts, gen1, turn2, gen2):
        assert g2 == reference_greedy(m, p + g + t, 6)


def test_a_decode_cut_short_leaves_no_hybrid_conversation_to_continue(monkeypatch):
    """Was: a generation cut short inside a decode step (Ctrl-C in a notebook, an error) kept the
    conversation, but the step had advanced the GDN states by a token its lengths do not count (a
    state cannot be rewound), so the next ``continue_=True`` silently continued from the wrong
    state. Now that conversation is dropped and a continuation refused by name."""
    import orthros.engine.engine as engine_module

    m = tiny(seed=2)
    eng = Engine(m, max_batch_size=1, max_seq_len=64)
    sample = engine_module.sample
    # at the 4th sample: the third decode step ran, its token not yet read back
    monkeypatch.setattr(engine_module, "sample", interrupted_at(sample, 4))
    with pytest.raises(KeyboardInterrupt):
        eng.generate([PROMPTS[0]], 8)
    monkeypatch.setattr(engine_module, "sample", sample)
    assert eng.batch_size == 0
    with pytest.raises(ValueError, match="continue_=True needs an earlier generate"):
        eng.generate([[21, 22]], 2, continue_=True)
    assert eng.generate([PROMPTS[1]], 4) == [reference_greedy(m, PROMPTS[1], 4)]


def test_full_mode_of_orthros_h_is_the_linear_hybrid():
    oh = tiny("orthros-h", seed=3)
    lh = tiny("linear-hybrid", seed=3)
    missing, unexpected = lh.load_state_dict(oh.state_dict(), strict=False)
    assert not missing and all(k.endswith(("alpha", "beta", "alpha_out", "beta_out")) for k in unexpected)
    a = Engine(oh, max_batch_size=4, max_seq_len=32, attention_mode="full", prefill_chunk=3).generate(PROMPTS, 6)
    b = Engine(lh, max_batch_size=4, max_seq_len=32).generate(PROMPTS, 6)
    assert a == b


def test_static_cache_holds_kv_only_for_attention_layers():
    eng = Engine(tiny(), max_batch_size=2, max_seq_len=16)
    assert [k is None for k in eng.cache.k] == [True, True, True, False]
    conv, rec = eng.cache.conv[0], eng.cache.rec[0]
    assert conv.shape == (2, 2 * 16 + 32, 3) and rec.shape == (2, 4, 8, 8) and rec.dtype == torch.float32


def test_compiled_engine_equals_eager_on_orthros_h():
    """``compile=True`` (what the hybrid benchmark's ``--compile`` runs): the GDN layers' token-wise
    parts compile next to the attention layers'; same greedy tokens and prefill logits."""
    m = tiny("orthros-h", seed=2)
    eager = Engine(m, max_batch_size=4, max_seq_len=40, prefill_chunk=5)
    comp = Engine(m, max_batch_size=4, max_seq_len=40, prefill_chunk=5, compile=True)
    assert comp.generate(PROMPTS, 6) == eager.generate(PROMPTS, 6)
    torch.testing.assert_close(comp.prefill(PROMPTS), eager.prefill(PROMPTS), atol=1e-4, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("kind", ["orthros-h", "linear-hybrid", "gdn"])
def test_cuda_graph_decode_equals_eager_and_hf(kind):
    m = tiny(kind, seed=4, device="cuda", backend="auto")
    got = Engine(m, max_batch_size=4, max_seq_len=64, prefill_chunk=5, cuda_graphs=True).generate(PROMPTS, 12)
    eager = Engine(m, max_batch_size=4, max_seq_len=64, prefill_chunk=5, cuda_graphs=False).generate(PROMPTS, 12)
    assert got == eager
    for p, g in zip(PROMPTS, got):
        assert g == reference_greedy(m, p, 12)

"""``Engine(qkv_kernel=True)``: a decode step hands each attention layer's raw QKV projection to
the cache (``DecodeView.attend_qkv``), whose kernel applies the q/k norms, the queries'
scale-offset and RoPE, writes the token's K/V and attends. Checked against the separate path
(``qkv_kernel=False``) step by step, logits and caches, through the op's reference and its
Triton kernel (the interpreter on the CPU); every attention layer goes through ``attend_qkv``
once a step and nothing else writes its K/V; a layer the kernel cannot take (an output gate)
keeps the separate path; compiled, the projection piece returns the raw rows."""

from __future__ import annotations

import pytest
import torch

from orthros.engine import Engine
from orthros.engine.cache import DecodeView
from orthros.engine.engine import compile_fallbacks

from conftest import cpu_triton, record_engine_graphs, tiny_model, writes_cache

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = [[1, 5, 7, 9, 11, 13, 2, 4, 6, 8, 10, 3], [4, 3, 2, 8, 9]]


def _model(mode="orthros", backend="reference", layers=3, **over):
    return tiny_model(0, **{**dict(hidden_size=64, intermediate_size=96, head_dim=16, window_size=5, qk_norm=True,
                                   num_hidden_layers=layers, attention_mode=mode, attn_backend=backend), **over})


def _record(monkeypatch):
    """Patch the decode view: record which layers go through ``attend_qkv``, and every K/V write
    made elsewhere (the token-wise piece's ``write``, or ``update`` writing itself)."""
    raw, other = [], []
    real_qkv, real_write, real_update = DecodeView.attend_qkv, DecodeView.write, DecodeView.update

    def attend_qkv(self, i, *a, **k):
        raw.append(i)
        return real_qkv(self, i, *a, **k)

    def write(self, slot, k, v):
        other.append("write")
        return real_write(self, slot, k, v)

    def update(self, i, k, v):
        if i not in self._slotted:
            other.append(("update", i))
        return real_update(self, i, k, v)

    monkeypatch.setattr(DecodeView, "attend_qkv", attend_qkv)
    monkeypatch.setattr(DecodeView, "write", write)
    monkeypatch.setattr(DecodeView, "update", update)
    return raw, other


def _steps(model, n=4, **kw):
    """Prefill PROMPTS, then ``n`` greedy decode steps: the logits of each, and the engine."""
    eng = Engine(model, max_batch_size=2, max_seq_len=40, **kw)
    logits = [eng.prefill(PROMPTS)]
    for _ in range(n):
        logits.append(eng.step(logits[-1].argmax(-1)))
    return logits, eng


@pytest.mark.parametrize("backend", ["reference", pytest.param("triton", marks=cpu_triton)])
@pytest.mark.parametrize("mode", ["orthros", "full", "window"])
def test_qkv_kernel_steps_equal_the_separate_path(monkeypatch, mode, backend):
    m = _model(mode, backend)
    want, ref = _steps(m, qkv_kernel=False)
    raw, other = _record(monkeypatch)
    got, eng = _steps(m, qkv_kernel=True)
    assert eng.qkv_kernel
    n_layers, steps = m.config.num_hidden_layers, 4
    assert raw == list(range(n_layers)) * steps  # every attention layer, every step, in order
    assert other == []  # nothing else wrote K/V in a decode step
    tol = 0 if backend == "reference" else 1e-5  # the reference runs the layer's own ops
    for a, b in zip(got, want):
        assert (a - b).abs().max().item() <= tol * max(1.0, b.abs().max().item())
    for ka, kb, va, vb in zip(eng.cache.k, ref.cache.k, eng.cache.v, ref.cache.v):
        assert (ka - kb).abs().max().item() <= tol * 10 and (va - vb).abs().max().item() <= tol * 10


@cpu_triton
def test_qkv_kernel_tokens_equal_the_hf_model():
    m = _model("orthros", "triton", layers=2)
    got = Engine(m, max_batch_size=2, max_seq_len=40, qkv_kernel=True).generate(PROMPTS, 4)
    want = [m.generate(torch.tensor([p]), max_new_tokens=4, do_sample=False, use_engine=False)[0, len(p):].tolist()
            for p in PROMPTS]
    assert got == want


def test_a_layer_the_kernel_cannot_take_keeps_the_separate_path(monkeypatch):
    """Qwen3.5's output gate (q_proj holds [query | gate]): no raw rows; ``update`` writes the K/V
    (the view hands out no write slot when the kernel is on), the tokens are unchanged."""
    m = _model("orthros", attn_output_gate=True)
    want = Engine(m, max_batch_size=2, max_seq_len=40, qkv_kernel=False).generate(PROMPTS, 3)
    raw, other = _record(monkeypatch)
    got = Engine(m, max_batch_size=2, max_seq_len=40, qkv_kernel=True).generate(PROMPTS, 3)
    assert raw == [] and got == want
    updates = [o for o in other if o != "write"]  # (update's own write goes through ``write`` too)
    assert updates == [("update", i) for _ in range(2) for i in range(m.config.num_hidden_layers)]


def test_compiled_projection_piece_returns_the_raw_rows(monkeypatch):
    """With ``compile=True`` the projection piece's graph holds no cache scatter (the kernel
    writes) and the tokens equal the eager engine's. A counting backend stands in for Inductor."""
    graphs = record_engine_graphs(monkeypatch)
    m = _model("orthros")
    try:
        torch._dynamo.reset()
        raw, _ = _record(monkeypatch)
        got = Engine(m, max_batch_size=2, max_seq_len=40, compile=True, qkv_kernel=True).generate(PROMPTS, 3)
    finally:
        torch._dynamo.reset()
    assert raw and got == Engine(m, max_batch_size=2, max_seq_len=40, qkv_kernel=False).generate(PROMPTS, 3)
    assert graphs and not any(writes_cache(g) for g in graphs)
    assert compile_fallbacks() == []  # every piece compiled (none ran eagerly after a failure)


def test_qkv_kernel_argument_is_checked():
    m = _model()
    with pytest.raises(ValueError, match="qkv_kernel must be None, True or False"):
        Engine(m, qkv_kernel="yes")
    with pytest.raises(ValueError, match="qkv_kernel needs fuse=True"):
        Engine(m, qkv_kernel=True, fuse=False)
    assert Engine(m).qkv_kernel is False  # the default on the CPU: off (the kernel's gain is a GPU's)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("mode", ["orthros", "full"])
def test_gpu_compiled_engine_qkv_kernel_equals_separate_path(mode):
    """bf16, compiled, fused GEMVs and CUDA graphs (the benchmarks' engine) at head_dim 128:
    each step's logits with the kernel against the separate path fed the same tokens."""
    m = tiny_model(0, torch.bfloat16, hidden_size=512, intermediate_size=1024, num_attention_heads=8,
                   num_key_value_heads=2, head_dim=128, num_hidden_layers=2, window_size=16, qk_norm=True,
                   attention_mode=mode, attn_backend="auto").cuda()
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, m.config.vocab_size, (n,), generator=g).tolist() for n in (40, 100)]
    engines = [Engine(m, max_batch_size=2, max_seq_len=256, compile=True, qkv_kernel=on) for on in (True, False)]
    assert engines[0].qkv_kernel and not engines[1].qkv_kernel
    logits = [e.prefill(prompts) for e in engines]
    for _ in range(12):
        tok = logits[1].argmax(-1)
        logits = [e.step(tok) for e in engines]
        a, b = logits
        assert ((a - b).norm() / b.norm()).item() < 3e-2


def test_hybrid_model_attention_layers_take_the_kernel(monkeypatch):
    """Orthros-H (GDN layers between attention layers): only the attention layers hand raw rows
    over; the GDN layers keep their own state path; steps equal the separate path's."""
    from orthros.kinds import hybrid_layout
    from orthros.models import OrthrosConfig, OrthrosForCausalLM

    torch.manual_seed(0)
    cfg = OrthrosConfig(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=8, window_size=5, qk_norm=True,
                        initializer_range=0.2, attn_backend="reference", linear_num_key_heads=2,
                        linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8,
                        **hybrid_layout("orthros-h", 4))
    m = OrthrosForCausalLM(cfg).eval()
    attn = [i for i, layer in enumerate(m.model.layers) if hasattr(layer, "self_attn")]
    assert 0 < len(attn) < 4
    want, _ = _steps(m, n=3, qkv_kernel=False)
    raw, other = _record(monkeypatch)
    got, _ = _steps(m, n=3, qkv_kernel=True)
    assert raw == attn * 3 and other == []
    for a, b in zip(got, want):
        assert (a - b).abs().max().item() <= 1e-5 * max(1.0, b.abs().max().item())

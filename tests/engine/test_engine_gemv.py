"""``Engine(gemv=...)``: decode steps run each layer's projections as fused GEMVs
(``orthros.layers.common.linear``: the input norm in QKV, the residual in the o-projection, the
post-attention norm in gate/up, SiLU x up and the residual in down). Through the ``"torch"``
backend (the same ops, one by one) the logits equal the unfused engine's exactly, so the layer
step's rewiring changed nothing; through ``"naive"`` (the GEMV spec) they agree to float32
rounding; the Triton kernel runs through the interpreter. Bad values are refused first."""

from __future__ import annotations

import pytest
import torch

from orthros.engine import Engine
from orthros.kinds import hybrid_layout

from conftest import cpu_triton, fed_decode, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = [[1, 5, 7, 9, 11, 13, 2, 4, 6, 8, 10, 3], [4, 3, 2, 8, 9]]


def _model(mode="orthros", hybrid=False, **over):
    extra = dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8,
                 **hybrid_layout("orthros-h", 4)) if hybrid else {}
    kw = {"attention_mode": mode, **extra, **over}  # (the hybrid layout names its own mode)
    return tiny_model(0, hidden_size=32, intermediate_size=48, head_dim=8, window_size=4, qk_norm=True,
                      num_hidden_layers=4, attn_backend="reference", **kw)


def _decode_logits(m, steps=3, **kw):
    eng = Engine(m, max_batch_size=2, max_seq_len=40, **kw)
    logits = [eng.prefill(PROMPTS)]
    for _ in range(steps):
        logits.append(eng.step(logits[-1].argmax(-1)))
    return torch.stack(logits)


@pytest.mark.parametrize("mode,hybrid", [("orthros", False), ("full", False), ("window", False),
                                         ("orthros", True)])
def test_torch_backend_equals_the_unfused_engine_exactly(mode, hybrid):
    m = _model(mode, hybrid)
    want = _decode_logits(m)
    assert torch.equal(_decode_logits(m, gemv="torch"), want)
    # the spec's float32 accumulation: equal to rounding
    torch.testing.assert_close(_decode_logits(m, gemv="naive"), want, atol=2e-5, rtol=2e-5)


def test_bias_and_untied_shapes_take_the_same_path():
    m = _model(attention_bias=True, mlp_bias=True)
    torch.testing.assert_close(_decode_logits(m, gemv="naive"), _decode_logits(m), atol=2e-5, rtol=2e-5)


def test_gemv_reaches_every_fused_site(monkeypatch):
    """Each decode step calls the GEMV four times per attention layer, with the prologue or
    epilogue of its site: norm + QKV, o-projection + residual, norm + gate/up, SiLU + down +
    residual; then once for the head, with the final norm."""
    import orthros.ops.gemv as g

    calls = []
    real = g.gemv

    def spy(x, weight, bias=None, backend="auto", **kw):
        calls.append((kw.get("norm_weight") is not None, kw.get("act"), kw.get("residual") is not None,
                      kw.get("out_norm_weight") is not None))
        return real(x, weight, bias, backend, **kw)

    monkeypatch.setattr(g, "gemv", spy)
    m = _model()
    eng = Engine(m, max_batch_size=2, max_seq_len=40, gemv="torch")
    eng.prefill(PROMPTS)
    assert calls == []  # prefill is not a decode step
    eng.step([1, 2])
    # the o-projection asks for the post-attention norm of its output; the torch backend returns
    # it, so gate/up runs without a norm prologue
    site = [(True, None, False, False), (False, None, True, True), (False, None, False, False),
            (False, "silu", True, False)]
    head = [(True, None, False, False)]  # the final norm and the LM head (DECODE_HEAD_GEMV)
    assert calls == site * m.config.num_hidden_layers + head


@cpu_triton
@pytest.mark.parametrize("mode", ["orthros", "full"])
def test_o_projections_reduce_writes_the_mlp_norm(mode, monkeypatch):
    """Where W_O's GEMV splits K (a config that does at the tiny model's 32 x 32, installed for
    the test), its reduce writes the post-attention norm (``orthros::gemv_norm_out``, the
    interpreter on CPU) and gate/up streams without a norm prologue; where it does not (the
    table's config at K = 32), gate/up normalises as before. Both match the unfused engine."""
    from orthros.ops.gemv import kernel

    calls = []
    real = kernel.gemv_triton

    def spy(x, weight, bias=None, **kw):
        calls.append((kw.get("norm_weight") is not None, kw.get("out_norm_weight") is not None))
        return real(x, weight, bias, **kw)

    monkeypatch.setattr(kernel, "gemv_triton", spy)
    m = _model(mode)
    want = _decode_logits(m, steps=2)
    split_o = {(32, 32): kernel.GemvConfig(block_n=16, block_k=16, split=2)}
    # for 2 rows (the Transformer's, the pair's last layer: its output rows) and 4 (the pair)
    with kernel.configs_installed(kernel.class_rows(2, split_o)), \
            kernel.configs_installed(kernel.class_rows(4, split_o)):
        got = _decode_logits(m, steps=2, gemv="triton")
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    layers = m.config.num_hidden_layers
    fused, unfused = [(True, False), (False, True), (False, False), (False, False)], \
        [(True, False), (False, False), (True, False), (False, False)]
    head = [(True, False)]  # each step's head: the final norm in its prologue
    assert calls == (fused * layers + head) * 2
    calls.clear()
    torch.testing.assert_close(_decode_logits(m, steps=1, gemv="triton"), want[:2], atol=1e-4, rtol=1e-4)
    assert calls == unfused * layers + head


@cpu_triton
@pytest.mark.parametrize("mode", ["orthros", "full"])
def test_head_gemv_takes_the_final_norm_as_its_prologue(mode, monkeypatch):
    """:data:`~orthros.engine.engine.DECODE_HEAD_GEMV` (on unless ``ORTHROS_HEAD_GEMV=0``, set
    here either way): a decode step's head is one more GEMV call, with the final norm as its
    prologue, and prefill's head is not. Through ``"torch"`` (the same ops) the logits equal the
    unfused engine's exactly, through ``"naive"`` and the kernel (the interpreter) to float32
    rounding."""
    import orthros.engine.engine as engine_mod
    import orthros.ops.gemv as g

    m = _model(mode)
    want = _decode_logits(m, steps=2)
    monkeypatch.setattr(engine_mod, "DECODE_HEAD_GEMV", True)
    calls = []
    real = g.gemv

    def spy(x, weight, bias=None, backend="auto", **kw):
        calls.append((tuple(weight.shape), kw.get("norm_weight") is m.model.norm.weight))
        return real(x, weight, bias, backend, **kw)

    monkeypatch.setattr(g, "gemv", spy)
    assert torch.equal(_decode_logits(m, steps=2, gemv="torch"), want)
    head = (tuple(m.lm_head.weight.shape), True)
    per_step = len(calls) // 2
    assert calls.count(head) == 2 and calls[per_step - 1] == head and calls[-1] == head
    torch.testing.assert_close(_decode_logits(m, steps=2, gemv="naive"), want, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(_decode_logits(m, steps=2, gemv="triton"), want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("bad,match", [("cuda", "gemv must be None, True, False or a GEMV backend"),
                                       (1, "gemv must be None, True, False or a GEMV backend")])
def test_bad_gemv_is_refused(bad, match):
    with pytest.raises(ValueError, match=match):
        Engine(_model(), gemv=bad)


def test_gemv_needs_fused_projections():
    with pytest.raises(ValueError, match="gemv needs fuse=True"):
        Engine(_model(), gemv=True, fuse=False)


def test_default_is_on_for_cuda_models_with_fused_projections():
    """``gemv=None`` (the default): the fused GEMVs for a CUDA model with fused projections,
    off for a CPU model and with ``fuse=False`` (no refusal: nothing was asked for)."""
    m = _model()
    assert Engine(m).gemv is None and Engine(m, fuse=False).gemv is None
    assert Engine(m, gemv=True).gemv == "auto" and Engine(m, gemv=False).gemv is None
    if torch.cuda.is_available():
        mc = _model().cuda()
        assert Engine(mc).gemv == "auto" and Engine(mc, fuse=False).gemv is None


@cpu_triton
def test_triton_kernel_through_the_interpreter_matches_the_unfused_engine():
    """The fused kernel itself (the ``orthros::gemv`` op; the Triton interpreter on CPU, the
    kernel on a GPU) in every fused site of a decode step, against the unfused engine."""
    m = _model()
    torch.testing.assert_close(_decode_logits(m, steps=2, gemv="triton"), _decode_logits(m, steps=2),
                               atol=1e-4, rtol=1e-4)


@cpu_triton
def test_compiled_engine_calls_the_fused_op_inside_its_graphs():
    """``compile=True`` with fused GEMVs: the op is one opaque node of the compiled pieces (no
    compile failure, which the engine would answer with a RuntimeWarning and eager pieces),
    and the logits match the eager engine's."""
    import warnings

    m = _model()
    want = _decode_logits(m, steps=2)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="torch.compile of", category=RuntimeWarning)
        got = _decode_logits(m, steps=2, gemv="triton", compile=True)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("mode", ["orthros", "full"])
@pytest.mark.parametrize("compile", [False, True])
@pytest.mark.parametrize("head", [False, True])
def test_gpu_engine_with_the_kernel_matches_the_unfused_engine(mode, compile, head, monkeypatch):
    """On the GPU, bf16, Triton attention: ``Engine(gemv=True)`` (the kernel, the tensor-core form
    for the Orthros pair's 2 rows and the CUDA-core form for 1; ``head``: the head's GEMV too,
    :data:`~orthros.engine.engine.DECODE_HEAD_GEMV`) against the unfused engine,
    both fed the same tokens (the unfused run's greedy ones), eager and CUDA-graph compiled.
    The decode timings of benchmarks/roofline.py --gemv do not compare outputs: this does."""
    import orthros.engine.engine as engine_mod

    monkeypatch.setattr(engine_mod, "DECODE_HEAD_GEMV", head)
    torch.manual_seed(0)
    m = tiny_model(0, dtype=torch.bfloat16, hidden_size=256, intermediate_size=512, head_dim=64,
                   num_attention_heads=4, num_key_value_heads=2, window_size=16, qk_norm=True,
                   num_hidden_layers=2, attention_mode=mode, vocab_size=512).cuda()
    prompts = [[(7 * i + 3) % 500 + 1 for i in range(40)], [(5 * i + 1) % 500 + 1 for i in range(23)]]

    kw = dict(max_batch_size=2, max_seq_len=96, compile=compile)
    want, fed = fed_decode(m, prompts, 6, **kw)
    got, _ = fed_decode(m, prompts, 6, tokens=fed, gemv=True, **kw)
    assert torch.isfinite(got).all()
    # bf16 rounding of differently ordered sums; the logits are O(1)
    torch.testing.assert_close(got, want, atol=5e-2, rtol=5e-2)

"""Decode step of Orthros attention: reference semantics and the Triton kernel.

The reference is checked against the op's reference (one query at the end of each row's
cache); the Triton kernel (interpreter on CPU, native on GPU) against the reference, on
batches whose rows have different lengths, GQA 1..8, windows longer and shorter than the
cache, and NaN-poisoned outputs. On a GPU the step is also captured in a CUDA graph.
The one-launch paths (one split writing the outputs itself; ``merge="inline"``: the split
kernel's last program per (row, KV head) merges, with a ticket counter it resets) are checked
against the reference and against the two-launch merge, on the CPU and (``-m gpu``) with
hypothesis cases, graph replays and repeated launches on the H200.
"""

import os
import textwrap
import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

from orthros.ops import orthros_attention_reference  # noqa: E402
from orthros.ops.decode import decode_attention_reference, orthros_decode_attention  # noqa: E402
from conftest import compile_sm90, printed, rel  # noqa: E402

DEV = "cuda" if HAS_CUDA else "cpu"
gpu = pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")


def make(B, L_max, Hq, Hkv, D, lens, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g).to(DEV, dtype)  # noqa: E731
    return (r(B, 1, Hq, D), r(B, 1, Hq, D), r(B, L_max, Hkv, D), r(B, L_max, Hkv, D),
            torch.tensor(lens, device=DEV, dtype=torch.int32))


def _captured(step):
    """``step`` run once on a side stream (warm-up), then captured: ``(graph, its output)``."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    return graph, out


def test_reference_matches_op_reference():
    B, L, Hq, Hkv, D, w = 3, 40, 4, 2, 16, 7
    q, qo, kc, vc, lens = make(B, L, Hq, Hkv, D, [40, 13, 3])
    o, oo = decode_attention_reference(q, qo, kc, vc, lens, window_size=w)
    for b, n in enumerate(lens.tolist()):
        pos = torch.tensor([[n - 1]], device=DEV)
        ro, roo = orthros_attention_reference(q[b:b + 1], kc[b:b + 1, :n], vc[b:b + 1, :n], qo[b:b + 1],
                                              window_size=w, output_positions=pos, scale=D ** -0.5)
        assert rel(o[b:b + 1], ro) < 1e-6 and rel(oo[b:b + 1], roo) < 1e-6


@pytest.mark.parametrize("Hq,Hkv", [(1, 1), (4, 1), (8, 1), (6, 2), (8, 8)])
def test_triton_matches_reference(Hq, Hkv, monkeypatch):
    real_empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **k: real_empty(*a, **k).fill_(float("nan")))
    B, L, D = 3, 150, 16
    q, qo, kc, vc, lens = make(B, L, Hq, Hkv, D, [150, 70, 1], seed=Hq * 10 + Hkv)
    for w in (1, 5, 64, 200):
        a = orthros_decode_attention(q, qo, kc, vc, lens, window_size=w, backend="triton")
        b = decode_attention_reference(q, qo, kc, vc, lens, window_size=w)
        for x, y in zip(a, b):
            assert x.shape == y.shape and rel(x, y) < 1e-4


def test_split_heuristic_static_and_wave_aware():
    from orthros.ops.triton.decode import choose_splits, occupancy

    occ = occupancy(64, 128, 3)
    assert occ == 2  # 3 stages of 64-key K+V tiles (96 KB) fit twice in 228 KB
    # B=1: ~2 programs per SM (as before); B=8, Hkv=8: one wave of 256 programs, not 320
    assert choose_splits(1, 8, 32768, 132, occ, 64, 512) == 32
    assert choose_splits(1, 8, 131072, 132, occ, 64, 512) == 33
    assert choose_splits(8, 8, 32768, 132, occ, 64, 512) == 4
    for B in (1, 2, 3, 8, 64):
        for L in (1, 63, 700, 8192, 100000):
            s = choose_splits(B, 8, L, 132, occ, 64, 512)
            assert 1 <= s <= max(1, L // 512)
    # short caches: min_split bounds S (1K -> 2 splits at 512); at min_split 64 (the default) the wave
    # model fills one wave (16), and pricing the inline merge's serial tail halves that
    assert choose_splits(1, 8, 1024, 132, occ, 64, 512) == 2
    assert choose_splits(1, 8, 1024, 132, occ, 64, 64) == 16
    assert choose_splits(1, 8, 1024, 132, occ, 64, 64, tail_per_split=1 / 8) == 8
    assert choose_splits(1, 8, 32768, 132, occ, 64, 512, tail_per_split=1 / 8) == 32


@pytest.mark.parametrize("cfg", [{"splits": 1}, {"splits": 3, "block_n": 32}, {"splits": 100}])
def test_triton_explicit_config_override(cfg):
    from orthros.ops.triton.decode import decode_attention_triton

    q, qo, kc, vc, lens = make(2, 150, 4, 2, 16, [150, 37], seed=3)
    a = decode_attention_triton(q, qo, kc, vc, lens, window_size=20, _config=cfg)
    b = decode_attention_reference(q, qo, kc, vc, lens, window_size=20)
    for x, y in zip(a, b):
        assert rel(x, y) < 1e-4


def test_triton_fp16_and_zero_length_row():
    q, qo, kc, vc, lens = make(2, 96, 4, 2, 32, [0, 96], dtype=torch.float16)
    a = orthros_decode_attention(q, qo, kc, vc, lens, window_size=9, backend="triton")
    b = decode_attention_reference(q, qo, kc, vc, lens, window_size=9)
    for x, y in zip(a, b):
        assert rel(x, y) < 1e-2
        assert torch.all(x[0] == 0)


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_slots_past_each_rows_length_are_ignored_even_nan(backend):
    """A static cache holds anything past a row's length (``torch.empty``: NaN, inf): the step
    must give what it gives with zeros there, not NaN through a zero weight times NaN."""
    q, qo, kc, vc, lens = make(3, 12, 4, 2, 8, [1, 5, 12], seed=3)
    clean = orthros_decode_attention(q, qo, kc, vc, lens, window_size=3, backend=backend)
    for b, n in enumerate(lens.tolist()):
        kc[b, n:], vc[b, n:] = float("nan"), float("inf")
    dirty = orthros_decode_attention(q, qo, kc, vc, lens, window_size=3, backend=backend)
    for x, y in zip(dirty, clean):
        assert torch.equal(x, y)


@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_stacked_is_both_rows_in_one_buffer(backend):
    """``stacked=True`` (the engine's decode: W_O's input as the kernel wrote it): one
    [B, 2, Hq, D] tensor, row 0 the window result and row 1 the full one, equal to the pair."""
    q, qo, kc, vc, lens = make(2, 150, 4, 2, 16, [150, 37], seed=5)
    o, oo = orthros_decode_attention(q, qo, kc, vc, lens, window_size=20, backend=backend)
    both = orthros_decode_attention(q, qo, kc, vc, lens, window_size=20, backend=backend, stacked=True)
    assert both.shape == (2, 2, 4, 16) and both.is_contiguous()
    assert torch.equal(both[:, :1], o) and torch.equal(both[:, 1:], oo)
    assert not torch.equal(both[:, :1], both[:, 1:])  # the two streams differ (window 20 < 150 keys)
    with pytest.raises(ValueError, match="stacked"):
        orthros_decode_attention(q, qo, kc, vc, lens, window_size=20, backend=backend, stacked=1)


def test_dispatch_and_validation():
    q, qo, kc, vc, lens = make(2, 16, 4, 2, 16, [16, 5])
    if not HAS_CUDA:  # CPU: auto is the reference, exactly
        a = orthros_decode_attention(q, qo, kc, vc, lens, window_size=4)
        b = decode_attention_reference(q, qo, kc, vc, lens, window_size=4)
        assert all(torch.equal(x, y) for x, y in zip(a, b))
    with pytest.raises(ValueError, match="window_size"):
        orthros_decode_attention(q, qo, kc, vc, lens, window_size=0)
    # what was wrong was not said: the dtypes, the lengths' dtype / shape / type, the devices
    with pytest.raises(ValueError, match=r"cache_seqlens must be an int32/int64 tensor of shape \[2\] .*got "
                                         r"torch.float32 \(2,\)$"):
        orthros_decode_attention(q, qo, kc, vc, lens.float(), window_size=3)
    with pytest.raises(ValueError, match=r"cache_seqlens must be .*got list$"):
        orthros_decode_attention(q, qo, kc, vc, lens.tolist(), window_size=3)
    with pytest.raises(ValueError, match="cache_seqlens must be on q's device cpu, got meta"):
        orthros_decode_attention(q.cpu(), qo.cpu(), kc.cpu(), vc.cpu(), lens.to("meta"), window_size=3)
    with pytest.raises(ValueError, match="share one dtype, got torch.float32, torch.float32, torch.float64, "
                                         "torch.float64"):
        orthros_decode_attention(q, qo, kc.double(), vc.double(), lens, window_size=3)
    with pytest.raises(ValueError, match="q and q_out"):
        orthros_decode_attention(q, qo[:, :, :2], kc, vc, lens, window_size=3)
    with pytest.raises(ValueError, match="backend"):
        orthros_decode_attention(q, qo, kc, vc, lens, window_size=3, backend="cuda")
    with pytest.raises(ValueError, match="floating"):
        orthros_decode_attention(q.long(), qo.long(), kc.long(), vc.long(), lens, window_size=3)
    with pytest.raises(ValueError, match="same device"):
        orthros_decode_attention(q, qo, kc.to("meta"), vc.to("meta"), lens, window_size=3)
    with pytest.raises(ValueError, match="L_max >= 1"):
        orthros_decode_attention(q, qo, kc[:, :0], vc[:, :0], lens * 0, window_size=3)
    with pytest.raises(ValueError, match="head dim"):
        orthros_decode_attention(q[..., :0], qo[..., :0], kc[..., :0], vc[..., :0], lens, window_size=3)
    with pytest.raises(ValueError, match="scale"):
        orthros_decode_attention(q, qo, kc, vc, lens, window_size=3, scale=float("nan"))


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_window_longer_than_any_int64_is_the_whole_cache(backend):
    # window_size=10**20 (an "infinite" window; orthros_attention takes it) was an OverflowError of int64
    # (the reference's lens - w, the kernel's argument) in both decode ops
    from orthros.ops.decode import orthros_decode_qkv_attention

    q, qo, kc, vc, lens = make(2, 12, 4, 2, 16, [12, 5])
    for a, b in zip(orthros_decode_attention(q, qo, kc, vc, lens, window_size=10**20, backend=backend),
                    orthros_decode_attention(q, qo, kc, vc, lens, window_size=12, backend=backend)):
        assert torch.equal(a, b)
    qkv, kc, vc, lens, kw = make_qkv(2, 12, 4, 2, 8, [3, 11])
    outs = [orthros_decode_qkv_attention(qkv, kc.clone(), vc.clone(), lens, window_size=w, backend=backend, **kw)
            for w in (10**20, 12)]
    assert torch.equal(*outs)


def test_strided_lengths_and_norm_weights_are_read_as_their_values():
    """The kernels read ``cache_seqlens`` / ``lens`` and the q/k norm weights at unit stride: a
    strided view (the lengths a column of a [B, 2] table, a weight sliced ``w[::2]``) gave
    other elements' values, silently (outputs off by ~1; the reference read them right)."""
    from orthros.ops.decode import orthros_decode_qkv_attention

    q, qo, kc, vc, lens = make(2, 12, 4, 2, 8, [3, 9], seed=7)
    table = torch.stack([lens, lens.flip(0) + 2], 1)  # [[3, 11], [9, 5]]: column 0 is lens, stride 2
    outs = [orthros_decode_attention(q, qo, kc, vc, table[:, 0], window_size=2, backend=b, stacked=True)
            for b in ("triton", "reference")]
    assert not table[:, 0].is_contiguous() and rel(*outs) < 1e-5
    qkv, kc, vc, lens, kw = make_qkv(2, 12, 4, 2, 8, [3, 9], seed=7)
    kw.update(q_norm=torch.stack([kw["q_norm"], kw["q_norm"] * 2], 1)[:, 0],  # stride 2
              k_norm=torch.stack([-kw["k_norm"], kw["k_norm"]], 1)[:, 1])
    table = torch.stack([lens + 1, lens], 1)
    outs = [orthros_decode_qkv_attention(qkv, kc.clone(), vc.clone(), table[:, 1], window_size=3, backend=b, **kw)
            for b in ("triton", "reference")]
    assert rel(*outs) < 1e-5


@pytest.mark.parametrize("backend", ["auto", "triton"])
def test_inputs_that_require_grad_take_the_differentiable_reference(backend):
    # the decode kernels have no backward: their outputs did not require grad, so backward() failed
    # ("element 0 of tensors does not require grad") or the gradient was silently lost
    from orthros.ops.decode import decode_qkv_attention_reference, orthros_decode_qkv_attention

    q, qo, kc, vc, lens = make(2, 12, 4, 2, 16, [12, 5])
    grads = []
    for run in ("op", "reference"):
        qg = q.clone().requires_grad_()
        if run == "reference":
            o, oo = decode_attention_reference(qg, qo, kc, vc, lens, window_size=4)
        elif backend == "triton":
            with pytest.warns(UserWarning, match="orthros_decode_attention: the Triton kernel has no backward") as rec:
                o, oo = orthros_decode_attention(qg, qo, kc, vc, lens, window_size=4, backend=backend)
            assert rec[0].filename == __file__  # the call to change, not an ops line
        else:
            o, oo = orthros_decode_attention(qg, qo, kc, vc, lens, window_size=4, backend=backend)
        (o.sum() + oo.sum()).backward()
        grads.append(qg.grad)
    assert torch.equal(*grads)
    with torch.no_grad(), warnings.catch_warnings():  # no graph recorded: the kernel again, without a warning
        warnings.simplefilter("error")
        orthros_decode_attention(q.clone().requires_grad_(), qo, kc, vc, lens, window_size=4, backend=backend)
    qkv, kc, vc, lens, kw = make_qkv(2, 12, 4, 2, 8, [3, 11])
    grads = []
    for run in ("op", "reference"):
        qn = kw["q_norm"].clone().requires_grad_()
        args = (qkv, kc.clone(), vc.clone(), lens)
        kwr = {**kw, "q_norm": qn, "window_size": 4}
        if run == "reference":
            out = decode_qkv_attention_reference(*args, **kwr)
        elif backend == "triton":
            with pytest.warns(UserWarning, match="orthros_decode_qkv_attention: the Triton kernel has no backward"):
                out = orthros_decode_qkv_attention(*args, backend=backend, **kwr)
        else:
            out = orthros_decode_qkv_attention(*args, backend=backend, **kwr)
        out.sum().backward()
        grads.append(qn.grad)
    assert torch.equal(*grads)


@pytest.mark.skipif(HAS_CUDA, reason="CPU tensors: the case of a CPU machine")
def test_triton_on_cpu_without_the_interpreter_runs_the_reference(monkeypatch):
    # backend "triton" (a config's attn_backend) on CPU tensors without TRITON_INTERPRET: both decode ops raised
    # Triton's "0 active drivers" after the prefill had run (the training op takes the reference, with a warning)
    from orthros.ops import backends
    from orthros.ops.decode import orthros_decode_qkv_attention

    monkeypatch.setattr(backends, "INTERPRET", False)
    q, qo, kc, vc, lens = make(2, 12, 4, 2, 16, [12, 5])
    with pytest.warns(UserWarning, match="orthros_decode_attention: input not supported by the Triton kernels"):
        got = orthros_decode_attention(q, qo, kc, vc, lens, window_size=4, backend="triton")
    for a, b in zip(got, decode_attention_reference(q, qo, kc, vc, lens, window_size=4)):
        assert torch.equal(a, b)
    qkv, kc, vc, lens, kw = make_qkv(2, 12, 4, 2, 8, [3, 11])
    with pytest.warns(UserWarning, match="orthros_decode_qkv_attention: input not supported"):
        got = orthros_decode_qkv_attention(qkv, kc.clone(), vc.clone(), lens, window_size=4, backend="triton", **kw)
    assert torch.equal(got, orthros_decode_qkv_attention(qkv, kc.clone(), vc.clone(), lens, window_size=4,
                                                         backend="reference", **kw))


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_long_cache_and_graph_capture(dtype):
    B, L, Hq, Hkv, D = 4, 40000, 32, 8, 128
    q, qo, kc, vc, lens = make(B, L, Hq, Hkv, D, [40000, 31111, 128, 7], dtype=dtype)
    a = orthros_decode_attention(q, qo, kc, vc, lens, window_size=128)
    b = decode_attention_reference(q, qo, kc, vc, lens, window_size=128)
    for x, y in zip(a, b):
        assert rel(x, y) < 1e-2
    # CUDA graph: capture once, change lengths on the device, replay
    graph, out = _captured(lambda: orthros_decode_attention(q, qo, kc, vc, lens, window_size=128))
    lens.copy_(torch.tensor([5, 39999, 20000, 1], device=DEV, dtype=torch.int32))
    graph.replay()
    ref = decode_attention_reference(q, qo, kc, vc, lens, window_size=128)
    for x, y in zip(out, ref):
        assert rel(x, y) < 1e-2


# ---------------------------------------------------------------- one launch per step
def _poison(monkeypatch):
    """NaN-fill every torch.empty / empty_like (unwritten outputs fail); returns the list of
    shapes allocated through them."""
    shapes = []

    def poisoned(real):
        def f(*a, **k):
            t = real(*a, **k)
            shapes.append(tuple(t.shape))
            return t.fill_(float("nan")) if t.is_floating_point() else t
        return f
    monkeypatch.setattr(torch, "empty", poisoned(torch.empty))
    monkeypatch.setattr(torch, "empty_like", poisoned(torch.empty_like))
    return shapes


def _counters(q, Hkv):
    """The cached ticket counters an inline merge of this shape used (None: none used yet,
    e.g. when the step had one split)."""
    from orthros.ops.triton.common import _COUNTERS

    return _COUNTERS.get((q.device, q.shape[0] * Hkv))


def _check_inline(q, qo, kc, vc, lens, w, cfg, tol):
    """Inline merge == the two-launch merge (the same partials and merge arithmetic: bit for bit
    in the interpreter at one split count; on a GPU the reductions' layouts differ) and == the
    reference; the ticket counters are back to 0, so a second call (a graph replay) gives the
    same result."""
    from orthros.ops.triton.decode import decode_attention_triton

    ref = decode_attention_reference(q, qo, kc, vc, lens, window_size=w)
    sep = decode_attention_triton(q, qo, kc, vc, lens, window_size=w, _config={**cfg, "merge": "separate"})
    inl = decode_attention_triton(q, qo, kc, vc, lens, window_size=w, _config={**cfg, "merge": "inline"})
    for x, y, z in zip(inl, sep, ref):
        assert x.shape == z.shape and x.dtype == z.dtype
        assert rel(x, z) < tol
        if HAS_CUDA or "splits" not in cfg:  # (the heuristic prices the inline merge: its own S)
            assert rel(x, y) < tol
        else:
            assert torch.equal(x, y)
    cnt = _counters(q, kc.shape[2])
    assert cnt is None or int(cnt.abs().sum()) == 0
    again = decode_attention_triton(q, qo, kc, vc, lens, window_size=w, _config={**cfg, "merge": "inline"})
    assert all(torch.equal(x, y) for x, y in zip(again, inl))
    return inl


# (B, L_max, Hq, Hkv, D, lens, splits, block_n): rows of different lengths, lengths inside one
# split, exactly at split boundaries (chunks of 32 keys below), empty splits, a 0-length row,
# GQA 1..8, non-power-of-2 head dims
INLINE_CASES = [
    (3, 150, 4, 2, 16, [150, 70, 1], 3, 64),
    (4, 128, 6, 2, 24, [32, 64, 96, 128], 4, 32),
    (2, 96, 8, 1, 16, [33, 0], 3, 32),
    (1, 200, 2, 2, 40, [7], 7, 32),
    (2, 64, 3, 1, 16, [64, 63], 2, 32),
]


@pytest.mark.parametrize("case", INLINE_CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_inline_merge_matches_reference(case, dtype, monkeypatch):
    B, L, Hq, Hkv, D, lens, S, bn = case
    _poison(monkeypatch)
    q, qo, kc, vc, lens = make(B, L, Hq, Hkv, D, lens, dtype=dtype, seed=B * 7 + S)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    for w in (1, 5, L + 3):
        o, oo = _check_inline(q, qo, kc, vc, lens, w, {"splits": S, "block_n": bn}, tol)
        assert _counters(q, Hkv) is not None
        for b, n in enumerate(lens.tolist()):
            if n == 0:
                assert torch.all(o[b] == 0) and torch.all(oo[b] == 0)


def test_fit_stages_keeps_the_kv_pipeline_inside_one_programs_shared_memory():
    """The H200 refused fp32 at block_n = 128 with 3 stages (278,528 B asked, 232,448 B there):
    the host lowers the stages to what fits and leaves every fitting config alone."""
    from orthros.ops.triton.decode import DECODE_CONFIG, fit_stages

    h200 = 232448
    assert 2 * 2 * 128 * 128 * 4 + 16 * 1024 == 278528  # the refused request, by the formula
    assert fit_stages(3, 128, 128, 4, h200) == 2
    assert fit_stages(3, 64, 128, 4, h200) == 3
    assert fit_stages(DECODE_CONFIG["num_stages"], DECODE_CONFIG["block_n"], 128, 2, h200) == DECODE_CONFIG["num_stages"]
    assert fit_stages(4, 256, 256, 4, 64 * 1024) == 1  # never below one stage
    for ns, bn, bd, eb in [(3, 128, 128, 4), (4, 128, 128, 2), (5, 64, 256, 4)]:
        got = fit_stages(ns, bn, bd, eb, h200)
        assert 1 <= got <= ns and (got == 1 or 2 * (got - 1) * bn * bd * eb + 16384 <= h200)
        assert got == ns or 2 * got * bn * bd * eb + 16384 > h200  # the most that fits


@pytest.mark.parametrize("case", INLINE_CASES[:4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_split_writes_outputs_directly(case, dtype, monkeypatch):
    """S == 1 (in both merge modes): no combine launch, no partial buffers, output dtype."""
    from orthros.ops.triton import decode as td

    B, L, Hq, Hkv, D, lens, _, bn = case
    q, qo, kc, vc, lens = make(B, L, Hq, Hkv, D, lens, dtype=dtype, seed=B + D)
    ref = decode_attention_reference(q, qo, kc, vc, lens, window_size=9)
    shapes = _poison(monkeypatch)

    class NoLaunch:
        def __getitem__(self, grid):
            raise AssertionError("a combine kernel was launched for one split")
    monkeypatch.setattr(td, "_decode_combine", NoLaunch())
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    for cfg in ({"splits": 1, "block_n": bn}, {"splits": 1, "merge": "inline"}, {"min_split": 10 ** 6}):
        shapes.clear()
        out = td.decode_attention_triton(q, qo, kc, vc, lens, window_size=9, _config=cfg)
        assert shapes == [(B, 2, Hq, D)]  # the one [B, 2, Hq, D] output buffer only (no partials)
        for x, y in zip(out, ref):
            assert x.dtype == dtype and rel(x, y) < tol


def test_inline_merge_default_split_count_and_bad_merge():
    from orthros.ops.triton.decode import DECODE_CONFIG, decode_attention_triton, num_splits

    q, qo, kc, vc, lens = make(2, 256, 4, 2, 16, [256, 100], seed=5)
    assert DECODE_CONFIG["merge"] == "separate"  # inline was slower at 62 of 64 points (H200 tune, 2026-12-02)
    cfg = {"min_split": 64}  # the heuristic's own S (> 1) at a short cache
    assert num_splits(2, 2, 256, q.device, {**DECODE_CONFIG, **cfg}) > 1
    _check_inline(q, qo, kc, vc, lens, 16, cfg, 1e-5)
    with pytest.raises(ValueError, match="merge"):
        decode_attention_triton(q, qo, kc, vc, lens, window_size=4, _config={"merge": "fused"})


@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
@given(B=st.integers(1, 3), Hkv=st.integers(1, 2), G=st.integers(1, 4), L=st.integers(1, 160),
       S=st.integers(2, 6), w=st.integers(1, 170), data=st.data())
def test_hypothesis_inline_small(B, Hkv, G, L, S, w, data):
    lens = data.draw(st.lists(st.integers(0, L), min_size=B, max_size=B))
    q, qo, kc, vc, lens = make(B, L, Hkv * G, Hkv, 16, lens, seed=L + S)
    _check_inline(q, qo, kc, vc, lens, w, {"splits": S, "block_n": 16}, 1e-5)


# The split kernel compiled for sm_90 on the CPU (ptxas ships in the triton wheel) at the engine's
# shape (G=4, D=128, bf16, 16-divisible pointers/strides as the launcher specialises), in a fresh
# process (kernels imported under TRITON_INTERPRET=1 are interpreted). Printed per mode: PTX
# lines of the gpu-scope acq_rel atomics, bar.syncs, global stores, L2-only (.cg) loads, and
# the K/V cp.async copies.
COMPILE_DECODE_SM90 = textwrap.dedent('''
    import os, re
    os.environ.pop("TRITON_INTERPRET", None)
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from orthros.ops.triton import decode as td

    fn = td._decode_split
    ptrs = dict(Q="*bf16", QO="*bf16", K="*bf16", V="*bf16", SEQ="*i32", OP="*fp32", LP="*fp32", O="*bf16",
                OO="*bf16", CNT="*i32")
    for mode, bs, pdl in ((td._PARTIAL, 2, False), (td._DIRECT, 2, False), (td._INLINE, 16, False),
                          (td._INLINE, 16, True)):
        const = dict(G=4, HQ=32, D=128, BLOCK_D=128, BLOCK_H=16, BLOCK_N=64, PREC="tf32", MERGE=mode, BLOCK_S=bs,
                     UPCAST=False, PDL=pdl)
        sig = {n: ptrs.get(n, "constexpr" if n in const else "fp32" if n == "qk_scale" else "i32")
               for n in fn.arg_names}
        attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names)
                 if sig[n] != "constexpr" and n not in ("window", "qk_scale", "split_len", "NUM_SPLITS")}
        k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=const, attrs=attrs),
                           target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "num_stages": 3})
        lines = k.asm["ptx"].splitlines()
        find = lambda pat: ",".join(str(i) for i, t in enumerate(lines) if re.search(pat, t)) or "-"
        if pdl:  # programmatic dependent launch: wait, then signal, then the first memory access
            first = lambda pat: min([i for i, t in enumerate(lines) if re.search(pat, t)] or [-1])
            print("PDL", first(r"griddepcontrol\\.wait"), first(r"griddepcontrol\\.launch_dependents"),
                  first(r"(ld|st|atom|red)\\.global|cp\\.async"))
            continue
        print("MODE", mode, find(r"atom\\.global\\.gpu\\.acq_rel"), find(r"\\bbar\\.sync"), find(r"\\bst\\.global"),
              find(r"ld\\.global\\.cg"), sum("cp.async.cg.shared.global" in t for t in lines))
    print("OK")
''')


@pytest.mark.skipif(HAS_CUDA, reason="the GPU tests compile and run the kernels there")
def test_split_kernel_compiles_for_sm90_with_ordered_ticket(tmp_path):
    """What the memory ordering of the inline merge rests on, in the compiled code: one
    gpu-scope acq_rel atomic (the ticket), a CTA barrier between every partial store and it, the
    partials read back only after it and only through L2 (.cg), the counter reset last; the
    other modes have no atomic; K/V stay cp.async copies 3 stages deep in every mode."""
    modes = {}
    lines = compile_sm90(COMPILE_DECODE_SM90, tmp_path)
    [(wait, signal, access)] = printed(lines, "PDL")
    assert 0 <= int(wait) < int(signal) < int(access), (wait, signal, access)  # launched early: touches nothing first
    for mode, *cols, cps in printed(lines, "MODE"):
        modes[int(mode)] = [[int(x) for x in c.split(",")] if c != "-" else [] for c in cols] + [int(cps)]
    assert sorted(modes) == [0, 1, 2]
    per_stage = 2 * 64 * 128 * 2 // 16 // (32 * 4)  # 16-byte copies of one K and one V tile per thread
    for mode, (atoms, bars, stores, cg, cps) in modes.items():
        assert cps >= 3 * per_stage, (mode, cps)
        assert (len(atoms) == 1) == (mode == 2) and (cg != []) == (mode == 2), (mode, atoms, cg)
    atoms, bars, stores, cg, _ = modes[2]
    atom = atoms[0]
    before = [s for s in stores if s < atom]
    assert before and any(max(before) < b < atom for b in bars)  # partial stores, barrier, ticket
    assert min(cg) > atom  # partials read after the ticket, from L2
    assert max(stores) > max(cg)  # outputs and the counter reset after the reads


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_gpu_hypothesis_inline_merge(dtype):
    """40 random cases per dtype: inline == separate == reference, counters back to 0."""
    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
    # (G, D, block_n and the split count's power-of-2 bucket select compiled variants: few values)
    @given(B=st.integers(1, 4), Hkv=st.sampled_from([1, 2, 8]), G=st.sampled_from([1, 4, 8]),
           L=st.integers(1, 5000), D=st.sampled_from([80, 128]), w=st.integers(1, 600),
           S=st.sampled_from([None, 1, 2, 3, 16, 33, 64]), bn=st.sampled_from([64, 128]), data=st.data())
    def inner(B, Hkv, G, L, D, w, S, bn, data):
        lens = data.draw(st.lists(st.integers(0, L), min_size=B, max_size=B))
        q, qo, kc, vc, lens = make(B, L, Hkv * G, Hkv, D, lens, dtype=dtype, seed=L)
        cfg = {"block_n": bn} if S is None else {"splits": S, "block_n": bn}
        _check_inline(q, qo, kc, vc, lens, w, cfg, 1e-5 if dtype == torch.float32 else 2e-2)
    inner()


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("S,bn,nw", [(2, 64, 4), (16, 64, 4), (64, 64, 4), (16, 128, 8)])
def test_gpu_inline_merge_graph_replays_and_races(S, bn, nw):
    """The inline step captured in a CUDA graph: lengths changed on the device, many replays
    (each must find its counters at 0), and 300 eager launches back to back equal to the
    first (a memory-ordering bug between the partial stores and the ticket shows as a rare
    wrong row)."""
    from orthros.ops.triton.decode import decode_attention_triton

    B, L, Hq, Hkv, D, w = 8, 4096, 32, 8, 128, 128
    q, qo, kc, vc, lens = make(B, L, Hq, Hkv, D, [4096, 1024, 1, 0, 777, 4095, 2048, 64], dtype=torch.bfloat16)
    cfg = {"splits": S, "merge": "inline", "block_n": bn, "num_warps": nw}
    step = lambda: decode_attention_triton(q, qo, kc, vc, lens, window_size=w, _config=cfg)  # noqa: E731
    first = [x.clone() for x in step()]
    sep = decode_attention_triton(q, qo, kc, vc, lens, window_size=w, _config={**cfg, "merge": "separate"})
    assert all(rel(x, y) < 1e-2 for x, y in zip(first, sep))
    outs = [step() for _ in range(300)]  # queued back to back, compared afterwards
    assert all(torch.equal(x, y) for out in outs for x, y in zip(out, first))
    graph, out = _captured(step)
    for new in ([5, 4096, 2000, 1, 0, 3333, 64, 65], [4096] * 8, [1, 2, 3, 4, 5, 6, 7, 8]):
        lens.copy_(torch.tensor(new, device=DEV, dtype=torch.int32))
        for _ in range(20):
            graph.replay()
        ref = decode_attention_reference(q, qo, kc, vc, lens, window_size=w)
        for x, y in zip(out, ref):
            assert rel(x, y) < 1e-2
    assert int(_counters(q, Hkv).abs().sum()) == 0


def test_decode_config_override_applies_and_restores(monkeypatch):
    """``decode_config`` (the benchmarks' ``--decode-config``) changes the split count the
    heuristic picks inside the block, restores every default afterwards (also on an error), and
    refuses unknown keys and bad values before changing anything."""
    from orthros.benchmarks.inference import parse_decode_config
    from orthros.ops.triton import decode as td
    from orthros.ops.triton.decode import DECODE_CONFIG, decode_config, num_splits

    monkeypatch.setattr(td, "num_sms", lambda device: 132)  # an H200's count, also on the CPU
    dev = torch.device("cpu")
    keep = dict(DECODE_CONFIG)
    base = num_splits(1, 8, 1024, dev)
    assert base == 16  # the default min_split (64): one wave of one-block chunks
    with decode_config(min_split=512):
        assert DECODE_CONFIG["min_split"] == 512
        assert num_splits(1, 8, 1024, dev) == 2
    assert DECODE_CONFIG == keep
    with pytest.raises(RuntimeError), decode_config(merge="inline"):
        assert DECODE_CONFIG["merge"] == "inline"
        raise RuntimeError("inside")
    assert DECODE_CONFIG == keep
    for bad, word in (({"min_spit": 64}, "unknown key"), ({"min_split": 0}, "positive"),
                      ({"min_split": True}, "positive"), ({"merge": "both"}, "allowed"),
                      ({"merge_tail": -1}, ">= 0")):
        with pytest.raises(ValueError, match=word), decode_config(**bad):
            pass
        assert DECODE_CONFIG == keep
    assert parse_decode_config('{"min_split": 64}') == {"min_split": 64}
    for text in ("[1]", "{}", "min_split=64", '{"block_n": "64"}'):
        with pytest.raises(ValueError):
            parse_decode_config(text)
    assert DECODE_CONFIG == keep


# ------------------------------------------------------------ the step from raw QKV projections

def make_qkv(B, L, Hq, Hkv, D, lens, R=2, dtype=torch.float32, seed=0, so=True, norm=True):
    """Raw QKV rows, caches, lengths, RoPE tables and the prologue's parameters."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g).to(DEV, dtype)  # noqa: E731
    u = lambda *s: (torch.rand(*s, generator=g) + 0.5).to(DEV, dtype)  # noqa: E731
    ang = torch.rand(B, 1, D // 2, generator=g) * 6.3
    ang = torch.cat([ang, ang], -1)
    kw = dict(num_heads=Hq, rope=(ang.cos().to(DEV, dtype), ang.sin().to(DEV, dtype)),
              q_norm=u(D) if norm else None, k_norm=u(D) if norm else None, eps=1e-6,
              scale_offset=(u(Hq * D), r(Hq * D), u(Hq * D), r(Hq * D)) if so else (None,) * 4)
    return (r(B, R, (Hq + 2 * Hkv) * D), r(B, L, Hkv, D), r(B, L, Hkv, D),
            torch.tensor(lens, device=DEV, dtype=torch.int64), kw)


def _qkv_both(qkv, kc, vc, lens, kw, **extra):
    """The triton kernel and the reference on copies of the caches: (outputs, caches) of each."""
    from orthros.ops.decode import orthros_decode_qkv_attention

    outs = []
    for backend in ("triton", "reference"):
        k, v = kc.clone(), vc.clone()
        o = orthros_decode_qkv_attention(qkv, k, v, lens, backend=backend, **kw, **extra)
        outs.append((o, k, v))
    return outs


@pytest.mark.parametrize("Hq,Hkv,so,norm", [(4, 1, True, True), (8, 2, False, True), (6, 2, True, False),
                                            (2, 2, False, False)])
def test_qkv_kernel_matches_reference(Hq, Hkv, so, norm, monkeypatch):
    """The prologue (q/k norm, scale-offset, RoPE), the new key from registers, the cache write
    and both streams, against the layer's ops (fp32: to rounding); rows of different lengths
    (0: only the new key; L_max - 1: the last slot), window shorter and longer than the cache,
    every q_rows layout the layer hands over, and NaN-poisoned outputs."""
    real_empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **k: real_empty(*a, **k).fill_(float("nan")))
    B, L, D = 3, 150, 16
    qkv, kc, vc, lens, kw = make_qkv(B, L, Hq, Hkv, D, [149, 70, 0], seed=Hq + Hkv, so=so, norm=norm)
    for rows in ((0, 1), (1, 1), (0, 0)):
        for w in (1, 5, 200):
            (a, ka, va), (b, kb, vb) = _qkv_both(qkv, kc, vc, lens, kw, q_rows=rows, window_size=w)
            assert a.shape == b.shape == (B, 2, Hq, D) and rel(a, b) < 1e-5, (rows, w)
            assert rel(ka, kb) < 1e-6 and torch.equal(va, vb)
            assert not torch.equal(ka, kc)  # the new keys were written


def test_numpy_and_tensor_integers_reach_the_kernels_as_python_ints():
    # check_positive_int takes them since 9efdddd, but the ops passed the value as given: a NumPy num_heads failed
    # inside the Triton kernel ("cannot convert 2 of type numpy.int64 to tensor"), a 0-d tensor with 'is_ptr'
    import numpy as np

    qkv, kc, vc, lens, kw = make_qkv(2, 40, 4, 2, 16, [30, 7])
    (want_kernel, _, _), (want_ref, _, _) = _qkv_both(qkv, kc, vc, lens, kw, window_size=5)
    for n, w in ((np.int64(4), np.int32(5)), (torch.tensor(4), torch.tensor(5))):
        (a, _, _), (b, _, _) = _qkv_both(qkv, kc, vc, lens, {**kw, "num_heads": n}, window_size=w)
        assert torch.equal(a, want_kernel) and torch.equal(b, want_ref)
    q, q_out, k, v, cl = make(2, 40, 4, 2, 16, [30, 7])
    want = orthros_decode_attention(q, q_out, k, v, cl, window_size=5, backend="triton")
    for w in (np.int64(5), torch.tensor(5)):
        got = orthros_decode_attention(q, q_out, k, v, cl, window_size=w, backend="triton")
        assert all(torch.equal(x, y) for x, y in zip(got, want, strict=True))


def test_qkv_kernel_bf16_and_splits():
    """bf16 (the interpreter converts to bf16 by truncation, so to ~1e-2) and explicit split
    counts: the new key folded in by the one program whose chunk holds it."""
    from orthros.ops.triton.decode import decode_qkv_attention_triton
    from orthros.ops.decode import decode_qkv_attention_reference

    B, L, Hq, Hkv, D = 2, 130, 8, 2, 16
    qkv, kc, vc, lens, kw = make_qkv(B, L, Hq, Hkv, D, [129, 64], dtype=torch.bfloat16, seed=3)
    want = decode_qkv_attention_reference(qkv, kc.clone(), vc.clone(), lens, q_rows=(0, 1), window_size=7, **kw)
    for S in (1, 2, 3):
        got = decode_qkv_attention_triton(qkv, kc.clone(), vc.clone(), lens, q_rows=(0, 1), window_size=7,
                                          _config={"splits": S, "block_n": 16}, **kw)
        assert rel(got, want) < 3e-2, S


def test_qkv_kernel_peels_only_behind_a_gemv_that_launches_it_early():
    """The first key block is loaded ahead of the PDL wait only when the QKV GEMV ahead starts
    the kernel early: a PDL launch of PDL_MIN_M..8 rows (the pair at B <= 4), not one row (the
    Transformer's GEMV launches without PDL) nor more than 8 (cuBLAS)."""
    from orthros.ops.triton.common import PDL_MIN_M
    from orthros.ops.triton.decode import _launched_early

    assert _launched_early(True, max(2, PDL_MIN_M)) and _launched_early(True, 8)
    assert not _launched_early(True, PDL_MIN_M - 1) and not _launched_early(True, 9)
    assert not _launched_early(None, 2)


def test_qkv_dispatch_and_validation():
    from orthros.ops.decode import orthros_decode_qkv_attention

    qkv, kc, vc, lens, kw = make_qkv(2, 20, 4, 2, 8, [3, 5])
    base = dict(q_rows=(0, 1), window_size=4, **kw)
    out = orthros_decode_qkv_attention(qkv, kc, vc, lens, backend="sdpa", **base)  # the reference
    assert out.shape == (2, 2, 4, 8)
    for change, match in (({"num_heads": 3}, "multiple of the caches' KV heads"),
                          ({"num_heads": 2}, "last dimension must be"),
                          ({"q_rows": (0, 2)}, "q_rows must be two row indices"),
                          ({"window_size": 0}, "window_size"),
                          ({"q_norm": torch.ones(7)}, "q_norm must be a \\[8\\] weight"),
                          ({"rope": (torch.ones(2, 1, 4), torch.ones(2, 1, 4))}, "RoPE over the whole head"),
                          # these failed unpacking or reading a list's .dim / .shape
                          ({"rope": None}, "rope must be the pair \\(cos, sin\\)"),
                          ({"rope": kw["rope"][:1]}, "rope must be the pair"),
                          ({"rope": (kw["rope"][0].tolist(), kw["rope"][1])}, "rope's cos must be"),
                          ({"q_norm": [1.0] * 8}, "q_norm must be a \\[8\\] weight or None, got list"),
                          ({"scale_offset": (torch.ones(32), None, None, None)}, "alpha and beta must both"),
                          # these failed in tuple() / len() / .numel() of what is no pair or tensor
                          ({"q_rows": 1}, "q_rows must be two row indices"),
                          ({"q_rows": (0, True)}, "q_rows must be two row indices"),  # True was row 1
                          ({"q_rows": (0, 1.0)}, "q_rows must be two row indices"),
                          ({"scale_offset": None}, "scale_offset must be"),
                          ({"scale_offset": (1.0, 2.0, None, None)}, "alpha and beta must both"),
                          ({"backend": "cuda"}, "backend must be one of"),
                          # the prologue's parameters on another device or of an integer dtype: torch's own
                          # device error mid-step (reference) or a pointer of no address for the kernel
                          ({"q_norm": kw["q_norm"].to("meta")}, "q_norm must be on qkv's device .*, got meta"),
                          ({"k_norm": kw["k_norm"].long()}, "k_norm must be a floating-point tensor"),
                          ({"rope": (kw["rope"][0], kw["rope"][1].to("meta"))}, "rope's sin must be on qkv's"),
                          ({"scale_offset": (*kw["scale_offset"][:3], kw["scale_offset"][3].to("meta"))},
                           "scale_offset's beta_f must be on qkv's device")):
        with pytest.raises(ValueError, match=match):
            orthros_decode_qkv_attention(qkv, kc, vc, lens, **{**base, **change})
    with pytest.raises(ValueError, match=r"lens must be .* of shape \[2\] on qkv's device \S+, got torch.int64 "
                                         r"\(1,\) on \S+$"):
        orthros_decode_qkv_attention(qkv, kc, vc, lens[:1], **base)
    with pytest.raises(ValueError, match="lens must be .*got list$"):
        orthros_decode_qkv_attention(qkv, kc, vc, lens.tolist(), **base)
    with pytest.raises(ValueError, match="share one dtype, got torch.float64, torch.float32, torch.float32"):
        orthros_decode_qkv_attention(qkv.double(), kc, vc, lens, **base)
    with pytest.raises(ValueError, match="floating"):
        orthros_decode_qkv_attention(qkv.long(), kc.long(), vc.long(), lens, **base)
    with pytest.raises(ValueError, match="same device"):
        orthros_decode_qkv_attention(qkv, kc.to("meta"), vc.to("meta"), lens, **base)
    with pytest.raises(ValueError, match="L_max >= 1"):
        orthros_decode_qkv_attention(qkv, kc[:, :0], vc[:, :0], lens, **base)
    with pytest.raises(ValueError, match="scale"):
        orthros_decode_qkv_attention(qkv, kc, vc, lens, **{**base, "scale": "1"})
    # an eps < 0 or NaN with q/k norms made the outputs NaN and wrote a NaN key into the cache; a
    # string failed inside the norm. Without norms eps is not read.
    for eps in (-5.0, float("nan"), "1e-6", None):
        k, v = kc.clone(), vc.clone()
        with pytest.raises(ValueError, match="eps must be a finite float >= 0"):
            orthros_decode_qkv_attention(qkv, k, v, lens, **{**base, "eps": eps})
        assert torch.equal(k, kc) and torch.equal(v, vc)
    orthros_decode_qkv_attention(qkv, kc.clone(), vc.clone(), lens, **{**base, "eps": None, "q_norm": None,
                                                                         "k_norm": None})


COMPILE_QKV_SM90 = textwrap.dedent('''
    import os, re
    os.environ.pop("TRITON_INTERPRET", None)
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from orthros.ops.triton import decode as td

    fn = td._decode_split_qkv
    ptrs = dict(QKV="*bf16", K="*bf16", V="*bf16", LENS="*i64", COS="*bf16", SIN="*bf16", QN="*bf16", KN="*bf16",
                AW="*bf16", BW="*bf16", AF="*bf16", BF="*bf16", OP="*fp32", LP="*fp32", O="*bf16", OO="*bf16",
                CNT="*i32")
    floats = ("qk_scale", "eps")
    for peel in (False, True):
        const = dict(G=4, HQ=32, HKV=8, D=128, BLOCK_D=128, BLOCK_H=16, BLOCK_N=64, PREC="tf32", MERGE=td._PARTIAL,
                     BLOCK_S=2, UPCAST=False, HAS_QN=True, HAS_KN=True, HAS_SO=True, PEEL=peel, PDL=True)
        sig = {n: ptrs.get(n, "constexpr" if n in const else "fp32" if n in floats else "i32") for n in fn.arg_names}
        attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names)
                 if sig[n] != "constexpr" and n not in floats + ("window", "split_len", "NUM_SPLITS", "QW_ROW",
                                                                 "QF_ROW", "L_MAX")}
        k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=const, attrs=attrs),
                           target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "num_stages": 3})
        lines = k.asm["ptx"].splitlines()
        at = lambda pat: [i for i, t in enumerate(lines) if re.search(pat, t)]
        wait, signal = min(at(r"griddepcontrol\\.wait")), min(at(r"griddepcontrol\\.launch_dependents"))
        loads = at(r"ld\\.global")
        writes = at(r"(st|atom|red)\\.global|cp\\.async")
        print("PEEL", int(peel), wait, signal, sum(i < wait for i in loads), sum(i > wait for i in loads),
              min(writes), min(at(r"cp\\.async")), sum(".local" in t for t in lines))
    print("OK")
''')


@pytest.mark.skipif(HAS_CUDA, reason="the GPU tests compile and run the kernels there")
def test_qkv_kernel_compiles_for_sm90_loading_ahead_of_its_wait(tmp_path):
    """At the engine's shape, launched with PDL: the wait, then at once the signal; before the
    wait only loads (the row's length, the prologue's parameters and, with PEEL, the first key
    block: more loads there), no store, no cp.async (the pipelined K/V copies) and no spill;
    the queries' and the new key's loads after it."""
    lines = compile_sm90(COMPILE_QKV_SM90, tmp_path)
    rows = {int(p): [int(x) for x in rest] for p, *rest in printed(lines, "PEEL")}
    assert sorted(rows) == [0, 1]
    for peel, (wait, signal, before, after, first_write, first_cp, spills) in rows.items():
        assert wait < signal < first_write and wait < first_cp and spills == 0, (peel, rows[peel])
        assert before > 1 and after > 0
    assert rows[1][2] > rows[0][2]  # the peeled key block is loaded ahead of the wait


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gpu_qkv_kernel_matches_reference_and_replays(dtype):
    """At the engine's shape (GQA 32/8, D = 128, 4K cache; PDL on where the GPU has it): the
    kernel against the reference, its written keys within bf16 rounding of the layer's ops,
    and a CUDA graph of the step replayed at new lengths (the caches restored before each)."""
    from orthros.ops.triton.decode import decode_qkv_attention_triton

    B, L, Hq, Hkv, D, w = 4, 4096, 32, 8, 128, 128
    qkv, kc, vc, lens, kw = make_qkv(B, L, Hq, Hkv, D, [4095, 1000, 0, 2048], dtype=dtype, seed=7)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    (a, ka, va), (b, kb, vb) = _qkv_both(qkv, kc, vc, lens, kw, q_rows=(0, 1), window_size=w)
    assert rel(a, b) < tol and rel(ka, kb) < (1e-6 if dtype == torch.float32 else 4e-3) and torch.equal(va, vb)
    k, v = kc.clone(), vc.clone()
    step = lambda: decode_qkv_attention_triton(qkv, k, v, lens, q_rows=(0, 1), window_size=w, **kw)  # noqa: E731
    graph, out = _captured(step)
    for new in ([5, 4095, 64, 65], [0, 1, 2, 3], [4095] * 4):
        lens.copy_(torch.tensor(new, device=DEV))
        k.copy_(kc)
        v.copy_(vc)
        graph.replay()
        (_, _, _), (ref, kr, _) = _qkv_both(qkv, kc, vc, lens, kw, q_rows=(0, 1), window_size=w)
        assert rel(out, ref) < tol and rel(k, kr) < (1e-6 if dtype == torch.float32 else 4e-3), new

"""Decode step of Orthros attention: reference semantics and the Triton kernel.

The reference is checked against the op's reference (one query at the end of each row's
cache); the Triton kernel (interpreter on CPU, native on GPU) against the reference, on
batches whose rows have different lengths, GQA 1..8, windows longer and shorter than the
cache, and NaN-poisoned outputs. On a GPU the step is also captured in a CUDA graph.
"""

import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

from orthros.ops import orthros_attention_reference  # noqa: E402
from orthros.ops.decode import decode_attention_reference, orthros_decode_attention  # noqa: E402
from conftest import rel  # noqa: E402

DEV = "cuda" if HAS_CUDA else "cpu"
gpu = pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")




def make(B, L_max, Hq, Hkv, D, lens, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g).to(DEV, dtype)  # noqa: E731
    return (r(B, 1, Hq, D), r(B, 1, Hq, D), r(B, L_max, Hkv, D), r(B, L_max, Hkv, D),
            torch.tensor(lens, device=DEV, dtype=torch.int32))


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


def test_dispatch_and_validation():
    q, qo, kc, vc, lens = make(2, 16, 4, 2, 16, [16, 5])
    if not HAS_CUDA:  # CPU: auto is the reference, exactly
        a = orthros_decode_attention(q, qo, kc, vc, lens, window_size=4)
        b = decode_attention_reference(q, qo, kc, vc, lens, window_size=4)
        assert all(torch.equal(x, y) for x, y in zip(a, b))
    with pytest.raises(ValueError, match="window_size"):
        orthros_decode_attention(q, qo, kc, vc, lens, window_size=0)
    with pytest.raises(ValueError, match="cache_seqlens"):
        orthros_decode_attention(q, qo, kc, vc, lens.float(), window_size=3)
    with pytest.raises(ValueError, match="q and q_out"):
        orthros_decode_attention(q, qo[:, :, :2], kc, vc, lens, window_size=3)
    with pytest.raises(ValueError, match="backend"):
        orthros_decode_attention(q, qo, kc, vc, lens, window_size=3, backend="cuda")


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
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        orthros_decode_attention(q, qo, kc, vc, lens, window_size=128)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = orthros_decode_attention(q, qo, kc, vc, lens, window_size=128)
    lens.copy_(torch.tensor([5, 39999, 20000, 1], device=DEV, dtype=torch.int32))
    graph.replay()
    ref = decode_attention_reference(q, qo, kc, vc, lens, window_size=128)
    for x, y in zip(out, ref):
        assert rel(x, y) < 1e-2

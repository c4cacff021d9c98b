"""The GEMV whose input is split partials (``orthros.ops.merge.SplitPartials``: the decode
kernel's per-split results with their base-2 log-sum-exps), merged as the kernel loads them: the
Triton kernel (interpreter on CPU, native on GPU) against the reference merge followed by the
reference GEMV, in every inner form, with split-K, bias and residual, empty splits and heads
spanning several K tiles or several heads in one tile; the torch backends merge first; bad
partials are refused before any launch. On a GPU: a Qwen3-8B ``W_O`` shape in bf16 and a CUDA
graph replay."""

import math
import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

from orthros.ops.gemv import gemv, gemv_ref, merges_partials  # noqa: E402
from orthros.ops.gemv import kernel as gk  # noqa: E402
from orthros.ops.gemv.kernel import GemvConfig, gemv_triton  # noqa: E402
from orthros.ops.merge import SplitPartials, merge_partials  # noqa: E402
from conftest import rel  # noqa: E402

DEV = "cuda" if HAS_CUDA else "cpu"
gpu = pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")

FORMS = {
    "dot": GemvConfig(block_n=16, block_k=32, dot=True),
    "dot-split": GemvConfig(block_n=16, block_k=16, split=2, dot=True),
    "defer": GemvConfig(block_n=8, block_k=64, defer=True),
    "fma-split": GemvConfig(block_n=16, block_k=32, split=3),
}


def partials(lead, H, S, D, seed=0, empty=True):
    """Random partials; with ``empty`` the first split of every head holds no keys (lse -inf, o 0)
    and one head's splits are all empty (its merged row is 0)."""
    g = torch.Generator().manual_seed(seed)
    o = torch.randn(*lead, H, S, D, generator=g)
    lse = torch.randn(*lead, H, S, generator=g) * 4
    if empty and S > 1:
        lse[..., 0] = float("-inf")
        o[..., 0, :] = 0
        lse[..., H - 1, :] = float("-inf")
    return SplitPartials(o.to(DEV), lse.to(DEV))


def test_merge_is_the_base_e_merge_of_base_2_lse():
    p = partials((2, 1), 3, 4, 8, empty=False)
    got = p.merge(torch.float32)
    w = torch.softmax(p.lse * math.log(2.0), dim=-1)  # 2^lse normalised over the splits
    assert torch.allclose(got, (w.unsqueeze(-1) * p.o).sum(-2), atol=1e-6)
    o, _ = merge_partials(p.o.movedim(-2, 0), p.lse.movedim(-1, 0) * math.log(2.0))
    assert torch.equal(got, o)
    empty = partials((1,), 2, 3, 4)  # head 1: every split empty -> 0, never NaN
    assert torch.equal(empty.merge(torch.float32)[:, 1], torch.zeros(1, 4, device=DEV))
    assert torch.equal(p.take((slice(None), slice(0, 1))).o, p.o[:, :1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("lead,H,S,D", [((1, 2), 4, 3, 16), ((2, 1), 2, 5, 32), ((3,), 3, 1, 16), ((1,), 3, 2, 64)])
def test_triton_merges_as_the_reference(lead, H, S, D, form, dtype):
    p = partials(lead, H, S, D, seed=H * 10 + S)
    g = torch.Generator().manual_seed(1)
    N = 40
    w = torch.randn(N, H * D, generator=g).to(DEV, dtype)
    b = torch.randn(N, generator=g).to(DEV, dtype)
    res = torch.randn(*lead, N, generator=g).to(DEV, dtype)
    want = gemv_ref(p.merge(dtype).flatten(-2), w, b, residual=res)
    got = gemv_triton(p.o, w, b, lse=p.lse, residual=res, config=FORMS[form])
    assert got.dtype == dtype and got.shape == (*lead, N)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    assert rel(got, want) < tol, (form, rel(got, want))


def test_strided_rows_of_one_stream():
    """The rows of one stream of a ``[B, 2, H, S, D]`` buffer (what the decode view keeps of a
    layer without the other stream): strided rows, contiguous within."""
    p = partials((2, 2), 2, 3, 16, seed=3)
    one = p.take((slice(None), slice(1, 2)))
    w = torch.randn(24, 32).to(DEV)
    want = gemv_ref(one.merge(torch.float32).flatten(-2), w)
    assert rel(gemv(one, w, backend="triton"), want) < 1e-5


@pytest.mark.parametrize("backend", ["torch", "naive"])
def test_torch_backends_merge_first(backend):
    p = partials((1, 2), 2, 3, 8, seed=5)
    w = torch.randn(12, 16).to(DEV)
    want = gemv(p.merge(torch.float32).flatten(-2), w, backend=backend)
    assert torch.equal(gemv(p, w, backend=backend), want)


def test_bad_partials_are_refused_before_any_launch(monkeypatch):
    monkeypatch.setattr(gk, "_gemv_kernel", None)  # a launch would raise TypeError, not ValueError
    p = partials((1, 2), 2, 3, 8)
    w = torch.randn(12, 16).to(DEV)
    with pytest.raises(ValueError, match="lse must be o's shape"):
        gemv(SplitPartials(p.o, p.lse[..., :2]), w, backend="triton")
    with pytest.raises(ValueError, match="must be float32"):
        gemv(SplitPartials(p.o.half(), p.lse), w, backend="triton")
    with pytest.raises(ValueError, match=r"weight must be \[N, K\] with K = x.shape\[-1\] = 16"):
        gemv(p, torch.randn(12, 24).to(DEV), backend="triton")
    with pytest.raises(ValueError, match="takes no prologue"):
        gemv(p, w, backend="triton", norm_weight=torch.ones(16, device=DEV), norm_eps=1e-6)
    with pytest.raises(ValueError, match="residual must be None or a tensor of the output's shape"):
        gemv(p, w, backend="triton", residual=torch.zeros(1, 12, device=DEV))
    with pytest.raises(ValueError, match="at most 8 rows|1..8 rows"):
        gemv_triton(torch.zeros(9, 2, 3, 8, device=DEV), w, lse=torch.zeros(9, 2, 3, device=DEV))
    with pytest.raises(ValueError, match="power-of-two head size, got D = 12"):
        gemv_triton(torch.zeros(1, 2, 3, 12, device=DEV), torch.randn(12, 24).to(DEV),
                    lse=torch.zeros(1, 2, 3, device=DEV))
    with pytest.raises(ValueError, match="contiguous in"):
        o = torch.zeros(1, 2, 8, 3, device=DEV).transpose(-1, -2)
        gemv_triton(o, w, lse=torch.zeros(1, 2, 3, device=DEV))


def test_merges_partials_policy(monkeypatch):
    import orthros.ops.gemv as g

    assert not merges_partials(2, 128, "cpu")  # the interpreter's GEMV is no faster: keep the merge launch
    monkeypatch.setattr(g, "MERGE_PARTIALS", True)
    assert g.merges_partials(2, 128, "cuda") == g._HAS_TRITON and not g.merges_partials(9, 128, "cuda")
    assert not g.merges_partials(2, 128, "cuda", "torch") and not g.merges_partials(2, 96, "cuda")
    monkeypatch.setattr(g, "MERGE_PARTIALS", False)  # ORTHROS_GEMV_MERGE=0
    assert not g.merges_partials(2, 128, "cuda")


# ------------------------------------------------------------------------------ GPU


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 2, 4])
def test_gpu_bf16_o_proj_shape(M):
    """Qwen3-8B's W_O (4096 x 4096, 32 heads of 128) after a 1K-span decode split in 16, with the
    residual, from the table's config (what the engine runs), against the merge and cuBLAS."""
    p = partials((M,), 32, 16, 128, seed=M)
    g = torch.Generator().manual_seed(7)
    w = (torch.randn(4096, 4096, generator=g) / 64).to(DEV, torch.bfloat16)
    res = torch.randn(M, 4096, generator=g).to(DEV, torch.bfloat16)
    x = p.merge(torch.bfloat16).flatten(-2)
    want = gemv_ref(x, w, residual=res)
    got = gemv(p, w, backend="auto", residual=res)
    assert rel(got, want) < 1e-2
    assert rel(got, want) <= 2 * rel(torch.nn.functional.linear(x, w) + res, want) + 1e-3


@gpu
@pytest.mark.gpu
def test_gpu_graph_replay_reads_new_partials():
    p = partials((2,), 32, 16, 128, seed=1)
    w = (torch.randn(4096, 4096) / 64).to(DEV, torch.bfloat16)
    gemv(p, w)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = gemv(p, w)
    q = partials((2,), 32, 16, 128, seed=2)
    p.o.copy_(q.o)
    p.lse.copy_(q.lse)
    graph.replay()
    assert rel(out, gemv_ref(q.merge(torch.bfloat16).flatten(-2), w)) < 1e-2

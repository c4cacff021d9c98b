"""The fused prologues / epilogue of orthros.ops.gemv (RMSNorm before the GEMV, SiLU-and-multiply
before it, a residual added after it): the reference against the layers' own modules (the
specification is "what the layers compute today"), the "torch" backend against the same, the
triton kernel (interpreter on CPU) against the reference within the dtype's rounding, the
custom op under torch.compile, and the argument refusals on every backend."""

import os

import pytest
import torch
import torch.nn.functional as F

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

from orthros.layers.common import RMSNorm, SwiGLUMLP  # noqa: E402
from orthros.ops.gemv import GEMV_BACKENDS, gemv, gemv_ref, prologue_ref  # noqa: E402
from conftest import rel  # noqa: E402

DEV = "cuda" if HAS_CUDA else "cpu"
gpu = pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
BUILT = ("auto", "torch", "naive")  # the triton prologues: next commit
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def rnd(*shape, dtype=torch.float32, seed=0, scale=1.0, shift=0.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale + shift).to(DEV, dtype)


def norm_module(K, dtype, seed=1, eps=1e-6):
    m = RMSNorm(K, eps=eps).to(DEV, dtype)
    with torch.no_grad():
        m.weight.copy_(rnd(K, dtype=dtype, seed=seed, scale=0.3, shift=1.0))
    return m


def mlp_module(H, I, dtype, seed=2):
    torch.manual_seed(seed)
    m = SwiGLUMLP(H, I).to(DEV, dtype)
    m.fuse_projections()
    return m


# ------------------------------------------------------------------ the specification


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_prologues_are_the_layers_ops_bit_for_bit(dtype):
    x = rnd(3, 40, dtype=dtype, seed=3, scale=2.0)
    norm = norm_module(40, dtype)
    with torch.no_grad():
        assert torch.equal(prologue_ref(x, norm.weight, norm.eps), norm(x))
        gu = rnd(3, 2 * 24, dtype=dtype, seed=4, scale=2.0)
        gate, up = gu.split(24, dim=-1)
        mlp = mlp_module(40, 24, dtype)
        assert torch.equal(prologue_ref(gu, act="silu"), mlp.act_fn(gate) * up)
    assert prologue_ref(x) is x


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_torch_backend_is_the_layers_unfused_computation(dtype):
    """"torch" = exactly what the layers run now: RMSNorm, F.linear, SwiGLU's act and product,
    down_proj, the residual adds."""
    H, I, N = 48, 40, 56
    h = rnd(2, 1, H, dtype=dtype, seed=5)  # [B, T, H]: leading dims kept
    norm = norm_module(H, dtype)
    mlp = mlp_module(H, I, dtype)
    wq = rnd(N, H, dtype=dtype, seed=6, scale=H ** -0.5)
    with torch.no_grad():
        assert torch.equal(gemv(h, wq, backend="torch", norm_weight=norm.weight, norm_eps=norm.eps),
                           F.linear(norm(h), wq))
        gu = F.linear(norm(h), mlp.gate_up_fused)  # the fused [gate; up] GEMM's output
        want = h + mlp(norm(h))  # ResidualMLP.post_attention without the mixer
        got = gemv(gu, mlp.down_proj.weight, backend="torch", act="silu", residual=h)
        assert torch.equal(got, want)
        a = rnd(2, 1, H, dtype=dtype, seed=7)
        wo = rnd(H, H, dtype=dtype, seed=8, scale=H ** -0.5)
        assert torch.equal(gemv(a, wo, backend="torch", residual=h), h + F.linear(a, wo))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reference_rounds_like_eager(dtype):
    """The reference: prologue in the layers' ops, product in fp32, rounded to x.dtype, then
    + residual in x.dtype; and every backend within the dtype's tolerance of the float64 product."""
    M, K, N = 3, 72, 40
    x = rnd(M, K, dtype=dtype, seed=9, scale=3.0)
    w = rnd(N, K, dtype=dtype, seed=10, scale=K ** -0.5)
    b = rnd(N, dtype=dtype, seed=11)
    r = rnd(M, N, dtype=dtype, seed=12)
    nw = rnd(K, dtype=dtype, seed=13, shift=1.0)
    y = gemv_ref(x, w, b, norm_weight=nw, norm_eps=1e-5)
    assert y.dtype == dtype
    assert torch.equal(gemv_ref(x, w, b, norm_weight=nw, norm_eps=1e-5, residual=r), r + y)
    xp = prologue_ref(x, nw, 1e-5)
    exact = xp.double() @ w.double().T + b.double()
    for backend in BUILT:
        got = gemv(x, w, b, backend, norm_weight=nw, norm_eps=1e-5)
        assert rel(got, exact) < TOL[dtype], backend
    gu = rnd(M, 2 * K, dtype=dtype, seed=14, scale=2.0)
    exact = (prologue_ref(gu, act="silu").double() @ w.double().T).to(dtype).double() + r.double()
    for backend in BUILT:
        assert rel(gemv(gu, w, backend=backend, act="silu", residual=r), exact) < TOL[dtype], backend


def test_the_norm_is_applied_not_skipped():
    """A reference without the norm (or the silu, or the residual) would fail these."""
    x = rnd(2, 64, seed=15, scale=5.0, shift=2.0)
    w = rnd(32, 64, seed=16)
    nw = rnd(64, seed=17, shift=1.0)
    plain = gemv(x, w, backend="naive")
    assert rel(gemv(x, w, backend="naive", norm_weight=nw, norm_eps=1e-6), plain) > 0.3
    gu = rnd(2, 128, seed=18)
    assert rel(gemv(gu, w, backend="naive", act="silu"), gemv(gu[:, 64:], w, backend="naive")) > 0.3
    r = rnd(2, 32, seed=19)
    assert rel(gemv(x, w, backend="naive", residual=r) - r, plain) < 1e-6


# ------------------------------------------------------------------ refusals


def _bad_cases():
    x = rnd(2, 16, seed=20)
    w = rnd(8, 16, seed=21)
    nw = rnd(16, seed=22)
    r = rnd(2, 8, seed=23)
    return [
        ("act unknown", dict(x=x, weight=w, act="gelu"), "act must be one of \\(None, 'silu'\\), got 'gelu'"),
        ("norm and act", dict(x=torch.cat([x, x], -1), weight=w, norm_weight=nw, norm_eps=1e-6, act="silu"),
         "mutually exclusive"),
        ("eps without norm", dict(x=x, weight=w, norm_eps=1e-6), "norm_eps=1e-06 was given without norm_weight"),
        ("norm without eps", dict(x=x, weight=w, norm_weight=nw), "norm_eps must be a finite float >= 0"),
        ("negative eps", dict(x=x, weight=w, norm_weight=nw, norm_eps=-1.0), "norm_eps must be a finite float"),
        ("eps nan", dict(x=x, weight=w, norm_weight=nw, norm_eps=float("nan")), "norm_eps must be a finite float"),
        ("eps bool", dict(x=x, weight=w, norm_weight=nw, norm_eps=True), "norm_eps must be a finite float"),
        ("norm shape", dict(x=x, weight=w, norm_weight=rnd(8), norm_eps=1e-6),
         "norm_weight must be None or a tensor \\[K\\] = \\[16\\]"),
        ("norm 2-D", dict(x=x, weight=w, norm_weight=nw[None], norm_eps=1e-6), "norm_weight must be None or a tensor"),
        ("norm int", dict(x=x, weight=w, norm_weight=nw.int(), norm_eps=1e-6), "norm_weight must be a floating-point"),
        ("silu odd width", dict(x=x[:, :15], weight=w, act="silu"), "act='silu' needs x \\[..., 2K\\]"),
        ("silu x not 2K", dict(x=x, weight=w, act="silu"), "x.shape\\[-1\\] = 32; got x \\(2, 16\\)"),
        ("residual shape", dict(x=x, weight=w, residual=r[:1]), "residual must be None or a tensor of the output's"),
        ("residual leading dims", dict(x=x, weight=w, residual=r.view(2, 1, 8)), "shape \\(2, 8\\)"),
        ("residual dtype", dict(x=x, weight=w, residual=r.double()), "residual must have x's dtype"),
        ("K mismatch", dict(x=x, weight=rnd(8, 15)), "weight must be \\[N, K\\] with K = x.shape\\[-1\\] = 16"),
    ]


@pytest.mark.parametrize("backend", GEMV_BACKENDS)
@pytest.mark.parametrize("case", _bad_cases(), ids=lambda c: c[0])
def test_bad_arguments_refused_on_every_backend(case, backend, monkeypatch):
    from orthros.ops.gemv import kernel as gk

    _, kw, message = case
    launched = []

    class Spy:
        def __getitem__(self, grid):
            launched.append(grid)
            raise AssertionError("launched")

    monkeypatch.setattr(gk, "_gemv_kernel", Spy())
    monkeypatch.setattr(gk, "_gemv_reduce", Spy())
    with pytest.raises(ValueError, match=message):
        gemv(**kw, backend=backend)
    assert not launched

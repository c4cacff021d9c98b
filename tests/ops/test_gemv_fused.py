"""The fused prologues / epilogue of orthros.ops.gemv (RMSNorm before the GEMV, SiLU-and-multiply
before it, a residual added after it): the reference against the layers' own modules (the
specification is "what the layers compute today"), the "torch" backend against the same, the
triton kernel (interpreter on CPU) against the reference within the dtype's rounding, the
custom op under torch.compile, and the argument refusals on every backend."""

import pytest
import torch
import torch.nn.functional as F

# the plain GEMV's test module sets up the interpreter on CPU and holds the shared pieces
from test_gemv import DEV, TOL, gpu, nan_empty, refuse_launches  # noqa: F401  (nan_empty: a fixture)
from orthros.layers.common import RMSNorm, SwiGLUMLP
from orthros.ops.gemv import GEMV_BACKENDS, gemv, gemv_ref, prologue_ref
from orthros.ops.gemv.kernel import GemvConfig, gemv_triton
from conftest import rel


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
    for backend in GEMV_BACKENDS:
        got = gemv(x, w, b, backend, norm_weight=nw, norm_eps=1e-5)
        assert rel(got, exact) < TOL[dtype], backend
    gu = rnd(M, 2 * K, dtype=dtype, seed=14, scale=2.0)
    exact = (prologue_ref(gu, act="silu").double() @ w.double().T).to(dtype).double() + r.double()
    for backend in GEMV_BACKENDS:
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


# ------------------------------------------------------------------ the triton kernel

FMA = GemvConfig(block_n=16, block_k=32)
FMA_SPLIT = GemvConfig(block_n=32, block_k=16, split=3)
DOT = GemvConfig(block_n=16, block_k=32, dot=True)
DOT_SPLIT = GemvConfig(block_n=16, block_k=16, split=2, dot=True)
DEFER = GemvConfig(block_n=16, block_k=32, defer=True)
DEFER_SPLIT = GemvConfig(block_n=32, block_k=16, split=3, defer=True)
CFGS = {"fma": FMA, "fma-split3": FMA_SPLIT, "dot": DOT, "dot-split2": DOT_SPLIT, "defer": DEFER,
        "defer-split3": DEFER_SPLIT}


def fused_case(kind, M, N, K, dtype, seed, bias=False):
    """Arguments of one fused call: x (scaled away from 1 so that the norm matters), weight, and
    the prologue / residual arguments of ``kind``."""
    x = rnd(M, 2 * K if kind == "silu" else K, dtype=dtype, seed=seed, scale=3.0, shift=0.5)
    w = rnd(N, K, dtype=dtype, seed=seed + 1, scale=K ** -0.5)
    kw = {"bias": rnd(N, dtype=dtype, seed=seed + 2) if bias else None}
    if kind in ("norm", "norm+res"):
        kw.update(norm_weight=rnd(K, dtype=dtype, seed=seed + 3, scale=0.3, shift=1.0), norm_eps=1e-6)
    if kind == "silu":
        kw.update(act="silu")
    if kind in ("res", "norm+res", "silu"):
        kw.update(residual=rnd(M, N, dtype=dtype, seed=seed + 4))
    return x, w, kw


@pytest.mark.parametrize("cfg", list(CFGS), ids=list(CFGS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("M", [1, 2, 3])
@pytest.mark.parametrize("kind", ["norm+res", "silu", "res"])  # norm alone: the tests below
def test_triton_fused_matches_reference(kind, M, dtype, cfg, nan_empty):
    """K = 40: not a multiple of any block_k here (ragged last tile, and a split of its own)."""
    x, w, kw = fused_case(kind, M, 36, 40, dtype, seed=M * 10 + len(kind))
    y = gemv_triton(x, w, config=CFGS[cfg], **kw)
    ref = gemv_ref(x, w, **kw)
    assert y.shape == (M, 36) and y.dtype == dtype
    assert rel(y, ref) < TOL[dtype], (kind, M, cfg)
    # against the float64 product of the reference's (rounded) inputs too
    exact = prologue_ref(x, kw.get("norm_weight"), kw.get("norm_eps"), kw.get("act")).double() @ w.double().T
    if "residual" in kw:
        exact = exact + kw["residual"].double()
    assert rel(y, exact) < TOL[dtype]


@pytest.mark.parametrize("cfg", ["fma", "dot-split2", "defer"])
@pytest.mark.parametrize("kind", ["norm+res", "silu"])
def test_triton_fused_even_k_bias_and_leading_dims(kind, cfg, nan_empty):
    """K = 64 (whole tiles: the unmasked loads), a bias, [B, T, *] leading dims, fp16."""
    x, w, kw = fused_case(kind, 2, 24, 64, torch.float16, seed=7, bias=True)
    x3 = x.view(2, 1, -1)
    if "residual" in kw:
        kw["residual"] = kw["residual"].view(2, 1, 24)
    y = gemv_triton(x3, w, config=CFGS[cfg], **kw)
    assert y.shape == (2, 1, 24)
    assert rel(y, gemv_ref(x3, w, **kw)) < TOL[torch.float16]


@pytest.mark.parametrize("cfg", ["fma", "dot-split2", "defer"])
@pytest.mark.parametrize("kind", ["norm+res", "silu"])
def test_triton_fused_eight_rows(kind, cfg, nan_empty):
    """M = 8 (the kernel's most rows: the rstd of every row reaches its row of the padded dot tile)."""
    x, w, kw = fused_case(kind, 8, 20, 40, torch.float32, seed=21)
    assert rel(gemv_triton(x, w, config=CFGS[cfg], **kw), gemv_ref(x, w, **kw)) < 1e-5


def test_triton_fused_table_config_strided_rows_and_split_determinism():
    """gemv(backend="triton") (the custom op, the table's config) on x rows with a stride, and a
    residual with one; split-K is deterministic."""
    K, N = 48, 40
    wide = rnd(3, 2 * K + 10, seed=30, scale=2.0)
    gu = wide[:, 4:4 + 2 * K]  # [gate | up] rows with stride 2K + 10
    w = rnd(N, K, seed=31, scale=K ** -0.5)
    rwide = rnd(3, N + 3, seed=32)
    r = rwide[:, :N]
    y = gemv(gu, w, backend="triton", act="silu", residual=r)
    assert rel(y, gemv_ref(gu, w, act="silu", residual=r)) < 1e-5
    x, nw = wide[:, :K], rnd(K, seed=33, shift=1.0)
    a = gemv_triton(x, w, config=FMA_SPLIT, norm_weight=nw, norm_eps=1e-5, residual=r)
    assert torch.equal(a, gemv_triton(x, w, config=FMA_SPLIT, norm_weight=nw, norm_eps=1e-5, residual=r))
    assert rel(a, gemv_ref(x, w, norm_weight=nw, norm_eps=1e-5, residual=r)) < 1e-5


@pytest.mark.parametrize("cfg", [GemvConfig(block_n=16, block_k=16, split=4), GemvConfig(block_n=16, block_k=16),
                                 GemvConfig(block_n=16, block_k=16, defer=True),
                                 GemvConfig(block_n=16, block_k=16, dot=True)],
                         ids=["split4-two-pass", "fma-late", "defer-late", "dot-late"])
def test_triton_norm_uses_the_whole_row(cfg):
    """Every split's rstd covers all of K: scaling one K slice of x (the last split's, or the last
    tile of the late norm's loop, which sums x^2 as it goes) changes every output."""
    from orthros.ops.gemv.kernel import late_norm

    assert late_norm(cfg, cfg.split, torch.float32) == (cfg.split == 1)
    x, w, kw = fused_case("norm", 2, 16, 64, torch.float32, seed=40)
    x2 = x.clone()
    x2[:, 48:] *= 10.0  # only the last split's slice (split 4 of 16), the last of 4 tiles
    outs = [gemv_triton(xx, w, config=cfg, **kw) for xx in (x, x2)]
    for xx, y in zip((x, x2), outs):
        assert rel(y, gemv_ref(xx, w, **kw)) < 1e-5
    assert (outs[0][:, :] - outs[1][:, :]).abs().min() > 0  # the rstd moved every output


def test_late_norm_only_where_it_is_safe():
    """One K slice only (a split sees part of each row), and not the fp16 tensor-core form (its
    operand x * norm_weight is not normalised and could leave fp16's range)."""
    from orthros.ops.gemv.kernel import late_norm

    for dt in (torch.float32, torch.bfloat16, torch.float16):
        assert late_norm(FMA, 1, dt) and late_norm(DEFER, 1, dt) and not late_norm(FMA, 3, dt)
        assert late_norm(DOT, 1, dt) == (dt != torch.float16) and not late_norm(DOT, 2, dt)


# ------------------------------------------------------------------ the output's norm (out_norm_weight)

NORM_OUT_CFGS = {"fma-split3": FMA_SPLIT, "dot-split2": DOT_SPLIT, "defer-split3": DEFER_SPLIT}


def norm_out_case(M, N, K, dtype, seed, bias=True):
    x, w, kw = fused_case("res", M, N, K, dtype, seed, bias=bias)
    kw["residual"] = kw["residual"] * 4.0  # rows far from unit RMS: the norm matters
    return x, w, kw, rnd(N, dtype=dtype, seed=seed + 5, scale=0.3, shift=1.0)


@pytest.mark.parametrize("cfg", list(NORM_OUT_CFGS), ids=list(NORM_OUT_CFGS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("M", [1, 2, 3, 8])
def test_triton_norm_out_is_the_rmsnorm_of_the_output(M, dtype, cfg, nan_empty):
    """With split-K the reduce also writes ``rms_norm(y)``: ``y`` bit for bit the launch's without
    it, ``yn`` the RMSNorm module's output of that ``y`` (N = 36: a row shorter than the
    program's power-of-two tile, whose padding must not enter the mean of squares)."""
    x, w, kw, onw = norm_out_case(M, 36, 40, dtype, seed=M * 7)
    y, yn = gemv_triton(x, w, config=NORM_OUT_CFGS[cfg], out_norm_weight=onw, out_norm_eps=1e-6, **kw)
    assert torch.equal(y, gemv_triton(x, w, config=NORM_OUT_CFGS[cfg], **kw))
    assert rel(y, gemv_ref(x, w, **kw)) < TOL[dtype]
    norm = norm_module(36, dtype)
    with torch.no_grad():
        norm.weight.copy_(onw)
        want = norm(y)
    assert yn.shape == y.shape and yn.dtype == dtype
    # the same roundings as the module; the mean of squares is summed in another order (fp32)
    assert rel(yn, want) < (1e-6 if dtype == torch.float32 else TOL[dtype])
    if dtype == torch.bfloat16:
        assert (yn == want).float().mean() > 0.95
    assert rel(yn, y) > 0.3  # normalised, not a copy of y


def test_norm_out_needs_split_k_and_the_dispatcher_knows_where():
    """``gemv`` returns ``(y, yn)`` with ``out_norm_weight``: ``yn`` from the reduce where the
    table's config splits K (norm_out_fused), ``None`` where the triton launch has no reduce, the
    norm itself on the torch and naive backends; an explicit config without split-K is refused."""
    from orthros.ops.gemv import kernel

    x, w, kw, onw = norm_out_case(2, 64, 2048, torch.float32, seed=70, bias=False)
    assert kernel.norm_out_fused(2, 64, 2048) and not kernel.norm_out_fused(2, 64, 40)
    assert not kernel.norm_out_fused(2, kernel.NORM_OUT_MAX_N + 1, 2048)
    y, yn = gemv(x, w, backend="triton", out_norm_weight=onw, out_norm_eps=1e-5, **kw)
    want = prologue_ref(y, onw, 1e-5)
    assert rel(yn, want) < 1e-6 and rel(y, gemv_ref(x, w, **kw)) < 1e-5
    for backend in ("torch", "naive"):
        y2, yn2 = gemv(x, w, backend=backend, out_norm_weight=onw, out_norm_eps=1e-5, **kw)
        assert torch.equal(yn2, prologue_ref(y2, onw, 1e-5)) and rel(yn2, yn) < 1e-5
    xs, ws, kws, onws = norm_out_case(2, 36, 40, torch.float32, seed=71)
    ys, none = gemv(xs, ws, backend="triton", out_norm_weight=onws, out_norm_eps=1e-5, **kws)
    assert none is None and rel(ys, gemv_ref(xs, ws, **kws)) < 1e-5
    with pytest.raises(ValueError, match="out_norm_weight: the output's RMSNorm is computed by the split-K reduce"):
        gemv_triton(xs, ws, config=FMA, out_norm_weight=onws, out_norm_eps=1e-5, **kws)


def test_norm_out_off_by_environment(monkeypatch):
    """``ORTHROS_GEMV_NORM_OUT=0`` (kernel.NORM_OUT, read at import): never fused, ``yn`` None."""
    from orthros.ops.gemv import kernel

    monkeypatch.setattr(kernel, "NORM_OUT", False)
    assert not kernel.norm_out_fused(2, 64, 2048)
    x, w, kw, onw = norm_out_case(2, 64, 2048, torch.float32, seed=72, bias=False)
    assert gemv(x, w, backend="triton", out_norm_weight=onw, out_norm_eps=1e-5, **kw)[1] is None


def test_opcheck_norm_out():
    # K = 2048: the table's config splits K (4 x 512) for 16 output rows
    x, w, r, onw = rnd(2, 2048, seed=73), rnd(16, 2048, seed=74), rnd(2, 16, seed=75), rnd(16, seed=76, shift=1.0)
    torch.library.opcheck(torch.ops.orthros.gemv_norm_out.default, (x, w, None, None, 0.0, "", r, onw, 1e-6))


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
        ("out eps without norm", dict(x=x, weight=w, out_norm_eps=1e-6),
         "out_norm_eps=1e-06 was given without out_norm_weight"),
        ("out norm shape K", dict(x=x, weight=w, out_norm_weight=nw, out_norm_eps=1e-6),
         "out_norm_weight must be None or a tensor \\[N\\] = \\[8\\]"),
        ("out norm without eps", dict(x=x, weight=w, out_norm_weight=r[0]), "out_norm_eps must be a finite float"),
        # mixed dtypes: torch's own "expected m1 and m2 to have the same dtype" came mid-call before
        ("x bf16, weight fp32", dict(x=x.bfloat16(), weight=w.float()),
         "x and weight must share one dtype.* got x torch.bfloat16, weight torch.float32"),
        ("x fp32, weight fp16", dict(x=x.float(), weight=w.half()), "got x torch.float32, weight torch.float16"),
        ("int x and weight", dict(x=x.int(), weight=w.int()), "a floating-point one, got x torch.int32"),
        ("bias dtype", dict(x=x.float(), weight=w.float(), bias=r[0].bfloat16()),
         "bias must have x's dtype torch.float32 .*got torch.bfloat16"),
        ("norm weight promotes x", dict(x=x.bfloat16(), weight=w.bfloat16(), norm_weight=nw.float(), norm_eps=1e-6),
         "norm_weight's dtype torch.float32 would promote the normalised x to torch.float32"),
        # a tensor on another device (meta: no second device needed)
        ("weight device", dict(x=x, weight=w.to("meta")), "weight must be on x's device .*, got meta"),
        ("bias device", dict(x=x, weight=w, bias=r[0].to("meta")), "bias must be on x's device"),
        ("norm device", dict(x=x, weight=w, norm_weight=nw.to("meta"), norm_eps=1e-6), "norm_weight must be on x's"),
        ("residual device", dict(x=x, weight=w, residual=r.to("meta")), "residual must be on x's device"),
        ("out norm device", dict(x=x, weight=w, out_norm_weight=r[0].to("meta"), out_norm_eps=1e-6),
         "out_norm_weight must be on x's device"),
    ]


@pytest.mark.parametrize("backend", GEMV_BACKENDS)
@pytest.mark.parametrize("case", _bad_cases(), ids=lambda c: c[0])
def test_bad_arguments_refused_on_every_backend(case, backend, monkeypatch):
    _, kw, message = case
    launched = refuse_launches(monkeypatch)
    with pytest.raises(ValueError, match=message):
        gemv(**kw, backend=backend)
    assert not launched


# ------------------------------------------------------------------ the custom op


def _layer_tail(h, nw, w_in, w_out, gu, w_down, backend="triton"):
    """Three fused sites in a row, as a layer step would call them."""
    a = gemv(h, w_in, backend=backend, norm_weight=nw, norm_eps=1e-6)
    h2 = gemv(a, w_out, backend=backend, residual=h)
    return gemv(gu, w_down, backend=backend, act="silu", residual=h2)


def _tail_args(dtype=torch.float32):
    H, I = 16, 12
    return (rnd(2, H, dtype=dtype, seed=50), rnd(H, dtype=dtype, seed=51, shift=1.0),
            rnd(H, H, dtype=dtype, seed=52, scale=0.25), rnd(H, H, dtype=dtype, seed=53, scale=0.25),
            rnd(2, 2 * I, dtype=dtype, seed=54), rnd(H, I, dtype=dtype, seed=55, scale=0.3))


def test_compiled_region_sees_one_opaque_node_per_call():
    """torch.compile(fullgraph=True) of gemv calls with every prologue: no graph break, each call
    one orthros::gemv node, and the compiled result equals the eager one (dynamo's graph, and
    AOTAutograd's through the fake implementation)."""
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    args = _tail_args()
    eager = _layer_tail(*args)
    assert rel(eager, _layer_tail(*args, backend="naive")) < 1e-5
    torch._dynamo.reset()
    assert torch.equal(torch.compile(_layer_tail, backend=record, fullgraph=True)(*args), eager)
    (gm,) = graphs
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert targets == [torch.ops.orthros.gemv.default] * 3
    torch._dynamo.reset()
    assert torch.equal(torch.compile(_layer_tail, backend="aot_eager", fullgraph=True)(*args), eager)
    # "auto" traces too (its choice of backend is made on the host, no graph break)
    auto = lambda *a: _layer_tail(*a, backend="auto")  # noqa: E731
    torch._dynamo.reset()
    assert torch.equal(torch.compile(auto, backend="eager", fullgraph=True)(*args), auto(*args))


def test_opcheck():
    """torch.library.opcheck: schema, fake tensor, autograd registration and AOT dispatch of
    orthros::gemv, through the interpreter on CPU (the kernel on a GPU)."""
    x, w, nw, r = rnd(2, 16, seed=60), rnd(8, 16, seed=61), rnd(16, seed=62), rnd(2, 8, seed=63)
    for args in [(x, w, None, nw, 1e-6, "", r), (rnd(2, 32, seed=64), w, rnd(8, seed=65), None, 0.0, "silu", None),
                 (x.bfloat16(), w.bfloat16(), None, None, 0.0, "", r.bfloat16())]:
        torch.library.opcheck(torch.ops.orthros.gemv.default, args)


def test_fake_impl_refuses_bad_shapes_at_trace_time():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x, w, r = torch.empty(2, 16), torch.empty(8, 16), torch.empty(2, 7)
        assert torch.ops.orthros.gemv.default(x, w, None, None, 0.0, "", None).shape == (2, 8)
        with pytest.raises(ValueError, match="residual must be None or a tensor of the output's shape"):
            torch.ops.orthros.gemv.default(x, w, None, None, 0.0, "", r)


# ------------------------------------------------------------------------------ GPU

# Qwen3-8B's four fused sites of a decode layer: (N, K, kind)
SITES = {"norm+qkv": (6144, 4096, "norm"), "o+residual": (4096, 4096, "res"),
         "norm+gate_up": (24576, 4096, "norm"), "silu+down+residual": (4096, 12288, "silu")}


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 2])
@pytest.mark.parametrize("site", list(SITES))
def test_gpu_fused_sites_bf16(site, M):
    N, K, kind = SITES[site]
    x, w, kw = fused_case(kind, M, N, K, torch.bfloat16, seed=M)
    y = gemv(x, w, backend="triton", **kw)
    ref = gemv_ref(x, w, **kw)
    unfused = gemv(x, w, backend="torch", **kw)
    assert torch.equal(gemv(x, w, **kw), y)  # "auto" is the kernel on CUDA
    wg = w.clone().requires_grad_()
    assert gemv(x, wg, **kw).grad_fn.name() != gemv(x, wg, backend="triton", **kw).grad_fn.name()  # not with grad
    assert rel(y, ref) < TOL[torch.bfloat16]
    # no worse than the unfused ops (cuBLAS) against the float64 computation of the whole site
    # (the reference shares the unfused ops' roundings of the prologue, which the late norm,
    # kernel.late_norm, does not make: it scales by rstd in float32 after the product)
    exact = exact_site(x, w, **kw)
    assert rel(y, exact) < 2 * rel(unfused, exact) + 1e-3


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("M", [2, 4, 8])
def test_gpu_o_site_writes_the_mlp_norm_bf16(M):
    """Qwen3-8B's o-projection (split-K at 2..8 rows) with the post-attention norm from its
    reduce: ``y`` bit for bit the plain call's, ``yn`` the RMSNorm module's output of ``y``."""
    from orthros.ops.gemv.kernel import norm_out_fused

    assert norm_out_fused(M, 4096, 4096)
    x, w, kw, onw = norm_out_case(M, 4096, 4096, torch.bfloat16, seed=M, bias=False)
    y, yn = gemv(x, w, backend="triton", out_norm_weight=onw, out_norm_eps=1e-6, **kw)
    assert torch.equal(y, gemv(x, w, backend="triton", **kw))
    want = prologue_ref(y, onw, 1e-6)
    assert rel(yn, want) < TOL[torch.bfloat16] and (yn == want).float().mean() > 0.95


def exact_site(x, w, bias=None, norm_weight=None, norm_eps=None, act=None, residual=None):
    """A fused site in float64 throughout (no rounding of the prologue's output)."""
    x = x.double()
    if norm_weight is not None:
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm_eps) * norm_weight.double()
    if act == "silu":
        gate, up = x.chunk(2, dim=-1)
        x = F.silu(gate) * up
    y = x @ w.double().T + (bias.double() if bias is not None else 0)
    return y + residual.double() if residual is not None else y


@gpu
@pytest.mark.gpu
def test_gpu_fused_cuda_graph_and_inductor():
    args = [a.contiguous() for a in _tail_args(torch.bfloat16)]
    static = [a.clone() for a in args]
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        _layer_tail(*static)  # compile outside the capture
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = _layer_tail(*static)
    for seed in (1, 2):
        static[0].copy_(rnd(*static[0].shape, dtype=torch.bfloat16, seed=seed))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, _layer_tail(*static))
    for backend in ("triton", "auto"):  # on CUDA "auto" is the kernel too
        torch._dynamo.reset()
        compiled = torch.compile(lambda *a: _layer_tail(*a, backend=backend), fullgraph=True, mode="reduce-overhead")
        for _ in range(3):  # warm-up, record, replay
            got = compiled(*args)
        assert torch.equal(got, _layer_tail(*args)), backend

"""The GDN ops (orthros/ops/gdn): the chunked two-stream gated delta rule against a brute-force
recurrence, document resets, the decode step, the short convolution, gradients against float64,
and (on CUDA with fla-core) the fla backend against the pure-PyTorch one."""

import pytest
import torch
import torch.nn.functional as F

from orthros.ops.gdn import HAVE_FLA, causal_conv1d, gated_delta_rule, gated_delta_rule_step


def _inputs(B, T, H, Hv, K, V, dtype=torch.float64, seed=0, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)
    q, k, v = r(B, T, H, K), r(B, T, H, K), r(B, T, Hv, V)
    g = F.logsigmoid(r(B, T, Hv) + 2.0)  # decays in (0, 1), mostly near 1
    beta = torch.sigmoid(r(B, T, Hv))
    return [x.to(device=device, dtype=dtype) for x in (q, k, v, g, beta)]


def _brute_states(q, k, v, g, beta, h0=None):
    """Every state S_t (after token t) by the plain recurrence, float64: [B, T, HV, K, V]."""
    B, T, H, K = k.shape
    Hv, V = v.shape[2], v.shape[3]
    kn = F.normalize(k.double(), dim=-1, eps=0) if False else k.double() / torch.sqrt((k.double() ** 2).sum(-1, keepdim=True) + 1e-6)
    kn = kn.repeat_interleave(Hv // H, dim=2)
    S = torch.zeros(B, Hv, K, V, dtype=torch.float64) if h0 is None else h0.double().clone()
    out = []
    for t in range(T):
        S = S * g[:, t].double().exp()[..., None, None]
        pred = torch.einsum("bhk,bhkv->bhv", kn[:, t], S)
        S = S + kn[:, t, :, :, None] * (beta[:, t].double()[..., None] * (v[:, t].double() - pred))[:, :, None, :]
        out.append(S)
    return torch.stack(out, dim=1)


def _read(states, qq, pos, Hv):
    """o'_j = scale * S_{pos_j}^T l2norm(q'_j)."""
    K = qq.shape[-1]
    qn = qq.double() / torch.sqrt((qq.double() ** 2).sum(-1, keepdim=True) + 1e-6)
    qn = qn.repeat_interleave(Hv // qq.shape[2], dim=2) * K ** -0.5
    S = states[torch.arange(states.shape[0])[:, None], pos]  # [B, T_out, HV, K, V]
    return torch.einsum("bthk,bthkv->bthv", qn, S)


@pytest.mark.parametrize("T", [1, 37, 64, 130])
def test_both_streams_equal_brute_force_readout(T):
    B, H, Hv, K, V = 2, 2, 4, 8, 6
    q, k, v, g, beta = _inputs(B, T, H, Hv, K, V)
    h0 = torch.randn(B, Hv, K, V, dtype=torch.float64)
    q_out = torch.randn(B, max(T // 3, 1), H, K, dtype=torch.float64)
    pos = torch.sort(torch.randperm(T)[: q_out.shape[1]]).values.view(1, -1)
    o, o_out, final = gated_delta_rule(q, k, v, g, beta, q_out=q_out, output_positions=pos, initial_state=h0,
                                       output_final_state=True, backend="torch")
    states = _brute_states(q, k, v, g, beta, h0)
    every = torch.arange(T).view(1, T).expand(B, -1)
    torch.testing.assert_close(o, _read(states, q, every, Hv), rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(o_out, _read(states, q_out, pos.expand(B, -1), Hv), rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(final, states[:, -1], rtol=1e-9, atol=1e-9)
    # the output stream never writes the state: same base output and state without it
    o2, _, final2 = gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True, backend="torch")
    torch.testing.assert_close(o2, o, rtol=0, atol=0)
    torch.testing.assert_close(final2, final, rtol=0, atol=0)


def test_dense_and_last_readouts():
    B, T, H, Hv, K, V = 2, 70, 1, 2, 16, 8
    q, k, v, g, beta = _inputs(B, T, H, Hv, K, V, seed=1)
    q_out = torch.randn(B, T, H, K, dtype=torch.float64)
    _, o_all, _ = gated_delta_rule(q, k, v, g, beta, q_out=q_out, backend="torch")
    _, o_last, _ = gated_delta_rule(q, k, v, g, beta, q_out=q_out[:, -1:], output_positions="last", backend="torch")
    torch.testing.assert_close(o_last, o_all[:, -1:], rtol=1e-10, atol=1e-10)
    _, o_pos, _ = gated_delta_rule(q, k, v, g, beta, q_out=q_out[:, 5:9], output_positions=torch.arange(5, 9).view(1, -1),
                                   backend="torch")
    torch.testing.assert_close(o_pos, o_all[:, 5:9], rtol=1e-10, atol=1e-10)



@pytest.mark.parametrize("pos", [torch.tensor([[5.0, 6.0]]), torch.tensor([[5, 6, 7]]), torch.tensor([[5, 6]] * 3),
                                 [[5], [6, 7]], [5, None]])
def test_output_positions_checked_dtype_and_shape(pos):
    # float positions were truncated silently; a wrong length failed inside scatter; a ragged list or a None
    # in it was torch's ValueError / RuntimeError naming no argument
    q, k, v, g, beta = _inputs(2, 10, 1, 1, 4, 4, seed=2)
    with pytest.raises(ValueError, match="output_positions"):
        gated_delta_rule(q, k, v, g, beta, q_out=torch.randn(2, 2, 1, 4, dtype=q.dtype), output_positions=pos,
                         backend="torch")


@pytest.mark.parametrize("pos", ["last", [3, 5], torch.tensor([[5.0, 6.0]])])
def test_output_positions_without_output_queries_refused(pos):
    # positions given with q_out=None were ignored (even float ones): the call returned o_out=None, as if no
    # output stream had been asked for
    q, k, v, g, beta = _inputs(2, 10, 1, 1, 4, 4, seed=2)
    with pytest.raises(ValueError, match="output_positions.*q_out"):
        gated_delta_rule(q, k, v, g, beta, output_positions=pos, backend="torch")

def test_varlen_resets_state_at_document_starts():
    H, Hv, K, V = 2, 2, 8, 8
    cu = torch.tensor([0, 20, 57, 100, 101])
    q, k, v, g, beta = _inputs(1, 101, H, Hv, K, V, seed=2)
    q_out = torch.randn(1, 6, H, K, dtype=torch.float64)
    pos = torch.tensor([[0, 19, 20, 56, 99, 100]])
    h0 = torch.randn(4, Hv, K, V, dtype=torch.float64)
    o, o_out, final = gated_delta_rule(q, k, v, g, beta, q_out=q_out, output_positions=pos, initial_state=h0,
                                       output_final_state=True, cu_seqlens=cu, backend="torch")
    for d in range(4):
        s, e = int(cu[d]), int(cu[d + 1])
        sel = ((pos[0] >= s) & (pos[0] < e)).nonzero().view(-1)
        od, ood, fd = gated_delta_rule(q[:, s:e], k[:, s:e], v[:, s:e], g[:, s:e], beta[:, s:e],
                                       q_out=q_out[:, sel], output_positions=(pos[:, sel] - s), initial_state=h0[d:d + 1],
                                       output_final_state=True, backend="torch")
        torch.testing.assert_close(o[:, s:e], od, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(o_out[:, sel], ood, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(final[d:d + 1], fd, rtol=1e-10, atol=1e-10)


def test_chunks_with_state_and_decode_steps_equal_one_pass():
    B, T, H, Hv, K, V = 2, 50, 2, 4, 8, 4
    q, k, v, g, beta = _inputs(B, T, H, Hv, K, V, dtype=torch.float32, seed=3)
    q_out = torch.randn(B, T, H, K)
    o, o_out, final = gated_delta_rule(q, k, v, g, beta, q_out=q_out, output_final_state=True, backend="torch")
    # prefill 30 tokens in two chunks (the second starting from the first's state), decode the rest
    _, _, s1 = gated_delta_rule(q[:, :17], k[:, :17], v[:, :17], g[:, :17], beta[:, :17], output_final_state=True,
                                backend="torch")
    o2, o2_out, s2 = gated_delta_rule(q[:, 17:30], k[:, 17:30], v[:, 17:30], g[:, 17:30], beta[:, 17:30],
                                      q_out=q_out[:, 29:30], output_positions="last", initial_state=s1,
                                      output_final_state=True, backend="torch")
    torch.testing.assert_close(o2, o[:, 17:30], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(o2_out, o_out[:, 29:30], rtol=1e-5, atol=1e-5)
    state = s2.clone()
    for t in range(30, T):
        ot, ot_out = gated_delta_rule_step(q[:, t], k[:, t], v[:, t], g[:, t], beta[:, t], state, q_out=q_out[:, t])
        torch.testing.assert_close(ot, o[:, t], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ot_out, o_out[:, t], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(state, final, rtol=1e-5, atol=1e-5)


def test_gradients_match_float64():
    B, T, H, Hv, K, V = 1, 75, 1, 2, 8, 8
    x64 = _inputs(B, T, H, Hv, K, V, seed=4)
    qo64 = torch.randn(B, 9, H, K, dtype=torch.float64)
    h064 = torch.randn(B, Hv, K, V, dtype=torch.float64)
    pos = torch.tensor([[0, 3, 10, 33, 63, 64, 65, 70, 74]])
    w_o, w_oo, w_f = torch.randn(B, T, Hv, V), torch.randn(B, 9, Hv, V), torch.randn(B, Hv, K, V)

    def grads(dtype):
        leaves = [x.to(dtype).requires_grad_() for x in (*x64, qo64, h064)]
        q, k, v, g, beta, qo, h0 = leaves
        o, o_out, f = gated_delta_rule(q, k, v, g, beta, q_out=qo, output_positions=pos, initial_state=h0,
                                       output_final_state=True, backend="torch")
        loss = (o * w_o.to(dtype)).sum() + (o_out * w_oo.to(dtype)).sum() + (f * w_f.to(f.dtype)).sum()
        return torch.autograd.grad(loss, leaves)

    for a, b in zip(grads(torch.float32), grads(torch.float64)):
        torch.testing.assert_close(a.double(), b, rtol=2e-4, atol=2e-4)


def test_gradcheck_float64_tiny():
    q, k, v, g, beta = [x.requires_grad_() for x in _inputs(1, 9, 1, 2, 3, 2, seed=5)]
    qo = torch.randn(1, 3, 1, 3, dtype=torch.float64, requires_grad=True)
    pos = torch.tensor([[1, 4, 8]])

    def f(q, k, v, g, beta, qo):
        o, o_out, fs = gated_delta_rule(q, k, v, g, beta, q_out=qo, output_positions=pos, output_final_state=True,
                                        backend="torch")
        return o, o_out, fs

    assert torch.autograd.gradcheck(f, (q, k, v, g, beta, qo))


def test_causal_conv1d_state_and_documents():
    B, T, C, W = 2, 23, 5, 4
    x, w = torch.randn(B, T, C), torch.randn(C, W)
    ref = F.silu(F.conv1d(F.pad(x.transpose(1, 2), (W - 1, 0)), w[:, None], groups=C)).transpose(1, 2)
    y, _ = causal_conv1d(x, w)
    torch.testing.assert_close(y, ref)
    y1, s1 = causal_conv1d(x[:, :10], w)
    y2, s2 = causal_conv1d(x[:, 10:], w, s1)
    torch.testing.assert_close(torch.cat([y1, y2], 1), ref)
    torch.testing.assert_close(s2, x[:, -(W - 1):].transpose(1, 2))
    cu = torch.tensor([0, 2, 11, 23])
    yv, _ = causal_conv1d(x[:1], w, cu_seqlens=cu)
    parts = [causal_conv1d(x[:1, int(s):int(e)], w)[0] for s, e in zip(cu[:-1], cu[1:])]
    torch.testing.assert_close(yv, torch.cat(parts, 1))


@pytest.mark.skipif(not HAVE_FLA, reason="needs fla-core (orthros[hybrid])")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_causal_conv1d_fla_equals_torch(dtype, monkeypatch):
    """fla-core's Triton short convolution (GPU prefill) against the PyTorch one: a strided view
    of a fused projection, with and without a cached window, chunks shorter than the window,
    packed documents, and the gradients of a training step. On CPU through the Triton
    interpreter, one pinned config per kernel (no autotuning)."""
    import orthros.ops.gdn as gdn

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        import fla.modules.causal_conv1d.ops as fla_conv

        for kernel in (fla_conv.causal_conv1d_fwd_kernel, fla_conv.causal_conv1d_bwd_kernel):
            monkeypatch.setattr(kernel.fn, "configs", kernel.fn.configs[:1])
        # the ops send 'fla' on CPU tensors to PyTorch (fla's GDN kernels need a GPU): this test
        # compared PyTorch with itself on CPU. fla's short convolution runs in the interpreter.
        resolve = gdn.resolve_gdn_backend
        monkeypatch.setattr(gdn, "resolve_gdn_backend", lambda b, x: b if b == "fla" else resolve(b, x))
    calls = []
    fla_conv1d = gdn.causal_conv1d_fla
    monkeypatch.setattr(gdn, "causal_conv1d_fla", lambda *a: calls.append(1) or fla_conv1d(*a))
    gen = torch.Generator().manual_seed(3)
    B, T, C, W = 2, 70, 40, 4
    x = torch.randn(B, T, 3 * C, generator=gen).to(device, dtype)[..., C:2 * C]  # not contiguous
    w = torch.randn(C, W, generator=gen).to(device, dtype)
    s0 = torch.randn(B, C, W - 1, generator=gen).to(device, dtype)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=3e-2, rtol=3e-2)
    for state in (None, s0):
        for t in (T, 2):  # 2 < W - 1: the new window mixes the old one and the chunk
            yr, sr = causal_conv1d(x[:, :t], w, state, backend="torch")
            yf, sf = causal_conv1d(x[:, :t], w, state, backend="fla")
            torch.testing.assert_close(yf, yr, **tol)
            torch.testing.assert_close(sf, sr)
    cu = torch.tensor([0, 2, 11, 70], device=device)
    yr, sr = causal_conv1d(x[:1], w, s0[:1], cu_seqlens=cu, backend="torch")
    yf, sf = causal_conv1d(x[:1], w, s0[:1], cu_seqlens=cu, backend="fla")
    torch.testing.assert_close(yf, yr, **tol)
    torch.testing.assert_close(sf, sr)
    # gradients (a training step: no cached window), fla-core's backward kernels against autograd's
    go = torch.randn(B, T, C, generator=gen).to(device, dtype)
    for docs in (None, cu):
        grads = []
        for backend in ("torch", "fla"):
            xl, wl = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
            xs = xl if docs is None else xl[:1]
            y, _ = causal_conv1d(xs, wl, cu_seqlens=docs, backend=backend)
            grads.append(torch.autograd.grad((y.float() * go[:y.shape[0]].float()).sum(), (xl, wl)))
        for name, gf, gr in zip(("dx", "dw"), grads[1], grads[0]):
            torch.testing.assert_close(gf, gr, **tol, msg=lambda m, name=name: f"{name}, documents={docs is not None}: {m}")
    assert len(calls) == 7  # every 'fla' call ran fla-core's kernel


def test_bad_inputs_rejected():
    q, k, v, g, beta = _inputs(2, 8, 2, 3, 4, 4)
    with pytest.raises(ValueError, match="multiple of H"):
        gated_delta_rule(q, k, v, g, beta)
    q, k, v, g, beta = _inputs(2, 8, 2, 2, 4, 4)
    with pytest.raises(ValueError, match="cu_seqlens needs B == 1"):
        gated_delta_rule(q, k, v, g, beta, cu_seqlens=torch.tensor([0, 8]))
    with pytest.raises(ValueError, match="backend"):
        gated_delta_rule(q, k, v, g, beta, backend="cuda")


@pytest.mark.parametrize("name, bad", [(n, b) for n in ("q", "k", "v", "g", "beta", "q_out", "initial_state")
                                       for b in ("numpy", "list", None) if b or n not in ("q_out", "initial_state")])
def test_non_tensor_inputs_refused_by_name(name, bad):
    # a numpy array, a list or a missing g failed as AttributeError ("... has no attribute 'is_floating_point'")
    q, k, v, g, beta = _inputs(2, 6, 1, 2, 4, 3)
    args = dict(q=q, k=k, v=v, g=g, beta=beta, q_out=q.clone(), initial_state=torch.zeros(2, 2, 4, 3, dtype=q.dtype))
    args[name] = None if bad is None else args[name].numpy() if bad == "numpy" else args[name].tolist()
    with pytest.raises(ValueError, match=f"gated_delta_rule: {name} must be a"):
        gated_delta_rule(**args, backend="torch")


def test_causal_conv1d_non_tensor_state_refused():
    x, w = torch.randn(1, 3, 2), torch.randn(2, 4)
    with pytest.raises(ValueError, match="causal_conv1d: state must be None or a tensor"):
        causal_conv1d(x, w, [[0.0] * 3] * 2)  # was AttributeError: 'list' object has no attribute 'shape'


def cuda_fla(test):
    """A test of fla-core's GDN kernels against the PyTorch GDN: on CUDA with fla-core (``-m gpu`` selects it)."""
    skip = pytest.mark.skipif(not (torch.cuda.is_available() and HAVE_FLA), reason="needs CUDA and fla-core")
    return pytest.mark.gpu(skip(test))


def _fla_case(dtype, varlen):
    H, Hv, K, V = 2, 4, 64, 64
    B, T = (1, 300) if varlen else (2, 200)
    cu = torch.tensor([0, 50, 129, 200, 300], device="cuda") if varlen else None
    x = _inputs(B, T, H, Hv, K, V, dtype=dtype, seed=6, device="cuda")
    N = 4 if varlen else B
    gen = torch.Generator().manual_seed(7)
    qo = torch.randn(B, 40, H, K, generator=gen).to("cuda", dtype)
    pos = torch.sort(torch.randperm(T, generator=gen)[:40]).values.view(1, -1).cuda()
    h0 = torch.randn(N, Hv, K, V, generator=gen).cuda()
    w = [torch.randn(B, T, Hv, V, generator=gen).cuda(), torch.randn(B, 40, Hv, V, generator=gen).cuda(),
         torch.randn(N, Hv, K, V, generator=gen).cuda()]

    def run(backend, grad):
        leaves = [t.detach().clone().requires_grad_(grad) for t in (*x, qo, h0)]
        q, k, v, g, beta, qq, s0 = leaves
        with torch.set_grad_enabled(grad):
            o, o_out, f = gated_delta_rule(q, k, v, g.float(), beta, q_out=qq, output_positions=pos, initial_state=s0,
                                           output_final_state=True, cu_seqlens=cu, backend=backend)
        if not grad:
            return [o, o_out, f]
        loss = (o.float() * w[0]).sum() + (o_out.float() * w[1]).sum() + (f.float() * w[2]).sum()
        return [o, o_out, f, *torch.autograd.grad(loss, leaves)]

    return run


FLA_TOL = {torch.float32: 2e-3, torch.bfloat16: 6e-2, torch.float16: 2e-2}
FLA_NAMES = ["o", "o_out", "final", "dq", "dk", "dv", "dg", "dbeta", "dq_out", "dh0"]


def _compare(a_list, b_list, dtype, varlen):
    for name, a, b in zip(FLA_NAMES, a_list, b_list):
        a, b = a.float(), b.float()
        err = ((a - b).abs().max() / b.abs().max().clamp(min=1e-6)).item()
        assert err < FLA_TOL[dtype], f"{name} ({dtype}, varlen={varlen}): relative max error {err:.2e}"


@cuda_fla
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("varlen", [False, True])
def test_fla_equals_torch_forward(dtype, varlen):
    run = _fla_case(dtype, varlen)
    _compare(run("fla", False), run("torch", False), dtype, varlen)


@cuda_fla
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("varlen", [False, True])
def test_fla_equals_torch_every_gradient(dtype, varlen):
    from orthros.ops.gdn import fla_backward_supported

    if not fla_backward_supported():
        pytest.skip("fla-core 0.6.0 refuses its gated backward on Hopper with Triton < 3.7.1 (fla issue #640); "
                    "benchmarks/pack_triton.sh packs 3.7.1 for this test")
    run = _fla_case(dtype, varlen)
    _compare(run("fla", True), run("torch", True), dtype, varlen)


# shapes at the edges of fla's chunking (64 tokens a chunk): one token, a chunk and one more, no
# batch, no tokens, packed documents that are empty or one token long (the torch path handles each)
ODD = {"T=1": (2, 1, None), "T=64": (1, 64, None), "T=65": (2, 65, None), "B=0": (0, 9, None), "T=0": (2, 0, None),
       "empty docs": (1, 70, [0, 0, 5, 5, 69, 70, 70]), "one-token docs": (1, 3, [0, 1, 2, 3])}


@cuda_fla
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", list(ODD))
def test_fla_equals_torch_on_odd_shapes(case, dtype):
    B, T, bounds = ODD[case]
    H, Hv, K, V = 2, 4, 64, 32
    q, k, v, g, beta = _inputs(B, T, H, Hv, K, V, dtype=dtype, seed=11, device="cuda")
    cu = None if bounds is None else torch.tensor(bounds, device="cuda")
    N = B if cu is None else len(bounds) - 1
    gen = torch.Generator().manual_seed(12)
    h0 = torch.randn(N, Hv, K, V, generator=gen).cuda()
    T_out = min(T, 3)
    pos = torch.arange(T)[torch.randperm(T, generator=gen)[:T_out]].sort().values.cuda()
    qo = torch.randn(B, T_out, H, K, generator=gen).to("cuda", dtype)
    got, want = [gated_delta_rule(q, k, v, g.float(), beta, q_out=qo, output_positions=pos, initial_state=h0,
                                  output_final_state=True, cu_seqlens=cu, backend=b) for b in ("fla", "torch")]
    for name, a, b in zip(FLA_NAMES, got, want):
        assert a.shape == b.shape, f"{name} ({case}): fla {tuple(a.shape)} vs torch {tuple(b.shape)}"
        if b.numel():
            err = ((a.float() - b.float()).abs().max() / b.float().abs().max().clamp(min=1e-6)).item()
            assert err < FLA_TOL[dtype], f"{name} ({case}, {dtype}): relative max error {err:.2e}"


@cuda_fla
def test_auto_backend_trains_where_fla_has_no_backward():
    run = _fla_case(torch.float32, False)
    _compare(run("auto", True), run("torch", True), torch.float32, False)


def test_fla_backend_on_cpu_tensors_falls_back_to_torch_with_a_warning():
    """fla-core's kernels need CUDA tensors. ``backend="fla"`` on CPU tensors (a model with
    ``attn_backend="triton"`` run on CPU) computes with the PyTorch GDN and warns, as the Triton
    attention falls back to its reference, instead of failing inside Triton ("0 active drivers")."""
    import warnings

    from orthros.ops.gdn import resolve_gdn_backend

    q, k, v, g, beta = _inputs(1, 9, 2, 2, 4, 4, dtype=torch.float32)
    want = gated_delta_rule(q, k, v, g, beta, backend="torch")
    with pytest.warns(UserWarning, match="fla.*CUDA.*PyTorch"):
        assert resolve_gdn_backend("fla", q) == "torch"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = gated_delta_rule(q, k, v, g, beta, backend="fla")
        x, w = torch.randn(1, 7, 6), torch.randn(6, 4)
        conv = causal_conv1d(x, w, backend="fla")
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(conv, causal_conv1d(x, w, backend="torch"))


def test_fla_backend_without_fla_core_installed_falls_back_to_torch_with_a_warning(monkeypatch):
    """fla-core is an extra (``orthros[hybrid]``): without it ``backend="fla"`` (what a hybrid
    model's ``attn_backend="triton"`` maps to) was a ModuleNotFoundError from its import on CUDA;
    it runs the PyTorch GDN and says why, as the Triton attention does without triton."""
    import orthros.ops.gdn as gdn

    monkeypatch.setattr(gdn, "HAVE_FLA", False)
    q, k, v, g, beta = _inputs(1, 9, 2, 2, 4, 4, dtype=torch.float32)
    with pytest.warns(UserWarning, match=r"needs fla-core \(pip install fla-core==0.6.0 einops .*\), which is not installed"):
        got = gated_delta_rule(q, k, v, g, beta, backend="fla")
    torch.testing.assert_close(got, gated_delta_rule(q, k, v, g, beta, backend="torch"))
    x, w = torch.randn(1, 7, 6), torch.randn(6, 4)
    with pytest.warns(UserWarning, match="needs fla-core"):
        conv = causal_conv1d(x, w, backend="fla")
    torch.testing.assert_close(conv, causal_conv1d(x, w, backend="torch"))


def test_malformed_arguments_refused_before_any_work():
    # each of these ran: wrong q_out / initial_state shapes failed deep in an einsum (or, for
    # q_out with fewer heads, silently broadcast them), integer values came back as int64,
    # cu_seqlens that do not cover [0, T) silently dropped or repeated tokens
    q, k, v, g, beta = _inputs(1, 8, 2, 2, 4, 3)
    bad = [
        (dict(q_out=torch.randn(1, 8, 1, 4, dtype=q.dtype)), "q_out"),  # 1 head for 2
        (dict(q_out=torch.randn(1, 1, 1, 4, dtype=q.dtype), output_positions="last"), "q_out"),
        (dict(q_out=torch.randn(1, 8, 2, 5, dtype=q.dtype)), "q_out"),
        (dict(q_out=torch.randn(1, 2, 2, 4, dtype=q.dtype), output_positions=[1.0, 3.0]), "output_positions"),
        (dict(initial_state=torch.zeros(1, 2, 4, 4)), "initial_state"),
        (dict(initial_state=torch.zeros(3, 2, 4, 3), cu_seqlens=torch.tensor([0, 4, 8])), "initial_state"),
        (dict(cu_seqlens=torch.tensor([0.0, 8.0])), "cu_seqlens"),
        (dict(cu_seqlens=torch.tensor([0, 5])), "cu_seqlens"),
        (dict(cu_seqlens=torch.tensor([2, 8])), "cu_seqlens"),
        (dict(cu_seqlens=torch.tensor([0, 5, 3, 8])), "cu_seqlens"),
        (dict(scale=float("nan")), "scale"),
        (dict(q_out=torch.randn(1, 1, 2, 4, dtype=q.dtype), output_positions="first"), "output_positions"),
        (dict(q_out=torch.randn(1, 1, 2, 4, dtype=q.dtype), output_positions="last",
              cu_seqlens=torch.tensor([0, 4, 8])), "output_positions"),
    ]
    for kw, name in bad:  # each named as the op's (the 'last' readout's three lacked the prefix)
        with pytest.raises(ValueError, match=f"^gated_delta_rule: .*{name}"):
            gated_delta_rule(q, k, v, g, beta, backend="torch", **kw)
    with pytest.raises(ValueError, match="floating"):
        gated_delta_rule(q, k, v.long(), g, beta)
    with pytest.raises(ValueError, match="H, K >= 1"):
        gated_delta_rule(q[..., :0], k[..., :0], v, g, beta)
    # a list of positions (as orthros_attention takes) reads as the tensor; empty documents are legal
    qo = torch.randn(1, 2, 2, 4, dtype=q.dtype)
    a = gated_delta_rule(q, k, v, g, beta, q_out=qo, output_positions=[1, 3])[1]
    torch.testing.assert_close(a, gated_delta_rule(q, k, v, g, beta, q_out=qo, output_positions=torch.tensor([1, 3]))[1])
    gated_delta_rule(q, k, v, g, beta, cu_seqlens=torch.tensor([0, 4, 4, 8]), initial_state=torch.zeros(3, 2, 4, 3))
    # no output position as an empty list (torch reads [] as float32; orthros_attention takes it) was refused as
    # "must be an integer tensor ..., got torch.float32 (0,)"
    assert gated_delta_rule(q, k, v, g, beta, q_out=qo[:, :0], output_positions=[])[1].shape == (1, 0, 2, 3)


def test_causal_conv1d_refuses_mismatched_weight_and_state():
    # a state of the wrong width was concatenated as is: y came back with T + 3 rows
    x = torch.randn(1, 6, 4)
    for kw, name in ((dict(weight=torch.randn(5, 3)), "weight"), (dict(weight=torch.randn(4, 3), state=torch.randn(1, 4, 5)),
                                                                  "state")):
        with pytest.raises(ValueError, match=name):
            causal_conv1d(x, **kw)


def test_last_readout_keeps_float64_without_l2norm():
    # output_positions="last" with use_qk_l2norm=False cast q_out to float32 before reading the
    # float64 state: 7e-8 off the dense readout, where every other path is exact in float64
    q, k, v, g, beta = _inputs(2, 20, 1, 2, 4, 4, seed=8)
    qo = torch.randn(2, 20, 1, 4, dtype=torch.float64)
    for l2 in (True, False):
        _, dense, _ = gated_delta_rule(q, k, v, g, beta, q_out=qo, use_qk_l2norm=l2, backend="torch")
        _, last, _ = gated_delta_rule(q, k, v, g, beta, q_out=qo[:, -1:], output_positions="last", use_qk_l2norm=l2,
                                      backend="torch")
        torch.testing.assert_close(last, dense[:, -1:], rtol=1e-12, atol=1e-12)


def test_shapes_and_documents_refused_naming_the_argument():
    # a 3-D k failed unpacking its shape, a 2-D x of causal_conv1d too; cu_seqlens as a list
    # (gated_delta_rule takes one) failed inside torch.searchsorted; chunk_size 0 divided by zero
    from orthros.ops.gdn import chunk_gated_delta_rule_ref

    q, k, v, g, beta = _inputs(1, 8, 2, 2, 4, 3)
    with pytest.raises(ValueError, match="q, k must be"):
        gated_delta_rule(q, k[0], v, g, beta, backend="torch")
    with pytest.raises(ValueError, match="v \\[B, T, HV, V\\]"):
        gated_delta_rule(q, k, v[0], g, beta, backend="torch")
    x, w = torch.randn(1, 10, 3), torch.randn(3, 4)
    with pytest.raises(ValueError, match="x must be a tensor \\[B, T, C\\]"):
        causal_conv1d(x[0], w)
    y, _ = causal_conv1d(x, w, cu_seqlens=[0, 4, 10])
    torch.testing.assert_close(y, causal_conv1d(x, w, cu_seqlens=torch.tensor([0, 4, 10]))[0])
    for bad in ([0.0, 4.0, 10.0], "0,4,10"):  # a string was torch's TypeError ('new(): invalid data type')
        with pytest.raises(ValueError, match="causal_conv1d: cu_seqlens must be a 1-D integer"):
            causal_conv1d(x, w, cu_seqlens=bad)
    with pytest.raises(ValueError, match="cu_seqlens needs B == 1"):
        causal_conv1d(x.expand(2, -1, -1), w, cu_seqlens=[0, 10])
    for c in (0, -1):
        with pytest.raises(ValueError, match="chunk_size"):
            chunk_gated_delta_rule_ref(q, k, v, g, beta, chunk_size=c)


def test_decode_step_refuses_mismatched_shapes_and_dtypes_by_name():
    # the step had no checks: q of one head (or of batch 1) for H = 2 and g [B, 1] broadcast silently,
    # a bfloat16 state accumulated in bfloat16, integer v came back int64, a wrong K / V / state
    # failed deep in an einsum or an in-place add
    B, H, Hv, K, V = 2, 2, 4, 8, 6
    q, k, v, g, beta = [x[:, 0] for x in _inputs(B, 1, H, Hv, K, V, dtype=torch.float32)]
    state = torch.zeros(B, Hv, K, V)
    bad = [
        (dict(q=q[:, :1]), "must be \\[B, H, K\\]"), (dict(q=q[:1]), "must be \\[B, H, K\\]"),
        (dict(k=torch.randn(B, H, K + 1)), "got q"), (dict(v=torch.randn(B, Hv, V + 1)), "state \\[B, HV, K, V\\]"),
        (dict(g=g[:, :1]), "g and beta \\[B, HV\\]"), (dict(beta=beta[0]), "g and beta \\[B, HV\\]"),
        (dict(state=state[:1]), "state \\[B, HV, K, V\\]"), (dict(q_out=q[:, :, :K - 1]), "q_out"),
        (dict(q=q[:, :, None], k=k[:, :, None]), "must be \\[B, H, K\\]"),
        (dict(q=torch.randn(B, 3, K), k=torch.randn(B, 3, K)), "multiple of H"),
        (dict(state=state.bfloat16()), "state must be float32"), (dict(v=v.long()), "v must be a floating"),
        (dict(scale=float("inf")), "scale"),
    ]
    for kw, match in bad:
        a = dict(q=q, k=k, v=v, g=g, beta=beta, state=state.clone())
        a.update(kw)
        with pytest.raises(ValueError, match=match):
            gated_delta_rule_step(a.pop("q"), a.pop("k"), a.pop("v"), a.pop("g"), a.pop("beta"), a.pop("state"), **a)
    o, o_out = gated_delta_rule_step(q, k, v, g, beta, state, q_out=q)
    assert o.shape == o_out.shape == (B, Hv, V)


def test_causal_conv1d_refuses_integer_inputs_and_takes_an_empty_chunk():
    # an integer x was convolved in the weight's dtype and cast back: y rounded to integers without a word;
    # T = 0 (which gated_delta_rule takes) failed inside F.conv1d ("Kernel size can't be greater than ...")
    x, w = torch.randn(1, 5, 3), torch.randn(3, 4)
    for kw, name in ((dict(x=x.long()), "x"), (dict(weight=w.long()), "weight"),
                     (dict(state=torch.ones(1, 3, 3, dtype=torch.long)), "state")):
        a = dict(x=x, weight=w)
        a.update(kw)
        with pytest.raises(ValueError, match=f"causal_conv1d: {name} must be a floating tensor"):
            causal_conv1d(**a)
    s0 = torch.randn(1, 3, 3)
    for state in (None, s0):
        y, s = causal_conv1d(x[:, :0], w, state)
        assert y.shape == (1, 0, 3)
        torch.testing.assert_close(s, s0 if state is not None else torch.zeros(1, 3, 3))


def test_causal_conv1d_window_is_never_a_view_of_the_chunk():
    # documented as its own memory, but at B = 1 with W = 2 (or C = 1) `.contiguous()` of the tail was a
    # view of x: a decode step's in-place window update wrote into x, and a cache kept the prefill's whole
    # projection alive
    for shape, W in (((1, 5, 3), 2), ((1, 5, 1), 4), ((2, 5, 3), 4)):
        x = torch.randn(*shape)
        _, s = causal_conv1d(x, torch.randn(shape[-1], W))
        assert s.is_contiguous() and s.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
        s.zero_()
        assert bool((x != 0).all())


def test_tensors_on_another_device_refused_by_name():
    # a tensor on another device than q (x for the convolution) was torch's own "Tensor on device cpu is
    # not on the expected device meta!" mid-op, naming no argument; a q_out there ran; an integer
    # initial_state was taken. The meta device stands for a second device (no data, metadata only).
    q, k, v, g, beta = _inputs(1, 6, 2, 2, 4, 3)
    state = torch.zeros(1, 2, 4, 3, dtype=q.dtype)
    for name, kw in (("k", dict(k=k.to("meta"))), ("v", dict(v=v.to("meta"))), ("g", dict(g=g.to("meta"))),
                     ("beta", dict(beta=beta.to("meta"))), ("q_out", dict(q_out=q.to("meta"))),
                     ("initial_state", dict(initial_state=state.to("meta")))):
        a = dict(q=q, k=k, v=v, g=g, beta=beta)
        a.update(kw)
        with pytest.raises(ValueError, match=f"gated_delta_rule: {name} must be on q's device cpu, got meta"):
            gated_delta_rule(a.pop("q"), a.pop("k"), a.pop("v"), a.pop("g"), a.pop("beta"), backend="torch", **a)
    with pytest.raises(ValueError, match="gated_delta_rule: initial_state must be a floating tensor"):
        gated_delta_rule(q, k, v, g, beta, initial_state=state.long())
    step = [t[:, 0] for t in (q, k, v, g, beta)]
    for name, i in (("v", 2), ("state", 5), ("q_out", 6)):
        a = [*step, state.clone(), step[0]]
        a[i] = a[i].to("meta")
        with pytest.raises(ValueError, match=f"gated_delta_rule_step: {name} must be on q's device cpu, got meta"):
            gated_delta_rule_step(*a[:6], q_out=a[6])
    x, w = torch.randn(1, 5, 3), torch.randn(3, 4)
    for name, kw in (("weight", dict(weight=w.to("meta"))), ("state", dict(state=torch.zeros(1, 3, 3, device="meta")))):
        a = dict(x=x, weight=w)
        a.update(kw)
        with pytest.raises(ValueError, match=f"causal_conv1d: {name} must be on x's device cpu, got meta"):
            causal_conv1d(**a)
    with pytest.raises(ValueError, match="causal_conv1d: weight must be a tensor \\[C=3, W >= 1\\], got list"):
        causal_conv1d(x, w.tolist())  # was AttributeError: 'list' object has no attribute 'shape'


def test_cu_seqlens_values_checked_by_both_ops_in_one_way():
    # causal_conv1d read no value of cu_seqlens: [0, 2, 9] with T = 5 ran (searchsorted made up
    # document starts), and a falling list gave undefined starts; gated_delta_rule refused both
    x, w = torch.randn(1, 5, 3), torch.randn(3, 4)
    q, k, v, g, beta = _inputs(1, 5, 2, 2, 4, 3)
    for bad, what in (([0, 2, 9], "it ends at 9"), ([1, 5], "it starts at 1"),
                      ([0, 4, 2, 5], "it falls from 4 to 2 at index 2")):
        for cu in (bad, torch.tensor(bad), torch.tensor(bad, dtype=torch.int32)):
            with pytest.raises(ValueError, match=f"causal_conv1d: cu_seqlens must rise from 0 to the sequence "
                                                 f"length 5 .*: {what}"):
                causal_conv1d(x, w, cu_seqlens=cu, backend="torch")
            with pytest.raises(ValueError, match=f"gated_delta_rule: cu_seqlens must rise .*: {what}"):
                gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu, backend="torch")
    with pytest.raises(ValueError, match="causal_conv1d: cu_seqlens .* it ends at 5"):  # before the empty return
        causal_conv1d(x[:, :0], w, cu_seqlens=[0, 5])
    # empty documents stay legal, for both
    y, _ = causal_conv1d(x, w, cu_seqlens=[0, 2, 2, 5])
    torch.testing.assert_close(y, causal_conv1d(x, w, cu_seqlens=[0, 2, 5])[0])
    gated_delta_rule(q, k, v, g, beta, cu_seqlens=[0, 2, 2, 5])

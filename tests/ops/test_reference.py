"""The reference op against brute-force masked softmax attention (values and all gradients)."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from orthros.ops import orthros_attention
from conftest import rel as rel_err


def brute_force(q, k, v, q_out, w, output_positions=None, cu_seqlens=None, kv_start=None):
    """T x T masks, float64, one obvious line per rule of the paper's equations."""
    B, T, Hq, D = q.shape
    Tk, Hkv = k.shape[1], k.shape[2]
    G = Hq // Hkv
    q, k, v, q_out = (t.double() for t in (q, k, v, q_out))
    kk, vv = k.repeat_interleave(G, 2), v.repeat_interleave(G, 2)
    keys = torch.arange(Tk)
    qpos = torch.arange(Tk - T, Tk)
    doc = torch.zeros(Tk, dtype=torch.long)
    if cu_seqlens is not None:
        for i in range(len(cu_seqlens) - 1):
            doc[cu_seqlens[i]:cu_seqlens[i + 1]] = i
    start = torch.zeros(B, dtype=torch.long) if kv_start is None else torch.as_tensor(kv_start)

    def attend(qq, pos, window):  # qq [B, n, H, D], pos [B, n]
        m = (keys[None, None] <= pos[:, :, None]) & (doc[keys][None, None] == doc[pos][:, :, None])
        m &= keys[None, None] >= start[:, None, None]
        if window:
            m &= keys[None, None] > pos[:, :, None] - w
        s = torch.einsum("bnhd,bkhd->bhnk", qq, kk) / math.sqrt(D)
        s = s.masked_fill(~m[:, None], float("-inf"))
        p = torch.nan_to_num(s.softmax(-1), nan=0.0)
        return torch.einsum("bhnk,bkhd->bnhd", p, vv)

    T_out = q_out.shape[1]
    if output_positions is None:
        output_positions = torch.arange(Tk - T_out, Tk)
    pos_out = torch.as_tensor(output_positions).long()
    pos_out = pos_out.view(1, -1).expand(B, -1) if pos_out.dim() == 1 else pos_out
    return attend(q, qpos.view(1, -1).expand(B, -1), True), attend(q_out, pos_out, False)




def make(B, T, Hq, Hkv, D, T_out, Tk=None, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    Tk = T if Tk is None else Tk
    mk = lambda *s: torch.randn(*s, generator=g, dtype=torch.float32).to(dtype).requires_grad_(True)
    return mk(B, T, Hq, D), mk(B, Tk, Hkv, D), mk(B, Tk, Hkv, D), mk(B, T_out, Hq, D)


def check(q, k, v, q_out, w, tol=1e-5, **kw):
    """Each backend on the inputs as given and on float64 copies, where every value and gradient must
    match the brute force to rounding alone (float32 rounding is what ``tol`` allows)."""
    exact = [t.detach().double().requires_grad_(True) for t in (q, k, v, q_out)]
    for backend in ("reference", "sdpa"):  # the specification and the CPU fast path
        check_backend(backend, q, k, v, q_out, w, tol, **kw)
        check_backend(backend, *exact, w, 1e-10, **kw)


def check_backend(backend, q, k, v, q_out, w, tol=1e-5, **kw):
    o, o_out = orthros_attention(q, k, v, q_out, window_size=w, backend=backend, **kw)
    ro, ro_out = brute_force(q, k, v, q_out, w, **kw)
    assert not torch.isnan(o).any() and not torch.isnan(o_out).any()
    assert rel_err(o, ro) < tol and rel_err(o_out, ro_out) < tol
    # seeded, so that a failing example fails again (hypothesis called the global RNG's cotangents flaky)
    g = torch.Generator().manual_seed(0)
    go, go_out = (torch.randn(t.shape, generator=g, dtype=t.dtype) for t in (o, o_out))
    grads = torch.autograd.grad((o * go).sum() + (o_out * go_out).sum(), (q, k, v, q_out), allow_unused=True)
    rgrads = torch.autograd.grad((ro * go.double()).sum() + (ro_out * go_out.double()).sum(), (q, k, v, q_out),
                                 allow_unused=True)
    # A key's gradient sums terms that cancel (each softmax row's gradient sums to zero), so its float32
    # rounding is of the size of the terms, not of the sum: below float64 each gradient's error is measured
    # against its own norm or a tenth of the size of all four, the larger (rel_err reached 1.5e-4 on grad k
    # for T=2); in float64, each against its own norm.
    scale = 0.1 * torch.cat([b.flatten() for b in rgrads if b is not None]).norm()
    for name, a, b in zip("q k v q_out".split(), grads, rgrads):
        if b is None or b.abs().sum() == 0:
            assert a is None or a.abs().max() < 1e-5, f"{backend} grad {name}"
            continue
        err = rel_err(a, b) if q.dtype == torch.float64 else ((a.double() - b).norm() / max(b.norm(), scale)).item()
        assert err < tol, f"{backend} grad {name} ({q.dtype}): {err}"


@pytest.mark.parametrize("G", [1, 2, 4])
@pytest.mark.parametrize("T,w", [(1, 4), (5, 8), (8, 8), (37, 8), (70, 16)])
@pytest.mark.parametrize("out", ["one", "all"])
def test_matches_brute_force(G, T, w, out):
    T_out = 1 if out == "one" else T
    check(*make(2, T, 2 * G, 2, 16, T_out, seed=T * 7 + G), w)


def test_noncontiguous_and_per_row_positions():
    q, k, v, q_out = make(2, 40, 4, 2, 8, 5)
    check(q, k, v, q_out, 6, output_positions=torch.tensor([0, 3, 17, 18, 39]))
    check(q, k, v, q_out, 6, output_positions=torch.tensor([[1, 2, 9, 30, 31], [0, 10, 20, 33, 39]]))


@pytest.mark.parametrize("backend", ["reference", "sdpa"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("T_out", [3, 5])  # 5 = T_k: the SDPA path's plain causal output stream
def test_outputs_are_contiguous_on_every_backend(backend, dtype, T_out):
    # float32 / float64 outputs were views of the padded key blocks (strides (288, 6, 96, 1) at [2, 5, 3, 6]):
    # o.view(B, T, -1) worked on a GPU (the Triton kernels write contiguous outputs) and failed on the CPU
    g = torch.Generator().manual_seed(0)
    q, k, q_out = (torch.randn(2, n, h, 6, generator=g).to(dtype) for n, h in ((5, 4), (5, 2), (T_out, 4)))
    o, o_out = orthros_attention(q, k, k, q_out, window_size=3, backend=backend)
    assert o.is_contiguous() and o_out.is_contiguous(), (o.stride(), o_out.stride())
    o.view(2, 5, -1), o_out.view(2, T_out, -1)


def test_cache_alignment_queries_are_last_positions():
    q, k, v, q_out = make(2, 3, 4, 1, 8, 3, Tk=50)
    check(q, k, v, q_out, 8)
    check(q, k, v, q_out, 8, kv_start=torch.tensor([0, 12]))


def test_packed_documents_equal_each_document_alone():
    lens = [5, 40, 1, 23]
    cu = torch.tensor([0, 5, 45, 46, 69])
    T, w = sum(lens), 8
    q, k, v, q_out = make(1, T, 4, 2, 8, T)
    o, o_out = orthros_attention(q, k, v, q_out, window_size=w, cu_seqlens=cu, backend="reference")
    check(q, k, v, q_out, w, cu_seqlens=cu.tolist())
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):
        oa, oa_out = orthros_attention(q[:, a:b], k[:, a:b], v[:, a:b], q_out[:, a:b], window_size=w,
                                       backend="reference")
        torch.testing.assert_close(o[:, a:b], oa, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(o_out[:, a:b], oa_out, rtol=1e-5, atol=1e-6)


def test_low_precision_accumulates_in_fp32():
    q, k, v, q_out = make(1, 50, 4, 2, 16, 50, dtype=torch.bfloat16)
    o, o_out = orthros_attention(q, k, v, q_out, window_size=16, backend="reference")
    ro, ro_out = brute_force(q, k, v, q_out, 16)
    assert o.dtype == torch.bfloat16 and rel_err(o, ro) < 1e-2 and rel_err(o_out, ro_out) < 1e-2


def test_fully_masked_padding_rows_are_zero_not_nan():
    q, k, v, q_out = make(1, 10, 2, 2, 8, 10)
    o, o_out = orthros_attention(q, k, v, q_out, window_size=3, kv_start=torch.tensor([6]), backend="reference")
    assert not torch.isnan(o).any() and (o[:, :6] == 0).all() and (o_out[:, :6] == 0).all()


@settings(max_examples=40, deadline=None)
@given(T=st.integers(1, 48), w=st.integers(1, 40), G=st.sampled_from([1, 2, 4, 8]), Hkv=st.integers(1, 2),
       n_out=st.integers(0, 6), seed=st.integers(0, 2**16))
def test_property_random_shapes(T, w, G, Hkv, n_out, seed):
    g = torch.Generator().manual_seed(seed)
    n_out = min(n_out, T)
    pos = torch.sort(torch.randperm(T, generator=g)[:n_out]).values
    q, k, v, q_out = make(1, T, G * Hkv, Hkv, 4, n_out, seed=seed)
    check(q, k, v, q_out, w, output_positions=pos)


BAD = [
    (dict(window_size=0), "window_size"),
    (dict(window_size=2.5), "window_size"),
    (dict(backend="cuda"), "backend"),
    (dict(output_positions=torch.tensor([3, 2])), "increasing"),
    (dict(output_positions=torch.tensor([0, 99])), "output_positions"),
    (dict(output_positions=torch.tensor([0.0, 1.0])), "output_positions"),
    (dict(cu_seqlens=torch.tensor([0, 4])), "cu_seqlens"),
    # the values were shown as "[0, 4]...4", and a bound that does not rise was not located
    (dict(cu_seqlens=[0, 4]), r"end at the sequence length 10, got \[0, 4\]$"),
    (dict(cu_seqlens=list(range(12)) + [10]), r"got \[0, 1, 2, 3, 4, \.\.\., 8, 9, 10, 11, 10\] \(13 values\)$"),
    (dict(cu_seqlens=[0, 4, 4, 10]), r"strictly increasing \(no empty documents\): 4 then 4 at index 2, got "
                                     r"\[0, 4, 4, 10\]$"),
    (dict(scale="0.5"), "scale"),
    (dict(scale=float("nan")), "scale"),
    (dict(kv_start=torch.tensor([2.5])), "kv_start"),
    # complex positions / lengths were cast to int64 with only a torch warning (imaginary part dropped)
    (dict(output_positions=torch.tensor([3, 9], dtype=torch.complex64)), "output_positions"),
    (dict(cu_seqlens=torch.tensor([0, 10], dtype=torch.complex64)), "cu_seqlens"),
    # what torch cannot read as a tensor was its TypeError / RuntimeError / ValueError naming no argument
    (dict(output_positions="ab"), "output_positions must be integer positions"),
    (dict(output_positions=[[1, 2], [3]]), "output_positions must be integer positions"),
    (dict(cu_seqlens=[0, "a"]), "cu_seqlens must be a 1-D integer tensor"),
    (dict(kv_start=[None]), r"kv_start must be an integer tensor \[B\]"),
    # a first valid key outside [0, T_k] (T_k = 10) ran as if clamped: -1 as 0, 11 as an all-padding row
    (dict(kv_start=[-1]), r"kv_start must lie in \[0, 10\]"),
    (dict(kv_start=[11]), r"kv_start must lie in \[0, 10\]"),
    # not 1-D: .view(-1) took a [B, 1] nesting and a 0-d tensor as [B]
    (dict(kv_start=[[1]]), r"kv_start must be a 1-D tensor \[B=1\] .*got shape \(1, 1\)"),
    (dict(kv_start=torch.tensor(1)), r"kv_start must be a 1-D tensor \[B=1\] .*got shape \(\)"),
    (dict(kv_start=[1, 2]), r"kv_start must be a 1-D tensor \[B=1\] .*got shape \(2,\)"),
    # positions of the wrong length were shown as the [1, T_out] view made of them: "got (1, 3)" for a list of 3
    (dict(output_positions=[1, 2, 3]), r"output_positions must have shape \[T_out\] or \[B, T_out\] = \[2\] or "
                                       r"\[1, 2\] \(one position per output query of q_out\), got \(3,\)$"),
]


@pytest.mark.parametrize("kw,msg", BAD)
def test_bad_arguments_raise_clear_errors(kw, msg):
    q, k, v, q_out = make(1, 10, 4, 2, 8, 2)
    kw = {"window_size": 4, **kw}
    with pytest.raises(ValueError, match=msg):
        orthros_attention(q, k, v, q_out, **kw)


def test_bad_shapes_and_dtypes():
    q, k, v, q_out = make(1, 10, 4, 2, 8, 2)
    with pytest.raises(ValueError, match="multiple"):
        orthros_attention(q, make(1, 10, 3, 3, 8, 1)[1], make(1, 10, 3, 3, 8, 1)[2], q_out, window_size=4)
    with pytest.raises(ValueError, match="T_out=11 output positions but k/v have only T_k=10 positions"):
        orthros_attention(q, k, v, make(1, 10, 4, 2, 8, 11)[3], window_size=4)
    with pytest.raises(ValueError, match="dtype"):
        orthros_attention(q, k.half(), v, q_out, window_size=4)
    with pytest.raises(ValueError, match="floating"):
        orthros_attention(q, k.long(), v, q_out, window_size=4)
    with pytest.raises(ValueError, match="same device, got cpu, cpu, meta, cpu"):  # the devices named
        orthros_attention(q, k, v.to("meta"), q_out, window_size=4)
    with pytest.raises(ValueError, match="dims"):
        orthros_attention(q[0], k, v, q_out, window_size=4)
    with pytest.raises(ValueError, match="head dim"):
        orthros_attention(*make(1, 10, 4, 2, 0, 2), window_size=4)
    # no query heads passed the GQA check (0 is a multiple of any Hkv) and failed inside the SDPA
    # path (backend "auto" on a CPU) with a size mismatch
    for backend in ("auto", "sdpa", "reference"):
        with pytest.raises(ValueError, match="positive multiple"):
            orthros_attention(*make(1, 10, 0, 2, 8, 2), window_size=4, backend=backend)
    with pytest.raises(ValueError, match="batch size 1"):
        q2, k2, v2, qo2 = make(2, 10, 4, 2, 8, 2)
        orthros_attention(q2, k2, v2, qo2, window_size=4, cu_seqlens=torch.tensor([0, 5, 10]))


def test_run_attention_refuses_an_unknown_backend():
    # run_attention (the model's per-layer entry, inputs already normalised) ran a misspelt
    # backend ("tirton") as the reference without a word; resolve_backend returned it unchanged
    from orthros.ops import resolve_backend, run_attention

    q, k, v, q_out = make(1, 6, 4, 2, 8, 6)
    with pytest.raises(ValueError, match="backend must be one of .*'triton'.*got 'tirton'"):
        run_attention(q, k, v, q_out, window_size=3, output_positions=torch.arange(6).view(1, 6), scale=0.3,
                      backend="tirton")
    with pytest.raises(ValueError, match="backend must be one of"):
        resolve_backend("cuda", q, k)
    assert resolve_backend("auto", q, k) == "sdpa" and resolve_backend("reference", q, k) == "reference"


def test_run_attention_takes_the_triton_decision_from_use_triton(monkeypatch):
    # run_attention repeated backends.use_triton's decision (resolve, triton_runs, the warning) in its own
    # lines: one home for it, so a change to when the kernels run reaches the training op and the decode ops alike
    from orthros.ops import attention, run_attention

    asked = []

    def spy(backend, q, k, op):
        asked.append((backend, op))
        return False

    monkeypatch.setattr(attention, "use_triton", spy)
    q, k, v, q_out = make(1, 6, 4, 2, 8, 6)
    kw = dict(window_size=3, output_positions=torch.arange(6).view(1, 6), scale=0.3)
    want = run_attention(q, k, v, q_out, backend="reference", **kw)
    for backend in ("auto", "sdpa", "triton"):
        got = run_attention(q, k, v, q_out, backend=backend, **kw)
        assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(got, want))
    assert asked == [("reference", "orthros_attention"), ("auto", "orthros_attention"),
                     ("sdpa", "orthros_attention"), ("triton", "orthros_attention")]


@pytest.mark.parametrize("G", [1, 4])
def test_auto_backend_causal_fast_path_equals_reference(G):
    # an output query at every position is plain causal attention: "auto" takes SDPA on CPU
    q, k, v, q_out = make(2, 33, 2 * G, 2, 8, 33)
    a = orthros_attention(q, k, v, q_out, window_size=5)
    b = orthros_attention(q, k, v, q_out, window_size=5, backend="reference")
    for x, y in zip(a, b):
        assert rel_err(x, y) < 1e-5
    ga = torch.autograd.grad(sum(t.sum() for t in a), (q, k, v, q_out))
    gb = torch.autograd.grad(sum(t.sum() for t in b), (q, k, v, q_out))
    for x, y in zip(ga, gb):
        assert rel_err(x, y) < 1e-5


@pytest.mark.parametrize("backend", ["reference", "sdpa"])
def test_empty_batch_or_no_output_queries_with_explicit_positions(backend):
    # B = 0 with per-row positions [0, T_out], and T_out = 0 with positions [] (a float32 list)
    q, k, v, q_out = make(0, 5, 4, 2, 8, 2)
    o, o_out = orthros_attention(q, k, v, q_out, window_size=3, backend=backend,
                                 output_positions=torch.zeros(0, 2, dtype=torch.long))
    assert o.shape == (0, 5, 4, 8) and o_out.shape == (0, 2, 4, 8)
    q, k, v, q_out = make(1, 5, 4, 2, 8, 0)
    o, o_out = orthros_attention(q, k, v, q_out, window_size=3, backend=backend, output_positions=[])
    assert torch.equal(o, orthros_attention(q, k, v, q_out, window_size=3, backend=backend)[0])
    assert o_out.shape == (1, 0, 4, 8)


def test_triton_on_inputs_it_does_not_run_warns_why_at_the_callers_line(monkeypatch):
    # the warning pointed at orthros/ops/attention.py (whatever the caller), named the internal
    # orthros_attention_triton and said only "device=cpu, dtype=...", not what to change
    from orthros.ops import backends

    q, k, v, q_out = make(1, 10, 4, 2, 8, 2)
    for interpret, dtype, why in ((False, torch.float32, "cpu tensors: the kernels run on CUDA, on a CPU only with "
                                                         "TRITON_INTERPRET=1"),
                                  (True, torch.float64, "dtype torch.float64: the Triton interpreter .* runs fp16 and "
                                                        "fp32 only")):
        monkeypatch.setattr(backends, "INTERPRET", interpret)
        args = [t.to(dtype) for t in (q, k, v, q_out)]
        with pytest.warns(UserWarning, match=f"^orthros_attention: input not supported by the Triton kernels "
                                             f"\\({why}.*\\); using the reference$") as rec:
            got = orthros_attention(*args, window_size=4, backend="triton")
        assert [w.filename for w in rec] == [__file__]
        want = orthros_attention(*args, window_size=4, backend="reference")
        assert all(torch.equal(a, b) for a, b in zip(got, want))
    # through torch's wrappers (as a model's layers reach it) the warning pointed into torch/_dynamo
    with pytest.warns(UserWarning, match="orthros_attention: input not supported") as rec:
        torch.compiler.disable(orthros_attention)(*args, window_size=4, backend="triton")
    assert [w.filename for w in rec] == [__file__]


def test_triton_backend_without_triton_installed_runs_the_reference():
    """``triton`` is an extra (``orthros[kernels]``): without it ``backend="triton"`` on a CPU was
    a ModuleNotFoundError from the kernels' import (the decode op warned and ran its reference),
    with or without ``TRITON_INTERPRET=1``."""
    import os
    import subprocess
    import sys

    script = ("import sys, warnings; sys.modules['triton'] = None\n"
              "import torch\n"
              "from orthros.ops import orthros_attention\n"
              "q = torch.randn(1, 6, 2, 4)\n"
              "with warnings.catch_warnings(record=True) as rec:\n"
              "    warnings.simplefilter('always')\n"
              "    got = orthros_attention(q, q, q, q[:, 2:], window_size=3, backend='triton')\n"
              "want = orthros_attention(q, q, q, q[:, 2:], window_size=3, backend='reference')\n"
              "assert all(torch.equal(a, b) for a, b in zip(got, want))\n"
              "print([str(w.message) for w in rec])\n")
    for interpret in ("0", "1"):
        p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                           env={**os.environ, "TRITON_INTERPRET": interpret})
        assert p.returncode == 0, p.stderr[-2000:]
        assert "using the reference" in p.stdout
        assert ("triton is not importable" in p.stdout) == (interpret == "1")

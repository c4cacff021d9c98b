"""The engine's decode with W_O's preloading kernel (orthros.ops.gemv.preload, inference change 37)
on a GPU: a bf16 pair model whose W_O the kernel takes (16 heads of 128: K = 2048), one row,
both forms (the plain preload behind the merge launch, which signals after its wait or, early,
before it; and the merge form that takes the split partials), eager and CUDA-graph compiled; the
kernel must really run, the logits must be the Triton GEMV's up to bf16 rounding, and no compiled
piece may fall back to eager. With the early signal the plain form gave NaN on an H100
(2026-12-05), before its loads of x were made coherent. The tiny models of the other engine
tests have W_O shapes the kernel does not take, so they cannot check it."""

from __future__ import annotations

import warnings

import pytest
import torch

from orthros.ops.gemv import preload

from conftest import fed_decode, tiny_model

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("compile", [False, True])
@pytest.mark.parametrize("form,early", [("plain", False), ("plain", True), ("merge", False)])
def test_gpu_engine_with_the_preload_matches_the_triton_gemv(form, early, compile, monkeypatch):
    from orthros.ops.triton.common import PDL_MIN_M, pdl_kwargs

    if not pdl_kwargs(torch.device("cuda")) or PDL_MIN_M > 2:
        pytest.skip("the preload needs PDL launches of 2-row GEMVs (Hopper or later)")
    m = tiny_model(0, dtype=torch.bfloat16, hidden_size=2048, intermediate_size=1024, head_dim=128,
                   num_attention_heads=16, num_key_value_heads=4, window_size=16, qk_norm=True,
                   num_hidden_layers=2, attention_mode="orthros", vocab_size=512).cuda()
    prompt = [[(7 * i + 3) % 500 + 1 for i in range(300)]]

    kw = dict(max_batch_size=1, max_seq_len=512, compile=compile, gemv=True)
    monkeypatch.setattr(preload, "PIECES", 0)
    want, fed = fed_decode(m, prompt, 5, **kw)
    calls = []
    for name in ("launch", "launch_merge"):
        real = getattr(preload, name)
        monkeypatch.setattr(preload, name, lambda *a, _r=real, _n=name, **k: calls.append(_n) or _r(*a, **k))
    monkeypatch.setattr(preload, "PIECES", 12)
    monkeypatch.setattr(preload, "EARLY_COMBINE", early)
    monkeypatch.setattr(preload, "MERGE", form == "merge")
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="torch.compile of", category=RuntimeWarning)  # no eager fallback
        got, _ = fed_decode(m, prompt, 5, tokens=fed, **kw)
    # the first layer keeps both streams (the kernel's); the last keeps the output row only (1 row: Triton)
    assert {"plain": "launch", "merge": "launch_merge"}[form] in calls and len(set(calls)) == 1, calls
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, atol=5e-2, rtol=5e-2)

"""The decode step's Inductor options (``engine.DECODE_COMPILE_OPTIONS``): why they exist, checked
on the CPU with Inductor itself, and that the engine's decode pieces are compiled with them.

A decode pair's queries (the layer's fused path: q-norm, then one ``addcmul`` of both rows'
alpha/beta, then RoPE) read five inputs; RoPE reads each query twice (q and its rotated half).
At Inductor's default ``realize_reads_threshold`` (4) that value is computed into a buffer of
its own, which on a GPU puts RoPE in a separate pointwise kernel; at the engine's setting it is
recomputed inside RoPE's loop instead (no buffer). The one-row step (three inputs) never is.
``combo_kernels`` lets Inductor launch the queries' path and the keys' path (independent of each
other) as one kernel: checked on a GPU, where Inductor emits Triton kernels.
"""

from __future__ import annotations

import re

import pytest
import torch
from torch._inductor.utils import run_and_get_code

import orthros.engine.engine as engine_mod
from orthros.engine import Engine

from conftest import engine_compiles_with, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")


def _buffers(code: str) -> int:
    """The IR buffers the generated code's ``call`` names (``buf0``, ``buf1``, ...): one per
    realized value (and alias), so a value recomputed where it is read instead adds none."""
    call = code[code.index("def call"):]
    return len(set(re.findall(r"\bbuf\d+\b", call[:call.index("return")])))


def _compiled_queries(options, T):
    m = tiny_model(0, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, qk_norm=True)
    attn = m.model.layers[0].self_attn
    assert attn.fuse_projections()
    H, D = attn.num_heads, attn.head_dim
    g = torch.Generator().manual_seed(0)
    rope = (torch.rand(1, 1, D, generator=g), torch.rand(1, 1, D, generator=g))  # (cos, sin) of the step's position

    def queries(q):  # the pair: base row + output row, each with its own alpha/beta; one row: a Transformer's
        with torch.no_grad():
            return attn._queries_of(q, 1, rope, rope, T == 2, False, True)

    torch._dynamo.reset()
    try:
        q = torch.randn(1, T, H * D)
        fn = torch.compile(queries, options=options) if options else torch.compile(queries)
        out, codes = run_and_get_code(fn, q)
        torch.testing.assert_close(out, queries(q))
    finally:
        torch._dynamo.reset()
    return _buffers("\n".join(codes))


def test_pair_queries_are_not_realized_with_the_decode_options():
    default, decode = _compiled_queries({}, 2), _compiled_queries(engine_mod.DECODE_COMPILE_OPTIONS, 2)
    assert decode == default - 1, (default, decode)  # the scale-offset result's buffer is gone
    assert _compiled_queries({}, 1) == _compiled_queries(engine_mod.DECODE_COMPILE_OPTIONS, 1)  # unaffected


def test_engine_decode_pieces_get_the_decode_options(monkeypatch):
    """Prefill pieces compile with Inductor's defaults, decode pieces with DECODE_COMPILE_OPTIONS
    (a recording backend stands in for Inductor)."""
    seen = []
    real_compile = torch.compile

    def fake_compile(fn, **kw):
        seen.append((fn.__name__, kw.get("options")))
        return real_compile(fn, backend="eager")

    engine_compiles_with(monkeypatch, fake_compile)
    m = tiny_model(0, hidden_size=32, intermediate_size=48, head_dim=8, window_size=4, qk_norm=True,
                   num_hidden_layers=2, attn_backend="reference")
    try:
        got = Engine(m, max_batch_size=1, max_seq_len=32, compile=True).generate([[1, 5, 7, 9, 11]], 3)
    finally:
        torch._dynamo.reset()
    assert got == Engine(m, max_batch_size=1, max_seq_len=32).generate([[1, 5, 7, 9, 11]], 3)
    assert engine_mod.compile_fallbacks() == []  # every piece compiled (none ran eagerly after a failure)
    pieces = {name for name, _ in seen if name.startswith("_")}
    assert {"_project", "_finish"} <= pieces
    for name in ("_project", "_finish"):
        assert (name, None) in seen and (name, engine_mod.DECODE_COMPILE_OPTIONS) in seen, seen


def _launches(options, dev):
    """The outputs and the number of kernels the generated code launches for a decode pair's
    queries and its K rows (the two independent paths of the step's first compiled piece, at the
    engine's head shapes: 32 query heads, 8 KV heads of 128) under Inductor ``options``; float32,
    so the compiled values can be held to the eager ones tightly (in bf16 the eager path rounds
    every intermediate and the compiled one does not)."""
    m = tiny_model(0, hidden_size=256, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                   qk_norm=True).to(dev)
    attn = m.model.layers[0].self_attn
    assert attn.fuse_projections()
    g = torch.Generator(device=dev).manual_seed(0)
    rope = (torch.rand(1, 1, 128, generator=g, device=dev), torch.rand(1, 1, 128, generator=g, device=dev))

    def paths(q, k, v):
        with torch.no_grad():
            return attn._queries_of(q, 1, rope, rope, True, False, True), *attn._keys_values_of(k, v, rope)

    args = (torch.randn(1, 2, 32 * 128, device=dev, generator=g), torch.randn(1, 1, 8 * 128, device=dev, generator=g),
            torch.randn(1, 1, 8 * 128, device=dev, generator=g))
    torch._dynamo.reset()
    try:
        out, codes = run_and_get_code(torch.compile(paths, options=options), *args)
        for a, b in zip(out, paths(*args)):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    finally:
        torch._dynamo.reset()
    calls = [c[c.index("def call"):] for c in codes if "def call" in c]
    assert calls, "no generated wrapper code"
    return out, len(re.findall(r"\b\w+\.run\(", "\n".join(calls)))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="combo kernels: Inductor's Triton backend")
def test_queries_and_keys_launch_fewer_kernels_with_the_decode_options():
    """``combo_kernels`` (inference change 19): the q path and the k path, which read nothing of
    each other, launch as fewer kernels, with the same values."""
    dev = torch.device("cuda")
    assert engine_mod.DECODE_COMPILE_OPTIONS.get("combo_kernels") is True
    plain_out, plain = _launches({"realize_reads_threshold": 5}, dev)
    combo_out, combo = _launches(engine_mod.DECODE_COMPILE_OPTIONS, dev)
    for a, b in zip(combo_out, plain_out):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert plain >= 2 and combo < plain, (plain, combo)

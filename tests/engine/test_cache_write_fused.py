"""The decode step's cache write runs inside the layer step's first token-wise piece
(``DecodeView.write_slot`` / ``write``): compiled, it is part of that piece's graph (so Inductor
fuses the scatter with the RoPE that produced K), one graph still serves every layer, and
``update`` no longer writes a second time."""

from __future__ import annotations

import pytest
import torch

from orthros.engine import Engine
from orthros.engine.cache import DecodeView
from orthros.engine.engine import compile_fallbacks

from conftest import record_engine_graphs, tiny_model, writes_cache

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = [[1, 5, 7, 9, 11, 13, 2, 4, 6, 8, 10, 3], [4, 3, 2, 8, 9]]


def _model(mode="orthros", layers=4):
    return tiny_model(0, hidden_size=32, intermediate_size=48, head_dim=8, window_size=4, qk_norm=True,
                      num_hidden_layers=layers, attention_mode=mode, attn_backend="reference")


@pytest.mark.parametrize("mode", ["orthros", "full"])
def test_decode_writes_each_layer_once_through_its_slot(monkeypatch, mode):
    """Every attention layer's K/V of a decode step is written by ``write`` from the token-wise
    piece (the slot path), never again by ``update``; tokens equal the HF model's."""
    m = _model(mode)
    writes, updates = [], []
    real_write, real_update = DecodeView.write, DecodeView.update

    def write(self, slot, k, v):
        writes.append(slot[0].data_ptr())
        return real_write(self, slot, k, v)

    def update(self, i, k, v):
        updates.append(i in self._slotted)
        return real_update(self, i, k, v)

    monkeypatch.setattr(DecodeView, "write", write)
    monkeypatch.setattr(DecodeView, "update", update)
    got = Engine(m, max_batch_size=2, max_seq_len=40).generate(PROMPTS, 3)
    n_layers, decode_steps = m.config.num_hidden_layers, 2  # the first new token comes from the prefill
    assert len(writes) == n_layers * decode_steps and len(set(writes)) == n_layers
    assert updates == [True] * (n_layers * decode_steps)
    monkeypatch.setattr(DecodeView, "write", real_write)
    monkeypatch.setattr(DecodeView, "update", real_update)
    want = [m.generate(torch.tensor([p]), max_new_tokens=3, do_sample=False, use_engine=False)[0, len(p):].tolist()
            for p in PROMPTS]
    assert got == want


def test_compiled_decode_projection_holds_the_write_in_one_graph_for_every_layer(monkeypatch):
    """With ``compile=True`` the decode piece's graph contains the cache scatter (``kc[rows, lens] = k``)
    and the same graphs serve all layers: the count of decode projection graphs does not grow
    with the number of layers (a graph per layer would mean the slot is looked up by layer
    index inside the compiled code). A counting backend stands in for Inductor (fast)."""
    graphs = record_engine_graphs(monkeypatch)
    counts = {}
    try:
        for layers in (3, 5):
            torch._dynamo.reset()
            graphs.clear()
            m = _model(layers=layers)
            eng = Engine(m, max_batch_size=2, max_seq_len=40, compile=True)
            got = eng.generate(PROMPTS, 3)
            assert got == Engine(m, max_batch_size=2, max_seq_len=40).generate(PROMPTS, 3)
            counts[layers] = sum(writes_cache(g) for g in graphs)
            assert compile_fallbacks() == []  # every piece compiled (none ran eagerly after a failure)
    finally:
        torch._dynamo.reset()
    assert 1 <= counts[3] == counts[5] <= 2, counts  # at most: the last layer's piece and the others'

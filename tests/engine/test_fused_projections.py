"""The engine's fused projections (``Engine(fuse=True)``, the default): one GEMM for Q/K/V and
one for gate/up (and a GDN layer's four input projections), a decode pair's scale-offset as one
``addcmul``, RoPE tables cast once per step.

Fused and unfused engines give the same prefill and decode logits (fp32) in every attention
mode, with qk-norm, biases, the attention output gate, GQA/MQA and an Orthros-H hybrid, with
chunked prefill and rows of different lengths; fusing adds no parameter memory, keeps the
state dict and ``save_pretrained`` output, is idempotent, survives ``.to()`` and
``load_state_dict(assign=True)``, and never takes part in training. A decode step's GEMMs
per layer are counted (7 -> 4): that count is what the fusion is for.

Run as a script (``python tests/engine/test_fused_projections.py``) it prints the per-layer
op counts of one decode step, unfused vs fused, the table in docs/benchmarks.md.
"""

from __future__ import annotations

import collections
import hashlib
import os
import sys

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

if __name__ == "__main__":  # script mode: the shared helpers live beside this folder
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from conftest import rel, tiny_model  # noqa: E402

from orthros.engine import Engine  # noqa: E402
from orthros.engine import cache as engine_cache  # noqa: E402
from orthros.kinds import hybrid_layout  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = [[1, 5, 7, 9, 11, 13, 2, 4, 6, 8, 10, 3], [4, 3, 2, 8, 9], [50, 60, 70, 80, 90, 20, 30, 40, 41]]
VARIANTS = {
    "gqa": {},
    "qk_norm": {"qk_norm": True},
    "bias": {"attention_bias": True, "o_proj_bias": True, "mlp_bias": True},
    "gate": {"attn_output_gate": True, "qk_norm": True},
    "mqa": {"num_key_value_heads": 1},
}
HYBRID = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, head_dim=8, window_size=4, qk_norm=True, linear_num_key_heads=2,
              linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8)


def model_of(variant="gqa", seed=0, dtype=torch.float32, hybrid=None, **over):
    """A tiny model whose biases and norm weights are random too (zeros would hide a mis-split)."""
    if hybrid is not None:
        m = tiny_model(seed, dtype=torch.float32, **{**HYBRID, **hybrid_layout(hybrid, 4)})
    else:
        m = tiny_model(seed, dtype=torch.float32, **{**VARIANTS[variant], **over})
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if n.endswith("bias") or "norm" in n:
                p.add_(0.3 * torch.randn(p.shape, generator=g))
    return m.to(dtype)


def run(model, fuse, mode=None, chunk=None, steps=4, prompts=PROMPTS, compile=False):
    """Prefill logits, then ``steps`` decode logits on fixed tokens (the same in every run)."""
    eng = Engine(model, max_batch_size=len(prompts), max_seq_len=40, prefill_chunk=chunk, attention_mode=mode,
                 fuse=fuse, compile=compile)
    out = [eng.prefill(prompts)]
    for s in range(steps):
        out.append(eng.step([(7 * s + 3 * r + 1) % 97 for r in range(len(prompts))]))
    return out


def assert_same(fused, unfused, tol=1e-5):
    for a, b in zip(fused, unfused):
        assert rel(a, b) < tol
        assert torch.equal(a.argmax(-1), b.argmax(-1))


def unique_storage_bytes(model):
    seen = {}
    for t in list(model.parameters()) + list(model.buffers()):
        st = t.untyped_storage()
        seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


# ---------------------------------------------------------------------------- equality
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("mode", ["orthros", "full", "window"])
def test_fused_engine_equals_unfused(variant, mode):
    m = model_of(variant)
    ref = run(m, fuse=False, mode=mode)
    assert not any(getattr(mod, "projections_fused", False) for mod in m.modules())
    got = run(m, fuse=True, mode=mode)
    assert all(layer.self_attn.projections_fused and layer.mlp.projections_fused for layer in m.model.layers)
    assert_same(got, ref)


@pytest.mark.parametrize("mode", ["orthros", "full", "window"])
def test_fused_bf16_engine_is_within_rounding_of_unfused(mode):
    # the split GEMM itself changes nothing here (full / window were bit-identical on this CPU);
    # the Orthros pair's addcmul rounds once where mul + add round twice (0.3-0.9% on these logits)
    m = model_of("qk_norm", seed=1, dtype=torch.bfloat16)
    for a, b in zip(run(m, fuse=True, mode=mode, chunk=4), run(m, fuse=False, mode=mode, chunk=4)):
        assert rel(a, b) < (3e-2 if mode == "orthros" else 1e-3)


@pytest.mark.parametrize("mode", ["orthros", "full"])
def test_fused_chunked_prefill_equals_unfused(mode):
    # chunks of 4: the earlier chunks' last layer computes only K/V, the final chunk's last
    # layer has one query row among 4 base rows (the separate-GEMM branch)
    m = model_of("gate", seed=2)
    assert_same(run(m, fuse=True, mode=mode, chunk=4), run(m, fuse=False, mode=mode, chunk=4))


@pytest.mark.parametrize("kind", ["orthros-h", "linear-hybrid"])
def test_fused_hybrid_equals_unfused(kind):
    m = model_of(hybrid=kind, seed=3)
    ref = run(m, fuse=False, chunk=5)
    got = run(m, fuse=True, chunk=5)
    gdn = [layer.linear_attn for layer in m.model.layers if hasattr(layer, "linear_attn")]
    assert gdn and all(g.projections_fused for g in gdn)
    assert_same(got, ref)


def test_fused_greedy_generation_equals_unfused():
    m = model_of("qk_norm", seed=4)
    want = Engine(m, max_batch_size=3, max_seq_len=40, fuse=False).generate(PROMPTS, 8)
    assert Engine(m, max_batch_size=3, max_seq_len=40).generate(PROMPTS, 8) == want


def test_fused_model_forward_equals_unfused():
    # the HF forward of a fused model (autograd off) takes the fused path, incl. a Transformer's
    # last layer with queries at a few of many rows
    for mode, variant in (("orthros", "gate"), ("full", "bias")):
        m = model_of(variant, seed=5, attention_mode=mode)
        ids = torch.tensor([PROMPTS[0]])
        with torch.no_grad():
            ref = m(input_ids=ids, use_cache=False).logits
            Engine(m, max_seq_len=40)
            got = m(input_ids=ids, use_cache=False).logits
        assert rel(got, ref) < 1e-5


def test_compiled_fused_engine_equals_eager_unfused():
    m = model_of("qk_norm", seed=6)
    ref = run(m, fuse=False, steps=2, prompts=PROMPTS[:1])
    eng = Engine(m, max_seq_len=40, compile=True)
    got = [eng.prefill(PROMPTS[:1])]
    for s in range(2):
        got.append(eng.step([(7 * s + 1) % 97]))
    assert_same(got, ref, tol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 3e-2)])
@pytest.mark.parametrize("mode,compile", [("orthros", False), ("full", False), ("orthros", True)])
def test_fused_cuda_graph_engine_equals_unfused(dtype, tol, mode, compile):
    # Triton kernels, CUDA-graph decode (the graphs hold the fused buffers' addresses)
    m = model_of("gate", seed=12, head_dim=16).to("cuda", dtype)
    ref = run(m, fuse=False, mode=mode, chunk=8, compile=compile)
    got = run(m, fuse=True, mode=mode, chunk=8, compile=compile)
    for a, b in zip(got, ref):
        assert rel(a, b) < tol
    h = model_of(hybrid="orthros-h", seed=13).to("cuda", dtype)
    for a, b in zip(run(h, fuse=True, chunk=5), run(h, fuse=False, chunk=5)):
        assert rel(a, b) < tol


# ---------------------------------------------------------------------------- state
def test_fusing_keeps_state_dict_save_and_memory(tmp_path):
    m = model_of("bias", seed=7)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    nbytes = unique_storage_bytes(m)
    m.save_pretrained(tmp_path / "a")
    Engine(m, max_seq_len=40)
    sd = m.state_dict()
    assert list(sd) == list(before)  # names and order
    assert all(torch.equal(sd[k], v) for k, v in before.items())
    assert not any("fused" in k for k in sd)
    assert unique_storage_bytes(m) <= nbytes  # one buffer per group, the parameters are its views
    attn = m.model.layers[0].self_attn
    assert attn.q_proj.weight.untyped_storage().data_ptr() == attn.qkv_fused.untyped_storage().data_ptr()
    m.save_pretrained(tmp_path / "b")
    digest = lambda d: hashlib.sha256((d / "model.safetensors").read_bytes()).hexdigest()  # noqa: E731
    assert digest(tmp_path / "a") == digest(tmp_path / "b")


def test_fusing_twice_is_a_no_op_and_unfuse_restores_storages():
    m = model_of("gate", seed=8)
    Engine(m, max_seq_len=40)
    ptrs = [t.data_ptr() for t in list(m.parameters()) + list(m.buffers())]
    Engine(m, max_seq_len=40)
    for mod in m.modules():
        if hasattr(mod, "fuse_projections"):
            mod.fuse_projections()
    assert [t.data_ptr() for t in list(m.parameters()) + list(m.buffers())] == ptrs
    nbytes = unique_storage_bytes(m)
    Engine(m, max_seq_len=40, fuse=False)
    assert not any(getattr(mod, "projections_fused", False) for mod in m.modules())
    attn = m.model.layers[0].self_attn
    assert attn.q_proj.weight.untyped_storage().data_ptr() != attn.k_proj.weight.untyped_storage().data_ptr()
    assert unique_storage_bytes(m) <= nbytes


def test_an_engine_reapplies_its_setting_when_another_changed_the_model():
    m = model_of("qk_norm", seed=9)
    fused = Engine(m, max_batch_size=3, max_seq_len=40)
    want = fused.generate(PROMPTS, 5)
    plain = Engine(m, max_batch_size=3, max_seq_len=40, fuse=False)  # un-fuses the model
    assert not m.model.layers[0].self_attn.projections_fused
    assert plain.generate(PROMPTS, 5) == want
    assert fused.generate(PROMPTS, 5) == want  # re-fused at its request
    assert m.model.layers[0].self_attn.projections_fused
    assert fused.serves(m, 3, 40) and not plain.serves(m, 3, 40)


def test_fused_model_survives_to_and_assign_load():
    m = model_of("bias", seed=10)
    ids = torch.tensor([PROMPTS[1]])
    with torch.no_grad():
        ref = m(input_ids=ids, use_cache=False).logits.double()
    Engine(m, max_seq_len=40)
    m.to(torch.float64)  # converts the parameters, then fuses again in the new dtype
    attn = m.model.layers[1].self_attn
    assert attn.qkv_fused.dtype == torch.float64 and attn.projections_fused
    assert attn.q_proj.weight.untyped_storage().data_ptr() == attn.qkv_fused.untyped_storage().data_ptr()
    with torch.no_grad():
        assert rel(m(input_ids=ids, use_cache=False).logits, ref) < 1e-5
    sd = {k: v.clone() for k, v in m.state_dict().items()}
    with torch.no_grad():
        for p in m.parameters():
            p.zero_()  # in place: the fused buffers are zero too
        assert attn.qkv_fused.abs().max() == 0
    m.load_state_dict(sd, assign=True)  # new parameter objects: the buffers are rebuilt
    assert attn.q_proj.weight.untyped_storage().data_ptr() == attn.qkv_fused.untyped_storage().data_ptr()
    with torch.no_grad():
        assert rel(m(input_ids=ids, use_cache=False).logits, ref) < 1e-5


def test_training_a_fused_model_runs_the_separate_projections():
    m = model_of("gqa", seed=11).train()
    Engine(m, max_seq_len=40)
    m.train()
    ids = torch.tensor([PROMPTS[0]])
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    m(input_ids=ids, labels=ids, use_cache=False).loss.backward()
    attn, mlp = m.model.layers[0].self_attn, m.model.layers[0].mlp
    assert attn.q_proj.weight.grad is not None and attn.q_proj.weight.grad.abs().sum() > 0
    assert mlp.up_proj.weight.grad is not None and mlp.up_proj.weight.grad.abs().sum() > 0
    opt.step()  # in place: the fused buffer holds the updated weights
    assert torch.equal(attn.qkv_fused[:attn.q_cols], attn.q_proj.weight.detach())
    assert torch.equal(mlp.gate_up_fused[mlp.gate_proj.out_features:], mlp.up_proj.weight.detach())


def test_fuse_must_be_a_bool():
    with pytest.raises(ValueError, match="fuse must be True or False"):
        Engine(model_of(), max_seq_len=40, fuse="yes")


# ---------------------------------------------------------------------------- op counts
class _CountOps(TorchDispatchMode):
    """Counts the non-view aten ops that run (each a kernel launch on a GPU, eagerly), except
    those inside the attention kernels (``DecodeView.attend``: one op on a GPU, a reference
    on CPU)."""

    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()
        self.on = True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.on and not func.is_view and func.overloadpacket is not torch.ops.aten._unsafe_view:
            self.ops[str(func.overloadpacket).removeprefix("aten.")] += 1
        return func(*args, **(kwargs or {}))


def decode_ops_per_layer(fuse, mode="orthros", dtype=torch.float32, **over):
    """Ops of one decode step per added layer (``L = 5`` minus ``L = 4``: the embedding, head and
    sampling drop out), by op name."""
    counts = []
    for n_layers in (4, 5):
        m = tiny_model(0, dtype=dtype, num_hidden_layers=n_layers, **over)
        eng = Engine(m, max_seq_len=64, attention_mode=mode, fuse=fuse)
        eng.prefill([[1, 2, 3, 4, 5]])
        eng.step([7])
        counter = _CountOps()
        attend = engine_cache.DecodeView.attend

        def quiet(self, *a, **k):
            counter.on = False
            try:
                return attend(self, *a, **k)
            finally:
                counter.on = True
        engine_cache.DecodeView.attend = quiet
        try:
            with counter:
                eng.step([8])
        finally:
            engine_cache.DecodeView.attend = attend
        counts.append(counter.ops)
    return {k: counts[1][k] - counts[0][k] for k in set(counts[0]) | set(counts[1]) if counts[1][k] != counts[0][k]}


@pytest.mark.parametrize("mode", ["orthros", "full"])
def test_fused_decode_step_runs_four_gemms_per_layer(mode):
    gemms = lambda d: d.get("mm", 0) + d.get("addmm", 0)  # noqa: E731
    plain, fused = decode_ops_per_layer(False, mode), decode_ops_per_layer(True, mode)
    assert gemms(plain) == 7 and gemms(fused) == 4  # q, k, v, o, gate, up, down -> qkv, o, gate|up, down
    assert sum(fused.values()) < sum(plain.values())
    if mode == "orthros":  # the pair's scale-offset: mul, add, mul, add, cat -> one addcmul
        assert fused.get("addcmul") == 1 and plain.get("cat", 0) - fused.get("cat", 0) == 3


if __name__ == "__main__":
    torch.set_num_threads(1)
    print("| mode | dtype | qk_norm | ops per layer, unfused | fused | GEMMs unfused -> fused |")
    print("|---|---|---|---|---|---|")
    for qk in (False, True):
        for mode in ("orthros", "full", "window"):
            for dt in (torch.float32, torch.bfloat16):
                a, b = decode_ops_per_layer(False, mode, dt, qk_norm=qk), decode_ops_per_layer(True, mode, dt, qk_norm=qk)
                g = lambda d: d.get("mm", 0) + d.get("addmm", 0)  # noqa: E731
                print(f"| {mode} | {str(dt)[6:]} | {qk} | {sum(a.values())} | {sum(b.values())} | {g(a)} -> {g(b)} |")

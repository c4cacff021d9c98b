"""On a GPU: the model gives the same logits, loss and gradients with the Triton kernels as
with the reference backend (same weights, bf16), in every paradigm. Skipped without CUDA."""

import pytest
import torch

from orthros import OrthrosConfig, OrthrosForCausalLM
from conftest import rel

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def set_backend(model, backend):
    for layer in model.model.layers:
        layer.self_attn.backend = backend




@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = OrthrosConfig(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=3,
                        num_attention_heads=8, num_key_value_heads=2, head_dim=64, qk_norm=True, window_size=128)
    m = OrthrosForCausalLM(cfg).cuda().to(torch.bfloat16)
    with torch.no_grad():
        for layer in m.model.layers:
            for name, p in layer.self_attn.scale_offset_params().items():
                p.uniform_(0.7, 1.3) if name.startswith("alpha") else p.normal_(0, 0.1)
    return m


@pytest.mark.parametrize("T", [1, 100, 777, 2048])
def test_pt_logits_and_grads_match_reference(model, T):
    ids = torch.randint(0, 512, (2, T), device="cuda")
    out = {}
    for backend in ("reference", "triton"):
        set_backend(model, backend)
        model.zero_grad()
        r = model(ids, labels=ids)
        r.loss.backward()
        out[backend] = (r.logits.detach(), r.loss.detach(),
                        model.model.layers[0].self_attn.k_proj.weight.grad.clone())
    assert rel(out["triton"][0], out["reference"][0]) < 2e-2
    assert abs(out["triton"][1].item() - out["reference"][1].item()) < 2e-2
    if T > 1:  # at T = 1 no position has a target: no logits, zero loss and zero gradients
        assert rel(out["triton"][2], out["reference"][2]) < 5e-2
    with torch.no_grad():  # without labels: logits at every position (prefill path)
        lo = {}
        for backend in ("reference", "triton"):
            set_backend(model, backend)
            lo[backend] = model(ids).logits
    assert lo["triton"].shape == (2, T, 512)
    assert rel(lo["triton"], lo["reference"]) < 2e-2


def test_sft_prefill_and_generate_match_reference(model):
    ids = torch.randint(0, 512, (2, 600), device="cuda")
    labels = torch.full_like(ids, -100)
    labels[:, 300:340] = ids[:, 300:340]
    labels[1, 500:520] = ids[1, 500:520]
    res = {}
    with torch.no_grad():
        for backend in ("reference", "triton"):
            set_backend(model, backend)
            res[backend] = (model(ids, labels=labels).loss, model(ids, logits_to_keep=1).logits,
                            model.generate(ids[:, :200], max_new_tokens=8, do_sample=False))
    assert abs(res["triton"][0].item() - res["reference"][0].item()) < 2e-2
    assert rel(res["triton"][1], res["reference"][1]) < 2e-2
    # greedy tokens: bf16 rounding may flip a near-tie late, the first tokens must agree
    assert torch.equal(res["triton"][2][:, 200:202], res["reference"][2][:, 200:202])


def test_generate_takes_the_engine_on_cuda(model):
    """On CUDA, ``generate()`` (default ``use_engine=None``) runs through the engine (CUDA
    graphs, Triton decode) and gives transformers' greedy tokens for a left-padded batch."""
    from orthros.engine import release_engine

    set_backend(model, "triton")
    release_engine(model)
    ids = torch.randint(0, 512, (3, 300), device="cuda")
    mask = torch.ones_like(ids)
    mask[1, :120] = 0
    mask[2, :290] = 0
    with torch.no_grad():
        want = model.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False, use_engine=False)
        got = model.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False)
    assert getattr(model, "_orthros_engine", None) is not None  # the engine served it
    assert got.shape == want.shape
    # bf16 rounding may flip a near-tie late, the first tokens must agree
    assert torch.equal(got[:, 300:302], want[:, 300:302])
    release_engine(model)

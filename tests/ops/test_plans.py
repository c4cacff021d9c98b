"""Launch plans of the dense streams (``orthros.ops.triton.attention._Plan``): the first call of a
signature records its launches, later calls replay them. A replay gives the unplanned path's
outputs bit for bit; a changed setting, alignment or stride takes a new plan; a plan keeps no
tensor of the call that made it. CPU: the Triton interpreter, tiny shapes."""

import gc
import os
import weakref

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

pytest.importorskip("triton")
from orthros.ops import orthros_attention  # noqa: E402
from orthros.ops.triton import attention as ta  # noqa: E402

DEV = "cuda" if HAS_CUDA else "cpu"
DT = torch.bfloat16 if HAS_CUDA else torch.float32


@pytest.fixture
def plans(monkeypatch):
    """Plans on, an empty memo, and a count of replays."""
    monkeypatch.setattr(ta, "PLANS", True)
    monkeypatch.setattr(ta, "_PLANS", {})
    replays, real = [], ta._Plan.replay
    monkeypatch.setattr(ta._Plan, "replay", lambda self, t: (replays.append(1), real(self, t))[1])
    if not HAS_CUDA:  # interpreter: blocks small enough for interior and edge blocks at 40 tokens
        monkeypatch.setitem(ta.CONFIGS["bwd_dkdv"], 64, (16, 16, 4, 1))
        monkeypatch.setitem(ta.CONFIGS["bwd_dq"], 64, (16, 16, 4, 1))
        monkeypatch.setitem(ta.CONFIGS["win_fwd"], 64, (16, 16, 4, 1))
    return replays


def inputs(seed, T=40, Hq=4, Hkv=2, D=16):
    g = torch.Generator().manual_seed(seed)
    q, k, v, do = (torch.randn(1, T, h, D, generator=g).to(DEV, DT) for h in (Hq, Hkv, Hkv, Hq))
    return q, k, v, do


def fwd_bwd(q, k, v, do, w=9):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    o = orthros_attention(q, k, v, q[:, :0].detach(), window_size=w, backend="triton")[0]
    return (o, *torch.autograd.grad(o, (q, k, v), do))


def unplanned(monkeypatch, *args, **kw):
    with monkeypatch.context() as m:
        m.setattr(ta, "PLANS", False)
        return fwd_bwd(*args, **kw)


def test_a_replay_gives_the_unplanned_outputs_bit_for_bit(plans, monkeypatch):
    fwd_bwd(*inputs(0))  # records the forward's and the backward's plan
    assert len(ta._PLANS) == 2 and plans == []
    new = inputs(1)
    got = fwd_bwd(*new)
    assert len(plans) == 2 and len(ta._PLANS) == 2  # both replayed, no new plan
    for a, b in zip(got, unplanned(monkeypatch, *new)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("change", ["bwd_setting", "fwd_setting", "window", "misaligned", "strided"])
def test_what_a_plan_fixes_takes_a_new_plan(plans, monkeypatch, change):
    fwd_bwd(*inputs(0))
    q, k, v, do = inputs(1)
    w = 9
    if change == "bwd_setting":  # a backward setting: a new backward plan, the forward's replayed
        monkeypatch.setattr(ta, "DQ_VARIANT", "base")
    elif change == "fwd_setting":
        monkeypatch.setattr(ta, "FWD_REL", False)
    elif change == "window":
        w = 5
    elif change == "misaligned":  # q 4 or 2 bytes past a 16-byte boundary
        q = torch.cat([q.new_zeros(1), q.flatten()])[1:].view(q.shape)
    else:  # q a view with gaps between heads
        q = torch.cat([q, q], dim=-1)[..., :q.shape[-1]]
    got = fwd_bwd(q, k, v, do, w=w)
    one_side = change.endswith("setting")  # else: a new forward and backward plan, no replay
    assert len(ta._PLANS) == (3 if one_side else 4) and len(plans) == (1 if one_side else 0)
    for a, b in zip(got, unplanned(monkeypatch, q, k, v, do, w=w)):
        assert torch.equal(a, b)


def test_calls_with_documents_or_positions_take_no_plan(plans):
    q, k, v, do = inputs(0)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    o = orthros_attention(q, k, v, q[:, :0].detach(), window_size=9, backend="triton",
                          cu_seqlens=torch.tensor([0, 15, 40], device=DEV))[0]
    torch.autograd.grad(o, (q, k, v), do)
    qo = q[:, -3:].detach().requires_grad_()
    o, oo = orthros_attention(q, k, v, qo, window_size=9, backend="triton",
                              output_positions=torch.tensor([5, 20, 39], device=DEV))
    torch.autograd.grad((o.float().sum() + oo.float().sum()), (q, k, v, qo))
    assert len(ta._PLANS) == 2  # the window stream of the second call only (fwd, bwd)


def test_a_plan_keeps_no_tensor_of_the_call_that_made_it(plans):
    q, k, v, do = inputs(0)
    refs = [weakref.ref(t) for t in (q, k, v, do)]
    out = fwd_bwd(q, k, v, do)
    refs += [weakref.ref(t) for t in out]
    del q, k, v, do, out
    gc.collect()
    assert len(ta._PLANS) == 2 and all(r() is None for r in refs)


def test_plans_off_keep_nothing(plans, monkeypatch):
    monkeypatch.setattr(ta, "PLANS", False)
    fwd_bwd(*inputs(0))
    fwd_bwd(*inputs(1))
    assert ta._PLANS == {} and plans == []

"""The one optimiser / schedule module: one weight-decay rule, one schedule, used by the trainer,
MQAR and the passkey trainer (each used to carry its own, and they disagreed)."""

import inspect
import math

import pytest
import torch

from orthros.evaluation import mqar, niah_train
from orthros.training import optim, trainer
from orthros.training.optim import (build_optimizer, build_scheduler, check_schedule, lr_multiplier, param_groups,
                                    warmup_steps_from_fraction)


def tiny_orthros(tie=True):
    from orthros.models import OrthrosConfig, OrthrosForCausalLM

    cfg = OrthrosConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=2, num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
                        window_size=8, tie_word_embeddings=tie)
    torch.manual_seed(0)
    return OrthrosForCausalLM(cfg)


@pytest.mark.parametrize("tie", [True, False])
def test_weight_decay_rule_matrices_and_embeddings_decay_vectors_do_not(tie):
    model = tiny_orthros(tie)
    dec, no = param_groups(model, 0.1)
    assert dec["weight_decay"] == 0.1 and no["weight_decay"] == 0.0
    ids_dec = {id(p) for p in dec["params"]}
    names = dict(model.named_parameters())
    for name, p in names.items():
        assert (id(p) in ids_dec) == (p.dim() >= 2), name
    # embeddings decay (the rule MQAR used to break: it exempted them)
    assert id(model.model.embed_tokens.weight) in ids_dec
    # the vectors: norm gains and Orthros' scale-offset parameters exist and do not decay
    vec = [n for n, p in names.items() if p.dim() < 2]
    assert any("norm" in n for n in vec)
    # every parameter exactly once, tied or not
    allp = dec["params"] + no["params"]
    assert len(allp) == len({id(p) for p in allp}) == len(list(model.parameters()))


def test_frozen_parameters_left_out():
    model = tiny_orthros()
    model.model.embed_tokens.weight.requires_grad_(False)
    groups = param_groups(model, 0.1)
    assert all(p is not model.model.embed_tokens.weight for g in groups for p in g["params"])


def test_schedule_shape():
    kw = dict(total_steps=100, warmup_steps=10, min_lr_ratio=0.1)
    assert lr_multiplier(0, **kw) == pytest.approx(0.1)
    assert lr_multiplier(9, **kw) == pytest.approx(1.0)
    assert lr_multiplier(10, **kw) == pytest.approx(1.0)
    assert lr_multiplier(55, **kw) == pytest.approx(0.1 + 0.9 * 0.5)  # cosine midpoint
    assert lr_multiplier(100, **kw) == pytest.approx(0.1)
    assert lr_multiplier(500, **kw) == pytest.approx(0.1)  # clamps past the end
    vals = [lr_multiplier(s, **kw) for s in range(10, 101)]
    assert all(a >= b for a, b in zip(vals, vals[1:]))  # non-increasing after warm-up
    assert lr_multiplier(55, schedule="linear", **kw) == pytest.approx(1 - 0.9 * 0.5)
    assert lr_multiplier(80, schedule="constant", **kw) == 1.0
    assert lr_multiplier(0, total_steps=10, warmup_steps=0) == 1.0  # no warm-up
    assert lr_multiplier(10, total_steps=10, warmup_steps=0) == pytest.approx(0.0)


def test_scheduler_drives_the_optimizer_and_state_is_plain():
    model = tiny_orthros()
    opt = build_optimizer(model, lr=2e-3, weight_decay=0.1, betas=(0.9, 0.98))
    assert opt.param_groups[0]["betas"] == (0.9, 0.98)
    sch = build_scheduler(opt, total_steps=20, warmup_steps=4, min_lr_ratio=0.1)
    seen = []
    for step in range(20):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sch.step()
    want = [2e-3 * lr_multiplier(s, total_steps=20, warmup_steps=4, min_lr_ratio=0.1) for s in range(20)]
    assert seen == pytest.approx(want)
    # both groups follow the schedule
    assert opt.param_groups[1]["lr"] == pytest.approx(opt.param_groups[0]["lr"])
    # the state round-trips through torch.save / weights_only=True
    import io

    buf = io.BytesIO()
    torch.save(sch.state_dict(), buf)
    buf.seek(0)
    st = torch.load(buf, weights_only=True)
    sch2 = build_scheduler(build_optimizer(model, lr=2e-3, weight_decay=0.1), total_steps=20, warmup_steps=4,
                           min_lr_ratio=0.1)
    sch2.load_state_dict(st)
    assert sch2.get_last_lr() == pytest.approx(sch.get_last_lr())


@pytest.mark.parametrize("kw, match", [
    (dict(schedule="cosin"), "schedule must be one of cosine, linear, constant"),
    (dict(total_steps=0), "total_steps must be an integer >= 1"),
    (dict(warmup_steps=-1), "warmup_steps must be an integer >= 0"),
    (dict(min_lr_ratio=1.5), r"min_lr_ratio must be a number in \[0, 1\]"),
])
def test_bad_schedule_arguments(kw, match):
    args = dict(total_steps=10, warmup_steps=1, schedule="cosine", min_lr_ratio=0.0) | kw
    with pytest.raises(ValueError, match=match):
        check_schedule(**args)


def test_bad_optimizer_arguments():
    model = tiny_orthros()
    with pytest.raises(ValueError, match="weight_decay"):
        param_groups(model, -0.1)
    with pytest.raises(ValueError, match="lr must be"):
        build_optimizer(model, lr=0.0, weight_decay=0.1)
    with pytest.raises(ValueError, match="warmup"):
        warmup_steps_from_fraction(1.5, 100)
    assert warmup_steps_from_fraction(0.1, 800) == 80
    assert warmup_steps_from_fraction(0.0, 800) == 1


def test_one_home_the_three_users_call_it():
    """No private optimiser or schedule left in the trainer, MQAR or the passkey trainer."""
    for mod in (trainer, mqar, niah_train):
        src = inspect.getsource(mod)
        assert "torch.optim.AdamW(" not in src, mod.__name__
        assert "LambdaLR(" not in src, mod.__name__
        assert "math.cos" not in src, mod.__name__
        assert "build_optimizer" in src and "build_scheduler" in src, mod.__name__
    assert "math.cos" in inspect.getsource(optim)
    assert math.isclose(lr_multiplier(5, total_steps=10, warmup_steps=0), 0.5)


def test_scale_offset_lr_mult_gives_the_conversions_new_parameters_their_own_rate():
    """``scale_offset_lr_mult``: alpha/beta/alpha'/beta' (and nothing else) in a third group at
    lr x mult, no decay; the schedule scales it with the others; 1 keeps the two groups."""
    model = tiny_orthros()
    names = {id(p): n for n, p in model.named_parameters()}
    want = {n for n in names.values() if n.rpartition(".")[2] in ("alpha", "beta", "alpha_out", "beta_out")}
    assert want
    opt = build_optimizer(model, lr=1e-3, weight_decay=0.1, scale_offset_lr_mult=10.0)
    dec, no, so = opt.param_groups
    assert {names[id(p)] for p in so["params"]} == want and so["weight_decay"] == 0.0
    assert not want & {names[id(p)] for p in dec["params"] + no["params"]}
    sched = build_scheduler(opt, total_steps=10, warmup_steps=2)
    for _ in range(3):
        opt.step()
        sched.step()
        assert so["lr"] == pytest.approx(10 * dec["lr"]) and no["lr"] == dec["lr"]
    assert len(param_groups(model, 0.1, lr=1e-3, scale_offset_lr_mult=1.0)) == 2
    for bad in (0, -1.0, float("inf")):
        with pytest.raises(ValueError, match="scale_offset_lr_mult"):
            param_groups(model, 0.1, lr=1e-3, scale_offset_lr_mult=bad)


def test_config_refuses_a_non_positive_scale_offset_lr_mult():
    from orthros.training.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="optim.scale_offset_lr_mult"):
        load_config(None, ["--optim.scale_offset_lr_mult=0", "--output_dir=/tmp/x"])

"""Process-group plumbing of sequence-parallel inference (orthros.parallel.comm), one process."""

import pytest

from orthros.parallel import ParallelError, comm, init_from_env

TORCHRUN = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
GOOD = dict(WORLD_SIZE="2", RANK="1", MASTER_ADDR="localhost", MASTER_PORT="29500")


@pytest.mark.parametrize("env, match", [
    # was a bare "invalid literal for int() with base 10: 'abc'"
    (dict(GOOD, WORLD_SIZE="abc"), r"WORLD_SIZE is 'abc': it must be an integer >= 1"),
    # went on to init_process_group, which asked for RANK
    (dict(GOOD, WORLD_SIZE="0"), r"WORLD_SIZE is '0': it must be an integer >= 1"),
    (dict(GOOD, RANK=None), r"RANK is not set: it must be an integer in \[0, 1\]"),
    (dict(GOOD, RANK="x"), r"RANK is 'x': it must be an integer in \[0, 1\]"),
    # a rank outside the world waited out the rendezvous timeout, then a socket timeout naming no variable
    (dict(GOOD, RANK="5"), r"RANK is '5': it must be an integer in \[0, 1\]"),
    (dict(GOOD, RANK="-1"), r"RANK is '-1'"),
    (dict(GOOD, MASTER_ADDR=None), "MASTER_ADDR is not set"),
    (dict(GOOD, MASTER_ADDR=" "), "MASTER_ADDR is not set"),
    (dict(GOOD, MASTER_PORT=None), r"MASTER_PORT is not set: it must be an integer in \[1, 65535\]"),
    (dict(GOOD, MASTER_PORT="http"), r"MASTER_PORT is 'http'"),
    (dict(GOOD, MASTER_PORT="70000"), r"MASTER_PORT is '70000'"),
])
def test_init_from_env_checks_torchrun_s_environment_before_the_group_starts(env, match, monkeypatch):
    for k in TORCHRUN:
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        if v is not None:
            monkeypatch.setenv(k, v)
    monkeypatch.setattr(comm.dist, "init_process_group", lambda *a, **k: pytest.fail("the process group was started"))
    with pytest.raises(ParallelError, match=match):
        init_from_env(backend="gloo", timeout_s=5)


@pytest.mark.parametrize("world", [None, "1", "2"])
@pytest.mark.parametrize("local_rank", ["2", "-1", "gpu0"])
def test_init_from_env_checks_local_rank_against_the_visible_gpus(world, local_rank, monkeypatch):
    """LOCAL_RANK picks this process's GPU: a non-integer was a bare int() ValueError, one past the visible
    devices a CUDA 'invalid device ordinal' error."""
    for k in TORCHRUN:
        monkeypatch.delenv(k, raising=False)
    env = dict(GOOD, LOCAL_RANK=local_rank)
    if world is None:
        env = dict(LOCAL_RANK=local_rank)
    else:
        env["WORLD_SIZE"] = world
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(comm.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(comm.torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(comm.torch.cuda, "set_device", lambda i: pytest.fail(f"set_device({i})"))
    monkeypatch.setattr(comm.dist, "init_process_group", lambda *a, **k: pytest.fail("the process group was started"))
    with pytest.raises(ParallelError, match=rf"LOCAL_RANK is '{local_rank}': it must be an integer in \[0, 1\] "
                                            r"\(this process's GPU; 2 visible\)"):
        init_from_env(backend=None if world in (None, "1") else "nccl", timeout_s=5)


def test_init_from_env_without_torchrun_is_one_process(monkeypatch):
    for k in TORCHRUN:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr(comm.dist, "init_process_group", lambda *a, **k: pytest.fail("the process group was started"))
    assert init_from_env(backend="gloo", timeout_s=5).world_size == 1
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert init_from_env(timeout_s=5).world_size == 1


def _hand_built_contexts(ctx):
    """(gloo worker) build contexts by hand: the error of each, or 'ok'."""
    from orthros.parallel import ParallelContext

    out = []
    for kw in (dict(rank=ctx.rank, world_size=3), dict(rank=1 - ctx.rank, world_size=2),
               dict(rank=ctx.rank, world_size=2)):
        try:
            ParallelContext(**kw)
            out.append("ok")
        except ValueError as e:
            out.append(str(e))
    return out


def test_hand_built_context_must_match_the_process_group():
    """A context of several ranks without a process group failed in the first collective as 'a peer rank
    exited, crashed or did not arrive'; one whose world size is not the group's likewise (the gather's
    sizes); one with another rank than the process's computed another rank's shard, and the halos and
    logits were wrong without a word. Each is a ValueError when the context is built."""
    from orthros.parallel import ParallelContext
    from orthros.parallel.testing import run_ranks

    with pytest.raises(ValueError, match="world_size=2 needs a torch.distributed process group, and none is"):
        ParallelContext(rank=0, world_size=2)
    run = run_ranks(_hand_built_contexts, 2, timeout_s=30, join_timeout=90)
    assert not run["hung"] and not run["errors"], run["errors"]
    for r in range(2):
        wrong_world, wrong_rank, ok = run["results"][r]
        assert f"rank={r}, world_size=3 are not this process's in the group (rank {r} of 2)" in wrong_world
        assert f"rank={1 - r}, world_size=2 are not this process's in the group (rank {r} of 2)" in wrong_rank
        assert ok == "ok"

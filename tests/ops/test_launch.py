"""``orthros.ops.triton.common.launch``: the compiled-kernel cache in front of Triton's JIT launch.

On the CPU a stand-in kernel records what reaches the JIT and what reaches the compiled
kernel's own launcher; on a GPU the real kernels' outputs and gradients are compared with the
JIT path's, bit for bit."""

import inspect
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

pytest.importorskip("triton")
from orthros.ops.triton import common  # noqa: E402


class _Param:
    def __init__(self, name, default=inspect.Parameter.empty):
        self.name, self.default = name, default


class _Compiled:
    def __init__(self):
        self.launches = []

    def __getitem__(self, grid):
        return lambda *args: self.launches.append((grid, args))


class _Kernel:
    """Parameters (X, n, scale, BLOCK, FLAG=False), like a @triton.jit kernel's."""
    __name__ = "fake_kernel"

    def __init__(self):
        self.params = [_Param("X"), _Param("n"), _Param("scale"), _Param("BLOCK"), _Param("FLAG", False)]
        self.arg_names = [p.name for p in self.params]
        self.jit = []

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.jit.append((grid, args, kwargs))
            return _Compiled()
        return run


@pytest.fixture
def fast(monkeypatch):
    monkeypatch.setattr(common, "FAST_LAUNCH", True)
    monkeypatch.setattr(common, "_INTERPRET", False)
    monkeypatch.setattr(common, "_LAUNCHES", {})


def test_second_call_launches_the_compiled_kernel(fast):
    kern, x = _Kernel(), torch.zeros(64)
    first = common.launch(kern, (4, 2), x, 8, 0.5, BLOCK=16, num_warps=4)
    assert len(kern.jit) == 1 and kern.jit[0][2] == {"BLOCK": 16, "num_warps": 4}
    again = common.launch(kern, (4, 2), x, 8, 0.5, BLOCK=16, num_warps=4)
    assert again is first and len(kern.jit) == 1
    # the grid padded to three axes; every parameter in order, the default filled in
    assert first.launches == [((4, 2, 1), (x, 8, 0.5, 16, False))]


@pytest.mark.parametrize("change", ["int", "bool", "float_value", "float_type", "constexpr", "option", "dtype", "alignment"])
def test_what_triton_specialises_on_takes_the_jit_again(fast, change):
    kern, x = _Kernel(), torch.zeros(64)
    args, consts = [x, 8, 0.5], dict(BLOCK=16, num_warps=4)
    common.launch(kern, (1,), *args, **consts)
    if change == "int":
        args[1] = 16
    elif change == "bool":  # True == 1 and hashes alike: the type is part of the key
        args[1] = 1
        common.launch(kern, (1,), x, True, 0.5, **consts)
    elif change == "float_value":  # keyed by value too (a model's scale is one value)
        args[2] = 0.25
    elif change == "float_type":  # 1 and 1.0 hash alike: the type is part of the key
        args[2] = 1
    elif change == "constexpr":
        consts["FLAG"] = True
    elif change == "option":
        consts["num_warps"] = 8
    elif change == "dtype":
        args[0] = torch.zeros(64, dtype=torch.float16)
    else:
        args[0] = x[1:]  # 4 bytes past a 16-byte boundary
    common.launch(kern, (1,), *args, **consts)
    assert len(kern.jit) == (3 if change == "bool" else 2)


def test_a_tensor_after_a_scalar_is_refused_before_any_launch(fast):
    kern = _Kernel()
    with pytest.raises(TypeError, match="fake_kernel.*tensor arguments must come before"):
        common.launch(kern, (1,), torch.zeros(4), 1, torch.zeros(4), BLOCK=16)
    assert kern.jit == []


def test_a_parameter_without_value_is_refused_before_any_launch(fast):
    kern = _Kernel()
    with pytest.raises(TypeError, match="fake_kernel.*'BLOCK'"):
        common.launch(kern, (1,), torch.zeros(4), 1, 0.5)
    assert kern.jit == []


def test_off_switch_always_takes_the_jit(fast, monkeypatch):
    monkeypatch.setattr(common, "FAST_LAUNCH", False)
    kern, x = _Kernel(), torch.zeros(64)
    for _ in range(3):
        common.launch(kern, (1,), x, 8, 0.5, BLOCK=16)
    assert len(kern.jit) == 3 and common._LAUNCHES == {}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fast_launch_matches_the_jit_path_on_the_gpu(monkeypatch):
    from orthros.ops import orthros_attention

    torch.manual_seed(0)
    q = torch.randn(1, 1000, 8, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(1, 1000, 2, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(1, 1000, 2, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    pos = torch.arange(0, 1000, 27, device="cuda")  # 38 output positions
    qo = torch.randn(1, pos.numel(), 8, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    out = {}
    for fast in (False, True, True):  # the JIT, then the fast path's first (JIT) and cached calls
        monkeypatch.setattr(common, "FAST_LAUNCH", fast)
        o, o_out = orthros_attention(q, k, v, qo, window_size=128, output_positions=pos, backend="triton")
        grads = torch.autograd.grad((o.float().square().sum() + o_out.float().sum()), (q, k, v, qo))
        out.setdefault(fast, []).append((o, o_out, *grads))
    assert any(key[0].__name__ == "_stream_bwd" for key in common._LAUNCHES)
    for res in out[True]:
        for a, b in zip(res, out[False][0]):
            assert torch.equal(a, b)


def test_bind_launches_again_with_new_tensors_and_nothing_else_recomputed(fast):
    kern, x, y = _Kernel(), torch.zeros(64), torch.ones(64)
    compiled = common.launch(kern, (4, 2), x, 8, 0.5, BLOCK=16, num_warps=4)
    run = common.bind(compiled, kern, (4, 2), x, 8, 0.5, BLOCK=16, num_warps=4)
    run(y)
    assert len(kern.jit) == 1  # the first launch compiled; the bound one: no compile, no key
    (grid, args), = compiled.launches
    assert grid == (4, 2, 1) and args[0] is y and args[1:] == (8, 0.5, 16, False)


def test_bind_without_the_launch_cache_launches_through_the_jit(fast, monkeypatch):
    monkeypatch.setattr(common, "FAST_LAUNCH", False)
    kern, x, y = _Kernel(), torch.zeros(64), torch.ones(64)
    compiled = common.launch(kern, (1,), x, 8, 0.5, BLOCK=16)
    common.bind(compiled, kern, (1,), x, 8, 0.5, BLOCK=16)(y)
    assert [(args[0] is t, args[1:]) for (_, args, _), t in zip(kern.jit, (x, y))] == [(True, (8, 0.5))] * 2

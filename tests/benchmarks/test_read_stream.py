"""The read-only ceiling's kernel (:mod:`orthros.benchmarks.read_stream`), through the Triton
interpreter on the CPU: it reads every element once, and its arguments are checked."""

import pytest
import torch

from orthros.benchmarks.read_stream import READ_CONFIGS, config_label, read_bandwidth, read_sum


@pytest.mark.parametrize("programs", [1, 3, 8])
def test_read_sum_reads_every_element_once(programs):
    torch.manual_seed(0)
    x = torch.randn(1024 * 7, dtype=torch.bfloat16)
    out = read_sum(x, block=1024, programs=programs)
    assert out.shape == (programs,) and out.dtype == torch.float32
    blocks = x.float().view(7, 1024).sum(1)
    want = torch.stack([blocks[p::programs].sum() for p in range(programs)])  # grid-strided pieces
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("kwargs, message", [
    (dict(block=1000), "block must be a power of two"),
    (dict(warps=3), "warps must be one of"),
    (dict(stages=0), "stages must be >= 1"),
    (dict(programs=0), "programs must be >= 1"),
])
def test_read_sum_refuses_bad_configs(kwargs, message):
    with pytest.raises(ValueError, match=message):
        read_sum(torch.zeros(4096, dtype=torch.bfloat16), **kwargs)


def test_read_sum_refuses_bad_inputs():
    with pytest.raises(ValueError, match="multiple of block"):
        read_sum(torch.zeros(1000, dtype=torch.bfloat16), block=512)
    with pytest.raises(ValueError, match="contiguous 1-D"):
        read_sum(torch.zeros(4, 1024, dtype=torch.bfloat16), block=512)


def test_read_bandwidth_on_the_cpu_times_torch_sum():
    r = read_bandwidth("cpu", 2**20, reps=3)
    assert r["how"] == "torch.sum" and r["bytes_per_s"] > 0 and r["candidates"] == [("torch.sum", r["bytes_per_s"])]
    with pytest.raises(ValueError, match="nbytes must be"):
        read_bandwidth("cpu", 100)


def test_configs_fill_whole_16_byte_loads_and_have_labels():
    for block, warps, stages, per_sm in READ_CONFIGS:
        assert block % (warps * 32 * 8) == 0  # 8 bf16 a thread a load at least
        assert config_label(block, warps, stages, per_sm).startswith(f"read_sum {block} w{warps}")


@pytest.mark.gpu
def test_read_bandwidth_on_cuda_times_every_config_and_torch_sum():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    r = read_bandwidth("cuda", 2**27, reps=3)  # read_bandwidth checks each config's sum itself
    hows = [h for h, _ in r["candidates"]]
    assert hows == [config_label(*c) for c in READ_CONFIGS] + ["torch.sum"]
    assert r["bytes_per_s"] == max(b for _, b in r["candidates"]) > 0
    x = torch.randn(8192 * 33, dtype=torch.bfloat16, device="cuda")
    torch.testing.assert_close(read_sum(x, block=8192, warps=8, programs=5).sum(), x.float().sum(), rtol=1e-4,
                               atol=1e-2)

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


@pytest.mark.parametrize("chunk", [1, 2, 4])
def test_read_sum_in_contiguous_runs_sums_each_run(chunk):
    torch.manual_seed(1)
    x = torch.randn(512 * 8, dtype=torch.bfloat16)
    out = read_sum(x, block=512, chunk=chunk, programs=99)  # programs is ignored with chunk
    assert out.shape == (8 // chunk,)
    torch.testing.assert_close(out, x.float().view(8 // chunk, -1).sum(1), rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("kwargs, message", [
    (dict(block=1000), "block must be a power of two"),
    (dict(warps=3), "warps must be one of"),
    (dict(stages=0), "stages must be >= 1"),
    (dict(programs=0), "programs must be >= 1"),
    (dict(chunk=-1), "chunk must be >= 0"),
    (dict(block=1024, chunk=8), "multiple of chunk \\* block"),
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
    r = read_bandwidth("cpu", 2**18, reps=3)
    assert r["how"] == "torch.sum" and r["bytes_per_s"] > 0 and r["candidates"] == [("torch.sum", r["bytes_per_s"])]
    with pytest.raises(ValueError, match="nbytes must be"):
        read_bandwidth("cpu", 100)


def test_configs_fill_whole_16_byte_loads_and_have_labels():
    labels = [config_label(*c) for c in READ_CONFIGS]
    assert len(set(labels)) == len(labels)
    for (block, warps, stages, programs), label in zip(READ_CONFIGS, labels):
        assert block % (warps * 32 * 8) == 0  # 8 bf16 a thread a load at least
        assert programs[0] in "xc" and int(programs[1:]) >= 1
        assert 65536 % (block * (int(programs[1:]) if programs[0] == "c" else 1)) == 0  # read_bandwidth's buffer
        assert label.startswith(f"read_sum {block} w{warps} st{stages} ")
    assert config_label(4096, 4, 3, "x8") == "read_sum 4096 w4 st3 x8/SM"
    assert config_label(8192, 8, 2, "c4") == "read_sum 8192 w8 st2 4 pieces a program"


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

"""The read-only ceiling's kernel (:mod:`orthros.benchmarks.read_stream`), through the Triton
interpreter on the CPU: it reads every element once, and its arguments are checked."""

import pytest
import torch

from orthros.benchmarks.read_stream import BUFFER_QUANTUM, READ_CONFIGS, config_label, read_bandwidth, read_sum


@pytest.mark.parametrize("chunk", [1, 2, 4])
def test_read_sum_sums_each_run_of_contiguous_pieces(chunk):
    torch.manual_seed(1)
    x = torch.randn(512 * 8, dtype=torch.bfloat16)
    out = read_sum(x, block=512, chunk=chunk, warps=4)
    assert out.shape == (8 // chunk,) and out.dtype == torch.float32
    torch.testing.assert_close(out, x.float().view(8 // chunk, -1).sum(1), rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("kwargs, message", [
    (dict(block=1000), "block must be a power of two"),
    (dict(warps=3), "warps must be one of"),
    (dict(stages=0), "stages must be >= 1"),
    (dict(chunk=0), "chunk must be >= 1"),
    (dict(block=1024, chunk=8), r"multiple of chunk \* block \(8192\)"),
])
def test_read_sum_refuses_bad_configs(kwargs, message):
    with pytest.raises(ValueError, match=message):
        read_sum(torch.zeros(4096, dtype=torch.bfloat16), **{"block": 512, "chunk": 1, **kwargs})


def test_read_sum_refuses_inputs_that_are_not_flat():
    with pytest.raises(ValueError, match="contiguous 1-D"):
        read_sum(torch.zeros(4, 1024, dtype=torch.bfloat16), block=512, chunk=1)


@pytest.mark.parametrize("out", [torch.zeros(100)[:2], torch.zeros(8, dtype=torch.int32), torch.zeros(8, 1),
                                 torch.zeros(16)[::2]])
def test_read_sum_refuses_an_out_of_another_shape_or_dtype(out):
    """Was: the kernel wrote its 8 sums into a 2-element ``out`` (past its end: here into the rest of
    its base tensor, on a GPU into whatever memory follows) and returned the 2; cast them to int; or
    wrote them one after the other into a strided view."""
    with pytest.raises(ValueError, match=r"out must be a contiguous float32 tensor of shape \(8,\)"):
        read_sum(torch.ones(512 * 8, dtype=torch.bfloat16), block=512, chunk=1, warps=4, out=out)
    assert out.sum() == 0


def test_read_bandwidth_on_the_cpu_times_torch_sum_and_checks_its_arguments():
    r = read_bandwidth("cpu", 2**18, reps=3)
    assert r["how"] == "torch.sum" and r["bytes_per_s"] > 0 and r["candidates"] == [("torch.sum", r["bytes_per_s"])]
    with pytest.raises(ValueError, match="nbytes must be"):
        read_bandwidth("cpu", 100)
    with pytest.raises(ValueError, match="must divide"):
        read_bandwidth("cpu", 2**18, configs=[(8192, 8, 2, 16)])


def test_configs_fill_whole_16_byte_loads_and_have_labels():
    labels = [config_label(*c) for c in READ_CONFIGS]
    assert len(set(labels)) == len(labels)
    for (block, warps, stages, chunk), label in zip(READ_CONFIGS, labels):
        assert block % (warps * 32 * 8) == 0  # 8 bf16 a thread a load at least
        assert BUFFER_QUANTUM % (block * chunk) == 0
        assert label == f"read_sum {block}x{chunk} w{warps} st{stages}"


@pytest.mark.gpu
def test_read_bandwidth_on_cuda_times_every_config_and_torch_sum():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    r = read_bandwidth("cuda", 2**27, reps=3)  # read_bandwidth checks each config's sum itself
    assert [h for h, _ in r["candidates"]] == [config_label(*c) for c in READ_CONFIGS] + ["torch.sum"]
    assert r["bytes_per_s"] == max(b for _, b in r["candidates"]) > 0
    x = torch.randn(8192 * 32, dtype=torch.bfloat16, device="cuda")
    torch.testing.assert_close(read_sum(x, block=8192, chunk=4).sum(), x.float().sum(), rtol=1e-4, atol=1e-2)

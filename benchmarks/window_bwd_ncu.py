"""The window stream's fwd+bwd at T = 32K (Qwen3-8B heads: 32 query / 8 KV, head dim 128, bf16,
window 128), run three times: the launches Nsight Compute profiles in benchmarks/window_bwd_gpu.sh
(``ncu --kernel-name regex:_stream_bwd --launch-skip 2N --launch-count N ...``: the third run's
backward, N = 1 launch fused, 2 in two launches).

    python benchmarks/window_bwd_ncu.py ['{"bwd_dkdv": [32, 64, 4, 2], "fused": true, "dkdv_variant": "rel"}']

The optional argument is a backward config as ``--window-bwd-config`` takes it (keys of
``orthros.ops.triton.attention.check_bwd_config``); default: the defaults.
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from orthros.benchmarks.inference import parse_bwd_config  # noqa: E402


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="needs a CUDA GPU (Nsight Compute profiles its launches)")
    p.add_argument("config", nargs="?", default=None, metavar="JSON",
                   help="a backward config as --window-bwd-config takes it, e.g. "
                        "'{\"bwd_dkdv\": [32, 64, 4, 2], \"fused\": true}' (default: the defaults)")
    a = p.parse_args(argv)
    try:  # were: a ValueError traceback for bad JSON, torch's AssertionError without a GPU
        a.over = parse_bwd_config(a.config) if a.config is not None else {}
    except ValueError as e:
        p.error(f"config {a.config!r}: {e}")
    if not torch.cuda.is_available():
        p.error("needs a CUDA GPU (the window stream's Triton kernels, profiled by Nsight Compute)")
    return a


def main(argv):
    from orthros.ops import orthros_attention
    from orthros.ops.triton import attention as ta

    over = parse_args(argv).over
    with ta.bwd_config(**over):
        print("bwd_dkdv", ta.CONFIGS["bwd_dkdv"][128], "fused", ta.FUSED_BWD, "dq", ta.DQ_VARIANT, "dkdv",
              ta.DKDV_VARIANT, flush=True)
        torch.manual_seed(0)
        T = 32768
        q = torch.randn(1, T, 32, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(1, T, 8, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(1, T, 8, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        for _ in range(3):
            o, _ = orthros_attention(q, k, v, q[:, :0], window_size=128, backend="triton")
            o.backward(torch.ones_like(o))
        torch.cuda.synchronize()
    print("done")


if __name__ == "__main__":
    main(sys.argv[1:])

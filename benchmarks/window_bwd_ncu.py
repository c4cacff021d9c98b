"""The window stream's fwd+bwd at T = 32K (Qwen3-8B heads: 32 query / 8 KV, head dim 128, bf16,
window 128), run three times: the launches Nsight Compute profiles in benchmarks/window_bwd_gpu.sh
(``ncu --kernel-name regex:_stream_bwd --launch-skip 2N --launch-count N ...``: the third run's
backward, N = 1 launch fused, 2 in two launches).

    python benchmarks/window_bwd_ncu.py ['{"bwd_dkdv": [32, 64, 4, 2], "fused": true, "dkdv_variant": "rel"}']

The optional argument is a backward config as ``--window-bwd-config`` takes it (keys of
``orthros.ops.triton.attention.check_bwd_config``); default: the defaults.
"""

import sys

import torch

from orthros.benchmarks.inference import parse_bwd_config
from orthros.ops import orthros_attention
from orthros.ops.triton import attention as ta


def main(argv):
    over = parse_bwd_config(argv[0]) if argv else {}
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

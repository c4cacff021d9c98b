"""Issue #18 roofline sweep: decode vs the HBM floor and gpt-fast, batched decode, the window
stream vs FlexAttention and its floor; ``results.json`` + ``roofline.png``. The sweep itself is
:mod:`orthros.benchmarks.roofline`; this entry hands it ``benchmarks/attention.py``'s timing
of the window stream (``window_stream``: do_bench, CUDA-graph replay, Flex sliding window).

    python benchmarks/roofline.py --gpt-fast-dir .gpu/gpt-fast --out OUT [--deadline-s 500]
    python benchmarks/roofline.py --device cpu --quick --gpt-fast-dir DIR --out OUT   # smoke run
    python benchmarks/roofline.py --plot-only OUT/results.json --out OUT2               # redraw

``benchmarks/roofline_gpu.sh`` is the one GPU call. See docs/benchmarks.md, "Issue #18".
"""

from __future__ import annotations

import importlib.util
import os
import sys


def _cpu_requested(argv) -> bool:
    for i, arg in enumerate(argv):
        if arg == "--device" and i + 1 < len(argv):
            return argv[i + 1].startswith("cpu")
        if arg.startswith("--device="):
            return arg.split("=", 1)[1].startswith("cpu")
    return False


if _cpu_requested(sys.argv[1:]):  # the Triton kernels run in the interpreter on a CPU (set before triton loads)
    os.environ.setdefault("TRITON_INTERPRET", "1")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import torch  # noqa: E402

from orthros.benchmarks.roofline import main  # noqa: E402


def _attention_module():
    """benchmarks/attention.py, imported from its file (a script, not a package)."""
    spec = importlib.util.spec_from_file_location("orthros_bench_attention", os.path.join(HERE, "attention.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # torch.compile (Flex) re-imports a traced function's module by name
    spec.loader.exec_module(mod)
    return mod


def window_factory(device):
    """``bench(T) -> (measured, shape, errors)`` through attention.py's ``window_stream``: its
    forward / fwd+bwd / fwd+bwd CUDA-graph times of the Triton window stream and Flex's
    sliding window, at its sizes (GPU: bf16, Hq 32, Hkv 8, D 128; CPU: its dry run, fp32,
    Hq 4, Hkv 1, D 32, T / 256, no Flex)."""
    att = _attention_module()
    # one Flex compile per length and pass (attention.py compiles at static shapes): stay clear of
    # dynamo's default recompile limit, past which Flex would silently run eagerly
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    if device.type == "cpu":
        att.DRY, att.DEV, att.DT = True, "cpu", torch.float32
        att.HQ, att.HKV, att.D = 4, 1, 32
    else:
        att.DRY, att.DEV, att.DT = False, str(device), torch.bfloat16

    def bench(T):
        key = f"window_T{T}"
        att.RES.pop(key, None)
        n_err = len(att.RES.get("errors", []))
        att.window_stream([T], flex_Ts={T}, graph=True)
        shape = {"T": att.sz(T), "Hq": att.HQ, "Hkv": att.HKV, "D": att.D, "window": att.W,
                 "elem_bytes": att.DT.itemsize, "dtype": str(att.DT).replace("torch.", "")}
        return dict(att.RES.get(key, {})), shape, att.RES.get("errors", [])[n_err:]
    return bench


if __name__ == "__main__":
    sys.exit(main(window_factory=window_factory))

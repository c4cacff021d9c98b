"""Training throughput: tokens/s and MFU of Orthros vs. Transformer (and SWA) training steps.

Default: the paper's 1.3B shape (d 2048, 24 layers, 16 heads x 128, SwiGLU 5632, vocab 32000),
sequence 2048, bf16 autocast, AdamW, one GPU. Each architecture runs the same training step
as ``orthros train`` (forward with labels -> loss -> backward -> clip -> AdamW), timed with
CUDA synchronisation after warm-up steps. Output: one JSON line per architecture and a
summary line with the Orthros / Transformer step-time ratio (issue target: <= 2.1x).

    python benchmarks/train_throughput.py                          # 1.3B, seq 2048, all archs
    python benchmarks/train_throughput.py --arch orthros transformer --micro-batch 4 --ac
    python benchmarks/train_throughput.py --shape tiny --device cpu --steps 2   # runnability check
    python benchmarks/train_throughput.py --shape smollm2-135m --seq-len 8192 --micro-batch 2 \
        --arch orthros transformer [--compile]      # issue 15's CPT step (configs/smollm2_cpt.yaml)

MFU = model FLOPs / step time / peak. Model FLOPs (orthros.training.metrics.train_flops)
count what each architecture needs: Orthros' linear layers see 2T tokens (base + output
stream) in pre-training, its attention is a window of w over the base stream plus full causal
attention for the output stream; recomputation under activation checkpointing is not counted.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import orthros  # noqa: E402,F401
from orthros.models import OrthrosConfig, OrthrosForCausalLM  # noqa: E402
from orthros.training.metrics import detect_peak_flops, train_flops  # noqa: E402
from orthros.training.trainer import enable_activation_checkpointing  # noqa: E402
from orthros.utils import commit_id  # noqa: E402

SHAPES = {
    "1.3b": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=24, num_attention_heads=16,
                 num_key_value_heads=16, head_dim=128, vocab_size=32000),
    # SmolLM2-135M (issue 15's CPT model; random weights: a step's time does not depend on them)
    "smollm2-135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, head_dim=64, vocab_size=49152, rope_theta=100000.0,
                         tie_word_embeddings=True),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=2, head_dim=32, vocab_size=512),
}
MODES = {"orthros": "orthros", "transformer": "full", "swa": "window"}


def bench_one(arch: str, a, device: torch.device) -> dict:
    torch.manual_seed(0)
    window = a.swa_window if arch == "swa" else a.window
    cfg = OrthrosConfig(**{"tie_word_embeddings": False, **SHAPES[a.shape]}, window_size=window,
                        attention_mode=MODES[arch], scale_offset=not a.no_scale_offset,
                        max_position_embeddings=max(4096, a.seq_len), use_cache=False, attn_backend=a.backend)
    model = OrthrosForCausalLM(cfg).to(device)
    if a.ac:
        enable_activation_checkpointing(model)
    if a.compile:
        for layer in model.model.layers:
            layer.compile()
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=device.type == "cuda")
    B, T = a.micro_batch, a.seq_len
    ids = torch.randint(0, cfg.vocab_size, (B, T), device=device)
    amp = torch.autocast(device_type=device.type, dtype=torch.bfloat16) if a.dtype == "bf16" else \
        torch.autocast(device_type=device.type, enabled=False)

    def step():
        for _ in range(a.grad_accum):
            with amp:
                loss = model(input_ids=ids, labels=ids, use_cache=False).loss
            (loss / a.grad_accum).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    for _ in range(a.warmup):
        step()
    sync()
    times = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        loss = step()
        sync()
        times.append(time.perf_counter() - t0)
    step_s = sorted(times)[len(times) // 2]  # median
    tokens = B * T * a.grad_accum
    flops = train_flops(cfg, [T] * B, B * (T - 1)) * a.grad_accum
    peak = a.peak_tflops * 1e12 if a.peak_tflops else detect_peak_flops(device, a.dtype)
    res = {
        "arch": arch, "shape": a.shape, "params_M": round(n_params / 1e6, 1), "seq_len": T, "micro_batch": B,
        "grad_accum": a.grad_accum, "window": window, "dtype": a.dtype, "ac": a.ac, "compile": a.compile,
        "backend": a.backend, "step_s_median": step_s, "step_s_min": min(times), "tokens_per_s": tokens / step_s,
        "model_tflops_per_step": flops / 1e12, "achieved_tflops": flops / step_s / 1e12,
        "mfu": (flops / step_s / peak) if peak else None, "loss": float(loss.detach()),
        "peak_mem_GiB": torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__, "commit": commit_id(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    del model, opt
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return res


def _check_args(a) -> str:
    """Every value a run would otherwise trip over after its model is built (an empty median, no
    loss, a NaN MFU in the JSON, an --out that cannot be appended to): ``ValueError`` naming the
    option. Makes --out's folder; returns the device."""
    from orthros.utils import check_device, check_output_path, check_positive_int

    for name in ("steps", "micro_batch", "grad_accum", "window", "swa_window", "seq_len"):
        check_positive_int(f"--{name.replace('_', '-')}", getattr(a, name))
    if a.seq_len < 2:
        raise ValueError(f"--seq-len must be >= 2 (a step predicts each token from the ones before), got {a.seq_len}")
    if a.warmup < 0:
        raise ValueError(f"--warmup must be >= 0, got {a.warmup}")
    if a.peak_tflops is not None and not 0 < a.peak_tflops < math.inf:
        raise ValueError(f"--peak-tflops must be a positive number of TFLOP/s, got {a.peak_tflops}")
    dev = check_device(a.device, auto=True)
    if a.device == "auto" and dev == "cpu" and a.shape != "tiny":
        # was: --device auto fell back to the CPU and trained the 1.3B shape there (hours, tens of GB)
        raise ValueError(f"--device auto: no CUDA device here, and --shape {a.shape} is a GPU benchmark; give "
                         f"--shape tiny --device cpu for a runnability check (or --device cpu to run --shape "
                         f"{a.shape} on the CPU anyway)")
    if a.out:
        check_output_path("--out", a.out)
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    return dev


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", nargs="+", default=["transformer", "orthros", "swa"], choices=list(MODES))
    p.add_argument("--shape", default="1.3b", choices=list(SHAPES))
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--micro-batch", type=int, default=4, help="sequences per forward")
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--window", type=int, default=128, help="Orthros window (paper: 128)")
    p.add_argument("--swa-window", type=int, default=512, help="SWA baseline window (paper, 1.3B: 512)")
    p.add_argument("--no-scale-offset", action="store_true")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    p.add_argument("--ac", action="store_true", help="activation checkpointing")
    p.add_argument("--compile", action="store_true", help="torch.compile each decoder layer")
    p.add_argument("--backend", default="auto", choices=["auto", "reference", "triton"])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--peak-tflops", type=float, default=None, help="override the detected peak (bf16 dense)")
    p.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"],
                   help="auto (default): cuda where there is one; without one, only --shape tiny falls back to the CPU")
    p.add_argument("--out", default=None, help="append the JSON lines to this file")
    a = p.parse_args(argv)
    try:
        dev = _check_args(a)
    except ValueError as e:
        p.error(str(e))
    device = torch.device(dev)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    results = {}
    for arch in a.arch:
        try:
            r = bench_one(arch, a, device)
        except torch.OutOfMemoryError as e:
            r = {"arch": arch, "error": f"OOM: {str(e)[:200]} (try --micro-batch smaller or --ac)"}
            gc.collect()
            torch.cuda.empty_cache()
        results[arch] = r
        line = json.dumps(r)
        print(line, flush=True)
        if a.out:
            with open(a.out, "a") as f:
                f.write(line + "\n")
    if "orthros" in results and "transformer" in results and "error" not in results["orthros"] \
            and "error" not in results["transformer"]:
        ratio = results["orthros"]["step_s_median"] / results["transformer"]["step_s_median"]
        summary = {"summary": "orthros_vs_transformer", "step_time_ratio": ratio, "target": 2.1,
                   "meets_target": ratio <= 2.1 and math.isfinite(ratio)}
        print(json.dumps(summary), flush=True)
        if a.out:
            with open(a.out, "a") as f:
                f.write(json.dumps(summary) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark of the Orthros attention kernels on one GPU (bf16, B=1, Hq=32, Hkv=8, D=128, w=128).

Baselines are measured in the same run and every figure is reported as a ratio:

* training fwd+bwd of the whole op (both streams, PT: output stream at every position)
  against SDPA cuDNN and flash causal attention alone;
* the window stream alone (fwd, fwd+bwd) against FlexAttention sliding window;
* prefill (window stream + the last token's full query) up to 1M tokens, against SDPA cuDNN
  causal forward where it runs;
* one decode step (window + full query) against SDPA single-query decode, eager and CUDA
  graph, with the KV bandwidth it reaches.

Timings: CUDA events through ``triton.testing.do_bench`` (median). Run on a GPU:
``python benchmarks/attention.py [--quick] [--sweep] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import os  # noqa: F401
import json
import math
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
from triton.testing import do_bench

sys.path.insert(0, ".")
from orthros.ops import orthros_attention  # noqa: E402
from orthros.ops.decode import orthros_decode_attention  # noqa: E402

DEV = "cuda"
DT = torch.bfloat16
HQ, HKV, D, W = 32, 8, 128, 128
RES = {}


def bench(fn, rep=100):
    return do_bench(fn, warmup=25, rep=rep, return_mode="median")


def log(msg):
    print(msg, flush=True)


def sdpa(be):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    b = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[be]

    def f(q, k, v):
        with sdpa_kernel(b):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    return f


def training(Ts):
    log("\n## training fwd+bwd (PT: window stream + full stream at every position)")
    log(f"{'T':>7} {'cuDNN':>9} {'flash':>9} {'orthros':>9} {'x cuDNN':>8} {'win only':>9}")
    for T in Ts:
        row = {}
        q = torch.randn(1, HQ, T, D, device=DEV, dtype=DT, requires_grad=True)
        k = torch.randn(1, HKV, T, D, device=DEV, dtype=DT, requires_grad=True)
        v = torch.randn(1, HKV, T, D, device=DEV, dtype=DT, requires_grad=True)
        g = torch.randn(1, HQ, T, D, device=DEV, dtype=DT)
        for be in ("cudnn", "flash"):
            f = sdpa(be)
            try:
                row[be] = bench(lambda: torch.autograd.grad(f(q, k, v), (q, k, v), g))
            except Exception as e:  # noqa: BLE001
                log(f"  {be} failed: {type(e).__name__}: {str(e)[:120]}")
        del q, k, v, g
        # orthros, layout [B, T, H, D]
        qb = torch.randn(1, T, HQ, D, device=DEV, dtype=DT, requires_grad=True)
        qo = torch.randn(1, T, HQ, D, device=DEV, dtype=DT, requires_grad=True)
        kb = torch.randn(1, T, HKV, D, device=DEV, dtype=DT, requires_grad=True)
        vb = torch.randn(1, T, HKV, D, device=DEV, dtype=DT, requires_grad=True)
        gb = torch.randn(1, T, HQ, D, device=DEV, dtype=DT)

        def whole():
            o, oo = orthros_attention(qb, kb, vb, qo, window_size=W, backend="triton")
            return torch.autograd.grad((o, oo), (qb, kb, vb, qo), (gb, gb))

        def win():
            o, _ = orthros_attention(qb, kb, vb, qo[:, :0], window_size=W, backend="triton")
            return torch.autograd.grad(o, (qb, kb, vb), gb)
        row["orthros"] = bench(whole)
        row["window"] = bench(win)
        r = row["orthros"] / row["cudnn"] if "cudnn" in row else float("nan")
        log(f"{T:>7} {row.get('cudnn', float('nan')):9.3f} {row.get('flash', float('nan')):9.3f} "
            f"{row['orthros']:9.3f} {r:8.3f} {row['window']:9.3f}")
        RES[f"train_T{T}"] = row
        del qb, qo, kb, vb, gb
        torch.cuda.empty_cache()


def window_stream(Ts, flex_Ts):
    log("\n## window stream alone (w=128): fwd and fwd+bwd vs FlexAttention SWA")
    log(f"{'T':>8} {'flex fwd':>9} {'ours fwd':>9} {'ratio':>6} {'flex f+b':>9} {'ours f+b':>9} {'ratio':>6}  ours TB/s fwd")
    flex = None
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        flex = torch.compile(flex_attention, dynamic=False)
    except Exception as e:  # noqa: BLE001
        log(f"  no flex: {e}")
    for T in Ts:
        row = {}
        grad = T <= 262144
        q = torch.randn(1, T, HQ, D, device=DEV, dtype=DT, requires_grad=grad)
        k = torch.randn(1, T, HKV, D, device=DEV, dtype=DT, requires_grad=grad)
        v = torch.randn(1, T, HKV, D, device=DEV, dtype=DT, requires_grad=grad)
        qo = q[:, :0].detach()
        g = torch.randn(1, T, HQ, D, device=DEV, dtype=DT) if grad else None
        with torch.no_grad():
            row["ours_fwd"] = bench(lambda: orthros_attention(q, k, v, qo, window_size=W, backend="triton"))
        if grad:
            row["ours_fb"] = bench(lambda: torch.autograd.grad(
                orthros_attention(q, k, v, qo, window_size=W, backend="triton")[0], (q, k, v), g))
        if flex is not None and T in flex_Ts:
            try:
                qt, kt, vt = (x.detach().transpose(1, 2).contiguous().requires_grad_(grad) for x in (q, k, v))

                def swa(b, h, qi, ki):
                    return (qi >= ki) & (qi - ki < W)
                bm = create_block_mask(swa, 1, 1, T, T, device=DEV, _compile=True)
                with torch.no_grad():
                    row["flex_fwd"] = bench(lambda: flex(qt, kt, vt, block_mask=bm, enable_gqa=True))
                if grad:
                    gt = g.transpose(1, 2).contiguous()
                    row["flex_fb"] = bench(lambda: torch.autograd.grad(
                        flex(qt, kt, vt, block_mask=bm, enable_gqa=True), (qt, kt, vt), gt))
                del qt, kt, vt
            except Exception as e:  # noqa: BLE001
                log(f"  flex T={T} failed: {type(e).__name__}: {str(e)[:150]}")
        byts = T * (2 * HQ + 2 * HKV) * D * 2
        nan = float("nan")
        log(f"{T:>8} {row.get('flex_fwd', nan):9.3f} {row['ours_fwd']:9.3f} "
            f"{row['ours_fwd'] / row.get('flex_fwd', nan):6.2f} {row.get('flex_fb', nan):9.3f} "
            f"{row.get('ours_fb', nan):9.3f} {row.get('ours_fb', nan) / row.get('flex_fb', nan):6.2f}  "
            f"{byts / row['ours_fwd'] / 1e9:5.2f}")
        RES[f"window_T{T}"] = row
        del q, k, v, g
        torch.cuda.empty_cache()


def prefill(Ts):
    log("\n## prefill forward: window stream + the last token's full query (vs SDPA cuDNN causal fwd)")
    log(f"{'T':>8} {'cuDNN fwd':>10} {'orthros':>9} {'speedup':>8} {'last-query only':>15}")
    for T in Ts:
        row = {}
        q = torch.randn(1, T, HQ, D, device=DEV, dtype=DT)
        k = torch.randn(1, T, HKV, D, device=DEV, dtype=DT)
        v = torch.randn(1, T, HKV, D, device=DEV, dtype=DT)
        qo = q[:, -1:].clone()
        with torch.no_grad():
            row["orthros"] = bench(lambda: orthros_attention(q, k, v, qo, window_size=W, backend="triton"))
            row["last_query"] = bench(lambda: orthros_attention(q[:, :0], k, v, qo, window_size=W, backend="triton"))
            if T <= 131072:
                f = sdpa("cudnn")
                qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
                row["cudnn"] = bench(lambda: f(qt, kt, vt), rep=50)
        nan = float("nan")
        log(f"{T:>8} {row.get('cudnn', nan):10.3f} {row['orthros']:9.3f} {row.get('cudnn', nan) / row['orthros']:8.1f}"
            f" {row['last_query']:15.3f}")
        RES[f"prefill_T{T}"] = row
        del q, k, v
        torch.cuda.empty_cache()


def graph_time(fn):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    gr = torch.cuda.CUDAGraph()
    with torch.cuda.graph(gr):
        fn()
    return bench(gr.replay)


def decode(Ls, B=1):
    log(f"\n## decode step (B={B}): window + full query, one split launch + merge, vs SDPA single-query decode")
    log(f"{'L':>8} {'sdpa':>8} {'ours':>8} {'ratio':>6} {'sdpa graph':>10} {'ours graph':>10} {'ratio':>6} {'ours TB/s':>9}")
    for L in Ls:
        row = {}
        q = torch.randn(B, 1, HQ, D, device=DEV, dtype=DT)
        qo = torch.randn(B, 1, HQ, D, device=DEV, dtype=DT)
        kc = torch.randn(B, L, HKV, D, device=DEV, dtype=DT)
        vc = torch.randn(B, L, HKV, D, device=DEV, dtype=DT)
        lens = torch.full((B,), L, device=DEV, dtype=torch.int32)
        qs = torch.randn(B, HQ, 1, D, device=DEV, dtype=DT)
        ks = torch.randn(B, HKV, L, D, device=DEV, dtype=DT)
        vs = torch.randn(B, HKV, L, D, device=DEV, dtype=DT)
        sd = lambda: F.scaled_dot_product_attention(qs, ks, vs, enable_gqa=True)  # noqa: E731
        ours = lambda: orthros_decode_attention(q, qo, kc, vc, lens, window_size=W)  # noqa: E731
        row["sdpa"] = bench(sd)
        row["ours"] = bench(ours)
        row["sdpa_graph"] = graph_time(sd)
        row["ours_graph"] = graph_time(ours)
        byts = 2 * B * L * HKV * D * 2
        row["ours_TBps"] = byts / row["ours_graph"] / 1e9
        row["sdpa_TBps"] = byts / row["sdpa_graph"] / 1e9
        log(f"{L:>8} {row['sdpa'] * 1e3:8.1f} {row['ours'] * 1e3:8.1f} {row['ours'] / row['sdpa']:6.2f} "
            f"{row['sdpa_graph'] * 1e3:10.1f} {row['ours_graph'] * 1e3:10.1f} "
            f"{row['ours_graph'] / row['sdpa_graph']:6.2f} {row['ours_TBps']:9.2f}")
        RES[f"decode_B{B}_L{L}"] = row
        del kc, vc, ks, vs
        torch.cuda.empty_cache()


def sweep():
    """Block configurations of the window kernels and the decode kernel."""
    from orthros.ops.triton import attention as ta
    from orthros.ops.triton import decode as td

    log("\n## sweep: window stream fwd / fwd+bwd at T=32K")
    T = 32768
    q = torch.randn(1, T, HQ, D, device=DEV, dtype=DT, requires_grad=True)
    k = torch.randn(1, T, HKV, D, device=DEV, dtype=DT, requires_grad=True)
    v = torch.randn(1, T, HKV, D, device=DEV, dtype=DT, requires_grad=True)
    g = torch.randn(1, T, HQ, D, device=DEV, dtype=DT)
    qo = q[:, :0].detach()
    base = dict(ta.CONFIGS["win_fwd"])
    for cfg in [(64, 64, 4, 3), (128, 64, 8, 3), (128, 32, 4, 3), (64, 32, 4, 3), (128, 64, 4, 2), (64, 64, 4, 2)]:
        ta.CONFIGS["win_fwd"][128] = cfg
        with torch.no_grad():
            ms = bench(lambda: orthros_attention(q, k, v, qo, window_size=W, backend="triton"))
        log(f"  win_fwd {cfg}: {ms:.3f} ms")
        RES[f"sweep_win_fwd_{cfg}"] = ms
    ta.CONFIGS["win_fwd"].update(base)
    for kind, cfgs in [("bwd_dq", [(64, 64, 4, 2), (128, 64, 8, 2), (64, 32, 4, 3), (128, 32, 4, 2)]),
                       ("bwd_dkdv", [(64, 64, 4, 2), (64, 128, 8, 2), (32, 64, 4, 3), (64, 32, 4, 2)])]:
        keep = ta.CONFIGS[kind][128]
        for cfg in cfgs:
            ta.CONFIGS[kind][128] = cfg
            ms = bench(lambda: torch.autograd.grad(
                orthros_attention(q, k, v, qo, window_size=W, backend="triton")[0], (q, k, v), g))
            log(f"  {kind} {cfg}: fwd+bwd {ms:.3f} ms")
            RES[f"sweep_{kind}_{cfg}"] = ms
        ta.CONFIGS[kind][128] = keep
    del q, k, v, g
    log("\n## sweep: decode at L=131072 (graph replay)")
    L = 131072
    q = torch.randn(1, 1, HQ, D, device=DEV, dtype=DT)
    kc = torch.randn(1, L, HKV, D, device=DEV, dtype=DT)
    vc = torch.randn(1, L, HKV, D, device=DEV, dtype=DT)
    lens = torch.full((1,), L, device=DEV, dtype=torch.int32)
    keep = dict(td.DECODE_CONFIG)
    for bn, nw, ns, waves in [(64, 4, 3, 2), (128, 4, 3, 2), (64, 4, 4, 4), (128, 8, 3, 2), (32, 4, 4, 2), (64, 4, 3, 1)]:
        td.DECODE_CONFIG.update(block_n=bn, num_warps=nw, num_stages=ns, waves=waves)
        ms = graph_time(lambda: orthros_decode_attention(q, q, kc, vc, lens, window_size=W))
        log(f"  decode bn={bn} warps={nw} stages={ns} waves={waves}: {ms * 1e3:.1f} us "
            f"({2 * L * HKV * D * 2 / ms / 1e9:.2f} TB/s)")
        RES[f"sweep_decode_{bn}_{nw}_{ns}_{waves}"] = ms
    td.DECODE_CONFIG.update(keep)


def compare_fused(Ts):
    """Window-stream fwd+bwd with the backward in one launch (fused) or two."""
    from orthros.ops.triton import attention as ta

    log("\n## window stream fwd+bwd: backward dQ and dK/dV in one launch vs two")
    log(f"{'T':>8} {'fused':>8} {'two':>8}")
    keep = ta.FUSED_BWD
    for T in Ts:
        q = torch.randn(1, T, HQ, D, device=DEV, dtype=DT, requires_grad=True)
        k = torch.randn(1, T, HKV, D, device=DEV, dtype=DT, requires_grad=True)
        v = torch.randn(1, T, HKV, D, device=DEV, dtype=DT, requires_grad=True)
        g = torch.randn(1, T, HQ, D, device=DEV, dtype=DT)
        qo = q[:, :0].detach()
        row = {}
        for name, fused in (("fused", True), ("two", False)):
            ta.FUSED_BWD = fused
            row[name] = bench(lambda: torch.autograd.grad(
                orthros_attention(q, k, v, qo, window_size=W, backend="triton")[0], (q, k, v), g))
        log(f"{T:>8} {row['fused']:8.3f} {row['two']:8.3f}")
        RES[f"fused_T{T}"] = row
    ta.FUSED_BWD = keep


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--only", default="train,window,prefill,decode")
    ap.add_argument("--json", default=None)
    ap.add_argument("--short", action="store_true", help="a few sizes of training/window/decode only")
    a = ap.parse_args()
    import os

    commit = os.environ.get("ORTHROS_COMMIT", "")
    try:
        commit = commit or subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except Exception:  # noqa: BLE001
        commit = "?"
    import triton
    log(f"# {torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__} "
        f"commit {commit or '?'} {time.strftime('%Y-%m-%d %H:%M')}")
    t0 = time.time()
    if a.sweep:
        sweep()
    only = a.only.split(",")
    if a.short:
        compare_fused([2048, 8192, 32768])
        training([2048, 8192, 16384])
        window_stream([8192, 32768], flex_Ts={8192})
        decode([8192, 32768])
        only = []
    if "train" in only:
        training([2048, 8192, 16384] if a.quick else [2048, 8192, 16384, 32768, 65536])
    if "window" in only:
        window_stream([8192, 32768] if a.quick else [8192, 32768, 131072, 524288, 1048576],
                      flex_Ts={8192, 32768, 131072})
    if "prefill" in only:
        prefill([32768] if a.quick else [32768, 131072, 1048576])
    if "decode" in only:
        decode([8192, 32768, 131072] if a.quick else [8192, 32768, 131072, 1048576])
        decode([32768], B=8)
    log(f"\n(total {time.time() - t0:.0f} s)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "commit": commit, "results": RES}, f, indent=1)


if __name__ == "__main__":
    main()

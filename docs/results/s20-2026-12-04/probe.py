"""Timing probe (not a result of the library; numbers are wrong on purpose): the pair's QKV GEMV
(M = 2, N = 6144, norm prologue) launched with split-K and NO reduce kernel, as if the decode
attention kernel summed the float32 partials itself. The late norm runs in each split (its rstd
from the split's own slice: wrong values, the same work). The attention kernel reads the first
bytes of the partials as bf16 rows (fewer bytes than the real design's S float32 partials).
PROBE_QKV="block_n,block_k,split[,warps,stages]"; unset: no patch. Then runs roofline.py's main.
"""
import os
import runpy
import sys

import torch

import orthros.ops.gemv.kernel as K
from orthros.ops.triton import common as _tc

spec = os.environ.get("PROBE_QKV", "")
if spec:
    parts = [int(v) for v in spec.split(",")]
    bn, bk, sp = parts[:3]
    nw = parts[3] if len(parts) > 3 else 4
    ns = parts[4] if len(parts) > 4 else 3
    cfg = K.GemvConfig(block_n=bn, block_k=bk, split=sp, dot=True, num_warps=nw, num_stages=ns)
    orig = K.gemv_triton

    def patched(x, weight, bias=None, *, config=None, norm_weight=None, norm_eps=None, act=None, residual=None,
                out_norm_weight=None, out_norm_eps=None):
        N, Kd = weight.shape
        M = x.numel() // x.shape[-1]
        if not (M == 2 and N == 6144 and norm_weight is not None and act is None and residual is None
                and out_norm_weight is None and bias is None and config is None):
            return orig(x, weight, bias, config=config, norm_weight=norm_weight, norm_eps=norm_eps, act=act,
                        residual=residual, out_norm_weight=out_norm_weight, out_norm_eps=out_norm_eps)
        split, kps = K.split_k(cfg, Kd)
        x2 = x.reshape(M, Kd)
        part = torch.empty(split, M, N, dtype=torch.float32, device=x.device)
        pdl = K.pdl_kwargs(x.device)
        early = dict(K.prefetch_tile(N, kps, split, x.element_size()), SIGNAL_END=_tc.PDL_SIGNAL == "end") \
            if pdl else {}
        K._gemv_kernel[(K.cdiv(N, cfg.block_n), split)](
            x2, weight, part, part, part, norm_weight, part, M, N, Kd, Kd, weight.stride(0), 0, kps, float(norm_eps),
            BLOCK_M=16, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, M_ROWS=M, DOT=True, SPLIT=split,
            HAS_BIAS=False, UPCAST=False, PREC="tf32", EVEN_K=Kd % cfg.block_k == 0, NUM_STAGES=cfg.num_stages,
            NORM=False, SILU=False, HAS_RES=False, EMU_RNE=False, NORM_M=1, NORM_K=16, DEFER=False,
            NORM_LATE=True, num_warps=cfg.num_warps, num_stages=cfg.num_stages, **pdl, **early)
        # contiguous: the first M * N bf16 of the partials' bytes (a compiled caller assumes the fake's strides)
        return part.view(-1).view(torch.bfloat16)[:M * N].view(*x.shape[:-1], N)

    K.gemv_triton = patched
    print(f"PROBE_QKV {spec}: {cfg} (split {K.split_k(cfg, 4096)})", flush=True)

if os.environ.get("PROBE_DOWN"):  # down reads x[..., :K] plainly (as if gate/up wrote silu(g) * u): half the x bytes
    orig_d = K.gemv_triton

    def patched_down(x, weight, bias=None, *, act=None, **kw):
        if act == "silu" and x.numel() // x.shape[-1] == 2:
            return orig_d(x[..., :weight.shape[1]], weight, bias, act=None, **kw)
        return orig_d(x, weight, bias, act=act, **kw)

    K.gemv_triton = patched_down
    print("PROBE_DOWN: down without its SiLU prologue", flush=True)

if os.environ.get("PROBE_NONORM"):  # W_O's reduce without the norm (the plain 8-program reduce); gate/up reads y
    orig_n = K.gemv_triton

    def patched_norm(x, weight, bias=None, *, out_norm_weight=None, out_norm_eps=None, **kw):
        if out_norm_weight is not None:
            y = orig_n(x, weight, bias, **kw)
            return y, torch.empty_like(y)
        return orig_n(x, weight, bias, **kw)

    K.gemv_triton = patched_norm
    print("PROBE_NONORM: W_O's plain reduce, no norm", flush=True)

if os.environ.get("PROBE_NOCOMB"):  # no merge launch (W_O reads the attention's output buffer unwritten)
    import orthros.ops.triton.decode as _dec

    _dec._Plan.combine = lambda self, o, o_out: None
    print("PROBE_NOCOMB: no merge launch", flush=True)

sys.argv = ["benchmarks/roofline.py"] + sys.argv[1:]
runpy.run_path("benchmarks/roofline.py", run_name="__main__")

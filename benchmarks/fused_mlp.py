"""Probe (issue #18, docs/performance.md inference change 32): a decode layer's SwiGLU MLP as one
kernel, gate/up and down without a grid-wide dependency between them.

In the pair's 1K step a layer's MLP runs as two GEMVs: gate/up (201 MB at Qwen3-8B's shape), then
down (101 MB) with the SwiGLU in its prologue and the residual in its epilogue; down cannot start
until every program of gate/up is done (a kernel boundary under PDL). The timeline of
``docs/results/s21-2026-12-04/call2`` prices them at 47.0 and 26.3 us a layer against 43.8 and
21.9 us of bytes at 4.6 TB/s (the GEMV sweep's streaming rate). The fused kernel
(``fused_mlp_kernel.py``) gives each program a slice of the intermediate units: its gate and up
rows, then the same units' rows of down's weight (transposed), its products added to a float32
accumulator with atomics; no program waits for another. The residual add moves into the kernel
behind (here the next layer's MLP, ``FOLD``; in the engine it would be the next QKV GEMV).
Measured on an H200 (2026-12-04, docs/issue-18-log.md): the atomics are cheap and, with
``--stack``, the gate/up half runs at the gate/up GEMV's rate, yet the fused MLP is 1.1-1.5 us a
layer slower than the two GEMVs at best (a switch every program makes at once costs what the
kernel boundary costs); closed.

The chain: ``--layers`` layers (own weights, Qwen3-8B's shapes, so no layer finds its weights in
L2), ``M = 2`` rows (the Orthros pair), ``x_{l+1} = x_l + down(silu(n_l W_g^T) * (n_l W_u^T))``,
``n_l = rms_norm(x_l)``, with bf16 roundings as the engine's GEMVs round (the norm in gate/up's
prologue, as the engine's QKV GEMV has it). Systems, timed in the same process under CUDA
graphs:

- ``engine``: the engine's two GEMVs (``orthros.ops.gemv.kernel.gemv_triton``: gate/up with
  ``norm_weight``, down with ``act="silu"`` and ``residual``; their M = 2 configs, PDL, the L2 prefetch);
- ``fused``: one launch a layer of the fused kernel (PDL, ``--prefetch-lines`` of every gate
  and up row asked of L2 before its wait), after one memset of all layers' accumulators; the
  last layer's residual add by torch (once a chain);
- ``torch``: the same chain with ``F.linear`` (cuBLAS), the reference of both outputs.

``--plain``: every layer's MLP on the same input with no norm, residual or fold (each kernel still
waits for the one ahead): gate/up GEMV + down GEMV against the fused kernel with equal prologues
(none), the last layer's MLP output checked.

On a CPU (``--device cpu``) everything runs in the Triton interpreter at tiny shapes: a check of
the arithmetic, not a timing.

    python benchmarks/fused_mlp.py --out docs/results/<dir>/mlp.json [--block-i 32 --block-k 128 --block-n 256]
    python benchmarks/fused_mlp.py --device cpu --out /tmp/mlp.json   # interpreter smoke run

Prints per system the time a layer (us), its weight bytes a second, the ratio to the copy
bandwidth measured in the same run and to ``engine``, and the error against ``torch``; writes
the JSON (meta: date, GPU, commit, versions, copy bandwidth) atomically. Bad arguments exit 2
before any work.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import probe_harness  # noqa: E402  (beside this script)

SYSTEMS = ("engine", "fused", "torch")
# (hidden, intermediate): Qwen3-8B; the interpreter's smoke shapes
SHAPES = {"qwen3-8b": (4096, 12288), "tiny": (64, 128)}
EPS = 1e-6  # the RMSNorm's


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    probe_harness.add_common(p, SYSTEMS, cpu_layers=3)
    p.add_argument("--block-i", type=int, default=None,
                   help="intermediate units a program (a power of two >= 16; default 32): "
                        "the launch has intermediate / block-i programs")
    p.add_argument("--block-k", type=int, default=None, help="gate/up's K tile (default 128 on CUDA, 32 on the CPU)")
    p.add_argument("--block-n", type=int, default=None, help="down's column tile (default 256 on CUDA, 32 on the CPU)")
    p.add_argument("--stages", type=int, default=3, help="tiles in each loop's software pipeline (1-8)")
    p.add_argument("--warps", type=int, default=4, choices=(1, 2, 4, 8, 16))
    p.add_argument("--prefetch-lines", type=int, default=1,
                   help="128-byte lines of every gate and up row asked of L2 before the PDL wait (0: none)")
    p.add_argument("--no-rotate", dest="rotate", action="store_false",
                   help="every program walks down's column tiles from the first (default: from tile p mod tiles, "
                        "so the atomics spread over the accumulator)")
    p.add_argument("--stack", action="store_true",
                   help="a program's gate and up rows as one tile and one tensor-core product a K step (at "
                        "--block-i 32 the engine's gate/up GEMV program's 64 rows)")
    p.add_argument("--plain", action="store_true",
                   help="each layer's MLP on the same input, no norm, residual or fold (see the docstring)")
    p.add_argument("--sink", default="atomic", choices=("atomic", "store", "gate_up"),
                   help="a timing diagnostic of the fused kernel: 'store' writes each program's down products to its "
                        "own scratch rows instead of adding them with atomics, 'gate_up' skips down; both leave the "
                        "chain's output wrong (its error is then not a check)")
    a = p.parse_args(argv)
    probe_harness.check_common(p, a, SYSTEMS)
    cpu = a.device == "cpu"
    a.block_i = a.block_i if a.block_i is not None else 32
    a.block_k = a.block_k if a.block_k is not None else (32 if cpu else 128)
    a.block_n = a.block_n if a.block_n is not None else (32 if cpu else 256)
    for name in ("block_i", "block_k", "block_n"):
        v = getattr(a, name)
        if v < 16 or v & (v - 1):
            p.error(f"--{name.replace('_', '-')} must be a power of two >= 16 (a tensor-core tile side), got {v}")
    if not 1 <= a.stages <= 8:
        p.error(f"--stages must be in 1..8, got {a.stages}")
    if a.prefetch_lines < 0 or a.prefetch_lines & (a.prefetch_lines - 1):
        p.error(f"--prefetch-lines must be 0 or a power of two, got {a.prefetch_lines}")
    a.shape = "tiny" if cpu else "qwen3-8b"
    H, INTER = SHAPES[a.shape]
    for name, v, n, what in (("block_i", a.block_i, INTER, "the intermediate size"),
                             ("block_k", a.block_k, H, "the hidden size"),
                             ("block_n", a.block_n, H, "the hidden size")):
        if n % v:
            p.error(f"--{name.replace('_', '-')} must divide {what} {n}, got {v}")
    if a.prefetch_lines * 64 > H:
        p.error(f"--prefetch-lines x 64 must not exceed the hidden size {H}, got {a.prefetch_lines}")
    return a


class Chain:
    """The chain's weights and buffers, and one callable a system (each returns the last output)."""

    def __init__(self, a, device, dtype):
        import torch

        self.a, self.device, self.dtype = a, device, dtype
        H, INTER = self.shape = SHAPES[a.shape]
        L = a.layers
        g = torch.Generator(device=device).manual_seed(0)

        def weight(n, k):  # unit gain: the MLP's output stays ~N(0, 1), the residual grows ~sqrt(layers)
            return (torch.randn(L, n, k, generator=g, device=device, dtype=torch.float32) / math.sqrt(k)).to(dtype)

        self.nw = (1 + 0.1 * torch.randn(L, H, generator=g, device=device, dtype=torch.float32)).to(dtype)
        self.wgu = weight(2 * INTER, H)  # [gate; up], the engine's fused layout
        self.wd = weight(H, INTER)
        self.wdt = self.wd.transpose(1, 2).contiguous()  # [INTER, H]: the fused kernel's layout
        self.x0 = torch.randn(2, H, generator=g, device=device, dtype=torch.float32).to(dtype)
        self.xs = torch.zeros(L, 2, H, device=device, dtype=dtype)  # each layer's input (its residual)
        self.xs[0].copy_(self.x0)
        self.acc = torch.zeros(L, 2, H, device=device, dtype=torch.float32)
        rows = INTER // a.block_i * 2 if a.sink == "store" else 2
        self.scr = torch.zeros(rows, max(H, INTER), device=device, dtype=torch.float32 if a.sink == "store" else dtype)
        self.bytes_per_layer = (self.wgu[0].numel() + self.wd[0].numel()) * self.x0.element_size()
        from orthros.ops.triton.common import interpreting, pdl_kwargs

        self.pf = 0 if interpreting() else a.prefetch_lines  # the interpreter runs no PTX hint
        self.pdl = pdl_kwargs(device)
        from fused_mlp_kernel import _mlp_kernel

        self.kernel = _mlp_kernel

    def torch_chain(self):
        import torch.nn.functional as F

        from orthros.ops.gemv.naive import prologue_ref

        INTER = self.shape[1]
        x = self.x0
        if self.a.plain:
            for i in range(self.a.layers):
                gu = F.linear(x, self.wgu[i])
                y = F.linear(F.silu(gu[:, :INTER]) * gu[:, INTER:], self.wd[i])
            return y
        for i in range(self.a.layers):
            gu = F.linear(prologue_ref(x, self.nw[i], EPS), self.wgu[i])
            x = x + F.linear(F.silu(gu[:, :INTER]) * gu[:, INTER:], self.wd[i])
        return x

    def engine_chain(self):
        from orthros.ops.gemv.kernel import gemv_triton

        x = self.x0
        if self.a.plain:
            for i in range(self.a.layers):
                y = gemv_triton(gemv_triton(x, self.wgu[i]), self.wd[i], act="silu")
            return y
        for i in range(self.a.layers):
            gu = gemv_triton(x, self.wgu[i], norm_weight=self.nw[i], norm_eps=EPS)
            x = gemv_triton(gu, self.wd[i], act="silu", residual=x)
        return x

    def fused_chain(self):
        a = self.a
        H, INTER = self.shape
        self.acc.zero_()
        kw = dict(self.pdl)
        if self.device.type == "cpu":  # the interpreter's float32 -> bf16 cast truncates (gemv.kernel._round)
            kw.update(EMU_RNE=True, UPCAST=True, PREC="ieee")
        else:
            kw.update(UPCAST=False, PREC="tf32")
        for i in range(a.layers):
            prev = max(i - 1, 0)
            self.kernel[(INTER // a.block_i,)](
                self.x0, self.acc[prev], self.xs[prev], self.xs[i], self.nw[i], self.wgu[i], self.wdt[i], self.acc[i],
                self.scr, 2, EPS, H=H, INTER=INTER, BI=a.block_i, BK=a.block_k, BN=a.block_n, STAGES=a.stages,
                FOLD=i > 0 and not a.plain, NORM=not a.plain, PF=self.pf, ROTATE=a.rotate, STACK=a.stack,
                SINK=a.sink, num_warps=a.warps, num_stages=a.stages, **kw)
        L = a.layers - 1
        if a.plain:
            return self.acc[L].to(self.dtype)
        return self.acc[L].to(self.dtype) + self.xs[L]

    def call(self, system):
        return {"torch": self.torch_chain, "engine": self.engine_chain, "fused": self.fused_chain}[system]

    def reset(self):
        """No output left by another system."""
        self.xs[1:].zero_()

    def failure(self):
        return None


def settings(a, chain) -> dict:
    return {"block_i": a.block_i, "block_k": a.block_k, "block_n": a.block_n, "programs": chain.shape[1] // a.block_i,
            "stages": a.stages, "warps": a.warps, "prefetch_lines": chain.pf, "rotate": a.rotate, "sink": a.sink,
            "plain": a.plain, "stack": a.stack, "pdl": bool(chain.pdl)}


def main(argv=None) -> int:
    return probe_harness.main(argv, parse_args, Chain, settings, lambda a, meta: (
        f"the MLP chain of {a.layers} layers, M = 2, the fused kernel at {meta['programs']} programs"), name_width=7)


if __name__ == "__main__":
    sys.exit(main())

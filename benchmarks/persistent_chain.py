"""Probe (issue #18, docs/performance.md inference change 30): what a decode layer's four GEMVs
lose at their kernel boundaries, and how much of it one persistent kernel would get back.

The 2026-12-01 GEMV sweep (``docs/results/gemv-2026-12-01``) fits every one-row GEMV of
Qwen3-8B, from W_O (33.5 MB) to the LM head (1.2 GB), as ~3.6 us plus the weight's bytes at
~4.6 TB/s: each kernel pays a fixed cost (its wait for the kernel ahead, the first bytes'
latency, the tail of its last programs) that PDL and the L2 prefetch only partly hide. A pair
layer at 1K runs seven kernels; this probe prices the boundaries of the four GEMVs alone.
Measured on an H200 (2026-12-04, docs/issue-18-log.md): one persistent launch 1.6-2.3 us a layer
slower than one launch a GEMV, where the probe's kernel streams near the engine's rate.

The chain: for each of ``--layers`` layers (own weights, Qwen3-8B's shapes, so no layer finds its
weights in L2), ``M = 2`` rows (the Orthros pair) through QKV [6144 x 4096] -> W_O [4096 x 4096]
(on the first 4096 QKV outputs) -> gate/up [24576 x 4096] -> down [4096 x 12288] (on the first
12288 gate/up outputs) -> the next layer's input. Plain GEMVs (no norm, SiLU or residual: the
same bytes, none of the prologues), bf16 outputs rounded after each, float32 accumulation.
Systems, timed in the same process under CUDA graphs:

- ``engine``: the engine's Triton GEMV (``orthros.ops.gemv.kernel.gemv_triton``, its M = 2
  configs, PDL and its L2 prefetch as in the decode step; W_O with split-K 4 and its reduce);
- ``launch``: this file's kernel, one launch per GEMV (``P`` programs, each a contiguous block of
  output rows), PDL with the same L2 prefetch before its wait;
- ``persistent``: the same kernel launched once for all ``4 * layers`` GEMVs: between two GEMVs
  every program passes a grid barrier (an atomic counter) instead of a kernel boundary, after
  asking L2 for the first lines of its next weight rows (``--prefetch-mb``, 0: none);
- ``torch``: ``F.linear`` (cuBLAS) for the same chain, the reference of every system's output.

The persistent form needs its ``P`` programs resident at once (one a streaming multiprocessor);
its spin wait gives up after ``2**20`` polls and the run then fails with a clear error instead of
hanging. On a CPU (``--device cpu``) everything runs in the Triton interpreter with one program
(the barrier is then trivially passed), small shapes: a check of the arithmetic, not a timing.

    python benchmarks/persistent_chain.py --out docs/results/<dir>/chain.json
    python benchmarks/persistent_chain.py --device cpu --out /tmp/chain.json   # interpreter smoke run

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

SYSTEMS = ("engine", "launch", "persistent", "torch")
# (hidden, QKV rows, intermediate): Qwen3-8B; the interpreter's smoke shapes
SHAPES = {"qwen3-8b": (4096, 6144, 12288), "tiny": (64, 96, 192)}
POLLS = 2 ** 20  # the spin wait's limit (a grid barrier takes ~1e2-1e3 polls; ~1 s a barrier when programs are missing)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    probe_harness.add_common(p, SYSTEMS, cpu_layers=2)
    p.add_argument("--programs", type=int, default=None,
                   help="P, the kernel's programs (default 128 on CUDA, 1 on the CPU); every GEMV's rows must split "
                        "into P blocks of whole --block-n tiles")
    p.add_argument("--block-n", type=int, default=16, help="rows a tile (a power of two)")
    p.add_argument("--block-k", type=int, default=None, help="columns a tile (a power of two; default 512 on CUDA, "
                   "32 on the CPU)")
    p.add_argument("--stages", type=int, default=4, help="tiles in the software pipeline (1-8)")
    p.add_argument("--warps", type=int, default=8, choices=(1, 2, 4, 8, 16))
    p.add_argument("--defer", action="store_true",
                   help="the kernel's deferred form: products summed once a tile, not across threads every step")
    p.add_argument("--hold", type=int, default=0, choices=(0, 1, 2, 4, 8),
                   help="with --defer: weight tiles each program loads into registers before its wait / barrier "
                        "and multiplies after it (0: none)")
    p.add_argument("--prefetch-mb", type=float, default=4.0,
                   help="MB of each GEMV's weight asked of L2 before its wait / barrier (0: none); the engine's "
                        "GEMVs keep their own setting (ORTHROS_GEMV_PREFETCH_MB)")
    a = p.parse_args(argv)
    probe_harness.check_common(p, a, SYSTEMS)
    cpu = a.device == "cpu"
    a.programs = a.programs if a.programs is not None else (1 if cpu else 128)
    a.block_k = a.block_k if a.block_k is not None else (32 if cpu else 512)
    if a.programs < 1 or (cpu and a.programs != 1):
        p.error(f"--programs must be >= 1 (exactly 1 on the CPU, whose interpreter runs programs one after "
                f"another), got {a.programs}")
    for name in ("block_n", "block_k"):
        v = getattr(a, name)
        if v < 1 or v & (v - 1):
            p.error(f"--{name.replace('_', '-')} must be a power of two, got {v}")
    if not 1 <= a.stages <= 8:
        p.error(f"--stages must be in 1..8, got {a.stages}")
    if not a.prefetch_mb >= 0:
        p.error(f"--prefetch-mb must be >= 0, got {a.prefetch_mb}")
    if a.hold and not a.defer:
        p.error("--hold needs --defer (the held tiles start the deferred form's accumulators)")
    a.shape = "tiny" if cpu else "qwen3-8b"
    H, NQKV, INTER = SHAPES[a.shape]
    for what, n, k in chain_sites(H, NQKV, INTER):
        if n % (a.programs * a.block_n):
            p.error(f"--programs x --block-n must divide every GEMV's rows: {what} has {n}, "
                    f"{a.programs} x {a.block_n} = {a.programs * a.block_n}")
        if k % a.block_k:
            p.error(f"--block-k must divide every GEMV's columns: {what} has {k}, got {a.block_k}")
        if a.hold >= k // a.block_k:
            p.error(f"--hold must be below every GEMV's K steps (K / --block-k): {what} has {k // a.block_k}, "
                    f"got {a.hold}")
    return a


def chain_sites(H: int, NQKV: int, INTER: int):
    """``(name, N, K)`` of a layer's four GEMVs, in chain order."""
    return (("qkv", NQKV, H), ("o", H, H), ("gate_up", 2 * INTER, H), ("down", H, INTER))


def prefetch_lines(N: int, K: int, budget: int) -> int:
    """Lines (128 B) a bf16 weight row to ask L2 for before a wait: a power of two with
    ``N * lines * 128 <= budget``, at most the row, at least 0 (the engine GEMV's rule,
    :func:`orthros.ops.gemv.kernel.prefetch_tile`, for one K slice)."""
    from orthros.ops.gemv.kernel import prefetch_tile

    return prefetch_tile(N, K, 1, 2, budget).get("PF_LINES", 0)


class ChainWeights:
    """The chain's weights and input (``a.layers`` layers of ``SHAPES[a.shape]``), its bytes a
    layer, and the two systems every chain probe times against: ``torch`` (cuBLAS, the reference)
    and ``engine`` (the engine's GEMVs). Also the base of ``stream_chain.py``'s chain."""

    def __init__(self, a, device, dtype):
        import torch

        self.a, self.device, self.dtype = a, device, dtype
        H, NQKV, INTER = self.shape = SHAPES[a.shape]
        L = a.layers
        g = torch.Generator(device=device).manual_seed(0)

        def weight(n, k):  # unit gain: the activations stay ~N(0, 1) down the chain
            return (torch.randn(L, n, k, generator=g, device=device, dtype=torch.float32) / math.sqrt(k)).to(dtype)

        self.w = [weight(n, k) for _, n, k in chain_sites(H, NQKV, INTER)]
        self.x0 = torch.randn(2, H, generator=g, device=device, dtype=torch.float32).to(dtype)
        self.bytes_per_layer = sum(w[0].numel() for w in self.w) * self.x0.element_size()

    def torch_chain(self):
        import torch.nn.functional as F

        wq, wo, wgu, wd = self.w
        INTER = self.shape[2]
        x = self.x0
        for i in range(self.a.layers):
            y1 = F.linear(x, wq[i])
            y2 = F.linear(y1[:, :self.shape[0]], wo[i])
            y3 = F.linear(y2, wgu[i])
            x = F.linear(y3[:, :INTER], wd[i])
        return x

    def engine_chain(self):
        from orthros.ops.gemv.kernel import gemv_triton

        wq, wo, wgu, wd = self.w
        H, INTER = self.shape[0], self.shape[2]
        x = self.x0
        for i in range(self.a.layers):
            y1 = gemv_triton(x, wq[i])
            y2 = gemv_triton(y1[:, :H], wo[i])
            y3 = gemv_triton(y2, wgu[i])
            x = gemv_triton(y3[:, :INTER], wd[i])
        return x


class Chain(ChainWeights):
    """The Triton kernel's activation buffers, and one callable a system."""

    def __init__(self, a, device, dtype):
        import torch

        super().__init__(a, device, dtype)
        H, NQKV, INTER = self.shape
        L = a.layers
        self.act = torch.zeros(L + 1, 2, H, device=device, dtype=dtype)
        self.y1 = torch.zeros(L, 2, NQKV, device=device, dtype=dtype)
        self.y2 = torch.zeros(L, 2, H, device=device, dtype=dtype)
        self.y3 = torch.zeros(L, 2, 2 * INTER, device=device, dtype=dtype)
        self.bar = torch.zeros(1, device=device, dtype=torch.int32)
        self.err = torch.zeros(1, device=device, dtype=torch.int32)
        self.act[0].copy_(self.x0)
        from orthros.ops.triton.common import interpreting

        budget = 0 if interpreting() else int(a.prefetch_mb * 2 ** 20)  # the interpreter runs no PTX hint
        self.pf = {f"PF_{k}": prefetch_lines(n, kk, budget)
                   for k, (_, n, kk) in zip(("QKV", "O", "GU", "D"), chain_sites(H, NQKV, INTER))}
        from persistent_chain_kernel import _chain_kernel

        self.kernel = _chain_kernel

    def _launch(self, s_lo, s_hi, pdl):
        a = self.a
        H, NQKV, INTER = self.shape
        kw = {"PDL": True, "launch_pdl": True} if pdl else {}
        if self.device.type == "cpu":  # the interpreter's float32 -> bf16 cast truncates (gemv.kernel._round)
            kw["EMU_RNE"] = True
        self.kernel[(a.programs,)](
            self.act, *self.w, self.y1, self.y2, self.y3, self.bar, self.err, s_lo, s_hi,
            H=H, NQKV=NQKV, INTER=INTER, P=a.programs, BN=a.block_n, BK=a.block_k, STAGES=a.stages,
            POLLS_=POLLS, DEFER=a.defer, HOLD=a.hold, num_warps=a.warps, num_stages=a.stages, **self.pf, **kw)

    def launch_chain(self):
        from orthros.ops.triton.common import pdl_kwargs

        pdl = bool(pdl_kwargs(self.device))
        for s in range(4 * self.a.layers):
            self._launch(s, s + 1, pdl)
        return self.act[-1]

    def persistent_chain(self):
        self.bar.zero_()
        self._launch(0, 4 * self.a.layers, False)
        return self.act[-1]

    def call(self, system):
        return {"torch": self.torch_chain, "engine": self.engine_chain, "launch": self.launch_chain,
                "persistent": self.persistent_chain}[system]

    def reset(self):
        """No output left by another system (the buffers zeroed)."""
        for t in (self.act[1:], self.y1, self.y2, self.y3, self.err):
            t.zero_()

    def failure(self):
        if int(self.err.item()):
            return (f"a grid barrier gave up after {POLLS} polls (the {self.a.programs} programs were not all "
                    "resident); lower --programs")
        return None


def settings(a, chain) -> dict:
    return {"programs": a.programs, "block_n": a.block_n, "block_k": a.block_k, "stages": a.stages, "warps": a.warps,
            "defer": a.defer, "hold": a.hold, "prefetch_mb": a.prefetch_mb, "prefetch_lines": chain.pf}


def main(argv=None) -> int:
    return probe_harness.main(argv, parse_args, Chain, settings, lambda a, meta: (
        f"the chain of {a.layers} layers, M = 2, {a.programs} programs of the probe's kernel"))


if __name__ == "__main__":
    sys.exit(main())

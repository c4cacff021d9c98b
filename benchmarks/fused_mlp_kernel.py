"""The Triton kernel of ``benchmarks/fused_mlp.py`` (the probe of docs/performance.md's inference
change 32): a decode layer's SwiGLU MLP, gate/up and down, as one kernel without a grid-wide
dependency between them. Imported after the script has chosen the interpreter or not."""

from __future__ import annotations

import triton
import triton.language as tl

from orthros.ops.gemv.kernel import _round
from orthros.ops.triton.common import pdl_signal, pdl_wait, prefetch_l2


@triton.jit
def _mlp_kernel(X, ACC_IN, RES, XOUT, NW, WGU, WDT, ACC, SCR, M, eps,
                H: tl.constexpr, INTER: tl.constexpr, BI: tl.constexpr, BK: tl.constexpr, BN: tl.constexpr,
                STAGES: tl.constexpr, FOLD: tl.constexpr, PF: tl.constexpr, UPCAST: tl.constexpr,
                PREC: tl.constexpr, NORM: tl.constexpr = True, ROTATE: tl.constexpr = True,
                STACK: tl.constexpr = False, SINK: tl.constexpr = "atomic",
                EMU_RNE: tl.constexpr = False, PDL: tl.constexpr = False):
    """Program ``p`` owns the intermediate units ``[p * BI, (p + 1) * BI)`` of ``M <= 16`` rows:

    1. gate/up: its ``BI`` gate rows and ``BI`` up rows of ``WGU [2 * INTER, H]`` times the
       RMSNorm of the input (norm weight ``NW [H]``; tensor cores, the input padded to 16 rows;
       the engine's late form: the loop multiplies ``x * NW`` and sums ``x^2``, each row's
       ``rstd`` scales the products after it), each rounded to the dtype as the gate/up GEMV
       rounds its output, then ``h = silu(gate) * up`` rounded as the down GEMV's prologue does;
    2. down: ``h`` times its ``BI`` rows of ``WDT [INTER, H]`` (down's weight transposed, so the
       slice is contiguous) in ``BN``-column tiles, each float32 product added to ``ACC [M, H]``
       with atomics (relaxed: only the kernel's end orders them). ``ROTATE``: program ``p``
       starts at column tile ``p mod (H / BN)``, so the programs' atomics spread over the
       accumulator instead of all hitting the same tile at once.

    So no program waits for another: the input's dependency is paid once, at the kernel's start,
    and down's weight streams as soon as a program's own gate/up rows are done. ``ACC`` must be
    zero before the launch; the layer's output ``round(round(ACC) + residual)`` is formed by the
    kernel behind. ``FOLD``: this kernel is that consumer for the MLP ahead: its input is
    ``round(round(ACC_IN) + RES)`` (the MLP ahead's output, computed on the fly in every program's
    K loop), which program 0 also stores to ``XOUT`` (the next residual); else the input is ``X``
    (``[M, H]``, contiguous). ``NORM=False``: no RMSNorm (``NW``, ``eps`` unread; the input taken
    as it is, already normalised). ``PF``: lines (64 elements each) of every gate and up row asked of L2
    before the PDL wait (read-only weights).

    ``STACK``: the ``BI`` gate rows and ``BI`` up rows are one ``[2 * BI, BK]`` tile a K step and
    one tensor-core product (at ``BI = 32`` the shape of the engine's gate/up GEMV program, 64
    rows by ``BK``), split into gate and up after the loop; else two tiles and two products.

    ``SINK`` (timing diagnostics; only ``"atomic"`` computes the MLP): ``"store"`` writes each
    program's down products to its own rows of ``SCR [programs, M, H]`` instead of the atomics;
    ``"gate_up"`` skips down (its ``h`` stored to ``SCR``'s first rows, so nothing is optimised
    away)."""
    pid = tl.program_id(0)
    offs_i = pid * BI + tl.arange(0, BI)
    offs_m = tl.arange(0, 16)
    m_ok = offs_m < M
    dt = WGU.dtype.element_ty
    g_rows = WGU + offs_i[:, None] * H
    u_rows = WGU + (INTER + offs_i)[:, None] * H
    r2 = tl.arange(0, 2 * BI)
    gu_rows = WGU + tl.where(r2 < BI, pid * BI + r2, INTER + pid * BI + r2 - BI)[:, None] * H  # STACK
    if PF > 0:
        prefetch_l2(g_rows + (tl.arange(0, PF) * 64)[None, :])
        prefetch_l2(u_rows + (tl.arange(0, PF) * 64)[None, :])
    pdl_wait(PDL)
    pdl_signal(PDL)
    acc_g = tl.zeros([BI, 16], tl.float32)
    acc_u = tl.zeros([BI, 16], tl.float32)
    acc_gu = tl.zeros([2 * BI, 16], tl.float32)
    ssq_t = tl.zeros([BK, 16], tl.float32)
    for k0 in tl.range(0, H, BK, num_stages=STAGES):
        offs_k = k0 + tl.arange(0, BK)
        xp = offs_m[None, :] * H + offs_k[:, None]  # [BK, 16]: the input transposed
        if FOLD:
            a = tl.load(ACC_IN + xp, mask=m_ok[None, :], other=0.0)
            r = tl.load(RES + xp, mask=m_ok[None, :], other=0.0)
            xt = _round(_round(a, dt, EMU_RNE).to(tl.float32) + r.to(tl.float32), dt, EMU_RNE)
            if pid == 0:
                tl.store(XOUT + xp, xt, mask=m_ok[None, :])
        else:
            xt = tl.load(X + xp, mask=m_ok[None, :], other=0.0)
        if NORM:
            xf = xt.to(tl.float32)
            ssq_t += xf * xf
            xt = _round(xf * tl.load(NW + offs_k).to(tl.float32)[:, None], dt, EMU_RNE)
        if UPCAST:  # the interpreter's bf16 tl.dot is wrong (docs: guide); float32 there
            xt = xt.to(tl.float32)
        if STACK:
            w = tl.load(gu_rows + offs_k[None, :])
            if UPCAST:
                w = w.to(tl.float32)
            acc_gu += tl.dot(w, xt, input_precision=PREC)
        else:
            wg = tl.load(g_rows + offs_k[None, :])
            wu = tl.load(u_rows + offs_k[None, :])
            if UPCAST:
                wg = wg.to(tl.float32)
                wu = wu.to(tl.float32)
            acc_g += tl.dot(wg, xt, input_precision=PREC)
            acc_u += tl.dot(wu, xt, input_precision=PREC)
    if STACK:  # rows [0, BI) gate, [BI, 2 BI) up
        acc_g, acc_u = tl.split(tl.permute(tl.reshape(acc_gu, (2, BI, 16)), (1, 2, 0)))
    if NORM:
        rstd = tl.rsqrt(tl.sum(ssq_t, axis=0) / H + eps)[None, :]  # [1, 16]: each row's
        acc_g = acc_g * rstd
        acc_u = acc_u * rstd
    g = _round(acc_g, dt, EMU_RNE).to(tl.float32)
    u = _round(acc_u, dt, EMU_RNE).to(tl.float32)
    act = _round(g / (1.0 + tl.exp(-g)), dt, EMU_RNE).to(tl.float32)
    ht = tl.trans(_round(act * u, dt, EMU_RNE))  # [16, BI]
    if UPCAST:
        ht = ht.to(tl.float32)
    if SINK == "gate_up":
        tl.store(SCR + offs_m[:, None] * INTER + offs_i[None, :], ht, mask=m_ok[:, None])
        return
    d_rows = WDT + offs_i[:, None] * H
    T: tl.constexpr = H // BN
    for j in tl.range(0, T, num_stages=STAGES):
        if ROTATE:
            j = (j + pid) % T
        offs_n = j * BN + tl.arange(0, BN)
        wd = tl.load(d_rows + offs_n[None, :])  # [BI, BN]
        if UPCAST:
            wd = wd.to(tl.float32)
        part = tl.dot(ht, wd, input_precision=PREC)  # [16, BN]
        if SINK == "store":
            tl.store(SCR + (pid * M + offs_m[:, None]) * H + offs_n[None, :], part, mask=m_ok[:, None])
        else:
            tl.atomic_add(ACC + offs_m[:, None] * H + offs_n[None, :], part, mask=m_ok[:, None], sem="relaxed")

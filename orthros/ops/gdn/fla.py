"""GPU path of the two-stream gated delta rule, built from fla-core's (flash-linear-attention)
Triton pieces of ``fla.ops.gated_delta_rule.chunk``.

FLA's public ``chunk_gated_delta_rule`` returns only the base output and the final state; the
per-chunk states ``h`` and the WY-corrected values ``v_new`` it builds stay inside. The
output stream needs exactly those, so this module runs the same pipeline as FLA's forward

    g = chunk_local_cumsum(g);  w, u, A = fwd_intra(k, v, g, beta);  h, v_new = fwd_h(k, w, u, g)
    o     = chunk_fwd_o(q,     k, v_new, h, g)          # base stream
    o_out = chunk_fwd_o(q_out, k, v_new, h, g)          # output stream: the SAME h and v_new

so the states are computed once and read out for both query sets; the readout costs one more
``chunk_fwd_o`` (an attention-like pass over each chunk, no recurrence). The backward is
linear in the incoming gradients for fixed forward values, so it is FLA's backward with the
per-stream parts (``dv_local``, the state-gradient recurrence ``bwd_dhu`` and ``bwd_dqkwg``)
run once per stream and summed before the shared WY backward; ``w, u, h`` are recomputed
once (as FLA does). Cost: forward = FLA's + one ``chunk_fwd_o``; backward = FLA's + one more
``dv_local``/``bwd_dhu``/``bwd_dqkwg``.

Queries and keys arrive l2-normalised (done in PyTorch by :func:`orthros.ops.gdn.gated_delta_rule`
so both backends share it); ``g`` is the log decay, ``beta`` post-sigmoid.
"""

from __future__ import annotations

import importlib.util

import torch

from ...utils import install_hint

# fla-core is the optional `orthros[hybrid]` extra. Imported on first use: importing fla on a
# machine without a GPU prints a warning and costs a second.
HAVE_FLA = importlib.util.find_spec("fla") is not None


def _import_fla():
    global chunk_gated_delta_rule_bwd_dhu, chunk_gated_delta_rule_fwd_h, chunk_bwd_dqkwg, chunk_bwd_dv_local
    global chunk_fwd_o, chunk_gated_delta_rule_fwd_intra, prepare_wy_repr_bwd, recompute_w_u_fwd
    global chunk_local_cumsum, RCP_LN2, prepare_chunk_indices
    from fla.ops.common.chunk_delta_h import chunk_gated_delta_rule_bwd_dhu, chunk_gated_delta_rule_fwd_h
    from fla.ops.common.chunk_o import chunk_bwd_dqkwg, chunk_bwd_dv_local, chunk_fwd_o
    from fla.ops.gated_delta_rule.chunk_fwd import chunk_gated_delta_rule_fwd_intra
    from fla.ops.gated_delta_rule.wy_fast import prepare_wy_repr_bwd, recompute_w_u_fwd
    from fla.ops.utils import chunk_local_cumsum
    from fla.ops.utils.constant import RCP_LN2
    from fla.ops.utils.index import prepare_chunk_indices


CHUNK = 64


def fla_backward_supported() -> bool:
    """Whether fla-core runs the gated backward here. fla-core 0.6.0 refuses it on Hopper GPUs
    with Triton >= 3.4, < 3.7.1 (its ``chunk_bwd_dqkwg`` raises: wrong results, fla issue #640)
    unless tilelang is installed; the forward is unaffected."""
    if not HAVE_FLA:
        return False
    from fla.utils import IS_NVIDIA_HOPPER, TRITON_ABOVE_3_4_0, TRITON_ABOVE_3_7_1

    bad = IS_NVIDIA_HOPPER and TRITON_ABOVE_3_4_0 and not TRITON_ABOVE_3_7_1
    return not bad or importlib.util.find_spec("tilelang") is not None


def _fwd(q, k, v, g, beta, scale, h0, output_final_state, cu_seqlens, chunk_indices, q_out):
    g = chunk_local_cumsum(g, chunk_size=CHUNK, scale=RCP_LN2, cu_seqlens=cu_seqlens, chunk_indices=chunk_indices)
    w, u, A = chunk_gated_delta_rule_fwd_intra(k=k, v=v, g=g, beta=beta, cu_seqlens=cu_seqlens,
                                               chunk_indices=chunk_indices, chunk_size=CHUNK)
    h, v_new, final = chunk_gated_delta_rule_fwd_h(k=k, w=w, u=u, g=g, initial_state=h0,
                                                   output_final_state=output_final_state, cu_seqlens=cu_seqlens,
                                                   chunk_indices=chunk_indices, chunk_size=CHUNK)
    kw = dict(k=k, v=v_new, h=h, g=g, scale=scale, cu_seqlens=cu_seqlens, chunk_indices=chunk_indices,
              chunk_size=CHUNK)
    o = chunk_fwd_o(q=q, **kw)
    o_out = chunk_fwd_o(q=q_out, **kw) if q_out is not None else None
    return g, A, o, o_out, final


class TwoStreamChunkGDN(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g, beta, q_out, h0, scale, output_final_state, cu_seqlens):
        chunk_indices = prepare_chunk_indices(cu_seqlens, CHUNK) if cu_seqlens is not None else None
        gc, A, o, o_out, final = _fwd(q, k, v, g, beta, scale, h0, output_final_state, cu_seqlens,
                                      chunk_indices, q_out)
        ctx.save_for_backward(q, k, v, gc, beta, A, q_out, h0, cu_seqlens, chunk_indices)
        ctx.scale = scale
        ctx.has_out = q_out is not None
        return o.to(q.dtype), (o_out.to(q.dtype) if o_out is not None else None), final

    @staticmethod
    def backward(ctx, do, do_out, dht):
        q, k, v, g, beta, A, q_out, h0, cu_seqlens, chunk_indices = ctx.saved_tensors
        scale = ctx.scale
        common = dict(cu_seqlens=cu_seqlens, chunk_indices=chunk_indices)
        w, u = recompute_w_u_fwd(k=k, v=v, beta=beta, A=A, g=g, **common)
        h, v_new, _ = chunk_gated_delta_rule_fwd_h(k=k, w=w, u=u, g=g, initial_state=h0, output_final_state=False,
                                                   chunk_size=CHUNK, **common)
        dht = dht.contiguous() if dht is not None else None
        streams = [(q, do, dht)]
        if ctx.has_out:
            streams.append((q_out, do_out if do_out is not None else torch.zeros_like(v), None))
        if do is None:
            streams[0] = (q, torch.zeros_like(v), dht)
        dqs, dk, dw, dg, dv_tot, dh0 = [], None, None, None, None, None
        for qq, dd, dt in streams:
            dd = dd.contiguous()
            dv = chunk_bwd_dv_local(q=qq, k=k, g=g, do=dd, scale=scale, chunk_size=CHUNK, **common)
            dh, dh0_s, dv = chunk_gated_delta_rule_bwd_dhu(q=qq, k=k, w=w, g=g, h0=h0, dht=dt, do=dd, dv=dv,
                                                            scale=scale, chunk_size=CHUNK, **common)
            dq_s, dk_s, dw_s, dg_s = chunk_bwd_dqkwg(q=qq, k=k, v=v_new, w=w, g=g, h=h, dv=dv, do=dd, dh=dh,
                                                     scale=scale, chunk_size=CHUNK, **common)
            dqs.append(dq_s)
            dk = dk_s if dk is None else dk + dk_s
            dw = dw_s if dw is None else dw + dw_s
            dg = dg_s if dg is None else dg + dg_s
            dv_tot = dv if dv_tot is None else dv_tot + dv
            if dh0_s is not None:
                dh0 = dh0_s if dh0 is None else dh0 + dh0_s
        dk2, dv_final, db, dg2 = prepare_wy_repr_bwd(k=k, v=v, beta=beta, g=g, A=A, dw=dw, du=dv_tot, **common)
        dk = dk + dk2
        dg = chunk_local_cumsum(dg + dg2, chunk_size=CHUNK, reverse=True, **common)
        dq_out = dqs[1].to(q_out) if ctx.has_out else None
        return (dqs[0].to(q), dk.to(k), dv_final.to(v), dg.to(g.dtype), db.to(beta), dq_out,
                dh0 if h0 is not None else None, None, None, None)


def chunk_gated_delta_rule_fla(q, k, v, g, beta, *, q_out, scale, initial_state, output_final_state, cu_seqlens):
    """Same contract as the internal two-stream call of :func:`orthros.ops.gdn.gated_delta_rule`:
    l2-normalised ``q, k [B, T, H, K]`` (``q_out`` likewise, dense over positions, or None),
    ``v [B, T, HV, V]``, float32 ``g`` and ``beta [B, T, HV]``. Returns ``(o, o_out, final)``."""
    if not HAVE_FLA:
        raise RuntimeError(f"the 'fla' GDN backend needs fla-core: {install_hint('hybrid')}")
    if "chunk_fwd_o" not in globals():
        _import_fla()
    dt = v.dtype
    q, k = q.to(dt).contiguous(), k.to(dt).contiguous()
    q_out = q_out.to(dt).contiguous() if q_out is not None else None
    h0 = initial_state.float().contiguous() if initial_state is not None else None
    return TwoStreamChunkGDN.apply(q, k, v.contiguous(), g.float().contiguous(), beta.to(dt).contiguous(), q_out,
                                   h0, float(scale), bool(output_final_state), cu_seqlens)


def causal_conv1d_fla(x, weight, state, activation: bool, cu_seqlens):
    """The short convolution through fla-core's Triton ``causal_conv1d`` (one pass over ``x [B, T,
    C]`` in its own layout, strided views included): ``y [B, T, C]`` only, the caller keeps the
    window. ``state [B, C, W - 1]`` (the inputs just before ``x``, or None) goes in as FLA's
    ``[B, C, W]`` window, whose first column no tap reads. With ``cu_seqlens`` no state is read
    (every document starts from zeros), as in the pure-PyTorch path."""
    if not HAVE_FLA:
        raise RuntimeError(f"the 'fla' short convolution needs fla-core: {install_hint('hybrid')}")
    from fla.modules.causal_conv1d import causal_conv1d

    h0 = None
    if state is not None and cu_seqlens is None:
        h0 = torch.nn.functional.pad(state.to(x.dtype), (1, 0)).contiguous()
    y, _ = causal_conv1d(x, weight.contiguous(), initial_state=h0, output_final_state=False,
                         activation="silu" if activation else None, backend="triton", cu_seqlens=cu_seqlens)
    return y


__all__ = ["HAVE_FLA", "causal_conv1d_fla", "chunk_gated_delta_rule_fla", "fla_backward_supported"]

"""Pure-PyTorch gated delta rule (Gated DeltaNet) with an output-stream readout.

The recurrence (Yang et al., "Gated Delta Networks"; FLA's convention), per head, with the state
``S [K, V]``:

    S_t = exp(g_t) * S_{t-1} + k_t (beta_t * (v_t - exp(g_t) * S_{t-1}^T k_t))^T
    o_t = scale * S_t^T q_t                      (the output at t reads the state *after* token t)

Orthros-H's output stream is the "cross-attention part" of a GDN layer: output query ``q'_j`` at
base position ``p_j`` reads the state after that token, ``o'_j = scale * S_{p_j}^T q'_j``, and
never writes it. Since the readout is linear in the query for fixed states, the chunked
algorithm serves both streams from ONE pass over the states: inside a chunk, a query at
position ``t`` sees ``exp(G_t) S_chunk_start`` plus the chunk's own (WY-corrected) values up to
``t``, whichever stream it belongs to.

Layout (FLA's): ``q, k [B, T, H, K]``, ``v [B, T, HV, V]``, ``g`` (log decay, <= 0) and ``beta``
``[B, T, HV]``, states ``[N, HV, K, V]`` (float32). ``HV`` is a multiple of ``H`` (grouped value
heads: query/key head ``i`` serves value heads ``i*HV/H .. (i+1)*HV/H - 1``, as in Qwen3.5).
Everything is computed in float32 (float64 inputs in float64, for exact gradient checks) and
returned in the dtype of ``v``.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from ...utils import check_positive_int


def check_cu_seqlens_values(cu_seqlens, T: int, who: str = "") -> list:
    """The one check of ``cu_seqlens``'s values for the GDN ops (:func:`chunk_gated_delta_rule_ref`,
    :func:`orthros.ops.gdn.causal_conv1d`): integers rising from 0 to ``T``, empty documents
    allowed. Reads the values (``.tolist()``): callers pass it values already on the host, or
    that they read anyway. Returns them as a list of ints; ``who`` prefixes the error."""
    bounds = [int(x) for x in (cu_seqlens.tolist() if isinstance(cu_seqlens, torch.Tensor) else cu_seqlens)]
    fall = next((i for i in range(1, len(bounds)) if bounds[i] < bounds[i - 1]), None)
    if bounds[0] != 0 or bounds[-1] != T or fall is not None:
        what = (f"it starts at {bounds[0]}" if bounds[0] != 0 else f"it ends at {bounds[-1]}" if bounds[-1] != T
                else f"it falls from {bounds[fall - 1]} to {bounds[fall]} at index {fall}")
        shown = bounds if len(bounds) <= 12 else bounds[:5] + ["..."] + bounds[-5:]
        raise ValueError(f"{who + ': ' if who else ''}cu_seqlens must rise from 0 to the sequence length {T} "
                         f"(never falling; empty documents allowed): {what}, got [{', '.join(map(str, shown))}]")
    return bounds


def _acc(t: torch.Tensor) -> torch.dtype:
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x / sqrt(sum(x^2) + eps)`` over the last dim, in float32 (FLA's and Qwen3.5's l2norm)."""
    xf = x.to(_acc(x))
    return xf * torch.rsqrt((xf * xf).sum(dim=-1, keepdim=True) + eps)


def expand_heads(x: torch.Tensor, hv: int) -> torch.Tensor:
    """``[B, T, H, K] -> [B, T, HV, K]`` (each query/key head repeated for its value heads)."""
    h = x.shape[2]
    return x if h == hv else x.repeat_interleave(hv // h, dim=2)


def _chunk_one(q, k, v, g, beta, state, q_out, chunk_size):
    """One sequence batch, no document boundaries. All inputs in the accumulation dtype, heads
    expanded, queries scaled: ``q, k, q_out [B, T, HV, K]``, ``v [B, T, HV, V]``,
    ``g, beta [B, T, HV]``, ``state [B, HV, K, V]``. Returns ``o, o_out`` ``[B, T, HV, V]``
    (``o_out`` None without ``q_out``) and the final state."""
    B, T, Hv, K = k.shape
    Vd = v.shape[-1]
    C = chunk_size
    pad = (C - T % C) % C
    # padding at the end: k = 0, beta = 0, g = 0 leave the state unchanged
    tr = lambda x: F.pad(x.transpose(1, 2), (0, 0, 0, pad))  # [B, HV, T + pad, D]
    q, k, v = tr(q), tr(k), tr(v)
    q_out = tr(q_out) if q_out is not None else None
    g = F.pad(g.transpose(1, 2), (0, pad))
    beta = F.pad(beta.transpose(1, 2), (0, pad))
    n = (T + pad) // C
    ch = lambda x: x.reshape(B, Hv, n, C, x.shape[-1])
    q, k, v = ch(q), ch(k), ch(v)
    q_out = ch(q_out) if q_out is not None else None
    g = g.reshape(B, Hv, n, C).cumsum(-1)  # G_t: log decay from the chunk start to t (inclusive)
    beta = beta.reshape(B, Hv, n, C)

    causal = torch.ones(C, C, dtype=torch.bool, device=k.device).tril()
    decay = (g[..., :, None] - g[..., None, :]).masked_fill(~causal, float("-inf")).exp()  # [.., t, s]
    kb = k * beta[..., None]
    # WY representation: (I + strictly_lower(beta k k^T decay)) u = beta v, w likewise for the
    # decayed keys that read the state at the chunk start
    A = (kb @ k.transpose(-1, -2)) * decay
    u = torch.linalg.solve_triangular(A, v * beta[..., None], upper=False, unitriangular=True)
    w = torch.linalg.solve_triangular(A, kb * g.exp()[..., None], upper=False, unitriangular=True)
    k_to_end = k * (g[..., -1:] - g).exp()[..., None]
    chunk_decay = g[..., -1].exp()[..., None, None]

    def reads(qq):  # the two terms of a chunk's readout, for one query set
        return qq * g.exp()[..., None], (qq @ k.transpose(-1, -2)) * decay

    q_state, q_intra = reads(q)
    if q_out is not None:
        qo_state, qo_intra = reads(q_out)
    o = torch.empty(B, Hv, n, C, Vd, dtype=v.dtype, device=v.device)
    o_out = torch.empty_like(o) if q_out is not None else None
    S = state
    for i in range(n):
        v_new = u[:, :, i] - w[:, :, i] @ S  # the chunk's values minus what the state predicts
        o[:, :, i] = q_state[:, :, i] @ S + q_intra[:, :, i] @ v_new
        if q_out is not None:
            o_out[:, :, i] = qo_state[:, :, i] @ S + qo_intra[:, :, i] @ v_new
        S = S * chunk_decay[:, :, i] + k_to_end[:, :, i].transpose(-1, -2) @ v_new
    unch = lambda x: x.reshape(B, Hv, n * C, Vd)[:, :, :T].transpose(1, 2)
    return unch(o), (unch(o_out) if o_out is not None else None), S


def chunk_gated_delta_rule_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    q_out: Optional[torch.Tensor] = None,
    scale: Optional[float] = None,
    initial_state: Optional[torch.Tensor] = None,
    output_final_state: bool = False,
    cu_seqlens: Optional[torch.Tensor] = None,
    use_qk_l2norm: bool = True,
    chunk_size: int = 64,
):
    """Chunked gated delta rule over both streams.

    ``q_out`` (optional) ``[B, T, H, K]`` holds an output-stream query at every position (rows
    that are not output positions may hold anything; callers scatter sparse output queries in,
    see :func:`orthros.ops.gdn.gated_delta_rule`). ``cu_seqlens`` (``B == 1``) resets the state
    at every document start; ``initial_state`` / the final state are then per document.

    Returns ``(o, o_out, final_state)``: ``o, o_out [B, T, HV, V]`` (``o_out`` None without
    ``q_out``), ``final_state [N, HV, K, V]`` float32 (None unless ``output_final_state``).
    """
    chunk_size = check_positive_int("chunk_size", chunk_size)  # 0 divided by zero, < 0 failed in a reshape
    out_dtype = v.dtype
    acc = _acc(v)
    B, T, H, K = k.shape
    Hv = v.shape[2]
    scale = K ** -0.5 if scale is None else scale
    prep_q = lambda x: expand_heads(l2norm(x) if use_qk_l2norm else x.to(acc), Hv) * scale
    qs = prep_q(q)
    qo = prep_q(q_out) if q_out is not None else None
    ks = expand_heads(l2norm(k) if use_qk_l2norm else k.to(acc), Hv)
    vs, gs, bs = v.to(acc), g.to(acc), beta.to(acc)
    bounds = [0, T] if cu_seqlens is None else check_cu_seqlens_values(cu_seqlens, T)
    N = B if cu_seqlens is None else len(bounds) - 1
    if initial_state is None:
        h0 = torch.zeros(N, Hv, K, v.shape[-1], dtype=acc, device=v.device)
    else:
        h0 = initial_state.to(acc)
    if cu_seqlens is None:
        o, o_out, S = _chunk_one(qs, ks, vs, gs, bs, h0, qo, chunk_size)
    else:
        outs, outs_o, finals = [], [], []
        for d in range(N):
            s, e = bounds[d], bounds[d + 1]
            sl = lambda x: x[:, s:e] if x is not None else None
            od, ood, Sd = _chunk_one(sl(qs), sl(ks), sl(vs), sl(gs), sl(bs), h0[d:d + 1], sl(qo), chunk_size)
            outs.append(od), outs_o.append(ood), finals.append(Sd)
        o = torch.cat(outs, dim=1)
        o_out = torch.cat(outs_o, dim=1) if qo is not None else None
        S = torch.cat(finals, dim=0)
    final = S.to(torch.float64 if acc == torch.float64 else torch.float32) if output_final_state else None
    return o.to(out_dtype), (o_out.to(out_dtype) if o_out is not None else None), final


def gated_delta_rule_step_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    *,
    q_out: Optional[torch.Tensor] = None,
    scale: Optional[float] = None,
    use_qk_l2norm: bool = True,
):
    """One token per sequence (decode), updating ``state [B, HV, K, V]`` IN PLACE (static buffers:
    CUDA-graph friendly). ``q, k [B, H, K]``, ``v [B, HV, V]``, ``g, beta [B, HV]``, ``q_out``
    ``[B, H, K]`` (the output token of a decode pair reads the updated state). Returns
    ``o [B, HV, V]`` and ``o_out`` (or None)."""
    Hv, K = v.shape[1], k.shape[-1]
    acc = state.dtype
    scale = K ** -0.5 if scale is None else scale
    norm = (lambda x: l2norm(x).to(acc)) if use_qk_l2norm else (lambda x: x.to(acc))
    rep = lambda x: x if x.shape[1] == Hv else x.repeat_interleave(Hv // x.shape[1], dim=1)
    kk = rep(norm(k))
    state.mul_(g.to(acc).exp()[..., None, None])
    pred = torch.einsum("bhk,bhkv->bhv", kk, state)
    delta = beta.to(acc)[..., None] * (v.to(acc) - pred)
    state.add_(kk[..., :, None] * delta[..., None, :])
    qs = rep(norm(q)) * scale
    if q_out is None:
        return torch.einsum("bhk,bhkv->bhv", qs, state).to(v.dtype), None
    both = torch.stack([qs, rep(norm(q_out)) * scale], dim=2)  # one read of the state for both
    o2 = torch.einsum("bhqk,bhkv->bhqv", both, state).to(v.dtype)
    return o2[:, :, 0], o2[:, :, 1]


__all__ = ["check_cu_seqlens_values", "chunk_gated_delta_rule_ref", "gated_delta_rule_step_ref", "l2norm", "expand_heads"]

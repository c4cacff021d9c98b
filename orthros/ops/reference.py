"""Pure-PyTorch reference of Orthros attention (paper Section 3.1, Algorithm 1).

Inputs arrive already validated and normalised by :func:`orthros.ops.orthros_attention`:

* ``q``      ``[B, Tq, Hq, D]``  base-stream queries; query ``i`` sits at absolute position
  ``Tk - Tq + i`` (queries are aligned to the end of the keys, so a decode step with a cache
  is the same op as a training step).
* ``k, v``   ``[B, Tk, Hkv, D]`` keys / values of the base stream (every token, cache included).
* ``q_out``  ``[B, To, Hq, D]``  output-stream queries.
* ``output_positions`` ``[B, To]`` (int64) absolute position of each output query.
* ``doc_ids`` ``[Tk]`` (int64) or ``None``: document of every position (packed sequences).
* ``kv_start`` ``[B]`` (int64) or ``None``: keys before it are padding (left-padded batches).

Everything is computed in float32 (float64 inputs in float64) and returned in the input dtype. The window stream is
computed block by block (each query block sees ``block + w - 1`` keys), so memory is linear
in ``T``; the full stream is chunked over output queries. Fully masked rows (a padding query
with no visible key) return zeros, never NaN.
"""

from __future__ import annotations

import torch

_FULL_CHUNK = 1024


def _acc(t: torch.Tensor) -> torch.dtype:
    """Accumulation dtype: float64 stays float64 (for exact checks), everything else is float32."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _masked_softmax_av(scores: torch.Tensor, allowed: torch.Tensor, v_blocks, einsum_av: str):
    scores = scores.masked_fill(~allowed, float("-inf"))
    m = scores.amax(dim=-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = torch.exp(scores - m)
    denom = p.sum(dim=-1, keepdim=True)
    p = p / torch.where(denom > 0, denom, torch.ones_like(denom))
    return torch.einsum(einsum_av, p, v_blocks)


def window_blocks(Tq: int, Tk: int, window_size: int, device, doc_ids=None, kv_start=None):
    """Block layout of the window stream, shared by the reference and the SDPA fast path.

    Queries (the last ``Tq`` of ``Tk`` positions) are cut into ``nb`` blocks of ``C``; block ``n``
    needs the ``K = C + w - 1`` keys ending at its last query. Returns ``(C, nb, kidx, allowed)``:
    ``kidx [nb, K]`` key indices (clamped into range) and the mask ``allowed [B or 1, nb, C, K]``
    (window, causality, key range, same document, not left padding).
    """
    w = min(window_size, Tk)
    C = max(16, min(w, 256))
    nb = (Tq + C - 1) // C
    K = C + w - 1
    p0 = Tk - Tq
    qpos = p0 + torch.arange(nb * C, device=device).view(nb, C)
    kpos = (p0 + torch.arange(nb, device=device) * C - (w - 1)).view(nb, 1) + torch.arange(K, device=device).view(1, K)
    kidx = kpos.clamp(0, Tk - 1)
    allowed = ((kpos >= 0) & (kpos < Tk))[:, None, :] & (kpos[:, None, :] <= qpos[:, :, None]) \
        & (kpos[:, None, :] > qpos[:, :, None] - w) & (qpos[:, :, None] < Tk)
    if doc_ids is not None:
        allowed = allowed & (doc_ids[kidx][:, None, :] == doc_ids[qpos.clamp(max=Tk - 1)][:, :, None])
    allowed = allowed.unsqueeze(0)
    if kv_start is not None:
        allowed = allowed & (kpos.view(1, nb, 1, K) >= kv_start.view(-1, 1, 1, 1))
    return C, nb, kidx, allowed


def window_attention_reference(q, k, v, *, window_size: int, scale: float, doc_ids=None, kv_start=None):
    """o[t] = softmax attention of q[t] over keys max(0, t-w+1) .. t (same document only)."""
    B, Tq, Hq, D = q.shape
    Hkv = k.shape[2]
    G = Hq // Hkv
    if Tq == 0:
        return q.new_zeros(B, 0, Hq, v.shape[-1])
    C, nb, kidx, allowed = window_blocks(Tq, k.shape[1], window_size, q.device, doc_ids, kv_start)
    qf = torch.nn.functional.pad(q.to(_acc(q)), (0, 0, 0, 0, 0, nb * C - Tq))
    qb = qf.view(B, nb, C, Hkv, G, D)
    kb = k.to(_acc(q))[:, kidx]  # [B, nb, K, Hkv, D]
    vb = v.to(_acc(q))[:, kidx]
    scores = torch.einsum("bncHgd,bnkHd->bnHgck", qb, kb) * scale
    o = _masked_softmax_av(scores, allowed[:, :, None, None], vb, "bnHgck,bnkHd->bncHgd")
    o = o.reshape(B, nb * C, Hq, v.shape[-1])[:, :Tq]
    return o.to(q.dtype)


def full_attention_reference(q_out, k, v, output_positions, *, scale: float, doc_ids=None, kv_start=None):
    """o_out[i] = softmax attention of q_out[i] over keys 0 .. output_positions[i] (same document)."""
    B, To, Hq, D = q_out.shape
    Tk, Hkv = k.shape[1], k.shape[2]
    G = Hq // Hkv
    if To == 0:
        return q_out.new_zeros(B, 0, Hq, v.shape[-1])
    dev = q_out.device
    kf, vf = k.to(_acc(q_out)), v.to(_acc(q_out))
    kpos = torch.arange(Tk, device=dev)
    pos = output_positions.expand(B, To)
    outs = []
    for s in range(0, To, _FULL_CHUNK):
        e = min(To, s + _FULL_CHUNK)
        qc = q_out[:, s:e].to(_acc(q_out)).view(B, e - s, Hkv, G, D)
        pc = pos[:, s:e]  # [B, c]
        allowed = kpos.view(1, 1, Tk) <= pc[:, :, None]
        if doc_ids is not None:
            allowed = allowed & (doc_ids.view(1, 1, Tk) == doc_ids[pc][:, :, None])
        if kv_start is not None:
            allowed = allowed & (kpos.view(1, 1, Tk) >= kv_start.view(B, 1, 1))
        scores = torch.einsum("bcHgd,bkHd->bHgck", qc, kf) * scale
        o = _masked_softmax_av(scores, allowed[:, None, None], vf, "bHgck,bkHd->bcHgd")
        outs.append(o.reshape(B, e - s, Hq, v.shape[-1]))
    return torch.cat(outs, dim=1).to(q_out.dtype)


def orthros_attention_reference(q, k, v, q_out, *, window_size, output_positions, scale, doc_ids=None, kv_start=None):
    o = window_attention_reference(q, k, v, window_size=window_size, scale=scale, doc_ids=doc_ids, kv_start=kv_start)
    o_out = full_attention_reference(q_out, k, v, output_positions, scale=scale, doc_ids=doc_ids, kv_start=kv_start)
    return o, o_out

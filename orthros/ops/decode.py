"""One Orthros decode step against a static KV cache: the window query and the full query of
each batch row, sharing the cached K/V.

``orthros_decode_attention`` dispatches to the Triton kernel on CUDA (when it supports the
inputs) and to :func:`decode_attention_reference` elsewhere. Both have the same signature:

* ``q``, ``q_out``: ``[B, 1, Hq, D]`` window-stream and output-stream queries of the new token;
* ``k_cache``, ``v_cache``: ``[B, L_max, Hkv, D]`` static caches that already hold the new
  token's K/V at index ``cache_seqlens[b] - 1``;
* ``cache_seqlens``: ``[B]`` int32/int64 on the device, valid length of each row (rows may
  differ; nothing is read back to the host, so the step is CUDA-graph capturable).

Returns ``(o, o_out)``, each ``[B, 1, Hq, D]``: ``o`` attends the last ``window_size`` valid
keys, ``o_out`` all ``cache_seqlens[b]`` keys. A row with length 0 gives zeros. With
``stacked=True``: one ``[B, 2, Hq, D]`` tensor, ``o`` in row 0 and ``o_out`` in row 1 (the
layout ``W_O`` reads; the kernel writes it directly, no concatenation).

``orthros_decode_qkv_attention`` is the same step from the raw output of the fused QKV
projection: the q/k RMSNorm, the queries' scale-offset, RoPE and the new token's cache write
run inside the attention kernel (one launch where the layer's token-wise code would add one
elementwise kernel and the cache write before it), with its reference
:func:`decode_qkv_attention_reference` (the layer's ops, then :func:`decode_attention_reference`).

The kernels have no backward: a step that autograd records (grad mode on and an input requiring
grad) runs the differentiable reference, silently under ``backend="auto"``, with a warning under
``backend="triton"`` (host-side flags only: an inference-mode decode is unchanged).
"""

from __future__ import annotations

import math
import warnings
from typing import Optional

import torch

from ..utils import as_int, check_positive_int
from .attention import FLOAT_DTYPES, check_scale
from .backends import check_backend, stacklevel_outside_ops, use_triton
from .pointwise import apply_rope, check_eps, rms_norm


def decode_attention_reference(q, q_out, k_cache, v_cache, cache_seqlens, *, window_size: int,
                               scale: Optional[float] = None, stacked: bool = False):
    """Pure-PyTorch decode step (float32 math, fp64 stays fp64); masks by length, no host sync."""
    B, _, Hq, D = q.shape
    L, Hkv = k_cache.shape[1], k_cache.shape[2]
    G = Hq // Hkv
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    lens = cache_seqlens.to(device=q.device, dtype=torch.int64).view(B, 1)
    kpos = torch.arange(L, device=q.device).view(1, L)
    valid = kpos < lens
    # heads-major [B, Hkv, L, D], laid out once for both streams (an einsum over the cache's
    # [B, L, Hkv, D] copied the whole cache into that layout for each product: ~4x the time)
    kf = k_cache.to(acc).transpose(1, 2).contiguous()
    # slots past a row's length are not data (a static cache may hold anything there, NaN
    # included): zero them, else their zero softmax weight times NaN/inf poisons the row
    vf = v_cache.to(acc).transpose(1, 2).masked_fill(~valid.view(B, 1, L, 1), 0.0).contiguous()
    in_win = valid & (kpos >= lens - window_size)
    outs = []
    for qq, allowed in ((q, in_win), (q_out, valid)):
        qg = qq[:, 0].to(acc).view(B, Hkv, G, D)
        s = (qg @ kf.transpose(-1, -2)) * scale
        s = s.masked_fill(~allowed.view(B, 1, 1, L), float("-inf"))
        m = s.amax(-1, keepdim=True)
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        p = torch.exp(s - m)
        den = p.sum(-1, keepdim=True)
        p = p / torch.where(den > 0, den, torch.ones_like(den))
        o = (p @ vf).reshape(B, 1, Hq, v_cache.shape[-1])
        outs.append(o.to(q.dtype))
    return torch.cat(outs, dim=1) if stacked else (outs[0], outs[1])


def _desc(t) -> str:
    """A tensor's shape, or the type of what is not a tensor (for error messages)."""
    return str(tuple(t.shape)) if isinstance(t, torch.Tensor) else type(t).__name__


def _desc_int(t) -> str:
    """A lengths argument for an error message: dtype and shape of a tensor, else its type."""
    return f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__


def _no_backward(backend: str, op: str, *tensors) -> bool:
    """Whether the step must run the reference because autograd records it: the Triton kernels
    have no backward (their outputs would not require grad, so ``backward`` failed or the
    gradient was silently lost). ``"triton"`` asked for explicitly warns, as on inputs the kernels
    do not run. Host-side flags only: no sync, nothing in an inference-mode decode."""
    if not (torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)):
        return False
    if backend == "triton":
        warnings.warn(f"{op}: the Triton kernel has no backward and an input requires grad; using the reference",
                      stacklevel=stacklevel_outside_ops())
    return True


def _check(q, q_out, k_cache, v_cache, cache_seqlens, window_size, scale=None):
    for name, t in (("q", q), ("q_out", q_out), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"{name} must be a 4-D tensor, got {_desc(t)}")
    B, one, Hq, D = q.shape
    if one != 1 or q_out.shape != q.shape:
        raise ValueError(f"q and q_out must both be [B, 1, Hq, D], got {tuple(q.shape)} and {tuple(q_out.shape)}")
    if k_cache.shape != v_cache.shape or k_cache.shape[0] != B or k_cache.shape[3] != D:
        raise ValueError(f"k_cache/v_cache must be [B={B}, L_max, Hkv, D={D}], got {tuple(k_cache.shape)} "
                         f"and {tuple(v_cache.shape)}")
    Hkv = k_cache.shape[2]
    if Hkv == 0 or Hq % Hkv:
        raise ValueError(f"query heads ({Hq}) must be a multiple of key/value heads ({Hkv})")
    if D == 0 or k_cache.shape[1] == 0:
        raise ValueError(f"the head dim D must be >= 1 and the caches must have L_max >= 1 (they hold the new "
                         f"token), got q {tuple(q.shape)} and k_cache {tuple(k_cache.shape)}")
    if not (q.dtype == q_out.dtype == k_cache.dtype == v_cache.dtype):
        raise ValueError(f"q, q_out, k_cache, v_cache must share one dtype, got {q.dtype}, {q_out.dtype}, "
                         f"{k_cache.dtype}, {v_cache.dtype}")
    if q.dtype not in FLOAT_DTYPES:
        raise ValueError(f"q, q_out, k_cache, v_cache must be floating tensors (fp16/bf16/fp32/fp64), got {q.dtype}")
    if not (q.device == q_out.device == k_cache.device == v_cache.device):
        raise ValueError(f"q, q_out, k_cache, v_cache must be on the same device, got {q.device}, {q_out.device}, "
                         f"{k_cache.device}, {v_cache.device}")
    if not isinstance(cache_seqlens, torch.Tensor) or cache_seqlens.dim() != 1 or cache_seqlens.numel() != B \
            or cache_seqlens.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"cache_seqlens must be an int32/int64 tensor of shape [{B}] (each row's cached length), "
                         f"got {_desc_int(cache_seqlens)}")
    if cache_seqlens.device != q.device:
        raise ValueError(f"cache_seqlens must be on q's device {q.device}, got {cache_seqlens.device}")
    window_size = check_positive_int("window_size", window_size)
    check_scale(scale)
    return window_size  # a Python int (a NumPy one reached the kernel as a constant)


def orthros_decode_attention(q, q_out, k_cache, v_cache, cache_seqlens, *, window_size: int,
                             scale: Optional[float] = None, backend: str = "auto", stacked: bool = False):
    """Decode step of Orthros attention; see the module docstring. ``backend`` (one vocabulary
    with the training op, :mod:`orthros.ops.backends`): "auto" (Triton on CUDA when supported,
    else the reference), "triton", or "reference" / "sdpa" (both the PyTorch reference: a
    single-query step has no SDPA form worth its launch)."""
    check_backend(backend)
    if not isinstance(stacked, bool):
        raise ValueError(f"stacked must be True or False, got {stacked!r}")
    window_size = _check(q, q_out, k_cache, v_cache, cache_seqlens, window_size, scale)
    window_size = min(window_size, k_cache.shape[1])  # the same keys; 10**20 overflowed int64 below
    if not _no_backward(backend, "orthros_decode_attention", q, q_out, k_cache, v_cache) \
            and use_triton(backend, q, k_cache, "orthros_decode_attention"):
        from .triton import decode_attention_triton

        # the kernel reads LENS[b] at b: a strided view (a column of a [B, 2] table) read other rows' values
        return decode_attention_triton(q, q_out, k_cache, v_cache, cache_seqlens.contiguous(), window_size=window_size,
                                       scale=scale, stacked=stacked)
    return decode_attention_reference(q, q_out, k_cache, v_cache, cache_seqlens, window_size=window_size,
                                      scale=scale, stacked=stacked)



def decode_qkv_attention_reference(qkv, k_cache, v_cache, lens, *, num_heads: int, q_rows=(0, 1), rope,
                                   window_size: int, scale: Optional[float] = None, q_norm=None, k_norm=None,
                                   eps: float = 1e-6, scale_offset=(None, None, None, None)):
    """The decode step from raw projections, with the layer's own ops (see
    :func:`orthros_decode_qkv_attention` for the arguments): the queries of rows ``q_rows``
    normalised, scale-offset (``addcmul``, as the fused layer does) and rotated, the key of row 0
    normalised and rotated, K/V written into the caches at ``lens``, then
    :func:`decode_attention_reference` over ``lens + 1`` keys. Returns ``[B, 2, Hq, D]``."""
    B = qkv.shape[0]
    Hkv, D = k_cache.shape[2], k_cache.shape[3]
    qd, kd = num_heads * D, Hkv * D
    cos, sin = rope
    alpha_w, beta_w, alpha_f, beta_f = scale_offset

    def query(row, alpha, beta):
        q = qkv[:, row:row + 1, :qd].reshape(B, 1, num_heads, D)
        if q_norm is not None:
            q = rms_norm(q, q_norm, eps)
        if alpha is not None:
            q = torch.addcmul(beta.view(num_heads, D), q, alpha.view(num_heads, D))
        return apply_rope(q.to(qkv.dtype), cos, sin)

    k = qkv[:, :1, qd:qd + kd].reshape(B, 1, Hkv, D)
    v = qkv[:, :1, qd + kd:qd + 2 * kd].reshape(B, 1, Hkv, D)
    if k_norm is not None:
        k = rms_norm(k, k_norm, eps).to(v.dtype)
    k = apply_rope(k, cos, sin)
    rows = torch.arange(B, device=qkv.device)
    pos = lens.to(torch.int64)
    k_cache[rows, pos] = k[:, 0]
    v_cache[rows, pos] = v[:, 0]
    return decode_attention_reference(query(q_rows[0], alpha_w, beta_w), query(q_rows[1], alpha_f, beta_f),
                                      k_cache, v_cache, pos + 1, window_size=window_size, scale=scale, stacked=True)


def _check_qkv(qkv, k_cache, v_cache, lens, num_heads, q_rows, rope, q_norm, k_norm, eps, scale_offset, window_size,
               scale=None):
    if not isinstance(qkv, torch.Tensor) or qkv.dim() != 3:
        raise ValueError(f"qkv must be a [B, rows, (Hq + 2 Hkv) D] tensor, got {_desc(qkv)}")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"{name} must be a 4-D tensor [B, L_max, Hkv, D]")
    B, R, C = qkv.shape
    num_heads = check_positive_int("num_heads", num_heads)
    if k_cache.shape != v_cache.shape or k_cache.shape[0] != B:
        raise ValueError(f"k_cache/v_cache must be [B={B}, L_max, Hkv, D], got {tuple(k_cache.shape)} and "
                         f"{tuple(v_cache.shape)}")
    Hkv, D = k_cache.shape[2], k_cache.shape[3]
    if Hkv == 0 or num_heads % Hkv or D % 2 or D == 0:
        raise ValueError(f"num_heads ({num_heads}) must be a multiple of the caches' KV heads ({Hkv}), and "
                         f"head_dim ({D}) even and >= 2")
    if k_cache.shape[1] == 0:
        raise ValueError(f"k_cache/v_cache must have L_max >= 1 (the new token is written there), got "
                         f"{tuple(k_cache.shape)}")
    if C != (num_heads + 2 * Hkv) * D:
        raise ValueError(f"qkv's last dimension must be (num_heads + 2 * Hkv) * head_dim = "
                         f"{(num_heads + 2 * Hkv) * D}, got {C}")
    if not (qkv.dtype == k_cache.dtype == v_cache.dtype):
        raise ValueError(f"qkv, k_cache and v_cache must share one dtype, got {qkv.dtype}, {k_cache.dtype}, "
                         f"{v_cache.dtype}")
    if qkv.dtype not in FLOAT_DTYPES:
        raise ValueError(f"qkv, k_cache and v_cache must be floating tensors (fp16/bf16/fp32/fp64), got {qkv.dtype}")
    if not (qkv.device == k_cache.device == v_cache.device):
        raise ValueError(f"qkv, k_cache and v_cache must be on the same device, got {qkv.device}, {k_cache.device}, "
                         f"{v_cache.device}")
    rows = tuple(map(as_int, q_rows)) if isinstance(q_rows, tuple) else ()  # NumPy's, 0-d tensors; no bool
    if len(rows) != 2 or not all(r is not None and 0 <= r < R for r in rows):
        raise ValueError(f"q_rows must be two row indices of qkv in [0, {R}), got {q_rows!r}")
    if not isinstance(lens, torch.Tensor) or lens.shape != (B,) or lens.dtype not in (torch.int32, torch.int64) \
            or lens.device != qkv.device:
        raise ValueError(f"lens must be an int32/int64 tensor of shape [{B}] on qkv's device {qkv.device}, got "
                         f"{_desc_int(lens)}{'' if not isinstance(lens, torch.Tensor) else ' on ' + str(lens.device)}")
    if not (isinstance(rope, (tuple, list)) and len(rope) == 2):
        raise ValueError(f"rope must be the pair (cos, sin) of the new token's position, got {_desc(rope)}")
    for name, t in zip(("cos", "sin"), rope):
        if not isinstance(t, torch.Tensor) or t.dim() != 3 or t.shape[0] not in (1, B) or t.shape[1] != 1 \
                or t.shape[2] != D:
            raise ValueError(f"rope's {name} must be [1 or B={B}, 1, head_dim={D}] (RoPE over the whole head), "
                             f"got {_desc(t)}")
    for name, t in (("q_norm", q_norm), ("k_norm", k_norm)):
        if t is not None and (not isinstance(t, torch.Tensor) or t.shape != (D,)):
            raise ValueError(f"{name} must be a [{D}] weight or None, got {_desc(t)}")
    if q_norm is not None or k_norm is not None:
        check_eps("eps", eps, "q_norm / k_norm")
    if not isinstance(scale_offset, (tuple, list)) or len(scale_offset) != 4:
        raise ValueError(f"scale_offset must be (alpha_w, beta_w, alpha_f, beta_f), each [Hq * D] or None, got "
                         f"{_desc(scale_offset)}")
    for a, b in (scale_offset[:2], scale_offset[2:]):
        if (a is None) != (b is None) or (a is not None and not (
                isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
                and a.numel() == num_heads * D and b.numel() == num_heads * D)):
            raise ValueError(f"scale_offset: each stream's alpha and beta must both be None or both [{num_heads * D}]")
    params = (("rope's cos", rope[0]), ("rope's sin", rope[1]), ("q_norm", q_norm), ("k_norm", k_norm),
              *zip((f"scale_offset's {n}" for n in ("alpha_w", "beta_w", "alpha_f", "beta_f")), scale_offset))
    for name, t in params:  # the kernel reads them through pointers: a CPU one in a CUDA step is no address there
        if t is not None and not t.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor, got {t.dtype}")
        if t is not None and t.device != qkv.device:
            raise ValueError(f"{name} must be on qkv's device {qkv.device}, got {t.device}")
    window_size = check_positive_int("window_size", window_size)
    check_scale(scale)
    return num_heads, rows, window_size  # Python ints: a NumPy num_heads reached the kernel as a constant and failed there


def orthros_decode_qkv_attention(qkv, k_cache, v_cache, lens, *, num_heads: int, q_rows=(0, 1), rope,
                                 window_size: int, scale: Optional[float] = None, q_norm=None, k_norm=None,
                                 eps: float = 1e-6, scale_offset=(None, None, None, None), backend: str = "auto"):
    """One decode step from the fused QKV projection's raw output; returns ``[B, 2, Hq, D]``
    (the window stream's row, then the full stream's: ``stacked`` of
    :func:`orthros_decode_attention`), and writes the new token's K/V into the caches.

    * ``qkv [B, R, (Hq + 2 Hkv) D]``: the projection's rows (q columns, then k, then v); K/V
      come from row 0, the window query from row ``q_rows[0]``, the full query from
      ``q_rows[1]`` (one row for both: a Transformer's single query);
    * ``k_cache``, ``v_cache`` ``[B, L_max, Hkv, D]``; ``lens [B]`` (device): tokens cached per
      row before this one; the new K/V go to index ``lens[b]`` (``< L_max``, not checked: that
      would read the device) and the step attends ``lens[b] + 1`` keys;
    * ``rope``: ``(cos, sin)`` ``[1 or B, 1, D]`` of the new token's position (RoPE over the
      whole head, rotate-half);
    * ``q_norm``, ``k_norm``: RMSNorm weights ``[D]`` (per head; ``None``: no norm), ``eps``;
    * ``scale_offset``: ``(alpha_w, beta_w, alpha_f, beta_f)``, each ``[Hq * D]`` or ``None``:
      the window and full queries' ``alpha * q + beta`` (after the norm, before RoPE).

    ``backend``: "auto" (the Triton kernel on CUDA, else the reference), "triton",
    "reference" / "sdpa" (the reference)."""
    check_backend(backend)
    q_rows = tuple(q_rows) if isinstance(q_rows, (tuple, list)) else q_rows
    num_heads, q_rows, window_size = _check_qkv(qkv, k_cache, v_cache, lens, num_heads, q_rows, rope, q_norm, k_norm,
                                                eps, scale_offset, window_size, scale)
    window_size = min(window_size, k_cache.shape[1])  # the same keys; 10**20 overflowed int64 below
    kw = dict(num_heads=num_heads, q_rows=q_rows, rope=rope, window_size=window_size, scale=scale, q_norm=q_norm,
              k_norm=k_norm, eps=eps, scale_offset=tuple(scale_offset))
    if not _no_backward(backend, "orthros_decode_qkv_attention", qkv, k_cache, v_cache, q_norm, k_norm, *rope,
                        *scale_offset) \
            and use_triton(backend, qkv.unflatten(-1, (-1, k_cache.shape[3])), k_cache, "orthros_decode_qkv_attention"):
        from .triton import decode_qkv_attention_triton

        # the kernel reads lens and the norm weights at unit stride: a strided view (lens a column of a table,
        # a weight sliced w[::2]) read other elements, silently
        kw.update(q_norm=None if q_norm is None else q_norm.contiguous(),
                  k_norm=None if k_norm is None else k_norm.contiguous())
        return decode_qkv_attention_triton(qkv, k_cache, v_cache, lens.contiguous(), **kw)
    return decode_qkv_attention_reference(qkv, k_cache, v_cache, lens, **kw)

__all__ = ["orthros_decode_attention", "decode_attention_reference", "orthros_decode_qkv_attention",
           "decode_qkv_attention_reference"]

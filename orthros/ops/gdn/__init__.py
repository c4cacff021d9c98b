"""Gated DeltaNet ops with Orthros-H's output stream (paper Section 4.6).

:func:`gated_delta_rule` is the one entry: the base stream's gated delta rule over ``T`` tokens
and, optionally, the output stream's readout of the same states, ``o'_j = scale * S_{p_j}^T
q'_j`` (``S_t`` is the state after token ``t``, FLA's convention), without recomputing them.
Backends: ``"torch"`` (:mod:`.naive`, pure PyTorch, CPU and CUDA) and ``"fla"`` (:mod:`.fla`,
fla-core's Triton pieces); ``"auto"`` takes ``"fla"`` on CUDA when fla-core is installed.
:func:`gated_delta_rule_step` is the decode step (one token, state updated in place) and
:func:`causal_conv1d` the short convolution with its cached window.
"""

from __future__ import annotations

from typing import Optional, Union

import torch
import torch.nn.functional as F

import warnings

from ..attention import as_int_tensor, check_scale, is_int_tensor
from ...utils import install_hint
from .fla import HAVE_FLA, causal_conv1d_fla, chunk_gated_delta_rule_fla, fla_backward_supported
from .naive import check_cu_seqlens_values, chunk_gated_delta_rule_ref, expand_heads, gated_delta_rule_step_ref, l2norm

GDN_BACKENDS = ("auto", "torch", "fla")
# OrthrosConfig.attn_backend -> GDN backend (the attention layers' names, one knob for the model)
FROM_ATTN_BACKEND = {"auto": "auto", "reference": "torch", "sdpa": "torch", "triton": "fla"}


def resolve_gdn_backend(backend: str, x: torch.Tensor) -> str:
    if backend not in GDN_BACKENDS:
        raise ValueError(f"GDN backend must be one of {GDN_BACKENDS}, got {backend!r}")
    if backend == "auto":
        return "fla" if (x.is_cuda and HAVE_FLA) else "torch"
    if backend == "fla" and not HAVE_FLA:  # attn_backend="triton" maps here: as the attention without triton
        warnings.warn(f"the 'fla' GDN backend needs fla-core ({install_hint('hybrid')}), which is not "
                      "installed: using the PyTorch GDN", stacklevel=3)
        return "torch"
    if backend == "fla" and not x.is_cuda:  # as the Triton attention falls back to its reference
        warnings.warn(f"the 'fla' GDN backend needs CUDA tensors, got {x.device}: using the PyTorch GDN", stacklevel=3)
        return "torch"
    return backend


def gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    q_out: Optional[torch.Tensor] = None,
    output_positions: Union[None, str, torch.Tensor] = None,
    scale: Optional[float] = None,
    initial_state: Optional[torch.Tensor] = None,
    output_final_state: bool = False,
    cu_seqlens: Optional[torch.Tensor] = None,
    use_qk_l2norm: bool = True,
    backend: str = "auto",
):
    """Gated delta rule over the base stream plus the output stream's readout.

    * ``q, k [B, T, H, K]``, ``v [B, T, HV, V]``, ``g`` (log decay) and ``beta`` (post-sigmoid)
      ``[B, T, HV]``; ``HV`` a multiple of ``H``.
    * ``q_out [B, T_out, H, K]``: output-stream queries (None: no output stream).
      ``output_positions``: where they read the state, positions in ``[0, T)``: ``None`` (every
      position, ``T_out == T``), ``"last"`` (``T_out == 1``: the state after the last token,
      read from the final state, no extra pass), or integer positions ``[T_out]`` or
      ``[1 or B, T_out]`` (a tensor or a list), any order but DISTINCT within a row: their range
      and uniqueness are not checked (that would read the device back once per layer), and a
      repeated position gives wrong readouts (the output queries share one dense slot per token).
      Positions without ``q_out`` are refused.
    * ``initial_state [N, HV, K, V]`` (float32), ``N = B`` or the number of documents of
      ``cu_seqlens`` (``B == 1``; the state restarts at every document start). ``cu_seqlens``:
      integers rising from 0 to ``T``, empty documents allowed (values checked when on the host, a
      list or a CPU tensor; a device tensor's by the PyTorch GDN, which reads them anyway, not
      under ``"fla"``: that would synchronise).

    Returns ``(o [B, T, HV, V], o_out [B, T_out, HV, V] or None, final_state [N, HV, K, V] or None)``.
    """
    for name, t in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta), ("q_out", q_out),
                    ("initial_state", initial_state)):
        if not (isinstance(t, torch.Tensor) or t is None and name in ("q_out", "initial_state")):
            raise ValueError(f"gated_delta_rule: {name} must be a floating tensor"
                             f"{' (or None)' if name in ('q_out', 'initial_state') else ''}, got {type(t).__name__}")
    B, T, H, K = k.shape if k.dim() == 4 else (0,) * 4  # not 4-D: refused below with the others
    Hv = v.shape[2] if v.dim() == 4 else 0
    if k.dim() != 4 or q.shape != k.shape or v.dim() != 4 or v.shape[:2] != (B, T) or H == 0 or K == 0 or Hv % H \
            or g.shape != (B, T, Hv) or beta.shape != g.shape:
        raise ValueError(f"gated_delta_rule: q, k must be [B, T, H, K] (H, K >= 1), v [B, T, HV, V] (HV a multiple of "
                         f"H), g and beta [B, T, HV]; got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, "
                         f"g {tuple(g.shape)}, beta {tuple(beta.shape)}")
    for name, t in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta), ("q_out", q_out),
                    ("initial_state", initial_state)):
        if t is not None and not t.is_floating_point():
            raise ValueError(f"gated_delta_rule: {name} must be a floating tensor, got {t.dtype}")
    _check_devices("gated_delta_rule", q=q, k=k, v=v, g=g, beta=beta, q_out=q_out, initial_state=initial_state)
    if q_out is not None and (q_out.dim() != 4 or q_out.shape[0] != B or q_out.shape[2:] != (H, K)):
        raise ValueError(f"gated_delta_rule: q_out must be [B={B}, T_out, H={H}, K={K}], got {tuple(q_out.shape)}")
    if cu_seqlens is not None:  # values on the host checked here; a device tensor's where they are read
        cu_seqlens = _check_cu_seqlens("gated_delta_rule", cu_seqlens, B, T, q.device)
    N = B if cu_seqlens is None else cu_seqlens.numel() - 1
    if initial_state is not None and tuple(initial_state.shape) != (N, Hv, K, v.shape[3]):
        raise ValueError(f"gated_delta_rule: initial_state must be [N={N}, HV={Hv}, K={K}, V={v.shape[3]}] (N: B, or "
                         f"the documents of cu_seqlens), got {tuple(initial_state.shape)}")
    if q_out is None and output_positions is not None:  # else ignored: o_out None as if no stream was asked for
        raise ValueError("gated_delta_rule: output_positions needs q_out, the output stream's queries "
                         "[B, T_out, H, K]; got q_out=None")
    check_scale(scale, "gated_delta_rule: ")
    scale = K ** -0.5 if scale is None else float(scale)
    asked = backend
    backend = resolve_gdn_backend(backend, v)
    if backend == "fla" and not fla_backward_supported() and _needs_grad(q, k, v, g, beta, q_out, initial_state):
        if asked == "fla":
            raise RuntimeError("the 'fla' GDN backend cannot compute gradients here: fla-core 0.6.0 refuses its gated "
                               "backward on Hopper GPUs with Triton < 3.7.1 (fla issue #640); use backend 'auto' "
                               "or 'torch', or install Triton >= 3.7.1 or tilelang")
        _warn_once("fla-core's GDN backward is unavailable here (Hopper GPU, Triton < 3.7.1: fla issue #640); "
                   "steps that need gradients run the pure-PyTorch GDN (correct, slower)")
        backend = "torch"
    last = isinstance(output_positions, str)
    if last and output_positions != "last":
        raise ValueError(f"gated_delta_rule: output_positions must be None, 'last' or a tensor, "
                         f"got {output_positions!r}")
    if last and cu_seqlens is not None:
        raise ValueError("gated_delta_rule: output_positions='last' reads the one final state: not with cu_seqlens "
                         "(pass positions)")
    if q_out is not None and last and q_out.shape[1] != 1:
        raise ValueError(f"gated_delta_rule: output_positions='last' needs q_out [B, 1, H, K], got {tuple(q_out.shape)}")

    dense = None  # output queries at every position (rows that are not output positions: zero)
    idx = None
    if q_out is not None and not last:
        if output_positions is None:
            if q_out.shape[1] != T:
                raise ValueError(f"gated_delta_rule: q_out must be [B, T, H, K] when output_positions is None, "
                                 f"got {tuple(q_out.shape)}")
            dense = q_out
        else:
            # checks that read nothing back from the device (range and uniqueness are the caller's)
            T_out = q_out.shape[1]
            output_positions = as_int_tensor("gated_delta_rule: output_positions", output_positions, q.device,
                                             "integer positions [T_out] or [1 or B, T_out]")
            if not is_int_tensor(output_positions) and output_positions.numel() \
                    or output_positions.dim() not in (1, 2) \
                    or output_positions.shape[-1] != T_out or output_positions.dim() == 2 and output_positions.shape[0] not in (1, B):
                raise ValueError(f"gated_delta_rule: output_positions must be an integer tensor [T_out] or "
                                 f"[1 or B, T_out] = [{T_out}] or [{B}, {T_out}], got {output_positions.dtype} {tuple(output_positions.shape)}")
            idx = output_positions.to(device=q.device, dtype=torch.long).expand(B, -1)
            idx4 = idx[:, :, None, None].expand(-1, -1, H, K)
            dense = torch.zeros_like(q).scatter(1, idx4, q_out.to(q.dtype))
    want_final = output_final_state or last and q_out is not None
    if use_qk_l2norm:
        q, k = l2norm(q), l2norm(k)
        dense = l2norm(dense) if dense is not None else None
    if backend == "fla":
        o, o_dense, final = chunk_gated_delta_rule_fla(q, k, v, g, beta, q_out=dense, scale=scale,
                                                       initial_state=initial_state, output_final_state=want_final,
                                                       cu_seqlens=cu_seqlens)
    else:
        o, o_dense, final = chunk_gated_delta_rule_ref(q, k, v, g, beta, q_out=dense, scale=scale,
                                                       initial_state=initial_state, output_final_state=want_final,
                                                       cu_seqlens=cu_seqlens, use_qk_l2norm=False)
    o_out = None
    if q_out is not None:
        if last:  # the state after the last token is the final state: o' = scale * S_T^T q'
            qo = expand_heads(l2norm(q_out) if use_qk_l2norm else q_out, Hv)[:, 0].to(final.dtype) * scale
            o_out = torch.einsum("bhk,bhkv->bhv", qo, final)[:, None].to(v.dtype)
        elif idx is None:
            o_out = o_dense
        else:
            o_out = torch.gather(o_dense, 1, idx[:, :, None, None].expand(-1, -1, Hv, o_dense.shape[-1]))
    return o, o_out, (final if output_final_state else None)


def _check_devices(who: str, **tensors) -> None:
    """Every tensor given (None: absent) on the first one's device: else torch's own "not on the
    expected device" came mid-op. Metadata only, no sync."""
    (first, ref), *rest = tensors.items()
    for name, t in rest:
        if t is not None and t.device != ref.device:
            raise ValueError(f"{who}: {name} must be on {first}'s device {ref.device}, got {t.device}")


def _check_cu_seqlens(who: str, cu_seqlens, B: int, T: int, device) -> torch.Tensor:
    """``cu_seqlens`` (a tensor or a list) as a tensor on ``device``: 1-D integers, ``B == 1``,
    and values rising from 0 to ``T`` (:func:`.naive.check_cu_seqlens_values`) where they are on
    the host (a list, a CPU tensor); a device tensor's values are not read here (that would
    synchronise: the PyTorch GDN checks them as it reads them)."""
    cu_seqlens = as_int_tensor(f"{who}: cu_seqlens", cu_seqlens, None, "a 1-D integer tensor [num_docs + 1]")
    if B != 1:
        raise ValueError(f"{who}: cu_seqlens needs B == 1 (packed documents), got B = {B}")
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2 or not is_int_tensor(cu_seqlens):
        raise ValueError(f"{who}: cu_seqlens must be a 1-D integer tensor [num_docs + 1], got "
                         f"{cu_seqlens.dtype} {tuple(cu_seqlens.shape)}")
    if cu_seqlens.device.type == "cpu":
        check_cu_seqlens_values(cu_seqlens, T, who)
    return cu_seqlens.to(device)


_WARNED = set()


def _warn_once(msg: str) -> None:
    if msg not in _WARNED:
        _WARNED.add(msg)
        warnings.warn(msg, stacklevel=3)


def gated_delta_rule_step(q, k, v, g, beta, state, *, q_out=None, scale=None, use_qk_l2norm=True):
    """Decode step: one token per sequence, ``q, k [B, H, K]``, ``v [B, HV, V]``, ``g`` and ``beta``
    ``[B, HV]``, ``q_out [B, H, K]`` or None, ``state [B, HV, K, V]`` (float32, or float64)
    updated in place. Shapes and dtypes are checked here (shapes only: no device read); the GDN
    layer, whose shapes follow from its config, calls :func:`.naive.gated_delta_rule_step_ref`
    directly (plain tensor ops, fine under CUDA graphs and torch.compile; the state is read once
    for both queries of a decode pair)."""
    who = "gated_delta_rule_step"
    for name, t in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta), ("state", state), ("q_out", q_out)):
        if (t is not None or name != "q_out") and not (isinstance(t, torch.Tensor) and t.is_floating_point()):
            raise ValueError(f"{who}: {name} must be a floating tensor, got "
                             f"{t.dtype if isinstance(t, torch.Tensor) else type(t).__name__}")
    B, H, K = k.shape if k.dim() == 3 else (0,) * 3  # not 3-D: refused below with the others
    Hv, V = (v.shape[1], v.shape[2]) if v.dim() == 3 else (0, 0)
    if k.dim() != 3 or q.shape != k.shape or v.dim() != 3 or v.shape[0] != B or H == 0 or K == 0 or Hv % H \
            or g.shape != (B, Hv) or beta.shape != g.shape or (q_out is not None and q_out.shape != k.shape) \
            or state.shape != (B, Hv, K, V):
        raise ValueError(f"{who}: q, k (and q_out) must be [B, H, K] (H, K >= 1), v [B, HV, V] (HV a multiple of H), "
                         f"g and beta [B, HV], state [B, HV, K, V]; got q {tuple(q.shape)}, k {tuple(k.shape)}, "
                         f"v {tuple(v.shape)}, g {tuple(g.shape)}, beta {tuple(beta.shape)}, state {tuple(state.shape)}"
                         + (f", q_out {tuple(q_out.shape)}" if q_out is not None else ""))
    _check_devices(who, q=q, k=k, v=v, g=g, beta=beta, state=state, q_out=q_out)
    if state.dtype not in (torch.float32, torch.float64):  # the recurrence accumulates in the state's dtype
        raise ValueError(f"{who}: state must be float32 (or float64), got {state.dtype}")
    check_scale(scale)
    return gated_delta_rule_step_ref(q, k, v, g, beta, state, q_out=q_out, scale=scale, use_qk_l2norm=use_qk_l2norm)


def causal_conv1d(x: torch.Tensor, weight: torch.Tensor, state: Optional[torch.Tensor] = None,
                  activation: bool = True, cu_seqlens: Optional[torch.Tensor] = None, backend: str = "torch"):
    """Depthwise causal convolution (the short convolution of a GDN layer) with SiLU.

    ``x [B, T, C]``, ``weight [C, W]``; ``state [B, C, W - 1]``: the inputs just before ``x``
    (None: zeros, a sequence start). ``cu_seqlens`` (``B == 1``): windows never reach across a
    document start; integers rising from 0 to ``T`` as for :func:`gated_delta_rule`, their values
    checked when on the host (a list or a CPU tensor; a device tensor's are not read: no sync,
    and the layer's :func:`gated_delta_rule` checks them under the PyTorch GDN). Returns
    ``(y [B, T, C], new_state [B, C, W - 1])``: the last ``W - 1`` inputs (for the next chunk or
    decode step).

    ``backend``: ``"torch"`` (``F.conv1d``), ``"fla"`` (fla-core's Triton kernel, one pass in
    ``x``'s layout: on the GPU the PyTorch form pays a strided concatenation, two transposes and
    a generic depthwise kernel, ~3 ms of a 16K-token chunk of Qwen3.5-9B's 8192 channels) or
    ``"auto"``, the GDN backends' rule: ``"fla"`` on CUDA with fla-core, except for steps that
    need gradients where fla-core's gated backward is refused (then both ops run in PyTorch)."""
    if not isinstance(x, torch.Tensor) or x.dim() != 3:
        raise ValueError(f"causal_conv1d: x must be a tensor [B, T, C], got "
                         f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
    B, T, C = x.shape
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        raise ValueError(f"causal_conv1d: weight must be a tensor [C={C}, W >= 1], got "
                         f"{tuple(weight.shape) if isinstance(weight, torch.Tensor) else type(weight).__name__}")
    W = weight.shape[-1]
    if weight.shape[0] != C or W == 0:
        raise ValueError(f"causal_conv1d: weight must be [C={C}, W >= 1], got {tuple(weight.shape)}")
    if state is not None and not isinstance(state, torch.Tensor):
        raise ValueError(f"causal_conv1d: state must be None or a tensor [B={B}, C={C}, W - 1={W - 1}], got "
                         f"{type(state).__name__}")
    if state is not None and tuple(state.shape) != (B, C, W - 1):
        raise ValueError(f"causal_conv1d: state must be [B={B}, C={C}, W - 1={W - 1}], got {tuple(state.shape)}")
    for name, t in (("x", x), ("weight", weight), ("state", state)):
        if t is not None and not t.is_floating_point():  # an integer x came back rounded to integers
            raise ValueError(f"causal_conv1d: {name} must be a floating tensor, got {t.dtype}")
    _check_devices("causal_conv1d", x=x, weight=weight, state=state)
    if cu_seqlens is not None:
        cu_seqlens = _check_cu_seqlens("causal_conv1d", cu_seqlens, B, T, x.device)
    if T == 0:  # nothing to convolve (F.conv1d refuses an input shorter than its kernel); the window stays
        return x.new_empty(B, 0, C), _window_after(x, state, W)
    asked = backend
    backend = resolve_gdn_backend(backend, x)
    if backend == "fla" and (
            _needs_grad(state)  # a gradient into the cached window: PyTorch's (training starts from no window)
            or asked != "fla" and not fla_backward_supported() and _needs_grad(x, weight)):
        backend = "torch"
    if backend == "fla":
        return causal_conv1d_fla(x, weight, state, activation, cu_seqlens), _window_after(x, state, W)
    xt = x.transpose(1, 2)
    if state is None:
        state = xt.new_zeros(B, C, W - 1)
    full = torch.cat([state.to(xt.dtype), xt], dim=-1)  # [B, C, W - 1 + T]
    if cu_seqlens is not None:
        # zero the inputs a window would read from an earlier document: shift-and-mask form
        pos = torch.arange(T, device=x.device)
        doc_start = cu_seqlens[torch.searchsorted(cu_seqlens, pos, right=True) - 1]
        y = torch.zeros(B, C, T, dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
        for j in range(W):  # tap j reads input t - (W - 1 - j)
            lag = W - 1 - j
            src = full[:, :, W - 1 - lag: W - 1 - lag + T]
            ok = (pos - lag >= doc_start).to(src.dtype)
            y = y + src * ok * weight[:, j:j + 1].to(src.dtype)
    else:
        y = F.conv1d(full.to(weight.dtype), weight[:, None, :], groups=C)
    if activation:
        y = F.silu(y)
    return y.transpose(1, 2).to(x.dtype), _window_after(x, state, W)


def _window_after(x: torch.Tensor, state: Optional[torch.Tensor], W: int) -> torch.Tensor:
    """The convolution window after the chunk ``x [B, T, C]``: its last ``W - 1`` inputs, reaching
    back into ``state [B, C, W - 1]`` (None: zeros) when ``T < W - 1``; ``[B, C, W - 1]`` in
    ``x``'s dtype, its own memory (not a view of the chunk)."""
    B, T, C = x.shape
    tail = x[:, max(0, T - (W - 1)):].transpose(1, 2)
    if T < W - 1:
        prev = state.to(x.dtype) if state is not None else x.new_zeros(B, C, W - 1)
        tail = torch.cat([prev, tail], dim=-1)[:, :, tail.shape[-1]:]
    return tail.clone(memory_format=torch.contiguous_format)  # contiguous() is a view of x at B = 1, W = 2


def _needs_grad(*tensors) -> bool:
    """Whether this call records a graph that a gradient flows into (through any of ``tensors``)."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


__all__ = ["GDN_BACKENDS", "FROM_ATTN_BACKEND", "HAVE_FLA", "fla_backward_supported", "gated_delta_rule", "gated_delta_rule_step",
           "causal_conv1d", "chunk_gated_delta_rule_ref", "resolve_gdn_backend", "l2norm"]

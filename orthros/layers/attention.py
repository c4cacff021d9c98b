"""The Orthros attention layer (paper Section 3.1, Algorithm 1).

One set of projections W_Q, W_K, W_V, W_O is shared by both streams. The input is the
concatenation ``h = [x_1..x_T, x'_1..x'_{T_out}]`` of the base tokens and the output-specific
tokens (Algorithm 2 duplicates the embeddings of the output positions). K and V come from the
base tokens only; the queries get stream-specific scale-offset transforms

    q  = alpha  * (x  W_Q) + beta        (base stream:   sliding window of w keys)
    q' = alpha' * (x' W_Q) + beta'       (output stream: keys 1..t, its own position's included)

and both outputs are concatenated before W_O. With a cache, the base tokens' K/V are appended
first and both streams read the whole cache.

The attention mode (``orthros/kinds.py``: ``"orthros"``, ``"full"`` causal Transformer,
``"window"`` sliding window only) is read in ONE method, :meth:`OrthrosAttention.streams`; the
layer step calls :meth:`~OrthrosAttention.project` (token-wise: queries of the streams that
exist, K/V), :meth:`~OrthrosAttention.attend` (the cache's update and kernels) and
:meth:`~OrthrosAttention.output` (``W_O``), which follow the plan it returns. The baselines
have no output tokens in ``h``: their full stream reads the base rows.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..kinds import ATTENTION_MODES, resolve_mode
from ..utils import as_int, check_positive_int
from .common import FusedProjections, RMSNorm, apply_rope, attn_backend_of, linear
from .step import StepInputs

# Initial values of the scale-offset parameters: both streams start as the plain projections
# (with them, an Orthros model at T <= w computes exactly what its source Transformer does).
SCALE_OFFSET_INIT = {"alpha": 1.0, "beta": 0.0, "alpha_out": 1.0, "beta_out": 0.0}


class Streams(NamedTuple):
    """Which attention streams a layer runs in one step (see :meth:`OrthrosAttention.streams`).

    ``window``: the base rows get window queries. ``full``: where full-stream queries come from:
    ``"tokens"`` (the appended output tokens), ``"rows"`` (every base row: a causal layer),
    ``"out_rows"`` (the base rows at the output positions) or ``None``. ``gather``: the output is
    the window result at the output positions. ``scale_offset``: the streams use their own
    alpha/beta (Orthros) instead of the plain projection."""

    window: bool
    full: Optional[str]
    gather: bool = False
    scale_offset: bool = False


_KV_ONLY = Streams(False, None)


class RawQKV(NamedTuple):
    """What :meth:`OrthrosAttention.project` hands :meth:`~OrthrosAttention.attend` when the
    step's cache runs the q/k norms, scale-offset, RoPE and the K/V write inside its attention
    kernel (a cache with ``qkv_kernel``: the engine's decode): the fused QKV projection's rows
    ``qkv [B, R, (Hq + 2 Hkv) D]`` (K/V from row 0), the rows of the window and full queries,
    and which streams' outputs the layer keeps."""

    qkv: torch.Tensor
    q_rows: tuple
    window: bool
    full: bool


class OrthrosAttention(FusedProjections, nn.Module):
    """One attention layer. Fused for inference (:meth:`~.common.FusedProjections.fuse_projections`,
    the engine's default): ``[W_q; W_k; W_v]`` (and their biases) is one GEMM, ``[alpha; alpha']``
    and ``[beta; beta']`` one buffer each, so a decode pair's scale-offset is one ``addcmul``."""

    FUSIONS = {"qkv_fused": ("q_proj.weight", "k_proj.weight", "v_proj.weight"),
               "qkv_bias_fused": ("q_proj.bias", "k_proj.bias", "v_proj.bias"),
               "alpha_fused": ("alpha", "alpha_out"), "beta_fused": ("beta", "beta_out")}

    def __init__(self, config, layer_idx: int):
        super().__init__()
        n = config.num_hidden_layers
        idx = as_int(layer_idx)  # NumPy's integers and 0-d tensors too, not a bool
        if idx is None or not 0 <= idx < n:
            # it decides the parameters (the last layer has no alpha/beta) and keys the cache
            raise ValueError(f"layer_idx must be an integer in [0, {n}) (config.num_hidden_layers = {n}), "
                             f"got {layer_idx!r}")
        self.layer_idx = idx
        # an alias set on the config after OrthrosConfig.__init__ (which resolves them) would
        # otherwise fall through streams() as a window layer
        self.mode = resolve_mode(config.attention_mode, "config.attention_mode")
        self.window_size = check_positive_int("config.window_size", config.window_size)
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.backend = attn_backend_of(config)
        self.scale = 1.0 / math.sqrt(self.head_dim)
        qd, kd = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        # Qwen3.5's attention output gate: q_proj holds [query | gate] per head, and the
        # attention output is multiplied by sigmoid(gate) of its own row before W_O
        self.output_gate = bool(getattr(config, "attn_output_gate", False))
        self.q_proj = nn.Linear(config.hidden_size, qd * (2 if self.output_gate else 1), bias=config.attention_bias)
        self.k_proj = nn.Linear(config.hidden_size, kd, bias=config.attention_bias)
        self.v_proj = nn.Linear(config.hidden_size, kd, bias=config.attention_bias)
        self.o_proj = nn.Linear(qd, config.hidden_size, bias=config.o_proj_bias)
        if config.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, eps=config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None
        if bool(config.scale_offset) and self.mode == "orthros":
            # alpha', beta' (output stream) and alpha, beta (base stream), one value per query
            # channel. The last layer's base queries are never computed (nothing reads that
            # stream again), so it has no alpha/beta.
            self.alpha_out = nn.Parameter(torch.full((qd,), SCALE_OFFSET_INIT["alpha_out"]))
            self.beta_out = nn.Parameter(torch.full((qd,), SCALE_OFFSET_INIT["beta_out"]))
            if layer_idx < config.num_hidden_layers - 1:
                self.alpha = nn.Parameter(torch.full((qd,), SCALE_OFFSET_INIT["alpha"]))
                self.beta = nn.Parameter(torch.full((qd,), SCALE_OFFSET_INIT["beta"]))
        self.has_scale_offset = bool(self.scale_offset_params())
        self.q_cols = self.q_proj.out_features  # q_proj's columns (query, and the gates with attn_output_gate)
        self._init_fusions()

    def scale_offset_params(self):
        """The scale-offset parameters this layer has, by name."""
        return {n: getattr(self, n) for n in SCALE_OFFSET_INIT if isinstance(getattr(self, n, None), nn.Parameter)}

    def reset_scale_offset(self, only_uninitialized: bool = False):
        """alpha = alpha' = 1, beta = beta' = 0: both streams see the plain projections.
        ``only_uninitialized``: skip parameters transformers marked as loaded."""
        with torch.no_grad():
            for name, p in self.scale_offset_params().items():
                if not (only_uninitialized and getattr(p, "_is_hf_initialized", False)):
                    p.fill_(SCALE_OFFSET_INIT[name])

    # ------------------------------------------------------------ the plan
    def streams(self, step: StepInputs, final: bool) -> Streams:
        """The one place the attention mode is read: which streams this layer runs in ``step``.
        ``final``: the last layer, whose output is read only at the output positions."""
        mode = step.mode or self.mode
        if final and step.n_out == 0:  # nothing reads this layer's output: only its K/V
            return _KV_ONLY
        so = mode == "orthros" and self.has_scale_offset
        if mode == "orthros":  # the last layer's base stream is never read again
            return Streams(window=not final, full="tokens", scale_offset=so)
        if mode == "full":
            return Streams(window=False, full="out_rows" if final else "rows")
        if mode != "window":
            raise ValueError(f"StepInputs.mode must be None or one of {ATTENTION_MODES}, got {mode!r}")
        return Streams(window=True, full=None, gather=final)

    # ------------------------------------------------------------ token-wise pieces
    def stream_queries(self, x: torch.Tensor, n_base: int, rope, rope_out, scale_offset: bool = True,
                       with_gate: bool = False):
        """Queries of both streams in one pass (one projection, one q-norm, one RoPE): rows
        ``< n_base`` of ``x [B, T, d]`` are base-stream queries (alpha, beta; RoPE ``rope``
        ``[B, n_base, R]``), the remaining rows output-stream queries (alpha', beta'; RoPE
        ``rope_out``, ``[B, T - n_base or 1, R]``). ``scale_offset=False`` (or a layer without
        the parameters): the plain projection, as in a Transformer. ``with_gate``: also the
        rows' output gates (pre-sigmoid, ``None`` without ``attn_output_gate``): ``(q, gate)``."""
        if scale_offset and n_base and self.has_scale_offset and "alpha" not in self._parameters:
            raise ValueError(f"layer {self.layer_idx} is the model's last layer: it has no base stream (no alpha, "
                             f"beta); ask for its output-stream queries or scale_offset=False")
        return self._queries_of(self.q_proj(x), n_base, rope, rope_out, scale_offset, with_gate)

    def _queries_of(self, q: torch.Tensor, n_base: int, rope, rope_out, scale_offset: bool, with_gate: bool,
                    fused: bool = False):
        """:meth:`stream_queries` after the projection: ``q [B, T, q_cols]`` (q_proj's output).
        ``fused`` (the fused inference path): the scale-offset as ``addcmul`` (one kernel per
        stream; a decode pair's two rows: one), and a decode pair whose rows share one position
        (``rope_out`` is ``rope``) expands its RoPE instead of concatenating it."""
        B, T, _ = q.shape
        H, D = self.num_heads, self.head_dim
        gate = None
        if self.output_gate:
            q, gate = q.view(B, T, H, 2 * D).split(D, dim=-1)
        else:
            q = q.view(B, T, H, D)
        dtype = q.dtype  # under autocast the fp32 norm/scale-offset parameters would promote q
        if self.q_norm is not None:
            q = self.q_norm(q)
        if scale_offset and self.has_scale_offset:
            alpha2, beta2 = (self.alpha_fused, self.beta_fused) if fused else (None, None)
            if alpha2 is not None and beta2 is not None and n_base == 1 and T == 2:  # [base row, output row]
                q = torch.addcmul(beta2.view(2, H, D), q, alpha2.view(2, H, D))
            else:
                parts = []
                if n_base:
                    parts.append(_scale_offset(q[:, :n_base], self.alpha.view(H, D), self.beta.view(H, D), fused))
                if T > n_base:
                    parts.append(_scale_offset(q[:, n_base:], self.alpha_out.view(H, D), self.beta_out.view(H, D),
                                               fused))
                if parts:  # (none when x has no rows)
                    q = torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]
        if n_base == 0:
            cos, sin = rope_out
        elif n_base == T:
            cos, sin = rope
        elif fused and n_base == 1 and T == 2 and rope_out[0] is rope[0] and rope_out[1] is rope[1]:
            cos, sin = rope[0].expand(B, 2, -1), rope[1].expand(B, 2, -1)
        else:
            m = T - n_base
            cos = torch.cat([rope[0].expand(B, -1, -1), rope_out[0].expand(B, m, -1)], dim=1)
            sin = torch.cat([rope[1].expand(B, -1, -1), rope_out[1].expand(B, m, -1)], dim=1)
        q = apply_rope(q.to(dtype), cos, sin)
        return (q, gate) if with_gate else q

    def queries(self, x: torch.Tensor, rope, stream: Optional[str] = "base", with_gate: bool = False):
        """Queries ``[B, T, Hq, D]`` of one stream: ``"base"`` (alpha, beta), ``"out"`` (alpha',
        beta') or ``None`` (the plain projection, as in a Transformer). ``with_gate``: ``(q,
        gate)``, the rows' output gates for :meth:`gate_output` (``None`` without
        ``attn_output_gate``)."""
        if stream not in ("base", "out", None):
            raise ValueError(f"stream must be 'base', 'out' or None, got {stream!r}")
        return self.stream_queries(x, 0 if stream == "out" else x.shape[1], rope, rope, scale_offset=stream is not None,
                                   with_gate=with_gate)

    @staticmethod
    def gate_output(o: torch.Tensor, gate: Optional[torch.Tensor]) -> torch.Tensor:
        """The attention output ``o [B, T, Hq, D]`` times ``sigmoid(gate)`` of its own rows
        (``attn_output_gate``), before W_O; ``o`` itself without a gate."""
        return o if gate is None else o * torch.sigmoid(gate)

    def keys_values(self, x: torch.Tensor, rope):
        """K (k-norm, RoPE) and V ``[B, T, Hkv, D]`` of base tokens ``x`` (fused: one GEMM)."""
        return self._keys_values_of(*self._kv_proj(x, self.fused("qkv_fused")), rope)

    def _kv_proj(self, x: torch.Tensor, w: Optional[torch.Tensor]):
        """The raw K and V projections of ``x`` (with the fused ``w``: one GEMM over its K|V rows)."""
        if w is None:
            return self.k_proj(x), self.v_proj(x)
        return F.linear(x, w[self.q_cols:], _rows(self.qkv_bias_fused, self.q_cols, None)).split(
            self.num_kv_heads * self.head_dim, dim=-1)

    def _keys_values_of(self, k, v, rope):
        """:meth:`keys_values` after the projections (``k``, ``v``: ``[B, T, Hkv * D]``)."""
        B, T, _ = k.shape
        k = k.view(B, T, self.num_kv_heads, self.head_dim)
        v = v.view(B, T, self.num_kv_heads, self.head_dim)
        if self.k_norm is not None:
            k = self.k_norm(k).to(v.dtype)
        return apply_rope(k, *rope), v

    def _projections(self, x: torch.Tensor, step: StepInputs, q_rows: Optional[str], w: Optional[torch.Tensor],
                     norm=None):
        """The raw projections :meth:`project` needs: q_proj's output at ``q_rows`` (``"all"``
        rows of ``x``, the ``"base"`` rows, the ``"out"`` rows after them, ``"gather"``: the base
        rows at the output positions; ``None``: no queries) and the base rows' K and V.
        With the fused ``w = [W_q; W_k; W_v]``: ONE GEMM over the rows that cover both (a decode
        step's 1-2 rows always; ``norm``, the input norm, goes into it: one fused GEMV under
        ``step.gemv``); when the queries are at a few rows of a long chunk (a prefill's
        last layer), the K|V and the Q columns run separately, so no query is computed for a row
        that does not need one."""
        T = step.n_base

        def select(t):
            if q_rows == "all":
                return t
            if q_rows == "out":
                return t[:, T:]
            return t[:, :T] if q_rows == "base" else step.gather_out_rows(t[:, :T])

        one_gemm = q_rows in ("all", "base") or (q_rows is not None and T <= step.n_out)
        if norm is not None and (w is None or not one_gemm):
            x, norm = norm(x), None
        if w is None or not one_gemm:
            q = None if q_rows is None else (
                self.q_proj(select(x)) if w is None
                else F.linear(select(x), w[:self.q_cols], _rows(self.qkv_bias_fused, 0, self.q_cols)))
            return (q, *self._kv_proj(x[:, :T], w))
        y = self._qkv_rows(x, step, q_rows, w, norm)
        k, v = y[:, :T, self.q_cols:].split(self.num_kv_heads * self.head_dim, dim=-1)
        return select(y[..., :self.q_cols]), k, v

    def _qkv_rows(self, x: torch.Tensor, step: StepInputs, q_rows: str, w: torch.Tensor, norm=None):
        """The fused QKV projection (``norm`` inside it) of the rows that hold both the queries at
        ``q_rows`` and the base rows' K/V: all of ``x`` for output-token queries, else its base rows."""
        return linear(x if q_rows in ("all", "out") else x[:, :step.n_base], w, self.qkv_bias_fused, norm=norm,
                      gemv=step.gemv)

    def project(self, x: torch.Tensor, step: StepInputs, final: bool, norm=None):
        """Token-wise: ``(q, q_full, k, v, gate)`` for ``x [B, n_base (+ T_out), d]``, normalised
        already, or by ``norm`` (the layer's input norm, applied here: inside the QKV GEMV when
        fused): window queries of the base rows (or ``None``), full-stream queries (or
        ``None``), the base rows' K/V and the output gates (or ``None``). When the step's cache
        runs the q/k prologue in its kernel (:meth:`_qkv_in_kernel`): :class:`RawQKV`, the
        fused projection's rows only."""
        s = self.streams(step, final)
        T = step.n_base
        if s.full == "tokens":  # output tokens (alpha', beta'), with the base rows' queries in one pass
            q_rows = "all" if s.window else "out"
        elif s.full == "out_rows":
            q_rows = "gather"
        else:
            q_rows = "base" if s.window or s.full == "rows" else None
        w = self.fused("qkv_fused")
        fused = w is not None
        if fused and q_rows is not None and self._qkv_in_kernel(step):
            y = self._qkv_rows(x, step, q_rows, w, norm)
            row = 1 if q_rows == "out" else 0  # "out": the output token's row; else the one base row
            return RawQKV(y, (row, 1 if q_rows == "all" else row), s.window, s.full is not None)
        qraw, kraw, vraw = self._projections(x, step, q_rows, w, norm)
        k, v = self._keys_values_of(kraw, vraw, step.rope_base)
        q = q_full = gate = None
        if s.full == "tokens":
            qq, gate = self._queries_of(qraw, T if s.window else 0, step.rope_base, step.rope_out, s.scale_offset,
                                        True, fused)
            q, q_full = (qq[:, :T], qq[:, T:] if step.n_out else None) if s.window else (None, qq)
        elif s.full == "out_rows":
            q_full, gate = self._queries_of(qraw, 0, None, step.rope_out, False, True, fused)
        elif q_rows is not None:
            qq, gate = self._queries_of(qraw, T, step.rope_base, None, s.scale_offset, True, fused)
            q = qq if s.window else None
            q_full = qq if s.full == "rows" else None
        # the output gates of exactly the rows `output` returns (None without attn_output_gate)
        return q, q_full, k, v, (gate if self.output_gate else None)

    def _qkv_in_kernel(self, step: StepInputs) -> bool:
        """Whether this step hands :class:`RawQKV` to the cache (static: shapes and flags): the
        cache runs the prologue in its kernel (``qkv_kernel``), one base row per batch row (a
        decode step) at the output row's position (one RoPE table), no output gate, RoPE over
        the whole head."""
        return (getattr(step.cache, "qkv_kernel", False) and step.n_base == 1 and step.rope_out is step.rope_base
                and not self.output_gate and step.rope_base[0].shape[-1] == self.head_dim)

    def _attend_raw(self, p: RawQKV, step: StepInputs, final: bool):
        """:meth:`attend` of :class:`RawQKV`: the cache's ``attend_qkv`` with this layer's prologue
        parameters (q/k norm weights, each stream's alpha/beta, the step's RoPE)."""
        so = (None,) * 4
        if self.streams(step, final).scale_offset:
            out = (self.alpha_out, self.beta_out)
            so = ((self.alpha, self.beta) if p.window else out) + out
        norm = self.q_norm
        return step.cache.attend_qkv(
            self.layer_idx, p.qkv, num_heads=self.num_heads, q_rows=p.q_rows, keep=(p.window, p.full),
            rope=step.rope_base, window_size=self.window_size, scale=self.scale,
            q_norm=None if norm is None else norm.weight, k_norm=None if norm is None else self.k_norm.weight,
            eps=1e-6 if norm is None else norm.eps, scale_offset=so, backend=self.backend), None

    def attend(self, p, step: StepInputs, final: bool):
        """The cache's update and the attention kernels (never compiled): ``(o, gate)``, ``o`` the
        streams' rows ``W_O`` reads (window rows, then full-stream rows: the cache's
        ``attend`` protocol, :mod:`.step`), or ``None`` when nothing reads this layer's output."""
        if isinstance(p, RawQKV):
            return self._attend_raw(p, step, final)
        q, q_full, k, v, gate = p
        k, v = step.cache.update(self.layer_idx, k, v)
        if q is None and q_full is None:
            return None
        o = step.cache.attend(q, q_full, k, v, step, every=self.streams(step, final).full == "rows",
                              window_size=self.window_size, scale=self.scale, backend=self.backend)
        return o, gate

    def output(self, o, step: StepInputs, final: bool, residual=None, out_norm=None):
        """Token-wise: ``W_O`` of the streams' outputs, for the rows the layer keeps (every row of
        ``h``; the last layer: the output rows), plus ``residual`` (those rows of ``h``; one
        fused GEMV under ``step.gemv``). ``None`` when ``attend`` returned ``None``. With
        ``out_norm`` (an RMSNorm): ``(a, out_norm(a) or None)``, see
        :func:`orthros.layers.common.linear`."""
        if o is None:
            return None
        o, gate = o
        if self.streams(step, final).gather:  # the window stream only: its rows at the output positions
            o = step.gather_out_rows(o)
            gate = step.gather_out_rows(gate) if gate is not None else None
        o = self.gate_output(o, gate)
        if step.gemv is not None:
            return linear(o.flatten(2), self.o_proj.weight, self.o_proj.bias, residual=residual, gemv=step.gemv,
                          out_norm=out_norm)
        a = self.o_proj(o.flatten(2))
        a = a if residual is None else residual + a
        return (a, None) if out_norm is not None else a

    def forward(self, x: torch.Tensor, step: StepInputs, final: bool = False):
        """The whole attention block of one step (outside the decoder layer: tests, tools)."""
        step.check_rows(x, rope=True)
        return self.output(self.attend(self.project(x, step, final), step, final), step, final)


def _rows(t: Optional[torch.Tensor], start: int, end: Optional[int]) -> Optional[torch.Tensor]:
    """Rows ``start:end`` of a fused weight or bias (``None`` stays ``None``)."""
    return None if t is None else t[start:end]


def _scale_offset(q: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor, fused: bool) -> torch.Tensor:
    """``alpha * q + beta``: one ``addcmul`` on the fused path, the two ops of training otherwise."""
    return torch.addcmul(beta, q, alpha) if fused else q * alpha + beta

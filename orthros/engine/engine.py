"""A small, fast inference engine for Orthros models (in the spirit of gpt-fast).

It reuses an :class:`~orthros.models.OrthrosForCausalLM`'s modules and weights (embeddings,
norms, projections, MLPs, rotary, LM head) and the attention ops, but runs its own forward
against a :class:`~orthros.engine.cache.StaticKVCache`:

* **prefill** does only what Orthros needs: the base stream over the prompt (window attention,
  K/V into the cache), the output stream for the *last* prompt token only, and in the last
  layer only the base stream's K/V (its attention output and MLP are never read). Prompts are
  processed in chunks of ``prefill_chunk`` tokens, so activation memory is bounded by the
  chunk, not the prompt: a chunk's window queries need only the last ``w - 1`` cached keys.
* **decode** processes the token pair of paper Section 3.1 (base token: window attention +
  K/V; output token: full attention over the cache) with static shapes, so one step per batch
  size is captured in a CUDA graph and replayed. Rows may hold different lengths.
* **multi-turn**: a continuation appends the new turn to the cache and runs only the new
  tokens (plus the last generated token, whose K/V was not written yet).

``attention_mode`` (default: the model's ``config.attention_mode``) selects ``"orthros"``, or
``"full"`` (a standard causal Transformer of the same architecture, same engine) and
``"window"``.

Every forward runs the model's own layer step (``OrthrosModel.run_layers``): the engine only
builds the step's inputs and binds its static cache to the chunk or decode step
(:mod:`orthros.engine.cache`). With ``compile=True`` the step's token-wise pieces go through
``torch.compile``. With ``fuse=True`` (default) the model's layers run fused projections (one
GEMM for Q/K/V, one for gate/up: ``FusedProjections`` in :mod:`orthros.layers.common`).
"""

from __future__ import annotations

import numbers
import os
import warnings
import weakref
from typing import Callable, Iterator, List, Optional, Sequence

import torch

from ..layers import StepInputs
from ..kinds import has_output_stream, resolve_mode
from ..layers.common import linear
from ..layers.step import append_output_tokens, call as _eager
from ..utils import as_int, check_positive_int, check_token_ids, first_id_outside
from ..ops.gemv import GEMV_BACKENDS
from .cache import StaticKVCache, linear_layers
from .sampling import SamplingParams, sample

DEFAULT_PREFILL_CHUNK = 16384
DEFAULT_MAX_SEQ_LEN = 4096  # cache slots a row by default (fewer for a model with fewer positions)
MIN_SPAN = 512  # smallest cache span a decode graph is captured for


# How a request's length error names the settings it can change: the engine's arguments here,
# a front end's own (the CLI: ``--max-seq-len``, :meth:`RequestTooLong.phrased`)
ENGINE_NAMES = {"max_seq_len": "max_seq_len={}", "max_new_tokens": "max_new_tokens",
                "more_slots": "build the engine with a larger max_seq_len"}


class RequestTooLong(ValueError):
    """:func:`check_fits`' error: a request that does not fit the model's positions or the cache.
    It keeps what it measured, so a front end can say it in its own option names
    (:meth:`phrased`) instead of the engine's argument names."""

    def __init__(self, n_cached: int, n_new: int, max_new_tokens: int, *, max_seq_len: int, max_positions: int,
                 where: str, names: Optional[dict] = None):
        self.n_cached, self.n_new, self.max_new_tokens = n_cached, n_new, max_new_tokens
        self.max_seq_len, self.max_positions, self.where = max_seq_len, max_positions, where
        self.need = n_cached + n_new + max_new_tokens - 1
        super().__init__(self.phrased(names))

    def phrased(self, names: Optional[dict] = None, where: Optional[str] = None) -> str:
        """The message with ``names`` (keys of :data:`ENGINE_NAMES`; ``max_seq_len`` formats the
        value, ``more_slots`` may name ``{max_positions}``) for the settings and ``where`` (default:
        the request's row or place) for the request."""
        n = {**ENGINE_NAMES, **(names or {})}
        def tokens(k, what):
            return f"{k} {what}token{'s' if k != 1 else ''}"
        held = f"{tokens(self.n_cached, '')} so far + {self.n_new} of the new turn" if self.n_cached else \
            tokens(self.n_new, "prompt ")
        what = f"{where or self.where}: {held} + {tokens(self.max_new_tokens, 'new ')}"
        if self.need > self.max_positions:
            return (f"{what} need positions 0..{self.need - 1}, beyond the model's max_position_embeddings="
                    f"{self.max_positions}; shorten the prompt or lower {n['max_new_tokens']}")
        return (f"{what} need {self.need} cache slots > {n['max_seq_len'].format(self.max_seq_len)}; shorten the "
                f"prompt, lower {n['max_new_tokens']} or {n['more_slots'].format(max_positions=self.max_positions)}")


def check_max_seq_len(max_seq_len: int, max_positions: Optional[int], names: Optional[dict] = None) -> None:
    """A cache of ``max_seq_len`` slots a row must not outgrow the model's positions
    (``config.max_position_embeddings``: ``max_positions``, None for no limit): a decode step would
    run past them without a word. A ``ValueError`` naming the setting by ``names`` (keys of
    :data:`ENGINE_NAMES`: the engine's argument by default, a front end's option) and the limit."""
    if max_positions is not None and max_seq_len > max_positions:
        n = {**ENGINE_NAMES, **(names or {})}
        raise ValueError(f"{n['max_seq_len'].format(max_seq_len)} exceeds the model's max_position_embeddings="
                         f"{max_positions} (positions it was not built for)")


def check_fits(n_cached: int, n_new: int, max_new_tokens: int, *, max_seq_len: int, max_positions: int,
               row: int = 0, where: Optional[str] = None, names: Optional[dict] = None) -> None:
    """The length check of one row of a request: ``n_cached`` tokens of the conversation so far
    (in the cache, or its last token pending), ``n_new`` new prompt tokens, ``max_new_tokens`` to generate (the last is never fed back) must fit the
    model's positions and the cache's slots. A :class:`RequestTooLong` (a ``ValueError``) names
    what does not fit, the settings by ``names`` (default :data:`ENGINE_NAMES`) and the row by
    ``where`` (e.g. a file and line), else ``row {row}``."""
    need = n_cached + n_new + max_new_tokens - 1
    if need > max_positions or need > max_seq_len:
        raise RequestTooLong(n_cached, n_new, max_new_tokens, max_seq_len=max_seq_len, max_positions=max_positions,
                             where=where or f"row {row}", names=names)


class Engine:
    """Static-cache generation for one model.

    ``cache_class`` (a class attribute) is the static cache the engine allocates; a subclass
    may bring its own (the benchmarks' no-attention floor does).

    Args:
        model: an ``OrthrosForCausalLM`` (any dtype/device; the engine runs where it lives).
        max_batch_size: rows of the static cache (the largest batch :meth:`generate` takes).
        max_seq_len: tokens per row of the static cache (prompt + generated, all turns); at most the
            model's ``config.max_position_embeddings`` (more is refused: positions it was not built
            for). Default: ``min(4096, max_position_embeddings)``.
        prefill_chunk: prompt tokens per prefill chunk (``None``: the whole prompt at once).
        cuda_graphs: capture decode steps in CUDA graphs (default: on CUDA devices).
        graph_batch_sizes: batch sizes that get a graph (default ``1..max_batch_size``); another
            batch size runs the same step eagerly (documented fallback, with a warning).
        attention_mode: ``"orthros"`` / ``"full"`` / ``"window"`` (or an alias: ``"transformer"``,
            ``"swa"``); default: the model config's.
        compile: run the token-wise parts of every layer (norms, projections, q/k norm,
            scale-offset, RoPE, residuals, MLP) through ``torch.compile``, so the elementwise
            work is fused instead of launched op by op. The pieces take the layer as an
            argument and are compiled once for all layers (regional compilation); a decode
            step's cache write runs inside the first piece (fused with K's RoPE), prefill's
            cache writes and the attention kernels stay outside. Costs a compile on first use
            of each shape. Default off.
        gemv: decode steps run each layer's four projections as weight-streaming GEMVs
            (:mod:`orthros.ops.gemv`) with their neighbours fused in: the input norm into QKV,
            the residual into the o-projection, the post-attention norm into gate/up, SiLU x up
            and the residual into down (~4 fewer kernels a layer). ``True``: the ``"auto"``
            backend (the Triton kernel on CUDA for <= 8 rows, else the same ops unfused); a
            backend name forces one (tests); ``False``: the ops one by one. Needs ``fuse``.
            Default (``None``): on for a CUDA model with ``fuse``, else off (measured faster on
            an H200 at B = 1 to 8, every context: docs/engine.md).
        fuse: run every layer's projections of one input as one GEMM (``[W_q; W_k; W_v]``,
            ``[W_gate; W_up]``, a GDN layer's four input projections) and a decode pair's
            scale-offset as one ``addcmul``; the RoPE tables are cast to the model dtype once
            per step instead of in every layer. Fusing re-points the model's parameters at views
            of one buffer per group (:meth:`~orthros.layers.FusedProjections.fuse_projections`):
            no memory is added, the state dict and ``save_pretrained`` are unchanged, and the
            model's own forward takes the fused path too whenever autograd is off (training
            never does). ``fuse=False`` un-fuses a model an earlier engine fused (the
            comparison case); an engine finds at its next request that its model changed and
            applies its own setting again (dropping its CUDA graphs). Default on.
        qkv_kernel: decode steps hand each attention layer's raw QKV projection to one kernel
            that applies the q/k norms, the queries' scale-offset and RoPE, writes the token's
            K/V into the cache and attends (:func:`orthros.ops.decode.orthros_decode_qkv_attention`):
            the elementwise kernel and the cache write of the token-wise piece are gone, and
            behind a GEMV that launches it early (PDL) the attention kernel loads its parameters
            and first cached keys while that GEMV still runs. A layer it cannot take (an output
            gate, partial RoPE) keeps the separate path. Default (``None``):
            :data:`DECODE_QKV_KERNEL` for a CUDA model with ``fuse``, else off; ``True`` on the
            CPU runs the same plumbing with the op's reference (docs/engine.md).
    """

    cache_class = StaticKVCache

    def __init__(self, model, *, max_batch_size: int = 1, max_seq_len: Optional[int] = None,
                 prefill_chunk: Optional[int] = DEFAULT_PREFILL_CHUNK, cuda_graphs: Optional[bool] = None,
                 graph_batch_sizes: Optional[Sequence[int]] = None, attention_mode: Optional[str] = None,
                 compile: bool = False, fuse: bool = True, gemv=None, qkv_kernel: Optional[bool] = None):
        # as Python ints: a NumPy integer (or another integer with __index__) is taken, a bool or float refused
        max_batch_size = check_positive_int("max_batch_size", max_batch_size)
        max_seq_len = check_positive_int("max_seq_len", max_seq_len, allow_none=True)
        prefill_chunk = check_positive_int("prefill_chunk", prefill_chunk, allow_none=True)
        if not isinstance(compile, bool):
            raise ValueError(f"compile must be True or False, got {compile!r}")
        if not isinstance(fuse, bool):
            raise ValueError(f"fuse must be True or False, got {fuse!r}")
        if gemv is not None and gemv is not False and gemv is not True and gemv not in GEMV_BACKENDS:
            raise ValueError(f"gemv must be None, True, False or a GEMV backend {GEMV_BACKENDS}, got {gemv!r}")
        if gemv is not None and gemv is not False and not fuse:
            raise ValueError("gemv needs fuse=True: the fused GEMVs run over the fused QKV and gate/up weights")
        if qkv_kernel not in (None, True, False):
            raise ValueError(f"qkv_kernel must be None, True or False, got {qkv_kernel!r}")
        if cuda_graphs not in (None, True, False):
            raise ValueError(f"cuda_graphs must be None, True or False, got {cuda_graphs!r}")
        if qkv_kernel and not fuse:
            raise ValueError("qkv_kernel needs fuse=True: the kernel reads the fused QKV projection's output")
        if not hasattr(model, "model") or not hasattr(model.model, "run_layers") or not hasattr(model, "lm_head"):
            raise TypeError(f"model must be an OrthrosForCausalLM, got {type(model).__name__}")
        cfg = model.config
        _check_layer_config(model)
        mode = resolve_mode(cfg.attention_mode if attention_mode is None else attention_mode)
        limit = getattr(cfg, "max_position_embeddings", None)
        if max_seq_len is None:
            max_seq_len = DEFAULT_MAX_SEQ_LEN if limit is None else min(DEFAULT_MAX_SEQ_LEN, limit)
        check_max_seq_len(max_seq_len, limit)
        self.model = model
        self.config = cfg
        self.mode = mode
        self.output_tokens = has_output_stream(mode)
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.num_layers = cfg.num_hidden_layers
        self.Hq, self.Hkv, self.D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.window = cfg.window_size
        self.max_batch_size, self.max_seq_len = max_batch_size, max_seq_len
        self.prefill_chunk = prefill_chunk
        if cuda_graphs is None:
            cuda_graphs = self.device.type == "cuda"
        if cuda_graphs and self.device.type != "cuda":
            raise ValueError("cuda_graphs=True needs the model on a CUDA device")
        self.cuda_graphs = bool(cuda_graphs)
        if graph_batch_sizes is not None and (isinstance(graph_batch_sizes, (str, bytes))
                                              or not hasattr(graph_batch_sizes, "__iter__")):
            raise TypeError(f"graph_batch_sizes must be None or a sequence of integers in [1, max_batch_size="
                            f"{max_batch_size}], got {graph_batch_sizes!r}")
        sizes = range(1, max_batch_size + 1) if graph_batch_sizes is None else list(graph_batch_sizes)
        ints = [as_int(s) for s in sizes]  # NumPy's integers and 0-d tensors too, not a bool
        if any(s is None or not 1 <= s <= max_batch_size for s in ints):
            raise ValueError(f"graph_batch_sizes must hold integers in [1, max_batch_size={max_batch_size}], "
                             f"got {list(sizes)!r}")
        self.graph_batch_sizes = tuple(sorted(set(ints)))
        model.eval()  # the arguments checked: the engine runs the model in eval mode
        self.cache = self.cache_class(self.num_layers, max_batch_size, max_seq_len, self.Hkv, self.D,
                                      dtype=self.dtype, device=self.device, linear=linear_layers(model))
        self._graphs = {}
        self._pool = None
        self._tok_buf = torch.zeros(max_batch_size, dtype=torch.long, device=self.device)
        self._arange = torch.arange(max_batch_size, device=self.device)
        self._last_row = torch.zeros(1, 1, dtype=torch.long, device=self.device)  # a decode step's output row
        self._no_rows = torch.zeros(1, 0, dtype=torch.long, device=self.device)  # a chunk that predicts nothing
        self.fuse = fuse
        self._apply_fuse()
        if gemv is None:  # the default: the fused GEMVs where their kernel runs (CUDA, fused weights)
            gemv = fuse and self.device.type == "cuda"
        self.gemv = "auto" if gemv is True else (gemv or None)
        if qkv_kernel is None:
            qkv_kernel = DECODE_QKV_KERNEL and fuse and self.device.type == "cuda"
        self.qkv_kernel = bool(qkv_kernel)
        attn = [layer.self_attn for layer in model.model.layers if hasattr(layer, "self_attn")]
        same = all(a.q_proj.weight.dtype == a.v_proj.weight.dtype == self.dtype for a in attn)
        self._rope_dtype = self.dtype if same else None
        # every cache position's RoPE rows, once: prefill slices them, a decode step gathers its
        # rows in one launch where computing them took nine (docs/performance.md, inference change 27)
        cos, sin = self._rope(torch.arange(max_seq_len, device=self.device).view(1, -1))
        self._rope_table = (cos[0], sin[0])
        self.compile = compile
        if compile:  # one graph per distinct static case (batch 1 vs more, pair vs single token,
            # chunk lengths: dynamic after the second); the default limit of 8 is too low for that
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        self._run = _run_compiled if compile else _eager
        self._run_decode = _decode_runner(DECODE_COMPILE_OPTIONS) if compile else _eager
        self._head = _compiled(_lm_head) if compile else _lm_head
        self._sig = self._signature()
        self._open_stream = None  # a weak reference to the generator of the latest stream()
        self.reset()

    def _apply_fuse(self):
        """Fuse (``self.fuse``) or un-fuse every layer module of the model that can
        (``fuse_projections``: attention, MLP, GDN; a remote-code model's own copies too)."""
        for mod in self.model.modules():
            if hasattr(mod, "fuse_projections") and hasattr(mod, "unfuse_projections"):
                mod.fuse_projections() if self.fuse else mod.unfuse_projections()

    def _check_model(self):
        """At a request's start: if the model's parameters moved since this engine last ran it
        (another engine fused or un-fused them, ``.to()``), apply this engine's fuse setting
        again and drop the CUDA graphs captured against the old addresses. A model moved to
        another dtype or device is refused: the cache and the RoPE table are the engine's own."""
        _check_layer_config(self.model)
        p = next(self.model.parameters())
        if (p.dtype, p.device) != (self.dtype, self.device):
            raise ValueError(f"the model is now {p.dtype} on {p.device}, but this engine was built for it in "
                             f"{self.dtype} on {self.device} (its cache and RoPE table are): build a new Engine")
        if self._signature() != self._sig:
            self._apply_fuse()
            self.drop_graphs()
            self._sig = self._signature()

    def drop_graphs(self):
        """Forget the captured CUDA graphs: the next decode step of each shape captures again. For
        a change a graph cannot see, e.g. a GEMV launch config a benchmark installs for one shape
        (:func:`orthros.ops.gemv.kernel.configs_overridden`)."""
        if self._graphs:
            torch.cuda.synchronize(self.device)
            self._graphs = {}

    def _signature(self):
        # captured CUDA graphs hold the parameters' addresses and the attention backends of
        # their capture
        return (tuple(p.data_ptr() for p in self.model.parameters()),
                tuple(getattr(layer.mixer, "backend", None) for layer in self.model.model.layers))

    def serves(self, model, batch_size: int, seq_len: int) -> bool:
        """Whether this engine can run ``batch_size`` rows of ``seq_len`` tokens for ``model`` as
        it is now (same parameters in place, same attention backends: its graphs stay valid)."""
        return (model is self.model and self._signature() == self._sig
                and batch_size <= self.max_batch_size and seq_len <= self.max_seq_len)

    # ------------------------------------------------------------------ state
    def reset(self):
        """Forget every conversation (the cache memory stays allocated)."""
        self._end_open_stream()
        self.cache.seqlens.zero_()
        self._lens: List[int] = []  # committed tokens per active row (host copy)
        self._pending: List[Optional[int]] = []  # last sampled token per row, not yet in the cache

    def _end_open_stream(self):
        """Every request (and :meth:`reset`) starts here: a stream of an earlier request that was
        not run to its end is closed, as ``close()`` would (its tokens so far stay in the
        conversation), so that it can neither write the cache of this request later nor set the
        conversation's lengths when it is garbage-collected."""
        gen = self._open_stream() if self._open_stream is not None else None
        self._open_stream = None
        if gen is not None:
            gen.close()

    @property
    def batch_size(self) -> int:
        """Rows of the current conversation (0 after :meth:`reset`)."""
        return len(self._lens)

    def lengths(self) -> List[int]:
        """Tokens held in the cache per row of the current conversation."""
        return list(self._lens)

    def _sync_lengths(self):
        b = len(self._lens)
        if b:
            self.cache.seqlens[:b].copy_(torch.tensor(self._lens, dtype=torch.long), non_blocking=False)

    # ------------------------------------------------------------- validation
    def _as_rows(self, prompts) -> List[List[int]]:
        flat = False  # one list of ids (one row), not a list of rows
        if _is_array(prompts):  # a NumPy array (a tokenizer's return_tensors="np"): as a tensor
            try:
                prompts = torch.as_tensor(prompts)
            except (TypeError, ValueError, RuntimeError):
                raise TypeError(f"prompts as an array must be an integer [B, T] array, got dtype "
                                f"{getattr(prompts, 'dtype', '?')} {tuple(getattr(prompts, 'shape', ()))}") from None
        if isinstance(prompts, torch.Tensor):
            if prompts.dim() == 1:
                prompts, flat = prompts.view(1, -1), True
            if (prompts.dim() != 2 or prompts.dtype.is_floating_point or prompts.dtype.is_complex
                    or prompts.dtype == torch.bool):
                raise ValueError(f"prompts as a tensor (or array) must be an integer [B, T] tensor, got {prompts.dtype} "
                                 f"{tuple(prompts.shape)}")
            if prompts.numel() == 0 and flat:
                raise ValueError(f"prompts is empty: {_PROMPTS_ALLOWED}")
            if prompts.shape[0] == 0:
                raise ValueError(f"prompts has no row (shape {tuple(prompts.shape)}): {_PROMPTS_ALLOWED}")
            V = self.config.vocab_size
            bad = first_id_outside(prompts, V)  # (uint16 / 32 / 64 ids too: a token file's)
            if bad is not None:
                (i, j), value = bad
                raise ValueError(f"prompts has token ids outside the vocabulary [0, vocab_size={V}): "
                                 f"prompts[{f'{j}' if flat else f'{i}, {j}'}] = {value}")  # as the caller indexes it
            return list(prompts.long())  # rows stay tensors: no host round trip for long prompts
        elif isinstance(prompts, (list, tuple)) and prompts and not any(  # a 0-d tensor / array is one id
                isinstance(t, (list, tuple)) or (isinstance(t, torch.Tensor) or _is_array(t)) and t.ndim
                for t in prompts):
            rows = [_token_ids(prompts, "prompts")]  # one row: a bool or float in it is named (prompts[1] = 2.5)
            flat = True
        elif isinstance(prompts, (list, tuple)):
            for i, r in enumerate(prompts):
                if not (isinstance(r, (list, tuple)) or (isinstance(r, torch.Tensor) or _is_array(r)) and r.ndim == 1):
                    raise TypeError(f"prompts must be one list of token ids or a list of rows (lists or 1-D "
                                    f"tensors or arrays of token ids), got prompts[{i}] = {r!r}")
            rows = [_token_ids(r.tolist() if isinstance(r, torch.Tensor) or _is_array(r) else r, f"prompts[{i}]")
                    for i, r in enumerate(prompts)]
        else:
            raise TypeError(f"prompts must be a list of token-id lists or an integer tensor, got {type(prompts).__name__}")
        if not rows:
            raise ValueError(f"prompts is empty: {_PROMPTS_ALLOWED}")
        V = self.config.vocab_size
        for i, r in enumerate(rows):
            if r and (min(r) < 0 or max(r) >= V):
                j = next(j for j, t in enumerate(r) if not 0 <= t < V)
                where = f"prompts[{j}]" if flat else f"prompts[{i}][{j}]"  # as the caller indexes it
                raise ValueError(f"{'prompts' if flat else f'prompts[{i}]'} has token ids outside the vocabulary "
                                 f"[0, vocab_size={V}): {where} = {r[j]}")
        return rows

    def _plan(self, prompts, continue_: bool, max_new_tokens: int):
        """Validate and return (new tokens per row incl. pending, past length per row)."""
        self._end_open_stream()
        if not isinstance(continue_, bool):
            raise TypeError(f"continue_ must be True or False, got {continue_!r}")
        self._check_model()
        rows = self._as_rows(prompts)
        b = len(rows)
        if b > self.max_batch_size:
            raise ValueError(f"batch of {b} prompts exceeds max_batch_size={self.max_batch_size} of this engine")
        if continue_:
            if not self._lens:
                raise ValueError("continue_=True needs an earlier generate() on this engine (the cache is empty)")
            if b != len(self._lens):
                raise ValueError(f"a continuation needs one new turn per row of the conversation "
                                 f"({len(self._lens)}), got {b}")
            past = list(self._lens)
            rows = [([p] if p is not None else []) + (r.tolist() if isinstance(r, torch.Tensor) else r)
                    for p, r in zip(self._pending, rows)]
        else:
            past = [0] * b
        for i, r in enumerate(rows):
            if len(r) == 0:
                raise ValueError(f"prompts[{i}] is empty: {_PROMPTS_ALLOWED}")
            so_far = past[i] + (continue_ and self._pending[i] is not None)  # a pending token is the conversation's
            check_fits(so_far, past[i] + len(r) - so_far, max_new_tokens, max_seq_len=self.max_seq_len,
                       max_positions=self.config.max_position_embeddings, row=i)
        return rows, past

    # ---------------------------------------------------------------- prefill
    @torch.no_grad()
    def prefill(self, prompts, *, continue_: bool = False) -> torch.Tensor:
        """Run the prompts (or, with ``continue_``, the new turns) into the cache; return the
        next-token logits ``[B, V]`` (float32) of each row's last token."""
        rows, past = self._plan(prompts, continue_, 1)
        return self._prefill(rows, past)

    def _prefill(self, rows, past) -> torch.Tensor:
        b = len(rows)
        # the chunks overwrite the earlier conversation (or, continuing it, advance its GDN states):
        # a prefill cut short (an interrupt, an error) leaves no conversation to continue
        self._lens, self._pending = [], []
        logits = [None] * b
        i = 0
        while i < b:  # contiguous runs of rows with equal (past, new) lengths share one batched forward
            j = i + 1
            while j < b and past[j] == past[i] and len(rows[j]) == len(rows[i]):
                j += 1
            if isinstance(rows[i], torch.Tensor):
                ids = torch.stack(rows[i:j]).to(self.device)
            else:
                ids = torch.tensor(rows[i:j], dtype=torch.long, device=self.device)
            out = self._prefill_rows(i, j, ids, past[i])
            for r in range(i, j):
                logits[r] = out[r - i]
            i = j
        self._lens = [p + len(r) for p, r in zip(past, rows)]
        self._pending = [None] * b
        self._sync_lengths()
        return torch.stack(logits).float()

    def _prefill_rows(self, r0: int, r1: int, ids: torch.Tensor, P: int) -> torch.Tensor:
        T = ids.shape[1]
        C = self.prefill_chunk or T
        out = None
        for s in range(0, T, C):
            e = min(T, s + C)
            out = self._forward_chunk(r0, r1, ids[:, s:e], P + s, final_chunk=(e == T))
        return out

    def _forward_chunk(self, r0, r1, ids, P, final_chunk):
        m = self.model.model
        b, T = ids.shape
        rope = tuple(t[P:P + T][None] for t in self._rope_table)  # [1, T, R] views of the engine's table
        # the engine's output position is always the chunk's last token (the prompt's, in the
        # final chunk): the cache views rely on it
        out_rel = torch.full((1, 1), T - 1, dtype=torch.long, device=self.device) if final_chunk else self._no_rows
        step = StepInputs(n_base=T, rope_base=rope, rope_out=(rope[0][:, -1:], rope[1][:, -1:]), out_rel=out_rel,
                          output_tokens=self.output_tokens, mode=self.mode, run=self._run,
                          cache=self.cache.prefill_view(r0, r1, P, T, self.window))
        h = m.run_layers(step.with_output_tokens(m.embed_tokens(ids)), step)
        return self._head(self.model, h[:, -1:]) if final_chunk else None

    # ----------------------------------------------------------------- decode
    def _rope(self, pos: torch.Tensor):
        """RoPE rows at positions ``pos`` (what ``_rope_table`` holds for every cache position);
        fused: in the dtype of every attention layer's q and k (the model's, when all agree), the
        cast each layer's ``apply_rope`` would make, once (the same values)."""
        cos, sin = self.model.model.rotary_emb(pos)
        dt = self._rope_dtype if self.fuse else None
        return (cos.to(dt), sin.to(dt)) if dt is not None else (cos, sin)

    def _span(self, need: int) -> int:
        """Cache slots a decode step reads: the smallest power of two >= ``need`` (at least
        MIN_SPAN, at most max_seq_len). The decode kernel sizes its key splits from the cache
        shape, so a step over a short context must not see the whole ``max_seq_len``."""
        span = MIN_SPAN
        while span < need:
            span *= 2
        return min(span, self.max_seq_len)

    def _decode_step(self, tokens: torch.Tensor, lens: torch.Tensor, span: int) -> torch.Tensor:
        """One static-shape step for rows ``0..bs-1`` over cache slots ``[0, span)``: writes the
        tokens' K/V at ``lens``, advances ``lens`` in place, returns next-token logits ``[bs, V]``
        (float32). Needs ``lens + 1 <= span``."""
        bs = tokens.shape[0]
        # the decoupled pair of paper Section 3.1: [base token, output token] per row
        h, rope = self._run_decode(_decode_inputs, self.model, tokens.view(bs, 1), *self._rope_table, lens.view(bs, 1),
                                   self._last_row, self.output_tokens)
        step = StepInputs(n_base=1, rope_base=rope, rope_out=rope, out_rel=self._last_row,
                          output_tokens=self.output_tokens, mode=self.mode, run=self._run_decode, gemv=self.gemv,
                          cache=self.cache.decode_view(self._arange[:bs], lens, span, self.qkv_kernel))
        h = self.model.model.run_layers(h, step)
        logits = self._head(self.model, h[:, -1:], self.gemv if DECODE_HEAD_GEMV else None)
        lens.add_(1)
        return logits

    def _step_fn(self, bs: int, need: int) -> Callable[[], torch.Tensor]:
        """A no-argument callable running one decode step of rows ``0..bs-1`` (reading the
        token buffer) whose longest row will hold ``need`` tokens after the step, through a
        CUDA graph when one is (or can be) captured for ``bs`` and the step's cache span."""
        tokens, lens = self._tok_buf[:bs], self.cache.seqlens[:bs]
        span = self._span(need)
        if not self.cuda_graphs:
            return lambda: self._decode_step(tokens, lens, span)
        if bs not in self.graph_batch_sizes:
            if not getattr(self, "_warned_eager", False):
                warnings.warn(f"batch size {bs} has no captured CUDA graph (graph_batch_sizes="
                              f"{self.graph_batch_sizes}); decoding it eagerly", stacklevel=3)
                self._warned_eager = True
            return lambda: self._decode_step(tokens, lens, span)
        if (bs, span) not in self._graphs:
            try:
                self._graphs[bs, span] = self._capture(bs, span, tokens, lens)
            except Exception as e:  # documented fallback: eager decode, loudly
                warnings.warn(f"CUDA graph capture failed for batch size {bs} ({type(e).__name__}: {e}); "
                              f"decoding eagerly", stacklevel=3)
                self.cuda_graphs = False
                torch.cuda.synchronize(self.device)
                return lambda: self._decode_step(tokens, lens, span)
        graph, out = self._graphs[bs, span]

        def run():
            graph.replay()
            return out
        return run

    def _capture(self, bs, span, tokens, lens):
        # Warm-up and capture write K/V in slot span - 1, which holds no valid token: every
        # row is shorter than the step's need <= span. Then the real lengths come back.
        saved = lens.clone()
        saved_linear = self.cache.save_linear(bs)  # the GDN layers' states advance in every step
        try:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):
                    lens.fill_(span - 1)
                    self._decode_step(tokens, lens, span)
            torch.cuda.current_stream().wait_stream(stream)
            lens.fill_(span - 1)
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                out = self._decode_step(tokens, lens, span)
        finally:
            lens.copy_(saved)
            self.cache.restore_linear(bs, saved_linear)
        return graph, out

    @torch.no_grad()
    def step(self, tokens) -> torch.Tensor:
        """One decode step for the current rows: feed ``tokens [B]`` (one per row), return the
        next-token logits ``[B, V]``. Low level (benchmarks); :meth:`generate` is the API."""
        self._end_open_stream()
        if isinstance(tokens, (list, tuple)):  # torch.as_tensor would take True for token 1
            tokens = _token_ids(tokens, "tokens", "step() ")
        elif not isinstance(tokens, torch.Tensor) and not (as_int(tokens) is not None
                                                           or hasattr(tokens, "__array__")):
            raise TypeError(f"step() tokens must be a tensor or a list of integer token ids (one per row), "
                            f"got {type(tokens).__name__}")
        tokens = torch.as_tensor(tokens, device=self.device)
        check_token_ids(tokens, self.config.vocab_size, "step() tokens")
        tokens = tokens.long().view(-1)
        bs = tokens.numel()
        if not self._lens:
            raise ValueError("step() needs a conversation in the cache: call prefill(), generate() or set_lengths() first")
        if bs != len(self._lens):
            raise ValueError(f"step() needs one token per row of the conversation ({len(self._lens)}), got {bs}")
        if max(self._lens) >= self.max_seq_len:
            raise ValueError(f"the cache is full (max_seq_len={self.max_seq_len})")
        self._tok_buf[:bs].copy_(tokens)
        out = self._step_fn(bs, max(self._lens) + 1)()
        self._lens = [n + 1 for n in self._lens]
        self._pending = [None] * bs
        return out

    def set_lengths(self, lengths: Sequence[int]):
        """Declare that rows ``0..len(lengths)-1`` hold ``lengths`` tokens, whatever the cache
        holds there: rewinds a conversation to an earlier length (the tokens past it are
        forgotten), and lets benchmarks time decode at a context without prefilling it (a step
        costs the same whatever the cached values). A GDN layer's state (Orthros-H) holds no
        tokens to forget: it is not rewound, so a rewound hybrid conversation does not continue
        as it would have from that length (docs/engine.md)."""
        self._end_open_stream()
        given = lengths
        lengths = [as_int(n) for n in lengths] if hasattr(lengths, "__iter__") else None  # NumPy's, 0-d tensors too
        if not lengths or len(lengths) > self.max_batch_size or any(
                n is None or not 0 < n < self.max_seq_len for n in lengths):
            raise ValueError(f"set_lengths needs 1..{self.max_batch_size} integer lengths in [1, {self.max_seq_len}), "
                             f"got {given!r}")
        self._lens = lengths
        self._pending = [None] * len(lengths)
        self._sync_lengths()

    # ------------------------------------------------------------- generation
    @torch.no_grad()
    def stream(self, prompts, max_new_tokens: int = 128, sampling: Optional[SamplingParams] = None, *,
               eos_token_id=None, continue_: bool = False) -> Iterator[List[Optional[int]]]:
        """Generate and yield one list per step: the new token of each row (``None`` for a row
        that already produced ``eos_token_id``). The first item comes right after prefill.

        ``continue_=True`` appends ``prompts`` (one new turn per row) to the conversation in the
        cache and runs only the new tokens. A later request on the engine (or :meth:`reset`) closes
        a stream not run to its end."""
        max_new_tokens = check_positive_int("max_new_tokens", max_new_tokens)  # a NumPy integer too, as an int
        if sampling is None:
            sampling = SamplingParams()
        if not isinstance(sampling, SamplingParams):
            raise TypeError(f"sampling must be a SamplingParams, got {type(sampling).__name__}")
        eos = _eos_set(eos_token_id, self.config.vocab_size)
        rows, past = self._plan(prompts, continue_, max_new_tokens)
        gen = None
        if sampling.seed is not None and not sampling.greedy:
            gen = torch.Generator(device=self.device).manual_seed(sampling.seed)
        stream = self._stream(rows, past, max_new_tokens, sampling, gen, eos)
        self._open_stream = weakref.ref(stream)
        return stream

    @torch.no_grad()  # wraps every resumption of the generator, not just its creation
    def _stream(self, rows, past, max_new_tokens, sampling, gen, eos):
        b = len(rows)
        logits = self._prefill(rows, past)
        tok = sample(logits, sampling, gen)
        n_gen = [0] * b
        last = [None] * b
        done = [False] * b
        cuda = self.device.type == "cuda"
        host = [torch.empty(b, dtype=torch.long, pin_memory=cuda) for _ in range(2)]
        events = [torch.cuda.Event() if cuda else None for _ in range(2)]

        def to_host(t, slot):
            host[slot].copy_(t, non_blocking=cuda)
            if cuda:
                events[slot].record()

        def collect(slot, fed_now):
            if cuda:
                events[slot].synchronize()
            out = []
            for r, t in enumerate(host[slot].tolist()):
                if done[r]:
                    out.append(None)
                    continue
                n_gen[r] += 1
                last[r] = t
                fed[r] = fed_now
                out.append(t)
                if t in eos:
                    done[r] = True
                    stopped.append(r)
            return out

        # The step queued ahead feeds each row's latest token before the host has read it. A row
        # whose last token a step has fed (`fed`: it stopped at EOS, or the consumer stopped, with a
        # step in flight) keeps that token in the cache instead of leaving it pending, since a GDN
        # state cannot be rewound to before it. A row stopped at EOS in a batch that goes on is fed
        # by every later step, so its GDN states are copied before the next one (`kept`: once a
        # row; nothing without GDN layers) and put back at the end.
        fed = [False] * b
        stopped, kept = [], []
        longest = max(p + len(r) for p, r in zip(past, rows))
        to_host(tok, 0)
        cut = False
        try:
            for s in range(1, max_new_tokens + 1):
                in_flight = s < max_new_tokens
                if in_flight:  # queue step s before reading token s-1 back (overlap)
                    if stopped:
                        kept.append((list(stopped), self.cache.save_linear(stopped)))
                        stopped.clear()
                    self._tok_buf[:b].copy_(tok)
                    tok = sample(self._step_fn(b, longest + s)(), sampling, gen)
                    to_host(tok, s % 2)
                out = collect((s - 1) % 2, in_flight)
                yield out
                if all(done):
                    break
        except BaseException as e:
            # a step cut short (an interrupt, an error; not a close() at a yield) may have advanced
            # GDN states by a token the lengths below do not count, and a state cannot be rewound
            cut = not isinstance(e, GeneratorExit) and self.cache.state_nbytes > 0
            raise
        finally:
            if cuda:
                torch.cuda.synchronize(self.device)
            for rows_stopped, saved in kept:
                self.cache.restore_linear(rows_stopped, saved)
            # committed: everything fed so far; a row's last token is pending (no K/V yet) unless fed
            self._lens = [] if cut else [p + len(r) + max(n - 1, 0) + f for p, r, n, f in zip(past, rows, n_gen, fed)]
            self._pending = [] if cut else [None if f else t for t, f in zip(last, fed)]
            self._sync_lengths()

    def generate(self, prompts, max_new_tokens: int = 128, sampling: Optional[SamplingParams] = None, *,
                 eos_token_id=None, continue_: bool = False,
                 callback: Optional[Callable[[List[Optional[int]]], None]] = None) -> List[List[int]]:
        """Generate up to ``max_new_tokens`` per row; return the new tokens of each row (up to and
        including ``eos_token_id``). ``callback`` gets every step's tokens (streaming)."""
        if callback is not None and not callable(callback):
            raise TypeError(f"callback must be callable or None, got {type(callback).__name__}")
        rows_out = None
        for toks in self.stream(prompts, max_new_tokens, sampling, eos_token_id=eos_token_id, continue_=continue_):
            if rows_out is None:
                rows_out = [[] for _ in toks]
            for r, t in enumerate(toks):
                if t is not None:
                    rows_out[r].append(t)
            if callback is not None:
                callback(toks)
        return rows_out


def _check_layer_config(model) -> None:
    """``model.config.window_size`` / ``layer_types`` set after the model was built: a ``ValueError``
    naming the field (:meth:`OrthrosModel.check_layer_fields`). The engine's prefill read the window
    from the config while the layers kept theirs: a chunk's window queries lost their keys before the
    chunk, giving other tokens without a word. (``attention_mode`` is the engine's own setting.)"""
    check = getattr(model.model, "check_layer_fields", None)  # (remote code saved before it has none)
    if check is not None:
        check(("window_size", "layer_types"))


_PROMPTS_ALLOWED = "give one list of token ids (a prompt) or a list of rows, each of at least one token id"


def _is_array(x) -> bool:
    """A NumPy array (or another array with ``__array__`` and ``ndim``), not a tensor or a number."""
    return not isinstance(x, (torch.Tensor, numbers.Number)) and hasattr(x, "__array__") and hasattr(x, "ndim")


def _token_ids(seq, arg: str, where: str = "") -> List[int]:
    """``seq`` (a list or tuple of integer token ids) as a list of Python ints; a ``TypeError`` naming
    ``arg`` (of ``where``, e.g. ``"step() "``) and the first element that is no integer (a bool, a
    float, a nested list, ...)."""
    ids = [as_int(t) for t in seq]  # NumPy's integers and 0-d tensors too; a bool is no token id
    for i, t in enumerate(ids):
        if t is None:
            raise TypeError(f"{where}{arg} must hold integer token ids, got {arg}[{i}] = {seq[i]!r}")
    return ids


def _eos_set(eos_token_id, vocab_size: int) -> set:
    """``eos_token_id`` (None, one id or a collection of ids, e.g. a list or 1-D tensor) as a set of
    ints in ``[0, vocab_size)``; a ``TypeError`` / ``ValueError`` naming it for anything else (an id
    the model cannot sample would never stop a row)."""
    if eos_token_id is None:
        return set()
    ids = eos_token_id.tolist() if isinstance(eos_token_id, torch.Tensor) else eos_token_id
    ids = [ids] if as_int(ids) is not None else ids
    ints = [as_int(t) for t in ids] if isinstance(ids, (list, tuple, set, frozenset)) else [None]
    if None in ints:
        raise TypeError(f"eos_token_id must be None, an integer token id or a list of them, got {eos_token_id!r}")
    if any(not 0 <= t < vocab_size for t in ints):
        raise ValueError(f"eos_token_id must hold token ids in [0, vocab_size={vocab_size}), got {eos_token_id!r}")
    return set(ints)


def _decode_inputs(model, ids, cos, sin, pos, out_rel, output_tokens: bool):
    """A decode step's first piece (compiled: one launch): the embeddings of ``ids [B, 1]`` with
    the output tokens appended (paper Algorithm 2, :func:`append_output_tokens`), and the rows
    ``pos [B, 1]`` of the RoPE tables ``cos, sin [L, R]`` (``[B, 1, R]`` each)."""
    return append_output_tokens(model.model.embed_tokens(ids), out_rel, output_tokens), (cos[pos], sin[pos])


def _lm_head(model, h, gemv=None):
    """Next-token logits ``[B, V]`` (float32) of hidden states ``h [B, 1, d]``; ``gemv`` (a
    decode step's, :data:`DECODE_HEAD_GEMV`): the final norm as the head GEMV's prologue."""
    head = model.lm_head
    return linear(h, head.weight, head.bias, norm=model.model.norm, gemv=gemv)[:, 0].float()


# With ``Engine(compile=True)`` the token-wise pieces of the layer step (``step.run(fn, ...)``)
# go through ``torch.compile``. They take the layer as an argument, so one compiled graph
# serves every layer: parameters are graph inputs, not constants (regional compilation). One
# wrapper per piece for the whole process, so every engine (and every model of the same
# structure) reuses the graphs compiled so far; attention kernels (and prefill's cache writes)
# stay outside, a decode step's cache write is inside the first piece (``DecodeView.write_slot``).
_COMPILED = {}
_FAILED = set()

# Inductor options of the decode step's pieces (prefill's use Inductor's defaults).
# ``realize_reads_threshold``: a pointwise value with several consumers is computed once into a
# buffer of its own when it reads more than this many inputs. RoPE reads each query twice (q and
# its rotated half), and a decode pair's queries read five inputs (the q projection's columns,
# q-norm's rstd and weight, alpha and beta) against the one-row step's three, so at Inductor's
# default of 4 the pair's RoPE became a pointwise kernel of its own after the q-norm kernel
# (36 launches a step, 0.036 ms at 1K on an H200: docs/performance.md, inference change 15).
# ``combo_kernels``: the queries' path (q-norm, scale-offset, RoPE) and the keys' (k-norm, RoPE,
# the cache write) read nothing of each other, so Inductor may launch them as one kernel; the 1K
# step measured 0.08 ms faster with it for the pair and the Transformer alike (H200:
# docs/performance.md, inference change 19). Triton backend only (GPU); the CPU ignores it.
DECODE_COMPILE_OPTIONS = {"realize_reads_threshold": 5, "combo_kernels": True}

# Engine(qkv_kernel=None) on CUDA: the decode step's q/k prologue and K/V write inside the
# attention kernel. Measured on an H200 (docs/performance.md, inference change 21): the pair's 1K
# step 0.03-0.06 ms faster, the Transformer's 0.00-0.05.
DECODE_QKV_KERNEL = True

# Engine(gemv=...) on: the decode step's head (final norm and lm_head) as one fused GEMV, not the
# norm kernel and cuBLAS; measured on an H200, the 1K step 0.013-0.015 ms faster for the pair
# and the Transformer (docs/performance.md, inference change 27). ORTHROS_HEAD_GEMV=0 (read at
# import) turns it off.
DECODE_HEAD_GEMV = os.environ.get("ORTHROS_HEAD_GEMV", "1") == "1"


def _compiled(fn, options=None):
    """``fn`` through ``torch.compile`` (with Inductor ``options``); a piece whose compilation
    fails runs eagerly from then on, with a warning (``RuntimeWarning`` naming the piece)."""
    key = (fn, tuple(sorted((options or {}).items())))
    if key not in _COMPILED:
        compiled = torch.compile(fn, options=dict(options)) if options else torch.compile(fn)

        def call(*args):
            if key not in _FAILED:
                try:
                    return compiled(*args)
                except torch.cuda.OutOfMemoryError:
                    raise
                except Exception as e:  # noqa: BLE001  (documented fallback: eager, loudly)
                    _FAILED.add(key)
                    warnings.warn(f"torch.compile of {fn.__name__} failed ({type(e).__name__}: {e}); "
                                  f"running it eagerly", RuntimeWarning, stacklevel=2)
            return fn(*args)
        _COMPILED[key] = call
    return _COMPILED[key]


def compile_fallbacks() -> List[str]:
    """Names of the token-wise pieces that run eagerly in this process because their
    ``torch.compile`` failed (:func:`_compiled` warned once for each). A benchmark of a compiled
    engine records them: such a step is not the compiled engine's (seen: a failing fake of a custom
    op made the decode step 1.7-2.4x slower, docs/performance.md inference change 22, call 3)."""
    return sorted({key[0].__name__ for key in _FAILED})


def _run_compiled(fn, *args):
    return _compiled(fn)(*args)


def _decode_runner(options):
    """The decode step's ``run``: its pieces compiled with ``options`` (bound when the engine is
    built, so a benchmark can compare option sets engine by engine)."""
    options = dict(options)

    def run(fn, *args):
        return _compiled(fn, options)(*args)
    return run


__all__ = ["Engine", "DEFAULT_MAX_SEQ_LEN", "DEFAULT_PREFILL_CHUNK", "RequestTooLong", "check_fits",
           "check_max_seq_len", "compile_fallbacks"]

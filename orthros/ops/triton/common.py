"""What the Triton kernels of Orthros share: host-side sizing helpers and the jit building
blocks of every kernel (visibility mask, online-softmax step, log-sum-exp merge of partials).

Scores are kept in the log2 domain (``qk * scale * log2(e)``), and so are the LSEs.
"""

from __future__ import annotations

import inspect
import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from ..backends import INTERPRET as _INTERPRET  # read once, at import

LOG2E = 1.4426950408889634


def interpreting() -> bool:
    return _INTERPRET


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def block_d(D: int) -> int:
    # plain Python (triton.cdiv / next_power_of_2 may be jit functions: slow from the host)
    return max(16, pow2(D))


def precision(dtype) -> str:
    return "ieee" if dtype == torch.float32 else "tf32"


def last_contig(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


_SMS = {}


def num_sms(device) -> int:
    if device.type != "cuda":
        return 4
    n = _SMS.get(device.index)
    if n is None:
        n = _SMS[device.index] = torch.cuda.get_device_properties(device).multi_processor_count
    return n


def env_number(name: str, default: str, kind, what: str):
    """``kind(os.environ.get(name, default))``; ``ValueError`` naming the variable and ``what`` it
    must be when the value does not parse (the launch settings below, read at import)."""
    try:
        return kind(os.environ.get(name, default))
    except ValueError:
        raise ValueError(f"{name} must be {what}, got {os.environ[name]!r}") from None


# Programmatic dependent launch (PDL) of the decode step's Triton kernels: see pdl_kwargs. On by
# default on Hopper and later; ORTHROS_PDL=0 turns it off (read at import). Measured on an H200
# (docs/performance.md, inference change 17): the pair's step 2-3.5% faster with it.
PDL = os.environ.get("ORTHROS_PDL", "1") == "1"
# Where a PDL GEMV signals the kernel behind: "start" (right after its wait) or "end" (after its K
# loop, so the programs of the kernel behind become resident only during this one's tail), and the
# fewest rows a GEMV launches with PDL at: 2, because one-row GEMVs (a Transformer's decode step)
# measured 9-10% slower with it (ORTHROS_PDL_SIGNAL, ORTHROS_PDL_MIN_M; read at import).
PDL_SIGNAL = os.environ.get("ORTHROS_PDL_SIGNAL", "start")
if PDL_SIGNAL not in ("start", "end"):
    raise ValueError(f"ORTHROS_PDL_SIGNAL must be 'start' or 'end', got {PDL_SIGNAL!r}")
PDL_MIN_M = env_number("ORTHROS_PDL_MIN_M", "2", int, "an integer (rows)")
_PDL_DEVICES = {}


def pdl_kwargs(device) -> dict:
    """``{"PDL": True, "launch_pdl": True}`` where programmatic dependent launch applies (a CUDA
    device of compute capability >= 9, :data:`PDL` on, not the interpreter), else ``{}``.

    A kernel launched so may start while the kernel ahead of it in the stream still runs: as
    soon as every program of that kernel has signalled (:func:`pdl_signal`), its programs are
    scheduled where resources free up. Until its own :func:`pdl_wait` it may only do work that
    reads nothing another kernel writes (the GEMV prefetches its weight into L2 there); the
    wait then blocks until the kernel ahead has completed and its writes are visible.
    CUDA-graph capture keeps the dependency (a programmatic edge)."""
    if not PDL or _INTERPRET or device.type != "cuda":
        return {}
    index = device.index if device.index is not None else torch.cuda.current_device()
    ok = _PDL_DEVICES.get(index)
    if ok is None:
        ok = _PDL_DEVICES[index] = torch.cuda.get_device_capability(index)[0] >= 9
    return {"PDL": True, "launch_pdl": True} if ok else {}


@triton.jit
def pdl_wait(PDL: tl.constexpr):
    """With ``PDL``: wait for the kernel ahead to complete (its writes are visible after this)."""
    if PDL:
        gdc_wait()


@triton.jit
def pdl_signal(PDL: tl.constexpr):
    """With ``PDL``: this program lets the kernel behind be scheduled; it is, once every program
    of this kernel has signalled or exited (the kernel behind still waits for this one to complete
    before it touches memory). Signalled after :func:`pdl_wait`, a waiting program of the kernel
    behind never holds a slot that a program of the kernel ahead still needs."""
    if PDL:
        gdc_launch_dependents()


@triton.jit
def pdl_enter(PDL: tl.constexpr):
    """:func:`pdl_wait`, then :func:`pdl_signal` at once. Without ``PDL``: nothing."""
    pdl_wait(PDL)
    pdl_signal(PDL)


@triton.jit
def prefetch_l2(ptrs):
    """A hint: fetch the (128-byte) lines holding ``ptrs`` into L2 with evict-last priority.
    No registers are written and nothing waits for it; every pointer must be in bounds."""
    tl.inline_asm_elementwise("prefetch.global.L2::evict_last [$1]; // $0", "=r,l", [ptrs], dtype=tl.int32,
                              is_pure=False, pack=1)


# Launch through the compiled kernel kept per call signature (see :func:`launch`); read at import,
# switchable at run time (benchmarks/window_host.py times both paths in one process).
FAST_LAUNCH = os.environ.get("ORTHROS_FAST_LAUNCH", "1") == "1"
_LAUNCHES = {}
_LAUNCHES_MAX = 512  # signatures kept; the cache starts over when full (each new length is one)


def launch(kernel, grid, *args, **consts):
    """``kernel[grid](*args, **consts)`` with the Triton JIT's per-call work done once a signature.

    Triton's ``JITFunction.run`` binds and specialises every argument, builds a cache key and
    checks globals at each call: 10-35 us a launch on the H200 machines' hosts, which an eager
    call of a small problem waits on (the window stream's fwd+bwd at 8K tokens: the cache took
    11-12% off its host path, docs/performance.md kernels change 15). Here the first
    call of a signature goes through the JIT and its compiled kernel is kept under a key that
    fixes everything Triton specialises on, and more: the device, each tensor's dtype and
    16-byte alignment, every other argument's type and value, every constexpr and launch option.
    Later calls with that key launch the compiled kernel directly (its own launcher, with
    Triton's launch hooks, on the current stream).

    ``args`` are the kernel's leading parameters, **tensors first** (the pointer parameters,
    at least one, then the scalars: every kernel of the ops is written so; a tensor after a
    scalar is refused),
    ``consts`` the rest by name plus ``num_warps`` / ``num_stages`` (and other launch options);
    parameters left out take their defaults. The kernels launched so read no mutable globals
    (what the JIT's global check guards). ``FAST_LAUNCH`` off or the interpreter: always the JIT."""
    if not FAST_LAUNCH or _INTERPRET:
        return kernel[grid](*args, **consts)
    spec = []
    for a in args:  # the leading tensors: dtype and alignment (what Triton specialises a pointer on)
        if not isinstance(a, torch.Tensor):
            break
        spec.append(a.dtype)
        spec.append(a.data_ptr() & 15)
    scalars = args[len(spec) // 2:]
    types = tuple(map(type, scalars))  # True == 1 and 1.0 == 1 hash alike: the types keep them apart
    key = (kernel, args[0].get_device(), tuple(spec), scalars, types, tuple(consts.items()))
    hit = _LAUNCHES.get(key)
    if hit is None:
        if any(isinstance(a, torch.Tensor) for a in scalars):
            raise TypeError(f"launch({kernel.__name__}): tensor arguments must come before every scalar one")
        rest = _rest(kernel, len(args), consts)
        compiled = kernel[grid](*args, **consts)
        if len(_LAUNCHES) >= _LAUNCHES_MAX:
            _LAUNCHES.clear()
        _LAUNCHES[key] = (compiled, rest)
        return compiled
    compiled, rest = hit
    compiled[tuple(grid) + (1,) * (3 - len(grid))](*args, *rest)
    return compiled


def bind(compiled, kernel, grid, *args, **consts):
    """The launch ``launch(kernel, grid, *args, **consts)`` just made (``compiled``: what it
    returned) as ``run(*tensors)``: the same launch again with new tensors in place of ``args``'
    leading tensors (as many, same order) and every other argument as given here. For callers
    that memoise an op's launches under a key which fixes what :func:`launch` keys on for those
    tensors (dtype and 16-byte alignment) and everything the scalars and constexprs are computed
    from: ``run`` checks nothing. With the launch cache on it calls the compiled kernel's runner
    directly (no binding, no key); otherwise it launches through the JIT (``launch``'s rules)."""
    n = 0
    while n < len(args) and isinstance(args[n], torch.Tensor):
        n += 1
    tail = args[n:]
    if not FAST_LAUNCH or _INTERPRET or compiled is None:
        return lambda *tensors: kernel[grid](*tensors, *tail, **consts)
    runner = compiled[tuple(grid) + (1,) * (3 - len(grid))]
    tail = tuple(tail) + _rest(kernel, len(args), consts)
    return lambda *tensors: runner(*tensors, *tail)


def _rest(kernel, n, consts) -> tuple:
    """The values of ``kernel``'s parameters after its first ``n`` (what the compiled kernel's
    runner takes after the call's arguments): from ``consts`` by name, else the defaults."""
    rest = []
    for p in kernel.params[n:]:
        if p.name in consts:
            rest.append(consts[p.name])
        elif p.default is not inspect.Parameter.empty:
            rest.append(p.default)
        else:
            raise TypeError(f"launch({kernel.__name__}): no value for parameter {p.name!r}")
    return tuple(rest)


_DUMMIES = {}


def dummy(device):
    """A placeholder int64 tensor for pointer arguments a kernel variant does not read (cached: no launch)."""
    t = _DUMMIES.get(device)
    if t is None:
        t = _DUMMIES[device] = torch.zeros(1, dtype=torch.int64, device=device)
    return t


_COUNTERS = {}


def zeroed_counters(device, n: int) -> torch.Tensor:
    """``n`` int32 counters, zero between launches: a kernel that takes tickets on them must
    put each back to 0 before it ends (the host never re-zeroes them, so a CUDA-graph replay
    finds them as the last launch left them). Cached per (device, n) and never freed: a
    captured graph keeps the address. Kernels using them must not run concurrently on two
    streams. First asked for while a graph is being captured, the buffer is not cached: its
    zero-fill runs only inside that graph (at every replay), so it must not be shared."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    key = (device, int(n))
    t = _COUNTERS.get(key)
    if t is None:
        t = torch.zeros(int(n), dtype=torch.int32, device=device)
        if not (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
            _COUNTERS[key] = t
    return t


@triton.jit
def visible(kpos, qpos, k_ok, window, kdoc, qdoc, kvs,
            HAS_WINDOW: tl.constexpr, HAS_DOC: tl.constexpr, HAS_KVS: tl.constexpr):
    """Which (query, key) pairs of a tile attend: causal, key in range, within the window, same
    document, not left padding. Arguments are already broadcast to the tile's layout
    (``[rows, 1]`` vs ``[1, cols]`` either way round); ``kdoc``/``qdoc``/``kvs`` are ignored
    (placeholders) without their flag."""
    mask = (kpos <= qpos) & k_ok
    if HAS_WINDOW:
        mask = mask & (kpos > qpos - window)
    if HAS_DOC:
        mask = mask & (kdoc == qdoc)
    if HAS_KVS:
        mask = mask & (kpos >= kvs)
    return mask


@triton.jit
def band(d, window, HAS_WINDOW: tl.constexpr):
    """``visible`` for contiguous positions without documents or left padding, from ``d`` = query
    position - key position (int32, any tile shape): causal, and ``d < window`` with a window, in
    one unsigned compare (a negative ``d`` wraps above any window). Rows and columns out of range
    need no test where their loads are zero-filled and their LSE is ``+inf`` (their terms vanish)."""
    if HAS_WINDOW:
        return d.to(tl.uint32, bitcast=True) < window.to(tl.uint32)
    return d >= 0


@triton.jit
def softmax_step(m_i, l_i, acc, s, v, PREC: tl.constexpr):
    """One key block of the online softmax: fold scores ``s [M, N]`` (log2 domain, -inf where
    not visible) and values ``v [N, D]`` into the running max ``m_i``, sum ``l_i`` and
    output accumulator ``acc``."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
    return m_new, l_i, acc


@triton.jit
def softmax_result(m_i, l_i, acc):
    """Normalised output and LSE of a finished online softmax; a row that saw no key gets
    output 0 and LSE -inf (``has`` is False)."""
    has = l_i > 0
    o = acc / tl.where(has, l_i, 1.0)[:, None]
    lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))
    return o, lse, has


@triton.jit
def merge_splits(lse_s, o_s):
    """Exact merge of partial results over key splits: ``lse_s [S]`` (-inf for an empty
    split), ``o_s [S, D]``. Returns the merged output and LSE (+inf when every split was empty)."""
    mx = tl.max(lse_s, 0)
    mx_safe = tl.where(mx == float("-inf"), 0.0, mx)
    wts = tl.exp2(lse_s - mx_safe)
    den = tl.sum(wts, 0)
    o = tl.sum(o_s * wts[:, None], 0) / tl.where(den > 0, den, 1.0)
    lse = tl.where(den > 0, mx_safe + tl.log2(tl.where(den > 0, den, 1.0)), float("inf"))
    return o, lse

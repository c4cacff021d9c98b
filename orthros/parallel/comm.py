"""Process-group plumbing for sequence-parallel inference: who am I, the few collectives the
sharded forward needs, and failures turned into one clear error instead of a hang.

Every collective goes through :class:`ParallelContext`, which

* short-circuits a world of one (no process group needed: the same code is the 1-GPU path);
* names the operation in the error it raises when a peer died or did not arrive within the
  process group's timeout (gloo raises on a closed socket or a timeout; NCCL's watchdog
  aborts the process after the timeout, and ``torchrun`` then stops every other rank).
"""

from __future__ import annotations

import datetime as _dt
import os
import warnings
from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist

from ..utils import as_float, as_int


# the longest process-group timeout (about 31 years): timedelta overflows past ~8.6e13 s, and c10d counts a
# timeout in int64 nanoseconds (past ~9.2e9 s gloo's every collective timed out at once)
MAX_TIMEOUT_S = 1e9


def check_timeout(name: str, value) -> float:
    """A process-group timeout: a number of seconds in ``(0, MAX_TIMEOUT_S]`` (what :func:`~orthros.utils.as_float`
    takes: NumPy's numbers and 0-d tensors too, not a bool), returned as a Python ``float``; else a
    ``ValueError`` naming ``name``."""
    t = as_float(value)
    if t is None or not 0 < t <= MAX_TIMEOUT_S:
        raise ValueError(f"{name} must be a number of seconds > 0 and <= {MAX_TIMEOUT_S:g}, got {value!r}")
    return t


class ParallelError(RuntimeError):
    """A collective failed (a peer rank crashed, was killed, or did not arrive in time), or the
    launcher's environment (``WORLD_SIZE``, ``RANK``...) cannot start a process group."""


def _env_int(name: str, lo: int, hi: Optional[int] = None, default: Optional[int] = None, role: str = "") -> int:
    """The integer environment variable ``name`` in ``[lo, hi]`` (``default`` when unset, if any), else a
    ``ParallelError`` naming it and what is allowed: torch's own reading was a bare ``int()`` ValueError, a
    missing-variable error, or a rank outside the world that waited out the rendezvous timeout."""
    raw = os.environ.get(name)
    if raw is None and default is not None:
        return default
    allowed = f"an integer >= {lo}" if hi is None else f"an integer in [{lo}, {hi}]"
    try:
        val = int(raw) if raw is not None else None
    except ValueError:
        val = None
    if val is None or val < lo or (hi is not None and val > hi):
        got = "is not set" if raw is None else f"is {raw!r}"
        raise ParallelError(f"environment variable {name} {got}: it must be {allowed}{role}; torchrun sets it")
    return val


def env_world_size() -> int:
    """``WORLD_SIZE`` of the launcher (``torchrun``), 1 when unset; a ``ParallelError`` when it is not an integer >= 1."""
    return _env_int("WORLD_SIZE", 1, default=1, role=" (the number of processes; unset: one)")


def env_local_world_size(world: int) -> int:
    """``LOCAL_WORLD_SIZE`` of the launcher (``torchrun``: the ranks on this host), ``world`` when unset (one host);
    a ``ParallelError`` when it is not an integer in ``[1, world]``."""
    return _env_int("LOCAL_WORLD_SIZE", 1, world, default=world, role=" (the processes on this host; unset: all)")


def _local_rank() -> int:
    """This process's GPU (``LOCAL_RANK``, default 0), one of the visible devices."""
    n = torch.cuda.device_count()
    return _env_int("LOCAL_RANK", 0, n - 1, default=0, role=f" (this process's GPU; {n} visible)")


@dataclass
class ParallelContext:
    """The ranks that share one sequence, in sequence order (rank r holds the r-th shard)."""

    group: Optional[object] = None  # torch.distributed ProcessGroup; None = default group
    rank: int = 0
    world_size: int = 1
    timeout_s: Optional[float] = None

    def __post_init__(self):  # a hand-built context: wrong here failed later as an IndexError or a collective's error
        # integers as as_int takes them (NumPy's, 0-d tensors; not a bool), kept as Python ints
        n, r = as_int(self.world_size), as_int(self.rank)
        if n is None or n < 1:
            raise ValueError(f"world_size must be an integer >= 1, got {self.world_size!r}")
        if r is None or not 0 <= r < n:
            raise ValueError(f"rank must be an integer in [0, world_size) = [0, {n}), got {self.rank!r}")
        self.world_size, self.rank = n, r
        if self.timeout_s is not None:  # only named in a failure's message, which a timedelta broke
            self.timeout_s = check_timeout("timeout_s", self.timeout_s)
        if n > 1:  # else the first collective failed as 'a peer rank exited, crashed or did not arrive'
            if not (dist.is_available() and dist.is_initialized()):
                raise ValueError(f"world_size={n} needs a torch.distributed process group, and none is initialised: "
                                 f"call init_from_env() (under torchrun) or dist.init_process_group() first")
            have = (dist.get_rank(self.group), dist.get_world_size(self.group))
            if have != (r, n):
                raise ValueError(f"rank={r}, world_size={n} are not this process's in the group (rank {have[0]} of "
                                 f"{have[1]}): build the context with ParallelContext.from_group(group)")

    @classmethod
    def single(cls) -> "ParallelContext":
        """One process, no communication: the 1-GPU path of the same code."""
        return cls(group=None, rank=0, world_size=1)

    @classmethod
    def from_group(cls, group=None, timeout_s: Optional[float] = None) -> "ParallelContext":
        if not (dist.is_available() and dist.is_initialized()):
            return cls.single()
        rank = dist.get_rank(group)
        if rank < 0:  # torch's answer outside the group (its world size then reads -1 too)
            raise ValueError(f"this process (global rank {dist.get_rank()}) is not a member of the group: build its "
                             f"ParallelContext only on the group's ranks")
        return cls(group=group, rank=rank, world_size=dist.get_world_size(group), timeout_s=timeout_s)

    @property
    def is_last(self) -> bool:
        return self.rank == self.world_size - 1

    def _fail(self, what: str, err: BaseException):
        t = f" within the {self.timeout_s:g} s timeout" if self.timeout_s else ""
        raise ParallelError(
            f"[rank {self.rank}/{self.world_size}] collective '{what}' failed: a peer rank exited, crashed "
            f"or did not arrive{t}. Stopping this rank too. ({type(err).__name__}: {str(err).strip()[:300]})"
        ) from err

    def all_gather(self, t: torch.Tensor, what: str, async_op: bool = False):
        """Stack ``t`` of every rank into ``[world_size, *t.shape]`` (same shape on every rank).

        With ``async_op`` returns a :class:`PendingGather`; call ``.wait()`` for the tensor.
        """
        t = t.contiguous()
        if self.world_size == 1:
            out = t.unsqueeze(0)
            return PendingGather(self, out, None, what) if async_op else out
        flat = t.reshape(-1)
        out = torch.empty(self.world_size * flat.numel(), dtype=t.dtype, device=t.device)
        try:
            with warnings.catch_warnings():  # renamed all_gather_single in newer torch; same op
                warnings.simplefilter("ignore", FutureWarning)
                work = dist.all_gather_into_tensor(out, flat, group=self.group, async_op=async_op)
        except Exception as e:  # noqa: BLE001 - any backend error becomes one clear error
            self._fail(what, e)
        out = out.view((self.world_size,) + tuple(t.shape))
        if async_op:
            return PendingGather(self, out, work, what)
        return out

    def broadcast(self, t: torch.Tensor, src: int, what: str) -> torch.Tensor:
        if self.world_size == 1:
            return t
        try:
            dist.broadcast(t, src=dist.get_global_rank(self.group, src) if self.group is not None else src,
                           group=self.group)
        except Exception as e:  # noqa: BLE001
            self._fail(what, e)
        return t

    def all_reduce_max(self, x: float, device, what: str) -> float:
        if self.world_size == 1:
            return float(x)
        t = torch.tensor([float(x)], dtype=torch.float64, device=device)
        try:
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        except Exception as e:  # noqa: BLE001
            self._fail(what, e)
        return float(t.item())

    def barrier(self, what: str = "barrier", device=None):
        if self.world_size == 1:
            return
        # an all-reduce instead of dist.barrier(): it obeys the timeout on every backend and
        # needs no device guess on NCCL
        self.all_reduce_max(0.0, device if device is not None else "cpu", what)


class PendingGather:
    def __init__(self, ctx: ParallelContext, out: torch.Tensor, work, what: str):
        self.ctx, self.out, self.work, self.what = ctx, out, work, what

    def wait(self) -> torch.Tensor:
        if self.work is not None:
            try:
                self.work.wait()
            except Exception as e:  # noqa: BLE001
                self.ctx._fail(self.what, e)
            self.work = None
        return self.out


def init_from_env(backend: Optional[str] = None, timeout_s: float = 600.0) -> ParallelContext:
    """Initialise the default process group from ``torchrun``'s environment (``RANK``,
    ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``...) with a timeout, pick this rank's GPU, and
    return its context. Without that environment (plain ``python``), a single-process context. A
    missing or bad variable (``RANK`` outside ``[0, WORLD_SIZE)``, a port that is not one...) is a
    :class:`ParallelError` naming it, before any process group starts.

    ``backend``: ``"nccl"`` (default with CUDA) or ``"gloo"``. With a default group already up, its
    context is returned: the group keeps the timeout it was made with (``timeout_s`` is not it), and a
    ``backend`` other than the group's is refused.
    """
    if backend not in (None, "nccl", "gloo"):
        raise ValueError(f"backend must be 'nccl' or 'gloo', got {backend!r}")
    timeout_s = check_timeout("timeout_s", timeout_s)
    existing = dist.is_initialized()
    if not existing:  # torchrun's environment, checked before any process group starts
        world = env_world_size()
        if world == 1:
            if torch.cuda.is_available():
                torch.cuda.set_device(_local_rank())
            return ParallelContext.single()
        _env_int("RANK", 0, world - 1, role=f" (this process's rank, WORLD_SIZE={world})")
        if not os.environ.get("MASTER_ADDR", "").strip():
            raise ParallelError("environment variable MASTER_ADDR is not set (or empty): it must be the host of "
                                "rank 0 (torchrun sets it)")
        _env_int("MASTER_PORT", 1, 65535, role=" (rank 0's port)")
    if existing:  # the group's backend is what runs: one asked for must be it
        have = dist.get_backend()
        if backend is not None and backend != have:
            raise ValueError(f"backend={backend!r}, but the default process group is already initialised with "
                             f"{have!r}: pass backend={have!r} or None, or destroy the group first")
        backend = have
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    kw = {}
    if backend == "nccl":
        if not torch.cuda.is_available():
            raise ValueError("backend='nccl' needs CUDA; use backend='gloo' on CPU")
        local_rank = _local_rank()
        torch.cuda.set_device(local_rank)
        kw["device_id"] = torch.device("cuda", local_rank)
    if not existing:
        dist.init_process_group(backend=backend, timeout=_dt.timedelta(seconds=timeout_s), **kw)
    # an existing group's timeout is its own: a failure's message must not name timeout_s as the one that ran out
    return ParallelContext.from_group(None, timeout_s=None if existing else timeout_s)

"""Probe (issue #18, docs/performance.md inference changes 33-35): a weight stream that does not stop at
the decode chain's phase boundaries, written in CUDA C++ (``stream_chain.cu`` beside this file).

Changes 30-32 showed that a decode layer's GEMVs lose a few microseconds at every dependency
(kernel boundary under PDL, grid barrier, or a switch every program makes at once): the weight
stream drains before the dependency and refills after it. Triton cannot keep it flowing, since
the threads that wait are the threads that load. Here one producer thread a block issues bulk
copies (``cp.async.bulk`` on an ``mbarrier``) of the block's share of every weight of the chain
into a ring of shared-memory stages and never waits for an activation, while the block's eight
consumer warps wait at each grid barrier and consume the ring; the kernel's comment says how.

The chain is change 30's (``persistent_chain.py``, whose weights and systems this reuses): per
layer QKV [6144 x 4096] -> W_O [4096 x 4096] -> gate/up [24576 x 4096] -> down [4096 x 12288],
``M = 2`` rows, Qwen3-8B's shapes, ``--layers`` layers with their own weights, bf16 outputs
between the GEMVs. Systems, timed in the same process under CUDA graphs:

- ``engine``: the engine's Triton GEMVs (``orthros.ops.gemv.kernel.gemv_triton``, PDL, L2 prefetch);
- ``cuda``: the CUDA C++ kernel, one launch for the whole chain (one block a multiprocessor);
- ``torch``: ``F.linear`` (cuBLAS), the reference of every system's output.

The kernel is built with ``nvcc -arch=sm_90`` at first use into ``--build-dir`` (keyed by the
source's hash and flags; the compiler's register report beside it) and called through ``ctypes``
on PyTorch's current stream. It needs a CUDA device of compute capability 9.0 or above and
``nvcc``; there is no CPU form (no interpreter runs CUDA C++). ``--math`` picks the consumers'
form, a build variant each: ``cores`` (the default and the fastest measured: all eight consumer
warps on every 8 KB piece, CUDA cores, batches of eight pieces), ``groups`` (each piece taken by
one group of four warps alone) or ``quads`` (batches of four 8 KB pieces in a stage set, each
taken by one group of four warps alone, tensor cores with the pieces as the A operand's rows;
``--deal claimed``: the blocks claim a phase's batches from a counter instead of a fixed share).
Two closed forms were removed after the twenty-seventh session and are at commit ``f1f4519``:
``mma`` (``cores``' layout, the products on tensor cores) and ``tiles`` (64 x 64 tiles from each
weight's tensor map, tensor cores).
Other options: ``--order contiguous|interleaved`` (how a phase's pieces are dealt to the blocks),
``--stages``, ``--producer-sleep`` (ns between the producer's looks), ``--quad-pieces`` (``quads``'
batch size), ``--stats`` (the kernel's cycle counters), ``--trace`` (when each block started and
ended each phase, and when its producer had issued it: the grid barriers' cost per kind of phase,
``benchmarks/plot_trace.py`` plots it), ``--barrier fenced|acq_rel|tree|relaxed`` (a block's
barrier arrive: its fence, or a two-level counter; ``relaxed`` is a diagnostic), ``--l2-ahead``
(pieces the producer asks L2 for ahead of its copies, so that HBM streams on while the ring is
full; with ``--deal claimed``, for the batches of the next phase it claims at a phase's end;
``--l2-how hint|copy``: a bulk prefetch, or a bulk copy into a scratch stage, a demand read),
``--skip
math|grid|both`` (diagnostics that leave a part out; their results are wrong by design). Measured
on an H200 (2026-12-04, docs/issue-18-log.md), us a layer against the engine's GEMVs at 99-101 in the
same process: the bare stream 90.3 and 91.2 with every grid barrier (the twenty-fifth session's
per-piece consumers), ``quads``' 90.0 without barriers; ``cores`` 100.5-102.5, ``groups``
103.0-103.4, ``quads`` 107.8-108.1 (claimed 111.0-111.7); the removed ``tiles`` 108.7-110.8 and
``mma`` 113.8-114.2.

    python benchmarks/stream_chain.py --out docs/results/<dir>/stream.json

Prints per system the time a layer (us), its weight bytes a second, the ratio to the copy
bandwidth measured in the same run and to ``engine``, and the error against ``torch``; writes the
JSON (meta: date, GPU, commit, versions, copy bandwidth) atomically. Bad arguments exit 2 before
any work; a wait that gives up inside the kernel (~2 s) fails the run with exit 1 and no JSON.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import shutil
import sys
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import probe_harness  # noqa: E402  (beside this script)
from persistent_chain import SHAPES, ChainWeights, chain_sites  # noqa: E402

SYSTEMS = ("engine", "cuda", "torch")
SOURCE = Path(__file__).resolve().with_name("stream_chain.cu")
PIECE = 4096  # bf16 elements a piece (the kernel's PIECE): every K must be a multiple
MAX_STAGES = 26  # 26 x 8 KB + barriers + the warps' slots (12 KB) fit the 227 KB a Hopper block may take
NVCC_FLAGS = ("-O3", "-std=c++17", "-arch=sm_90", "-Xptxas", "-v", "-shared", "-Xcompiler", "-fPIC")
# --math: the kernel's build variant
MATH = {"cores": (), "groups": ("-DSTREAM_GROUPS=1",), "quads": ("-DSTREAM_QUAD=1",)}
BARRIERS = ("fenced", "relaxed", "acq_rel", "tree")  # --barrier: the kernel's BARRIER_RELAXED 0, 1, 2, 3
BAR_STRIDE = 32  # unsigned a grid-barrier counter apart, a 128-byte line each (the kernel's BAR_STRIDE)
BAR_WORDS = BAR_STRIDE * 34  # the grid barrier's counters: bar[0] and up to 33 first-level ones
TREE_BLOCKS = 16  # --barrier tree: blocks a first-level counter (the kernel's TREE_BLOCKS)
SKIPS = {"none": 0, "math": 1, "grid": 2, "both": 3}  # the kernel's SKIP_MATH | SKIP_GRID
WAITS = {1: "a grid barrier (are all --blocks resident at once? at most one a multiprocessor)",
         2: "a consumer's wait for a full stage", 3: "the producer's wait for an empty stage"}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    probe_harness.add_common(p, SYSTEMS)
    p.add_argument("--stages", type=int, default=16,
                   help=f"8 KB shared-memory stages of the ring (8-{MAX_STAGES}; even with --math groups, a multiple "
                        "of 8 with --math quads; 16 measured fastest, change 33's calls 8-9)")
    p.add_argument("--blocks", type=int, default=None,
                   help="the kernel's blocks (default: the device's multiprocessors; never more, all must be "
                        "resident at once)")
    p.add_argument("--stats", action="store_true",
                   help="print where the kernel's time went in its checked run (cycles a block: grid-barrier waits, "
                        "waits for full stages, the producer's waits for empty stages)")
    p.add_argument("--trace", action="store_true",
                   help="print, per kind of phase, when the blocks' consumers started and ended it and when their "
                        "producer had issued it (global-timer stamps of the checked run), and write the stamps beside "
                        "--out (<out>.trace.json)")
    p.add_argument("--math", default="cores", choices=tuple(MATH),
                   help="the consumers' products: 'cores' (CUDA cores, float32 FMAs, every warp on every piece), "
                        "'groups' (CUDA cores, each piece taken by one group of 4 warps alone, the input in "
                        "registers), or 'quads' (batches of four 8 KB pieces, each taken by one group of 4 warps "
                        "alone, the pieces as A's rows of mma.sync, split in four column classes against the input "
                        "rows as B)")
    p.add_argument("--producer-sleep", type=int, default=64,
                   help="ns the producer thread sleeps between looks at a stage it waits to refill (0-10000; 0: "
                        "it spins, on the issue slots of two consumer warps)")
    p.add_argument("--quad-pieces", type=int, default=4, choices=(1, 2, 4),
                   help="--math quads: pieces a batch and stages a stage set (4; 2 or 1 leave rows of the A operand "
                        "unused, to see what the batch's size does to the stream)")
    p.add_argument("--deal", default="static", choices=("static", "claimed"),
                   help="--math quads: each block's batches of a phase fixed by --order ('static'), or claimed one "
                        "at a time by the blocks' producers from a counter a phase ('claimed': a block that streams "
                        "faster takes more, so the blocks end each phase together)")
    p.add_argument("--barrier", default="fenced", choices=BARRIERS,
                   help="a block's grid-barrier arrive: after __threadfence() ('fenced'), after fence.acq_rel.gpu "
                        "('acq_rel'), on a two-level counter ('tree': 16 blocks a first-level counter, whose last "
                        "arriver adds to the one waited on), or without a fence ('relaxed': a diagnostic of the "
                        "fence's cost; the outputs are then not ordered before the arrive and may be wrong)")
    p.add_argument("--l2-ahead", type=int, default=0,
                   help="pieces (8 KB) the producer asks L2 for ahead of its copies, as --l2-how says (0-64; 0: "
                        "none), so that HBM keeps streaming the block's next pieces while its ring is full and its "
                        "consumers wait at a grid barrier; with --deal claimed: for the next phase's first "
                        "ceil(N / 4) batches, which the producer claims at the end of each phase")
    p.add_argument("--l2-how", default="hint", choices=("hint", "copy"),
                   help="how --l2-ahead asks L2 for a piece: a bulk prefetch ('hint'; inference change 23 found "
                        "such hints fetching little on an H200) or a bulk copy into a scratch stage that nothing "
                        "reads ('copy': a demand read, 8 KB more shared memory)")
    p.add_argument("--order", default="contiguous", choices=("contiguous", "interleaved"),
                   help="how a phase's pieces are dealt to the blocks: contiguous ranges, or every blocks-th piece")
    p.add_argument("--skip", default="none", choices=tuple(SKIPS),
                   help="diagnostic, wrong results: 'math' (consumers only wait for and release each stage), 'grid' "
                        "(no grid-barrier waits), 'both'")
    p.add_argument("--nvcc", default="nvcc", help="the CUDA compiler (a name on PATH or a path)")
    p.add_argument("--build-dir", default=os.path.join(os.path.expanduser("~"), ".cache", "orthros", "stream_chain"),
                   help="where the built library is kept")
    a = p.parse_args(argv)
    probe_harness.check_common(p, a, SYSTEMS)
    if a.device == "cpu":
        p.error("--device cpu: this probe's kernel is CUDA C++, which no interpreter runs; use --device cuda")
    if not 8 <= a.stages <= MAX_STAGES:  # a batch waits for 8 stages at once
        p.error(f"--stages must be in 8..{MAX_STAGES}, got {a.stages}")
    if a.math == "groups" and a.stages % 2:
        p.error(f"--stages must be even with --math groups (one stage set a group of warps), got {a.stages}")
    if a.math == "quads" and a.stages % 8:
        # each group of warps must own fixed stage sets (of 4 stages): one a round ahead of another on a shared
        # set would see that set's previous round (same parity) as complete
        p.error(f"--stages must be a multiple of 8 with --math quads (stage sets owned by a group of warps), "
                f"got {a.stages}")
    if a.quad_pieces != 4 and a.math != "quads":
        p.error(f"--quad-pieces {a.quad_pieces}: only with --math quads")
    if a.deal != "static" and a.math != "quads":
        p.error(f"--deal {a.deal}: only with --math quads")
    if a.deal == "claimed" and a.order != "contiguous":
        p.error("--order interleaved: with --deal claimed the blocks claim their batches, there is no order to set")
    if not 0 <= a.l2_ahead <= 64:
        p.error(f"--l2-ahead must be in 0..64 pieces, got {a.l2_ahead}")
    if a.l2_how != "hint" and not a.l2_ahead:
        p.error(f"--l2-how {a.l2_how}: only with --l2-ahead > 0")
    if not 0 <= a.producer_sleep <= 10000:
        p.error(f"--producer-sleep must be in 0..10000 ns, got {a.producer_sleep}")
    if a.blocks is not None and a.blocks < 1:
        p.error(f"--blocks must be >= 1, got {a.blocks}")
    if shutil.which(a.nvcc) is None:
        p.error(f"--nvcc: {a.nvcc!r} is not an executable on PATH (the kernel is built at first use)")
    if os.path.exists(a.build_dir) and not os.path.isdir(a.build_dir):
        p.error(f"--build-dir must be a directory, got a file: {a.build_dir!r}")
    a.shape = "qwen3-8b"
    for what, n, k in chain_sites(*SHAPES[a.shape]):
        # the kernel's splits (n % 4: a quads batch of 4 rows never crosses a segment)
        assert k % PIECE == 0 and n % 4 == 0, (what, n, k)
    return a


def build_flags(form: str = "cores", producer_sleep_ns: int = 64, quad_pieces: int = 4,
                barrier: str = "fenced", l2_ahead: int = 0, l2_how: str = "hint") -> tuple:
    """nvcc's flags for ``--math form``, ``--producer-sleep``, ``--quad-pieces``, ``--barrier``,
    ``--l2-ahead`` and ``--l2-how``."""
    quad = (f"-DQUAD={quad_pieces}",) if form == "quads" else ()
    relaxed = (f"-DBARRIER_RELAXED={BARRIERS.index(barrier)}",) if barrier != "fenced" else ()
    ahead = ((f"-DL2_AHEAD={l2_ahead}",) + (("-DL2_COPY=1",) if l2_how == "copy" else ())) if l2_ahead else ()
    return (*NVCC_FLAGS, *MATH[form], f"-DPRODUCER_SLEEP_NS={producer_sleep_ns}", *quad, *relaxed, *ahead)


def variant(a) -> dict:
    """The build variant the parsed arguments ask for (:func:`build_flags`' keywords)."""
    return {"form": a.math, "producer_sleep_ns": a.producer_sleep, "quad_pieces": a.quad_pieces,
            "barrier": a.barrier, "l2_ahead": a.l2_ahead, "l2_how": a.l2_how}


def build(nvcc: str, build_dir: str, **kw) -> Path:
    """The kernel's shared library for a variant (:func:`build_flags`' keywords), built once per
    source and flags (a hash in its name) with the register report in ``<name>.ptxas.txt`` beside
    it; written under a temporary name, then renamed. ``RuntimeError`` with the end of nvcc's
    stderr when it fails."""
    import hashlib
    import subprocess

    flags = build_flags(**kw)
    key = hashlib.sha256(SOURCE.read_bytes() + " ".join(flags).encode()).hexdigest()[:16]
    d = Path(build_dir)
    so = d / f"stream_chain-{key}.so"
    if so.exists():
        return so
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / f".stream_chain-{key}.{os.getpid()}.so"
    p = subprocess.run([nvcc, *flags, "-o", str(tmp), str(SOURCE)], capture_output=True, text=True)
    if p.returncode:
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"nvcc failed on {SOURCE.name} (exit {p.returncode}):\n{p.stderr[-3000:]}")
    (d / f"stream_chain-{key}.ptxas.txt").write_text(p.stderr)
    os.replace(tmp, so)
    return so


def acc_rows(shape, blocks: int) -> int:
    """Slots of each consumer warp's shared-memory accumulator: the most pieces a block holds in a
    phase, ``ceil(pieces / blocks)`` in either order (a slot a piece, two floats)."""
    return max(math.ceil(n * (k // PIECE) / blocks) for _, n, k in chain_sites(*shape))


class StreamChain(ChainWeights):
    """The CUDA kernel's float32 activation buffers and its library, and one callable a system."""

    def __init__(self, a, device, dtype):
        import torch

        if device.type != "cuda":
            raise ValueError("the CUDA chain needs a CUDA device")
        props = torch.cuda.get_device_properties(device)
        if (props.major, props.minor) < (9, 0):
            raise SystemExit(f"error: the kernel needs compute capability >= 9.0 (bulk copies, mbarrier); "
                             f"{props.name} is {props.major}.{props.minor}")
        self.blocks = a.blocks or props.multi_processor_count
        if a.barrier == "tree" and -(-self.blocks // TREE_BLOCKS) > BAR_WORDS // BAR_STRIDE - 1:
            raise SystemExit(f"error: --barrier tree: {self.blocks} blocks need more first-level counters than the "
                             f"{BAR_WORDS // BAR_STRIDE - 1} there are")
        if self.blocks > props.multi_processor_count:
            raise SystemExit(f"error: --blocks {self.blocks} > the {props.multi_processor_count} multiprocessors of "
                             f"{props.name}: the grid barriers need every block resident at once")
        super().__init__(a, device, dtype)
        H, NQKV, INTER = self.shape
        L = a.layers
        self.x0f = self.x0.float()
        self.out = [torch.zeros(L, 2, n, device=device, dtype=torch.float32) for _, n, _ in chain_sites(H, NQKV, INTER)]
        self.bar = torch.zeros(BAR_WORDS, device=device, dtype=torch.int32)
        # --deal claimed: a batch counter a phase (zeroed before each launch, as the grid barrier's)
        self.claims = torch.zeros(4 * L, device=device, dtype=torch.int32) if a.deal == "claimed" else None
        self.err = torch.zeros(1, device=device, dtype=torch.int32)
        self.stats = None
        self.ran = False  # the cuda system ran since the last reset (its counters are then this run's)
        self.acc_rows = acc_rows(self.shape, self.blocks)
        lib = ctypes.CDLL(str(build(a.nvcc, a.build_dir, **variant(a))))
        lib.stream_chain_smem_bytes.argtypes = [ctypes.c_int] * 2
        lib.stream_chain_prepare.argtypes = [ctypes.c_int] * 2
        lib.stream_chain_launch.argtypes = [ctypes.c_void_p] * 14 + [ctypes.c_int] * 9 + [ctypes.c_void_p]
        lib.stream_chain_error_string.restype = ctypes.c_char_p
        lib.stream_chain_stats.argtypes = []
        lib.stream_chain_trace.argtypes = []
        smem = lib.stream_chain_smem_bytes(a.stages, self.acc_rows)
        if smem > props.shared_memory_per_block_optin:
            raise SystemExit(f"error: --stages {a.stages} needs {smem} B of shared memory a block, more than the "
                             f"{props.shared_memory_per_block_optin} of {props.name}")
        self.lib = lib
        if a.stats:
            self.stats = torch.zeros(self.blocks, lib.stream_chain_stats(), device=device, dtype=torch.int64)
        self.trace = None
        if a.trace:
            self.trace = torch.zeros(self.blocks, 4 * L, lib.stream_chain_trace(), device=device, dtype=torch.int64)
        self._check(lib.stream_chain_prepare(a.stages, self.acc_rows), "cudaFuncSetAttribute")
        self.smem_bytes = smem

    def _check(self, rc: int, what: str) -> None:
        if rc:
            raise RuntimeError(f"{what}: {self.lib.stream_chain_error_string(rc).decode()} (cudaError {rc})")

    def cuda_chain(self):
        import torch

        a = self.a
        H, NQKV, INTER = self.shape
        self.ran = True
        self.bar.zero_()
        if self.claims is not None:
            self.claims.zero_()
        self.out[0][0].zero_()  # phase 0's output (the kernel zeroes every later phase's)
        ptrs = [t.data_ptr() for t in (*self.w, self.x0f, *self.out, self.bar, self.err)]
        ptrs.append(self.stats.data_ptr() if self.stats is not None else None)
        ptrs.append(self.trace.data_ptr() if self.trace is not None else None)
        ptrs.append(self.claims.data_ptr() if self.claims is not None else None)
        stream = torch.cuda.current_stream(self.device).cuda_stream
        self._check(self.lib.stream_chain_launch(*ptrs, SKIPS[a.skip], int(a.order == "interleaved"), H, NQKV, INTER,
                                                 a.layers, a.stages, self.acc_rows, self.blocks,
                                                 stream), "stream_chain_launch")
        return self.out[3][-1]

    def call(self, system):
        return {"torch": self.torch_chain, "engine": self.engine_chain, "cuda": self.cuda_chain}[system]

    def reset(self):
        """No output left by another system (the buffers zeroed)."""
        for t in (*self.out, self.err):
            t.zero_()
        self.ran = False

    def failure(self):
        code = int(self.err.item())
        if code:
            return f"inside the kernel, {WAITS.get(code, f'wait {code}')} gave up after ~2 s"
        if self.stats is not None and self.ran:
            print(stats_lines(self.stats.cpu().tolist()), flush=True)
        if self.trace is not None and self.ran:
            stamps = self.trace.cpu().tolist()
            print(trace_lines(stamps), flush=True)
            write_trace(self.a.out, stamps)
        return None


STAT_NAMES = ("consumer run", "grid-barrier waits", "full-stage waits", "producer run", "empty-stage waits")


def stats_lines(rows) -> str:
    """The kernel's counters (a row a block, cycles) as lines: mean and max over the blocks, and
    each wait's mean as a share of its thread's run."""
    cols = list(zip(*rows))
    out = ["kernel cycles a block (mean / max over blocks, share of the thread's run):"]
    for i, name in enumerate(STAT_NAMES):
        mean, most = sum(cols[i]) / len(rows), max(cols[i])
        run = sum(cols[3 if i >= 3 else 0]) / len(rows)
        share = f"{mean / run:6.1%}" if run else "   n/a"
        out.append(f"  {name:20s} {mean:14.0f} / {most:14.0f}  {share}")
    return "\n".join(out)


PHASES = ("QKV", "W_O", "gate/up", "down")  # a layer's phases, in the kernel's order


def trace_summary(stamps) -> list:
    """The kernel's stamps (``[block][phase][start, end, issued]``, ns) per kind of phase, over
    every layer but the first, in us: ``wall`` (the phase's last end after the phase before's last
    end), ``busy`` (a block's end minus its start, mean over blocks), ``late`` (the last block's
    end after the median block's), ``wait`` (a block's start after its own end of the phase
    before, mean), ``barrier`` (the first block's start after the phase before's last end: the grid
    barrier's own latency), ``lead`` (a block's start after its producer had issued the whole
    phase, mean; negative: the consumers started before); and ``last`` (the block most often the
    last to end, with its share of the phases). ``wall - barrier - busy`` is what the slowest
    block's busy time adds to the mean's (the blocks' imbalance)."""
    blocks, phases = len(stamps), len(stamps[0]) if stamps else 0
    if phases < 8 or phases % 4 or any(len(b) != phases or any(len(r) != 3 for r in b) for b in stamps):
        raise ValueError("a trace holds [start, end, issued] stamps of at least two layers (8 phases) a block")
    out = []
    for kind, name in enumerate(PHASES):
        rows = {"wall": [], "busy": [], "late": [], "wait": [], "barrier": [], "lead": []}
        last = [0] * blocks
        for s in range(4 + kind, phases, 4):
            ends = [stamps[b][s][1] for b in range(blocks)]
            prev = [stamps[b][s - 1][1] for b in range(blocks)]
            rows["wall"].append(max(ends) - max(prev))
            rows["busy"].append(sum(stamps[b][s][1] - stamps[b][s][0] for b in range(blocks)) / blocks)
            rows["late"].append(max(ends) - sorted(ends)[blocks // 2])
            rows["wait"].append(sum(stamps[b][s][0] - prev[b] for b in range(blocks)) / blocks)
            rows["barrier"].append(min(stamps[b][s][0] for b in range(blocks)) - max(prev))
            rows["lead"].append(sum(stamps[b][s][0] - stamps[b][s][2] for b in range(blocks)) / blocks)
            last[ends.index(max(ends))] += 1
        n = max(1, len(rows["wall"]))
        top = max(range(blocks), key=last.__getitem__)
        out.append({"phase": name, **{k: sum(v) / n / 1e3 for k, v in rows.items()},
                    "last": top, "last_share": last[top] / n})
    return out


TRACE_COLUMNS = ("wall", "busy", "late", "wait", "barrier", "lead")


def trace_lines(stamps) -> str:
    """:func:`trace_summary` as lines, one a kind of phase, and their sum (a layer)."""
    rows = trace_summary(stamps)
    out = ["kernel trace, us a phase (mean over layers 2..L): wall = last end after the phase before's last end; "
           "busy = a block's end - start; late = last end - median end; wait = start - own previous end; "
           "barrier = first start - last previous end; lead = start - producer done",
           f"  {'phase':8s} " + " ".join(f"{c:>7s}" for c in TRACE_COLUMNS) + "  last block (share)"]
    for r in rows:
        out.append(f"  {r['phase']:8s} " + " ".join(f"{r[c]:7.2f}" for c in TRACE_COLUMNS) +
                   f"  {r['last']} ({r['last_share']:.0%})")
    out.append(f"  {'layer':8s} " + " ".join(f"{sum(r[c] for r in rows):7.2f}" for c in TRACE_COLUMNS[:-1]))
    return "\n".join(out)


def read_trace(path) -> list:
    """The stamps of a ``.trace.json`` (:func:`write_trace`) in ns from its origin."""
    with open(path) as f:
        data = json.load(f)
    k = data.get("ns_per_unit", 1)
    return [[[v * k for v in r] for r in b] for b in data["stamps"]]


def write_trace(out: str, stamps) -> Path:
    """The stamps as JSON beside ``out`` (``<out without .json>.trace.json``): ns from the
    earliest stamp (``origin_ns``), written under a temporary name, then renamed."""
    t0 = min(v for b in stamps for r in b for v in r)
    path = Path(out[:-len(".json")] + ".trace.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps({"fields": ["start", "end", "issued"], "origin_ns": t0, "ns_per_unit": 1,
                               "stamps": [[[v - t0 for v in r] for r in b] for b in stamps]}, separators=(",", ":")))
    os.replace(tmp, path)
    return path


def settings(a, chain) -> dict:
    return {"stages": a.stages, "math": a.math, "deal": a.deal, "order": a.order, "skip": a.skip,
            "l2_ahead": a.l2_ahead, "l2_how": a.l2_how, "blocks": chain.blocks, "acc_rows": chain.acc_rows,
            "smem_bytes_per_block": chain.smem_bytes, "nvcc_flags": list(build_flags(**variant(a)))}


def main(argv=None) -> int:
    return probe_harness.main(argv, parse_args, StreamChain, settings, lambda a, meta: (
        f"the chain of {a.layers} layers, M = 2, one CUDA launch of {meta['blocks']} blocks, {a.stages} stages, "
        f"{a.math}"))


if __name__ == "__main__":
    sys.exit(main())

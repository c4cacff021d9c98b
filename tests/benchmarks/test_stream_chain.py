"""benchmarks/stream_chain.py (the probe of inference change 33, issue #18): the refusals of bad
arguments (exit 2, naming the argument, before any work or file), the bound on the kernel's
shared-memory accumulator against the kernel's own split of every phase, and, where ``nvcc`` is
installed, the kernel's build (no local memory, cached by the source's hash). On a GPU: the
whole command against F.linear's chain, and a kernel with one line changed caught by it."""

from __future__ import annotations

import shutil
import sys

import pytest
from probe_runs import BENCH, refused, run_changed, run_gpu

SCRIPT = BENCH / "stream_chain.py"
sys.path.insert(0, str(BENCH))

from persistent_chain import SHAPES, chain_sites  # noqa: E402
from stream_chain import BARRIERS, MATH, PIECE, acc_rows, build  # noqa: E402

NVCC = shutil.which("nvcc")


def shares(total: int, blocks: int, interleave: bool):
    """The kernel's ``Share``: each block's pieces (segment-major positions q) of a phase."""
    if interleave:
        return [list(range(b, total, blocks)) for b in range(blocks)]
    return [list(range(total * b // blocks, total * (b + 1) // blocks)) for b in range(blocks)]


@pytest.mark.parametrize("interleave", [False, True], ids=["contiguous", "interleaved"])
@pytest.mark.parametrize("blocks", [1, 7, 66, 114, 132])
def test_every_piece_dealt_once_within_the_slots(blocks, interleave):
    """The kernel deals each phase's ``N * S`` pieces (q: segment q // N of row q % N) to the blocks:
    every piece to exactly one block, and no block more than ``acc_rows`` of them (its
    accumulator's slots, one a piece)."""
    bound = acc_rows(SHAPES["qwen3-8b"], blocks)
    for _, n, k in chain_sites(*SHAPES["qwen3-8b"]):
        total = n * (k // PIECE)
        dealt = shares(total, blocks, interleave)
        assert sorted(q for qs in dealt for q in qs) == list(range(total))
        assert max(map(len, dealt)) <= bound
    assert bound == max(-(-n * (k // PIECE) // blocks) for _, n, k in chain_sites(*SHAPES["qwen3-8b"]))


@pytest.mark.parametrize("args, needle", [
    (("--device", "cpu"), "--device cpu"),
    (("--stages", "0"), "--stages"),
    (("--stages", "7"), "--stages"),
    (("--producer-sleep", "-1"), "--producer-sleep"),
    (("--math", "groups", "--stages", "9"), "--stages must be even"),
    (("--math", "quads", "--stages", "20"), "--stages must be a multiple of 8 with --math quads"),
    (("--quad-pieces", "2"), "--quad-pieces 2: only with --math quads"),
    (("--deal", "claimed"), "--deal claimed: only with --math quads"),
    (("--math", "quads", "--deal", "claimed", "--order", "interleaved"), "--order interleaved"),
    (("--math", "quads", "--deal", "any"), "--deal"),
    (("--barrier", "none"), "--barrier"),
    (("--math", "quads", "--quad-pieces", "3"), "--quad-pieces"),
    (("--stages", "27"), "--stages"),
    (("--layers", "0"), "--layers"),
    (("--blocks", "0"), "--blocks"),
    (("--nvcc", "/nonexistent/nvcc"), "--nvcc"),
    (("--systems", "cuda,bogus"), "--systems"),
    (("--reps", "0"), "--reps"),
    (("--skip", "all"), "--skip"),
    (("--math", "wgmma"), "--math"),
    (("--l2-ahead", "-1"), "--l2-ahead"),
    (("--l2-ahead", "65"), "--l2-ahead"),
    (("--l2-how", "copy"), "--l2-how copy: only with --l2-ahead"),
    (("--l2-ahead", "8", "--l2-how", "load"), "--l2-how"),
    (("--math", "tiles"), "--math"),  # removed after the twenty-seventh session (at f1f4519)
    (("--math", "mma"), "--math"),
])
def test_bad_arguments_are_refused(tmp_path, args, needle):
    assert needle in refused(SCRIPT, tmp_path, *args)


def test_build_dir_that_is_a_file_is_refused(tmp_path):
    f = tmp_path / "file"
    f.write_text("")
    # an executable --nvcc (checked before --build-dir) where no nvcc is installed
    assert "--build-dir" in refused(SCRIPT, tmp_path, "--nvcc", sys.executable, "--build-dir", str(f))


@pytest.fixture(scope="module")
def default_builds(tmp_path_factory):
    """One folder for the default variant of each form, built once (nvcc, seconds) for the tests
    that build it or compare a variant's library with it."""
    return tmp_path_factory.mktemp("stream_chain_build")


@pytest.mark.skipif(NVCC is None, reason="needs nvcc")
@pytest.mark.parametrize("form", sorted(MATH))
def test_kernel_builds_without_local_memory_and_is_cached(default_builds, form):
    tmp_path = default_builds
    so = build(NVCC, str(tmp_path), form=form)
    report = so.with_suffix(".ptxas.txt").read_text()
    assert "stream_chain_kernel" in report
    assert "0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads" in report, report
    mtime = so.stat().st_mtime_ns
    assert build(NVCC, str(tmp_path), form=form) == so and so.stat().st_mtime_ns == mtime  # not rebuilt
    assert not list(tmp_path.glob(".stream_chain-*"))  # no temporary left


@pytest.mark.gpu
@pytest.mark.parametrize("form", sorted(MATH))
def test_gpu_run_every_system_matches_torch(tmp_path, form):
    run_gpu(tmp_path, "stream_chain", "--math", form, "--build-dir", str(tmp_path / "build"), tol=1e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("barrier", ["fenced", "tree", "acq_rel"])
def test_gpu_run_quads_claimed_matches_torch(tmp_path, barrier):
    run_gpu(tmp_path, "stream_chain", "--math", "quads", "--deal", "claimed", "--barrier", barrier,
            "--build-dir", str(tmp_path / "build"), tol=1e-2)


@pytest.mark.skipif(NVCC is None, reason="needs nvcc")
@pytest.mark.parametrize("barrier", [b for b in BARRIERS if b != "fenced"])
def test_barrier_variants_build_without_local_memory(tmp_path, barrier):
    report = build(NVCC, str(tmp_path), form="quads", barrier=barrier).with_suffix(".ptxas.txt").read_text()
    assert "0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads" in report, report


def test_l2_ahead_is_a_build_variant_of_its_own():
    from argparse import Namespace

    from stream_chain import build_flags, variant

    assert not any("L2_AHEAD" in f for f in build_flags("quads"))  # the default builds stay as they were
    a = Namespace(math="quads", producer_sleep=64, quad_pieces=4, barrier="fenced", l2_ahead=16, l2_how="hint")
    assert variant(a)["l2_ahead"] == 16 and "-DL2_AHEAD=16" in build_flags(**variant(a))
    assert "-DL2_COPY=1" not in build_flags(**variant(a))
    a.l2_how = "copy"
    assert "-DL2_COPY=1" in build_flags(**variant(a))


@pytest.mark.skipif(NVCC is None, reason="needs nvcc")
@pytest.mark.parametrize("how", ["hint", "copy"])
@pytest.mark.parametrize("form", sorted(MATH))
def test_l2_ahead_builds_without_local_memory(tmp_path, default_builds, form, how):
    so = build(NVCC, str(tmp_path), form=form, l2_ahead=16, l2_how=how)
    report = so.with_suffix(".ptxas.txt").read_text()
    assert "0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads" in report, report
    assert so.name != build(NVCC, str(default_builds), form=form).name  # a library of its own


@pytest.mark.gpu
@pytest.mark.parametrize("how", ["hint", "copy"])
@pytest.mark.parametrize("form", ["cores", "quads", "claimed"])
def test_gpu_run_with_l2_ahead_matches_torch(tmp_path, form, how):
    deal = ("--math", "quads", "--deal", "claimed") if form == "claimed" else ("--math", form)
    run_gpu(tmp_path, "stream_chain", *deal, "--l2-ahead", "16", "--l2-how", how, "--build-dir",
            str(tmp_path / "build"), tol=1e-2)


def claimed_producer(claims, batches, ahead, groups, log):
    """A model of the kernel's producer loop under ``--deal claimed`` with ``--l2-ahead`` (the
    ``c.claims`` branch of stream_chain_kernel, CLAIM_AHEAD = ``ahead`` batches): a generator
    that yields before each atomic on the claim counters, so that several blocks interleave, and
    logs ``(phase, batch)`` for each batch it copies and ``(phase, None)`` for each end set."""
    pre_b0 = pre_n = 0
    for s, n in enumerate(batches):
        pre = 0

        def claim():
            nonlocal pre
            if pre < pre_n:
                pre += 1
                return pre_b0 + pre - 1
            yield
            claims[s] += 1
            return claims[s] - 1

        b = yield from claim()
        ends = 0
        while ends < groups:
            nxt = (yield from claim()) if b < n else b
            if b >= n and ends == 0 and s + 1 < len(batches) and ahead:
                yield
                pre_b0, claims[s + 1] = claims[s + 1], claims[s + 1] + ahead
                pre_n = max(0, min(ahead, batches[s + 1] - pre_b0))
            if b >= n:
                log.append((s, None))
                ends += 1
                continue
            log.append((s, b))
            b = nxt


@pytest.mark.parametrize("ahead", [0, 1, 4, 16])
@pytest.mark.parametrize("seed", range(4))
def test_claimed_look_ahead_deals_every_batch_once(ahead, seed):
    """Under any interleaving of the blocks' claims, each phase's batches are copied exactly
    once over all blocks, the ones a block claimed ahead at a phase's end included, and every
    block ends every phase with one end set a group of consumer warps."""
    import random

    rng = random.Random(seed)
    batches, blocks, groups = [1536, 1024, 6144, 3072, 5, 1536], 7, 2
    claims = [0] * len(batches)
    logs = [[] for _ in range(blocks)]
    running = [claimed_producer(claims, batches, ahead, groups, log) for log in logs]
    while running:
        g = rng.choice(running)
        try:
            next(g)
        except StopIteration:
            running.remove(g)
    for s, n in enumerate(batches):
        dealt = sorted(b for log in logs for t, b in log if t == s and b is not None)
        assert dealt == list(range(n)), (s, len(dealt), n)
    for log in logs:
        phases = [t for t, _ in log]
        assert phases == sorted(phases)  # a block's sets in phase order
        assert all(sum(1 for t, b in log if t == s and b is None) == groups for s in range(len(batches)))
    # the kernel's lines the model mirrors
    src = (BENCH / "stream_chain.cu").read_text()
    for line in ("return pre < pre_n ? pre_b0 + pre++ : (int)atomicAdd(&c.claims[s], 1u);",
                 "const int next = b < batches ? claim() : b;",
                 "if (b >= batches && ends == 0 && s + 1 < phases) {",
                 "pre_b0 = (int)atomicAdd(&c.claims[s + 1], (unsigned)CLAIM_AHEAD);"):
        assert src.count(line) == 1, line


def test_tree_constants_match_the_kernel():
    import re

    from stream_chain import BAR_STRIDE, BAR_WORDS, TREE_BLOCKS

    src = (BENCH / "stream_chain.cu").read_text()
    assert int(re.search(r"#define TREE_BLOCKS (\d+)", src).group(1)) == TREE_BLOCKS
    assert int(re.search(r"#define BAR_STRIDE (\d+)", src).group(1)) == BAR_STRIDE
    assert BAR_STRIDE * 4 == 128 and BAR_WORDS % BAR_STRIDE == 0  # a 128-byte line a counter
    assert BAR_WORDS // BAR_STRIDE - 1 >= -(-144 // TREE_BLOCKS)  # first-level counters for any Hopper's blocks


# Each form's check can fail: its kernel with one line changed (in a copy) must be far from
# F.linear's chain. cores: the warp's sums without their last exchange (the odd lanes' halves left
# out); groups: each warp's second sum without its exchanges across the warp; quads: the wrong
# entries of C taken as the sums.
CORRUPTIONS = {
    "cores": ("v[0] += __shfl_xor_sync(0xffffffffu, v[0], 1);", "v[0] += 0.f;"),
    "groups": ("s1 += __shfl_xor_sync(0xffffffffu, s1, off);", "s1 += 0.f;"),
    "quads": ("const bool useful = (t & 1) == (j >> 1);", "const bool useful = (t & 1) == (j & 1);"),
}


def test_every_form_has_a_corruption():
    assert set(CORRUPTIONS) == set(MATH)
    src = (BENCH / "stream_chain.cu").read_text()
    assert all(src.count(old) == 1 for old, _ in CORRUPTIONS.values())  # each line changed is there, once


@pytest.mark.gpu
@pytest.mark.parametrize("form", sorted(CORRUPTIONS))
def test_gpu_run_catches_a_corrupted_line(tmp_path, form):
    old, new = CORRUPTIONS[form]
    rows = run_changed(tmp_path, "stream_chain", old, new, "--math", form, "--layers", "3", "--reps", "2",
                       "--systems", "cuda", "--build-dir", str(tmp_path / "build"), kernel="stream_chain.cu",
                       beside=("persistent_chain.py",), gpu=True)
    assert rows["cuda"]["rel_err_vs_torch"] > 0.3


def test_stats_lines_give_means_maxima_and_shares():
    from stream_chain import STAT_NAMES, stats_lines

    rows = [[1000, 100, 300, 1000, 500], [2000, 300, 100, 2000, 0]]
    lines = stats_lines(rows).splitlines()
    assert len(lines) == 1 + len(STAT_NAMES)
    grid = next(line for line in lines if "grid-barrier" in line).split()
    assert grid[-4:] == ["200", "/", "300", "13.3%"]  # mean 200 of a mean run of 1500 cycles
    empty = next(line for line in lines if "empty-stage" in line).split()
    assert empty[-4:] == ["250", "/", "500", "16.7%"]  # against the producer's run


def test_stats_lines_without_a_run():
    from stream_chain import stats_lines

    assert stats_lines([[0, 0, 0, 0, 0]]).count("n/a") == 5


def synthetic_stamps(blocks=3, layers=3):
    """Stamps (ns) of a made-up run: phase s of block b starts at 1000 s + 10 b, ends 600 ns later
    (block 2 another 200 ns later, the last to end), its producer done 300 ns before the start."""
    stamps = []
    for b in range(blocks):
        rows = []
        for s in range(4 * layers):
            start = 1000 * s + 10 * b
            rows.append([start, start + 600 + (200 if b == 2 else 0), start - 300])
        stamps.append(rows)
    return stamps


def test_trace_summary_reads_the_stamps():
    from stream_chain import PHASES, trace_summary

    rows = trace_summary(synthetic_stamps())
    assert [r["phase"] for r in rows] == list(PHASES)
    for r in rows:
        assert r["wall"] == pytest.approx(1.0)  # every phase's last end 1000 ns after the one before
        assert r["busy"] == pytest.approx((600 + 600 + 800) / 3 / 1e3)
        assert r["late"] == pytest.approx((820 - 610) / 1e3)  # block 2's end after the median (block 1)
        assert r["wait"] == pytest.approx((400 + 400 + 200) / 3 / 1e3)  # start - own previous end
        assert r["lead"] == pytest.approx(0.3)
        assert r["barrier"] == pytest.approx((1000 - 820) / 1e3)  # block 0's start after block 2's previous end
        assert (r["last"], r["last_share"]) == (2, 1.0)


def test_trace_lines_and_file(tmp_path):
    import json

    from stream_chain import trace_lines, write_trace

    from stream_chain import read_trace

    lines = trace_lines(synthetic_stamps()).splitlines()
    assert len(lines) == 2 + 4 + 1 and lines[-1].split()[:2] == ["layer", "4.00"]
    stamps = [[[v + 10 ** 12 for v in r] for r in b] for b in synthetic_stamps()]  # a global timer's values
    path = write_trace(str(tmp_path / "run.json"), stamps)
    assert path == tmp_path / "run.trace.json"
    assert json.loads(path.read_text())["origin_ns"] == 10 ** 12 - 300
    assert trace_lines(read_trace(path)) == trace_lines(stamps)  # the same summary from the file
    assert [p.name for p in tmp_path.iterdir()] == ["run.trace.json"]  # no temporary left

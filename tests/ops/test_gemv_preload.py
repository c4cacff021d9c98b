"""W_O's GEMV with its weight preloaded into shared memory (orthros.ops.gemv.preload, CUDA C++):
where it applies, its refusals and its build on the CPU (the build and the kernel's own sizing
where nvcc is present); on a GPU, the kernel against the float64 product at every instantiated
K, the W_O site through the Triton GEMV's entry against the Triton kernel, and the kernel behind
a PDL-launched Triton GEMV inside a CUDA graph, replayed on new inputs."""

import ctypes
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

from orthros.ops.gemv import gemv, preload  # noqa: E402
from conftest import rel  # noqa: E402

gpu = pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
nvcc = pytest.mark.skipif(shutil.which(os.environ.get("ORTHROS_NVCC") or "nvcc") is None, reason="needs nvcc")


def test_applies_only_to_a_plain_pdl_launch_of_at_most_two_bf16_rows(monkeypatch):
    monkeypatch.setattr(preload, "PIECES", 12)
    ok = dict(pdl=True, plain=True)
    assert preload.applies(2, 4096, torch.bfloat16, **ok) and preload.applies(1, 2048, torch.bfloat16, **ok)
    assert not preload.applies(2, 4096, torch.bfloat16, pdl=False, plain=True)  # nothing to overlap
    assert not preload.applies(2, 4096, torch.bfloat16, pdl=True, plain=False)  # a bias or a prologue
    assert not preload.applies(3, 4096, torch.bfloat16, **ok)
    assert not preload.applies(2, 4000, torch.bfloat16, **ok)  # no kernel for this K
    assert not preload.applies(2, 4096, torch.float16, **ok)
    monkeypatch.setattr(preload, "PIECES", 0)
    assert not preload.applies(2, 4096, torch.bfloat16, **ok)


def test_off_by_default_and_the_merge_signals_as_before():
    """Off unless asked for; with it the split kernel drops the stages its loop cannot use (capped
    at its trips), and the merge ahead signals early only when asked for
    (ORTHROS_GEMV_PRELOAD_EARLY=1); each of them switched on its own too."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("ORTHROS_GEMV_PRELOAD") and k != "ORTHROS_QKV_FIT_STAGES"}
    code = "from orthros.ops.gemv import preload as p; print(p.PIECES, p.EARLY_COMBINE, p.FIT_STAGES)"

    def seen(**kw):
        return subprocess.run([sys.executable, "-c", code], env={**env, **kw}, capture_output=True, text=True,
                              check=True).stdout.split()

    assert seen() == ["0", "False", "False"]
    assert seen(ORTHROS_QKV_FIT_STAGES="1") == ["0", "False", "True"]
    assert seen(ORTHROS_GEMV_PRELOAD="12") == ["12", "False", "True"]
    assert seen(ORTHROS_GEMV_PRELOAD="12", ORTHROS_GEMV_PRELOAD_EARLY="1") == ["12", "True", "True"]
    assert seen(ORTHROS_GEMV_PRELOAD_EARLY="1") == ["0", "False", "False"]
    assert seen(ORTHROS_GEMV_PRELOAD="12", ORTHROS_QKV_FIT_STAGES="0") == ["12", "False", "False"]


@pytest.mark.parametrize("var,value", [("ORTHROS_GEMV_PRELOAD", "-1"), ("ORTHROS_GEMV_PRELOAD", "twelve"),
                                       ("ORTHROS_GEMV_PRELOAD_GROUP", "3"), ("ORTHROS_GEMV_PRELOAD_GROUP", "two")])
def test_bad_setting_refused_at_import_naming_the_variable(var, value):
    env = dict(os.environ, **{var: value})
    p = subprocess.run([sys.executable, "-c", "import orthros.ops.gemv.preload"], env=env, capture_output=True,
                       text=True)
    assert p.returncode != 0 and var in p.stderr and value in p.stderr, p.stderr[-500:]


def test_a_step_takes_two_pieces_unless_the_ring_is_smaller():
    """The pieces a consumer warp takes a step: ORTHROS_GEMV_PRELOAD_GROUP (default 2), never more
    than the ring's slots (a step holds every slot it waits on)."""
    assert preload.GROUP == int(os.environ.get("ORTHROS_GEMV_PRELOAD_GROUP", "2"))
    assert preload._group(None, 12) == preload.GROUP and preload._group(1, 12) == 1
    assert preload._group(2, 1) == 1 and preload._group(2, 2) == 2


def test_build_without_nvcc_names_the_setting_and_writes_nothing(tmp_path):
    with pytest.raises(RuntimeError, match="ORTHROS_NVCC"):
        preload.build(nvcc=str(tmp_path / "no-nvcc"), out_dir=tmp_path / "k")
    assert not (tmp_path / "k").exists()


def test_layout_gives_whole_rows_to_at_most_one_block_a_multiprocessor(monkeypatch):
    monkeypatch.setattr(preload, "num_sms", lambda dev: 132)
    assert preload.layout(4096, None) == (32, 128)
    rows, blocks = preload.layout(1000, None)
    assert blocks <= 132 and rows * blocks >= 1000 and rows * (blocks - 1) < 1000


@nvcc
def test_kernels_read_the_kernel_aheads_output_through_coherent_loads(tmp_path):
    """Launched early (PDL), the kernels run while the kernel ahead still writes ``x`` (or the split
    partials): a load of it through the non-coherent path (``LDG.E...CONSTANT``, what nvcc emits for
    a ``const __restrict__`` pointer) may see stale lines. It did: NaN logits with the early merge
    signal on an H100 (docs/performance.md, change 39's "Measured"). Only the weight, which no kernel
    writes, may take that path, and the kernels read it with bulk copies."""
    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not tool.exists():
        pytest.skip("no cuobjdump in this triton wheel")
    sass = subprocess.run([str(tool), "-sass", str(preload.build(out_dir=tmp_path))], capture_output=True, text=True,
                          check=True).stdout
    kernels = sass.split("Function : ")[1:]
    assert len(kernels) == 18 and all("LDG" in k for k in kernels)  # 12 plain, 6 merge instantiations
    assert not [k.split()[0] for k in kernels if re.search(r"LDG\S*CONSTANT", k)]


@nvcc
def test_built_kernel_sizes_its_shared_memory_as_the_host_does(tmp_path):
    """Built by nvcc (no GPU needed to build or to call the sizing functions)."""
    so = preload.build(out_dir=tmp_path)
    assert so.exists() and (tmp_path / (so.stem + ".ptxas.txt")).exists()
    assert not list(tmp_path.glob(".preload-*"))  # the temporary name renamed
    assert preload.build(out_dir=tmp_path) == so  # built once per source and flags
    lib = ctypes.CDLL(str(so))
    lib.wo_preload_smem_bytes.restype = ctypes.c_longlong
    for M, K, rows, pieces in [(2, 4096, 32, 12), (1, 2048, 8, 1), (2, 8192, 31, 5)]:
        assert lib.wo_preload_smem_bytes(M, K, rows, pieces) == preload.smem_bytes(M, K, rows, pieces)
    for M in (1, 2):
        for K in preload.KS:
            assert lib.wo_preload_supports(M, K) == 0
    assert lib.wo_preload_supports(3, 4096) == -1 and lib.wo_preload_supports(2, 4000) == -1


def _case(M, N, K, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(M, K, generator=g).to("cuda", torch.bfloat16),
            (torch.randn(N, K, generator=g) * 0.05).to("cuda", torch.bfloat16))


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("group", [1, 2])
@pytest.mark.parametrize("pieces", [1, 5, 12])
@pytest.mark.parametrize("N", [4096, 1000])
@pytest.mark.parametrize("K", list(preload.KS))
@pytest.mark.parametrize("M", [1, 2])
def test_gpu_kernel_matches_float64(M, K, N, pieces, group):
    x, w = _case(M, N, K, seed=M * 31 + K + N + pieces)
    part = torch.full((1, M, N), float("nan"), device="cuda")
    preload.launch(x, w, part, x.stride(0), pdl=False, pieces=pieces, group=group)
    torch.cuda.synchronize()
    assert rel(part[0], x.double() @ w.double().T) < 1e-5


@gpu
@pytest.mark.gpu
def test_gpu_w_o_site_as_the_triton_kernel_computes_it(monkeypatch):
    """Qwen3-8B's o-projection of the pair (M = 2, PDL on) with its residual and the output's
    norm: through the preload the same ``y`` and ``yn`` up to the float32 sums' order."""
    from orthros.ops.triton.common import PDL_MIN_M, pdl_kwargs

    if not pdl_kwargs(torch.device("cuda")) or PDL_MIN_M > 2:
        pytest.skip("the preload needs PDL launches of 2-row GEMVs")
    x, w = _case(2, 4096, 4096, seed=7)
    res = torch.randn(2, 4096, device="cuda", dtype=torch.bfloat16) * 4
    onw = torch.rand(4096, device="cuda", dtype=torch.bfloat16) + 0.5
    kw = dict(backend="triton", residual=res, out_norm_weight=onw, out_norm_eps=1e-6)
    monkeypatch.setattr(preload, "PIECES", 0)
    y0, yn0 = gemv(x, w, **kw)
    monkeypatch.setattr(preload, "PIECES", 12)
    calls = []
    real = preload.launch
    monkeypatch.setattr(preload, "launch", lambda *a, **k: calls.append(1) or real(*a, **k))
    y1, yn1 = gemv(x, w, **kw)
    assert calls, "the W_O site did not take the preload kernel"
    for a, b in ((y1, y0), (yn1, yn0)):
        assert rel(a, b) < 1e-2 and (a == b).float().mean() > 0.95


@gpu
@pytest.mark.gpu
def test_gpu_behind_a_pdl_gemv_in_a_cuda_graph(monkeypatch):
    """x is made by a PDL-launched Triton GEMV right ahead; the preload kernel (PDL) must wait for
    it: replays with new inputs give the eager float64 chain's result."""
    from orthros.ops.triton.common import PDL_MIN_M, pdl_kwargs

    if not pdl_kwargs(torch.device("cuda")) or PDL_MIN_M > 2:
        pytest.skip("the preload needs PDL launches of 2-row GEMVs")
    monkeypatch.setattr(preload, "PIECES", 12)
    x0, w0 = _case(2, 4096, 4096, seed=1)
    _, w = _case(2, 4096, 4096, seed=2)
    res = torch.zeros(2, 4096, device="cuda", dtype=torch.bfloat16)
    onw = torch.ones(4096, device="cuda", dtype=torch.bfloat16)

    def chain():
        x = gemv(x0, w0, backend="triton")
        return gemv(x, w, backend="triton", residual=res, out_norm_weight=onw, out_norm_eps=1e-6)[0]

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        chain()  # build and compile outside the capture
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = chain()
    for seed in (3, 4, 5):
        x0.copy_(_case(2, 4096, 4096, seed=seed)[0])
        g.replay()
        torch.cuda.synchronize()
        want = (gemv(x0, w0, backend="naive").double() @ w.double().T)
        assert rel(out, want) < 1e-2


@nvcc
def test_built_merge_kernel_sizes_its_shared_memory_as_the_host_does(tmp_path):
    lib = ctypes.CDLL(str(preload.build(out_dir=tmp_path)))
    lib.wo_merge_smem_bytes.restype = ctypes.c_longlong
    for heads, pieces in [(4, 12), (2, 1), (8, 6)]:
        assert lib.wo_merge_smem_bytes(heads, pieces) == preload.merge_smem_bytes(heads, pieces)


def test_merge_layout_covers_every_row_in_whole_pieces(monkeypatch):
    monkeypatch.setattr(preload, "num_sms", lambda dev: 132)
    for N, HQ, heads in [(4096, 32, 4), (4096, 32, 8), (1000, 16, 2)]:
        rows, groups = preload.merge_layout(N, HQ, heads, None)
        assert rows % preload.PIECE_ROWS == 0 and rows * groups >= N and rows * (groups - 1) < N
        assert (HQ // heads) * groups <= 132
    assert preload.merge_layout(4096, 32, 4, None) == (256, 16)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("group", [1, 2])
@pytest.mark.parametrize("pieces", [1, 3, 12])
@pytest.mark.parametrize("heads", [2, 4, 8])
@pytest.mark.parametrize("S,N", [(16, 4096), (5, 1000), (1, 264)])
def test_gpu_merge_kernel_matches_the_torch_merge_then_the_product(S, N, heads, pieces, group):
    """The decode kernel's partials (a split without keys among them: lse -inf), merged and rounded
    to bf16 as the merge launch does, times each K slice of the weight."""
    import math

    from orthros.ops.merge import merge_partials

    HQ, D = 16, preload.HEAD_DIM
    g = torch.Generator().manual_seed(S * 100 + N + heads)
    op = torch.randn(1, 2, HQ, S, D, generator=g).cuda()
    lp = (torch.randn(1, 2, HQ, S, generator=g) * 3).cuda()
    if S > 1:
        lp[0, 0, :, -1] = float("-inf")  # the window row: a split past its keys
    w = (torch.randn(N, HQ * D, generator=g) * 0.05).to("cuda", torch.bfloat16)
    part = torch.full((HQ // heads, 2, N), float("nan"), device="cuda")
    preload.launch_merge(op, lp, w, part, heads=heads, pieces=pieces, pdl=False, group=group)
    torch.cuda.synchronize()
    x, _ = merge_partials(op[0].movedim(-2, 0), lp[0].movedim(-1, 0) * math.log(2.0))  # [2, HQ, D]
    x = x.to(torch.bfloat16).double().reshape(2, HQ // heads, heads * D)
    want = torch.einsum("msk,nsk->smn", x, w.double().reshape(N, HQ // heads, heads * D))
    assert rel(part, want) < 1e-4


def _partials(B=1, HQ=8, S=3, D=128, seed=0, device="cpu"):
    from orthros.ops.merge import SplitPartials

    g = torch.Generator().manual_seed(seed)
    lse = torch.randn(B, 2, HQ, S, generator=g) * 2
    lse[:, 0, :, -1] = float("-inf")
    return SplitPartials(torch.randn(B, 2, HQ, S, D, generator=g).to(device), lse.to(device))


def test_split_partials_merge_is_the_exact_merge():
    """SplitPartials.merge against the softmax over the concatenated splits' scores, built so: the
    split s of a row holds o_s with weight 2^lse_s."""
    p = _partials(HQ=2, S=4, D=8)
    w = torch.exp2(p.lse).nan_to_num(0.0)
    want = (w.unsqueeze(-1) * p.o).sum(-2) / w.sum(-1, keepdim=True)
    assert torch.allclose(p.merge(torch.float32), want, atol=1e-5)


def test_gemv_of_split_partials_off_the_kernel_merges_in_torch_first():
    p = _partials(HQ=2, D=128, seed=3)
    w = torch.randn(16, 256, dtype=torch.float32)
    res = torch.randn(1, 2, 16)
    y = gemv(p, w, backend="auto", residual=res)
    assert torch.equal(y, gemv(p.merge(torch.float32).flatten(-2), w, backend="auto", residual=res))
    with pytest.raises(ValueError, match="^x: split partials"):
        gemv(p, w, backend="triton")


def test_split_partials_refused_where_only_one_stream_is_kept_or_merge_is_not_a_bool():
    from orthros.engine.cache import DecodeView
    from orthros.ops.decode import orthros_decode_qkv_attention

    view = DecodeView.__new__(DecodeView)
    with pytest.raises(ValueError, match="keep must be"):
        view.attend_qkv(0, None, keep=(False, True), backend="auto", merge=False)
    with pytest.raises(ValueError, match="merge must be True or False"):
        orthros_decode_qkv_attention(None, None, None, None, num_heads=1, rope=None, window_size=1, merge="no")


def test_the_merge_is_deferred_only_where_the_kernel_takes_it(monkeypatch):
    monkeypatch.setattr(preload, "MERGE", True)
    assert not preload.defers_merge(1, 32, 128, torch.bfloat16, torch.device("cpu"))  # a CUDA device only
    monkeypatch.setattr(preload, "MERGE", False)
    assert not preload.defers_merge(1, 32, 128, torch.bfloat16, torch.device("cuda", 0))
    p = _partials(HQ=8)
    assert not preload.merged_takes(p.o, p.lse, torch.zeros(4, 8 * 128, dtype=torch.bfloat16))


@gpu
@pytest.mark.gpu
def test_gpu_decode_partials_through_the_merge_form_as_through_the_merge_launch(monkeypatch):
    """The decode kernel's partials (merge=False) into W_O's merge form: the same y and yn as the
    merge launch then the Triton W_O GEMV, up to the float32 sums' order."""
    from orthros.ops.decode import orthros_decode_qkv_attention
    from orthros.ops.merge import SplitPartials

    monkeypatch.setattr(preload, "PIECES", 12)
    monkeypatch.setattr(preload, "MERGE", True)
    dev = torch.device("cuda")
    if not preload.defers_merge(1, 32, 128, torch.bfloat16, dev):
        pytest.skip("the merge form needs PDL launches of 2-row GEMVs")
    g = torch.Generator().manual_seed(0)
    H, HKV, D, L = 32, 8, 128, 1100
    qkv = torch.randn(1, 2, (H + 2 * HKV) * D, generator=g).to(dev, torch.bfloat16)
    kc = torch.randn(1, 2048, HKV, D, generator=g).to(dev, torch.bfloat16)
    vc = torch.randn(1, 2048, HKV, D, generator=g).to(dev, torch.bfloat16)
    lens = torch.tensor([L], device=dev)
    pos = torch.arange(D // 2, device=dev) / (D // 2)
    rope = (torch.cos(pos).repeat(2).view(1, 1, D).to(torch.bfloat16), torch.sin(pos).repeat(2).view(1, 1, D)
            .to(torch.bfloat16))
    kw = dict(num_heads=H, q_rows=(0, 1), rope=rope, window_size=128, backend="triton")
    merged = orthros_decode_qkv_attention(qkv, kc.clone(), vc.clone(), lens, **kw)
    p = orthros_decode_qkv_attention(qkv, kc.clone(), vc.clone(), lens, merge=False, **kw)
    assert isinstance(p, SplitPartials) and p.o.shape[3] > 1
    assert rel(p.merge(torch.bfloat16), merged) < 1e-2
    w = (torch.randn(4096, H * D, generator=g) * 0.05).to(dev, torch.bfloat16)
    res = torch.randn(1, 2, 4096, device=dev, dtype=torch.bfloat16)
    onw = torch.rand(4096, device=dev, dtype=torch.bfloat16) + 0.5
    monkeypatch.setattr(preload, "PIECES", 0)  # the merge launch's rows through the Triton GEMV
    want = gemv(merged.flatten(2), w, backend="triton", residual=res, out_norm_weight=onw, out_norm_eps=1e-6)
    monkeypatch.setattr(preload, "PIECES", 12)
    got = gemv(p, w, backend="triton", residual=res, out_norm_weight=onw, out_norm_eps=1e-6)
    for a, b in zip(got, want):
        assert rel(a, b) < 1e-2 and (a == b).float().mean() > 0.9


def _emulate_merge_kernel(op, lp, w, heads, rows_per_block, pieces, group):
    """``wo_merge_kernel`` of preload.cu, its index arithmetic transcribed statement by statement
    (block, thread, lane; the ring's slots; the merged rows' [r][j][lane] layout; ``group`` pieces
    a consumer step, past the last piece or row a slot's stale bytes, their sums dropped), with
    the arithmetic in float64: so an indexing slip in the CUDA source shows on a CPU too."""
    assert group <= pieces  # what the host keeps (preload._group): a step's slots are distinct
    MD, WARPS = preload.HEAD_DIM, 8
    _, _, HQ, S, _ = op.shape
    N, K = w.shape
    C, E = heads * MD, heads * MD // 32
    opf, lpf, wf = op.double().flatten(), lp.double().flatten(), w.double().flatten()
    out = torch.full((HQ // heads, 2, N), float("nan"), dtype=torch.float64)
    for s in range(HQ // heads):
        for gy in range(-(-N // rows_per_block)):
            row0 = gy * rows_per_block
            rows = min(rows_per_block, N - row0)
            npieces = -(-rows // WARPS)
            ring = torch.zeros(pieces * WARPS * C, dtype=torch.float64)
            xs = torch.zeros(2 * E * 32, dtype=torch.float64)
            for t in range(WARPS * 32):  # the merge
                for idx in range(t * 4, 2 * C, WARPS * 32 * 4):
                    r, c = idx // C, idx % C
                    h, d = s * heads + c // MD, c % MD
                    base = (r * HQ + h) * S
                    lse = lpf[base:base + S]
                    mx = lse.max()
                    ms = 0.0 if mx == float("-inf") else mx
                    wt = torch.exp2(lse - ms)
                    den = wt.sum()
                    v = torch.stack([opf[(base + k) * MD + d:(base + k) * MD + d + 4] for k in range(S)])
                    o = (v * wt[:, None]).sum(0) / (den if den > 0 else 1.0)
                    for q in range(4):
                        xs[(r * E + (c + q) % E) * 32 + (c + q) // E] = o[q].to(torch.bfloat16).double()
            for i0 in range(0, npieces, group):  # the producer's copies of a step's pieces, then the consumers'
                for i in range(i0, min(i0 + group, npieces)):
                    slot, r0 = i % pieces, i * WARPS
                    for r in range(min(WARPS, rows - r0)):
                        src = (row0 + r0 + r) * K + s * C
                        ring[(slot * WARPS + r) * C:(slot * WARPS + r + 1) * C] = wf[src:src + C]
                for warp in range(WARPS):
                    acc = [[0.0, 0.0] for _ in range(group)]
                    for g in range(group):
                        for lane in range(32):
                            p = (((i0 + g) % pieces) * WARPS + warp) * C + lane * E
                            for m in range(2):
                                x = torch.stack([xs[(m * E + j) * 32 + lane] for j in range(E)])
                                acc[g][m] += float((ring[p:p + E] * x).sum())
                    for g in range(group):
                        row = (i0 + g) * WARPS + warp
                        if i0 + g < npieces and row < rows:
                            out[s, 0, row0 + row], out[s, 1, row0 + row] = acc[g]
    return out


def _emulate_plain_kernel(x, w, rows_per_block, pieces, group):
    """``wo_preload_kernel`` of preload.cu transcribed as above: block b's rows, the ring's slots,
    ``group`` rows a consumer step (stale slots past the last row, their sums dropped), warp c's
    columns and a lane's E of them, the row sums per warp in ``red`` and their sum at the end."""
    assert group <= pieces
    WARPS = 8
    M, K = x.shape
    N = w.shape[0]
    E = K // (32 * WARPS)
    xf, wf = x.double().flatten(), w.double().flatten()
    out = torch.full((M, N), float("nan"), dtype=torch.float64)
    for b in range(-(-N // rows_per_block)):
        row0 = b * rows_per_block
        rows = min(rows_per_block, N - row0)
        ring = torch.zeros(pieces * K, dtype=torch.float64)
        red = torch.full((rows_per_block * WARPS * M,), float("nan"), dtype=torch.float64)
        for i0 in range(0, rows, group):
            for i in range(i0, min(i0 + group, rows)):  # the producer's copies
                ring[(i % pieces) * K:(i % pieces + 1) * K] = wf[(row0 + i) * K:(row0 + i + 1) * K]
            for warp in range(WARPS):
                acc = [[0.0] * M for _ in range(group)]
                for g in range(group):
                    for lane in range(32):
                        col = warp * 32 * E + lane * E
                        p = ((i0 + g) % pieces) * K + col
                        for m in range(M):
                            acc[g][m] += float((ring[p:p + E] * xf[m * K + col:m * K + col + E]).sum())
                for g in range(group):
                    for m in range(M):
                        if i0 + g < rows:
                            red[((i0 + g) * WARPS + warp) * M + m] = acc[g][m]
        for t in range(rows * M):
            i, m = t // M, t % M
            out[m, row0 + i] = sum(red[(i * WARPS + c) * M + m] for c in range(WARPS))
    return out


@pytest.mark.parametrize("M,rows_per_block,pieces,group", [(2, 5, 2, 1), (2, 5, 2, 2), (1, 4, 3, 2), (2, 7, 1, 1)])
def test_plain_kernel_index_arithmetic_on_the_cpu(M, rows_per_block, pieces, group):
    N, K = 17, 2048
    g = torch.Generator().manual_seed(M * 10 + group)
    x, w = torch.randn(M, K, generator=g).to(torch.bfloat16), torch.randn(N, K, generator=g).to(torch.bfloat16)
    got = _emulate_plain_kernel(x, w, rows_per_block, pieces, group)
    assert torch.allclose(got, x.double() @ w.double().T, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("heads,rows_per_block,pieces,group", [(2, 24, 2, 1), (4, 16, 1, 1), (2, 24, 2, 2),
                                                               (4, 16, 3, 2), (4, 40, 3, 2)])
def test_merge_kernel_index_arithmetic_on_the_cpu(heads, rows_per_block, pieces, group):
    import math

    from orthros.ops.merge import merge_partials

    HQ, S, N, D = 4, 3, 40, preload.HEAD_DIM
    g = torch.Generator().manual_seed(heads)
    op = torch.randn(1, 2, HQ, S, D, generator=g)
    lp = torch.randn(1, 2, HQ, S, generator=g) * 2
    lp[0, 0, 1, :] = float("-inf")  # a head of the window row with no keys at all: zeros
    w = torch.randn(N, HQ * D, generator=g).to(torch.bfloat16)
    got = _emulate_merge_kernel(op, lp, w, heads, rows_per_block, pieces, group)
    x, _ = merge_partials(op[0].double().movedim(-2, 0), lp[0].double().movedim(-1, 0) * math.log(2.0))
    x = x.to(torch.bfloat16).double().reshape(2, HQ // heads, heads * D)
    want = torch.einsum("msk,nsk->smn", x, w.double().reshape(N, HQ // heads, heads * D))
    assert torch.allclose(got, want, rtol=1e-9, atol=1e-9)

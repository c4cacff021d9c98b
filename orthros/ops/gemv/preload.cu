// W_O's GEMV with its weight read into shared memory before its PDL wait (docs/performance.md,
// inference change 37; orthros/ops/gemv/preload.py builds and launches it).
//
// out[m, n] = sum_k x[m, k] * w[n, k] in float32, for M <= 2 rows and K = E * 32 * CONSUMER_WARPS
// (bf16). Block b owns the weight rows [b * R, (b + 1) * R), each row one contiguous piece of
// K * 2 bytes. One producer thread copies the pieces into a ring of `pieces` shared-memory slots
// with the bulk copy engine (cp.async.bulk, completing on the slot's "full" mbarrier); it reads
// nothing another kernel writes, so it starts as soon as the block is resident, before the
// consumers' griddepcontrol.wait: launched early behind the attention (PDL), the first `pieces`
// rows stream in while the attention still runs. The consumer warps wait for the kernel ahead,
// load x, then take every piece: warp c the columns [c * 32 * E, (c + 1) * 32 * E), a lane E of
// them, and release the slot ("empty" mbarrier, one arrive a warp). A warp takes G pieces a step
// (G <= the ring's slots), so the reductions of G rows interleave: a row's 5-step shuffle
// reduction is the step's longest dependent chain (docs/performance.md, inference change 39).
// The block's rows are summed over the warps at the end and written as float32.
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <stdint.h>

#define CONSUMER_WARPS 8
#define THREADS ((CONSUMER_WARPS + 1) * 32)

__device__ __forceinline__ uint32_t saddr(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(saddr(bar)), "r"(count));
}

__device__ __forceinline__ bool mbar_try(uint64_t* bar, uint32_t parity) {
    uint32_t ok;
    asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
                 : "=r"(ok) : "r"(saddr(bar)), "r"(parity) : "memory");
    return ok != 0;
}

__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
    while (!mbar_try(bar, parity)) {
    }
}

__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(saddr(bar)) : "memory");
}

// the producer's arrival on a slot's "full" barrier, expecting `bytes` from its copies
__device__ __forceinline__ void expect_bytes(uint64_t* bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(saddr(bar)), "r"(bytes) : "memory");
}

// `bytes` from global `src` into shared `dst` by the bulk copy engine, completing on `bar`
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 :: "r"(saddr(dst)), "l"(src), "r"(bytes), "r"(saddr(bar)) : "memory");
}

// the ring's barriers: "full" completes on the producer's arrival and its copies' bytes, "empty"
// on one arrival a consumer warp; the block waits until they are initialised
__device__ __forceinline__ void init_ring(uint64_t* full, uint64_t* empty, int pieces) {
    if (threadIdx.x == 0) {
        for (int i = 0; i < pieces; ++i) {
            mbar_init(&full[i], 1);
            mbar_init(&empty[i], CONSUMER_WARPS);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
}

__device__ __forceinline__ void unpack8(const uint4& v, float* f) {
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
    for (int t = 0; t < 4; ++t) {
        const float2 p = __bfloat1622float2(h[t]);
        f[2 * t] = p.x;
        f[2 * t + 1] = p.y;
    }
}

// the lane's E weights at p (bf16, 16-byte aligned) into registers
template <int E>
__device__ __forceinline__ void load_lane(const __nv_bfloat16* p, uint4 (&w)[E / 8]) {
#pragma unroll
    for (int j = 0; j < E / 8; ++j) w[j] = *reinterpret_cast<const uint4*>(p + 8 * j);
}

// acc[m] += the lane's E weights w times its E columns xr[m] of row m
template <int M, int E>
__device__ __forceinline__ void dot_lane(const uint4 (&w)[E / 8], const float (&xr)[M][E], float (&acc)[M]) {
#pragma unroll
    for (int j = 0; j < E / 8; ++j) {
        float wf[8];
        unpack8(w[j], wf);
#pragma unroll
        for (int t = 0; t < 8; ++t) {
#pragma unroll
            for (int m = 0; m < M; ++m) acc[m] = fmaf(wf[t], xr[m][8 * j + t], acc[m]);
        }
    }
}

// each acc[g][m] summed over the warp's lanes (every lane gets the sum); the G * M chains interleave
template <int G, int M>
__device__ __forceinline__ void warp_sum(float (&acc)[G][M]) {
#pragma unroll
    for (int off = 16; off; off >>= 1) {
#pragma unroll
        for (int g = 0; g < G; ++g) {
#pragma unroll
            for (int m = 0; m < M; ++m) acc[g][m] += __shfl_xor_sync(0xffffffffu, acc[g][m], off);
        }
    }
}

template <int M, int E, int G>
__global__ void __launch_bounds__(THREADS, 1)
wo_preload_kernel(const __nv_bfloat16* __restrict__ w, const __nv_bfloat16* __restrict__ x, float* __restrict__ out,
                  int N, long long sx, int rows_per_block, int pieces, int pdl) {
    constexpr int K = E * 32 * CONSUMER_WARPS;
    constexpr uint32_t PIECE_BYTES = K * 2;
    extern __shared__ __align__(128) unsigned char smem[];
    __nv_bfloat16* ring = reinterpret_cast<__nv_bfloat16*>(smem);
    uint64_t* full = reinterpret_cast<uint64_t*>(smem + static_cast<size_t>(pieces) * PIECE_BYTES);
    uint64_t* empty = full + pieces;
    float* red = reinterpret_cast<float*>(empty + pieces);  // [rows_per_block][CONSUMER_WARPS][M]
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int row0 = blockIdx.x * rows_per_block;
    const int rows = min(rows_per_block, N - row0);
    init_ring(full, empty, pieces);
    if (warp == CONSUMER_WARPS) {  // the producer: the weight is read-only, so no wait before its copies
        if (pdl) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
        if (lane == 0) {
            for (int i = 0; i < rows; ++i) {
                const int slot = i % pieces, round = i / pieces;
                if (round) mbar_wait(&empty[slot], (round - 1) & 1);
                expect_bytes(&full[slot], PIECE_BYTES);
                bulk_copy(ring + static_cast<size_t>(slot) * K, w + static_cast<size_t>(row0 + i) * K, PIECE_BYTES,
                          &full[slot]);
            }
        }
        return;
    }
    if (pdl) asm volatile("griddepcontrol.wait;" ::: "memory");  // x is the kernel ahead's output
    const int col = warp * 32 * E + lane * E;
    float xr[M][E];
#pragma unroll
    for (int m = 0; m < M; ++m) {
#pragma unroll
        for (int j = 0; j < E; j += 8) {
            // ld.global.cg: x is written by a grid that may still run when this one starts (PDL); the
            // non-coherent path a const __restrict__ load would take may hold stale lines (NaN logits
            // with the early merge signal on an H100, 2026-12-05)
            const uint4 v = __ldcg(reinterpret_cast<const uint4*>(x + m * sx + col + j));
            unpack8(v, &xr[m][j]);
        }
    }
    if (pdl) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    for (int i0 = 0; i0 < rows; i0 += G) {  // G rows a step (G <= pieces: a step never waits on a slot it holds)
        float acc[G][M] = {};
        uint4 wv[G][E / 8];  // the step's weights, loaded before any product
#pragma unroll
        for (int g = 0; g < G; ++g)  // the step's pieces landed and loaded first, so that their products interleave
            if (i0 + g < rows) mbar_wait(&full[(i0 + g) % pieces], ((i0 + g) / pieces) & 1);
#pragma unroll
        for (int g = 0; g < G; ++g)  // past the last row: a slot's stale bytes, whose sums are dropped below
            load_lane<E>(ring + static_cast<size_t>((i0 + g) % pieces) * K + col, wv[g]);
#pragma unroll
        for (int g = 0; g < G; ++g) dot_lane<M, E>(wv[g], xr, acc[g]);
        __syncwarp();
        if (lane == 0) {  // every lane has read its part of the step's slots
#pragma unroll
            for (int g = 0; g < G; ++g)
                if (i0 + g < rows) mbar_arrive(&empty[(i0 + g) % pieces]);
        }
        warp_sum<G, M>(acc);
        if (lane == 0) {
#pragma unroll
            for (int g = 0; g < G; ++g) {
#pragma unroll
                for (int m = 0; m < M; ++m)
                    if (i0 + g < rows) red[((i0 + g) * CONSUMER_WARPS + warp) * M + m] = acc[g][m];
            }
        }
    }
    asm volatile("bar.sync 1, %0;" :: "n"(CONSUMER_WARPS * 32) : "memory");  // the consumers only
    for (int t = threadIdx.x; t < rows * M; t += CONSUMER_WARPS * 32) {
        const int i = t / M, m = t % M;
        float s = 0.f;
#pragma unroll
        for (int c = 0; c < CONSUMER_WARPS; ++c) s += red[(i * CONSUMER_WARPS + c) * M + m];
        out[static_cast<size_t>(m) * N + row0 + i] = s;
    }
}

// The same stream with the attention's merge in front (inference change 37, form "merge"): the
// kernel ahead is the decode split kernel, whose partials it merges itself, so no merge launch
// stands between the attention and W_O. Block (s, g): the K slice of heads [s * HS, (s + 1) * HS)
// (HS * 128 columns) of the weight rows [g * R, (g + 1) * R), in pieces of 8 rows (8 copies of
// HS * 256 bytes a piece); after the wait its 256 consumer threads merge the slice's partials
// of both query rows (the pair's window and full rows, B = 1) into shared memory, rounded to
// bf16 as the merge launch rounds them, and warp w then takes row w of every piece. It writes
// float32 partials [HQ / HS, 2, N] for the split-K reduce. A warp takes G pieces a step, as above.
constexpr int MD = 128;  // head dim
constexpr int PIECE_ROWS = CONSUMER_WARPS;

template <int HS, int G>
__global__ void __launch_bounds__(THREADS, 1)
wo_merge_kernel(const float* __restrict__ op, const float* __restrict__ lp, int S, int HQ,
                const __nv_bfloat16* __restrict__ w, float* __restrict__ out, int N, int rows_per_block,
                int pieces, int pdl) {
    constexpr int C = HS * MD;         // the slice's columns
    constexpr int E = C / 32;          // a lane's columns of a row
    constexpr uint32_t SEG = C * 2;    // bytes of one row's segment
    static_assert(E % 8 == 0, "16-byte loads");
    extern __shared__ __align__(128) unsigned char smem[];
    __nv_bfloat16* ring = reinterpret_cast<__nv_bfloat16*>(smem);
    uint64_t* full = reinterpret_cast<uint64_t*>(smem + static_cast<size_t>(pieces) * PIECE_ROWS * SEG);
    uint64_t* empty = full + pieces;
    float* xs = reinterpret_cast<float*>(empty + pieces);  // the merged rows, [2][E][32] (no bank conflicts)
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int s = blockIdx.x, K = HQ * MD;
    const int row0 = blockIdx.y * rows_per_block;
    const int rows = min(rows_per_block, N - row0);
    const int npieces = (rows + PIECE_ROWS - 1) / PIECE_ROWS;
    init_ring(full, empty, pieces);
    if (warp == CONSUMER_WARPS) {  // the producer
        if (pdl) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
        if (lane == 0) {
            for (int i = 0; i < npieces; ++i) {
                const int slot = i % pieces, round = i / pieces;
                if (round) mbar_wait(&empty[slot], (round - 1) & 1);
                const int r0 = i * PIECE_ROWS, nr = min(PIECE_ROWS, rows - r0);
                expect_bytes(&full[slot], nr * SEG);
                for (int r = 0; r < nr; ++r)
                    bulk_copy(ring + (static_cast<size_t>(slot) * PIECE_ROWS + r) * C,
                              w + static_cast<size_t>(row0 + r0 + r) * K + static_cast<size_t>(s) * C, SEG,
                              &full[slot]);
            }
        }
        return;
    }
    if (pdl) asm volatile("griddepcontrol.wait;" ::: "memory");  // the partials are the kernel ahead's
    // merge: thread t takes 4 columns of one of the two rows (as merge_splits in triton/common.py)
    for (int idx = threadIdx.x * 4; idx < 2 * C; idx += CONSUMER_WARPS * 32 * 4) {
        const int r = idx / C, c = idx % C;
        const int h = s * HS + c / MD, d = c % MD;
        const size_t base = (static_cast<size_t>(r) * HQ + h) * S;
        float mx = -INFINITY;
        for (int k = 0; k < S; ++k) mx = fmaxf(mx, __ldcg(lp + base + k));
        const float ms = mx == -INFINITY ? 0.f : mx;
        float den = 0.f, a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;
        for (int k = 0; k < S; ++k) {
            const float wt = exp2f(__ldcg(lp + base + k) - ms);
            const float4 v = __ldcg(reinterpret_cast<const float4*>(op + (base + k) * MD + d));
            den += wt;
            a0 += v.x * wt;
            a1 += v.y * wt;
            a2 += v.z * wt;
            a3 += v.w * wt;
        }
        const float inv = den > 0.f ? den : 1.f;
        const float o[4] = {a0 / inv, a1 / inv, a2 / inv, a3 / inv};
#pragma unroll
        for (int q = 0; q < 4; ++q)  // column c + q is lane (c + q) / E's element (c + q) % E: stored [r][j][lane]
            xs[(r * E + (c + q) % E) * 32 + (c + q) / E] = __bfloat162float(__float2bfloat16_rn(o[q]));
    }
    asm volatile("bar.sync 1, %0;" :: "n"(CONSUMER_WARPS * 32) : "memory");
    if (pdl) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    float xr[2][E];
#pragma unroll
    for (int m = 0; m < 2; ++m) {
#pragma unroll
        for (int j = 0; j < E; ++j) xr[m][j] = xs[(m * E + j) * 32 + lane];
    }
    for (int i0 = 0; i0 < npieces; i0 += G) {  // G pieces a step (G <= pieces)
        float acc[G][2] = {};
        uint4 wv[G][E / 8];  // the step's weights, loaded before any product
#pragma unroll
        for (int g = 0; g < G; ++g)
            if (i0 + g < npieces) mbar_wait(&full[(i0 + g) % pieces], ((i0 + g) / pieces) & 1);
#pragma unroll
        for (int g = 0; g < G; ++g)  // warp w's row of each piece (past the block's rows: stale bytes, dropped below)
            load_lane<E>(ring + (static_cast<size_t>((i0 + g) % pieces) * PIECE_ROWS + warp) * C + lane * E, wv[g]);
#pragma unroll
        for (int g = 0; g < G; ++g) dot_lane<2, E>(wv[g], xr, acc[g]);
        __syncwarp();
        if (lane == 0) {
#pragma unroll
            for (int g = 0; g < G; ++g)
                if (i0 + g < npieces) mbar_arrive(&empty[(i0 + g) % pieces]);
        }
        warp_sum<G, 2>(acc);
        if (lane == 0) {
#pragma unroll
            for (int g = 0; g < G; ++g) {
                const int row = (i0 + g) * PIECE_ROWS + warp;
                if (i0 + g < npieces && row < rows) {
                    out[(static_cast<size_t>(s) * 2) * N + row0 + row] = acc[g][0];
                    out[(static_cast<size_t>(s) * 2 + 1) * N + row0 + row] = acc[g][1];
                }
            }
        }
    }
}

// `fn` on `stream` with THREADS threads a block and `smem` bytes of dynamic shared memory; with `pdl`, as a
// programmatic dependent launch (it may start while the kernel ahead runs: griddepcontrol.wait orders the rest)
template <typename... Params, typename... Args>
static int launch(void (*fn)(Params...), dim3 grid, long long smem, void* stream, int pdl, Args... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = dim3(THREADS);
    cfg.dynamicSmemBytes = static_cast<size_t>(smem);
    cfg.stream = static_cast<cudaStream_t>(stream);
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = pdl ? 1 : 0;
    return static_cast<int>(cudaLaunchKernelEx(&cfg, fn, args...));
}

typedef void (*Kernel)(const __nv_bfloat16*, const __nv_bfloat16*, float*, int, long long, int, int, int);

// G: the pieces a consumer warp takes a step, 1 or 2 (the host keeps it <= the ring's slots)
static Kernel pick(int M, int K, int G) {
    const int E = K / (32 * CONSUMER_WARPS);
    if (E * 32 * CONSUMER_WARPS != K || (G != 1 && G != 2)) return nullptr;
#define PICK(m_, e_) \
    if (M == m_ && E == e_) return G == 1 ? wo_preload_kernel<m_, e_, 1> : wo_preload_kernel<m_, e_, 2>;
    PICK(1, 8) PICK(1, 16) PICK(1, 32) PICK(2, 8) PICK(2, 16) PICK(2, 32)
#undef PICK
    return nullptr;
}

// Shared memory a block asks for: the ring, its 2 * pieces mbarriers, the warps' row sums.
extern "C" long long wo_preload_smem_bytes(int M, int K, int rows_per_block, int pieces) {
    return static_cast<long long>(pieces) * K * 2 + 16LL * pieces + 4LL * rows_per_block * CONSUMER_WARPS * M;
}

// 0 where (M, K) has a kernel, else -1.
extern "C" int wo_preload_supports(int M, int K) { return pick(M, K, 1) ? 0 : -1; }

// Lets every kernel ask for up to `bytes` of dynamic shared memory (once, before any capture).
extern "C" int wo_preload_prepare(int bytes) {
    const int ms[] = {1, 2}, ks[] = {2048, 4096, 8192};
    for (int m : ms)
        for (int k : ks)
            for (int g = 1; g <= 2; ++g) {
                const cudaError_t e =
                    cudaFuncSetAttribute(pick(m, k, g), cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
                if (e != cudaSuccess) return static_cast<int>(e);
            }
    return 0;
}

extern "C" int wo_preload_launch(const void* w, const void* x, void* out, int M, int N, int K, long long sx,
                                 int rows_per_block, int blocks, int pieces, int group, int pdl, void* stream) {
    const Kernel fn = pick(M, K, group);
    if (!fn || group > pieces) return static_cast<int>(cudaErrorInvalidValue);
    return launch(fn, dim3(blocks), wo_preload_smem_bytes(M, K, rows_per_block, pieces), stream, pdl,
                  static_cast<const __nv_bfloat16*>(w), static_cast<const __nv_bfloat16*>(x), static_cast<float*>(out),
                  N, sx, rows_per_block, pieces, pdl);
}

typedef void (*MergeKernel)(const float*, const float*, int, int, const __nv_bfloat16*, float*, int, int, int, int);

static MergeKernel pick_merge(int hs, int G) {
    if (G != 1 && G != 2) return nullptr;
    if (hs == 2) return G == 1 ? wo_merge_kernel<2, 1> : wo_merge_kernel<2, 2>;
    if (hs == 4) return G == 1 ? wo_merge_kernel<4, 1> : wo_merge_kernel<4, 2>;
    if (hs == 8) return G == 1 ? wo_merge_kernel<8, 1> : wo_merge_kernel<8, 2>;
    return nullptr;
}

extern "C" long long wo_merge_smem_bytes(int hs, int pieces) {
    return static_cast<long long>(pieces) * PIECE_ROWS * hs * MD * 2 + 16LL * pieces + 4LL * 2 * hs * MD;
}

extern "C" int wo_merge_prepare(int bytes) {
    for (int hs : {2, 4, 8})
        for (int g = 1; g <= 2; ++g) {
            const cudaError_t e =
                cudaFuncSetAttribute(pick_merge(hs, g), cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
            if (e != cudaSuccess) return static_cast<int>(e);
        }
    return 0;
}

extern "C" int wo_merge_launch(const void* op, const void* lp, int S, int HQ, int hs, const void* w, void* out, int N,
                               int rows_per_block, int groups, int pieces, int group, int pdl, void* stream) {
    const MergeKernel fn = pick_merge(hs, group);
    if (!fn || HQ % hs || group > pieces) return static_cast<int>(cudaErrorInvalidValue);
    return launch(fn, dim3(HQ / hs, groups), wo_merge_smem_bytes(hs, pieces), stream, pdl,
                  static_cast<const float*>(op), static_cast<const float*>(lp), S, HQ,
                  static_cast<const __nv_bfloat16*>(w), static_cast<float*>(out), N, rows_per_block, pieces, pdl);
}

extern "C" const char* wo_preload_error_string(int e) { return cudaGetErrorString(static_cast<cudaError_t>(e)); }

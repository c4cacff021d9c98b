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
// them, a warp reduction a row, and release the slot ("empty" mbarrier, one arrive a warp).
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

// one piece: `bytes` from global `src` into shared `dst`, completing `bytes` of `bar`'s expected count
__device__ __forceinline__ void copy_piece(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(saddr(bar)), "r"(bytes) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 :: "r"(saddr(dst)), "l"(src), "r"(bytes), "r"(saddr(bar)) : "memory");
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

template <int M, int E>
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
    if (threadIdx.x == 0) {
        for (int i = 0; i < pieces; ++i) {
            mbar_init(&full[i], 1);
            mbar_init(&empty[i], CONSUMER_WARPS);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (warp == CONSUMER_WARPS) {  // the producer: the weight is read-only, so no wait before its copies
        if (pdl) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
        if (lane == 0) {
            for (int i = 0; i < rows; ++i) {
                const int slot = i % pieces, round = i / pieces;
                if (round) mbar_wait(&empty[slot], (round - 1) & 1);
                copy_piece(ring + static_cast<size_t>(slot) * K, w + static_cast<size_t>(row0 + i) * K, PIECE_BYTES,
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
            const uint4 v = *reinterpret_cast<const uint4*>(x + m * sx + col + j);
            unpack8(v, &xr[m][j]);
        }
    }
    if (pdl) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    for (int i = 0; i < rows; ++i) {
        const int slot = i % pieces, round = i / pieces;
        mbar_wait(&full[slot], round & 1);
        const __nv_bfloat16* p = ring + static_cast<size_t>(slot) * K + col;
        float acc[M];
#pragma unroll
        for (int m = 0; m < M; ++m) acc[m] = 0.f;
#pragma unroll
        for (int j = 0; j < E; j += 8) {
            float wf[8];
            unpack8(*reinterpret_cast<const uint4*>(p + j), wf);
#pragma unroll
            for (int t = 0; t < 8; ++t) {
#pragma unroll
                for (int m = 0; m < M; ++m) acc[m] = fmaf(wf[t], xr[m][j + t], acc[m]);
            }
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(&empty[slot]);  // every lane has read its part of the slot
#pragma unroll
        for (int m = 0; m < M; ++m) {
#pragma unroll
            for (int off = 16; off; off >>= 1) acc[m] += __shfl_xor_sync(0xffffffffu, acc[m], off);
        }
        if (lane == 0) {
#pragma unroll
            for (int m = 0; m < M; ++m) red[(i * CONSUMER_WARPS + warp) * M + m] = acc[m];
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

typedef void (*Kernel)(const __nv_bfloat16*, const __nv_bfloat16*, float*, int, long long, int, int, int);

static Kernel pick(int M, int K) {
    const int E = K / (32 * CONSUMER_WARPS);
    if (E * 32 * CONSUMER_WARPS != K) return nullptr;
#define PICK(m_, e_) \
    if (M == m_ && E == e_) return wo_preload_kernel<m_, e_>;
    PICK(1, 8) PICK(1, 16) PICK(1, 32) PICK(2, 8) PICK(2, 16) PICK(2, 32)
#undef PICK
    return nullptr;
}

// Shared memory a block asks for: the ring, its 2 * pieces mbarriers, the warps' row sums.
extern "C" long long wo_preload_smem_bytes(int M, int K, int rows_per_block, int pieces) {
    return static_cast<long long>(pieces) * K * 2 + 16LL * pieces + 4LL * rows_per_block * CONSUMER_WARPS * M;
}

// 0 where (M, K) has a kernel, else -1.
extern "C" int wo_preload_supports(int M, int K) { return pick(M, K) ? 0 : -1; }

// Lets every kernel ask for up to `bytes` of dynamic shared memory (once, before any capture).
extern "C" int wo_preload_prepare(int bytes) {
    const int ms[] = {1, 2}, ks[] = {2048, 4096, 8192};
    for (int m : ms)
        for (int k : ks) {
            const cudaError_t e = cudaFuncSetAttribute(pick(m, k), cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
            if (e != cudaSuccess) return static_cast<int>(e);
        }
    return 0;
}

extern "C" int wo_preload_launch(const void* w, const void* x, void* out, int M, int N, int K, long long sx,
                                 int rows_per_block, int blocks, int pieces, int pdl, void* stream) {
    const Kernel fn = pick(M, K);
    if (!fn) return static_cast<int>(cudaErrorInvalidValue);
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(blocks);
    cfg.blockDim = dim3(THREADS);
    cfg.dynamicSmemBytes = static_cast<size_t>(wo_preload_smem_bytes(M, K, rows_per_block, pieces));
    cfg.stream = static_cast<cudaStream_t>(stream);
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = pdl ? 1 : 0;
    const cudaError_t e = cudaLaunchKernelEx(&cfg, fn, static_cast<const __nv_bfloat16*>(w),
                                             static_cast<const __nv_bfloat16*>(x), static_cast<float*>(out), N, sx,
                                             rows_per_block, pieces, pdl);
    return static_cast<int>(e);
}

extern "C" const char* wo_preload_error_string(int e) { return cudaGetErrorString(static_cast<cudaError_t>(e)); }

// The kernel of benchmarks/stream_chain.py (issue #18, docs/performance.md inference changes 33-35):
// change 30's chain of GEMVs (per layer QKV -> W_O -> gate/up -> down, M = 2 rows) as one
// persistent launch whose weight stream does not stop at the phases' dependencies.
//
// One block a multiprocessor, 9 warps. Warp 8 is the producer: one thread walks the block's share
// of every weight of the chain in order, 8 KB piece (PIECE bf16) after piece, into a ring of
// shared-memory stages with the bulk copy engine (cp.async.bulk completing on the stage's "full"
// mbarrier). It waits only for a free stage ("empty" mbarrier, one arrive a consumer warp of the
// stage's form), never for an activation, so while the consumers wait at a grid barrier the ring
// keeps filling with the next phase's weight.
// Warps 0-7 are the consumers (256 threads): at each phase they wait for every block to have
// finished the phase before (a grid barrier: one counter, a monotone target), then consume their
// pieces. In the default form (consume) a piece is 4096 consecutive elements of a weight row (K
// is a multiple of 4096: S = K / 4096 pieces a row), and thread t multiplies elements [8t, 8t + 8)
// and [2048 + 8t, 2048 + 8t + 8) of it with the same columns of the phase's two input rows
// (float32, rounded to bf16 as each GEMV's output is in the chain), held in registers one segment
// at a time. A phase's pieces are
// dealt to the blocks in segment-major order (all rows' first segments, then the second ones...),
// as contiguous ranges or interleaved (every gridDim.x-th piece), so a block reloads its input
// columns at most twice a phase. Pieces are taken eight at a time (a batch never crosses a
// segment): each piece's two sums are reduced across each warp and stored in the warp's
// shared-memory slot for the piece; at the phase's end the warps' slots are summed and
// added into the float32 output rows with atomics (a row's segments may be in other blocks). During
// phase s each block zeroes its share of phase s + 1's output (nobody touches it before barrier
// s); phase 0's output and the barrier counter are zeroed by the caller.
//
// Build variants (`--math`): -DSTREAM_GROUPS=1, each piece taken by one group of four warps alone
// (consume_groups); -DSTREAM_QUAD=1, batches of four pieces in four stages (a stage set, one full and
// one empty barrier), each batch taken by one group of four warps alone, the products on tensor
// cores with the pieces as A's rows (consume_quads; with `claims`, the blocks' producers claim the
// batches from a counter a phase, consume_quads_claimed). -DPRODUCER_SLEEP_NS sets the producer's sleep
// between looks at a stage. -DL2_AHEAD=n: the producer also asks L2 for its pieces n ahead of its
// copies (see Ahead; with the claimed deal, for the batches it claims ahead at each phase's end),
// so that HBM keeps streaming them while the ring is full: with a bulk prefetch (a hint), or with
// -DL2_COPY=1 a bulk copy into a scratch stage (a demand read; see prefetch_piece).
//
// Every wait gives up after ~2 s (globaltimer) and sets *err (1: a grid barrier, 2: a full stage,
// 3: an empty stage) instead of hanging; the caller must check it. With `stats` (may be null) each
// block writes STATS counters of SM cycles (clock64): where its time went (see the enum). With `trace`
// (may be null) each block writes TRACE global-timer stamps (ns) a phase (see the enum).

#include <cuda_runtime.h>
#include <stdint.h>

#define PIECE 4096                 // bf16 elements a piece (8 KB)
#define PIECE_BYTES (PIECE * 2)
#ifndef STREAM_GROUPS
#define STREAM_GROUPS 0            // 1: each piece taken by one group of 4 warps alone, see consume_groups
#endif
#ifndef STREAM_QUAD
#define STREAM_QUAD 0              // 1: batches of 4 pieces, one group of 4 warps a batch, see consume_quads
#endif
#ifndef QUAD
#define QUAD 4                     // STREAM_QUAD: pieces a batch (stages a stage set): 4, or 2 / 1 to size the stream
#endif
#ifndef BARRIER_RELAXED
#define BARRIER_RELAXED 0          // a block's grid-barrier arrive: 0 after __threadfence, 1 (diagnostic) without a
                                   // fence, 2 after fence.acq_rel.gpu, 3 on a two-level counter (see arrive_tree)
#endif
#define TREE_BLOCKS 16             // BARRIER_RELAXED 3: blocks a first-level counter
#define BAR_STRIDE 32              // unsigned a grid-barrier counter apart (128 B: a line each)
// A stage's bytes: with STREAM_QUAD a 16-byte skew a stage, so that the eight rows ldmatrix reads
// at one column (from consecutive stages) fall in different banks.
#define STAGE_BYTES (PIECE_BYTES + 16 * STREAM_QUAD)
#define CONSUMERS 256              // threads of warps 0-7
#define THREADS (CONSUMERS + 32)   // + the producer warp
#define G 8                        // pieces taken together (waited for, read, released, reduced)
#define TIMEOUT_NS 2000000000ull
#ifndef PRODUCER_SLEEP_NS
#define PRODUCER_SLEEP_NS 64       // the producer's sleep between looks at a stage it waits to refill
#endif
#ifndef L2_AHEAD
#define L2_AHEAD 0                 // pieces the producer asks L2 for ahead of its copies (0: none), see Ahead
#endif
#define CLAIM_AHEAD ((L2_AHEAD + QUAD - 1) / QUAD)  // the claimed deal: batches claimed ahead at a phase's end
#ifndef L2_COPY
#define L2_COPY 0                  // L2_AHEAD's pieces: 0 asked with a bulk prefetch, 1 read into a scratch stage
#endif

enum { ST_TOTAL, ST_GRID, ST_FULL, ST_PROD_TOTAL, ST_EMPTY, STATS };  // cycles: consumer thread 0's run,
// its grid-barrier waits, its full-stage waits; the producer's run, its empty-stage waits

enum { TR_START, TR_END, TR_ISSUED, TRACE };  // a phase's stamps: its consumers start it (past the grid
// barrier) and end it (before their arrive), the producer has issued its last copy

enum { SKIP_MATH = 1, SKIP_GRID = 2 };  // consumers only wait and release each stage; no grid-barrier waits

struct Chain {
    const uint16_t* w[4];  // [L, N_kind, K_kind] bf16: QKV, W_O, gate/up, down
    const float* x0;       // [2, H] float32 (bf16 values): the first layer's input
    float* out[4];         // [L, 2, N_kind] float32
    unsigned* bar;         // grid barrier counters (zeroed by the caller): bar[0] the one waited on; with
                           // BARRIER_RELAXED 3 also bar[BAR_STRIDE (1 + g)], group g's first-level counter
    int* err;              // 0, or why a wait gave up
    long long* stats;      // [blocks, STATS] or null
    unsigned long long* trace;  // [blocks, phases, TRACE] or null
    unsigned* claims;      // STREAM_QUAD: [phases] batch counters (zeroed by the caller) for the claimed deal, or
                           // null (the static deal)
    int skip;              // diagnostics (wrong results): SKIP_MATH | SKIP_GRID
    int interleave;        // a block's pieces of a phase: 0 a contiguous range, 1 every gridDim.x-th
    int H, NQKV, INTER, L;
    int stages;            // ring stages
    int acc_rows;          // slots (two floats each) of each consumer warp's row of the accumulator
};

struct Phase {
    const uint16_t* w;
    const float* in;
    int in_stride;
    float* out;
    int N, K;
};

__device__ __forceinline__ Phase phase_of(const Chain& c, int s) {
    int kind = s & 3, layer = s >> 2;
    Phase p;
    if (kind == 0) {
        p.N = c.NQKV; p.K = c.H;
        p.in = layer == 0 ? c.x0 : c.out[3] + (size_t)(layer - 1) * 2 * c.H;
        p.in_stride = c.H;
    } else if (kind == 1) {
        p.N = c.H; p.K = c.H;
        p.in = c.out[0] + (size_t)layer * 2 * c.NQKV;  // the first H of QKV's outputs
        p.in_stride = c.NQKV;
    } else if (kind == 2) {
        p.N = 2 * c.INTER; p.K = c.H;
        p.in = c.out[1] + (size_t)layer * 2 * c.H;
        p.in_stride = c.H;
    } else {
        p.N = c.H; p.K = c.INTER;
        p.in = c.out[2] + (size_t)layer * 4 * c.INTER;  // the first INTER of gate/up's outputs
        p.in_stride = 2 * c.INTER;
    }
    // branches, not c.w[kind]: a run-time index would copy the parameter arrays to local memory
    const uint16_t* w = kind == 0 ? c.w[0] : kind == 1 ? c.w[1] : kind == 2 ? c.w[2] : c.w[3];
    float* out = kind == 0 ? c.out[0] : kind == 1 ? c.out[1] : kind == 2 ? c.out[2] : c.out[3];
    p.w = w + (size_t)layer * p.N * p.K;
    p.out = out + (size_t)layer * 2 * p.N;
    return p;
}

// The block's pieces [lo, hi) of a phase with `total` pieces.
__device__ __forceinline__ void share(long total, long& lo, long& hi) {
    lo = total * blockIdx.x / gridDim.x;
    hi = total * (blockIdx.x + 1) / gridDim.x;
}

// The block's pieces of a phase with `total` pieces in segment-major order (piece q is segment
// q / N of row q % N, so a block's pieces change segment at most twice a phase; the producer and
// the consumers walk them in the same order): `n` of them, the i-th being q = lo + i (contiguous)
// or blockIdx.x + i * gridDim.x (interleaved: at any moment every block reads near the others).
// Each piece has its own accumulator slot (two pieces of one row add into the row at the flush).
struct Share {
    int lo, n, step;
    __device__ __forceinline__ Share(int total, bool interleave) {
        if (interleave) {
            lo = blockIdx.x;
            step = gridDim.x;
            n = total > lo ? (total - lo + step - 1) / step : 0;
        } else {
            long l, h;
            share(total, l, h);
            lo = (int)l;
            n = (int)(h - l);
            step = 1;
        }
    }
    __device__ __forceinline__ int piece(int i) const { return lo + i * step; }
};

// Walks a share's pieces in order: the piece's row and segment, without a division a piece.
struct Cursor {
    int row, seg, N, step;
    __device__ __forceinline__ Cursor(const Share& sh, int n_rows) : N(n_rows), step(sh.step) {
        seg = sh.lo / N;
        row = sh.lo - seg * N;
    }
    __device__ __forceinline__ void next() {
        row += step;
        while (row >= N) {
            row -= N;
            seg++;
        }
    }
};

__device__ __forceinline__ uint32_t saddr(const void* p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ uint64_t now_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// Whether the phase of `bar` with `parity` is complete: test_wait (MAY_BLOCK false) never blocks,
// for the first look; try_wait may hold the thread for a while inside it before answering.
template <bool MAY_BLOCK>
__device__ __forceinline__ bool mbar_look(uint64_t* bar, uint32_t parity) {
    uint32_t ok;
    if constexpr (MAY_BLOCK)
        asm volatile(
            "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
            : "=r"(ok) : "r"(saddr(bar)), "r"(parity) : "memory");
    else
        asm volatile(
            "{\n .reg .pred p;\n mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
            : "=r"(ok) : "r"(saddr(bar)), "r"(parity) : "memory");
    return ok;
}

// Waits for the phase of `bar` with `parity`; after a timeout sets *err = code and `dead`, after
// which every wait of this thread returns at once (the run is invalid and ends quickly).
// `waited` gains the cycles spent when the phase was not complete at the first look.
// With SLEEP_NS > 0 the thread sleeps that long between looks: the producer's waits, which would
// otherwise spin (~10 instructions every ~60 cycles) on the issue slots of two consumer warps.
template <int SLEEP_NS = 0>
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity, int* err, int code, bool& dead,
                                          long long& waited) {
    if (dead || mbar_look<false>(bar, parity)) return;
    const long long c0 = clock64();
    const uint64_t t0 = now_ns();
    while (!mbar_look<true>(bar, parity)) {
        if constexpr (SLEEP_NS > 0) __nanosleep(SLEEP_NS);
        if (now_ns() - t0 > TIMEOUT_NS) {
            atomicExch(err, code);
            dead = true;
            break;
        }
    }
    waited += clock64() - c0;
}

// The ring's position: stage and the parity of its current round (no division per piece).
struct Ring {
    int stage = 0;
    uint32_t parity = 0;
    Ring() = default;
    __device__ __forceinline__ Ring(long long q, int stages)  // position q (stages or stage sets so far)
        : stage((int)(q % stages)), parity((uint32_t)((q / stages) & 1)) {}
    __device__ __forceinline__ void next(int stages) {
        if (++stage == stages) {
            stage = 0;
            parity ^= 1;
        }
    }
    __device__ __forceinline__ void advance(int n, int stages) {  // n <= stages
        stage += n;
        if (stage >= stages) {
            stage -= stages;
            parity ^= 1;
        }
    }
};

// The producer's arrive on a full barrier, announcing the bytes its copies will complete there.
__device__ __forceinline__ void expect_bytes(uint64_t* bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(saddr(bar)), "r"(bytes) : "memory");
}

// The piece (row, segment) of phase p's weight: its place in memory.
__device__ __forceinline__ const uint16_t* piece_src(const Phase& p, int row, int seg) {
    return p.w + ((size_t)row * (p.K / PIECE) + seg) * PIECE;
}

// The bulk copy of the piece (row, segment) of phase p's weight into a stage, completing its bytes
// on `bar`.
__device__ __forceinline__ void copy_piece(const unsigned char* stage, const Phase& p, int row, int seg,
                                           uint64_t* bar) {
    const uint16_t* src = piece_src(p, row, seg);
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 :: "r"(saddr(stage)), "l"(src), "n"(PIECE_BYTES), "r"(saddr(bar)) : "memory");
}

// Asks L2 for the piece (row, segment) of phase p's weight. By default a bulk prefetch, a hint
// (inference change 23 measured such hints, line or bulk, fetching little that a later reader hit
// on this H200, where demand reads did leave their bytes in L2). With L2_COPY a bulk copy of the
// piece into the `scratch` stage, a demand read: its bytes are announced on `sink`, a barrier
// whose phase nobody arrives on before the producer's end, so nothing waits for them, and the
// scratch stage is never read (the copies in flight overwrite it in any order).
__device__ __forceinline__ void prefetch_piece(const Phase& p, int row, int seg, const unsigned char* scratch,
                                               uint64_t* sink) {
#if L2_COPY
    asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;" :: "r"(saddr(sink)), "n"(PIECE_BYTES)
                 : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 :: "r"(saddr(scratch)), "l"(piece_src(p, row, seg)), "n"(PIECE_BYTES), "r"(saddr(sink)) : "memory");
#else
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" :: "l"(piece_src(p, row, seg)), "n"(PIECE_BYTES)
                 : "memory");
#endif
}

// The producer's look-ahead (L2_AHEAD > 0, static deals): it walks the block's pieces of every
// phase in the order of the copies, asking L2 for each (prefetch_piece: nothing the ring or the
// consumers wait for). The producer keeps it L2_AHEAD pieces in front of its copies, so while it
// waits for a free stage (the consumers stopped at a grid barrier) HBM still streams the block's
// next pieces, and the copies that follow read them from L2.
struct Ahead {
    int s = -1, left = 0, row = 0, seg = 0, step = 1;
    Phase p;
    // Asks L2 for the next piece (prefetch_piece); false once every phase's pieces were asked for.
    __device__ __forceinline__ bool next(const Chain& c, int phases, const unsigned char* scratch, uint64_t* sink) {
        while (left == 0) {
            if (s + 1 >= phases) return false;
            p = phase_of(c, ++s);
            const Share sh(p.N * (p.K / PIECE), c.interleave);
            const Cursor cur(sh, p.N);
            left = sh.n, row = cur.row, seg = cur.seg, step = sh.step;
        }
        prefetch_piece(p, row, seg, scratch, sink);
        row += step;
        while (row >= p.N) {
            row -= p.N;
            seg++;
        }
        left--;
        return true;
    }
};

__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(saddr(bar)) : "memory");
}

// One arrive for the warp on `bar`: after __syncwarp every lane's reads of the stage come before
// it, and its release orders them before the producer's next copy into the stage.
__device__ __forceinline__ void warp_release(uint64_t* bar) {
    __syncwarp();
    if ((threadIdx.x & 31) == 0) mbar_arrive(bar);
}

__device__ __forceinline__ void consumers_sync() {
    asm volatile("bar.sync 1, %0;" :: "n"(CONSUMERS) : "memory");
}

__device__ __forceinline__ void grid_wait(unsigned* bar, unsigned target, int* err, bool& dead) {
    if (dead) return;
    uint64_t t0 = 0;
    for (;;) {
        unsigned v;
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(bar) : "memory");
        if (v >= target) return;
        if (t0 == 0) t0 = now_ns();
        else if (now_ns() - t0 > TIMEOUT_NS) {
            atomicExch(err, 1);
            dead = true;
            return;
        }
    }
}

// A block's arrive on the grid barrier after phase s (s = 0, 1, ...) on a two-level counter: the
// block adds 1 to its group's counter (TREE_BLOCKS blocks a group) with acquire-release semantics,
// and the group's last arriver (the one that sees the group's count reach (s + 1) x its size) adds 1
// to bar[0] with release semantics, so that bar[0] reaches (s + 1) x groups once every block has
// arrived, and each counter takes at most TREE_BLOCKS (or groups) arrivals a phase instead of all.
__device__ __forceinline__ void arrive_tree(unsigned* bar, int s) {
    const int g = blockIdx.x / TREE_BLOCKS;
    const int size = min(TREE_BLOCKS, (int)gridDim.x - g * TREE_BLOCKS);
    unsigned old;
    asm volatile("atom.add.acq_rel.gpu.global.u32 %0, [%1], 1;"
                 : "=r"(old) : "l"(bar + BAR_STRIDE * (1 + g)) : "memory");
    if (old + 1 == (unsigned)(s + 1) * size)
        asm volatile("red.release.gpu.global.add.u32 [%0], 1;" :: "l"(bar) : "memory");
}

__device__ __forceinline__ float bf16_round(float v) {
    // round to nearest even bf16, back to float32 (what the chain stores between GEMVs)
    uint32_t u = __float_as_uint(v);
    u += 0x7fffu + ((u >> 16) & 1u);
    return __uint_as_float(u & 0xffff0000u);
}

// a0 / a1 += the products of 8 bf16 weights (a uint4) with x0[0..8) / x1[0..8) (the two rows)
__device__ __forceinline__ void dot8(uint4 w, const float* x0, const float* x1, float& a0, float& a1) {
    uint32_t ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float lo = __uint_as_float(ws[i] << 16), hi = __uint_as_float(ws[i] & 0xffff0000u);
        a0 = fmaf(lo, x0[2 * i], a0);
        a0 = fmaf(hi, x0[2 * i + 1], a0);
        a1 = fmaf(lo, x1[2 * i], a1);
        a1 = fmaf(hi, x1[2 * i + 1], a1);
    }
}

__device__ __forceinline__ void load8(const float* src, float* dst) {
    float4 a = __ldcg(reinterpret_cast<const float4*>(src));
    float4 b = __ldcg(reinterpret_cast<const float4*>(src + 4));
    dst[0] = bf16_round(a.x); dst[1] = bf16_round(a.y); dst[2] = bf16_round(a.z); dst[3] = bf16_round(a.w);
    dst[4] = bf16_round(b.x); dst[5] = bf16_round(b.y); dst[6] = bf16_round(b.z); dst[7] = bf16_round(b.w);
}

// One halving exchange of a sum across the warp: lanes with bit `off` set keep the upper N / 2 of
// the N values, the others the lower, each adding its partner's copy of the half it keeps.
template <int N>
__device__ __forceinline__ void halve(float* v, int lane, int off) {
    const bool upper = lane & off;
#pragma unroll
    for (int i = 0; i < N / 2; i++) {
        const float send = upper ? v[i] : v[i + N / 2], keep = upper ? v[i + N / 2] : v[i];
        v[i] = keep + __shfl_xor_sync(0xffffffffu, send, off);
    }
}

// Loads this thread's 16 columns of segment `seg` of both input rows, rounded to bf16.
__device__ __forceinline__ void load_x(const Phase& p, int seg, float (&x)[2][16]) {
    const int tid = threadIdx.x;
#pragma unroll
    for (int m = 0; m < 2; m++) {
        const float* src = p.in + (size_t)m * p.in_stride + seg * PIECE;
        load8(src + 8 * tid, &x[m][0]);
        load8(src + 2048 + 8 * tid, &x[m][8]);
    }
}

// One phase's consumer work for this block. Pieces are taken G at a time: G stages waited for,
// read into registers and released, then their products (16 independent chains a thread), the
// 16 sums across the warp in 16 shuffles, and 16 lanes store them into the warp's slots for the
// pieces. At the phase's end the 8 warps' slots are summed and added into the output rows
// with atomics (a row's segments may sit in other blocks).
// Waits until the batch's `ng` stages from the ring's position `k` hold their pieces, and puts
// their stage numbers in `st` (all G entries, valid ones first): the stages looked at back to back
// (independent tests, one combined answer), the blocking wait, stage by stage, only when one of
// them is not there yet.
__device__ __forceinline__ void wait_batch(const Chain& c, uint64_t* full, const Ring& k, int ng, int (&st)[G],
                                           bool& dead, long long& waited) {
    uint32_t ready = 1;
    Ring r = k;
#pragma unroll
    for (int g = 0; g < G; g++) {
        st[g] = r.stage;
        if (g < ng) ready &= mbar_look<false>(&full[r.stage], r.parity);
        r.next(c.stages);
    }
    if (!ready) {
        r = k;
        for (int g = 0; g < ng; g++) {
            mbar_wait(&full[r.stage], r.parity, c.err, 2, dead, waited);
            r.next(c.stages);
        }
    }
}

// Releases the batch's `ng` stages, one arrive a warp (the empty barriers count CONSUMERS / 32):
// after __syncwarp every lane's reads of them come before it, and its release orders them before
// the producer's next copy.
__device__ __forceinline__ void release_batch(uint64_t* empty, const int (&st)[G], int ng) {
    __syncwarp();
    if ((threadIdx.x & 31) == 0) {
#pragma unroll
        for (int g = 0; g < G; g++)
            if (g < ng) mbar_arrive(&empty[st[g]]);
    }
}

// The phase's end for this block: the 8 warps' slots summed and added into the output rows with
// atomics (a row's segments may sit in other blocks).
__device__ __forceinline__ void flush(const Chain& c, const Phase& p, const Share& sh, const float* acc) {
    consumers_sync();  // every warp's slots written
    for (int i = threadIdx.x; i < 2 * sh.n; i += CONSUMERS) {
        float sum = 0.f;
#pragma unroll
        for (int w = 0; w < CONSUMERS / 32; w++) sum += acc[(size_t)w * 2 * c.acc_rows + i];
        const int row = sh.piece(i >> 1) % p.N;  // once a slot a phase
        atomicAdd(&p.out[(size_t)(i & 1) * p.N + row], sum);
    }
}

// The first of the share's pieces in segment `seg` or later (piece i is q = lo + i * step; segment
// q / N): where the input columns change. One division, once a segment.
__device__ __forceinline__ int segment_start(const Share& sh, int seg, int N) {
    const int q = seg * N - sh.lo;
    return q <= 0 ? 0 : (q + sh.step - 1) / sh.step;
}

__device__ void consume(const Chain& c, const Phase& p, const unsigned char* ring, uint64_t* full, uint64_t* empty,
                        float* acc, Ring& k, bool& dead, long long& waited) {
    const int tid = threadIdx.x, lane = tid & 31;
    const Share sh(p.N * (p.K / PIECE), c.interleave);
    const bool math = !(c.skip & SKIP_MATH);
    float x[2][16];  // this thread's columns of the current segment
    int seg = sh.n ? sh.piece(0) / p.N : 0;
    int next_seg_at = segment_start(sh, seg + 1, p.N);  // the first piece of the next segment
    if (math && sh.n) load_x(p, seg, x);
    for (int i0 = 0; i0 < sh.n;) {
        // a batch never crosses a segment (its pieces share the input columns)
        int ng = sh.n - i0 < G ? sh.n - i0 : G;
        ng = next_seg_at - i0 < ng ? next_seg_at - i0 : ng;
        int st[G];
        wait_batch(c, full, k, ng, st, dead, waited);
        uint4 w[G][2];
        if (math) {
            if (ng == G) {
#pragma unroll
                for (int g = 0; g < G; g++) {
                    const uint4* piece = reinterpret_cast<const uint4*>(ring + (size_t)st[g] * STAGE_BYTES);
                    w[g][0] = piece[tid];
                    w[g][1] = piece[CONSUMERS + tid];
                }
            } else {  // a short batch (a phase's or a segment's end): the missing pieces as zeros (not stored)
#pragma unroll
                for (int g = 0; g < G; g++) {
                    const uint4* piece = reinterpret_cast<const uint4*>(ring + (size_t)st[g] * STAGE_BYTES);
                    w[g][0] = g < ng ? piece[tid] : make_uint4(0u, 0u, 0u, 0u);
                    w[g][1] = g < ng ? piece[CONSUMERS + tid] : make_uint4(0u, 0u, 0u, 0u);
                }
            }
        }
        release_batch(empty, st, ng);
        k.advance(ng, c.stages);  // ng <= G <= stages
        const int b0 = i0;
        i0 += ng;
        const bool seg_ends = i0 == next_seg_at && i0 < sh.n;  // uniform
        if (!math) {
            if (seg_ends) next_seg_at = segment_start(sh, ++seg + 1, p.N);
            continue;
        }
        static_assert(G == 8, "the halving exchanges below sum exactly 16 values");
        float v[2 * G];  // [2 g + row]: 16 independent chains
#pragma unroll
        for (int g = 0; g < G; g++) {
            v[2 * g] = v[2 * g + 1] = 0.f;
            dot8(w[g][0], &x[0][0], &x[1][0], v[2 * g], v[2 * g + 1]);
            dot8(w[g][1], &x[0][8], &x[1][8], v[2 * g], v[2 * g + 1]);
        }
        if (seg_ends) {  // at most twice a phase
            load_x(p, ++seg, x);
            next_seg_at = segment_start(sh, seg + 1, p.N);
        }
        // The 16 sums across the warp by halving exchanges: 8 + 4 + 2 + 1 + 1 shuffles, after which
        // lane l holds the sum of value index ((l >> 1) & 15) with its bits reversed (below).
        halve<16>(v, lane, 16);
        halve<8>(v, lane, 8);
        halve<4>(v, lane, 4);
        halve<2>(v, lane, 2);
        v[0] += __shfl_xor_sync(0xffffffffu, v[0], 1);
        // lane bit 4 chose the upper half of 16 (index bit 3), bit 3 of 8 (bit 2), bit 2 (bit 1), bit 1 (bit 0)
        const int idx = ((lane >> 4) & 1) * 8 + ((lane >> 3) & 1) * 4 + ((lane >> 2) & 1) * 2 + ((lane >> 1) & 1);
        if (!(lane & 1) && (idx >> 1) < ng)  // the warp's own row of slots: plain stores
            acc[(size_t)(tid >> 5) * 2 * c.acc_rows + 2 * (b0 + (idx >> 1)) + (idx & 1)] = v[0];
    }
    flush(c, p, sh, acc);
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {  // both rounded to nearest even
    uint32_t a = __float_as_uint(lo), b = __float_as_uint(hi);
    a += 0x7fffu + ((a >> 16) & 1u);
    b += 0x7fffu + ((b >> 16) & 1u);
    return (a >> 16) | (b & 0xffff0000u);
}

__device__ __forceinline__ void mma16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

#if STREAM_GROUPS || STREAM_QUAD
#define PIECE_WARPS 4                        // consumer warps on one piece or batch (a group)
#define GROUPS (CONSUMERS / 32 / PIECE_WARPS)  // groups of consumer warps

// The phase's end for the forms whose pieces are each taken by one group of warps: a piece's
// PIECE_WARPS sums a row (slots [piece][warp of the group][row]) summed and added into the output
// rows with atomics (a row's segments may sit in other blocks).
__device__ __forceinline__ void flush_groups(const Phase& p, const Share& sh, const float* slots) {
    consumers_sync();  // every piece's slots written
    for (int i = threadIdx.x; i < 2 * sh.n; i += CONSUMERS) {
        const int piece = i >> 1, m = i & 1;
        float sum = 0.f;
#pragma unroll
        for (int w = 0; w < PIECE_WARPS; w++) sum += slots[2 * PIECE_WARPS * piece + 2 * w + m];
        atomicAdd(&p.out[(size_t)m * p.N + sh.piece(piece) % p.N], sum);
    }
}
#endif

#if STREAM_GROUPS
#define WARP_COLS (PIECE / PIECE_WARPS)      // a warp's columns of its group's pieces (1024)

// One phase's consumer work with STREAM_GROUPS: group g of consumer warps (warps 4 g .. 4 g + 3)
// takes every GROUPS-th piece of the block's share by itself, so each stage always belongs to one
// group (stages a multiple of GROUPS: two groups sharing a stage would alias its parity across
// rounds). Warp q of the group multiplies columns [1024 q, 1024 q + 1024) of the piece: lane l the
// 8 columns 256 j + 8 l of each j < 4, with the input's same columns held in registers (64 floats,
// reloaded when a piece starts a new segment), into four chains a row; then its two sums across
// the warp (5 exchanges each), lane 0 storing them into the piece's slot [piece][q][row]. A piece
// is released as soon as the warp has read it (one arrive a warp, the empty barriers count 4). At
// the phase's end each piece's four quarters are summed and added into the output rows with
// atomics. `pos` is the ring's position (pieces so far), the same in every consumer thread.
__device__ void consume_groups(const Chain& c, const Phase& p, const unsigned char* ring, uint64_t* full,
                              uint64_t* empty, float* slots, long long& pos, bool& dead, long long& waited) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, group = warp / PIECE_WARPS, q = warp % PIECE_WARPS;
    const Share sh(p.N * (p.K / PIECE), c.interleave);
    const bool math = !(c.skip & SKIP_MATH);
    Ring r(pos + group, c.stages);  // this group's first piece
    constexpr int J = WARP_COLS / 256;
    float x[2][J][8];  // [row][j][e]: columns WARP_COLS q + 256 j + 8 lane + e of the current segment
    int next_seg_at = 0;  // the first piece of the next segment (a reload at the first piece)
    for (int i = group; i < sh.n; i += GROUPS) {
        if (math && i >= next_seg_at) {  // uniform in the warp
            const int seg = sh.piece(i) / p.N;
            next_seg_at = segment_start(sh, seg + 1, p.N);
#pragma unroll
            for (int m = 0; m < 2; m++)
#pragma unroll
                for (int j = 0; j < J; j++)
                    load8(p.in + (size_t)m * p.in_stride + seg * PIECE + WARP_COLS * q + 256 * j + 8 * lane, x[m][j]);
        }
        mbar_wait(&full[r.stage], r.parity, c.err, 2, dead, waited);
        if (math) {
            const uint4* piece =
                reinterpret_cast<const uint4*>(ring + (size_t)r.stage * STAGE_BYTES) + WARP_COLS / 8 * q + lane;
            uint4 w[J];
#pragma unroll
            for (int j = 0; j < J; j++) w[j] = piece[32 * j];
            warp_release(&empty[r.stage]);
            float a[2][4] = {};
#pragma unroll
            for (int j = 0; j < J; j++) dot8(w[j], x[0][j], x[1][j], a[0][j & 3], a[1][j & 3]);
            float s0 = (a[0][0] + a[0][1]) + (a[0][2] + a[0][3]), s1 = (a[1][0] + a[1][1]) + (a[1][2] + a[1][3]);
#pragma unroll
            for (int off = 16; off; off >>= 1) {
                s0 += __shfl_xor_sync(0xffffffffu, s0, off);
                s1 += __shfl_xor_sync(0xffffffffu, s1, off);
            }
            if (lane == 0) {
                float* slot = slots + 2 * PIECE_WARPS * i + 2 * q;
                slot[0] = s0;
                slot[1] = s1;
            }
        } else {
            warp_release(&empty[r.stage]);
        }
        r.advance(GROUPS, c.stages);
    }
    pos += sh.n;
    if (math) flush_groups(p, sh, slots);
}
#endif

#if STREAM_QUAD
#define QUAD_STEPS (PIECE / PIECE_WARPS / 64)  // a warp's k-steps a batch (16), 64 columns of each piece a step

// The batches of a share: runs of up to QUAD consecutive pieces of one segment, in order (the
// producer and the consumers walk the same ones). A batch fills one stage set whatever its size.
struct Batches {
    Share sh;
    int N, i0 = 0, ng = 0, seg = 0, next_seg_at = 0;
    __device__ __forceinline__ Batches(const Share& s, int n_rows) : sh(s), N(n_rows) {
        if (sh.n) start_segment();
    }
    __device__ __forceinline__ void start_segment() {  // at i0, once a segment: one division
        seg = sh.piece(i0) / N;
        next_seg_at = segment_start(sh, seg + 1, N);
        size();
    }
    __device__ __forceinline__ void size() {
        ng = sh.n - i0 < QUAD ? sh.n - i0 : QUAD;
        ng = next_seg_at - i0 < ng ? next_seg_at - i0 : ng;
    }
    __device__ __forceinline__ bool more() const { return i0 < sh.n; }
    __device__ __forceinline__ void next() {
        i0 += ng;
        if (i0 == next_seg_at && i0 < sh.n) start_segment();
        else size();
    }
};

// The input rows as the B operand of m16n8k16 for warp q of a group (col-major 16 x 8 a k-step):
// column n = 4 m + j is input row m's columns 64 s + 16 j + [0, 16) of the warp's 1024 at k-step s,
// so lane (g = n, t) holds b0 = columns 2t, 2t + 1 and b1 = 8 + 2t, 8 + 2t + 1 of that chunk, rounded to
// bf16 (as the chain stores its activations). Reloaded when a batch starts a new segment.
__device__ __forceinline__ void load_xq(const Phase& p, int seg, uint32_t (&xb)[QUAD_STEPS][2]) {
    const int lane = threadIdx.x & 31, q = (threadIdx.x >> 5) % PIECE_WARPS, g = lane >> 2, t = lane & 3;
    const float* src = p.in + (size_t)(g >> 2) * p.in_stride + seg * PIECE + (PIECE / PIECE_WARPS) * q + 16 * (g & 3) +
                       2 * t;
#pragma unroll
    for (int s = 0; s < QUAD_STEPS; s++) {
        const float2 lo = __ldcg(reinterpret_cast<const float2*>(src + 64 * s));
        const float2 hi = __ldcg(reinterpret_cast<const float2*>(src + 64 * s + 8));
        xb[s][0] = pack_bf16(lo.x, lo.y);
        xb[s][1] = pack_bf16(hi.x, hi.y);
    }
}

// A batch's products by one warp of its group (STREAM_QUAD), from the set at `base` (this lane's
// ldmatrix row address, see consume_quads): its 1024 columns of each piece read with 16 ldmatrix.x4,
// the set released (one arrive a warp, the empty barriers count 4), then 16 mma.sync against the
// input's B operand `xb`. Returns, in lanes 0, 2, 16 and 18, piece lane / 16's (`lo`) and piece
// 2 + lane / 16's (`hi`) sum over the warp's columns for input row (lane / 2) % 2.
__device__ __forceinline__ void quad_products(uint32_t base, const uint32_t (&xb)[QUAD_STEPS][2], uint64_t* empty,
                                              float& lo, float& hi) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, j = g & 3;
    uint32_t a[QUAD_STEPS][4];
#pragma unroll
    for (int s = 0; s < QUAD_STEPS; s++)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                     : "=r"(a[s][0]), "=r"(a[s][1]), "=r"(a[s][2]), "=r"(a[s][3]) : "r"(base + 128 * s) : "memory");
    warp_release(empty);
    float d[2][4] = {};
#pragma unroll
    for (int s = 0; s < QUAD_STEPS; s++) mma16816(d[s & 1], a[s][0], a[s][1], a[s][2], a[s][3], xb[s][0], xb[s][1]);
    // lane (g, t) holds C[g][4 m + j] (m = t / 2) in c[j % 2] where t % 2 == j / 2; rows 0-7 (c0, c1)
    // are pieces g / 4, rows 8-15 (c2, c3) pieces 2 + g / 4
    const bool useful = (t & 1) == (j >> 1);
    lo = useful ? (j & 1 ? d[0][1] + d[1][1] : d[0][0] + d[1][0]) : 0.f;
    hi = useful ? (j & 1 ? d[0][3] + d[1][3] : d[0][2] + d[1][2]) : 0.f;
#pragma unroll
    for (int off = 1; off <= 8; off <<= 1) {  // over lane bits 0, 2, 3 (t % 2 and j): the classes
        if (off == 2) continue;
        lo += __shfl_xor_sync(0xffffffffu, lo, off);
        hi += __shfl_xor_sync(0xffffffffu, hi, off);
    }
}

// This lane's ldmatrix row address in stage set 0 for warp q of a group: lane l gives row
// (l % 8) + 8 ((l / 8) % 2) = 4 p + j of the A operand, columns 8 (l / 16) on (with QUAD < 4 the
// rows of pieces p >= QUAD read piece p % QUAD again, not stored).
__device__ __forceinline__ uint32_t quad_lane_row(const unsigned char* ring, int q) {
    const int lane = threadIdx.x & 31;
    const int prow = (((lane & 7) >> 2) + 2 * ((lane >> 3) & 1)) % QUAD;
    return saddr(ring) + (uint32_t)(prow * STAGE_BYTES + 2 * (PIECE / PIECE_WARPS) * q + 32 * (lane & 3) +
                                    16 * (lane >> 4));
}

// One phase's consumer work with STREAM_QUAD and the static deal. The block's share is cut into
// batches (Batches), the t-th batch of the run (`pos`, counted over every phase) filling stage set
// t % sets; group t % 2 of consumer warps takes it alone (sets is even, so each stage set always
// belongs to one group and a group has up to sets / 2 batches in flight). Its products on tensor
// cores: m16n8k16 with A's row 4 p + j = piece p's 16-column chunks of class j (chunk c with c % 4
// == j) and B's column 4 m + j = input row m's chunks of class j, so C[4 p + j][4 m + j] is piece
// p's sum for input row m over class j (the rest of C is not used; the rows of a short batch's
// missing pieces read whatever their stages hold). Warp q of the group takes columns [1024 q,
// 1024 q + 1024) of each piece: 16 k-steps of 64 columns, one ldmatrix.x4 each (conflict free: a
// matrix's 8 rows are two pieces x four classes, 16-byte skewed stages); quad_products. Its sums
// go into the pieces' slots [piece][q][row]; flush_groups at the end.
__device__ void consume_quads(const Chain& c, const Phase& p, const unsigned char* ring, uint64_t* full,
                              uint64_t* empty, float* slots, long long& pos, Ring& r, bool& dead, long long& waited) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, group = warp / PIECE_WARPS, q = warp % PIECE_WARPS;
    const Share sh(p.N * (p.K / PIECE), c.interleave);
    const bool math = !(c.skip & SKIP_MATH);
    const int sets = c.stages / QUAD;
    const uint32_t lane_a = quad_lane_row(ring, q);
    uint32_t xb[QUAD_STEPS][2];
    int x_seg = -1;
    for (Batches b(sh, p.N); b.more(); b.next(), pos++) {
        if ((int)(pos & 1) != group) continue;
        if (math && b.seg != x_seg) {  // before the wait: the loads overlap it
            load_xq(p, b.seg, xb);
            x_seg = b.seg;
        }
        mbar_wait(&full[r.stage], r.parity, c.err, 2, dead, waited);
        if (math) {
            float lo, hi;
            quad_products(lane_a + (uint32_t)(r.stage * QUAD * STAGE_BYTES), xb, &empty[r.stage], lo, hi);
            if ((lane & 13) == 0) {  // lanes 0, 2, 16, 18
                const int pl = lane >> 4, m = (lane >> 1) & 1;
                if (pl < b.ng) slots[2 * PIECE_WARPS * (b.i0 + pl) + 2 * q + m] = lo;
                if (pl + 2 < b.ng) slots[2 * PIECE_WARPS * (b.i0 + pl + 2) + 2 * q + m] = hi;
            }
        } else {
            warp_release(&empty[r.stage]);
        }
        r.advance(GROUPS, sets);
    }
    if (math) flush_groups(p, sh, slots);
}

// One phase's consumer work with STREAM_QUAD and the claimed deal (`c.claims`): the producers of
// every block claim the phase's batches (4 consecutive pieces of one segment, batch b = pieces
// [4 b, 4 b + 4) in segment-major order) one at a time from the phase's counter, so a block that
// streams faster takes more of them, and tell their consumers which batch a set holds in its tag
// (-1: the phase is over, one such set for each group). Each group takes its sets in ring order as
// consume_quads does; the warps add their sums into the output rows with atomics.
__device__ void consume_quads_claimed(const Chain& c, const Phase& p, const unsigned char* ring, uint64_t* full,
                                      uint64_t* empty, const int* tags, Ring& r, bool& dead, long long& waited) {
    const int lane = threadIdx.x & 31, q = (threadIdx.x >> 5) % PIECE_WARPS;
    const bool math = !(c.skip & SKIP_MATH);
    const int sets = c.stages / QUAD;
    const uint32_t lane_a = quad_lane_row(ring, q);
    uint32_t xb[QUAD_STEPS][2];
    int x_seg = 0;
    if (math) load_xq(p, 0, xb);  // batches come in increasing order: segment 0 first
    for (;;) {
        mbar_wait(&full[r.stage], r.parity, c.err, 2, dead, waited);
        const int b = dead ? -1 : tags[r.stage];
        if (b < 0 || !math) {
            warp_release(&empty[r.stage]);
            r.advance(GROUPS, sets);
            if (b < 0) break;
            continue;
        }
        const int first = QUAD * b, seg = first / p.N, row = first - seg * p.N;
        if (seg != x_seg) {  // at most twice a phase
            load_xq(p, seg, xb);
            x_seg = seg;
        }
        float lo, hi;
        quad_products(lane_a + (uint32_t)(r.stage * QUAD * STAGE_BYTES), xb, &empty[r.stage], lo, hi);
        r.advance(GROUPS, sets);
        if ((lane & 13) == 0) {  // lanes 0, 2, 16, 18
            const int pl = lane >> 4, m = (lane >> 1) & 1;
            if (pl < QUAD) atomicAdd(&p.out[(size_t)m * p.N + row + pl], lo);
            if (pl + 2 < QUAD) atomicAdd(&p.out[(size_t)m * p.N + row + pl + 2], hi);
        }
    }
}
#endif

extern "C" __global__ void __launch_bounds__(THREADS, 1) stream_chain_kernel(const __grid_constant__ Chain c) {
    extern __shared__ __align__(128) unsigned char ring[];
    // L2_COPY: a scratch stage after the ring, and its sink barrier after the ring's barriers
#if L2_AHEAD
    const unsigned char* scratch = ring + (size_t)c.stages * STAGE_BYTES;
#endif
    uint64_t* full = reinterpret_cast<uint64_t*>(ring + (size_t)c.stages * STAGE_BYTES + L2_COPY * PIECE_BYTES);
    uint64_t* empty = full + c.stages;
    uint64_t* sink = empty + c.stages;
    float* acc = reinterpret_cast<float*>(empty + c.stages + L2_COPY);
#if STREAM_QUAD
    int* tags = reinterpret_cast<int*>(acc + (size_t)(CONSUMERS / 32) * 2 * c.acc_rows);  // a stage set's batch
#endif
    const int tid = threadIdx.x;
    const int phases = 4 * c.L;
    bool dead = false;

    if (tid == 0) {
        for (int i = 0; i < c.stages; i++) {
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(saddr(&full[i])));
            asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;"
                         :: "r"(saddr(&empty[i])),
                            "n"(STREAM_GROUPS || STREAM_QUAD ? 4 : CONSUMERS / 32));
        }
        if (L2_COPY) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(saddr(sink)));
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();

    if (tid >= CONSUMERS) {  // the producer warp: one thread streams every piece of the block's shares
        if (tid != CONSUMERS) return;
        const long long c0 = clock64();
        long long waited = 0;
        Ring k;
#if L2_AHEAD
        Ahead ahead;
        long long asked = 0, copied = 0;  // pieces asked of L2, pieces whose copy was issued
#if STREAM_QUAD
        int pre_b0 = 0, pre_n = 0;        // the claimed deal: this phase's batches claimed at the last one's end
#endif
#endif
        for (int s = 0; s < phases; s++) {
            const Phase p = phase_of(c, s);
#if STREAM_QUAD
            if (c.claims) {  // the claimed deal (consume_quads_claimed)
                const int batches = p.N / QUAD * (p.K / PIECE);
#if L2_AHEAD
                // first the batches claimed at the last phase's end, then one claim at a time
                int pre = 0;
                auto claim = [&]() { return pre < pre_n ? pre_b0 + pre++ : (int)atomicAdd(&c.claims[s], 1u); };
#else
                auto claim = [&]() { return (int)atomicAdd(&c.claims[s], 1u); };
#endif
                int b = claim();
                for (int ends = 0; ends < GROUPS;) {  // the phase's end told to each group
                    const int next = b < batches ? claim() : b;  // its latency overlaps
#if L2_AHEAD
                    if (b >= batches && ends == 0 && s + 1 < phases) {
                        // this block's first CLAIM_AHEAD batches of the next phase, claimed now and asked
                        // of L2, so that HBM streams them while the consumers stop at the grid barrier
                        const Phase q = phase_of(c, s + 1);
                        const int q_batches = q.N / QUAD * (q.K / PIECE);
                        pre_b0 = (int)atomicAdd(&c.claims[s + 1], (unsigned)CLAIM_AHEAD);
                        pre_n = q_batches - pre_b0 < CLAIM_AHEAD ? q_batches - pre_b0 : CLAIM_AHEAD;
                        pre_n = pre_n > 0 ? pre_n : 0;
                        for (int j = 0; j < pre_n; j++) {
                            const int first = QUAD * (pre_b0 + j), seg = first / q.N;
                            for (int i = 0; i < QUAD; i++) prefetch_piece(q, first - seg * q.N + i, seg, scratch, sink);
                        }
                    }
#endif
                    const int set = k.stage;
                    mbar_wait<PRODUCER_SLEEP_NS>(&empty[set], k.parity ^ 1, c.err, 3, dead, waited);
                    k.next(c.stages / QUAD);
                    if (b >= batches) {  // a tag, no bytes
                        tags[set] = -1;
                        mbar_arrive(&full[set]);
                        ends++;
                        continue;
                    }
                    tags[set] = b;  // ordered before the consumers' reads by the arrive's release
                    expect_bytes(&full[set], QUAD * PIECE_BYTES);
                    const int first = QUAD * b, seg = first / p.N;
                    for (int i = 0; i < QUAD; i++)
                        copy_piece(ring + (size_t)(set * QUAD + i) * STAGE_BYTES, p, first - seg * p.N + i, seg,
                                   &full[set]);
                    b = next;
                }
            } else {  // the static deal: a batch a stage set, one wait for it, one arrive for its bytes, a copy a piece
                const Share sh(p.N * (p.K / PIECE), c.interleave);
                Cursor cur(sh, p.N);
                for (Batches b(sh, p.N); b.more(); b.next()) {
                    const int set = k.stage;
#if L2_AHEAD
                    for (copied += b.ng; asked < copied + L2_AHEAD && ahead.next(c, phases, scratch, sink);) asked++;
#endif
                    mbar_wait<PRODUCER_SLEEP_NS>(&empty[set], k.parity ^ 1, c.err, 3, dead, waited);
                    k.next(c.stages / QUAD);
                    expect_bytes(&full[set], b.ng * PIECE_BYTES);
                    for (int i = 0; i < b.ng; i++, cur.next())
                        copy_piece(ring + (size_t)(set * QUAD + i) * STAGE_BYTES, p, cur.row, cur.seg, &full[set]);
                }
            }
#else
            const Share sh(p.N * (p.K / PIECE), c.interleave);
            Cursor cur(sh, p.N);
            for (int i = 0; i < sh.n; i++, cur.next()) {
                const int st = k.stage;
#if L2_AHEAD
                for (copied++; asked < copied + L2_AHEAD && ahead.next(c, phases, scratch, sink);) asked++;
#endif
                // a fresh barrier's previous phase (parity 1) counts as complete: round 0 passes at once
                mbar_wait<PRODUCER_SLEEP_NS>(&empty[st], k.parity ^ 1, c.err, 3, dead, waited);
                k.next(c.stages);
                expect_bytes(&full[st], PIECE_BYTES);
                copy_piece(ring + (size_t)st * STAGE_BYTES, p, cur.row, cur.seg, &full[st]);
            }
#endif
            if (c.trace) c.trace[((size_t)blockIdx.x * phases + s) * TRACE + TR_ISSUED] = now_ns();
        }
#if L2_COPY
        // the scratch copies still in flight land before the block's shared memory goes: the one
        // arrive the sink expects, then its phase, which completes when their bytes have
        mbar_arrive(sink);
        mbar_wait<PRODUCER_SLEEP_NS>(sink, 0, c.err, 3, dead, waited);
#endif
        if (c.stats) {
            c.stats[blockIdx.x * STATS + ST_PROD_TOTAL] = clock64() - c0;
            c.stats[blockIdx.x * STATS + ST_EMPTY] = waited;
        }
        return;
    }

    const long long c0 = clock64();
    long long in_grid = 0, waited = 0;
#if STREAM_GROUPS || STREAM_QUAD
    long long pos = 0;  // the ring's position (pieces or batches so far)
#endif
#if STREAM_QUAD
    Ring r(threadIdx.x / 32 / PIECE_WARPS, c.stages / QUAD);  // this group's first stage set
#elif !STREAM_GROUPS
    Ring k;
#endif
    for (int s = 0; s < phases; s++) {
        if (s > 0 && !(c.skip & SKIP_GRID)) {
            if (tid == 0) {
                const long long g0 = clock64();
                grid_wait(c.bar, (unsigned)s * (BARRIER_RELAXED == 3 ? (gridDim.x + TREE_BLOCKS - 1) / TREE_BLOCKS
                                                                      : gridDim.x),
                          c.err, dead);
                in_grid += clock64() - g0;
            }
            consumers_sync();
        }
        if (c.trace && tid == 0) c.trace[((size_t)blockIdx.x * phases + s) * TRACE + TR_START] = now_ns();
        const Phase p = phase_of(c, s);
        if (s + 1 < phases) {  // zero this block's share of the next phase's output
            const Phase q = phase_of(c, s + 1);
            long lo, hi;
            share(2L * q.N, lo, hi);
            for (long i = lo + tid; i < hi; i += CONSUMERS) q.out[i] = 0.f;
        }
#if STREAM_GROUPS
        consume_groups(c, p, ring, full, empty, acc, pos, dead, waited);
#elif STREAM_QUAD
        if (c.claims) consume_quads_claimed(c, p, ring, full, empty, tags, r, dead, waited);
        else consume_quads(c, p, ring, full, empty, acc, pos, r, dead, waited);
#else
        consume(c, p, ring, full, empty, acc, k, dead, waited);
#endif
        consumers_sync();  // every thread's atomics and zeroing issued
        if (tid == 0) {
            if (c.trace) c.trace[((size_t)blockIdx.x * phases + s) * TRACE + TR_END] = now_ns();
#if BARRIER_RELAXED == 1  // diagnostic: no fence before the arrive (the phase's outputs are not ordered before it)
            asm volatile("red.relaxed.gpu.global.add.u32 [%0], 1;" :: "l"(c.bar) : "memory");
#elif BARRIER_RELAXED == 2  // an acquire-release fence (not sequentially consistent) before a relaxed arrive
            asm volatile("fence.acq_rel.gpu;\n red.relaxed.gpu.global.add.u32 [%0], 1;" :: "l"(c.bar) : "memory");
#elif BARRIER_RELAXED == 3
            arrive_tree(c.bar, s);
#else
            __threadfence();
            atomicAdd(c.bar, 1u);
#endif
        }
    }
    if (c.stats && tid == 0) {
        c.stats[blockIdx.x * STATS + ST_TOTAL] = clock64() - c0;
        c.stats[blockIdx.x * STATS + ST_GRID] = in_grid;
        c.stats[blockIdx.x * STATS + ST_FULL] = waited;
    }
}

// Host side, called through ctypes. Returns a cudaError_t (0: launched).
extern "C" int stream_chain_smem_bytes(int stages, int acc_rows) {
    // the ring, its barriers, each consumer warp's slots, with STREAM_QUAD the stage sets' tags, with
    // L2_COPY the scratch stage and its sink barrier
    return stages * STAGE_BYTES + 2 * stages * 8 + (CONSUMERS / 32) * 2 * acc_rows * 4 +
           STREAM_QUAD * (stages / QUAD) * 4 + L2_COPY * (PIECE_BYTES + 8);
}

// Raises the kernel's dynamic shared-memory limit; once, before any launch (not while a graph is captured).
extern "C" int stream_chain_prepare(int stages, int acc_rows) {
    return (int)cudaFuncSetAttribute(stream_chain_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     stream_chain_smem_bytes(stages, acc_rows));
}

extern "C" int stream_chain_launch(const void* w_qkv, const void* w_o, const void* w_gu, const void* w_d,
                                   const float* x0, float* out_qkv, float* out_o, float* out_gu, float* out_d,
                                   unsigned* bar, int* err, long long* stats, unsigned long long* trace,
                                   unsigned* claims, int skip,
                                   int interleave, int H, int NQKV, int INTER, int L, int stages, int acc_rows,
                                   int blocks, void* stream) {
    Chain c;
    c.w[0] = (const uint16_t*)w_qkv; c.w[1] = (const uint16_t*)w_o;
    c.w[2] = (const uint16_t*)w_gu; c.w[3] = (const uint16_t*)w_d;
    c.x0 = x0;
    c.out[0] = out_qkv; c.out[1] = out_o; c.out[2] = out_gu; c.out[3] = out_d;
    c.bar = bar; c.err = err; c.stats = stats; c.trace = trace; c.claims = claims;
    c.skip = skip; c.interleave = interleave;
    c.H = H; c.NQKV = NQKV; c.INTER = INTER; c.L = L;
    c.stages = stages; c.acc_rows = acc_rows;
    stream_chain_kernel<<<blocks, THREADS, stream_chain_smem_bytes(stages, acc_rows), (cudaStream_t)stream>>>(c);
    return (int)cudaGetLastError();
}

extern "C" int stream_chain_stats() { return STATS; }

extern "C" int stream_chain_trace() { return TRACE; }

extern "C" const char* stream_chain_error_string(int e) { return cudaGetErrorString((cudaError_t)e); }

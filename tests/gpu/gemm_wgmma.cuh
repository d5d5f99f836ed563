// ---------------------------------------------------------------------------------------------
// matmul, the top rung: kernel4_wgmma (Hopper, sm_90a only). Written to be pasted into kernels.cuh
// after mt__gemm; it uses MT_CUDA_CHECK, mt__launch_check and mt_fatal from there.
//
// THE MATH is mt__gemm's:  C[i][j] (=|+=) sum_k A(i,k) B(j,k)  (+ bias[j] when bias != NULL),
// accumulate = 0 writes C = A B^T + bias, accumulate = 1 adds C += A B^T (+ bias), with A (M x K)
// and B (N x K) each "k inner" (X(i,k) = x[i*ld + k]) or "k outer" (X(i,k) = x[k*ld + i]).
// Here A and B are bf16 in global memory (the caller casts once), C, bias and the sums are fp32.
//
// THE MACHINE. Three Hopper pieces do all the work:
//   TMA    (cp.async.bulk.tensor) copies a 2-D box of a tensor from global to shared memory on its
//          own, described by a CUtensorMap built on the host; out-of-bounds elements arrive as
//          zeros (so ragged M, N, K need no special code), and it reports completion by
//          decrementing a transaction count on an mbarrier;
//   mbarrier  a shared-memory barrier object with a phase bit: threads "arrive", the TMA "completes
//          bytes", and when both counts reach zero the phase flips; waiters spin on the parity;
//   wgmma  (wgmma.mma_async) one warpgroup (4 consecutive warps, 128 threads) multiplies a 64 x 16
//          slice of A by a 16 x N slice of B, both read straight from shared memory through 64-bit
//          "matrix descriptors", into fp32 accumulators in registers, asynchronously.
//
// TILES. Block tile 128 (rows of C) x 256 (columns) x 64 (k per pipeline stage). Two consumer
// warpgroups each own 64 x 256 of C: 128 fp32 accumulators per thread, the largest wgmma shape
// (m64n256k16), so B's 256 x 64 stage is read once from shared memory for both halves of A and
// every byte loaded feeds 2*128*256*64 / ((128+256)*64*2) = 85 FLOP (arithmetic intensity per
// shared byte; an H200 needs ~ 990 TFLOP/s / (33 TB/s of shared memory) ~ 30). k = 64 bf16 is
// 128 bytes: one row of a tile is exactly one 128-byte swizzle row (below).
//
// WARP ROLES (384 threads, one block per SM, persistent):
//   warpgroup 0   producer: one thread issues the TMA copies of A and B for stage after stage;
//                 the other 127 threads only give their registers back (setmaxnreg.dec 40).
//   warpgroups 1, 2  consumers: wait for a stage, issue 4 wgmma (k = 4 x 16), release the stage,
//                 and at the end of a tile write C from registers (setmaxnreg.inc 232).
// The grid is min(units, SMs) blocks; block b does units b, b + grid, b + 2*grid, ... (a unit is an
// output tile, a k-slice of one, or a stream-K worker's range: see THE WORK below), so while the
// consumers write one tile's C the producer is already loading the next tile's first stages.
//
// THE RING (4 stages of 48 KB = 192 KB of shared memory) and its two mbarriers per stage:
//   full[s]   count 1: the producer arrives once with expect_tx(48 KB); the TMA completes the bytes.
//   empty[s]  count 8: lane 0 of each of the 8 consumer warps arrives when its wgmma no longer read s.
// Iteration `it` (counted across all units of the block, identically by producer and consumers)
// uses stage s = it % 4 for the (it / 4)-th time; the n-th completion of a barrier's phase ends
// phase n, whose parity is n & 1. So the consumers wait full[s] for parity (it/4) & 1, and the
// producer, before refilling s for round r = it/4 >= 1, waits empty[s] for parity (r-1) & 1.
// Consumers keep one wgmma group in flight: after issuing stage it they wait until at most one
// group is pending (wgmma.wait_group 1), i.e. stage it-1 is done, and release it-1.
//
// SHARED MEMORY LAYOUT AND SWIZZLE. Each stage: A 128 x 64 bf16 (16 KB), B 256 x 64 bf16 (32 KB),
// every buffer 1024-byte aligned. The TMA writes with CU_TENSOR_MAP_SWIZZLE_128B: inside each
// 1024-byte block of 8 rows of 128 bytes, the 16-byte chunk c of row r lands at chunk c ^ (r % 8),
// so that the 8 rows wgmma reads together hit 8 different bank groups. wgmma's descriptor mode
// "128B swizzle" undoes exactly this XOR. The layout of a tile depends on the operand's storage:
//   k inner ("K-major", tnsp = 0): one TMA box {64 k, rows}: row i of the tile = 128 bytes = its
//       64 k values. Descriptor: 8-row groups 1024 B apart (SBO = 1024; LBO unused). The k16 slice
//       kk (0..3) starts 32*kk bytes into the row (the hardware applies the XOR after adding).
//   k outer ("MN-major", tnsp = 1): boxes {64 rows, 64 k} (a 128-byte swizzle row holds only 64
//       rows of the tile): line k of a box = 64 consecutive rows i at that k. A's 128 rows are 2
//       boxes, B's 256 are 4, 8 KB apart. Descriptor: 8-k groups 1024 B apart (SBO = 1024),
//       64-row blocks 8192 B apart (LBO = 8192); the k16 slice kk starts 16 lines = 2048*kk in.
// wgmma's transpose bits read the k-outer tiles as they are: no transpose pass anywhere.
//
// SPLIT-K AND STREAM-K (the weight gradients: K = B*T = 16k, but only 18-72 output tiles of
// 128 x 256 for 132 SMs). Two ways to give every SM work, chosen by mt__wgmma_splits from the shape:
//   split-K   the k range is cut into `splits` slices (multiples of 64); unit u = tile*splits + z.
//   stream-K  the k-steps of all tiles are laid end to end and cut into 132 equal ranges, one per
//             "worker"; a range may end inside one tile and begin inside the next, so every SM
//             does the same number of k-steps (split-K wastes part of the last wave instead).
//             Correct and tested, but slower at our shapes (L2 locality, see mt__wgmma_splits), so
//             the launcher only uses it when asked to.
// Either way a piece of a tile writes its 128 x 256 fp32 partial product to a scratch slot (in
// register order: whole 512-byte rows of float4), and a second kernel,
// mt_matmul_kernel4_splitk_reduce, adds the partials of every output in k order (slice 0, 1, ...
// or worker first, ..., last) and applies the bias / accumulation. No float atomics, no order that
// depends on timing: bit-identical every run. The plan (and the 132 workers) is a function of the
// shape only, not of the GPU, so results agree across devices too. (A first version let the last
// slice to arrive add the others inside the GEMM kernel: correct, but then one SM reads the whole
// tile's partials alone, ~20 us; the separate kernel spreads that over all SMs.)
//
// REQUIREMENTS (mt_fatal otherwise): the binary holds sm_90a code and the GPU is a Hopper (CC 9.0);
// a and b 16-byte aligned; lda, ldb multiples of 8 (the TMA needs 16-byte row strides). c, bias:
// any float alignment (float2 stores when c is 8-byte aligned and ldc, N even).

#include <cuda.h>           // CUtensorMap and its enums (types only: no -lcuda needed)
#include <cudaTypedefs.h>   // PFN_cuTensorMapEncodeTiled_v12000

static const int MT__WG_BM = 128, MT__WG_BN = 256, MT__WG_BK = 64, MT__WG_STAGES = 4;
static const int MT__WG_A_BYTES = MT__WG_BM * MT__WG_BK * 2;                      // 16 KB per stage
static const int MT__WG_B_BYTES = MT__WG_BN * MT__WG_BK * 2;                      // 32 KB per stage
static const int MT__WG_SMEM = 1024 /* alignment slack */ + MT__WG_STAGES * (MT__WG_A_BYTES + MT__WG_B_BYTES) +
                               2 * MT__WG_STAGES * 8 /* mbarriers */;
static const int MT__WG_THREADS = 384;   // producer warpgroup + 2 consumer warpgroups
static const int MT__WG_SMS = 132;       // the SM count the split-K choice assumes (H100 / H200 SXM)

typedef struct {
    float *c;                // C (M, N), row stride ldc
    const float *bias;       // (N) or NULL
    int M, N, K, ldc;
    int accumulate;          // 1: C += ..., 0: C = ...
    int store2_ok;           // c 8-byte aligned, ldc and N even: float2 stores
    int tiles_m, tiles_n;    // output tiles of 128 x 256
    int splits, k_per_split; // split-K: unit u = tile * splits + z covers k in [z*k_per_split, (z+1)*k_per_split)
    int steps_tile;          // k-steps of 64 per tile: ceil(K / 64)
    int sk_workers;          // stream-K: the k-steps of all tiles, in a row, cut among this many workers; 0: off
    int sk_slots;            // stream-K: partial slots per worker (the most tiles one worker's range can touch)
    long long sk_total;      // stream-K: tiles * steps_tile
    float *workspace;        // partials, (slots, 2 halves, 32, 128) float4; NULL when every unit writes C
} mt__wgmma_args;

// ---- PTX helpers (mbarrier, TMA: sm_90; wgmma, setmaxnreg: sm_90a only, used only inside the
// kernel's sm_90a branch). All shared-memory addresses are 32-bit .shared::cta addresses.
__device__ static inline uint32_t mt__smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }
// mbarrier.init: set the barrier's expected arrival count for each phase
__device__ static inline void mt__mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// arrive once and add `bytes` to the transaction count this phase must also see completed (by the TMA)
__device__ static inline void mt__mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// arrive once (no transaction bytes)
__device__ static inline void mt__mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// has the phase with this parity completed? (try_wait may block briefly in hardware before answering)
__device__ static inline uint32_t mt__mbar_try_wait(uint32_t bar, uint32_t parity) {
    uint32_t done;
    asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    return done;
}
// spin until the phase with this parity has completed. MT_WGMMA_HANG_TRAP (tests): trap instead of
// hanging forever when a phase never comes (a wrong parity or a lost arrival), so the run fails fast
__device__ static inline void mt__mbar_wait(uint32_t bar, uint32_t parity) {
#ifdef MT_WGMMA_HANG_TRAP   // give up after ~4 s by the global nanosecond timer
    uint64_t t0 = 0;
    for (uint32_t n = 1; !mt__mbar_try_wait(bar, parity); n++) {
        if (n % 1024 != 0) continue;
        uint64_t t;
        asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
        if (t0 == 0) t0 = t;
        else if (t - t0 > 4000000000ull) __trap();
    }
#else
    while (!mt__mbar_try_wait(bar, parity)) {}
#endif
}
// TMA: copy the box at coordinates (x0 innermost, x1) of the tensor `map` into shared memory at dst,
// completing its bytes on the mbarrier bar
__device__ static inline void mt__tma_load_2d(uint32_t dst, const CUtensorMap *map, int x0, int x1, uint32_t bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
                 ::"r"(dst), "l"((uint64_t)map), "r"(x0), "r"(x1), "r"(bar) : "memory");
}
// fetch a tensor map (it lives in kernel-parameter space) into the TMA unit's cache ahead of use
__device__ static inline void mt__tma_prefetch_map(const CUtensorMap *map) {
    asm volatile("prefetch.tensormap [%0];\n" ::"l"((uint64_t)map) : "memory");
}
// wgmma.fence: order earlier register writes (zeroed accumulators) before the next wgmma reads them
__device__ static inline void mt__wgmma_fence(void) { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
// close the wgmma ops issued so far into one group, which wait_group can then wait for
__device__ static inline void mt__wgmma_commit(void) { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// wait until at most N committed wgmma groups of this warpgroup are still running
template <int N>
__device__ static inline void mt__wgmma_wait(void) { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
// tell the compiler a register may have changed here (keeps accumulator reads after the wait)
__device__ static inline void mt__reg_fence(float &r) { asm volatile("" : "+f"(r)::"memory"); }
// setmaxnreg: this warpgroup's per-thread register budget shrinks (dec) or grows (inc) to N
template <int N>
__device__ static inline void mt__setmaxnreg_dec(void) { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N)); }
template <int N>
__device__ static inline void mt__setmaxnreg_inc(void) { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N)); }
// a wgmma shared-memory matrix descriptor: start address, leading / stride byte offsets (all >> 4),
// bits 62-63 = 1: the 128-byte swizzle (base offset 0: every tile is 1024-byte aligned)
__device__ static inline uint64_t mt__wgmma_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)(lbo >> 4) << 16) | ((uint64_t)(sbo >> 4) << 32) |
           (1ull << 62);
}
// D (64 x 256 fp32, 128 registers a thread) += A (64 x 16 bf16, descriptor) * B (16 x 256 bf16,
// descriptor)^T. TA / TB: 0 = the operand's tile is K-major (k inner), 1 = MN-major (k outer).
// Register d[4*n + e] holds row 16*warp + lane/4 (+8 for e >= 2), column 8*n + 2*(lane%4) (+1 for odd e).
template <int TA, int TB>
__device__ static inline void mt__wgmma_m64n256k16(float d[128], uint64_t desc_a, uint64_t desc_b) {
    asm volatile("{\n"
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
                 "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
                 "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
                 "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
                 "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127},\n"
                 " %128, %129, 1, 1, 1, %130, %131;\n"   // scale-d = 1 (accumulate), scale-a = scale-b = 1
                 "}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
                   "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
                   "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
                   "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
                   "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
                   "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
                   "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
                   "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
                   "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
                   "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
                   "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
                   "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
                   "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
                 : "l"(desc_a), "l"(desc_b), "n"(TA), "n"(TB)
                 : "memory");
}

// where output tile t starts: tiles in groups of 8 row tiles, column by column inside a group (as
// mt__gemm_tile), so the ~132 blocks running together share A's rows and B's columns in L2
__device__ static inline void mt__wgmma_tile_origin(const mt__wgmma_args &g, int t, int *row0, int *col0) {
    const int group_size = 8;
    int first_m = (t / (group_size * g.tiles_n)) * group_size;
    int rows = min(g.tiles_m - first_m, group_size);
    int in_group = t % (group_size * g.tiles_n);
    *row0 = (first_m + in_group % rows) * MT__WG_BM;
    *col0 = (in_group / rows) * MT__WG_BN;
}
// THE WORK of a block, one piece at a time. A piece is (tile, k range, slot): slot < 0 means it
// covers the whole k range and writes C; otherwise it writes its partial to workspace slot `slot`.
//   plain / split-K (sk_workers == 0): unit u = tile * splits + z, units blockIdx.x + n * gridDim.x.
//   stream-K: lay the k-steps of all tiles end to end (tile 0's steps, then tile 1's, ...: sk_total)
//       and give worker w the range [w * sk_total / W, (w+1) * sk_total / W); workers
//       blockIdx.x + n * gridDim.x. Each range covers the tail of one tile, whole tiles, the head of
//       another: every block does the same number of k-steps (to +-1), whatever the tile count.
//       Piece (worker w, tile t) writes slot w * sk_slots + (t - first tile of w).
typedef struct { int u; long long x, end; } mt__wgmma_cursor;
typedef struct { int tile, k_begin, steps; long long slot; } mt__wgmma_piece;
__host__ __device__ static inline long long mt__sk_start(const mt__wgmma_args &g, int w) {
    return (long long)w * g.sk_total / g.sk_workers;
}
__device__ static inline void mt__wgmma_begin(const mt__wgmma_args &g, mt__wgmma_cursor *c) {
    c->u = blockIdx.x;
    if (g.sk_workers) { c->x = mt__sk_start(g, c->u); c->end = mt__sk_start(g, c->u + 1); }
}
// the next piece of this block's work; 0 when there is none
__device__ static inline int mt__wgmma_next(const mt__wgmma_args &g, mt__wgmma_cursor *c, mt__wgmma_piece *p) {
    if (!g.sk_workers) {
        if (c->u >= g.tiles_m * g.tiles_n * g.splits) return 0;
        int u = c->u;
        c->u += gridDim.x;
        p->tile = u / g.splits;
        p->k_begin = (u % g.splits) * g.k_per_split;
        int k_end = min(g.K, p->k_begin + g.k_per_split);
        p->steps = k_end > p->k_begin ? (k_end - p->k_begin + MT__WG_BK - 1) / MT__WG_BK : 0;
        p->slot = g.splits > 1 ? u : -1;
        return 1;
    }
    while (c->x >= c->end) {   // this worker's range is done (or empty): the block's next worker
        c->u += gridDim.x;
        if (c->u >= g.sk_workers) return 0;
        c->x = mt__sk_start(g, c->u);
        c->end = mt__sk_start(g, c->u + 1);
    }
    int t = (int)(c->x / g.steps_tile);
    long long piece_end = min(c->end, (long long)(t + 1) * g.steps_tile);
    p->tile = t;
    p->k_begin = (int)(c->x - (long long)t * g.steps_tile) * MT__WG_BK;
    p->steps = (int)(piece_end - c->x);
    p->slot = (long long)c->u * g.sk_slots + (t - (int)(mt__sk_start(g, c->u) / g.steps_tile));
    c->x = piece_end;
    return 1;
}

// write one output of C, with bias and accumulation exactly as mt__gemm_store
__device__ static inline void mt__wgmma_store1(const mt__wgmma_args &g, int i, int j, float v) {
    if (i >= g.M || j >= g.N) return;
    float *c = g.c + (size_t)i * g.ldc + j;
    if (g.bias) v += g.bias[j];
    *c = g.accumulate ? *c + v : v;
}

template <int A_K_INNER, int B_K_INNER>
__global__ void __launch_bounds__(MT__WG_THREADS, 1)
    mt_matmul_kernel4_wgmma(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                            mt__wgmma_args g) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)   // sm_90a only: wgmma and setmaxnreg exist nowhere else
    extern __shared__ uint8_t mt__wg_smem_raw[];
    // the ring, 1024-byte aligned (the 128-byte swizzle repeats every 1024 bytes)
    uint32_t base = (mt__smem_u32(mt__wg_smem_raw) + 1023) & ~1023u;
    const uint32_t ring_a = base;                                           // stage s: ring_a + s * 16 KB
    const uint32_t ring_b = base + MT__WG_STAGES * MT__WG_A_BYTES;          // stage s: ring_b + s * 32 KB
    const uint32_t bars = ring_b + MT__WG_STAGES * MT__WG_B_BYTES;          // full[s] at bars + 8s
    const uint32_t full0 = bars, empty0 = bars + 8 * MT__WG_STAGES;         // empty[s] at empty0 + 8s

    if (threadIdx.x == 0) {
        for (int s = 0; s < MT__WG_STAGES; s++) {
            mt__mbar_init(full0 + 8 * s, 1);    // the producer's arrive (+ the TMA's bytes)
            mt__mbar_init(empty0 + 8 * s, 8);   // lane 0 of each consumer warp
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");   // visible to the TMA unit
    }
    __syncthreads();

    if (threadIdx.x < 128) {
        // ---------------- producer warpgroup: one thread feeds the ring ----------------
        mt__setmaxnreg_dec<40>();
        if (threadIdx.x != 0) return;
        mt__tma_prefetch_map(&map_a);
        mt__tma_prefetch_map(&map_b);
        int it = 0;
        mt__wgmma_cursor cur;
        mt__wgmma_piece pc;
        mt__wgmma_begin(g, &cur);
        while (mt__wgmma_next(g, &cur, &pc)) {
            int row0, col0;
            mt__wgmma_tile_origin(g, pc.tile, &row0, &col0);
            for (int t = 0; t < pc.steps; t++, it++) {
                int s = it % MT__WG_STAGES, round = it / MT__WG_STAGES;
                if (round > 0) mt__mbar_wait(empty0 + 8 * s, (round - 1) & 1);   // consumers done with s
                uint32_t full = full0 + 8 * s, a = ring_a + s * MT__WG_A_BYTES, b = ring_b + s * MT__WG_B_BYTES;
                mt__mbar_arrive_expect_tx(full, MT__WG_A_BYTES + MT__WG_B_BYTES);
                int k0 = pc.k_begin + t * MT__WG_BK;
                if (A_K_INNER) mt__tma_load_2d(a, &map_a, k0, row0, full);   // box {64 k, 128 rows}
                else
                    for (int h = 0; h < MT__WG_BM / 64; h++) mt__tma_load_2d(a + h * 8192, &map_a, row0 + 64 * h, k0, full);
                if (B_K_INNER) mt__tma_load_2d(b, &map_b, k0, col0, full);   // box {64 k, 256 rows}
                else
                    for (int h = 0; h < MT__WG_BN / 64; h++) mt__tma_load_2d(b + h * 8192, &map_b, col0 + 64 * h, k0, full);
            }
        }
        return;
    }

    // ---------------- consumer warpgroups 1 and 2: the tensor cores, then C ----------------
    mt__setmaxnreg_inc<232>();
    const int wg = threadIdx.x / 128 - 1;            // which 64-row half of the tile
    const int lt = threadIdx.x % 128, warp = lt / 32, lane = threadIdx.x % 32;
    int it = 0;
    mt__wgmma_cursor cur;
    mt__wgmma_piece pc;
    mt__wgmma_begin(g, &cur);
    while (mt__wgmma_next(g, &cur, &pc)) {
        int row0, col0, steps = pc.steps;
        mt__wgmma_tile_origin(g, pc.tile, &row0, &col0);
        float d[128];
        #pragma unroll
        for (int r = 0; r < 128; r++) d[r] = 0.0f;
        for (int t = 0; t < steps; t++, it++) {
            int s = it % MT__WG_STAGES;
            mt__mbar_wait(full0 + 8 * s, (it / MT__WG_STAGES) & 1);   // the TMA has landed stage s
            uint32_t a = ring_a + s * MT__WG_A_BYTES + wg * 8192, b = ring_b + s * MT__WG_B_BYTES;
            mt__wgmma_fence();
            #pragma unroll
            for (int kk = 0; kk < MT__WG_BK / 16; kk++) {
                uint64_t da = A_K_INNER ? mt__wgmma_desc(a + 32 * kk, 16, 1024) : mt__wgmma_desc(a + 2048 * kk, 8192, 1024);
                uint64_t db = B_K_INNER ? mt__wgmma_desc(b + 32 * kk, 16, 1024) : mt__wgmma_desc(b + 2048 * kk, 8192, 1024);
                mt__wgmma_m64n256k16<A_K_INNER ? 0 : 1, B_K_INNER ? 0 : 1>(d, da, db);
            }
            mt__wgmma_commit();
            mt__wgmma_wait<1>();   // the previous stage's group is finished: give that stage back
            if (t > 0 && lane == 0) mt__mbar_arrive(empty0 + 8 * ((it - 1) % MT__WG_STAGES));
        }
        mt__wgmma_wait<0>();
        if (steps > 0 && lane == 0) mt__mbar_arrive(empty0 + 8 * ((it - 1) % MT__WG_STAGES));
        #pragma unroll
        for (int r = 0; r < 128; r++) mt__reg_fence(d[r]);

        if (pc.slot >= 0) {   // a partial: to its scratch slot, float4 q of all 128 threads side by side
            float4 *mine = (float4 *)g.workspace + ((size_t)pc.slot * 2 + wg) * (32 * 128);
            #pragma unroll
            for (int q = 0; q < 32; q++) __stcg(mine + q * 128 + lt, make_float4(d[4 * q], d[4 * q + 1], d[4 * q + 2], d[4 * q + 3]));
            continue;
        }
        // epilogue: registers -> C. This thread holds rows i0 and i0 + 8, columns j0 + 8n and
        // j0 + 8n + 1 (n = 0..31). C and bias might alias for all the compiler knows, so it would
        // not move a load of C above a store to C: each read-modify-write would wait a full memory
        // round trip. Instead the loads of 8 column pairs x 2 rows are issued together, then the
        // stores: 4 round trips per tile instead of 64.
        int i0 = row0 + 64 * wg + 16 * warp + lane / 4, j0 = col0 + 2 * (lane % 4);
        if (g.store2_ok) {   // c 8-byte aligned, ldc and N even: float2 loads and stores
            float *c0 = g.c + (size_t)i0 * g.ldc, *c1 = c0 + (size_t)8 * g.ldc;
            int in0 = i0 < g.M, in1 = i0 + 8 < g.M;
            #pragma unroll
            for (int n0 = 0; n0 < 32; n0 += 8) {
                float2 old0[8], old1[8], bias[8];
                #pragma unroll
                for (int n = 0; n < 8; n++) {
                    int j = j0 + 8 * (n0 + n), in_n = j < g.N;
                    float2 zero = make_float2(0.0f, 0.0f);
                    bias[n] = g.bias && in_n ? *(const float2 *)(g.bias + j) : zero;
                    old0[n] = g.accumulate && in_n && in0 ? *(const float2 *)(c0 + j) : zero;
                    old1[n] = g.accumulate && in_n && in1 ? *(const float2 *)(c1 + j) : zero;
                }
                #pragma unroll
                for (int n = 0; n < 8; n++) {   // as mt__gemm_store: C = old + (sum + bias)
                    int j = j0 + 8 * (n0 + n), e = 4 * (n0 + n);
                    if (j >= g.N) continue;
                    if (in0) *(float2 *)(c0 + j) = make_float2(old0[n].x + (d[e] + bias[n].x), old0[n].y + (d[e + 1] + bias[n].y));
                    if (in1) *(float2 *)(c1 + j) = make_float2(old1[n].x + (d[e + 2] + bias[n].x), old1[n].y + (d[e + 3] + bias[n].y));
                }
            }
        } else {             // any alignment, N odd: one output at a time (slow, correct)
            #pragma unroll
            for (int n = 0; n < 32; n++) {
                mt__wgmma_store1(g, i0, j0 + 8 * n, d[4 * n]);
                mt__wgmma_store1(g, i0, j0 + 8 * n + 1, d[4 * n + 1]);
                mt__wgmma_store1(g, i0 + 8, j0 + 8 * n, d[4 * n + 2]);
                mt__wgmma_store1(g, i0 + 8, j0 + 8 * n + 1, d[4 * n + 3]);
            }
        }
    }
#endif
}

// split-K / stream-K, second pass: one thread per float4 of a partial (tile t, half wg, register
// group q, thread lt of the consumer warpgroup). It adds the tile's partials in k order (split-K:
// slices z = 0, 1, ...; stream-K: workers w = first, ..., last that touched tile t), then writes
// the four outputs it holds (the wgmma register layout above) with bias / accumulation.
__global__ void mt_matmul_kernel4_splitk_reduce(mt__wgmma_args g) {
    size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= (size_t)g.tiles_m * g.tiles_n * 2 * 32 * 128) return;
    int lt = (int)(e % 128), q = (int)(e / 128 % 32), wg = (int)(e / 4096 % 2), t = (int)(e / 8192);
    const float4 *base = (const float4 *)g.workspace + wg * 4096 + q * 128 + lt;   // + slot * 8192
    float4 s = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (!g.sk_workers) {
        for (int z = 0; z < g.splits; z++) {
            float4 v = __ldcs(base + ((size_t)t * g.splits + z) * 8192);   // streaming: read once
            s.x += v.x; s.y += v.y; s.z += v.z; s.w += v.w;
        }
    } else {   // the workers whose ranges hold k-steps x0 and x1 (the tile's first and last), and between
        long long x0 = (long long)t * g.steps_tile, x1 = x0 + g.steps_tile - 1;
        int w0 = (int)(((x0 + 1) * g.sk_workers - 1) / g.sk_total), w1 = (int)(((x1 + 1) * g.sk_workers - 1) / g.sk_total);
        for (int w = w0; w <= w1; w++) {
            long long start = mt__sk_start(g, w);
            if (start == mt__sk_start(g, w + 1)) continue;   // an empty range: no piece
            float4 v = __ldcs(base + ((size_t)w * g.sk_slots + (t - (int)(start / g.steps_tile))) * 8192);
            s.x += v.x; s.y += v.y; s.z += v.z; s.w += v.w;
        }
    }
    int row0, col0;
    mt__wgmma_tile_origin(g, t, &row0, &col0);
    int i = row0 + 64 * wg + 16 * (lt / 32) + (lt % 32) / 4, j = col0 + 8 * q + 2 * (lt % 4);
    mt__wgmma_store1(g, i, j, s.x);
    mt__wgmma_store1(g, i, j + 1, s.y);
    mt__wgmma_store1(g, i + 8, j, s.z);
    mt__wgmma_store1(g, i + 8, j + 1, s.w);
}

// ---- host side
// Does the binary hold sm_90a code for the current GPU? The probe kernel declares 256 bytes of static
// shared memory only in its sm_90a build; cudaFuncGetAttributes reports the build the GPU would run.
__global__ void mt__wgmma_probe_kernel(int *out) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    __shared__ int marker[64];
    marker[threadIdx.x % 64] = 1;
    __syncthreads();
    if (out) *out = marker[0];
#else
    if (out) *out = 0;
#endif
}
static void mt__wgmma_check_supported(void) {
    int dev, major, minor;
    MT_CUDA_CHECK(cudaGetDevice(&dev));
    MT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    MT_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    if (major != 9 || minor != 0)
        mt_fatal("--gemm wgmma needs a Hopper GPU (compute capability 9.0), this one is %d.%d\nhint: --gemm mma", major, minor);
    cudaFuncAttributes fa;
    cudaError_t err = cudaFuncGetAttributes(&fa, mt__wgmma_probe_kernel);
    if (err != cudaSuccess || fa.sharedSizeBytes != 64 * sizeof(int)) {
        (void)cudaGetLastError();
        mt_fatal("--gemm wgmma: this binary has no sm_90a code (wgmma exists only there)\n"
                 "hint: build with -gencode=arch=compute_90a,code=sm_90a, or use --gemm mma");
    }
}
// cuTensorMapEncodeTiled lives in the driver (libcuda); the runtime hands us its address, so the
// program needs no -lcuda. Looked up once (a function-local static is initialised once, thread-safely).
static PFN_cuTensorMapEncodeTiled_v12000 mt__wgmma_lookup_encode(void) {
    void *fn = NULL;
    cudaDriverEntryPointQueryResult found;
    MT_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found));
    if (found != cudaDriverEntryPointSuccess || fn == NULL) mt_fatal("the CUDA driver has no cuTensorMapEncodeTiled (driver too old for TMA)");
    return (PFN_cuTensorMapEncodeTiled_v12000)fn;
}
// the tensor map of one bf16 operand X (rows x K): k inner -> dims {K, rows}, box {64, box_rows};
// k outer -> dims {rows, K}, box {64, 64}. 128-byte swizzle, out-of-bounds elements read as zero.
static CUtensorMap mt__wgmma_map(const __nv_bfloat16 *x, int rows, int K, int ld, int k_inner, int box_rows) {
    static PFN_cuTensorMapEncodeTiled_v12000 encode = mt__wgmma_lookup_encode();
    CUtensorMap map;
    cuuint64_t dims[2] = {(cuuint64_t)(k_inner ? K : rows), (cuuint64_t)(k_inner ? rows : K)};
    cuuint64_t strides[1] = {(cuuint64_t)ld * sizeof(__nv_bfloat16)};   // bytes from one dims[1] step to the next
    cuuint32_t box[2] = {64, (cuuint32_t)(k_inner ? box_rows : 64)};
    cuuint32_t elem_strides[2] = {1, 1};
    CUresult r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, (void *)x, dims, strides, box, elem_strides,
                        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) mt_fatal("cuTensorMapEncodeTiled failed (error %d) for a %d x %d operand, ld %d", (int)r, rows, K, ld);
    return map;
}
// THE PLAN for a GEMM of `tiles` output tiles of `steps` k-steps each: 1 = one block per tile,
// S > 1 = split-K in S slices. Estimated time, in units of one k-step of one block (~0.78 us on an
// H200): (waves of tiles*S units on 132 SMs) x (k-steps per unit + ~4 for its epilogue), plus for
// S > 1 the reduce kernel: ~3 to launch + 0.044 per 128 x 256 partial read (128 KB at ~4 TB/s =
// 33 ns). Slices of at least 8 steps, at most 16; more slices must win by 3%. A function of the
// shape only (132 is fixed, not read from the GPU), so the bits of C do not depend on the device.
// Stream-K (plan 0) is never chosen here: measured on an H200 at GPT-2's weight-gradient shapes it
// was 15-40% SLOWER than split-K although it balances the k-steps perfectly. Its workers start at
// staggered k positions, so the blocks working on tiles that share rows of A or columns of B no
// longer read them at the same time and L2 stops catching the re-reads (these products reread
// each operand 3-24 times); split-K slices of neighbouring tiles start at the same k together.
// It stays available (mt__gemm_wgmma_splits(..., -1, ...)) and tested, for the curious.
static int mt__wgmma_splits(int tiles, int steps) {
    int best = 1;
    double best_cost = 1e300;
    for (int s = 1; s <= 16; s++) {
        int per = (steps + s - 1) / s;
        if (s > 1 && per < 8) break;
        double waves = (double)((tiles * s + MT__WG_SMS - 1) / MT__WG_SMS);
        double cost = waves * (per + 4) + (s > 1 ? 3.0 + 0.044 * s * tiles : 0.0);
        if (cost < 0.97 * best_cost) { best = s; best_cost = cost; }
    }
    return best;
}
template <int A_K_INNER, int B_K_INNER>
static void mt__gemm_wgmma_launch(const CUtensorMap &map_a, const CUtensorMap &map_b, const mt__wgmma_args &g, int grid,
                                  cudaStream_t stream) {
    MT_CUDA_CHECK(cudaFuncSetAttribute(mt_matmul_kernel4_wgmma<A_K_INNER, B_K_INNER>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, MT__WG_SMEM));
    mt_matmul_kernel4_wgmma<A_K_INNER, B_K_INNER><<<grid, MT__WG_THREADS, MT__WG_SMEM, stream>>>(map_a, map_b, g);
    mt__launch_check("mt_matmul_kernel4_wgmma", stream);
}
// mt__gemm_wgmma with the plan chosen by the caller, for tests: want_splits = 0: mt__wgmma_splits
// decides; S > 0: S k-slices (1 = none); -1: stream-K
static void mt__gemm_wgmma_splits(float *c, const __nv_bfloat16 *a, const __nv_bfloat16 *b, const float *bias, int M,
                                  int N, int K, int lda, int ldb, int ldc, int a_k_inner, int b_k_inner, int accumulate,
                                  int want_splits, cudaStream_t stream) {
    if (M <= 0 || N <= 0) return;
    if (K < 0) mt_fatal("GEMM with a negative reduction length K = %d", K);
    mt__wgmma_check_supported();
    if ((uintptr_t)a % 16 != 0 || (uintptr_t)b % 16 != 0 || lda % 8 != 0 || ldb % 8 != 0)
        mt_fatal("--gemm wgmma: the TMA needs 16-byte aligned operands and leading dimensions that are multiples of 8 "
                 "(got lda %d, ldb %d)", lda, ldb);
    if (lda < (a_k_inner ? K : M) || ldb < (b_k_inner ? K : N) || ldc < N)
        mt_fatal("--gemm wgmma: leading dimension too small (lda %d, ldb %d, ldc %d for M %d N %d K %d)", lda, ldb, ldc, M, N, K);
    int Kmap = K > 0 ? K : 1;   // K = 0: no k-step runs, the maps are never read, but must be valid
    CUtensorMap map_a = mt__wgmma_map(a, M, Kmap, lda, a_k_inner, MT__WG_BM);
    CUtensorMap map_b = mt__wgmma_map(b, N, Kmap, ldb, b_k_inner, MT__WG_BN);
    mt__wgmma_args g;
    memset(&g, 0, sizeof g);
    g.c = c; g.bias = bias; g.M = M; g.N = N; g.K = K; g.ldc = ldc; g.accumulate = accumulate;
    g.store2_ok = (uintptr_t)c % 8 == 0 && ldc % 2 == 0 && N % 2 == 0 && (bias == NULL || (uintptr_t)bias % 8 == 0);
    g.tiles_m = (M + MT__WG_BM - 1) / MT__WG_BM;
    g.tiles_n = (N + MT__WG_BN - 1) / MT__WG_BN;
    int tiles = g.tiles_m * g.tiles_n, steps = (K + MT__WG_BK - 1) / MT__WG_BK;
    int plan = want_splits != 0 ? (want_splits < 0 ? 0 : want_splits) : mt__wgmma_splits(tiles, steps);
    if (K == 0) plan = 1;
    int splits = plan > 0 ? plan : 1;
    g.steps_tile = steps;
    g.k_per_split = ((steps + splits - 1) / splits) * MT__WG_BK;    // a multiple of 64
    if (g.k_per_split == 0) g.k_per_split = MT__WG_BK;               // K = 0: one empty slice
    g.splits = K == 0 ? 1 : (K + g.k_per_split - 1) / g.k_per_split; // no empty slice
    size_t units = (size_t)tiles * g.splits;
    if (units > 2147483647u) mt_fatal("--gemm wgmma: %zu tiles is too many", units);
    size_t slots = g.splits > 1 ? units : 0;
    if (plan == 0) {   // stream-K: 132 workers, whatever the GPU
        g.sk_workers = MT__WG_SMS;
        g.sk_total = (long long)tiles * steps;
        g.sk_slots = (int)(((g.sk_total + MT__WG_SMS - 1) / MT__WG_SMS + steps - 1) / steps) + 1;
        units = MT__WG_SMS;
        slots = (size_t)MT__WG_SMS * g.sk_slots;
    }
    if (slots)   // scratch for the partials, from the stream-ordered pool
        MT_CUDA_CHECK(cudaMallocAsync((void **)&g.workspace, slots * MT__WG_BM * MT__WG_BN * sizeof(float), stream));
    int dev, sms;
    MT_CUDA_CHECK(cudaGetDevice(&dev));
    MT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    int grid = (int)(units < (size_t)sms ? units : (size_t)sms);
    if (a_k_inner && b_k_inner) mt__gemm_wgmma_launch<1, 1>(map_a, map_b, g, grid, stream);
    else if (a_k_inner) mt__gemm_wgmma_launch<1, 0>(map_a, map_b, g, grid, stream);
    else if (b_k_inner) mt__gemm_wgmma_launch<0, 1>(map_a, map_b, g, grid, stream);
    else mt__gemm_wgmma_launch<0, 0>(map_a, map_b, g, grid, stream);
    if (slots) {
        size_t n4 = (size_t)tiles * 2 * 32 * 128;   // one thread per float4 of a tile
        mt_matmul_kernel4_splitk_reduce<<<(unsigned)((n4 + 255) / 256), 256, 0, stream>>>(g);
        mt__launch_check("mt_matmul_kernel4_splitk_reduce", stream);
        MT_CUDA_CHECK(cudaFreeAsync(g.workspace, stream));
    }
}
// C[i][j] (=|+=) sum_k A(i,k) B(j,k) (+ bias[j]); a, b bf16 device pointers, c and bias fp32.
// The layouts and the accumulate / bias rules are mt__gemm's. a, b 16-byte aligned, lda, ldb % 8 == 0.
void mt__gemm_wgmma(float *c, const __nv_bfloat16 *a, const __nv_bfloat16 *b, const float *bias, int M, int N, int K,
                    int lda, int ldb, int ldc, int a_k_inner, int b_k_inner, int accumulate, cudaStream_t stream) {
    mt__gemm_wgmma_splits(c, a, b, bias, M, N, K, lda, ldb, ldc, a_k_inner, b_k_inner, accumulate, 0, stream);
}

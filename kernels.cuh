/* kernels.cuh - the CUDA kernels of megatron.h and their launchers (GPU build only).
 *
 * megatron.h includes this file at its backend seam (end of section 3, "(3 of 3)"), in place of
 * the seam's CPU half, so each kernel sits next to the CPU function it must match:
 *
 *   mt_X_cpu(args...)                        the definition (megatron.h, 3. OPS)
 *   mt_X_kernel                              the __global__ function(s) that compute the same thing
 *   mt_X_gpu(args..., cudaStream_t stream)   the launcher: the same arguments in the same order,
 *                                            all pointers DEVICE pointers; checks its launches
 *
 * THE RULE is the CPU's: every backward ADDS (+=) into its d-buffers and the caller zeroes them;
 * a kernel that writes with '=' says so. Storage is fp32 (parameters, gradients, activations),
 * but for the tensors that only ever enter the tensor cores, born in 16 bits with --bf16/--fp16:
 * a layer's q, k, v (mt_matmul_forward16_gpu, megatron.h's mt_qkv_storage_dtype), the MLP's GELU
 * output (never stored: mt_mlp_forward_gpu) and the LM head's logits and their gradient (in their
 * place: mt_cross_entropy_finish16_kernel, mt_logits_grad_dtype). bf16 and fp16 are otherwise
 * only compute types (--bf16, --fp16; mt_dtype): the GEMM and attention tensor-core paths round
 * their fp32 operands to bf16 or fp16 as they load them (a template parameter F16 picks the
 * instruction's form) and accumulate in fp32. The CPU build emulates the same roundings
 * (megatron.h, 3. OPS, "reduced precision"), and keeps those tensors in fp32: the same values.
 *
 * CONTENTS (numbered as megatron.h's sections)
 *   1. UTILITIES & ERRORS (GPU)  MT_CUDA_CHECK, launch checks, MT_SYNC_DEBUG, programmatic dependent
 *                                launch, the kernel scratch's arena, the counter-based RNG on the
 *                                device, fill / zero / fp32<->bf16 and fp32->fp16 casts
 *   3. OPS: GPU KERNELS          embedding, position embedding, layernorm, matmul (the GEMM ladder:
 *                                naive, tiled, mma, wgmma), dropout, attention (FlashAttention-2, fp32 and
 *                                mma; forward and backward on wgmma, FA3's layout), attention over the KV
 *                                cache (generation), GELU, residual, vocab-parallel
 *                                cross-entropy, AdamW
 *   6. OPTIMIZER, CLIPPING       sum of squares (the gradient norm, in double), scale, loss
 *                                scaling's unscale-and-check (one pass, an inf/NaN flag)
 *   THE BACKEND SEAM, GPU HALF   mt_<op>(r, ...) -> the launcher on the rank's stream; buffers in
 *                                device memory; the device's set-up, stream and memory in use (the
 *                                context at start, our buffers, the kernel scratch's arena and pool:
 *                                the memory report's figures)
 *                                (megatron.h's section 3 has the CPU half, with the same names)
 *
 * DETERMINISM: no kernel adds floats through atomics, so every result is the same bit for bit from
 * run to run. Reductions over rows (layernorm's dweight/dbias, matmul's dbias, split-K GEMM, the
 * gradient norm) write per-block partial sums to a scratch buffer and a second kernel adds them in
 * a fixed order; the embedding backward groups the positions of each token with a stable
 * counting sort (section 3, embedding). The only atomics are integer counts.
 * SCRATCH: launchers that need temporary device memory take it with mt__scratch_alloc and give
 * it back with mt__scratch_free before they end (section 1, "kernel scratch"): pieces of the rank's
 * arena, one buffer made at start-up at the memory plan's size and lent by host bookkeeping alone,
 * so a captured CUDA graph records no allocation between two kernels and keeps their programmatic
 * edge; what the arena cannot serve (another stream, no room, no arena) comes from the stream-
 * ordered pool as cudaMallocAsync / cudaFreeAsync. The sizes are megatron.h's (section 3, "the GPU
 * build's kernel scratch"), so the memory plan counts exactly what is borrowed and the arena holds
 * a step's ops; a new mt__scratch_alloc here needs its term there.
 * MT_SYNC_DEBUG=1 in the environment: every launch is followed by cudaStreamSynchronize and a
 * check, so an asynchronous fault is reported by the op that caused it.
 * TESTS: tests/gpu/test_kernels.cu compares every kernel here with its CPU twin on fresh random
 * inputs, then times them at GPT-2 small's shapes.
 */
#ifndef MT_KERNELS_CUH
#define MT_KERNELS_CUH
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cooperative_groups.h>   // thread-block clusters (decoding's split attention)
#include <cuda.h>           // CUtensorMap and its enums (types only: no -lcuda needed)
#include <cudaTypedefs.h>   // PFN_cuTensorMapEncodeTiled_v12000
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

// =============================================================================================
// 1. UTILITIES & ERRORS (GPU)
// =============================================================================================
// Every CUDA runtime call goes through MT_CUDA_CHECK; every launcher ends with mt__launch_check.
// Both end in mt_fatal (megatron.h, 1.), so one breakpoint catches every GPU error too.

// (MT_CUDA_CHECK itself is megatron.h's, section 1: the GPU build's errors.)

// MT_SYNC_DEBUG=1: read once (a function-local static is initialised once, thread-safely)
static int mt__sync_debug(void) {
    static const int on = getenv("MT_SYNC_DEBUG") != NULL && atoi(getenv("MT_SYNC_DEBUG")) != 0;
    return on;
}
// after every launch: was the launch itself refused (bad geometry, too much shared memory)?
// and with MT_SYNC_DEBUG=1, did the kernel fail while running?
static void mt__launch_check(const char *kernel, cudaStream_t stream) {
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess)
        mt_fatal("launching %s failed: %s (%s)\nhint: run again with MT_SYNC_DEBUG=1 to stop at the op that caused it",
                 kernel, cudaGetErrorName(err), cudaGetErrorString(err));
    if (!mt__sync_debug()) return;
    err = cudaStreamSynchronize(stream);
    if (err != cudaSuccess)
        mt_fatal("%s failed while running: %s (%s)\nhint: compute-sanitizer ./your_program shows the faulting access",
                 kernel, cudaGetErrorName(err), cudaGetErrorString(err));
}
// number of blocks of `threads` threads that cover n items (a 1-D grid holds at most 2^31-1 blocks)
static unsigned int mt__blocks(size_t n, int threads) {
    size_t blocks = (n + (size_t)threads - 1) / (size_t)threads;
    if (blocks > 2147483647u) mt_fatal("a kernel over %zu items needs more than 2^31-1 blocks", n);
    return blocks == 0 ? 1u : (unsigned int)blocks;
}
// kernels that need more than 48 KiB of dynamic shared memory must say so before their launch
static void mt__allow_smem(const void *kernel, size_t bytes) {
    if (bytes > 48 * 1024)
        MT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}
static int mt__aligned16(const void *p) { return ((uintptr_t)p % 16) == 0; }

// ---------------------------------------------------------------------------------------------
// programmatic dependent launch (PDL, Hopper): a kernel that starts before the one ahead of it ends
// ---------------------------------------------------------------------------------------------
// A decode step is ~90 small kernels in a row, each a few microseconds, and between two of them
// the GPU drains the first, makes its writes visible, then launches and ramps up the second: a
// gap of about a microsecond per kernel, in which a GEMV has not even asked for its weights yet.
// Launched with the attribute cudaLaunchAttributeProgrammaticStreamSerialization, a kernel may
// start as soon as every block of the kernel ahead of it has executed `griddepcontrol.
// launch_dependents` (mt__pdl_launch_next), and it must execute `griddepcontrol.wait`
// (mt__pdl_wait) before it reads anything the kernel ahead wrote: the wait returns when that
// kernel has completed and its memory is visible (PTX ISA, "griddepcontrol"). What a kernel does
// before its wait must not depend on the kernel ahead: the GEMV loads its weights there.
// The rule that keeps a chain of such kernels right: EVERY kernel launched so waits, in every
// thread, before it reads or writes what another kernel of the step touches (a kernel that never
// waited could end before the one ahead of it, and the one after it would then wait too little).
// Without the attribute (any launch outside a captured graph) both instructions do nothing.
// mt__pdl_on: set while a decode step or a training chunk is captured (mt_device_capture_begin):
// mt__launch then adds the attribute. Only kernels launched through mt__launch get it, and each of
// those starts with mt__pdl_start; a kernel launched with <<<...>>> waits for the whole of the
// kernel ahead as always, and the kernel after it for the whole of it. In a training chunk that
// is the wgmma GEMMs and their split-K reduction, the layernorm forward and backward (with its
// reduction), the column sums of the bias gradients, the wgmma attention (forward, D, dK/dV, dQ),
// the cross-entropy and the residual add: most of the ~460 kernel boundaries of GPT-2 small's
// step. (Thread-local: each rank thread captures its own stream.)
static MT_THREAD_LOCAL int mt__pdl_on;
// mt__capturing: a capture is on; mt__capturing_plain: it is a training chunk's, not a decode step's
// (mt_device_capture_begin, section 12)
static MT_THREAD_LOCAL int mt__capturing, mt__capturing_plain;
// THE NEXT KERNEL LAUNCHED AT THE START. In a decode step's graph the GEMVs, the qkv + attention and
// the row layernorms read nothing before their wait but what no kernel of the step writes (weights,
// biases, layernorm parameters, the cache rows of earlier steps, start[] from the step before). So
// they let the next kernel launch as soon as all their blocks have started, not after their wait:
// the next kernel's weights stream in while this one still waits for the kernel ahead, and by the
// time its own wait returns they are in registers. Safe from deadlock as before: a kernel is
// launched only once every block of the one ahead is resident. Not in a training chunk, where a
// kernel two ahead may write what a later kernel reads before its wait. The launchers ask for it at
// one row only (batch 1: 4 us a token with the GEMV's multicast; at batch 8 it lost 4 us).
// (docs/perf.md, sessions 45 and 47)
static inline int mt__pdl_early(void) { return mt__pdl_on && !mt__capturing_plain; }
__device__ static inline void mt__pdl_wait(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ static inline void mt__pdl_launch_next(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
// the two together: wait for the kernel ahead, then let the next one start
__device__ static inline void mt__pdl_start(void) {
    mt__pdl_wait();
    mt__pdl_launch_next();
}
// kernel<<<grid, block, smem, stream>>>(args...), with the PDL attribute while mt__pdl_on; then
// mt__launch_check(name). The kernels launched so are the ones a decode step runs: each starts
// with mt__pdl_start (after any loads that do not depend on the kernel ahead): the next kernel
// launches only once this one has waited, so at most two are in flight, one computing and the
// next loading its weights.
// mt__launch_cluster: the same with the grid's blocks in thread-block clusters of `cluster` along x
// (Hopper; the kernel reaches its cluster through mt__cluster); 1: no cluster attribute.
template <typename... Params, typename... Args>
static void mt__launch_cluster(const char *name, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                               cudaStream_t stream, unsigned cluster, Args... args) {
    cudaLaunchConfig_t config = {};
    config.gridDim = grid;
    config.blockDim = block;
    config.dynamicSmemBytes = smem;
    config.stream = stream;
    cudaLaunchAttribute attribute[2];
    unsigned count = 0;
    if (cluster > 1) {   // `cluster` consecutive blocks together
        attribute[count].id = cudaLaunchAttributeClusterDimension;
        attribute[count].val.clusterDim.x = cluster;
        attribute[count].val.clusterDim.y = 1;
        attribute[count].val.clusterDim.z = 1;
        count++;
    }
    if (mt__pdl_on) {
        attribute[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attribute[count].val.programmaticStreamSerializationAllowed = 1;
        count++;
    }
    config.attrs = attribute;
    config.numAttrs = count;
    cudaError_t err = cudaLaunchKernelEx(&config, kernel, ((Params)args)...);
    if (err != cudaSuccess)
        mt_fatal("launching %s failed: %s (%s)\nhint: run again with MT_SYNC_DEBUG=1 to stop at the op that caused it",
                 name, cudaGetErrorName(err), cudaGetErrorString(err));
    mt__launch_check(name, stream);
}
template <typename... Params, typename... Args>
static void mt__launch(const char *name, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                       cudaStream_t stream, Args... args) {
    mt__launch_cluster(name, kernel, grid, block, smem, stream, 1u, args...);
}

// ---------------------------------------------------------------------------------------------
// kernel scratch: the rank's arena, temporary device memory lent for the length of one op
// ---------------------------------------------------------------------------------------------
// Many launchers need device memory only while their op runs: split-K partial tiles, 16-bit
// copies of GEMM operands, per-block partial sums (megatron.h section 3, "the GPU build's kernel
// scratch", sizes each). cudaMallocAsync / cudaFreeAsync on the stream would do, and did: stream-
// ordered, served from the device's pool, capturable. But inside a captured CUDA graph each of
// them becomes a graph node of its own (a memory allocation, a memory free), and the edge from
// such a node into the next kernel is a full dependency: that kernel can no longer start behind
// the one ahead (programmatic dependent launch, above). Measured on an H200 (GPT-2 small, bf16,
// B = 16, MT_GRAPH_STATS=1): the backward chunk's graph held 171 allocations and 171 frees beside
// its 335 kernels, and only 151 of its 678 edges went from a kernel to a kernel.
//
// So each rank owns one device buffer, the arena, made once by mt_device_init at the size the
// memory plan gives its kernel scratch (mt_device_scratch_bytes: the largest op's sum), and
// mt__scratch_alloc lends pieces of it by host bookkeeping alone: no CUDA call, nothing recorded
// in a graph, the kernels simply get addresses inside the arena.
//
// The bookkeeping is a bump pointer and a stack:
//   alloc   the piece starts at `top` (a multiple of 256 bytes from the arena's start, which
//           cudaMalloc aligns to 256: the TMA and the float4 loads need 16) and top moves past
//           it, rounded up to 256; the piece is pushed on the stack
//   free    marks the piece's entry freed, then pops every freed entry off the top of the stack,
//           moving top back to where the last popped piece started
// Frees may come in any order (mt__matmul_backward_wgmma_rounded frees w16 before inp16): a
// piece freed below a live one is taken back once everything above it is freed too, which every
// launcher does before it returns. `high`, the most top has been, is the arena's share of the
// memory report's "kernel scratch lent at most" (mt_device_memory_measure).
//
// Why the host may lend the same bytes to the next op at once, while the GPU may not even have
// started the previous one: every op of a rank is queued on its one stream, in order, so the next
// op's kernels run after the previous op's (the promise cudaMallocAsync's reuse rests on, too).
// With programmatic dependent launch a kernel may start before the one ahead of it ends, but
// every kernel launched so waits (griddepcontrol.wait, mt__pdl_wait) before it touches memory
// another kernel touches, and that wait returns only when the kernel ahead, and so every kernel
// before it, has completed and its writes are visible.
//
// The fallback: a piece the arena cannot serve comes from the stream-ordered pool exactly as
// before (cudaMallocAsync; mt__scratch_free tells the two kinds apart by the address): on a
// thread without an arena (tests/gpu/test_kernels.cu calls the launchers without mt_device_init;
// a generator's rank sets its dims after mt_device_init, which then makes none), on another
// stream than the rank's, when the arena has no room left (generation's prefill over many rows,
// ops the plan does not count) or the stack is full. Correctness never depends on the arena's
// size; a fallback inside a captured graph is an allocation node again, and the memory report
// shows the pool's share beside the arena's.
// Thread-local, as mt__pdl_on: each rank is a thread with its own GPU, stream and arena.
static const size_t MT__SCRATCH_ALIGN = 256;   // every piece starts on a multiple of this
enum { MT__SCRATCH_PIECES = 32 };               // the stack: pieces alive at once (an op holds at most ~6)
typedef struct {
    char *base;            // the arena (device memory), `bytes` long; NULL: none, every piece from the pool
    size_t bytes;
    cudaStream_t stream;   // the rank's stream: the only one the arena serves
    size_t top, high;      // the first byte not lent; the most top has been
    int n;                 // entries on the stack
    struct { size_t at; int freed; } stack[MT__SCRATCH_PIECES];   // each piece's offset in the arena
} mt__scratch_arena;
static MT_THREAD_LOCAL mt__scratch_arena mt__scratch;
// *p = `bytes` of device memory for work queued on `stream`, until mt__scratch_free(*p, stream)
static void mt__scratch_alloc(void **p, size_t bytes, cudaStream_t stream) {
    mt__scratch_arena *a = &mt__scratch;
    size_t size = (bytes + MT__SCRATCH_ALIGN - 1) / MT__SCRATCH_ALIGN * MT__SCRATCH_ALIGN;
    if (size == 0) size = MT__SCRATCH_ALIGN;   // (a piece of its own: every piece has its own address)
    if (a->base && stream == a->stream && a->n < MT__SCRATCH_PIECES && size <= a->bytes - a->top) {
        *p = a->base + a->top;
        a->stack[a->n].at = a->top;
        a->stack[a->n++].freed = 0;
        a->top += size;
        if (a->top > a->high) a->high = a->top;
        return;
    }
    MT_CUDA_CHECK(cudaMallocAsync(p, bytes, stream));   // the fallback: the stream-ordered pool
}
static void mt__scratch_free(void *p, cudaStream_t stream) {
    mt__scratch_arena *a = &mt__scratch;
    char *c = (char *)p;
    if (!a->base || c < a->base || c >= a->base + a->bytes) {   // not the arena's: the pool's
        MT_CUDA_CHECK(cudaFreeAsync(p, stream));
        return;
    }
    size_t at = (size_t)(c - a->base);
    int i = a->n - 1;
    while (i >= 0 && (a->stack[i].at != at || a->stack[i].freed)) i--;
    if (i < 0) mt_fatal("internal: freeing kernel scratch at offset %zu of the arena, which is not lent", at);
    a->stack[i].freed = 1;
    while (a->n > 0 && a->stack[a->n - 1].freed) a->top = a->stack[--a->n].at;
}

// ---------------------------------------------------------------------------------------------
// warp and block reductions. The xor-shuffle tree and the fixed order over warps make them
// deterministic: the same inputs give the same bits on every run.
__device__ static inline float mt__warp_sum(float v) {
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}
__device__ static inline float mt__warp_max(float v) {
    for (int offset = 16; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
}
__device__ static inline double mt__warp_sum_double(double v) {
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}
// every thread of the block gets the result; blockDim.x must be a multiple of 32
__device__ static inline float mt__block_sum(float v) {
    __shared__ float partial[32];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
    v = mt__warp_sum(v);
    __syncthreads();   // `partial` may still be read by a previous call
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    return mt__warp_sum(lane < nwarps ? partial[lane] : 0.0f);
}
__device__ static inline float mt__block_max(float v) {
    __shared__ float partial[32];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
    v = mt__warp_max(v);
    __syncthreads();
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    return mt__warp_max(lane < nwarps ? partial[lane] : -INFINITY);
}

// ---------------------------------------------------------------------------------------------
// the counter-based RNG on the device: the same arithmetic as mt_hash64 / mt__key /
// mt_rand_uniform (megatron.h, 1. UTILITIES, ERRORS & CONFIG), so a dropout mask drawn on the GPU is
// bit-identical to the CPU's. mt__key hashes (seed, a, b, c) and then the element index; the first
// four steps do not depend on the element, so the launcher computes them once (the "prefix").
__host__ __device__ static inline uint64_t mt__gpu_hash64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ULL;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}
// mt__key(seed, a, b, c, index) == mt__gpu_hash64(mt__gpu_key_prefix(seed, a, b, c) ^ index)
__host__ __device__ static inline uint64_t mt__gpu_key_prefix(uint64_t seed, uint64_t a, uint64_t b, uint64_t c) {
    uint64_t h = mt__gpu_hash64(seed);
    h = mt__gpu_hash64(h ^ a);
    h = mt__gpu_hash64(h ^ b);
    return mt__gpu_hash64(h ^ c);
}
// == mt_rand_uniform(seed, a, b, c, index): the top 24 bits of the key, scaled to [0,1)
__host__ __device__ static inline float mt__gpu_rand_uniform(uint64_t prefix, uint64_t index) {
    return (float)(mt__gpu_hash64(prefix ^ index) >> 40) * (1.0f / 16777216.0f);
}
// the prefix of the dropout stream of a site: mt__dropout_keep asks mt_rand_uniform(seed,
// iteration, site, 0x0d0d, global index) >= p
static uint64_t mt__dropout_prefix(const mt_dropout *d) {
    return mt__gpu_key_prefix(d->seed, d->iteration, d->site, 0x0d0d);
}

// ---------------------------------------------------------------------------------------------
// fill, zero, casts. Writes with '='. x has n elements.
__global__ void mt_fill_kernel(float *x, float value, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = value;
}
void mt_fill_gpu(float *x, float value, size_t n, cudaStream_t stream) {
    if (n == 0) return;
    mt_fill_kernel<<<mt__blocks(n, 256), 256, 0, stream>>>(x, value, n);
    mt__launch_check("mt_fill_kernel", stream);
}
void mt_zero_gpu(float *x, size_t n, cudaStream_t stream) {
    if (n == 0) return;
    MT_CUDA_CHECK(cudaMemsetAsync(x, 0, n * sizeof(float), stream));
    if (mt__sync_debug()) MT_CUDA_CHECK(cudaStreamSynchronize(stream));
}
// round to nearest even, as every bf16 conversion in this file. Two kernels: the vector one
// takes 8 elements per thread (two 16-byte loads, one 16-byte store: the cast is bytes-bound and
// one float per thread reaches only ~45% of the HBM bandwidth) over the first n8 * 8 elements
// when both pointers are 16-byte aligned; the scalar one does the rest (or all, when they are not).
__global__ void mt_cast_f32_to_bf16_kernel(__nv_bfloat16 *out, const float *inp, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __float2bfloat16_rn(inp[i]);
}
__global__ void mt_cast_f32_to_bf16_vec8_kernel(__nv_bfloat16 *out, const float *inp, size_t n8) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n8) return;
    float4 a = ((const float4 *)inp)[2 * i], b = ((const float4 *)inp)[2 * i + 1];
    __nv_bfloat162 o[4] = {__floats2bfloat162_rn(a.x, a.y), __floats2bfloat162_rn(a.z, a.w),
                           __floats2bfloat162_rn(b.x, b.y), __floats2bfloat162_rn(b.z, b.w)};
    ((uint4 *)out)[i] = *(const uint4 *)o;
}
void mt_cast_f32_to_bf16_gpu(__nv_bfloat16 *out, const float *inp, size_t n, cudaStream_t stream) {
    if (n == 0) return;
    size_t n8 = mt__aligned16(out) && mt__aligned16(inp) ? n / 8 : 0;
    if (n8) {
        mt_cast_f32_to_bf16_vec8_kernel<<<mt__blocks(n8, 256), 256, 0, stream>>>(out, inp, n8);
        mt__launch_check("mt_cast_f32_to_bf16_vec8_kernel", stream);
    }
    size_t done = n8 * 8;
    if (done == n) return;
    mt_cast_f32_to_bf16_kernel<<<mt__blocks(n - done, 256), 256, 0, stream>>>(out + done, inp + done, n - done);
    mt__launch_check("mt_cast_f32_to_bf16_kernel", stream);
}
// GELU (tanh approximation) and its derivative, as mt_gelu_forward_cpu / mt_gelu_backward_cpu: the
// GELU kernels (section 3, "GELU") and the GEMM epilogues that fuse them (the MLP's fc forward,
// fc-proj's input gradient) call these, so both ways give the same bits
//   gelu(x) = 0.5 x (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3)
//   gelu'(x) = 0.5 (1 + tanh(u)) + 0.5 x (1 - tanh(u)^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2)
// computed in the equal sigmoid form: 0.5 (1 + tanh(u)) = s = 1 / (1 + exp(-2u)), so
//   gelu(x) = x s,  gelu'(x) = s + 2 x s (1 - s) sqrt(2/pi) (1 + 3 * 0.044715 x^2)
// with the hardware's exponential and reciprocal (ex2.approx, rcp.approx, flushing subnormals: no
// range fix-ups) and the constants folded, exp(-2u) = 2^(x (a + b x^2)) with a = -2 log2(e)
// sqrt(2/pi), b = 0.044715 a: 5 arithmetic instructions and 2 special-function ones an element,
// where tanhf takes about 20 and a branch (and __expf / __fdividef, before, about 13: each added its
// range checks). The fused GEMM epilogues run it on 128 outputs a thread per tile after a mainloop
// of only 12 k-steps (K = 768), so it is a visible share of those GEMMs (docs/perf.md). It agrees
// with the CPU's tanh form to a few ulps of x (and does not cancel for x << 0, where 1 + tanh(u)
// does: there the CPU's is the less exact one). The limits come out right: for u << 0 the power
// overflows to inf and s = rcp(inf) = 0; for u >> 0 it flushes to 0 and s = 1.
__device__ static inline float mt__ex2_ftz(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
__device__ static inline float mt__rcp_ftz(float x) {
    float y;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
__device__ static inline float mt__gelu_sigmoid(float x) {   // s, of u(x)
    const float a = -2.0f * 1.4426950408889634f * MT_GELU_SCALING_FACTOR, b = 0.044715f * a;
    return mt__rcp_ftz(1.0f + mt__ex2_ftz(x * fmaf(b, x * x, a)));
}
__device__ static inline float mt__gelu(float x) { return x * mt__gelu_sigmoid(x); }
__device__ static inline float mt__gelu_grad(float x) {
    float s = mt__gelu_sigmoid(x);
    return s + 2.0f * x * s * (1.0f - s) * MT_GELU_SCALING_FACTOR * (1.0f + 3.0f * 0.044715f * x * x);
}

// four floats rounded (to nearest even) into four 16-bit values of T, for one 8-byte store
__device__ static inline void mt__store_rounded4(__nv_bfloat16 o[4], float4 v) {
    *(__nv_bfloat162 *)&o[0] = __floats2bfloat162_rn(v.x, v.y);
    *(__nv_bfloat162 *)&o[2] = __floats2bfloat162_rn(v.z, v.w);
}
__device__ static inline void mt__store_rounded4(__half o[4], float4 v) {
    *(__half2 *)&o[0] = __floats2half2_rn(v.x, v.y);
    *(__half2 *)&o[2] = __floats2half2_rn(v.z, v.w);
}
// (and to fp32, as is: so a kernel templated on its output type T stores fp32 or 16 bits alike)
__device__ static inline void mt__store_rounded4(float o[4], float4 v) { *(float4 *)o = v; }
__device__ static inline void mt__store_rounded1(float *o, float v) { *o = v; }
__device__ static inline void mt__store_rounded1(__nv_bfloat16 *o, float v) { *o = __float2bfloat16_rn(v); }
__device__ static inline void mt__store_rounded1(__half *o, float v) { *o = __float2half_rn(v); }
// the same to fp16 (--fp16): past 65504 to inf, subnormals below 2^-14 (as mt_fp16_from_float)
// Two kernels, as the bf16 cast: 8 elements per thread over the 16-byte-aligned bulk, then one.
__global__ void mt_cast_f32_to_f16_kernel(__half *out, const float *inp, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __float2half_rn(inp[i]);
}
__global__ void mt_cast_f32_to_f16_vec8_kernel(__half *out, const float *inp, size_t n8) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n8) return;
    float4 a = ((const float4 *)inp)[2 * i], b = ((const float4 *)inp)[2 * i + 1];
    __half2 o[4] = {__floats2half2_rn(a.x, a.y), __floats2half2_rn(a.z, a.w), __floats2half2_rn(b.x, b.y),
                    __floats2half2_rn(b.z, b.w)};
    ((uint4 *)out)[i] = *(const uint4 *)o;
}
void mt_cast_f32_to_f16_gpu(__half *out, const float *inp, size_t n, cudaStream_t stream) {
    if (n == 0) return;
    size_t n8 = mt__aligned16(out) && mt__aligned16(inp) ? n / 8 : 0;
    if (n8) {
        mt_cast_f32_to_f16_vec8_kernel<<<mt__blocks(n8, 256), 256, 0, stream>>>(out, inp, n8);
        mt__launch_check("mt_cast_f32_to_f16_vec8_kernel", stream);
    }
    size_t done = n8 * 8;
    if (done == n) return;
    mt_cast_f32_to_f16_kernel<<<mt__blocks(n - done, 256), 256, 0, stream>>>(out + done, inp + done, n - done);
    mt__launch_check("mt_cast_f32_to_f16_kernel", stream);
}
__global__ void mt_cast_bf16_to_f32_kernel(float *out, const __nv_bfloat16 *inp, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __bfloat162float(inp[i]);
}
void mt_cast_bf16_to_f32_gpu(float *out, const __nv_bfloat16 *inp, size_t n, cudaStream_t stream) {
    if (n == 0) return;
    mt_cast_bf16_to_f32_kernel<<<mt__blocks(n, 256), 256, 0, stream>>>(out, inp, n);
    mt__launch_check("mt_cast_bf16_to_f32_kernel", stream);
}

// =============================================================================================
// 3. OPS: GPU KERNELS
// =============================================================================================
// One kernel (or a short pipeline of kernels) per CPU op of megatron.h "3. OPS: CPU REFERENCE",
// with the same arguments in the same order plus the stream. Kernels, in the order of 3. OPS:
//   mt_embedding_forward_kernel             one thread per output element
//   mt_embedding_backward_*_kernel (5)      stable counting sort of positions by token, then one
//                                           block per vocabulary row sums its positions in order
//   mt_position_embedding_forward_kernel    one thread per element
//   mt_position_embedding_backward_kernel   one thread per (t, c), loops over b in order
//   mt_layernorm_forward_kernel             one warp per row
//   mt_layernorm_backward_kernel            a block per 32 rows, a warp per row, per-warp dweight/dbias
//   mt_layernorm_backward_reduce_kernel     partial dweight/dbias of the blocks, added in order
//   mt_matmul_kernel1_naive                 the GEMM ladder, chosen at run time by mt_gemm_impl:
//   mt_matmul_kernel2_tiled                   1 thread per output | 128x128 fp32 tiles in shared
//   mt_matmul_kernel3_mma                     memory | bf16 tensor cores (mma.sync m16n8k16) |
//   mt_matmul_kernel4_wgmma                   TMA + wgmma, warp-specialised (Hopper)
//   mt_matmul_kernel5_gemv                  at most 8 rows (decoding): a warp per output, split-K
//   mt_matmul_kernel6_gemv_mma              the same from 16-bit weights on tensor cores (mma.sync)
//   mt_matmul_splitk_reduce_kernel          adds split-K partial products in order
//   mt_column_sum_*_kernel (2)              dbias = column sums of dout, in two deterministic passes
//   mt_dropout_kernel                       one thread per element, mask from the counter RNG
//   mt_attention_*_kernel                   FlashAttention-2: fp32 (CUDA cores, the reading version)
//   mt_attention_*_kernel_mma                 and bf16 tensor cores; never stores the T x T matrix
//   mt_attention_*_kernel_wgmma               and on wgmma + TMA (Hopper, bf16, head size 64): FA3
//   mt_gelu_forward_kernel / _backward      one thread per element (forward: a float4 per thread
//   mt_residual_forward_kernel                over the 16-byte aligned bulk, as the residual)
//   mt_attention_cached_forward_kernel      generation: a block per (sequence, head, new token)
//   mt_attention_decode_split_kernel        decoding: a cluster per (sequence, head), a block per slice
//   mt_qkv_attention_decode_kernel          decoding one sequence: the qkv GEMV, then that attention, a
//                                           cluster of 8 blocks per head
//   mt_argmax_rows_kernel                   generation's greedy token: a cluster of 8 blocks per row
//   mt_sample_*_kernel (3)                  generation's drawn token (temperature, top-k, top-p): the
//                                           weights and a counting sort over a grid, a radix select a row
//   mt_decode_advance_kernel                decode steps queued ahead: the next step's inputs
//   mt_cross_entropy_*_kernel (4)           one block per row (token)
//   mt_adamw_kernel                         one thread per parameter

// ---------------------------------------------------------------------------------------------
// embedding lookup (vocab-parallel)
// matches mt_embedding_forward_cpu (megatron.h, 3. OPS). Writes out with '='.
// out[b,t,:] = wte[tokens[b,t] - vocab_start, :] if the token is one of this rank's V_local rows,
// else 0. out (B,T,C), tokens (B,T), wte (V_local, C). One thread per element of out.
// wpe not NULL (decoding, mt_embedding_positions_forward_cpu): plus wpe[positions[b,t], :].
__global__ void mt_embedding_forward_kernel(float *__restrict__ out, const int *__restrict__ tokens,
                                            const float *__restrict__ wte, const int *__restrict__ positions,
                                            const float *__restrict__ wpe, size_t BTC, int C, int vocab_start,
                                            int V_local) {
    mt__pdl_start();   // (a decode step's kernels: see "programmatic dependent launch", section 1)
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= BTC) return;
    size_t bt = i / C;
    int c = (int)(i % C);
    int local = tokens[bt] - vocab_start;
    float v = (local >= 0 && local < V_local) ? wte[(size_t)local * C + c] : 0.0f;
    if (wpe) v += wpe[(size_t)positions[bt] * C + c];
    out[i] = v;
}
void mt_embedding_forward_gpu(float *out, const int *tokens, const float *wte, int B, int T, int C, int vocab_start,
                              int V_local, cudaStream_t stream) {
    size_t BTC = (size_t)B * T * C;
    if (BTC == 0) return;
    mt__launch("mt_embedding_forward_kernel", mt_embedding_forward_kernel, mt__blocks(BTC, 256), 256, 0, stream, out,
               tokens, wte, (const int *)NULL, (const float *)NULL, BTC, C, vocab_start, V_local);
}
// matches mt_embedding_positions_forward_cpu (megatron.h, 3. OPS). Writes out with '='.
void mt_embedding_positions_forward_gpu(float *out, const int *tokens, const float *wte, const int *positions,
                                        const float *wpe, int B, int T, int C, int vocab_start, int V_local,
                                        cudaStream_t stream) {
    size_t BTC = (size_t)B * T * C;
    if (BTC == 0) return;
    mt__launch("mt_embedding_forward_kernel", mt_embedding_forward_kernel, mt__blocks(BTC, 256), 256, 0, stream, out,
               tokens, wte, positions, wpe, BTC, C, vocab_start, V_local);
}

// matches mt_embedding_backward_cpu (megatron.h, 3. OPS).
// dwte[v,:] += sum over positions bt with token v (in increasing bt) of dout[bt,:]
// A scatter with one thread per position would need float atomics, whose order changes from run
// to run. Instead the positions are grouped by token with a stable counting sort, and one block
// per vocabulary row adds its positions' rows in increasing bt, the CPU's order: the result is
// bit-identical to mt_embedding_backward_cpu. The positions are cut into chunks of MT__EMB_CHUNK
// (1024, megatron.h's, section 3, which sizes the scratch). Five kernels:
//   1. count:      table[k, v] = how many positions of chunk k hold token v (integer atomics: exact)
//   2. chunks:     per token, the exclusive prefix over the chunks in place: table[k, v] = how many
//                  positions of chunks 0..k-1 hold v; counts[v] = all of them
//   3. scan:       row_start[v] = counts[0] + ... + counts[v-1]    (one block, 4096 tokens a pass)
//   4. place:      positions[row_start[v] + rank] = bt, where rank = table[k, v] + the number of
//                  earlier positions of bt's own chunk with the same token (a block per chunk, its
//                  tokens in shared memory: at most 1023 comparisons a position. The first version
//                  compared every position with all the positions before it, O(BT^2): 0.12 ms a
//                  step at BT = 16384, and its one-block scan walked strided chunks: 0.07 ms)
//   5. accumulate: block v: acc = dwte[v,c]; acc += dout[bt,c] for its positions in order
// scratch: (V_local + 1) + BT + chunks x V_local ints.
__global__ void mt_embedding_backward_count_kernel(int *table, const int *tokens, int BT, int vocab_start,
                                                   int V_local) {
    int bt = blockIdx.x * blockDim.x + threadIdx.x;
    if (bt >= BT) return;
    int local = tokens[bt] - vocab_start;
    if (local >= 0 && local < V_local) atomicAdd(&table[(size_t)(bt / MT__EMB_CHUNK) * V_local + local], 1);
}
// a thread per token: the chunks' counts become the counts before each chunk; the total to counts
__global__ void mt_embedding_backward_chunks_kernel(int *table, int *counts, int chunks, int V_local) {
    int v = blockIdx.x * blockDim.x + threadIdx.x;
    if (v >= V_local) return;
    int run = 0;
    for (int k = 0; k < chunks; k++) {
        int c = table[(size_t)k * V_local + v];
        table[(size_t)k * V_local + v] = run;
        run += c;
    }
    counts[v] = run;
}
// one block of 1024 threads, exclusive scan in place: counts[0..V_local) -> row_start[0..V_local],
// row_start[V_local] = the total. Each pass takes 4096 tokens (4 consecutive a thread, coalesced):
// a thread's sum, scanned across its warp with shuffles, the 32 warps' sums scanned by warp 0,
// plus the carry of the passes before (integers: exact in any order)
__global__ void __launch_bounds__(1024) mt_embedding_backward_scan_kernel(int *counts, int V_local) {
    __shared__ int warp_sums[32];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
    int carry = 0;
    for (int base = 0; base < V_local; base += 4 * blockDim.x) {
        int i0 = base + 4 * threadIdx.x, v[4], mine = 0;
        #pragma unroll
        for (int j = 0; j < 4; j++) { v[j] = i0 + j < V_local ? counts[i0 + j] : 0; mine += v[j]; }
        int x = mine;   // inclusive scan of the threads' sums across the warp
        #pragma unroll
        for (int o = 1; o < 32; o *= 2) {
            int y = __shfl_up_sync(0xffffffffu, x, o);
            if (lane >= o) x += y;
        }
        if (lane == 31) warp_sums[warp] = x;
        __syncthreads();
        if (warp == 0) {
            int w = lane < nwarps ? warp_sums[lane] : 0;
            #pragma unroll
            for (int o = 1; o < 32; o *= 2) {
                int y = __shfl_up_sync(0xffffffffu, w, o);
                if (lane >= o) w += y;
            }
            if (lane < nwarps) warp_sums[lane] = w;   // inclusive over the warps
        }
        __syncthreads();
        int run = carry + (warp > 0 ? warp_sums[warp - 1] : 0) + x - mine;   // before my first token
        #pragma unroll
        for (int j = 0; j < 4; j++)
            if (i0 + j < V_local) { counts[i0 + j] = run; run += v[j]; }
        carry += warp_sums[nwarps - 1];
        __syncthreads();   // warp_sums is rewritten by the next pass
    }
    if (threadIdx.x == 0) counts[V_local] = carry;
}
// a block of MT__EMB_CHUNK threads per chunk, a thread per position
__global__ void __launch_bounds__(1024) mt_embedding_backward_place_kernel(int *positions, const int *row_start,
                                                                           const int *table, const int *tokens,
                                                                           int BT, int vocab_start, int V_local) {
    __shared__ int tile[MT__EMB_CHUNK];
    int bt = blockIdx.x * MT__EMB_CHUNK + threadIdx.x;
    int local = bt < BT ? tokens[bt] - vocab_start : -1;
    int mine = local >= 0 && local < V_local;
    tile[threadIdx.x] = mine ? local : -1;
    __syncthreads();
    if (!mine) return;
    int rank = table[(size_t)blockIdx.x * V_local + local];
    for (int j = 0; j < (int)threadIdx.x; j++) rank += tile[j] == local;
    positions[row_start[local] + rank] = bt;
}
// block v adds the dout rows of its positions, in increasing bt, into dwte row v. A frequent
// token (GPT-2's "," or "the": hundreds of positions in a batch) makes one block's chain long,
// and the whole kernel waits for it: so the loads run 8 positions ahead of the additions (the
// additions stay in increasing bt: the same bits), and with C % 4 == 0 (vec4) a thread owns 4
// channels as a float4.
__global__ void mt_embedding_backward_accumulate_kernel(float *__restrict__ dwte, const float *__restrict__ dout,
                                                        const int *__restrict__ row_start,
                                                        const int *__restrict__ positions, int C, int vec4) {
    int v = blockIdx.x;
    int begin = row_start[v], end = row_start[v + 1];
    if (begin == end) return;
    if (vec4) {
        int C4 = C / 4;
        for (int c = threadIdx.x; c < C4; c += blockDim.x) {
            float4 acc = ((const float4 *)(dwte + (size_t)v * C))[c];
            for (int i0 = begin; i0 < end; i0 += 8) {
                float4 d[8];
                #pragma unroll
                for (int k = 0; k < 8; k++)
                    if (i0 + k < end) d[k] = ((const float4 *)(dout + (size_t)positions[i0 + k] * C))[c];
                #pragma unroll
                for (int k = 0; k < 8; k++)
                    if (i0 + k < end) { acc.x += d[k].x; acc.y += d[k].y; acc.z += d[k].z; acc.w += d[k].w; }
            }
            ((float4 *)(dwte + (size_t)v * C))[c] = acc;
        }
        return;
    }
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float acc = dwte[(size_t)v * C + c];
        for (int i0 = begin; i0 < end; i0 += 8) {
            float d[8];
            #pragma unroll
            for (int k = 0; k < 8; k++)
                if (i0 + k < end) d[k] = dout[(size_t)positions[i0 + k] * C + c];
            #pragma unroll
            for (int k = 0; k < 8; k++)
                if (i0 + k < end) acc += d[k];
        }
        dwte[(size_t)v * C + c] = acc;
    }
}
void mt_embedding_backward_gpu(float *dwte, const float *dout, const int *tokens, int B, int T, int C, int vocab_start,
                               int V_local, cudaStream_t stream) {
    int BT = B * T;
    if (BT == 0 || V_local == 0) return;
    int *scratch;   // row_start, positions and the chunks' table: mt_gpu_embedding_backward_scratch bytes
    mt__scratch_alloc((void **)&scratch, mt_gpu_embedding_backward_scratch(BT, V_local), stream);
    int chunks = (BT + MT__EMB_CHUNK - 1) / MT__EMB_CHUNK;
    int *row_start = scratch, *positions = scratch + V_local + 1, *table = positions + BT;
    MT_CUDA_CHECK(cudaMemsetAsync(table, 0, (size_t)chunks * V_local * sizeof(int), stream));
    mt_embedding_backward_count_kernel<<<mt__blocks(BT, 256), 256, 0, stream>>>(table, tokens, BT, vocab_start, V_local);
    mt__launch_check("mt_embedding_backward_count_kernel", stream);
    mt_embedding_backward_chunks_kernel<<<mt__blocks(V_local, 256), 256, 0, stream>>>(table, row_start, chunks, V_local);
    mt__launch_check("mt_embedding_backward_chunks_kernel", stream);
    mt_embedding_backward_scan_kernel<<<1, 1024, 0, stream>>>(row_start, V_local);
    mt__launch_check("mt_embedding_backward_scan_kernel", stream);
    mt_embedding_backward_place_kernel<<<chunks, MT__EMB_CHUNK, 0, stream>>>(positions, row_start, table, tokens, BT,
                                                                            vocab_start, V_local);
    mt__launch_check("mt_embedding_backward_place_kernel", stream);
    int vec4 = C % 4 == 0 && mt__aligned16(dwte) && mt__aligned16(dout), per_row = vec4 ? C / 4 : C;
    int threads = per_row >= 256 ? 256 : ((per_row + 31) / 32) * 32;
    mt_embedding_backward_accumulate_kernel<<<V_local, threads, 0, stream>>>(dwte, dout, row_start, positions, C, vec4);
    mt__launch_check("mt_embedding_backward_accumulate_kernel", stream);
    mt__scratch_free(scratch, stream);
}

// ---------------------------------------------------------------------------------------------
// position embedding
// matches mt_position_embedding_forward_cpu (megatron.h, 3. OPS): out[b,t,:] += wpe[t,:]
// out (B,T,C), wpe (T,C). One thread per element of out.
__global__ void mt_position_embedding_forward_kernel(float *__restrict__ out, const float *__restrict__ wpe,
                                                     size_t BTC, int T, int C) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= BTC) return;
    size_t tc = i % ((size_t)T * C);   // (t, c) of element i
    out[i] += wpe[tc];
}
void mt_position_embedding_forward_gpu(float *out, const float *wpe, int B, int T, int C, cudaStream_t stream) {
    size_t BTC = (size_t)B * T * C;
    if (BTC == 0) return;
    mt_position_embedding_forward_kernel<<<mt__blocks(BTC, 256), 256, 0, stream>>>(out, wpe, BTC, T, C);
    mt__launch_check("mt_position_embedding_forward_kernel", stream);
}
// matches mt_position_embedding_backward_cpu (megatron.h, 3. OPS): dwpe[t,:] += sum_b dout[b,t,:]
// One thread per (t, c); it adds the B terms in increasing b, as the CPU (bit-identical).
__global__ void mt_position_embedding_backward_kernel(float *__restrict__ dwpe, const float *__restrict__ dout,
                                                      int B, size_t TC) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= TC) return;
    float acc = dwpe[i];
    for (int b = 0; b < B; b++) acc += dout[(size_t)b * TC + i];
    dwpe[i] = acc;
}
void mt_position_embedding_backward_gpu(float *dwpe, const float *dout, int B, int T, int C, cudaStream_t stream) {
    size_t TC = (size_t)T * C;
    if (TC == 0) return;
    mt_position_embedding_backward_kernel<<<mt__blocks(TC, 256), 256, 0, stream>>>(dwpe, dout, B, TC);
    mt__launch_check("mt_position_embedding_backward_kernel", stream);
}

// ---------------------------------------------------------------------------------------------
// layernorm
// matches mt_layernorm_forward_cpu (megatron.h, 3. OPS). Writes out, mean, rstd with '='.
// out = (x - mean) * rstd * weight + bias, rstd = 1/sqrt(var + 1e-5), over the C channels of a row.
// inp/out (N,C) with N = B*T, mean/rstd (N), weight/bias (C).
// One warp per row (8 rows per block of 256): each lane sums every 32nd channel, then the warp
// adds the 32 partial sums; the row is read three times (mean, variance, output), from L1/L2.
// OUT: out's type, float, or __nv_bfloat16 / __half (a training layer's ln1 and ln2 on the wgmma
// rung, mt_ln_storage_dtype: the value rounded to nearest even, as the GEMM's own cast would)
template <typename OUT>
__global__ void mt_layernorm_forward_kernel(OUT *__restrict__ out, float *__restrict__ mean,
                                            float *__restrict__ rstd, const float *__restrict__ inp,
                                            const float *__restrict__ weight, const float *__restrict__ bias, int N,
                                            int C) {
    mt__pdl_start();
    int lane = threadIdx.x % 32;
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= N) return;
    const float *x = inp + (size_t)row * C;
    float sum = 0.0f;
    for (int i = lane; i < C; i += 32) sum += x[i];
    float m = mt__warp_sum(sum) / (float)C;
    float var = 0.0f;
    for (int i = lane; i < C; i += 32) { float d = x[i] - m; var += d * d; }
    var = mt__warp_sum(var) / (float)C;
    float s = 1.0f / sqrtf(var + 1e-5f);
    OUT *o = out + (size_t)row * C;
    for (int i = lane; i < C; i += 32) mt__store_rounded1(&o[i], (s * (x[i] - m)) * weight[i] + bias[i]);
    if (lane == 0) { mean[row] = m; rstd[row] = s; }
}
// a row's mean and 1/sqrt(var + 1e-5) from its float4s in a warp's registers (lane holds float4
// lane + 32 v, zeros past C): the layernorm kernel's and the one-kernel decode step's statistics,
// one body, so both give the same bits
template <int NV>
__device__ static inline void mt__row_mean_rstd(const float4 (&x)[NV], int C, int lane, float *mean, float *rstd) {
    int C4 = C / 4;
    float sum = 0.0f;
    #pragma unroll
    for (int v = 0; v < NV; v++) sum += (x[v].x + x[v].y) + (x[v].z + x[v].w);   // zeros past C add nothing
    float m = mt__warp_sum(sum) / (float)C;
    float var = 0.0f;
    #pragma unroll
    for (int v = 0; v < NV; v++)
        if (lane + 32 * v < C4) {
            float d0 = x[v].x - m, d1 = x[v].y - m, d2 = x[v].z - m, d3 = x[v].w - m;
            var += (d0 * d0 + d1 * d1) + (d2 * d2 + d3 * d3);
        }
    var = mt__warp_sum(var) / (float)C;
    *mean = m;
    *rstd = 1.0f / sqrtf(var + 1e-5f);
}
// The same with the row in registers: a lane holds float4 j = lane + 32 v (v < NV) of its row, all
// loaded before the first sum (one round trip to memory per row instead of one per float:
// decoding normalises a row or a few per launch, and waits for each), and the three passes
// read registers. For C % 4 == 0, C <= 128 NV, 16-byte aligned rows. With a (the residual stream)
// not NULL it also does the residual add first: res = a + inp, written out, and normalises res
// (mt_residual_layernorm_forward: one pass over the row instead of two kernels). OUT as above.
// EARLY = 1 (decoding's few rows, launched behind the kernel ahead with programmatic dependent
// launch): the lane's weight and bias are loaded before the wait for the kernel ahead, which did
// not write them, so their round trip to memory overlaps that kernel's end instead of following the
// two reductions. The same arithmetic; EARLY = 0 is the kernel as it was (training's many rows).
template <int NV, typename OUT, int EARLY>
__global__ void mt_layernorm_forward_vec_kernel(OUT *__restrict__ out, float *__restrict__ mean,
                                                float *__restrict__ rstd, float *__restrict__ res,
                                                const float *__restrict__ a, const float *__restrict__ inp,
                                                const float *__restrict__ weight, const float *__restrict__ bias,
                                                int N, int C, int early) {
    if (early) mt__pdl_launch_next();   // a decode step's: the next kernel may launch now (mt__pdl_early)
    int lane = threadIdx.x % 32;
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    float4 w_early[EARLY ? NV : 1], b_early[EARLY ? NV : 1];
    if (EARLY) {
        const float4 *w4 = (const float4 *)weight, *b4 = (const float4 *)bias;
        #pragma unroll
        for (int v = 0; v < NV; v++) {
            int j = lane + 32 * v;
            if (j < C / 4 && row < N) { w_early[v] = w4[j]; b_early[v] = b4[j]; }
        }
    }
    mt__pdl_start();
    if (row >= N) return;
    int C4 = C / 4;
    const float4 *x4 = (const float4 *)(inp + (size_t)row * C);
    float4 x[NV];
    #pragma unroll
    for (int v = 0; v < NV; v++) {
        int j = lane + 32 * v;
        x[v] = j < C4 ? x4[j] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    if (a) {   // the residual add, as mt_residual_forward: res = a + inp
        const float4 *a4 = (const float4 *)(a + (size_t)row * C);
        float4 *r4 = (float4 *)(res + (size_t)row * C);
        #pragma unroll
        for (int v = 0; v < NV; v++) {
            int j = lane + 32 * v;
            if (j < C4) {
                float4 y = a4[j];
                x[v] = make_float4(y.x + x[v].x, y.y + x[v].y, y.z + x[v].z, y.w + x[v].w);
                r4[j] = x[v];
            }
        }
    }
    float m, s;
    mt__row_mean_rstd<NV>(x, C, lane, &m, &s);
    OUT *o = out + (size_t)row * C;
    const float4 *w4 = (const float4 *)weight, *b4 = (const float4 *)bias;
    #pragma unroll
    for (int v = 0; v < NV; v++) {
        int j = lane + 32 * v;
        if (j < C4) {
            float4 w = EARLY ? w_early[v] : w4[j], b = EARLY ? b_early[v] : b4[j];
            mt__store_rounded4(o + 4 * j, make_float4((s * (x[v].x - m)) * w.x + b.x, (s * (x[v].y - m)) * w.y + b.y,
                                                      (s * (x[v].z - m)) * w.z + b.z, (s * (x[v].w - m)) * w.w + b.w));
        }
    }
    if (lane == 0) { mean[row] = m; rstd[row] = s; }
}
// The same for one row by one warp (lane = the lane), as a device function: the decode step's
// single kernel ("a decode step as one kernel", below) normalises its rows with it, operation for
// operation the kernel's arithmetic (test_kernels' decode_step_one_kernel checks the bits). res,
// mean, rstd may be NULL (then not written); out may point into shared memory; the pointers are
// the row's. (The kernel keeps its own loads and stores, compiled exactly as before: see the
// attention over the cache for what sharing one whole body cost there; the statistics between them
// are one function, mt__row_mean_rstd, which `nvcc -ptx` compiles to the same PTX in both.)
template <int NV, typename OUT>
__device__ static inline void mt__layernorm_row_vec(OUT *__restrict__ o, float *__restrict__ mean,
                                                    float *__restrict__ rstd, float *__restrict__ res,
                                                    const float *__restrict__ a, const float *__restrict__ inp,
                                                    const float *__restrict__ weight, const float *__restrict__ bias,
                                                    int C, int lane) {
    int C4 = C / 4;
    const float4 *x4 = (const float4 *)inp;
    float4 x[NV];
    #pragma unroll
    for (int v = 0; v < NV; v++) {
        int j = lane + 32 * v;
        x[v] = j < C4 ? x4[j] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    if (a) {   // the residual add, as mt_residual_forward: res = a + inp
        const float4 *a4 = (const float4 *)a;
        float4 *r4 = (float4 *)res;
        #pragma unroll
        for (int v = 0; v < NV; v++) {
            int j = lane + 32 * v;
            if (j < C4) {
                float4 y = a4[j];
                x[v] = make_float4(y.x + x[v].x, y.y + x[v].y, y.z + x[v].z, y.w + x[v].w);
                if (r4) r4[j] = x[v];
            }
        }
    }
    float m, s;
    mt__row_mean_rstd<NV>(x, C, lane, &m, &s);
    const float4 *w4 = (const float4 *)weight, *b4 = (const float4 *)bias;
    #pragma unroll
    for (int v = 0; v < NV; v++) {
        int j = lane + 32 * v;
        if (j < C4) {
            float4 w = w4[j], b = b4[j];
            mt__store_rounded4(o + 4 * j, make_float4((s * (x[v].x - m)) * w.x + b.x, (s * (x[v].y - m)) * w.y + b.y,
                                                      (s * (x[v].z - m)) * w.z + b.z, (s * (x[v].w - m)) * w.w + b.w));
        }
    }
    if (lane == 0 && mean) { *mean = m; *rstd = s; }
}
void mt_residual_forward_gpu(float *out, const float *a, const float *b, size_t N, cudaStream_t stream);   // below
// res (N rows) = a + inp first when a is not NULL (then res is what is normalised); out in OUT
template <typename OUT>
static void mt__layernorm_forward_launch(OUT *out, float *mean, float *rstd, float *res, const float *a,
                                         const float *inp, const float *weight, const float *bias, int N, int C,
                                         cudaStream_t stream) {
    int vec = C % 4 == 0 && mt__aligned16(out) && mt__aligned16(inp) && mt__aligned16(weight) && mt__aligned16(bias) &&
              (!a || (mt__aligned16(a) && mt__aligned16(res)));
    if constexpr (sizeof(OUT) == sizeof(float)) {   // decoding's few rows (an fp32 output): EARLY
        if (vec && C <= 32 * 4 * 8 && N <= MT_GEMV_MAX_ROWS) {
            mt__launch("mt_layernorm_forward_vec_kernel", mt_layernorm_forward_vec_kernel<8, OUT, 1>, mt__blocks(N, 8),
                       256, 0, stream, out, mean, rstd, res, a, inp, weight, bias, N, C, N == 1 && mt__pdl_early());
            return;
        }
    }
    if (vec && C <= 32 * 4 * 8) {
        mt__launch("mt_layernorm_forward_vec_kernel", mt_layernorm_forward_vec_kernel<8, OUT, 0>, mt__blocks(N, 8), 256, 0,
                   stream, out, mean, rstd, res, a, inp, weight, bias, N, C, 0);
    } else if (vec && C <= 32 * 4 * 16) {
        mt__launch("mt_layernorm_forward_vec_kernel", mt_layernorm_forward_vec_kernel<16, OUT, 0>, mt__blocks(N, 8), 256,
                   0, stream, out, mean, rstd, res, a, inp, weight, bias, N, C, 0);
    } else {
        if (a) {
            mt_residual_forward_gpu(res, a, inp, (size_t)N * C, stream);
            inp = res;
        }
        mt__launch("mt_layernorm_forward_kernel", mt_layernorm_forward_kernel<OUT>, mt__blocks(N, 8), 256, 0, stream,
                   out, mean, rstd, inp, weight, bias, N, C);
    }
}
void mt_layernorm_forward_gpu(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                              const float *bias, int B, int T, int C, cudaStream_t stream) {
    int N = B * T;
    if (N == 0) return;
    mt__layernorm_forward_launch(out, mean, rstd, (float *)NULL, (const float *)NULL, inp, weight, bias, N, C, stream);
}
// the same with out stored in dtype's 16 bits (MT_DTYPE_BF16 / FP16; out16 16-byte aligned, or
// the scalar kernel): a training layer's ln1 (mt_ln_storage_dtype). res (optional) as
// mt_residual_layernorm_forward_gpu's: then res = a + inp first, and res is normalised.
void mt_layernorm_forward16_gpu(void *out16, float *mean, float *rstd, float *res, const float *a, const float *inp,
                                const float *weight, const float *bias, int B, int T, int C, int dtype,
                                cudaStream_t stream) {
    int N = B * T;
    if (N == 0) return;
    if (dtype == MT_DTYPE_FP16)
        mt__layernorm_forward_launch((__half *)out16, mean, rstd, res, a, inp, weight, bias, N, C, stream);
    else if (dtype == MT_DTYPE_BF16)
        mt__layernorm_forward_launch((__nv_bfloat16 *)out16, mean, rstd, res, a, inp, weight, bias, N, C, stream);
    else mt_fatal("internal: a 16-bit layernorm output in dtype %d", dtype);
}
// matches mt_residual_layernorm_forward_cpu (megatron.h, 3. OPS): res = a + b (N = B*T rows of C),
// then out, mean, rstd = layernorm(res)
void mt_residual_layernorm_forward_gpu(float *res, float *out, float *mean, float *rstd, const float *a, const float *b,
                                       const float *weight, const float *bias, int B, int T, int C,
                                       cudaStream_t stream) {
    int N = B * T;
    if (N == 0) return;
    mt__layernorm_forward_launch(out, mean, rstd, res, a, b, weight, bias, N, C, stream);
}

// matches mt_layernorm_backward_cpu (megatron.h, 3. OPS).
// in the forward pass this was: out = norm * weight + bias, norm = (x - mean) * rstd
// so now: dbias += dout, dweight += norm * dout, and with dnorm = dout * weight,
// dinp += rstd * (dnorm - mean_c(dnorm) - norm * mean_c(dnorm * norm))
// Block geometry: a block owns 32 consecutive rows; each of its warps takes every nwarps-th of
// them (one warp per row: two warp sums, then dinp). dweight and dbias are sums over all rows:
// each warp adds its rows into its own slice of shared memory (lanes own channels, no atomics),
// the block adds the warp slices in order into partial[block], and
// mt_layernorm_backward_reduce_kernel adds the blocks' partials in order. Deterministic.
// dynamic shared memory: 2 * nwarps * C floats. partial_* are (blocks, C) each.
// (MT__LN_ROWS_PER_BLOCK = 32 rows per block: megatron.h's, section 3, which sizes the partials)
// One channel's terms, the same operations in both kernels below (so the same bits):
//   norm = (x - mean) rstd; dnorm = weight * dout, rounded: never fused into the FMA that follows,
//   so dnorm - mean_c(dnorm) cancels exactly as on the CPU
__device__ static inline void mt__ln_backward_row_sums(float x, float g, float w, float mean_r, float rstd_r,
                                                       float *dnorm_sum, float *dnorm_norm_sum) {
    float norm = (x - mean_r) * rstd_r;
    float dnorm = __fmul_rn(w, g);
    *dnorm_sum += dnorm;
    *dnorm_norm_sum += dnorm * norm;
}
__device__ static inline void mt__ln_backward_apply(float x, float g, float w, float mean_r, float rstd_r,
                                                    float dnorm_mean, float dnorm_norm_mean, float *dinp, float *dw,
                                                    float *db) {
    float norm = (x - mean_r) * rstd_r;
    float dnorm = __fmul_rn(w, g);
    *db += g;
    *dw += norm * g;
    *dinp += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * rstd_r;
}
// the block's end: its warps' dweight and dbias slices (smem: nwarps slices of C, then nwarps more)
// added in warp order into the block's row of the partials
__device__ static inline void mt__ln_backward_block_partials(const float *smem, float *partial_dweight,
                                                             float *partial_dbias, int nwarps, int C) {
    __syncthreads();
    for (int i = threadIdx.x; i < C; i += blockDim.x) {
        float dw = 0.0f, db = 0.0f;
        for (int w = 0; w < nwarps; w++) { dw += smem[(size_t)w * C + i]; db += smem[(size_t)(nwarps + w) * C + i]; }
        partial_dweight[(size_t)blockIdx.x * C + i] = dw;
        partial_dbias[(size_t)blockIdx.x * C + i] = db;
    }
}
__global__ void mt_layernorm_backward_kernel(float *__restrict__ dinp, float *__restrict__ partial_dweight,
                                             float *__restrict__ partial_dbias, const float *__restrict__ dout,
                                             const float *__restrict__ inp, const float *__restrict__ weight,
                                             const float *__restrict__ mean, const float *__restrict__ rstd, int N,
                                             int C) {
    mt__pdl_start();   // (launched with programmatic dependent launch inside a training graph)
    extern __shared__ float mt__ln_smem[];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
    float *dw_acc = mt__ln_smem + (size_t)warp * C;            // this warp's dweight slice
    float *db_acc = mt__ln_smem + (size_t)(nwarps + warp) * C; // this warp's dbias slice
    for (int i = lane; i < C; i += 32) { dw_acc[i] = 0.0f; db_acc[i] = 0.0f; }
    int row_end = min(N, (int)(blockIdx.x + 1) * MT__LN_ROWS_PER_BLOCK);
    for (int row = blockIdx.x * MT__LN_ROWS_PER_BLOCK + warp; row < row_end; row += nwarps) {
        const float *dout_r = dout + (size_t)row * C, *inp_r = inp + (size_t)row * C;
        float *dinp_r = dinp + (size_t)row * C;
        float mean_r = mean[row], rstd_r = rstd[row];
        float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
        for (int i = lane; i < C; i += 32)
            mt__ln_backward_row_sums(inp_r[i], dout_r[i], weight[i], mean_r, rstd_r, &dnorm_mean, &dnorm_norm_mean);
        dnorm_mean = mt__warp_sum(dnorm_mean) / (float)C;
        dnorm_norm_mean = mt__warp_sum(dnorm_norm_mean) / (float)C;
        for (int i = lane; i < C; i += 32)
            mt__ln_backward_apply(inp_r[i], dout_r[i], weight[i], mean_r, rstd_r, dnorm_mean, dnorm_norm_mean,
                                  &dinp_r[i], &dw_acc[i], &db_acc[i]);
    }
    mt__ln_backward_block_partials(mt__ln_smem, partial_dweight, partial_dbias, nwarps, C);
}
// The same with each row in registers (C % 4 == 0, C <= 128 NV, 16-byte aligned rows): a lane holds
// float4 j = lane + 32 v (v < NV) of the row's dout, inp and dinp, all loaded before the first sum, so a
// warp has the whole row in flight at once instead of one float per lane (the loop above waits on
// each load: ~2.3 TB/s at GPT-2 small's shape); the second pass reads registers. The same sums in
// the same per-channel order for dweight and dbias (the warp's rows in order, then the block's
// warps in order); the row sums add a lane's four channels before the next float4.
template <int NV>
__global__ void mt_layernorm_backward_vec_kernel(float *__restrict__ dinp, float *__restrict__ partial_dweight,
                                                 float *__restrict__ partial_dbias, const float *__restrict__ dout,
                                                 const float *__restrict__ inp, const float *__restrict__ weight,
                                                 const float *__restrict__ mean, const float *__restrict__ rstd,
                                                 int N, int C) {
    mt__pdl_start();   // (launched with programmatic dependent launch inside a training graph)
    extern __shared__ float mt__ln_smem[];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32, C4 = C / 4;
    float4 *dw_acc = (float4 *)(mt__ln_smem + (size_t)warp * C);            // this warp's dweight slice
    float4 *db_acc = (float4 *)(mt__ln_smem + (size_t)(nwarps + warp) * C); // this warp's dbias slice
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int j = lane; j < C4; j += 32) { dw_acc[j] = zero; db_acc[j] = zero; }
    const float4 *w4 = (const float4 *)weight;
    int row_end = min(N, (int)(blockIdx.x + 1) * MT__LN_ROWS_PER_BLOCK);
    for (int row = blockIdx.x * MT__LN_ROWS_PER_BLOCK + warp; row < row_end; row += nwarps) {
        const float4 *dout4 = (const float4 *)(dout + (size_t)row * C), *inp4 = (const float4 *)(inp + (size_t)row * C);
        float4 *dinp4 = (float4 *)(dinp + (size_t)row * C);
        float4 g[NV], x[NV], d[NV];   // dout, inp and the dinp being added to, of my channels
        #pragma unroll
        for (int v = 0; v < NV; v++) {
            int j = lane + 32 * v;
            g[v] = j < C4 ? dout4[j] : zero;
            x[v] = j < C4 ? inp4[j] : zero;
            d[v] = j < C4 ? dinp4[j] : zero;   // (loaded with the others: one round trip a row, not two)
        }
        float mean_r = mean[row], rstd_r = rstd[row];
        float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
        #pragma unroll
        for (int v = 0; v < NV; v++) {
            int j = lane + 32 * v;
            if (j >= C4) continue;
            float4 w = w4[j];
            float gv[4] = {g[v].x, g[v].y, g[v].z, g[v].w}, xv[4] = {x[v].x, x[v].y, x[v].z, x[v].w};
            float wv[4] = {w.x, w.y, w.z, w.w};
            #pragma unroll
            for (int k = 0; k < 4; k++)
                mt__ln_backward_row_sums(xv[k], gv[k], wv[k], mean_r, rstd_r, &dnorm_mean, &dnorm_norm_mean);
        }
        dnorm_mean = mt__warp_sum(dnorm_mean) / (float)C;
        dnorm_norm_mean = mt__warp_sum(dnorm_norm_mean) / (float)C;
        #pragma unroll
        for (int v = 0; v < NV; v++) {
            int j = lane + 32 * v;
            if (j >= C4) continue;
            float4 w = w4[j], dw = dw_acc[j], db = db_acc[j];
            float gv[4] = {g[v].x, g[v].y, g[v].z, g[v].w}, xv[4] = {x[v].x, x[v].y, x[v].z, x[v].w};
            float wv[4] = {w.x, w.y, w.z, w.w}, dv[4] = {d[v].x, d[v].y, d[v].z, d[v].w};
            float dwv[4] = {dw.x, dw.y, dw.z, dw.w}, dbv[4] = {db.x, db.y, db.z, db.w};
            #pragma unroll
            for (int k = 0; k < 4; k++)
                mt__ln_backward_apply(xv[k], gv[k], wv[k], mean_r, rstd_r, dnorm_mean, dnorm_norm_mean, &dv[k], &dwv[k],
                                      &dbv[k]);
            dinp4[j] = make_float4(dv[0], dv[1], dv[2], dv[3]);
            dw_acc[j] = make_float4(dwv[0], dwv[1], dwv[2], dwv[3]);
            db_acc[j] = make_float4(dbv[0], dbv[1], dbv[2], dbv[3]);
        }
    }
    mt__ln_backward_block_partials(mt__ln_smem, partial_dweight, partial_dbias, nwarps, C);
}
// dweight[c] += sum over blocks of partial_dweight[block, c]; the same for dbias. Grid (C / 32, 2):
// blockIdx.y = 0 dweight, 1 dbias. Block (32, 32): 32 channels; row ty of threads sums the ty-th 32nd
// of the blocks in order (its loads issued 16 at a time, ahead of the additions), then ty = 0 adds
// the 32 in order. (One thread per channel walking all 512 partials of GPT-2's batch was a 40 us
// chain of dependent loads on 3 SMs; 8 rows of threads walking 64 each took 11 us a launch, the 25
// launches 0.28 ms a step; both sums in one block, 8 loads at a time, 24 blocks: 6.6 us under ncu:
// docs/perf.md.)
__global__ void __launch_bounds__(1024) mt_layernorm_backward_reduce_kernel(float *__restrict__ dweight,
                                                                            float *__restrict__ dbias,
                                                                            const float *__restrict__ partial_dweight,
                                                                            const float *__restrict__ partial_dbias,
                                                                            int nblocks, int C) {
    mt__pdl_start();   // (launched with programmatic dependent launch inside a training graph)
    __shared__ float sums[32][33];
    const float *partial = blockIdx.y ? partial_dbias : partial_dweight;
    float *dst = blockIdx.y ? dbias : dweight;
    int c = blockIdx.x * 32 + threadIdx.x, per = (nblocks + 31) / 32;
    int k0 = threadIdx.y * per, k1 = min(nblocks, k0 + per);
    float sum = 0.0f;
    if (c < C)
        for (int k = k0; k < k1; k += 16) {
            float x[16];
            #pragma unroll
            for (int j = 0; j < 16; j++)
                if (k + j < k1) x[j] = partial[(size_t)(k + j) * C + c];
            #pragma unroll
            for (int j = 0; j < 16; j++)
                if (k + j < k1) sum += x[j];
        }
    sums[threadIdx.y][threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.y != 0 || c >= C) return;
    sum = 0.0f;
    for (int y = 0; y < 32; y++) sum += sums[y][threadIdx.x];
    dst[c] += sum;
}
void mt_layernorm_backward_gpu(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                               const float *weight, const float *mean, const float *rstd, int B, int T, int C,
                               cudaStream_t stream) {
    int N = B * T;
    if (N == 0) return;
    // 8 warps, fewer when C is so large that their dweight/dbias slices would not fit
    int nwarps = 8;
    while (nwarps > 1 && (size_t)2 * nwarps * C * sizeof(float) > 160 * 1024) nwarps /= 2;
    size_t smem = (size_t)2 * nwarps * C * sizeof(float);
    if (smem > 200 * 1024) mt_fatal("layernorm backward: C = %d channels is too wide for shared memory", C);
    int nblocks = (N + MT__LN_ROWS_PER_BLOCK - 1) / MT__LN_ROWS_PER_BLOCK;
    float *partial;   // (2, nblocks, C): mt_gpu_layernorm_backward_scratch bytes
    mt__scratch_alloc((void **)&partial, mt_gpu_layernorm_backward_scratch(N, C), stream);
    float *partial_dbias = partial + (size_t)nblocks * C;
    int vec = C % 4 == 0 && mt__aligned16(dinp) && mt__aligned16(dout) && mt__aligned16(inp) && mt__aligned16(weight);
    if (vec && C <= 32 * 4 * 6) {   // (GPT-2 small's 768: six float4 a lane, no idle registers)
        mt__allow_smem((const void *)mt_layernorm_backward_vec_kernel<6>, smem);
        mt__launch("mt_layernorm_backward_vec_kernel", mt_layernorm_backward_vec_kernel<6>, nblocks, nwarps * 32, smem,
                   stream, dinp, partial, partial_dbias, dout, inp, weight, mean, rstd, N, C);
    } else if (vec && C <= 32 * 4 * 8) {
        mt__allow_smem((const void *)mt_layernorm_backward_vec_kernel<8>, smem);
        mt__launch("mt_layernorm_backward_vec_kernel", mt_layernorm_backward_vec_kernel<8>, nblocks, nwarps * 32, smem,
                   stream, dinp, partial, partial_dbias, dout, inp, weight, mean, rstd, N, C);
    } else if (vec && C <= 32 * 4 * 16) {
        mt__allow_smem((const void *)mt_layernorm_backward_vec_kernel<16>, smem);
        mt__launch("mt_layernorm_backward_vec_kernel", mt_layernorm_backward_vec_kernel<16>, nblocks, nwarps * 32, smem,
                   stream, dinp, partial, partial_dbias, dout, inp, weight, mean, rstd, N, C);
    } else {
        mt__allow_smem((const void *)mt_layernorm_backward_kernel, smem);
        mt__launch("mt_layernorm_backward_kernel", mt_layernorm_backward_kernel, nblocks, nwarps * 32, smem, stream,
                   dinp, partial, partial_dbias, dout, inp, weight, mean, rstd, N, C);
    }
    mt__launch("mt_layernorm_backward_reduce_kernel", mt_layernorm_backward_reduce_kernel, dim3((C + 31) / 32, 2),
               dim3(32, 32), 0, stream, dweight, dbias, partial, partial_dbias, nblocks, C);
    mt__scratch_free(partial, stream);
}

// ---------------------------------------------------------------------------------------------
// matmul: the GEMM ladder
// matches mt_matmul_forward_cpu and mt_matmul_backward_cpu (megatron.h, 3. OPS).
// All three training products are one GEMM,  C[i][j] (=|+=) sum_k A(i,k) B(j,k),  where each
// operand is stored either "k inner" (X(i,k) = x[i*ld + k], the reduction index is contiguous)
// or "k outer" (X(i,k) = x[k*ld + i], the output index is contiguous):
//   forward          out (BT,OC)  = inp (BT,C) @ weight^T     A = inp    k inner  B = weight k inner
//   input-gradient   dinp (BT,C) += dout (BT,OC) @ weight     A = dout   k inner  B = weight k outer
//   weight-gradient  dweight (OC,C) += dout^T @ inp           A = dout   k outer  B = inp    k outer
//   dbias (OC) += column sums of dout                         mt__column_sum_add (deterministic)
// Rungs (a plain run-time switch on mt_gemm_impl, the --gemm flag):
//   MT_GEMM_NAIVE  kernel1: one thread per output, a loop over k. The reading version.
//   MT_GEMM_TILED  kernel2: 128x128 output tile per block in fp32, 8x8 outputs per thread, the
//                  operands staged through shared memory 8 k at a time. Exact fp32 (--fp32).
//   MT_GEMM_MMA    kernel3: 128x128x32 tiles, 8 warps of 64x32, bf16 tensor cores (mma.sync
//                  m16n8k16, fp32 accumulators); fp32 operands rounded to bf16 on their way to
//                  shared memory, the next tile's loads in flight while this one is multiplied.
//   MT_GEMM_WGMMA  kernel4 (Hopper, sm_90a): 128x256x64 tiles fed by TMA through a 4-stage
//                  mbarrier ring, one producer and two consumer warpgroups issuing wgmma
//                  (m64n256k16); k-outer operands through wgmma's transpose bits; deterministic
//                  split-K for the weight-gradients. Operands rounded to bf16 copies first. The
//                  default for --bf16 where it runs, else mma. Its own header is below, by its code.
// When a problem has too few output tiles to fill the GPU (the weight-gradients: OC x C outputs
// but BT = 16k long reductions) the tiled and mma rungs split k into slices (blockIdx.z) that
// write partial products to a scratch, which mt_matmul_splitk_reduce_kernel adds in order.
// (mt_gemm_impl, the enum of the rungs, is megatron.h's: section 3's interface, "kernel scratch")
// one GEMM, as every rung sees it
typedef struct {
    float *c;                 // C (M, N), row stride ldc
    const float *a, *b;       // A (M x K) and B (N x K) in the layouts below
    const float *bias;        // (N), added once per output; NULL for none
    int M, N, K, lda, ldb, ldc;
    int a_k_inner, b_k_inner; // 1: X(i,k) = x[i*ld + k];  0: X(i,k) = x[k*ld + i]
    int accumulate;           // 1: C += A B^T;  0: C = A B^T + bias
    int vec_ok;               // a, b 16-byte aligned and lda, ldb multiples of 4: float4 loads are allowed
    int store2_ok;            // c 8-byte aligned, ldc and N even: two neighbouring outputs in one float2 store
    int k_per_split;          // slice z of the reduction is [z*k_per_split, (z+1)*k_per_split)
    float *workspace;         // split-K: partial products (splits, M, N); NULL when not split
} mt__gemm_args;

__device__ static inline float mt__gemm_a(const mt__gemm_args &g, int i, int k) {
    return g.a_k_inner ? g.a[(size_t)i * g.lda + k] : g.a[(size_t)k * g.lda + i];
}
__device__ static inline float mt__gemm_b(const mt__gemm_args &g, int j, int k) {
    return g.b_k_inner ? g.b[(size_t)j * g.ldb + k] : g.b[(size_t)k * g.ldb + j];
}
// write one output: to the split-K scratch, or into C with the bias / accumulation
__device__ static inline void mt__gemm_store(const mt__gemm_args &g, int i, int j, float v) {
    if (i >= g.M || j >= g.N) return;
    if (g.workspace) { g.workspace[((size_t)blockIdx.z * g.M + i) * g.N + j] = v; return; }
    float *c = g.c + (size_t)i * g.ldc + j;
    if (g.bias) v += g.bias[j];
    *c = g.accumulate ? *c + v : v;
}

// which 128x128 output tile a block computes. Blocks are numbered through groups of 8 row tiles,
// column by column inside a group, so the blocks that run at the same time share A's rows and
// B's columns in L2. (In plain row-major order the ~132 running blocks all need different
// columns of B; when B is larger than L2, as the lm head's 155 MB weight, every row tile reads
// all of B from memory again: 128 x 155 MB at GPT-2's shapes.)
__device__ static inline void mt__gemm_tile(int tile, int tiles_m, int tiles_n, int *tile_m, int *tile_n) {
    const int group_size = 8;
    int first_m = (tile / (group_size * tiles_n)) * group_size;
    int rows = min(tiles_m - first_m, group_size);   // the last group may be shorter
    int in_group = tile % (group_size * tiles_n);
    *tile_m = first_m + in_group % rows;
    *tile_n = in_group / rows;
}

// write the two neighbouring outputs (i, j) and (i, j+1), j even: one 8-byte store when both exist
// and the address allows it (half the store instructions, whole 32-byte sectors), else one by one
__device__ static inline void mt__gemm_store2(const mt__gemm_args &g, int i, int j, float v0, float v1) {
    if (i >= g.M) return;
    if (!(g.store2_ok && j + 1 < g.N)) {
        mt__gemm_store(g, i, j, v0);
        mt__gemm_store(g, i, j + 1, v1);
        return;
    }
    if (g.workspace) {
        *(float2 *)(g.workspace + ((size_t)blockIdx.z * g.M + i) * g.N + j) = make_float2(v0, v1);
        return;
    }
    float2 *c = (float2 *)(g.c + (size_t)i * g.ldc + j);
    if (g.bias) { v0 += g.bias[j]; v1 += g.bias[j + 1]; }
    if (g.accumulate) { float2 old = *c; v0 += old.x; v1 += old.y; }
    *c = make_float2(v0, v1);
}

// kernel1_naive: one thread per output C[i][j] = sum_k A(i,k) B(j,k). 16x16 threads per block.
__global__ void mt_matmul_kernel1_naive(mt__gemm_args g) {
    int j = blockIdx.x * blockDim.x + threadIdx.x, i = blockIdx.y * blockDim.y + threadIdx.y;
    if (i >= g.M || j >= g.N) return;
    float s = 0.0f;
    for (int k = 0; k < g.K; k++) s += mt__gemm_a(g, i, k) * mt__gemm_b(g, j, k);
    mt__gemm_store(g, i, j, s);
}

// kernel2_tiled: block = 256 threads = 16x16, output tile 128x128, each thread 8x8 outputs
// (rows ty*8.., columns tx*8..). Per step of 8 k: the block copies A's 128x8 and B's 128x8
// slices to shared memory as As[k][i], Bs[k][j] (consecutive threads take consecutive addresses
// of whichever index is contiguous in memory), then each thread does 8 outer products of an
// 8-vector of A by an 8-vector of B (64 FMAs per 16 shared loads).
// (MT__TILED_BM x MT__TILED_BN x MT__TILED_BK = 128 x 128 x 8 is megatron.h's, section 3 "the GPU
// build's kernel scratch": the memory plan counts the split-K partials with it on both builds)
template <int A_K_INNER, int B_K_INNER>
__global__ void __launch_bounds__(256) mt_matmul_kernel2_tiled(mt__gemm_args g) {
    __shared__ __align__(16) float As[MT__TILED_BK][MT__TILED_BM + 4];
    __shared__ __align__(16) float Bs[MT__TILED_BK][MT__TILED_BN + 4];
    int tx = threadIdx.x % 16, ty = threadIdx.x / 16, tile_m, tile_n;
    mt__gemm_tile(blockIdx.x, (g.M + MT__TILED_BM - 1) / MT__TILED_BM, (g.N + MT__TILED_BN - 1) / MT__TILED_BN, &tile_m,
                  &tile_n);
    int row0 = tile_m * MT__TILED_BM, col0 = tile_n * MT__TILED_BN;
    int k_begin = blockIdx.z * g.k_per_split, k_end = min(g.K, k_begin + g.k_per_split);
    float acc[8][8];
    #pragma unroll
    for (int i = 0; i < 8; i++)
        #pragma unroll
        for (int j = 0; j < 8; j++) acc[i][j] = 0.0f;
    for (int k0 = k_begin; k0 < k_end; k0 += MT__TILED_BK) {
        for (int e = threadIdx.x; e < MT__TILED_BM * MT__TILED_BK; e += 256) {
            int i = A_K_INNER ? e / MT__TILED_BK : e % MT__TILED_BM;   // row of the tile
            int k = A_K_INNER ? e % MT__TILED_BK : e / MT__TILED_BM;   // k of the tile
            int gi = row0 + i, gk = k0 + k;
            As[k][i] = (gi < g.M && gk < k_end)
                           ? (A_K_INNER ? g.a[(size_t)gi * g.lda + gk] : g.a[(size_t)gk * g.lda + gi]) : 0.0f;
        }
        for (int e = threadIdx.x; e < MT__TILED_BN * MT__TILED_BK; e += 256) {
            int j = B_K_INNER ? e / MT__TILED_BK : e % MT__TILED_BN;
            int k = B_K_INNER ? e % MT__TILED_BK : e / MT__TILED_BN;
            int gj = col0 + j, gk = k0 + k;
            Bs[k][j] = (gj < g.N && gk < k_end)
                           ? (B_K_INNER ? g.b[(size_t)gj * g.ldb + gk] : g.b[(size_t)gk * g.ldb + gj]) : 0.0f;
        }
        __syncthreads();
        #pragma unroll
        for (int k = 0; k < MT__TILED_BK; k++) {
            float4 a0 = *(const float4 *)&As[k][ty * 8], a1 = *(const float4 *)&As[k][ty * 8 + 4];
            float4 b0 = *(const float4 *)&Bs[k][tx * 8], b1 = *(const float4 *)&Bs[k][tx * 8 + 4];
            float a[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
            float b[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
            #pragma unroll
            for (int i = 0; i < 8; i++)
                #pragma unroll
                for (int j = 0; j < 8; j++) acc[i][j] += a[i] * b[j];
        }
        __syncthreads();
    }
    #pragma unroll
    for (int i = 0; i < 8; i++)
        #pragma unroll
        for (int j = 0; j < 8; j++) mt__gemm_store(g, row0 + ty * 8 + i, col0 + tx * 8 + j, acc[i][j]);
}

// ---- tensor-core helpers (PTX). ldmatrix loads four 8x8 bf16 matrices from shared memory, one
// row address per lane (lanes 8m..8m+7 give the rows of matrix m); .trans transposes each.
// mma.sync m16n8k16: D (16x8 fp32) += A (16x16 bf16, row-major) * B (16x8 bf16, "col": B[k][n]
// held per n). Fragment layouts (g = lane/4, t = lane%4), PTX ISA "mma.m16n8k16":
//   A: a0 = (row g,   k 2t..2t+1)  a1 = (row g+8, k 2t..)  a2 = (row g, k 2t+8..)  a3 = (row g+8, k 2t+8..)
//   B: b0 = (k 2t..2t+1, col g)    b1 = (k 2t+8.., col g)
//   C: c0,c1 = (row g, cols 2t, 2t+1)   c2,c3 = (row g+8, cols 2t, 2t+1)
__device__ static inline void mt__ldmatrix_x4(uint32_t r[4], const __nv_bfloat16 *p) {
    uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
__device__ static inline void mt__ldmatrix_x4_trans(uint32_t r[4], const __nv_bfloat16 *p) {
    uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
__device__ static inline void mt__mma_bf16(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// two floats -> two bf16 in one register (lo in the low half: the element at the lower address)
__device__ static inline uint32_t mt__pack_bf16x2(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    uint32_t r;
    memcpy(&r, &v, sizeof r);
    return r;
}
// --fp16: the same instruction with fp16 operands (.f16.f16; fp32 accumulators), and the same
// packing to fp16 (round to nearest even; past 65504 to inf, as mt_fp16_from_float). ldmatrix
// moves 16-bit elements whatever they mean, so the tiles of the tensor-core kernels hold bf16 or
// fp16 bits alike; the kernels take F16 (0: bf16, 1: fp16) as a template parameter and call:
__device__ static inline void mt__mma_f16(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ static inline uint32_t mt__pack_f16x2(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    uint32_t r;
    memcpy(&r, &v, sizeof r);
    return r;
}
template <int F16>
__device__ static inline void mt__mma16(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    if (F16) mt__mma_f16(d, a, b0, b1);
    else mt__mma_bf16(d, a, b0, b1);
}
template <int F16>
__device__ static inline uint32_t mt__pack16x2(float lo, float hi) {
    return F16 ? mt__pack_f16x2(lo, hi) : mt__pack_bf16x2(lo, hi);
}
// and back: two 16-bit values (bf16, or fp16 with F16 = 1) in one 32-bit word, as two floats (exactly)
template <int F16>
__device__ static inline float2 mt__unpack16x2(uint32_t w) {
    if (F16) {
        __half2 h;
        memcpy(&h, &w, sizeof w);
        return __half22float2(h);
    }
    __nv_bfloat162 b;
    memcpy(&b, &w, sizeof w);
    return __bfloat1622float2(b);
}
// 8 consecutive values from w (16-byte aligned) as floats: two float4, or one 16-byte load of 8
// 16-bit values (the GEMV's weights; the cross-entropy's 16-bit logits; a 16-bit gradient's column sums)
__device__ static inline void mt__load8(float v[8], const float *w) {
    float4 a = *(const float4 *)w, b = *(const float4 *)(w + 4);
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
}
__device__ static inline void mt__load8(float v[8], const __nv_bfloat16 *w) {
    uint4 u = *(const uint4 *)w;
    const __nv_bfloat16 *h = (const __nv_bfloat16 *)&u;
    #pragma unroll
    for (int e = 0; e < 8; e++) v[e] = __bfloat162float(h[e]);
}
__device__ static inline void mt__load8(float v[8], const __half *w) {
    uint4 u = *(const uint4 *)w;
    const __half *h = (const __half *)&u;
    #pragma unroll
    for (int e = 0; e < 8; e++) v[e] = __half2float(h[e]);
}
// one value as a float: fp32 as is, bf16 / fp16 widened (exactly)
__device__ static inline float mt__to_float(float w) { return w; }
__device__ static inline float mt__to_float(__nv_bfloat16 w) { return __bfloat162float(w); }
__device__ static inline float mt__to_float(__half w) { return __half2float(w); }
// 4 consecutive floats from p, of which n (0..4) exist; the rest read as 0
__device__ static inline float4 mt__load4(const float *p, int n, int vec_ok) {
    if (n >= 4 && vec_ok) return __ldg((const float4 *)p);
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (n > 0) v.x = p[0];
    if (n > 1) v.y = p[1];
    if (n > 2) v.z = p[2];
    if (n > 3) v.w = p[3];
    return v;
}

// kernel3_mma. Block: 256 threads = 8 warps in 2 (rows) x 4 (columns), output tile 128x128,
// warp tile 64x32 = 4 x 4 mma tiles of 16x8, so 64 fp32 accumulators per thread. Per step of
// BK = 32: each thread loads 4 float4 of A and 4 of B (16-byte loads, coalesced along whichever
// index is contiguous), rounds them to bf16 and stores them to shared memory in the SAME layout
// as in global memory: [row][k] (k inner) or [k][row] (k outer); the fragments are then read with
// ldmatrix, or ldmatrix.trans for the k-outer layout, which does the transpose. Rows are padded
// (+8 bf16) so the 8 row addresses of an ldmatrix fall in 8 different bank groups. Two
// shared-memory buffers: the loads of step s+1 are issued before the mma of step s, and stored
// after it, so global latency hides behind tensor-core work; one __syncthreads per step.
// (MT__MMA_BM x MT__MMA_BN x MT__MMA_BK = 128 x 128 x 32: megatron.h's, section 3, as the tiled rung's)
static const int MT__MMA_LDK = MT__MMA_BK + 8;             // row stride of a [row][k] tile, in bf16
static const int MT__MMA_LDR = MT__MMA_BM + 8;             // row stride of a [k][row] tile
static const int MT__MMA_TILE = MT__MMA_BM * MT__MMA_LDK;  // bf16 per buffer (the larger of 128*40, 32*136)
// global -> registers: this thread's 4 float4 of a 128 x 32 operand slice starting at (row0, k0)
template <int K_INNER>
__device__ static inline void mt__mma_load(float4 stage[4], const float *x, int ld, int rows, int row0, int k0,
                                           int k_end, int vec_ok) {
    #pragma unroll
    for (int s = 0; s < 4; s++) {
        int e = threadIdx.x + 256 * s;
        if (K_INNER) {   // 8 float4 along k per row: a warp reads 4 rows x 128 bytes
            int r = row0 + e / 8, k = k0 + 4 * (e % 8);
            int n = r < rows ? min(4, k_end - k) : 0;
            stage[s] = mt__load4(x + (size_t)r * ld + k, n, vec_ok);
        } else {         // 32 float4 along the rows per k: a warp reads 512 contiguous bytes
            int k = k0 + e / 32, r = row0 + 4 * (e % 32);
            int n = k < k_end ? min(4, rows - r) : 0;
            stage[s] = mt__load4(x + (size_t)k * ld + r, n, vec_ok);
        }
    }
}
// registers -> shared memory, rounded to bf16 (fp16 when F16): 8 bytes per float4
template <int K_INNER, int F16>
__device__ static inline void mt__mma_store(__nv_bfloat16 *tile, const float4 stage[4]) {
    #pragma unroll
    for (int s = 0; s < 4; s++) {
        int e = threadIdx.x + 256 * s;
        __nv_bfloat16 *dst = K_INNER ? tile + (e / 8) * MT__MMA_LDK + 4 * (e % 8) : tile + (e / 32) * MT__MMA_LDR + 4 * (e % 32);
        *(uint2 *)dst = make_uint2(mt__pack16x2<F16>(stage[s].x, stage[s].y), mt__pack16x2<F16>(stage[s].z, stage[s].w));
    }
}
// the A fragment of rows m0..m0+15, k k0..k0+15 of the tile
template <int K_INNER>
__device__ static inline void mt__mma_frag_a(uint32_t a[4], const __nv_bfloat16 *tile, int m0, int k0, int lane) {
    if (K_INNER) mt__ldmatrix_x4(a, tile + (m0 + lane % 16) * MT__MMA_LDK + k0 + (lane / 16) * 8);
    else mt__ldmatrix_x4_trans(a, tile + (k0 + lane % 8 + (lane / 16) * 8) * MT__MMA_LDR + m0 + ((lane / 8) % 2) * 8);
}
// the B fragments of columns n0..n0+15 (two n8 tiles: b[0],b[1] and b[2],b[3]), k k0..k0+15
template <int K_INNER>
__device__ static inline void mt__mma_frag_b(uint32_t b[4], const __nv_bfloat16 *tile, int n0, int k0, int lane) {
    if (K_INNER) mt__ldmatrix_x4(b, tile + (n0 + lane % 8 + (lane / 16) * 8) * MT__MMA_LDK + k0 + ((lane / 8) % 2) * 8);
    else mt__ldmatrix_x4_trans(b, tile + (k0 + lane % 8 + ((lane / 8) % 2) * 8) * MT__MMA_LDR + n0 + (lane / 16) * 8);
}
// F16: 0 = bf16 operands (--bf16), 1 = fp16 (--fp16)
template <int A_K_INNER, int B_K_INNER, int F16>
__global__ void __launch_bounds__(256) mt_matmul_kernel3_mma(mt__gemm_args g) {
    __shared__ __align__(16) __nv_bfloat16 As[2][MT__MMA_TILE];
    __shared__ __align__(16) __nv_bfloat16 Bs[2][MT__MMA_TILE];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    int warp_m = warp / 4, warp_n = warp % 4;   // this warp's 64x32 piece of the 128x128 tile
    int tile_m, tile_n;
    mt__gemm_tile(blockIdx.x, (g.M + MT__MMA_BM - 1) / MT__MMA_BM, (g.N + MT__MMA_BN - 1) / MT__MMA_BN, &tile_m,
                  &tile_n);
    int row0 = tile_m * MT__MMA_BM, col0 = tile_n * MT__MMA_BN;
    int k_begin = blockIdx.z * g.k_per_split, k_end = min(g.K, k_begin + g.k_per_split);
    int steps = (k_end - k_begin + MT__MMA_BK - 1) / MT__MMA_BK;
    float acc[4][4][4];
    #pragma unroll
    for (int i = 0; i < 4; i++)
        #pragma unroll
        for (int j = 0; j < 4; j++)
            #pragma unroll
            for (int e = 0; e < 4; e++) acc[i][j][e] = 0.0f;
    float4 stage_a[4], stage_b[4];
    mt__mma_load<A_K_INNER>(stage_a, g.a, g.lda, g.M, row0, k_begin, k_end, g.vec_ok);
    mt__mma_load<B_K_INNER>(stage_b, g.b, g.ldb, g.N, col0, k_begin, k_end, g.vec_ok);
    mt__mma_store<A_K_INNER, F16>(As[0], stage_a);
    mt__mma_store<B_K_INNER, F16>(Bs[0], stage_b);
    __syncthreads();
    for (int s = 0; s < steps; s++) {
        int cur = s % 2;
        int more = s + 1 < steps;
        if (more) {   // issue the next slice's loads now; they land while the tensor cores work
            int k_next = k_begin + (s + 1) * MT__MMA_BK;
            mt__mma_load<A_K_INNER>(stage_a, g.a, g.lda, g.M, row0, k_next, k_end, g.vec_ok);
            mt__mma_load<B_K_INNER>(stage_b, g.b, g.ldb, g.N, col0, k_next, k_end, g.vec_ok);
        }
        #pragma unroll
        for (int kk = 0; kk < MT__MMA_BK; kk += 16) {
            uint32_t a[4][4], b[4][2];
            #pragma unroll
            for (int mi = 0; mi < 4; mi++) mt__mma_frag_a<A_K_INNER>(a[mi], As[cur], warp_m * 64 + mi * 16, kk, lane);
            #pragma unroll
            for (int nj = 0; nj < 4; nj += 2) {
                uint32_t r[4];
                mt__mma_frag_b<B_K_INNER>(r, Bs[cur], warp_n * 32 + nj * 8, kk, lane);
                b[nj][0] = r[0]; b[nj][1] = r[1]; b[nj + 1][0] = r[2]; b[nj + 1][1] = r[3];
            }
            #pragma unroll
            for (int mi = 0; mi < 4; mi++)
                #pragma unroll
                for (int ni = 0; ni < 4; ni++) mt__mma16<F16>(acc[mi][ni], a[mi], b[ni][0], b[ni][1]);
        }
        if (more) {   // the other buffer was last read before the previous __syncthreads
            mt__mma_store<A_K_INNER, F16>(As[1 - cur], stage_a);
            mt__mma_store<B_K_INNER, F16>(Bs[1 - cur], stage_b);
        }
        __syncthreads();
    }
    int gq = lane / 4, tq = lane % 4;
    #pragma unroll
    for (int mi = 0; mi < 4; mi++)
        #pragma unroll
        for (int ni = 0; ni < 4; ni++) {
            int i = row0 + warp_m * 64 + mi * 16 + gq, j = col0 + warp_n * 32 + ni * 8 + 2 * tq;
            mt__gemm_store2(g, i, j, acc[mi][ni][0], acc[mi][ni][1]);
            mt__gemm_store2(g, i + 8, j, acc[mi][ni][2], acc[mi][ni][3]);
        }
}

// split-K: C[i][j] = (accumulate ? C[i][j] : 0) + (sum over slices z, in order, of W[z][i][j]) + bias[j]
__global__ void mt_matmul_splitk_reduce_kernel(mt__gemm_args g, int splits) {
    size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= (size_t)g.M * g.N) return;
    int i = (int)(e / g.N), j = (int)(e % g.N);
    float v = 0.0f;
    for (int z = 0; z < splits; z++) v += g.workspace[(size_t)z * g.M * g.N + e];
    if (g.bias) v += g.bias[j];
    float *c = g.c + (size_t)i * g.ldc + j;
    *c = g.accumulate ? *c + v : v;
}

// dst[n] += sum_m src[m*N + n], deterministically: pass 1 sums 256-row chunks (block (32,8): a
// column per tx, every 8th row per ty, then the 8 in order) into partial[chunk][n]; pass 2 adds
// the chunks the same way (every 8th chunk per ty, then the 8 in order).
// (MT__COLSUM_ROWS = 256 rows per chunk: megatron.h's, section 3, which sizes the partials)
__global__ void mt_column_sum_partial_kernel(float *__restrict__ partial, const float *__restrict__ src, int M,
                                             int N) {
    mt__pdl_start();   // (launched with programmatic dependent launch inside a training graph)
    __shared__ float sums[8][33];
    int n = blockIdx.x * 32 + threadIdx.x;
    int m_begin = blockIdx.y * MT__COLSUM_ROWS, m_end = min(M, m_begin + MT__COLSUM_ROWS);
    float s = 0.0f;
    if (n < N)
        for (int m = m_begin + threadIdx.y; m < m_end; m += 8) s += src[(size_t)m * N + n];
    sums[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && n < N) {
        float t = 0.0f;
        #pragma unroll
        for (int y = 0; y < 8; y++) t += sums[y][threadIdx.x];
        partial[(size_t)blockIdx.y * N + n] = t;
    }
}
// Pass 2, block (32, 8): 32 columns; row ty of threads adds chunks ty, ty + 8, ty + 16, ... (its
// loads issued together), then ty = 0 adds the 8 sums in order: a fixed order, so the same bits every
// run. (One thread a column walking all 64 chunks of GPT-2's batch in a row took 4.7 us a launch under
// ncu on 3 blocks for 768 columns, 48 launches a step: docs/perf.md, session 41.)
__global__ void mt_column_sum_finish_kernel(float *__restrict__ dst, const float *__restrict__ partial, int chunks,
                                            int N) {
    mt__pdl_start();   // (launched with programmatic dependent launch inside a training graph)
    __shared__ float sums[8][33];
    int n = blockIdx.x * 32 + threadIdx.x;
    float s = 0.0f;
    if (n < N) {
        #pragma unroll 8
        for (int k = threadIdx.y; k < chunks; k += 8) s += partial[(size_t)k * N + n];
    }
    sums[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y != 0 || n >= N) return;
    float t = 0.0f;
    #pragma unroll
    for (int y = 0; y < 8; y++) t += sums[y][threadIdx.x];
    dst[n] += t;
}
// Pass 1 with a float4 per thread (N % 4 == 0, src 16-byte aligned): block (32,8) covers 128
// columns, so a warp reads 512 contiguous bytes of a row instead of 128 (the one-float version
// reaches ~1.9 TB/s, half the copy bandwidth). The same chunks and the same order per column.
// copy16 (T = __nv_bfloat16 or __half), when not NULL, also receives every element rounded to T
// (the GEMM operand the backward needs: the dbias pass and the cast read dout once, together).
template <typename T>
__global__ void mt_column_sum_partial_vec4_kernel(float *__restrict__ partial, const float *__restrict__ src,
                                                  T *__restrict__ copy16, int M, int N) {
    mt__pdl_start();   // (launched with programmatic dependent launch inside a training graph)
    __shared__ float4 sums[8][32];
    int n = 4 * (blockIdx.x * 32 + threadIdx.x);
    int m_begin = blockIdx.y * MT__COLSUM_ROWS, m_end = min(M, m_begin + MT__COLSUM_ROWS);
    float4 s = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (n < N)
        for (int m = m_begin + threadIdx.y; m < m_end; m += 8) {
            float4 v = *(const float4 *)(src + (size_t)m * N + n);
            s.x += v.x; s.y += v.y; s.z += v.z; s.w += v.w;
            if (copy16) {
                T o[4];
                mt__store_rounded4(o, v);
                *(uint2 *)(copy16 + (size_t)m * N + n) = *(const uint2 *)o;
            }
        }
    sums[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && n < N) {
        float4 t = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        #pragma unroll
        for (int y = 0; y < 8; y++) {
            float4 u = sums[y][threadIdx.x];
            t.x += u.x; t.y += u.y; t.z += u.z; t.w += u.w;
        }
        *(float4 *)(partial + (size_t)blockIdx.y * N + n) = t;
    }
}
// Pass 1 over a gradient stored in 16 bits (T = __nv_bfloat16 or __half: the fc output's, as
// fc-proj's backward wrote it, megatron.h's mt_fch_storage_dtype): a thread sums 8 columns, read as
// one 16-byte load a row (N % 8 == 0, src 16-byte aligned), so block (32,8) covers 256 columns. The
// same chunks and the same order per column as the fp32 kernels, the sums in fp32.
template <typename T>
__global__ void mt_column_sum16_partial_kernel(float *__restrict__ partial, const T *__restrict__ src, int M, int N) {
    mt__pdl_start();   // (launched with programmatic dependent launch inside a training graph)
    __shared__ float4 sums[8][2][32];
    int n = 8 * (blockIdx.x * 32 + threadIdx.x);
    int m_begin = blockIdx.y * MT__COLSUM_ROWS, m_end = min(M, m_begin + MT__COLSUM_ROWS);
    float s[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    if (n < N)
        for (int m = m_begin + threadIdx.y; m < m_end; m += 8) {
            float v[8];
            mt__load8(v, src + (size_t)m * N + n);
            #pragma unroll
            for (int e = 0; e < 8; e++) s[e] += v[e];
        }
    sums[threadIdx.y][0][threadIdx.x] = make_float4(s[0], s[1], s[2], s[3]);
    sums[threadIdx.y][1][threadIdx.x] = make_float4(s[4], s[5], s[6], s[7]);
    __syncthreads();
    if (threadIdx.y == 0 && n < N) {
        #pragma unroll
        for (int half = 0; half < 2; half++) {
            float4 t = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            #pragma unroll
            for (int y = 0; y < 8; y++) {
                float4 u = sums[y][half][threadIdx.x];
                t.x += u.x; t.y += u.y; t.z += u.z; t.w += u.w;
            }
            *(float4 *)(partial + (size_t)blockIdx.y * N + n + 4 * half) = t;
        }
    }
}
// dst[n] += sum_m src[m*N + n] for a 16-bit src (N % 8 == 0, 16-byte aligned: the callers' wgmma
// condition), into the same partials and finish as mt__column_sum_add
template <typename T>
static void mt__column_sum16_add(float *dst, const T *src, int M, int N, cudaStream_t stream) {
    if (N % 8 != 0 || !mt__aligned16(src)) mt_fatal("internal: a 16-bit column sum needs N %% 8 == 0 and aligned rows");
    int chunks = (M + MT__COLSUM_ROWS - 1) / MT__COLSUM_ROWS;
    float *partial;
    mt__scratch_alloc((void **)&partial, mt_gpu_column_sum_scratch(M, N), stream);   // (chunks, N)
    dim3 grid((N / 8 + 31) / 32, chunks);
    mt__launch("mt_column_sum16_partial_kernel", mt_column_sum16_partial_kernel<T>, grid, dim3(32, 8), 0, stream,
               partial, src, M, N);
    mt__launch("mt_column_sum_finish_kernel", mt_column_sum_finish_kernel, (N + 31) / 32, dim3(32, 8), 0, stream, dst,
               partial, chunks, N);
    mt__scratch_free(partial, stream);
}
// copy16: NULL, or also write src rounded to T there (same layout; needs the float4 path)
template <typename T>
static void mt__column_sum_add_copy(float *dst, const float *src, T *copy16, int M, int N, cudaStream_t stream) {
    int chunks = (M + MT__COLSUM_ROWS - 1) / MT__COLSUM_ROWS;
    float *partial;
    mt__scratch_alloc((void **)&partial, mt_gpu_column_sum_scratch(M, N), stream);   // (chunks, N)
    int vec = N % 4 == 0 && mt__aligned16(src) && (!copy16 || (uintptr_t)copy16 % 8 == 0);
    if (vec) {
        dim3 grid((N / 4 + 31) / 32, chunks);
        mt__launch("mt_column_sum_partial_vec4_kernel", mt_column_sum_partial_vec4_kernel<T>, grid, dim3(32, 8), 0,
                   stream, partial, src, copy16, M, N);
    } else {
        if (copy16) mt_fatal("internal: the fused column sum and cast needs N %% 4 == 0 and aligned rows");
        dim3 grid((N + 31) / 32, chunks);
        mt__launch("mt_column_sum_partial_kernel", mt_column_sum_partial_kernel, grid, dim3(32, 8), 0, stream, partial,
                   src, M, N);
    }
    mt__launch("mt_column_sum_finish_kernel", mt_column_sum_finish_kernel, (N + 31) / 32, dim3(32, 8), 0, stream, dst,
               partial, chunks, N);
    mt__scratch_free(partial, stream);
}
static void mt__column_sum_add(float *dst, const float *src, int M, int N, cudaStream_t stream) {
    mt__column_sum_add_copy<__nv_bfloat16>(dst, src, NULL, M, N, stream);
}

// how many k-slices (mt_gemm_splits, megatron.h section 3): enough blocks for about two per SM of
// an H100/H200 (132 SMs), each slice at least 4 steps of bk; a function of the shape only
// launch one rung of the ladder on one GEMM (the template arguments are the two operand layouts;
// f16: the mma rung's operands in fp16, else bf16)
template <int A_K_INNER, int B_K_INNER>
static void mt__gemm_launch(mt_gemm_impl impl, mt__gemm_args g, int f16, cudaStream_t stream) {
    if (impl == MT_GEMM_NAIVE) {
        dim3 grid((g.N + 15) / 16, (g.M + 15) / 16);
        g.k_per_split = g.K;
        mt_matmul_kernel1_naive<<<grid, dim3(16, 16), 0, stream>>>(g);
        mt__launch_check("mt_matmul_kernel1_naive", stream);
        return;
    }
    int bm = impl == MT_GEMM_MMA ? MT__MMA_BM : MT__TILED_BM, bn = impl == MT_GEMM_MMA ? MT__MMA_BN : MT__TILED_BN;
    int tiles_m = (g.M + bm - 1) / bm, tiles_n = (g.N + bn - 1) / bn;
    int splits = mt_gemm_splits(impl, g.M, g.N, g.K, &g.k_per_split);   // k_per_split: a multiple of bk
    g.workspace = NULL;
    if (splits > 1) mt__scratch_alloc((void **)&g.workspace, (size_t)splits * g.M * g.N * sizeof(float), stream);
    dim3 grid(tiles_m * tiles_n, 1, splits);   // tile order: mt__gemm_tile
    if (impl == MT_GEMM_MMA) {
        if (f16) mt_matmul_kernel3_mma<A_K_INNER, B_K_INNER, 1><<<grid, 256, 0, stream>>>(g);
        else mt_matmul_kernel3_mma<A_K_INNER, B_K_INNER, 0><<<grid, 256, 0, stream>>>(g);
        mt__launch_check("mt_matmul_kernel3_mma", stream);
    } else {
        mt_matmul_kernel2_tiled<A_K_INNER, B_K_INNER><<<grid, 256, 0, stream>>>(g);
        mt__launch_check("mt_matmul_kernel2_tiled", stream);
    }
    if (splits > 1) {
        mt_matmul_splitk_reduce_kernel<<<mt__blocks((size_t)g.M * g.N, 256), 256, 0, stream>>>(g, splits);
        mt__launch_check("mt_matmul_splitk_reduce_kernel", stream);
        mt__scratch_free(g.workspace, stream);
    }
}
// ---------------------------------------------------------------------------------------------
// matmul, the top rung: kernel4_wgmma (Hopper, sm_90a only). mt__gemm below hands it the GEMMs
// of --gemm wgmma (the default for --bf16 where the GPU and the binary can run it).
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


// (the tile, MT__WG_BM x MT__WG_BN x MT__WG_BK = 128 x 256 x 64, and MT__WG_SMS = 132 are megatron.h's,
// section 3 "the GPU build's kernel scratch": the split-K plan and the memory plan use them on both builds)
// TWO TILE SHAPES, one kernel: NWG consumer warpgroups, each 64 rows of the tile.
//   NWG = 2: 128 x 256 (MT__WG_BM x MT__WG_BN), wgmma m64n256k16: every GEMM's default.
//   NWG = 3: 192 x 192 (MT__WG192), wgmma m64n192k16, 96 accumulators a thread: the weight
//            gradients of fc and fc-proj (3072 x 768, K = 16k): 64 tiles in 2 k-slices are 128
//            units, one wave on 132 SMs, where 128 x 256 gives 72 tiles, 216 units in 3 slices,
//            1.6 waves (mt_wgmma_plan_make, megatron.h, chooses; both k-outer operands only).
// A stage is 48 KB either way (A 128 x 64 + B 256 x 64, or 192 x 64 twice, bf16).
static const int MT__WG_STAGES = 4;
static const int MT__WG_STAGE_BYTES = 48 * 1024;
__host__ __device__ constexpr int mt__wg_bm(int nwg) { return 64 * nwg; }
__host__ __device__ constexpr int mt__wg_bn(int nwg) { return nwg == 2 ? MT__WG_BN : MT__WG192; }
__host__ __device__ constexpr int mt__wg_threads(int nwg) { return 128 * (nwg + 1); }   // + the producer warpgroup
static const int MT__WG_STAGE_PIECE = 4096;   // a consumer warp's staging piece for the epilogue (below)
// shared memory: the ring, its mbarriers, and (128 x 256 only: 192 x 192 has no room) the staging pieces
__host__ __device__ constexpr int mt__wg_smem(int nwg) {
    return 1024 /* alignment slack */ + MT__WG_STAGES * MT__WG_STAGE_BYTES +
           128 /* mbarriers, 2 * MT__WG_STAGES * 8 bytes, rounded up */ +
           (nwg == 2 ? 8 * MT__WG_STAGE_PIECE : 0);   // 230,528 bytes of the 232,448 an H200 block may have
}
static const int MT__WG_SMEM = mt__wg_smem(2);
static const int MT__WG_THREADS = mt__wg_threads(2);   // producer warpgroup + 2 consumer warpgroups

typedef struct {
    float *c;                // C (M, N), row stride ldc
    const float *bias;       // (N) or NULL
    int M, N, K, ldc;
    int accumulate;          // 1: C += ..., 0: C = ...
    int store2_ok;           // c 8-byte aligned, ldc and N even: float2 stores
    int stage_ok;            // the staged epilogue (below): N and ldc multiples of 8, c, c2, aux 16-byte
                             // aligned, bias 8-byte aligned
    int tiles_m, tiles_n;    // output tiles of bm x bn
    int bm, bn;              // 128 x 256, or 192 x 192 (the kernel's NWG = bm / 64)
    int splits, k_per_split; // split-K: unit u = tile * splits + z covers k in [z*k_per_split, (z+1)*k_per_split)
    int steps_tile;          // k-steps of 64 per tile: ceil(K / 64)
    int sk_workers;          // stream-K: the k-steps of all tiles, in a row, cut among this many workers; 0: off
    int sk_slots;            // stream-K: partial slots per worker (the most tiles one worker's range can touch)
    long long sk_total;      // stream-K: tiles * steps_tile
    float *workspace;        // partials, (slots, 2 halves, 32, 128) float4; NULL when every unit writes C
    int epilogue;            // MT__EPI_*: what the epilogue does with v = sum + bias besides storing it
    const void *aux;         // MT__EPI_GELU_GRAD(16)(_GELU16): the GELU's input, (M, N) with row stride ldc;
                             // MT__EPI_RESIDUAL: the residual added to C, fp32, the same layout
    void *c2;                // MT__EPI_GELU(16): gelu(v) also goes here, (M, N) with row stride ldc: fp32
                             // (GELU), or 16 bits (GELU16: bf16, or fp16 where c2_f16 = 1); GELU_GRAD16_GELU16:
                             // gelu(aux) in 16 bits
    int c2_f16;
} mt__wgmma_args;
// the fused epilogues (accumulate = 0): the MLP's GELU after the fc GEMM, and its derivative after
// the fc-proj input gradient, while the GEMM's output is still in registers (one pass over (M, N)
// less each). C = v (plain); C = v, C2 = gelu(v) (GELU); C = v * gelu'(aux) (GELU_GRAD); and
// C = v, C2 = gelu(v) rounded to the GEMM's 16-bit operand type (GELU16: the training MLP, whose
// GELU output only ever enters the next GEMM, mt_mlp_forward_gpu: half the bytes, no cast pass)
// STORE16: C itself in 16 bits, at c2 (the attention's q, k, v as it reads them: mt_qkv_forward_gpu)
// STORE16_GELU16: C rounded to 16 bits, at c (the training MLP's fc output, kept so for the backward:
// megatron.h's mt_fch_storage_dtype), and gelu of those 16-bit values rounded to 16 bits at c2 (what
// fc-proj's GEMM reads; the backward remakes exactly these bits from the kept fc output)
// GELU_GRAD16: GELU_GRAD with aux, the GELU's input, in 16 bits (the fc output kept so), and C
// rounded to 16 bits at c (the fc output's gradient, kept so for the fc backward's GEMMs and bias
// gradient, which read it as is: megatron.h's mt_fch_storage_dtype)
// GELU_GRAD16_GELU16: GELU_GRAD16, and gelu(aux) rounded to 16 bits at c2: the GELU's output remade
// from the input the epilogue reads anyway, for fc-proj's weight gradient, the next GEMM (the same
// bits as mt__gelu_rounded's pass over aux, which it saves: a read and a write of (M, N) 16-bit
// values and a launch, per layer)
// RESIDUAL: C = aux + v, aux fp32 (M, N) with row stride ldc: the residual stream's add after a
// row-parallel projection in a training forward at TP = 1 without hidden dropout (megatron.h's
// mt_mlp_forward and mt_matmul_forward with a residual): residual3 = residual2 + (gelu(fch) W + b)
// and residual2 = x + (atty W + b) written once, instead of the product written, then read again
// with the residual by the next kernel (a pass over (M, N) fp32 less each)
enum { MT__EPI_NONE = 0, MT__EPI_GELU = 1, MT__EPI_GELU_GRAD = 2, MT__EPI_GELU16 = 3, MT__EPI_STORE16 = 4,
       MT__EPI_STORE16_GELU16 = 5, MT__EPI_GELU_GRAD16 = 6, MT__EPI_GELU_GRAD16_GELU16 = 7, MT__EPI_RESIDUAL = 8 };
typedef struct {
    int op;             // MT__EPI_*
    const void *aux;    // MT__EPI_GELU_GRAD: gelu's input x (M, N), row stride ldc (GELU_GRAD16(_GELU16): in 16 bits);
                        // MT__EPI_RESIDUAL: the residual (M, N) fp32, row stride ldc
    void *c2;           // MT__EPI_GELU: gelu(C) (M, N) fp32, row stride ldc; MT__EPI_GELU16: the same in 16 bits;
                        // MT__EPI_STORE16: C in 16 bits (then c is not written); STORE16_GELU16: gelu in 16
                        // bits (and c holds C in 16 bits); GELU_GRAD16_GELU16: gelu(aux) in 16 bits
} mt__epilogue;

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
// the same box, multicast: it lands at dst in every block of the cluster named in cta_mask (bit r =
// cluster rank r), and completes its bytes on the mbarrier at the same offset `bar` in each of them
__device__ static inline void mt__tma_load_2d_multicast(uint32_t dst, const CUtensorMap *map, int x0, int x1, uint32_t bar,
                                                        uint16_t cta_mask) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
                 " [%0], [%1, {%2, %3}], [%4], %5;\n"
                 ::"r"(dst), "l"((uint64_t)map), "r"(x0), "r"(x1), "r"(bar), "h"(cta_mask) : "memory");
}
// thread block clusters: this block's rank in its cluster; every thread of the cluster meets (arrive,
// then wait: the writes before are visible to the cluster after); arrive on the mbarrier at offset
// `bar` of the cluster's block `rank` (the address mapped into that block's shared memory window)
__device__ static inline uint32_t mt__cluster_rank(void) {
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
}
__device__ static inline void mt__cluster_sync(void) {
    asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}
__device__ static inline void mt__mbar_arrive_cluster(uint32_t bar, uint32_t rank) {
    uint32_t remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(bar), "r"(rank));
    asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(remote) : "memory");
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
// A wgmma's accumulators are one asm operand each: 32, 96 or 128 "+f" registers, in the same order
// in the instruction's register list ("%0, %1, ...") and in the asm's operand list. Written out
// once here for every wrapper below (and the attention's m64n64 ones, further down):
// MT__WGMMA_REGSn is the instruction's list, MT__WGMMA_ACCn(C) the operands C(d[0]), C(d[1]), ...
// with C the constraint ("+f": D is read and written; "=f": written only).
#define MT__WGMMA_ACC8(C, B) C(d[B + 0]), C(d[B + 1]), C(d[B + 2]), C(d[B + 3]), C(d[B + 4]), C(d[B + 5]), \
                             C(d[B + 6]), C(d[B + 7])
#define MT__WGMMA_ACC32(C, B) MT__WGMMA_ACC8(C, B), MT__WGMMA_ACC8(C, B + 8), MT__WGMMA_ACC8(C, B + 16), \
                              MT__WGMMA_ACC8(C, B + 24)
#define MT__WGMMA_ACC96(C) MT__WGMMA_ACC32(C, 0), MT__WGMMA_ACC32(C, 32), MT__WGMMA_ACC32(C, 64)
#define MT__WGMMA_ACC128(C) MT__WGMMA_ACC96(C), MT__WGMMA_ACC32(C, 96)
#define MT__WGMMA_REGS32 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
                         "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define MT__WGMMA_REGS96 MT__WGMMA_REGS32 ", " \
                         "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
                         "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
                         "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
                         "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
#define MT__WGMMA_REGS128 MT__WGMMA_REGS96 ", " \
                          "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
                          "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
// D (64 x 256 fp32, 128 registers a thread) += A (64 x 16, descriptor) * B (16 x 256, descriptor)^T,
// bf16 (F16 = 0) or fp16 (--fp16: wgmma's .f16 form, the same registers and descriptors) operands.
// TA / TB: 0 = the operand's tile is K-major (k inner), 1 = MN-major (k outer).
// Register d[4*n + e] holds row 16*warp + lane/4 (+8 for e >= 2), column 8*n + 2*(lane%4) (+1 for odd e).
// (scale-d = 1: accumulate; scale-a = scale-b = 1)
template <int F16, int TA, int TB>
__device__ static inline void mt__wgmma_m64n256k16(float d[128], uint64_t desc_a, uint64_t desc_b) {
    if (F16)
        asm volatile("{\n"
                     "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 {" MT__WGMMA_REGS128 "},\n"
                     " %128, %129, 1, 1, 1, %130, %131;\n"
                     "}\n"
                     : MT__WGMMA_ACC128("+f")
                     : "l"(desc_a), "l"(desc_b), "n"(TA), "n"(TB)
                     : "memory");
    else
        asm volatile("{\n"
                     "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" MT__WGMMA_REGS128 "},\n"
                     " %128, %129, 1, 1, 1, %130, %131;\n"
                     "}\n"
                     : MT__WGMMA_ACC128("+f")
                     : "l"(desc_a), "l"(desc_b), "n"(TA), "n"(TB)
                     : "memory");
}

// D (64 x 192 fp32, 96 registers a thread) += A (64 x 16) * B (16 x 192)^T: the 192 x 192 tile's
// product (three consumer warpgroups, below), bf16 (F16 = 0) or fp16 operands; registers, TA, TB
// as mt__wgmma_m64n256k16's (d[4*n + e]: column 8*n + 2*(lane%4) (+1), n = 0..23)
template <int F16, int TA, int TB>
__device__ static inline void mt__wgmma_m64n192k16(float d[96], uint64_t desc_a, uint64_t desc_b) {
    if (F16)
        asm volatile("{\n"
                     "wgmma.mma_async.sync.aligned.m64n192k16.f32.f16.f16 {" MT__WGMMA_REGS96 "},\n"
                     " %96, %97, 1, 1, 1, %98, %99;\n"
                     "}\n"
                     : MT__WGMMA_ACC96("+f")
                     : "l"(desc_a), "l"(desc_b), "n"(TA), "n"(TB)
                     : "memory");
    else
        asm volatile("{\n"
                     "wgmma.mma_async.sync.aligned.m64n192k16.f32.bf16.bf16 {" MT__WGMMA_REGS96 "},\n"
                     " %96, %97, 1, 1, 1, %98, %99;\n"
                     "}\n"
                     : MT__WGMMA_ACC96("+f")
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
    *row0 = (first_m + in_group % rows) * g.bm;
    *col0 = (in_group / rows) * g.bn;
}
// THE WORK of a block, one piece at a time. A piece is (tile, k range, slot): slot < 0 means it
// covers the whole k range and writes C; otherwise it writes its partial to workspace slot `slot`.
//   plain / split-K (sk_workers == 0): unit u = tile * splits + z, units blockIdx.x + n * gridDim.x.
//   stream-K: lay the k-steps of all tiles end to end (tile 0's steps, then tile 1's, ...: sk_total)
//       and give worker w the range [w * sk_total / W, (w+1) * sk_total / W); workers
//       blockIdx.x + n * gridDim.x. Each range covers the tail of one tile, whole tiles, the head of
//       another: every block does the same number of k-steps (to +-1), whatever the tile count.
//       Piece (worker w, tile t) writes slot w * sk_slots + (t - first tile of w).
// With the ping-pong schedule the blocks work in cluster pairs, and both blocks of a pair take the
// same units (each its 64-row half of the tile): pair p = blockIdx.x / 2 does units p, p + grid / 2, ...
typedef struct { int u, stride; long long x, end; } mt__wgmma_cursor;
typedef struct { int tile, k_begin, steps; long long slot; } mt__wgmma_piece;
__host__ __device__ static inline long long mt__sk_start(const mt__wgmma_args &g, int w) {
    return (long long)w * g.sk_total / g.sk_workers;
}
__device__ static inline void mt__wgmma_begin(const mt__wgmma_args &g, mt__wgmma_cursor *c, int pair) {
    c->u = pair ? blockIdx.x / 2 : blockIdx.x;
    c->stride = pair ? gridDim.x / 2 : gridDim.x;
    if (g.sk_workers) { c->x = mt__sk_start(g, c->u); c->end = mt__sk_start(g, c->u + 1); }
}
// the next piece of this block's work; 0 when there is none
__device__ static inline int mt__wgmma_next(const mt__wgmma_args &g, mt__wgmma_cursor *c, mt__wgmma_piece *p) {
    if (!g.sk_workers) {
        if (c->u >= g.tiles_m * g.tiles_n * g.splits) return 0;
        int u = c->u;
        c->u += c->stride;
        p->tile = u / g.splits;
        p->k_begin = (u % g.splits) * g.k_per_split;
        int k_end = min(g.K, p->k_begin + g.k_per_split);
        p->steps = k_end > p->k_begin ? (k_end - p->k_begin + MT__WG_BK - 1) / MT__WG_BK : 0;
        p->slot = g.splits > 1 ? u : -1;
        return 1;
    }
    while (c->x >= c->end) {   // this worker's range is done (or empty): the block's next worker
        c->u += c->stride;
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

// write one output of C, with bias and accumulation exactly as mt__gemm_store, and the epilogue
// EPI (an MT__EPI_*, a template parameter: the plain GEMM's code holds none of the GELU's)
template <int EPI>
__device__ static inline void mt__wgmma_store1(const mt__wgmma_args &g, int i, int j, float v) {
    if (i >= g.M || j >= g.N) return;
    size_t at = (size_t)i * g.ldc + j;
    if (g.bias) v += g.bias[j];
    if (EPI == MT__EPI_STORE16) {   // (never with accumulate)
        if (g.c2_f16) ((__half *)g.c2)[at] = __float2half_rn(v);
        else ((__nv_bfloat16 *)g.c2)[at] = __float2bfloat16_rn(v);
        return;
    }
    if (EPI == MT__EPI_STORE16_GELU16) {   // C rounded at c, gelu of the rounded value at c2 (no accumulate)
        if (g.c2_f16) {
            __half h = __float2half_rn(v);
            ((__half *)g.c)[at] = h;
            ((__half *)g.c2)[at] = __float2half_rn(mt__gelu(__half2float(h)));
        } else {
            __nv_bfloat16 h = __float2bfloat16_rn(v);
            ((__nv_bfloat16 *)g.c)[at] = h;
            ((__nv_bfloat16 *)g.c2)[at] = __float2bfloat16_rn(mt__gelu(__bfloat162float(h)));
        }
        return;
    }
    float *c = g.c + at;
    if (EPI == MT__EPI_GELU) ((float *)g.c2)[at] = mt__gelu(v);
    if (EPI == MT__EPI_GELU16 && g.c2_f16) ((__half *)g.c2)[at] = __float2half_rn(mt__gelu(v));
    if (EPI == MT__EPI_GELU16 && !g.c2_f16) ((__nv_bfloat16 *)g.c2)[at] = __float2bfloat16_rn(mt__gelu(v));
    if (EPI == MT__EPI_GELU_GRAD) v *= mt__gelu_grad(((const float *)g.aux)[at]);
    if (EPI == MT__EPI_RESIDUAL) v = ((const float *)g.aux)[at] + v;   // (as mt_residual_forward: residual + out)
    if (EPI == MT__EPI_GELU_GRAD16 || EPI == MT__EPI_GELU_GRAD16_GELU16) {   // 16 bits in, 16 bits out (no accumulate)
        float x = g.c2_f16 ? __half2float(((const __half *)g.aux)[at]) : __bfloat162float(((const __nv_bfloat16 *)g.aux)[at]);
        if (g.c2_f16) ((__half *)g.c)[at] = __float2half_rn(v * mt__gelu_grad(x));
        else ((__nv_bfloat16 *)g.c)[at] = __float2bfloat16_rn(v * mt__gelu_grad(x));
        if (EPI == MT__EPI_GELU_GRAD16_GELU16 && g.c2_f16) ((__half *)g.c2)[at] = __float2half_rn(mt__gelu(x));
        if (EPI == MT__EPI_GELU_GRAD16_GELU16 && !g.c2_f16) ((__nv_bfloat16 *)g.c2)[at] = __float2bfloat16_rn(mt__gelu(x));
        return;
    }
    *c = g.accumulate ? *c + v : v;
}

// THE STAGED EPILOGUE (g.stage_ok). A consumer thread holds its outputs in wgmma's register
// layout: rows i0 and i0 + 8, columns j0 + 8n, j0 + 8n + 1. Stored from there, one warp's store
// instruction covers 8 rows x 16 bytes (16-bit C) or 32 bytes (fp32): 8 L1 wavefronts for 128 or
// 256 bytes, and a 128 x 256 tile of bf16 takes ~4,000 of them (~2 us, docs/perf.md) while the
// tensor cores wait. So each warp passes its 16 rows through a 4 KB piece of shared memory, 64
// columns (a "chunk") at a time: the fragments go in (8 rows at once, as they are held), then come
// out row by row, each lane 16 bytes, a warp's store covering 2-4 whole rows of 128-256 bytes (4
// wavefronts for 512 bytes). What the epilogue reads besides the sums (C when accumulating, the
// GELU's input for its derivative) comes in the same way, reversed.
// The piece's rows are RB bytes (256: 64 fp32; 128: 64 16-bit values); the 16-byte chunk c of row r
// sits at chunk c ^ (r % 8), so that both the 8-row fragment accesses and the row accesses spread
// over all 32 banks (the 128-byte swizzle again, done by hand).
template <int RB>
__device__ static inline int mt__stg_at(int r, int byte) {
    return r * RB + (((byte >> 4) ^ (r & 7)) << 4) + (byte & 15);
}
// rows i_base.. i_base+15, columns j_base.. j_base+63 of x (row stride ld) from the piece (the way in:
// mt__stg_fetch* and mt__stg_put* below, zeros outside M x N). N % 8 == 0 and 16-byte aligned rows: a
// 16-byte piece is all in or all out.
__device__ static inline void mt__stg_out32(const uint8_t *st, float *x, int ld, int i_base, int j_base, int M, int N,
                                            int lane) {
    #pragma unroll
    for (int it = 0; it < 8; it++) {   // lane: row 2 it + lane / 16, 16 bytes = 4 columns
        int r = 2 * it + lane / 16, ch = lane % 16, i = i_base + r, j = j_base + 4 * ch;
        float4 v = *(const float4 *)(st + mt__stg_at<256>(r, 16 * ch));
        if (i < M && j < N) *(float4 *)(x + (size_t)i * ld + j) = v;
    }
}
__device__ static inline void mt__stg_out16(const uint8_t *st, unsigned short *x, int ld, int i_base, int j_base, int M,
                                            int N, int lane) {
    #pragma unroll
    for (int it = 0; it < 4; it++) {   // lane: row 4 it + lane / 8, 16 bytes = 8 columns
        int r = 4 * it + lane / 8, ch = lane % 8, i = i_base + r, j = j_base + 8 * ch;
        uint4 v = *(const uint4 *)(st + mt__stg_at<128>(r, 16 * ch));
        if (i < M && j < N) *(uint4 *)(x + (size_t)i * ld + j) = v;
    }
}
// THE EPILOGUE'S READS A CHUNK AHEAD. What a chunk reads besides its sums (C when accumulating, the
// residual, the GELU's input) was loaded into the piece when the chunk began, so each of a tile's 4
// chunks waited a round trip to memory, with the tensor cores idle (the epilogues that read: session
// 39's per-layer table, perf.md). Now a lane loads the next chunk's 16-byte pieces into registers
// (mt__stg_fetch*; the first chunk's while the tile's last products run) and puts them into the piece
// when that chunk begins (mt__stg_put*), in the piece's layout: rows of 256 bytes (fp32) or 128 (16
// bits), the 16-byte chunk c of row r at c ^ (r % 8); fp32: lane -> row 2 it + lane / 16, 16 bytes = 4
// columns; 16 bits: row 4 it + lane / 8, 8 columns. Registers allow 4 pieces ahead (16 a thread: with
// 8, the consumers spilled 56-184 bytes at ptxas's 168): all of a 16-bit chunk, the first 8 rows of an
// fp32 one, whose other 8 rows load at the chunk's start as before.
typedef struct { uint4 v[4]; } mt__stg_ahead;
__device__ static inline void mt__stg_fetch32(mt__stg_ahead &a, const float *x, int ld, int i_base, int j_base, int M,
                                              int N, int lane) {
    #pragma unroll
    for (int it = 0; it < 4; it++) {
        int r = 2 * it + lane / 16, ch = lane % 16, i = i_base + r, j = j_base + 4 * ch;
        a.v[it] = i < M && j < N ? *(const uint4 *)(x + (size_t)i * ld + j) : make_uint4(0u, 0u, 0u, 0u);
    }
}
// the fetched rows (AHEAD = 1; 0: none were fetched), and the chunk's other rows from x (columns j_base ..)
template <int AHEAD>
__device__ static inline void mt__stg_put32(uint8_t *st, const mt__stg_ahead &a, const float *x, int ld, int i_base,
                                            int j_base, int M, int N, int lane) {
    #pragma unroll
    for (int it = 0; it < 8; it++) {
        int r = 2 * it + lane / 16, ch = lane % 16, i = i_base + r, j = j_base + 4 * ch;
        uint4 v = AHEAD && it < 4 ? a.v[it]
                  : i < M && j < N ? *(const uint4 *)(x + (size_t)i * ld + j) : make_uint4(0u, 0u, 0u, 0u);
        *(uint4 *)(st + mt__stg_at<256>(r, 16 * ch)) = v;
    }
}
__device__ static inline void mt__stg_fetch16(mt__stg_ahead &a, const unsigned short *x, int ld, int i_base, int j_base,
                                              int M, int N, int lane) {
    #pragma unroll
    for (int it = 0; it < 4; it++) {
        int r = 4 * it + lane / 8, ch = lane % 8, i = i_base + r, j = j_base + 8 * ch;
        a.v[it] = i < M && j < N ? *(const uint4 *)(x + (size_t)i * ld + j) : make_uint4(0u, 0u, 0u, 0u);
    }
}
__device__ static inline void mt__stg_put16(uint8_t *st, const mt__stg_ahead &a, int lane) {
    #pragma unroll
    for (int it = 0; it < 4; it++) {
        int r = 4 * it + lane / 8, ch = lane % 8;
        *(uint4 *)(st + mt__stg_at<128>(r, 16 * ch)) = a.v[it];
    }
}
// the reads fetched ahead (which EPI and g.accumulate make): 16 = the 16-bit GELU input, 32 = fp32 C
// (accumulating: the plain product only, the fused epilogues never accumulate) or the residual, 0 =
// none. (The fp32 GELU input of GELU_GRAD, a path training in 16 bits does not take, is read at the
// chunk's start as before: fetched ahead, it made ptxas spill.)
template <int EPI>
__device__ static inline int mt__wgmma_epilogue_reads(const mt__wgmma_args &g) {
    if (EPI == MT__EPI_GELU_GRAD16 || EPI == MT__EPI_GELU_GRAD16_GELU16) return 16;
    return EPI == MT__EPI_RESIDUAL || (EPI == MT__EPI_NONE && g.accumulate) ? 32 : 0;
}
// fetch chunk ch's reads (columns col0 + 64 ch ..) of the warp's 16 rows from i_base, if there are any
template <int EPI>
__device__ static inline void mt__wgmma_epilogue_fetch(const mt__wgmma_args &g, mt__stg_ahead &a, int ch, int i_base,
                                                       int col0, int lane) {
    int reads = mt__wgmma_epilogue_reads<EPI>(g), jb = col0 + 64 * ch;
    if (reads == 16) mt__stg_fetch16(a, (const unsigned short *)g.aux, g.ldc, i_base, jb, g.M, g.N, lane);
    else if (reads == 32)   // (the residual, or C)
        mt__stg_fetch32(a, EPI == MT__EPI_RESIDUAL ? (const float *)g.aux : g.c, g.ldc, i_base, jb, g.M, g.N, lane);
}
// the bias of one chunk's columns (64: n = 8 ch .. 8 ch + 7 of the thread's 32 column pairs, j = col0
// + 64 ch + 8 n + 2 (lane % 4), + 1), zeros without one. The caller loads the next chunk's while it
// works on this one: a load of global memory takes ~0.5-1 us, and issued at the chunk's start it
// held the whole warp there (Nsight Compute's stall sampling: 17% of the epilogue's samples)
__device__ static inline void mt__wgmma_bias_chunk(const mt__wgmma_args &g, float2 b[8], int col0, int ch, int lane) {
    #pragma unroll
    for (int n = 0; n < 8; n++) {
        int j = col0 + 64 * ch + 8 * n + 2 * (lane % 4);
        b[n] = g.bias && j < g.N ? *(const float2 *)(g.bias + j) : make_float2(0.0f, 0.0f);
    }
}
// one chunk (64 columns: n = 8 ch .. 8 ch + 7 of the thread's 32 column pairs) of a warp's 16 rows
// through the piece st, with its bias b (mt__wgmma_bias_chunk): the same values and roundings as the
// unstaged epilogue below, in the same order (v = sum + bias, then old + v or v gelu'(x))
// (ahead: this chunk's reads, fetched a chunk earlier; the next chunk's are fetched into it here)
template <int F16, int EPI>
__device__ static inline void mt__wgmma_epilogue_chunk(const mt__wgmma_args &g, const float *d, int ch, const float2 b[8],
                                                       uint8_t *st, int i_base, int col0, int lane, mt__stg_ahead &ahead) {
    int gq = lane / 4, tq = lane % 4, jb = col0 + 64 * ch;
    float2 v0[8], v1[8];   // row gq, row gq + 8 (of the warp's 16); columns jb + 8n + 2tq, + 1
    #pragma unroll
    for (int n = 0; n < 8; n++) {
        int e = 4 * (8 * ch + n);
        v0[n] = make_float2(d[e] + b[n].x, d[e + 1] + b[n].y);
        v1[n] = make_float2(d[e + 2] + b[n].x, d[e + 3] + b[n].y);
    }
    const bool remake = EPI == MT__EPI_GELU_GRAD16_GELU16;   // gelu(x) at c2 as well
    uint32_t gx0[remake ? 8 : 1], gx1[remake ? 8 : 1];      // (its 16-bit pairs, rows gq and gq + 8)
    const int next = ch < 3 && jb + 64 < g.N;   // a next chunk, whose reads go out now
    if (EPI == MT__EPI_GELU_GRAD16 || remake) {   // C = v gelu'(x), x the GELU's input in 16 bits
        mt__stg_put16(st, ahead, lane);
        if (next) mt__wgmma_epilogue_fetch<EPI>(g, ahead, ch + 1, i_base, col0, lane);
        __syncwarp();
        #pragma unroll
        for (int n = 0; n < 8; n++) {
            float2 x0 = mt__unpack16x2<F16>(*(const uint32_t *)(st + mt__stg_at<128>(gq, 16 * n + 4 * tq)));
            float2 x1 = mt__unpack16x2<F16>(*(const uint32_t *)(st + mt__stg_at<128>(gq + 8, 16 * n + 4 * tq)));
            v0[n] = make_float2(v0[n].x * mt__gelu_grad(x0.x), v0[n].y * mt__gelu_grad(x0.y));
            v1[n] = make_float2(v1[n].x * mt__gelu_grad(x1.x), v1[n].y * mt__gelu_grad(x1.y));
            if (remake) {
                gx0[n] = mt__pack16x2<F16>(mt__gelu(x0.x), mt__gelu(x0.y));
                gx1[n] = mt__pack16x2<F16>(mt__gelu(x1.x), mt__gelu(x1.y));
            }
        }
        __syncwarp();   // read before the piece is written again
    } else if (EPI == MT__EPI_GELU_GRAD || EPI == MT__EPI_RESIDUAL || g.accumulate) {   // C = v gelu'(x), or C = old + v
        // (old: C itself, or RESIDUAL's residual)
        // (fetched ahead: mt__wgmma_epilogue_reads)
        mt__stg_put32<EPI == MT__EPI_NONE || EPI == MT__EPI_RESIDUAL>(
            st, ahead, EPI == MT__EPI_GELU_GRAD || EPI == MT__EPI_RESIDUAL ? (const float *)g.aux : g.c, g.ldc, i_base, jb,
            g.M, g.N, lane);
        if (next) mt__wgmma_epilogue_fetch<EPI>(g, ahead, ch + 1, i_base, col0, lane);
        __syncwarp();
        #pragma unroll
        for (int n = 0; n < 8; n++) {
            float2 x0 = *(const float2 *)(st + mt__stg_at<256>(gq, 32 * n + 8 * tq));
            float2 x1 = *(const float2 *)(st + mt__stg_at<256>(gq + 8, 32 * n + 8 * tq));
            if (EPI == MT__EPI_GELU_GRAD) {
                v0[n] = make_float2(v0[n].x * mt__gelu_grad(x0.x), v0[n].y * mt__gelu_grad(x0.y));
                v1[n] = make_float2(v1[n].x * mt__gelu_grad(x1.x), v1[n].y * mt__gelu_grad(x1.y));
            } else {
                v0[n] = make_float2(x0.x + v0[n].x, x0.y + v0[n].y);
                v1[n] = make_float2(x1.x + v1[n].x, x1.y + v1[n].y);
            }
        }
        __syncwarp();
    }
    if (EPI == MT__EPI_STORE16 || EPI == MT__EPI_GELU_GRAD16 || EPI == MT__EPI_STORE16_GELU16 || remake) {   // C in 16 bits
        // (STORE16 at c2; the others at c); STORE16_GELU16: gelu of the rounded values at c2, from the piece's
        // second half; GELU_GRAD16_GELU16: gelu(x) at c2, the same way
        #pragma unroll
        for (int n = 0; n < 8; n++) {
            uint32_t f0 = mt__pack16x2<F16>(v0[n].x, v0[n].y), f1 = mt__pack16x2<F16>(v1[n].x, v1[n].y);
            *(uint32_t *)(st + mt__stg_at<128>(gq, 16 * n + 4 * tq)) = f0;
            *(uint32_t *)(st + mt__stg_at<128>(gq + 8, 16 * n + 4 * tq)) = f1;
            if (remake) {
                *(uint32_t *)(st + 2048 + mt__stg_at<128>(gq, 16 * n + 4 * tq)) = gx0[n];
                *(uint32_t *)(st + 2048 + mt__stg_at<128>(gq + 8, 16 * n + 4 * tq)) = gx1[n];
            }
            if (EPI == MT__EPI_STORE16_GELU16) {
                float2 r0 = mt__unpack16x2<F16>(f0), r1 = mt__unpack16x2<F16>(f1);
                *(uint32_t *)(st + 2048 + mt__stg_at<128>(gq, 16 * n + 4 * tq)) =
                    mt__pack16x2<F16>(mt__gelu(r0.x), mt__gelu(r0.y));
                *(uint32_t *)(st + 2048 + mt__stg_at<128>(gq + 8, 16 * n + 4 * tq)) =
                    mt__pack16x2<F16>(mt__gelu(r1.x), mt__gelu(r1.y));
            }
        }
        __syncwarp();
        mt__stg_out16(st, (unsigned short *)(EPI == MT__EPI_STORE16 ? g.c2 : (void *)g.c), g.ldc, i_base, jb, g.M, g.N,
                      lane);
        if (EPI == MT__EPI_STORE16_GELU16 || remake)
            mt__stg_out16(st + 2048, (unsigned short *)g.c2, g.ldc, i_base, jb, g.M, g.N, lane);
        __syncwarp();
    } else {   // C in fp32
        #pragma unroll
        for (int n = 0; n < 8; n++) {
            *(float2 *)(st + mt__stg_at<256>(gq, 32 * n + 8 * tq)) = v0[n];
            *(float2 *)(st + mt__stg_at<256>(gq + 8, 32 * n + 8 * tq)) = v1[n];
        }
        __syncwarp();
        mt__stg_out32(st, g.c, g.ldc, i_base, jb, g.M, g.N, lane);
        __syncwarp();
    }
    if (EPI == MT__EPI_GELU) {   // C2 = gelu(v), fp32
        #pragma unroll
        for (int n = 0; n < 8; n++) {
            *(float2 *)(st + mt__stg_at<256>(gq, 32 * n + 8 * tq)) = make_float2(mt__gelu(v0[n].x), mt__gelu(v0[n].y));
            *(float2 *)(st + mt__stg_at<256>(gq + 8, 32 * n + 8 * tq)) = make_float2(mt__gelu(v1[n].x), mt__gelu(v1[n].y));
        }
        __syncwarp();
        mt__stg_out32(st, (float *)g.c2, g.ldc, i_base, jb, g.M, g.N, lane);
        __syncwarp();
    }
    if (EPI == MT__EPI_GELU16) {   // C2 = gelu(v) in 16 bits
        #pragma unroll
        for (int n = 0; n < 8; n++) {
            *(uint32_t *)(st + mt__stg_at<128>(gq, 16 * n + 4 * tq)) = mt__pack16x2<F16>(mt__gelu(v0[n].x), mt__gelu(v0[n].y));
            *(uint32_t *)(st + mt__stg_at<128>(gq + 8, 16 * n + 4 * tq)) =
                mt__pack16x2<F16>(mt__gelu(v1[n].x), mt__gelu(v1[n].y));
        }
        __syncwarp();
        mt__stg_out16(st, (unsigned short *)g.c2, g.ldc, i_base, jb, g.M, g.N, lane);
        __syncwarp();
    }
}

// THE PING-PONG SCHEDULE (PING = 1; opt-in, MT_WGMMA_PINGPONG=1: correct, and measured no faster,
// see the end of this comment and docs/perf.md). With the 128 x 256 tile both consumer warpgroups
// finish a tile's k-steps together and then both run the epilogue, while the tensor cores have
// nothing to do: at K = 768 (12 k-steps) the epilogue takes ~45% of the fc forward's time (the
// GELU, the rounding, the staging), issue- and latency-bound, not memory-bound (Nsight Compute:
// 0.35 instructions a cycle per scheduler, DRAM 22% busy). Ping-pong gives each consumer warpgroup
// a tile of its own, the block's pieces dealt out in turn (piece n to warpgroup n % 2): while one
// warpgroup's epilogue runs, the other's products keep the tensor cores busy (CUTLASS's
// "ping-pong" kernel).
//   Each warpgroup's tile is 64 x 256 (the same m64n256k16 product and register layout as before,
// so the epilogue code is the same). Alone, that would read B's 256 x 64 stage from L2 for 64 rows
// instead of 128, 1.4 times the operand traffic, and measured so it gained nothing (the k-loop
// then waits on L2). So the blocks work in CLUSTER PAIRS (a thread block cluster of 2, on two
// SMs of one GPC): both blocks of a pair take the same 128 x 256 unit of the plan, rank r its rows
// 64 r .. 64 r + 63, and each block's producer loads its own 64 rows of A plus HALF of B (rows 128 r
// .. 128 r + 127 of the 256) multicast into both blocks' rings (one L2 read, two copies): per block
// and k-step 8 + 16 KB from L2, the cooperative tile's traffic per output again. Consequences:
//   - full[s] still expects a whole stage (8 + 32 KB): its own A, its own half of B, the partner's
//     half (whose bytes may land before this block's producer has announced the phase: the
//     transaction count simply goes below zero until it does);
//   - a stage may only be refilled when the readers in BOTH blocks are done with it (the refill
//     writes into both): empty[s] counts 8 arrivals, the 4 warps of the warpgroup that read it in
//     this block and in the partner (each arrives on both blocks' barriers, the partner's through
//     its cluster address, mapa);
//   - the pair starts only when both blocks' barriers exist and ends only when no arrival from the
//     partner is still on its way (a cluster barrier, every thread, at both ends).
//   Both blocks deal their pieces to warpgroups the same way, so the same warpgroup reads stage s in
// both. One rule keeps the ring's mbarrier parities right: a warpgroup may only start waiting for
// its piece's stages once the other warpgroup has waited for all of the previous piece's (a wait on
// a phase two rounds ahead would read the parity of an older round as done). So after its last wait
// of piece n the warpgroup signals named barrier 1 + n % 2 (bar.arrive; 256 = both warpgroups'
// threads) and the other one waits on it (bar.sync) before piece n + 1: arrivals and waits pair up
// one to one (none after the block's last piece).
//   MEASURED: the fc forward 197 -> 195 us, the LM head's forward slower. One warp a scheduler runs
// a 64 x 256 epilogue with nothing to hide its latencies, and that takes longer than the other
// warpgroup's k-loop, so a warpgroup's period stays k-loop + epilogue. Kept, tested bit for bit
// against the cooperative tile (test_kernels' wgmma_pingpong), for a shorter epilogue to pay off on.
//
// F16: 0 = bf16 operands (--bf16), 1 = fp16 (--fp16). EPI: the epilogue (MT__EPI_*), compiled in
// only where asked: with the GELU's code in every GEMM's epilogue behind a runtime switch, the
// plain GEMMs ran 37% slower (docs/perf.md)
// NWG: consumer warpgroups, 2 (the 128 x 256 tile) or 3 (192 x 192: see TWO TILE SHAPES)
// PING: 1 = the ping-pong schedule above (NWG = 2, the 128 x 256 plan, launched in clusters of 2)
template <int A_K_INNER, int B_K_INNER, int F16, int EPI, int NWG, int PING = 0>
__global__ void __launch_bounds__(mt__wg_threads(NWG), 1)
    mt_matmul_kernel4_wgmma(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                            mt__wgmma_args g) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)   // sm_90a only: wgmma and setmaxnreg exist nowhere else
    static_assert(!PING || NWG == 2, "ping-pong runs two consumer warpgroups");
    // BM: the rows of A a block loads a k-step (ping-pong: its half of the unit's 128)
    const int BM = PING ? 64 : mt__wg_bm(NWG), BN = mt__wg_bn(NWG), A_BYTES = BM * MT__WG_BK * 2,
              B_BYTES = BN * MT__WG_BK * 2;
    const uint32_t rank = PING ? mt__cluster_rank() : 0;   // ping-pong: which block of the pair
    extern __shared__ uint8_t mt__wg_smem_raw[];
    // the ring, 1024-byte aligned (the 128-byte swizzle repeats every 1024 bytes)
    uint32_t base = (mt__smem_u32(mt__wg_smem_raw) + 1023) & ~1023u;
    const uint32_t ring_a = base;                                           // stage s: ring_a + s * A_BYTES
    const uint32_t ring_b = base + MT__WG_STAGES * A_BYTES;                 // stage s: ring_b + s * B_BYTES
    const uint32_t bars = ring_b + MT__WG_STAGES * B_BYTES;                 // full[s] at bars + 8s
    const uint32_t full0 = bars, empty0 = bars + 8 * MT__WG_STAGES;         // empty[s] at empty0 + 8s
    // the epilogue's staging pieces (8 x 4 KB, one per consumer warp; NWG = 2 only), after the mbarriers
    uint8_t *staging = mt__wg_smem_raw + (base - mt__smem_u32(mt__wg_smem_raw)) + MT__WG_STAGES * MT__WG_STAGE_BYTES + 128;

    if (threadIdx.x == 0) {
        for (int s = 0; s < MT__WG_STAGES; s++) {
            mt__mbar_init(full0 + 8 * s, 1);          // the producer's arrive (+ the TMA's bytes)
            // lane 0 of each warp that reads the stage (ping-pong: one warpgroup, in both blocks of the pair)
            mt__mbar_init(empty0 + 8 * s, PING ? 8 : 4 * NWG);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");   // visible to the TMA unit
    }
    __syncthreads();
    if (PING) mt__cluster_sync();   // the partner's barriers exist before anything arrives on them
    // inside a training chunk's graph the GEMM is launched behind the kernel ahead with programmatic
    // dependent launch (section 1): the barriers above were set up meanwhile; nothing global is
    // touched before this wait
    mt__pdl_start();

    if (threadIdx.x < 128) {
        // ---------------- producer warpgroup: one thread feeds the ring ----------------
        mt__setmaxnreg_dec<40>();
        if (threadIdx.x == 0) {
            mt__tma_prefetch_map(&map_a);
            mt__tma_prefetch_map(&map_b);
            int it = 0;
            mt__wgmma_cursor cur;
            mt__wgmma_piece pc;
            mt__wgmma_begin(g, &cur, PING);
            while (mt__wgmma_next(g, &cur, &pc)) {
                int row0, col0;
                mt__wgmma_tile_origin(g, pc.tile, &row0, &col0);
                row0 += BM * rank;   // ping-pong: this block's half of the unit's rows
                for (int t = 0; t < pc.steps; t++, it++) {
                    int s = it % MT__WG_STAGES, round = it / MT__WG_STAGES;
                    if (round > 0) mt__mbar_wait(empty0 + 8 * s, (round - 1) & 1);   // consumers done with s
                    uint32_t full = full0 + 8 * s, a = ring_a + s * A_BYTES, b = ring_b + s * B_BYTES;
                    mt__mbar_arrive_expect_tx(full, A_BYTES + B_BYTES);
                    int k0 = pc.k_begin + t * MT__WG_BK;
                    if (A_K_INNER) mt__tma_load_2d(a, &map_a, k0, row0, full);   // box {64 k, BM rows}
                    else
                        for (int h = 0; h < BM / 64; h++) mt__tma_load_2d(a + h * 8192, &map_a, row0 + 64 * h, k0, full);
                    if (PING) {   // half of B, into both blocks: box {64 k, 128 rows}, or two boxes {64 rows, 64 k}
                        if (B_K_INNER) mt__tma_load_2d_multicast(b + rank * 16384, &map_b, k0, col0 + 128 * rank, full, 3);
                        else
                            for (int h = 2 * rank; h < 2 * rank + 2; h++)
                                mt__tma_load_2d_multicast(b + h * 8192, &map_b, col0 + 64 * h, k0, full, 3);
                    } else if (B_K_INNER) mt__tma_load_2d(b, &map_b, k0, col0, full);   // box {64 k, BN rows}
                    else
                        for (int h = 0; h < BN / 64; h++) mt__tma_load_2d(b + h * 8192, &map_b, col0 + 64 * h, k0, full);
                }
            }
        }
        if (PING) mt__cluster_sync();   // (every thread of the pair meets once more at the end)
        return;
    }

    // ---------------- consumer warpgroups 1 .. NWG: the tensor cores, then C ----------------
    // (registers: 65,536 an SM; 128 producer threads keep 40: 2 x 128 consumers may take 232, 3 x 128 152)
    mt__setmaxnreg_inc<NWG == 2 ? 232 : 152>();
    const int wg = threadIdx.x / 128 - 1;            // which consumer warpgroup
    const int half = PING ? rank : wg;               // which 64-row half of the unit's tile it computes
    const int lt = threadIdx.x % 128, warp = lt / 32, lane = threadIdx.x % 32;
    // a stage has been read: lane 0 of each warp says so (ping-pong: to both blocks of the pair)
    auto release = [&](int stage) {
        if (lane != 0) return;
        if (PING) {
            mt__mbar_arrive_cluster(empty0 + 8 * stage, 0);
            mt__mbar_arrive_cluster(empty0 + 8 * stage, 1);
        } else mt__mbar_arrive(empty0 + 8 * stage);
    };
    int it = 0;
    mt__wgmma_cursor cur;
    mt__wgmma_piece pc;
    mt__wgmma_begin(g, &cur, PING);
    for (int piece = 0; mt__wgmma_next(g, &cur, &pc); piece++) {
        if (PING && piece % 2 != wg) {   // the other warpgroup's piece: its stages go by
            it += pc.steps;
            continue;
        }
        // ping-pong: the previous piece's warpgroup has waited for all its stages (see THE PING-PONG SCHEDULE)
        if (PING && piece > 0) asm volatile("bar.sync %0, 256;\n" ::"r"(1 + (piece - 1) % 2) : "memory");
        int row0, col0, steps = pc.steps;
        mt__wgmma_tile_origin(g, pc.tile, &row0, &col0);
        float d[BN / 2];
        #pragma unroll
        for (int r = 0; r < BN / 2; r++) d[r] = 0.0f;
        for (int t = 0; t < steps; t++, it++) {
            int s = it % MT__WG_STAGES;
            mt__mbar_wait(full0 + 8 * s, (it / MT__WG_STAGES) & 1);   // the TMA has landed stage s
            uint32_t a = ring_a + s * A_BYTES + (PING ? 0 : wg) * 8192, b = ring_b + s * B_BYTES;
            mt__wgmma_fence();
            #pragma unroll
            for (int kk = 0; kk < MT__WG_BK / 16; kk++) {
                uint64_t da = A_K_INNER ? mt__wgmma_desc(a + 32 * kk, 16, 1024) : mt__wgmma_desc(a + 2048 * kk, 8192, 1024);
                uint64_t db = B_K_INNER ? mt__wgmma_desc(b + 32 * kk, 16, 1024) : mt__wgmma_desc(b + 2048 * kk, 8192, 1024);
                if (NWG == 3) mt__wgmma_m64n192k16<F16, A_K_INNER ? 0 : 1, B_K_INNER ? 0 : 1>(d, da, db);
                else mt__wgmma_m64n256k16<F16, A_K_INNER ? 0 : 1, B_K_INNER ? 0 : 1>(d, da, db);
            }
            mt__wgmma_commit();
            mt__wgmma_wait<1>();   // the previous stage's group is finished: give that stage back
            if (t > 0) release((it - 1) % MT__WG_STAGES);
        }
        if (PING) {   // this piece's waits are done: the other warpgroup may start on the next piece, if any
            mt__wgmma_cursor peek = cur;
            mt__wgmma_piece next;
            if (mt__wgmma_next(g, &peek, &next)) asm volatile("bar.arrive %0, 256;\n" ::"r"(1 + piece % 2) : "memory");
        }
        float2 bias_next[8] = {};   // the staged epilogue's first chunk of bias, on its way while the last products finish
        mt__stg_ahead ahead;        // and its first chunk's reads (THE EPILOGUE'S READS A CHUNK AHEAD)
        if (NWG == 2 && g.stage_ok && pc.slot < 0) {
            mt__wgmma_bias_chunk(g, bias_next, col0, 0, lane);
            mt__wgmma_epilogue_fetch<EPI>(g, ahead, 0, row0 + 64 * half + 16 * warp, col0, lane);
        }
        mt__wgmma_wait<0>();
        if (steps > 0) release((it - 1) % MT__WG_STAGES);
        #pragma unroll
        for (int r = 0; r < BN / 2; r++) mt__reg_fence(d[r]);

        if (pc.slot >= 0) {   // a partial: to its scratch slot, float4 q of all 128 threads side by side
            float4 *mine = (float4 *)g.workspace + ((size_t)pc.slot * (mt__wg_bm(NWG) / 64) + half) * (BN / 8 * 128);
            #pragma unroll
            for (int q = 0; q < BN / 8; q++) __stcg(mine + q * 128 + lt, make_float4(d[4 * q], d[4 * q + 1], d[4 * q + 2], d[4 * q + 3]));
            continue;
        }
        // epilogue: registers -> C. This thread holds rows i0 and i0 + 8, columns j0 + 8n and
        // j0 + 8n + 1 (n = 0..31). C and bias might alias for all the compiler knows, so it would
        // not move a load of C above a store to C: each read-modify-write would wait a full memory
        // round trip. Instead the loads of 8 column pairs x 2 rows are issued together, then the
        // stores: 4 round trips per tile instead of 64.
        if (NWG == 2 && g.stage_ok) {   // through shared memory (above), 64 columns at a time
            uint8_t *st = staging + (wg * 4 + warp) * MT__WG_STAGE_PIECE;
            #pragma unroll
            for (int ch = 0; ch < 4; ch++) {
                float2 b[8];   // this chunk's bias (loaded during the last one, or the k-loop's end)
                #pragma unroll
                for (int n = 0; n < 8; n++) b[n] = bias_next[n];
                if (ch < 3) mt__wgmma_bias_chunk(g, bias_next, col0, ch + 1, lane);
                if (col0 + 64 * ch < g.N)
                    mt__wgmma_epilogue_chunk<F16, EPI>(g, d, ch, b, st, row0 + 64 * half + 16 * warp, col0, lane, ahead);
            }
            continue;
        }
        int i0 = row0 + 64 * half + 16 * warp + lane / 4, j0 = col0 + 2 * (lane % 4);
        // column pairs handled together: 8 (48 registers of loads in flight); 4 where three consumer
        // warpgroups leave 152 registers a thread
        const int GROUP = NWG == 2 ? 8 : 4;
        if (g.store2_ok) {   // c 8-byte aligned, ldc and N even: float2 loads and stores
            float *c0 = g.c + (size_t)i0 * g.ldc, *c1 = c0 + (size_t)8 * g.ldc;
            int in0 = i0 < g.M, in1 = i0 + 8 < g.M;
            #pragma unroll
            for (int n0 = 0; n0 < BN / 8; n0 += GROUP) {
                // old: what each output reads besides the sum: C itself (accumulate) or the GELU's
                // input (the GELU_GRAD epilogue, never with accumulate), loaded together as well
                const float *r0 = EPI == MT__EPI_GELU_GRAD || EPI == MT__EPI_RESIDUAL ?
                                      (const float *)g.aux + (size_t)i0 * g.ldc : c0;   // (RESIDUAL: the residual)
                const float *r1 = r0 + (size_t)8 * g.ldc;
                // (GELU_GRAD16: the GELU's input as pairs of 16-bit values, widened)
                const uint32_t *h0 = (const uint32_t *)((const unsigned short *)g.aux + (size_t)i0 * g.ldc);
                const uint32_t *h1 = (const uint32_t *)((const unsigned short *)g.aux + (size_t)(i0 + 8) * g.ldc);
                int reads = g.accumulate || EPI == MT__EPI_GELU_GRAD || EPI == MT__EPI_RESIDUAL;
                float2 old0[GROUP], old1[GROUP], bias[GROUP];
                #pragma unroll
                for (int n = 0; n < GROUP; n++) {
                    int j = j0 + 8 * (n0 + n), in_n = j < g.N;
                    float2 zero = make_float2(0.0f, 0.0f);
                    bias[n] = g.bias && in_n ? *(const float2 *)(g.bias + j) : zero;
                    if (EPI == MT__EPI_GELU_GRAD16 || EPI == MT__EPI_GELU_GRAD16_GELU16) {
                        old0[n] = in_n && in0 ? mt__unpack16x2<F16>(h0[j / 2]) : zero;
                        old1[n] = in_n && in1 ? mt__unpack16x2<F16>(h1[j / 2]) : zero;
                        continue;
                    }
                    old0[n] = reads && in_n && in0 ? *(const float2 *)(r0 + j) : zero;
                    old1[n] = reads && in_n && in1 ? *(const float2 *)(r1 + j) : zero;
                }
                #pragma unroll
                for (int n = 0; n < GROUP; n++) {   // as mt__gemm_store: C = old + (sum + bias)
                    int j = j0 + 8 * (n0 + n), e = 4 * (n0 + n);
                    if (j >= g.N) continue;
                    float2 v0 = make_float2(d[e] + bias[n].x, d[e + 1] + bias[n].y);
                    float2 v1 = make_float2(d[e + 2] + bias[n].x, d[e + 3] + bias[n].y);
                    if (EPI == MT__EPI_GELU_GRAD || EPI == MT__EPI_GELU_GRAD16 || EPI == MT__EPI_GELU_GRAD16_GELU16) {
                        v0 = make_float2(v0.x * mt__gelu_grad(old0[n].x), v0.y * mt__gelu_grad(old0[n].y));   // C = v gelu'(x)
                        v1 = make_float2(v1.x * mt__gelu_grad(old1[n].x), v1.y * mt__gelu_grad(old1[n].y));
                    } else if (g.accumulate || EPI == MT__EPI_RESIDUAL) {
                        v0 = make_float2(old0[n].x + v0.x, old0[n].y + v0.y);
                        v1 = make_float2(old1[n].x + v1.x, old1[n].y + v1.y);
                    }
                    if (EPI == MT__EPI_STORE16 || EPI == MT__EPI_GELU_GRAD16 || EPI == MT__EPI_GELU_GRAD16_GELU16) {
                        // C in 16 bits, two in one 4-byte store (STORE16 at c2; GELU_GRAD16 at c, which
                        // holds 16-bit values then; GELU_GRAD16_GELU16 also gelu(x) at c2)
                        unsigned short *q0 = (unsigned short *)(EPI == MT__EPI_STORE16 ? g.c2 : (void *)g.c) +
                                             (size_t)i0 * g.ldc + j;
                        unsigned short *q1 = q0 + (size_t)8 * g.ldc;
                        if (in0) *(uint32_t *)q0 = mt__pack16x2<F16>(v0.x, v0.y);
                        if (in1) *(uint32_t *)q1 = mt__pack16x2<F16>(v1.x, v1.y);
                        if (EPI == MT__EPI_GELU_GRAD16_GELU16) {
                            unsigned short *p0 = (unsigned short *)g.c2 + (size_t)i0 * g.ldc + j, *p1 = p0 + (size_t)8 * g.ldc;
                            if (in0) *(uint32_t *)p0 = mt__pack16x2<F16>(mt__gelu(old0[n].x), mt__gelu(old0[n].y));
                            if (in1) *(uint32_t *)p1 = mt__pack16x2<F16>(mt__gelu(old1[n].x), mt__gelu(old1[n].y));
                        }
                        continue;
                    }
                    if (EPI == MT__EPI_STORE16_GELU16) {   // C in 16 bits at c, gelu of those values at c2
                        unsigned short *p0 = (unsigned short *)g.c + (size_t)i0 * g.ldc + j, *p1 = p0 + (size_t)8 * g.ldc;
                        unsigned short *q0 = (unsigned short *)g.c2 + (size_t)i0 * g.ldc + j, *q1 = q0 + (size_t)8 * g.ldc;
                        uint32_t f0 = mt__pack16x2<F16>(v0.x, v0.y), f1 = mt__pack16x2<F16>(v1.x, v1.y);
                        float2 r0 = mt__unpack16x2<F16>(f0), r1 = mt__unpack16x2<F16>(f1);
                        if (in0) {
                            *(uint32_t *)p0 = f0;
                            *(uint32_t *)q0 = mt__pack16x2<F16>(mt__gelu(r0.x), mt__gelu(r0.y));
                        }
                        if (in1) {
                            *(uint32_t *)p1 = f1;
                            *(uint32_t *)q1 = mt__pack16x2<F16>(mt__gelu(r1.x), mt__gelu(r1.y));
                        }
                        continue;
                    }
                    if (in0) *(float2 *)(c0 + j) = v0;
                    if (in1) *(float2 *)(c1 + j) = v1;
                    if (EPI == MT__EPI_GELU) {   // C2 = gelu(v)
                        float *q0 = (float *)g.c2 + (size_t)i0 * g.ldc + j, *q1 = q0 + (size_t)8 * g.ldc;
                        if (in0) *(float2 *)q0 = make_float2(mt__gelu(v0.x), mt__gelu(v0.y));
                        if (in1) *(float2 *)q1 = make_float2(mt__gelu(v1.x), mt__gelu(v1.y));
                    }
                    if (EPI == MT__EPI_GELU16) {   // C2 = gelu(v) in 16 bits: two in one 4-byte store
                        unsigned short *q0 = (unsigned short *)g.c2 + (size_t)i0 * g.ldc + j;
                        unsigned short *q1 = q0 + (size_t)8 * g.ldc;
                        if (in0) *(uint32_t *)q0 = mt__pack16x2<F16>(mt__gelu(v0.x), mt__gelu(v0.y));
                        if (in1) *(uint32_t *)q1 = mt__pack16x2<F16>(mt__gelu(v1.x), mt__gelu(v1.y));
                    }
                }
            }
        } else {             // any alignment, N odd: one output at a time (slow, correct)
            #pragma unroll
            for (int n = 0; n < BN / 8; n++) {
                mt__wgmma_store1<EPI>(g, i0, j0 + 8 * n, d[4 * n]);
                mt__wgmma_store1<EPI>(g, i0, j0 + 8 * n + 1, d[4 * n + 1]);
                mt__wgmma_store1<EPI>(g, i0 + 8, j0 + 8 * n, d[4 * n + 2]);
                mt__wgmma_store1<EPI>(g, i0 + 8, j0 + 8 * n + 1, d[4 * n + 3]);
            }
        }
    }
    if (PING) mt__cluster_sync();   // the partner's last arrivals on this block's barriers have landed
#endif
}

// split-K / stream-K, second pass: one thread per float4 of a partial (tile t, half wg, register
// group q, thread lt of the consumer warpgroup). It adds the tile's partials in k order (split-K:
// slices z = 0, 1, ...; stream-K: workers w = first, ..., last that touched tile t), then writes
// the four outputs it holds (the wgmma register layout above) with bias / accumulation.
__global__ void mt_matmul_kernel4_splitk_reduce(mt__wgmma_args g) {
    mt__pdl_start();   // (launched with programmatic dependent launch inside a chunk's graph)
    size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int per_tile = g.bm * g.bn / 4, groups = g.bn / 8;   // float4s a tile; float4 groups a thread
    if (e >= (size_t)g.tiles_m * g.tiles_n * per_tile) return;
    int lt = (int)(e % 128), q = (int)(e / 128 % groups), wg = (int)(e / (128 * groups) % (g.bm / 64)),
        t = (int)(e / per_tile);
    const float4 *base = (const float4 *)g.workspace + wg * (groups * 128) + q * 128 + lt;   // + slot * per_tile
    int row0, col0;
    mt__wgmma_tile_origin(g, t, &row0, &col0);
    int i = row0 + 64 * wg + 16 * (lt / 32) + (lt % 32) / 4, j = col0 + 8 * q + 2 * (lt % 4);
    // the weight gradients' path (below): C's old values loaded first, in flight with the partials
    // (they do not depend on them: one round trip to memory a thread instead of two)
    int plain2 = g.store2_ok && g.epilogue == MT__EPI_NONE;
    float2 zero = make_float2(0.0f, 0.0f), old0 = zero, old1 = zero;
    float *c0 = g.c + (size_t)i * g.ldc + j, *c1 = c0 + (size_t)8 * g.ldc;
    int in0 = i < g.M, in1 = i + 8 < g.M;
    if (plain2 && j < g.N && g.accumulate) {
        if (in0) old0 = *(const float2 *)c0;
        if (in1) old1 = *(const float2 *)c1;
    }
    float4 s = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (!g.sk_workers) {
#pragma unroll 4   // four partials in flight, added in z order
        for (int z = 0; z < g.splits; z++) {
            float4 v = __ldcs(base + ((size_t)t * g.splits + z) * per_tile);   // streaming: read once
            s.x += v.x; s.y += v.y; s.z += v.z; s.w += v.w;
        }
    } else {   // the workers whose ranges hold k-steps x0 and x1 (the tile's first and last), and between
        long long x0 = (long long)t * g.steps_tile, x1 = x0 + g.steps_tile - 1;
        int w0 = (int)(((x0 + 1) * g.sk_workers - 1) / g.sk_total), w1 = (int)(((x1 + 1) * g.sk_workers - 1) / g.sk_total);
        for (int w = w0; w <= w1; w++) {
            long long start = mt__sk_start(g, w);
            if (start == mt__sk_start(g, w + 1)) continue;   // an empty range: no piece
            float4 v = __ldcs(base + ((size_t)w * g.sk_slots + (t - (int)(start / g.steps_tile))) * per_tile);
            s.x += v.x; s.y += v.y; s.z += v.z; s.w += v.w;
        }
    }
    float v[4] = {s.x, s.y, s.z, s.w};
    if (plain2) {   // the weight-gradients: float2 pairs (j, j+1) of rows i and i+8, both read (above)
        if (j >= g.N) return;   // before either write
        float2 b = g.bias ? *(const float2 *)(g.bias + j) : zero;
        float2 v0 = make_float2(v[0] + b.x, v[1] + b.y), v1 = make_float2(v[2] + b.x, v[3] + b.y);   // as store1:
        if (in0) *(float2 *)c0 = g.accumulate ? make_float2(old0.x + v0.x, old0.y + v0.y) : v0;   // old + (v + bias)
        if (in1) *(float2 *)c1 = g.accumulate ? make_float2(old1.x + v1.x, old1.y + v1.y) : v1;
        return;
    }
    for (int e = 0; e < 4; e++) {   // the epilogue as the GEMM kernel would apply it
        int ie = i + 8 * (e / 2), je = j + e % 2;
        if (g.epilogue == MT__EPI_GELU) mt__wgmma_store1<MT__EPI_GELU>(g, ie, je, v[e]);
        else if (g.epilogue == MT__EPI_GELU16) mt__wgmma_store1<MT__EPI_GELU16>(g, ie, je, v[e]);
        else if (g.epilogue == MT__EPI_STORE16) mt__wgmma_store1<MT__EPI_STORE16>(g, ie, je, v[e]);
        else if (g.epilogue == MT__EPI_GELU_GRAD) mt__wgmma_store1<MT__EPI_GELU_GRAD>(g, ie, je, v[e]);
        else if (g.epilogue == MT__EPI_STORE16_GELU16) mt__wgmma_store1<MT__EPI_STORE16_GELU16>(g, ie, je, v[e]);
        else if (g.epilogue == MT__EPI_GELU_GRAD16) mt__wgmma_store1<MT__EPI_GELU_GRAD16>(g, ie, je, v[e]);
        else if (g.epilogue == MT__EPI_GELU_GRAD16_GELU16) mt__wgmma_store1<MT__EPI_GELU_GRAD16_GELU16>(g, ie, je, v[e]);
        else if (g.epilogue == MT__EPI_RESIDUAL) mt__wgmma_store1<MT__EPI_RESIDUAL>(g, ie, je, v[e]);
        else mt__wgmma_store1<MT__EPI_NONE>(g, ie, je, v[e]);
    }
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
// NULL if this GPU can run the wgmma rung from this binary, else why not (a message with a hint)
static const char *mt__wgmma_unsupported(void) {
    int dev, major, minor;
    MT_CUDA_CHECK(cudaGetDevice(&dev));
    MT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    MT_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    if (major != 9 || minor != 0)
        return "--gemm wgmma needs a Hopper GPU (compute capability 9.0)\nhint: --gemm mma";
    cudaFuncAttributes fa;
    cudaError_t err = cudaFuncGetAttributes(&fa, mt__wgmma_probe_kernel);
    if (err != cudaSuccess || fa.sharedSizeBytes != 64 * sizeof(int)) {
        (void)cudaGetLastError();
        return "--gemm wgmma: this binary has no sm_90a code (wgmma exists only there)\n"
               "hint: build with -gencode=arch=compute_90a,code=sm_90a (make does on an H100/H200), or use --gemm mma";
    }
    return NULL;
}
static void mt__wgmma_check_supported(void) {
    const char *why = mt__wgmma_unsupported();
    if (why) mt_fatal("%s", why);
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
// the tensor map of one bf16 (f16: fp16) operand X (rows x K): k inner -> dims {K, rows}, box {64, box_rows};
// k outer -> dims {rows, K}, box {64, 64}. 128-byte swizzle, out-of-bounds elements read as zero.
static CUtensorMap mt__wgmma_map(const void *x, int f16, int rows, int K, int ld, int k_inner, int box_rows) {
    static PFN_cuTensorMapEncodeTiled_v12000 encode = mt__wgmma_lookup_encode();
    CUtensorMap map;
    cuuint64_t dims[2] = {(cuuint64_t)(k_inner ? K : rows), (cuuint64_t)(k_inner ? rows : K)};
    cuuint64_t strides[1] = {(cuuint64_t)ld * sizeof(__nv_bfloat16)};   // bytes from one dims[1] step to the next
    cuuint32_t box[2] = {64, (cuuint32_t)(k_inner ? box_rows : 64)};
    cuuint32_t elem_strides[2] = {1, 1};
    CUresult r = encode(&map, f16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, (void *)x, dims, strides, box, elem_strides,
                        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) mt_fatal("cuTensorMapEncodeTiled failed (error %d) for a %d x %d operand, ld %d", (int)r, rows, K, ld);
    return map;
}
// THE PLAN for a GEMM (one block per tile, or split-K in S slices, or stream-K) is
// mt_wgmma_plan_make's, megatron.h section 3: its cost model is explained there, and the memory
// plan counts the partial tiles of the same plan.
// grid: the blocks (the plan's units, at most one an SM). PING: in clusters of 2, both blocks of a
// pair on the same unit: 2 x min(units, the pairs that fit at once), asked of the runtime once (an
// H200's 132 SMs make 66 pairs where every GPC has an even number of them)
template <int A_K_INNER, int B_K_INNER, int F16, int EPI, int NWG = 2, int PING = 0>
static void mt__gemm_wgmma_launch(const CUtensorMap &map_a, const CUtensorMap &map_b, const mt__wgmma_args &g, int grid,
                                  cudaStream_t stream) {
    auto kernel = mt_matmul_kernel4_wgmma<A_K_INNER, B_K_INNER, F16, EPI, NWG, PING>;
    MT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, mt__wg_smem(NWG)));
    if (!PING) {
        mt__launch("mt_matmul_kernel4_wgmma", kernel, grid, mt__wg_threads(NWG), mt__wg_smem(NWG), stream, map_a, map_b,
                   g);
        return;
    }
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[2];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = 2;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;   // as mt__launch
    attr[1].val.programmaticStreamSerializationAllowed = 1;
    cfg.blockDim = dim3(mt__wg_threads(NWG));
    cfg.dynamicSmemBytes = mt__wg_smem(NWG);
    cfg.stream = stream;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    static int pairs = 0;   // (per instantiation)
    if (pairs == 0) {
        cfg.gridDim = dim3(2 * MT__WG_SMS);
        MT_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&pairs, kernel, &cfg));
        if (pairs < 1) mt_fatal("--gemm wgmma: no cluster of 2 blocks fits on this GPU (the ping-pong GEMM)\n"
                                "hint: MT_WGMMA_PINGPONG=0");
    }
    cfg.gridDim = dim3(2 * (grid < pairs ? grid : pairs));
    cfg.numAttrs = mt__pdl_on ? 2 : 1;
    MT_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, map_a, map_b, g));
    mt__launch_check("mt_matmul_kernel4_wgmma", stream);
}
// the ping-pong schedule is built for training's bf16 forward and input-gradient GEMMs only, on the
// 128 x 256 tile's plan: the forward's layout (both k inner) plain, with the 16-bit store (qkv) or
// the GELU (fc); the input gradient's (A k inner, B k outer) plain, with the 16-bit store (datty) or
// the GELU's derivative (fc-proj's dinp). mt__wgmma_pingpong_built says which (the dispatch in
// mt__gemm_wgmma_launch_layout below lists the same six); elsewhere the two warpgroups share each tile.
static int mt__wgmma_pingpong_built(int f16, int a_k_inner, int b_k_inner, int op) {
    if (f16 || !a_k_inner) return 0;
    if (b_k_inner) return op == MT__EPI_NONE || op == MT__EPI_STORE16 || op == MT__EPI_STORE16_GELU16;
    return op == MT__EPI_NONE || op == MT__EPI_STORE16 || op == MT__EPI_GELU_GRAD16;
}
// the plain GEMM in its four operand layouts; the fused epilogues only where they are used: the
// GELU after the fc forward (both k inner), its derivative after fc-proj's dinp (A k inner, B k outer),
// the 16-bit store after the qkv forward (both k inner) and the attention projection's dinp (A k
// inner, B k outer), the residual add after the two projections' forwards (both k inner)
template <int F16>
static void mt__gemm_wgmma_launch_layout(const CUtensorMap &map_a, const CUtensorMap &map_b, const mt__wgmma_args &g,
                                         int grid, int a_k_inner, int b_k_inner, int ping, cudaStream_t stream) {
    if (ping) {   // the ping-pong schedule (mt__wgmma_pingpong_built has said yes)
        if (F16 || !a_k_inner) mt_fatal("internal: no ping-pong GEMM for this layout");
        if (b_k_inner && g.epilogue == MT__EPI_NONE) mt__gemm_wgmma_launch<1, 1, 0, MT__EPI_NONE, 2, 1>(map_a, map_b, g, grid, stream);
        else if (b_k_inner && g.epilogue == MT__EPI_STORE16)
            mt__gemm_wgmma_launch<1, 1, 0, MT__EPI_STORE16, 2, 1>(map_a, map_b, g, grid, stream);
        else if (b_k_inner && g.epilogue == MT__EPI_STORE16_GELU16)
            mt__gemm_wgmma_launch<1, 1, 0, MT__EPI_STORE16_GELU16, 2, 1>(map_a, map_b, g, grid, stream);
        else if (!b_k_inner && g.epilogue == MT__EPI_NONE)
            mt__gemm_wgmma_launch<1, 0, 0, MT__EPI_NONE, 2, 1>(map_a, map_b, g, grid, stream);
        else if (!b_k_inner && g.epilogue == MT__EPI_STORE16)
            mt__gemm_wgmma_launch<1, 0, 0, MT__EPI_STORE16, 2, 1>(map_a, map_b, g, grid, stream);
        else if (!b_k_inner && g.epilogue == MT__EPI_GELU_GRAD16)
            mt__gemm_wgmma_launch<1, 0, 0, MT__EPI_GELU_GRAD16, 2, 1>(map_a, map_b, g, grid, stream);
        else mt_fatal("internal: no ping-pong GEMM for this epilogue");
        return;
    }
    if (g.epilogue == MT__EPI_STORE16 && a_k_inner && !b_k_inner) {   // the attention projection's dinp (datty)
        mt__gemm_wgmma_launch<1, 0, F16, MT__EPI_STORE16>(map_a, map_b, g, grid, stream);
    } else if (g.epilogue == MT__EPI_GELU || g.epilogue == MT__EPI_GELU16 || g.epilogue == MT__EPI_STORE16 ||
               g.epilogue == MT__EPI_STORE16_GELU16 || g.epilogue == MT__EPI_RESIDUAL) {
        if (!a_k_inner || !b_k_inner) mt_fatal("internal: the forward's epilogues are built for its layout only");
        if (g.epilogue == MT__EPI_GELU) mt__gemm_wgmma_launch<1, 1, F16, MT__EPI_GELU>(map_a, map_b, g, grid, stream);
        else if (g.epilogue == MT__EPI_RESIDUAL)
            mt__gemm_wgmma_launch<1, 1, F16, MT__EPI_RESIDUAL>(map_a, map_b, g, grid, stream);
        else if (g.epilogue == MT__EPI_GELU16)
            mt__gemm_wgmma_launch<1, 1, F16, MT__EPI_GELU16>(map_a, map_b, g, grid, stream);
        else if (g.epilogue == MT__EPI_STORE16_GELU16)
            mt__gemm_wgmma_launch<1, 1, F16, MT__EPI_STORE16_GELU16>(map_a, map_b, g, grid, stream);
        else mt__gemm_wgmma_launch<1, 1, F16, MT__EPI_STORE16>(map_a, map_b, g, grid, stream);
    } else if (g.epilogue == MT__EPI_GELU_GRAD || g.epilogue == MT__EPI_GELU_GRAD16 ||
               g.epilogue == MT__EPI_GELU_GRAD16_GELU16) {
        if (!a_k_inner || b_k_inner) mt_fatal("internal: the GELU-gradient epilogue is built for dinp's layout only");
        if (g.epilogue == MT__EPI_GELU_GRAD) mt__gemm_wgmma_launch<1, 0, F16, MT__EPI_GELU_GRAD>(map_a, map_b, g, grid, stream);
        else if (g.epilogue == MT__EPI_GELU_GRAD16)
            mt__gemm_wgmma_launch<1, 0, F16, MT__EPI_GELU_GRAD16>(map_a, map_b, g, grid, stream);
        else mt__gemm_wgmma_launch<1, 0, F16, MT__EPI_GELU_GRAD16_GELU16>(map_a, map_b, g, grid, stream);
    } else if (g.bm == mt__wg_bm(3)) {   // the 192 x 192 tile: the weight gradients' layout only
        if (a_k_inner || b_k_inner) mt_fatal("internal: the 192 x 192 tile is built for k-outer operands only");
        mt__gemm_wgmma_launch<0, 0, F16, MT__EPI_NONE, 3>(map_a, map_b, g, grid, stream);
    } else if (a_k_inner && b_k_inner) mt__gemm_wgmma_launch<1, 1, F16, MT__EPI_NONE>(map_a, map_b, g, grid, stream);
    else if (a_k_inner) mt__gemm_wgmma_launch<1, 0, F16, MT__EPI_NONE>(map_a, map_b, g, grid, stream);
    else if (b_k_inner) mt__gemm_wgmma_launch<0, 1, F16, MT__EPI_NONE>(map_a, map_b, g, grid, stream);
    else mt__gemm_wgmma_launch<0, 0, F16, MT__EPI_NONE>(map_a, map_b, g, grid, stream);
}
// whether the wgmma GEMMs may use the staged epilogue (where stage_ok allows): a variable so that the
// tests can run both epilogues against each other
static int mt__wgmma_staged_epilogue = 1;
// 1: every plain k-outer GEMM on the 192 x 192 tile, whatever the plan would choose (tests)
static int mt__wgmma_force_192 = 0;
// where the ping-pong schedule runs (THE PING-PONG SCHEDULE): 0 nowhere, 1 where it is built and the
// 128 x 256 plan has one k-slice and K <= 1024 (the epilogue-heavy products: the forwards at K = C,
// fc-proj's and the attention projection's input gradients), 2 wherever it is built and the plan has
// one k-slice. -1: not read yet (MT_WGMMA_PINGPONG, default 0: measured no faster, docs/perf.md).
// mt__wgmma_force_pingpong = 1 (tests): wherever it is built, whatever the plan (split-K and
// stream-K included)
static int mt__wgmma_pingpong = -1;
static int mt__wgmma_force_pingpong = 0;
static int mt__wgmma_pingpong_mode(void) {
    if (mt__wgmma_pingpong < 0) {
        const char *env = getenv("MT_WGMMA_PINGPONG");
        mt__wgmma_pingpong = env && *env ? atoi(env) : 0;
    }
    return mt__wgmma_pingpong;
}
// mt__gemm_wgmma with the plan chosen by the caller, for tests: want_splits = 0: mt__wgmma_splits
// (megatron.h) decides; S > 0: S k-slices (1 = none); -1: stream-K. a and b are bf16, or fp16 when f16 = 1
// (the two typed overloads below are what callers use).
static void mt__gemm_wgmma_any(float *c, const void *a, const void *b, int f16, const float *bias, int M, int N, int K,
                               int lda, int ldb, int ldc, int a_k_inner, int b_k_inner, int accumulate, int want_splits,
                               const mt__epilogue *epi, cudaStream_t stream) {
    if (M <= 0 || N <= 0) return;
    if (K < 0) mt_fatal("GEMM with a negative reduction length K = %d", K);
    // (whether this GPU and binary can run it was checked once, when the rung was chosen)
    if ((uintptr_t)a % 16 != 0 || (uintptr_t)b % 16 != 0 || lda % 8 != 0 || ldb % 8 != 0)
        mt_fatal("--gemm wgmma: the TMA needs 16-byte aligned operands and leading dimensions that are multiples of 8 "
                 "(got lda %d, ldb %d)", lda, ldb);
    if (lda < (a_k_inner ? K : M) || ldb < (b_k_inner ? K : N) || ldc < N)
        mt_fatal("--gemm wgmma: leading dimension too small (lda %d, ldb %d, ldc %d for M %d N %d K %d)", lda, ldb, ldc, M, N, K);
    int Kmap = K > 0 ? K : 1;   // K = 0: no k-step runs, the maps are never read, but must be valid
    mt_wgmma_plan plan;   // tiles, k-slices or stream-K: the same plan the memory plan counts
    int op = epi ? epi->op : MT__EPI_NONE;
    int plain = op == MT__EPI_NONE;   // the 192 x 192 tile: plain k-outer products only
    mt_wgmma_plan_make(&plan, M, N, K, want_splits,
                       !a_k_inner && !b_k_inner && plain ? (mt__wgmma_force_192 ? 2 : 1) : 0);
    int ping = 0;   // the ping-pong schedule: the same plan, each unit on a cluster pair (above)
    if (plan.bm == MT__WG_BM && mt__wgmma_pingpong_built(f16, a_k_inner, b_k_inner, op)) {
        int mode = mt__wgmma_pingpong_mode();
        ping = mt__wgmma_force_pingpong || (plan.splits == 1 && !plan.stream_k && (mode == 2 || (mode == 1 && K <= 1024)));
    }
    // (ping-pong: a block loads its 64 rows of A and half of B, 128 rows, a k-step)
    CUtensorMap map_a = mt__wgmma_map(a, f16, M, Kmap, lda, a_k_inner, ping ? 64 : plan.bm);
    CUtensorMap map_b = mt__wgmma_map(b, f16, N, Kmap, ldb, b_k_inner, ping ? 128 : plan.bn);
    mt__wgmma_args g;
    memset(&g, 0, sizeof g);
    g.c = c; g.bias = bias; g.M = M; g.N = N; g.K = K; g.ldc = ldc; g.accumulate = accumulate;
    g.store2_ok = (uintptr_t)c % 8 == 0 && ldc % 2 == 0 && N % 2 == 0 && (bias == NULL || (uintptr_t)bias % 8 == 0);
    // the epilogues that read the GELU's input (aux); GELU_GRAD16_GELU16 also writes c2
    int remake = op == MT__EPI_GELU_GRAD16_GELU16;
    int grad = op == MT__EPI_GELU_GRAD || op == MT__EPI_GELU_GRAD16 || remake;
    int reads_aux = grad || op == MT__EPI_RESIDUAL;   // (RESIDUAL: the residual, fp32)
    if (op != MT__EPI_NONE) {
        if (accumulate) mt_fatal("internal: a fused GEMM epilogue with accumulate");
        g.epilogue = op; g.aux = epi->aux; g.c2 = epi->c2; g.c2_f16 = f16;
        const void *other = reads_aux ? epi->aux : (const void *)epi->c2;
        int sixteen = op == MT__EPI_GELU16 || op == MT__EPI_STORE16 || op == MT__EPI_STORE16_GELU16 ||
                      op == MT__EPI_GELU_GRAD16 || remake;
        if ((uintptr_t)other % (sixteen ? 4 : 8) != 0) g.store2_ok = 0;
        // STORE16_GELU16, GELU_GRAD16(_GELU16): c holds 16-bit values too, stored in pairs (4 bytes)
        if (op == MT__EPI_STORE16_GELU16 || op == MT__EPI_GELU_GRAD16 || remake)
            g.store2_ok = (uintptr_t)c % 4 == 0 && ldc % 2 == 0 && N % 2 == 0 && (uintptr_t)other % 4 == 0 &&
                          (!remake || (uintptr_t)epi->c2 % 4 == 0) && (bias == NULL || (uintptr_t)bias % 8 == 0);
    }
    {   // the staged epilogue: whole 16-byte pieces of every row it writes or reads
        const void *c2 = op == MT__EPI_GELU || op == MT__EPI_GELU16 || op == MT__EPI_STORE16 ||
                                 op == MT__EPI_STORE16_GELU16 || remake ? epi->c2 : NULL;
        const void *aux = reads_aux ? epi->aux : NULL;
        g.stage_ok = N % 8 == 0 && ldc % 8 == 0 && mt__aligned16(c) && (c2 == NULL || mt__aligned16(c2)) &&
                     (aux == NULL || mt__aligned16(aux)) && (bias == NULL || (uintptr_t)bias % 8 == 0) &&
                     mt__wgmma_staged_epilogue;
    }
    g.tiles_m = plan.tiles_m;
    g.bm = plan.bm;
    g.bn = plan.bn;
    g.tiles_n = plan.tiles_n;
    g.steps_tile = plan.steps;
    g.k_per_split = plan.k_per_split;
    g.splits = plan.splits;
    if ((size_t)plan.tiles_m * plan.tiles_n * plan.splits > 2147483647u)
        mt_fatal("--gemm wgmma: %zu tiles is too many", (size_t)plan.tiles_m * plan.tiles_n * plan.splits);
    if (plan.stream_k) {   // stream-K: 132 workers, whatever the GPU
        g.sk_workers = MT__WG_SMS;
        g.sk_total = plan.sk_total;
        g.sk_slots = plan.sk_slots;
    }
    size_t units = plan.units, slots = plan.slots;
    if (slots)   // scratch for the partials (the rank's arena, section 1)
        mt__scratch_alloc((void **)&g.workspace, slots * plan.bm * plan.bn * sizeof(float), stream);
    int dev, sms;
    MT_CUDA_CHECK(cudaGetDevice(&dev));
    MT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    int grid = (int)(units < (size_t)sms ? units : (size_t)sms);
    if (f16) mt__gemm_wgmma_launch_layout<1>(map_a, map_b, g, grid, a_k_inner, b_k_inner, ping, stream);
    else mt__gemm_wgmma_launch_layout<0>(map_a, map_b, g, grid, a_k_inner, b_k_inner, ping, stream);
    if (slots) {
        size_t n4 = (size_t)plan.tiles_m * plan.tiles_n * plan.bm * plan.bn / 4;   // one thread per float4 of a tile
        mt__launch("mt_matmul_kernel4_splitk_reduce", mt_matmul_kernel4_splitk_reduce, (unsigned)((n4 + 255) / 256), 256,
                   0, stream, g);
        mt__scratch_free(g.workspace, stream);
    }
}
static void mt__gemm_wgmma_splits(float *c, const __nv_bfloat16 *a, const __nv_bfloat16 *b, const float *bias, int M,
                                  int N, int K, int lda, int ldb, int ldc, int a_k_inner, int b_k_inner, int accumulate,
                                  int want_splits, cudaStream_t stream) {
    mt__gemm_wgmma_any(c, a, b, 0, bias, M, N, K, lda, ldb, ldc, a_k_inner, b_k_inner, accumulate, want_splits, NULL,
                       stream);
}
static void mt__gemm_wgmma_splits(float *c, const __half *a, const __half *b, const float *bias, int M, int N, int K,
                                  int lda, int ldb, int ldc, int a_k_inner, int b_k_inner, int accumulate,
                                  int want_splits, cudaStream_t stream) {
    mt__gemm_wgmma_any(c, a, b, 1, bias, M, N, K, lda, ldb, ldc, a_k_inner, b_k_inner, accumulate, want_splits, NULL,
                       stream);
}
// C[i][j] (=|+=) sum_k A(i,k) B(j,k) (+ bias[j]); a, b bf16 (or fp16) device pointers, c and bias
// fp32. The layouts and the accumulate / bias rules are mt__gemm's. a, b 16-byte aligned, lda, ldb % 8 == 0.
void mt__gemm_wgmma(float *c, const __nv_bfloat16 *a, const __nv_bfloat16 *b, const float *bias, int M, int N, int K,
                    int lda, int ldb, int ldc, int a_k_inner, int b_k_inner, int accumulate, cudaStream_t stream) {
    mt__gemm_wgmma_splits(c, a, b, bias, M, N, K, lda, ldb, ldc, a_k_inner, b_k_inner, accumulate, 0, stream);
}
void mt__gemm_wgmma(float *c, const __half *a, const __half *b, const float *bias, int M, int N, int K, int lda,
                    int ldb, int ldc, int a_k_inner, int b_k_inner, int accumulate, cudaStream_t stream) {
    mt__gemm_wgmma_splits(c, a, b, bias, M, N, K, lda, ldb, ldc, a_k_inner, b_k_inner, accumulate, 0, stream);
}

// The wgmma rung reads bf16 (fp16) operands through the TMA, so each fp32 operand is first
// rounded to bf16 (fp16) into scratch (the rounding the mma rung does on its way to shared
// memory; storage stays fp32 until activations are stored in bf16). The copy keeps the operand's
// layout and leading dimension: X(i,k) of the copy is where it was. span = elements from the
// first to the last. T is __nv_bfloat16 or __half; mt__cast_to picks the cast. (Was mt__bf16_copy.)
static void mt__cast_to(__nv_bfloat16 *out, const float *x, size_t n, cudaStream_t stream) {
    mt_cast_f32_to_bf16_gpu(out, x, n, stream);
}
static void mt__cast_to(__half *out, const float *x, size_t n, cudaStream_t stream) {
    mt_cast_f32_to_f16_gpu(out, x, n, stream);
}
//
// THE PARAMETERS' 16-BIT COPY. Most of those operands are weights, and a training step multiplies
// every weight twice (the forward, and the backward's input gradient): rounding each one into a
// copy per product cast 2 x 124M weights a step for GPT-2 small (1.5 GB moved in 98 launches). So
// the rank rounds all its parameters once, into one copy, when a step starts (megatron.h's
// mt_device_weights16: training and evaluation steps, and a generator for its whole life), and
// while that copy is on, mt__rounded_copy lends the piece of it that holds the operand instead of
// making one: the same values (the same cast), nothing borrowed, nothing freed
// (mt__rounded_free tells a lent piece from a made copy by its address). Thread-local, as
// mt__pdl_on: each rank thread has its own parameters and copy.
typedef struct {
    const float *of;   // the rank's parameters (fp32), n floats from here
    size_t n;
    const void *copy;  // the same n values rounded to 16 bits; NULL: no copy is on
    int f16;           // 1: fp16, 0: bf16
} mt__weights16;
static MT_THREAD_LOCAL mt__weights16 mt__w16;
static int mt__f16_flag(const __half *) { return 1; }
static int mt__f16_flag(const __nv_bfloat16 *) { return 0; }
// the piece of the copy that holds x's span elements, where the copy is on, of type T, and the
// piece starts on a 16-byte boundary (the TMA reads it from there: x at a multiple of 8 elements
// from the parameters' start); else NULL
template <typename T>
static T *mt__weights16_piece(const float *x, size_t span) {
    if (!mt__w16.copy || mt__w16.f16 != mt__f16_flag((const T *)NULL)) return NULL;
    if (x < mt__w16.of || x >= mt__w16.of + mt__w16.n || span > (size_t)(mt__w16.of + mt__w16.n - x)) return NULL;
    size_t at = (size_t)(x - mt__w16.of);
    if (at % 8 != 0) return NULL;
    return (T *)mt__w16.copy + at;
}
template <typename T>
static T *mt__rounded_copy(const float *x, int rows, int K, int ld, int k_inner, cudaStream_t stream) {
    static_assert(sizeof(T) == 2, "mt_gpu_rounded_copy_bytes counts 2 bytes an element");
    size_t span = mt_gpu_operand_span(rows, K, ld, k_inner);   // megatron.h section 3: the plan counts the same
    T *lent = mt__weights16_piece<T>(x, span);
    if (lent) return lent;   // a parameter, already rounded
    T *copy;
    mt__scratch_alloc((void **)&copy, mt_gpu_rounded_copy_bytes(span), stream);   // (span + 8) x 2
    if (span) mt__cast_to(copy, x, span, stream);
    return copy;
}
// give back what mt__rounded_copy returned: a copy it made is freed, a piece of the parameters'
// copy is not
template <typename T>
static void mt__rounded_free(T *copy, cudaStream_t stream) {
    const T *first = (const T *)mt__w16.copy;
    if (first && copy >= first && copy < first + mt__w16.n) return;
    mt__scratch_free(copy, stream);
}
// the same for a whole tensor of n elements (the attention kernels' operands)
template <typename T>
static T *mt__rounded_flat_copy(const float *x, size_t n, cudaStream_t stream) {
    T *copy;
    mt__scratch_alloc((void **)&copy, mt_gpu_rounded_copy_bytes(n), stream);   // (n + 8) x 2
    if (n) mt__cast_to(copy, x, n, stream);
    return copy;
}
// one GEMM on the wgmma rung from fp32 operands: both rounded to T, multiplied, the copies freed
// (epi: NULL, or a fused epilogue: the MLP's GELU, mt_matmul_forward_gelu_gpu)
// the same with A already in T (a layer's ln1 / ln2 as the layernorm stored it): only B is rounded
template <typename T>
static void mt__gemm_wgmma_a16(float *c, const T *a16, const float *b, const float *bias, int M, int N, int K, int lda,
                               int ldb, int ldc, int a_k_inner, int b_k_inner, int accumulate, const mt__epilogue *epi,
                               cudaStream_t stream) {
    T *b16 = mt__rounded_copy<T>(b, N, K, ldb, b_k_inner, stream);
    mt__gemm_wgmma_any(c, a16, b16, mt__f16_flag(b16), bias, M, N, K, lda, ldb, ldc, a_k_inner, b_k_inner, accumulate, 0,
                       epi, stream);
    mt__rounded_free(b16, stream);
}
template <typename T>
static void mt__gemm_wgmma_rounded(float *c, const float *a, const float *b, const float *bias, int M, int N, int K,
                                   int lda, int ldb, int ldc, int a_k_inner, int b_k_inner, int accumulate,
                                   const mt__epilogue *epi, cudaStream_t stream) {
    T *a16 = mt__rounded_copy<T>(a, M, K, lda, a_k_inner, stream);
    mt__gemm_wgmma_a16<T>(c, a16, b, bias, M, N, K, lda, ldb, ldc, a_k_inner, b_k_inner, accumulate, epi, stream);
    mt__rounded_free(a16, stream);
}
// C[i][j] (=|+=) sum_k A(i,k) B(j,k) (+ bias[j]) with the layouts described above. dtype (an
// mt_dtype): the operand type of the tensor-core rungs (mma, wgmma): MT_DTYPE_FP16 fp16, else
// bf16; the naive and tiled rungs are fp32 whatever it says.
static void mt__gemm(mt_gemm_impl impl, float *c, const float *a, const float *b, const float *bias, int M, int N,
                     int K, int lda, int ldb, int ldc, int a_k_inner, int b_k_inner, int accumulate, int dtype,
                     cudaStream_t stream) {
    if (M <= 0 || N <= 0) return;
    if (K < 0) mt_fatal("GEMM with a negative reduction length K = %d", K);
    // the TMA needs 16-byte row strides: a leading dimension that is not a multiple of 8 bf16
    // (a model with, say, hidden size 100) takes the mma rung, the same arithmetic
    if (impl == MT_GEMM_WGMMA && (lda % 8 != 0 || ldb % 8 != 0)) impl = MT_GEMM_MMA;
    if (impl == MT_GEMM_WGMMA) {
        if (dtype == MT_DTYPE_FP16)
            mt__gemm_wgmma_rounded<__half>(c, a, b, bias, M, N, K, lda, ldb, ldc, a_k_inner, b_k_inner, accumulate,
                                           NULL, stream);
        else
            mt__gemm_wgmma_rounded<__nv_bfloat16>(c, a, b, bias, M, N, K, lda, ldb, ldc, a_k_inner, b_k_inner,
                                                  accumulate, NULL, stream);
        return;
    }
    mt__gemm_args g;
    memset(&g, 0, sizeof g);
    g.c = c; g.a = a; g.b = b; g.bias = bias;
    g.M = M; g.N = N; g.K = K; g.lda = lda; g.ldb = ldb; g.ldc = ldc;
    g.a_k_inner = a_k_inner; g.b_k_inner = b_k_inner; g.accumulate = accumulate;
    g.vec_ok = mt__aligned16(a) && mt__aligned16(b) && lda % 4 == 0 && ldb % 4 == 0;
    g.store2_ok = (uintptr_t)c % 8 == 0 && ldc % 2 == 0 && N % 2 == 0;
    if (impl != MT_GEMM_NAIVE && impl != MT_GEMM_TILED && impl != MT_GEMM_MMA) mt_fatal("unknown GEMM implementation %d", (int)impl);
    int f16 = dtype == MT_DTYPE_FP16;
    if (a_k_inner && b_k_inner) mt__gemm_launch<1, 1>(impl, g, f16, stream);
    else if (a_k_inner) mt__gemm_launch<1, 0>(impl, g, f16, stream);
    else if (b_k_inner) mt__gemm_launch<0, 1>(impl, g, f16, stream);
    else mt__gemm_launch<0, 0>(impl, g, f16, stream);
}

// the rung that each --fp32 / --bf16 / --fp16 run trains with: fp32 the tiled rung (exact fp32);
// bf16 and fp16 the best that runs here: wgmma on a Hopper GPU with sm_90a code in the binary,
// else mma. dtype is an mt_dtype (0 = fp32).
mt_gemm_impl mt_gemm_impl_for_precision(int dtype) {
    if (dtype == MT_DTYPE_FP32) return MT_GEMM_TILED;
    return mt__wgmma_unsupported() == NULL ? MT_GEMM_WGMMA : MT_GEMM_MMA;
}
const char *mt_gemm_impl_name(mt_gemm_impl impl) {
    switch (impl) {
    case MT_GEMM_NAIVE: return "naive";
    case MT_GEMM_TILED: return "tiled";
    case MT_GEMM_MMA: return "mma";
    case MT_GEMM_WGMMA: return "wgmma";
    }
    return "?";
}
// "naive" | "tiled" | "mma" | "wgmma" (the --gemm flag) -> the rung; fatal otherwise, or when
// this GPU cannot run it
mt_gemm_impl mt_gemm_impl_parse(const char *name) {
    if (strcmp(name, "naive") == 0) return MT_GEMM_NAIVE;
    if (strcmp(name, "tiled") == 0) return MT_GEMM_TILED;
    if (strcmp(name, "mma") == 0) return MT_GEMM_MMA;
    if (strcmp(name, "wgmma") == 0) { mt__wgmma_check_supported(); return MT_GEMM_WGMMA; }
    mt_fatal("unknown GEMM implementation '%s'\nhint: --gemm naive|tiled|mma|wgmma", name);
    return MT_GEMM_NAIVE;
}

// ---------------------------------------------------------------------------------------------
// matmul for a few rows (decoding: one token per sequence): a GEMV. A GEMM tile of 64-128 rows
// would be mostly padding and the bf16 rungs would copy the whole weight to bf16 first; here
// each warp reads its output row of the weight once (16 bytes per lane per load, coalesced) and
// dots it with every input row (at most MT_GEMV_MAX_ROWS, held in registers), so the product runs
// at the speed of reading the weight from HBM. Narrow outputs (OC < 2048: too few rows to fill
// the GPU) split the reduction over SPLIT warps (split-K), whose partial sums are added in order
// (deterministic). A lane issues the loads of up to 4 pieces of 8 weights before it multiplies
// any: a warp's row of GPT-2 small (768 weights) is then one round trip to HBM, not three.
// Sums in fp32; the operands are rounded as the rung would round them (ROUND, an mt_dtype: the
// tensor-core rungs' bf16 or fp16, fp32 for the naive and tiled rungs), so a step with a few rows
// multiplies the same values as one with many (and as the CPU build's emulation).
// WT, the weight's storage: float (the parameters), or __nv_bfloat16 / __half: the decoding copy
// of the parameters already rounded to ROUND (mt_device_weights16), half the bytes to read.
// matches mt_matmul_forward_cpu (megatron.h, 3. OPS) for BT <= MT_GEMV_MAX_ROWS (8, megatron.h's:
// a GEMV borrows no scratch, section 3 counts it so). Writes out with '='.
template <int ROUND>
__device__ static inline float mt__gemv_operand(float x) {
    if (ROUND == MT_DTYPE_BF16) return __bfloat162float(__float2bfloat16_rn(x));
    if (ROUND == MT_DTYPE_FP16) return __half2float(__float2half_rn(x));
    return x;
}
// gelu_out: NULL, or also gelu(out) there (the MLP's fc layer, as the GEMM's GELU epilogue)
// The work of block `block` of 256 threads (8 warps: 8 / SPLIT output rows), a device function so
// that the decode step's single kernel (below, "a decode step as one kernel") runs the very same
// arithmetic for its share of the blocks; partial: 8 x MT_GEMV_MAX_ROWS floats of shared memory.
// inp may point into shared memory (the decode step keeps its normalised rows there), and so may
// weight: it holds rows row0.. of the weight (the kernel: 0, the whole weight; the decode step: a
// copy of this block's rows staged in shared memory ahead of time).
template <int SPLIT, int ROUND, typename WT>
__device__ static void mt__gemv_block(int block, float (*partial)[MT_GEMV_MAX_ROWS], float *__restrict__ out,
                                      float *__restrict__ gelu_out, const float *__restrict__ inp,
                                      const WT *__restrict__ weight, int row0, const float *__restrict__ bias, int BT,
                                      int C, int OC, int vec) {
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int o = block * (8 / SPLIT) + warp / SPLIT, part = warp % SPLIT;
    float acc[MT_GEMV_MAX_ROWS];
#pragma unroll
    for (int r = 0; r < MT_GEMV_MAX_ROWS; r++) acc[r] = 0.0f;
    if (o < OC) {
        const WT *w = weight + (size_t)(o - row0) * C;
        int chunk = ((C + SPLIT - 1) / SPLIT + 7) & ~7;   // a multiple of 8: 16-byte pieces stay inside a part
        int k0 = part * chunk, k1 = min(C, k0 + chunk);
        if (vec) {   // C % 8 == 0, 16-byte aligned rows: piece p of a lane covers k = k0 + 8 (lane + 32 p) ..+8
            for (int kb = k0 + 8 * lane; kb < k1; kb += 4 * 256) {
                float wv[4][8];
#pragma unroll
                for (int p = 0; p < 4; p++)   // the loads first (independent: all in flight together)
                    if (kb + 256 * p < k1) mt__load8(wv[p], w + kb + 256 * p);
                // first pass: wait for the kernel ahead (it wrote inp) with these weights on their way
                if (kb == k0 + 8 * lane) mt__pdl_start();
#pragma unroll
                for (int p = 0; p < 4; p++) {
                    int k = kb + 256 * p;
                    if (k >= k1) break;
#pragma unroll
                    for (int e = 0; e < 8; e++) wv[p][e] = mt__gemv_operand<ROUND>(wv[p][e]);
#pragma unroll
                    for (int r = 0; r < MT_GEMV_MAX_ROWS; r++)
                        if (r < BT) {
                            float x[8];
                            mt__load8(x, inp + (size_t)r * C + k);
                            float sum = 0.0f;
#pragma unroll
                            for (int e = 0; e < 8; e++) sum += wv[p][e] * mt__gemv_operand<ROUND>(x[e]);
                            acc[r] += sum;
                        }
                }
            }
        } else {
            mt__pdl_start();
            for (int k = k0 + lane; k < k1; k += 32)
#pragma unroll
                for (int r = 0; r < MT_GEMV_MAX_ROWS; r++)
                    if (r < BT)
                        acc[r] += mt__gemv_operand<ROUND>(mt__to_float(w[k])) *
                                  mt__gemv_operand<ROUND>(inp[(size_t)r * C + k]);
        }
    }
    mt__pdl_start();   // the threads that did not wait above (no row, or no piece in the first pass); else nothing
#pragma unroll
    for (int r = 0; r < MT_GEMV_MAX_ROWS; r++) acc[r] = mt__warp_sum(acc[r]);
    if (lane == 0)
#pragma unroll
        for (int r = 0; r < MT_GEMV_MAX_ROWS; r++) partial[warp][r] = acc[r];
    __syncthreads();
    if (o < OC && part == 0 && lane < BT) {
        float s = 0.0f;
        for (int p = 0; p < SPLIT; p++) s += partial[warp + p][lane];
        float v = s + (bias ? bias[o] : 0.0f);
        out[(size_t)lane * OC + o] = v;
        if (gelu_out) gelu_out[(size_t)lane * OC + o] = mt__gelu(v);
    }
}
template <int SPLIT, int ROUND, typename WT>
__global__ void __launch_bounds__(256) mt_matmul_kernel5_gemv(float *__restrict__ out, float *__restrict__ gelu_out,
                                                              const float *__restrict__ inp,
                                                              const WT *__restrict__ weight,
                                                              const float *__restrict__ bias, int BT, int C, int OC,
                                                              int vec) {
    __shared__ float partial[8][MT_GEMV_MAX_ROWS];
    mt__gemv_block<SPLIT, ROUND, WT>(blockIdx.x, partial, out, gelu_out, inp, weight, 0, bias, BT, C, OC, vec);
}
// the GEMV's split and block count for OC outputs: narrow outputs split the reduction over 4 warps
__host__ __device__ static inline int mt__gemv_split(int OC) { return OC < 2048 ? 4 : 1; }
__host__ __device__ static inline int mt__gemv_blocks(int OC) { return (OC + 8 / mt__gemv_split(OC) - 1) / (8 / mt__gemv_split(OC)); }
template <int ROUND, typename WT>
static void mt__gemv_launch(float *out, float *gelu_out, const float *inp, const WT *weight, const float *bias, int BT,
                            int C, int OC, int vec, cudaStream_t stream) {
    if (mt__gemv_split(OC) == 4)
        mt__launch("mt_matmul_kernel5_gemv", mt_matmul_kernel5_gemv<4, ROUND, WT>, mt__gemv_blocks(OC), 256, 0, stream,
                   out, gelu_out, inp, weight, bias, BT, C, OC, vec);
    else
        mt__launch("mt_matmul_kernel5_gemv", mt_matmul_kernel5_gemv<1, ROUND, WT>, mt__gemv_blocks(OC), 256, 0, stream,
                   out, gelu_out, inp, weight, bias, BT, C, OC, vec);
}
static int mt__clusters_supported(void);   // does the GPU have thread-block clusters? (defined below)
// The same product on tensor cores, from the 16-bit copy of the weight (decoding's: mt_device_weights16).
// Why: the loop above spends about three instructions per weight and input row (the load of the
// input, its rounding, the FMA), so at 8 rows a GEMV waits on instructions, not on the weight's
// bytes (docs/perf.md: 300 GB/s at batch 8 against 640 at batch 1). One mma.sync.m16n8k16 does
// 16 x 8 x 16 products:
//   A (16 x 16) = the input rows (at most 8: rows 8-15 are zeros), B (16 x 8) = 8 rows of the weight
//   (8 outputs), C (16 x 8) += A B: every input row's 8 outputs at once.
// Which k a fragment slot holds does not matter to a sum over k, as long as A and B agree. Lane
// (g = lane / 4, t = lane % 4) holds A's row g and B's column g at the slots k = 2t, 2t+1 (first
// register) and 2t+8, 2t+9 (second): here those are the 4 values at k0 + 8t .. 8t+3, and the next
// mma takes 8t+4 .. 8t+7. So a lane reads 8 consecutive values of its weight row o0 + g (16 bytes,
// the 32-bit words already pairs of neighbours: no repacking) and of input row g (rounded in pairs
// to nearest even, as mt__gemv_operand: the same products as the loop above), and one k step of
// 32 is two mmas. The sum's order differs from the loop above (the mma adds in its own order).
// Block: 8 warps on 8 outputs; warp w takes the k steps w, w + 8, w + 16, ...; its loads of the
// weight (up to AHEAD steps, below) go out before the wait for the kernel ahead, which wrote
// inp. Then each warp's C fragment (row g = input row, columns 2t, 2t+1 = outputs) goes to shared
// memory and 64 threads add the 8 warps' partials in warp order (deterministic), add the bias, write.
// F16: 0 = bf16 weights (--bf16), 1 = fp16. C % 8 == 0, inp and weight 16-byte aligned.
// AHEAD: the k steps of 32 a warp keeps in flight, all of a warp's steps where possible: 4 up to
// C = 1024 (GPT-2's 768: 3 a warp), 12 beyond (its 3072: 12). Fewer registers, more blocks an SM:
// the next kernel's blocks find room sooner and start their loads.
template <int F16, int AHEAD, int MC>
__global__ void __launch_bounds__(256) mt_matmul_kernel6_gemv_mma(float *__restrict__ out, float *__restrict__ gelu_out,
                                                                  const float *__restrict__ inp,
                                                                  const uint16_t *__restrict__ weight,
                                                                  const float *__restrict__ bias, int BT, int C,
                                                                  int OC, int early) {
    __shared__ float partial[8][MT_GEMV_MAX_ROWS][8];   // [warp][input row][output]
    if (early) mt__pdl_launch_next();   // a decode step's: the next kernel may launch now (mt__pdl_early)
    // MC = 1 (a cluster of 8 blocks): the input rows [BT, C] reach shared memory once per cluster.
    // Without it, lanes 0-3 of each warp read their 8 floats of the row from L2 a k step at a time,
    // after the wait (12 steps for a 3,072-float row); here block r of the cluster copies the r-th
    // eighth with one bulk copy, multicast to all 8 blocks, and each block waits on its mbarrier for
    // all BT C floats: 1.26 -> 0.83 us for 3,072 floats (tests/gpu/input_read_bench.cu; docs/perf.md,
    // session 47). The products read the same values in the same order: the same bits.
    // (Bulk copies and clusters exist from Hopper on: built for an older GPU the kernel reads the row
    // from global memory whatever MC says, and the launcher asks for MC only where clusters exist.)
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    constexpr int MCX = MC;
#else
    constexpr int MCX = 0;
#endif
    extern __shared__ __align__(16) float x_shared[];
    __shared__ __align__(8) uint64_t x_bar;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    int o0 = blockIdx.x * 8, steps = (C + 31) / 32;
    int w_ok = o0 + g < OC, x_ok = g < BT;
    const uint16_t *w_row = weight + (size_t)(w_ok ? o0 + g : 0) * C;
    const float *x_row = (MCX ? x_shared : inp) + (size_t)(x_ok ? g : 0) * C;
    uint32_t bar = MCX ? mt__smem_u32(&x_bar) : 0u;
    if constexpr (MCX != 0) {
        if (threadIdx.x == 0) {
            mt__mbar_init(bar, 1);
            asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
            mt__mbar_arrive_expect_tx(bar, (uint32_t)(BT * C * 4));
        }
        mt__cluster_sync();   // every block's barrier set before any block's copy lands in it
    }
    // thread r * 8 + j finishes input row r's output o0 + j. Its bias is read here, before the wait,
    // as the weights are (no kernel of the chain writes either): read after the block's reduction
    // it was one more round trip to memory on the step's critical path (docs/perf.md, session 45)
    int r = threadIdx.x / 8, o = o0 + threadIdx.x % 8;
    float bias_o = bias && threadIdx.x < 8 * MT_GEMV_MAX_ROWS && o < OC ? bias[o] : 0.0f;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int s0 = warp; s0 < steps; s0 += 8 * AHEAD) {
        uint4 w[AHEAD];
        #pragma unroll
        for (int i = 0; i < AHEAD; i++) {   // the loads first: all in flight together
            int k = 32 * (s0 + 8 * i) + 8 * t;
            w[i] = w_ok && k < C ? *(const uint4 *)(w_row + k) : make_uint4(0, 0, 0, 0);
        }
        if (s0 == warp) {   // first pass: now wait for the kernel ahead (it wrote inp)
            mt__pdl_start();
            if constexpr (MCX != 0) {
                if (threadIdx.x == 0) {   // this block's eighth of inp, into all 8 blocks
                    uint32_t bytes = (uint32_t)(BT * C * 4 / 8), r = mt__cluster_rank();
                    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
                                 " [%0], [%1], %2, [%3], %4;\n"
                                 ::"r"(mt__smem_u32(x_shared) + r * bytes), "l"((const char *)inp + r * bytes),
                                 "r"(bytes), "r"(bar), "h"((uint16_t)0xff) : "memory");
                }
                mt__mbar_wait(bar, 0);
            }
        }
        #pragma unroll
        for (int i = 0; i < AHEAD; i++) {
            int k = 32 * (s0 + 8 * i) + 8 * t;
            if (32 * (s0 + 8 * i) >= C) break;   // (the same for the whole warp: mma needs all 32 lanes)
            float x[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
            if (x_ok && k < C) mt__load8(x, x_row + k);
            uint32_t a_lo[4] = {mt__pack16x2<F16>(x[0], x[1]), 0u, mt__pack16x2<F16>(x[2], x[3]), 0u};
            uint32_t a_hi[4] = {mt__pack16x2<F16>(x[4], x[5]), 0u, mt__pack16x2<F16>(x[6], x[7]), 0u};
            mt__mma16<F16>(acc, a_lo, w[i].x, w[i].y);
            mt__mma16<F16>(acc, a_hi, w[i].z, w[i].w);
        }
    }
    mt__pdl_start();   // the warps without a k step; else nothing
    // acc[0], acc[1]: input row g, outputs o0 + 2t, o0 + 2t + 1; acc[2], acc[3]: row g + 8 (none)
    partial[warp][g][2 * t] = acc[0];
    partial[warp][g][2 * t + 1] = acc[1];
    __syncthreads();
    // MC: this block's copy has landed (warp 0 waited for it); no block of the cluster leaves before
    // every block's has, so no copy is still on its way into a block that has gone
    if constexpr (MCX != 0) asm volatile("barrier.cluster.arrive.relaxed;\n" ::: "memory");
    if (threadIdx.x < 8 * MT_GEMV_MAX_ROWS && r < BT && o < OC) {
        float s = 0.0f;
        #pragma unroll
        for (int w = 0; w < 8; w++) s += partial[w][r][threadIdx.x % 8];
        float v = s + bias_o;   // (0 without a bias: s + 0, as before)
        out[(size_t)r * OC + o] = v;
        if (gelu_out) gelu_out[(size_t)r * OC + o] = mt__gelu(v);
    }
    if constexpr (MCX != 0) asm volatile("barrier.cluster.wait;\n" ::: "memory");
}
template <int F16>
static void mt__gemv_mma_launch(float *out, float *gelu_out, const float *inp, const uint16_t *weight16,
                                const float *bias, int BT, int C, int OC, cudaStream_t stream) {
    unsigned blocks = (unsigned)((OC + 7) / 8);
    // the input multicast to clusters of 8 (MC above), where it was measured faster: a layer's GEMVs
    // (OC < 8 C; the head's 6,283 blocks in clusters lost) at one input row of at most 3,072 floats
    // (batch 1, GPT-2 small's 768 and 3,072; at batch 8 it lost; batches 2-4 not measured).
    // MT_GEMV_MULTICAST=0: never; 3: there, and only from more than 1,024 input floats (fc proj's,
    // not fc's: measured slower). The bulk copy needs C / 8 floats in whole 16-byte pieces (inp is
    // 16-byte aligned: the caller's vec). (docs/perf.md, session 47)
    static int multicast = -1;
    if (multicast < 0) {
        const char *e = getenv("MT_GEMV_MULTICAST");
        multicast = e ? atoi(e) : 1;
    }
    static const int clusters = mt__clusters_supported();   // (Hopper and newer)
    int mc = clusters && multicast != 0 && OC < 8 * C && BT == 1 && C <= 3072 && (multicast != 3 || C > 1024) &&
             C % 32 == 0;
    // AHEAD 12 for more than 4 k steps a warp; MC: whole clusters of 8 blocks, the row's C floats of
    // shared memory (at most 12 KB: no opt-in needed)
    void (*kernel)(float *, float *, const float *, const uint16_t *, const float *, int, int, int, int) =
        C > 8 * 32 * 4 ? (mc ? mt_matmul_kernel6_gemv_mma<F16, 12, 1> : mt_matmul_kernel6_gemv_mma<F16, 12, 0>)
                       : (mc ? mt_matmul_kernel6_gemv_mma<F16, 4, 1> : mt_matmul_kernel6_gemv_mma<F16, 4, 0>);
    if (mc) blocks = (blocks + 7) / 8 * 8;
    mt__launch_cluster("mt_matmul_kernel6_gemv_mma", kernel, blocks, 256, mc ? (size_t)C * 4 : 0, stream, mc ? 8u : 1u,
                       out, gelu_out, inp, weight16, bias, BT, C, OC, BT == 1 && mt__pdl_early());
}
// from how many input rows a GEMV from 16-bit weights runs on tensor cores (above) instead of the
// CUDA-core loop: from one (measured faster at 1 and 8 rows: docs/perf.md). A variable so that the
// tests can run both: the decode step as one kernel (below) keeps the CUDA-core loop's arithmetic.
static int mt__gemv_mma_from_rows = 1;
// round: an mt_dtype, what the operands are rounded to (see above). weight16: NULL, or the same
// weight already rounded to `round` and stored in 16 bits (read instead of weight). gelu_out: NULL,
// or gelu(out) there too.
static void mt__gemv(float *out, float *gelu_out, const float *inp, const float *weight, const void *weight16,
                     const float *bias, int BT, int C, int OC, int round, cudaStream_t stream) {
    int vec = C % 8 == 0 && mt__aligned16(inp) && mt__aligned16(weight16 ? weight16 : weight);
    if (weight16 && vec && BT >= mt__gemv_mma_from_rows && (round == MT_DTYPE_BF16 || round == MT_DTYPE_FP16)) {
        const uint16_t *w16 = (const uint16_t *)weight16;
        if (round == MT_DTYPE_FP16) mt__gemv_mma_launch<1>(out, gelu_out, inp, w16, bias, BT, C, OC, stream);
        else mt__gemv_mma_launch<0>(out, gelu_out, inp, w16, bias, BT, C, OC, stream);
        return;
    }
    if (round == MT_DTYPE_BF16 && weight16)
        mt__gemv_launch<MT_DTYPE_BF16>(out, gelu_out, inp, (const __nv_bfloat16 *)weight16, bias, BT, C, OC, vec, stream);
    else if (round == MT_DTYPE_FP16 && weight16)
        mt__gemv_launch<MT_DTYPE_FP16>(out, gelu_out, inp, (const __half *)weight16, bias, BT, C, OC, vec, stream);
    else if (round == MT_DTYPE_BF16)
        mt__gemv_launch<MT_DTYPE_BF16>(out, gelu_out, inp, weight, bias, BT, C, OC, vec, stream);
    else if (round == MT_DTYPE_FP16)
        mt__gemv_launch<MT_DTYPE_FP16>(out, gelu_out, inp, weight, bias, BT, C, OC, vec, stream);
    else mt__gemv_launch<MT_DTYPE_FP32>(out, gelu_out, inp, weight, bias, BT, C, OC, vec, stream);
}

// matches mt_matmul_forward_cpu (megatron.h, 3. OPS). Writes out with '='.
// out (BT,OC) = inp (BT,C) @ weight^T + bias; weight (OC,C), bias (OC) or NULL.
// impl: the rung; dtype (an mt_dtype): the tensor-core rungs' operand type (fp16, else bf16)
void mt_matmul_forward_gpu(float *out, const float *inp, const float *weight, const float *bias, int BT, int C, int OC,
                           mt_gemm_impl impl, int dtype, cudaStream_t stream) {
    if (BT > 0 && BT <= MT_GEMV_MAX_ROWS && OC > 0) {   // decoding's shape: read the weight once
        int tensor_cores = impl == MT_GEMM_MMA || impl == MT_GEMM_WGMMA;   // the rungs that round
        int round = tensor_cores ? (dtype == MT_DTYPE_FP16 ? MT_DTYPE_FP16 : MT_DTYPE_BF16) : MT_DTYPE_FP32;
        mt__gemv(out, NULL, inp, weight, NULL, bias, BT, C, OC, round, stream);
        return;
    }
    // C = out, A(i=bt, k=c) = inp[bt*C + c] (k inner), B(j=o, k=c) = weight[o*C + c] (k inner)
    mt__gemm(impl, out, inp, weight, bias, BT, OC, C, C, C, OC, 1, 1, 0, dtype, stream);
}
// the same product for BT <= MT_GEMV_MAX_ROWS rows from weight16, the weight already rounded to
// dtype (MT_DTYPE_BF16 or MT_DTYPE_FP16) and stored in 16 bits: the same values as
// mt_matmul_forward_gpu on a tensor-core rung (which rounds each weight as it reads it), half the bytes
void mt_matmul_forward_rounded_weight_gpu(float *out, const float *inp, const void *weight16, const float *bias, int BT,
                                          int C, int OC, int dtype, cudaStream_t stream) {
    if (BT <= 0 || OC <= 0) return;
    if (BT > MT_GEMV_MAX_ROWS || (dtype != MT_DTYPE_BF16 && dtype != MT_DTYPE_FP16))
        mt_fatal("internal: a 16-bit weight GEMV of %d rows in dtype %d", BT, dtype);
    mt__gemv(out, NULL, inp, NULL, weight16, bias, BT, C, OC, dtype, stream);
}
// matches mt_matmul_backward_cpu (megatron.h, 3. OPS).
// in the forward pass this was: out[bt,o] = sum_c inp[bt,c] * weight[o,c] + bias[o]
// so now: dinp = dout @ weight (written with '=': no zeroing pass), dweight += dout^T @ inp,
// dbias += column sums of dout (accumulated over micro-batches). dinp may be NULL, dbias NULL
// when there is no bias, dweight NULL for dinp alone (inp then not read: a tensor-parallel
// layer's backward starts dinp's all-reduce before its weight gradient, megatron.h section 4).
// The wgmma rung's backward: the two products share dout, so one rounded copy (T: bf16 or fp16)
// serves both (for the LM head dout is the (BT, Vp) logits gradient, 824M elements at GPT-2
// small's batch: a cast is ~2 ms)
// With a bias, its gradient's column sums read dout anyway: the same pass writes the rounded copy
// (mt__column_sum_add_copy), one read of dout instead of two.
// gelu_inp: NULL, or dinp is the input gradient of a GELU's output and becomes the GELU input's,
// dinp = (dout @ weight) * gelu'(gelu_inp), in the dinp GEMM's epilogue (mt_matmul_backward_gelu_gpu)
static void mt__gelu_rounded(void *out, const void *inp, int inp16, size_t n, int f16, cudaStream_t stream);   // (GELU, below)
// the two products from dout16, dout already rounded to T (row stride ld_dout >= OC; the LM
// head's gradient comes in place of its 16-bit logits, mt_cross_entropy_finish16_kernel).
// The input: inp_t, already in T (a layer's ln1 / ln2 as the layernorm stored it), read as is; else
// inp, rounded into a copy; else (both NULL) gelu(gelu_inp), remade here rounded (the training MLP
// keeps only the GELU's input). gelu16: gelu_inp holds T values (the fc output kept in 16 bits), and
// dinp receives T values too (the GELU_GRAD16 epilogue). dinp16 (no GELU): dinp receives T values
// (the STORE16 epilogue: the attention output's gradient, megatron.h's mt_datty_gemm_dtype)
template <typename T>
static void mt__matmul_backward_wgmma_rounded(float *dinp, float *dweight, const T *dout16, int ld_dout,
                                              const float *inp, const T *inp_t, const float *weight,
                                              const void *gelu_inp, int gelu16, int dinp16, int BT, int C, int OC,
                                              cudaStream_t stream) {
    T *w16 = dinp ? mt__rounded_copy<T>(weight, OC, C, C, 1, stream) : NULL;
    T *inp16 = NULL;
    // the GELU remade by dinp's epilogue, which reads its 16-bit input anyway (GELU_GRAD16_GELU16)
    int remake = dweight && !inp_t && !inp && gelu16 && dinp;
    if (!dweight) {
        // dinp alone: the input is not read
    } else if (inp_t) {
        inp16 = (T *)inp_t;   // (not borrowed: not freed below)
    } else if (inp) {
        inp16 = mt__rounded_copy<T>(inp, BT, C, C, 1, stream);
    } else {
        mt__scratch_alloc((void **)&inp16, mt_gpu_rounded_copy_bytes((size_t)BT * C), stream);
        if (!remake) mt__gelu_rounded(inp16, gelu_inp, gelu16, (size_t)BT * C, mt__f16_flag(inp16), stream);
    }
    if (dinp) {   // '='
        int op = gelu_inp ? (gelu16 ? (remake ? MT__EPI_GELU_GRAD16_GELU16 : MT__EPI_GELU_GRAD16) : MT__EPI_GELU_GRAD)
                          : dinp16 ? MT__EPI_STORE16 : MT__EPI_NONE;
        // (STORE16 writes at c2 only; GELU_GRAD16_GELU16 writes the remade GELU there)
        mt__epilogue epi = {op, gelu_inp, dinp16 ? (void *)dinp : remake ? (void *)inp16 : NULL};
        mt__gemm_wgmma_any(dinp, dout16, w16, mt__f16_flag(dout16), NULL, BT, C, OC, ld_dout, C, C, 1, 0, 0, 0, &epi,
                           stream);
    }
    if (dweight) mt__gemm_wgmma(dweight, dout16, inp16, NULL, OC, C, BT, ld_dout, C, C, 0, 0, 1, stream);
    if (w16) mt__rounded_free(w16, stream);
    if (inp16 && !inp_t) mt__rounded_free(inp16, stream);
}
template <typename T>
static void mt__matmul_backward_wgmma(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                                      const T *inp_t, const float *weight, const void *gelu_inp, int gelu16,
                                      int dinp16, int BT, int C, int OC, cudaStream_t stream) {
    T *dout16;
    if (dbias && mt__aligned16(dout)) {   // OC % 8 == 0 here (the wgmma rung's condition)
        mt__scratch_alloc((void **)&dout16, ((size_t)BT * OC + 8) * sizeof(T), stream);
        mt__column_sum_add_copy<T>(dbias, dout, dout16, BT, OC, stream);
    } else {
        dout16 = mt__rounded_copy<T>(dout, BT, OC, OC, 1, stream);
        if (dbias) mt__column_sum_add(dbias, dout, BT, OC, stream);
    }
    mt__matmul_backward_wgmma_rounded<T>(dinp, dweight, dout16, OC, inp, inp_t, weight, gelu_inp, gelu16, dinp16, BT,
                                         C, OC, stream);
    mt__rounded_free(dout16, stream);
}
// the backward from a gradient already in 16 bits (grad_dtype MT_DTYPE_BF16 or FP16: (BT, OC)
// values, row stride OC), the wgmma rung only: the LM head's, which mt_cross_entropy_finish_gpu
// wrote in place of the 16-bit logits (no bias; megatron.h's mt_logits_grad_dtype says when), and
// the MLP's fc, whose output gradient fc-proj's backward wrote in 16 bits (mt_fch_storage_dtype).
// The same products as mt_matmul_backward_gpu on an fp32 gradient, whose rounded copy would hold
// these 16-bit values; dbias (NULL: none) sums the 16-bit values (mt__column_sum16_add). The input:
// inp16, already in grad_dtype's 16 bits (a layer's ln2), or else inp, rounded into a copy.
template <typename T>
static void mt__matmul_backward_dout16(float *dinp, float *dweight, float *dbias, const T *dout16, const float *inp,
                                       const void *inp16, const float *weight, int BT, int C, int OC,
                                       cudaStream_t stream) {
    if (dbias) mt__column_sum16_add<T>(dbias, dout16, BT, OC, stream);
    mt__matmul_backward_wgmma_rounded<T>(dinp, dweight, dout16, OC, inp16 ? NULL : inp, (const T *)inp16, weight, NULL,
                                         0, 0, BT, C, OC, stream);
}
void mt_matmul_backward_dout16_gpu(float *dinp, float *dweight, float *dbias, const void *dout16, const float *inp,
                                   const void *inp16, const float *weight, int BT, int C, int OC, int grad_dtype,
                                   cudaStream_t stream) {
    if (BT <= 0 || C <= 0 || OC <= 0) return;
    if (C % 8 != 0 || OC % 8 != 0 || (grad_dtype != MT_DTYPE_BF16 && grad_dtype != MT_DTYPE_FP16))
        mt_fatal("internal: a matmul backward from a 16-bit gradient off the wgmma rung (C %d, OC %d, dtype %d)", C, OC,
                 grad_dtype);
    if (grad_dtype == MT_DTYPE_FP16)
        mt__matmul_backward_dout16<__half>(dinp, dweight, dbias, (const __half *)dout16, inp, inp16, weight, BT, C, OC,
                                           stream);
    else
        mt__matmul_backward_dout16<__nv_bfloat16>(dinp, dweight, dbias, (const __nv_bfloat16 *)dout16, inp, inp16,
                                                  weight, BT, C, OC, stream);
}
void mt_matmul_backward_gpu(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                            const float *weight, int BT, int C, int OC, mt_gemm_impl impl, int dtype,
                            cudaStream_t stream) {
    if (impl == MT_GEMM_WGMMA && C % 8 == 0 && OC % 8 == 0 && BT > 0 && C > 0 && OC > 0) {
        if (dtype == MT_DTYPE_FP16)
            mt__matmul_backward_wgmma<__half>(dinp, dweight, dbias, dout, inp, NULL, weight, NULL, 0, 0, BT, C, OC,
                                              stream);
        else mt__matmul_backward_wgmma<__nv_bfloat16>(dinp, dweight, dbias, dout, inp, NULL, weight, NULL, 0, 0, BT, C,
                                                      OC, stream);
        return;
    }
    // dinp (BT,C): A(i=bt, k=o) = dout[bt*OC + o] (k inner), B(j=c, k=o) = weight[o*C + c] (k outer)
    if (dinp) mt__gemm(impl, dinp, dout, weight, NULL, BT, C, OC, OC, C, C, 1, 0, 0, dtype, stream);
    // dweight (OC,C): A(i=o, k=bt) = dout[bt*OC + o] (k outer), B(j=c, k=bt) = inp[bt*C + c] (k outer)
    if (dweight) mt__gemm(impl, dweight, dout, inp, NULL, OC, C, BT, OC, C, C, 0, 0, 1, dtype, stream);
    if (dbias) mt__column_sum_add(dbias, dout, BT, OC, stream);
}
// the same with inp already in dtype's 16 bits (MT_DTYPE_BF16 / FP16): a layer's ln1 or ln2 as the
// layernorm stored it (mt_ln_storage_dtype), read as is, where the wgmma rung runs both products
// (megatron.h's mt_ln_gemm_dtype says when; anywhere else is an internal error)
void mt_matmul_backward_inp16_gpu(float *dinp, float *dweight, float *dbias, const float *dout, const void *inp16,
                                  const float *weight, int BT, int C, int OC, mt_gemm_impl impl, int dtype,
                                  cudaStream_t stream) {
    if (BT <= 0 || C <= 0 || OC <= 0) return;
    if (impl != MT_GEMM_WGMMA || C % 8 != 0 || OC % 8 != 0 || (dtype != MT_DTYPE_BF16 && dtype != MT_DTYPE_FP16))
        mt_fatal("internal: a matmul backward from a 16-bit input off the wgmma rung (C %d, OC %d, dtype %d)", C, OC,
                 dtype);
    if (dtype == MT_DTYPE_FP16)
        mt__matmul_backward_wgmma<__half>(dinp, dweight, dbias, dout, NULL, (const __half *)inp16, weight, NULL, 0, 0,
                                          BT, C, OC, stream);
    else
        mt__matmul_backward_wgmma<__nv_bfloat16>(dinp, dweight, dbias, dout, NULL, (const __nv_bfloat16 *)inp16, weight,
                                                 NULL, 0, 0, BT, C, OC, stream);
}

// the same as mt_matmul_backward_gpu on the wgmma rung, with dinp written in dtype's 16 bits
// (MT_DTYPE_BF16 / FP16; dinp 16-byte aligned, half its floats used): the attention projection's
// backward, whose input gradient only the attention's backward reads, in 16 bits (megatron.h's
// mt_datty_gemm_dtype says when; anywhere else is an internal error). The same values as the fp32
// dinp rounded; dweight and dbias as mt_matmul_backward_gpu's
// inp16: NULL, or the input already in dtype's 16 bits (a training layer's attention output,
// megatron.h's mt_atty_storage_dtype; then inp is not read), read as it is
void mt_matmul_backward_dinp16_gpu(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                                   const void *inp16, const float *weight, int BT, int C, int OC, int dtype,
                                   cudaStream_t stream) {
    if (BT <= 0 || C <= 0 || OC <= 0) return;
    if (C % 8 != 0 || OC % 8 != 0 || (dtype != MT_DTYPE_BF16 && dtype != MT_DTYPE_FP16) || !mt__aligned16(dinp) ||
        (inp16 && !mt__aligned16(inp16)))
        mt_fatal("internal: a matmul backward into a 16-bit dinp off the wgmma rung (C %d, OC %d, dtype %d)", C, OC,
                 dtype);
    if (dtype == MT_DTYPE_FP16)
        mt__matmul_backward_wgmma<__half>(dinp, dweight, dbias, dout, inp16 ? NULL : inp, (const __half *)inp16, weight,
                                          NULL, 0, 1, BT, C, OC, stream);
    else
        mt__matmul_backward_wgmma<__nv_bfloat16>(dinp, dweight, dbias, dout, inp16 ? NULL : inp,
                                                 (const __nv_bfloat16 *)inp16, weight, NULL, 0, 1, BT, C, OC, stream);
}

void mt_gelu_forward_gpu(float *out, const float *inp, size_t N, cudaStream_t stream);                       // below
void mt_gelu_backward_gpu(float *dinp, const float *inp, const float *dout, size_t N, cudaStream_t stream);  // below
// ---------------------------------------------------------------------------------------------
// the MLP's first linear and its GELU as one op (matches mt_matmul_forward_gelu_cpu and
// mt_matmul_backward_gelu_cpu, megatron.h, 3. OPS): the GELU rides in the GEMM's epilogue while
// the product is in registers, instead of a kernel that reads it back (a pass over (BT, OC) less
// each way: GPT-2 small, 16 x 1024 x 3072 floats, 200 MB per layer).
// forward: pre = inp @ weight^T + bias, out = gelu(pre). weight16: NULL, or the 16-bit copy of
// weight (decoding, for BT <= MT_GEMV_MAX_ROWS). The wgmma rung and the GEMV fuse; other rungs run
// the GEMM, then the GELU kernel.
void mt_matmul_forward_gelu_gpu(float *pre, float *out, const float *inp, const float *weight, const void *weight16,
                                const float *bias, int BT, int C, int OC, mt_gemm_impl impl, int dtype,
                                cudaStream_t stream) {
    if (BT <= 0 || OC <= 0) return;
    int tensor_cores = impl == MT_GEMM_MMA || impl == MT_GEMM_WGMMA;
    int round = tensor_cores ? (dtype == MT_DTYPE_FP16 ? MT_DTYPE_FP16 : MT_DTYPE_BF16) : MT_DTYPE_FP32;
    if (BT <= MT_GEMV_MAX_ROWS) {
        mt__gemv(pre, out, inp, weight, round == MT_DTYPE_FP32 ? NULL : weight16, bias, BT, C, OC, round, stream);
        return;
    }
    if (impl == MT_GEMM_WGMMA && C % 8 == 0) {
        mt__epilogue epi = {MT__EPI_GELU, NULL, out};   // C = out as mt_matmul_forward_gpu's GEMM, plus C2
        if (dtype == MT_DTYPE_FP16)
            mt__gemm_wgmma_rounded<__half>(pre, inp, weight, bias, BT, OC, C, C, C, OC, 1, 1, 0, &epi, stream);
        else mt__gemm_wgmma_rounded<__nv_bfloat16>(pre, inp, weight, bias, BT, OC, C, C, C, OC, 1, 1, 0, &epi, stream);
        return;
    }
    mt_matmul_forward_gpu(pre, inp, weight, bias, BT, C, OC, impl, dtype, stream);
    mt_gelu_forward_gpu(out, pre, (size_t)BT * OC, stream);
}
// backward, of a linear whose input came out of a GELU (the MLP's second linear): in the forward
// pass this was out = gelu(x) @ weight^T + bias with inp = gelu(x), so now
//   dx = (dout @ weight) * gelu'(x)   (written '='; dx is dinp, the GELU input's gradient)
//   dweight += dout^T @ inp, dbias += column sums of dout, as mt_matmul_backward_gpu.
// gelu_inp = x (BT, C). The wgmma rung multiplies by gelu'(x) in the dinp GEMM's epilogue; other
// rungs: the GEMM into scratch, then the GELU backward kernel. inp may be NULL: then it is remade
// from gelu_inp (the training MLP does not keep gelu(x): mt_mlp_forward_gpu). gelu_dtype: how x is
// stored: MT_DTYPE_FP32, or dtype's 16 bits (the training MLP's fc output on the wgmma rung,
// megatron.h's mt_fch_storage_dtype), read as is; then dx is written in the same 16 bits (the
// GELU_GRAD16 epilogue rounds it: what the fc backward's GEMMs would round it to), half the floats
// of dinp used
void mt_matmul_backward_gelu_gpu(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                                 const float *weight, const void *gelu_inp, int gelu_dtype, int BT, int C, int OC,
                                 mt_gemm_impl impl, int dtype, cudaStream_t stream) {
    if (BT <= 0 || C <= 0 || OC <= 0) return;
    int gelu16 = gelu_dtype != MT_DTYPE_FP32;
    if (impl == MT_GEMM_WGMMA && C % 8 == 0 && OC % 8 == 0) {
        if (gelu16 && gelu_dtype != dtype) mt_fatal("internal: the GELU's input in dtype %d, the GEMMs in %d", gelu_dtype, dtype);
        if (dtype == MT_DTYPE_FP16)
            mt__matmul_backward_wgmma<__half>(dinp, dweight, dbias, dout, inp, NULL, weight, gelu_inp, gelu16, 0, BT, C, OC,
                                              stream);
        else
            mt__matmul_backward_wgmma<__nv_bfloat16>(dinp, dweight, dbias, dout, inp, NULL, weight, gelu_inp, gelu16, 0, BT,
                                                     C, OC, stream);
        return;
    }
    if (gelu16) mt_fatal("internal: a 16-bit GELU input off the wgmma rung");
    float *d_gelu_out, *remade = NULL;   // dL/d gelu(x), then through the GELU; gelu(x) itself if inp is NULL
    mt__scratch_alloc((void **)&d_gelu_out, (size_t)BT * C * sizeof(float), stream);
    if (!inp) {
        mt__scratch_alloc((void **)&remade, (size_t)BT * C * sizeof(float), stream);
        mt_gelu_forward_gpu(remade, (const float *)gelu_inp, (size_t)BT * C, stream);
        inp = remade;
    }
    mt_matmul_backward_gpu(d_gelu_out, dweight, dbias, dout, inp, weight, BT, C, OC, impl, dtype, stream);
    mt_gelu_backward_gpu(dinp, (const float *)gelu_inp, d_gelu_out, (size_t)BT * C, stream);
    mt__scratch_free(d_gelu_out, stream);
    if (remade) mt__scratch_free(remade, stream);
}

// the MLP's two products in a training forward (matches mt_mlp_forward_cpu, megatron.h, 3. OPS):
//   fch (BT,F) = inp (BT,C) @ fcw^T + fcb      kept for the backward
//   out (BT,OC) = gelu(fch) @ fcprojw^T (+ fcprojb when not NULL)
// gelu(fch) is never stored: on the wgmma rung the fc GEMM's GELU16 epilogue writes it in 16 bits
// into scratch, which fc-proj's GEMM reads as its A operand as is (the values its own cast would
// have made); the backward remakes it from fch (mt_matmul_backward_gelu_gpu with inp = NULL).
// Other rungs: gelu(fch) in fp32 scratch between the two products.
// inp_dtype: MT_DTYPE_FP32, or inp already in dtype's 16 bits (a layer's ln2, mt_ln_storage_dtype:
// the wgmma rung only), which the fc GEMM reads as is. fch_dtype: how fch is kept, MT_DTYPE_FP32
// or (the wgmma rung, megatron.h's mt_fch_storage_dtype) dtype's 16 bits: then the epilogue rounds
// fch and takes the GELU of the rounded values (STORE16_GELU16), so the backward's gelu'(fch) and
// remade gelu(fch) see exactly what the forward used.
template <typename T>
static void mt__mlp_forward_wgmma(float *fch, int fch16, float *out, const float *inp, int inp16, const float *fcw,
                                  const float *fcb, const float *fcprojw, const float *fcprojb, const float *residual,
                                  int BT, int C, int F, int OC, cudaStream_t stream) {
    T *h16;
    mt__scratch_alloc((void **)&h16, mt_gpu_rounded_copy_bytes((size_t)BT * F), stream);
    mt__epilogue epi = {fch16 ? MT__EPI_STORE16_GELU16 : MT__EPI_GELU16, NULL, h16};
    if (inp16) mt__gemm_wgmma_a16<T>(fch, (const T *)inp, fcw, fcb, BT, F, C, C, C, F, 1, 1, 0, &epi, stream);
    else mt__gemm_wgmma_rounded<T>(fch, inp, fcw, fcb, BT, F, C, C, C, F, 1, 1, 0, &epi, stream);
    T *w16 = mt__rounded_copy<T>(fcprojw, OC, F, F, 1, stream);
    mt__epilogue add = {MT__EPI_RESIDUAL, residual, NULL};   // out = residual + (gelu(fch) W + b), where asked
    mt__gemm_wgmma_any(out, h16, w16, mt__f16_flag(w16), fcprojb, BT, OC, F, F, F, OC, 1, 1, 0, 0,
                       residual ? &add : NULL, stream);
    mt__rounded_free(w16, stream);
    mt__scratch_free(h16, stream);
}
void mt_mlp_forward_gpu(float *fch, int fch_dtype, float *out, const float *inp, int inp_dtype, const float *fcw,
                        const float *fcb, const float *fcprojw, const float *fcprojb, const float *residual, int BT,
                        int C, int F, int OC, mt_gemm_impl impl, int dtype, cudaStream_t stream) {
    if (BT <= 0 || F <= 0 || OC <= 0) return;
    int inp16 = inp_dtype != MT_DTYPE_FP32, fch16 = fch_dtype != MT_DTYPE_FP32;
    if (impl == MT_GEMM_WGMMA && C % 8 == 0 && F % 8 == 0 && BT > MT_GEMV_MAX_ROWS) {
        if (inp16 && inp_dtype != dtype) mt_fatal("internal: the MLP's input in dtype %d, its GEMMs in %d", inp_dtype, dtype);
        if (fch16 && fch_dtype != dtype) mt_fatal("internal: the MLP's fc output in dtype %d, its GEMMs in %d", fch_dtype, dtype);
        if (dtype == MT_DTYPE_FP16)
            mt__mlp_forward_wgmma<__half>(fch, fch16, out, inp, inp16, fcw, fcb, fcprojw, fcprojb, residual, BT, C, F, OC,
                                          stream);
        else
            mt__mlp_forward_wgmma<__nv_bfloat16>(fch, fch16, out, inp, inp16, fcw, fcb, fcprojw, fcprojb, residual, BT, C,
                                                 F, OC, stream);
        return;
    }
    if (inp16 || fch16) mt_fatal("internal: a 16-bit MLP input or fc output off the wgmma rung");
    float *h;
    mt__scratch_alloc((void **)&h, (size_t)BT * F * sizeof(float), stream);
    mt_matmul_forward_gelu_gpu(fch, h, inp, fcw, NULL, fcb, BT, C, F, impl, dtype, stream);
    mt_matmul_forward_gpu(out, h, fcprojw, fcprojb, BT, F, OC, impl, dtype, stream);
    if (residual) mt_residual_forward_gpu(out, residual, out, (size_t)BT * OC, stream);   // (other rungs: a pass)
    mt__scratch_free(h, stream);
}

// a forward product stored in 16 bits: out16 (BT, OC) = inp (BT, C) @ weight^T + bias (bias may be
// NULL), in dtype's 16 bits (BF16 or FP16; out16 16-byte aligned). Two users: the attention's q, k,
// v projection in a training forward, stored as the tensor-core attention reads it (the attention
// kernels take it as is, mt_attention_forward16_gpu and the backward's twin, instead of rounding an
// fp32 qkv into a copy in the forward and again in the backward); and the LM head's logits, which the
// cross-entropy reads in 16 bits (megatron.h's mt_logits_storage_dtype). The same values: the wgmma
// GEMM's STORE16 epilogue rounds what it would have stored in fp32 (round(sum + bias)); other rungs:
// fp32 scratch, then the cast.
// inp_dtype: MT_DTYPE_FP32, or inp already in dtype's 16 bits (a layer's ln1, mt_ln_storage_dtype:
// the wgmma rung only), read as is.
template <typename T>
static void mt__matmul_forward16_wgmma(void *out16, const float *inp, int inp16, const float *weight, const float *bias,
                                       int BT, int C, int OC, cudaStream_t stream) {
    mt__epilogue epi = {MT__EPI_STORE16, NULL, out16};
    if (inp16) mt__gemm_wgmma_a16<T>(NULL, (const T *)inp, weight, bias, BT, OC, C, C, C, OC, 1, 1, 0, &epi, stream);
    else mt__gemm_wgmma_rounded<T>(NULL, inp, weight, bias, BT, OC, C, C, C, OC, 1, 1, 0, &epi, stream);
}
void mt_matmul_forward16_gpu(void *out16, const float *inp, int inp_dtype, const float *weight, const float *bias,
                             int BT, int C, int OC, mt_gemm_impl impl, int dtype, cudaStream_t stream) {
    if (BT <= 0 || OC <= 0) return;
    if (dtype != MT_DTYPE_BF16 && dtype != MT_DTYPE_FP16) mt_fatal("internal: a 16-bit product in dtype %d", dtype);
    int inp16 = inp_dtype != MT_DTYPE_FP32;
    if (inp16 && inp_dtype != dtype) mt_fatal("internal: a 16-bit product's input in dtype %d, its output in %d", inp_dtype, dtype);
    if (impl == MT_GEMM_WGMMA && C % 8 == 0 && BT > MT_GEMV_MAX_ROWS) {
        if (dtype == MT_DTYPE_FP16) mt__matmul_forward16_wgmma<__half>(out16, inp, inp16, weight, bias, BT, C, OC, stream);
        else mt__matmul_forward16_wgmma<__nv_bfloat16>(out16, inp, inp16, weight, bias, BT, C, OC, stream);
        return;
    }
    if (inp16) mt_fatal("internal: a 16-bit product's 16-bit input off the wgmma rung");
    float *y;
    mt__scratch_alloc((void **)&y, (size_t)BT * OC * sizeof(float), stream);
    mt_matmul_forward_gpu(y, inp, weight, bias, BT, C, OC, impl, dtype, stream);
    if (dtype == MT_DTYPE_FP16) mt__cast_to((__half *)out16, y, (size_t)BT * OC, stream);
    else mt__cast_to((__nv_bfloat16 *)out16, y, (size_t)BT * OC, stream);
    mt__scratch_free(y, stream);
}

// out (BT,OC) = inp @ weight^T + bias in fp32, from inp already in dtype's 16 bits (MT_DTYPE_BF16 /
// FP16, 16-byte aligned, half its floats: a training layer's attention output, megatron.h's
// mt_atty_storage_dtype), read as it is by the wgmma rung: the product mt_matmul_forward_gpu would
// make from the fp32 values these 16 bits widen to, without their rounded copy. The wgmma rung only
// (megatron.h's mt_atty_gemm_dtype says when; anywhere else is an internal error).
void mt_matmul_forward_inp16_gpu(float *out, const void *inp16, int inp_dtype, const float *weight, const float *bias,
                                 const float *residual, int BT, int C, int OC, mt_gemm_impl impl, cudaStream_t stream) {
    if (BT <= 0 || OC <= 0) return;
    if (impl != MT_GEMM_WGMMA || C % 8 != 0 || BT <= MT_GEMV_MAX_ROWS || !mt__aligned16(inp16) ||
        (inp_dtype != MT_DTYPE_BF16 && inp_dtype != MT_DTYPE_FP16))
        mt_fatal("internal: a product from a 16-bit input off the wgmma rung (BT %d, C %d, dtype %d)", BT, C, inp_dtype);
    // C = out, A(i=bt, k=c) = inp16 (k inner), B(j=o, k=c) = weight (k inner), as mt_matmul_forward_gpu;
    // with a residual: C = residual + that (the RESIDUAL epilogue: the attention projection's residual2)
    mt__epilogue add = {MT__EPI_RESIDUAL, residual, NULL};
    const mt__epilogue *epi = residual ? &add : NULL;
    if (inp_dtype == MT_DTYPE_FP16)
        mt__gemm_wgmma_a16<__half>(out, (const __half *)inp16, weight, bias, BT, OC, C, C, C, OC, 1, 1, 0, epi, stream);
    else
        mt__gemm_wgmma_a16<__nv_bfloat16>(out, (const __nv_bfloat16 *)inp16, weight, bias, BT, OC, C, C, C, OC, 1, 1, 0,
                                          epi, stream);
}

// ---------------------------------------------------------------------------------------------
// dropout with a counter-based mask
// matches mt_dropout_forward_cpu / mt_dropout_backward_cpu (megatron.h, 3. OPS). In place.
// x (B, d->T_local, d->C) -> x * mask / (1-p), mask = [uniform(key, global index) >= p],
// global index = ((sample_offset + b)*T + t_offset + t)*C + c. Local element i = b*row + j
// (row = T_local*C floats of a sample) is global element first_index + b*T*C + j, with
// first_index = (sample_offset*T + t_offset)*C; when the tensor holds whole samples (row = T*C)
// that is first_index + i.
// One thread per element; the backward is the same kernel on dx (the mask is asked again).
__global__ void mt_dropout_kernel(float *x, size_t n, uint64_t prefix, float p, float scale, uint64_t first_index,
                                  size_t row, uint64_t sample_stride) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    uint64_t g = first_index + (uint64_t)(i / row) * sample_stride + (uint64_t)(i % row);
    x[i] = mt__gpu_rand_uniform(prefix, g) >= p ? x[i] * scale : 0.0f;
}
void mt_dropout_forward_gpu(float *x, const mt_dropout *d, int B, cudaStream_t stream) {
    if (d->p <= 0.0f) return;
    size_t row = (size_t)d->T_local * d->C, n = (size_t)B * row;
    if (n == 0) return;
    float scale = 1.0f / (1.0f - d->p);
    uint64_t first_index = ((uint64_t)d->sample_offset * (uint64_t)d->T + (uint64_t)d->t_offset) * (uint64_t)d->C;
    uint64_t sample_stride = (uint64_t)d->T * (uint64_t)d->C;
    mt_dropout_kernel<<<mt__blocks(n, 256), 256, 0, stream>>>(x, n, mt__dropout_prefix(d), d->p, scale, first_index,
                                                              row, sample_stride);
    mt__launch_check("mt_dropout_kernel", stream);
}
// in the forward pass this was: y = x * mask / (1-p); so dx = dy * mask / (1-p), in place on dy
void mt_dropout_backward_gpu(float *dx, const mt_dropout *d, int B, cudaStream_t stream) {
    mt_dropout_forward_gpu(dx, d, B, stream);
}

// ---------------------------------------------------------------------------------------------
// causal self-attention: FlashAttention-2 (Dao, 2023)
// matches mt_attention_forward_cpu / mt_attention_backward_cpu (megatron.h, 3. OPS), the same
// arguments and the same saved statistic: no T x T matrix is ever formed, only the log-sum-exp
// of each row is kept,
//   lse[b,h,t] = log sum_{t2<=t} exp(s[t,t2]),  s[t,t2] = q_t . k_t2 / sqrt(hs),
// from which the backward recomputes p[t,t2] = exp(s[t,t2] - lse[t]) tile by tile (the CPU
// recomputes it row by row).
// Shapes as the CPU: qkv (B,T,3*C_local) = [Q | K | V], head h in columns [h*hs, (h+1)*hs) of
// each; out (B,T,C_local); lse (B,NH_local,T); dqkv (B,T,3*C_local), written with '='.
// Dropout on the probabilities: p' = p * mask / (1-p_drop) with the CPU's mask, element (t, t2)
// of head h being global index (((sample_offset+b)*NH_global + head_offset+h)*T + t)*T + t2.
// Forward (per block: a tile of queries of one (b, h)):
//   for each key tile up to the diagonal (the causal skip: later tiles are never touched):
//     S = Q K^T * scale (masked above the diagonal); m_new = max(m, rowmax S)
//     P = exp(S - m_new); l = l * exp(m - m_new) + rowsum P; O = O * exp(m - m_new) + dropout(P) V
//   out = O / l;  lse = m + log l
// Backward: D[t] = rowsum(dout_t * out_t) first (= sum_t2 p dp, the softmax backward's dot,
// dropout included). Then two kernels, so that no output needs atomics (deterministic):
//   dK, dV: a block per key tile walks the query tiles from the diagonal down:
//     P = exp(S - lse);  P' = dropout(P);  dV += P'^T dO;  dP = dropout(dO V^T);
//     dS = P * (dP - D);  dK += dS^T Q * scale
//   dQ: a block per query tile walks the key tiles up to the diagonal: dQ += dS K * scale
// (recomputing S and dP in both costs 7 tile products instead of FA2's 5, the price of no atomics;
// the wgmma pair hands dS over instead: THE dS HAND-OFF, below)
// Two versions of each kernel, the same algorithm:
//   mt_attention_*_kernel       fp32 on CUDA cores, 32x32 tiles, 4 threads per row. The reading version.
//   mt_attention_*_kernel_mma   bf16 tensor cores: 4 warps x 16 rows; S and dP in fp32 mma
//                               accumulators, reused in registers as the A operand of the next
//                               product (the C and A fragment layouts line up). The launcher rounds
//                               qkv (and dout) to bf16 copies first; the kernels copy their tiles
//                               with cp.async into a two-stage ring of shared memory, so the next
//                               tile arrives while the tensor cores work on this one.
// Head sizes 16, 32, 64 and 128 (a template argument, so per-thread rows live in registers).
typedef struct {
    const float *qkv;          // (B, T, 3*C_local)
    const __nv_bfloat16 *qkv16;   // the same rounded to bf16, or to fp16 bits (--fp16): the
    const __nv_bfloat16 *dout16;  // tensor-core kernels read these; dout likewise (backward)
    float *out;                // (B, T, C_local): written by the forward, read by the backward
    float *lse;                // (B, NH_local, T): written by the forward, read by the backward
    const float *dout;         // (B, T, C_local)
    float *dsum;               // (B, NH_local, T): D = rowsum(dout * out), backward scratch
    float *dqkv;               // (B, T, 3*C_local), written with '='
    unsigned short *dqkv16;    // or, when not NULL (tensor-core kernels only), dqkv in their 16 bits
                               // (bf16, or fp16 with --fp16): the qkv GEMM's backward reads it so
    int B, T, C_local, NH_local;
    float scale;               // 1/sqrt(hs)
    float p_drop, keep_scale;  // dropout probability and 1/(1-p_drop)
    uint64_t drop_prefix;      // the dropout site's RNG prefix
    int sample_offset, head_offset, NH_global;
} mt__attention_args;

// the dropout multiplier of probability (t, t2) of head h of sample b: 1/(1-p) if kept, else 0
__device__ static inline float mt__attention_keep(const mt__attention_args &a, int b, int h, int t, int t2) {
    uint64_t row = (((uint64_t)(a.sample_offset + b) * a.NH_global + a.head_offset + h) * a.T + t) * a.T;
    return mt__gpu_rand_uniform(a.drop_prefix, row + t2) >= a.p_drop ? a.keep_scale : 0.0f;
}
extern __shared__ float4 mt__att_smem[];   // the dynamic shared memory of the attention kernels

// ---- fp32 path -------------------------------------------------------------------------------
// copy 32 rows of HS floats (global row stride ld, first row t0, rows >= T read as 0) to shared
// memory with row stride HS + 1 (the +1 puts the rows that a warp reads together in different banks)
// (blockDim.x = 128: each thread moves HS/4 floats, in batches of up to 16 whose loads are all
// issued before the first store, so that their latencies overlap)
template <int HS>
__device__ static inline void mt__att_load_f32(float *dst, const float *src, size_t ld, int t0, int T) {
    const int per_thread = HS / 4, batch = per_thread < 16 ? per_thread : 16;
    for (int i0 = 0; i0 < per_thread; i0 += batch) {
        float v[batch];
#pragma unroll
        for (int i = 0; i < batch; i++) {
            int e = threadIdx.x + 128 * (i0 + i), r = e / HS, d = e % HS;
            v[i] = t0 + r < T ? src[(size_t)(t0 + r) * ld + d] : 0.0f;
        }
#pragma unroll
        for (int i = 0; i < batch; i++) {
            int e = threadIdx.x + 128 * (i0 + i), r = e / HS, d = e % HS;
            dst[r * (HS + 1) + d] = v[i];
        }
    }
}
template <int HS>
__device__ static inline float mt__dot_f32(const float *x, const float *y) {
    float s = 0.0f;
    for (int d = 0; d < HS; d++) s += x[d] * y[d];
    return s;
}

// matches mt_attention_forward_cpu (megatron.h, 3. OPS); writes out and lse with '='.
// grid (T/32 query tiles, B*NH_local), 128 threads: thread (r = tid/4, quarter = tid%4) owns query
// row r of the tile, the key columns quarter + 4j (j < 8) of each 32-key tile, and the output
// channels quarter + 4i (i < HS/4). The 4 threads of a row are neighbouring lanes and combine
// their row max / row sum with two xor-shuffles. Query tiles run longest first.
// shared: Q, K, V tiles (32 x (HS+1)) and the tile's probabilities P (32 x 33).
template <int HS>
__global__ void __launch_bounds__(128) mt_attention_forward_kernel(mt__attention_args a) {
    float *Qs = (float *)mt__att_smem, *Ks = Qs + 32 * (HS + 1), *Vs = Ks + 32 * (HS + 1), *Ps = Vs + 32 * (HS + 1);
    int r = threadIdx.x / 4, quarter = threadIdx.x % 4;
    int qt = gridDim.x - 1 - blockIdx.x, b = blockIdx.y / a.NH_local, h = blockIdx.y % a.NH_local;
    int T = a.T, t = qt * 32 + r;
    size_t C3 = 3 * (size_t)a.C_local;
    const float *q_base = a.qkv + (size_t)b * T * C3 + h * HS, *k_base = q_base + a.C_local, *v_base = q_base + 2 * a.C_local;
    mt__att_load_f32<HS>(Qs, q_base, C3, qt * 32, T);
    float m = -INFINITY, l = 0.0f, o[HS / 4];
    #pragma unroll
    for (int i = 0; i < HS / 4; i++) o[i] = 0.0f;
    int last_key = min(T - 1, qt * 32 + 31);
    for (int kt = 0; kt * 32 <= last_key; kt++) {
        __syncthreads();   // the previous K, V, P are no longer read
        mt__att_load_f32<HS>(Ks, k_base, C3, kt * 32, T);
        mt__att_load_f32<HS>(Vs, v_base, C3, kt * 32, T);
        __syncthreads();
        // scores of my 8 keys, masked above the diagonal
        float s[8], tile_max = -INFINITY;
        #pragma unroll
        for (int j = 0; j < 8; j++) {
            int key = kt * 32 + quarter + 4 * j;
            s[j] = key <= t && key < T ? mt__dot_f32<HS>(Qs + r * (HS + 1),
                                                         Ks + (quarter + 4 * j) * (HS + 1)) * a.scale : -INFINITY;
            tile_max = fmaxf(tile_max, s[j]);
        }
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
        // online softmax: rescale what was summed so far to the new max
        float m_new = fmaxf(m, tile_max);
        float corr = expf(m - m_new);
        float sum = 0.0f;
        #pragma unroll
        for (int j = 0; j < 8; j++) {
            float p = expf(s[j] - m_new);
            sum += p;
            if (a.p_drop > 0.0f && p > 0.0f) p *= mt__attention_keep(a, b, h, t, kt * 32 + quarter + 4 * j);
            Ps[r * 33 + quarter + 4 * j] = p;
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        l = l * corr + sum;
        m = m_new;
        __syncwarp();   // the row's 4 threads (one warp) wrote Ps[r][:]
        #pragma unroll
        for (int i = 0; i < HS / 4; i++) o[i] *= corr;
        for (int c = 0; c < 32; c++) {
            float p = Ps[r * 33 + c];
            #pragma unroll
            for (int i = 0; i < HS / 4; i++) o[i] += p * Vs[c * (HS + 1) + quarter + 4 * i];
        }
    }
    if (t >= T) return;
    float *dst = a.out + ((size_t)b * T + t) * a.C_local + h * HS;
    #pragma unroll
    for (int i = 0; i < HS / 4; i++) dst[quarter + 4 * i] = o[i] / l;
    if (quarter == 0) a.lse[((size_t)b * a.NH_local + h) * T + t] = m + logf(l);
}

// D[b,h,t] = sum_d dout[b,t,h*hs+d] * out[b,t,h*hs+d]; one warp per (b, t, h). Writes '='.
// (The scalar version: any alignment. mt_attention_backward_preprocess_vec_kernel below is the fast one.)
// DOUT16 as there: dO from a.dout16 (1 bf16, 2 fp16), or a.dout (0); OUT16 as there
template <int DOUT16, int OUT16>
__global__ void mt_attention_backward_preprocess_kernel(mt__attention_args a, int hs) {
    mt__pdl_start();   // (launched with programmatic dependent launch inside a training graph)
    size_t w = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    int lane = threadIdx.x % 32;
    if (w >= (size_t)a.B * a.T * a.NH_local) return;
    int h = (int)(w % a.NH_local);
    size_t bt = w / a.NH_local;
    int t = (int)(bt % a.T), b = (int)(bt / a.T);
    const float *o = a.out + bt * a.C_local + h * hs, *d = a.dout + bt * a.C_local + h * hs;
    const __nv_bfloat16 *d16 = a.dout16 + bt * a.C_local + h * hs;
    const __nv_bfloat16 *o16 = (const __nv_bfloat16 *)a.out + bt * a.C_local + h * hs;   // (OUT16)
    float s = 0.0f;
    for (int i = lane; i < hs; i += 32) {
        float oi = !OUT16 ? o[i] : DOUT16 == 2 ? mt__to_float(((const __half *)o16)[i]) : mt__to_float(o16[i]);
        s += oi * (DOUT16 == 1 ? mt__to_float(d16[i]) : DOUT16 == 2 ? mt__to_float(((const __half *)d16)[i]) : d[i]);
    }
    s = mt__warp_sum(s);
    if (lane == 0) a.dsum[((size_t)b * a.NH_local + h) * a.T + t] = s;
}

// The same with one warp per row (b, t): lane l holds float4 j = l + 32 v (v < NV) of the row's out
// and dout, all loaded at once (a warp per (b, t, h) left a 64-float head 2 floats a lane: ~1.8
// TB/s). A head is hs/4 consecutive float4s, and hs/4 divides 32 (hs = 16..128), so for each v
// the lanes fall into groups of hs/4, one head each: xor-shuffles within a group add its products
// (each lane's float4 first). C_local % 4 == 0, 16-byte aligned rows.
// DOUT16: dO comes as 16-bit values only (a.dout16; 1 bf16, 2 fp16: a training layer's datty,
// megatron.h's mt_datty_gemm_dtype), 4 in one 8-byte load, widened exactly; 0: fp32 (a.dout).
// OUT16 = 1: the forward's output O comes in the same 16 bits (in half the floats of a.out: a
// training layer's atty, megatron.h's mt_atty_storage_dtype; with DOUT16 1 or 2 only), 4 in one
// 8-byte load; 0: fp32.
template <typename T>
__device__ static inline float4 mt__widen4(uint2 u) {
    const T *x = (const T *)&u;
    return make_float4(mt__to_float(x[0]), mt__to_float(x[1]), mt__to_float(x[2]), mt__to_float(x[3]));
}
template <int NV, int DOUT16, int OUT16>
__global__ void mt_attention_backward_preprocess_vec_kernel(mt__attention_args a, int hs) {
    mt__pdl_start();   // (launched with programmatic dependent launch inside a training graph)
    size_t bt = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    int lane = threadIdx.x % 32, group = hs / 4, C4 = a.C_local / 4;
    if (bt >= (size_t)a.B * a.T) return;
    int t = (int)(bt % a.T), b = (int)(bt / a.T);
    const float4 *o4 = (const float4 *)(a.out + bt * a.C_local), *d4 = (const float4 *)(a.dout + bt * a.C_local);
    const uint2 *d16 = (const uint2 *)(a.dout16 + bt * a.C_local);
    const uint2 *o16 = (const uint2 *)((const unsigned short *)a.out + bt * a.C_local);   // (OUT16)
    float4 o[NV], d[NV];
    #pragma unroll
    for (int v = 0; v < NV; v++) {
        int j = lane + 32 * v;
        if (j >= C4) o[v] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        else if (!OUT16) o[v] = o4[j];
        else if (DOUT16 == 2) o[v] = mt__widen4<__half>(o16[j]);
        else o[v] = mt__widen4<__nv_bfloat16>(o16[j]);
        if (j >= C4) d[v] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        else if (DOUT16 == 1) d[v] = mt__widen4<__nv_bfloat16>(d16[j]);
        else if (DOUT16 == 2) d[v] = mt__widen4<__half>(d16[j]);
        else d[v] = d4[j];
    }
    #pragma unroll
    for (int v = 0; v < NV; v++) {
        int j = lane + 32 * v;
        float s = (o[v].x * d[v].x + o[v].y * d[v].y) + (o[v].z * d[v].z + o[v].w * d[v].w);
        for (int off = group / 2; off > 0; off /= 2) s += __shfl_xor_sync(0xffffffffu, s, off);
        if (j < C4 && j % group == 0) a.dsum[((size_t)b * a.NH_local + j / group) * a.T + t] = s;
    }
}

// The same for dO and O both in 16 bits (a training layer's datty and atty), 16 bytes a load: lane l
// holds slots j = l + 32 v (v < NV) of the row, 8 values each of dO and O. A head is hs/8 consecutive
// slots and hs/8 divides 32 (hs = 16 .. 128), so the lanes fall into groups of hs/8, one head each.
// The sum in the 8-byte kernel's order, so the same bits (tests/gpu/test_kernels compares the two):
// there a lane held 4 values, (o0 d0 + o1 d1) + (o2 d2 + o3 d3), and xor-shuffles over hs/4 lanes
// added them, the last step joining lanes 2i and 2i + 1. Here a lane holds those two lanes' 4 each
// (sa, sb): the same shuffles over hs/8 lanes on each, then sa + sb.
// F16: 0 bf16, 1 fp16. (The 8-byte kernel above, on these: 80 registers, 57% of the issue slots busy,
// 1.8 TB/s under ncu, 25 us a layer at GPT-2 small's B = 16: its loads, widenings and 4-step shuffle
// trees, over 8 slots where 6 held data, were instruction-bound: docs/perf.md, session 41.)
template <int NV, int F16>
__global__ void mt_attention_backward_preprocess16_kernel(mt__attention_args a, int hs) {
    mt__pdl_start();   // (launched with programmatic dependent launch inside a training graph)
    size_t bt = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    int lane = threadIdx.x % 32, group = hs / 8, C8 = a.C_local / 8;
    if (bt >= (size_t)a.B * a.T) return;   // (a whole warp: bt is the warp's)
    int t = (int)(bt % a.T), b = (int)(bt / a.T);
    const uint4 *d16 = (const uint4 *)(a.dout16 + bt * a.C_local);
    const uint4 *o16 = (const uint4 *)((const unsigned short *)a.out + bt * a.C_local);
    uint4 o[NV], d[NV];
    #pragma unroll
    for (int v = 0; v < NV; v++) {   // every load first
        int j = lane + 32 * v;
        o[v] = j < C8 ? o16[j] : make_uint4(0u, 0u, 0u, 0u);
        d[v] = j < C8 ? d16[j] : make_uint4(0u, 0u, 0u, 0u);
    }
    #pragma unroll
    for (int v = 0; v < NV; v++) {
        int j = lane + 32 * v;
        float2 o0 = mt__unpack16x2<F16>(o[v].x), o1 = mt__unpack16x2<F16>(o[v].y), o2 = mt__unpack16x2<F16>(o[v].z),
               o3 = mt__unpack16x2<F16>(o[v].w), d0 = mt__unpack16x2<F16>(d[v].x), d1 = mt__unpack16x2<F16>(d[v].y),
               d2 = mt__unpack16x2<F16>(d[v].z), d3 = mt__unpack16x2<F16>(d[v].w);
        float sa = (o0.x * d0.x + o0.y * d0.y) + (o1.x * d1.x + o1.y * d1.y);   // values 0..3, as a float4 there
        float sb = (o2.x * d2.x + o2.y * d2.y) + (o3.x * d3.x + o3.y * d3.y);   // values 4..7
        for (int off = group / 2; off > 0; off /= 2) {
            sa += __shfl_xor_sync(0xffffffffu, sa, off);
            sb += __shfl_xor_sync(0xffffffffu, sb, off);
        }
        if (j < C8 && j % group == 0) a.dsum[((size_t)b * a.NH_local + j / group) * a.T + t] = sa + sb;
    }
}

// matches mt_attention_backward_cpu (megatron.h, 3. OPS): the dK, dV half. Writes them with '='.
// grid (T/32 key tiles, B*NH_local), 128 threads: thread (c = tid/4, quarter) owns key c of the
// tile, the query rows quarter + 4j of each query tile, and channels quarter + 4i of dK and dV.
// shared: K, V (the block's keys), Q, dO (the current query tile), P' and dS (key-major, 32 x 33),
// lse and D of the query tile.
template <int HS>
__global__ void __launch_bounds__(128) mt_attention_backward_dkdv_kernel(mt__attention_args a) {
    float *Ks = (float *)mt__att_smem, *Vs = Ks + 32 * (HS + 1), *Qs = Vs + 32 * (HS + 1), *dOs = Qs + 32 * (HS + 1);
    float *Pds = dOs + 32 * (HS + 1), *dSs = Pds + 32 * 33, *lse_s = dSs + 32 * 33, *D_s = lse_s + 32;
    int c = threadIdx.x / 4, quarter = threadIdx.x % 4;
    // key tile 0 has the most work: first
    int kt = blockIdx.x, b = blockIdx.y / a.NH_local, h = blockIdx.y % a.NH_local;
    int T = a.T, key = kt * 32 + c;
    size_t C3 = 3 * (size_t)a.C_local;
    const float *q_base = a.qkv + (size_t)b * T * C3 + h * HS, *k_base = q_base + a.C_local, *v_base = q_base + 2 * a.C_local;
    const float *do_base = a.dout + (size_t)b * T * a.C_local + h * HS;
    const float *lse_bh = a.lse + ((size_t)b * a.NH_local + h) * T, *D_bh = a.dsum + ((size_t)b * a.NH_local + h) * T;
    mt__att_load_f32<HS>(Ks, k_base, C3, kt * 32, T);
    mt__att_load_f32<HS>(Vs, v_base, C3, kt * 32, T);
    float dk[HS / 4], dv[HS / 4];
    #pragma unroll
    for (int i = 0; i < HS / 4; i++) { dk[i] = 0.0f; dv[i] = 0.0f; }
    for (int qt = kt; qt * 32 < T; qt++) {   // query tiles from the diagonal down
        __syncthreads();
        mt__att_load_f32<HS>(Qs, q_base, C3, qt * 32, T);
        mt__att_load_f32<HS>(dOs, do_base, a.C_local, qt * 32, T);
        if (threadIdx.x < 32) {
            int t = qt * 32 + threadIdx.x;
            lse_s[threadIdx.x] = t < T ? lse_bh[t] : 0.0f;
            D_s[threadIdx.x] = t < T ? D_bh[t] : 0.0f;
        }
        __syncthreads();
        #pragma unroll
        for (int j = 0; j < 8; j++) {
            int r = quarter + 4 * j, t = qt * 32 + r;
            float pd = 0.0f, ds = 0.0f;
            if (t < T && key <= t) {
                float p = expf(mt__dot_f32<HS>(Qs + r * (HS + 1), Ks + c * (HS + 1)) * a.scale - lse_s[r]);
                float dpd = mt__dot_f32<HS>(dOs + r * (HS + 1), Vs + c * (HS + 1));   // d(loss)/d(p')
                float mult = a.p_drop > 0.0f ? mt__attention_keep(a, b, h, t, key) : 1.0f;
                pd = p * mult;                     // p' = dropout(p)
                ds = p * (dpd * mult - D_s[r]);    // softmax backward, dp = dp' * mask / (1-p_drop)
            }
            Pds[c * 33 + r] = pd;
            dSs[c * 33 + r] = ds;
        }
        __syncwarp();   // key c's 4 threads (one warp) wrote its rows of Pds, dSs
        for (int r = 0; r < 32; r++) {
            float pd = Pds[c * 33 + r], ds = dSs[c * 33 + r];
            #pragma unroll
            for (int i = 0; i < HS / 4; i++) {
                dv[i] += pd * dOs[r * (HS + 1) + quarter + 4 * i];
                dk[i] += ds * Qs[r * (HS + 1) + quarter + 4 * i];
            }
        }
    }
    if (key >= T) return;
    float *dk_dst = a.dqkv + ((size_t)b * T + key) * C3 + a.C_local + h * HS, *dv_dst = dk_dst + a.C_local;
    #pragma unroll
    for (int i = 0; i < HS / 4; i++) {
        dk_dst[quarter + 4 * i] = dk[i] * a.scale;
        dv_dst[quarter + 4 * i] = dv[i];
    }
}

// matches mt_attention_backward_cpu (megatron.h, 3. OPS): the dQ half. Writes it with '='.
// grid (T/32 query tiles, B*NH_local), 128 threads: thread (r = tid/4, quarter) owns query row r,
// keys quarter + 4j of each key tile and channels quarter + 4i of dQ.
template <int HS>
__global__ void __launch_bounds__(128) mt_attention_backward_dq_kernel(mt__attention_args a) {
    float *Qs = (float *)mt__att_smem, *dOs = Qs + 32 * (HS + 1), *Ks = dOs + 32 * (HS + 1), *Vs = Ks + 32 * (HS + 1);
    float *dSs = Vs + 32 * (HS + 1);
    int r = threadIdx.x / 4, quarter = threadIdx.x % 4;
    int qt = gridDim.x - 1 - blockIdx.x, b = blockIdx.y / a.NH_local, h = blockIdx.y % a.NH_local;
    int T = a.T, t = qt * 32 + r;
    size_t C3 = 3 * (size_t)a.C_local;
    const float *q_base = a.qkv + (size_t)b * T * C3 + h * HS, *k_base = q_base + a.C_local, *v_base = q_base + 2 * a.C_local;
    const float *do_base = a.dout + (size_t)b * T * a.C_local + h * HS;
    mt__att_load_f32<HS>(Qs, q_base, C3, qt * 32, T);
    mt__att_load_f32<HS>(dOs, do_base, a.C_local, qt * 32, T);
    float lse_t = t < T ? a.lse[((size_t)b * a.NH_local + h) * T + t] : 0.0f;
    float D_t = t < T ? a.dsum[((size_t)b * a.NH_local + h) * T + t] : 0.0f;
    float dq[HS / 4];
    #pragma unroll
    for (int i = 0; i < HS / 4; i++) dq[i] = 0.0f;
    int last_key = min(T - 1, qt * 32 + 31);
    for (int kt = 0; kt * 32 <= last_key; kt++) {
        __syncthreads();
        mt__att_load_f32<HS>(Ks, k_base, C3, kt * 32, T);
        mt__att_load_f32<HS>(Vs, v_base, C3, kt * 32, T);
        __syncthreads();
        #pragma unroll
        for (int j = 0; j < 8; j++) {
            int c = quarter + 4 * j, key = kt * 32 + c;
            float ds = 0.0f;
            if (t < T && key <= t) {
                float p = expf(mt__dot_f32<HS>(Qs + r * (HS + 1), Ks + c * (HS + 1)) * a.scale - lse_t);
                float dpd = mt__dot_f32<HS>(dOs + r * (HS + 1), Vs + c * (HS + 1));
                float mult = a.p_drop > 0.0f ? mt__attention_keep(a, b, h, t, key) : 1.0f;
                ds = p * (dpd * mult - D_t);
            }
            dSs[r * 33 + c] = ds;
        }
        __syncwarp();
        for (int c = 0; c < 32; c++) {
            float ds = dSs[r * 33 + c];
            #pragma unroll
            for (int i = 0; i < HS / 4; i++) dq[i] += ds * Ks[c * (HS + 1) + quarter + 4 * i];
        }
    }
    if (t >= T) return;
    float *dq_dst = a.dqkv + ((size_t)b * T + t) * C3 + h * HS;
    #pragma unroll
    for (int i = 0; i < HS / 4; i++) dq_dst[quarter + 4 * i] = dq[i] * a.scale;
}

// ---- bf16 / fp16 tensor-core path --------------------------------------------------------------
// F16 (a template parameter of every kernel below): 0 = bf16 operands (--bf16), 1 = fp16 (--fp16);
// the tiles hold 16-bit values of that type, the arithmetic is the same (mt__mma16, mt__pack16x2).
// The tiles live in shared memory with row stride HS + 8 16-bit values: the +8 makes the row stride an
// odd number of 16-byte units, so the 8 rows of an ldmatrix fall in 8 different bank groups.
// cp.async (sm_80+): 16 bytes from global to shared memory without passing through registers;
// the copy runs on while the thread goes on. Copies are grouped (commit_group); wait_group N
// waits until at most N of this thread's groups are still in flight. A source size of 0 writes
// 16 zero bytes (the rows past T).
__device__ static inline void mt__cp_async16(void *smem, const void *gmem, int src_bytes) {
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes));
}
__device__ static inline void mt__cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ static inline void mt__cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }
// start copying ROWS rows of HS 16-bit values (global row stride ld, first row t0; rows >= T become 0)
// into a shared tile with row stride HS + 8. Every thread of the 128 issues its 16-byte pieces;
// the caller commits the group and waits for it before the tile is read.
template <int HS, int ROWS>
__device__ static inline void mt__att_load_async(__nv_bfloat16 *dst, const __nv_bfloat16 *src, size_t ld, int t0,
                                                 int T) {
    for (int e = threadIdx.x; e < ROWS * HS / 8; e += 128) {
        int r = e / (HS / 8), d = 8 * (e % (HS / 8)), in = t0 + r < T;
        const __nv_bfloat16 *g = src + (size_t)(in ? t0 + r : 0) * ld + d;   // a valid address even when not read
        mt__cp_async16(dst + r * (HS + 8) + d, g, in ? 16 : 0);
    }
}
// fragments from a bf16 tile with row stride ld (see the mma helpers in "matmul"):
// A (16 x 16) of a [m][k] tile at (m0, k0)
__device__ static inline void mt__frag_a(uint32_t a[4], const __nv_bfloat16 *tile, int ld, int m0, int k0, int lane) {
    mt__ldmatrix_x4(a, tile + (m0 + lane % 16) * ld + k0 + (lane / 16) * 8);
}
// B for two n8 tiles (n0..n0+15) x k16 (k0..), from a [n][k] tile (B^T stored row by row)
__device__ static inline void mt__frag_b_nk(uint32_t b[4], const __nv_bfloat16 *tile, int ld, int n0, int k0,
                                            int lane) {
    mt__ldmatrix_x4(b, tile + (n0 + lane % 8 + (lane / 16) * 8) * ld + k0 + ((lane / 8) % 2) * 8);
}
// the same from a [k][n] tile (B stored row by row): ldmatrix.trans
__device__ static inline void mt__frag_b_kn(uint32_t b[4], const __nv_bfloat16 *tile, int ld, int n0, int k0,
                                            int lane) {
    mt__ldmatrix_x4_trans(b, tile + (k0 + lane % 8 + ((lane / 8) % 2) * 8) * ld + n0 + (lane / 16) * 8);
}
// Two products of one warp's 16 rows (rows m0..m0+15) against N columns, over k = 0..HS-1, from
// shared-memory tiles of row stride ld, both B operands stored [n][k]:
//   x = A1 B1^T,  y = A2 B2^T      (x, y: N/8 n8 tiles each, zeroed first; mt__mma16's layout)
// The attention backward needs two such products of the same tiles: the dQ kernel S = Q K^T and
// dP = dO V^T, the dK/dV kernel their transposes S^T = K Q^T and dP'^T = V dO^T.
template <int F16, int HS, int N>
__device__ static inline void mt__attention_two_products(float (&x)[N / 8][4], float (&y)[N / 8][4],
                                                         const __nv_bfloat16 *a1, const __nv_bfloat16 *a2,
                                                         const __nv_bfloat16 *b1, const __nv_bfloat16 *b2, int ld,
                                                         int m0, int lane) {
    #pragma unroll
    for (int i = 0; i < N / 8; i++)
        #pragma unroll
        for (int e = 0; e < 4; e++) { x[i][e] = 0.0f; y[i][e] = 0.0f; }
    #pragma unroll
    for (int kk = 0; kk < HS / 16; kk++) {
        uint32_t fa1[4], fa2[4];
        mt__frag_a(fa1, a1, ld, m0, kk * 16, lane);
        mt__frag_a(fa2, a2, ld, m0, kk * 16, lane);
        #pragma unroll
        for (int np = 0; np < N / 16; np++) {
            uint32_t fb1[4], fb2[4];
            mt__frag_b_nk(fb1, b1, ld, np * 16, kk * 16, lane);
            mt__frag_b_nk(fb2, b2, ld, np * 16, kk * 16, lane);
            mt__mma16<F16>(x[2 * np], fa1, fb1[0], fb1[1]);
            mt__mma16<F16>(x[2 * np + 1], fa1, fb1[2], fb1[3]);
            mt__mma16<F16>(y[2 * np], fa2, fb2[0], fb2[1]);
            mt__mma16<F16>(y[2 * np + 1], fa2, fb2[2], fb2[3]);
        }
    }
}
// an fp32 accumulator tile 16 x 16 (two n8 tiles c0, c1) as the bf16 A fragment of the next mma
template <int F16>
__device__ static inline void mt__acc_to_frag_a(uint32_t a[4], const float c0[4], const float c1[4]) {
    a[0] = mt__pack16x2<F16>(c0[0], c0[1]);   // row g,   k 2t..2t+1
    a[1] = mt__pack16x2<F16>(c0[2], c0[3]);   // row g+8, k 2t..
    a[2] = mt__pack16x2<F16>(c1[0], c1[1]);   // row g,   k 2t+8..
    a[3] = mt__pack16x2<F16>(c1[2], c1[3]);   // row g+8, k 2t+8..
}
// d += S B for one warp's 16 rows: S an fp32 accumulator tile of K columns (mt__mma16's layout, K/8
// n8 tiles) taken as the A operand (rounded to 16 bits, mt__acc_to_frag_a), B a [k][n] shared-memory
// tile (row stride ld) of N columns, k over S's K columns: the attention's O += P V (forward) and
// dQ += dS K (backward)
template <int F16, int K, int N>
__device__ static inline void mt__attention_acc_product(float (&d)[N / 8][4], const float (&s)[K / 8][4],
                                                        const __nv_bfloat16 *b, int ld, int lane) {
    #pragma unroll
    for (int kk = 0; kk < K / 16; kk++) {
        uint32_t sa[4];
        mt__acc_to_frag_a<F16>(sa, s[2 * kk], s[2 * kk + 1]);
        #pragma unroll
        for (int dn = 0; dn < N / 16; dn++) {
            uint32_t fb[4];
            mt__frag_b_kn(fb, b, ld, dn * 16, kk * 16, lane);
            mt__mma16<F16>(d[2 * dn], sa, fb[0], fb[1]);
            mt__mma16<F16>(d[2 * dn + 1], sa, fb[2], fb[3]);
        }
    }
}

// matches mt_attention_forward_cpu (megatron.h, 3. OPS); writes out and lse with '='.
// grid (T/64 query tiles, B*NH_local), 128 threads = 4 warps, each 16 query rows of the 64.
// Per 64-key tile: S (16 x 64 per warp) = Q K^T in 8 mma accumulator tiles; the softmax runs on
// the accumulators (a thread holds rows g and g+8, two columns of each n8 tile; row max and sum
// over the 4 threads of a quad); P' becomes the A operand of O += P' V directly. Scores are kept
// in base 2 (exp2 of s * scale * log2 e). Q stays in registers for the whole kernel.
// shared: Q, then K and V of two key tiles (a ring of two stages), 64 x (HS+8) bf16 each: while
// the warps work on tile kt in stage kt % 2, cp.async fills stage (kt+1) % 2 with tile kt+1.
template <int HS, int F16>
__global__ void __launch_bounds__(128, HS <= 64 ? 3 : 2) mt_attention_forward_kernel_mma(mt__attention_args a) {
    const int LD = HS + 8;
    __nv_bfloat16 *Qs = (__nv_bfloat16 *)mt__att_smem, *KVs = Qs + 64 * LD;   // stage s: K at KVs + 2s*64*LD, V after
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, gq = lane / 4, tq = lane % 4;
    int qt = gridDim.x - 1 - blockIdx.x, b = blockIdx.y / a.NH_local, h = blockIdx.y % a.NH_local;
    int T = a.T;
    size_t C3 = 3 * (size_t)a.C_local;
    const __nv_bfloat16 *q_base = a.qkv16 + (size_t)b * T * C3 + h * HS, *k_base = q_base + a.C_local,
                        *v_base = q_base + 2 * a.C_local;
    int last_key = min(T - 1, qt * 64 + 63);
    mt__att_load_async<HS, 64>(Qs, q_base, C3, qt * 64, T);   // group 0: Q
    mt__cp_async_commit();
    mt__att_load_async<HS, 64>(KVs, k_base, C3, 0, T);        // group 1: the first K, V
    mt__att_load_async<HS, 64>(KVs + 64 * LD, v_base, C3, 0, T);
    mt__cp_async_commit();
    mt__cp_async_wait<1>();   // Q has landed (K, V may still fly)
    __syncthreads();
    uint32_t qf[HS / 16][4];
    #pragma unroll
    for (int kk = 0; kk < HS / 16; kk++) mt__frag_a(qf[kk], Qs, LD, warp * 16, kk * 16, lane);
    float o[HS / 8][4];
    #pragma unroll
    for (int i = 0; i < HS / 8; i++)
        #pragma unroll
        for (int e = 0; e < 4; e++) o[i][e] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    int t_row[2] = {qt * 64 + warp * 16 + gq, qt * 64 + warp * 16 + gq + 8};
    const float scale2 = a.scale * 1.4426950408889634f;   // exp(x * scale) = exp2(x * scale * log2 e)
    for (int kt = 0; kt * 64 <= last_key; kt++) {
        if ((kt + 1) * 64 <= last_key) {   // start the next tile's copy into the other stage
            __nv_bfloat16 *next = KVs + ((kt + 1) % 2) * 2 * 64 * LD;
            mt__att_load_async<HS, 64>(next, k_base, C3, (kt + 1) * 64, T);
            mt__att_load_async<HS, 64>(next + 64 * LD, v_base, C3, (kt + 1) * 64, T);
            mt__cp_async_commit();
            mt__cp_async_wait<1>();   // this tile's group has landed (the next may still fly)
        } else {
            mt__cp_async_wait<0>();
        }
        __syncthreads();   // ... for every thread's pieces
        const __nv_bfloat16 *Ks = KVs + (kt % 2) * 2 * 64 * LD, *Vs = Ks + 64 * LD;
        float s[8][4];
        #pragma unroll
        for (int i = 0; i < 8; i++)
            #pragma unroll
            for (int e = 0; e < 4; e++) s[i][e] = 0.0f;
        #pragma unroll
        for (int kk = 0; kk < HS / 16; kk++)
            #pragma unroll
            for (int np = 0; np < 4; np++) {
                uint32_t kb[4];
                mt__frag_b_nk(kb, Ks, LD, np * 16, kk * 16, lane);
                mt__mma16<F16>(s[2 * np], qf[kk], kb[0], kb[1]);
                mt__mma16<F16>(s[2 * np + 1], qf[kk], kb[2], kb[3]);
            }
        #pragma unroll
        for (int half = 0; half < 2; half++) {   // half 0: row g (elements 0,1), half 1: row g+8 (2,3)
            int t = t_row[half];
            float mx = -INFINITY;
            #pragma unroll
            for (int nt = 0; nt < 8; nt++)
                #pragma unroll
                for (int e = 0; e < 2; e++) {
                    int key = kt * 64 + nt * 8 + 2 * tq + e;
                    float v = key <= t && key < T ? s[nt][2 * half + e] * scale2 : -INFINITY;
                    s[nt][2 * half + e] = v;
                    mx = fmaxf(mx, v);
                }
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            float m_new = fmaxf(m[half], mx);
            float m_use = m_new == -INFINITY ? 0.0f : m_new;   // a row with nothing visible yet: no NaN
            float corr = exp2f(m[half] - m_use), sum = 0.0f;
            #pragma unroll
            for (int nt = 0; nt < 8; nt++)
                #pragma unroll
                for (int e = 0; e < 2; e++) {
                    float p = exp2f(s[nt][2 * half + e] - m_use);
                    sum += p;
                    if (a.p_drop > 0.0f && p > 0.0f) p *= mt__attention_keep(a, b, h, t, kt * 64 + nt * 8 + 2 * tq + e);
                    s[nt][2 * half + e] = p;
                }
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            sum += __shfl_xor_sync(0xffffffffu, sum, 2);
            l[half] = l[half] * corr + sum;
            m[half] = m_new;
            #pragma unroll
            for (int i = 0; i < HS / 8; i++) { o[i][2 * half] *= corr; o[i][2 * half + 1] *= corr; }
        }
        mt__attention_acc_product<F16, 64, HS>(o, s, Vs, LD, lane);   // O += P' V, 16 keys at a time
        __syncthreads();   // this stage is read: the next iteration may start refilling it
    }
    #pragma unroll
    for (int half = 0; half < 2; half++) {
        int t = t_row[half];
        if (t >= T) continue;
        float inv = 1.0f / l[half];
        float *dst = a.out + ((size_t)b * T + t) * a.C_local + h * HS;
        #pragma unroll
        for (int i = 0; i < HS / 8; i++)
            *(float2 *)(dst + i * 8 + 2 * tq) = make_float2(o[i][2 * half] * inv, o[i][2 * half + 1] * inv);
        if (tq == 0) a.lse[((size_t)b * a.NH_local + h) * T + t] = m[half] * 0.6931471805599453f + logf(l[half]);
    }
}

// ---- the forward on Hopper's wgmma (FlashAttention-3's layout), bf16, head size 64 -----------------
// matches mt_attention_forward_cpu (megatron.h, 3. OPS), as the kernel above; writes out and lse with '='.
// The kernel above issues mma.sync from 4 warps: ~131 TFLOP/s at GPT-2 small's shape, where
// cuDNN's forward reaches ~300. This one (written first as a standalone prototype, then checked
// against it on an H200: docs/perf.md) reaches ~250.
// THE MATH as above (one head of one sample; scores kept in base 2, scale2 = scale log2 e):
//   S = Q K^T (rows x keys), masked causally; per key tile j and query row t:
//   m_j = max(m_{j-1}, max_k S_j[t][k]);  P_j = exp2((S_j - m_j) scale2)  (unnormalised, rounded to bf16)
//   l_j = l_{j-1} exp2((m_{j-1} - m_j) scale2) + rowsum P_j;  O_j = O_{j-1} exp2(...) + (P_j x dropout) V_j
//   out = O / l;  lse = m scale + log l
// THE MACHINE. A block of 256 threads = 2 warpgroups owns 128 query rows of one (sample b, head h):
// warpgroup w rows 64w..64w+63, the M = 64 of one wgmma.
//   - Q (128 x 64 bf16, 16 KB) comes once by TMA; K and V tiles (64 keys x 64) stream through a ring
//     of 4 stages, each filled by TMA and signalled on mbarrier full[s]; every warp gives a stage
//     back on empty[s] (count 8). No producer warp: thread 0 issues the copies, topping the ring up
//     without blocking (mbarrier.test_wait) after its own wgmmas are issued; it blocks only when
//     the tile its warpgroup needs next has not been requested yet.
//   - S = Q K^T: 4 wgmma m64n64k16 (HS / 16), both operands from shared memory, K-major (a row of Q
//     or K is 64 bf16 = 128 bytes = one 128-byte swizzle row): descriptors as the GEMM's k-inner tiles.
//   - the softmax on S's accumulator registers (a quad of lanes shares a row: max by two shuffles);
//     the accumulator layout of S is, per warp, the mma.sync A-fragment layout of P: P packs into
//     wgmma's register-A operand without moving (mt__att_softmax_tile).
//   - O += P V: wgmma with A = P from registers and B = V from shared memory, MN-major (V is
//     [key][d], the reduction runs over keys): imm-trans-b, 2048 bytes (16 keys) per k16 step.
//   - FA3's overlap inside a warpgroup: tile j's S and tile j-1's PV are issued together, and the
//     softmax of tile j runs while the tensor cores still do PV_{j-1}. Two sets of P registers,
//     alternated by unrolling the loop by two (a copy would let the compiler merge them, and the
//     softmax would write registers an in-flight wgmma reads: ptxas serialises wgmmas then, C7513).
// Query tiles from the last (the longest rows) to the first. Rows and keys past T arrive as zeros
// (a 3-D tensor map (3C, T, B): everything at t >= T is out of bounds, which TMA fills with 0); keys
// past T are above every valid row's diagonal, so the causal mask covers them; rows past T are
// computed (finite) and never stored. Dropout as the kernel above: the same mask bits (keyed by
// sample, head, row, key), applied to P after its row sum.
static const int MT__ATT_WG_ROWS = 128, MT__ATT_WG_KEYS = 64, MT__ATT_WG_STAGES = 4;
// shared memory from a 1024-byte aligned base: Q (128 rows x 128 B) | stage s: K, V (64 x 128 B each) | mbarriers
static const int MT__ATT_WG_SMEM = 1024 + MT__ATT_WG_ROWS * 128 + MT__ATT_WG_STAGES * 2 * MT__ATT_WG_KEYS * 128 +
                                   8 * (2 * MT__ATT_WG_STAGES + 1);
// non-blocking: has the phase with this parity completed?
__device__ static inline uint32_t mt__mbar_test(uint32_t bar, uint32_t parity) {
    uint32_t done;
    asm volatile("{\n .reg .pred p;\n mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    return done;
}
// TMA: the box at (x0 innermost, x1, x2) of a 3-D tensor map into shared memory, completing on bar
__device__ static inline void mt__tma_load_3d(uint32_t dst, const CUtensorMap *map, int x0, int x1, int x2, uint32_t bar) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n"
                 ::"r"(dst), "l"((uint64_t)map), "r"(x0), "r"(x1), "r"(x2), "r"(bar) : "memory");
}
// TMA the other way: the box at (x0, x1, x2) of a 3-D tensor map written from shared memory (src,
// laid out as the map's swizzle says), asynchronously; commit closes this thread's stores so far into
// a bulk group; wait_read<N> waits until at most N groups still read shared memory, wait_all<N> until
// at most N are still writing global memory. Writes to src by the generic proxy (st.shared) must be
// made visible to the async proxy first: fence_proxy_async, then a barrier, then the store.
__device__ static inline void mt__tma_store_3d(const CUtensorMap *map, int x0, int x1, int x2, uint32_t src) {
    asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%1, %2, %3}], [%4];\n"
                 ::"l"((uint64_t)map), "r"(x0), "r"(x1), "r"(x2), "r"(src) : "memory");
}
__device__ static inline void mt__tma_store_commit(void) { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
template <int N>
__device__ static inline void mt__tma_store_wait_read(void) { asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory"); }
template <int N>
__device__ static inline void mt__tma_store_wait_all(void) { asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory"); }
__device__ static inline void mt__fence_proxy_async(void) { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// 2^x on the SFU (ex2.approx.ftz: 2^-inf = +0, which the masks rely on)
__device__ static inline float mt__ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}
// keep the compiler from moving reads and writes of registers across a wgmma fence or wait
template <int N>
__device__ static inline void mt__reg_fence_all(float (&r)[N]) {
    #pragma unroll
    for (int i = 0; i < N; i++) mt__reg_fence(r[i]);
}
template <int N>
__device__ static inline void mt__reg_fence_all(uint32_t (&r)[N][4]) {
    #pragma unroll
    for (int i = 0; i < N; i++)
        #pragma unroll
        for (int e = 0; e < 4; e++) asm volatile("" : "+r"(r[i][e])::"memory");
}
// the attention's wgmma forms (m64n64k16, bf16, fp32 accumulators, 32 registers a thread; register
// d[4n + e] of lane (g, q): row 16 warp + g (+8 for e >= 2), column 8n + 2q (+1 for odd e)):
// S (+)= Q K^T, both from shared memory, K-major (k inner); accumulate 0 zeroes D first (scale-d).
// TA, TB = 1: that operand MN-major instead (imm-trans-a / -b): A stored [k][m], B [k][n], the reduction
// running over rows (the backward's dQ += dS K from the dS^T tiles, THE dS HAND-OFF)
template <int TA = 0, int TB = 0>
__device__ static inline void mt__att_wgmma_ss(float d[32], uint64_t desc_a, uint64_t desc_b, int accumulate) {
    asm volatile("{\n"
                 ".reg .pred p;\n"
                 "setp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" MT__WGMMA_REGS32 "}, "
                 "%32, %33, p, 1, 1, %35, %36;\n"
                 "}\n"
                 : MT__WGMMA_ACC32("+f", 0)
                 : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(TA), "n"(TB)
                 : "memory");
}
// the same with D output only ("=f": its old values are no input, so ptxas need not order this
// wgmma after their last writer), for a tile's first k16 step
__device__ static inline void mt__att_wgmma_ss_first(float d[32], uint64_t desc_a, uint64_t desc_b) {
    asm volatile("{\n"
                 ".reg .pred p;\n"
                 "setp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" MT__WGMMA_REGS32 "}, "
                 "%32, %33, p, 1, 1, 0, 0;\n"
                 "}\n"
                 : MT__WGMMA_ACC32("=f", 0)
                 : "l"(desc_a), "l"(desc_b), "r"(0)
                 : "memory");
}
// O += P V: A = P from registers (4 a thread: the mma.sync A fragment of each warp's 16 rows), B = V
// from shared memory, MN-major (imm-trans-b = 1: V is [key][d], the reduction runs over the keys)
__device__ static inline void mt__att_wgmma_pv(float d[32], const uint32_t a[4], uint64_t desc_b) {
    asm volatile("{\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" MT__WGMMA_REGS32 "}, "
                 "{%32, %33, %34, %35}, %36, 1, 1, 1, 1;\n"
                 "}\n"
                 : MT__WGMMA_ACC32("+f", 0)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b)
                 : "memory");
}
// the accumulator layout -> the register-A fragment layout: s holds a 64 x 64 tile (wgmma's
// accumulators, above), x the 4 k16 fragments of 16 columns each (bf16 pairs) that a register-A
// wgmma reads: P for O += P V, and the backward's P'^T, dS^T, dS
__device__ static inline void mt__att_acc_to_a(uint32_t (&x)[4][4], const float (&s)[32]) {
    #pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        x[kk][0] = mt__pack16x2<0>(s[8 * kk + 0], s[8 * kk + 1]);   // row g,   columns 16kk + 2q, +1
        x[kk][1] = mt__pack16x2<0>(s[8 * kk + 2], s[8 * kk + 3]);   // row g+8, columns 16kk + 2q, +1
        x[kk][2] = mt__pack16x2<0>(s[8 * kk + 4], s[8 * kk + 5]);   // row g,   columns 16kk + 8 + 2q, +1
        x[kk][3] = mt__pack16x2<0>(s[8 * kk + 6], s[8 * kk + 7]);   // row g+8, columns 16kk + 8 + 2q, +1
    }
}
// THE RING of the wgmma attention kernels (the forward, dQ, dK/dV): the tiles a block streams go
// through STAGES stages; full[s] at bars + 8s completes on thread 0's arrive.expect_tx and the
// TMA's bytes, empty[s] at bars + 8 (STAGES + s) on lane 0 of each of the block's 8 warps; `once`
// (count 1) on the tiles the block loads once. Thread 0 inits them, before a __syncthreads.
template <int STAGES>
__device__ static inline void mt__att_ring_init(uint32_t bars, uint32_t once) {
    for (int s = 0; s < STAGES; s++) {
        mt__mbar_init(bars + 8 * s, 1);              // full: thread 0's arrive.expect_tx + the TMA's bytes
        mt__mbar_init(bars + 8 * (STAGES + s), 8);   // empty: lane 0 of each of the 8 warps
    }
    mt__mbar_init(once, 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");   // visible to the TMA unit
}
// thread 0: request every tile whose stage is free, in order (next: the next tile to request, of n);
// need >= 0: block until tile `need` is requested. No producer warp: the kernels call this after
// issuing their own wgmmas, so it tops the ring up without blocking (mbarrier.test_wait) unless a
// tile they are about to wait for has not been requested yet. issue(j): tile j into stage j % STAGES
template <int STAGES, typename Issue>
__device__ static inline void mt__att_ring_refill(uint32_t bars, int &next, int n, int need, Issue issue) {
    while (next < n) {
        int j_old = next - STAGES;   // the tile that last used the stage
        if (j_old >= 0) {
            uint32_t empty = bars + 8 * (STAGES + j_old % STAGES), par = (j_old / STAGES) & 1;
            if (next > need) {
                if (!mt__mbar_test(empty, par)) return;   // not free yet: try again later
            } else {
                mt__mbar_wait(empty, par);
            }
        }
        issue(next++);
    }
}
// this warp is done with tile j's stage (its wgmmas have completed): lane 0 gives it back
template <int STAGES>
__device__ static inline void mt__att_ring_release(uint32_t bars, int j, int lane) {
    __syncwarp();
    if (lane == 0) mt__mbar_arrive(bars + 8 * (STAGES + j % STAGES));
}
// the softmax of one S tile in registers. s: S (this thread: rows r0 and r0 + 8, columns 8n + 2q,
// +1), overwritten; p: P as the register-A fragments of PV (bf16 pairs, 4 registers per 16 keys);
// m: running row max (raw units); rsum: this tile's row sums over this thread's columns; corr:
// exp2((m_old - m_new) scale2), what O and l shrink by. diag: the tile crosses the diagonal of some
// row of the warpgroup: mask key > row (which masks keys >= T for rows < T too). DROP = 1 (dropout):
// each P times its keep multiplier, after the row sum (as the kernel above). DROP = 0 holds no
// dropout code at all: with the test of a.p_drop inside the exponentials' loop, every kernel paid a
// compare, a predicate and a branch on each of a thread's 32 values a tile (the PTX: 224 branches), in
// a kernel whose issue slots are its limit (ncu: 46% busy, no pipe above 36%); tested once outside
// the loop instead, the code kept for it made ptxas spill (292 bytes at the 128-register bound).
template <int DROP>
__device__ static inline void mt__att_softmax_tile(const mt__attention_args &a, float (&s)[32], uint32_t (&p)[4][4],
                                                   float (&m)[2], float (&rsum)[2], float (&corr)[2], int key0, int r0,
                                                   int diag, float scale2, int b, int h) {
    const int q = threadIdx.x % 4;
    #pragma unroll
    for (int half = 0; half < 2; half++) {
        float mx = m[half];
        int row = r0 + 8 * half;
        if (diag) {
            #pragma unroll
            for (int n = 0; n < 8; n++)
                #pragma unroll
                for (int e = 0; e < 2; e++)
                    if (key0 + 8 * n + 2 * q + e > row) s[4 * n + 2 * half + e] = -INFINITY;
        }
        #pragma unroll
        for (int n = 0; n < 8; n++) mx = fmaxf(mx, fmaxf(s[4 * n + 2 * half], s[4 * n + 2 * half + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));   // the 4 lanes of the quad share the row
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        // (mx is finite: every row sees key 0 in tile 0, the first tile processed)
        corr[half] = mt__ex2((m[half] - mx) * scale2);   // first tile: m = -inf -> 0 (O and l are 0 anyway)
        m[half] = mx;
        const float ms = mx * scale2;
        float sum = 0.0f;
        #pragma unroll
        for (int n = 0; n < 8; n++)
            #pragma unroll
            for (int e = 0; e < 2; e++) {
                float v = mt__ex2(fmaf(s[4 * n + 2 * half + e], scale2, -ms));
                sum += v;
                if (DROP && a.p_drop > 0.0f && v > 0.0f && row < a.T)   // (DROP: the earlier code, bit for bit)
                    v *= mt__attention_keep(a, b, h, row, key0 + 8 * n + 2 * q + e);
                s[4 * n + 2 * half + e] = v;
            }
        rsum[half] = sum;
    }
    mt__att_acc_to_a(p, s);   // (columns: keys)
}
// grid (B * NH_local, ceil(T / 128)), 256 threads, MT__ATT_WG_SMEM bytes of dynamic shared memory.
// map_q: boxes of 128 rows x 64; map_kv: 64 rows x 64; both over qkv16 as a 3-D tensor (3C, T, B).
// OUT16 = 1: out is written in bf16 (in half the floats of a.out: a training layer's attention
// output, megatron.h's mt_atty_storage_dtype), rounded from the same values; 0: fp32.
// DROP: the instance for a.p_drop > 0 (mt__att_softmax_tile)
template <int OUT16, int DROP>
__global__ void __launch_bounds__(256, 2)
    mt_attention_forward_kernel_wgmma(const __grid_constant__ CUtensorMap map_q,
                                      const __grid_constant__ CUtensorMap map_kv, const mt__attention_args a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    mt__pdl_start();   // (launched with programmatic dependent launch inside a training graph)
    const int HS = 64, BM = MT__ATT_WG_ROWS, BN = MT__ATT_WG_KEYS, STAGES = MT__ATT_WG_STAGES, ROW_BYTES = 128;
    extern __shared__ uint8_t mt__att_wg_smem_raw[];
    const uint32_t base = (mt__smem_u32(mt__att_wg_smem_raw) + 1023) & ~1023u;
    const uint32_t q_smem = base, ring = base + BM * ROW_BYTES;
    const uint32_t STAGE_BYTES = 2 * BN * ROW_BYTES, KV_BYTES = BN * ROW_BYTES;
    const uint32_t bars = ring + STAGES * STAGE_BYTES;   // full[s] at bars + 8s, empty[s] after, then Q's
    const uint32_t q_bar = bars + 16 * STAGES;
    const int T = a.T, NH = a.NH_local, C = a.C_local;
    const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
    const int qt = gridDim.y - 1 - blockIdx.y;          // longest rows first
    const int q0 = qt * BM;
    const int n_kt = min(T - 1, q0 + BM - 1) / BN + 1;   // key tiles this block needs
    const int wg = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
    const int wg_lo = q0 + 64 * wg, wg_hi = wg_lo + 63;  // this warpgroup's rows
    const int r0 = wg_lo + 16 * warp + lane / 4;         // this thread's rows: r0 and r0 + 8
    // the tiles with a visible key for some row of this warpgroup: the first n_act of the block's
    const int n_act = wg_lo >= T ? 0 : min(n_kt, wg_hi / BN + 1);

    if (threadIdx.x == 0) mt__att_ring_init<STAGES>(bars, q_bar);
    __syncthreads();   // the barriers exist before anyone waits on them

    // ---- the copies (thread 0 only) ----
    int next_load = 0;   // the next key tile to request
    auto issue = [&](int j) {   // tile j into stage j % STAGES (whose previous tile has been given back)
        uint32_t s = j % STAGES, full = bars + 8 * s, k = ring + s * STAGE_BYTES;
        mt__mbar_arrive_expect_tx(full, STAGE_BYTES);   // out-of-bounds zeros count as bytes too
        mt__tma_load_3d(k, &map_kv, C + h * HS, j * BN, b, full);
        mt__tma_load_3d(k + KV_BYTES, &map_kv, 2 * C + h * HS, j * BN, b, full);
    };
    auto refill = [&](int need) { mt__att_ring_refill<STAGES>(bars, next_load, n_kt, need, issue); };
    if (threadIdx.x == 0) {
        mt__tma_prefetch_map(&map_q);
        mt__tma_prefetch_map(&map_kv);
        mt__mbar_arrive_expect_tx(q_bar, BM * ROW_BYTES);
        mt__tma_load_3d(q_smem, &map_q, h * HS, q0, b, q_bar);
        refill(-1);   // fills the first min(STAGES, n_kt) stages
    }

    const float scale2 = a.scale * 1.4426950408889634f;   // exp(x * scale) = exp2(x * scale2)
    float o[HS / 2];                                      // O: 64 x 64 fp32 per warpgroup
    #pragma unroll
    for (int i = 0; i < HS / 2; i++) o[i] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    float sacc[BN / 2];
    uint32_t p[BN / 16][4], p2[BN / 16][4];   // P, two sets (the loop alternates them)
    const uint32_t q_wg = q_smem + wg * 64 * ROW_BYTES;
    auto issue_s = [&](int j) {   // S = Q K_j^T (async): 4 k16 steps along d, 32 bytes each
        uint32_t k = ring + (j % STAGES) * STAGE_BYTES;
        #pragma unroll
        for (int kk = 0; kk < HS / 16; kk++) {
            uint64_t dq = mt__wgmma_desc(q_wg + 32 * kk, 16, 1024), dk = mt__wgmma_desc(k + 32 * kk, 16, 1024);
            if (kk == 0) mt__att_wgmma_ss_first(sacc, dq, dk);
            else mt__att_wgmma_ss(sacc, dq, dk, 1);
        }
    };
    // O += P V_j (async): 4 k16 steps along the keys, 16 rows = 2048 bytes each
    auto issue_pv = [&](int j, const uint32_t (&pj)[BN / 16][4]) {
        uint32_t v = ring + (j % STAGES) * STAGE_BYTES + KV_BYTES;
        #pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) mt__att_wgmma_pv(o, pj[kk], mt__wgmma_desc(v + 2048 * kk, 64 * ROW_BYTES, 1024));
    };
    auto release = [&](int j) { mt__att_ring_release<STAGES>(bars, j, lane); };
    auto wait_full = [&](int j) {
        if (threadIdx.x == 0) refill(j);   // tile j must have been requested (else: deadlock)
        mt__mbar_wait(bars + 8 * (j % STAGES), (j / STAGES) & 1);
    };

    mt__mbar_wait(q_bar, 0);   // Q has landed
    // tile 0 on its own (no wgmma behind a condition the compiler cannot prove uniform: ptxas would
    // serialise the wgmmas, warning C7520)
    if (n_act > 0) {
        wait_full(0);
        mt__wgmma_fence();
        issue_s(0);
        mt__wgmma_commit();
        if (threadIdx.x == 0) refill(-1);
        mt__wgmma_wait<0>();
        mt__reg_fence_all(sacc);
        float rsum[2], corr[2];
        mt__att_softmax_tile<DROP>(a, sacc, p, m, rsum, corr, 0, r0, BN - 1 > wg_lo, scale2, b, h);
        l[0] = rsum[0];   // (O = 0: nothing to rescale)
        l[1] = rsum[1];
    }
    // one step: tile j's S with tile j-1's PV; p_old (tile j-1's P) is read by PV_{j-1} while the
    // softmax writes p_new
    auto step = [&](int j, uint32_t (&p_old)[BN / 16][4], uint32_t (&p_new)[BN / 16][4]) {
        wait_full(j);
        mt__reg_fence_all(o);        // (keep the compiler from sinking last step's writes below the fence)
        mt__reg_fence_all(p_old);
        mt__wgmma_fence();   // p_old and O written (last step) before these wgmmas read them
        issue_s(j);
        mt__wgmma_commit();
        issue_pv(j - 1, p_old);   // accumulates into O
        mt__wgmma_commit();
        if (threadIdx.x == 0) refill(-1);
        mt__wgmma_wait<1>();   // S_j done (the older group); PV_{j-1} may still run
        mt__reg_fence_all(sacc);
        float rsum[2], corr[2];
        mt__att_softmax_tile<DROP>(a, sacc, p_new, m, rsum, corr, j * BN, r0, j * BN + BN - 1 > wg_lo, scale2, b, h);
        mt__wgmma_wait<0>();   // PV_{j-1} done: O may be rescaled, stage j-1 given back
        mt__reg_fence_all(o);
        release(j - 1);
        #pragma unroll
        for (int i = 0; i < HS / 2; i++) o[i] *= corr[(i / 2) % 2];
        l[0] = l[0] * corr[0] + rsum[0];
        l[1] = l[1] * corr[1] + rsum[1];
    };
    auto last_pv = [&](uint32_t (&p_last)[BN / 16][4]) {   // the last tile's PV
        mt__reg_fence_all(o);
        mt__reg_fence_all(p_last);
        mt__wgmma_fence();
        issue_pv(n_act - 1, p_last);
        mt__wgmma_commit();
        mt__wgmma_wait<0>();
        mt__reg_fence_all(o);
        release(n_act - 1);
    };
    int j = 1;
    for (; j + 1 < n_act; j += 2) {
        step(j, p, p2);
        step(j + 1, p2, p);
    }
    if (j < n_act) {
        step(j, p, p2);
        last_pv(p2);
    } else if (n_act > 0) {
        last_pv(p);
    }
    // tiles this warpgroup does not need (past its diagonal, or all its rows past T): still wait for
    // them and give them back, so that every phase of empty[s] sees all 8 warps in tile order
    for (int j2 = n_act; j2 < n_kt; j2++) {
        wait_full(j2);
        release(j2);
    }
    // ---- out = O / l, lse = m scale + log l (rows past T are not stored) ----
    #pragma unroll
    for (int half = 0; half < 2; half++) {
        float lt = l[half];
        lt += __shfl_xor_sync(0xffffffffu, lt, 1);   // the row sum over the quad's columns
        lt += __shfl_xor_sync(0xffffffffu, lt, 2);
        int t = r0 + 8 * half;
        if (t >= T) continue;
        float inv = 1.0f / lt;
        size_t at = ((size_t)b * T + t) * C + h * HS + 2 * (lane % 4);
        #pragma unroll
        for (int n = 0; n < HS / 8; n++) {
            float x0 = o[4 * n + 2 * half] * inv, x1 = o[4 * n + 2 * half + 1] * inv;
            if (OUT16) *(uint32_t *)((unsigned short *)a.out + at + 8 * n) = mt__pack16x2<0>(x0, x1);
            else *(float2 *)(a.out + at + 8 * n) = make_float2(x0, x1);
        }
        if (lane % 4 == 0) a.lse[((size_t)b * NH + h) * T + t] = m[half] * a.scale + logf(lt);
    }
#endif
}
// a (B, T, W) bf16 tensor (qkv16: W = 3C; the backward's dout16: W = C) as a 3-D tensor map: dims
// {W (innermost), T, B}, boxes of `rows` rows x 64 bf16 (128 bytes, 128-byte swizzle); everything
// at t >= T is out of bounds (read as zeros)
static CUtensorMap mt__att_wg_map(const void *x16, int B, int T, int W, int rows) {
    static PFN_cuTensorMapEncodeTiled_v12000 encode = mt__wgmma_lookup_encode();
    CUtensorMap map;
    cuuint64_t dims[3] = {(cuuint64_t)W, (cuuint64_t)T, (cuuint64_t)B};
    cuuint64_t strides[2] = {(cuuint64_t)W * 2, (cuuint64_t)T * W * 2};   // bytes, dims 1 and 2
    cuuint32_t box[3] = {64, (cuuint32_t)rows, 1};
    cuuint32_t elem_strides[3] = {1, 1, 1};
    CUresult r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, (void *)x16, dims, strides, box, elem_strides,
                        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) mt_fatal("cuTensorMapEncodeTiled failed (error %d) for the attention's operands", (int)r);
    return map;
}
// whether the forward runs the wgmma kernel where it can (bf16, head size 64, a Hopper with sm_90a
// code, 16-byte aligned qkv16): a variable so that the tests can run both kernels
static int mt__attention_wgmma = 1;
static MT_THREAD_LOCAL int mt__att_wg_runs;   // this thread's GPU and binary run wgmma: 0 not asked yet, 1 yes, -1 no
static int mt__attention_wgmma_ok(const mt__attention_args &a, int dtype, int hs) {
    if (!mt__attention_wgmma || dtype != MT_DTYPE_BF16 || hs != 64 || !a.qkv16 || !mt__aligned16(a.qkv16)) return 0;
    if (mt__att_wg_runs == 0) mt__att_wg_runs = mt__wgmma_unsupported() == NULL ? 1 : -1;
    return mt__att_wg_runs == 1;
}
// out16: a.out receives bf16 values (OUT16 above)
static void mt__attention_forward_wgmma_launch(const mt__attention_args &a, int out16, cudaStream_t stream) {
    CUtensorMap map_q = mt__att_wg_map(a.qkv16, a.B, a.T, 3 * a.C_local, MT__ATT_WG_ROWS);
    CUtensorMap map_kv = mt__att_wg_map(a.qkv16, a.B, a.T, 3 * a.C_local, MT__ATT_WG_KEYS);
    int drop = a.p_drop > 0.0f;
    auto kernel = out16 ? (drop ? mt_attention_forward_kernel_wgmma<1, 1> : mt_attention_forward_kernel_wgmma<1, 0>)
                        : (drop ? mt_attention_forward_kernel_wgmma<0, 1> : mt_attention_forward_kernel_wgmma<0, 0>);
    mt__allow_smem((const void *)kernel, MT__ATT_WG_SMEM);
    dim3 grid(a.B * a.NH_local, (a.T + MT__ATT_WG_ROWS - 1) / MT__ATT_WG_ROWS);
    mt__launch("mt_attention_forward_kernel_wgmma", kernel, grid, 256, MT__ATT_WG_SMEM, stream, map_q, map_kv, a);
}

// matches mt_attention_backward_cpu (megatron.h, 3. OPS): the dK, dV half, on tensor cores.
// grid (T/64 key tiles, B*NH_local), 128 threads = 4 warps, each 16 keys of the block's 64. Per
// query tile of BQ = 32 rows, with queries as the columns of every product:
//   S^T = K Q^T, dP'^T = V dO^T  ->  P'^T, dS^T (elementwise)  ->  dV += P'^T dO, dK += dS^T Q
// shared: K, V (64 x (HS+8)) bf16; then two stages of the query tile's Q, dO (BQ x (HS+8) bf16),
// lse (in base 2) and D (BQ floats each): cp.async fills stage qt+1 while the warps use stage qt.
// Occupancy: a thread holds S^T and dP'^T for its rows (2 x BQ/8 x 4 floats) next to its dK and
// dV (2 x HS/8 x 4). With BQ = 64 at HS = 64 that took 241 registers: 2 blocks (8 warps) per SM,
// one instruction issued every 3.4 cycles per scheduler (ncu), the tensor cores waiting on the
// softmax's chain. BQ = 32 halves the first pair, and the launch bound holds the kernel to 128
// registers at HS <= 64: 4 blocks (16 warps) per SM; GPT-2 small's dK/dV 6.9 -> ~6.5 ms a step
// (docs/perf.md). At HS = 128 dK, dV alone are 128 floats a thread: one block, no bound.
__host__ __device__ constexpr int mt__att_dkdv_bq(int hs) { (void)hs; return 32; }
__host__ __device__ constexpr int mt__att_dkdv_min_blocks(int hs) { return hs <= 64 ? 4 : 1; }
template <int HS, int F16>
__global__ void __launch_bounds__(128, mt__att_dkdv_min_blocks(HS))
    mt_attention_backward_dkdv_kernel_mma(mt__attention_args a) {
    const int LD = HS + 8, BQ = mt__att_dkdv_bq(HS);
    const int STAGE = 2 * BQ * LD + 2 * BQ * 2;   // bf16 elements per stage: Q, dO, then lse2 and D (floats)
    __nv_bfloat16 *Ks = (__nv_bfloat16 *)mt__att_smem, *Vs = Ks + 64 * LD, *stages = Vs + 64 * LD;
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, gq = lane / 4, tq = lane % 4;
    int kt = blockIdx.x, b = blockIdx.y / a.NH_local, h = blockIdx.y % a.NH_local;
    int T = a.T;
    size_t C3 = 3 * (size_t)a.C_local;
    const __nv_bfloat16 *q_base = a.qkv16 + (size_t)b * T * C3 + h * HS, *k_base = q_base + a.C_local,
                        *v_base = q_base + 2 * a.C_local;
    const __nv_bfloat16 *do_base = a.dout16 + (size_t)b * T * a.C_local + h * HS;
    const float *lse_bh = a.lse + ((size_t)b * a.NH_local + h) * T, *D_bh = a.dsum + ((size_t)b * a.NH_local + h) * T;
    const float log2e = 1.4426950408889634f, scale2 = a.scale * log2e;
    int q_first = (kt * 64) / BQ;   // query tiles from the diagonal down
    mt__att_load_async<HS, 64>(Ks, k_base, C3, kt * 64, T);   // group 0: K, V and the first Q, dO
    mt__att_load_async<HS, 64>(Vs, v_base, C3, kt * 64, T);
    mt__att_load_async<HS, BQ>(stages + (q_first % 2) * STAGE, q_base, C3, q_first * BQ, T);   // its stage
    mt__att_load_async<HS, BQ>(stages + (q_first % 2) * STAGE + BQ * LD, do_base, a.C_local, q_first * BQ, T);
    mt__cp_async_commit();
    float dk[HS / 8][4], dv[HS / 8][4];
    #pragma unroll
    for (int i = 0; i < HS / 8; i++)
        #pragma unroll
        for (int e = 0; e < 4; e++) { dk[i][e] = 0.0f; dv[i][e] = 0.0f; }
    int key_row[2] = {kt * 64 + warp * 16 + gq, kt * 64 + warp * 16 + gq + 8};
    for (int qt = q_first; qt * BQ < T; qt++) {
        __nv_bfloat16 *Qs = stages + (qt % 2) * STAGE, *dOs = Qs + BQ * LD;
        float *lse2_s = (float *)(dOs + BQ * LD), *D_s = lse2_s + BQ;
        if ((qt + 1) * BQ < T) {   // start the next query tile's copy into the other stage
            __nv_bfloat16 *next = stages + ((qt + 1) % 2) * STAGE;
            mt__att_load_async<HS, BQ>(next, q_base, C3, (qt + 1) * BQ, T);
            mt__att_load_async<HS, BQ>(next + BQ * LD, do_base, a.C_local, (qt + 1) * BQ, T);
            mt__cp_async_commit();
        }
        for (int i = threadIdx.x; i < BQ; i += blockDim.x) {   // this stage's lse, D (plain loads)
            int t = qt * BQ + i;
            lse2_s[i] = t < T ? lse_bh[t] * log2e : 0.0f;
            D_s[i] = t < T ? D_bh[t] : 0.0f;
        }
        if ((qt + 1) * BQ < T) mt__cp_async_wait<1>();   // this tile's group has landed
        else mt__cp_async_wait<0>();
        __syncthreads();
        float st[BQ / 8][4], dpt[BQ / 8][4];   // S^T and dP'^T: rows = my 16 keys, columns = queries
        mt__attention_two_products<F16, HS, BQ>(st, dpt, Ks, Vs, Qs, dOs, LD, warp * 16, lane);
        #pragma unroll
        for (int nt = 0; nt < BQ / 8; nt++)
            #pragma unroll
            for (int e = 0; e < 4; e++) {
                int key = key_row[e / 2], tl = nt * 8 + 2 * tq + e % 2, t = qt * BQ + tl;
                float pd = 0.0f, ds = 0.0f;
                if (t < T && key <= t) {
                    float p = exp2f(st[nt][e] * scale2 - lse2_s[tl]);
                    float mult = a.p_drop > 0.0f ? mt__attention_keep(a, b, h, t, key) : 1.0f;
                    pd = p * mult;
                    ds = p * (dpt[nt][e] * mult - D_s[tl]);
                }
                st[nt][e] = pd;
                dpt[nt][e] = ds;
            }
        #pragma unroll
        for (int kk = 0; kk < BQ / 16; kk++) {   // the reduction runs over the tile's queries
            uint32_t pa[4], sa[4];
            mt__acc_to_frag_a<F16>(pa, st[2 * kk], st[2 * kk + 1]);
            mt__acc_to_frag_a<F16>(sa, dpt[2 * kk], dpt[2 * kk + 1]);
            #pragma unroll
            for (int dp = 0; dp < HS / 16; dp++) {
                uint32_t ob[4], qb[4];
                mt__frag_b_kn(ob, dOs, LD, dp * 16, kk * 16, lane);
                mt__frag_b_kn(qb, Qs, LD, dp * 16, kk * 16, lane);
                mt__mma16<F16>(dv[2 * dp], pa, ob[0], ob[1]);
                mt__mma16<F16>(dv[2 * dp + 1], pa, ob[2], ob[3]);
                mt__mma16<F16>(dk[2 * dp], sa, qb[0], qb[1]);
                mt__mma16<F16>(dk[2 * dp + 1], sa, qb[2], qb[3]);
            }
        }
        __syncthreads();   // this stage is read: the next iteration may start refilling it
    }
    #pragma unroll
    for (int half = 0; half < 2; half++) {
        int key = key_row[half];
        if (key >= T) continue;
        size_t at = ((size_t)b * T + key) * C3 + a.C_local + h * HS;   // dK's row; dV's C_local after it
        if (a.dqkv16) {   // 16 bits, two values in one 4-byte store
            unsigned short *dk_dst = a.dqkv16 + at, *dv_dst = dk_dst + a.C_local;
            #pragma unroll
            for (int i = 0; i < HS / 8; i++) {
                *(uint32_t *)(dk_dst + i * 8 + 2 * tq) =
                    mt__pack16x2<F16>(dk[i][2 * half] * a.scale, dk[i][2 * half + 1] * a.scale);
                *(uint32_t *)(dv_dst + i * 8 + 2 * tq) = mt__pack16x2<F16>(dv[i][2 * half], dv[i][2 * half + 1]);
            }
            continue;
        }
        float *dk_dst = a.dqkv + at, *dv_dst = dk_dst + a.C_local;
        #pragma unroll
        for (int i = 0; i < HS / 8; i++) {
            *(float2 *)(dk_dst + i * 8 + 2 * tq) = make_float2(dk[i][2 * half] * a.scale, dk[i][2 * half + 1] * a.scale);
            *(float2 *)(dv_dst + i * 8 + 2 * tq) = make_float2(dv[i][2 * half], dv[i][2 * half + 1]);
        }
    }
}

// matches mt_attention_backward_cpu (megatron.h, 3. OPS): the dQ half, on tensor cores.
// grid (T/64 query tiles, B*NH_local), 128 threads = 4 warps, each 16 queries of the 64. Per key
// tile of BK keys (64, or 32 when HS = 128) up to the diagonal:
//   S = Q K^T, dP' = dO V^T  ->  dS (elementwise)  ->  dQ += dS K
// shared: Q, dO (64 x (HS+8)), then two stages of K, V (BK x (HS+8)) bf16: cp.async fills stage
// kt+1 while the warps use stage kt.
template <int HS, int F16>
__global__ void __launch_bounds__(128, HS <= 64 ? 3 : 2) mt_attention_backward_dq_kernel_mma(mt__attention_args a) {
    const int LD = HS + 8, BK = HS <= 64 ? 64 : 32;
    __nv_bfloat16 *Qs = (__nv_bfloat16 *)mt__att_smem, *dOs = Qs + 64 * LD, *KVs = dOs + 64 * LD;
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, gq = lane / 4, tq = lane % 4;
    int qt = gridDim.x - 1 - blockIdx.x, b = blockIdx.y / a.NH_local, h = blockIdx.y % a.NH_local;
    int T = a.T;
    size_t C3 = 3 * (size_t)a.C_local;
    const __nv_bfloat16 *q_base = a.qkv16 + (size_t)b * T * C3 + h * HS, *k_base = q_base + a.C_local,
                        *v_base = q_base + 2 * a.C_local;
    const __nv_bfloat16 *do_base = a.dout16 + (size_t)b * T * a.C_local + h * HS;
    const float log2e = 1.4426950408889634f, scale2 = a.scale * log2e;
    mt__att_load_async<HS, 64>(Qs, q_base, C3, qt * 64, T);   // group 0: Q, dO and the first K, V
    mt__att_load_async<HS, 64>(dOs, do_base, a.C_local, qt * 64, T);
    mt__att_load_async<HS, BK>(KVs, k_base, C3, 0, T);
    mt__att_load_async<HS, BK>(KVs + BK * LD, v_base, C3, 0, T);
    mt__cp_async_commit();
    int t_row[2] = {qt * 64 + warp * 16 + gq, qt * 64 + warp * 16 + gq + 8};
    float lse2[2], D[2];
    #pragma unroll
    for (int half = 0; half < 2; half++) {
        int t = t_row[half];
        lse2[half] = t < T ? a.lse[((size_t)b * a.NH_local + h) * T + t] * log2e : 0.0f;
        D[half] = t < T ? a.dsum[((size_t)b * a.NH_local + h) * T + t] : 0.0f;
    }
    float dq[HS / 8][4];
    #pragma unroll
    for (int i = 0; i < HS / 8; i++)
        #pragma unroll
        for (int e = 0; e < 4; e++) dq[i][e] = 0.0f;
    int last_key = min(T - 1, qt * 64 + 63);
    for (int kt = 0; kt * BK <= last_key; kt++) {
        if ((kt + 1) * BK <= last_key) {   // start the next key tile's copy into the other stage
            __nv_bfloat16 *next = KVs + ((kt + 1) % 2) * 2 * BK * LD;
            mt__att_load_async<HS, BK>(next, k_base, C3, (kt + 1) * BK, T);
            mt__att_load_async<HS, BK>(next + BK * LD, v_base, C3, (kt + 1) * BK, T);
            mt__cp_async_commit();
            mt__cp_async_wait<1>();   // this tile's group has landed (the next may still fly)
        } else {
            mt__cp_async_wait<0>();
        }
        __syncthreads();   // ... for every thread's pieces (and Q, dO on the first pass)
        const __nv_bfloat16 *Ks = KVs + (kt % 2) * 2 * BK * LD, *Vs = Ks + BK * LD;
        float s[BK / 8][4], dp[BK / 8][4];   // S and dP: rows = my 16 queries, columns = keys
        mt__attention_two_products<F16, HS, BK>(s, dp, Qs, dOs, Ks, Vs, LD, warp * 16, lane);
        #pragma unroll
        for (int nt = 0; nt < BK / 8; nt++)
            #pragma unroll
            for (int e = 0; e < 4; e++) {
                int t = t_row[e / 2], key = kt * BK + nt * 8 + 2 * tq + e % 2;
                float ds = 0.0f;
                if (t < T && key <= t) {
                    float p = exp2f(s[nt][e] * scale2 - lse2[e / 2]);
                    float mult = a.p_drop > 0.0f ? mt__attention_keep(a, b, h, t, key) : 1.0f;
                    ds = p * (dp[nt][e] * mult - D[e / 2]);
                }
                s[nt][e] = ds;
            }
        mt__attention_acc_product<F16, BK, HS>(dq, s, Ks, LD, lane);   // dQ += dS K: over the tile's keys
        __syncthreads();   // this stage is read: the next iteration may start refilling it
    }
    #pragma unroll
    for (int half = 0; half < 2; half++) {
        int t = t_row[half];
        if (t >= T) continue;
        size_t at = ((size_t)b * T + t) * C3 + h * HS;
        if (a.dqkv16) {   // 16 bits, as the dK/dV kernel
            #pragma unroll
            for (int i = 0; i < HS / 8; i++)
                *(uint32_t *)(a.dqkv16 + at + i * 8 + 2 * tq) =
                    mt__pack16x2<F16>(dq[i][2 * half] * a.scale, dq[i][2 * half + 1] * a.scale);
            continue;
        }
        float *dq_dst = a.dqkv + at;
        #pragma unroll
        for (int i = 0; i < HS / 8; i++) {
            *(float2 *)(dq_dst + i * 8 + 2 * tq) = make_float2(dq[i][2 * half] * a.scale, dq[i][2 * half + 1] * a.scale);
        }
    }
}

// ---- THE ATTENTION BACKWARD ON WGMMA ------------------------------------------------------------
// matches mt_attention_backward_cpu (megatron.h, 3. OPS), as the two mma.sync kernels above; the
// same split (one kernel for dK and dV, one for dQ, each writing with '='), the same math, on the
// forward wgmma kernel's machine: 2 warpgroups of 64 rows each, TMA into a 4-stage ring of 64-row
// tiles on mbarriers (thread 0 issues the copies), and FA3's overlap inside a warpgroup (tile j's
// first products issued together with tile j-1's last ones, two sets of the register operands).
// THE MATH (one head of one sample; base 2 as the forward; lse2 = lse log2 e; D = rowsum(dO * out)):
//   P = exp2(S scale2 - lse2), S = Q K^T, causal;   dP' = dO V^T;   P' = P x dropout;
//   dS = P (dP' x dropout - D);   dV = P'^T dO;   dK = scale dS^T Q;   dQ = scale dS K
// Rows and columns at t >= T arrive as zeros (the tensor maps' bounds) and their lse2 is taken as
// +inf, so their P is exactly 0 (ex2.approx(-inf) = +0): they add nothing and are never stored.
// Operands of the register-A products (P'^T, dS^T, dS) round to bf16 where the mma.sync kernels
// round them: the CPU's emulation (mt_attention_backward_rounded_cpu) holds both.
// Shared memory (both kernels): 1024 alignment | two 128-row blocks (16 KB each) | the ring | 2 KB of
// columns' lse and D (the dK/dV kernel's) | (the dK/dV kernel's: 2 x 8 KB staging dS^T, THE dS
// HAND-OFF below) | mbarriers
static const int MT__ATT_WG_BWD_SMEM = 1024 + 2 * 128 * 128 + MT__ATT_WG_STAGES * 2 * MT__ATT_WG_KEYS * 128 + 2048 +
                                       8 * (2 * MT__ATT_WG_STAGES + 1);
// two 64 x 64 products of one warpgroup from shared memory, K-major, 4 k16 steps each (async):
// d1 = A1 B1^T, d2 = A2 B2^T, every operand a 128-byte-swizzled block of 64-element rows
__device__ static inline void mt__att_wgmma_ss_pair(float (&d1)[32], uint32_t a1, uint32_t b1, float (&d2)[32],
                                                    uint32_t a2, uint32_t b2) {
    #pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        uint64_t da = mt__wgmma_desc(a1 + 32 * kk, 16, 1024), db = mt__wgmma_desc(b1 + 32 * kk, 16, 1024);
        if (kk == 0) mt__att_wgmma_ss_first(d1, da, db);
        else mt__att_wgmma_ss(d1, da, db, 1);
    }
    #pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        uint64_t da = mt__wgmma_desc(a2 + 32 * kk, 16, 1024), db = mt__wgmma_desc(b2 + 32 * kk, 16, 1024);
        if (kk == 0) mt__att_wgmma_ss_first(d2, da, db);
        else mt__att_wgmma_ss(d2, da, db, 1);
    }
}
// d += X B: X from registers (4 k16 fragments), B a 64-row block in shared memory, MN-major (the
// reduction runs over its rows), as the forward's O += P V
__device__ static inline void mt__att_wgmma_rs(float (&d)[32], const uint32_t (&x)[4][4], uint32_t b) {
    #pragma unroll
    for (int kk = 0; kk < 4; kk++) mt__att_wgmma_pv(d, x[kk], mt__wgmma_desc(b + 2048 * kk, 64 * 128, 1024));
}
// one dQ store: rows r0, r0 + 8 of the warpgroup's accumulator d (times mul) into row-major dst
// rows of `ld` elements at column col0, in 16 bits (dst16) or fp32 (dst32); rows >= T skipped
__device__ static inline void mt__att_wg_store(const float (&d)[32], float mul, unsigned short *dst16, float *dst32,
                                               size_t row_base, size_t ld, int r0, int T) {
    const int q = threadIdx.x % 4;
    #pragma unroll
    for (int half = 0; half < 2; half++) {
        int t = r0 + 8 * half;
        if (t >= T) continue;
        size_t at = (row_base + t) * ld + 2 * q;
        #pragma unroll
        for (int n = 0; n < 8; n++) {
            float x0 = d[4 * n + 2 * half] * mul, x1 = d[4 * n + 2 * half + 1] * mul;
            if (dst16) *(uint32_t *)(dst16 + at + 8 * n) = mt__pack16x2<0>(x0, x1);
            else *(float2 *)(dst32 + at + 8 * n) = make_float2(x0, x1);
        }
    }
}

// dQ. grid (B * NH_local, ceil(T / 128)), 256 threads, MT__ATT_WG_BWD_SMEM bytes. A block owns 128
// query rows; warpgroup w rows 64w..64w+63. Q and dO (128 rows each) come once; K, V tiles of 64
// keys stream through the ring up to the diagonal. Per key tile j, per warpgroup:
//   S = Q K_j^T, dP' = dO V_j^T (8 wgmmas from shared memory)  ->  dS (registers)  ->  dQ += dS K_j
// (K_j MN-major). Tile j's S, dP' are issued with tile j-1's dS K_{j-1}, and dS_j is computed while
// that runs. map_q: qkv16, 128-row boxes; map_do: dout16, 128-row boxes; map_kv: qkv16, 64-row boxes.
__global__ void __launch_bounds__(256, 1)
    mt_attention_backward_dq_kernel_wgmma(const __grid_constant__ CUtensorMap map_q,
                                          const __grid_constant__ CUtensorMap map_do,
                                          const __grid_constant__ CUtensorMap map_kv, const mt__attention_args a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    mt__pdl_start();   // (launched with programmatic dependent launch inside a training graph)
    const int HS = 64, BM = 128, BN = MT__ATT_WG_KEYS, STAGES = MT__ATT_WG_STAGES, ROW_BYTES = 128;
    extern __shared__ uint8_t mt__att_wg_smem_raw[];
    const uint32_t base = (mt__smem_u32(mt__att_wg_smem_raw) + 1023) & ~1023u;
    const uint32_t q_smem = base, do_smem = base + BM * ROW_BYTES, ring = do_smem + BM * ROW_BYTES;
    const uint32_t STAGE_BYTES = 2 * BN * ROW_BYTES, KV_BYTES = BN * ROW_BYTES;
    const uint32_t bars = ring + STAGES * STAGE_BYTES + 2048;   // full[s], empty[s], then Q and dO's
    const uint32_t q_bar = bars + 16 * STAGES;
    const int T = a.T, NH = a.NH_local, C = a.C_local;
    const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
    const int qt = gridDim.y - 1 - blockIdx.y;           // longest rows first
    const int q0 = qt * BM;
    const int n_kt = min(T - 1, q0 + BM - 1) / BN + 1;   // key tiles this block needs
    const int wg = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32, quad = lane % 4;
    const int wg_lo = q0 + 64 * wg, wg_hi = wg_lo + 63;
    const int r0 = wg_lo + 16 * warp + lane / 4;          // this thread's rows: r0 and r0 + 8
    const int n_act = wg_lo >= T ? 0 : min(n_kt, wg_hi / BN + 1);

    if (threadIdx.x == 0) mt__att_ring_init<STAGES>(bars, q_bar);
    __syncthreads();
    // ---- the copies (thread 0 only), as the forward's ----
    int next_load = 0;
    auto issue = [&](int j) {
        uint32_t s = j % STAGES, full = bars + 8 * s, k = ring + s * STAGE_BYTES;
        mt__mbar_arrive_expect_tx(full, STAGE_BYTES);
        mt__tma_load_3d(k, &map_kv, C + h * HS, j * BN, b, full);
        mt__tma_load_3d(k + KV_BYTES, &map_kv, 2 * C + h * HS, j * BN, b, full);
    };
    auto refill = [&](int need) { mt__att_ring_refill<STAGES>(bars, next_load, n_kt, need, issue); };
    if (threadIdx.x == 0) {
        mt__tma_prefetch_map(&map_q);
        mt__tma_prefetch_map(&map_do);
        mt__tma_prefetch_map(&map_kv);
        mt__mbar_arrive_expect_tx(q_bar, 2 * BM * ROW_BYTES);
        mt__tma_load_3d(q_smem, &map_q, h * HS, q0, b, q_bar);
        mt__tma_load_3d(do_smem, &map_do, h * HS, q0, b, q_bar);
        refill(-1);
    }

    const float log2e = 1.4426950408889634f, scale2 = a.scale * log2e;
    float lse2[2], Drow[2];   // this thread's rows' lse (base 2; +inf past T) and D
    #pragma unroll
    for (int half = 0; half < 2; half++) {
        int t = r0 + 8 * half;
        size_t at = ((size_t)b * NH + h) * T + t;
        lse2[half] = t < T ? a.lse[at] * log2e : INFINITY;
        Drow[half] = t < T ? a.dsum[at] : 0.0f;
    }
    float dq[HS / 2];
    #pragma unroll
    for (int i = 0; i < HS / 2; i++) dq[i] = 0.0f;
    float sacc[BN / 2], dpacc[BN / 2];
    uint32_t ds[BN / 16][4], ds2[BN / 16][4];   // dS, two sets (the loop alternates them)
    const uint32_t q_wg = q_smem + wg * 64 * ROW_BYTES, do_wg = do_smem + wg * 64 * ROW_BYTES;
    auto issue_sdp = [&](int j) {   // S = Q K_j^T, dP' = dO V_j^T
        uint32_t k = ring + (j % STAGES) * STAGE_BYTES;
        mt__att_wgmma_ss_pair(sacc, q_wg, k, dpacc, do_wg, k + KV_BYTES);
    };
    auto release = [&](int j) { mt__att_ring_release<STAGES>(bars, j, lane); };
    auto wait_full = [&](int j) {
        if (threadIdx.x == 0) refill(j);
        mt__mbar_wait(bars + 8 * (j % STAGES), (j / STAGES) & 1);
    };
    // dS of tile j from S, dP' in sacc, dpacc, packed into dsj
    auto compute_ds = [&](int j, uint32_t (&dsj)[BN / 16][4]) {
        const int key0 = j * BN, diag = key0 + BN - 1 > wg_lo;
        #pragma unroll
        for (int half = 0; half < 2; half++) {
            int row = r0 + 8 * half;
            #pragma unroll
            for (int n = 0; n < 8; n++)
                #pragma unroll
                for (int e = 0; e < 2; e++) {
                    int i = 4 * n + 2 * half + e, key = key0 + 8 * n + 2 * quad + e;
                    float p = mt__ex2(fmaf(sacc[i], scale2, -lse2[half]));
                    if (diag && key > row) p = 0.0f;
                    float dp = dpacc[i];
                    if (a.p_drop > 0.0f && p > 0.0f) dp *= mt__attention_keep(a, b, h, row, key);
                    sacc[i] = p * (dp - Drow[half]);
                }
        }
        mt__att_acc_to_a(dsj, sacc);
    };
    mt__mbar_wait(q_bar, 0);   // Q and dO have landed
    if (n_act > 0) {           // tile 0 on its own (see the forward)
        wait_full(0);
        mt__wgmma_fence();
        issue_sdp(0);
        mt__wgmma_commit();
        if (threadIdx.x == 0) refill(-1);
        mt__wgmma_wait<0>();
        mt__reg_fence_all(sacc);
        mt__reg_fence_all(dpacc);
        compute_ds(0, ds);
    }
    auto step = [&](int j, uint32_t (&ds_old)[BN / 16][4], uint32_t (&ds_new)[BN / 16][4]) {
        wait_full(j);
        mt__reg_fence_all(dq);
        mt__reg_fence_all(ds_old);
        mt__wgmma_fence();
        issue_sdp(j);
        mt__wgmma_commit();
        mt__att_wgmma_rs(dq, ds_old, ring + ((j - 1) % STAGES) * STAGE_BYTES);   // dQ += dS_{j-1} K_{j-1}
        mt__wgmma_commit();
        if (threadIdx.x == 0) refill(-1);
        mt__wgmma_wait<1>();   // S_j, dP'_j done; dS_{j-1} K_{j-1} may still run
        mt__reg_fence_all(sacc);
        mt__reg_fence_all(dpacc);
        compute_ds(j, ds_new);
        mt__wgmma_wait<0>();
        mt__reg_fence_all(dq);
        release(j - 1);
    };
    auto last = [&](uint32_t (&ds_last)[BN / 16][4]) {
        mt__reg_fence_all(dq);
        mt__reg_fence_all(ds_last);
        mt__wgmma_fence();
        mt__att_wgmma_rs(dq, ds_last, ring + ((n_act - 1) % STAGES) * STAGE_BYTES);
        mt__wgmma_commit();
        mt__wgmma_wait<0>();
        mt__reg_fence_all(dq);
        release(n_act - 1);
    };
    int j = 1;
    for (; j + 1 < n_act; j += 2) {
        step(j, ds, ds2);
        step(j + 1, ds2, ds);
    }
    if (j < n_act) {
        step(j, ds, ds2);
        last(ds2);
    } else if (n_act > 0) {
        last(ds);
    }
    for (int j2 = n_act; j2 < n_kt; j2++) {   // tiles past this warpgroup's diagonal: wait, give back
        wait_full(j2);
        release(j2);
    }
    size_t C3 = 3 * (size_t)C;
    mt__att_wg_store(dq, a.scale, a.dqkv16 ? a.dqkv16 + h * HS : NULL, a.dqkv16 ? NULL : a.dqkv + h * HS,
                     (size_t)b * T, C3, r0, T);
#endif
}

// dK, dV. grid (B * NH_local, ceil(T / 128)), 256 threads, MT__ATT_WG_BWD_SMEM bytes. A block owns
// 128 keys; warpgroup w keys 64w..64w+63 of them, its rows. K and V (128 rows each) come once; Q
// and dO tiles of 64 queries stream through the ring from the block's diagonal down. Per query
// tile j, per warpgroup, with the queries as the columns:
//   S^T = K Q_j^T, dP'^T = V dO_j^T (from shared memory)  ->  P'^T, dS^T (registers)
//   dV += P'^T dO_j, dK += dS^T Q_j (dO_j, Q_j MN-major)
// and tile j's first pair issued with tile j-1's second. The first tile lies above the diagonal of
// warpgroup 1's keys: it waits for it and gives it back. The columns' lse and D: each warpgroup
// copies its tile's 64 + 64 floats from global memory into shared memory (two buffers, by tile
// parity) while its wgmmas run, then meets on its own named barrier (1 + w, 128 threads). (Kept
// in registers they cost 32 more a thread: ptxas spilled at 255.)
// Blocks from the first keys (the most query tiles) to the last. map_kv: qkv16, 128-row boxes;
// map_q: qkv16, 64-row boxes; map_do: dout16, 64-row boxes. hand_off: each dS^T tile also goes to
// global memory through map_ds (64-row boxes) for the dQ kernel (THE dS HAND-OFF, below).
// DROP: the instance for a.p_drop > 0.
template <int DROP>
__global__ void __launch_bounds__(256, 1)
    mt_attention_backward_dkdv_kernel_wgmma(const __grid_constant__ CUtensorMap map_kv,
                                            const __grid_constant__ CUtensorMap map_q,
                                            const __grid_constant__ CUtensorMap map_do,
                                            const __grid_constant__ CUtensorMap map_ds, const mt__attention_args a,
                                            int hand_off) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    mt__pdl_start();   // (launched with programmatic dependent launch inside a training graph)
    const int HS = 64, BM = 128, BN = 64, STAGES = MT__ATT_WG_STAGES, ROW_BYTES = 128;
    extern __shared__ uint8_t mt__att_wg_smem_raw[];
    const uint32_t base = (mt__smem_u32(mt__att_wg_smem_raw) + 1023) & ~1023u;
    const uint32_t k_smem = base, v_smem = base + BM * ROW_BYTES, ring = v_smem + BM * ROW_BYTES;
    const uint32_t STAGE_BYTES = 2 * BN * ROW_BYTES, Q_BYTES = BN * ROW_BYTES;   // a stage: Q_j, then dO_j
    const uint32_t cols = ring + STAGES * STAGE_BYTES, ds_stage = cols + 2048, bars = ds_stage + 2 * 8192;
    const uint32_t kv_bar = bars + 16 * STAGES;
    const int T = a.T, NH = a.NH_local, C = a.C_local;
    const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
    const int k0 = blockIdx.y * BM;                      // the block's first key
    const int j_first = k0 / BN, n_t = (T + BN - 1) / BN - j_first;   // query tiles j_first .. : n_t of them
    const int wg = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32, quad = lane % 4;
    const int wg_lo = k0 + 64 * wg, wg_hi = wg_lo + 63;  // this warpgroup's keys
    const int r0 = wg_lo + 16 * warp + lane / 4;         // this thread's keys: r0 and r0 + 8
    // local tiles i = 0 .. n_t - 1 (query tile j_first + i); this warpgroup's first is i = wg (its
    // diagonal), none when its keys are all past T
    const int i_first = wg_lo >= T ? n_t : min(wg, n_t);

    if (threadIdx.x == 0) mt__att_ring_init<STAGES>(bars, kv_bar);
    __syncthreads();
    int next_load = 0;
    auto issue = [&](int i) {
        uint32_t s = i % STAGES, full = bars + 8 * s, qs = ring + s * STAGE_BYTES;
        mt__mbar_arrive_expect_tx(full, STAGE_BYTES);
        mt__tma_load_3d(qs, &map_q, h * HS, (j_first + i) * BN, b, full);
        mt__tma_load_3d(qs + Q_BYTES, &map_do, h * HS, (j_first + i) * BN, b, full);
    };
    auto refill = [&](int need) { mt__att_ring_refill<STAGES>(bars, next_load, n_t, need, issue); };
    if (threadIdx.x == 0) {
        mt__tma_prefetch_map(&map_kv);
        mt__tma_prefetch_map(&map_q);
        mt__tma_prefetch_map(&map_do);
        mt__mbar_arrive_expect_tx(kv_bar, 2 * BM * ROW_BYTES);
        mt__tma_load_3d(k_smem, &map_kv, C + h * HS, k0, b, kv_bar);
        mt__tma_load_3d(v_smem, &map_kv, 2 * C + h * HS, k0, b, kv_bar);
        refill(-1);
    }

    const float log2e = 1.4426950408889634f, scale2 = a.scale * log2e;
    const float *lse_bh = a.lse + ((size_t)b * NH + h) * T, *D_bh = a.dsum + ((size_t)b * NH + h) * T;
    float dk[HS / 2], dv[HS / 2];
    #pragma unroll
    for (int i = 0; i < HS / 2; i++) { dk[i] = 0.0f; dv[i] = 0.0f; }
    float sacc[BN / 2], dpacc[BN / 2];
    uint32_t p[BN / 16][4], ds[BN / 16][4], p2[BN / 16][4], ds2[BN / 16][4];   // two sets, alternated
    const uint32_t k_wg = k_smem + wg * 64 * ROW_BYTES, v_wg = v_smem + wg * 64 * ROW_BYTES;
    auto issue_sdp = [&](int i) {   // S^T = K Q_i^T, dP'^T = V dO_i^T
        uint32_t qs = ring + (i % STAGES) * STAGE_BYTES;
        mt__att_wgmma_ss_pair(sacc, k_wg, qs, dpacc, v_wg, qs + Q_BYTES);
    };
    auto issue_dvdk = [&](int i, const uint32_t (&pi)[BN / 16][4], const uint32_t (&dsi)[BN / 16][4]) {
        uint32_t qs = ring + (i % STAGES) * STAGE_BYTES;
        mt__att_wgmma_rs(dv, pi, qs + Q_BYTES);   // dV += P'^T dO_i
        mt__att_wgmma_rs(dk, dsi, qs);            // dK += dS^T Q_i
    };
    auto release = [&](int i) { mt__att_ring_release<STAGES>(bars, i, lane); };
    auto wait_full = [&](int i) {
        if (threadIdx.x == 0) refill(i);
        mt__mbar_wait(bars + 8 * (i % STAGES), (i / STAGES) & 1);
    };
    // this warpgroup's two buffers of the columns' lse (base 2; +inf past T) and D: 64 + 64 floats each
    float *cols_wg = (float *)(mt__att_wg_smem_raw + (cols - mt__smem_u32(mt__att_wg_smem_raw))) + wg * 256;
    auto load_cols = [&](int i) {   // tile i's into buffer i % 2; then the warpgroup's barrier
        int x = threadIdx.x % 128, t = (j_first + i) * BN + x % 64;
        float v = x < 64 ? (t < T ? lse_bh[t] * log2e : INFINITY) : (t < T ? D_bh[t] : 0.0f);
        cols_wg[(i % 2) * 128 + x] = v;
        asm volatile("bar.sync %0, 128;\n" ::"r"(1 + wg) : "memory");
    };
    // P'^T and dS^T of tile i from sacc, dpacc, packed into pi, dsi
    auto compute = [&](int i, uint32_t (&pi)[BN / 16][4], uint32_t (&dsi)[BN / 16][4]) {
        const int t0 = (j_first + i) * BN, diag = t0 < wg_hi;   // some key of the warpgroup > some query
        const float *lse2c = cols_wg + (i % 2) * 128, *Dc = lse2c + 64;   // column c at [c]
        // (DROP = 0, the instance without dropout, holds no multipliers at all: as the forward's
        // softmax, mt__att_softmax_tile. The same bits: with them off, mult = 1, and x * 1 and
        // fma(x, 1, -D) are exact)
        #pragma unroll
        for (int half = 0; half < 2; half++) {
            int key = r0 + 8 * half;
            #pragma unroll
            for (int n = 0; n < 8; n++)
                #pragma unroll
                for (int e = 0; e < 2; e++) {
                    int x = 4 * n + 2 * half + e, c = 8 * n + 2 * quad + e, t = t0 + c;
                    float pv = mt__ex2(fmaf(sacc[x], scale2, -lse2c[c]));
                    if (diag && key > t) pv = 0.0f;
                    float mult = DROP && a.p_drop > 0.0f && pv > 0.0f ? mt__attention_keep(a, b, h, t, key) : 1.0f;
                    sacc[x] = DROP ? pv * mult : pv;
                    dpacc[x] = DROP ? pv * (dpacc[x] * mult - Dc[c]) : pv * (dpacc[x] - Dc[c]);
                }
        }
        mt__att_acc_to_a(pi, sacc);
        mt__att_acc_to_a(dsi, dpacc);
        if (hand_off) {   // THE dS HAND-OFF: this warpgroup's 64 x 64 tile of dS^T, as the dQ kernel will read it
            const uint32_t st = ds_stage + wg * 8192;
            if (threadIdx.x % 128 == 0) mt__tma_store_wait_read<0>();   // the last tile's store has read st
            asm volatile("bar.sync %0, 128;\n" ::"r"(3 + wg) : "memory");
            // rows (keys) 16 warp + g and + 8, columns (queries) 16 kk + 2 q (+ 8): the 16-byte chunk c of
            // row r at c ^ (r % 8), the map's 128-byte swizzle (and no two lanes of a store on one bank)
            const int g = lane / 4, rl = 16 * warp + g;
            #pragma unroll
            for (int kk = 0; kk < 4; kk++)
                #pragma unroll
                for (int e = 0; e < 4; e++) {
                    int r = rl + 8 * (e & 1), chunk = 2 * kk + (e >> 1);
                    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(st + r * 128 + ((chunk ^ (r & 7)) << 4) + 4 * quad),
                                 "r"(dsi[kk][e]) : "memory");
                }
            mt__fence_proxy_async();
            asm volatile("bar.sync %0, 128;\n" ::"r"(3 + wg) : "memory");
            if (threadIdx.x % 128 == 0) {
                const int qt = j_first + i, qb = qt / 2, nqb = (T + 127) / 128;
                mt__tma_store_3d(&map_ds, 0, 64 * (qt % 2), bh * nqb * (nqb + 1) + qb * (qb + 1) + k0 / BN + wg, st);
                mt__tma_store_commit();
            }
        }
    };
    mt__mbar_wait(kv_bar, 0);   // K and V have landed
    for (int i = 0; i < i_first; i++) {   // tiles above this warpgroup's keys: wait, give back
        wait_full(i);
        release(i);
    }
    if (i_first < n_t) {   // the first tile on its own
        wait_full(i_first);
        mt__wgmma_fence();
        issue_sdp(i_first);
        mt__wgmma_commit();
        if (threadIdx.x == 0) refill(-1);
        load_cols(i_first);
        mt__wgmma_wait<0>();
        mt__reg_fence_all(sacc);
        mt__reg_fence_all(dpacc);
        compute(i_first, p, ds);
    }
    auto step = [&](int i, uint32_t (&p_old)[BN / 16][4], uint32_t (&ds_old)[BN / 16][4],
                    uint32_t (&p_new)[BN / 16][4], uint32_t (&ds_new)[BN / 16][4]) {
        wait_full(i);
        mt__reg_fence_all(dk);
        mt__reg_fence_all(dv);
        mt__reg_fence_all(p_old);
        mt__reg_fence_all(ds_old);
        mt__wgmma_fence();
        issue_sdp(i);
        mt__wgmma_commit();
        issue_dvdk(i - 1, p_old, ds_old);
        mt__wgmma_commit();
        if (threadIdx.x == 0) refill(-1);
        load_cols(i);
        mt__wgmma_wait<1>();   // S^T, dP'^T of tile i done; tile i-1's dV, dK may still run
        mt__reg_fence_all(sacc);
        mt__reg_fence_all(dpacc);
        compute(i, p_new, ds_new);
        mt__wgmma_wait<0>();
        mt__reg_fence_all(dk);
        mt__reg_fence_all(dv);
        release(i - 1);
    };
    auto last = [&](uint32_t (&p_last)[BN / 16][4], uint32_t (&ds_last)[BN / 16][4]) {
        mt__reg_fence_all(dk);
        mt__reg_fence_all(dv);
        mt__reg_fence_all(p_last);
        mt__reg_fence_all(ds_last);
        mt__wgmma_fence();
        issue_dvdk(n_t - 1, p_last, ds_last);
        mt__wgmma_commit();
        mt__wgmma_wait<0>();
        mt__reg_fence_all(dk);
        mt__reg_fence_all(dv);
        release(n_t - 1);
    };
    if (i_first < n_t) {
        int i = i_first + 1;
        for (; i + 1 < n_t; i += 2) {
            step(i, p, ds, p2, ds2);
            step(i + 1, p2, ds2, p, ds);
        }
        if (i < n_t) {
            step(i, p, ds, p2, ds2);
            last(p2, ds2);
        } else {
            last(p, ds);
        }
    }
    size_t C3 = 3 * (size_t)C;
    unsigned short *dk16 = a.dqkv16 ? a.dqkv16 + C + h * HS : NULL;
    float *dk32 = a.dqkv16 ? NULL : a.dqkv + C + h * HS;
    mt__att_wg_store(dk, a.scale, dk16, dk32, (size_t)b * T, C3, r0, T);
    mt__att_wg_store(dv, 1.0f, dk16 ? dk16 + C : NULL, dk32 ? dk32 + C : NULL, (size_t)b * T, C3, r0, T);
    if (hand_off && threadIdx.x % 128 == 0) mt__tma_store_wait_all<0>();   // the dS^T tiles are in global memory
#endif
}
// THE dS HAND-OFF (the default; MT_ATT_DQ_FROM_DS=0 turns it off). The dQ kernel above recomputes S and
// dP' for every tile the dK/dV kernel has already done them for: 3 products where 1 would do. Instead
// the dK/dV kernel writes each dS^T tile it computes (bf16, the values its dK product reads) to
// scratch, and the kernel below reads them back: dQ = scale dS K, one product a tile, no exp, no
// dropout mask, no atomics (each dQ row is summed in key order by one warpgroup, as before). The
// dK/dV kernel's warpgroup writes its tile's registers into 8 KB of shared memory in the map's
// 128-byte swizzle (two named-barrier meetings a tile, 3 + w) and one thread stores it with the TMA,
// asynchronously. (Written from registers straight to global memory, 4 bytes a lane, the stores made
// the dK/dV kernel 3x slower: 211 -> 654 us a layer at GPT-2 small's shape.)
// MEASURED (docs/perf.md, sessions 35 and 40): dQ 160 -> 85 us a layer, dK/dV 211 -> 256: ~11 us of
// that for the code being there at all (255 registers), ~17 for the staging, ~17 for the stores'
// traffic. Moving the staging to where the warps wait for the tensor cores gained nothing.
// The price: dS^T written once and read once, bf16, half the causal square: (B NH) x 72 pairs of
// 64 x 64 tiles at T = 1024 = 226 MB at GPT-2 small's B = 16 (~55 us of HBM each way).
// Layout (mt_gpu_attention_ds_bytes): per (b, h), per query block qb of 128 (nqb = ceil(T / 128)),
// per key tile kt = 0 .. 2 qb + 1 a PAIR of tiles [64 keys][64 queries] (queries 128 qb .. + 63, then
// + 64 .. + 127), pair index qb (qb + 1) + kt; nqb (nqb + 1) pairs a head. The dQ kernel loads a pair
// with one TMA box {64, 128, 1}: its warpgroup w reads tile w. The tile (kt = 2 qb + 1, first
// half) lies above the diagonal and is never written; the warpgroup that would read it stops before.
// Tiles past T are not written either: no product reads them (n_act below; the store skips rows >= T).
//
// dQ from dS^T. grid (ceil(T / 128), B * NH_local), 256 threads, MT__ATT_WG_DQ_DS_SMEM bytes. A block
// owns 128 query rows; warpgroup w rows 64w..64w+63. Per key tile j up to the diagonal, K_j (64 x 64)
// and the pair of dS^T tiles (16 KB) come through a 4-stage ring; per warpgroup
//   dQ += dS_j K_j   (A = its dS^T tile read through the transpose: MN-major; B = K_j MN-major)
// each tile's product waited for before its stage goes back (the kernel waits on memory, not on the
// tensor cores: the ring's next three tiles are on their way meanwhile).
// map_k: qkv16, 64-row boxes; map_ds: the tiles as {64, 128, pairs} (mt__att_ds_map, 128-row boxes).
// the dK/dV kernel's: MT__ATT_WG_BWD_SMEM and, before its mbarriers, two 8 KB tiles staging dS^T
static const int MT__ATT_WG_DKDV_SMEM = MT__ATT_WG_BWD_SMEM + 2 * 8192;
static const int MT__ATT_WG_DQ_DS_SMEM = 1024 + MT__ATT_WG_STAGES * 3 * MT__ATT_WG_KEYS * 128 + 8 * (2 * MT__ATT_WG_STAGES + 1);
__global__ void __launch_bounds__(256, 1)
    mt_attention_backward_dq_ds_kernel_wgmma(const __grid_constant__ CUtensorMap map_k,
                                             const __grid_constant__ CUtensorMap map_ds, const mt__attention_args a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    mt__pdl_start();   // (launched with programmatic dependent launch inside a training graph)
    const int HS = 64, BM = 128, BN = MT__ATT_WG_KEYS, STAGES = MT__ATT_WG_STAGES, ROW_BYTES = 128;
    extern __shared__ uint8_t mt__att_wg_smem_raw[];
    const uint32_t ring = (mt__smem_u32(mt__att_wg_smem_raw) + 1023) & ~1023u;
    const uint32_t K_BYTES = BN * ROW_BYTES, STAGE_BYTES = 3 * K_BYTES;   // a stage: K_j, then the dS^T pair
    const uint32_t bars = ring + STAGES * STAGE_BYTES, once = bars + 16 * STAGES;   // (once: unused)
    const int T = a.T, NH = a.NH_local, C = a.C_local;
    // (the blocks of one head next to each other: they read the same K tiles, from L2 after the first)
    const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const int qb = gridDim.x - 1 - blockIdx.x;           // longest rows first, within the head
    const int q0 = qb * BM, nqb = (T + BM - 1) / BM;
    const int n_kt = min(T - 1, q0 + BM - 1) / BN + 1;   // key tiles this block needs
    const int wg = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
    const int wg_lo = q0 + 64 * wg, wg_hi = wg_lo + 63;
    const int r0 = wg_lo + 16 * warp + lane / 4;          // this thread's rows: r0 and r0 + 8
    const int n_act = wg_lo >= T ? 0 : min(n_kt, wg_hi / BN + 1);   // key tiles this warpgroup multiplies
    const int pair0 = bh * nqb * (nqb + 1) + qb * (qb + 1);         // key tile j's pair: pair0 + j

    if (threadIdx.x == 0) mt__att_ring_init<STAGES>(bars, once);
    __syncthreads();
    int next_load = 0;
    auto issue = [&](int j) {
        uint32_t s = j % STAGES, full = bars + 8 * s, k = ring + s * STAGE_BYTES;
        mt__mbar_arrive_expect_tx(full, STAGE_BYTES);
        mt__tma_load_3d(k, &map_k, C + h * HS, j * BN, b, full);
        mt__tma_load_3d(k + K_BYTES, &map_ds, 0, 0, pair0 + j, full);
    };
    auto refill = [&](int need) { mt__att_ring_refill<STAGES>(bars, next_load, n_kt, need, issue); };
    if (threadIdx.x == 0) {
        mt__tma_prefetch_map(&map_k);
        mt__tma_prefetch_map(&map_ds);
        refill(-1);
    }
    float dq[HS / 2];
    #pragma unroll
    for (int i = 0; i < HS / 2; i++) dq[i] = 0.0f;
    auto release = [&](int j) { mt__att_ring_release<STAGES>(bars, j, lane); };
    auto wait_full = [&](int j) {
        if (threadIdx.x == 0) refill(j);
        mt__mbar_wait(bars + 8 * (j % STAGES), (j / STAGES) & 1);
    };
    for (int j = 0; j < n_act; j++) {   // (the product waited for at once: the ring keeps the loads ahead)
        wait_full(j);
        uint32_t k = ring + (j % STAGES) * STAGE_BYTES, ds = k + K_BYTES + wg * K_BYTES;
        mt__reg_fence_all(dq);
        mt__wgmma_fence();
        #pragma unroll
        for (int kk = 0; kk < 4; kk++)   // keys 16 kk .. 16 kk + 15: rows of both tiles
            mt__att_wgmma_ss<1, 1>(dq, mt__wgmma_desc(ds + 2048 * kk, 64 * 128, 1024),
                                   mt__wgmma_desc(k + 2048 * kk, 64 * 128, 1024), 1);
        mt__wgmma_commit();
        mt__wgmma_wait<0>();
        mt__reg_fence_all(dq);
        release(j);
        if (threadIdx.x == 0) refill(-1);
    }
    for (int j = n_act; j < n_kt; j++) {   // past this warpgroup's diagonal (or its rows): wait, give back
        wait_full(j);
        release(j);
    }
    size_t C3 = 3 * (size_t)C;
    mt__att_wg_store(dq, a.scale, a.dqkv16 ? a.dqkv16 + h * HS : NULL, a.dqkv16 ? NULL : a.dqkv + h * HS,
                     (size_t)b * T, C3, r0, T);
#endif
}
// the dS^T tiles as a 3-D tensor map: {64 queries (innermost), 128 rows (the pair's two tiles of 64
// keys), pairs}, 128-byte swizzle; boxes of `rows` rows (128: a pair, the dQ kernel's loads; 64: one
// tile, the dK/dV kernel's stores)
static CUtensorMap mt__att_ds_map(const unsigned short *ds_t, size_t pairs, int rows) {
    static PFN_cuTensorMapEncodeTiled_v12000 encode = mt__wgmma_lookup_encode();
    CUtensorMap map;
    cuuint64_t dims[3] = {64, 128, (cuuint64_t)pairs};
    cuuint64_t strides[2] = {64 * 2, 128 * 64 * 2};   // bytes, dims 1 and 2
    cuuint32_t box[3] = {64, (cuuint32_t)rows, 1};
    cuuint32_t elem_strides[3] = {1, 1, 1};
    CUresult r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, (void *)ds_t, dims, strides, box, elem_strides,
                        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) mt_fatal("cuTensorMapEncodeTiled failed (error %d) for the attention's dS tiles", (int)r);
    return map;
}
// whether the wgmma backward hands dS over (THE dS HAND-OFF): -1 not read yet; MT_ATT_DQ_FROM_DS=0: the
// dQ kernel that recomputes S and dP' (to measure against; the tests run both)
static int mt__att_dq_from_ds = -1;
static int mt__att_dq_from_ds_mode(void) {
    if (mt__att_dq_from_ds < 0) {
        const char *env = getenv("MT_ATT_DQ_FROM_DS");
        mt__att_dq_from_ds = env && *env ? atoi(env) : 1;
    }
    return mt__att_dq_from_ds;
}
static void mt__attention_backward_wgmma_launch(const mt__attention_args &a, cudaStream_t stream) {
    CUtensorMap qkv128 = mt__att_wg_map(a.qkv16, a.B, a.T, 3 * a.C_local, 128);
    CUtensorMap qkv64 = mt__att_wg_map(a.qkv16, a.B, a.T, 3 * a.C_local, 64);
    CUtensorMap do128 = mt__att_wg_map(a.dout16, a.B, a.T, a.C_local, 128);
    CUtensorMap do64 = mt__att_wg_map(a.dout16, a.B, a.T, a.C_local, 64);
    dim3 grid(a.B * a.NH_local, (a.T + 127) / 128);
    int hand_off = mt__att_dq_from_ds_mode() != 0 && a.B * a.NH_local <= 65535;   // (the dQ kernel's grid.y)
    unsigned short *ds_t = NULL;   // THE dS HAND-OFF's tiles
    size_t bytes = mt_gpu_attention_ds_bytes(a.B, a.T, a.NH_local), pairs = bytes / (2 * 64 * 64 * 2);
    if (hand_off) mt__scratch_alloc((void **)&ds_t, bytes, stream);
    // (without the hand-off the store map is never used, but must be a valid map: any 16-byte address)
    CUtensorMap ds_store = mt__att_ds_map(hand_off ? ds_t : (const unsigned short *)a.qkv16, hand_off ? pairs : 1, 64);
    auto dkdv = a.p_drop > 0.0f ? mt_attention_backward_dkdv_kernel_wgmma<1> : mt_attention_backward_dkdv_kernel_wgmma<0>;
    mt__allow_smem((const void *)dkdv, MT__ATT_WG_DKDV_SMEM);
    mt__launch("mt_attention_backward_dkdv_kernel_wgmma", dkdv, grid, 256,
               MT__ATT_WG_DKDV_SMEM, stream, qkv128, qkv64, do64, ds_store, a, hand_off);
    if (hand_off) {
        CUtensorMap ds_load = mt__att_ds_map(ds_t, pairs, 128);
        mt__allow_smem((const void *)mt_attention_backward_dq_ds_kernel_wgmma, MT__ATT_WG_DQ_DS_SMEM);
        dim3 grid_q((a.T + 127) / 128, a.B * a.NH_local);   // (a head's blocks side by side)
        mt__launch("mt_attention_backward_dq_ds_kernel_wgmma", mt_attention_backward_dq_ds_kernel_wgmma, grid_q, 256,
                   MT__ATT_WG_DQ_DS_SMEM, stream, qkv64, ds_load, a);
        mt__scratch_free(ds_t, stream);
        return;
    }
    mt__allow_smem((const void *)mt_attention_backward_dq_kernel_wgmma, MT__ATT_WG_BWD_SMEM);
    mt__launch("mt_attention_backward_dq_kernel_wgmma", mt_attention_backward_dq_kernel_wgmma, grid, 256,
               MT__ATT_WG_BWD_SMEM, stream, qkv128, do128, qkv64, a);
}

// ---- attention launchers -----------------------------------------------------------------------
static mt__attention_args mt__attention_setup(int B, int T, int C_local, int NH_local, const mt_dropout *drop,
                                              int head_offset, int NH_global) {
    mt__attention_args a;
    memset(&a, 0, sizeof a);
    a.B = B; a.T = T; a.C_local = C_local; a.NH_local = NH_local;
    a.scale = 1.0f / sqrtf((float)(C_local / NH_local));   // as the CPU: 1/sqrtf((float)hs)
    a.p_drop = drop->p > 0.0f ? drop->p : 0.0f;
    a.keep_scale = drop->p > 0.0f ? 1.0f / (1.0f - drop->p) : 1.0f;
    a.drop_prefix = mt__dropout_prefix(drop);
    a.sample_offset = drop->sample_offset; a.head_offset = head_offset; a.NH_global = NH_global;
    return a;
}
static void mt__attention_check(const char *what, int C_local, int NH_local) {
    if (NH_local <= 0 || C_local % NH_local != 0) mt_fatal("%s: C_local = %d is not a multiple of NH_local = %d", what,
                                                           C_local, NH_local);
    int hs = C_local / NH_local;
    if (hs != 16 && hs != 32 && hs != 64 && hs != 128)
        mt_fatal("%s: head size %d is not supported by the GPU kernels\n"
                 "hint: use hidden-size / num-attention-heads = 16, 32, 64 or 128", what, hs);
}
// The bf16 kernels move 16 bytes at a time, so their tensors must start on 16-byte boundaries.
// One that does not (a caller that carves buffers at odd offsets) goes through an aligned copy:
// slower, the same result. mt__staged returns p itself when it is aligned (or in fp32 mode).
static float *mt__staged(const float *p, size_t n, int bf16, int copy_in, cudaStream_t stream) {
    if (!bf16 || mt__aligned16(p)) return (float *)p;
    float *q;
    mt__scratch_alloc((void **)&q, n * sizeof(float), stream);
    if (copy_in) MT_CUDA_CHECK(cudaMemcpyAsync(q, p, n * sizeof(float), cudaMemcpyDeviceToDevice, stream));
    return q;
}
// after the kernels: copy an output back (if it was staged) and free the copy
static void mt__unstage(float *p, float *staged, size_t n, int copy_out, cudaStream_t stream) {
    if (staged == p) return;
    if (copy_out) MT_CUDA_CHECK(cudaMemcpyAsync(p, staged, n * sizeof(float), cudaMemcpyDeviceToDevice, stream));
    mt__scratch_free(staged, stream);
}
// shared memory of each attention kernel, in bytes
static size_t mt__att_smem_fwd(int hs, int bf16) {   // bf16: Q + two stages of K, V
    return bf16 ? (size_t)5 * 64 * (hs + 8) * sizeof(__nv_bfloat16) : ((size_t)3 * 32 * (hs + 1) + 32 * 33) * sizeof(float);
}
static size_t mt__att_smem_dkdv(int hs, int bf16, int bq) {   // bf16: K, V + two stages of Q, dO, lse, D
    return bf16 ? (size_t)128 * (hs + 8) * sizeof(__nv_bfloat16) +
                      2 * ((size_t)2 * bq * (hs + 8) * sizeof(__nv_bfloat16) + 2 * bq * sizeof(float))
                : ((size_t)4 * 32 * (hs + 1) + 2 * 32 * 33 + 64) * sizeof(float);
}
static size_t mt__att_smem_dq(int hs, int bf16) {   // bf16: Q, dO + two stages of K, V
    int bk = hs <= 64 ? 64 : 32;
    return bf16 ? (size_t)(128 + 4 * bk) * (hs + 8) * sizeof(__nv_bfloat16)
                : ((size_t)4 * 32 * (hs + 1) + 32 * 33) * sizeof(float);
}
// the tensor-core kernels, F16 = 0 (bf16) or 1 (fp16)
template <int HS, int F16>
static void mt__attention_forward_mma_launch(const mt__attention_args &a, size_t smem, cudaStream_t stream) {
    dim3 grid((a.T + 63) / 64, a.B * a.NH_local);
    mt__allow_smem((const void *)mt_attention_forward_kernel_mma<HS, F16>, smem);
    mt_attention_forward_kernel_mma<HS, F16><<<grid, 128, smem, stream>>>(a);
    mt__launch_check("mt_attention_forward_kernel_mma", stream);
}
template <int HS, int F16>
static void mt__attention_backward_mma_launch(const mt__attention_args &a, size_t smem_kv, size_t smem_q,
                                              cudaStream_t stream) {
    dim3 grid((a.T + 63) / 64, a.B * a.NH_local);
    mt__allow_smem((const void *)mt_attention_backward_dkdv_kernel_mma<HS, F16>, smem_kv);
    mt_attention_backward_dkdv_kernel_mma<HS, F16><<<grid, 128, smem_kv, stream>>>(a);
    mt__launch_check("mt_attention_backward_dkdv_kernel_mma", stream);
    mt__allow_smem((const void *)mt_attention_backward_dq_kernel_mma<HS, F16>, smem_q);
    mt_attention_backward_dq_kernel_mma<HS, F16><<<grid, 128, smem_q, stream>>>(a);
    mt__launch_check("mt_attention_backward_dq_kernel_mma", stream);
}
// dtype (an mt_dtype): MT_DTYPE_FP32 the fp32 kernels, BF16 / FP16 the tensor-core ones
// out16: a.out receives 16-bit values (only the wgmma kernel writes them: mt__attention_forward_gpu
// asks for them only where it runs)
template <int HS>
static void mt__attention_forward_launch(const mt__attention_args &a, int dtype, int out16, cudaStream_t stream) {
    int bf16 = dtype != MT_DTYPE_FP32;   // (bf16 or fp16: the same shared-memory sizes)
    size_t smem = mt__att_smem_fwd(HS, bf16);
    if (mt__attention_wgmma_ok(a, dtype, HS)) {
        mt__attention_forward_wgmma_launch(a, out16, stream);
        return;
    }
    if (out16) mt_fatal("internal: a 16-bit attention output off the wgmma kernel");
    if (dtype == MT_DTYPE_FP16) {
        mt__attention_forward_mma_launch<HS, 1>(a, smem, stream);
    } else if (bf16) {
        mt__attention_forward_mma_launch<HS, 0>(a, smem, stream);
    } else {
        dim3 grid((a.T + 31) / 32, a.B * a.NH_local);
        mt__allow_smem((const void *)mt_attention_forward_kernel<HS>, smem);
        mt_attention_forward_kernel<HS><<<grid, 128, smem, stream>>>(a);
        mt__launch_check("mt_attention_forward_kernel", stream);
    }
}
// out16: a.out holds the forward's output in dtype's 16 bits (the D pass reads it so)
template <int HS>
static void mt__attention_backward_launch(const mt__attention_args &a, int dtype, int out16, cudaStream_t stream) {
    int bf16 = dtype != MT_DTYPE_FP32;
    size_t rows = (size_t)a.B * a.T * a.NH_local, bt = (size_t)a.B * a.T;
    // dO: a.dout (fp32), or only a.dout16 (a training layer's datty in 16 bits): DOUT16 1 bf16, 2 fp16
    int d16 = a.dout ? 0 : dtype == MT_DTYPE_FP16 ? 2 : 1;
    int vec = a.C_local % 4 == 0 && (out16 ? (uintptr_t)a.out % 8 == 0 : mt__aligned16(a.out)) &&
              (d16 ? (uintptr_t)a.dout16 % 8 == 0 : mt__aligned16(a.dout));
    unsigned vec_blocks = mt__blocks(bt * 32, 256), blocks = mt__blocks(rows * 32, 256);
    // D = rowsum(dO * out): the vector kernel for up to 8 or 16 float4 a lane, else the scalar one;
    // out16: O in 16 bits too (only with a 16-bit dO)
    if (out16 && !d16) mt_fatal("internal: a 16-bit attention output with an fp32 output gradient");
    void (*pre)(mt__attention_args, int);
    if (vec && a.C_local <= 32 * 4 * 8)
        pre = d16 == 1 ? (out16 ? mt_attention_backward_preprocess_vec_kernel<8, 1, 1>
                                : mt_attention_backward_preprocess_vec_kernel<8, 1, 0>)
            : d16 == 2 ? (out16 ? mt_attention_backward_preprocess_vec_kernel<8, 2, 1>
                                : mt_attention_backward_preprocess_vec_kernel<8, 2, 0>)
                       : mt_attention_backward_preprocess_vec_kernel<8, 0, 0>;
    else if (vec && a.C_local <= 32 * 4 * 16)
        pre = d16 == 1 ? (out16 ? mt_attention_backward_preprocess_vec_kernel<16, 1, 1>
                                : mt_attention_backward_preprocess_vec_kernel<16, 1, 0>)
            : d16 == 2 ? (out16 ? mt_attention_backward_preprocess_vec_kernel<16, 2, 1>
                                : mt_attention_backward_preprocess_vec_kernel<16, 2, 0>)
                       : mt_attention_backward_preprocess_vec_kernel<16, 0, 0>;
    else
        pre = d16 == 1 ? (out16 ? mt_attention_backward_preprocess_kernel<1, 1>
                                : mt_attention_backward_preprocess_kernel<1, 0>)
            : d16 == 2 ? (out16 ? mt_attention_backward_preprocess_kernel<2, 1>
                                : mt_attention_backward_preprocess_kernel<2, 0>)
                       : mt_attention_backward_preprocess_kernel<0, 0>;
    int vec_kernel = vec && a.C_local <= 32 * 4 * 16;
    // both in 16 bits, 16-byte rows, up to 8 slots of 8 a lane (C_local <= 2048): 16 bytes a load
    int nv16 = (a.C_local / 8 + 31) / 32;
    if (out16 && a.C_local % 8 == 0 && mt__aligned16(a.out) && mt__aligned16(a.dout16) && HS % 8 == 0 &&
        32 % (HS / 8) == 0 && nv16 <= 8) {
        int f16 = d16 == 2, nv = nv16 <= 4 ? nv16 : 8;
        void (*k16)(mt__attention_args, int) =
            nv == 1 ? (f16 ? mt_attention_backward_preprocess16_kernel<1, 1> : mt_attention_backward_preprocess16_kernel<1, 0>)
            : nv == 2 ? (f16 ? mt_attention_backward_preprocess16_kernel<2, 1> : mt_attention_backward_preprocess16_kernel<2, 0>)
            : nv == 3 ? (f16 ? mt_attention_backward_preprocess16_kernel<3, 1> : mt_attention_backward_preprocess16_kernel<3, 0>)
            : nv == 4 ? (f16 ? mt_attention_backward_preprocess16_kernel<4, 1> : mt_attention_backward_preprocess16_kernel<4, 0>)
                      : (f16 ? mt_attention_backward_preprocess16_kernel<8, 1> : mt_attention_backward_preprocess16_kernel<8, 0>);
        mt__launch("mt_attention_backward_preprocess16_kernel", k16, vec_blocks, 256, 0, stream, a, HS);
    } else
        mt__launch(vec_kernel ? "mt_attention_backward_preprocess_vec_kernel" : "mt_attention_backward_preprocess_kernel",
                   pre, vec_kernel ? vec_blocks : blocks, 256, 0, stream, a, HS);
    size_t smem_kv = mt__att_smem_dkdv(HS, bf16, mt__att_dkdv_bq(HS)), smem_q = mt__att_smem_dq(HS, bf16);
    if (mt__attention_wgmma_ok(a, dtype, HS) && mt__aligned16(a.dout16)) {
        mt__attention_backward_wgmma_launch(a, stream);
    } else if (dtype == MT_DTYPE_FP16) {
        mt__attention_backward_mma_launch<HS, 1>(a, smem_kv, smem_q, stream);
    } else if (bf16) {
        mt__attention_backward_mma_launch<HS, 0>(a, smem_kv, smem_q, stream);
    } else {
        dim3 grid((a.T + 31) / 32, a.B * a.NH_local);
        mt__allow_smem((const void *)mt_attention_backward_dkdv_kernel<HS>, smem_kv);
        mt_attention_backward_dkdv_kernel<HS><<<grid, 128, smem_kv, stream>>>(a);
        mt__launch_check("mt_attention_backward_dkdv_kernel", stream);
        mt__allow_smem((const void *)mt_attention_backward_dq_kernel<HS>, smem_q);
        mt_attention_backward_dq_kernel<HS><<<grid, 128, smem_q, stream>>>(a);
        mt__launch_check("mt_attention_backward_dq_kernel", stream);
    }
}
// the operands the tensor-core kernels read: x rounded to bf16, or to fp16 (--fp16), whose bits
// the kernels only move (mt__mma16<F16> reads them as what they are)
static __nv_bfloat16 *mt__attention_operand(const float *x, size_t n, int dtype, cudaStream_t stream) {
    if (dtype == MT_DTYPE_FP16) return (__nv_bfloat16 *)mt__rounded_flat_copy<__half>(x, n, stream);
    return mt__rounded_flat_copy<__nv_bfloat16>(x, n, stream);
}
// writes out (B,T,C_local) and lse (B,NH_local,T) with '='. dtype (an mt_dtype): 0 = fp32, 1 = bf16
// tensor cores, 2 = fp16 tensor cores (1 and 2 as mt_attention_forward_rounded_cpu rounds).
// qkv16_in: NULL, or qkv already in dtype's 16 bits (16-byte aligned; then qkv is not read: the
// training stores it so, mt_qkv_forward_gpu); else the launcher rounds qkv into a copy.
// out16: out receives dtype's 16-bit values (16-byte aligned, half its floats: a training layer's
// attention output, megatron.h's mt_atty_storage_dtype): written so by the wgmma kernel where it
// runs; elsewhere the fp32 result goes to scratch, then its cast into out.
static void mt__attention_forward_gpu(float *out, int out16, float *lse, const float *qkv, const void *qkv16_in, int B,
                                      int T, int C_local, int NH_local, const mt_dropout *drop, int head_offset,
                                      int NH_global, int dtype, cudaStream_t stream) {
    int bf16 = dtype != MT_DTYPE_FP32;   // the tensor-core kernels' 16-byte alignment, for bf16 and fp16
    mt__attention_check("attention forward", C_local, NH_local);
    if (B == 0 || T == 0) return;
    if (qkv16_in && (!bf16 || !mt__aligned16(qkv16_in)))
        mt_fatal("internal: 16-bit qkv with dtype %d or unaligned", dtype);
    if (out16 && (!bf16 || !mt__aligned16(out)))
        mt_fatal("internal: a 16-bit attention output with dtype %d or unaligned", dtype);
    size_t n_qkv = (size_t)B * T * 3 * C_local, n_out = (size_t)B * T * C_local;
    mt__attention_args a = mt__attention_setup(B, T, C_local, NH_local, drop, head_offset, NH_global);
    a.qkv = qkv16_in ? NULL : mt__staged(qkv, n_qkv, bf16, 1, stream);
    a.lse = lse;
    __nv_bfloat16 *qkv16 = bf16 && !qkv16_in ? mt__attention_operand(qkv, n_qkv, dtype, stream) : NULL;
    a.qkv16 = qkv16_in ? (const __nv_bfloat16 *)qkv16_in : qkv16;
    int hs = C_local / NH_local;
    int direct16 = out16 && mt__attention_wgmma_ok(a, dtype, hs);   // the kernel writes the 16 bits itself
    float *out32 = NULL;   // out16 elsewhere: the fp32 result, cast into out below
    if (out16 && !direct16) mt__scratch_alloc((void **)&out32, n_out * sizeof(float), stream);
    a.out = direct16 ? out : out32 ? out32 : mt__staged(out, n_out, bf16, 0, stream);
    switch (hs) {
    case 16: mt__attention_forward_launch<16>(a, dtype, direct16, stream); break;
    case 32: mt__attention_forward_launch<32>(a, dtype, direct16, stream); break;
    case 64: mt__attention_forward_launch<64>(a, dtype, direct16, stream); break;
    case 128: mt__attention_forward_launch<128>(a, dtype, direct16, stream); break;
    }
    if (qkv16) mt__scratch_free(qkv16, stream);
    if (!qkv16_in) mt__unstage((float *)qkv, (float *)a.qkv, n_qkv, 0, stream);
    if (out32) {
        if (dtype == MT_DTYPE_FP16) mt__cast_to((__half *)out, out32, n_out, stream);
        else mt__cast_to((__nv_bfloat16 *)out, out32, n_out, stream);
        mt__scratch_free(out32, stream);
    } else if (!direct16) {
        mt__unstage(out, a.out, n_out, 1, stream);
    }
}
void mt_attention_forward_gpu(float *out, float *lse, const float *qkv, int B, int T, int C_local, int NH_local,
                              const mt_dropout *drop, int head_offset, int NH_global, int dtype, cudaStream_t stream) {
    mt__attention_forward_gpu(out, 0, lse, qkv, NULL, B, T, C_local, NH_local, drop, head_offset, NH_global, dtype,
                              stream);
}
// the same from qkv16, qkv stored in dtype's 16 bits (MT_DTYPE_BF16 or FP16), 16-byte aligned
// out_dtype: MT_DTYPE_FP32, or dtype's 16 bits (out16 above)
void mt_attention_forward16_gpu(float *out, int out_dtype, float *lse, const void *qkv16, int B, int T, int C_local,
                                int NH_local, const mt_dropout *drop, int head_offset, int NH_global, int dtype,
                                cudaStream_t stream) {
    if (out_dtype != MT_DTYPE_FP32 && out_dtype != dtype)
        mt_fatal("internal: the attention output in dtype %d, the attention in %d", out_dtype, dtype);
    mt__attention_forward_gpu(out, out_dtype != MT_DTYPE_FP32, lse, NULL, qkv16, B, T, C_local, NH_local, drop,
                              head_offset, NH_global, dtype, stream);
}
// writes dqkv (B,T,3*C_local) with '='. out and lse are the forward's. Scratch: D, B*NH_local*T floats.
// qkv16_in as mt__attention_forward_gpu's. dqkv16: dqkv is written in dtype's 16 bits (half its
// floats; 16-byte aligned): the training's, for the qkv GEMM's backward (megatron.h's mt_dqkv_gemm_dtype)
// dout16_in: dout holds dtype's 16-bit values (16-byte aligned: a training layer's datty, megatron.h's
// mt_datty_gemm_dtype), read as they are: no rounded copy, and D sums them
// out16: out holds dtype's 16-bit values (a training layer's atty, as mt_attention_forward16_gpu wrote it)
static void mt__attention_backward_gpu(float *dqkv, int dqkv16, const float *dout, int dout16_in, const float *qkv,
                                       const void *qkv16_in, const float *out, int out16, const float *lse, int B,
                                       int T, int C_local, int NH_local, const mt_dropout *drop, int head_offset,
                                       int NH_global, int dtype, cudaStream_t stream) {
    int bf16 = dtype != MT_DTYPE_FP32;
    mt__attention_check("attention backward", C_local, NH_local);
    if (B == 0 || T == 0) return;
    if (qkv16_in && (!bf16 || !mt__aligned16(qkv16_in)))
        mt_fatal("internal: 16-bit qkv with dtype %d or unaligned", dtype);
    if (dqkv16 && (!bf16 || !mt__aligned16(dqkv)))
        mt_fatal("internal: a 16-bit dqkv with dtype %d or unaligned", dtype);
    if (dout16_in && (!bf16 || !mt__aligned16(dout)))
        mt_fatal("internal: a 16-bit dout with dtype %d or unaligned", dtype);
    size_t n_qkv = (size_t)B * T * 3 * C_local, n_out = (size_t)B * T * C_local;
    mt__attention_args a = mt__attention_setup(B, T, C_local, NH_local, drop, head_offset, NH_global);
    a.qkv = qkv16_in ? NULL : mt__staged(qkv, n_qkv, bf16, 1, stream);
    a.dout = dout16_in ? NULL : mt__staged(dout, n_out, bf16, 1, stream);
    a.dqkv = dqkv16 ? NULL : mt__staged(dqkv, n_qkv, bf16, 0, stream);
    a.dqkv16 = dqkv16 ? (unsigned short *)dqkv : NULL;
    a.out = (float *)out;   // read only in the backward (4-byte loads: no alignment needed)
    a.lse = (float *)lse;   // read only in the backward
    mt__scratch_alloc((void **)&a.dsum, (size_t)B * NH_local * T * sizeof(float), stream);
    __nv_bfloat16 *qkv16 = bf16 && !qkv16_in ? mt__attention_operand(qkv, n_qkv, dtype, stream) : NULL;
    __nv_bfloat16 *dout16 = bf16 && !dout16_in ? mt__attention_operand(dout, n_out, dtype, stream) : NULL;
    a.qkv16 = qkv16_in ? (const __nv_bfloat16 *)qkv16_in : qkv16;
    a.dout16 = dout16_in ? (const __nv_bfloat16 *)dout : dout16;
    switch (C_local / NH_local) {
    case 16: mt__attention_backward_launch<16>(a, dtype, out16, stream); break;
    case 32: mt__attention_backward_launch<32>(a, dtype, out16, stream); break;
    case 64: mt__attention_backward_launch<64>(a, dtype, out16, stream); break;
    case 128: mt__attention_backward_launch<128>(a, dtype, out16, stream); break;
    }
    if (qkv16) mt__scratch_free(qkv16, stream);
    if (dout16) mt__scratch_free(dout16, stream);
    mt__scratch_free(a.dsum, stream);
    if (!qkv16_in) mt__unstage((float *)qkv, (float *)a.qkv, n_qkv, 0, stream);
    if (!dout16_in) mt__unstage((float *)dout, (float *)a.dout, n_out, 0, stream);
    if (!dqkv16) mt__unstage(dqkv, a.dqkv, n_qkv, 1, stream);
}
void mt_attention_backward_gpu(float *dqkv, const float *dout, const float *qkv, const float *out, const float *lse,
                               int B, int T, int C_local, int NH_local, const mt_dropout *drop, int head_offset,
                               int NH_global, int dtype, cudaStream_t stream) {
    mt__attention_backward_gpu(dqkv, 0, dout, 0, qkv, NULL, out, 0, lse, B, T, C_local, NH_local, drop, head_offset,
                               NH_global, dtype, stream);
}
// the same from qkv16 (qkv in dtype's 16 bits, as mt_attention_forward16_gpu); dqkv_dtype: how to
// write dqkv, MT_DTYPE_FP32 or dtype's 16 bits (the training's, megatron.h's mt_dqkv_gemm_dtype);
// dout_dtype: how dout is stored, MT_DTYPE_FP32 or dtype's 16 bits (16-byte aligned: the training's
// datty, megatron.h's mt_datty_gemm_dtype); out_dtype: how out is stored, MT_DTYPE_FP32 or dtype's 16
// bits (the training's atty, megatron.h's mt_atty_storage_dtype: then dout is in 16 bits too)
void mt_attention_backward16_gpu(float *dqkv, int dqkv_dtype, const float *dout, int dout_dtype, const void *qkv16,
                                 const float *out, int out_dtype, const float *lse, int B, int T, int C_local,
                                 int NH_local, const mt_dropout *drop, int head_offset, int NH_global, int dtype,
                                 cudaStream_t stream) {
    if (dqkv_dtype != MT_DTYPE_FP32 && dqkv_dtype != dtype)
        mt_fatal("internal: dqkv in dtype %d, the attention in %d", dqkv_dtype, dtype);
    if (dout_dtype != MT_DTYPE_FP32 && dout_dtype != dtype)
        mt_fatal("internal: dout in dtype %d, the attention in %d", dout_dtype, dtype);
    if (out_dtype != MT_DTYPE_FP32 && out_dtype != dtype)
        mt_fatal("internal: the attention output in dtype %d, the attention in %d", out_dtype, dtype);
    mt__attention_backward_gpu(dqkv, dqkv_dtype != MT_DTYPE_FP32, dout, dout_dtype != MT_DTYPE_FP32, NULL, qkv16, out,
                               out_dtype != MT_DTYPE_FP32, lse, B, T, C_local, NH_local, drop, head_offset, NH_global,
                               dtype, stream);
}

// ---------------------------------------------------------------------------------------------
// GELU, tanh approximation
// matches mt_gelu_forward_cpu (megatron.h, 3. OPS). Writes out with '='.
// out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))); N elements, one thread each.
// Bytes-bound, so as the casts: a float4 kernel over the first N4 * 4 elements when the pointers
// are 16-byte aligned, the one-element kernel for the rest. Both call mt__gelu: the same bits.
__global__ void mt_gelu_forward_kernel(float *__restrict__ out, const float *__restrict__ inp, size_t N) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < N) out[i] = mt__gelu(inp[i]);
}
__global__ void mt_gelu_forward_vec4_kernel(float4 *__restrict__ out, const float4 *__restrict__ inp, size_t N4) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N4) return;
    float4 x = inp[i];
    out[i] = make_float4(mt__gelu(x.x), mt__gelu(x.y), mt__gelu(x.z), mt__gelu(x.w));
}
void mt_gelu_forward_gpu(float *out, const float *inp, size_t N, cudaStream_t stream) {
    if (N == 0) return;
    size_t N4 = mt__aligned16(out) && mt__aligned16(inp) ? N / 4 : 0;
    if (N4) {
        mt_gelu_forward_vec4_kernel<<<mt__blocks(N4, 256), 256, 0, stream>>>((float4 *)out, (const float4 *)inp, N4);
        mt__launch_check("mt_gelu_forward_vec4_kernel", stream);
    }
    if (N4 * 4 == N) return;
    mt_gelu_forward_kernel<<<mt__blocks(N - N4 * 4, 256), 256, 0, stream>>>(out + N4 * 4, inp + N4 * 4, N - N4 * 4);
    mt__launch_check("mt_gelu_forward_kernel", stream);
}
// gelu(x) rounded to 16 bits (F16 = 0: bf16, 1: fp16), written as such: out[i] = round(gelu(inp[i])),
// the value the fc GEMM's GELU16 / STORE16_GELU16 epilogue stored in the forward (the same mt__gelu
// of the same input, the same rounding): the training backward remakes the fc-proj input this way
// from the saved fc output instead of keeping gelu's output from the forward (mt_matmul_backward_gelu_gpu).
// IN16: the input is 16-bit values of the same type (the fc output kept in 16 bits), else fp32.
// 8 elements a thread (16 or 32 bytes in, one 16-byte store) over the aligned bulk, one a thread after.
template <int F16, int IN16>
__global__ void mt_gelu_rounded_kernel(unsigned short *__restrict__ out, const void *__restrict__ inp, size_t n,
                                       size_t n8) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n8) {
        float x[8];
        if (IN16) {
            uint4 u = ((const uint4 *)inp)[i];
            float2 p0 = mt__unpack16x2<F16>(u.x), p1 = mt__unpack16x2<F16>(u.y), p2 = mt__unpack16x2<F16>(u.z),
                   p3 = mt__unpack16x2<F16>(u.w);
            x[0] = p0.x; x[1] = p0.y; x[2] = p1.x; x[3] = p1.y; x[4] = p2.x; x[5] = p2.y; x[6] = p3.x; x[7] = p3.y;
        } else {
            float4 a = ((const float4 *)inp)[2 * i], b = ((const float4 *)inp)[2 * i + 1];
            x[0] = a.x; x[1] = a.y; x[2] = a.z; x[3] = a.w; x[4] = b.x; x[5] = b.y; x[6] = b.z; x[7] = b.w;
        }
        uint4 o = make_uint4(mt__pack16x2<F16>(mt__gelu(x[0]), mt__gelu(x[1])),
                             mt__pack16x2<F16>(mt__gelu(x[2]), mt__gelu(x[3])),
                             mt__pack16x2<F16>(mt__gelu(x[4]), mt__gelu(x[5])),
                             mt__pack16x2<F16>(mt__gelu(x[6]), mt__gelu(x[7])));
        ((uint4 *)out)[i] = o;
        return;
    }
    size_t e = 8 * n8 + (i - n8);   // the tail, one element a thread
    if (e >= n) return;
    float x = IN16 ? mt__unpack16x2<F16>(((const unsigned short *)inp)[e]).x : ((const float *)inp)[e];
    uint32_t two = mt__pack16x2<F16>(mt__gelu(x), 0.0f);
    out[e] = (unsigned short)(two & 0xffffu);
}
static void mt__gelu_rounded(void *out, const void *inp, int inp16, size_t n, int f16, cudaStream_t stream) {
    if (n == 0) return;
    size_t n8 = mt__aligned16(out) && mt__aligned16(inp) ? n / 8 : 0, threads = n8 + (n - 8 * n8);
    unsigned blocks = mt__blocks(threads, 256);
    unsigned short *o = (unsigned short *)out;
    if (f16 && inp16) mt_gelu_rounded_kernel<1, 1><<<blocks, 256, 0, stream>>>(o, inp, n, n8);
    else if (f16) mt_gelu_rounded_kernel<1, 0><<<blocks, 256, 0, stream>>>(o, inp, n, n8);
    else if (inp16) mt_gelu_rounded_kernel<0, 1><<<blocks, 256, 0, stream>>>(o, inp, n, n8);
    else mt_gelu_rounded_kernel<0, 0><<<blocks, 256, 0, stream>>>(o, inp, n, n8);
    mt__launch_check("mt_gelu_rounded_kernel", stream);
}
// matches mt_gelu_backward_cpu (megatron.h, 3. OPS). Writes dinp with '='.
// in the forward pass this was: y = 0.5 x (1 + tanh(u)), u = s (x + 0.044715 x^3)
// so dy/dx = 0.5 (1 + tanh(u)) + 0.5 x (1 - tanh(u)^2) s (1 + 3 * 0.044715 x^2)
// A float4 kernel over the aligned bulk (three 16-byte accesses per thread), the one-element
// kernel for the rest, as the forward. Both call mt__gelu_grad: the same bits.
__global__ void mt_gelu_backward_kernel(float *__restrict__ dinp, const float *__restrict__ inp,
                                        const float *__restrict__ dout, size_t N) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < N) dinp[i] = mt__gelu_grad(inp[i]) * dout[i];
}
__global__ void mt_gelu_backward_vec4_kernel(float4 *__restrict__ dinp, const float4 *__restrict__ inp,
                                             const float4 *__restrict__ dout, size_t N4) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N4) return;
    float4 x = inp[i], d = dout[i];
    dinp[i] = make_float4(mt__gelu_grad(x.x) * d.x, mt__gelu_grad(x.y) * d.y, mt__gelu_grad(x.z) * d.z,
                          mt__gelu_grad(x.w) * d.w);
}
void mt_gelu_backward_gpu(float *dinp, const float *inp, const float *dout, size_t N, cudaStream_t stream) {
    if (N == 0) return;
    size_t N4 = mt__aligned16(dinp) && mt__aligned16(inp) && mt__aligned16(dout) ? N / 4 : 0;
    if (N4) {
        mt_gelu_backward_vec4_kernel<<<mt__blocks(N4, 256), 256, 0, stream>>>((float4 *)dinp, (const float4 *)inp,
                                                                              (const float4 *)dout, N4);
        mt__launch_check("mt_gelu_backward_vec4_kernel", stream);
    }
    if (N4 * 4 == N) return;
    mt_gelu_backward_kernel<<<mt__blocks(N - N4 * 4, 256), 256, 0, stream>>>(dinp + N4 * 4, inp + N4 * 4, dout + N4 * 4,
                                                                             N - N4 * 4);
    mt__launch_check("mt_gelu_backward_kernel", stream);
}

// ---------------------------------------------------------------------------------------------
// residual
// matches mt_residual_forward_cpu (megatron.h, 3. OPS). Writes out with '='. out = a + b.
// A float4 kernel over the aligned bulk, the one-element kernel for the rest (as GELU).
__global__ void mt_residual_forward_kernel(float *out, const float *a, const float *b, size_t N) {
    mt__pdl_start();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < N) out[i] = a[i] + b[i];
}
__global__ void mt_residual_forward_vec4_kernel(float4 *out, const float4 *a, const float4 *b, size_t N4) {
    mt__pdl_start();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N4) return;
    float4 x = a[i], y = b[i];
    out[i] = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
}
void mt_residual_forward_gpu(float *out, const float *a, const float *b, size_t N, cudaStream_t stream) {
    if (N == 0) return;
    size_t N4 = mt__aligned16(out) && mt__aligned16(a) && mt__aligned16(b) ? N / 4 : 0;
    if (N4) {
        mt__launch("mt_residual_forward_vec4_kernel", mt_residual_forward_vec4_kernel, mt__blocks(N4, 256), 256, 0,
                   stream, (float4 *)out, (const float4 *)a, (const float4 *)b, N4);
    }
    if (N4 * 4 == N) return;
    size_t d = N4 * 4;
    mt__launch("mt_residual_forward_kernel", mt_residual_forward_kernel, mt__blocks(N - d, 256), 256, 0, stream, out + d,
               a + d, b + d, N - d);
}

// ---------------------------------------------------------------------------------------------
// attention over the KV cache (generation): Tq new tokens per sequence against every earlier
// position of their sequence. Two kernels: the new keys and values into the cache, then one
// block per (sequence, head, new token): scores of the query against positions 0..p in shared
// memory, their max and sum by block reductions (fixed order), then the weighted sum of the
// values, split over groups of hs threads that each take every G-th position, added in order.
// The block reads p+1 rows of K and of V (hs floats each): one pass over the cache per token,
// so decoding's attention runs at the cache's read bandwidth.
// matches mt_attention_cached_forward_cpu (megatron.h, 3. OPS). Writes out with '='.
__global__ void mt_kv_cache_store_kernel(float *kcache, float *vcache, const float *qkv, const int *start, int B,
                                         int Tq, int C_local, int cap) {
    mt__pdl_start();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x, n = (size_t)B * Tq * C_local;
    if (i >= n) return;
    int c = (int)(i % C_local);
    size_t bt = i / C_local;
    int t = (int)(bt % Tq), b = (int)(bt / Tq);
    size_t at = ((size_t)b * cap + (size_t)(start[b] + t)) * C_local + c;
    const float *row = qkv + bt * 3 * C_local;
    kcache[at] = row[C_local + c];
    vcache[at] = row[2 * C_local + c];
}

__device__ static float mt__block_reduce(float v, float *shared, int is_max) {   // every thread gets the result
    for (int o = 16; o > 0; o >>= 1) {
        float other = __shfl_xor_sync(0xffffffffu, v, o);
        v = is_max ? fmaxf(v, other) : v + other;
    }
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
    __syncthreads();
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    float r = shared[0];
    for (int w = 1; w < warps; w++) r = is_max ? fmaxf(r, shared[w]) : r + shared[w];
    return r;
}

// One block of 128 threads per (sequence b, head h, new token t), at position p = start[b] + t:
//   scores:  a thread per cached position p2 <= p (p2 = tid, tid + 128, ...): its K row of HS
//            floats read as HS/4 float4 loads issued together (one round trip per position, not
//            HS), s = q . k / sqrt(HS), kept in shared memory
//   softmax: block max and sum (exp of s - max)
//   values:  G = 128 / (HS/4) groups of HS/4 threads; thread (g, d) adds score[p2] V[p2, 4d..4d+3]
//            over p2 = g, g + G, ... (a group reads whole V rows: coalesced), then the G partial
//            sums in order
// STORE (decoding, Tq = 1): the block first writes its own head's K and V of the new token into
// the cache (no other block reads them: one launch instead of two); with several new tokens per
// sequence (prefill) mt_kv_cache_store_kernel runs before, as every block reads all of them.
// HS: the head size, or 0 for any other multiple of 4 up to 128 (the loops then test d < D4)
// The same work for the decode step's single kernel (below, "a decode step as one kernel"), which
// runs two such blocks side by side in one block of 256 threads: a device function of (block, tid)
// whose 128 threads meet at the named barrier `bar` (bar.sync bar, 128; barriers 1 and 2) instead
// of __syncthreads. The arithmetic is the kernel's below, operation for operation (test_kernels'
// decode_step_one_kernel checks the two agree bit for bit). It is not also the kernel's body: made
// so, the kernel's loop over the values compiled with each load behind its own exit test (its
// thread index no longer known to be below blockDim) and decoding slowed by ~0.1 ms a token
// (measured; perf.md), so the kernel keeps its own copy; here that loop is written out 4 rows of
// V at a time, their loads first, adding in the kernel's order.
__device__ static inline void mt__bar128(int bar) { asm volatile("bar.sync %0, 128;" ::"r"(bar) : "memory"); }
// mt__block_reduce for the 128 threads of a named barrier (the same order: the same bits)
__device__ static float mt__reduce128(float v, float *shared, int is_max, int tid, int bar) {
    for (int o = 16; o > 0; o >>= 1) {
        float other = __shfl_xor_sync(0xffffffffu, v, o);
        v = is_max ? fmaxf(v, other) : v + other;
    }
    int warp = tid / 32, lane = tid % 32;
    mt__bar128(bar);
    if (lane == 0) shared[warp] = v;
    mt__bar128(bar);
    float r = shared[0];
    for (int w = 1; w < 4; w++) r = is_max ? fmaxf(r, shared[w]) : r + shared[w];
    return r;
}
// output float4 i (i < D4) of a block whose G groups of D4 threads each summed a share of the
// positions into partial[group * D4 + i]: the groups' shares added in group order
__device__ static inline float4 mt__attention_groups_sum(const float4 *partial, int G, int D4, int i) {
    float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int k = 0; k < G; k++) {
        float4 u = partial[k * D4 + i];
        o.x += u.x; o.y += u.y; o.z += u.z; o.w += u.w;
    }
    return o;
}
// shared memory of one block: scores (cap, rounded up to 4) | partial outputs (128 float4) | reduction (32)
__host__ __device__ static inline size_t mt__attention_cached_smem_floats(int cap) {
    return (size_t)(cap + 3) / 4 * 4 + 4 * 128 + 32;
}
template <int HS, int STORE>
__device__ static void mt__attention_cached_block(int block, int tid, int bar, float *smem, float *out, float *kcache,
                                                  float *vcache, const float *qkv, const int *start, int Tq,
                                                  int C_local, int NH_local, int cap) {
    const int hs = HS ? HS : C_local / NH_local, D4 = hs / 4, G = 128 / D4;
    const int MAXD4 = HS ? HS / 4 : 32;   // registers for q and one K row
    int t = block % Tq, h = (block / Tq) % NH_local, b = block / (Tq * NH_local);
    int p = start[b] + t;
    int cap4 = (cap + 3) / 4 * 4;   // the float4s after the scores start on a 16-byte boundary
    float *score = smem, *red = smem + cap4 + 4 * 128;
    float4 *partial = (float4 *)(smem + cap4);
    const float *row = qkv + ((size_t)b * Tq + t) * 3 * C_local + h * hs;   // q | k | v of this head at C_local apart
    float *k_b = kcache + (size_t)b * cap * C_local + h * hs, *v_b = vcache + (size_t)b * cap * C_local + h * hs;
    if (STORE) {
        for (int i = tid; i < hs; i += 128) {
            k_b[(size_t)p * C_local + i] = row[C_local + i];
            v_b[(size_t)p * C_local + i] = row[2 * C_local + i];
        }
        mt__bar128(bar);   // the block's global writes are seen by the block after the barrier
    }
    float4 q[MAXD4];
    #pragma unroll
    for (int d = 0; d < MAXD4; d++) q[d] = d < D4 ? *(const float4 *)(row + 4 * d) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float scale = 1.0f / sqrtf((float)hs), m = -INFINITY;
    for (int p2 = tid; p2 <= p; p2 += 128) {
        const float4 *k = (const float4 *)(k_b + (size_t)p2 * C_local);
        float4 kv[MAXD4];
        #pragma unroll
        for (int d = 0; d < MAXD4; d++) kv[d] = d < D4 ? k[d] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        float s = 0.0f;
        #pragma unroll
        for (int d = 0; d < MAXD4; d++) s += q[d].x * kv[d].x + q[d].y * kv[d].y + q[d].z * kv[d].z + q[d].w * kv[d].w;
        score[p2] = s * scale;
        m = fmaxf(m, score[p2]);
    }
    m = mt__reduce128(m, red, 1, tid, bar);
    float sum = 0.0f;
    for (int p2 = tid; p2 <= p; p2 += 128) {
        float e = __expf(score[p2] - m);
        score[p2] = e;
        sum += e;
    }
    sum = mt__reduce128(sum, red, 0, tid, bar);   // (its barrier also publishes every score)
    float inv = 1.0f / sum;
    int g = tid / D4, d = tid % D4;
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (g < G) {   // positions g, g + G, ..., p: n of them, 4 rows of V loaded before any is added
        int n = g <= p ? (p - g) / G + 1 : 0, i = 0;   // (in the kernel's order, so the same sums)
        for (; i + 4 <= n; i += 4) {
            float w[4];
            float4 v[4];
            #pragma unroll
            for (int u = 0; u < 4; u++) {
                int p2 = g + (i + u) * G;
                w[u] = score[p2];
                v[u] = *(const float4 *)(v_b + (size_t)p2 * C_local + 4 * d);
            }
            #pragma unroll
            for (int u = 0; u < 4; u++) {
                acc.x += w[u] * v[u].x; acc.y += w[u] * v[u].y; acc.z += w[u] * v[u].z; acc.w += w[u] * v[u].w;
            }
        }
        for (; i < n; i++) {
            int p2 = g + i * G;
            float w = score[p2];
            float4 v = *(const float4 *)(v_b + (size_t)p2 * C_local + 4 * d);
            acc.x += w * v.x; acc.y += w * v.y; acc.z += w * v.z; acc.w += w * v.w;
        }
    }
    partial[tid] = acc;
    mt__bar128(bar);
    if (tid < D4) {
        float4 o = mt__attention_groups_sum(partial, G, D4, tid);
        *(float4 *)(out + ((size_t)b * Tq + t) * C_local + h * hs + 4 * tid) =
            make_float4(o.x * inv, o.y * inv, o.z * inv, o.w * inv);
    }
}
template <int HS, int STORE>
__global__ void __launch_bounds__(128) mt_attention_cached_forward_kernel(float *out, float *kcache, float *vcache,
                                                                          const float *qkv, const int *start, int Tq,
                                                                          int C_local, int NH_local, int cap) {
    extern __shared__ float smem[];   // scores (cap, rounded up to 4) | partial outputs (128 float4) | reduction (32)
    mt__pdl_start();
    const int hs = HS ? HS : C_local / NH_local, D4 = hs / 4, G = 128 / D4;
    const int MAXD4 = HS ? HS / 4 : 32;   // registers for q and one K row
    int t = blockIdx.x % Tq, h = (blockIdx.x / Tq) % NH_local, b = blockIdx.x / (Tq * NH_local);
    int p = start[b] + t;
    int cap4 = (cap + 3) / 4 * 4;   // the float4s after the scores start on a 16-byte boundary
    float *score = smem, *red = smem + cap4 + 4 * 128;
    float4 *partial = (float4 *)(smem + cap4);
    const float *row = qkv + ((size_t)b * Tq + t) * 3 * C_local + h * hs;   // q | k | v of this head at C_local apart
    float *k_b = kcache + (size_t)b * cap * C_local + h * hs, *v_b = vcache + (size_t)b * cap * C_local + h * hs;
    if (STORE) {
        for (int i = threadIdx.x; i < hs; i += blockDim.x) {
            k_b[(size_t)p * C_local + i] = row[C_local + i];
            v_b[(size_t)p * C_local + i] = row[2 * C_local + i];
        }
        __syncthreads();   // the block's global writes are seen by the block after the barrier
    }
    float4 q[MAXD4];
    #pragma unroll
    for (int d = 0; d < MAXD4; d++) q[d] = d < D4 ? *(const float4 *)(row + 4 * d) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float scale = 1.0f / sqrtf((float)hs), m = -INFINITY;
    for (int p2 = threadIdx.x; p2 <= p; p2 += blockDim.x) {
        const float4 *k = (const float4 *)(k_b + (size_t)p2 * C_local);
        float4 kv[MAXD4];
        #pragma unroll
        for (int d = 0; d < MAXD4; d++) kv[d] = d < D4 ? k[d] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        float s = 0.0f;
        #pragma unroll
        for (int d = 0; d < MAXD4; d++) s += q[d].x * kv[d].x + q[d].y * kv[d].y + q[d].z * kv[d].z + q[d].w * kv[d].w;
        score[p2] = s * scale;
        m = fmaxf(m, score[p2]);
    }
    m = mt__block_reduce(m, red, 1);
    float sum = 0.0f;
    for (int p2 = threadIdx.x; p2 <= p; p2 += blockDim.x) {
        float e = __expf(score[p2] - m);
        score[p2] = e;
        sum += e;
    }
    sum = mt__block_reduce(sum, red, 0);   // (its __syncthreads also publishes every score)
    float inv = 1.0f / sum;
    int g = threadIdx.x / D4, d = threadIdx.x % D4;
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (g < G) {
        #pragma unroll 4
        for (int p2 = g; p2 <= p; p2 += G) {
            float w = score[p2];
            float4 v = *(const float4 *)(v_b + (size_t)p2 * C_local + 4 * d);
            acc.x += w * v.x; acc.y += w * v.y; acc.z += w * v.z; acc.w += w * v.w;
        }
    }
    partial[threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.x < D4) {
        float4 o = mt__attention_groups_sum(partial, G, D4, threadIdx.x);
        *(float4 *)(out + ((size_t)b * Tq + t) * C_local + h * hs + 4 * threadIdx.x) =
            make_float4(o.x * inv, o.y * inv, o.z * inv, o.w * inv);
    }
}
// Decoding's attention (Tq = 1) split over the cache, as FlashAttention's "flash-decoding": the
// kernel above gives a (sequence, head) one block, which walks all p + 1 positions itself (a K row
// per thread, then the V rows 8 at a time per group): at batch 1 that is 12 blocks on a GPU of
// 132 SMs, each a chain of a dozen round trips to memory. Here the positions of one (sequence,
// head) are cut into S slices of `per` positions, one block each, the S blocks of one (sequence,
// head) forming a thread-block cluster (Hopper; S <= 8, the portable cluster size). Each block runs
// the same three passes over its slice only and keeps, in its shared memory,
//   m_s = max of its scores,  l_s = sum of exp(score - m_s),  o_s = sum of exp(score - m_s) v  (hs)
// (a slice past p: m_s = -inf, l_s = 0, o_s = 0). After a cluster barrier, block 0 reads the
// others' shared memory (distributed shared memory) and combines them, in the order of s:
//   M = max_s m_s,  L = sum_s l_s exp(m_s - M),  out = (sum_s o_s exp(m_s - M)) / L
// which is softmax(scores) v over all positions (slice 0 always holds position 0, so M is finite).
// The new token's K and V go into the cache by the block whose slice holds p. Another summation
// order than the kernel above (a few ulps of fp32); the one-kernel decode step keeps the unsplit
// form (splits = 1), and its test compares it with that.
// shared memory of one block: scores (per, rounded up to 4) | partial outputs (128 float4) |
// reduction (32) | the slice's m, l (4 floats, for alignment) and o (hs)
__host__ __device__ static inline size_t mt__attention_split_smem_floats(int per, int hs) {
    return (size_t)(per + 3) / 4 * 4 + 4 * 128 + 32 + 4 + (size_t)hs;
}
// thread-block clusters (Hopper and newer): the blocks of a cluster run together and can read each
// other's shared memory (cooperative_groups' cluster_group). Built for an older GPU (sm_80), where
// that type does not exist, a "cluster" is the block alone: the launchers ask for clusters only
// where the GPU has them (mt__clusters_supported, below), so there a kernel always sees one block.
struct mt__cluster {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    __device__ int num_blocks() const { return (int)cooperative_groups::this_cluster().num_blocks(); }
    __device__ int block_rank() const { return (int)cooperative_groups::this_cluster().block_rank(); }
    __device__ void sync() const { cooperative_groups::this_cluster().sync(); }
    // p in this block's shared memory -> the same variable in block `rank`'s
    template <typename T>
    __device__ T *map(T *p, int rank) const { return cooperative_groups::this_cluster().map_shared_rank(p, rank); }
#else
    __device__ int num_blocks() const { return 1; }
    __device__ int block_rank() const { return 0; }
    __device__ void sync() const { __syncthreads(); }
    template <typename T>
    __device__ T *map(T *p, int rank) const { (void)rank; return p; }
#endif
};
template <int HS>
__global__ void __launch_bounds__(128) mt_attention_decode_split_kernel(float *out, float *kcache, float *vcache,
                                                                        const float *qkv, const int *start,
                                                                        int C_local, int NH_local, int cap, int per) {
    extern __shared__ float smem[];
    mt__cluster cluster;
    const int hs = HS ? HS : C_local / NH_local, D4 = hs / 4, G = 128 / D4;
    const int MAXD4 = HS ? HS / 4 : 32;   // registers for q and one K row
    // EARLY (head sizes up to 64): the slice's cached rows before p are read into registers before
    // the wait for the kernel ahead (programmatic dependent launch): earlier steps wrote them, not
    // that kernel, and start[] is the host's upload. A thread's first K row, and up to VPRE of the V
    // rows its group sums; their round trips overlap the kernel ahead instead of following q's.
    const int EARLY = HS != 0 && HS <= 64, VPRE = EARLY ? 8 : 1;   // (instantiated: 64 and 0)
    const int S = (int)cluster.num_blocks(), s = (int)cluster.block_rank();
    int h = (blockIdx.x / S) % NH_local, b = blockIdx.x / (S * NH_local);
    int p = start[b], lo = s * per, hi = min(p, lo + per - 1);   // my positions: lo..hi (none if hi < lo)
    int g = threadIdx.x / D4, d = threadIdx.x % D4;
    float *k_b = kcache + (size_t)b * cap * C_local + h * hs, *v_b = vcache + (size_t)b * cap * C_local + h * hs;
    float4 k_early[EARLY ? MAXD4 : 1], v_early[VPRE];
    if (EARLY) {
        int p2 = lo + threadIdx.x;
        if (p2 <= hi && p2 < p) {
            const float4 *k = (const float4 *)(k_b + (size_t)p2 * C_local);
#pragma unroll
            for (int e = 0; e < MAXD4; e++) k_early[e] = k[e];
        }
#pragma unroll
        for (int i = 0; i < VPRE; i++) {
            int p3 = lo + g + G * i;
            if (g < G && p3 <= hi && p3 < p) v_early[i] = *(const float4 *)(v_b + (size_t)p3 * C_local + 4 * d);
        }
    }
    mt__pdl_start();
    int per4 = (per + 3) / 4 * 4;
    float *score = smem, *red = smem + per4 + 4 * 128, *mine = red + 32;   // mine: m, l, -, -, o (hs)
    float4 *partial = (float4 *)(smem + per4);
    const float *row = qkv + (size_t)b * 3 * C_local + h * hs;   // q | k | v of this head at C_local apart
    if (p >= lo && p <= hi) {   // the new token's K and V, where this block will read them
        for (int i = threadIdx.x; i < hs; i += blockDim.x) {
            k_b[(size_t)p * C_local + i] = row[C_local + i];
            v_b[(size_t)p * C_local + i] = row[2 * C_local + i];
        }
    }
    __syncthreads();   // the block's global writes are seen by the block after the barrier
    float4 q[MAXD4];
#pragma unroll
    for (int e = 0; e < MAXD4; e++) q[e] = e < D4 ? *(const float4 *)(row + 4 * e) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float scale = 1.0f / sqrtf((float)hs), m = -INFINITY;
    for (int p2 = lo + threadIdx.x; p2 <= hi; p2 += blockDim.x) {
        float4 kv[MAXD4];
        if (EARLY && p2 == lo + (int)threadIdx.x && p2 < p) {   // the row read before the wait
#pragma unroll
            for (int e = 0; e < MAXD4; e++) kv[e] = k_early[e];
        } else {
            const float4 *k = (const float4 *)(k_b + (size_t)p2 * C_local);
#pragma unroll
            for (int e = 0; e < MAXD4; e++) kv[e] = e < D4 ? k[e] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
        float sc = 0.0f;
#pragma unroll
        for (int e = 0; e < MAXD4; e++) sc += q[e].x * kv[e].x + q[e].y * kv[e].y + q[e].z * kv[e].z + q[e].w * kv[e].w;
        score[p2 - lo] = sc * scale;
        m = fmaxf(m, score[p2 - lo]);
    }
    m = mt__block_reduce(m, red, 1);
    float sum = 0.0f;
    for (int p2 = lo + threadIdx.x; p2 <= hi; p2 += blockDim.x) {
        float e = __expf(score[p2 - lo] - m);
        score[p2 - lo] = e;
        sum += e;
    }
    sum = mt__block_reduce(sum, red, 0);   // (its __syncthreads also publishes every score)
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (g < G) {   // positions lo + g, lo + g + G, ... in order: the first VPRE from registers (but p)
        int p2 = lo + g;
        if (EARLY) {
#pragma unroll
            for (int i = 0; i < VPRE; i++, p2 += G) {
                if (p2 > hi) break;
                float w = score[p2 - lo];
                float4 v = p2 < p ? v_early[i] : *(const float4 *)(v_b + (size_t)p2 * C_local + 4 * d);
                acc.x += w * v.x; acc.y += w * v.y; acc.z += w * v.z; acc.w += w * v.w;
            }
        }
#pragma unroll 4
        for (; p2 <= hi; p2 += G) {
            float w = score[p2 - lo];
            float4 v = *(const float4 *)(v_b + (size_t)p2 * C_local + 4 * d);
            acc.x += w * v.x; acc.y += w * v.y; acc.z += w * v.z; acc.w += w * v.w;
        }
    }
    partial[threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.x < D4) {
        float4 o = mt__attention_groups_sum(partial, G, D4, threadIdx.x);
        *(float4 *)(mine + 4 + 4 * threadIdx.x) = o;   // o_s, not yet divided
    }
    if (threadIdx.x == 0) { mine[0] = m; mine[1] = sum; }   // (an empty slice: -inf and 0, and o_s = 0)
    cluster.sync();   // every slice's m, l, o_s written and visible to the cluster
    if (s == 0) {
        float M = -INFINITY;
        for (int j = 0; j < S; j++) M = fmaxf(M, cluster.map(mine, j)[0]);
        for (int i = threadIdx.x; i < hs; i += blockDim.x) {
            float L = 0.0f, O = 0.0f;
            for (int j = 0; j < S; j++) {
                const float *theirs = cluster.map(mine, j);
                float f = __expf(theirs[0] - M);   // 0 for an empty slice
                L += theirs[1] * f;
                O += theirs[4 + i] * f;
            }
            out[(size_t)b * C_local + h * hs + i] = O / L;
        }
    }
    cluster.sync();   // block 0 has read the others' shared memory: now they may exit
}
// how many slices decoding's attention cuts the cache into (1: the unsplit kernel): enough to
// give a (sequence, head) up to 8 blocks, each at least 32 positions. A function of the cache's
// size only, not of the position: a decode step is recorded once as a CUDA graph and replayed
// while p grows (the slices past p have nothing to do).
// (Thread-block clusters need a Hopper GPU or newer: elsewhere, 1.)
static int mt__clusters_supported(void) {
    int dev = 0, yes = 0;
    MT_CUDA_CHECK(cudaGetDevice(&dev));
    MT_CUDA_CHECK(cudaDeviceGetAttribute(&yes, cudaDevAttrClusterLaunch, dev));
    return yes;
}
static int mt__attention_decode_splits(int Tq, int cap) {
    static const int clusters = mt__clusters_supported();   // (a function-local static: asked once)
    if (Tq != 1 || !clusters) return 1;
    int S = (cap + 31) / 32;
    return S < 1 ? 1 : S > 8 ? 8 : S;
}
template <int HS>
static void mt__attention_split_launch(float *out, float *kcache, float *vcache, const float *qkv, const int *start,
                                       int B, int C_local, int NH_local, int cap, int S, cudaStream_t stream) {
    int per = (cap + S - 1) / S, hs = C_local / NH_local;
    size_t smem = sizeof(float) * mt__attention_split_smem_floats(per, hs);
    mt__allow_smem((const void *)mt_attention_decode_split_kernel<HS>, smem);
    // S blocks of one (sequence, head) together
    mt__launch_cluster("mt_attention_decode_split_kernel", mt_attention_decode_split_kernel<HS>,
                       (unsigned)(B * NH_local * S), 128, smem, stream, (unsigned)S, out, kcache, vcache, qkv, start,
                       C_local, NH_local, cap, per);
}
template <int HS>
static void mt__attention_cached_launch(float *out, float *kcache, float *vcache, const float *qkv, const int *start,
                                        int B, int Tq, int C_local, int NH_local, int cap, int splits,
                                        cudaStream_t stream) {
    size_t smem = sizeof(float) * mt__attention_cached_smem_floats(cap);
    unsigned blocks = (unsigned)(B * NH_local * Tq);
    int S = splits == 1 ? 1 : mt__attention_decode_splits(Tq, cap);
    if (S > 1) {   // (compiled for GPT-2's head size 64, with its reads ahead of the wait, and in the
                   // generic form for every other: two instantiations, not five, for CI's compile time)
        mt__attention_split_launch<HS == 64 ? 64 : 0>(out, kcache, vcache, qkv, start, B, C_local, NH_local, cap, S,
                                                      stream);
    } else if (Tq == 1) {
        mt__allow_smem((const void *)mt_attention_cached_forward_kernel<HS, 1>, smem);
        mt__launch("mt_attention_cached_forward_kernel", mt_attention_cached_forward_kernel<HS, 1>, blocks, 128, smem,
                   stream, out, kcache, vcache, qkv, start, Tq, C_local, NH_local, cap);
    } else {
        size_t n = (size_t)B * Tq * C_local;
        mt__launch("mt_kv_cache_store_kernel", mt_kv_cache_store_kernel, mt__blocks(n, 256), 256, 0, stream, kcache,
                   vcache, qkv, start, B, Tq, C_local, cap);
        mt__allow_smem((const void *)mt_attention_cached_forward_kernel<HS, 0>, smem);
        mt__launch("mt_attention_cached_forward_kernel", mt_attention_cached_forward_kernel<HS, 0>, blocks, 128, smem,
                   stream, out, kcache, vcache, qkv, start, Tq, C_local, NH_local, cap);
    }
}
// splits: 0, the launcher's choice (decoding's Tq = 1: split over the cache, mt__attention_decode_splits);
// 1, one block per (sequence, head, new token) whatever Tq (the form the one-kernel decode step runs)
void mt_attention_cached_forward_gpu(float *out, float *kcache, float *vcache, const float *qkv, const int *start,
                                     int B, int Tq, int C_local, int NH_local, int cap, int splits,
                                     cudaStream_t stream) {
    int hs = C_local / NH_local;
    if (B == 0 || Tq == 0) return;
    if (hs % 4 != 0 || hs > 128)
        mt_fatal("attention over the KV cache: head size %d is not a multiple of 4 up to 128\nhint: use "
                 "hidden-size / num-attention-heads = 16, 32, 64 or 128", hs);
    if (!mt__aligned16(out) || !mt__aligned16(kcache) || !mt__aligned16(vcache) || !mt__aligned16(qkv))
        mt_fatal("internal: attention over the KV cache reads float4: its buffers must be 16-byte aligned");
    switch (hs) {   // the training attention's head sizes (mt__attention_check)
    case 16: mt__attention_cached_launch<16>(out, kcache, vcache, qkv, start, B, Tq, C_local, NH_local, cap, splits, stream); break;
    case 32: mt__attention_cached_launch<32>(out, kcache, vcache, qkv, start, B, Tq, C_local, NH_local, cap, splits, stream); break;
    case 64: mt__attention_cached_launch<64>(out, kcache, vcache, qkv, start, B, Tq, C_local, NH_local, cap, splits, stream); break;
    case 128: mt__attention_cached_launch<128>(out, kcache, vcache, qkv, start, B, Tq, C_local, NH_local, cap, splits, stream); break;
    default:   // another multiple of 4
        mt__attention_cached_launch<0>(out, kcache, vcache, qkv, start, B, Tq, C_local, NH_local, cap, splits, stream);
    }
}

// ---------------------------------------------------------------------------------------------
// decoding one sequence: the qkv GEMV and the attention over the cache in one kernel
// ---------------------------------------------------------------------------------------------
// At batch 1 a decode layer's qkv GEMV (mt_matmul_kernel6_gemv_mma) and its attention over the
// cache (mt_attention_decode_split_kernel) are two kernels in a chain: the attention waits for the
// whole GEMV to end and its writes to be flushed, then reads q back from memory (~1.5-2 us of the
// chain a layer, 12 layers). Here one cluster of 8 blocks per head does both:
//   1. the GEMV for the head's 3 x 64 outputs [q | k | v] (rows h*64.. of each third of W, a block
//      24 of them: three groups of 8, each group exactly the GEMV kernel's arithmetic: warp w the
//      k steps w, w+8, ..., two mma.sync.m16n8k16 a step, the 8 warps' partials added in warp order,
//      then the bias, read before the wait), the block's 24 values in its shared memory;
//   2. a cluster barrier; then the split attention's work, block s the positions of slice s:
//      q (and, in the block whose slice holds p, the new K and V rows, stored into the cache and
//      into its staged rows) read from the blocks that computed them (distributed shared memory),
//      and the same three passes over the staged rows only,
//      the same combine by block 0, on the first 128 threads (the other 128 wait at the barriers).
// The same values in the same order as the two kernels (S = 8 slices; the split kernel has 8 from
// 225 cached positions): the same bits, which tests/gpu/test_kernels checks. Before the wait for
// the kernel ahead (the layernorm) a block asks for its weights (into registers, as the GEMV) and
// its slice's cached K and V rows (copied into its shared memory, cp.async: in registers too they
// took the kernel to 240 registers, one block an SM, and the next kernel's blocks found no room to
// start early). B = 1, head size 64, 16-bit weights (decoding's copy), Hopper.
// Shared memory: the staged K rows | V rows (per x (64 + 4) floats each: a row's stride of 68
// floats puts the float4s that 8 threads read from 8 rows in 8 different banks) | the split
// kernel's (scores, partial outputs, reduction, m, l, o) | q (64)
#define MT__QKV_ATT_SLICES 8
__host__ __device__ static inline size_t mt__qkv_attention_smem_floats(int per) {
    return 2 * (size_t)per * (64 + 4) + mt__attention_split_smem_floats(per, 64) + 64;
}
template <int F16>
__global__ void __launch_bounds__(256, 2) mt_qkv_attention_decode_kernel(float *out, float *kcache, float *vcache,
                                                                      const float *inp, const uint16_t *weight,
                                                                      const float *bias, const int *start, int C,
                                                                      int C_local, int cap, int per, int early) {
    extern __shared__ float smem[];
    constexpr int HS = 64, D4 = HS / 4, ATT = 128, G = ATT / D4, S = MT__QKV_ATT_SLICES, KS = HS + 4;
    if (early) mt__pdl_launch_next();   // a decode step's: the next kernel may launch now (mt__pdl_early)
    constexpr int MINE = 3 * HS / S, TILES = MINE / 8, AHEAD = 3;   // 24 outputs a block, 3 groups
    __shared__ float partial[TILES][8][8];             // [group][warp][output]: input row 0's partial sums
    __shared__ __align__(16) float mine_qkv[MINE];     // this block's 24 of the head's [q | k | v]
    mt__cluster cluster;
    const int s = cluster.block_rank(), h = blockIdx.x / S;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4, steps = (C + 31) / 32;
    // the weight rows of this block's groups: head-local output i is row (i / HS) C_local + h HS + i % HS
    const uint16_t *w_row[TILES];
    int o0[TILES];
#pragma unroll
    for (int j = 0; j < TILES; j++) {
        int i = MINE * s + 8 * j;
        o0[j] = (i / HS) * C_local + h * HS + i % HS;
        w_row[j] = weight + (size_t)(o0[j] + g) * C;
    }
    // the attention's slice lo..hi, and its cached rows before p copied ahead of the wait (earlier
    // steps wrote them, not the kernel ahead; start[] is the host's upload or the step before's)
    int p = start[0], lo = s * per, hi = min(p, lo + per - 1);
    int ag = threadIdx.x / D4, d = threadIdx.x % D4;
    float *k_b = kcache + h * HS, *v_b = vcache + h * HS;
    int per4 = (per + 3) / 4 * 4;
    float *kst = smem, *vst = smem + (size_t)per * KS;
    float *score = vst + (size_t)per * KS, *red = score + per4 + 4 * ATT, *att = red + 32;   // att: m, l, -, -, o
    float4 *part4 = (float4 *)(score + per4), *q4 = (float4 *)(att + 4 + HS);
    int n_early = max(0, min(hi, p - 1) - lo + 1);
    for (int c = threadIdx.x; c < 2 * n_early * D4; c += blockDim.x) {
        int v = c >= n_early * D4, r = (c / D4) % n_early, e = c % D4;
        mt__cp_async16((v ? vst : kst) + r * KS + 4 * e, (v ? v_b : k_b) + (size_t)(lo + r) * C_local + 4 * e, 16);
    }
    mt__cp_async_commit();
    // thread i < MINE finishes the block's output i (o0[i / 8] + i % 8): its bias read now, before the
    // wait, as mt_matmul_kernel6_gemv_mma does (after the reduction it was a round trip on the path)
    float bias_i = 0.0f;
    if (bias && threadIdx.x < MINE) {
        int i = MINE * s + threadIdx.x;
        bias_i = bias[(i / HS) * C_local + h * HS + i % HS];
    }
    // 1. the GEMV (mt_matmul_kernel6_gemv_mma's loop, three groups of 8 outputs at once)
    float acc[TILES][4];
#pragma unroll
    for (int j = 0; j < TILES; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    for (int s0 = warp; s0 < steps; s0 += 8 * AHEAD) {
        uint4 w[TILES][AHEAD];
#pragma unroll
        for (int i = 0; i < AHEAD; i++)
#pragma unroll
            for (int j = 0; j < TILES; j++) {
                int k = 32 * (s0 + 8 * i) + 8 * t;
                w[j][i] = k < C ? *(const uint4 *)(w_row[j] + k) : make_uint4(0, 0, 0, 0);
            }
        if (s0 == warp) mt__pdl_start();   // first pass: now wait for the kernel ahead (it wrote inp)
#pragma unroll
        for (int i = 0; i < AHEAD; i++) {
            int k = 32 * (s0 + 8 * i) + 8 * t;
            if (32 * (s0 + 8 * i) >= C) break;   // (the same for the whole warp: mma needs all 32 lanes)
            float x[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
            if (g == 0 && k < C) mt__load8(x, inp + k);
            uint32_t a_lo[4] = {mt__pack16x2<F16>(x[0], x[1]), 0u, mt__pack16x2<F16>(x[2], x[3]), 0u};
            uint32_t a_hi[4] = {mt__pack16x2<F16>(x[4], x[5]), 0u, mt__pack16x2<F16>(x[6], x[7]), 0u};
#pragma unroll
            for (int j = 0; j < TILES; j++) {
                mt__mma16<F16>(acc[j], a_lo, w[j][i].x, w[j][i].y);
                mt__mma16<F16>(acc[j], a_hi, w[j][i].z, w[j][i].w);
            }
        }
    }
    mt__pdl_start();   // the warps without a k step; else nothing
    if (g == 0)   // acc[j][0], acc[j][1]: input row 0, outputs o0[j] + 2t, + 2t + 1
#pragma unroll
        for (int j = 0; j < TILES; j++) {
            partial[j][warp][2 * t] = acc[j][0];
            partial[j][warp][2 * t + 1] = acc[j][1];
        }
    __syncthreads();
    if (threadIdx.x < MINE) {
        int j = threadIdx.x / 8, o = threadIdx.x % 8;
        float sum = 0.0f;
#pragma unroll
        for (int w2 = 0; w2 < 8; w2++) sum += partial[j][w2][o];
        mine_qkv[threadIdx.x] = sum + bias_i;
    }
    cluster.sync();   // every block's 24 values written and visible to the cluster
    // 2. the attention of slice s (mt_attention_decode_split_kernel's passes on threads 0..127)
    if (p >= lo && p <= hi && threadIdx.x < HS) {   // the new token's K and V, where this block reads them:
        // into the cache for the steps after, and into the staged rows for this block's passes
        // below (from global memory they were one more round trip on the step's critical path)
        int ik = HS + threadIdx.x, iv = 2 * HS + threadIdx.x;
        float k_new = cluster.map(mine_qkv, ik / MINE)[ik % MINE], v_new = cluster.map(mine_qkv, iv / MINE)[iv % MINE];
        k_b[(size_t)p * C_local + threadIdx.x] = k_new;
        v_b[(size_t)p * C_local + threadIdx.x] = v_new;
        kst[(p - lo) * KS + threadIdx.x] = k_new;
        vst[(p - lo) * KS + threadIdx.x] = v_new;
    }
    if (threadIdx.x < D4) q4[threadIdx.x] = *(const float4 *)(cluster.map(mine_qkv, 4 * threadIdx.x / MINE) +
                                                              4 * threadIdx.x % MINE);
    mt__cp_async_wait<0>();   // this thread's copies of the cached rows have landed
    __syncthreads();          // everyone's, q, and the block's global writes are seen by the block
    float scale = 1.0f / sqrtf((float)HS), m = -INFINITY;
    for (int p2 = lo + threadIdx.x; threadIdx.x < ATT && p2 <= hi; p2 += ATT) {
        const float4 *k = (const float4 *)(kst + (p2 - lo) * KS);   // (p2 <= hi <= p: every row is staged)
        float4 kv[D4];
#pragma unroll
        for (int e = 0; e < D4; e++) kv[e] = k[e];
        float sc = 0.0f;
#pragma unroll
        for (int e = 0; e < D4; e++) {
            float4 q = q4[e];
            sc += q.x * kv[e].x + q.y * kv[e].y + q.z * kv[e].z + q.w * kv[e].w;
        }
        score[p2 - lo] = sc * scale;
        m = fmaxf(m, score[p2 - lo]);
    }
    m = mt__block_reduce(m, red, 1);   // (threads 128..255 add -inf and, below, 0: the same result)
    float sum = 0.0f;
    for (int p2 = lo + threadIdx.x; threadIdx.x < ATT && p2 <= hi; p2 += ATT) {
        float e = __expf(score[p2 - lo] - m);
        score[p2 - lo] = e;
        sum += e;
    }
    sum = mt__block_reduce(sum, red, 0);   // (its __syncthreads also publishes every score)
    float4 acc4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (threadIdx.x < ATT) {   // positions lo + ag, lo + ag + G, ... in order: the staged rows
#pragma unroll 4
        for (int p2 = lo + ag; p2 <= hi; p2 += G) {
            float wgt = score[p2 - lo];
            float4 v = *(const float4 *)(vst + (p2 - lo) * KS + 4 * d);
            acc4.x += wgt * v.x; acc4.y += wgt * v.y; acc4.z += wgt * v.z; acc4.w += wgt * v.w;
        }
        part4[threadIdx.x] = acc4;
    }
    __syncthreads();
    // the slice's end and the cluster's combine: mt_attention_decode_split_kernel's, written out again.
    // As one device function shared by both kernels (branch decode-tail-shared) it gave the same bits
    // and a batch-1 step ~1-1.5 us slower, twice (docs/perf.md, session 39), so each kernel keeps its copy
    if (threadIdx.x < D4) {
        float4 o = mt__attention_groups_sum(part4, G, D4, threadIdx.x);
        *(float4 *)(att + 4 + 4 * threadIdx.x) = o;   // o_s, not yet divided
    }
    if (threadIdx.x == 0) { att[0] = m; att[1] = sum; }   // (an empty slice: -inf and 0, and o_s = 0)
    cluster.sync();   // every slice's m, l, o_s written and visible to the cluster
    if (s == 0 && threadIdx.x < HS) {
        float M = -INFINITY;
        for (int j = 0; j < S; j++) M = fmaxf(M, cluster.map(att, j)[0]);
        float L = 0.0f, O = 0.0f;
        for (int j = 0; j < S; j++) {
            const float *theirs = cluster.map(att, j);
            float f = __expf(theirs[0] - M);   // 0 for an empty slice
            L += theirs[1] * f;
            O += theirs[4 + threadIdx.x] * f;
        }
        out[h * HS + threadIdx.x] = O / L;
    }
    cluster.sync();   // block 0 has read the others' shared memory: now they may exit
}
// 1 where it ran (B = 1, head size 64, 16-bit weights, clusters, 16-byte aligned buffers, C % 8 == 0);
// 0: the caller runs mt_matmul_forward_rounded_weight_gpu and mt_attention_cached_forward_gpu
int mt_qkv_attention_decode_gpu(float *out, float *kcache, float *vcache, const float *inp, const void *weight16,
                                const float *bias, const int *start, int C, int C_local, int NH_local, int cap,
                                int dtype, cudaStream_t stream) {
    static const int clusters = mt__clusters_supported();
    if (!clusters || !weight16 || C_local != 64 * NH_local || C % 8 != 0 || cap < MT__QKV_ATT_SLICES ||
        (dtype != MT_DTYPE_BF16 && dtype != MT_DTYPE_FP16) || !mt__aligned16(out) || !mt__aligned16(kcache) ||
        !mt__aligned16(vcache) || !mt__aligned16(inp) || !mt__aligned16(weight16))
        return 0;
    int per = (cap + MT__QKV_ATT_SLICES - 1) / MT__QKV_ATT_SLICES;
    size_t smem = sizeof(float) * mt__qkv_attention_smem_floats(per);
    if (smem > 160 * 1024) return 0;   // over ~2,300 positions (a bound under the GPU's opt-in limit, 227 KB on an H200)
    unsigned blocks = (unsigned)(NH_local * MT__QKV_ATT_SLICES);
    if (dtype == MT_DTYPE_FP16) {
        mt__allow_smem((const void *)mt_qkv_attention_decode_kernel<1>, smem);
        mt__launch_cluster("mt_qkv_attention_decode_kernel", mt_qkv_attention_decode_kernel<1>, blocks, 256, smem,
                           stream, (unsigned)MT__QKV_ATT_SLICES, out, kcache, vcache, inp, (const uint16_t *)weight16,
                           bias, start, C, C_local, cap, per, mt__pdl_early());
    } else {
        mt__allow_smem((const void *)mt_qkv_attention_decode_kernel<0>, smem);
        mt__launch_cluster("mt_qkv_attention_decode_kernel", mt_qkv_attention_decode_kernel<0>, blocks, 256, smem,
                           stream, (unsigned)MT__QKV_ATT_SLICES, out, kcache, vcache, inp, (const uint16_t *)weight16,
                           bias, start, C, C_local, cap, per, mt__pdl_early());
    }
    return 1;
}

// ---------------------------------------------------------------------------------------------
// argmax of each row (greedy decoding): a cluster of S blocks of 1024 threads per row (S = 8 on
// Hopper where the row has 8 x 1024 values or more, else 1), each block its slice of the row, each
// thread its strided share of the slice, then a block reduction that keeps the larger value and, on
// a tie, the smaller index (deterministic); block 0 of the cluster then reads the others' answers
// through distributed shared memory and keeps, in slice order, a strictly larger one. A thread
// reads 8 values before it compares any. (One block a row took 8.8 us for GPT-2's 50,257 values
// in a decode step, ~7 rounds of 8 loads; a block of a cluster of 8 does one.)
// NaN, as the CPU's loop (best = 0, then v where x[v] > x[best]) treats it: never the answer but
// at index 0, where nothing beats it. A thread skips a NaN it meets first (else, kept as its best,
// it would survive the tree's merges where it receives and lose the values it receives).
// matches mt_argmax_rows_cpu (megatron.h, 3. OPS). Writes out with '='.
#define MT__ARGMAX_THREADS 1024
__global__ void __launch_bounds__(MT__ARGMAX_THREADS) mt_argmax_rows_kernel(int *out, const float *x, int n, int ld) {
    __shared__ float best_v[MT__ARGMAX_THREADS];
    __shared__ int best_i[MT__ARGMAX_THREADS];
    mt__cluster cluster;
    const int S = cluster.num_blocks(), s = cluster.block_rank(), r = blockIdx.x / S;
    mt__pdl_start();
    const float *row = x + (size_t)r * ld;
    int per = (n + S - 1) / S, begin = s * per, end = min(n, begin + per);
    float bv = -INFINITY;
    int bi = n;   // "none yet": any real index is smaller
    for (int v0 = begin + threadIdx.x; v0 < end; v0 += 8 * MT__ARGMAX_THREADS) {
        float val[8];
        #pragma unroll
        for (int u = 0; u < 8; u++) {
            int v = v0 + u * MT__ARGMAX_THREADS;
            val[u] = v < end ? row[v] : -INFINITY;
        }
        #pragma unroll
        for (int u = 0; u < 8; u++) {   // a thread's indices rise: > keeps the first
            int v = v0 + u * MT__ARGMAX_THREADS;
            if (v < end && (val[u] > bv || (bi == n && (val[u] == val[u] || v == 0)))) { bv = val[u]; bi = v; }
        }
    }
    best_v[threadIdx.x] = bv;
    best_i[threadIdx.x] = bi;
    __syncthreads();
    for (int k = blockDim.x / 2; k > 0; k /= 2) {
        if (threadIdx.x < k) {
            float ov = best_v[threadIdx.x + k];
            int oi = best_i[threadIdx.x + k];
            int mine = best_i[threadIdx.x];
            if (oi < n && (mine == n || ov > best_v[threadIdx.x] || (ov == best_v[threadIdx.x] && oi < mine))) {
                best_v[threadIdx.x] = ov;
                best_i[threadIdx.x] = oi;
            }
        }
        __syncthreads();
    }
    if (S == 1) {
        if (threadIdx.x == 0) out[r] = best_i[0] < n ? best_i[0] : 0;
        return;
    }
    cluster.sync();   // every slice's answer in its block's best_v[0], best_i[0]
    if (s == 0 && threadIdx.x == 0) {
        float cv = best_v[0];
        int ci = best_i[0];
        for (int j = 1; j < S; j++) {   // slices in index order: only a strictly larger value replaces
            float v = *cluster.map(&best_v[0], j);
            int i = *cluster.map(&best_i[0], j);
            if (i < n && (ci == n || v > cv)) { cv = v; ci = i; }
        }
        out[r] = ci < n ? ci : 0;
    }
    cluster.sync();   // block 0 has read the others' shared memory: now they may exit
}
void mt_argmax_rows_gpu(int *out, const float *x, int rows, int n, int ld, cudaStream_t stream) {
    if (rows == 0) return;
    static const int clusters = mt__clusters_supported();
    unsigned S = clusters && n >= 8 * MT__ARGMAX_THREADS ? 8 : 1;   // S blocks of one row together
    mt__launch_cluster("mt_argmax_rows_kernel", mt_argmax_rows_kernel, (unsigned)rows * S, MT__ARGMAX_THREADS, 0,
                       stream, S, out, x, n, ld);
}

// ---------------------------------------------------------------------------------------------
// sampling on the device (generation's temperature, top-k, top-p): mt_sample_row_cpu's integers
// (megatron.h, 3. OPS), so the same token. The CPU sorts a row's candidates and walks their running
// sum; the GPU never sorts. Each of the op's three questions, "the first rank whose running sum
// (of counts, for top-k; of weights, for top-p and the draw) exceeds X", is a radix select on the
// candidates' 32-bit keys (mt__candidate_key: rank order is the keys' order, equal keys by id):
//   level 1   the keys' top 11 bits: per bucket, how many candidates and their summed weight;
//             the buckets in order, to the one where the running sum passes X
//   level 2   the next 11 bits, of that bucket's candidates only; level 3 the last 10 bits
//   the key   is then known; its candidates are equal logits, each of the same weight w, in id
//             order: the answer is the j-th of them, j = (what is left of X) / w (or what is left
//             of the count); when the key has one candidate, that one
// The weights are integers: the buckets' atomic sums, whatever order the threads add in, are the
// CPU's sums bit for bit. Kernels, in stream order:
//   mt_argmax_rows_kernel     out = the argmax: greedy rows' token, and every row's l_max
//   mt_sample_weights_kernel  a grid over (candidates, rows): w_v in double (the exponentials are
//                             the costly part, spread over the GPU) and level 1's histogram (a
//                             block's in shared memory, then added into its row's in global memory)
//   mt_sample_scatter_kernel  the same grid: each candidate's (key, id, weight) into its level-1
//                             bucket's run of a list ordered by bucket (counting sort, in any order
//                             within a run), so that levels 2 and 3 read one bucket's run only
//   mt_sample_select_kernel   a block of 1024 threads per row: top-k, top-p, the draw; out = token
// work, per call: every row's level-1 histogram (2048 x {count, weight}) and the runs' fill counts
// (2048), both zeroed by the launcher; then every row's n weights, and its list of n records.
#define MT__SAMPLE_THREADS 1024
#define MT__SAMPLE_BUCKETS 2048   // 11 bits of the key
struct mt__sample_record { unsigned int key; int id; unsigned long long weight; };
// == mt__candidate_key (megatron.h): descending logits as ascending keys, -0 as +0, NaN last
__device__ static inline uint32_t mt__gpu_candidate_key(float logit) {
    if (logit == 0.0f) logit = 0.0f;   // -0 == +0
    uint32_t u = __float_as_uint(logit);
    uint32_t ascending = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return logit != logit ? 0xFFFFFFFFu : ~ascending;
}
// == mt_sample_weight (megatron.h): floor(exp((logit - best) * inv_t) * 2^40), 0 for NaN
__device__ static inline unsigned long long mt__gpu_sample_weight(float logit, float best, double inv_t) {
    if (logit == best) return 1ull << 40;
    double p = exp((double)(logit - best) * inv_t);
    return p >= 0.0 && p <= 1.0 ? (unsigned long long)(p * 1099511627776.0) : 0ull;
}
__device__ static inline int mt__sample_greedy(const mt_draw &d, int n) {
    return !(d.temperature > 0.0f) || d.top_k == 1 || n == 1;   // mt_sample_row_cpu's test
}
// the work's pieces (see above), for `rows` rows of n candidates
struct mt__sample_work {
    unsigned long long *hist;    // (rows, 2048, 2): {count, weight}    } zeroed before
    unsigned int *fill;          // (rows, 2048): records placed so far } each call
    unsigned long long *weights; // (rows, n)
    mt__sample_record *records;  // (rows, n), by level-1 bucket
};
static size_t mt__sample_work_layout(mt__sample_work *w, void *base, int rows, int n) {
    size_t r = (size_t)rows, zeroed = r * MT__SAMPLE_BUCKETS * (2 * sizeof(unsigned long long) + sizeof(unsigned int));
    char *p = (char *)base;
    if (w) {
        w->hist = (unsigned long long *)p;
        w->fill = (unsigned int *)(p + r * MT__SAMPLE_BUCKETS * 2 * sizeof(unsigned long long));
        w->weights = (unsigned long long *)(p + zeroed);
        w->records = (mt__sample_record *)(p + zeroed + r * (size_t)n * sizeof(unsigned long long));
    }
    return zeroed + r * (size_t)n * (sizeof(unsigned long long) + sizeof(mt__sample_record));
}
size_t mt_gpu_sample_rows_work_bytes(int rows, int n) { return mt__sample_work_layout(NULL, NULL, rows, n); }

// w[v] for one row's candidates; level 1 = the row's histogram of the keys' top 11 bits, 2 words a
// bucket: {count, weight}, added into (zeroed by the launcher). grid (ceil(n / 1024), rows).
__global__ void __launch_bounds__(MT__SAMPLE_THREADS)
mt_sample_weights_kernel(mt__sample_work work, const float *x, int n, int ld, const int *best, const mt_draw *draws) {
    __shared__ unsigned int count[MT__SAMPLE_BUCKETS];
    __shared__ unsigned long long weight[MT__SAMPLE_BUCKETS];
    mt__pdl_start();   // best: the argmax kernel ahead
    int row = blockIdx.y;
    mt_draw d = draws[row];
    if (mt__sample_greedy(d, n)) return;   // the argmax stands
    for (int b = threadIdx.x; b < MT__SAMPLE_BUCKETS; b += blockDim.x) { count[b] = 0; weight[b] = 0; }
    __syncthreads();
    const float *xr = x + (size_t)row * ld;
    float l_best = xr[best[row]];
    double inv_t = 1.0 / (double)d.temperature;
    int v = blockIdx.x * blockDim.x + threadIdx.x;
    if (v < n) {
        float l = xr[v];
        unsigned long long w = mt__gpu_sample_weight(l, l_best, inv_t);
        work.weights[(size_t)row * n + v] = w;
        unsigned digit = mt__gpu_candidate_key(l) >> 21;
        atomicAdd(&count[digit], 1u);
        atomicAdd(&weight[digit], w);
    }
    __syncthreads();
    unsigned long long *h = work.hist + (size_t)row * 2 * MT__SAMPLE_BUCKETS;
    for (int b = threadIdx.x; b < MT__SAMPLE_BUCKETS; b += blockDim.x)
        if (count[b]) {
            atomicAdd(&h[2 * b], (unsigned long long)count[b]);
            atomicAdd(&h[2 * b + 1], weight[b]);
        }
}

// block-wide exclusive scan of two values a thread (thread t: a, b), in t's order: *a_before, the
// sum of every a and b of the threads before t (b's own: *a_before + a). blockDim.x = 1024.
__device__ static void mt__sample_scan_pairs(unsigned long long a, unsigned long long b, unsigned long long *before,
                                             unsigned long long *totals /* shared, 32 */) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    unsigned long long s = a + b;   // inclusive within the warp
    for (int off = 1; off < 32; off *= 2) {
        unsigned long long o = __shfl_up_sync(0xffffffffu, s, off);
        if (lane >= off) s += o;
    }
    if (lane == 31) totals[warp] = s;
    __syncthreads();
    if (warp == 0) {   // the warps' totals, exclusive
        unsigned long long t = totals[lane], i = t;
        for (int off = 1; off < 32; off *= 2) {
            unsigned long long o = __shfl_up_sync(0xffffffffu, i, off);
            if (lane >= off) i += o;
        }
        totals[lane] = i - t;
    }
    __syncthreads();
    *before = totals[warp] + s - (a + b);
    __syncthreads();   // totals may be reused
}

// each candidate's record into its level-1 bucket's run: runs in bucket order, a run's place the
// counts before it (every block scans the row's 2048 counts itself). Within a run the blocks take
// their places in whatever order they come (one global atomic per block and bucket: a counter per
// bucket hit by every candidate was 15 us at batch 1, the candidates of a flat row waiting on a few
// counters), and a block's candidates theirs from a shared-memory count. grid (ceil(n / 1024), rows).
__global__ void __launch_bounds__(MT__SAMPLE_THREADS)
mt_sample_scatter_kernel(mt__sample_work work, const float *x, int n, int ld, const mt_draw *draws) {
    __shared__ unsigned long long run_start[MT__SAMPLE_BUCKETS];
    __shared__ unsigned int mine[MT__SAMPLE_BUCKETS], base[MT__SAMPLE_BUCKETS];   // this block's, per bucket
    __shared__ unsigned long long totals[32];
    mt__pdl_start();   // the histogram: the weights kernel ahead
    int row = blockIdx.y;
    mt_draw d = draws[row];
    if (mt__sample_greedy(d, n)) return;
    const unsigned long long *h = work.hist + (size_t)row * 2 * MT__SAMPLE_BUCKETS;
    int t = threadIdx.x;
    unsigned long long c0 = h[2 * (2 * t)], c1 = h[2 * (2 * t + 1)], before;
    mine[2 * t] = mine[2 * t + 1] = 0;
    mt__sample_scan_pairs(c0, c1, &before, totals);   // (its barriers also cover mine's zeroing)
    run_start[2 * t] = before;
    run_start[2 * t + 1] = before + c0;
    int v = blockIdx.x * blockDim.x + t;
    unsigned int key = 0, b = 0, rank = 0;
    if (v < n) {
        key = mt__gpu_candidate_key(x[(size_t)row * ld + v]);
        b = key >> 21;
        rank = atomicAdd(&mine[b], 1u);   // my place among this block's candidates of bucket b
    }
    __syncthreads();
    unsigned int *fill = work.fill + (size_t)row * MT__SAMPLE_BUCKETS;
    for (int k = t; k < MT__SAMPLE_BUCKETS; k += blockDim.x)
        if (mine[k]) base[k] = atomicAdd(&fill[k], mine[k]);   // this block's places in run k
    __syncthreads();
    if (v >= n) return;
    mt__sample_record rec = {key, v, work.weights[(size_t)row * n + v]};
    work.records[(size_t)row * n + run_start[b] + base[b] + rank] = rec;
}

// the select's shared memory: one level's histogram, the block scan's warp totals, the answers
struct mt__sample_smem {
    unsigned int count[MT__SAMPLE_BUCKETS];
    unsigned long long weight[MT__SAMPLE_BUCKETS];
    unsigned long long totals[32];
    int slot[MT__SAMPLE_BUCKETS];               // level 3: a candidate of each bucket
    int digit;                                  // the bucket where the running sum passes X (-1: none)
    unsigned long long count_before, weight_before;   // the candidates of the buckets before it
    int found;                                  // the pass in id order's answer
};
// the bucket of s's histogram at which the running count (by_count) or weight first exceeds x:
// s.digit, and the sums of the buckets before it. Thread t holds buckets 2t and 2t+1.
__device__ static void mt__sample_crossing(mt__sample_smem &s, int by_count, unsigned long long x) {
    int t = threadIdx.x;
    unsigned long long c0 = s.count[2 * t], c1 = s.count[2 * t + 1], w0 = s.weight[2 * t], w1 = s.weight[2 * t + 1];
    unsigned long long cb, wb;
    if (t == 0) s.digit = -1;
    mt__sample_scan_pairs(c0, c1, &cb, s.totals);
    mt__sample_scan_pairs(w0, w1, &wb, s.totals);
    unsigned long long before = by_count ? cb : wb, m0 = by_count ? c0 : w0, m1 = by_count ? c1 : w1;
    if (before <= x && x - before < m0) {
        s.digit = 2 * t; s.count_before = cb; s.weight_before = wb;
    } else if (before + m0 <= x && x - before - m0 < m1) {
        s.digit = 2 * t + 1; s.count_before = cb + c0; s.weight_before = wb + w0;
    }
    __syncthreads();
}
struct mt__sample_pick { int id; unsigned long long weight_before, weight; };
// the first candidate of the row, in rank order, at which the running count (by_count) or weight
// exceeds x: its id (-1 if none: x >= the total) and the weight before it and its own. Every
// thread of the block calls it. level1: the row's histogram; records: the row's list.
__device__ static mt__sample_pick mt__sample_select(mt__sample_smem &s, const float *xr,
                                                    const unsigned long long *level1,
                                                    const mt__sample_record *records, int n, int by_count,
                                                    unsigned long long x) {
    unsigned int prefix = 0, mask = 0;
    unsigned long long weight_before = 0, group_count = 0, group_weight = 0, run = 0, run_count = 0;
    for (int level = 0; level < 3; level++) {
        int shift = level == 0 ? 21 : level == 1 ? 10 : 0;
        unsigned int digits = level < 2 ? 0x7FFu : 0x3FFu;
        __syncthreads();   // the level before is done with s
        if (level == 0) {   // the weights kernel's histogram
            for (int b = threadIdx.x; b < MT__SAMPLE_BUCKETS; b += blockDim.x) {
                s.count[b] = (unsigned int)level1[2 * b];
                s.weight[b] = level1[2 * b + 1];
            }
        } else {   // the next bits of level 1's bucket: its run of records, those that begin with prefix
            for (int b = threadIdx.x; b < MT__SAMPLE_BUCKETS; b += blockDim.x) { s.count[b] = 0; s.weight[b] = 0; }
            __syncthreads();
            for (unsigned long long i = threadIdx.x; i < run_count; i += blockDim.x) {
                mt__sample_record rec = records[run + i];
                if ((rec.key & mask) != prefix) continue;
                unsigned int digit = (rec.key >> shift) & digits;
                atomicAdd(&s.count[digit], 1u);
                atomicAdd(&s.weight[digit], rec.weight);
                if (level == 2) s.slot[digit] = rec.id;
            }
        }
        __syncthreads();
        mt__sample_crossing(s, by_count, x);
        if (s.digit < 0) return {-1, 0, 0};   // (block-uniform)
        if (level == 0) { run = s.count_before; run_count = s.count[s.digit]; }   // the bucket's run
        x -= by_count ? s.count_before : s.weight_before;
        weight_before += s.weight_before;
        prefix |= (unsigned int)s.digit << shift;
        mask |= digits << shift;
        group_count = s.count[s.digit];
        group_weight = s.weight[s.digit];
    }
    // the key is prefix: group_count equal logits of one weight; the answer is the j-th by id
    unsigned long long each = group_weight / group_count;
    unsigned long long j = by_count ? x : x / each;
    weight_before += j * each;
    if (group_count == 1) return {s.slot[s.digit], weight_before, each};   // the key's one candidate
    // equal logits: the j-th of them in id order, a pass over the row a tile of 1024 at a time
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    unsigned long long seen = 0;   // candidates with this key in the tiles before (block-uniform)
    __syncthreads();
    if (threadIdx.x == 0) s.found = -1;
    for (int base = 0; base < n; base += MT__SAMPLE_THREADS) {
        int v = base + threadIdx.x;
        int mine = v < n && mt__gpu_candidate_key(xr[v]) == prefix;
        unsigned int ballot = __ballot_sync(0xffffffffu, mine);
        if (lane == 0) s.totals[warp] = __popc(ballot);
        __syncthreads();
        unsigned long long ahead = 0, total = 0;
        for (int k = 0; k < MT__SAMPLE_THREADS / 32; k++) {
            if (k < warp) ahead += s.totals[k];
            total += s.totals[k];
        }
        if (mine && seen + ahead + __popc(ballot & ((1u << lane) - 1)) == j) s.found = v;
        seen += total;
        __syncthreads();
        if (seen > j) break;
    }
    return {s.found, weight_before, each};
}

// a block a row: top-k (by count), top-p, the draw (by weight), as mt_sample_row_cpu
__global__ void __launch_bounds__(MT__SAMPLE_THREADS)
mt_sample_select_kernel(int *out, mt__sample_work work, const float *x, int n, int ld, const mt_draw *draws) {
    __shared__ mt__sample_smem s;
    mt__pdl_start();   // the records: the scatter kernel ahead
    int row = blockIdx.x;
    mt_draw d = draws[row];
    if (mt__sample_greedy(d, n)) return;
    const float *xr = x + (size_t)row * ld;
    const unsigned long long *level1 = work.hist + (size_t)row * 2 * MT__SAMPLE_BUCKETS;
    const mt__sample_record *records = work.records + (size_t)row * n;
    unsigned long long sum;
    if (d.top_k > 0 && d.top_k < n) {   // top-k: ranks 0 .. k-1, their weight
        mt__sample_pick k = mt__sample_select(s, xr, level1, records, n, 1, (unsigned long long)d.top_k - 1);
        sum = k.weight_before + k.weight;
    } else {   // every candidate: the sum of level 1's buckets
        unsigned long long before, w0 = level1[2 * (2 * threadIdx.x) + 1], w1 = level1[2 * (2 * threadIdx.x + 1) + 1];
        mt__sample_scan_pairs(w0, w1, &before, s.totals);
        if (threadIdx.x == MT__SAMPLE_THREADS - 1) s.weight_before = before + w0 + w1;
        __syncthreads();
        sum = s.weight_before;
    }
    if (sum == 0) return;   // the best is NaN: the argmax stands, as on the CPU
    if (d.top_p > 0.0f && d.top_p < 1.0f) {   // top-p: ranks 0 .. the first whose running sum exceeds the limit
        mt__sample_pick p = mt__sample_select(s, xr, level1, records, n, 0,
                                              (unsigned long long)((double)d.top_p * (double)sum));
        sum = p.weight_before + p.weight;
    }
    mt__sample_pick t = mt__sample_select(s, xr, level1, records, n, 0, (unsigned long long)((double)d.u * (double)sum));
    if (threadIdx.x == 0 && t.id >= 0) out[row] = t.id;
}
void mt_sample_rows_gpu(int *out, const float *x, int rows, int n, int ld, const mt_draw *draws, void *work,
                        cudaStream_t stream) {
    if (rows == 0) return;
    mt__sample_work w;
    mt__sample_work_layout(&w, work, rows, n);
    MT_CUDA_CHECK(cudaMemsetAsync(work, 0, (char *)w.weights - (char *)work, stream));   // histograms, fill counts
    mt_argmax_rows_gpu(out, x, rows, n, ld, stream);
    dim3 grid(mt__blocks((size_t)n, MT__SAMPLE_THREADS), (unsigned)rows);
    mt__launch("mt_sample_weights_kernel", mt_sample_weights_kernel, grid, MT__SAMPLE_THREADS, 0, stream, w, x, n, ld,
               (const int *)out, draws);
    mt__launch("mt_sample_scatter_kernel", mt_sample_scatter_kernel, grid, MT__SAMPLE_THREADS, 0, stream, w, x, n, ld,
               draws);
    mt__launch("mt_sample_select_kernel", mt_sample_select_kernel, (unsigned)rows, MT__SAMPLE_THREADS, 0, stream, out,
               w, x, n, ld, draws);
}

// ---------------------------------------------------------------------------------------------
// decode steps queued ahead: the next step's inputs from this step's tokens (mt_decode_advance_cpu)
// ---------------------------------------------------------------------------------------------
// The last kernel of a queued decode step (megatron.h, section 11 says why): thread b moves
// sequence b on, s = *step:
//   tokens[b] = next[b]; start[b] = positions[b] = min(start[b] + 1, cap - 1)
//   draws[b] = plan[min(s + 1, plan_steps - 1) * rows + b]; ring[(s % ring_slots) * rows + b] = next[b]
// ring is host memory (pinned, at the same address here): the host reads it once the step is done.
// Every thread reads *step before thread 0 moves it on. *step is read before the wait for the kernel
// ahead: only this kernel writes it, in the step before (another graph launch, ended), so after the
// wait only next[], start[] and the plan are read, in one round trip, not *step and then the plan.
__global__ void mt_decode_advance_kernel(int *tokens, int *positions, int *start, mt_draw *draws, int *step, int *ring,
                                         const int *next, const mt_draw *plan, int plan_steps, int ring_slots, int rows,
                                         int cap) {
    int s = *step, k = min(s + 1, plan_steps - 1);
    mt__pdl_start();
    for (int b = threadIdx.x; b < rows; b += blockDim.x) {
        int p = min(start[b] + 1, cap - 1);
        tokens[b] = next[b];
        start[b] = p;
        positions[b] = p;
        draws[b] = plan[(size_t)k * rows + b];
        ring[(size_t)(s % ring_slots) * rows + b] = next[b];
    }
    __syncthreads();
    if (threadIdx.x == 0) *step = s + 1;
}
void mt_decode_advance_gpu(int *tokens, int *positions, int *start, mt_draw *draws, int *step, int *ring,
                           const int *next, const mt_draw *plan, int plan_steps, int ring_slots, int rows, int cap,
                           cudaStream_t stream) {
    mt__launch("mt_decode_advance_kernel", mt_decode_advance_kernel, 1, 32, 0, stream, tokens, positions, start, draws,
               step, ring, next, plan, plan_steps, ring_slots, rows, cap);
}

// ---------------------------------------------------------------------------------------------
// a decode step as one kernel (generation at TP = PP = 1: one new token for each of B sequences)
// ---------------------------------------------------------------------------------------------
// Op by op, a decode step of GPT-2 small is ~90 kernels of a few microseconds each (layernorms of
// one row, GEMVs, the attention over the cache, the argmax): the step is latency, not bytes (it
// reads ~250 MB of weights, 0.06 ms at HBM speed, and took ~0.45 ms). Here the whole step is one
// persistent kernel: every block stays resident (a cooperative launch guarantees it) and the
// blocks meet at a grid-wide barrier between the step's phases, five per layer:
//   1. x = embedding (layer 0) or res2 + out_c; ln = layernorm1(x); qkv = ln Wqkv^T + b
//   2. the attention over the cache (its K, V row of the new token stored first)
//   3. out_c = atty Wproj^T + b
//   4. res2 = x + out_c; ln = layernorm2(res2); fch = ln Wfc^T + b, fch_gelu = gelu(fch)
//   5. out_c = fch_gelu Wfcproj^T + b
// then the head: x = res2 + out_c, ln_f, logits = ln wte^T, and (greedy) the argmax.
// Every block normalises the B rows itself (warp b row b, into shared memory) right before the
// GEMV that reads them: a layernorm costs no barrier of its own. One block (block 0) writes x and
// res2 for the next phases.
// The phases run the op-by-op kernels' arithmetic on virtual block numbers: the GEMV kernel's own
// device function (mt__gemv_block), and copies of the attention's and the layernorm's made for
// threads that are not a whole block (mt__attention_cached_block: two attention blocks of 128
// threads side by side in each block of 256; mt__layernorm_row_vec): the same operations in the
// same order, so the same bits as the op-by-op step (tests/gpu/test_kernels checks it).
// Weights should not wait on the barrier: a block copies its rows of the next GEMV phase's weight
// into shared memory (cp.async) as the current phase starts, and multiplies from there after the
// barrier (mt__gemv_stage, mt__gemv_all_staged); while layer l runs, each block asks the L2 cache
// for its share of layer l+1's weights (cp.async.bulk.prefetch.L2, a hint: nothing to wait for).
// STATUS: opt-in (MT_DECODE_ONE_KERNEL=1), because it is not yet faster: GPT-2 small at batch 1,
// 0.61 ms a token against 0.44 for the op-by-op step as a graph of programmatic launches. Its
// barriers cost the ~1 us predicted; the work between them runs 3-5 times slower than the same
// work as separate kernels, for reasons not yet found (docs/perf.md has the phase-by-phase clock
// readings; held to 128 registers for two blocks an SM, it spills 96-440 bytes).
// The grid-wide barrier: every block adds 1 to a counter in global memory and waits until it
// reaches (barriers so far) x (blocks); the add is a release (the block's writes before it are
// seen by whoever sees the add), the waiting load an acquire (it sees everybody's).
struct mt__decode_args {
    int B, L, C, NH, F, V, Vp, cap;
    const int *tokens, *positions, *start;          // (B) device
    const float *wte, *wpe, *lnfw, *lnfb;           // fp32 parameters (the embedding's rows, ln_f)
    const float *ln1w, *ln1b, *qkvb, *attprojb;     // layer 0's; layer l's at l times a layer's size
    const float *ln2w, *ln2b, *fcb, *fcprojb;
    const void *qkvw, *attprojw, *fcw, *fcprojw;    // the 16-bit decoding weights, layer 0's
    const void *wte16;                              // (Vp, C) 16-bit: the head
    float *kcache, *vcache;                         // layer l's (B, cap, C) at l * cache_layer floats
    size_t cache_layer;
    float *x, *res2, *qkv, *atty, *out_c, *fch, *fch_gelu, *logits;
    int *next;                                      // (B) the argmax of each row of logits, or NULL
    unsigned *work;                                 // [0] barrier count, [1] argmax ticket (zeroed before
                                                    // the launch); from byte 16 the argmax partials
    size_t stage_elems;                             // weights per staging buffer (set by the launcher)
    long long *trace;                               // NULL, or (18 L + 3) clock readings of block 0: at each
                                                    // barrier arriving and leaving, the head's end, the
                                                    // start, then 8 points a layer (tests/gpu/test_kernels)
};
__device__ static inline void mt__grid_sync(unsigned *count, unsigned *target, long long *trace) {
    *target += gridDim.x;
    __syncthreads();
    int k = 2 * (*target / gridDim.x - 1);
    if (trace && blockIdx.x == 0 && threadIdx.x == 0) trace[k] = clock64();
    if (threadIdx.x == 0) {   // (release: the block's writes, ordered before by __syncthreads, go first)
        asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(count) : "memory");
        unsigned seen;
        for (;;) {   // (a pause between polls: hundreds of blocks polling one address flat out slow the
                     // L2 for the blocks still working)
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(count) : "memory");
            if (seen >= *target) break;
            __nanosleep(64);
        }
    }
    if (trace && blockIdx.x == 0 && threadIdx.x == 0) trace[k + 1] = clock64();
    __syncthreads();
}
// this block's share (1/gridDim) of `bytes` at p into L2 (p 16-byte aligned, bytes a multiple of 16)
__device__ static inline void mt__prefetch_l2_share(const void *p, size_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (threadIdx.x != 0) return;
    size_t share = (bytes / gridDim.x + 15) / 16 * 16, at = share * blockIdx.x;
    if (at >= bytes) return;
    size_t n = bytes - at < share ? bytes - at : share;
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"((const char *)p + at), "r"((unsigned)n) : "memory");
#endif
}
// Staging: a GEMV phase's weights are copied into shared memory one GEMV phase ahead (cp.async,
// 16 bytes a thread at a time, one commit group per phase), so that after the barrier a block
// finds its rows there instead of waiting a round trip to memory for each of its virtual blocks.
// A virtual block's rows are one contiguous piece of the weight (8 / split rows of C_in values);
// this block's pieces (virtual blocks blockIdx.x, + gridDim.x, ...) go one after another.
__host__ __device__ static inline size_t mt__gemv_piece(int OC, int C_in) { return (size_t)(8 / mt__gemv_split(OC)) * C_in; }
// n bytes (a multiple of 16, 16-byte aligned) from global src to shared dst, the block's threads
// 16 bytes each at a time; the caller commits the group (every thread, copies or not: the groups
// then count alike in every thread) and waits for it before reading dst
__device__ static void mt__stage_bytes(void *dst, const void *src, size_t n) {
    for (size_t i = threadIdx.x; i < n / 16; i += blockDim.x)
        mt__cp_async16((char *)dst + 16 * i, (const char *)src + 16 * i, 16);
}
// virtual block vb's rows of w (OC, C_in) to dst
template <typename WT>
__device__ static void mt__gemv_stage_piece(WT *dst, const WT *w, int vb, int OC, int C_in) {
    int R = 8 / mt__gemv_split(OC), rows = min(R, OC - vb * R);
    mt__stage_bytes(dst, w + (size_t)vb * mt__gemv_piece(OC, C_in), (size_t)rows * C_in * sizeof(WT));
}
// all of this block's pieces of w, one after another
template <typename WT>
__device__ static void mt__gemv_stage(WT *stage, const WT *w, int OC, int C_in) {
    int j = 0;
    for (int vb = blockIdx.x; vb < mt__gemv_blocks(OC); vb += gridDim.x, j++)
        mt__gemv_stage_piece(stage + j * mt__gemv_piece(OC, C_in), w, vb, OC, C_in);
}
// one virtual block of a GEMV from its staged rows
template <int ROUND, typename WT>
__device__ static void mt__gemv_block_staged(int vb, float (*partial)[MT_GEMV_MAX_ROWS], float *out, float *gelu_out,
                                             const float *inp, const WT *rows, const float *bias, int B, int C, int OC) {
    if (mt__gemv_split(OC) == 4) mt__gemv_block<4, ROUND, WT>(vb, partial, out, gelu_out, inp, rows, vb * 2, bias, B, C, OC, 1);
    else mt__gemv_block<1, ROUND, WT>(vb, partial, out, gelu_out, inp, rows, vb * 8, bias, B, C, OC, 1);
}
// all virtual blocks of a GEMV from the staged rows (after the stage's group has landed)
template <int ROUND, typename WT>
__device__ static void mt__gemv_all_staged(float (*partial)[MT_GEMV_MAX_ROWS], float *out, float *gelu_out,
                                           const float *inp, const WT *stage, const float *bias, int B, int C, int OC) {
    int j = 0;
    for (int vb = blockIdx.x; vb < mt__gemv_blocks(OC); vb += gridDim.x, j++) {
        mt__gemv_block_staged<ROUND, WT>(vb, partial, out, gelu_out, inp, stage + j * mt__gemv_piece(OC, C), bias, B, C, OC);
        __syncthreads();   // partial is read before the next virtual block writes it
    }
}
// the argmax's order: the larger value, on a tie the smaller index (mt_argmax_rows_kernel's)
// (a NaN is a candidate only at index 0, as for mt_argmax_rows_kernel)
__device__ static inline int mt__argmax_better(float v, int i, float bv, int bi, int none) {
    return i != none && (v == v || i == 0) && (bi == none || v > bv || (v == bv && i < bi));
}
// thread 0 of the block asks L2 for bytes at p (a multiple of 16, 16-byte aligned)
__device__ static inline void mt__prefetch_l2(const void *p, size_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (threadIdx.x == 0 && bytes > 0)
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"((unsigned)bytes) : "memory");
#endif
}
// a.trace (tests/gpu/test_kernels): block 0's clock at point m (of 8) of layer l, after the
// barriers' 10 L + 3 entries
__device__ static inline void mt__decode_mark(const mt__decode_args &a, int l, int m) {
    if (a.trace && blockIdx.x == 0 && threadIdx.x == 0) a.trace[10 * a.L + 3 + 8 * l + m] = clock64();
}
// the layernorm of a row (its mean and rstd not kept) and an attention block of the kernel below
__device__ static inline void mt__decode_layernorm_row(float *o, float *res, const float *a, const float *inp,
                                                             const float *w, const float *b, int C, int lane) {
    mt__layernorm_row_vec<8, float>(o, NULL, NULL, res, a, inp, w, b, C, lane);
}
template <int HS>
__device__ static inline void mt__decode_attention_block(int vb, int tid, int bar, float *smem, float *out,
                                                               float *kc, float *vc, const float *qkv, const int *start,
                                                               int C, int NH, int cap) {
    mt__attention_cached_block<HS, 1>(vb, tid, bar, smem, out, kc, vc, qkv, start, 1, C, NH, cap);
}
template <int HS, typename WT, int ROUND>
__global__ void __launch_bounds__(256, 2) mt_decode_step_kernel(mt__decode_args a) {
    // shared memory: two staging buffers of a.stage_elems weights (the GEMV phases alternate between
    // them; the head streams through both as a ring of 4 pieces); ln1's and ln2's weight and bias
    // (2 x 2C floats, staged with the weights); then the rows (B, C) and their layernorm (B, C), or
    // (phase 2) two attention blocks' scratch
    extern __shared__ __align__(16) unsigned char mt__decode_smem[];
    __shared__ float partial[8][MT_GEMV_MAX_ROWS];
    __shared__ float best_v[256];
    __shared__ int best_i[256];
    const int B = a.B, C = a.C, F = a.F, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    WT *stage0 = (WT *)mt__decode_smem, *stage1 = stage0 + a.stage_elems;
    float *lnp1 = (float *)(stage1 + a.stage_elems), *lnp2 = lnp1 + 2 * C;   // weight | bias
    float *smem = lnp2 + 2 * C, *rows = smem, *ln = smem + (size_t)B * C;
    unsigned target = 0;
    const size_t att_floats = mt__attention_cached_smem_floats(a.cap), Cb = (size_t)C * sizeof(float);
    const WT *qkvw = (const WT *)a.qkvw, *attprojw = (const WT *)a.attprojw, *fcw = (const WT *)a.fcw,
             *fcprojw = (const WT *)a.fcprojw;
    const size_t n_qkvw = (size_t)3 * C * C, n_attprojw = (size_t)C * C, n_fcw = (size_t)F * C;
    if (a.trace && blockIdx.x == 0 && threadIdx.x == 0) a.trace[2 * 5 * a.L + 2] = clock64();   // (the start)
    mt__prefetch_l2_share(attprojw, n_attprojw * sizeof(WT));   // layer 0's weights after its qkv toward L2
    mt__prefetch_l2_share(fcw, n_fcw * sizeof(WT));
    mt__prefetch_l2_share(fcprojw, n_fcw * sizeof(WT));
    mt__gemv_stage(stage0, qkvw, 3 * C, C);                      // and layer 0's qkv rows, ln1, into shared memory
    mt__stage_bytes(lnp1, a.ln1w, Cb);
    mt__stage_bytes(lnp1 + C, a.ln1b, Cb);
    mt__cp_async_commit();
    for (int l = 0; l < a.L; l++) {
        float *kc = a.kcache + l * a.cache_layer, *vc = a.vcache + l * a.cache_layer;
        // the next layer's weights (or the head's first rows) toward L2 while this layer runs, and
        // this layer's cache rows the attention will read
        if (l + 1 < a.L) {
            mt__prefetch_l2_share(qkvw + (l + 1) * n_qkvw, n_qkvw * sizeof(WT));
            mt__prefetch_l2_share(attprojw + (l + 1) * n_attprojw, n_attprojw * sizeof(WT));
            mt__prefetch_l2_share(fcw + (l + 1) * n_fcw, n_fcw * sizeof(WT));
            mt__prefetch_l2_share(fcprojw + (l + 1) * n_fcw, n_fcw * sizeof(WT));
        } else {
            size_t head = (size_t)a.Vp * C * sizeof(WT);
            mt__prefetch_l2_share(a.wte16, head < ((size_t)24 << 20) ? head : ((size_t)24 << 20));
        }
        for (int b = blockIdx.x; b < B; b += gridDim.x) {
            size_t at = (size_t)b * a.cap * C, n = (size_t)a.positions[b] * Cb;   // rows 0..p-1 (p: the new one)
            mt__prefetch_l2(kc + at, n);
            mt__prefetch_l2(vc + at, n);
        }
        mt__decode_mark(a, l, 0);
        // 1. x, ln1, qkv (its rows and ln1 staged in stage0, lnp1; the projection's toward stage1)
        mt__gemv_stage(stage1, attprojw + l * n_attprojw, C, C);
        mt__cp_async_commit();
        mt__cp_async_wait<1>();   // qkv's rows and ln1 have landed (the projection's may still fly)
        __syncthreads();
        mt__decode_mark(a, l, 1);
        if (warp < B) {
            size_t at = (size_t)warp * C;
            if (l == 0) {   // x = wte[token] + wpe[position] (mt_embedding_forward_kernel's sum), into rows
                const float *te = a.wte + (size_t)a.tokens[warp] * C, *pe = a.wpe + (size_t)a.positions[warp] * C;
                for (int c = lane; c < C; c += 32) {
                    float v = te[c] + pe[c];
                    rows[at + c] = v;
                    if (blockIdx.x == 0) a.x[at + c] = v;
                }
                __syncwarp();
                mt__decode_layernorm_row(ln + at, NULL, NULL, rows + at, lnp1, lnp1 + C, C, lane);
            } else {        // x = res2 + out_c (the layer before's residual add), normalised
                mt__decode_layernorm_row(ln + at, blockIdx.x == 0 ? a.x + at : NULL, a.res2 + at, a.out_c + at, lnp1,
                                         lnp1 + C, C, lane);
            }
        }
        __syncthreads();
        mt__decode_mark(a, l, 2);
        mt__gemv_all_staged<ROUND, WT>(partial, a.qkv, NULL, ln, stage0, a.qkvb + (size_t)l * 3 * C, B, C, 3 * C);
        mt__decode_mark(a, l, 3);
        mt__grid_sync(a.work, &target, a.trace);
        // 2. attention over the cache: virtual blocks (b, h), two per block
        {
            int half = threadIdx.x / 128;
            for (int vb = 2 * blockIdx.x + half; vb < B * a.NH; vb += 2 * gridDim.x)
                mt__decode_attention_block<HS>(vb, threadIdx.x % 128, 1 + half, smem + half * att_floats, a.atty, kc, vc,
                                               a.qkv, a.start, C, a.NH, a.cap);
        }
        mt__grid_sync(a.work, &target, a.trace);
        // 3. the attention's projection (stage1; fc's rows toward stage0, ln2 toward lnp2)
        mt__gemv_stage(stage0, fcw + l * n_fcw, F, C);
        mt__stage_bytes(lnp2, a.ln2w + (size_t)l * C, Cb);
        mt__stage_bytes(lnp2 + C, a.ln2b + (size_t)l * C, Cb);
        mt__cp_async_commit();
        mt__cp_async_wait<1>();
        __syncthreads();
        mt__decode_mark(a, l, 4);
        mt__gemv_all_staged<ROUND, WT>(partial, a.out_c, NULL, a.atty, stage1, a.attprojb + (size_t)l * C, B, C, C);
        mt__grid_sync(a.work, &target, a.trace);
        // 4. res2 = x + out_c, ln2, the MLP's fc and GELU (stage0, lnp2; fc proj's rows toward stage1)
        mt__gemv_stage(stage1, fcprojw + l * n_fcw, C, F);
        mt__cp_async_commit();
        mt__cp_async_wait<1>();
        __syncthreads();
        mt__decode_mark(a, l, 5);
        if (warp < B) {
            size_t at = (size_t)warp * C;
            mt__decode_layernorm_row(ln + at, blockIdx.x == 0 ? a.res2 + at : NULL, a.x + at, a.out_c + at, lnp2,
                                     lnp2 + C, C, lane);
        }
        __syncthreads();
        mt__decode_mark(a, l, 6);
        mt__gemv_all_staged<ROUND, WT>(partial, a.fch, a.fch_gelu, ln, stage0, a.fcb + (size_t)l * F, B, C, F);
        mt__grid_sync(a.work, &target, a.trace);
        // 5. the MLP's projection (stage1; the next layer's qkv rows and ln1, or ln_f, toward stage0, lnp1)
        if (l + 1 < a.L) {
            mt__gemv_stage(stage0, qkvw + (l + 1) * n_qkvw, 3 * C, C);
            mt__stage_bytes(lnp1, a.ln1w + (size_t)(l + 1) * C, Cb);
            mt__stage_bytes(lnp1 + C, a.ln1b + (size_t)(l + 1) * C, Cb);
        } else {
            mt__stage_bytes(lnp1, a.lnfw, Cb);
            mt__stage_bytes(lnp1 + C, a.lnfb, Cb);
        }
        mt__cp_async_commit();
        mt__cp_async_wait<1>();
        __syncthreads();
        mt__decode_mark(a, l, 7);
        mt__gemv_all_staged<ROUND, WT>(partial, a.out_c, NULL, a.fch_gelu, stage1, a.fcprojb + (size_t)l * C, B, F, C);
        mt__grid_sync(a.work, &target, a.trace);
    }
    // the head: x = res2 + out_c, ln_f (lnp1), the logits. wte's rows stream through the two staging
    // buffers as a ring of 4 pieces, 3 in flight while the block multiplies the 4th
    mt__cp_async_wait<0>();
    __syncthreads();
    const WT *wte16 = (const WT *)a.wte16;
    const size_t piece = mt__gemv_piece(a.Vp, C);
    const int G = gridDim.x, mine = (mt__gemv_blocks(a.Vp) - (int)blockIdx.x + G - 1) / G;
    for (int j = 0; j < 3; j++) {
        if (j < mine) mt__gemv_stage_piece(stage0 + j * piece, wte16, blockIdx.x + j * G, a.Vp, C);
        mt__cp_async_commit();
    }
    if (warp < B) {
        size_t at = (size_t)warp * C;
        mt__decode_layernorm_row(ln + at, blockIdx.x == 0 ? a.x + at : NULL, a.res2 + at, a.out_c + at, lnp1, lnp1 + C,
                                 C, lane);
    }
    for (int j = 0; j < mine; j++) {
        if (j + 3 < mine) mt__gemv_stage_piece(stage0 + ((j + 3) % 4) * piece, wte16, blockIdx.x + (j + 3) * G, a.Vp, C);
        mt__cp_async_commit();
        mt__cp_async_wait<3>();   // piece j has landed
        __syncthreads();          // (the first time: ln too)
        int vb = blockIdx.x + j * G;
        mt__gemv_block_staged<ROUND, WT>(vb, partial, a.logits, NULL, ln, stage0 + (j % 4) * piece, NULL, B, C, a.Vp);
        __syncthreads();          // slot j % 4 and partial are free again
    }
    mt__cp_async_wait<0>();
    if (a.trace && blockIdx.x == 0 && threadIdx.x == 0) a.trace[2 * (target / gridDim.x)] = clock64();
    if (!a.next) return;
    mt__grid_sync(a.work, &target, a.trace);
    // greedy: each block the argmax of its slice of every row, then the last block to finish
    // (a ticket) the argmax of the blocks' answers: exact comparisons, so any split gives the
    // answer mt_argmax_rows_kernel gives
    const int n = a.V, none = n;
    float *part_v = (float *)(a.work + 4);
    int *part_i = (int *)(part_v + (size_t)G * B);
    int slice = (n + G - 1) / G;
    for (int b = 0; b < B; b++) {
        const float *row = a.logits + (size_t)b * a.Vp;
        float bv = -INFINITY;
        int bi = none;
        for (int v = blockIdx.x * slice + threadIdx.x; v < min(n, (blockIdx.x + 1) * slice); v += 256)
            if (mt__argmax_better(row[v], v, bv, bi, none)) { bv = row[v]; bi = v; }
        best_v[threadIdx.x] = bv;
        best_i[threadIdx.x] = bi;
        __syncthreads();
        for (int s = 128; s > 0; s /= 2) {
            if (threadIdx.x < s && mt__argmax_better(best_v[threadIdx.x + s], best_i[threadIdx.x + s], best_v[threadIdx.x],
                                                     best_i[threadIdx.x], none)) {
                best_v[threadIdx.x] = best_v[threadIdx.x + s];
                best_i[threadIdx.x] = best_i[threadIdx.x + s];
            }
            __syncthreads();
        }
        if (threadIdx.x == 0) { part_v[(size_t)b * G + blockIdx.x] = best_v[0]; part_i[(size_t)b * G + blockIdx.x] = best_i[0]; }
        __syncthreads();
    }
    __shared__ int last;
    if (threadIdx.x == 0) {
        __threadfence();
        last = atomicAdd(a.work + 1, 1u) == (unsigned)G - 1;
        __threadfence();
    }
    __syncthreads();
    if (!last) return;
    for (int b = 0; b < B; b++) {
        float bv = -INFINITY;
        int bi = none;
        for (int k = threadIdx.x; k < G; k += 256) {
            float v = ((volatile float *)part_v)[(size_t)b * G + k];
            int i = ((volatile int *)part_i)[(size_t)b * G + k];
            if (mt__argmax_better(v, i, bv, bi, none)) { bv = v; bi = i; }
        }
        best_v[threadIdx.x] = bv;
        best_i[threadIdx.x] = bi;
        __syncthreads();
        for (int s = 128; s > 0; s /= 2) {
            if (threadIdx.x < s && mt__argmax_better(best_v[threadIdx.x + s], best_i[threadIdx.x + s], best_v[threadIdx.x],
                                                     best_i[threadIdx.x], none)) {
                best_v[threadIdx.x] = best_v[threadIdx.x + s];
                best_i[threadIdx.x] = best_i[threadIdx.x + s];
            }
            __syncthreads();
        }
        if (threadIdx.x == 0) a.next[b] = best_i[0] < n ? best_i[0] : 0;
        __syncthreads();
    }
}
// the work buffer's bytes for B sequences on this GPU (counters, then the argmax's partials)
static int mt__decode_blocks_per_sm(void) {
    const char *env = getenv("MT_DECODE_BLOCKS_PER_SM");   // tuning: blocks per SM (default 2, the most
    int k = env ? atoi(env) : 2;                          // that fit: __launch_bounds__(256, 2))
    return k < 1 ? 1 : k > 8 ? 8 : k;
}
size_t mt_decode_step_work_bytes(int B) {
    int dev = 0, sms = 0;
    MT_CUDA_CHECK(cudaGetDevice(&dev));
    MT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    return 16 + (size_t)8 * B * sms * mt__decode_blocks_per_sm();
}
// the staging buffers' size for a grid of G blocks: the most rows one block stages for one phase
static size_t mt__decode_stage_elems(const mt__decode_args *a, int G) {
    int OC[4] = {3 * a->C, a->C, a->F, a->C}, Cin[4] = {a->C, a->C, a->C, a->F};
    size_t most = 0;
    for (int k = 0; k < 4; k++) {
        size_t per_block = (size_t)((mt__gemv_blocks(OC[k]) + G - 1) / G) * mt__gemv_piece(OC[k], Cin[k]);
        if (per_block > most) most = per_block;
    }
    size_t head = 2 * mt__gemv_piece(a->Vp, a->C);   // the head's ring: 4 pieces in the two buffers
    if (head > most) most = head;
    return (most + 7) / 8 * 8;   // (16-byte multiples: the second buffer starts aligned)
}
template <int HS, typename WT, int ROUND>
static int mt__decode_step_launch(const mt__decode_args *a_in, size_t work_bytes, cudaStream_t stream) {
    mt__decode_args args = *a_in, *a = &args;
    size_t rows = (size_t)2 * a->B * a->C * sizeof(float), att = 2 * mt__attention_cached_smem_floats(a->cap) * sizeof(float);
    const void *kernel = (const void *)mt_decode_step_kernel<HS, WT, ROUND>;
    int dev = 0, sms = 0, per_sm = 0;
    MT_CUDA_CHECK(cudaGetDevice(&dev));
    MT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    size_t smem = 0;
    // the most blocks per SM (up to MT_DECODE_BLOCKS_PER_SM) whose shared memory fits
    for (int want = mt__decode_blocks_per_sm(); want >= 1 && per_sm < want; want--) {
        a->stage_elems = mt__decode_stage_elems(a, sms * want);
        smem = 2 * a->stage_elems * sizeof(WT) + 4 * (size_t)a->C * sizeof(float) + (rows > att ? rows : att);
        if (smem > 220 * 1024) { per_sm = 0; continue; }
        MT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        MT_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, 256, smem));
        if (per_sm >= want) per_sm = want;
        else per_sm = 0;
    }
    if (per_sm < 1) return 0;
    unsigned grid = (unsigned)(sms * per_sm);
    if (16 + (size_t)8 * a->B * grid > work_bytes) mt_fatal("internal: the decode step's work buffer is too small");
    MT_CUDA_CHECK(cudaMemsetAsync(a->work, 0, 16, stream));
    cudaLaunchConfig_t config = {};
    config.gridDim = grid;
    config.blockDim = 256;
    config.dynamicSmemBytes = smem;
    config.stream = stream;
    cudaLaunchAttribute attribute[1];
    attribute[0].id = cudaLaunchAttributeCooperative;   // every block resident at once, or an error
    attribute[0].val.cooperative = 1;
    config.attrs = attribute;
    config.numAttrs = 1;
    cudaError_t err = cudaLaunchKernelEx(&config, mt_decode_step_kernel<HS, WT, ROUND>, args);
    if (err != cudaSuccess)
        mt_fatal("launching mt_decode_step_kernel (%u blocks) failed: %s (%s)\nhint: without MT_DECODE_ONE_KERNEL=1 "
                 "the decode step runs op by op", grid, cudaGetErrorName(err), cudaGetErrorString(err));
    mt__launch_check("mt_decode_step_kernel", stream);
    return 1;
}
// runs the step if its shape is one the kernel takes, and returns 1; else returns 0 (the caller
// runs the ops): B <= MT_GEMV_MAX_ROWS, C a multiple of 8 up to 1024 (the layernorm's row in
// registers), F a multiple of 8, head size 64 (every GPT-2 size's; one instantiation per 16-bit
// type keeps the build time: each is a large kernel, compiled in every file that includes this
// one), 16-bit weights (dtype MT_DTYPE_BF16 or
// MT_DTYPE_FP16), 16-byte aligned buffers. work: mt_decode_step_work_bytes(B) bytes of device memory.
int mt_decode_step_gpu(const mt__decode_args *a, int dtype, size_t work_bytes, cudaStream_t stream) {
    int hs = a->NH > 0 ? a->C / a->NH : 0;
    if (a->B < 1 || a->B > MT_GEMV_MAX_ROWS || a->C % 8 != 0 || a->C > 1024 || a->F % 8 != 0 || hs * a->NH != a->C ||
        hs != 64)
        return 0;
    const void *aligned[] = {a->x, a->res2, a->qkv, a->atty, a->out_c, a->fch, a->fch_gelu, a->logits, a->kcache,
                             a->vcache, a->qkvw, a->attprojw, a->fcw, a->fcprojw, a->wte16, a->wte, a->wpe, a->ln1w,
                             a->ln2w, a->lnfw, a->ln1b, a->ln2b, a->lnfb};
    for (const void *p : aligned)
        if (!mt__aligned16(p)) return 0;
    if (a->cache_layer % 4 != 0 || (size_t)a->Vp * a->C % 8 != 0) return 0;
    if (dtype == MT_DTYPE_BF16 && hs == 64) return mt__decode_step_launch<64, __nv_bfloat16, MT_DTYPE_BF16>(a, work_bytes, stream);
    if (dtype == MT_DTYPE_FP16 && hs == 64) return mt__decode_step_launch<64, __half, MT_DTYPE_FP16>(a, work_bytes, stream);
    return 0;
}

// ---------------------------------------------------------------------------------------------
// cross-entropy over a vocabulary split across TP ranks: the three local steps, between which
// mt_vocab_parallel_cross_entropy_* (megatron.h, 4.) all-reduces. logits (BT, V_local) hold this
// rank's columns [vocab_start, vocab_start + V_local); only the first
// n = mt__real_columns(vocab_start, V_local, V) of them are real (the rest is padding).
// One block of 256 threads per row; the block reductions have a fixed order (deterministic).
// The logits come as the LM head stored them (megatron.h's mt_logits_storage_dtype): fp32, or bf16 /
// fp16 on the wgmma rung (T = __nv_bfloat16 / __half: 1.6 GB at GPT-2 small's batch instead of
// 3.3), and each kernel reads them once. When rows start on 16-byte boundaries threads read 16
// bytes at a time (4 fp32 or 8 16-bit logits) over the first whole pieces of the n columns, and
// single values over the rest (vec = 1).
// 16 bytes of logits as floats: 4 fp32 values (one float4), or 8 bf16 / fp16 ones (mt__load8)
__device__ static inline void mt__logits16B(const float *p, float e[4]) {
    float4 x = *(const float4 *)p;
    e[0] = x.x; e[1] = x.y; e[2] = x.z; e[3] = x.w;
}
__device__ static inline void mt__logits16B(const __nv_bfloat16 *p, float e[8]) { mt__load8(e, p); }
__device__ static inline void mt__logits16B(const __half *p, float e[8]) { mt__load8(e, p); }
// matches mt_cross_entropy_local_max_cpu (megatron.h, 3. OPS). Writes maxv with '='.
template <typename T>
__global__ void mt_cross_entropy_local_max_kernel(float *maxv, const T *logits, int V_local, int n, int vec) {
    const int N = 16 / sizeof(T);
    const T *l = logits + (size_t)blockIdx.x * V_local;
    float m = -INFINITY;
    int v0 = vec ? n / N * N : 0;
    for (int v = N * threadIdx.x; v < v0; v += N * blockDim.x) {
        float e[N];
        mt__logits16B(l + v, e);
        #pragma unroll
        for (int k = 0; k < N; k++) m = fmaxf(m, e[k]);
    }
    for (int v = v0 + threadIdx.x; v < n; v += blockDim.x) m = fmaxf(m, mt__to_float(l[v]));
    m = mt__block_max(m);
    if (threadIdx.x == 0) maxv[blockIdx.x] = m;
}
// matches mt_cross_entropy_local_sums_cpu (megatron.h, 3. OPS). Writes sumexp, target_logit with '='.
// sumexp[i] = sum_v exp(l[i,v] - maxv[i]) over the real columns; target_logit[i] = l[i, y_i] if
// the target is one of my real columns, else 0.
template <typename T>
__global__ void mt_cross_entropy_local_sums_kernel(float *sumexp, float *target_logit, const T *logits,
                                                   const float *maxv, const int *targets, int V_local,
                                                   int vocab_start, int n, int vec) {
    const int N = 16 / sizeof(T);
    int i = blockIdx.x;
    const T *l = logits + (size_t)i * V_local;
    float m = maxv[i], s = 0.0f;
    int v0 = vec ? n / N * N : 0;
    for (int v = N * threadIdx.x; v < v0; v += N * blockDim.x) {
        float e[N], piece = 0.0f;   // the piece's terms summed first, then added (as 4 floats always were)
        mt__logits16B(l + v, e);
        #pragma unroll
        for (int k = 0; k < N; k++) piece += expf(e[k] - m);
        s += piece;
    }
    for (int v = v0 + threadIdx.x; v < n; v += blockDim.x) s += expf(mt__to_float(l[v]) - m);
    s = mt__block_sum(s);
    if (threadIdx.x == 0) {
        sumexp[i] = s;
        int local = targets[i] - vocab_start;
        target_logit[i] = (local >= 0 && local < n) ? mt__to_float(l[local]) : 0.0f;
    }
}
// the two kernels above in one pass over the logits (a rank with the whole vocabulary, TP = 1:
// nothing to all-reduce between them), an online softmax (Milakov and Gimelshein, 2018): each
// thread keeps its running max m and the sum s of exp(x - m) so far, and when a 16-byte piece
// brings a larger max mx, s becomes s exp(m - mx) before the new terms join; then the block's max M
// and the sum of every thread's s exp(m - M). The same max; the sum differs from the CPU's in
// rounding only (its terms are computed against another max first), which the loss and gradient
// tolerances of tests/gpu/test_kernels (1e-5 against the sum in double) hold it to.
// matches mt_cross_entropy_local_max_cpu, then mt_cross_entropy_local_sums_cpu (megatron.h, 3. OPS).
// Writes maxv, sumexp, target_logit with '='.
// (the row's part, a device function: the fused kernel below runs the same arithmetic)
template <typename T>
__device__ static inline void mt__ce_row_max_sums(const T *l, int n, int vec, float *M_out, float *S_out) {
    const int N = 16 / sizeof(T);
    float m = -INFINITY, s = 0.0f;
    int v0 = vec ? n / N * N : 0;
    for (int v = N * threadIdx.x; v < v0; v += N * blockDim.x) {
        float e[N], mx = -INFINITY, piece = 0.0f;
        mt__logits16B(l + v, e);
        #pragma unroll
        for (int k = 0; k < N; k++) mx = fmaxf(mx, e[k]);
        if (mx > m) {   // (the first time s is 0: 0 x exp(-inf) = 0)
            s *= expf(m - mx);
            m = mx;
        }
        #pragma unroll
        for (int k = 0; k < N; k++) piece += expf(e[k] - m);
        s += piece;
    }
    for (int v = v0 + threadIdx.x; v < n; v += blockDim.x) {
        float x = mt__to_float(l[v]);
        if (x > m) {
            s *= expf(m - x);
            m = x;
        }
        s += expf(x - m);
    }
    float M = mt__block_max(m);
    *S_out = mt__block_sum(m == -INFINITY ? 0.0f : s * expf(m - M));   // a thread with no columns adds 0
    *M_out = M;
}
template <typename T>
__global__ void __launch_bounds__(256) mt_cross_entropy_local_max_sums_kernel(float *maxv, float *sumexp,
                                                                              float *target_logit, const T *logits,
                                                                              const int *targets, int V_local,
                                                                              int vocab_start, int n, int vec) {
    int i = blockIdx.x;
    const T *l = logits + (size_t)i * V_local;
    float M, S;
    mt__ce_row_max_sums<T>(l, n, vec, &M, &S);
    if (threadIdx.x == 0) {
        maxv[i] = M;
        sumexp[i] = S;
        int local = targets[i] - vocab_start;
        target_logit[i] = (local >= 0 && local < n) ? mt__to_float(l[local]) : 0.0f;
    }
}
// the launchers: logits_dtype (an mt_dtype) says which T the kernels read
template <typename T>
static int mt__logits_vec(const void *logits, int V_local) {
    return V_local % (16 / (int)sizeof(T)) == 0 && mt__aligned16(logits);
}
template <typename T>
static void mt__ce_local_max(float *maxv, const void *logits, int BT, int V_local, int n, cudaStream_t stream) {
    mt_cross_entropy_local_max_kernel<T><<<BT, 256, 0, stream>>>(maxv, (const T *)logits, V_local, n,
                                                                mt__logits_vec<T>(logits, V_local));
    mt__launch_check("mt_cross_entropy_local_max_kernel", stream);
}
void mt_cross_entropy_local_max_gpu(float *maxv, const void *logits, int logits_dtype, int BT, int V_local,
                                    int vocab_start, int V, cudaStream_t stream) {
    if (BT == 0) return;
    int n = mt__real_columns(vocab_start, V_local, V);
    if (logits_dtype == MT_DTYPE_BF16) mt__ce_local_max<__nv_bfloat16>(maxv, logits, BT, V_local, n, stream);
    else if (logits_dtype == MT_DTYPE_FP16) mt__ce_local_max<__half>(maxv, logits, BT, V_local, n, stream);
    else mt__ce_local_max<float>(maxv, logits, BT, V_local, n, stream);
}
template <typename T>
static void mt__ce_local_sums(float *sumexp, float *target_logit, const void *logits, const float *maxv,
                              const int *targets, int BT, int V_local, int vocab_start, int n, cudaStream_t stream) {
    mt_cross_entropy_local_sums_kernel<T><<<BT, 256, 0, stream>>>(sumexp, target_logit, (const T *)logits, maxv, targets,
                                                                 V_local, vocab_start, n,
                                                                 mt__logits_vec<T>(logits, V_local));
    mt__launch_check("mt_cross_entropy_local_sums_kernel", stream);
}
void mt_cross_entropy_local_sums_gpu(float *sumexp, float *target_logit, const void *logits, int logits_dtype,
                                     const float *maxv, const int *targets, int BT, int V_local, int vocab_start,
                                     int V, cudaStream_t stream) {
    if (BT == 0) return;
    int n = mt__real_columns(vocab_start, V_local, V);
    if (logits_dtype == MT_DTYPE_BF16)
        mt__ce_local_sums<__nv_bfloat16>(sumexp, target_logit, logits, maxv, targets, BT, V_local, vocab_start, n, stream);
    else if (logits_dtype == MT_DTYPE_FP16)
        mt__ce_local_sums<__half>(sumexp, target_logit, logits, maxv, targets, BT, V_local, vocab_start, n, stream);
    else mt__ce_local_sums<float>(sumexp, target_logit, logits, maxv, targets, BT, V_local, vocab_start, n, stream);
}
template <typename T>
static void mt__ce_local_max_sums(float *maxv, float *sumexp, float *target_logit, const void *logits,
                                  const int *targets, int BT, int V_local, int vocab_start, int n, cudaStream_t stream) {
    mt_cross_entropy_local_max_sums_kernel<T><<<BT, 256, 0, stream>>>(maxv, sumexp, target_logit, (const T *)logits,
                                                                     targets, V_local, vocab_start, n,
                                                                     mt__logits_vec<T>(logits, V_local));
    mt__launch_check("mt_cross_entropy_local_max_sums_kernel", stream);
}
void mt_cross_entropy_local_max_sums_gpu(float *maxv, float *sumexp, float *target_logit, const void *logits,
                                         int logits_dtype, const int *targets, int BT, int V_local, int vocab_start,
                                         int V, cudaStream_t stream) {
    if (BT == 0) return;
    int n = mt__real_columns(vocab_start, V_local, V);
    if (logits_dtype == MT_DTYPE_BF16)
        mt__ce_local_max_sums<__nv_bfloat16>(maxv, sumexp, target_logit, logits, targets, BT, V_local, vocab_start, n,
                                             stream);
    else if (logits_dtype == MT_DTYPE_FP16)
        mt__ce_local_max_sums<__half>(maxv, sumexp, target_logit, logits, targets, BT, V_local, vocab_start, n, stream);
    else mt__ce_local_max_sums<float>(maxv, sumexp, target_logit, logits, targets, BT, V_local, vocab_start, n, stream);
}
// matches mt_cross_entropy_finish_cpu (megatron.h, 3. OPS). Writes losses (and dlogits) with '='.
// losses[i] = log S + m - l_y; if dlogits != NULL, in place of the fp32 logits:
// dlogits[i,v] = (softmax[i,v] - [v == y_i]) * dloss, 0 on padded columns.
__global__ void mt_cross_entropy_finish_kernel(float *losses, float *dlogits, const float *maxv, const float *sumexp,
                                               const float *target_logit, const int *targets, int V_local,
                                               int vocab_start, int n, float dloss, int vec4) {
    int i = blockIdx.x;
    if (threadIdx.x == 0) losses[i] = logf(sumexp[i]) + maxv[i] - target_logit[i];
    if (!dlogits) return;
    float *l = dlogits + (size_t)i * V_local;
    float m = maxv[i], inv = 1.0f / sumexp[i];
    int local = targets[i] - vocab_start;
    int v0 = vec4 ? V_local : 0;   // V_local % 4 == 0: the whole row in float4s
    for (int v = 4 * threadIdx.x; v < v0; v += 4 * blockDim.x) {
        float4 x = *(float4 *)(l + v);
        float e[4] = {x.x, x.y, x.z, x.w};
        for (int k = 0; k < 4; k++) {
            float p = v + k < n ? expf(e[k] - m) * inv : 0.0f;
            e[k] = (p - (v + k == local ? 1.0f : 0.0f)) * dloss;
        }
        *(float4 *)(l + v) = make_float4(e[0], e[1], e[2], e[3]);
    }
    for (int v = v0 + threadIdx.x; v < V_local; v += blockDim.x) {
        float p = v < n ? expf(l[v] - m) * inv : 0.0f;
        l[v] = (p - (v == local ? 1.0f : 0.0f)) * dloss;
    }
}
// The same over 16-bit logits (bf16, or fp16 with F16 = 1, as the LM head stored them), the gradient
// written in their place in the same type: the rounding the LM head's backward GEMMs would apply to
// it anyway, which read it as it is (mt_lm_head_backward). Each thread reads 8 logits (16 bytes)
// and writes their 8 gradients over them: nothing else reads those bytes. V_local % 8 == 0 and
// 16-byte aligned rows (the wgmma rung's condition, megatron.h's mt_logits_grad_dtype).
// (the row's part, a device function: the fused kernel below runs the same arithmetic)
template <int F16>
__device__ static inline void mt__ce_row_grad16(unsigned short *l, int V_local, int n, int local, float m, float inv,
                                                float dloss) {
    for (int v = 8 * threadIdx.x; v < V_local; v += 8 * blockDim.x) {
        float e[8];
        if (F16) mt__logits16B((const __half *)(l + v), e);
        else mt__logits16B((const __nv_bfloat16 *)(l + v), e);
        uint32_t packed[4];
        #pragma unroll
        for (int k = 0; k < 8; k += 2) {   // as mt_cross_entropy_finish_kernel, then rounded
            float p0 = v + k < n ? expf(e[k] - m) * inv : 0.0f, p1 = v + k + 1 < n ? expf(e[k + 1] - m) * inv : 0.0f;
            float d0 = (p0 - (v + k == local ? 1.0f : 0.0f)) * dloss;
            float d1 = (p1 - (v + k + 1 == local ? 1.0f : 0.0f)) * dloss;
            packed[k / 2] = mt__pack16x2<F16>(d0, d1);
        }
        *(uint4 *)(l + v) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
    }
}
template <int F16>
__global__ void __launch_bounds__(256) mt_cross_entropy_finish16_kernel(float *losses, void *dlogits, const float *maxv,
                                                                        const float *sumexp, const float *target_logit,
                                                                        const int *targets, int V_local, int vocab_start,
                                                                        int n, float dloss) {
    int i = blockIdx.x;
    if (threadIdx.x == 0) losses[i] = logf(sumexp[i]) + maxv[i] - target_logit[i];
    unsigned short *l = (unsigned short *)dlogits + (size_t)i * V_local;   // bf16 (F16 = 0) or fp16 bits
    mt__ce_row_grad16<F16>(l, V_local, n, targets[i] - vocab_start, maxv[i], 1.0f / sumexp[i], dloss);
}
// The two kernels above in one, for a rank with the whole vocabulary (TP = 1) that wants the
// gradient: a block reads its row once for the max and the sum, then again for the gradient,
// which it writes in place; one launch and one pass of the row through the block's reductions
// fewer. Bit for bit what the two kernels give (the same device functions, the same 256 threads).
// Measured on an H200 (docs/perf.md): 1.30 -> 1.24 ms for GPT-2 small's 16k x 50k bf16 logits. The
// second read was meant to come from L2, but eight blocks an SM keep 1,056 rows (105 MB) in flight,
// twice the L2, and Nsight Compute still counted three passes; with 1024-thread blocks (264 rows,
// 26 MB) it counted two, but the kernel took 1.33 ms: two rows an SM, each waiting on its own
// reductions, hide memory latency worse than eight.
template <typename T, int F16>
__global__ void __launch_bounds__(256) mt_cross_entropy_fused16_kernel(float *losses, float *maxv, float *sumexp,
                                                                       float *target_logit, void *logits,
                                                                       const int *targets, int V_local,
                                                                       int vocab_start, int n, float dloss) {
    mt__pdl_start();   // (launched with programmatic dependent launch inside a training graph)
    int i = blockIdx.x;
    unsigned short *l = (unsigned short *)logits + (size_t)i * V_local;
    int local = targets[i] - vocab_start;
    // the target's logit, read before any thread of the block overwrites the row (the reductions
    // below are barriers; the writes come after them)
    float lt = 0.0f;
    if (threadIdx.x == 0 && local >= 0 && local < n) lt = mt__to_float(((const T *)l)[local]);
    float M, S;
    mt__ce_row_max_sums<T>((const T *)l, n, 1, &M, &S);
    if (threadIdx.x == 0) {
        maxv[i] = M;
        sumexp[i] = S;
        target_logit[i] = lt;
        losses[i] = logf(S) + M - lt;
    }
    mt__ce_row_grad16<F16>(l, V_local, n, local, M, 1.0f / S, dloss);
}
// THE ROW STAGED IN SHARED MEMORY. The kernel above reads each row twice, and the second read
// comes from memory, not L2 (3 passes over 1.65 GB, 1.24 ms at GPT-2 small's batch). Here a block
// stays on its SM (one block an SM, 512 threads) and walks rows r, r + grid, r + 2 grid, ...; each
// row is copied once from memory into shared memory (cp.async: 16 bytes a thread per copy, no
// registers held while the bytes fly), and the next row's copy is already in flight while the
// threads work on this one: two buffers of V_local 16-bit values (GPT-2's 50,304: 2 x 98 KB). Then
//   M = max_v l[v],  S = sum_v exp(l[v] - M),  loss = log S + M - l[y],
//   dl[v] = (exp(l[v] - M) / S - [v == y]) dloss, rounded to 16 bits, written over the row,
// the max, the sum and the gradient each a pass over shared memory: the row crosses HBM once in,
// once out (1.65 GB each way). The exponentials are the hardware's, 2^((l - M) log2 e) with
// ex2.approx (as the GELU's): at ~100,000 exponentials a row the exact expf's ~8 instructions an
// element would take about as long as the row's bytes; the difference is a few ulps of each term,
// within the tests' 1e-5 on the sum (against the sum in double) and the 16-bit rounding of the
// gradient. The padded columns (v >= n) enter as -inf: no part in M or S, a gradient of 0.
// The rows of V_local 16-bit values, V_local % 8 == 0, 16-byte aligned (the fused kernel's
// conditions); 2 V_local 16-bit values of shared memory must fit on the SM (else the kernel above).
#define MT__CE_STAGED_THREADS 512
template <typename T, int F16>
__global__ void __launch_bounds__(MT__CE_STAGED_THREADS, 1)
    mt_cross_entropy_staged16_kernel(float *losses, float *maxv, float *sumexp, float *target_logit, void *logits,
                                     const int *targets, int BT, int V_local, int vocab_start, int n, float dloss) {
    mt__pdl_start();   // (launched with programmatic dependent launch inside a training graph)
    extern __shared__ uint4 mt__ce_rows[];   // [2][V_local / 8] pieces of 8 values
    const int pieces = V_local / 8;
    const float log2e = 1.4426950408889634f;
    uint4 *rows = (uint4 *)logits;            // row i's pieces start at rows + i * pieces
    // start copying row i into buffer b (every thread its pieces), as one cp.async group
    auto fetch = [&](int i, int b) {
        if (i < BT)
            for (int p = threadIdx.x; p < pieces; p += blockDim.x)
                mt__cp_async16(mt__ce_rows + (size_t)b * pieces + p, rows + (size_t)i * pieces + p, 16);
        mt__cp_async_commit();   // (an empty group past the last row: the wait below counts groups)
    };
    // piece p of a staged row as 8 floats, the padded columns as -inf
    auto piece8 = [&](const uint4 *row, int p, float e[8]) {
        if (F16) mt__logits16B((const __half *)(row + p), e);
        else mt__logits16B((const __nv_bfloat16 *)(row + p), e);
        if (8 * p + 8 > n) {
            #pragma unroll
            for (int k = 0; k < 8; k++)
                if (8 * p + k >= n) e[k] = -INFINITY;
        }
    };
    int b = 0;
    fetch(blockIdx.x, 0);
    for (int i = blockIdx.x; i < BT; i += gridDim.x, b ^= 1) {
        fetch(i + gridDim.x, b ^ 1);   // the next row flies while this one is worked on
        mt__cp_async_wait<1>();        // this thread's copies of row i have landed ...
        __syncthreads();               // ... and every other thread's
        const uint4 *row = mt__ce_rows + (size_t)b * pieces;
        float m = -INFINITY;
        for (int p = threadIdx.x; p < pieces; p += blockDim.x) {
            float e[8];
            piece8(row, p, e);
            #pragma unroll
            for (int k = 0; k < 8; k++) m = fmaxf(m, e[k]);
        }
        const float M = mt__block_max(m), ML = M * log2e;
        float s = 0.0f;
        for (int p = threadIdx.x; p < pieces; p += blockDim.x) {
            float e[8], piece = 0.0f;
            piece8(row, p, e);
            #pragma unroll
            for (int k = 0; k < 8; k++) piece += mt__ex2_ftz(fmaf(e[k], log2e, -ML));
            s += piece;
        }
        const float S = mt__block_sum(s), inv = 1.0f / S;
        const int local = targets[i] - vocab_start;
        const float lt = local >= 0 && local < n ? mt__to_float(((const T *)row)[local]) : 0.0f;
        if (threadIdx.x == 0) {
            maxv[i] = M;
            sumexp[i] = S;
            target_logit[i] = lt;
            losses[i] = logf(S) + M - lt;
        }
        uint4 *out = rows + (size_t)i * pieces;
        for (int p = threadIdx.x; p < pieces; p += blockDim.x) {
            float e[8];
            piece8(row, p, e);
            uint32_t packed[4];
            #pragma unroll
            for (int k = 0; k < 8; k += 2) {
                float p0 = mt__ex2_ftz(fmaf(e[k], log2e, -ML)) * inv, p1 = mt__ex2_ftz(fmaf(e[k + 1], log2e, -ML)) * inv;
                float d0 = (p0 - (8 * p + k == local ? 1.0f : 0.0f)) * dloss;
                float d1 = (p1 - (8 * p + k + 1 == local ? 1.0f : 0.0f)) * dloss;
                packed[k / 2] = mt__pack16x2<F16>(d0, d1);
            }
            out[p] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
        }
        __syncthreads();   // every thread is done with buffer b before the next fetch refills it
    }
    mt__cp_async_wait<0>();   // (no copy outlives the block)
}
// tests: 1 = always the unstaged fused kernel above (both are checked against the CPU)
static int mt__ce_unstaged = 0;
// the staged kernel's grid on this GPU for rows of V_local 16-bit values: one block an SM, or 0
// where the two buffers do not fit (the caller then takes the unstaged kernel)
template <typename T, int F16>
static int mt__ce_staged_grid(int V_local) {
    static MT_THREAD_LOCAL int known_V = -1, known_grid = 0;   // the answer for the last V_local asked
    if (V_local == known_V) return known_grid;
    size_t smem = (size_t)2 * V_local * sizeof(T);
    int dev = 0, sms = 0, optin = 0, per_sm = 0;
    MT_CUDA_CHECK(cudaGetDevice(&dev));
    MT_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    known_V = V_local;
    known_grid = 0;
    if (smem > (size_t)optin - 1024) return 0;   // (the block reductions' own 128 bytes, with room)
    const void *kernel = (const void *)mt_cross_entropy_staged16_kernel<T, F16>;
    mt__allow_smem(kernel, smem);
    MT_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, MT__CE_STAGED_THREADS, smem));
    if (per_sm < 1) return 0;
    MT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    known_grid = sms;
    return sms;
}
template <typename T, int F16>
static void mt__ce_fused16(float *losses, float *maxv, float *sumexp, float *target_logit, void *logits,
                           const int *targets, int BT, int V_local, int vocab_start, int n, float dloss,
                           cudaStream_t stream) {
    int grid = mt__ce_unstaged ? 0 : mt__ce_staged_grid<T, F16>(V_local);
    if (grid > 0) {
        if (grid > BT) grid = BT;
        mt__launch("mt_cross_entropy_staged16_kernel", (mt_cross_entropy_staged16_kernel<T, F16>), grid,
                   MT__CE_STAGED_THREADS, (size_t)2 * V_local * sizeof(T), stream, losses, maxv, sumexp, target_logit,
                   logits, targets, BT, V_local, vocab_start, n, dloss);
        return;
    }
    mt__launch("mt_cross_entropy_fused16_kernel", (mt_cross_entropy_fused16_kernel<T, F16>), BT, 256, 0, stream, losses,
               maxv, sumexp, target_logit, logits, targets, V_local, vocab_start, n, dloss);
}
// losses and, in place of the 16-bit logits (logits_dtype BF16 or FP16, V_local % 8 == 0, 16-byte
// aligned rows), their gradient; with maxv, sumexp, target_logit as the max-sums kernel writes them
void mt_cross_entropy_fused16_gpu(float *losses, float *maxv, float *sumexp, float *target_logit, void *logits,
                                  int logits_dtype, const int *targets, int BT, int V_local, int vocab_start, int V,
                                  float dloss, cudaStream_t stream) {
    if (BT == 0) return;
    if ((logits_dtype != MT_DTYPE_BF16 && logits_dtype != MT_DTYPE_FP16) || V_local % 8 != 0 || !mt__aligned16(logits))
        mt_fatal("internal: the fused cross-entropy needs 16-bit logits, V_local %% 8 == 0 and aligned rows");
    int n = mt__real_columns(vocab_start, V_local, V);
    if (logits_dtype == MT_DTYPE_FP16)
        mt__ce_fused16<__half, 1>(losses, maxv, sumexp, target_logit, logits, targets, BT, V_local, vocab_start, n, dloss,
                                  stream);
    else
        mt__ce_fused16<__nv_bfloat16, 0>(losses, maxv, sumexp, target_logit, logits, targets, BT, V_local, vocab_start, n,
                                         dloss, stream);
}
// logits_dtype (an mt_dtype): how the logits, and so dlogits in their place, are stored. MT_DTYPE_FP32:
// the fp32 kernel; BF16 / FP16: mt_cross_entropy_finish16_kernel (V_local % 8 == 0 and 16-byte
// aligned rows, else a fatal error). dlogits NULL: the losses only, whatever the storage.
void mt_cross_entropy_finish_gpu(float *losses, void *dlogits, int logits_dtype, const float *maxv,
                                 const float *sumexp, const float *target_logit, const int *targets, int BT,
                                 int V_local, int vocab_start, int V, float dloss, cudaStream_t stream) {
    if (BT == 0) return;
    int n = mt__real_columns(vocab_start, V_local, V);
    if (dlogits && logits_dtype != MT_DTYPE_FP32) {
        if (V_local % 8 != 0 || !mt__aligned16(dlogits))
            mt_fatal("internal: 16-bit logits need V_local %% 8 == 0 and aligned rows (V_local = %d)", V_local);
        if (logits_dtype == MT_DTYPE_FP16)
            mt_cross_entropy_finish16_kernel<1><<<BT, 256, 0, stream>>>(losses, dlogits, maxv, sumexp, target_logit,
                                                                           targets, V_local, vocab_start, n, dloss);
        else
            mt_cross_entropy_finish16_kernel<0><<<BT, 256, 0, stream>>>(losses, dlogits, maxv, sumexp, target_logit,
                                                                           targets, V_local, vocab_start, n, dloss);
        mt__launch_check("mt_cross_entropy_finish16_kernel", stream);
        return;
    }
    float *d32 = (float *)dlogits;
    mt_cross_entropy_finish_kernel<<<BT, d32 ? 256 : 32, 0, stream>>>(losses, d32, maxv, sumexp, target_logit, targets,
                                                                      V_local, vocab_start, n, dloss,
                                                                      d32 && V_local % 4 == 0 && mt__aligned16(d32));
    mt__launch_check("mt_cross_entropy_finish_kernel", stream);
}

// ---------------------------------------------------------------------------------------------
// AdamW
// matches mt_adamw_cpu (megatron.h, 3. OPS). Updates param, m, v in place; one thread per parameter.
//   p = p (1 - lr wd);  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;  p -= lr (m/bc1) / (sqrt(v/bc2) + eps)
// The bias corrections bc1 = 1 - b1^step, bc2 = 1 - b2^step are computed on the host with the
// CPU's own powf, so both builds use the same two numbers.
// copy16 (NULL: none): the new p is also written there rounded to 16 bits (bf16, or fp16 with
// f16 = 1), the same cast mt_cast_f32_to_bf16_gpu / _f16_gpu would make of it afterwards: the
// parameters' 16-bit copy (mt_device_weights16) is then ready for the next step without a pass of
// its own (124M parameters: a 0.75 GB read-and-write pass traded for 0.25 GB more writes here).
__global__ void mt_adamw_kernel(float *__restrict__ param, float *__restrict__ m, float *__restrict__ v,
                                const float *__restrict__ grad, float grad_scale, size_t n, float lr, float beta1,
                                float beta2, float eps, float weight_decay, float bc1, float bc2,
                                uint16_t *__restrict__ copy16, int f16) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float g = grad[i] * grad_scale;   // the clip's factor (1: none)
    float p = param[i] * (1.0f - lr * weight_decay);
    float mi = beta1 * m[i] + (1.0f - beta1) * g;
    float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    p = p - lr * (mi / bc1) / (sqrtf(vi / bc2) + eps);
    param[i] = p;
    if (copy16) {
        if (f16) copy16[i] = __half_as_ushort(__float2half_rn(p));
        else copy16[i] = __bfloat16_as_ushort(__float2bfloat16_rn(p));
    }
}
void mt_adamw_gpu(float *param, float *m, float *v, const float *grad, float grad_scale, size_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int step, uint16_t *copy16, int f16,
                  cudaStream_t stream) {
    if (n == 0) return;
    float bc1 = 1.0f - powf(beta1, (float)step), bc2 = 1.0f - powf(beta2, (float)step);
    mt_adamw_kernel<<<mt__blocks(n, 256), 256, 0, stream>>>(param, m, v, grad, grad_scale, n, lr, beta1, beta2, eps,
                                                            weight_decay, bc1, bc2, copy16, f16);
    mt__launch_check("mt_adamw_kernel", stream);
}

// ---------------------------------------------------------------------------------------------
// bias add: matches the CPU branch of mt_bias_add (megatron.h, 3. OPS dispatch): out[i,o] += bias[o],
// out (BT, OC), the row-parallel layer's bias after its all-reduce. One thread per element.
// With OC % 4 == 0 and aligned pointers, a float4 per thread (rows then stay float4-aligned).
__global__ void mt_bias_add_kernel(float *out, const float *bias, size_t n, int OC) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] += bias[i % (size_t)OC];
}
__global__ void mt_bias_add_vec4_kernel(float4 *out, const float4 *bias, size_t n4, int OC4) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n4) return;
    float4 o = out[i], b = bias[i % (size_t)OC4];
    out[i] = make_float4(o.x + b.x, o.y + b.y, o.z + b.z, o.w + b.w);
}
void mt_bias_add_gpu(float *out, const float *bias, int BT, int OC, cudaStream_t stream) {
    size_t n = (size_t)BT * OC;
    if (n == 0) return;
    if (OC % 4 == 0 && mt__aligned16(out) && mt__aligned16(bias)) {
        mt_bias_add_vec4_kernel<<<mt__blocks(n / 4, 256), 256, 0, stream>>>((float4 *)out, (const float4 *)bias, n / 4,
                                                                           OC / 4);
        mt__launch_check("mt_bias_add_vec4_kernel", stream);
        return;
    }
    mt_bias_add_kernel<<<mt__blocks(n, 256), 256, 0, stream>>>(out, bias, n, OC);
    mt__launch_check("mt_bias_add_kernel", stream);
}

// =============================================================================================
// 6. OPTIMIZER, CLIPPING (GPU)
// =============================================================================================
// The pieces of Megatron's clip_grad_norm_fp32 that touch every gradient: the sum of squares
// (the CPU's loop in mt__grad_norm, accumulated in double) and the scale by clip / norm.

// sumsq (one double on the device) += sum_i x[i]^2, accumulated in double. Deterministic: the
// number of blocks depends only on n; each block sums a fixed grid-stride subset in order and
// reduces with a fixed tree into partial[block]; then one block adds the partials the same way.
static const int MT__SUMSQ_MAX_BLOCKS = 1024;
// Grid-stride over float4s (the floats before the first 16-byte boundary and after the last whole
// float4 one per thread): a thread adds a float4's four squares in pairs, then into its running
// sum. (One float per load ran at ~2 TB/s, 0.25 ms a step for GPT-2 small's 124M gradients.)
// ZEROS = 1 (mt_count_zeros_cpu's count, --log-num-zeros-in-grad): a value's term is 1 where it is 0
// and 0 elsewhere, in place of its square; the same sums of those.
template <int ZEROS>
__device__ static inline double mt__sumsq_term(float v) { return ZEROS ? (double)(v == 0.0f) : (double)v * (double)v; }
template <int ZEROS>
__global__ void mt_sum_squares_partial_kernel(double *partial, const float *x, size_t n) {
    __shared__ double warp_sums[32];
    size_t head = ((16 - (uintptr_t)x % 16) % 16) / 4;
    if (head > n) head = n;
    size_t n4 = (n - head) / 4, tail = head + 4 * n4;
    const float4 *x4 = (const float4 *)(x + head);
    size_t gid = (size_t)blockIdx.x * blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x;
    double s = 0.0;
    for (size_t i = gid; i < n4; i += stride) {
        float4 v = x4[i];
        s += (mt__sumsq_term<ZEROS>(v.x) + mt__sumsq_term<ZEROS>(v.y)) +
             (mt__sumsq_term<ZEROS>(v.z) + mt__sumsq_term<ZEROS>(v.w));
    }
    if (gid < head) s += mt__sumsq_term<ZEROS>(x[gid]);
    if (gid < n - tail) s += mt__sumsq_term<ZEROS>(x[tail + gid]);
    s = mt__warp_sum_double(s);
    if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = s;
    __syncthreads();
    if (threadIdx.x < 32) {
        double t = threadIdx.x < blockDim.x / 32 ? warp_sums[threadIdx.x] : 0.0;
        t = mt__warp_sum_double(t);
        if (threadIdx.x == 0) partial[blockIdx.x] = t;
    }
}
__global__ void mt_sum_squares_finish_kernel(double *sumsq, const double *partial, int nblocks) {
    __shared__ double warp_sums[32];
    double s = threadIdx.x < nblocks ? partial[threadIdx.x] : 0.0;   // blockDim.x = MT__SUMSQ_MAX_BLOCKS
    s = mt__warp_sum_double(s);
    if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = s;
    __syncthreads();
    if (threadIdx.x < 32) {
        double t = mt__warp_sum_double(warp_sums[threadIdx.x]);
        if (threadIdx.x == 0) *sumsq += t;
    }
}
// zeros: count the zeros instead (ZEROS above)
static void mt__sum_squares_launch(double *sumsq, const float *x, size_t n, int zeros, cudaStream_t stream) {
    if (n == 0) return;
    size_t want = (n + 1023) / 1024;   // a float4 a thread at least
    int nblocks = want < MT__SUMSQ_MAX_BLOCKS ? (int)want : MT__SUMSQ_MAX_BLOCKS;
    double *partial;
    mt__scratch_alloc((void **)&partial, (size_t)nblocks * sizeof(double), stream);
    if (zeros) mt_sum_squares_partial_kernel<1><<<nblocks, 256, 0, stream>>>(partial, x, n);
    else mt_sum_squares_partial_kernel<0><<<nblocks, 256, 0, stream>>>(partial, x, n);
    mt__launch_check("mt_sum_squares_partial_kernel", stream);
    mt_sum_squares_finish_kernel<<<1, MT__SUMSQ_MAX_BLOCKS, 0, stream>>>(sumsq, partial, nblocks);
    mt__launch_check("mt_sum_squares_finish_kernel", stream);
    mt__scratch_free(partial, stream);
}
void mt_sum_squares_gpu(double *sumsq, const float *x, size_t n, cudaStream_t stream) {
    mt__sum_squares_launch(sumsq, x, n, 0, stream);
}
// matches mt_count_zeros_cpu (megatron.h, 3. OPS): *zeros += how many x are 0
void mt_count_zeros_gpu(double *zeros, const float *x, size_t n, cudaStream_t stream) {
    mt__sum_squares_launch(zeros, x, n, 1, stream);
}
// matches mt_unscale_check_cpu (megatron.h, 3. OPS): loss scaling's one pass over the gradients,
// x *= inv_scale, and *found = 1 if any x was inf or NaN. Grid-stride; each warp votes once and
// one lane sets the flag (an integer OR: the result does not depend on the order).
__global__ void mt_unscale_check_kernel(float *x, float inv_scale, size_t n, int *found) {
    int bad = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float v = x[i];
        bad |= !isfinite(v);
        x[i] = v * inv_scale;
    }
    if (__any_sync(0xffffffffu, bad) && threadIdx.x % 32 == 0) atomicOr(found, 1);
}
// *found (device memory) |= whether any x was inf or NaN
void mt_unscale_check_gpu(int *found, float *x, float inv_scale, size_t n, cudaStream_t stream) {
    if (n == 0) return;
    size_t want = (n + 255) / 256;
    int nblocks = want < 4096 ? (int)want : 4096;
    mt_unscale_check_kernel<<<nblocks, 256, 0, stream>>>(x, inv_scale, n, found);
    mt__launch_check("mt_unscale_check_kernel", stream);
}

// =============================================================================================
// THE BACKEND SEAM, GPU HALF (megatron.h §3 "the backend seam" has the CPU half)
// =============================================================================================
// The same functions as the CPU half, with the same arguments and meaning: every op runs its
// kernel on the rank's stream; buffers are device memory on the rank's GPU; the device facts
// (which GPU, its stream, the GEMM rung, the memory in use) come from the CUDA runtime.
static cudaStream_t mt__stream(const mt_rank *r) { return (cudaStream_t)r->dev.stream; }

// MT_PROFILE=1 in the environment: every op below is timed (the rank's stream synchronised
// before and after it, so the times add up to the step, which runs slower: for attribution, not
// for speed) and each rank prints its table when it ends: op, calls, total ms, share.
typedef struct { char name[48]; double seconds; long calls; } mt__profile_entry;
static MT_THREAD_LOCAL mt__profile_entry mt__profile_table[96];
static MT_THREAD_LOCAL int mt__profile_count;
static int mt__profile_on(void) {
    static const int on = getenv("MT_PROFILE") != NULL && atoi(getenv("MT_PROFILE")) != 0;
    return on;
}
static double mt__profile_begin(const mt_rank *r) {
    if (!mt__profile_on()) return 0.0;
    MT_CUDA_CHECK(cudaStreamSynchronize(mt__stream(r)));
    return mt_time_seconds();
}
static void mt__profile_end(const mt_rank *r, const char *name, double t0) {
    if (!mt__profile_on()) return;
    MT_CUDA_CHECK(cudaStreamSynchronize(mt__stream(r)));
    double dt = mt_time_seconds() - t0;
    int i = 0;
    while (i < mt__profile_count && strcmp(mt__profile_table[i].name, name) != 0) i++;
    if (i == mt__profile_count) {
        if (mt__profile_count == 96) return;
        snprintf(mt__profile_table[i].name, sizeof mt__profile_table[i].name, "%s", name);
        mt__profile_count++;
    }
    mt__profile_table[i].seconds += dt;
    mt__profile_table[i].calls++;
}
static void mt__profile_print(const mt_rank *r) {
    if (!mt__profile_on() || mt__profile_count == 0) return;
    double total = 0.0;
    for (int i = 0; i < mt__profile_count; i++) total += mt__profile_table[i].seconds;
    char buf[8192];
    int n = snprintf(buf, sizeof buf, "rank %d: MT_PROFILE, ops of the whole run (synchronised), %.1f ms in all\n",
                     r->ps.rank, 1e3 * total);
    for (int i = 0; i < mt__profile_count && n < (int)sizeof buf - 128; i++) {
        const mt__profile_entry *e = &mt__profile_table[i];
        n += snprintf(buf + n, sizeof buf - (size_t)n, "  %-40s %7ld calls %10.2f ms %5.1f%%\n", e->name, e->calls,
                      1e3 * e->seconds, 100.0 * e->seconds / total);
    }
    fputs(buf, stdout);
    fflush(stdout);
}


void mt_embedding_forward(mt_rank *r, float *out, const int *tokens, const float *wte, int B, int T, int C,
                          int vocab_start, int V_local) {
    double t0 = mt__profile_begin(r);
    mt_embedding_forward_gpu(out, tokens, wte, B, T, C, vocab_start, V_local, mt__stream(r));
    mt__profile_end(r, "embedding forward", t0);
}
void mt_embedding_backward(mt_rank *r, float *dwte, const float *dout, const int *tokens, int B, int T, int C,
                           int vocab_start, int V_local) {
    double t0 = mt__profile_begin(r);
    mt_embedding_backward_gpu(dwte, dout, tokens, B, T, C, vocab_start, V_local, mt__stream(r));
    mt__profile_end(r, "embedding backward", t0);
}
void mt_position_embedding_forward(mt_rank *r, float *out, const float *wpe, int B, int T, int C) {
    double t0 = mt__profile_begin(r);
    mt_position_embedding_forward_gpu(out, wpe, B, T, C, mt__stream(r));
    mt__profile_end(r, "position embedding forward", t0);
}
void mt_position_embedding_backward(mt_rank *r, float *dwpe, const float *dout, int B, int T, int C) {
    double t0 = mt__profile_begin(r);
    mt_position_embedding_backward_gpu(dwpe, dout, B, T, C, mt__stream(r));
    mt__profile_end(r, "position embedding backward", t0);
}
void mt_embedding_positions_forward(mt_rank *r, float *out, const int *tokens, const float *wte, const int *positions,
                                    const float *wpe, int B, int T, int C, int vocab_start, int V_local) {
    double t0 = mt__profile_begin(r);
    mt_embedding_positions_forward_gpu(out, tokens, wte, positions, wpe, B, T, C, vocab_start, V_local, mt__stream(r));
    mt__profile_end(r, "embedding + positions forward", t0);
}
void mt_layernorm_forward(mt_rank *r, float *out, float *mean, float *rstd, const float *inp, const float *weight,
                          const float *bias, int B, int T, int C, mt_dtype out_dtype) {
    double t0 = mt__profile_begin(r);
    if (out_dtype != MT_DTYPE_FP32)
        mt_layernorm_forward16_gpu(out, mean, rstd, NULL, NULL, inp, weight, bias, B, T, C, out_dtype, mt__stream(r));
    else mt_layernorm_forward_gpu(out, mean, rstd, inp, weight, bias, B, T, C, mt__stream(r));
    mt__profile_end(r, "layernorm forward", t0);
}
void mt_layernorm_backward(mt_rank *r, float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                           const float *weight, const float *mean, const float *rstd, int B, int T, int C) {
    double t0 = mt__profile_begin(r);
    mt_layernorm_backward_gpu(dinp, dweight, dbias, dout, inp, weight, mean, rstd, B, T, C, mt__stream(r));
    mt__profile_end(r, "layernorm backward", t0);
}
// the parameters' 16-bit copy (mt_device_weights16) of `weight` when it is on and the product has a
// GEMV's few rows (decoding: the GEMV reads it instead of the fp32 weight); else NULL. (More rows:
// the GEMMs find it themselves, mt__rounded_copy.)
static const void *mt__decoding_weight(const mt_rank *r, const float *weight, int BT) {
    const mt_device *d = &r->dev;
    const float *of = r->model.params_memory;
    if (!d->weights16_on || BT > MT_GEMV_MAX_ROWS || weight < of || weight >= of + d->weights16_n) return NULL;
    return (const uint16_t *)d->weights16 + (weight - of);
}
void mt_matmul_forward(mt_rank *r, float *out, const float *inp, mt_dtype inp_dtype, const float *weight,
                       const float *bias, const float *residual, int BT, int C, int OC) {
    double t0 = mt__profile_begin(r);
    const mt_device *d = &r->dev;
    const void *weight16 = mt__decoding_weight(r, weight, BT);
    if (inp_dtype != MT_DTYPE_FP32) {   // (a training layer's attention output, mt_atty_storage_dtype)
        mt_matmul_forward_inp16_gpu(out, inp, inp_dtype, weight, bias, residual, BT, C, OC, (mt_gemm_impl)d->gemm_impl,
                                    mt__stream(r));   // (the residual in the GEMM's epilogue)
    } else {
        if (weight16) mt_matmul_forward_rounded_weight_gpu(out, inp, weight16, bias, BT, C, OC, d->dtype, mt__stream(r));
        else mt_matmul_forward_gpu(out, inp, weight, bias, BT, C, OC, (mt_gemm_impl)d->gemm_impl, d->dtype, mt__stream(r));
        if (residual) mt_residual_forward_gpu(out, residual, out, (size_t)BT * OC, mt__stream(r));   // (a pass)
    }
    char label[48];
    snprintf(label, sizeof label, "%s %dx%d", "matmul forward", C, OC);
    mt__profile_end(r, label, t0);
}
void mt_matmul_backward(mt_rank *r, float *dinp, mt_dtype dinp_dtype, float *dweight, float *dbias, const float *dout,
                        mt_dtype dout_dtype, const float *inp, mt_dtype inp_dtype, const float *weight, int BT, int C,
                        int OC) {
    double t0 = mt__profile_begin(r);
    if (dinp_dtype != MT_DTYPE_FP32) {   // (the attention projection's: fp32 dout; inp in fp32 or 16 bits)
        if (dout_dtype != MT_DTYPE_FP32 || (inp_dtype != MT_DTYPE_FP32 && inp_dtype != dinp_dtype))
            mt_fatal("internal: a 16-bit dinp from a 16-bit dout, or from an input in another type");
        mt_matmul_backward_dinp16_gpu(dinp, dweight, dbias, dout, inp_dtype == MT_DTYPE_FP32 ? inp : NULL,
                                      inp_dtype == MT_DTYPE_FP32 ? NULL : inp, weight, BT, C, OC, dinp_dtype,
                                      mt__stream(r));
    } else if (dout_dtype != MT_DTYPE_FP32)
        mt_matmul_backward_dout16_gpu(dinp, dweight, dbias, dout, inp_dtype == MT_DTYPE_FP32 ? inp : NULL,
                                      inp_dtype == MT_DTYPE_FP32 ? NULL : inp, weight, BT, C, OC, dout_dtype,
                                      mt__stream(r));
    else if (inp_dtype != MT_DTYPE_FP32)
        mt_matmul_backward_inp16_gpu(dinp, dweight, dbias, dout, inp, weight, BT, C, OC, (mt_gemm_impl)r->dev.gemm_impl,
                                     inp_dtype, mt__stream(r));
    else mt_matmul_backward_gpu(dinp, dweight, dbias, dout, inp, weight, BT, C, OC, (mt_gemm_impl)r->dev.gemm_impl,
                                r->dev.dtype, mt__stream(r));
    char label[48];
    snprintf(label, sizeof label, "%s %dx%d", "matmul backward", C, OC);
    mt__profile_end(r, label, t0);
}
void mt_matmul_forward_gelu(mt_rank *r, float *pre, float *out, const float *inp, const float *weight, const float *bias,
                            int BT, int C, int OC) {
    double t0 = mt__profile_begin(r);
    const mt_device *d = &r->dev;
    mt_matmul_forward_gelu_gpu(pre, out, inp, weight, mt__decoding_weight(r, weight, BT), bias, BT, C, OC,
                               (mt_gemm_impl)d->gemm_impl, d->dtype, mt__stream(r));
    char label[48];
    snprintf(label, sizeof label, "%s %dx%d", "matmul + gelu forward", C, OC);
    mt__profile_end(r, label, t0);
}
void mt_mlp_forward(mt_rank *r, float *fch, mt_dtype fch_dtype, float *out, const float *inp, mt_dtype inp_dtype,
                    const float *fcw, const float *fcb, const float *fcprojw, const float *fcprojb,
                    const float *residual, int BT, int C, int F, int OC) {
    double t0 = mt__profile_begin(r);
    mt_mlp_forward_gpu(fch, fch_dtype, out, inp, inp_dtype, fcw, fcb, fcprojw, fcprojb, residual, BT, C, F, OC,
                       (mt_gemm_impl)r->dev.gemm_impl, r->dev.dtype, mt__stream(r));
    char label[48];
    snprintf(label, sizeof label, "mlp forward %dx%dx%d", C, F, OC);
    mt__profile_end(r, label, t0);
}
void mt_matmul_backward_gelu(mt_rank *r, float *dinp, float *dweight, float *dbias, const float *dout,
                             const float *weight, const float *gelu_inp, mt_dtype gelu_inp_dtype, int BT, int C,
                             int OC) {
    double t0 = mt__profile_begin(r);
    mt_matmul_backward_gelu_gpu(dinp, dweight, dbias, dout, NULL, weight, gelu_inp, gelu_inp_dtype, BT, C, OC,
                                (mt_gemm_impl)r->dev.gemm_impl, r->dev.dtype, mt__stream(r));
    char label[48];
    snprintf(label, sizeof label, "%s %dx%d", "matmul + gelu backward", C, OC);
    mt__profile_end(r, label, t0);
}
void mt_bias_add(mt_rank *r, float *out, const float *bias, int BT, int OC) {
    double t0 = mt__profile_begin(r);
    mt_bias_add_gpu(out, bias, BT, OC, mt__stream(r));
    mt__profile_end(r, "bias add", t0);
}
void mt_dropout_forward(mt_rank *r, float *x, const mt_dropout *d, int B) {
    double t0 = mt__profile_begin(r);
    mt_dropout_forward_gpu(x, d, B, mt__stream(r));
    mt__profile_end(r, "dropout forward", t0);
}
void mt_dropout_backward(mt_rank *r, float *dx, const mt_dropout *d, int B) {
    double t0 = mt__profile_begin(r);
    mt_dropout_backward_gpu(dx, d, B, mt__stream(r));
    mt__profile_end(r, "dropout backward", t0);
}
// the GPU keeps a training layer's qkv in the attention's operand type (16 bits) unless in fp32
mt_dtype mt_qkv_storage_dtype(const mt_config *cfg) { return cfg->compute_dtype; }
// and its ln1, ln2 as the GEMMs that read them want them (megatron.h's mt_ln_gemm_dtype), for the
// rung this build will run: the device's (mt_device_init sets it), or before there is one the
// rung mt_device_scratch_bytes plans with
static mt_gemm_impl mt__planned_rung(const mt_config *cfg);   // (below: the memory plan's device terms)
static mt_gemm_impl mt__storage_rung(const mt_rank *r) {
    return r->dev.stream ? (mt_gemm_impl)r->dev.gemm_impl : mt__planned_rung(r->cfg);
}
mt_dtype mt_ln_storage_dtype(const mt_rank *r) {
    const mt_config *cfg = r->cfg;
    const mt_dims *d = &r->dims;
    return mt_ln_gemm_dtype(mt__storage_rung(r), cfg->compute_dtype, d->B * d->T, d->C, 3 * d->C_tp, d->F_tp,
                            cfg->parallel.sequence_parallel);
}
// and its fc output as the MLP's GEMMs want it (megatron.h's mt_fch_gemm_dtype), the same way
mt_dtype mt_fch_storage_dtype(const mt_rank *r) {
    const mt_dims *d = &r->dims;
    return mt_fch_gemm_dtype(mt__storage_rung(r), r->cfg->compute_dtype, d->B * d->T, d->C, d->F_tp);
}
// and the attention's input gradient as the qkv GEMM's backward wants it (mt_dqkv_gemm_dtype)
mt_dtype mt_dqkv_storage_dtype(const mt_rank *r) {
    const mt_dims *d = &r->dims;
    return mt_dqkv_gemm_dtype(mt__storage_rung(r), r->cfg->compute_dtype, d->B * d->T, d->C, 3 * d->C_tp);
}
// and the attention output's gradient as the attention's backward wants it (mt_datty_gemm_dtype)
mt_dtype mt_datty_storage_dtype(const mt_rank *r) {
    const mt_dims *d = &r->dims;
    return mt_datty_gemm_dtype(mt__storage_rung(r), r->cfg->compute_dtype, d->B * d->T, d->C_tp, d->C);
}
// and the attention output itself as its projection's GEMMs read it (mt_atty_gemm_dtype)
mt_dtype mt_atty_storage_dtype(const mt_rank *r) {
    const mt_dims *d = &r->dims;
    return mt_atty_gemm_dtype(mt__storage_rung(r), r->cfg->compute_dtype, d->B * d->T, d->C_tp, d->C);
}
void mt_qkv_forward(mt_rank *r, float *qkv, const float *inp, mt_dtype inp_dtype, const float *weight,
                    const float *bias, int BT, int C, int OC) {
    if (mt_qkv_storage_dtype(r->cfg) == MT_DTYPE_FP32) {
        if (inp_dtype != MT_DTYPE_FP32) mt_fatal("internal: a 16-bit qkv projection input with fp32 qkv");
        mt_matmul_forward(r, qkv, inp, MT_DTYPE_FP32, weight, bias, NULL, BT, C, OC);
        return;
    }
    double t0 = mt__profile_begin(r);
    mt_matmul_forward16_gpu(qkv, inp, inp_dtype, weight, bias, BT, C, OC, (mt_gemm_impl)r->dev.gemm_impl, r->dev.dtype,
                         mt__stream(r));
    char label[48];
    snprintf(label, sizeof label, "qkv forward %dx%d", C, OC);
    mt__profile_end(r, label, t0);
}
void mt_attention_forward(mt_rank *r, float *out, mt_dtype out_dtype, float *lse, const float *qkv, int B, int T,
                          int C_local, int NH_local, const mt_dropout *drop, int head_offset, int NH_global) {
    double t0 = mt__profile_begin(r);
    if (mt_qkv_storage_dtype(r->cfg) != MT_DTYPE_FP32)   // qkv as mt_qkv_forward stored it
        mt_attention_forward16_gpu(out, out_dtype, lse, qkv, B, T, C_local, NH_local, drop, head_offset, NH_global,
                                   r->dev.dtype, mt__stream(r));
    else if (out_dtype != MT_DTYPE_FP32) mt_fatal("internal: a 16-bit attention output from fp32 qkv");
    else mt_attention_forward_gpu(out, lse, qkv, B, T, C_local, NH_local, drop, head_offset, NH_global, r->dev.dtype,
                                  mt__stream(r));
    mt__profile_end(r, "attention forward", t0);
}
void mt_attention_backward(mt_rank *r, float *dqkv, mt_dtype dqkv_dtype, const float *dout, mt_dtype dout_dtype,
                           const float *qkv, const float *out, mt_dtype out_dtype, const float *lse, int B, int T,
                           int C_local, int NH_local, const mt_dropout *drop, int head_offset, int NH_global) {
    double t0 = mt__profile_begin(r);
    if (mt_qkv_storage_dtype(r->cfg) != MT_DTYPE_FP32)
        mt_attention_backward16_gpu(dqkv, dqkv_dtype, dout, dout_dtype, qkv, out, out_dtype, lse, B, T, C_local,
                                    NH_local, drop, head_offset, NH_global, r->dev.dtype, mt__stream(r));
    else if (dqkv_dtype != MT_DTYPE_FP32 || dout_dtype != MT_DTYPE_FP32 || out_dtype != MT_DTYPE_FP32)
        mt_fatal("internal: a 16-bit dqkv, dout or out with fp32 attention");
    else mt_attention_backward_gpu(dqkv, dout, qkv, out, lse, B, T, C_local, NH_local, drop, head_offset, NH_global,
                                   r->dev.dtype, mt__stream(r));
    mt__profile_end(r, "attention backward", t0);
}
void mt_attention_cached_forward(mt_rank *r, float *out, float *kcache, float *vcache, const float *qkv,
                                 const int *start, int B, int Tq, int C_local, int NH_local, int cap) {
    double t0 = mt__profile_begin(r);
    mt_attention_cached_forward_gpu(out, kcache, vcache, qkv, start, B, Tq, C_local, NH_local, cap, 0, mt__stream(r));
    mt__profile_end(r, "attention over the KV cache", t0);
}
int mt_qkv_attention_decode(mt_rank *r, float *out, float *kcache, float *vcache, const float *ln, const float *weight,
                            const float *bias, const int *start, int C, int C_local, int NH_local, int cap) {
    double t0 = mt__profile_begin(r);
    int ran = mt_qkv_attention_decode_gpu(out, kcache, vcache, ln, mt__decoding_weight(r, weight, 1), bias, start, C,
                                          C_local, NH_local, cap, r->dev.dtype, mt__stream(r));
    if (ran) mt__profile_end(r, "qkv + attention over the KV cache", t0);
    return ran;
}
void mt_argmax_rows(mt_rank *r, int *out, const float *x, int rows, int n, int ld) {
    double t0 = mt__profile_begin(r);
    mt_argmax_rows_gpu(out, x, rows, n, ld, mt__stream(r));
    mt__profile_end(r, "argmax", t0);
}
size_t mt_sample_rows_work_bytes(int rows, int n) { return mt_gpu_sample_rows_work_bytes(rows, n); }
void mt_sample_rows(mt_rank *r, int *out, const float *x, int rows, int n, int ld, const mt_draw *draws, void *work) {
    double t0 = mt__profile_begin(r);
    mt_sample_rows_gpu(out, x, rows, n, ld, draws, work, mt__stream(r));
    mt__profile_end(r, "sampling", t0);
}
void mt_decode_advance(mt_rank *r, int *tokens, int *positions, int *start, mt_draw *draws, int *step, int *ring,
                       const int *next, const mt_draw *plan, int plan_steps, int ring_slots, int rows, int cap) {
    double t0 = mt__profile_begin(r);
    mt_decode_advance_gpu(tokens, positions, start, draws, step, ring, next, plan, plan_steps, ring_slots, rows, cap,
                          mt__stream(r));
    mt__profile_end(r, "decode advance", t0);
}
void mt_gelu_forward(mt_rank *r, float *out, const float *inp, size_t N) {
    double t0 = mt__profile_begin(r);
    mt_gelu_forward_gpu(out, inp, N, mt__stream(r));
    mt__profile_end(r, "gelu forward", t0);
}
void mt_gelu_backward(mt_rank *r, float *dinp, const float *inp, const float *dout, size_t N) {
    double t0 = mt__profile_begin(r);
    mt_gelu_backward_gpu(dinp, inp, dout, N, mt__stream(r));
    mt__profile_end(r, "gelu backward", t0);
}
void mt_residual_forward(mt_rank *r, float *out, const float *a, const float *b, size_t N) {
    double t0 = mt__profile_begin(r);
    mt_residual_forward_gpu(out, a, b, N, mt__stream(r));
    mt__profile_end(r, "residual forward", t0);
}
void mt_residual_layernorm_forward(mt_rank *r, float *res, float *out, float *mean, float *rstd, const float *a,
                                   const float *b, const float *weight, const float *bias, int B, int T, int C,
                                   mt_dtype out_dtype) {
    double t0 = mt__profile_begin(r);
    if (out_dtype != MT_DTYPE_FP32)
        mt_layernorm_forward16_gpu(out, mean, rstd, res, a, b, weight, bias, B, T, C, out_dtype, mt__stream(r));
    else mt_residual_layernorm_forward_gpu(res, out, mean, rstd, a, b, weight, bias, B, T, C, mt__stream(r));
    mt__profile_end(r, "residual + layernorm forward", t0);
}
// the LM head's logits in 16 bits where mt_logits_grad_dtype (megatron.h, section 3) says so for
// the rung this build will run (the device's, or before there is one the planned rung, as
// mt_ln_storage_dtype): the cross-entropy reads them so and writes their gradient in their place,
// which the head's backward GEMMs read as it is
mt_dtype mt_logits_storage_dtype(const mt_rank *r) {
    return mt_logits_grad_dtype(mt__storage_rung(r), r->cfg->compute_dtype, r->dims.C, r->dims.Vp_tp);
}
void mt_lm_head_forward(mt_rank *r, float *logits, mt_dtype logits_dtype, const float *inp, const float *weight, int BT,
                        int C, int V_local) {
    if (logits_dtype == MT_DTYPE_FP32) {
        mt_matmul_forward(r, logits, inp, MT_DTYPE_FP32, weight, NULL, NULL, BT, C, V_local);
        return;
    }
    if (logits_dtype != r->dev.dtype) mt_fatal("internal: logits in dtype %d, the GEMMs in %d", (int)logits_dtype, r->dev.dtype);
    double t0 = mt__profile_begin(r);
    mt_matmul_forward16_gpu(logits, inp, MT_DTYPE_FP32, weight, NULL, BT, C, V_local, (mt_gemm_impl)r->dev.gemm_impl,
                            r->dev.dtype, mt__stream(r));
    char label[48];
    snprintf(label, sizeof label, "lm head forward %dx%d", C, V_local);
    mt__profile_end(r, label, t0);
}
void mt_cross_entropy_local_max(mt_rank *r, float *maxv, const float *logits, mt_dtype logits_dtype, int BT, int V_local,
                                int vocab_start, int V) {
    double t0 = mt__profile_begin(r);
    mt_cross_entropy_local_max_gpu(maxv, logits, logits_dtype, BT, V_local, vocab_start, V, mt__stream(r));
    mt__profile_end(r, "cross entropy local max", t0);
}
void mt_cross_entropy_local_sums(mt_rank *r, float *sumexp, float *target_logit, const float *logits,
                                 mt_dtype logits_dtype, const float *maxv, const int *targets, int BT, int V_local,
                                 int vocab_start, int V) {
    double t0 = mt__profile_begin(r);
    mt_cross_entropy_local_sums_gpu(sumexp, target_logit, logits, logits_dtype, maxv, targets, BT, V_local, vocab_start,
                                    V, mt__stream(r));
    mt__profile_end(r, "cross entropy local sums", t0);
}
void mt_cross_entropy_local_max_sums(mt_rank *r, float *maxv, float *sumexp, float *target_logit, const float *logits,
                                     mt_dtype logits_dtype, const int *targets, int BT, int V_local, int vocab_start,
                                     int V) {
    double t0 = mt__profile_begin(r);
    mt_cross_entropy_local_max_sums_gpu(maxv, sumexp, target_logit, logits, logits_dtype, targets, BT, V_local,
                                        vocab_start, V, mt__stream(r));
    mt__profile_end(r, "cross entropy local max+sums", t0);
}
void mt_cross_entropy_finish(mt_rank *r, float *losses, float *dlogits, mt_dtype logits_dtype, const float *maxv,
                             const float *sumexp, const float *target_logit, const int *targets, int BT, int V_local,
                             int vocab_start, int V, float dloss) {
    double t0 = mt__profile_begin(r);
    mt_cross_entropy_finish_gpu(losses, dlogits, logits_dtype, maxv, sumexp, target_logit, targets, BT, V_local,
                                vocab_start, V, dloss, mt__stream(r));
    mt__profile_end(r, "cross entropy finish", t0);
}
void mt_cross_entropy_max_sums_finish(mt_rank *r, float *losses, float *logits, mt_dtype logits_dtype, float *maxv,
                                      float *sumexp, float *target_logit, const int *targets, int BT, int V_local,
                                      int vocab_start, int V, float dloss) {
    if (logits_dtype == MT_DTYPE_FP32 || V_local % 8 != 0 || !mt__aligned16(logits)) {   // the two ops
        mt_cross_entropy_local_max_sums(r, maxv, sumexp, target_logit, logits, logits_dtype, targets, BT, V_local,
                                        vocab_start, V);
        mt_cross_entropy_finish(r, losses, logits, logits_dtype, maxv, sumexp, target_logit, targets, BT, V_local,
                                vocab_start, V, dloss);
        return;
    }
    double t0 = mt__profile_begin(r);
    mt_cross_entropy_fused16_gpu(losses, maxv, sumexp, target_logit, logits, logits_dtype, targets, BT, V_local,
                                 vocab_start, V, dloss, mt__stream(r));
    mt__profile_end(r, "cross entropy (one kernel)", t0);
}
void mt_lm_head_backward(mt_rank *r, float *dinp, float *dweight, const float *dlogits, mt_dtype logits_dtype,
                         const float *inp, const float *weight, int BT, int C, int V_local) {
    if (logits_dtype == MT_DTYPE_FP32) {   // fp32 in place: the plain matmul backward
        mt_matmul_backward(r, dinp, MT_DTYPE_FP32, dweight, NULL, dlogits, MT_DTYPE_FP32, inp, MT_DTYPE_FP32, weight, BT,
                           C, V_local);
        return;
    }
    double t0 = mt__profile_begin(r);
    mt_matmul_backward_dout16_gpu(dinp, dweight, NULL, dlogits, inp, NULL, weight, BT, C, V_local, logits_dtype,
                                  mt__stream(r));
    char label[48];
    snprintf(label, sizeof label, "lm head backward %dx%d", C, V_local);
    mt__profile_end(r, label, t0);
}
void mt_adamw(mt_rank *r, float *param, float *m, float *v, const float *grad, float grad_scale, size_t n, float lr,
              float beta1, float beta2, float eps, float weight_decay, int step) {
    double t0 = mt__profile_begin(r);
    // the parameters' 16-bit copy, where it exists, gets the new values as they are made; once AdamW
    // has so written every parameter, the next step's mt_device_weights16 has nothing to cast
    mt_device *d = &r->dev;
    const float *of = r->model.params_memory;
    uint16_t *copy16 = NULL;
    if (d->weights16 && param >= of && param + n <= of + d->weights16_n) {
        copy16 = (uint16_t *)d->weights16 + (param - of);
        d->weights16_updated += n;
    }
    mt_adamw_gpu(param, m, v, grad, grad_scale, n, lr, beta1, beta2, eps, weight_decay, step, copy16,
                 d->dtype == MT_DTYPE_FP16, mt__stream(r));
    mt__profile_end(r, "adamw", t0);
}
// the sum lands in device memory; one synchronisation brings it to the host
// the pieces' sums added into one device double in order (mt_sum_squares_gpu adds), then one copy
static double mt__sum_parts(mt_rank *r, const float *x, const size_t *start, const size_t *count, int parts,
                            int zeros) {
    double t0 = mt__profile_begin(r);
    double *sumsq, result = 0.0;
    cudaStream_t stream = mt__stream(r);
    mt__scratch_alloc((void **)&sumsq, sizeof(double), stream);
    MT_CUDA_CHECK(cudaMemsetAsync(sumsq, 0, sizeof(double), stream));
    for (int i = 0; i < parts; i++) mt__sum_squares_launch(sumsq, x + start[i], count[i], zeros, stream);
    MT_CUDA_CHECK(cudaMemcpyAsync(&result, sumsq, sizeof(double), cudaMemcpyDeviceToHost, stream));
    mt__scratch_free(sumsq, stream);
    MT_CUDA_CHECK(cudaStreamSynchronize(stream));
    mt__profile_end(r, zeros ? "count of zeros" : "sum of squares", t0);
    return result;
}
double mt_sum_squares_parts(mt_rank *r, const float *x, const size_t *start, const size_t *count, int parts) {
    return mt__sum_parts(r, x, start, count, parts, 0);
}
double mt_count_zeros_parts(mt_rank *r, const float *x, const size_t *start, const size_t *count, int parts) {
    return mt__sum_parts(r, x, start, count, parts, 1);
}
// the whole of x: one piece
double mt_sum_squares(mt_rank *r, const float *x, size_t n) {
    size_t start = 0;
    return mt_sum_squares_parts(r, x, &start, &n, 1);
}
// matches mt_loss_mean_add_cpu (megatron.h, 3. OPS): *acc += (sum of the BT losses) / BT in
// double, on the device, so the step does not wait for each micro-batch's losses (mt__batch_loss
// reads the sum once, at the step's end). One block: each thread sums every 256th loss, then a
// tree over the block in a fixed order (the same bits every run; the CPU sums in a loop, so the
// two builds differ in the double's last bits, far below the printed digits).
__global__ void mt_loss_mean_add_kernel(double *acc, const float *losses, int BT) {
    __shared__ double part[256];
    double sum = 0.0;
    for (int i = threadIdx.x; i < BT; i += blockDim.x) sum += losses[i];
    part[threadIdx.x] = sum;
    __syncthreads();
    for (int k = blockDim.x / 2; k > 0; k /= 2) {
        if (threadIdx.x < k) part[threadIdx.x] += part[threadIdx.x + k];
        __syncthreads();
    }
    if (threadIdx.x == 0) *acc += part[0] / BT;
}
void mt_loss_mean_add_gpu(double *acc, const float *losses, int BT, cudaStream_t stream) {
    mt_loss_mean_add_kernel<<<1, 256, 0, stream>>>(acc, losses, BT);
    mt__launch_check("mt_loss_mean_add_kernel", stream);
}
void mt_loss_mean_add(mt_rank *r, double *acc, const float *losses, int BT) {
    double t0 = mt__profile_begin(r);
    mt_loss_mean_add_gpu(acc, losses, BT, mt__stream(r));
    mt__profile_end(r, "loss mean", t0);
}
// loss scaling's check: the flag lands in device memory; one synchronisation brings it to the host
int mt_unscale_check(mt_rank *r, float *x, float inv_scale, size_t n) {
    double t0 = mt__profile_begin(r);
    int *found, result = 0;
    cudaStream_t stream = mt__stream(r);
    mt__scratch_alloc((void **)&found, sizeof(int), stream);
    MT_CUDA_CHECK(cudaMemsetAsync(found, 0, sizeof(int), stream));
    mt_unscale_check_gpu(found, x, inv_scale, n, stream);
    MT_CUDA_CHECK(cudaMemcpyAsync(&result, found, sizeof(int), cudaMemcpyDeviceToHost, stream));
    mt__scratch_free(found, stream);
    MT_CUDA_CHECK(cudaStreamSynchronize(stream));
    mt__profile_end(r, "unscale and check", t0);
    return result;
}

// buffers: device memory on the rank's GPU, zeroed.
// What this thread (one rank: one thread, one GPU) holds through them, for the memory report: the
// blocks it allocated and has not freed, and the most at once. (A block freed by another thread,
// or one beyond the table's 64, is not found at its free and stays counted: no rank does either.)
typedef struct { void *p; size_t bytes; } mt__device_block;
static MT_THREAD_LOCAL mt__device_block mt__device_blocks[64];
static MT_THREAD_LOCAL int mt__device_nblocks;
static MT_THREAD_LOCAL size_t mt__device_bytes, mt__device_bytes_peak;
// cudaMalloc, zeroed, or the out-of-memory error with its hint (the tally's blocks and the arena)
static void *mt__device_malloc(mt_rank *r, size_t bytes, const char *what) {
    void *p = NULL;
    cudaError_t err = cudaMalloc(&p, bytes ? bytes : 1);
    if (err != cudaSuccess)
        mt_fatal("out of GPU memory allocating %.1f MB for %s on rank %d (%s)\n"
                 "hint: use a smaller --micro-batch-size or --seq-length, or more tensor/pipeline parallelism "
                 "(--dry-run prints what each rank needs)",
                 (double)bytes / 1e6, what, r->ps.rank, cudaGetErrorString(err));
    MT_CUDA_CHECK(cudaMemset(p, 0, bytes ? bytes : 1));
    return p;
}
static void *mt__device_alloc(mt_rank *r, size_t bytes, const char *what) {
    void *p = mt__device_malloc(r, bytes, what);
    mt__device_bytes += bytes;
    if (mt__device_bytes > mt__device_bytes_peak) mt__device_bytes_peak = mt__device_bytes;
    if (mt__device_nblocks < 64) {
        mt__device_blocks[mt__device_nblocks].p = p;
        mt__device_blocks[mt__device_nblocks++].bytes = bytes;
    }
    return p;
}
float *mt_buffer_alloc(mt_rank *r, size_t n, const char *what) {
    return (float *)mt__device_alloc(r, n * sizeof(float), what);
}
int *mt_buffer_alloc_ints(mt_rank *r, size_t n, const char *what) {
    return (int *)mt__device_alloc(r, n * sizeof(int), what);
}
void mt_buffer_free(void *p) {
    if (!p) return;
    MT_CUDA_CHECK(cudaFree(p));
    for (int i = 0; i < mt__device_nblocks; i++)
        if (mt__device_blocks[i].p == p) {
            mt__device_bytes -= mt__device_blocks[i].bytes;
            mt__device_blocks[i] = mt__device_blocks[--mt__device_nblocks];
            break;
        }
}
// the kernel scratch's arena (section 1): one block of the memory plan's kernel-scratch term
// (mt_device_scratch_bytes, from r->dims: the caller sets them first), and 256 bytes more for
// each piece the stack holds, which covers rounding every live piece up to 256 bytes. Not in the
// tally above: the memory report counts it as the kernel scratch's backing memory, beside the
// pool's (mt_device_memory_measure), where the stream-ordered pool's copy of the same scratch was
// counted before. A rank without a training step's dims (a generator's: mt__gen_rank_main sets
// them later) gets none, and its launchers borrow from the pool.
static void mt__scratch_arena_make(mt_rank *r) {
    memset(&mt__scratch, 0, sizeof mt__scratch);
    size_t plan = r->dims.B > 0 && r->dims.T > 0 ? mt_device_scratch_bytes(r) : 0;
    if (plan == 0) return;
    size_t bytes = plan + (size_t)MT__SCRATCH_PIECES * MT__SCRATCH_ALIGN;
    mt__scratch.base = (char *)mt__device_malloc(r, bytes, "the kernels' scratch arena");
    mt__scratch.bytes = bytes;
    mt__scratch.stream = mt__stream(r);
}
static void mt__scratch_arena_free(mt_rank *r) {
    if (mt__scratch.base) {
        MT_CUDA_CHECK(cudaStreamSynchronize(mt__stream(r)));   // (the last op that borrowed it has run)
        MT_CUDA_CHECK(cudaFree(mt__scratch.base));
    }
    memset(&mt__scratch, 0, sizeof mt__scratch);
}
void mt_buffer_zero(mt_rank *r, float *p, size_t n) {
    double t0 = mt__profile_begin(r);
    MT_CUDA_CHECK(cudaMemsetAsync(p, 0, n * sizeof(float), mt__stream(r)));
    mt__profile_end(r, "buffer zero", t0);
}
void mt_buffer_copy(mt_rank *r, float *dst, const float *src, size_t n) {
    double t0 = mt__profile_begin(r);
    MT_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, mt__stream(r)));
    mt__profile_end(r, "buffer copy", t0);
}
// matches mt_buffer_copy_strided (megatron.h, 3. OPS): one 2D copy, pitches in bytes
void mt_buffer_copy_strided(mt_rank *r, float *dst, size_t dst_stride, const float *src, size_t src_stride, size_t row,
                            size_t rows) {
    if (row == 0 || rows == 0) return;
    double t0 = mt__profile_begin(r);
    MT_CUDA_CHECK(cudaMemcpy2DAsync(dst, dst_stride * sizeof(float), src, src_stride * sizeof(float),
                                    row * sizeof(float), rows, cudaMemcpyDeviceToDevice, mt__stream(r)));
    mt__profile_end(r, "buffer copy strided", t0);
}
// host <-> device, synchronous: for small things (token ids, losses, norms, pipeline messages)
void mt_buffer_upload(mt_rank *r, void *dst, const void *host_src, size_t bytes) {
    double t0 = mt__profile_begin(r);
    MT_CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, mt__stream(r)));
    MT_CUDA_CHECK(cudaStreamSynchronize(mt__stream(r)));
    mt__profile_end(r, "buffer upload", t0);
}
void mt_buffer_upload_queued(mt_rank *r, void *dst, const void *host_src, size_t bytes) {
    double t0 = mt__profile_begin(r);
    // from pageable memory the runtime stages the bytes before it returns (the CUDA runtime API's
    // "API synchronization behavior"), so host_src is free again; the copy itself runs in stream order
    MT_CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, mt__stream(r)));
    mt__profile_end(r, "buffer upload", t0);
}
void mt_buffer_download(mt_rank *r, void *host_dst, const void *src, size_t bytes) {
    double t0 = mt__profile_begin(r);
    MT_CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, mt__stream(r)));
    MT_CUDA_CHECK(cudaStreamSynchronize(mt__stream(r)));
    mt__profile_end(r, "buffer download", t0);
}

// pinned host memory (--optimizer-cpu-offload's master weights, moments and gradients): page-locked,
// so the copies above run at full PCIe speed straight from it (pageable memory is staged through a
// driver buffer); zeroed. The host's limit is its RAM (and ulimit -l where locked memory is capped)
float *mt_buffer_alloc_host(mt_rank *r, size_t n, const char *what) {
    size_t bytes = (n ? n : 1) * sizeof(float);
    void *p = NULL;
    cudaError_t err = cudaHostAlloc(&p, bytes, cudaHostAllocDefault);
    if (err != cudaSuccess)
        mt_fatal("out of pinned host memory allocating %.1f MB for %s on rank %d (%s)\n"
                 "hint: --optimizer-cpu-offload keeps 16 bytes per parameter of each rank's shard on the host: add "
                 "--use-distributed-optimizer (DP ranks share it), fewer ranks per node, or drop the offload",
                 (double)bytes / 1e6, what, r->ps.rank, cudaGetErrorString(err));
    memset(p, 0, bytes);
    return (float *)p;
}
void mt_buffer_free_host(void *p) {
    if (p) MT_CUDA_CHECK(cudaFreeHost(p));
}

// device facts. One thread per GPU: rank r drives GPU r (every rank is still a thread of this
// one process, as on the CPU), with one stream for all its kernels.
void mt_device_init(mt_rank *r) {
    int devices = 0;
    cudaError_t err = cudaGetDeviceCount(&devices);
    if (err != cudaSuccess || devices == 0)
        mt_fatal("no CUDA device found (%s)\nhint: train_gpt_cuda needs NVIDIA GPUs; ./train_gpt trains on the CPU",
                 err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
    // my GPU: my index among my node's ranks (LOCAL_RANK with one rank per process). A launcher
    // that gives each process its own GPUs (srun --gpus-per-task, CUDA_VISIBLE_DEVICES) shows a
    // process fewer devices than the node's ranks: then my index among the ones it sees.
    int isolated = getenv("CUDA_VISIBLE_DEVICES") != NULL && r->ps.node_size % devices == 0;
    if (r->ps.node_size > devices && !isolated)
        mt_fatal("%d ranks on this node need %d GPUs, it has %d\nhint: lower --nproc-per-node (ranks = TP x PP x DP), "
                 "or start fewer processes per node", r->ps.node_size, r->ps.node_size, devices);
    r->dev.device = r->ps.node_size > devices ? r->ps.node_rank % devices : r->ps.node_rank;
    MT_CUDA_CHECK(cudaSetDevice(r->dev.device));
    // what the GPU holds before this rank allocates anything: the CUDA context (made now, by the
    // first call that needs it) and whatever other processes hold. The memory plan does not count
    // it; the memory report (section 12) shows it beside the plan.
    MT_CUDA_CHECK(cudaFree(0));
    size_t free_b = 0, total_b = 0;
    MT_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    r->dev.context_bytes = total_b - free_b;
    r->dev.gpu_scratch_high = 0;   // (the CPU build's count; this build measures its arena and pool instead)
    cudaStream_t stream;
    MT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    r->dev.stream = (void *)stream;
    const mt_config *cfg = r->cfg;
    r->dev.dtype = cfg->compute_dtype;
    r->dev.gemm_impl = cfg->train.gemm[0] ? (int)mt_gemm_impl_parse(cfg->train.gemm)
                                          : (int)mt_gemm_impl_for_precision(r->dev.dtype);
    snprintf(r->dev.name, sizeof r->dev.name, "GPU %d, GEMM %s", r->dev.device,
             mt_gemm_impl_name((mt_gemm_impl)r->dev.gemm_impl));
    // the launchers' scratch (split-K partials, bf16 copies of GEMM operands) that the rank's arena
    // cannot serve (section 1: none on a generator's rank, a prefill over many rows) comes from the
    // device's stream-ordered pool: keep what it freed instead of returning it to the driver at
    // every synchronisation, so the next such allocations are served from the pool
    cudaMemPool_t pool;
    MT_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, r->dev.device));
    uint64_t keep = UINT64_MAX;
    MT_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
    // The first stream-ordered allocation of a process sets the pool up: measured on an H200,
    // 10.5 ms for the first cudaMallocAsync against 0.006 ms for the next. Paid here, at start-up,
    // not by the first op that borrows (a generation's prefill: it was most of the time to the
    // first token, 11-14 ms against 2.7 for the batches after it)
    void *first;
    MT_CUDA_CHECK(cudaMallocAsync(&first, 256, stream));
    MT_CUDA_CHECK(cudaFreeAsync(first, stream));
    MT_CUDA_CHECK(cudaStreamSynchronize(stream));
    // the kernel scratch's arena, the size the memory plan gives it (mt_rank_init sets r->dims first)
    mt__scratch_arena_make(r);
}
// the parameters' 16-bit copy (megatron.h, section 3): one cast of the whole buffer into memory
// kept for the next step, and the GEMMs told where it is (mt__w16: mt__rounded_copy lends pieces
// of it)
void mt_device_weights16(mt_rank *r, int use) {
    mt_device *d = &r->dev;
    d->weights16_on = 0;
    memset(&mt__w16, 0, sizeof mt__w16);
    if (use == MT_WEIGHTS16_OFF && d->decode_work) {   // (the one-kernel decode step's, made at its first use)
        MT_CUDA_CHECK(cudaStreamSynchronize(mt__stream(r)));
        MT_CUDA_CHECK(cudaFree(d->decode_work));
        d->decode_work = NULL;
        d->decode_work_bytes = 0;
    }
    size_t n = r->model.num_params;
    if (use == MT_WEIGHTS16_OFF) return;   // (AdamW may now write the copy: weights16_updated counts)
    // every parameter written into the copy by AdamW since the copy was last made or used (mt_adamw):
    // it already holds the parameters as they are now
    int current = d->weights16 && d->weights16_updated == n;
    d->weights16_updated = 0;
    if (!mt_weights16_wanted((mt_gemm_impl)d->gemm_impl, d->dtype, use) || n == 0) return;
    if (!d->weights16) {
        d->weights16 = mt__device_alloc(r, n * sizeof(uint16_t), "the parameters' 16-bit copy");
        d->weights16_n = n;
    }
    if (current) {
        // (nothing to cast)
    } else if (d->dtype == MT_DTYPE_FP16) {
        mt_cast_f32_to_f16_gpu((__half *)d->weights16, r->model.params_memory, n, mt__stream(r));
    } else {
        mt_cast_f32_to_bf16_gpu((__nv_bfloat16 *)d->weights16, r->model.params_memory, n, mt__stream(r));
    }
    d->weights16_on = 1;
    mt__w16.of = r->model.params_memory;
    mt__w16.n = n;
    mt__w16.copy = d->weights16;
    mt__w16.f16 = d->dtype == MT_DTYPE_FP16;
}
// the plan's term: where a training step would make the copy on the rung this build runs
size_t mt_device_weights16_bytes(const mt_rank *r) {
    if (!mt_weights16_wanted(mt__storage_rung(r), r->cfg->compute_dtype, MT_WEIGHTS16_STEP)) return 0;
    return r->model.num_params * sizeof(uint16_t);
}
// a decode step as one kernel (megatron.h, section 3): the parameters' 16-bit decoding copies, the
// work buffer (made at first use), then mt_decode_step_gpu, which may decline the shape (0)
int mt_device_decode_step(mt_rank *r, const mt_decode_step *s) {
    // opt-in: MT_DECODE_ONE_KERNEL=1. Measured on one H200 it is still slower than the op-by-op step
    // as a graph of programmatic launches (GPT-2 small, batch 1: 0.61 against 0.44-0.54 ms a token;
    // docs/perf.md), so the default stays op by op
    static const int one_kernel = getenv("MT_DECODE_ONE_KERNEL") != NULL && atoi(getenv("MT_DECODE_ONE_KERNEL")) == 1;
    if (!one_kernel || mt__profile_on() || mt__sync_debug()) return 0;   // (profiles time each op)
    mt__decode_args a;
    memset(&a, 0, sizeof a);
    a.qkvw = mt__decoding_weight(r, s->qkvw, s->B);
    a.attprojw = mt__decoding_weight(r, s->attprojw, s->B);
    a.fcw = mt__decoding_weight(r, s->fcw, s->B);
    a.fcprojw = mt__decoding_weight(r, s->fcprojw, s->B);
    a.wte16 = mt__decoding_weight(r, s->wte, s->B);
    if (!a.qkvw || !a.attprojw || !a.fcw || !a.fcprojw || !a.wte16) return 0;
    a.B = s->B; a.L = s->L; a.C = s->C; a.NH = s->NH; a.F = s->F; a.V = s->V; a.Vp = s->Vp; a.cap = s->cap;
    a.tokens = s->tokens; a.positions = s->positions; a.start = s->start;
    a.wte = s->wte; a.wpe = s->wpe; a.lnfw = s->lnfw; a.lnfb = s->lnfb;
    a.ln1w = s->ln1w; a.ln1b = s->ln1b; a.qkvb = s->qkvb; a.attprojb = s->attprojb;
    a.ln2w = s->ln2w; a.ln2b = s->ln2b; a.fcb = s->fcb; a.fcprojb = s->fcprojb;
    a.kcache = s->kcache; a.vcache = s->vcache; a.cache_layer = s->cache_layer;
    a.x = s->x; a.res2 = s->res2; a.qkv = s->qkv; a.atty = s->atty; a.out_c = s->out_c; a.fch = s->fch;
    a.fch_gelu = s->fch_gelu; a.logits = s->logits; a.next = s->next;
    mt_device *d = &r->dev;
    size_t need = mt_decode_step_work_bytes(s->B);
    if (d->decode_work_bytes < need) {
        if (d->decode_work) MT_CUDA_CHECK(cudaFree(d->decode_work));
        d->decode_work = mt__device_alloc(r, need, "the decode step's work buffer");
        d->decode_work_bytes = need;
    }
    a.work = (unsigned *)d->decode_work;
    return mt_decode_step_gpu(&a, d->dtype, d->decode_work_bytes, mt__stream(r));
}
void mt_device_free(mt_rank *r) {
    mt_device_weights16(r, MT_WEIGHTS16_OFF);
    if (r->dev.weights16) {
        MT_CUDA_CHECK(cudaStreamSynchronize(mt__stream(r)));
        MT_CUDA_CHECK(cudaFree(r->dev.weights16));
        r->dev.weights16 = NULL;
    }
    mt__profile_print(r);
    for (int i = 0; i < MT_DEVICE_POINTS; i++)
        if (r->dev.points[i]) MT_CUDA_CHECK(cudaEventDestroy((cudaEvent_t)r->dev.points[i]));
    memset(r->dev.points, 0, sizeof r->dev.points);
    if (r->dev.stream) {
        mt__scratch_arena_free(r);
        MT_CUDA_CHECK(cudaStreamDestroy(mt__stream(r)));
    }
    r->dev.stream = NULL;
}
// the timeline's device clock: a pool of timed CUDA events per span log (one log per rank, used
// by that rank's thread only). The first mark also records `base` and waits for it, pairing one
// device instant with one host time; a mark's time is then base_seconds + (mark - base), the GPU
// measuring the difference (cudaEventElapsedTime, ~0.5 us resolution). Events on the rank's
// stream and on its communicators' streams share the GPU's clock.
typedef struct {
    cudaEvent_t base;
    double base_seconds;
    cudaEvent_t *events;
    int n, cap;             // marks since the last resolve; events created
} mt__device_clock;
int mt_device_mark(mt_span_log *log, void *stream) {
    if (!log || !log->enabled) return -1;
    mt__device_clock *c = (mt__device_clock *)log->device_clock;
    if (!c) {
        c = (mt__device_clock *)mt_calloc(1, sizeof *c, "timeline clock");
        MT_CUDA_CHECK(cudaEventCreate(&c->base));
        MT_CUDA_CHECK(cudaEventRecord(c->base, (cudaStream_t)stream));
        MT_CUDA_CHECK(cudaEventSynchronize(c->base));
        c->base_seconds = mt_time_seconds();
        log->device_clock = c;
    }
    if (c->n == c->cap) {
        int cap = c->cap ? 2 * c->cap : 256;
        c->events = (cudaEvent_t *)mt_realloc(c->events, (size_t)cap * sizeof(cudaEvent_t), "timeline events");
        for (int i = c->cap; i < cap; i++) MT_CUDA_CHECK(cudaEventCreate(&c->events[i]));
        c->cap = cap;
    }
    MT_CUDA_CHECK(cudaEventRecord(c->events[c->n], (cudaStream_t)stream));
    return c->n++;
}
static double mt__mark_seconds(mt__device_clock *c, int mark) {
    float ms = 0.0f;
    MT_CUDA_CHECK(cudaEventSynchronize(c->events[mark]));
    MT_CUDA_CHECK(cudaEventElapsedTime(&ms, c->base, c->events[mark]));
    return c->base_seconds + ms / 1000.0;
}
void mt_device_marks_resolve(mt_span_log *log) {
    mt__device_clock *c = (mt__device_clock *)log->device_clock;
    if (!c || c->n == 0) return;
    for (size_t i = 0; i < log->n; i++) {
        mt_span *s = &log->spans[i];
        if (s->mark0 >= 0 && s->mark0 < c->n) s->t0 = mt__mark_seconds(c, s->mark0);
        if (s->mark1 >= 0 && s->mark1 < c->n) s->t1 = mt__mark_seconds(c, s->mark1);
        s->mark0 = s->mark1 = -1;
    }
    c->n = 0;   // the events are reused by the next iteration's marks
}
void mt_device_clock_free(mt_span_log *log) {
    mt__device_clock *c = (mt__device_clock *)log->device_clock;
    if (!c) return;
    for (int i = 0; i < c->cap; i++) MT_CUDA_CHECK(cudaEventDestroy(c->events[i]));
    MT_CUDA_CHECK(cudaEventDestroy(c->base));
    free(c->events);
    free(c);
    log->device_clock = NULL;
}
// bytes in use on this rank's GPU (CUDA context included), as cudaMemGetInfo sees them
int mt_device_memory_in_use(mt_rank *r, double *used_gib, double *total_gib) {
    (void)r;
    size_t free_b = 0, total_b = 0;
    MT_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    *used_gib = (double)(total_b - free_b) / (1 << 30);
    *total_gib = (double)total_b / (1 << 30);
    return 1;
}
// the memory plan's device terms (megatron.h section 3 says what they are). The rung is the one
// mt_device_init takes, from the flags and this GPU: the plan can ask before any rank has a device
// (--dry-run on a machine without one plans for an H100/H200, as the CPU build counts)
static mt_gemm_impl mt__planned_rung(const mt_config *cfg) {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
        (void)cudaGetLastError();
        return mt__gpu_rung(cfg);
    }
    return cfg->train.gemm[0] ? mt_gemm_impl_parse(cfg->train.gemm) : mt_gemm_impl_for_precision(cfg->compute_dtype);
}
size_t mt_device_scratch_bytes(const mt_rank *r) {
    return mt_gpu_scratch_peak(r, mt__planned_rung(r->cfg), r->cfg->compute_dtype);
}
// NCCL's own device memory per communicator: its channels' receive buffers for each peer and
// protocol (by default 4 MiB for Simple, about 4.7 MiB for LL128 and 0.5 MiB for LL, per channel
// and peer: NCCL_BUFFSIZE and friends), connected lazily as the collectives first need them, and
// its work queues. It depends on the NCCL version, the topology and how many channels NCCL opens
// (16 to 32 over NVLink), so this is an estimate, NOT yet measured here (no machine of several GPUs
// was lent): a 2-rank ring of about 20 channels, each receiving into 9.2 MiB (the three protocols),
// 185 MiB, rounded up to 200. The memory report's "more since" figure (section 12) shows what NCCL
// took on yours; NCCL_BUFFSIZE and NCCL_MAX_NCHANNELS lower it.
static const size_t MT__NCCL_COMM_BYTES = (size_t)200 << 20;
size_t mt_device_comm_bytes(const mt_rank *r) {
    // the communicators mt_groups_init joins with NCCL (section 2): tp, dp, embd, p2p
    int comms = (r->ps.tp_size > 1) + (r->ps.dp_size > 1) + (r->ps.in_embedding_group != 0) + (r->ps.pp_size > 1);
    return (size_t)comms * MT__NCCL_COMM_BYTES;
}
// the rank's device memory now: our cudaMalloc'd blocks (the tally above), the kernel scratch
// (the arena's bookkeeping, section 1, and the stream-ordered pool's figures: its high-water marks
// count since the device was set up), the whole GPU's
int mt_device_memory_measure(mt_rank *r, mt_device_memory *m) {
    memset(m, 0, sizeof *m);
    MT_CUDA_CHECK(cudaStreamSynchronize(mt__stream(r)));   // every borrowed block given back
    m->allocated = mt__device_bytes;
    m->allocated_peak = mt__device_bytes_peak;
    // the kernel scratch: what the arena lends (its top now, its high-water mark) and what the
    // pool lent past it (the fallback), added: the most lent is then at least the most borrowed at
    // once, exactly that where the pool lent nothing. The backing memory: the whole arena (made
    // once, not in the tally: counted here only) and what the pool keeps
    cudaMemPool_t pool;
    MT_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, r->dev.device));
    uint64_t used = 0, used_high = 0, reserved = 0, reserved_high = 0;
    MT_CUDA_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used));
    MT_CUDA_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &used_high));
    MT_CUDA_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved));
    MT_CUDA_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &reserved_high));
    m->scratch_used = mt__scratch.top + (size_t)used;
    m->scratch_used_peak = mt__scratch.high + (size_t)used_high;
    m->scratch_arena_peak = mt__scratch.high;
    m->scratch_reserved = mt__scratch.bytes + (size_t)reserved;
    m->scratch_reserved_peak = mt__scratch.bytes + (size_t)reserved_high;
    // the graph memory pool: a launcher's fallback inside a recorded CUDA graph (below) is an
    // allocation of the graph's own pool, in the graph allocator's granularity (it held 160 MiB
    // for GPT-2 small at B = 16 when every piece was one, measured on an H200). With the arena a
    // training chunk records none (MT_GRAPH_STATS=1 counts them) and this is 0; a generator's
    // decode step may record some. The backing memory counts it too: now, added; at most, the
    // peak above or what is held now with the graphs' on top
    uint64_t g = 0, g_high = 0;
    MT_CUDA_CHECK(cudaDeviceGetGraphMemAttribute(r->dev.device, cudaGraphMemAttrReservedMemCurrent, &g));
    MT_CUDA_CHECK(cudaDeviceGetGraphMemAttribute(r->dev.device, cudaGraphMemAttrReservedMemHigh, &g_high));
    if (m->scratch_reserved + (size_t)g_high > m->scratch_reserved_peak)
        m->scratch_reserved_peak = m->scratch_reserved + (size_t)g_high;
    m->scratch_reserved += (size_t)g;
    m->context = r->dev.context_bytes;
    size_t free_b = 0, total_b = 0;
    MT_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    m->in_use = total_b - free_b;
    m->total = total_b;
    return 1;
}
// CUDA graphs: the rank's stream is captured in thread-local mode (other rank threads keep
// launching on their own streams meanwhile); a graph is instantiated once and replayed. Inside it
// the kernels launched through mt__launch get programmatic dependent launch (section 1), unless
// MT_PDL=0.
// The launchers' scratch comes from the rank's arena (section 1): host bookkeeping, so a recorded
// launcher leaves only its kernels in the graph, with the arena's addresses in their arguments;
// a replay reuses the same bytes in stream order as the queued ops around it do. Only a fallback
// (a piece the arena cannot serve) records a cudaMallocAsync, which becomes an allocation of the
// graph's own memory pool (the CUDA programming guide, "graph memory nodes"), not of the
// stream-ordered pool that served the same piece while it ran as queued. So after a plain capture
// (a training step's chunk, replayed every step from then on) the stream-ordered pool gives back
// what no allocation holds (with the arena, little or nothing), and the two pools do not both
// keep a fallback's pieces; mt_device_memory_measure counts both. (A decode step's capture keeps
// it: the next prompt's prefill borrows from that pool again.)
void mt_device_capture_begin(mt_rank *r, int decode) {
    mt__capturing_plain = !decode;
    const char *env = getenv("MT_CUDA_GRAPH");
    mt__capturing = !(env && atoi(env) == 0) && !mt__profile_on() && !mt__sync_debug();
    if (mt__capturing) MT_CUDA_CHECK(cudaStreamBeginCapture(mt__stream(r), cudaStreamCaptureModeThreadLocal));
    const char *pdl = getenv("MT_PDL");   // MT_PDL=0: the step's kernels one after another, as outside a graph
    mt__pdl_on = mt__capturing && !(pdl && atoi(pdl) == 0);
}
// MT_GRAPH_STATS=1: one line per recorded graph: its nodes by type and its edges, how many of them
// programmatic (a kernel that may start behind the one ahead). A memset or copy between two
// kernels is a node of its own, and the edge into the next kernel is then a full one; so is a
// launcher's fallback allocation and free (section 1: the arena serves the training chunks, whose
// graphs should show none; a generator's decode step, which has no arena, may).
static void mt__graph_stats(cudaGraph_t graph, int decode) {
    size_t n = 0, e = 0;
    MT_CUDA_CHECK(cudaGraphGetNodes(graph, NULL, &n));
    MT_CUDA_CHECK(cudaGraphGetEdges(graph, NULL, NULL, NULL, &e));
    cudaGraphNode_t *nodes = (cudaGraphNode_t *)mt_malloc((n + 1) * sizeof *nodes, "graph nodes");
    cudaGraphNode_t *from = (cudaGraphNode_t *)mt_malloc((e + 1) * sizeof *from, "graph edges");
    cudaGraphNode_t *to = (cudaGraphNode_t *)mt_malloc((e + 1) * sizeof *to, "graph edges");
    cudaGraphEdgeData *data = (cudaGraphEdgeData *)mt_malloc((e + 1) * sizeof *data, "graph edges");
    MT_CUDA_CHECK(cudaGraphGetNodes(graph, nodes, &n));
    MT_CUDA_CHECK(cudaGraphGetEdges(graph, from, to, data, &e));
    size_t kernels = 0, allocs = 0, frees = 0, memsets = 0, copies = 0, programmatic = 0, kernel_to_kernel = 0;
    for (size_t i = 0; i < n; i++) {
        cudaGraphNodeType t;
        MT_CUDA_CHECK(cudaGraphNodeGetType(nodes[i], &t));
        kernels += t == cudaGraphNodeTypeKernel;
        allocs += t == cudaGraphNodeTypeMemAlloc;
        frees += t == cudaGraphNodeTypeMemFree;
        memsets += t == cudaGraphNodeTypeMemset;
        copies += t == cudaGraphNodeTypeMemcpy;
    }
    for (size_t i = 0; i < e; i++) {
        cudaGraphNodeType a, b;
        MT_CUDA_CHECK(cudaGraphNodeGetType(from[i], &a));
        MT_CUDA_CHECK(cudaGraphNodeGetType(to[i], &b));
        kernel_to_kernel += a == cudaGraphNodeTypeKernel && b == cudaGraphNodeTypeKernel;
        programmatic += data[i].type == cudaGraphDependencyTypeProgrammatic;
    }
    fprintf(stderr, "graph (%s): %zu nodes (%zu kernels, %zu allocations, %zu frees, %zu memsets, %zu copies), "
            "%zu edges (%zu kernel to kernel, %zu programmatic)\n", decode ? "decode step" : "training chunk", n,
            kernels, allocs, frees, memsets, copies, e, kernel_to_kernel, programmatic);
    free(nodes); free(from); free(to); free(data);
}
void *mt_device_capture_end(mt_rank *r) {
    if (!mt__capturing) return NULL;
    mt__capturing = 0;
    mt__pdl_on = 0;
    cudaGraph_t graph;
    MT_CUDA_CHECK(cudaStreamEndCapture(mt__stream(r), &graph));
    const char *stats = getenv("MT_GRAPH_STATS");
    if (stats && atoi(stats) == 1) mt__graph_stats(graph, !mt__capturing_plain);
    cudaGraphExec_t exec;
    MT_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    MT_CUDA_CHECK(cudaGraphDestroy(graph));
    if (mt__capturing_plain) {
        cudaMemPool_t pool;
        MT_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, r->dev.device));
        MT_CUDA_CHECK(cudaMemPoolTrimTo(pool, 0));   // (only what no allocation holds now)
    }
    return (void *)exec;
}
void mt_device_graph_launch(mt_rank *r, void *graph) {
    if (graph) MT_CUDA_CHECK(cudaGraphLaunch((cudaGraphExec_t)graph, mt__stream(r)));
}
void mt_device_graph_free(void *graph) {
    if (graph) MT_CUDA_CHECK(cudaGraphExecDestroy((cudaGraphExec_t)graph));
}
// kernels load on their first launch (CUDA's lazy loading) and a decode step's graph is recorded on
// its first run: a first run costs more than the next
int mt_device_first_run_costs(const mt_rank *r) { (void)r; return 1; }
// points in the stream: CUDA events without timing (the cheapest kind), made at first use. Waiting
// for one spins on the host (the default), which wakes within a microsecond or two of the point.
void mt_device_point(mt_rank *r, int i) {
    if (!r->dev.points[i]) {
        cudaEvent_t e;
        MT_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
        r->dev.points[i] = (void *)e;
    }
    MT_CUDA_CHECK(cudaEventRecord((cudaEvent_t)r->dev.points[i], mt__stream(r)));
}
void mt_device_point_wait(mt_rank *r, int i) {
    if (r->dev.points[i]) MT_CUDA_CHECK(cudaEventSynchronize((cudaEvent_t)r->dev.points[i]));
    r->dev.point_done[i] = mt_time_seconds();
}
double mt_device_point_done(const mt_rank *r, int i) { return r->dev.point_done[i]; }
// the GPU build computes in what --fp32 / --bf16 / --fp16 say (the GEMM rung follows, see
// mt_gemm_impl_for_precision): nothing to refuse, nothing to note
void mt_device_check_precision(const mt_config *cfg) { (void)cfg; }

#endif /* MT_KERNELS_CUH */

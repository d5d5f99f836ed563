// What a decode step's kernel boundary costs, and whether a counter in memory can do a boundary's
// job for less (issue 13: a batch-1 token is ~77 kernels of ~3.3 us each, at a quarter of the
// weights' HBM time, so the boundaries are the step).
//
// A chain of K kernels shaped as a decode layer's GEMVs: kernel i reads the whole vector kernel
// i-1 wrote (as a GEMV reads its input row), its blocks' 8 "weight" rows of that length each (bf16,
// 12 or 48 KB a block, loaded before any wait, as the decode GEMV does), and writes 8 values a
// block. Even kernels: 768 in, 384 blocks, 3,072 out (fc's shape); odd: 3,072 in, 96 blocks, 768
// out (fc proj's). All K in one CUDA graph, replayed; per boundary = the replay's time / K. Forms:
//   0 plain  launches without programmatic launch: each kernel starts when the one ahead has ended
//   1 pdl    programmatic launch; weights loaded, then griddepcontrol.wait, then launch_dependents
//            (megatron.h's decode step today: kernels.cuh, mt__pdl_start)
//   2 flag   programmatic launch; weights loaded, then thread 0 spins on a counter in global memory
//            until the kernel ahead's blocks have all added 1 to it after their writes (a release
//            add, an acquire load: mt__grid_sync's pattern), then launch_dependents; no
//            griddepcontrol.wait. Safe from deadlock: a kernel is launched only once every block of
//            the one ahead has run launch_dependents, so that one is wholly resident already.
//   3 persistent  the whole chain as one cooperative kernel, a grid-wide barrier between phases
//            (the one-kernel decode step's mechanism, without its other costs), each block asking
//            L2 for its next weights before it waits
// and, to take the link apart:
//   4, 5, 7, 8  the floor: empty kernels (wait, launch the next, 8 values a block from the input)
//            with programmatic launch at the chain's grids, 1, 132 and 264 blocks; 9 without it
//   6        form 1 with every kernel's weights the same 4.7 MB (in L2 after the first)
//   10       form 1 timed: thread 0 of each block reads the global timer at its start, when its
//            weights are in registers, when its wait returns and at its end, and the SM clock in
//            its body (input used, block sum); medians of each interval over the chain printed
//   11, 12   the next kernel launched at the start of this one (launch_dependents before the
//            weights' loads: they stream in while the kernel ahead still runs); 12 timed
//   13       form 10 with the weights in L2
// Each replay first sets the counters to 0 and every intermediate vector to NaN (one fill kernel,
// whose own time is measured alone and taken off every form's figure), so a kernel that read its
// input before the writer finished would carry a NaN to the end: forms 0-3 must end with the same
// finite bits. (Form 3 does not, on an H200, 2026-12-04, although every form runs the same
// chain_body: not chased, as its time rules it out. The floor's outputs are not compared.)
// Results: docs/perf.md, session 45.
//   nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -o tests/gpu/boundary_bench tests/gpu/boundary_bench.cu
//   ./tests/gpu/boundary_bench [K]
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <cmath>
#include <vector>
#include <algorithm>

#define CHECK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(1); } } while (0)

__device__ static inline float bf16_to_float(uint16_t h) { return __uint_as_float((unsigned)h << 16); }

// virtual block vb of a chain kernel: its 8 weight rows (wv, loaded), the input vector, 8 outputs
__device__ static inline unsigned long long global_ns(void);
template <int NIN>
__device__ static void chain_body(int vb, const uint4 *wv, const float *in, float *out, float *part,
                                  unsigned long long *t_in = nullptr, unsigned long long *t_red = nullptr) {
    constexpr int PER = NIN * 8 * 2 / 16 / 256;
    const int tid = threadIdx.x;
    // weight piece p of thread tid holds row r = (tid + 256 p) / (NIN / 8), values k0 .. k0 + 7
    float acc = 0.0f;
#pragma unroll
    for (int p = 0; p < PER; p++) {
        int piece = tid + 256 * p, k0 = (piece % (NIN / 8)) * 8;
        const uint16_t *h = (const uint16_t *)&wv[p];
        float4 a = *(const float4 *)(in + k0), b = *(const float4 *)(in + k0 + 4);
        acc += bf16_to_float(h[0]) * a.x + bf16_to_float(h[1]) * a.y + bf16_to_float(h[2]) * a.z +
               bf16_to_float(h[3]) * a.w + bf16_to_float(h[4]) * b.x + bf16_to_float(h[5]) * b.y +
               bf16_to_float(h[6]) * b.z + bf16_to_float(h[7]) * b.w;
    }
    if (t_in) *t_in = acc == 12345.0f ? 0ull : clock64();   // (after the products: the input has arrived)
    // the block's sum in a fixed order (the same bits in every form), then 8 outputs
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (tid % 32 == 0) part[tid / 32] = acc;
    __syncthreads();
    if (t_red) *t_red = clock64();
    if (tid < 8) {
        float s = 0.0f;
        for (int j = 0; j < 8; j++) s += part[j];
        out[vb * 8 + tid] = 0.5f * tanhf(s) + 0.01f * (float)tid;
    }
    __syncthreads();   // (part is reused by the next virtual block)
}
template <int NIN>
__device__ static void load_weights(uint4 *wv, const uint16_t *w, int vb) {
    constexpr int PER = NIN * 8 * 2 / 16 / 256;
    const uint4 *wb = (const uint4 *)(w + (size_t)vb * 8 * NIN);
#pragma unroll
    for (int p = 0; p < PER; p++) wv[p] = wb[threadIdx.x + 256 * p];
}
// form "pdl, timed": form 1 with the global timer read by thread 0 of every block at its start,
// when its weights have arrived, when its wait returns, and at its end: stamps[kernel][block][4]
__device__ unsigned long long *g_stamps;
__device__ static inline unsigned long long global_ns(void) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
template <int MODE, int NIN>
__global__ void __launch_bounds__(256) chain_kernel(const float *in, float *out, const uint16_t *w, unsigned *flags,
                                                    int i, unsigned blocks_ahead) {
    constexpr int PER = NIN * 8 * 2 / 16 / 256;   // 16-byte pieces of the block's 8 weight rows a thread
    __shared__ float part[8];
    uint4 wv[PER];
    constexpr bool TIMED = MODE == 5 || MODE == 7, EARLY = MODE == 6 || MODE == 7;
    unsigned long long t0 = 0, t1 = 0, t2 = 0;
    if (TIMED) t0 = global_ns();
    // forms 6 and 7: the next kernel may launch as soon as every block of this one has started
    // (its weights then stream in while this one still waits for the kernel ahead)
    if (EARLY) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    load_weights<NIN>(wv, w, blockIdx.x);   // before any wait: not written by the chain
    if (TIMED) {   // (the weights used, so that the time is after they arrived)
        unsigned x = 0;
#pragma unroll
        for (int p = 0; p < PER; p++) x ^= wv[p].x ^ wv[p].w;
        if (x == 0x9e3779b9u) flags[0] = x;
        t1 = global_ns();
    }
    if (MODE == 1 || MODE >= 5) asm volatile("griddepcontrol.wait;" ::: "memory");
    unsigned long long c2 = 0;
    if (TIMED) { t2 = global_ns(); c2 = clock64(); }
    if (MODE == 2 && i > 0) {
        if (threadIdx.x == 0) {
            unsigned seen;
            for (;;) {
                asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(flags + i - 1) : "memory");
                if (seen >= blocks_ahead) break;
                __nanosleep(32);   // (as mt__grid_sync: hundreds of blocks polling one line flat out slow L2)
            }
        }
        __syncthreads();
    }
    if (MODE >= 1 && !EARLY) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    unsigned long long t_in = 0, t_red = 0;
    if (TIMED) chain_body<NIN>(blockIdx.x, wv, in, out, part, &t_in, &t_red);
    else chain_body<NIN>(blockIdx.x, wv, in, out, part);
    if (TIMED && threadIdx.x == 0) {
        unsigned long long *st = g_stamps + ((size_t)i * 384 + blockIdx.x) * 8;
        st[0] = t0; st[1] = t1; st[2] = t2; st[3] = global_ns(); st[4] = t_in; st[5] = t_red;
        st[6] = c2; st[7] = clock64();   // (4 to 7: SM cycles)
    }
    if (MODE == 2 && threadIdx.x == 0)   // (chain_body ends with __syncthreads: the block's writes, then the add)
        asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(flags + i) : "memory");
}
// form 3: the whole chain as one persistent kernel (a cooperative launch, every block resident):
// phase i's virtual blocks shared out over the grid, a grid-wide barrier between phases (the
// one-kernel decode step's mt__grid_sync), each block's next weights asked of L2 before it waits
__device__ static void grid_barrier(unsigned *count, unsigned target) {
    __syncthreads();
    if (threadIdx.x == 0) {
        asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(count) : "memory");
        unsigned seen;
        for (;;) {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(count) : "memory");
            if (seen >= target) break;
            __nanosleep(32);
        }
    }
    __syncthreads();
}
__device__ static void prefetch_rows(const uint16_t *w, int nin, int nblocks) {
    if (threadIdx.x != 0) return;
    for (int vb = blockIdx.x; vb < nblocks; vb += gridDim.x)
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(w + (size_t)vb * 8 * nin),
                     "r"((unsigned)(8 * nin * 2)) : "memory");
}
__global__ void __launch_bounds__(256) persistent_kernel(float *const *v, const uint16_t *w, size_t nw, unsigned *count,
                                                         int K) {
    __shared__ float part[8];
    prefetch_rows(w, 768, 384);
    for (int i = 0; i < K; i++) {
        const uint16_t *wi = w + nw * (size_t)i;
        if (i % 2 == 0) {
            for (int vb = blockIdx.x; vb < 384; vb += gridDim.x) {
                uint4 wv[3];
                load_weights<768>(wv, wi, vb);
                chain_body<768>(vb, wv, v[i], v[i + 1], part);
            }
            if (i + 1 < K) prefetch_rows(wi + nw, 3072, 96);
        } else {
            for (int vb = blockIdx.x; vb < 96; vb += gridDim.x) {
                uint4 wv[12];
                load_weights<3072>(wv, wi, vb);
                chain_body<3072>(vb, wv, v[i], v[i + 1], part);
            }
            if (i + 1 < K) prefetch_rows(wi + nw, 768, 384);
        }
        grid_barrier(count, (unsigned)(i + 1) * gridDim.x);
    }
}
// the floor: the same grids with no work (wait, launch the next, 8 values a block written from the
// input), with programmatic launch; BLOCKS 0: the chain's grids, else that many blocks
template <int BLOCKS>
__global__ void __launch_bounds__(256) empty_kernel(const float *in, float *out) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    if (threadIdx.x < 8) out[blockIdx.x * 8 + threadIdx.x] = in[threadIdx.x] + 1.0f;
}
// the replay's first node: the counters to 0, every intermediate vector to NaN
__global__ void fill_kernel(float *const *v, int K, unsigned *flags) {
    for (int i = 1 + blockIdx.x; i <= K; i += gridDim.x)
        for (int j = threadIdx.x; j < 3072; j += blockDim.x) v[i][j] = __int_as_float(0x7fffffff);
    if (blockIdx.x == 0)
        for (int i = threadIdx.x; i < K; i += blockDim.x) flags[i] = 0;
}
// a launch of `blocks` blocks of 256 threads on s, with programmatic launch or without (attr: the
// caller's, alive until the launch)
static cudaLaunchConfig_t chain_config(unsigned blocks, cudaStream_t s, cudaLaunchAttribute *attr, int programmatic) {
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(blocks);
    config.blockDim = dim3(256);
    config.stream = s;
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    config.attrs = attr;
    config.numAttrs = programmatic ? 1 : 0;
    return config;
}
template <int MODE>
static void launch(int i, const float *in, float *out, const uint16_t *w, unsigned *flags, cudaStream_t s) {
    int even = i % 2 == 0;
    cudaLaunchAttribute attr[1];   // (the first waits for the fill kernel to end)
    cudaLaunchConfig_t config = chain_config(even ? 384 : 96, s, attr, MODE >= 1 && i > 0);
    unsigned ahead = even ? 96u : 384u;
    if (even) CHECK(cudaLaunchKernelEx(&config, chain_kernel<MODE, 768>, in, out, w, flags, i, ahead));
    else CHECK(cudaLaunchKernelEx(&config, chain_kernel<MODE, 3072>, in, out, w, flags, i, ahead));
}

int main(int argc, char **argv) {
    int K = argc > 1 ? atoi(argv[1]) : 60;
    if (K < 2 || K % 2) { fprintf(stderr, "K: an even number >= 2\n"); return 2; }
    // vectors: v[0] (768, the input, fixed), then v[i+1] = kernel i's output (3072 or 768)
    std::vector<float *> v(K + 1);
    for (int i = 0; i <= K; i++) CHECK(cudaMalloc(&v[i], 3072 * sizeof(float)));
    std::vector<float> x0(768);
    for (int k = 0; k < 768; k++) x0[k] = sinf(0.1f * (float)k);
    CHECK(cudaMemcpy(v[0], x0.data(), 768 * sizeof(float), cudaMemcpyHostToDevice));
    // weights: 384 blocks x 8 rows x 768 = 96 blocks x 8 x 3072 = 2.36 M bf16 a kernel, a copy each
    size_t nw = (size_t)384 * 8 * 768;
    uint16_t *w;
    CHECK(cudaMalloc(&w, nw * 2 * (size_t)K));
    std::vector<uint16_t> hw(nw * (size_t)K);
    uint32_t st = 12345;
    for (size_t j = 0; j < hw.size(); j++) {
        st = st * 1664525u + 1013904223u;
        float f = ((float)(st >> 8) / 16777216.0f - 0.5f) * 0.1f;
        uint32_t b;
        memcpy(&b, &f, 4);
        hw[j] = (uint16_t)(b >> 16);
    }
    CHECK(cudaMemcpy(w, hw.data(), hw.size() * 2, cudaMemcpyHostToDevice));
    unsigned *flags;
    CHECK(cudaMalloc(&flags, K * sizeof(unsigned)));
    unsigned long long *stamps;
    CHECK(cudaMalloc(&stamps, (size_t)K * 384 * 8 * 8));
    CHECK(cudaMemset(stamps, 0, (size_t)K * 384 * 8 * 8));
    CHECK(cudaMemcpyToSymbol(g_stamps, &stamps, sizeof stamps));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const char *names[14] = {"plain (no programmatic launch)", "pdl (griddepcontrol.wait)", "flag (a counter in memory)",
                            "persistent (one kernel, barriers)", "floor: empty pdl, the same grids", "floor: empty pdl, 1 block",
                            "pdl, weights in L2 (one copy)", "floor: empty pdl, 132 blocks",
                            "floor: empty pdl, 264 blocks", "floor: empty, no pdl, the same grids",
                            "pdl, timed (form 1 with clock reads)", "pdl, the next launched at the start",
                            "pdl, the next launched at the start, timed", "pdl, timed, weights in L2"};
    std::vector<float> result[14];
    float **d_v;   // the vectors' addresses, for the persistent kernel
    CHECK(cudaMalloc(&d_v, (K + 1) * sizeof(float *)));
    CHECK(cudaMemcpy(d_v, v.data(), (K + 1) * sizeof(float *), cudaMemcpyHostToDevice));
    int per_sm = 0, sms = 0, dev = 0;
    CHECK(cudaGetDevice(&dev));
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, persistent_kernel, 256, 0));
    int grid = sms * (per_sm < 2 ? per_sm : 2);
    printf("chain of %d kernels (384 blocks 768 -> 3072, then 96 blocks 3072 -> 768), one CUDA graph\n", K);
    float fill_us = 0.0f;   // the fill kernel's graph alone, taken off the forms' replays
    for (int mode = -1; mode < 14; mode++) {
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        fill_kernel<<<64, 256, 0, s>>>(d_v, K, flags);
        CHECK(cudaGetLastError());
        if (mode == 3) {   // one cooperative launch (its blocks all resident), the counter reset above
            cudaLaunchConfig_t config = {};
            config.gridDim = dim3(grid);
            config.blockDim = dim3(256);
            config.stream = s;
            cudaLaunchAttribute attr[1];
            attr[0].id = cudaLaunchAttributeCooperative;
            attr[0].val.cooperative = 1;
            config.attrs = attr;
            config.numAttrs = 1;
            CHECK(cudaLaunchKernelEx(&config, persistent_kernel, (float *const *)d_v, (const uint16_t *)w, nw, flags, K));
        }
        for (int i = 0; i < K && (mode == 4 || mode == 5 || (mode >= 7 && mode <= 9)); i++) {   // the floor
            cudaLaunchAttribute attr[1];
            unsigned blocks = mode == 5 ? 1 : mode == 7 ? 132 : mode == 8 ? 264 : i % 2 == 0 ? 384 : 96;
            cudaLaunchConfig_t config = chain_config(blocks, s, attr, i > 0 && mode != 9);
            CHECK(cudaLaunchKernelEx(&config, empty_kernel<0>, (const float *)v[i], v[i + 1]));
        }
        for (int i = 0; i < K && mode >= 0 && (mode < 3 || mode == 6 || mode >= 10); i++) {
            const uint16_t *wi = w + nw * (size_t)(mode == 6 || mode == 13 ? 0 : i);
            if (mode == 0) launch<0>(i, v[i], v[i + 1], wi, flags, s);
            else if (mode == 10 || mode == 13) launch<5>(i, v[i], v[i + 1], wi, flags, s);
            else if (mode == 11) launch<6>(i, v[i], v[i + 1], wi, flags, s);
            else if (mode == 12) launch<7>(i, v[i], v[i + 1], wi, flags, s);
            else if (mode == 1 || mode == 6) launch<1>(i, v[i], v[i + 1], wi, flags, s);
            else launch<2>(i, v[i], v[i + 1], wi, flags, s);
        }
        CHECK(cudaStreamEndCapture(s, &graph));
        CHECK(cudaGraphInstantiate(&exec, graph, 0));
        for (int r = 0; r < 3; r++) CHECK(cudaGraphLaunch(exec, s));   // warm
        CHECK(cudaStreamSynchronize(s));
        cudaEvent_t a, b;
        CHECK(cudaEventCreate(&a));
        CHECK(cudaEventCreate(&b));
        std::vector<float> t;
        for (int r = 0; r < 20; r++) {
            CHECK(cudaEventRecord(a, s));
            CHECK(cudaGraphLaunch(exec, s));
            CHECK(cudaEventRecord(b, s));
            CHECK(cudaEventSynchronize(b));
            float ms;
            CHECK(cudaEventElapsedTime(&ms, a, b));
            t.push_back(ms);
        }
        std::sort(t.begin(), t.end());
        CHECK(cudaEventDestroy(a));
        CHECK(cudaEventDestroy(b));
        CHECK(cudaGraphExecDestroy(exec));
        CHECK(cudaGraphDestroy(graph));
        if (mode < 0) {
            fill_us = 1e3f * t[10];
            printf("  %-32s replay %8.1f us (taken off the rows below)\n", "the fill kernel alone", fill_us);
            continue;
        }
        if (mode == 10 || mode == 12 || mode == 13) {   // the last replay's stamps: medians over kernels 2 .. K-1 of each interval
            std::vector<unsigned long long> st((size_t)K * 384 * 8);
            int khz = 0;
            CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, dev));
            double clock_ghz = khz / 1e6;   // (the phases below from SM cycles at the rated clock)
            CHECK(cudaMemcpy(st.data(), stamps, st.size() * 8, cudaMemcpyDeviceToHost));
            auto blocks = [](int i) { return i % 2 == 0 ? 384 : 96; };
            auto agg = [&](int i, int k, int want_max) {
                unsigned long long r = want_max ? 0ull : ~0ull;
                for (int b = 0; b < blocks(i); b++) {
                    unsigned long long x = st[((size_t)i * 384 + b) * 8 + k];
                    r = want_max ? std::max(r, x) : std::min(r, x);
                }
                return (double)r;
            };
            const char *what[11] = {"first block starts, after the kernel ahead's first wait returned",
                                   "all blocks started (last start - first start)",
                                   "weights in registers (last block's, from its first start)",
                                   "kernel ahead's last end -> first wait returns",
                                   "first wait returns -> last wait returns",
                                   "last wait returns -> last end (the body)",
                                   "one link: first wait returns -> next kernel's first wait returns",
                                   "a block's body (wait returns -> end), the median block",
                                   "  of it: wait returns -> the input read and used",
                                   "  of it: -> the block's sum (shuffles, a barrier)",
                                   "  of it: -> the end (8 outputs written, a barrier)"};
            std::vector<double> d[11];
            for (int i = 2; i < K - 1; i++) {
                d[0].push_back(agg(i, 0, 0) - agg(i - 1, 2, 0));
                d[1].push_back(agg(i, 0, 1) - agg(i, 0, 0));
                d[2].push_back(agg(i, 1, 1) - agg(i, 0, 0));
                d[3].push_back(agg(i, 2, 0) - agg(i - 1, 3, 1));
                d[4].push_back(agg(i, 2, 1) - agg(i, 2, 0));
                d[5].push_back(agg(i, 3, 1) - agg(i, 2, 1));
                d[6].push_back(agg(i + 1, 2, 0) - agg(i, 2, 0));
                std::vector<double> body;
                for (int b = 0; b < blocks(i); b++)
                    body.push_back((double)(st[((size_t)i * 384 + b) * 8 + 3] - st[((size_t)i * 384 + b) * 8 + 2]));
                for (int k = 0; k < 3; k++) {   // the median block's wait -> input in -> reduced -> end
                    static const int from[3] = {6, 4, 5}, to[3] = {4, 5, 7};
                    std::vector<double> ph;
                    for (int b = 0; b < blocks(i); b++)
                        ph.push_back(((double)(st[((size_t)i * 384 + b) * 8 + to[k]]) -
                                      (double)(st[((size_t)i * 384 + b) * 8 + from[k]])) / clock_ghz);
                    std::sort(ph.begin(), ph.end());
                    d[8 + k].push_back(ph[ph.size() / 2]);
                }
                std::sort(body.begin(), body.end());
                d[7].push_back(body[body.size() / 2]);
            }
            for (int k = 0; k < 11; k++) {
                std::vector<double> e, o;   // even kernels (768 -> 3072), odd (3072 -> 768)
                for (size_t j = 0; j < d[k].size(); j++) ((j + 2) % 2 == 0 ? e : o).push_back(d[k][j]);
                std::sort(e.begin(), e.end());
                std::sort(o.begin(), o.end());
                printf("    %-66s  768->3072: %6.0f ns  3072->768: %6.0f ns\n", what[k], e[e.size() / 2], o[o.size() / 2]);
            }
        }
        result[mode].resize(768);
        CHECK(cudaMemcpy(result[mode].data(), v[K], 768 * sizeof(float), cudaMemcpyDeviceToHost));
        int finite = 1;
        for (float f : result[mode]) finite &= std::isfinite(f) ? 1 : 0;
        printf("  %-32s replay %8.1f us (median of 20; %.1f-%.1f)  %6.2f us a kernel  output %s\n", names[mode],
               1e3 * t[10], 1e3 * t[0], 1e3 * t[19], (1e3 * t[10] - fill_us) / K, finite ? "finite" : "NOT FINITE (a race)");
    }
    int same = 1;
    for (int mode = 1; mode < 4; mode++) {
        int m = memcmp(result[0].data(), result[mode].data(), 768 * 4) == 0;
        if (!m) printf("  %s differs from the plain form\n", names[mode]);
        same &= m;
    }
    printf("%s: the four forms end with the same bits (the persistent kernel: %d blocks)\n", same ? "OK" : "NOT OK", grid);
    return same ? 0 : 1;
}

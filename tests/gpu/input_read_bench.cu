// How long a decode GEMV's read of its input row takes, four ways (issue 13; docs/perf.md, session 47).
// Every block is released at the same global-timer tick, then reads a C-float input as the decode
// GEMV (kernels.cuh, mt_matmul_kernel6_gemv_mma) does: 8 warps, lanes 0-3 of a warp 8 floats a k
// step, the warp's steps issued together; then sums it and reduces over the block. Thread 0's SM
// clock from the release to the block's sum, medians over 25 launches x every block:
//   mode 0  every block reads the same input (the GEMV in a decode step)
//   mode 1  each block its own copy (all in L2): is mode 0 slowed by every block asking L2 for
//           the same lines at once? (On an H200, 2026-12-05: no.)
//   mode 2/3  a cluster of 8: block r reads the r-th eighth and stores it into all 8 blocks' shared
//           memory (DSMEM), a cluster barrier, then the block reads shared memory (2: the same
//           input for every cluster, 3: a copy per cluster)
//   mode 4  a cluster of 8: block r's thread 0 copies the r-th eighth with one bulk copy multicast
//           to the cluster, each block waits on its mbarrier (what the decode GEMV does since)
//   make tests/gpu/input_read_bench
//   ./tests/gpu/input_read_bench
#include <cuda_runtime.h>
#include <cooperative_groups.h>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
namespace cg = cooperative_groups;
#define CHECK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); exit(1); } } while (0)
__device__ static inline unsigned long long gns(void) { unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }
__device__ static inline void release_at(unsigned long long t0) {
    if (threadIdx.x == 0) while (gns() < t0) { }
    __syncthreads();
}
template <int C>
__device__ static float products(const float *x) {   // the GEMV's input pattern, weights = 1
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, t = lane % 4;
    constexpr int STEPS = C / 32 / 8;
    float4 a[STEPS], b[STEPS];
    #pragma unroll
    for (int i = 0; i < STEPS; i++) {
        int k = 32 * (warp + 8 * i) + 8 * t;
        if (lane < 4) { a[i] = *(const float4 *)(x + k); b[i] = *(const float4 *)(x + k + 4); }
        else { a[i] = make_float4(0, 0, 0, 0); b[i] = a[i]; }
    }
    float s = 0.f;
    #pragma unroll
    for (int i = 0; i < STEPS; i++) s += a[i].x + a[i].y + a[i].z + a[i].w + b[i].x + b[i].y + b[i].z + b[i].w;
    return s;
}
__device__ static float block_sum(float s) {
    __shared__ float part[8];
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = s;
    __syncthreads();
    float t = 0.f;
    for (int j = 0; j < 8; j++) t += part[j];
    return t;
}
template <int C, int MODE>
__global__ void hot(const float *x, float *out, unsigned long long t0, long long *cyc) {
    const float *xb = MODE == 1 ? x + (size_t)blockIdx.x * C : x;
    release_at(t0);
    long long c0 = clock64();
    float s = products<C>(xb);
    float t = block_sum(s);
    long long c1 = clock64();
    if (threadIdx.x == 0) { out[blockIdx.x] = t; cyc[blockIdx.x] = c1 - c0; }
}
template <int C, int MODE>
__global__ void __cluster_dims__(8, 1, 1) hot_cluster(const float *x, float *out, unsigned long long t0, long long *cyc) {
    __shared__ __align__(16) float xs[C];
    __shared__ __align__(8) unsigned long long bar;
    cg::cluster_group cl = cg::this_cluster();
    int rank = cl.block_rank();
    const float *xb = MODE == 3 ? x + (size_t)(blockIdx.x / 8) * C : x;
    uint32_t bar_s = (uint32_t)__cvta_generic_to_shared(&bar), xs_s = (uint32_t)__cvta_generic_to_shared(xs);
    if (MODE == 4 && threadIdx.x == 0) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar_s) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar_s), "r"(C * 4) : "memory");
    }
    cl.sync();   // (before the clock: the barriers are set up ahead of the wait in a real kernel)
    release_at(t0);
    long long c0 = clock64();
    if (MODE == 4) {
        if (threadIdx.x == 0) {
            unsigned bytes = C * 4 / 8;
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1], %2, [%3], %4;"
                         ::"r"(xs_s + rank * bytes), "l"((const char *)xb + rank * bytes), "r"(bytes), "r"(bar_s), "h"((unsigned short)0xff) : "memory");
        }
        uint32_t done = 0;
        while (!done)
            asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0; selp.u32 %0, 1, 0, p; }"
                         : "=r"(done) : "r"(bar_s) : "memory");
    } else {
        // block rank r: floats [r C/8, (r+1) C/8) into every block's xs
        constexpr int PER = C / 8 / 4;   // float4s
        if (threadIdx.x < PER) {
            float4 v = ((const float4 *)(xb + rank * (C / 8)))[threadIdx.x];
            for (int d = 0; d < 8; d++) {
                float4 *dst = (float4 *)cl.map_shared_rank(xs, d);
                dst[rank * PER + threadIdx.x] = v;
            }
        }
        cl.sync();
    }
    float s = products<C>(xs);
    float t = block_sum(s);
    long long c1 = clock64();
    if (threadIdx.x == 0) { out[blockIdx.x] = t; cyc[blockIdx.x] = c1 - c0; }
    if (MODE == 4) cl.sync();   // no block leaves while a copy may still land in it
}
__global__ void now(unsigned long long *t) { *t = gns(); }
template <typename K>
static void run(const char *name, K kernel, int blocks, const float *x, float *out, long long *cyc, unsigned long long *tdev) {
    std::vector<long long> all;
    std::vector<long long> h(blocks);
    float first = 0;
    for (int rep = 0; rep < 30; rep++) {
        unsigned long long t;
        now<<<1, 1>>>(tdev);
        CHECK(cudaMemcpy(&t, tdev, 8, cudaMemcpyDeviceToHost));
        kernel<<<blocks, 256>>>(x, out, t + 200000, cyc);   // released 200 us after now
        CHECK(cudaGetLastError());
        CHECK(cudaDeviceSynchronize());
        CHECK(cudaMemcpy(h.data(), cyc, blocks * 8, cudaMemcpyDeviceToHost));
        if (rep >= 5) all.insert(all.end(), h.begin(), h.end());
        if (rep == 0) CHECK(cudaMemcpy(&first, out, 4, cudaMemcpyDeviceToHost));
    }
    std::sort(all.begin(), all.end());
    size_t n = all.size();
    printf("%-34s blocks %4d  cycles median %6lld p10 %6lld p90 %6lld max %6lld  (us at 1.98 GHz: median %.3f p90 %.3f)  sum %g\n",
           name, blocks, all[n / 2], all[n / 10], all[n * 9 / 10], all[n - 1], all[n / 2] / 1980.0, all[n * 9 / 10] / 1980.0, first);
}
int main() {
    float *x, *out; long long *cyc; unsigned long long *tdev;
    size_t nx = 384 * 3072;
    CHECK(cudaMalloc(&x, nx * 4)); CHECK(cudaMalloc(&out, 8192 * 4)); CHECK(cudaMalloc(&cyc, 8192 * 8)); CHECK(cudaMalloc(&tdev, 8));
    std::vector<float> hx(nx); for (size_t i = 0; i < nx; i++) hx[i] = (float)(i % 7) * 0.25f;
    CHECK(cudaMemcpy(x, hx.data(), nx * 4, cudaMemcpyHostToDevice));
    for (int round = 0; round < 2; round++) {
        printf("round %d (C = 768: fc's input; C = 3072: fc proj's)\n", round);
        run("C768 same input, 1 block", hot<768, 0>, 1, x, out, cyc, tdev);
        run("C768 same input", hot<768, 0>, 96, x, out, cyc, tdev);
        run("C768 same input", hot<768, 0>, 384, x, out, cyc, tdev);
        run("C768 own copy", hot<768, 1>, 384, x, out, cyc, tdev);
        run("C768 cluster DSMEM, same input", hot_cluster<768, 2>, 384, x, out, cyc, tdev);
        run("C768 cluster DSMEM, own copy", hot_cluster<768, 3>, 384, x, out, cyc, tdev);
        run("C768 cluster TMA multicast", hot_cluster<768, 4>, 384, x, out, cyc, tdev);
        run("C3072 same input, 1 block", hot<3072, 0>, 1, x, out, cyc, tdev);
        run("C3072 same input", hot<3072, 0>, 96, x, out, cyc, tdev);
        run("C3072 own copy", hot<3072, 1>, 96, x, out, cyc, tdev);
        run("C3072 cluster DSMEM, same input", hot_cluster<3072, 2>, 96, x, out, cyc, tdev);
        run("C3072 cluster TMA multicast", hot_cluster<3072, 4>, 96, x, out, cyc, tdev);
    }
    return 0;
}

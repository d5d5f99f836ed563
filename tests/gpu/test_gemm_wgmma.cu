// tests/gpu/test_gemm_wgmma.cu - the wgmma GEMM rung (kernels.cuh, mt__gemm_wgmma) against a CPU reference in
// double, then timed beside cuBLAS at GPT-2 small's shapes (B*T = 16k tokens).
// build:  nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -o tests/gpu/test_gemm_wgmma tests/gpu/test_gemm_wgmma.cu -lcublas
// run:    ./tests/gpu/test_gemm_wgmma [--no-timing | --probe]   (prints "N passed, N failed" last;
//         --probe only asks whether this build can run the wgmma rung on this GPU)
//
// Inputs: every element is a function of (seed, storage index): a hash -> an integer in
// [-32768, 32768) -> divided by 32768 -> rounded to bf16 (round to nearest even, the same on host and
// device), so the CPU reference rebuilds any A(i,k) or B(j,k) from its index without copying
// gigabytes back. bf16 x bf16 products (8-bit significands) are exact in fp32.
//
// TOLERANCE. The reference sums the exact products in double. The kernel's only error is fp32
// accumulation (the products are exact): each of the ~K additions rounds by at most 2^-24 of the
// running sum, which is at most S = sum_k |a||b| (+ |c_old| + |bias|). The roundings are
// independent signs, so they add like a random walk: ~ sqrt(K) * 2^-24 * S typically, K * 2^-24 * S
// at worst. We allow  |got - ref| <= 2^-18 * sqrt(K + 1) * S  (64x the random-walk size, room for
// the tensor cores' own rounding inside a k16 step and for the split-K sum; far below the worst case
// only when the worst case is unrealistic). A bug in indexing (a wrong row, a missing k16 slice,
// a wrong swizzle) changes an output by ~ |a||b| * sqrt(16) or more, which for K <= 50304 is
// >= 5x above this bound relative to S.
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cublas_v2.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <stdarg.h>
#include <math.h>
#include <vector>
#include <algorithm>
#include <chrono>

#define MT_WGMMA_HANG_TRAP   // a lost mbarrier phase traps instead of hanging the GPU
#define MEGATRON_IMPLEMENTATION
#include "../../megatron.h"   // kernels.cuh's wgmma rung (mt__gemm_wgmma), MT_CUDA_CHECK, mt_fatal

static int passed = 0, failed = 0;
static void check(int ok, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("%s ", ok ? "PASS" : "FAIL");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    fflush(stdout);
    if (ok) passed++; else failed++;
}

// ---- the inputs: value(seed, index) in [-1, 1), exact in bf16
__host__ __device__ static inline float hval(uint32_t seed, uint64_t idx) {
    uint32_t h = (uint32_t)idx * 0x9E3779B1u ^ (uint32_t)(idx >> 32) * 0x85EBCA77u ^ seed * 0xC2B2AE3Du;
    h ^= h >> 16; h *= 0x85EBCA6Bu; h ^= h >> 13; h *= 0xC2B2AE35u; h ^= h >> 16;
    return (float)((int)(h & 0xFFFF) - 32768) / 32768.0f;
}
static inline float hval_bf16(uint32_t seed, uint64_t idx) { return __bfloat162float(__float2bfloat16(hval(seed, idx))); }
__global__ void fill_bf16_kernel(__nv_bfloat16 *x, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] = __float2bfloat16(hval(seed, i));
}
__global__ void fill_f32_kernel(float *x, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] = hval(seed, i);
}
static void fill_bf16(__nv_bfloat16 *x, size_t n, uint32_t seed) { fill_bf16_kernel<<<1024, 256>>>(x, n, seed); MT_CUDA_CHECK(cudaGetLastError()); }
static void fill_f32(float *x, size_t n, uint32_t seed) { fill_f32_kernel<<<1024, 256>>>(x, n, seed); MT_CUDA_CHECK(cudaGetLastError()); }

// one GEMM problem
struct Prob {
    int M, N, K, lda, ldb, ldc, a_k_inner, b_k_inner, accumulate, has_bias;
    int plan;   // 0: the launcher's choice; S > 0: S k-slices; -1: stream-K
    int force192;   // 1: the 192 x 192 tile (k-outer operands only; else the plan's choice)
    int pingpong;   // -1: the launcher's choice (MT_WGMMA_PINGPONG); 0: never; 1: the ping-pong schedule
                    // wherever it is built (A k inner), with any plan
};
static const uint32_t SEED_A = 11, SEED_B = 22, SEED_C = 33, SEED_BIAS = 44;
static size_t a_elems(const Prob &p) { return p.a_k_inner ? (size_t)p.M * p.lda : (size_t)p.K * p.lda; }
static size_t b_elems(const Prob &p) { return p.b_k_inner ? (size_t)p.N * p.ldb : (size_t)p.K * p.ldb; }
static inline double A_at(const Prob &p, int i, int k) { return hval_bf16(SEED_A, p.a_k_inner ? (size_t)i * p.lda + k : (size_t)k * p.lda + i); }
static inline double B_at(const Prob &p, int j, int k) { return hval_bf16(SEED_B, p.b_k_inner ? (size_t)j * p.ldb + k : (size_t)k * p.ldb + j); }
// reference value of C[i][j] after the GEMM, and the scale S it is checked against
static void ref_at(const Prob &p, int i, int j, double *ref, double *scale) {
    double s = 0.0, sa = 0.0;
    for (int k = 0; k < p.K; k++) {
        double x = A_at(p, i, k) * B_at(p, j, k);
        s += x; sa += fabs(x);
    }
    if (p.has_bias) { double b = hval(SEED_BIAS, j); s += b; sa += fabs(b); }
    if (p.accumulate) { double c = hval(SEED_C, (size_t)i * p.ldc + j); s += c; sa += fabs(c); }
    *ref = s; *scale = sa;
}

struct Dev {
    __nv_bfloat16 *a = NULL, *b = NULL;
    float *c = NULL, *bias = NULL;
    size_t c_elems = 0;
    void alloc(const Prob &p) {
        MT_CUDA_CHECK(cudaMalloc(&a, std::max<size_t>(a_elems(p), 8) * 2));
        MT_CUDA_CHECK(cudaMalloc(&b, std::max<size_t>(b_elems(p), 8) * 2));
        c_elems = (size_t)p.M * p.ldc;
        MT_CUDA_CHECK(cudaMalloc(&c, c_elems * 4));
        MT_CUDA_CHECK(cudaMalloc(&bias, (size_t)p.N * 4));
        fill_bf16(a, a_elems(p), SEED_A);
        fill_bf16(b, b_elems(p), SEED_B);
        fill_f32(bias, p.N, SEED_BIAS);
        reset_c();
    }
    void reset_c() { fill_f32(c, c_elems, SEED_C); }   // C's old values (and the padding beyond N)
    void run(const Prob &p, cudaStream_t s = 0) {
        mt__wgmma_force_192 = p.force192;
        int mode = mt__wgmma_pingpong_mode();
        if (p.pingpong == 0) mt__wgmma_pingpong = 0;
        mt__wgmma_force_pingpong = p.pingpong == 1;
        mt__gemm_wgmma_splits(c, a, b, p.has_bias ? bias : NULL, p.M, p.N, p.K, p.lda, p.ldb, p.ldc, p.a_k_inner,
                              p.b_k_inner, p.accumulate, p.plan, s);
        mt__wgmma_force_192 = 0;
        mt__wgmma_force_pingpong = 0;
        mt__wgmma_pingpong = mode;
    }
    void release() { cudaFree(a); cudaFree(b); cudaFree(c); cudaFree(bias); }
};

static char layout_name[4][8] = {"oo", "oi", "io", "ii"};   // [a_k_inner*2 + b_k_inner]: A then B, i = k inner
static const char *lname(const Prob &p) { return layout_name[p.a_k_inner * 2 + p.b_k_inner]; }

// run p once and compare every output (all = 1) or `samples` of them; also: C's padding untouched
static void check_prob(const Prob &p, int all, int samples, const char *tag) {
    Dev d;
    d.alloc(p);
    d.run(p);
    MT_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<float> got;
    std::vector<std::pair<int, int>> at;
    if (all) {
        got.resize(d.c_elems);
        MT_CUDA_CHECK(cudaMemcpy(got.data(), d.c, d.c_elems * 4, cudaMemcpyDeviceToHost));
    } else {   // corners, then pseudo-random outputs
        int fixed[4][2] = {{0, 0}, {p.M - 1, p.N - 1}, {0, p.N - 1}, {p.M - 1, 0}};
        for (auto &f : fixed) at.push_back({f[0], f[1]});
        for (int s = 0; s < samples; s++)
            at.push_back({(int)(hval(77, 2 * s) * 0.5f * p.M + p.M / 2) % p.M, (int)(hval(77, 2 * s + 1) * 0.5f * p.N + p.N / 2) % p.N});
        for (int s = 0; s < samples / 4; s++)   // and some in the last row and column tiles
            at.push_back({p.M - 1 - s % std::min(p.M, 128), p.N - 1 - (s * 7) % std::min(p.N, 256)});
        got.resize(at.size());
        for (size_t s = 0; s < at.size(); s++)
            MT_CUDA_CHECK(cudaMemcpy(&got[s], d.c + (size_t)at[s].first * p.ldc + at[s].second, 4, cudaMemcpyDeviceToHost));
    }
    double tol_rel = ldexp(1.0, -18) * sqrt((double)p.K + 1.0);
    double worst = 0.0;   // max |err| / S over the checked outputs
    long bad = 0, pad_bad = 0, checked = 0;
    auto one = [&](int i, int j, float g) {
        double ref, scale;
        ref_at(p, i, j, &ref, &scale);
        double err = fabs((double)g - ref), rel = err / (scale > 0 ? scale : 1.0);
        if (!(rel <= tol_rel) && !(err == 0.0)) {
            if (bad < 3) printf("   C[%d][%d] = %.7g, reference %.7g (scale %.3g)\n", i, j, g, ref, scale);
            bad++;
        }
        if (rel > worst || rel != rel) worst = rel;
        checked++;
    };
    if (all) {
        for (int i = 0; i < p.M; i++)
            for (int j = 0; j < p.ldc; j++) {
                float g = got[(size_t)i * p.ldc + j];
                if (j < p.N) one(i, j, g);
                else if (g != hval(SEED_C, (size_t)i * p.ldc + j)) pad_bad++;   // beyond N: must be untouched
            }
    } else {
        for (size_t s = 0; s < at.size(); s++) one(at[s].first, at[s].second, got[s]);
    }
    char plan[24];
    if (p.plan == 0) snprintf(plan, sizeof plan, "auto");
    else if (p.plan < 0) snprintf(plan, sizeof plan, "stream-K");
    else snprintf(plan, sizeof plan, "split %d", p.plan);
    if (p.force192) snprintf(plan + strlen(plan), sizeof plan - strlen(plan), " 192");
    if (p.pingpong >= 0) snprintf(plan + strlen(plan), sizeof plan - strlen(plan), p.pingpong ? " pp" : " coop");
    check(bad == 0 && pad_bad == 0,
          "%-16s %s %-8s M=%-5d N=%-5d K=%-5d lda=%-5d ldb=%-5d ldc=%-5d acc=%d bias=%d: %ld outputs, max |err|/S = %.2e "
          "(tol %.2e)%s",
          tag, lname(p), plan, p.M, p.N, p.K, p.lda, p.ldb, p.ldc, p.accumulate, p.has_bias, checked, worst, tol_rel,
          pad_bad ? " PADDING OVERWRITTEN" : "");
    d.release();
}

// (i, k) storage for the shape: leading dimension = the contiguous extent rounded up to 8, + pad
static Prob make_prob(int M, int N, int K, int a_k_inner, int b_k_inner, int accumulate, int has_bias, int pad, int ldc_pad) {
    auto up8 = [](int x) { return (x + 7) / 8 * 8; };
    Prob p;
    p.M = M; p.N = N; p.K = K;
    p.a_k_inner = a_k_inner; p.b_k_inner = b_k_inner; p.accumulate = accumulate; p.has_bias = has_bias;
    p.lda = up8(a_k_inner ? std::max(K, 1) : M) + pad;
    p.ldb = up8(b_k_inner ? std::max(K, 1) : N) + pad;
    p.ldc = N + ldc_pad;
    p.plan = 0;
    p.force192 = 0;
    p.pingpong = -1;
    return p;
}

// ---- timing
static float median(std::vector<float> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; }
template <typename F>
static float time_ms(F f, int reps) {
    cudaEvent_t e0, e1;
    MT_CUDA_CHECK(cudaEventCreate(&e0));
    MT_CUDA_CHECK(cudaEventCreate(&e1));
    for (int w = 0; w < 3; w++) f();
    std::vector<float> ms;
    for (int r = 0; r < reps; r++) {
        MT_CUDA_CHECK(cudaEventRecord(e0));
        f();
        MT_CUDA_CHECK(cudaEventRecord(e1));
        MT_CUDA_CHECK(cudaEventSynchronize(e1));
        float t;
        MT_CUDA_CHECK(cudaEventElapsedTime(&t, e0, e1));
        ms.push_back(t);
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return median(ms);
}
// C (row-major, M x N) = A B^T is, column-major, C^T (N x M) = B A^T: cuBLAS's first operand is B
static void cublas_run(cublasHandle_t h, const Prob &p, Dev &d) {
    float alpha = 1.0f, beta = p.accumulate ? 1.0f : 0.0f;
    cublasOperation_t opb = p.b_k_inner ? CUBLAS_OP_T : CUBLAS_OP_N;   // b k inner: stored K x N column-major
    cublasOperation_t opa = p.a_k_inner ? CUBLAS_OP_N : CUBLAS_OP_T;   // a k inner: stored K x M column-major
    cublasStatus_t st = cublasGemmEx(h, opb, opa, p.N, p.M, p.K, &alpha, d.b, CUDA_R_16BF, p.ldb, d.a, CUDA_R_16BF, p.lda,
                                     &beta, d.c, CUDA_R_32F, p.ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS) mt_fatal("cublasGemmEx failed: %d", (int)st);
}

int main(int argc, char **argv) {
    int timing = !(argc > 1 && strcmp(argv[1], "--no-timing") == 0);
    if (argc > 1 && strcmp(argv[1], "--probe") == 0) {   // does this build run the wgmma rung here?
        mt__wgmma_check_supported();   // fatal if not
        printf("probe: this binary has sm_90a code for this GPU\n");
        return 0;
    }
    cudaDeviceProp prop;
    MT_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    printf("%s, %d SMs, sm_%d%d; kernel4_wgmma: %d threads, %d bytes of dynamic shared memory\n", prop.name,
           prop.multiProcessorCount, prop.major, prop.minor, MT__WG_THREADS, MT__WG_SMEM);
    {
        cudaFuncAttributes fa;
        MT_CUDA_CHECK(cudaFuncGetAttributes(&fa, mt_matmul_kernel4_wgmma<1, 1, 0, MT__EPI_NONE, 2>));
        printf("registers per thread %d, local memory %zu bytes\n", fa.numRegs, fa.localSizeBytes);
        MT_CUDA_CHECK(cudaFuncGetAttributes(&fa, mt_matmul_kernel4_wgmma<0, 0, 0, MT__EPI_NONE, 3>));
        printf("the 192 x 192 tile: %d threads, %d bytes of dynamic shared memory, registers per thread %d, local "
               "memory %zu bytes\n", mt__wg_threads(3), mt__wg_smem(3), fa.numRegs, fa.localSizeBytes);
    }

    // scratch (split-K partials) comes from the stream-ordered pool: keep freed memory in the pool
    // across synchronisations, as a training loop in steady state would, instead of unmapping it
    // at every cudaEventSynchronize of the timing loop
    {
        cudaMemPool_t pool;
        MT_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, 0));
        uint64_t keep = UINT64_MAX;
        MT_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
    }
    // 1. small and ragged shapes, every output, all four layouts
    struct { int M, N, K; } small[] = {{77, 200, 40}, {1, 8, 8}, {300, 520, 200}, {129, 257, 1}, {64, 72, 0},
                                       {130, 260, 2100}, {256, 512, 128}};
    for (auto &s : small)
        for (int lay = 0; lay < 4; lay++)
            for (int mode = 0; mode < 4; mode++) {   // (acc, bias): (0,1) (0,0) (1,0) (1,1)
                int acc = mode >= 2, bias = mode == 0 || mode == 3;
                Prob p = make_prob(s.M, s.N, s.K, lay >> 1, lay & 1, acc, bias, (mode & 1) ? 8 : 0, (mode & 1) ? 3 : 0);
                check_prob(p, 1, 0, "small");
                if (mode == 3 || mode == 0) {   // the same through the other schedules
                    p.plan = mode == 3 ? -1 : 3;
                    check_prob(p, 1, 0, "small");
                }
                // A k inner: the ping-pong schedule and the 128 x 256 tile, each forced, unsplit, split,
                // stream-K (the shapes whose every output the host can check quickly: ~1 minute less)
                if (lay >= 2 && (mode == 3 || mode == 0) && (size_t)s.M * s.N * s.K <= 40000000)
                    for (int plan : {1, 3, -1})
                        for (int pp : {0, 1}) {
                            p.plan = plan;
                            p.pingpong = pp;
                            check_prob(p, 1, 0, "small");
                            p.pingpong = -1;
                        }
                if (lay == 0)   // both k outer: the 192 x 192 tile too, unsplit, split, stream-K
                    for (int plan : {1, 3, -1}) {
                        p.plan = plan;
                        p.force192 = 1;
                        check_prob(p, 1, 0, "small");
                        p.force192 = 0;
                    }
            }
    if (failed) printf("small shapes failed: the GPT-2 shapes are checked anyway\n");

    // 2. GPT-2 small's shapes (BT = 16k), sampled outputs
    const int BT = 16 * 1024, C = 768, Vp = 50304;
    struct Shape { const char *name; int M, N, K, a_k_inner, b_k_inner, accumulate; };
    std::vector<Shape> shapes;
    int lin[5][2] = {{C, 3 * C}, {C, C}, {C, 4 * C}, {4 * C, C}, {C, Vp}};   // (in, out) of each linear
    const char *lname5[5] = {"qkv", "attn proj", "fc", "fc proj", "lm head"};
    char names[15][48];
    for (int l = 0; l < 5; l++) {
        int in = lin[l][0], out = lin[l][1];
        snprintf(names[3 * l], 48, "fwd   %s", lname5[l]);
        snprintf(names[3 * l + 1], 48, "dinp  %s", lname5[l]);
        snprintf(names[3 * l + 2], 48, "dW    %s", lname5[l]);
        shapes.push_back({names[3 * l], BT, out, in, 1, 1, 0});       // out = inp @ W^T
        shapes.push_back({names[3 * l + 1], BT, in, out, 1, 0, 0});   // dinp = dout @ W (written, as training does)
        shapes.push_back({names[3 * l + 2], out, in, BT, 0, 0, 1});   // dW += dout^T @ inp
    }
    // the input gradient accumulated into an fp32 C (C read and written: 402 MB at fc proj's shape), the
    // form this table timed for dinp until session 43, though training writes dinp ('=', megatron.h's
    // mt_matmul_backward): kept as one row so the two forms can be compared
    shapes.push_back({"dinp+= fc proj", BT, 4 * C, C, 1, 0, 1});
    for (auto &s : shapes) {
        Prob p = make_prob(s.M, s.N, s.K, s.a_k_inner, s.b_k_inner, s.accumulate, s.accumulate ? 0 : 1, 0, 0);
        check_prob(p, 0, s.K > 10000 ? 600 : 2000, s.name);
        if (s.a_k_inner && s.K <= 3072)   // the forwards and input gradients: both schedules, forced
            for (int pp : {0, 1}) {
                p.pingpong = pp;
                check_prob(p, 0, 2000, s.name);
                p.pingpong = -1;
            }
        if (s.M < BT && s.M < 10000) {   // the small weight gradients: every schedule
            for (int plan : {-1, 1, 3}) {
                p.plan = plan;
                check_prob(p, 0, 600, s.name);
            }
        }
    }
    {   // stream-K on the other layouts
        Prob p = make_prob(BT, C, C, 1, 0, 1, 0, 0, 0);
        p.plan = -1;
        check_prob(p, 0, 2000, "dinp attn proj");
        p = make_prob(3 * C, 4 * C, 2048, 1, 1, 0, 1, 0, 0);
        p.plan = -1;
        check_prob(p, 0, 2000, "ii 2304x3072");
    }
    // 3. determinism: the weight gradients with partials (stream-K, split-K) twice, bit for bit
    for (int plan : {-1, 7, 0}) {   // (0: the fc weight gradient's own plan, 192 x 192 tiles in 2 slices)
        Prob p = make_prob(plan == 0 ? 3072 : 2304, 768, BT, 0, 0, 1, 0, 0, 0);
        p.plan = plan;
        Dev d;
        d.alloc(p);
        std::vector<float> r1(d.c_elems), r2(d.c_elems);
        d.run(p);
        MT_CUDA_CHECK(cudaMemcpy(r1.data(), d.c, d.c_elems * 4, cudaMemcpyDeviceToHost));
        d.reset_c();
        d.run(p);
        MT_CUDA_CHECK(cudaMemcpy(r2.data(), d.c, d.c_elems * 4, cudaMemcpyDeviceToHost));
        check(memcmp(r1.data(), r2.data(), d.c_elems * 4) == 0, "dW %s (%s) run twice: bit-identical",
              plan == 0 ? "fc" : "qkv", plan > 0 ? "split-K 7" : plan < 0 ? "stream-K" : "192 x 192, split-K 2");
        d.release();
    }

    // 4. timing beside cuBLAS (bias NULL for both; C's old values as they are)
    if (timing && failed == 0) {
        cublasHandle_t h;
        if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) mt_fatal("cublasCreate failed");
        {   // host cost of building the two tensor maps (once per call)
            __nv_bfloat16 *x;
            MT_CUDA_CHECK(cudaMalloc(&x, 1 << 20));
            mt__wgmma_map(x, 0, 512, 512, 512, 1, 128);
            auto t0 = std::chrono::steady_clock::now();
            for (int r = 0; r < 1000; r++) mt__wgmma_map(x, 0, 512, 512, 512, r & 1, 256);
            double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / 1000;
            printf("cuTensorMapEncodeTiled: %.2f us per map on the host (2 maps per GEMM call)\n", us);
            cudaFree(x);
        }
        printf("\n%-16s %6s %6s %6s %3s %7s | %9s %9s | %9s %9s | %6s\n", "GEMM", "M", "N", "K", "lay", "plan", "ours ms",
               "TFLOP/s", "cuBLAS ms", "TFLOP/s", "ratio");
        for (auto &s : shapes) {
            Prob p = make_prob(s.M, s.N, s.K, s.a_k_inner, s.b_k_inner, s.accumulate, 0, 0, 0);
            Dev d;
            d.alloc(p);
            float ours = time_ms([&] { d.run(p); }, 20);
            float theirs = time_ms([&] { cublas_run(h, p, d); }, 20);
            MT_CUDA_CHECK(cudaDeviceSynchronize());
            double flop = 2.0 * p.M * p.N * p.K;
            mt_wgmma_plan pl;
            mt_wgmma_plan_make(&pl, p.M, p.N, p.K, 0, !p.a_k_inner && !p.b_k_inner);
            int sp = pl.stream_k ? 0 : pl.splits;
            char plan[24];
            if (sp == 0) snprintf(plan, sizeof plan, "strm-K");
            else snprintf(plan, sizeof plan, "%d%s", sp, pl.bm == 192 ? " 192" : "");
            printf("%-16s %6d %6d %6d %3s %7s | %9.3f %9.1f | %9.3f %9.1f | %5.0f%%\n", s.name, p.M, p.N, p.K, lname(p), plan,
                   ours, flop / ours * 1e-9, theirs, flop / theirs * 1e-9, 100.0 * theirs / ours);
            fflush(stdout);
            if (s.a_k_inner && s.K < 10000)   // the forwards and input gradients: each schedule
                for (int pp : {0, 1}) {
                    p.pingpong = pp;
                    float t = time_ms([&] { d.run(p); }, 20);
                    printf("%-16s %6s %6s %6s %3s %7s | %9.3f %9.1f |\n", "  (forced)", "", "", "", "", pp ? "pp" : "coop", t,
                           flop / t * 1e-9);
                    p.pingpong = -1;
                }
            if (!s.a_k_inner && sp != 1)   // the weight gradients: what each schedule gives (128 x 256 tiles)
                for (int force : {-1, 1, 2, 3, 4, 7, 11}) {
                    float t = time_ms([&] {
                        mt__gemm_wgmma_splits(d.c, d.a, d.b, NULL, p.M, p.N, p.K, p.lda, p.ldb, p.ldc, p.a_k_inner,
                                              p.b_k_inner, p.accumulate, force, 0);
                    }, 20);
                    char fp[16];
                    if (force < 0) snprintf(fp, sizeof fp, "strm-K");
                    else snprintf(fp, sizeof fp, "%d", force);
                    printf("%-16s %6s %6s %6s %3s %7s | %9.3f %9.1f |\n", "  (forced)", "", "", "", "", fp, t, flop / t * 1e-9);
                }
            d.release();
        }
        cublasDestroy(h);
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}

/* tests/gpu/test_kernels.cu - every kernel of kernels.cuh against its CPU twin, then timed.
 *
 *   nvcc -O3 -arch=sm_90 -x cu tests/gpu/test_kernels.cu -o tests/gpu/test_kernels -lm -lpthread
 *   ./tests/gpu/test_kernels [--seed N] [--only NAME,NAME..] [--no-bench] [--bench-only]
 *
 * llm.c dev/cuda style: for each op, fresh random inputs (the seed is printed; --seed repeats a
 * run), the CPU reference (the mt_*_cpu function of megatron.h, 3. OPS), the kernel on the same
 * inputs, then a comparison. Outputs written with '=' are poisoned with NaN before each launch
 * (an element the kernel forgets stays NaN, and NaN never passes); outputs that are added into
 * start from random values (a kernel that writes '=' instead of '+=' fails), and what is compared
 * is what was added, got - start against want - start.
 * Tolerances (tensor-scale relative: max |got - want| / max |want|, see check_close):
 *   0      where the GPU does the same float operations in the same order as the CPU (copies,
 *          embedding and position backward, dropout masks, the RNG, max)
 *   1e-5   fp32 kernels whose sums run in another order than the CPU's (rounding ~ sqrt(n) eps)
 *   1e-4   the tensor-core GEMMs (bf16, fp16) against the CPU build's emulation of them (the same
 *          rounded operands, exact products, sums in another order)
 *   1e-2   the tensor-core attention (bf16, fp16) against the emulation: P is rounded at another
 *          point (see attention_case)
 * Then the GPT-2 small timings (B=16, T=1024, C=768, NH=12, V=50304): TFLOP/s or GB/s per kernel.
 * Prints "N passed, N failed"; exits non-zero on failure.
 */
#define MEGATRON_IMPLEMENTATION
#include "../../megatron.h"
#include "../../kernels.cuh"
#include "../harness.h"
#include <algorithm>
#include <vector>

// ---------------------------------------------------------------------------------------------
// random numbers (xorshift64*), seeded fresh each run
static uint64_t rng_state = 1;
static uint32_t rand_u32(void) {
    rng_state ^= rng_state >> 12; rng_state ^= rng_state << 25; rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545F4914F6CDD1DULL) >> 32);
}
static float rand_uniform(float lo, float hi) { return lo + (hi - lo) * (float)(rand_u32() >> 8) * (1.0f / 16777216.0f); }
static int rand_int(int n) { return (int)(rand_u32() % (uint32_t)n); }

static float *host_random(size_t n, float lo, float hi) {
    float *x = (float *)mt_malloc(n * sizeof(float) + 16, "test data");
    for (size_t i = 0; i < n; i++) x[i] = rand_uniform(lo, hi);
    return x;
}
static int *host_tokens(size_t n, int V) {
    int *x = (int *)mt_malloc(n * sizeof(int) + 16, "test tokens");
    for (size_t i = 0; i < n; i++) x[i] = rand_int(V);
    return x;
}
static float *host_copy(const float *x, size_t n) {
    float *y = (float *)mt_malloc(n * sizeof(float) + 16, "test copy");
    memcpy(y, x, n * sizeof(float));
    return y;
}
// device buffers
static void *dev_alloc(size_t bytes) {
    void *p;
    MT_CUDA_CHECK(cudaMalloc(&p, bytes ? bytes : 16));
    return p;
}
static float *dev_alloc_f(size_t n) { return (float *)dev_alloc(n * sizeof(float)); }
static float *dev_upload(const float *h, size_t n) {
    float *d = (float *)dev_alloc(n * sizeof(float));
    MT_CUDA_CHECK(cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice));
    return d;
}
static int *dev_upload_int(const int *h, size_t n) {
    int *d = (int *)dev_alloc(n * sizeof(int));
    MT_CUDA_CHECK(cudaMemcpy(d, h, n * sizeof(int), cudaMemcpyHostToDevice));
    return d;
}
// a buffer of n floats, every bit set: NaN
static float *dev_nan(size_t n) {
    float *d = (float *)dev_alloc(n * sizeof(float));
    MT_CUDA_CHECK(cudaMemset(d, 0xFF, n * sizeof(float)));
    return d;
}
static void dev_poison(float *d, size_t n) { MT_CUDA_CHECK(cudaMemset(d, 0xFF, n * sizeof(float))); }
static void dev_set(float *d, const float *h, size_t n) { MT_CUDA_CHECK(cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice)); }
static float *dev_download(const float *d, size_t n) {
    MT_CUDA_CHECK(cudaDeviceSynchronize());
    float *h = (float *)mt_malloc(n * sizeof(float) + 16, "test download");
    MT_CUDA_CHECK(cudaMemcpy(h, d, n * sizeof(float), cudaMemcpyDeviceToHost));
    return h;
}
// n 16-bit values (dt: MT_DTYPE_BF16 or MT_DTYPE_FP16) from the device, widened to floats (exactly)
static float *dev_download16(const void *d16, size_t n, int dt) {
    MT_CUDA_CHECK(cudaDeviceSynchronize());
    uint16_t *bits = (uint16_t *)mt_malloc(n * sizeof(uint16_t) + 2, "test download");
    MT_CUDA_CHECK(cudaMemcpy(bits, d16, n * sizeof(uint16_t), cudaMemcpyDeviceToHost));
    float *h = (float *)mt_malloc(n * sizeof(float) + 16, "test download");
    for (size_t i = 0; i < n; i++) h[i] = dt == MT_DTYPE_FP16 ? mt_fp16_to_float(bits[i]) : mt_bf16_to_float(bits[i]);
    free(bits);
    return h;
}
static void dev_free(void *d) { MT_CUDA_CHECK(cudaFree(d)); }

// ---------------------------------------------------------------------------------------------
// comparisons, on top of tests/harness.h
// tensor-scale relative: max_i |got_i - want_i| / max_i |want_i| <= tol; NaN never passes.
// On failure prints the first 5 pairs (OK / NOT OK) and the worst one.
// check_close_scale: the same with the magnitude the error is measured against given by the
// caller, at least max |want|. For results that come out of cancellation (a sum of terms of
// mixed signs), rounding error scales with the terms, not with the result: on tiny tensors
// (n = 1) max |want| can be far smaller than the terms, and the plain check would then demand
// more than the arithmetic can give.
static int check_close_scale(const char *label, const float *got, const float *want, size_t n, double tol, double term_scale);
static int check_close(const char *label, const float *got, const float *want, size_t n, double tol) {
    return check_close_scale(label, got, want, n, tol, 0.0);
}
static int check_close_scale(const char *label, const float *got, const float *want, size_t n, double tol, double term_scale) {
    double scale = term_scale, maxdiff = 0.0;
    size_t worst = 0;
    int nan = 0;   // a NaN, or an infinity where the other side has none
    for (size_t i = 0; i < n; i++)
        if (isfinite(want[i])) scale = fmax(scale, fabs((double)want[i]));
    if (scale == 0.0) scale = 1e-30;
    for (size_t i = 0; i < n; i++) {
        if (got[i] == want[i]) continue;   // equal, infinities included
        double d = fabs((double)got[i] - (double)want[i]);
        if (!isfinite(d)) { if (!nan) worst = i; nan = 1; continue; }
        if (d > maxdiff && !nan) { maxdiff = d; worst = i; }
    }
    int ok = !nan && maxdiff / scale <= tol;
    if (!ok) {
        fprintf(stderr, "  %s: NOT OK (n=%zu, max |diff|/scale = %.3e, scale %.3g, tol %.1e%s; worst at %zu: got %.9g want %.9g)\n",
                label, n, maxdiff / scale, scale, tol, nan ? ", NaN present" : "", worst, (double)got[worst], (double)want[worst]);
        for (size_t i = 0; i < n && i < 5; i++) {
            double d = fabs((double)got[i] - (double)want[i]) / scale;
            fprintf(stderr, "    [%zu] %.9g %.9g %s\n", i, (double)got[i], (double)want[i], d <= tol ? "OK" : "NOT OK");
        }
    }
    mt__expect(ok, __FILE__, __LINE__, "tensor %s differs", label);
    return ok;
}
// for outputs that are added into: compare what was added (got - start) with (want - start)
static int check_added_scale(const char *label, const float *got, const float *want, const float *start, size_t n, double tol,
                             double term_scale) {
    float *g = (float *)mt_malloc(n * sizeof(float) + 16, "check"), *w = (float *)mt_malloc(n * sizeof(float) + 16, "check");
    for (size_t i = 0; i < n; i++) { g[i] = (float)((double)got[i] - start[i]); w[i] = (float)((double)want[i] - start[i]); }
    int ok = check_close_scale(label, g, w, n, tol, term_scale);
    free(g);
    free(w);
    return ok;
}
static int check_added(const char *label, const float *got, const float *want, const float *start, size_t n, double tol) {
    return check_added_scale(label, got, want, start, n, tol, 0.0);
}
static int check_equal_bits(const char *label, const void *a, const void *b, size_t bytes) {
    int ok = memcmp(a, b, bytes) == 0;
    mt__expect(ok, __FILE__, __LINE__, "%s: results differ between two identical runs", label);
    return ok;
}

// ---------------------------------------------------------------------------------------------
// 1. UTILITIES: the RNG port, fill, zero, scale, casts
__global__ void test_rng_kernel(float *u, uint64_t prefix, uint64_t first, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) u[i] = mt__gpu_rand_uniform(prefix, first + i);
}
MT_TEST(rng_matches_cpu) {
    // the host side of the port, on random keys: bit-identical to mt_rand_uniform
    int bad = 0;
    for (int i = 0; i < 10000; i++) {
        uint64_t seed = rand_u32(), a = rand_u32(), b = rand_u32(), c = rand_u32();
        uint64_t index = ((uint64_t)rand_u32() << 32) | rand_u32();
        float want = mt_rand_uniform(seed, a, b, c, index);
        float got = mt__gpu_rand_uniform(mt__gpu_key_prefix(seed, a, b, c), index);
        if (memcmp(&want, &got, sizeof got) != 0) bad++;
    }
    mt_expect(bad == 0, "host port of the RNG differs from mt_rand_uniform in %d of 10000 keys", bad);
    // the device side: a stream of 1<<20 numbers
    int n = 1 << 20;
    uint64_t seed = rand_u32(), first = (uint64_t)rand_u32() * 1000;
    float *d = dev_nan(n);
    test_rng_kernel<<<(n + 255) / 256, 256>>>(d, mt__gpu_key_prefix(seed, 7, 9, 0x0d0d), first, n);
    MT_CUDA_CHECK(cudaGetLastError());
    float *got = dev_download(d, n), *want = (float *)mt_malloc(n * sizeof(float), "want");
    for (int i = 0; i < n; i++) want[i] = mt_rand_uniform(seed, 7, 9, 0x0d0d, first + i);
    check_close("device rng", got, want, n, 0.0);   // same integer arithmetic: bit-identical
    free(got); free(want); dev_free(d);
}
MT_TEST(fill_zero_cast) {
    size_t n = 1000003;
    float value = rand_uniform(-3, 3);
    float *x = host_random(n, -2, 2), *want = (float *)mt_malloc(n * sizeof(float), "want");
    float *d = dev_nan(n);
    mt_fill_gpu(d, value, n, 0);
    for (size_t i = 0; i < n; i++) want[i] = value;
    float *got = dev_download(d, n);
    check_close("fill", got, want, n, 0.0);
    free(got);
    mt_zero_gpu(d, n, 0);
    for (size_t i = 0; i < n; i++) want[i] = 0.0f;
    got = dev_download(d, n);
    check_close("zero", got, want, n, 0.0);
    free(got);
    // fp32 -> bf16 -> fp32: bf16 bits as the host's round-to-nearest-even, and back exactly
    __nv_bfloat16 *b16 = (__nv_bfloat16 *)dev_alloc(n * sizeof(__nv_bfloat16));
    dev_set(d, x, n);
    mt_cast_f32_to_bf16_gpu(b16, d, n, 0);
    dev_poison(d, n);
    mt_cast_bf16_to_f32_gpu(d, b16, n, 0);
    for (size_t i = 0; i < n; i++) want[i] = __bfloat162float(__float2bfloat16_rn(x[i]));
    got = dev_download(d, n);
    check_close("cast fp32->bf16->fp32", got, want, n, 0.0);
    free(got);
    // the GPU's casts give the bits of the CPU build's rounding (megatron.h, mt_fp16_from_float /
    // mt_bf16_from_float), on values across fp16's range: subnormals, ties, overflow, inf
    size_t m = 4099;   // not a multiple of 8: the 8-wide kernels and the one-element tail
    float *y = (float *)mt_malloc(m * sizeof(float), "cast inputs");
    for (size_t i = 0; i < m; i++) {
        uint64_t rnd = mt_hash64(77 + i);
        y[i] = ldexpf((float)(rnd & 0xffff) / 65536.0f + 0.5f, (int)((rnd >> 16) % 50) - 30);   // 2^-31 .. 2^19
        if (i % 7 == 0) y[i] = ldexpf((float)(1 + 2 * (rnd % 512)), -25);   // ties in the subnormals
        if (rnd >> 63) y[i] = -y[i];
    }
    y[0] = 65504.0f; y[1] = 65520.0f; y[2] = 65519.0f; y[3] = INFINITY; y[4] = -0.0f; y[5] = 1.0f + 1.0f / 2048;
    float *d_y = dev_upload(y, m);
    __half *h16 = (__half *)dev_alloc(m * sizeof(__half));
    __nv_bfloat16 *hb16 = (__nv_bfloat16 *)dev_alloc(m * sizeof(__nv_bfloat16));
    mt_cast_f32_to_f16_gpu(h16, d_y, m, 0);
    mt_cast_f32_to_bf16_gpu(hb16, d_y, m, 0);
    uint16_t *bits = (uint16_t *)mt_malloc(m * sizeof(uint16_t), "bits"), *bbits = (uint16_t *)mt_malloc(m * sizeof(uint16_t), "bits");
    MT_CUDA_CHECK(cudaMemcpy(bits, h16, m * sizeof(uint16_t), cudaMemcpyDeviceToHost));
    MT_CUDA_CHECK(cudaMemcpy(bbits, hb16, m * sizeof(uint16_t), cudaMemcpyDeviceToHost));
    int bad = 0, bbad = 0;
    for (size_t i = 0; i < m; i++) {
        if (bits[i] != mt_fp16_from_float(y[i]) && bad++ < 5)
            fprintf(stderr, "  fp16(%.9g): GPU 0x%04x, CPU 0x%04x\n", (double)y[i], bits[i], mt_fp16_from_float(y[i]));
        if (bbits[i] != mt_bf16_from_float(y[i]) && bbad++ < 5)
            fprintf(stderr, "  bf16(%.9g): GPU 0x%04x, CPU 0x%04x\n", (double)y[i], bbits[i], mt_bf16_from_float(y[i]));
    }
    mt_expect(bad == 0 && bbad == 0, "casts: %d fp16 and %d bf16 values differ from the CPU build's rounding", bad, bbad);
    free(y); free(bits); free(bbits); dev_free(d_y); dev_free(h16); dev_free(hb16);
    // loss scaling's unscale-and-check: x *= 1/S as the CPU does (one multiply), the flag only when
    // an element is inf or NaN (one at the end of the buffer, then none)
    int *d_found = (int *)dev_alloc(sizeof(int));
    for (int with_inf = 1; with_inf >= 0; with_inf--) {
        float *xs = host_copy(x, n);
        if (with_inf) xs[n - 1] = INFINITY;
        dev_set(d, xs, n);
        MT_CUDA_CHECK(cudaMemset(d_found, 0, sizeof(int)));
        mt_unscale_check_gpu(d_found, d, 1.0f / 1024.0f, n, 0);
        int found = -1;
        MT_CUDA_CHECK(cudaMemcpy(&found, d_found, sizeof(int), cudaMemcpyDeviceToHost));
        int want_found = mt_unscale_check_cpu(xs, 1.0f / 1024.0f, n);
        mt_expect(found == want_found && found == with_inf, "unscale check: found %d, want %d", found, with_inf);
        got = dev_download(d, n);
        check_close(with_inf ? "unscale (with an inf)" : "unscale", got, xs, n - (size_t)with_inf, 0.0);
        free(got); free(xs);
    }
    dev_free(d_found);
    free(x); free(want); dev_free(d); dev_free(b16);
}

// ---------------------------------------------------------------------------------------------
// 3. OPS
MT_TEST(embedding) {
    // B, T, C, vocab_start, V_local, V_total (tokens drawn from [0, V_total))
    int shapes[][6] = {{1, 1, 1, 0, 5, 5},        {2, 7, 33, 0, 50, 50},      {4, 64, 768, 0, 1000, 1000},
                       {3, 100, 130, 37, 60, 200}, {8, 1024, 5, 0, 5, 5},      {8, 1024, 768, 0, 50304, 50304},
                       {2, 513, 64, 25152, 25152, 50304}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int B = shapes[s][0], T = shapes[s][1], C = shapes[s][2], vs = shapes[s][3], VL = shapes[s][4], VT = shapes[s][5];
        size_t BTC = (size_t)B * T * C, VC = (size_t)VL * C;
        int *tokens = host_tokens((size_t)B * T, VT);
        float *wte = host_random(VC, -1, 1), *dout = host_random(BTC, -1, 1), *dwte0 = host_random(VC, -1, 1);
        float *out_ref = (float *)mt_malloc(BTC * sizeof(float) + 16, "ref"), *dwte_ref = host_copy(dwte0, VC);
        mt_embedding_forward_cpu(out_ref, tokens, wte, B, T, C, vs, VL);
        mt_embedding_backward_cpu(dwte_ref, dout, tokens, B, T, C, vs, VL);
        int *d_tokens = dev_upload_int(tokens, (size_t)B * T);
        float *d_wte = dev_upload(wte, VC), *d_out = dev_nan(BTC), *d_dout = dev_upload(dout, BTC), *d_dwte = dev_upload(dwte0, VC);
        mt_embedding_forward_gpu(d_out, d_tokens, d_wte, B, T, C, vs, VL, 0);
        mt_embedding_backward_gpu(d_dwte, d_dout, d_tokens, B, T, C, vs, VL, 0);
        char label[128];
        float *got = dev_download(d_out, BTC);
        snprintf(label, sizeof label, "embedding forward B=%d T=%d C=%d rows [%d,%d)", B, T, C, vs, vs + VL);
        check_close(label, got, out_ref, BTC, 0.0);   // a copy
        free(got);
        {   // decoding's form: plus each token's own position's row of wpe (positions drawn at random)
            int P = 1024;
            int *positions = host_tokens((size_t)B * T, P);
            float *wpe = host_random((size_t)P * C, -1, 1);
            mt_embedding_positions_forward_cpu(out_ref, tokens, wte, positions, wpe, B, T, C, vs, VL);
            int *d_positions = dev_upload_int(positions, (size_t)B * T);
            float *d_wpe = dev_upload(wpe, (size_t)P * C);
            dev_poison(d_out, BTC);
            mt_embedding_positions_forward_gpu(d_out, d_tokens, d_wte, d_positions, d_wpe, B, T, C, vs, VL, 0);
            got = dev_download(d_out, BTC);
            snprintf(label, sizeof label, "embedding + positions forward B=%d T=%d C=%d", B, T, C);
            check_close(label, got, out_ref, BTC, 0.0);   // one addition, the same
            free(got); free(positions); free(wpe);
            dev_free(d_positions); dev_free(d_wpe);
        }
        got = dev_download(d_dwte, VC);
        snprintf(label, sizeof label, "embedding backward B=%d T=%d C=%d rows [%d,%d)", B, T, C, vs, vs + VL);
        check_close(label, got, dwte_ref, VC, 0.0);   // the same additions in the same (bt) order
        free(got);
        free(tokens); free(wte); free(dout); free(dwte0); free(out_ref); free(dwte_ref);
        dev_free(d_tokens); dev_free(d_wte); dev_free(d_out); dev_free(d_dout); dev_free(d_dwte);
    }
}
MT_TEST(position_embedding) {
    int shapes[][3] = {{1, 1, 1}, {2, 7, 33}, {3, 100, 130}, {8, 1024, 768}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int B = shapes[s][0], T = shapes[s][1], C = shapes[s][2];
        size_t BTC = (size_t)B * T * C, TC = (size_t)T * C;
        float *x = host_random(BTC, -1, 1), *wpe = host_random(TC, -1, 1), *dout = host_random(BTC, -1, 1), *dwpe0 = host_random(TC, -1, 1);
        float *out_ref = host_copy(x, BTC), *dwpe_ref = host_copy(dwpe0, TC);
        mt_position_embedding_forward_cpu(out_ref, wpe, B, T, C);
        mt_position_embedding_backward_cpu(dwpe_ref, dout, B, T, C);
        float *d_x = dev_upload(x, BTC), *d_wpe = dev_upload(wpe, TC), *d_dout = dev_upload(dout, BTC), *d_dwpe = dev_upload(dwpe0, TC);
        mt_position_embedding_forward_gpu(d_x, d_wpe, B, T, C, 0);
        mt_position_embedding_backward_gpu(d_dwpe, d_dout, B, T, C, 0);
        float *got = dev_download(d_x, BTC);
        check_close("position embedding forward", got, out_ref, BTC, 0.0);   // one addition per element
        free(got);
        got = dev_download(d_dwpe, TC);
        check_close("position embedding backward", got, dwpe_ref, TC, 0.0);   // the same order over b
        free(got);
        free(x); free(wpe); free(dout); free(dwpe0); free(out_ref); free(dwpe_ref);
        dev_free(d_x); dev_free(d_wpe); dev_free(d_dout); dev_free(d_dwpe);
    }
}
MT_TEST(layernorm) {
    int shapes[][3] = {{1, 1, 1}, {1, 7, 3}, {2, 50, 64}, {1, 513, 768}, {4, 1024, 768}, {1, 100, 1600}, {1, 33, 4100}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int B = shapes[s][0], T = shapes[s][1], C = shapes[s][2];
        size_t N = (size_t)B * T, NC = N * C;
        float *inp = host_random(NC, -2, 2), *w = host_random(C, 0.5f, 1.5f), *bias = host_random(C, -1, 1);
        float *dout = host_random(NC, -1, 1), *dinp0 = host_random(NC, -1, 1), *dw0 = host_random(C, -1, 1), *db0 = host_random(C, -1, 1);
        float *out_ref = (float *)mt_malloc(NC * sizeof(float), "ref"), *mean_ref = (float *)mt_malloc(N * sizeof(float), "ref");
        float *rstd_ref = (float *)mt_malloc(N * sizeof(float), "ref");
        float *dinp_ref = host_copy(dinp0, NC), *dw_ref = host_copy(dw0, C), *db_ref = host_copy(db0, C);
        mt_layernorm_forward_cpu(out_ref, mean_ref, rstd_ref, inp, w, bias, B, T, C);
        mt_layernorm_backward_cpu(dinp_ref, dw_ref, db_ref, dout, inp, w, mean_ref, rstd_ref, B, T, C);
        float *d_inp = dev_upload(inp, NC), *d_w = dev_upload(w, C), *d_b = dev_upload(bias, C), *d_out = dev_nan(NC);
        float *d_mean = dev_nan(N), *d_rstd = dev_nan(N), *d_dout = dev_upload(dout, NC);
        float *d_dinp = dev_upload(dinp0, NC), *d_dw = dev_upload(dw0, C), *d_db = dev_upload(db0, C);
        mt_layernorm_forward_gpu(d_out, d_mean, d_rstd, d_inp, d_w, d_b, B, T, C, 0);
        // the backward gets the CPU's mean and rstd, so that it is tested alone
        float *d_mean_ref = dev_upload(mean_ref, N), *d_rstd_ref = dev_upload(rstd_ref, N);
        mt_layernorm_backward_gpu(d_dinp, d_dw, d_db, d_dout, d_inp, d_w, d_mean_ref, d_rstd_ref, B, T, C, 0);
        char label[128];
        // fp32, sums over C in another order: 1e-5
        float *got = dev_download(d_out, NC);
        snprintf(label, sizeof label, "layernorm out B=%d T=%d C=%d", B, T, C);
        check_close(label, got, out_ref, NC, 1e-5); free(got);
        got = dev_download(d_mean, N); check_close("layernorm mean", got, mean_ref, N, 1e-5); free(got);
        got = dev_download(d_rstd, N); check_close("layernorm rstd", got, rstd_ref, N, 1e-5); free(got);
        got = dev_download(d_dinp, NC);
        snprintf(label, sizeof label, "layernorm dinp B=%d T=%d C=%d", B, T, C);
        check_added(label, got, dinp_ref, dinp0, NC, 1e-5); free(got);
        got = dev_download(d_dw, C); check_added("layernorm dweight", got, dw_ref, dw0, C, 1e-5); free(got);
        got = dev_download(d_db, C); check_added("layernorm dbias", got, db_ref, db0, C, 1e-5); free(got);
        // the residual add fused in front: res = a + inp exactly as mt_residual_forward, then the same
        // layernorm of res (1e-5)
        float *a = host_random(NC, -2, 2), *res_ref = (float *)mt_malloc(NC * sizeof(float), "ref");
        mt_residual_layernorm_forward_cpu(res_ref, out_ref, mean_ref, rstd_ref, a, inp, w, bias, B, T, C);
        float *d_a = dev_upload(a, NC), *d_res = dev_nan(NC);
        dev_poison(d_out, NC);
        mt_residual_layernorm_forward_gpu(d_res, d_out, d_mean, d_rstd, d_a, d_inp, d_w, d_b, B, T, C, 0);
        got = dev_download(d_res, NC);
        snprintf(label, sizeof label, "residual + layernorm: res B=%d T=%d C=%d", B, T, C);
        check_close(label, got, res_ref, NC, 0.0); free(got);   // one fp32 add: exact
        got = dev_download(d_out, NC);
        snprintf(label, sizeof label, "residual + layernorm: out B=%d T=%d C=%d", B, T, C);
        check_close(label, got, out_ref, NC, 1e-5); free(got);
        // out stored in 16 bits (a training layer's ln1 / ln2 on the wgmma rung): the same kernel's
        // fp32 values, each rounded to nearest even, bit for bit; mean, rstd and res as in fp32.
        // Plain and with the residual in front; vector (C % 4 == 0, C <= 2048) and scalar kernels.
        for (int dt = MT_DTYPE_BF16; dt <= MT_DTYPE_FP16; dt++)
            for (int with_res = 0; with_res <= 1; with_res++) {
                float *out32, *want = (float *)mt_malloc(NC * sizeof(float) + 4, "rounded");
                dev_poison(d_out, NC);
                if (with_res) mt_residual_layernorm_forward_gpu(d_res, d_out, d_mean, d_rstd, d_a, d_inp, d_w, d_b, B, T, C, 0);
                else mt_layernorm_forward_gpu(d_out, d_mean, d_rstd, d_inp, d_w, d_b, B, T, C, 0);
                out32 = dev_download(d_out, NC);
                for (size_t i = 0; i < NC; i++) want[i] = mt_round_to_dtype(out32[i], (mt_dtype)dt);
                void *o16 = dev_alloc(NC * 2 + 16);
                MT_CUDA_CHECK(cudaMemset(o16, 0xff, NC * 2));
                mt_layernorm_forward16_gpu(o16, d_mean, d_rstd, with_res ? d_res : NULL, with_res ? d_a : NULL, d_inp, d_w,
                                           d_b, B, T, C, dt, 0);
                float *as32 = dev_download16(o16, NC, dt);
                snprintf(label, sizeof label, "%slayernorm out in %s B=%d T=%d C=%d", with_res ? "residual + " : "",
                         dt == MT_DTYPE_BF16 ? "bf16" : "fp16", B, T, C);
                check_close(label, as32, want, NC, 0.0);
                free(out32); free(want); free(as32); dev_free(o16);
            }
        got = dev_download(d_rstd, N); check_close("residual + layernorm: rstd", got, rstd_ref, N, 1e-5); free(got);
        free(a); free(res_ref); dev_free(d_a); dev_free(d_res);
        free(inp); free(w); free(bias); free(dout); free(dinp0); free(dw0); free(db0); free(out_ref); free(mean_ref);
        free(rstd_ref); free(dinp_ref); free(dw_ref); free(db_ref);
        dev_free(d_inp); dev_free(d_w); dev_free(d_b); dev_free(d_out); dev_free(d_mean); dev_free(d_rstd);
        dev_free(d_dout); dev_free(d_dinp); dev_free(d_dw); dev_free(d_db); dev_free(d_mean_ref); dev_free(d_rstd_ref);
    }
}

// one matmul shape through every rung of the ladder: forward, and backward with dinp, dweight, dbias
// the rounding scale of a sum of terms of mixed signs is the root of the sum of their squares
// (random-sign roundings of each term), not the sum itself, which may cancel to nearly nothing.
// For the forward: max over outputs of sqrt(sum_k (inp[bt,k] w[o,k])^2 + bias[o]^2). Only worth
// it on small outputs: on large ones max |want| is already bigger, so the check is unchanged.
static double matmul_forward_term_scale(const float *inp, const float *w, const float *bias, int BT, int C, int OC) {
    if ((size_t)BT * OC > 4096) return 0.0;
    double biggest = 0.0;
    for (int bt = 0; bt < BT; bt++)
        for (int o = 0; o < OC; o++) {
            double sq = bias ? (double)bias[o] * bias[o] : 0.0;
            for (int k = 0; k < C; k++) { double t = (double)inp[(size_t)bt * C + k] * w[(size_t)o * C + k]; sq += t * t; }
            biggest = fmax(biggest, sqrt(sq));
        }
    return biggest;
}
// the same for dbias: the column sums of dout
static double column_sum_term_scale(const float *dout, int BT, int OC) {
    double biggest = 0.0;
    for (int o = 0; o < OC; o++) {
        double sq = 0.0;
        for (int bt = 0; bt < BT; bt++) sq += (double)dout[(size_t)bt * OC + o] * dout[(size_t)bt * OC + o];
        biggest = fmax(biggest, sqrt(sq));
    }
    return biggest;
}
static void matmul_case(int BT, int C, int OC, int with_bias, int with_dinp, int misalign) {
    size_t nin = (size_t)BT * C, nw = (size_t)OC * C, nout = (size_t)BT * OC;
    float *inp = host_random(nin, -1, 1), *w = host_random(nw, -1, 1), *bias = host_random(OC, -1, 1);
    float *dout = host_random(nout, -1, 1), *dinp0 = host_random(nin, -1, 1), *dw0 = host_random(nw, -1, 1), *db0 = host_random(OC, -1, 1);
    float *out_ref = (float *)mt_malloc(nout * sizeof(float) + 16, "ref");
    float *dinp_ref = host_copy(dinp0, nin), *dw_ref = host_copy(dw0, nw), *db_ref = host_copy(db0, OC);
    mt_matmul_forward_cpu(out_ref, inp, w, with_bias ? bias : NULL, BT, C, OC);
    mt_matmul_backward_cpu(with_dinp ? dinp_ref : NULL, dw_ref, with_bias ? db_ref : NULL, dout, inp, w, BT, C, OC);
    // misalign: the operands start one float past a 16-byte boundary (the kernels' scalar-load path)
    int off = misalign ? 1 : 0;
    float *d_inp_base = dev_alloc_f(nin + off), *d_w_base = dev_alloc_f(nw + off), *d_dout_base = dev_alloc_f(nout + off);
    float *d_inp = d_inp_base + off, *d_w = d_w_base + off, *d_dout = d_dout_base + off;
    dev_set(d_inp, inp, nin); dev_set(d_w, w, nw); dev_set(d_dout, dout, nout);
    float *d_bias = dev_upload(bias, OC), *d_out = dev_nan(nout), *d_dinp = dev_nan(nin), *d_dw = dev_nan(nw), *d_db = dev_nan(OC);
    // the tensor-core rungs against the CPU build's emulation of their precision (the same
    // roundings of the same operands: mt_matmul_*_rounded_cpu), in bf16 (1) and fp16 (2)
    float *out_r[3] = {out_ref, NULL, NULL}, *dinp_r[3] = {dinp_ref, NULL, NULL}, *dw_r[3] = {dw_ref, NULL, NULL};
    for (int dt = 1; dt <= 2; dt++) {
        out_r[dt] = (float *)mt_malloc(nout * sizeof(float) + 16, "ref");
        dinp_r[dt] = host_copy(dinp0, nin);
        dw_r[dt] = host_copy(dw0, nw);
        mt_matmul_forward_rounded_cpu(out_r[dt], inp, w, with_bias ? bias : NULL, BT, C, OC, (mt_dtype)dt);
        mt_matmul_backward_rounded_cpu(with_dinp ? dinp_r[dt] : NULL, dw_r[dt], NULL, dout, inp, w, BT, C, OC, (mt_dtype)dt);
    }
    mt_gemm_impl impls[4] = {MT_GEMM_NAIVE, MT_GEMM_TILED, MT_GEMM_MMA, MT_GEMM_WGMMA};
    for (int k = 0; k < 4; k++) {
        mt_gemm_impl impl = impls[k];
        if (impl == MT_GEMM_WGMMA && mt__wgmma_unsupported()) continue;   // not a Hopper, or no sm_90a code
        int tensor_cores = impl == MT_GEMM_MMA || impl == MT_GEMM_WGMMA;
        for (int dt = tensor_cores ? 1 : 0; dt <= (tensor_cores ? 2 : 0); dt++) {
        // fp32 rungs: fp32 in another summation order (1e-5). Tensor-core rungs against the
        // emulation of their rounding: a product of two rounded operands (8 or 11 significant
        // bits) is exact in fp32, so only the order (and the tensor cores' fp32 accumulation) of
        // the sums differs: 1e-4
        double tol = tensor_cores ? 1e-4 : 1e-5;
        dev_poison(d_out, nout);
        dev_set(d_dinp, dinp0, nin); dev_set(d_dw, dw0, nw); dev_set(d_db, db0, OC);
        mt_matmul_forward_gpu(d_out, d_inp, d_w, with_bias ? d_bias : NULL, BT, C, OC, impl, dt, 0);
        mt_matmul_backward_gpu(with_dinp ? d_dinp : NULL, d_dw, with_bias ? d_db : NULL, d_dout, d_inp, d_w, BT, C, OC, impl, dt, 0);
        char label[160];
        char name[32];
        snprintf(name, sizeof name, "%s%s", mt_gemm_impl_name(impl), dt == 2 ? " fp16" : dt == 1 ? " bf16" : "");
        float *got = dev_download(d_out, nout);
        snprintf(label, sizeof label, "matmul %s forward BT=%d C=%d OC=%d%s%s", name, BT, C, OC, with_bias ? "" : " (no bias)", misalign ? " misaligned" : "");
        check_close_scale(label, got, out_r[dt], nout, tol, matmul_forward_term_scale(inp, w, with_bias ? bias : NULL, BT, C, OC)); free(got);
        if (with_dinp) {
            got = dev_download(d_dinp, nin);
            snprintf(label, sizeof label, "matmul %s dinp BT=%d C=%d OC=%d", name, BT, C, OC);
            check_close(label, got, dinp_r[dt], nin, tol); free(got);   // '=': the random start is gone
        }
        got = dev_download(d_dw, nw);
        snprintf(label, sizeof label, "matmul %s dweight BT=%d C=%d OC=%d", name, BT, C, OC);
        check_added(label, got, dw_r[dt], dw0, nw, tol); free(got);
        if (with_bias) {
            got = dev_download(d_db, OC);
            snprintf(label, sizeof label, "matmul %s dbias BT=%d C=%d OC=%d", name, BT, C, OC);
            // fp32 column sums in any rung, in another order than the CPU's
            check_added_scale(label, got, db_ref, db0, OC, 1e-5, column_sum_term_scale(dout, BT, OC)); free(got);
        }
        // the backward split as a tensor-parallel layer runs it (megatron.h section 4): dinp alone (the
        // input not read: NULL here), its all-reduce started, then dweight and dbias alone: the joint
        // call's bits, and the first call leaves dweight and dbias alone
        if (with_dinp) {
            float *dinp_joint = dev_download(d_dinp, nin), *dw_joint = dev_download(d_dw, nw);
            float *db_joint = with_bias ? dev_download(d_db, OC) : NULL;
            dev_poison(d_dinp, nin); dev_set(d_dw, dw0, nw); dev_set(d_db, db0, OC);
            mt_matmul_backward_gpu(d_dinp, NULL, NULL, d_dout, NULL, d_w, BT, C, OC, impl, dt, 0);
            snprintf(label, sizeof label, "matmul %s backward split: dinp alone leaves dweight, dbias BT=%d C=%d OC=%d",
                     name, BT, C, OC);
            got = dev_download(d_dw, nw); check_close(label, got, dw0, nw, 0.0); free(got);
            got = dev_download(d_db, OC); check_close(label, got, db0, OC, 0.0); free(got);
            mt_matmul_backward_gpu(NULL, d_dw, with_bias ? d_db : NULL, d_dout, d_inp, d_w, BT, C, OC, impl, dt, 0);
            snprintf(label, sizeof label, "matmul %s backward split: the joint call's bits BT=%d C=%d OC=%d", name, BT, C,
                     OC);
            got = dev_download(d_dinp, nin); check_close(label, got, dinp_joint, nin, 0.0); free(got);
            got = dev_download(d_dw, nw); check_close(label, got, dw_joint, nw, 0.0); free(got);
            if (with_bias) { got = dev_download(d_db, OC); check_close(label, got, db_joint, OC, 0.0); free(got); }
            free(dinp_joint); free(dw_joint); free(db_joint);
        }
        // the backward from an input already in 16 bits (a layer's ln1 / ln2, mt_ln_gemm_dtype: the
        // wgmma rung only): the same bits as from the fp32 input, which the rung rounds to the same
        if (impl == MT_GEMM_WGMMA && C % 8 == 0 && OC % 8 == 0 && !misalign) {
            float *dinp32 = with_dinp ? dev_download(d_dinp, nin) : NULL, *dw32 = dev_download(d_dw, nw);
            float *db32 = with_bias ? dev_download(d_db, OC) : NULL;
            void *in16 = dev_alloc(nin * 2 + 16);
            if (dt == MT_DTYPE_FP16) mt_cast_f32_to_f16_gpu((__half *)in16, d_inp, nin, 0);
            else mt_cast_f32_to_bf16_gpu((__nv_bfloat16 *)in16, d_inp, nin, 0);
            dev_set(d_dinp, dinp0, nin); dev_set(d_dw, dw0, nw); dev_set(d_db, db0, OC);
            mt_matmul_backward_inp16_gpu(with_dinp ? d_dinp : NULL, d_dw, with_bias ? d_db : NULL, d_dout, in16, d_w, BT, C,
                                         OC, impl, dt, 0);
            snprintf(label, sizeof label, "matmul %s backward from a 16-bit input BT=%d C=%d OC=%d", name, BT, C, OC);
            if (with_dinp) { got = dev_download(d_dinp, nin); check_close(label, got, dinp32, nin, 0.0); free(got); }
            got = dev_download(d_dw, nw); check_close(label, got, dw32, nw, 0.0); free(got);
            if (with_bias) { got = dev_download(d_db, OC); check_close(label, got, db32, OC, 0.0); free(got); }
            if (with_dinp) {
                // dinp written in 16 bits (the attention projection's, mt_datty_gemm_dtype: the STORE16
                // epilogue): the fp32 dinp rounded, bit for bit; dweight and dbias the same bits
                // (from the fp32 input, and from the 16-bit one: the attention projection's, whose input
                // atty the GPU keeps in 16 bits too, mt_atty_gemm_dtype)
                for (int from16 = 0; from16 <= 1; from16++) {
                    void *dinp16 = dev_alloc(nin * 2 + 16);
                    dev_set(d_dw, dw0, nw); dev_set(d_db, db0, OC);
                    mt_matmul_backward_dinp16_gpu((float *)dinp16, d_dw, with_bias ? d_db : NULL, d_dout,
                                                  from16 ? NULL : d_inp, from16 ? in16 : NULL, d_w, BT, C, OC, dt, 0);
                    float *wide = dev_download16(dinp16, nin, dt), *want = (float *)mt_malloc(nin * sizeof(float), "dinp");
                    for (size_t i = 0; i < nin; i++) want[i] = mt_round_to_dtype(dinp32[i], (mt_dtype)dt);
                    snprintf(label, sizeof label, "matmul %s backward into a 16-bit dinp%s BT=%d C=%d OC=%d", name,
                             from16 ? " from a 16-bit input" : "", BT, C, OC);
                    check_close(label, wide, want, nin, 0.0);
                    got = dev_download(d_dw, nw); check_close(label, got, dw32, nw, 0.0); free(got);
                    if (with_bias) { got = dev_download(d_db, OC); check_close(label, got, db32, OC, 0.0); free(got); }
                    free(wide); free(want); dev_free(dinp16);
                }
            }
            if (BT > MT_GEMV_MAX_ROWS) {   // the forward from the 16-bit input (the attention projection's, from
                                           // atty in 16 bits): the bits of the forward from the fp32 input
                mt_matmul_forward_gpu(d_out, d_inp, d_w, with_bias ? d_bias : NULL, BT, C, OC, impl, dt, 0);
                float *want = dev_download(d_out, nout);
                dev_poison(d_out, nout);
                mt_matmul_forward_inp16_gpu(d_out, in16, dt, d_w, with_bias ? d_bias : NULL, NULL, BT, C, OC, impl, 0);
                got = dev_download(d_out, nout);
                snprintf(label, sizeof label, "matmul %s forward from a 16-bit input BT=%d C=%d OC=%d", name, BT, C, OC);
                check_close(label, got, want, nout, 0.0);
                free(got);
                // and with the residual stream's add in the epilogue (the attention projection's
                // residual2 = x + product, MT__EPI_RESIDUAL): x + that product, bit for bit
                float *res = host_random(nout, -2, 2), *d_res = dev_upload(res, nout);
                for (size_t i = 0; i < nout; i++) want[i] = res[i] + want[i];
                dev_poison(d_out, nout);
                mt_matmul_forward_inp16_gpu(d_out, in16, dt, d_w, with_bias ? d_bias : NULL, d_res, BT, C, OC, impl, 0);
                got = dev_download(d_out, nout);
                snprintf(label, sizeof label, "matmul %s forward from a 16-bit input + residual BT=%d C=%d OC=%d", name, BT,
                         C, OC);
                check_close(label, got, want, nout, 0.0);
                free(got); free(want); free(res); dev_free(d_res);
            }
            free(dinp32); free(dw32); free(db32);
            dev_free(in16);
        }
        }
    }
    // decoding's GEMV from the 16-bit copy of the weight (mt_device_weights16): the values the
    // tensor-core rungs round the weight to, stored rounded; the same products as above (1e-4),
    // on tensor cores (mt_matmul_kernel6_gemv_mma, where C % 8 == 0 and aligned) and on the CUDA cores
    for (int dt = 1; dt <= 2 && BT <= MT_GEMV_MAX_ROWS; dt++)
        for (int cores = 0; cores < 2; cores++) {
            void *d_w16 = dev_alloc(nw * 2 + 16);
            if (dt == MT_DTYPE_FP16) mt_cast_f32_to_f16_gpu((__half *)d_w16, d_w, nw, 0);
            else mt_cast_f32_to_bf16_gpu((__nv_bfloat16 *)d_w16, d_w, nw, 0);
            dev_poison(d_out, nout);
            int was = mt__gemv_mma_from_rows;
            mt__gemv_mma_from_rows = cores ? MT_GEMV_MAX_ROWS + 1 : 1;   // 1: the CUDA-core loop
            mt_matmul_forward_rounded_weight_gpu(d_out, d_inp, d_w16, with_bias ? d_bias : NULL, BT, C, OC, dt, 0);
            mt__gemv_mma_from_rows = was;
            char label[160];
            snprintf(label, sizeof label, "matmul GEMV (%s), %s weights stored in 16 bits, BT=%d C=%d OC=%d%s",
                     cores ? "CUDA cores" : C % 8 == 0 && !misalign ? "tensor cores" : "CUDA cores: C % 8 or alignment",
                     dt == 2 ? "fp16" : "bf16", BT, C, OC, misalign ? " misaligned input" : "");
            float *got = dev_download(d_out, nout);
            check_close_scale(label, got, out_r[dt], nout, 1e-4,
                              matmul_forward_term_scale(inp, w, with_bias ? bias : NULL, BT, C, OC));
            free(got);
            dev_free(d_w16);
        }
    for (int dt = 1; dt <= 2; dt++) { free(out_r[dt]); free(dinp_r[dt]); free(dw_r[dt]); }
    free(inp); free(w); free(bias); free(dout); free(dinp0); free(dw0); free(db0); free(out_ref); free(dinp_ref); free(dw_ref); free(db_ref);
    dev_free(d_inp_base); dev_free(d_w_base); dev_free(d_dout_base); dev_free(d_bias); dev_free(d_out); dev_free(d_dinp); dev_free(d_dw); dev_free(d_db);
}
MT_TEST(matmul) {
    // BT (= M), C (= K of the forward), OC (= N); non-multiples of every tile size, and GPT-2's
    int shapes[][3] = {{1, 3, 1},     {7, 64, 5},     {100, 100, 130}, {513, 768, 2304}, {1, 768, 2304}, {513, 3, 130},
                       {100, 768, 1}, {7, 100, 2304}, {64, 64, 64},   {256, 128, 384},  {4096, 64, 64}, {1024, 768, 768},
                       {8, 1000, 13}, {3, 3072, 771},    // (the GEMV's: k steps of 32 cut short, outputs past a block of 8)
                       {1, 3072, 771}, {1, 1536, 200},   // (its input multicast to a cluster, 12 k steps a warp, blocks padded to 8;
                       {1, 64, 5}};                      //  warps without a k step)
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) matmul_case(shapes[s][0], shapes[s][1], shapes[s][2], 1, 1, 0);
    matmul_case(100, 64, 130, 0, 0, 0);   // no bias, no dinp
    matmul_case(100, 64, 130, 1, 1, 1);   // operands not 16-byte aligned
    matmul_case(33, 768, 68, 1, 1, 1);
}

// the MLP's linears with the GELU fused into them (mt_matmul_forward_gelu_gpu: the wgmma rung's
// epilogue, the GEMV's for a few rows; mt_matmul_backward_gelu_gpu: the dinp GEMM's epilogue)
// against the CPU's two ops (mt_matmul_*_gelu_cpu), on every tensor-core rung, bf16 and fp16.
// Tolerances as the matmul's (1e-4, the products' order); gelu and gelu' add the device tanhf's
// last bit, far below that.
static void matmul_gelu_case(int BT, int C, int OC) {
    // forward: the fc layer, inp (BT, C) @ w^T, w (OC, C) -> pre, out (BT, OC). backward: the
    // fc-proj layer on the same w read as (C rows of OC): out2 (BT, C) = gelu(x) @ w^T with x (BT, OC),
    // dout2 (BT, C) -> dx (BT, OC), dw (C x OC = the same nw floats), db (C)
    size_t nin = (size_t)BT * C, nw = (size_t)OC * C, nout = (size_t)BT * OC;
    float *inp = host_random(nin, -1, 1), *w = host_random(nw, -1, 1), *bias = host_random(OC, -1, 1);
    float *x = host_random(nout, -3, 3), *dout2 = host_random(nin, -1, 1);
    float *dw0 = host_random(nw, -1, 1), *db0 = host_random(C, -1, 1);
    float *d_inp = dev_upload(inp, nin), *d_w = dev_upload(w, nw), *d_bias = dev_upload(bias, OC);
    float *d_x = dev_upload(x, nout), *d_dout2 = dev_upload(dout2, nin);
    float *d_pre = dev_nan(nout), *d_out = dev_nan(nout), *d_dx = dev_nan(nout), *d_dw = dev_nan(nw), *d_db = dev_nan(C);
    void *d_w16 = dev_alloc(nw * 2 + 16);
    mt_gemm_impl impls[2] = {MT_GEMM_MMA, MT_GEMM_WGMMA};
    for (int k = 0; k < 2; k++) {
        if (impls[k] == MT_GEMM_WGMMA && mt__wgmma_unsupported()) continue;
        for (int dt = 1; dt <= 2; dt++) {
            const char *rung = mt_gemm_impl_name(impls[k]), *type = dt == 2 ? "fp16" : "bf16";
            float *pre_r = (float *)mt_malloc(nout * sizeof(float), "ref"), *out_r = (float *)mt_malloc(nout * sizeof(float), "ref");
            float *dx_r = (float *)mt_malloc(nout * sizeof(float), "ref"), *dw_r = host_copy(dw0, nw), *db_r = host_copy(db0, C);
            mt_matmul_forward_gelu_cpu(pre_r, out_r, inp, w, bias, BT, C, OC, (mt_dtype)dt);
            mt_matmul_backward_gelu_cpu(dx_r, dw_r, db_r, dout2, x, w, x, BT, OC, C, (mt_dtype)dt);
            // forward, from the fp32 weight and (for a few rows) from the decoding's 16-bit copy of it
            for (int from16 = 0; from16 <= (BT <= MT_GEMV_MAX_ROWS); from16++) {
                if (dt == MT_DTYPE_FP16) mt_cast_f32_to_f16_gpu((__half *)d_w16, d_w, nw, 0);
                else mt_cast_f32_to_bf16_gpu((__nv_bfloat16 *)d_w16, d_w, nw, 0);
                dev_poison(d_pre, nout); dev_poison(d_out, nout);
                mt_matmul_forward_gelu_gpu(d_pre, d_out, d_inp, d_w, from16 ? d_w16 : NULL, d_bias, BT, C, OC, impls[k], dt, 0);
                char label[160];
                double sc = matmul_forward_term_scale(inp, w, bias, BT, C, OC);
                snprintf(label, sizeof label, "matmul + gelu %s %s forward: pre BT=%d C=%d OC=%d%s", rung, type, BT, C, OC,
                         from16 ? " (16-bit weights)" : "");
                float *got = dev_download(d_pre, nout); check_close_scale(label, got, pre_r, nout, 1e-4, sc); free(got);
                snprintf(label, sizeof label, "matmul + gelu %s %s forward: gelu BT=%d C=%d OC=%d%s", rung, type, BT, C, OC,
                         from16 ? " (16-bit weights)" : "");
                got = dev_download(d_out, nout); check_close_scale(label, got, out_r, nout, 1e-4, sc); free(got);
            }
            dev_poison(d_dx, nout);
            dev_set(d_dw, dw0, nw); dev_set(d_db, db0, C);
            mt_matmul_backward_gelu_gpu(d_dx, d_dw, d_db, d_dout2, d_x, d_w, d_x, MT_DTYPE_FP32, BT, OC, C, impls[k], dt, 0);
            char label[160];
            snprintf(label, sizeof label, "matmul + gelu %s %s backward: dx BT=%d C=%d OC=%d", rung, type, BT, OC, C);
            float *got = dev_download(d_dx, nout); check_close(label, got, dx_r, nout, 1e-4); free(got);
            snprintf(label, sizeof label, "matmul + gelu %s %s backward: dweight BT=%d", rung, type, BT);
            got = dev_download(d_dw, nw); check_added(label, got, dw_r, dw0, nw, 1e-4); free(got);
            snprintf(label, sizeof label, "matmul + gelu %s %s backward: dbias BT=%d", rung, type, BT);
            got = dev_download(d_db, C); check_added(label, got, db_r, db0, C, 1e-4); free(got);
            // the training MLP (mt_mlp_forward_gpu, and the backward with inp = NULL): gelu's output is
            // never kept in fp32, but handed over in 16 bits (the forward's GELU16 epilogue) or remade
            // rounded (the backward). Both must give exactly what the unfused device ops give from
            // gelu(x) in fp32 (the GEMMs round it the same way): tolerance 0. And against the CPU's
            // op at bf16's 1e-2: an fp32 difference in gelu's input can flip gelu's rounding.
            float *d_gx = dev_nan(nout), *gx = (float *)mt_malloc(nout * sizeof(float), "gelu(x)");
            mt_gelu_forward_gpu(d_gx, d_x, nout, 0);
            float *dx_u, *dw_u;   // the unfused: inp = gelu(x) from the GELU kernel
            dev_poison(d_dx, nout); dev_set(d_dw, dw0, nw); dev_set(d_db, db0, C);
            mt_matmul_backward_gelu_gpu(d_dx, d_dw, d_db, d_dout2, d_gx, d_w, d_x, MT_DTYPE_FP32, BT, OC, C, impls[k], dt, 0);
            dx_u = dev_download(d_dx, nout); dw_u = dev_download(d_dw, nw);
            dev_poison(d_dx, nout); dev_set(d_dw, dw0, nw); dev_set(d_db, db0, C);
            mt_matmul_backward_gelu_gpu(d_dx, d_dw, d_db, d_dout2, NULL, d_w, d_x, MT_DTYPE_FP32, BT, OC, C, impls[k], dt, 0);
            snprintf(label, sizeof label, "matmul + gelu %s %s backward, gelu(x) remade: dx BT=%d", rung, type, BT);
            got = dev_download(d_dx, nout); check_close(label, got, dx_u, nout, 0.0); free(got);
            snprintf(label, sizeof label, "matmul + gelu %s %s backward, gelu(x) remade: dweight BT=%d", rung, type, BT);
            got = dev_download(d_dw, nw); check_close(label, got, dw_u, nw, 0.0); free(got);
            free(dx_u); free(dw_u);
            // forward: fc (w, bias), GELU, fc-proj (w2: C rows of OC, bias2) in one op
            float *w2 = host_random(nw, -1, 1), *bias2 = host_random(C, -1, 1);
            float *d_w2 = dev_upload(w2, nw), *d_bias2 = dev_upload(bias2, C), *d_y = dev_nan(nin), *d_y_u = dev_nan(nin);
            mt_matmul_forward_gelu_gpu(d_pre, d_out, d_inp, d_w, NULL, d_bias, BT, C, OC, impls[k], dt, 0);
            mt_matmul_forward_gpu(d_y_u, d_out, d_w2, d_bias2, BT, OC, C, impls[k], dt, 0);
            float *pre_u = dev_download(d_pre, nout), *y_u = dev_download(d_y_u, nin);
            dev_poison(d_pre, nout);
            mt_mlp_forward_gpu(d_pre, MT_DTYPE_FP32, d_y, d_inp, MT_DTYPE_FP32, d_w, d_bias, d_w2, d_bias2, NULL, BT, C, OC, C,
                               impls[k], dt, 0);
            snprintf(label, sizeof label, "mlp %s %s forward: fch BT=%d C=%d F=%d", rung, type, BT, C, OC);
            got = dev_download(d_pre, nout); check_close(label, got, pre_u, nout, 0.0); free(got);
            snprintf(label, sizeof label, "mlp %s %s forward: out BT=%d C=%d F=%d", rung, type, BT, C, OC);
            got = dev_download(d_y, nin); check_close(label, got, y_u, nin, 0.0);
            float *fch_r = (float *)mt_malloc(nout * sizeof(float), "ref"), *y_r = (float *)mt_malloc(nin * sizeof(float), "ref");
            mt_mlp_forward_cpu(fch_r, y_r, inp, w, bias, w2, bias2, NULL, BT, C, OC, C, (mt_dtype)dt, MT_DTYPE_FP32);
            snprintf(label, sizeof label, "mlp %s %s forward: out against the CPU BT=%d C=%d F=%d", rung, type, BT, C, OC);
            check_close(label, got, y_r, nin, 1e-2); free(got);
            {   // the residual stream's add joined to fc-proj's product (the wgmma rung's RESIDUAL epilogue,
                // a residual pass elsewhere): residual + the unfused product, bit for bit
                float *res = host_random(nin, -2, 2), *d_res = dev_upload(res, nin);
                float *want = (float *)mt_malloc(nin * sizeof(float) + 16, "ref");
                for (size_t i = 0; i < nin; i++) want[i] = res[i] + y_u[i];
                dev_poison(d_y, nin);
                mt_mlp_forward_gpu(d_pre, MT_DTYPE_FP32, d_y, d_inp, MT_DTYPE_FP32, d_w, d_bias, d_w2, d_bias2, d_res, BT, C,
                                   OC, C, impls[k], dt, 0);
                snprintf(label, sizeof label, "mlp %s %s forward + residual: out BT=%d C=%d F=%d", rung, type, BT, C, OC);
                got = dev_download(d_y, nin); check_close(label, got, want, nin, 0.0); free(got);
                free(res); free(want); dev_free(d_res);
            }
            // the training MLP with its fc output kept in 16 bits (mt_fch_gemm_dtype: the wgmma rung):
            // fch is the fp32 one rounded, and out, dx, dweight are exactly what the fp32-fch path gives
            // when its fch is those rounded values (the GELU, its remake and its derivative all read
            // the same numbers): tolerance 0. And out against the CPU's op with fch_dt at bf16's 1e-2.
            if (mt_fch_gemm_dtype(impls[k], (mt_dtype)dt, BT, C, OC) != MT_DTYPE_FP32) {
                void *f16 = dev_alloc(nout * 2 + 16);
                float *pre_rounded = (float *)mt_malloc(nout * sizeof(float), "fch rounded");
                for (size_t i = 0; i < nout; i++) pre_rounded[i] = mt_round_to_dtype(pre_u[i], (mt_dtype)dt);
                dev_poison(d_y, nin);
                mt_mlp_forward_gpu((float *)f16, dt, d_y, d_inp, MT_DTYPE_FP32, d_w, d_bias, d_w2, d_bias2, NULL, BT, C, OC, C,
                                   impls[k], dt, 0);
                float *widened = dev_download16(f16, nout, dt);
                snprintf(label, sizeof label, "mlp %s %s forward, fch in 16 bits: fch BT=%d C=%d F=%d", rung, type, BT, C, OC);
                check_close(label, widened, pre_rounded, nout, 0.0);
                float *d_fr = dev_upload(pre_rounded, nout), *d_g = dev_nan(nout), *d_y2 = dev_nan(nin);
                mt_gelu_forward_gpu(d_g, d_fr, nout, 0);
                mt_matmul_forward_gpu(d_y2, d_g, d_w2, d_bias2, BT, OC, C, impls[k], dt, 0);
                float *y16 = dev_download(d_y, nin), *y2 = dev_download(d_y2, nin);
                snprintf(label, sizeof label, "mlp %s %s forward, fch in 16 bits: out BT=%d C=%d F=%d", rung, type, BT, C, OC);
                check_close(label, y16, y2, nin, 0.0);
                float *fch_c = (float *)mt_malloc(nout * sizeof(float), "ref"), *y_c = (float *)mt_malloc(nin * sizeof(float), "ref");
                mt_mlp_forward_cpu(fch_c, y_c, inp, w, bias, w2, bias2, NULL, BT, C, OC, C, (mt_dtype)dt, (mt_dtype)dt);
                snprintf(label, sizeof label, "mlp %s %s forward, fch in 16 bits: out against the CPU BT=%d", rung, type, BT);
                check_close(label, y16, y_c, nin, 1e-2);
                // the backward from the 16-bit fch against the fp32 path on the same values
                float *dx32, *dw32;
                dev_poison(d_dx, nout); dev_set(d_dw, dw0, nw); dev_set(d_db, db0, C);
                mt_matmul_backward_gelu_gpu(d_dx, d_dw, d_db, d_dout2, NULL, d_w, d_fr, MT_DTYPE_FP32, BT, OC, C, impls[k], dt, 0);
                dx32 = dev_download(d_dx, nout); dw32 = dev_download(d_dw, nw);
                dev_poison(d_dx, nout); dev_set(d_dw, dw0, nw); dev_set(d_db, db0, C);
                mt_matmul_backward_gelu_gpu(d_dx, d_dw, d_db, d_dout2, NULL, d_w, f16, dt, BT, OC, C, impls[k], dt, 0);
                snprintf(label, sizeof label, "matmul + gelu %s %s backward from a 16-bit fch: dweight BT=%d", rung, type, BT);
                got = dev_download(d_dw, nw); check_close(label, got, dw32, nw, 0.0); free(got);
                // dx, fch's gradient, comes in the same 16 bits: the fp32 path's dx rounded, bit for bit
                float *dx16 = dev_download16(d_dx, nout, dt), *dx32r = (float *)mt_malloc(nout * sizeof(float), "dfch");
                for (size_t i = 0; i < nout; i++) dx32r[i] = mt_round_to_dtype(dx32[i], (mt_dtype)dt);
                snprintf(label, sizeof label, "matmul + gelu %s %s backward from a 16-bit fch: dx in 16 bits BT=%d", rung, type, BT);
                check_close(label, dx16, dx32r, nout, 0.0);
                // the fc's backward from that 16-bit gradient (mt_matmul_backward_dout16_gpu: dbias summed
                // from the 16-bit values, no rounded copy of them), from an fp32 input and from one
                // already in 16 bits (ln2 as the layernorm stores it), against the fp32 backward of the
                // widened values: the same rounded operands, the same column-sum order: tolerance 0
                float *d_dx16w = dev_upload(dx16, nout), *fdb0 = host_random(OC, -1, 1);
                float *d_fdi = dev_nan(nin), *d_fdw = dev_nan(nw), *d_fdb = dev_nan(OC);
                dev_set(d_fdw, dw0, nw); dev_set(d_fdb, fdb0, OC);
                mt_matmul_backward_gpu(d_fdi, d_fdw, d_fdb, d_dx16w, d_inp, d_w, BT, C, OC, impls[k], dt, 0);
                float *fdi32 = dev_download(d_fdi, nin), *fdw32 = dev_download(d_fdw, nw), *fdb32 = dev_download(d_fdb, OC);
                void *in16 = dev_alloc(nin * 2 + 16);
                if (dt == MT_DTYPE_FP16) mt_cast_f32_to_f16_gpu((__half *)in16, d_inp, nin, 0);
                else mt_cast_f32_to_bf16_gpu((__nv_bfloat16 *)in16, d_inp, nin, 0);
                for (int from16 = 0; from16 < 2; from16++) {
                    const char *what = from16 ? "a 16-bit input" : "an fp32 input";
                    dev_poison(d_fdi, nin); dev_set(d_fdw, dw0, nw); dev_set(d_fdb, fdb0, OC);
                    mt_matmul_backward_dout16_gpu(d_fdi, d_fdw, d_fdb, d_dx, from16 ? NULL : d_inp, from16 ? in16 : NULL,
                                                  d_w, BT, C, OC, dt, 0);
                    snprintf(label, sizeof label, "fc %s backward from a 16-bit gradient and %s: dinp BT=%d", type, what, BT);
                    got = dev_download(d_fdi, nin); check_close(label, got, fdi32, nin, 0.0); free(got);
                    snprintf(label, sizeof label, "fc %s backward from a 16-bit gradient and %s: dweight BT=%d", type, what, BT);
                    got = dev_download(d_fdw, nw); check_close(label, got, fdw32, nw, 0.0); free(got);
                    snprintf(label, sizeof label, "fc %s backward from a 16-bit gradient and %s: dbias BT=%d", type, what, BT);
                    got = dev_download(d_fdb, OC); check_close(label, got, fdb32, OC, 0.0); free(got);
                    // split as a tensor-parallel layer runs it (megatron.h section 4): dinp alone (no input
                    // read), then dweight and dbias alone: the same bits
                    dev_poison(d_fdi, nin); dev_set(d_fdw, dw0, nw); dev_set(d_fdb, fdb0, OC);
                    mt_matmul_backward_dout16_gpu(d_fdi, NULL, NULL, d_dx, NULL, NULL, d_w, BT, C, OC, dt, 0);
                    snprintf(label, sizeof label, "fc %s backward split, %s: dinp alone leaves dweight, dbias BT=%d", type,
                             what, BT);
                    got = dev_download(d_fdw, nw); check_close(label, got, dw0, nw, 0.0); free(got);
                    got = dev_download(d_fdb, OC); check_close(label, got, fdb0, OC, 0.0); free(got);
                    mt_matmul_backward_dout16_gpu(NULL, d_fdw, d_fdb, d_dx, from16 ? NULL : d_inp, from16 ? in16 : NULL,
                                                  d_w, BT, C, OC, dt, 0);
                    snprintf(label, sizeof label, "fc %s backward split, %s: dinp, dweight, dbias BT=%d", type, what, BT);
                    got = dev_download(d_fdi, nin); check_close(label, got, fdi32, nin, 0.0); free(got);
                    got = dev_download(d_fdw, nw); check_close(label, got, fdw32, nw, 0.0); free(got);
                    got = dev_download(d_fdb, OC); check_close(label, got, fdb32, OC, 0.0); free(got);
                }
                free(dx16); free(dx32r); free(fdb0); free(fdi32); free(fdw32); free(fdb32);
                dev_free(d_dx16w); dev_free(d_fdi); dev_free(d_fdw); dev_free(d_fdb); dev_free(in16);
                free(dx32); free(dw32); free(y16); free(y2); free(fch_c); free(y_c); free(widened);
                free(pre_rounded);
                dev_free(f16); dev_free(d_fr); dev_free(d_g); dev_free(d_y2);
            }
            // the qkv projection stored in 16 bits (mt_matmul_forward16_gpu): the fp32 forward, rounded
            {
                void *q16 = dev_alloc(nout * 2 + 16);
                unsigned short *want16 = (unsigned short *)mt_malloc(nout * 2 + 2, "rounded"), *got16;
                mt_matmul_forward_gpu(d_pre, d_inp, d_w, d_bias, BT, C, OC, impls[k], dt, 0);
                if (dt == MT_DTYPE_FP16) mt_cast_f32_to_f16_gpu((__half *)q16, d_pre, nout, 0);
                else mt_cast_f32_to_bf16_gpu((__nv_bfloat16 *)q16, d_pre, nout, 0);
                MT_CUDA_CHECK(cudaMemcpy(want16, q16, nout * 2, cudaMemcpyDeviceToHost));
                MT_CUDA_CHECK(cudaMemset(q16, 0xff, nout * 2));
                mt_matmul_forward16_gpu(q16, d_inp, MT_DTYPE_FP32, d_w, d_bias, BT, C, OC, impls[k], dt, 0);
                got16 = (unsigned short *)mt_malloc(nout * 2 + 2, "got");
                MT_CUDA_CHECK(cudaMemcpy(got16, q16, nout * 2, cudaMemcpyDeviceToHost));
                size_t differ = 0;
                for (size_t i = 0; i < nout; i++) differ += got16[i] != want16[i];
                snprintf(label, sizeof label, "qkv forward in 16 bits %s %s BT=%d C=%d OC=%d", rung, type, BT, C, OC);
                mt_expect(differ == 0, "%s: %zu of %zu values differ from the fp32 forward rounded", label, differ, nout);
                // from an input already in 16 bits (a layer's ln1 as the layernorm stores it on the
                // wgmma rung, mt_ln_gemm_dtype): the GEMM's own rounding of it skipped, the same bits
                if (impls[k] == MT_GEMM_WGMMA && C % 8 == 0 && BT > MT_GEMV_MAX_ROWS) {
                    void *in16 = dev_alloc(nin * 2 + 16);
                    if (dt == MT_DTYPE_FP16) mt_cast_f32_to_f16_gpu((__half *)in16, d_inp, nin, 0);
                    else mt_cast_f32_to_bf16_gpu((__nv_bfloat16 *)in16, d_inp, nin, 0);
                    MT_CUDA_CHECK(cudaMemset(q16, 0xff, nout * 2));
                    mt_matmul_forward16_gpu(q16, (const float *)in16, dt, d_w, d_bias, BT, C, OC, impls[k], dt, 0);
                    MT_CUDA_CHECK(cudaMemcpy(got16, q16, nout * 2, cudaMemcpyDeviceToHost));
                    differ = 0;
                    for (size_t i = 0; i < nout; i++) differ += got16[i] != want16[i];
                    mt_expect(differ == 0, "%s from a 16-bit input: %zu of %zu values differ", label, differ, nout);
                    if (OC % 8 == 0) {   // the MLP's fc from a 16-bit ln2 (F = OC here), against its fp32-input run
                        float *fch32, *y32;
                        dev_poison(d_pre, nout); dev_poison(d_y, nin);
                        mt_mlp_forward_gpu(d_pre, MT_DTYPE_FP32, d_y, d_inp, MT_DTYPE_FP32, d_w, d_bias, d_w2, d_bias2,
                                           NULL, BT, C, OC, C, impls[k], dt, 0);
                        fch32 = dev_download(d_pre, nout); y32 = dev_download(d_y, nin);
                        dev_poison(d_pre, nout); dev_poison(d_y, nin);
                        mt_mlp_forward_gpu(d_pre, MT_DTYPE_FP32, d_y, (const float *)in16, dt, d_w, d_bias, d_w2,
                                           d_bias2, NULL, BT, C, OC, C, impls[k], dt, 0);
                        snprintf(label, sizeof label, "mlp %s %s forward from a 16-bit input: fch BT=%d", rung, type, BT);
                        float *g2 = dev_download(d_pre, nout); check_close(label, g2, fch32, nout, 0.0); free(g2);
                        snprintf(label, sizeof label, "mlp %s %s forward from a 16-bit input: out BT=%d", rung, type, BT);
                        g2 = dev_download(d_y, nin); check_close(label, g2, y32, nin, 0.0); free(g2);
                        free(fch32); free(y32);
                    }
                    dev_free(in16);
                }
                free(want16); free(got16); dev_free(q16);
            }
            free(gx); free(pre_u); free(y_u); free(w2); free(bias2); free(fch_r); free(y_r);
            dev_free(d_gx); dev_free(d_w2); dev_free(d_bias2); dev_free(d_y); dev_free(d_y_u);
            free(pre_r); free(out_r); free(dx_r); free(dw_r); free(db_r);
        }
    }
    free(inp); free(w); free(bias); free(x); free(dout2); free(dw0); free(db0);
    dev_free(d_inp); dev_free(d_w); dev_free(d_bias); dev_free(d_x); dev_free(d_dout2); dev_free(d_pre); dev_free(d_out);
    dev_free(d_dx); dev_free(d_dw); dev_free(d_db); dev_free(d_w16);
}
MT_TEST(matmul_gelu) {
    int shapes[][3] = {{513, 768, 3072}, {1024, 64, 256}, {3, 768, 3072}, {100, 40, 72}, {2, 24, 16}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) matmul_gelu_case(shapes[s][0], shapes[s][1], shapes[s][2]);
}

// the wgmma GEMM's staged epilogue (through shared memory, kernels.cuh) against the unstaged one
// (straight from the registers), every epilogue, bf16 and fp16: the same arithmetic in the same
// order, so the same bits, in the whole output buffers (row stride N + 8: the 8 columns past N of
// every row, never written, must come back untouched; ragged M and N: the tile's and the chunk's
// edges). From the same starting contents (accumulate reads C).
// pp = 1: instead, the ping-pong schedule (cluster pairs, a 64 x 256 half of the unit a consumer
// warpgroup) against the cooperative 128 x 256 tile (both staged; the same plan, the same products in
// the same k order a row: the same bits), with the k-slices `splits` (0: the plan's; 3: three
// slices; -1: stream-K) for both
static void wgmma_staged_case(int M, int N, int K, int op, int accumulate, int f16, int pp = 0, int splits = 0) {
    int grad = op == MT__EPI_GELU_GRAD || op == MT__EPI_GELU_GRAD16 || op == MT__EPI_GELU_GRAD16_GELU16;
    int ldc = N + 8, a_k = 1, b_k = grad ? 0 : 1;
    int ldb = b_k ? K : N;   // B (N x K) k inner: rows of K; k outer (dinp's layout): K rows of N
    size_t na = (size_t)M * K, nb = (size_t)N * K, nc = (size_t)M * ldc;
    float *ha = host_random(na, -1, 1), *hb = host_random(nb, -1, 1), *hbias = host_random(N, -1, 1);
    float *hc = host_random(nc, -2, 2), *hx = host_random(nc, -3, 3);
    float *da = dev_upload(ha, na), *db = dev_upload(hb, nb), *dbias = dev_upload(hbias, N), *dx = dev_upload(hx, nc);
    void *a16 = dev_alloc(na * 2 + 16), *b16 = dev_alloc(nb * 2 + 16), *x16 = dev_alloc(nc * 2 + 16);
    if (f16) {
        mt_cast_f32_to_f16_gpu((__half *)a16, da, na, 0); mt_cast_f32_to_f16_gpu((__half *)b16, db, nb, 0);
        mt_cast_f32_to_f16_gpu((__half *)x16, dx, nc, 0);
    } else {
        mt_cast_f32_to_bf16_gpu((__nv_bfloat16 *)a16, da, na, 0); mt_cast_f32_to_bf16_gpu((__nv_bfloat16 *)b16, db, nb, 0);
        mt_cast_f32_to_bf16_gpu((__nv_bfloat16 *)x16, dx, nc, 0);
    }
    int sixteen_aux = op == MT__EPI_GELU_GRAD16 || op == MT__EPI_GELU_GRAD16_GELU16;
    mt__epilogue epi = {op, sixteen_aux ? (const void *)x16 : (const void *)dx, NULL};
    float *got[2][2];   // [staged][c, c2]
    int mode = mt__wgmma_pingpong_mode();
    for (int staged = 0; staged < 2; staged++) {   // (pp: 0 = the 128 x 256 tile, 1 = ping-pong)
        float *dc = dev_upload(hc, nc), *dc2 = dev_upload(hc, nc);
        epi.c2 = dc2;
        mt__wgmma_staged_epilogue = pp ? 1 : staged;
        mt__wgmma_pingpong = pp ? 0 : mode;
        mt__wgmma_force_pingpong = pp && staged;
        const float *bias = grad ? NULL : dbias;
        mt__gemm_wgmma_any(dc, a16, b16, f16, bias, M, N, K, K, ldb, ldc, a_k, b_k, accumulate, splits,
                           op == MT__EPI_NONE ? NULL : &epi, 0);
        got[staged][0] = dev_download(dc, nc);
        got[staged][1] = dev_download(dc2, nc);
        dev_free(dc); dev_free(dc2);
    }
    mt__wgmma_staged_epilogue = 1;
    mt__wgmma_pingpong = mode;
    mt__wgmma_force_pingpong = 0;
    const char *names[] = {"none", "gelu", "gelu_grad", "gelu16", "store16", "store16_gelu16", "gelu_grad16",
                           "gelu_grad16_gelu16"};
    for (int out = 0; out < 2; out++) {
        int same = memcmp(got[0][out], got[1][out], nc * sizeof(float)) == 0;
        mt_expect(same, "wgmma epilogue %s%s %s M=%d N=%d K=%d splits %d: %s %s", names[op],
                  accumulate ? " (accumulate)" : "", f16 ? "fp16" : "bf16", M, N, K, splits, out ? "c2" : "c",
                  pp ? "ping-pong differs from the 128 x 256 tile" : "staged differs from unstaged");
        if (!same)
            for (size_t i = 0, shown = 0; i < nc && shown < 3; i++)
                if (memcmp(&got[0][out][i], &got[1][out][i], 4) != 0) {
                    printf("    [%zu] (row %zu col %zu): %s %g %s %g\n", i, i / ldc, i % ldc, pp ? "128 x 256" : "unstaged",
                           got[0][out][i], pp ? "ping-pong" : "staged", got[1][out][i]);
                    shown++;
                }
        free(got[0][out]); free(got[1][out]);
    }
    free(ha); free(hb); free(hbias); free(hc); free(hx);
    dev_free(da); dev_free(db); dev_free(dbias); dev_free(dx); dev_free(a16); dev_free(b16); dev_free(x16);
}
MT_TEST(wgmma_staged_epilogue) {
    if (mt__wgmma_unsupported()) { printf("  SKIPPED: no wgmma rung on this GPU or binary\n"); return; }
    int shapes[][3] = {{300, 520, 200}, {129, 264, 768}, {1000, 3072, 768}, {77, 8, 64}, {256, 256, 64}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int op = 0; op <= MT__EPI_GELU_GRAD16_GELU16; op++)
            for (int f16 = 0; f16 < 2; f16++) {
                wgmma_staged_case(shapes[s][0], shapes[s][1], shapes[s][2], op, 0, f16);
                if (op == MT__EPI_NONE) wgmma_staged_case(shapes[s][0], shapes[s][1], shapes[s][2], op, 1, f16);
            }
}
// GELU_GRAD16_GELU16 (fc-proj's input gradient remaking the GELU's output for the weight gradient):
// its C bit for bit GELU_GRAD16's, its c2 bit for bit mt__gelu_rounded's pass over the same 16-bit
// input (which it replaces), in the whole (M, N + 8) buffers, staged and unstaged, unsplit, in 3
// k-slices and stream-K (the finish's one-output path), bf16 and fp16
MT_TEST(wgmma_gelu_remake) {
    if (mt__wgmma_unsupported()) { printf("  SKIPPED: no wgmma rung on this GPU or binary\n"); return; }
    int shapes[][3] = {{300, 520, 200}, {1000, 3072, 768}, {77, 8, 64}, {2048, 3072, 768}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int f16 = 0; f16 < 2; f16++)
            for (int staged = 0; staged < 2; staged++)
                for (int splits : {0, 3, -1}) {
                    int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2], ldc = N + 8;
                    size_t na = (size_t)M * K, nb = (size_t)N * K, nc = (size_t)M * ldc;
                    float *ha = host_random(na, -1, 1), *hb = host_random(nb, -1, 1), *hx = host_random(nc, -3, 3);
                    float *hc = host_random(nc, -2, 2);
                    float *da = dev_upload(ha, na), *db = dev_upload(hb, nb), *dx = dev_upload(hx, nc);
                    void *a16 = dev_alloc(na * 2 + 16), *b16 = dev_alloc(nb * 2 + 16), *x16 = dev_alloc(nc * 2 + 16);
                    if (f16) {
                        mt_cast_f32_to_f16_gpu((__half *)a16, da, na, 0); mt_cast_f32_to_f16_gpu((__half *)b16, db, nb, 0);
                        mt_cast_f32_to_f16_gpu((__half *)x16, dx, nc, 0);
                    } else {
                        mt_cast_f32_to_bf16_gpu((__nv_bfloat16 *)a16, da, na, 0);
                        mt_cast_f32_to_bf16_gpu((__nv_bfloat16 *)b16, db, nb, 0);
                        mt_cast_f32_to_bf16_gpu((__nv_bfloat16 *)x16, dx, nc, 0);
                    }
                    // the c buffers hold 16-bit values at row stride ldc: half of each fp32 buffer is used
                    float *c_ref = dev_upload(hc, nc), *c_new = dev_upload(hc, nc), *g_ref = dev_upload(hc, nc),
                          *g_new = dev_upload(hc, nc);
                    mt__wgmma_staged_epilogue = staged;
                    mt__epilogue ref = {MT__EPI_GELU_GRAD16, x16, NULL}, fused = {MT__EPI_GELU_GRAD16_GELU16, x16, g_new};
                    mt__gemm_wgmma_any(c_ref, a16, b16, f16, NULL, M, N, K, K, N, ldc, 1, 0, 0, splits, &ref, 0);
                    mt__gemm_wgmma_any(c_new, a16, b16, f16, NULL, M, N, K, K, N, ldc, 1, 0, 0, splits, &fused, 0);
                    mt__wgmma_staged_epilogue = 1;
                    mt__gelu_rounded(g_ref, x16, 1, nc, f16, 0);   // (the whole buffer: the 8 columns past N too)
                    float *hc_ref = dev_download(c_ref, nc), *hc_new = dev_download(c_new, nc);
                    unsigned short *hg_ref = (unsigned short *)dev_download(g_ref, nc),
                                   *hg_new = (unsigned short *)dev_download(g_new, nc);
                    int same_c = memcmp(hc_ref, hc_new, nc * sizeof(float)) == 0, same_g = 1;
                    for (int i = 0; i < M && same_g; i++)   // c2: the M x N outputs (the rest was never written)
                        same_g = memcmp(hg_ref + (size_t)i * ldc, hg_new + (size_t)i * ldc, (size_t)N * 2) == 0;
                    mt_expect(same_c && same_g, "gelu_grad16_gelu16 %s %s M=%d N=%d K=%d splits %d: %s%s", f16 ? "fp16" : "bf16",
                              staged ? "staged" : "unstaged", M, N, K, splits, same_c ? "" : "C differs from GELU_GRAD16's ",
                              same_g ? "" : "c2 differs from mt__gelu_rounded's");
                    free(ha); free(hb); free(hx); free(hc); free(hc_ref); free(hc_new); free(hg_ref); free(hg_new);
                    dev_free(da); dev_free(db); dev_free(dx); dev_free(a16); dev_free(b16); dev_free(x16);
                    dev_free(c_ref); dev_free(c_new); dev_free(g_ref); dev_free(g_new);
                }
}
// the ping-pong schedule (kernels.cuh, THE PING-PONG SCHEDULE) against the cooperative tile, bit
// for bit, in the layouts and epilogues it is built for (bf16, A k inner): ragged shapes (an odd
// number of 64-row halves: the pair's second block reads rows past M as zeros), one unit a pair,
// and many (20000 rows: 157 units on 66 pairs, 2 or 3 each, so both warpgroups hand over several
// times and some pairs end on an odd count; 16384 x 768: 6 units a pair); split-K and stream-K
// (each block its half of the partial) for the plain product
MT_TEST(wgmma_pingpong) {
    if (mt__wgmma_unsupported()) { printf("  SKIPPED: no wgmma rung on this GPU or binary\n"); return; }
    int shapes[][3] = {{300, 520, 200}, {129, 264, 768}, {1000, 3072, 768}, {77, 8, 64}, {20000, 256, 136},
                       {16384, 768, 768}};
    int ops[] = {MT__EPI_NONE, MT__EPI_STORE16, MT__EPI_STORE16_GELU16, MT__EPI_GELU_GRAD16};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int op : ops) {
            wgmma_staged_case(shapes[s][0], shapes[s][1], shapes[s][2], op, 0, 0, 1);
            if (op == MT__EPI_NONE) {
                wgmma_staged_case(shapes[s][0], shapes[s][1], shapes[s][2], op, 1, 0, 1);
                wgmma_staged_case(shapes[s][0], shapes[s][1], shapes[s][2], op, 1, 0, 1, 3);
                wgmma_staged_case(shapes[s][0], shapes[s][1], shapes[s][2], op, 0, 0, 1, -1);
            }
        }
}

// generation (megatron.h §11): attention over the KV cache and the greedy argmax
MT_TEST(decode) {
    // B, Tq (new tokens per sequence), C_local, NH_local, cap; sequence b starts at start[b]
    // (the last two: head sizes 8 and 12, the kernel's generic path, and caps that are not multiples of 4:
    // the float4s after the scores in shared memory must still be 16-byte aligned)
    // (Tq = 1 with a cache of more than 32 positions takes the split kernel, a cluster of up to 8
    // blocks per (sequence, head): GPT-2's 12 heads at cap 272, 8 slices of 34; head size 64 in 4
    // slices of 25; head size 48, the generic path, in 3 slices of 24 (one sequence at the cache's
    // last position); head sizes 128 and 16, which split in the generic form too (only 64 has its own
    // instantiation). Sequence 0 starts at 0, so only its first slice has positions.)
    int shapes[][5] = {{1, 1, 64, 1, 16}, {3, 1, 768, 12, 1024}, {3, 5, 128, 2, 40}, {2, 16, 96, 1, 300},
                       {2, 1, 32, 4, 19}, {3, 3, 24, 2, 21}, {1, 1, 768, 12, 272}, {3, 1, 64, 1, 100},
                       {3, 1, 96, 2, 70}, {2, 1, 128, 1, 200}, {2, 1, 64, 4, 90}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int B = shapes[s][0], Tq = shapes[s][1], C = shapes[s][2], NH = shapes[s][3], cap = shapes[s][4];
        int start[3];
        for (int b = 0; b < B; b++) start[b] = b == 0 ? 0 : rand_int(cap - Tq + 1);   // one at the very start
        if (s == 8) start[2] = cap - 1;                                                 // one at the very end
        size_t nq = (size_t)B * Tq * 3 * C, nout = (size_t)B * Tq * C, nc = (size_t)B * cap * C;
        float *qkv = host_random(nq, -1, 1), *k0 = host_random(nc, -1, 1), *v0 = host_random(nc, -1, 1);
        float *k_ref = host_copy(k0, nc), *v_ref = host_copy(v0, nc);
        float *out_ref = (float *)mt_malloc(nout * sizeof(float) + 16, "ref");
        mt_attention_cached_forward_cpu(out_ref, k_ref, v_ref, qkv, start, B, Tq, C, NH, cap);
        float *d_qkv = dev_upload(qkv, nq), *d_k = dev_upload(k0, nc), *d_v = dev_upload(v0, nc), *d_out = dev_nan(nout);
        int *d_start = dev_upload_int(start, (size_t)B);
        // both forms: the launcher's choice (0: split where Tq = 1) and one block per (sequence, head)
        // (1: the one-kernel decode step's), each from the same cache (the stores are the same values)
        char label[160];
        for (int splits = 0; splits <= 1; splits++) {
            dev_poison(d_out, nout);
            mt_attention_cached_forward_gpu(d_out, d_k, d_v, d_qkv, d_start, B, Tq, C, NH, cap, splits, 0);
            float *got = dev_download(d_out, nout);
            snprintf(label, sizeof label, "attention over the KV cache B=%d Tq=%d C=%d NH=%d cap=%d (%s)", B, Tq, C, NH,
                     cap, splits == 0 ? "as launched" : "unsplit");
            check_close(label, got, out_ref, nout, 1e-5);   // fp32, __expf and another summation order
            free(got);
        }
        float *got;
        got = dev_download(d_k, nc);
        check_close("KV cache keys stored", got, k_ref, nc, 0.0);   // copies
        free(got);
        got = dev_download(d_v, nc);
        check_close("KV cache values stored", got, v_ref, nc, 0.0);
        free(got);
        free(qkv); free(k0); free(v0); free(k_ref); free(v_ref); free(out_ref);
        dev_free(d_qkv); dev_free(d_k); dev_free(d_v); dev_free(d_out); dev_free(d_start);
    }
    // argmax of rows of padded logits, ties planted (the smaller index wins), the padding ignored;
    // NaN planted as the CPU's loop sees it: never chosen (row 1: where a thread meets it first, row
    // 2: anywhere), but at index 0 nothing beats it (row 3)
    int rows = 4, n = 50257, ld = 50304;
    float *x = host_random((size_t)rows * ld, -1, 1);
    for (int r = 0; r < rows; r++) {
        int a = rand_int(n), b = rand_int(n);
        x[(size_t)r * ld + a] = x[(size_t)r * ld + b] = 2.0f;   // a tie for the largest
        x[(size_t)r * ld + n + 3] = 5.0f;                      // padding: never chosen
    }
    for (int k = 0; k < 16; k++) x[(size_t)1 * ld + 1 + rand_int(1023)] = NAN;
    for (int k = 0; k < 16; k++) x[(size_t)2 * ld + 1 + rand_int(n - 1)] = NAN;
    x[(size_t)3 * ld] = NAN;
    int want[4], got_i[4];
    mt_argmax_rows_cpu(want, x, rows, n, ld);
    float *d_x = dev_upload(x, (size_t)rows * ld);
    int *d_i = (int *)dev_alloc(sizeof want);
    mt_argmax_rows_gpu(d_i, d_x, rows, n, ld, 0);
    MT_CUDA_CHECK(cudaMemcpy(got_i, d_i, sizeof got_i, cudaMemcpyDeviceToHost));
    mt_expect(memcmp(got_i, want, sizeof want) == 0, "argmax rows: got %d %d %d %d, want %d %d %d %d", got_i[0], got_i[1],
              got_i[2], got_i[3], want[0], want[1], want[2], want[3]);
    free(x);
    dev_free(d_x);
    dev_free(d_i);
}

template <typename F>
static float time_ms(F f, int reps);   // (below, with the timings)
// ---------------------------------------------------------------------------------------------
// sampling on the device (mt_sample_rows_gpu) against mt_sample_rows_cpu: the same token, every
// row. Rows of three kinds (a random model's nearly flat logits; a peaked row; logits on a grid of
// 1/8, so many ties, with -inf and NaN planted), widths that are not multiples of the block (7,
// 1000) and GPT-2's padded vocabulary; draws that mix greedy rows, temperatures, top-k and top-p,
// and the extreme uniforms 0 and 1 - 2^-24.
static void test_sample_rows(void) {
    const int widths[3][2] = {{50257, 50304}, {1000, 1003}, {7, 8}};
    const int rows = 24;
    int rounds = 0, drawn = 0;
    for (int wi = 0; wi < 3; wi++) {
        int n = widths[wi][0], ld = widths[wi][1];
        float *x = (float *)mt_malloc(sizeof(float) * (size_t)rows * ld, "test");
        mt_draw draws[rows];
        int want[rows], got[rows];
        float *d_x = dev_alloc_f((size_t)rows * ld);
        mt_draw *d_draws = (mt_draw *)dev_alloc(sizeof draws);
        int *d_out = (int *)dev_alloc(sizeof got);
        void *work = dev_alloc(mt_gpu_sample_rows_work_bytes(rows, n));
        for (int round = 0; round < 6; round++, rounds++) {
            for (int r = 0; r < rows; r++) {
                float *row = x + (size_t)r * ld;
                int kind = (r + round) % 3;
                for (int v = 0; v < ld; v++) {
                    float l = kind == 0 ? rand_uniform(-0.2f, 0.2f)                       // a random model's
                            : kind == 1 ? rand_uniform(-12.0f, 3.0f)                      // peaked
                                        : (float)(rand_int(65) - 32) / 8.0f;              // ties
                    row[v] = v < n ? l : 1e30f;   // the padding is never a candidate
                }
                if (kind == 1 && n > 10) for (int k = 0; k < 3; k++) row[rand_int(n)] = 6.0f + (float)k;
                if (kind == 2 && n > 10) {
                    row[rand_int(n)] = -INFINITY;
                    row[1 + rand_int(n - 1)] = NAN;   // (not at 0: a NaN first would be the argmax)
                    row[rand_int(n)] = -0.0f;
                }
                static const float temps[] = {0.0f, 0.7f, 1.0f, 2.0f, 0.9f, 1.3f};
                static const int ks[] = {0, 0, 5, 40, 1000, 1, 0, 2};
                static const float ps[] = {0.0f, 0.95f, 0.5f, 0.0f, 0.9f, 1.0f, 0.2f};
                draws[r].temperature = temps[(r + round) % 6];
                draws[r].top_k = ks[(r / 2 + round) % 8];
                draws[r].top_p = ps[(r / 3 + round) % 7];
                draws[r].u = r % 11 == 0 ? 0.0f : r % 11 == 5 ? 1.0f - 1.0f / 16777216.0f
                                                           : (float)(rand_u32() >> 8) * (1.0f / 16777216.0f);
            }
            mt_sample_rows_cpu(want, x, rows, n, ld, draws);
            MT_CUDA_CHECK(cudaMemcpy(d_x, x, sizeof(float) * (size_t)rows * ld, cudaMemcpyHostToDevice));
            MT_CUDA_CHECK(cudaMemcpy(d_draws, draws, sizeof draws, cudaMemcpyHostToDevice));
            MT_CUDA_CHECK(cudaMemset(d_out, 0xff, sizeof got));
            mt_sample_rows_gpu(d_out, d_x, rows, n, ld, d_draws, work, 0);
            MT_CUDA_CHECK(cudaMemcpy(got, d_out, sizeof got, cudaMemcpyDeviceToHost));
            for (int r = 0; r < rows; r++) {
                drawn++;
                mt_expect(got[r] == want[r], "sample rows n=%d round %d row %d (T %.1f, top-k %d, top-p %.2f, u %.8f): "
                          "got %d, want %d", n, round, r, (double)draws[r].temperature, draws[r].top_k,
                          (double)draws[r].top_p, (double)draws[r].u, got[r], want[r]);
            }
        }
        // the time of one call at batch 1 and 8, GPT-2's vocabulary, the tutorial's draw (reported)
        if (n == 50257) {
            for (int r = 0; r < rows; r++) draws[r] = {0.5f, 0.9f, 0, 0.95f};
            for (int r = 0; r < rows; r++)   // a random model's flat row: the longest nucleus
                for (int v = 0; v < n; v++) x[(size_t)r * ld + v] = rand_uniform(-0.2f, 0.2f);
            MT_CUDA_CHECK(cudaMemcpy(d_x, x, sizeof(float) * (size_t)rows * ld, cudaMemcpyHostToDevice));
            MT_CUDA_CHECK(cudaMemcpy(d_draws, draws, sizeof draws, cudaMemcpyHostToDevice));
            for (int b = 1; b <= 8; b *= 8) {
                float ms = time_ms([&] { mt_sample_rows_gpu(d_out, d_x, b, n, ld, d_draws, work, 0); }, 20);
                printf("  sampling (temperature 0.9, top-p 0.95, flat logits) batch %d: %.1f us a call\n", b, ms * 1e3);
            }
        }
        free(x);
        dev_free(d_x); dev_free(d_draws); dev_free(d_out); dev_free(work);
    }
    printf("  %d rows drawn in %d rounds, each the CPU's token\n", drawn, rounds);
}

// ---------------------------------------------------------------------------------------------
// decoding one sequence's qkv GEMV and attention in one kernel (mt_qkv_attention_decode_gpu)
// against the two kernels it replaces (mt_matmul_forward_rounded_weight_gpu, then
// mt_attention_cached_forward_gpu): the same attention output and the same K, V rows stored, bit
// for bit, where the split kernel also cuts the cache into 8 slices (cap >= 225); within 1e-5 of
// them where it cuts fewer (another order of the slices' sums). GPT-2's 12 heads and C = 768, 4
// heads with C = 256 (the input another width than the heads: C_local = 256 as well), bf16 and fp16,
// the new token at the first position, in several slices, and at the cache's last.
static float *dev_random_f(size_t n, float lo, float hi);                  // (below)
static void *dev_random_w16(size_t n, float lo, float hi, int dtype);   // (below)
static void test_qkv_attention_decode(void) {
    int shapes[][3] = {{768, 12, 272}, {768, 12, 1024}, {256, 4, 300}, {768, 12, 100}};   // C, NH, cap
    int cases = 0;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int di = 0; di < 2; di++) {
            int dtype = di == 0 ? MT_DTYPE_BF16 : MT_DTYPE_FP16;
            int C = shapes[si][0], NH = shapes[si][1], cap = shapes[si][2], OC = 3 * C;
            size_t nc = (size_t)cap * C;
            float *d_ln = dev_random_f((size_t)C, -2, 2), *d_bias = dev_random_f((size_t)OC, -0.5f, 0.5f);
            void *w16 = dev_random_w16((size_t)OC * C, -0.1f, 0.1f, dtype);
            float *k0 = host_random(nc, -1, 1), *v0 = host_random(nc, -1, 1);
            float *d_k1 = dev_upload(k0, nc), *d_v1 = dev_upload(v0, nc), *d_k2 = dev_upload(k0, nc), *d_v2 = dev_upload(v0, nc);
            float *d_qkv = dev_alloc_f((size_t)OC), *d_out1 = dev_nan((size_t)C), *d_out2 = dev_nan((size_t)C);
            int positions[5] = {0, 5, cap / 3, cap / 2 + 7, cap - 1};
            for (int pi = 0; pi < 5; pi++) {
                int p = positions[pi];
                int *d_start = dev_upload_int(&p, 1);
                mt_matmul_forward_rounded_weight_gpu(d_qkv, d_ln, w16, d_bias, 1, C, OC, dtype, 0);
                mt_attention_cached_forward_gpu(d_out1, d_k1, d_v1, d_qkv, d_start, 1, 1, C, NH, cap, 0, 0);
                int ran = mt_qkv_attention_decode_gpu(d_out2, d_k2, d_v2, d_ln, w16, d_bias, d_start, C, C, NH, cap,
                                                      dtype, 0);
                mt_expect(ran, "qkv + attention C=%d NH=%d cap=%d: the kernel declined", C, NH, cap);
                float *o1 = dev_download(d_out1, (size_t)C), *o2 = dev_download(d_out2, (size_t)C);
                float *k1 = dev_download(d_k1, nc), *k2 = dev_download(d_k2, nc);
                float *v1 = dev_download(d_v1, nc), *v2 = dev_download(d_v2, nc);
                char label[160];
                snprintf(label, sizeof label, "qkv + attention C=%d NH=%d cap=%d %s p=%d: output", C, NH, cap,
                         dtype == MT_DTYPE_BF16 ? "bf16" : "fp16", p);
                if (cap >= 225) check_equal_bits(label, o2, o1, sizeof(float) * C);
                else check_close(label, o2, o1, (size_t)C, 1e-5);
                check_equal_bits("qkv + attention: the K cache", k2, k1, sizeof(float) * nc);
                check_equal_bits("qkv + attention: the V cache", v2, v1, sizeof(float) * nc);
                free(o1); free(o2); free(k1); free(k2); free(v1); free(v2);
                dev_free(d_start);
                cases++;
            }
            free(k0); free(v0);
            dev_free(d_ln); dev_free(d_bias); dev_free(w16); dev_free(d_k1); dev_free(d_v1); dev_free(d_k2);
            dev_free(d_v2); dev_free(d_qkv); dev_free(d_out1); dev_free(d_out2);
        }
    // what it declines: head size 32; no 16-bit weights (fp32 decoding); a cache too long for shared memory
    int one = 3, *d_start = dev_upload_int(&one, 1);
    float *d = dev_alloc_f(4096);
    mt_expect(!mt_qkv_attention_decode_gpu(d, d, d, d, d, d, d_start, 256, 256, 8, 64, MT_DTYPE_BF16, 0),
              "qkv + attention ran at head size 32");
    mt_expect(!mt_qkv_attention_decode_gpu(d, d, d, d, NULL, d, d_start, 256, 256, 4, 64, MT_DTYPE_BF16, 0),
              "qkv + attention ran without 16-bit weights");
    mt_expect(!mt_qkv_attention_decode_gpu(d, d, d, d, d, d, d_start, 256, 256, 4, 4096, MT_DTYPE_BF16, 0),
              "qkv + attention ran with a cache of 4096 positions (its slices' rows take ~280 KB of shared memory)");
    dev_free(d); dev_free(d_start);
    printf("  %d cases: output and KV cache as the GEMV and the split attention\n", cases);
}

// ---------------------------------------------------------------------------------------------
// decode steps queued ahead (mt_decode_advance_gpu) against mt_decode_advance_cpu: 40 steps in a
// row on the same buffers, random picked tokens each step, positions that reach the cache's last
// (held there), a plan shorter than the steps (its last draw repeated), the ring of 4 slots
// wrapping, and rows = 1, 3 and 8. The ring is pinned host memory the kernel writes (unified
// addressing), as the generator's.
static void test_decode_advance(void) {
    const int row_counts[3] = {1, 3, 8}, cap = 24, plan_steps = 30, ring_slots = 4, steps = 40;
    int checked = 0;
    for (int ri = 0; ri < 3; ri++) {
        int rows = row_counts[ri];
        int tokens[8], positions[8], start[8], step = 0, next[8], ring[4 * 8] = {0};
        mt_draw draws[8], plan[30 * 8];
        for (int b = 0; b < rows; b++) {
            tokens[b] = rand_int(50257);
            start[b] = positions[b] = rand_int(cap);
            draws[b] = {rand_uniform(0, 1), 0.9f, 0, 0.95f};
        }
        for (int k = 0; k < plan_steps * rows; k++) plan[k] = {rand_uniform(0, 1), rand_uniform(0, 2), rand_int(50), 0.9f};
        int *d_tokens = dev_upload_int(tokens, rows), *d_positions = dev_upload_int(positions, rows);
        int *d_start = dev_upload_int(start, rows), *d_step = dev_upload_int(&step, 1), *d_next = dev_upload_int(next, rows);
        mt_draw *d_draws = (mt_draw *)dev_alloc(sizeof draws), *d_plan = (mt_draw *)dev_alloc(sizeof plan);
        MT_CUDA_CHECK(cudaMemcpy(d_draws, draws, sizeof(mt_draw) * rows, cudaMemcpyHostToDevice));
        MT_CUDA_CHECK(cudaMemcpy(d_plan, plan, sizeof(mt_draw) * plan_steps * rows, cudaMemcpyHostToDevice));
        int *h_ring = NULL;
        MT_CUDA_CHECK(cudaHostAlloc((void **)&h_ring, sizeof ring, cudaHostAllocDefault));
        memset(h_ring, 0, sizeof ring);
        for (int s = 0; s < steps; s++) {
            for (int b = 0; b < rows; b++) next[b] = rand_int(50257);
            MT_CUDA_CHECK(cudaMemcpy(d_next, next, sizeof(int) * rows, cudaMemcpyHostToDevice));
            mt_decode_advance_cpu(tokens, positions, start, draws, &step, ring, next, plan, plan_steps, ring_slots, rows,
                                  cap);
            mt_decode_advance_gpu(d_tokens, d_positions, d_start, d_draws, d_step, h_ring, d_next, d_plan, plan_steps,
                                  ring_slots, rows, cap, 0);
            MT_CUDA_CHECK(cudaDeviceSynchronize());
            int g_tokens[8], g_positions[8], g_start[8], g_step;
            mt_draw g_draws[8];
            MT_CUDA_CHECK(cudaMemcpy(g_tokens, d_tokens, sizeof(int) * rows, cudaMemcpyDeviceToHost));
            MT_CUDA_CHECK(cudaMemcpy(g_positions, d_positions, sizeof(int) * rows, cudaMemcpyDeviceToHost));
            MT_CUDA_CHECK(cudaMemcpy(g_start, d_start, sizeof(int) * rows, cudaMemcpyDeviceToHost));
            MT_CUDA_CHECK(cudaMemcpy(&g_step, d_step, sizeof(int), cudaMemcpyDeviceToHost));
            MT_CUDA_CHECK(cudaMemcpy(g_draws, d_draws, sizeof(mt_draw) * rows, cudaMemcpyDeviceToHost));
            int same = g_step == step && memcmp(g_tokens, tokens, sizeof(int) * rows) == 0 &&
                       memcmp(g_positions, positions, sizeof(int) * rows) == 0 &&
                       memcmp(g_start, start, sizeof(int) * rows) == 0 &&
                       memcmp(g_draws, draws, sizeof(mt_draw) * rows) == 0 &&
                       memcmp(h_ring, ring, sizeof(int) * ring_slots * rows) == 0;
            mt_expect(same, "decode advance rows=%d step %d: the device's inputs, draws or ring differ from the CPU's",
                      rows, s);
            checked++;
        }
        for (int b = 0; b < rows; b++)
            mt_expect(start[b] == cap - 1, "rows=%d: sequence %d ends at position %d, not the cache's last %d", rows, b,
                      start[b], cap - 1);
        dev_free(d_tokens); dev_free(d_positions); dev_free(d_start); dev_free(d_step); dev_free(d_next);
        dev_free(d_draws); dev_free(d_plan);
        MT_CUDA_CHECK(cudaFreeHost(h_ring));
    }
    printf("  %d steps at 1, 3 and 8 rows: inputs, draws and ring as the CPU's\n", checked);
}

// ---------------------------------------------------------------------------------------------
// a decode step's chain of kernels (GPT-2 small's shapes, 16-bit weights, 3 layers, the head and
// the argmax), captured in a CUDA graph with programmatic dependent launch (mt__pdl_on, kernels.cuh
// section 1) and replayed 200 times: every replay equal bit for bit to the same chain run op by op
// on a plain stream. A kernel that read what the kernel ahead writes before its mt__pdl_wait
// would see stale values in some replay.
struct decode_chain {
    int B, C, NH, F, V, cap, L;
    float *x0, *x, *res2, *ln, *mean, *rstd, *qkv, *atty, *outc, *fch, *fchg, *kc, *vc, *logits;
    float *ln1w[3], *ln1b[3], *ln2w[3], *ln2b[3], *bqkv[3], *bproj[3], *bfc[3], *bfcproj[3], *lnfw, *lnfb;
    __nv_bfloat16 *wqkv[3], *wproj[3], *wfc[3], *wfcproj[3], *wte;
    int *start, *next;
};
static float *dev_random_f(size_t n, float lo, float hi) {
    float *h = host_random(n, lo, hi), *d = dev_upload(h, n);
    free(h);
    return d;
}
static __nv_bfloat16 *dev_random_bf16(size_t n, float lo, float hi) {
    float *h = host_random(n, lo, hi), *d = dev_upload(h, n);
    __nv_bfloat16 *w = (__nv_bfloat16 *)dev_alloc(n * sizeof(__nv_bfloat16));
    mt_cast_f32_to_bf16_gpu(w, d, n, 0);
    MT_CUDA_CHECK(cudaDeviceSynchronize());
    free(h);
    dev_free(d);
    return w;
}
static void decode_chain_run(const decode_chain &d, cudaStream_t s) {
    int B = d.B, C = d.C;
    for (int l = 0; l < d.L; l++) {
        if (l == 0) mt_layernorm_forward_gpu(d.ln, d.mean, d.rstd, d.x0, d.ln1w[l], d.ln1b[l], B, 1, C, s);
        else mt_residual_layernorm_forward_gpu(d.x, d.ln, d.mean, d.rstd, d.res2, d.outc, d.ln1w[l], d.ln1b[l], B, 1, C, s);
        mt_matmul_forward_rounded_weight_gpu(d.qkv, d.ln, d.wqkv[l], d.bqkv[l], B, C, 3 * C, MT_DTYPE_BF16, s);
        mt_attention_cached_forward_gpu(d.atty, d.kc + (size_t)l * B * d.cap * C, d.vc + (size_t)l * B * d.cap * C, d.qkv,
                                        d.start, B, 1, C, d.NH, d.cap, 0, s);
        mt_matmul_forward_rounded_weight_gpu(d.outc, d.atty, d.wproj[l], d.bproj[l], B, C, C, MT_DTYPE_BF16, s);
        mt_residual_layernorm_forward_gpu(d.res2, d.ln, d.mean, d.rstd, l == 0 ? d.x0 : d.x, d.outc, d.ln2w[l], d.ln2b[l],
                                          B, 1, C, s);
        mt_matmul_forward_gelu_gpu(d.fch, d.fchg, d.ln, NULL, d.wfc[l], d.bfc[l], B, C, d.F, MT_GEMM_WGMMA, MT_DTYPE_BF16, s);
        mt_matmul_forward_rounded_weight_gpu(d.outc, d.fchg, d.wfcproj[l], d.bfcproj[l], B, d.F, C, MT_DTYPE_BF16, s);
    }
    mt_residual_forward_gpu(d.x, d.res2, d.outc, (size_t)B * C, s);
    mt_layernorm_forward_gpu(d.ln, d.mean, d.rstd, d.x, d.lnfw, d.lnfb, B, 1, C, s);
    mt_matmul_forward_rounded_weight_gpu(d.logits, d.ln, d.wte, NULL, B, C, d.V, MT_DTYPE_BF16, s);
    mt_argmax_rows_gpu(d.next, d.logits, B, d.V - 40, d.V, s);
}
static void decode_chain_case(int B) {
    decode_chain d;
    d.B = B; d.C = 768; d.NH = 12; d.F = 3072; d.V = 50304; d.cap = 64; d.L = 3;
    int C = d.C, F = d.F;
    d.x0 = dev_random_f((size_t)B * C, -1, 1);
    d.x = dev_alloc_f((size_t)B * C); d.res2 = dev_alloc_f((size_t)B * C); d.ln = dev_alloc_f((size_t)B * C);
    d.mean = dev_alloc_f(B); d.rstd = dev_alloc_f(B); d.qkv = dev_alloc_f((size_t)B * 3 * C);
    d.atty = dev_alloc_f((size_t)B * C); d.outc = dev_alloc_f((size_t)B * C); d.fch = dev_alloc_f((size_t)B * F);
    d.fchg = dev_alloc_f((size_t)B * F); d.logits = dev_alloc_f((size_t)B * d.V);
    size_t ncache = (size_t)d.L * B * d.cap * C;
    float *k0 = host_random(ncache, -1, 1), *v0 = host_random(ncache, -1, 1);
    d.kc = dev_upload(k0, ncache); d.vc = dev_upload(v0, ncache);
    for (int l = 0; l < d.L; l++) {
        d.ln1w[l] = dev_random_f(C, 0.5f, 1.5f); d.ln1b[l] = dev_random_f(C, -0.1f, 0.1f);
        d.ln2w[l] = dev_random_f(C, 0.5f, 1.5f); d.ln2b[l] = dev_random_f(C, -0.1f, 0.1f);
        d.bqkv[l] = dev_random_f(3 * C, -0.1f, 0.1f); d.bproj[l] = dev_random_f(C, -0.1f, 0.1f);
        d.bfc[l] = dev_random_f(F, -0.1f, 0.1f); d.bfcproj[l] = dev_random_f(C, -0.1f, 0.1f);
        d.wqkv[l] = dev_random_bf16((size_t)3 * C * C, -0.05f, 0.05f); d.wproj[l] = dev_random_bf16((size_t)C * C, -0.05f, 0.05f);
        d.wfc[l] = dev_random_bf16((size_t)F * C, -0.05f, 0.05f); d.wfcproj[l] = dev_random_bf16((size_t)C * F, -0.05f, 0.05f);
    }
    d.lnfw = dev_random_f(C, 0.5f, 1.5f); d.lnfb = dev_random_f(C, -0.1f, 0.1f);
    d.wte = dev_random_bf16((size_t)d.V * C, -0.05f, 0.05f);
    int start[8];
    for (int b = 0; b < B; b++) start[b] = rand_int(d.cap);
    d.start = dev_upload_int(start, (size_t)B);
    d.next = (int *)dev_alloc(sizeof(int) * (size_t)B);
    cudaStream_t s;
    MT_CUDA_CHECK(cudaStreamCreate(&s));   // blocking: time_ms's events on stream 0 wait for it
    // op by op (each kernel's position in the caches is rewritten with the same values every run)
    decode_chain_run(d, s);
    MT_CUDA_CHECK(cudaStreamSynchronize(s));
    float *want_x = dev_download(d.x, (size_t)B * C), *want_logits = dev_download(d.logits, (size_t)B * d.V);
    float *want_k = dev_download(d.kc, ncache), *want_v = dev_download(d.vc, ncache);
    int want_next[8], got_next[8];
    MT_CUDA_CHECK(cudaMemcpy(want_next, d.next, sizeof(int) * (size_t)B, cudaMemcpyDeviceToHost));
    // the same chain as a graph of programmatic launches
    MT_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    mt__pdl_on = 1;
    decode_chain_run(d, s);
    mt__pdl_on = 0;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    MT_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
    MT_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    int bad = 0;
    for (int rep = 0; rep < 200 && !bad; rep++) {
        dev_poison(d.x, (size_t)B * C); dev_poison(d.logits, (size_t)B * d.V); dev_poison(d.ln, (size_t)B * C);
        dev_poison(d.outc, (size_t)B * C); dev_poison(d.qkv, (size_t)B * 3 * C);
        MT_CUDA_CHECK(cudaDeviceSynchronize());
        MT_CUDA_CHECK(cudaGraphLaunch(exec, s));
        MT_CUDA_CHECK(cudaStreamSynchronize(s));
        float *got_x = dev_download(d.x, (size_t)B * C), *got_logits = dev_download(d.logits, (size_t)B * d.V);
        MT_CUDA_CHECK(cudaMemcpy(got_next, d.next, sizeof(int) * (size_t)B, cudaMemcpyDeviceToHost));
        bad = memcmp(got_x, want_x, sizeof(float) * (size_t)B * C) != 0 ||
              memcmp(got_logits, want_logits, sizeof(float) * (size_t)B * d.V) != 0 ||
              memcmp(got_next, want_next, sizeof(int) * (size_t)B) != 0;
        if (bad) printf("    replay %d of the PDL graph differs from the op-by-op chain (B=%d)\n", rep, B);
        free(got_x); free(got_logits);
    }
    mt_expect(!bad, "the decode chain with programmatic dependent launch differs from op by op (B=%d)", B);
    float *got_k = dev_download(d.kc, ncache), *got_v = dev_download(d.vc, ncache);
    check_equal_bits("decode chain: the KV caches after the replays", got_k, want_k, ncache * sizeof(float));
    check_equal_bits("decode chain: values", got_v, want_v, ncache * sizeof(float));
    // and the time of one replay, with and without PDL (the gap it closes, reported, not checked)
    float ms_pdl = time_ms([&] { MT_CUDA_CHECK(cudaGraphLaunch(exec, s)); }, 50);
    MT_CUDA_CHECK(cudaGraphExecDestroy(exec));
    MT_CUDA_CHECK(cudaGraphDestroy(graph));
    MT_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    decode_chain_run(d, s);
    MT_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
    MT_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    float ms_plain = time_ms([&] { MT_CUDA_CHECK(cudaGraphLaunch(exec, s)); }, 50);
    printf("    decode chain B=%d (3 layers + head, %d kernels): graph %.1f us, with PDL %.1f us\n", B, 3 * 7 + 5,
           ms_plain * 1e3, ms_pdl * 1e3);
    MT_CUDA_CHECK(cudaGraphExecDestroy(exec));
    MT_CUDA_CHECK(cudaGraphDestroy(graph));
    MT_CUDA_CHECK(cudaStreamDestroy(s));
    free(k0); free(v0); free(want_x); free(want_logits); free(want_k); free(want_v); free(got_k); free(got_v);
    void *buffers[] = {d.x0, d.x, d.res2, d.ln, d.mean, d.rstd, d.qkv, d.atty, d.outc, d.fch, d.fchg, d.kc, d.vc, d.logits,
                       d.lnfw, d.lnfb, d.wte, d.start, d.next};
    for (void *p : buffers) dev_free(p);
    for (int l = 0; l < d.L; l++) {
        void *layer[] = {d.ln1w[l], d.ln1b[l], d.ln2w[l], d.ln2b[l], d.bqkv[l], d.bproj[l], d.bfc[l], d.bfcproj[l],
                         d.wqkv[l], d.wproj[l], d.wfc[l], d.wfcproj[l]};
        for (void *p : layer) dev_free(p);
    }
}
MT_TEST(decode_chain_pdl) {
    // the GEMVs on tensor cores (the default), then on the CUDA cores (times reported, not checked)
    for (int cores = 0; cores < 2; cores++) {
        int was = mt__gemv_mma_from_rows;
        if (cores) mt__gemv_mma_from_rows = MT_GEMV_MAX_ROWS + 1;
        printf("    GEMVs on %s:\n", cores ? "the CUDA cores" : "tensor cores from the default row count");
        decode_chain_case(1);
        decode_chain_case(8);
        mt__gemv_mma_from_rows = was;
    }
}

// ---------------------------------------------------------------------------------------------
// a decode step as one kernel (kernels.cuh, mt_decode_step_gpu) against the same step op by op
// (the kernels section 11 launches one after another, with the same 16-bit weights): equal bit
// for bit in the logits, the greedy tokens, x, and the KV caches (each step writes its position).
// Layers' parameters in one buffer per kind, layer l's at l times a layer's size, as mt_params.
static void *dev_random_w16(size_t n, float lo, float hi, int dtype) {
    float *d = dev_random_f(n, lo, hi);
    void *w = dev_alloc(n * 2);
    if (dtype == MT_DTYPE_FP16) mt_cast_f32_to_f16_gpu((__half *)w, d, n, 0);
    else mt_cast_f32_to_bf16_gpu((__nv_bfloat16 *)w, d, n, 0);
    MT_CUDA_CHECK(cudaDeviceSynchronize());
    dev_free(d);
    return w;
}
static void decode_one_kernel_case(int B, int C, int NH, int L, int dtype, int greedy) {
    int F = 4 * C, Vp = 50304, V = 50257, cap = 64;
    size_t ncache = (size_t)L * B * cap * C;
    mt__decode_args a;
    memset(&a, 0, sizeof a);
    a.B = B; a.L = L; a.C = C; a.NH = NH; a.F = F; a.V = V; a.Vp = Vp; a.cap = cap;
    int tokens[8], positions[8];
    for (int b = 0; b < B; b++) { tokens[b] = rand_int(V); positions[b] = rand_int(cap); }
    a.tokens = dev_upload_int(tokens, B); a.positions = dev_upload_int(positions, B); a.start = dev_upload_int(positions, B);
    a.wte = dev_random_f((size_t)Vp * C, -0.5f, 0.5f); a.wpe = dev_random_f((size_t)cap * C, -0.5f, 0.5f);
    a.wte16 = dev_random_w16((size_t)Vp * C, -0.05f, 0.05f, dtype);
    a.lnfw = dev_random_f(C, 0.5f, 1.5f); a.lnfb = dev_random_f(C, -0.1f, 0.1f);
    a.ln1w = dev_random_f((size_t)L * C, 0.5f, 1.5f); a.ln1b = dev_random_f((size_t)L * C, -0.1f, 0.1f);
    a.ln2w = dev_random_f((size_t)L * C, 0.5f, 1.5f); a.ln2b = dev_random_f((size_t)L * C, -0.1f, 0.1f);
    a.qkvb = dev_random_f((size_t)L * 3 * C, -0.1f, 0.1f); a.attprojb = dev_random_f((size_t)L * C, -0.1f, 0.1f);
    a.fcb = dev_random_f((size_t)L * F, -0.1f, 0.1f); a.fcprojb = dev_random_f((size_t)L * C, -0.1f, 0.1f);
    a.qkvw = dev_random_w16((size_t)L * 3 * C * C, -0.05f, 0.05f, dtype);
    a.attprojw = dev_random_w16((size_t)L * C * C, -0.05f, 0.05f, dtype);
    a.fcw = dev_random_w16((size_t)L * F * C, -0.05f, 0.05f, dtype);
    a.fcprojw = dev_random_w16((size_t)L * C * F, -0.05f, 0.05f, dtype);
    float *k0 = host_random(ncache, -1, 1), *v0 = host_random(ncache, -1, 1);
    a.kcache = dev_upload(k0, ncache); a.vcache = dev_upload(v0, ncache); a.cache_layer = (size_t)B * cap * C;
    a.x = dev_alloc_f((size_t)B * C); a.res2 = dev_alloc_f((size_t)B * C); a.qkv = dev_alloc_f((size_t)B * 3 * C);
    a.atty = dev_alloc_f((size_t)B * C); a.out_c = dev_alloc_f((size_t)B * C); a.fch = dev_alloc_f((size_t)B * F);
    a.fch_gelu = dev_alloc_f((size_t)B * F); a.logits = dev_alloc_f((size_t)B * Vp);
    a.next = greedy ? (int *)dev_alloc(sizeof(int) * 8) : NULL;
    size_t work_bytes = mt_decode_step_work_bytes(B);
    a.work = (unsigned *)dev_alloc(work_bytes);
    float *ln = dev_alloc_f((size_t)B * C), *mean = dev_alloc_f(B), *rstd = dev_alloc_f(B);
    int *next_ref = (int *)dev_alloc(sizeof(int) * 8);
    // op by op, as mt_generator_forward queues it, with the GEMVs on the CUDA cores (the one kernel's
    // arithmetic; by default the op-by-op step runs them on tensor cores, another order of the sums)
    auto w16 = [&](const void *base, size_t per_layer, int l) { return (const char *)base + 2 * per_layer * l; };
    cudaStream_t s = 0;
    int gemv_was = mt__gemv_mma_from_rows;
    mt__gemv_mma_from_rows = MT_GEMV_MAX_ROWS + 1;
    mt_embedding_positions_forward_gpu(a.x, a.tokens, a.wte, a.positions, a.wpe, B, 1, C, 0, Vp, s);
    for (int l = 0; l < L; l++) {
        const float *l1w = a.ln1w + (size_t)l * C, *l1b = a.ln1b + (size_t)l * C;
        if (l == 0) mt_layernorm_forward_gpu(ln, mean, rstd, a.x, l1w, l1b, B, 1, C, s);
        else mt_residual_layernorm_forward_gpu(a.x, ln, mean, rstd, a.res2, a.out_c, l1w, l1b, B, 1, C, s);
        mt_matmul_forward_rounded_weight_gpu(a.qkv, ln, w16(a.qkvw, (size_t)3 * C * C, l), a.qkvb + (size_t)l * 3 * C, B, C,
                                             3 * C, dtype, s);
        mt_attention_cached_forward_gpu(a.atty, a.kcache + l * a.cache_layer, a.vcache + l * a.cache_layer, a.qkv, a.start,
                                        B, 1, C, NH, cap, 1, s);   // (unsplit: the one kernel's form)
        mt_matmul_forward_rounded_weight_gpu(a.out_c, a.atty, w16(a.attprojw, (size_t)C * C, l), a.attprojb + (size_t)l * C,
                                             B, C, C, dtype, s);
        mt_residual_layernorm_forward_gpu(a.res2, ln, mean, rstd, a.x, a.out_c, a.ln2w + (size_t)l * C,
                                          a.ln2b + (size_t)l * C, B, 1, C, s);
        mt_matmul_forward_gelu_gpu(a.fch, a.fch_gelu, ln, NULL, w16(a.fcw, (size_t)F * C, l), a.fcb + (size_t)l * F, B, C,
                                   F, MT_GEMM_WGMMA, dtype, s);
        mt_matmul_forward_rounded_weight_gpu(a.out_c, a.fch_gelu, w16(a.fcprojw, (size_t)C * F, l),
                                             a.fcprojb + (size_t)l * C, B, F, C, dtype, s);
    }
    mt_residual_forward_gpu(a.x, a.res2, a.out_c, (size_t)B * C, s);
    mt_layernorm_forward_gpu(ln, mean, rstd, a.x, a.lnfw, a.lnfb, B, 1, C, s);
    mt_matmul_forward_rounded_weight_gpu(a.logits, ln, a.wte16, NULL, B, C, Vp, dtype, s);
    mt_argmax_rows_gpu(next_ref, a.logits, B, V, Vp, s);
    MT_CUDA_CHECK(cudaDeviceSynchronize());
    mt__gemv_mma_from_rows = gemv_was;
    float *want_logits = dev_download(a.logits, (size_t)B * Vp), *want_x = dev_download(a.x, (size_t)B * C);
    float *want_k = dev_download(a.kcache, ncache), *want_v = dev_download(a.vcache, ncache);
    int want_next[8], got_next[8];
    MT_CUDA_CHECK(cudaMemcpy(want_next, next_ref, sizeof(int) * B, cudaMemcpyDeviceToHost));
    // one kernel, from the same start (the caches as they were, the buffers poisoned)
    MT_CUDA_CHECK(cudaMemcpy(a.kcache, k0, ncache * sizeof(float), cudaMemcpyHostToDevice));
    MT_CUDA_CHECK(cudaMemcpy(a.vcache, v0, ncache * sizeof(float), cudaMemcpyHostToDevice));
    dev_poison(a.logits, (size_t)B * Vp); dev_poison(a.x, (size_t)B * C); dev_poison(a.res2, (size_t)B * C);
    dev_poison(a.out_c, (size_t)B * C); dev_poison(a.qkv, (size_t)B * 3 * C);
    int ran = mt_decode_step_gpu(&a, dtype, work_bytes, s);
    MT_CUDA_CHECK(cudaDeviceSynchronize());
    char what[96];
    snprintf(what, sizeof what, "decode step as one kernel (B=%d C=%d heads %d, %s%s)", B, C, NH,
             dtype == MT_DTYPE_FP16 ? "fp16" : "bf16", greedy ? ", greedy" : "");
    mt_expect(ran == 1, "%s: the kernel declined the shape", what);
    if (ran) {
        float *got_logits = dev_download(a.logits, (size_t)B * Vp), *got_x = dev_download(a.x, (size_t)B * C);
        float *got_k = dev_download(a.kcache, ncache), *got_v = dev_download(a.vcache, ncache);
        char label[160];
        snprintf(label, sizeof label, "%s: logits", what);
        check_equal_bits(label, got_logits, want_logits, sizeof(float) * B * Vp);
        snprintf(label, sizeof label, "%s: x", what);
        check_equal_bits(label, got_x, want_x, sizeof(float) * B * C);
        snprintf(label, sizeof label, "%s: K cache", what);
        check_equal_bits(label, got_k, want_k, ncache * sizeof(float));
        snprintf(label, sizeof label, "%s: V cache", what);
        check_equal_bits(label, got_v, want_v, ncache * sizeof(float));
        if (greedy) {
            MT_CUDA_CHECK(cudaMemcpy(got_next, a.next, sizeof(int) * B, cudaMemcpyDeviceToHost));
            mt_expect(memcmp(got_next, want_next, sizeof(int) * B) == 0, "%s: tokens %d.. against %d..", what,
                      got_next[0], want_next[0]);
        }
        free(got_logits); free(got_x); free(got_k); free(got_v);
        if (greedy && (B == 1 || B == 8) && C == 768 && NH == 12) {   // the time of one step (reported, not checked)
            float us = 1e3f * time_ms([&] { mt_decode_step_gpu(&a, dtype, work_bytes, s); }, 50);
            printf("    decode step as one kernel B=%d (%d layers + head): %.1f us\n", B, L, us);
            // where it goes: block 0's clock at each grid barrier (arriving, leaving), averaged over layers
            int nt = 18 * L + 3;   // 2 per barrier (5 a layer), the head, the start, 8 marks a layer
            long long *d_trace = (long long *)dev_alloc(sizeof(long long) * nt), h[10 * 48 + 3];
            a.trace = d_trace;
            mt_decode_step_gpu(&a, dtype, work_bytes, s);
            MT_CUDA_CHECK(cudaDeviceSynchronize());
            a.trace = NULL;
            MT_CUDA_CHECK(cudaMemcpy(h, d_trace, sizeof(long long) * nt, cudaMemcpyDeviceToHost));
            dev_free(d_trace);
            int khz = 0;
            MT_CUDA_CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
            double per_us = khz / 1000.0;   // SM cycles per microsecond (the boost clock)
            const char *names[5] = {"ln1 + qkv", "attention", "attn proj", "ln2 + fc", "fc proj"};
            for (int j = 0; j < 5; j++) {
                double work = 0, wait = 0;
                for (int l = 0; l < L; l++) {
                    int k = 5 * l + j;
                    long long before = k == 0 ? h[10 * L + 2] : h[2 * k - 1];
                    work += (double)(h[2 * k] - before);
                    wait += (double)(h[2 * k + 1] - h[2 * k]);
                }
                printf("      phase %-10s block 0 works %6.2f us, then waits at the barrier %6.2f us (mean of %d layers)\n",
                       names[j], work / L / per_us, wait / L / per_us, L);
            }
            printf("      head (ln_f + logits)  block 0 works %6.2f us; whole kernel %.1f us (clock of block 0)\n",
                   (double)(h[10 * L] - h[10 * L - 1]) / per_us, (double)(h[10 * L] - h[10 * L + 2]) / per_us);
            // inside the phases (kernels.cuh's mt__decode_mark points), means over layers
            const char *parts[11] = {"1: stage + wait", "1: layernorm", "1: qkv GEMV", "3: stage + wait", "3: proj GEMV",
                                     "4: stage + wait", "4: layernorm", "4: fc GEMV", "5: stage + wait", "5: fc proj GEMV",
                                     "1: prefetch (from the barrier before)"};
            double sum[11] = {0};
            for (int l = 0; l < L; l++) {
                const long long *m = h + 10 * L + 3 + 8 * l;
                long long arrive[5], leave[5];
                for (int j = 0; j < 5; j++) { arrive[j] = h[2 * (5 * l + j)]; leave[j] = h[2 * (5 * l + j) + 1]; }
                double v[11] = {(double)(m[1] - m[0]), (double)(m[2] - m[1]), (double)(arrive[0] - m[2]),
                                (double)(m[4] - leave[1]), (double)(arrive[2] - m[4]), (double)(m[5] - leave[2]),
                                (double)(m[6] - m[5]), (double)(arrive[3] - m[6]), (double)(m[7] - leave[3]),
                                (double)(arrive[4] - m[7]), (double)(m[0] - (l == 0 ? h[10 * L + 2] : h[2 * (5 * l - 1) + 1]))};
                for (int k = 0; k < 11; k++) sum[k] += v[k];
            }
            for (int k = 0; k < 11; k++) printf("        %-38s %6.2f us\n", parts[k], sum[k] / L / per_us);
        }
    }
    free(k0); free(v0); free(want_logits); free(want_x); free(want_k); free(want_v);
    const void *buffers[] = {a.tokens, a.positions, a.start, a.wte, a.wpe, a.wte16, a.lnfw, a.lnfb, a.ln1w, a.ln1b,
                             a.ln2w, a.ln2b, a.qkvb, a.attprojb, a.fcb, a.fcprojb, a.qkvw, a.attprojw, a.fcw, a.fcprojw,
                             a.kcache, a.vcache, a.x, a.res2, a.qkv, a.atty, a.out_c, a.fch, a.fch_gelu, a.logits, a.work,
                             ln, mean, rstd, next_ref};
    for (const void *p : buffers) dev_free((void *)p);
    if (a.next) dev_free(a.next);
}
MT_TEST(decode_step_one_kernel) {
    decode_one_kernel_case(1, 768, 12, 12, MT_DTYPE_BF16, 1);   // GPT-2 small's shapes
    decode_one_kernel_case(3, 768, 12, 2, MT_DTYPE_BF16, 1);
    decode_one_kernel_case(8, 768, 12, 3, MT_DTYPE_BF16, 1);
    decode_one_kernel_case(2, 768, 12, 2, MT_DTYPE_BF16, 0);   // logits only (sampling)
    decode_one_kernel_case(3, 512, 8, 2, MT_DTYPE_FP16, 1);    // --fp16, another width
    // shapes it does not take (C > 1024; head size 128): it declines, and the caller runs the ops
    mt__decode_args a;
    memset(&a, 0, sizeof a);
    a.B = 1; a.C = 1536; a.NH = 24; a.F = 6144;
    mt_expect(mt_decode_step_gpu(&a, MT_DTYPE_BF16, 0, 0) == 0, "decode step as one kernel: took C = 1536");
    a.C = 768; a.NH = 6; a.F = 3072;
    mt_expect(mt_decode_step_gpu(&a, MT_DTYPE_BF16, 0, 0) == 0, "decode step as one kernel: took head size 128");
}

MT_TEST(dropout) {
    // B, T, C, sample_offset, t_offset, T_local (the last two: a sequence-parallel shard)
    int shapes[][6] = {{1, 1, 1, 0, 0, 1}, {2, 7, 33, 5, 0, 7}, {4, 1024, 768, 12, 0, 1024}, {2, 64, 33, 5, 16, 16},
                       {4, 1024, 768, 12, 512, 256}};
    float ps[] = {0.0f, 0.1f, 0.5f};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int k = 0; k < 3; k++) {
            int B = shapes[s][0];
            mt_dropout d = {(uint64_t)rand_u32(), (uint64_t)rand_int(1000), (uint64_t)rand_int(100), ps[k], shapes[s][3],
                            shapes[s][1], shapes[s][2], shapes[s][4], shapes[s][5]};
            size_t n = (size_t)B * d.T_local * d.C;
            float *x = host_random(n, -1, 1), *ref = host_copy(x, n);
            mt_dropout_forward_cpu(ref, &d, B);
            float *d_x = dev_upload(x, n);
            mt_dropout_forward_gpu(d_x, &d, B, 0);
            float *got = dev_download(d_x, n);
            check_close("dropout forward", got, ref, n, 0.0);   // the same mask, the same multiply
            free(got);
            memcpy(ref, x, n * sizeof(float));
            mt_dropout_backward_cpu(ref, &d, B);
            dev_set(d_x, x, n);
            mt_dropout_backward_gpu(d_x, &d, B, 0);
            got = dev_download(d_x, n);
            check_close("dropout backward", got, ref, n, 0.0);
            free(got); free(x); free(ref); dev_free(d_x);
        }
}

// attention: reference lse in double from qkv
static void attention_lse_ref(float *lse, const float *qkv, int B, int T, int C_local, int NH) {
    int hs = C_local / NH;
    double scale = 1.0 / sqrt((double)hs);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const float *q = qkv + ((size_t)b * T + t) * 3 * C_local + h * hs;
                double m = -INFINITY, sum = 0.0;
                std::vector<double> s(t + 1);
                for (int t2 = 0; t2 <= t; t2++) {
                    const float *k = qkv + ((size_t)b * T + t2) * 3 * C_local + C_local + h * hs;
                    double dot = 0.0;
                    for (int i = 0; i < hs; i++) dot += (double)q[i] * k[i];
                    s[t2] = dot * scale;
                    m = fmax(m, s[t2]);
                }
                for (int t2 = 0; t2 <= t; t2++) sum += exp(s[t2] - m);
                lse[((size_t)b * NH + h) * T + t] = (float)(m + log(sum));
            }
}
// the magnitude of the terms of the scores: max over rows of sum_i |q_i k_i| / sqrt(hs). bf16
// rounds q and k to 8 bits each (fp32: the kernel's fused multiply-adds round differently from
// the CPU's), so a score's error is a few ulps of this, whatever the score itself (a single
// score, T = 1, can be a near-cancellation much smaller than its terms).
static double attention_score_term_scale(const float *qkv, int B, int T, int C_local, int NH) {
    int hs = C_local / NH;
    double scale = 1.0 / sqrt((double)hs), biggest = 0.0;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const float *q = qkv + ((size_t)b * T + t) * 3 * C_local + h * hs;
                for (int t2 = 0; t2 <= t; t2++) {
                    const float *k = qkv + ((size_t)b * T + t2) * 3 * C_local + C_local + h * hs;
                    double terms = 0.0;
                    for (int i = 0; i < hs; i++) terms += fabs((double)q[i] * k[i]);
                    biggest = fmax(biggest, terms * scale);
                }
            }
    return biggest;
}
static void attention_case(int B, int T, int NH, int hs, float p, int head_offset, int NH_global, int misalign) {
    int C = NH * hs;
    size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C, nlse = (size_t)B * NH * T;
    mt_dropout d = {(uint64_t)rand_u32(), (uint64_t)rand_int(1000), 9, p, rand_int(4), T, C, 0, T};
    float *qkv = host_random(nqkv, -1.5f, 1.5f), *dout = host_random(nout, -1, 1), *dqkv0 = host_random(nqkv, -1, 1);
    float *out_ref = (float *)mt_malloc(nout * sizeof(float), "ref"), *lse_ref = (float *)mt_malloc(nlse * sizeof(float), "ref");
    float *lse_cpu = (float *)mt_malloc(nlse * sizeof(float), "ref lse");
    float *dqkv_ref = host_copy(dqkv0, nqkv);
    attention_lse_ref(lse_ref, qkv, B, T, C, NH);   // in double: the exact statistic
    mt_attention_forward_cpu(out_ref, lse_cpu, qkv, B, T, C, NH, &d, head_offset, NH_global);
    mt_attention_backward_cpu(dqkv_ref, dout, qkv, out_ref, lse_ref, B, T, C, NH, &d, head_offset, NH_global);
    // misalign: every tensor starts one float past a 16-byte boundary (the launchers stage them)
    int off = misalign ? 1 : 0;
    float *d_qkv_base = dev_alloc_f(nqkv + off), *d_dout_base = dev_alloc_f(nout + off), *d_out_base = dev_alloc_f(nout + off);
    float *d_dqkv_base = dev_alloc_f(nqkv + off);
    float *d_qkv = d_qkv_base + off, *d_dout = d_dout_base + off, *d_out = d_out_base + off, *d_dqkv = d_dqkv_base + off;
    float *d_lse = dev_nan(nlse);
    dev_set(d_qkv, qkv, nqkv); dev_set(d_dout, dout, nout);
    // dt 0: fp32 kernels against the fp32 reference; 1, 2: the tensor-core kernels in bf16 / fp16
    // against the CPU build's emulation of them (mt_attention_*_rounded_cpu: the same rounded
    // operands; P is rounded before (GPU) or after (CPU) the division by its row sum, so the two
    // differ by a few roundings of the format: 1e-2, 2.5 bf16 units and 20 fp16 units)
    for (int dt = 0; dt <= 2; dt++) {
        double tol = dt ? 1e-2 : 1e-5;   // tensor cores | fp32, sums in another order
        float *out_dt = out_ref, *lse_dt = lse_ref, *dqkv_dt = dqkv_ref;
        if (dt) {
            out_dt = (float *)mt_malloc(nout * sizeof(float), "ref");
            lse_dt = (float *)mt_malloc(nlse * sizeof(float), "ref");
            dqkv_dt = host_copy(dqkv0, nqkv);
            mt_attention_forward_rounded_cpu(out_dt, lse_dt, qkv, B, T, C, NH, &d, head_offset, NH_global, (mt_dtype)dt);
            mt_attention_backward_rounded_cpu(dqkv_dt, dout, qkv, out_dt, lse_dt, B, T, C, NH, &d, head_offset, NH_global,
                                              (mt_dtype)dt);
        }
        dev_poison(d_out, nout); dev_poison(d_lse, nlse); dev_set(d_dqkv, dqkv0, nqkv);
        mt_attention_forward_gpu(d_out, d_lse, d_qkv, B, T, C, NH, &d, head_offset, NH_global, dt, 0);
        // the backward gets the reference's out (D = rowsum(dout * out)) and lse: tested alone
        float *d_out_ref = dev_upload(out_dt, nout), *d_lse_ref = dev_upload(lse_dt, nlse);
        mt_attention_backward_gpu(d_dqkv, d_dout, d_qkv, d_out_ref, d_lse_ref, B, T, C, NH, &d, head_offset, NH_global, dt, 0);
        char label[160];
        const char *mode = dt == 2 ? "fp16" : dt == 1 ? "bf16" : "fp32";
        float *got = dev_download(d_out, nout);
        snprintf(label, sizeof label, "attention %s out B=%d T=%d NH=%d hs=%d p=%.1f%s", mode, B, T, NH, hs, p, misalign ? " misaligned" : "");
        check_close(label, got, out_dt, nout, tol);
        if (dt == MT_DTYPE_BF16 && hs == 64 && !mt__wgmma_unsupported()) {
            // the forward and backward above ran the wgmma kernels (bf16, head size 64): the mma.sync
            // ones too, held to the same reference (and the same dropout mask), and to each other at
            // bf16's 1e-2
            float *d_out2 = dev_nan(nout), *d_lse2 = dev_nan(nlse), *d_dqkv2 = dev_alloc_f(nqkv);
            dev_set(d_dqkv2, dqkv0, nqkv);
            mt__attention_wgmma = 0;
            mt_attention_forward_gpu(d_out2, d_lse2, d_qkv, B, T, C, NH, &d, head_offset, NH_global, dt, 0);
            mt_attention_backward_gpu(d_dqkv2, d_dout, d_qkv, d_out_ref, d_lse_ref, B, T, C, NH, &d, head_offset,
                                      NH_global, dt, 0);
            mt__attention_wgmma = 1;
            float *got2 = dev_download(d_out2, nout);
            snprintf(label, sizeof label, "attention bf16 out, mma.sync kernel B=%d T=%d NH=%d p=%.1f", B, T, NH, p);
            check_close(label, got2, out_dt, nout, tol);
            snprintf(label, sizeof label, "attention bf16 out, wgmma against mma.sync B=%d T=%d NH=%d p=%.1f", B, T, NH, p);
            check_close(label, got, got2, nout, tol);
            free(got2);
            float *dq_w = dev_download(d_dqkv, nqkv), *dq_m = dev_download(d_dqkv2, nqkv);
            snprintf(label, sizeof label, "attention bf16 dqkv, mma.sync kernels B=%d T=%d NH=%d p=%.1f", B, T, NH, p);
            check_close(label, dq_m, dqkv_dt, nqkv, tol);
            snprintf(label, sizeof label, "attention bf16 dqkv, wgmma against mma.sync B=%d T=%d NH=%d p=%.1f", B, T, NH, p);
            check_close(label, dq_w, dq_m, nqkv, tol);
            // and the wgmma dQ kernel that recomputes S and dP' (MT_ATT_DQ_FROM_DS=0) against the one that
            // reads the dS^T tiles the dK/dV kernel left (THE dS HAND-OFF, the default): dK, dV the same
            // bits; dQ from the same math at bf16's 1e-2 (dS rounded from S^T's sums, not S's)
            dev_set(d_dqkv2, dqkv0, nqkv);
            mt__att_dq_from_ds = 0;
            mt_attention_backward_gpu(d_dqkv2, d_dout, d_qkv, d_out_ref, d_lse_ref, B, T, C, NH, &d, head_offset,
                                      NH_global, dt, 0);
            mt__att_dq_from_ds = -1;
            float *dq_r = dev_download(d_dqkv2, nqkv);
            snprintf(label, sizeof label, "attention bf16 dqkv, dQ recomputed B=%d T=%d NH=%d p=%.1f", B, T, NH, p);
            check_close(label, dq_r, dqkv_dt, nqkv, tol);
            snprintf(label, sizeof label, "attention bf16 dqkv, dQ from dS against recomputed B=%d T=%d NH=%d p=%.1f", B, T,
                     NH, p);
            check_close(label, dq_w, dq_r, nqkv, tol);
            {   // dK and dV: bit for bit (the same kernel, the hand-off only adds stores)
                size_t same = 0, n_kv = 0;
                for (size_t row = 0; row < (size_t)B * T; row++)
                    for (int c = C; c < 3 * C; c++, n_kv++) same += memcmp(dq_w + row * 3 * C + c, dq_r + row * 3 * C + c, 4) == 0;
                mt_expect(same == n_kv, "attention bf16 dK, dV with and without the dS hand-off B=%d T=%d: %zu of %zu "
                          "values differ", B, T, n_kv - same, n_kv);
            }
            free(dq_r);
            free(dq_w); free(dq_m);
            dev_free(d_out2); dev_free(d_lse2); dev_free(d_dqkv2);
        }
        free(got);
        got = dev_download(d_lse, nlse);
        snprintf(label, sizeof label, "attention %s lse B=%d T=%d NH=%d hs=%d", mode, B, T, NH, hs);
        // the scores' error scales with their terms (see attention_score_term_scale)
        check_close_scale(label, got, lse_dt, nlse, tol, attention_score_term_scale(qkv, B, T, C, NH)); free(got);
        got = dev_download(d_dqkv, nqkv);
        snprintf(label, sizeof label, "attention %s dqkv B=%d T=%d NH=%d hs=%d p=%.1f", mode, B, T, NH, hs, p);
        check_close(label, got, dqkv_dt, nqkv, tol);   // '=': the random start is gone
        if (dt) {   // from qkv stored in 16 bits (training's mt_qkv_forward): exactly the same results
            float *out16 = dev_download(d_out, nout), *lse16 = dev_download(d_lse, nlse);
            void *q16 = dev_alloc(nqkv * 2 + 16);
            if (dt == MT_DTYPE_FP16) mt_cast_f32_to_f16_gpu((__half *)q16, d_qkv, nqkv, 0);
            else mt_cast_f32_to_bf16_gpu((__nv_bfloat16 *)q16, d_qkv, nqkv, 0);
            dev_poison(d_out, nout); dev_poison(d_lse, nlse); dev_set(d_dqkv, dqkv0, nqkv);
            mt_attention_forward16_gpu(d_out, MT_DTYPE_FP32, d_lse, q16, B, T, C, NH, &d, head_offset, NH_global, dt, 0);
            mt_attention_backward16_gpu(d_dqkv, MT_DTYPE_FP32, d_dout, MT_DTYPE_FP32, q16, d_out_ref, MT_DTYPE_FP32, d_lse_ref,
                                        B, T, C, NH, &d, head_offset, NH_global, dt, 0);
            float *got16 = dev_download(d_out, nout);
            snprintf(label, sizeof label, "attention %s from 16-bit qkv: out B=%d T=%d hs=%d", mode, B, T, hs);
            check_close(label, got16, out16, nout, 0.0); free(got16);
            got16 = dev_download(d_lse, nlse);
            snprintf(label, sizeof label, "attention %s from 16-bit qkv: lse B=%d T=%d hs=%d", mode, B, T, hs);
            check_close(label, got16, lse16, nlse, 0.0); free(got16);
            got16 = dev_download(d_dqkv, nqkv);
            snprintf(label, sizeof label, "attention %s from 16-bit qkv: dqkv B=%d T=%d hs=%d", mode, B, T, hs);
            check_close(label, got16, got, nqkv, 0.0); free(got16);
            // dqkv written in 16 bits (the training's, mt_dqkv_gemm_dtype): the fp32 dqkv rounded, bit for bit
            void *dq16 = dev_alloc(nqkv * 2 + 16);
            MT_CUDA_CHECK(cudaMemset(dq16, 0xff, nqkv * 2));
            mt_attention_backward16_gpu((float *)dq16, dt, d_dout, MT_DTYPE_FP32, q16, d_out_ref, MT_DTYPE_FP32, d_lse_ref, B, T,
                                        C, NH, &d, head_offset, NH_global, dt, 0);
            float *wide = dev_download16(dq16, nqkv, dt), *want = (float *)mt_malloc(nqkv * sizeof(float), "dqkv");
            for (size_t i = 0; i < nqkv; i++) want[i] = mt_round_to_dtype(got[i], (mt_dtype)dt);
            snprintf(label, sizeof label, "attention %s from 16-bit qkv: dqkv in 16 bits B=%d T=%d hs=%d", mode, B, T, hs);
            check_close(label, wide, want, nqkv, 0.0);
            free(wide); free(want); dev_free(dq16);
            // dout stored in 16 bits (the training's datty, mt_datty_gemm_dtype): every product reads
            // the values it rounded to anyway, and D sums them as the CPU's emulation does
            void *do16 = dev_alloc(nout * 2 + 16);
            if (dt == MT_DTYPE_FP16) mt_cast_f32_to_f16_gpu((__half *)do16, d_dout, nout, 0);
            else mt_cast_f32_to_bf16_gpu((__nv_bfloat16 *)do16, d_dout, nout, 0);
            dev_set(d_dqkv, dqkv0, nqkv);
            mt_attention_backward16_gpu(d_dqkv, MT_DTYPE_FP32, (const float *)do16, dt, q16, d_out_ref, MT_DTYPE_FP32,
                                        d_lse_ref, B, T, C, NH, &d, head_offset, NH_global, dt, 0);
            got16 = dev_download(d_dqkv, nqkv);
            snprintf(label, sizeof label, "attention %s from 16-bit qkv and dout: dqkv B=%d T=%d hs=%d p=%.1f", mode, B, T,
                     hs, p);
            check_close(label, got16, dqkv_dt, nqkv, tol); free(got16);
            {   // the output stored in 16 bits (the training's atty, mt_atty_gemm_dtype; the wgmma kernel's
                // epilogue writes it, the other kernels' launcher casts): the fp32 output rounded, bit for
                // bit; and the backward reading it (with dout in 16 bits, as the training's) gives the
                // bits of the backward from its widened values in fp32
                void *o16 = dev_alloc(nout * 2 + 16);
                MT_CUDA_CHECK(cudaMemset(o16, 0xff, nout * 2));
                mt_attention_forward16_gpu((float *)o16, dt, d_lse, q16, B, T, C, NH, &d, head_offset, NH_global, dt, 0);
                float *wide_o = dev_download16(o16, nout, dt), *want_o = (float *)mt_malloc(nout * sizeof(float), "out");
                for (size_t i = 0; i < nout; i++) want_o[i] = mt_round_to_dtype(out16[i], (mt_dtype)dt);
                snprintf(label, sizeof label, "attention %s: out in 16 bits B=%d T=%d hs=%d", mode, B, T, hs);
                check_close(label, wide_o, want_o, nout, 0.0);
                float *d_wide_o = dev_upload(wide_o, nout);
                dev_set(d_dqkv, dqkv0, nqkv);
                mt_attention_backward16_gpu(d_dqkv, MT_DTYPE_FP32, (const float *)do16, dt, q16, d_wide_o, MT_DTYPE_FP32,
                                            d_lse_ref, B, T, C, NH, &d, head_offset, NH_global, dt, 0);
                float *from_wide = dev_download(d_dqkv, nqkv);
                dev_set(d_dqkv, dqkv0, nqkv);
                mt_attention_backward16_gpu(d_dqkv, MT_DTYPE_FP32, (const float *)do16, dt, q16, (const float *)o16, dt,
                                            d_lse_ref, B, T, C, NH, &d, head_offset, NH_global, dt, 0);
                got16 = dev_download(d_dqkv, nqkv);
                snprintf(label, sizeof label, "attention %s from a 16-bit out: dqkv B=%d T=%d hs=%d p=%.1f", mode, B, T, hs, p);
                check_close(label, got16, from_wide, nqkv, 0.0); free(got16);
                free(wide_o); free(want_o); free(from_wide); dev_free(d_wide_o); dev_free(o16);
            }
            dev_free(do16);
            free(out16); free(lse16); dev_free(q16);
        }
        free(got);
        dev_free(d_out_ref); dev_free(d_lse_ref);
        if (dt) { free(out_dt); free(lse_dt); free(dqkv_dt); }
    }
    free(qkv); free(dout); free(dqkv0); free(out_ref); free(lse_ref); free(lse_cpu); free(dqkv_ref);
    dev_free(d_qkv_base); dev_free(d_dout_base); dev_free(d_out_base); dev_free(d_lse); dev_free(d_dqkv_base);
}
// the seam's strided copy (cudaMemcpy2D) against the CPU's rows of memcpy: the sequence-parallel
// shards of a (B,T,C) tensor into the collectives' (TP,B,T/TP,C) order and back (section 4)
MT_TEST(copy_strided) {
    int shapes[][3] = {{2, 16, 32}, {4, 1024, 768}, {3, 6, 5}};   // B, T, C; TP = 2, T/2 positions each
    mt_rank *r = (mt_rank *)mt_calloc(1, sizeof(mt_rank), "rank");   // stream 0, no profiling
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        size_t B = shapes[s][0], T = shapes[s][1], C = shapes[s][2], Ts = T / 2, n = B * T * C, shard = B * Ts * C;
        float *full = host_random(n, -1, 1), *ref = host_random(n, -1, 1), *back = host_random(n, -1, 1);
        for (size_t j = 0; j < 2; j++)   // the reference, on the host: rank j's positions of every sample
            for (size_t b = 0; b < B; b++)
                memcpy(ref + j * shard + b * Ts * C, full + b * T * C + j * Ts * C, Ts * C * sizeof(float));
        float *d_full = dev_upload(full, n), *d_work = dev_upload(back, n);
        for (size_t j = 0; j < 2; j++)   // the GPU seam's
            mt_buffer_copy_strided(r, d_work + j * shard, Ts * C, d_full + j * Ts * C, T * C, Ts * C, B);
        float *got = dev_download(d_work, n);
        check_close("copy strided: (B,T,C) -> (TP,B,T/TP,C)", got, ref, n, 0.0);   // a copy: exact
        free(got);
        MT_CUDA_CHECK(cudaMemset(d_full, 0, n * sizeof(float)));
        for (size_t j = 0; j < 2; j++)
            mt_buffer_copy_strided(r, d_full + j * Ts * C, T * C, d_work + j * shard, Ts * C, Ts * C, B);
        got = dev_download(d_full, n);
        check_close("copy strided: and back", got, full, n, 0.0);
        free(got); free(full); free(ref); free(back); dev_free(d_full); dev_free(d_work);
    }
    free(r);
}

MT_TEST(attention) {
    // B, T, NH_local, hs, dropout p, head_offset, NH_global, misaligned
    attention_case(1, 1, 1, 16, 0.0f, 0, 1, 0);
    attention_case(2, 7, 2, 32, 0.0f, 0, 2, 0);
    attention_case(1, 64, 2, 64, 0.0f, 0, 2, 0);
    attention_case(2, 100, 3, 64, 0.1f, 3, 8, 0);   // a TP rank's heads 3..5 of 8, with dropout
    attention_case(1, 257, 2, 128, 0.0f, 0, 2, 0);
    attention_case(1, 130, 4, 16, 0.2f, 0, 4, 0);
    attention_case(2, 65, 2, 32, 0.1f, 1, 4, 0);
    attention_case(1, 200, 2, 128, 0.1f, 0, 2, 0);
    attention_case(2, 77, 2, 64, 0.1f, 0, 2, 1);    // tensors not 16-byte aligned
    attention_case(1, 1024, 12, 64, 0.0f, 0, 12, 0);   // GPT-2 small, one sample
    attention_case(2, 129, 2, 64, 0.1f, 0, 2, 0);    // one row past the forward's 128-query tile
    attention_case(1, 300, 2, 64, 0.1f, 1, 4, 0);    // the backward's 4-stage rings wrap; heads 1..2 of 4
    attention_case(1, 192, 2, 64, 0.1f, 0, 2, 0);    // the last query block's second warpgroup all past T
}

MT_TEST(gelu_residual) {
    size_t sizes[] = {1, 7, 1000, 1000003};
    for (int s = 0; s < 4; s++) {
        size_t n = sizes[s];
        float *x = host_random(n, -5, 5), *dout = host_random(n, -1, 1), *dinp0 = host_random(n, -1, 1), *y = host_random(n, -1, 1);
        float *out_ref = (float *)mt_malloc(n * sizeof(float), "ref"), *dinp_ref = host_copy(dinp0, n);
        mt_gelu_forward_cpu(out_ref, x, n);
        mt_gelu_backward_cpu(dinp_ref, x, dout, n);
        float *d_x = dev_upload(x, n), *d_out = dev_nan(n), *d_dout = dev_upload(dout, n), *d_dinp = dev_upload(dinp0, n), *d_y = dev_upload(y, n);
        mt_gelu_forward_gpu(d_out, d_x, n, 0);
        mt_gelu_backward_gpu(d_dinp, d_x, d_dout, n, 0);
        float *got = dev_download(d_out, n);
        // the device's tanhf is not the libm one; 0.5 x (1 + tanh(u)) cancels for x << 0, so its
        // last-bit difference lands at the scale of |x|, not of the result
        double x_scale = 0.0;
        for (size_t i = 0; i < n; i++) x_scale = fmax(x_scale, fabs((double)x[i]));
        check_close_scale("gelu forward", got, out_ref, n, 1e-5, x_scale); free(got);
        got = dev_download(d_dinp, n);
        // dinp += gelu'(x) dout: gelu'(x) = 0.5 (1 + tanh(u)) + ... cancels for x << 0, so the
        // device tanhf's last-bit difference from libm's lands at the scale of |dout|, not of the result
        double dout_scale = 0.0;
        for (size_t i = 0; i < n; i++) dout_scale = fmax(dout_scale, fabs((double)dout[i]));
        check_close_scale("gelu backward", got, dinp_ref, n, 1e-5, dout_scale); free(got);   // '='
        mt_residual_forward_cpu(out_ref, x, y, n);
        dev_poison(d_out, n);
        mt_residual_forward_gpu(d_out, d_x, d_y, n, 0);
        got = dev_download(d_out, n);
        check_close("residual forward", got, out_ref, n, 0.0); free(got);   // one addition
        free(x); free(dout); free(dinp0); free(y); free(out_ref); free(dinp_ref);
        dev_free(d_x); dev_free(d_out); dev_free(d_dout); dev_free(d_dinp); dev_free(d_y);
    }
}

// the bytes-bound ops take a float4 (or 8-element) path over the 16-byte aligned bulk and a
// one-element path for the rest: every split (pointer 4 bytes past a boundary, lengths that are
// not multiples of 4 or 8, rows of width not % 4) must give the CPU's bits
MT_TEST(vector_and_scalar_paths) {
    size_t n = 4099;
    for (int off = 0; off < 3; off++) {   // 0: aligned; 1, 2: 4 and 8 bytes past a boundary
        float *x = host_random(n + 4, -4, 4), *y = host_random(n + 4, -1, 1), *want = (float *)mt_malloc((n + 4) * sizeof(float), "want");
        float *d_x = dev_upload(x, n + 4), *d_y = dev_upload(y, n + 4), *d_out = dev_nan(n + 4);
        mt_gelu_forward_cpu(want, x + off, n);
        mt_gelu_forward_gpu(d_out + off, d_x + off, n, 0);
        float *got = dev_download(d_out, n + 4);
        double x_scale = 4.0;   // as in gelu_residual: the device tanhf's last bit at the scale of |x|
        check_close_scale("gelu forward, offset path", got + off, want, n, 1e-5, x_scale); free(got);
        mt_residual_forward_cpu(want, x + off, y + off, n);
        mt_residual_forward_gpu(d_out + off, d_x + off, d_y + off, n, 0);
        got = dev_download(d_out, n + 4);
        check_close("residual forward, offset path", got + off, want, n, 0.0); free(got);
        mt_gelu_backward_cpu(want, x + off, y + off, n);   // dinp = gelu'(x) dout, dout = y
        mt_gelu_backward_gpu(d_out + off, d_x + off, d_y + off, n, 0);
        got = dev_download(d_out, n + 4);
        double dout_scale = 1.0;   // as in gelu_residual: the last bit at the scale of |dout| <= 1
        check_close_scale("gelu backward, offset path", got + off, want, n, 1e-5, dout_scale); free(got);
        __nv_bfloat16 *b16 = (__nv_bfloat16 *)dev_alloc((n + 8) * sizeof(__nv_bfloat16));
        mt_cast_f32_to_bf16_gpu(b16 + off, d_y + off, n, 0);
        mt_cast_bf16_to_f32_gpu(d_out, b16 + off, n, 0);
        for (size_t i = 0; i < n; i++) want[i] = __bfloat162float(__float2bfloat16_rn(y[off + i]));
        got = dev_download(d_out, n);
        check_close("cast fp32->bf16->fp32, offset path", got, want, n, 0.0); free(got);
        {   // layernorm backward: the row-in-registers kernel when aligned, the scalar one when not (1e-5)
            int C = 768, N = (int)(n / C);
            float *w = host_random(C, 0.5f, 1.5f), *bias = host_random(C, -1, 1), *dw = host_random(C, -1, 1);
            float *db = host_random(C, -1, 1), *mean = (float *)mt_malloc(N * sizeof(float), "mean");
            float *rstd = (float *)mt_malloc(N * sizeof(float), "rstd"), *dw_ref = host_copy(dw, C), *db_ref = host_copy(db, C);
            float *dinp0 = host_random((size_t)N * C, -1, 1), *dinp_ref = host_copy(dinp0, (size_t)N * C);
            mt_layernorm_forward_cpu(want, mean, rstd, x + off, w, bias, 1, N, C);
            mt_layernorm_backward_cpu(dinp_ref, dw_ref, db_ref, y + off, x + off, w, mean, rstd, 1, N, C);
            float *d_w = dev_upload(w, C), *d_dw = dev_upload(dw, C), *d_db = dev_upload(db, C);
            float *d_mean = dev_upload(mean, N), *d_rstd = dev_upload(rstd, N), *d_xin = dev_upload(x, n + 4);   // (d_x is scaled above)
            dev_set(d_out + off, dinp0, (size_t)N * C);
            mt_layernorm_backward_gpu(d_out + off, d_dw, d_db, d_y + off, d_xin + off, d_w, d_mean, d_rstd, 1, N, C, 0);
            got = dev_download(d_out, n + 4);
            check_added("layernorm backward dinp, offset path", got + off, dinp_ref, dinp0, (size_t)N * C, 1e-5); free(got);
            got = dev_download(d_dw, C); check_added("layernorm backward dweight, offset path", got, dw_ref, dw, C, 1e-5); free(got);
            got = dev_download(d_db, C); check_added("layernorm backward dbias, offset path", got, db_ref, db, C, 1e-5); free(got);
            free(w); free(bias); free(dw); free(db); free(mean); free(rstd); free(dw_ref); free(db_ref); free(dinp0); free(dinp_ref);
            dev_free(d_w); dev_free(d_dw); dev_free(d_db); dev_free(d_mean); dev_free(d_rstd); dev_free(d_xin);
        }
        int widths[] = {768, 30, 4};   // OC % 4 == 0 (float4 path when aligned) and not
        for (int w = 0; w < 3; w++) {
            int OC = widths[w], BT = (int)(n / OC);
            for (size_t i = 0; i < (size_t)BT * OC; i++) want[i] = x[off + i];
            mt_bias_add_cpu(want, y, BT, OC);
            dev_set(d_out, x, n + 4);
            mt_bias_add_gpu(d_out + off, d_y, BT, OC, 0);
            got = dev_download(d_out, n + 4);
            check_close("bias add", got + off, want, (size_t)BT * OC, 0.0); free(got);
        }
        free(x); free(y); free(want); dev_free(d_x); dev_free(d_y); dev_free(d_out); dev_free(b16);
    }
}

// the logits as the GPU keeps them with --bf16 / --fp16 on the wgmma rung (mt_logits_storage_dtype):
// 16 bits. The CPU twins run on the same values (the logits rounded, in fp32); every step reads the
// 16-bit logits: the max and the target's logit exactly, the sums to 1e-5 against double; the
// gradient, written in the logits' place, is exactly the fp32 kernel's gradient of the same values,
// rounded (the same arithmetic, then the rounding the head's backward GEMMs would apply)
static void cross_entropy16_case(const float *logits, const int *targets, int BT, int VL, int vs, int V, float dloss) {
    size_t n = (size_t)BT * VL;
    int nreal = mt__real_columns(vs, VL, V);
    for (int dt = MT_DTYPE_BF16; dt <= MT_DTYPE_FP16; dt++) {
        const char *name = dt == MT_DTYPE_BF16 ? "bf16" : "fp16";
        float *rounded = (float *)mt_malloc(n * sizeof(float), "rounded logits");
        uint16_t *bits = (uint16_t *)mt_malloc(n * sizeof(uint16_t), "16-bit logits");
        for (size_t i = 0; i < n; i++) {
            bits[i] = dt == MT_DTYPE_BF16 ? mt_bf16_from_float(logits[i]) : mt_fp16_from_float(logits[i]);
            rounded[i] = dt == MT_DTYPE_BF16 ? mt_bf16_to_float(bits[i]) : mt_fp16_to_float(bits[i]);
        }
        float *maxv = (float *)mt_malloc(BT * sizeof(float), "ref"), *sumexp = (float *)mt_malloc(BT * sizeof(float), "ref");
        float *tl = (float *)mt_malloc(BT * sizeof(float), "ref"), *losses = (float *)mt_malloc(BT * sizeof(float), "ref");
        float *sum_double = (float *)mt_malloc(BT * sizeof(float), "ref");
        mt_cross_entropy_local_max_cpu(maxv, rounded, BT, VL, vs, V);
        mt_cross_entropy_local_sums_cpu(sumexp, tl, rounded, maxv, targets, BT, VL, vs, V);
        mt_cross_entropy_finish_cpu(losses, NULL, maxv, sumexp, tl, targets, BT, VL, vs, V, dloss);
        for (int i = 0; i < BT; i++) {
            double acc = 0.0;
            for (int v = 0; v < nreal; v++) acc += exp((double)rounded[(size_t)i * VL + v] - maxv[i]);
            sum_double[i] = (float)acc;
        }
        void *d16 = dev_alloc(n * sizeof(uint16_t));
        MT_CUDA_CHECK(cudaMemcpy(d16, bits, n * sizeof(uint16_t), cudaMemcpyHostToDevice));
        float *d_max = dev_nan(BT), *d_sum = dev_nan(BT), *d_tl = dev_nan(BT), *d_loss = dev_nan(BT);
        int *d_targets = dev_upload_int(targets, BT);
        char label[96];
        mt_cross_entropy_local_max_gpu(d_max, d16, dt, BT, VL, vs, V, 0);
        float *got = dev_download(d_max, BT);
        snprintf(label, sizeof label, "cross-entropy %s local max", name);
        check_close(label, got, maxv, BT, 0.0); free(got);
        float *d_max_ref = dev_upload(maxv, BT);
        mt_cross_entropy_local_sums_gpu(d_sum, d_tl, d16, dt, d_max_ref, d_targets, BT, VL, vs, V, 0);
        got = dev_download(d_sum, BT);
        snprintf(label, sizeof label, "cross-entropy %s local sums vs double", name);
        check_close(label, got, sum_double, BT, 1e-5); free(got);
        got = dev_download(d_tl, BT);
        snprintf(label, sizeof label, "cross-entropy %s target logit", name);
        check_close(label, got, tl, BT, 0.0); free(got);
        dev_poison(d_max, BT); dev_poison(d_sum, BT); dev_poison(d_tl, BT);
        mt_cross_entropy_local_max_sums_gpu(d_max, d_sum, d_tl, d16, dt, d_targets, BT, VL, vs, V, 0);
        got = dev_download(d_max, BT);
        snprintf(label, sizeof label, "cross-entropy %s one pass: max", name);
        check_close(label, got, maxv, BT, 0.0); free(got);
        got = dev_download(d_sum, BT);
        snprintf(label, sizeof label, "cross-entropy %s one pass: sums vs double", name);
        check_close(label, got, sum_double, BT, 1e-5); free(got);
        // the gradient: the fp32 kernel on the rounded values, then rounded, against the 16-bit kernel
        float *d_sum_ref = dev_upload(sumexp, BT), *d_tl_ref = dev_upload(tl, BT), *d32 = dev_upload(rounded, n);
        mt_cross_entropy_finish_gpu(d_loss, d32, MT_DTYPE_FP32, d_max_ref, d_sum_ref, d_tl_ref, d_targets, BT, VL, vs, V,
                                    dloss, 0);
        float *grad32 = dev_download(d32, n);
        dev_poison(d_loss, BT);
        mt_cross_entropy_finish_gpu(d_loss, d16, dt, d_max_ref, d_sum_ref, d_tl_ref, d_targets, BT, VL, vs, V, dloss, 0);
        double loss_terms = 0.0;
        for (int i = 0; i < BT; i++) loss_terms = fmax(loss_terms, fabs(log((double)sumexp[i])) + fabs((double)maxv[i]) + fabs((double)tl[i]));
        got = dev_download(d_loss, BT);
        snprintf(label, sizeof label, "cross-entropy %s losses", name);
        check_close_scale(label, got, losses, BT, 1e-5, loss_terms); free(got);
        float *as_f32 = dev_download16(d16, n, dt), *want = (float *)mt_malloc(n * sizeof(float), "rounded");
        for (size_t i = 0; i < n; i++) want[i] = mt_round_to_dtype(grad32[i], (mt_dtype)dt);
        snprintf(label, sizeof label, "cross-entropy %s dlogits in place BT=%d V_local=%d", name, BT, VL);
        check_close(label, as_f32, want, n, 0.0);
        {   // the fused kernel (TP = 1 with the gradient; the same device functions as the two
            // kernels above) against the CPU on the same rounded logits: max and target exact, the sum against the double one (1e-5), the losses as
            // above, and dlogits, rounded to 16 bits, against the CPU's fp32 ones at the scale of
            // dloss (|dlogits| <= dloss): a rounding to bf16 errs by at most 2^-9 of that, fp16 2^-12;
            // allowed 4e-3 and 1e-3
            // Both forms: the row staged in shared memory (the default where it fits) and not.
            for (int staged = 1; staged >= 0; staged--) {
                mt__ce_unstaged = !staged;
                const char *form = staged ? "staged" : "unstaged";
                void *a16 = dev_alloc(n * sizeof(uint16_t));
                MT_CUDA_CHECK(cudaMemcpy(a16, bits, n * sizeof(uint16_t), cudaMemcpyHostToDevice));
                float *fo[4];   // loss, max, sum, target
                for (int q = 0; q < 4; q++) fo[q] = dev_nan(BT);
                mt_cross_entropy_fused16_gpu(fo[0], fo[1], fo[2], fo[3], a16, dt, d_targets, BT, VL, vs, V, dloss, 0);
                float *dl_cpu = host_copy(rounded, n), *l_cpu = (float *)mt_malloc(BT * sizeof(float), "ref");
                mt_cross_entropy_finish_cpu(l_cpu, dl_cpu, maxv, sumexp, tl, targets, BT, VL, vs, V, dloss);
                float *x = dev_download(fo[0], BT);
                snprintf(label, sizeof label, "cross-entropy %s fused (%s): losses", name, form);
                check_close_scale(label, x, l_cpu, BT, 1e-5, loss_terms); free(x);
                x = dev_download(fo[1], BT);
                snprintf(label, sizeof label, "cross-entropy %s fused (%s): max", name, form);
                check_close(label, x, maxv, BT, 0.0); free(x);
                x = dev_download(fo[2], BT);
                snprintf(label, sizeof label, "cross-entropy %s fused (%s): sums vs double", name, form);
                check_close(label, x, sum_double, BT, 1e-5); free(x);
                x = dev_download(fo[3], BT);
                snprintf(label, sizeof label, "cross-entropy %s fused (%s): target logit", name, form);
                check_close(label, x, tl, BT, 0.0); free(x);
                x = dev_download16(a16, n, dt);
                snprintf(label, sizeof label, "cross-entropy %s fused (%s): dlogits in place BT=%d V_local=%d", name, form, BT, VL);
                check_close_scale(label, x, dl_cpu, n, dt == MT_DTYPE_BF16 ? 4e-3 : 1e-3, dloss); free(x);
                free(dl_cpu); free(l_cpu);
                for (int q = 0; q < 4; q++) dev_free(fo[q]);
                dev_free(a16);
            }
            mt__ce_unstaged = 0;
        }
        free(rounded); free(bits); free(maxv); free(sumexp); free(tl); free(losses); free(sum_double); free(grad32);
        free(as_f32); free(want);
        dev_free(d16); dev_free(d_max); dev_free(d_sum); dev_free(d_tl); dev_free(d_loss); dev_free(d_targets);
        dev_free(d_max_ref); dev_free(d_sum_ref); dev_free(d_tl_ref); dev_free(d32);
    }
}

MT_TEST(cross_entropy) {
    // BT, V_local, vocab_start, V (real vocabulary; columns >= V are padding)
    int shapes[][4] = {{1, 5, 0, 5}, {7, 130, 0, 128}, {100, 1000, 1000, 1900}, {50, 64, 128, 100}, {64, 50304, 0, 50257},
                      // more rows than SMs: the staged cross-entropy's blocks take several rows each
                      {300, 1000, 0, 997}, {270, 50304, 0, 50257}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int BT = shapes[s][0], VL = shapes[s][1], vs = shapes[s][2], V = shapes[s][3];
        size_t n = (size_t)BT * VL;
        float *logits = host_random(n, -4, 4);
        int *targets = host_tokens(BT, V);
        float dloss = rand_uniform(0.1f, 1.0f);
        float *maxv = (float *)mt_malloc(BT * sizeof(float), "ref"), *sumexp = (float *)mt_malloc(BT * sizeof(float), "ref");
        float *tl = (float *)mt_malloc(BT * sizeof(float), "ref"), *losses = (float *)mt_malloc(BT * sizeof(float), "ref");
        float *dlogits = host_copy(logits, n);
        mt_cross_entropy_local_max_cpu(maxv, logits, BT, VL, vs, V);
        mt_cross_entropy_local_sums_cpu(sumexp, tl, logits, maxv, targets, BT, VL, vs, V);
        if (mt__real_columns(vs, VL, V) > 0) mt_cross_entropy_finish_cpu(losses, dlogits, maxv, sumexp, tl, targets, BT, VL, vs, V, dloss);
        float *d_logits = dev_upload(logits, n), *d_max = dev_nan(BT), *d_sum = dev_nan(BT), *d_tl = dev_nan(BT), *d_loss = dev_nan(BT);
        int *d_targets = dev_upload_int(targets, BT);
        mt_cross_entropy_local_max_gpu(d_max, d_logits, MT_DTYPE_FP32, BT, VL, vs, V, 0);
        float *got = dev_download(d_max, BT);
        check_close("cross-entropy local max", got, maxv, BT, 0.0); free(got);   // max is exact
        // each step gets the CPU's inputs, so that it is tested alone
        float *d_max_ref = dev_upload(maxv, BT);
        mt_cross_entropy_local_sums_gpu(d_sum, d_tl, d_logits, MT_DTYPE_FP32, d_max_ref, d_targets, BT, VL, vs, V, 0);
        got = dev_download(d_sum, BT);
        // the CPU adds the n exponentials one after another in float; its own rounding error
        // grows like sqrt(n) eps (~1.3e-5 at n = 50257), so large n gets 1e-4 against it, and the
        // GPU is also held to 1e-5 against the sum in double
        int nreal = mt__real_columns(vs, VL, V);
        check_close("cross-entropy local sums", got, sumexp, BT, nreal > 10000 ? 1e-4 : 1e-5);
        float *sum_double = (float *)mt_malloc(BT * sizeof(float), "ref");
        for (int i = 0; i < BT; i++) {
            double acc = 0.0;
            for (int v = 0; v < nreal; v++) acc += exp((double)logits[(size_t)i * VL + v] - maxv[i]);
            sum_double[i] = (float)acc;
        }
        check_close("cross-entropy local sums vs double", got, sum_double, BT, 1e-5);
        free(got);
        got = dev_download(d_tl, BT);
        check_close("cross-entropy target logit", got, tl, BT, 0.0); free(got);
        // the two in one pass (TP = 1): the same max and target, the sum against the double one
        dev_poison(d_max, BT); dev_poison(d_sum, BT); dev_poison(d_tl, BT);
        mt_cross_entropy_local_max_sums_gpu(d_max, d_sum, d_tl, d_logits, MT_DTYPE_FP32, d_targets, BT, VL, vs, V, 0);
        got = dev_download(d_max, BT);
        check_close("cross-entropy one pass: max", got, maxv, BT, 0.0); free(got);
        got = dev_download(d_tl, BT);
        check_close("cross-entropy one pass: target logit", got, tl, BT, 0.0); free(got);
        got = dev_download(d_sum, BT);
        check_close("cross-entropy one pass: sums vs double", got, sum_double, BT, 1e-5);
        free(got); free(sum_double);
        if (nreal > 0) {
            float *d_sum_ref = dev_upload(sumexp, BT), *d_tl_ref = dev_upload(tl, BT);
            mt_cross_entropy_finish_gpu(d_loss, d_logits, MT_DTYPE_FP32, d_max_ref, d_sum_ref, d_tl_ref, d_targets, BT, VL, vs, V, dloss, 0);
            got = dev_download(d_loss, BT);
            // loss = log S + m - l_y cancels when the target dominates: the device's logf rounds at
            // the scale of the terms |log S| + |m| + |l_y|, not of the (maybe tiny) loss
            double loss_terms = 0.0;
            for (int i = 0; i < BT; i++) loss_terms = fmax(loss_terms, fabs(log((double)sumexp[i])) + fabs((double)maxv[i]) + fabs((double)tl[i]));
            check_close_scale("cross-entropy losses", got, losses, BT, 1e-5, loss_terms); free(got);
            got = dev_download(d_logits, n);
            // dlogits = (p - [v == y]) dloss: p - 1 cancels when the target's p is near 1, so the
            // device's expf rounds at the scale of dloss
            check_close_scale("cross-entropy dlogits", got, dlogits, n, 1e-5, dloss);
            free(got);
            dev_free(d_sum_ref); dev_free(d_tl_ref);
        }
        if (nreal > 0 && VL % 8 == 0) cross_entropy16_case(logits, targets, BT, VL, vs, V, dloss);
        if (nreal > 0) {
            float *d_sum_ref = dev_upload(sumexp, BT), *d_tl_ref = dev_upload(tl, BT);
            dev_poison(d_loss, BT);
            mt_cross_entropy_finish_gpu(d_loss, NULL, MT_DTYPE_BF16, d_max_ref, d_sum_ref, d_tl_ref, d_targets, BT, VL, vs, V, dloss, 0);
            got = dev_download(d_loss, BT);
            check_close("cross-entropy losses (no grad)", got, losses, BT, 1e-5); free(got);
            dev_free(d_sum_ref); dev_free(d_tl_ref);
        }
        free(logits); free(targets); free(maxv); free(sumexp); free(tl); free(losses); free(dlogits);
        dev_free(d_logits); dev_free(d_max); dev_free(d_sum); dev_free(d_tl); dev_free(d_loss); dev_free(d_targets); dev_free(d_max_ref);
    }
}

MT_TEST(adamw) {
    size_t sizes[] = {1, 1000, 1000003};
    for (int s = 0; s < 3; s++) {
        size_t n = sizes[s];
        float *p = host_random(n, -1, 1), *m = host_random(n, -0.1f, 0.1f), *v = host_random(n, 0.0f, 0.01f), *g = host_random(n, -1, 1);
        float *p_ref = host_copy(p, n), *m_ref = host_copy(m, n), *v_ref = host_copy(v, n);
        float lr = 6e-4f, wd = s == 1 ? 0.0f : 0.1f, clip = s == 2 ? rand_uniform(0.1f, 1.0f) : 1.0f;   // (clip: the factor)
        int step = 1 + rand_int(100);
        mt_adamw_cpu(p_ref, m_ref, v_ref, g, clip, n, lr, 0.9f, 0.95f, 1e-8f, wd, step);
        float *d_p = dev_upload(p, n), *d_m = dev_upload(m, n), *d_v = dev_upload(v, n), *d_g = dev_upload(g, n);
        // the 16-bit copy written as the parameters are updated (s = 1: bf16, s = 2: fp16, s = 0: none)
        int f16 = s == 2;
        uint16_t *d_copy = s ? (uint16_t *)dev_alloc(n * sizeof(uint16_t)) : NULL;
        mt_adamw_gpu(d_p, d_m, d_v, d_g, clip, n, lr, 0.9f, 0.95f, 1e-8f, wd, step, d_copy, f16, 0);
        // fp32; the device may fuse a*b+c into one FMA where the CPU rounds twice: 1e-5
        float *got = dev_download(d_p, n); check_close("adamw param", got, p_ref, n, 1e-5);
        if (d_copy) {   // exactly the cast of the updated parameters (the same rounding, bit for bit)
            uint16_t *c = (uint16_t *)mt_malloc(n * sizeof(uint16_t), "copy");
            MT_CUDA_CHECK(cudaMemcpy(c, d_copy, n * sizeof(uint16_t), cudaMemcpyDeviceToHost));
            size_t bad = 0;
            for (size_t i = 0; i < n; i++)
                bad += c[i] != (f16 ? mt_fp16_from_float(got[i]) : mt_bf16_from_float(got[i]));
            mt_expect(bad == 0, "adamw %s copy n=%zu: %zu of the values differ from the cast of the new parameters",
                      f16 ? "fp16" : "bf16", n, bad);
            free(c);
            dev_free(d_copy);
        }
        free(got);
        got = dev_download(d_m, n); check_close("adamw m", got, m_ref, n, 1e-5); free(got);
        got = dev_download(d_v, n); check_close("adamw v", got, v_ref, n, 1e-5); free(got);
        free(p); free(m); free(v); free(g); free(p_ref); free(m_ref); free(v_ref);
        dev_free(d_p); dev_free(d_m); dev_free(d_v); dev_free(d_g);
    }
}

// ---------------------------------------------------------------------------------------------
// 6. OPTIMIZER, CLIPPING
MT_TEST(sum_squares) {
    size_t sizes[] = {1, 255, 1000, 1000003, 30000001, 2, 7, 1000003};
    for (int s = 0; s < 8; s++) {
        size_t n = sizes[s], off = s < 5 ? 0 : (size_t)s - 4;   // off: the first 1-3 floats before a 16-byte boundary
        float *x = host_random(n + off, -1, 1);
        double want = 0.0, start = rand_uniform(0, 10);
        for (size_t i = off; i < n + off; i++) want += (double)x[i] * (double)x[i];   // mt__grad_norm's loop
        float *d_x = dev_upload(x, n + off);
        double *d_s = (double *)dev_alloc(sizeof(double)), got;
        MT_CUDA_CHECK(cudaMemcpy(d_s, &start, sizeof start, cudaMemcpyHostToDevice));
        mt_sum_squares_gpu(d_s, d_x + off, n, 0);
        MT_CUDA_CHECK(cudaMemcpy(&got, d_s, sizeof got, cudaMemcpyDeviceToHost));
        // double accumulation in another order. The CPU adds n terms one after another, so its own
        // rounding grows with n (seen: 4e-12 relative at n = 3e7; the bound is n eps = 3e-9): 1e-9
        mt_expect(fabs((got - start) - want) <= 1e-9 * (want + start), "sum of squares n=%zu: got %.17g want %.17g", n, got - start, want);
        // the zeros' count (--log-num-zeros-in-grad) over the same floats, every 3rd one made 0 (and
        // -0): an integer in double, exact, the CPU twin's
        for (size_t i = off; i < n + off; i += 3) x[i] = (i / 3) % 2 ? 0.0f : -0.0f;
        dev_set(d_x, x, n + off);
        double zeros_want = mt_count_zeros_cpu(x + off, n), zeros_got = -1;
        MT_CUDA_CHECK(cudaMemset(d_s, 0, sizeof(double)));
        mt_count_zeros_gpu(d_s, d_x + off, n, 0);
        MT_CUDA_CHECK(cudaMemcpy(&zeros_got, d_s, sizeof zeros_got, cudaMemcpyDeviceToHost));
        mt_expect(zeros_got == zeros_want && zeros_want >= (double)(n / 3), "zeros n=%zu: got %.17g want %.17g", n,
                  zeros_got, zeros_want);
        free(x); dev_free(d_x); dev_free(d_s);
    }
}

// the step's loss kept on the device: *acc += mean of BT losses, against the CPU twin. Both add in
// double (the GPU in another order): a sum of BT terms of size ~10 carries ~BT eps relative: 1e-12
MT_TEST(loss_mean_add) {
    int sizes[] = {1, 7, 255, 256, 16384, 100003};
    for (int s = 0; s < 6; s++) {
        int BT = sizes[s];
        float *losses = host_random((size_t)BT, 0, 11);
        double start = rand_uniform(0, 20), want = start, got;
        mt_loss_mean_add_cpu(&want, losses, BT);
        float *d_l = dev_upload(losses, (size_t)BT);
        double *d_acc = (double *)dev_alloc(sizeof(double));
        MT_CUDA_CHECK(cudaMemcpy(d_acc, &start, sizeof start, cudaMemcpyHostToDevice));
        mt_loss_mean_add_gpu(d_acc, d_l, BT, 0);
        MT_CUDA_CHECK(cudaMemcpy(&got, d_acc, sizeof got, cudaMemcpyDeviceToHost));
        mt_expect(fabs(got - want) <= 1e-12 * fabs(want) && got == got, "loss mean BT=%d: got %.17g want %.17g", BT, got, want);
        free(losses); dev_free(d_l); dev_free(d_acc);
    }
}

// the NCCL path of a batch of pipeline messages (section 2's mt_p2p_batch, section 8's pipeline):
// a group of one rank sends to itself, which NCCL allows, so one GPU runs the real ncclGroupStart /
// ncclSend / ncclRecv / ncclGroupEnd on the group's stream between the rank's kernels. Two sends
// and two receives in one batch: the k-th send lands in the k-th receive (NCCL has no tags), at
// 1 float, odd sizes and 25 MB (the bench's PP=2 message); then a kernel on the rank's stream
// reads what arrived. Exact: copies.
// a group of one rank on NCCL, its kernels on their own stream (NCCL lets a rank send to itself and
// reduce over a group of one: section 2's real NCCL path on one GPU), and its end
static cudaStream_t nccl_group_of_one(mt_world *w, int rank, mt_comm *c, const char *name) {
    int members[1] = {0};
    mt_comm_init(c, w, rank, members, 1);
    c->name = name;
    cudaStream_t stream;
    MT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    mt__nccl_join(c, (void *)stream);
    return stream;
}
static void nccl_group_of_one_end(mt_comm *c, cudaStream_t stream) {
    mt__nccl_leave(c);
    MT_CUDA_CHECK(cudaStreamDestroy(stream));
}
// rank_main run as the one rank of a world; the failures it counted into its int argument
static int failures_of_one_rank(void (*rank_main)(mt_world *, int, void *)) {
    int failures = 0;
    mt_world *w = mt_world_create(1);
    mt_expect(mt_world_run(w, rank_main, &failures) == 0, "the rank failed");
    mt_world_destroy(w);
    return failures;
}
static void p2p_self_rank(mt_world *w, int rank, void *arg) {
    int *failures = (int *)arg;
    mt_comm c;
    cudaStream_t stream = nccl_group_of_one(w, rank, &c, "p2p");
    size_t sizes[] = {1, 1000, 4097, (size_t)8 * 1024 * 768};
    for (int k = 0; k < 4; k++) {
        size_t n = sizes[k];
        float *a = host_random(n, -1, 1), *b = host_random(n, -1, 1), *got = host_random(n, 0, 0);
        float *d_a = dev_upload(a, n), *d_b = dev_upload(b, n);
        float *d_ra = (float *)dev_alloc(n * sizeof(float)), *d_rb = (float *)dev_alloc(n * sizeof(float));
        MT_CUDA_CHECK(cudaMemset(d_ra, 0xff, n * sizeof(float)));   // NaN until written
        MT_CUDA_CHECK(cudaMemset(d_rb, 0xff, n * sizeof(float)));
        MT_CUDA_CHECK(cudaDeviceSynchronize());
        mt_p2p_op ops[4] = {{0, d_a, n, 0, 1}, {0, d_b, n, 0, 2}, {1, d_ra, n, 0, 1}, {1, d_rb, n, 0, 2}};
        mt_p2p_batch(&c, ops, 4);
        // a kernel after the batch, on the rank's stream: it must see the received data
        MT_CUDA_CHECK(cudaMemcpyAsync(d_a, d_rb, n * sizeof(float), cudaMemcpyDeviceToDevice, stream));
        MT_CUDA_CHECK(cudaStreamSynchronize(stream));
        MT_CUDA_CHECK(cudaMemcpy(got, d_ra, n * sizeof(float), cudaMemcpyDeviceToHost));
        int ok = memcmp(got, a, n * sizeof(float)) == 0;
        MT_CUDA_CHECK(cudaMemcpy(got, d_a, n * sizeof(float), cudaMemcpyDeviceToHost));
        ok &= memcmp(got, b, n * sizeof(float)) == 0;
        if (!ok) {
            (*failures)++;
            fprintf(stderr, "  p2p batch to itself, n=%zu: the received data differ from what was sent\n", n);
        }
        free(a); free(b); free(got);
        dev_free(d_a); dev_free(d_b); dev_free(d_ra); dev_free(d_rb);
    }
    // the counters: a call per send and per receive, the bytes each moved
    unsigned long long bytes = 4ull * 4 * (1 + 1000 + 4097 + 8 * 1024 * 768);
    if (c.calls != 16 || c.bytes != bytes) {
        (*failures)++;
        fprintf(stderr, "  p2p counters: %llu calls, %llu bytes; want 16, %llu\n", c.calls, c.bytes, bytes);
    }
    nccl_group_of_one_end(&c, stream);
}
MT_TEST(p2p_batch_nccl) {
    int failures = failures_of_one_rank(p2p_self_rank);
    mt_expect(failures == 0, "%d batches moved the wrong data", failures);
}

// the started collectives of section 2 (mt_all_reduce_start, mt_all_gather_start,
// mt_reduce_scatter_start, then mt_comm_wait), which the tensor-parallel backward runs beside its
// weight gradient (megatron.h section 4), on a one-rank NCCL group: NCCL's real calls on the
// group's stream. The rank's stream first writes the input, after a kernel that holds it for
// 0.5 ms (so that a collective not waiting for the rank's work would read the poison), then the
// collective is started, the rank's stream does other work, waits, and copies the output: the
// input's bits (a group of one all-reduces to itself, gathers and scatters a copy). Exact: copies.
// (With the collective's wait for the rank's stream removed on purpose, the gather and the
// scatter read the poison and the test fails.)
__global__ void spin_kernel(long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) {}
}
static void started_rank(mt_world *w, int rank, void *arg) {
    int *failures = (int *)arg;
    mt_comm c;
    cudaStream_t stream = nccl_group_of_one(w, rank, &c, "tp");
    size_t sizes[] = {1, 4097, (size_t)8 * 1024 * 768};
    unsigned long long bytes = 0;
    for (int k = 0; k < 3; k++)
        for (int kind = 0; kind < 3; kind++) {   // all-reduce (in place), all-gather, reduce-scatter
            size_t n = sizes[k];
            float *src = host_random(n, -1, 1), *got = host_random(n, 0, 0);
            float *d_src = dev_upload(src, n), *d_x = (float *)dev_alloc(n * sizeof(float));
            float *d_y = (float *)dev_alloc(n * sizeof(float)), *d_out = (float *)dev_alloc(n * sizeof(float));
            float *d_busy = (float *)dev_alloc(n * sizeof(float));
            MT_CUDA_CHECK(cudaMemset(d_x, 0xff, n * sizeof(float)));   // NaN until written
            MT_CUDA_CHECK(cudaMemset(d_y, 0xff, n * sizeof(float)));
            MT_CUDA_CHECK(cudaDeviceSynchronize());
            spin_kernel<<<1, 1, 0, stream>>>(1000000LL);   // ~0.5 ms at the H200's clocks
            MT_CUDA_CHECK(cudaGetLastError());
            MT_CUDA_CHECK(cudaMemcpyAsync(d_x, d_src, n * sizeof(float), cudaMemcpyDeviceToDevice, stream));
            float *result = d_y;
            if (kind == 0) { mt_all_reduce_start(&c, d_x, n, MT_SUM); result = d_x; }
            else if (kind == 1) mt_all_gather_start(&c, d_x, d_y, n);
            else mt_reduce_scatter_start(&c, d_x, d_y, n, MT_SUM);
            // the rank's other work meanwhile (the weight gradient's place), then the wait
            MT_CUDA_CHECK(cudaMemcpyAsync(d_busy, d_src, n * sizeof(float), cudaMemcpyDeviceToDevice, stream));
            mt_comm_wait(&c);
            MT_CUDA_CHECK(cudaMemcpyAsync(d_out, result, n * sizeof(float), cudaMemcpyDeviceToDevice, stream));
            MT_CUDA_CHECK(cudaStreamSynchronize(stream));
            MT_CUDA_CHECK(cudaMemcpy(got, d_out, n * sizeof(float), cudaMemcpyDeviceToHost));
            if (memcmp(got, src, n * sizeof(float)) != 0) {
                (*failures)++;
                fprintf(stderr, "  started %s, n=%zu: the output differs from the input\n",
                        kind == 0 ? "all-reduce" : kind == 1 ? "all-gather" : "reduce-scatter", n);
            }
            if (c.started != 0) {
                (*failures)++;
                fprintf(stderr, "  mt_comm_wait left %d calls marked started\n", c.started);
            }
            bytes += n * sizeof(float);
            free(src); free(got);
            dev_free(d_src); dev_free(d_x); dev_free(d_y); dev_free(d_out); dev_free(d_busy);
        }
    // a group of one moves nothing that the threads backend counts, but NCCL's calls are counted
    if (c.calls != 9 || c.bytes != bytes) {
        (*failures)++;
        fprintf(stderr, "  started collectives' counters: %llu calls, %llu bytes; want 9, %llu\n", c.calls, c.bytes,
                bytes);
    }
    nccl_group_of_one_end(&c, stream);
}
MT_TEST(started_collectives_nccl) {
    int failures = failures_of_one_rank(started_rank);
    mt_expect(failures == 0, "%d started collectives gave the wrong data or bookkeeping", failures);
}

// every reduction twice on the same inputs: the same bits (no float atomics anywhere)
MT_TEST(determinism) {
    int B = 4, T = 256, C = 768, OC = 2304, V = 50304, NH = 12;
    size_t BT = (size_t)B * T;
    float *inp = host_random(BT * C, -1, 1), *w = host_random((size_t)OC * C, -1, 1), *dout = host_random(BT * OC, -1, 1);
    float *qkv = host_random(BT * 3 * C, -1, 1), *datt = host_random(BT * C, -1, 1);
    int *tokens = host_tokens(BT, 1000);
    float *d_inp = dev_upload(inp, BT * C), *d_w = dev_upload(w, (size_t)OC * C), *d_dout = dev_upload(dout, BT * OC);
    float *d_qkv = dev_upload(qkv, BT * 3 * C), *d_datt = dev_upload(datt, BT * C);
    int *d_tok = dev_upload_int(tokens, BT);
    float *d_dw = dev_alloc_f((size_t)OC * C), *d_db = dev_alloc_f(OC), *d_dinp = dev_alloc_f(BT * C), *d_lnw = dev_alloc_f(C), *d_lnb = dev_alloc_f(C);
    float *d_mean = dev_alloc_f(BT), *d_rstd = dev_alloc_f(BT), *d_ln = dev_alloc_f(BT * C), *d_dwte = dev_alloc_f((size_t)V * C);
    float *d_out = dev_alloc_f(BT * C), *d_lse = dev_alloc_f((size_t)B * NH * T), *d_dqkv = dev_alloc_f(BT * 3 * C);
    float *d_dlnw = dev_alloc_f(C), *d_dlnb = dev_alloc_f(C);
    double *d_ss = (double *)dev_alloc(sizeof(double));
    mt_dropout drop = {1, 2, 3, 0.1f, 0, T, C, 0, T};
    std::vector<std::vector<float> > runs[2];
    for (int r = 0; r < 2; r++) {
        for (int impl = 1; impl <= 2; impl++) {
            mt_zero_gpu(d_dw, (size_t)OC * C, 0); mt_zero_gpu(d_db, OC, 0); mt_zero_gpu(d_dinp, BT * C, 0);
            mt_matmul_backward_gpu(d_dinp, d_dw, d_db, d_dout, d_inp, d_w, (int)BT, C, OC, (mt_gemm_impl)impl, MT_DTYPE_BF16, 0);
            // the attention-proj weight-gradient shape: split-K
            mt_matmul_backward_gpu(NULL, d_dw, d_db, d_dout, d_inp, d_w, (int)BT, C, C, (mt_gemm_impl)impl, MT_DTYPE_BF16, 0);
            float *h = dev_download(d_dw, (size_t)OC * C); runs[r].push_back(std::vector<float>(h, h + (size_t)OC * C)); free(h);
            h = dev_download(d_db, OC); runs[r].push_back(std::vector<float>(h, h + OC)); free(h);
        }
        mt_fill_gpu(d_lnw, 1.0f, C, 0); mt_zero_gpu(d_lnb, C, 0);
        mt_layernorm_forward_gpu(d_ln, d_mean, d_rstd, d_inp, d_lnw, d_lnb, B, T, C, 0);
        mt_zero_gpu(d_dlnw, C, 0); mt_zero_gpu(d_dlnb, C, 0);
        mt_layernorm_backward_gpu(d_dinp, d_dlnw, d_dlnb, d_datt, d_inp, d_lnw, d_mean, d_rstd, B, T, C, 0);
        float *h = dev_download(d_dlnw, C); runs[r].push_back(std::vector<float>(h, h + C)); free(h);
        mt_zero_gpu(d_dwte, (size_t)V * C, 0);
        mt_embedding_backward_gpu(d_dwte, d_inp, d_tok, B, T, C, 0, V, 0);
        h = dev_download(d_dwte, (size_t)V * C); runs[r].push_back(std::vector<float>(h, h + (size_t)V * C)); free(h);
        for (int bf16 = 0; bf16 <= 1; bf16++) {
            mt_attention_forward_gpu(d_out, d_lse, d_qkv, B, T, C, NH, &drop, 0, NH, bf16, 0);
            mt_zero_gpu(d_dqkv, BT * 3 * C, 0);
            mt_attention_backward_gpu(d_dqkv, d_datt, d_qkv, d_out, d_lse, B, T, C, NH, &drop, 0, NH, bf16, 0);
            h = dev_download(d_dqkv, BT * 3 * C); runs[r].push_back(std::vector<float>(h, h + BT * 3 * C)); free(h);
        }
        double zero = 0.0, ss;
        MT_CUDA_CHECK(cudaMemcpy(d_ss, &zero, sizeof zero, cudaMemcpyHostToDevice));
        mt_sum_squares_gpu(d_ss, d_dwte, (size_t)V * C, 0);
        MT_CUDA_CHECK(cudaMemcpy(&ss, d_ss, sizeof ss, cudaMemcpyDeviceToHost));
        runs[r].push_back(std::vector<float>((float *)&ss, (float *)&ss + 2));
    }
    const char *names[] = {"matmul tiled dweight", "matmul tiled dbias", "matmul mma dweight", "matmul mma dbias", "layernorm dweight",
                           "embedding dwte", "attention fp32 dqkv", "attention bf16 dqkv", "sum of squares"};
    for (size_t i = 0; i < runs[0].size(); i++)
        check_equal_bits(names[i], runs[0][i].data(), runs[1][i].data(), runs[0][i].size() * sizeof(float));
    free(inp); free(w); free(dout); free(qkv); free(datt); free(tokens);
    dev_free(d_inp); dev_free(d_w); dev_free(d_dout); dev_free(d_qkv); dev_free(d_datt); dev_free(d_tok); dev_free(d_dw); dev_free(d_db);
    dev_free(d_dinp); dev_free(d_lnw); dev_free(d_lnb); dev_free(d_mean); dev_free(d_rstd); dev_free(d_ln); dev_free(d_dwte);
    dev_free(d_out); dev_free(d_lse); dev_free(d_dqkv); dev_free(d_ss); dev_free(d_dlnw); dev_free(d_dlnb);
}

// ---------------------------------------------------------------------------------------------
// the median of reps runs of f() on stream s, each between two device events
template <typename F>
static float median_event_ms(cudaStream_t s, F f, int reps) {
    cudaEvent_t start, stop;
    MT_CUDA_CHECK(cudaEventCreate(&start));
    MT_CUDA_CHECK(cudaEventCreate(&stop));
    std::vector<float> times;
    for (int r = 0; r < reps; r++) {
        MT_CUDA_CHECK(cudaEventRecord(start, s));
        f();
        MT_CUDA_CHECK(cudaEventRecord(stop, s));
        MT_CUDA_CHECK(cudaEventSynchronize(stop));
        float ms;
        MT_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
        times.push_back(ms);
    }
    MT_CUDA_CHECK(cudaEventDestroy(start));
    MT_CUDA_CHECK(cudaEventDestroy(stop));
    std::sort(times.begin(), times.end());
    return times[times.size() / 2];
}
// timings at GPT-2 small's shapes: median of device-event times after a warm-up
template <typename F>
static float time_ms(F f, int reps) {
    f();
    MT_CUDA_CHECK(cudaDeviceSynchronize());
    return median_event_ms(0, f, reps);
}
// a kernel as a training step's CUDA graph runs it: `launches` calls of f(stream) captured with
// programmatic dependent launch (each kernel's blocks start as the one ahead ends, no host launch
// between them), the graph's replay timed (median of 5) and divided by the launches. Bytes-bound
// kernels of ~50-200 MB lose 5-15% of a launch to its start in time_ms above; here they are timed
// without it, beside a device-to-device copy of the same bytes timed the same way (their ceiling).
template <typename F>
static float time_graph_ms(F f, int launches) {
    cudaStream_t s;
    MT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    f(s);   // (warm: scratch arenas, smem opt-ins)
    MT_CUDA_CHECK(cudaStreamSynchronize(s));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    MT_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    mt__pdl_on = 1;
    for (int i = 0; i < launches; i++) f(s);
    mt__pdl_on = 0;
    MT_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
    MT_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    MT_CUDA_CHECK(cudaGraphLaunch(exec, s));
    MT_CUDA_CHECK(cudaStreamSynchronize(s));
    float ms = median_event_ms(s, [&] { MT_CUDA_CHECK(cudaGraphLaunch(exec, s)); }, 5) / launches;
    MT_CUDA_CHECK(cudaGraphExecDestroy(exec));
    MT_CUDA_CHECK(cudaGraphDestroy(graph));
    MT_CUDA_CHECK(cudaStreamDestroy(s));
    return ms;
}
static void report(const char *name, const char *shape, float ms, double flop, double bytes) {
    printf("  %-36s %-30s %9.3f ms", name, shape, ms);
    if (flop > 0) printf("  %7.1f TFLOP/s", flop / ms / 1e9);
    if (bytes > 0) printf("  %7.0f GB/s", bytes / ms / 1e6);
    printf("\n");
    fflush(stdout);
}
__global__ void bench_random_kernel(float *x, size_t n, uint64_t prefix, float lo, float hi) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = lo + (hi - lo) * mt__gpu_rand_uniform(prefix, i);
}
__global__ void bench_tokens_kernel(int *x, size_t n, uint64_t prefix, int V) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = (int)(mt__gpu_hash64(prefix ^ i) % (uint64_t)V);
}
static float *bench_random(size_t n, float lo, float hi) {
    float *d = dev_alloc_f(n);
    bench_random_kernel<<<mt__blocks(n, 256), 256>>>(d, n, mt__gpu_hash64(rand_u32()), lo, hi);
    MT_CUDA_CHECK(cudaGetLastError());
    return d;
}

static void bench(void) {
    const int B = 16, T = 1024, C = 768, NH = 12, V = 50304, hs = C / NH;
    const size_t BT = (size_t)B * T;
    char shape[96];
    printf("\ntimings, GPT-2 small shapes (B=%d T=%d C=%d NH=%d V=%d), median of device-event times\n", B, T, C, NH, V);
    // ---- GEMMs: the five layers x (forward, input-gradient, weight-gradient)
    struct { const char *name; int K, N; } layers[5] = {{"qkv", 768, 2304}, {"attn proj", 768, 768}, {"fc", 768, 3072},
                                                        {"fc proj", 3072, 768}, {"lm head", 768, 50304}};
    float *inp = bench_random(BT * 3072, -1, 1), *W = bench_random((size_t)V * C, -0.05f, 0.05f), *bias = bench_random(V, -1, 1);
    float *out = bench_random(BT * V, -1, 1), *dout = bench_random(BT * V, -0.01f, 0.01f), *dinp = bench_random(BT * 3072, -1, 1);
    float *dW = bench_random((size_t)V * C, -1, 1);
    mt_gemm_impl impls[4] = {MT_GEMM_WGMMA, MT_GEMM_MMA, MT_GEMM_TILED, MT_GEMM_NAIVE};
    for (int k = 0; k < 4; k++) {
        mt_gemm_impl impl = impls[k];
        if (impl == MT_GEMM_WGMMA && mt__wgmma_unsupported()) continue;
        int fast = impl == MT_GEMM_MMA || impl == MT_GEMM_WGMMA;
        double total_flop = 0.0, total_ms = 0.0;
        int nlayers = fast ? 5 : 1;
        int M = impl == MT_GEMM_NAIVE ? 4096 : (int)BT, reps = fast ? 10 : 3;
        for (int l = 0; l < nlayers; l++) {
            int K = layers[l].K, N = layers[l].N;
            double flop = 2.0 * M * K * N;
            const float *b = l == 4 ? NULL : bias;
            float ms = time_ms([&] { mt_matmul_forward_gpu(out, inp, W, b, M, K, N, impl, MT_DTYPE_BF16, 0); }, reps);
            snprintf(shape, sizeof shape, "M=%d K=%d N=%d", M, K, N);
            char name[64];
            snprintf(name, sizeof name, "matmul %s %s forward", mt_gemm_impl_name(impl), layers[l].name);
            report(name, shape, ms, flop, 0);
            total_flop += flop; total_ms += ms;
            if (impl == MT_GEMM_NAIVE) break;
            // dinp (M,K) += dout (M,N) @ W (N,K)
            ms = time_ms([&] { mt__gemm(impl, dinp, dout, W, NULL, M, K, N, N, K, K, 1, 0, 1, MT_DTYPE_BF16, 0); }, reps);
            snprintf(name, sizeof name, "matmul %s %s input-grad", mt_gemm_impl_name(impl), layers[l].name);
            report(name, shape, ms, flop, 0);
            total_flop += flop; total_ms += ms;
            // dW (N,K) += dout^T @ inp
            ms = time_ms([&] { mt__gemm(impl, dW, dout, inp, NULL, N, K, M, N, K, K, 0, 0, 1, MT_DTYPE_BF16, 0); }, reps);
            snprintf(name, sizeof name, "matmul %s %s weight-grad", mt_gemm_impl_name(impl), layers[l].name);
            report(name, shape, ms, flop, 0);
            total_flop += flop; total_ms += ms;
        }
        if (impl == MT_GEMM_WGMMA)   // fp32 operands: the bf16 copies' casts are in these times
            report("matmul wgmma, all 15 together", "(cuBLAS: 675 TFLOP/s, ~18 ms)", (float)total_ms, total_flop, 0);
        if (impl == MT_GEMM_MMA) {
            report("matmul mma, all 15 together", "(cuBLAS: 675 TFLOP/s, ~18 ms)", (float)total_ms, total_flop, 0);
            float ms = time_ms([&] { mt__column_sum_add(bias, dout, (int)BT, 3072, 0); }, 10);
            report("matmul dbias (column sums)", "M=16384 N=3072", ms, 0, BT * 3072 * 4.0);
        }
    }
    dev_free(W); dev_free(dW);
    // ---- attention
    {
        float *qkv = bench_random(BT * 3 * C, -1.5f, 1.5f), *aout = dev_alloc_f(BT * C), *lse = dev_alloc_f((size_t)B * NH * T);
        float *datt = bench_random(BT * C, -1, 1), *dqkv = bench_random(BT * 3 * C, -1, 1);
        __nv_bfloat16 *qkv16 = (__nv_bfloat16 *)dev_alloc(BT * 3 * C * 2 + 16);
        mt_cast_f32_to_bf16_gpu(qkv16, qkv, BT * 3 * C, 0);
        double fwd_flop = 4.0 * B * NH * (double)T * T * hs / 2, bwd_flop = 2.5 * fwd_flop;   // causal: half the square
        snprintf(shape, sizeof shape, "B=%d NH=%d T=%d hs=%d", B, NH, T, hs);
        for (int variant = 0; variant < 3; variant++) {
            int bf16 = variant != 1;
            mt_dropout d = {1, 2, 3, variant == 2 ? 0.1f : 0.0f, 0, T, C, 0, T};
            char name[64];
            const char *mode = variant == 0 ? "bf16" : variant == 1 ? "fp32" : "bf16 dropout 0.1";
            int reps = bf16 ? 10 : 3;
            // bf16: from qkv stored in bf16, as training keeps it (mt_qkv_storage_dtype) and as
            // PyTorch's scaled_dot_product_attention takes q, k, v (tests/gpu/torch_ref.py)
            float f = time_ms([&] {
                if (bf16) mt_attention_forward16_gpu(aout, MT_DTYPE_FP32, lse, qkv16, B, T, C, NH, &d, 0, NH, bf16, 0);
                else mt_attention_forward_gpu(aout, lse, qkv, B, T, C, NH, &d, 0, NH, bf16, 0);
            }, reps);
            snprintf(name, sizeof name, "attention %s forward", mode);
            report(name, shape, f, fwd_flop, 0);
            float b = time_ms([&] {
                // (the training's: dqkv written in 16 bits, mt_dqkv_gemm_dtype)
                if (bf16) mt_attention_backward16_gpu(dqkv, bf16, datt, MT_DTYPE_FP32, qkv16, aout, MT_DTYPE_FP32, lse, B, T,
                                                      C, NH, &d, 0, NH, bf16, 0);
                else mt_attention_backward_gpu(dqkv, datt, qkv, aout, lse, B, T, C, NH, &d, 0, NH, bf16, 0);
            }, reps);
            snprintf(name, sizeof name, "attention %s backward", mode);
            report(name, shape, b, bwd_flop, 0);
            snprintf(name, sizeof name, "attention %s fwd+bwd", mode);
            report(name, "(cuDNN 240, FA2 153 TFLOP/s)", f + b, fwd_flop + bwd_flop, 0);
        }
        dev_free(qkv); dev_free(aout); dev_free(lse); dev_free(datt); dev_free(dqkv); dev_free(qkv16);
    }
    // ---- bandwidth-bound ops
    {
        size_t n = BT * C, nf = BT * 3072;
        float *x = bench_random(n, -1, 1), *y = bench_random(n, -1, 1), *z = dev_alloc_f(n), *w = bench_random(C, 0.5f, 1.5f), *bb = bench_random(C, -1, 1);
        float *mean = dev_alloc_f(BT), *rstd = dev_alloc_f(BT), *dw = bench_random(C, -1, 1), *db = bench_random(C, -1, 1);
        snprintf(shape, sizeof shape, "BT=%zu C=%d", BT, C);
        float ms = time_ms([&] { mt_layernorm_forward_gpu(z, mean, rstd, x, w, bb, B, T, C, 0); }, 20);
        report("layernorm forward", shape, ms, 0, 2.0 * n * 4);
        ms = time_ms([&] { mt_layernorm_backward_gpu(z, dw, db, y, x, w, mean, rstd, B, T, C, 0); }, 20);
        report("layernorm backward", shape, ms, 0, 4.0 * n * 4);
        ms = time_ms([&] { mt_residual_forward_gpu(z, x, y, n, 0); }, 20);
        report("residual forward", shape, ms, 0, 3.0 * n * 4);
        mt_dropout d = {1, 2, 3, 0.1f, 0, T, C, 0, T};
        ms = time_ms([&] { mt_dropout_forward_gpu(z, &d, B, 0); }, 20);
        report("dropout (p=0.1)", shape, ms, 0, 2.0 * n * 4);
        snprintf(shape, sizeof shape, "N=%zu", nf);
        ms = time_ms([&] { mt_gelu_forward_gpu(out, inp, nf, 0); }, 20);
        report("gelu forward", shape, ms, 0, 2.0 * nf * 4);
        ms = time_ms([&] { mt_gelu_backward_gpu(dinp, inp, dout, nf, 0); }, 20);
        report("gelu backward", shape, ms, 0, 3.0 * nf * 4);   // (dinp written, not added to: 3 streams)
        int *tok = (int *)dev_alloc(BT * sizeof(int));
        bench_tokens_kernel<<<mt__blocks(BT, 256), 256>>>(tok, BT, 12345, V);
        float *wte = bench_random((size_t)V * C, -1, 1), *wpe = bench_random((size_t)T * C, -1, 1);
        snprintf(shape, sizeof shape, "B=%d T=%d C=%d V=%d", B, T, C, V);
        ms = time_ms([&] { mt_embedding_forward_gpu(z, tok, wte, B, T, C, 0, V, 0); }, 20);
        report("embedding forward", shape, ms, 0, 2.0 * n * 4);
        ms = time_ms([&] { mt_embedding_backward_gpu(wte, y, tok, B, T, C, 0, V, 0); }, 10);
        report("embedding backward", shape, ms, 0, 3.0 * n * 4);
        ms = time_ms([&] { mt_position_embedding_forward_gpu(z, wpe, B, T, C, 0); }, 20);
        report("position embedding forward", shape, ms, 0, 2.0 * n * 4);
        ms = time_ms([&] { mt_position_embedding_backward_gpu(wpe, y, B, T, C, 0); }, 20);
        report("position embedding backward", shape, ms, 0, 1.0 * n * 4);
        // cross-entropy over the (BT, V) logits
        float *mx = dev_alloc_f(BT), *se = dev_alloc_f(BT), *tl = dev_alloc_f(BT), *loss = dev_alloc_f(BT);
        snprintf(shape, sizeof shape, "BT=%zu V=%d", BT, V);
        ms = time_ms([&] { mt_cross_entropy_local_max_gpu(mx, out, MT_DTYPE_FP32, (int)BT, V, 0, 50257, 0); }, 10);
        report("cross-entropy local max", shape, ms, 0, (double)BT * V * 4);
        ms = time_ms([&] { mt_cross_entropy_local_sums_gpu(se, tl, out, MT_DTYPE_FP32, mx, tok, (int)BT, V, 0, 50257, 0); }, 10);
        report("cross-entropy local sums", shape, ms, 0, (double)BT * V * 4);
        ms = time_ms([&] { mt_cross_entropy_local_max_sums_gpu(mx, se, tl, out, MT_DTYPE_FP32, tok, (int)BT, V, 0, 50257, 0); }, 10);
        report("cross-entropy one pass", shape, ms, 0, (double)BT * V * 4);
        ms = time_ms([&] { mt_cross_entropy_finish_gpu(loss, dout, MT_DTYPE_FP32, mx, se, tl, tok, (int)BT, V, 0, 50257, 1.0f / BT, 0); }, 10);
        report("cross-entropy finish (+dlogits)", shape, ms, 0, 2.0 * BT * V * 4);
        // the same over bf16 logits (what training keeps on the wgmma rung): half the bytes
        // (the fp32 buffer's first half holds them; the values are whatever its bits make)
        ms = time_ms([&] { mt_cross_entropy_local_max_sums_gpu(mx, se, tl, out, MT_DTYPE_BF16, tok, (int)BT, V, 0, 50257, 0); }, 10);
        report("cross-entropy one pass, bf16 logits", shape, ms, 0, (double)BT * V * 2);
        ms = time_ms([&] { mt_cross_entropy_finish_gpu(loss, out, MT_DTYPE_BF16, mx, se, tl, tok, (int)BT, V, 0, 50257, 1.0f / BT, 0); }, 10);
        report("cross-entropy finish (+dlogits), bf16 logits", shape, ms, 0, 2.0 * BT * V * 2);
        for (int staged = 0; staged <= 1; staged++) {   // the one-kernel form training runs at TP = 1
            mt__ce_unstaged = !staged;
            ms = time_ms([&] { mt_cross_entropy_fused16_gpu(loss, mx, se, tl, out, MT_DTYPE_BF16, tok, (int)BT, V, 0, 50257,
                                                            1.0f / BT, 0); }, 10);
            report(staged ? "cross-entropy fused, bf16 logits, row staged" : "cross-entropy fused, bf16 logits, unstaged",
                   shape, ms, 0, 2.0 * BT * V * 2);
        }
        mt__ce_unstaged = 0;
        // the issue's bytes-bound list again, as a training step's graph runs them (time_graph_ms),
        // each beside the device-to-device copy of its bytes timed the same way: the ratio is theirs
        printf("  as a training graph runs them (20 launches with programmatic launch; %% of a copy of the same bytes):\n");
        auto graph_row = [&](const char *name, const char *sh, double bytes, auto f) {
            float k_ms = time_graph_ms(f, 20);
            float c_ms = time_graph_ms([&](cudaStream_t s) {
                MT_CUDA_CHECK(cudaMemcpyAsync(out, out + (size_t)(bytes / 8), (size_t)(bytes / 2), cudaMemcpyDeviceToDevice, s));
            }, 20);
            printf("  %-36s %-30s %9.4f ms  %7.0f GB/s   copy %7.0f GB/s   %3.0f%%\n", name, sh, k_ms, bytes / k_ms / 1e6,
                   bytes / c_ms / 1e6, 100.0 * c_ms / k_ms);
            fflush(stdout);
        };
        snprintf(shape, sizeof shape, "BT=%zu C=%d", BT, C);
        graph_row("graph: layernorm forward", shape, 2.0 * n * 4,
                  [&](cudaStream_t s) { mt_layernorm_forward_gpu(z, mean, rstd, x, w, bb, B, T, C, s); });
        graph_row("graph: layernorm backward", shape, 4.0 * n * 4,
                  [&](cudaStream_t s) { mt_layernorm_backward_gpu(z, dw, db, y, x, w, mean, rstd, B, T, C, s); });
        graph_row("graph: residual forward", shape, 3.0 * n * 4,
                  [&](cudaStream_t s) { mt_residual_forward_gpu(z, x, y, n, s); });
        snprintf(shape, sizeof shape, "N=%zu", nf);
        graph_row("graph: gelu forward", shape, 2.0 * nf * 4, [&](cudaStream_t s) { mt_gelu_forward_gpu(dinp, inp, nf, s); });
        graph_row("graph: gelu backward", shape, 3.0 * nf * 4,
                  [&](cudaStream_t s) { mt_gelu_backward_gpu(dinp, inp, dout, nf, s); });
        dev_free(x); dev_free(y); dev_free(z); dev_free(w); dev_free(bb); dev_free(mean); dev_free(rstd); dev_free(dw); dev_free(db);
        dev_free(tok); dev_free(wte); dev_free(wpe); dev_free(mx); dev_free(se); dev_free(tl); dev_free(loss);
    }
    dev_free(inp); dev_free(bias); dev_free(out); dev_free(dout); dev_free(dinp);
    // ---- optimizer over GPT-2 small's 124M parameters
    {
        size_t n = 124475904;
        float *p = bench_random(n, -1, 1), *m = bench_random(n, -0.1f, 0.1f), *v = bench_random(n, 0, 0.01f), *g = bench_random(n, -1, 1);
        double *ss = (double *)dev_alloc(sizeof(double));
        __nv_bfloat16 *h16 = (__nv_bfloat16 *)dev_alloc(n * sizeof(__nv_bfloat16));
        snprintf(shape, sizeof shape, "n=%zu", n);
        float ms = time_ms([&] { mt_adamw_gpu(p, m, v, g, 0.5f, n, 6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 10, NULL, 0, 0); }, 10);
        report("adamw", shape, ms, 0, 7.0 * n * 4);
        ms = time_ms([&] { mt_adamw_gpu(p, m, v, g, 0.5f, n, 6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 10, (uint16_t *)h16, 0, 0); }, 10);
        report("adamw + its bf16 copy", shape, ms, 0, 7.5 * n * 4);
        ms = time_ms([&] { mt_sum_squares_gpu(ss, g, n, 0); }, 10);
        report("sum of squares (grad norm)", shape, ms, 0, 4.0 * n);
        ms = time_ms([&] { mt_cast_f32_to_bf16_gpu(h16, p, n, 0); }, 10);
        report("cast fp32 -> bf16", shape, ms, 0, 6.0 * n);
        dev_free(p); dev_free(m); dev_free(v); dev_free(g); dev_free(ss); dev_free(h16);
    }
}

// ---------------------------------------------------------------------------------------------
static const char *only = NULL;   // --only a,b,c: the tests whose names contain one of the words
static void run(const char *name, void (*fn)(void)) {
    if (only) {
        int wanted = 0;
        const char *w = only;
        while (*w && !wanted) {
            size_t len = strcspn(w, ",");
            for (const char *p = name; *p && !wanted; p++) wanted = len > 0 && strncmp(p, w, len) == 0;
            w += len + (w[len] == ',');
        }
        if (!wanted) return;
    }
    mt__run_test(name, fn);
}
int main(int argc, char **argv) {
    uint64_t seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    int do_tests = 1, do_bench = 1;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc) seed = strtoull(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--only") == 0 && i + 1 < argc) only = argv[++i];
        else if (strcmp(argv[i], "--no-bench") == 0) do_bench = 0;
        else if (strcmp(argv[i], "--bench-only") == 0) do_tests = 0;
        else mt_fatal("unknown argument %s\nhint: --seed N | --only NAME | --no-bench | --bench-only", argv[i]);
    }
    rng_state = seed ? seed : 1;
    cudaDeviceProp prop;
    MT_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, %d SMs, compute capability %d.%d; seed %llu (--seed repeats this run)\n", prop.name,
           prop.multiProcessorCount, prop.major, prop.minor, (unsigned long long)seed);
    // as a training rank's pool (mt_device_init): keep what the launchers give back. Without it the
    // pool returns its memory to the driver at every synchronisation (the timings below wait for
    // each call), and an op that borrows scratch (the attention backward's copies, split-K partial
    // products) would pay for mapping it again in every timed call, which training never does
    cudaMemPool_t pool;
    MT_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, 0));
    uint64_t keep = UINT64_MAX;
    MT_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
    if (do_tests) {
        run("rng_matches_cpu", test_rng_matches_cpu);
        run("fill_zero_cast", test_fill_zero_cast);
        run("embedding", test_embedding);
        run("position_embedding", test_position_embedding);
        run("layernorm", test_layernorm);
        run("matmul", test_matmul);
        run("matmul_gelu", test_matmul_gelu);
        run("wgmma_staged_epilogue", test_wgmma_staged_epilogue);
        run("wgmma_gelu_remake", test_wgmma_gelu_remake);
        run("wgmma_pingpong", test_wgmma_pingpong);
        run("dropout", test_dropout);
        run("copy_strided", test_copy_strided);
        run("attention", test_attention);
        run("decode", test_decode);
        run("sample_rows", test_sample_rows);
        run("decode_advance", test_decode_advance);
        run("qkv_attention_decode", test_qkv_attention_decode);
        run("decode_chain_pdl", test_decode_chain_pdl);
        run("decode_step_one_kernel", test_decode_step_one_kernel);
        run("gelu_residual", test_gelu_residual);
        run("vector_and_scalar_paths", test_vector_and_scalar_paths);
        run("cross_entropy", test_cross_entropy);
        run("adamw", test_adamw);
        run("sum_squares", test_sum_squares);
        run("loss_mean_add", test_loss_mean_add);
        run("p2p_batch_nccl", test_p2p_batch_nccl);
        run("started_collectives_nccl", test_started_collectives_nccl);
        run("determinism", test_determinism);
    }
    if (do_bench) bench();
    return mt_test_summary();
}

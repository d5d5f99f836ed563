/* tests/test_ops.c - §3 OPS: every op's backward against central finite differences.
 *
 *   gcc -std=c11 -Wall -Wextra -pedantic -O2 -I. -o tests/test_ops tests/test_ops.c -lm -pthread && ./tests/test_ops
 *
 * Method (DESIGN "How we know it is right" 1). For each op:
 *   - random inputs from fixed seeds, and a random R of the output's shape;
 *   - the scalar objective L = sum(out * R), so the analytic gradient is the op's backward
 *     with dout = R (into d-buffers we zero first: every backward ADDS);
 *   - a small double-precision re-implementation of the op's forward written here from the
 *     formula (not from the C code), checked against the fp32 forward, gives L in double;
 *   - the numerical gradient is the central difference (L(x+h) - L(x-h)) / 2h in double with
 *     h = 1e-6. Its error is h^2 |L'''| / 6 (~1e-12 here, the inputs are O(1)) plus the
 *     rounding of L, ~1e-16 |L| / h (~1e-9 here): it is exact to ~1e-8 relative, so every
 *     difference the comparison sees comes from the fp32 backward.
 * The tolerances below therefore bound fp32 rounding in the backward. mt_check_tensor
 * measures |got - want| / max(|want|, 1e-3 * max|want|), so an element whose gradient is
 * nearly zero is compared against 1e-3 of the tensor's largest gradient.
 * Every backward is also called twice to check it accumulates (+=): the second call must
 * give 2x the first.
 */
#define MEGATRON_IMPLEMENTATION
#include "../megatron.h"
#include "harness.h"

// ---------------------------------------------------------------------------------------------
// small helpers
// ---------------------------------------------------------------------------------------------
static uint64_t rng_next(uint64_t *s) {   // splitmix64
    uint64_t z = (*s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}
static float rng_uniform(uint64_t *s) { return (float)(rng_next(s) >> 40) / 16777216.0f; }   // [0,1)
// fills x with uniform values in [offset - scale, offset + scale)
static void fill_uniform(float *x, size_t n, uint64_t *s, float scale, float offset) {
    for (size_t i = 0; i < n; i++) x[i] = offset + scale * (2.0f * rng_uniform(s) - 1.0f);
}
static float *alloc_f(size_t n) { return (float *)mt_calloc(n, sizeof(float), "test"); }
static double *alloc_d(size_t n) { return (double *)mt_calloc(n, sizeof(double), "test"); }
static void to_double(double *d, const float *f, size_t n) { for (size_t i = 0; i < n; i++) d[i] = (double)f[i]; }

// the objective as a function of one double array (the one being differentiated); the
// closure `ctx` carries everything else
typedef double (*objective_fn)(const double *x, void *ctx);
#define FD_H 1e-6
// numerical gradient of f at x (n values) by central differences, into grad (as float, for
// mt_check_tensor). x is restored afterwards.
static void fd_gradient(float *grad, double *x, size_t n, objective_fn f, void *ctx) {
    for (size_t i = 0; i < n; i++) {
        double keep = x[i];
        x[i] = keep + FD_H;
        double lp = f(x, ctx);
        x[i] = keep - FD_H;
        double lm = f(x, ctx);
        x[i] = keep;
        grad[i] = (float)((lp - lm) / (2.0 * FD_H));
    }
}
// 2x check: after a second backward call into the same buffers, each value must be twice the
// first call's. The second call adds the same terms again onto a non-zero start, so the sums
// round differently by a few ulps of the running value.
static void expect_doubled(const char *label, const float *twice, const float *once, size_t n) {
    float *want = alloc_f(n);
    for (size_t i = 0; i < n; i++) want[i] = 2.0f * once[i];
    // the second call rounds each added term against a different running value: the error is that
    // of the gradient itself (n * u * sum|terms|), which on a near-zero element, measured against
    // the floor 1e-3 * max, is up to ~4e-4 (see the matmul note). Tolerance 1e-3; a backward
    // that overwrites (=) instead of adding is off by 0.5.
    mt_check_tensor(label, twice, want, n, 1e-3);
    free(want);
}

// =============================================================================================
// embedding (vocab-parallel) and position embedding
// =============================================================================================
typedef struct { const int *tokens; const double *R; int BT, C, vocab_start, V_local; } emb_ctx;
static double emb_objective(const double *wte, void *vctx) {
    const emb_ctx *c = (const emb_ctx *)vctx;
    double L = 0;
    for (int i = 0; i < c->BT; i++) {
        int local = c->tokens[i] - c->vocab_start;
        if (local < 0 || local >= c->V_local) continue;   // not this shard's token: output 0
        for (int k = 0; k < c->C; k++) L += wte[(size_t)local * c->C + k] * c->R[(size_t)i * c->C + k];
    }
    return L;
}

MT_TEST(embedding_vocab_parallel) {
    enum { B = 2, T = 5, C = 6, V = 12, SHARDS = 2, VL = V / SHARDS };
    uint64_t s = 11;
    // tokens cover both shards; 13 and 40 are outside the table (>= V): no shard owns them
    int tokens[B * T] = {0, 5, 6, 11, 3, 7, 13, 6, 40, 0};
    float *wte = alloc_f(V * C), *R = alloc_f(B * T * C), *full = alloc_f(B * T * C), *sum = alloc_f(B * T * C);
    fill_uniform(wte, V * C, &s, 1.0f, 0.0f);
    fill_uniform(R, B * T * C, &s, 1.0f, 0.0f);
    // the unsharded lookup, written out here: wte row of the token, 0 for a token outside the table
    for (int i = 0; i < B * T; i++)
        for (int k = 0; k < C; k++) full[i * C + k] = tokens[i] < V ? wte[tokens[i] * C + k] : 0.0f;
    for (int sh = 0; sh < SHARDS; sh++) {
        int vs = sh * VL;
        float *out = alloc_f(B * T * C);
        for (int i = 0; i < B * T * C; i++) out[i] = 99.0f;   // the forward writes with '='
        mt_embedding_forward_cpu(out, tokens, wte + (size_t)vs * C, B, T, C, vs, VL);
        int zeros_ok = 1;
        for (int i = 0; i < B * T; i++) {
            int mine = tokens[i] >= vs && tokens[i] < vs + VL;
            for (int k = 0; k < C; k++) {
                if (!mine && out[i * C + k] != 0.0f) zeros_ok = 0;
                sum[i * C + k] += out[i * C + k];
            }
        }
        mt_expect(zeros_ok, "shard %d: tokens outside [vocab_start, vocab_start+V_local) must give zeros", sh);
        // backward: analytic vs finite differences of the double objective
        float *dwte = alloc_f(VL * C), *num = alloc_f(VL * C);
        mt_embedding_backward_cpu(dwte, R, tokens, B, T, C, vs, VL);
        double *wd = alloc_d(VL * C), *Rd = alloc_d(B * T * C);
        to_double(wd, wte + (size_t)vs * C, VL * C);
        to_double(Rd, R, B * T * C);
        emb_ctx ctx = {tokens, Rd, B * T, C, vs, VL};
        fd_gradient(num, wd, VL * C, emb_objective, &ctx);
        // 1e-6: the gradient of a row is a sum of at most 2 dout values here (token 6 and 0 appear
        // twice): one fp32 rounding, 6e-8 relative; the FD of this linear objective is exact to ~1e-9
        mt_check_tensor(sh == 0 ? "dwte shard 0" : "dwte shard 1", dwte, num, VL * C, 1e-6);
        // rows no token looks up get exactly nothing (shard 0: rows 1,2,4; shard 1: rows 8,9,10 local 2,3,4)
        int untouched[2][3] = {{1, 2, 4}, {2, 3, 4}};
        int untouched_zero = 1;
        for (int u = 0; u < 3; u++)
            for (int k = 0; k < C; k++) if (dwte[untouched[sh][u] * C + k] != 0.0f) untouched_zero = 0;
        mt_expect(untouched_zero, "shard %d: rows no token looks up must get no gradient", sh);
        float *once = alloc_f(VL * C);
        memcpy(once, dwte, sizeof(float) * VL * C);
        mt_embedding_backward_cpu(dwte, R, tokens, B, T, C, vs, VL);
        expect_doubled("dwte accumulates", dwte, once, VL * C);
        free(out); free(dwte); free(num); free(wd); free(Rd); free(once);
    }
    // each position is owned by at most one shard, so the shards' outputs add up to the full lookup
    // exactly (x + 0 = x): tolerance 0
    mt_check_tensor("sum of shard outputs = full lookup", sum, full, B * T * C, 0.0);
    free(wte); free(R); free(full); free(sum);
}

typedef struct { const double *R; int BT_rows, T, C; } pos_ctx;
static double pos_objective(const double *wpe, void *vctx) {
    const pos_ctx *c = (const pos_ctx *)vctx;
    double L = 0;
    for (int i = 0; i < c->BT_rows; i++) {
        int t = i % c->T;
        for (int k = 0; k < c->C; k++) L += wpe[(size_t)t * c->C + k] * c->R[(size_t)i * c->C + k];
    }
    return L;
}

MT_TEST(position_embedding) {
    enum { B = 3, T = 4, C = 5, maxT = 6 };
    uint64_t s = 12;
    float *wpe = alloc_f(maxT * C), *out = alloc_f(B * T * C), *want = alloc_f(B * T * C), *R = alloc_f(B * T * C);
    fill_uniform(wpe, maxT * C, &s, 1.0f, 0.0f);
    fill_uniform(out, B * T * C, &s, 1.0f, 0.0f);   // it adds into out (out holds the token embedding)
    fill_uniform(R, B * T * C, &s, 1.0f, 0.0f);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int k = 0; k < C; k++) want[(b * T + t) * C + k] = out[(b * T + t) * C + k] + wpe[t * C + k];
    mt_position_embedding_forward_cpu(out, wpe, B, T, C);
    // one fp32 addition computed the same way: tolerance 0
    mt_check_tensor("out += wpe[t]", out, want, B * T * C, 0.0);
    float *dwpe = alloc_f(maxT * C), *num = alloc_f(maxT * C);
    mt_position_embedding_backward_cpu(dwpe, R, B, T, C);
    double *wd = alloc_d(maxT * C), *Rd = alloc_d(B * T * C);
    to_double(wd, wpe, maxT * C);
    to_double(Rd, R, B * T * C);
    pos_ctx ctx = {Rd, B * T, T, C};
    fd_gradient(num, wd, maxT * C, pos_objective, &ctx);
    // 1e-6: each dwpe[t] sums B = 3 values of R (two fp32 roundings, ~1.2e-7); rows t >= T must be 0
    mt_check_tensor("dwpe", dwpe, num, maxT * C, 1e-6);
    float *once = alloc_f(maxT * C);
    memcpy(once, dwpe, sizeof(float) * maxT * C);
    mt_position_embedding_backward_cpu(dwpe, R, B, T, C);
    expect_doubled("dwpe accumulates", dwpe, once, maxT * C);
    free(wpe); free(out); free(want); free(R); free(dwpe); free(num); free(wd); free(Rd); free(once);
}

// =============================================================================================
// layernorm
// =============================================================================================
typedef struct { double *x, *w, *b; const double *R; int BT, C; double *out; } ln_ctx;
static void ln_forward_d(const ln_ctx *c) {
    for (int i = 0; i < c->BT; i++) {
        const double *x = c->x + (size_t)i * c->C;
        double m = 0, v = 0;
        for (int k = 0; k < c->C; k++) m += x[k];
        m /= c->C;
        for (int k = 0; k < c->C; k++) v += (x[k] - m) * (x[k] - m);
        v /= c->C;
        double rstd = 1.0 / sqrt(v + 1e-5);
        for (int k = 0; k < c->C; k++) c->out[(size_t)i * c->C + k] = (x[k] - m) * rstd * c->w[k] + c->b[k];
    }
}
static double ln_objective_sum(const ln_ctx *c) {
    ln_forward_d(c);
    double L = 0;
    for (size_t i = 0; i < (size_t)c->BT * c->C; i++) L += c->out[i] * c->R[i];
    return L;
}
// the three objectives: the array being varied is swapped in for x, w or b
static double ln_obj_x(const double *x, void *v) { ln_ctx c = *(ln_ctx *)v; c.x = (double *)x; return ln_objective_sum(&c); }
static double ln_obj_w(const double *w, void *v) { ln_ctx c = *(ln_ctx *)v; c.w = (double *)w; return ln_objective_sum(&c); }
static double ln_obj_b(const double *b, void *v) { ln_ctx c = *(ln_ctx *)v; c.b = (double *)b; return ln_objective_sum(&c); }

MT_TEST(layernorm) {
    enum { B = 2, T = 3, C = 16, N = B * T * C };
    uint64_t s = 13;
    float *x = alloc_f(N), *w = alloc_f(C), *bias = alloc_f(C), *R = alloc_f(N);
    float *out = alloc_f(N), *mean = alloc_f(B * T), *rstd = alloc_f(B * T);
    fill_uniform(x, N, &s, 2.0f, 0.5f);       // a non-zero mean and a spread of 1.15: mean and var matter
    fill_uniform(w, C, &s, 0.5f, 1.0f);
    fill_uniform(bias, C, &s, 0.5f, 0.0f);
    fill_uniform(R, N, &s, 1.0f, 0.0f);
    mt_layernorm_forward_cpu(out, mean, rstd, x, w, bias, B, T, C);
    double *xd = alloc_d(N), *wd = alloc_d(C), *bd = alloc_d(C), *Rd = alloc_d(N), *outd = alloc_d(N);
    to_double(xd, x, N); to_double(wd, w, C); to_double(bd, bias, C); to_double(Rd, R, N);
    ln_ctx ctx = {xd, wd, bd, Rd, B * T, C, outd};
    ln_forward_d(&ctx);
    float *outf = alloc_f(N);
    for (int i = 0; i < N; i++) outf[i] = (float)outd[i];
    // 1e-5: fp32 mean/var over C = 16 values (~16 ulps at worst, 1e-6) then a few products
    mt_check_tensor("layernorm forward vs double", out, outf, N, 1e-5);
    float *dx = alloc_f(N), *dw = alloc_f(C), *db = alloc_f(C);
    mt_layernorm_backward_cpu(dx, dw, db, R, x, w, mean, rstd, B, T, C);
    float *nx = alloc_f(N), *nw = alloc_f(C), *nb = alloc_f(C);
    fd_gradient(nx, xd, N, ln_obj_x, &ctx);
    fd_gradient(nw, wd, C, ln_obj_w, &ctx);
    fd_gradient(nb, bd, C, ln_obj_b, &ctx);
    // dx = rstd (dnorm - mean(dnorm) - norm mean(dnorm norm)): two fp32 sums over C = 16 terms of
    // size ~0.5 and a difference of O(1) terms that cancels. Absolute error ~ C * u * sum|terms|
    // ~ 16 * 6e-8 * 8 ~ 8e-6 at worst, typically sqrt(C) * u * 8 ~ 2e-6, times rstd ~ 0.9; against
    // the floor 1e-3 * max|dx| (~2e-3) on the near-zero elements: ~1e-3. Tolerance 2e-3.
    mt_check_tensor("layernorm dinp", dx, nx, N, 2e-3);
    // dweight sums BT = 6 products norm * dout, dbias 6 values: as matmul's dweight,
    // n * u * sum|terms| ~ 6 * 6e-8 * 6 ~ 2e-6 against a floor of 1e-3 * max (~3e-3): 1e-3
    mt_check_tensor("layernorm dweight", dw, nw, C, 1e-3);
    mt_check_tensor("layernorm dbias", db, nb, C, 1e-3);
    float *dx1 = alloc_f(N), *dw1 = alloc_f(C), *db1 = alloc_f(C);
    memcpy(dx1, dx, sizeof(float) * N); memcpy(dw1, dw, sizeof(float) * C); memcpy(db1, db, sizeof(float) * C);
    mt_layernorm_backward_cpu(dx, dw, db, R, x, w, mean, rstd, B, T, C);
    expect_doubled("layernorm dinp accumulates", dx, dx1, N);
    expect_doubled("layernorm dweight accumulates", dw, dw1, C);
    expect_doubled("layernorm dbias accumulates", db, db1, C);
    // the saved statistics are the row's mean and 1/sqrt(var + 1e-5)
    float m0 = 0, v0 = 0;
    for (int k = 0; k < C; k++) m0 += x[k];
    m0 /= C;
    for (int k = 0; k < C; k++) v0 += (x[k] - m0) * (x[k] - m0);
    v0 /= C;
    mt_expect(fabsf(mean[0] - m0) <= 1e-6f * (1.0f + fabsf(m0)), "layernorm mean[0] %g, want %g", mean[0], m0);
    mt_expect(fabsf(rstd[0] - 1.0f / sqrtf(v0 + 1e-5f)) <= 1e-5f * rstd[0], "layernorm rstd[0] %g", rstd[0]);
    free(x); free(w); free(bias); free(R); free(out); free(mean); free(rstd);
    free(xd); free(wd); free(bd); free(Rd); free(outd); free(outf);
    free(dx); free(dw); free(db); free(nx); free(nw); free(nb); free(dx1); free(dw1); free(db1);
}

// =============================================================================================
// matmul (linear layer): out = inp @ weight^T + bias
// =============================================================================================
typedef struct { double *x, *w, *b; const double *R; int BT, C, OC; } mm_ctx;
static double mm_objective(const mm_ctx *c) {
    double L = 0;
    for (int i = 0; i < c->BT; i++)
        for (int o = 0; o < c->OC; o++) {
            double y = c->b ? c->b[o] : 0.0;
            for (int k = 0; k < c->C; k++) y += c->x[(size_t)i * c->C + k] * c->w[(size_t)o * c->C + k];
            L += y * c->R[(size_t)i * c->OC + o];
        }
    return L;
}
static double mm_obj_x(const double *x, void *v) { mm_ctx c = *(mm_ctx *)v; c.x = (double *)x; return mm_objective(&c); }
static double mm_obj_w(const double *w, void *v) { mm_ctx c = *(mm_ctx *)v; c.w = (double *)w; return mm_objective(&c); }
static double mm_obj_b(const double *b, void *v) { mm_ctx c = *(mm_ctx *)v; c.b = (double *)b; return mm_objective(&c); }

static void matmul_case(int with_bias) {
    // C = 19 exercises the 8-wide inner loop and its tail, OC = 7 the 4-output block and its tail
    enum { BT = 6, C = 19, OC = 7 };
    uint64_t s = 14 + (uint64_t)with_bias;
    float *x = alloc_f(BT * C), *w = alloc_f(OC * C), *bias = with_bias ? alloc_f(OC) : NULL, *R = alloc_f(BT * OC);
    float *out = alloc_f(BT * OC);
    fill_uniform(x, BT * C, &s, 1.0f, 0.0f);
    fill_uniform(w, OC * C, &s, 1.0f, 0.0f);
    if (bias) fill_uniform(bias, OC, &s, 1.0f, 0.0f);
    fill_uniform(R, BT * OC, &s, 1.0f, 0.0f);
    for (int i = 0; i < BT * OC; i++) out[i] = 99.0f;   // '=': the old contents must not leak
    mt_matmul_forward_cpu(out, x, w, bias, BT, C, OC);
    double *xd = alloc_d(BT * C), *wd = alloc_d(OC * C), *bd = alloc_d(OC), *Rd = alloc_d(BT * OC);
    to_double(xd, x, BT * C); to_double(wd, w, OC * C); to_double(Rd, R, BT * OC);
    if (bias) to_double(bd, bias, OC);
    float *want = alloc_f(BT * OC);
    for (int i = 0; i < BT; i++)
        for (int o = 0; o < OC; o++) {
            double y = bias ? bd[o] : 0.0;
            for (int k = 0; k < C; k++) y += xd[i * C + k] * wd[o * C + k];
            want[i * OC + o] = (float)y;
        }
    // fp32 sums of n products of values in [-1,1) are off by at most n * u * sum|terms|
    // (u = 2^-24 = 6e-8), typically sqrt(n) * u * sum|terms|. Where the result cancels to near 0 it
    // is measured against the floor 1e-3 * max|want|, so the relative error there is
    // (error) / (1e-3 * max|want|). Forward: n = 19, sum|terms| ~ 19 * 0.25 ~ 5, max|want| ~ 3:
    // typical 4.4 * 6e-8 * 5 / 3e-3 ~ 4e-4 at worst on a near-zero output. Tolerance 1e-3.
    mt_check_tensor(with_bias ? "matmul forward (bias)" : "matmul forward (no bias)", out, want, BT * OC, 1e-3);
    mm_ctx ctx = {xd, wd, bias ? bd : NULL, Rd, BT, C, OC};
    float *dx = alloc_f(BT * C), *dw = alloc_f(OC * C), *db = alloc_f(OC);
    mt_matmul_backward_cpu(dx, dw, bias ? db : NULL, R, x, w, BT, C, OC);
    float *nx = alloc_f(BT * C), *nw = alloc_f(OC * C), *nb = alloc_f(OC);
    fd_gradient(nx, xd, BT * C, mm_obj_x, &ctx);
    fd_gradient(nw, wd, OC * C, mm_obj_w, &ctx);
    // dinp sums OC = 7 products, dweight BT = 6, dbias 6 values (the objective is linear, so the FD
    // is exact to ~1e-9). As for the forward: n <= 7, sum|terms| <= 7 * 0.25 ~ 2, max|grad| ~ 2;
    // on a near-zero gradient the error n * u * sum|terms| ~ 8e-7 against the floor 2e-3 is 4e-4.
    // Away from 0 the error is ~1e-7 relative. Tolerance 1e-3.
    mt_check_tensor("matmul dinp", dx, nx, BT * C, 1e-3);
    mt_check_tensor("matmul dweight", dw, nw, OC * C, 1e-3);
    if (bias) {
        fd_gradient(nb, bd, OC, mm_obj_b, &ctx);
        mt_check_tensor("matmul dbias", db, nb, OC, 1e-3);   // sums of 6 values of R: as dweight
    }
    // dinp = NULL (nothing upstream needs it): dweight and dbias must be the same numbers
    float *dw2 = alloc_f(OC * C), *db2 = alloc_f(OC);
    mt_matmul_backward_cpu(NULL, dw2, bias ? db2 : NULL, R, x, w, BT, C, OC);
    // the same loops in the same order: tolerance 0
    mt_check_tensor("matmul dweight with dinp NULL", dw2, dw, OC * C, 0.0);
    if (bias) mt_check_tensor("matmul dbias with dinp NULL", db2, db, OC, 0.0);
    // the parameter gradients accumulate; dinp (an activation gradient) is written ('=')
    float *dx1 = alloc_f(BT * C), *dw1 = alloc_f(OC * C), *db1 = alloc_f(OC);
    memcpy(dx1, dx, sizeof(float) * BT * C); memcpy(dw1, dw, sizeof(float) * OC * C); memcpy(db1, db, sizeof(float) * OC);
    for (int i = 0; i < BT * C; i++) dx[i] = 1e9f;   // garbage that '=' must replace
    mt_matmul_backward_cpu(dx, dw, bias ? db : NULL, R, x, w, BT, C, OC);
    mt_check_tensor("matmul dinp is written, not added", dx, dx1, BT * C, 0.0);
    expect_doubled("matmul dweight accumulates", dw, dw1, OC * C);
    if (bias) expect_doubled("matmul dbias accumulates", db, db1, OC);
    free(x); free(w); free(bias); free(R); free(out); free(xd); free(wd); free(bd); free(Rd); free(want);
    free(dx); free(dw); free(db); free(nx); free(nw); free(nb); free(dw2); free(db2); free(dx1); free(dw1); free(db1);
}
MT_TEST(matmul_with_bias) { matmul_case(1); }
MT_TEST(matmul_no_bias) { matmul_case(0); }

// =============================================================================================
// dropout
// =============================================================================================
MT_TEST(dropout) {
    enum { B = 4, T = 32, C = 64, N = B * T * C };
    const float p = 0.3f;
    uint64_t s = 15;
    float *x = alloc_f(N), *y = alloc_f(N);
    fill_uniform(x, N, &s, 1.0f, 2.0f);   // values in [1,3): never 0, so a 0 output means dropped
    memcpy(y, x, sizeof(float) * N);
    mt_dropout d = {1234, 7, 3 * 8 + 2, p, 0, T, C, 0, T};
    mt_dropout_forward_cpu(y, &d, B);
    int kept = 0, scaled_ok = 1;
    for (int i = 0; i < N; i++) {
        if (y[i] == 0.0f) continue;
        kept++;
        // kept values are x / (1 - p): fp32 x * (1/(1-p)) is within 2 ulps (2.4e-7) of the exact value
        double want = (double)x[i] / (1.0 - (double)p);
        if (fabs((double)y[i] - want) > 3e-7 * want) scaled_ok = 0;
    }
    double frac = (double)kept / N;
    // binomial: std of the kept fraction is sqrt(0.7 * 0.3 / 8192) = 0.005; 5 std = 0.025
    mt_expect(fabs(frac - 0.7) < 0.025, "dropout p=0.3 kept %.4f of the elements, want 0.7 +- 0.025", frac);
    mt_expect(scaled_ok, "dropout: kept elements must be scaled by 1/(1-p)");
    // backward: the same mask on the gradient (in place): dx = dy * mask / (1-p)
    float *dy = alloc_f(N);
    fill_uniform(dy, N, &s, 1.0f, 2.0f);
    float *dy_in = alloc_f(N);
    memcpy(dy_in, dy, sizeof(float) * N);
    mt_dropout_backward_cpu(dy, &d, B);
    int same_mask = 1;
    for (int i = 0; i < N; i++) if ((y[i] == 0.0f) != (dy[i] == 0.0f)) same_mask = 0;
    mt_expect(same_mask, "dropout backward must drop exactly the elements the forward dropped");
    // L = sum(dropout(x) * R) is linear in x with dL/dx = mask / (1-p) * R: the finite difference
    // (exact for a linear map) of the fp32 forward on a one-hot x gives the same numbers. Checked
    // on the first 512 elements (each FD is a forward over all N).
    enum { NCHECK = 512 };
    float *num = alloc_f(NCHECK), *e = alloc_f(N);
    for (int i = 0; i < NCHECK; i++) {
        memset(e, 0, sizeof(float) * N);
        e[i] = 1.0f;
        mt_dropout_forward_cpu(e, &d, B);
        num[i] = e[i] * dy_in[i];   // d/dx_i of sum(dropout(x) * R) with R = dy_in
    }
    // both sides are the one fp32 product (1/(1-p)) * dy (IEEE multiplication commutes exactly)
    // or an exact 0: tolerance 0
    mt_check_tensor("dropout backward vs derivative of forward", dy, num, NCHECK, 0.0);
    // the mask depends only on the global element index: B = 4 at once, or as two halves of
    // B = 2 with sample_offset 0 and 2, or one sample at a time, gives the same output
    float *h = alloc_f(N);
    memcpy(h, x, sizeof(float) * N);
    mt_dropout d0 = d, d2 = d;
    d0.sample_offset = 0; d2.sample_offset = 2;
    mt_dropout_forward_cpu(h, &d0, 2);
    mt_dropout_forward_cpu(h + 2 * T * C, &d2, 2);
    // the same arithmetic on the same values: tolerance 0
    mt_check_tensor("dropout mask: B=4 vs two halves with sample_offset", h, y, N, 0.0);
    memcpy(h, x, sizeof(float) * N);
    for (int b = 0; b < B; b++) {
        mt_dropout db = d;
        db.sample_offset = b;
        mt_dropout_forward_cpu(h + (size_t)b * T * C, &db, 1);
    }
    mt_check_tensor("dropout mask: B=4 vs one sample at a time", h, y, N, 0.0);
    // sequence parallel (section 4): 4 shards (B, T/4, C), shard k at positions [k*T/4, ...), each
    // dropped on its own with t_offset, then put back side by side, give the same output
    enum { SHARDS = 4, TS = T / SHARDS };
    float *shard = alloc_f((size_t)B * TS * C);
    for (int k = 0; k < SHARDS; k++) {
        for (int b = 0; b < B; b++)
            memcpy(shard + (size_t)b * TS * C, x + ((size_t)b * T + (size_t)k * TS) * C, sizeof(float) * TS * C);
        mt_dropout dk = d;
        dk.t_offset = k * TS;
        dk.T_local = TS;
        mt_dropout_forward_cpu(shard, &dk, B);
        for (int b = 0; b < B; b++)
            memcpy(h + ((size_t)b * T + (size_t)k * TS) * C, shard + (size_t)b * TS * C, sizeof(float) * TS * C);
    }
    mt_check_tensor("dropout mask: B=4 vs 4 sequence shards with t_offset", h, y, N, 0.0);
    free(shard);
    // another site or iteration gives another mask
    memcpy(h, x, sizeof(float) * N);
    mt_dropout dsite = d;
    dsite.site = d.site + 1;
    mt_dropout_forward_cpu(h, &dsite, B);
    int differ = 0;
    for (int i = 0; i < N; i++) if ((h[i] == 0.0f) != (y[i] == 0.0f)) differ++;
    // independent masks differ on 2 * 0.7 * 0.3 = 42% of the elements
    mt_expect(differ > N / 4, "dropout: another site must give another mask (%d of %d differ)", differ, N);
    // p = 0 is the identity
    memcpy(h, x, sizeof(float) * N);
    mt_dropout doff = d;
    doff.p = 0.0f;
    mt_dropout_forward_cpu(h, &doff, B);
    mt_check_tensor("dropout p=0 is the identity", h, x, N, 0.0);   // nothing computed: exact
    free(x); free(y); free(dy); free(dy_in); free(num); free(e); free(h);
}

// =============================================================================================
// causal self-attention
// =============================================================================================
// double reference: qkv (B,T,3C) = [Q|K|V], heads of size hs = C/NH; mask (B,NH,T,T) of 0/1 for
// dropout on the probabilities (NULL: none), scaled by 1/(1-p)
typedef struct { const double *R; const float *mask; double p; int B, T, C, NH; double *out; } att_ctx;
static void att_forward_d(const double *qkv, const att_ctx *c) {
    int B = c->B, T = c->T, C = c->C, NH = c->NH, hs = C / NH;
    double sc = 1.0 / sqrt((double)hs);
    double *sv = (double *)malloc(sizeof(double) * (size_t)T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const double *q = qkv + ((size_t)b * T + t) * 3 * C + h * hs;
                double mx = -1e300, sum = 0;
                for (int u = 0; u <= t; u++) {
                    const double *k = qkv + ((size_t)b * T + u) * 3 * C + C + h * hs;
                    double dot = 0;
                    for (int i = 0; i < hs; i++) dot += q[i] * k[i];
                    sv[u] = dot * sc;
                    if (sv[u] > mx) mx = sv[u];
                }
                for (int u = 0; u <= t; u++) { sv[u] = exp(sv[u] - mx); sum += sv[u]; }
                double *o = c->out + ((size_t)b * T + t) * C + h * hs;
                for (int i = 0; i < hs; i++) o[i] = 0;
                for (int u = 0; u <= t; u++) {
                    double pr = sv[u] / sum;
                    if (c->mask) pr *= c->mask[(((size_t)b * NH + h) * T + t) * T + u] / (1.0 - c->p);
                    const double *v = qkv + ((size_t)b * T + u) * 3 * C + 2 * C + h * hs;
                    for (int i = 0; i < hs; i++) o[i] += pr * v[i];
                }
            }
    free(sv);
}
static double att_objective(const double *qkv, void *vctx) {
    const att_ctx *c = (const att_ctx *)vctx;
    att_forward_d(qkv, c);
    double L = 0;
    for (size_t i = 0; i < (size_t)c->B * c->T * c->C; i++) L += c->out[i] * c->R[i];
    return L;
}
// the attention dropout mask of the documented global index (((sample*NH + head)*T + t)*T + t2),
// obtained from the dropout op itself: a ones tensor of shape (B, NH*T, T) has exactly that
// global index ((sample * (NH*T) + h*T + t) * T + t2), so the two must drop the same elements
static void attention_mask(float *mask, const mt_dropout *attn, int B, int T, int NH) {
    for (size_t i = 0; i < (size_t)B * NH * T * T; i++) mask[i] = 1.0f;
    mt_dropout d = *attn;
    d.T = d.T_local = NH * T;
    d.C = T;
    mt_dropout_forward_cpu(mask, &d, B);
    for (size_t i = 0; i < (size_t)B * NH * T * T; i++) mask[i] = mask[i] != 0.0f ? 1.0f : 0.0f;
}

static void attention_fd_case(float p_drop) {
    enum { B = 2, T = 6, NH = 2, hs = 4, C = NH * hs, N3 = B * T * 3 * C, N = B * T * C };
    uint64_t s = 16;
    float *qkv = alloc_f(N3), *R = alloc_f(N), *out = alloc_f(N), *lse = alloc_f(B * NH * T);
    fill_uniform(qkv, N3, &s, 1.0f, 0.0f);
    fill_uniform(R, N, &s, 1.0f, 0.0f);
    mt_dropout drop = {99, 3, 1 * 8 + 1, p_drop, 5, T, C, 0, T};   // sample_offset 5: a later part of the batch
    mt_attention_forward_cpu(out, lse, qkv, B, T, C, NH, &drop, 0, NH);
    float *mask = NULL;
    if (p_drop > 0) {
        mask = alloc_f(B * NH * T * T);
        attention_mask(mask, &drop, B, T, NH);
        int dropped = 0;
        for (int i = 0; i < B * NH * T * T; i++) dropped += mask[i] == 0.0f;
        mt_expect(dropped > 0, "the attention mask drops something at p=%g", p_drop);
    }
    double *qd = alloc_d(N3), *Rd = alloc_d(N), *od = alloc_d(N);
    to_double(qd, qkv, N3);
    to_double(Rd, R, N);
    att_ctx ctx = {Rd, mask, p_drop, B, T, C, NH, od};
    att_forward_d(qd, &ctx);
    float *want = alloc_f(N);
    for (int i = 0; i < N; i++) want[i] = (float)od[i];
    // 1e-5: softmax of <= 6 scores and a weighted sum of <= 6 values in fp32 (expf is ~1 ulp);
    // a few ulps of the O(1) terms, against the 1e-3 floor where the sum cancels
    mt_check_tensor(p_drop > 0 ? "attention forward vs double (dropout)" : "attention forward vs double", out, want, N, 1e-5);
    // the saved logsumexp: exp(s - lse) over a causal row sums to 1 (scores recomputed in double
    // from the same fp32 q, k; lse is logf of an fp32 sum of <= 6 terms: a few ulps of O(1))
    int rows_ok = 1;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const float *q = qkv + ((size_t)b * T + t) * 3 * C + h * hs;
                double sum = 0;
                for (int u = 0; u <= t; u++) {
                    const float *k = qkv + ((size_t)b * T + u) * 3 * C + C + h * hs;
                    double dot = 0;
                    for (int i = 0; i < hs; i++) dot += (double)q[i] * k[i];
                    sum += exp(dot / sqrt((double)hs) - lse[((size_t)b * NH + h) * T + t]);
                }
                if (fabs(sum - 1.0) > 1e-6) rows_ok = 0;
            }
    mt_expect(rows_ok, "exp(s - lse) rows must sum to 1");
    float *dqkv = alloc_f(N3), *num = alloc_f(N3);
    mt_attention_backward_cpu(dqkv, R, qkv, out, lse, B, T, C, NH, &drop, 0, NH);
    fd_gradient(num, qd, N3, att_objective, &ctx);
    // dq, dk, dv are sums of <= 6 (t2) x 4 (hs) products through the softmax backward
    // p (dp - D), D = dout . out, whose difference cancels: a few ulps of the largest term, which is ~3x
    // the typical gradient; measured max ~1e-6. 1e-4 leaves room for the 1e-3 floor elements.
    mt_check_tensor(p_drop > 0 ? "attention dqkv (dropout)" : "attention dqkv", dqkv, num, N3, 1e-4);
    float *once = alloc_f(N3);
    memcpy(once, dqkv, sizeof(float) * N3);
    for (size_t i = 0; i < N3; i++) dqkv[i] = 1e9f;   // garbage that '=' must replace
    mt_attention_backward_cpu(dqkv, R, qkv, out, lse, B, T, C, NH, &drop, 0, NH);
    mt_check_tensor("attention dqkv is written, not added", dqkv, once, N3, 0.0);
    free(qkv); free(R); free(out); free(lse); free(mask); free(qd); free(Rd); free(od); free(want);
    free(dqkv); free(num); free(once);
}
MT_TEST(attention) { attention_fd_case(0.0f); }
MT_TEST(attention_dropout) { attention_fd_case(0.3f); }

// causal: the output at t does not depend on tokens after t, and no gradient flows to them
MT_TEST(attention_causal) {
    enum { B = 2, T = 7, NH = 2, hs = 4, C = NH * hs, N3 = B * T * 3 * C, N = B * T * C, t0 = 3 };
    uint64_t s = 17;
    float *qkv = alloc_f(N3), *qkv2 = alloc_f(N3), *out = alloc_f(N), *out2 = alloc_f(N);
    float *lse = alloc_f(B * NH * T);
    fill_uniform(qkv, N3, &s, 1.0f, 0.0f);
    memcpy(qkv2, qkv, sizeof(float) * N3);
    // change every q, k, v of positions t > t0
    for (int b = 0; b < B; b++)
        for (int t = t0 + 1; t < T; t++)
            for (int i = 0; i < 3 * C; i++) qkv2[((size_t)b * T + t) * 3 * C + i] += 5.0f;
    for (int pass = 0; pass < 2; pass++) {
        mt_dropout drop = {5, 1, 9, pass ? 0.3f : 0.0f, 0, T, C, 0, T};
        mt_attention_forward_cpu(out, lse, qkv, B, T, C, NH, &drop, 0, NH);
        mt_attention_forward_cpu(out2, lse, qkv2, B, T, C, NH, &drop, 0, NH);
        int same = 1, changed = 0;
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++)
                for (int i = 0; i < C; i++) {
                    size_t k = ((size_t)b * T + t) * C + i;
                    if (t <= t0 && out[k] != out2[k]) same = 0;
                    if (t > t0 && out[k] != out2[k]) changed = 1;
                }
        mt_expect(same, "attention (p=%s): output at t <= %d changed when tokens > %d changed", pass ? "0.3" : "0", t0, t0);
        mt_expect(changed, "attention: output at t > %d must change (else the test proves nothing)", t0);
        // backward with dout only at positions <= t0: no gradient reaches q, k, v of positions > t0
        float *dout = alloc_f(N), *dqkv = alloc_f(N3);
        mt_attention_forward_cpu(out, lse, qkv, B, T, C, NH, &drop, 0, NH);
        for (int b = 0; b < B; b++)
            for (int t = 0; t <= t0; t++)
                for (int i = 0; i < C; i++) dout[((size_t)b * T + t) * C + i] = 1.0f + 0.1f * (float)i;
        mt_attention_backward_cpu(dqkv, dout, qkv, out, lse, B, T, C, NH, &drop, 0, NH);
        int future_zero = 1, past_nonzero = 0;
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++)
                for (int i = 0; i < 3 * C; i++) {
                    float g = dqkv[((size_t)b * T + t) * 3 * C + i];
                    if (t > t0 && g != 0.0f) future_zero = 0;
                    if (t <= t0 && g != 0.0f) past_nonzero = 1;
                }
        mt_expect(future_zero, "attention backward: positions > %d must get no gradient", t0);
        mt_expect(past_nonzero, "attention backward: positions <= %d must get a gradient", t0);
        free(dout); free(dqkv);
    }
    free(qkv); free(qkv2); free(out); free(out2); free(lse);
}

// tensor parallel heads: NH = 4 heads at once, or NH_local = 2 heads on each of two "ranks"
// with head_offset 0 and 2, must give the same out, lse, dqkv, with attention dropout on (the
// mask is keyed by the global head), and the batch split by sample_offset likewise
MT_TEST(attention_heads_split) {
    enum { B = 2, T = 5, NH = 4, hs = 3, C = NH * hs, N3 = B * T * 3 * C, N = B * T * C, TPN = 2 };
    enum { NHL = NH / TPN, CL = C / TPN };
    uint64_t s = 18;
    float *qkv = alloc_f(N3), *dout = alloc_f(N), *out = alloc_f(N), *lse = alloc_f(B * NH * T);
    float *dqkv = alloc_f(N3);
    fill_uniform(qkv, N3, &s, 1.0f, 0.0f);
    fill_uniform(dout, N, &s, 1.0f, 0.0f);
    mt_dropout drop = {77, 2, 8 * 3 + 1, 0.3f, 4, T, C, 0, T};
    mt_attention_forward_cpu(out, lse, qkv, B, T, C, NH, &drop, 0, NH);
    mt_attention_backward_cpu(dqkv, dout, qkv, out, lse, B, T, C, NH, &drop, 0, NH);
    for (int r = 0; r < TPN; r++) {
        // rank r's qkv is [Q_r | K_r | V_r]: its heads' columns of each of Q, K, V
        float *qkv_r = alloc_f(B * T * 3 * CL), *dout_r = alloc_f(B * T * CL), *out_r = alloc_f(B * T * CL);
        float *lse_r = alloc_f(B * NHL * T), *dqkv_r = alloc_f(B * T * 3 * CL);
        float *want_out = alloc_f(B * T * CL), *want_lse = alloc_f(B * NHL * T), *want_dqkv = alloc_f(B * T * 3 * CL);
        for (int bt = 0; bt < B * T; bt++) {
            for (int part = 0; part < 3; part++)
                for (int i = 0; i < CL; i++) {
                    qkv_r[(size_t)bt * 3 * CL + part * CL + i] = qkv[(size_t)bt * 3 * C + part * C + r * CL + i];
                    want_dqkv[(size_t)bt * 3 * CL + part * CL + i] = dqkv[(size_t)bt * 3 * C + part * C + r * CL + i];
                }
            for (int i = 0; i < CL; i++) {
                dout_r[(size_t)bt * CL + i] = dout[(size_t)bt * C + r * CL + i];
                want_out[(size_t)bt * CL + i] = out[(size_t)bt * C + r * CL + i];
            }
        }
        for (int b = 0; b < B; b++)
            for (int h = 0; h < NHL; h++)
                memcpy(want_lse + ((size_t)b * NHL + h) * T, lse + ((size_t)b * NH + r * NHL + h) * T, sizeof(float) * T);
        // one sample at a time too: sample_offset moves with b
        for (int b = 0; b < B; b++) {
            mt_dropout db = drop;
            db.sample_offset = drop.sample_offset + b;
            mt_attention_forward_cpu(out_r + (size_t)b * T * CL, lse_r + (size_t)b * NHL * T, qkv_r + (size_t)b * T * 3 * CL,
                                     1, T, CL, NHL, &db, r * NHL, NH);
            mt_attention_backward_cpu(dqkv_r + (size_t)b * T * 3 * CL, dout_r + (size_t)b * T * CL, qkv_r + (size_t)b * T * 3 * CL,
                                      out_r + (size_t)b * T * CL, lse_r + (size_t)b * NHL * T, 1, T, CL, NHL, &db, r * NHL, NH);
        }
        // per head the arithmetic is the same in the same order; only where it sits in memory
        // differs: tolerance 0
        mt_check_tensor("attention out, heads split", out_r, want_out, B * T * CL, 0.0);
        mt_check_tensor("attention lse, heads split", lse_r, want_lse, B * NHL * T, 0.0);
        mt_check_tensor("attention dqkv, heads split", dqkv_r, want_dqkv, B * T * 3 * CL, 0.0);
        free(qkv_r); free(dout_r); free(out_r); free(lse_r); free(dqkv_r); free(want_out); free(want_lse); free(want_dqkv);
    }
    free(qkv); free(dout); free(out); free(lse); free(dqkv);
}

// =============================================================================================
// GELU (tanh approximation)
// =============================================================================================
typedef struct { const double *R; size_t n; } gelu_ctx;
static double gelu_d(double x) { return 0.5 * x * (1.0 + tanh(sqrt(2.0 / 3.14159265358979323846) * (x + 0.044715 * x * x * x))); }
static double gelu_objective(const double *x, void *vctx) {
    const gelu_ctx *c = (const gelu_ctx *)vctx;
    double L = 0;
    for (size_t i = 0; i < c->n; i++) L += gelu_d(x[i]) * c->R[i];
    return L;
}
MT_TEST(gelu) {
    enum { N = 200 };
    uint64_t s = 19;
    float *x = alloc_f(N), *y = alloc_f(N), *R = alloc_f(N), *want = alloc_f(N);
    fill_uniform(x, N, &s, 4.0f, 0.0f);   // [-4, 4): both tails and the bend around 0
    fill_uniform(R, N, &s, 1.0f, 0.0f);
    mt_gelu_forward_cpu(y, x, N);
    for (int i = 0; i < N; i++) want[i] = (float)gelu_d((double)x[i]);
    // for x < -2, 0.5 x (1 + tanh(u)) with tanh(u) ~ -1: 1 + tanhf(u) keeps tanhf's absolute
    // error (~1 ulp of 1, 6e-8), so the output's absolute error is ~0.5 |x| * 6e-8 ~ 1.2e-7 at
    // x = -4. Those outputs are tiny (~1e-4) and measured against the floor 1e-3 * max|y| ~ 4e-3:
    // 1.2e-7 / 4e-3 = 3e-5. Elsewhere a few ulps (~3e-7). Tolerance 1e-4.
    mt_check_tensor("gelu forward vs double", y, want, N, 1e-4);
    double *xd = alloc_d(N), *Rd = alloc_d(N);
    to_double(xd, x, N);
    to_double(Rd, R, N);
    float *dx = alloc_f(N), *num = alloc_f(N);
    mt_gelu_backward_cpu(dx, x, R, N);
    gelu_ctx ctx = {Rd, N};
    fd_gradient(num, xd, N, gelu_objective, &ctx);
    // the fp32 derivative 0.5(1+th) + 0.5 x sech^2 s (1 + 3a x^2) adds two O(1) terms that
    // cancel where GELU' crosses 0 (x ~ -0.75) and for x < -2 (1 + th ~ 0): there the error is a
    // few ulps of O(1) (~3e-7), compared against the floor 1e-3 * max|grad * R| (~1e-3): ~3e-4
    // relative. Elsewhere ~1e-6. Tolerance 1e-3.
    mt_check_tensor("gelu dinp", dx, num, N, 1e-3);
    float *once = alloc_f(N);
    memcpy(once, dx, sizeof(float) * N);
    for (size_t i = 0; i < N; i++) dx[i] = 1e9f;   // garbage that '=' must replace
    mt_gelu_backward_cpu(dx, x, R, N);
    mt_check_tensor("gelu dinp is written, not added", dx, once, N, 0.0);
    free(x); free(y); free(R); free(want); free(xd); free(Rd); free(dx); free(num); free(once);
}

// =============================================================================================
// residual
// =============================================================================================
MT_TEST(residual) {
    enum { N = 100 };
    uint64_t s = 20;
    float a[N], b[N], out[N], want[N];
    fill_uniform(a, N, &s, 1.0f, 0.0f);
    fill_uniform(b, N, &s, 1.0f, 0.0f);
    for (int i = 0; i < N; i++) { want[i] = a[i] + b[i]; out[i] = 99.0f; }
    mt_residual_forward_cpu(out, a, b, N);
    mt_check_tensor("residual out = a + b", out, want, N, 0.0);   // one fp32 add, same as here: exact
    // in place on a (the model writes the residual stream over its input in places)
    mt_residual_forward_cpu(a, a, b, N);
    mt_check_tensor("residual in place", a, want, N, 0.0);
}

// =============================================================================================
// cross-entropy over a vocabulary split into shards, combined as the TP code does
// =============================================================================================
typedef struct { const int *targets; int BT, V, Vp; double dloss; } ce_ctx;
// loss summed over rows (times dloss) of the full logits (BT, Vp); only columns < V count
static double ce_objective(const double *logits, void *vctx) {
    const ce_ctx *c = (const ce_ctx *)vctx;
    double L = 0;
    for (int i = 0; i < c->BT; i++) {
        const double *l = logits + (size_t)i * c->Vp;
        double mx = -1e300, sum = 0;
        for (int v = 0; v < c->V; v++) if (l[v] > mx) mx = l[v];
        for (int v = 0; v < c->V; v++) sum += exp(l[v] - mx);
        L += c->dloss * (log(sum) + mx - l[c->targets[i]]);   // -log softmax(l)[y]
    }
    return L;
}

static void cross_entropy_case(int shards, int V, int Vp) {
    enum { BT = 5 };
    int VL = Vp / shards;
    const float dloss = 0.37f;
    uint64_t s = 21 + (uint64_t)shards * 100 + (uint64_t)V;
    float *logits = alloc_f((size_t)BT * Vp);
    fill_uniform(logits, (size_t)BT * Vp, &s, 3.0f, 0.0f);
    // padded columns hold huge values: if they leaked into the max or the sum, the loss would be off by ~50
    for (int i = 0; i < BT; i++) for (int v = V; v < Vp; v++) logits[(size_t)i * Vp + v] = 50.0f;
    // targets in different shards, including the first and the last real column
    int targets[BT] = {0, V - 1, V / 2, 1, (2 * V) / 3};
    // each shard's slice (BT, VL) of the logits, as a TP rank holds it
    float **shard = (float **)malloc(sizeof(float *) * (size_t)shards);
    for (int r = 0; r < shards; r++) {
        shard[r] = alloc_f((size_t)BT * VL);
        for (int i = 0; i < BT; i++) memcpy(shard[r] + (size_t)i * VL, logits + (size_t)i * Vp + r * VL, sizeof(float) * VL);
    }
    // step 1: local max, then "all-reduce MAX"
    float m[BT], mloc[BT], S[BT], Sloc[BT], ly[BT], lyloc[BT], losses[BT];
    for (int i = 0; i < BT; i++) { m[i] = -INFINITY; S[i] = 0; ly[i] = 0; }
    for (int r = 0; r < shards; r++) {
        mt_cross_entropy_local_max_cpu(mloc, shard[r], BT, VL, r * VL, V);
        for (int i = 0; i < BT; i++) if (mloc[i] > m[i]) m[i] = mloc[i];
    }
    // step 2: local sums with the global max, then "all-reduce SUM" in rank order
    for (int r = 0; r < shards; r++) {
        mt_cross_entropy_local_sums_cpu(Sloc, lyloc, shard[r], m, targets, BT, VL, r * VL, V);
        for (int i = 0; i < BT; i++) { S[i] += Sloc[i]; ly[i] += lyloc[i]; }
    }
    // step 3: every rank finishes with the same combined values; the gradient replaces its logits
    for (int r = 0; r < shards; r++) {
        float lr_[BT];
        mt_cross_entropy_finish_cpu(lr_, shard[r], m, S, ly, targets, BT, VL, r * VL, V, dloss);
        if (r == 0) memcpy(losses, lr_, sizeof losses);
        int same = 1;
        for (int i = 0; i < BT; i++) if (lr_[i] != losses[i]) same = 0;
        mt_expect(same, "every shard must compute the same loss");
    }
    // the loss against a direct log-softmax in double
    double *ld = alloc_d((size_t)BT * Vp);
    to_double(ld, logits, (size_t)BT * Vp);
    float want_loss[BT];
    for (int i = 0; i < BT; i++) {
        ce_ctx one = {targets + i, 1, V, Vp, 1.0};
        want_loss[i] = (float)ce_objective(ld + (size_t)i * Vp, &one);
    }
    char label[96];
    snprintf(label, sizeof label, "cross-entropy loss, %d shards, V=%d Vp=%d", shards, V, Vp);
    // 1e-5: logf of a sum of <= 24 fp32 exps (each ~1 ulp) plus max - l_y; the losses are ~3-6,
    // the absolute error ~ 24 * 6e-8 + 1 ulp of 6 ~ 2e-6, relative ~5e-7
    mt_check_tensor(label, losses, want_loss, BT, 1e-5);
    // the gradient, gathered back to (BT, Vp), against finite differences of the double loss
    float *grad = alloc_f((size_t)BT * Vp), *num = alloc_f((size_t)BT * Vp);
    for (int r = 0; r < shards; r++)
        for (int i = 0; i < BT; i++) memcpy(grad + (size_t)i * Vp + r * VL, shard[r] + (size_t)i * VL, sizeof(float) * VL);
    ce_ctx ctx = {targets, BT, V, Vp, (double)dloss};
    fd_gradient(num, ld, (size_t)BT * Vp, ce_objective, &ctx);
    snprintf(label, sizeof label, "cross-entropy dlogits, %d shards, V=%d Vp=%d", shards, V, Vp);
    // 1e-4: dlogits = (exp(l - m) / S - [v==y]) dloss in fp32, a few ulps relative of each
    // probability; the smallest probabilities (~e^-6 of the largest) sit under the 1e-3 floor
    mt_check_tensor(label, grad, num, (size_t)BT * Vp, 1e-4);
    int pad_zero = 1;
    for (int i = 0; i < BT; i++) for (int v = V; v < Vp; v++) if (grad[(size_t)i * Vp + v] != 0.0f) pad_zero = 0;
    mt_expect(pad_zero, "padded columns (>= V) must get exactly 0 gradient");
    // each row's gradient sums to 0 (softmax - onehot): a check independent of the FD
    for (int i = 0; i < BT; i++) {
        double rs = 0;
        for (int v = 0; v < Vp; v++) rs += grad[(size_t)i * Vp + v];
        mt_expect(fabs(rs) < 1e-6, "row %d of dlogits sums to %g, want 0", i, rs);   // ~24 ulps of 0.37
    }
    for (int r = 0; r < shards; r++) free(shard[r]);
    free(shard); free(logits); free(ld); free(grad); free(num);
}
MT_TEST(cross_entropy_2_shards) { cross_entropy_case(2, 21, 24); }            // shard 1: 9 real + 3 padding
MT_TEST(cross_entropy_3_shards) { cross_entropy_case(3, 20, 24); }            // shard 2: 4 real + 4 padding
MT_TEST(cross_entropy_3_shards_one_all_padding) { cross_entropy_case(3, 15, 24); }   // shard 2 is all padding
MT_TEST(cross_entropy_1_shard) { cross_entropy_case(1, 22, 24); }             // no TP, 2 padding columns

// the loss alone (dlogits NULL) leaves the logits as they are
MT_TEST(cross_entropy_no_grad) {
    enum { BT = 2, V = 5 };
    float logits[BT * V] = {1, 2, 3, 4, 5, -1, 0, 1, 0, -1};
    float keep[BT * V];
    memcpy(keep, logits, sizeof keep);
    int targets[BT] = {4, 2};
    float m[BT], S[BT], ly[BT], loss[BT];
    mt_cross_entropy_local_max_cpu(m, logits, BT, V, 0, V);
    mt_cross_entropy_local_sums_cpu(S, ly, logits, m, targets, BT, V, 0, V);
    mt_cross_entropy_finish_cpu(loss, NULL, m, S, ly, targets, BT, V, 0, V, 1.0f);
    // by hand: row 0, target 4 (logit 5): loss = log(sum e^(l-5)) = log(1 + e^-1 + e^-2 + e^-3 + e^-4)
    //                                           = log(1.57131743) = 0.45191440
    //          row 1, target 2 (logit 1): loss = log(e^-2 + e^-1 + 1 + e^-1 + e^-2)
    //                                           = log(2.00642945) = 0.69635675
    float want[BT] = {0.45191440f, 0.69635675f};
    mt_check_tensor("cross-entropy loss by hand", loss, want, BT, 1e-6);   // a few fp32 ulps of ~0.5
    mt_check_tensor("logits untouched without dlogits", logits, keep, BT * V, 0.0);   // nothing written: exact
}

// =============================================================================================
// AdamW
// =============================================================================================
MT_TEST(adamw) {
    // step 1, by hand: lr 0.1, b1 0.9, b2 0.999, eps 1e-8, wd 0.1
    //   p = 1.0 * (1 - 0.1 * 0.1) = 0.99            (decoupled decay, on the weight, not the gradient)
    //   m = 0.1 * 0.5 = 0.05,  v = (1 - 0.999) * 0.25 = 0.00025
    //   mhat = 0.05 / (1 - 0.9) = 0.5,  vhat = 0.00025 / (1 - 0.999) = 0.25
    //   (in fp32, 1 - 0.999f = 9.9998713e-4, since 0.999f = 0.99900001287: v is stored as
    //   0.25 * 9.9998713e-4 = 2.4999678e-4, and 4 * 9.9998713e-4 = 3.9999485e-3 for g = -2;
    //   the bias correction divides by the same number, so mhat and vhat are as above)
    //   p -= 0.1 * 0.5 / (sqrt(0.25) + 1e-8) = 0.1 * (1 - 2e-8)  ->  p = 0.89000000
    // second element: g = -2, p = -3:  p = -3 * 0.99 = -2.97;  m = -0.2, v = 0.004;
    //   mhat = -2, vhat = 4;  p -= 0.1 * (-2) / (2 + 1e-8)  ->  p = -2.87
    // third element: g = 0, p = 2, wd decays it only: p = 2 * 0.99 = 1.98, m = v = 0
    float p[3] = {1.0f, -3.0f, 2.0f}, m[3] = {0, 0, 0}, v[3] = {0, 0, 0}, g[3] = {0.5f, -2.0f, 0.0f};
    mt_adamw_cpu(p, m, v, g, 1.0f, 3, 0.1f, 0.9f, 0.999f, 1e-8f, 0.1f, 1);
    float want_p[3] = {0.89f, -2.87f, 1.98f}, want_m[3] = {0.05f, -0.2f, 0.0f}, want_v[3] = {2.4999678e-4f, 3.9999485e-3f, 0.0f};
    // 1e-6: a handful of fp32 operations on O(1) numbers; the largest error is m, where
    // 1 - 0.9f = 0.09999996 in fp32 puts m 3.6e-7 relative below 0.05 (a property of fp32 betas)
    mt_check_tensor("adamw step 1 params", p, want_p, 3, 1e-6);
    mt_check_tensor("adamw step 1 m", m, want_m, 3, 1e-6);
    mt_check_tensor("adamw step 1 v", v, want_v, 3, 1e-6);
    // a step 3 with non-zero moments, against the formula in double (PyTorch's AdamW order):
    //   p *= 1 - lr wd; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; p -= lr (m/(1-b1^t)) / (sqrt(v/(1-b2^t)) + eps)
    enum { N = 64 };
    uint64_t s = 22;
    float P[N], M[N], Vv[N], G[N], wantP[N], wantM[N], wantV[N];
    fill_uniform(P, N, &s, 1.0f, 0.0f);
    fill_uniform(M, N, &s, 0.1f, 0.0f);
    fill_uniform(Vv, N, &s, 0.005f, 0.006f);   // v > 0
    fill_uniform(G, N, &s, 1.0f, 0.0f);
    double lr = 3e-3, b1 = 0.8, b2 = 0.95, eps = 1e-6, wd = 0.05;
    int t = 3;
    for (int i = 0; i < N; i++) {
        // the fp32 hyper-parameters as the call sees them
        double fb1 = (float)b1, fb2 = (float)b2, flr = (float)lr, feps = (float)eps, fwd = (float)wd;
        double pi = (double)P[i] * (1.0 - flr * fwd);
        double mi = fb1 * M[i] + (1.0 - fb1) * G[i];
        double vi = fb2 * Vv[i] + (1.0 - fb2) * (double)G[i] * G[i];
        wantM[i] = (float)mi;
        wantV[i] = (float)vi;
        wantP[i] = (float)(pi - flr * (mi / (1.0 - pow(fb1, t))) / (sqrt(vi / (1.0 - pow(fb2, t))) + feps));
    }
    mt_adamw_cpu(P, M, Vv, G, 1.0f, N, (float)lr, (float)b1, (float)b2, (float)eps, (float)wd, t);
    // 1e-5: p (1 - lr wd) and the update lr mhat / (sqrt(vhat) + eps) (~3e-3) are each a few
    // fp32 operations (a few ulps, ~3e-7 relative), and the update is small next to p (|p| ~ 0.5),
    // so p - update keeps that relative accuracy: a few e-7
    mt_check_tensor("adamw step 3 params", P, wantP, N, 1e-5);
    // m = b1 m + (1-b1) g: two products of up to 0.2 and a sum that can cancel; a few ulps of 0.2
    // (~5e-8) against the floor 1e-3 * max|m| (~2.5e-4) is 2e-4. Tolerance 1e-3.
    mt_check_tensor("adamw step 3 m", M, wantM, N, 1e-3);
    mt_check_tensor("adamw step 3 v", Vv, wantV, N, 1e-5);   // a sum of two positive terms, no cancellation: a few ulps
    // no weight decay (biases, layernorms): wd = 0 leaves only the Adam update
    float q[1] = {2.0f}, mq[1] = {0}, vq[1] = {0}, gq[1] = {0.0f};
    mt_adamw_cpu(q, mq, vq, gq, 1.0f, 1, 0.1f, 0.9f, 0.999f, 1e-8f, 0.0f, 1);
    mt_expect(q[0] == 2.0f, "adamw with wd = 0 and g = 0 must leave p unchanged, got %.9g", q[0]);
    // the clip's factor (grad_scale) is the in-place product Megatron's clip_grad_norm_fp32 makes
    // before the step: the same bits as scaling the gradients first and stepping with 1
    float P2[N], M2[N], V2[N], G2[N], P3[N], M3[N], V3[N];
    fill_uniform(P2, N, &s, 1.0f, 0.0f);
    fill_uniform(M2, N, &s, 0.1f, 0.0f);
    fill_uniform(V2, N, &s, 0.005f, 0.006f);
    fill_uniform(G2, N, &s, 1.0f, 0.0f);
    memcpy(P3, P2, sizeof P2); memcpy(M3, M2, sizeof M2); memcpy(V3, V2, sizeof V2);
    float clip = 0.3712f;
    mt_adamw_cpu(P2, M2, V2, G2, clip, N, 3e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 5);
    for (int i = 0; i < N; i++) G2[i] *= clip;
    mt_adamw_cpu(P3, M3, V3, G2, 1.0f, N, 3e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 5);
    mt_expect(memcmp(P2, P3, sizeof P2) == 0 && memcmp(M2, M3, sizeof M2) == 0 && memcmp(V2, V3, sizeof V2) == 0,
              "adamw's grad_scale must equal scaling the gradients first, bit for bit");
}

int main(void) {
    mt_run_test(embedding_vocab_parallel);
    mt_run_test(position_embedding);
    mt_run_test(layernorm);
    mt_run_test(matmul_with_bias);
    mt_run_test(matmul_no_bias);
    mt_run_test(dropout);
    mt_run_test(attention);
    mt_run_test(attention_dropout);
    mt_run_test(attention_causal);
    mt_run_test(attention_heads_split);
    mt_run_test(gelu);
    mt_run_test(residual);
    mt_run_test(cross_entropy_1_shard);
    mt_run_test(cross_entropy_2_shards);
    mt_run_test(cross_entropy_3_shards);
    mt_run_test(cross_entropy_3_shards_one_all_padding);
    mt_run_test(cross_entropy_no_grad);
    mt_run_test(adamw);
    return mt_test_summary();
}

/* tests/harness.h - the one small test harness (STYLE 17).
 *
 *   MT_TEST(name) { ... }      defines a test function  static void test_name(void)
 *   mt_expect(cond, fmt, ...)  records a failure (with file:line) if cond is false
 *   mt_check_tensor(label, got, want, n, rtol)
 *                              compares two float arrays: prints the first 5 pairs as
 *                              OK/NOT OK and the max relative difference; NaN never passes
 *   mt_run_test(test_name)     runs one test, prints "PASS name" or "FAIL name"
 *   mt_test_summary()          prints "N passed, N failed" and returns the exit code
 *
 * A test counts as failed if any expectation inside it failed. Every tolerance passed
 * to mt_check_tensor must have a comment at the call site saying where it comes from.
 */
#ifndef MT_TEST_HARNESS_H
#define MT_TEST_HARNESS_H
#include <math.h>
#include <stdio.h>
#include <stdarg.h>
#include <string.h>
#include <time.h>

static int mt__tests_passed = 0, mt__tests_failed = 0;
static int mt__current_failures = 0;

static void mt__expect(int cond, const char *file, int line, const char *fmt, ...) {
    if (cond) return;
    mt__current_failures++;
    fprintf(stderr, "  %s:%d: expectation failed: ", file, line);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
}
#define mt_expect(cond, ...) mt__expect((cond) ? 1 : 0, __FILE__, __LINE__, __VA_ARGS__)

/* relative difference |a-b| / max(|b|, floor): floor keeps tiny reference values from
 * blowing up the ratio; it is 1e-3 of the largest |want| in the tensor (tensor-relative). */
static inline int mt_check_tensor(const char *label, const float *got, const float *want, size_t n, double rtol) {
    double maxabs = 0.0;
    for (size_t i = 0; i < n; i++) if (fabs((double)want[i]) > maxabs) maxabs = fabs((double)want[i]);
    double floor_ = maxabs * 1e-3;
    if (floor_ < 1e-30) floor_ = 1e-30;
    double maxdiff = 0.0;
    size_t worst = 0;
    int ok = 1;
    for (size_t i = 0; i < n; i++) {
        double a = got[i], b = want[i];
        double denom = fabs(b) > floor_ ? fabs(b) : floor_;
        double d = fabs(a - b) / denom;
        if (!(d <= rtol)) ok = 0;            /* written so that NaN fails */
        if (!(d <= maxdiff)) { maxdiff = d; worst = i; }
    }
    if (!ok) {
        fprintf(stderr, "  %s: NOT OK (max rel diff %.3e at %zu: got %.9g want %.9g, tol %.1e)\n",
                label, maxdiff, worst, (double)got[worst], (double)want[worst], rtol);
        for (size_t i = 0; i < n && i < 5; i++)
            fprintf(stderr, "    [%zu] %.9g %.9g\n", i, (double)got[i], (double)want[i]);
    }
    mt__expect(ok, __FILE__, __LINE__, "tensor %s differs", label);
    return ok;
}

/* norm-wise relative difference: max|got - want| / max|want| <= rtol. The right measure when
 * rounding errors scale with the tensor's magnitude rather than each element's: the error of
 * a sum is a few ulps of its *terms*, so an element that cancels to nearly zero carries an
 * absolute error set by the tensor's scale (parameters after AdamW, gradients). NaN fails. */
static inline int mt_check_tensor_normwise(const char *label, const float *got, const float *want, size_t n, double rtol) {
    double maxabs = 0.0, maxdiff = 0.0;
    size_t worst = 0;
    int finite = 1;
    for (size_t i = 0; i < n; i++) {
        double b = want[i], d = fabs((double)got[i] - b);
        if (fabs(b) > maxabs) maxabs = fabs(b);
        if (!(d <= maxdiff)) { maxdiff = d; worst = i; }
        if (!(d == d) || !isfinite(got[i])) finite = 0;
    }
    double rel = maxabs > 0 ? maxdiff / maxabs : maxdiff;
    int ok = finite && rel <= rtol;
    if (!ok)
        fprintf(stderr, "  %s: NOT OK (norm-wise rel diff %.3e, worst at %zu: got %.9g want %.9g, max|want| %.3g, tol %.1e)\n",
                label, rel, worst, (double)got[worst], (double)want[worst], maxabs, rtol);
    mt__expect(ok, __FILE__, __LINE__, "tensor %s differs", label);
    return ok;
}

#define MT_TEST(name) static void test_##name(void)
static void mt__run_test(const char *name, void (*fn)(void)) {
    mt__current_failures = 0;
    clock_t t0 = clock();
    fn();
    double s = (double)(clock() - t0) / CLOCKS_PER_SEC;
    if (mt__current_failures == 0) { mt__tests_passed++; printf("PASS %s (%.2fs)\n", name, s); }
    else { mt__tests_failed++; printf("FAIL %s\n", name); }
    fflush(stdout);
}
#define mt_run_test(name) mt__run_test(#name, test_##name)

static int mt_test_summary(void) {
    printf("%d passed, %d failed\n", mt__tests_passed, mt__tests_failed);
    return mt__tests_failed == 0 ? 0 : 1;
}
#endif

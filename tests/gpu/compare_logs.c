/* tests/gpu/compare_logs.c - do two training logs have the same losses?
 *
 *   compare_logs REFERENCE.log OTHER.log RTOL LABEL
 *
 * Reads the "lm loss: X" of every Megatron iteration line in both logs (run them with
 * --log-interval 1) and checks |other - ref| <= RTOL * |ref| for each. Prints one line per
 * iteration, then "1 passed, 0 failed" or "0 passed, 1 failed" (one check per log pair).
 * RTOL is a claim about the arithmetic: fp32 GPU vs fp32 CPU 1e-4 (reordered sums over 20
 * AdamW steps), bf16 GPU vs fp32 CPU 1e-2 (bf16 keeps 8 bits of mantissa).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

static int read_losses(const char *path, double *out, int cap) {
    FILE *f = fopen(path, "r");
    if (!f) { fprintf(stderr, "cannot open %s\n", path); return -1; }
    char line[8192];
    int n = 0;
    while (fgets(line, sizeof line, f) && n < cap) {
        if (strncmp(line, " iteration ", 11) != 0) continue;
        const char *p = strstr(line, "lm loss: ");
        if (p) out[n++] = strtod(p + 9, NULL);
    }
    fclose(f);
    return n;
}

int main(int argc, char **argv) {
    if (argc != 5) { fprintf(stderr, "usage: compare_logs REF.log OTHER.log RTOL LABEL\n"); return 2; }
    double ref[10000], other[10000], rtol = atof(argv[3]);
    int n = read_losses(argv[1], ref, 10000), m = read_losses(argv[2], other, 10000);
    int ok = n > 0 && n == m;
    if (n != m) printf("%s: %d losses in %s, %d in %s\n", argv[4], n, argv[1], m, argv[2]);
    double worst = 0;
    for (int i = 0; i < n && i < m; i++) {
        double rel = fabs(other[i] - ref[i]) / fabs(ref[i]);
        if (!(rel <= rtol)) ok = 0;   // NaN fails
        if (!(rel <= worst)) worst = rel;
        printf("  %s iteration %3d: reference %.6f  other %.6f  rel %.2e%s\n", argv[4], i + 1, ref[i], other[i], rel,
               rel <= rtol ? "" : "  NOT OK");
    }
    printf("%s %s: %d iterations, max rel diff %.2e (tolerance %.0e)\n", ok ? "OK" : "NOT OK", argv[4], n, worst, rtol);
    printf("%d passed, %d failed\n", ok, !ok);
    return ok ? 0 : 1;
}

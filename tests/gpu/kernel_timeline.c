// Where a decode step's time goes, kernel by kernel, as the GPU ran it: a CUPTI injection library
// (a measurement tool, not part of the product, which never links CUPTI).
//
//   make tests/gpu/libkernel_timeline.so
//   export CUDA_INJECTION64_PATH=$PWD/tests/gpu/libkernel_timeline.so MT_TIMELINE=build/timeline.csv
//   ./train_gpt_cuda --bf16 --load CKPT --prompt "..." --greedy --out-seq-length 256
// (tests/gpu/decode_timeline.sh does this for GPT-2 small with random weights.)
//
// The CUDA driver loads the library at its start and calls InitializeInjection, which asks CUPTI
// for a record of every kernel (CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: its start, when its first
// block began, and its end, when its last block ended, on the GPU's clock in ns; kernels in a CUDA
// graph included). At exit every record goes to MT_TIMELINE as CSV (start_ns,end_ns,name), and a
// summary of the decode steps to MT_TIMELINE.txt:
//   - a step is the kernels from one mt_embedding_forward_kernel to the next; the steps of the
//     most common shape (the same kernels in the same order) are the decode steps;
//   - a kernel's link = its end - the end of the kernel before it (for the first of a step: the end
//     of the step before, so the gap between two graph launches counts there). The links of a step
//     add up to its period, end to end. With programmatic launch a kernel starts long before the one
//     ahead ends, so its start-to-end duration says little; the link is what it adds to the step.
//   - per position in the step: the kernel's name, the median link and duration over the steps;
//     then per kernel name: how many a step and the sum of their median links.
// CUPTI's own records cost a little time per kernel: compare shares within one run, not the total
// against a run without the library.
#include <cupti.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    uint64_t start, end;
    char name[64];   // the kernel's base name (the mangled name's first identifier)
} kt_record;

static kt_record *kt_records;
static size_t kt_count, kt_cap;

// "_Z27mt_matmul_kernel6_gemv_mmaILi0ELi12EEvPf..." -> "mt_matmul_kernel6_gemv_mma"; a C name as is
static void kt_base_name(char *dst, size_t cap, const char *mangled) {
    const char *p = mangled ? mangled : "?";
    size_t n = strlen(p);
    if (p[0] == '_' && p[1] == 'Z') {
        const char *q = p + 2;
        if (*q == 'N') q++;   // a nested name: its first part
        if (*q == 'L') q++;   // internal linkage
        size_t len = 0;
        while (*q >= '0' && *q <= '9') len = len * 10 + (size_t)(*q++ - '0');
        if (len > 0 && len <= strlen(q)) { p = q; n = len; }
    }
    if (n >= cap) n = cap - 1;
    memcpy(dst, p, n);
    dst[n] = '\0';
}

static void CUPTIAPI kt_buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
    *size = 16u << 20;
    *buffer = (uint8_t *)aligned_alloc(8, *size);
    *max_records = 0;
}

static void CUPTIAPI kt_buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size, size_t valid) {
    (void)ctx; (void)stream; (void)size;
    CUpti_Activity *record = NULL;
    while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
        if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && record->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
        const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)record;
        if (kt_count == kt_cap) {
            kt_cap = kt_cap ? 2 * kt_cap : 1 << 16;
            kt_records = (kt_record *)realloc(kt_records, kt_cap * sizeof *kt_records);
            if (!kt_records) { fprintf(stderr, "kernel_timeline: out of memory\n"); exit(1); }
        }
        kt_record *r = &kt_records[kt_count++];
        r->start = k->start;
        r->end = k->end;
        kt_base_name(r->name, sizeof r->name, k->name);
    }
    free(buffer);
}

static int kt_by_start(const void *a, const void *b) {
    const kt_record *x = (const kt_record *)a, *y = (const kt_record *)b;
    return x->start < y->start ? -1 : x->start > y->start ? 1 : 0;
}
static int kt_by_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y ? 1 : 0;
}
static double kt_median(double *v, size_t n) {
    qsort(v, n, sizeof *v, kt_by_double);
    return n ? v[n / 2] : 0.0;
}

// the decode steps' table (see the top of the file)
static void kt_summary(FILE *f) {
    const char *first = "mt_embedding_forward_kernel";
    size_t *begin = (size_t *)malloc((kt_count + 1) * sizeof *begin), steps = 0;
    for (size_t i = 0; i < kt_count; i++)
        if (strcmp(kt_records[i].name, first) == 0) begin[steps++] = i;
    begin[steps] = kt_count;
    if (steps < 3) {
        fprintf(f, "kernel_timeline: %zu kernels, %zu steps that start with %s: no decode steps to summarise\n",
                kt_count, steps, first);
        free(begin);
        return;
    }
    // the most common step shape: its length and kernel names, compared step to step
    size_t best = 0, best_votes = 0;
    for (size_t s = 0; s < steps; s++) {
        size_t len = begin[s + 1] - begin[s], votes = 0;
        for (size_t t = 0; t < steps; t++) {
            if (begin[t + 1] - begin[t] != len) continue;
            size_t k = 0;
            while (k < len && strcmp(kt_records[begin[s] + k].name, kt_records[begin[t] + k].name) == 0) k++;
            votes += k == len;
        }
        if (votes > best_votes) { best_votes = votes; best = s; }
        if (best_votes > steps / 2) break;
    }
    size_t len = begin[best + 1] - begin[best];
    double *link = (double *)malloc(steps * sizeof(double)), *dur = (double *)malloc(steps * sizeof(double));
    double *period = (double *)malloc(steps * sizeof(double)), *span = (double *)malloc(steps * sizeof(double));
    int *same = (int *)calloc(steps, sizeof(int));
    size_t n_same = 0, n_period = 0;
    for (size_t t = 0; t < steps; t++) {
        if (begin[t + 1] - begin[t] != len) continue;
        size_t k = 0;
        while (k < len && strcmp(kt_records[begin[best] + k].name, kt_records[begin[t] + k].name) == 0) k++;
        if (k != len) continue;
        same[t] = 1;
        n_same++;
        span[t] = 1e-3 * (double)(kt_records[begin[t] + len - 1].end - kt_records[begin[t]].start);
    }
    for (size_t t = 1; t < steps; t++)   // a step's period: from the end of a decode step just before it
        if (same[t] && same[t - 1] && begin[t] == begin[t - 1] + len)
            period[n_period++] = 1e-3 * (double)(kt_records[begin[t] + len - 1].end - kt_records[begin[t] - 1].end);
    size_t n_span = 0;
    for (size_t t = 0; t < steps; t++)
        if (same[t]) span[n_span++] = span[t];
    fprintf(f, "decode steps: %zu of %zu steps have the common shape, %zu kernels each\n", n_same, steps, len);
    fprintf(f, "  period (a step's last end - the step before's last end), median: %.2f us over %zu steps\n",
            kt_median(period, n_period), n_period);
    fprintf(f, "  first start -> last end within a step, median: %.2f us\n\n", kt_median(span, n_span));
    fprintf(f, "| # | kernel | link us (median) | start -> end us (median) |\n|---|---|---|---|\n");
    double *name_link = (double *)calloc(len, sizeof(double));
    for (size_t k = 0; k < len; k++) {
        size_t n = 0;
        for (size_t t = 1; t < steps; t++) {
            if (!same[t] || !same[t - 1] || begin[t] != begin[t - 1] + len) continue;
            const kt_record *r = &kt_records[begin[t] + k], *ahead = &kt_records[begin[t] + k - 1];
            link[n] = 1e-3 * ((double)r->end - (double)ahead->end);
            dur[n] = 1e-3 * (double)(r->end - r->start);
            n++;
        }
        double l = kt_median(link, n), d = kt_median(dur, n);
        name_link[k] = l;
        fprintf(f, "| %zu | %s | %.2f | %.2f |\n", k, kt_records[begin[best] + k].name, l, d);
    }
    fprintf(f, "\n| kernel | a step | sum of median links us |\n|---|---|---|\n");
    for (size_t k = 0; k < len; k++) {
        const char *name = kt_records[begin[best] + k].name;
        size_t j = 0;
        while (j < k && strcmp(kt_records[begin[best] + j].name, name) != 0) j++;
        if (j < k) continue;   // counted at its first position
        size_t count = 0;
        double sum = 0.0;
        for (size_t m = k; m < len; m++)
            if (strcmp(kt_records[begin[best] + m].name, name) == 0) { count++; sum += name_link[m]; }
        fprintf(f, "| %s | %zu | %.1f |\n", name, count, sum);
    }
    free(begin); free(link); free(dur); free(period); free(span); free(same); free(name_link);
}

static void kt_at_exit(void) {
    cuptiActivityFlushAll(1);
    const char *path = getenv("MT_TIMELINE");
    if (!path || !*path) path = "kernel_timeline.csv";
    qsort(kt_records, kt_count, sizeof *kt_records, kt_by_start);
    FILE *f = fopen(path, "w");
    if (!f) { fprintf(stderr, "kernel_timeline: cannot write %s\n", path); return; }
    fprintf(f, "start_ns,end_ns,name\n");
    for (size_t i = 0; i < kt_count; i++)
        fprintf(f, "%llu,%llu,%s\n", (unsigned long long)kt_records[i].start, (unsigned long long)kt_records[i].end,
                kt_records[i].name);
    fclose(f);
    char summary[4096];
    snprintf(summary, sizeof summary, "%s.txt", path);
    FILE *g = fopen(summary, "w");
    if (!g) { fprintf(stderr, "kernel_timeline: cannot write %s\n", summary); return; }
    kt_summary(g);
    fclose(g);
    fprintf(stderr, "kernel_timeline: %zu kernels -> %s, decode steps -> %s\n", kt_count, path, summary);
}

// called by the CUDA driver at its start when CUDA_INJECTION64_PATH names this library
int InitializeInjection(void) {
    if (cuptiActivityRegisterCallbacks(kt_buffer_requested, kt_buffer_completed) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
        fprintf(stderr, "kernel_timeline: CUPTI would not record kernels\n");
        return 0;
    }
    atexit(kt_at_exit);
    return 1;
}

#ifdef KT_SELFTEST
// cc -DKT_SELFTEST ... -o kt_selftest: the summary of made-up records (a prefill, then decode steps of
// three kernels whose links are 1, 2 and 3 us, 2 us between steps), printed to stdout
int main(void) {
    uint64_t t = 1000000;
    const char *prefill[3] = {"_Z27mt_embedding_forward_kernelPfPKi", "_Z12gemm_kernelv", "gemm_tail"};
    const char *step[3] = {"_Z27mt_embedding_forward_kernelPfPKi", "_Z26mt_matmul_kernel6_gemv_mmaILi0ELi4EEvPf",
                           "_Z21mt_argmax_rows_kernelPiPKfii"};
    for (int k = 0; k < 3; k++) {
        if (kt_count == kt_cap) { kt_cap = 1 << 10; kt_records = (kt_record *)realloc(kt_records, kt_cap * sizeof *kt_records); }
        kt_record *r = &kt_records[kt_count++];
        r->start = t; r->end = t + 50000; t += 50000;
        kt_base_name(r->name, sizeof r->name, prefill[k]);
    }
    for (int s = 0; s < 10; s++) {
        t += 2000;   // between two graph launches
        for (int k = 0; k < 3; k++) {
            kt_record *r = &kt_records[kt_count++];
            r->start = t - 500; r->end = t + (uint64_t)(k == 0 ? 1000 : 1000 * (k + 1)); t = r->end;
            kt_base_name(r->name, sizeof r->name, step[k]);
        }
    }
    kt_summary(stdout);
    return 0;
}
#endif

/* megatron.h - Megatron-LM's parallel GPT training as one annotated C header. (SKELETON; doc block to come) */
/* feature macros must come before any system header: clock_gettime, fsync, pthread_setname_np, mmap */
#if defined(MEGATRON_IMPLEMENTATION) && !defined(_GNU_SOURCE)
#define _GNU_SOURCE
#endif
#ifndef MEGATRON_H
#define MEGATRON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
#define MT_THREAD_LOCAL thread_local
#else
#define MT_THREAD_LOCAL _Thread_local
#endif

/* 1. UTILITIES & ERRORS ---------------------------------------------------------------- */
/* mt_fatal: the single exit for every error. Prints "error: <cause>" and, when the message
 * contains a "\nhint: " part, the fix on its own line. Inside a rank thread of a multi-rank
 * run it aborts the whole world (every rank stops with this message) instead of exiting. */
void mt_fatal(const char *fmt, ...);
void *mt_malloc(size_t bytes, const char *what);     /* never returns NULL: fatal with "what" */
void *mt_calloc(size_t count, size_t size, const char *what);
void *mt_realloc(void *p, size_t bytes, const char *what);
char *mt_strdup(const char *s);
double mt_time_seconds(void);                        /* monotonic clock */
/* atomic file writes: write to PATH.tmp.PID, fsync, rename onto PATH */
FILE *mt_atomic_open(const char *path, char *tmp_path_out, size_t tmp_cap);
void mt_atomic_commit(FILE *f, const char *tmp_path, const char *path);
void mt_atomic_abort(FILE *f, const char *tmp_path);

/* 2. RANKS, GROUPS, COMMUNICATORS (parts/comm.h while it is being written) */
#include "parts/comm_decl.h"
#include "parts/core_decl.h"

/* 9. DATA & TOKENIZER */
#include "parts/tokenizer_decl.h"

#endif /* MEGATRON_H */

#ifdef MEGATRON_IMPLEMENTATION
#ifndef MEGATRON_IMPLEMENTATION_DONE
#define MEGATRON_IMPLEMENTATION_DONE
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <fcntl.h>
#include <pthread.h>

// =============================================================================================
// 1. UTILITIES & ERRORS
// =============================================================================================
void mt__abort_world_from_rank(const char *msg);   /* §2: returns only if not in a rank thread */

void mt_fatal(const char *fmt, ...) {
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    mt__abort_world_from_rank(msg);   /* in a rank thread of a multi-rank world: does not return */
    fflush(stdout);
    fprintf(stderr, "error: %s\n", msg);
    exit(1);
}

void *mt_malloc(size_t bytes, const char *what) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) mt_fatal("out of memory allocating %zu bytes for %s\nhint: use a smaller model, batch or sequence length", bytes, what);
    return p;
}
void *mt_calloc(size_t count, size_t size, const char *what) {
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p) mt_fatal("out of memory allocating %zu bytes for %s\nhint: use a smaller model, batch or sequence length", count * size, what);
    return p;
}
void *mt_realloc(void *p, size_t bytes, const char *what) {
    void *q = realloc(p, bytes ? bytes : 1);
    if (!q) mt_fatal("out of memory allocating %zu bytes for %s\nhint: use a smaller model, batch or sequence length", bytes, what);
    return q;
}
char *mt_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = (char *)mt_malloc(n, "string");
    memcpy(d, s, n);
    return d;
}
double mt_time_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
FILE *mt_atomic_open(const char *path, char *tmp, size_t cap) {
    snprintf(tmp, cap, "%s.tmp.%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) mt_fatal("cannot create %s: %s\nhint: check that the directory exists and is writable", tmp, strerror(errno));
    return f;
}
void mt_atomic_commit(FILE *f, const char *tmp, const char *path) {
    int bad = fflush(f) != 0 || ferror(f);
    if (!bad && fsync(fileno(f)) != 0) bad = 1;
    if (fclose(f) != 0) bad = 1;
    if (bad) { remove(tmp); mt_fatal("writing %s failed: %s\nhint: check free disk space", path, strerror(errno)); }
    if (rename(tmp, path) != 0) { remove(tmp); mt_fatal("cannot rename %s to %s: %s", tmp, path, strerror(errno)); }
}
void mt_atomic_abort(FILE *f, const char *tmp) {
    if (f) fclose(f);
    remove(tmp);
}

#include "parts/core_impl_config.h"
#include "parts/comm_impl.h"
#include "parts/core_impl_ops.h"
#ifdef __CUDACC__
#include "kernels.cuh"
#endif
#include "parts/core_impl_dispatch.h"
#include "parts/core_impl_model.h"
#include "parts/core_impl_train.h"
#include "parts/core_impl_data.h"
#include "parts/tokenizer_impl.h"
#include "parts/core_impl_loop.h"

#endif /* MEGATRON_IMPLEMENTATION_DONE */
#endif /* MEGATRON_IMPLEMENTATION */

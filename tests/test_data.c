/* tests/test_data.c - §9 DATA (indexed dataset, splits, GPT samples, blending) and §1/§6 config
 * and learning-rate schedule.
 *
 *   gcc -std=c11 -Wall -Wextra -pedantic -O2 -I. -o tests/test_data tests/test_data.c -lm -pthread && ./tests/test_data
 *
 * Files are written under a fresh /tmp/mt_test_data_XXXXXX directory, removed at the end.
 * mt_fatal exits the process, so every error case runs in a forked child whose stdout and
 * stderr come back through a pipe: the test checks the exit status (1 for errors, 0 for
 * --help; a signal or a return would fail) and the words of the message.
 * Expected values come from Megatron's Python, worked by hand in the comments:
 *   get_split_indices (megatron/core/datasets/utils.py, older megatron/data/dataset_utils.py),
 *   _build_sample_idx / _num_epochs (gpt_dataset.py, helpers.cpp), build_blending_indices
 *   (helpers.cpp), OptimizerParamScheduler.get_lr (optimizer_param_scheduler.py).
 */
#define MEGATRON_IMPLEMENTATION
#include "../megatron.h"
#include "harness.h"
#include "child.h"
#include <dirent.h>
#include <sys/stat.h>
#include <sys/wait.h>

// ---------------------------------------------------------------------------------------------
// helpers: a scratch directory, whole-file read/write, a forked child with captured output
// ---------------------------------------------------------------------------------------------
static char tmpdir[256];

static void path_in_tmp(char *out, size_t cap, const char *name) { snprintf(out, cap, "%s/%s", tmpdir, name); }

static unsigned char *read_file(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) { *size = 0; return NULL; }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = (unsigned char *)mt_malloc((size_t)n + 1, "test file");
    *size = fread(buf, 1, (size_t)n, f);
    fclose(f);
    return buf;
}
static void write_file(const char *path, const void *data, size_t size) {
    FILE *f = fopen(path, "wb");
    if (!f) { fprintf(stderr, "cannot write %s\n", path); exit(2); }
    if (size) fwrite(data, 1, size, f);
    fclose(f);
}
static void write_text(const char *path, const char *text) { write_file(path, text, strlen(text)); }
static void copy_file(const char *from, const char *to) {
    size_t n;
    unsigned char *b = read_file(from, &n);
    write_file(to, b, n);
    free(b);
}
// how many entries of tmpdir have a name starting with `prefix`
static int count_files_with_prefix(const char *prefix) {
    DIR *d = opendir(tmpdir);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strncmp(e->d_name, prefix, strlen(prefix)) == 0) n++;
    closedir(d);
    return n;
}
static void remove_tmpdir(void) {
    DIR *d = opendir(tmpdir);
    if (!d) return;
    struct dirent *e;
    char p[600];
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        snprintf(p, sizeof p, "%s/%s", tmpdir, e->d_name);
        remove(p);
    }
    closedir(d);
    rmdir(tmpdir);
}

// expects the child to exit with `code` and its output to contain every word of `words`
// (a NULL-terminated list)
static void expect_child(const char *what, child_fn fn, void *arg, int code, const char *const *words) {
    char out[16384];
    int rc = run_child(fn, arg, out, sizeof out);
    mt_expect(rc == code, "%s: exit status %d, want %d; output:\n%s", what, rc, code, out);
    for (int i = 0; words[i]; i++)
        mt_expect(strstr(out, words[i]) != NULL, "%s: output lacks \"%s\"; output:\n%s", what, words[i], out);
}

// a token id that names its document and position: doc * 100 + pos (+ base), so a sample
// shows exactly where each of its tokens came from
static int32_t token_of(int doc, int pos, int base) { return base + doc * 100 + pos; }

// writes PREFIX.bin/.idx with ndocs documents of the given lengths
static void build_dataset(const char *prefix, int dtype, int ndocs, const int *lengths, int base) {
    mt_indexed_builder *b = mt_indexed_builder_open(prefix, dtype);
    int32_t buf[128];
    for (int d = 0; d < ndocs; d++) {
        for (int p = 0; p < lengths[d]; p++) buf[p] = token_of(d, p, base);
        mt_indexed_builder_add_document(b, buf, (size_t)lengths[d]);
    }
    mt_indexed_builder_finish(b);
}

static uint64_t rng_next(uint64_t *s) {   // splitmix64
    uint64_t z = (*s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static uint64_t rd_u64(const unsigned char *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static int64_t rd_i64(const unsigned char *p) { int64_t v; memcpy(&v, p, 8); return v; }
static int32_t rd_i32(const unsigned char *p) { int32_t v; memcpy(&v, p, 4); return v; }

// =============================================================================================
// indexed dataset: write, read back, and the bytes of the .idx against the format
// =============================================================================================
static void roundtrip_case(int dtype, const int32_t *const *docs, const int *lens, int ndocs, const char *name) {
    char prefix[512], path[600];
    path_in_tmp(prefix, sizeof prefix, name);
    mt_indexed_builder *b = mt_indexed_builder_open(prefix, dtype);
    for (int d = 0; d < ndocs; d++) mt_indexed_builder_add_document(b, docs[d], (size_t)lens[d]);
    mt_indexed_builder_finish(b);
    // exactly PREFIX.bin and PREFIX.idx, no temporary left behind
    mt_expect(count_files_with_prefix(name) == 2, "%s: want exactly %s.bin and %s.idx in the directory, found %d entries",
              name, name, name, count_files_with_prefix(name));
    size_t elem = dtype == 8 ? 2 : 4;
    // read back through the reader
    mt_indexed_dataset ds;
    mt_indexed_dataset_open(&ds, prefix);
    mt_expect(ds.dtype == dtype, "%s: dtype %d, want %d", name, ds.dtype, dtype);
    mt_expect(ds.elem_size == elem, "%s: elem_size %zu, want %zu", name, ds.elem_size, elem);
    // an empty document writes no sequence (Megatron's builder); it still counts as a document
    int nonempty = 0;
    for (int d = 0; d < ndocs; d++) nonempty += lens[d] > 0;
    mt_expect(ds.num_sequences == (uint64_t)nonempty, "%s: %llu sequences, want %d", name, (unsigned long long)ds.num_sequences, nonempty);
    mt_expect(ds.num_documents == (uint64_t)ndocs, "%s: %llu documents, want %d", name, (unsigned long long)ds.num_documents, ndocs);
    int tokens_ok = 1, lengths_ok = 1;
    for (int d = 0; d < ndocs && d < (int)ds.num_documents; d++) {
        if (mt_indexed_dataset_doc_length(&ds, d) != lens[d]) lengths_ok = 0;
        for (int p = 0; p < lens[d]; p++)
            if (mt_indexed_dataset_token(&ds, d, p) != docs[d][p]) tokens_ok = 0;
    }
    mt_expect(lengths_ok, "%s: document lengths read back differ", name);
    mt_expect(tokens_ok, "%s: tokens read back differ", name);
    mt_indexed_dataset_close(&ds);
    // the .idx, byte by byte (Megatron's _IndexWriter):
    //   "MMIDIDX\0\0" | u64 version 1 | u8 dtype | u64 S | u64 D = docs + 1 |
    //   int32 lengths[S] | int64 pointers[S] (byte offsets) | int64 doc index[D]: the first
    //   sequence of each document, then S (= 0..S when no document is empty)
    snprintf(path, sizeof path, "%s.idx", prefix);
    size_t n;
    unsigned char *idx = read_file(path, &n);
    size_t S = (size_t)nonempty, D = (size_t)ndocs + 1, want = 9 + 8 + 1 + 8 + 8 + 4 * S + 8 * S + 8 * D;
    int seq_lens[64], doc_first[65], ns = 0;
    for (int d = 0; d < ndocs && d < 64; d++) { doc_first[d] = ns; if (lens[d] > 0) seq_lens[ns++] = lens[d]; }
    doc_first[ndocs < 64 ? ndocs : 64] = ns;
    mt_expect(n == want, "%s: .idx is %zu bytes, want %zu", name, n, want);
    if (n == want) {
        mt_expect(memcmp(idx, "MMIDIDX\0\0", 9) == 0, "%s: magic", name);
        mt_expect(rd_u64(idx + 9) == 1, "%s: version %llu, want 1", name, (unsigned long long)rd_u64(idx + 9));
        mt_expect(idx[17] == dtype, "%s: dtype byte %d, want %d", name, idx[17], dtype);
        mt_expect(rd_u64(idx + 18) == S, "%s: sequence count %llu, want %zu", name, (unsigned long long)rd_u64(idx + 18), S);
        mt_expect(rd_u64(idx + 26) == D, "%s: document count %llu, want %zu (docs + 1)", name, (unsigned long long)rd_u64(idx + 26), D);
        int64_t off = 0;
        int arrays_ok = 1;
        for (size_t i = 0; i < S; i++) {
            if (rd_i32(idx + 34 + 4 * i) != seq_lens[i]) arrays_ok = 0;
            if (rd_i64(idx + 34 + 4 * S + 8 * i) != off) arrays_ok = 0;   // byte offset, not token offset
            off += (int64_t)seq_lens[i] * (int64_t)elem;
        }
        for (size_t i = 0; i < D; i++) if (rd_i64(idx + 34 + 12 * S + 8 * i) != (int64_t)doc_first[i]) arrays_ok = 0;
        mt_expect(arrays_ok, "%s: lengths / byte pointers / document index in the .idx differ from the format", name);
        // the .bin: tokens back to back, little-endian, in the dtype
        snprintf(path, sizeof path, "%s.bin", prefix);
        size_t nb;
        unsigned char *bin = read_file(path, &nb);
        mt_expect((int64_t)nb == off, "%s: .bin is %zu bytes, want %lld", name, nb, (long long)off);
        int bin_ok = (int64_t)nb == off;
        size_t k = 0;
        for (int d = 0; d < ndocs && bin_ok; d++)
            for (int p = 0; p < lens[d]; p++, k++) {
                int64_t v = dtype == 8 ? (int64_t)(uint16_t)(bin[2 * k] | (bin[2 * k + 1] << 8))
                                       : (int64_t)(int32_t)((uint32_t)bin[4 * k] | ((uint32_t)bin[4 * k + 1] << 8) |
                                                            ((uint32_t)bin[4 * k + 2] << 16) | ((uint32_t)bin[4 * k + 3] << 24));
                if (v != docs[d][p]) bin_ok = 0;
            }
        mt_expect(bin_ok, "%s: the .bin bytes are not the tokens in little-endian %s", name, dtype == 8 ? "uint16" : "int32");
        free(bin);
    }
    free(idx);
}

MT_TEST(indexed_dataset_uint16) {
    static const int32_t d0[] = {50256, 0, 65535, 17}, d1[] = {5}, d2[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, d4[] = {300, 301};
    const int32_t *docs[] = {d0, d1, d2, d1, d4};
    int lens[] = {4, 1, 11, 0, 2};   // an empty document too: the format allows it
    roundtrip_case(8, docs, lens, 5, "u16");
    mt_expect(mt_dtype_for_vocab(50257) == 8, "GPT-2's vocabulary fits uint16 (Megatron: < 65500)");
    mt_expect(mt_dtype_for_vocab(65499) == 8 && mt_dtype_for_vocab(65500) == 4, "the uint16/int32 boundary is 65500");
}

MT_TEST(indexed_dataset_int32) {
    static const int32_t d0[] = {100000, 70000, 2147483647}, d1[] = {65536, 1, -5}, d2[] = {42};
    const int32_t *docs[] = {d0, d1, d2};
    int lens[] = {3, 3, 1};
    roundtrip_case(4, docs, lens, 3, "i32");
}

MT_TEST(indexed_builder_abort_leaves_nothing) {
    char prefix[512];
    path_in_tmp(prefix, sizeof prefix, "aborted");
    mt_indexed_builder *b = mt_indexed_builder_open(prefix, 8);
    int32_t t[3] = {1, 2, 3};
    mt_indexed_builder_add_document(b, t, 3);
    mt_indexed_builder_abort(b);
    mt_expect(count_files_with_prefix("aborted") == 0, "an aborted builder must leave no file behind (found %d)", count_files_with_prefix("aborted"));
}

// ---------------------------------------------------------------------------------------------
// corrupt and missing files: a clear message, exit status 1, no crash
// ---------------------------------------------------------------------------------------------
static void child_open(void *arg) {
    mt_indexed_dataset ds;
    mt_indexed_dataset_open(&ds, (const char *)arg);
}
// a good dataset, copied to PREFIX_name and then damaged by `damage`
static void make_copy(const char *good, const char *bad) {
    char a[600], b[600];
    snprintf(a, sizeof a, "%s.idx", good); snprintf(b, sizeof b, "%s.idx", bad); copy_file(a, b);
    snprintf(a, sizeof a, "%s.bin", good); snprintf(b, sizeof b, "%s.bin", bad); copy_file(a, b);
}
static void set_file_size(const char *prefix, const char *ext, size_t size) {
    char p[600];
    snprintf(p, sizeof p, "%s.%s", prefix, ext);
    if (truncate(p, (off_t)size) != 0) { perror("truncate"); exit(2); }
}
static void poke(const char *prefix, size_t at, const void *bytes, size_t n) {
    char p[600];
    snprintf(p, sizeof p, "%s.idx", prefix);
    size_t size;
    unsigned char *b = read_file(p, &size);
    memcpy(b + at, bytes, n);
    write_file(p, b, size);
    free(b);
}

MT_TEST(indexed_dataset_corrupt_files) {
    char good[512], bad[512];
    path_in_tmp(good, sizeof good, "good");
    int lens[4] = {5, 9, 3, 7};
    build_dataset(good, 8, 4, lens, 0);
    // the good one opens in a child too (so the failures below are the damage, not the method)
    { const char *w[] = {NULL}; expect_child("good dataset", child_open, good, 77, w); }
    // bad magic
    path_in_tmp(bad, sizeof bad, "badmagic");
    make_copy(good, bad);
    poke(bad, 0, "X", 1);
    { const char *w[] = {"error:", "bad magic", "badmagic.idx", NULL}; expect_child("bad magic", child_open, bad, 1, w); }
    // wrong version
    path_in_tmp(bad, sizeof bad, "badversion");
    make_copy(good, bad);
    uint64_t v2 = 2;
    poke(bad, 9, &v2, 8);
    { const char *w[] = {"error:", "version 2", NULL}; expect_child("wrong version", child_open, bad, 1, w); }
    // a float dtype code is not a token type
    path_in_tmp(bad, sizeof bad, "baddtype");
    make_copy(good, bad);
    unsigned char f32 = 7;
    poke(bad, 17, &f32, 1);
    { const char *w[] = {"error:", "dtype", NULL}; expect_child("float dtype", child_open, bad, 1, w); }
    // .idx truncated inside the header (34 bytes) and inside the arrays
    path_in_tmp(bad, sizeof bad, "trunchead");
    make_copy(good, bad);
    set_file_size(bad, "idx", 30);
    { const char *w[] = {"error:", "truncated", "trunchead.idx", NULL}; expect_child("idx truncated in the header", child_open, bad, 1, w); }
    path_in_tmp(bad, sizeof bad, "truncarr");
    make_copy(good, bad);
    set_file_size(bad, "idx", 34 + 4 * 4 + 8 * 2);   // the lengths and half the pointers
    { const char *w[] = {"error:", "truncated", "truncarr.idx", NULL}; expect_child("idx truncated in the arrays", child_open, bad, 1, w); }
    // .bin shorter than the .idx says: one byte short of the last document
    path_in_tmp(bad, sizeof bad, "shortbin");
    make_copy(good, bad);
    set_file_size(bad, "bin", (5 + 9 + 3 + 7) * 2 - 1);
    { const char *w[] = {"error:", "shorter", "shortbin.bin", NULL}; expect_child(".bin shorter than .idx", child_open, bad, 1, w); }
    // missing .idx, missing .bin
    path_in_tmp(bad, sizeof bad, "nosuch");
    { const char *w[] = {"error:", "cannot open", "nosuch.idx", "hint:", NULL}; expect_child("missing files", child_open, bad, 1, w); }
    path_in_tmp(bad, sizeof bad, "nobin");
    make_copy(good, bad);
    char p[600];
    snprintf(p, sizeof p, "%s.bin", bad);
    remove(p);
    { const char *w[] = {"error:", "cannot open", "nobin.bin", NULL}; expect_child("missing .bin", child_open, bad, 1, w); }
}

// =============================================================================================
// train / valid / test split of the documents
// =============================================================================================
static void expect_split(const char *split, int64_t n, int64_t a, int64_t b, int64_t c, int64_t d) {
    int64_t got[4] = {-1, -1, -1, -1};
    mt_split_documents(split, n, got);
    mt_expect(got[0] == a && got[1] == b && got[2] == c && got[3] == d,
              "--split %s on %lld documents: got %lld,%lld,%lld,%lld, want %lld,%lld,%lld,%lld", split, (long long)n,
              (long long)got[0], (long long)got[1], (long long)got[2], (long long)got[3], (long long)a, (long long)b,
              (long long)c, (long long)d);
}
// Megatron's rule: w = splits / sum; idx = [0]; idx.append(idx[-1] + int(round(w_i * size)));
// diff = idx[-1] - size; idx[1:] -= diff
MT_TEST(split_documents) {
    // 949,50,1 on 269: round(255.281) = 255, round(13.45) = 13, round(0.269) = 0 -> 0,255,268,268;
    // diff = 268 - 269 = -1 -> 0,256,269,269
    expect_split("949,50,1", 269, 0, 256, 269, 269);
    // 969,30,1 on 1000: 969, 30, 1 -> 0,969,999,1000, diff 0
    expect_split("969,30,1", 1000, 0, 969, 999, 1000);
    // 100,0,0 on 10: 10, 0, 0 -> 0,10,10,10
    expect_split("100,0,0", 10, 0, 10, 10, 10);
    // 1,1,1 on 10: round(3.33) = 3 three times -> 0,3,6,9; diff = -1 -> 0,4,7,10
    expect_split("1,1,1", 10, 0, 4, 7, 10);
    // 949,50,1 on 1000 (the tutorial's split on a round number): 0,949,999,1000
    expect_split("949,50,1", 1000, 0, 949, 999, 1000);
    // a single number is all train (Megatron pads the list with zeros)
    expect_split("1", 7, 0, 7, 7, 7);
}
// Python's round() rounds halves to even; these are the cases where that matters.
// 949,50,1 on 10: 0.949*10 = 9.49 -> 9; 0.05*10 = 0.5 -> round(0.5) = 0; 0.01*10 -> 0:
//   0,9,9,9; diff = -1 -> 0,10,10,10 (Megatron gives no validation documents)
// 50,50,0 on 5: 2.5 -> round(2.5) = 2 twice -> 0,2,4,4; diff = -1 -> 0,3,5,5
MT_TEST(split_documents_round_half_even) {
    expect_split("949,50,1", 10, 0, 10, 10, 10);
    expect_split("50,50,0", 5, 0, 3, 5, 5);
}

// =============================================================================================
// GPT samples: T+1 tokens, overlapping by one, across documents, shuffled per epoch
// =============================================================================================
enum { GPT_NDOCS = 30, GPT_T = 8 };
static int gpt_lens[GPT_NDOCS];
static char gpt_prefix[512];

static void make_gpt_dataset(void) {
    uint64_t s = 2024;
    for (int d = 0; d < GPT_NDOCS; d++) gpt_lens[d] = 1 + (int)(rng_next(&s) % 20);   // 1..20 tokens, T = 8
    path_in_tmp(gpt_prefix, sizeof gpt_prefix, "gpt");
    build_dataset(gpt_prefix, 8, GPT_NDOCS, gpt_lens, 0);
}

// checks one built dataset over documents [begin, end): returns the stream of its epochs
static void check_gpt_dataset(const mt_gpt_dataset *g, int64_t begin, int64_t end, int64_t min_samples, const char *what) {
    int T = g->T;
    int64_t ndocs = end - begin, tpe = 0;
    for (int64_t d = begin; d < end; d++) tpe += gpt_lens[d];
    // epochs as Megatron's _num_epochs: the smallest E with (E * tokens_per_epoch - 1) // T >= needed
    int64_t E = 1;
    while ((E * tpe - 1) / T < min_samples) E++;
    mt_expect(g->num_doc_idx == E * ndocs, "%s: doc_idx has %lld entries, want %lld epochs x %lld documents", what,
              (long long)g->num_doc_idx, (long long)E, (long long)ndocs);
    mt_expect(g->num_samples == (E * tpe - 1) / T, "%s: %lld samples, want (E*tokens - 1)/T = %lld", what,
              (long long)g->num_samples, (long long)((E * tpe - 1) / T));
    mt_expect(g->num_samples >= min_samples, "%s: fewer samples than asked for", what);
    if (g->num_doc_idx != E * ndocs) return;
    // every epoch of doc_idx is a permutation of the split's documents
    int perm_ok = 1;
    for (int64_t e = 0; e < E; e++) {
        int seen[GPT_NDOCS] = {0};
        for (int64_t k = 0; k < ndocs; k++) {
            int64_t d = g->doc_idx[e * ndocs + k];
            if (d < begin || d >= end || seen[d]) perm_ok = 0;
            else seen[d] = 1;
        }
    }
    mt_expect(perm_ok, "%s: each epoch of doc_idx must be a permutation of documents [%lld, %lld)", what, (long long)begin, (long long)end);
    // the token stream of all epochs in doc_idx order
    int64_t total = E * tpe;
    int32_t *stream = (int32_t *)mt_malloc(sizeof(int32_t) * (size_t)total, "stream");
    int64_t n = 0;
    for (int64_t k = 0; k < g->num_doc_idx; k++) {
        int d = (int)g->doc_idx[k];
        for (int p = 0; p < gpt_lens[d]; p++) stream[n++] = token_of(d, p, 0);
    }
    // shuffle_idx is a permutation of the samples
    int64_t N = g->num_samples;
    int64_t *inverse = (int64_t *)mt_malloc(sizeof(int64_t) * (size_t)N, "inverse");
    for (int64_t i = 0; i < N; i++) inverse[i] = -1;
    int shuffle_ok = 1;
    for (int64_t i = 0; i < N; i++) {
        int64_t sidx = g->shuffle_idx[i];
        if (sidx < 0 || sidx >= N || inverse[sidx] >= 0) shuffle_ok = 0;
        else inverse[sidx] = i;
    }
    mt_expect(shuffle_ok, "%s: shuffle_idx must be a permutation of 0..%lld", what, (long long)N - 1);
    // unshuffled sample s is stream[s*T .. s*T + T]: T+1 tokens, its last = sample s+1's first,
    // and together they cover the stream in doc_idx order
    int32_t out[GPT_T + 1 + 4];
    int len_ok = 1, content_ok = 1, overlap_ok = 1, crosses = 0;
    int32_t prev_last = -1;
    for (int64_t sidx = 0; sidx < N && shuffle_ok; sidx++) {
        for (int k = 0; k < T + 1 + 4; k++) out[k] = -7;
        mt_gpt_dataset_sample(g, inverse[sidx], out);
        for (int k = 0; k < T + 1; k++) if (out[k] == -7) len_ok = 0;
        for (int k = T + 1; k < T + 1 + 4; k++) if (out[k] != -7) len_ok = 0;   // wrote past T+1
        for (int k = 0; k < T + 1; k++) if (out[k] != stream[sidx * T + k]) content_ok = 0;
        if (sidx > 0 && out[0] != prev_last) overlap_ok = 0;
        prev_last = out[T];
        for (int k = 1; k < T + 1; k++) if (out[k] / 100 != out[0] / 100) crosses = 1;
        // sample_idx[s] points at its first token: (doc_idx position, offset)
        int64_t di = g->sample_idx[2 * sidx], off = g->sample_idx[2 * sidx + 1];
        if (di < g->num_doc_idx && token_of((int)g->doc_idx[di], (int)off, 0) != out[0]) content_ok = 0;
    }
    mt_expect(len_ok, "%s: every sample must be exactly T+1 = %d tokens", what, T + 1);
    mt_expect(content_ok, "%s: unshuffled sample s must be tokens [s*T, s*T+T] of the doc_idx-ordered stream", what);
    mt_expect(overlap_ok, "%s: sample s's last token must be sample s+1's first", what);
    mt_expect(crosses, "%s: some sample must cross a document boundary", what);
    // the samples use all of the stream but fewer than T tokens at its end
    mt_expect(N * T + 1 <= total && total - (N * T + 1) < T, "%s: samples cover %lld of %lld tokens", what,
              (long long)(N * T + 1), (long long)total);
    free(stream); free(inverse);
}

MT_TEST(gpt_dataset_one_epoch) {
    make_gpt_dataset();
    mt_indexed_dataset ds;
    mt_indexed_dataset_open(&ds, gpt_prefix);
    mt_gpt_dataset g;
    mt_gpt_dataset_build(&g, &ds, 4, 26, GPT_T, 1, 1234, 0);   // documents 4..25, as a split would give
    check_gpt_dataset(&g, 4, 26, 1, "one epoch");
    // shuffling: the same seed gives the same order, another seed another
    mt_gpt_dataset g2, g3;
    mt_gpt_dataset_build(&g2, &ds, 4, 26, GPT_T, 1, 1234, 0);
    mt_gpt_dataset_build(&g3, &ds, 4, 26, GPT_T, 1, 999, 0);
    int same = g2.num_samples == g.num_samples && g2.num_doc_idx == g.num_doc_idx;
    for (int64_t i = 0; same && i < g.num_samples; i++) if (g.shuffle_idx[i] != g2.shuffle_idx[i]) same = 0;
    for (int64_t i = 0; same && i < g.num_doc_idx; i++) if (g.doc_idx[i] != g2.doc_idx[i]) same = 0;
    mt_expect(same, "the same seed must give the same doc_idx and shuffle_idx");
    int differ_docs = 0, differ_samples = 0;
    for (int64_t i = 0; i < g.num_doc_idx && i < g3.num_doc_idx; i++) if (g.doc_idx[i] != g3.doc_idx[i]) differ_docs = 1;
    for (int64_t i = 0; i < g.num_samples && i < g3.num_samples; i++) if (g.shuffle_idx[i] != g3.shuffle_idx[i]) differ_samples = 1;
    mt_expect(differ_docs && differ_samples, "another seed must give another document and sample order");
    check_gpt_dataset(&g3, 4, 26, 1, "one epoch, seed 999");
    // the shuffle is not the identity (a shuffle that does nothing would pass the checks above)
    int moved = 0;
    for (int64_t i = 0; i < g.num_samples; i++) if (g.shuffle_idx[i] != i) moved = 1;
    mt_expect(moved, "shuffle_idx must not be the identity");
    mt_gpt_dataset_free(&g); mt_gpt_dataset_free(&g2); mt_gpt_dataset_free(&g3);
    mt_indexed_dataset_close(&ds);
}

MT_TEST(gpt_dataset_several_epochs) {
    mt_indexed_dataset ds;
    mt_indexed_dataset_open(&ds, gpt_prefix);
    int64_t tpe = 0;
    for (int d = 0; d < GPT_NDOCS; d++) tpe += gpt_lens[d];
    int64_t one_epoch = (tpe - 1) / GPT_T;
    mt_gpt_dataset g;
    int64_t want = 2 * one_epoch + 3;   // needs a third epoch
    mt_gpt_dataset_build(&g, &ds, 0, GPT_NDOCS, GPT_T, want, 77, 0);
    check_gpt_dataset(&g, 0, GPT_NDOCS, want, "three epochs");
    mt_expect(g.num_doc_idx == 3 * GPT_NDOCS, "2 epochs + 3 samples must take 3 epochs, got %lld doc_idx entries", (long long)g.num_doc_idx);
    // each epoch is shuffled on its own
    int differ = 0;
    for (int k = 0; k < GPT_NDOCS && g.num_doc_idx >= 2 * GPT_NDOCS; k++) if (g.doc_idx[k] != g.doc_idx[GPT_NDOCS + k]) differ = 1;
    mt_expect(differ, "epochs 0 and 1 must be shuffled differently");
    // a sample index past the end wraps around (i % num_samples)
    int32_t a[GPT_T + 1], b[GPT_T + 1];
    mt_gpt_dataset_sample(&g, 3, a);
    mt_gpt_dataset_sample(&g, 3 + g.num_samples, b);
    mt_expect(memcmp(a, b, sizeof a) == 0, "sample i + num_samples must be sample i");
    mt_gpt_dataset_free(&g);
    mt_indexed_dataset_close(&ds);
}

// =============================================================================================
// blending two datasets by weight (mt_data_init with two --data-path prefixes)
// =============================================================================================
static void blend_config(mt_config *cfg, const char *a, const char *b) {
    mt_config_defaults(cfg);
    cfg->model.seq_length = GPT_T;
    cfg->train.train_iters = 40;
    cfg->train.global_batch_size = 4;
    cfg->train.eval_interval = 20;
    cfg->train.eval_iters = 2;
    cfg->train.num_data_paths = 2;
    strcpy(cfg->train.data_path[0], a);
    strcpy(cfg->train.data_path[1], b);
    cfg->train.data_weight[0] = 0.3;
    cfg->train.data_weight[1] = 0.7;
    strcpy(cfg->train.split, "90,10,0");
    cfg->train.seed = 5;
    mt_config_derive(cfg);
}

// --mock-data: Megatron's mock documents (1, 2, ..., n-1, <|endoftext|>, n in [1, 4096)), 1,000 of
// them, the same for the same seed; nothing left in the temporary directory; the data a training
// run builds from it (every split) has the documents' tokens
MT_TEST(mock_dataset) {
    mt_config cfg;
    mt_config_defaults(&cfg);
    cfg.model.vocab_size = 50257;
    cfg.model.seq_length = 32;
    cfg.train.mock_data = 1;
    cfg.train.train_iters = 3;
    cfg.train.global_batch_size = 4;
    cfg.train.micro_batch_size = 4;
    cfg.train.eval_iters = 1;
    cfg.train.eval_interval = 2;
    (void)system("rm -rf build/test_mock && mkdir -p build/test_mock");
    setenv("TMPDIR", "build/test_mock", 1);
    mt_data d;
    mt_data_init(&d, &cfg);
    unsetenv("TMPDIR");
    const mt_indexed_dataset *ds = &d.files[0];
    mt_expect(ds->num_documents == 1000, "%llu documents", (unsigned long long)ds->num_documents);
    int bad = 0;
    for (int64_t doc = 0; doc < (int64_t)ds->num_documents; doc++) {
        int64_t n = mt_indexed_dataset_doc_length(ds, doc);
        if (n < 1 || n >= 4096) bad++;
        for (int64_t k = 0; k < n - 1 && !bad; k++)
            if (mt_indexed_dataset_token(ds, doc, k) != k + 1) bad++;
        if (mt_indexed_dataset_token(ds, doc, n - 1) != 50256) bad++;
    }
    mt_expect(bad == 0, "%d documents are not 1, 2, ..., n-1, <|endoftext|>", bad);
    mt_expect(system("[ -z \"$(ls -A build/test_mock)\" ]") == 0, "the mock dataset's files were left in TMPDIR");
    for (int s = 0; s < 3; s++) mt_expect(d.has_split[s], "split %d not built", s);
    int32_t sample[33];
    mt_blended_sample(&d.split[0], 0, sample);
    int ok = 1;   // consecutive tokens count up by one, or restart after <|endoftext|>
    for (int k = 1; k < 33; k++)
        ok &= sample[k] == sample[k - 1] + 1 || sample[k - 1] == 50256 || (sample[k] == 50256);
    mt_expect(ok, "a training sample is not made of the mock documents");
    mt_data_free(&d);
}

MT_TEST(blended_datasets) {
    char a[512], b[512];
    path_in_tmp(a, sizeof a, "blend_a");
    path_in_tmp(b, sizeof b, "blend_b");
    int la[20], lb[30];
    uint64_t s = 31;
    for (int i = 0; i < 20; i++) la[i] = 3 + (int)(rng_next(&s) % 25);
    for (int i = 0; i < 30; i++) lb[i] = 3 + (int)(rng_next(&s) % 25);
    build_dataset(a, 8, 20, la, 0);          // tokens < 10000: dataset A (uint16)
    build_dataset(b, 4, 30, lb, 100000);     // tokens >= 100000: dataset B (int32)
    mt_config cfg;
    blend_config(&cfg, a, b);
    mt_data d1, d2;
    mt_data_init(&d1, &cfg);
    mt_data_init(&d2, &cfg);
    // 90,10,0: train and valid exist, test is empty
    mt_expect(d1.has_split[0] && d1.has_split[1] && !d1.has_split[2], "splits present: %d %d %d, want 1 1 0",
              d1.has_split[0], d1.has_split[1], d1.has_split[2]);
    const double w[2] = {0.3, 0.7};
    for (int sp = 0; sp < 2; sp++) {
        const mt_blended_dataset *bl = &d1.split[sp];
        int64_t want_n = sp == 0 ? 40 * 4 : (40 / 20 + 1) * 2 * 4;   // train_iters * gbs; (evals) * eval_iters * gbs
        mt_expect(bl->num_samples == want_n, "split %d: %lld blended samples, want %lld", sp, (long long)bl->num_samples, (long long)want_n);
        // after every prefix of N samples, each dataset has supplied w * N of them within 1
        int64_t taken[2] = {0, 0};
        int share_ok = 1, consecutive_ok = 1, in_range_ok = 1;
        for (int64_t i = 0; i < bl->num_samples; i++) {
            int k = bl->dataset_index[i];
            if (k < 0 || k > 1) { share_ok = 0; break; }
            if (bl->dataset_sample_index[i] != taken[k]) consecutive_ok = 0;   // each part is read in order
            if (bl->dataset_sample_index[i] >= bl->parts[k].num_samples) in_range_ok = 0;   // no silent wrap-around
            taken[k]++;
            for (int j = 0; j < 2; j++)
                if (fabs((double)taken[j] - w[j] * (double)(i + 1)) > 1.0) share_ok = 0;
        }
        mt_expect(share_ok, "split %d: after N samples each dataset must have given weight * N within 1", sp);
        mt_expect(consecutive_ok, "split %d: dataset_sample_index must count up per dataset", sp);
        mt_expect(in_range_ok, "split %d: a part dataset has fewer samples than the blend takes from it", sp);
        // the blended sample is that part's sample: A's tokens are < 100000, B's >= 100000
        int32_t out[GPT_T + 1], want[GPT_T + 1];
        int from_ok = 1;
        for (int64_t i = 0; i < bl->num_samples; i++) {
            mt_blended_sample(bl, i, out);
            int k = bl->dataset_index[i];
            mt_gpt_dataset_sample(&bl->parts[k], bl->dataset_sample_index[i], want);
            if (memcmp(out, want, sizeof out) != 0) from_ok = 0;
            for (int t = 0; t <= GPT_T; t++) if ((out[t] >= 100000) != (k == 1)) from_ok = 0;
        }
        mt_expect(from_ok, "split %d: blended sample i must be sample dataset_sample_index[i] of dataset dataset_index[i]", sp);
        // the valid split draws from the valid documents only: A's 18..19, B's 27..29
        if (sp == 1) {
            int docs_ok = 1;
            for (int64_t i = 0; i < bl->num_samples; i++) {
                mt_blended_sample(bl, i, out);
                for (int t = 0; t <= GPT_T; t++) {
                    int doc = (out[t] % 100000) / 100;
                    if (out[t] >= 100000 ? doc < 27 : doc < 18) docs_ok = 0;
                }
            }
            mt_expect(docs_ok, "the valid split must use only the valid documents (A 18..19, B 27..29)");
        }
        // two builds from the same config are identical
        const mt_blended_dataset *b2 = &d2.split[sp];
        int same = b2->num_samples == bl->num_samples;
        for (int64_t i = 0; same && i < bl->num_samples; i++)
            if (b2->dataset_index[i] != bl->dataset_index[i] || b2->dataset_sample_index[i] != bl->dataset_sample_index[i]) same = 0;
        for (int64_t i = 0; same && i < bl->num_samples; i++) {
            mt_blended_sample(bl, i, out);
            mt_blended_sample(b2, i, want);
            if (memcmp(out, want, sizeof out) != 0) same = 0;
        }
        mt_expect(same, "split %d: two builds from one config must be identical", sp);
    }
    mt_data_free(&d1);
    mt_data_free(&d2);
}

// =============================================================================================
// learning-rate schedule
// =============================================================================================
static void lr_config(mt_config *cfg, const char *style, float lr, float min_lr, int warmup, int decay, int train_iters) {
    mt_config_defaults(cfg);
    strcpy(cfg->train.lr_decay_style, style);
    cfg->train.lr = lr;
    cfg->train.min_lr = min_lr;
    cfg->train.lr_warmup_iters = warmup;
    cfg->train.lr_decay_iters = decay;
    cfg->train.train_iters = train_iters;
    mt_config_derive(cfg);
}
static void expect_lr(const mt_config *cfg, int step, double want, const char *what) {
    double got = mt_learning_rate(cfg, step);
    // the schedule is computed in double from fp32 lr/min_lr and returned as float: 1 ulp of the
    // result plus the fp32 representation of the inputs (1e-3f is 4.7e-8 off 1e-3): 1e-6 relative
    mt_expect(fabs(got - want) <= 1e-6 * fabs(want) + 1e-12, "%s: lr(%d) = %.9g, want %.9g", what, step, got, want);
}
MT_TEST(lr_schedule) {
    mt_config cfg;
    // linear: lr 1e-3, min 1e-4, warm-up 10, decay over 100
    lr_config(&cfg, "linear", 1e-3f, 1e-4f, 10, 100, 200);
    expect_lr(&cfg, 0, 0.0, "linear warm-up start");
    expect_lr(&cfg, 1, 1e-4, "linear warm-up 1/10");
    expect_lr(&cfg, 5, 5e-4, "linear warm-up 5/10");
    expect_lr(&cfg, 10, 1e-3, "end of warm-up");
    // step 55: ratio (55-10)/(100-10) = 0.5 -> 1e-4 + 9e-4 * 0.5 = 5.5e-4
    expect_lr(&cfg, 55, 5.5e-4, "linear decay half way");
    // step 82: ratio 72/90 = 0.8 -> 1e-4 + 9e-4 * 0.2 = 2.8e-4
    expect_lr(&cfg, 82, 2.8e-4, "linear decay 0.8");
    expect_lr(&cfg, 100, 1e-4, "linear at decay_iters = min");
    expect_lr(&cfg, 150, 1e-4, "linear after decay_iters = min");
    // cosine: lr = min + (max - min) * 0.5 (cos(pi ratio) + 1)
    lr_config(&cfg, "cosine", 1e-3f, 1e-4f, 10, 100, 200);
    expect_lr(&cfg, 5, 5e-4, "cosine warm-up 5/10");
    expect_lr(&cfg, 10, 1e-3, "cosine ratio 0 = max");
    // step 40: ratio 30/90 = 1/3, cos(pi/3) = 0.5 -> 1e-4 + 9e-4 * 0.75 = 7.75e-4
    expect_lr(&cfg, 40, 7.75e-4, "cosine ratio 1/3");
    // step 55: ratio 1/2, cos(pi/2) = 0 -> 5.5e-4
    expect_lr(&cfg, 55, 5.5e-4, "cosine ratio 1/2");
    // step 70: ratio 2/3, cos(2pi/3) = -0.5 -> 1e-4 + 9e-4 * 0.25 = 3.25e-4
    expect_lr(&cfg, 70, 3.25e-4, "cosine ratio 2/3");
    expect_lr(&cfg, 100, 1e-4, "cosine at decay_iters = min");
    expect_lr(&cfg, 101, 1e-4, "cosine after decay_iters = min");
    // constant: warm-up, then max forever (Megatron returns max_lr before the decay_steps test)
    lr_config(&cfg, "constant", 2e-3f, 1e-4f, 4, 100, 200);
    expect_lr(&cfg, 2, 1e-3, "constant warm-up 2/4");
    expect_lr(&cfg, 4, 2e-3, "constant after warm-up");
    expect_lr(&cfg, 50, 2e-3, "constant");
    expect_lr(&cfg, 150, 2e-3, "constant after decay_iters");
    // no warm-up, decay iters defaulting to train iters (0 -> 50): linear from max at step 0
    lr_config(&cfg, "linear", 1e-3f, 0.0f, 0, 0, 50);
    mt_expect(cfg.lr_decay_steps == 50, "lr decay iters default to train iters (50), got %d", cfg.lr_decay_steps);
    expect_lr(&cfg, 0, 1e-3, "no warm-up: max at step 0");
    expect_lr(&cfg, 10, 8e-4, "linear 10/50 to 0");   // 1e-3 * (1 - 0.2)
    expect_lr(&cfg, 50, 0.0, "linear to min 0");
    // --lr-warmup-fraction: warm-up = 0.1 * decay iters (100) = 10 steps, overriding --lr-warmup-iters
    mt_config_defaults(&cfg);
    strcpy(cfg.train.lr_decay_style, "linear");
    cfg.train.lr = 1e-3f;
    cfg.train.min_lr = 1e-4f;
    cfg.train.lr_warmup_iters = 3;
    cfg.train.lr_warmup_fraction = 0.1;
    cfg.train.lr_decay_iters = 100;
    cfg.train.train_iters = 100;
    mt_config_derive(&cfg);
    mt_expect(cfg.lr_warmup_steps == 10, "--lr-warmup-fraction 0.1 of 100 decay iters = 10 warm-up steps, got %g", cfg.lr_warmup_steps);
    expect_lr(&cfg, 5, 5e-4, "warm-up fraction 5/10");
    expect_lr(&cfg, 55, 5.5e-4, "warm-up fraction, decay half way");
}

// --lr-warmup-fraction that is not a whole number of iterations. Megatron (training.py
// get_optimizer_param_scheduler) counts steps in samples: lr_warmup_steps = fraction *
// lr_decay_iters * global_batch_size, a float, and get_lr gives max_lr * num_steps / warmup_steps.
// fraction 0.015 of 100 decay iterations = 1.5 iterations of warm-up:
//   lr(1) = 1e-3 * 1 / 1.5 = 6.6666667e-4 (still warming up)
//   lr(2) = linear decay, ratio (2 - 1.5) / (100 - 1.5) = 0.5 / 98.5: 1e-3 * (1 - 0.0050761421) = 9.9492386e-4
MT_TEST(lr_warmup_fraction_fractional_steps) {
    mt_config cfg;
    mt_config_defaults(&cfg);
    strcpy(cfg.train.lr_decay_style, "linear");
    cfg.train.lr = 1e-3f;
    cfg.train.min_lr = 0.0f;
    cfg.train.lr_warmup_fraction = 0.015;
    cfg.train.lr_decay_iters = 100;
    cfg.train.train_iters = 100;
    mt_config_derive(&cfg);
    expect_lr(&cfg, 1, 6.6666667e-4, "warm-up fraction 0.015 x 100 iters = 1.5 iters, step 1");
    expect_lr(&cfg, 2, 9.9492386e-4, "warm-up fraction 0.015 x 100 iters = 1.5 iters, step 2");
}

// =============================================================================================
// config: flags, --flag=value, --config JSON, errors
// =============================================================================================
MT_TEST(config_flags) {
    char *argv[] = {
        "train_gpt", "--num-layers", "4", "--hidden-size=256", "--num-attention-heads", "8", "--seq-length", "128",
        "--max-position-embeddings", "256", "--ffn-hidden-size", "1024", "--vocab-size", "1000",
        "--make-vocab-size-divisible-by", "64", "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size=2",
        "--nproc-per-node", "8", "--num-layers-per-virtual-pipeline-stage", "1", "--micro-batch-size", "2",
        "--global-batch-size", "16", "--train-iters", "1000", "--lr", "3e-4", "--min-lr=3e-5", "--lr-decay-style",
        "cosine", "--lr-warmup-iters", "7", "--weight-decay", "0.1", "--adam-beta2", "0.95", "--clip-grad", "0.5",
        "--seed", "42", "--data-path", "0.3", "pa", "0.7", "pb", "--split", "949,50,1", "--vocab-file", "v.json",
        "--merge-file", "m.txt", "--bf16", "--save", "ckpt", "--save-interval", "100", "--hidden-dropout", "0.1",
        "--attention-dropout=0.2", "--eval-iters", "5", "--eval-interval", "50", "--log-interval", "1",
        "--tokenizer-type", "NullTokenizer", "--init-method-std", "0.006", "--ddp-bucket-size", "1000",
    };
    int argc = (int)(sizeof argv / sizeof argv[0]);
    mt_config cfg;
    mt_config_defaults(&cfg);
    mt_config_parse(&cfg, argc, argv);
    const mt_model_config *m = &cfg.model;
    const mt_train_config *t = &cfg.train;
    mt_expect(m->num_layers == 4 && m->hidden_size == 256 && m->num_attention_heads == 8 && m->seq_length == 128,
              "model sizes: L=%d C=%d NH=%d T=%d", m->num_layers, m->hidden_size, m->num_attention_heads, m->seq_length);
    mt_expect(m->max_position_embeddings == 256 && m->ffn_hidden_size == 1024 && m->vocab_size == 1000 &&
              m->make_vocab_size_divisible_by == 64, "maxT/F/V/divisible-by");
    mt_expect(m->hidden_dropout == 0.1f && m->attention_dropout == 0.2f && m->init_method_std == 0.006f, "dropouts / init std");
    mt_expect(cfg.parallel.tensor_model_parallel_size == 2 && cfg.parallel.pipeline_model_parallel_size == 2 &&
              cfg.parallel.nproc_per_node == 8 && cfg.parallel.num_layers_per_virtual_pipeline_stage == 1 &&
              cfg.parallel.ddp_bucket_size == 1000, "parallel flags");
    mt_expect(t->micro_batch_size == 2 && t->global_batch_size == 16 && t->train_iters == 1000, "batch / iters");
    mt_expect(t->lr == 3e-4f && t->min_lr == 3e-5f && strcmp(t->lr_decay_style, "cosine") == 0 && t->lr_warmup_iters == 7,
              "lr flags: lr %g min %g style %s warmup %d", (double)t->lr, (double)t->min_lr, t->lr_decay_style, t->lr_warmup_iters);
    mt_expect(t->weight_decay == 0.1f && t->adam_beta2 == 0.95f && t->clip_grad == 0.5f && t->seed == 42, "optimizer flags / seed");
    mt_expect(t->num_data_paths == 2 && strcmp(t->data_path[0], "pa") == 0 && strcmp(t->data_path[1], "pb") == 0 &&
              fabs(t->data_weight[0] - 0.3) < 1e-12 && fabs(t->data_weight[1] - 0.7) < 1e-12, "--data-path 0.3 pa 0.7 pb");
    mt_expect(strcmp(t->split, "949,50,1") == 0 && strcmp(t->vocab_file, "v.json") == 0 && strcmp(t->merge_file, "m.txt") == 0 &&
              strcmp(t->tokenizer_type, "NullTokenizer") == 0, "data flags");
    mt_expect(t->bf16 == 1 && t->fp16 == 0 && strcmp(t->save, "ckpt") == 0 && t->save_interval == 100, "bf16 / save");
    mt_expect(t->eval_iters == 5 && t->eval_interval == 50 && t->log_interval == 1, "logging flags");
    mt_config_derive(&cfg);
    // derived: DP = 8 / (2*2) = 2; micro-batches = 16 / (2*2) = 4; virtual stages = (4/2)/1 = 2;
    // Vp = 1000 rounded up to a multiple of 64*2 = 128 -> 1024; hs = 256/8 = 32
    mt_expect(cfg.data_parallel_size == 2 && cfg.world_size == 8 && cfg.num_microbatches == 4 && cfg.virtual_pipeline_size == 2,
              "derived layout: DP %d world %d micro-batches %d vp %d", cfg.data_parallel_size, cfg.world_size,
              cfg.num_microbatches, cfg.virtual_pipeline_size);
    mt_expect(cfg.padded_vocab_size == 1024 && cfg.head_size == 32, "derived Vp %d hs %d", cfg.padded_vocab_size, cfg.head_size);
    // GPT-2's vocabulary with TP 1 and 2 (Megatron's _vocab_size_with_padding)
    mt_expect(mt_pad_vocab_size(50257, 128, 1) == 50304 && mt_pad_vocab_size(50257, 128, 2) == 50432, "GPT-2 padded vocab sizes");
}

static char json_path[600];
MT_TEST(config_json_file) {
    path_in_tmp(json_path, sizeof json_path, "model.json");
    write_text(json_path,
               "// a model for the test\n"
               "{\n"
               "  \"num_layers\": 6,   // six layers\n"
               "  \"hidden_size\": 384,\n"
               "  /* a block comment */\n"
               "  \"num_attention_heads\": 6,\n"
               "  \"lr\": 0.001,\n"
               "  \"lr_decay_style\": \"cosine\",\n"
               "  \"bf16\": true,\n"
               "  \"seed\": 7\n"
               "}\n");
    // the command line wins over the file, also for a flag written before --config
    char *argv[] = {"train_gpt", "--lr", "0.002", "--config", json_path, "--seed", "9"};
    mt_config cfg;
    mt_config_defaults(&cfg);
    mt_config_parse(&cfg, 7, argv);
    mt_expect(cfg.model.num_layers == 6 && cfg.model.hidden_size == 384 && cfg.model.num_attention_heads == 6,
              "values from the file: L=%d C=%d NH=%d", cfg.model.num_layers, cfg.model.hidden_size, cfg.model.num_attention_heads);
    mt_expect(strcmp(cfg.train.lr_decay_style, "cosine") == 0 && cfg.train.bf16 == 1, "string and bool from the file");
    mt_expect(cfg.train.lr == 0.002f, "--lr before --config must override the file: lr %g, want 0.002", (double)cfg.train.lr);
    mt_expect(cfg.train.seed == 9, "--seed after --config must override the file: seed %llu, want 9", cfg.train.seed);
}

// the --flag=value form for --config: flags still override the file
MT_TEST(config_json_file_equals_form) {
    char arg[700];
    snprintf(arg, sizeof arg, "--config=%s", json_path);
    char *argv[] = {"train_gpt", "--lr", "0.002", arg};
    mt_config cfg;
    mt_config_defaults(&cfg);
    mt_config_parse(&cfg, 4, argv);
    mt_expect(cfg.model.num_layers == 6, "--config=FILE must load the file (num_layers %d, want 6)", cfg.model.num_layers);
    mt_expect(cfg.train.lr == 0.002f, "--lr 0.002 --config=FILE: the flag must override the file's lr 0.001, got %g", (double)cfg.train.lr);
}

typedef struct { int argc; char **argv; int derive; } parse_job;
static void child_parse(void *arg) {
    parse_job *j = (parse_job *)arg;
    mt_config cfg;
    mt_config_defaults(&cfg);
    mt_config_parse(&cfg, j->argc, j->argv);
    if (j->derive) mt_config_derive(&cfg);
}

MT_TEST(config_errors) {
    {   // an unknown flag names the nearest known one
        char *argv[] = {"train_gpt", "--hiden-size", "64"};
        parse_job j = {3, argv, 0};
        const char *w[] = {"error:", "unknown flag --hiden-size", "--hidden-size", NULL};
        expect_child("unknown flag", child_parse, &j, 1, w);
    }
    {   // the same in the --flag=value form
        char *argv[] = {"train_gpt", "--num-layer=4"};
        parse_job j = {2, argv, 0};
        const char *w[] = {"error:", "--num-layer", "did you mean --num-layers", NULL};
        expect_child("unknown flag with =", child_parse, &j, 1, w);
    }
    {   // a flag of an older Megatron is honoured with a note naming today's (tests/test_logging.c has each)
        char *argv[] = {"train_gpt", "--model-parallel-size", "2"};
        parse_job j = {3, argv, 0};
        const char *w[] = {"note:", "--model-parallel-size", "--tensor-model-parallel-size", NULL};
        expect_child("old flag", child_parse, &j, 77, w);
    }
    {   // one whose name is far from today's: the note must come from the table of old flags
        char *argv[] = {"train_gpt", "--num-gpus", "4"};
        parse_job j = {3, argv, 0};
        const char *w[] = {"note:", "--num-gpus", "--nproc-per-node", NULL};
        expect_child("old flag --num-gpus", child_parse, &j, 77, w);
    }
    {   // a bad number
        char *argv[] = {"train_gpt", "--num-layers", "four"};
        parse_job j = {3, argv, 0};
        const char *w[] = {"error:", "--num-layers", "integer", "four", NULL};
        expect_child("bad integer", child_parse, &j, 1, w);
    }
    {   // heads not divisible by TP
        char *argv[] = {"train_gpt", "--num-attention-heads", "12", "--tensor-model-parallel-size", "5", "--hidden-size", "60"};
        parse_job j = {7, argv, 1};
        const char *w[] = {"error:", "--num-attention-heads 12", "not divisible", "--tensor-model-parallel-size 5", "hint:", NULL};
        expect_child("heads % TP", child_parse, &j, 1, w);
    }
    {   // layers not divisible by PP
        char *argv[] = {"train_gpt", "--num-layers", "12", "--pipeline-model-parallel-size", "5"};
        parse_job j = {5, argv, 1};
        const char *w[] = {"error:", "--num-layers 12", "not divisible", "--pipeline-model-parallel-size 5", "hint:", NULL};
        expect_child("layers % PP", child_parse, &j, 1, w);
    }
    {   // global batch not divisible by micro x DP (DP = 2)
        char *argv[] = {"train_gpt", "--micro-batch-size", "4", "--nproc-per-node", "2", "--global-batch-size", "10"};
        parse_job j = {7, argv, 1};
        const char *w[] = {"error:", "--global-batch-size 10", "not divisible", "hint:", NULL};
        expect_child("global batch % (micro x DP)", child_parse, &j, 1, w);
    }
    {   // a good layout parses and derives without exiting (so the failures above are the layouts)
        char *argv[] = {"train_gpt", "--num-attention-heads", "12", "--tensor-model-parallel-size", "4", "--num-layers", "12",
                        "--pipeline-model-parallel-size", "3", "--nproc-per-node", "24", "--micro-batch-size", "4",
                        "--global-batch-size", "16"};
        parse_job j = {15, argv, 1};
        const char *w[] = {NULL};
        expect_child("good layout", child_parse, &j, 77, w);
    }
}

// an unknown key in a config file exits 1 and names the nearest known key, spelled as a key
// (with '_', as the --config help and the file itself spell keys)
MT_TEST(config_json_unknown_key) {
    char p[600];
    path_in_tmp(p, sizeof p, "badkey.json");
    write_text(p, "{\n  \"num_layers\": 2,\n  \"hidden_sise\": 64\n}\n");
    char *argv[] = {"train_gpt", "--config", p};
    parse_job j = {3, argv, 0};
    const char *w[] = {"error:", "badkey.json:3", "hidden_sise", "\"hidden_size\"", NULL};
    expect_child("unknown config key", child_parse, &j, 1, w);
}

MT_TEST(config_help) {
    char *argv[] = {"train_gpt", "--help"};
    parse_job j = {2, argv, 0};
    const char *w[] = {"usage", "model:", "parallel:", "training:", "data:", "checkpointing:", "--tensor-model-parallel-size",
                       "--data-path", "--lr-warmup-fraction", NULL};
    expect_child("--help", child_parse, &j, 0, w);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/mt_test_data_XXXXXX");
    if (!mkdtemp(tmpdir)) { perror("mkdtemp"); return 2; }
    mt_run_test(indexed_dataset_uint16);
    mt_run_test(indexed_dataset_int32);
    mt_run_test(indexed_builder_abort_leaves_nothing);
    mt_run_test(indexed_dataset_corrupt_files);
    mt_run_test(split_documents);
    mt_run_test(split_documents_round_half_even);
    mt_run_test(gpt_dataset_one_epoch);
    mt_run_test(gpt_dataset_several_epochs);
    mt_run_test(blended_datasets);
    mt_run_test(mock_dataset);
    mt_run_test(lr_schedule);
    mt_run_test(lr_warmup_fraction_fractional_steps);
    mt_run_test(config_flags);
    mt_run_test(config_json_file);
    mt_run_test(config_json_file_equals_form);
    mt_run_test(config_errors);
    mt_run_test(config_json_unknown_key);
    mt_run_test(config_help);
    remove_tmpdir();
    return mt_test_summary();
}

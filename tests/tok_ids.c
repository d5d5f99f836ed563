/* tests/tok_ids.c - megatron.h's GPT-2 tokenizer as a command, for tests/tiktoken_fuzz.py.
 *
 *   tests/tok_ids [--vocab V] [--merges M] FILE
 *       FILE holds texts as records "LENGTH\n" + LENGTH raw bytes (any bytes at all).
 *       Prints one line per text: its ids separated by spaces (an empty line for no ids).
 *       Also checks decode(encode(text)) == text; a failure prints "ROUNDTRIP-FAIL i" on
 *       stderr and the exit status is 2.
 *   tests/tok_ids --bench [--workers N] [--repeat R] FILE
 *       encodes every text of FILE with N threads (each its own cache, the texts split into
 *       N contiguous runs of about equal bytes), R times, and prints the best run as
 *       "workers N bytes B tokens T seconds S MB/s X tokens/s Y".
 *
 * build: cc -O2 -I. -o tests/tok_ids tests/tok_ids.c -lm -pthread
 */
#define MEGATRON_IMPLEMENTATION
#include "../megatron.h"

typedef struct {
    char **text;
    size_t *len;
    size_t n;
} texts;

static texts read_records(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) mt_fatal("cannot open %s: %s", path, strerror(errno));
    texts t = {NULL, NULL, 0};
    size_t cap = 0;
    for (;;) {
        unsigned long long n;
        int r = fscanf(f, "%llu", &n);
        if (r != 1) break;
        if (fgetc(f) != '\n') mt_fatal("%s: record %zu: expected a newline after the length", path, t.n);
        if (t.n == cap) {
            cap = cap ? 2 * cap : 1024;
            t.text = (char **)mt_realloc(t.text, cap * sizeof(char *), "texts");
            t.len = (size_t *)mt_realloc(t.len, cap * sizeof(size_t), "texts");
        }
        char *s = (char *)mt_malloc((size_t)n + 1, "text");
        if (fread(s, 1, (size_t)n, f) != (size_t)n) mt_fatal("%s: record %zu is truncated", path, t.n);
        s[n] = '\0';
        t.text[t.n] = s;
        t.len[t.n] = (size_t)n;
        t.n++;
    }
    fclose(f);
    return t;
}

typedef struct {
    const mt_tokenizer *tok;
    const texts *in;
    size_t lo, hi;      /* texts [lo, hi) */
    size_t tokens;
} bench_job;

static void *bench_worker(void *arg) {
    bench_job *j = (bench_job *)arg;
    mt_bpe_cache cache = {0};
    mt_int_list ids = {0};
    j->tokens = 0;
    for (size_t i = j->lo; i < j->hi; i++) {
        ids.len = 0;
        j->tokens += mt_tokenizer_encode(j->tok, &cache, j->in->text[i], j->in->len[i], &ids);
    }
    mt_int_list_free(&ids);
    mt_bpe_cache_free(&cache);
    return NULL;
}

int main(int argc, char **argv) {
    const char *vocab = "data/gpt2-vocab.json", *merges = "data/gpt2-merges.txt", *file = NULL;
    int bench = 0, workers = 1, repeat = 3;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--vocab") && i + 1 < argc) vocab = argv[++i];
        else if (!strcmp(argv[i], "--merges") && i + 1 < argc) merges = argv[++i];
        else if (!strcmp(argv[i], "--bench")) bench = 1;
        else if (!strcmp(argv[i], "--workers") && i + 1 < argc) workers = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--repeat") && i + 1 < argc) repeat = atoi(argv[++i]);
        else if (argv[i][0] != '-' && !file) file = argv[i];
        else mt_fatal("unknown argument %s\nhint: tests/tok_ids [--bench [--workers N] [--repeat R]] FILE", argv[i]);
    }
    if (!file) mt_fatal("no input file\nhint: tests/tok_ids [--bench [--workers N] [--repeat R]] FILE");
    if (workers < 1) workers = 1;
    mt_tokenizer tok;
    mt_tokenizer_load(&tok, vocab, merges);
    texts in = read_records(file);

    if (!bench) {
        mt_bpe_cache cache = {0};
        mt_int_list ids = {0};
        size_t cap = 1024;
        char *back = (char *)mt_malloc(cap, "decoded text");
        int bad = 0;
        for (size_t i = 0; i < in.n; i++) {
            ids.len = 0;
            mt_tokenizer_encode(&tok, &cache, in.text[i], in.len[i], &ids);
            for (size_t k = 0; k < ids.len; k++) printf(k ? " %d" : "%d", (int)ids.data[k]);
            printf("\n");
            size_t n = mt_tokenizer_decode(&tok, ids.data, ids.len, back, cap);
            if (n >= cap) {
                cap = 2 * n + 1;
                back = (char *)mt_realloc(back, cap, "decoded text");
                n = mt_tokenizer_decode(&tok, ids.data, ids.len, back, cap);
            }
            if (n != in.len[i] || memcmp(back, in.text[i], n) != 0) { fprintf(stderr, "ROUNDTRIP-FAIL %zu\n", i); bad = 1; }
        }
        return bad ? 2 : 0;
    }

    /* split the texts into `workers` runs of about equal bytes */
    size_t total = 0;
    for (size_t i = 0; i < in.n; i++) total += in.len[i];
    bench_job *jobs = (bench_job *)mt_calloc((size_t)workers, sizeof(bench_job), "jobs");
    pthread_t *th = (pthread_t *)mt_calloc((size_t)workers, sizeof(pthread_t), "threads");
    size_t i = 0, acc = 0;
    for (int w = 0; w < workers; w++) {
        jobs[w].tok = &tok;
        jobs[w].in = &in;
        jobs[w].lo = i;
        size_t goal = total / (size_t)workers * (size_t)(w + 1);
        while (i < in.n && (acc < goal || w == workers - 1)) acc += in.len[i++];
        jobs[w].hi = i;
    }
    double best = 1e30;
    size_t tokens = 0;
    for (int r = 0; r < repeat; r++) {
        double t0 = mt_time_seconds();
        for (int w = 0; w < workers; w++) pthread_create(&th[w], NULL, bench_worker, &jobs[w]);
        tokens = 0;
        for (int w = 0; w < workers; w++) { pthread_join(th[w], NULL); tokens += jobs[w].tokens; }
        double s = mt_time_seconds() - t0;
        if (s < best) best = s;
    }
    printf("workers %d bytes %zu tokens %zu seconds %.4f MB/s %.2f tokens/s %.0f\n", workers, total, tokens, best,
           (double)total / best / 1e6, (double)tokens / best);
    return 0;
}

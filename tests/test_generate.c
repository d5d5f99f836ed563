/* tests/test_generate.c - generation (§11): the KV cache, sampling, the generation mode's files,
 * the Hugging Face import (§10).
 *
 * 1. cached decoding (prefill, then one token per step through the KV cache) against the naive
 *    way (the training forward over the whole window for every token), for a batch of prompts of
 *    different lengths, on 1x1, TP=2, PP=2 and TP=2 x PP=2: the same tokens, the same logits
 *    (fp32, 1e-5), and every layout the same tokens as one rank;
 * 2. top-k and top-p draw only from the set a brute-force twin allows (on fixed logits), and
 *    about as often as its renormalised probabilities say;
 * 3. the trainer's generation mode: --sample-input-file in, --sample-output-file (JSON lines)
 *    out, read back; the same file from TP=2 x PP=2; a shape flag that disagrees is one line;
 * 4. export to Hugging Face and import back: the same bits, for another TP x PP.
 *
 * ./tests/test_generate --draw-check HF_DIR [fp32|bf16] [TP]: the device's draws against the host's
 *   (tests/gpu/test_generate.sh; TP ranks, default 1)
 * ./tests/test_generate --hf-logits HF_DIR TOKENS OUT [TP] [bf16] (used by tests/check_hf_import.py,
 * make test-ref, and by tests/gpu/test_generate.sh through the GPU build of this file): imports
 * HF_DIR for TP ranks (default 2), decodes the tokens (int32, the first is the count) one per step
 * through the KV cache and writes the logits of every position, then those of the last position
 * after one prefill of them all (float32, (T+1, V)) to OUT.
 */
#define MEGATRON_IMPLEMENTATION
#include "../megatron.h"
#include "harness.h"
#include <sys/wait.h>

// the GPU build (tests/gpu/test_generate_cuda) runs a rank per GPU: a layout of more ranks than
// this machine has GPUs is SKIPPED there, never passed; the CPU build runs ranks as threads
#ifdef __CUDACC__
static int ranks_possible(void) {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}
#else
static int ranks_possible(void) { return 1 << 20; }
#endif
static int layout_skipped(int tp, int pp) {
    if (tp * pp <= ranks_possible()) return 0;
    printf("  SKIPPED TP=%d PP=%d: needs %d GPUs, this machine has %d\n", tp, pp, tp * pp, ranks_possible());
    return 1;
}

// a small model; dropout off (generation never drops, the uncached forward must not either);
// bf16: with --bf16 (section 1's last test)
static void small_config(mt_config *cfg, int tp, int pp, int V, int maxT, int bf16) {
    mt_config_defaults(cfg);
    cfg->train.bf16 = bf16;
    cfg->model.num_layers = 4;
    cfg->model.hidden_size = 64;          // head size 16: the smallest the GPU's training attention runs
    cfg->model.num_attention_heads = 4;
    cfg->model.seq_length = maxT;
    cfg->model.vocab_size = V;
    cfg->model.hidden_dropout = cfg->model.attention_dropout = 0.0f;
    cfg->model.init_method_std = 0.2f;   // large weights: peaked logits, so top-k/top-p matter
    cfg->parallel.tensor_model_parallel_size = tp;
    cfg->parallel.pipeline_model_parallel_size = pp;
    cfg->train.micro_batch_size = 1;     // the uncached reference runs one sequence at a time
    cfg->train.train_iters = 1;
    cfg->train.seed = 7;
    mt_config_derive(cfg);
}

// ---------------------------------------------------------------------------------------------
// 1. cached == uncached, in every layout
#define NSEQ 3
#define NEW 8
static const int prompt_lens[NSEQ] = {1, 6, 11};
typedef struct {
    mt_config *cfg;
    mt_sampling sampling;
    int32_t tokens[NSEQ * NEW];   // cached, from the logger rank
    int counts[NSEQ];
    int32_t uncached[NSEQ * NEW];
    int logits_ok, logits_checked;
    double max_rel;
    int stop_count, stopped;      // the position limit: tokens of a prompt that fills the cache
    int argmax_same;              // the tokens again without logits asked for: the same
    int eod_same;                 // and with an end token that ends sequences at different steps: cut there
    int steps_timed;              // that call's decode steps (NEW - 1), each timed
    double step_min, step_median; //   their latencies (the report's), the least and the median
} cache_job;

static void prompt_ids(int i, int32_t *ids, int V) {
    for (int t = 0; t < prompt_lens[i]; t++) ids[t] = (int32_t)(mt_hash64((uint64_t)(100 * i + t)) % (uint64_t)V);
}

static void cache_rank(mt_world *w, int rank, void *arg) {
    cache_job *j = (cache_job *)arg;
    int V = j->cfg->model.vocab_size, maxT = j->cfg->model.max_position_embeddings;
    mt_rank r;
    mt_rank_init(&r, j->cfg, w, rank);   // the same weights in every layout (counter-based init)
    int32_t prompts_mem[NSEQ][16];
    const int32_t *prompts[NSEQ];
    for (int i = 0; i < NSEQ; i++) { prompt_ids(i, prompts_mem[i], V); prompts[i] = prompts_mem[i]; }
    mt_generator g;
    mt_generator_init(&r, &g, NSEQ, NSEQ * 11, 11 + NEW);
    mt_generate_request q;
    memset(&q, 0, sizeof q);
    int32_t tokens[NSEQ * NEW];
    int counts[NSEQ];
    float *logits = (float *)calloc((size_t)NSEQ * NEW * V, sizeof(float));
    q.n = NSEQ;
    q.prompts = prompts;
    q.prompt_lens = prompt_lens;
    q.max_new_tokens = NEW;
    q.sampling = j->sampling;
    q.eod = -1;
    q.logits = logits;
    q.tokens = tokens;
    q.counts = counts;
    mt_generate_batch(&r, &g, &q);
    // without logits asked for, the device picks the tokens (TP = 1): the argmax op, or the sampling op
    // (mt_sample_rows: on the GPU build, kernels; on the CPU, mt_sample_row_cpu): the same tokens
    int32_t tokens2[NSEQ * NEW];
    int counts2[NSEQ];
    // Each decode step's latency is timed (the report's median and p90): at TP = PP = 1 the steps are
    // queued ahead, and on the CPU build a queued step runs at once, before the host reads the step
    // ahead of it; every step still gets its own time, none two and none nothing
    double step_seconds[NEW];
    q.logits = NULL;
    q.tokens = tokens2;
    q.counts = counts2;
    q.step_seconds = step_seconds;
    mt_generate_batch(&r, &g, &q);
    q.step_seconds = NULL;
    if (rank == j->cfg->world_size - 1) {
        j->argmax_same = memcmp(tokens, tokens2, sizeof tokens) == 0;
        j->steps_timed = q.steps;
        double sorted[NEW];
        memcpy(sorted, step_seconds, sizeof(double) * (size_t)q.steps);
        for (int a = 1; a < q.steps; a++)   // insertion sort: a handful of values
            for (int b = a; b > 0 && sorted[b - 1] > sorted[b]; b--) {
                double x = sorted[b]; sorted[b] = sorted[b - 1]; sorted[b - 1] = x;
            }
        j->step_min = q.steps ? sorted[0] : 0;
        j->step_median = q.steps ? sorted[(q.steps - 1) / 2] : 0;
    }
    // the same with an end token: sequence 1's third token, so that sequence 1 ends after 3 tokens and
    // the others where it first appears in theirs (or not at all). At TP = PP = 1 the device's steps
    // are queued ahead (megatron.h, mt_generate_batch): the steps past a sequence's end are ignored
    q.eod = tokens[1 * NEW + 2];
    mt_generate_batch(&r, &g, &q);
    int eod_same = 1;
    for (int i = 0; i < NSEQ; i++) {
        int want = NEW;
        for (int k = 0; k < NEW; k++)
            if (tokens[i * NEW + k] == q.eod) { want = k + 1; break; }
        if (counts2[i] != want || memcmp(tokens2 + i * NEW, tokens + i * NEW, sizeof(int32_t) * (size_t)want) != 0)
            eod_same = 0;
    }
    if (rank == j->cfg->world_size - 1) j->eod_same = eod_same && counts2[1] <= 3;
    q.eod = -1;
    q.tokens = tokens;
    q.counts = counts;
    mt_generator_free(&g);
    // the naive way, one sequence at a time, the same random numbers (sequence i, position n)
    float *ref = (float *)calloc((size_t)NEW * V, sizeof(float));
    int logger = rank == j->cfg->world_size - 1;   // a last-stage rank: it has the logits
    for (int i = 0; i < NSEQ; i++) {
        int32_t ids[32];
        memcpy(ids, prompts[i], sizeof(int32_t) * (size_t)prompt_lens[i]);
        int n = mt_generate_uncached(&r, ids, prompt_lens[i], prompt_lens[i] + NEW, NEW, &j->sampling, (uint64_t)i,
                                     ref);
        if (!logger) continue;
        memcpy(j->uncached + i * NEW, ids + prompt_lens[i], sizeof(int32_t) * (size_t)(n - prompt_lens[i]));
        // compare the logits of every step both took the same token at
        for (int k = 0; k < counts[i]; k++) {
            const float *got = logits + ((size_t)i * NEW + k) * V, *want = ref + (size_t)k * V;
            double maxabs = 0, maxdiff = 0;
            for (int v = 0; v < V; v++) {
                if (fabs(want[v]) > maxabs) maxabs = fabs(want[v]);
                if (!(fabs(got[v] - want[v]) <= maxdiff)) maxdiff = fabs(got[v] - want[v]);
            }
            double rel = maxdiff / (maxabs > 0 ? maxabs : 1);
            if (rel > j->max_rel || rel != rel) j->max_rel = rel;
            j->logits_checked++;
            if (tokens[i * NEW + k] != j->uncached[i * NEW + k]) break;   // later steps continue different texts
        }
    }
    if (logger) {
        memcpy(j->tokens, tokens, sizeof tokens);
        memcpy(j->counts, counts, sizeof counts);
    }
    // the last position: a prompt of maxT - 2 tokens gets 3 (at positions maxT-2, maxT-1, maxT), then stops
    mt_generator_init(&r, &g, 1, maxT, maxT);
    int32_t long_prompt[64];
    for (int t = 0; t < maxT - 2; t++) long_prompt[t] = t % V;
    const int32_t *lp[1] = {long_prompt};
    int lp_len = maxT - 2, c = 0;
    mt_generate_request q2;
    memset(&q2, 0, sizeof q2);
    q2.n = 1; q2.prompts = lp; q2.prompt_lens = &lp_len; q2.max_new_tokens = NEW; q2.sampling = j->sampling;
    q2.eod = -1; q2.tokens = tokens; q2.counts = &c;
    mt_generate_batch(&r, &g, &q2);
    mt_generator_free(&g);
    if (logger) { j->stop_count = c; j->stopped = q2.stopped_at_max_positions; }
    free(logits);
    free(ref);
    mt_rank_free(&r);
}

static int run_cache_job(cache_job *j, int tp, int pp, const mt_sampling *s, int bf16) {
    static mt_config cfg;
    small_config(&cfg, tp, pp, 101, 32, bf16);
    memset(j, 0, sizeof *j);
    j->cfg = &cfg;
    j->sampling = *s;
    mt_world *w = mt_world_create(cfg.world_size);
    int rc = mt_world_run(w, cache_rank, j);
    mt_world_destroy(w);
    return rc;
}

MT_TEST(cached_decoding_matches_the_uncached_forward_in_every_layout) {
    const int layouts[4][2] = {{1, 1}, {2, 1}, {1, 2}, {2, 2}};
    mt_sampling modes[2] = {{0.0f, 0, 0.0f, 11}, {0.9f, 20, 0.9f, 11}};   // greedy; temperature + top-k + top-p
    for (int m = 0; m < 2; m++) {
        cache_job one;
        for (int k = 0; k < 4; k++) {
            if (layout_skipped(layouts[k][0], layouts[k][1])) continue;
            cache_job j;
            mt_expect(run_cache_job(&j, layouts[k][0], layouts[k][1], &modes[m], 0) == 0, "the world failed");
            // cached and uncached: fp32 with the same summation order for every row; 1e-5 allows the
            // TP all-reduces' different grouping of the partial sums of the projections
            mt_expect(j.max_rel <= 1e-5, "TP=%d PP=%d mode %d: logits differ from the uncached forward by %.2e",
                      layouts[k][0], layouts[k][1], m, j.max_rel);
            mt_expect(j.logits_checked >= NSEQ * NEW, "compared %d rows of logits", j.logits_checked);
            mt_expect(memcmp(j.tokens, j.uncached, sizeof j.tokens) == 0,
                      "TP=%d PP=%d mode %d: cached tokens differ from the uncached ones", layouts[k][0], layouts[k][1],
                      m);
            for (int i = 0; i < NSEQ; i++) mt_expect(j.counts[i] == NEW, "sequence %d got %d tokens", i, j.counts[i]);
            mt_expect(j.argmax_same, "TP=%d PP=%d mode %d: the tokens differ when no logits are asked for", layouts[k][0],
                      layouts[k][1], m);
            // the same work every step: a step timed at a quarter of the median is a step timed
            // without its work (a slow step, the machine busy, only raises the figures)
            mt_expect(j.steps_timed == NEW - 1 && j.step_min > 0.25 * j.step_median,
                      "TP=%d PP=%d mode %d: %d decode steps timed, the fastest %.3g ms against a median of %.3g ms",
                      layouts[k][0], layouts[k][1], m, j.steps_timed, 1e3 * j.step_min, 1e3 * j.step_median);
            mt_expect(j.eod_same, "TP=%d PP=%d mode %d: with an end token the sequences are not the same tokens cut "
                      "after it", layouts[k][0], layouts[k][1], m);
            mt_expect(j.stop_count == 3 && j.stopped == 1, "the prompt that fills the cache got %d tokens (stopped %d)",
                      j.stop_count, j.stopped);
            if (k == 0) one = j;
            else mt_expect(memcmp(j.tokens, one.tokens, sizeof j.tokens) == 0,
                           "TP=%d PP=%d samples other tokens than one rank", layouts[k][0], layouts[k][1]);
            printf("  TP=%d PP=%d %s: tokens as uncached and as 1x1, logits max rel diff %.2e over %d rows\n",
                   layouts[k][0], layouts[k][1], m ? "sampled" : "greedy", j.max_rel, j.logits_checked);
        }
    }
}

// --bf16: the uncached forward's logits are the LM head's as training keeps them, rounded to bf16
// (on the GPU stored in 16 bits and widened on the host, mt_generate_uncached; on the CPU rounded in
// fp32), against cached decoding's fp32 head output from the same bf16 operands: bf16 rounding of
// values up to the row's max, 2^-8 of it, and the two paths' other roundings: 3e-2, as
// tests/gpu/test_generate.sh holds bf16 decoding against the CPU
MT_TEST(bf16_uncached_forward_matches_cached_decoding) {
    const int layouts[2][2] = {{1, 1}, {2, 1}};
    mt_sampling greedy = {0.0f, 0, 0.0f, 11};
    for (int k = 0; k < 2; k++) {
        if (layout_skipped(layouts[k][0], layouts[k][1])) continue;
        cache_job j;
        mt_expect(run_cache_job(&j, layouts[k][0], layouts[k][1], &greedy, 1) == 0, "the world failed");
        mt_expect(j.max_rel <= 3e-2, "bf16, TP=%d: logits differ from the uncached forward by %.2e", layouts[k][0],
                  j.max_rel);
        mt_expect(j.logits_checked >= NSEQ, "compared %d rows of logits", j.logits_checked);
        printf("  bf16 TP=%d: logits max rel diff %.2e over %d rows\n", layouts[k][0], j.max_rel, j.logits_checked);
    }
}

// ---------------------------------------------------------------------------------------------
// 2. top-k and top-p against a brute-force twin on fixed logits
// the twin: rank every token by (logit desc, id asc) by counting, keep the k best, then the
// shortest head of them whose probability (after temperature, renormalised) reaches p
static void allowed_set(const float *logits, int V, const mt_sampling *s, int *allowed, double *prob) {
    int order[64];
    for (int v = 0; v < V; v++) {
        int rank = 0;
        for (int u = 0; u < V; u++)
            if (logits[u] > logits[v] || (logits[u] == logits[v] && u < v)) rank++;
        order[rank] = v;
    }
    int keep = s->top_k > 0 && s->top_k < V ? s->top_k : V;
    double z[64], total = 0;
    for (int i = 0; i < keep; i++) { z[i] = exp(((double)logits[order[i]] - logits[order[0]]) / s->temperature);
                                     total += z[i]; }
    int n = keep;
    if (s->top_p > 0 && s->top_p < 1) {
        double cum = 0;
        n = 0;
        for (int i = 0; i < keep; i++) {
            if (i > 0 && cum / total > s->top_p) break;
            cum += z[i];
            n++;
        }
        total = cum;
    }
    for (int v = 0; v < V; v++) { allowed[v] = 0; prob[v] = 0; }
    for (int i = 0; i < n; i++) { allowed[order[i]] = 1; prob[order[i]] = z[i] / total; }
}

// sampling's order of the candidates (a radix sort on the logits' bits) against a comparison sort
// with the rule it must follow: larger logit first, equal logits (-0 and +0 among them) by smaller id
static int candidate_order(const void *a, const void *b) {
    const mt__candidate *x = (const mt__candidate *)a, *y = (const mt__candidate *)b;
    if (x->logit != y->logit) return x->logit > y->logit ? -1 : 1;
    return x->id - y->id;
}
MT_TEST(candidates_are_ordered_as_a_comparison_sort_orders_them) {
    const int V = 50257;   // GPT-2's vocabulary
    mt__candidate *got = (mt__candidate *)mt_malloc(sizeof(mt__candidate) * V, "test");
    mt__candidate *want = (mt__candidate *)mt_malloc(sizeof(mt__candidate) * V, "test");
    float *logits = (float *)mt_malloc(sizeof(float) * V, "test");
    uint64_t *buf = (uint64_t *)mt_malloc(sizeof(uint64_t) * 2 * V, "test");
    for (int round = 0; round < 3; round++) {
        for (int v = 0; v < V; v++) {
            uint64_t h = mt_hash64((uint64_t)v * 3 + (uint64_t)round);
            float logit = round == 0 ? (float)((int)(h % 2001) - 1000) / 64.0f       // many ties, both signs
                        : round == 1 ? (float)((double)(h >> 11) / 9007199254740992.0 * 40.0 - 20.0)
                                     : (float)((int)(h % 5) - 2) * 1e-30f;           // tiny values, ties
            if (h % 97 == 0) logit = (h & 1) ? -0.0f : 0.0f;                          // signed zeros
            logits[v] = want[v].logit = logit;
            want[v].id = v;
        }
        qsort(want, (size_t)V, sizeof *want, candidate_order);
        mt__sort_candidates(logits, V, got, buf);
        int same = 1;
        for (int v = 0; v < V; v++) same &= got[v].id == want[v].id;
        mt_expect(same, "round %d: the radix order differs from the comparison sort's", round);
    }
    free(got);
    free(want);
    free(logits);
    free(buf);
}

MT_TEST(top_k_and_top_p_sample_only_the_allowed_tokens) {
    const int V = 40;
    float logits[40];
    for (int v = 0; v < V; v++) logits[v] = (float)((int)(mt_hash64((uint64_t)v) % 50)) / 10.0f;   // ties included
    mt_sampling cases[] = {{1.0f, 5, 0.0f, 3}, {1.0f, 0, 0.5f, 3}, {0.7f, 10, 0.8f, 3}, {2.0f, 0, 0.9f, 3},
                           {1.0f, 1, 0.0f, 3}, {1.0f, 0, 1.0f, 3}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int allowed[40], hits[40] = {0};
        double prob[40];
        allowed_set(logits, V, &cases[c], allowed, prob);
        const int draws = 20000;
        int outside = 0;
        for (int i = 0; i < draws; i++) {
            int t = mt_sample_token(logits, V, &cases[c], 5, (uint64_t)i);
            if (t < 0 || t >= V || !allowed[t]) outside++;
            else hits[t]++;
        }
        mt_expect(outside == 0, "case %zu: %d draws outside the allowed set", c, outside);
        // frequencies: 20000 draws give a standard error below 0.0036; 0.02 is over 5 of them
        double worst = 0;
        for (int v = 0; v < V; v++) {
            double d = fabs((double)hits[v] / draws - prob[v]);
            if (d > worst) worst = d;
        }
        mt_expect(worst < 0.02, "case %zu: a frequency is %.3f off its probability", c, worst);
        int n = 0;
        for (int v = 0; v < V; v++) n += allowed[v];
        printf("  temperature %.1f top-k %d top-p %.1f: %d allowed tokens, frequencies within %.3f\n",
               (double)cases[c].temperature, cases[c].top_k, (double)cases[c].top_p, n, worst);
        // the same seed, the same token; another seed, other tokens somewhere
        int same = 1, differ = 0;
        mt_sampling other = cases[c];
        other.seed = 4;
        for (int i = 0; i < 200; i++) {
            same &= mt_sample_token(logits, V, &cases[c], 5, (uint64_t)i) ==
                    mt_sample_token(logits, V, &cases[c], 5, (uint64_t)i);
            differ |= mt_sample_token(logits, V, &cases[c], 5, (uint64_t)i) !=
                      mt_sample_token(logits, V, &other, 5, (uint64_t)i);
        }
        mt_expect(same && (n == 1 || differ), "case %zu: sampling is not reproducible by --seed", c);
    }
}

// ---------------------------------------------------------------------------------------------
// 3. the generation mode of ./train_gpt: files in and out
#define CK "build/test_generate_ck"
// a checkpoint of a small GPT-2-vocabulary model (random weights), saved by one rank
static void save_rank(mt_world *w, int rank, void *arg) {
    mt_rank r;
    mt_rank_init(&r, (mt_config *)arg, w, rank);
    mt_checkpoint_save(&r, CK, 1, 0);
    mt_rank_free(&r);
}
static void write_checkpoint(void) {
    static mt_config cfg;
    mt_config_defaults(&cfg);
    cfg.model.num_layers = 2;
    cfg.model.hidden_size = 32;
    cfg.model.num_attention_heads = 4;
    cfg.model.seq_length = 48;
    cfg.model.vocab_size = 50257;
    cfg.model.init_method_std = 0.1f;
    cfg.train.train_iters = 1;
    mt_config_derive(&cfg);
    if (system("rm -rf " CK)) {}
    mt_world *w = mt_world_create(1);
    mt_world_run(w, save_rank, &cfg);
    mt_world_destroy(w);
}

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) { *len = 0; return NULL; }
    char *buf = (char *)malloc(1 << 20);
    *len = fread(buf, 1, (1 << 20) - 1, f);
    buf[*len] = 0;
    fclose(f);
    return buf;
}

MT_TEST(input_and_output_files_round_trip) {
    write_checkpoint();
    const char *prompts[] = {"It is a truth universally acknowledged", "Hello", "\"quoted\" \\ back\tslash",
                             "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", ""};
    int np = 5;
    FILE *f = fopen("build/test_generate_prompts.txt", "wb");
    for (int i = 0; i < np; i++) fprintf(f, "%s\n", prompts[i]);
    fclose(f);
    const char *base = "./train_gpt --load " CK " --vocab-file data/gpt2-vocab.json --merge-file data/gpt2-merges.txt "
                       "--sample-input-file build/test_generate_prompts.txt --out-seq-length 10 --top-p 0.9 "
                       "--temperature 0.8 --micro-batch-size 2 --num-samples 2 --seed 3";
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s --sample-output-file build/test_generate_out.jsonl > build/test_generate.log 2>&1",
             base);
    mt_expect(system(cmd) == 0, "generation failed: %s (see build/test_generate.log)", cmd);
    mt_tokenizer tok;
    mt_tokenizer_load(&tok, "data/gpt2-vocab.json", "data/gpt2-merges.txt");
    size_t len;
    char *out = slurp("build/test_generate_out.jsonl", &len);
    mt_expect(out != NULL, "no output file");
    int lines = 0;
    for (char *line = out; out && line < out + len && *line; lines++) {
        char *end = strchr(line, '\n');
        if (!end) break;
        *end = 0;
        mt_json j;
        char text[4096];
        size_t tlen = 0;
        long long ids[64], prompt_ids[64];
        mt_json_init(&j, line, strlen(line), 0);
        int ok = mt_json_find(&j, "prompt") && mt_json_string_at(&j, text, &tlen);
        int i = lines / 2;   // --num-samples 2: each prompt twice
        mt_expect(ok && i < np && tlen == strlen(prompts[i]) && memcmp(text, prompts[i], tlen) == 0,
                  "line %d: the prompt did not come back: %s", lines, line);
        mt_json_init(&j, line, strlen(line), 0);
        int n = mt_json_find(&j, "tokens") ? mt_json_ints(&j, ids, 64) : -1;
        mt_json_init(&j, line, strlen(line), 0);
        int np_ids = mt_json_find(&j, "prompt_tokens") ? mt_json_ints(&j, prompt_ids, 64) : -1;
        mt_expect(n >= 1 && n <= 10, "line %d: %d tokens", lines, n);
        mt_int_list enc = {NULL, 0, 0};
        mt_tokenizer_encode(&tok, NULL, prompts[i], strlen(prompts[i]), &enc);
        if (enc.len == 0) mt_int_list_push(&enc, tok.eod_id);   // an empty line: unconditional
        int same = np_ids == (int)enc.len;
        for (int k = 0; same && k < np_ids; k++) same = prompt_ids[k] == enc.data[k];
        mt_expect(same, "line %d: prompt_tokens are not the prompt's ids", lines);
        mt_int_list_free(&enc);
        // text == decode(tokens) whenever that is valid UTF-8 (else the writer put U+FFFD in)
        int32_t id32[64];
        for (int k = 0; k < n; k++) id32[k] = (int32_t)ids[k];
        char dec[4096];
        size_t dlen = n > 0 ? mt_tokenizer_decode(&tok, id32, (size_t)n, dec, sizeof dec) : 0;
        int valid = 1;
        for (size_t p = 0; p < dlen;) {
            uint32_t cp;
            int l = mt_utf8_decode(dec + p, dlen - p, &cp);
            if (!l) { valid = 0; break; }
            p += (size_t)l;
        }
        mt_json_init(&j, line, strlen(line), 0);
        ok = mt_json_find(&j, "text") && mt_json_string_at(&j, text, &tlen);
        mt_expect(ok && (!valid || (tlen == dlen && memcmp(text, dec, dlen) == 0)), "line %d: text is not the tokens'",
                  lines);
        line = end + 1;
    }
    mt_expect(lines == 2 * np, "%d lines in the output, want %d", lines, 2 * np);
    free(out);
    mt_tokenizer_free(&tok);
    // the same file from TP=2 x PP=2 (the checkpoint re-cut in memory), and from standard input
    snprintf(cmd, sizeof cmd, "%s --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 "
             "--sample-output-file build/test_generate_out22.jsonl > build/test_generate.log 2>&1", base);
    mt_expect(system(cmd) == 0, "generation with TP=2 PP=2 failed");
    size_t l1, l2;
    char *a = slurp("build/test_generate_out.jsonl", &l1), *b = slurp("build/test_generate_out22.jsonl", &l2);
    mt_expect(a && b && l1 == l2 && memcmp(a, b, l1) == 0, "TP=2 x PP=2 wrote another file than one rank");
    free(a);
    free(b);
    // a shape flag that disagrees with the checkpoint: one line, exit 1
    int rc = system("./train_gpt --load " CK " --num-layers 3 --prompt 1 > build/test_generate.log 2>&1");
    char *err = slurp("build/test_generate.log", &len);
    mt_expect(WIFEXITED(rc) && WEXITSTATUS(rc) == 1 && err && strstr(err, "error: --num-layers 3 disagrees"),
              "a wrong --num-layers: %s", err ? err : "");
    free(err);
    // with Megatron's --use-checkpoint-args it gives way to the checkpoint's, with a note
    rc = system("./train_gpt --load " CK " --num-layers 3 --use-checkpoint-args --prompt 1 --out-seq-length 2 "
                "> build/test_generate.log 2>&1");
    err = slurp("build/test_generate.log", &len);
    mt_expect(rc == 0 && err && strstr(err, "note: --use-checkpoint-args: --num-layers 3 gives way to the checkpoint's 2"),
              "--use-checkpoint-args with a wrong --num-layers: %s", err ? err : "");
    free(err);
    // token ids on standard input (no tokenizer), unconditional samples: both run and report
    rc = system("printf '5 6 7\\n' | ./train_gpt --load " CK " --out-seq-length 4 > build/test_generate.log 2>&1 && "
                "./train_gpt --load " CK " --num-samples 3 --out-seq-length 4 --greedy >> build/test_generate.log 2>&1");
    err = slurp("build/test_generate.log", &len);
    mt_expect(rc == 0 && err && strstr(err, "----- sample 1 of 1 (3 prompt tokens, 4 generated)\n5 6 7 | ") &&
              strstr(err, "sample 3 of 3") && strstr(err, "time to first token") && strstr(err, "p90"),
              "standard input / unconditional runs: %s", err ? err : "");
    free(err);
}

// Megatron's examples/generate_text.sh (its shape flags set to this checkpoint's): unconditional
// samples into --genfile as JSON lines {"text", "length", "finished"} (+ "tokens"), --recompute
// accepted. The samples are the ones --sample-output-file gets from the same run; with a prompt
// --genfile is not written (as in Megatron, where it is for unconditional samples only)
MT_TEST(megatron_generate_text_example_writes_the_genfile) {
    write_checkpoint();
    if (system("rm -f build/test_generate_gen.json build/test_generate_gen_prompt.json")) {}
    const char *base = "./train_gpt --tensor-model-parallel-size 1 --num-layers 2 --hidden-size 32 --load " CK
                       " --num-attention-heads 4 --max-position-embeddings 48 --tokenizer-type GPT2BPETokenizer "
                       "--micro-batch-size 2 --seq-length 48 --out-seq-length 12 --temperature 1.0 "
                       "--vocab-file data/gpt2-vocab.json --merge-file data/gpt2-merges.txt --num-samples 3 "
                       "--top_p 0.9";
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s --genfile build/test_generate_gen.json --recompute > build/test_generate.log 2>&1",
             base);
    mt_expect(system(cmd) == 0, "generation failed: %s (see build/test_generate.log)", cmd);
    size_t len;
    char *log = slurp("build/test_generate.log", &len);
    mt_expect(log && strstr(log, "wrote 3 unconditional samples to build/test_generate_gen.json") &&
              strstr(log, "note: --recompute has no effect here") && !strstr(log, "----- sample"),
              "the run's output: %s", log ? log : "");
    free(log);
    snprintf(cmd, sizeof cmd, "%s --sample-output-file build/test_generate_gen_out.jsonl > build/test_generate.log 2>&1",
             base);
    mt_expect(system(cmd) == 0, "generation failed: %s", cmd);
    mt_tokenizer tok;
    mt_tokenizer_load(&tok, "data/gpt2-vocab.json", "data/gpt2-merges.txt");
    size_t len2;
    char *gen = slurp("build/test_generate_gen.json", &len), *out = slurp("build/test_generate_gen_out.jsonl", &len2);
    mt_expect(gen && out, "no output files");
    int lines = 0;
    char *line = gen, *line2 = out;
    for (; gen && out && line < gen + len && *line; lines++) {
        char *end = strchr(line, '\n'), *end2 = strchr(line2, '\n');
        if (!end || !end2) break;
        *end = 0;
        *end2 = 0;
        mt_json j;
        long long ids[64], ids2[64];
        double length = -1;
        char text[4096];
        size_t tlen = 0;
        mt_json_init(&j, line, strlen(line), 0);
        int n = mt_json_find(&j, "tokens") ? mt_json_ints(&j, ids, 64) : -1;
        mt_json_init(&j, line2, strlen(line2), 0);
        int n2 = mt_json_find(&j, "tokens") ? mt_json_ints(&j, ids2, 64) : -2;
        mt_expect(n >= 1 && n == n2 && memcmp(ids, ids2, sizeof(long long) * (size_t)n) == 0,
                  "sample %d: --genfile and --sample-output-file hold other tokens", lines);
        mt_json_init(&j, line, strlen(line), 0);
        mt_expect(mt_json_find(&j, "length") && mt_json_number(&j, &length) && length == n,
                  "sample %d: length %g, %d tokens", lines, length, n);
        int finished = n > 0 && ids[n - 1] == tok.eod_id;
        mt_expect(strstr(line, finished ? "\"finished\": true" : "\"finished\": false") != NULL,
                  "sample %d: finished is not whether it closed with <|endoftext|>: %s", lines, line);
        // text: the tokens without a closing <|endoftext|>, where they decode to valid UTF-8
        int32_t id32[64];
        for (int k = 0; k < n; k++) id32[k] = (int32_t)ids[k];
        char dec[4096];
        size_t dlen = mt_tokenizer_decode(&tok, id32, (size_t)(n - finished), dec, sizeof dec), p = 0;
        uint32_t cp;
        for (int l; p < dlen && (l = mt_utf8_decode(dec + p, dlen - p, &cp)) > 0;) p += (size_t)l;
        mt_json_init(&j, line, strlen(line), 0);
        mt_expect(mt_json_find(&j, "text") && mt_json_string_at(&j, text, &tlen) &&
                  (p < dlen || (tlen == dlen && memcmp(text, dec, dlen) == 0)), "sample %d: text is not the tokens'",
                  lines);
        line = end + 1;
        line2 = end2 + 1;
    }
    mt_expect(lines == 3, "%d samples in --genfile, want 3", lines);
    free(gen);
    free(out);
    mt_tokenizer_free(&tok);
    // the writer itself on made-up samples: one closed by <|endoftext|> (finished, its text without
    // it), one cut by --out-seq-length
    static mt_config cfg;
    mt_config_defaults(&cfg);
    cfg.train.out_seq_length = 3;
    mt_tokenizer_load(&tok, "data/gpt2-vocab.json", "data/gpt2-merges.txt");
    int32_t made[6] = {15496, 0, tok.eod_id, 15496, 995, 0};   // "Hello!<|endoftext|>", "Hello world!"
    int made_count[2] = {3, 3};
    mt__gen_job job;
    memset(&job, 0, sizeof job);
    job.cfg = &cfg;
    job.tokenizer = &tok;
    job.n = 2;
    job.out = made;
    job.count = made_count;
    job.eod = tok.eod_id;
    mt__gen_write_samples(&job, "build/test_generate_gen.json", 1);
    gen = slurp("build/test_generate_gen.json", &len);
    const char *want = "{\"text\": \"Hello!\", \"length\": 3, \"finished\": true, \"tokens\": [15496, 0, 50256]}\n"
                       "{\"text\": \"Hello world!\", \"length\": 3, \"finished\": false, \"tokens\": [15496, 995, 0]}\n";
    mt_expect(gen && len == strlen(want) && memcmp(gen, want, len) == 0, "--genfile of two made-up samples:\n%s",
              gen ? gen : "");
    free(gen);
    mt_tokenizer_free(&tok);
    // with a prompt: the samples are the prompt's, printed; --genfile is left alone, and the run says so
    snprintf(cmd, sizeof cmd, "%s --prompt Hello --genfile build/test_generate_gen_prompt.json > "
             "build/test_generate.log 2>&1", base);
    mt_expect(system(cmd) == 0, "generation failed: %s", cmd);
    log = slurp("build/test_generate.log", &len);
    mt_expect(log && strstr(log, "is for unconditional samples") && strstr(log, "----- sample 3 of 3") &&
              access("build/test_generate_gen_prompt.json", F_OK) != 0, "a prompt with --genfile: %s", log ? log : "");
    free(log);
}

// the lines after each "----- sample" header of a run's output, \r (a terminal's) dropped
static int sample_texts(char *out, char texts[][256], int cap) {
    int n = 0;
    for (char *p = out; p && (p = strstr(p, "----- sample")) && n < cap; n++) {
        char *nl = strchr(p, '\n');
        if (!nl) break;
        size_t k = 0;
        for (p = nl + 1; *p && *p != '\n' && k < 255; p++)
            if (*p != '\r') texts[n][k++] = *p;
        texts[n][k] = 0;
    }
    return n;
}

// Standard input a terminal and no prompts given: Megatron's interactive loop, one prompt at a
// time ("Context prompt (stop to exit) >>> "; an empty line asks again; "stop" ends). Run under
// script(1), which gives the program a terminal. Prompt k draws as sequence k, so the samples are
// the ones --sample-input-file gives for the same lines (here at TP=2, the other rank waiting)
MT_TEST(a_terminal_gets_one_prompt_at_a_time) {
    if (system("command -v script > /dev/null 2>&1") != 0) {
        printf("  SKIPPED: script(1) (util-linux) is not installed, so no terminal to test with\n");
        return;
    }
    write_checkpoint();
    if (system("rm -f build/test_generate_tty.txt.out")) {}
    FILE *f = fopen("build/test_generate_tty.txt", "wb");
    fprintf(f, "It is a truth universally acknowledged\nMr. Darcy\n");
    fclose(f);
    const char *base = "./train_gpt --load " CK " --vocab-file data/gpt2-vocab.json --merge-file data/gpt2-merges.txt "
                       "--out-seq-length 6 --temperature 0.9 --top_p 0.95 --seed 5";
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s --sample-input-file build/test_generate_tty.txt > build/test_generate.log 2>&1", base);
    mt_expect(system(cmd) == 0, "generation failed: %s", cmd);
    size_t len;
    char *want = slurp("build/test_generate.log", &len);
    // without --sample-output-file the samples are printed and, as Megatron does, also written to
    // the input's name + ".out"
    char *dot_out = slurp("build/test_generate_tty.txt.out", &len);
    int out_lines = 0;
    for (size_t k = 0; dot_out && k < len; k++) out_lines += dot_out[k] == '\n';
    mt_expect(want && strstr(want, "the samples go to build/test_generate_tty.txt.out as well") && out_lines == 2 &&
              strstr(dot_out, "{\"prompt\": \"Mr. Darcy\", \"text\": "), "the default output file: %s",
              dot_out ? dot_out : "(none)");
    free(dot_out);
    snprintf(cmd, sizeof cmd, "printf 'It is a truth universally acknowledged\\n\\nMr. Darcy\\nstop\\n' | "
             "script -qec '%s --tensor-model-parallel-size 2' /dev/null > build/test_generate_tty.log 2>&1", base);
    mt_expect(system(cmd) == 0, "interactive generation failed: %s", cmd);
    char *got = slurp("build/test_generate_tty.log", &len);
    mt_expect(got && strstr(got, "prompts from this terminal") && strstr(got, "Context prompt (stop to exit) >>> ") &&
              strstr(got, "Prompt should not be empty!") && strstr(got, "----- sample 2 (4 prompt tokens") &&
              !strstr(got, "----- sample 3") && strstr(got, "2 sequences in 2 batches"),
              "the terminal session: %s", got ? got : "");
    static char a[4][256], b[4][256];
    int na = want ? sample_texts(want, a, 4) : 0, nb = got ? sample_texts(got, b, 4) : 0;
    mt_expect(na == 2 && nb == 2 && strcmp(a[0], b[0]) == 0 && strcmp(a[1], b[1]) == 0,
              "the terminal's samples are not --sample-input-file's: %d and %d samples", na, nb);
    free(want);
    free(got);
}

// ---------------------------------------------------------------------------------------------
// 4. Hugging Face export then import: the same bits (and another layout on the way back)
MT_TEST(hugging_face_export_import_round_trip_is_bit_exact) {
    write_checkpoint();
    if (system("rm -rf build/test_generate_hf build/test_generate_ck2")) {}
    mt_checkpoint_export_hf(CK, "build/test_generate_hf");
    mt_checkpoint_import_hf("build/test_generate_hf", "build/test_generate_ck2", 2, 2, 0);
    mt__full_checkpoint a, b;
    mt__ckpt_read_full(CK, &a);
    mt__ckpt_read_full("build/test_generate_ck2", &b);
    mt_expect(b.cfg.parallel.tensor_model_parallel_size == 2 && b.cfg.parallel.pipeline_model_parallel_size == 2,
              "the import is not TP=2 x PP=2");
    for (int i = 0; i < MT_NUM_PARAM_TENSORS; i++)
        mt_expect(a.count[i] == b.count[i] && memcmp(a.global[0][i], b.global[0][i], a.count[i] * sizeof(float)) == 0,
                  "tensor %d differs after export and import", i);
    mt__ckpt_free_full(&a);
    mt__ckpt_free_full(&b);
    // and once more out: the same bytes as the first export
    if (system("rm -rf build/test_generate_hf2")) {}
    mt_checkpoint_export_hf("build/test_generate_ck2", "build/test_generate_hf2");
    size_t l1, l2;
    char *x = slurp("build/test_generate_hf/config.json", &l1), *y = slurp("build/test_generate_hf2/config.json", &l2);
    mt_expect(x && y && l1 == l2 && memcmp(x, y, l1) == 0, "config.json differs after a round trip");
    free(x);
    free(y);
    FILE *f1 = fopen("build/test_generate_hf/model.safetensors", "rb"), *f2 = fopen("build/test_generate_hf2/model.safetensors", "rb");
    int same = f1 && f2;
    while (same) {
        int c1 = fgetc(f1), c2 = fgetc(f2);
        if (c1 != c2) same = 0;
        if (c1 == EOF || c2 == EOF) break;
    }
    if (f1) fclose(f1);
    if (f2) fclose(f2);
    mt_expect(same, "model.safetensors differs after export, import, export");
}

// ---------------------------------------------------------------------------------------------
// --hf-logits: the reference's side of make test-ref (tests/check_hf_import.py)
typedef struct { const int32_t *ids; int n; float *out; mt_config *cfg; } logits_job;
static void logits_rank(mt_world *w, int rank, void *arg) {
    logits_job *j = (logits_job *)arg;
    mt_rank r;
    mt_rank_init(&r, j->cfg, w, rank);
    mt_checkpoint_load(&r, j->cfg->train.load, NULL);
    mt_generator g;
    mt_generator_init(&r, &g, 1, 1, j->n);
    int V = j->cfg->model.vocab_size, zero = 0;
    for (int t = 0; t < j->n; t++) {   // one token per step through the cache, as decoding does
        mt_generator_forward(&r, &g, j->ids + t, &t, &zero, 1, 1);
        if (rank == j->cfg->world_size - 1) memcpy(j->out + (size_t)t * V, g.host_logits, sizeof(float) * V);
    }
    mt_generator_free(&g);
    // and the prefill: all n tokens in one pass, the logits of the last (row n of the output)
    mt_generator_init(&r, &g, 1, j->n, j->n);
    int last = j->n - 1;
    mt_generator_forward(&r, &g, j->ids, &zero, &last, 1, j->n);
    if (rank == j->cfg->world_size - 1) memcpy(j->out + (size_t)j->n * V, g.host_logits, sizeof(float) * V);
    mt_generator_free(&g);
    mt_rank_free(&r);
}
// HF_DIR imported into the checkpoint ck for TP ranks, and the config of a run that loads it
// (no dropout; bf16 or fp32): --hf-logits' and --draw-check's model
static void import_for(const char *hf_dir, const char *ck, int tp, int bf16, mt_config *cfg) {
    char cmd[MT_PATH_MAX + 16];
    snprintf(cmd, sizeof cmd, "rm -rf %s", ck);
    if (system(cmd)) {}
    mt_checkpoint_import_hf(hf_dir, ck, tp, 1, 0);
    mt__full_checkpoint full;
    mt__ckpt_read_full(ck, &full);
    *cfg = full.cfg;
    mt__ckpt_free_full(&full);
    cfg->model.hidden_dropout = cfg->model.attention_dropout = 0.0f;
    cfg->train.bf16 = bf16;
    snprintf(cfg->train.load, sizeof cfg->train.load, "%s", ck);
    mt_config_derive(cfg);
}
static int hf_logits(const char *hf_dir, const char *tokens_path, const char *out_path, int tp, int bf16) {
    char ck[MT_PATH_MAX];
    snprintf(ck, sizeof ck, "%s.ck", out_path);   // the imported checkpoint, next to the output
    static mt_config cfg;
    import_for(hf_dir, ck, tp, bf16, &cfg);
    FILE *f = fopen(tokens_path, "rb");
    int32_t n = 0;
    if (!f || fread(&n, 4, 1, f) != 1 || n < 1 || n > cfg.model.max_position_embeddings) return 1;
    int32_t *ids = (int32_t *)malloc(sizeof(int32_t) * (size_t)n);
    if (fread(ids, 4, (size_t)n, f) != (size_t)n) return 1;
    fclose(f);
    logits_job j = {ids, n, (float *)calloc((size_t)(n + 1) * cfg.model.vocab_size, sizeof(float)), &cfg};
    mt_world *w = mt_world_create(cfg.world_size);
    int rc = mt_world_run(w, logits_rank, &j);
    mt_world_destroy(w);
    f = fopen(out_path, "wb");
    fwrite(j.out, sizeof(float), (size_t)(n + 1) * cfg.model.vocab_size, f);
    fclose(f);
    printf("wrote the logits of %d positions, decoded one per step, and of the last position again after a "
           "prefill of all %d (V = %d, TP = %d%s) to %s\n", n, n, cfg.model.vocab_size, tp, bf16 ? ", bf16" : "",
           out_path);
    free(ids);
    free(j.out);
    return rc;
}

// ---------------------------------------------------------------------------------------------
// --draw-check HF_DIR [fp32|bf16] [TP]: the tokens the device draws (a request that wants no logits:
// mt_sample_rows, in the decode step's graph on the GPU build) against those the host draws from
// the same logits (a request that wants them: mt_sample_token), at batch 1 and 3 (prompts of 1, 5
// and 9 tokens), in four draws. The same model, the same kernels, so the same logits: the same
// tokens, every one. Prints an OK / NOT OK line per case (tests/gpu/test_generate.sh counts them).
typedef struct { mt_config *cfg; int failed; } draw_job;
static void draw_rank(mt_world *w, int rank, void *arg) {
    draw_job *j = (draw_job *)arg;
    mt_rank r;
    mt_rank_init(&r, j->cfg, w, rank);
    mt_checkpoint_load(&r, j->cfg->train.load, NULL);
    enum { NEW2 = 40 };
    int V = j->cfg->model.vocab_size, lens[3] = {1, 5, 9};
    int32_t mem[3][9];
    const int32_t *prompts[3];
    for (int i = 0; i < 3; i++) {
        for (int t = 0; t < lens[i]; t++) mem[i][t] = (int32_t)(mt_hash64((uint64_t)(7 * i + t)) % (uint64_t)V);
        prompts[i] = mem[i];
    }
    mt_generator g;
    mt_generator_init(&r, &g, 3, 3 * 9, 9 + NEW2);
    mt_sampling draws[4] = {{0.9f, 0, 0.95f, 7}, {0.8f, 40, 0.0f, 8}, {1.0f, 0, 0.0f, 9}, {0.7f, 20, 0.5f, 10}};
    float *logits = (float *)calloc((size_t)3 * NEW2 * V, sizeof(float));
    for (int m = 0; m < 4; m++)
        for (int B = 1; B <= 3; B += 2) {
            int32_t host[3 * NEW2], device[3 * NEW2];
            int host_n[3], device_n[3];
            mt_generate_request q;
            memset(&q, 0, sizeof q);
            q.n = B; q.prompts = prompts; q.prompt_lens = lens; q.max_new_tokens = NEW2; q.sampling = draws[m];
            q.first_sequence = 3; q.eod = -1;
            q.logits = logits; q.tokens = host; q.counts = host_n;   // the host draws
            mt_generate_batch(&r, &g, &q);
            q.logits = NULL; q.tokens = device; q.counts = device_n;   // the device draws
            mt_generate_batch(&r, &g, &q);
            if (rank != j->cfg->world_size - 1) continue;
            int same = memcmp(host_n, device_n, sizeof(int) * (size_t)B) == 0, first = -1;
            for (int i = 0; i < B * NEW2 && same; i++)
                if (host[i] != device[i]) { same = 0; first = i; }
            printf("%s the device's draws == the host's: temperature %.1f top-k %d top-p %.2f, batch %d, %d tokens%s\n",
                   same ? "OK" : "NOT OK", (double)draws[m].temperature, draws[m].top_k, (double)draws[m].top_p, B,
                   B * NEW2, same ? "" : " (they part)");
            if (!same && first >= 0) printf("  first difference: sequence %d, token %d\n", first / NEW2, first % NEW2);
            j->failed += !same;
        }
    free(logits);
    mt_generator_free(&g);
    mt_rank_free(&r);
}
static int draw_check(const char *hf_dir, int bf16, int tp) {
    static mt_config cfg;
    import_for(hf_dir, "build/draw_check_ck", tp, bf16, &cfg);   // (the run's layout: TP ranks)
    printf("draws at TP=%d%s\n", cfg.world_size, bf16 ? ", bf16" : "");
    draw_job j = {&cfg, 0};
    mt_world *w = mt_world_create(cfg.world_size);
    int rc = mt_world_run(w, draw_rank, &j);
    mt_world_destroy(w);
    return rc || j.failed;
}

int main(int argc, char **argv) {
    if (argc >= 3 && strcmp(argv[1], "--draw-check") == 0)   // [fp32|bf16] [TP, default 1]
        return draw_check(argv[2], argc > 3 && !strcmp(argv[3], "bf16"), argc > 4 ? atoi(argv[4]) : 1);
    if (argc >= 5 && strcmp(argv[1], "--hf-logits") == 0)   // [TP, default 2] [bf16]
        return hf_logits(argv[2], argv[3], argv[4], argc > 5 ? atoi(argv[5]) : 2, argc > 6 && !strcmp(argv[6], "bf16"));
    mt_run_test(cached_decoding_matches_the_uncached_forward_in_every_layout);
    mt_run_test(bf16_uncached_forward_matches_cached_decoding);
    mt_run_test(candidates_are_ordered_as_a_comparison_sort_orders_them);
    mt_run_test(top_k_and_top_p_sample_only_the_allowed_tokens);
    mt_run_test(input_and_output_files_round_trip);
    mt_run_test(megatron_generate_text_example_writes_the_genfile);
    mt_run_test(a_terminal_gets_one_prompt_at_a_time);
    mt_run_test(hugging_face_export_import_round_trip_is_bit_exact);
    return mt_test_summary();
}

/* tests/test_model.c - the whole training path on one rank (§5, §6, §9, §12).
 *
 * A 2-layer, 64-wide GPT trained on a small dataset this test writes in Megatron's indexed
 * format must bring its loss well below where it starts; the trainer program must print
 * Megatron's iteration and validation lines.
 */
#define MEGATRON_IMPLEMENTATION
#include "../megatron.h"
#include "harness.h"
#include <sys/wait.h>

#define TEST_PREFIX "build/test_model_data"

// documents of arithmetic sequences (start, start+k, start+2k, ... mod V): learnable structure
static void write_dataset(const char *prefix, int V, int ndocs) {
    mt_indexed_builder *b = mt_indexed_builder_open(prefix, mt_dtype_for_vocab(V));
    int32_t doc[1000];
    for (int d = 0; d < ndocs; d++) {
        int n = 50 + (int)(mt_hash64((uint64_t)d) % 900);
        int start = (int)(mt_hash64((uint64_t)d + 5000) % (uint64_t)V), k = 1 + d % 3;
        for (int i = 0; i < n; i++) doc[i] = (start + k * i) % V;
        mt_indexed_builder_add_document(b, doc, (size_t)n);
    }
    mt_indexed_builder_finish(b);
}

typedef struct { mt_config *cfg; mt_data *data; float first, last; } job;

static void batch_fn(mt_rank *r, void *ctx, int iteration, int mb, int *tokens, int *targets) {
    mt_data *data = (mt_data *)ctx;
    int B = r->dims.B, T = r->dims.T;
    int32_t sample[65];
    for (int b = 0; b < B; b++) {
        int64_t i = (int64_t)(iteration - 1) * r->cfg->train.global_batch_size + (int64_t)mb * B + b;
        mt_blended_sample(&data->split[0], i, sample);
        for (int t = 0; t < T; t++) { tokens[b * T + t] = sample[t]; targets[b * T + t] = sample[t + 1]; }
    }
}

static void rank_fn(mt_world *w, int rank, void *arg) {
    job *j = (job *)arg;
    mt_rank r;
    mt_rank_init(&r, j->cfg, w, rank);
    double tail = 0;
    for (int it = 1; it <= j->cfg->train.train_iters; it++) {
        mt_step_result res = mt_train_step(&r, batch_fn, j->data, it);
        if (it == 1) j->first = res.loss;
        if (it > j->cfg->train.train_iters - 5) tail += res.loss / 5;
    }
    j->last = (float)tail;
    mt_rank_free(&r);
}

MT_TEST(loss_falls_on_a_small_dataset) {
    write_dataset(TEST_PREFIX, 101, 60);
    mt_config cfg;
    mt_config_defaults(&cfg);
    cfg.model.num_layers = 2;
    cfg.model.hidden_size = 64;
    cfg.model.num_attention_heads = 4;
    cfg.model.seq_length = 64;
    cfg.model.vocab_size = 101;
    cfg.model.hidden_dropout = 0.0f;      // no dropout: the loss must fall fast
    cfg.model.attention_dropout = 0.0f;
    cfg.train.micro_batch_size = 4;
    cfg.train.global_batch_size = 8;
    cfg.train.train_iters = 60;
    cfg.train.lr = 3e-3f;
    cfg.train.lr_warmup_iters = 5;
    cfg.train.num_data_paths = 1;
    strcpy(cfg.train.data_path[0], TEST_PREFIX);
    strcpy(cfg.train.split, "949,50,1");
    mt_config_derive(&cfg);
    mt_data data;
    mt_data_init(&data, &cfg);
    job j = {&cfg, &data, 0, 0};
    mt_world *w = mt_world_create(1);
    mt_expect(mt_world_run(w, rank_fn, &j) == 0, "training failed");
    mt_world_destroy(w);
    mt_data_free(&data);
    printf("  loss %.4f at the start, %.4f at the end (ln V = %.4f)\n", (double)j.first, (double)j.last, log(101.0));
    // a uniform guess costs ln(101) = 4.62; the sequences are predictable from two tokens back,
    // so the loss must fall far below that: to less than half of the start
    mt_expect(j.first > 4.0f && j.first < 5.2f, "initial loss %g is not near ln(V) = 4.62", (double)j.first);
    mt_expect(j.last < 0.5f * j.first, "loss fell only from %g to %g", (double)j.first, (double)j.last);
}

// the trainer prints Megatron's lines (a tutorial's log parser must find its fields)
MT_TEST(trainer_prints_megatron_lines) {
    write_dataset(TEST_PREFIX, 101, 60);
    const char *cmd = "./train_gpt --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 64 "
                      "--max-position-embeddings 64 --micro-batch-size 4 --global-batch-size 8 --train-iters 10 --lr 1e-3 "
                      "--vocab-size 101 --data-path " TEST_PREFIX " --split 949,50,1 --log-interval 5 --eval-interval 10 "
                      "--eval-iters 2 --hidden-dropout 0 --attention-dropout 0 > build/test_model_log.txt 2>&1";
    int rc = system(cmd);
    mt_expect(rc == 0, "./train_gpt failed (rc %d); build it first (make)", rc);
    FILE *f = fopen("build/test_model_log.txt", "r");
    mt_expect(f != NULL, "no log");
    if (!f) return;
    char line[4096];
    int iteration_lines = 0, validation_lines = 0;
    const char *fields[] = {"consumed samples:", "elapsed time per iteration (ms):", "learning rate:", "global batch size:",
                            "lm loss:", "loss scale:", "grad norm:", "number of skipped iterations:", "number of nan iterations:"};
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, " iteration ", 11) == 0) {
            iteration_lines++;
            for (size_t k = 0; k < sizeof fields / sizeof fields[0]; k++)
                mt_expect(strstr(line, fields[k]) != NULL, "iteration line lacks '%s': %s", fields[k], line);
            mt_expect(strstr(line, "/      10 |") != NULL, "iteration line does not show iteration/total: %s", line);
        }
        if (strstr(line, " validation loss at iteration 10 | lm loss value: ") && strstr(line, "lm loss PPL:")) validation_lines++;
    }
    fclose(f);
    mt_expect(iteration_lines == 2, "%d iteration lines, want 2 (every --log-interval 5 of 10)", iteration_lines);
    mt_expect(validation_lines == 1, "%d validation lines at iteration 10, want 1", validation_lines);
}

// errors: a bad flag and an impossible layout exit 1 with a hint, and a missing dataset names the file
MT_TEST(trainer_errors_are_one_clear_line) {
    struct { const char *args, *expect; } cases[] = {
        {"--num-layrs 2", "did you mean --num-layers"},
        // an older flag is honoured (tests/test_logging.c), but a global batch it contradicts shows the arithmetic
        {"--micro-batch-size 4 --nproc-per-node 2 --gradient-accumulation-steps 2 --global-batch-size 4",
         "micro-batch 4 x data-parallel size 2 x 2 steps = 16"},
        {"--num-attention-heads 3 --hidden-size 48 --tensor-model-parallel-size 2 --nproc-per-node 2", "not divisible by --tensor-model-parallel-size"},
        {"--num-layers 3 --pipeline-model-parallel-size 2 --nproc-per-node 2", "not divisible by --pipeline-model-parallel-size"},
        {"--micro-batch-size 3 --global-batch-size 8", "not divisible by micro-batch-size"},
        {"--train-iters 5 --data-path build/no_such_prefix", "build/no_such_prefix.idx"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char cmd[512];
        snprintf(cmd, sizeof cmd, "./train_gpt --hidden-size 64 --num-attention-heads 4 --seq-length 16 --vocab-size 101 %s > build/err.txt 2>&1", cases[k].args);
        int rc = system(cmd);
        mt_expect(WIFEXITED(rc) && WEXITSTATUS(rc) == 1, "'%s' exited with %d, want 1", cases[k].args, rc);
        FILE *f = fopen("build/err.txt", "r");
        char text[4096] = "";
        if (f) { size_t n = fread(text, 1, sizeof text - 1, f); text[n] = 0; fclose(f); }
        mt_expect(strstr(text, "error: ") && strstr(text, cases[k].expect), "'%s' printed: %s (want '%s')", cases[k].args, text, cases[k].expect);
    }
}

// generation (§11): the same tokens in every layout (sampled with temperature and top-k, past
// --seq-length, through the KV cache up to --max-position-embeddings), from the trainer as a user runs it
static int last_line(const char *cmd, char *out, size_t cap) {
    FILE *p = popen(cmd, "r");
    if (!p) return 0;
    char line[4096];
    out[0] = 0;
    while (fgets(line, sizeof line, p)) snprintf(out, cap, "%s", line);
    return pclose(p) == 0;
}
MT_TEST(generation_is_the_same_in_every_layout) {
    write_dataset(TEST_PREFIX, 101, 60);
    const char *base = "./train_gpt --num-layers 4 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --max-position-embeddings 64 "
                       "--micro-batch-size 2 --global-batch-size 8 --train-iters 30 --lr 3e-3 --vocab-size 101 "
                       "--data-path " TEST_PREFIX " --split 949,50,1 --log-interval 30 --eval-iters 0 "
                       "--tokens-to-generate 40 --temperature 0.8 --top-k 10 --hidden-dropout 0 --attention-dropout 0";
    const char *layouts[] = {"", "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --nproc-per-node 8",
                             "--pipeline-model-parallel-size 2 --nproc-per-node 2 --num-layers-per-virtual-pipeline-stage 1"};
    char want[4096], got[4096], cmd[1024];
    snprintf(cmd, sizeof cmd, "%s 2>&1", base);
    mt_expect(last_line(cmd, want, sizeof want), "generation on one rank failed");
    int count = 0;
    for (char *p = want; *p; p++) if (*p == ' ') count++;
    mt_expect(count == 40, "want the prompt and 40 generated ids, got: %s", want);   // 41 ids, 40 spaces
    for (size_t k = 1; k < sizeof layouts / sizeof layouts[0]; k++) {
        snprintf(cmd, sizeof cmd, "%s %s 2>&1", base, layouts[k]);
        mt_expect(last_line(cmd, got, sizeof got), "generation failed with %s", layouts[k]);
        mt_expect(strcmp(got, want) == 0, "generation with %s differs:\n%s%s", layouts[k], got, want);
    }
}

// the parameters' initialisation split over host threads (mt__init_params) gives the values of one
// thread, whatever the split: each value depends only on which element it is
typedef struct { mt_config cfg; int threads, same, std_ok; } init_job;
static void init_split_fn(mt_world *w, int rank, void *arg) {
    init_job *j = (init_job *)arg;
    mt_rank r;
    mt_rank_init(&r, &j->cfg, w, rank);
    size_t n = r.model.num_params;
    float *made = r.model.params_memory;   // as mt_model_init made it (the CPU build: host memory)
    float *one = (float *)mt_calloc(n, sizeof(float), "test"), *three = (float *)mt_calloc(n, sizeof(float), "test");
    r.model.params_memory = one;
    mt__init_params_piece(&r, 0, 1);   // all of it on this thread
    r.model.params_memory = three;      // in three pieces, on a pool of three threads (section 2)
    mt__host_pool *pool = mt__host_pool_create(3, "init", rank, "test");
    mt__host_pool_run(pool, mt__init_params_piece, &r);
    mt__host_pool_free(pool);
    r.model.params_memory = made;
    // wte (the first tensor of the carve) is normal(0, 0.02): its rows are real draws
    size_t wte_n = (size_t)r.model.specs[0].rows * r.model.specs[0].cols;
    double sq = 0;
    for (size_t i = 0; i < wte_n; i++) sq += (double)one[i] * one[i];
    j->threads = mt__init_threads(&r);
    j->same = r.model.initialised && memcmp(made, one, n * sizeof(float)) == 0 &&
              memcmp(three, one, n * sizeof(float)) == 0;
    j->std_ok = fabs(sqrt(sq / (double)wte_n) - 0.02) < 1e-3;
    free(one);
    free(three);
    mt_rank_free(&r);
}
MT_TEST(initialisation_is_the_same_in_any_thread_split) {
    init_job j;
    memset(&j, 0, sizeof j);
    mt_config_defaults(&j.cfg);
    j.cfg.model.num_layers = 2;
    j.cfg.model.hidden_size = 128;
    j.cfg.model.num_attention_heads = 4;
    j.cfg.model.seq_length = 32;
    j.cfg.model.vocab_size = 50257;   // 6.9M parameters: over mt__init_threads' 4M
    j.cfg.train.micro_batch_size = 1;
    j.cfg.train.global_batch_size = 1;
    j.cfg.train.train_iters = 1;
    mt_config_derive(&j.cfg);
    mt_world *w = mt_world_create(1);
    mt_expect(mt_world_run(w, init_split_fn, &j) == 0, "the rank failed");
    mt_world_destroy(w);
    printf("    (mt_model_init used %d thread%s here)\n", j.threads, j.threads == 1 ? "" : "s");
    mt_expect(j.same, "the parameters differ between thread splits");
    mt_expect(j.std_ok, "wte's values are not normal(0, 0.02)");
}

int main(void) {
    mt_run_test(loss_falls_on_a_small_dataset);
    mt_run_test(trainer_prints_megatron_lines);
    mt_run_test(trainer_errors_are_one_clear_line);
    mt_run_test(generation_is_the_same_in_every_layout);
    mt_run_test(initialisation_is_the_same_in_any_thread_split);
    return mt_test_summary();
}

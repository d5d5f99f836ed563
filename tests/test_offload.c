/* tests/test_offload.c - --optimizer-cpu-offload (§6): the optimizer on the host, the same training.
 *
 * Offloaded, the fp32 master copy of a rank's shard and AdamW's two moments live in host memory
 * (pinned on the GPU build) and the update runs on host threads: the gradients come down once per
 * step, the parameters go up once. On the CPU build the device's update (mt_adamw) is the same
 * mt_adamw_cpu the host threads run, elementwise, so splitting the shard among threads changes
 * which thread computes an element, never how. Hence every check here has tolerance 0:
 *  - training with and without offload gives the same bits: losses, grad norms, learning rates,
 *    loss scales, skipped steps, and on every rank the parameters and both moments, in TP, PP, DP
 *    layouts, with and without the distributed optimizer, fp32, emulated bf16, fp16 with skipped
 *    steps, with 1 to 3 host threads;
 *  - the program's iteration lines are the same text (timings aside);
 *  - a checkpoint saved with offload is the same file as one saved without, and resumes bit-exactly
 *    without offload, and the other way round;
 *  - the memory plan (--dry-run) puts 0 optimizer bytes on the device and 16 bytes per parameter of
 *    the shard on the host, and it is what the ranks allocate.
 */
#define MEGATRON_IMPLEMENTATION
#include "../megatron.h"
#include "harness.h"
#include "synthetic.h"
#include <sys/stat.h>
#include <sys/wait.h>

#define STEPS 4
#define MAX_RANKS 8
#define DIR "build/test_offload"

typedef struct {
    mt_config cfg;
    int save_at;                        // save after this iteration (0: never)
    int load;                           // resume from dir first
    const char *dir;
    int first;                          // the first iteration trained (after a load)
    float losses[STEPS + 1], norms[STEPS + 1], lrs[STEPS + 1], scales[STEPS + 1];
    int skipped[STEPS + 1];
    // every rank's state at the end: parameters (num_params) and its shard of m and v
    float *params[MAX_RANKS], *m[MAX_RANKS], *v[MAX_RANKS];
    size_t num_params[MAX_RANKS], shard[MAX_RANKS];
    mt_memory_report report[MAX_RANKS];
    int threads[MAX_RANKS];             // host threads of the update (offload)
} run_t;

static float *copy_floats(const float *src, size_t n) {
    float *p = (float *)mt_malloc(n * sizeof(float) + 1, "test copy");
    memcpy(p, src, n * sizeof(float));   // the CPU build: device and host memory are the host's
    return p;
}

static void rank_main(mt_world *w, int rank, void *arg) {
    run_t *run = (run_t *)arg;
    mt_rank *r = (mt_rank *)mt_calloc(1, sizeof(mt_rank), "rank");
    mt_rank_init(r, &run->cfg, w, rank);
    run->report[rank] = r->memory;
    run->threads[rank] = r->optim.num_host_threads;
    int first = 1;
    if (run->load) first = mt_checkpoint_load(r, run->dir, NULL) + 1;
    if (rank == 0) run->first = first;
    for (int it = first; it <= STEPS; it++) {
        mt_step_result res = mt_train_step(r, synthetic_batch, NULL, it);
        if (rank == 0) {
            run->losses[it] = res.loss;
            run->norms[it] = res.grad_norm;
            run->lrs[it] = res.lr;
            run->scales[it] = res.loss_scale;
            run->skipped[it] = res.skipped;
        }
        if (it == run->save_at) mt_checkpoint_save(r, run->dir, it, 0);
    }
    run->num_params[rank] = r->model.num_params;
    run->shard[rank] = r->optim.shard_size;
    run->params[rank] = copy_floats(r->model.params_memory, r->model.num_params);
    run->m[rank] = copy_floats(r->optim.m_memory, r->optim.shard_size);
    run->v[rank] = copy_floats(r->optim.v_memory, r->optim.shard_size);
    mt_rank_free(r);
    free(r);
}

typedef struct {
    const char *name;
    int tp, pp, dp, vp_layers, dist;
    const char *precision;   // "fp32", "bf16", "fp16"
    int threads;             // --optimizer-offload-threads (0: automatic)
} layout_t;

static void configure(run_t *run, const layout_t *l, int offload) {
    memset(run, 0, sizeof *run);
    mt_config *cfg = &run->cfg;
    synthetic_config(cfg, l->tp, l->pp, l->dp);
    cfg->parallel.num_layers_per_virtual_pipeline_stage = l->vp_layers;
    cfg->parallel.use_distributed_optimizer = l->dist;
    cfg->train.global_batch_size = 4 * l->dp;
    cfg->train.train_iters = STEPS;
    cfg->train.lr = 3e-3f;
    cfg->train.lr_warmup_iters = 1;
    cfg->train.weight_decay = 0.1f;
    cfg->train.bf16 = strcmp(l->precision, "bf16") == 0;
    cfg->train.fp16 = strcmp(l->precision, "fp16") == 0;
    // fp16 from 2^22, halved at every overflow: the first 2 of the 4 steps overflow and are skipped
    // (the host state must not move then), the last 2 update
    if (cfg->train.fp16) {
        cfg->train.initial_loss_scale = 4194304.0f;
        cfg->train.hysteresis = 1;
        cfg->train.loss_scale_window = 2;
    }
    cfg->train.optimizer_cpu_offload = offload;
    cfg->train.optimizer_offload_threads = l->threads;
    mt_config_derive(cfg);
}

static void train(run_t *run) {
    mt_world *w = mt_world_create(run->cfg.world_size);
    int rc = mt_world_run(w, rank_main, run);
    mt_world_destroy(w);
    mt_expect(rc == 0, "the run failed");
}

static void free_run(run_t *run) {
    for (int k = 0; k < MAX_RANKS; k++) { free(run->params[k]); free(run->m[k]); free(run->v[k]); }
}

// tolerance 0 everywhere: see the top. from, to: the iterations compared
static int expect_same_run(const char *what, const run_t *got, const run_t *want, int from) {
    int same = 1;
    for (int it = from; it <= STEPS; it++)
        same &= memcmp(&got->losses[it], &want->losses[it], sizeof(float)) == 0 &&
                (memcmp(&got->norms[it], &want->norms[it], sizeof(float)) == 0 ||
                 (isnan(got->norms[it]) && isnan(want->norms[it]))) &&
                got->lrs[it] == want->lrs[it] && got->scales[it] == want->scales[it] &&
                got->skipped[it] == want->skipped[it];
    mt_expect(same, "%s: the step results differ (iteration %d: loss %.9g vs %.9g)", what, STEPS,
              (double)got->losses[STEPS], (double)want->losses[STEPS]);
    size_t diff = 0;
    for (int k = 0; k < want->cfg.world_size; k++) {
        if (got->num_params[k] != want->num_params[k] || got->shard[k] != want->shard[k]) { diff++; continue; }
        for (size_t i = 0; i < got->num_params[k]; i++) diff += got->params[k][i] != want->params[k][i];
        for (size_t i = 0; i < got->shard[k]; i++) diff += got->m[k][i] != want->m[k][i] || got->v[k][i] != want->v[k][i];
    }
    mt_expect(diff == 0, "%s: %zu parameters or moments differ", what, diff);
    return same && diff == 0;
}

// ---------------------------------------------------------------------------------------------
// offload equals no offload, bit for bit, in every kind of layout
MT_TEST(offload_is_bit_identical) {
    static const layout_t layouts[] = {
        {"1 rank, fp32, 3 host threads", 1, 1, 1, 0, 0, "fp32", 3},
        {"TP=2, fp32, 2 threads", 2, 1, 1, 0, 0, "fp32", 2},
        {"PP=2 interleaved, bf16", 1, 2, 1, 1, 0, "bf16", 0},
        {"DP=2, fp32 (whole state on each)", 1, 1, 2, 0, 0, "fp32", 1},
        {"DP=2, distributed optimizer, bf16", 1, 1, 2, 0, 1, "bf16", 3},
        {"TP=2 x DP=2, distributed, fp16 skips", 2, 1, 2, 0, 1, "fp16", 2},
        {"TP=2 x PP=2 x DP=2, distributed, bf16", 2, 2, 2, 0, 1, "bf16", 1},
    };
    static run_t plain, offloaded;
    for (size_t c = 0; c < sizeof layouts / sizeof layouts[0]; c++) {
        configure(&plain, &layouts[c], 0);
        configure(&offloaded, &layouts[c], 1);
        train(&plain);
        train(&offloaded);
        int ok = expect_same_run(layouts[c].name, &offloaded, &plain, 1);
        int skips = 0;
        for (int it = 1; it <= STEPS; it++) skips += plain.skipped[it];
        if (strcmp(layouts[c].precision, "fp16") == 0)
            mt_expect(skips > 0 && skips < STEPS, "%s: %d of %d steps skipped; the fp16 case must cover skipped "
                      "and taken steps", layouts[c].name, skips, STEPS);
        mt_expect(offloaded.threads[0] == (layouts[c].threads ? layouts[c].threads : offloaded.threads[0]) &&
                  offloaded.threads[0] >= 1 && plain.threads[0] == 0, "%s: %d host threads", layouts[c].name,
                  offloaded.threads[0]);
        printf("  %-42s losses %.6f .. %.6f, %d skipped, %d host thread%s: %s\n", layouts[c].name,
               (double)plain.losses[1], (double)plain.losses[STEPS], skips, offloaded.threads[0],
               offloaded.threads[0] == 1 ? "" : "s", ok ? "identical" : "DIFFERENT");
        free_run(&plain);
        free_run(&offloaded);
    }
}

// ---------------------------------------------------------------------------------------------
// checkpoints: the same file with or without offload; a resume across the switch is bit-exact
static int same_file(const char *a, const char *b) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "cmp -s %s %s", a, b);
    return system(cmd) == 0;
}

MT_TEST(offload_checkpoints_resume_across) {
    // DP=2 with the distributed optimizer (the shards gathered through the device at the save)
    // and PP=2 without it (the whole moments copied from the host)
    static const layout_t layouts[] = {
        {"DP=2, distributed optimizer", 1, 1, 2, 0, 1, "fp32", 2},
        {"PP=2, whole optimizer", 1, 2, 1, 0, 0, "bf16", 0},
    };
    static run_t straight, half, resumed;
    for (size_t c = 0; c < sizeof layouts / sizeof layouts[0]; c++) {
        (void)system("rm -rf " DIR "/with " DIR "/without");
        configure(&straight, &layouts[c], 0);
        train(&straight);
        const char *dirs[2] = {DIR "/without", DIR "/with"};
        for (int off = 0; off < 2; off++) {   // the first half without / with offload, saved at 2
            configure(&half, &layouts[c], off);
            half.save_at = 2;
            half.dir = dirs[off];
            train(&half);
            free_run(&half);
        }
        char a[256], b[256];
        const char *file = layouts[c].pp > 1 ? "iter_0000002/mp_rank_00_000/model_optim_rng.safetensors"
                                              : "iter_0000002/mp_rank_00/model_optim_rng.safetensors";
        snprintf(a, sizeof a, "%s/%s", dirs[0], file);
        snprintf(b, sizeof b, "%s/%s", dirs[1], file);
        mt_expect(same_file(a, b), "%s: the checkpoint saved with offload differs from the one without",
                  layouts[c].name);
        for (int off = 0; off < 2; off++) {   // resumed the other way: with / without offload
            configure(&resumed, &layouts[c], !off);
            resumed.load = 1;
            resumed.dir = dirs[off];
            train(&resumed);
            mt_expect(resumed.first == 3, "%s: resumed at %d, want 3", layouts[c].name, resumed.first);
            char what[128];
            snprintf(what, sizeof what, "%s, saved %s offload, resumed %s", layouts[c].name, off ? "with" : "without",
                     off ? "without" : "with");
            int ok = expect_same_run(what, &resumed, &straight, 3);
            printf("  %-70s %s\n", what, ok ? "identical to the straight run" : "DIFFERENT");
            free_run(&resumed);
        }
        free_run(&straight);
    }
}

// ---------------------------------------------------------------------------------------------
// the memory plan: no optimizer bytes on the device, 16 per shard parameter on the host
MT_TEST(offload_memory_plan) {
    static const layout_t layouts[] = {
        {"1 rank", 1, 1, 1, 0, 0, "fp32", 1},
        {"TP=2 x DP=2, distributed", 2, 1, 2, 0, 1, "fp32", 1},
    };
    static run_t run;
    for (size_t c = 0; c < sizeof layouts / sizeof layouts[0]; c++) {
        configure(&run, &layouts[c], 1);
        train(&run);
        for (int rank = 0; rank < run.cfg.world_size; rank++) {
            mt_memory_report plan, without;
            mt_memory_plan(&run.cfg, rank, &plan);
            mt_config cfg = run.cfg;
            cfg.train.optimizer_cpu_offload = 0;
            mt_memory_plan(&cfg, rank, &without);
            const mt_memory_report *got = &run.report[rank];
            mt_expect(memcmp(&plan, got, sizeof plan) == 0, "%s rank %d: the plan is not the allocation",
                      layouts[c].name, rank);
            // master copy, m, v and the gradients' landing place: 4 floats per shard parameter
            mt_expect(plan.optimizer == 0 && plan.host_optimizer == 4 * run.shard[rank] * sizeof(float) &&
                      plan.host_optimizer == 2 * without.optimizer && without.host_optimizer == 0,
                      "%s rank %d: optimizer %zu on the device, %zu on the host (without offload %zu)",
                      layouts[c].name, rank, plan.optimizer, plan.host_optimizer, without.optimizer);
            mt_expect(plan.params == without.params && plan.grads == without.grads &&
                      plan.activations == without.activations, "%s rank %d: offload changed other buffers",
                      layouts[c].name, rank);
        }
        free_run(&run);
    }
}

// ---------------------------------------------------------------------------------------------
// the program: the iteration lines are the same text; --dry-run reports the host bytes; the
// fraction flag says what is implemented
static char out_text[65536];
static int run_cmd(const char *cmd, const char *log) {
    char full[4096];
    snprintf(full, sizeof full, "timeout -s KILL 120 sh -c '%s' > %s 2>&1", cmd, log);
    int rc = system(full);
    FILE *f = fopen(log, "r");
    out_text[0] = 0;
    if (f) { size_t n = fread(out_text, 1, sizeof out_text - 1, f); out_text[n] = 0; fclose(f); }
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

// the iteration lines of a log, without the fields that are timings
static void iteration_lines(const char *text, char *out, size_t cap) {
    out[0] = 0;
    for (const char *p = text, *end; (end = strchr(p, '\n')) != NULL; p = end + 1) {
        if (strncmp(p, " iteration ", 11) != 0) continue;   // Megatron's line, not "per iteration (rank"
        char line[2048];
        size_t n = (size_t)(end - p) < sizeof line - 1 ? (size_t)(end - p) : sizeof line - 1;
        memcpy(line, p, n);
        line[n] = 0;
        char *t = strstr(line, " | elapsed time");   // elapsed time ... | learning rate
        char *lr = strstr(line, " | learning rate");
        if (t && lr) memmove(t, lr, strlen(lr) + 1);
        t = strstr(line, " | throughput");   // throughput, tokens per second, time left: timings
        if (t) *t = 0;
        if (strlen(out) + strlen(line) + 2 < cap) { strcat(out, line); strcat(out, "\n"); }
    }
}

static void write_dataset(const char *prefix, int V, int ndocs) {
    mt_indexed_builder *b = mt_indexed_builder_open(prefix, mt_dtype_for_vocab(V));
    int32_t doc[400];
    for (int d = 0; d < ndocs; d++) {
        int n = 50 + (int)(mt_hash64((uint64_t)d) % 300);
        for (int i = 0; i < n; i++) doc[i] = (d + 3 * i) % V;
        mt_indexed_builder_add_document(b, doc, (size_t)n);
    }
    mt_indexed_builder_finish(b);
}

#define TINY "./train_gpt --num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 --vocab-size 101 " \
             "--micro-batch-size 2 --global-batch-size 8 --train-iters 4 --log-interval 1 --eval-iters 0 " \
             "--lr 3e-3 --data-path " DIR "/data --nproc-per-node 4 --tensor-model-parallel-size 2 --bf16 "

MT_TEST(offload_program_lines) {
    write_dataset(DIR "/data", 101, 40);
    static char plain[16384], offloaded[16384];
    int rc = run_cmd(TINY "--use-distributed-optimizer", DIR "/plain.log");
    iteration_lines(out_text, plain, sizeof plain);
    int rc2 = run_cmd(TINY "--use-distributed-optimizer --optimizer-cpu-offload --optimizer-offload-threads 2",
                      DIR "/offload.log");
    iteration_lines(out_text, offloaded, sizeof offloaded);
    mt_expect(rc == 0 && rc2 == 0, "the runs failed (%d, %d); see " DIR "/*.log", rc, rc2);
    mt_expect(strstr(out_text, "host (pinned) MB: optimizer") != NULL, "the start lines do not say the host memory");
    int lines = 0;
    for (const char *q = plain; (q = strchr(q, '\n')) != NULL; q++) lines++;
    mt_expect(lines == 4 && strcmp(plain, offloaded) == 0, "the iteration lines differ (%d lines):\n%s---\n%s", lines,
              plain, offloaded);
    printf("  %d iteration lines, the same text with and without offload\n", lines);
    // --dry-run: the device's optimizer 0, the host's bytes on their own
    rc = run_cmd(TINY "--use-distributed-optimizer --optimizer-cpu-offload --dry-run", DIR "/dry.log");
    mt_expect(rc == 0 && strstr(out_text, "optimizer 0.0, activations") &&
              strstr(out_text, "| host (pinned): optimizer "), "--dry-run with offload printed:\n%s", out_text);
    // Megatron's fraction: only 1.0 here
    rc = run_cmd(TINY "--optimizer-cpu-offload --optimizer-offload-fraction 0.5", DIR "/fraction.log");
    mt_expect(rc == 1 && strstr(out_text, "error: --optimizer-offload-fraction 0.5") && strstr(out_text, "hint: "),
              "--optimizer-offload-fraction 0.5 gave (%d):\n%s", rc, out_text);
}

int main(void) {
    mkdir("build", 0755);
    mkdir(DIR, 0755);
    mt_run_test(offload_is_bit_identical);
    mt_run_test(offload_checkpoints_resume_across);
    mt_run_test(offload_memory_plan);
    mt_run_test(offload_program_lines);
    return mt_test_summary();
}

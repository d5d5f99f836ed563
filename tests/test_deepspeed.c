/* tests/test_deepspeed.c - --deepspeed --deepspeed_config ds_config.json (§1): DeepSpeed's keys as
 * our flags.
 *
 *  - each key lands where the mapping's comment in megatron.h (section 1, "the DeepSpeed config")
 *    says: three files that together give every key, "auto", DeepSpeed's defaults inside a block
 *    the file gives, and the micro-batch derived from train_batch_size; the mt_config fields are
 *    checked one by one, and the one summary line says what was mapped, kept and ignored;
 *  - what has no equivalent is one clear error (exit status 1, "error: " and "hint: "): ZeRO stage
 *    3 and its keys, NVMe offload, an unknown key (with the near one when there is), a flag the
 *    file contradicts, a warm-up that is not Megatron's, batch sizes that do not add up;
 *  - a run with a ds_config trains exactly like the run with the equivalent flags (tolerance 0:
 *    the same configuration, field for field, so the same arithmetic), with ZeRO stage 1, whose
 *    gradients are all-reduced where the flags' distributed optimizer reduce-scatters them (the
 *    same sums in the same order: section 2), and with the program's iteration lines the same text.
 * mt_fatal exits the process, so the error cases run in a forked child whose output comes back
 * through a pipe (as tests/test_data.c does).
 */
#define MEGATRON_IMPLEMENTATION
#include "../megatron.h"
#include "harness.h"
#include "child.h"
#include "synthetic.h"
#include <sys/stat.h>
#include <sys/wait.h>

#define DIR "build/test_deepspeed"
#define STEPS 4

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (!f) { fprintf(stderr, "cannot write %s\n", path); exit(2); }
    fputs(text, f);
    fclose(f);
}

// the model flags every case shares (2 ranks: DP = 2 unless a case adds TP)
#define MODEL "train_gpt", "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", \
              "16", "--vocab-size", "101", "--nproc-per-node", "2", "--train-iters", "100"

// parses argv as the trainer does, then derives (DP known): the config a run would use
static void parse(mt_config *cfg, int argc, char **argv) {
    mt_config_defaults(cfg);
    mt_config_parse(cfg, argc, argv);
    mt_config_derive(cfg);
}

// ---------------------------------------------------------------------------------------------
// every key onto its flag
MT_TEST(ds_keys_map_to_flags) {
    char summary[4096];
    mt_config c;
    // A: stage 2 with CPU offload, AdamW, the cosine schedule, all three batch keys, fp16's scaler
    write_text(DIR "/a.json",
               "{\n"
               "  \"train_batch_size\": 16,\n"
               "  \"train_micro_batch_size_per_gpu\": 2,\n"
               "  \"gradient_accumulation_steps\": 4,\n"
               "  \"gradient_clipping\": 0.5,\n"
               "  \"steps_per_print\": 7,\n"
               "  \"wall_clock_breakdown\": true,\n"
               "  \"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": {\"device\": \"cpu\", \"pin_memory\": true}},\n"
               "  \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 6e-4, \"betas\": [0.8, 0.95], \"eps\": 1e-6,\n"
               "                \"weight_decay\": 0.05}},\n"
               "  \"scheduler\": {\"type\": \"WarmupCosineLR\", \"params\": {\"total_num_steps\": 100, \"warmup_num_steps\": 10,\n"
               "                \"warmup_type\": \"linear\", \"warmup_min_ratio\": 0, \"cos_min_ratio\": 0.1}},\n"
               "  \"fp16\": {\"enabled\": true, \"loss_scale\": 0, \"initial_scale_power\": 12, \"loss_scale_window\": 500,\n"
               "           \"hysteresis\": 3, \"min_loss_scale\": 2}\n"
               "}\n");
    char *argv_a[] = {MODEL};
    int argc_a = (int)(sizeof argv_a / sizeof argv_a[0]);
    mt_config_defaults(&c);
    mt_config_parse(&c, argc_a, argv_a);
    mt_config_load_deepspeed(&c, DIR "/a.json", argc_a, argv_a, summary, sizeof summary);
    mt_config_derive(&c);
    const mt_train_config *t = &c.train;
    mt_expect(c.parallel.use_distributed_optimizer == 1 && c.parallel.zero_stage == 2 && t->optimizer_cpu_offload == 1,
              "A: zero stage 2 + cpu offload -> dist %d stage %d offload %d", c.parallel.use_distributed_optimizer,
              c.parallel.zero_stage, t->optimizer_cpu_offload);
    mt_expect(t->lr == 6e-4f && t->adam_beta1 == 0.8f && t->adam_beta2 == 0.95f && t->adam_eps == 1e-6f &&
              t->weight_decay == 0.05f, "A: optimizer.params -> lr %g betas %g %g eps %g wd %g", (double)t->lr,
              (double)t->adam_beta1, (double)t->adam_beta2, (double)t->adam_eps, (double)t->weight_decay);
    mt_expect(strcmp(t->lr_decay_style, "cosine") == 0 && t->lr_warmup_iters == 10 && t->lr_decay_iters == 100 &&
              t->min_lr == (float)(0.1 * (double)6e-4f), "A: WarmupCosineLR -> %s warmup %d decay %d min %g",
              t->lr_decay_style, t->lr_warmup_iters, t->lr_decay_iters, (double)t->min_lr);
    mt_expect(t->micro_batch_size == 2 && t->global_batch_size == 16 && t->gradient_accumulation_steps == 4 &&
              c.num_microbatches == 4, "A: batch -> micro %d global %d steps %d micro-batches %d", t->micro_batch_size,
              t->global_batch_size, t->gradient_accumulation_steps, c.num_microbatches);
    mt_expect(t->clip_grad == 0.5f && t->log_interval == 7, "A: clip %g, log interval %d", (double)t->clip_grad,
              t->log_interval);
    mt_expect(t->fp16 == 1 && t->bf16 == 0 && t->loss_scale == 0.0f && t->initial_loss_scale == 4096.0f &&
              t->loss_scale_window == 500 && t->hysteresis == 3 && t->min_loss_scale == 2.0f,
              "A: fp16 -> fp16 %d scale %g initial %g window %d hysteresis %d min %g", t->fp16, (double)t->loss_scale,
              (double)t->initial_loss_scale, t->loss_scale_window, t->hysteresis, (double)t->min_loss_scale);
    mt_expect(strstr(summary, "deepspeed config " DIR "/a.json: zero stage 2 -> --use-distributed-optimizer "
                              "(gradients reduce-scattered)") && strstr(summary, "--optimizer-cpu-offload") &&
              strstr(summary, "; ignored: offload_optimizer.pin_memory") && strstr(summary, "wall_clock_breakdown") &&
              !strchr(summary, '\n'), "A: the summary line:\n%s", summary);
    printf("  A: %s\n", summary);

    // B: stage 1, no offload, "auto" (our flags kept), WarmupLR with DeepSpeed's default warm-up,
    // bf16 (fp16's scale keys ignored), a micro-batch only
    write_text(DIR "/b.json",
               "{\"zero_optimization\": {\"stage\": 1, \"offload_optimizer\": {\"device\": \"none\"}},\n"
               " \"optimizer\": {\"type\": \"Adam\", \"params\": {\"lr\": \"auto\", \"weight_decay\": 0.0}},\n"
               " \"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_max_lr\": 0.001, \"warmup_type\": \"linear\"}},\n"
               " \"bf16\": {\"enabled\": true}, \"fp16\": {\"enabled\": false, \"loss_scale\": 128},\n"
               " \"gradient_clipping\": \"auto\", \"train_micro_batch_size_per_gpu\": 4, \"train_batch_size\": \"auto\"}\n");
    char *argv_b[] = {MODEL, "--clip-grad", "0.3", "--global-batch-size", "16"};
    int argc_b = (int)(sizeof argv_b / sizeof argv_b[0]);
    mt_config_defaults(&c);
    mt_config_parse(&c, argc_b, argv_b);
    mt_config_load_deepspeed(&c, DIR "/b.json", argc_b, argv_b, summary, sizeof summary);
    mt_config_derive(&c);
    mt_expect(c.parallel.use_distributed_optimizer == 1 && c.parallel.zero_stage == 1 && t->optimizer_cpu_offload == 0,
              "B: zero stage 1, device none -> dist %d stage %d offload %d", c.parallel.use_distributed_optimizer,
              c.parallel.zero_stage, t->optimizer_cpu_offload);
    mt_expect(t->lr == 0.001f && t->weight_decay == 0.0f && strcmp(t->lr_decay_style, "constant") == 0 &&
              t->lr_warmup_iters == 1000, "B: WarmupLR -> lr %g wd %g %s warmup %d (DeepSpeed's default 1000)",
              (double)t->lr, (double)t->weight_decay, t->lr_decay_style, t->lr_warmup_iters);
    mt_expect(t->bf16 == 1 && t->fp16 == 0 && t->loss_scale == 0.0f && t->clip_grad == 0.3f &&
              t->micro_batch_size == 4 && t->global_batch_size == 16 && c.num_microbatches == 2,
              "B: bf16 %d fp16 %d loss scale %g clip %g (auto: the flag's 0.3) micro %d global %d", t->bf16, t->fp16,
              (double)t->loss_scale, (double)t->clip_grad, t->micro_batch_size, t->global_batch_size);
    mt_expect(strstr(summary, "auto (our flags kept): ") && strstr(summary, "gradient_clipping") &&
              strstr(summary, "fp16.loss_scale (fp16 off)") && strstr(summary, "(DeepSpeed's default)"),
              "B: the summary line:\n%s", summary);
    printf("  B: %s\n", summary);

    // C: stage 0, WarmupDecayLR, and the micro-batch derived: 12 / (3 steps x DP 2) = 2
    write_text(DIR "/c.json",
               "{\"train_batch_size\": 12, \"gradient_accumulation_steps\": 3, \"zero_optimization\": {\"stage\": 0},\n"
               " \"scheduler\": {\"type\": \"WarmupDecayLR\", \"params\": {\"warmup_num_steps\": 5, \"warmup_type\": \"linear\",\n"
               "               \"total_num_steps\": 50, \"warmup_min_lr\": 0}}}\n");
    char *argv_c[] = {MODEL, "--min-lr", "0"};
    int argc_c = (int)(sizeof argv_c / sizeof argv_c[0]);
    mt_config_defaults(&c);
    mt_config_parse(&c, argc_c, argv_c);
    mt_config_load_deepspeed(&c, DIR "/c.json", argc_c, argv_c, summary, sizeof summary);
    mt_expect(t->micro_batch_size == 0, "C: the micro-batch waits for DP (0 before mt_config_derive)");
    mt_config_derive(&c);
    mt_expect(c.parallel.use_distributed_optimizer == 0 && c.parallel.zero_stage == 0 && t->micro_batch_size == 2 &&
              t->global_batch_size == 12 && c.num_microbatches == 3,
              "C: stage 0, derived micro-batch -> dist %d micro %d global %d micro-batches %d",
              c.parallel.use_distributed_optimizer, t->micro_batch_size, t->global_batch_size, c.num_microbatches);
    mt_expect(strcmp(t->lr_decay_style, "linear") == 0 && t->lr_warmup_iters == 5 && t->lr_decay_iters == 50 &&
              t->min_lr == 0.0f, "C: WarmupDecayLR -> %s warmup %d decay %d min %g", t->lr_decay_style,
              t->lr_warmup_iters, t->lr_decay_iters, (double)t->min_lr);
    printf("  C: %s\n", summary);
}

// ---------------------------------------------------------------------------------------------
// errors: one clear message each (the pattern of tests/test_data.c: a forked child)
typedef struct { int argc; char **argv; } parse_args;
static void parse_child(void *p) {
    parse_args *a = (parse_args *)p;
    mt_config cfg;
    parse(&cfg, a->argc, a->argv);
}


// the file `json` with the extra flags must fail: status 1, "error: ", "hint: " and `want`
static void expect_error(const char *what, const char *json, const char *flag1, const char *value1, const char *want) {
    write_text(DIR "/bad.json", json);
    char *argv[] = {MODEL, "--deepspeed", "--deepspeed_config", DIR "/bad.json", (char *)flag1, (char *)value1};
    parse_args a = {(int)(sizeof argv / sizeof argv[0]) - 2 + (flag1 != NULL) + (value1 != NULL), argv};
    char out[8192];
    int rc = run_child(parse_child, &a, out, sizeof out);
    // one error line (naming the key) and one hint line (the fix), once each
    int errors = 0, hints = 0;
    for (const char *q = out; q; q = strchr(q, '\n') ? strchr(q, '\n') + 1 : NULL) {
        errors += strncmp(q, "error: ", 7) == 0;
        hints += strncmp(q, "hint: ", 6) == 0;
    }
    const char *e = strstr(out, "error: ");
    mt_expect(rc == 1 && errors == 1 && hints == 1 && e && strstr(e, want),
              "%s: exit %d, want 1 and \"%s\" in the one error (and its hint) line; got:\n%s", what, rc, want, out);
    char first[160];
    snprintf(first, sizeof first, "%.150s", e ? e : out);
    if (strchr(first, '\n')) *strchr(first, '\n') = 0;
    printf("  %-34s %s\n", what, first);
}

MT_TEST(ds_errors) {
    expect_error("ZeRO stage 3", "{\"zero_optimization\": {\"stage\": 3}}", NULL, NULL, "zero_optimization.stage 3");
    expect_error("a stage 3 key", "{\"zero_optimization\": {\"stage\": 2, \"stage3_max_live_parameters\": 1e9}}", NULL,
                 NULL, "\"zero_optimization.stage3_max_live_parameters\" belongs to ZeRO stage 3");
    expect_error("NVMe offload", "{\"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": {\"device\": \"nvme\"}}}",
                 NULL, NULL, "offload_optimizer.device \"nvme\"");
    expect_error("an unknown key", "{\"zero_optimization\": {\"stage\": 2, \"overlap_comm\": true}}", NULL, NULL,
                 "DeepSpeed key \"zero_optimization.overlap_comm\" has no equivalent");
    expect_error("a misspelt key", "{\"train_batch_sise\": 8}", NULL, NULL, "did you mean \"train_batch_size\"");
    expect_error("a flag the file contradicts", "{\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 6e-4}}}",
                 "--lr", "1e-4", "\"optimizer.params.lr\" says --lr 0.0006, but the command line says --lr 0.0001");
    expect_error("a switch the file turns off", "{\"fp16\": {\"enabled\": false}}", "--fp16", NULL,
                 "\"fp16.enabled\" says off, but the command line says --fp16");
    expect_error("fp16 and bf16 both", "{\"fp16\": {\"enabled\": true}}", "--bf16", NULL,
                 "\"fp16.enabled\" is true, but the command line says --bf16");
    expect_error("the log warm-up", "{\"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_num_steps\": 10}}}",
                 NULL, NULL, "warmup_type is not given (DeepSpeed's default: \"log\")");
    expect_error("a warm-up from above 0",
                 "{\"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_min_lr\": 1e-5, \"warmup_type\": "
                 "\"linear\"}}}", NULL, NULL, "warmup_min_lr 1e-5: Megatron's warm-up starts from 0");
    expect_error("another optimizer", "{\"optimizer\": {\"type\": \"Lamb\"}}", NULL, NULL,
                 "optimizer.type Lamb: megatron.h has AdamW only");
    expect_error("another schedule", "{\"scheduler\": {\"type\": \"OneCycle\"}}", NULL, NULL,
                 "scheduler.type OneCycle has no Megatron equivalent");
    expect_error("batch keys that do not add up",
                 "{\"train_batch_size\": 10, \"train_micro_batch_size_per_gpu\": 2, \"gradient_accumulation_steps\": 2}",
                 NULL, NULL, "train_batch_size 10 is not train_micro_batch_size_per_gpu 2 x gradient_accumulation_steps"
                             " 2 x data-parallel size 2 = 8");
    expect_error("not JSON", "{\"zero_optimization\": {\"stage\": }}", NULL, NULL, "bad.json:1:");
    // --deepspeed alone
    char *argv[] = {MODEL, "--deepspeed"};
    parse_args a = {(int)(sizeof argv / sizeof argv[0]), argv};
    char out[4096];
    int rc = run_child(parse_child, &a, out, sizeof out);
    mt_expect(rc == 1 && strstr(out, "error: --deepspeed needs --deepspeed_config"), "--deepspeed alone: %d\n%s", rc,
              out);
}

// the trainer's parse prints the summary as one line (and --deepspeed-config is the same flag)
MT_TEST(ds_summary_line) {
    write_text(DIR "/s.json", "{\"zero_optimization\": {\"stage\": 1}, \"wall_clock_breakdown\": false}");
    char *argv[] = {MODEL, "--deepspeed", "--deepspeed-config", DIR "/s.json"};
    parse_args a = {(int)(sizeof argv / sizeof argv[0]), argv};
    char out[4096];
    int rc = run_child(parse_child, &a, out, sizeof out);
    int lines = 0;
    for (const char *q = out; *q; q++) lines += *q == '\n';
    mt_expect(rc == 77 && lines == 1 &&
              strstr(out, "note: deepspeed config " DIR "/s.json: zero stage 1 -> --use-distributed-optimizer "
                          "(gradients all-reduced); ignored: wall_clock_breakdown"), "the parse printed (%d):\n%s", rc,
              out);
    printf("  %s", out);
}

// ---------------------------------------------------------------------------------------------
// a run with the ds_config is the run with the flags
typedef struct {
    mt_config cfg;
    float losses[STEPS + 1], norms[STEPS + 1], lrs[STEPS + 1];
    float *params[4], *m[4], *v[4];
    size_t num_params[4], shard[4];
    int dp_all_reduce, dp_reduce_scatter;   // rank 0's DP collectives of the last step, by kind
} run_t;

static void rank_main(mt_world *w, int rank, void *arg) {
    run_t *run = (run_t *)arg;
    mt_rank *r = (mt_rank *)mt_calloc(1, sizeof(mt_rank), "rank");
    mt_rank_init(r, &run->cfg, w, rank);
    mt_span_log log;
    memset(&log, 0, sizeof log);
    mt_rank_set_timeline(r, &log);
    for (int it = 1; it <= STEPS; it++) {
        log.enabled = it == STEPS;
        mt_step_result res = mt_train_step(r, synthetic_batch, NULL, it);
        if (rank == 0) { run->losses[it] = res.loss; run->norms[it] = res.grad_norm; run->lrs[it] = res.lr; }
    }
    mt_rank_set_timeline(r, NULL);
    if (rank == 0)
        for (size_t i = 0; i < log.n; i++) {
            // the gradients' collectives: not the few doubles of the norm and the loss
            if (!log.spans[i].group || strcmp(log.spans[i].group, "dp") != 0 || log.spans[i].bytes < 1024) continue;
            run->dp_all_reduce += strcmp(log.spans[i].name, "all_reduce") == 0;
            run->dp_reduce_scatter += strcmp(log.spans[i].name, "reduce_scatter") == 0;
        }
    mt_span_log_free(&log);
    size_t n = r->model.num_params, s = r->optim.shard_size;
    run->num_params[rank] = n;
    run->shard[rank] = s;
    run->params[rank] = (float *)mt_malloc(n * sizeof(float), "params");
    run->m[rank] = (float *)mt_malloc(s * sizeof(float), "m");
    run->v[rank] = (float *)mt_malloc(s * sizeof(float), "v");
    memcpy(run->params[rank], r->model.params_memory, n * sizeof(float));   // the CPU build: host memory
    memcpy(run->m[rank], r->optim.m_memory, s * sizeof(float));
    memcpy(run->v[rank], r->optim.v_memory, s * sizeof(float));
    mt_rank_free(r);
    free(r);
}

static void train(run_t *run) {
    mt_world *w = mt_world_create(run->cfg.world_size);
    int rc = mt_world_run(w, rank_main, run);
    mt_world_destroy(w);
    mt_expect(rc == 0, "the run failed");
}

#define EQUIV_JSON                                                                                                    \
    "{\n"                                                                                                             \
    "  \"train_batch_size\": 8, \"train_micro_batch_size_per_gpu\": 2, \"gradient_accumulation_steps\": 2,\n"         \
    "  \"gradient_clipping\": 0.5, \"steps_per_print\": 1, \"wall_clock_breakdown\": false,\n"                        \
    "  \"zero_optimization\": {\"stage\": 1, \"offload_optimizer\": {\"device\": \"cpu\", \"pin_memory\": true}},\n"   \
    "  \"optimizer\": {\"type\": \"Adam\", \"params\": {\"lr\": 3e-3, \"betas\": [0.9, 0.95], \"eps\": 1e-8,\n"         \
    "                \"weight_decay\": 0.1}},\n"                                                                      \
    "  \"scheduler\": {\"type\": \"WarmupDecayLR\", \"params\": {\"warmup_min_lr\": 0, \"warmup_max_lr\": 3e-3,\n"     \
    "                \"warmup_num_steps\": 1, \"warmup_type\": \"linear\", \"total_num_steps\": 4}},\n"               \
    "  \"bf16\": {\"enabled\": true}\n"                                                                               \
    "}\n"
// the same, as flags: what the mapping's comment says each key becomes
#define EQUIV_FLAGS "--global-batch-size", "8", "--micro-batch-size", "2", "--clip-grad", "0.5", "--log-interval", "1", \
                    "--use-distributed-optimizer", "--optimizer-cpu-offload", "--lr", "3e-3", "--adam-beta1", "0.9",    \
                    "--adam-beta2", "0.95", "--adam-eps", "1e-8", "--weight-decay", "0.1", "--lr-decay-style",         \
                    "linear", "--lr-warmup-iters", "1", "--lr-decay-iters", "4", "--min-lr", "0", "--bf16"
#define TP2 "--tensor-model-parallel-size", "2", "--nproc-per-node", "4", "--hidden-dropout", "0.1"

MT_TEST(ds_run_equals_flags_run) {
    write_text(DIR "/equiv.json", EQUIV_JSON);
    static run_t ds, flags;
    memset(&ds, 0, sizeof ds);
    memset(&flags, 0, sizeof flags);
    char *argv_ds[] = {MODEL, TP2, "--deepspeed", "--deepspeed_config", DIR "/equiv.json"};
    char *argv_flags[] = {MODEL, TP2, EQUIV_FLAGS};
    parse(&ds.cfg, (int)(sizeof argv_ds / sizeof argv_ds[0]), argv_ds);
    parse(&flags.cfg, (int)(sizeof argv_flags / sizeof argv_flags[0]), argv_flags);
    // the configurations are the same, field for field, but for what only the file says: its path,
    // --deepspeed, the steps (the flags' global batch says them) and stage 1's all-reduce
    mt_config probe = ds.cfg;
    probe.train.deepspeed = 0;
    memset(probe.train.deepspeed_config, 0, sizeof probe.train.deepspeed_config);
    probe.train.gradient_accumulation_steps = 0;
    probe.parallel.zero_stage = 0;
    mt_expect(memcmp(&probe, &flags.cfg, sizeof probe) == 0, "the ds_config's configuration is not the flags' one");
    mt_expect(ds.cfg.parallel.zero_stage == 1 && ds.cfg.world_size == 4 && ds.cfg.data_parallel_size == 2,
              "stage %d, world %d", ds.cfg.parallel.zero_stage, ds.cfg.world_size);
    train(&ds);
    train(&flags);
    int same = 1;
    for (int it = 1; it <= STEPS; it++)
        same &= memcmp(&ds.losses[it], &flags.losses[it], sizeof(float)) == 0 &&
                memcmp(&ds.norms[it], &flags.norms[it], sizeof(float)) == 0 && ds.lrs[it] == flags.lrs[it];
    size_t diff = 0;
    for (int k = 0; k < 4; k++) {
        if (ds.num_params[k] != flags.num_params[k] || ds.shard[k] != flags.shard[k]) { diff++; continue; }
        for (size_t i = 0; i < ds.num_params[k]; i++) diff += ds.params[k][i] != flags.params[k][i];
        for (size_t i = 0; i < ds.shard[k]; i++) diff += ds.m[k][i] != flags.m[k][i] || ds.v[k][i] != flags.v[k][i];
    }
    mt_expect(same && diff == 0, "the ds_config run differs from the flags run (%zu values; losses %s)", diff,
              same ? "same" : "differ");
    // stage 1 all-reduced the DP gradients, the flags' distributed optimizer reduce-scattered them
    mt_expect(ds.dp_all_reduce > 0 && ds.dp_reduce_scatter == 0 && flags.dp_reduce_scatter > 0 &&
              flags.dp_all_reduce == 0, "DP gradient collectives: stage 1 %d all-reduce %d reduce-scatter, flags %d %d",
              ds.dp_all_reduce, ds.dp_reduce_scatter, flags.dp_all_reduce, flags.dp_reduce_scatter);
    printf("  ZeRO stage 1 + cpu offload + bf16, TP=2 x DP=2: losses %.6f .. %.6f, parameters and moments %s; "
           "DP gradients: %d all-reduce (stage 1) vs %d reduce-scatter (flags)\n", (double)ds.losses[1],
           (double)ds.losses[STEPS], same && diff == 0 ? "identical" : "DIFFERENT", ds.dp_all_reduce,
           flags.dp_reduce_scatter);
    for (int k = 0; k < 4; k++) {
        free(ds.params[k]); free(ds.m[k]); free(ds.v[k]);
        free(flags.params[k]); free(flags.m[k]); free(flags.v[k]);
    }
}

// the program's iteration lines: the same text (timings aside) with the file and with the flags
static void iteration_lines(const char *path, char *out, size_t cap) {
    out[0] = 0;
    FILE *f = fopen(path, "r");
    if (!f) return;
    char line[4096];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, " iteration ", 11) != 0) continue;
        char *t = strstr(line, " | elapsed time"), *lr = strstr(line, " | learning rate");
        if (t && lr) memmove(t, lr, strlen(lr) + 1);
        if ((t = strstr(line, " | throughput")) != NULL) strcpy(t, "\n");
        if (strlen(out) + strlen(line) + 1 < cap) strcat(out, line);
    }
    fclose(f);
}

MT_TEST(ds_program_lines) {
    mt_indexed_builder *b = mt_indexed_builder_open(DIR "/data", mt_dtype_for_vocab(101));
    int32_t doc[400];
    for (int d = 0; d < 40; d++) {
        int n = 50 + (int)(mt_hash64((uint64_t)d) % 300);
        for (int i = 0; i < n; i++) doc[i] = (d + 3 * i) % 101;
        mt_indexed_builder_add_document(b, doc, (size_t)n);
    }
    mt_indexed_builder_finish(b);
    const char *common = "./train_gpt --num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 "
                         "--vocab-size 101 --nproc-per-node 2 --train-iters 4 --eval-iters 0 --data-path " DIR "/data ";
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s --deepspeed --deepspeed_config " DIR "/equiv.json > " DIR "/ds.log 2>&1", common);
    int rc1 = system(cmd);
    snprintf(cmd, sizeof cmd, "%s --global-batch-size 8 --micro-batch-size 2 --clip-grad 0.5 --log-interval 1 "
                              "--use-distributed-optimizer --optimizer-cpu-offload --lr 3e-3 --adam-beta2 0.95 "
                              "--weight-decay 0.1 --lr-decay-style linear --lr-warmup-iters 1 --lr-decay-iters 4 "
                              "--min-lr 0 --bf16 > " DIR "/flags.log 2>&1", common);
    int rc2 = system(cmd);
    static char a[16384], c[16384];
    iteration_lines(DIR "/ds.log", a, sizeof a);
    iteration_lines(DIR "/flags.log", c, sizeof c);
    int lines = 0;
    for (const char *q = a; (q = strchr(q, '\n')) != NULL; q++) lines++;
    mt_expect(rc1 == 0 && rc2 == 0 && lines == 4 && strcmp(a, c) == 0,
              "the iteration lines differ (exit %d %d, %d lines); see " DIR "/ds.log and flags.log", rc1, rc2, lines);
    printf("  ./train_gpt: %d iteration lines, the same text with the ds_config and with the flags\n", lines);
}

int main(void) {
    mkdir("build", 0755);
    mkdir(DIR, 0755);
    mt_run_test(ds_keys_map_to_flags);
    mt_run_test(ds_errors);
    mt_run_test(ds_summary_line);
    mt_run_test(ds_run_equals_flags_run);
    mt_run_test(ds_program_lines);
    return mt_test_summary();
}

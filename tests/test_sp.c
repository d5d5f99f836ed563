/* tests/test_sp.c - sequence parallel (§4): plain TP's numbers with 1/TP of the activations.
 *
 * tests/test_layouts.c shows that SP layouts train like one rank. Here, what SP itself promises:
 *  - the forward is plain TP's, bit for bit: an all-gather only copies, a reduce-scatter adds
 *    the ranks' values in the all-reduce's rank order, and layernorm, dropout and the residual
 *    add treat each position on its own. So the first step's loss is the same float (tolerance
 *    0); only the layernorm gradients are summed in another order (per shard, then over TP).
 *    Evaluation and greedy generation (forward only) give the same loss and the same tokens.
 *  - the activations of the regions between the TP layers (ln1, ln2 and their statistics,
 *    residual2, residual3, the chunk inputs, lnf) are 1/TP of plain TP's, the rest unchanged,
 *    counted here from the shapes; and the memory plan (--dry-run) is the allocation.
 *  - the communication counters see the new collectives: the TP group's calls and bytes per
 *    step, counted from the layer's structure.
 *  - --print-layout says which positions each TP rank holds; the flag's errors (TP = 1, T not
 *    divisible by TP) are one clear message each.
 */
#define MEGATRON_IMPLEMENTATION
#include "../megatron.h"
#include "harness.h"
#include "synthetic.h"
#include <sys/wait.h>

#define MAX_RANKS 8
#define STEPS 2

typedef struct {
    mt_config cfg;
    float losses[STEPS], norms[STEPS];
    mt_memory_report report[MAX_RANKS];           // each rank's, from its allocation
    unsigned long long tp_calls[MAX_RANKS], tp_bytes[MAX_RANKS];   // rank's TP group, during step 1
} run_t;

static void rank_main(mt_world *w, int rank, void *arg) {
    run_t *run = (run_t *)arg;
    mt_rank *r = (mt_rank *)mt_calloc(1, sizeof(mt_rank), "rank");
    mt_rank_init(r, &run->cfg, w, rank);
    run->report[rank] = r->memory;
    for (int it = 1; it <= STEPS; it++) {
        unsigned long long calls = r->groups.tp.calls, bytes = r->groups.tp.bytes;
        mt_step_result res = mt_train_step(r, synthetic_batch, NULL, it);
        if (it == 1) { run->tp_calls[rank] = r->groups.tp.calls - calls; run->tp_bytes[rank] = r->groups.tp.bytes - bytes; }
        if (rank == 0) { run->losses[it - 1] = res.loss; run->norms[it - 1] = res.grad_norm; }
    }
    mt_rank_free(r);
    free(r);
}

// the model of tests/test_layouts.c: L=4, C=32, NH=4, T=16, V=101
static void configure(mt_config *cfg, int tp, int pp, int dp, int vp_layers, int sp, int micro, int global,
                      const char *recompute, int dist) {
    synthetic_config(cfg, tp, pp, dp);
    cfg->parallel.num_layers_per_virtual_pipeline_stage = vp_layers;
    cfg->parallel.sequence_parallel = sp;
    cfg->parallel.use_distributed_optimizer = dist;
    cfg->train.micro_batch_size = micro;
    cfg->train.global_batch_size = global;
    cfg->train.train_iters = STEPS;
    cfg->train.lr = 3e-3f;
    snprintf(cfg->train.recompute_granularity, sizeof cfg->train.recompute_granularity, "%s", recompute);
    if (strcmp(recompute, "full") == 0)
        snprintf(cfg->train.recompute_method, sizeof cfg->train.recompute_method, "uniform");
    mt_config_derive(cfg);
}

static void train(run_t *run) {
    mt_world *w = mt_world_create(run->cfg.world_size);
    int rc = mt_world_run(w, rank_main, run);
    mt_world_destroy(w);
    mt_expect(rc == 0, "the run failed");
}

// ---------------------------------------------------------------------------------------------
// the forward is plain TP's, bit for bit
MT_TEST(sp_forward_is_tp_forward) {
    static run_t tp, sp;
    int micro[] = {2, 1};   // the strided gather/scatter path, and B = 1 (shards already in place)
    for (int k = 0; k < 2; k++) {
        configure(&tp.cfg, 2, 1, 1, 0, 0, micro[k], 4, "", 0);
        configure(&sp.cfg, 2, 1, 1, 0, 1, micro[k], 4, "", 0);
        train(&tp);
        train(&sp);
        // tolerance 0: the same operations on the same numbers in the same order (see the top)
        mt_expect(sp.losses[0] == tp.losses[0], "B=%d: step 1 loss with SP %.9g, without %.9g: the forward must be "
                  "the same float", micro[k], (double)sp.losses[0], (double)tp.losses[0]);
        // 1e-6: the layernorm gradients are summed per shard and then over TP (fp32 reordering,
        // a few ulps of the norm's terms)
        mt_expect(fabs(sp.norms[0] - tp.norms[0]) <= 1e-6 * tp.norms[0], "B=%d: grad norm %.9g vs %.9g", micro[k],
                  (double)sp.norms[0], (double)tp.norms[0]);
        printf("  B=%d: step 1 loss %.9g with and without SP; grad norm %.9g without, %.9g with\n", micro[k],
               (double)sp.losses[0], (double)tp.norms[0], (double)sp.norms[0]);
    }
}

// the forward-only paths: evaluation and generation (section 11) before any training, the
// same floats and the same tokens with and without SP
typedef struct { mt_config cfg; float eval_loss; int32_t ids[32]; int n; int32_t cached[12]; int n_cached; float *logits; } forward_run;

static void forward_rank(mt_world *w, int rank, void *arg) {
    forward_run *run = (forward_run *)arg;
    mt_rank *r = (mt_rank *)mt_calloc(1, sizeof(mt_rank), "rank");
    mt_rank_init(r, &run->cfg, w, rank);
    float loss = mt_eval_step(r, synthetic_batch, NULL, 1);
    // a prompt longer than a rank's sequence shard (T/TP = 8): a decoder that kept SP would cut it
    int32_t ids[32] = {5, 17, 42, 7, 1, 30, 11, 2, 19, 23, 3};
    mt_sampling greedy = {0.0f, 0, 0.0f, 1234};
    int n = mt_generate_uncached(r, ids, 11, 32, 12, &greedy, 0, NULL);   // the training forward, SP on
    // the KV-cache generator: its (B, new tokens, C) tensors are whole on every TP rank, SP off
    mt_generator g;
    mt_generator_init(r, &g, 1, 11, 32);
    const int32_t prompt[11] = {5, 17, 42, 7, 1, 30, 11, 2, 19, 23, 3}, *prompts[1] = {prompt};
    int prompt_len = 11, count = 0;
    mt_generate_request q;
    memset(&q, 0, sizeof q);
    q.n = 1; q.prompts = prompts; q.prompt_lens = &prompt_len; q.max_new_tokens = 5; q.sampling = greedy;   // 11 + 5 = the 16 positions
    q.eod = -1; q.tokens = run->cached; q.counts = &count;
    int32_t cached[12];
    q.tokens = cached;
    // the logits each token was sampled from (an untrained model's greedy tokens barely depend
    // on the context, so its logits are what shows a wrong row)
    int V = r->cfg->model.vocab_size;
    float *logits = (float *)mt_calloc((size_t)5 * V, sizeof(float), "logits");
    q.logits = logits;
    mt_generate_batch(r, &g, &q);
    mt_generator_free(&g);
    if (rank == 0) {
        run->eval_loss = loss; run->n = n; memcpy(run->ids, ids, sizeof ids);
        run->n_cached = count; memcpy(run->cached, cached, sizeof cached);
        run->logits = logits;
    } else {
        free(logits);
    }
    mt_rank_free(r);
    free(r);
}

MT_TEST(sp_eval_and_generate) {
    static forward_run tp, sp;
    for (int k = 0; k < 2; k++) {
        forward_run *run = k ? &sp : &tp;
        configure(&run->cfg, 2, 1, 1, 0, k, 2, 4, "", 0);
        mt_world *w = mt_world_create(run->cfg.world_size);
        mt_expect(mt_world_run(w, forward_rank, run) == 0, "the forward-only run failed");
        mt_world_destroy(w);
    }
    // tolerance 0: the same forward (see the top)
    mt_expect(sp.eval_loss == tp.eval_loss, "eval loss %.9g with SP, %.9g without", (double)sp.eval_loss,
              (double)tp.eval_loss);
    int same = sp.n == tp.n && memcmp(sp.ids, tp.ids, sizeof(int32_t) * (size_t)tp.n) == 0;
    mt_expect(same && tp.n == 23, "greedy generation differs with SP (or did not run: %d and %d tokens)", sp.n, tp.n);
    // the KV cache's tokens: the same with SP (it decodes without it) and the same as the window's
    int cached_same = sp.n_cached == 5 && tp.n_cached == 5 && memcmp(sp.cached, tp.cached, 5 * sizeof(int32_t)) == 0 &&
                      memcmp(tp.cached, tp.ids + 11, 5 * sizeof(int32_t)) == 0 &&
                      memcmp(sp.logits, tp.logits, (size_t)5 * tp.cfg.model.vocab_size * sizeof(float)) == 0;
    free(sp.logits);
    free(tp.logits);
    mt_expect(cached_same, "the KV-cache generator's tokens differ with SP (%d and %d tokens)", sp.n_cached, tp.n_cached);
    printf("  eval loss %.9g with and without SP; 12 greedy tokens identical: %s; 5 with the KV cache (and their logits): %s\n",
           (double)sp.eval_loss, same ? "yes" : "NO", cached_same ? "yes" : "NO");
}

// ---------------------------------------------------------------------------------------------
// activation memory: the residual stream's tensors shrink by TP, counted from the shapes
MT_TEST(sp_activation_memory) {
    static run_t tp, sp;
    int TP = 2;
    size_t L = 4, B = 2, T = 16, C = 32, BT = B * T, BTC = BT * C;
    configure(&tp.cfg, TP, 1, 1, 0, 0, (int)B, 4, "", 0);
    configure(&sp.cfg, TP, 1, 1, 0, 1, (int)B, 4, "", 0);
    train(&tp);
    train(&sp);
    // per layer: ln1, residual2, ln2, residual3 (B,T,C) and the two layernorms' mean and rstd
    // (B,T); per slot: the chunk input (B,T,C), lnf (B,T,C) and its mean and rstd. One slot (no
    // pipeline). SP keeps 1/TP of each: it saves (1 - 1/TP) of them.
    size_t region = L * (4 * BTC + 4 * BT) + BTC + BTC + 2 * BT;
    size_t saved = (region - region / TP) * sizeof(float);
    // the workspace: out_c, dresidual, dln shrink to (B,T/TP,C); the gathered sequence, the partial
    // sums and the collectives' staging (B > 1) are new, (B,T,C) each
    size_t workspace_added = (3 * BTC - 3 * (BTC - BTC / TP)) * sizeof(float);
    for (int rank = 0; rank < TP; rank++) {
        mt_memory_report *a = &tp.report[rank], *b = &sp.report[rank];
        mt_expect(b->activations == a->activations - saved, "rank %d: activations %zu bytes with SP, %zu without: the "
                  "shapes say %zu", rank, b->activations, a->activations, a->activations - saved);
        mt_expect(b->scratch == a->scratch + workspace_added, "rank %d: workspace %zu with SP, %zu without: the shapes "
                  "say %zu", rank, b->scratch, a->scratch, a->scratch + workspace_added);
        mt_expect(b->activations + b->scratch < a->activations + a->scratch, "rank %d: SP must need less memory",
                  rank);
        mt_expect(b->params == a->params && b->grads == a->grads && b->optimizer == a->optimizer,
                  "rank %d: SP must not change parameters, gradients or the optimizer", rank);
    }
    printf("  TP=2, B=2, T=16, C=32, 4 layers: activations %zu -> %zu bytes (-%zu), workspace %zu -> %zu\n",
           tp.report[0].activations, sp.report[0].activations, saved, tp.report[0].scratch, sp.report[0].scratch);
}

// the memory plan (--dry-run) is what every rank allocates, with SP and every knob beside it
MT_TEST(sp_memory_plan_is_the_allocation) {
    static run_t run;
    struct { int tp, pp, dp, vp, micro, global, dist; const char *recompute; } cases[] = {
        {2, 1, 1, 0, 2, 4, 0, ""}, {2, 1, 1, 0, 1, 4, 0, ""}, {4, 1, 1, 0, 2, 4, 0, "full"},
        {2, 2, 1, 1, 2, 8, 0, "full"}, {2, 2, 1, 0, 1, 8, 0, "selective"}, {2, 1, 2, 0, 2, 8, 1, ""},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        configure(&run.cfg, cases[c].tp, cases[c].pp, cases[c].dp, cases[c].vp, 1, cases[c].micro, cases[c].global,
                  cases[c].recompute, cases[c].dist);
        train(&run);
        mt_config cfg = run.cfg;
        cfg.parallel.sequence_parallel = 0;
        mt_memory_report plain;   // rank 0's plan without SP, for the log line
        mt_memory_plan(&cfg, 0, &plain);
        for (int rank = 0; rank < run.cfg.world_size; rank++) {
            mt_memory_report plan, without;
            mt_memory_plan(&run.cfg, rank, &plan);
            mt_memory_plan(&cfg, rank, &without);
            mt_memory_report *got = &run.report[rank];
            int same = plan.params == got->params && plan.grads == got->grads && plan.optimizer == got->optimizer &&
                       plan.activations == got->activations && plan.scratch == got->scratch;
            mt_expect(same, "case %zu rank %d: the plan (%zu %zu %zu %zu %zu) is not the allocation (%zu %zu %zu %zu "
                      "%zu)", c, rank, plan.params, plan.grads, plan.optimizer, plan.activations, plan.scratch,
                      got->params, got->grads, got->optimizer, got->activations, got->scratch);
            mt_expect(plan.activations < without.activations, "case %zu rank %d: SP must shrink the activations "
                      "(%zu, without SP %zu)", c, rank, plan.activations, without.activations);
        }
        printf("  TP=%d PP=%d DP=%d%s B=%d%s%s: rank 0 activations %zu bytes (without SP %zu), plan = allocation\n",
               cases[c].tp, cases[c].pp, cases[c].dp, cases[c].vp ? " interleaved" : "", cases[c].micro,
               cases[c].dist ? " dist-opt" : "", cases[c].recompute[0] ? (cases[c].recompute[0] == 'f' ?
               " recompute full" : " recompute selective") : "", run.report[0].activations, plain.activations);
    }
}

// ---------------------------------------------------------------------------------------------
// the communication counters (section 2) count the new collectives
MT_TEST(sp_communication_counts) {
    static run_t tp, sp;
    unsigned long long L = 4, m = 2, B = 2, T = 16, C = 32, BTC4 = B * T * C * 4, BT4 = B * T * 4;
    configure(&tp.cfg, 2, 1, 1, 0, 0, (int)B, 4, "", 0);   // 2 micro-batches per step
    configure(&sp.cfg, 2, 1, 1, 0, 1, (int)B, 4, "", 0);
    train(&tp);
    train(&sp);
    // plain TP, per micro-batch: forward: the embedding's all-reduce, two per layer (g after the
    // attention and MLP projections), three (B,T) all-reduces of the cross-entropy; backward: one
    // per layer's column-parallel layers (f) and one for the LM head
    unsigned long long tp_calls = m * ((1 + 2 * L + 3) + (2 * L + 1));
    unsigned long long tp_bytes = m * ((1 + 2 * L + 2 * L + 1) * BTC4 + 3 * BT4);
    // SP, per micro-batch: forward: the embedding's reduce-scatter, per layer an all-gather before
    // QKV and FC and a reduce-scatter after the projections (4), the LM head's all-gather, the
    // cross-entropy's three; backward: the LM head's re-gather and reduce-scatter (2), per layer
    // the projections' all-gathers of dY (2) and QKV's and FC's re-gathers of X and reduce-scatters
    // of dX (4), the embedding's all-gather of dY. Per step: the layernorms' gradients, one
    // all-reduce per run of neighbouring tensors (ln1w|ln1b, ln2w|ln2b, lnfw|lnfb).
    // A reduce-scatter or all-gather counts the whole (B,T,C) buffer, as an all-reduce does.
    unsigned long long sp_calls = m * ((1 + 4 * L + 1 + 3) + (2 + 6 * L + 1)) + 3;
    unsigned long long sp_bytes = m * ((1 + 4 * L + 1 + 2 + 6 * L + 1) * BTC4 + 3 * BT4) + (4 * L * C + 2 * C) * 4;
    for (int rank = 0; rank < 2; rank++) {
        mt_expect(tp.tp_calls[rank] == tp_calls && tp.tp_bytes[rank] == tp_bytes, "rank %d without SP: %llu calls %llu "
                  "bytes, the layers say %llu and %llu", rank, tp.tp_calls[rank], tp.tp_bytes[rank], tp_calls, tp_bytes);
        mt_expect(sp.tp_calls[rank] == sp_calls && sp.tp_bytes[rank] == sp_bytes, "rank %d with SP: %llu calls %llu "
                  "bytes, the layers say %llu and %llu", rank, sp.tp_calls[rank], sp.tp_bytes[rank], sp_calls, sp_bytes);
    }
    printf("  TP group per step: %llu calls %llu bytes without SP, %llu calls %llu bytes with SP\n", tp.tp_calls[0],
           tp.tp_bytes[0], sp.tp_calls[0], sp.tp_bytes[0]);
}

// ---------------------------------------------------------------------------------------------
// --print-layout and the flag's errors
MT_TEST(sp_print_layout) {
    mt_config cfg;
    configure(&cfg, 4, 1, 1, 0, 1, 2, 2, "", 0);
    FILE *f = tmpfile();
    mt_print_layout(&cfg, f);
    rewind(f);
    char text[8192];
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = 0;
    fclose(f);
    mt_expect(strstr(text, "sequence parallel: layernorms, dropouts and residuals hold T/TP = 4 of the 16 positions of "
                           "every sample: tp0 0..3, tp1 4..7, tp2 8..11, tp3 12..15") != NULL,
              "--print-layout does not say which positions each TP rank holds:\n%s", text);
}

// mt_fatal exits: each error case runs in a forked child, its output captured
static int child_derive(mt_config *cfg, char *out, size_t cap) {
    int fd[2];
    if (pipe(fd) != 0) return -1;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        close(fd[0]);
        dup2(fd[1], 1);
        dup2(fd[1], 2);
        mt_config_derive(cfg);
        _exit(77);   // derive returned: no error
    }
    close(fd[1]);
    size_t len = 0;
    ssize_t k;
    while (len + 1 < cap && (k = read(fd[0], out + len, cap - 1 - len)) > 0) len += (size_t)k;
    out[len] = 0;
    close(fd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

MT_TEST(sp_flag_errors) {
    mt_config cfg;
    char out[4096];
    configure(&cfg, 2, 1, 1, 0, 1, 2, 2, "", 0);
    cfg.parallel.tensor_model_parallel_size = 1;
    cfg.parallel.nproc_per_node = 1;
    int rc = child_derive(&cfg, out, sizeof out);
    mt_expect(rc == 1 && strstr(out, "error: --sequence-parallel needs tensor parallelism") != NULL,
              "SP with TP=1: exit %d, output:\n%s", rc, out);
    configure(&cfg, 2, 1, 1, 0, 1, 2, 2, "", 0);
    cfg.model.seq_length = cfg.model.max_position_embeddings = 15;
    rc = child_derive(&cfg, out, sizeof out);
    mt_expect(rc == 1 && strstr(out, "--seq-length 15 is not divisible by --tensor-model-parallel-size 2") != NULL,
              "SP with T=15, TP=2: exit %d, output:\n%s", rc, out);
    // and the flag parses
    mt_config_defaults(&cfg);
    char *argv[] = {"train_gpt", "--sequence-parallel", "--tensor-model-parallel-size", "2"};
    mt_config_parse(&cfg, 4, argv);
    mt_expect(cfg.parallel.sequence_parallel == 1, "--sequence-parallel was not read");
}

int main(void) {
    alarm(600);   // a deadlock in a collective fails loudly instead of hanging CI
    mt_run_test(sp_flag_errors);
    mt_run_test(sp_print_layout);
    mt_run_test(sp_forward_is_tp_forward);
    mt_run_test(sp_eval_and_generate);
    mt_run_test(sp_activation_memory);
    mt_run_test(sp_memory_plan_is_the_allocation);
    mt_run_test(sp_communication_counts);
    return mt_test_summary();
}

/* tests/test_layouts.c - every TP x PP x DP layout trains exactly like one rank (§4, §7, §8).
 *
 * For each layout: 10 training steps of a 4-layer model on the same global batches. Per-step
 * losses must match the 1x1x1 run within 1e-5 relative, and so must every parameter once the
 * shards of all ranks are gathered back into full tensors. Then the same with dropout on
 * (masks come from a counter-based RNG keyed on global indices, so they too are the same).
 *
 * Why 1e-5 and not exact: TP changes the order of float additions (a row-parallel matmul sums
 * C/TP products per rank, then the all-reduce adds the partial sums), so results differ in the
 * last bits (fp32 epsilon 6e-8, a few ulps per op, compounded over 10 AdamW steps). DP and PP
 * change nothing but the place where sums happen: they agree to rounding too.
 * Sequence parallel (§4) is one more such place: the layernorms' weight and bias gradients are
 * summed over T/TP positions per rank and then across the TP ranks, instead of over all T at
 * once; the same tolerance holds. The SP layouts run with micro-batches of 2 (the strided
 * gather/scatter path) and of 1 (the shards already in place), with the distributed optimizer
 * and with activation recompute.
 */
#define MEGATRON_IMPLEMENTATION
#include "../megatron.h"
#include "harness.h"
#include "synthetic.h"

#define STEPS 10
#define MAX_PARAMS 400000

typedef struct {
    mt_config cfg;
    int closes[8];            // rank 0's --overlap-grad-reduce buckets (mt_grad_buckets.closes), -2: off
    float losses[STEPS];
    float norms[STEPS];
    float *global_params;     // every tensor, unsharded, in carve order: see global_offsets
    size_t global_offsets[MT_NUM_PARAM_TENSORS + 1];
} layout_run;

static void global_layout(const mt_config *cfg, size_t *offsets) {
    // global sizes of each tensor (grows x gcols x layers), from a 1x1x1 rank's specs
    int L = cfg->model.num_layers, C = cfg->model.hidden_size, F = cfg->model.ffn_hidden_size;
    int V = cfg->model.vocab_size, maxT = cfg->model.max_position_embeddings;
    size_t sizes[MT_NUM_PARAM_TENSORS] = {
        (size_t)V * C, (size_t)maxT * C, (size_t)L * C, (size_t)L * C, (size_t)L * 3 * C * C, (size_t)L * 3 * C,
        (size_t)L * C * C, (size_t)L * C, (size_t)L * C, (size_t)L * C, (size_t)L * F * C, (size_t)L * F,
        (size_t)L * C * F, (size_t)L * C, (size_t)C, (size_t)C};
    offsets[0] = 0;
    for (int i = 0; i < MT_NUM_PARAM_TENSORS; i++) offsets[i + 1] = offsets[i] + sizes[i];
}

static void rank_main(mt_world *w, int rank, void *arg) {
    layout_run *run = (layout_run *)arg;
    mt_rank *r = (mt_rank *)mt_calloc(1, sizeof(mt_rank), "rank");
    mt_rank_init(r, &run->cfg, w, rank);
    if (rank == 0)
        for (int l = 0; l < 8; l++) run->closes[l] = r->buckets.on && l < r->dims.L_local ? r->buckets.closes[l] : -2;
    for (int it = 1; it <= STEPS; it++) {
        mt_step_result res = mt_train_step(r, synthetic_batch, NULL, it);
        if (rank == 0) { run->losses[it - 1] = res.loss; run->norms[it - 1] = res.grad_norm; }
    }
    // gather: each tensor element is written by exactly one rank (dp_rank 0; tp_rank 0 for
    // TP-replicated tensors; the first stage for the tied wte)
    if (r->ps.dp_rank == 0)
        for (int i = 0; i < MT_NUM_PARAM_TENSORS; i++) {
            const mt_param_spec *s = &r->model.specs[i];
            if (!s->present) continue;
            if (s->split == MT_SPLIT_NONE && r->ps.tp_rank != 0) continue;
            if (i == 0 && !r->ps.is_first_stage) continue;
            mt_shard_copy(r, s, r->model.params_memory, run->global_params + run->global_offsets[i], 0);
        }
    mt_rank_free(r);
    free(r);
}

// one layout to compare with 1x1x1
typedef struct {
    int tp, pp, dp, layers_per_virtual, dist;   // dist: --use-distributed-optimizer
    int sp;                                     // --sequence-parallel
    int micro;                                  // --micro-batch-size, 0: 2 (the global batch is always 8)
    const char *recompute;                      // "" | "full" (uniform 1) | "selective"
    int overlap;                                // --overlap-grad-reduce
    long bucket;                                // --ddp-bucket-size, 0: 5000 (a bucket per layer)
} layout;

static int no_async_tp;   // the next runs' --no-async-tensor-model-parallel-allreduce (the last test's knob)

static void run_layout_with(layout_run *run, const layout *L, float dropout) {
    int tp = L->tp, pp = L->pp, dp = L->dp;
    mt_config *cfg = &run->cfg;
    mt_config_defaults(cfg);
    cfg->model.num_layers = 4;
    cfg->model.hidden_size = 32;
    cfg->model.num_attention_heads = 4;
    cfg->model.seq_length = 16;
    cfg->model.vocab_size = 101;            // padded to 128*TP: the padding differs per layout
    cfg->model.hidden_dropout = dropout;
    cfg->model.attention_dropout = dropout;
    cfg->parallel.tensor_model_parallel_size = tp;
    cfg->parallel.pipeline_model_parallel_size = pp;
    cfg->parallel.nproc_per_node = tp * pp * dp;
    cfg->parallel.num_layers_per_virtual_pipeline_stage = L->layers_per_virtual;
    cfg->parallel.ddp_bucket_size = L->bucket ? L->bucket : 5000;   // several buckets (a layer is ~12,700)
    cfg->parallel.overlap_grad_reduce = L->overlap;
    cfg->parallel.use_distributed_optimizer = L->dist;
    cfg->parallel.sequence_parallel = L->sp;
    cfg->parallel.no_async_tensor_model_parallel_allreduce = no_async_tp;
    snprintf(cfg->train.recompute_granularity, sizeof cfg->train.recompute_granularity, "%s", L->recompute);
    if (strcmp(L->recompute, "full") == 0) snprintf(cfg->train.recompute_method, sizeof cfg->train.recompute_method,
                                                     "uniform");
    cfg->train.micro_batch_size = L->micro ? L->micro : 2;
    cfg->train.global_batch_size = 8;
    cfg->train.train_iters = STEPS;
    cfg->train.lr = 3e-3f;
    cfg->train.lr_warmup_iters = 2;
    cfg->train.weight_decay = 0.1f;
    cfg->train.clip_grad = 1.0f;
    mt_config_derive(cfg);
    global_layout(cfg, run->global_offsets);
    run->global_params = (float *)mt_calloc(run->global_offsets[MT_NUM_PARAM_TENSORS], sizeof(float), "global params");
    mt_world *w = mt_world_create(cfg->world_size);
    int rc = mt_world_run(w, rank_main, run);
    mt_world_destroy(w);
    mt_expect(rc == 0, "layout TP=%d PP=%d DP=%d failed to run", tp, pp, dp);
}

static void run_layout(layout_run *run, int tp, int pp, int dp, int layers_per_virtual, float dropout, int dist) {
    layout L = {tp, pp, dp, layers_per_virtual, dist, 0, 0, "", 0, 0};
    run_layout_with(run, &L, dropout);
}

static const char *tensor_names[MT_NUM_PARAM_TENSORS] = {"wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
                                                         "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"};

// The key bias is the one parameter that cannot be compared: its exact gradient is zero
// (q . (k + b) shifts every score of a softmax row by the same q . b, which softmax ignores),
// so what the backward computes for it is rounding noise, ~1e-10, and AdamW normalises that
// noise into steps of about lr each way. Its value after training is noise in every layout
// (PyTorch's too). So: Q and V biases at 1e-5 norm-wise like every other tensor, and the key
// bias only bounded by what AdamW can do with noise: |b_k| <= lr * steps.
static int check_qkv_bias(const char *name, const layout_run *run, const layout_run *ref) {
    int C = ref->cfg.model.hidden_size, L = ref->cfg.model.num_layers;
    size_t off = ref->global_offsets[5];
    int ok = 1;
    for (int l = 0; l < L; l++) {
        const float *got = run->global_params + off + (size_t)l * 3 * C, *want = ref->global_params + off + (size_t)l * 3 * C;
        char label[200];
        snprintf(label, sizeof label, "%s layer %d Q", name, l);
        ok &= mt_check_tensor_normwise(label, got, want, (size_t)C, 1e-5);
        snprintf(label, sizeof label, "%s layer %d V", name, l);
        ok &= mt_check_tensor_normwise(label, got + 2 * C, want + 2 * C, (size_t)C, 1e-5);
        for (int c = 0; c < C; c++) {
            float bound = ref->cfg.train.lr * STEPS * 1.01f;
            if (!(fabsf(got[C + c]) <= bound)) { ok = 0; mt_expect(0, "%s layer %d key bias %d = %g beyond the AdamW noise bound %g", name, l, c, (double)got[C + c], (double)bound); }
        }
    }
    return ok;
}

static void compare_layouts(float dropout) {
    static const layout layouts[] = {   // TP, PP, DP, layers per virtual stage, distributed optimizer, SP, B, recompute
        {2, 1, 1, 0, 0, 0, 0, "", 0, 0}, {1, 2, 1, 0, 0, 0, 0, "", 0, 0}, {1, 1, 2, 0, 0, 0, 0, "", 0, 0}, {2, 1, 2, 0, 0, 0, 0, "", 0, 0},
        {2, 2, 1, 0, 0, 0, 0, "", 0, 0}, {1, 2, 2, 0, 0, 0, 0, "", 0, 0}, {2, 2, 2, 0, 0, 0, 0, "", 0, 0}, {4, 1, 1, 0, 0, 0, 0, "", 0, 0},
        {1, 4, 1, 0, 0, 0, 0, "", 0, 0}, {4, 2, 1, 0, 0, 0, 0, "", 0, 0}, {1, 2, 1, 1, 0, 0, 0, "", 0, 0},
        // the distributed optimizer (ZeRO-1): shards cut through tensors; DP=4 cuts them finer
        {1, 1, 2, 0, 1, 0, 0, "", 0, 0}, {1, 1, 4, 0, 1, 0, 0, "", 0, 0}, {2, 2, 2, 0, 1, 0, 0, "", 0, 0}, {1, 2, 2, 1, 1, 0, 0, "", 0, 0},
        // sequence parallel: TP 2 and 4, with DP, with PP (and interleaved), with the distributed
        // optimizer, with full and selective recompute, with micro-batches of 1
        {2, 1, 1, 0, 0, 1, 0, "", 0, 0}, {2, 1, 2, 0, 0, 1, 0, "", 0, 0}, {2, 2, 1, 0, 0, 1, 0, "", 0, 0}, {4, 1, 1, 0, 0, 1, 0, "", 0, 0},
        {2, 1, 1, 0, 0, 1, 1, "", 0, 0}, {4, 2, 1, 0, 0, 1, 1, "", 0, 0}, {2, 2, 2, 0, 1, 1, 0, "", 0, 0}, {2, 1, 2, 0, 1, 1, 0, "", 0, 0},
        {2, 2, 1, 1, 0, 1, 0, "full", 0, 0}, {2, 1, 2, 0, 1, 1, 0, "selective", 0, 0}, {4, 1, 1, 0, 0, 1, 0, "full", 0, 0}};
    layout_run ref, run;
    run_layout(&ref, 1, 1, 1, 0, dropout, 0);
    mt_expect(ref.losses[STEPS - 1] < ref.losses[0] - 0.1f, "the reference run did not learn (%g -> %g)",
              (double)ref.losses[0], (double)ref.losses[STEPS - 1]);
    for (size_t k = 0; k < sizeof layouts / sizeof layouts[0]; k++) {
        const layout *L = &layouts[k];
        run_layout_with(&run, L, dropout);
        char what[96];   // the knobs beyond TP x PP x DP
        snprintf(what, sizeof what, "%s%s%s%s%s%s", L->layers_per_virtual ? " interleaved" : "",
                 L->dist ? " dist-opt" : "", L->sp ? " SP" : "", L->micro == 1 ? " B=1" : "",
                 L->recompute[0] ? " recompute " : "", L->recompute);
        char label[160];
        snprintf(label, sizeof label, "TP=%d PP=%d DP=%d%s dropout=%.1f losses", L->tp, L->pp, L->dp, what,
                 (double)dropout);
        // 1e-5: reordered fp32 sums, see the top of this file
        int ok = mt_check_tensor(label, run.losses, ref.losses, STEPS, 1e-5);
        for (int i = 0; i < MT_NUM_PARAM_TENSORS; i++) {
            char name[160];
            snprintf(name, sizeof name, "TP=%d PP=%d DP=%d%s %s", L->tp, L->pp, L->dp, what, tensor_names[i]);
            size_t off = ref.global_offsets[i], n = ref.global_offsets[i + 1] - off;
            if (strcmp(tensor_names[i], "qkvb") == 0) { ok &= check_qkv_bias(name, &run, &ref); continue; }
            // 1e-5 of the tensor's scale (norm-wise): reordered sums round at the scale of their
            // terms, so near-zero elements carry errors set by the tensor's magnitude
            ok &= mt_check_tensor_normwise(name, run.global_params + off, ref.global_params + off, n, 1e-5);
        }
        printf("  %-62s %s  (loss %.6f -> %.6f)\n", label, ok ? "same as 1x1x1" : "DIFFERS", (double)run.losses[0],
               (double)run.losses[STEPS - 1]);
        free(run.global_params);
    }
    free(ref.global_params);
}

MT_TEST(layouts_match_one_rank) { compare_layouts(0.0f); }
MT_TEST(layouts_match_one_rank_with_dropout) { compare_layouts(0.1f); }

// dropout must change the result (else the test above proves nothing about masks)
MT_TEST(dropout_changes_the_loss) {
    layout_run a, b;
    run_layout(&a, 1, 1, 1, 0, 0.0f, 0);
    run_layout(&b, 1, 1, 1, 0, 0.2f, 0);
    mt_expect(fabsf(a.losses[0] - b.losses[0]) > 1e-4f, "dropout 0.2 gave the same first loss as no dropout");
    free(a.global_params);
    free(b.global_params);
}

// --overlap-grad-reduce (section 7) reduces the same gradients with the same sums, only earlier:
// bit-identical to the same layout without it (the threads backend adds in rank order whatever
// the pieces), in every layout where a bucket can start early: DP with TP, PP (1F1B, interleaved,
// the tied embedding's group), the distributed optimizer (whose buckets are all-reduced), sequence
// parallelism (the layernorms left to the finish), recompute, one bucket per layer or per chunk.
// And the buckets are where section 7 says: closes[l] = the top layer of the bucket l closes.
MT_TEST(overlap_grad_reduce_changes_no_bit) {
    static const layout layouts[] = {
        //TP PP DP vs dist SP B  recompute  overlap bucket
        {1, 1, 2, 0, 0, 0, 0, "", 1, 0},        {1, 1, 2, 0, 0, 0, 0, "", 1, 40000000},
        {1, 1, 4, 0, 0, 0, 1, "", 1, 30000},    {2, 1, 2, 0, 0, 0, 0, "", 1, 0},
        {1, 2, 2, 0, 0, 0, 0, "", 1, 0},        {1, 2, 2, 1, 0, 0, 0, "", 1, 40000000},
        {1, 1, 2, 0, 1, 0, 0, "", 1, 0},        {2, 2, 2, 0, 1, 0, 0, "", 1, 0},
        {2, 1, 2, 0, 0, 1, 0, "", 1, 0},        {2, 1, 2, 0, 1, 1, 0, "selective", 1, 0},
        {1, 1, 2, 0, 0, 0, 0, "full", 1, 0}};
    // rank 0's buckets: per layer (4 layers, 5000 elements: each layer fills one), one per chunk,
    // 30000 (from the top, in backward order: layers 3..1 reach it, layer 0 is the rest), the
    // stage's 2 layers, interleaved chunks of 1 layer
    static const int want_closes[][4] = {
        {0, 1, 2, 3}, {3, -1, -1, -1}, {0, 3, -1, -1}, {0, 1, 2, 3}, {0, 1, -2, -2}, {0, 1, -2, -2},
        {0, 1, 2, 3}, {0, 1, -2, -2}, {0, 1, 2, 3}, {0, 1, 2, 3}, {0, 1, 2, 3}};
    layout_run plain, over;
    for (size_t k = 0; k < sizeof layouts / sizeof layouts[0]; k++) {
        layout L = layouts[k];
        run_layout_with(&over, &L, 0.1f);
        L.overlap = 0;
        run_layout_with(&plain, &L, 0.1f);
        char label[160];
        snprintf(label, sizeof label, "TP=%d PP=%d DP=%d%s%s%s%s%s bucket %ld", L.tp, L.pp, L.dp,
                 L.layers_per_virtual ? " interleaved" : "", L.dist ? " dist-opt" : "", L.sp ? " SP" : "",
                 L.recompute[0] ? " recompute " : "", L.recompute, L.bucket ? L.bucket : 5000L);
        int same = memcmp(over.losses, plain.losses, sizeof over.losses) == 0 &&
                   memcmp(over.global_params, plain.global_params,
                          over.global_offsets[MT_NUM_PARAM_TENSORS] * sizeof(float)) == 0;
        mt_expect(same, "%s: --overlap-grad-reduce changed the training (loss %.9g vs %.9g at the end)", label,
                  (double)over.losses[STEPS - 1], (double)plain.losses[STEPS - 1]);
        int buckets_ok = memcmp(over.closes, want_closes[k], sizeof want_closes[k]) == 0 && plain.closes[0] == -2;
        mt_expect(buckets_ok, "%s: buckets closed at %d %d %d %d, want %d %d %d %d", label, over.closes[0],
                  over.closes[1], over.closes[2], over.closes[3], want_closes[k][0], want_closes[k][1],
                  want_closes[k][2], want_closes[k][3]);
        printf("  %-62s %s  buckets %d %d %d %d\n", label, same ? "bit-identical" : "DIFFERS", over.closes[0],
               over.closes[1], over.closes[2], over.closes[3]);
        free(over.global_params);
        free(plain.global_params);
    }
}

// and a bucket is reduced when its lowest layer's last backward is done, not before, not after:
// every rank's gradient buffer holds (DP rank + 1); mt_grad_bucket_ready for a layer that closes
// no bucket, or for an earlier micro-batch, changes nothing; for the closing layer, exactly its
// bucket's ranges become the sum over DP (1 + 2 = 3), everything else keeps the rank's own value
typedef struct { mt_config cfg; int bad; } bucket_probe;
static void bucket_rank(mt_world *w, int rank, void *arg) {
    bucket_probe *p = (bucket_probe *)arg;
    mt_rank *r = (mt_rank *)mt_calloc(1, sizeof(mt_rank), "rank");
    mt_rank_init(r, &p->cfg, w, rank);
    r->state.training = 1;
    size_t n = r->model.num_params;
    float *g = r->model.grads_memory;
    for (size_t i = 0; i < n; i++) g[i] = (float)(r->ps.dp_rank + 1);
    int m = p->cfg.num_microbatches;
    mt_grad_bucket_ready(r, 1, m - 1);   // layer 1: inside the bucket of layers 1..3, does not close it
    mt_grad_bucket_ready(r, 0, m - 2);   // the closing layer, but not the last micro-batch
    for (size_t i = 0; i < n; i++) p->bad += g[i] != (float)(r->ps.dp_rank + 1);
    mt_grad_bucket_ready(r, 0, m - 1);   // closes layers 0..3 (one bucket: 40M elements)
    mt_comm_wait(&r->groups.dp);
    for (int t = 0; t < MT_NUM_PARAM_TENSORS; t++) {
        const mt_param_spec *s = &r->model.specs[t];
        size_t k = (size_t)(s->layers ? s->layers : 1) * s->rows * s->cols;
        float want = s->layers ? 3.0f : (float)(r->ps.dp_rank + 1);   // the layers' tensors only
        for (size_t i = 0; i < k; i++) p->bad += g[s->offset + i] != want;
    }
    mt_rank_free(r);
    free(r);
}
MT_TEST(overlap_grad_reduce_starts_a_bucket_at_its_last_backward) {
    bucket_probe p;
    memset(&p, 0, sizeof p);
    mt_config *cfg = &p.cfg;
    synthetic_config(cfg, 1, 1, 2);   // the model above; micro-batch 2 of 8: 2 micro-batches per DP rank
    cfg->parallel.ddp_bucket_size = 40000000;   // one bucket: layers 0..3
    cfg->parallel.overlap_grad_reduce = 1;
    cfg->train.train_iters = 1;
    mt_config_derive(cfg);
    mt_world *w = mt_world_create(cfg->world_size);
    int rc = mt_world_run(w, bucket_rank, &p);
    mt_world_destroy(w);
    mt_expect(rc == 0 && p.bad == 0, "%d gradient values not as expected around mt_grad_bucket_ready", p.bad);
}

// the column-parallel layers' backward with its collectives started beside the weight gradient (the
// default, Megatron's async tensor-parallel all-reduce; section 4) against the same layout with
// --no-async-tensor-model-parallel-allreduce: the same products and sums in another order, so the
// same bits, in every form of that backward: the all-reduce (TP 2 and 4, with PP and DP, the LM
// head's), and with --sequence-parallel the all-gather of X and the reduce-scatter of dX, through
// the work buffer (B = 2) or straight (B = 1), with the distributed optimizer and recompute
MT_TEST(async_tensor_parallel_allreduce_changes_no_bit) {
    static const layout layouts[] = {
        //TP PP DP vs dist SP B  recompute  overlap bucket
        {2, 1, 1, 0, 0, 0, 0, "", 0, 0},        {4, 1, 1, 0, 0, 0, 0, "", 0, 0},
        {2, 2, 2, 0, 0, 0, 0, "", 0, 0},        {2, 1, 1, 0, 0, 1, 0, "", 0, 0},
        {2, 1, 1, 0, 0, 1, 1, "", 0, 0},        {4, 2, 1, 1, 0, 1, 0, "", 0, 0},
        {2, 1, 2, 0, 1, 1, 0, "selective", 1, 0}, {2, 2, 1, 0, 0, 1, 0, "full", 0, 0}};
    layout_run async, plain;
    for (size_t k = 0; k < sizeof layouts / sizeof layouts[0]; k++) {
        const layout *L = &layouts[k];
        no_async_tp = 0;
        run_layout_with(&async, L, 0.1f);
        no_async_tp = 1;
        run_layout_with(&plain, L, 0.1f);
        no_async_tp = 0;
        char label[160];
        snprintf(label, sizeof label, "TP=%d PP=%d DP=%d%s%s%s%s%s%s", L->tp, L->pp, L->dp,
                 L->layers_per_virtual ? " interleaved" : "", L->dist ? " dist-opt" : "", L->sp ? " SP" : "",
                 L->micro == 1 ? " B=1" : "", L->recompute[0] ? " recompute " : "", L->recompute);
        int same = memcmp(async.losses, plain.losses, sizeof async.losses) == 0 &&
                   memcmp(async.global_params, plain.global_params,
                          async.global_offsets[MT_NUM_PARAM_TENSORS] * sizeof(float)) == 0;
        mt_expect(same, "%s: the async tensor-parallel all-reduce changed the training (loss %.9g vs %.9g at the end)",
                  label, (double)async.losses[STEPS - 1], (double)plain.losses[STEPS - 1]);
        printf("  %-62s %s  (loss %.6f -> %.6f)\n", label, same ? "bit-identical" : "DIFFERS", (double)async.losses[0],
               (double)async.losses[STEPS - 1]);
        free(async.global_params);
        free(plain.global_params);
    }
}

int main(void) {
    alarm(600);   // a deadlocked schedule fails loudly instead of hanging CI
    mt_run_test(layouts_match_one_rank);
    mt_run_test(layouts_match_one_rank_with_dropout);
    mt_run_test(dropout_changes_the_loss);
    mt_run_test(overlap_grad_reduce_changes_no_bit);
    mt_run_test(overlap_grad_reduce_starts_a_bucket_at_its_last_backward);
    mt_run_test(async_tensor_parallel_allreduce_changes_no_bit);
    return mt_test_summary();
}

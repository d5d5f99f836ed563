/* tests/test_recompute.c - activation recompute (§5): the same training, less memory.
 *
 * Recompute runs a layer's forward a second time before its backward instead of keeping its
 * activations. The ops are the same, on the same inputs, in the same order, and dropout masks
 * come from the counter-based RNG: so every loss and every parameter after training must be
 * the SAME BITS as without recompute (tolerance 0), in one rank and in a TP=2 x PP=2 interleaved
 * layout, with dropout on. And the activation memory must be what the method says it keeps,
 * counted from the shapes here independently of the carve.
 * The memory plan (--dry-run) is what the allocation reports; and its kernel scratch term (the
 * most the GPU build's launchers borrow at once, section 3) is what the ops of real steps would
 * have borrowed, as the CPU seam counts them op by op, in every layout and precision tried, and
 * for two shapes what kernels.cuh's allocations add up to, restated here.
 */
#define MEGATRON_IMPLEMENTATION
#include "../megatron.h"
#include "harness.h"
#include "synthetic.h"

#define STEPS 6

typedef struct {
    mt_config cfg;
    float losses[STEPS];
    float norms[STEPS];
    float *params;            // rank 0's parameters after training
    size_t num_params;
    size_t activation_bytes;  // rank 0's report
    mt_memory_report report;  // rank 0's, from its allocation
    size_t scratch_seen[8];   // each rank's r->dev.gpu_scratch_high after the steps: the ops' own count
    size_t scratch_plan[8];   // each rank's mt_gpu_scratch_peak, for the same rung and precision
} run_t;

static void rank_main(mt_world *w, int rank, void *arg) {
    run_t *run = (run_t *)arg;
    mt_rank *r = (mt_rank *)mt_calloc(1, sizeof(mt_rank), "rank");
    mt_rank_init(r, &run->cfg, w, rank);
    for (int it = 1; it <= STEPS; it++) {
        mt_step_result res = mt_train_step(r, synthetic_batch, NULL, it);
        if (rank == 0) { run->losses[it - 1] = res.loss; run->norms[it - 1] = res.grad_norm; }
    }
    if (rank < 8) {
        run->scratch_seen[rank] = r->dev.gpu_scratch_high;
        run->scratch_plan[rank] = mt_gpu_scratch_peak(r, (mt_gemm_impl)r->dev.gemm_impl, r->dev.dtype);
    }
    if (rank == 0) {
        run->num_params = r->model.num_params;
        run->params = (float *)mt_malloc(sizeof(float) * r->model.num_params, "params");
        memcpy(run->params, r->model.params_memory, sizeof(float) * r->model.num_params);
        run->activation_bytes = r->memory.activations;
        run->report = r->memory;
    }
    mt_rank_free(r);
    free(r);
}

static void train(run_t *run, int tp, int pp, int vp_layers, const char *granularity, const char *method, int n) {
    mt_config *cfg = &run->cfg;
    memset(run, 0, sizeof *run);
    synthetic_config(cfg, tp, pp, 1);
    cfg->parallel.num_layers_per_virtual_pipeline_stage = vp_layers;
    cfg->train.train_iters = STEPS;
    cfg->train.lr = 3e-3f;
    cfg->train.weight_decay = 0.1f;
    snprintf(cfg->train.recompute_granularity, sizeof cfg->train.recompute_granularity, "%s", granularity);
    snprintf(cfg->train.recompute_method, sizeof cfg->train.recompute_method, "%s", method);
    cfg->train.recompute_num_layers = n;
    mt_config_derive(cfg);
    mt_world *w = mt_world_create(cfg->world_size);
    int rc = mt_world_run(w, rank_main, run);
    mt_world_destroy(w);
    mt_expect(rc == 0, "the run with recompute '%s %s %d' failed", granularity, method, n);
}

// tolerance 0: the same ops on the same inputs in the same order (see the top)
static void expect_same(const char *what, const run_t *got, const run_t *want) {
    int same = got->num_params == want->num_params;
    for (int s = 0; s < STEPS; s++) same &= got->losses[s] == want->losses[s] && got->norms[s] == want->norms[s];
    mt_expect(same, "%s: losses or grad norms differ from the run without recompute (step 1: %.9g vs %.9g)", what,
              (double)got->losses[0], (double)want->losses[0]);
    size_t diff = 0;
    for (size_t i = 0; same && i < got->num_params; i++) diff += got->params[i] != want->params[i];
    mt_expect(same && diff == 0, "%s: %zu parameters differ after %d steps", what, diff, STEPS);
    printf("  %-44s losses %.6f .. %.6f, parameters identical: %s\n", what, (double)got->losses[0],
           (double)got->losses[STEPS - 1], same && diff == 0 ? "yes" : "NO");
}

// the bytes of layer tensors of one layer (floats), at this test's sizes on one rank:
// B=2, T=16, C=32, NH=4, F=128
static size_t layer_floats(int kind) {
    size_t B = 2, T = 16, C = 32, NH = 4, F = 128, BT = B * T;
    switch (kind) {
    case MT_LT_QKV: return BT * 3 * C;
    case MT_LT_ATTY: return BT * C;
    case MT_LT_LSE: return B * NH * T;
    case MT_LT_FCH: return BT * F;
    case MT_LT_LN1_MEAN: case MT_LT_LN1_RSTD: case MT_LT_LN2_MEAN: case MT_LT_LN2_RSTD: return BT;
    default: return BT * C;
    }
}

MT_TEST(recompute_one_rank) {
    static run_t base, other;
    train(&base, 1, 1, 0, "", "", 1);
    size_t all_layer = 0;
    for (int k = 0; k < MT_LT_COUNT; k++) all_layer += layer_floats(k);
    size_t r3 = layer_floats(MT_LT_RESIDUAL3), L = 4;
    struct { const char *g, *m; int n; const char *name; size_t saved_floats; } cases[] = {
        // uniform 1: every layer keeps its output, the scratch holds one layer's other tensors
        {"full", "uniform", 1, "full, uniform 1", L * (all_layer - r3) - (all_layer - r3)},
        // uniform 2: two groups of two: each keeps its output; the scratch holds two layers
        // (minus the group end's output, kept)
        {"full", "uniform", 2, "full, uniform 2", L * all_layer - 2 * r3 - (2 * all_layer - r3)},
        // block 3: layers 0, 1, 2 recomputed one at a time, layer 3 keeps everything
        {"full", "block", 3, "full, block 3", 3 * (all_layer - r3) - (all_layer - r3)},
        // selective: every layer drops atty and lse, the scratch holds one layer's
        {"selective", "", 1, "selective",
         (L - 1) * (layer_floats(MT_LT_ATTY) + layer_floats(MT_LT_LSE))},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        train(&other, 1, 1, 0, cases[c].g, cases[c].m, cases[c].n);
        expect_same(cases[c].name, &other, &base);
        size_t want = base.activation_bytes - cases[c].saved_floats * sizeof(float);
        mt_expect(other.activation_bytes == want, "%s: activations %zu bytes, the shapes say %zu (without: %zu)",
                  cases[c].name, other.activation_bytes, want, base.activation_bytes);
        printf("  %-44s activations %zu bytes (without recompute %zu)\n", cases[c].name, other.activation_bytes,
               base.activation_bytes);
        free(other.params);
    }
    free(base.params);
}

MT_TEST(recompute_tp2_pp2_interleaved) {
    static run_t base, other;
    train(&base, 2, 2, 1, "", "", 1);
    train(&other, 2, 2, 1, "full", "uniform", 1);
    expect_same("TP=2 PP=2 interleaved, full uniform 1", &other, &base);
    free(other.params);
    train(&other, 2, 2, 1, "selective", "", 1);
    expect_same("TP=2 PP=2 interleaved, selective", &other, &base);
    free(other.params);
    free(base.params);
}

// the flags, as Megatron reads them
MT_TEST(recompute_flags) {
    mt_config cfg;
    mt_config_defaults(&cfg);
    char *argv[] = {"train_gpt", "--recompute-activations", "--num-layers", "2", "--hidden-size", "32",
                    "--num-attention-heads", "4", "--seq-length", "16", "--vocab-size", "101"};
    mt_config_parse(&cfg, (int)(sizeof argv / sizeof argv[0]), argv);
    mt_config_derive(&cfg);
    mt_expect(cfg.recompute == MT_RECOMPUTE_SELECTIVE, "--recompute-activations must mean selective");
    mt_config_defaults(&cfg);
    char *argv2[] = {"train_gpt", "--recompute-granularity", "full", "--recompute-method", "block",
                     "--recompute-num-layers", "2", "--num-layers", "2", "--hidden-size", "32",
                     "--num-attention-heads", "4", "--seq-length", "16", "--vocab-size", "101"};
    mt_config_parse(&cfg, (int)(sizeof argv2 / sizeof argv2[0]), argv2);
    mt_config_derive(&cfg);
    mt_expect(cfg.recompute == MT_RECOMPUTE_BLOCK && cfg.recompute_num_layers == 2, "full block 2 not read");
}

// the memory plan (--dry-run) is what the allocation reports, for every kind of knob
MT_TEST(memory_plan_is_the_allocation) {
    static run_t run;
    struct { int tp, pp, vp, dist; const char *g, *m; int n; } cases[] = {
        {1, 1, 0, 0, "", "", 1}, {2, 2, 1, 0, "full", "uniform", 1}, {1, 2, 0, 0, "selective", "", 1},
        {1, 1, 0, 0, "full", "block", 3}, {2, 1, 0, 1, "full", "uniform", 2},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        train(&run, cases[c].tp, cases[c].pp, cases[c].vp, cases[c].g, cases[c].m, cases[c].n);
        if (cases[c].dist) {   // again as DP=2 with the distributed optimizer: the plan must follow
            run.cfg.parallel.use_distributed_optimizer = 1;
            run.cfg.parallel.nproc_per_node = 2 * cases[c].tp * cases[c].pp;
            run.cfg.train.global_batch_size = 8;
            free(run.params);
            mt_config cfg = run.cfg;
            mt_config_derive(&cfg);
            run.cfg = cfg;
            mt_world *w = mt_world_create(cfg.world_size);
            mt_expect(mt_world_run(w, rank_main, &run) == 0, "dist-opt run failed");
            mt_world_destroy(w);
        }
        mt_memory_report plan;
        mt_memory_plan(&run.cfg, 0, &plan);
        int same = plan.params == run.report.params && plan.grads == run.report.grads &&
                   plan.optimizer == run.report.optimizer && plan.activations == run.report.activations &&
                   plan.scratch == run.report.scratch && plan.kernel_scratch == run.report.kernel_scratch &&
                   plan.comm == run.report.comm;
        mt_expect(same, "case %zu: the plan (%zu %zu %zu %zu %zu) is not the allocation (%zu %zu %zu %zu %zu)", c,
                  plan.params, plan.grads, plan.optimizer, plan.activations, plan.scratch, run.report.params,
                  run.report.grads, run.report.optimizer, run.report.activations, run.report.scratch);
        free(run.params);
    }
}

// the kernel scratch: what the plan says one step borrows at most (mt_gpu_scratch_peak) is what
// the ops of real steps would have borrowed on the GPU (the CPU seam counts each call with the
// same functions kernels.cuh sizes its mt__scratch_alloc with), on every rank: first and last
// stages, TP slices, sequence parallel, recompute, fp32's tiled rung and bf16 / fp16's wgmma
MT_TEST(kernel_scratch_plan_is_a_step) {
    static run_t run;
    struct { int tp, pp, vp, sp, B; mt_dtype dt; const char *g, *m; const char *name; } cases[] = {
        {1, 1, 0, 0, 2, MT_DTYPE_FP32, "", "", "fp32 (tiled rung)"},
        {1, 1, 0, 0, 2, MT_DTYPE_BF16, "selective", "", "bf16 (wgmma), selective recompute"},
        {2, 2, 1, 0, 2, MT_DTYPE_BF16, "full", "uniform", "bf16 TP=2 PP=2 interleaved, full recompute"},
        {2, 1, 0, 1, 4, MT_DTYPE_BF16, "", "", "bf16 TP=2 sequence parallel, B=4"},
        {1, 2, 0, 0, 2, MT_DTYPE_FP16, "full", "block", "fp16 PP=2, full block recompute"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        mt_config *cfg = &run.cfg;
        memset(&run, 0, sizeof run);
        synthetic_config(cfg, cases[c].tp, cases[c].pp, 1);
        cfg->parallel.num_layers_per_virtual_pipeline_stage = cases[c].vp;
        cfg->parallel.sequence_parallel = cases[c].sp;
        cfg->train.micro_batch_size = cases[c].B;
        cfg->train.train_iters = 2;
        cfg->train.bf16 = cases[c].dt == MT_DTYPE_BF16;
        cfg->train.fp16 = cases[c].dt == MT_DTYPE_FP16;
        snprintf(cfg->train.recompute_granularity, sizeof cfg->train.recompute_granularity, "%s", cases[c].g);
        snprintf(cfg->train.recompute_method, sizeof cfg->train.recompute_method, "%s", cases[c].m);
        cfg->train.recompute_num_layers = 1;
        mt_config_derive(cfg);
        mt_world *w = mt_world_create(cfg->world_size);
        int rc = mt_world_run(w, rank_main, &run);
        mt_world_destroy(w);
        mt_expect(rc == 0, "%s: the run failed", cases[c].name);
        for (int k = 0; k < cfg->world_size; k++)
            mt_expect(run.scratch_seen[k] > 0 && run.scratch_seen[k] == run.scratch_plan[k],
                      "%s, rank %d: the plan's kernel scratch is %zu bytes, the step's ops borrowed %zu at most",
                      cases[c].name, k, run.scratch_plan[k], run.scratch_seen[k]);
        printf("  %-48s kernel scratch rank 0: %zu bytes planned, %zu by the ops\n", cases[c].name,
               run.scratch_plan[0], run.scratch_seen[0]);
        free(run.params);
    }
}

// kernels.cuh's allocations for two shapes, restated from its launchers (the sizes a GPU run's
// arena then lends: tests/gpu/test_memory.sh compares the most it lent with the plan)
MT_TEST(kernel_scratch_restated) {
    // the LM head's backward on the wgmma rung, B*T = 32, C = 32, Vp = 128: dout (32 x 128), the
    // weight (128 x 32) and inp (32 x 32) rounded to bf16, 2 bytes each and 8 spare elements, all
    // alive at once; both products are a single 128 x 256 tile of 1 k-step: no split-K
    size_t want = (32 * 128 + 8) * 2 + (128 * 32 + 8) * 2 + (32 * 32 + 8) * 2;
    size_t got = mt_gpu_matmul_backward_scratch(32, 32, 128, 1, 0, MT_GEMM_WGMMA, MT_DTYPE_BF16, 0, 0, 0);
    mt_expect(got == want, "LM head backward, wgmma: %zu bytes, kernels.cuh allocates %zu", got, want);
    // GPT-2 small's fc weight gradient (OC = 3072, C = 768, B*T = 16384), wgmma: 256 k-steps. In
    // 128 x 256 tiles, 24 x 3 = 72 of them, 3 slices (2 waves of 216 units on 132 SMs at 86 steps:
    // cost 2 x 90 + 3 + 0.044 x 216 = 192.5 against 260 unsplit); in 192 x 192 tiles (its operands
    // are both k outer), 16 x 4 = 64, 2 slices (one wave of 128 units at 128 steps: 128 x 1.125 + 4
    // + 3 + 0.0495 x 128 = 157.3): the latter, 128 partial tiles of 192 x 192 floats
    mt_wgmma_plan p;
    mt_wgmma_plan_make(&p, 3072, 768, 16384, 0, 0);
    mt_expect(p.splits == 3 && p.slots == 216 && p.bm == 128 && p.bn == 256,
              "fc's weight gradient in 128 x 256 tiles: %d slices, %zu partial tiles (want 3, 216)", p.splits, p.slots);
    mt_wgmma_plan_make(&p, 3072, 768, 16384, 0, 1);
    mt_expect(p.splits == 2 && p.slots == 128 && p.bm == 192 && p.bn == 192,
              "fc's weight gradient: %d x %d tiles, %d slices, %zu partial tiles (want 192 x 192, 2, 128)", p.bm, p.bn,
              p.splits, p.slots);
    // the other weight gradients keep 128 x 256: qkv's (2304 x 768: 54 tiles in 2 slices, 108 units,
    // against 48 in 2 or 3), attn proj's (768 x 768), the LM head's (50304 x 768)
    int keep[3][2] = {{2304, 768}, {768, 768}, {50304, 768}};
    for (int i = 0; i < 3; i++) {
        mt_wgmma_plan_make(&p, keep[i][0], keep[i][1], 16384, 0, 1);
        mt_expect(p.bm == 128 && p.bn == 256, "the %d x %d weight gradient: a %d x %d tile (want 128 x 256)", keep[i][0],
                  keep[i][1], p.bm, p.bn);
    }
    want = (16384 * 3072 + 8) * 2 + (3072 * 768 + 8) * 2 + (16384 * 768 + 8) * 2 + (size_t)128 * 192 * 192 * 4;
    got = mt_gpu_matmul_backward_scratch(16384, 768, 3072, 1, 1, MT_GEMM_WGMMA, MT_DTYPE_BF16, 0, 0, 0);
    mt_expect(got == want, "fc backward, GPT-2 small, wgmma: %zu bytes, kernels.cuh allocates %zu", got, want);
    // the same with its input (ln2) stored in 16 bits by the layernorm (mt_ln_gemm_dtype): no copy of it
    want -= ((size_t)16384 * 768 + 8) * 2;
    got = mt_gpu_matmul_backward_scratch(16384, 768, 3072, 1, 1, MT_GEMM_WGMMA, MT_DTYPE_BF16, 1, 0, 0);
    mt_expect(got == want, "fc backward from a 16-bit ln2: %zu bytes, kernels.cuh allocates %zu", got, want);
    // and with its output gradient in 16 bits too (fc-proj's backward wrote it so, as fch is kept:
    // mt_fch_gemm_dtype): no copy of it either; the column sums' partials (64 chunks x 3072
    // floats) come and go before the products
    want -= ((size_t)16384 * 3072 + 8) * 2;
    got = mt_gpu_matmul_backward_scratch(16384, 768, 3072, 1, 1, MT_GEMM_WGMMA, MT_DTYPE_BF16, 1, 1, 0);
    mt_expect(got == want, "fc backward from a 16-bit ln2 and gradient: %zu bytes, kernels.cuh allocates %zu", got, want);
    // and with its weight lent by the parameters' 16-bit copy (mt_device_weights16): no copy of it
    want -= ((size_t)3072 * 768 + 8) * 2;
    got = mt_gpu_matmul_backward_scratch(16384, 768, 3072, 1, 1, MT_GEMM_WGMMA, MT_DTYPE_BF16, 1, 1, 1);
    mt_expect(got == want, "fc backward with a lent weight: %zu bytes, kernels.cuh allocates %zu", got, want);
    // where the copy is made: a step's on the wgmma rung in bf16 / fp16; a generator's on mma too
    mt_expect(mt_weights16_wanted(MT_GEMM_WGMMA, MT_DTYPE_BF16, MT_WEIGHTS16_STEP) &&
              mt_weights16_wanted(MT_GEMM_WGMMA, MT_DTYPE_FP16, MT_WEIGHTS16_STEP) &&
              !mt_weights16_wanted(MT_GEMM_MMA, MT_DTYPE_BF16, MT_WEIGHTS16_STEP) &&
              mt_weights16_wanted(MT_GEMM_MMA, MT_DTYPE_BF16, MT_WEIGHTS16_DECODING) &&
              !mt_weights16_wanted(MT_GEMM_WGMMA, MT_DTYPE_FP32, MT_WEIGHTS16_STEP) &&
              !mt_weights16_wanted(MT_GEMM_TILED, MT_DTYPE_BF16, MT_WEIGHTS16_DECODING) &&
              !mt_weights16_wanted(MT_GEMM_WGMMA, MT_DTYPE_BF16, MT_WEIGHTS16_OFF),
              "the parameters' 16-bit copy is made where a product reads it");
    // which layouts store ln1 / ln2 in 16 bits: the wgmma rung in bf16 / fp16, rows of multiples
    // of 8, more rows than a GEMV, no sequence parallelism
    mt_expect(mt_ln_gemm_dtype(MT_GEMM_WGMMA, MT_DTYPE_BF16, 16384, 768, 2304, 3072, 0) == MT_DTYPE_BF16 &&
              mt_ln_gemm_dtype(MT_GEMM_WGMMA, MT_DTYPE_FP16, 16384, 768, 2304, 3072, 0) == MT_DTYPE_FP16 &&
              mt_ln_gemm_dtype(MT_GEMM_WGMMA, MT_DTYPE_BF16, 16384, 768, 2304, 3072, 1) == MT_DTYPE_FP32 &&
              mt_ln_gemm_dtype(MT_GEMM_MMA, MT_DTYPE_BF16, 16384, 768, 2304, 3072, 0) == MT_DTYPE_FP32 &&
              mt_ln_gemm_dtype(MT_GEMM_WGMMA, MT_DTYPE_FP32, 16384, 768, 2304, 3072, 0) == MT_DTYPE_FP32 &&
              mt_ln_gemm_dtype(MT_GEMM_WGMMA, MT_DTYPE_BF16, 8, 768, 2304, 3072, 0) == MT_DTYPE_FP32 &&
              mt_ln_gemm_dtype(MT_GEMM_WGMMA, MT_DTYPE_BF16, 16384, 100, 300, 400, 0) == MT_DTYPE_FP32 &&
              mt_ln_gemm_dtype(MT_GEMM_WGMMA, MT_DTYPE_BF16, 16384, 768, 2304, 3076, 0) == MT_DTYPE_FP32,
              "mt_ln_gemm_dtype: the wrong storage for one of its eight cases");
    // fp32's tiled rung on the same product: 24 x 6 = 144 tiles; 2 slices (288 >= 264 stops the
    // doubling) of 3072 x 768 floats; the bias's column sums (64 chunks x 3072) are smaller
    got = mt_gpu_matmul_backward_scratch(16384, 768, 3072, 1, 1, MT_GEMM_TILED, MT_DTYPE_FP32, 0, 0, 0);
    want = (size_t)2 * 3072 * 768 * 4;
    mt_expect(got == want, "fc backward, tiled: %zu bytes, kernels.cuh allocates %zu", got, want);
    // layernorm backward over 100 rows of 48: ceil(100/32) = 4 blocks' dweight and dbias
    mt_expect(mt_gpu_layernorm_backward_scratch(100, 48) == 2 * 4 * 48 * 4, "layernorm backward scratch");
    // and GPT-2 small's plan. The LM head's backward borrowed 1750.8 MB, most of it the rounded
    // copy of its (16384, 50304) gradient; with --bf16 on the wgmma rung the cross-entropy writes
    // that gradient already rounded, in place (mt_logits_grad_dtype), so the copy is gone and the
    // largest borrower is the fc projection's backward: dout (16384 x 768), its input (16384 x 3072)
    // and weight (768 x 3072) rounded, and the 3-way split of its weight-gradient (6 x 12 tiles x 3
    // partial 128 x 256 tiles)
    mt_config cfg;
    synthetic_config(&cfg, 1, 1, 1);
    cfg.model.num_layers = 12;
    cfg.model.hidden_size = 768;
    cfg.model.num_attention_heads = 12;
    cfg.model.seq_length = 1024;
    cfg.model.max_position_embeddings = 1024;
    cfg.model.vocab_size = 50257;
    cfg.train.micro_batch_size = 16;
    cfg.train.global_batch_size = 16;
    cfg.train.bf16 = 1;
    mt_config_derive(&cfg);
    mt_rank *r = (mt_rank *)mt_calloc(1, sizeof(mt_rank), "rank");
    r->cfg = &cfg;
    mt_parallel_state_init(&r->ps, &cfg, 0);
    mt_dims_init(&r->dims, &cfg, &r->ps);
    size_t head_fp32 = mt_gpu_matmul_backward_scratch(16384, 768, 50304, 1, 0, MT_GEMM_WGMMA, MT_DTYPE_FP32, 0, 0, 0);
    got = mt_gpu_lm_head_backward_scratch(16384, 768, 50304, MT_GEMM_WGMMA, MT_DTYPE_BF16, 0);
    want = head_fp32 - ((size_t)16384 * 50304 + 8) * 2;
    mt_expect(got == want, "LM head backward, bf16: %zu bytes, want %zu (no copy of the gradient)", got, want);
    mt_expect(mt_gpu_lm_head_backward_scratch(16384, 768, 50304, MT_GEMM_WGMMA, MT_DTYPE_FP32, 0) == head_fp32,
              "LM head backward, fp32 gradient: the plain matmul backward's scratch");
    // (its weight is lent by the parameters' 16-bit copy, mt_device_weights16: not borrowed)
    // (its weight gradient, 768 x 3072: 4 x 16 tiles of 192 x 192 in 2 k-slices)
    size_t fc_proj = ((size_t)16384 * 768 + 8) * 2 + ((size_t)16384 * 3072 + 8) * 2 + (size_t)4 * 16 * 2 * 192 * 192 * 4;
    // but since the attention backward hands its dS^T tiles from the dK/dV kernel to the dQ kernel
    // (kernels.cuh, THE dS HAND-OFF) the largest is the attention backward: D (B x 12 heads x T
    // floats), dO rounded (this rank keeps datty in fp32), and 16 x 12 heads x 8 x 9 pairs of two
    // 64 x 64 bf16 tiles
    size_t attention = (size_t)16 * 12 * 1024 * 4 + ((size_t)16384 * 768 + 8) * 2 + (size_t)16 * 12 * 8 * 9 * 2 * 64 * 64 * 2;
    mt_expect(mt_gpu_attention_ds_bytes(16, 1024, 12) == (size_t)16 * 12 * 8 * 9 * 2 * 64 * 64 * 2,
              "the dS^T tiles at GPT-2 small's B = 16: %zu bytes", mt_gpu_attention_ds_bytes(16, 1024, 12));
    want = attention > fc_proj ? attention : fc_proj;
    got = mt_gpu_scratch_peak(r, MT_GEMM_WGMMA, MT_DTYPE_BF16);
    mt_expect(got == want && attention > fc_proj,
              "GPT-2 small B=16 bf16: kernel scratch %zu bytes, want the attention backward's %zu (fc projection's %zu)",
              got, attention, fc_proj);
    printf("  GPT-2 small, B=16, bf16: kernel scratch %.1f MB (the attention backward's)\n", got / 1e6);
    free(r);
}

int main(void) {
    mt_run_test(recompute_flags);
    mt_run_test(recompute_one_rank);
    mt_run_test(recompute_tp2_pp2_interleaved);
    mt_run_test(memory_plan_is_the_allocation);
    mt_run_test(kernel_scratch_plan_is_a_step);
    mt_run_test(kernel_scratch_restated);
    return mt_test_summary();
}

// =============================================================================================
// 12. TRAINING LOOP
// =============================================================================================
// Mirrors megatron/training/training.py: pretrain() -> train() with train_step(),
// training_log() and evaluate_and_print_results(). Every rank runs the same loop on its own
// thread; the last rank prints, as Megatron's print_rank_last.

size_t mt_model_num_parameters(const mt_config *cfg) {
    size_t C = (size_t)cfg->model.hidden_size, F = (size_t)cfg->model.ffn_hidden_size, L = (size_t)cfg->model.num_layers;
    size_t per_layer = 2 * C + 3 * C * C + 3 * C + C * C + C + 2 * C + F * C + F + C * F + C;
    return (size_t)cfg->padded_vocab_size * C + (size_t)cfg->model.max_position_embeddings * C + L * per_layer + 2 * C;
}

typedef struct {
    mt_config *cfg;
    mt_data *data;
    int split;                 // 0 train, 1 valid, 2 test
    int64_t eval_base;         // first sample of the current evaluation batch (valid/test)
    int32_t *sample;           // (T+1) scratch, one per rank
} mt__batch_ctx;

// fills micro-batch mb of this rank: global batch sample = base + mb*B*DP + dp_rank*B + b
static void mt__data_batch(mt_rank *r, void *vctx, int iteration, int mb, int *tokens, int *targets) {
    mt__batch_ctx *ctx = (mt__batch_ctx *)vctx;
    int B = r->B, T = r->T, V = r->cfg->model.vocab_size;
    int64_t base = ctx->split == 0 ? (int64_t)(iteration - 1) * r->cfg->train.global_batch_size : ctx->eval_base;
    for (int b = 0; b < B; b++) {
        int64_t i = base + (int64_t)mb * B * r->ps.dp_size + (int64_t)r->ps.dp_rank * B + b;
        mt_blended_sample(&ctx->data->split[ctx->split], i, ctx->sample);
        for (int t = 0; t <= T; t++)
            if (ctx->sample[t] < 0 || ctx->sample[t] >= V)
                mt_fatal("token id %d in the data is outside the vocabulary (size %d)\nhint: preprocess with the same --vocab-file, or set --vocab-size", ctx->sample[t], V);
        for (int t = 0; t < T; t++) {
            tokens[b * T + t] = ctx->sample[t];
            targets[b * T + t] = ctx->sample[t + 1];
        }
    }
}

typedef struct {
    mt_config *cfg;
    mt_data *data;
} mt__job;

static void mt__print_eval(mt_rank *r, const char *what, float loss) {
    if (r->ps.rank != r->ps.world_size - 1) return;
    char line[256];
    int n = snprintf(line, sizeof line, " validation loss at %s | lm loss value: %.6E | lm loss PPL: %.6E | ", what,
                     (double)loss, exp((double)loss < 700 ? (double)loss : 700.0));
    char dashes[260];
    memset(dashes, '-', (size_t)n);
    dashes[n] = 0;
    printf("%s\n%s\n%s\n", dashes, line, dashes);
    fflush(stdout);
}

static float mt__evaluate(mt_rank *r, mt__batch_ctx *ctx, int split, int iteration) {
    const mt_config *cfg = r->cfg;
    double sum = 0.0;
    ctx->split = split;
    for (int k = 0; k < cfg->train.eval_iters; k++) {
        if (split == 1) ctx->eval_base = ctx->data->valid_consumed;   // the valid iterator continues
        else ctx->eval_base = (int64_t)k * cfg->train.global_batch_size;
        sum += mt_eval_step(r, mt__data_batch, ctx, iteration);
        if (split == 1) {
            mt_barrier(&r->world);   // everyone has read this batch before rank 0 moves the iterator
            if (r->ps.rank == 0) ctx->data->valid_consumed += cfg->train.global_batch_size;
            mt_barrier(&r->world);
        }
    }
    ctx->split = 0;
    return (float)(sum / cfg->train.eval_iters);
}

static void mt__rank_main(mt_world *w, int rank, void *arg) {
    mt__job *job = (mt__job *)arg;
    mt_config *cfg = job->cfg;
    mt_rank *r = (mt_rank *)mt_calloc(1, sizeof(mt_rank), "rank");
    mt_rank_init(r, cfg, w, rank);
    char name[32];
    snprintf(name, sizeof name, "r%d tp%d dp%d pp%d", rank, r->ps.tp_rank, r->ps.dp_rank, r->ps.pp_rank);
    mt_thread_set_name(name);
    int is_logger = rank == cfg->world_size - 1;
    if (rank == 0) {
        printf("rank 0: %zu parameters on this rank (%.1f MB each for params, grads, AdamW m, v), %d activation slot(s)\n",
               r->num_params, (double)r->num_params * 4 / 1e6, r->num_slots);
        fflush(stdout);
    }
    mt__batch_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    ctx.cfg = cfg;
    ctx.data = job->data;
    ctx.sample = (int32_t *)mt_malloc(sizeof(int32_t) * (size_t)(cfg->model.seq_length + 1), "sample");
    const mt_train_config *t = &cfg->train;
    double interval_loss = 0.0, interval_time = 0.0;
    int interval_count = 0, skipped = 0, nan_iters = 0;
    mt_barrier(&r->world);
    for (int it = 1; it <= t->train_iters; it++) {
        double t0 = mt_time_seconds();
        mt_step_result res = mt_train_step(r, mt__data_batch, &ctx, it);
        double dt = mt_time_seconds() - t0;
        interval_time += dt;
        if (res.skipped) skipped++;
        if (!isfinite(res.loss)) nan_iters++;
        else { interval_loss += res.loss; interval_count++; }
        if (it % t->log_interval == 0 && is_logger) {
            double ms = 1000.0 * interval_time / t->log_interval;
            double tokens_per_s = (double)t->global_batch_size * cfg->model.seq_length / (interval_time / t->log_interval);
            printf(" iteration %8d/%8d | consumed samples: %12lld | elapsed time per iteration (ms): %.1f | "
                   "learning rate: %.6E | global batch size: %5d | lm loss: %.6E | loss scale: %.1f | grad norm: %.3f | "
                   "number of skipped iterations: %3d | number of nan iterations: %3d | tokens per second: %.0f |\n",
                   it, t->train_iters, (long long)it * t->global_batch_size, ms, (double)res.lr, t->global_batch_size,
                   interval_count ? interval_loss / interval_count : (double)NAN, 1.0, (double)res.grad_norm, skipped,
                   nan_iters, tokens_per_s);
            if (r->ps.pp_size > 1) printf("   (last stage waited %.1f%% of the step for pipeline messages)\n", 100.0 * res.idle_seconds / dt);
            fflush(stdout);
        }
        if (it % t->log_interval == 0) { interval_loss = 0; interval_time = 0; interval_count = 0; skipped = 0; nan_iters = 0; }
        if (t->eval_interval > 0 && it % t->eval_interval == 0 && job->data->has_split[1]) {
            char what[64];
            snprintf(what, sizeof what, "iteration %d", it);
            float loss = mt__evaluate(r, &ctx, 1, it);
            mt__print_eval(r, what, loss);
        }
    }
    if (job->data->has_split[1] && t->eval_iters > 0) {
        float loss = mt__evaluate(r, &ctx, 1, t->train_iters);
        mt__print_eval(r, "the end of training for val data", loss);
    }
    if (job->data->has_split[2] && t->eval_iters > 0) {
        float loss = mt__evaluate(r, &ctx, 2, t->train_iters);
        mt__print_eval(r, "the end of training for test data", loss);
    }
    free(ctx.sample);
    mt_rank_free(r);
    free(r);
}

int mt_pretrain(mt_config *cfg) {
    if (cfg->parallel.print_layout) { mt_print_layout(cfg, stdout); return 0; }
    if (cfg->parallel.print_schedule) { mt_print_schedule(cfg, stdout); return 0; }
    if (cfg->train.train_iters <= 0) mt_fatal("--train-iters must be positive\nhint: e.g. --train-iters 500");
    if (cfg->train.save[0] || cfg->train.load[0])
        mt_fatal("--save/--load: checkpointing is not implemented yet in this build\nhint: drop --save/--load/--save-interval for now");
    if (cfg->train.fp16 || cfg->train.bf16)
        fprintf(stderr, "note: the CPU build computes in fp32; --fp16/--bf16 apply to the GPU build (train_gpt_cuda)\n");
    mt_print_config(cfg, stdout);
    printf("number of parameters: %zu (%.2f M)\n", mt_model_num_parameters(cfg), mt_model_num_parameters(cfg) / 1e6);
    double t0 = mt_time_seconds();
    mt_data data;
    mt_data_init(&data, cfg);
    for (int s = 0; s < 3; s++)
        printf("%s split: %s\n", s == 0 ? "train" : s == 1 ? "valid" : "test",
               data.has_split[s] ? "ready" : "empty (skipped)");
    printf("data ready in %.2f s; training %d iterations of %d samples x %d tokens\n", mt_time_seconds() - t0,
           cfg->train.train_iters, cfg->train.global_batch_size, cfg->model.seq_length);
    fflush(stdout);
    mt_world *w = mt_world_create(cfg->world_size);
    mt__job job = {cfg, &data};
    int rc = mt_world_run(w, mt__rank_main, &job);
    mt_world_destroy(w);
    mt_data_free(&data);
    return rc;
}

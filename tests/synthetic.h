/* tests/synthetic.h - a synthetic data source for tests that train (layouts, checkpoints,
 * recompute, SP, fp16), and the small model they train (synthetic_config).
 *
 * Token ids depend only on the sample's index in the whole run and on the position, so every
 * layout sees the same global batches; each sample is an arithmetic sequence mod V
 * (start, start+k, start+2k, ...), a pattern a small model learns quickly, so losses fall.
 */
#ifndef MT_TEST_SYNTHETIC_H
#define MT_TEST_SYNTHETIC_H
static void synthetic_batch(mt_rank *r, void *ctx, int iteration, int mb, int *tokens, int *targets) {
    (void)ctx;
    int B = r->dims.B, T = r->dims.T, V = r->cfg->model.vocab_size;
    for (int b = 0; b < B; b++) {
        int64_t sample = (int64_t)(iteration - 1) * r->cfg->train.global_batch_size + mt_sample_in_batch(r, mb, b);
        int start = (int)(mt_hash64((uint64_t)sample) % (uint64_t)V), step = 1 + (int)(mt_hash64((uint64_t)sample + 77) % 3);
        for (int t = 0; t < T; t++) {
            tokens[b * T + t] = (start + step * t) % V;
            targets[b * T + t] = (start + step * (t + 1)) % V;
        }
    }
}
// the small model these tests train (4 layers, C = 32, 4 heads, T = 16, V = 101, dropout 0.1) on
// TP x PP x DP ranks, micro-batch 2 of a global batch of 8; each test then sets what it varies
static inline void synthetic_config(mt_config *cfg, int tp, int pp, int dp) {
    mt_config_defaults(cfg);
    cfg->model.num_layers = 4;
    cfg->model.hidden_size = 32;
    cfg->model.num_attention_heads = 4;
    cfg->model.seq_length = 16;
    cfg->model.vocab_size = 101;
    cfg->model.hidden_dropout = 0.1f;
    cfg->model.attention_dropout = 0.1f;
    cfg->parallel.tensor_model_parallel_size = tp;
    cfg->parallel.pipeline_model_parallel_size = pp;
    cfg->parallel.nproc_per_node = tp * pp * dp;
    cfg->train.micro_batch_size = 2;
    cfg->train.global_batch_size = 8;
}
#endif

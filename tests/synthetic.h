/* tests/synthetic.h - a synthetic data source for tests that train (layouts, checkpoints).
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
#endif

/* tests/test_ref.c - writes a case for the outside reference (tests/ref_gpt2_jax.py).
 *
 *   ./tests/test_ref build/ref_case.bin && .venv/bin/python tests/ref_gpt2_jax.py build/ref_case.bin
 *
 * Our fp32 GPT-2 (one rank) runs forward and backward on random weights and tokens; the file
 * holds the weights, the tokens, our logits, loss and every parameter gradient. The JAX model
 * (float64, jax.grad) recomputes them and must agree within 1e-5 relative (norm-wise).
 * Layout of the file: see tests/ref_gpt2_jax.py ("MTREF001", 9 int32 sizes, params in carve
 * order (= llm.c's order), inputs, targets, logits (B,T,V), loss, gradients).
 */
#define MEGATRON_IMPLEMENTATION
#include "../megatron.h"

static void write_all(FILE *f, const void *p, size_t size, size_t n) {
    if (fwrite(p, size, n, f) != n) mt_fatal("short write");
}

int main(int argc, char **argv) {
    if (argc != 2) { fprintf(stderr, "usage: test_ref OUT.bin\n"); return 2; }
    mt_config cfg;
    mt_config_defaults(&cfg);
    cfg.model.num_layers = 2;
    cfg.model.hidden_size = 64;
    cfg.model.num_attention_heads = 4;
    cfg.model.seq_length = 16;
    cfg.model.max_position_embeddings = 32;
    cfg.model.vocab_size = 101;
    cfg.model.hidden_dropout = 0.0f;      // the JAX reference has no dropout
    cfg.model.attention_dropout = 0.0f;
    cfg.train.micro_batch_size = 2;
    cfg.train.global_batch_size = 2;
    cfg.train.train_iters = 1;
    cfg.train.seed = 42;
    mt_config_derive(&cfg);
    mt_world *w = mt_world_create(1);
    mt_rank *r = (mt_rank *)mt_calloc(1, sizeof(mt_rank), "rank");
    mt_rank_init(r, &cfg, w, 0);
    // random weights everywhere, so no term of the gradient hides behind a zero or a one:
    // layernorm weights 1 + noise, biases nonzero, padded vocabulary rows nonzero too
    for (size_t i = 0; i < r->model.num_params; i++) r->model.params_memory[i] += 0.05f * mt_rand_normal(7, 1, 2, 3, i);
    int B = r->dims.B, T = r->dims.T, V = cfg.model.vocab_size, Vp = cfg.padded_vocab_size, BT = B * T;
    mt_activations *a = &r->acts.slots[0];
    a->mb = 0;
    a->sample_offset = 0;
    for (int i = 0; i < BT; i++) {
        a->tokens[i] = (int)(mt_hash64(1000 + (uint64_t)i) % (uint64_t)V);
        a->targets[i] = (int)(mt_hash64(2000 + (uint64_t)i) % (uint64_t)V);
    }
    // pass 1: forward only, to read the logits (a training forward overwrites them with dlogits)
    r->state.training = 0;
    double *loss_acc = (double *)r->scratch.loss_acc;   // the head adds each micro-batch's mean loss here
    *loss_acc = 0;                                      // (the CPU build's scratch is host memory)
    mt__forward_chunk(r, a, 0);
    float *logits = (float *)mt_malloc(sizeof(float) * (size_t)BT * V, "logits");
    for (int i = 0; i < BT; i++) memcpy(logits + (size_t)i * V, a->logits + (size_t)i * Vp, sizeof(float) * (size_t)V);
    float loss = (float)*loss_acc;
    // pass 2: forward and backward
    r->state.training = 1;
    *loss_acc = 0;
    memset(r->model.grads_memory, 0, sizeof(float) * r->model.num_params);
    mt__forward_chunk(r, a, 0);
    mt__backward_chunk(r, a, 0);
    char tmp[MT_PATH_MAX + 32];
    FILE *f = mt_atomic_open(argv[1], tmp, sizeof tmp);
    int32_t header[9] = {cfg.model.num_layers, cfg.model.hidden_size, cfg.model.num_attention_heads, V, Vp,
                         cfg.model.max_position_embeddings, B, T, cfg.model.ffn_hidden_size};
    write_all(f, "MTREF001", 1, 8);
    write_all(f, header, 4, 9);
    write_all(f, r->model.params_memory, 4, r->model.num_params);   // one rank: local layout == global layout
    write_all(f, a->tokens, 4, (size_t)BT);
    write_all(f, a->targets, 4, (size_t)BT);
    write_all(f, logits, 4, (size_t)BT * V);
    write_all(f, &loss, 4, 1);
    write_all(f, r->model.grads_memory, 4, r->model.num_params);
    mt_atomic_commit(f, tmp, argv[1]);
    printf("wrote %s: %zu parameters, loss %.6f\n", argv[1], r->model.num_params, (double)loss);
    free(logits);
    mt_rank_free(r);
    free(r);
    mt_world_destroy(w);
    return 0;
}

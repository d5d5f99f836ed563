// ---------------------------------------------------------------------------------------------
// parallel state: where a rank sits in the TP x PP x DP grid
// ---------------------------------------------------------------------------------------------
// Mirrors megatron/core/parallel_state.py (initialize_model_parallel). The example below is
// exactly what `./train_gpt --print-layout --tensor-model-parallel-size 2
// --pipeline-model-parallel-size 2 --nproc-per-node 8 --num-layers 8` prints (a test checks it):
//
// rank = tp_rank + TP*(dp_rank + DP*pp_rank)   (TP fastest, then DP, then PP: Megatron's default)
//              dp 0           dp 1
//           tp0   tp1      tp0   tp1
//   pp 0  [ g0 ,  g1  ]  [ g2 ,  g3  ]    layers 0 .. 3
//   pp 1  [ g4 ,  g5  ]  [ g6 ,  g7  ]    layers 4 .. 7
//   TP groups [g0,g1] [g2,g3] [g4,g5] [g6,g7]
//   DP groups [g0,g2] [g1,g3] [g4,g6] [g5,g7]
//   PP groups [g0,g4] [g1,g5] [g2,g6] [g3,g7]
//   embedding groups [g0,g4] [g1,g5] [g2,g6] [g3,g7]
//
// Why TP is fastest: the TP group all-reduces twice per layer, so its ranks should be
// neighbours (the same node, NVLink); DP talks once per step, PP only to the next stage.
int mt_global_rank(const mt_config *cfg, int tp_rank, int dp_rank, int pp_rank) {
    int TP = cfg->parallel.tensor_model_parallel_size, DP = cfg->data_parallel_size;
    return tp_rank + TP * (dp_rank + DP * pp_rank);
}

void mt_parallel_state_init(mt_parallel_state *ps, const mt_config *cfg, int rank) {
    int TP = cfg->parallel.tensor_model_parallel_size, PP = cfg->parallel.pipeline_model_parallel_size;
    int DP = cfg->data_parallel_size;
    memset(ps, 0, sizeof *ps);
    ps->rank = rank;
    ps->world_size = cfg->world_size;
    ps->tp_size = TP; ps->pp_size = PP; ps->dp_size = DP;
    ps->tp_rank = rank % TP;
    ps->dp_rank = (rank / TP) % DP;
    ps->pp_rank = rank / (TP * DP);
    ps->vp_size = cfg->virtual_pipeline_size;
    ps->pp_prev_rank = mt_global_rank(cfg, ps->tp_rank, ps->dp_rank, (ps->pp_rank + PP - 1) % PP);
    ps->pp_next_rank = mt_global_rank(cfg, ps->tp_rank, ps->dp_rank, (ps->pp_rank + 1) % PP);
    ps->is_first_stage = ps->pp_rank == 0;
    ps->is_last_stage = ps->pp_rank == PP - 1;
    ps->in_embedding_group = PP > 1 && (ps->is_first_stage || ps->is_last_stage);
}

static void mt__print_group(FILE *f, const int *members, int n) {
    fprintf(f, " [");
    for (int i = 0; i < n; i++) fprintf(f, "%sg%d", i ? "," : "", members[i]);
    fprintf(f, "]");
}

void mt_print_layout(const mt_config *cfg, FILE *f) {
    int TP = cfg->parallel.tensor_model_parallel_size, PP = cfg->parallel.pipeline_model_parallel_size;
    int DP = cfg->data_parallel_size, L = cfg->model.num_layers;
    int members[1024];
    fprintf(f, "rank = tp_rank + TP*(dp_rank + DP*pp_rank)   (TP fastest, then DP, then PP: Megatron's default)\n");
    // the grid: one row per stage, one [ ... ] block of TP cells per DP replica. The rows are
    // built first, so the dp/tp labels above can be placed over the cells they name.
    size_t width = (size_t)DP * (size_t)TP * 16 + 64;
    char *row = (char *)mt_malloc(width * (size_t)PP, "layout");
    int *cell_col = (int *)mt_malloc(sizeof(int) * (size_t)(DP * TP + 1), "layout");
    int *block_end = (int *)mt_malloc(sizeof(int) * (size_t)(DP + 1), "layout");
    for (int p = 0; p < PP; p++) {
        char *line = row + (size_t)p * width;
        int n = snprintf(line, width, "  pp %d ", p);
        for (int d = 0; d < DP; d++) {
            n += snprintf(line + n, width - (size_t)n, "%s", d == 0 ? " [" : "  [");
            for (int t = 0; t < TP; t++) {
                if (p == 0) cell_col[d * TP + t] = n + 1;
                n += snprintf(line + n, width - (size_t)n, "%s g%-2d", t ? ", " : "", mt_global_rank(cfg, t, d, p));
                if (p == 0 && t) cell_col[d * TP + t] += 2;
            }
            n += snprintf(line + n, width - (size_t)n, " ]");
            if (p == 0) block_end[d] = n;
        }
        int per = L / PP;
        snprintf(line + n, width - (size_t)n, "    layers %d .. %d", p * per, (p + 1) * per - 1);
    }
    char *hdr = (char *)mt_malloc(width, "layout");
    // "dp d" centred over its block, "tpt" over each cell
    memset(hdr, ' ', width - 1);
    hdr[width - 1] = 0;
    for (int d = 0; d < DP; d++) {
        char label[16];
        int len = snprintf(label, sizeof label, "dp %d", d);
        int first = cell_col[d * TP], last = block_end[d];
        int at = first + (last - first - len) / 2;
        memcpy(hdr + at, label, (size_t)len);
    }
    int e = (int)width - 1;
    while (e > 0 && hdr[e - 1] == ' ') hdr[--e] = 0;
    fprintf(f, "%s\n", hdr);
    memset(hdr, ' ', width - 1);
    for (int c = 0; c < DP * TP; c++) {
        char label[16];
        int len = snprintf(label, sizeof label, "tp%d", c % TP);
        memcpy(hdr + cell_col[c], label, (size_t)len);
    }
    e = (int)width - 1;
    while (e > 0 && hdr[e - 1] == ' ') hdr[--e] = 0;
    fprintf(f, "%s\n", hdr);
    for (int p = 0; p < PP; p++) fprintf(f, "%s\n", row + (size_t)p * width);
    free(hdr); free(row); free(cell_col); free(block_end);
    fprintf(f, "  TP groups");
    for (int p = 0; p < PP; p++)
        for (int d = 0; d < DP; d++) {
            for (int t = 0; t < TP; t++) members[t] = mt_global_rank(cfg, t, d, p);
            mt__print_group(f, members, TP);
        }
    fprintf(f, "\n  DP groups");
    for (int p = 0; p < PP; p++)
        for (int t = 0; t < TP; t++) {
            for (int d = 0; d < DP; d++) members[d] = mt_global_rank(cfg, t, d, p);
            mt__print_group(f, members, DP);
        }
    fprintf(f, "\n  PP groups");
    for (int d = 0; d < DP; d++)
        for (int t = 0; t < TP; t++) {
            for (int p = 0; p < PP; p++) members[p] = mt_global_rank(cfg, t, d, p);
            mt__print_group(f, members, PP);
        }
    fprintf(f, "\n  embedding groups");
    if (PP == 1) fprintf(f, " none: with one stage the tied embedding and LM head are the same tensor");
    for (int d = 0; d < DP && PP > 1; d++)
        for (int t = 0; t < TP; t++) {
            members[0] = mt_global_rank(cfg, t, d, 0);
            members[1] = mt_global_rank(cfg, t, d, PP - 1);
            mt__print_group(f, members, 2);
        }
    fprintf(f, "\n");
    if (cfg->virtual_pipeline_size > 1) {
        int lpc = cfg->parallel.num_layers_per_virtual_pipeline_stage;
        fprintf(f, "  interleaved: %d model chunks per stage of %d layers; stage s, chunk c holds layers (c*PP + s)*%d ..\n",
                cfg->virtual_pipeline_size, lpc, lpc);
    }
}

// =============================================================================================
// 4. TENSOR-PARALLEL LAYERS
// =============================================================================================
// Mirrors megatron/core/tensor_parallel/{layers.py, mappings.py, cross_entropy.py}.
// Megatron-LM paper (Shoeybi et al., 2019), section 3. Two conjugate operators carry all the
// communication of tensor parallelism:
//
//    op                        | forward            | backward
//    --------------------------+--------------------+-------------------
//    f  mt_copy_to_tp_region   | identity           | all-reduce(dX)
//    g  mt_reduce_from_tp_region| all-reduce(Y)     | identity
//
// A transformer MLP (and likewise attention) is f -> column-parallel -> row-parallel -> g:
//
//            X (B,T,C), identical on every TP rank
//                 | f: identity fwd, all-reduce(dX) bwd
//        +--------+--------+
//  rank0: H0 = gelu(X A0)      rank1: H1 = gelu(X A1)    A = [A0 | A1]   (B,T,F/tp) each, no comm
//  rank0: Z0 = H0 W0           rank1: Z1 = H1 W1         W = [W0 ; W1]   (B,T,C) partial sums
//  (the paper calls W "B"; renamed so it can't be confused with batch size B)
//        +--------+--------+
//                 | g: all-reduce(Z) fwd, identity bwd
//            Z = Z0 + Z1 + bias   (bias added once, after the reduce)
//
// Backward, the same picture read upwards: dZ arrives whole on every rank (g's backward is
// identity), each rank computes dH_r = dZ W_r^T, dA_r, dW_r with no communication, and the
// partial input gradients dX_r = dH'_r A_r^T are summed by f's backward: dX = sum_r dX_r.
// Our backward is written out by hand, so f's backward and g's forward are the same call.

// g forward / f backward: sum a (B,T,C) tensor over the TP group (nothing to do when TP = 1)
static void mt__tp_all_reduce(mt_rank *r, float *x, size_t n) {
    if (r->ps.tp_size > 1) mt_all_reduce(&r->tp, x, n, MT_SUM);
}
void mt_reduce_from_tp_region_forward(mt_rank *r, float *y, size_t n) { mt__tp_all_reduce(r, y, n); }
void mt_copy_to_tp_region_backward(mt_rank *r, float *dx, size_t n) { mt__tp_all_reduce(r, dx, n); }

// ---------------------------------------------------------------------------------------------
// column-parallel linear: Y_r = X A_r + b_r   (no communication forward)
// math: Y = X @ A, A is (K, OC), split by COLUMNS A = [A_0 | A_1 | ...];
// stored: weight is (OC_tp, K) = A_r^T, this rank's rows of the (OC, K) weight
// inp (BT, K) whole on every rank, out (BT, OC_tp) this rank's columns
void mt_column_parallel_linear_forward(mt_rank *r, float *out, const float *inp, const float *weight,
                                       const float *bias, int BT, int K, int OC_tp) {
    mt_matmul_forward(r, out, inp, weight, bias, BT, K, OC_tp);   // f's forward is the identity
}
// backward: dA_r, db_r locally; dX = sum_r dY_r A_r^T needs f's backward (all-reduce).
// dinp is written ('='): zeroed here, filled with this rank's part, then all-reduced.
void mt_column_parallel_linear_backward(mt_rank *r, float *dinp, float *dweight, float *dbias, const float *dout,
                                        const float *inp, const float *weight, int BT, int K, int OC_tp) {
    mt_buffer_zero(r, dinp, (size_t)BT * K);
    mt_matmul_backward(r, dinp, dweight, dbias, dout, inp, weight, BT, K, OC_tp);
    mt_copy_to_tp_region_backward(r, dinp, (size_t)BT * K);
}

// ---------------------------------------------------------------------------------------------
// row-parallel linear: Y = sum_r X_r W_r + b   (all-reduce forward)
// math: Y = X @ W, W is (K, OC), split by ROWS W = [W_0 ; W_1 ; ...], X = [X_0 | X_1 | ...];
// stored: weight is (OC, K_tp), this rank's columns of the (OC, K) weight
// inp (BT, K_tp) this rank's slice, out (BT, OC) whole on every rank after the reduce
void mt_row_parallel_linear_forward(mt_rank *r, float *out, const float *inp, const float *weight,
                                    const float *bias, int BT, int K_tp, int OC) {
    mt_matmul_forward(r, out, inp, weight, NULL, BT, K_tp, OC);   // partial sum X_r W_r
    mt_reduce_from_tp_region_forward(r, out, (size_t)BT * OC);   // g
    mt_bias_add(r, out, bias, BT, OC);                             // bias once, after the sum
}
// backward: dY is whole on every rank (g's backward is identity), so dX_r = dY W_r^T,
// dW_r = X_r^T dY and db = sum dY are all local. db is the same on every TP rank.
// dinp is written ('=').
void mt_row_parallel_linear_backward(mt_rank *r, float *dinp, float *dweight, float *dbias, const float *dout,
                                     const float *inp, const float *weight, int BT, int K_tp, int OC) {
    mt_buffer_zero(r, dinp, (size_t)BT * K_tp);
    mt_matmul_backward(r, dinp, dweight, dbias, dout, inp, weight, BT, K_tp, OC);
}

// ---------------------------------------------------------------------------------------------
// vocab-parallel embedding: rank r holds rows [r*Vp_tp, (r+1)*Vp_tp) of wte.
// forward: each rank looks up the tokens it owns (zeros elsewhere), then g: all-reduce, so
// every rank has the full embedding; then positions are added (wpe is replicated).
// writes out ('='), (B,T,C)
void mt_vocab_parallel_embedding_forward(mt_rank *r, float *out, const int *tokens, const float *wte, const float *wpe) {
    int B = r->B, T = r->T, C = r->C;
    mt_embedding_forward(r, out, tokens, wte, B, T, C, r->vocab_start, r->Vp_tp);
    mt_reduce_from_tp_region_forward(r, out, (size_t)B * T * C);
    mt_position_embedding_forward(r, out, wpe, B, T, C);
}
// backward: dout is whole on every rank (g's backward is identity); each rank adds to its rows
void mt_vocab_parallel_embedding_backward(mt_rank *r, float *dwte, float *dwpe, const float *dout, const int *tokens) {
    mt_embedding_backward(r, dwte, dout, tokens, r->B, r->T, r->C, r->vocab_start, r->Vp_tp);
    mt_position_embedding_backward(r, dwpe, dout, r->B, r->T, r->C);
}

// ---------------------------------------------------------------------------------------------
// vocab-parallel cross-entropy (megatron/core/tensor_parallel/cross_entropy.py): the logits
// stay split by vocabulary column; only three (B,T) vectors cross ranks:
//   m   = all-reduce MAX of each rank's row max
//   S   = all-reduce SUM of each rank's sum exp(l - m)
//   l_y = all-reduce SUM of the target's logit (only its owner contributes, the others add 0)
// loss = log S + m - l_y. The gradient softmax - onehot is local to each rank's columns.
// Padding columns (>= V) are left out of the softmax, so the loss does not depend on how
// much padding TP adds. (Megatron keeps them in; their logits just learn to be very small.)
// dloss != 0: overwrite logits with dloss/dlogits (dloss = d(total loss)/d(this loss)).
void mt_vocab_parallel_cross_entropy_forward(mt_rank *r, float *losses, float *logits, const int *targets, float dloss,
                                             int want_grad) {
    int BT = r->B * r->T, V = r->cfg->model.vocab_size;
    mt_scratch *s = &r->scratch;
    mt_cross_entropy_local_max(r, s->ce_max, logits, BT, r->Vp_tp, r->vocab_start, V);
    if (r->ps.tp_size > 1) mt_all_reduce(&r->tp, s->ce_max, (size_t)BT, MT_MAX);
    mt_cross_entropy_local_sums(r, s->ce_sum, s->ce_target, logits, s->ce_max, targets, BT, r->Vp_tp, r->vocab_start, V);
    if (r->ps.tp_size > 1) {
        mt_all_reduce(&r->tp, s->ce_sum, (size_t)BT, MT_SUM);
        mt_all_reduce(&r->tp, s->ce_target, (size_t)BT, MT_SUM);
    }
    mt_cross_entropy_finish(r, losses, want_grad ? logits : NULL, s->ce_max, s->ce_sum, s->ce_target, targets, BT,
                            r->Vp_tp, r->vocab_start, V, dloss);
}

// =============================================================================================
// 5. GPT MODEL (layout, forward, backward)
// =============================================================================================
// Mirrors megatron/core/models/gpt/gpt_model.py and transformer_layer.py, as llm.c's
// train_gpt2.c lays it out: one buffer of parameters carved into named tensors, one of
// gradients carved the same way, activations per in-flight micro-batch.
//   x = dropout(wte[tokens] + wpe)                              (first stage)
//   per layer:  x = x + dropout(proj(attn(ln1(x))));  x = x + dropout(fcproj(gelu(fc(ln2(x)))))
//   loss = cross_entropy(ln_f(x) @ wte^T, targets)              (last stage; wte is tied)

int mt_local_to_global_layer(const mt_rank *r, int l) {
    // interleaved: chunk c of stage s holds layers (c*PP + s)*lpc .. (megatron's get_transformer_layer_offset)
    int lpc = r->layers_per_chunk;
    int c = l / lpc, j = l % lpc;
    return (c * r->ps.pp_size + r->ps.pp_rank) * lpc + j;
}

// one carve for parameters, gradients and both AdamW moments: the order here is the order
// in memory and in checkpoints. Returns the number of floats.
static size_t mt__carve_params(mt_rank *r, mt_params *p, float *base, int fill_specs) {
    const mt_config *cfg = r->cfg;
    int C = r->C, C_tp = r->C_tp, F_tp = r->F_tp, Ll = r->L_local;
    int C3 = 3 * C, F = cfg->model.ffn_hidden_size;
    int first = r->ps.is_first_stage, last = r->ps.is_last_stage;
    // name, pointer, layers, local rows, cols, global rows, cols, split, no_decay, tp_replicated, present
    mt_param_spec table[MT_NUM_PARAM_TENSORS] = {
        {"wte", &p->wte, 0, 0, r->Vp_tp, C, cfg->model.vocab_size, C, MT_SPLIT_VOCAB, 0, 0, first || last},
        {"wpe", &p->wpe, 0, 0, cfg->model.max_position_embeddings, C, cfg->model.max_position_embeddings, C, MT_SPLIT_NONE, 0, 1, first},
        {"ln1w", &p->ln1w, 0, Ll, 1, C, 1, C, MT_SPLIT_NONE, 1, 1, 1},
        {"ln1b", &p->ln1b, 0, Ll, 1, C, 1, C, MT_SPLIT_NONE, 1, 1, 1},
        {"qkvw", &p->qkvw, 0, Ll, 3 * C_tp, C, C3, C, MT_SPLIT_QKV, 0, 0, 1},
        {"qkvb", &p->qkvb, 0, Ll, 3 * C_tp, 1, C3, 1, MT_SPLIT_QKV, 1, 0, 1},
        {"attprojw", &p->attprojw, 0, Ll, C, C_tp, C, C, MT_SPLIT_COLS, 0, 0, 1},
        {"attprojb", &p->attprojb, 0, Ll, 1, C, 1, C, MT_SPLIT_NONE, 1, 1, 1},
        {"ln2w", &p->ln2w, 0, Ll, 1, C, 1, C, MT_SPLIT_NONE, 1, 1, 1},
        {"ln2b", &p->ln2b, 0, Ll, 1, C, 1, C, MT_SPLIT_NONE, 1, 1, 1},
        {"fcw", &p->fcw, 0, Ll, F_tp, C, F, C, MT_SPLIT_ROWS, 0, 0, 1},
        {"fcb", &p->fcb, 0, Ll, F_tp, 1, F, 1, MT_SPLIT_ROWS, 1, 0, 1},
        {"fcprojw", &p->fcprojw, 0, Ll, C, F_tp, C, F, MT_SPLIT_COLS, 0, 0, 1},
        {"fcprojb", &p->fcprojb, 0, Ll, 1, C, 1, C, MT_SPLIT_NONE, 1, 1, 1},
        {"lnfw", &p->lnfw, 0, 0, 1, C, 1, C, MT_SPLIT_NONE, 1, 1, last},
        {"lnfb", &p->lnfb, 0, 0, 1, C, 1, C, MT_SPLIT_NONE, 1, 1, last},
    };
    size_t offset = 0;
    for (int i = 0; i < MT_NUM_PARAM_TENSORS; i++) {
        mt_param_spec *s = &table[i];
        size_t n = s->present ? (size_t)(s->layers ? s->layers : 1) * s->rows * s->cols : 0;
        s->offset = offset;
        *s->ptr = (s->present && base) ? base + offset : NULL;
        offset += n;
        if (fill_specs) r->specs[i] = *s;
    }
    return offset;
}

static size_t mt__spec_numel(const mt_param_spec *s) {
    return s->present ? (size_t)(s->layers ? s->layers : 1) * s->rows * s->cols : 0;
}

// where local element (row, col) of layer tensor s lives in the global (grows, gcols) tensor;
// returns 0 for padded vocabulary rows, which exist only locally.
static int mt__global_coords(const mt_rank *r, const mt_param_spec *s, int row, int col, int *grow, int *gcol) {
    int tp = r->ps.tp_rank;
    *grow = row;
    *gcol = col;
    switch (s->split) {
    case MT_SPLIT_NONE: break;
    case MT_SPLIT_ROWS: *grow = tp * s->rows + row; break;
    case MT_SPLIT_COLS: *gcol = tp * s->cols + col; break;
    case MT_SPLIT_QKV: {
        int part = row / r->C_tp, within = row % r->C_tp;      // 0 = Q, 1 = K, 2 = V
        *grow = part * r->C + tp * r->C_tp + within;
        break;
    }
    case MT_SPLIT_VOCAB:
        *grow = tp * s->rows + row;
        if (*grow >= s->grows) return 0;
        break;
    }
    return 1;
}

void mt_shard_copy(const mt_rank *r, const mt_param_spec *s, float *global_tensor, int global_layers, int dir) {
    const float *base = r->params_memory + s->offset;
    int nl = s->layers ? s->layers : 1;
    size_t gsize = (size_t)s->grows * s->gcols;
    (void)global_layers;
    for (int l = 0; l < nl; l++) {
        int gl = s->layers ? mt_local_to_global_layer(r, l) : 0;
        for (int row = 0; row < s->rows; row++)
            for (int col = 0; col < s->cols; col++) {
                int grow, gcol;
                size_t li = ((size_t)l * s->rows + row) * s->cols + col;
                if (!mt__global_coords(r, s, row, col, &grow, &gcol)) continue;
                float *g = global_tensor + (size_t)gl * gsize + (size_t)grow * s->gcols + gcol;
                if (dir == 0) *g = base[li];
                else ((float *)base)[li] = *g;
            }
    }
}

// Initialisation as Megatron's: normal(0, std) for weights, std/sqrt(2L) for the two output
// projections (GPT-2's scaled init), ones for layernorm weights, zeros for biases.
// Each value is drawn from the counter-based generator keyed on (seed, tensor, global layer,
// global element index): like Megatron's _initialize_affine_weight_cpu (init the whole master
// weight, keep my slice) but without materialising the whole tensor.
static void mt__init_params(mt_rank *r) {
    const mt_config *cfg = r->cfg;
    float std = cfg->model.init_method_std;
    float out_std = std / sqrtf(2.0f * (float)cfg->model.num_layers);
    for (int i = 0; i < MT_NUM_PARAM_TENSORS; i++) {
        const mt_param_spec *s = &r->specs[i];
        if (!s->present) continue;
        float *base = r->params_memory + s->offset;
        int is_ln_weight = strcmp(s->name, "ln1w") == 0 || strcmp(s->name, "ln2w") == 0 || strcmp(s->name, "lnfw") == 0;
        int is_bias = s->no_decay && !is_ln_weight;
        float tensor_std = (strcmp(s->name, "attprojw") == 0 || strcmp(s->name, "fcprojw") == 0) ? out_std : std;
        int nl = s->layers ? s->layers : 1;
        for (int l = 0; l < nl; l++) {
            int gl = s->layers ? mt_local_to_global_layer(r, l) : 0;
            for (int row = 0; row < s->rows; row++)
                for (int col = 0; col < s->cols; col++) {
                    size_t li = ((size_t)l * s->rows + row) * s->cols + col;
                    int grow, gcol;
                    if (!mt__global_coords(r, s, row, col, &grow, &gcol)) { base[li] = 0.0f; continue; }
                    if (is_ln_weight) base[li] = 1.0f;
                    else if (is_bias) base[li] = 0.0f;
                    else base[li] = tensor_std * mt_rand_normal(cfg->train.seed, 0x1417 + (uint64_t)i, (uint64_t)gl, 0,
                                                                (uint64_t)grow * s->gcols + gcol);
                }
        }
    }
}

// activations of one micro-batch, carved from one buffer (NULL base: just count)
static size_t mt__carve_activations(const mt_rank *r, mt_activations *a, float *base) {
    size_t B = r->B, T = r->T, C = r->C, Ll = r->L_local, vp = r->ps.vp_size;
    size_t BT = B * T;
    int last = r->ps.is_last_stage;
    struct { float **ptr; size_t n; } carve[] = {
        {&a->input, vp * BT * C},
        {&a->ln1, Ll * BT * C}, {&a->ln1_mean, Ll * BT}, {&a->ln1_rstd, Ll * BT},
        {&a->qkv, Ll * BT * 3 * r->C_tp}, {&a->atty, Ll * BT * r->C_tp},
        {&a->att, Ll * B * r->NH_tp * T * (size_t)r->att_row},
        {&a->residual2, Ll * BT * C},
        {&a->ln2, Ll * BT * C}, {&a->ln2_mean, Ll * BT}, {&a->ln2_rstd, Ll * BT},
        {&a->fch, Ll * BT * r->F_tp}, {&a->fch_gelu, Ll * BT * r->F_tp},
        {&a->residual3, Ll * BT * C},
        {&a->lnf, last ? BT * C : 0}, {&a->lnf_mean, last ? BT : 0}, {&a->lnf_rstd, last ? BT : 0},
        {&a->logits, last ? BT * (size_t)r->Vp_tp : 0}, {&a->losses, last ? BT : 0},
    };
    size_t offset = 0;
    for (size_t i = 0; i < sizeof carve / sizeof carve[0]; i++) {
        *carve[i].ptr = (base && carve[i].n) ? base + offset : NULL;
        offset += carve[i].n;
    }
    return offset;
}

static size_t mt__carve_scratch(const mt_rank *r, mt_scratch *s, float *base) {
    size_t BT = (size_t)r->B * r->T, C = r->C;
    struct { float **ptr; size_t n; } carve[] = {
        {&s->out_c, BT * C}, {&s->dresidual, BT * C}, {&s->dln, BT * C},
        {&s->dqkv, BT * 3 * r->C_tp}, {&s->datty, BT * r->C_tp},
        {&s->dfch, BT * r->F_tp}, {&s->dfch_gelu, BT * r->F_tp}, {&s->dp_row, (size_t)r->T},
        {&s->ce_max, BT}, {&s->ce_sum, BT}, {&s->ce_target, BT},
    };
    size_t offset = 0;
    for (size_t i = 0; i < sizeof carve / sizeof carve[0]; i++) {
        *carve[i].ptr = base ? base + offset : NULL;
        offset += carve[i].n;
    }
    return offset;
}

// ---------------------------------------------------------------------------------------------
// one transformer layer, forward. x (B,T,C) is the layer's input (saved, not copied).
static void mt__layer_forward(mt_rank *r, mt_activations *a, int l, const float *x, int sample_offset) {
    const mt_config *cfg = r->cfg;
    int B = r->B, T = r->T, C = r->C, BT = B * T, C_tp = r->C_tp, F_tp = r->F_tp;
    mt_params *p = &r->params;
    int gl = mt_local_to_global_layer(r, l);
    // this layer's parameters and saved activations (llm.c's l_ names)
    float *l_ln1w = p->ln1w + (size_t)l * C, *l_ln1b = p->ln1b + (size_t)l * C;
    float *l_qkvw = p->qkvw + (size_t)l * 3 * C_tp * C, *l_qkvb = p->qkvb + (size_t)l * 3 * C_tp;
    float *l_attprojw = p->attprojw + (size_t)l * C * C_tp, *l_attprojb = p->attprojb + (size_t)l * C;
    float *l_ln2w = p->ln2w + (size_t)l * C, *l_ln2b = p->ln2b + (size_t)l * C;
    float *l_fcw = p->fcw + (size_t)l * F_tp * C, *l_fcb = p->fcb + (size_t)l * F_tp;
    float *l_fcprojw = p->fcprojw + (size_t)l * C * F_tp, *l_fcprojb = p->fcprojb + (size_t)l * C;
    float *l_ln1 = a->ln1 + (size_t)l * BT * C, *l_ln1_mean = a->ln1_mean + (size_t)l * BT, *l_ln1_rstd = a->ln1_rstd + (size_t)l * BT;
    float *l_qkv = a->qkv + (size_t)l * BT * 3 * C_tp, *l_atty = a->atty + (size_t)l * BT * C_tp;
    float *l_att = a->att + (size_t)l * B * r->NH_tp * T * r->att_row;
    float *l_residual2 = a->residual2 + (size_t)l * BT * C;
    float *l_ln2 = a->ln2 + (size_t)l * BT * C, *l_ln2_mean = a->ln2_mean + (size_t)l * BT, *l_ln2_rstd = a->ln2_rstd + (size_t)l * BT;
    float *l_fch = a->fch + (size_t)l * BT * F_tp, *l_fch_gelu = a->fch_gelu + (size_t)l * BT * F_tp;
    float *l_residual3 = a->residual3 + (size_t)l * BT * C;
    float *out_c = r->scratch.out_c;
    mt_dropout attn_drop = {cfg->train.seed, (uint64_t)r->iteration, (uint64_t)(gl + 1) * 8 + 1,
                            r->training ? cfg->model.attention_dropout : 0.0f, sample_offset, T, C};
    mt_dropout hid_drop = attn_drop;
    hid_drop.p = r->training ? cfg->model.hidden_dropout : 0.0f;

    // attention block
    mt_layernorm_forward(r, l_ln1, l_ln1_mean, l_ln1_rstd, x, l_ln1w, l_ln1b, B, T, C);
    mt_column_parallel_linear_forward(r, l_qkv, l_ln1, l_qkvw, l_qkvb, BT, C, 3 * C_tp);
    mt_attention_forward(r, l_atty, l_att, l_qkv, B, T, C_tp, r->NH_tp, &attn_drop, r->ps.tp_rank * r->NH_tp,
                             cfg->model.num_attention_heads);
    mt_row_parallel_linear_forward(r, out_c, l_atty, l_attprojw, l_attprojb, BT, C_tp, C);
    hid_drop.site = (uint64_t)(gl + 1) * 8 + 2;
    mt_dropout_forward(r, out_c, &hid_drop, B);
    mt_residual_forward(r, l_residual2, x, out_c, (size_t)BT * C);
    // MLP block
    mt_layernorm_forward(r, l_ln2, l_ln2_mean, l_ln2_rstd, l_residual2, l_ln2w, l_ln2b, B, T, C);
    mt_column_parallel_linear_forward(r, l_fch, l_ln2, l_fcw, l_fcb, BT, C, F_tp);
    mt_gelu_forward(r, l_fch_gelu, l_fch, (size_t)BT * F_tp);
    mt_row_parallel_linear_forward(r, out_c, l_fch_gelu, l_fcprojw, l_fcprojb, BT, F_tp, C);
    hid_drop.site = (uint64_t)(gl + 1) * 8 + 3;
    mt_dropout_forward(r, out_c, &hid_drop, B);
    mt_residual_forward(r, l_residual3, l_residual2, out_c, (size_t)BT * C);
}

// one transformer layer, backward. On entry scratch.dresidual holds dL/d(residual3);
// on exit it holds dL/dx. x is the layer's forward input.
static void mt__layer_backward(mt_rank *r, mt_activations *a, int l, const float *x, int sample_offset) {
    const mt_config *cfg = r->cfg;
    int B = r->B, T = r->T, C = r->C, BT = B * T, C_tp = r->C_tp, F_tp = r->F_tp;
    mt_params *p = &r->params, *g = &r->grads;
    mt_scratch *s = &r->scratch;
    int gl = mt_local_to_global_layer(r, l);
    float *l_ln1w = p->ln1w + (size_t)l * C;
    float *l_qkvw = p->qkvw + (size_t)l * 3 * C_tp * C;
    float *l_attprojw = p->attprojw + (size_t)l * C * C_tp;
    float *l_ln2w = p->ln2w + (size_t)l * C;
    float *l_fcw = p->fcw + (size_t)l * F_tp * C;
    float *l_fcprojw = p->fcprojw + (size_t)l * C * F_tp;
    float *dl_ln1w = g->ln1w + (size_t)l * C, *dl_ln1b = g->ln1b + (size_t)l * C;
    float *dl_qkvw = g->qkvw + (size_t)l * 3 * C_tp * C, *dl_qkvb = g->qkvb + (size_t)l * 3 * C_tp;
    float *dl_attprojw = g->attprojw + (size_t)l * C * C_tp, *dl_attprojb = g->attprojb + (size_t)l * C;
    float *dl_ln2w = g->ln2w + (size_t)l * C, *dl_ln2b = g->ln2b + (size_t)l * C;
    float *dl_fcw = g->fcw + (size_t)l * F_tp * C, *dl_fcb = g->fcb + (size_t)l * F_tp;
    float *dl_fcprojw = g->fcprojw + (size_t)l * C * F_tp, *dl_fcprojb = g->fcprojb + (size_t)l * C;
    float *l_ln1 = a->ln1 + (size_t)l * BT * C, *l_ln1_mean = a->ln1_mean + (size_t)l * BT, *l_ln1_rstd = a->ln1_rstd + (size_t)l * BT;
    float *l_qkv = a->qkv + (size_t)l * BT * 3 * C_tp, *l_atty = a->atty + (size_t)l * BT * C_tp;
    float *l_att = a->att + (size_t)l * B * r->NH_tp * T * r->att_row;
    float *l_residual2 = a->residual2 + (size_t)l * BT * C;
    float *l_ln2 = a->ln2 + (size_t)l * BT * C, *l_ln2_mean = a->ln2_mean + (size_t)l * BT, *l_ln2_rstd = a->ln2_rstd + (size_t)l * BT;
    float *l_fch = a->fch + (size_t)l * BT * F_tp, *l_fch_gelu = a->fch_gelu + (size_t)l * BT * F_tp;
    mt_dropout attn_drop = {cfg->train.seed, (uint64_t)r->iteration, (uint64_t)(gl + 1) * 8 + 1,
                            cfg->model.attention_dropout, sample_offset, T, C};
    mt_dropout hid_drop = attn_drop;
    hid_drop.p = cfg->model.hidden_dropout;
    size_t BTC = (size_t)BT * C;

    // MLP block. forward was: residual3 = residual2 + dropout(fcproj(gelu(fc(ln2(residual2)))))
    // the residual passes dresidual through unchanged; the branch gets a copy
    mt_buffer_copy(r, s->out_c, s->dresidual, BTC);
    hid_drop.site = (uint64_t)(gl + 1) * 8 + 3;
    mt_dropout_backward(r, s->out_c, &hid_drop, B);
    mt_row_parallel_linear_backward(r, s->dfch_gelu, dl_fcprojw, dl_fcprojb, s->out_c, l_fch_gelu, l_fcprojw, BT, F_tp, C);
    mt_buffer_zero(r, s->dfch, (size_t)BT * F_tp);
    mt_gelu_backward(r, s->dfch, l_fch, s->dfch_gelu, (size_t)BT * F_tp);
    mt_column_parallel_linear_backward(r, s->dln, dl_fcw, dl_fcb, s->dfch, l_ln2, l_fcw, BT, C, F_tp);
    mt_layernorm_backward(r, s->dresidual, dl_ln2w, dl_ln2b, s->dln, l_residual2, l_ln2w, l_ln2_mean, l_ln2_rstd, B, T, C);
    // attention block. forward was: residual2 = x + dropout(attproj(attention(qkv(ln1(x)))))
    mt_buffer_copy(r, s->out_c, s->dresidual, BTC);
    hid_drop.site = (uint64_t)(gl + 1) * 8 + 2;
    mt_dropout_backward(r, s->out_c, &hid_drop, B);
    mt_row_parallel_linear_backward(r, s->datty, dl_attprojw, dl_attprojb, s->out_c, l_atty, l_attprojw, BT, C_tp, C);
    mt_buffer_zero(r, s->dqkv, (size_t)BT * 3 * C_tp);
    mt_attention_backward(r, s->dqkv, s->datty, l_qkv, l_atty, l_att, B, T, C_tp, r->NH_tp, &attn_drop, r->ps.tp_rank * r->NH_tp,
                              cfg->model.num_attention_heads, s->dp_row);
    mt_column_parallel_linear_backward(r, s->dln, dl_qkvw, dl_qkvb, s->dqkv, l_ln1, l_qkvw, BT, C, 3 * C_tp);
    mt_layernorm_backward(r, s->dresidual, dl_ln1w, dl_ln1b, s->dln, x, l_ln1w, l_ln1_mean, l_ln1_rstd, B, T, C);
}

// the embedding (first virtual stage) and the head (last virtual stage)
static int mt__is_first_virtual(const mt_rank *r, int chunk) { return r->ps.is_first_stage && chunk == 0; }
static int mt__is_last_virtual(const mt_rank *r, int chunk) { return r->ps.is_last_stage && chunk == r->ps.vp_size - 1; }

static void mt__embedding_forward(mt_rank *r, mt_activations *a) {
    const mt_config *cfg = r->cfg;
    mt_vocab_parallel_embedding_forward(r, a->input, a->tokens, r->params.wte, r->params.wpe);
    mt_dropout d = {cfg->train.seed, (uint64_t)r->iteration, 0, r->training ? cfg->model.hidden_dropout : 0.0f,
                    a->sample_offset, r->T, r->C};
    mt_dropout_forward(r, a->input, &d, r->B);
}
static void mt__embedding_backward(mt_rank *r, mt_activations *a) {
    const mt_config *cfg = r->cfg;
    mt_dropout d = {cfg->train.seed, (uint64_t)r->iteration, 0, cfg->model.hidden_dropout, a->sample_offset, r->T, r->C};
    mt_dropout_backward(r, r->scratch.dresidual, &d, r->B);
    mt_vocab_parallel_embedding_backward(r, r->grads.wte, r->grads.wpe, r->scratch.dresidual, a->tokens);
}

// head: lnf = ln_f(x); logits = lnf @ wte^T (column-parallel over the vocabulary); loss.
// dloss is d(global batch loss)/d(a position's loss) = 1 / (B*T * micro-batches * DP).
static void mt__head_forward(mt_rank *r, mt_activations *a, const float *x, int want_grad) {
    int B = r->B, T = r->T, C = r->C, BT = B * T;
    mt_layernorm_forward(r, a->lnf, a->lnf_mean, a->lnf_rstd, x, r->params.lnfw, r->params.lnfb, B, T, C);
    mt_column_parallel_linear_forward(r, a->logits, a->lnf, r->params.wte, NULL, BT, C, r->Vp_tp);
    float dloss = 1.0f / ((float)BT * (float)r->cfg->num_microbatches * (float)r->ps.dp_size);
    mt_vocab_parallel_cross_entropy_forward(r, a->losses, a->logits, a->targets, dloss, want_grad);
    mt_buffer_download(r, r->host_losses, a->losses, (size_t)BT * sizeof(float));
    double sum = 0.0;
    for (int i = 0; i < BT; i++) sum += r->host_losses[i];
    r->loss_sum += sum / BT;
}
static void mt__head_backward(mt_rank *r, mt_activations *a, const float *x) {
    int B = r->B, T = r->T, C = r->C, BT = B * T;
    mt_scratch *s = &r->scratch;
    // logits = lnf @ wte_r^T: dlnf = sum_r dlogits_r @ wte_r (f's backward), dwte_r += dlogits_r^T lnf
    mt_column_parallel_linear_backward(r, s->dln, r->grads.wte, NULL, a->logits, a->lnf, r->params.wte, BT, C, r->Vp_tp);
    mt_buffer_zero(r, s->dresidual, (size_t)BT * C);
    mt_layernorm_backward(r, s->dresidual, r->grads.lnfw, r->grads.lnfb, s->dln, x, r->params.lnfw, a->lnf_mean,
                              a->lnf_rstd, B, T, C);
}

// the input and output of chunk c's layers
static float *mt__chunk_input(const mt_rank *r, mt_activations *a, int chunk) {
    return a->input + (size_t)chunk * r->B * r->T * r->C;
}
static float *mt__layer_input(const mt_rank *r, mt_activations *a, int l) {
    int lpc = r->layers_per_chunk;
    if (l % lpc == 0) return mt__chunk_input(r, a, l / lpc);
    return a->residual3 + (size_t)(l - 1) * r->B * r->T * r->C;
}
static float *mt__chunk_output(const mt_rank *r, mt_activations *a, int chunk) {
    int last_layer = (chunk + 1) * r->layers_per_chunk - 1;
    return a->residual3 + (size_t)last_layer * r->B * r->T * r->C;
}

// forward of one model chunk for one micro-batch; its input is already in place
static void mt__forward_chunk(mt_rank *r, mt_activations *a, int chunk) {
    if (mt__is_first_virtual(r, chunk)) mt__embedding_forward(r, a);
    for (int j = 0; j < r->layers_per_chunk; j++) {
        int l = chunk * r->layers_per_chunk + j;
        mt__layer_forward(r, a, l, mt__layer_input(r, a, l), a->sample_offset);
    }
    if (mt__is_last_virtual(r, chunk)) mt__head_forward(r, a, mt__chunk_output(r, a, chunk), r->training);
}
// backward of one model chunk; scratch.dresidual holds dL/d(chunk output) unless this is the
// last virtual stage (then the head starts it). On exit it holds dL/d(chunk input).
static void mt__backward_chunk(mt_rank *r, mt_activations *a, int chunk) {
    if (mt__is_last_virtual(r, chunk)) mt__head_backward(r, a, mt__chunk_output(r, a, chunk));
    for (int j = r->layers_per_chunk - 1; j >= 0; j--) {
        int l = chunk * r->layers_per_chunk + j;
        mt__layer_backward(r, a, l, mt__layer_input(r, a, l), a->sample_offset);
    }
    if (mt__is_first_virtual(r, chunk)) mt__embedding_backward(r, a);
}

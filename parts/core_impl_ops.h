// =============================================================================================
// 3. OPS: CPU REFERENCE (forward/backward pairs)
// =============================================================================================
// The definition of every op, as plain loops over b and t (llm.c's train_gpt2.c is the model).
// The GPU kernels in kernels.cuh must match these (tests/gpu compares them on random data).
// Argument grammar: mt_<op>_forward(out..., inp..., params..., dims) and
// mt_<op>_backward(dinp..., dparams..., dout, saved..., dims).
// THE RULE: every backward ADDS into its d-buffers (+=); the caller zeroes them. An op that
// writes with '=' says so on its first comment line.
// Shapes: B batch, T time, C channels, NH heads, hs = C/NH, OC output channels, V vocabulary.

// ---------------------------------------------------------------------------------------------
// embedding lookup (vocab-parallel): out = wte[token - vocab_start], or 0 if not this rank's
// writes out with '='. out is (B,T,C), tokens (B,T), wte (V_local, C): this rank's rows
// [vocab_start, vocab_start + V_local) of the full table. With one TP rank V_local is Vp.
void mt_embedding_forward_cpu(float *out, const int *tokens, const float *wte, int B, int T, int C,
                              int vocab_start, int V_local) {
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            float *out_bt = out + ((size_t)b * T + t) * C;
            int local = tokens[b * T + t] - vocab_start;
            if (local >= 0 && local < V_local) memcpy(out_bt, wte + (size_t)local * C, (size_t)C * sizeof(float));
            else memset(out_bt, 0, (size_t)C * sizeof(float));
        }
}
// in the forward pass this was: out[b,t,:] = wte[token[b,t], :]  (if the token is ours)
// so the gradient of a row of wte collects dout of every position that looked it up
void mt_embedding_backward_cpu(float *dwte, const float *dout, const int *tokens, int B, int T, int C,
                               int vocab_start, int V_local) {
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            int local = tokens[b * T + t] - vocab_start;
            if (local < 0 || local >= V_local) continue;
            const float *dout_bt = dout + ((size_t)b * T + t) * C;
            float *dwte_row = dwte + (size_t)local * C;
            for (int i = 0; i < C; i++) dwte_row[i] += dout_bt[i];
        }
}

// ---------------------------------------------------------------------------------------------
// position embedding: out[b,t,:] += wpe[t,:]
void mt_position_embedding_forward_cpu(float *out, const float *wpe, int B, int T, int C) {
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            float *out_bt = out + ((size_t)b * T + t) * C;
            const float *wpe_t = wpe + (size_t)t * C;
            for (int i = 0; i < C; i++) out_bt[i] += wpe_t[i];
        }
}
void mt_position_embedding_backward_cpu(float *dwpe, const float *dout, int B, int T, int C) {
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const float *dout_bt = dout + ((size_t)b * T + t) * C;
            float *dwpe_t = dwpe + (size_t)t * C;
            for (int i = 0; i < C; i++) dwpe_t[i] += dout_bt[i];
        }
}

// ---------------------------------------------------------------------------------------------
// layernorm: out = (x - mean) * rstd * weight + bias, rstd = 1/sqrt(var + 1e-5), over C
// writes out, mean, rstd with '='. inp/out are (B,T,C), mean/rstd (B,T), weight/bias (C)
void mt_layernorm_forward_cpu(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                              const float *bias, int B, int T, int C) {
    const float eps = 1e-5f;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const float *x = inp + ((size_t)b * T + t) * C;
            float m = 0.0f;
            for (int i = 0; i < C; i++) m += x[i];
            m = m / (float)C;
            float v = 0.0f;
            for (int i = 0; i < C; i++) { float d = x[i] - m; v += d * d; }
            v = v / (float)C;
            float s = 1.0f / sqrtf(v + eps);
            float *o = out + ((size_t)b * T + t) * C;
            for (int i = 0; i < C; i++) o[i] = (s * (x[i] - m)) * weight[i] + bias[i];
            mean[b * T + t] = m;
            rstd[b * T + t] = s;
        }
}
// in the forward pass this was: out = norm * weight + bias, norm = (x - mean) * rstd
// so now: dbias += dout, dweight += norm * dout, and with dnorm = dout * weight,
// dx = rstd * (dnorm - mean(dnorm) - norm * mean(dnorm * norm))   (the two means are over C)
void mt_layernorm_backward_cpu(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                               const float *weight, const float *mean, const float *rstd, int B, int T, int C) {
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const float *dout_bt = dout + ((size_t)b * T + t) * C;
            const float *inp_bt = inp + ((size_t)b * T + t) * C;
            float *dinp_bt = dinp + ((size_t)b * T + t) * C;
            float mean_bt = mean[b * T + t], rstd_bt = rstd[b * T + t];
            float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
            for (int i = 0; i < C; i++) {
                float norm_bti = (inp_bt[i] - mean_bt) * rstd_bt;
                float dnorm_i = weight[i] * dout_bt[i];
                dnorm_mean += dnorm_i;
                dnorm_norm_mean += dnorm_i * norm_bti;
            }
            dnorm_mean = dnorm_mean / (float)C;
            dnorm_norm_mean = dnorm_norm_mean / (float)C;
            for (int i = 0; i < C; i++) {
                float norm_bti = (inp_bt[i] - mean_bt) * rstd_bt;
                float dnorm_i = weight[i] * dout_bt[i];
                dbias[i] += dout_bt[i];
                dweight[i] += norm_bti * dout_bt[i];
                dinp_bt[i] += (dnorm_i - dnorm_mean - norm_bti * dnorm_norm_mean) * rstd_bt;
            }
        }
}

// ---------------------------------------------------------------------------------------------
// matmul: out = inp @ weight^T + bias     (a linear layer, PyTorch's convention)
// writes out with '='. inp (BT, C), weight (OC, C) (a row per output channel), bias (OC) or NULL
// out (BT, OC). Speed on a CPU comes from two things, neither of which changes the result:
//  - cache blocks: MT_MATMUL_BLOCK weight rows are used for every row of inp before moving on,
//    so the weight is read from memory once, not once per token (the LM head's is 25+ MB);
//  - 8 independent partial sums per dot product, so the compiler can vectorise the loop
//    without reordering float additions (the same bits at every -O level and block size).
#define MT_MATMUL_BLOCK 64
static inline float mt__dot(const float *x, const float *w, int C) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= C; i += 8)
        for (int k = 0; k < 8; k++) acc[k] += x[i + k] * w[i + k];
    float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; i < C; i++) s += x[i] * w[i];
    return s;
}
void mt_matmul_forward_cpu(float *out, const float *inp, const float *weight, const float *bias,
                           int BT, int C, int OC) {
    for (int o0 = 0; o0 < OC; o0 += MT_MATMUL_BLOCK) {
        int o1 = o0 + MT_MATMUL_BLOCK < OC ? o0 + MT_MATMUL_BLOCK : OC;
        for (int bt = 0; bt < BT; bt++) {
            const float *x = inp + (size_t)bt * C;
            float *y = out + (size_t)bt * OC;
            for (int o = o0; o < o1; o++) y[o] = mt__dot(x, weight + (size_t)o * C, C) + (bias ? bias[o] : 0.0f);
        }
    }
}
// in the forward pass this was: out[bt,o] = sum_i inp[bt,i] * weight[o,i] + bias[o]
// so now: dinp[bt,i] += sum_o dout[bt,o] * weight[o,i]     (dinp = dout @ weight)
//         dweight[o,i] += sum_bt dout[bt,o] * inp[bt,i]    (dweight = dout^T @ inp)
//         dbias[o] += sum_bt dout[bt,o]
// dinp may be NULL (nothing upstream needs it), dbias NULL when there is no bias.
// Each sum runs in increasing o (for dinp) or bt (for dweight, dbias) whatever the blocking.
void mt_matmul_backward_cpu(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                            const float *weight, int BT, int C, int OC) {
    if (dinp) {
        for (int o0 = 0; o0 < OC; o0 += MT_MATMUL_BLOCK) {
            int o1 = o0 + MT_MATMUL_BLOCK < OC ? o0 + MT_MATMUL_BLOCK : OC;
            for (int bt = 0; bt < BT; bt++) {
                const float *dy = dout + (size_t)bt * OC;
                float *dx = dinp + (size_t)bt * C;
                for (int o = o0; o < o1; o++) {
                    const float *w = weight + (size_t)o * C;
                    float d = dy[o];
                    for (int i = 0; i < C; i++) dx[i] += w[i] * d;
                }
            }
        }
    }
    for (int b0 = 0; b0 < BT; b0 += MT_MATMUL_BLOCK) {
        int b1 = b0 + MT_MATMUL_BLOCK < BT ? b0 + MT_MATMUL_BLOCK : BT;
        for (int o = 0; o < OC; o++) {
            float *dw = dweight + (size_t)o * C;
            float db = 0.0f;
            for (int bt = b0; bt < b1; bt++) {
                const float *x = inp + (size_t)bt * C;
                float d = dout[(size_t)bt * OC + o];
                db += d;
                for (int i = 0; i < C; i++) dw[i] += x[i] * d;
            }
            if (dbias) dbias[o] += db;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// dropout with a counter-based mask: keep element e iff uniform(key, global index of e) >= p,
// and scale what is kept by 1/(1-p) so the expectation is unchanged.
// The mask is never stored: the backward asks the same question of the same key again.
// How Megatron differs: its CudaRNGStatesTracker keeps a "model-parallel" CUDA generator seeded
// with seed + 2718 + tp_rank, used for dropout inside TP regions (the attention probabilities of
// my heads), and the default generator, equal on all TP ranks, for dropout on the replicated
// hidden states. That is cheap (a stateful Philox stream per rank) and correct for training, but
// the masks depend on TP and on the order of calls, so no two layouts drop the same elements.
// Here the key is the element's global index (sample, head, position, channel), so every layout
// drops exactly the same elements and tests/test_layouts.c can demand identical losses.
// `key` names the site (seed, iteration, layer, which dropout); `index_of` turns the local
// position into the element's index in the *global* tensor (see mt_dropout_index below).
typedef struct {
    uint64_t seed, iteration, site;   // site = layer * 8 + which (embedding, attention, attn out, mlp out)
    float p;                          // drop probability; 0 = dropout off
    int sample_offset;                // global sample index of local b = 0 (within the iteration)
    int T, C;                         // for hidden dropout (B,T,C): global index = ((sample*T + t)*C + c)
} mt_dropout;

static inline int mt__dropout_keep(const mt_dropout *d, uint64_t global_index) {
    return mt_rand_uniform(d->seed, d->iteration, d->site, 0x0d0d, global_index) >= d->p;
}
// in place: x (B,T,C) -> x * mask / (1-p)
void mt_dropout_forward_cpu(float *x, const mt_dropout *d, int B) {
    if (d->p <= 0.0f) return;
    float scale = 1.0f / (1.0f - d->p);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < d->T; t++)
            for (int c = 0; c < d->C; c++) {
                uint64_t g = ((uint64_t)(d->sample_offset + b) * d->T + t) * d->C + c;
                size_t i = ((size_t)b * d->T + t) * d->C + c;
                x[i] = mt__dropout_keep(d, g) ? x[i] * scale : 0.0f;
            }
}
// in the forward pass this was: y = x * mask / (1-p); so dx = dy * mask / (1-p), in place on dy
void mt_dropout_backward_cpu(float *dx, const mt_dropout *d, int B) { mt_dropout_forward_cpu(dx, d, B); }

// ---------------------------------------------------------------------------------------------
// causal self-attention, NH_local heads of size hs
// writes out and att with '='. qkv is (B,T,3*C_local) = [Q | K | V], each (B,T,C_local) with
// head h in columns [h*hs, (h+1)*hs); out is (B,T,C_local); att (B,NH_local,T,T) keeps the
// softmax probabilities (before dropout) for the backward pass.
//   s[t,t2] = q_t . k_t2 / sqrt(hs)  for t2 <= t;  p = softmax(s);  out_t = sum_t2 p'[t,t2] v_t2
// where p' = dropout(p). `drop` has T, C unused here; head_offset/NH_global place the local heads
// in the global (B, NH, T, T) tensor so masks do not depend on TP.
void mt_attention_forward_cpu(float *out, float *att, const float *qkv, int B, int T, int C_local, int NH_local,
                              const mt_dropout *drop, int head_offset, int NH_global) {
    int hs = C_local / NH_local;
    int C3 = 3 * C_local;
    float scale = 1.0f / sqrtf((float)hs);
    float keep_scale = drop->p > 0 ? 1.0f / (1.0f - drop->p) : 1.0f;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH_local; h++)
            for (int t = 0; t < T; t++) {
                const float *q = qkv + ((size_t)b * T + t) * C3 + h * hs;
                float *att_bth = att + (((size_t)b * NH_local + h) * T + t) * T;
                // pass 1: scores and their max (for a stable softmax)
                float maxval = -INFINITY;
                for (int t2 = 0; t2 <= t; t2++) {
                    const float *k = qkv + ((size_t)b * T + t2) * C3 + C_local + h * hs;
                    float s = 0.0f;
                    for (int i = 0; i < hs; i++) s += q[i] * k[i];
                    s *= scale;
                    att_bth[t2] = s;
                    if (s > maxval) maxval = s;
                }
                // pass 2: exponentials and their sum
                float sum = 0.0f;
                for (int t2 = 0; t2 <= t; t2++) {
                    float e = expf(att_bth[t2] - maxval);
                    att_bth[t2] = e;
                    sum += e;
                }
                float inv = 1.0f / sum;
                for (int t2 = 0; t2 < T; t2++) att_bth[t2] = t2 <= t ? att_bth[t2] * inv : 0.0f;
                // pass 3: weighted sum of values, with the (dropped-out) probabilities
                float *o = out + ((size_t)b * T + t) * C_local + h * hs;
                for (int i = 0; i < hs; i++) o[i] = 0.0f;
                uint64_t row = (((uint64_t)(drop->sample_offset + b) * NH_global + head_offset + h) * T + t) * T;
                for (int t2 = 0; t2 <= t; t2++) {
                    float p = att_bth[t2];
                    if (drop->p > 0) p = mt__dropout_keep(drop, row + t2) ? p * keep_scale : 0.0f;
                    const float *v = qkv + ((size_t)b * T + t2) * C3 + 2 * C_local + h * hs;
                    for (int i = 0; i < hs; i++) o[i] += p * v[i];
                }
            }
}
// in the forward pass this was: out_t = sum_t2 p'[t,t2] v_t2, p' = dropout(p), p = softmax(s), s = q.k/sqrt(hs)
// so now: dv_t2 += p'[t,t2] dout_t;  dp'[t,t2] = dout_t . v_t2;  dp = dp' * mask/(1-p_drop);
//         ds[t,t2] = p[t,t2] (dp[t,t2] - sum_t3 p[t,t3] dp[t,t3])   (softmax backward)
//         dq_t += sum_t2 ds[t,t2] k_t2 / sqrt(hs);  dk_t2 += ds[t,t2] q_t / sqrt(hs)
// dqkv is (B,T,3*C_local); dp_row is scratch of T floats.
void mt_attention_backward_cpu(float *dqkv, const float *dout, const float *qkv, const float *att, int B, int T,
                               int C_local, int NH_local, const mt_dropout *drop, int head_offset, int NH_global,
                               float *dp_row) {
    int hs = C_local / NH_local;
    int C3 = 3 * C_local;
    float scale = 1.0f / sqrtf((float)hs);
    float keep_scale = drop->p > 0 ? 1.0f / (1.0f - drop->p) : 1.0f;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH_local; h++)
            for (int t = 0; t < T; t++) {
                const float *att_bth = att + (((size_t)b * NH_local + h) * T + t) * T;
                const float *dout_t = dout + ((size_t)b * T + t) * C_local + h * hs;
                const float *q = qkv + ((size_t)b * T + t) * C3 + h * hs;
                float *dq = dqkv + ((size_t)b * T + t) * C3 + h * hs;
                uint64_t row = (((uint64_t)(drop->sample_offset + b) * NH_global + head_offset + h) * T + t) * T;
                // backward through the value sum and the dropout
                for (int t2 = 0; t2 <= t; t2++) {
                    const float *v = qkv + ((size_t)b * T + t2) * C3 + 2 * C_local + h * hs;
                    float *dv = dqkv + ((size_t)b * T + t2) * C3 + 2 * C_local + h * hs;
                    float mask_scale = 1.0f;
                    if (drop->p > 0) mask_scale = mt__dropout_keep(drop, row + t2) ? keep_scale : 0.0f;
                    float pd = att_bth[t2] * mask_scale;
                    float dpv = 0.0f;
                    for (int i = 0; i < hs; i++) { dv[i] += pd * dout_t[i]; dpv += dout_t[i] * v[i]; }
                    dp_row[t2] = dpv * mask_scale;
                }
                // backward through the softmax
                float dot = 0.0f;
                for (int t2 = 0; t2 <= t; t2++) dot += att_bth[t2] * dp_row[t2];
                for (int t2 = 0; t2 <= t; t2++) {
                    float ds = att_bth[t2] * (dp_row[t2] - dot) * scale;
                    const float *k = qkv + ((size_t)b * T + t2) * C3 + C_local + h * hs;
                    float *dk = dqkv + ((size_t)b * T + t2) * C3 + C_local + h * hs;
                    for (int i = 0; i < hs; i++) { dq[i] += ds * k[i]; dk[i] += ds * q[i]; }
                }
            }
}

// ---------------------------------------------------------------------------------------------
// GELU, tanh approximation (GPT-2's): y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
// writes out with '='. inp/out have N elements.
#define MT_GELU_SCALING_FACTOR 0.7978845608028654f   /* sqrt(2/pi) */
void mt_gelu_forward_cpu(float *out, const float *inp, size_t N) {
    for (size_t i = 0; i < N; i++) {
        float x = inp[i];
        float cube = 0.044715f * x * x * x;
        out[i] = 0.5f * x * (1.0f + tanhf(MT_GELU_SCALING_FACTOR * (x + cube)));
    }
}
// in the forward pass this was: y = 0.5 x (1 + tanh(u)), u = s (x + 0.044715 x^3)
// so dy/dx = 0.5 (1 + tanh(u)) + 0.5 x (1 - tanh(u)^2) s (1 + 3 * 0.044715 x^2)
void mt_gelu_backward_cpu(float *dinp, const float *inp, const float *dout, size_t N) {
    for (size_t i = 0; i < N; i++) {
        float x = inp[i];
        float cube = 0.044715f * x * x * x;
        float u = MT_GELU_SCALING_FACTOR * (x + cube);
        float th = tanhf(u);
        float sech2 = 1.0f - th * th;
        float grad = 0.5f * (1.0f + th) + 0.5f * x * sech2 * MT_GELU_SCALING_FACTOR * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] += grad * dout[i];
    }
}

// ---------------------------------------------------------------------------------------------
// residual: out = a + b   (writes with '='; the backward is a copy of dout to both inputs,
// which the model does by accumulating the same dresidual buffer, as llm.c)
void mt_residual_forward_cpu(float *out, const float *a, const float *b, size_t N) {
    for (size_t i = 0; i < N; i++) out[i] = a[i] + b[i];
}

// ---------------------------------------------------------------------------------------------
// cross-entropy over a vocabulary split across TP ranks (the per-rank half of it;
// §4 mt_vocab_parallel_cross_entropy_* adds the all-reduces).
// logits (BT, V_local) hold this rank's columns [vocab_start, vocab_start + V_local) of the
// full (BT, Vp) logits; columns >= V (the padding) are not part of the softmax.
// step 1 (local): max over my real columns          -> all-reduce MAX -> m
// step 2 (local): sum of exp(l - m) over my columns  -> all-reduce SUM -> S
//         and my logit of the target (0 if not mine) -> all-reduce SUM -> l_y
// loss = log S + m - l_y = -log softmax(l)[y]
// writes out with '=' in every function below.
int mt__real_columns(int vocab_start, int V_local, int V) {
    int n = V - vocab_start;
    return n < 0 ? 0 : (n > V_local ? V_local : n);
}
void mt_cross_entropy_local_max_cpu(float *maxv, const float *logits, int BT, int V_local, int vocab_start, int V) {
    int n = mt__real_columns(vocab_start, V_local, V);
    for (int i = 0; i < BT; i++) {
        const float *l = logits + (size_t)i * V_local;
        float m = -INFINITY;
        for (int v = 0; v < n; v++) if (l[v] > m) m = l[v];
        maxv[i] = m;
    }
}
void mt_cross_entropy_local_sums_cpu(float *sumexp, float *target_logit, const float *logits, const float *maxv,
                                     const int *targets, int BT, int V_local, int vocab_start, int V) {
    int n = mt__real_columns(vocab_start, V_local, V);
    for (int i = 0; i < BT; i++) {
        const float *l = logits + (size_t)i * V_local;
        float s = 0.0f;
        for (int v = 0; v < n; v++) s += expf(l[v] - maxv[i]);
        sumexp[i] = s;
        int local = targets[i] - vocab_start;
        target_logit[i] = (local >= 0 && local < n) ? l[local] : 0.0f;
    }
}
// losses[i] = log S + m - l_y; if dlogits != NULL also the gradient, in place of the logits:
// dlogits[i,v] = (softmax[i,v] - [v == y_i]) * dloss   (0 on padded columns)
void mt_cross_entropy_finish_cpu(float *losses, float *dlogits, const float *maxv, const float *sumexp,
                                 const float *target_logit, const int *targets, int BT, int V_local, int vocab_start,
                                 int V, float dloss) {
    int n = mt__real_columns(vocab_start, V_local, V);
    for (int i = 0; i < BT; i++) {
        losses[i] = logf(sumexp[i]) + maxv[i] - target_logit[i];
        if (!dlogits) continue;
        float *l = dlogits + (size_t)i * V_local;
        float inv = 1.0f / sumexp[i];
        int local = targets[i] - vocab_start;
        for (int v = 0; v < V_local; v++) {
            float p = v < n ? expf(l[v] - maxv[i]) * inv : 0.0f;
            l[v] = (p - (v == local ? 1.0f : 0.0f)) * dloss;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// AdamW (Loshchilov & Hutter; PyTorch's torch.optim.AdamW order of operations):
//   p  = p * (1 - lr * wd)                     decoupled weight decay (wd = 0 for no-decay params)
//   m  = b1 m + (1 - b1) g ;  v = b2 v + (1 - b2) g^2
//   p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
void mt_adamw_cpu(float *param, float *m, float *v, const float *grad, size_t n, float lr, float beta1, float beta2,
                  float eps, float weight_decay, int step) {
    float bc1 = 1.0f - powf(beta1, (float)step), bc2 = 1.0f - powf(beta2, (float)step);
    for (size_t i = 0; i < n; i++) {
        float g = grad[i];
        float p = param[i] * (1.0f - lr * weight_decay);
        float mi = beta1 * m[i] + (1.0f - beta1) * g;
        float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
        m[i] = mi;
        v[i] = vi;
        param[i] = p - lr * (mi / bc1) / (sqrtf(vi / bc2) + eps);
    }
}

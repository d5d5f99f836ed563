// ---------------------------------------------------------------------------------------------
// op dispatch: the model calls mt_<op>(r, ...); the CPU build runs the reference in §3, the
// GPU build (nvcc, train_gpt_cuda) the kernel in kernels.cuh on the rank's stream. The model
// code above the ops is the same in both builds; only these few lines differ.
// Memory follows the build too: on the GPU build every buffer the model touches (parameters,
// gradients, optimizer state, activations, scratch) lives on the rank's device.
#ifdef __CUDACC__
#define MT_STREAM(r) ((cudaStream_t)(r)->stream)
#endif

void mt_embedding_forward(mt_rank *r, float *out, const int *tokens, const float *wte, int B, int T, int C, int vocab_start, int V_local) {
#ifdef __CUDACC__
    mt_embedding_forward_gpu(out, tokens, wte, B, T, C, vocab_start, V_local, MT_STREAM(r));
#else
    (void)r; mt_embedding_forward_cpu(out, tokens, wte, B, T, C, vocab_start, V_local);
#endif
}
void mt_embedding_backward(mt_rank *r, float *dwte, const float *dout, const int *tokens, int B, int T, int C, int vocab_start, int V_local) {
#ifdef __CUDACC__
    mt_embedding_backward_gpu(dwte, dout, tokens, B, T, C, vocab_start, V_local, MT_STREAM(r));
#else
    (void)r; mt_embedding_backward_cpu(dwte, dout, tokens, B, T, C, vocab_start, V_local);
#endif
}
void mt_position_embedding_forward(mt_rank *r, float *out, const float *wpe, int B, int T, int C) {
#ifdef __CUDACC__
    mt_position_embedding_forward_gpu(out, wpe, B, T, C, MT_STREAM(r));
#else
    (void)r; mt_position_embedding_forward_cpu(out, wpe, B, T, C);
#endif
}
void mt_position_embedding_backward(mt_rank *r, float *dwpe, const float *dout, int B, int T, int C) {
#ifdef __CUDACC__
    mt_position_embedding_backward_gpu(dwpe, dout, B, T, C, MT_STREAM(r));
#else
    (void)r; mt_position_embedding_backward_cpu(dwpe, dout, B, T, C);
#endif
}
void mt_layernorm_forward(mt_rank *r, float *out, float *mean, float *rstd, const float *inp, const float *weight, const float *bias, int B, int T, int C) {
#ifdef __CUDACC__
    mt_layernorm_forward_gpu(out, mean, rstd, inp, weight, bias, B, T, C, MT_STREAM(r));
#else
    (void)r; mt_layernorm_forward_cpu(out, mean, rstd, inp, weight, bias, B, T, C);
#endif
}
void mt_layernorm_backward(mt_rank *r, float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                           const float *weight, const float *mean, const float *rstd, int B, int T, int C) {
#ifdef __CUDACC__
    mt_layernorm_backward_gpu(dinp, dweight, dbias, dout, inp, weight, mean, rstd, B, T, C, MT_STREAM(r));
#else
    (void)r; mt_layernorm_backward_cpu(dinp, dweight, dbias, dout, inp, weight, mean, rstd, B, T, C);
#endif
}
void mt_matmul_forward(mt_rank *r, float *out, const float *inp, const float *weight, const float *bias, int BT, int C, int OC) {
#ifdef __CUDACC__
    mt_matmul_forward_gpu(out, inp, weight, bias, BT, C, OC, (mt_gemm_impl)r->gemm_impl, MT_STREAM(r));
#else
    (void)r; mt_matmul_forward_cpu(out, inp, weight, bias, BT, C, OC);
#endif
}
void mt_matmul_backward(mt_rank *r, float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                        const float *weight, int BT, int C, int OC) {
#ifdef __CUDACC__
    mt_matmul_backward_gpu(dinp, dweight, dbias, dout, inp, weight, BT, C, OC, (mt_gemm_impl)r->gemm_impl, MT_STREAM(r));
#else
    (void)r; mt_matmul_backward_cpu(dinp, dweight, dbias, dout, inp, weight, BT, C, OC);
#endif
}
/* out (BT, OC) += bias (OC): the bias of a row-parallel layer, added once after the all-reduce */
void mt_bias_add(mt_rank *r, float *out, const float *bias, int BT, int OC) {
#ifdef __CUDACC__
    mt_bias_add_gpu(out, bias, BT, OC, MT_STREAM(r));
#else
    (void)r;
    for (int i = 0; i < BT; i++)
        for (int o = 0; o < OC; o++) out[(size_t)i * OC + o] += bias[o];
#endif
}
void mt_dropout_forward(mt_rank *r, float *x, const mt_dropout *d, int B) {
    if (d->p <= 0.0f) return;
#ifdef __CUDACC__
    mt_dropout_forward_gpu(x, d, B, MT_STREAM(r));
#else
    (void)r; mt_dropout_forward_cpu(x, d, B);
#endif
}
void mt_dropout_backward(mt_rank *r, float *dx, const mt_dropout *d, int B) { mt_dropout_forward(r, dx, d, B); }
// the GPU kernel keeps the logsumexp of each score row (B,NH_local,T) in `att` instead of the
// (B,NH_local,T,T) probabilities, and the backward recomputes them (FlashAttention)
void mt_attention_forward(mt_rank *r, float *out, float *att, const float *qkv, int B, int T, int C_local, int NH_local,
                          const mt_dropout *drop, int head_offset, int NH_global) {
#ifdef __CUDACC__
    mt_attention_forward_gpu(out, att, qkv, B, T, C_local, NH_local, drop, head_offset, NH_global, r->bf16, MT_STREAM(r));
#else
    (void)r; mt_attention_forward_cpu(out, att, qkv, B, T, C_local, NH_local, drop, head_offset, NH_global);
#endif
}
void mt_attention_backward(mt_rank *r, float *dqkv, const float *dout, const float *qkv, const float *out, const float *att,
                           int B, int T, int C_local, int NH_local, const mt_dropout *drop, int head_offset, int NH_global,
                           float *dp_row) {
#ifdef __CUDACC__
    (void)dp_row;
    mt_attention_backward_gpu(dqkv, dout, qkv, out, att, B, T, C_local, NH_local, drop, head_offset, NH_global, r->bf16, MT_STREAM(r));
#else
    (void)r; (void)out;
    mt_attention_backward_cpu(dqkv, dout, qkv, att, B, T, C_local, NH_local, drop, head_offset, NH_global, dp_row);
#endif
}
void mt_gelu_forward(mt_rank *r, float *out, const float *inp, size_t N) {
#ifdef __CUDACC__
    mt_gelu_forward_gpu(out, inp, N, MT_STREAM(r));
#else
    (void)r; mt_gelu_forward_cpu(out, inp, N);
#endif
}
void mt_gelu_backward(mt_rank *r, float *dinp, const float *inp, const float *dout, size_t N) {
#ifdef __CUDACC__
    mt_gelu_backward_gpu(dinp, inp, dout, N, MT_STREAM(r));
#else
    (void)r; mt_gelu_backward_cpu(dinp, inp, dout, N);
#endif
}
void mt_residual_forward(mt_rank *r, float *out, const float *a, const float *b, size_t N) {
#ifdef __CUDACC__
    mt_residual_forward_gpu(out, a, b, N, MT_STREAM(r));
#else
    (void)r; mt_residual_forward_cpu(out, a, b, N);
#endif
}
void mt_cross_entropy_local_max(mt_rank *r, float *maxv, const float *logits, int BT, int V_local, int vocab_start, int V) {
#ifdef __CUDACC__
    mt_cross_entropy_local_max_gpu(maxv, logits, BT, V_local, vocab_start, V, MT_STREAM(r));
#else
    (void)r; mt_cross_entropy_local_max_cpu(maxv, logits, BT, V_local, vocab_start, V);
#endif
}
void mt_cross_entropy_local_sums(mt_rank *r, float *sumexp, float *target_logit, const float *logits, const float *maxv,
                                 const int *targets, int BT, int V_local, int vocab_start, int V) {
#ifdef __CUDACC__
    mt_cross_entropy_local_sums_gpu(sumexp, target_logit, logits, maxv, targets, BT, V_local, vocab_start, V, MT_STREAM(r));
#else
    (void)r; mt_cross_entropy_local_sums_cpu(sumexp, target_logit, logits, maxv, targets, BT, V_local, vocab_start, V);
#endif
}
void mt_cross_entropy_finish(mt_rank *r, float *losses, float *dlogits, const float *maxv, const float *sumexp,
                             const float *target_logit, const int *targets, int BT, int V_local, int vocab_start, int V, float dloss) {
#ifdef __CUDACC__
    mt_cross_entropy_finish_gpu(losses, dlogits, maxv, sumexp, target_logit, targets, BT, V_local, vocab_start, V, dloss, MT_STREAM(r));
#else
    (void)r; mt_cross_entropy_finish_cpu(losses, dlogits, maxv, sumexp, target_logit, targets, BT, V_local, vocab_start, V, dloss);
#endif
}
void mt_adamw(mt_rank *r, float *param, float *m, float *v, const float *grad, size_t n, float lr, float beta1, float beta2,
              float eps, float weight_decay, int step) {
#ifdef __CUDACC__
    mt_adamw_gpu(param, m, v, grad, n, lr, beta1, beta2, eps, weight_decay, step, MT_STREAM(r));
#else
    (void)r; mt_adamw_cpu(param, m, v, grad, n, lr, beta1, beta2, eps, weight_decay, step);
#endif
}

// ---------------------------------------------------------------------------------------------
// buffers: host memory on the CPU build, the rank's device memory on the GPU build
float *mt_buffer_alloc(mt_rank *r, size_t n, const char *what) {
#ifdef __CUDACC__
    (void)r;
    float *p = NULL;
    cudaError_t err = cudaMalloc((void **)&p, (n ? n : 1) * sizeof(float));
    if (err != cudaSuccess)
        mt_fatal("out of GPU memory allocating %.1f MB for %s on rank %d (%s)\nhint: use a smaller --micro-batch-size or --seq-length, or more tensor/pipeline parallelism",
                 (double)n * 4 / 1e6, what, r->ps.rank, cudaGetErrorString(err));
    MT_CUDA_CHECK(cudaMemset(p, 0, (n ? n : 1) * sizeof(float)));
    return p;
#else
    (void)r;
    return (float *)mt_calloc(n ? n : 1, sizeof(float), what);
#endif
}
void mt_buffer_free(float *p) {
#ifdef __CUDACC__
    if (p) MT_CUDA_CHECK(cudaFree(p));
#else
    free(p);
#endif
}
void mt_buffer_zero(mt_rank *r, float *p, size_t n) {
#ifdef __CUDACC__
    MT_CUDA_CHECK(cudaMemsetAsync(p, 0, n * sizeof(float), MT_STREAM(r)));
#else
    (void)r; memset(p, 0, n * sizeof(float));
#endif
}
void mt_buffer_copy(mt_rank *r, float *dst, const float *src, size_t n) {
#ifdef __CUDACC__
    MT_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, MT_STREAM(r)));
#else
    (void)r; memcpy(dst, src, n * sizeof(float));
#endif
}
/* host <-> buffer (bytes); synchronous, for small things: token ids, losses, norms */
void mt_buffer_upload(mt_rank *r, void *dst, const void *host_src, size_t bytes) {
#ifdef __CUDACC__
    MT_CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, MT_STREAM(r)));
    MT_CUDA_CHECK(cudaStreamSynchronize(MT_STREAM(r)));
#else
    (void)r; memcpy(dst, host_src, bytes);
#endif
}
void mt_buffer_download(mt_rank *r, void *host_dst, const void *src, size_t bytes) {
#ifdef __CUDACC__
    MT_CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, MT_STREAM(r)));
    MT_CUDA_CHECK(cudaStreamSynchronize(MT_STREAM(r)));
#else
    (void)r; memcpy(host_dst, src, bytes);
#endif
}
/* x *= s over n elements (gradient clipping) */
void mt_buffer_scale(mt_rank *r, float *x, float s, size_t n) {
#ifdef __CUDACC__
    mt_scale_gpu(x, s, n, MT_STREAM(r));
#else
    (void)r; for (size_t k = 0; k < n; k++) x[k] *= s;
#endif
}
/* sum of squares of n floats, accumulated in double (the gradient norm) */
double mt_buffer_sum_squares(mt_rank *r, const float *x, size_t n) {
#ifdef __CUDACC__
    return mt_sum_squares_gpu(x, n, MT_STREAM(r));
#else
    (void)r;
    double s = 0.0;
    for (size_t k = 0; k < n; k++) s += (double)x[k] * (double)x[k];
    return s;
#endif
}

// =============================================================================================
// 6. OPTIMIZER, CLIPPING, LEARNING RATE
// =============================================================================================
// Mirrors megatron/core/optimizer (clip_grads.py) and optimizer_param_scheduler.py.

// Megatron's OptimizerParamScheduler.get_lr, with steps counted in iterations:
//   warm-up:  lr = max_lr * step / warmup_steps                     for step <= warmup_steps
//   then      ratio = (step - warmup) / (decay_steps - warmup)
//             constant: max_lr;  linear: min + (max - min)(1 - ratio);
//             cosine:   min + (max - min) * 0.5 (cos(pi * ratio) + 1)
//   after decay_steps: min_lr.
// Iteration i (1-based) trains with lr(i - 1); Megatron logs the value after its scheduler
// stepped, lr(i), and so do we.
float mt_learning_rate(const mt_config *cfg, int step) {
    double max_lr = cfg->train.lr, min_lr = cfg->train.min_lr;
    double warmup = cfg->lr_warmup_steps;
    int decay = cfg->lr_decay_steps;
    if (warmup > 0 && step <= warmup) return (float)(max_lr * (double)step / warmup);
    if (strcmp(cfg->train.lr_decay_style, "constant") == 0) return (float)max_lr;
    if (step > decay) return (float)min_lr;
    double ratio = ((double)step - warmup) / ((double)decay - warmup);
    double coeff = strcmp(cfg->train.lr_decay_style, "linear") == 0 ? 1.0 - ratio : 0.5 * (cos(3.141592653589793 * ratio) + 1.0);
    return (float)(min_lr + coeff * (max_lr - min_lr));
}

// The global gradient norm, counting every parameter of the model exactly once:
//   - TP-replicated tensors (layernorms, row-parallel biases, wpe) only on tp_rank 0,
//   - the LM head's copy of wte on the last stage (PP > 1) not at all (the first stage's counts),
// then summed over the model-parallel group (all TP and PP ranks of my replica). DP replicas
// hold the same gradients after the all-reduce, so they all compute the same norm.
static double mt__grad_norm(mt_rank *r) {
    double sumsq = 0.0;
    for (int i = 0; i < MT_NUM_PARAM_TENSORS; i++) {
        const mt_param_spec *s = &r->specs[i];
        if (!s->present) continue;
        if (s->tp_replicated && r->ps.tp_rank != 0) continue;
        if (strcmp(s->name, "wte") == 0 && r->ps.pp_size > 1 && !r->ps.is_first_stage) continue;
        sumsq += mt_buffer_sum_squares(r, r->grads_memory + s->offset, mt__spec_numel(s));
    }
    if (r->mp.size > 1) mt_all_reduce_double(&r->mp, &sumsq, 1, MT_SUM);
    return sqrt(sumsq);
}

// =============================================================================================
// 7. DATA PARALLEL
// =============================================================================================
// Mirrors megatron/core/distributed/distributed_data_parallel.py (without overlap): after the
// last micro-batch's backward, the gradient buffer is all-reduced over the DP group bucket by
// bucket (--ddp-bucket-size elements each). The loss gradient was already scaled by 1/DP, so
// the sum is the mean over replicas. Then the embedding group (first and last stage, PP > 1)
// sums its two copies of dwte, so the tied weights stay tied (Megatron's
// _allreduce_embedding_grads).
static void mt__finish_grad_sync(mt_rank *r) {
    if (r->ps.dp_size > 1) {
        size_t bucket = r->cfg->parallel.ddp_bucket_size > 0 ? (size_t)r->cfg->parallel.ddp_bucket_size : r->num_params;
        for (size_t off = 0; off < r->num_params; off += bucket) {
            size_t n = r->num_params - off < bucket ? r->num_params - off : bucket;
            mt_all_reduce(&r->dp, r->grads_memory + off, n, MT_SUM);
        }
    }
    if (r->ps.in_embedding_group) {
        const mt_param_spec *s = &r->specs[0];   // wte
        mt_all_reduce(&r->embd, r->grads_memory + s->offset, mt__spec_numel(s), MT_SUM);
    }
}

// =============================================================================================
// 8. PIPELINE SCHEDULES & TRAIN STEP
// =============================================================================================
// Mirrors megatron/core/pipeline_parallel/schedules.py. A schedule is written here as the list
// of steps one stage performs, in order: F(mb, chunk) or B(mb, chunk). One executor runs any
// list: a forward first receives its input from the previous (virtual) stage unless it is the
// very first, and sends its output on unless it is the very last; a backward receives the
// output gradient from the next stage and sends its input gradient back. Sends are buffered
// (CPU threads backend), so any list whose steps respect the data dependencies runs without
// deadlock; the schedule decides only *when* each stage does what, i.e. the bubble and how
// many micro-batches' activations are alive at once.

typedef struct { char kind; int mb; int chunk; } mt_sched_step;   // kind 'F' or 'B'

static int mt__push(mt_sched_step *out, int n, char kind, int mb, int chunk) {
    out[n].kind = kind;
    out[n].mb = mb;
    out[n].chunk = chunk;
    return n + 1;
}

// no pipelining (forward_backward_no_pipelining): F0 B0 F1 B1 ... gradient accumulation
int mt_schedule_no_pipelining(int m, mt_sched_step *out) {
    int n = 0;
    for (int i = 0; i < m; i++) { n = mt__push(out, n, 'F', i, 0); n = mt__push(out, n, 'B', i, 0); }
    return n;
}
// all forward, all backward (GPipe): the simplest pipeline schedule; every micro-batch's
// activations are alive at once. Kept as the baseline the 1F1B schedule improves on.
int mt_schedule_afab(int m, mt_sched_step *out) {
    int n = 0;
    for (int i = 0; i < m; i++) n = mt__push(out, n, 'F', i, 0);
    for (int i = 0; i < m; i++) n = mt__push(out, n, 'B', i, 0);
    return n;
}
// 1F1B (forward_backward_pipelining_without_interleaving; PipeDream-Flush, Narayanan et al. 2021)
// pp=4, m=6, F and B one slot each (really B takes about 2F); blanks are the bubble:
//
// stage 0 |F0 F1 F2 F3          B0 F4 B1 F5 B2    B3    B4    B5
// stage 1 |   F0 F1 F2       B0 F3 B1 F4 B2 F5 B3    B4    B5
// stage 2 |      F0 F1    B0 F2 B1 F3 B2 F4 B3 F5 B4    B5
// stage 3 |         F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5
//          warmup: stage s runs pp-s-1 forwards | steady: 1F then 1B | cooldown: the remaining B's
//
// A stage holds at most pp - s micro-batches' activations (AFAB: all m). The bubble is
// (p-1)/(m+p-1) of the time in both.
int mt_schedule_1f1b(int m, int pp_size, int pp_rank, mt_sched_step *out) {
    int n = 0;
    int num_warmup = pp_size - pp_rank - 1;
    if (num_warmup > m) num_warmup = m;
    int num_steady = m - num_warmup;
    // warmup
    for (int i = 0; i < num_warmup; i++) n = mt__push(out, n, 'F', i, 0);
    // steady 1F1B
    for (int i = 0; i < num_steady; i++) {
        n = mt__push(out, n, 'F', num_warmup + i, 0);
        n = mt__push(out, n, 'B', i, 0);
    }
    // cooldown
    for (int i = num_steady; i < m; i++) n = mt__push(out, n, 'B', i, 0);
    return n;
}
// interleaved 1F1B (forward_backward_pipelining_with_interleaving; Narayanan et al. 2021, sec 2.2)
// Each stage holds vp model chunks; micro-batches go through chunk 0 of every stage, then chunk 1
// of every stage, ... Forward step k of a stage works on chunk (k / pp) % vp of micro-batch
// (k / (pp*vp)) * pp + k % pp: groups of pp micro-batches per chunk. The bubble shrinks by vp.
static int mt__interleaved_chunk(int k, int pp, int vp, int forward) {
    int c = (k / pp) % vp;
    return forward ? c : vp - 1 - c;
}
static int mt__interleaved_mb(int k, int pp, int vp) { return (k / (pp * vp)) * pp + k % pp; }
int mt_schedule_1f1b_interleaved(int m, int pp_size, int pp_rank, int vp, mt_sched_step *out) {
    int n = 0, total = m * vp;
    int num_warmup;
    if (m == pp_size) num_warmup = total;   // Megatron: all forwards first when m == pp
    else {
        num_warmup = (pp_size - pp_rank - 1) * 2 + (vp - 1) * pp_size;
        if (num_warmup > total) num_warmup = total;
    }
    int num_steady = total - num_warmup;
    // warmup
    for (int k = 0; k < num_warmup; k++)
        n = mt__push(out, n, 'F', mt__interleaved_mb(k, pp_size, vp), mt__interleaved_chunk(k, pp_size, vp, 1));
    // steady 1F1B
    for (int k = 0; k < num_steady; k++) {
        int kf = num_warmup + k;
        n = mt__push(out, n, 'F', mt__interleaved_mb(kf, pp_size, vp), mt__interleaved_chunk(kf, pp_size, vp, 1));
        n = mt__push(out, n, 'B', mt__interleaved_mb(k, pp_size, vp), mt__interleaved_chunk(k, pp_size, vp, 0));
    }
    // cooldown
    for (int k = num_steady; k < total; k++)
        n = mt__push(out, n, 'B', mt__interleaved_mb(k, pp_size, vp), mt__interleaved_chunk(k, pp_size, vp, 0));
    return n;
}
// forward only (evaluation): each micro-batch through every chunk in turn
int mt_schedule_forward_only(int m, int vp, mt_sched_step *out) {
    int n = 0;
    for (int i = 0; i < m; i++)
        for (int c = 0; c < vp; c++) n = mt__push(out, n, 'F', i, c);
    return n;
}
/* the schedule a stage runs in a training step, chosen as Megatron's get_forward_backward_func */
int mt_schedule_for(const mt_config *cfg, int pp_rank, mt_sched_step *out) {
    int m = cfg->num_microbatches, pp = cfg->parallel.pipeline_model_parallel_size;
    if (pp == 1) return mt_schedule_no_pipelining(m, out);
    if (cfg->virtual_pipeline_size > 1) return mt_schedule_1f1b_interleaved(m, pp, pp_rank, cfg->virtual_pipeline_size, out);
    return mt_schedule_1f1b(m, pp, pp_rank, out);
}

// The pipeline as a time line: every stage runs its list; a step may start once its input
// has arrived (the producing step finished) and the stage is free. F takes f_cost slots and
// B takes b_cost. Fills start[stage][i] and returns the makespan. Used by --print-schedule,
// by the tests (every schedule finishes: no deadlock) and to size the activation slots.
// Returns -1 if the lists deadlock.
int mt_schedule_simulate(const mt_config *cfg, int f_cost, int b_cost, int **start_out, int *count_out) {
    int pp = cfg->parallel.pipeline_model_parallel_size, vp = cfg->virtual_pipeline_size, m = cfg->num_microbatches;
    int max_steps = 2 * m * vp;
    mt_sched_step *lists = (mt_sched_step *)mt_malloc(sizeof(mt_sched_step) * (size_t)max_steps * pp, "schedule");
    int *done_f = (int *)mt_malloc(sizeof(int) * (size_t)pp * vp * m, "schedule");  // finish time of F(stage, chunk, mb), -1 = not yet
    int *done_b = (int *)mt_malloc(sizeof(int) * (size_t)pp * vp * m, "schedule");
    for (int i = 0; i < pp * vp * m; i++) done_f[i] = done_b[i] = -1;
    int *pos = (int *)mt_calloc((size_t)pp, sizeof(int), "schedule");
    int *clock_ = (int *)mt_calloc((size_t)pp, sizeof(int), "schedule");
    for (int s = 0; s < pp; s++) count_out[s] = mt_schedule_for(cfg, s, lists + (size_t)s * max_steps);
    int makespan = 0, progress = 1;
    while (progress) {
        progress = 0;
        for (int s = 0; s < pp; s++) {
            while (pos[s] < count_out[s]) {
                mt_sched_step st = lists[(size_t)s * max_steps + pos[s]];
                int ready = 0;
                if (st.kind == 'F') {
                    int first = s == 0 && st.chunk == 0;
                    int ps = s > 0 ? s - 1 : pp - 1, pc = s > 0 ? st.chunk : st.chunk - 1;
                    ready = first ? 0 : done_f[(ps * vp + pc) * m + st.mb];
                } else {
                    int last = s == pp - 1 && st.chunk == vp - 1;
                    int ns = s < pp - 1 ? s + 1 : 0, nc = s < pp - 1 ? st.chunk : st.chunk + 1;
                    ready = last ? done_f[(s * vp + st.chunk) * m + st.mb] : done_b[(ns * vp + nc) * m + st.mb];
                }
                if (ready < 0) break;   // waits on another stage
                int t0 = ready > clock_[s] ? ready : clock_[s];
                start_out[s][pos[s]] = t0;
                int t1 = t0 + (st.kind == 'F' ? f_cost : b_cost);
                if (st.kind == 'F') done_f[(s * vp + st.chunk) * m + st.mb] = t1;
                else done_b[(s * vp + st.chunk) * m + st.mb] = t1;
                clock_[s] = t1;
                if (t1 > makespan) makespan = t1;
                pos[s]++;
                progress = 1;
            }
        }
    }
    int finished = 1;
    for (int s = 0; s < pp; s++) if (pos[s] < count_out[s]) finished = 0;
    free(lists); free(done_f); free(done_b); free(pos); free(clock_);
    return finished ? makespan : -1;
}

// --print-schedule: each stage's time line (F and B one slot each, as the picture above),
// then the same with B = 2F, the bubble fraction (p-1)/(m+p-1) and the idle share it gives.
void mt_print_schedule(const mt_config *cfg, FILE *f) {
    int pp = cfg->parallel.pipeline_model_parallel_size, vp = cfg->virtual_pipeline_size, m = cfg->num_microbatches;
    int max_steps = 2 * m * vp;
    int **start = (int **)mt_malloc(sizeof(int *) * (size_t)pp, "schedule");
    for (int s = 0; s < pp; s++) start[s] = (int *)mt_malloc(sizeof(int) * (size_t)max_steps, "schedule");
    int *count = (int *)mt_malloc(sizeof(int) * (size_t)pp, "schedule");
    mt_sched_step *list = (mt_sched_step *)mt_malloc(sizeof(mt_sched_step) * (size_t)max_steps, "schedule");
    const char *name = pp == 1 ? "no pipelining" : vp > 1 ? "interleaved 1F1B" : "1F1B";
    fprintf(f, "schedule: %s, PP=%d, %d micro-batches%s", name, pp, m, vp > 1 ? "" : "\n");
    if (vp > 1) fprintf(f, ", %d chunks per stage (F3.1 = micro-batch 3, chunk 1)\n", vp);
    for (int pass = 0; pass < 2; pass++) {
        int fc = 1, bc = pass == 0 ? 1 : 2;
        int makespan = mt_schedule_simulate(cfg, fc, bc, start, count);
        if (makespan < 0) { fprintf(f, "the schedule deadlocks\n"); break; }
        fprintf(f, "\n%s:\n", pass == 0 ? "time line, F and B one slot each" : "time line with B = 2F (closer to real)");
        int busy_total = 0;
        for (int s = 0; s < pp; s++) {
            int n = mt_schedule_for(cfg, s, list);
            int cell = vp > 1 ? 6 : 3;
            char *line = (char *)mt_malloc((size_t)makespan * cell + 1, "schedule");
            memset(line, ' ', (size_t)makespan * cell);
            line[makespan * cell] = 0;
            int busy = 0;
            for (int i = 0; i < n; i++) {
                char label[16];
                if (vp > 1) snprintf(label, sizeof label, "%c%d.%d", list[i].kind, list[i].mb, list[i].chunk);
                else snprintf(label, sizeof label, "%c%d", list[i].kind, list[i].mb);
                int len = (int)strlen(label);
                int cost = list[i].kind == 'F' ? fc : bc;
                busy += cost;
                memcpy(line + (size_t)start[s][i] * cell, label, (size_t)(len < cell * cost ? len : cell * cost));
            }
            size_t e = strlen(line);
            while (e > 0 && line[e - 1] == ' ') line[--e] = 0;
            fprintf(f, "stage %d |%s\n", s, line);
            busy_total += busy;
            free(line);
        }
        double idle = 1.0 - (double)busy_total / ((double)makespan * pp);
        if (pass == 1) {
            double bubble = (double)(pp - 1) / (double)(m * vp + pp - 1) * (vp > 1 ? 1.0 : 1.0);
            if (vp > 1) bubble = (double)(pp - 1) / (double)vp / ((double)m + (double)(pp - 1) / vp);
            fprintf(f, "bubble: (p-1)/(m+p-1)%s = %.3f of the time; idle share of this time line: %.3f\n",
                    vp > 1 ? " with (p-1)/v for the interleaved schedule" : "", bubble, idle);
        }
    }
    for (int s = 0; s < pp; s++) free(start[s]);
    free(start); free(count); free(list);
}

// ---------------------------------------------------------------------------------------------
// point-to-point: activations forward, gradients backward (megatron's p2p_communication.py)
// A message is tagged with (kind, micro-batch, receiving chunk) so messages between the same
// two stages can never be confused (with PP=2 and interleaving, stage 1 sends stage 0 both
// activations, wrapping around to the next chunk, and gradients).
static int mt__p2p_tag(int kind, int mb, int chunk) { return (kind * 65536 + mb) * 64 + chunk; }

// The GPU build passes pipeline messages through host memory for now (device -> host, the
// threads mailbox, host -> device): correct and simple; NCCL send/recv is the faster way.
static void mt__recv(mt_rank *r, float *buf, size_t n, int peer_stage, int tag) {
    double t0 = mt_time_seconds();
#ifdef __CUDACC__
    mt_recv(&r->pp, r->host_p2p, n, peer_stage, tag);
    r->idle_seconds += mt_time_seconds() - t0;
    mt_buffer_upload(r, buf, r->host_p2p, n * sizeof(float));
#else
    mt_recv(&r->pp, buf, n, peer_stage, tag);
    r->idle_seconds += mt_time_seconds() - t0;
#endif
}
static void mt__send(mt_rank *r, const float *buf, size_t n, int peer_stage, int tag) {
#ifdef __CUDACC__
    mt_buffer_download(r, r->host_p2p, buf, n * sizeof(float));
    mt_send(&r->pp, r->host_p2p, n, peer_stage, tag);
#else
    mt_send(&r->pp, buf, n, peer_stage, tag);
#endif
}

static mt_activations *mt__slot_for(mt_rank *r, int mb, int create) {
    for (int i = 0; i < r->num_slots; i++) if (r->slots[i].mb == mb) return &r->slots[i];
    if (!create) mt_fatal("internal: no activations for micro-batch %d on rank %d", mb, r->ps.rank);
    for (int i = 0; i < r->num_slots; i++)
        if (r->slots[i].mb < 0) { r->slots[i].mb = mb; return &r->slots[i]; }
    mt_fatal("internal: all %d activation slots are in use on rank %d", r->num_slots, r->ps.rank);
    return NULL;
}

// run one step of a schedule
static void mt__run_step(mt_rank *r, mt_sched_step st, mt_batch_fn batch, void *ctx, int last_forward_releases) {
    int pp = r->ps.pp_size, s = r->ps.pp_rank, vp = r->ps.vp_size;
    size_t BTC = (size_t)r->B * r->T * r->C;
    if (st.kind == 'F') {
        int first_on_rank = st.chunk == 0;
        mt_activations *a = mt__slot_for(r, st.mb, first_on_rank);
        if (first_on_rank) {
            a->sample_offset = st.mb * r->B * r->ps.dp_size + r->ps.dp_rank * r->B;
            batch(r, ctx, r->iteration, st.mb, r->host_tokens, r->host_targets);
            size_t bytes = (size_t)r->B * r->T * sizeof(int);
            mt_buffer_upload(r, a->tokens, r->host_tokens, bytes);
            mt_buffer_upload(r, a->targets, r->host_targets, bytes);
        }
        if (!mt__is_first_virtual(r, st.chunk))   // receive from the previous virtual stage
            mt__recv(r, mt__chunk_input(r, a, st.chunk), BTC, s > 0 ? s - 1 : pp - 1, mt__p2p_tag(0, st.mb, st.chunk));
        mt__forward_chunk(r, a, st.chunk);
        if (!mt__is_last_virtual(r, st.chunk)) {    // send to the next virtual stage
            int next_chunk = s < pp - 1 ? st.chunk : st.chunk + 1;
            mt__send(r, mt__chunk_output(r, a, st.chunk), BTC, s < pp - 1 ? s + 1 : 0, mt__p2p_tag(0, st.mb, next_chunk));
        }
        if (last_forward_releases && st.chunk == vp - 1) a->mb = -1;
    } else {
        mt_activations *a = mt__slot_for(r, st.mb, 0);
        if (!mt__is_last_virtual(r, st.chunk))
            mt__recv(r, r->scratch.dresidual, BTC, s < pp - 1 ? s + 1 : 0, mt__p2p_tag(1, st.mb, st.chunk));
        mt__backward_chunk(r, a, st.chunk);
        if (!mt__is_first_virtual(r, st.chunk)) {
            int prev_chunk = s > 0 ? st.chunk : st.chunk - 1;
            mt__send(r, r->scratch.dresidual, BTC, s > 0 ? s - 1 : pp - 1, mt__p2p_tag(1, st.mb, prev_chunk));
        }
        if (st.chunk == 0) a->mb = -1;   // this micro-batch is done on this rank
    }
}

// the mean loss of the global batch, known on every rank: the last stage's sum over its
// micro-batches, averaged over DP, then shared along the pipeline
static float mt__batch_loss(mt_rank *r) {
    double loss = r->ps.is_last_stage ? r->loss_sum / (double)r->cfg->num_microbatches : 0.0;
    if (r->ps.dp_size > 1) mt_all_reduce_double(&r->dp, &loss, 1, MT_SUM);
    loss /= (double)r->ps.dp_size;
    if (r->ps.pp_size > 1) mt_all_reduce_double(&r->pp, &loss, 1, MT_SUM);
    return (float)loss;
}

mt_step_result mt_train_step(mt_rank *r, mt_batch_fn batch, void *ctx, int iteration) {
    const mt_config *cfg = r->cfg;
    mt_step_result res;
    memset(&res, 0, sizeof res);
    r->iteration = iteration;
    r->training = 1;
    r->loss_sum = 0.0;
    r->idle_seconds = 0.0;
    mt_buffer_zero(r, r->grads_memory, r->num_params);
    // 1. forward and backward of every micro-batch, in the order of the schedule
    mt_sched_step *list = (mt_sched_step *)mt_malloc(sizeof(mt_sched_step) * 2 * (size_t)cfg->num_microbatches * r->ps.vp_size, "schedule");
    int n = mt_schedule_for(cfg, r->ps.pp_rank, list);
    for (int i = 0; i < n; i++) mt__run_step(r, list[i], batch, ctx, 0);
    free(list);
    // 2. gradients: all-reduce over DP, tie the embedding copies
    mt__finish_grad_sync(r);
    res.loss = mt__batch_loss(r);
    // 3. clip by the global norm (Megatron's clip_grad_norm_fp32)
    double norm = mt__grad_norm(r);
    res.grad_norm = (float)norm;
    if (!isfinite(norm)) {
        res.skipped = 1;   // inf/nan somewhere: skip the update, as Megatron does
    } else {
        if (cfg->train.clip_grad > 0) {
            double coeff = cfg->train.clip_grad / (norm + 1e-6);
            if (coeff < 1.0) mt_buffer_scale(r, r->grads_memory, (float)coeff, r->num_params);
        }
        // 4. AdamW, tensor by tensor (weight decay only where Megatron applies it)
        r->step++;
        float lr = mt_learning_rate(cfg, iteration - 1);
        for (int i = 0; i < MT_NUM_PARAM_TENSORS; i++) {
            const mt_param_spec *s = &r->specs[i];
            if (!s->present) continue;
            mt_adamw(r, r->params_memory + s->offset, r->m_memory + s->offset, r->v_memory + s->offset,
                     r->grads_memory + s->offset, mt__spec_numel(s), lr, cfg->train.adam_beta1, cfg->train.adam_beta2,
                     cfg->train.adam_eps, s->no_decay ? 0.0f : cfg->train.weight_decay, r->step);
        }
    }
    res.lr = mt_learning_rate(cfg, iteration);
    res.idle_seconds = r->idle_seconds;
    return res;
}

float mt_eval_step(mt_rank *r, mt_batch_fn batch, void *ctx, int iteration) {
    const mt_config *cfg = r->cfg;
    r->iteration = iteration;
    r->training = 0;
    r->loss_sum = 0.0;
    mt_sched_step *list = (mt_sched_step *)mt_malloc(sizeof(mt_sched_step) * (size_t)cfg->num_microbatches * r->ps.vp_size, "schedule");
    int n = mt_schedule_forward_only(cfg->num_microbatches, r->ps.vp_size, list);
    for (int i = 0; i < n; i++) mt__run_step(r, list[i], batch, ctx, 1);
    free(list);
    return mt__batch_loss(r);
}

// ---------------------------------------------------------------------------------------------
// the rank context: communicators, sizes, buffers
// ---------------------------------------------------------------------------------------------
static void mt__comm_named(mt_comm *c, mt_world *w, int rank, const int *members, int n, const char *name) {
    mt_comm_init(c, w, rank, members, n);
    c->name = name;
}

void mt_rank_init(mt_rank *r, const mt_config *cfg, mt_world *w, int rank) {
    memset(r, 0, sizeof *r);
    r->cfg = cfg;
    mt_parallel_state_init(&r->ps, cfg, rank);
    mt_parallel_state *ps = &r->ps;
    r->device = -1;
#ifdef __CUDACC__
    mt__gpu_rank_setup(r);   // cudaSetDevice, the stream, the GEMM rung (below, GPU build only)
#endif
    int TP = ps->tp_size, PP = ps->pp_size, DP = ps->dp_size;
    // communicators: every rank creates the groups it belongs to, with members in group order
    int *members = (int *)mt_malloc(sizeof(int) * (size_t)cfg->world_size, "group");
    for (int i = 0; i < cfg->world_size; i++) members[i] = i;
    mt__comm_named(&r->world, w, rank, members, cfg->world_size, "world");
    for (int t = 0; t < TP; t++) members[t] = mt_global_rank(cfg, t, ps->dp_rank, ps->pp_rank);
    mt__comm_named(&r->tp, w, rank, members, TP, "tp");
    for (int d = 0; d < DP; d++) members[d] = mt_global_rank(cfg, ps->tp_rank, d, ps->pp_rank);
    mt__comm_named(&r->dp, w, rank, members, DP, "dp");
    for (int p = 0; p < PP; p++) members[p] = mt_global_rank(cfg, ps->tp_rank, ps->dp_rank, p);
    mt__comm_named(&r->pp, w, rank, members, PP, "pp");
    for (int p = 0; p < PP; p++)
        for (int t = 0; t < TP; t++) members[p * TP + t] = mt_global_rank(cfg, t, ps->dp_rank, p);
    mt__comm_named(&r->mp, w, rank, members, TP * PP, "mp");
    if (ps->in_embedding_group) {
        members[0] = mt_global_rank(cfg, ps->tp_rank, ps->dp_rank, 0);
        members[1] = mt_global_rank(cfg, ps->tp_rank, ps->dp_rank, PP - 1);
        mt__comm_named(&r->embd, w, rank, members, 2, "embd");
    }
    free(members);
#ifdef __CUDACC__
    mt__gpu_comms_setup(r, w);   // NCCL communicators for the groups that move device data
#endif
    // local sizes
    r->B = cfg->train.micro_batch_size;
    r->T = cfg->model.seq_length;
    r->C = cfg->model.hidden_size;
    r->NH_tp = cfg->model.num_attention_heads / TP;
    r->C_tp = r->C / TP;
    r->F_tp = cfg->model.ffn_hidden_size / TP;
    r->Vp_tp = cfg->padded_vocab_size / TP;
    r->vocab_start = ps->tp_rank * r->Vp_tp;
    r->L_local = cfg->model.num_layers / PP;
    r->layers_per_chunk = r->L_local / ps->vp_size;
#ifdef __CUDACC__
    r->att_row = 1;
#else
    r->att_row = r->T;
#endif
    // parameters, gradients, AdamW moments: one carve, four buffers. The initial values are
    // computed on the host (mt__init_params) and then uploaded.
    r->num_params = mt__carve_params(r, &r->params, NULL, 1);
    float *host_params = (float *)mt_calloc(r->num_params, sizeof(float), "parameters (host)");
    r->params_memory = host_params;
    mt__init_params(r);
#ifdef __CUDACC__
    r->params_memory = mt_buffer_alloc(r, r->num_params, "parameters");
    mt_buffer_upload(r, r->params_memory, host_params, r->num_params * sizeof(float));
    free(host_params);
#endif
    r->grads_memory = mt_buffer_alloc(r, r->num_params, "gradients");
    r->m_memory = mt_buffer_alloc(r, r->num_params, "AdamW m");
    r->v_memory = mt_buffer_alloc(r, r->num_params, "AdamW v");
    mt__carve_params(r, &r->params, r->params_memory, 1);
    mt__carve_params(r, &r->grads, r->grads_memory, 0);
    // activation slots: as many micro-batches as the schedule keeps alive at once on this stage
    mt_sched_step *list = (mt_sched_step *)mt_malloc(sizeof(mt_sched_step) * 2 * (size_t)cfg->num_microbatches * ps->vp_size, "schedule");
    int n = mt_schedule_for(cfg, ps->pp_rank, list), alive = 0;
    r->num_slots = 1;
    for (int i = 0; i < n; i++) {
        if (list[i].kind == 'F' && list[i].chunk == 0) alive++;
        if (list[i].kind == 'B' && list[i].chunk == 0) alive--;
        if (alive > r->num_slots) r->num_slots = alive;
    }
    free(list);
    mt_activations probe;
    size_t per_slot = mt__carve_activations(r, &probe, NULL);
    r->slots = (mt_activations *)mt_calloc((size_t)r->num_slots, sizeof(mt_activations), "activation slots");
    size_t BT = (size_t)r->B * r->T;
    // token ids travel with their micro-batch: 2*BT ints per slot after its floats (an int is a
    // float's size; the buffer is untyped memory until written)
    r->acts_memory = mt_buffer_alloc(r, (per_slot + 2 * BT) * (size_t)r->num_slots, "activations");
    for (int i = 0; i < r->num_slots; i++) {
        float *base = r->acts_memory + (per_slot + 2 * BT) * (size_t)i;
        mt__carve_activations(r, &r->slots[i], base);
        r->slots[i].tokens = (int *)(base + per_slot);
        r->slots[i].targets = (int *)(base + per_slot + BT);
        r->slots[i].mb = -1;
    }
    size_t scratch_n = mt__carve_scratch(r, &r->scratch, NULL);
    r->scratch_memory = mt_buffer_alloc(r, scratch_n, "scratch");
    mt__carve_scratch(r, &r->scratch, r->scratch_memory);
    r->host_tokens = (int *)mt_calloc(BT, sizeof(int), "tokens");
    r->host_targets = (int *)mt_calloc(BT, sizeof(int), "targets");
    r->host_losses = (float *)mt_calloc(BT, sizeof(float), "losses");
    r->host_p2p = (float *)mt_calloc(BT * (size_t)r->C, sizeof(float), "pipeline messages");
    r->memory.params = r->num_params * sizeof(float);
    r->memory.grads = r->num_params * sizeof(float);
    r->memory.optimizer = 2 * r->num_params * sizeof(float);
    r->memory.activations = (per_slot + 2 * BT) * (size_t)r->num_slots * sizeof(float);
    r->memory.scratch = scratch_n * sizeof(float);
}

void mt_rank_free(mt_rank *r) {
    mt_buffer_free(r->params_memory); mt_buffer_free(r->grads_memory);
    mt_buffer_free(r->m_memory); mt_buffer_free(r->v_memory);
    mt_buffer_free(r->acts_memory); mt_buffer_free(r->scratch_memory);
    free(r->slots);
    free(r->host_tokens); free(r->host_targets); free(r->host_losses); free(r->host_p2p);
#ifdef __CUDACC__
    mt__gpu_rank_teardown(r);
#endif
}

/* tests/test_logging.c - what a student looks at (§1's records, §2's counters, §12's writers)
 * and the tutorial's older flags (§1, §10).
 *
 *  - TensorBoard: CRC-32C against its check value; an event file written by mt_tb_* reads back
 *    record by record with the right tags, values and steps; the same file cut at EVERY byte
 *    offset reads without error up to its last complete record (a crash never spoils what was
 *    flushed). A real training run (./train_gpt --tensorboard-dir) leaves build/tb_ref/ for
 *    tests/check_tensorboard.py (make test-ref), which reads it with TensorBoard's own reader.
 *  - communication counters: one training step of TP=2 x PP=2 x DP=2; every rank's bytes and
 *    calls per group equal the counts derived here from the model's shapes.
 *  - the timeline: PP=2 with 4 micro-batches; each stage's forward/backward spans are in 1F1B
 *    order (mt_schedule_1f1b), the Chrome trace is valid JSON with one named track per rank,
 *    the SVG is one <svg> document (make test-ref parses it as XML).
 *  - the older flags: each is accepted with its note, and the configuration is what the note says.
 */
#define MEGATRON_IMPLEMENTATION
#include "../megatron.h"
#include "harness.h"
#include "child.h"
#include "synthetic.h"
#include <sys/stat.h>
#include <sys/wait.h>

// ---------------------------------------------------------------------------------------------
// helpers: read a file, run a function in a child and capture what it prints
// ---------------------------------------------------------------------------------------------
static unsigned char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = (unsigned char *)malloc((size_t)n + 1);
    *len = fread(b, 1, (size_t)n, f);
    b[*len] = 0;
    fclose(f);
    return b;
}


// ---------------------------------------------------------------------------------------------
// TensorBoard records
// ---------------------------------------------------------------------------------------------
// a decoded Event: the fields we write
typedef struct { double wall_time; int64_t step; char tag[128]; float value; int is_version; } event;

static uint64_t varint(const unsigned char **p) {
    uint64_t v = 0;
    int shift = 0;
    while (**p & 0x80) { v |= (uint64_t)(**p & 0x7F) << shift; shift += 7; (*p)++; }
    v |= (uint64_t)**p << shift;
    (*p)++;
    return v;
}

// decodes an Event written by mt_tb_event (walks protobuf fields: key, then the value)
static int decode_event(const unsigned char *d, size_t n, event *e) {
    memset(e, 0, sizeof *e);
    const unsigned char *p = d, *end = d + n;
    while (p < end) {
        uint64_t key = varint(&p);
        if (key == 0x09) {
            uint64_t b = 0;
            for (int i = 7; i >= 0; i--) b = (b << 8) | p[i];
            memcpy(&e->wall_time, &b, 8);
            p += 8;
        }
        else if (key == 0x10) e->step = (int64_t)varint(&p);
        else if (key == 0x1a) {
            uint64_t l = varint(&p);
            e->is_version = l == 13 && memcmp(p, "brain.Event:2", 13) == 0;
            p += l;
        }
        else if (key == 0x2a) {
            uint64_t l = varint(&p);
            const unsigned char *q = p, *qe = p + l;
            if (*q++ != 0x0a) return 0;          // Summary.value
            uint64_t vl = varint(&q);
            if (q + vl != qe || *q++ != 0x0a) return 0;   // Value.tag
            uint64_t tl = varint(&q);
            if (tl >= sizeof e->tag) return 0;
            memcpy(e->tag, q, tl);
            q += tl;
            if (*q++ != 0x15) return 0;          // Value.simple_value
            uint32_t b = (uint32_t)q[0] | (uint32_t)q[1] << 8 | (uint32_t)q[2] << 16 | (uint32_t)q[3] << 24;
            memcpy(&e->value, &b, 4);
            p += l;
        } else return 0;
    }
    return p == end;
}

#define TB_DIR "build/test_tb"
static const char *tb_tags[] = {"lm loss", "learning-rate", "grad-norm", "lm loss validation ppl"};

// writes 1 + 4*20 events: tag k at step s has value (k+1) * 100 + s / 8
static void write_test_events(char *path_out, size_t cap) {
    (void)system("rm -rf " TB_DIR);
    mt_tb_writer w;
    mt_tb_open(&w, TB_DIR "/sub", 3, 7);   // queue of 7: flushes in between too
    for (int s = 1; s <= 20; s++)
        for (int k = 0; k < 4; k++) mt_tb_scalar(&w, tb_tags[k], (float)((k + 1) * 100) + (float)s / 8.0f, s);
    snprintf(path_out, cap, "%s", w.path);
    mt_tb_close(&w);
}

MT_TEST(crc32c_check_value) {
    // the CRC-32C check value (RFC 3720, iSCSI): crc("123456789") = 0xE3069283
    mt_expect(mt_crc32c("123456789", 9) == 0xE3069283u, "crc32c = %08x", mt_crc32c("123456789", 9));
    mt_expect(mt_crc32c("", 0) == 0, "crc32c of nothing");
}

MT_TEST(tensorboard_events_read_back) {
    char path[MT_PATH_MAX + 200];
    write_test_events(path, sizeof path);
    mt_expect(strstr(path, TB_DIR "/sub/events.out.tfevents.") != NULL && strstr(path, ".3") != NULL,
              "event file name %s (TensorBoard finds files by 'tfevents')", path);
    size_t len = 0;
    unsigned char *buf = read_file(path, &len);
    mt_expect(buf != NULL, "cannot read %s", path);
    if (!buf) return;
    size_t pos = 0, n;
    const unsigned char *d;
    int count = 0, bad = 0, rc;
    while ((rc = mt_tfrecord_read(buf, len, &pos, &d, &n)) == 1) {
        event e;
        if (!decode_event(d, n, &e)) { bad++; continue; }
        if (count == 0) mt_expect(e.is_version && e.step == 0, "the first event is file_version brain.Event:2");
        else {
            int s = (count - 1) / 4 + 1, k = (count - 1) % 4;
            if (strcmp(e.tag, tb_tags[k]) != 0 || e.step != s || e.value != (float)((k + 1) * 100) + (float)s / 8.0f)
                bad++;
            if (!(e.wall_time > 1.5e9)) bad++;   // seconds since 1970, as TensorBoard expects
        }
        count++;
    }
    mt_expect(rc == 0 && pos == len, "the file ends with a complete record (rc %d, %zu of %zu bytes)", rc, pos, len);
    mt_expect(count == 81 && bad == 0, "%d records (want 81), %d wrong", count, bad);
    free(buf);
}

MT_TEST(tensorboard_file_cut_at_every_byte) {
    char path[MT_PATH_MAX + 200];
    write_test_events(path, sizeof path);
    size_t len = 0;
    unsigned char *buf = read_file(path, &len);
    if (!buf) { mt_expect(0, "cannot read %s", path); return; }
    size_t ends[100];   // where each record ends
    int nrec = 0;
    size_t pos = 0, n;
    const unsigned char *d;
    while (nrec < 100 && mt_tfrecord_read(buf, len, &pos, &d, &n) == 1) ends[nrec++] = pos;
    int errors = 0, wrong_count = 0;
    for (size_t cut = 0; cut <= len; cut++) {
        unsigned char *prefix = (unsigned char *)malloc(cut + 1);   // its own buffer: no reading past the cut
        memcpy(prefix, buf, cut);
        size_t p = 0;
        int got = 0, rc;
        while ((rc = mt_tfrecord_read(prefix, cut, &p, &d, &n)) == 1) got++;
        int want = 0;
        while (want < nrec && ends[want] <= cut) want++;
        if (rc < 0) errors++;
        if (got != want) wrong_count++;
        free(prefix);
    }
    mt_expect(errors == 0 && wrong_count == 0,
              "cuts at %zu offsets: %d read as corrupt, %d with the wrong record count", len + 1, errors, wrong_count);
    // and a flipped byte IS noticed (the CRCs are checked)
    buf[len / 2] ^= 0x40;
    pos = 0;
    int rc;
    while ((rc = mt_tfrecord_read(buf, len, &pos, &d, &n)) == 1) {}
    mt_expect(rc == -1, "a damaged record is reported (rc %d)", rc);
    free(buf);
}

// a real run: a tiny dataset, ./train_gpt with --tensorboard-dir; its log lines and the event
// file must agree (make test-ref then reads the same file with TensorBoard's own reader)
#define REF_DIR "build/tb_ref"
MT_TEST(tensorboard_from_a_training_run) {
    (void)system("rm -rf " REF_DIR);
    mkdir("build", 0777);
    mkdir(REF_DIR, 0777);
    mt_indexed_builder *b = mt_indexed_builder_open(REF_DIR "/data", mt_dtype_for_vocab(101));
    int32_t doc[200];
    for (int d = 0; d < 40; d++) {
        for (int i = 0; i < 200; i++) doc[i] = (d * 7 + i * (1 + d % 3)) % 100;
        mt_indexed_builder_add_document(b, doc, 200);
    }
    mt_indexed_builder_finish(b);
    int rc = system("./train_gpt --num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 "
                    "--micro-batch-size 2 --global-batch-size 8 --tensor-model-parallel-size 2 "
                    "--pipeline-model-parallel-size 2 --nproc-per-node 4 --train-iters 12 --lr 3e-3 "
                    "--lr-warmup-iters 3 --lr-decay-style cosine --log-interval 1 --eval-interval 4 --eval-iters 2 "
                    "--split 80,20,0 --tokenizer-type NullTokenizer --vocab-size 101 --data-path " REF_DIR "/data "
                    "--tensorboard-dir " REF_DIR "/events --log-validation-ppl-to-tensorboard "
                    "--log-timers-to-tensorboard --hidden-dropout 0 --attention-dropout 0 "
                    "> " REF_DIR "/log.txt 2>&1");
    mt_expect(rc == 0, "./train_gpt exited with %d (see " REF_DIR "/log.txt)", rc);
    // the log's lm loss and learning rate at each iteration
    size_t len = 0;
    char *log = (char *)read_file(REF_DIR "/log.txt", &len);
    if (!log) { mt_expect(0, "no log"); return; }
    double loss[13] = {0}, lr[13] = {0};
    for (char *p = strstr(log, " iteration "); p; p = strstr(p + 1, " iteration ")) {
        int it = 0, total = 0;   // " iteration 4/12 |", not "validation loss at iteration 4 |"
        if (sscanf(p, " iteration %d/%d", &it, &total) != 2 || it < 1 || it > 12) continue;
        char *l = strstr(p, "lm loss: "), *r = strstr(p, "learning rate: ");
        if (l) loss[it] = atof(l + 9);
        if (r) lr[it] = atof(r + 15);
    }
    free(log);
    // the event file
    char cmd[300], path[600] = "";
    snprintf(cmd, sizeof cmd, "ls " REF_DIR "/events/events.out.tfevents.* 2>/dev/null");
    FILE *ls = popen(cmd, "r");
    if (ls) { if (!fgets(path, sizeof path, ls)) path[0] = 0; pclose(ls); }
    path[strcspn(path, "\n")] = 0;
    unsigned char *buf = read_file(path, &len);
    if (!buf) { mt_expect(0, "no event file in " REF_DIR "/events"); return; }
    size_t pos = 0, n;
    const unsigned char *d;
    int seen_loss = 0, seen_lr = 0, bad = 0, seen_val = 0, seen_ppl = 0, seen_timer = 0;
    while (mt_tfrecord_read(buf, len, &pos, &d, &n) == 1) {
        event e;
        if (!decode_event(d, n, &e)) { bad++; continue; }
        // %.6E in the log: 7 significant digits, so a relative 1e-6
        if (strcmp(e.tag, "lm loss") == 0) {
            seen_loss++;
            if (e.step < 1 || e.step > 12 || fabs(e.value - loss[e.step]) > 1e-6 * fabs(loss[e.step])) bad++;
        }
        if (strcmp(e.tag, "learning-rate") == 0) {
            seen_lr++;
            if (e.step < 1 || e.step > 12 || fabs(e.value - lr[e.step]) > 1e-6 * fabs(lr[e.step]) + 1e-12) bad++;
        }
        seen_val += strcmp(e.tag, "lm loss validation") == 0;
        seen_ppl += strcmp(e.tag, "lm loss validation ppl") == 0;
        seen_timer += strcmp(e.tag, "iteration-time") == 0;
    }
    mt_expect(seen_loss == 12 && seen_lr == 12 && bad == 0, "lm loss %d, learning-rate %d events (want 12 each), "
              "%d disagree with the log", seen_loss, seen_lr, bad);
    // validation at iterations 4, 8, 12, and once more at the end of training (iteration 12)
    mt_expect(seen_val == 4 && seen_ppl == 4 && seen_timer == 12, "validation %d, ppl %d, iteration-time %d",
              seen_val, seen_ppl, seen_timer);
    free(buf);
}

// ---------------------------------------------------------------------------------------------
// communication counters against the shapes: TP=2 x PP=2 x DP=2, one training step
// ---------------------------------------------------------------------------------------------
#define CC_GROUPS 7
typedef struct {
    mt_config cfg;
    unsigned long long calls[8][CC_GROUPS], bytes[8][CC_GROUPS];   // measured over one step, per rank
} counter_run;

static void counter_rank(mt_world *w, int rank, void *arg) {
    counter_run *run = (counter_run *)arg;
    mt_rank r;
    mt_rank_init(&r, &run->cfg, w, rank);
    mt_comm *g[CC_GROUPS] = {&r.groups.tp, &r.groups.pp, &r.groups.dp, &r.groups.embd, &r.groups.mp,
                             &r.groups.world, &r.groups.p2p};
    unsigned long long c0[CC_GROUPS], b0[CC_GROUPS];
    for (int k = 0; k < CC_GROUPS; k++) { c0[k] = g[k]->calls; b0[k] = g[k]->bytes; }
    mt_train_step(&r, synthetic_batch, NULL, 1);
    for (int k = 0; k < CC_GROUPS; k++) {
        run->calls[rank][k] = g[k]->calls - c0[k];
        run->bytes[rank][k] = g[k]->bytes - b0[k];
    }
    mt_rank_free(&r);
}

// The iteration line's --log-params-norm and --log-num-zeros-in-grad, in five layouts of the same
// model (initialised the same in every layout): TP, PP, DP (DP = 2 with the distributed optimizer).
// One run a layout: the parameters' norm at start, then one training step and its zero gradients;
// rank 0 also measures its whole buffers (at TP = PP = 1 every parameter is there once).
static const int stats_layouts[5][3] = {{1, 1, 1}, {2, 1, 1}, {1, 2, 1}, {2, 2, 1}, {2, 1, 2}};
typedef struct { mt_config cfg; double norm, norm_whole, zeros, zeros_whole; } stats_run;
static void stats_rank(mt_world *w, int rank, void *arg) {
    stats_run *run = (stats_run *)arg;
    mt_rank r;
    mt_rank_init(&r, &run->cfg, w, rank);
    double norm = mt_params_norm(&r);
    if (rank == 0) {
        run->norm = norm;
        double sumsq = 0;
        for (size_t i = 0; i < r.model.num_params; i++) sumsq += (double)r.model.params_memory[i] * r.model.params_memory[i];
        run->norm_whole = sqrt(sumsq);
    }
    mt_step_result res = mt_train_step(&r, synthetic_batch, NULL, 1);
    if (rank == 0) {
        run->zeros = res.num_zeros;
        run->zeros_whole = mt_count_zeros_cpu(r.model.grads_memory, r.model.num_params);
    }
    mt_rank_free(&r);
}
// wpe has 32 positions of which 16 are used: the other rows' gradients are 0 (below)
static void run_stats(stats_run *run, int k) {
    memset(run, 0, sizeof *run);
    mt_config *cfg = &run->cfg;
    synthetic_config(cfg, stats_layouts[k][0], stats_layouts[k][1], stats_layouts[k][2]);
    cfg->parallel.use_distributed_optimizer = stats_layouts[k][2] > 1;
    cfg->train.log_num_zeros_in_grad = 1;
    cfg->train.train_iters = 1;
    cfg->model.max_position_embeddings = 32;
    mt_config_derive(cfg);
    mt_world *w = mt_world_create(cfg->world_size);
    mt_expect(mt_world_run(w, stats_rank, run) == 0, "the world failed");
    mt_world_destroy(w);
}

// --log-params-norm: mt_params_norm counts every parameter once, so every layout gives the
// one-rank norm, which is the norm of the one rank's whole buffer; 1e-12: sums of squares in
// double, in other groupings
MT_TEST(params_norm_counts_each_parameter_once) {
    double one = 0;
    for (int k = 0; k < 5; k++) {
        stats_run run;
        run_stats(&run, k);
        if (k == 0) {
            one = run.norm;
            mt_expect(run.norm > 0 && fabs(run.norm - run.norm_whole) <= 1e-12 * run.norm_whole,
                      "one rank: params norm %.17g, the whole buffer's %.17g", run.norm, run.norm_whole);
        } else {
            mt_expect(fabs(run.norm - one) <= 1e-12 * one, "TP=%d PP=%d DP=%d: params norm %.17g, one rank's %.17g",
                      stats_layouts[k][0], stats_layouts[k][1], stats_layouts[k][2], run.norm, one);
        }
    }
}

// --log-num-zeros-in-grad: after one step, the zero gradients, every parameter counted once: one
// rank's count is its whole gradient buffer's; in other layouts the same, but for the vocabulary's
// padding (Megatron pads to a multiple of 128 x TP: its rows' gradients are 0, C each). The zeros:
// those padding rows of wte, and wpe's rows past --seq-length (32 positions, 16 used), a tensor every
// TP rank holds (counted twice at TP = 2, the test would see 512 too many)
MT_TEST(num_zeros_in_grad_counts_each_parameter_once) {
    double one = 0;
    int one_vp = 0;
    for (int k = 0; k < 5; k++) {
        stats_run run;
        run_stats(&run, k);
        const mt_config *cfg = &run.cfg;
        if (k == 0) {
            one = run.zeros;
            one_vp = cfg->padded_vocab_size;
            mt_expect(run.zeros > 0 && run.zeros == run.zeros_whole, "one rank: %.17g zeros counted, the buffer has %.17g",
                      run.zeros, run.zeros_whole);
        } else {
            double want = one + (double)(cfg->padded_vocab_size - one_vp) * cfg->model.hidden_size;
            mt_expect(run.zeros == want, "TP=%d PP=%d DP=%d: %.17g zeros, want %.17g (padded vocabulary %d)",
                      stats_layouts[k][0], stats_layouts[k][1], stats_layouts[k][2], run.zeros, want,
                      cfg->padded_vocab_size);
        }
    }
    printf("  one rank: %.0f zero gradients\n", one);
}

MT_TEST(comm_counters_match_shapes) {
    counter_run run;
    memset(&run, 0, sizeof run);
    mt_config *cfg = &run.cfg;
    mt_config_defaults(cfg);
    cfg->model.num_layers = 4;
    cfg->model.hidden_size = 32;
    cfg->model.num_attention_heads = 4;
    cfg->model.seq_length = 16;
    cfg->model.vocab_size = 101;
    cfg->parallel.tensor_model_parallel_size = 2;
    cfg->parallel.pipeline_model_parallel_size = 2;
    cfg->parallel.nproc_per_node = 8;
    cfg->parallel.ddp_bucket_size = 5000;   // several DP buckets
    cfg->train.micro_batch_size = 2;
    cfg->train.global_batch_size = 16;       // 4 micro-batches per DP rank
    cfg->train.train_iters = 1;
    mt_config_derive(cfg);
    mt_world *w = mt_world_create(8);
    mt_world_run(w, counter_rank, &run);
    mt_world_destroy(w);
    // the shapes: B,T,C; 2 layers per stage; C_tp, F_tp, Vp_tp under TP = 2; m micro-batches
    const unsigned long long B = 2, T = 16, C = 32, TP = 2, L_local = 2, m = 4, maxT = 16, f = sizeof(float);
    const unsigned long long C_tp = C / TP, F_tp = 4 * C / TP, Vp_tp = (unsigned long long)cfg->padded_vocab_size / TP;
    const unsigned long long BTC = B * T * C, BT = B * T;
    // one layer's parameters on a TP rank: ln1, qkv (w, b), attn proj (w, b), ln2, fc (w, b), fc proj (w, b)
    const unsigned long long layer = 2 * C + (3 * C_tp * C + 3 * C_tp) + (C * C_tp + C) + 2 * C + (F_tp * C + F_tp) +
                                     (C * F_tp + C);
    for (int rank = 0; rank < 8; rank++) {
        int pp_rank = rank / 4;   // rank = tp + TP*(dp + DP*pp)
        unsigned long long want_calls[CC_GROUPS] = {0}, want_bytes[CC_GROUPS] = {0};
        // tp, per micro-batch: each layer's g forward (2 row-parallel outputs) and f backward (2
        // column-parallel inputs), all (B,T,C); stage 0 adds the embedding's g; the last stage the
        // head's f backward (B,T,C) and the cross-entropy's max, sum-exp and target logit (B,T)
        unsigned long long tp_btc = 4 * L_local + 1, tp_bt = pp_rank == 1 ? 3 : 0;   // +1: embedding or head
        want_calls[0] = m * (tp_btc + tp_bt);
        want_bytes[0] = m * (tp_btc * BTC + tp_bt * BT) * f;
        // pp: the loss (a double); p2p (the pipeline's messages): m activations and m gradients
        // of (B,T,C), one each way
        want_calls[1] = 1;
        want_bytes[1] = 8;
        want_calls[6] = 2 * m;
        want_bytes[6] = 2 * m * BTC * f;
        // dp: the gradient buffer in --ddp-bucket-size buckets, then the loss (a double)
        unsigned long long params = Vp_tp * C + L_local * layer + (pp_rank == 0 ? maxT * C : 2 * C);
        want_calls[2] = (params + 4999) / 5000 + 1;
        want_bytes[2] = params * f + 8;
        // embd: the first and last stage's copies of wte's gradient
        want_calls[3] = 1;
        want_bytes[3] = Vp_tp * C * f;
        // mp: the squared gradient norm (a double); world: nothing in a step
        want_calls[4] = 1;
        want_bytes[4] = 8;
        static const char *names[] = {"tp", "pp", "dp", "embd", "mp", "world", "p2p"};
        for (int k = 0; k < CC_GROUPS; k++)
            mt_expect(run.calls[rank][k] == want_calls[k] && run.bytes[rank][k] == want_bytes[k],
                      "rank %d group %s: %llu calls, %llu bytes; from the shapes %llu calls, %llu bytes", rank,
                      names[k], run.calls[rank][k], run.bytes[rank][k], want_calls[k], want_bytes[k]);
    }
}

// ---------------------------------------------------------------------------------------------
// the timeline: PP=2, 4 micro-batches
// ---------------------------------------------------------------------------------------------
typedef struct {
    mt_config cfg;
    mt_span_log logs[4];
} timeline_run;

static void timeline_rank(mt_world *w, int rank, void *arg) {
    timeline_run *run = (timeline_run *)arg;
    mt_rank r;
    mt_rank_init(&r, &run->cfg, w, rank);
    mt_rank_set_timeline(&r, &run->logs[rank]);
    mt_train_step(&r, synthetic_batch, NULL, 1);   // not recorded: enabled is 0
    run->logs[rank].iteration = 2;
    run->logs[rank].enabled = 1;
    mt_train_step(&r, synthetic_batch, NULL, 2);
    run->logs[rank].enabled = 0;
    mt_rank_free(&r);
}

MT_TEST(timeline_1f1b) {
    timeline_run run;
    memset(&run, 0, sizeof run);
    mt_config *cfg = &run.cfg;
    mt_config_defaults(cfg);
    cfg->model.num_layers = 4;
    cfg->model.hidden_size = 32;
    cfg->model.num_attention_heads = 4;
    cfg->model.seq_length = 16;
    cfg->model.vocab_size = 101;
    cfg->parallel.tensor_model_parallel_size = 2;
    cfg->parallel.pipeline_model_parallel_size = 2;
    cfg->parallel.nproc_per_node = 4;
    cfg->train.micro_batch_size = 2;
    cfg->train.global_batch_size = 8;   // 4 micro-batches
    cfg->train.train_iters = 2;
    cfg->train.profile_step_start = 2;
    cfg->train.profile_step_end = 3;
    mt_config_derive(cfg);
    mt_world *w = mt_world_create(4);
    mt_world_run(w, timeline_rank, &run);
    mt_world_destroy(w);
    for (int rank = 0; rank < 4; rank++) {
        int pp_rank = rank / 2;
        mt_sched_step want[8];
        int nwant = mt_schedule_1f1b(4, 2, pp_rank, want), k = 0, order_ok = 1, comm = 0, optim = 0, recv = 0;
        double last_t1 = 0;
        for (size_t i = 0; i < run.logs[rank].n; i++) {
            const mt_span *s = &run.logs[rank].spans[i];
            if (s->iteration != 2) order_ok = 0;
            if (s->kind == MT_SPAN_COMM) comm++;
            if (s->kind == MT_SPAN_RECV) recv++;
            if (s->kind == MT_SPAN_OPTIMIZER) optim++;
            if (s->kind != MT_SPAN_FORWARD && s->kind != MT_SPAN_BACKWARD) continue;
            if (k >= nwant || (int)s->kind != (int)want[k].kind || s->mb != want[k].mb || s->t0 < last_t1)
                order_ok = 0;
            if (s->layer_first != 2 * pp_rank || s->layer_last != 2 * pp_rank + 1) order_ok = 0;
            last_t1 = s->t1;
            k++;
        }
        mt_expect(order_ok && k == nwant, "rank %d (stage %d): %d work spans in 1F1B order? %s", rank, pp_rank, k,
                  order_ok ? "yes" : "no");
        mt_expect(comm > 0 && optim == 1 && recv == 4, "rank %d: %d communication spans, %d optimizer, %d recv "
                  "(want 4: one per micro-batch)", rank, comm, optim, recv);
    }
    mkdir("build", 0777);
    mt_expect(mt_timeline_write_json("build/test_timeline.json", cfg, run.logs, 4) == 1, "json written");
    mt_expect(mt_timeline_write_svg("build/test_timeline.svg", cfg, run.logs, 4) == 1, "svg written");
    size_t len = 0;
    char *json = (char *)read_file("build/test_timeline.json", &len);
    if (json) {
        mt_json j;
        mt_json_init(&j, json, len, 0);
        mt_json_type t = mt_json_skip(&j);
        mt_json_ws(&j);
        mt_expect(t == MT_JSON_OBJECT && !j.err && j.p == j.end, "the timeline is one JSON object: %s",
                  j.err ? j.err : "ok");
        for (int rank = 0; rank < 4; rank++) {
            char track[64];
            snprintf(track, sizeof track, "\"tid\": %d, \"args\": {\"name\": \"rank %d", rank, rank);
            mt_expect(strstr(json, track) != NULL, "a named track for rank %d", rank);
        }
        mt_expect(strstr(json, "\"tid\": 4") == NULL, "no track beyond the 4 ranks");
        mt_expect(strstr(json, "\"name\": \"F3\"") && strstr(json, "\"name\": \"B0\"") &&
                  strstr(json, "\"cat\": \"comm\"") && strstr(json, "\"cat\": \"idle\"") &&
                  strstr(json, "\"bytes\": "),
                  "spans: forward, backward, communication with bytes, idle");
        free(json);
    }
    char *svg = (char *)read_file("build/test_timeline.svg", &len);
    if (svg) {
        int opens = 0, closes = 0;
        for (char *p = strstr(svg, "<svg"); p; p = strstr(p + 1, "<svg")) opens++;
        for (char *p = strstr(svg, "</svg>"); p; p = strstr(p + 1, "</svg>")) closes++;
        mt_expect(opens == 1 && closes == 1 && strstr(svg, ">F0<") && strstr(svg, "time (ms)"),
                  "one <svg> with micro-batch labels and a time axis");
        free(svg);
    }
    for (int rank = 0; rank < 4; rank++) mt_span_log_free(&run.logs[rank]);
}

// ---------------------------------------------------------------------------------------------
// the tutorial's older flags: accepted with a note; the configuration is what the note says
// ---------------------------------------------------------------------------------------------
typedef struct { int argc; char **argv; int derive; mt_config cfg; } parse_job;
static void child_parse(void *arg) {
    parse_job *j = (parse_job *)arg;
    mt_config_defaults(&j->cfg);
    mt_config_parse(&j->cfg, j->argc, j->argv);
    if (j->derive) mt_config_derive(&j->cfg);
}

// parses argv in a child (its notes captured in out) and in this process (the config)
static int parse_with_note(char **argv, int argc, int derive, mt_config *cfg, const char *note) {
    parse_job j;
    memset(&j, 0, sizeof j);
    j.argc = argc;
    j.argv = argv;
    j.derive = derive;
    char out[8192];
    int rc = run_child(child_parse, &j, out, sizeof out);
    mt_expect(rc == 77, "%s: exit %d; output:\n%s", argv[1], rc, out);
    mt_expect(strstr(out, "note: ") && strstr(out, note), "%s: the note lacks \"%s\"; output:\n%s", argv[1], note,
              out);
    if (rc != 77) return 0;
    // in this process too, for the configuration (the notes go to stderr: silence them)
    fflush(stderr);
    int saved = dup(2);
    FILE *null = fopen("/dev/null", "w");
    dup2(fileno(null), 2);
    child_parse(&j);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    fclose(null);
    *cfg = j.cfg;
    return 1;
}

MT_TEST(older_flags_are_mapped) {
    mt_config c;
    {
        char *a[] = {"train_gpt", "--model-parallel-size", "2"};
        if (parse_with_note(a, 3, 0, &c, "--tensor-model-parallel-size"))
            mt_expect(c.parallel.tensor_model_parallel_size == 2, "--model-parallel-size 2 -> TP %d",
                      c.parallel.tensor_model_parallel_size);
    }
    {
        char *a[] = {"train_gpt", "--num-gpus", "4"};
        if (parse_with_note(a, 3, 0, &c, "--nproc-per-node"))
            mt_expect(c.parallel.nproc_per_node == 4, "--num-gpus 4 -> %d ranks", c.parallel.nproc_per_node);
    }
    {
        char *a[] = {"train_gpt", "--batch-size", "4"};
        if (parse_with_note(a, 3, 0, &c, "--micro-batch-size"))
            mt_expect(c.train.micro_batch_size == 4, "--batch-size 4 -> micro-batch %d", c.train.micro_batch_size);
    }
    {
        char *a[] = {"train_gpt", "--warmup", "0.01"};
        if (parse_with_note(a, 3, 0, &c, "--lr-warmup-fraction"))
            mt_expect(c.train.lr_warmup_fraction == 0.01, "--warmup -> %g", c.train.lr_warmup_fraction);
    }
    {   // activation recompute: the older flags set today's, as their notes say
        char *a[] = {"train_gpt", "--checkpoint-activations", "--checkpoint-num-layers", "2",
                     "--distribute-checkpointed-activations", "--num-layers", "4"};
        if (parse_with_note(a, 7, 1, &c, "--recompute-granularity full --recompute-method uniform"))
            mt_expect(c.recompute == MT_RECOMPUTE_UNIFORM && c.recompute_num_layers == 2,
                      "--checkpoint-activations --checkpoint-num-layers 2 -> recompute %d, %d layers", (int)c.recompute,
                      c.recompute_num_layers);
        parse_with_note(a, 7, 1, &c, "--recompute-num-layers");
        parse_with_note(a, 7, 1, &c, "--distribute-saved-activations");
    }
    {   // the tutorial's optimizer flags: not Megatron's; taken as the distributed optimizer
        char *a[] = {"train_gpt", "--use-checkpoint-optimizer", "--optimizer-checkpoint-freq", "100"};
        if (parse_with_note(a, 4, 0, &c, "not a Megatron flag"))
            mt_expect(c.parallel.use_distributed_optimizer == 1, "--use-checkpoint-optimizer -> the distributed optimizer");
        parse_with_note(a, 4, 0, &c, "--use-distributed-optimizer");
    }
    {   // --gradient-accumulation-steps without a global batch sets it: 4 x DP 2 x 8 = 64
        char *a[] = {"train_gpt", "--micro-batch-size", "4", "--nproc-per-node", "2", "--gradient-accumulation-steps",
                     "8", "--num-layers", "2"};
        if (parse_with_note(a, 9, 1, &c, "--global-batch-size"))
            mt_expect(c.train.global_batch_size == 64 && c.num_microbatches == 8, "global batch %d, %d micro-batches",
                      c.train.global_batch_size, c.num_microbatches);
    }
    {   // ... and with a matching one it is accepted
        char *a[] = {"train_gpt", "--micro-batch-size", "4", "--nproc-per-node", "2", "--gradient-accumulation-steps",
                     "8", "--global-batch-size", "64", "--num-layers", "2"};
        if (parse_with_note(a, 11, 1, &c, "--gradient-accumulation-steps"))
            mt_expect(c.train.global_batch_size == 64, "global batch %d", c.train.global_batch_size);
    }
    {   // a mismatch shows the arithmetic
        char *a[] = {"train_gpt", "--micro-batch-size", "4", "--nproc-per-node", "2", "--gradient-accumulation-steps",
                     "8", "--global-batch-size", "32", "--num-layers", "2"};
        parse_job j;
        memset(&j, 0, sizeof j);
        j.argc = 11;
        j.argv = a;
        j.derive = 1;
        char out[8192];
        int rc = run_child(child_parse, &j, out, sizeof out);
        mt_expect(rc == 1 && strstr(out, "error:") && strstr(out, "--global-batch-size 32") &&
                  strstr(out, "micro-batch 4 x data-parallel size 2 x 8 steps = 64") && strstr(out, "hint:"),
                  "mismatch: exit %d; output:\n%s", rc, out);
    }
    {
        char *a[] = {"train_gpt", "--start-iteration", "5"};
        if (parse_with_note(a, 3, 0, &c, "training starts at iteration 6"))
            mt_expect(c.train.start_iteration == 5, "--start-iteration 5 -> %d", c.train.start_iteration);
    }
    {
        char *a[] = {"train_gpt", "--DDP-impl", "local"};
        parse_with_note(a, 3, 0, &c, "one data-parallel implementation");
    }
}

static void child_resolve(void *arg) { mt_checkpoint_resolve_load((mt_config *)arg); }

// the flag tables: every flag once, and none both implemented and listed as not implemented (a
// second entry would never be reached: the first one found wins)
MT_TEST(every_flag_is_in_the_tables_once) {
    size_t n = sizeof mt__flags / sizeof mt__flags[0], u = sizeof mt__unimplemented_flags / sizeof mt__unimplemented_flags[0];
    int dup = 0;
    for (size_t i = 0; i < n; i++) {
        for (size_t j = i + 1; j < n; j++)
            if (strcmp(mt__flags[i].name, mt__flags[j].name) == 0) {
                mt_expect(0, "%s is in the flag table twice", mt__flags[i].name);
                dup++;
            }
        for (size_t j = 0; j < u; j++)
            if (strcmp(mt__flags[i].name, mt__unimplemented_flags[j].name) == 0) {
                mt_expect(0, "%s is both a flag and a flag not implemented", mt__flags[i].name);
                dup++;
            }
    }
    printf("  %zu flags, %zu not implemented: %d repeated\n", n, u, dup);
}

MT_TEST(load_an_iteration_directory) {
    (void)system("rm -rf build/test_iterdir && mkdir -p build/test_iterdir/ckpts/iter_0001000");
    mt_config c;
    mt_config_defaults(&c);
    snprintf(c.train.load, MT_PATH_MAX, "build/test_iterdir/ckpts/iter_0001000/");
    char out[4096];
    int rc = run_child(child_resolve, &c, out, sizeof out);
    mt_expect(rc == 77 && strstr(out, "note: ") && strstr(out, "--load build/test_iterdir/ckpts --ckpt-step 1000"),
              "the note names today's flags: exit %d, output:\n%s", rc, out);
    int saved = dup(2);
    FILE *null = fopen("/dev/null", "w");
    dup2(fileno(null), 2);
    mt_checkpoint_resolve_load(&c);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    fclose(null);
    mt_expect(strcmp(c.train.load, "build/test_iterdir/ckpts") == 0 && c.train.ckpt_step == 1000,
              "--load -> %s, --ckpt-step %d", c.train.load, c.train.ckpt_step);
    // a checkpoint root stays as it is
    mt_config d;
    mt_config_defaults(&d);
    snprintf(d.train.load, MT_PATH_MAX, "build/test_iterdir/ckpts");
    mt_checkpoint_resolve_load(&d);
    mt_expect(strcmp(d.train.load, "build/test_iterdir/ckpts") == 0 && d.train.ckpt_step == 0, "a root is left alone");
    // --ckpt-step naming an iteration the root does not have: one line that lists those it has
    d.train.ckpt_step = 999;
    rc = run_child(child_resolve, &d, out, sizeof out);
    mt_expect(rc == 1 && strstr(out, "error: --ckpt-step 999: build/test_iterdir/ckpts has no iteration 999 (its "
                                     "iterations: 1000)"), "a missing --ckpt-step: exit %d, output:\n%s", rc, out);
    d.train.ckpt_step = 1000;
    rc = run_child(child_resolve, &d, out, sizeof out);
    mt_expect(rc == 77, "--ckpt-step 1000, which is there: exit %d, output:\n%s", rc, out);
}

int main(void) {
    mt_run_test(crc32c_check_value);
    mt_run_test(tensorboard_events_read_back);
    mt_run_test(tensorboard_file_cut_at_every_byte);
    mt_run_test(tensorboard_from_a_training_run);
    mt_run_test(comm_counters_match_shapes);
    mt_run_test(params_norm_counts_each_parameter_once);
    mt_run_test(num_zeros_in_grad_counts_each_parameter_once);
    mt_run_test(timeline_1f1b);
    mt_run_test(older_flags_are_mapped);
    mt_run_test(load_an_iteration_directory);
    mt_run_test(every_flag_is_in_the_tables_once);
    return mt_test_summary();
}

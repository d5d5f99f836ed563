/* tests/test_pp.c - the pipeline schedules (§8) and the printed layout (§2).
 *
 * For p stages and m micro-batches (p up to 4, m from 1 to 8, m < p included), every
 * schedule must: give each stage m forwards and m backwards of every chunk, run a micro-batch's
 * forward before its backward, keep forwards and backwards each in micro-batch order (per
 * chunk), and finish when simulated with blocking receives (no deadlock). 1F1B keeps at most
 * p - s micro-batches alive on stage s. The printed 1F1B picture and --print-layout must be
 * exactly the comments in megatron.h, so the docs cannot drift from the code.
 *
 * Then the schedules run: every (p, chunks, m) trains two steps and evaluates once with its
 * messages under NCCL's rules (section 2's mt_p2p_batch on the threads backend: a send is done
 * when its receiver has it, receives match sends in order), where a badly batched schedule hangs
 * (the alarm below fails the test) or mismatches (an error naming both tags), and its losses equal
 * one rank's.
 */
#define MEGATRON_IMPLEMENTATION
#include "../megatron.h"
#include "harness.h"
#include "synthetic.h"

static void make_config(mt_config *cfg, int pp, int m, int vp) {
    mt_config_defaults(cfg);
    cfg->model.num_layers = 4 * pp * (vp > 1 ? vp : 1);
    cfg->model.hidden_size = 32;
    cfg->model.num_attention_heads = 4;
    cfg->model.seq_length = 8;
    cfg->model.vocab_size = 64;
    cfg->model.hidden_dropout = 0.0f;     // the schedules alone (tests/test_layouts.c has dropout)
    cfg->model.attention_dropout = 0.0f;
    cfg->parallel.pipeline_model_parallel_size = pp;
    cfg->parallel.nproc_per_node = pp;
    cfg->parallel.num_layers_per_virtual_pipeline_stage = vp > 1 ? 4 : 0;
    cfg->train.micro_batch_size = 1;
    cfg->train.global_batch_size = m;
    cfg->train.train_iters = 1;
    mt_config_derive(cfg);
}

static void check_schedule(const mt_config *cfg, const char *what) {
    int pp = cfg->parallel.pipeline_model_parallel_size, m = cfg->num_microbatches, vp = cfg->virtual_pipeline_size;
    mt_sched_step list[1024];
    for (int s = 0; s < pp; s++) {
        int n = mt_schedule_for(cfg, s, list);
        mt_expect(n == 2 * m * vp, "%s stage %d: %d steps, want %d", what, s, n, 2 * m * vp);
        int fdone[64][8], bdone[64][8], next_f[8] = {0}, next_b[8] = {0}, alive = 0, max_alive = 0;
        memset(fdone, 0, sizeof fdone);
        memset(bdone, 0, sizeof bdone);
        for (int i = 0; i < n; i++) {
            mt_sched_step st = list[i];
            mt_expect(st.mb >= 0 && st.mb < m && st.chunk >= 0 && st.chunk < vp, "%s stage %d: bad step %s%d.%d", what, s, st.kind == MT_STEP_FORWARD ? "F" : "B", st.mb, st.chunk);
            if (st.kind == MT_STEP_FORWARD) {
                mt_expect(!fdone[st.mb][st.chunk], "%s stage %d: F%d.%d twice", what, s, st.mb, st.chunk);
                mt_expect(st.mb == next_f[st.chunk], "%s stage %d: F%d.%d out of order", what, s, st.mb, st.chunk);
                fdone[st.mb][st.chunk] = 1;
                next_f[st.chunk]++;
                if (st.chunk == 0) alive++;
            } else {
                mt_expect(fdone[st.mb][st.chunk], "%s stage %d: B%d.%d before its forward", what, s, st.mb, st.chunk);
                mt_expect(!bdone[st.mb][st.chunk], "%s stage %d: B%d.%d twice", what, s, st.mb, st.chunk);
                mt_expect(st.mb == next_b[st.chunk], "%s stage %d: B%d.%d out of order", what, s, st.mb, st.chunk);
                bdone[st.mb][st.chunk] = 1;
                next_b[st.chunk]++;
                if (st.chunk == 0) alive--;
            }
            if (alive > max_alive) max_alive = alive;
        }
        for (int c = 0; c < vp; c++)
            mt_expect(next_f[c] == m && next_b[c] == m, "%s stage %d chunk %d: %d F and %d B, want %d each", what, s, c, next_f[c], next_b[c], m);
        if (vp == 1 && pp > 1) {
            int bound = pp - s < m ? pp - s : m;
            mt_expect(max_alive <= bound, "%s stage %d keeps %d micro-batches alive, 1F1B allows %d", what, s, max_alive, bound);
        }
    }
    // no deadlock: simulate with blocking receives
    int *start[8], count[8];
    for (int s = 0; s < pp; s++) start[s] = (int *)malloc(sizeof(int) * 1024);
    int makespan = mt_schedule_simulate(cfg, 1, 2, start, count);
    mt_expect(makespan > 0, "%s deadlocks", what);
    // the fastest possible pipeline: m forwards and m backwards of every chunk + the fill and drain
    if (makespan > 0) mt_expect(makespan >= 3 * m * vp, "%s finishes in %d slots, faster than its own work", what, makespan);
    for (int s = 0; s < pp; s++) free(start[s]);
}

MT_TEST(one_f_one_b_all_sizes) {
    mt_config cfg;
    for (int pp = 1; pp <= 4; pp++)
        for (int m = 1; m <= 8; m++) {
            make_config(&cfg, pp, m, 1);
            char what[64];
            snprintf(what, sizeof what, "1F1B p=%d m=%d", pp, m);
            check_schedule(&cfg, what);
        }
}

MT_TEST(interleaved_all_sizes) {
    mt_config cfg;
    for (int pp = 2; pp <= 4; pp++)
        for (int vp = 2; vp <= 3; vp++)
            for (int m = pp; m <= 8; m += pp) {
                make_config(&cfg, pp, m, vp);
                char what[64];
                snprintf(what, sizeof what, "interleaved p=%d v=%d m=%d", pp, vp, m);
                check_schedule(&cfg, what);
            }
}

MT_TEST(afab_and_bubble) {
    // AFAB is the baseline: same steps, all forwards first; 1F1B's bubble equals AFAB's
    mt_config cfg;
    make_config(&cfg, 4, 6, 1);
    mt_sched_step list[64];
    int n = mt_schedule_afab(6, list);
    mt_expect(n == 12 && list[5].kind == MT_STEP_FORWARD && list[6].kind == MT_STEP_BACKWARD, "AFAB is not all-forward-all-backward");
    int *start[4], count[4];
    for (int s = 0; s < 4; s++) start[s] = (int *)malloc(sizeof(int) * 64);
    int makespan = mt_schedule_simulate(&cfg, 1, 1, start, count);
    // unit F and B: (m + p - 1) slots of F plus the same of B: 2*(6+3) = 18
    mt_expect(makespan == 18, "1F1B p=4 m=6 takes %d slots, the bubble formula says 18", makespan);
    for (int s = 0; s < 4; s++) free(start[s]);
}

// reads the lines of megatron.h that start with `prefix` right after the line containing `anchor`
static int read_comment_block(const char *anchor, const char *prefix, char *out, size_t cap) {
    const char *files[] = {"megatron.h"};
    for (size_t k = 0; k < sizeof files / sizeof files[0]; k++) {
        FILE *f = fopen(files[k], "r");
        if (!f) continue;
        char line[1024];
        int found = 0;
        size_t len = 0;
        out[0] = 0;
        while (fgets(line, sizeof line, f)) {
            if (!found) { if (strstr(line, anchor)) found = 1; continue; }
            if (len == 0 && strcmp(line, "//\n") == 0 && strcmp(prefix, "//") != 0) continue;   // blank comment lines before the block
            if (strncmp(line, prefix, strlen(prefix)) != 0) break;
            const char *text = line + 3;   // drop "// "
            if (strncmp(line, "//\n", 3) == 0) text = "\n";
            size_t l = strlen(text);
            if (len + l + 1 < cap) { memcpy(out + len, text, l + 1); len += l; }
        }
        fclose(f);
        if (found && len) return 1;
    }
    return 0;
}

static void capture(void (*fn)(const mt_config *, FILE *), const mt_config *cfg, char *out, size_t cap) {
    FILE *f = tmpfile();
    fn(cfg, f);
    rewind(f);
    size_t n = fread(out, 1, cap - 1, f);
    out[n] = 0;
    fclose(f);
}

MT_TEST(print_schedule_matches_comment) {
    char want[8192], got[16384];
    mt_expect(read_comment_block("// pp=4, m=6, F and B one slot each", "// stage", want, sizeof want), "1F1B picture not found");
    mt_config cfg;
    make_config(&cfg, 4, 6, 1);
    capture(mt_print_schedule, &cfg, got, sizeof got);
    mt_expect(strstr(got, want) != NULL, "--print-schedule differs from the comment above mt_schedule_1f1b:\n%s\nvs\n%s", got, want);
}

MT_TEST(print_layout_matches_comment) {
    char want[8192], got[8192];
    mt_expect(read_comment_block("prints (a test checks it):", "//", want, sizeof want), "layout comment not found");
    // the block starts with an empty comment line and ends before the next blank line
    char *start = want;
    while (*start == '\n') start++;
    char *end = strstr(start, "\n\n");
    if (end) end[1] = 0;
    mt_config cfg;
    mt_config_defaults(&cfg);
    cfg.model.num_layers = 8;
    cfg.model.hidden_size = 64;
    cfg.model.num_attention_heads = 4;
    cfg.parallel.tensor_model_parallel_size = 2;
    cfg.parallel.pipeline_model_parallel_size = 2;
    cfg.parallel.nproc_per_node = 8;
    mt_config_derive(&cfg);
    capture(mt_print_layout, &cfg, got, sizeof got);
    mt_expect(strcmp(got, start) == 0, "--print-layout differs from the comment in §2:\n[%s]\nvs\n[%s]", got, start);
}

MT_TEST(rank_order_is_megatrons) {
    // TP fastest, then DP, then PP; and the groups are consistent with the formula
    mt_config cfg;
    mt_config_defaults(&cfg);
    cfg.model.num_layers = 8;
    cfg.model.num_attention_heads = 4;
    cfg.model.hidden_size = 64;
    cfg.parallel.tensor_model_parallel_size = 2;
    cfg.parallel.pipeline_model_parallel_size = 2;
    cfg.parallel.nproc_per_node = 16;
    mt_config_derive(&cfg);
    mt_expect(cfg.data_parallel_size == 4, "DP should be 16/(2*2) = 4");
    for (int r = 0; r < 16; r++) {
        mt_parallel_state ps;
        mt_parallel_state_init(&ps, &cfg, r);
        mt_expect(ps.tp_rank == r % 2 && ps.dp_rank == (r / 2) % 4 && ps.pp_rank == r / 8, "rank %d placed at tp%d dp%d pp%d", r, ps.tp_rank, ps.dp_rank, ps.pp_rank);
        mt_expect(mt_global_rank(&cfg, ps.tp_rank, ps.dp_rank, ps.pp_rank) == r, "rank formula does not invert for %d", r);
        mt_expect(ps.pp_next_rank == (r + 8) % 16, "rank %d: next stage is %d", r, ps.pp_next_rank);
    }
}

// ---------------------------------------------------------------------------------------------
// every schedule runs under NCCL's rules, and trains as one rank does
// ---------------------------------------------------------------------------------------------
typedef struct {
    mt_config cfg;
    float loss[2], eval;   // the last stage's, as every rank returns it
} sched_run;

static void sched_rank(mt_world *w, int rank, void *arg) {
    sched_run *run = (sched_run *)arg;
    mt_rank r;
    mt_rank_init(&r, &run->cfg, w, rank);
    for (int it = 1; it <= 2; it++) {
        mt_step_result res = mt_train_step(&r, synthetic_batch, NULL, it);
        if (rank == 0) run->loss[it - 1] = res.loss;
    }
    float e = mt_eval_step(&r, synthetic_batch, NULL, 3);
    if (rank == 0) run->eval = e;
    mt_rank_free(&r);
}

// layers: the model's, the same for the pipeline and its one-rank reference
static void run_sched(sched_run *run, int pp, int m, int vp, int layers) {
    memset(run, 0, sizeof *run);
    make_config(&run->cfg, pp, m, vp);
    run->cfg.model.num_layers = layers;
    run->cfg.parallel.num_layers_per_virtual_pipeline_stage = vp > 1 ? layers / (pp * vp) : 0;
    run->cfg.parallel.pipeline_model_parallel_size = pp;
    run->cfg.parallel.nproc_per_node = pp;
    mt_config_derive(&run->cfg);
    mt_world *w = mt_world_create(pp);
    mt_expect(mt_world_run(w, sched_rank, run) == 0, "PP=%d, %d chunks, m=%d: the run failed", pp, vp, m);
    mt_world_destroy(w);
}

MT_TEST(schedules_run_under_nccls_rules) {
    int runs = 0;
    for (int pp = 2; pp <= 4; pp++)
        for (int vp = 1; vp <= 3; vp++)
            for (int m = 1; m <= 8; m++) {
                if (vp > 1 && m % pp != 0) continue;   // (Megatron's rule for the interleaved schedule)
                sched_run got, want;   // 2 layers a chunk: enough to be a pipeline, and fast
                run_sched(&got, pp, m, vp, 2 * pp * vp);
                run_sched(&want, 1, m, 1, 2 * pp * vp);
                for (int k = 0; k < 2; k++)
                    mt_expect(fabsf(got.loss[k] - want.loss[k]) <= 1e-5f * fabsf(want.loss[k]),
                              "PP=%d, %d chunks, m=%d: loss %d %.7f, one rank %.7f", pp, vp, m, k + 1,
                              (double)got.loss[k], (double)want.loss[k]);
                mt_expect(fabsf(got.eval - want.eval) <= 1e-5f * fabsf(want.eval),
                          "PP=%d, %d chunks, m=%d: evaluation %.7f, one rank %.7f", pp, vp, m, (double)got.eval,
                          (double)want.eval);
                runs++;
            }
    printf("  %d schedules trained 2 steps and evaluated under NCCL's rules, each as one rank\n", runs);
}

int main(void) {
    alarm(120);
    mt_run_test(one_f_one_b_all_sizes);
    mt_run_test(interleaved_all_sizes);
    mt_run_test(afab_and_bubble);
    mt_run_test(print_schedule_matches_comment);
    mt_run_test(print_layout_matches_comment);
    mt_run_test(rank_order_is_megatrons);
    mt_run_test(schedules_run_under_nccls_rules);
    return mt_test_summary();
}

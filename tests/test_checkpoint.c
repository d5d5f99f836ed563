/* tests/test_checkpoint.c - save and resume (§10).
 *
 * Resuming from a checkpoint must be invisible: training 6 steps straight, or 3 steps, a save,
 * a fresh process state, a load and 3 more, gives bit-identical losses and parameters (same
 * layout: the same arithmetic in the same order). A damaged checkpoint is a clear error.
 * Also writes build/ckpt_ref/ for tests/check_safetensors.py (make test-ref), which reads the
 * file with the reference safetensors library.
 */
#define MEGATRON_IMPLEMENTATION
#include "../megatron.h"
#include "harness.h"
#include "synthetic.h"
#include <sys/wait.h>

#define STEPS 6
#define CKPT_DIR "build/test_ckpt"

typedef struct {
    mt_config cfg;
    int save_at;              // save after this iteration (0: never)
    int load;                 // resume from CKPT_DIR first
    const char *dir;
    float losses[STEPS + 1];  // by iteration
    float scales[STEPS + 1];  // the loss scale after each iteration (fp16)
    float *params;            // rank 0's parameters at the end (host copy)
    size_t num_params;
    int loaded_iteration;
    int start_at;             // 0: after the loaded iteration (or 1); else train from this iteration
    int moments_zero;         // after the load: rank 0's AdamW moments all 0
    int adam_step;            //   and its step count
} run_spec;

static void rank_main(mt_world *w, int rank, void *arg) {
    run_spec *run = (run_spec *)arg;
    mt_rank r;
    mt_rank_init(&r, &run->cfg, w, rank);
    int first = 1;
    if (run->load) {
        int64_t valid = 0;
        int it = mt_checkpoint_load(&r, run->dir, &valid);
        if (rank == 0) {
            run->loaded_iteration = it;
            run->adam_step = r.optim.step;
            run->moments_zero = 1;   // (the CPU build: host memory)
            for (size_t i = 0; i < r.optim.shard_size; i++)
                if (r.optim.m_memory[i] != 0.0f || r.optim.v_memory[i] != 0.0f) run->moments_zero = 0;
        }
        first = it + 1;
    }
    if (run->start_at) first = run->start_at;
    for (int it = first; it <= run->cfg.train.train_iters; it++) {
        mt_step_result res = mt_train_step(&r, synthetic_batch, NULL, it);
        if (rank == 0) { run->losses[it] = res.loss; run->scales[it] = res.loss_scale; }
        if (it == run->save_at) mt_checkpoint_save(&r, run->dir, it, 1234);
    }
    if (rank == 0) {
        run->num_params = r.model.num_params;
        run->params = (float *)malloc(r.model.num_params * sizeof(float));
        memcpy(run->params, r.model.params_memory, r.model.num_params * sizeof(float));
    }
    mt_rank_free(&r);
}

static void setup(run_spec *run, int tp, int pp, int dp, int save_at, int load, const char *dir) {
    memset(run, 0, sizeof *run);
    mt_config *cfg = &run->cfg;
    mt_config_defaults(cfg);
    cfg->model.num_layers = 4;
    cfg->model.hidden_size = 32;
    cfg->model.num_attention_heads = 4;
    cfg->model.seq_length = 16;
    cfg->model.vocab_size = 101;
    cfg->model.hidden_dropout = 0.1f;   // the masks depend on the iteration: a resume must not shift them
    cfg->model.attention_dropout = 0.0f;
    cfg->parallel.tensor_model_parallel_size = tp;
    cfg->parallel.pipeline_model_parallel_size = pp;
    cfg->parallel.nproc_per_node = tp * pp * dp;
    cfg->train.micro_batch_size = 2;
    cfg->train.global_batch_size = 8;
    cfg->train.train_iters = STEPS;
    cfg->train.lr = 3e-3f;
    cfg->train.lr_warmup_iters = 2;
    mt_config_derive(cfg);
    run->save_at = save_at;
    run->load = load;
    run->dir = dir;
}

static int run_world(run_spec *run) {
    mt_world *w = mt_world_create(run->cfg.world_size);
    int rc = mt_world_run(w, rank_main, run);
    mt_world_destroy(w);
    return rc;
}

MT_TEST(resume_is_bit_exact) {
    (void)system("rm -rf " CKPT_DIR);
    run_spec straight, first_half, second_half;
    setup(&straight, 2, 2, 1, 0, 0, CKPT_DIR);
    setup(&first_half, 2, 2, 1, 3, 0, CKPT_DIR);
    mt_expect(run_world(&straight) == 0 && run_world(&first_half) == 0, "training failed");
    setup(&second_half, 2, 2, 1, 0, 1, CKPT_DIR);   // a fresh world and fresh ranks: only the files carry state
    mt_expect(run_world(&second_half) == 0, "resume failed");
    mt_expect(second_half.loaded_iteration == 3, "loaded iteration %d, want 3", second_half.loaded_iteration);
    for (int it = 4; it <= STEPS; it++)
        mt_expect(memcmp(&second_half.losses[it], &straight.losses[it], sizeof(float)) == 0,
                  "iteration %d: loss %.9g after resume, %.9g straight", it, (double)second_half.losses[it], (double)straight.losses[it]);
    mt_expect(second_half.num_params == straight.num_params &&
              memcmp(second_half.params, straight.params, straight.num_params * sizeof(float)) == 0,
              "parameters after resume are not bit-identical to the straight run");
    free(straight.params); free(first_half.params); free(second_half.params);
}

// saved with DP=2, resumed with DP=1: DP replicas are identical, so any DP can resume
// (1e-5: DP=1 sums the gradients of both halves of the batch in another order)
MT_TEST(resume_with_another_dp) {
    (void)system("rm -rf " CKPT_DIR "_dp");
    run_spec straight, first_half, second_half;
    setup(&straight, 2, 1, 2, 0, 0, CKPT_DIR "_dp");
    setup(&first_half, 2, 1, 2, 3, 0, CKPT_DIR "_dp");
    mt_expect(run_world(&straight) == 0 && run_world(&first_half) == 0, "training failed");
    setup(&second_half, 2, 1, 1, 0, 1, CKPT_DIR "_dp");
    mt_expect(run_world(&second_half) == 0, "resume failed");
    mt_check_tensor("losses after resuming with DP=1", second_half.losses + 4, straight.losses + 4, 3, 1e-5);
    free(straight.params); free(first_half.params); free(second_half.params);
}

// the distributed optimizer: saved from DP=2 with sharded AdamW state, the files hold the whole
// state (byte-identical to a run without it: the same values, gathered), and a DP=2 sharded
// resume continues bit-exactly (tolerance 0: the same ops in the same order as the straight run)
MT_TEST(distributed_optimizer_checkpoints) {
    (void)system("rm -rf " CKPT_DIR "_zero " CKPT_DIR "_plain");
    run_spec straight, first_half, plain_half, second_half;
    setup(&straight, 2, 1, 2, 0, 0, CKPT_DIR "_zero");
    straight.cfg.parallel.use_distributed_optimizer = 1;
    setup(&first_half, 2, 1, 2, 3, 0, CKPT_DIR "_zero");
    first_half.cfg.parallel.use_distributed_optimizer = 1;
    setup(&plain_half, 2, 1, 2, 3, 0, CKPT_DIR "_plain");
    mt_expect(run_world(&straight) == 0 && run_world(&first_half) == 0 && run_world(&plain_half) == 0,
              "training failed");
    int same = system("cmp -s " CKPT_DIR "_zero/iter_0000003/mp_rank_00/model_optim_rng.safetensors "
                      CKPT_DIR "_plain/iter_0000003/mp_rank_00/model_optim_rng.safetensors") == 0 &&
               system("cmp -s " CKPT_DIR "_zero/iter_0000003/mp_rank_01/model_optim_rng.safetensors "
                      CKPT_DIR "_plain/iter_0000003/mp_rank_01/model_optim_rng.safetensors") == 0;
    mt_expect(same, "the distributed optimizer's checkpoint differs from the plain one's");
    setup(&second_half, 2, 1, 2, 0, 1, CKPT_DIR "_zero");
    second_half.cfg.parallel.use_distributed_optimizer = 1;
    mt_expect(run_world(&second_half) == 0, "resume failed");
    for (int it = 4; it <= STEPS; it++)
        mt_expect(memcmp(&second_half.losses[it], &straight.losses[it], sizeof(float)) == 0,
                  "iteration %d: loss %.9g after a sharded resume, %.9g straight", it,
                  (double)second_half.losses[it], (double)straight.losses[it]);
    free(straight.params); free(first_half.params); free(plain_half.params); free(second_half.params);
}

// --finetune and --no-load-optim (Megatron's): the parameters come from the checkpoint, AdamW's
// moments and step start again. So the loss of the first step after the load (computed before any
// update) is the one a full resume computes from the same parameters on the same batch, bit for
// bit, and another than a fresh run's; the next one differs from the full resume's (other moments).
MT_TEST(finetune_and_no_load_optim_load_the_parameters_only) {
    (void)system("rm -rf " CKPT_DIR "_ft");
    run_spec fresh, first_half, full, full_from_1, finetune, no_optim;
    setup(&fresh, 2, 1, 1, 0, 0, CKPT_DIR "_ft");
    setup(&first_half, 2, 1, 1, 3, 0, CKPT_DIR "_ft");
    mt_expect(run_world(&fresh) == 0 && run_world(&first_half) == 0, "training failed");
    setup(&full, 2, 1, 1, 0, 1, CKPT_DIR "_ft");
    setup(&full_from_1, 2, 1, 1, 0, 1, CKPT_DIR "_ft");
    full_from_1.start_at = 1;
    setup(&finetune, 2, 1, 1, 0, 1, CKPT_DIR "_ft");
    finetune.cfg.train.finetune = 1;
    finetune.start_at = 1;   // (mt__resume's start: iteration 1)
    setup(&no_optim, 2, 1, 1, 0, 1, CKPT_DIR "_ft");
    no_optim.cfg.train.no_load_optim = 1;
    mt_expect(run_world(&full) == 0 && run_world(&full_from_1) == 0 && run_world(&finetune) == 0 &&
              run_world(&no_optim) == 0, "resume failed");
    mt_expect(full.loaded_iteration == 3 && !full.moments_zero && full.adam_step == 3,
              "a full resume: iteration %d, moments zero %d, step %d", full.loaded_iteration, full.moments_zero,
              full.adam_step);
    mt_expect(finetune.loaded_iteration == 3 && finetune.moments_zero && finetune.adam_step == 0,
              "--finetune: iteration %d, moments zero %d, step %d", finetune.loaded_iteration, finetune.moments_zero,
              finetune.adam_step);
    mt_expect(no_optim.loaded_iteration == 3 && no_optim.moments_zero && no_optim.adam_step == 0,
              "--no-load-optim: iteration %d, moments zero %d, step %d", no_optim.loaded_iteration,
              no_optim.moments_zero, no_optim.adam_step);
    mt_expect(memcmp(&finetune.losses[1], &full_from_1.losses[1], sizeof(float)) == 0 &&
              finetune.losses[1] != fresh.losses[1],
              "--finetune's first loss %.9g: the loaded parameters' %.9g, a fresh run's %.9g", (double)finetune.losses[1],
              (double)full_from_1.losses[1], (double)fresh.losses[1]);
    mt_expect(memcmp(&no_optim.losses[4], &full.losses[4], sizeof(float)) == 0 && no_optim.losses[5] != full.losses[5],
              "--no-load-optim: losses %.9g, %.9g at 4 and 5; the full resume's %.9g, %.9g", (double)no_optim.losses[4],
              (double)no_optim.losses[5], (double)full.losses[4], (double)full.losses[5]);
    free(fresh.params); free(first_half.params); free(full.params); free(full_from_1.params); free(finetune.params);
    free(no_optim.params);
}

// --fp16 with dynamic loss scaling: the scaler's state (scale, growth and hysteresis trackers)
// and the count of skipped steps (the learning rate's position) travel in the checkpoint, so a
// resume continues bit for bit. From 2^24 the first steps overflow; a window of 2 makes the scale
// grow again and the trackers sit mid-way at the save.
static void setup_fp16(run_spec *run, int save_at, int load, const char *dir) {
    setup(run, 2, 2, 1, save_at, load, dir);
    run->cfg.train.fp16 = 1;
    run->cfg.train.initial_loss_scale = 16777216.0f;
    run->cfg.train.loss_scale_window = 2;
    mt_config_derive(&run->cfg);
}
MT_TEST(fp16_resume_is_bit_exact) {
    (void)system("rm -rf " CKPT_DIR "_fp16");
    run_spec straight, first_half, second_half;
    setup_fp16(&straight, 0, 0, CKPT_DIR "_fp16");
    setup_fp16(&first_half, 5, 0, CKPT_DIR "_fp16");   // after 4 skipped steps and 1 clean: growth tracker 1
    mt_expect(run_world(&straight) == 0 && run_world(&first_half) == 0, "training failed");
    setup_fp16(&second_half, 0, 1, CKPT_DIR "_fp16");
    mt_expect(run_world(&second_half) == 0, "resume failed");
    printf("  loss scales:");
    for (int it = 1; it <= STEPS; it++) printf(" %g", (double)straight.scales[it]);
    printf("\n");
    mt_expect(straight.scales[1] == 16777216.0f && straight.scales[3] < straight.scales[1],
              "the scale should start at 2^24 and fall by the save (%g, %g)", (double)straight.scales[1],
              (double)straight.scales[3]);
    mt_expect(second_half.loaded_iteration == 5, "loaded iteration %d, want 5", second_half.loaded_iteration);
    for (int it = 6; it <= STEPS; it++)   // (6: the window's second clean step doubles the scale)
        mt_expect(memcmp(&second_half.losses[it], &straight.losses[it], sizeof(float)) == 0 &&
                  second_half.scales[it] == straight.scales[it],
                  "iteration %d: loss %.9g scale %g after resume, %.9g %g straight", it, (double)second_half.losses[it],
                  (double)second_half.scales[it], (double)straight.losses[it], (double)straight.scales[it]);
    mt_expect(second_half.num_params == straight.num_params &&
              memcmp(second_half.params, straight.params, straight.num_params * sizeof(float)) == 0,
              "parameters after an fp16 resume are not bit-identical to the straight run");
    // converting to another layout carries the scaler's state and the skipped count along
    (void)system("rm -rf " CKPT_DIR "_fp16_1");
    mt_checkpoint_convert(CKPT_DIR "_fp16", CKPT_DIR "_fp16_1", 1, 1, 0);
    mt__ckpt_scaler sc[2];
    const char *dirs[2] = {CKPT_DIR "_fp16", CKPT_DIR "_fp16_1"};
    for (int k = 0; k < 2; k++) {
        mt_config cfg = first_half.cfg;
        cfg.parallel.tensor_model_parallel_size = k ? 1 : 2;
        cfg.parallel.pipeline_model_parallel_size = k ? 1 : 2;
        cfg.parallel.nproc_per_node = k ? 1 : 4;
        mt_config_derive(&cfg);
        mt_rank r;
        mt__shape_rank(&r, &cfg, 0, 0);
        float *host[3];
        for (int j = 0; j < 3; j++) host[j] = (float *)calloc(r.model.num_params + 1, 4);
        long long meta[32];
        char path[MT_PATH_MAX + 128];
        mt_checkpoint_path(path, sizeof path, dirs[k], 5, 0, 0, k ? 1 : 2);
        mt__ckpt_read_file(&r, path, host, meta, &sc[k]);
        for (int j = 0; j < 3; j++) free(host[j]);
    }
    mt_expect(sc[0].has_scaler && sc[1].has_scaler && sc[0].scale == sc[1].scale && sc[0].skipped == sc[1].skipped &&
              sc[0].skipped > 0 && sc[0].growth_tracker == sc[1].growth_tracker &&
              sc[0].hysteresis_tracker == sc[1].hysteresis_tracker,
              "conversion lost the scaler: scale %g -> %g, skipped %lld -> %lld", (double)sc[0].scale, (double)sc[1].scale,
              sc[0].skipped, sc[1].skipped);
    free(straight.params); free(first_half.params); free(second_half.params);
}

// a checkpoint of an older version has neither "skipped_iterations" nor the scaler's keys: renaming
// them in place (same length, the file's offsets unchanged) makes one. An fp32 one resumes bit for
// bit (nothing was skipped); an fp16 one loads with a note and a fresh scale from --initial-loss-scale.
static void age_checkpoint(const char *path) {
    FILE *f = fopen(path, "r+b");
    if (!f) { mt_expect(0, "cannot open %s", path); return; }
    uint64_t n = 0;
    mt_expect(fread(&n, 8, 1, f) == 1 && n < (1u << 20), "header length");
    char *h = (char *)calloc(n + 1, 1);
    mt_expect(fread(h, 1, n, f) == n, "header");
    const char *keys[] = {"\"skipped_iterations\"", "\"grad_scaler.scale\"", "\"grad_scaler.growth_tracker\"",
                          "\"grad_scaler.hysteresis_tracker\""};
    for (int k = 0; k < 4; k++) {
        char *at = strstr(h, keys[k]);
        if (at) at[1] = 'X';   // "Xkipped_iterations": a key no version reads
    }
    fseek(f, 8, SEEK_SET);
    fwrite(h, 1, n, f);
    fclose(f);
    free(h);
}
MT_TEST(older_checkpoints_still_load) {
    (void)system("rm -rf " CKPT_DIR "_old " CKPT_DIR "_old16");
    run_spec straight, first_half, second_half;
    setup(&straight, 2, 2, 1, 0, 0, CKPT_DIR "_old");
    setup(&first_half, 2, 2, 1, 3, 0, CKPT_DIR "_old");
    mt_expect(run_world(&straight) == 0 && run_world(&first_half) == 0, "training failed");
    for (int t = 0; t < 2; t++)
        for (int p = 0; p < 2; p++) {
            char path[256];
            mt_checkpoint_path(path, sizeof path, CKPT_DIR "_old", 3, t, p, 2);
            age_checkpoint(path);
        }
    setup(&second_half, 2, 2, 1, 0, 1, CKPT_DIR "_old");
    mt_expect(run_world(&second_half) == 0, "resume from an older checkpoint failed");
    for (int it = 4; it <= STEPS; it++)
        mt_expect(memcmp(&second_half.losses[it], &straight.losses[it], sizeof(float)) == 0,
                  "iteration %d: an older fp32 checkpoint did not resume bit for bit", it);
    free(straight.params); free(first_half.params); free(second_half.params);
    // fp16: the scale starts again from --initial-loss-scale, training goes on
    setup_fp16(&first_half, 3, 0, CKPT_DIR "_old16");
    mt_expect(run_world(&first_half) == 0, "training failed");
    for (int t = 0; t < 2; t++)
        for (int p = 0; p < 2; p++) {
            char path[256];
            mt_checkpoint_path(path, sizeof path, CKPT_DIR "_old16", 3, t, p, 2);
            age_checkpoint(path);
        }
    setup_fp16(&second_half, 0, 1, CKPT_DIR "_old16");
    mt_expect(run_world(&second_half) == 0, "fp16 resume from an older checkpoint failed");
    mt_expect(second_half.loaded_iteration == 3 && second_half.scales[4] <= 16777216.0f,
              "loaded iteration %d, scale %g", second_half.loaded_iteration, (double)second_half.scales[4]);
    free(first_half.params); free(second_half.params);
}

MT_TEST(no_checkpoint_starts_from_scratch) {
    (void)system("rm -rf build/no_such_ckpt");
    run_spec run;
    setup(&run, 1, 1, 1, 0, 1, "build/no_such_ckpt");
    mt_expect(run_world(&run) == 0, "training failed");
    mt_expect(run.loaded_iteration == 0, "loaded iteration %d from nothing", run.loaded_iteration);
    free(run.params);
}

// a damaged checkpoint, loaded in a child process: exit 1 and a message with `expect`
static void expect_load_error(int tp, const char *expect) {
    fflush(stdout);
    int fds[2];
    if (pipe(fds) != 0) { mt_expect(0, "pipe"); return; }
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], 2);
        close(fds[0]);
        run_spec run;
        setup(&run, tp, 2, 1, 0, 1, CKPT_DIR);
        exit(run_world(&run) == 0 ? 0 : 1);
    }
    close(fds[1]);
    char text[4096];
    size_t n = 0;
    ssize_t k;
    char rest[4096];   // past the first 4 KB: read on, so that the child never dies of SIGPIPE
    for (;;) {
        int full = n == sizeof text - 1;
        k = read(fds[0], full ? rest : text + n, full ? sizeof rest : sizeof text - 1 - n);
        if (k <= 0) break;
        if (!full) n += (size_t)k;
    }
    text[n] = 0;
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    mt_expect(WIFEXITED(status) && WEXITSTATUS(status) == 1, "loading a damaged checkpoint exited with status %d, want 1", status);
    mt_expect(strstr(text, "error: ") && strstr(text, expect), "the error does not say '%s': %s", expect, text);
}

MT_TEST(damaged_checkpoints_are_clear_errors) {
    (void)system("rm -rf " CKPT_DIR);
    run_spec first_half;
    setup(&first_half, 2, 2, 1, 3, 0, CKPT_DIR);
    mt_expect(run_world(&first_half) == 0, "training failed");
    free(first_half.params);
    char path[MT_PATH_MAX + 128];
    // another layout: TP=1 instead of 2 (its file mp_rank_00_000 exists, its metadata says TP=2)
    expect_load_error(1, "tensor_model_parallel_size");
    // truncated: cut the last 100 bytes of one rank's file
    mt_checkpoint_path(path, sizeof path, CKPT_DIR, 3, 1, 1, 2);
    struct stat st;
    stat(path, &st);
    mt_expect(truncate(path, st.st_size - 100) == 0, "truncate");
    expect_load_error(2, "truncated");
    // a broken tracker file
    FILE *f = fopen(CKPT_DIR "/latest_checkpointed_iteration.txt", "w");
    fputs("garbage", f);
    fclose(f);
    expect_load_error(2, "iteration number");
}

// a reference checkpoint for tests/check_safetensors.py: rank 0's file and its raw values
MT_TEST(write_reference_for_safetensors) {
    (void)system("rm -rf build/ckpt_ref");
    run_spec run;
    setup(&run, 2, 1, 1, 2, 0, "build/ckpt_ref");
    mt_expect(run_world(&run) == 0, "training failed");
    free(run.params);
    run_spec reload;   // load it back and dump what was loaded: the python side must read the same
    setup(&reload, 2, 1, 1, 0, 1, "build/ckpt_ref");
    reload.cfg.train.train_iters = 2;
    mt_world *w = mt_world_create(2);
    mt_expect(mt_world_run(w, rank_main, &reload) == 0, "reload failed");
    mt_world_destroy(w);
    FILE *f = fopen("build/ckpt_ref/rank0_params.f32", "wb");
    mt_expect(f && fwrite(reload.params, sizeof(float), reload.num_params, f) == reload.num_params, "dump");
    if (f) fclose(f);
    free(reload.params);
}

// converting a layout: train 3 steps as TP=2 x PP=2, convert, train 3 more in the new layout;
// the losses must be the straight run's (1e-5: other layouts round sums in another order)
static void convert_and_resume(int tp, int pp, int layers_per_virtual, const run_spec *straight) {
    char dst[128];
    snprintf(dst, sizeof dst, CKPT_DIR "_to_%d_%d_%d", tp, pp, layers_per_virtual);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dst);
    (void)system(cmd);
    mt_checkpoint_convert(CKPT_DIR, dst, tp, pp, layers_per_virtual);
    run_spec resumed;
    setup(&resumed, tp, pp, 1, 0, 1, dst);
    resumed.cfg.parallel.num_layers_per_virtual_pipeline_stage = layers_per_virtual;
    mt_config_derive(&resumed.cfg);
    mt_expect(run_world(&resumed) == 0, "resume after converting to TP=%d PP=%d failed", tp, pp);
    char label[128];
    snprintf(label, sizeof label, "losses after converting TP=2 PP=2 -> TP=%d PP=%d%s", tp, pp, layers_per_virtual ? " interleaved" : "");
    mt_check_tensor(label, resumed.losses + 4, straight->losses + 4, 3, 1e-5);
    free(resumed.params);
}

MT_TEST(convert_between_layouts) {
    (void)system("rm -rf " CKPT_DIR);
    run_spec straight, first_half;
    setup(&straight, 2, 2, 1, 0, 0, CKPT_DIR);
    setup(&first_half, 2, 2, 1, 3, 0, CKPT_DIR);
    mt_expect(run_world(&straight) == 0 && run_world(&first_half) == 0, "training failed");
    convert_and_resume(1, 1, 0, &straight);
    convert_and_resume(4, 1, 0, &straight);
    convert_and_resume(1, 4, 0, &straight);
    convert_and_resume(2, 2, 1, &straight);   // interleaved: 2 chunks of 1 layer per stage
    // there and back again: TP=2 PP=2 -> TP=1 PP=1 -> TP=2 PP=2 gives the original files' values
    (void)system("rm -rf " CKPT_DIR "_back");
    mt_checkpoint_convert(CKPT_DIR "_to_1_1_0", CKPT_DIR "_back", 2, 2, 0);
    for (int tp = 0; tp < 2; tp++)
        for (int pp = 0; pp < 2; pp++) {
            mt_rank r;
            mt__shape_rank(&r, &first_half.cfg, tp, pp);
            float *a[3], *b[3];
            for (int k = 0; k < 3; k++) { a[k] = (float *)calloc(r.model.num_params + 1, 4); b[k] = (float *)calloc(r.model.num_params + 1, 4); }
            long long meta[32];
            char path[MT_PATH_MAX + 128];
            mt_checkpoint_path(path, sizeof path, CKPT_DIR, 3, tp, pp, 2);
            mt__ckpt_read_file(&r, path, a, meta, NULL);
            mt_checkpoint_path(path, sizeof path, CKPT_DIR "_back", 3, tp, pp, 2);
            mt__ckpt_read_file(&r, path, b, meta, NULL);
            for (int k = 0; k < 3; k++)
                mt_expect(memcmp(a[k], b[k], r.model.num_params * sizeof(float)) == 0, "tp %d pp %d buffer %d changed in the round trip", tp, pp, k);
            for (int k = 0; k < 3; k++) { free(a[k]); free(b[k]); }
        }
    free(straight.params); free(first_half.params);
}

// Hugging Face export: build/hf_ref/model.safetensors and config.json from the TP=2 reference
// checkpoint, and our logits on a token sequence (from the same weights on one rank) for
// tests/check_hf_export.py, which runs GPT-2 the way transformers does on the exported file
MT_TEST(export_hugging_face) {
    (void)system("rm -rf build/hf_ref build/ckpt_ref_tp1");
    if (mt__ckpt_latest("build/ckpt_ref") == 0) { mt_expect(0, "build/ckpt_ref is missing (write_reference_for_safetensors runs first)"); return; }
    mt_checkpoint_export_hf("build/ckpt_ref", "build/hf_ref");
    mt_checkpoint_convert("build/ckpt_ref", "build/ckpt_ref_tp1", 1, 1, 0);
    run_spec spec;
    setup(&spec, 1, 1, 1, 0, 1, "build/ckpt_ref_tp1");
    mt_world *w = mt_world_create(1);
    mt_rank r;
    mt_rank_init(&r, &spec.cfg, w, 0);
    int64_t valid = 0;
    mt_expect(mt_checkpoint_load(&r, "build/ckpt_ref_tp1", &valid) == 2, "the converted checkpoint is not at iteration 2");
    int B = r.dims.B, T = r.dims.T, V = spec.cfg.model.vocab_size, Vp = spec.cfg.padded_vocab_size;
    mt_activations *a = &r.acts.slots[0];
    a->mb = 0;
    a->sample_offset = 0;
    for (int i = 0; i < B * T; i++) { a->tokens[i] = (int)(mt_hash64(300 + (uint64_t)i) % (uint64_t)V); a->targets[i] = 0; }
    r.state.training = 0;
    mt__forward_chunk(&r, a, 0);
    FILE *f = fopen("build/hf_ref/ours_logits.bin", "wb");
    int32_t dims[3] = {B, T, V};
    int ok = f && fwrite(dims, 4, 3, f) == 3 && fwrite(a->tokens, 4, (size_t)B * T, f) == (size_t)B * T;
    for (int i = 0; i < B * T && ok; i++) ok = fwrite(a->logits + (size_t)i * Vp, 4, (size_t)V, f) == (size_t)V;
    if (f) fclose(f);
    mt_expect(ok, "writing build/hf_ref/ours_logits.bin failed");
    mt_rank_free(&r);
    mt_world_destroy(w);
}

int main(void) {
    alarm(300);
    mt_run_test(resume_is_bit_exact);
    mt_run_test(resume_with_another_dp);
    mt_run_test(distributed_optimizer_checkpoints);
    mt_run_test(fp16_resume_is_bit_exact);
    mt_run_test(finetune_and_no_load_optim_load_the_parameters_only);
    mt_run_test(older_checkpoints_still_load);
    mt_run_test(no_checkpoint_starts_from_scratch);
    mt_run_test(damaged_checkpoints_are_clear_errors);
    mt_run_test(write_reference_for_safetensors);
    mt_run_test(convert_between_layouts);
    mt_run_test(export_hugging_face);
    return mt_test_summary();
}

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
    float *params;            // rank 0's parameters at the end (host copy)
    size_t num_params;
    int loaded_iteration;
} run_spec;

static void rank_main(mt_world *w, int rank, void *arg) {
    run_spec *run = (run_spec *)arg;
    mt_rank r;
    mt_rank_init(&r, &run->cfg, w, rank);
    int first = 1;
    if (run->load) {
        int64_t valid = 0;
        int it = mt_checkpoint_load(&r, run->dir, &valid);
        if (rank == 0) run->loaded_iteration = it;
        first = it + 1;
    }
    for (int it = first; it <= run->cfg.train.train_iters; it++) {
        mt_step_result res = mt_train_step(&r, synthetic_batch, NULL, it);
        if (rank == 0) run->losses[it] = res.loss;
        if (it == run->save_at) mt_checkpoint_save(&r, run->dir, it, 1234);
    }
    if (rank == 0) {
        run->num_params = r.num_params;
        run->params = (float *)malloc(r.num_params * sizeof(float));
        memcpy(run->params, r.params_memory, r.num_params * sizeof(float));
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
    while ((k = read(fds[0], text + n, sizeof text - 1 - n)) > 0) n += (size_t)k;
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

int main(void) {
    alarm(300);
    mt_run_test(resume_is_bit_exact);
    mt_run_test(resume_with_another_dp);
    mt_run_test(no_checkpoint_starts_from_scratch);
    mt_run_test(damaged_checkpoints_are_clear_errors);
    mt_run_test(write_reference_for_safetensors);
    return mt_test_summary();
}

/* tests/test_hostile.c - hostile inputs and faults (issue 14): no crash, no hang, nothing lost.
 *
 * Each case runs ./train_gpt or ./preprocess as a user would, with a bad flag, a damaged file
 * or a fault, and expects one clear error: exit status 1 (not a signal: 134 abort, 136 SIGFPE,
 * 139 SIGSEGV), "error: " and a word naming the cause on stderr, and files already on disk
 * untouched. Every case here crashed, hung or was silently accepted before its fix.
 */
#define MEGATRON_IMPLEMENTATION
#include "../megatron.h"
#include "harness.h"
#include <sys/stat.h>
#include <sys/wait.h>

#define DIR "build/hostile"
#define DATA DIR "/data"
// a tiny model that trains in well under a second on one core
#define TINY "./train_gpt --num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 " \
             "--micro-batch-size 2 --global-batch-size 4 --vocab-size 101 --log-interval 1 --eval-iters 0 "

static char out_text[65536];

// MT_BIN_DIR=build/asan (make test-sanitize) runs the sanitizer builds of ./train_gpt and
// ./preprocess instead; then any sanitizer report in their output is a failure too
static const char *bin_dir(void) {
    const char *d = getenv("MT_BIN_DIR");
    return d && d[0] ? d : NULL;
}

// runs cmd (through sh, with a 60 s limit so that a hang fails instead of blocking the suite),
// stdout and stderr into out_text; returns the exit status (128 + signal for a signal)
static int run(const char *cmd) {
    char full[8192], with_bins[6144] = "";
    const char *d = bin_dir();
    for (const char *p = cmd; *p && strlen(with_bins) + 300 < sizeof with_bins;) {   // ./train_gpt -> DIR/train_gpt
        if (d && (strncmp(p, "./train_gpt ", 12) == 0 || strncmp(p, "./preprocess ", 13) == 0)) {
            strcat(with_bins, d);
            strcat(with_bins, "/");
            p += 2;
            continue;
        }
        size_t l = strlen(with_bins);
        with_bins[l] = *p++;
        with_bins[l + 1] = 0;
    }
    snprintf(full, sizeof full, "timeout -s KILL 60 sh -c '%s' > " DIR "/out.txt 2>&1", with_bins);
    int rc = system(full);
    FILE *f = fopen(DIR "/out.txt", "r");
    out_text[0] = 0;
    if (f) { size_t n = fread(out_text, 1, sizeof out_text - 1, f); out_text[n] = 0; fclose(f); }
    mt_expect(!strstr(out_text, "Sanitizer") && !strstr(out_text, "runtime error:"),
              "a sanitizer reported on '%s':\n%.3000s", cmd, out_text);
    if (WIFSIGNALED(rc)) return 128 + WTERMSIG(rc);
    return WEXITSTATUS(rc);
}

// the command must fail with exit status 1, "error: " and `want` in its output
static void expect_error(const char *cmd, const char *want) {
    int rc = run(cmd);
    mt_expect(rc == 1, "'%s' exited with %d, want 1 (a clear error); output:\n%.400s", cmd, rc, out_text);
    mt_expect(strstr(out_text, "error: ") && strstr(out_text, want), "'%s' printed:\n%.400s\n(want '%s')", cmd,
              out_text, want);
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (f) { fputs(text, f); fclose(f); }
}

static long file_size(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

static int same_file_bytes(const char *a, const char *b) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "cmp -s %s %s", a, b);
    return system(cmd) == 0;
}

static void write_dataset(const char *prefix, int V, int ndocs) {
    mt_indexed_builder *b = mt_indexed_builder_open(prefix, mt_dtype_for_vocab(V));
    int32_t doc[400];
    for (int d = 0; d < ndocs; d++) {
        int n = 50 + (int)(mt_hash64((uint64_t)d) % 300);
        for (int i = 0; i < n; i++) doc[i] = (d + 3 * i) % V;
        mt_indexed_builder_add_document(b, doc, (size_t)n);
    }
    mt_indexed_builder_finish(b);
}

// a checkpoint at iteration 2 in DIR/ckpt (TP=1, PP=2, so the converter has stages to split)
static void make_checkpoint(void) {
    (void)system("rm -rf " DIR "/ckpt");
    int rc = run(TINY "--train-iters 2 --data-path " DATA " --save " DIR "/ckpt "
                 "--pipeline-model-parallel-size 2 --nproc-per-node 2");
    mt_expect(rc == 0, "making the test checkpoint failed (%d):\n%s", rc, out_text);
}

// 1. a source checkpoint is never a destination, however it is spelled; an existing checkpoint
//    directory is not overwritten unless asked
MT_TEST(convert_never_overwrites_a_checkpoint) {
    make_checkpoint();
    const char *file = DIR "/ckpt/iter_0000002/mp_rank_00_000/model_optim_rng.safetensors";
    (void)system("cp " DIR "/ckpt/iter_0000002/mp_rank_00_000/model_optim_rng.safetensors " DIR "/before.st");
    expect_error(TINY "--convert-checkpoint --load " DIR "/ckpt --save " DIR "/ckpt/", "same");
    expect_error(TINY "--convert-checkpoint --load " DIR "/ckpt --save " DIR "/../hostile/ckpt", "same");
    mt_expect(same_file_bytes(file, DIR "/before.st"), "the source checkpoint changed");
    // into another run's checkpoint directory: refused, unless --overwrite
    (void)system("rm -rf " DIR "/other && cp -r " DIR "/ckpt " DIR "/other");
    expect_error(TINY "--convert-checkpoint --load " DIR "/ckpt --save " DIR "/other", "--overwrite");
    int rc = run(TINY "--convert-checkpoint --load " DIR "/ckpt --save " DIR "/other --overwrite");
    mt_expect(rc == 0, "--overwrite did not convert (%d): %s", rc, out_text);
    // a new run (no --load) saving into an old run's --save directory
    expect_error(TINY "--train-iters 2 --data-path " DATA " --save " DIR "/ckpt "
                 "--pipeline-model-parallel-size 2 --nproc-per-node 2", "--overwrite");
    mt_expect(same_file_bytes(file, DIR "/before.st"), "the old run's checkpoint changed");
}

// 2. heap overflows: the export's buffer, a negative MLP size
MT_TEST(no_heap_overflows) {
    (void)system("rm -rf " DIR "/ck4096 " DIR "/hf");
    int rc = run(TINY "--train-iters 1 --data-path " DATA " --max-position-embeddings 4096 --save " DIR "/ck4096");
    mt_expect(rc == 0, "training with 4096 positions failed (%d): %s", rc, out_text);
    rc = run(TINY "--load " DIR "/ck4096 --export-hf " DIR "/hf");
    mt_expect(rc == 0, "export with 4096 positions exited %d: %s", rc, out_text);
    mt_expect(file_size(DIR "/hf/model.safetensors") > 4096L * 32 * 4, "no model.safetensors");
    expect_error(TINY "--train-iters 1 --data-path " DATA " --ffn-hidden-size -4", "--ffn-hidden-size");
}

// 3. division by zero: the vocabulary's padding multiple, from a flag or from a checkpoint
MT_TEST(no_division_by_zero) {
    expect_error(TINY "--train-iters 1 --data-path " DATA " --make-vocab-size-divisible-by 0",
                 "--make-vocab-size-divisible-by");
    expect_error(TINY "--train-iters 1 --data-path " DATA " --make-vocab-size-divisible-by -128",
                 "--make-vocab-size-divisible-by");
}

// 4. recursion: a config that names itself; deep nesting in a safetensors header
MT_TEST(no_stack_overflows) {
    write_text(DIR "/self.json", "{\"config\": \"" DIR "/self.json\"}");
    expect_error(TINY "--config " DIR "/self.json", "config");
    // a safetensors header nested 200k levels deep, then load and convert
    make_checkpoint();
    const char *file = DIR "/ckpt/iter_0000002/mp_rank_00_000/model_optim_rng.safetensors";
    size_t depth = 200000, len = 2 * depth;
    char *deep = (char *)malloc(len + 8);
    uint64_t hl = len;
    memcpy(deep, &hl, 8);
    for (size_t i = 0; i < depth; i++) { deep[8 + i] = '['; deep[8 + depth + i] = ']'; }
    FILE *f = fopen(file, "wb");
    if (f) { fwrite(deep, 1, len + 8, f); fclose(f); }
    free(deep);
    expect_error(TINY "--train-iters 3 --data-path " DATA " --load " DIR "/ckpt --pipeline-model-parallel-size 2 "
                 "--nproc-per-node 2", "deep");
    expect_error(TINY "--convert-checkpoint --load " DIR "/ckpt --save " DIR "/conv_deep", "deep");
}

// 4. metadata with a damaged consumed_valid_samples
static void set_metadata(const char *file, const char *key, const char *value) {
    // rewrites "key":"old" in the header as "key":"value"; the header is padded again to a
    // multiple of 8 bytes and the data follows it unchanged
    FILE *f = fopen(file, "rb");
    if (!f) return;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *all = (char *)malloc((size_t)size + 1);
    size_t got = fread(all, 1, (size_t)size, f);
    fclose(f);
    uint64_t hl = 0;
    memcpy(&hl, all, 8);
    if (got != (size_t)size || hl > (uint64_t)size - 8) { free(all); return; }
    char *h = (char *)calloc(hl + 256, 1);
    memcpy(h, all + 8, hl);
    while (hl > 0 && h[hl - 1] == ' ') h[--hl] = 0;
    char pat[128];
    snprintf(pat, sizeof pat, "\"%s\":\"", key);
    char *p = strstr(h, pat);
    if (p) {
        char *v = p + strlen(pat), *e = strchr(v, '"');
        char *rest = strdup(e);
        sprintf(v, "%s%s", value, rest);
        free(rest);
    }
    size_t nl = strlen(h);
    while (nl % 8) h[nl++] = ' ';
    uint64_t new_hl = nl;
    f = fopen(file, "wb");
    if (f) {
        fwrite(&new_hl, 8, 1, f);
        fwrite(h, 1, nl, f);
        fwrite(all + 8 + (size_t)(memcpy(&hl, all, 8), hl), 1, (size_t)size - 8 - (size_t)hl, f);
        fclose(f);
    }
    free(h);
    free(all);
}

static void make_checkpoint_pp1(const char *extra) {
    char cmd[2048];
    (void)system("rm -rf " DIR "/ck1");
    snprintf(cmd, sizeof cmd, TINY "--train-iters 2 --data-path " DATA " --save " DIR "/ck1 %s", extra);
    int rc = run(cmd);
    mt_expect(rc == 0, "making the test checkpoint failed (%d):\n%s", rc, out_text);
}
#define CK1 DIR "/ck1/iter_0000002/mp_rank_00/model_optim_rng.safetensors"
#define RESUME TINY "--train-iters 3 --eval-iters 1 --split 50,50,0 --data-path " DATA " --load " DIR "/ck1"

MT_TEST(damaged_checkpoint_metadata) {
    const char *bad_valid[] = {"-1000", "9223372036854775807"};
    for (int k = 0; k < 2; k++) {
        make_checkpoint_pp1("");
        set_metadata(CK1, "consumed_valid_samples", bad_valid[k]);
        expect_error(RESUME, "consumed_valid_samples");
    }
    make_checkpoint_pp1("");
    set_metadata(CK1, "iteration", "7");
    expect_error(RESUME, "iteration");
    make_checkpoint_pp1("");
    set_metadata(CK1, "optimizer_step", "-5");
    expect_error(RESUME, "optimizer_step");
    make_checkpoint_pp1("");
    set_metadata(CK1, "optimizer_step", "99999999999");
    expect_error(RESUME, "optimizer_step");
    // a tracker that is not a plain number blames the tracker, not the layout
    make_checkpoint_pp1("");
    write_text(DIR "/ck1/latest_checkpointed_iteration.txt", "1e3");
    expect_error(RESUME, "latest_checkpointed_iteration.txt");
    // pipeline_model_parallel_size 0 in a converter's source: no SIGFPE
    make_checkpoint_pp1("");
    set_metadata(CK1, "pipeline_model_parallel_size", "0");
    expect_error(TINY "--convert-checkpoint --load " DIR "/ck1 --save " DIR "/conv0", "pipeline_model_parallel_size");
    make_checkpoint_pp1("");
    set_metadata(CK1, "make_vocab_size_divisible_by", "0");
    expect_error(TINY "--load " DIR "/ck1 --export-hf " DIR "/hf0", "make_vocab_size_divisible_by");
}

// 10. nonsense values: one clear error each
MT_TEST(nonsense_flags_are_errors) {
    struct { const char *args, *want; } cases[] = {
        {"--nproc-per-node -4", "--nproc-per-node"},
        {"--hidden-dropout nan", "--hidden-dropout"},
        {"--temperature nan", "--temperature"},
        {"--temperature -1", "--temperature"},
        {"--lr nan", "--lr"},
        {"--lr inf", "--lr"},
        {"--init-method-std nan", "--init-method-std"},
        {"--seed -1", "--seed"},
        {"--seed 1e30", "--seed"},
        {"--ddp-bucket-size 1e30", "--ddp-bucket-size"},
        {"--hidden-size 1000000000 --num-attention-heads 1", "--hidden-size"},
        {"--tokens-to-generate 2147483647", "--tokens-to-generate"},
        {"--eval-iters -3", "--eval-iters"},
        {"--save-interval -1", "--save-interval"},
        {"--adam-beta2 1.5", "--adam-beta2"},
        {"--lr-warmup-fraction 2", "--lr-warmup-fraction"},
        {"--micro-batch-size 2000000", "out of range"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char cmd[1024];
        snprintf(cmd, sizeof cmd, TINY "--train-iters 1 --data-path " DATA " %s", cases[k].args);
        expect_error(cmd, cases[k].want);
    }
}

MT_TEST(nonsense_config_files_are_errors) {
    struct { const char *text, *want; } cases[] = {
        {"{\"hidden_size\": true}", "hidden_size"},
        {"{\"print_layout\": 5}", "print_layout"},
        {"{\"num_layers\": 2} garbage", "after"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        write_text(DIR "/bad.json", cases[k].text);
        expect_error(TINY "--train-iters 1 --data-path " DATA " --config " DIR "/bad.json", cases[k].want);
    }
    // a 5000-character path is an error, not cut short
    char text[6000] = "{\"save\": \"";
    for (int i = 0; i < 5000; i++) strcat(text, "a");
    strcat(text, "\"}");
    write_text(DIR "/bad.json", text);
    expect_error(TINY "--train-iters 1 --data-path " DATA " --config " DIR "/bad.json", "too long");
    expect_error(TINY "--train-iters 1 --data-path " DATA " --config " DIR, "directory");
}

// 7. a NaN loss: no NaN checkpoint, a bounded number of NaN iterations, a non-zero exit
MT_TEST(nan_loss_stops_training) {
    (void)system("rm -rf " DIR "/nan");
    int rc = run(TINY "--train-iters 40 --data-path " DATA " --lr 1e30 --save " DIR "/nan --save-interval 1");
    mt_expect(rc == 1, "a NaN run exited %d, want 1: %.3000s", rc, out_text);
    mt_expect(strstr(out_text, "learning rate") != NULL, "the message does not name the learning rate: %.3000s",
              out_text);
    mt_expect(strstr(out_text, " iteration       40/") == NULL, "trained to the end on NaN");
    mt_expect(strstr(out_text, "PPL: 1.0") == NULL, "prints a PPL for a NaN loss");
    // what was saved is finite: every checkpoint's parameters load and train
    FILE *t = fopen(DIR "/nan/latest_checkpointed_iteration.txt", "r");
    int it = 0;
    if (t) { if (fscanf(t, "%d", &it) != 1) it = -1; fclose(t); }
    mt_expect(it <= 1, "the tracker moved to iteration %d, past the last finite state", it);
}

// 6. preprocess: a worker thread that cannot start is an error (or fewer workers), not a hang.
//    ulimit -v 28000 (KB) leaves room for the tokenizer but not for the threads' 8 MB stacks here;
//    on another machine it may fail earlier (out of memory: also a clear error) or not at all (0)
MT_TEST(preprocess_without_threads) {
    if (bin_dir()) return;   // a sanitizer build reserves terabytes of address space: ulimit -v stops it at once
    write_text(DIR "/in.jsonl", "{\"text\": \"hello world\"}\n{\"text\": \"again\"}\n");
    int rc = run("ulimit -v 28000; timeout 20 ./preprocess --input " DIR "/in.jsonl --output-prefix " DIR "/pp "
                 "--vocab-file data/gpt2-vocab.json --merge-file data/gpt2-merges.txt "
                 "--tokenizer-type GPT2BPETokenizer --workers 8");
    mt_expect(rc == 0 || (rc == 1 && strstr(out_text, "error: ")),
              "preprocess under ulimit -v exited %d (124: a hang): %.600s", rc, out_text);
    mt_expect(system("ls " DIR " | grep -q '\\.tmp\\.'") != 0, "a temporary was left in " DIR);
}

// 8. no temporary outlives an error: a save that hits the file size limit (as a full disk
//    would: EFBIG instead of ENOSPC) on two ranks at once, and a preprocess run whose second
//    --json-keys output fails; then a kill in the middle of a save leaves one that the next run
//    removes, saying so
static int count_temporaries(const char *dir) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "find %s -name '*.tmp.*' 2>/dev/null | wc -l > " DIR "/count.txt", dir);
    if (system(cmd) != 0) return -1;
    FILE *f = fopen(DIR "/count.txt", "r");
    int n = -1;
    if (f) { if (fscanf(f, "%d", &n) != 1) n = -1; fclose(f); }
    return n;
}

MT_TEST(no_temporaries_left_behind) {
    (void)system("rm -rf " DIR "/full");
    // 30 k parameters x 3 buffers x 4 bytes = 360 KB per file; 64 blocks (32 or 64 KB) do not hold it
    expect_error("trap \"\" XFSZ; ulimit -f 64; " TINY "--train-iters 2 --data-path " DATA " --save " DIR "/full "
                 "--pipeline-model-parallel-size 2 --nproc-per-node 2", "failed");
    mt_expect(count_temporaries(DIR "/full") == 0, "%d temporaries left after a failed save",
              count_temporaries(DIR "/full"));
    // preprocess with two keys: the second one's output cannot be created (its name has a '/' into a
    // directory that does not exist) after the first one's is open; then a line lacks the second key
    write_text(DIR "/two.jsonl", "{\"text\": \"hello\", \"title\": \"a\"}\n{\"text\": \"again\"}\n");
    expect_error("./preprocess --input " DIR "/two.jsonl --output-prefix " DIR "/two --vocab-file data/gpt2-vocab.json "
                 "--merge-file data/gpt2-merges.txt --tokenizer-type GPT2BPETokenizer --json-keys text no/such",
                 "cannot create");
    mt_expect(system("ls " DIR " | grep -q '^two_.*tmp'") != 0, "preprocess left a temporary");
    expect_error("./preprocess --input " DIR "/two.jsonl --output-prefix " DIR "/two --vocab-file data/gpt2-vocab.json "
                 "--merge-file data/gpt2-merges.txt --tokenizer-type GPT2BPETokenizer --json-keys text title",
                 "title");
    mt_expect(system("ls " DIR " | grep -q '^two_.*tmp'") != 0, "preprocess left a temporary");
    // a stale temporary of a dead process (as a kill leaves it) is removed by the next run
    make_checkpoint();
    write_text(DIR "/ckpt/iter_0000002/mp_rank_00_000/model_optim_rng.safetensors.tmp.999999999", "partial");
    int rc = run(TINY "--train-iters 3 --data-path " DATA " --load " DIR "/ckpt --save " DIR "/ckpt "
                 "--pipeline-model-parallel-size 2 --nproc-per-node 2");
    mt_expect(rc == 0, "resume failed (%d): %.600s", rc, out_text);
    mt_expect(count_temporaries(DIR "/ckpt") == 0, "the stale temporary is still there");
    mt_expect(strstr(out_text, "removed ") && strstr(out_text, ".tmp.999999999"), "the removal was not reported");
}

// 12. a bit flipped in a checkpoint's tensor data is found on load (and by the converter)
MT_TEST(checkpoint_bit_flips_are_found) {
    make_checkpoint_pp1("");
    FILE *f = fopen(CK1, "r+b");
    mt_expect(f != NULL, "no checkpoint file");
    if (!f) return;
    uint64_t hl = 0;
    mt_expect(fread(&hl, 8, 1, f) == 1, "read");
    long at = 8 + (long)hl + 1000;   // byte 1000 of the data: inside wte (128 x 32 floats)
    fseek(f, at, SEEK_SET);
    int c = fgetc(f);
    fseek(f, at, SEEK_SET);
    fputc(c ^ 0x10, f);              // one bit
    fclose(f);
    expect_error(RESUME, "damaged");
    expect_error(TINY "--convert-checkpoint --load " DIR "/ck1 --save " DIR "/conv_flip", "damaged");
}

// 5. an index whose document's sequences are not adjacent in .bin: an error at open, not a read
//    past the mapping. The last document is made of the last two sequences, and the first of them
//    is pointed at the second's bytes, so walking the document would run off the end of .bin.
MT_TEST(idx_with_non_adjacent_sequences) {
    write_dataset(DIR "/adj", 101, 10);
    FILE *f = fopen(DIR "/adj.idx", "r+b");
    mt_expect(f != NULL, "no index");
    if (!f) return;
    uint64_t S = 0, D = 0;
    fseek(f, 18, SEEK_SET);
    mt_expect(fread(&S, 8, 1, f) == 1 && fread(&D, 8, 1, f) == 1 && S == 10 && D == 11, "unexpected header");
    long lengths = 34, pointers = lengths + (long)S * 4, docs = pointers + (long)S * 8;
    int64_t last_ptr, second_last_doc = (int64_t)S - 2;
    fseek(f, pointers + (long)(S - 1) * 8, SEEK_SET);
    mt_expect(fread(&last_ptr, 8, 1, f) == 1, "read");
    fseek(f, pointers + (long)(S - 2) * 8, SEEK_SET);
    fwrite(&last_ptr, 8, 1, f);                       // sequence S-2 now starts where S-1 does
    fseek(f, docs + (long)(D - 2) * 8, SEEK_SET);
    fwrite(&second_last_doc, 8, 1, f);                // document D-3 empty: the last holds S-2 and S-1
    fseek(f, docs + (long)(D - 3) * 8, SEEK_SET);
    fwrite(&second_last_doc, 8, 1, f);
    fclose(f);
    expect_error(TINY "--train-iters 2 --data-path " DIR "/adj", "not adjacent");
}

int main(void) {
    alarm(600);
    (void)system("mkdir -p " DIR);
    write_dataset(DATA, 101, 40);
    mt_run_test(convert_never_overwrites_a_checkpoint);
    mt_run_test(no_heap_overflows);
    mt_run_test(no_division_by_zero);
    mt_run_test(no_stack_overflows);
    mt_run_test(damaged_checkpoint_metadata);
    mt_run_test(nonsense_flags_are_errors);
    mt_run_test(nonsense_config_files_are_errors);
    mt_run_test(nan_loss_stops_training);
    mt_run_test(idx_with_non_adjacent_sequences);
    mt_run_test(no_temporaries_left_behind);
    mt_run_test(checkpoint_bit_flips_are_found);
    mt_run_test(preprocess_without_threads);
    return mt_test_summary();
}

/* tests/fuzz_parsers.c - libFuzzer harness for every parser of outside data (issue 14).
 *
 * The first byte of an input picks the parser, the rest is the file it reads:
 *   0 the JSON reader (skip, find, strings)      4 vocab.json + merges.txt (4-byte length, vocab, merges)
 *   1 a --config file, then mt_config_derive     5 latest_checkpointed_iteration.txt
 *   2 a checkpoint file (at iteration 2)         6 the flag parser (arguments separated by NUL bytes)
 *   3 an .idx + .bin pair (4-byte length of .idx, the .idx, the .bin), then every token read
 *   7 a DeepSpeed config (--deepspeed_config), mapped onto the defaults, then mt_config_derive
 * A clear error is fine: built with -DMT_FATAL_JMP, mt_fatal returns here by longjmp. A crash, a
 * hang, a sanitizer report or a read out of bounds is a failure. Run by `make fuzz`
 * (FUZZ_SECONDS=N per run; CI runs it briefly); the seed corpus is made from real files by
 * tests/fuzz_seeds.py. An input that fails goes into tests/fuzz_cases/, which `make fuzz` replays.
 */
#define MT_FATAL_JMP
#define MEGATRON_IMPLEMENTATION
#include "../megatron.h"
#include <sys/stat.h>

static char dir[256];

static void write_file(const char *path, const uint8_t *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return;
    if (n) fwrite(data, 1, n, f);
    fclose(f);
}

static uint32_t length_prefix(const uint8_t *data, size_t n) {   // the first part's length, cut to n
    if (n < 4) return 0;
    uint32_t l = (uint32_t)data[0] | (uint32_t)data[1] << 8 | (uint32_t)data[2] << 16 | (uint32_t)data[3] << 24;
    return l > n - 4 ? (uint32_t)(n - 4) : l;
}

static void fuzz_json(const uint8_t *data, size_t n) {
    mt_json j;
    mt_json_init(&j, (const char *)data, n, n > 0 && (data[0] & 1));
    mt_json_skip(&j);
    mt_json_init(&j, (const char *)data, n, 1);
    if (mt_json_eat(&j, '{')) { j.p--; mt_json_find(&j, "text"); }
    char *out = (char *)malloc(n + 1);
    size_t len;
    const char *p = (const char *)data;
    mt_json_string(&p, (const char *)data + n, out, &len);
    free(out);
}

static void fuzz_checkpoint(const uint8_t *data, size_t n) {
    char path[512];
    snprintf(path, sizeof path, "mkdir -p %s/ck/iter_0000002/mp_rank_00 && printf 2 > "
             "%s/ck/latest_checkpointed_iteration.txt", dir, dir);
    if (system(path) != 0) return;
    snprintf(path, sizeof path, "%s/ck/iter_0000002/mp_rank_00/model_optim_rng.safetensors", dir);
    write_file(path, data, n);
    snprintf(path, sizeof path, "%s/ck", dir);
    mt__full_checkpoint full;
    mt__ckpt_read_full(path, &full);
    mt__ckpt_free_full(&full);
}

static void fuzz_idx(const uint8_t *data, size_t n) {
    uint32_t l = length_prefix(data, n);
    char path[512];
    snprintf(path, sizeof path, "%s/d.idx", dir);
    write_file(path, data + 4, l);
    snprintf(path, sizeof path, "%s/d.bin", dir);
    write_file(path, data + 4 + l, n - 4 - l);
    snprintf(path, sizeof path, "%s/d", dir);
    mt_indexed_dataset d;
    mt_indexed_dataset_open(&d, path);
    int64_t sum = 0;
    for (int64_t doc = 0; doc < (int64_t)d.num_documents; doc++) {
        int64_t len = mt_indexed_dataset_doc_length(&d, doc);
        for (int64_t pos = 0; pos < len; pos++) sum += mt_indexed_dataset_token(&d, doc, pos);
    }
    mt_indexed_dataset_close(&d);
    (void)sum;
}

static void fuzz_tokenizer(const uint8_t *data, size_t n) {
    uint32_t l = length_prefix(data, n);
    char vocab[512], merges[512];
    snprintf(vocab, sizeof vocab, "%s/vocab.json", dir);
    snprintf(merges, sizeof merges, "%s/merges.txt", dir);
    write_file(vocab, data + 4, l);
    write_file(merges, data + 4 + l, n - 4 - l);
    mt_tokenizer t;
    mt_tokenizer_load(&t, vocab, merges);
    mt_int_list ids = {NULL, 0, 0};
    const char *text = "Hello world, it's 2026!\n";
    mt_tokenizer_encode(&t, NULL, text, strlen(text), &ids);
    mt_int_list_free(&ids);
    mt_tokenizer_free(&t);
}

static void fuzz_flags(const uint8_t *data, size_t n) {
    char *copy = (char *)malloc(n + 1);
    memcpy(copy, data, n);
    copy[n] = 0;
    char *argv[65] = {(char *)"train_gpt"};
    int argc = 1;
    for (size_t i = 0; i < n && argc < 64;) {   // NUL-separated arguments
        argv[argc++] = copy + i;
        i += strlen(copy + i) + 1;
    }
    for (int i = 1; i < argc; i++)   // --help prints and exits by design
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h") || !strncmp(argv[i], "--config", 8)) {
            free(copy);
            return;
        }
    mt_config cfg;
    mt_config_defaults(&cfg);
    mt_config_parse(&cfg, argc, argv);
    mt_config_derive(&cfg);
    free(copy);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/mt_fuzz_%ld", (long)getpid());
        mkdir(dir, 0755);
    }
    if (size < 1) return 0;
    int which = data[0] % 8;
    data++, size--;
    jmp_buf env;
    mt_fatal_jmp = &env;
    if (setjmp(env) == 0) {
        char path[512];
        mt_config cfg;
        switch (which) {
        case 0: fuzz_json(data, size); break;
        case 1:
            snprintf(path, sizeof path, "%s/config.json", dir);
            write_file(path, data, size);
            mt_config_defaults(&cfg);
            mt_config_load_json(&cfg, path);
            mt_config_derive(&cfg);
            break;
        case 2: fuzz_checkpoint(data, size); break;
        case 3: fuzz_idx(data, size); break;
        case 4: fuzz_tokenizer(data, size); break;
        case 5:
            snprintf(path, sizeof path, "%s/latest_checkpointed_iteration.txt", dir);
            write_file(path, data, size);
            mt__ckpt_latest(dir);
            break;
        case 7:
            snprintf(path, sizeof path, "%s/ds_config.json", dir);
            write_file(path, data, size);
            mt_config_defaults(&cfg);
            mt_config_load_deepspeed(&cfg, path, 0, NULL, NULL, 0);
            mt_config_derive(&cfg);
            break;
        default: fuzz_flags(data, size); break;
        }
    }
    mt_fatal_jmp = NULL;
    return 0;
}

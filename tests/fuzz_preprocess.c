/* tests/fuzz_preprocess.c - libFuzzer harness for preprocess's own readers (issue 14).
 *
 * preprocess.c keeps its readers static, so this file includes it whole (its main renamed) and
 * drives them the way a run does. The first byte of an input picks the reader, the second its
 * options, the rest is the input file:
 *   0 JSON lines: the line reader cuts the input into documents (fill_batch, blank lines
 *     skipped, a UTF-8 BOM dropped), then process_batch parses each line (--json-keys text, or
 *     text and title by option bit 0; --skip-bad-lines by bit 1) and encodes what it found with
 *     GPT-2's real BPE (data/gpt2-vocab.json, data/gpt2-merges.txt, loaded once)
 *   1 plain text: the same with --input-format text (blocks of lines; --split-lines-docs by bit 0)
 *   2 preprocess's flag parser (arguments separated by NUL bytes)
 * A clear error is fine: built with -DMT_FATAL_JMP, mt_fatal returns here by longjmp. A crash, a
 * hang, a sanitizer report or a read out of bounds is a failure. Run by `make fuzz` next to
 * tests/fuzz_parsers.c; seeds: data/corpus.jsonl's first lines and the .txt tests' inputs
 * (tests/fuzz_seeds.py --preprocess). Run from the repository root (the vocabulary's path).
 */
#define MT_FATAL_JMP
#define main preprocess_main
#include "../preprocess.c"
#undef main

static mt_tokenizer fz_tok;
static char fz_path[256];
static FILE *fz_open;   // the input being read: closed at the next input if an error jumped out
static mt_bpe_cache fz_cache;   // kept across inputs, as a worker keeps its own across batches

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc; (void)argv;
    const char *root = getenv("MT_FUZZ_ROOT");   // make fuzz runs the fuzzers from build/fuzz
    char vocab[512], merges[512];
    snprintf(vocab, sizeof vocab, "%s/data/gpt2-vocab.json", root ? root : ".");
    snprintf(merges, sizeof merges, "%s/data/gpt2-merges.txt", root ? root : ".");
    mt_tokenizer_load(&fz_tok, vocab, merges);
    snprintf(fz_path, sizeof fz_path, "/tmp/mt_fuzz_pp_%ld.txt", (long)getpid());
    return 0;
}

static void fuzz_documents(const uint8_t *data, size_t n, int format, int options) {
    if (fz_open) { fclose(fz_open); fz_open = NULL; }
    FILE *f = fopen(fz_path, "wb");
    if (!f) return;
    if (n) fwrite(data, 1, n, f);
    fclose(f);
    pp_args a;
    memset(&a, 0, sizeof a);
    a.input = fz_path;
    a.json_keys[0] = "text";
    a.n_keys = 1;
    if (format == PP_JSON && (options & 1)) { a.json_keys[1] = "title"; a.n_keys = 2; }
    a.skip_bad_lines = (options & 2) != 0;
    a.split_lines_docs = format == PP_TEXT && (options & 1);
    a.append_eod = 1;
    a.input_format = format;
    pp_reader r;
    memset(&r, 0, sizeof r);
    r.path = fz_path;
    r.f = fz_open = fopen(fz_path, "rb");
    if (!r.f) return;
    r.cap = 64;   // small: lines longer than the buffer exercise its growth
    r.buf = (char *)mt_malloc(r.cap, "fuzz reader");
    pp_batch b;
    memset(&b, 0, sizeof b);
    uint64_t blank = 0;
    while (fill_batch(&b, &r, &a, &blank)) {
        process_batch(&b, &a, &fz_tok, &fz_cache);
        if (b.failed) break;   // a bad line without --skip-bad-lines: the run stops here
        for (int k = 0; k < a.n_keys; k++) {   // the per-document counts add up to what was produced
            size_t sum = 0;
            for (size_t d = 0; d < b.n_docs; d++)
                if (!b.bad[d]) sum += b.ntok[d * (size_t)a.n_keys + (size_t)k];
            if (sum != b.tokens[k].len) abort();
        }
    }
    fclose(r.f);
    fz_open = NULL;
    free(r.buf);
    free(b.text); free(b.off); free(b.line); free(b.ntok); free(b.bad);
    for (int k = 0; k < PP_MAX_KEYS; k++) mt_int_list_free(&b.tokens[k]);
}

static void fuzz_flags(const uint8_t *data, size_t n) {
    char *copy = (char *)mt_malloc(n + 1, "fuzz flags");
    memcpy(copy, data, n);
    copy[n] = 0;
    char *argv[66] = {"preprocess"};
    int argc = 1;
    for (size_t i = 0; i < n && argc < 64;) {   // NUL-separated arguments
        argv[argc++] = copy + i;
        i += strlen(copy + i) + 1;
    }
    for (int i = 1; i < argc; i++)   // --help prints and exits by design
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { free(copy); return; }
    pp_args a;
    memset(&a, 0, sizeof a);
    parse_args(argc, argv, &a);
    free(copy);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    int which = data[0] % 3, options = data[1];
    data += 2, size -= 2;
    jmp_buf env;
    mt_fatal_jmp = &env;
    if (setjmp(env) == 0) {
        if (which == 0) fuzz_documents(data, size, PP_JSON, options);
        else if (which == 1) fuzz_documents(data, size, PP_TEXT, options);
        else fuzz_flags(data, size);
    }
    mt_fatal_jmp = NULL;
    return 0;
}

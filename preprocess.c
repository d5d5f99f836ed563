/* preprocess.c - text or loose JSON -> Megatron's indexed dataset (PREFIX.bin + PREFIX.idx).
 *
 * The C twin of Megatron-LM's tools/preprocess_data.py, with the same flags:
 *
 *   ./preprocess --input data/corpus.jsonl --output-prefix data/my_dataset \
 *                --vocab-file data/gpt2-vocab.json --merge-file data/gpt2-merges.txt \
 *                --tokenizer-type GPT2BPETokenizer --workers 4 --append-eod
 *   -> data/my_dataset_text_document.bin, data/my_dataset_text_document.idx
 *
 * Every input line is one JSON object ("loose JSON", as Megatron reads it: json.loads(line)[key]);
 * each --json-keys key gives one output dataset PREFIX_KEY_document. A document is one sequence
 * of GPT-2 ids, with <|endoftext|> (50256) after it under --append-eod (not after an empty one).
 * The files are byte for byte what Megatron's tool writes for the same ids: uint16 tokens when
 * the vocabulary has fewer than 65,500 ids (else int32) and the MMIDIDX index (megatron.h section 9).
 * A .txt input is plain text instead: one document per block of lines separated by blank lines
 * (or one per line with --split-lines-docs).
 *
 * How it runs: the main thread reads the input into batches of whole documents; --workers
 * threads parse and tokenize batches (each with its own BPE cache); the main thread writes the
 * finished batches in input order, so the output does not depend on the number of workers.
 * Output goes to temporary files that are renamed at the very end: a run that fails or is
 * interrupted leaves nothing under the output names.
 *
 *   main thread:  read batch 0, 1, 2, ...                  write batch 0, 1, 2, ... (in order)
 *                          \      \      \                   ^      ^      ^
 *   workers:                +------+------+-> parse + tokenize -----+------+  (any order)
 */
#define MEGATRON_IMPLEMENTATION
#include "megatron.h"
#include <signal.h>
#include <sys/stat.h>

#define PP_MAX_KEYS 16
#define PP_BATCH_BYTES (256u << 10)   // a batch closes after this much input ...
#define PP_BATCH_DOCS 4096            // ... or this many documents

// ---------------------------------------------------------------------------------------------
// flags: Megatron's names, plus the few this program adds
typedef struct {
    const char *input;            // --input: .jsonl (one JSON object per line) or .txt
    const char *output_prefix;    // --output-prefix
    const char *vocab_file;       // --vocab-file
    const char *merge_file;       // --merge-file
    const char *tokenizer_type;   // --tokenizer-type, GPT2BPETokenizer only
    const char *json_keys[PP_MAX_KEYS];   // --json-keys, default text
    int n_keys;
    int append_eod;               // --append-eod
    int workers;                  // --workers
    int log_interval;             // --log-interval (documents)
    int skip_bad_lines;           // --skip-bad-lines (ours)
    int split_lines_docs;         // --split-lines-docs (ours, text input)
    int input_format;             // --input-format auto|json|text (ours): PP_AUTO, PP_JSON, PP_TEXT
} pp_args;
enum { PP_AUTO, PP_JSON, PP_TEXT };

enum { F_VALUE, F_SWITCH, F_LIST, F_IGNORE_VALUE, F_IGNORE_SWITCH, F_UNSUPPORTED };
typedef struct {
    const char *name;
    int kind;
    const char *arg;    // what the value looks like, "" for a switch
    const char *help;
} pp_flag;

static const pp_flag pp_flags[] = {
    {"--input", F_VALUE, "PATH", "input: loose JSON, one object per line (.json/.jsonl), or plain text (.txt)"},
    {"--output-prefix", F_VALUE, "PREFIX", "writes PREFIX_KEY_document.bin and .idx for each JSON key"},
    {"--vocab-file", F_VALUE, "PATH", "GPT-2 vocab.json (e.g. data/gpt2-vocab.json)"},
    {"--merge-file", F_VALUE, "PATH", "GPT-2 merges.txt (e.g. data/gpt2-merges.txt)"},
    {"--tokenizer-type", F_VALUE, "NAME", "GPT2BPETokenizer (the only one here, and the default)"},
    {"--json-keys", F_LIST, "KEY [KEY ...]", "keys to read from each JSON line (default: text); one dataset per key"},
    {"--append-eod", F_SWITCH, "", "end every non-empty document with <|endoftext|> (id 50256)"},
    {"--workers", F_VALUE, "N", "tokenizer threads (default 1); the output is the same for any N"},
    {"--log-interval", F_VALUE, "N", "progress every N documents (default 1000; at most 1 line/s, at least every 2 s)"},
    {"--dataset-impl", F_VALUE, "mmap", "accepted for old tutorials; mmap is the only format"},
    {"--skip-bad-lines", F_SWITCH, "", "skip (and count) bad lines instead of stopping at the first one"},
    {"--split-lines-docs", F_SWITCH, "", "text input: one document per line (default: per block between blank lines)"},
    {"--input-format", F_VALUE, "auto|json|text", "default auto: a .txt file is text, anything else JSON"},
    {"--seq-length", F_IGNORE_VALUE, "N", "ignored: a training flag; tokenization does not depend on it"},
    {"--partitions", F_IGNORE_VALUE, "N", "ignored: one pass over the input gives the same files"},
    {"--keep-sequential-samples", F_IGNORE_SWITCH, "", "ignored: documents always keep input order"},
    {"--keep-newlines", F_IGNORE_SWITCH, "", "ignored: only matters with --split-sentences"},
    {"--lang", F_IGNORE_VALUE, "LANG", "ignored: only matters with --split-sentences"},
    {"--vocab-size", F_IGNORE_VALUE, "N", "ignored: the vocabulary size comes from --vocab-file"},
    {"--vocab-extra-ids", F_IGNORE_VALUE, "N", "ignored: not used by GPT2BPETokenizer"},
    {"--tokenizer-model", F_IGNORE_VALUE, "PATH", "ignored: not used by GPT2BPETokenizer"},
    {"--split-sentences", F_UNSUPPORTED, "", "not supported: needs NLTK's punkt sentence splitter"},
    {"--help", F_SWITCH, "", "this text"},
};
#define PP_NFLAGS (sizeof pp_flags / sizeof pp_flags[0])

static void usage(FILE *f) {
    fprintf(f, "usage: ./preprocess --input PATH --output-prefix PREFIX --vocab-file PATH --merge-file PATH\n"
               "                    [--tokenizer-type GPT2BPETokenizer] [--json-keys KEY ...] [--append-eod]\n"
               "                    [--workers N] [--log-interval N] [--skip-bad-lines] ...\n"
               "Megatron-LM's tools/preprocess_data.py in C: tokenizes documents with GPT-2's BPE and writes\n"
               "Megatron's indexed dataset PREFIX_KEY_document.bin/.idx (uint16 tokens for GPT-2).\n"
               "Input: .json/.jsonl: one JSON object per line, one document per line and key (blank lines\n"
               "are skipped). .txt: plain text, one document per block of lines between blank lines (lines\n"
               "that are empty or only whitespace), lines joined with \\n; --split-lines-docs: one per line.\n"
               "Speeds: MB = 10^6 bytes of input.\n\nflags:\n");
    for (size_t i = 0; i < PP_NFLAGS; i++) {
        char left[64];
        snprintf(left, sizeof left, "%s %s", pp_flags[i].name, pp_flags[i].arg);
        fprintf(f, "  %-32s %s\n", left, pp_flags[i].help);
    }
}

static int parse_int(const char *flag, const char *v, int lo) {
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || *end || end == v || x < lo || x > 1000000000L)
        mt_fatal("%s needs an integer >= %d, got \"%s\"", flag, lo, v);
    return (int)x;
}

static void parse_args(int argc, char **argv, pp_args *a) {
    memset(a, 0, sizeof *a);
    a->tokenizer_type = "GPT2BPETokenizer";
    a->workers = 1;
    a->log_interval = 1000;
    a->input_format = PP_AUTO;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (!strcmp(arg, "-h")) arg = "--help";
        if (strncmp(arg, "--", 2) != 0)
            mt_fatal("unexpected argument \"%s\"\nhint: every value follows its flag, e.g. --input data/corpus.jsonl; see ./preprocess --help", arg);
        char name[128];
        const char *inline_value = strchr(arg, '=');   // --flag=value, as argparse allows
        size_t nlen = inline_value ? (size_t)(inline_value - arg) : strlen(arg);
        if (nlen >= sizeof name) nlen = sizeof name - 1;
        memcpy(name, arg, nlen);
        name[nlen] = '\0';
        if (inline_value) inline_value++;
        const pp_flag *f = NULL;
        for (size_t k = 0; k < PP_NFLAGS; k++) if (!strcmp(name, pp_flags[k].name)) f = &pp_flags[k];
        if (!f) {
            // the nearest known flag: one that starts with what was typed (--vocab -> --vocab-file),
            // else the smallest edit distance
            const char *best = pp_flags[0].name;
            int bd = 1 << 30;
            for (size_t k = 0; k < PP_NFLAGS; k++) {
                int d = strncmp(pp_flags[k].name, name, strlen(name)) == 0 ? 0 : 1 + mt_edit_distance(name, pp_flags[k].name);
                if (d < bd) { bd = d; best = pp_flags[k].name; }
            }
            mt_fatal("unknown flag %s\nhint: did you mean %s? (./preprocess --help lists the flags)", name, best);
        }
        if (!strcmp(f->name, "--help")) {
            if (inline_value) mt_fatal("--help takes no value (got \"%s\")", arg);   // argparse refuses it too
            usage(stdout);
            exit(0);
        }
        if (f->kind == F_UNSUPPORTED)
            mt_fatal("--split-sentences is not supported: it needs NLTK's punkt sentence splitter\n"
                     "hint: leave it out; each document then becomes one sequence, which is what GPT pretraining uses");
        if (f->kind == F_SWITCH || f->kind == F_IGNORE_SWITCH) {
            if (inline_value) mt_fatal("%s takes no value", f->name);
            if (f->kind == F_IGNORE_SWITCH) fprintf(stderr, "note: %s is %s\n", f->name, f->help);
            else if (!strcmp(f->name, "--append-eod")) a->append_eod = 1;
            else if (!strcmp(f->name, "--skip-bad-lines")) a->skip_bad_lines = 1;
            else if (!strcmp(f->name, "--split-lines-docs")) a->split_lines_docs = 1;
            continue;
        }
        if (f->kind == F_LIST) {   // nargs='+': every following argument up to the next flag
            a->n_keys = 0;
            if (inline_value) a->json_keys[a->n_keys++] = inline_value;
            while (i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0) {
                if (a->n_keys == PP_MAX_KEYS) mt_fatal("--json-keys: at most %d keys", PP_MAX_KEYS);
                a->json_keys[a->n_keys++] = argv[++i];
            }
            if (a->n_keys == 0) mt_fatal("--json-keys needs at least one key, e.g. --json-keys text");
            continue;
        }
        const char *v = inline_value;
        if (!v) {
            if (i + 1 >= argc) mt_fatal("%s needs a value\nhint: %s %s: %s", f->name, f->name, f->arg, f->help);
            v = argv[++i];
        }
        if (f->kind == F_IGNORE_VALUE) { fprintf(stderr, "note: %s %s is %s\n", f->name, v, f->help); continue; }
        if (!strcmp(f->name, "--input")) a->input = v;
        else if (!strcmp(f->name, "--output-prefix")) a->output_prefix = v;
        else if (!strcmp(f->name, "--vocab-file")) a->vocab_file = v;
        else if (!strcmp(f->name, "--merge-file")) a->merge_file = v;
        else if (!strcmp(f->name, "--tokenizer-type")) a->tokenizer_type = v;
        else if (!strcmp(f->name, "--workers")) { a->workers = parse_int(f->name, v, 1); }
        else if (!strcmp(f->name, "--log-interval")) a->log_interval = parse_int(f->name, v, 1);
        else if (!strcmp(f->name, "--dataset-impl")) {
            if (strcmp(v, "mmap") != 0)
                mt_fatal("--dataset-impl %s is not supported: only mmap (Megatron's only format today)\nhint: --dataset-impl mmap, or leave it out", v);
        } else if (!strcmp(f->name, "--input-format")) {
            if (!strcmp(v, "auto")) a->input_format = PP_AUTO;
            else if (!strcmp(v, "json")) a->input_format = PP_JSON;
            else if (!strcmp(v, "text")) a->input_format = PP_TEXT;
            else mt_fatal("--input-format must be auto, json or text, got \"%s\"", v);
        }
    }
    if (a->n_keys == 0) { a->json_keys[0] = "text"; a->n_keys = 1; }
    for (int k = 0; k < a->n_keys; k++)
        for (int m = 0; m < k; m++)
            if (!strcmp(a->json_keys[k], a->json_keys[m])) mt_fatal("--json-keys names \"%s\" twice", a->json_keys[k]);
    if (!a->input) mt_fatal("--input is required\nhint: --input data/corpus.jsonl");
    if (!a->output_prefix) mt_fatal("--output-prefix is required\nhint: --output-prefix data/my_dataset");
    if (strcmp(a->tokenizer_type, "GPT2BPETokenizer") != 0)
        mt_fatal("--tokenizer-type %s is not supported\nhint: --tokenizer-type GPT2BPETokenizer (GPT-2's BPE)", a->tokenizer_type);
    if (!a->vocab_file) mt_fatal("--vocab-file is required for GPT2BPETokenizer\nhint: --vocab-file data/gpt2-vocab.json");
    if (!a->merge_file) mt_fatal("--merge-file is required for GPT2BPETokenizer\nhint: --merge-file data/gpt2-merges.txt");
    if (a->input_format == PP_AUTO) {
        size_t n = strlen(a->input);
        a->input_format = n >= 4 && !strcmp(a->input + n - 4, ".txt") ? PP_TEXT : PP_JSON;
    }
    if (a->split_lines_docs && a->input_format != PP_TEXT)
        mt_fatal("--split-lines-docs is for text input; %s is read as JSON (one document per line already)\n"
                 "hint: drop --split-lines-docs, or pass --input-format text", a->input);
    if (a->input_format == PP_TEXT && (a->n_keys != 1 || strcmp(a->json_keys[0], "text") != 0))
        mt_fatal("--json-keys is for JSON input; %s is read as plain text (output key \"text\")\nhint: drop --json-keys", a->input);
}

// ---------------------------------------------------------------------------------------------
// loose JSON: one object per line, parsed as strictly as Python's json.loads, with megatron.h's
// JSON reader (section 1). String values of the wanted keys are decoded in place; every other
// value is checked and skipped.
static const char *json_type_name(mt_json_type t) {
    static const char *names[] = {"a string", "a number", "an object", "a list", "true", "false", "null"};
    return names[t];
}
// a string that is needed (a key, or a value to tokenize): checked, then decoded in place.
// Returns 0 if the string is bad JSON (j->err set) or has a lone surrogate (*lone set).
static int json_str(mt_json *j, const char **out, size_t *len, int *lone) {
    char *start = (char *)j->p;
    if (!mt_json_scan_string(j, lone) || *lone) return 0;
    const char *p = start;
    const char *e = mt_json_string(&p, j->end, start, len);   // cannot fail after the scan
    if (e) { mt_json_fail(j, e); return 0; }
    *out = start;
    return 1;
}

// ---------------------------------------------------------------------------------------------
// batches: whole documents in, token ids out
typedef struct {
    int64_t seq;                 // batch number in input order
    int state;                   // B_FREE, B_FILLED (waiting for a worker), B_WORKING, B_DONE
    // input
    char *text;                  // the documents back to back: doc d is text[off[d] .. off[d+1])
    size_t text_len, text_cap;
    size_t *off;
    int64_t *line;               // input line number where doc d starts
    size_t n_docs, docs_cap;
    // output
    mt_int_list tokens[PP_MAX_KEYS];   // ids of every kept document, per key, back to back
    size_t *ntok;                // ntok[d * n_keys + k]: ids of doc d for key k
    unsigned char *bad;          // bad[d]: line skipped (--skip-bad-lines)
    size_t n_bad, n_invalid_utf8;
    char bad_msg[4][600];        // the batch's first few skipped lines, for the log
    int n_bad_msg;
    int failed;                  // 1: an error stops the run at this batch (without --skip-bad-lines)
    char err[768];
} pp_batch;
enum { B_FREE, B_FILLED, B_WORKING, B_DONE };

typedef struct {
    const pp_args *args;
    const mt_tokenizer *tok;
    pp_batch *batches;
    int n_batches;
    pthread_mutex_t mu;
    pthread_cond_t work;         // a batch was filled, or the run is over
    pthread_cond_t done;         // a batch is done
    int stop;
} pp_pool;

static void batch_add_doc(pp_batch *b, int64_t line) {
    if (b->n_docs + 2 > b->docs_cap) {
        b->docs_cap = b->docs_cap ? 2 * b->docs_cap : 1024;
        b->off = (size_t *)mt_realloc(b->off, (b->docs_cap + 1) * sizeof(size_t), "batch");
        b->line = (int64_t *)mt_realloc(b->line, b->docs_cap * sizeof(int64_t), "batch");
    }
    b->line[b->n_docs] = line;
    b->off[b->n_docs] = b->text_len;
    b->n_docs++;
    b->off[b->n_docs] = b->text_len;
}
static void batch_append(pp_batch *b, const char *s, size_t n) {   // to the last document
    if (b->text_len + n > b->text_cap) {
        b->text_cap = b->text_cap ? b->text_cap : 1 << 16;
        while (b->text_cap < b->text_len + n) b->text_cap *= 2;
        b->text = (char *)mt_realloc(b->text, b->text_cap, "batch");
    }
    memcpy(b->text + b->text_len, s, n);
    b->text_len += n;
    b->off[b->n_docs] = b->text_len;
}

static void batch_bad(pp_batch *b, const pp_args *a, size_t d, const char *fmt, ...) {
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (a->skip_bad_lines) {
        b->bad[d] = 1;
        b->n_bad++;
        if (b->n_bad_msg < 4) snprintf(b->bad_msg[b->n_bad_msg++], sizeof b->bad_msg[0], "%s", msg);
    } else if (!b->failed) {
        b->failed = 1;
        snprintf(b->err, sizeof b->err, "%s", msg);
    }
}

// one JSON line: find the wanted keys' strings; returns 0 (and reports) if the line is bad
static int parse_json_doc(pp_batch *b, const pp_args *a, size_t d, const char **val, size_t *val_len) {
    char *line = b->text + b->off[d];
    size_t n = b->off[d + 1] - b->off[d];
    int64_t lineno = b->line[d];
    mt_json j;
    mt_json_init(&j, line, n, 0);
    int found[PP_MAX_KEYS] = {0};
    mt_json_type type[PP_MAX_KEYS] = {MT_JSON_STRING};
    const char *keys_seen[6];
    size_t keys_seen_len[6];
    int n_seen = 0;
    mt_json_ws(&j);
    if (j.p >= j.end || *j.p != '{') {
        if (j.p < j.end && (*j.p == '[' || *j.p == '"' || *j.p == '-' || (*j.p >= '0' && *j.p <= '9')))
            mt_json_fail(&j, "the line is JSON but not an object ({...})");
        else mt_json_fail(&j, "expected '{'");
    } else {
        j.p++;
        if (!mt_json_eat(&j, '}')) do {
            mt_json_ws(&j);
            if (j.p >= j.end || *j.p != '"') { mt_json_fail(&j, "expected a key string"); break; }
            const char *key = "";
            size_t klen = 0;
            int lone = 0;
            json_str(&j, &key, &klen, &lone);   // a key with a lone surrogate matches no wanted key
            if (j.err) break;
            if (n_seen < 6 && !lone) { keys_seen[n_seen] = key; keys_seen_len[n_seen] = klen; n_seen++; }
            if (!mt_json_expect(&j, ':', "expected ':' after a key")) break;
            mt_json_ws(&j);
            int want = -1;
            for (int k = 0; k < a->n_keys && !lone; k++)
                if (strlen(a->json_keys[k]) == klen && memcmp(a->json_keys[k], key, klen) == 0) want = k;
            if (want >= 0 && j.p < j.end && *j.p == '"') {   // a later duplicate key wins, as in Python
                const char *at = j.p;
                if (!json_str(&j, &val[want], &val_len[want], &lone) && lone) {
                    j.p = at;
                    mt_json_fail(&j, "lone UTF-16 surrogate in the text (it has no UTF-8 form)");
                }
                found[want] = 1;
                type[want] = MT_JSON_STRING;
            } else {
                mt_json_type t = mt_json_skip(&j);
                if (want >= 0) { found[want] = 1; type[want] = t; }
            }
            if (j.err) break;
        } while (mt_json_eat(&j, ','));
        if (!j.err) mt_json_expect(&j, '}', "expected ',' or '}'");
        if (!j.err) {
            mt_json_ws(&j);
            if (j.p != j.end) mt_json_fail(&j, "extra text after the object");
        }
    }
    if (j.err) {
        batch_bad(b, a, d, "%s line %lld: malformed JSON: %s at column %lld", a->input, (long long)lineno, j.err,
                  (long long)(j.err_at - line) + 1);
        return 0;
    }
    for (int k = 0; k < a->n_keys; k++) {
        if (!found[k]) {
            char seen[256] = "";
            size_t at = 0;
            for (int s = 0; s < n_seen && at < sizeof seen - 40; s++) {
                int w = snprintf(seen + at, sizeof seen - at, "%s\"%.*s\"", s ? ", " : "", (int)(keys_seen_len[s] < 30 ? keys_seen_len[s] : 30), keys_seen[s]);
                if (w > 0) at += (size_t)w;
            }
            batch_bad(b, a, d, "%s line %lld has no key \"%s\" (its keys: %s)\nhint: --json-keys names the keys to read, e.g. --json-keys %.*s",
                      a->input, (long long)lineno, a->json_keys[k], n_seen ? seen : "none",
                      n_seen ? (int)keys_seen_len[0] : 4, n_seen ? keys_seen[0] : "text");
            return 0;
        }
        if (type[k] != MT_JSON_STRING) {
            batch_bad(b, a, d, "%s line %lld: the value of \"%s\" is %s, not a string%s", a->input, (long long)lineno,
                      a->json_keys[k], json_type_name(type[k]),
                      type[k] == MT_JSON_ARRAY ? " (Megatron's pre-split sentence lists are not supported)" : "");
            return 0;
        }
    }
    return 1;
}

static int valid_utf8(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        if ((unsigned char)s[i] < 0x80) { i++; continue; }
        uint32_t cp;
        int l = mt_utf8_decode(s + i, n - i, &cp);
        if (!l) return 0;
        i += (size_t)l;
    }
    return 1;
}

static void process_batch(pp_batch *b, const pp_args *a, const mt_tokenizer *tok, mt_bpe_cache *cache) {
    int nk = a->n_keys;
    b->ntok = (size_t *)mt_realloc(b->ntok, (b->n_docs * (size_t)nk + 1) * sizeof(size_t), "batch");
    b->bad = (unsigned char *)mt_realloc(b->bad, b->n_docs + 1, "batch");
    memset(b->bad, 0, b->n_docs + 1);
    for (int k = 0; k < nk; k++) b->tokens[k].len = 0;
    b->n_bad = b->n_invalid_utf8 = 0;
    b->n_bad_msg = 0;
    b->failed = 0;
    for (size_t d = 0; d < b->n_docs && !b->failed; d++) {
        const char *val[PP_MAX_KEYS];
        size_t val_len[PP_MAX_KEYS];
        if (a->input_format == PP_JSON) {
            if (!parse_json_doc(b, a, d, val, val_len)) continue;
        } else {
            val[0] = b->text + b->off[d];
            val_len[0] = b->off[d + 1] - b->off[d];
            if (!valid_utf8(val[0], val_len[0])) b->n_invalid_utf8++;   // encoded byte by byte all the same
        }
        for (int k = 0; k < nk; k++) {
            size_t n = mt_tokenizer_encode(tok, cache, val[k], val_len[k], &b->tokens[k]);
            if (a->append_eod && n > 0) { mt_int_list_push(&b->tokens[k], tok->eod_id); n++; }
            b->ntok[d * (size_t)nk + (size_t)k] = n;
        }
    }
}

static void *worker_main(void *arg) {
    pp_pool *p = (pp_pool *)arg;
    mt_bpe_cache cache;   // this worker's own: no locks on the hot path
    memset(&cache, 0, sizeof cache);
    pthread_mutex_lock(&p->mu);
    for (;;) {
        pp_batch *b = NULL;   // the oldest filled batch
        for (int i = 0; i < p->n_batches; i++)
            if (p->batches[i].state == B_FILLED && (!b || p->batches[i].seq < b->seq)) b = &p->batches[i];
        if (!b) {
            if (p->stop) break;
            pthread_cond_wait(&p->work, &p->mu);
            continue;
        }
        b->state = B_WORKING;
        pthread_mutex_unlock(&p->mu);
        process_batch(b, p->args, p->tok, &cache);
        pthread_mutex_lock(&p->mu);
        b->state = B_DONE;
        pthread_cond_broadcast(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
    mt_bpe_cache_free(&cache);
    return NULL;
}

// ---------------------------------------------------------------------------------------------
// reading: lines of any length from a buffered file
typedef struct {
    FILE *f;
    const char *path;
    char *buf;
    size_t cap, start, end;
    int eof;
    int err;             // errno of a failed read (next_line then returns NULL)
    int64_t lineno;      // number of the line last returned (1-based)
    uint64_t bytes;      // input bytes consumed so far
} pp_reader;

// the next line without its "\n" (NULL at the end of the input)
static const char *next_line(pp_reader *r, size_t *len) {
    for (;;) {
        if (r->err) return NULL;
        char *nl = r->end > r->start ? (char *)memchr(r->buf + r->start, '\n', r->end - r->start) : NULL;
        if (nl || (r->eof && r->end > r->start)) {
            const char *s = r->buf + r->start;
            size_t n = nl ? (size_t)(nl - s) : r->end - r->start;
            r->start += n + (nl ? 1 : 0);
            r->bytes += n + (nl ? 1 : 0);
            r->lineno++;
            *len = n;
            return s;
        }
        if (r->eof) return NULL;
        if (r->start > 0) {   // slide the partial line to the front
            memmove(r->buf, r->buf + r->start, r->end - r->start);
            r->end -= r->start;
            r->start = 0;
        }
        if (r->end == r->cap) {
            r->cap *= 2;
            r->buf = (char *)mt_realloc(r->buf, r->cap, "input line");
        }
        size_t got = fread(r->buf + r->end, 1, r->cap - r->end, r->f);
        if (got == 0) {
            if (ferror(r->f)) { r->err = errno ? errno : EIO; return NULL; }
            r->eof = 1;
        }
        r->end += got;
    }
}

static int blank_line(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\v' && s[i] != '\f') return 0;
    return 1;
}

// fills b with the next documents; returns 0 if the input had none left
static int fill_batch(pp_batch *b, pp_reader *r, const pp_args *a, uint64_t *blank_lines) {
    b->text_len = 0;
    b->n_docs = 0;
    if (!b->off) { b->docs_cap = 1024; b->off = (size_t *)mt_malloc((b->docs_cap + 1) * sizeof(size_t), "batch");
                   b->line = (int64_t *)mt_malloc(b->docs_cap * sizeof(int64_t), "batch"); }
    b->off[0] = 0;
    int in_doc = 0;   // text input: a block of lines is open
    for (;;) {
        if (b->n_docs >= PP_BATCH_DOCS || b->text_len >= PP_BATCH_BYTES) {
            // close the batch, but only between documents
            if (a->input_format == PP_JSON || a->split_lines_docs || !in_doc) break;
        }
        size_t n;
        const char *s = next_line(r, &n);
        if (!s) break;
        if (r->lineno == 1 && n >= 3 && memcmp(s, "\xEF\xBB\xBF", 3) == 0) { s += 3; n -= 3; }   // a UTF-8 BOM
        if (a->input_format == PP_JSON || a->split_lines_docs) {
            if (blank_line(s, n)) { (*blank_lines)++; continue; }
            batch_add_doc(b, r->lineno);
            batch_append(b, s, n);
            continue;
        }
        // text: blocks of non-blank lines, joined with "\n"
        if (blank_line(s, n)) { in_doc = 0; continue; }
        if (!in_doc) { batch_add_doc(b, r->lineno); in_doc = 1; }
        else batch_append(b, "\n", 1);
        batch_append(b, s, n);
        // a document ends at a blank line: peek is not possible, so a batch that is full
        // keeps reading lines until the current block ends (see the check at the top)
    }
    return b->n_docs > 0;
}

// ---------------------------------------------------------------------------------------------
// the run
static volatile sig_atomic_t pp_interrupted = 0;
static void on_signal(int sig) { pp_interrupted = sig; }

typedef struct {
    uint64_t docs, tokens, bad, invalid_utf8;
    int bad_printed;
    double t0, last_print;
    uint64_t last_docs;
} pp_stats;

static void print_progress(const pp_stats *st, uint64_t bytes, const char *final) {
    double el = mt_time_seconds() - st->t0;
    if (el <= 0) el = 1e-9;
    fprintf(stderr, "%sprocessed %llu documents (%.0f docs/s, %.2f MB/s, %.0f tokens/s), elapsed %.3f s\n", final,
            (unsigned long long)st->docs, (double)st->docs / el, (double)bytes / el / 1e6, (double)st->tokens / el, el);
}

static void fail_run(mt_indexed_builder **builders, int n, const char *msg) {
    for (int k = 0; k < n; k++) if (builders[k]) mt_indexed_builder_abort(builders[k]);
    mt_fatal("%s", msg);
}

int main(int argc, char **argv) {
    pp_args a;
    parse_args(argc, argv, &a);

    mt_tokenizer tok;
    double t_load = mt_time_seconds();
    mt_tokenizer_load(&tok, a.vocab_file, a.merge_file);
    t_load = mt_time_seconds() - t_load;
    if (a.append_eod && tok.eod_id < 0)
        mt_fatal("--append-eod: %s has no \"<|endoftext|>\" token\nhint: use GPT-2's vocab.json", a.vocab_file);

    pp_reader r;
    memset(&r, 0, sizeof r);
    r.path = a.input;
    r.f = fopen(a.input, "rb");
    if (!r.f) mt_fatal("cannot open input %s: %s\nhint: check --input", a.input, strerror(errno));
    struct stat sb;
    if (fstat(fileno(r.f), &sb) == 0 && S_ISDIR(sb.st_mode))
        mt_fatal("--input %s is a directory\nhint: --input takes one file (.jsonl or .txt)", a.input);
    r.cap = 1 << 20;
    r.buf = (char *)mt_malloc(r.cap, "input buffer");

    // outputs, under temporary names until the end
    int dtype = mt_dtype_for_vocab(tok.vocab_size);
    mt_indexed_builder *builders[PP_MAX_KEYS] = {NULL};
    char prefix[MT_PATH_MAX + 256];
    for (int k = 0; k < a.n_keys; k++) {
        snprintf(prefix, sizeof prefix, "%s_%s_document", a.output_prefix, a.json_keys[k]);
        builders[k] = mt_indexed_builder_open(prefix, dtype);
    }
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    fprintf(stderr, "preprocess: %s (%s) -> %s_{%s}_document.bin/.idx, %d worker%s, vocabulary %d ids (%s tokens), "
            "tokenizer loaded in %.3f s\n",
            a.input, a.input_format == PP_JSON ? "loose JSON" : a.split_lines_docs ? "text, a document per line" : "text, documents between blank lines",
            a.output_prefix, a.n_keys == 1 ? a.json_keys[0] : "KEY", a.workers, a.workers == 1 ? "" : "s",
            tok.vocab_size, dtype == 8 ? "uint16" : "int32", t_load);

    pp_pool pool;
    memset(&pool, 0, sizeof pool);
    pool.args = &a;
    pool.tok = &tok;
    pool.n_batches = 2 * a.workers + 2;   // enough to keep every worker busy while one is written
    pool.batches = (pp_batch *)mt_calloc((size_t)pool.n_batches, sizeof(pp_batch), "batches");
    pthread_mutex_init(&pool.mu, NULL);
    pthread_cond_init(&pool.work, NULL);
    pthread_cond_init(&pool.done, NULL);
    pthread_t *threads = (pthread_t *)mt_calloc((size_t)a.workers, sizeof(pthread_t), "threads");
    for (int w = 0; w < a.workers; w++) {
        int err = pthread_create(&threads[w], NULL, worker_main, &pool);
        if (err == 0) continue;
        // no thread, no worker: the batches would wait for ever. With some workers running we go
        // on with those; with none it is an error.
        if (w == 0) {
            char msg[512];
            snprintf(msg, sizeof msg, "cannot start a worker thread: %s\nhint: raise the memory or thread limit "
                     "(ulimit -v, ulimit -u), or lower --workers", strerror(err));
            fail_run(builders, a.n_keys, msg);
        }
        fprintf(stderr, "note: only %d of %d worker threads could start (%s); going on with %d\n", w, a.workers,
                strerror(err), w);
        a.workers = w;
        break;
    }

    pp_stats st;
    memset(&st, 0, sizeof st);
    st.t0 = mt_time_seconds();   // rates count from here, as Megatron's do (startup is not in them)
    st.last_print = mt_time_seconds();
    uint64_t blank_lines = 0;
    int64_t next_fill = 0, next_write = 0;
    int eof = 0;
    for (;;) {
        if (pp_interrupted) {
            char msg[128];
            snprintf(msg, sizeof msg, "interrupted by signal %d; no output written", (int)pp_interrupted);
            fail_run(builders, a.n_keys, msg);
        }
        // 1. read ahead while there is a free batch
        pp_batch *fb = &pool.batches[next_fill % pool.n_batches];
        if (!eof && fb->state == B_FREE && next_fill - next_write < pool.n_batches) {
            if (fill_batch(fb, &r, &a, &blank_lines)) {
                fb->seq = next_fill++;
                pthread_mutex_lock(&pool.mu);
                fb->state = B_FILLED;
                pthread_cond_signal(&pool.work);
                pthread_mutex_unlock(&pool.mu);
                continue;
            }
            eof = 1;
            if (r.err) {
                char msg[1024];
                snprintf(msg, sizeof msg, "cannot read %s: %s\nhint: check --input; nothing was written", a.input, strerror(r.err));
                fail_run(builders, a.n_keys, msg);
            }
        }
        if (next_write == next_fill) break;   // all read, all written
        // 2. wait for the oldest batch, write it
        pp_batch *b = &pool.batches[next_write % pool.n_batches];
        pthread_mutex_lock(&pool.mu);
        while (b->state != B_DONE && !pp_interrupted) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 200 * 1000 * 1000;   // wake up now and then to notice a signal
            if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
            pthread_cond_timedwait(&pool.done, &pool.mu, &ts);
        }
        pthread_mutex_unlock(&pool.mu);
        if (pp_interrupted) continue;
        if (b->failed) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s\nhint: fix the line, or pass --skip-bad-lines to skip such lines; nothing was written", b->err);
            if (strstr(b->err, "\nhint: ")) snprintf(msg, sizeof msg, "%s; nothing was written", b->err);
            fail_run(builders, a.n_keys, msg);
        }
        size_t at[PP_MAX_KEYS] = {0};
        for (size_t d = 0; d < b->n_docs; d++) {
            if (b->bad[d]) continue;
            for (int k = 0; k < a.n_keys; k++) {
                size_t n = b->ntok[d * (size_t)a.n_keys + (size_t)k];
                // an empty document still counts as a document (Megatron: no sequence, one index entry)
                mt_indexed_builder_add_document(builders[k], b->tokens[k].data + at[k], n);
                at[k] += n;
                st.tokens += n;
            }
            st.docs++;
        }
        for (int m = 0; m < b->n_bad_msg && st.bad_printed < 10; m++, st.bad_printed++)
            fprintf(stderr, "skipping: %s\n", b->bad_msg[m]);
        st.bad += b->n_bad;
        st.invalid_utf8 += b->n_invalid_utf8;
        pthread_mutex_lock(&pool.mu);
        b->state = B_FREE;
        pthread_mutex_unlock(&pool.mu);
        next_write++;
        // progress: every --log-interval documents but at most once a second, and every 2 s
        double now = mt_time_seconds();
        int crossed = st.docs / (uint64_t)a.log_interval > st.last_docs / (uint64_t)a.log_interval;
        if ((crossed && now - st.last_print >= 1.0) || now - st.last_print >= 2.0) {
            print_progress(&st, r.bytes, "");
            st.last_print = now;
            st.last_docs = st.docs;
        }
    }
    pthread_mutex_lock(&pool.mu);
    pool.stop = 1;
    pthread_cond_broadcast(&pool.work);
    pthread_mutex_unlock(&pool.mu);
    for (int w = 0; w < a.workers; w++) pthread_join(threads[w], NULL);
    if (pp_interrupted) fail_run(builders, a.n_keys, "interrupted; no output written");
    if (st.docs == 0 && st.bad == 0)
        fprintf(stderr, "warning: %s has no documents; writing empty datasets\n", a.input);

    for (int k = 0; k < a.n_keys; k++) mt_indexed_builder_finish(builders[k]);
    print_progress(&st, r.bytes, "done: ");
    for (int k = 0; k < a.n_keys; k++)
        fprintf(stderr, "wrote %s_%s_document.bin and .idx (%s tokens)\n", a.output_prefix, a.json_keys[k],
                dtype == 8 ? "uint16" : "int32");
    fprintf(stderr, "documents %llu, tokens %llu%s\n", (unsigned long long)st.docs, (unsigned long long)st.tokens,
            a.append_eod ? " (with <|endoftext|>)" : "");
    if (st.bad) fprintf(stderr, "skipped %llu bad line%s (--skip-bad-lines)\n", (unsigned long long)st.bad, st.bad == 1 ? "" : "s");
    if (blank_lines && a.input_format == PP_JSON) fprintf(stderr, "note: ignored %llu blank line%s\n", (unsigned long long)blank_lines, blank_lines == 1 ? "" : "s");
    if (st.invalid_utf8)
        fprintf(stderr, "note: %llu document%s had invalid UTF-8, encoded byte by byte\n", (unsigned long long)st.invalid_utf8, st.invalid_utf8 == 1 ? "" : "s");

    fclose(r.f);
    free(r.buf);
    for (int i = 0; i < pool.n_batches; i++) {
        pp_batch *b = &pool.batches[i];
        free(b->text); free(b->off); free(b->line); free(b->ntok); free(b->bad);
        for (int k = 0; k < PP_MAX_KEYS; k++) mt_int_list_free(&b->tokens[k]);
    }
    free(pool.batches);
    free(threads);
    mt_tokenizer_free(&tok);
    return 0;
}

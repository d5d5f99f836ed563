/* tests/test_tokenizer.c - section 9: the GPT-2 tokenizer and ./preprocess (Megatron's indexed dataset writer).
 *
 * Run from the repository root after building ./preprocess:
 *   cc -O2 -I. -o tests/test_tokenizer tests/test_tokenizer.c -lm -pthread && tests/test_tokenizer
 * Reference ids are tiktoken's (data/tokenizer_cases.jsonl, data/README.md); the .idx file is
 * checked field by field against Megatron's MMIDIDX layout, written out here from the spec, not
 * read with megatron.h's reader. tests/tiktoken_fuzz.py adds a random cross-check with tiktoken.
 */
#define MEGATRON_IMPLEMENTATION
#include "../megatron.h"
#include "harness.h"
#include <dirent.h>
#include <sys/stat.h>

static mt_tokenizer tok;
static char tmpdir[64];

static char *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) { *n = 0; return NULL; }
    size_t cap = 1 << 16, len = 0;
    char *buf = (char *)mt_malloc(cap + 1, "file");
    for (;;) {
        len += fread(buf + len, 1, cap - len, f);
        if (len < cap) break;
        cap *= 2;
        buf = (char *)mt_realloc(buf, cap + 1, "file");
    }
    fclose(f);
    buf[len] = '\0';
    *n = len;
    return buf;
}
static void write_all(const char *path, const char *s, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) mt_fatal("cannot write %s", path);
    fwrite(s, 1, n, f);
    fclose(f);
}

// data/corpus.jsonl's line {"text":"..."} -> the text, decoded in place over the line; NULL if bad
static const char *corpus_text(char *line, const char *end, size_t *n) {
    const char *p = line;
    while (p < end && *p != ':') p++;
    p++;
    while (p < end && *p == ' ') p++;
    if (mt_json_string(&p, end, line, n) != NULL) return NULL;
    return line;
}

// encode, then check that decoding gives the input back
static void encode_check(const char *s, size_t n, mt_bpe_cache *cache, mt_int_list *ids) {
    ids->len = 0;
    mt_tokenizer_encode(&tok, cache, s, n, ids);
    char *back = (char *)mt_malloc(n + 1, "decoded");
    size_t m = mt_tokenizer_decode(&tok, ids->data, ids->len, back, n + 1);
    mt_expect(m == n && memcmp(back, s, n) == 0, "decode(encode(x)) != x for a %zu-byte input", n);
    free(back);
}

// ---------------------------------------------------------------------------------------------
MT_TEST(vocab_and_merges_load) {
    mt_expect(tok.vocab_size == 50257, "vocab_size %d, want 50257", tok.vocab_size);
    mt_expect(tok.n_merges == 50000, "n_merges %d, want 50000", tok.n_merges);
    mt_expect(tok.eod_id == 50256, "eod_id %d, want 50256", tok.eod_id);
    size_t n;
    const char *b = mt_tokenizer_token_bytes(&tok, 262, &n);   // "\u0120the" in vocab.json
    mt_expect(n == 4 && memcmp(b, " the", 4) == 0, "token 262 should be \" the\"");
    b = mt_tokenizer_token_bytes(&tok, 0, &n);
    mt_expect(n == 1 && b[0] == '!', "token 0 should be \"!\"");
    b = mt_tokenizer_token_bytes(&tok, 50256, &n);
    mt_expect(n == 13 && memcmp(b, "<|endoftext|>", 13) == 0, "token 50256 should be <|endoftext|>");
    mt_expect(mt_tokenizer_token_bytes(&tok, 50257, &n) == NULL && n == 0, "id 50257 is past the vocabulary");
    mt_expect(mt_tokenizer_token_id(&tok, "\n", 1) == 198, "\"\\n\" is 198");
    mt_expect(mt_tokenizer_token_id(&tok, " world", 6) == 995, "\" world\" is 995");
    mt_expect(mt_tokenizer_token_id(&tok, "not a token!", 12) == -1, "unknown bytes give -1");
}

// every case of data/tokenizer_cases.jsonl ({"text": ..., "ids": [...]}) gives tiktoken's ids
MT_TEST(tiktoken_cases) {
    size_t len;
    char *buf = read_all("data/tokenizer_cases.jsonl", &len);
    mt_expect(buf != NULL, "cannot read data/tokenizer_cases.jsonl (run from the repository root)");
    if (!buf) return;
    mt_bpe_cache cache = {0};
    mt_int_list ids = {0};
    int32_t want[4096];
    int ncases = 0, nbad = 0;
    for (char *line = buf; line < buf + len;) {
        char *end = (char *)memchr(line, '\n', (size_t)(buf + len - line));
        if (!end) end = buf + len;
        char *text = NULL;
        size_t text_len = 0, nwant = 0;
        const char *p = line;
        while (p < end) {   // {"key": value, ...} with keys text and ids
            if (*p == '"') {
                char key[16];
                size_t kl;
                const char *err = mt_json_string(&p, end, key, &kl);
                mt_expect(!err && kl < sizeof key, "bad key in case %d", ncases);
                if (err || kl >= sizeof key) break;
                while (p < end && (*p == ':' || *p == ' ')) p++;
                if (kl == 4 && !memcmp(key, "text", 4)) {
                    text = (char *)p;
                    err = mt_json_string(&p, end, text, &text_len);   // in place
                    mt_expect(!err, "bad text in case %d: %s", ncases, err ? err : "");
                } else if (kl == 3 && !memcmp(key, "ids", 3)) {
                    p++;   // [
                    while (p < end && *p != ']') {
                        char *q;
                        long v = strtol(p, &q, 10);
                        if (q == p) { p++; continue; }
                        if (nwant < 4096) want[nwant++] = (int32_t)v;
                        p = q;
                    }
                }
            } else p++;
        }
        if (text) {
            for (int pass = 0; pass < 3; pass++) {   // no cache, cold cache, warm cache
                encode_check(text, text_len, pass == 0 ? NULL : &cache, &ids);
                int same = ids.len == nwant && memcmp(ids.data, want, nwant * sizeof(int32_t)) == 0;
                if (!same && pass == 0) {
                    nbad++;
                    fprintf(stderr, "  case %d (%.40s...): got %zu ids, want %zu\n", ncases, text, ids.len, nwant);
                }
                mt_expect(same, "case %d differs from tiktoken (pass %d)", ncases, pass);
            }
            ncases++;
        }
        line = end + 1;
    }
    mt_expect(ncases == 65, "read %d cases, want 65", ncases);
    mt_expect(cache.hits > 0, "the second pass should hit the cache");
    mt_int_list_free(&ids);
    mt_bpe_cache_free(&cache);
    free(buf);
}

// GPT-2's pattern, case by case (see "pre-tokenization" in megatron.h)
MT_TEST(pretokenizer_pieces) {
    static const char *cases[][8] = {
        {"Hello world", "Hello", " world"},
        {"it's", "it", "'s"},
        {"IT'S", "IT", "'", "S"},                       // contractions are lowercase only
        {"we'll've", "we", "'ll", "'ve"},
        {"a   b", "a", "  ", " b"},                    // the run leaves one space for the word
        {"\n\nA", "\n", "\n", "A"},
        {"x  \n", "x", "  \n"},                       // at the end, the whole run
        {"\t\tx", "\t", "\t", "x"},                    // only a space glues to the next word
        {"a\xc2\xa0" "b", "a", "\xc2\xa0", "b"},        // U+00A0 is whitespace but not " "
        {"1234567 !!", "1234567", " !!"},               // no 3-digit groups in GPT-2
        {"x\xe3\x80\x80y", "x", "\xe3\x80\x80", "y"},   // U+3000 ideographic space
        {"\xe2\x80\x8b", "\xe2\x80\x8b"},               // U+200B is not whitespace: other
        {" 's", " '", "s"},
        {"<|endoftext|>", "<|", "endoftext", "|>"},
        {"caf\xc3\xa9 \xd9\xa3\xd9\xa4", "caf\xc3\xa9", " \xd9\xa3\xd9\xa4"},   // letters; Arabic-Indic digits
        {"\xff\xfe" "ab", "\xff\xfe", "ab"},            // invalid UTF-8 bytes: "other" characters
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const char *s = cases[c][0];
        size_t n = strlen(s), pos = 0;
        int k = 1, ok = 1;
        while (pos < n) {
            size_t end = mt_gpt2_next_piece(s, n, pos);
            const char *want = cases[c][k];
            if (!want || strlen(want) != end - pos || memcmp(want, s + pos, end - pos) != 0) ok = 0;
            k++;
            pos = end;
        }
        if (cases[c][k]) ok = 0;
        mt_expect(ok, "pieces of case %zu (\"%s\") differ", c, s);
    }
}

MT_TEST(unicode_classes) {
    for (uint32_t c = 0; c < 128; c++)
        mt_expect(mt__ascii_class[c] == mt__unicode_class(c), "ASCII table and step table disagree on %u", c);
    struct { uint32_t cp; int cls; } spot[] = {
        {0x85, MT__SPACE}, {0xA0, MT__SPACE}, {0x1680, MT__SPACE}, {0x2028, MT__SPACE}, {0x3000, MT__SPACE},
        {0x1C, MT__OTHER}, {0x200B, MT__OTHER}, {0xFEFF, MT__OTHER}, {0x180E, MT__OTHER},
        {0xE9, MT__LETTER}, {0x3A9, MT__LETTER}, {0x4E00, MT__LETTER}, {0xAC00, MT__LETTER}, {0x2A700, MT__LETTER},
        {0x2B740, MT__LETTER}, {0x1E030, MT__LETTER} /* Lm, new in 15.0 */, {0x02B0, MT__LETTER} /* Lm */,
        {0x660, MT__NUMBER}, {0xB2, MT__NUMBER} /* No */, {0x2160, MT__NUMBER} /* Nl */, {0xBD, MT__NUMBER},
        {0x300, MT__OTHER} /* Mn */, {0x93E, MT__OTHER} /* Mc */, {0x1F600, MT__OTHER}, {0x10FFFF, MT__OTHER},
        {0xD7A4, MT__OTHER} /* unassigned */,
    };
    for (size_t i = 0; i < sizeof spot / sizeof spot[0]; i++)
        mt_expect(mt__unicode_class(spot[i].cp) == spot[i].cls, "U+%04X: class %d, want %d",
                  (unsigned)spot[i].cp, mt__unicode_class(spot[i].cp), spot[i].cls);
    mt_expect(!strcmp(MT__UNICODE_VERSION, "15.0.0"), "tables from Unicode %s, want 15.0.0", MT__UNICODE_VERSION);
}

static uint64_t rng_state = 0x853c49e6748fea9bull;
static uint32_t rng(void) {   // xorshift64*
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545F4914F6CDD1Dull) >> 32);
}

// the quadratic and the heap BPE must agree (encode uses the heap only for pieces > 128 bytes)
MT_TEST(bpe_small_equals_large) {
    static const char *alphabets[] = {"etaoinshrdlu", "ab", "0123456789", " e", "\xe4\xb8\x80\xe4\xba\x8c"};
    unsigned char s[MT__BPE_SMALL];
    int32_t a[MT__BPE_SMALL], b[MT__BPE_SMALL];
    int bad = 0;
    for (int it = 0; it < 5000; it++) {
        const char *alpha = alphabets[it % 5];
        size_t na = strlen(alpha), n = 2 + rng() % (MT__BPE_SMALL - 1);
        for (size_t i = 0; i < n; i++) s[i] = (unsigned char)(it % 7 == 6 ? rng() : (uint32_t)alpha[rng() % na]);
        size_t ma = mt__bpe_small(&tok, s, n, a), mb = mt__bpe_large(&tok, s, n, b);
        if (ma != mb || memcmp(a, b, ma * sizeof(int32_t)) != 0) bad++;
    }
    mt_expect(bad == 0, "%d of 5000 random pieces differ between the two BPE versions", bad);
}

// any bytes encode, and decode back to the same bytes; the cache never changes an answer
MT_TEST(round_trip_random_bytes) {
    static const char *chunks[] = {"\x80", "\xc0\x80", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xe2\x82", "\xf0\x9f\x98",
                                   "\xff", " ", "a", "'s", "\n\n", "12", "\xc3\xa9", "\xe4\xb8\x96", "\xf0\x9f\x98\x80",
                                   "\xe3\x80\x80", "the", " of"};
    mt_bpe_cache cache = {0};
    mt_int_list ids = {0}, ids2 = {0};
    char s[4096];
    for (int it = 0; it < 3000; it++) {
        size_t n = 0;
        int parts = 1 + (int)(rng() % 40);
        for (int k = 0; k < parts && n < sizeof s - 8; k++) {
            if (rng() % 4) {
                const char *c = chunks[rng() % (sizeof chunks / sizeof chunks[0])];
                memcpy(s + n, c, strlen(c));
                n += strlen(c);
            } else {
                for (int r = 1 + (int)(rng() % 6); r > 0; r--) s[n++] = (char)rng();
            }
        }
        encode_check(s, n, &cache, &ids);
        int in_range = 1;
        for (size_t i = 0; i < ids.len; i++) if (ids.data[i] < 0 || ids.data[i] >= tok.vocab_size - 1) in_range = 0;
        mt_expect(in_range, "ids out of range (or <|endoftext|>) for random input %d", it);
        ids2.len = 0;
        mt_tokenizer_encode(&tok, NULL, s, n, &ids2);
        mt_expect(ids2.len == ids.len && !memcmp(ids.data, ids2.data, ids.len * sizeof(int32_t)),
                  "with and without the cache differ for random input %d", it);
    }
    // long pieces (the heap BPE): 100 kB of digits, of one letter, of spaces
    size_t n = 100000;
    char *big = (char *)mt_malloc(n, "big");
    const char fill[3] = {'7', 'a', ' '};
    for (int k = 0; k < 3; k++) {
        for (size_t i = 0; i < n; i++) big[i] = k == 0 ? (char)('0' + rng() % 10) : fill[k];
        encode_check(big, n, &cache, &ids);
        // GPT-2 has no token for two spaces: 100,000 spaces are 100,000 ids
        mt_expect(k == 2 ? ids.len == n : ids.len > 0 && ids.len < n / 2, "long piece %d: %zu ids", k, ids.len);
    }
    free(big);
    mt_int_list_free(&ids);
    mt_int_list_free(&ids2);
    mt_bpe_cache_free(&cache);
}

MT_TEST(decode_buffer) {
    int32_t ids[] = {15496, 995};   // "Hello world"
    char out[32];
    memset(out, 'x', sizeof out);
    mt_expect(mt_tokenizer_decode(&tok, ids, 2, out, sizeof out) == 11 && !strcmp(out, "Hello world"), "decode");
    memset(out, 'x', sizeof out);
    size_t n = mt_tokenizer_decode(&tok, ids, 2, out, 4);
    mt_expect(n == 11 && !memcmp(out, "Hell", 4) && out[4] == 'x', "decode into a short buffer: %zu", n);
    mt_expect(mt_tokenizer_decode(&tok, ids, 2, NULL, 0) == 11, "decode with cap 0 only measures");
    char j[] = "\"a\\u00e9\\ud83d\\ude00\\n\\\"\" tail";
    const char *p = j;
    size_t len = 0;
    const char *err = mt_json_string(&p, j + strlen(j), j, &len);
    mt_expect(!err && len == 9 && !memcmp(j, "a\xc3\xa9\xf0\x9f\x98\x80\n\"", 9) && !strcmp(p, " tail"), "JSON string escapes");
    char bad1[] = "\"\\udc00\"", bad2[] = "\"a\x01\"", bad3[] = "\"\xc3\"", bad4[] = "\"abc";
    char *bads[] = {bad1, bad2, bad3, bad4};
    for (int i = 0; i < 4; i++) {
        p = bads[i];
        mt_expect(mt_json_string(&p, bads[i] + strlen(bads[i]), bads[i], &len) != NULL, "bad JSON string %d accepted", i);
    }
}

// data/README.md: 913,792 tokens in the 269 documents; 914,329 for corpus.txt as one text
MT_TEST(corpus_token_count) {
    size_t len;
    char *buf = read_all("data/corpus.jsonl", &len);
    mt_expect(buf != NULL, "cannot read data/corpus.jsonl");
    if (!buf) return;
    mt_bpe_cache cache = {0};
    mt_int_list ids = {0};
    size_t docs = 0, tokens = 0;
    for (char *line = buf; line < buf + len;) {
        char *end = (char *)memchr(line, '\n', (size_t)(buf + len - line));
        if (!end) end = buf + len;
        size_t n;
        const char *text = corpus_text(line, end, &n);
        mt_expect(text != NULL, "corpus line %zu", docs + 1);
        if (text) {
            ids.len = 0;
            tokens += mt_tokenizer_encode(&tok, &cache, text, n, &ids);
            docs++;
        }
        line = end + 1;
    }
    mt_expect(docs == 269, "%zu documents, want 269", docs);
    mt_expect(tokens == 913792, "%zu tokens, want 913,792 (tiktoken)", tokens);
    free(buf);
    buf = read_all("data/corpus.txt", &len);
    mt_expect(buf != NULL, "cannot read data/corpus.txt");
    if (buf) {
        ids.len = 0;
        encode_check(buf, len, &cache, &ids);
        mt_expect(ids.len == 914329, "corpus.txt: %zu tokens, want 914,329 (tiktoken)", ids.len);
    }
    free(buf);
    mt_int_list_free(&ids);
    mt_bpe_cache_free(&cache);
}

// ---------------------------------------------------------------------------------------------
// ./preprocess
static int have_preprocess(void) {
    int ok = access("./preprocess", X_OK) == 0;
    mt_expect(ok, "./preprocess is missing: build it first (cc -O2 -I. -o preprocess preprocess.c -lm -pthread)");
    return ok;
}
// runs ./preprocess ARGS with stderr into tmpdir/err.txt; returns the exit status, *err the text
static int run_preprocess(const char *args, char **err) {
    char cmd[4096], errpath[128];
    snprintf(errpath, sizeof errpath, "%s/err.txt", tmpdir);
    snprintf(cmd, sizeof cmd, "./preprocess --vocab-file data/gpt2-vocab.json --merge-file data/gpt2-merges.txt %s 2> %s",
             args, errpath);
    int st = system(cmd);
    size_t n;
    *err = read_all(errpath, &n);
    if (!*err) *err = mt_strdup("");
    return WIFEXITED(st) ? WEXITSTATUS(st) : 255;
}
// files in tmpdir whose names start with `stem`
static int count_files(const char *stem) {
    DIR *d = opendir(tmpdir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) if (!strncmp(e->d_name, stem, strlen(stem))) n++;
    if (d) closedir(d);
    return n;
}

static uint64_t rd_u64(const unsigned char *p) { uint64_t v = 0; for (int i = 7; i >= 0; i--) v = (v << 8) | p[i]; return v; }
static uint32_t rd_u32(const unsigned char *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }

// Megatron's MMIDIDX index, field by field (little-endian):
//   9 bytes "MMIDIDX\0\0" | u64 version = 1 | u8 dtype code | u64 S = sequences | u64 D = document
//   index entries | i32 lengths[S] | i64 pointers[S] (byte offsets into .bin) | i64 doc_index[D]
typedef struct {
    int ok;
    int dtype;
    uint64_t S, D;
    int32_t *lengths;
    int64_t *pointers, *doc_index;
} idx_file;
static idx_file parse_idx(const char *path) {
    idx_file x;
    memset(&x, 0, sizeof x);
    size_t n;
    unsigned char *b = (unsigned char *)read_all(path, &n);
    mt_expect(b != NULL, "cannot read %s", path);
    if (!b) return x;
    mt_expect(n >= 34 && !memcmp(b, "MMIDIDX\0\0", 9), "%s: magic", path);
    mt_expect(n >= 34 && rd_u64(b + 9) == 1, "%s: version", path);
    if (n < 34) { free(b); return x; }
    x.dtype = b[17];
    x.S = rd_u64(b + 18);
    x.D = rd_u64(b + 26);
    size_t want = 34 + 4 * x.S + 8 * x.S + 8 * x.D;
    mt_expect(n == want, "%s: %zu bytes, the header says %zu", path, n, want);
    if (n != want) { free(b); return x; }
    x.lengths = (int32_t *)mt_malloc(4 * x.S + 1, "idx");
    x.pointers = (int64_t *)mt_malloc(8 * x.S + 1, "idx");
    x.doc_index = (int64_t *)mt_malloc(8 * x.D + 1, "idx");
    const unsigned char *p = b + 34;
    for (uint64_t i = 0; i < x.S; i++, p += 4) x.lengths[i] = (int32_t)rd_u32(p);
    for (uint64_t i = 0; i < x.S; i++, p += 8) x.pointers[i] = (int64_t)rd_u64(p);
    for (uint64_t i = 0; i < x.D; i++, p += 8) x.doc_index[i] = (int64_t)rd_u64(p);
    x.ok = 1;
    free(b);
    return x;
}
static void free_idx(idx_file *x) { free(x->lengths); free(x->pointers); free(x->doc_index); }

static int same_file(const char *a, const char *b) {
    size_t na, nb;
    char *x = read_all(a, &na), *y = read_all(b, &nb);
    int same = x && y && na == nb && memcmp(x, y, na) == 0;
    free(x); free(y);
    return same;
}

// the tutorial command; the files against the spec and against our own encoding of each document
MT_TEST(preprocess_corpus_files) {
    if (!have_preprocess()) return;
    char args[1024], path[256], *err;
    snprintf(args, sizeof args, "--input data/corpus.jsonl --output-prefix %s/my_dataset --tokenizer-type GPT2BPETokenizer "
             "--seq-length 1024 --workers 1 --append-eod", tmpdir);
    int st = run_preprocess(args, &err);
    mt_expect(st == 0, "preprocess failed (%d): %s", st, err);
    mt_expect(strstr(err, "914061") != NULL, "summary should count 914061 tokens: %s", err);
    free(err);
    snprintf(path, sizeof path, "%s/my_dataset_text_document.idx", tmpdir);
    idx_file x = parse_idx(path);
    if (!x.ok) return;
    mt_expect(x.dtype == 8, "dtype code %d, want 8 (uint16)", x.dtype);
    mt_expect(x.S == 269 && x.D == 270, "S %llu D %llu, want 269 and 270", (unsigned long long)x.S, (unsigned long long)x.D);
    int64_t total = 0;
    int ptr_ok = 1, doc_ok = 1;
    for (uint64_t i = 0; i < x.S; i++) { if (x.pointers[i] != 2 * total) ptr_ok = 0; total += x.lengths[i]; }
    for (uint64_t i = 0; i < x.D; i++) if (x.doc_index[i] != (int64_t)i) doc_ok = 0;
    mt_expect(total == 914061, "lengths sum to %lld, want 914,061", (long long)total);
    mt_expect(ptr_ok, "pointers are not the running byte offsets (2 bytes per uint16 token)");
    mt_expect(doc_ok, "document index is not 0, 1, ..., 269");
    // .bin: our ids of each document plus 50256, as little-endian uint16
    size_t nbin, njs;
    snprintf(path, sizeof path, "%s/my_dataset_text_document.bin", tmpdir);
    unsigned char *bin = (unsigned char *)read_all(path, &nbin);
    char *js = read_all("data/corpus.jsonl", &njs);
    mt_expect(bin && nbin == 2 * (size_t)total, ".bin has %zu bytes, want %lld", nbin, (long long)(2 * total));
    if (bin && js && nbin == 2 * (size_t)total) {
        mt_int_list ids = {0};
        size_t at = 0, d = 0;
        int same = 1;
        for (char *line = js; line < js + njs && d < x.S; d++) {
            char *end = (char *)memchr(line, '\n', (size_t)(js + njs - line));
            if (!end) end = js + njs;
            size_t n;
            const char *text = corpus_text(line, end, &n);
            if (!text) { same = 0; break; }
            ids.len = 0;
            mt_tokenizer_encode(&tok, NULL, text, n, &ids);
            mt_int_list_push(&ids, 50256);
            if ((int64_t)ids.len != x.lengths[d]) same = 0;
            for (size_t i = 0; same && i < ids.len; i++, at += 2)
                if ((uint32_t)(bin[at] | bin[at + 1] << 8) != (uint32_t)ids.data[i]) same = 0;
            line = end + 1;
        }
        mt_expect(same, ".bin tokens differ from encode() + <|endoftext|> at document %zu", d);
        mt_int_list_free(&ids);
    }
    free(bin); free(js);
    free_idx(&x);
    mt_expect(count_files("my_dataset") == 2, "want exactly the .bin and the .idx, no temporary files");
}

MT_TEST(preprocess_workers_and_text_input) {
    if (!have_preprocess()) return;
    char args[1024], a[256], b[256], *err;
    const char *runs[3][2] = {{"data/corpus.jsonl", "--workers 1"}, {"data/corpus.jsonl", "--workers 4"},
                              {"data/corpus.txt", "--workers 2"}};
    for (int r = 0; r < 3; r++) {
        snprintf(args, sizeof args, "--input %s --output-prefix %s/w%d %s --append-eod --log-interval 10", runs[r][0], tmpdir, r, runs[r][1]);
        int st = run_preprocess(args, &err);
        mt_expect(st == 0, "run %d failed: %s", r, err);
        free(err);
    }
    for (int r = 1; r < 3; r++) {
        const char *ext[2] = {"bin", "idx"};
        for (int e = 0; e < 2; e++) {
            snprintf(a, sizeof a, "%s/w0_text_document.%s", tmpdir, ext[e]);
            snprintf(b, sizeof b, "%s/w%d_text_document.%s", tmpdir, r, ext[e]);
            mt_expect(same_file(a, b), "%s differs from %s (%s)", b, a, r == 1 ? "--workers 4 vs 1" : "corpus.txt vs corpus.jsonl");
        }
    }
}

// a malformed line stops the run, names the line, and leaves nothing; --skip-bad-lines skips it
MT_TEST(preprocess_bad_lines) {
    if (!have_preprocess()) return;
    char path[256], args[1024], *err;
    snprintf(path, sizeof path, "%s/bad.jsonl", tmpdir);
    const char *text = "{\"text\": \"one\"}\n{\"text\": \"two\"}\n{\"text\": \"three\",}\n{\"text\": \"four\"}\n";
    write_all(path, text, strlen(text));
    for (int w = 1; w <= 4; w *= 4) {
        snprintf(args, sizeof args, "--input %s --output-prefix %s/bad --workers %d", path, tmpdir, w);
        int st = run_preprocess(args, &err);
        mt_expect(st != 0, "a malformed line must fail the run");
        mt_expect(strstr(err, "line 3") != NULL, "the message should name line 3: %s", err);
        mt_expect(strstr(err, "--skip-bad-lines") != NULL, "the hint should offer --skip-bad-lines: %s", err);
        free(err);
        mt_expect(count_files("bad_") == 0, "a failed run must leave no files at the output prefix");
    }
    snprintf(args, sizeof args, "--input %s --output-prefix %s/bad --workers 2 --skip-bad-lines --append-eod", path, tmpdir);
    int st = run_preprocess(args, &err);
    mt_expect(st == 0, "--skip-bad-lines run failed: %s", err);
    mt_expect(strstr(err, "skipped 1 bad line") != NULL, "the skipped line should be counted: %s", err);
    free(err);
    snprintf(path, sizeof path, "%s/bad_text_document.idx", tmpdir);
    idx_file x = parse_idx(path);
    mt_expect(x.ok && x.S == 3 && x.D == 4, "--skip-bad-lines should keep 3 documents");
    if (x.ok && x.S == 3) mt_expect(x.lengths[0] == 2 && x.lengths[1] == 2 && x.lengths[2] == 2, "one token + eod each");
    free_idx(&x);
}

// each error is one clear message with the cause, and leaves no output
MT_TEST(preprocess_errors) {
    if (!have_preprocess()) return;
    char path[256], path2[256], args[1024], *err;
    struct { const char *file, *content, *extra, *want; } cases[] = {
        {"nokey.jsonl", "{\"body\": \"x\"}\n", "", "no key \"text\""},
        {"notstr.jsonl", "{\"text\": 12}\n", "", "not a string"},
        {"notobj.jsonl", "[1, 2]\n", "", "not an object"},
        {"surrogate.jsonl", "{\"text\": \"\\ud800 x\"}\n", "", "surrogate"},
        {"ok.jsonl", "{\"text\": \"x\"}\n", "--vocab-fil data/gpt2-vocab.json", "did you mean --vocab-file"},
        {"ok.jsonl", "{\"text\": \"x\"}\n", "--split-sentences", "punkt"},
        {"ok.jsonl", "{\"text\": \"x\"}\n", "--tokenizer-type SentencePieceTokenizer", "GPT2BPETokenizer"},
        {"ok.jsonl", "{\"text\": \"x\"}\n", "--dataset-impl lazy", "mmap"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        snprintf(path, sizeof path, "%s/%s", tmpdir, cases[c].file);
        write_all(path, cases[c].content, strlen(cases[c].content));
        snprintf(args, sizeof args, "--input %s --output-prefix %s/err %s", path, tmpdir, cases[c].extra);
        int st = run_preprocess(args, &err);
        mt_expect(st != 0 && strstr(err, cases[c].want) != NULL, "case %zu: want an error with \"%s\", got (%d) %s",
                  c, cases[c].want, st, err);
        free(err);
    }
    // unreadable input
    snprintf(args, sizeof args, "--input %s/does-not-exist.jsonl --output-prefix %s/err", tmpdir, tmpdir);
    int st = run_preprocess(args, &err);
    mt_expect(st != 0 && strstr(err, "does-not-exist.jsonl") && strstr(err, "--input"), "missing input: %s", err);
    free(err);
    // bad vocab and merges files: each names the file
    struct { const char *name, *content, *which, *want; } files[] = {
        {"v1.json", "this is not json", "vocab", "not a valid vocab.json"},
        {"v2.json", "{\"a\": 0}", "vocab", "256 single bytes"},
        {"m1.txt", "a b\n", "merges", "#version"},
        {"m2.txt", "#version: 0.2\nzzzq \xc4\xa0the\n", "merges", "not a token"},
        {"missing.json", NULL, "vocab", "cannot open vocab file"},
    };
    for (size_t c = 0; c < sizeof files / sizeof files[0]; c++) {
        snprintf(path, sizeof path, "%s/%s", tmpdir, files[c].name);
        if (files[c].content) write_all(path, files[c].content, strlen(files[c].content));
        snprintf(path2, sizeof path2, "%s/ok.jsonl", tmpdir);
        char cmd[2048], errpath[128];
        snprintf(errpath, sizeof errpath, "%s/err.txt", tmpdir);
        snprintf(cmd, sizeof cmd, "./preprocess --input %s --output-prefix %s/err --vocab-file %s --merge-file %s 2> %s", path2, tmpdir,
                 files[c].which[0] == 'v' ? path : "data/gpt2-vocab.json", files[c].which[0] == 'm' ? path : "data/gpt2-merges.txt", errpath);
        int s = system(cmd);
        size_t n;
        char *e = read_all(errpath, &n);
        mt_expect(s != 0 && e && strstr(e, files[c].want) && strstr(e, files[c].name) && strstr(e, "hint:"),
                  "bad %s file %s: want \"%s\" with the file name and a hint, got %s", files[c].which, files[c].name, files[c].want, e ? e : "");
        free(e);
    }
    mt_expect(count_files("err_") == 0, "failed runs must leave no files");
}

// JSON details: escapes, other keys of any type, duplicate keys, several --json-keys
MT_TEST(preprocess_json_keys) {
    if (!have_preprocess()) return;
    char path[256], args[1024], *err;
    snprintf(path, sizeof path, "%s/keys.jsonl", tmpdir);
    const char *text =
        "{\"id\": 1, \"meta\": {\"a\": [1, -2.5e3, true, null, {\"b\": \"}\"}]}, \"title\": \"T\\u00e9\", \"text\": \"caf\\u00e9 \\ud83d\\ude00\\n\\\"q\\\"\"}\n"
        "\n"
        "{\"text\": \"first\", \"title\": \"x\", \"text\": \"second\"}\n";
    write_all(path, text, strlen(text));
    snprintf(args, sizeof args, "--input %s --output-prefix %s/keys --json-keys text title --workers 2", path, tmpdir);
    int st = run_preprocess(args, &err);
    mt_expect(st == 0, "failed: %s", err);
    free(err);
    const char *want_text[2] = {"caf\xc3\xa9 \xf0\x9f\x98\x80\n\"q\"", "second"};   // the last duplicate wins
    const char *want_title[2] = {"T\xc3\xa9", "x"};
    for (int k = 0; k < 2; k++) {
        char bin[256], idx[256];
        snprintf(bin, sizeof bin, "%s/keys_%s_document.bin", tmpdir, k ? "title" : "text");
        snprintf(idx, sizeof idx, "%s/keys_%s_document.idx", tmpdir, k ? "title" : "text");
        mt_int_list ids = {0};
        for (int d = 0; d < 2; d++) {
            const char *s = k ? want_title[d] : want_text[d];
            mt_tokenizer_encode(&tok, NULL, s, strlen(s), &ids);
        }
        size_t n;
        unsigned char *b = (unsigned char *)read_all(bin, &n);
        int same = b && n == 2 * ids.len;
        for (size_t i = 0; same && i < ids.len; i++) if ((uint32_t)(b[2 * i] | b[2 * i + 1] << 8) != (uint32_t)ids.data[i]) same = 0;
        mt_expect(same, "%s does not hold the decoded strings' ids", bin);
        idx_file x = parse_idx(idx);
        mt_expect(x.ok && x.S == 2 && x.D == 3, "%s: want 2 documents (the blank line is skipped)", idx);
        free_idx(&x);
        free(b);
        mt_int_list_free(&ids);
    }
}

// Megatron writes no sequence for an empty document, but still ends a document there:
// lengths [1+1, 1+1], document index [0, 1, 1, 2] (its add_document with an empty lengths list)
MT_TEST(preprocess_empty_document_megatron_layout) {
    if (!have_preprocess()) return;
    char path[256], args[1024], *err;
    snprintf(path, sizeof path, "%s/empty.jsonl", tmpdir);
    const char *text = "{\"text\": \"a\"}\n{\"text\": \"\"}\n{\"text\": \"b\"}\n";
    write_all(path, text, strlen(text));
    snprintf(args, sizeof args, "--input %s --output-prefix %s/empty --append-eod", path, tmpdir);
    int st = run_preprocess(args, &err);
    mt_expect(st == 0, "failed: %s", err);
    free(err);
    snprintf(path, sizeof path, "%s/empty_text_document.idx", tmpdir);
    idx_file x = parse_idx(path);
    mt_expect(x.ok && x.S == 2 && x.D == 4, "S %llu D %llu, want 2 sequences and 4 document index entries (as Megatron)",
              (unsigned long long)x.S, (unsigned long long)x.D);
    if (x.ok && x.S == 2 && x.D == 4)
        mt_expect(x.doc_index[0] == 0 && x.doc_index[1] == 1 && x.doc_index[2] == 1 && x.doc_index[3] == 2,
                  "document index should be 0 1 1 2");
    free_idx(&x);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/mt_test_tokenizer_XXXXXX");
    if (!mkdtemp(tmpdir)) { perror("mkdtemp"); return 1; }
    double t0 = mt_time_seconds();
    mt_tokenizer_load(&tok, "data/gpt2-vocab.json", "data/gpt2-merges.txt");
    printf("tokenizer loaded in %.3f s\n", mt_time_seconds() - t0);
    mt_run_test(vocab_and_merges_load);
    mt_run_test(tiktoken_cases);
    mt_run_test(pretokenizer_pieces);
    mt_run_test(unicode_classes);
    mt_run_test(bpe_small_equals_large);
    mt_run_test(round_trip_random_bytes);
    mt_run_test(decode_buffer);
    mt_run_test(corpus_token_count);
    mt_run_test(preprocess_corpus_files);
    mt_run_test(preprocess_workers_and_text_input);
    mt_run_test(preprocess_bad_lines);
    mt_run_test(preprocess_errors);
    mt_run_test(preprocess_json_keys);
    mt_run_test(preprocess_empty_document_megatron_layout);
    mt_tokenizer_free(&tok);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    return mt_test_summary();
}

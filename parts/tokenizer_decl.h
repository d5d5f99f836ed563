/* 9. DATA & TOKENIZER: the GPT-2 tokenizer ---------------------------------------------- */
/* GPT-2's byte-level BPE, id for id what OpenAI's tiktoken ("gpt2" encoding, encode_ordinary)
 * gives, from --vocab-file (vocab.json, a.k.a. encoder.json) and --merge-file (merges.txt).
 *
 *   mt_tokenizer tok;
 *   mt_tokenizer_load(&tok, "data/gpt2-vocab.json", "data/gpt2-merges.txt");
 *   mt_bpe_cache cache = {0};            // one per thread: remembers words already split
 *   mt_int_list ids = {0};
 *   mt_tokenizer_encode(&tok, &cache, "Hello world", 11, &ids);   // appends 15496, 995
 *   mt_int_list_push(&ids, tok.eod_id);                           // 50256, end of document
 *   char text[64];
 *   size_t n = mt_tokenizer_decode(&tok, ids.data, ids.len, text, sizeof text);
 *   mt_int_list_free(&ids); mt_bpe_cache_free(&cache); mt_tokenizer_free(&tok);
 *
 * The tokenizer is read-only after loading: any number of threads may encode with it at
 * once, each with its own mt_bpe_cache (or NULL for none). Any byte string encodes, invalid
 * UTF-8 included, and decode(encode(x)) == x byte for byte. Text that contains
 * "<|endoftext|>" is encoded as ordinary text (7 tokens); only the caller adds eod_id. */

/* a growable array of token ids; zero-initialise ({0}) before first use */
typedef struct mt_int_list {
    int32_t *data;
    size_t len;       /* ids in use */
    size_t cap;       /* ids allocated */
} mt_int_list;
void mt_int_list_push(mt_int_list *l, int32_t v);
void mt_int_list_reserve(mt_int_list *l, size_t extra);   /* room for `extra` more ids */
void mt_int_list_free(mt_int_list *l);

#define MT_EOD_TEXT "<|endoftext|>"   /* GPT-2's end-of-document token (id 50256) */

typedef struct mt_tokenizer {
    int vocab_size;        /* number of ids in vocab.json (50257 for GPT-2) */
    int n_merges;          /* merge rules in merges.txt (50000 for GPT-2) */
    int eod_id;            /* id of "<|endoftext|>" (50256), -1 if the vocabulary has none */
    int32_t byte_id[256];  /* id of the one-byte token for each byte value */
    char *bytes;           /* every token's bytes, back to back */
    uint32_t *offsets;     /* (vocab_size+1): token i is bytes[offsets[i] .. offsets[i+1]) */
    struct mt__vocab_slot *vocab_slots;  /* hash map token bytes -> id, (vocab_mask+1) slots */
    size_t vocab_mask;
    struct mt__pair_slot *pair_slots;    /* hash map (left id, right id) -> (rank, merged id) */
    size_t pair_mask;
    size_t n_pairs;
} mt_tokenizer;

/* word -> ids memo for one thread; zero-initialise ({0}); grows to a bounded size, then
 * starts over. hits/misses count the words that needed BPE (for the curious). */
typedef struct mt_bpe_cache {
    struct mt__cache_slot *slots;
    size_t mask, count;
    char *keys;                   /* the cached words' bytes */
    size_t keys_len, keys_cap;
    int32_t *ids;                 /* their ids */
    size_t ids_len, ids_cap;
    size_t hits, misses;
} mt_bpe_cache;

/* reads both files; any problem with them is fatal with a message naming the file */
void mt_tokenizer_load(mt_tokenizer *t, const char *vocab_path, const char *merges_path);
void mt_tokenizer_free(mt_tokenizer *t);
void mt_bpe_cache_free(mt_bpe_cache *c);
/* appends the ids of text[0..len) to out (cache may be NULL); returns how many it appended */
size_t mt_tokenizer_encode(const mt_tokenizer *t, mt_bpe_cache *cache, const char *text, size_t len,
                           mt_int_list *out);
/* writes the bytes of ids[0..n) to out (at most cap bytes, then a NUL if there is room) and
 * returns the full decoded length, as snprintf does. An id outside the vocabulary is fatal. */
size_t mt_tokenizer_decode(const mt_tokenizer *t, const int32_t *ids, size_t n, char *out, size_t cap);
/* the bytes of one token (not NUL-terminated; *len set); NULL and *len = 0 if id is not in the
 * vocabulary. Generation decodes one token at a time with this. */
const char *mt_tokenizer_token_bytes(const mt_tokenizer *t, int32_t id, size_t *len);
/* the id of a token given its bytes, -1 if there is none */
int32_t mt_tokenizer_token_id(const mt_tokenizer *t, const char *bytes, size_t len);
/* GPT-2 pre-tokenization: the end of the piece (pre-token) that starts at byte pos of
 * text[0..len). Encoding splits text into pieces with this, then runs BPE on each piece. */
size_t mt_gpt2_next_piece(const char *text, size_t len, size_t pos);

/* one UTF-8 character at text[0..n): returns its length 1..4 and sets *cp, or 0 if the bytes
 * there are not valid UTF-8 (stray continuation byte, truncated, overlong, surrogate, > U+10FFFF) */
int mt_utf8_decode(const char *text, size_t n, uint32_t *cp);

/* JSON string literal -> UTF-8 (used for vocab.json, loose-JSON input and tests). *p points at
 * the opening quote; on success *p moves past the closing quote, out[0..*out_len) holds the
 * bytes and the result is NULL. out needs room for (end - *p) bytes and may be *p itself (the
 * decoded text is never longer than its literal). On error returns a message, *p at the fault.
 * Strict as Python's json: raw control characters, invalid UTF-8 and lone surrogates are errors. */
const char *mt_json_string(const char **p, const char *end, char *out, size_t *out_len);

// =============================================================================================
// 9. DATA & TOKENIZER
// =============================================================================================
// Mirrors megatron/core/datasets/{indexed_dataset.py, gpt_dataset.py, blended_dataset.py,
// helpers.cpp} and tools/preprocess_data.py. The files are Megatron's, byte for byte.
#include <sys/mman.h>
#include <sys/stat.h>

// ---------------------------------------------------------------------------------------------
// the indexed dataset format (Megatron's "MMIDIDX", version 1), little-endian:
//   PREFIX.bin  the tokens of every sequence, back to back, in the dtype below
//   PREFIX.idx  char     magic[9] = "MMIDIDX\0\0"
//               uint64   version = 1
//               uint8    dtype code: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16
//               uint64   S = number of sequences
//               uint64   D = number of entries of the document index (documents + 1)
//               int32    sequence lengths [S]   (tokens)
//               int64    sequence pointers [S]  (byte offsets into .bin)
//               int64    document index [D]     (first sequence of each document, then S)
// preprocess_data.py writes one sequence per document (unless --split-sentences), so the
// document index is 0, 1, ..., S, except that an empty document adds no sequence (its entry
// repeats the previous one).
static const char mt__idx_magic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};

static size_t mt__dtype_size(int code) {
    switch (code) {
    case 1: case 2: return 1;
    case 3: case 8: return 2;
    case 4: case 7: return 4;
    case 5: case 6: return 8;
    default: return 0;
    }
}
int mt_dtype_for_vocab(int vocab_size) { return vocab_size < 65500 ? 8 : 4; }

static void *mt__map_file(const char *path, size_t *size, const char *hint) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) mt_fatal("cannot open %s: %s\nhint: %s", path, strerror(errno), hint);
    struct stat st;
    if (fstat(fd, &st) != 0) mt_fatal("cannot stat %s: %s", path, strerror(errno));
    *size = (size_t)st.st_size;
    void *p = NULL;
    if (*size > 0) {
        p = mmap(NULL, *size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) mt_fatal("cannot map %s: %s", path, strerror(errno));
    }
    close(fd);
    return p;
}

void mt_indexed_dataset_open(mt_indexed_dataset *d, const char *prefix) {
    memset(d, 0, sizeof *d);
    if (strlen(prefix) + 5 > MT_PATH_MAX) mt_fatal("data path prefix too long: %s", prefix);
    strcpy(d->prefix, prefix);
    char path[MT_PATH_MAX + 8];
    snprintf(path, sizeof path, "%s.idx", prefix);
    const char *hint = "--data-path takes the prefix of PREFIX.bin/PREFIX.idx as written by ./preprocess (e.g. data/my_dataset_text_document)";
    d->idx_map = mt__map_file(path, &d->idx_size, hint);
    const unsigned char *p = (const unsigned char *)d->idx_map;
    size_t header = 9 + 8 + 1 + 8 + 8;
    if (d->idx_size < 9 || memcmp(p, mt__idx_magic, 9) != 0)
        mt_fatal("%s is not a Megatron indexed dataset index (bad magic)\nhint: make it with ./preprocess", path);
    if (d->idx_size < header) mt_fatal("%s is truncated (%zu bytes, the header alone is %zu)\nhint: run ./preprocess again", path, d->idx_size, header);
    uint64_t version, S, D;
    memcpy(&version, p + 9, 8);
    d->dtype = p[17];
    memcpy(&S, p + 18, 8);
    memcpy(&D, p + 26, 8);
    if (version != 1) mt_fatal("%s has index version %llu; only version 1 (MMIDIDX) is known", path, (unsigned long long)version);
    d->elem_size = mt__dtype_size(d->dtype);
    if (d->elem_size == 0 || d->dtype == 6 || d->dtype == 7)
        mt_fatal("%s has dtype code %d, which is not an integer token type", path, d->dtype);
    if (D < 1 || S > (1ull << 40) || D > (1ull << 40)) mt_fatal("%s has impossible counts (%llu sequences, %llu document entries)", path, (unsigned long long)S, (unsigned long long)D);
    size_t need = header + S * 4 + S * 8 + D * 8;
    if (d->idx_size < need)
        mt_fatal("%s is truncated: %zu bytes, but its header promises %llu sequences and %llu documents (%zu bytes)\nhint: run ./preprocess again",
                 path, d->idx_size, (unsigned long long)S, (unsigned long long)(D - 1), need);
    d->num_sequences = S;
    d->num_documents = D - 1;
    // the arrays are 8-byte aligned only by luck of the counts, so copy them into our own memory
    int32_t *lengths = (int32_t *)mt_malloc(S * 4 + 1, "index lengths");
    int64_t *pointers = (int64_t *)mt_malloc(S * 8 + 1, "index pointers");
    int64_t *docs = (int64_t *)mt_malloc(D * 8, "document index");
    memcpy(lengths, p + header, S * 4);
    memcpy(pointers, p + header + S * 4, S * 8);
    memcpy(docs, p + header + S * 12, D * 8);
    d->seq_lengths = lengths;
    d->seq_pointers = pointers;
    d->doc_index = docs;
    snprintf(path, sizeof path, "%s.bin", prefix);
    d->bin_map = mt__map_file(path, &d->bin_size, hint);
    for (uint64_t i = 0; i < S; i++) {
        if (lengths[i] < 0 || pointers[i] < 0 ||
            (uint64_t)pointers[i] + (uint64_t)lengths[i] * d->elem_size > d->bin_size)
            mt_fatal("%s is shorter than %s.idx says (sequence %llu needs bytes up to %llu, the file has %zu)\nhint: the .bin is truncated or belongs to another .idx; run ./preprocess again",
                     path, prefix, (unsigned long long)i, (unsigned long long)((uint64_t)pointers[i] + (uint64_t)lengths[i] * d->elem_size), d->bin_size);
    }
    for (uint64_t i = 0; i < D; i++)
        if (docs[i] < 0 || (uint64_t)docs[i] > S || (i > 0 && docs[i] < docs[i - 1]))
            mt_fatal("%s.idx has a corrupt document index (entry %llu)", prefix, (unsigned long long)i);
    if ((uint64_t)docs[D - 1] != S) mt_fatal("%s.idx: the document index does not end at the sequence count", prefix);
}

void mt_indexed_dataset_close(mt_indexed_dataset *d) {
    if (d->idx_map) munmap(d->idx_map, d->idx_size);
    if (d->bin_map) munmap(d->bin_map, d->bin_size);
    free((void *)d->seq_lengths); free((void *)d->seq_pointers); free((void *)d->doc_index);
    memset(d, 0, sizeof *d);
}

// a document is its sequences, which lie back to back in .bin
int64_t mt_indexed_dataset_doc_length(const mt_indexed_dataset *d, int64_t doc) {
    int64_t n = 0;
    for (int64_t s = d->doc_index[doc]; s < d->doc_index[doc + 1]; s++) n += d->seq_lengths[s];
    return n;
}
int64_t mt_indexed_dataset_token(const mt_indexed_dataset *d, int64_t doc, int64_t pos) {
    int64_t first = d->doc_index[doc];
    const unsigned char *p = (const unsigned char *)d->bin_map + d->seq_pointers[first] + pos * (int64_t)d->elem_size;
    switch (d->dtype) {
    case 1: return *p;
    case 2: return (int8_t)*p;
    case 3: { int16_t v; memcpy(&v, p, 2); return v; }
    case 8: { uint16_t v; memcpy(&v, p, 2); return v; }
    case 4: { int32_t v; memcpy(&v, p, 4); return v; }
    default: { int64_t v; memcpy(&v, p, 8); return v; }
    }
}

// ---------------------------------------------------------------------------------------------
// the writer (Megatron's IndexedDatasetBuilder): tokens stream into PREFIX.bin.tmp.PID; finish
// writes the index to PREFIX.idx.tmp.PID, fsyncs both and renames them, so a run that fails
// leaves nothing half-written under the final names.
struct mt_indexed_builder {
    char bin_path[MT_PATH_MAX + 8], idx_path[MT_PATH_MAX + 8];
    char bin_tmp[MT_PATH_MAX + 32], idx_tmp[MT_PATH_MAX + 32];
    FILE *bin;
    int dtype;
    size_t elem_size;
    int32_t *lengths;       // (count) tokens per sequence
    size_t count, cap;
    int64_t *doc_index;     // (ndocs + 1) first sequence of each document, then count
    size_t ndocs, doc_cap;
    unsigned char *buf;     // conversion buffer for one document
    size_t buf_cap;
};

mt_indexed_builder *mt_indexed_builder_open(const char *prefix, int dtype_code) {
    mt_indexed_builder *b = (mt_indexed_builder *)mt_calloc(1, sizeof *b, "indexed builder");
    if (strlen(prefix) + 5 > MT_PATH_MAX) mt_fatal("output prefix too long: %s", prefix);
    b->dtype = dtype_code;
    b->elem_size = mt__dtype_size(dtype_code);
    if (b->elem_size == 0 || dtype_code == 6 || dtype_code == 7) mt_fatal("indexed builder: dtype code %d is not an integer type", dtype_code);
    snprintf(b->bin_path, sizeof b->bin_path, "%s.bin", prefix);
    snprintf(b->idx_path, sizeof b->idx_path, "%s.idx", prefix);
    b->bin = mt_atomic_open(b->bin_path, b->bin_tmp, sizeof b->bin_tmp);
    b->doc_cap = 1024;
    b->doc_index = (int64_t *)mt_malloc(b->doc_cap * sizeof(int64_t), "document index");
    b->doc_index[0] = 0;
    return b;
}

// a document is one sequence here (no sentence splitting). An empty document writes no
// sequence but still ends a document, as Megatron's builder does: its document index repeats.
void mt_indexed_builder_add_document(mt_indexed_builder *b, const int32_t *tokens, size_t n) {
    if (n > 2147483647u) mt_fatal("a document of %zu tokens is longer than the format's int32 length", n);
    if (b->ndocs + 2 > b->doc_cap) {
        b->doc_cap *= 2;
        b->doc_index = (int64_t *)mt_realloc(b->doc_index, b->doc_cap * sizeof(int64_t), "document index");
    }
    if (n == 0) { b->doc_index[++b->ndocs] = (int64_t)b->count; return; }
    if (b->count == b->cap) {
        b->cap = b->cap ? 2 * b->cap : 1024;
        b->lengths = (int32_t *)mt_realloc(b->lengths, b->cap * sizeof(int32_t), "index lengths");
    }
    b->lengths[b->count++] = (int32_t)n;
    if (n * b->elem_size > b->buf_cap) {
        b->buf_cap = n * b->elem_size * 2;
        b->buf = (unsigned char *)mt_realloc(b->buf, b->buf_cap, "token buffer");
    }
    for (size_t i = 0; i < n; i++) {
        int64_t v = tokens[i];
        unsigned char *p = b->buf + i * b->elem_size;
        switch (b->dtype) {
        case 1: case 2: p[0] = (unsigned char)v; break;
        case 3: case 8: { uint16_t x = (uint16_t)v; memcpy(p, &x, 2); break; }
        case 4: { int32_t x = (int32_t)v; memcpy(p, &x, 4); break; }
        default: memcpy(p, &v, 8); break;
        }
        if (b->dtype == 8 && (v < 0 || v > 65535)) mt_fatal("token id %lld does not fit uint16", (long long)v);
    }
    if (fwrite(b->buf, b->elem_size, n, b->bin) != n)
        mt_fatal("writing %s failed: %s\nhint: check free disk space", b->bin_tmp, strerror(errno));
    b->doc_index[++b->ndocs] = (int64_t)b->count;
}

void mt_indexed_builder_finish(mt_indexed_builder *b) {
    FILE *idx = mt_atomic_open(b->idx_path, b->idx_tmp, sizeof b->idx_tmp);
    uint64_t version = 1, S = b->count, D = b->ndocs + 1;
    unsigned char code = (unsigned char)b->dtype;
    fwrite(mt__idx_magic, 1, 9, idx);
    fwrite(&version, 8, 1, idx);
    fwrite(&code, 1, 1, idx);
    fwrite(&S, 8, 1, idx);
    fwrite(&D, 8, 1, idx);
    if (S) fwrite(b->lengths, 4, S, idx);
    int64_t pointer = 0;
    for (uint64_t i = 0; i < S; i++) {   // byte offsets: the running sum of lengths * elem size
        fwrite(&pointer, 8, 1, idx);
        pointer += (int64_t)b->lengths[i] * (int64_t)b->elem_size;
    }
    fwrite(b->doc_index, 8, D, idx);
    // .bin first, then .idx: a reader never sees a new .idx next to an old .bin
    mt_atomic_commit(b->bin, b->bin_tmp, b->bin_path);
    mt_atomic_commit(idx, b->idx_tmp, b->idx_path);
    free(b->lengths); free(b->doc_index); free(b->buf); free(b);
}

void mt_indexed_builder_abort(mt_indexed_builder *b) {
    mt_atomic_abort(b->bin, b->bin_tmp);
    free(b->lengths); free(b->doc_index); free(b->buf); free(b);
}

// ---------------------------------------------------------------------------------------------
// train/valid/test split of the documents (megatron's get_split_indices):
//   weights w normalised; bounds[i+1] = bounds[i] + round_half_even(w_i * N); then the rounding error
//   (bounds[3] - N) is taken off every bound but the first, so bounds[3] == N.
void mt_split_documents(const char *split, int64_t num_docs, int64_t bounds[4]) {
    double w[3] = {0, 0, 0}, total = 0;
    int n = 0;
    const char *s = split;
    while (*s && n < 3) {
        char *end;
        w[n] = strtod(s, &end);
        if (end == s || w[n] < 0) mt_fatal("--split '%s' is not a list of up to 3 non-negative numbers like 949,50,1", split);
        total += w[n++];
        s = end;
        if (*s == ',' || *s == '/') s++;
        else if (*s) mt_fatal("--split '%s' is not a list like 949,50,1", split);
    }
    if (!(total > 0)) mt_fatal("--split '%s' sums to zero", split);
    bounds[0] = 0;
    // nearbyint rounds halves to even, as Python's round() in Megatron's code does
    for (int i = 0; i < 3; i++) bounds[i + 1] = bounds[i] + (int64_t)nearbyint(w[i] / total * (double)num_docs);
    int64_t diff = bounds[3] - num_docs;
    for (int i = 1; i < 4; i++) bounds[i] -= diff;
    for (int i = 1; i < 4; i++) if (bounds[i] < bounds[i - 1]) bounds[i] = bounds[i - 1];
}

// ---------------------------------------------------------------------------------------------
// GPT samples (gpt_dataset.py's _build_document_sample_shuffle_indices):
//   doc_idx:     the split's documents, once per epoch, each epoch shuffled
//   sample_idx:  sample i starts at document doc_idx[sample_idx[i][0]], token sample_idx[i][1];
//                samples are T+1 tokens and overlap by one (the last target of a sample is the
//                first input of the next), so an epoch of N tokens gives (N-1)/T samples
//   shuffle_idx: the order samples are served in
// Shuffles are Fisher-Yates driven by our counter-based generator (numpy's RNG is not ours
// to reproduce, so indices differ from Megatron's). One more difference: Megatron shuffles the
// documents of all epochs but the last as one permutation (and the last on its own); here each
// epoch is shuffled on its own, so every epoch sees every document exactly once.
static void mt__shuffle(int64_t *a, int64_t n, uint64_t seed, uint64_t stream) {
    for (int64_t i = n - 1; i > 0; i--) {
        uint64_t h = mt_hash64(mt_hash64(seed ^ 0x5eed) ^ mt_hash64(stream) ^ (uint64_t)i);
        int64_t j = (int64_t)(h % (uint64_t)(i + 1));
        int64_t t = a[i]; a[i] = a[j]; a[j] = t;
    }
}

void mt_gpt_dataset_build(mt_gpt_dataset *g, const mt_indexed_dataset *ds, int64_t doc_begin, int64_t doc_end, int T,
                          int64_t min_samples, uint64_t seed, int split_id) {
    memset(g, 0, sizeof *g);
    g->ds = ds;
    g->T = T;
    int64_t ndocs = doc_end - doc_begin, tokens_per_epoch = 0;
    for (int64_t d = doc_begin; d < doc_end; d++) tokens_per_epoch += mt_indexed_dataset_doc_length(ds, d);
    if (ndocs <= 0 || tokens_per_epoch <= T)
        mt_fatal("the %s split of %s has %lld documents and %lld tokens, too few for one sample of %d tokens\nhint: use more data, a shorter --seq-length, or another --split",
                 split_id == 0 ? "train" : split_id == 1 ? "valid" : "test", ds->prefix, (long long)ndocs, (long long)tokens_per_epoch, T + 1);
    int64_t epochs = 1;
    while ((epochs * tokens_per_epoch - 1) / T < min_samples) epochs++;
    g->num_doc_idx = epochs * ndocs;
    g->doc_idx = (int64_t *)mt_malloc(sizeof(int64_t) * (size_t)g->num_doc_idx, "doc_idx");
    for (int64_t e = 0; e < epochs; e++) {
        for (int64_t d = 0; d < ndocs; d++) g->doc_idx[e * ndocs + d] = doc_begin + d;
        mt__shuffle(g->doc_idx + e * ndocs, ndocs, seed, (uint64_t)split_id * 1000003u + (uint64_t)e);
    }
    g->num_samples = (epochs * tokens_per_epoch - 1) / T;
    g->sample_idx = (int64_t *)mt_malloc(sizeof(int64_t) * 2 * (size_t)(g->num_samples + 1), "sample_idx");
    // walk the documents T tokens at a time (helpers.cpp build_sample_idx)
    int64_t di = 0, offset = 0;
    g->sample_idx[0] = 0;
    g->sample_idx[1] = 0;
    for (int64_t i = 1; i <= g->num_samples; i++) {
        int64_t remaining = T;
        while (remaining > 0) {
            int64_t len = mt_indexed_dataset_doc_length(ds, g->doc_idx[di]) - offset;
            if (len > remaining) { offset += remaining; remaining = 0; }
            else { remaining -= len; di++; offset = 0; }
        }
        g->sample_idx[2 * i] = di;
        g->sample_idx[2 * i + 1] = offset;
    }
    g->shuffle_idx = (int64_t *)mt_malloc(sizeof(int64_t) * (size_t)g->num_samples, "shuffle_idx");
    for (int64_t i = 0; i < g->num_samples; i++) g->shuffle_idx[i] = i;
    mt__shuffle(g->shuffle_idx, g->num_samples, seed, 0xffff0000u + (uint64_t)split_id);
}

void mt_gpt_dataset_sample(const mt_gpt_dataset *g, int64_t i, int32_t *out) {
    int64_t s = g->shuffle_idx[i % g->num_samples];
    int64_t di = g->sample_idx[2 * s], offset = g->sample_idx[2 * s + 1];
    int n = 0;
    while (n < g->T + 1) {
        int64_t doc = g->doc_idx[di];
        int64_t len = mt_indexed_dataset_doc_length(g->ds, doc);
        for (; offset < len && n < g->T + 1; offset++) out[n++] = (int32_t)mt_indexed_dataset_token(g->ds, doc, offset);
        di++;
        offset = 0;
    }
}

void mt_gpt_dataset_free(mt_gpt_dataset *g) {
    free(g->doc_idx); free(g->sample_idx); free(g->shuffle_idx);
    memset(g, 0, sizeof *g);
}

// ---------------------------------------------------------------------------------------------
// blending (blended_dataset.py, helpers.cpp build_blending_indices): sample i goes to the
// dataset whose share so far lags its weight the most:
//   d = argmax_d ( w_d * max(i, 1) - taken_d ),  then taken_d += 1
// so after any prefix of i samples each dataset has given w_d * i of them, within one.
static void mt__blend(mt_blended_dataset *b, const double *weights, int64_t num_samples) {
    b->num_samples = num_samples;
    b->dataset_index = (int16_t *)mt_malloc(sizeof(int16_t) * (size_t)num_samples + 1, "blending index");
    b->dataset_sample_index = (int64_t *)mt_malloc(sizeof(int64_t) * (size_t)num_samples + 1, "blending index");
    int64_t taken[MT_MAX_DATA_PATHS] = {0};
    for (int64_t i = 0; i < num_samples; i++) {
        double denom = i > 0 ? (double)i : 1.0;
        int best = 0;
        double best_err = -1e300;
        for (int d = 0; d < b->num_datasets; d++) {
            double err = weights[d] * denom - (double)taken[d];
            if (err > best_err) { best_err = err; best = d; }
        }
        b->dataset_index[i] = (int16_t)best;
        b->dataset_sample_index[i] = taken[best]++;
    }
}

void mt_blended_sample(const mt_blended_dataset *b, int64_t i, int32_t *out) {
    i %= b->num_samples;
    mt_gpt_dataset_sample(&b->parts[b->dataset_index[i]], b->dataset_sample_index[i], out);
}

void mt_data_init(mt_data *d, const mt_config *cfg) {
    memset(d, 0, sizeof *d);
    const mt_train_config *t = &cfg->train;
    if (t->num_data_paths == 0) mt_fatal("no --data-path given\nhint: make one with ./preprocess, e.g. --data-path data/my_dataset_text_document");
    d->num_paths = t->num_data_paths;
    int64_t gbs = t->global_batch_size;
    int64_t need[3];
    need[0] = (int64_t)t->train_iters * gbs;
    need[1] = (t->eval_interval > 0 ? (int64_t)(t->train_iters / t->eval_interval + 1) : 1) * t->eval_iters * gbs;
    need[2] = (int64_t)t->eval_iters * gbs;
    double weights[MT_MAX_DATA_PATHS];
    int64_t bounds[MT_MAX_DATA_PATHS][4];
    double total_tokens = 0;
    for (int p = 0; p < d->num_paths; p++) {
        mt_indexed_dataset_open(&d->files[p], t->data_path[p]);
        mt_split_documents(t->split, (int64_t)d->files[p].num_documents, bounds[p]);
        // no weights given: weigh by size, as Megatron does for a plain list of prefixes
        weights[p] = t->data_weight[p] > 0 ? t->data_weight[p] : (double)d->files[p].bin_size / (double)d->files[p].elem_size;
        total_tokens += weights[p];
    }
    for (int p = 0; p < d->num_paths; p++) if (t->data_weight[p] <= 0) weights[p] /= total_tokens;
    for (int s = 0; s < 3; s++) {
        int ok = need[s] > 0;
        for (int p = 0; p < d->num_paths; p++) if (bounds[p][s + 1] <= bounds[p][s]) ok = 0;
        if (!ok) {
            if (s == 0) mt_fatal("the train split is empty or no training is asked for\nhint: check --split (e.g. 949,50,1) and --train-iters");
            continue;
        }
        mt_blended_dataset *b = &d->split[s];
        b->num_datasets = d->num_paths;
        for (int p = 0; p < d->num_paths; p++) {
            // each part gets its share of the samples plus 0.5% (Megatron's margin for rounding)
            int64_t part_need = d->num_paths == 1 ? need[s] : (int64_t)ceil(weights[p] * (double)need[s] * 1.005) + 1;
            mt_gpt_dataset_build(&b->parts[p], &d->files[p], bounds[p][s], bounds[p][s + 1], cfg->model.seq_length, part_need,
                                 t->seed, s);
        }
        mt__blend(b, weights, need[s]);
        d->has_split[s] = 1;
    }
}

void mt_data_free(mt_data *d) {
    for (int s = 0; s < 3; s++) {
        if (!d->has_split[s]) continue;
        for (int p = 0; p < d->split[s].num_datasets; p++) mt_gpt_dataset_free(&d->split[s].parts[p]);
        free(d->split[s].dataset_index);
        free(d->split[s].dataset_sample_index);
    }
    for (int p = 0; p < d->num_paths; p++) mt_indexed_dataset_close(&d->files[p]);
}

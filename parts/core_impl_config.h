// ---------------------------------------------------------------------------------------------
// config: defaults, Megatron's flags, the JSON config file, derived values
// ---------------------------------------------------------------------------------------------
// Every flag is one row of mt__flags[]: its Megatron name, where it lands in mt_config, its
// group for --help, and a one-line help. The same table serves the JSON config file: a key
// "hidden_size" is the flag --hidden-size. Flags of older Megatron versions are listed in
// mt__old_flags[] with today's equivalent, so an old tutorial gets a useful message.

void mt_config_defaults(mt_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->model.num_layers = 12;
    cfg->model.hidden_size = 768;
    cfg->model.num_attention_heads = 12;
    cfg->model.ffn_hidden_size = 0;            // 0 = 4 * hidden_size
    cfg->model.seq_length = 1024;
    cfg->model.max_position_embeddings = 0;    // 0 = seq_length
    cfg->model.vocab_size = 0;                 // 0 = from --vocab-file, else GPT-2's 50257
    cfg->model.make_vocab_size_divisible_by = 128;
    cfg->model.init_method_std = 0.02f;
    cfg->parallel.tensor_model_parallel_size = 1;
    cfg->parallel.pipeline_model_parallel_size = 1;
    cfg->parallel.ddp_bucket_size = 40000000;  // Megatron's default bucket: 40M elements
    cfg->train.micro_batch_size = 1;
    cfg->train.global_batch_size = 0;          // 0 = micro * DP
    cfg->train.train_iters = 0;
    cfg->train.lr = 1e-4f;
    cfg->train.min_lr = 0.0f;
    strcpy(cfg->train.lr_decay_style, "linear");
    cfg->train.weight_decay = 0.01f;
    cfg->train.adam_beta1 = 0.9f;
    cfg->train.adam_beta2 = 0.999f;
    cfg->train.adam_eps = 1e-8f;
    cfg->train.clip_grad = 1.0f;
    cfg->train.seed = 1234;
    cfg->train.log_interval = 100;
    cfg->train.eval_interval = 1000;
    cfg->train.eval_iters = 100;
    strcpy(cfg->train.split, "969,30,1");
    strcpy(cfg->train.tokenizer_type, "GPT2BPETokenizer");
}

typedef enum { MT__INT, MT__LONG, MT__U64, MT__FLOAT, MT__DOUBLE, MT__STR, MT__BOOL, MT__DATA_PATH, MT__CONFIG_FILE, MT__IGNORED } mt__flag_type;

typedef struct {
    const char *name;       // as on Megatron's command line
    mt__flag_type type;
    size_t offset;          // offsetof(mt_config, ...) for the value
    size_t size;            // bytes available for strings
    const char *group;
    const char *help;
} mt__flag;

#define MT__OFF(field) offsetof(mt_config, field)
static const mt__flag mt__flags[] = {
    {"--config", MT__CONFIG_FILE, 0, 0, "model", "JSON file with any of these settings, keys as flags with _ (hidden_size); flags override it"},
    {"--num-layers", MT__INT, MT__OFF(model.num_layers), 0, "model", "transformer layers (L)"},
    {"--hidden-size", MT__INT, MT__OFF(model.hidden_size), 0, "model", "hidden size (C)"},
    {"--num-attention-heads", MT__INT, MT__OFF(model.num_attention_heads), 0, "model", "attention heads (NH)"},
    {"--ffn-hidden-size", MT__INT, MT__OFF(model.ffn_hidden_size), 0, "model", "MLP hidden size (F), default 4 * hidden size"},
    {"--seq-length", MT__INT, MT__OFF(model.seq_length), 0, "model", "tokens per sample (T)"},
    {"--max-position-embeddings", MT__INT, MT__OFF(model.max_position_embeddings), 0, "model", "rows of the position embedding, default seq length"},
    {"--vocab-size", MT__INT, MT__OFF(model.vocab_size), 0, "model", "vocabulary size when there is no --vocab-file (NullTokenizer)"},
    {"--make-vocab-size-divisible-by", MT__INT, MT__OFF(model.make_vocab_size_divisible_by), 0, "model", "pad the vocabulary to a multiple of this times TP"},
    {"--init-method-std", MT__FLOAT, MT__OFF(model.init_method_std), 0, "model", "std of the normal weight init"},
    {"--hidden-dropout", MT__FLOAT, MT__OFF(model.hidden_dropout), 0, "model", "dropout after embeddings, attention proj and MLP"},
    {"--attention-dropout", MT__FLOAT, MT__OFF(model.attention_dropout), 0, "model", "dropout on attention probabilities"},
    {"--tensor-model-parallel-size", MT__INT, MT__OFF(parallel.tensor_model_parallel_size), 0, "parallel", "tensor parallel ranks (TP)"},
    {"--pipeline-model-parallel-size", MT__INT, MT__OFF(parallel.pipeline_model_parallel_size), 0, "parallel", "pipeline stages (PP)"},
    {"--nproc-per-node", MT__INT, MT__OFF(parallel.nproc_per_node), 0, "parallel", "ranks (threads on the CPU build); DP = ranks / (TP*PP); default TP*PP"},
    {"--num-layers-per-virtual-pipeline-stage", MT__INT, MT__OFF(parallel.num_layers_per_virtual_pipeline_stage), 0, "parallel", "interleaved 1F1B: layers per model chunk"},
    {"--ddp-bucket-size", MT__LONG, MT__OFF(parallel.ddp_bucket_size), 0, "parallel", "gradient elements per data-parallel all-reduce bucket"},
    {"--print-layout", MT__BOOL, MT__OFF(parallel.print_layout), 0, "parallel", "print the TP/PP/DP/embedding groups and exit"},
    {"--print-schedule", MT__BOOL, MT__OFF(parallel.print_schedule), 0, "parallel", "print each stage's pipeline time line and the bubble, then exit"},
    {"--micro-batch-size", MT__INT, MT__OFF(train.micro_batch_size), 0, "training", "samples per micro-batch per rank (B)"},
    {"--global-batch-size", MT__INT, MT__OFF(train.global_batch_size), 0, "training", "samples per iteration = B * DP * accumulation steps"},
    {"--train-iters", MT__INT, MT__OFF(train.train_iters), 0, "training", "iterations to train"},
    {"--lr", MT__FLOAT, MT__OFF(train.lr), 0, "training", "peak learning rate"},
    {"--min-lr", MT__FLOAT, MT__OFF(train.min_lr), 0, "training", "learning rate at the end of decay"},
    {"--lr-decay-style", MT__STR, MT__OFF(train.lr_decay_style), sizeof(((mt_config *)0)->train.lr_decay_style), "training", "constant | linear | cosine"},
    {"--lr-decay-iters", MT__INT, MT__OFF(train.lr_decay_iters), 0, "training", "iterations to decay over, default train iters"},
    {"--lr-warmup-iters", MT__INT, MT__OFF(train.lr_warmup_iters), 0, "training", "linear warm-up iterations"},
    {"--lr-warmup-fraction", MT__DOUBLE, MT__OFF(train.lr_warmup_fraction), 0, "training", "warm-up as a fraction of lr decay iters"},
    {"--weight-decay", MT__FLOAT, MT__OFF(train.weight_decay), 0, "training", "AdamW decoupled weight decay (not on biases and layernorms)"},
    {"--adam-beta1", MT__FLOAT, MT__OFF(train.adam_beta1), 0, "training", "AdamW beta1"},
    {"--adam-beta2", MT__FLOAT, MT__OFF(train.adam_beta2), 0, "training", "AdamW beta2"},
    {"--adam-eps", MT__FLOAT, MT__OFF(train.adam_eps), 0, "training", "AdamW epsilon"},
    {"--clip-grad", MT__FLOAT, MT__OFF(train.clip_grad), 0, "training", "clip gradients to this global norm (0 = off)"},
    {"--seed", MT__U64, MT__OFF(train.seed), 0, "training", "seed of init, data shuffling and dropout"},
    {"--fp32", MT__BOOL, MT__OFF(train.fp32), 0, "training", "compute in fp32 (always so on the CPU build)"},
    {"--bf16", MT__BOOL, MT__OFF(train.bf16), 0, "training", "compute in bf16 (GPU build)"},
    {"--fp16", MT__BOOL, MT__OFF(train.fp16), 0, "training", "compute in fp16 (GPU build)"},
    {"--log-interval", MT__INT, MT__OFF(train.log_interval), 0, "logging", "iterations between iteration lines"},
    {"--eval-interval", MT__INT, MT__OFF(train.eval_interval), 0, "logging", "iterations between validation runs"},
    {"--eval-iters", MT__INT, MT__OFF(train.eval_iters), 0, "logging", "global batches per validation run"},
    {"--save-interval", MT__INT, MT__OFF(train.save_interval), 0, "checkpointing", "iterations between checkpoints"},
    {"--save", MT__STR, MT__OFF(train.save), MT_PATH_MAX, "checkpointing", "checkpoint directory to write"},
    {"--load", MT__STR, MT__OFF(train.load), MT_PATH_MAX, "checkpointing", "checkpoint directory to resume from"},
    {"--data-path", MT__DATA_PATH, 0, 0, "data", "PREFIX, or W1 PREFIX1 W2 PREFIX2 ... (blended by weight)"},
    {"--split", MT__STR, MT__OFF(train.split), 64, "data", "train,valid,test proportions of the documents, e.g. 949,50,1"},
    {"--vocab-file", MT__STR, MT__OFF(train.vocab_file), MT_PATH_MAX, "data", "GPT-2 vocab.json"},
    {"--merge-file", MT__STR, MT__OFF(train.merge_file), MT_PATH_MAX, "data", "GPT-2 merges.txt"},
    {"--tokenizer-type", MT__STR, MT__OFF(train.tokenizer_type), 32, "data", "GPT2BPETokenizer | NullTokenizer"},
    // accepted for compatibility with tutorials; they change nothing here, and say why once
    {"--distributed-backend", MT__IGNORED, 0, 1, "ignored", "ranks talk through threads (CPU) or NCCL (GPU)"},
    {"--data-impl", MT__IGNORED, 0, 1, "ignored", "the indexed dataset is always memory-mapped"},
    {"--dataset-impl", MT__IGNORED, 0, 1, "ignored", "the indexed dataset is always memory-mapped"},
    {"--transformer-impl", MT__IGNORED, 0, 1, "ignored", "there is one transformer implementation"},
    {"--no-masked-softmax-fusion", MT__IGNORED, 0, 0, "ignored", "attention is always one fused causal kernel"},
    {"--no-bias-gelu-fusion", MT__IGNORED, 0, 0, "ignored", "fusion is a kernel detail here"},
    {"--no-bias-dropout-fusion", MT__IGNORED, 0, 0, "ignored", "fusion is a kernel detail here"},
    {"--attention-softmax-in-fp32", MT__IGNORED, 0, 0, "ignored", "softmax always accumulates in fp32"},
    {"--use-flash-attn", MT__IGNORED, 0, 0, "ignored", "attention never stores the T x T matrix on the GPU"},
    {"--position-embedding-type", MT__IGNORED, 0, 1, "ignored", "GPT-2's learned absolute positions"},
};
static const struct { const char *old_name, *hint; } mt__old_flags[] = {
    {"--model-parallel-size", "--tensor-model-parallel-size"},
    {"--batch-size", "--micro-batch-size (per rank) and --global-batch-size"},
    {"--warmup", "--lr-warmup-fraction"},
    {"--lr-warmup-samples", "--lr-warmup-iters (iterations; sample-based schedules are not supported)"},
    {"--checkpoint-activations", "--recompute-granularity full --recompute-method uniform"},
    {"--DDP-impl", "nothing: there is one data-parallel implementation"},
    {"--train-samples", "--train-iters (iterations = samples / global batch size)"},
    {"--num-gpus", "--nproc-per-node"},
};

static int mt__edit_distance(const char *a, const char *b) {
    int la = (int)strlen(a), lb = (int)strlen(b);
    if (la > 63 || lb > 63) return 99;
    int d[64][64];
    for (int i = 0; i <= la; i++) d[i][0] = i;
    for (int j = 0; j <= lb; j++) d[0][j] = j;
    for (int i = 1; i <= la; i++)
        for (int j = 1; j <= lb; j++) {
            int best = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            if (d[i - 1][j] + 1 < best) best = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < best) best = d[i][j - 1] + 1;
            d[i][j] = best;
        }
    return d[la][lb];
}

static const mt__flag *mt__find_flag(const char *name) {
    for (size_t i = 0; i < sizeof mt__flags / sizeof mt__flags[0]; i++)
        if (strcmp(mt__flags[i].name, name) == 0) return &mt__flags[i];
    return NULL;
}

static void mt__unknown_flag(const char *name) {
    for (size_t i = 0; i < sizeof mt__old_flags / sizeof mt__old_flags[0]; i++)
        if (strcmp(mt__old_flags[i].old_name, name) == 0)
            mt_fatal("flag %s is from an older Megatron and no longer exists\nhint: use %s", name, mt__old_flags[i].hint);
    const char *best = NULL;
    int best_d = 1 << 30;
    for (size_t i = 0; i < sizeof mt__flags / sizeof mt__flags[0]; i++) {
        int d = mt__edit_distance(name, mt__flags[i].name);
        if (d < best_d) { best_d = d; best = mt__flags[i].name; }
    }
    mt_fatal("unknown flag %s\nhint: did you mean %s? (--help lists every flag)", name, best);
}

static int mt__parse_int(const char *flag, const char *s) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || end == s || v < -2147483647L || v > 2147483647L)
        mt_fatal("%s expects an integer, got '%s'", flag, s);
    return (int)v;
}
static double mt__parse_double(const char *flag, const char *s) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || end == s) mt_fatal("%s expects a number, got '%s'", flag, s);
    return v;
}
static int mt__is_number(const char *s) {
    char *end;
    if (!*s) return 0;
    strtod(s, &end);
    return *end == 0;
}

/* sets one flag from its text value(s); for --data-path, values[0..nvalues) */
static void mt__set_flag(mt_config *cfg, const mt__flag *f, const char *const *values, int nvalues) {
    char *base = (char *)cfg;
    const char *v = nvalues > 0 ? values[0] : NULL;
    switch (f->type) {
    case MT__INT: *(int *)(base + f->offset) = mt__parse_int(f->name, v); break;
    case MT__LONG: *(long *)(base + f->offset) = (long)mt__parse_double(f->name, v); break;
    case MT__U64: *(unsigned long long *)(base + f->offset) = (unsigned long long)mt__parse_double(f->name, v); break;
    case MT__FLOAT: *(float *)(base + f->offset) = (float)mt__parse_double(f->name, v); break;
    case MT__DOUBLE: *(double *)(base + f->offset) = mt__parse_double(f->name, v); break;
    case MT__BOOL: *(int *)(base + f->offset) = 1; break;
    case MT__STR:
        if (strlen(v) + 1 > f->size) mt_fatal("%s value is too long (%zu bytes, at most %zu)", f->name, strlen(v), f->size - 1);
        strcpy(base + f->offset, v);
        break;
    case MT__DATA_PATH: {
        // Megatron's forms: "PREFIX", "W1 P1 W2 P2 ...", or "P1 P2 ..." (weighted by size)
        int weighted = nvalues >= 2 && mt__is_number(values[0]);
        if (weighted && nvalues % 2) mt_fatal("--data-path with weights needs pairs 'WEIGHT PREFIX', got %d values", nvalues);
        int n = weighted ? nvalues / 2 : nvalues;
        if (n > MT_MAX_DATA_PATHS) mt_fatal("--data-path: at most %d datasets, got %d", MT_MAX_DATA_PATHS, n);
        double total = 0;
        for (int i = 0; i < n; i++) {
            const char *prefix = weighted ? values[2 * i + 1] : values[i];
            if (strlen(prefix) + 1 > MT_PATH_MAX) mt_fatal("--data-path prefix too long");
            strcpy(cfg->train.data_path[i], prefix);
            cfg->train.data_weight[i] = weighted ? mt__parse_double("--data-path weight", values[2 * i]) : 0.0;
            if (weighted && !(cfg->train.data_weight[i] > 0)) mt_fatal("--data-path weight must be positive, got %s", values[2 * i]);
            total += cfg->train.data_weight[i];
        }
        for (int i = 0; i < n && weighted; i++) cfg->train.data_weight[i] /= total;
        cfg->train.num_data_paths = n;
        break;
    }
    case MT__CONFIG_FILE: mt_config_load_json(cfg, v); break;
    case MT__IGNORED: fprintf(stderr, "note: %s has no effect here: %s\n", f->name, f->help); break;
    }
}

static int mt__flag_takes_value(const mt__flag *f) {
    return f->type != MT__BOOL && !(f->type == MT__IGNORED && f->size == 0);
}

void mt_config_parse(mt_config *cfg, int argc, char **argv) {
    // the config file first, wherever it stands, so that every flag overrides it
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--config") == 0 && i + 1 < argc) mt_config_load_json(cfg, argv[i + 1]);
        if (strncmp(argv[i], "--config=", 9) == 0) mt_config_load_json(cfg, argv[i] + 9);
    }
    for (int i = 1; i < argc; i++) {
        const char *name = argv[i];
        if (strcmp(name, "--help") == 0 || strcmp(name, "-h") == 0) { mt_print_help(stdout); exit(0); }
        if (strncmp(name, "--", 2) != 0) mt_fatal("unexpected argument '%s'\nhint: every setting is a --flag (see --help)", name);
        char namebuf[128];
        const char *eq = strchr(name, '=');   // --flag=value is accepted too
        const char *inline_value = NULL;
        if (eq && (size_t)(eq - name) < sizeof namebuf) {
            memcpy(namebuf, name, (size_t)(eq - name));
            namebuf[eq - name] = 0;
            name = namebuf;
            inline_value = eq + 1;
        }
        const mt__flag *f = mt__find_flag(name);
        if (!f) mt__unknown_flag(name);
        if (f->type == MT__DATA_PATH) {
            int n = 0;
            while (i + 1 + n < argc && strncmp(argv[i + 1 + n], "--", 2) != 0) n++;
            if (n == 0) mt_fatal("--data-path needs a prefix");
            mt__set_flag(cfg, f, (const char *const *)&argv[i + 1], n);
            i += n;
        } else if (!mt__flag_takes_value(f)) {
            mt__set_flag(cfg, f, NULL, 0);
        } else if (inline_value) {
            if (f->type != MT__CONFIG_FILE) mt__set_flag(cfg, f, &inline_value, 1);   // the file: loaded above
        } else {
            if (i + 1 >= argc) mt_fatal("%s needs a value", name);
            if (f->type == MT__CONFIG_FILE) { i++; continue; }   // already loaded above
            mt__set_flag(cfg, f, (const char *const *)&argv[i + 1], 1);
            i++;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// a small JSON reader for config files: one object of "key": number | string | bool,
// with // and /* */ comments allowed (tutorial configs carry them)
// ---------------------------------------------------------------------------------------------
typedef struct { const char *s; const char *path; int line; } mt__json_cursor;

static void mt__json_skip(mt__json_cursor *c) {
    for (;;) {
        while (*c->s == ' ' || *c->s == '\t' || *c->s == '\r' || *c->s == '\n') { if (*c->s == '\n') c->line++; c->s++; }
        if (c->s[0] == '/' && c->s[1] == '/') { while (*c->s && *c->s != '\n') c->s++; continue; }
        if (c->s[0] == '/' && c->s[1] == '*') {
            c->s += 2;
            while (*c->s && !(c->s[0] == '*' && c->s[1] == '/')) { if (*c->s == '\n') c->line++; c->s++; }
            if (*c->s) c->s += 2;
            continue;
        }
        return;
    }
}
static void mt__json_string(mt__json_cursor *c, char *out, size_t cap) {
    if (*c->s != '"') mt_fatal("%s:%d: expected a string\nhint: config files are JSON objects of \"key\": value", c->path, c->line);
    c->s++;
    size_t n = 0;
    while (*c->s && *c->s != '"') {
        char ch = *c->s++;
        if (ch == '\\' && *c->s) ch = *c->s++;   // simple escapes are enough for keys and paths
        if (n + 1 < cap) out[n++] = ch;
    }
    if (*c->s != '"') mt_fatal("%s:%d: unterminated string", c->path, c->line);
    c->s++;
    out[n] = 0;
}

void mt_config_load_json(mt_config *cfg, const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) mt_fatal("cannot open config file %s: %s", path, strerror(errno));
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = (char *)mt_malloc((size_t)size + 1, "config file");
    size_t got = fread(text, 1, (size_t)size, f);
    fclose(f);
    text[got] = 0;
    mt__json_cursor c = {text, path, 1};
    mt__json_skip(&c);
    if (*c.s != '{') mt_fatal("%s:%d: a config file is one JSON object { ... }", path, c.line);
    c.s++;
    for (;;) {
        mt__json_skip(&c);
        if (*c.s == '}') break;
        char key[128], value[MT_PATH_MAX];
        mt__json_string(&c, key, sizeof key);
        mt__json_skip(&c);
        if (*c.s != ':') mt_fatal("%s:%d: expected ':' after \"%s\"", path, c.line, key);
        c.s++;
        mt__json_skip(&c);
        int is_bool = 0, bool_value = 0;
        if (*c.s == '"') mt__json_string(&c, value, sizeof value);
        else {
            size_t n = 0;
            while (*c.s && *c.s != ',' && *c.s != '}' && *c.s != '\n' && *c.s != ' ' && *c.s != '/' && n + 1 < sizeof value) value[n++] = *c.s++;
            value[n] = 0;
            if (strcmp(value, "true") == 0) is_bool = 1, bool_value = 1;
            else if (strcmp(value, "false") == 0) is_bool = 1;
            else if (strcmp(value, "null") == 0) is_bool = 1;
        }
        char flag[140] = "--";
        for (size_t i = 0; key[i] && i + 3 < sizeof flag; i++) { flag[i + 2] = key[i] == '_' ? '-' : key[i]; flag[i + 3] = 0; }
        const mt__flag *fl = mt__find_flag(flag);
        if (!fl) {
            const char *best = NULL;
            int best_d = 1 << 30;
            for (size_t i = 0; i < sizeof mt__flags / sizeof mt__flags[0]; i++) {
                int d = mt__edit_distance(flag, mt__flags[i].name);
                if (d < best_d) { best_d = d; best = mt__flags[i].name; }
            }
            char suggestion[128];
            snprintf(suggestion, sizeof suggestion, "%s", best + 2);
            for (char *q = suggestion; *q; q++) if (*q == '-') *q = '_';   // keys are spelled with _
            mt_fatal("%s:%d: unknown key \"%s\"\nhint: did you mean \"%s\"?", path, c.line, key, suggestion);
        }
        if (fl->type == MT__BOOL) { if (bool_value) mt__set_flag(cfg, fl, NULL, 0); }
        else if (is_bool) { /* null / false for a valued key: keep the default */ }
        else { const char *vp = value; mt__set_flag(cfg, fl, &vp, 1); }
        mt__json_skip(&c);
        if (*c.s == ',') { c.s++; continue; }
        mt__json_skip(&c);
        if (*c.s == '}') break;
        mt_fatal("%s:%d: expected ',' or '}'", path, c.line);
    }
    free(text);
}

void mt_print_help(FILE *f) {
    fprintf(f, "usage: train_gpt [flags]   (Megatron-LM's pretrain_gpt.py flags; values after a space or '=')\n");
    const char *groups[] = {"model", "parallel", "training", "data", "logging", "checkpointing", "ignored"};
    mt_config d;
    mt_config_defaults(&d);
    for (size_t g = 0; g < sizeof groups / sizeof groups[0]; g++) {
        fprintf(f, "\n%s:\n", groups[g]);
        for (size_t i = 0; i < sizeof mt__flags / sizeof mt__flags[0]; i++) {
            const mt__flag *fl = &mt__flags[i];
            if (strcmp(fl->group, groups[g]) != 0) continue;
            char def[64] = "";
            const char *base = (const char *)&d;
            switch (fl->type) {
            case MT__INT: snprintf(def, sizeof def, "%d", *(const int *)(base + fl->offset)); break;
            case MT__LONG: snprintf(def, sizeof def, "%ld", *(const long *)(base + fl->offset)); break;
            case MT__U64: snprintf(def, sizeof def, "%llu", *(const unsigned long long *)(base + fl->offset)); break;
            case MT__FLOAT: snprintf(def, sizeof def, "%g", (double)*(const float *)(base + fl->offset)); break;
            case MT__DOUBLE: snprintf(def, sizeof def, "%g", *(const double *)(base + fl->offset)); break;
            case MT__STR: snprintf(def, sizeof def, "'%s'", base + fl->offset); break;
            default: break;
            }
            fprintf(f, "  %-42s %s%s%s%s\n", fl->name, fl->help, def[0] ? " [default " : "", def, def[0] ? "]" : "");
        }
    }
    fprintf(f, "\n(0 for a size means 'derive it': ffn = 4*hidden, max positions = seq length, global batch = micro*DP)\n");
}

int mt_pad_vocab_size(int vocab_size, int divisible_by, int tp_size) {
    // Megatron's _vocab_size_with_padding: round up to a multiple of divisible_by * TP, so
    // every TP rank holds the same number of embedding rows.
    int multiple = divisible_by * tp_size;
    return (vocab_size + multiple - 1) / multiple * multiple;
}

void mt_config_derive(mt_config *cfg) {
    mt_model_config *m = &cfg->model;
    mt_parallel_config *p = &cfg->parallel;
    mt_train_config *t = &cfg->train;
    if (m->ffn_hidden_size == 0) m->ffn_hidden_size = 4 * m->hidden_size;
    if (m->max_position_embeddings == 0) m->max_position_embeddings = m->seq_length;
    if (m->vocab_size == 0) m->vocab_size = 50257;   // GPT-2's; the trainer sets it from the vocab file
    if (m->num_layers <= 0 || m->hidden_size <= 0 || m->num_attention_heads <= 0 || m->seq_length <= 0)
        mt_fatal("--num-layers, --hidden-size, --num-attention-heads and --seq-length must be positive");
    if (m->hidden_size % m->num_attention_heads)
        mt_fatal("--hidden-size %d is not divisible by --num-attention-heads %d\nhint: pick heads that divide the hidden size", m->hidden_size, m->num_attention_heads);
    if (m->seq_length > m->max_position_embeddings)
        mt_fatal("--seq-length %d is longer than --max-position-embeddings %d\nhint: raise --max-position-embeddings", m->seq_length, m->max_position_embeddings);
    if (m->hidden_dropout < 0 || m->hidden_dropout >= 1 || m->attention_dropout < 0 || m->attention_dropout >= 1)
        mt_fatal("dropout probabilities must be in [0, 1)");
    int TP = p->tensor_model_parallel_size, PP = p->pipeline_model_parallel_size;
    if (TP < 1 || PP < 1) mt_fatal("--tensor-model-parallel-size and --pipeline-model-parallel-size must be at least 1");
    if (m->num_attention_heads % TP)
        mt_fatal("--num-attention-heads %d is not divisible by --tensor-model-parallel-size %d\nhint: each TP rank holds NH/TP whole heads; use a TP that divides %d",
                 m->num_attention_heads, TP, m->num_attention_heads);
    if (m->ffn_hidden_size % TP)
        mt_fatal("--ffn-hidden-size %d is not divisible by --tensor-model-parallel-size %d\nhint: use a TP that divides it", m->ffn_hidden_size, TP);
    if (m->num_layers % PP)
        mt_fatal("--num-layers %d is not divisible by --pipeline-model-parallel-size %d\nhint: every stage holds L/PP layers; use a PP that divides %d", m->num_layers, PP, m->num_layers);
    int world = p->nproc_per_node > 0 ? p->nproc_per_node : TP * PP;
    if (world % (TP * PP))
        mt_fatal("%d ranks cannot be split into TP=%d x PP=%d x DP\nhint: --nproc-per-node must be a multiple of TP*PP = %d", world, TP, PP, TP * PP);
    cfg->world_size = world;
    cfg->data_parallel_size = world / (TP * PP);
    cfg->head_size = m->hidden_size / m->num_attention_heads;
    cfg->padded_vocab_size = mt_pad_vocab_size(m->vocab_size, m->make_vocab_size_divisible_by, TP);
    cfg->virtual_pipeline_size = 1;
    if (p->num_layers_per_virtual_pipeline_stage > 0) {
        int per_stage = m->num_layers / PP;
        if (PP < 2) mt_fatal("--num-layers-per-virtual-pipeline-stage needs --pipeline-model-parallel-size > 1");
        if (per_stage % p->num_layers_per_virtual_pipeline_stage)
            mt_fatal("%d layers per pipeline stage are not divisible by --num-layers-per-virtual-pipeline-stage %d", per_stage, p->num_layers_per_virtual_pipeline_stage);
        cfg->virtual_pipeline_size = per_stage / p->num_layers_per_virtual_pipeline_stage;
    }
    int DP = cfg->data_parallel_size, B = t->micro_batch_size;
    if (B < 1) mt_fatal("--micro-batch-size must be at least 1");
    if (t->global_batch_size == 0) t->global_batch_size = B * DP;
    if (t->global_batch_size % (B * DP))
        mt_fatal("--global-batch-size %d is not divisible by micro-batch-size %d x data-parallel size %d = %d\nhint: use a global batch that is a multiple of %d",
                 t->global_batch_size, B, DP, B * DP, B * DP);
    cfg->num_microbatches = t->global_batch_size / (B * DP);
    if (cfg->virtual_pipeline_size > 1 && cfg->num_microbatches % PP)
        mt_fatal("the interleaved schedule needs the number of micro-batches (%d) to be a multiple of PP (%d)\nhint: change --global-batch-size", cfg->num_microbatches, PP);
    if (strcmp(t->lr_decay_style, "constant") && strcmp(t->lr_decay_style, "linear") && strcmp(t->lr_decay_style, "cosine"))
        mt_fatal("--lr-decay-style '%s' is not known\nhint: use constant, linear or cosine", t->lr_decay_style);
    if (t->lr_decay_iters == 0) t->lr_decay_iters = t->train_iters;
    cfg->lr_decay_steps = t->lr_decay_iters;
    // Megatron keeps the warm-up length as a real number (fraction x decay steps)
    cfg->lr_warmup_steps = t->lr_warmup_fraction > 0 ? t->lr_warmup_fraction * (double)t->lr_decay_iters : (double)t->lr_warmup_iters;
    if (cfg->lr_warmup_steps > cfg->lr_decay_steps && strcmp(t->lr_decay_style, "constant"))
        mt_fatal("lr warm-up (%g iterations) is longer than lr decay (%d)\nhint: raise --lr-decay-iters or lower the warm-up", cfg->lr_warmup_steps, cfg->lr_decay_steps);
    if (t->log_interval < 1) t->log_interval = 1;
    if (t->fp16 && t->bf16) mt_fatal("--fp16 and --bf16 exclude each other");
}

void mt_print_config(const mt_config *cfg, FILE *f) {
    const mt_model_config *m = &cfg->model;
    fprintf(f, "model: L=%d C=%d NH=%d hs=%d F=%d T=%d maxT=%d V=%d Vp=%d\n", m->num_layers, m->hidden_size,
            m->num_attention_heads, cfg->head_size, m->ffn_hidden_size, m->seq_length, m->max_position_embeddings,
            m->vocab_size, cfg->padded_vocab_size);
    fprintf(f, "layout: world=%d TP=%d PP=%d DP=%d virtual stages=%d | micro batch %d, global batch %d, %d micro-batches per rank\n",
            cfg->world_size, cfg->parallel.tensor_model_parallel_size, cfg->parallel.pipeline_model_parallel_size,
            cfg->data_parallel_size, cfg->virtual_pipeline_size, cfg->train.micro_batch_size, cfg->train.global_batch_size,
            cfg->num_microbatches);
}

// ---------------------------------------------------------------------------------------------
// counter-based random numbers
// ---------------------------------------------------------------------------------------------
// A counter-based generator maps (key, counter) -> random bits with a hash, with no state to
// carry. So the random number of a weight or a dropout mask element depends only on *which*
// element it is (its global index), never on which rank computes it or in which order: that is
// what makes every TP x PP x DP layout initialise and drop out exactly like one rank.
// The hash is splitmix64's finaliser (Steele et al., 2014), applied to a mix of the key words.
uint64_t mt_hash64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ULL;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}
static uint64_t mt__key(uint64_t seed, uint64_t a, uint64_t b, uint64_t c, uint64_t index) {
    uint64_t h = mt_hash64(seed);
    h = mt_hash64(h ^ a);
    h = mt_hash64(h ^ b);
    h = mt_hash64(h ^ c);
    return mt_hash64(h ^ index);
}
float mt_rand_uniform(uint64_t seed, uint64_t a, uint64_t b, uint64_t c, uint64_t index) {
    return (float)(mt__key(seed, a, b, c, index) >> 40) * (1.0f / 16777216.0f);   // 24 bits -> [0,1)
}
float mt_rand_normal(uint64_t seed, uint64_t a, uint64_t b, uint64_t c, uint64_t index) {
    // Box-Muller from two 32-bit uniforms of one hash; u1 in (0,1] so log() is finite
    uint64_t bits = mt__key(seed, a, b, c, index);
    double u1 = ((double)(bits >> 32) + 1.0) / 4294967296.0;
    double u2 = (double)(bits & 0xFFFFFFFFu) / 4294967296.0;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

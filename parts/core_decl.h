// ---------------------------------------------------------------------------------------------
// CONFIG: one struct, three parts (model, parallel, training), each field names its flag.
// Defaults live in mt_config_defaults(); derived values are computed once in mt_config_derive().
// ---------------------------------------------------------------------------------------------
#define MT_MAX_DATA_PATHS 16
#define MT_PATH_MAX 1024

typedef struct {
    int num_layers;                   // --num-layers (L)
    int hidden_size;                  // --hidden-size (C)
    int num_attention_heads;          // --num-attention-heads (NH)
    int ffn_hidden_size;              // --ffn-hidden-size (F), default 4*C
    int seq_length;                   // --seq-length (T)
    int max_position_embeddings;      // --max-position-embeddings (maxT), default T
    int vocab_size;                   // --vocab-size, or from --vocab-file (V)
    int make_vocab_size_divisible_by; // --make-vocab-size-divisible-by, default 128
    float init_method_std;            // --init-method-std, default 0.02
    float hidden_dropout;             // --hidden-dropout, default 0 here (Megatron: 0.1)
    float attention_dropout;          // --attention-dropout, default 0 here (Megatron: 0.1)
} mt_model_config;

typedef struct {
    int tensor_model_parallel_size;            // --tensor-model-parallel-size (TP)
    int pipeline_model_parallel_size;          // --pipeline-model-parallel-size (PP)
    int nproc_per_node;                        // --nproc-per-node: ranks in this process (world); default TP*PP
    int num_layers_per_virtual_pipeline_stage; // --num-layers-per-virtual-pipeline-stage, 0 = not interleaved
    long ddp_bucket_size;                      // --ddp-bucket-size: gradient elements per DP all-reduce bucket
    int print_layout;                          // --print-layout: print the rank groups and exit
    int print_schedule;                        // --print-schedule: print the pipeline time line and exit
} mt_parallel_config;

typedef struct {
    int micro_batch_size;      // --micro-batch-size (B)
    int global_batch_size;     // --global-batch-size = B * DP * accumulation steps
    int train_iters;           // --train-iters
    float lr;                  // --lr (peak)
    float min_lr;              // --min-lr
    char lr_decay_style[16];   // --lr-decay-style constant|linear|cosine
    int lr_decay_iters;        // --lr-decay-iters, default train_iters
    int lr_warmup_iters;       // --lr-warmup-iters
    double lr_warmup_fraction; // --lr-warmup-fraction (of lr_decay_iters; overrides lr_warmup_iters)
    float weight_decay;        // --weight-decay, default 0.01
    float adam_beta1;          // --adam-beta1, default 0.9
    float adam_beta2;          // --adam-beta2, default 0.999
    float adam_eps;            // --adam-eps, default 1e-8
    float clip_grad;           // --clip-grad, default 1.0 (0 = no clipping)
    unsigned long long seed;   // --seed, default 1234
    int log_interval;          // --log-interval, default 100
    int eval_interval;         // --eval-interval, default 1000
    int eval_iters;            // --eval-iters, default 100
    int save_interval;         // --save-interval
    char save[MT_PATH_MAX];    // --save DIR
    char load[MT_PATH_MAX];    // --load DIR
    int num_data_paths;                                  // --data-path [W1] PREFIX1 [W2 PREFIX2 ...]
    char data_path[MT_MAX_DATA_PATHS][MT_PATH_MAX];
    double data_weight[MT_MAX_DATA_PATHS];               // blend weights (normalised), 0 if not given
    char split[64];            // --split, default "969,30,1" as Megatron
    char vocab_file[MT_PATH_MAX];  // --vocab-file (GPT-2 vocab.json)
    char merge_file[MT_PATH_MAX];  // --merge-file (GPT-2 merges.txt)
    char tokenizer_type[32];       // --tokenizer-type GPT2BPETokenizer | NullTokenizer
    int fp32;                  // --fp32 (the CPU build always computes in fp32)
    int bf16;                  // --bf16 (GPU build)
    int fp16;                  // --fp16 (GPU build)
} mt_train_config;

typedef struct {
    mt_model_config model;
    mt_parallel_config parallel;
    mt_train_config train;
    // derived in mt_config_derive(), never set by a flag:
    int head_size;             // hs = C / NH
    int padded_vocab_size;     // Vp: V rounded up to a multiple of divisible_by * TP (Megatron's rule)
    int data_parallel_size;    // DP = world / (TP * PP)
    int world_size;            // TP * PP * DP
    int num_microbatches;      // global batch / (B * DP)
    int virtual_pipeline_size; // vp: model chunks per pipeline rank (1 if not interleaved)
    double lr_warmup_steps;    // in iterations (a real number when set by --lr-warmup-fraction)
    int lr_decay_steps;        // in iterations
} mt_config;

void mt_config_defaults(mt_config *cfg);
/* parses argv (a --config JSON file first, then the command line over it); mt_fatal on any bad flag */
void mt_config_parse(mt_config *cfg, int argc, char **argv);
void mt_config_load_json(mt_config *cfg, const char *path);
/* checks and fills the derived fields; world_size 0 = take --nproc-per-node or TP*PP */
void mt_config_derive(mt_config *cfg);
void mt_print_help(FILE *f);
void mt_print_config(const mt_config *cfg, FILE *f);
int mt_pad_vocab_size(int vocab_size, int divisible_by, int tp_size);

// ---------------------------------------------------------------------------------------------
// RANDOM NUMBERS: counter-based, so any element's random number depends only on its key.
// ---------------------------------------------------------------------------------------------
uint64_t mt_hash64(uint64_t x);
/* uniform in [0,1) for the element `index` of the stream named by (seed, a, b, c) */
float mt_rand_uniform(uint64_t seed, uint64_t a, uint64_t b, uint64_t c, uint64_t index);
float mt_rand_normal(uint64_t seed, uint64_t a, uint64_t b, uint64_t c, uint64_t index);

// ---------------------------------------------------------------------------------------------
// PARALLEL STATE: a rank's place in the TP x PP x DP grid and its communicators
// ---------------------------------------------------------------------------------------------
typedef struct {
    int rank, world_size;
    int tp_rank, tp_size;     // tensor parallel: position in / size of my TP group
    int pp_rank, pp_size;     // pipeline parallel: my stage
    int dp_rank, dp_size;     // data parallel: my replica
    int vp_size;              // model chunks per stage (interleaved 1F1B), 1 otherwise
    int pp_prev_rank, pp_next_rank;   // global ranks of the previous / next stage (wrapping around)
    int is_first_stage, is_last_stage;
    int in_embedding_group;   // first or last stage of a pipeline with PP > 1 (holds a copy of wte)
} mt_parallel_state;

/* rank = tp_rank + TP*(dp_rank + DP*pp_rank): TP fastest, then DP, then PP (Megatron's default) */
void mt_parallel_state_init(mt_parallel_state *ps, const mt_config *cfg, int rank);
int mt_global_rank(const mt_config *cfg, int tp_rank, int dp_rank, int pp_rank);
void mt_print_layout(const mt_config *cfg, FILE *f);

// ---------------------------------------------------------------------------------------------
// GPT MODEL: parameters (this rank's shards), activations, the rank context
// ---------------------------------------------------------------------------------------------
// local sizes: C_tp = C/TP, NH_tp = NH/TP, F_tp = F/TP, Vp_tp = Vp/TP, L_local = layers on this rank
typedef struct {
    float *wte;       // (Vp_tp, C)        vocab rows [tp_rank*Vp_tp, ...): first stage, and last stage (tied LM head)
    float *wpe;       // (maxT, C)         first stage; replicated over TP
    float *ln1w;      // (L_local, C)      replicated over TP
    float *ln1b;      // (L_local, C)
    float *qkvw;      // (L_local, 3*C_tp, C)  rows [Q_r; K_r; V_r]: my heads' rows of Q, K and V
    float *qkvb;      // (L_local, 3*C_tp)
    float *attprojw;  // (L_local, C, C_tp)    my columns (row-parallel)
    float *attprojb;  // (L_local, C)          replicated, added once after the all-reduce
    float *ln2w;      // (L_local, C)
    float *ln2b;      // (L_local, C)
    float *fcw;       // (L_local, F_tp, C)    my rows (column-parallel)
    float *fcb;       // (L_local, F_tp)
    float *fcprojw;   // (L_local, C, F_tp)    my columns (row-parallel)
    float *fcprojb;   // (L_local, C)          replicated
    float *lnfw;      // (C)                   last stage
    float *lnfb;      // (C)                   last stage
} mt_params;
#define MT_NUM_PARAM_TENSORS 16

/* how a tensor is split over TP ranks (used by init, gather and checkpoint conversion) */
typedef enum {
    MT_SPLIT_NONE,    // replicated: every TP rank holds all of it
    MT_SPLIT_ROWS,    // global (R, K) -> (R/TP, K), rank r holds rows [r*R/TP, (r+1)*R/TP)
    MT_SPLIT_COLS,    // global (R, K) -> (R, K/TP), rank r holds columns [r*K/TP, ...)
    MT_SPLIT_QKV,     // global (3C, K) = [Q; K; V] -> (3*C_tp, K) = [Q_r; K_r; V_r]
    MT_SPLIT_VOCAB    // global (V, K) real rows; rank r holds padded rows [r*Vp_tp, (r+1)*Vp_tp)
} mt_split;

typedef struct {
    const char *name;
    float **ptr;           // where the carve stores the pointer (into an mt_params)
    size_t offset;         // floats from the start of the buffer
    int layers;            // 0 for a non-layer tensor, else L_local (stacked)
    int rows, cols;        // local shape of one layer's tensor
    int grows, gcols;      // global shape of one layer's tensor (grows = V for wte)
    mt_split split;
    int no_decay;          // biases and layernorm weights: no weight decay (Megatron's rule)
    int tp_replicated;     // identical on every TP rank: counts once in the grad norm
    int present;           // does this rank hold it (stage-dependent)
} mt_param_spec;

typedef struct {
    // one slot = one micro-batch's saved activations for every chunk of this rank
    int *tokens;      // (B,T)
    int *targets;     // (B,T)
    float *input;     // (vp, B,T,C) each chunk's input: embedding output, or the previous stage's
    float *ln1;       // (L_local, B,T,C)
    float *ln1_mean;  // (L_local, B,T)
    float *ln1_rstd;  // (L_local, B,T)
    float *qkv;       // (L_local, B,T,3*C_tp)
    float *atty;      // (L_local, B,T,C_tp)
    float *att;       // (L_local, B,NH_tp,T,T) probabilities; GPU build: (L_local, B,NH_tp,T) logsumexp
    float *residual2; // (L_local, B,T,C)
    float *ln2;       // (L_local, B,T,C)
    float *ln2_mean;  // (L_local, B,T)
    float *ln2_rstd;  // (L_local, B,T)
    float *fch;       // (L_local, B,T,F_tp)
    float *fch_gelu;  // (L_local, B,T,F_tp)
    float *residual3; // (L_local, B,T,C)
    float *lnf;       // (B,T,C)       last stage
    float *lnf_mean;  // (B,T)
    float *lnf_rstd;  // (B,T)
    float *logits;    // (B,T,Vp_tp)   last stage; after a training forward, holds dloss/dlogits
    float *losses;    // (B,T)         last stage
    int mb;           // micro-batch held, -1 if free
    int sample_offset;// global sample index of its first sample within the iteration
} mt_activations;

typedef struct {
    float *out_c;     // (B,T,C)     output of a row-parallel matmul before/after its all-reduce
    float *dresidual; // (B,T,C)     gradient flowing down the residual stream
    float *dln;       // (B,T,C)
    float *dqkv;      // (B,T,3*C_tp)
    float *datty;     // (B,T,C_tp)
    float *dfch;      // (B,T,F_tp)
    float *dfch_gelu; // (B,T,F_tp)
    float *dp_row;    // (T)
    float *ce_max;    // (B,T)  cross-entropy all-reduced values
    float *ce_sum;    // (B,T)
    float *ce_target; // (B,T)
} mt_scratch;

struct mt_rank;
typedef struct mt_rank mt_rank;
/* fills tokens (B,T) and targets (B,T) of micro-batch `mb` of the current iteration for this rank */
typedef void (*mt_batch_fn)(mt_rank *r, void *ctx, int iteration, int mb, int *tokens, int *targets);

typedef struct {
    float loss;            // mean lm loss of the global batch
    float grad_norm;       // before clipping
    float lr;
    int skipped;           // 1 if the step was skipped (inf/nan gradients)
    double idle_seconds;   // time this rank waited for pipeline messages
} mt_step_result;

struct mt_rank {
    const mt_config *cfg;
    mt_parallel_state ps;
    mt_comm world, tp, pp, dp, mp, embd;   // mp = TP x PP ranks of my replica (for the grad norm)
    // derived local sizes
    int B, T, C, NH_tp, C_tp, F_tp, Vp_tp, vocab_start, L_local, layers_per_chunk;
    int att_row;           // floats saved per attention score row: T (CPU), 1 (GPU: the logsumexp)
    // parameters, gradients, AdamW moments: one buffer each, same carve
    mt_param_spec specs[MT_NUM_PARAM_TENSORS];
    size_t num_params;     // floats on this rank
    float *params_memory, *grads_memory, *m_memory, *v_memory;
    mt_params params, grads;
    // activations: num_slots micro-batches in flight at most (1 without pipelining)
    int num_slots;
    mt_activations *slots;
    float *acts_memory;
    mt_scratch scratch;
    float *scratch_memory;
    // host staging (the GPU build moves these few numbers between host and device)
    int *host_tokens, *host_targets;   // (B,T) a micro-batch's ids as the data loader made them
    float *host_losses;    // (B,T) per-position losses of the last micro-batch
    float *host_p2p;       // (B,T,C) pipeline messages pass through here on the GPU build
    // GPU build: this rank's device and stream, and the compute choices
    int device;            // CUDA device (-1 on the CPU build)
    void *stream;          // cudaStream_t of every kernel and NCCL call of this rank
    int gemm_impl;         // mt_gemm_impl (kernels.cuh): --gemm naive|tiled|mma
    int bf16;              // --bf16: GEMM and attention compute in bf16, accumulate in fp32
    struct {               // bytes of each buffer of this rank (printed at start)
        size_t params, grads, optimizer, activations, scratch;
    } memory;
    int step;              // optimizer steps taken
    int iteration;         // current iteration (1-based during a step)
    // per-step bookkeeping
    double loss_sum;       // sum of micro-batch mean losses (last stage)
    double idle_seconds;
    int training;          // 1 in a training step (dropout on, gradients), 0 in eval
};

void mt_rank_init(mt_rank *r, const mt_config *cfg, mt_world *w, int rank);
void mt_rank_free(mt_rank *r);
/* the global layer index of local layer l (0..L_local-1) on this rank */
int mt_local_to_global_layer(const mt_rank *r, int l);
/* one training iteration: all micro-batches forward and backward (per the schedule), grad sync, clip, AdamW */
mt_step_result mt_train_step(mt_rank *r, mt_batch_fn batch, void *ctx, int iteration);
/* mean loss over `num_microbatches` micro-batches, forward only (returned on every rank) */
float mt_eval_step(mt_rank *r, mt_batch_fn batch, void *ctx, int iteration);
/* learning rate at `iteration` (0-based steps taken), as Megatron's OptimizerParamScheduler */
float mt_learning_rate(const mt_config *cfg, int iteration);
/* copies this rank's shards into (dir=0) / out of (dir=1) a full, unsharded tensor `global`
   of the given spec, laid out (grows, gcols) per layer for the layers of this rank */
void mt_shard_copy(const mt_rank *r, const mt_param_spec *s, float *global_tensor, int global_layers, int dir);

// ---------------------------------------------------------------------------------------------
// DATA: Megatron's indexed dataset (PREFIX.bin + PREFIX.idx), GPT samples, blending
// ---------------------------------------------------------------------------------------------
typedef struct {
    char prefix[MT_PATH_MAX];
    int dtype;                     // Megatron's DType code: 1 uint8 .. 8 uint16 (see §9)
    size_t elem_size;              // bytes per token
    uint64_t num_sequences;        // sequences (one per document unless sentences were split)
    uint64_t num_documents;        // documents = entries of the document index - 1
    const int32_t *seq_lengths;    // (num_sequences) tokens per sequence
    const int64_t *seq_pointers;   // (num_sequences) byte offset of each sequence in .bin
    const int64_t *doc_index;      // (num_documents+1) first sequence of each document, then num_sequences
    void *idx_map, *bin_map;       // the memory-mapped files
    size_t idx_size, bin_size;
} mt_indexed_dataset;

/* opens and checks PREFIX.idx / PREFIX.bin; any corruption is fatal with a clear message */
void mt_indexed_dataset_open(mt_indexed_dataset *d, const char *prefix);
void mt_indexed_dataset_close(mt_indexed_dataset *d);
int64_t mt_indexed_dataset_doc_length(const mt_indexed_dataset *d, int64_t doc);   /* tokens */
int64_t mt_indexed_dataset_token(const mt_indexed_dataset *d, int64_t doc, int64_t pos);

typedef struct mt_indexed_builder mt_indexed_builder;
/* dtype_code: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16 */
mt_indexed_builder *mt_indexed_builder_open(const char *prefix, int dtype_code);
void mt_indexed_builder_add_document(mt_indexed_builder *b, const int32_t *tokens, size_t n);
void mt_indexed_builder_finish(mt_indexed_builder *b);   /* writes .idx, fsyncs, renames both, frees */
void mt_indexed_builder_abort(mt_indexed_builder *b);    /* removes the temporary files, frees */
int mt_dtype_for_vocab(int vocab_size);                  /* 8 (uint16) if vocab_size < 65500, else 4 (int32) */

/* samples of T+1 tokens from the documents [doc_begin, doc_end) of one indexed dataset,
   across document boundaries, shuffled by seed (megatron/core/datasets/gpt_dataset.py) */
typedef struct {
    const mt_indexed_dataset *ds;
    int T;
    int64_t num_samples;
    int64_t num_doc_idx;
    int64_t *doc_idx;        // documents in epoch order (each epoch shuffled)
    int64_t *sample_idx;     // (num_samples+1, 2): position in doc_idx and token offset where sample i starts
    int64_t *shuffle_idx;    // (num_samples) permutation of the samples
} mt_gpt_dataset;
void mt_gpt_dataset_build(mt_gpt_dataset *g, const mt_indexed_dataset *ds, int64_t doc_begin, int64_t doc_end, int T,
                          int64_t min_samples, uint64_t seed, int split_id);
void mt_gpt_dataset_sample(const mt_gpt_dataset *g, int64_t i, int32_t *out);   /* out: T+1 tokens */
void mt_gpt_dataset_free(mt_gpt_dataset *g);

/* --split "949,50,1" -> document boundaries [0, a, b, n] exactly as Megatron's get_split_indices */
void mt_split_documents(const char *split, int64_t num_docs, int64_t bounds[4]);

/* one split (train, valid or test) of every --data-path, blended by weight (BlendedDataset) */
typedef struct {
    int num_datasets;
    mt_gpt_dataset parts[MT_MAX_DATA_PATHS];
    int64_t num_samples;
    int16_t *dataset_index;          // (num_samples) which part sample i comes from
    int64_t *dataset_sample_index;   // (num_samples) and its index there
} mt_blended_dataset;

typedef struct {
    int num_paths;
    mt_indexed_dataset files[MT_MAX_DATA_PATHS];
    mt_blended_dataset split[3];     // train, valid, test
    int has_split[3];
    int64_t valid_consumed;          // samples of the valid split used so far (it cycles)
} mt_data;
/* opens every --data-path, splits, builds the sample indices for the iterations the config needs */
void mt_data_init(mt_data *d, const mt_config *cfg);
void mt_data_free(mt_data *d);
void mt_blended_sample(const mt_blended_dataset *b, int64_t i, int32_t *out);

// ---------------------------------------------------------------------------------------------
// TRAINING LOOP (Megatron's pretrain(): train, evaluate, log)
// ---------------------------------------------------------------------------------------------
/* number of parameters of the whole model (padded vocabulary, tied embedding counted once) */
size_t mt_model_num_parameters(const mt_config *cfg);
/* runs the whole job: ranks as threads, training, validation, test; returns the exit code */
int mt_pretrain(mt_config *cfg);

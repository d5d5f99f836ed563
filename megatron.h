/* megatron.h - Megatron-LM's parallel GPT training as one annotated C header.

   Tensor, pipeline and data parallelism (Shoeybi et al. 2019; Narayanan et al. 2021), written
   out for a reader: every op as a plain C loop with its math above it, every parallel mechanism
   in its own section with Megatron's names, and a CPU build where each rank is a thread, so any
   TP x PP x DP layout runs on a laptop and trains exactly like one rank.

   USAGE
     In exactly one .c file:
        #define MEGATRON_IMPLEMENTATION
        #include "megatron.h"
     Everywhere else just #include "megatron.h" for the declarations. The programs built on it:
        train_gpt.c    the trainer, Megatron's pretrain_gpt.py flags    ./train_gpt --help
        preprocess.c   text / loose JSON -> .bin/.idx                   ./preprocess --help
     It compiles as C11 (gcc, clang) and as CUDA C++ (nvcc -x cu).

   TABLE OF CONTENTS  (grep -n '^// [0-9]*\. ' megatron.h prints it with line numbers; docs/map.md
   is the map: what each section defines and the path of one training step through them)
      1. UTILITIES, ERRORS & CONFIG   mt_fatal, allocation, atomic files, UTF-8, the JSON reader,
                                      Megatron's flags and the JSON config, DeepSpeed's ds_config
                                      mapped onto the flags, the counter-based RNG;
                                      the GPU build's CUDA and NCCL error checks
      2. RANKS, GROUPS, COMMUNICATORS  the threads backend with NCCL's shape, the NCCL path (GPU
                                      build), launching several processes (srun, mpirun, torchrun-
                                      style) and the TCP channel between them, the TP/PP/DP rank
                                      layout, a rank's groups
      3. OPS: CPU REFERENCE & THE BACKEND SEAM  forward/backward pairs (embedding, layernorm,
                                      matmul, attention, GELU, dropout, cross-entropy, AdamW's
                                      update), reduced precision (fp16 / bf16 rounding, the ops
                                      that multiply in it), and the seam: each op on the rank's
                                      device, buffers
      4. TENSOR-PARALLEL LAYERS       f/g, column- and row-parallel linear, vocab-parallel
                                      embedding and cross-entropy
      5. GPT MODEL                    parameters and activations carved from one buffer each,
                                      layer forward/backward, embedding, head
      6. OPTIMIZER, CLIPPING, LEARNING RATE  loss scaling (--fp16: Megatron's dynamic grad
                                      scaler), AdamW's state and step (sharded over DP with
                                      --use-distributed-optimizer, on the host with
                                      --optimizer-cpu-offload), the global grad norm,
                                      Megatron's learning-rate schedule
      7. DATA PARALLEL                bucketed gradient all-reduce (reduce-scatter with the distributed
                                      optimizer), tied-embedding all-reduce
      8. PIPELINE SCHEDULES & TRAIN STEP  no pipelining, AFAB, 1F1B, interleaved 1F1B; the rank
                                      put together; the train and eval steps
      9. DATA & TOKENIZER             Megatron's indexed dataset (MMIDIDX), GPT samples, splits,
                                      blending; GPT-2 byte-level BPE
     10. CHECKPOINTS                  Megatron's SAVE/iter_N/mp_rank_TT[_PPP] layout in safetensors;
                                      converting between layouts; Hugging Face GPT-2 export and import
     11. GENERATION                   sampling (temperature, top-k, top-p), the KV cache: prefill and
                                      one token per step, batched, over TP x PP; the uncached reference
     12. TRAINING LOOP                pretrain(): the tokenizer, train, evaluate, save, Megatron's
                                      log lines, TensorBoard event files (--tensorboard-dir), the
                                      timeline of every rank (--timeline, --timeline-svg); the
                                      generation mode (--load without --train-iters) and its report

     The GPU build adds kernels.cuh: the CUDA kernels (numbered as the sections above, each next
     to the CPU function it must match) and, in its last section, the GPU half of the backend seam.

   COMPILE-TIME OPTIONS
     MEGATRON_IMPLEMENTATION   define in one translation unit only (see USAGE)
     __CUDACC__                (set by nvcc) the GPU build: buffers on the devices, kernels.cuh, NCCL.
                               megatron.h tests it in 3 places, each marked "(k of 3)": the CUDA and
                               NCCL error checks (section 1), the NCCL path of the communicators
                               (section 2), the backend seam (section 3). The model, the schedules,
                               the optimizer and the loop are the same code in both builds.
     MT_FATAL_JMP              (fuzzers only; set globally) mt_fatal longjmps to *mt_fatal_jmp when the
                               thread has set it, instead of exiting, so one process tries many inputs
                               (tests/fuzz_parsers.c); it leaks what the failed call held
     Run-time switches (environment): MT_TRACE=1 logs every collective and pipeline message;
     MT_SYNC_DEBUG=1 (GPU build) synchronises after every kernel, so a fault names its op;
     MT_PROFILE=1 (GPU build) times every op of the backend seam and prints a table per rank;
     MT_CUDA_GRAPH=0 (GPU build) runs generation's decode step and the training step's chunks op by op
     instead of as CUDA graphs; MT_PDL=0 (GPU build) keeps the graphs but without programmatic
     dependent launch (kernels.cuh, 1.); MT_GRAPH_STATS=1 (GPU build) prints each recorded graph's
     nodes by type and its edges, how many programmatic;
     MT_DECODE_ONE_KERNEL=1 (GPU build) runs each decode step at TP = PP = 1 as one persistent kernel
     (kernels.cuh, "a decode step as one kernel"; opt-in: not yet faster), and MT_DECODE_BLOCKS_PER_SM
     sets its blocks per SM (default 2).

   GLOSSARY
     B      micro-batch size (samples per rank per forward)       T   sequence length
     C      hidden size          NH  attention heads              hs  head size = C/NH
     F      MLP hidden size (4C) L   layers                        V   vocabulary, Vp padded
     OC     output channels of a matmul
     TP     tensor-parallel size: each layer's matrices split across TP ranks
     PP     pipeline-parallel size: the layers split into PP stages
     DP     data-parallel size: replicas, each on its own slice of the batch
     X_tp   the per-rank size of X under TP (C_tp = C/TP, NH_tp, F_tp, Vp_tp); L_local: my layers
     micro-batch   B samples; a global batch is B x DP x (number of micro-batches) samples
     stage  a pipeline rank's share of the layers; with interleaving, a rank holds several
            model chunks ("virtual stages")
     f, g   the conjugate communication operators of tensor parallelism (section 4)
     bubble the idle time of a pipeline: (PP-1)/(m+PP-1) of a step for m micro-batches
     1F1B   the pipeline schedule that alternates one forward with one backward (section 8)

   EXAMPLE
*/
#if 0
#define MEGATRON_IMPLEMENTATION
#include "megatron.h"
int main(int argc, char **argv) {           // this is train_gpt.c, in short
    mt_config cfg;
    mt_config_defaults(&cfg);
    mt_config_parse(&cfg, argc, argv);      // --num-layers 12 --tensor-model-parallel-size 2 ...
    return mt_pretrain(&cfg);               // tokenizer (V), checks and derives the layout, then
}                                           // the ranks as threads: train, evaluate, save, log
#endif

/* feature macros must come before any system header: clock_gettime, fsync, pthread_setname_np, mmap */
#if defined(MEGATRON_IMPLEMENTATION) && !defined(_GNU_SOURCE)
#define _GNU_SOURCE
#endif
#ifndef MEGATRON_H
#define MEGATRON_H
/* THE INTERFACE: every type and every non-static function, in the order of the sections of the
 * implementation below (the same numbers, the same banners), each section opening with what it
 * defines. A reader who reads only this part learns the whole API in the table's order. */

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
#define MT_THREAD_LOCAL thread_local
#else
#define MT_THREAD_LOCAL _Thread_local
#endif

/* struct mt_rank: one rank's whole state (section 8 puts it together); nearly every function
 * takes it. Declared here so that every section can name it. */
typedef struct mt_rank mt_rank;

/* ============================================================================================= */
/* 1. UTILITIES, ERRORS & CONFIG
 * defines: mt_fatal and allocation, atomic files, UTF-8, the JSON reader,
 *          edit distance, mt_config (Megatron's flags, the JSON config file, DeepSpeed's config),
 *          the counter-based RNG,
 *          TensorBoard's records (TFRecord, Event), the timeline's spans */
/* mt_fatal: the single exit for every error. Prints "error: <cause>" and, when the message
 * contains a "\nhint: " part, the fix on its own line. Inside a rank thread of a multi-rank
 * run it aborts the whole world (every rank stops with this message) instead of exiting. */
void mt_fatal(const char *fmt, ...);
#ifdef MT_FATAL_JMP
#include <setjmp.h>
extern MT_THREAD_LOCAL jmp_buf *mt_fatal_jmp;   /* non-NULL: mt_fatal longjmps here (fuzzers) */
#endif
void *mt_malloc(size_t bytes, const char *what);     /* never returns NULL: fatal with "what" */
void *mt_calloc(size_t count, size_t size, const char *what);
void *mt_realloc(void *p, size_t bytes, const char *what);
char *mt_strdup(const char *s);
double mt_time_seconds(void);                        /* monotonic clock */
/* atomic file writes: write to PATH.tmp.PID, fsync, rename onto PATH */
FILE *mt_atomic_open(const char *path, char *tmp_path_out, size_t tmp_cap);
void mt_atomic_commit(FILE *f, const char *tmp_path, const char *path);
void mt_atomic_abort(FILE *f, const char *tmp_path);
void mt_atomic_cleanup(void);                        /* removes every temporary still open (error paths) */
void mt_remove_stale_temporaries(const char *dir, int depth);   /* PATH.tmp.PID of dead processes, said */

// ---------------------------------------------------------------------------------------------
// UTF-8 and JSON: one reader for every file we parse (config, vocab.json, safetensors headers,
// loose-JSON input lines); strict as Python's json, comments allowed where the caller says.
// ---------------------------------------------------------------------------------------------
/* one UTF-8 character at text[0..n): returns its length 1..4 and sets *cp, or 0 if the bytes
 * there are not valid UTF-8 (stray continuation byte, truncated, overlong, surrogate, > U+10FFFF) */
int mt_utf8_decode(const char *text, size_t n, uint32_t *cp);
/* JSON string literal -> UTF-8 (used for vocab.json, loose-JSON input and tests). *p points at
 * the opening quote; on success *p moves past the closing quote, out[0..*out_len) holds the
 * bytes and the result is NULL. out needs room for (end - *p) bytes and may be *p itself (the
 * decoded text is never longer than its literal). On error returns a message, *p at the fault.
 * Strict as Python's json: raw control characters, invalid UTF-8 and lone surrogates are errors. */
const char *mt_json_string(const char **p, const char *end, char *out, size_t *out_len);
typedef enum { MT_JSON_STRING, MT_JSON_NUMBER, MT_JSON_OBJECT, MT_JSON_ARRAY, MT_JSON_TRUE, MT_JSON_FALSE,
              MT_JSON_NULL } mt_json_type;
#define MT_JSON_MAX_DEPTH 512   /* deeper nesting is an error, not a stack overflow */
typedef struct {
    const char *start, *p, *end;   /* the text, the cursor, its end */
    int allow_comments;            /* // and slash-star comments count as white space (config files) */
    const char *err;               /* the first error (NULL while none) ... */
    const char *err_at;            /* ... and where it is */
} mt_json;
void mt_json_init(mt_json *j, const char *text, size_t len, int allow_comments);
void mt_json_fail(mt_json *j, const char *msg);       /* records the first error, at the cursor */
void mt_json_ws(mt_json *j);                          /* skips white space (and comments if allowed) */
int mt_json_eat(mt_json *j, char c);                  /* after white space: 1 and past c if c is next */
int mt_json_expect(mt_json *j, char c, const char *msg);   /* mt_json_eat, or records msg */
int mt_json_line(const mt_json *j);                   /* 1-based line of the error (or the cursor) */
/* checks and skips a string; *lone: it has a lone UTF-16 surrogate (valid JSON, no UTF-8 form) */
int mt_json_scan_string(mt_json *j, int *lone);
int mt_json_string_at(mt_json *j, char *out, size_t *out_len);   /* decodes the string at the cursor */
int mt_json_key(mt_json *j, char *key, size_t cap);   /* "key" : -> key, NUL-terminated */
int mt_json_number(mt_json *j, double *v);
mt_json_type mt_json_skip(mt_json *j);                /* checks and skips any value, returns its type */
int mt_json_find(mt_json *j, const char *key);        /* at an object: moves to member key's value */
int mt_json_ints(mt_json *j, long long *out, int cap);/* [1, 2, 3] -> count, or -1 */
/* Levenshtein distance of two short strings (flag suggestions); 99 past 63 characters */
int mt_edit_distance(const char *a, const char *b);

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
    float hidden_dropout;             // --hidden-dropout, default 0.1 (Megatron's); 0 = off
    float attention_dropout;          // --attention-dropout, default 0.1 (Megatron's); 0 = off
} mt_model_config;

typedef struct {
    int tensor_model_parallel_size;            // --tensor-model-parallel-size (TP)
    int pipeline_model_parallel_size;          // --pipeline-model-parallel-size (PP)
    int nproc_per_node;                        // --nproc-per-node: ranks in this process (world); default TP*PP
    int num_layers_per_virtual_pipeline_stage; // --num-layers-per-virtual-pipeline-stage, 0 = not interleaved
    long ddp_bucket_size;                      // --ddp-bucket-size: gradient elements per DP all-reduce bucket
    int overlap_grad_reduce;                   // --overlap-grad-reduce: each bucket of layers all-reduced over DP
                                               // as soon as the last micro-batch's backward finishes it (section 7)
    int use_distributed_optimizer;             // --use-distributed-optimizer: AdamW state sharded over DP (ZeRO-1)
    int zero_stage;                            // not a flag: --deepspeed_config's zero_optimization.stage (0: none
                                               // given). 1: the distributed optimizer with the gradients all-reduced
                                               // (DeepSpeed's stage 1); 2: reduce-scattered into each owner's shard,
                                               // as --use-distributed-optimizer alone does (section 7)
    int sequence_parallel;                     // --sequence-parallel: layernorm/dropout/residual regions split
                                               // along the sequence over the TP group (needs TP > 1)
    int no_async_tensor_model_parallel_allreduce; // --no-async-tensor-model-parallel-allreduce: a TP layer's
                                               // backward waits for its input gradient's all-reduce before
                                               // its weight gradient, instead of beside it (section 4)
    int print_layout;                          // --print-layout: print the rank groups and exit
    int print_schedule;                        // --print-schedule: print the pipeline time line and exit
    int dry_run;                               // --dry-run: print each rank's memory plan and exit
    // beyond one process (section 2, LAUNCH): what srun / mpirun / torchrun-style variables say
    int print_launch;                          // --print-launch: print the launch the environment describes, exit
    char nccl_init_file[MT_PATH_MAX];          // --nccl-init-file PATH: rendezvous through a file on a shared
                                               // filesystem instead of MASTER_ADDR:MASTER_PORT
    double dist_timeout;                       // --dist-timeout SECONDS: rendezvous and connection timeout
                                               // (0: --distributed-timeout-minutes)
    int distributed_timeout_minutes;           // --distributed-timeout-minutes, default 10 (Megatron's)
    int local_rank;                            // --local-rank / --local_rank N: what torch.distributed.launch
                                               // passes instead of LOCAL_RANK (-1: not given)
    int num_processes;                         // not a flag: the job's processes, from the environment
                                               // (mt_launch_detect); 0 or 1 = this process only
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
    int optimizer_cpu_offload; // --optimizer-cpu-offload: AdamW's fp32 master weights and moments of this rank's
                               // shard in pinned host memory, the update on host threads (section 6)
    double optimizer_offload_fraction; // --optimizer-offload-fraction, default 1.0: the share offloaded (only 1.0)
    int optimizer_offload_threads;     // --optimizer-offload-threads N: host threads per rank for the offloaded
                                       // update (0: the host's cores / ranks on this node, at most 8)
    int deepspeed;             // --deepspeed: Megatron-DeepSpeed's switch; the work is --deepspeed_config's
    char deepspeed_config[MT_PATH_MAX];   // --deepspeed_config / --deepspeed-config ds_config.json, mapped onto
                                          // these flags (mt_config_load_deepspeed)
    unsigned long long seed;   // --seed, default 1234
    int log_interval;          // --log-interval, default 100
    int verbose;               // --verbose: also print rank 0's tensor table (name, shape, offset) at start
    int eval_interval;         // --eval-interval, default 1000
    int eval_iters;            // --eval-iters, default 100
    int save_interval;         // --save-interval
    int exit_interval;         // --exit-interval: stop (after saving, with --save) at an iteration divisible by it
    char save[MT_PATH_MAX];    // --save DIR
    char load[MT_PATH_MAX];    // --load DIR
    int use_checkpoint_args;   // --use-checkpoint-args: the model's shape from --load's checkpoint
    int no_load_optim;         // --no-load-optim: --load the parameters and the iteration, not AdamW's state
    int finetune;              // --finetune: --load the parameters only; training starts at iteration 1
    int exit_on_missing_checkpoint;   // --exit-on-missing-checkpoint: --load without a checkpoint is an error
    int convert_checkpoint;    // --convert-checkpoint: rewrite --load for the --target-* layout into --save, then exit
    int overwrite;             // --overwrite: --save may write into a directory holding another run's checkpoints
    int target_tp, target_pp;  // --target-tensor-parallel-size, --target-pipeline-parallel-size (default 1)
    int target_vp_layers;      // --target-num-layers-per-virtual-pipeline-stage (default 0: not interleaved)
    char export_hf[MT_PATH_MAX];   // --export-hf DIR: write --load as Hugging Face GPT-2, then exit
    int tokens_to_generate;    // --tokens-to-generate N: after training, continue --prompt by N tokens
    char prompt[1024];         // --prompt TEXT (default: start from <|endoftext|>)
    float temperature;         // --temperature, default 1.0 (0 = greedy)
    int top_k;                 // --top-k (--top_k), default 0 (all tokens)
    float top_p;               // --top-p (--top_p), default 0 (all tokens): nucleus sampling
    int greedy;                // --greedy: always the most likely token
    int out_seq_length;        // --out-seq-length N: generation mode's new tokens per sequence, default 1024
    int num_samples;           // --num-samples N: N samples of each prompt (of <|endoftext|> without one)
    int ignore_eos;            // --ignore-eos: keep generating past <|endoftext|>
    char sample_input_file[MT_PATH_MAX];    // --sample-input-file: one prompt per line
    char sample_output_file[MT_PATH_MAX];   // --sample-output-file: JSON lines (prompt, text, tokens)
    char genfile[MT_PATH_MAX];   // --genfile: the unconditional samples as JSON lines (text, length, finished)
    char import_hf[MT_PATH_MAX];   // --import-hf DIR: a Hugging Face GPT-2 (model.safetensors) into --save, then exit
    int num_data_paths;                                  // --data-path [W1] PREFIX1 [W2 PREFIX2 ...]
    int mock_data;             // --mock-data: Megatron's mock dataset instead of --data-path (mt_data_init)
    char data_path[MT_MAX_DATA_PATHS][MT_PATH_MAX];
    double data_weight[MT_MAX_DATA_PATHS];               // blend weights (normalised), 0 if not given
    char split[64];            // --split, default "969,30,1" as Megatron
    char vocab_file[MT_PATH_MAX];  // --vocab-file (GPT-2 vocab.json)
    char merge_file[MT_PATH_MAX];  // --merge-file (GPT-2 merges.txt)
    char tokenizer_type[32];       // --tokenizer-type GPT2BPETokenizer | NullTokenizer
    int fp32;                  // --fp32: compute in fp32 (the default)
    int bf16;                  // --bf16: GEMM and attention operands in bf16 (the CPU build rounds to it)
    int fp16;                  // --fp16: GEMM and attention operands in fp16, with loss scaling (section 6)
    float loss_scale;          // --loss-scale S: a static loss scale (fp16); 0 = dynamic scaling
    float initial_loss_scale;  // --initial-loss-scale, default 2^32: where dynamic scaling starts
    float min_loss_scale;      // --min-loss-scale, default 1: dynamic scaling never goes below it
    int loss_scale_window;     // --loss-scale-window, default 1000: clean steps before the scale doubles
    int hysteresis;            // --hysteresis, default 2: inf/nan steps before the scale halves
    char gemm[16];             // --gemm naive|tiled|mma|wgmma (GPU build): the GEMM kernel; default by precision
    char recompute_granularity[16];   // --recompute-granularity full|selective ('' = keep every activation)
    char recompute_method[16];        // --recompute-method uniform|block (full granularity)
    int recompute_num_layers;         // --recompute-num-layers N, default 1 (full granularity)
    int recompute_activations;        // --recompute-activations: Megatron's shorthand for selective
    int gradient_accumulation_steps;   // --gradient-accumulation-steps (older Megatron): global = B * DP * this
    int start_iteration;       // --start-iteration N (the tutorial's): without a checkpoint, begin after iteration N
    int ckpt_step;             // --ckpt-step N: --load this iteration instead of the latest (0 = latest)
    // TensorBoard (section 12), Megatron's flags
    char tensorboard_dir[MT_PATH_MAX];  // --tensorboard-dir DIR: event files, written by the last rank
    int tensorboard_log_interval;       // --tensorboard-log-interval, default 1
    int tensorboard_queue_size;         // --tensorboard-queue-size, default 1000: events held before a flush
    int log_params_norm;                // --log-params-norm: the parameters' L2 norm in the iteration line
    int log_num_zeros_in_grad;          // --log-num-zeros-in-grad: the zero gradients in the iteration line
    int log_timers_to_tensorboard;      // --log-timers-to-tensorboard: iteration-time, forward-backward-time, ...
    int log_validation_ppl_to_tensorboard;   // --log-validation-ppl-to-tensorboard
    int log_memory_to_tensorboard;      // --log-memory-to-tensorboard: mem-allocated-bytes
    int log_batch_size_to_tensorboard;  // --log-batch-size-to-tensorboard
    int log_world_size_to_tensorboard;  // --log-world-size-to-tensorboard
    int no_log_loss_scale_to_tensorboard;    // --no-log-loss-scale-to-tensorboard
    int no_log_learning_rate_to_tensorboard; // --no-log-learnig-rate-to-tensorboard (sic, Megatron's spelling)
    // the timeline (section 12)
    char timeline[MT_PATH_MAX];         // --timeline FILE.json: Chrome trace of every rank (Perfetto)
    char timeline_svg[MT_PATH_MAX];     // --timeline-svg FILE.svg: the same as a picture
    int profile_step_start;             // --profile-step-start: the timeline's first iteration (Megatron's 10)
    int profile_step_end;               // --profile-step-end: the window ends before it (Megatron's 12)
} mt_train_config;

typedef enum { MT_LR_CONSTANT = 0, MT_LR_LINEAR = 1, MT_LR_COSINE = 2 } mt_lr_decay_style;
/* the compute type of the GEMM and attention operands (--fp32 | --bf16 | --fp16): what the GPU
 * build's tensor cores multiply, and what the CPU build rounds those operands to (section 3).
 * Storage, accumulation, master weights and the optimizer stay fp32 in every case. */
typedef enum { MT_DTYPE_FP32 = 0, MT_DTYPE_BF16 = 1, MT_DTYPE_FP16 = 2 } mt_dtype;
/* activation recompute (Megatron's --recompute-*): what the backward rebuilds instead of keeping */
typedef enum {
    MT_RECOMPUTE_NONE = 0,      // keep every activation
    MT_RECOMPUTE_SELECTIVE,     // the attention core (its output and logsumexp) of every layer
    MT_RECOMPUTE_UNIFORM,       // full layers, in groups of N: only each group's input is kept
    MT_RECOMPUTE_BLOCK          // full layers, the first N of each chunk, one at a time
} mt_recompute;

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
    mt_lr_decay_style lr_decay;   // --lr-decay-style as an enum (the schedule asks every step)
    mt_recompute recompute;       // from the --recompute-* flags
    int recompute_num_layers;     // N of the uniform / block methods
    mt_dtype compute_dtype;       // from --fp32 / --bf16 / --fp16
} mt_config;

void mt_config_defaults(mt_config *cfg);
/* parses argv (a --config JSON file first, then the command line over it); mt_fatal on any bad flag */
void mt_config_parse(mt_config *cfg, int argc, char **argv);
void mt_config_load_json(mt_config *cfg, const char *path);
/* --deepspeed_config: maps DeepSpeed's ds_config.json onto cfg (ZeRO stage, optimizer offload, optimizer,
 * scheduler, batch, fp16 / bf16 keys); "auto" keeps our value. argv (may be NULL) is the command line:
 * a flag given there (or set away from its default) that the file contradicts is an error, as is any
 * key without an equivalent. summary (cap bytes) receives the one line of what was mapped and ignored. */
void mt_config_load_deepspeed(mt_config *cfg, const char *path, int argc, char **argv, char *summary, size_t cap);
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
// TENSORBOARD RECORDS: what TensorBoard's event files hold, encoded by hand (the messages are
// tiny): TFRecord framing (length, masked CRC-32C of the length, data, masked CRC-32C of the
// data) around an Event protobuf (wall_time, step, and a file_version or a Summary scalar).
// ---------------------------------------------------------------------------------------------
uint32_t mt_crc32c(const void *data, size_t n);          /* CRC-32C (Castagnoli), as TFRecord uses */
uint32_t mt_tfrecord_masked_crc(const void *data, size_t n);   /* ((crc >> 15) | (crc << 17)) + 0xa282ead8 */
/* one Event, protobuf-encoded into out (cap bytes; 64 + strlen(tag) is always enough); returns its
   length. tag == NULL: the first event of a file, file_version "brain.Event:2" */
size_t mt_tb_event(unsigned char *out, size_t cap, double wall_time, int64_t step, const char *tag, float value);
/* appends one TFRecord (header, data, footer) to f; returns 0 on a write error */
int mt_tfrecord_write(FILE *f, const unsigned char *data, size_t n);
/* reads the next complete TFRecord of buf[*pos..len) into *data, *n and moves *pos past it: 1; at
   a cut (an incomplete last record) or at the end: 0; a record whose CRC does not match: -1 */
int mt_tfrecord_read(const unsigned char *buf, size_t len, size_t *pos, const unsigned char **data, size_t *n);

// ---------------------------------------------------------------------------------------------
// SPANS: what the timeline is made of (written in section 12). A rank appends a span for each
// piece of work (a micro-batch's forward or backward of its layers, the optimizer step) and each
// communication call (section 2), while its log is enabled.
// ---------------------------------------------------------------------------------------------
typedef enum { MT_SPAN_FORWARD = 0, MT_SPAN_BACKWARD = 1, MT_SPAN_OPTIMIZER = 2, MT_SPAN_COMM = 3,
               MT_SPAN_RECV = 4 } mt_span_kind;   /* MT_SPAN_RECV: a batch of pipeline messages that
                                                     receives (mt_p2p_batch), mostly waiting (idle) */
typedef struct {
    double t0, t1;            // seconds (mt_time_seconds)
    int mark0, mark1;         // GPU build: device marks (mt_device_mark, section 3) that give t0 and
                              // t1 once resolved; -1: t0 / t1 are already host times (CPU build)
    mt_span_kind kind;
    int iteration, mb, chunk; // mb, chunk: -1 where they do not apply
    int layer_first, layer_last;   // the global layers of a forward / backward span
    const char *name;         // a static string: "all_reduce", "send", "optimizer", ...
    const char *group;        // a communication's group ("tp", "pp", "dp", "embd", "mp", "world")
    size_t bytes;             // a communication's bytes at this rank
} mt_span;
typedef struct {
    int enabled;              // record now (the timeline's window of iterations)
    int iteration;            // stamped on every span added
    mt_span *spans;
    size_t n, cap;
    void *device_clock;       // GPU build: the timed CUDA events behind the marks (section 3)
} mt_span_log;
void mt_span_add(mt_span_log *log, const mt_span *s);   /* copies s, stamps the iteration; no-op if disabled */
void mt_span_log_free(mt_span_log *log);

/* ============================================================================================= */
/* 2. RANKS, GROUPS, COMMUNICATORS
 * defines: mt_world and its rank threads, mt_comm and the collectives (threads
 *          backend; NCCL on the GPU build) with their counters (calls, bytes, seconds),
 *          mt_launch (several processes: the launcher's variables, Slurm host lists, the TCP
 *          rendezvous and mt_world_create_launched), mt_parallel_state (the TP/PP/DP grid), mt_groups */
// ---------------------------------------------------------------------------------------------
// COMMUNICATORS: NCCL's shape. One mt_comm per (rank, group); every member of a group calls the
// same collectives in the same order. CPU build: every rank is a thread of this process.
// ---------------------------------------------------------------------------------------------
typedef enum { MT_SUM = 0, MT_MAX = 1 } mt_reduce_op;   // MT_MAX propagates NaN (like torch.max)

typedef struct mt_world mt_world;   // everything the rank threads of one process share

typedef struct mt_comm {           // a group communicator; NCCL's ncclComm_t
    mt_world *world;
    int size;                      // ranks in the group
    int rank;                      // my index in the group, 0..size-1
    int global_rank;               // my rank in the world
    const int *members;            // (size,) global ranks of the group, in group-rank order
                                   // (owned by the shared group state, lives as long as the world)
    const char *name;              // "tp", "dp", "pp", "world", "embd": for MT_TRACE and messages;
                                   // mt_comm_init sets "group", the caller overwrites
    void *group;                   // private: the group's shared state (mt__group)
    void *nccl;                    // GPU build: the ncclComm_t that moves this group's device
                                   // buffers (all-reduce, all-gather, reduce-scatter, broadcast);
                                   // NULL: the threads backend (host memory) does everything
    void *stream;                  // GPU build: the group's own cudaStream_t for those NCCL calls
    void *compute_stream;          // GPU build: the rank's kernel stream, ordered with `stream`
    void *events[2];               // GPU build: cudaEvent_t: compute -> comm, comm -> compute
    // communication counters of this rank on this group, since mt_comm_init (see section 2):
    unsigned long long calls;      // collectives, sends and recvs made (a group of 1 moves nothing: not counted)
    unsigned long long bytes;      // bytes of the buffers those calls moved at this rank
    double seconds;                // time spent inside them (GPU build: NCCL's own time on the GPU,
                                   // from timed events around each call, added when the counters
                                   // are read: see mt__nccl_seconds)
    void *timing;                  // GPU build: those events, of the calls not yet added
    mt_span_log *spans;            // the timeline's recorder (section 1): a span per call; NULL: none
    int marks[2];                  // GPU build: the device marks around the last NCCL call (its
                                   // timeline span's ends), -1 when none: set by the NCCL path,
                                   // taken by the counters (section 2)
    int started;                   // GPU build: NCCL calls started (mt_all_reduce_start) that the
                                   // rank's kernels do not wait for yet (mt_comm_wait)
} mt_comm;

/* world_size rank threads; MT_TRACE=1 in the environment (read here) traces every call */
mt_world *mt_world_create(int world_size);
void mt_world_destroy(mt_world *w);     /* after mt_world_run returned; frees groups and mailboxes */
int mt_world_size(const mt_world *w);
/* the message of the mt_fatal that aborted the world, or NULL if it was not aborted */
const char *mt_world_error(mt_world *w);

/* every member calls it with the same members list (global ranks, in group-rank order).
 * Like ncclCommInitRank, each call makes a new communicator: the k-th init of a member list
 * on one rank pairs with the k-th init of the same list on the others, so "world" and "dp"
 * with equal members are still two independent groups. */
void mt_comm_init(mt_comm *c, mt_world *w, int my_global_rank, const int *members, int size);

/* collectives: blocking, deterministic (bit-identical on every rank, every run; see §2) */
void mt_all_reduce(mt_comm *c, float *buf, size_t n, mt_reduce_op op);            /* in place */
void mt_all_reduce_double(mt_comm *c, double *buf, size_t n, mt_reduce_op op);    /* norms, loss sums */
/* recv (size*n_per_rank) = [rank 0's n | rank 1's n | ...]; send may be recv + rank*n_per_rank */
void mt_all_gather(mt_comm *c, const float *send, float *recv, size_t n_per_rank);
/* send (size*n_per_rank); rank r gets the reduced r-th chunk; recv may be send + rank*n_per_rank */
void mt_reduce_scatter(mt_comm *c, const float *send, float *recv, size_t n_per_rank, mt_reduce_op op);
void mt_broadcast(mt_comm *c, float *buf, size_t n, int root);                    /* root: group rank */
void mt_barrier(mt_comm *c);
/* mt_all_reduce, started: on a group with NCCL (device buffers) it is queued on the group's own
 * stream after the rank's kernels so far, and the rank's later kernels do not wait for it, so it
 * runs while they do (--overlap-grad-reduce; the tensor-parallel layers' input gradients, section
 * 4); buf must not be touched until mt_comm_wait. The threads backend (host buffers) runs it at
 * once, as mt_all_reduce. The same result either way. The all-gather and the reduce-scatter,
 * started, likewise (--sequence-parallel's backward, section 4): send and recv untouched until
 * mt_comm_wait. */
void mt_all_reduce_start(mt_comm *c, float *buf, size_t n, mt_reduce_op op);
void mt_all_gather_start(mt_comm *c, const float *send, float *recv, size_t n_per_rank);
void mt_reduce_scatter_start(mt_comm *c, const float *send, float *recv, size_t n_per_rank, mt_reduce_op op);
/* the rank's next kernels wait for every collective started on the group (nothing to wait for
 * on the threads backend); any blocking collective on the group waits for them too */
void mt_comm_wait(mt_comm *c);

/* point-to-point; peer is a GROUP rank. send is buffered: it copies and returns at once.
 * recv blocks until a message from peer with this tag arrives (FIFO among equal tags);
 * its count must equal n (else mt_fatal naming both). */
void mt_send(mt_comm *c, const float *buf, size_t n, int peer, int tag);
void mt_recv(mt_comm *c, float *buf, size_t n, int peer, int tag);

/* a batch of sends and receives that go together, as NCCL's ncclGroupStart; ncclSend / ncclRecv
 * ...; ncclGroupEnd (PyTorch's batch_isend_irecv, what Megatron's p2p_communication calls): the
 * pipeline's messages. On a group with NCCL (the GPU build's p2p group) the buffers are device
 * buffers, the batch is queued on the group's stream after the rank's kernels so far, and the
 * kernels after it wait for it. NCCL has no tags: it pairs the k-th send from A to B with the
 * k-th receive at B from A, and a send is done only when its receive has the data. The threads
 * backend (host buffers) keeps both rules, so the CPU build finds what would hang or mismatch on
 * GPUs: a batch posts its sends, takes its receives in the order given (each must be the oldest
 * message from its peer: a different tag is an error naming both), then waits until every send
 * to a rank of this process was taken. The tags are checked there only. */
typedef struct {
    int recv;          // 0: send buf to peer; 1: receive into buf from peer
    float *buf;        // (n,)
    size_t n;
    int peer;          // a GROUP rank
    int tag;           // >= 0
} mt_p2p_op;
void mt_p2p_batch(mt_comm *c, const mt_p2p_op *ops, int count);

/* launcher: runs fn(w, rank, arg) on world_size threads named "r<rank>", joins them. Returns 0,
 * or 1 if a rank called mt_fatal (the world was aborted): then it has printed
 * "error: <message>" once, as mt_fatal would, and the caller should exit(1). */
typedef void (*mt_rank_fn)(mt_world *w, int global_rank, void *arg);
int mt_world_run(mt_world *w, mt_rank_fn fn, void *arg);
int mt_thread_rank(void);                 /* global rank of the calling rank thread, -1 elsewhere */
void mt_thread_set_name(const char *name);/* names the calling thread (debuggers), max 15 chars */

// ---------------------------------------------------------------------------------------------
// LAUNCH: beyond one process. srun, mpirun or a torchrun-style launcher starts the processes and
// says in the environment who each one is; the processes meet at a rendezvous (TCP to
// MASTER_ADDR:MASTER_PORT, or a file on a shared filesystem) and then talk over TCP. A process
// still runs its ranks as threads: global rank = first_rank + local index.
// ---------------------------------------------------------------------------------------------
typedef enum {
    MT_LAUNCH_THREADS = 0,   // one process, every rank a thread (no launcher, or a launcher of 1)
    MT_LAUNCH_TORCHRUN,      // RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    MT_LAUNCH_SLURM,         // srun: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID, SLURM_JOB_NODELIST
    MT_LAUNCH_MPI            // mpirun (Open MPI / PMIx): OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK, PMIX_RANK
} mt_launch_kind;

typedef struct {
    mt_launch_kind kind;
    char found[256];         // the variables it was read from, for the start line ("RANK=1 WORLD_SIZE=2")
    int nprocs;              // processes in the job (1: this one only)
    int proc;                // my process index, 0 .. nprocs-1
    int local_proc;          // my index among the processes of my node (LOCAL_RANK ...), -1 if not said
    int local_nprocs;        // processes on my node (LOCAL_WORLD_SIZE ...), 0 if not said
    int node;                // my node (GROUP_RANK, SLURM_NODEID), -1: found from host names at the rendezvous
    int ranks_per_proc;      // rank threads per process: --nproc-per-node (default 1 under a launcher)
    int first_rank;          // my first global rank: proc * ranks_per_proc
    char master_addr[256];   // the rendezvous host: MASTER_ADDR, or the first host of SLURM_JOB_NODELIST
    int master_port;         // MASTER_PORT (Slurm without it: 20000 + SLURM_JOB_ID % 20000)
    char init_file[MT_PATH_MAX];   // --nccl-init-file: meet through this file instead
    double timeout_s;        // --dist-timeout, or --distributed-timeout-minutes * 60
} mt_launch;

/* Slurm's compressed host lists ("node[01-04,07],gpu-a[1-2]-b"): returns how many hosts the list
   names and, when index < that count, copies host number `index` into host (cap bytes); -1 if
   the list is malformed, with *err (if not NULL) pointing at a static one-line reason */
int mt_hostlist_get(const char *list, int index, char *host, size_t cap, const char **err);
/* reads the launcher's variables from the environment (mt_fatal, naming the variable, if they
   are wrong or incomplete) and sets cfg->parallel.num_processes */
void mt_launch_detect(mt_launch *l, mt_config *cfg);
void mt_launch_print(const mt_launch *l, const mt_config *cfg, FILE *f);   /* the "launch: ..." line */
/* the world of this job: mt_world_create(cfg->world_size) for one process; otherwise the
   rendezvous (every process checks in, a wrong world size or a peer that never comes is an error
   naming it), a TCP connection to every other process, and a world whose rank threads are this
   process's ranks. Then checks the topology: every TP group must sit on one node. */
mt_world *mt_world_create_launched(const mt_launch *l, const mt_config *cfg);
int mt_world_first_rank(const mt_world *w);   /* this process's ranks: first .. first + local - 1 */
int mt_world_local_size(const mt_world *w);
int mt_world_node(const mt_world *w, int rank);        /* the node of a rank (0 in one process) */
int mt_world_node_rank(const mt_world *w, int rank);   /* its index among its node's ranks: its GPU */
int mt_world_node_size(const mt_world *w, int rank);   /* ranks on its node */

// ---------------------------------------------------------------------------------------------
// PARALLEL STATE: a rank's place in the TP x PP x DP grid, and the groups it belongs to
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
    int node_rank, node_size; // my index among the ranks of my node (my GPU) and their number; in
                              // one process: rank and world_size (mt_rank_init asks the world)
} mt_parallel_state;

/* rank = tp_rank + TP*(dp_rank + DP*pp_rank): TP fastest, then DP, then PP (Megatron's default) */
void mt_parallel_state_init(mt_parallel_state *ps, const mt_config *cfg, int rank);
int mt_global_rank(const mt_config *cfg, int tp_rank, int dp_rank, int pp_rank);
void mt_print_layout(const mt_config *cfg, FILE *f);

typedef struct {
    mt_comm world, tp, pp, dp;  // Megatron's groups: all ranks, my TP / PP / DP group
    mt_comm mp;                 // model-parallel group: the TP x PP ranks of my replica (grad norm)
    mt_comm embd;               // first and last stage's copies of wte (PP > 1 only)
    mt_comm p2p;                // my PP group again, for the pipeline's activations and gradients
                                // (mt_p2p_batch): NCCL between the devices on the GPU build, so
                                // that pp itself keeps host values (the generation's broadcasts)
} mt_groups;
/* every rank creates the groups it belongs to; compute_stream (GPU build: the rank's kernel
   stream) makes the groups that move device buffers (tp, dp, embd, p2p) join NCCL; NULL on the CPU */
void mt_groups_init(mt_groups *g, mt_world *w, const mt_config *cfg, const mt_parallel_state *ps,
                    void *compute_stream);
void mt_groups_free(mt_groups *g);

/* ============================================================================================= */
/* 3. OPS: CPU REFERENCE & THE BACKEND SEAM
 * defines: every op's definition mt_<op>_cpu (forward/backward pairs), and
 *          the seam: mt_<op>(r, ...), mt_buffer_*, mt_device_* (CPU here, GPU in kernels.cuh) */
// the reference ops: plain loops; every backward ADDS into its d-buffers (the caller zeroes)
/* a dropout site: keep element e iff uniform(seed, iteration, site, global index of e) >= p */
typedef struct {
    uint64_t seed, iteration, site;   // site = layer * 8 + which (embedding, attention, attn out, mlp out)
    float p;                          // drop probability; 0 = dropout off
    int sample_offset;                // global sample index of local b = 0 (within the iteration)
    int T, C;                         // for hidden dropout (B,T,C): global index = ((sample*T + t)*C + c)
    int t_offset, T_local;            // hidden dropout: the local tensor (B,T_local,C) holds positions
                                      // [t_offset, t_offset + T_local) of each sample: 0 and T, or one
                                      // sequence-parallel shard (section 4); attention ignores both
} mt_dropout;
void mt_embedding_forward_cpu(float *out, const int *tokens, const float *wte, int B, int T, int C,
                              int vocab_start, int V_local);
void mt_embedding_backward_cpu(float *dwte, const float *dout, const int *tokens, int B, int T, int C,
                               int vocab_start, int V_local);
void mt_position_embedding_forward_cpu(float *out, const float *wpe, int B, int T, int C);
/* decoding's embedding: out[b,t,:] = (wte row of tokens[b,t] if it is one of my V_local rows, else 0)
   + (wpe row positions[b,t] when wpe is not NULL), (B,T,C); writes out ('=') */
void mt_embedding_positions_forward_cpu(float *out, const int *tokens, const float *wte, const int *positions,
                                        const float *wpe, int B, int T, int C, int vocab_start, int V_local);
void mt_position_embedding_backward_cpu(float *dwpe, const float *dout, int B, int T, int C);
void mt_layernorm_forward_cpu(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                              const float *bias, int B, int T, int C);
void mt_layernorm_backward_cpu(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                               const float *weight, const float *mean, const float *rstd, int B, int T, int C);
void mt_matmul_forward_cpu(float *out, const float *inp, const float *weight, const float *bias, int BT, int C, int OC);
void mt_matmul_backward_cpu(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                            const float *weight, int BT, int C, int OC);
void mt_dropout_forward_cpu(float *x, const mt_dropout *d, int B);
void mt_dropout_backward_cpu(float *dx, const mt_dropout *d, int B);
void mt_attention_forward_cpu(float *out, float *lse, const float *qkv, int B, int T, int C_local, int NH_local,
                              const mt_dropout *drop, int head_offset, int NH_global);
void mt_attention_backward_cpu(float *dqkv, const float *dout, const float *qkv, const float *out, const float *lse,
                               int B, int T, int C_local, int NH_local, const mt_dropout *drop, int head_offset,
                               int NH_global);
/* the index of the first largest of x[r*ld .. r*ld + n) for each row r: greedy decoding's token */
void mt_argmax_rows_cpu(int *out, const float *x, int rows, int n, int ld);
/* one row's draw (sampling, section 11): the uniform number and the filters it is drawn with */
typedef struct {
    float u;             // uniform in [0,1): mt_sampling_draw's, keyed by (seed, position, sequence)
    float temperature;   // <= 0: the argmax
    int top_k;           // 0: every token; 1: the argmax
    float top_p;         // 0 or >= 1: every token
} mt_draw;
/* the weight of a logit against the row's largest: floor(exp((logit - best) * inv_temperature) * 2^40) */
uint64_t mt_sample_weight(float logit, float best, double inv_temperature);
/* the token of x[0 .. n) drawn with d (temperature, top-k, top-p in integers: see section 3);
   mt_sample_rows_cpu: out[r] for each row r of x[r*ld .. r*ld + n) with draws[r] */
int mt_sample_row_cpu(const float *x, int n, const mt_draw *d);
void mt_sample_rows_cpu(int *out, const float *x, int rows, int n, int ld, const mt_draw *draws);
/* decode steps queued ahead (generation, section 11): after a step has picked next[b] for each of
   its `rows` sequences, the next step's inputs, made where the tokens are, so that the host need
   not wait for a token before it queues the step after (step s = *step, then *step = s + 1):
     tokens[b] = next[b]                    the token just picked goes in
     start[b] = positions[b] = min(start[b] + 1, cap - 1)   at the next position (held at the
                                            cache's last: a finished sequence's steps are ignored)
     draws[b] = plan[min(s + 1, plan_steps - 1) * rows + b]   step s + 1's draw (the host's plan)
     ring[(s % ring_slots) * rows + b] = next[b]   where the host reads step s's tokens */
void mt_decode_advance_cpu(int *tokens, int *positions, int *start, mt_draw *draws, int *step, int *ring,
                           const int *next, const mt_draw *plan, int plan_steps, int ring_slots, int rows, int cap);
/* attention of Tq new tokens per sequence over the KV cache (generation): see section 3 */
void mt_attention_cached_forward_cpu(float *out, float *kcache, float *vcache, const float *qkv, const int *start,
                                     int B, int Tq, int C_local, int NH_local, int cap);
void mt_gelu_forward_cpu(float *out, const float *inp, size_t N);
void mt_gelu_backward_cpu(float *dinp, const float *inp, const float *dout, size_t N);
void mt_residual_forward_cpu(float *out, const float *a, const float *b, size_t N);
/* res = a + b, then out, mean, rstd = layernorm(res): the residual add and the next layernorm as
   one op (the GPU reads the row once); (B,T,C) each */
void mt_residual_layernorm_forward_cpu(float *res, float *out, float *mean, float *rstd, const float *a, const float *b,
                                       const float *weight, const float *bias, int B, int T, int C);
void mt_bias_add_cpu(float *out, const float *bias, int BT, int OC);
void mt_cross_entropy_local_max_cpu(float *maxv, const float *logits, int BT, int V_local, int vocab_start, int V);
void mt_cross_entropy_local_sums_cpu(float *sumexp, float *target_logit, const float *logits, const float *maxv,
                                     const int *targets, int BT, int V_local, int vocab_start, int V);
void mt_cross_entropy_finish_cpu(float *losses, float *dlogits, const float *maxv, const float *sumexp,
                                 const float *target_logit, const int *targets, int BT, int V_local, int vocab_start,
                                 int V, float dloss);
void mt_adamw_cpu(float *param, float *m, float *v, const float *grad, float grad_scale, size_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int step);
double mt_sum_squares_cpu(const float *x, size_t n);
double mt_count_zeros_cpu(const float *x, size_t n);   /* how many x are 0 (--log-num-zeros-in-grad) */
/* *acc += (the BT losses summed in double) / BT: a micro-batch's mean loss (section 5's head) */
void mt_loss_mean_add_cpu(double *acc, const float *losses, int BT);
/* loss scaling's check (section 6 uses it): x *= inv_scale; returns 1 if any x was inf or NaN */
int mt_unscale_check_cpu(float *x, float inv_scale, size_t n);
// reduced precision: the bits of fp16 and bf16, and the ops whose operands the GPU build multiplies
// in them (--bf16, --fp16), emulated by rounding exactly those operands (mt_dtype: section 1)
uint16_t mt_fp16_from_float(float x);   /* round to nearest even; overflow -> inf, subnormals, NaN kept NaN */
float mt_fp16_to_float(uint16_t h);
uint16_t mt_bf16_from_float(float x);   /* round to nearest even; NaN kept NaN */
float mt_bf16_to_float(uint16_t h);
float mt_round_to_dtype(float x, mt_dtype dt);   /* x as dt holds it, back in fp32 (MT_DTYPE_FP32: x) */
void mt_round_cpu(float *out, const float *inp, size_t n, mt_dtype dt);   /* out may be inp */
/* buf's first 2n bytes hold n bf16 / fp16 values (dt): widened into n floats in place */
void mt_widen_16bit(float *buf, size_t n, mt_dtype dt);
void mt_matmul_forward_rounded_cpu(float *out, const float *inp, const float *weight, const float *bias, int BT, int C,
                                   int OC, mt_dtype dt);
void mt_matmul_backward_rounded_cpu(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                                    const float *weight, int BT, int C, int OC, mt_dtype dt);
/* the MLP's linears with the GELU between them, as one op each (the GPU fuses the GELU into the
   GEMM): pre = inp @ weight^T + bias, out = gelu(pre); and the backward of out2 = gelu(x) @ w^T + b:
   dinp = (dout @ w) * gelu'(x) ('='), dweight, dbias as the matmul's. In dt, as the _rounded ops */
void mt_matmul_forward_gelu_cpu(float *pre, float *out, const float *inp, const float *weight, const float *bias, int BT,
                                int C, int OC, mt_dtype dt);
void mt_matmul_backward_gelu_cpu(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                                 const float *weight, const float *gelu_inp, int BT, int C, int OC, mt_dtype dt);
/* fch_dt: MT_DTYPE_FP32, or the 16-bit type the GPU keeps fch in: fch rounded to it before the GELU;
   residual: NULL, or out = residual + (the product) (BT, OC), the residual stream's add joined */
void mt_mlp_forward_cpu(float *fch, float *out, const float *inp, const float *fcw, const float *fcb,
                        const float *fcprojw, const float *fcprojb, const float *residual, int BT, int C, int F, int OC,
                        mt_dtype dt, mt_dtype fch_dt);
void mt_attention_forward_rounded_cpu(float *out, float *lse, const float *qkv, int B, int T, int C_local,
                                      int NH_local, const mt_dropout *drop, int head_offset, int NH_global,
                                      mt_dtype dt);
void mt_attention_backward_rounded_cpu(float *dqkv, const float *dout, const float *qkv, const float *out,
                                       const float *lse, int B, int T, int C_local, int NH_local,
                                       const mt_dropout *drop, int head_offset, int NH_global, mt_dtype dt);

// the GPU build's kernel scratch: what its launchers (kernels.cuh) borrow for the length of one op
// (from the rank's arena, which the plan sizes), in bytes. Plain arithmetic that both builds compile:
// kernels.cuh sizes its mt__scratch_alloc with it, the memory plan (section 8) counts with it, and the
// CPU build's seam counts what each op it runs would borrow on the GPU (mt_device.gpu_scratch_high)
/* the GEMM rungs (--gemm), kernels.cuh's ladder: naive, tiled (fp32), mma and wgmma (bf16/fp16) */
typedef enum { MT_GEMM_NAIVE = 0, MT_GEMM_TILED = 1, MT_GEMM_MMA = 2, MT_GEMM_WGMMA = 3 } mt_gemm_impl;
/* how the wgmma rung cuts one GEMM (C is M x N, K long): the launcher runs this plan, the scratch counts it */
typedef struct {
    int bm, bn;                    // the tile: 128 x 256, or 192 x 192 (the weight gradients' k-outer products)
    int tiles_m, tiles_n, steps;   // output tiles of bm x bn; k-steps of 64 per tile
    int splits, k_per_split;       // split-K: slices of the k range (1: not split), k_per_split long each
    int stream_k;                  // 1: stream-K instead (132 workers share every tile's k-steps)
    long long sk_total;            // stream-K: the k-steps of all tiles
    int sk_slots;                  // stream-K: partial tiles per worker
    size_t units;                  // blocks' worth of work: tiles x splits, or the 132 workers
    size_t slots;                  // bm x bn fp32 partial tiles in the scratch (0: none)
} mt_wgmma_plan;
/* want_splits 0: the default plan; want_tile 0: 128 x 256 only, 1: 192 x 192 where it wins (both
   operands k outer, no fused epilogue: the only layout it is built for), 2: 192 x 192 (tests) */
void mt_wgmma_plan_make(mt_wgmma_plan *p, int M, int N, int K, int want_splits, int want_tile);
int mt_gemm_splits(mt_gemm_impl impl, int M, int N, int K, int *k_per_split);      /* tiled, mma: k-slices */
size_t mt_gpu_operand_span(int rows, int K, int ld, int k_inner);   /* elements from first to last */
size_t mt_gpu_rounded_copy_bytes(size_t n);                           /* n elements as bf16/fp16, + slack */
/* b16: the B operand already in 16 bits (a weight, lent by the parameters' 16-bit copy): no copy of it */
size_t mt_gpu_gemm_scratch(mt_gemm_impl impl, int M, int N, int K, int lda, int ldb, int a_k_inner, int b_k_inner,
                           mt_dtype dtype, int b16);
/* w16 (here and below): the weight is lent by the parameters' 16-bit copy (mt_device_weights16 on,
   mt_weights16_wanted): no rounded copy of it */
size_t mt_gpu_matmul_forward_scratch(int BT, int C, int OC, mt_gemm_impl impl, mt_dtype dtype, int w16);
/* inp16: the input already in 16 bits (a layer's ln1 / ln2, mt_ln_gemm_dtype); dout16: the output
   gradient already in 16 bits (the fc output's, mt_fch_gemm_dtype; the logits'): no rounded copy of it */
size_t mt_gpu_matmul_backward_scratch(int BT, int C, int OC, int has_dinp, int has_dbias, mt_gemm_impl impl,
                                      mt_dtype dtype, int inp16, int dout16, int w16);
size_t mt_gpu_column_sum_scratch(int M, int N);
size_t mt_gpu_matmul_backward_gelu_scratch(int BT, int C, int OC, int has_dbias, mt_gemm_impl impl, mt_dtype dtype,
                                           int w16);
size_t mt_gpu_mlp_forward_scratch(int BT, int C, int F, int OC, mt_gemm_impl impl, mt_dtype dtype, int inp16, int w16);
/* dout16: dout comes in 16 bits already (a training layer's datty, mt_datty_gemm_dtype): no rounded copy */
size_t mt_gpu_attention_backward_scratch(int B, int T, int C_local, int NH_local, mt_dtype dtype, int dout16,
                                         mt_gemm_impl impl);
/* the wgmma attention backward's dS^T tiles, handed from the dK/dV kernel to the dQ kernel (kernels.cuh,
   THE dS HAND-OFF): bf16 pairs of 64 x 64 tiles, ceil(T/128) (ceil(T/128) + 1) pairs a head */
size_t mt_gpu_attention_ds_bytes(int B, int T, int NH_local);
/* out16: the output is written in 16 bits (a training layer's atty, mt_atty_gemm_dtype) */
size_t mt_gpu_attention_forward_scratch(int B, int T, int C_local, int NH_local, mt_gemm_impl impl, mt_dtype dtype,
                                        int out16);
size_t mt_gpu_matmul_forward16_scratch(int BT, int C, int OC, mt_gemm_impl impl, mt_dtype dtype, int inp16, int w16);
size_t mt_gpu_layernorm_backward_scratch(int N, int C);
size_t mt_gpu_embedding_backward_scratch(int BT, int V_local);
/* the LM head's logits and their gradient (mt_lm_head_forward, mt_lm_head_backward): 16 bits (bf16 /
   fp16) where the wgmma rung multiplies in 16 bits and C, V_local % 8 == 0; else fp32 */
mt_dtype mt_logits_grad_dtype(mt_gemm_impl impl, mt_dtype dtype, int C, int V_local);
/* a layer's ln1 and ln2 as the GPU stores them: the wgmma rung's 16-bit operand type where its
   GEMMs (qkv: OC = 3 C_tp; fc: F_tp wide) read them as they are, else fp32 (see the definition) */
mt_dtype mt_ln_gemm_dtype(mt_gemm_impl impl, mt_dtype dtype, int BT, int C, int qkv_OC, int F, int sequence_parallel);
/* a training layer's fc output (B,T,F) as the GPU keeps it: 16 bits where the wgmma rung runs the
   MLP's GEMMs (C, F multiples of 8, more rows than a GEMV takes, bf16 / fp16), else fp32 */
mt_dtype mt_fch_gemm_dtype(mt_gemm_impl impl, mt_dtype dtype, int BT, int C, int F);
/* a training layer's attention input gradient dqkv (B,T,3 C_tp) as the GPU writes it: 16 bits where
   the wgmma rung runs the qkv GEMM's backward (C, qkv_OC multiples of 8, more rows than a GEMV
   takes, bf16 / fp16), else fp32 */
mt_dtype mt_dqkv_gemm_dtype(mt_gemm_impl impl, mt_dtype dtype, int BT, int C, int qkv_OC);
/* a training layer's attention output gradient datty (B,T,C_tp) as the GPU writes it: 16 bits where
   the wgmma rung runs the attention projection's backward (C_tp, C multiples of 8, more rows than
   a GEMV takes, bf16 / fp16), else fp32 */
mt_dtype mt_datty_gemm_dtype(mt_gemm_impl impl, mt_dtype dtype, int BT, int C_tp, int C);
/* and its attention output atty (B,T,C_tp): 16 bits under the same condition (the projection's
   forward and weight gradient read it as it is) */
mt_dtype mt_atty_gemm_dtype(mt_gemm_impl impl, mt_dtype dtype, int BT, int C_tp, int C);
size_t mt_gpu_lm_head_backward_scratch(int BT, int C, int V_local, mt_gemm_impl impl, mt_dtype dtype, int w16);
/* the most one training step of rank r borrows at once (needs r->cfg, r->ps, r->dims only) */
size_t mt_gpu_scratch_peak(const mt_rank *r, mt_gemm_impl impl, mt_dtype dtype);

// THE BACKEND SEAM: the ops as the model calls them, on the rank's device (same arguments as
// the _cpu functions, plus the rank); the memory they work on; the device's facts
#define MT_DEVICE_POINTS 4      /* mt_device_point's points a rank has */
typedef struct {
    int device;                 // CUDA device, -1 on the CPU build
    void *stream;               // cudaStream_t of every kernel of this rank (NULL on the CPU build)
    int gemm_impl;              // mt_gemm_impl: --gemm naive|tiled|mma|wgmma. The CPU build: the rung the GPU
                                // build would take (the kernel scratch it counts is that rung's)
    mt_dtype dtype;             // --bf16 / --fp16: GEMM and attention operands in it, fp32 accumulation
                                // (the GPU's tensor cores; the CPU build rounds the operands to it)
    char name[64];              // for the log: "GPU 0, GEMM wgmma"; "" on the CPU build
    void *weights16;            // GPU, --bf16 / --fp16: the parameters rounded to dtype in 16 bits
    size_t weights16_n;         //   (mt_device_weights16): weights16_n values; NULL until first made
    int weights16_on;           // 1 while the ops read that copy (the CPU build keeps the flag alone:
                                // its count of the GPU's kernel scratch follows it)
    size_t weights16_updated;   // GPU: parameters AdamW wrote into the copy as it updated them since the
                                // copy was last made or lent (mt_adamw); all of them: nothing to cast
    size_t context_bytes;       // GPU build: in use on the GPU before this rank's first allocation (the
                                // CUDA context, other processes); 0 on the CPU build
    size_t gpu_scratch_high;    // CPU build: the most kernel scratch the GPU's launchers would have borrowed
                                // at once for the ops this rank ran (make test holds the plan to it)
    void *decode_work;          // GPU decoding: the one-kernel step's barrier counters and argmax partials
    size_t decode_work_bytes;   //   (mt_device_decode_step), freed when a generator turns the copy off
    void *points[MT_DEVICE_POINTS];   // GPU: mt_device_point's CUDA events, made at first use
    double point_done[MT_DEVICE_POINTS];   // mt_device_point_done's times (mt_time_seconds)
} mt_device;
void mt_embedding_forward(mt_rank *r, float *out, const int *tokens, const float *wte, int B, int T, int C,
                          int vocab_start, int V_local);
void mt_embedding_backward(mt_rank *r, float *dwte, const float *dout, const int *tokens, int B, int T, int C,
                           int vocab_start, int V_local);
void mt_position_embedding_forward(mt_rank *r, float *out, const float *wpe, int B, int T, int C);
void mt_embedding_positions_forward(mt_rank *r, float *out, const int *tokens, const float *wte, const int *positions,
                                    const float *wpe, int B, int T, int C, int vocab_start, int V_local);
void mt_position_embedding_backward(mt_rank *r, float *dwpe, const float *dout, int B, int T, int C);
/* out_dtype: how out is stored: MT_DTYPE_FP32, or (a training layer's ln1 / ln2 on the GPU,
   mt_ln_storage_dtype) 16 bits in half the floats; mean and rstd are fp32 */
void mt_layernorm_forward(mt_rank *r, float *out, float *mean, float *rstd, const float *inp, const float *weight,
                          const float *bias, int B, int T, int C, mt_dtype out_dtype);
void mt_layernorm_backward(mt_rank *r, float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                           const float *weight, const float *mean, const float *rstd, int B, int T, int C);
/* inp_dtype: how inp is stored (MT_DTYPE_FP32, or a training layer's attention output in
   mt_atty_storage_dtype); residual: NULL, or out = residual + (the product) (BT, OC), the residual
   stream's add joined (as mt_residual_forward(out, residual, product): the GPU's GEMM epilogue) */
void mt_matmul_forward(mt_rank *r, float *out, const float *inp, mt_dtype inp_dtype, const float *weight,
                       const float *bias, const float *residual, int BT, int C, int OC);
/* inp_dtype: how inp is stored (MT_DTYPE_FP32, a layer's ln1 / ln2 in mt_ln_storage_dtype, or its
   attention output in mt_atty_storage_dtype);
   dout_dtype: how dout is (MT_DTYPE_FP32, or the fc output's gradient in mt_fch_storage_dtype);
   dinp_dtype: how to write dinp (MT_DTYPE_FP32, or the attention output's gradient in
   mt_datty_storage_dtype);
   dinp NULL: only dweight (and dbias); dweight NULL: only dinp (and dbias), inp not read */
void mt_matmul_backward(mt_rank *r, float *dinp, mt_dtype dinp_dtype, float *dweight, float *dbias, const float *dout,
                        mt_dtype dout_dtype, const float *inp, mt_dtype inp_dtype, const float *weight, int BT, int C,
                        int OC);
void mt_matmul_forward_gelu(mt_rank *r, float *pre, float *out, const float *inp, const float *weight, const float *bias,
                            int BT, int C, int OC);
/* the MLP's fc-proj backward through the GELU: dinp = (dout @ weight) * gelu'(gelu_inp) ('='), dweight +=
   dout^T gelu(gelu_inp), dbias += column sums of dout; gelu(gelu_inp) is remade, not read. dinp is
   stored as gelu_inp is (gelu_inp_dtype: the fc output and its gradient, mt_fch_storage_dtype) */
void mt_matmul_backward_gelu(mt_rank *r, float *dinp, float *dweight, float *dbias, const float *dout,
                             const float *weight, const float *gelu_inp, mt_dtype gelu_inp_dtype, int BT, int C,
                             int OC);
/* the MLP's two products in a training forward: fch = inp @ fcw^T + fcb (BT,F), kept in fch_dtype
   (mt_fch_storage_dtype); out = gelu(fch) @ fcprojw^T (+ fcprojb unless NULL) (BT,OC), + residual
   (BT,OC) unless NULL (the residual stream's add, as mt_residual_forward(out, residual, product):
   the GPU's fc-proj GEMM does it in its epilogue); gelu(fch) lives only inside the op */
void mt_mlp_forward(mt_rank *r, float *fch, mt_dtype fch_dtype, float *out, const float *inp, mt_dtype inp_dtype,
                    const float *fcw, const float *fcb, const float *fcprojw, const float *fcprojb,
                    const float *residual, int BT, int C, int F, int OC);
void mt_bias_add(mt_rank *r, float *out, const float *bias, int BT, int OC);
void mt_dropout_forward(mt_rank *r, float *x, const mt_dropout *d, int B);
void mt_dropout_backward(mt_rank *r, float *dx, const mt_dropout *d, int B);
/* a training layer's qkv (B,T,3*C_local), from its projection to the attention's backward, is kept
   in mt_qkv_storage_dtype: fp32 on the CPU; on the GPU the attention's 16-bit operand type (bf16,
   fp16) unless --fp32, in half the floats, which only mt_qkv_forward writes and mt_attention_*
   read. mt_qkv_forward: qkv = inp @ weight^T + bias (as mt_matmul_forward) so stored. */
mt_dtype mt_qkv_storage_dtype(const mt_config *cfg);
void mt_qkv_forward(mt_rank *r, float *qkv, const float *inp, mt_dtype inp_dtype, const float *weight,
                    const float *bias, int BT, int C, int OC);
/* a training layer's ln1 and ln2 (B,T,C), read by the qkv and fc GEMMs only (forward and weight
   gradient; the layernorm's backward reads its input): fp32 on the CPU; on the GPU
   mt_ln_gemm_dtype for the rung this build runs (16 bits in half the floats, which only
   mt_layernorm_forward / mt_residual_layernorm_forward write and those GEMMs read). Like
   mt_device_scratch_bytes it answers before mt_device_init, for --dry-run too. */
mt_dtype mt_ln_storage_dtype(const mt_rank *r);
/* a training layer's fc output (B,T,F_tp), kept for the MLP's backward: fp32 on the CPU; on the GPU
   mt_fch_gemm_dtype for the rung this build runs (16 bits in half the floats, which only
   mt_mlp_forward writes and mt_matmul_backward_gelu reads); like mt_ln_storage_dtype, before
   mt_device_init too */
mt_dtype mt_fch_storage_dtype(const mt_rank *r);
/* a training layer's dqkv (B,T,3 C_tp), from the attention's backward to the qkv GEMM's: fp32 on
   the CPU; on the GPU mt_dqkv_gemm_dtype for the rung this build runs (16 bits in half the floats);
   like mt_ln_storage_dtype, before mt_device_init too */
mt_dtype mt_dqkv_storage_dtype(const mt_rank *r);
/* a training layer's attention output atty (B,T,C_tp), from the attention to its projection's
   forward and weight gradient and to the attention's backward (D = rowsum(dO * O)): fp32 on the CPU;
   on the GPU mt_atty_gemm_dtype for the rung this build runs (16 bits in half the floats, which
   mt_attention_forward writes when asked with out_dtype); like mt_ln_storage_dtype, before
   mt_device_init too */
mt_dtype mt_atty_storage_dtype(const mt_rank *r);
void mt_attention_forward(mt_rank *r, float *out, mt_dtype out_dtype, float *lse, const float *qkv, int B, int T,
                          int C_local, int NH_local, const mt_dropout *drop, int head_offset, int NH_global);
/* a training layer's datty (B,T,C_tp), the attention output's gradient, from the attention
   projection's backward to the attention's: fp32 on the CPU; on the GPU mt_datty_gemm_dtype for
   the rung this build runs (16 bits in half the floats); like mt_ln_storage_dtype, before
   mt_device_init too */
mt_dtype mt_datty_storage_dtype(const mt_rank *r);
/* dqkv is written in dqkv_dtype (a training layer's: mt_dqkv_storage_dtype); dout is stored in
   dout_dtype (MT_DTYPE_FP32, or a training layer's datty in mt_datty_storage_dtype); out in out_dtype
   (MT_DTYPE_FP32, or a training layer's atty in mt_atty_storage_dtype) */
void mt_attention_backward(mt_rank *r, float *dqkv, mt_dtype dqkv_dtype, const float *dout, mt_dtype dout_dtype,
                           const float *qkv, const float *out, mt_dtype out_dtype, const float *lse, int B, int T,
                           int C_local, int NH_local, const mt_dropout *drop, int head_offset, int NH_global);
void mt_attention_cached_forward(mt_rank *r, float *out, float *kcache, float *vcache, const float *qkv,
                                 const int *start, int B, int Tq, int C_local, int NH_local, int cap);
/* decoding one sequence (B = 1, one new token, TP = 1): qkv = ln Wqkv^T + b (ln (1,C), Wqkv the
   layer's (3 C_local, C)) and the attention over the cache (out (1,C_local)) in one launch, where the
   rank's device has such a kernel (the GPU build with --bf16 / --fp16 decoding's 16-bit weights, head
   size 64, thread-block clusters): the same results as mt_matmul_forward then
   mt_attention_cached_forward there, bit for bit. Returns 0 where it has not (the CPU build, other
   shapes): the caller runs those two ops */
int mt_qkv_attention_decode(mt_rank *r, float *out, float *kcache, float *vcache, const float *ln, const float *weight,
                            const float *bias, const int *start, int C, int C_local, int NH_local, int cap);
void mt_argmax_rows(mt_rank *r, int *out, const float *x, int rows, int n, int ld);
/* sampling on the rank's device: out[r] = mt_sample_row_cpu(row r, draws[r]) for each row, the
   same token; out and draws are device buffers. work: mt_sample_rows_work_bytes(rows, n) bytes of
   device memory (the GPU's weights and histograms; 0 on the CPU, whose op borrows its own) */
size_t mt_sample_rows_work_bytes(int rows, int n);
void mt_sample_rows(mt_rank *r, int *out, const float *x, int rows, int n, int ld, const mt_draw *draws, void *work);
/* mt_decode_advance_cpu on the rank's device: every pointer a device buffer but ring, which is host
   memory from mt_buffer_alloc_host (the device writes it; the host reads it after mt_device_point_wait) */
void mt_decode_advance(mt_rank *r, int *tokens, int *positions, int *start, mt_draw *draws, int *step, int *ring,
                       const int *next, const mt_draw *plan, int plan_steps, int ring_slots, int rows, int cap);
void mt_gelu_forward(mt_rank *r, float *out, const float *inp, size_t N);
void mt_gelu_backward(mt_rank *r, float *dinp, const float *inp, const float *dout, size_t N);
void mt_residual_forward(mt_rank *r, float *out, const float *a, const float *b, size_t N);
void mt_residual_layernorm_forward(mt_rank *r, float *res, float *out, float *mean, float *rstd, const float *a,
                                   const float *b, const float *weight, const float *bias, int B, int T, int C,
                                   mt_dtype out_dtype);
/* the LM head's logits (BT, V_local) = inp @ weight^T (no bias), stored in logits_dtype: fp32, or
   (the GPU, mt_logits_storage_dtype) 16 bits, V_local values a row in half the floats: the values the
   CPU build's fp32 logits are rounded to (Megatron's --bf16 keeps its logits in bf16 too) */
mt_dtype mt_logits_storage_dtype(const mt_rank *r);
void mt_lm_head_forward(mt_rank *r, float *logits, mt_dtype logits_dtype, const float *inp, const float *weight, int BT,
                        int C, int V_local);
/* the cross-entropy's steps read the logits as mt_lm_head_forward stored them (logits_dtype) */
void mt_cross_entropy_local_max(mt_rank *r, float *maxv, const float *logits, mt_dtype logits_dtype, int BT, int V_local,
                                int vocab_start, int V);
void mt_cross_entropy_local_sums(mt_rank *r, float *sumexp, float *target_logit, const float *logits,
                                 mt_dtype logits_dtype, const float *maxv, const int *targets, int BT, int V_local,
                                 int vocab_start, int V);
/* the two above in one (what a rank that holds the whole vocabulary, TP = 1, needs: no all-reduce
   between them): the CPU runs them in turn; the GPU reads the logits once (an online softmax) */
void mt_cross_entropy_local_max_sums(mt_rank *r, float *maxv, float *sumexp, float *target_logit, const float *logits,
                                     mt_dtype logits_dtype, const int *targets, int BT, int V_local, int vocab_start,
                                     int V);
/* dlogits: NULL (the losses only), or the logits, overwritten with their gradient in the same
   storage (logits_dtype: fp32, or 16 bits in place, each value where its logit was) */
void mt_cross_entropy_finish(mt_rank *r, float *losses, float *dlogits, mt_dtype logits_dtype, const float *maxv,
                             const float *sumexp, const float *target_logit, const int *targets, int BT, int V_local,
                             int vocab_start, int V, float dloss);
/* TP = 1 with the gradient: mt_cross_entropy_local_max_sums, then mt_cross_entropy_finish with
   dlogits = logits, as one op (the CPU runs the two; the GPU, for 16-bit logits, one kernel that
   reads each row for its max and sum, then again for its gradient): the same values */
void mt_cross_entropy_max_sums_finish(mt_rank *r, float *losses, float *logits, mt_dtype logits_dtype, float *maxv,
                                      float *sumexp, float *target_logit, const int *targets, int BT, int V_local,
                                      int vocab_start, int V, float dloss);
/* the LM head's matmul backward (no bias): dinp = dlogits @ weight, dweight += dlogits^T inp, with
   dlogits as mt_cross_entropy_finish left it in place of the logits (logits_dtype: 16 bits on the
   GPU are the GEMMs' operand type already, read as they are); dinp or dweight NULL as in
   mt_matmul_backward */
void mt_lm_head_backward(mt_rank *r, float *dinp, float *dweight, const float *dlogits, mt_dtype logits_dtype,
                         const float *inp, const float *weight, int BT, int C, int V_local);
void mt_adamw(mt_rank *r, float *param, float *m, float *v, const float *grad, float grad_scale, size_t n, float lr,
              float beta1, float beta2, float eps, float weight_decay, int step);
double mt_sum_squares(mt_rank *r, const float *x, size_t n);   /* in double; the result on the host */
/* the same over `parts` pieces of one buffer, x[start[i] .. start[i] + count[i]), added in order
   (sum of the pieces' sums, as many mt_sum_squares calls would give): one device reduction and one
   synchronisation for them all (the gradient norm's tensors) */
double mt_sum_squares_parts(mt_rank *r, const float *x, const size_t *start, const size_t *count, int parts);
/* the same pieces, counting the values that are 0 (mt_count_zeros_cpu's count) */
double mt_count_zeros_parts(mt_rank *r, const float *x, const size_t *start, const size_t *count, int parts);
int mt_unscale_check(mt_rank *r, float *x, float inv_scale, size_t n);   /* one pass; the flag on the host */
/* a micro-batch's mean loss added where the losses are (no wait): *acc (a double in the rank's
   buffers, 8-byte aligned) += (the BT losses summed in double) / BT; read once per step */
void mt_loss_mean_add(mt_rank *r, double *acc, const float *losses, int BT);
/* buffers: host memory (CPU build) or the rank's device memory (GPU build), zeroed */
float *mt_buffer_alloc(mt_rank *r, size_t n, const char *what);
int *mt_buffer_alloc_ints(mt_rank *r, size_t n, const char *what);
void mt_buffer_free(void *p);
void mt_buffer_zero(mt_rank *r, float *p, size_t n);
void mt_buffer_copy(mt_rank *r, float *dst, const float *src, size_t n);
/* rows copies of `row` floats: row i from src + i*src_stride to dst + i*dst_stride (cudaMemcpy2D);
   the sequence-parallel shards of a (B,T,C) tensor are B such rows (section 4) */
void mt_buffer_copy_strided(mt_rank *r, float *dst, size_t dst_stride, const float *src, size_t src_stride, size_t row,
                            size_t rows);
/* host <-> buffer (bytes); synchronous: token ids, losses, pipeline messages, and the offloaded
   optimizer's gradients down and parameters up (once per step, from and into mt_buffer_alloc_host) */
void mt_buffer_upload(mt_rank *r, void *dst, const void *host_src, size_t bytes);
void mt_buffer_download(mt_rank *r, void *host_dst, const void *src, size_t bytes);
/* the same upload queued on the rank's stream behind the work before it, without waiting for it:
   host_src must be ordinary (pageable) host memory, which the runtime copies aside before it
   returns, so the caller may reuse it at once (a micro-batch's token ids: the GPU then goes from
   the last step's optimizer to the next forward without the host's round trip in between) */
void mt_buffer_upload_queued(mt_rank *r, void *dst, const void *host_src, size_t bytes);
/* host memory the device copies to and from at full speed, zeroed: pinned (page-locked, cudaHostAlloc)
   on the GPU build, ordinary host memory on the CPU build. --optimizer-cpu-offload keeps AdamW's state in it.
   Kernels may also read and write it at the same address (unified addressing: every 64-bit CUDA
   platform): the decode steps queued ahead leave their tokens there (mt_decode_advance) */
float *mt_buffer_alloc_host(mt_rank *r, size_t n, const char *what);
void mt_buffer_free_host(void *p);
/* the device: set-up (which GPU, its stream, the GEMM rung; on the GPU build the arena its kernels
   borrow scratch from, sized from r->dims: set them first, or the rank gets none) and tear-down;
   the memory in use (returns 0 where there is no device); what --fp16 / --bf16 mean on this build */
void mt_device_init(mt_rank *r);
void mt_device_free(mt_rank *r);
/* the timeline's device clock (section 1's spans). The GPU queues work and returns at once, so a
   span's ends are marks in a stream: mt_device_mark records a timed CUDA event in `stream` (the
   rank's, or a communicator's) and returns its id; mt_device_marks_resolve waits for the marks of
   the log's spans and turns them into host seconds, once per iteration (no synchronisation per
   span: the timeline does not slow what it shows). The CPU build's ops are done when they
   return: mt_device_mark returns -1 and the spans keep their host times. */
int mt_device_mark(mt_span_log *log, void *stream);
void mt_device_marks_resolve(mt_span_log *log);
void mt_device_clock_free(mt_span_log *log);
int mt_device_memory_in_use(mt_rank *r, double *used_gib, double *total_gib);
/* the memory plan's device terms (section 8): the most kernel scratch one training step of r
   borrows at once (mt_gpu_scratch_peak with the rung and precision this build runs; 0 on the CPU
   build, whose ops borrow no device memory), and the communicators' own buffers (NCCL's, an
   estimate per communicator; 0 on the CPU build: the threads backend works in the ranks' buffers).
   Both from r->cfg, r->ps and r->dims: they answer before mt_device_init, for --dry-run too. */
size_t mt_device_scratch_bytes(const mt_rank *r);
size_t mt_device_comm_bytes(const mt_rank *r);
/* the rank's device memory as measured now (GPU build; returns 0 and measures nothing where there
   is no device). Megatron's report_memory reads the same four figures from PyTorch's allocator. */
typedef struct {
    size_t allocated, allocated_peak;           // cudaMalloc'd through mt_buffer_alloc*: now, at most
    size_t scratch_used, scratch_used_peak;     // kernel scratch lent: by the rank's arena and the stream-ordered
                                                // pool past it (kernels.cuh, section 1), added: now, at most
    size_t scratch_arena_peak;                  //   of which the arena's at most (the rest: the pool's)
    size_t scratch_reserved, scratch_reserved_peak;   // their backing memory: the whole arena, and what the pool
                                                // keeps (and the CUDA graphs' memory pool, where a recorded
                                                // launcher's fallback borrows): now, at most
    size_t context;                             // in use on the GPU before the first allocation (dev.context_bytes)
    size_t in_use, total;                       // the whole GPU now (cudaMemGetInfo): in use, size
} mt_device_memory;
int mt_device_memory_measure(mt_rank *r, mt_device_memory *m);
void mt_device_check_precision(const mt_config *cfg);
/* CUDA graphs (GPU build): the work a rank queues between capture_begin and capture_end is recorded,
   not run, and capture_end returns it as one launchable graph; graph_launch replays it. Where there
   is nothing to record (the CPU build; MT_CUDA_GRAPH=0, MT_PROFILE=1 or MT_SYNC_DEBUG=1 on the GPU)
   the work runs as it is queued and capture_end returns NULL. The work must be collective-free and
   read its varying inputs from device buffers. Inside the graph the kernels that wait with
   griddepcontrol (kernels.cuh, "programmatic dependent launch") start behind the kernel ahead of
   them, unless MT_PDL=0. The recorded launchers' kernel scratch is pieces of the rank's arena
   (kernels.cuh, section 1: addresses, no allocation in the graph); a piece the arena cannot serve
   is an allocation of the graph's own memory pool. decode = 1: generation's decode step (section
   11), whose such scratch stays with the stream's pool for the next prefill; 0: a training step's
   chunk (section 8), after which the stream's pool gives back what it keeps unused. */
void mt_device_capture_begin(mt_rank *r, int decode);
void *mt_device_capture_end(mt_rank *r);
void mt_device_graph_launch(mt_rank *r, void *graph);
void mt_device_graph_free(void *graph);
/* 1 where a first run pays for what later runs reuse (the GPU build: kernels loaded on their first
   launch, a decode step's CUDA graph recorded on its first run), so that generation warms up before
   its clock (section 11); 0 on the CPU build, whose first run costs what the others do */
int mt_device_first_run_costs(const mt_rank *r);
/* points in the rank's stream that the host can wait for without waiting for the work queued after
   them (generation's decode steps queued ahead, section 11): mt_device_point(r, i) marks the end of
   the work queued so far as point i (0 <= i < MT_DEVICE_POINTS; marking it again moves it),
   mt_device_point_wait(r, i) returns once that work is done. The CPU build: its ops are done when
   they return, nothing to mark or wait for */
void mt_device_point(mt_rank *r, int i);
void mt_device_point_wait(mt_rank *r, int i);
/* when the work before point i was done, as far as the host can tell (mt_time_seconds): the CPU
   build, when the point was marked (its ops are done when they return); the GPU build, when
   mt_device_point_wait(r, i) last returned (it spins, so within a microsecond or two of the point
   where the host waited before the point was reached). Generation times its queued decode steps
   by it (section 11) */
double mt_device_point_done(const mt_rank *r, int i);
/* the parameters rounded once to the operand type of the products that round them (--bf16 /
   --fp16 on the GPU): the same values each product would round each weight to, made in one cast
   instead of one per product (a training step multiplies every weight twice: the forward and the
   input gradient), and decoding reads them in half the bytes. use:
     MT_WEIGHTS16_STEP      (re)make the copy from the parameters as they are now and let the ops
                            read it: a training or evaluation step, from its start to its optimizer
                            (section 8). Made where the GEMMs round their weights: the wgmma rung
     MT_WEIGHTS16_DECODING  the same for a generator's whole life (section 11); also on the mma
                            rung, whose few-row GEMV reads 16-bit weights
     MT_WEIGHTS16_OFF       the ops stop reading it (the parameters are about to change); the memory
                            stays for the next step (mt_device_free frees it)
   The GPU's AdamW (mt_adamw) writes each parameter it updates into the copy as well; where it has
   so written all of them since the copy was last made or lent, the next STEP or DECODING finds the
   copy current and casts nothing. Anything else that changes the parameters (a checkpoint's load,
   the distributed optimizer's all-gather) writes only the fp32 values, and the count of what AdamW
   wrote then falls short: the copy is made again.
   The parameters must not change while it is on. The CPU build keeps only the flag (r->dev.
   weights16_on, for its count of the GPU's scratch); fp32 and the other rungs: no copy. */
enum { MT_WEIGHTS16_OFF = 0, MT_WEIGHTS16_STEP = 1, MT_WEIGHTS16_DECODING = 2 };
int mt_weights16_wanted(mt_gemm_impl impl, mt_dtype dtype, int use);   /* 1 where `use` makes the copy */
void mt_device_weights16(mt_rank *r, int use);
/* the memory plan's term (section 8): the bytes the training steps' copy takes on this build
   (2 a parameter where mt_weights16_wanted says so for the rung the device will run; 0 on the
   CPU build); like mt_device_scratch_bytes it answers before mt_device_init */
size_t mt_device_weights16_bytes(const mt_rank *r);
/* a whole decode step in one launch, where the backend has one (the GPU build: kernels.cuh's
   "a decode step as one kernel", with the decoding copy of the weights, TP = PP = 1, one new token
   for each of B <= MT_GEMV_MAX_ROWS sequences, the shapes mt_decode_step_gpu takes): the same
   arithmetic as section 11's op-by-op step, the same bits. Returns 1 when it ran the step, 0 when
   the caller must run the ops (the CPU build always; the GPU unless MT_DECODE_ONE_KERNEL=1: measured,
   it is not yet faster than the op-by-op step's CUDA graph, docs/perf.md). Section 11 fills it
   from the generator's buffers; every pointer is the rank's device memory. */
typedef struct {
    int B, L, C, NH, F, V, Vp, cap;   // sequences, layers, channels, heads, MLP width, vocabulary (real,
                                      // padded), positions in the cache
    const int *tokens, *positions, *start;   // (B) the new tokens, their positions, the cache rows they go to
    const float *wte, *wpe, *lnfw, *lnfb;    // the parameters, as section 5's mt_params holds them:
    const float *ln1w, *ln1b, *qkvw, *qkvb, *attprojw, *attprojb;   // layer 0's, and layer l's at l
    const float *ln2w, *ln2b, *fcw, *fcb, *fcprojw, *fcprojb;       // times a layer's size
    float *kcache, *vcache;                  // layer l's (B, cap, C) at l * cache_layer floats
    size_t cache_layer;
    float *x, *res2, *qkv, *atty, *out_c, *fch, *fch_gelu;   // (B, C), (B, C), (B, 3C), (B, C), (B, C), (B, F) x2
    float *logits;                           // (B, Vp) out
    int *next;                               // (B) out: the argmax of each row (greedy), or NULL
} mt_decode_step;
int mt_device_decode_step(mt_rank *r, const mt_decode_step *s);

/* ============================================================================================= */
/* 4. TENSOR-PARALLEL LAYERS
 * defines: f and g (mt_copy_to_tp_region, mt_reduce_from_tp_region), their sequence-parallel
 *          forms g and g-bar (all-gather / reduce-scatter along the sequence), column- and
 *          row-parallel linear, vocab-parallel embedding and cross-entropy */
void mt_reduce_from_tp_region_forward(mt_rank *r, float *y, size_t n);   /* g forward: all-reduce */
void mt_copy_to_tp_region_backward(mt_rank *r, float *dx, size_t n);      /* f backward: all-reduce */
/* sequence parallel (--sequence-parallel): full is (B,T,K), shard is my positions (B,T/TP,K) */
void mt_gather_from_sequence_parallel_region_forward(mt_rank *r, float *full, const float *shard, int K);
void mt_gather_from_sequence_parallel_region_backward(mt_rank *r, float *dshard, const float *dfull, int K);
void mt_reduce_scatter_to_sequence_parallel_region_forward(mt_rank *r, float *shard, const float *full, int K);
void mt_reduce_scatter_to_sequence_parallel_region_backward(mt_rank *r, float *dfull, const float *dshard, int K);
void mt_column_parallel_linear_forward(mt_rank *r, float *out, const float *inp, const float *weight,
                                       const float *bias, int BT, int K, int OC_tp);
/* inp_dtype: how inp is stored (fp32, or a layer's ln1 / ln2 in mt_ln_storage_dtype: never with
   --sequence-parallel, whose all-gather moves fp32); dout_dtype: how dout is (fp32, or the fc
   output's gradient in mt_fch_storage_dtype, as mt_row_parallel_linear_gelu_backward wrote it) */
void mt_column_parallel_linear_backward(mt_rank *r, float *dinp, float *dweight, float *dbias, const float *dout,
                                        mt_dtype dout_dtype, const float *inp, mt_dtype inp_dtype, const float *weight,
                                        int BT, int K, int OC_tp);
/* the attention's q, k, v projection: the forward above, qkv stored as the attention reads it (mt_qkv_forward) */
void mt_column_parallel_qkv_forward(mt_rank *r, float *qkv, const float *inp, mt_dtype inp_dtype, const float *weight,
                                    const float *bias, int BT, int K, int OC_tp);
/* the LM head's (column-parallel over the vocabulary, no bias), from the logits gradient as
   mt_vocab_parallel_cross_entropy_forward left it (mt_lm_head_backward, section 3); and its
   forward, the logits stored in mt_logits_storage_dtype (mt_lm_head_forward, section 3) */
void mt_lm_head_parallel_backward(mt_rank *r, float *dinp, float *dweight, const float *dlogits, const float *inp,
                                  const float *weight, int BT, int K, int V_tp);
void mt_lm_head_parallel_forward(mt_rank *r, float *logits, const float *inp, const float *weight, int BT, int K,
                                 int V_tp);
/* inp_dtype: how inp is stored (MT_DTYPE_FP32, or a training layer's attention output in
   mt_atty_storage_dtype); residual: NULL, or out = residual + the layer's output, joined to the
   product, at TP = 1 without sequence parallelism only (with TP the sum over ranks comes between) */
void mt_row_parallel_linear_forward(mt_rank *r, float *out, const float *inp, mt_dtype inp_dtype, const float *weight,
                                    const float *bias, const float *residual, int BT, int K_tp, int OC);
/* dinp_dtype: how to write dinp (MT_DTYPE_FP32, or the attention output's gradient in
   mt_datty_storage_dtype); inp_dtype as the forward's */
void mt_row_parallel_linear_backward(mt_rank *r, float *dinp, mt_dtype dinp_dtype, float *dweight, float *dbias,
                                     const float *dout, const float *inp, mt_dtype inp_dtype, const float *weight,
                                     int BT, int K_tp, int OC);
/* the MLP's pair with its GELU fused: column-parallel fc, pre = X A_r + b_r and out = gelu(pre);
   and row-parallel fc-proj's backward taken on through that GELU: dinp = dL/d pre (pre = gelu_inp) */
void mt_column_parallel_linear_gelu_forward(mt_rank *r, float *pre, float *out, const float *inp, const float *weight,
                                            const float *bias, int BT, int K, int OC_tp);
void mt_row_parallel_linear_gelu_backward(mt_rank *r, float *dinp, float *dweight, float *dbias, const float *dout,
                                          const float *weight, const float *gelu_inp, int BT, int K_tp, int OC);
/* a training forward's whole MLP: fch = X A_r + a_r (column-parallel, kept for the backward),
   out = gelu(fch) B_r summed over TP (+ b), as the two calls above with gelu(fch) never stored;
   residual: NULL, or out = residual + that, joined to fc-proj's product, at TP = 1 without sequence
   parallelism only (with TP the sum over ranks comes between them) */
void mt_parallel_mlp_forward(mt_rank *r, float *out, float *fch, const float *inp, mt_dtype inp_dtype, const float *fcw,
                             const float *fcb, const float *fcprojw, const float *fcprojb, const float *residual, int BT,
                             int K, int F_tp);
void mt_vocab_parallel_embedding_forward(mt_rank *r, float *out, const int *tokens, const float *wte, const float *wpe);
void mt_vocab_parallel_embedding_backward(mt_rank *r, float *dwte, float *dwpe, const float *dout, const int *tokens);
void mt_vocab_parallel_cross_entropy_forward(mt_rank *r, float *losses, float *logits, const int *targets, float dloss,
                                             int want_grad);

/* ============================================================================================= */
/* 5. GPT MODEL
 * defines: the parameter table (mt_params, mt_param_spec), activations and scratch,
 *          the rank's sizes and buffers (mt_dims, mt_model, mt_activation_slots), their set-up */
// ---------------------------------------------------------------------------------------------
// PARAMETERS: this rank's shards, one buffer, carved by one table
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
/* adding a tensor means adding a pointer above and a row to the carve table (mt__carve_params) */
#ifdef __cplusplus
static_assert(sizeof(mt_params) == MT_NUM_PARAM_TENSORS * sizeof(float *), "mt_params has one pointer per tensor");
#else
_Static_assert(sizeof(mt_params) == MT_NUM_PARAM_TENSORS * sizeof(float *), "mt_params has one pointer per tensor");
#endif

/* how a tensor is split over TP ranks (used by init, gather and checkpoint conversion) */
typedef enum {
    MT_SPLIT_NONE,    // replicated: every TP rank holds all of it
    MT_SPLIT_ROWS,    // global (R, K) -> (R/TP, K), rank r holds rows [r*R/TP, (r+1)*R/TP)
    MT_SPLIT_COLS,    // global (R, K) -> (R, K/TP), rank r holds columns [r*K/TP, ...)
    MT_SPLIT_QKV,     // global (3C, K) = [Q; K; V] -> (3*C_tp, K) = [Q_r; K_r; V_r]
    MT_SPLIT_VOCAB    // global (V, K) real rows; rank r holds padded rows [r*Vp_tp, (r+1)*Vp_tp)
} mt_split;

/* how a tensor starts (Megatron's init): see mt__init_params */
typedef enum {
    MT_INIT_NORMAL,        // normal(0, init_method_std)
    MT_INIT_SCALED_NORMAL, // normal(0, init_method_std / sqrt(2 L)): the two output projections (GPT-2)
    MT_INIT_ONES,          // layernorm weights
    MT_INIT_ZEROS          // biases
} mt_param_init;

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
    mt_param_init init;    // how mt__init_params fills it
    int tied_copy;         // 1: a copy that another rank counts in the grad norm (wte on the last stage, PP > 1)
    int sequence_parallel; // 1: used in the sequence-parallel regions (layernorms, with --sequence-parallel): each
                           // TP rank's gradient sums only its positions; all-reduced over TP (section 7)
} mt_param_spec;

typedef struct {
    // one slot = one micro-batch's saved activations for every chunk of this rank. The per-layer
    // tensors (ln1 .. residual3) are stacks of the layers whose tensor of that kind is kept (all
    // L_local of them without activation recompute): mt__layer_acts finds layer l's place.
    int *tokens;      // (B,T)
    int *targets;     // (B,T)
    float *input;     // (vp, B,T,C) each chunk's input: embedding output, or the previous stage's
    float *ln1;       // (kept layers, B,T,C)
    float *ln1_mean;  // (kept layers, B,T)
    float *ln1_rstd;  // (kept layers, B,T)
    float *qkv;       // (kept layers, B,T,3*C_tp) in mt_qkv_storage_dtype (the GPU: 16 bits, --fp32 aside)
    float *atty;      // (kept layers, B,T,C_tp)
    float *lse;       // (kept layers, B,NH_tp,T) logsumexp of each attention score row
    float *residual2; // (kept layers, B,T,C)
    float *ln2;       // (kept layers, B,T,C)
    float *ln2_mean;  // (kept layers, B,T)
    float *ln2_rstd;  // (kept layers, B,T)
    float *fch;       // (kept layers, B,T,F_tp)   the MLP's fc output, in mt_fch_storage_dtype (the
                      //               GPU: 16 bits); its GELU's output is never kept: the backward
                      //               remakes it, mt_matmul_backward_gelu
    float *residual3; // (kept layers, B,T,C)   the layer's output; kept at every recompute group's end
    float *lnf;       // (B,T,C)       last stage
    float *lnf_mean;  // (B,T)
    float *lnf_rstd;  // (B,T)
    float *logits;    // (B,T,Vp_tp)   last stage, in mt_logits_storage_dtype (the GPU: 16 bits where
                      //               mt_logits_grad_dtype says); after a training forward it holds
                      //               dloss/dlogits in the same storage (mt_lm_head_backward reads it)
    float *losses;    // (B,T)         last stage
    int mb;           // micro-batch held, -1 if free
    int sample_offset;// global sample index of its first sample within the iteration
} mt_activations;

/* the per-layer tensor kinds of mt_activations, in carve order */
typedef enum {
    MT_LT_LN1, MT_LT_LN1_MEAN, MT_LT_LN1_RSTD, MT_LT_QKV, MT_LT_ATTY, MT_LT_LSE, MT_LT_RESIDUAL2,
    MT_LT_LN2, MT_LT_LN2_MEAN, MT_LT_LN2_RSTD, MT_LT_FCH, MT_LT_RESIDUAL3, MT_LT_COUNT
} mt_layer_tensor;

/* one layer's saved activations, wherever they live (a slot's stack or the recompute scratch) */
typedef struct {
    float *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *lse, *residual2, *ln2, *ln2_mean, *ln2_rstd, *fch, *residual3;
} mt_layer_acts;

typedef struct {
    float *loss_acc;  // (64) a double: the step's sum of micro-batch mean losses (last stage), where
                      //      the losses are (mt_loss_mean_add); 256 bytes, so that every tensor after it
                      //      keeps the 256-byte alignment of the buffer's start, which the
                      //      GEMMs that read and write them are fastest with
    // T_sp = T/TP with --sequence-parallel (my positions of the residual stream), else T
    float *out_c;     // (B,T_sp,C)  output of a row-parallel layer, after its all-reduce / reduce-scatter
    float *dresidual; // (B,T_sp,C)  gradient flowing down the residual stream
    float *p2p_held;  // (B,T_sp,C)  PP > 1: a gradient being sent while the next one arrives in
                      //             dresidual (section 8's mt__p2p_go)
    float *dln;       // (B,T_sp,C)
    float *dqkv;      // (B,T,3*C_tp), in mt_dqkv_storage_dtype (16 bits in half the floats)
    float *datty;     // (B,T,C_tp)
    float *dfch;      // (B,T,F_tp), in mt_fch_storage_dtype (16 bits in half the floats, as fch)
    float *ce_max;    // (B,T)  cross-entropy all-reduced values
    float *ce_sum;    // (B,T)
    float *ce_target; // (B,T)
    // sequence parallel only (section 4; NULL without it):
    float *sp_full;   // (B,T,C)  a gathered sequence: a column-parallel input, a row-parallel output grad
    float *sp_partial;// (B,T,C)  this rank's partial sums before a reduce-scatter
    float *sp_work;   // (TP,B,T/TP,C) the shards in the order collectives lay them out (B > 1 only)
    float *memory;    // the one buffer the pointers above are carved from
} mt_scratch;

// The rank's state, one struct per owner (llama2.c's Config / TransformerWeights / RunState):
//   cfg, ps       the configuration and my place in the grid                  (§1, §2)
//   groups        my communicators                                            (§2)
//   dev           my device and the compute choices made for it (the seam)   (§3)
//   dims          my local sizes                                              (§5)
//   model         parameters and gradients: one buffer each, the same carve   (§5)
//   acts          the saved activations of the micro-batches in flight        (§5)
//   scratch       per-layer working buffers, reused by every layer            (§5)
//   host          host-side staging of token ids, losses, pipeline messages   (§5)
//   optim         AdamW's moments and step count                              (§6)
//   state         the iteration in progress                                   (§8)
// Each is allocated and freed in pairs by the section that owns it; mt_rank_init (§8) calls them.
typedef struct {
    int B, T, C;                // micro-batch, sequence length, hidden size
    int T_sp, t_offset;         // the residual stream's positions on this rank: [t_offset, t_offset + T_sp) of
                                // each sample; T/TP and tp_rank*T/TP with --sequence-parallel, else T and 0
    int NH_tp, C_tp, F_tp;      // my heads, my share of C (NH_tp * hs), my share of the MLP's F
    int Vp_tp, vocab_start;     // my vocabulary rows [vocab_start, vocab_start + Vp_tp)
    int L_local;                // layers on this pipeline rank (all its chunks)
    int layers_per_chunk;       // L_local / vp
} mt_dims;

typedef struct {
    mt_param_spec specs[MT_NUM_PARAM_TENSORS];   // the carve table: name, shape, offset, split, flags
    size_t num_params;          // floats on this rank
    size_t buffer_floats;       // num_params, padded to a multiple of 64 x DP with the distributed optimizer
    float *params_memory;       // (buffer_floats) parameters, carved into `params`
    float *grads_memory;        // (num_params) gradients, carved alike into `grads`
    mt_params params, grads;
    int initialised;            // 0: left at zero for the checkpoint this run loads (mt_model_init)
} mt_model;

typedef struct {
    int num_slots;              // micro-batches whose activations are alive at once on this stage
    mt_activations *slots;      // (num_slots)
    float *memory;              // (num_slots * per-slot floats) every slot's floats
    int *ids_memory;            // (num_slots, 2, B, T) every slot's tokens and targets
    // activation recompute (section 5): where layer l's tensor of kind k lives:
    // where[l * MT_LT_COUNT + k] >= 0: that index of the slot's stack; < 0: index -1-where of the
    // recompute scratch, shared by all slots (a recomputed layer's tensors are rebuilt there
    // from its group's saved input right before its backward)
    int *where;                 // (L_local, MT_LT_COUNT)
    mt_activations recompute;   // the scratch: per-layer stacks of one recompute group (no ids, no head)
    float *recompute_memory;
} mt_activation_slots;

typedef struct {
    int *tokens, *targets;      // (B,T) a micro-batch's ids as the data loader made them
} mt_host_staging;

void mt_dims_init(mt_dims *d, const mt_config *cfg, const mt_parallel_state *ps);
void mt_model_init(mt_rank *r);          /* carves, initialises (Megatron's init) and uploads the parameters */
void mt_model_free(mt_rank *r);
void mt_activations_init(mt_rank *r, int num_slots);
void mt_activations_free(mt_rank *r);
/* the global layer index of local layer l (0..L_local-1) on this rank */
int mt_local_to_global_layer(const mt_rank *r, int l);
/* where sample b of this rank's micro-batch mb sits in the global batch (Megatron's sampler:
   each micro-batch step takes B x DP consecutive samples, DP rank d the d-th B of them):
   mb * B * DP + dp_rank * B + b */
int64_t mt_sample_in_batch(const mt_rank *r, int mb, int b);
/* copies this rank's shard of tensor s, found at s->offset in local_buffer (a host buffer
   carved like the parameters: parameters, gradients or AdamW moments), into (dir=0) / out of
   (dir=1) the full, unsharded tensor: (L, grows, gcols) for a per-layer tensor with L = all
   layers of the model, else (grows, gcols). */
void mt_shard_copy(const mt_rank *r, const mt_param_spec *s, float *local_buffer, float *global_tensor, int dir);

/* ============================================================================================= */
/* 6. OPTIMIZER, CLIPPING, LEARNING RATE
 * defines: loss scaling (mt_grad_scaler), mt_optimizer (AdamW's state, on the device or offloaded to
 *          the host), the global gradient norm and clipping, the AdamW step over the parameter
 *          table, Megatron's learning-rate schedule */
/* loss scaling (--fp16): Megatron's ConstantGradScaler and DynamicGradScaler (grad_scaler.py) */
typedef enum {
    MT_SCALER_NONE = 0,         // fp32, bf16: the loss is not scaled
    MT_SCALER_CONSTANT,         // --fp16 --loss-scale S: always S
    MT_SCALER_DYNAMIC           // --fp16: from --initial-loss-scale, halved on inf/nan, doubled when clean
} mt_scaler_kind;
typedef struct {
    mt_scaler_kind kind;
    float scale;                // the loss is multiplied by it before the backward (1 with NONE)
    int growth_tracker;         // DYNAMIC: clean steps since the last inf/nan or growth
    int hysteresis_tracker;     // DYNAMIC: inf/nan steps left before the scale halves (goes <= 0)
    float min_scale;            // --min-loss-scale
    int growth_interval;        // --loss-scale-window
    int hysteresis;             // --hysteresis
} mt_grad_scaler;
void mt_grad_scaler_init(mt_grad_scaler *s, const mt_config *cfg);
/* after a step's check: found_inf = 1 if the gradients held inf or NaN (the step was skipped) */
void mt_grad_scaler_update(mt_grad_scaler *s, int found_inf);

typedef struct {
    float *m_memory, *v_memory; // (shard_size) AdamW's first and second moments of this rank's shard: device
                                // memory, or pinned host memory with --optimizer-cpu-offload
    int step;                   // optimizer steps taken (AdamW's bias correction)
    int skipped;                // iterations whose step was skipped: the learning rate does not advance
    double num_zeros;           // --log-num-zeros-in-grad: the last step's zero gradients (NaN: skipped)
    mt_grad_scaler scaler;      // loss scaling (--fp16)
    int distributed;            // --use-distributed-optimizer: this DP rank owns one shard (ZeRO-1)
    size_t shard_start;         // the shard: parameters [shard_start, shard_start + shard_size) of the
    size_t shard_size;          // buffer (all of it without the distributed optimizer)
    // --optimizer-cpu-offload (ZeRO-Offload): the shard's state and update on the host
    int offload;                // 1: m_memory, v_memory and the two below are pinned host memory
    float *master_params;       // (shard_size) the fp32 master copy of my shard's parameters
    float *host_grads;          // (shard_size) my shard's gradients, copied down once per step
    void *host_threads;         // the host threads that share the update (section 6, private)
    int num_host_threads;       // how many, the rank's own thread included
} mt_optimizer;
void mt_optimizer_init(mt_rank *r);
void mt_optimizer_free(mt_rank *r);
/* unscale and check (fp16), norm, clip, AdamW; returns the norm before clipping (NaN when fp16's
   check found inf/nan), *skipped = 1 if the gradients held inf or NaN (the parameters did not move) */
double mt_optimizer_step(mt_rank *r, int iteration, int *skipped);
/* learning rate at `iteration` (0-based steps taken), as Megatron's OptimizerParamScheduler */
float mt_learning_rate(const mt_config *cfg, int iteration);
/* the parameters' L2 norm, each counted once (--log-params-norm, Megatron's calc_params_l2_norm):
   a collective over the model-parallel group, every rank of it calls it */
double mt_params_norm(mt_rank *r);

/* ============================================================================================= */
/* 7. DATA PARALLEL
 * defines: the bucketed gradient all-reduce over DP (after the backward, or overlapped with it:
 *          --overlap-grad-reduce) and the tied-embedding all-reduce */
void mt_finish_grad_sync(mt_rank *r);   /* after the last micro-batch's backward */
/* --overlap-grad-reduce: the layers' gradients cut into buckets of whole layers (at least
   --ddp-bucket-size elements, never across a model chunk); a bucket is all-reduced over DP,
   started (mt_all_reduce_start), as soon as the last micro-batch's backward has finished its
   lowest layer; mt_finish_grad_sync waits for them and reduces the rest */
typedef struct {
    int on;                                 // overlap (the flag, with DP > 1)
    int *closes;                            // (L_local) -1, or: this layer is the lowest of the bucket
                                            // whose top layer this holds (its backward comes last)
    int overlapped[MT_NUM_PARAM_TENSORS];   // 1: the tensor's layers go in the buckets; 0: at the finish
} mt_grad_buckets;
void mt_grad_buckets_init(mt_rank *r);   /* after the model's carve; nothing to do without the flag */
void mt_grad_buckets_free(mt_rank *r);
/* after local layer l's backward of micro-batch mb: starts the bucket l closes, on the last one */
void mt_grad_bucket_ready(mt_rank *r, int l, int mb);

/* ============================================================================================= */
/* 8. PIPELINE SCHEDULES & TRAIN STEP
 * defines: the schedules as lists of steps, their simulation and drawing, the
 *          rank (struct mt_rank, mt_rank_init), the train and eval steps */
typedef enum { MT_STEP_FORWARD = 0, MT_STEP_BACKWARD = 1 } mt_step_kind;
typedef struct { mt_step_kind kind; int mb; int chunk; } mt_sched_step;   /* F(mb, chunk) or B(mb, chunk) */
/* each writes one stage's steps into out (room for 2 * m * vp) and returns how many */
int mt_schedule_no_pipelining(int m, mt_sched_step *out);
int mt_schedule_afab(int m, mt_sched_step *out);
int mt_schedule_1f1b(int m, int pp_size, int pp_rank, mt_sched_step *out);
int mt_schedule_1f1b_interleaved(int m, int pp_size, int pp_rank, int vp, mt_sched_step *out);
int mt_schedule_forward_only(int m, int vp, mt_sched_step *out);
int mt_schedule_for(const mt_config *cfg, int pp_rank, mt_sched_step *out);   /* Megatron's choice */
/* the time line of every stage (F costs f_cost slots, B b_cost): start_out[stage][i]; returns
   the makespan, -1 if the lists deadlock */
int mt_schedule_simulate(const mt_config *cfg, int f_cost, int b_cost, int **start_out, int *count_out);
void mt_print_schedule(const mt_config *cfg, FILE *f);
int mt_schedule_max_alive(const mt_config *cfg, int pp_rank);   /* micro-batches alive at once */

/* fills tokens (B,T) and targets (B,T) of micro-batch `mb` of the current iteration for this rank */
typedef void (*mt_batch_fn)(mt_rank *r, void *ctx, int iteration, int mb, int *tokens, int *targets);

typedef struct {
    float loss;            // mean lm loss of the global batch
    float grad_norm;       // before clipping
    double num_zeros;      // --log-num-zeros-in-grad: zero gradients (NaN: not counted, or skipped)
    float lr;
    int skipped;           // 1 if the step was skipped (inf/nan gradients)
    int overflow;          // 1 if skipped and fp16's dynamic scaling answers it (the scale was above its
                           // minimum): expected while the scale settles, not a sign of divergence
    float loss_scale;      // after this step's update (Megatron logs that one); 1 without fp16 scaling
    double idle_seconds;   // time in this rank's pipeline messages, waiting for the peer included (the
                           // host's on the CPU build, NCCL's on the GPU: see mt__p2p_seconds)
    double forward_backward_seconds, grads_sync_seconds, optimizer_seconds;   // Megatron's timers of the step
} mt_step_result;

typedef struct {
    int iteration;              // current iteration (1-based during a step)
    int training;               // 1 in a training step (dropout on, gradients), 0 in eval
    float loss_scale;           // the loss is multiplied by it before the backward (fp16, section 6)
    int decoding;               // 1 while the KV-cache generator runs its layers (section 11): the
                                // tensors are (B, new tokens, C), whole on every TP rank, so the
                                // layers run without sequence parallelism (as Megatron's inference)
} mt_step_state;

/* the training step's chunks recorded as CUDA graphs (GPU build; section 8's mt__run_chunk): one
   entry per distinct piece of work (activation slot, chunk, forward or backward, training or
   evaluation, loss scale), its graph made the second time that work is queued, then replayed */
typedef struct {
    const void *slot;           // the activation slot: its buffers are the work's inputs and outputs
    int chunk, backward, training;
    float loss_scale;           // fp16: the head's gradient starts from it, a kernel argument
    int runs;                   // times this work was queued (recorded at the second: runs == 1)
    void *graph;                // NULL: not recorded yet, or nothing was (the CPU build, MT_CUDA_GRAPH=0)
} mt_chunk_graph;
enum { MT_CHUNK_GRAPHS = 16 };  // entries; past that, the work runs as queued
typedef struct {
    mt_chunk_graph entry[MT_CHUNK_GRAPHS];
    int count;
} mt_step_graphs;

typedef struct {                // bytes of this rank's memory, per kind (printed at start)
    size_t params, grads, optimizer, activations, scratch;   // the buffers allocated once (scratch: "workspace")
    size_t kernel_scratch;      // the most the GPU's launchers borrow at once during a step (0 on the CPU build)
    size_t weights16;           // the parameters' 16-bit copy the GEMMs read (mt_device_weights16; 0 on the CPU build)
    size_t comm;                // the communicators' own buffers (NCCL's, estimated; 0 on the CPU build)
    size_t host_optimizer;      // --optimizer-cpu-offload: pinned host memory (master copy, m, v, gradients
                                // of the shard), in place of `optimizer`; not part of the device's total
} mt_memory_report;

struct mt_rank {
    const mt_config *cfg;
    mt_parallel_state ps;
    mt_groups groups;
    mt_device dev;
    mt_dims dims;
    mt_model model;
    mt_activation_slots acts;
    mt_scratch scratch;
    mt_host_staging host;
    mt_optimizer optim;
    mt_grad_buckets buckets;    // --overlap-grad-reduce (section 7)
    mt_step_state state;
    mt_step_graphs graphs;      // the step's chunks as CUDA graphs (section 8)
    mt_memory_report memory;
    mt_span_log *timeline;      // §1's span recorder for --timeline (NULL: off); mt_rank_set_timeline
};

void mt_rank_init(mt_rank *r, const mt_config *cfg, mt_world *w, int rank);
void mt_rank_free(mt_rank *r);
/* what mt_rank_init will allocate on `rank` (bytes per buffer), computed without allocating */
void mt_memory_plan(const mt_config *cfg, int rank, mt_memory_report *out);
size_t mt_memory_total(const mt_memory_report *m);   /* every term: what the rank holds at its peak */
void mt_print_memory_plan(const mt_config *cfg, FILE *f);   /* --dry-run: every rank's plan */
/* --optimizer-cpu-offload: fails at start-up, with the sizes, when the pinned host memory the
   ranks on this node would take (nranks of this process from first_rank, times procs_on_node
   processes like it) exceeds the host's available memory; does nothing without offload or where
   /proc/meminfo cannot be read */
void mt_check_host_memory(const mt_config *cfg, int first_rank, int nranks, int procs_on_node);
/* records this rank's work (forward / backward per micro-batch and chunk, optimizer) and every call
   on its groups into log while log->enabled; NULL detaches */
void mt_rank_set_timeline(mt_rank *r, mt_span_log *log);
/* one training iteration: all micro-batches forward and backward (per the schedule), grad sync, clip, AdamW */
mt_step_result mt_train_step(mt_rank *r, mt_batch_fn batch, void *ctx, int iteration);
/* mean loss over `num_microbatches` micro-batches, forward only (returned on every rank) */
float mt_eval_step(mt_rank *r, mt_batch_fn batch, void *ctx, int iteration);

/* ============================================================================================= */
/* 9. DATA & TOKENIZER
 * defines: Megatron's indexed dataset (reader, builder), GPT samples, splits and
 *          blending (mt_data), the GPT-2 byte-level BPE tokenizer */
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
// TOKENIZER: GPT-2's byte-level BPE
// ---------------------------------------------------------------------------------------------
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

/* ============================================================================================= */
/* 10. CHECKPOINTS
 * defines: save and load in Megatron's layout (safetensors files), convert between
 *          layouts, export Hugging Face GPT-2 and import it */
/* SAVE/iter_0000100/mp_rank_TT[_PPP]/model_optim_rng.safetensors, and SAVE/latest_checkpointed_iteration.txt.
   Every rank calls it (collective over the world); DP rank 0 of each (TP, PP) position writes. */
void mt_checkpoint_save(mt_rank *r, const char *dir, int iteration, int64_t valid_consumed);
/* loads the latest checkpoint of dir into this rank; returns its iteration, or 0 (with a note)
   when dir has no latest_checkpointed_iteration.txt, as Megatron starts from scratch then. With
   --finetune or --no-load-optim (cfg->train) only the parameters: AdamW's moments stay zero, its
   step and the loss scale start again (and --finetune counts no validation samples consumed) */
int mt_checkpoint_load(mt_rank *r, const char *dir, int64_t *valid_consumed);
/* whether this run will load a checkpoint: --load names a directory with one (or --ckpt-step
   names one). The parameters then come from it whole, so their random initialisation is skipped */
int mt_checkpoint_found(const mt_config *cfg);
/* --load ROOT/iter_0001000 (an iteration directory, as the tutorial writes it) becomes --load ROOT
   --ckpt-step 1000, with a note; any other --load is left alone */
void mt_checkpoint_resolve_load(mt_config *cfg);
/* rewrites the latest checkpoint of src (any TP x PP) for another layout into dst (parameters and
   AdamW state; then --load dst trains on in the new layout); returns its iteration */
int mt_checkpoint_convert(const char *src, const char *dst, int tp, int pp, int layers_per_virtual);
/* writes the latest checkpoint of src as Hugging Face GPT-2: out_dir/model.safetensors, config.json */
int mt_checkpoint_export_hf(const char *src, const char *out_dir);
/* reads a Hugging Face GPT-2 directory (config.json, model.safetensors) and writes it as our checkpoint
   (iteration 1, AdamW's moments 0) for TP x PP (and virtual stages) into dst; returns 1 */
int mt_checkpoint_import_hf(const char *hf_dir, const char *dst, int tp, int pp, int layers_per_virtual);
/* before writing checkpoints into dir: dir is never src (compared as files, however spelled;
   same_ok: it may be, for a run that resumes in place), never a directory that holds another
   run's checkpoints unless overwrite (--overwrite); stale temporaries there are removed */
void mt_checkpoint_claim_dir(const char *dir, const char *src, int same_ok, int overwrite);
/* a 64-bit checksum of n bytes, stored per tensor in the metadata ("checksum.NAME") and checked
   on load: any change confined to one 8-byte word is always detected, others but for 2^-64 */
uint64_t mt_checksum64(const void *data, size_t n);
/* the file of one (tp, pp) position; out needs MT_PATH_MAX + 64 bytes */
void mt_checkpoint_path(char *out, size_t cap, const char *dir, int iteration, int tp_rank, int pp_rank, int pp_size);

/* ============================================================================================= */
/* 11. GENERATION
 * defines: sampling (mt_sampling, mt_sample_token: greedy, temperature, top-k, top-p), the
 *          uncached reference (mt_generate_uncached), the KV cache (mt_generator) and batched
 *          decoding with it (mt_generate_batch), collective over the TP x PP ranks of one replica */
typedef struct {
    float temperature;   // --temperature; 0 (or --greedy) takes the most likely token
    int top_k;           // --top-k: only the k most likely tokens (0 = all)
    float top_p;         // --top-p: only the most likely tokens whose probability reaches p (0 = all)
    uint64_t seed;       // --seed: token `position` of sequence `sequence` draws uniform(seed, position, sequence)
} mt_sampling;
/* the draw of token `position` of sequence `sequence` (section 3's mt_draw) */
mt_draw mt_sampling_draw(const mt_sampling *s, uint64_t sequence, uint64_t position);
/* the next token from logits[0..V): mt_sample_row_cpu with that draw */
int mt_sample_token(const float *logits, int V, const mt_sampling *s, uint64_t sequence, uint64_t position);
/* the naive way (the tests' reference): continues ids[0..n) (capacity cap) by `count` tokens with the
   training forward over the whole window (the last T tokens) for every token; logits_out (count, V) or
   NULL receives the logits each token was sampled from (last stage). Returns the new length. */
int mt_generate_uncached(mt_rank *r, int32_t *ids, int n, int cap, int count, const mt_sampling *s, uint64_t sequence,
                         float *logits_out);

/* the KV cache and the decoding buffers of one rank: its layers, its heads, its vocabulary slice */
typedef struct {
    int max_batch;        // sequences decoded together (B)
    int max_tokens;       // B x Tq the work buffers hold (the prefill's B x longest prompt)
    int cap;              // positions in the cache per sequence (<= --max-position-embeddings)
    float *kcache, *vcache;                    // (L_local, max_batch, cap, C_tp) each
    float *x, *res2, *ln, *ln_mean, *ln_rstd;  // (B,Tq,C), (B,Tq,C), (B,Tq,C), (B,Tq), (B,Tq)
    float *qkv, *atty, *fch, *fch_gelu, *out_c;// (B,Tq,3*C_tp), (B,Tq,C_tp), (B,Tq,F_tp) x2, (B,Tq,C)
    float *last, *lnf, *lnf_mean, *lnf_rstd;   // (B,C) each sequence's last token, its ln_f (last stage)
    float *logits, *gathered, *whole;          // (B,Vp_tp) mine; (TP,B,Vp_tp) every TP rank's; (B,Vp) those re-laid
                                               // as whole rows, for the device's pick at TP > 1 (last stage)
    float *memory;                             // the buffer all of the above are carved from
    int *ids, *tokens, *positions, *start;     // (B*Tq) tokens, (B*Tq) their positions, (B) first positions
    mt_draw *draws;                            // (B) each row's draw (MT_PICK_SAMPLE), uploaded with the ids
    int *host_ids;                             // host staging of ids (and of the draws)
    mt_draw *host_draws;                       // (B) in host_ids: set by the caller before each forward
    void *sample_work;                         // mt_sample_rows' device work (last stage)
    float *host_msg;                           // (B,Tq,C) pipeline messages through the host
    float *host_logits, *host_gathered;        // (B,Vp) the whole rows, on the host (last stage)
    size_t bytes, cache_bytes;                 // device bytes allocated; of which the KV cache
    int pick;                                  // set by the caller: who picks the next tokens (mt_pick).
                                               // On the device: host_next, host_logits not filled
    int *next, *host_next;                     // (B) each row's picked token: on the device, on the host
    int *step;                                 // (1, device) the decode steps queued ahead: the next one's number
    mt_draw *plan, *host_plan;                 // (cap, B) their draws, step k's at k*B + b (device; host staging)
    int *ring;                                 // (MT_GEN_RING, B) host memory each queued step leaves its tokens in
    void **graphs;                             // (3 x max_batch) the decode step of b+1 sequences (each mt_pick)
                                               // as a CUDA graph (GPU build, TP = PP = 1), made at first use
    mt_rank *rank;                             // whose device holds the decoding copy of the weights
} mt_generator;
/* who picks the next tokens from the logits: the host (the logits cross to it: the caller wants
   them), or the device: the argmax (greedy), or a draw (mt_sample_rows, g->draws); at TP > 1 every
   TP rank picks alike from the gathered rows */
typedef enum { MT_PICK_HOST = 0, MT_PICK_ARGMAX = 1, MT_PICK_SAMPLE = 2 } mt_pick;
#define MT_GEN_RING 4   /* slots of g->ring: decode step k's tokens in slot k % MT_GEN_RING */
void mt_generator_init(mt_rank *r, mt_generator *g, int max_batch, int max_tokens, int cap);
void mt_generator_free(mt_generator *g);
/* Tq new tokens (B,Tq) of each sequence at positions start[b] .. start[b]+Tq-1: through the layers,
   extending the cache; on the last stage, g->host_logits (B,Vp) holds the logits of token last[b] */
void mt_generator_forward(mt_rank *r, mt_generator *g, const int32_t *tokens, const int *start, const int *last, int B,
                          int Tq);
typedef struct {
    // in
    int n;                          // sequences (at most the generator's max_batch)
    const int32_t *const *prompts;  // (n) prompts[i][0 .. prompt_lens[i]), at least one token each
    const int *prompt_lens;
    int max_new_tokens;             // --out-seq-length
    mt_sampling sampling;
    int64_t first_sequence;         // sequence i draws its random numbers as sequence first_sequence + i
    int eod;                        // a sequence ends after this token (-1: never)
    float *logits;                  // NULL, or (n, max_new_tokens, V): what each token was sampled from (last stage)
    double *step_seconds;           // NULL, or (max_new_tokens): each decode step's time
    // out, on every rank
    int32_t *tokens;                // (n, max_new_tokens) the generated ids
    int *counts;                    // (n) how many each sequence got
    int stopped_at_max_positions;   // sequences cut short by --max-position-embeddings
    double prefill_seconds;         // prompts in, first tokens sampled: the time to first token
    int steps;                      // decode steps run (step_seconds[0 .. steps))
} mt_generate_request;
/* prefill and decode one batch of prompts of any lengths; collective over the replica's ranks */
void mt_generate_batch(mt_rank *r, mt_generator *g, mt_generate_request *q);

/* ============================================================================================= */
/* 12. TRAINING LOOP
 * defines: mt_pretrain (Megatron's pretrain(): the tokenizer, the ranks as threads,
 *          train, evaluate, save, log), the model's parameter count and FLOPs per token,
 *          the TensorBoard writer, the timeline (Chrome trace and SVG) */
/* number of parameters of the whole model (padded vocabulary, tied embedding counted once) */
size_t mt_model_num_parameters(const mt_config *cfg);
/* model FLOPs per token, Megatron's convention: 6N + 12 L C T */
double mt_flops_per_token(const mt_config *cfg);
/* runs the whole job: loads the tokenizer (the vocabulary size), derives the config, then the
   checkpoint tools or the ranks as threads: training, validation, test; returns the exit code */
int mt_pretrain(mt_config *cfg);

/* TensorBoard: an event file that TensorBoard reads (SummaryWriter's format, section 1's records) */
typedef struct {
    FILE *f;                    // NULL: not open (every call is then a no-op)
    char path[MT_PATH_MAX + 160];
    int pending, queue_size;    // events since the last flush; flush when pending reaches queue_size
} mt_tb_writer;
/* creates dir and DIR/events.out.tfevents.<time>.<host>.<pid>.<rank>, writes the file_version event */
void mt_tb_open(mt_tb_writer *w, const char *dir, int rank, int queue_size);
void mt_tb_scalar(mt_tb_writer *w, const char *tag, float value, int64_t step);   /* add_scalar */
void mt_tb_flush(mt_tb_writer *w);   /* to the disk: fflush and fsync, every complete record readable */
void mt_tb_close(mt_tb_writer *w);
/* the timeline: every rank's spans (logs[rank], section 1) as a Chrome trace (Perfetto opens it) and
   as an SVG picture (a lane per rank); returns 0 and warns if there is nothing to draw */
int mt_timeline_write_json(const char *path, const mt_config *cfg, const mt_span_log *logs, int world_size);
int mt_timeline_write_svg(const char *path, const mt_config *cfg, const mt_span_log *logs, int world_size);

/* ==================================== end of interface ==================================== */
#endif /* MEGATRON_H */

#ifdef MEGATRON_IMPLEMENTATION
#ifndef MEGATRON_IMPLEMENTATION_DONE
#define MEGATRON_IMPLEMENTATION_DONE
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <dirent.h>
#include <signal.h>
#include <sys/resource.h>
#include <poll.h>              /* section 2's TCP channel between processes */
#include <netdb.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

// =============================================================================================
// 1. UTILITIES, ERRORS & CONFIG
// =============================================================================================
// The pieces every later section uses: one exit for every error (mt_fatal: "error: cause",
// "hint: fix"; set one breakpoint there and you catch them all), allocation that never returns
// NULL, files written to a temporary name, fsync'd and renamed; the configuration with
// Megatron's flag names (megatron/training/arguments.py) and the JSON config file; the
// counter-based random numbers that make every layout initialise and drop out alike.
static void mt__abort_world_from_rank(const char *msg);   /* §2: returns only if not in a rank thread */

#ifdef MT_FATAL_JMP
MT_THREAD_LOCAL jmp_buf *mt_fatal_jmp = NULL;
#endif

void mt_fatal(const char *fmt, ...) {
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
#ifdef MT_FATAL_JMP
    if (mt_fatal_jmp) longjmp(*mt_fatal_jmp, 1);
#endif
    mt__abort_world_from_rank(msg);   /* in a rank thread of a multi-rank world: does not return */
    mt_atomic_cleanup();              /* no temporary outlives the error */
    fflush(stdout);
    fprintf(stderr, "error: %s\n", msg);
    exit(1);
}

void *mt_malloc(size_t bytes, const char *what) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) mt_fatal("out of memory allocating %zu bytes for %s\nhint: use a smaller model, batch or sequence length",
                     bytes, what);
    return p;
}

void *mt_calloc(size_t count, size_t size, const char *what) {
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p) mt_fatal("out of memory allocating %zu bytes for %s\nhint: use a smaller model, batch or sequence length",
                     count * size, what);
    return p;
}

void *mt_realloc(void *p, size_t bytes, const char *what) {
    void *q = realloc(p, bytes ? bytes : 1);
    if (!q) mt_fatal("out of memory allocating %zu bytes for %s\nhint: use a smaller model, batch or sequence length",
                     bytes, what);
    return q;
}

char *mt_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = (char *)mt_malloc(n, "string");
    memcpy(d, s, n);
    return d;
}

// What a rank thread owns while it may be ended. A rank whose world aborts ends in pthread_exit
// (section 2) from deep inside a call, so the frees after that call never run. Memory it must
// not lose is registered here with its free function (mt__own) and unregistered when freed
// normally (mt__disown); the thread's exit runs what is left (mt__free_owned). Per thread.
typedef struct { void (*fn)(void *); void *p; } mt__owned;
#define MT__MAX_OWNED 64
static MT_THREAD_LOCAL mt__owned mt__owned_list[MT__MAX_OWNED];
static MT_THREAD_LOCAL int mt__owned_count = 0;

static void mt__own(void (*fn)(void *), void *p) {
    if (mt__owned_count == MT__MAX_OWNED) return;   // full: this one is not freed after an abort (a leak, no harm)
    mt__owned_list[mt__owned_count].fn = fn;
    mt__owned_list[mt__owned_count++].p = p;
}

static void mt__disown(void *p) {   // the latest entry for p goes (without running it)
    for (int i = mt__owned_count - 1; i >= 0; i--)
        if (mt__owned_list[i].p == p) {
            for (int k = i; k + 1 < mt__owned_count; k++) mt__owned_list[k] = mt__owned_list[k + 1];
            mt__owned_count--;
            return;
        }
}

static void mt__free_owned(void *unused) {   // newest first, as a stack unwinds
    (void)unused;
    while (mt__owned_count > 0) { mt__owned *o = &mt__owned_list[--mt__owned_count]; o->fn(o->p); }
}

double mt_time_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// Temporaries in flight. Every error path must remove them (a checkpoint's is up to hundreds of
// MB), and an error can come from anywhere (out of memory, another rank's mt_fatal), so the
// open ones are listed here, process-wide (the one exception to "nothing global": like atexit,
// it belongs to the process, not to a rank), and mt_atomic_cleanup removes them all; mt_fatal
// and an aborted world call it. A kill leaves them behind: the next run removes those
// (mt_remove_stale_temporaries).
#define MT__MAX_TEMPORARIES 256
static pthread_mutex_t mt__temp_mu = PTHREAD_MUTEX_INITIALIZER;
static char *mt__temps[MT__MAX_TEMPORARIES];

static void mt__temp_track(const char *tmp, int add) {
    pthread_mutex_lock(&mt__temp_mu);
    for (int i = 0; i < MT__MAX_TEMPORARIES; i++) {
        if (add && !mt__temps[i]) { mt__temps[i] = strdup(tmp); break; }
        if (!add && mt__temps[i] && strcmp(mt__temps[i], tmp) == 0) { free(mt__temps[i]); mt__temps[i] = NULL; break; }
    }
    pthread_mutex_unlock(&mt__temp_mu);
}

void mt_atomic_cleanup(void) {
    pthread_mutex_lock(&mt__temp_mu);
    for (int i = 0; i < MT__MAX_TEMPORARIES; i++)
        if (mt__temps[i]) { remove(mt__temps[i]); free(mt__temps[i]); mt__temps[i] = NULL; }
    pthread_mutex_unlock(&mt__temp_mu);
}

FILE *mt_atomic_open(const char *path, char *tmp, size_t cap) {
    int n = snprintf(tmp, cap, "%s.tmp.%ld", path, (long)getpid());
    if (n < 0 || (size_t)n >= cap) mt_fatal("the path %s is too long\nhint: use a shorter directory", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) mt_fatal("cannot create %s: %s\nhint: check that the directory exists and is writable", tmp,
                     strerror(errno));
    mt__temp_track(tmp, 1);
    return f;
}

void mt_atomic_commit(FILE *f, const char *tmp, const char *path) {
    int bad = fflush(f) != 0 || ferror(f);
    if (!bad && fsync(fileno(f)) != 0) bad = 1;
    if (fclose(f) != 0) bad = 1;
    if (bad) {
        int err = errno;
        remove(tmp);
        mt__temp_track(tmp, 0);
        mt_fatal("writing %s failed: %s\nhint: %s", path, strerror(err),
                 err == EFBIG ? "a file-size limit (ulimit -f) stopped the write: raise it"
                              : "check free disk space (df -h on the output directory)");
    }
    if (rename(tmp, path) != 0) {
        int err = errno;
        remove(tmp);
        mt__temp_track(tmp, 0);
        mt_fatal("cannot rename %s to %s: %s", tmp, path, strerror(err));
    }
    mt__temp_track(tmp, 0);
}

void mt_atomic_abort(FILE *f, const char *tmp) {
    if (f) fclose(f);
    remove(tmp);
    mt__temp_track(tmp, 0);
}

// after a kill: FILE.tmp.PID of ours (PID a process that no longer runs) in dir and in its
// subdirectories down to `depth` levels are removed, each with a note on stdout
void mt_remove_stale_temporaries(const char *dir, int depth) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.' && (e->d_name[1] == 0 || (e->d_name[1] == '.' && e->d_name[2] == 0))) continue;
        char path[MT_PATH_MAX + 512];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        struct stat st;
        if (lstat(path, &st) != 0) continue;
        if (S_ISDIR(st.st_mode)) { if (depth > 0) mt_remove_stale_temporaries(path, depth - 1); continue; }
        const char *t = strstr(e->d_name, ".tmp.");
        if (!t || !S_ISREG(st.st_mode)) continue;
        while (strstr(t + 1, ".tmp.")) t = strstr(t + 1, ".tmp.");
        char *end;
        long pid = strtol(t + 5, &end, 10);
        if (*end || end == t + 5 || pid <= 0 || pid == (long)getpid()) continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;   // its writer may still run: leave it
        if (remove(path) == 0) printf("removed %s, a temporary left by an interrupted run (process %ld)\n", path, pid);
    }
    closedir(d);
}

// an output's directory and every one above it, like mkdir -p; flag names the option that asked
// (--save, --tensorboard-dir, --export-hf, --timeline, ...) for the message
static void mt__mkdir_p(const char *dir, const char *flag) {
    char buf[MT_PATH_MAX + 160];
    if (snprintf(buf, sizeof buf, "%s", dir) >= (int)sizeof buf) mt_fatal("%s %s: the path is too long", flag, dir);
    for (char *p = buf + 1; ; p++) {
        if (*p == '/' || *p == 0) {
            char saved = *p;
            *p = 0;
            if (mkdir(buf, 0777) != 0 && errno != EEXIST)
                mt_fatal("cannot create the directory %s for %s: %s\nhint: pick a directory you can write", buf,
                         flag, strerror(errno));
            *p = saved;
            if (!saved) break;
        }
    }
}

// an output file that is written at the end of a run (--timeline, --timeline-svg,
// --sample-output-file): its directory is made now, as --save, --tensorboard-dir and --export-hf
// make theirs, and a trial temporary is created there and removed, so a path that cannot be
// written fails at start-up in one line, not after the work whose record it was to hold.
// The file itself is still written at the end (mt_atomic_open: temporary, fsync, rename).
static void mt__claim_output_file(const char *path, const char *flag) {
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        mt_fatal("%s %s is a directory\nhint: give the path of a file (in that directory, say)", flag, path);
    char dir[MT_PATH_MAX + 64], tmp[MT_PATH_MAX + 64];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash && slash != dir) { *slash = 0; mt__mkdir_p(dir, flag); }
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof tmp)
        mt_fatal("%s %s: the path is too long\nhint: use a shorter directory", flag, path);
    FILE *f = fopen(tmp, "wb");
    if (!f) mt_fatal("%s %s cannot be written: cannot create %s: %s\nhint: pick a directory you can write", flag,
                     path, tmp, strerror(errno));
    fclose(f);
    remove(tmp);
}

// ---------------------------------------------------------------------------------------------
// JSON: one reader for every file we parse (config files, vocab.json, safetensors headers,
// preprocess's loose-JSON lines, the tests' cases). Strict as Python's json module, which wrote
// most of these files, plus // and /* */ comments where the caller allows them (config files).
// ---------------------------------------------------------------------------------------------
// A cursor over the text and the first error. The functions never stop the program: they
// record what went wrong where (j->err, j->err_at) and return, so each caller writes the
// message its user needs ("config.json:3: ...", "line 12: ... at column 7").
//   mt_json j;
//   mt_json_init(&j, text, len, 0);
//   if (mt_json_eat(&j, '{') && !mt_json_eat(&j, '}')) do {
//       size_t n; char key[64];
//       mt_json_key(&j, key, sizeof key);        // "name" :
//       ... read the value: mt_json_string_at, mt_json_number, mt_json_skip ...
//   } while (mt_json_eat(&j, ','));             // and then mt_json_expect(&j, '}', ...)
// one UTF-8 character at text[0..n): returns its length 1..4 and sets *cp, or returns 0 if the bytes
// there are not valid UTF-8 (a stray continuation byte, a truncated sequence, an overlong
// encoding, a surrogate, or a value above U+10FFFF)
int mt_utf8_decode(const char *text, size_t n, uint32_t *cp) {
    const unsigned char *s = (const unsigned char *)text;
    unsigned char b = s[0];
    if (b < 0x80) { *cp = b; return 1; }
    int len;
    uint32_t c;
    if (b >= 0xC2 && b <= 0xDF) { len = 2; c = b & 0x1Fu; }       // C0, C1 would be overlong
    else if (b >= 0xE0 && b <= 0xEF) { len = 3; c = b & 0x0Fu; }
    else if (b >= 0xF0 && b <= 0xF4) { len = 4; c = b & 0x07u; }  // F5.. would pass U+10FFFF
    else return 0;
    if ((size_t)len > n) return 0;
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        c = (c << 6) | (s[i] & 0x3Fu);
    }
    if (len == 3 && (c < 0x800 || (c >= 0xD800 && c <= 0xDFFF))) return 0;
    if (len == 4 && (c < 0x10000 || c > 0x10FFFF)) return 0;
    *cp = c;
    return len;
}

static int mt__utf8_encode(uint32_t cp, char *out) {
    if (cp < 0x80) { out[0] = (char)cp; return 1; }
    if (cp < 0x800) { out[0] = (char)(0xC0 | (cp >> 6)); out[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12)); out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18)); out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

// JSON strings: "..." with \" \\ \/ \b \f \n \r \t \uXXXX (and UTF-16 surrogate pairs for
// code points above U+FFFF: "\ud83d\ude00" is U+1F600) -> UTF-8 bytes
static int mt__hex4(const char *p, uint32_t *v) {
    uint32_t x = 0;
    for (int i = 0; i < 4; i++) {
        char ch = p[i];
        int d = ch >= '0' && ch <= '9'   ? ch - '0'
                : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10
                : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10
                                         : -1;
        if (d < 0) return 0;
        x = x * 16 + (uint32_t)d;
    }
    *v = x;
    return 1;
}

const char *mt_json_string(const char **pp, const char *end, char *out, size_t *out_len) {
    const char *p = *pp;
    size_t o = 0;   // out is written strictly behind p, so out may be the input itself
    if (p >= end || *p != '"') return "expected a string";
    p++;
    for (;;) {
        if (p >= end) { *pp = p; return "unterminated string"; }
        unsigned char ch = (unsigned char)*p;
        if (ch == '"') { p++; break; }
        if (ch < 0x20) { *pp = p; return "raw control character in a string (JSON needs \\n, \\t or \\u00XX)"; }
        if (ch >= 0x80) {   // raw UTF-8: check it, copy it
            uint32_t cp;
            int l = mt_utf8_decode(p, (size_t)(end - p), &cp);
            if (l == 0) { *pp = p; return "invalid UTF-8 in a string"; }
            for (int i = 0; i < l; i++) out[o++] = p[i];
            p += l;
            continue;
        }
        if (ch != '\\') { out[o++] = (char)ch; p++; continue; }
        if (end - p < 2) { *pp = p; return "unterminated string"; }
        char e = p[1];
        p += 2;
        switch (e) {
        case '"': out[o++] = '"'; break;
        case '\\': out[o++] = '\\'; break;
        case '/': out[o++] = '/'; break;
        case 'b': out[o++] = '\b'; break;
        case 'f': out[o++] = '\f'; break;
        case 'n': out[o++] = '\n'; break;
        case 'r': out[o++] = '\r'; break;
        case 't': out[o++] = '\t'; break;
        case 'u': {
            uint32_t u;
            if (end - p < 4 || !mt__hex4(p, &u)) { *pp = p - 2; return "bad \\u escape (needs 4 hex digits)"; }
            p += 4;
            if (u >= 0xD800 && u <= 0xDBFF) {   // high surrogate: a low one must follow
                uint32_t lo;
                if (end - p < 6 || p[0] != '\\' || p[1] != 'u' || !mt__hex4(p + 2, &lo) || lo < 0xDC00 || lo > 0xDFFF) {
                    *pp = p - 6;
                    return "lone UTF-16 surrogate \\uD800..\\uDBFF (not encodable as UTF-8)";
                }
                p += 6;
                u = 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00);
            } else if (u >= 0xDC00 && u <= 0xDFFF) {
                *pp = p - 6;
                return "lone UTF-16 surrogate \\uDC00..\\uDFFF (not encodable as UTF-8)";
            }
            o += (size_t)mt__utf8_encode(u, out + o);
            break;
        }
        default: *pp = p - 2; return "invalid escape in a string";
        }
    }
    *pp = p;
    *out_len = o;
    return NULL;
}

void mt_json_init(mt_json *j, const char *text, size_t len, int allow_comments) {
    memset(j, 0, sizeof *j);
    j->start = j->p = text;
    j->end = text + len;
    j->allow_comments = allow_comments;
}

void mt_json_fail(mt_json *j, const char *msg) {
    if (!j->err) { j->err = msg; j->err_at = j->p; }
}

void mt_json_ws(mt_json *j) {
    for (;;) {
        while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\r' || *j->p == '\n')) j->p++;
        if (!j->allow_comments || j->end - j->p < 2 || j->p[0] != '/') return;
        if (j->p[1] == '/') { while (j->p < j->end && *j->p != '\n') j->p++; continue; }
        if (j->p[1] != '*') return;
        const char *q = j->p + 2;
        while (q + 1 < j->end && !(q[0] == '*' && q[1] == '/')) q++;
        if (q + 1 >= j->end) { mt_json_fail(j, "unterminated /* comment"); j->p = j->end; return; }
        j->p = q + 2;
    }
}

int mt_json_eat(mt_json *j, char c) {
    mt_json_ws(j);
    if (j->err || j->p >= j->end || *j->p != c) return 0;
    j->p++;
    return 1;
}

int mt_json_expect(mt_json *j, char c, const char *msg) {
    if (mt_json_eat(j, c)) return 1;
    mt_json_fail(j, msg);
    return 0;
}

// the 1-based line of the error (or of the cursor when there is none)
int mt_json_line(const mt_json *j) {
    const char *at = j->err ? j->err_at : j->p;
    int line = 1;
    for (const char *q = j->start; q < at; q++) line += *q == '\n';
    return line;
}

// checks the string at the cursor as Python's json does and moves past it; 1 if valid. A lone
// UTF-16 surrogate (\ud800 with no \udc00.. after it) is valid JSON to Python but has no UTF-8
// form: *lone is set and the string still counts as valid (a caller that needs its bytes
// rejects it; mt_json_string does).
int mt_json_scan_string(mt_json *j, int *lone) {
    const char *p = j->p, *e = j->end;
    *lone = 0;
    if (p >= e || *p != '"') { mt_json_fail(j, "expected a string"); return 0; }
    for (p++; p < e;) {
        unsigned char c = (unsigned char)*p;
        if (c == '"') { j->p = p + 1; return 1; }
        if (c < 0x20) { j->p = p; mt_json_fail(j,
                                               "raw control character in a string (JSON needs \\n, \\t or "
                                               "\\u00XX)"); return 0; }
        if (c >= 0x80) {
            uint32_t cp;
            int l = mt_utf8_decode(p, (size_t)(e - p), &cp);
            if (!l) { j->p = p; mt_json_fail(j, "invalid UTF-8 in a string"); return 0; }
            p += l;
            continue;
        }
        if (c != '\\') { p++; continue; }
        if (e - p < 2) break;
        char x = p[1];
        if (x == '"' || x == '\\' || x == '/' || x == 'b' || x == 'f' || x == 'n' || x == 'r'
            || x == 't') { p += 2; continue; }
        uint32_t u, lo;
        if (x != 'u' || e - p < 6 || !mt__hex4(p + 2, &u)) { j->p = p; mt_json_fail(j,
                "invalid escape in a string"); return 0; }
        p += 6;
        if (u >= 0xD800 && u <= 0xDBFF && e - p >= 6 && p[0] == '\\' && p[1] == 'u' && mt__hex4(p + 2, &lo) &&
            lo >= 0xDC00 && lo <= 0xDFFF) p += 6;   // a surrogate pair: one code point
        else if (u >= 0xD800 && u <= 0xDFFF) *lone = 1;
    }
    j->p = e;
    mt_json_fail(j, "unterminated string");
    return 0;
}

// decodes the string at the cursor into out (room for its literal's length; out may be the
// text itself: the decoded bytes are never longer). Returns 1, or 0 with the error recorded.
int mt_json_string_at(mt_json *j, char *out, size_t *out_len) {
    mt_json_ws(j);
    if (j->err) return 0;
    const char *p = j->p;
    const char *e = mt_json_string(&p, j->end, out, out_len);
    if (e) { j->p = p; mt_json_fail(j, e); return 0; }
    j->p = p;
    return 1;
}

// "key" :  -> key (NUL-terminated, cut at cap - 1 bytes). Returns 1, or 0 with the error recorded.
int mt_json_key(mt_json *j, char *key, size_t cap) {
    mt_json_ws(j);
    if (j->err) return 0;
    if (j->p >= j->end || *j->p != '"') { mt_json_fail(j, "expected a key string"); return 0; }
    const char *start = j->p;
    int lone;
    if (!mt_json_scan_string(j, &lone)) return 0;
    size_t lit = (size_t)(j->p - start);
    char *tmp = (char *)mt_malloc(lit, "JSON key");
    const char *q = start;
    size_t n = 0;
    const char *e = mt_json_string(&q, j->p, tmp, &n);
    if (e) { free(tmp); j->p = start; mt_json_fail(j, e); return 0; }
    if (n > cap - 1) n = cap - 1;
    memcpy(key, tmp, n);
    key[n] = 0;
    free(tmp);
    return mt_json_expect(j, ':', "expected ':' after a key");
}

// a number as Python's json writes it: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?, plus
// NaN, Infinity and -Infinity (which Python accepts too). Returns 1 and *v, or 0.
int mt_json_number(mt_json *j, double *v) {
    mt_json_ws(j);
    if (j->err) return 0;
    const char *s = j->p, *e = j->end;
    const char *lits[3] = {"NaN", "Infinity", "-Infinity"};
    double vals[3] = {NAN, INFINITY, -INFINITY};
    for (int i = 0; i < 3; i++) {
        size_t n = strlen(lits[i]);
        if ((size_t)(e - s) >= n && memcmp(s, lits[i], n) == 0) { j->p = s + n; *v = vals[i]; return 1; }
    }
    if (s < e && *s == '-') s++;
    if (s < e && *s == '0') s++;
    else if (s < e && *s >= '1' && *s <= '9') while (s < e && *s >= '0' && *s <= '9') s++;
    else { mt_json_fail(j, "invalid number"); return 0; }
    if (s < e && *s == '.') {
        s++;
        if (!(s < e && *s >= '0' && *s <= '9')) { j->p = s; mt_json_fail(j, "invalid number"); return 0; }
        while (s < e && *s >= '0' && *s <= '9') s++;
    }
    if (s < e && (*s == 'e' || *s == 'E')) {
        s++;
        if (s < e && (*s == '+' || *s == '-')) s++;
        if (!(s < e && *s >= '0' && *s <= '9')) { j->p = s; mt_json_fail(j, "invalid number"); return 0; }
        while (s < e && *s >= '0' && *s <= '9') s++;
    }
    char buf[64];
    size_t n = (size_t)(s - j->p);
    if (n >= sizeof buf) n = sizeof buf - 1;   // digits beyond a double's precision change nothing
    memcpy(buf, j->p, n);
    buf[n] = 0;
    *v = strtod(buf, NULL);
    j->p = s;
    return 1;
}

static int mt__json_literal(mt_json *j, const char *lit) {
    size_t n = strlen(lit);
    if ((size_t)(j->end - j->p) >= n && memcmp(j->p, lit, n) == 0) { j->p += n; return 1; }
    return 0;
}

// checks and skips one value of any type; returns its type. Nesting deeper than
// MT_JSON_MAX_DEPTH is an error (a file nested 200k levels deep must not overflow the stack).
static mt_json_type mt__json_skip(mt_json *j, int depth) {
    mt_json_ws(j);
    if (j->err) return MT_JSON_NULL;
    if (j->p >= j->end) { mt_json_fail(j, "expected a value"); return MT_JSON_NULL; }
    if (depth > MT_JSON_MAX_DEPTH) { mt_json_fail(j, "nested too deeply"); return MT_JSON_NULL; }
    char c = *j->p;
    int lone;
    if (c == '"') { mt_json_scan_string(j, &lone); return MT_JSON_STRING; }
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        mt_json_type type = c == '{' ? MT_JSON_OBJECT : MT_JSON_ARRAY;
        j->p++;
        if (mt_json_eat(j, close)) return type;
        do {
            if (c == '{') {
                mt_json_ws(j);
                if (j->p >= j->end || *j->p != '"') { mt_json_fail(j, "expected a key string"); return type; }
                mt_json_scan_string(j, &lone);
                if (!mt_json_expect(j, ':', "expected ':'")) return type;
            }
            mt__json_skip(j, depth + 1);
            if (j->err) return type;
        } while (mt_json_eat(j, ','));
        mt_json_expect(j, close, c == '{' ? "expected ',' or '}'" : "expected ',' or ']'");
        return type;
    }
    if (mt__json_literal(j, "true")) return MT_JSON_TRUE;
    if (mt__json_literal(j, "false")) return MT_JSON_FALSE;
    if (mt__json_literal(j, "null")) return MT_JSON_NULL;
    double v;
    if (c == '-' || c == 'N' || c == 'I' || (c >= '0' && c <= '9')) { mt_json_number(j, &v); return MT_JSON_NUMBER; }
    mt_json_fail(j, "expected a value");
    return MT_JSON_NULL;
}

mt_json_type mt_json_skip(mt_json *j) { return mt__json_skip(j, 0); }
// at an object: moves the cursor to the value of member `key` and returns 1, or returns 0
// (the key is missing, or the object is malformed: then j->err says so)
int mt_json_find(mt_json *j, const char *key) {
    if (!mt_json_expect(j, '{', "expected an object")) return 0;
    if (mt_json_eat(j, '}')) return 0;
    size_t klen = strlen(key);
    do {
        mt_json_ws(j);
        const char *start = j->p;
        int lone;
        if (j->p >= j->end || *j->p != '"') { mt_json_fail(j, "expected a key string"); return 0; }
        if (!mt_json_scan_string(j, &lone)) return 0;
        // keys are compared as written: the keys we look for have no escapes
        int match = (size_t)(j->p - start) == klen + 2 && memcmp(start + 1, key, klen) == 0;
        if (!mt_json_expect(j, ':', "expected ':'")) return 0;
        if (match) { mt_json_ws(j); return 1; }
        mt_json_skip(j);
        if (j->err) return 0;
    } while (mt_json_eat(j, ','));
    mt_json_expect(j, '}', "expected ',' or '}'");
    return 0;
}

// an array of integers like [3, 64, 64] -> out[0..count); returns the count, or -1 (malformed,
// not integers, or more than cap)
int mt_json_ints(mt_json *j, long long *out, int cap) {
    if (!mt_json_expect(j, '[', "expected '['")) return -1;
    int n = 0;
    if (mt_json_eat(j, ']')) return 0;
    do {
        double v;
        if (!mt_json_number(j, &v)) return -1;
        if (n >= cap || v != floor(v) || fabs(v) > 9.0e15) { mt_json_fail(j, "expected a small integer"); return -1; }
        out[n++] = (long long)v;
    } while (mt_json_eat(j, ','));
    return mt_json_expect(j, ']', "expected ',' or ']'") ? n : -1;
}

// ---------------------------------------------------------------------------------------------
// edit distance (Levenshtein): how flags are matched to the nearest known one in messages
// ---------------------------------------------------------------------------------------------
int mt_edit_distance(const char *a, const char *b) {
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
    cfg->model.hidden_dropout = 0.1f;          // Megatron's defaults: the tutorial's command trains what it
    cfg->model.attention_dropout = 0.1f;       // trains there (tests that want none say 0 explicitly)
    cfg->parallel.tensor_model_parallel_size = 1;
    cfg->parallel.pipeline_model_parallel_size = 1;
    cfg->parallel.ddp_bucket_size = 40000000;  // Megatron's default bucket: 40M elements
    cfg->parallel.distributed_timeout_minutes = 10;   // Megatron's default
    cfg->parallel.local_rank = -1;
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
    cfg->train.optimizer_offload_fraction = 1.0;   // Megatron's default: all of it, once offloaded
    cfg->train.initial_loss_scale = 4294967296.0f;   // 2^32, Megatron's
    cfg->train.min_loss_scale = 1.0f;
    cfg->train.loss_scale_window = 1000;
    cfg->train.hysteresis = 2;
    cfg->train.seed = 1234;
    cfg->train.log_interval = 100;
    cfg->train.eval_interval = 1000;
    cfg->train.eval_iters = 100;
    strcpy(cfg->train.split, "969,30,1");
    strcpy(cfg->train.tokenizer_type, "GPT2BPETokenizer");
    cfg->train.target_tp = 1;
    cfg->train.target_pp = 1;
    cfg->train.temperature = 1.0f;
    cfg->train.out_seq_length = 1024;   // Megatron's tools/generate_samples_gpt.py default
    cfg->train.num_samples = 0;          // 0: one of each prompt (and read prompts from stdin without one)
    cfg->train.recompute_num_layers = 1;
    cfg->train.tensorboard_log_interval = 1;
    cfg->train.tensorboard_queue_size = 1000;
    cfg->train.profile_step_start = 10;
    cfg->train.profile_step_end = 12;
}

typedef enum { MT__INT, MT__LONG, MT__U64, MT__FLOAT, MT__DOUBLE, MT__STR, MT__BOOL, MT__DATA_PATH, MT__CONFIG_FILE,
              MT__IGNORED } mt__flag_type;

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
    {"--config", MT__CONFIG_FILE, 0, 0, "model",
     "JSON file with any of these settings, keys as flags with _ (hidden_size); flags override it"},
    {"--num-layers", MT__INT, MT__OFF(model.num_layers), 0, "model", "transformer layers (L)"},
    {"--hidden-size", MT__INT, MT__OFF(model.hidden_size), 0, "model", "hidden size (C)"},
    {"--num-attention-heads", MT__INT, MT__OFF(model.num_attention_heads), 0, "model", "attention heads (NH)"},
    {"--ffn-hidden-size", MT__INT, MT__OFF(model.ffn_hidden_size), 0, "model",
     "MLP hidden size (F), default 4 * hidden size"},
    {"--seq-length", MT__INT, MT__OFF(model.seq_length), 0, "model", "tokens per sample (T)"},
    {"--max-position-embeddings", MT__INT, MT__OFF(model.max_position_embeddings), 0, "model",
     "rows of the position embedding, default seq length"},
    {"--vocab-size", MT__INT, MT__OFF(model.vocab_size), 0, "model",
     "vocabulary size when there is no --vocab-file (NullTokenizer)"},
    {"--make-vocab-size-divisible-by", MT__INT, MT__OFF(model.make_vocab_size_divisible_by), 0, "model",
     "pad the vocabulary to a multiple of this times TP"},
    {"--init-method-std", MT__FLOAT, MT__OFF(model.init_method_std), 0, "model", "std of the normal weight init"},
    {"--hidden-dropout", MT__FLOAT, MT__OFF(model.hidden_dropout), 0, "model",
     "dropout after embeddings, attention proj and MLP"},
    {"--attention-dropout", MT__FLOAT, MT__OFF(model.attention_dropout), 0, "model",
     "dropout on attention probabilities"},
    {"--tensor-model-parallel-size", MT__INT, MT__OFF(parallel.tensor_model_parallel_size), 0, "parallel",
     "tensor parallel ranks (TP)"},
    {"--pipeline-model-parallel-size", MT__INT, MT__OFF(parallel.pipeline_model_parallel_size), 0, "parallel",
     "pipeline stages (PP)"},
    {"--nproc-per-node", MT__INT, MT__OFF(parallel.nproc_per_node), 0, "parallel",
     "ranks (threads on the CPU build); DP = ranks / (TP*PP); default TP*PP"},
    {"--num-layers-per-virtual-pipeline-stage", MT__INT, MT__OFF(parallel.num_layers_per_virtual_pipeline_stage), 0,
     "parallel", "interleaved 1F1B: layers per model chunk"},
    {"--ddp-bucket-size", MT__LONG, MT__OFF(parallel.ddp_bucket_size), 0, "parallel",
     "gradient elements per data-parallel all-reduce bucket"},
    {"--overlap-grad-reduce", MT__BOOL, MT__OFF(parallel.overlap_grad_reduce), 0, "parallel",
     "all-reduce the gradients over DP bucket by bucket during the last micro-batch's backward, not after it"},
    {"--use-distributed-optimizer", MT__BOOL, MT__OFF(parallel.use_distributed_optimizer), 0, "parallel",
     "shard AdamW's state and the update over the DP ranks: reduce-scatter gradients, all-gather parameters"},
    {"--sequence-parallel", MT__BOOL, MT__OFF(parallel.sequence_parallel), 0, "parallel",
     "split layernorms, dropouts and residuals along the sequence over the TP ranks (T/TP positions each): "
     "all-gather and reduce-scatter instead of all-reduce"},
    {"--no-async-tensor-model-parallel-allreduce", MT__BOOL,
     MT__OFF(parallel.no_async_tensor_model_parallel_allreduce), 0, "parallel",
     "a column-parallel layer's backward all-reduces its input gradient (reduce-scatters with "
     "--sequence-parallel) after its weight gradient, not while it is computed"},
    {"--print-layout", MT__BOOL, MT__OFF(parallel.print_layout), 0, "parallel",
     "print the TP/PP/DP/embedding groups and exit"},
    {"--print-launch", MT__BOOL, MT__OFF(parallel.print_launch), 0, "parallel",
     "print the launch the environment describes (torchrun-style, Slurm, Open MPI or one process) and exit"},
    {"--nccl-init-file", MT__STR, MT__OFF(parallel.nccl_init_file), MT_PATH_MAX, "parallel",
     "several processes meet through this file on a shared filesystem instead of MASTER_ADDR:MASTER_PORT"},
    {"--dist-timeout", MT__DOUBLE, MT__OFF(parallel.dist_timeout), 0, "parallel",
     "seconds to wait for the other processes at the rendezvous (default: --distributed-timeout-minutes)"},
    {"--local-rank", MT__INT, MT__OFF(parallel.local_rank), 0, "parallel",
     "this process's index on its node, as torch.distributed.launch passes it (LOCAL_RANK says the same)"},
    {"--local_rank", MT__INT, MT__OFF(parallel.local_rank), 0, "parallel", "the same as --local-rank"},
    {"--distributed-timeout-minutes", MT__INT, MT__OFF(parallel.distributed_timeout_minutes), 0, "parallel",
     "minutes to wait for the other processes at the rendezvous"},
    {"--dry-run", MT__BOOL, MT__OFF(parallel.dry_run), 0, "parallel",
     "print each rank's memory plan (parameters, gradients, optimizer, activations, workspace, the GPU kernels' "
     "scratch, NCCL's buffers) and exit"},
    {"--print-schedule", MT__BOOL, MT__OFF(parallel.print_schedule), 0, "parallel",
     "print each stage's pipeline time line and the bubble, then exit"},
    {"--micro-batch-size", MT__INT, MT__OFF(train.micro_batch_size), 0, "training",
     "samples per micro-batch per rank (B)"},
    {"--global-batch-size", MT__INT, MT__OFF(train.global_batch_size), 0, "training",
     "samples per iteration = B * DP * accumulation steps"},
    {"--train-iters", MT__INT, MT__OFF(train.train_iters), 0, "training", "iterations to train"},
    {"--lr", MT__FLOAT, MT__OFF(train.lr), 0, "training", "peak learning rate"},
    {"--min-lr", MT__FLOAT, MT__OFF(train.min_lr), 0, "training", "learning rate at the end of decay"},
    {"--lr-decay-style", MT__STR, MT__OFF(train.lr_decay_style), sizeof(((mt_config *)0)->train.lr_decay_style),
     "training", "constant | linear | cosine"},
    {"--lr-decay-iters", MT__INT, MT__OFF(train.lr_decay_iters), 0, "training",
     "iterations to decay over, default train iters"},
    {"--lr-warmup-iters", MT__INT, MT__OFF(train.lr_warmup_iters), 0, "training", "linear warm-up iterations"},
    {"--lr-warmup-fraction", MT__DOUBLE, MT__OFF(train.lr_warmup_fraction), 0, "training",
     "warm-up as a fraction of lr decay iters"},
    {"--weight-decay", MT__FLOAT, MT__OFF(train.weight_decay), 0, "training",
     "AdamW decoupled weight decay (not on biases and layernorms)"},
    {"--adam-beta1", MT__FLOAT, MT__OFF(train.adam_beta1), 0, "training", "AdamW beta1"},
    {"--adam-beta2", MT__FLOAT, MT__OFF(train.adam_beta2), 0, "training", "AdamW beta2"},
    {"--adam-eps", MT__FLOAT, MT__OFF(train.adam_eps), 0, "training", "AdamW epsilon"},
    {"--clip-grad", MT__FLOAT, MT__OFF(train.clip_grad), 0, "training", "clip gradients to this global norm (0 = off)"},
    {"--optimizer-cpu-offload", MT__BOOL, MT__OFF(train.optimizer_cpu_offload), 0, "training",
     "AdamW's fp32 master weights and both moments (this rank's shard) in pinned host memory, the update on host "
     "threads; gradients down and parameters up once per step (ZeRO-Offload): 0 optimizer bytes on the device"},
    {"--optimizer-offload-fraction", MT__DOUBLE, MT__OFF(train.optimizer_offload_fraction), 0, "training",
     "the share of the optimizer offloaded by --optimizer-cpu-offload (only 1.0 here: all of it)"},
    {"--optimizer-offload-threads", MT__INT, MT__OFF(train.optimizer_offload_threads), 0, "training",
     "host threads per rank for the offloaded AdamW update (0: the host's cores / ranks on this node, at most 8)"},
    {"--deepspeed", MT__BOOL, MT__OFF(train.deepspeed), 0, "training",
     "Megatron-DeepSpeed's launch: read --deepspeed_config and map it onto these flags"},
    {"--deepspeed_config", MT__STR, MT__OFF(train.deepspeed_config), MT_PATH_MAX, "training",
     "DeepSpeed's ds_config.json: ZeRO stage 0-2, offload_optimizer, optimizer, scheduler, batch, fp16/bf16 keys "
     "as our flags (\"auto\": ours); one line says what was mapped and ignored"},
    {"--deepspeed-config", MT__STR, MT__OFF(train.deepspeed_config), MT_PATH_MAX, "training",
     "the same as --deepspeed_config"},
    {"--seed", MT__U64, MT__OFF(train.seed), 0, "training", "seed of init, data shuffling and dropout"},
    {"--fp32", MT__BOOL, MT__OFF(train.fp32), 0, "training", "compute in fp32 (the default)"},
    {"--bf16", MT__BOOL, MT__OFF(train.bf16), 0, "training",
     "GEMM and attention operands in bf16, fp32 accumulation (the CPU build emulates it)"},
    {"--fp16", MT__BOOL, MT__OFF(train.fp16), 0, "training",
     "GEMM and attention operands in fp16, with loss scaling (the CPU build emulates it)"},
    {"--loss-scale", MT__FLOAT, MT__OFF(train.loss_scale), 0, "training",
     "fp16: a static loss scale (0: dynamic scaling, the default)"},
    {"--initial-loss-scale", MT__FLOAT, MT__OFF(train.initial_loss_scale), 0, "training",
     "fp16 dynamic loss scaling: the first scale (Megatron's 2^32 = 4294967296)"},
    {"--min-loss-scale", MT__FLOAT, MT__OFF(train.min_loss_scale), 0, "training",
     "fp16 dynamic loss scaling: the scale never drops below it"},
    {"--loss-scale-window", MT__INT, MT__OFF(train.loss_scale_window), 0, "training",
     "fp16 dynamic loss scaling: steps without inf/nan before the scale doubles"},
    {"--hysteresis", MT__INT, MT__OFF(train.hysteresis), 0, "training",
     "fp16 dynamic loss scaling: inf/nan steps before the scale halves"},
    {"--gemm", MT__STR, MT__OFF(train.gemm), 16, "training",
     "GPU GEMM kernel: naive | tiled | mma | wgmma (default: tiled for fp32; for bf16 / fp16 wgmma on Hopper, else mma)"},
    {"--recompute-granularity", MT__STR, MT__OFF(train.recompute_granularity), 16, "training",
     "activation recompute: full (whole layers) | selective (the attention core)"},
    {"--recompute-method", MT__STR, MT__OFF(train.recompute_method), 16, "training",
     "full recompute: uniform (groups of N layers) | block (the first N layers of each chunk)"},
    {"--recompute-num-layers", MT__INT, MT__OFF(train.recompute_num_layers), 0, "training",
     "N of --recompute-method"},
    {"--recompute-activations", MT__BOOL, MT__OFF(train.recompute_activations), 0, "training",
     "= --recompute-granularity selective"},
    {"--log-interval", MT__INT, MT__OFF(train.log_interval), 0, "logging", "iterations between iteration lines"},
    {"--verbose", MT__BOOL, MT__OFF(train.verbose), 0, "logging",
     "also print rank 0's parameter tensors in carve order (name, shape, offset) at start"},
    {"--eval-interval", MT__INT, MT__OFF(train.eval_interval), 0, "logging", "iterations between validation runs"},
    {"--eval-iters", MT__INT, MT__OFF(train.eval_iters), 0, "logging", "global batches per validation run"},
    {"--save-interval", MT__INT, MT__OFF(train.save_interval), 0, "checkpointing", "iterations between checkpoints"},
    {"--exit-interval", MT__INT, MT__OFF(train.exit_interval), 0, "checkpointing",
     "stop after an iteration divisible by this (saving first, with --save)"},
    {"--save", MT__STR, MT__OFF(train.save), MT_PATH_MAX, "checkpointing", "checkpoint directory to write"},
    {"--load", MT__STR, MT__OFF(train.load), MT_PATH_MAX, "checkpointing", "checkpoint directory to resume from"},
    {"--use-checkpoint-args", MT__BOOL, MT__OFF(train.use_checkpoint_args), 0, "checkpointing",
     "the model's shape (layers, hidden size, heads, FFN size, positions, vocabulary) from the --load checkpoint; "
     "a given shape flag that disagrees gives way, with a note (without it, an error). Generation mode always "
     "takes the shape from the checkpoint"},
    {"--no-load-optim", MT__BOOL, MT__OFF(train.no_load_optim), 0, "checkpointing",
     "--load the parameters and the iteration, not AdamW's moments and step nor the loss scale (they start "
     "again; the learning rate goes on from the iteration)"},
    {"--finetune", MT__BOOL, MT__OFF(train.finetune), 0, "checkpointing",
     "--load the parameters only: training starts at iteration 1 (data, learning rate) with a new optimizer"},
    {"--exit-on-missing-checkpoint", MT__BOOL, MT__OFF(train.exit_on_missing_checkpoint), 0, "checkpointing",
     "--load DIR without a checkpoint in it is an error, not a start from random weights"},
    {"--no-load-rng", MT__IGNORED, 0, 0, "ignored",
     "no random state is saved: every random stream (initialisation, dropout, the data's order) is a function of "
     "--seed and the iteration"},
    {"--convert-checkpoint", MT__BOOL, MT__OFF(train.convert_checkpoint), 0, "checkpointing",
     "rewrite the --load checkpoint for the --target-* layout into --save, then exit"},
    {"--overwrite", MT__BOOL, MT__OFF(train.overwrite), 0, "checkpointing",
     "let --save write into a directory that holds another run's checkpoints (never into --load's own)"},
    {"--target-tensor-parallel-size", MT__INT, MT__OFF(train.target_tp), 0, "checkpointing",
     "TP of the converted checkpoint"},
    {"--target-pipeline-parallel-size", MT__INT, MT__OFF(train.target_pp), 0, "checkpointing",
     "PP of the converted checkpoint"},
    {"--target-num-layers-per-virtual-pipeline-stage", MT__INT, MT__OFF(train.target_vp_layers), 0, "checkpointing",
     "interleaved chunks of the converted checkpoint"},
    {"--export-hf", MT__STR, MT__OFF(train.export_hf), MT_PATH_MAX, "checkpointing",
     "write the --load checkpoint as Hugging Face GPT-2 (model.safetensors, config.json) into this directory, then "
     "exit"},
    {"--import-hf", MT__STR, MT__OFF(train.import_hf), MT_PATH_MAX, "checkpointing",
     "read a Hugging Face GPT2LMHeadModel directory (model.safetensors, config.json) and write it as our "
     "checkpoint into --save for --target-tensor/pipeline-parallel-size, then exit"},
    {"--tokens-to-generate", MT__INT, MT__OFF(train.tokens_to_generate), 0, "generation",
     "after training, continue --prompt by this many tokens (with the KV cache)"},
    {"--out-seq-length", MT__INT, MT__OFF(train.out_seq_length), 0, "generation",
     "generation mode (--load without --train-iters): new tokens per sequence; a sequence also stops at "
     "<|endoftext|> and at the last position (--max-position-embeddings), said at the end; the window "
     "never slides"},
    {"--prompt", MT__STR, MT__OFF(train.prompt), 1024, "generation",
     "the text to continue (default: a new document; in generation mode without it, one prompt per line of "
     "standard input, and on a terminal one at a time as Megatron asks for them, until \"stop\"; without "
     "--vocab-file, token ids separated by spaces)"},
    {"--sample-input-file", MT__STR, MT__OFF(train.sample_input_file), MT_PATH_MAX, "generation",
     "generation mode: one prompt per line"},
    {"--sample-output-file", MT__STR, MT__OFF(train.sample_output_file), MT_PATH_MAX, "generation",
     "generation mode: JSON lines {\"prompt\", \"text\", \"prompt_tokens\", \"tokens\"} instead of printing "
     "(default with --sample-input-file: its path + .out, as Megatron, and printed too)"},
    {"--genfile", MT__STR, MT__OFF(train.genfile), MT_PATH_MAX, "generation",
     "generation mode, unconditional samples (--num-samples N, no prompt): JSON lines {\"text\", \"length\", "
     "\"finished\", \"tokens\"} as Megatron's tools/generate_samples_gpt.py writes them"},
    {"--recompute", MT__IGNORED, 0, 0, "ignored",
     "generation reads the earlier positions' keys and values from its KV cache; recomputing them gives the same "
     "tokens (tests/test_generate.c checks the cache against the uncached forward)"},
    {"--num-samples", MT__INT, MT__OFF(train.num_samples), 0, "generation",
     "generation mode: samples of each prompt; without a prompt, unconditional samples from <|endoftext|>"},
    {"--temperature", MT__FLOAT, MT__OFF(train.temperature), 0, "generation", "sampling temperature (0 = greedy)"},
    {"--top-k", MT__INT, MT__OFF(train.top_k), 0, "generation", "sample among the k most likely tokens (0 = all)"},
    {"--top_k", MT__INT, MT__OFF(train.top_k), 0, "generation", "--top-k as tools/generate_samples_gpt.py spells it"},
    {"--top-p", MT__FLOAT, MT__OFF(train.top_p), 0, "generation",
     "sample among the most likely tokens whose probabilities add up to p (nucleus; 0 = all)"},
    {"--top_p", MT__FLOAT, MT__OFF(train.top_p), 0, "generation", "--top-p as tools/generate_samples_gpt.py spells it"},
    {"--greedy", MT__BOOL, MT__OFF(train.greedy), 0, "generation", "always the most likely token"},
    {"--ignore-eos", MT__BOOL, MT__OFF(train.ignore_eos), 0, "generation",
     "generation mode: do not stop at <|endoftext|> (benchmarks: exactly --out-seq-length tokens)"},
    {"--data-path", MT__DATA_PATH, 0, 0, "data", "PREFIX, or W1 PREFIX1 W2 PREFIX2 ... (blended by weight)"},
    {"--mock-data", MT__BOOL, MT__OFF(train.mock_data), 0, "data",
     "instead of --data-path, Megatron's mock dataset: documents 1, 2, ..., n-1, <|endoftext|> of random lengths "
     "(a smoke test: nothing to learn but counting)"},
    {"--split", MT__STR, MT__OFF(train.split), 64, "data",
     "train,valid,test proportions of the documents, e.g. 949,50,1"},
    {"--vocab-file", MT__STR, MT__OFF(train.vocab_file), MT_PATH_MAX, "data", "GPT-2 vocab.json"},
    {"--merge-file", MT__STR, MT__OFF(train.merge_file), MT_PATH_MAX, "data", "GPT-2 merges.txt"},
    {"--tokenizer-type", MT__STR, MT__OFF(train.tokenizer_type), 32, "data", "GPT2BPETokenizer | NullTokenizer"},
    {"--ckpt-step", MT__INT, MT__OFF(train.ckpt_step), 0, "checkpointing",
     "load this iteration of --load instead of the latest"},
    {"--tensorboard-dir", MT__STR, MT__OFF(train.tensorboard_dir), MT_PATH_MAX, "logging",
     "write TensorBoard event files here (tensorboard --logdir DIR)"},
    {"--tensorboard-log-interval", MT__INT, MT__OFF(train.tensorboard_log_interval), 0, "logging",
     "iterations between TensorBoard scalars"},
    {"--tensorboard-queue-size", MT__INT, MT__OFF(train.tensorboard_queue_size), 0, "logging",
     "TensorBoard events held in memory before a flush (and at every --log-interval)"},
    {"--log-num-zeros-in-grad", MT__BOOL, MT__OFF(train.log_num_zeros_in_grad), 0, "logging",
     "also show how many gradients are exactly 0 (every parameter counted once) in the iteration line and "
     "TensorBoard's num-zeros"},
    {"--log-params-norm", MT__BOOL, MT__OFF(train.log_params_norm), 0, "logging",
     "also show the parameters' L2 norm (every parameter counted once) in the iteration line and TensorBoard's "
     "params-norm"},
    {"--log-timers-to-tensorboard", MT__BOOL, MT__OFF(train.log_timers_to_tensorboard), 0, "logging",
     "also write iteration-time and the step's timers"},
    {"--log-validation-ppl-to-tensorboard", MT__BOOL, MT__OFF(train.log_validation_ppl_to_tensorboard), 0, "logging",
     "also write the validation perplexity"},
    {"--log-memory-to-tensorboard", MT__BOOL, MT__OFF(train.log_memory_to_tensorboard), 0, "logging",
     "also write the memory this rank allocated"},
    {"--log-batch-size-to-tensorboard", MT__BOOL, MT__OFF(train.log_batch_size_to_tensorboard), 0, "logging",
     "also write the global batch size"},
    {"--log-world-size-to-tensorboard", MT__BOOL, MT__OFF(train.log_world_size_to_tensorboard), 0, "logging",
     "also write the number of ranks"},
    {"--no-log-loss-scale-to-tensorboard", MT__BOOL, MT__OFF(train.no_log_loss_scale_to_tensorboard), 0, "logging",
     "leave out loss-scale"},
    {"--no-log-learnig-rate-to-tensorboard", MT__BOOL, MT__OFF(train.no_log_learning_rate_to_tensorboard), 0,
     "logging", "leave out learning-rate (Megatron spells it so)"},
    {"--timeline", MT__STR, MT__OFF(train.timeline), MT_PATH_MAX, "logging",
     "write a Chrome trace (Perfetto, chrome://tracing) of every rank for the profile window"},
    {"--timeline-svg", MT__STR, MT__OFF(train.timeline_svg), MT_PATH_MAX, "logging",
     "write the same time line as an SVG picture"},
    {"--profile-step-start", MT__INT, MT__OFF(train.profile_step_start), 0, "logging",
     "first iteration of the timeline's window"},
    {"--profile-step-end", MT__INT, MT__OFF(train.profile_step_end), 0, "logging",
     "the window ends before this iteration"},
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
    {"--log-throughput", MT__IGNORED, 0, 0, "ignored", "the iteration line always shows TFLOP/s per GPU and tokens/s"},
    {"--num-workers", MT__IGNORED, 0, 1, "ignored", "samples are read from the memory-mapped dataset directly"},
    {"--no-gradient-accumulation-fusion", MT__IGNORED, 0, 0, "ignored", "weight gradients always accumulate in place"},
    {"--use-mcore-models", MT__IGNORED, 0, 0, "ignored", "there is one GPT implementation"},
    {"--use-cpu-initialization", MT__IGNORED, 0, 0, "ignored",
     "weights are always initialised on the host, layout-independently"},
    {"--timing-log-level", MT__IGNORED, 0, 1, "ignored", "no per-op timers yet"},
    {"--overlap-cpu-optimizer-d2h-h2d", MT__IGNORED, 0, 0, "ignored",
     "--optimizer-cpu-offload's copies and host update run one after another"},
    // flags of today's Megatron examples (examples/gpt3/train_gpt3_175b_distributed.sh and its
    // like) that ask for what happens here anyway, or that only choose among implementations
    {"--attention-backend", MT__IGNORED, 0, 1, "ignored",
     "attention is this build's own fused kernel (FlashAttention's way: the T x T matrix never stored)"},
    {"--use-legacy-models", MT__IGNORED, 0, 0, "ignored", "there is one GPT implementation"},
    {"--ckpt-format", MT__IGNORED, 0, 1, "ignored",
     "checkpoints are safetensors files in Megatron's directories (iter_N/mp_rank_TT_PPP/), one a (TP, PP) rank"},
    {"--auto-detect-ckpt-format", MT__IGNORED, 0, 0, "ignored", "there is one checkpoint format"},
    {"--ckpt-fully-parallel-save", MT__IGNORED, 0, 0, "ignored",
     "every (TP, PP) rank writes its own file (DP rank 0 of each)"},
    {"--ckpt-fully-parallel-load", MT__IGNORED, 0, 0, "ignored", "every rank reads its own file"},
    {"--ckpt-assume-constant-structure", MT__IGNORED, 0, 0, "ignored", "a checkpoint's structure is always the same"},
    {"--dist-ckpt-strictness", MT__IGNORED, 0, 1, "ignored",
     "every tensor of a checkpoint is checked: its shape, its layout and its checksum"},
    {"--async-save", MT__IGNORED, 0, 0, "ignored",
     "saves are synchronous: written to a temporary name, fsync'd, renamed"},
    {"--override-opt_param-scheduler", MT__IGNORED, 0, 0, "ignored",
     "the learning-rate schedule always comes from this run's flags and the iteration"},
    {"--use-checkpoint-opt_param-scheduler", MT__IGNORED, 0, 0, "ignored",
     "a checkpoint holds no schedule: it comes from this run's flags and the iteration (give the ones the run "
     "started with)"},
    {"--dataloader-type", MT__IGNORED, 0, 1, "ignored",
     "samples are read in the order of the dataset's shuffled index, epoch after epoch (Megatron's single)"},
    {"--no-create-attention-mask-in-dataloader", MT__IGNORED, 0, 0, "ignored",
     "the causal mask is never made: the attention kernels skip the future positions"},
    {"--apply-query-key-layer-scaling", MT__IGNORED, 0, 0, "ignored",
     "the attention's scores and softmax are in fp32, where this fp16 overflow guard changes nothing"},
    {"--no-persist-layer-norm", MT__IGNORED, 0, 0, "ignored", "there is one layernorm kernel family"},
    {"--bias-gelu-fusion", MT__IGNORED, 0, 0, "ignored", "fusion is a kernel detail here"},
    {"--no-bias-swiglu-fusion", MT__IGNORED, 0, 0, "ignored", "there is no SwiGLU (GPT-2 uses GELU)"},
    {"--no-rope-fusion", MT__IGNORED, 0, 0, "ignored", "there is no RoPE (GPT-2's learned positions)"},
    {"--manual-gc", MT__IGNORED, 0, 0, "ignored", "no garbage collector: memory is allocated once"},
    {"--manual-gc-interval", MT__IGNORED, 0, 1, "ignored", "no garbage collector: memory is allocated once"},
    {"--empty-unused-memory-level", MT__IGNORED, 0, 1, "ignored",
     "no caching allocator to empty: buffers are allocated once, at start-up"},
    {"--deterministic-mode", MT__IGNORED, 0, 0, "ignored",
     "every run is bit-reproducible already (no atomics in the sums, fixed reduction orders)"},
    // Megatron's gradient and pipeline flags that ask for what happens here anyway
    {"--accumulate-allreduce-grads-in-fp32", MT__IGNORED, 0, 0, "ignored",
     "gradients always accumulate in an fp32 buffer and are all-reduced in fp32"},
    {"--ddp-average-in-collective", MT__IGNORED, 0, 0, "ignored",
     "the DP all-reduce gives the mean either way (the loss gradient carries the 1/DP, the collective sums)"},
    {"--no-overlap-p2p-communication", MT__IGNORED, 0, 0, "ignored",
     "pipeline sends and receives never overlap the forward and backward"},
    // when --overlap-grad-reduce's buckets start, across pipeline stages: Megatron's training.py reads
    // these only when it is on. Here each stage starts its buckets as its own backward completes
    // them (what --no-align-grad-reduce asks for), and every stage does (no delay)
    {"--no-delay-grad-reduce", MT__IGNORED, 0, 0, "ignored",
     "every pipeline stage starts its --overlap-grad-reduce buckets as its backward completes them"},
    {"--no-align-grad-reduce", MT__IGNORED, 0, 0, "ignored",
     "each pipeline stage starts its --overlap-grad-reduce buckets on its own, as here always"},
    // these only time the overlapped all-gathers of --overlap-param-gather, refused below
    {"--delay-param-gather", MT__IGNORED, 0, 0, "ignored",
     "it only times --overlap-param-gather's all-gathers, not implemented (parameters are all-gathered after "
     "the optimizer step)"},
    {"--no-align-param-gather", MT__IGNORED, 0, 0, "ignored",
     "it only times --overlap-param-gather's all-gathers, not implemented (parameters are all-gathered after "
     "the optimizer step)"},
};
// Megatron flags that this build knows but does not implement yet: an error that says so
// (instead of "unknown flag"), so a tutorial's user knows what to drop; `without` (or NULL) says
// what the run does here instead, on the hint line.
static const struct { const char *name, *what, *without; } mt__unimplemented_flags[] = {
    {"--train-samples", "sample-based training: use --train-iters = samples / global batch size", NULL},
    {"--lr-decay-samples", "sample-based schedules: use --lr-decay-iters", NULL},
    {"--lr-warmup-samples", "sample-based schedules: use --lr-warmup-iters or --lr-warmup-fraction", NULL},
    {"--rampup-batch-size", "batch-size ramp-up", NULL},
    {"--overlap-param-gather", "overlapping the distributed optimizer's parameter all-gather with the forward",
     "the parameters are all-gathered after the optimizer step, not overlapped with the next forward"},
    {"--overlap-param-gather-with-optimizer-step",
     "overlapping the first bucket's parameter all-gather with the optimizer step, for --overlap-param-gather",
     "the parameters are all-gathered after the optimizer step"},
    {"--tp-comm-overlap", "overlapping tensor-parallel communication with the GEMMs, Transformer Engine's userbuffers",
     "the forward's tensor-parallel collectives run between the GEMMs they connect; the backward's input-gradient "
     "all-reduce (reduce-scatter with --sequence-parallel) runs beside the weight gradient"},
    {"--overlap-p2p-communication", "overlapping pipeline sends and receives with the forward and backward",
     "a stage waits for each message before the forward or backward that needs it"},
    {"--defer-embedding-wgrad-compute", "deferring the LM head's weight-gradient GEMMs to the pipeline flush",
     "the LM head's weight gradient is computed in each micro-batch's backward"},
    {"--untie-embeddings-and-output-weights", "an untied LM head (GPT-2 ties it)", NULL},
    {"--eod-mask-loss", "masking the loss at end-of-document tokens", NULL},
    {"--reset-position-ids", "resetting positions at document boundaries", NULL},
    {"--reset-attention-mask", "attention masks at document boundaries", NULL},
    {"--swiglu", "SwiGLU MLPs (GPT-2 uses GELU)", NULL},
    {"--normalization", "RMSNorm (GPT-2 uses LayerNorm)", NULL},
    {"--disable-bias-linear", "linear layers without biases", NULL},
    {"--use-rotary-position-embeddings", "rotary position embeddings (GPT-2 uses learned ones)", NULL},
    {"--fp8-format", "FP8 training (Transformer Engine's)", "use --bf16"},
    {"--train-data-path", "separate train / valid / test datasets", "use --data-path and --split"},
    {"--valid-data-path", "separate train / valid / test datasets", "use --data-path and --split"},
    {"--test-data-path", "separate train / valid / test datasets", "use --data-path and --split"},
    {"--wandb-project", "Weights & Biases logging", "use --tensorboard-dir"},
    {"--wandb-exp-name", "Weights & Biases logging", "use --tensorboard-dir"},
    {"--save-retain-interval", "deleting older checkpoints", "every saved iteration is kept"},
    {"--profile", "the PyTorch / Nsight profiler hooks", "--timeline FILE draws every rank for the window "
                                                         "--profile-step-start .. --profile-step-end"},
    {"--log-straggler", "the straggler detector", NULL},
};
// Flags of older Megatron versions and of the tutorial itself: each is honoured through today's
// equivalent, with a one-line note that names it (mt__old_flag), never refused: the tutorial's
// commands run as typed.
static const struct { const char *old_name; int takes_value; } mt__old_flags[] = {
    {"--model-parallel-size", 1}, {"--batch-size", 1}, {"--warmup", 1}, {"--num-gpus", 1}, {"--DDP-impl", 1},
    {"--checkpoint-activations", 0}, {"--checkpoint-num-layers", 1}, {"--distribute-checkpointed-activations", 0},
    {"--gradient-accumulation-steps", 1}, {"--use-checkpoint-optimizer", 0}, {"--optimizer-checkpoint-freq", 1},
    {"--start-iteration", 1},
};

static int mt__parse_int(const char *flag, const char *s);
static double mt__parse_double(const char *flag, const char *s);

static void mt__note(const char *fmt, ...) {
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "note: %s\n", line);
}

// applies an old flag (value: its value, NULL for a switch); returns 0 if name is not one
static int mt__old_flag(mt_config *cfg, const char *name, const char *v) {
    size_t i = 0, n = sizeof mt__old_flags / sizeof mt__old_flags[0];
    while (i < n && strcmp(mt__old_flags[i].old_name, name) != 0) i++;
    if (i == n) return 0;
    mt_train_config *t = &cfg->train;
    if (strcmp(name, "--model-parallel-size") == 0) {
        cfg->parallel.tensor_model_parallel_size = mt__parse_int(name, v);
        mt__note("--model-parallel-size is --tensor-model-parallel-size today: TP = %s", v);
    } else if (strcmp(name, "--batch-size") == 0) {
        t->micro_batch_size = mt__parse_int(name, v);
        mt__note("--batch-size (per GPU) is --micro-batch-size today: micro-batch %s", v);
    } else if (strcmp(name, "--warmup") == 0) {
        t->lr_warmup_fraction = mt__parse_double(name, v);
        mt__note("--warmup is --lr-warmup-fraction today: %s of the decay iterations", v);
    } else if (strcmp(name, "--num-gpus") == 0) {
        cfg->parallel.nproc_per_node = mt__parse_int(name, v);
        mt__note("--num-gpus is --nproc-per-node here: %s ranks", v);
    } else if (strcmp(name, "--DDP-impl") == 0) {
        mt__note("--DDP-impl is gone from Megatron; there is one data-parallel implementation here (bucketed "
                 "all-reduce, Megatron's local DDP)");
    } else if (strcmp(name, "--checkpoint-activations") == 0) {
        snprintf(t->recompute_granularity, sizeof t->recompute_granularity, "full");
        snprintf(t->recompute_method, sizeof t->recompute_method, "uniform");
        mt__note("--checkpoint-activations is --recompute-granularity full --recompute-method uniform today "
                 "(groups of --recompute-num-layers layers, %d unless --checkpoint-num-layers says)",
                 t->recompute_num_layers);
    } else if (strcmp(name, "--checkpoint-num-layers") == 0) {
        t->recompute_num_layers = mt__parse_int(name, v);
        mt__note("--checkpoint-num-layers is --recompute-num-layers today: %s", v);
    } else if (strcmp(name, "--distribute-checkpointed-activations") == 0) {
        mt__note("--distribute-checkpointed-activations is --distribute-saved-activations today (the recompute "
                 "groups' inputs split over TP); not here: every TP rank keeps its copy (the same numbers)");
    } else if (strcmp(name, "--gradient-accumulation-steps") == 0) {
        t->gradient_accumulation_steps = mt__parse_int(name, v);
        if (t->gradient_accumulation_steps < 1) mt_fatal("--gradient-accumulation-steps must be at least 1");
        mt__note("--gradient-accumulation-steps is older Megatron's; today --global-batch-size says it: global batch ="
                 " micro-batch x DP x %s", v);
    } else if (strcmp(name, "--use-checkpoint-optimizer") == 0 || strcmp(name, "--optimizer-checkpoint-freq") == 0) {
        if (v) mt__parse_int(name, v);
        cfg->parallel.use_distributed_optimizer = 1;
        mt__note("%s is not a Megatron flag; it is taken as Megatron's --use-distributed-optimizer (AdamW's state "
                 "sharded over DP)", name);
    } else if (strcmp(name, "--start-iteration") == 0) {
        t->start_iteration = mt__parse_int(name, v);
        if (t->start_iteration < 0) mt_fatal("--start-iteration must be 0 or more");
        mt__note("--start-iteration is not a Megatron flag (Megatron starts where the --load checkpoint stopped): "
                 "without a checkpoint, training starts at iteration %d, data and learning rate as if %s iterations "
                 "had run", t->start_iteration + 1, v);
    }
    return 1;
}

static const mt__flag *mt__find_flag(const char *name) {
    for (size_t i = 0; i < sizeof mt__flags / sizeof mt__flags[0]; i++)
        if (strcmp(mt__flags[i].name, name) == 0) return &mt__flags[i];
    return NULL;
}

static void mt__unknown_flag(const char *name) {
    for (size_t i = 0; i < sizeof mt__unimplemented_flags / sizeof mt__unimplemented_flags[0]; i++)
        if (strcmp(mt__unimplemented_flags[i].name, name) == 0)
            mt_fatal("%s (%s) is a Megatron flag that megatron.h does not implement yet\n"
                     "hint: drop it%s%s; ./train_gpt --help lists what is here",
                     name, mt__unimplemented_flags[i].what, mt__unimplemented_flags[i].without ? ": " : "",
                     mt__unimplemented_flags[i].without ? mt__unimplemented_flags[i].without : "");
    const char *best = NULL;
    int best_d = 1 << 30;
    for (size_t i = 0; i < sizeof mt__flags / sizeof mt__flags[0]; i++) {
        int d = mt_edit_distance(name, mt__flags[i].name);
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

// a real number; NaN and infinities are refused (no flag means anything by them)
static double mt__parse_double(const char *flag, const char *s) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || end == s || !isfinite(v))
        mt_fatal("%s expects a finite number, got '%s'\nhint: e.g. %s 0.5", flag, s, flag);
    return v;
}

// a whole number in [lo, hi], written as an integer or as a real with no fraction (4e7); range
// checked before any conversion, so 1e30 is an error and not undefined behaviour
static long long mt__parse_integer(const char *flag, const char *s, double lo, double hi) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (!errno && !*end && end != s && (double)v >= lo && (double)v <= hi) return v;
    double d = mt__parse_double(flag, s);
    if (d != floor(d) || d < lo || d > hi)
        mt_fatal("%s expects a whole number from %.0f to %.0f, got '%s'", flag, lo, hi, s);
    return (long long)d;
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
    case MT__LONG: *(long *)(base + f->offset) = (long)mt__parse_integer(f->name, v, 0, 9007199254740992.0); break;
    case MT__U64:   // a seed: 0 .. 2^53 (Megatron's is a Python int; every such value is exact in a double)
        *(unsigned long long *)(base + f->offset) = (unsigned long long)mt__parse_integer(f->name, v, 0,
                9007199254740992.0);
        break;
    case MT__FLOAT: {
        double d = mt__parse_double(f->name, v);
        if (fabs(d) > 3.0e38) mt_fatal("%s: %s does not fit in a float", f->name, v);
        *(float *)(base + f->offset) = (float)d;
        break;
    }
    case MT__DOUBLE: *(double *)(base + f->offset) = mt__parse_double(f->name, v); break;
    case MT__BOOL: *(int *)(base + f->offset) = 1; break;
    case MT__STR:
        if (strlen(v) + 1 > f->size) mt_fatal("%s value is too long (%zu bytes, at most %zu)", f->name, strlen(v),
                                              f->size - 1);
        strcpy(base + f->offset, v);
        break;
    case MT__DATA_PATH: {
        // Megatron's forms: "PREFIX", "W1 P1 W2 P2 ...", or "P1 P2 ..." (weighted by size)
        int weighted = nvalues >= 2 && mt__is_number(values[0]);
        if (weighted && nvalues % 2) mt_fatal("--data-path with weights needs pairs 'WEIGHT PREFIX', got %d values",
                                              nvalues);
        int n = weighted ? nvalues / 2 : nvalues;
        if (n > MT_MAX_DATA_PATHS) mt_fatal("--data-path: at most %d datasets, got %d", MT_MAX_DATA_PATHS, n);
        double total = 0;
        for (int i = 0; i < n; i++) {
            const char *prefix = weighted ? values[2 * i + 1] : values[i];
            if (strlen(prefix) + 1 > MT_PATH_MAX) mt_fatal("--data-path prefix too long");
            strcpy(cfg->train.data_path[i], prefix);
            cfg->train.data_weight[i] = weighted ? mt__parse_double("--data-path weight", values[2 * i]) : 0.0;
            if (weighted && !(cfg->train.data_weight[i] > 0)) mt_fatal("--data-path weight must be positive, got %s",
                    values[2 * i]);
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
        if (strncmp(name, "--",
                    2) != 0) mt_fatal("unexpected argument '%s'\nhint: every setting is a --flag (see --help)", name);
        char namebuf[128];
        const char *eq = strchr(name, '=');   // --flag=value is accepted too
        const char *inline_value = NULL;
        if (eq && (size_t)(eq - name) < sizeof namebuf) {
            memcpy(namebuf, name, (size_t)(eq - name));
            namebuf[eq - name] = 0;
            name = namebuf;
            inline_value = eq + 1;
        }
        if (strcmp(name, "--help") == 0) mt_fatal("--help takes no value (got '%s')", argv[i]);   // as argparse
        const mt__flag *f = mt__find_flag(name);
        if (!f) {   // an older Megatron's flag (or the tutorial's): honoured, with a note
            int k = 0, n = sizeof mt__old_flags / sizeof mt__old_flags[0];
            while (k < n && strcmp(mt__old_flags[k].old_name, name) != 0) k++;
            if (k < n) {
                const char *v = inline_value;
                if (mt__old_flags[k].takes_value && !v) {
                    if (i + 1 >= argc) mt_fatal("%s needs a value", name);
                    v = argv[++i];
                }
                mt__old_flag(cfg, name, v);
                continue;
            }
            mt__unknown_flag(name);
        }
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
    // --deepspeed --deepspeed_config FILE: DeepSpeed's keys onto the flags above, checked against them
    if (cfg->train.deepspeed && !cfg->train.deepspeed_config[0])
        mt_fatal("--deepspeed needs --deepspeed_config FILE (DeepSpeed's ds_config.json)\nhint: add --deepspeed_config "
                 "ds_config.json, or drop --deepspeed and give the flags themselves");
    if (cfg->train.deepspeed_config[0]) {
        char summary[4096];
        mt_config_load_deepspeed(cfg, cfg->train.deepspeed_config, argc, argv, summary, sizeof summary);
        fprintf(stderr, "note: %s%s\n", summary, cfg->train.deepspeed ? "" : " (read without --deepspeed)");
    }
    // Megatron accepts the loss-scale flags with --bf16 (bf16 has fp32's range: nothing to scale)
    const mt_train_config *t = &cfg->train;
    if (t->bf16 && !t->fp16 && (t->loss_scale != 0.0f || t->initial_loss_scale != 4294967296.0f ||
                                t->min_loss_scale != 1.0f || t->loss_scale_window != 1000 || t->hysteresis != 2))
        fprintf(stderr, "note: the loss-scale flags have no effect with --bf16 (bf16 has fp32's range: gradients "
                        "neither overflow nor vanish); they apply to --fp16\n");
}

// ---------------------------------------------------------------------------------------------
// the config file: one JSON object of "key": number | string | bool (or null: keep the
// default), with // and /* */ comments allowed (tutorial configs carry them). Read with the
// JSON reader above; a key is a flag's name with _ for - ("hidden_size" is --hidden-size).
// ---------------------------------------------------------------------------------------------
// the nearest flag to an unknown key, spelled as a key
static void mt__nearest_key(const char *flag, char *out, size_t cap) {
    const char *best = NULL;
    int best_d = 1 << 30;
    for (size_t i = 0; i < sizeof mt__flags / sizeof mt__flags[0]; i++) {
        int d = mt_edit_distance(flag, mt__flags[i].name);
        if (d < best_d) { best_d = d; best = mt__flags[i].name; }
    }
    snprintf(out, cap, "%s", best + 2);
    for (char *q = out; *q; q++) if (*q == '-') *q = '_';
}

// a config file's whole text (NUL-terminated), *len its bytes; `flag` names it in the messages
static char *mt__read_config_text(const char *path, const char *flag, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) mt_fatal("cannot open config file %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > (64 << 20)) {
        fclose(f);
        mt_fatal("config file %s is %s\nhint: %s names a JSON file", path,
                 S_ISDIR(st.st_mode) ? "a directory" : "not a regular file of at most 64 MB", flag);
    }
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = (char *)mt_malloc((size_t)(size > 0 ? size : 0) + 1, "config file");
    size_t got = fread(text, 1, (size_t)(size > 0 ? size : 0), f);
    fclose(f);
    text[got] = 0;
    *len = got;
    return text;
}

void mt_config_load_json(mt_config *cfg, const char *path) {
    size_t got;
    char *text = mt__read_config_text(path, "--config", &got);
    mt_json j;
    mt_json_init(&j, text, got, 1);
    if (!mt_json_eat(&j, '{')) mt_fatal("%s:%d: a config file is one JSON object { ... }", path, mt_json_line(&j));
    if (!mt_json_eat(&j, '}')) do {
        char key[128], value[MT_PATH_MAX];
        if (!mt_json_key(&j, key, sizeof key)) break;
        mt_json_ws(&j);
        int is_null = 0, bool_value = 0, is_bool = 0;
        if (j.p < j.end && *j.p == '"') {
            size_t lit = 0;
            const char *q = j.p;
            int lone;
            if (!mt_json_scan_string(&j, &lone)) break;
            if ((size_t)(j.p - q) > sizeof value) { j.p = q; mt_json_fail(&j, "value too long"); break; }
            j.p = q;
            if (!mt_json_string_at(&j, value, &lit)) break;
            value[lit] = 0;
        } else {
            const char *q = j.p;
            mt_json_type type = mt_json_skip(&j);
            if (j.err) break;
            if (type == MT_JSON_OBJECT || type == MT_JSON_ARRAY) {
                j.p = q;
                mt_json_fail(&j, "a config value is a number, a string, true, false or null");
                break;
            }
            size_t n = (size_t)(j.p - q) < sizeof value ? (size_t)(j.p - q) : sizeof value - 1;
            memcpy(value, q, n);
            value[n] = 0;
            is_bool = type == MT_JSON_TRUE || type == MT_JSON_FALSE;
            bool_value = type == MT_JSON_TRUE;
            is_null = type == MT_JSON_NULL;
        }
        char flag[140] = "--";
        for (size_t i = 0; key[i]
             && i + 3 < sizeof flag; i++) { flag[i + 2] = key[i] == '_' ? '-' : key[i]; flag[i + 3] = 0; }
        const mt__flag *fl = mt__find_flag(flag);
        if (!fl) {
            char suggestion[128];
            mt__nearest_key(flag, suggestion, sizeof suggestion);
            mt_fatal("%s:%d: unknown key \"%s\"\nhint: did you mean \"%s\"?", path, mt_json_line(&j), key, suggestion);
        }
        if (fl->type == MT__CONFIG_FILE)   // a config naming itself would recurse for ever
            mt_fatal("%s:%d: a config file cannot name another (\"%s\")\nhint: merge them into one file", path,
                     mt_json_line(&j), key);
        if (fl->type == MT__BOOL && !is_bool && !is_null)
            mt_fatal("%s:%d: \"%s\" is true or false, got %s", path, mt_json_line(&j), key, value);
        if (fl->type != MT__BOOL && is_bool)
            mt_fatal("%s:%d: \"%s\" takes a value, not %s\nhint: write a number or a string (null keeps the default)",
                     path, mt_json_line(&j), key, value);
        if (fl->type == MT__BOOL) { if (bool_value) mt__set_flag(cfg, fl, NULL, 0); }
        else if (is_null) { /* null for a valued key: keep the default */ }
        else { const char *vp = value; mt__set_flag(cfg, fl, &vp, 1); }
    } while (mt_json_eat(&j, ','));
    if (!j.err) mt_json_expect(&j, '}', "expected ',' or '}'");
    if (!j.err) { mt_json_ws(&j); if (j.p != j.end) mt_json_fail(&j, "text after the closing '}'"); }
    if (j.err) mt_fatal("%s:%d: %s\nhint: config files are JSON objects of \"key\": value", path, mt_json_line(&j),
                        j.err);
    free(text);
}

// ---------------------------------------------------------------------------------------------
// the DeepSpeed config: --deepspeed --deepspeed_config ds_config.json (Megatron-DeepSpeed's launch,
// the tutorial's DeepSpeed section), read with the JSON reader above and mapped onto our flags:
//   zero_optimization.stage       0: nothing (no sharding)
//                                 1: --use-distributed-optimizer with the gradients all-reduced
//                                    (every DP rank holds all of them, updates only its shard)
//                                 2: --use-distributed-optimizer, the gradients reduce-scattered
//                                    into the owner's shard (section 7). What stage 2 saves here
//                                    over 1: half the DP gradient traffic (a ring reduce-scatter
//                                    moves (DP-1)/DP of the buffer per rank, an all-reduce twice
//                                    that), not memory: our backward accumulates every micro-batch
//                                    into one whole gradient buffer, so there is no bucket to free
//                                    early as DeepSpeed's stage 2 does. The two give the same bits.
//                                 3: an error (ZeRO-3 shards the parameters too: not here)
//   zero_optimization.offload_optimizer.device   "cpu": --optimizer-cpu-offload; "none": nothing;
//                                 "nvme": an error (ZeRO-Infinity). .pin_memory: accepted (we always pin)
//   optimizer.type                Adam or AdamW: our AdamW (DeepSpeed's Adam is AdamW by default)
//   optimizer.params              lr -> --lr, betas [b1, b2] -> --adam-beta1/2, eps -> --adam-eps,
//                                 weight_decay -> --weight-decay
//   scheduler.type, .params       Megatron's warm-up is linear from 0: warmup_type must say "linear"
//                                 (DeepSpeed's default is "log") and warmup_min_lr / warmup_min_ratio
//                                 be 0; warmup_num_steps (DeepSpeed's default 1000) -> --lr-warmup-iters;
//                                 then
//       WarmupLR                  constant at warmup_max_lr (-> --lr)
//       WarmupDecayLR             linear down to 0 at total_num_steps (-> --lr-decay-iters)
//       WarmupCosineLR            cosine down to cos_min_ratio x lr (-> --min-lr) at total_num_steps
//   train_micro_batch_size_per_gpu -> --micro-batch-size, train_batch_size -> --global-batch-size,
//   gradient_accumulation_steps   global = micro x steps x DP, checked once DP is known (DeepSpeed's
//                                 rule); train_batch_size without the micro-batch: it is derived
//   gradient_clipping -> --clip-grad;  steps_per_print -> --log-interval
//   fp16.enabled -> --fp16; with it loss_scale (0 = dynamic) -> --loss-scale, initial_scale_power p
//                                 -> --initial-loss-scale 2^p (DeepSpeed's default p = 16),
//                                 loss_scale_window, hysteresis, min_loss_scale -> those flags
//   bf16.enabled -> --bf16
//   wall_clock_breakdown          accepted, ignored (the iteration line always shows the timers)
// "auto" keeps our flag's value. A key the file leaves out leaves our flag alone, except inside a
// block it gives (scheduler, fp16 enabled): there DeepSpeed's default applies unless the flag is
// given. A flag given on the command line (or set away from its default) that the file
// contradicts is an error naming both; any other key is an error naming it.

// the objects of the file that hold the keys, and the keys (leaves) read
static const char *const mt__ds_objects[] = {"zero_optimization", "zero_optimization.offload_optimizer", "optimizer",
                                             "optimizer.params", "scheduler", "scheduler.params", "fp16", "bf16"};
static const char *const mt__ds_keys[] = {
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "gradient_clipping",
    "steps_per_print", "wall_clock_breakdown", "zero_optimization.stage", "zero_optimization.offload_optimizer.device",
    "zero_optimization.offload_optimizer.pin_memory", "optimizer.type", "optimizer.params.lr",
    "optimizer.params.betas", "optimizer.params.eps", "optimizer.params.weight_decay", "scheduler.type",
    "scheduler.params.warmup_min_lr", "scheduler.params.warmup_max_lr", "scheduler.params.warmup_num_steps",
    "scheduler.params.warmup_type", "scheduler.params.total_num_steps", "scheduler.params.warmup_min_ratio",
    "scheduler.params.cos_min_ratio", "fp16.enabled", "fp16.loss_scale", "fp16.initial_scale_power",
    "fp16.loss_scale_window", "fp16.hysteresis", "fp16.min_loss_scale", "bf16.enabled"};
#define MT__DS_NUM_KEYS (sizeof mt__ds_keys / sizeof mt__ds_keys[0])

typedef struct {                // one key's value as the file gives it
    int given;                  // the key is in the file (null counts as absent)
    int is_auto;                // the string "auto": keep our flag's value
    mt_json_type type;
    double num, num2;           // a number (true 1, false 0); betas: [num, num2]
    char text[64];              // a number's literal, or a string
    int line;                   // where, for the messages
} mt__ds_value;

typedef struct {                // the mapping in progress
    const char *path;           // the file, for the messages
    int argc;
    char **argv;                // the command line: its flags are "given"
    mt_config defaults;         // and so is any field set away from its default
    mt__ds_value values[MT__DS_NUM_KEYS];   // in mt__ds_keys' order
    char mapped[2048], kept[512], ignored[512];   // the summary's three lists
} mt__ds_map;

static mt__ds_value *mt__ds_get(mt__ds_map *m, const char *key) {
    for (size_t i = 0; i < MT__DS_NUM_KEYS; i++)
        if (strcmp(mt__ds_keys[i], key) == 0) return &m->values[i];
    return NULL;
}
static int mt__ds_number_given(const mt__ds_value *v) { return v->given && !v->is_auto; }

static void mt__ds_list_add(char *list, size_t cap, const char *fmt, ...) {
    size_t n = strlen(list);
    if (n + 3 >= cap) return;
    if (n) { strcat(list, ", "); n += 2; }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(list + n, cap - n, fmt, ap);
    va_end(ap);
}

// a key with no equivalent: the error names it, and a near one if there is
static void mt__ds_unknown_key(const char *path, int line, const char *key) {
    if (strncmp(key, "zero_optimization.stage3_", 25) == 0)
        mt_fatal("%s:%d: \"%s\" belongs to ZeRO stage 3 (parameters sharded too), which megatron.h does not "
                 "implement\nhint: use \"stage\": 1 or 2 (the distributed optimizer) and remove the stage3_ keys",
                 path, line, key);
    const char *best = NULL;
    int best_d = 4;   // a suggestion only when it is close
    for (size_t i = 0; i < MT__DS_NUM_KEYS; i++) {
        int d = mt_edit_distance(key, mt__ds_keys[i]);
        if (d < best_d) { best_d = d; best = mt__ds_keys[i]; }
    }
    if (best) mt_fatal("%s:%d: DeepSpeed key \"%s\" is not one megatron.h reads\nhint: did you mean \"%s\"?", path,
                       line, key, best);
    mt_fatal("%s:%d: DeepSpeed key \"%s\" has no equivalent in megatron.h\nhint: remove it (docs/tutorial.md, "
             "\"DeepSpeed\", lists the keys read and what each becomes)", path, line, key);
}

// the value at the cursor into v (the cursor moves past it)
static void mt__ds_read_value(mt_json *j, const char *path, const char *key, mt__ds_value *v, int line) {
    mt_json_ws(j);
    const char *q = j->p;
    mt_json_type type = mt_json_skip(j);
    if (j->err) return;
    memset(v, 0, sizeof *v);
    v->given = type != MT_JSON_NULL;
    v->type = type;
    v->line = line;
    size_t lit = (size_t)(j->p - q);
    if (type == MT_JSON_OBJECT) mt_fatal("%s:%d: \"%s\" is a value, not an object\nhint: see DeepSpeed's config "
                                         "documentation for its form", path, line, key);
    if (type == MT_JSON_STRING || type == MT_JSON_NUMBER) {
        if (lit >= sizeof v->text) mt_fatal("%s:%d: the value of \"%s\" is too long\nhint: a number or a short "
                                            "string (at most %zu characters)", path, line, key, sizeof v->text - 1);
        if (type == MT_JSON_NUMBER) {
            memcpy(v->text, q, lit);
            v->text[lit] = 0;
            v->num = strtod(v->text, NULL);
        } else {
            mt_json s = *j;
            size_t n = 0;
            s.p = q;
            if (!mt_json_string_at(&s, v->text, &n)) mt_fatal("%s:%d: \"%s\": %s", path, line, key, s.err);
            v->text[n] = 0;
            v->is_auto = strcmp(v->text, "auto") == 0;
        }
    } else if (type == MT_JSON_TRUE || type == MT_JSON_FALSE) {
        v->num = type == MT_JSON_TRUE;
        snprintf(v->text, sizeof v->text, "%s", type == MT_JSON_TRUE ? "true" : "false");
    } else if (type == MT_JSON_ARRAY) {   // betas: [beta1, beta2]
        mt_json a = *j;
        a.p = q;
        int ok = mt_json_eat(&a, '[') && mt_json_number(&a, &v->num) && mt_json_eat(&a, ',') &&
                 mt_json_number(&a, &v->num2) && mt_json_eat(&a, ']');
        if (!ok || strcmp(key, "optimizer.params.betas") != 0)
            mt_fatal("%s:%d: \"%s\" is %s, not a list\nhint: betas is the only list read: [beta1, beta2]", path, line,
                     key, strcmp(key, "optimizer.params.betas") == 0 ? "[beta1, beta2] (two numbers)" : "one value");
        snprintf(v->text, sizeof v->text, "[%.9g, %.9g]", v->num, v->num2);
    }
}

static int mt__ds_is_object(const char *key) {
    for (size_t i = 0; i < sizeof mt__ds_objects / sizeof mt__ds_objects[0]; i++)
        if (strcmp(mt__ds_objects[i], key) == 0) return 1;
    return 0;
}

// the object at the cursor, its keys prefixed with `prefix.` ("" at the top)
static void mt__ds_read_object(mt_json *j, mt__ds_map *m, const char *prefix) {
    if (!mt_json_expect(j, '{', "expected an object { ... }")) return;
    if (mt_json_eat(j, '}')) return;
    do {
        char key[96], full[200];
        if (!mt_json_key(j, key, sizeof key)) return;
        snprintf(full, sizeof full, "%s%s%s", prefix, prefix[0] ? "." : "", key);
        mt_json_ws(j);
        int line = mt_json_line(j);
        if (mt__ds_is_object(full)) {
            if (!(j->p < j->end && *j->p == '{'))
                mt_fatal("%s:%d: \"%s\" is an object { ... }\nhint: e.g. \"%s\": {%s}", m->path, line, full, key,
                         strcmp(full, "zero_optimization") == 0 ? "\"stage\": 1" : " ... ");
            mt__ds_read_object(j, m, full);
            if (j->err) return;
            continue;
        }
        mt__ds_value *v = mt__ds_get(m, full);
        if (!v) mt__ds_unknown_key(m->path, line, full);
        mt__ds_read_value(j, m->path, full, v, line);
        if (j->err) return;
    } while (mt_json_eat(j, ','));
    mt_json_expect(j, '}', "expected ',' or '}'");
}

// the number of a key that must be one (v->given and not "auto")
static double mt__ds_number(const mt__ds_map *m, const char *key, const mt__ds_value *v) {
    if (v->type != MT_JSON_NUMBER || !isfinite(v->num))
        mt_fatal("%s:%d: \"%s\" is a number, got %s\nhint: e.g. \"%s\": 1 (or \"auto\": our flag's value)",
                 m->path, v->line, key, v->text[0] ? v->text : "a list", strrchr(key, '.') ? strrchr(key, '.') + 1
                                                                                        : key);
    return v->num;
}
static long long mt__ds_whole(const mt__ds_map *m, const char *key, const mt__ds_value *v, long long lo) {
    double d = mt__ds_number(m, key, v);
    if (d != floor(d) || d < (double)lo || d > 2147483647.0)
        mt_fatal("%s:%d: \"%s\" is a whole number of at least %lld, got %s\nhint: e.g. %lld (or \"auto\": our flag's "
                 "value)", m->path, v->line, key, lo, v->text, lo > 1 ? lo : 1);
    return (long long)d;
}
static int mt__ds_bool(const mt__ds_map *m, const char *key, const mt__ds_value *v) {
    if (v->type != MT_JSON_TRUE && v->type != MT_JSON_FALSE)
        mt_fatal("%s:%d: \"%s\" is true or false, got %s\nhint: write true or false (or \"auto\": our flag)",
                 m->path, v->line, key, v->text);
    return v->type == MT_JSON_TRUE;
}

// is flag f given: on the command line (--f V or --f=V), or its field away from the default?
static int mt__ds_flag_given(const mt__ds_map *m, const mt_config *cfg, const mt__flag *f) {
    size_t len = strlen(f->name);
    for (int i = 1; m->argv && i < m->argc; i++)
        if (strncmp(m->argv[i], f->name, len) == 0 && (m->argv[i][len] == 0 || m->argv[i][len] == '=')) return 1;
    const char *a = (const char *)cfg + f->offset, *b = (const char *)&m->defaults + f->offset;
    switch (f->type) {
    case MT__INT: case MT__BOOL: return *(const int *)a != *(const int *)b;
    case MT__FLOAT: return *(const float *)a != *(const float *)b;
    case MT__DOUBLE: return *(const double *)a != *(const double *)b;
    case MT__STR: return strcmp(a, b) != 0;
    default: return 0;
    }
}
static void mt__ds_flag_text(const mt_config *cfg, const mt__flag *f, char *out, size_t cap) {
    const char *a = (const char *)cfg + f->offset;
    switch (f->type) {
    case MT__INT: snprintf(out, cap, "%d", *(const int *)a); break;
    case MT__BOOL: snprintf(out, cap, "%s", *(const int *)a ? "on" : "off"); break;
    case MT__FLOAT: snprintf(out, cap, "%g", (double)*(const float *)a); break;
    case MT__DOUBLE: snprintf(out, cap, "%g", *(const double *)a); break;
    case MT__STR: snprintf(out, cap, "%s", a); break;
    default: out[0] = 0;
    }
}

// flag := text (what key says, at line); an error if the flag was given with another value
static void mt__ds_set(mt__ds_map *m, mt_config *cfg, const char *flag, const char *text, const char *key, int line) {
    const mt__flag *f = mt__find_flag(flag);
    mt_config probe_cfg = *cfg, *probe = &probe_cfg;   // on the stack: an error here leaks nothing
    mt__set_flag(probe, f, &text, 1);
    size_t size = f->type == MT__STR ? f->size : f->type == MT__DOUBLE ? sizeof(double)
                : f->type == MT__FLOAT ? sizeof(float) : sizeof(int);   // the types mapped onto
    const char *now = (const char *)cfg + f->offset, *want = (const char *)probe + f->offset;
    int differs = f->type == MT__STR ? strcmp(now, want) != 0 : memcmp(now, want, size) != 0;
    if (differs && mt__ds_flag_given(m, cfg, f)) {
        char ours[128];
        mt__ds_flag_text(cfg, f, ours, sizeof ours);
        mt_fatal("%s:%d: \"%s\" says %s %s, but the command line says %s %s\nhint: drop one of the two, or write "
                 "\"auto\" in the file to keep the flag's value", m->path, line, key, flag, text, flag, ours);
    }
    memcpy((char *)cfg + f->offset, want, size);
    int in_params = strncmp(key, "optimizer.params.", 17) == 0 || strncmp(key, "scheduler.params.", 17) == 0;
    mt__ds_list_add(m->mapped, sizeof m->mapped, "%s -> %s %s", in_params ? key + 17 : key, flag, text);
}
static void mt__ds_set_number(mt__ds_map *m, mt_config *cfg, const char *flag, double value, const char *key,
                              int line) {
    char text[64];
    if (value == floor(value) && fabs(value) < 1e15) snprintf(text, sizeof text, "%.0f", value);   // a count
    else for (int digits = 1; digits <= 17; digits++) {   // the shortest text that reads back as value
        snprintf(text, sizeof text, "%.*g", digits, value);
        if (strtod(text, NULL) == value) break;
    }
    mt__ds_set(m, cfg, flag, text, key, line);
}
// DeepSpeed's default for a parameter the file leaves out of a block it gives (a scheduler's
// warm-up steps, the fp16 scaler's first scale): taken unless the flag is given, which then stays
static void mt__ds_default(mt__ds_map *m, mt_config *cfg, const char *flag, double value, const char *key, int line) {
    if (mt__ds_flag_given(m, cfg, mt__find_flag(flag))) {
        mt__ds_list_add(m->kept, sizeof m->kept, "%s (not in the file: %s kept)", key, flag);
        return;
    }
    mt__ds_set_number(m, cfg, flag, value, key, line);
    strncat(m->mapped, " (DeepSpeed's default)", sizeof m->mapped - strlen(m->mapped) - 1);
}
// a switch the file turns on (on = 1), or says is off (on = 0: an error if the switch is given)
static void mt__ds_switch(mt__ds_map *m, mt_config *cfg, const char *flag, int on, const char *key, int line) {
    const mt__flag *f = mt__find_flag(flag);
    int *field = (int *)((char *)cfg + f->offset);
    if (!on && *field)
        mt_fatal("%s:%d: \"%s\" says off, but the command line says %s\nhint: drop one of the two, or write \"auto\" "
                 "in the file to keep the flag", m->path, line, key, flag);
    *field = on;
}
// a key the file gives that changes nothing here (why: the reason, for the summary)
static void mt__ds_ignore(mt__ds_map *m, const char *key, const char *why) {
    mt__ds_list_add(m->ignored, sizeof m->ignored, "%s%s%s", key, why[0] ? " " : "", why);
}

// zero_optimization: the stage and the offload
static void mt__ds_map_zero(mt__ds_map *m, mt_config *cfg) {
    mt__ds_value *v = mt__ds_get(m, "zero_optimization.stage");
    if (v->is_auto) mt__ds_list_add(m->kept, sizeof m->kept, "zero_optimization.stage");
    else if (v->given) {
        long long stage = mt__ds_whole(m, "zero_optimization.stage", v, 0);
        if (stage == 3)
            mt_fatal("%s:%d: zero_optimization.stage 3 (the parameters sharded too, ZeRO-3) is not implemented in "
                     "megatron.h\nhint: use stage 1 or 2 (the distributed optimizer); tensor and pipeline "
                     "parallelism split the parameters here", m->path, v->line);
        if (stage > 3) mt_fatal("%s:%d: zero_optimization.stage %lld: DeepSpeed's stages are 0 to 3\nhint: 0, 1 or 2 "
                                "here", m->path, v->line, stage);
        mt__ds_switch(m, cfg, "--use-distributed-optimizer", stage > 0, "zero_optimization.stage", v->line);
        cfg->parallel.zero_stage = (int)stage;
        mt__ds_list_add(m->mapped, sizeof m->mapped, "zero stage %lld -> %s", stage,
                        stage == 0 ? "no sharding"
                        : stage == 1 ? "--use-distributed-optimizer (gradients all-reduced)"
                                     : "--use-distributed-optimizer (gradients reduce-scattered)");
    }
    v = mt__ds_get(m, "zero_optimization.offload_optimizer.device");
    if (v->is_auto) mt__ds_list_add(m->kept, sizeof m->kept, "offload_optimizer.device");
    else if (v->given) {
        if (v->type != MT_JSON_STRING)
            mt_fatal("%s:%d: offload_optimizer.device is a string, got %s\nhint: \"cpu\" or \"none\"", m->path,
                     v->line, v->text);
        if (strcmp(v->text, "nvme") == 0)
            mt_fatal("%s:%d: offload_optimizer.device \"nvme\" (ZeRO-Infinity, the optimizer state on an NVMe disk) "
                     "is not implemented in megatron.h\nhint: use \"cpu\" (--optimizer-cpu-offload: pinned host "
                     "memory) or \"none\"", m->path, v->line);
        if (strcmp(v->text, "cpu") != 0 && strcmp(v->text, "none") != 0)
            mt_fatal("%s:%d: offload_optimizer.device \"%s\" is not a device DeepSpeed knows\nhint: \"cpu\" or "
                     "\"none\"", m->path, v->line, v->text);
        int on = strcmp(v->text, "cpu") == 0;
        mt__ds_switch(m, cfg, "--optimizer-cpu-offload", on, "zero_optimization.offload_optimizer.device", v->line);
        mt__ds_list_add(m->mapped, sizeof m->mapped, "offload_optimizer %s -> %s", v->text,
                        on ? "--optimizer-cpu-offload" : "no offload");
    }
    v = mt__ds_get(m, "zero_optimization.offload_optimizer.pin_memory");
    if (v->given) mt__ds_ignore(m, "offload_optimizer.pin_memory", "(the host copies are always pinned)");
}

// optimizer: the type and its parameters
static void mt__ds_map_optimizer(mt__ds_map *m, mt_config *cfg) {
    mt__ds_value *v = mt__ds_get(m, "optimizer.type");
    if (v->given && !v->is_auto) {
        int adam = v->type == MT_JSON_STRING && (strcmp(v->text, "Adam") == 0 || strcmp(v->text, "AdamW") == 0 ||
                                                 strcmp(v->text, "adam") == 0 || strcmp(v->text, "adamw") == 0);
        if (!adam)
            mt_fatal("%s:%d: optimizer.type %s: megatron.h has AdamW only\nhint: \"type\": \"AdamW\" (or \"Adam\": "
                     "DeepSpeed's Adam is AdamW unless adam_w_mode is false)", m->path, v->line, v->text);
        mt__ds_list_add(m->mapped, sizeof m->mapped, "optimizer %s -> AdamW", v->text);
    }
    struct { const char *key, *flag; } plain[] = {{"optimizer.params.lr", "--lr"},
                                                  {"optimizer.params.eps", "--adam-eps"},
                                                  {"optimizer.params.weight_decay", "--weight-decay"}};
    for (size_t i = 0; i < sizeof plain / sizeof plain[0]; i++) {
        v = mt__ds_get(m, plain[i].key);
        if (v->is_auto) mt__ds_list_add(m->kept, sizeof m->kept, "%s", plain[i].key + 17);
        else if (v->given) mt__ds_set_number(m, cfg, plain[i].flag, mt__ds_number(m, plain[i].key, v), plain[i].key,
                                             v->line);
    }
    v = mt__ds_get(m, "optimizer.params.betas");
    if (v->is_auto) mt__ds_list_add(m->kept, sizeof m->kept, "betas");
    else if (v->given) {
        if (v->type != MT_JSON_ARRAY) mt_fatal("%s:%d: optimizer.params.betas is [beta1, beta2], got %s\nhint: e.g. "
                                               "[0.9, 0.95]", m->path, v->line, v->text);
        mt__ds_set_number(m, cfg, "--adam-beta1", v->num, "optimizer.params.betas", v->line);
        mt__ds_set_number(m, cfg, "--adam-beta2", v->num2, "optimizer.params.betas", v->line);
    }
}

// scheduler: DeepSpeed's three warm-up schedules, where they are Megatron's
static void mt__ds_map_scheduler(mt__ds_map *m, mt_config *cfg) {
    mt__ds_value *type = mt__ds_get(m, "scheduler.type");
    static const char *const params[] = {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type",
                                         "total_num_steps", "warmup_min_ratio", "cos_min_ratio"};
    // which parameters each schedule takes (DeepSpeed's constructor arguments)
    static const char *const takes[3] = {"warmup_min_lr warmup_max_lr warmup_num_steps warmup_type",
                                         "warmup_min_lr warmup_max_lr warmup_num_steps warmup_type total_num_steps",
                                         "warmup_min_ratio warmup_num_steps warmup_type total_num_steps cos_min_ratio"};
    static const char *const names[3] = {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR"};
    char key[64];
    int any_param = 0;
    for (size_t i = 0; i < sizeof params / sizeof params[0]; i++) {
        snprintf(key, sizeof key, "scheduler.params.%s", params[i]);
        any_param |= mt__ds_get(m, key)->given;
    }
    if (!type->given) {
        if (any_param) mt_fatal("%s: scheduler.params without scheduler.type\nhint: add \"type\": \"WarmupLR\", "
                                "\"WarmupDecayLR\" or \"WarmupCosineLR\"", m->path);
        return;
    }
    if (type->is_auto) { mt__ds_list_add(m->kept, sizeof m->kept, "scheduler"); return; }
    int kind = -1;
    for (int k = 0; k < 3; k++) if (type->type == MT_JSON_STRING && strcmp(type->text, names[k]) == 0) kind = k;
    if (kind < 0)
        mt_fatal("%s:%d: scheduler.type %s has no Megatron equivalent\nhint: WarmupLR, WarmupDecayLR or "
                 "WarmupCosineLR, or leave \"scheduler\" out and use --lr-decay-style", m->path, type->line,
                 type->text);
    for (size_t i = 0; i < sizeof params / sizeof params[0]; i++) {
        snprintf(key, sizeof key, "scheduler.params.%s", params[i]);
        mt__ds_value *p = mt__ds_get(m, key);
        if (p->given && !strstr(takes[kind], params[i]))
            mt_fatal("%s:%d: %s is not a parameter of %s\nhint: %s takes %s", m->path, p->line, key, names[kind],
                     names[kind], takes[kind]);
    }
    mt__ds_set(m, cfg, "--lr-decay-style", kind == 0 ? "constant" : kind == 1 ? "linear" : "cosine", "scheduler.type",
               type->line);
    // the warm-up: linear from 0, Megatron's only kind
    mt__ds_value *wt = mt__ds_get(m, "scheduler.params.warmup_type");
    if (!wt->given || (!wt->is_auto && strcmp(wt->text, "linear") != 0))
        mt_fatal("%s:%d: scheduler.params.warmup_type is %s: Megatron's warm-up is linear\nhint: add \"warmup_type\": "
                 "\"linear\" to scheduler.params", m->path, wt->given ? wt->line : type->line,
                 wt->given ? wt->text : "not given (DeepSpeed's default: \"log\")");
    const char *start_key = kind == 2 ? "scheduler.params.warmup_min_ratio" : "scheduler.params.warmup_min_lr";
    mt__ds_value *start = mt__ds_get(m, start_key);
    if (mt__ds_number_given(start) && mt__ds_number(m, start_key, start) != 0.0)
        mt_fatal("%s:%d: %s %s: Megatron's warm-up starts from 0\nhint: set it to 0 (or leave it out)", m->path,
                 start->line, start_key, start->text);
    mt__ds_value *steps = mt__ds_get(m, "scheduler.params.warmup_num_steps");
    if (steps->is_auto) mt__ds_list_add(m->kept, sizeof m->kept, "warmup_num_steps");
    else if (steps->given) {
        if (cfg->train.lr_warmup_fraction > 0)
            mt_fatal("%s:%d: scheduler.params.warmup_num_steps says the warm-up, but the command line says "
                     "--lr-warmup-fraction %g\nhint: drop one of the two", m->path, steps->line,
                     cfg->train.lr_warmup_fraction);
        mt__ds_set_number(m, cfg, "--lr-warmup-iters",
                          (double)mt__ds_whole(m, "scheduler.params.warmup_num_steps", steps, 0),
                          "scheduler.params.warmup_num_steps", steps->line);
    } else if (cfg->train.lr_warmup_fraction == 0) {   // DeepSpeed's default: 1000 steps
        mt__ds_default(m, cfg, "--lr-warmup-iters", 1000, "scheduler.params.warmup_num_steps", type->line);
    }
    mt__ds_value *max_lr = mt__ds_get(m, "scheduler.params.warmup_max_lr");
    if (mt__ds_number_given(max_lr))
        mt__ds_set_number(m, cfg, "--lr", mt__ds_number(m, "scheduler.params.warmup_max_lr", max_lr),
                          "scheduler.params.warmup_max_lr", max_lr->line);
    if (kind == 0) return;
    mt__ds_value *total = mt__ds_get(m, "scheduler.params.total_num_steps");
    if (!total->given)
        mt_fatal("%s:%d: %s needs scheduler.params.total_num_steps (where the decay ends)\nhint: add \"total_num_"
                 "steps\": N (or \"auto\": --lr-decay-iters, default --train-iters)", m->path, type->line, names[kind]);
    if (total->is_auto) mt__ds_list_add(m->kept, sizeof m->kept, "total_num_steps");
    else mt__ds_set_number(m, cfg, "--lr-decay-iters",
                           (double)mt__ds_whole(m, "scheduler.params.total_num_steps", total, 1),
                           "scheduler.params.total_num_steps", total->line);
    if (kind == 1) {   // WarmupDecayLR ends at warmup_min_lr, which is 0
        mt__ds_set(m, cfg, "--min-lr", "0", "scheduler.params.warmup_min_lr", type->line);
        return;
    }
    mt__ds_value *ratio = mt__ds_get(m, "scheduler.params.cos_min_ratio");
    if (ratio->is_auto) { mt__ds_list_add(m->kept, sizeof m->kept, "cos_min_ratio"); return; }
    if (ratio->given)
        mt__ds_set_number(m, cfg, "--min-lr",
                          (double)(float)(mt__ds_number(m, "scheduler.params.cos_min_ratio", ratio) *
                                          (double)cfg->train.lr), "scheduler.params.cos_min_ratio", ratio->line);
    else   // DeepSpeed's default ratio: 0.0001
        mt__ds_default(m, cfg, "--min-lr", (double)(float)(0.0001 * (double)cfg->train.lr),
                       "scheduler.params.cos_min_ratio", type->line);
}

// the batch: two of the three keys give the third (DeepSpeed's rule); the check against DP is
// mt_config_derive's, once DP is known
static void mt__ds_map_batch(mt__ds_map *m, mt_config *cfg) {
    mt__ds_value *tb = mt__ds_get(m, "train_batch_size"), *mb = mt__ds_get(m, "train_micro_batch_size_per_gpu"),
                 *gas = mt__ds_get(m, "gradient_accumulation_steps");
    if (mb->is_auto) mt__ds_list_add(m->kept, sizeof m->kept, "train_micro_batch_size_per_gpu");
    else if (mb->given) mt__ds_set_number(m, cfg, "--micro-batch-size",
                                          (double)mt__ds_whole(m, "train_micro_batch_size_per_gpu", mb, 1),
                                          "train_micro_batch_size_per_gpu", mb->line);
    if (tb->is_auto) mt__ds_list_add(m->kept, sizeof m->kept, "train_batch_size");
    else if (tb->given) mt__ds_set_number(m, cfg, "--global-batch-size",
                                          (double)mt__ds_whole(m, "train_batch_size", tb, 1), "train_batch_size",
                                          tb->line);
    if (gas->is_auto) mt__ds_list_add(m->kept, sizeof m->kept, "gradient_accumulation_steps");
    else if (gas->given) {
        int n = (int)mt__ds_whole(m, "gradient_accumulation_steps", gas, 1);
        if (cfg->train.gradient_accumulation_steps > 0 && cfg->train.gradient_accumulation_steps != n)
            mt_fatal("%s:%d: \"gradient_accumulation_steps\" says %d, but the command line says "
                     "--gradient-accumulation-steps %d\nhint: drop one of the two, or write \"auto\" in the file",
                     m->path, gas->line, n, cfg->train.gradient_accumulation_steps);
        cfg->train.gradient_accumulation_steps = n;
        mt__ds_list_add(m->mapped, sizeof m->mapped, "gradient_accumulation_steps %d -> global = micro x DP x %d", n,
                        n);
    }
    // train_batch_size without the micro-batch: DeepSpeed derives it, micro = global / (steps x DP)
    const mt__flag *micro_flag = mt__find_flag("--micro-batch-size");
    if (mt__ds_number_given(tb) && !mb->given && !mt__ds_flag_given(m, cfg, micro_flag)) {
        cfg->train.micro_batch_size = 0;   // mt_config_derive: global / (steps x DP)
        if (cfg->train.gradient_accumulation_steps == 0) cfg->train.gradient_accumulation_steps = 1;
        mt__ds_list_add(m->mapped, sizeof m->mapped, "micro-batch = train_batch_size / (%d x DP)",
                        cfg->train.gradient_accumulation_steps);
    }
}

// fp16 and bf16
static void mt__ds_map_precision(mt__ds_map *m, mt_config *cfg) {
    mt__ds_value *v = mt__ds_get(m, "bf16.enabled");
    if (v->is_auto) mt__ds_list_add(m->kept, sizeof m->kept, "bf16.enabled");
    else if (v->given) {
        int on = mt__ds_bool(m, "bf16.enabled", v);
        if (on && cfg->train.fp16)
            mt_fatal("%s:%d: \"bf16.enabled\" is true, but the command line says --fp16\nhint: drop one of the two",
                     m->path, v->line);
        mt__ds_switch(m, cfg, "--bf16", on, "bf16.enabled", v->line);
        if (on) mt__ds_list_add(m->mapped, sizeof m->mapped, "bf16 -> --bf16");
    }
    v = mt__ds_get(m, "fp16.enabled");
    if (v->is_auto) mt__ds_list_add(m->kept, sizeof m->kept, "fp16.enabled");
    else if (v->given) {
        int on = mt__ds_bool(m, "fp16.enabled", v);
        if (on && cfg->train.bf16)
            mt_fatal("%s:%d: \"fp16.enabled\" is true, but %s says --bf16\nhint: enable one of fp16 and bf16", m->path,
                     v->line, mt__ds_get(m, "bf16.enabled")->given ? "bf16.enabled" : "the command line");
        mt__ds_switch(m, cfg, "--fp16", on, "fp16.enabled", v->line);
        if (on) mt__ds_list_add(m->mapped, sizeof m->mapped, "fp16 -> --fp16");
        // DeepSpeed's scaler starts at 2^16 where the file does not say (Megatron's at 2^32)
        if (on && !mt__ds_get(m, "fp16.initial_scale_power")->given)
            mt__ds_default(m, cfg, "--initial-loss-scale", 65536.0, "fp16.initial_scale_power", v->line);
    }
    // the loss-scale keys: with fp16 only (DeepSpeed reads them only then)
    struct { const char *key, *flag; } scale[] = {{"fp16.loss_scale", "--loss-scale"},
                                                  {"fp16.initial_scale_power", "--initial-loss-scale"},
                                                  {"fp16.loss_scale_window", "--loss-scale-window"},
                                                  {"fp16.hysteresis", "--hysteresis"},
                                                  {"fp16.min_loss_scale", "--min-loss-scale"}};
    for (size_t i = 0; i < sizeof scale / sizeof scale[0]; i++) {
        v = mt__ds_get(m, scale[i].key);
        if (!v->given) continue;
        if (v->is_auto) { mt__ds_list_add(m->kept, sizeof m->kept, "%s", scale[i].key); continue; }
        if (!cfg->train.fp16) { mt__ds_ignore(m, scale[i].key, "(fp16 off)"); continue; }
        double x = mt__ds_number(m, scale[i].key, v);
        if (i == 1) x = ldexp(1.0, (int)mt__ds_whole(m, scale[i].key, v, 0));   // 2^initial_scale_power
        else if (i == 2 || i == 3) x = (double)mt__ds_whole(m, scale[i].key, v, 1);
        mt__ds_set_number(m, cfg, scale[i].flag, x, scale[i].key, v->line);
    }
}

void mt_config_load_deepspeed(mt_config *cfg, const char *path, int argc, char **argv, char *summary, size_t cap) {
    size_t len;
    char *text = mt__read_config_text(path, "--deepspeed_config", &len);
    mt__ds_map map, *m = &map;   // on the stack (the parse runs on the main thread): errors leak nothing
    memset(m, 0, sizeof *m);
    m->path = path;
    m->argc = argc;
    m->argv = argv;
    mt_config_defaults(&m->defaults);
    mt_json j;
    mt_json_init(&j, text, len, 0);
    mt_json_ws(&j);
    if (j.p >= j.end || *j.p != '{') mt_fatal("%s:%d: a DeepSpeed config is one JSON object { ... }\nhint: e.g. "
                                              "{\"zero_optimization\": {\"stage\": 1}}", path, mt_json_line(&j));
    mt__ds_read_object(&j, m, "");
    if (!j.err) { mt_json_ws(&j); if (j.p != j.end) mt_json_fail(&j, "text after the closing '}'"); }
    if (j.err) mt_fatal("%s:%d: %s\nhint: a DeepSpeed config is JSON (DeepSpeed's json.load reads it)", path,
                        mt_json_line(&j), j.err);
    free(text);
    // each group of keys onto its flags; the order matters only where a key reads another's
    // result (the cosine schedule's --min-lr is a ratio of the optimizer's --lr)
    mt__ds_map_zero(m, cfg);
    mt__ds_map_optimizer(m, cfg);
    mt__ds_map_scheduler(m, cfg);
    mt__ds_map_batch(m, cfg);
    mt__ds_value *v = mt__ds_get(m, "gradient_clipping");
    if (v->is_auto) mt__ds_list_add(m->kept, sizeof m->kept, "gradient_clipping");
    else if (v->given) mt__ds_set_number(m, cfg, "--clip-grad", mt__ds_number(m, "gradient_clipping", v),
                                         "gradient_clipping", v->line);
    mt__ds_map_precision(m, cfg);
    v = mt__ds_get(m, "steps_per_print");
    if (v->is_auto) mt__ds_list_add(m->kept, sizeof m->kept, "steps_per_print");
    else if (v->given) mt__ds_set_number(m, cfg, "--log-interval", (double)mt__ds_whole(m, "steps_per_print", v, 1),
                                         "steps_per_print", v->line);
    if (mt__ds_get(m, "wall_clock_breakdown")->given)
        mt__ds_ignore(m, "wall_clock_breakdown", "(the iteration line always shows the step's timers)");
    if (summary && cap)
        snprintf(summary, cap, "deepspeed config %s: %s%s%s%s%s", path, m->mapped[0] ? m->mapped : "nothing mapped",
                 m->kept[0] ? "; auto (our flags kept): " : "", m->kept, m->ignored[0] ? "; ignored: " : "", m->ignored);
}

void mt_print_help(FILE *f) {
    fprintf(f, "usage: train_gpt [flags]   (Megatron-LM's pretrain_gpt.py flags; values after a space or '=')\n");
    fprintf(f, "       train_gpt --load DIR [generation flags]   generation mode, no --train-iters (Megatron's "
               "tools/generate_samples_gpt.py): the model from the checkpoint, a KV cache, a report of tokens/s, "
               "latency and memory\n");
    const char *groups[] = {"model", "parallel", "training", "data", "logging", "checkpointing", "generation",
                            "ignored"};
    // the flags a training run cannot do without (the others have working defaults)
    static const char *required[][2] = {{"--train-iters", " [required]"}, {"--data-path", " [required]"},
                                        {"--vocab-file", " [required for GPT2BPETokenizer]"},
                                        {"--merge-file", " [required for GPT2BPETokenizer]"}};
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
            // a help text that states its own default (a derived one) gets no second, raw one
            if (strstr(fl->help, "default")) def[0] = 0;
            const char *req = "";
            for (size_t k = 0; k < sizeof required / sizeof required[0]; k++)
                if (strcmp(fl->name, required[k][0]) == 0) { req = required[k][1]; def[0] = 0; }
            fprintf(f, "  %-42s %s%s%s%s%s\n", fl->name, fl->help, def[0] ? " [default " : "", def, def[0] ? "]" : "",
                    req);
        }
    }
    fprintf(f, "\n"
               "(0 for a size means 'derive it': ffn = 4*hidden, max positions = seq length, global batch = "
               "micro*DP)\n");
}

int mt_pad_vocab_size(int vocab_size, int divisible_by, int tp_size) {
    // Megatron's _vocab_size_with_padding: round up to a multiple of divisible_by * TP, so
    // every TP rank holds the same number of embedding rows. (In 64 bits: the caller checks
    // that the result fits in an int; mt_config_derive does.)
    if (divisible_by < 1 || tp_size < 1 || vocab_size < 1)
        mt_fatal("cannot pad a vocabulary of %d to a multiple of %d x TP %d\n"
                 "hint: --make-vocab-size-divisible-by and TP must be at least 1", vocab_size, divisible_by, tp_size);
    int64_t multiple = (int64_t)divisible_by * tp_size;
    int64_t padded = ((int64_t)vocab_size + multiple - 1) / multiple * multiple;
    return padded > INT32_MAX ? INT32_MAX : (int)padded;
}

// every size the model keeps in an int must fit in one, products included (4C, 3C, Vp*TP, B*T):
// checked once here in 64 bits, so later int arithmetic cannot overflow
#define MT__MAX_DIM 1048576   /* 2^20: far above any GPT's hidden size, sequence or batch */
static void mt__check_range(const char *flag, long long v, long long lo, long long hi) {
    if (v < lo || v > hi) mt_fatal("%s %lld is out of range\nhint: use a value from %lld to %lld", flag, v, lo, hi);
}

// every number in its range (sizes small enough that every product the model forms fits)
static void mt__derive_check_ranges(mt_config *cfg) {
    mt_model_config *m = &cfg->model;
    mt_parallel_config *p = &cfg->parallel;
    mt_train_config *t = &cfg->train;
    if (m->num_layers <= 0 || m->hidden_size <= 0 || m->num_attention_heads <= 0 || m->seq_length <= 0)
        mt_fatal("--num-layers, --hidden-size, --num-attention-heads and --seq-length must be positive");
    // sizes: 0 means "derive it"; anything else must be positive and small enough that every
    // product the model forms (4C, 3C, Vp x C rows, B x T) fits in its int
    mt__check_range("--hidden-size", m->hidden_size, 1, MT__MAX_DIM);
    mt__check_range("--num-layers", m->num_layers, 1, 65536);
    mt__check_range("--seq-length", m->seq_length, 1, MT__MAX_DIM);
    mt__check_range("--ffn-hidden-size", m->ffn_hidden_size, 0, 4 * MT__MAX_DIM);
    mt__check_range("--max-position-embeddings", m->max_position_embeddings, 0, MT__MAX_DIM);
    mt__check_range("--vocab-size", m->vocab_size, 0, 64 * MT__MAX_DIM);
    mt__check_range("--make-vocab-size-divisible-by", m->make_vocab_size_divisible_by, 1, MT__MAX_DIM);
    // (0: derived from a DeepSpeed config's train_batch_size, see mt__derive_batch)
    mt__check_range("--micro-batch-size", t->micro_batch_size, t->gradient_accumulation_steps > 0 ? 0 : 1,
                    MT__MAX_DIM);
    mt__check_range("--global-batch-size", t->global_batch_size, 0, 1LL << 30);
    mt__check_range("--nproc-per-node", p->nproc_per_node, 0, 4096);
    mt__check_range("--distributed-timeout-minutes", p->distributed_timeout_minutes, 1, 100000);
    if (!(p->dist_timeout >= 0 && p->dist_timeout <= 1e7))
        mt_fatal("--dist-timeout %g is out of range\nhint: seconds, e.g. --dist-timeout 30", p->dist_timeout);
    mt__check_range("--tensor-model-parallel-size", p->tensor_model_parallel_size, 1, 4096);
    mt__check_range("--pipeline-model-parallel-size", p->pipeline_model_parallel_size, 1, 4096);
    mt__check_range("--num-layers-per-virtual-pipeline-stage", p->num_layers_per_virtual_pipeline_stage, 0, 65536);
    mt__check_range("--ddp-bucket-size", p->ddp_bucket_size, 1, 1LL << 40);
    mt__check_range("--train-iters", t->train_iters, 0, INT32_MAX / 2);
    mt__check_range("--tokens-to-generate", t->tokens_to_generate, 0, MT__MAX_DIM);
    mt__check_range("--top-k", t->top_k, 0, INT32_MAX);
    mt__check_range("--out-seq-length", t->out_seq_length, 0, MT__MAX_DIM);
    mt__check_range("--num-samples", t->num_samples, 0, 1 << 24);
    if (!(t->top_p >= 0.0f && t->top_p <= 1.0f)) mt_fatal("--top-p %g is outside [0, 1]\nhint: e.g. --top-p 0.95",
                                                          (double)t->top_p);
    if (!(t->temperature >= 0.0f)) mt_fatal("--temperature %g is negative\nhint: 0 is greedy, 1 samples as trained",
                                            (double)t->temperature);
    mt__check_range("--eval-iters", t->eval_iters, 0, INT32_MAX / 2);
    mt__check_range("--eval-interval", t->eval_interval, 0, INT32_MAX);
    mt__check_range("--save-interval", t->save_interval, 0, INT32_MAX);
    mt__check_range("--exit-interval", t->exit_interval, 0, INT32_MAX);
    mt__check_range("--lr-warmup-iters", t->lr_warmup_iters, 0, INT32_MAX / 2);
    mt__check_range("--lr-decay-iters", t->lr_decay_iters, 0, INT32_MAX / 2);
    mt__check_range("--loss-scale-window", t->loss_scale_window, 1, INT32_MAX);
    mt__check_range("--hysteresis", t->hysteresis, 1, INT32_MAX);
    if (!(t->lr_warmup_fraction >= 0 && t->lr_warmup_fraction <= 1))
        mt_fatal("--lr-warmup-fraction must be in [0, 1], got %g", t->lr_warmup_fraction);
    if (!(t->weight_decay >= 0) || !(t->clip_grad >= 0) || !(t->adam_eps >= 0))
        mt_fatal("--weight-decay, --clip-grad and --adam-eps must be >= 0");
    if (!(t->adam_beta1 >= 0 && t->adam_beta1 < 1) || !(t->adam_beta2 >= 0 && t->adam_beta2 < 1))
        mt_fatal("--adam-beta1 and --adam-beta2 must be in [0, 1), got %g and %g", (double)t->adam_beta1,
                 (double)t->adam_beta2);
    // real numbers: NaN and infinities are refused by the parser; here the ranges
    if (!(m->init_method_std >= 0)) mt_fatal("--init-method-std must be >= 0, got %g", (double)m->init_method_std);
    if (!(t->lr >= 0) || !(t->min_lr >= 0)) mt_fatal("--lr and --min-lr must be >= 0\nhint: e.g. --lr 3e-4");
    if (!(t->temperature >= 0))
        mt_fatal("--temperature must be >= 0 (0 = greedy), got %g", (double)t->temperature);
}

// the model: the sizes derived from others (0 = derive), and what must divide what
static void mt__derive_model(mt_config *cfg) {
    mt_model_config *m = &cfg->model;
    if (m->ffn_hidden_size == 0) m->ffn_hidden_size = 4 * m->hidden_size;
    if (m->max_position_embeddings == 0) m->max_position_embeddings = m->seq_length;
    if (m->vocab_size == 0) m->vocab_size = 50257;   // GPT-2's; the trainer sets it from the vocab file
    if (m->hidden_size % m->num_attention_heads)
        mt_fatal("--hidden-size %d is not divisible by --num-attention-heads %d\n"
                 "hint: pick heads that divide the hidden size", m->hidden_size, m->num_attention_heads);
    if (m->seq_length > m->max_position_embeddings)
        mt_fatal("--seq-length %d is longer than --max-position-embeddings %d\nhint: raise --max-position-embeddings",
                 m->seq_length, m->max_position_embeddings);
    if (!(m->hidden_dropout >= 0 && m->hidden_dropout < 1) || !(m->attention_dropout >= 0 && m->attention_dropout < 1))
        mt_fatal("dropout probabilities must be in [0, 1): --hidden-dropout %g, --attention-dropout %g",
                 (double)m->hidden_dropout, (double)m->attention_dropout);
}

// the layout: world = TP x PP x DP, the heads, the MLP and the layers split evenly, virtual stages
static void mt__derive_layout(mt_config *cfg) {
    mt_model_config *m = &cfg->model;
    mt_parallel_config *p = &cfg->parallel;
    int TP = p->tensor_model_parallel_size, PP = p->pipeline_model_parallel_size;
    if (TP < 1 || PP < 1) mt_fatal("--tensor-model-parallel-size and --pipeline-model-parallel-size must be at least "
                                   "1");
    if (m->num_attention_heads % TP)
        mt_fatal("--num-attention-heads %d is not divisible by --tensor-model-parallel-size %d\n"
                 "hint: each TP rank holds NH/TP whole heads; use a TP that divides %d",
                 m->num_attention_heads, TP, m->num_attention_heads);
    if (m->ffn_hidden_size % TP)
        mt_fatal("--ffn-hidden-size %d is not divisible by --tensor-model-parallel-size %d\n"
                 "hint: use a TP that divides it", m->ffn_hidden_size, TP);
    if (m->num_layers % PP)
        mt_fatal("--num-layers %d is not divisible by --pipeline-model-parallel-size %d\n"
                 "hint: every stage holds L/PP layers; use a PP that divides %d", m->num_layers, PP, m->num_layers);
    // the world: the ranks of this process (--nproc-per-node threads; TP*PP by default when it is
    // the only process, 1 under a launcher that starts one process per rank) times the processes
    int procs = p->num_processes > 1 ? p->num_processes : 1;
    int per_process = p->nproc_per_node > 0 ? p->nproc_per_node : procs > 1 ? 1 : TP * PP;
    if ((long long)procs * per_process > 1 << 20)
        mt_fatal("%d processes x %d ranks is too many ranks", procs, per_process);
    int world = procs * per_process;
    if (world % (TP * PP) && procs > 1)
        mt_fatal("%d ranks (%d processes x %d rank%s each) cannot be split into TP=%d x PP=%d x DP\n"
                 "hint: the ranks of all processes together must be a multiple of TP*PP = %d (start more "
                 "processes, or set --nproc-per-node)",
                 world, procs, per_process, per_process == 1 ? "" : "s", TP, PP, TP * PP);
    if (world % (TP * PP))
        mt_fatal("%d ranks cannot be split into TP=%d x PP=%d x DP\n"
                 "hint: --nproc-per-node must be a multiple of TP*PP = %d", world, TP, PP, TP * PP);
    cfg->world_size = world;
    cfg->data_parallel_size = world / (TP * PP);
    cfg->head_size = m->hidden_size / m->num_attention_heads;
    cfg->padded_vocab_size = mt_pad_vocab_size(m->vocab_size, m->make_vocab_size_divisible_by, TP);
    cfg->virtual_pipeline_size = 1;
    if (p->num_layers_per_virtual_pipeline_stage > 0) {
        int per_stage = m->num_layers / PP;
        if (PP < 2) mt_fatal("--num-layers-per-virtual-pipeline-stage needs --pipeline-model-parallel-size > 1");
        if (per_stage % p->num_layers_per_virtual_pipeline_stage)
            mt_fatal("%d layers per pipeline stage are not divisible by --num-layers-per-virtual-pipeline-stage %d",
                     per_stage, p->num_layers_per_virtual_pipeline_stage);
        cfg->virtual_pipeline_size = per_stage / p->num_layers_per_virtual_pipeline_stage;
    }
    // sequence parallel (Korthikanti et al. 2022) splits the sequence over the TP group: without
    // TP there is no group to split over (Megatron's ModelParallelConfig raises the same error)
    if (p->sequence_parallel && TP < 2)
        mt_fatal("--sequence-parallel needs tensor parallelism (--tensor-model-parallel-size > 1), TP is %d\n"
                 "hint: drop --sequence-parallel, or add --tensor-model-parallel-size 2", TP);
    if (p->sequence_parallel && m->seq_length % TP)
        mt_fatal("--seq-length %d is not divisible by --tensor-model-parallel-size %d (--sequence-parallel)\n"
                 "hint: each TP rank holds T/TP positions of every sample; use a --seq-length that is a multiple of %d",
                 m->seq_length, TP, TP);
}

// the batch: global = micro-batch x DP x micro-batches (the accumulation steps)
static void mt__derive_batch(mt_config *cfg) {
    mt_parallel_config *p = &cfg->parallel;
    mt_train_config *t = &cfg->train;
    int DP = cfg->data_parallel_size, B = t->micro_batch_size, PP = p->pipeline_model_parallel_size;
    int ds = t->deepspeed_config[0] != 0;   // the numbers came from DeepSpeed's keys: say them so
    if (B == 0 && t->gradient_accumulation_steps > 0 && t->global_batch_size > 0) {
        // a DeepSpeed config's train_batch_size without its micro-batch: DeepSpeed derives it
        int per = t->gradient_accumulation_steps * DP;
        if (t->global_batch_size % per)
            mt_fatal("deepspeed config: train_batch_size %d is not divisible by gradient_accumulation_steps %d x "
                     "data-parallel size %d = %d\nhint: give train_micro_batch_size_per_gpu, or a train_batch_size "
                     "that is a multiple of %d", t->global_batch_size, t->gradient_accumulation_steps, DP, per, per);
        B = t->micro_batch_size = t->global_batch_size / per;
    }
    if (B < 1) mt_fatal("--micro-batch-size must be at least 1");
    if (t->gradient_accumulation_steps > 0) {   // older Megatron's way to say the global batch
        int want = B * DP * t->gradient_accumulation_steps;
        if (t->global_batch_size == 0) t->global_batch_size = want;
        else if (t->global_batch_size != want && ds)   // DeepSpeed's own check, in its words
            mt_fatal("deepspeed config: train_batch_size %d is not train_micro_batch_size_per_gpu %d x "
                     "gradient_accumulation_steps %d x data-parallel size %d = %d\nhint: make them agree (DeepSpeed's "
                     "rule), or write \"auto\" for one of them", t->global_batch_size, B,
                     t->gradient_accumulation_steps, DP, want);
        else if (t->global_batch_size != want)
            mt_fatal("--gradient-accumulation-steps %d does not match --global-batch-size %d: micro-batch %d x "
                     "data-parallel size %d x %d steps = %d\nhint: drop one of the two, or make them agree",
                     t->gradient_accumulation_steps, t->global_batch_size, B, DP, t->gradient_accumulation_steps,
                     want);
    }
    if ((int64_t)B * DP > (1LL << 30)) mt_fatal("--micro-batch-size %d x data-parallel size %d is too large", B, DP);
    if (t->global_batch_size == 0) t->global_batch_size = B * DP;
    if (t->global_batch_size % (B * DP))
        mt_fatal("--global-batch-size %d is not divisible by micro-batch-size %d x data-parallel size %d = %d\n"
                 "hint: use a global batch that is a multiple of %d",
                 t->global_batch_size, B, DP, B * DP, B * DP);
    cfg->num_microbatches = t->global_batch_size / (B * DP);
    if (cfg->virtual_pipeline_size > 1 && cfg->num_microbatches % PP)
        mt_fatal("the interleaved schedule needs the number of micro-batches (%d) to be a multiple of PP (%d)\n"
                 "hint: change --global-batch-size", cfg->num_microbatches, PP);
}

// the learning-rate schedule (Megatron's OptimizerParamScheduler's inputs)
static void mt__derive_lr(mt_config *cfg) {
    mt_train_config *t = &cfg->train;
    if (strcmp(t->lr_decay_style, "constant") == 0) cfg->lr_decay = MT_LR_CONSTANT;
    else if (strcmp(t->lr_decay_style, "linear") == 0) cfg->lr_decay = MT_LR_LINEAR;
    else if (strcmp(t->lr_decay_style, "cosine") == 0) cfg->lr_decay = MT_LR_COSINE;
    else mt_fatal("--lr-decay-style '%s' is not known\nhint: use constant, linear or cosine", t->lr_decay_style);
    if (t->lr_decay_iters == 0) t->lr_decay_iters = t->train_iters;
    cfg->lr_decay_steps = t->lr_decay_iters;
    // Megatron keeps the warm-up length as a real number (fraction x decay steps)
    cfg->lr_warmup_steps = t->lr_warmup_fraction > 0 ? t->lr_warmup_fraction * (double)t->lr_decay_iters
                                                     : (double)t->lr_warmup_iters;
    if (cfg->lr_warmup_steps > cfg->lr_decay_steps && cfg->lr_decay != MT_LR_CONSTANT)
        mt_fatal("lr warm-up (%g iterations) is longer than lr decay (%d)\n"
                 "hint: raise --lr-decay-iters or lower the warm-up", cfg->lr_warmup_steps, cfg->lr_decay_steps);
}

// activation recompute, as Megatron's arguments.py reads its flags
static void mt__derive_recompute(mt_config *cfg) {
    mt_train_config *t = &cfg->train;
    const char *gran = t->recompute_activations ? "selective" : t->recompute_granularity;
    cfg->recompute = MT_RECOMPUTE_NONE;
    cfg->recompute_num_layers = t->recompute_num_layers;
    if (t->recompute_activations && t->recompute_granularity[0] && strcmp(t->recompute_granularity, "selective"))
        mt_fatal("--recompute-activations means --recompute-granularity selective, not %s\nhint: give one of the two",
                 t->recompute_granularity);
    if (strcmp(gran, "selective") == 0) cfg->recompute = MT_RECOMPUTE_SELECTIVE;
    else if (strcmp(gran, "full") == 0) {
        if (strcmp(t->recompute_method, "uniform") == 0) cfg->recompute = MT_RECOMPUTE_UNIFORM;
        else if (strcmp(t->recompute_method, "block") == 0) cfg->recompute = MT_RECOMPUTE_BLOCK;
        else mt_fatal("--recompute-granularity full needs --recompute-method uniform or block (got '%s')\n"
                      "hint: e.g. --recompute-method uniform --recompute-num-layers 1", t->recompute_method);
        if (t->recompute_num_layers < 1)
            mt_fatal("--recompute-num-layers %d: recompute needs at least one layer per group\nhint: e.g. 1",
                     t->recompute_num_layers);
    } else if (gran[0]) {
        mt_fatal("--recompute-granularity '%s' is not known\nhint: full or selective", gran);
    } else if (t->recompute_method[0]) {
        mt_fatal("--recompute-method %s without --recompute-granularity full\nhint: add --recompute-granularity full",
                 t->recompute_method);
    }
}

// the compute type, and loss scaling's flags (Megatron's DynamicGradScaler asserts the same)
static void mt__derive_precision(mt_config *cfg) {
    mt_train_config *t = &cfg->train;
    if (t->fp16 && t->bf16) mt_fatal("--fp16 and --bf16 exclude each other\nhint: give one of the two");
    cfg->compute_dtype = t->fp16 ? MT_DTYPE_FP16 : t->bf16 ? MT_DTYPE_BF16 : MT_DTYPE_FP32;
    if (!(t->loss_scale >= 0.0f) || isinf(t->loss_scale))
        mt_fatal("--loss-scale %g must be positive (or 0: dynamic scaling)\nhint: e.g. --loss-scale 1024",
                 (double)t->loss_scale);
    if (!(t->initial_loss_scale > 0.0f) || isinf(t->initial_loss_scale))
        mt_fatal("--initial-loss-scale %g must be positive\nhint: Megatron's default is 4294967296 (2^32)",
                 (double)t->initial_loss_scale);
    if (!(t->min_loss_scale > 0.0f) || t->min_loss_scale > t->initial_loss_scale)
        mt_fatal("--min-loss-scale %g must be positive and at most --initial-loss-scale %g\nhint: e.g. "
                 "--min-loss-scale 1", (double)t->min_loss_scale, (double)t->initial_loss_scale);
}

// the optimizer's placement: --optimizer-cpu-offload (all of it: Megatron's fraction 1.0), and the
// ZeRO stage a DeepSpeed config chose (it rides on the distributed optimizer)
static void mt__derive_optimizer(mt_config *cfg) {
    mt_train_config *t = &cfg->train;
    mt_parallel_config *p = &cfg->parallel;
    if (!(t->optimizer_offload_fraction >= 0.0 && t->optimizer_offload_fraction <= 1.0))
        mt_fatal("--optimizer-offload-fraction %g must be in [0, 1]", t->optimizer_offload_fraction);
    if (t->optimizer_offload_fraction != 1.0)
        mt_fatal("--optimizer-offload-fraction %g: only 1.0 (all of the optimizer on the host) is implemented here\n"
                 "hint: drop it (1.0 is the default) and give --optimizer-cpu-offload, or give neither to keep the "
                 "optimizer on the device", t->optimizer_offload_fraction);
    mt__check_range("--optimizer-offload-threads", t->optimizer_offload_threads, 0, 256);
    if (p->zero_stage < 0 || p->zero_stage > 2) mt_fatal("ZeRO stage %d: 0, 1 or 2 here", p->zero_stage);
    if (p->zero_stage > 0) p->use_distributed_optimizer = 1;
}

// checks the configuration and fills the derived fields, in the order of the steps above
// (Megatron's validate_args); idempotent, so calling it twice changes nothing
void mt_config_derive(mt_config *cfg) {
    mt__derive_check_ranges(cfg);
    mt__derive_model(cfg);
    mt__derive_layout(cfg);
    mt__derive_batch(cfg);
    mt__derive_lr(cfg);
    mt__derive_recompute(cfg);
    mt__derive_precision(cfg);
    mt__derive_optimizer(cfg);
    mt_train_config *t = &cfg->train;
    if (t->log_interval < 1) t->log_interval = 1;
    if (t->tensorboard_log_interval < 1) t->tensorboard_log_interval = 1;
}

void mt_print_config(const mt_config *cfg, FILE *f) {
    const mt_model_config *m = &cfg->model;
    fprintf(f, "model: L=%d C=%d NH=%d hs=%d F=%d T=%d maxT=%d V=%d Vp=%d\n", m->num_layers, m->hidden_size,
            m->num_attention_heads, cfg->head_size, m->ffn_hidden_size, m->seq_length, m->max_position_embeddings,
            m->vocab_size, cfg->padded_vocab_size);
    fprintf(f, "layout: world=%d TP=%d PP=%d DP=%d virtual stages=%d%s | micro batch %d, global batch %d, %d "
               "micro-batches per rank\n",
            cfg->world_size, cfg->parallel.tensor_model_parallel_size, cfg->parallel.pipeline_model_parallel_size,
            cfg->data_parallel_size, cfg->virtual_pipeline_size,
            cfg->parallel.sequence_parallel ? " sequence-parallel" : "", cfg->train.micro_batch_size,
            cfg->train.global_batch_size, cfg->num_microbatches);
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

// ---------------------------------------------------------------------------------------------
// TensorBoard records: TFRecord framing around Event protobufs, by hand
// ---------------------------------------------------------------------------------------------
// What torch.utils.tensorboard's SummaryWriter (Megatron's writer, megatron/training/global_vars.py
// _set_tensorboard_writer) puts in events.out.tfevents.* files. Each record is
//   uint64 length | uint32 masked_crc32c(length bytes) | data[length] | uint32 masked_crc32c(data)
// (little-endian), so a reader can tell a complete record from one cut short. The data is an
// Event protobuf; we write only the fields TensorBoard needs for scalars:
//   Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
//   Summary { repeated Value value = 1; }   Value { string tag = 1; float simple_value = 2; }
// A protobuf field is a key (field number << 3 | wire type: 0 varint, 1 8 bytes, 2 length-delimited,
// 5 4 bytes) and its value; lengths and integers are varints (7 bits a byte, high bit = more).
uint32_t mt_crc32c(const void *data, size_t n) {
    const unsigned char *p = (const unsigned char *)data;
    uint32_t crc = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {   // bit by bit (reflected polynomial 0x82F63B78): our records are tiny
        crc ^= p[i];
        for (int k = 0; k < 8; k++) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
    }
    return crc ^ 0xFFFFFFFFu;
}

uint32_t mt_tfrecord_masked_crc(const void *data, size_t n) {
    uint32_t crc = mt_crc32c(data, n);
    return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

static size_t mt__pb_varint(unsigned char *out, uint64_t v) {
    size_t n = 0;
    do { out[n++] = (unsigned char)((v & 0x7F) | (v >= 0x80 ? 0x80 : 0)); v >>= 7; } while (v);
    return n;
}

static void mt__le_bytes(unsigned char *out, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++) out[i] = (unsigned char)(v >> (8 * i));
}

size_t mt_tb_event(unsigned char *out, size_t cap, double wall_time, int64_t step, const char *tag, float value) {
    size_t tag_len = tag ? strlen(tag) : 0;
    if (cap < 64 + tag_len) mt_fatal("internal: mt_tb_event needs %zu bytes, has %zu", 64 + tag_len, cap);
    if (tag_len > 100) mt_fatal("internal: TensorBoard tag '%s' is too long", tag);
    size_t n = 0;
    uint64_t bits;
    memcpy(&bits, &wall_time, 8);
    out[n++] = 0x09;                                   // field 1, 8 bytes: wall_time
    mt__le_bytes(out + n, bits, 8);
    n += 8;
    out[n++] = 0x10;                                   // field 2, varint: step
    n += mt__pb_varint(out + n, (uint64_t)step);
    if (!tag) {
        const char *version = "brain.Event:2";
        out[n++] = 0x1a;                               // field 3, string: file_version
        out[n++] = (unsigned char)strlen(version);
        memcpy(out + n, version, strlen(version));
        return n + strlen(version);
    }
    size_t value_len = 2 + tag_len + 5;                // Value: tag (key, len, bytes), simple_value (key, 4)
    size_t summary_len = 1 + 1 + value_len;            // Summary: one Value (key, len < 128, Value)
    out[n++] = 0x2a;                                   // field 5, message: summary
    n += mt__pb_varint(out + n, summary_len);
    out[n++] = 0x0a;                                   // Summary field 1, message: value
    out[n++] = (unsigned char)value_len;
    out[n++] = 0x0a;                                   // Value field 1, string: tag
    out[n++] = (unsigned char)tag_len;
    memcpy(out + n, tag, tag_len);
    n += tag_len;
    uint32_t fbits;
    memcpy(&fbits, &value, 4);
    out[n++] = 0x15;                                   // Value field 2, 4 bytes: simple_value
    mt__le_bytes(out + n, fbits, 4);
    return n + 4;
}

int mt_tfrecord_write(FILE *f, const unsigned char *data, size_t n) {
    unsigned char head[12], foot[4];
    mt__le_bytes(head, (uint64_t)n, 8);
    mt__le_bytes(head + 8, mt_tfrecord_masked_crc(head, 8), 4);
    mt__le_bytes(foot, mt_tfrecord_masked_crc(data, n), 4);
    return fwrite(head, 1, 12, f) == 12 && fwrite(data, 1, n, f) == n && fwrite(foot, 1, 4, f) == 4;
}

static uint64_t mt__le_read(const unsigned char *p, int bytes) {
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

int mt_tfrecord_read(const unsigned char *buf, size_t len, size_t *pos, const unsigned char **data, size_t *n) {
    size_t p = *pos;
    if (len - p < 12) return 0;
    if ((uint32_t)mt__le_read(buf + p + 8, 4) != mt_tfrecord_masked_crc(buf + p, 8)) return -1;
    uint64_t m = mt__le_read(buf + p, 8);
    if (m > len - p - 12 || len - p - 12 - m < 4) return 0;   // cut inside the data or the footer
    if ((uint32_t)mt__le_read(buf + p + 12 + m, 4) != mt_tfrecord_masked_crc(buf + p + 12, (size_t)m)) return -1;
    *data = buf + p + 12;
    *n = (size_t)m;
    *pos = p + 16 + (size_t)m;
    return 1;
}

// ---------------------------------------------------------------------------------------------
// spans: the timeline's raw material, one growing array per rank
// ---------------------------------------------------------------------------------------------
void mt_span_add(mt_span_log *log, const mt_span *s) {
    if (!log || !log->enabled) return;
    if (log->n == log->cap) {
        log->cap = log->cap ? 2 * log->cap : 1024;
        log->spans = (mt_span *)mt_realloc(log->spans, log->cap * sizeof(mt_span), "timeline spans");
    }
    log->spans[log->n] = *s;
    log->spans[log->n].iteration = log->iteration;
    log->n++;
}

void mt_span_log_free(mt_span_log *log) {
    free(log->spans);
    memset(log, 0, sizeof *log);
}

// ---------------------------------------------------------------------------------------------
// the GPU build's errors: every CUDA and NCCL call is checked and ends in mt_fatal too
// ---------------------------------------------------------------------------------------------
#ifdef __CUDACC__   /* (1 of 3) only the GPU build links CUDA and NCCL */
#include <cuda_runtime.h>
#include <nccl.h>
static void mt__cuda_check(cudaError_t err, const char *call, const char *file, int line) {
    if (err == cudaSuccess) return;
    const char *hint = err == cudaErrorMemoryAllocation
                           ? "use a smaller --micro-batch-size or --seq-length, or more tensor/pipeline parallelism"
                           : "run again with MT_SYNC_DEBUG=1 to stop at the op that caused it";
    mt_fatal("CUDA call %s failed: %s (%s) at %s:%d\nhint: %s", call, cudaGetErrorName(err), cudaGetErrorString(err),
             file, line, hint);
}

// the communicator the calling thread is working on (section 2 sets it before each NCCL call),
// so that a failure names the group and the rank, not only the call
static MT_THREAD_LOCAL const mt_comm *mt__nccl_comm = NULL;

static void mt__nccl_check(ncclResult_t res, const char *call, const char *file, int line) {
    if (res == ncclSuccess) return;
    const mt_comm *c = mt__nccl_comm;
    char where[160] = "";
    if (c) snprintf(where, sizeof where, " on group %s (rank %d of %d there, global rank %d)", c->name, c->rank,
                    c->size, c->global_rank);
    const char *detail = "";
#if defined(NCCL_VERSION_CODE) && NCCL_VERSION_CODE >= 21300
    detail = ncclGetLastError(c && c->nccl ? (ncclComm_t)c->nccl : NULL);   // NCCL's own last words
#endif
    mt_fatal("NCCL call %s failed%s: %s%s%s at %s:%d\n"
             "hint: rerun with NCCL_DEBUG=INFO (NCCL_DEBUG_SUBSYS=INIT,NET for start-up) to see why; across nodes "
             "check NCCL_SOCKET_IFNAME and NCCL_IB_TIMEOUT (docs/multinode.md); multi-GPU runs want "
             "NCCL_NVLS_ENABLE=0",
             call, where, ncclGetErrorString(res), detail && *detail ? " - " : "", detail ? detail : "", file, line);
}

#define MT_CUDA_CHECK(x) mt__cuda_check((x), #x, __FILE__, __LINE__)
#define MT_NCCL_CHECK(x) mt__nccl_check((x), #x, __FILE__, __LINE__)
#endif

// =============================================================================================
// 2. RANKS, GROUPS, COMMUNICATORS
// =============================================================================================
// What NCCL does between GPUs, done with threads for the CPU build: every rank is a pthread of
// this one process, so a rank can read and write another rank's buffers directly. A group
// (tp, dp, pp, embd, world) is a small shared struct; a collective is "post my buffers, wait
// for every member, each member does its disjoint part of the work, wait again".
// Mirrors torch.distributed / NCCL (the calls) and megatron/core/parallel_state.py (the groups).
//
//   mt_world   one per process: the registry of groups, one mailbox per rank, the abort flag
//   mt__group  one per group: a barrier (mutex + condition variable + generation counter) and
//              a table where each member posts what it is calling and with which buffers
//   mt_comm    one per (rank, group): the handle a rank passes around, ncclComm_t's role
//
// What the backend promises:
//  - deterministic: a reduction adds rank 0 + rank 1 + ... + rank size-1, in group order and in
//    the buffer's own type, for every element. Results are bit-identical on every rank, in every
//    run, whatever the thread timing, and equal to one thread adding the inputs in that order.
//  - no busy waiting: a rank that waits sleeps in pthread_cond_wait and burns no core.
//  - no hang on errors: mt_fatal in any rank aborts the world, every waiting rank wakes up and
//    ends, and mt_world_run prints the error once and returns 1.

// ---------------------------------------------------------------------------------------------
// shared state: groups, mailboxes, the world
// ---------------------------------------------------------------------------------------------
typedef enum {   // what a member posts that it is calling; all members must agree
    MT__COLL_BARRIER = 0, MT__COLL_ALL_REDUCE, MT__COLL_ALL_REDUCE_DOUBLE,
    MT__COLL_ALL_GATHER, MT__COLL_REDUCE_SCATTER, MT__COLL_BROADCAST
} mt__coll_kind;
static const char *const mt__coll_names[] = {
    "barrier", "all_reduce", "all_reduce_double", "all_gather", "reduce_scatter", "broadcast"
};

typedef struct {         // one member's side of the collective in progress
    int kind;            // mt__coll_kind
    int arg;             // mt_reduce_op for reductions, root for broadcast, 0 otherwise
    size_t n;            // count as the member passed it (per rank for all-gather/reduce-scatter)
    const void *send;    // the member's input buffer
    void *recv;          // the member's output buffer (== send for the in-place calls)
} mt__post;

typedef struct mt__group {
    int size;
    int *members;              // (size,) global ranks in group-rank order; mt_comm.members
    int *joined;               // (size,) member i's mt_comm_init took this group (world->mu)
    struct mt__group *next;    // the world's registry is a list
    pthread_mutex_t mu;        // guards everything below
    pthread_cond_t cv;         // members wait here for the barrier to open
    int arrived;               // members inside the current barrier
    unsigned long generation;  // barriers completed so far
    mt__post *posts;           // (size,) what each member calls, with its buffers
    int aborted;               // the world was aborted (copied here under mu, see abort)
    int *done;                 // (size,) member's rank function has returned
    int n_done;
    int mismatch;              // the last sync 1 found members calling different collectives
    char mismatch_msg[512];
    int remote;                // some members are ranks of other processes: collectives are messages
    int tag;                   // the tag of those messages: the same in every process (negative)
} mt__group;

typedef struct mt__message {   // one buffered send; its floats follow the struct in memory
    struct mt__message *next;
    int tag;
    int acked;                 // 1: its taker counts it in the sender's mailbox (taken_by), which a
                               // batch of pipeline messages waits for, as an NCCL send waits
    size_t n;
    float *data;               // (n,) == (float *)(message + 1)
} mt__message;

typedef struct {               // the mailbox of one destination rank
    pthread_mutex_t mu;        // guards everything below
    pthread_cond_t cv;         // the owner waits here in mt_recv
    mt__message **head;        // (world size,) FIFO of messages per source rank
    mt__message **tail;
    int *src_done;             // (world size,) source's rank function has returned
    unsigned long long *taken_by;   // (world size,) how many of this rank's acked messages each
                               // rank has taken
    int aborted;
} mt__inbox;

typedef struct mt__net mt__net;   // the TCP links to the other processes of the job (below)
static void mt__net_free(mt__net *net);

struct mt_world {
    int size;                  // ranks in the job, in every process together
    int first_rank, local_size;   // this process's ranks: first_rank .. first_rank + local_size - 1
    mt__net *net;              // the other processes (mt_world_create_launched); NULL: one process
    int trace;                 // MT_TRACE=1: one stderr line per collective and send/recv
    pthread_mutex_t mu;        // guards groups (and their joined[]), rank_done, aborted, error
    mt__group *groups;         // registry of every group made by mt_comm_init
    mt__inbox *inbox;          // (size,) inbox[dst]
    int *rank_done;            // (size,) rank's function has returned (for groups made later)
    int aborted;
    char error[2048];          // the first mt_fatal message of a rank (mt_fatal's buffer size)
};
// a rank of this process (a thread here), not of another one
static int mt__is_local(const mt_world *w, int rank) {
    return rank >= w->first_rank && rank < w->first_rank + w->local_size;
}

typedef struct {               // what a rank thread knows about itself
    mt_world *world;
    int rank;
    mt_rank_fn fn;
    void *arg;
} mt__rank_thread;

// set when a rank thread starts: mt_fatal uses it to tell "a rank of a running world" (abort the
// world, end the thread) from "the main program" (print and exit).
static MT_THREAD_LOCAL mt__rank_thread *mt__this_rank = NULL;

mt_world *mt_world_create(int world_size) {
    if (world_size < 1) mt_fatal("world size must be at least 1, got %d", world_size);
    mt_world *w = (mt_world *)mt_calloc(1, sizeof(mt_world), "world");
    w->size = world_size;
    w->local_size = world_size;
    const char *trace = getenv("MT_TRACE");
    w->trace = trace != NULL && trace[0] != '\0' && strcmp(trace, "0") != 0;
    pthread_mutex_init(&w->mu, NULL);
    w->rank_done = (int *)mt_calloc((size_t)world_size, sizeof(int), "world");
    w->inbox = (mt__inbox *)mt_calloc((size_t)world_size, sizeof(mt__inbox), "mailboxes");
    for (int r = 0; r < world_size; r++) {
        mt__inbox *box = &w->inbox[r];
        pthread_mutex_init(&box->mu, NULL);
        pthread_cond_init(&box->cv, NULL);
        box->head = (mt__message **)mt_calloc((size_t)world_size, sizeof(mt__message *), "mailbox");
        box->tail = (mt__message **)mt_calloc((size_t)world_size, sizeof(mt__message *), "mailbox");
        box->src_done = (int *)mt_calloc((size_t)world_size, sizeof(int), "mailbox");
        box->taken_by = (unsigned long long *)mt_calloc((size_t)world_size, sizeof(unsigned long long), "mailbox");
    }
    return w;
}

static mt__group *mt__group_new(const int *members, int size) {
    mt__group *g = (mt__group *)mt_calloc(1, sizeof(mt__group), "group");
    g->size = size;
    g->members = (int *)mt_malloc((size_t)size * sizeof(int), "group members");
    memcpy(g->members, members, (size_t)size * sizeof(int));
    g->joined = (int *)mt_calloc((size_t)size, sizeof(int), "group");
    g->done = (int *)mt_calloc((size_t)size, sizeof(int), "group");
    g->posts = (mt__post *)mt_calloc((size_t)size, sizeof(mt__post), "group");
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    return g;
}

static void mt__group_free(mt__group *g) {
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
    free(g->members);
    free(g->joined);
    free(g->done);
    free(g->posts);
    free(g);
}

void mt_world_destroy(mt_world *w) {
    if (!w) return;
    if (w->net) mt__net_free(w->net);   // first: its reader threads write into the mailboxes
    for (mt__group *g = w->groups; g;) {
        mt__group *next = g->next;
        mt__group_free(g);
        g = next;
    }
    for (int r = 0; r < w->size; r++) {
        mt__inbox *box = &w->inbox[r];
        for (int src = 0; src < w->size; src++) {   // messages nobody received
            for (mt__message *m = box->head[src]; m;) {
                mt__message *next = m->next;
                free(m);
                m = next;
            }
        }
        free(box->head);
        free(box->tail);
        free(box->src_done);
        free(box->taken_by);
        pthread_mutex_destroy(&box->mu);
        pthread_cond_destroy(&box->cv);
    }
    free(w->inbox);
    free(w->rank_done);
    pthread_mutex_destroy(&w->mu);
    free(w);
}

int mt_world_size(const mt_world *w) { return w->size; }

const char *mt_world_error(mt_world *w) {
    pthread_mutex_lock(&w->mu);
    int aborted = w->aborted;
    pthread_mutex_unlock(&w->mu);
    return aborted ? w->error : NULL;   // error is written once, before aborted is set
}

int mt_thread_rank(void) { return mt__this_rank ? mt__this_rank->rank : -1; }

// ---------------------------------------------------------------------------------------------
// abort: how one rank's mt_fatal stops every rank instead of hanging them
// ---------------------------------------------------------------------------------------------
// If rank 2 fails while ranks 0, 1, 3 wait in an all-reduce with it, they would wait forever;
// and exit() from rank 2 would tear the process down under ranks that are still writing files
// or printing. So mt_fatal calls this first. In a rank thread of a multi-rank world it:
//   1. records the message in the world (the first error wins: when all ranks hit the same bad
//      file, the user sees one line, not one per rank),
//   2. sets `aborted` in the world, in every group and in every mailbox, each under that
//      object's own mutex, and broadcasts its condition variable: every waiting rank wakes up,
//      sees the flag and ends its thread with pthread_exit (setting the flag under the same
//      mutex the waiter holds while it checks the flag is what guarantees no wake-up is lost),
//   3. ends the calling thread.
// mt_world_run joins all threads, prints "error: <message>" and returns 1.
// Lock order is always world->mu, then a group's or a mailbox's mu; code that holds a group or
// mailbox mutex never calls mt_fatal (it unlocks first), or this function would deadlock.
// In a job of several processes the first error also goes to every other process (an abort
// message on the TCP channel, section "the TCP channel" below), whose reader thread calls
// mt__world_abort with it: all processes stop with the same line.
static void mt__rank_exit(void) { pthread_exit(NULL); }
static void mt__net_send_abort(mt_world *w, const char *line);   // below, with the TCP channel

// records line as the world's error if it is the first, wakes every waiting rank; 1 if it was first
static int mt__world_abort(mt_world *w, const char *line) {
    pthread_mutex_lock(&w->mu);
    int first = !w->aborted;
    if (first) {
        snprintf(w->error, sizeof w->error, "%s", line);
        w->aborted = 1;
        for (mt__group *g = w->groups; g; g = g->next) {
            pthread_mutex_lock(&g->mu);
            g->aborted = 1;
            pthread_cond_broadcast(&g->cv);
            pthread_mutex_unlock(&g->mu);
        }
        for (int r = 0; r < w->size; r++) {
            pthread_mutex_lock(&w->inbox[r].mu);
            w->inbox[r].aborted = 1;
            pthread_cond_broadcast(&w->inbox[r].cv);
            pthread_mutex_unlock(&w->inbox[r].mu);
        }
    }
    pthread_mutex_unlock(&w->mu);
    return first;
}

static void mt__abort_world_from_rank(const char *msg) {
    mt__rank_thread *self = mt__this_rank;
    if (!self || self->world->size <= 1) return;   // main program or one rank: mt_fatal exits
    mt_world *w = self->world;
    char line[sizeof w->error];
    snprintf(line, sizeof line, "rank %d: %.2000s", self->rank, msg);   // which rank failed
    if (mt__world_abort(w, line) && w->net) mt__net_send_abort(w, line);
    mt__rank_exit();
}

// The other way a rank can wait forever: a partner whose rank function already returned. When
// a rank function returns we mark the rank done in the world, in its groups and in every mailbox
// (under their mutexes, with a broadcast), so a rank that waits for it reports the bug instead of
// hanging. (A group made later copies the world's marks when it is created.)
static void mt__mark_rank_done(mt_world *w, int rank) {
    pthread_mutex_lock(&w->mu);
    w->rank_done[rank] = 1;
    for (mt__group *g = w->groups; g; g = g->next) {
        for (int i = 0; i < g->size; i++) {
            if (g->members[i] != rank) continue;
            pthread_mutex_lock(&g->mu);
            g->done[i] = 1;
            g->n_done++;
            pthread_cond_broadcast(&g->cv);
            pthread_mutex_unlock(&g->mu);
        }
    }
    for (int r = 0; r < w->size; r++) {
        pthread_mutex_lock(&w->inbox[r].mu);
        w->inbox[r].src_done[rank] = 1;
        pthread_cond_broadcast(&w->inbox[r].cv);
        pthread_mutex_unlock(&w->inbox[r].mu);
    }
    pthread_mutex_unlock(&w->mu);
}

// ---------------------------------------------------------------------------------------------
// the NCCL path: device buffers on the GPU build
// ---------------------------------------------------------------------------------------------
// On the GPU build a communicator whose group moves device buffers (tp, dp, embd, p2p) also holds an
// NCCL communicator (c->nccl), and each collective below hands those buffers to NCCL; the
// threads backend keeps host values (losses, norms, barriers, the NCCL ids themselves). Each
// NCCL group has its own stream, ordered after the rank's kernels before the call and before
// the kernels after it (two events), so that its communication can later overlap the kernels.
// On the CPU build c->nccl is always NULL and the functions below do nothing.
#ifdef __CUDACC__   /* (2 of 3) NCCL exists only in the GPU build */
// kernels ... -> record(ev0) -> comm stream waits ev0 -> NCCL -> record(ev1) -> kernels wait ev1
static void mt__nccl_begin(mt_comm *c) {
    MT_CUDA_CHECK(cudaEventRecord((cudaEvent_t)c->events[0], (cudaStream_t)c->compute_stream));
    MT_CUDA_CHECK(cudaStreamWaitEvent((cudaStream_t)c->stream, (cudaEvent_t)c->events[0], 0));
}

static void mt__nccl_end(mt_comm *c) {
    MT_CUDA_CHECK(cudaEventRecord((cudaEvent_t)c->events[1], (cudaStream_t)c->stream));
    MT_CUDA_CHECK(cudaStreamWaitEvent((cudaStream_t)c->compute_stream, (cudaEvent_t)c->events[1], 0));
}

// The counters' seconds on the GPU: an NCCL call returns as soon as it is queued, so its time is
// taken by a pair of timed events around it on the group's stream (ev[2i], ev[2i+1] for call i),
// and mt__nccl_seconds adds the pairs to c->seconds when the counters are read (every log
// interval): the GPU's own time for the calls, and no synchronisation per call.
typedef struct { cudaEvent_t *ev; int n, cap; } mt__nccl_timing;   // n calls pending, cap made
static void mt__nccl_time(mt_comm *c, int end) {
    if (!c->timing) c->timing = mt_calloc(1, sizeof(mt__nccl_timing), "NCCL timing");
    mt__nccl_timing *t = (mt__nccl_timing *)c->timing;
    if (!end && t->n == t->cap) {
        int cap = t->cap ? 2 * t->cap : 64;
        t->ev = (cudaEvent_t *)mt_realloc(t->ev, (size_t)2 * cap * sizeof(cudaEvent_t), "NCCL timing");
        for (int i = 2 * t->cap; i < 2 * cap; i++) MT_CUDA_CHECK(cudaEventCreate(&t->ev[i]));
        t->cap = cap;
    }
    MT_CUDA_CHECK(cudaEventRecord(t->ev[2 * t->n + end], (cudaStream_t)c->stream));
    if (end) t->n++;
}
static void mt__nccl_seconds(mt_comm *c) {
    mt__nccl_timing *t = (mt__nccl_timing *)c->timing;
    if (!t) return;
    for (int i = 0; i < t->n; i++) {
        float ms = 0.0f;
        MT_CUDA_CHECK(cudaEventSynchronize(t->ev[2 * i + 1]));
        MT_CUDA_CHECK(cudaEventElapsedTime(&ms, t->ev[2 * i], t->ev[2 * i + 1]));
        c->seconds += ms / 1000.0;
    }
    t->n = 0;
}
static void mt__nccl_timing_free(mt_comm *c) {
    mt__nccl_timing *t = (mt__nccl_timing *)c->timing;
    if (!t) return;
    for (int i = 0; i < 2 * t->cap; i++) MT_CUDA_CHECK(cudaEventDestroy(t->ev[i]));
    free(t->ev);
    free(t);
    c->timing = NULL;
}

// one collective on device buffers (kind: mt__coll_kind; arg: reduce op, or the root). started:
// the rank's kernels do not wait for it (mt_all_reduce_start); a later call's end, or
// mt_comm_wait's, makes them wait for it with the rest of the group's stream
static void mt__nccl_collective(mt_comm *c, int kind, const float *send, float *recv, size_t n, int arg,
                                int started) {
    mt__nccl_comm = c;   // for mt__nccl_check's message
    ncclComm_t comm = (ncclComm_t)c->nccl;
    cudaStream_t stream = (cudaStream_t)c->stream;
    ncclRedOp_t op = arg == MT_MAX ? ncclMax : ncclSum;
    mt__nccl_begin(c);
    mt__nccl_time(c, 0);
    if (c->spans) c->marks[0] = mt_device_mark(c->spans, c->stream);   // the span: NCCL's own time
    switch (kind) {
    case MT__COLL_ALL_REDUCE: MT_NCCL_CHECK(ncclAllReduce(send, recv, n, ncclFloat, op, comm, stream)); break;
    case MT__COLL_REDUCE_SCATTER: MT_NCCL_CHECK(ncclReduceScatter(send, recv, n, ncclFloat, op, comm, stream)); break;
    case MT__COLL_ALL_GATHER: MT_NCCL_CHECK(ncclAllGather(send, recv, n, ncclFloat, comm, stream)); break;
    case MT__COLL_BROADCAST: MT_NCCL_CHECK(ncclBroadcast(send, recv, n, ncclFloat, arg, comm, stream)); break;
    default: mt_fatal("internal: collective %d has no NCCL path", kind);
    }
    if (c->spans) c->marks[1] = mt_device_mark(c->spans, c->stream);
    mt__nccl_time(c, 1);
    if (started) {
        c->started++;
        return;
    }
    mt__nccl_end(c);
    c->started = 0;
}

// a batch of sends and receives as one NCCL group: every op of it progresses together, so two
// ranks that send to each other in one batch do not wait for each other (mt_p2p_batch)
static void mt__nccl_p2p(mt_comm *c, const mt_p2p_op *ops, int count) {
    mt__nccl_comm = c;   // for mt__nccl_check's message
    ncclComm_t comm = (ncclComm_t)c->nccl;
    cudaStream_t stream = (cudaStream_t)c->stream;
    mt__nccl_begin(c);
    mt__nccl_time(c, 0);
    if (c->spans) c->marks[0] = mt_device_mark(c->spans, c->stream);
    MT_NCCL_CHECK(ncclGroupStart());
    for (int i = 0; i < count; i++) {
        const mt_p2p_op *op = &ops[i];
        if (op->recv) MT_NCCL_CHECK(ncclRecv(op->buf, op->n, ncclFloat, op->peer, comm, stream));
        else MT_NCCL_CHECK(ncclSend(op->buf, op->n, ncclFloat, op->peer, comm, stream));
    }
    MT_NCCL_CHECK(ncclGroupEnd());
    if (c->spans) c->marks[1] = mt_device_mark(c->spans, c->stream);
    mt__nccl_time(c, 1);
    mt__nccl_end(c);
    c->started = 0;
}

// an NCCL communicator for a group: its rank 0 makes the unique id, the threads backend hands
// it to the others (host memory; to the ranks of other processes as a message on the TCP
// channel, the rendezvous's connections), and every member joins (ncclCommInitRank blocks until
// all have). No MPI: the id is 128 bytes, and we already have a way to move bytes.
static void mt__nccl_join(mt_comm *c, void *compute_stream) {
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    mt__nccl_comm = c;   // for mt__nccl_check's message
    if (c->rank == 0) MT_NCCL_CHECK(ncclGetUniqueId(&id));
    mt_broadcast(c, (float *)(void *)&id, sizeof id / sizeof(float), 0);
    ncclComm_t comm;
    MT_NCCL_CHECK(ncclCommInitRank(&comm, c->size, id, c->rank));
    c->nccl = (void *)comm;
    cudaStream_t stream;
    MT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    c->stream = (void *)stream;
    c->compute_stream = compute_stream;
    for (int k = 0; k < 2; k++) {
        cudaEvent_t ev;
        MT_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
        c->events[k] = (void *)ev;
    }
}

static void mt__nccl_leave(mt_comm *c) {
    if (!c->nccl) return;
    mt__nccl_comm = c;
    MT_CUDA_CHECK(cudaStreamSynchronize((cudaStream_t)c->stream));
    mt__nccl_timing_free(c);
    MT_NCCL_CHECK(ncclCommDestroy((ncclComm_t)c->nccl));
    for (int k = 0; k < 2; k++) MT_CUDA_CHECK(cudaEventDestroy((cudaEvent_t)c->events[k]));
    MT_CUDA_CHECK(cudaStreamDestroy((cudaStream_t)c->stream));
    c->nccl = NULL;
}

// NVLink SHARP (multicast) all-reduce is not used: NCCL_NVLS_ENABLE=0 unless the user says
// otherwise. Set before any NCCL call, from the main thread (mt_world_run).
static void mt__nccl_process_defaults(void) { setenv("NCCL_NVLS_ENABLE", "0", 0); }
#else
static void mt__nccl_collective(mt_comm *c, int kind, const float *send, float *recv, size_t n, int arg,
                                int started) {
    (void)c; (void)kind; (void)send; (void)recv; (void)n; (void)arg; (void)started;
    mt_fatal("internal: an NCCL collective on the CPU build");
}
static void mt__nccl_end(mt_comm *c) { (void)c; }
static void mt__nccl_p2p(mt_comm *c, const mt_p2p_op *ops, int count) {
    (void)c; (void)ops; (void)count;
    mt_fatal("internal: NCCL send/recv on the CPU build");
}

static void mt__nccl_join(mt_comm *c, void *compute_stream) { (void)c; (void)compute_stream; }
static void mt__nccl_leave(mt_comm *c) { (void)c; }
static void mt__nccl_seconds(mt_comm *c) { (void)c; }   // the threads backend times its calls itself
static void mt__nccl_process_defaults(void) {}
#endif

// ---------------------------------------------------------------------------------------------
// launcher: one thread per rank (what torchrun does with processes)
// ---------------------------------------------------------------------------------------------
void mt_thread_set_name(const char *name) {
    char short_name[16];   // Linux keeps 15 characters and the terminating zero
    size_t len = strlen(name);
    if (len > sizeof short_name - 1) len = sizeof short_name - 1;
    memcpy(short_name, name, len);
    short_name[len] = '\0';
#if defined(__APPLE__)
    pthread_setname_np(short_name);
#elif defined(__linux__)
    pthread_setname_np(pthread_self(), short_name);
#else
    (void)short_name;
#endif
}

static void *mt__rank_thread_main(void *p) {
    mt__rank_thread *self = (mt__rank_thread *)p;
    char name[16];
    snprintf(name, sizeof name, "r%d", self->rank);
    mt_thread_set_name(name);   // gdb's `info threads` lists r0, r1, ...
    mt__this_rank = self;
    // an aborted world ends this thread in pthread_exit: what the rank still owns is freed then
    pthread_cleanup_push(mt__free_owned, NULL);
    self->fn(self->world, self->rank, self->arg);
    pthread_cleanup_pop(1);
    mt__this_rank = NULL;
    mt__mark_rank_done(self->world, self->rank);
    return NULL;
}

int mt_world_run(mt_world *w, mt_rank_fn fn, void *arg) {
    if (!mt_world_error(w)) {
        // a world may run several times (no rank threads run now, so no locks are needed for the
        // groups). The mailboxes forget which of MY ranks returned, under their mutexes: the TCP
        // channel's readers may be marking the ranks of a process that has already ended, and
        // those marks must stay (that process will not come back)
        for (mt__group *g = w->groups; g; g = g->next) {
            memset(g->done, 0, (size_t)g->size * sizeof(int));
            g->n_done = 0;
        }
        memset(w->rank_done, 0, (size_t)w->size * sizeof(int));
        for (int r = w->first_rank; r < w->first_rank + w->local_size; r++) {
            pthread_mutex_lock(&w->inbox[r].mu);
            for (int src = w->first_rank; src < w->first_rank + w->local_size; src++) w->inbox[r].src_done[src] = 0;
            pthread_mutex_unlock(&w->inbox[r].mu);
        }
        mt__nccl_process_defaults();   // before any rank thread can call NCCL
        // this process's ranks (all of them, unless other processes run the rest)
        int n = w->local_size;
        mt__rank_thread *ranks = (mt__rank_thread *)mt_calloc((size_t)n, sizeof(mt__rank_thread), "rank threads");
        pthread_t *threads = (pthread_t *)mt_calloc((size_t)n, sizeof(pthread_t), "rank threads");
        for (int i = 0; i < n; i++) {
            ranks[i].world = w;
            ranks[i].rank = w->first_rank + i;
            ranks[i].fn = fn;
            ranks[i].arg = arg;
            int err = pthread_create(&threads[i], NULL, mt__rank_thread_main, &ranks[i]);
            if (err != 0)
                mt_fatal("cannot start the thread of rank %d: %s\n"
                         "hint: lower --nproc-per-node or raise the thread limit (ulimit -u)", ranks[i].rank,
                         strerror(err));
        }
        for (int i = 0; i < n; i++) pthread_join(threads[i], NULL);
        free(threads);
        free(ranks);
    }
    const char *error = mt_world_error(w);
    if (!error) return 0;
    mt_atomic_cleanup();   // every rank has stopped: the temporaries of the unfinished writes go
    fflush(stdout);
    fprintf(stderr, "error: %s\n", error);   // exactly as mt_fatal prints it
    return 1;
}

// ---------------------------------------------------------------------------------------------
// helper threads: a rank's host work shared over the host's cores
// ---------------------------------------------------------------------------------------------
// Some of a rank's work runs on the host and is too big for one core: the parameters' initial
// draws (section 5) and the offloaded optimizer's update (section 6). The rank shares it with
// helper threads: job(arg, index, count) runs once on each of the pool's count threads, index 0
// on the rank's own thread, and each does the index-th of count pieces. Between jobs the helpers
// wait on a condition variable, so a pool can live for a whole run (the optimizer's) or for one
// job (the initialisation's). gdb names them after their rank and job: "r0 adamw1", "r0 init3".
typedef void (*mt__host_job)(void *arg, int index, int count);
typedef struct mt__host_pool mt__host_pool;
typedef struct { mt__host_pool *pool; int index; } mt__host_pool_arg;
struct mt__host_pool {
    int count;                    // threads of a job, the rank's own thread (index 0) included
    pthread_t *threads;           // (count - 1) the helpers, indices 1 .. count-1
    mt__host_pool_arg *args;
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    unsigned long generation;     // one more per job: a helper starts when it changes
    int busy;                     // helpers not done with the current job
    int stop;
    mt__host_job job;             // the current job and its argument
    void *job_arg;
    int rank;                     // for the helpers' names
    char what[8];                 // ... "adamw", "init"
};

static void *mt__host_pool_main(void *p) {
    mt__host_pool_arg *arg = (mt__host_pool_arg *)p;
    mt__host_pool *pool = arg->pool;
    char name[32];
    snprintf(name, sizeof name, "r%d %s%d", pool->rank, pool->what, arg->index);
    mt_thread_set_name(name);
    unsigned long seen = 0;
    for (;;) {
        pthread_mutex_lock(&pool->mu);
        while (pool->generation == seen && !pool->stop) pthread_cond_wait(&pool->go, &pool->mu);
        if (pool->stop) { pthread_mutex_unlock(&pool->mu); return NULL; }
        seen = pool->generation;
        mt__host_job job = pool->job;
        void *job_arg = pool->job_arg;
        pthread_mutex_unlock(&pool->mu);
        job(job_arg, arg->index, pool->count);
        pthread_mutex_lock(&pool->mu);
        if (--pool->busy == 0) pthread_cond_signal(&pool->done);
        pthread_mutex_unlock(&pool->mu);
    }
}

// count threads in all (count - 1 helpers); a helper that cannot start is fatal, with `hint`
static mt__host_pool *mt__host_pool_create(int count, const char *what, int rank, const char *hint) {
    mt__host_pool *pool = (mt__host_pool *)mt_calloc(1, sizeof *pool, "host threads");
    pool->count = count;
    pool->rank = rank;
    snprintf(pool->what, sizeof pool->what, "%s", what);
    pthread_mutex_init(&pool->mu, NULL);
    pthread_cond_init(&pool->go, NULL);
    pthread_cond_init(&pool->done, NULL);
    pool->threads = (pthread_t *)mt_calloc((size_t)count, sizeof(pthread_t), "host threads");
    pool->args = (mt__host_pool_arg *)mt_calloc((size_t)count, sizeof(mt__host_pool_arg), "host threads");
    for (int i = 1; i < count; i++) {
        pool->args[i].pool = pool;
        pool->args[i].index = i;
        int err = pthread_create(&pool->threads[i - 1], NULL, mt__host_pool_main, &pool->args[i]);
        if (err != 0)
            mt_fatal("cannot start host thread %d (%s) of rank %d: %s\nhint: %s", i, what, rank, strerror(err), hint);
    }
    return pool;
}

// stops and joins the helpers (they are idle: a job runs inside mt__host_pool_run only)
static void mt__host_pool_free(void *p) {
    mt__host_pool *pool = (mt__host_pool *)p;
    if (!pool) return;
    pthread_mutex_lock(&pool->mu);
    pool->stop = 1;
    pthread_cond_broadcast(&pool->go);
    pthread_mutex_unlock(&pool->mu);
    for (int i = 1; i < pool->count; i++) pthread_join(pool->threads[i - 1], NULL);
    pthread_mutex_destroy(&pool->mu);
    pthread_cond_destroy(&pool->go);
    pthread_cond_destroy(&pool->done);
    free(pool->threads);
    free(pool->args);
    free(pool);
}

// runs job on every thread of the pool, piece 0 on the caller's thread; returns when all are done
static void mt__host_pool_run(mt__host_pool *pool, mt__host_job job, void *arg) {
    pthread_mutex_lock(&pool->mu);
    pool->job = job;
    pool->job_arg = arg;
    pool->busy = pool->count - 1;
    pool->generation++;
    pthread_cond_broadcast(&pool->go);
    pthread_mutex_unlock(&pool->mu);
    job(arg, 0, pool->count);
    pthread_mutex_lock(&pool->mu);
    while (pool->busy > 0) pthread_cond_wait(&pool->done, &pool->mu);
    pthread_mutex_unlock(&pool->mu);
}

// ---------------------------------------------------------------------------------------------
// launch: which processes make up the job, from the launcher's environment variables
// ---------------------------------------------------------------------------------------------
// Several processes, on one node or many: srun, mpirun or a torchrun-style script starts them
// and tells each one who it is through environment variables. We link no MPI and no Slurm
// library: we read those variables, then meet at a rendezvous (below). Looked for in this order:
//
//   launcher          my process       processes     on my node                    my node
//   torchrun-style    RANK             WORLD_SIZE    LOCAL_RANK, LOCAL_WORLD_SIZE  GROUP_RANK
//   Open MPI / PMIx   OMPI_COMM_WORLD_RANK (or PMIX_RANK)  OMPI_COMM_WORLD_SIZE
//                                                    OMPI_COMM_WORLD_LOCAL_RANK/_SIZE
//   Slurm (srun)      SLURM_PROCID     SLURM_STEP_NUM_TASKS (or SLURM_NTASKS)
//                                                    SLURM_LOCALID                 SLURM_NODEID
//   none of them, or a job of one process: today's single process, every rank a thread.
//
// The rendezvous is at MASTER_ADDR:MASTER_PORT (torchrun's names; Slurm without them: the first
// host of SLURM_STEP_NODELIST / SLURM_JOB_NODELIST, port 20000 + SLURM_JOB_ID % 20000), or in
// the file of --nccl-init-file. Each process runs --nproc-per-node rank threads (default 1 under
// a launcher: one process per GPU, as torchrun and srun --ntasks-per-node=8 start them; 8 with
// srun --ntasks-per-node=1: one process per node), and process p's ranks are
// p*ranks_per_proc .. (p+1)*ranks_per_proc - 1, so a node's ranks are neighbours and TP (the
// fastest index of the layout) stays inside a node when the node's ranks are a multiple of TP.
// Slurm counts only inside a job step (srun): a batch script itself also has SLURM_PROCID=0.

// a Slurm host list range "01-04" or "7": the numbers and the width of the first (zero padding)
static int mt__hostlist_range(const char *s, const char *end, long *lo, long *hi, int *width) {
    const char *p = s;
    *lo = 0;
    while (p < end && *p >= '0' && *p <= '9') {
        if (p - s > 9) return 0;
        *lo = *lo * 10 + (*p++ - '0');
    }
    if (p == s) return 0;
    *width = (int)(p - s);
    *hi = *lo;
    if (p == end) return 1;
    if (*p != '-') return 0;
    const char *q = ++p;
    *hi = 0;
    while (p < end && *p >= '0' && *p <= '9') {
        if (p - q > 9) return 0;
        *hi = *hi * 10 + (*p++ - '0');
    }
    return p != q && p == end && *hi >= *lo;
}

// one item of the list ("gpu-a[1-2]-b[01,03]"): how many hosts it names; writes host `index`.
// Brackets multiply, the leftmost varying slowest: a[1-2]-b[3-4] = a1-b3 a1-b4 a2-b3 a2-b4.
static long mt__hostlist_item(const char *s, const char *end, long index, char *host, size_t cap,
                              const char **err) {
    long count = 1;
    for (const char *p = s; p < end; p++) {   // first pass: the count, and the syntax
        if (*p == ']') { *err = "a ']' without its '['"; return -1; }
        if (*p != '[') continue;
        const char *close = p + 1;
        while (close < end && *close != ']' && *close != '[') close++;
        if (close == end || *close != ']') { *err = "a '[' without its ']'"; return -1; }
        long n = 0;
        for (const char *a = p + 1; a <= close; a++) {
            const char *b = a;
            while (b < close && *b != ',') b++;
            long lo, hi;
            int width;
            if (!mt__hostlist_range(a, b, &lo, &hi, &width)) {
                *err = b == a ? "an empty range in [...]" : "a range in [...] that is not N or N-M with N <= M";
                return -1;
            }
            n += hi - lo + 1;
            a = b;
        }
        if (n > 1000000 || count * n > 1000000) { *err = "more than a million hosts"; return -1; }
        count *= n;
        p = close;
    }
    if (end == s) { *err = "an empty host name"; return -1; }
    if (index < 0 || index >= count || !host) return count;
    // second pass: write host `index`, digit by digit of its mixed-radix number
    size_t len = 0;
    long stride = count;
    for (const char *p = s; p < end; p++) {
        char piece[48];
        size_t plen;
        if (*p != '[') {
            piece[0] = *p;
            plen = 1;
        } else {
            const char *close = strchr(p, ']');
            long n = 0;
            for (const char *a = p + 1; a <= close; a++) {   // the bracket's size again
                const char *b = a;
                while (b < close && *b != ',') b++;
                long lo, hi;
                int width;
                mt__hostlist_range(a, b, &lo, &hi, &width);
                n += hi - lo + 1;
                a = b;
            }
            stride /= n;
            long k = (index / stride) % n;   // which value of this bracket
            plen = 0;
            for (const char *a = p + 1; a <= close; a++) {
                const char *b = a;
                while (b < close && *b != ',') b++;
                long lo, hi;
                int width;
                mt__hostlist_range(a, b, &lo, &hi, &width);
                if (k <= hi - lo) {
                    plen = (size_t)snprintf(piece, sizeof piece, "%0*ld", width, lo + k);
                    break;
                }
                k -= hi - lo + 1;
                a = b;
            }
            p = close;
        }
        if (len + plen + 1 > cap) { *err = "a host name longer than the buffer"; return -1; }
        memcpy(host + len, piece, plen);
        len += plen;
    }
    host[len] = '\0';
    return count;
}

int mt_hostlist_get(const char *list, int index, char *host, size_t cap, const char **err) {
    const char *dummy;
    if (!err) err = &dummy;
    *err = NULL;
    if (!list || !*list) { *err = "the host list is empty"; return -1; }
    long total = 0;
    const char *p = list;
    for (;;) {   // items are separated by commas outside brackets
        const char *end = p;
        int depth = 0;
        while (*end && (depth > 0 || *end != ',')) {
            if (*end == '[') depth++;
            if (*end == ']') depth--;
            if (*end == ' ' || *end == '\t') { *err = "a space in the host list"; return -1; }
            end++;
        }
        long n = mt__hostlist_item(p, end, index - total, host, cap, err);
        if (n < 0) return -1;
        total += n;
        if (total > 1000000) { *err = "more than a million hosts"; return -1; }
        if (!*end) break;
        p = end + 1;
    }
    return (int)total;
}

// an environment variable as a whole non-negative int; -1 if unset; mt_fatal if it is not a number
static int mt__env_int(const char *name) {
    const char *v = getenv(name);
    if (!v || !*v) return -1;
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || *end || x < 0 || x > 1 << 24)
        mt_fatal("the environment variable %s=%s is not a number from 0 to %d\n"
                 "hint: the launcher sets it; unset it to run as one process", name, v, 1 << 24);
    return (int)x;
}

static void mt__found(mt_launch *l, const char *name) {
    const char *v = getenv(name);
    if (!v) return;
    size_t len = strlen(l->found);
    snprintf(l->found + len, sizeof l->found - len, "%s%s=%.40s", len ? " " : "", name, v);
}

void mt_launch_detect(mt_launch *l, mt_config *cfg) {
    memset(l, 0, sizeof *l);
    l->kind = MT_LAUNCH_THREADS;
    l->nprocs = 1;
    l->local_proc = -1;
    l->node = -1;
    const mt_parallel_config *p = &cfg->parallel;
    l->timeout_s = p->dist_timeout > 0 ? p->dist_timeout : 60.0 * p->distributed_timeout_minutes;
    snprintf(l->init_file, sizeof l->init_file, "%s", p->nccl_init_file);
    const char *rank_var = NULL, *size_var = NULL;
    if (getenv("RANK") && getenv("WORLD_SIZE")) {   // torchrun, or a script that exports its names
        l->kind = MT_LAUNCH_TORCHRUN;
        rank_var = "RANK", size_var = "WORLD_SIZE";
        l->local_proc = mt__env_int("LOCAL_RANK");
        if (l->local_proc < 0) l->local_proc = p->local_rank;   // torch.distributed.launch's --local_rank
        l->local_nprocs = mt__env_int("LOCAL_WORLD_SIZE");
        l->node = mt__env_int("GROUP_RANK");
        const char *names[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK"};
        for (int i = 0; i < 5; i++) mt__found(l, names[i]);
    } else if (getenv("OMPI_COMM_WORLD_SIZE") && (getenv("OMPI_COMM_WORLD_RANK") || getenv("PMIX_RANK"))) {
        l->kind = MT_LAUNCH_MPI;
        rank_var = getenv("OMPI_COMM_WORLD_RANK") ? "OMPI_COMM_WORLD_RANK" : "PMIX_RANK";
        size_var = "OMPI_COMM_WORLD_SIZE";
        l->local_proc = mt__env_int("OMPI_COMM_WORLD_LOCAL_RANK");
        l->local_nprocs = mt__env_int("OMPI_COMM_WORLD_LOCAL_SIZE");
        const char *names[] = {rank_var, "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                               "OMPI_COMM_WORLD_LOCAL_SIZE"};
        for (int i = 0; i < 4; i++) mt__found(l, names[i]);
    } else if (getenv("SLURM_PROCID") && (getenv("SLURM_STEP_NUM_TASKS") ||
                                          ((getenv("SLURM_STEP_ID") || getenv("SLURM_STEPID")) &&
                                           (getenv("SLURM_NTASKS") || getenv("SLURM_NPROCS"))))) {
        l->kind = MT_LAUNCH_SLURM;
        rank_var = "SLURM_PROCID";
        size_var = getenv("SLURM_STEP_NUM_TASKS") ? "SLURM_STEP_NUM_TASKS"
                   : getenv("SLURM_NTASKS")       ? "SLURM_NTASKS" : "SLURM_NPROCS";
        l->local_proc = mt__env_int("SLURM_LOCALID");
        l->node = mt__env_int("SLURM_NODEID");
        const char *names[] = {"SLURM_PROCID", size_var, "SLURM_LOCALID", "SLURM_NODEID"};
        for (int i = 0; i < 4; i++) mt__found(l, names[i]);
        // tasks on my node: SLURM_TASKS_PER_NODE is "8(x2)" or "8,7": the count of my node
        const char *tpn = getenv("SLURM_STEP_TASKS_PER_NODE") ? getenv("SLURM_STEP_TASKS_PER_NODE")
                                                              : getenv("SLURM_TASKS_PER_NODE");
        if (tpn && l->node >= 0) {
            int node = 0;
            for (const char *q = tpn; *q;) {
                char *e;
                long n = strtol(q, &e, 10), times = 1;
                if (e == q) break;
                if (strncmp(e, "(x", 2) == 0) times = strtol(e + 2, &e, 10), e += *e == ')';
                if (l->node >= node && l->node < node + times) l->local_nprocs = (int)n;
                node += (int)times;
                q = *e == ',' ? e + 1 : e;
                if (e == q && *q) break;
            }
        }
    }
    if (l->kind == MT_LAUNCH_THREADS) {
        cfg->parallel.num_processes = 1;
        l->ranks_per_proc = p->nproc_per_node;   // 0: TP*PP, decided by mt_config_derive
        if (getenv("SLURM_PROCID") && getenv("SLURM_JOB_ID") && !getenv("SLURM_STEP_ID") && !getenv("SLURM_STEPID"))
            snprintf(l->found, sizeof l->found, "in a Slurm job but not started by srun: one process");
        return;
    }
    l->proc = mt__env_int(rank_var);
    l->nprocs = mt__env_int(size_var);
    if (l->nprocs < 1)
        mt_fatal("%s=%s: a job needs at least one process\nhint: the launcher sets it; check its --nproc-per-node "
                 "/ --ntasks / -np", size_var, getenv(size_var));
    if (l->proc >= l->nprocs)
        mt_fatal("%s=%d is outside the job's %d processes (%s)\nhint: every process of a job must see the same %s",
                 rank_var, l->proc, l->nprocs, size_var, size_var);
    if (l->local_nprocs > 0 && l->local_proc >= l->local_nprocs)
        mt_fatal("local rank %d is outside the %d processes on this node\nhint: LOCAL_RANK < LOCAL_WORLD_SIZE "
                 "(torchrun sets both)", l->local_proc, l->local_nprocs);
    cfg->parallel.num_processes = l->nprocs;
    l->ranks_per_proc = p->nproc_per_node > 0 ? p->nproc_per_node : 1;
    l->first_rank = l->proc * l->ranks_per_proc;
    if (l->nprocs == 1) {   // a launcher of one process: today's single process
        l->kind = MT_LAUNCH_THREADS;
        l->ranks_per_proc = p->nproc_per_node;
        return;
    }
    // where to meet
    const char *addr = getenv("MASTER_ADDR"), *port = getenv("MASTER_PORT");
    if (addr && *addr) snprintf(l->master_addr, sizeof l->master_addr, "%s", addr);
    if (port && *port) l->master_port = mt__env_int("MASTER_PORT");
    if (l->kind == MT_LAUNCH_SLURM && !l->master_addr[0]) {
        const char *list = getenv("SLURM_STEP_NODELIST") ? getenv("SLURM_STEP_NODELIST") : getenv("SLURM_JOB_NODELIST");
        if (!list) list = getenv("SLURM_NODELIST");
        const char *err = NULL;
        if (list && mt_hostlist_get(list, 0, l->master_addr, sizeof l->master_addr, &err) < 0)
            mt_fatal("cannot read the Slurm host list \"%s\": %s\nhint: set MASTER_ADDR to the host of process 0",
                     list, err);
    }
    if (l->kind == MT_LAUNCH_SLURM && !l->master_port && getenv("SLURM_JOB_ID"))
        l->master_port = 20000 + mt__env_int("SLURM_JOB_ID") % 20000;
    if (!l->init_file[0] && (!l->master_addr[0] || l->master_port <= 0 || l->master_port > 65535))
        mt_fatal("%d processes (%s) need a place to meet: MASTER_ADDR and MASTER_PORT are %s\n"
                 "hint: export MASTER_ADDR=<host of process 0> MASTER_PORT=<free port, e.g. 29500> to every "
                 "process (mpirun -x MASTER_ADDR -x MASTER_PORT), or pass --nccl-init-file PATH on a shared "
                 "filesystem", l->nprocs, l->found, !l->master_addr[0] ? "not set" : "incomplete");
    // the topology, early: a TP group larger than a node's ranks would cross nodes
    int TP = p->tensor_model_parallel_size;
    if (l->local_nprocs > 0 && TP > l->local_nprocs * l->ranks_per_proc)
        mt_fatal("TP=%d is larger than the %d ranks of this node (%d process%s x %d): its TP group would cross "
                 "nodes\nhint: tensor parallelism all-reduces twice per layer and needs one node's fast links "
                 "(NVLink); use TP <= %d and spread the rest over PP and DP",
                 TP, l->local_nprocs * l->ranks_per_proc, l->local_nprocs, l->local_nprocs == 1 ? "" : "es",
                 l->ranks_per_proc, l->local_nprocs * l->ranks_per_proc);
}

static const char *mt__launch_name(mt_launch_kind k) {
    switch (k) {
    case MT_LAUNCH_TORCHRUN: return "torchrun-style environment";
    case MT_LAUNCH_SLURM: return "Slurm (srun)";
    case MT_LAUNCH_MPI: return "Open MPI (mpirun)";
    default: return "one process";
    }
}

void mt_launch_print(const mt_launch *l, const mt_config *cfg, FILE *f) {
    if (l->kind == MT_LAUNCH_THREADS) {
        int ranks = l->ranks_per_proc > 0 ? l->ranks_per_proc : cfg->world_size > 0 ? cfg->world_size
                    : cfg->parallel.tensor_model_parallel_size * cfg->parallel.pipeline_model_parallel_size;
        fprintf(f, "launch: one process, %d rank%s as threads%s%s%s\n", ranks, ranks == 1 ? "" : "s",
                l->found[0] ? " (" : "", l->found, l->found[0] ? ")" : "");
        return;
    }
    int last = l->first_rank + l->ranks_per_proc - 1;
    fprintf(f, "launch: %s (%s): process %d of %d, rank%s %d", mt__launch_name(l->kind), l->found, l->proc,
            l->nprocs, l->ranks_per_proc == 1 ? "" : "s", l->first_rank);
    if (last > l->first_rank) fprintf(f, "..%d", last);
    fprintf(f, " of %d as threads", l->nprocs * l->ranks_per_proc);
    if (l->node >= 0) fprintf(f, ", node %d", l->node);
    if (l->local_proc >= 0) fprintf(f, ", local process %d", l->local_proc);
    if (l->local_nprocs > 0) fprintf(f, " of %d", l->local_nprocs);
    if (l->init_file[0]) fprintf(f, "; rendezvous through the file %s", l->init_file);
    else fprintf(f, "; rendezvous at %s:%d", l->master_addr, l->master_port);
    fprintf(f, ", timeout %g s\n", l->timeout_s);
}

// ---------------------------------------------------------------------------------------------
// the TCP channel: the rendezvous, then one connection between every two processes
// ---------------------------------------------------------------------------------------------
// What torch.distributed's TCPStore and NCCL's bootstrap do, in plain POSIX sockets:
//
//   1. rendezvous  process 0 listens at MASTER_ADDR:MASTER_PORT (with --nccl-init-file: on a
//                  free port, which it writes into the file: temp, fsync, rename). Every other
//                  process connects (retrying until the timeout: process 0 may start later) and
//                  checks in: job size, its index, its ranks, its host name, the port where it
//                  listens for its peers. Process 0 checks that they agree (a wrong world size
//                  is an error naming both values), waits for all of them (one that never comes
//                  is an error naming it, the host and the port), then sends everyone the table
//                  of all processes: address, port, ranks, node.
//   2. the mesh    process p connects to every process q < p and accepts every q > p: one TCP
//                  connection per pair, used in both directions.
//   3. traffic     one reader thread per connection moves each arriving message into the
//                  mailbox of its destination rank (the same mailboxes as the threads backend),
//                  so mt_recv cannot tell a message from another process from a local one.
//                  Writers take the connection's mutex: one message at a time, header then data.
//
// After that, everything the threads backend does across processes is a message: mt_send/mt_recv
// as they are, and a collective on a group with members in other processes is "every member
// sends its part to the group's rank 0, which reduces in rank order and sends each its result"
// (below, with the collectives). The ids of the NCCL communicators travel the same way: each
// group's rank 0 makes its ncclUniqueId and broadcasts it to its members (mt__nccl_join).
// A process that fails tells every other one (an abort message), so the whole job stops with
// the first error; a process that dies closes its connections, and a rank waiting for one of its
// messages is told so instead of hanging. The wire format is the host's: all processes must
// run on one kind of machine (little-endian x86-64 or aarch64), as NCCL's own bootstrap assumes.
#define MT__NET_DATA 0    // a message for a rank's mailbox
#define MT__NET_ABORT 1   // a process failed: the payload is its error line

typedef struct {          // what precedes every message on a connection
    int32_t src, dst;     // global ranks
    int32_t tag;          // mt_send's tag; negative: a collective of the group with that tag
    int32_t kind;         // MT__NET_DATA or MT__NET_ABORT
    uint64_t bytes;       // payload bytes that follow
} mt__wire;

typedef struct {          // one other process, as the rendezvous describes it
    int32_t first_rank, nranks, node, port;   // its ranks; its node; where it listens for peers
    char addr[64];        // its address as process 0 saw it ("" for process 0: MASTER_ADDR)
    char host[64];        // its host name (messages; the address when addr is loopback)
} mt__proc_info;

typedef struct {
    mt__proc_info info;
    struct mt__net *net;       // the table it belongs to
    int fd;                    // the connection; -1 for my own process
    pthread_mutex_t send_mu;   // one message at a time on the connection
    pthread_t reader;
    int reader_started;
} mt__peer;

struct mt__net {
    mt_world *world;
    int nprocs, proc;
    mt__peer *peers;           // (nprocs,)
    int *rank_proc;            // (world size,) the process of each rank
    int *rank_node;            // (world size,) its node
    int *rank_node_rank;       // (world size,) its index among its node's ranks
    int *rank_node_size;       // (world size,) the ranks of its node
    int num_nodes;
    int closing;               // set before the connections close: an EOF is not an error then (world->mu)
    char where[MT_PATH_MAX + 320];   // "the rendezvous at HOST:PORT" (messages)
};

static int mt__send_all(int fd, const void *buf, size_t n) {
    const char *p = (const char *)buf;
    while (n > 0) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return 0;
        p += k;
        n -= (size_t)k;
    }
    return 1;
}

// reads exactly n bytes; 1 ok, 0 the peer closed or failed, -1 the deadline passed (deadline
// 0: wait forever)
static int mt__recv_all(int fd, void *buf, size_t n, double deadline) {
    char *p = (char *)buf;
    while (n > 0) {
        if (deadline > 0) {
            double left = deadline - mt_time_seconds();
            if (left <= 0) return -1;
            struct pollfd pfd = {fd, POLLIN, 0};
            int r = poll(&pfd, 1, (int)(left * 1000) + 1);
            if (r < 0 && errno == EINTR) continue;
            if (r == 0) return -1;
        }
        ssize_t k = recv(fd, p, n, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return 0;
        p += k;
        n -= (size_t)k;
    }
    return 1;
}

// a listening TCP socket on all interfaces; port 0 = any free port. Returns the fd, the port.
static int mt__listen(int port, int *bound_port, char *why, size_t cap) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) { snprintf(why, cap, "socket: %s", strerror(errno)); return -1; }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    a.sin_port = htons((uint16_t)port);
    if (bind(fd, (struct sockaddr *)&a, sizeof a) < 0 || listen(fd, 1024) < 0) {
        snprintf(why, cap, "%s", strerror(errno));
        close(fd);
        return -1;
    }
    socklen_t len = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &len);
    *bound_port = ntohs(a.sin_port);
    return fd;
}

// one connection attempt to host:port; the fd, or -1 with the reason
static int mt__connect_once(const char *host, int port, char *why, size_t cap) {
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    int err = getaddrinfo(host, service, &hints, &res);
    if (err != 0) { snprintf(why, cap, "cannot resolve the host name: %s", gai_strerror(err)); return -1; }
    int fd = -1;
    for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
        if (fd < 0) continue;
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) break;
        snprintf(why, cap, "%s", strerror(errno));
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd >= 0) {
        int one = 1;   // small messages (losses, norms, acks) must not wait for Nagle
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    return fd;
}

// connects, retrying every 0.1 .. 1 s until the deadline (the other side may not listen yet)
static int mt__connect_retry(const char *host, int port, double deadline, char *why, size_t cap) {
    double wait = 0.1;
    for (;;) {
        int fd = mt__connect_once(host, port, why, cap);
        if (fd >= 0 || mt_time_seconds() + wait > deadline) return fd;
        usleep((useconds_t)(wait * 1e6));
        if (wait < 1.0) wait *= 1.5;
    }
}

// accepts one connection before the deadline; -1 when it passed
static int mt__accept_until(int lfd, double deadline, struct sockaddr_in *peer) {
    for (;;) {
        double left = deadline - mt_time_seconds();
        if (left <= 0) return -1;
        struct pollfd pfd = {lfd, POLLIN, 0};
        int r = poll(&pfd, 1, (int)(left * 1000) + 1);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) continue;
        socklen_t len = sizeof *peer;
        int fd = accept(lfd, (struct sockaddr *)peer, &len);
        if (fd < 0) continue;
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        return fd;
    }
}

// ---- the rendezvous: check-in and the table ----
#define MT__RDZV_MAGIC "MTRDZV1"
typedef struct {             // a process checking in with process 0
    char magic[8];
    int32_t nprocs, proc, ranks_per_proc, node, port, pid;
    char host[64];
} mt__checkin;

typedef struct {             // process 0's answer: ok, or the error that stops the job
    int32_t ok;
    char error[1024];
} mt__verdict;

static void mt__gethostname(char *out, size_t cap) {
    if (gethostname(out, cap) != 0) snprintf(out, cap, "?");
    out[cap - 1] = '\0';
}

// process 0's side: waits for every other process, checks them, answers with the table
static void mt__rendezvous_serve(mt__net *net, int lfd, const mt_launch *l, const mt__checkin *mine) {
    double deadline = mt_time_seconds() + l->timeout_s;
    int n = net->nprocs;
    int *fds = (int *)mt_malloc(sizeof(int) * (size_t)n, "rendezvous");
    mt__checkin *in = (mt__checkin *)mt_calloc((size_t)n, sizeof(mt__checkin), "rendezvous");
    for (int i = 0; i < n; i++) fds[i] = -1;
    in[0] = *mine;
    int arrived = 1;
    mt__verdict v;
    memset(&v, 0, sizeof v);
    v.ok = 1;
    while (arrived < n && v.ok) {
        struct sockaddr_in peer;
        int fd = mt__accept_until(lfd, deadline, &peer);
        if (fd < 0) {   // the deadline passed: name who never came
            int len = snprintf(v.error, sizeof v.error, "%.400s: %d of %d processes never arrived within %g s:",
                               net->where, n - arrived, n, l->timeout_s);
            for (int i = 1, shown = 0; i < n && len < (int)sizeof v.error - 40; i++) {
                if (fds[i] >= 0 || shown++ >= 8) continue;
                int r0 = i * l->ranks_per_proc, r1 = r0 + l->ranks_per_proc - 1;
                len += r0 == r1 ? snprintf(v.error + len, sizeof v.error - (size_t)len, " process %d (rank %d)", i, r0)
                                : snprintf(v.error + len, sizeof v.error - (size_t)len, " process %d (ranks %d..%d)", i,
                                           r0, r1);
            }
            snprintf(v.error + len, sizeof v.error - (size_t)len,
                     "\nhint: every process must be started with the same MASTER_ADDR/MASTER_PORT (or "
                     "--nccl-init-file) and reach it; a longer --dist-timeout helps when processes start late");
            v.ok = 0;
            break;
        }
        mt__checkin c;
        if (mt__recv_all(fd, &c, sizeof c, mt_time_seconds() + 10) != 1 || memcmp(c.magic, MT__RDZV_MAGIC, 8) != 0) {
            close(fd);   // not one of ours (a port scanner, another program): ignore it
            continue;
        }
        c.host[sizeof c.host - 1] = '\0';
        if (c.nprocs != n) {
            snprintf(v.error, sizeof v.error, "%.400s: process %d (host %s) says the job has %d processes, process 0 "
                     "says %d\nhint: every process must see the same world size (WORLD_SIZE, SLURM_NTASKS, "
                     "OMPI_COMM_WORLD_SIZE)", net->where, c.proc, c.host, c.nprocs, n);
            v.ok = 0;
        } else if (c.proc <= 0 || c.proc >= n || fds[c.proc] >= 0) {
            snprintf(v.error, sizeof v.error, "%.400s: two processes (hosts %s and %s) both say they are process %d\n"
                     "hint: every process needs its own RANK / SLURM_PROCID", net->where,
                     c.proc > 0 && c.proc < n ? in[c.proc].host : mine->host, c.host, c.proc);
            v.ok = 0;
        } else if (c.ranks_per_proc != mine->ranks_per_proc) {
            snprintf(v.error, sizeof v.error, "%.400s: process %d runs %d rank threads, process 0 runs %d\n"
                     "hint: give every process the same --nproc-per-node", net->where, c.proc, c.ranks_per_proc,
                     mine->ranks_per_proc);
            v.ok = 0;
        }
        if (!v.ok) {   // answer it too, so it prints the same error
            mt__send_all(fd, &v, sizeof v);
            close(fd);
            break;
        }
        fds[c.proc] = fd;
        in[c.proc] = c;
        inet_ntop(AF_INET, &peer.sin_addr, net->peers[c.proc].info.addr, sizeof net->peers[c.proc].info.addr);
        arrived++;
    }
    // the table: ranks, nodes (the launcher's node numbers if every process has one, else the
    // host names in order of first appearance), listening ports
    int all_nodes = 1;
    for (int i = 0; i < n; i++) all_nodes &= in[i].node >= 0;
    for (int i = 0; i < n && v.ok; i++) {
        mt__proc_info *p = &net->peers[i].info;
        p->first_rank = i * mine->ranks_per_proc;
        p->nranks = mine->ranks_per_proc;
        p->port = in[i].port;
        snprintf(p->host, sizeof p->host, "%s", in[i].host);
        p->node = in[i].node;
        if (!all_nodes) {
            p->node = -1;
            for (int j = 0; j < i && p->node < 0; j++)
                if (strcmp(in[j].host, in[i].host) == 0) p->node = net->peers[j].info.node;
            if (p->node < 0) {
                int max = -1;
                for (int j = 0; j < i; j++) if (net->peers[j].info.node > max) max = net->peers[j].info.node;
                p->node = max + 1;
            }
        }
    }
    net->peers[0].info.addr[0] = '\0';
    for (int i = 1; i < n; i++) {
        if (fds[i] < 0) continue;
        int ok = mt__send_all(fds[i], &v, sizeof v);
        for (int j = 0; j < n && ok && v.ok; j++) ok = mt__send_all(fds[i], &net->peers[j].info, sizeof(mt__proc_info));
        close(fds[i]);
    }
    free(fds);
    free(in);
    if (!v.ok) mt_fatal("%s", v.error);
}

// any other process's side: check in with process 0, read the verdict and the table
static void mt__rendezvous_join(mt__net *net, char *host, size_t host_cap, int port, const mt__checkin *mine,
                                double timeout, const char *file) {
    double deadline = mt_time_seconds() + timeout;
    char why[256] = "no answer";
    int fd = -1;
    double wait = 0.1;
    while (fd < 0) {   // with a file: wait for it, read process 0's address; retry both (it may be stale)
        if (file) {
            FILE *f = fopen(file, "r");
            char h[256];
            int p = 0;
            if (f && fscanf(f, MT__RDZV_MAGIC " %255s %d", h, &p) == 2) {
                snprintf(net->where, sizeof net->where, "the rendezvous at %s:%d (from %s)", h, p, file);
                fd = mt__connect_once(h, p, why, sizeof why);
                snprintf(host, host_cap, "%s", h);   // the mesh reaches process 0 there
            } else {
                snprintf(why, sizeof why, "%s", f ? "the file does not name an address yet" : "no such file yet");
            }
            if (f) fclose(f);
        } else {
            fd = mt__connect_once(host, port, why, sizeof why);
        }
        if (fd >= 0) break;
        if (mt_time_seconds() + wait > deadline)
            mt_fatal("process %d cannot reach %s within %g s: %s\n"
                     "hint: process 0 must be running and reachable there (same MASTER_ADDR and MASTER_PORT for every "
                     "process, the port open in the firewall; NCCL_SOCKET_IFNAME does not apply to this step)",
                     net->proc, net->where, timeout, why);
        usleep((useconds_t)(wait * 1e6));
        if (wait < 1.0) wait *= 1.5;
    }
    // process 0 answers when everyone is in, or at its own deadline: wait a little longer than it
    mt__verdict v;
    if (!mt__send_all(fd, mine, sizeof *mine))
        mt_fatal("process %d lost %s while checking in\nhint: is another program listening on that port?", net->proc,
                 net->where);
    int r = mt__recv_all(fd, &v, sizeof v, deadline + 10);
    if (r != 1)
        mt_fatal("process %d checked in at %s but got no answer %s\nhint: a port used by another program, or "
                 "process 0 stopped; see its output", net->proc, net->where, r < 0 ? "in time" : "(closed)");
    v.error[sizeof v.error - 1] = '\0';
    if (!v.ok) mt_fatal("%s", v.error);
    for (int j = 0; j < net->nprocs; j++)
        if (mt__recv_all(fd, &net->peers[j].info, sizeof(mt__proc_info), deadline + 10) != 1)
            mt_fatal("process %d: %s closed while sending the table of processes", net->proc, net->where);
    close(fd);
}

// ---- traffic: the reader threads, sending, aborting ----
// a connection's reader: each message goes into its destination's mailbox. When the connection
// closes (the process ended, or crashed), its ranks are marked as gone in every mailbox here, so
// a rank waiting for one of them is told instead of waiting forever.
static void *mt__net_reader(void *arg) {
    mt__peer *peer = (mt__peer *)arg;
    mt__net *net = peer->net;
    mt_world *w = net->world;
    char line[2048];
    for (;;) {
        mt__wire h;
        if (mt__recv_all(peer->fd, &h, sizeof h, 0) != 1) break;
        if (h.kind == MT__NET_ABORT) {   // the first error of another process: stop here too
            size_t n = h.bytes < sizeof line - 1 ? (size_t)h.bytes : sizeof line - 1;
            if (mt__recv_all(peer->fd, line, n, 0) != 1) break;
            line[n] = '\0';
            mt__world_abort(w, line);
            continue;
        }
        int local = mt__is_local(w, h.dst);
        if (h.kind != MT__NET_DATA || !local || h.src < 0 || h.src >= w->size || h.bytes % sizeof(float) ||
            h.bytes > ((uint64_t)1 << 40)) {
            snprintf(line, sizeof line, "process %d: a malformed message from process %d (%s)\nhint: every process "
                     "must run the same program on the same kind of machine", net->proc, (int)(peer - net->peers),
                     peer->info.host);
            mt__world_abort(w, line);
            break;
        }
        mt__message *m = (mt__message *)malloc(sizeof(mt__message) + (size_t)h.bytes);
        if (!m) {
            snprintf(line, sizeof line, "process %d: out of memory for a message of %llu bytes", net->proc,
                     (unsigned long long)h.bytes);
            mt__world_abort(w, line);
            break;
        }
        m->next = NULL;
        m->acked = 0;   // (only a batch's sends to ranks of the same process are acked)
        m->tag = h.tag;
        m->n = (size_t)h.bytes / sizeof(float);
        m->data = (float *)(m + 1);
        if (mt__recv_all(peer->fd, m->data, (size_t)h.bytes, 0) != 1) {
            free(m);
            break;
        }
        mt__inbox *box = &w->inbox[h.dst];
        pthread_mutex_lock(&box->mu);
        if (box->tail[h.src]) box->tail[h.src]->next = m;
        else box->head[h.src] = m;
        box->tail[h.src] = m;
        pthread_cond_broadcast(&box->cv);
        pthread_mutex_unlock(&box->mu);
    }
    pthread_mutex_lock(&w->mu);
    int closing = net->closing;
    pthread_mutex_unlock(&w->mu);
    if (!closing) {   // gone: its ranks can send nothing more
        for (int r = w->first_rank; r < w->first_rank + w->local_size; r++) {
            mt__inbox *box = &w->inbox[r];
            pthread_mutex_lock(&box->mu);
            for (int k = 0; k < peer->info.nranks; k++) box->src_done[peer->info.first_rank + k] = 1;
            pthread_cond_broadcast(&box->cv);
            pthread_mutex_unlock(&box->mu);
        }
    }
    return NULL;
}

// one message to a rank of another process: header and payload (head, then data), atomically
// on the connection. Returns 0 if the connection is gone.
static int mt__net_send(mt_world *w, int src, int dst, int tag, int kind, const void *head, size_t head_bytes,
                        const void *data, size_t bytes) {
    mt__net *net = w->net;
    mt__peer *peer = &net->peers[net->rank_proc[dst]];
    mt__wire h;
    h.src = src;
    h.dst = dst;
    h.tag = tag;
    h.kind = kind;
    h.bytes = head_bytes + bytes;
    pthread_mutex_lock(&peer->send_mu);
    int ok = peer->fd >= 0 && mt__send_all(peer->fd, &h, sizeof h) && (head_bytes == 0 || mt__send_all(peer->fd,
             head, head_bytes)) && (bytes == 0 || mt__send_all(peer->fd, data, bytes));
    pthread_mutex_unlock(&peer->send_mu);
    return ok;
}

// the first error of this process goes to every other one (best effort: some may be gone)
static void mt__net_send_abort(mt_world *w, const char *line) {
    mt__net *net = w->net;
    for (int p = 0; p < net->nprocs; p++) {
        if (p == net->proc) continue;
        mt__net_send(w, w->first_rank, net->peers[p].info.first_rank, 0, MT__NET_ABORT, NULL, 0, line, strlen(line));
    }
}

// ---- the mesh: a connection between every two processes ----
typedef struct {
    char magic[8];
    int32_t proc;
} mt__hello;

static void mt__net_mesh(mt__net *net, int lfd, const char *master_addr, double timeout) {
    double deadline = mt_time_seconds() + timeout;
    int me = net->proc;
    for (int q = 0; q < me; q++) {   // I call the processes before me ...
        mt__proc_info *p = &net->peers[q].info;
        const char *addr = q == 0 ? master_addr : p->addr;
        if (strncmp(addr, "127.", 4) == 0 && p->node != net->peers[me].info.node) addr = p->host;
        char why[256] = "";
        int fd = mt__connect_retry(addr, p->port, deadline, why, sizeof why);
        mt__hello hello;
        memcpy(hello.magic, MT__RDZV_MAGIC, 8);
        hello.proc = me;
        if (fd < 0 || !mt__send_all(fd, &hello, sizeof hello))
            mt_fatal("process %d cannot connect to process %d at %s:%d (host %s): %s\nhint: the nodes must reach each "
                     "other on any TCP port; when a host has several interfaces, MASTER_ADDR picks the one used",
                     me, q, addr, p->port, p->host, fd < 0 ? why : "closed");
        net->peers[q].fd = fd;
    }
    for (int k = me + 1; k < net->nprocs; k++) {   // ... and the ones after me call me
        struct sockaddr_in from;
        int fd = mt__accept_until(lfd, deadline, &from);
        if (fd < 0) {
            int missing = -1;
            for (int q = net->nprocs - 1; q > me; q--) if (net->peers[q].fd < 0) missing = q;
            mt_fatal("process %d: process %d (host %s) did not connect within %g s\nhint: the nodes must reach each "
                     "other on any TCP port (firewalls)", me, missing, net->peers[missing].info.host, timeout);
        }
        mt__hello hello;
        if (mt__recv_all(fd, &hello, sizeof hello, deadline) != 1 || memcmp(hello.magic, MT__RDZV_MAGIC, 8) != 0 ||
            hello.proc <= me || hello.proc >= net->nprocs || net->peers[hello.proc].fd >= 0) {
            close(fd);   // not one of ours
            k--;
            continue;
        }
        net->peers[hello.proc].fd = fd;
    }
}

// ---- the world of a launched job ----
int mt_world_first_rank(const mt_world *w) { return w->first_rank; }
int mt_world_local_size(const mt_world *w) { return w->local_size; }
int mt_world_node(const mt_world *w, int rank) { return w->net ? w->net->rank_node[rank] : 0; }
int mt_world_node_rank(const mt_world *w, int rank) { return w->net ? w->net->rank_node_rank[rank] : rank; }
int mt_world_node_size(const mt_world *w, int rank) { return w->net ? w->net->rank_node_size[rank] : w->size; }

// every TP group on one node: TP all-reduces twice per layer, which only NVLink keeps cheap
static void mt__check_topology(const mt_world *w, const mt_config *cfg) {
    int TP = cfg->parallel.tensor_model_parallel_size;
    mt__net *net = w->net;
    for (int r = 0; r < w->size; r++) {
        int first = r - r % TP;
        if (net->rank_node[r] == net->rank_node[first]) continue;
        const char *h0 = net->peers[net->rank_proc[first]].info.host, *h1 = net->peers[net->rank_proc[r]].info.host;
        int per_node = net->rank_node_size[first];
        if (TP > per_node)
            mt_fatal("TP=%d is larger than the %d ranks of node %d (%s): the TP group of ranks %d..%d would cross "
                     "nodes\nhint: tensor parallelism all-reduces twice per layer and needs one node's fast links "
                     "(NVLink); use TP <= %d and spread the rest over PP and DP",
                     TP, per_node, net->rank_node[first], h0, first, first + TP - 1, per_node);
        mt_fatal("the TP group of ranks %d..%d spans node %d (%s) and node %d (%s)\nhint: a node's ranks must be a "
                 "multiple of TP=%d (node %d has %d): tensor parallelism belongs inside one node",
                 first, first + TP - 1, net->rank_node[first], h0, net->rank_node[r], h1, TP, net->rank_node[first],
                 per_node);
    }
}

mt_world *mt_world_create_launched(const mt_launch *l, const mt_config *cfg) {
    if (l->kind == MT_LAUNCH_THREADS || l->nprocs <= 1) return mt_world_create(cfg->world_size);
    if (cfg->world_size != l->nprocs * l->ranks_per_proc)
        mt_fatal("internal: the world has %d ranks, the launch %d x %d", cfg->world_size, l->nprocs, l->ranks_per_proc);
    mt__net *net = (mt__net *)mt_calloc(1, sizeof(mt__net), "network");
    net->nprocs = l->nprocs;
    net->proc = l->proc;
    net->peers = (mt__peer *)mt_calloc((size_t)l->nprocs, sizeof(mt__peer), "network");
    for (int p = 0; p < l->nprocs; p++) {
        net->peers[p].fd = -1;
        net->peers[p].net = net;
        pthread_mutex_init(&net->peers[p].send_mu, NULL);
    }
    char why[256];
    int mesh_port = 0;   // where my peers will call me
    int mesh_fd = mt__listen(0, &mesh_port, why, sizeof why);
    if (mesh_fd < 0) mt_fatal("process %d cannot listen on a TCP port: %s", l->proc, why);
    mt__checkin mine;
    memset(&mine, 0, sizeof mine);
    memcpy(mine.magic, MT__RDZV_MAGIC, 8);
    mine.nprocs = l->nprocs;
    mine.proc = l->proc;
    mine.ranks_per_proc = l->ranks_per_proc;
    mine.node = l->node;
    mine.port = mesh_port;
    mine.pid = (int32_t)getpid();
    mt__gethostname(mine.host, sizeof mine.host);
    char master[256];
    snprintf(master, sizeof master, "%s", l->master_addr);
    snprintf(net->where, sizeof net->where, "the rendezvous at %s:%d", l->master_addr, l->master_port);
    if (l->proc == 0) {
        int port = 0;
        int lfd = mt__listen(l->init_file[0] ? 0 : l->master_port, &port, why, sizeof why);
        if (lfd < 0)
            mt_fatal("process 0 cannot listen at port %d for the rendezvous: %s\nhint: another job may use "
                     "MASTER_PORT=%d; pick a free one", l->master_port, why, l->master_port);
        if (l->init_file[0]) {   // publish where we listen: temp, fsync, rename
            if (!master[0]) mt__gethostname(master, sizeof master);
            snprintf(net->where, sizeof net->where, "the rendezvous at %s:%d (from %s)", master, port, l->init_file);
            char tmp[MT_PATH_MAX + 64];
            FILE *f = mt_atomic_open(l->init_file, tmp, sizeof tmp);
            fprintf(f, MT__RDZV_MAGIC " %s %d\n", master, port);
            mt_atomic_commit(f, tmp, l->init_file);
        }
        mt__rendezvous_serve(net, lfd, l, &mine);
        close(lfd);
        if (l->init_file[0]) unlink(l->init_file);   // everyone has read it; a later job starts clean
    } else {
        mt__rendezvous_join(net, master, sizeof master, l->master_port, &mine, l->timeout_s,
                            l->init_file[0] ? l->init_file : NULL);
    }
    mt__net_mesh(net, mesh_fd, master, l->timeout_s);
    close(mesh_fd);
    // who is where: each rank's process, node, and place on its node (its GPU)
    int world = cfg->world_size;
    net->rank_proc = (int *)mt_malloc(sizeof(int) * (size_t)world, "network");
    net->rank_node = (int *)mt_malloc(sizeof(int) * (size_t)world, "network");
    net->rank_node_rank = (int *)mt_malloc(sizeof(int) * (size_t)world, "network");
    net->rank_node_size = (int *)mt_malloc(sizeof(int) * (size_t)world, "network");
    for (int p = 0; p < l->nprocs; p++)
        for (int k = 0; k < net->peers[p].info.nranks; k++) {
            int r = net->peers[p].info.first_rank + k;
            net->rank_proc[r] = p;
            net->rank_node[r] = net->peers[p].info.node;
        }
    for (int r = 0; r < world; r++) {
        int before = 0, total = 0;
        for (int s = 0; s < world; s++) {
            if (net->rank_node[s] != net->rank_node[r]) continue;
            before += s < r;
            total++;
        }
        net->rank_node_rank[r] = before;
        net->rank_node_size[r] = total;
        if (net->rank_node[r] + 1 > net->num_nodes) net->num_nodes = net->rank_node[r] + 1;
    }
    mt_world *w = mt_world_create(world);
    w->first_rank = l->first_rank;
    w->local_size = l->ranks_per_proc;
    w->net = net;
    net->world = w;
    mt__check_topology(w, cfg);
    for (int p = 0; p < l->nprocs; p++) {
        if (p == l->proc) continue;
        int err = pthread_create(&net->peers[p].reader, NULL, mt__net_reader, &net->peers[p]);
        if (err) mt_fatal("cannot start a network reader thread: %s", strerror(err));
        net->peers[p].reader_started = 1;
    }
    return w;
}

// the end of a job: stop the readers, close the connections
static void mt__net_free(mt__net *net) {
    pthread_mutex_lock(&net->world->mu);
    net->closing = 1;
    pthread_mutex_unlock(&net->world->mu);
    for (int p = 0; p < net->nprocs; p++)
        if (net->peers[p].fd >= 0) shutdown(net->peers[p].fd, SHUT_RDWR);
    for (int p = 0; p < net->nprocs; p++) {
        if (net->peers[p].reader_started) pthread_join(net->peers[p].reader, NULL);
        if (net->peers[p].fd >= 0) close(net->peers[p].fd);
        pthread_mutex_destroy(&net->peers[p].send_mu);
    }
    free(net->peers);
    free(net->rank_proc);
    free(net->rank_node);
    free(net->rank_node_rank);
    free(net->rank_node_size);
    free(net);
}

// ---------------------------------------------------------------------------------------------
// groups: mt_comm_init and the registry
// ---------------------------------------------------------------------------------------------
// NCCL's rule holds here too: each mt_comm_init call makes a new communicator, and the k-th call
// with a given member list on one rank pairs with the k-th call with that list on every other
// member. A world of 2 with DP 2 has "world" = {0,1} and "dp" = {0,1}: two calls, two groups,
// so a collective on one can never be mistaken for a collective on the other.
void mt_comm_init(mt_comm *c, mt_world *w, int my_global_rank, const int *members, int size) {
    if (size < 1 || size > w->size)
        mt_fatal("a group of %d ranks does not fit in a world of %d ranks", size, w->size);
    int me = -1;
    for (int i = 0; i < size; i++) {
        if (members[i] < 0 || members[i] >= w->size)
            mt_fatal("group member %d is rank %d, outside the world of %d ranks", i, members[i], w->size);
        for (int j = 0; j < i; j++)
            if (members[j] == members[i]) mt_fatal("rank %d appears twice in a group", members[i]);
        if (members[i] == my_global_rank) me = i;
    }
    if (me < 0) mt_fatal("rank %d initializes a group it is not a member of\n"
                         "hint: pass the members list that contains the calling rank", my_global_rank);

    // allocate before locking: mt_malloc may call mt_fatal, which takes world->mu itself
    mt__group *fresh = mt__group_new(members, size);
    pthread_mutex_lock(&w->mu);
    mt__group *g = NULL, **link = &w->groups;
    int same = 0;   // groups of these members made before: this one is the same-th of them
    for (; *link; link = &(*link)->next) {
        mt__group *h = *link;
        if (h->size != size || memcmp(h->members, members, (size_t)size * sizeof(int)) != 0) continue;
        if (!h->joined[me]) {
            g = h;
            break;
        }
        same++;
    }
    if (!g) {   // first member to arrive: publish the new group at the end of the registry
        g = fresh;
        fresh = NULL;
        // across processes a group is named by its members and its place among the groups of the
        // same members (the k-th init pairs with the k-th everywhere): every process computes the
        // same tag for its messages without asking the others
        uint64_t h = mt_hash64((uint64_t)same + 0x9e3779b97f4a7c15ull);
        for (int i = 0; i < size; i++) {
            h = mt_hash64(h ^ (uint64_t)members[i]);
            g->remote |= !mt__is_local(w, members[i]);
        }
        g->tag = -1 - (int)(h % 0x3fffffffu);
        g->aborted = w->aborted;
        for (int i = 0; i < size; i++) {
            g->done[i] = w->rank_done[members[i]];
            g->n_done += g->done[i];
        }
        *link = g;
    }
    g->joined[me] = 1;
    pthread_mutex_unlock(&w->mu);
    if (fresh) mt__group_free(fresh);

    memset(c, 0, sizeof *c);   // no NCCL communicator: mt__nccl_join adds one (GPU build)
    c->world = w;
    c->size = size;
    c->rank = me;
    c->global_rank = my_global_rank;
    c->members = g->members;
    c->name = "group";
    c->group = g;
    c->marks[0] = c->marks[1] = -1;
}

// MT_TRACE=1: "[r3] all_reduce tp n=4096", one fputs per line so ranks' lines never interleave
static void mt__trace(const mt_comm *c, const char *fmt, ...) {
    if (!c->world->trace) return;
    char line[256];
    int len = snprintf(line, sizeof line, "[r%d] ", c->global_rank);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + len, sizeof line - (size_t)len - 1, fmt, ap);
    va_end(ap);
    strcat(line, "\n");
    fputs(line, stderr);
}

// ---------------------------------------------------------------------------------------------
// communication counters: calls, bytes and seconds per group, and a timeline span per call
// ---------------------------------------------------------------------------------------------
// What NCCL's own NCCL_DEBUG=INFO or nsys would tell you, counted where the calls are made, so a
// claim like "each extra TP rank adds N% traffic" can be checked against the shapes. The bytes
// of a call are the bytes of the buffer it moves at this rank (the message size of nccl-tests):
//   all_reduce n*4 (double: n*8) | reduce_scatter and all_gather size*n_per_rank*4 (the whole
//   buffer) | broadcast n*4 | send, recv n*4 (each side counts its own) | barrier 0
// A group of one rank moves nothing and counts nothing. Megatron has no such counters; its
// timers (--timing-log-level 2) time the same calls.
// calls: how many calls the span holds (a batch of pipeline messages: one per send and receive);
// kind: MT_SPAN_RECV for a batch that receives (mostly waiting), else MT_SPAN_COMM
static void mt__comm_count_calls(mt_comm *c, const char *what, int calls, size_t bytes, double t0, mt_span_kind kind) {
    double t1 = mt_time_seconds();
    c->calls += (unsigned long long)calls;
    c->bytes += bytes;
    if (!c->nccl) c->seconds += t1 - t0;   // NCCL's calls: their GPU time, see mt__nccl_seconds
    int mark0 = c->marks[0], mark1 = c->marks[1];   // the NCCL path's marks (GPU), or -1
    c->marks[0] = c->marks[1] = -1;
    if (c->spans && c->spans->enabled) {
        mt_span s;
        memset(&s, 0, sizeof s);
        s.t0 = t0;
        s.t1 = t1;
        s.mark0 = mark0;
        s.mark1 = mark1;
        s.kind = kind;
        s.mb = s.chunk = s.layer_first = s.layer_last = -1;
        s.name = what;
        s.group = c->name;
        s.bytes = bytes;
        mt_span_add(c->spans, &s);
    }
}
static void mt__comm_count(mt_comm *c, const char *what, size_t bytes, double t0) {
    mt__comm_count_calls(c, what, 1, bytes, t0, MT_SPAN_COMM);
}

// ---------------------------------------------------------------------------------------------
// the barrier: mutex + condition variable + generation counter
// ---------------------------------------------------------------------------------------------
static void mt__describe_post(const mt__post *p, char *out, size_t cap) {
    if (p->kind == MT__COLL_BARRIER) snprintf(out, cap, "barrier()");
    else if (p->kind == MT__COLL_BROADCAST) snprintf(out, cap, "broadcast(n=%zu, root %d)", p->n, p->arg);
    else if (p->kind == MT__COLL_ALL_GATHER) snprintf(out, cap, "all_gather(n=%zu)", p->n);
    else snprintf(out, cap, "%s(n=%zu, %s)", mt__coll_names[p->kind], p->n, p->arg == MT_SUM ? "sum" : "max");
}

// The member that opens sync 1 compares every post with group rank 0's, before anyone touches
// a buffer, and leaves the verdict in the group; every member reads it under the mutex as it
// leaves (it stays valid: the next barrier cannot open before this member arrives there). On a
// mismatch all members stop with the same message and none writes a buffer. (Real NCCL would
// hang or corrupt memory; here the student is told which calls disagree.)
static void mt__check_posts_locked(mt__group *g, const mt_comm *c) {
    const mt__post *p0 = &g->posts[0];
    g->mismatch = 0;
    for (int j = 1; j < g->size; j++) {
        const mt__post *p = &g->posts[j];
        if (p->kind == p0->kind && p->n == p0->n && p->arg == p0->arg) continue;
        char mine[96], theirs[96];
        mt__describe_post(p, mine, sizeof mine);
        mt__describe_post(p0, theirs, sizeof theirs);
        snprintf(g->mismatch_msg, sizeof g->mismatch_msg,
                 "group %s: rank %d called %s while rank %d called %s\n"
                 "hint: every member of a group must call the same collectives, with the same counts, in the same "
                 "order (NCCL's rule)",
                 c->name, g->members[j], mine, g->members[0], theirs);
        g->mismatch = 1;
        return;
    }
}

// The last member to arrive opens the barrier: it resets `arrived` and bumps `generation`, then
// wakes everyone. A waiter does not wait for "arrived == size" (the last one already reset it to
// 0, and a fast member may already be arriving at the next barrier): it waits until the
// generation it arrived in is over. pthread_cond_wait can wake up spuriously, hence the loop.
//
// Every collective is this barrier twice, around a data phase:
//   sync 1 (abortable=1)  post my call and buffers in g->posts[rank], wait for all members.
//                         Now every input is ready and every output may be written.
//                         (mt_barrier is sync 1 alone: it has no data phase.)
//   data phase            each rank reads other ranks' buffers (one process: shared memory)
//                         and writes only its own disjoint part, so no lock is needed.
//   sync 2 (abortable=0)  wait again: nobody returns, reuses or frees its buffers while another
//                         rank may still be reading or writing them.
// Sync 1 is all or nothing: a waiter that leaves on abort first takes itself out (arrived--),
// and a rank that arrives after the abort leaves at once, so once a group is aborted its barrier
// can never open. Everyone who passed sync 1 is in the data phase, which never blocks, so sync 2
// always opens; it must not be left on abort, or a rank could end (and the launcher free its
// stack) while a partner still writes into its buffers.
static void mt__group_sync(const mt_comm *c, const mt__post *post, int abortable) {
    mt__group *g = (mt__group *)c->group;
    pthread_mutex_lock(&g->mu);
    if (abortable && g->aborted) {
        pthread_mutex_unlock(&g->mu);
        mt__rank_exit();
    }
    if (post) g->posts[c->rank] = *post;
    unsigned long my_generation = g->generation;
    if (++g->arrived == g->size) {   // last to arrive: check the posts, open the barrier
        if (post) mt__check_posts_locked(g, c);
        g->arrived = 0;
        g->generation++;
        pthread_cond_broadcast(&g->cv);
    }
    while (g->generation == my_generation) {
        if (abortable && g->aborted) {
            g->arrived--;
            pthread_mutex_unlock(&g->mu);
            mt__rank_exit();
        }
        if (abortable && g->n_done > 0) {   // a member returned: it will never come
            int gone = 0;
            while (!g->done[gone]) gone++;
            g->arrived--;
            pthread_mutex_unlock(&g->mu);
            mt_fatal("rank %d waits in %s on group %s for rank %d, whose rank function has already returned\n"
                     "hint: every member of a group must make the same collective calls in the same order",
                     c->global_rank, post ? mt__coll_names[post->kind] : "barrier", c->name, g->members[gone]);
        }
        pthread_cond_wait(&g->cv, &g->mu);
    }
    if (post && g->mismatch) {   // copy the message out: mt_fatal must not run under the mutex
        char msg[sizeof g->mismatch_msg];
        memcpy(msg, g->mismatch_msg, sizeof msg);
        pthread_mutex_unlock(&g->mu);
        mt_fatal("%s", msg);
    }
    pthread_mutex_unlock(&g->mu);
}

// a group with members in other processes: its collectives are messages (after send / recv below)
static int mt__is_remote(const mt_comm *c) { return ((const mt__group *)c->group)->remote; }
static void mt__net_collective(mt_comm *c, int kind, int arg, const void *send, void *recv, size_t n);

static void mt__post_set(mt__post *p, int kind, int arg, size_t n, const void *send, void *recv) {
    p->kind = kind;
    p->arg = arg;
    p->n = n;
    p->send = send;
    p->recv = recv;
}

void mt_barrier(mt_comm *c) {
    mt__trace(c, "barrier %s", c->name);
    if (c->size == 1) return;
    double t0 = mt_time_seconds();
    mt__post p;
    mt__post_set(&p, MT__COLL_BARRIER, 0, 0, NULL, NULL);
    if (mt__is_remote(c)) mt__net_collective(c, MT__COLL_BARRIER, 0, NULL, NULL, 0);
    else mt__group_sync(c, &p, 1);
    mt__comm_count(c, "barrier", 0, t0);
}

// ---------------------------------------------------------------------------------------------
// all-reduce: each rank reduces one slice for everybody, in fixed rank order
// ---------------------------------------------------------------------------------------------
// 3 ranks, the buffer cut into 3 slices; rank r computes slice r of the result and writes it
// into all 3 buffers:
//
//              slice 0           slice 1           slice 2
//   buf r0   a0 a1 a2 a3       a4 a5 a6 a7       a8 a9
//   buf r1   b0 b1 b2 b3       b4 b5 b6 b7       b8 b9
//   buf r2   c0 c1 c2 c3       c4 c5 c6 c7       c8 c9
//            rank 0 computes   rank 1 computes   rank 2 computes
//            s0 = (a0+b0)+c0   s4 = (a4+b4)+c4   ...  and writes s_i into buf r0, r1 and r2
//
// Why the results are deterministic: float addition is not associative ((a+b)+c and a+(b+c)
// can differ in the last bit), so the order of the adds must not depend on timing or on which
// thread does the work. Here element i is always (((x_0 + x_1) + x_2) + ...) in rank order, it is
// computed once and copied, so every rank holds the same bits, in every run; and the slicing only
// decides WHICH thread computes an element, never HOW. (NCCL's ring adds in an order that depends
// on the element's chunk, which is why GPU and CPU results can differ in the last bits.)
// Cost: each rank reads size slices of n/size and writes size of them: O(size * n) in all, in
// parallel. Slices are whole multiples of 64 bytes so that two ranks never write one cache line.
#define MT__BLOCK 1024   // elements reduced at a time in a small stack buffer (stays in L1)

static void mt__slice(size_t n, int parts, int i, size_t align, size_t *lo, size_t *hi) {
    size_t per = (n + (size_t)parts - 1) / (size_t)parts;
    per = (per + align - 1) / align * align;
    size_t start = per * (size_t)i;
    *lo = start < n ? start : n;
    *hi = n - *lo < per ? n : *lo + per;
}

// MT_MAX lets NaN through (like torch.max), so a found-nan flag survives the reduction
static float mt__max_f32(float a, float b) { return (b > a || isnan(b)) ? b : a; }
static double mt__max_f64(double a, double b) { return (b > a || isnan(b)) ? b : a; }

// acc[0..m) = acc op x, elementwise
static void mt__accumulate_f32(float *acc, const float *x, size_t m, int op) {
    if (op == MT_SUM) for (size_t i = 0; i < m; i++) acc[i] += x[i];
    else              for (size_t i = 0; i < m; i++) acc[i] = mt__max_f32(acc[i], x[i]);
}

static void mt__accumulate_f64(double *acc, const double *x, size_t m, int op) {
    if (op == MT_SUM) for (size_t i = 0; i < m; i++) acc[i] += x[i];
    else              for (size_t i = 0; i < m; i++) acc[i] = mt__max_f64(acc[i], x[i]);
}

static void mt__check_op(const mt_comm *c, const char *what, mt_reduce_op op) {
    if (op != MT_SUM && op != MT_MAX) mt_fatal("%s on group %s: unknown reduce op %d", what, c->name, (int)op);
}

void mt_all_reduce(mt_comm *c, float *buf, size_t n, mt_reduce_op op) {
    double t0 = mt_time_seconds();
    if (c->nccl) {   // device buffers
        mt__nccl_collective(c, MT__COLL_ALL_REDUCE, buf, buf, n, (int)op, 0);
        mt__comm_count(c, "all_reduce", n * sizeof(float), t0);
        return;
    }
    mt__trace(c, "all_reduce %s n=%zu", c->name, n);
    mt__check_op(c, "all_reduce", op);
    if (c->size == 1) return;
    if (mt__is_remote(c)) {
        mt__net_collective(c, MT__COLL_ALL_REDUCE, (int)op, buf, buf, n);
        mt__comm_count(c, "all_reduce", n * sizeof(float), t0);
        return;
    }
    mt__post p;
    mt__post_set(&p, MT__COLL_ALL_REDUCE, (int)op, n, buf, buf);
    mt__group_sync(c, &p, 1);
    const mt__post *posts = ((const mt__group *)c->group)->posts;
    size_t lo, hi;
    mt__slice(n, c->size, c->rank, 64 / sizeof(float), &lo, &hi);
    float acc[MT__BLOCK];
    for (size_t b = lo; b < hi; b += MT__BLOCK) {
        size_t m = hi - b < MT__BLOCK ? hi - b : MT__BLOCK;
        memcpy(acc, (const float *)posts[0].send + b, m * sizeof(float));
        for (int j = 1; j < c->size; j++) mt__accumulate_f32(acc, (const float *)posts[j].send + b, m, (int)op);
        for (int j = 0; j < c->size; j++) memcpy((float *)posts[j].recv + b, acc, m * sizeof(float));
    }
    mt__group_sync(c, NULL, 0);
    mt__comm_count(c, "all_reduce", n * sizeof(float), t0);
}

// started, not waited for (--overlap-grad-reduce, section 7; the tensor-parallel layers' backward,
// section 4): NCCL's collective on the group's stream, the rank's kernels going on beside it,
// counted as the blocking call is; on the threads backend, the blocking call at once
static void mt__nccl_start(mt_comm *c, int kind, const float *send, float *recv, size_t n, int op, const char *what,
                           size_t bytes) {
    double t0 = mt_time_seconds();
    mt__nccl_collective(c, kind, send, recv, n, op, 1);
    mt__comm_count(c, what, bytes, t0);
}
void mt_all_reduce_start(mt_comm *c, float *buf, size_t n, mt_reduce_op op) {
    if (c->nccl) mt__nccl_start(c, MT__COLL_ALL_REDUCE, buf, buf, n, (int)op, "all_reduce", n * sizeof(float));
    else mt_all_reduce(c, buf, n, op);
}
void mt_all_gather_start(mt_comm *c, const float *send, float *recv, size_t n_per_rank) {
    if (c->nccl)
        mt__nccl_start(c, MT__COLL_ALL_GATHER, send, recv, n_per_rank, 0, "all_gather",
                       (size_t)c->size * n_per_rank * sizeof(float));
    else mt_all_gather(c, send, recv, n_per_rank);
}
void mt_reduce_scatter_start(mt_comm *c, const float *send, float *recv, size_t n_per_rank, mt_reduce_op op) {
    if (c->nccl)
        mt__nccl_start(c, MT__COLL_REDUCE_SCATTER, send, recv, n_per_rank, (int)op, "reduce_scatter",
                       (size_t)c->size * n_per_rank * sizeof(float));
    else mt_reduce_scatter(c, send, recv, n_per_rank, op);
}
void mt_comm_wait(mt_comm *c) {
    if (!c->nccl || !c->started) return;
    mt__nccl_end(c);   // the rank's stream waits for the group's, which holds every started call
    c->started = 0;
}

// the same in double: global gradient norms and loss sums, where float would lose digits
void mt_all_reduce_double(mt_comm *c, double *buf, size_t n, mt_reduce_op op) {
    mt__trace(c, "all_reduce_double %s n=%zu", c->name, n);
    mt__check_op(c, "all_reduce_double", op);
    if (c->size == 1) return;
    double t0 = mt_time_seconds();
    if (mt__is_remote(c)) {
        mt__net_collective(c, MT__COLL_ALL_REDUCE_DOUBLE, (int)op, buf, buf, n);
        mt__comm_count(c, "all_reduce", n * sizeof(double), t0);
        return;
    }
    mt__post p;
    mt__post_set(&p, MT__COLL_ALL_REDUCE_DOUBLE, (int)op, n, buf, buf);
    mt__group_sync(c, &p, 1);
    const mt__post *posts = ((const mt__group *)c->group)->posts;
    size_t lo, hi;
    mt__slice(n, c->size, c->rank, 64 / sizeof(double), &lo, &hi);
    double acc[MT__BLOCK];
    for (size_t b = lo; b < hi; b += MT__BLOCK) {
        size_t m = hi - b < MT__BLOCK ? hi - b : MT__BLOCK;
        memcpy(acc, (const double *)posts[0].send + b, m * sizeof(double));
        for (int j = 1; j < c->size; j++) mt__accumulate_f64(acc, (const double *)posts[j].send + b, m, (int)op);
        for (int j = 0; j < c->size; j++) memcpy((double *)posts[j].recv + b, acc, m * sizeof(double));
    }
    mt__group_sync(c, NULL, 0);
    mt__comm_count(c, "all_reduce", n * sizeof(double), t0);
}

// ---------------------------------------------------------------------------------------------
// reduce-scatter and all-gather: the two halves of an all-reduce (distributed optimizer, SP)
// ---------------------------------------------------------------------------------------------
// reduce-scatter: send is (size * n) on every rank; rank r gets chunk r reduced over the ranks:
//   recv_r[i] = send_0[r*n + i] + send_1[r*n + i] + ...   (rank order, as in all-reduce)
// Rank r is the only one that reads chunk r of any send buffer, so recv may alias it
// (recv = send + r*n, "in place"). all_gather(reduce_scatter(x)) == all_reduce(x), bit for bit.
void mt_reduce_scatter(mt_comm *c, const float *send, float *recv, size_t n_per_rank, mt_reduce_op op) {
    double t0 = mt_time_seconds();
    if (c->nccl) {
        mt__nccl_collective(c, MT__COLL_REDUCE_SCATTER, send, recv, n_per_rank, (int)op, 0);
        mt__comm_count(c, "reduce_scatter", (size_t)c->size * n_per_rank * sizeof(float), t0);
        return;
    }
    mt__trace(c, "reduce_scatter %s n=%zu", c->name, n_per_rank);
    mt__check_op(c, "reduce_scatter", op);
    if (c->size == 1) {
        if (n_per_rank > 0 && recv != send) memmove(recv, send, n_per_rank * sizeof(float));
        return;
    }
    if (mt__is_remote(c)) {
        mt__net_collective(c, MT__COLL_REDUCE_SCATTER, (int)op, send, recv, n_per_rank);
        mt__comm_count(c, "reduce_scatter", (size_t)c->size * n_per_rank * sizeof(float), t0);
        return;
    }
    mt__post p;
    mt__post_set(&p, MT__COLL_REDUCE_SCATTER, (int)op, n_per_rank, send, recv);
    mt__group_sync(c, &p, 1);
    const mt__post *posts = ((const mt__group *)c->group)->posts;
    size_t offset = (size_t)c->rank * n_per_rank;
    float acc[MT__BLOCK];
    for (size_t b = 0; b < n_per_rank; b += MT__BLOCK) {
        size_t m = n_per_rank - b < MT__BLOCK ? n_per_rank - b : MT__BLOCK;
        memcpy(acc, (const float *)posts[0].send + offset + b, m * sizeof(float));
        for (int j = 1; j < c->size; j++) mt__accumulate_f32(acc, (const float *)posts[j].send + offset + b, m,
                                                             (int)op);
        memcpy(recv + b, acc, m * sizeof(float));   // after all reads of this block: in place is safe
    }
    mt__group_sync(c, NULL, 0);
    mt__comm_count(c, "reduce_scatter", (size_t)c->size * n_per_rank * sizeof(float), t0);
}

// all-gather: recv = [send_0 | send_1 | ... ], each (n_per_rank); every rank copies all chunks
// into its own recv (it writes only its own memory). send may be recv + rank*n ("in place").
void mt_all_gather(mt_comm *c, const float *send, float *recv, size_t n_per_rank) {
    double t0 = mt_time_seconds();
    if (c->nccl) {
        mt__nccl_collective(c, MT__COLL_ALL_GATHER, send, recv, n_per_rank, 0, 0);
        mt__comm_count(c, "all_gather", (size_t)c->size * n_per_rank * sizeof(float), t0);
        return;
    }
    mt__trace(c, "all_gather %s n=%zu", c->name, n_per_rank);
    size_t bytes = n_per_rank * sizeof(float);
    if (c->size == 1) {
        if (bytes > 0 && recv != send) memmove(recv, send, bytes);
        return;
    }
    if (mt__is_remote(c)) {
        mt__net_collective(c, MT__COLL_ALL_GATHER, 0, send, recv, n_per_rank);
        mt__comm_count(c, "all_gather", (size_t)c->size * bytes, t0);
        return;
    }
    mt__post p;
    mt__post_set(&p, MT__COLL_ALL_GATHER, 0, n_per_rank, send, recv);
    mt__group_sync(c, &p, 1);
    const mt__post *posts = ((const mt__group *)c->group)->posts;
    for (int j = 0; j < c->size; j++) {
        float *dst = recv + (size_t)j * n_per_rank;
        if (bytes > 0 && dst != posts[j].send) memcpy(dst, posts[j].send, bytes);
    }
    mt__group_sync(c, NULL, 0);
    mt__comm_count(c, "all_gather", (size_t)c->size * bytes, t0);
}

// broadcast: every rank's buf becomes root's buf (root is a group rank)
void mt_broadcast(mt_comm *c, float *buf, size_t n, int root) {
    double t0 = mt_time_seconds();
    if (c->nccl) {
        mt__nccl_collective(c, MT__COLL_BROADCAST, buf, buf, n, root, 0);
        mt__comm_count(c, "broadcast", n * sizeof(float), t0);
        return;
    }
    mt__trace(c, "broadcast %s n=%zu root %d", c->name, n, root);
    if (root < 0 || root >= c->size) mt_fatal("broadcast on group %s: root %d is not a group rank (size %d)", c->name,
                                              root, c->size);
    if (c->size == 1) return;
    if (mt__is_remote(c)) {
        mt__net_collective(c, MT__COLL_BROADCAST, root, buf, buf, n);
        mt__comm_count(c, "broadcast", n * sizeof(float), t0);
        return;
    }
    mt__post p;
    mt__post_set(&p, MT__COLL_BROADCAST, root, n, buf, buf);
    mt__group_sync(c, &p, 1);
    const mt__post *posts = ((const mt__group *)c->group)->posts;
    if (c->rank != root && n > 0) memcpy(buf, posts[root].send, n * sizeof(float));
    mt__group_sync(c, NULL, 0);
    mt__comm_count(c, "broadcast", n * sizeof(float), t0);
}

// ---------------------------------------------------------------------------------------------
// send / recv: buffered point-to-point (pipeline activations and their gradients)
// ---------------------------------------------------------------------------------------------
// Every rank has one mailbox holding a FIFO list per source rank. mt_send copies the data into
// a fresh heap message, appends it to the destination's list for this source and returns: it
// never waits for the receiver. That is what lets a pipeline stage send its activation forward
// and go on with the next micro-batch; with a blocking send, two neighbours that both send
// before they receive (1F1B's steady state does exactly that) would wait for each other forever.
// mt_recv takes the OLDEST message from that source with the right tag (FIFO among equal tags,
// any order across tags), sleeping on the mailbox's condition variable until it arrives.
// In a job of several processes a message to a rank of another process goes out on the TCP
// connection to that process instead (mt__net_send), whose reader thread appends it to the same
// kind of list there: the receiver's side is the same code either way.

// one message from src to dst: head (head_bytes) then data (bytes), both multiples of 4.
// acked (dst a rank of this process only): its taker counts it in src's taken_by[dst]
static void mt__msg_post(mt_world *w, int src, int dst, int tag, const void *head, size_t head_bytes,
                         const void *data, size_t bytes, int acked) {
    if (!mt__is_local(w, dst)) {   // another process
        if (!mt__net_send(w, src, dst, tag, MT__NET_DATA, head, head_bytes, data, bytes))
            mt_fatal("rank %d cannot send to rank %d: the connection to its process (host %s) is closed\n"
                     "hint: that process ended or crashed; its own output says why", src, dst,
                     w->net->peers[w->net->rank_proc[dst]].info.host);
        return;
    }
    size_t total = head_bytes + bytes;
    if (total > (size_t)-1 - sizeof(mt__message)) mt_fatal("a message of %zu bytes is too large", total);
    mt__message *m = (mt__message *)mt_malloc(sizeof(mt__message) + total, "send buffer");
    m->next = NULL;
    m->tag = tag;
    m->acked = acked;
    m->n = total / sizeof(float);
    m->data = (float *)(m + 1);   // sizeof(mt__message) is a multiple of 8: floats are aligned
    if (head_bytes > 0) memcpy(m->data, head, head_bytes);
    if (bytes > 0) memcpy((char *)m->data + head_bytes, data, bytes);
    mt__inbox *box = &w->inbox[dst];
    pthread_mutex_lock(&box->mu);
    if (box->tail[src]) box->tail[src]->next = m;
    else box->head[src] = m;
    box->tail[src] = m;
    pthread_cond_broadcast(&box->cv);   // only the owner waits on it
    pthread_mutex_unlock(&box->mu);
}

// the oldest message from src with this tag in dst's mailbox, unlinked (the caller frees it);
// waits for it. what: the call, for the message when it can never arrive. in_order (a batch's
// receive, NCCL's rule): the oldest pipeline message (tag >= 0) from src, which must carry tag.
static mt__message *mt__msg_take(mt_world *w, int dst, int src, int tag, const char *what, int in_order) {
    mt__inbox *box = &w->inbox[dst];
    mt__message *m = NULL;
    pthread_mutex_lock(&box->mu);
    for (;;) {
        mt__message *prev = NULL;   // find the oldest message from src with this tag, unlink it
        for (m = box->head[src]; m && (in_order ? m->tag < 0 : m->tag != tag); m = m->next) prev = m;
        if (m && m->tag != tag) {
            int found = m->tag;
            pthread_mutex_unlock(&box->mu);
            mt_fatal("rank %d receives tag %d (%s) from rank %d, but rank %d's next message to it is tag %d\n"
                     "hint: NCCL pairs sends and receives in order, without tags: both ranks must make their "
                     "point-to-point calls in the same order", dst, tag, what, src, src, found);
        }
        if (m) {
            if (prev) prev->next = m->next;
            else box->head[src] = m->next;
            if (box->tail[src] == m) box->tail[src] = prev;
            break;
        }
        if (box->aborted) {
            pthread_mutex_unlock(&box->mu);
            mt__rank_exit();
        }
        if (box->src_done[src] || src == dst) {   // nobody can send it any more: report, don't hang
            pthread_mutex_unlock(&box->mu);
            int remote = !mt__is_local(w, src);
            mt_fatal("rank %d waits for a message from rank %d (%s) that can never arrive: %s\n"
                     "hint: %s", dst, src, what,
                     src == dst ? "it would have to send it to itself"
                     : remote   ? "its process has ended or lost its connection"
                                : "its rank function has returned",
                     remote ? "that process's own output says why; every member of a group must make the same calls "
                              "in the same order"
                            : "every recv needs a matching send with the same tag");
        }
        pthread_cond_wait(&box->cv, &box->mu);
    }
    pthread_mutex_unlock(&box->mu);
    if (m->acked) {   // tell the sender, who may be waiting for it (mt_p2p_batch)
        mt__inbox *from = &w->inbox[src];
        pthread_mutex_lock(&from->mu);
        from->taken_by[dst]++;
        pthread_cond_broadcast(&from->cv);
        pthread_mutex_unlock(&from->mu);
    }
    return m;
}

void mt_send(mt_comm *c, const float *buf, size_t n, int peer, int tag) {
    if (peer < 0 || peer >= c->size) mt_fatal("send on group %s: peer %d is not a group rank (size %d)", c->name, peer,
                                              c->size);
    int dst = c->members[peer];
    mt__trace(c, "send -> r%d tag %d n=%zu", dst, tag, n);
    double t0 = mt_time_seconds();
    if (n > ((size_t)-1 - sizeof(mt__message)) / sizeof(float)) mt_fatal("send of %zu floats is too large", n);
    mt__msg_post(c->world, c->global_rank, dst, tag, NULL, 0, buf, n * sizeof(float), 0);
    mt__comm_count(c, "send", n * sizeof(float), t0);
}

void mt_recv(mt_comm *c, float *buf, size_t n, int peer, int tag) {
    if (peer < 0 || peer >= c->size) mt_fatal("recv on group %s: peer %d is not a group rank (size %d)", c->name, peer,
                                              c->size);
    int src = c->members[peer], dst = c->global_rank;
    mt__trace(c, "recv <- r%d tag %d n=%zu", src, tag, n);
    double t0 = mt_time_seconds();
    char what[64];
    snprintf(what, sizeof what, "tag %d, n=%zu", tag, n);
    mt__message *m = mt__msg_take(c->world, dst, src, tag, what, 0);
    if (m->n != n) {
        size_t sent = m->n;
        free(m);
        mt_fatal("rank %d received %zu floats from rank %d (tag %d) but expected %zu\n"
                 "hint: the send and the recv of a message must use the same count",
                 dst, sent, src, tag, n);
    }
    if (n > 0) memcpy(buf, m->data, n * sizeof(float));
    free(m);
    mt__comm_count(c, "recv", n * sizeof(float), t0);
}

// a batch of pipeline messages (see the declaration): NCCL's group on the GPU build's device
// buffers (mt__nccl_p2p, in the NCCL path above), else the threads backend with NCCL's two rules:
//   1. post every send (a copy in the receiver's mailbox, acked when it is a rank of this process)
//   2. take every receive in the order given: the oldest pipeline message from its peer, which
//      must carry the tag asked for (NCCL matches the k-th send with the k-th receive)
//   3. wait until each send to this process's ranks was taken: an NCCL send of a large message
//      is done only when the receiver has it, so two ranks that each send before they receive,
//      outside one batch, wait for each other forever on GPUs; here they do too, and the CPU
//      build finds the schedule that would hang.
void mt_p2p_batch(mt_comm *c, const mt_p2p_op *ops, int count) {
    double t0 = mt_time_seconds();
    for (int i = 0; i < count; i++) {
        const mt_p2p_op *op = &ops[i];
        if (op->peer < 0 || op->peer >= c->size || op->tag < 0)
            mt_fatal("internal: a %s on group %s to group rank %d (size %d, mine %d) with tag %d", op->recv ? "recv" : "send",
                     c->name, op->peer, c->size, c->rank, op->tag);
        mt__trace(c, "%s r%d tag %d n=%zu (a batch of %d)", op->recv ? "recv <-" : "send ->", c->members[op->peer],
                  op->tag, op->n, count);
    }
    if (c->nccl) {
        mt__nccl_p2p(c, ops, count);
    } else {
        mt_world *w = c->world;
        int me = c->global_rank;
        mt__inbox *mine = &w->inbox[me];
        // 1. the sends. want[i]: the count of my messages its receiver will have taken once it has
        // taken this one (every earlier batch's were taken before it returned), 0: not acked
        unsigned long long *want = (unsigned long long *)mt_calloc((size_t)count, sizeof(unsigned long long), "batch");
        mt__own(free, want);
        pthread_mutex_lock(&mine->mu);
        for (int i = 0; i < count; i++) {
            int dst = c->members[ops[i].peer];
            if (ops[i].recv || !mt__is_local(w, dst)) continue;
            want[i] = mine->taken_by[dst] + 1;
            for (int j = 0; j < i; j++) want[i] += !ops[j].recv && c->members[ops[j].peer] == dst;
        }
        pthread_mutex_unlock(&mine->mu);
        for (int i = 0; i < count; i++) {
            const mt_p2p_op *op = &ops[i];
            if (op->recv) continue;
            if (op->n > ((size_t)-1 - sizeof(mt__message)) / sizeof(float)) mt_fatal("send of %zu floats is too large", op->n);
            mt__msg_post(w, me, c->members[op->peer], op->tag, NULL, 0, op->buf, op->n * sizeof(float), want[i] > 0);
        }
        // 2. the receives, in order
        for (int i = 0; i < count; i++) {
            const mt_p2p_op *op = &ops[i];
            if (!op->recv) continue;
            int src = c->members[op->peer];
            char what[64];
            snprintf(what, sizeof what, "n=%zu, in a batch of %d", op->n, count);
            mt__message *m = mt__msg_take(w, me, src, op->tag, what, 1);
            if (m->n != op->n) {
                size_t sent = m->n;
                free(m);
                mt_fatal("rank %d received %zu floats from rank %d (tag %d) but expected %zu\n"
                         "hint: the send and the recv of a message must use the same count", me, sent, src, op->tag, op->n);
            }
            if (op->n > 0) memcpy(op->buf, m->data, op->n * sizeof(float));
            free(m);
        }
        // 3. every send taken
        pthread_mutex_lock(&mine->mu);
        for (int i = 0; i < count; i++) {
            int dst = c->members[ops[i].peer];
            while (want[i] > 0 && mine->taken_by[dst] < want[i]) {
                if (mine->aborted) {
                    pthread_mutex_unlock(&mine->mu);
                    mt__rank_exit();
                }
                if (mine->src_done[dst]) {
                    pthread_mutex_unlock(&mine->mu);
                    mt_fatal("rank %d sent rank %d a message (tag %d, n=%zu) that it never received: its rank function "
                             "has returned\nhint: every send needs a matching recv, in the same order",
                             me, dst, ops[i].tag, ops[i].n);
                }
                pthread_cond_wait(&mine->cv, &mine->mu);
            }
        }
        pthread_mutex_unlock(&mine->mu);
        mt__disown(want);
        free(want);
    }
    // the counters: a call per send and per receive; one span for the batch
    size_t bytes = 0;
    int recvs = 0;
    for (int i = 0; i < count; i++) {
        bytes += ops[i].n * sizeof(float);
        recvs += ops[i].recv;
    }
    mt__comm_count_calls(c, recvs == 0 ? "send" : recvs == count ? "recv" : "send_recv", count, bytes, t0,
                         recvs ? MT_SPAN_RECV : MT_SPAN_COMM);
}

// ---------------------------------------------------------------------------------------------
// collectives across processes: through the group's rank 0, in rank order
// ---------------------------------------------------------------------------------------------
// A group with members in other processes cannot post buffers in shared memory; its collectives
// are messages instead, through the group's rank 0 (a star, as simple as it gets; the big
// tensors of the GPU build go through NCCL, not here):
//
//   member j != 0:  sends (what it calls, count, op | its data) to rank 0, waits for its answer
//   rank 0:         takes the members' messages in rank order 1, 2, ..., checks that they all
//                   call the same collective as it does, computes, answers each member
//
//   all_reduce      acc = x_0; acc = acc + x_1; acc = acc + x_2 ...: the order of the threads
//                   backend, so the result is the same bits as one process would give
//   reduce_scatter  the same on the whole buffer; member j gets chunk j
//   all_gather      rank 0 puts the chunks side by side and sends everyone all of them
//   broadcast       the root's data goes to rank 0 (if it is not rank 0), then to everyone
//   barrier         empty messages there and back
// The messages of a group carry its tag (mt_comm_init: the same in every process), so they can
// never be taken for another group's or for a pipeline's.
typedef struct {       // what a member calls, at the head of its message to rank 0
    int32_t kind, arg; // mt__coll_kind; reduce op or broadcast root
    uint64_t n;        // count as passed (per rank for all-gather / reduce-scatter)
} mt__net_post;

static void mt__net_collective(mt_comm *c, int kind, int arg, const void *send, void *recv, size_t n) {
    mt_world *w = c->world;
    int tag = ((mt__group *)c->group)->tag;
    size_t elem = kind == MT__COLL_ALL_REDUCE_DOUBLE ? sizeof(double) : sizeof(float);
    size_t size = (size_t)c->size;
    // bytes a member sends to rank 0, and the bytes of its answer
    size_t up = kind == MT__COLL_REDUCE_SCATTER ? size * n * elem
              : kind == MT__COLL_BARRIER || (kind == MT__COLL_BROADCAST && c->rank != arg) ? 0 : n * elem;
    size_t down = kind == MT__COLL_ALL_GATHER ? size * n * elem : kind == MT__COLL_BARRIER ? 0 : n * elem;
    mt__net_post mine;
    mine.kind = kind;
    mine.arg = arg;
    mine.n = n;
    const char *what = mt__coll_names[kind];
    if (c->rank != 0) {
        char what_0[64];
        snprintf(what_0, sizeof what_0, "%s on group %s", what, c->name);
        mt__msg_post(w, c->global_rank, c->members[0], tag, &mine, sizeof mine, send, up, 0);
        mt__message *m = mt__msg_take(w, c->global_rank, c->members[0], tag, what_0, 0);
        if (m->n * sizeof(float) != down) mt_fatal("internal: %s on group %s: an answer of %zu bytes, not %zu", what,
                                                   c->name, m->n * sizeof(float), down);
        if (down > 0) memcpy(recv, m->data, down);
        free(m);
        return;
    }
    // rank 0: the whole result in acc (all-gather: every chunk; broadcast: the root's data)
    size_t full = kind == MT__COLL_REDUCE_SCATTER || kind == MT__COLL_ALL_GATHER ? size * n * elem
                : kind == MT__COLL_BARRIER ? 0 : n * elem;
    char *acc = (char *)mt_malloc(full > 0 ? full : 1, "collective");
    if (kind == MT__COLL_ALL_GATHER && n > 0) memcpy(acc, send, n * elem);
    else if (full > 0 && (kind != MT__COLL_BROADCAST || arg == 0)) memcpy(acc, send, full);
    mt__own(free, acc);   // if a mismatch below aborts the world
    for (int j = 1; j < c->size; j++) {
        char what_j[64];
        snprintf(what_j, sizeof what_j, "%s on group %s", what, c->name);
        mt__message *m = mt__msg_take(w, c->global_rank, c->members[j], tag, what_j, 0);
        mt__net_post theirs;
        memcpy(&theirs, m->data, sizeof theirs);
        const char *data = (const char *)m->data + sizeof theirs;
        size_t bytes = m->n * sizeof(float) - sizeof theirs;
        if (theirs.kind != mine.kind || theirs.arg != mine.arg || theirs.n != mine.n) {
            mt__post a, b;   // the threads backend's message, word for word
            mt__post_set(&a, theirs.kind, theirs.arg, (size_t)theirs.n, NULL, NULL);
            mt__post_set(&b, kind, arg, n, NULL, NULL);
            char s_a[96], s_b[96];
            mt__describe_post(&a, s_a, sizeof s_a);
            mt__describe_post(&b, s_b, sizeof s_b);
            free(m);
            mt_fatal("group %s: rank %d called %s while rank %d called %s\n"
                     "hint: every member of a group must call the same collectives, with the same counts, in the same "
                     "order (NCCL's rule)", c->name, c->members[j], s_a, c->members[0], s_b);
        }
        size_t expect = kind == MT__COLL_BROADCAST ? (j == arg ? n * elem : 0) : kind == MT__COLL_ALL_GATHER ? n * elem
                                                                                                   : full;
        if (bytes != expect) {
            free(m);
            mt_fatal("internal: %s on group %s: rank %d sent %zu bytes, not %zu", what, c->name, c->members[j], bytes,
                     expect);
        }
        if (kind == MT__COLL_ALL_REDUCE || kind == MT__COLL_REDUCE_SCATTER)
            mt__accumulate_f32((float *)acc, (const float *)data, full / elem, arg);
        else if (kind == MT__COLL_ALL_REDUCE_DOUBLE)
            mt__accumulate_f64((double *)acc, (const double *)data, full / elem, arg);
        else if (kind == MT__COLL_ALL_GATHER && n > 0)
            memcpy(acc + (size_t)j * n * elem, data, n * elem);
        else if (kind == MT__COLL_BROADCAST && j == arg && n > 0)
            memcpy(acc, data, n * elem);
        free(m);
    }
    for (int j = 1; j < c->size; j++) {
        const char *part = kind == MT__COLL_REDUCE_SCATTER ? acc + (size_t)j * n * elem : acc;
        mt__msg_post(w, c->global_rank, c->members[j], tag, NULL, 0, part, down, 0);
    }
    if (kind == MT__COLL_ALL_GATHER || kind == MT__COLL_ALL_REDUCE || kind == MT__COLL_ALL_REDUCE_DOUBLE ||
        kind == MT__COLL_REDUCE_SCATTER || (kind == MT__COLL_BROADCAST && arg != 0))
        if (full > 0) memcpy(recv, acc, kind == MT__COLL_REDUCE_SCATTER ? n * elem : full);
    mt__disown(acc);
    free(acc);
}

// ---------------------------------------------------------------------------------------------
// parallel state: where a rank sits in the TP x PP x DP grid
// ---------------------------------------------------------------------------------------------
// Mirrors megatron/core/parallel_state.py (initialize_model_parallel). The example below is
// exactly what `./train_gpt --print-layout --tensor-model-parallel-size 2
// --pipeline-model-parallel-size 2 --nproc-per-node 8 --num-layers 8` prints (a test checks it):
//
// rank = tp_rank + TP*(dp_rank + DP*pp_rank)   (TP fastest, then DP, then PP: Megatron's default)
//              dp 0           dp 1
//           tp0   tp1      tp0   tp1
//   pp 0  [ g0 ,  g1  ]  [ g2 ,  g3  ]    layers 0 .. 3
//   pp 1  [ g4 ,  g5  ]  [ g6 ,  g7  ]    layers 4 .. 7
//   TP groups [g0,g1] [g2,g3] [g4,g5] [g6,g7]
//   DP groups [g0,g2] [g1,g3] [g4,g6] [g5,g7]
//   PP groups [g0,g4] [g1,g5] [g2,g6] [g3,g7]
//   embedding groups [g0,g4] [g1,g5] [g2,g6] [g3,g7]
//
// Why TP is fastest: the TP group all-reduces twice per layer, so its ranks should be
// neighbours (the same node, NVLink); DP talks once per step, PP only to the next stage.
int mt_global_rank(const mt_config *cfg, int tp_rank, int dp_rank, int pp_rank) {
    int TP = cfg->parallel.tensor_model_parallel_size, DP = cfg->data_parallel_size;
    return tp_rank + TP * (dp_rank + DP * pp_rank);
}

void mt_parallel_state_init(mt_parallel_state *ps, const mt_config *cfg, int rank) {
    int TP = cfg->parallel.tensor_model_parallel_size, PP = cfg->parallel.pipeline_model_parallel_size;
    int DP = cfg->data_parallel_size;
    memset(ps, 0, sizeof *ps);
    ps->rank = rank;
    ps->world_size = cfg->world_size;
    ps->tp_size = TP; ps->pp_size = PP; ps->dp_size = DP;
    ps->tp_rank = rank % TP;
    ps->dp_rank = (rank / TP) % DP;
    ps->pp_rank = rank / (TP * DP);
    ps->vp_size = cfg->virtual_pipeline_size;
    ps->pp_prev_rank = mt_global_rank(cfg, ps->tp_rank, ps->dp_rank, (ps->pp_rank + PP - 1) % PP);
    ps->pp_next_rank = mt_global_rank(cfg, ps->tp_rank, ps->dp_rank, (ps->pp_rank + 1) % PP);
    ps->is_first_stage = ps->pp_rank == 0;
    ps->is_last_stage = ps->pp_rank == PP - 1;
    ps->in_embedding_group = PP > 1 && (ps->is_first_stage || ps->is_last_stage);
    ps->node_rank = rank;                 // one process on one node; mt_rank_init asks the world
    ps->node_size = cfg->world_size;
}

static void mt__print_group(FILE *f, const int *members, int n) {
    fprintf(f, " [");
    for (int i = 0; i < n; i++) fprintf(f, "%sg%d", i ? "," : "", members[i]);
    fprintf(f, "]");
}

void mt_print_layout(const mt_config *cfg, FILE *f) {
    int TP = cfg->parallel.tensor_model_parallel_size, PP = cfg->parallel.pipeline_model_parallel_size;
    int DP = cfg->data_parallel_size, L = cfg->model.num_layers;
    int members[1024];
    fprintf(f, "rank = tp_rank + TP*(dp_rank + DP*pp_rank)   (TP fastest, then DP, then PP: Megatron's default)\n");
    // the grid: one row per stage, one [ ... ] block of TP cells per DP replica. The rows are
    // built first, so the dp/tp labels above can be placed over the cells they name.
    size_t width = (size_t)DP * (size_t)TP * 16 + 64;
    char *row = (char *)mt_malloc(width * (size_t)PP, "layout");
    int *cell_col = (int *)mt_malloc(sizeof(int) * (size_t)(DP * TP + 1), "layout");
    int *block_end = (int *)mt_malloc(sizeof(int) * (size_t)(DP + 1), "layout");
    for (int p = 0; p < PP; p++) {
        char *line = row + (size_t)p * width;
        int n = snprintf(line, width, "  pp %d ", p);
        for (int d = 0; d < DP; d++) {
            n += snprintf(line + n, width - (size_t)n, "%s", d == 0 ? " [" : "  [");
            for (int t = 0; t < TP; t++) {
                if (p == 0) cell_col[d * TP + t] = n + 1;
                n += snprintf(line + n, width - (size_t)n, "%s g%-2d", t ? ", " : "", mt_global_rank(cfg, t, d, p));
                if (p == 0 && t) cell_col[d * TP + t] += 2;
            }
            n += snprintf(line + n, width - (size_t)n, " ]");
            if (p == 0) block_end[d] = n;
        }
        int per = L / PP;
        snprintf(line + n, width - (size_t)n, "    layers %d .. %d", p * per, (p + 1) * per - 1);
    }
    char *hdr = (char *)mt_malloc(width, "layout");
    // "dp d" centred over its block, "tpt" over each cell
    memset(hdr, ' ', width - 1);
    hdr[width - 1] = 0;
    for (int d = 0; d < DP; d++) {
        char label[16];
        int len = snprintf(label, sizeof label, "dp %d", d);
        int first = cell_col[d * TP], last = block_end[d];
        int at = first + (last - first - len) / 2;
        memcpy(hdr + at, label, (size_t)len);
    }
    int e = (int)width - 1;
    while (e > 0 && hdr[e - 1] == ' ') hdr[--e] = 0;
    fprintf(f, "%s\n", hdr);
    memset(hdr, ' ', width - 1);
    for (int c = 0; c < DP * TP; c++) {
        char label[16];
        int len = snprintf(label, sizeof label, "tp%d", c % TP);
        memcpy(hdr + cell_col[c], label, (size_t)len);
    }
    e = (int)width - 1;
    while (e > 0 && hdr[e - 1] == ' ') hdr[--e] = 0;
    fprintf(f, "%s\n", hdr);
    for (int p = 0; p < PP; p++) fprintf(f, "%s\n", row + (size_t)p * width);
    free(hdr); free(row); free(cell_col); free(block_end);
    fprintf(f, "  TP groups");
    for (int p = 0; p < PP; p++)
        for (int d = 0; d < DP; d++) {
            for (int t = 0; t < TP; t++) members[t] = mt_global_rank(cfg, t, d, p);
            mt__print_group(f, members, TP);
        }
    fprintf(f, "\n  DP groups");
    for (int p = 0; p < PP; p++)
        for (int t = 0; t < TP; t++) {
            for (int d = 0; d < DP; d++) members[d] = mt_global_rank(cfg, t, d, p);
            mt__print_group(f, members, DP);
        }
    fprintf(f, "\n  PP groups");
    for (int d = 0; d < DP; d++)
        for (int t = 0; t < TP; t++) {
            for (int p = 0; p < PP; p++) members[p] = mt_global_rank(cfg, t, d, p);
            mt__print_group(f, members, PP);
        }
    fprintf(f, "\n  embedding groups");
    if (PP == 1) fprintf(f, " none: with one stage the tied embedding and LM head are the same tensor");
    for (int d = 0; d < DP && PP > 1; d++)
        for (int t = 0; t < TP; t++) {
            members[0] = mt_global_rank(cfg, t, d, 0);
            members[1] = mt_global_rank(cfg, t, d, PP - 1);
            mt__print_group(f, members, 2);
        }
    fprintf(f, "\n");
    if (cfg->virtual_pipeline_size > 1) {
        int lpc = cfg->parallel.num_layers_per_virtual_pipeline_stage;
        fprintf(f, "  interleaved: %d model chunks per stage of %d layers; stage s, chunk c holds layers (c*PP + s)*%d "
                   "..\n",
                cfg->virtual_pipeline_size, lpc, lpc);
    }
    if (cfg->parallel.sequence_parallel) {   // section 4: which positions each TP rank holds
        int T = cfg->model.seq_length, T_sp = T / TP;
        fprintf(f, "  sequence parallel: layernorms, dropouts and residuals hold T/TP = %d of the %d positions of every "
                   "sample:", T_sp, T);
        for (int t = 0; t < TP; t++) fprintf(f, "%s tp%d %d..%d", t ? "," : "", t, t * T_sp, (t + 1) * T_sp - 1);
        fprintf(f, "\n");
    }
}

// ---------------------------------------------------------------------------------------------
// a rank's groups: every rank creates the groups it belongs to, members in group order
// ---------------------------------------------------------------------------------------------
static void mt__comm_named(mt_comm *c, mt_world *w, int rank, const int *members, int n, const char *name) {
    mt_comm_init(c, w, rank, members, n);
    c->name = name;
}

// compute_stream: the rank's kernel stream on the GPU build (the groups that move device
// buffers join NCCL there), NULL on the CPU build
void mt_groups_init(mt_groups *g, mt_world *w, const mt_config *cfg, const mt_parallel_state *ps,
                    void *compute_stream) {
    int TP = ps->tp_size, PP = ps->pp_size, DP = ps->dp_size, rank = ps->rank;
    memset(g, 0, sizeof *g);
    int *members = (int *)mt_malloc(sizeof(int) * (size_t)cfg->world_size, "group");
    for (int i = 0; i < cfg->world_size; i++) members[i] = i;
    mt__comm_named(&g->world, w, rank, members, cfg->world_size, "world");
    for (int t = 0; t < TP; t++) members[t] = mt_global_rank(cfg, t, ps->dp_rank, ps->pp_rank);
    mt__comm_named(&g->tp, w, rank, members, TP, "tp");
    for (int d = 0; d < DP; d++) members[d] = mt_global_rank(cfg, ps->tp_rank, d, ps->pp_rank);
    mt__comm_named(&g->dp, w, rank, members, DP, "dp");
    for (int p = 0; p < PP; p++) members[p] = mt_global_rank(cfg, ps->tp_rank, ps->dp_rank, p);
    mt__comm_named(&g->pp, w, rank, members, PP, "pp");
    mt__comm_named(&g->p2p, w, rank, members, PP, "p2p");
    for (int p = 0; p < PP; p++)
        for (int t = 0; t < TP; t++) members[p * TP + t] = mt_global_rank(cfg, t, ps->dp_rank, p);
    mt__comm_named(&g->mp, w, rank, members, TP * PP, "mp");
    if (ps->in_embedding_group) {
        members[0] = mt_global_rank(cfg, ps->tp_rank, ps->dp_rank, 0);
        members[1] = mt_global_rank(cfg, ps->tp_rank, ps->dp_rank, PP - 1);
        mt__comm_named(&g->embd, w, rank, members, 2, "embd");
    }
    free(members);
    // the groups that move device buffers (GPU build), joined in the same order on every rank
    // (tp, dp, embd, p2p), so no two ranks wait on each other
    if (compute_stream && g->tp.size > 1) mt__nccl_join(&g->tp, compute_stream);
    if (compute_stream && g->dp.size > 1) mt__nccl_join(&g->dp, compute_stream);
    if (compute_stream && ps->in_embedding_group) mt__nccl_join(&g->embd, compute_stream);
    if (compute_stream && g->p2p.size > 1) mt__nccl_join(&g->p2p, compute_stream);
}

void mt_groups_free(mt_groups *g) {
    mt__nccl_leave(&g->tp);
    mt__nccl_leave(&g->dp);
    mt__nccl_leave(&g->embd);
    mt__nccl_leave(&g->p2p);
}

// =============================================================================================
// 3. OPS: CPU REFERENCE & THE BACKEND SEAM
// =============================================================================================
// The definition of every op, as plain loops over b and t (llm.c's train_gpt2.c is the model).
// The GPU kernels in kernels.cuh must match these (tests/gpu compares them on random data).
// Argument grammar: mt_<op>_forward(out..., inp..., params..., dims) and
// mt_<op>_backward(dinp..., dparams..., dout, saved..., dims).
// THE RULE: every backward ADDS into its d-buffers (+=); the caller zeroes them. An op that
// writes with '=' says so on its first comment line.
// Shapes: B batch, T time, C channels, NH heads, hs = C/NH, OC output channels, V vocabulary.

// ---------------------------------------------------------------------------------------------
// embedding lookup (vocab-parallel): out = wte[token - vocab_start], or 0 if not this rank's
// writes out with '='. out is (B,T,C), tokens (B,T), wte (V_local, C): this rank's rows
// [vocab_start, vocab_start + V_local) of the full table. With one TP rank V_local is Vp.
void mt_embedding_forward_cpu(float *out, const int *tokens, const float *wte, int B, int T, int C,
                              int vocab_start, int V_local) {
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            float *out_bt = out + ((size_t)b * T + t) * C;
            int local = tokens[b * T + t] - vocab_start;
            if (local >= 0 && local < V_local) memcpy(out_bt, wte + (size_t)local * C, (size_t)C * sizeof(float));
            else memset(out_bt, 0, (size_t)C * sizeof(float));
        }
}

// in the forward pass this was: out[b,t,:] = wte[token[b,t], :]  (if the token is ours)
// so the gradient of a row of wte collects dout of every position that looked it up
void mt_embedding_backward_cpu(float *dwte, const float *dout, const int *tokens, int B, int T, int C,
                               int vocab_start, int V_local) {
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            int local = tokens[b * T + t] - vocab_start;
            if (local < 0 || local >= V_local) continue;
            const float *dout_bt = dout + ((size_t)b * T + t) * C;
            float *dwte_row = dwte + (size_t)local * C;
            for (int i = 0; i < C; i++) dwte_row[i] += dout_bt[i];
        }
}

// ---------------------------------------------------------------------------------------------
// position embedding: out[b,t,:] += wpe[t,:]
void mt_position_embedding_forward_cpu(float *out, const float *wpe, int B, int T, int C) {
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            float *out_bt = out + ((size_t)b * T + t) * C;
            const float *wpe_t = wpe + (size_t)t * C;
            for (int i = 0; i < C; i++) out_bt[i] += wpe_t[i];
        }
}

// decoding: each token's row and its own position's row (positions differ per sequence), one op
// (the GPU: one kernel in place of a lookup, a second lookup and an add). The same sum, wte + wpe,
// as mt_embedding_forward then adding wpe's row: at TP > 1 rank 0 alone passes wpe, the others 0
// rows, and the all-reduce after it adds zeros, which are exact
void mt_embedding_positions_forward_cpu(float *out, const int *tokens, const float *wte, const int *positions,
                                        const float *wpe, int B, int T, int C, int vocab_start, int V_local) {
    mt_embedding_forward_cpu(out, tokens, wte, B, T, C, vocab_start, V_local);
    if (!wpe) return;
    for (int bt = 0; bt < B * T; bt++) {
        float *out_bt = out + (size_t)bt * C;
        const float *wpe_p = wpe + (size_t)positions[bt] * C;
        for (int i = 0; i < C; i++) out_bt[i] += wpe_p[i];
    }
}

void mt_position_embedding_backward_cpu(float *dwpe, const float *dout, int B, int T, int C) {
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const float *dout_bt = dout + ((size_t)b * T + t) * C;
            float *dwpe_t = dwpe + (size_t)t * C;
            for (int i = 0; i < C; i++) dwpe_t[i] += dout_bt[i];
        }
}

// ---------------------------------------------------------------------------------------------
// layernorm: out = (x - mean) * rstd * weight + bias, rstd = 1/sqrt(var + 1e-5), over C
// writes out, mean, rstd with '='. inp/out are (B,T,C), mean/rstd (B,T), weight/bias (C)
void mt_layernorm_forward_cpu(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                              const float *bias, int B, int T, int C) {
    const float eps = 1e-5f;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const float *x = inp + ((size_t)b * T + t) * C;
            float m = 0.0f;
            for (int i = 0; i < C; i++) m += x[i];
            m = m / (float)C;
            float v = 0.0f;
            for (int i = 0; i < C; i++) { float d = x[i] - m; v += d * d; }
            v = v / (float)C;
            float s = 1.0f / sqrtf(v + eps);
            float *o = out + ((size_t)b * T + t) * C;
            for (int i = 0; i < C; i++) o[i] = (s * (x[i] - m)) * weight[i] + bias[i];
            mean[b * T + t] = m;
            rstd[b * T + t] = s;
        }
}

// in the forward pass this was: out = norm * weight + bias, norm = (x - mean) * rstd
// so now: dbias += dout, dweight += norm * dout, and with dnorm = dout * weight,
// dx = rstd * (dnorm - mean(dnorm) - norm * mean(dnorm * norm))   (the two means are over C)
void mt_layernorm_backward_cpu(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                               const float *weight, const float *mean, const float *rstd, int B, int T, int C) {
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const float *dout_bt = dout + ((size_t)b * T + t) * C;
            const float *inp_bt = inp + ((size_t)b * T + t) * C;
            float *dinp_bt = dinp + ((size_t)b * T + t) * C;
            float mean_bt = mean[b * T + t], rstd_bt = rstd[b * T + t];
            float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
            for (int i = 0; i < C; i++) {
                float norm_bti = (inp_bt[i] - mean_bt) * rstd_bt;
                float dnorm_i = weight[i] * dout_bt[i];
                dnorm_mean += dnorm_i;
                dnorm_norm_mean += dnorm_i * norm_bti;
            }
            dnorm_mean = dnorm_mean / (float)C;
            dnorm_norm_mean = dnorm_norm_mean / (float)C;
            for (int i = 0; i < C; i++) {
                float norm_bti = (inp_bt[i] - mean_bt) * rstd_bt;
                float dnorm_i = weight[i] * dout_bt[i];
                dbias[i] += dout_bt[i];
                dweight[i] += norm_bti * dout_bt[i];
                dinp_bt[i] += (dnorm_i - dnorm_mean - norm_bti * dnorm_norm_mean) * rstd_bt;
            }
        }
}

// ---------------------------------------------------------------------------------------------
// matmul: out = inp @ weight^T + bias     (a linear layer, PyTorch's convention)
// writes out with '='. inp (BT, C), weight (OC, C) (a row per output channel), bias (OC) or NULL
// out (BT, OC). Speed on a CPU comes from two things, neither of which changes the result:
//  - cache blocks: MT_MATMUL_BLOCK weight rows are used for every row of inp before moving on,
//    so the weight is read from memory once, not once per token (the LM head's is 25+ MB);
//  - 8 independent partial sums per dot product, so the compiler can vectorise the loop
//    without reordering float additions (the same bits at every -O level and block size).
#define MT_MATMUL_BLOCK 64
static inline float mt__dot(const float *x, const float *w, int C) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= C; i += 8)
        for (int k = 0; k < 8; k++) acc[k] += x[i + k] * w[i + k];
    float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; i < C; i++) s += x[i] * w[i];
    return s;
}

void mt_matmul_forward_cpu(float *out, const float *inp, const float *weight, const float *bias,
                           int BT, int C, int OC) {
    for (int o0 = 0; o0 < OC; o0 += MT_MATMUL_BLOCK) {
        int o1 = o0 + MT_MATMUL_BLOCK < OC ? o0 + MT_MATMUL_BLOCK : OC;
        for (int bt = 0; bt < BT; bt++) {
            const float *x = inp + (size_t)bt * C;
            float *y = out + (size_t)bt * OC;
            for (int o = o0; o < o1; o++) y[o] = mt__dot(x, weight + (size_t)o * C, C) + (bias ? bias[o] : 0.0f);
        }
    }
}

// in the forward pass this was: out[bt,o] = sum_i inp[bt,i] * weight[o,i] + bias[o]
// so now: dinp[bt,i] = sum_o dout[bt,o] * weight[o,i]      (dinp = dout @ weight, '=')
//         dweight[o,i] += sum_bt dout[bt,o] * inp[bt,i]    (dweight = dout^T @ inp)
//         dbias[o] += sum_bt dout[bt,o]
// dinp is an activation gradient, written ('='); dweight and dbias are parameter gradients,
// accumulated over micro-batches ('+='). dinp may be NULL (nothing upstream needs it), dbias
// NULL when there is no bias, dweight NULL to compute only dinp (and dbias): a tensor-parallel
// layer's backward makes dinp first, starts its all-reduce, then dweight (section 4), and inp is
// not read then.
// Each sum runs in increasing o (for dinp) or bt (for dweight, dbias) whatever the blocking.
void mt_matmul_backward_cpu(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                            const float *weight, int BT, int C, int OC) {
    if (dinp) {
        memset(dinp, 0, (size_t)BT * C * sizeof(float));   // '=': the sums below start from 0
        for (int o0 = 0; o0 < OC; o0 += MT_MATMUL_BLOCK) {
            int o1 = o0 + MT_MATMUL_BLOCK < OC ? o0 + MT_MATMUL_BLOCK : OC;
            for (int bt = 0; bt < BT; bt++) {
                const float *dy = dout + (size_t)bt * OC;
                float *dx = dinp + (size_t)bt * C;
                for (int o = o0; o < o1; o++) {
                    const float *w = weight + (size_t)o * C;
                    float d = dy[o];
                    for (int i = 0; i < C; i++) dx[i] += w[i] * d;
                }
            }
        }
    }
    if (!dweight && !dbias) return;
    for (int b0 = 0; b0 < BT; b0 += MT_MATMUL_BLOCK) {
        int b1 = b0 + MT_MATMUL_BLOCK < BT ? b0 + MT_MATMUL_BLOCK : BT;
        for (int o = 0; o < OC; o++) {
            float *dw = dweight ? dweight + (size_t)o * C : NULL;
            float db = 0.0f;
            for (int bt = b0; bt < b1; bt++) {
                float d = dout[(size_t)bt * OC + o];
                db += d;
                if (!dw) continue;
                const float *x = inp + (size_t)bt * C;
                for (int i = 0; i < C; i++) dw[i] += x[i] * d;
            }
            if (dbias) dbias[o] += db;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// dropout with a counter-based mask: keep element e iff uniform(key, global index of e) >= p,
// and scale what is kept by 1/(1-p) so the expectation is unchanged.
// The mask is never stored: the backward asks the same question of the same key again.
// How Megatron differs: its CudaRNGStatesTracker keeps a "model-parallel" CUDA generator seeded
// with seed + 2718 + tp_rank, used for dropout inside TP regions (the attention probabilities of
// my heads), and the default generator, equal on all TP ranks, for dropout on the replicated
// hidden states. That is cheap (a stateful Philox stream per rank) and correct for training, but
// the masks depend on TP and on the order of calls, so no two layouts drop the same elements.
// Here the key is the element's global index (sample, head, position, channel), so every layout
// drops exactly the same elements and tests/test_layouts.c can demand identical losses.
// `key` names the site (seed, iteration, layer, which dropout); `index_of` turns the local
// position into the element's index in the *global* tensor (see mt_dropout_index below).
// (mt_dropout, the site: seed, iteration, site, p, sample_offset, T, C, is in the interface, section 3)

static inline int mt__dropout_keep(const mt_dropout *d, uint64_t global_index) {
    return mt_rand_uniform(d->seed, d->iteration, d->site, 0x0d0d, global_index) >= d->p;
}

// in place: x (B,T_local,C) -> x * mask / (1-p); x's position t is position t_offset + t of the
// sample (everything but a sequence-parallel shard has t_offset = 0, T_local = T)
void mt_dropout_forward_cpu(float *x, const mt_dropout *d, int B) {
    if (d->p <= 0.0f) return;
    float scale = 1.0f / (1.0f - d->p);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < d->T_local; t++)
            for (int c = 0; c < d->C; c++) {
                uint64_t g = ((uint64_t)(d->sample_offset + b) * d->T + (uint64_t)(d->t_offset + t)) * d->C + c;
                size_t i = ((size_t)b * d->T_local + t) * d->C + c;
                x[i] = mt__dropout_keep(d, g) ? x[i] * scale : 0.0f;
            }
}

// in the forward pass this was: y = x * mask / (1-p); so dx = dy * mask / (1-p), in place on dy
void mt_dropout_backward_cpu(float *dx, const mt_dropout *d, int B) { mt_dropout_forward_cpu(dx, d, B); }

// ---------------------------------------------------------------------------------------------
// causal self-attention, NH_local heads of size hs
// writes out and lse with '='. qkv is (B,T,3*C_local) = [Q | K | V], each (B,T,C_local) with
// head h in columns [h*hs, (h+1)*hs); out is (B,T,C_local); lse (B,NH_local,T) keeps the
// logsumexp of each row of scores for the backward pass, which recomputes the probabilities
// from it (FlashAttention's trick: no (T,T) matrix is stored, on the CPU as on the GPU).
//   s[t,t2] = q_t . k_t2 / sqrt(hs)  for t2 <= t;  p = softmax(s);  out_t = sum_t2 p'[t,t2] v_t2
//   lse[t] = log sum_t2 exp(s[t,t2]), so p[t,t2] = exp(s[t,t2] - lse[t])
// where p' = dropout(p). `drop` has T, C unused here; head_offset/NH_global place the local heads
// in the global (B, NH, T, T) tensor so masks do not depend on TP. row is (T) scratch.
static float mt__attention_score(const float *q, const float *k, int hs, float scale) {
    float s = 0.0f;
    for (int i = 0; i < hs; i++) s += q[i] * k[i];
    return s * scale;
}

// dt: the type the GPU build multiplies the probabilities by V in (section "reduced precision"
// below); MT_DTYPE_FP32 leaves every value as it is
static void mt__attention_forward(float *out, float *lse, const float *qkv, int B, int T, int C_local, int NH_local,
                                  const mt_dropout *drop, int head_offset, int NH_global, mt_dtype dt) {
    int hs = C_local / NH_local;
    int C3 = 3 * C_local;
    float scale = 1.0f / sqrtf((float)hs);
    float keep_scale = drop->p > 0 ? 1.0f / (1.0f - drop->p) : 1.0f;
    float *row = (float *)mt_malloc(sizeof(float) * (size_t)T, "attention row");
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH_local; h++)
            for (int t = 0; t < T; t++) {
                const float *q = qkv + ((size_t)b * T + t) * C3 + h * hs;
                // pass 1: scores and their max (for a stable softmax)
                float maxval = -INFINITY;
                for (int t2 = 0; t2 <= t; t2++) {
                    const float *k = qkv + ((size_t)b * T + t2) * C3 + C_local + h * hs;
                    row[t2] = mt__attention_score(q, k, hs, scale);
                    if (row[t2] > maxval) maxval = row[t2];
                }
                // pass 2: exponentials and their sum
                float sum = 0.0f;
                for (int t2 = 0; t2 <= t; t2++) {
                    float e = expf(row[t2] - maxval);
                    row[t2] = e;
                    sum += e;
                }
                float inv = 1.0f / sum;
                lse[((size_t)b * NH_local + h) * T + t] = maxval + logf(sum);
                // pass 3: weighted sum of values, with the (dropped-out) probabilities
                float *o = out + ((size_t)b * T + t) * C_local + h * hs;
                for (int i = 0; i < hs; i++) o[i] = 0.0f;
                uint64_t drop_row = (((uint64_t)(drop->sample_offset + b) * NH_global + head_offset + h) * T + t) * T;
                for (int t2 = 0; t2 <= t; t2++) {
                    float p = row[t2] * inv;
                    if (drop->p > 0) p = mt__dropout_keep(drop, drop_row + t2) ? p * keep_scale : 0.0f;
                    p = mt_round_to_dtype(p, dt);   // P enters the tensor cores' P @ V in dt
                    const float *v = qkv + ((size_t)b * T + t2) * C3 + 2 * C_local + h * hs;
                    for (int i = 0; i < hs; i++) o[i] += p * v[i];
                }
            }
    free(row);
}

void mt_attention_forward_cpu(float *out, float *lse, const float *qkv, int B, int T, int C_local, int NH_local,
                              const mt_dropout *drop, int head_offset, int NH_global) {
    mt__attention_forward(out, lse, qkv, B, T, C_local, NH_local, drop, head_offset, NH_global, MT_DTYPE_FP32);
}

// in the forward pass this was: out_t = sum_t2 p'[t,t2] v_t2, p' = dropout(p), p = softmax(s), s = q.k/sqrt(hs)
// so now, with p recomputed as exp(s - lse):
//         dv_t2 += p'[t,t2] dout_t;  dp'[t,t2] = dout_t . v_t2;  dp = dp' * mask/(1-p_drop);
//         ds[t,t2] = p[t,t2] (dp[t,t2] - D_t),  D_t = sum_t2 p[t,t2] dp[t,t2] = dout_t . out_t
//         dq_t += sum_t2 ds[t,t2] k_t2 / sqrt(hs);  dk_t2 += ds[t,t2] q_t / sqrt(hs)
// (D_t = dout_t . out_t because out_t = sum_t2 p' v_t2: FlashAttention-2's rowsum(dO * O).)
// dqkv is (B,T,3*C_local), written ('='); out (B,T,C_local) and lse (B,NH_local,T) are the forward's.
// dt: the type the GPU build multiplies p' (into dv) and ds (into dq, dk) in; fp32 changes nothing
static void mt__attention_backward(float *dqkv, const float *dout, const float *qkv, const float *out,
                                   const float *lse, int B, int T, int C_local, int NH_local, const mt_dropout *drop,
                                   int head_offset, int NH_global, mt_dtype dt) {
    int hs = C_local / NH_local;
    int C3 = 3 * C_local;
    float scale = 1.0f / sqrtf((float)hs);
    float keep_scale = drop->p > 0 ? 1.0f / (1.0f - drop->p) : 1.0f;
    memset(dqkv, 0, (size_t)B * T * C3 * sizeof(float));   // '=': the sums below start from 0
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH_local; h++)
            for (int t = 0; t < T; t++) {
                const float *dout_t = dout + ((size_t)b * T + t) * C_local + h * hs;
                const float *out_t = out + ((size_t)b * T + t) * C_local + h * hs;
                const float *q = qkv + ((size_t)b * T + t) * C3 + h * hs;
                float *dq = dqkv + ((size_t)b * T + t) * C3 + h * hs;
                float lse_t = lse[((size_t)b * NH_local + h) * T + t];
                uint64_t drop_row = (((uint64_t)(drop->sample_offset + b) * NH_global + head_offset + h) * T + t) * T;
                float D = 0.0f;
                for (int i = 0; i < hs; i++) D += dout_t[i] * out_t[i];
                for (int t2 = 0; t2 <= t; t2++) {
                    const float *k = qkv + ((size_t)b * T + t2) * C3 + C_local + h * hs;
                    const float *v = qkv + ((size_t)b * T + t2) * C3 + 2 * C_local + h * hs;
                    float *dk = dqkv + ((size_t)b * T + t2) * C3 + C_local + h * hs;
                    float *dv = dqkv + ((size_t)b * T + t2) * C3 + 2 * C_local + h * hs;
                    float p = expf(mt__attention_score(q, k, hs, scale) - lse_t);
                    float mask_scale = 1.0f;
                    if (drop->p > 0) mask_scale = mt__dropout_keep(drop, drop_row + t2) ? keep_scale : 0.0f;
                    // backward through the value sum and the dropout (p' in dt, as the tensor cores take it)
                    float pd = mt_round_to_dtype(p * mask_scale, dt);
                    float dpv = 0.0f;
                    for (int i = 0; i < hs; i++) { dv[i] += pd * dout_t[i]; dpv += dout_t[i] * v[i]; }
                    // backward through the softmax (ds in dt before its two products, the 1/sqrt(hs) after)
                    float ds = mt_round_to_dtype(p * (dpv * mask_scale - D), dt) * scale;
                    for (int i = 0; i < hs; i++) { dq[i] += ds * k[i]; dk[i] += ds * q[i]; }
                }
            }
}

void mt_attention_backward_cpu(float *dqkv, const float *dout, const float *qkv, const float *out, const float *lse,
                               int B, int T, int C_local, int NH_local, const mt_dropout *drop, int head_offset,
                               int NH_global) {
    mt__attention_backward(dqkv, dout, qkv, out, lse, B, T, C_local, NH_local, drop, head_offset, NH_global,
                           MT_DTYPE_FP32);
}

// ---------------------------------------------------------------------------------------------
// attention over a KV cache (generation, section 11): the causal attention above, for Tq new
// tokens of each sequence that continue what the cache already holds. Writes out (B,Tq,C_local)
// with '=', and first stores the new tokens' keys and values into the caches.
//   qkv (B,Tq,3*C_local)  the new tokens' [Q | K | V], head h in columns [h*hs, (h+1)*hs)
//   kcache, vcache (B,cap,C_local)  sequence b's keys and values at positions 0..cap-1
//   start (B)  the position of sequence b's first new token (= the tokens it already has);
//              new token t sits at p = start[b] + t < cap and sees the positions 0..p:
//   s[p,p2] = q_p . k_p2 / sqrt(hs)  for p2 <= p;  out_p = sum_p2 softmax(s)[p,p2] v_p2
// The arithmetic is mt_attention_forward_cpu's, in the same order, so a prompt run through
// here gives the same numbers as the training forward (no dropout: generation never drops).
void mt_attention_cached_forward_cpu(float *out, float *kcache, float *vcache, const float *qkv, const int *start,
                                     int B, int Tq, int C_local, int NH_local, int cap) {
    int hs = C_local / NH_local;
    int C3 = 3 * C_local;
    float scale = 1.0f / sqrtf((float)hs);
    // 1. the new keys and values join the cache
    for (int b = 0; b < B; b++)
        for (int t = 0; t < Tq; t++) {
            const float *qkv_bt = qkv + ((size_t)b * Tq + t) * C3;
            size_t at = ((size_t)b * cap + (size_t)(start[b] + t)) * C_local;
            memcpy(kcache + at, qkv_bt + C_local, (size_t)C_local * sizeof(float));
            memcpy(vcache + at, qkv_bt + 2 * C_local, (size_t)C_local * sizeof(float));
        }
    // 2. each new query against the cache, three passes as in the training forward
    float *row = (float *)mt_malloc(sizeof(float) * (size_t)cap, "attention row");
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH_local; h++)
            for (int t = 0; t < Tq; t++) {
                int p = start[b] + t;
                const float *q = qkv + ((size_t)b * Tq + t) * C3 + h * hs;
                const float *k_b = kcache + (size_t)b * cap * C_local + h * hs;
                const float *v_b = vcache + (size_t)b * cap * C_local + h * hs;
                float maxval = -INFINITY;
                for (int p2 = 0; p2 <= p; p2++) {
                    row[p2] = mt__attention_score(q, k_b + (size_t)p2 * C_local, hs, scale);
                    if (row[p2] > maxval) maxval = row[p2];
                }
                float sum = 0.0f;
                for (int p2 = 0; p2 <= p; p2++) {
                    float e = expf(row[p2] - maxval);
                    row[p2] = e;
                    sum += e;
                }
                float inv = 1.0f / sum;
                float *o = out + ((size_t)b * Tq + t) * C_local + h * hs;
                for (int i = 0; i < hs; i++) o[i] = 0.0f;
                for (int p2 = 0; p2 <= p; p2++) {
                    float pr = row[p2] * inv;
                    const float *v = v_b + (size_t)p2 * C_local;
                    for (int i = 0; i < hs; i++) o[i] += pr * v[i];
                }
            }
    free(row);
}

// ---------------------------------------------------------------------------------------------
// argmax of each row (greedy decoding, section 11): out[r] = the first v < n with the largest
// x[r*ld + v] (strictly larger replaces, so ties go to the smaller index, as mt_sample_token's)
void mt_argmax_rows_cpu(int *out, const float *x, int rows, int n, int ld) {
    for (int r = 0; r < rows; r++) {
        const float *row = x + (size_t)r * ld;
        int best = 0;
        for (int v = 1; v < n; v++) if (row[v] > row[best]) best = v;
        out[r] = best;
    }
}

// ---------------------------------------------------------------------------------------------
// sampling a token from a row of logits (section 11's temperature, top-k and top-p), in integers
//
//   rank the candidates: larger logit first, equal logits by smaller id (rank 0 is the argmax)
//   weigh each:   w_v = floor(exp((l_v - l_max) / T) * 2^40)      (the argmax weighs 2^40)
//   top-k:        keep ranks 0 .. k-1;                                S = their weights' sum
//   top-p:        keep rank i while the ranks before it weigh <= floor(top_p * S)
//                 (Megatron: cumsum(probs) > top_p, shifted right by one): ranks 0 .. r, r the
//                 first whose running sum exceeds that;               S = their sum
//   draw:         the first rank whose running sum exceeds floor(u * S)
// Three times the same question: "the first rank whose running sum exceeds X". The weights are
// integers so that a sum is exact in any order: the GPU (kernels.cuh, "sampling on the device"),
// whose threads add them in whatever order they meet them, answers with this loop's bits. A token
// 2^-40 less likely than the best weighs 0 and is never drawn; sums stay below 2^64 for n < 2^23.
typedef struct { float logit; int id; } mt__candidate;
// The candidates in rank order by a stable radix sort (4 passes of 8 bits) on a key that orders
// as the logits do, descending, from the ids' order: linear in n. The keys travel with their ids
// packed in 64 bits (key << 32 | id). (qsort with a comparator took ~6 ms for GPT-2's 50,257 tokens.)
// The key: a float's bits, read as an unsigned integer, order as the float does once negative
// values have all their bits flipped and the others their sign bit set; flipped again, descending.
// -0 is taken as +0 (equal logits: id order), and NaN goes last.
static uint32_t mt__candidate_key(float logit) {
    if (logit == 0.0f) logit = 0.0f;   // -0 == +0
    uint32_t u;
    memcpy(&u, &logit, sizeof u);
    uint32_t ascending = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return logit != logit ? 0xFFFFFFFFu : ~ascending;
}
static void mt__sort_candidates(const float *logits, int V, mt__candidate *out, uint64_t *buf /* 2 V */) {
    // a[v] = key << 32 | v, in id order; the four byte histograms of the keys in the same pass
    uint64_t *a = buf, *b = buf + V;
    size_t count[4][257];
    memset(count, 0, sizeof count);
    for (int v = 0; v < V; v++) {
        uint32_t key = mt__candidate_key(logits[v]);
        a[v] = (uint64_t)key << 32 | (uint32_t)v;
        for (int pass = 0; pass < 4; pass++) count[pass][((key >> (8 * pass)) & 0xFF) + 1]++;
    }
    for (int pass = 0; pass < 4; pass++) {   // the key's least significant byte first; each pass stable
        size_t *at = count[pass];
        for (int k = 0; k < 256; k++) at[k + 1] += at[k];   // where each byte value's run starts
        int shift = 32 + 8 * pass;
        for (int v = 0; v < V; v++) b[at[(a[v] >> shift) & 0xFF]++] = a[v];
        uint64_t *t = a; a = b; b = t;
    }
    for (int i = 0; i < V; i++) {   // (four passes: the order is back in buf's first half, a)
        int id = (int)(uint32_t)a[i];
        out[i].logit = logits[id];
        out[i].id = id;
    }
}
// w = floor(exp((logit - best) / T) * 2^40); 0 where that is NaN (a NaN logit, or a NaN best)
uint64_t mt_sample_weight(float logit, float best, double inv_temperature) {
    if (logit == best) return (uint64_t)1 << 40;   // exp(0), also for best = -inf (every logit -inf)
    double p = exp((double)(logit - best) * inv_temperature);
    return p >= 0.0 && p <= 1.0 ? (uint64_t)(p * 1099511627776.0) : 0;
}
// the first of w[0 .. n) whose running sum exceeds x (n - 1 if none does); *sum: the running sum there
static int mt__first_exceeding(const uint64_t *w, int n, uint64_t x, uint64_t *sum) {
    uint64_t acc = 0;
    for (int i = 0; i < n; i++) {
        acc += w[i];
        if (acc > x) { *sum = acc; return i; }
    }
    *sum = acc;
    return n - 1;
}
int mt_sample_row_cpu(const float *x, int n, const mt_draw *d) {
    int best;
    mt_argmax_rows_cpu(&best, x, 1, n, n);   // the greedy token, and l_max
    if (!(d->temperature > 0.0f) || d->top_k == 1 || n == 1) return best;   // greedy
    double inv_t = 1.0 / (double)d->temperature;
    mt__candidate *c = (mt__candidate *)mt_malloc(sizeof(mt__candidate) * (size_t)n, "sampling");
    uint64_t *w = (uint64_t *)mt_malloc(sizeof(uint64_t) * 2 * (size_t)n, "sampling");
    mt__sort_candidates(x, n, c, w);
    int keep = d->top_k > 0 && d->top_k < n ? d->top_k : n;                  // top-k
    uint64_t sum = 0;
    for (int i = 0; i < keep; i++) { w[i] = mt_sample_weight(c[i].logit, x[best], inv_t); sum += w[i]; }
    int token = best;
    if (sum > 0) {   // (0: the best is NaN; it is taken)
        if (d->top_p > 0.0f && d->top_p < 1.0f)                                // top-p
            keep = mt__first_exceeding(w, keep, (uint64_t)((double)d->top_p * (double)sum), &sum) + 1;
        uint64_t unused;
        token = c[mt__first_exceeding(w, keep, (uint64_t)((double)d->u * (double)sum), &unused)].id;   // draw
    }
    free(w);
    free(c);
    return token;
}
void mt_sample_rows_cpu(int *out, const float *x, int rows, int n, int ld, const mt_draw *draws) {
    for (int r = 0; r < rows; r++) out[r] = mt_sample_row_cpu(x + (size_t)r * ld, n, &draws[r]);
}

// ---------------------------------------------------------------------------------------------
// decode steps queued ahead: the next step's inputs from this step's tokens (section 11 says why)
//   tokens[b] = next[b]; start[b] = positions[b] = min(start[b] + 1, cap - 1)
//   draws[b] = plan[min(s + 1, plan_steps - 1) * rows + b]; ring[(s % ring_slots) * rows + b] = next[b]
// with s = *step, which then moves on to s + 1
void mt_decode_advance_cpu(int *tokens, int *positions, int *start, mt_draw *draws, int *step, int *ring,
                           const int *next, const mt_draw *plan, int plan_steps, int ring_slots, int rows, int cap) {
    int s = *step, k = s + 1 < plan_steps ? s + 1 : plan_steps - 1;
    for (int b = 0; b < rows; b++) {
        int p = start[b] + 1 < cap ? start[b] + 1 : cap - 1;
        tokens[b] = next[b];
        start[b] = positions[b] = p;
        draws[b] = plan[(size_t)k * rows + b];
        ring[(size_t)(s % ring_slots) * rows + b] = next[b];
    }
    *step = s + 1;
}

// ---------------------------------------------------------------------------------------------
// GELU, tanh approximation (GPT-2's): y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
// writes out with '='. inp/out have N elements.
#define MT_GELU_SCALING_FACTOR 0.7978845608028654f   /* sqrt(2/pi) */
void mt_gelu_forward_cpu(float *out, const float *inp, size_t N) {
    for (size_t i = 0; i < N; i++) {
        float x = inp[i];
        float cube = 0.044715f * x * x * x;
        out[i] = 0.5f * x * (1.0f + tanhf(MT_GELU_SCALING_FACTOR * (x + cube)));
    }
}

// in the forward pass this was: y = 0.5 x (1 + tanh(u)), u = s (x + 0.044715 x^3)
// so dy/dx = 0.5 (1 + tanh(u)) + 0.5 x (1 - tanh(u)^2) s (1 + 3 * 0.044715 x^2)
// and dinp = dy/dx * dout, written ('=').
void mt_gelu_backward_cpu(float *dinp, const float *inp, const float *dout, size_t N) {
    for (size_t i = 0; i < N; i++) {
        float x = inp[i];
        float cube = 0.044715f * x * x * x;
        float u = MT_GELU_SCALING_FACTOR * (x + cube);
        float th = tanhf(u);
        float sech2 = 1.0f - th * th;
        float grad = 0.5f * (1.0f + th) + 0.5f * x * sech2 * MT_GELU_SCALING_FACTOR * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] = grad * dout[i];
    }
}

// ---------------------------------------------------------------------------------------------
// residual: out = a + b   (writes with '='; the backward is a copy of dout to both inputs,
// which the model does by accumulating the same dresidual buffer, as llm.c)
void mt_residual_forward_cpu(float *out, const float *a, const float *b, size_t N) {
    for (size_t i = 0; i < N; i++) out[i] = a[i] + b[i];
}

// the residual add and the layernorm that follows it in a layer: res = a + b (B,T,C), then
// out, mean, rstd = layernorm(res) with weight, bias (C). The two ops above, in that order (the
// GPU fuses them: one read of the row).
void mt_residual_layernorm_forward_cpu(float *res, float *out, float *mean, float *rstd, const float *a, const float *b,
                                       const float *weight, const float *bias, int B, int T, int C) {
    mt_residual_forward_cpu(res, a, b, (size_t)B * T * C);
    mt_layernorm_forward_cpu(out, mean, rstd, res, weight, bias, B, T, C);
}

// ---------------------------------------------------------------------------------------------
// cross-entropy over a vocabulary split across TP ranks (the per-rank half of it;
// §4 mt_vocab_parallel_cross_entropy_* adds the all-reduces).
// logits (BT, V_local) hold this rank's columns [vocab_start, vocab_start + V_local) of the
// full (BT, Vp) logits; columns >= V (the padding) are not part of the softmax.
// step 1 (local): max over my real columns          -> all-reduce MAX -> m
// step 2 (local): sum of exp(l - m) over my columns  -> all-reduce SUM -> S
//         and my logit of the target (0 if not mine) -> all-reduce SUM -> l_y
// loss = log S + m - l_y = -log softmax(l)[y]
// writes out with '=' in every function below.
static int mt__real_columns(int vocab_start, int V_local, int V) {
    int n = V - vocab_start;
    return n < 0 ? 0 : (n > V_local ? V_local : n);
}

void mt_cross_entropy_local_max_cpu(float *maxv, const float *logits, int BT, int V_local, int vocab_start, int V) {
    int n = mt__real_columns(vocab_start, V_local, V);
    for (int i = 0; i < BT; i++) {
        const float *l = logits + (size_t)i * V_local;
        float m = -INFINITY;
        for (int v = 0; v < n; v++) if (l[v] > m) m = l[v];
        maxv[i] = m;
    }
}

void mt_cross_entropy_local_sums_cpu(float *sumexp, float *target_logit, const float *logits, const float *maxv,
                                     const int *targets, int BT, int V_local, int vocab_start, int V) {
    int n = mt__real_columns(vocab_start, V_local, V);
    for (int i = 0; i < BT; i++) {
        const float *l = logits + (size_t)i * V_local;
        float s = 0.0f;
        for (int v = 0; v < n; v++) s += expf(l[v] - maxv[i]);
        sumexp[i] = s;
        int local = targets[i] - vocab_start;
        target_logit[i] = (local >= 0 && local < n) ? l[local] : 0.0f;
    }
}

// losses[i] = log S + m - l_y; if dlogits != NULL also the gradient, in place of the logits:
// dlogits[i,v] = (softmax[i,v] - [v == y_i]) * dloss   (0 on padded columns)
void mt_cross_entropy_finish_cpu(float *losses, float *dlogits, const float *maxv, const float *sumexp,
                                 const float *target_logit, const int *targets, int BT, int V_local, int vocab_start,
                                 int V, float dloss) {
    int n = mt__real_columns(vocab_start, V_local, V);
    for (int i = 0; i < BT; i++) {
        losses[i] = logf(sumexp[i]) + maxv[i] - target_logit[i];
        if (!dlogits) continue;
        float *l = dlogits + (size_t)i * V_local;
        float inv = 1.0f / sumexp[i];
        int local = targets[i] - vocab_start;
        for (int v = 0; v < V_local; v++) {
            float p = v < n ? expf(l[v] - maxv[i]) * inv : 0.0f;
            l[v] = (p - (v == local ? 1.0f : 0.0f)) * dloss;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// AdamW (Loshchilov & Hutter; PyTorch's torch.optim.AdamW order of operations):
//   g  = grad * grad_scale                     the gradient clipping's factor (1: none; see below)
//   p  = p * (1 - lr * wd)                     decoupled weight decay (wd = 0 for no-decay params)
//   m  = b1 m + (1 - b1) g ;  v = b2 v + (1 - b2) g^2
//   p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
// grad_scale is Megatron's clip_grad_norm_fp32, which multiplies the gradients in place before
// the step: the same float product here, so the same bits, without a pass of its own over the
// gradients (which are left as they were; nothing reads them before the next step zeroes them).
void mt_adamw_cpu(float *param, float *m, float *v, const float *grad, float grad_scale, size_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int step) {
    float bc1 = 1.0f - powf(beta1, (float)step), bc2 = 1.0f - powf(beta2, (float)step);
    for (size_t i = 0; i < n; i++) {
        float g = grad[i] * grad_scale;
        float p = param[i] * (1.0f - lr * weight_decay);
        float mi = beta1 * m[i] + (1.0f - beta1) * g;
        float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
        m[i] = mi;
        v[i] = vi;
        param[i] = p - lr * (mi / bc1) / (sqrtf(vi / bc2) + eps);
    }
}

// ---------------------------------------------------------------------------------------------
// bias add: out (BT, OC) += bias (OC), the bias of a row-parallel layer, added once after the
// all-reduce
void mt_bias_add_cpu(float *out, const float *bias, int BT, int OC) {
    for (int i = 0; i < BT; i++)
        for (int o = 0; o < OC; o++) out[(size_t)i * OC + o] += bias[o];
}

// ---------------------------------------------------------------------------------------------
// the gradient norm's piece: the sum of squares of n floats in double (so a 124M-parameter sum
// does not lose digits); the clip itself rides in AdamW (mt_adamw_cpu's grad_scale)

double mt_sum_squares_cpu(const float *x, size_t n) {
    double s = 0.0;
    for (size_t k = 0; k < n; k++) s += (double)x[k] * (double)x[k];
    return s;
}

// Megatron's count_zeros_fp32 (--log-num-zeros-in-grad): the gradients that are exactly 0
double mt_count_zeros_cpu(const float *x, size_t n) {
    double zeros = 0.0;
    for (size_t k = 0; k < n; k++) zeros += x[k] == 0.0f;
    return zeros;
}

// the step's loss: each micro-batch's mean over its B*T positions, added into a double that the
// step reads once at its end (on the GPU it stays on the device until then: no wait per micro-batch)
void mt_loss_mean_add_cpu(double *acc, const float *losses, int BT) {
    double sum = 0.0;
    for (int i = 0; i < BT; i++) sum += losses[i];
    *acc += sum / BT;
}

// ---------------------------------------------------------------------------------------------
// loss scaling's check: x *= inv_scale, and whether any x was inf or NaN (Megatron's
// torch._amp_foreach_non_finite_check_and_unscale_: one pass over the gradients). Section 6 calls
// it on the fp16 gradients, which were computed from the loss times the scale.
int mt_unscale_check_cpu(float *x, float inv_scale, size_t n) {
    int found = 0;
    for (size_t k = 0; k < n; k++) {
        if (!isfinite(x[k])) found = 1;
        x[k] *= inv_scale;
    }
    return found;
}

// ---------------------------------------------------------------------------------------------
// REDUCED PRECISION: fp16 and bf16, and the ops that multiply in them
// ---------------------------------------------------------------------------------------------
//          sign exponent  mantissa   bias  largest   smallest normal  smallest subnormal  digits
//   fp32    1      8         23      127   3.4e38    2^-126           2^-149              24 bits
//   bf16    1      8          7      127   3.4e38    2^-126           2^-133               8 bits
//   fp16    1      5         10       15   65504     2^-14            2^-24               11 bits
// bf16 is fp32's top half: the same range, fewer digits, so it never overflows where fp32 does
// not. fp16 keeps 3 more digits but overflows past 65504 (to inf) and loses small numbers below
// 2^-14 gradually (subnormals) and completely below 2^-25: gradients, which are small, vanish.
// Hence loss scaling (section 6): multiply the loss by S (say 2^16) so the gradients the
// backward forms in fp16 are S times larger, and divide the fp32 gradients by S afterwards.
// Every conversion rounds to nearest, ties to even (IEEE 754's default; CUDA's __float2half_rn
// and __float2bfloat16_rn), so the CPU build below rounds exactly as the GPU's conversions do.

// fp32 -> fp16 bits. An fp32 value is m * 2^(E-150), m = 1.mantissa as a 24-bit integer, E its
// biased exponent; fp16's biased exponent is e = E - 127 + 15.
uint16_t mt_fp16_from_float(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);    // NaN stays a (quiet) NaN
    int e = (int)(a >> 23) - 127 + 15;
    if (e >= 31) return (uint16_t)(sign | 0x7c00u);            // |x| >= 2^16 (and inf): inf
    if (e <= 0) {                                              // fp16 subnormal (or zero): units of 2^-24
        if (e < -10) return sign;                              // |x| < 2^-25: below half a unit, 0
        uint32_t m = (a & 0x7fffffu) | 0x800000u;              // the hidden bit back in
        int shift = 14 - e;                                    // x = m * 2^(e-14) units: drop 14-e bits
        uint32_t h = m >> shift, rest = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rest > half || (rest == half && (h & 1u))) h++;    // to nearest, ties to even (may reach 2^-14)
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((uint32_t)e << 10) | ((a & 0x7fffffu) >> 13), rest = a & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++;  // a carry may bump the exponent, up to inf
    return (uint16_t)(sign | h);
}

float mt_fp16_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, u;
    if (e == 0) {                                   // zero or subnormal: m units of 2^-24, exact in fp32
        float v = ldexpf((float)m, -24);
        return sign ? -v : v;
    }
    if (e == 31) u = sign | 0x7f800000u | (m << 13);   // inf, or NaN (m != 0)
    else u = sign | ((e + 127 - 15) << 23) | (m << 13);
    float v;
    memcpy(&v, &u, sizeof v);
    return v;
}

// fp32 -> bf16 bits: the top 16 bits, rounded on the 16 dropped ones. Adding 0x7fff plus the
// kept part's lowest bit rounds to nearest with ties to even; a carry runs into the exponent
// (and from the largest finite values into inf, which is correct).
uint16_t mt_bf16_from_float(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);   // NaN stays a (quiet) NaN
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

float mt_bf16_to_float(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float v;
    memcpy(&v, &u, sizeof v);
    return v;
}

// x rounded to dt, as an fp32 value. For fp16 the common case, a result in fp16's normal range
// (2^-14 <= |x| < 65520), is rounded in place like bf16 above, on the 13 mantissa bits fp16 lacks
// (the same value as the round trip through the bits, twice as fast: the CPU build calls this on
// every GEMM and attention operand); subnormals, overflow, inf and NaN take the round trip.
float mt_round_to_dtype(float x, mt_dtype dt) {
    switch (dt) {
    case MT_DTYPE_BF16: return mt_bf16_to_float(mt_bf16_from_float(x));
    case MT_DTYPE_FP16: {
        uint32_t u;
        memcpy(&u, &x, sizeof u);
        uint32_t a = u & 0x7fffffffu;
        if (a < 0x38800000u || a >= 0x477ff000u) return mt_fp16_to_float(mt_fp16_from_float(x));
        u = (u + 0xfffu + ((u >> 13) & 1u)) & ~0x1fffu;   // to nearest, ties to even, on bit 13
        float v;
        memcpy(&v, &u, sizeof v);
        return v;
    }
    case MT_DTYPE_FP32: break;
    }
    return x;
}

void mt_round_cpu(float *out, const float *inp, size_t n, mt_dtype dt) {
    for (size_t k = 0; k < n; k++) out[k] = mt_round_to_dtype(inp[k], dt);
}

// n 16-bit values packed at the start of buf become n floats, from the last down: float k covers
// the bytes of 16-bit values 2k and 2k + 1, which steps 2k and 2k + 1 (no later than step k) have
// already read. (The 16 bits are copied out as bytes: the buffer is floats to C's aliasing rules.)
void mt_widen_16bit(float *buf, size_t n, mt_dtype dt) {
    for (size_t k = n; k-- > 0;) {
        uint16_t bits;
        memcpy(&bits, (const char *)buf + 2 * k, sizeof bits);
        buf[k] = dt == MT_DTYPE_FP16 ? mt_fp16_to_float(bits) : mt_bf16_to_float(bits);
    }
}

// a copy of x (n floats) rounded to dt: the operand as the tensor cores receive it
static float *mt__rounded_copy(const float *x, size_t n, mt_dtype dt) {
    float *copy = (float *)mt_malloc(sizeof(float) * (n ? n : 1), "rounded operand");
    mt_round_cpu(copy, x, n, dt);
    return copy;
}

// The GPU build's GEMM rungs for --bf16 / --fp16 (kernels.cuh, mma and wgmma) round both
// operands of every product to dt and accumulate in fp32; the bias is added in fp32. So do these,
// with the fp32 reference on rounded copies:
//   forward          out = round(inp) @ round(weight)^T + bias
//   backward         dinp += round(dout) @ round(weight);  dweight += round(dout)^T @ round(inp);
//                    dbias += column sums of dout, unrounded (an fp32 reduction on the GPU too)
// With loss scaling, dout is the scaled gradient: where it exceeds 65504, round(dout) is inf, and
// the inf reaches the gradients, as on the GPU. MT_DTYPE_FP32: the _cpu op itself.
void mt_matmul_forward_rounded_cpu(float *out, const float *inp, const float *weight, const float *bias, int BT, int C,
                                   int OC, mt_dtype dt) {
    if (dt == MT_DTYPE_FP32) { mt_matmul_forward_cpu(out, inp, weight, bias, BT, C, OC); return; }
    float *inp_r = mt__rounded_copy(inp, (size_t)BT * C, dt);
    float *weight_r = mt__rounded_copy(weight, (size_t)OC * C, dt);
    mt_matmul_forward_cpu(out, inp_r, weight_r, bias, BT, C, OC);
    free(inp_r);
    free(weight_r);
}

void mt_matmul_backward_rounded_cpu(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                                    const float *weight, int BT, int C, int OC, mt_dtype dt) {
    if (dt == MT_DTYPE_FP32) { mt_matmul_backward_cpu(dinp, dweight, dbias, dout, inp, weight, BT, C, OC); return; }
    float *dout_r = mt__rounded_copy(dout, (size_t)BT * OC, dt);
    float *inp_r = dweight ? mt__rounded_copy(inp, (size_t)BT * C, dt) : NULL;
    float *weight_r = dinp ? mt__rounded_copy(weight, (size_t)OC * C, dt) : NULL;
    mt_matmul_backward_cpu(dinp, dweight, NULL, dout_r, inp_r, weight_r, BT, C, OC);
    if (dbias)
        for (int o = 0; o < OC; o++) {
            float db = 0.0f;
            for (int bt = 0; bt < BT; bt++) db += dout[(size_t)bt * OC + o];
            dbias[o] += db;
        }
    free(dout_r);
    free(inp_r);
    free(weight_r);
}

// the MLP's fc layer and its GELU: pre = round(inp) @ round(weight)^T + bias, out = gelu(pre)
void mt_matmul_forward_gelu_cpu(float *pre, float *out, const float *inp, const float *weight, const float *bias, int BT,
                                int C, int OC, mt_dtype dt) {
    mt_matmul_forward_rounded_cpu(pre, inp, weight, bias, BT, C, OC, dt);
    mt_gelu_forward_cpu(out, pre, (size_t)BT * OC);
}

// the MLP's two products of a training forward: fch = round(inp) @ round(fcw)^T + fcb, then
// out = round(gelu(fch)) @ round(fcprojw)^T (+ fcprojb): the first matmul, fch rounded to fch_dt
// (where the GPU keeps it in 16 bits: mt_fch_gemm_dtype), its GELU, then the second matmul, gelu(fch)
// in a temporary (the GPU writes it rounded, in 16 bits, from the first GEMM's epilogue straight
// into the second's operand: the same values)
void mt_mlp_forward_cpu(float *fch, float *out, const float *inp, const float *fcw, const float *fcb,
                        const float *fcprojw, const float *fcprojb, const float *residual, int BT, int C, int F, int OC,
                        mt_dtype dt, mt_dtype fch_dt) {
    float *h = (float *)mt_malloc((size_t)BT * F * sizeof(float) + 1, "gelu(fch)");
    mt_matmul_forward_rounded_cpu(fch, inp, fcw, fcb, BT, C, F, dt);
    if (fch_dt != MT_DTYPE_FP32) mt_round_cpu(fch, fch, (size_t)BT * F, fch_dt);
    mt_gelu_forward_cpu(h, fch, (size_t)BT * F);
    mt_matmul_forward_rounded_cpu(out, h, fcprojw, fcprojb, BT, F, OC, dt);
    if (residual) mt_residual_forward_cpu(out, residual, out, (size_t)BT * OC);   // (elementwise: in place is safe)
    free(h);
}

// the fc-proj layer's backward through the GELU in front of it: inp = gelu(x), x = gelu_inp (BT,C);
// dinp = dL/dx = (dout @ weight) * gelu'(x), the matmul's input gradient taken through the GELU in place
void mt_matmul_backward_gelu_cpu(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                                 const float *weight, const float *gelu_inp, int BT, int C, int OC, mt_dtype dt) {
    mt_matmul_backward_rounded_cpu(dinp, dweight, dbias, dout, inp, weight, BT, C, OC, dt);
    mt_gelu_backward_cpu(dinp, gelu_inp, dinp, (size_t)BT * C);   // elementwise: in place is safe
}

// The GPU's attention for --bf16 / --fp16 (kernels.cuh, the _mma kernels) loads Q, K, V and dO in
// dt, and hands the tensor cores P (for P @ V and dV) and dS (for dQ, dK) in dt; scores, the
// softmax, its sums and every accumulator stay fp32. Here: Q, K, V (and dout) rounded copies,
// P and dS rounded inside (mt__attention_forward / _backward above). The one difference: the
// GPU rounds P before dividing by the row's sum (the online softmax), this rounds it after; the
// rounding error has the same size relative to P either way.
void mt_attention_forward_rounded_cpu(float *out, float *lse, const float *qkv, int B, int T, int C_local,
                                      int NH_local, const mt_dropout *drop, int head_offset, int NH_global,
                                      mt_dtype dt) {
    if (dt == MT_DTYPE_FP32) {
        mt__attention_forward(out, lse, qkv, B, T, C_local, NH_local, drop, head_offset, NH_global, dt);
        return;
    }
    float *qkv_r = mt__rounded_copy(qkv, (size_t)B * T * 3 * C_local, dt);
    mt__attention_forward(out, lse, qkv_r, B, T, C_local, NH_local, drop, head_offset, NH_global, dt);
    free(qkv_r);
}

void mt_attention_backward_rounded_cpu(float *dqkv, const float *dout, const float *qkv, const float *out,
                                       const float *lse, int B, int T, int C_local, int NH_local,
                                       const mt_dropout *drop, int head_offset, int NH_global, mt_dtype dt) {
    if (dt == MT_DTYPE_FP32) {
        mt__attention_backward(dqkv, dout, qkv, out, lse, B, T, C_local, NH_local, drop, head_offset, NH_global, dt);
        return;
    }
    float *qkv_r = mt__rounded_copy(qkv, (size_t)B * T * 3 * C_local, dt);
    float *dout_r = mt__rounded_copy(dout, (size_t)B * T * C_local, dt);
    mt__attention_backward(dqkv, dout_r, qkv_r, out, lse, B, T, C_local, NH_local, drop, head_offset, NH_global, dt);
    free(qkv_r);
    free(dout_r);
}

// ---------------------------------------------------------------------------------------------
// the GPU build's kernel scratch: what its launchers borrow, and the most one step holds at once
// ---------------------------------------------------------------------------------------------
// Besides the buffers a rank allocates once (parameters, gradients, AdamW's moments, activations,
// the per-layer workspace: sections 5 and 6), kernels.cuh's launchers borrow device memory for the
// length of one op: mt__scratch_alloc as they start, mt__scratch_free before they return, lent from
// the rank's arena, one buffer of this section's peak made at start-up (kernels.cuh, section 1; the
// stream-ordered pool lends what it cannot serve).
// What each borrows, in bytes (a bf16 or fp16 element is 2, a float or an int 4):
//   GEMM, wgmma rung    both operands rounded to bf16 / fp16: (span + 8) x 2 each, where the span
//                       runs from the operand's first element to its last in its own layout and
//                       leading dimension, plus 8 spare elements (not for a weight while the
//                       parameters' 16-bit copy is on: mt_device_weights16 lends it, the plan's
//                       own term); and with split-K, slots x 128 x 256 fp32 partial tiles
//                       (mt_wgmma_plan_make)
//   GEMM, tiled / mma   split-K only: splits x M x N fp32 partial products (mt_gemm_splits)
//   matmul backward     wgmma: dout, weight (when dinp is wanted) and inp are rounded ONCE and all
//                       three stay alive through both products, so dout16 + w16 + inp16 + the larger
//                       split-K scratch of the two products; after they are freed, dbias's column
//                       sums: ceil(BT/256) x OC floats. The other rungs: the dinp GEMM, the dweight
//                       GEMM and the column sums one after another: the largest of the three.
//   attention forward   bf16 / fp16: qkv rounded, B*T*3*C_local elements
//   attention backward  D = rowsum(dO * O), B*NH_local*T floats, and (bf16 / fp16) qkv and dout
//                       rounded: all three alive together
//   layernorm backward  each block's partial dweight and dbias: 2 x ceil(N/32) x C floats
//   embedding backward  the counting sort's row starts and positions: V_local + 1 + BT ints
// A launcher frees what it borrowed before it returns, and a rank's ops run one after another on
// its stream, so the most lent at once is the largest of the ops' own sums: the peak is one op, not
// a sum over ops. (The arena rounds each piece up to 256 bytes: it is made that much larger for
// each piece that can be alive at once, kernels.cuh's mt__scratch_arena_make.) GPT-2 small, B=16
// (BT = 16384), bf16, where the logits' gradient is kept in 16 bits already (mt_logits_grad_dtype)
// and the weights are lent by the parameters' 16-bit copy: the fc projection's backward,
//   dout (16384 x 768) as bf16        ( 12,582,912 + 8) x 2 =  25.2 MB
//   gelu(fch) (16384 x 3072), remade  ( 50,331,648 + 8) x 2 = 100.7 MB
//   split-K of the weight gradient    2 slices x 64 tiles x 144 KB = 18.9 MB (192 x 192 tiles)
//                                                            144.7 MB
// (the LM head's backward once borrowed 1750.8 MB: its gradient's rounded copy, 1648.4, and wte's,
// 77.3, now neither; tests/test_recompute.c restates the sum).
// Left out: the optimizer's reductions (the norm's per-block partial sums, at most 8 KB; fp16's
// inf/NaN flag, 4 bytes), and the aligned copies the attention launchers make of a tensor that
// does not start on a 16-byte boundary (the carve's tensors do, when B*T and C are multiples of 4).
// The tiles the split-K choices count in (kernels.cuh's GEMM kernels are built on them):
static const int MT__TILED_BM = 128, MT__TILED_BN = 128, MT__TILED_BK = 8;   // kernel2_tiled (fp32)
static const int MT__MMA_BM = 128, MT__MMA_BN = 128, MT__MMA_BK = 32;        // kernel3_mma (bf16 / fp16)
static const int MT__WG_BM = 128, MT__WG_BN = 256, MT__WG_BK = 64;           // kernel4_wgmma (Hopper)
static const int MT__WG192 = 192;                                            // its other tile, 192 x 192
static const int MT__WG_SMS = 132;   // the SM count the wgmma split-K choice assumes (H100 / H200 SXM)
static const int MT__LN_ROWS_PER_BLOCK = 32;   // rows of one block of the layernorm backward
static const int MT__COLSUM_ROWS = 256;        // rows of one chunk of the bias gradient's column sums
static const int MT__EMB_CHUNK = 1024;         // positions of one block of the embedding backward's placement
#define MT_GEMV_MAX_ROWS 8   // a matmul forward of at most this many rows is a GEMV: no scratch

// how many k-slices for the tiled and mma rungs: enough blocks for about two per SM of an
// H100/H200 (132 SMs), each slice at least 4 steps of bk. A function of the shape only, so results
// do not depend on the device.
static int mt__gemm_splits(int tiles, int K, int bk) {
    int splits = 1;
    while (splits < 16 && tiles * splits < 264 && K / (2 * splits) >= 4 * bk) splits *= 2;
    return splits;
}
// the tiled or mma rung's cut of one GEMM: k_per_split (a multiple of bk) and the slices (no empty one)
int mt_gemm_splits(mt_gemm_impl impl, int M, int N, int K, int *k_per_split) {
    int bm = impl == MT_GEMM_MMA ? MT__MMA_BM : MT__TILED_BM, bn = impl == MT_GEMM_MMA ? MT__MMA_BN : MT__TILED_BN;
    int bk = impl == MT_GEMM_MMA ? MT__MMA_BK : MT__TILED_BK;
    int tiles_m = (M + bm - 1) / bm, tiles_n = (N + bn - 1) / bn;
    int splits = mt__gemm_splits(tiles_m * tiles_n, K, bk);
    int per = ((K + splits - 1) / splits + bk - 1) / bk * bk;   // a multiple of bk
    if (per == 0) per = bk;                                     // K = 0: one empty slice
    *k_per_split = per;
    return K == 0 ? 1 : (K + per - 1) / per;                    // no empty slice
}

// THE PLAN for a GEMM of `tiles` output tiles of `steps` k-steps each: 1 = one block per tile,
// S > 1 = split-K in S slices. Estimated time, in units of one k-step of one block (~0.78 us on an
// H200): (waves of tiles*S units on 132 SMs) x (k-steps per unit + ~4 for its epilogue), plus for
// S > 1 the reduce kernel: ~3 to launch + 0.044 per 128 x 256 partial read (128 KB at ~4 TB/s =
// 33 ns). Slices of at least 8 steps, at most 16; more slices must win by 3%. A function of the
// shape only (132 is fixed, not read from the GPU), so the bits of C do not depend on the device.
// Stream-K (plan 0) is never chosen here: measured on an H200 at GPT-2's weight-gradient shapes it
// was 15-40% SLOWER than split-K although it balances the k-steps perfectly. Its workers start at
// staggered k positions, so the blocks working on tiles that share rows of A or columns of B no
// longer read them at the same time and L2 stops catching the re-reads (these products reread
// each operand 3-24 times); split-K slices of neighbouring tiles start at the same k together.
// It stays available (kernels.cuh's mt__gemm_wgmma_splits(..., -1, ...)) and tested, for the curious.
// The 192 x 192 tile (want_tile 1): a k-step is 192 x 192 / (128 x 256) = 1.125 of the units above
// and a partial 144 KB (0.0495); it is taken where its best cost beats the 128 x 256 tile's by 3%.
// GPT-2's fc and fc-proj weight gradients (3072 x 768, 256 steps): 128 x 256 in 3 slices, 2 waves
// of 86 steps: 192.5; 192 x 192 in 2 slices, 128 units in one wave of 128 steps: 157.3.
static int mt__wgmma_splits_cost(int tiles, int steps, double step, double partial, double *cost_out) {
    int best = 1;
    double best_cost = 1e300;
    for (int s = 1; s <= 16; s++) {
        int per = (steps + s - 1) / s;
        if (s > 1 && per < 8) break;
        double waves = (double)((tiles * s + MT__WG_SMS - 1) / MT__WG_SMS);
        double cost = waves * (per * step + 4) + (s > 1 ? 3.0 + partial * s * tiles : 0.0);
        if (cost < 0.97 * best_cost) { best = s; best_cost = cost; }
    }
    *cost_out = best_cost;
    return best;
}
static int mt__wgmma_splits(int tiles, int steps) {   // the 128 x 256 tile's
    double cost;
    return mt__wgmma_splits_cost(tiles, steps, 1.0, 0.044, &cost);
}
// the wgmma rung's cut of one GEMM (the launcher runs it, the scratch counts its partial tiles).
// want_splits = 0: mt__wgmma_splits decides; S > 0: S k-slices (1 = none); -1: stream-K.
// want_tile: 0 the 128 x 256 tile; 1 the 192 x 192 where it wins; 2 the 192 x 192
void mt_wgmma_plan_make(mt_wgmma_plan *p, int M, int N, int K, int want_splits, int want_tile) {
    memset(p, 0, sizeof *p);
    int steps = (K + MT__WG_BK - 1) / MT__WG_BK;
    int tiles256 = ((M + MT__WG_BM - 1) / MT__WG_BM) * ((N + MT__WG_BN - 1) / MT__WG_BN);
    int tiles192 = ((M + MT__WG192 - 1) / MT__WG192) * ((N + MT__WG192 - 1) / MT__WG192);
    int use192 = want_tile == 2;
    if (want_tile == 1 && want_splits == 0 && K > 0) {
        double c256, c192;
        mt__wgmma_splits_cost(tiles256, steps, 1.0, 0.044, &c256);
        mt__wgmma_splits_cost(tiles192, steps, 1.125, 0.0495, &c192);
        use192 = c192 < 0.97 * c256;
    }
    p->bm = use192 ? MT__WG192 : MT__WG_BM;
    p->bn = use192 ? MT__WG192 : MT__WG_BN;
    p->tiles_m = (M + p->bm - 1) / p->bm;
    p->tiles_n = (N + p->bn - 1) / p->bn;
    int tiles = p->tiles_m * p->tiles_n;
    p->steps = steps;
    double cost;
    int plan = want_splits != 0 ? (want_splits < 0 ? 0 : want_splits)
               : use192 ? mt__wgmma_splits_cost(tiles, p->steps, 1.125, 0.0495, &cost) : mt__wgmma_splits(tiles, p->steps);
    if (K == 0) plan = 1;
    int splits = plan > 0 ? plan : 1;
    p->k_per_split = ((p->steps + splits - 1) / splits) * MT__WG_BK;   // a multiple of 64
    if (p->k_per_split == 0) p->k_per_split = MT__WG_BK;               // K = 0: one empty slice
    p->splits = K == 0 ? 1 : (K + p->k_per_split - 1) / p->k_per_split;   // no empty slice
    p->units = (size_t)tiles * (size_t)p->splits;
    p->slots = p->splits > 1 ? p->units : 0;
    if (plan == 0) {   // stream-K: 132 workers, whatever the GPU
        p->stream_k = 1;
        p->sk_total = (long long)tiles * p->steps;
        p->sk_slots = (int)(((p->sk_total + MT__WG_SMS - 1) / MT__WG_SMS + p->steps - 1) / p->steps) + 1;
        p->units = MT__WG_SMS;
        p->slots = (size_t)MT__WG_SMS * (size_t)p->sk_slots;
    }
}

// an operand X (rows x K) as a GEMM reads it: X(i,k) = x[i*ld + k] (k inner) or x[k*ld + i]
// (k outer); its copy keeps that layout, so it spans from x[0] to the last element read
size_t mt_gpu_operand_span(int rows, int K, int ld, int k_inner) {
    if (rows <= 0 || K <= 0) return 0;
    return k_inner ? (size_t)(rows - 1) * ld + K : (size_t)(K - 1) * ld + rows;
}
size_t mt_gpu_rounded_copy_bytes(size_t n) { return (n + 8) * 2; }

// one GEMM as kernels.cuh's mt__gemm runs it: C (M x N) = A (M x K) B (N x K)^T. The wgmma rung
// needs leading dimensions that are multiples of 8 (the TMA's 16-byte rows), else the mma rung runs.
size_t mt_gpu_gemm_scratch(mt_gemm_impl impl, int M, int N, int K, int lda, int ldb, int a_k_inner, int b_k_inner,
                           mt_dtype dtype, int b16) {
    (void)dtype;   // bf16 and fp16 copies are the same size
    if (M <= 0 || N <= 0) return 0;
    if (impl == MT_GEMM_WGMMA && (lda % 8 != 0 || ldb % 8 != 0)) impl = MT_GEMM_MMA;
    if (impl == MT_GEMM_WGMMA) {   // a16 and b16 alive through the product, and its partial tiles
        mt_wgmma_plan p;   // (the plain product: the 192 x 192 tile where both operands are k outer)
        mt_wgmma_plan_make(&p, M, N, K, 0, !a_k_inner && !b_k_inner);
        return mt_gpu_rounded_copy_bytes(mt_gpu_operand_span(M, K, lda, a_k_inner)) +
               (b16 ? 0 : mt_gpu_rounded_copy_bytes(mt_gpu_operand_span(N, K, ldb, b_k_inner))) +
               p.slots * p.bm * p.bn * sizeof(float);
    }
    if (impl != MT_GEMM_TILED && impl != MT_GEMM_MMA) return 0;   // the naive rung borrows nothing
    int per, splits = mt_gemm_splits(impl, M, N, K, &per);
    return splits > 1 ? (size_t)splits * M * N * sizeof(float) : 0;
}

// mt_matmul_forward_gpu: out (BT,OC) = inp (BT,C) @ weight (OC,C)^T, a GEMM with M = BT, N = OC, K = C
size_t mt_gpu_matmul_forward_scratch(int BT, int C, int OC, mt_gemm_impl impl, mt_dtype dtype, int w16) {
    if (BT > 0 && BT <= MT_GEMV_MAX_ROWS && OC > 0) return 0;   // the GEMV reads fp32 directly
    return mt_gpu_gemm_scratch(impl, BT, OC, C, C, C, 1, 1, dtype, w16);
}
// mt__column_sum_add: the bias gradient's partial column sums, one row of N per chunk of 256 rows
size_t mt_gpu_column_sum_scratch(int M, int N) {
    return (size_t)((M + MT__COLSUM_ROWS - 1) / MT__COLSUM_ROWS) * N * sizeof(float);
}
// mt_matmul_backward_gpu: dinp (BT,C) = dout (BT,OC) @ weight (OC,C), dweight (OC,C) += dout^T inp,
// dbias (OC) += column sums of dout. inp16 / dout16: inp / dout already in 16 bits (a layer's ln1 or
// ln2; the fc output's gradient or the logits'): no rounded copy of it
size_t mt_gpu_matmul_backward_scratch(int BT, int C, int OC, int has_dinp, int has_dbias, mt_gemm_impl impl,
                                      mt_dtype dtype, int inp16, int dout16, int w16) {
    size_t colsum = has_dbias ? mt_gpu_column_sum_scratch(BT, OC) : 0, most = colsum;
    if (impl == MT_GEMM_WGMMA && C % 8 == 0 && OC % 8 == 0 && BT > 0 && C > 0 && OC > 0) {
        mt_wgmma_plan pd, pw;   // the dinp product (BT x C, OC long), the dweight product (OC x C, BT long: k outer)
        mt_wgmma_plan_make(&pd, BT, C, OC, 0, 0);
        mt_wgmma_plan_make(&pw, OC, C, BT, 0, 1);
        size_t pw_bytes = pw.slots * pw.bm * pw.bn * sizeof(float), pd_bytes = has_dinp ? pd.slots * pd.bm * pd.bn * sizeof(float) : 0;
        size_t partials = pw_bytes > pd_bytes ? pw_bytes : pd_bytes;
        size_t dout_copy = dout16 ? 0 : mt_gpu_rounded_copy_bytes((size_t)BT * OC);
        size_t copies = dout_copy + (inp16 ? 0 : mt_gpu_rounded_copy_bytes((size_t)BT * C)) +
                        (has_dinp && !w16 ? mt_gpu_rounded_copy_bytes((size_t)OC * C) : 0);
        size_t both = copies + partials;
        // with a bias, dout's rounded copy is written by the column-sum pass: both alive first
        size_t first = has_dbias ? dout_copy + colsum : 0;
        return both > first ? both : first;
    }
    // dinp: A = dout (k = o inner), B = weight (k outer); dweight: A = dout, B = inp (both k outer)
    size_t d = has_dinp ? mt_gpu_gemm_scratch(impl, BT, C, OC, OC, C, 1, 0, dtype, w16) : 0;
    size_t w = mt_gpu_gemm_scratch(impl, OC, C, BT, OC, C, 0, 0, dtype, 0);
    if (d > most) most = d;
    return w > most ? w : most;
}
// mt_matmul_backward_gelu_gpu: the wgmma rung as mt_matmul_backward_gpu (the GELU in the epilogue);
// the other rungs first take dL/d gelu(x) (BT,C) as fp32 scratch, then the matmul's own
// (gelu's output is remade from its input: on the wgmma rung straight into the rounded copy the
// plain backward would make; on the others as fp32 scratch next to dL/d gelu(x))
size_t mt_gpu_matmul_backward_gelu_scratch(int BT, int C, int OC, int has_dbias, mt_gemm_impl impl, mt_dtype dtype,
                                           int w16) {
    size_t own = mt_gpu_matmul_backward_scratch(BT, C, OC, 1, has_dbias, impl, dtype, 0, 0, w16);
    if (impl == MT_GEMM_WGMMA && C % 8 == 0 && OC % 8 == 0) return own;
    return 2 * (size_t)BT * C * sizeof(float) + own;
}
// mt_mlp_forward_gpu: gelu(fch) (BT,F) alive through both products, 16-bit on the wgmma rung (the
// fc GEMM's epilogue writes it; the fc-proj GEMM reads it as is: only its weight is rounded), else
// fp32 between two plain matmul forwards
// (inp16: inp already 16-bit, a layer's ln2: the fc GEMM rounds only its weight)
size_t mt_gpu_mlp_forward_scratch(int BT, int C, int F, int OC, mt_gemm_impl impl, mt_dtype dtype, int inp16, int w16) {
    if (BT <= 0 || F <= 0 || OC <= 0) return 0;
    size_t fc = mt_gpu_matmul_forward_scratch(BT, C, F, impl, dtype, w16), proj;
    if (impl == MT_GEMM_WGMMA && C % 8 == 0 && F % 8 == 0 && BT > MT_GEMV_MAX_ROWS) {
        if (inp16) fc -= mt_gpu_rounded_copy_bytes((size_t)BT * C);
        proj = mt_gpu_gemm_scratch(impl, BT, OC, F, F, F, 1, 1, dtype, w16) - mt_gpu_rounded_copy_bytes((size_t)BT * F);
        return mt_gpu_rounded_copy_bytes((size_t)BT * F) + (fc > proj ? fc : proj);
    }
    proj = mt_gpu_matmul_forward_scratch(BT, F, OC, impl, dtype, w16);
    return (size_t)BT * F * sizeof(float) + (fc > proj ? fc : proj);
}
// The LM head's logits (BT, V_local) are the largest tensor of a GPT-2 step (824M values at B = 16:
// 3.3 GB in fp32). Where the wgmma rung multiplies in 16 bits, the GPU keeps them in 16 bits, as
// Megatron's --bf16 does: the head's GEMM stores them so (mt_lm_head_forward), the cross-entropy
// reads them so and writes their gradient in their place, rounded as the head's backward GEMMs
// would round it anyway (kernels.cuh, mt_cross_entropy_finish16_kernel: 16-byte pieces of 8 values,
// so V_local % 8 == 0), and mt_lm_head_backward hands it to the GEMMs as it is: 1.6 GB less kept,
// half the bytes written and read, no rounded copy borrowed. The CPU build keeps fp32 logits
// rounded to the same values. (The logits are always the LM head's: C is the hidden size.)
mt_dtype mt_logits_grad_dtype(mt_gemm_impl impl, mt_dtype dtype, int C, int V_local) {
    int wgmma = impl == MT_GEMM_WGMMA && C % 8 == 0 && V_local % 8 == 0;   // (the wgmma backward's condition too)
    return wgmma && dtype != MT_DTYPE_FP32 ? dtype : MT_DTYPE_FP32;
}
// mt_lm_head_backward: as mt_gpu_matmul_backward_scratch without a bias, dout in 16 bits where
// the logits are
size_t mt_gpu_lm_head_backward_scratch(int BT, int C, int V_local, mt_gemm_impl impl, mt_dtype dtype, int w16) {
    int dout16 = mt_logits_grad_dtype(impl, dtype, C, V_local) != MT_DTYPE_FP32;
    return mt_gpu_matmul_backward_scratch(BT, C, V_local, 1, 0, impl, dtype, 0, dout16, w16);
}
// A layer's ln1 and ln2 (BT, C) are read by nothing but the GEMMs after them: qkv and fc, in the
// forward and for the weight gradient (the layernorm's backward reads its input, not its output).
// On the wgmma rung those GEMMs round them to their 16-bit operand type as they load them, so the
// GPU stores them so: the layernorm writes 16 bits, no cast before each GEMM (two per tensor and
// layer, forward and backward), half the bytes kept. The same values the GEMMs multiply. Only
// where every product that reads them runs on the wgmma rung: bf16/fp16, rows of 8-element
// multiples (C, the qkv GEMM's OC = 3 C_tp and the fc GEMM's F for the weight gradients), more
// rows than a GEMV takes, and no sequence parallelism (its all-gather in front of the GEMMs moves
// fp32 rows). Else fp32. The CPU build stores fp32 whatever this says (its GEMMs round too).
mt_dtype mt_ln_gemm_dtype(mt_gemm_impl impl, mt_dtype dtype, int BT, int C, int qkv_OC, int F, int sequence_parallel) {
    int wgmma = impl == MT_GEMM_WGMMA && C % 8 == 0 && qkv_OC % 8 == 0 && F % 8 == 0 && BT > MT_GEMV_MAX_ROWS;
    return wgmma && !sequence_parallel && dtype != MT_DTYPE_FP32 ? dtype : MT_DTYPE_FP32;
}
// A layer's fc output fch (BT, F) is kept from the forward for the backward, which reads it twice:
// gelu'(fch) in the fc-proj input gradient's epilogue, and gelu(fch) remade in 16 bits for the
// fc-proj weight gradient. Both already work in the GEMMs' 16-bit type on the wgmma rung, so the
// GPU keeps fch there in 16 bits (half of the largest activation of a layer: 100 MB of GPT-2
// small's 200 at B = 16), as Megatron's --bf16 and PyTorch's autocast do: the fc GEMM's epilogue
// rounds it and takes the GELU of the rounded values (kernels.cuh, MT__EPI_STORE16_GELU16), so the
// forward and both backward reads see the same numbers. The CPU build keeps fp32 fch rounded the
// same way (mt_mlp_forward_cpu's fch_dt).
mt_dtype mt_fch_gemm_dtype(mt_gemm_impl impl, mt_dtype dtype, int BT, int C, int F) {
    int wgmma = impl == MT_GEMM_WGMMA && C % 8 == 0 && F % 8 == 0 && BT > MT_GEMV_MAX_ROWS;
    return wgmma && dtype != MT_DTYPE_FP32 ? dtype : MT_DTYPE_FP32;
}
// The same for the gradient in the attention's backward: dqkv (BT, 3 C_tp) is read only by the
// qkv GEMM's backward, whose products round it to their 16-bit type and whose bias gradient sums
// it. Where those run on the wgmma rung, the attention's tensor-core kernels write dqkv in 16 bits
// straight from their accumulators (kernels.cuh, mt__attention_args.dqkv16), as PyTorch's autocast
// and Megatron's --bf16 keep it: 12 bytes an element less moved (an fp32 write, its read and the
// rounded copy's write, against a 16-bit write and read), 75 MB less scratch at GPT-2 small's
// B = 16. The bias gradient then sums the rounded values; the CPU build rounds its dqkv the same way.
// (the fc output's condition, with the qkv GEMM's width for F)
// The parameters' 16-bit copy (mt_device_weights16, the seam below) is made where something reads
// it: on the wgmma rung every GEMM would round its weight into a copy (training and evaluation
// steps), and decoding's few-row GEMV reads 16-bit weights on both tensor-core rungs. bf16 / fp16.
int mt_weights16_wanted(mt_gemm_impl impl, mt_dtype dtype, int use) {
    if (dtype == MT_DTYPE_FP32 || use == MT_WEIGHTS16_OFF) return 0;
    if (use == MT_WEIGHTS16_DECODING) return impl == MT_GEMM_WGMMA || impl == MT_GEMM_MMA;
    return impl == MT_GEMM_WGMMA;
}
mt_dtype mt_dqkv_gemm_dtype(mt_gemm_impl impl, mt_dtype dtype, int BT, int C, int qkv_OC) {
    return mt_fch_gemm_dtype(impl, dtype, BT, C, qkv_OC);
}
// And for the attention output's gradient datty (BT, C_tp): the attention projection's input
// gradient, read only by the attention's backward, whose tensor-core kernels round it to their
// 16-bit type (for every product, and for D = rowsum(dO * O) on the CPU's emulation). Where that
// projection's backward runs on the wgmma rung its GEMM writes datty in 16 bits from its epilogue
// (kernels.cuh, MT__EPI_STORE16): no fp32 write, no rounded copy (10 bytes an element less moved:
// 0.25 GB a layer at GPT-2 small's B = 16), and D reads 16-bit values. (the fc output's condition,
// with the projection's K = C_tp for C and its OC = C for F)
mt_dtype mt_datty_gemm_dtype(mt_gemm_impl impl, mt_dtype dtype, int BT, int C_tp, int C) {
    return mt_fch_gemm_dtype(impl, dtype, BT, C_tp, C);
}
// The attention output atty (BT, C_tp) itself, under the same condition: its projection's forward
// and weight-gradient GEMMs read it as their 16-bit operand (each rounded it into a copy before:
// 4 bytes read and 2 written an element, twice a layer), and the backward's D = rowsum(dO * O)
// sums the 16-bit values (the CPU's emulation rounds its atty the same way). The attention's
// wgmma kernel writes it so from its epilogue (bf16, head size 64); elsewhere its launcher casts
// an fp32 result (the plan's attention-forward term). 6 bytes an element less moved, 2 less kept.
mt_dtype mt_atty_gemm_dtype(mt_gemm_impl impl, mt_dtype dtype, int BT, int C_tp, int C) {
    return mt_datty_gemm_dtype(impl, dtype, BT, C_tp, C);
}
// mt_attention_forward_gpu borrows nothing in training (the GPU keeps qkv in the tensor cores' 16
// bits already, mt_qkv_storage_dtype, and in fp32 the kernels read fp32), except where it writes a
// 16-bit atty (mt_atty_gemm_dtype) off the wgmma kernel (bf16, head size 64): the fp32 result, then
// its cast
size_t mt_gpu_attention_forward_scratch(int B, int T, int C_local, int NH_local, mt_gemm_impl impl, mt_dtype dtype,
                                        int out16) {
    if (!out16 || B == 0 || T == 0) return 0;
    if (impl == MT_GEMM_WGMMA && dtype == MT_DTYPE_BF16 && C_local == 64 * NH_local) return 0;
    return (size_t)B * T * C_local * sizeof(float);
}
// mt_attention_backward_gpu: D (B,NH_local,T), and dout (B,T,C_local) rounded
// (the wgmma kernels run where the GEMMs' rung is wgmma, the head size 64 and bf16: then the dS^T
// tiles as well; elsewhere, or where the GPU turns out to lack sm_90a, the count is
// only an upper bound)
size_t mt_gpu_attention_backward_scratch(int B, int T, int C_local, int NH_local, mt_dtype dtype, int dout16,
                                         mt_gemm_impl impl) {
    if (B == 0 || T == 0) return 0;
    size_t dsum = (size_t)B * NH_local * T * sizeof(float);
    if (dtype == MT_DTYPE_FP32) return dsum;
    size_t total = dsum + (dout16 ? 0 : mt_gpu_rounded_copy_bytes((size_t)B * T * C_local));   // dO rounded
    if (dtype == MT_DTYPE_BF16 && impl == MT_GEMM_WGMMA && NH_local > 0 && C_local == 64 * NH_local)
        total += mt_gpu_attention_ds_bytes(B, T, NH_local);
    return total;
}
size_t mt_gpu_attention_ds_bytes(int B, int T, int NH_local) {
    size_t nqb = ((size_t)T + 127) / 128;
    return (size_t)B * NH_local * nqb * (nqb + 1) * 2 * 64 * 64 * 2;
}
// mt_matmul_forward16_gpu (qkv; the LM head's logits): the plain forward GEMM (its epilogue stores
// 16 bits) on the wgmma rung; on the others an fp32 result, then its cast (fp32 storage: the plain
// matmul forward)
// (inp16: inp already 16-bit, a layer's ln1: only the weight is rounded)
size_t mt_gpu_matmul_forward16_scratch(int BT, int C, int OC, mt_gemm_impl impl, mt_dtype dtype, int inp16, int w16) {
    size_t plain = mt_gpu_matmul_forward_scratch(BT, C, OC, impl, dtype, w16);
    if (dtype == MT_DTYPE_FP32 || BT <= 0 || OC <= 0) return plain;
    if (impl == MT_GEMM_WGMMA && C % 8 == 0 && BT > MT_GEMV_MAX_ROWS)
        return plain - (inp16 ? mt_gpu_rounded_copy_bytes((size_t)BT * C) : 0);
    return (size_t)BT * OC * sizeof(float) + plain;
}
// mt_layernorm_backward_gpu over N rows of C: two (blocks, C) partial sums
size_t mt_gpu_layernorm_backward_scratch(int N, int C) {
    if (N == 0) return 0;
    return (size_t)2 * ((N + MT__LN_ROWS_PER_BLOCK - 1) / MT__LN_ROWS_PER_BLOCK) * C * sizeof(float);
}
// mt_embedding_backward_gpu: row_start (V_local + 1), positions (BT), and a count per (chunk of
// MT__EMB_CHUNK positions, token), ints
size_t mt_gpu_embedding_backward_scratch(int BT, int V_local) {
    if (BT == 0 || V_local == 0) return 0;
    size_t chunks = ((size_t)BT + MT__EMB_CHUNK - 1) / MT__EMB_CHUNK;
    return ((size_t)V_local + 1 + BT + chunks * V_local) * sizeof(int);
}

// the rung the GPU build takes on an H100/H200: --gemm, else tiled for fp32 and wgmma for bf16 /
// fp16 (kernels.cuh's mt_gemm_impl_for_precision there). For counting, where there is no GPU to ask.
static mt_gemm_impl mt__gpu_rung(const mt_config *cfg) {
    const char *names[4] = {"naive", "tiled", "mma", "wgmma"};
    for (int i = 0; i < 4; i++)
        if (strcmp(cfg->train.gemm, names[i]) == 0) return (mt_gemm_impl)i;
    return cfg->compute_dtype == MT_DTYPE_FP32 ? MT_GEMM_TILED : MT_GEMM_WGMMA;
}

// The ops of one training step of rank r that borrow, at the shapes they run at (section 5:
// mt__layer_forward / mt__layer_backward, the head, the embedding; sections 4's linear layers
// call the matmuls over all B*T positions, with sequence parallelism too). Every layer runs the
// same shapes, and recompute runs a layer's forward (or its attention) again at the same shapes:
// neither changes the peak. Evaluation runs the forwards only.
size_t mt_gpu_scratch_peak(const mt_rank *r, mt_gemm_impl impl, mt_dtype dt) {
    const mt_dims *d = &r->dims;
    int B = d->B, T = d->T, BT = B * T, C = d->C, C_tp = d->C_tp, F_tp = d->F_tp, NH_tp = d->NH_tp;
    size_t op[16];
    int n = 0;
    int ln16 = mt_ln_storage_dtype(r) != MT_DTYPE_FP32;   // ln1, ln2 stored in 16 bits: no copies of them
    int w16 = mt_weights16_wanted(impl, dt, MT_WEIGHTS16_STEP);   // the weights lent by the parameters' copy
    op[n++] = mt_gpu_matmul_forward16_scratch(BT, C, 3 * C_tp, impl, dt, ln16, w16);     // qkv = ln1 @ qkvw^T
    int atty16 = mt_atty_storage_dtype(r) != MT_DTYPE_FP32;   // atty in 16 bits: no copies of it
    op[n++] = mt_gpu_attention_forward_scratch(B, T, C_tp, NH_tp, impl, dt, atty16);
    op[n++] = mt_gpu_matmul_forward_scratch(BT, C_tp, C, impl, dt, w16) -           // attention projection
              (atty16 ? mt_gpu_rounded_copy_bytes((size_t)BT * C_tp) : 0);
    op[n++] = mt_gpu_mlp_forward_scratch(BT, C, F_tp, C, impl, dt, ln16, w16);      // fc, GELU, fc projection
    op[n++] = mt_gpu_matmul_backward_gelu_scratch(BT, F_tp, C, 1, impl, dt, w16);   // fc projection, through GELU
    int dfch16 = mt_fch_storage_dtype(r) != MT_DTYPE_FP32;   // fch's gradient in 16 bits as fch: no copy
    op[n++] = mt_gpu_matmul_backward_scratch(BT, C, F_tp, 1, 1, impl, dt, ln16, dfch16, w16);   // fc
    op[n++] = mt_gpu_layernorm_backward_scratch(B * d->T_sp, C);                    // ln2, ln1 (and ln_f)
    int datty16 = mt_datty_storage_dtype(r) != MT_DTYPE_FP32;   // datty in 16 bits: no copy of it
    op[n++] = mt_gpu_attention_backward_scratch(B, T, C_tp, NH_tp, dt, datty16, impl);
    op[n++] = mt_gpu_matmul_backward_scratch(BT, C_tp, C, 1, 1, impl, dt, atty16, 0, w16);   // attention projection
    int dqkv16 = mt_dqkv_storage_dtype(r) != MT_DTYPE_FP32;   // dqkv in 16 bits: no copy either
    op[n++] = mt_gpu_matmul_backward_scratch(BT, C, 3 * C_tp, 1, 1, impl, dt, ln16, dqkv16, w16);   // qkv
    if (r->ps.is_last_stage) {   // the LM head: logits = lnf @ wte^T (no bias), then dlnf and dwte
        op[n++] = mt_logits_grad_dtype(impl, dt, C, d->Vp_tp) == MT_DTYPE_FP32   // (16 bits: mt_lm_head_forward)
                      ? mt_gpu_matmul_forward_scratch(BT, C, d->Vp_tp, impl, dt, w16)
                      : mt_gpu_matmul_forward16_scratch(BT, C, d->Vp_tp, impl, dt, 0, w16);
        op[n++] = mt_gpu_lm_head_backward_scratch(BT, C, d->Vp_tp, impl, dt, w16);
    }
    if (r->ps.is_first_stage) op[n++] = mt_gpu_embedding_backward_scratch(BT, d->Vp_tp);
    size_t peak = 0;
    for (int i = 0; i < n; i++)
        if (op[i] > peak) peak = op[i];
    return peak;
}

// ---------------------------------------------------------------------------------------------
// THE BACKEND SEAM: where the two builds differ, one place per op
// ---------------------------------------------------------------------------------------------
// The model (§4, §5), the optimizer (§6), the schedules (§8) and the loop (§12) call
//   mt_<op>(r, ...)             every op of this section, on the rank's device
//   mt_buffer_*(r, ...)         memory the ops work on: alloc, zero, copy, upload, download
//   mt_device_*(r, ...)         device facts: set-up and tear-down, memory in use
// and never ask which build they are in. Each of these functions is defined twice, once per
// build, with the same arguments and the same meaning:
//   CPU build (below)    mt_<op> is mt_<op>_cpu; buffers are host memory (calloc)
//   GPU build            kernels.cuh, its last section: mt_<op> launches mt_<op>_gpu on the
//                        rank's stream; buffers are device memory on the rank's GPU
// Precision is the device's business: r->dev.dtype (--bf16, --fp16) reaches the ops that multiply
// in it: the GPU's tensor-core kernels, or on the CPU build the same ops with those operands
// rounded to it (mt_matmul_forward_rounded_cpu and friends, "reduced precision" above).
#ifdef __CUDACC__   /* (3 of 3) the GPU half of the seam: kernels.cuh */
#include "kernels.cuh"
#else               /* the CPU half: each op is its reference function */
// The ops that borrow scratch on the GPU also count here what the GPU's launcher would borrow for
// the same call (the rung and precision in r->dev), keeping the most: r->dev.gpu_scratch_high.
// tests/test_recompute.c compares it, after real steps, with the plan's mt_gpu_scratch_peak.
static void mt__count_gpu_scratch(mt_rank *r, size_t bytes) {
    if (bytes > r->dev.gpu_scratch_high) r->dev.gpu_scratch_high = bytes;
}
// would the GPU's launcher borrow `weight` from the parameters' 16-bit copy (kernels.cuh's
// mt__weights16_piece)? While the copy would be on (mt_device_weights16), for a parameter that
// starts a multiple of 8 elements from the parameters' start (the TMA's 16-byte alignment)
static int mt__weight_lent(const mt_rank *r, const float *weight) {
    const float *of = r->model.params_memory;
    if (!r->dev.weights16_on || !of || weight < of || weight >= of + r->model.num_params) return 0;
    return (size_t)(weight - of) % 8 == 0;
}

void mt_embedding_forward(mt_rank *r, float *out, const int *tokens, const float *wte, int B, int T, int C,
                          int vocab_start, int V_local) {
    (void)r; mt_embedding_forward_cpu(out, tokens, wte, B, T, C, vocab_start, V_local);
}

void mt_embedding_backward(mt_rank *r, float *dwte, const float *dout, const int *tokens, int B, int T, int C,
                           int vocab_start, int V_local) {
    mt__count_gpu_scratch(r, mt_gpu_embedding_backward_scratch(B * T, V_local));
    mt_embedding_backward_cpu(dwte, dout, tokens, B, T, C, vocab_start, V_local);
}

void mt_position_embedding_forward(mt_rank *r, float *out, const float *wpe, int B, int T, int C) {
    (void)r; mt_position_embedding_forward_cpu(out, wpe, B, T, C);
}

void mt_position_embedding_backward(mt_rank *r, float *dwpe, const float *dout, int B, int T, int C) {
    (void)r; mt_position_embedding_backward_cpu(dwpe, dout, B, T, C);
}

void mt_embedding_positions_forward(mt_rank *r, float *out, const int *tokens, const float *wte, const int *positions,
                                    const float *wpe, int B, int T, int C, int vocab_start, int V_local) {
    (void)r; mt_embedding_positions_forward_cpu(out, tokens, wte, positions, wpe, B, T, C, vocab_start, V_local);
}

// the CPU stores every activation in fp32 (mt_ln_storage_dtype): out_dtype is always that
static void mt__cpu_fp32_storage(mt_dtype dtype, const char *what) {
    if (dtype != MT_DTYPE_FP32) mt_fatal("internal: %s in dtype %d on the CPU build, which stores fp32", what, (int)dtype);
}

void mt_layernorm_forward(mt_rank *r, float *out, float *mean, float *rstd, const float *inp, const float *weight,
                          const float *bias, int B, int T, int C, mt_dtype out_dtype) {
    (void)r;
    mt__cpu_fp32_storage(out_dtype, "a layernorm's output");
    mt_layernorm_forward_cpu(out, mean, rstd, inp, weight, bias, B, T, C);
}

void mt_layernorm_backward(mt_rank *r, float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                           const float *weight, const float *mean, const float *rstd, int B, int T, int C) {
    mt__count_gpu_scratch(r, mt_gpu_layernorm_backward_scratch(B * T, C));
    mt_layernorm_backward_cpu(dinp, dweight, dbias, dout, inp, weight, mean, rstd, B, T, C);
}

void mt_matmul_forward(mt_rank *r, float *out, const float *inp, mt_dtype inp_dtype, const float *weight,
                       const float *bias, const float *residual, int BT, int C, int OC) {
    mt__cpu_fp32_storage(inp_dtype, "a matmul's input");
    mt__count_gpu_scratch(r, mt_gpu_matmul_forward_scratch(BT, C, OC, (mt_gemm_impl)r->dev.gemm_impl, r->dev.dtype,
                                                           mt__weight_lent(r, weight)));
    mt_matmul_forward_rounded_cpu(out, inp, weight, bias, BT, C, OC, r->dev.dtype);
    if (residual) mt_residual_forward_cpu(out, residual, out, (size_t)BT * OC);   // (elementwise: in place is safe)
}

void mt_matmul_backward(mt_rank *r, float *dinp, mt_dtype dinp_dtype, float *dweight, float *dbias, const float *dout,
                        mt_dtype dout_dtype, const float *inp, mt_dtype inp_dtype, const float *weight, int BT, int C,
                        int OC) {
    mt__cpu_fp32_storage(dinp_dtype, "a matmul's input gradient");
    mt__cpu_fp32_storage(inp_dtype, "a matmul's input");
    mt__cpu_fp32_storage(dout_dtype, "a matmul's output gradient");
    mt__count_gpu_scratch(r, mt_gpu_matmul_backward_scratch(BT, C, OC, dinp != NULL, dbias != NULL,
                                                            (mt_gemm_impl)r->dev.gemm_impl, r->dev.dtype, 0, 0,
                                                            mt__weight_lent(r, weight)));
    mt_matmul_backward_rounded_cpu(dinp, dweight, dbias, dout, inp, weight, BT, C, OC, r->dev.dtype);
}

void mt_matmul_forward_gelu(mt_rank *r, float *pre, float *out, const float *inp, const float *weight, const float *bias,
                            int BT, int C, int OC) {
    mt__count_gpu_scratch(r, mt_gpu_matmul_forward_scratch(BT, C, OC, (mt_gemm_impl)r->dev.gemm_impl, r->dev.dtype,
                                                           mt__weight_lent(r, weight)));
    mt_matmul_forward_gelu_cpu(pre, out, inp, weight, bias, BT, C, OC, r->dev.dtype);
}

void mt_mlp_forward(mt_rank *r, float *fch, mt_dtype fch_dtype, float *out, const float *inp, mt_dtype inp_dtype,
                    const float *fcw, const float *fcb, const float *fcprojw, const float *fcprojb,
                    const float *residual, int BT, int C, int F, int OC) {
    mt__cpu_fp32_storage(inp_dtype, "the MLP's input");
    mt__cpu_fp32_storage(fch_dtype, "the MLP's fc output");
    // the values the GPU keeps: fch in 16 bits where mt_fch_gemm_dtype says so for its rung
    mt_dtype gpu_fch = mt_fch_gemm_dtype((mt_gemm_impl)r->dev.gemm_impl, r->dev.dtype, BT, C, F);
    mt__count_gpu_scratch(r, mt_gpu_mlp_forward_scratch(BT, C, F, OC, (mt_gemm_impl)r->dev.gemm_impl, r->dev.dtype, 0,
                                                        mt__weight_lent(r, fcw) && mt__weight_lent(r, fcprojw)));
    mt_mlp_forward_cpu(fch, out, inp, fcw, fcb, fcprojw, fcprojb, residual, BT, C, F, OC, r->dev.dtype, gpu_fch);
}

void mt_matmul_backward_gelu(mt_rank *r, float *dinp, float *dweight, float *dbias, const float *dout,
                             const float *weight, const float *gelu_inp, mt_dtype gelu_inp_dtype, int BT, int C,
                             int OC) {
    mt__cpu_fp32_storage(gelu_inp_dtype, "the MLP's fc output");
    mt__count_gpu_scratch(r, mt_gpu_matmul_backward_gelu_scratch(BT, C, OC, dbias != NULL, (mt_gemm_impl)r->dev.gemm_impl,
                                                                 r->dev.dtype, mt__weight_lent(r, weight)));
    float *inp = (float *)mt_malloc((size_t)BT * C * sizeof(float) + 1, "gelu(gelu_inp)");   // remade, as the GPU
    mt_gelu_forward_cpu(inp, gelu_inp, (size_t)BT * C);
    mt_matmul_backward_gelu_cpu(dinp, dweight, dbias, dout, inp, weight, gelu_inp, BT, C, OC, r->dev.dtype);
    free(inp);
    // the values the GPU keeps: where it stores fch in 16 bits, fch's gradient too (the fc backward's
    // bias gradient sums these rounded values; its GEMMs round them anyway)
    mt_dtype gpu_fch = mt_fch_gemm_dtype((mt_gemm_impl)r->dev.gemm_impl, r->dev.dtype, BT, OC, C);
    if (gpu_fch != MT_DTYPE_FP32) mt_round_cpu(dinp, dinp, (size_t)BT * C, gpu_fch);
}

void mt_bias_add(mt_rank *r, float *out, const float *bias, int BT, int OC) {
    (void)r; mt_bias_add_cpu(out, bias, BT, OC);
}

void mt_dropout_forward(mt_rank *r, float *x, const mt_dropout *d, int B) {
    (void)r; mt_dropout_forward_cpu(x, d, B);
}

void mt_dropout_backward(mt_rank *r, float *dx, const mt_dropout *d, int B) {
    (void)r; mt_dropout_backward_cpu(dx, d, B);
}

// the CPU keeps qkv, ln1 and ln2 in fp32 (its emulation rounds them where the GPU's kernels read them)
mt_dtype mt_qkv_storage_dtype(const mt_config *cfg) { (void)cfg; return MT_DTYPE_FP32; }
mt_dtype mt_ln_storage_dtype(const mt_rank *r) { (void)r; return MT_DTYPE_FP32; }
mt_dtype mt_fch_storage_dtype(const mt_rank *r) { (void)r; return MT_DTYPE_FP32; }
mt_dtype mt_dqkv_storage_dtype(const mt_rank *r) { (void)r; return MT_DTYPE_FP32; }
mt_dtype mt_datty_storage_dtype(const mt_rank *r) { (void)r; return MT_DTYPE_FP32; }
mt_dtype mt_atty_storage_dtype(const mt_rank *r) { (void)r; return MT_DTYPE_FP32; }
void mt_qkv_forward(mt_rank *r, float *qkv, const float *inp, mt_dtype inp_dtype, const float *weight,
                    const float *bias, int BT, int C, int OC) {
    mt__cpu_fp32_storage(inp_dtype, "the qkv projection's input");
    mt__count_gpu_scratch(r, mt_gpu_matmul_forward16_scratch(BT, C, OC, (mt_gemm_impl)r->dev.gemm_impl, r->dev.dtype, 0,
                                                             mt__weight_lent(r, weight)));
    mt_matmul_forward_rounded_cpu(qkv, inp, weight, bias, BT, C, OC, r->dev.dtype);
}

// would the GPU keep this attention output in 16 bits (a training layer's atty, mt_atty_gemm_dtype)?
static int mt__gpu_atty16(const mt_rank *r, int BT, int C_local) {
    return mt_atty_gemm_dtype((mt_gemm_impl)r->dev.gemm_impl, r->dev.dtype, BT, C_local, r->dims.C) != MT_DTYPE_FP32;
}
void mt_attention_forward(mt_rank *r, float *out, mt_dtype out_dtype, float *lse, const float *qkv, int B, int T,
                          int C_local, int NH_local, const mt_dropout *drop, int head_offset, int NH_global) {
    mt__cpu_fp32_storage(out_dtype, "the attention's output");
    int gpu_atty16 = mt__gpu_atty16(r, B * T, C_local);
    mt__count_gpu_scratch(r, mt_gpu_attention_forward_scratch(B, T, C_local, NH_local, (mt_gemm_impl)r->dev.gemm_impl,
                                                              r->dev.dtype, gpu_atty16));
    mt_attention_forward_rounded_cpu(out, lse, qkv, B, T, C_local, NH_local, drop, head_offset, NH_global,
                                     r->dev.dtype);
    // the values the GPU keeps: a training layer's atty in 16 bits where mt_atty_gemm_dtype says so
    if (gpu_atty16) mt_round_cpu(out, out, (size_t)B * T * C_local, r->dev.dtype);
}

void mt_attention_backward(mt_rank *r, float *dqkv, mt_dtype dqkv_dtype, const float *dout, mt_dtype dout_dtype,
                           const float *qkv, const float *out, mt_dtype out_dtype, const float *lse, int B, int T,
                           int C_local, int NH_local, const mt_dropout *drop, int head_offset, int NH_global) {
    mt__cpu_fp32_storage(out_dtype, "the attention's output");
    mt__cpu_fp32_storage(dqkv_dtype, "the attention's input gradient");
    mt__cpu_fp32_storage(dout_dtype, "the attention's output gradient");
    // (where the GPU keeps datty in 16 bits, D = rowsum(dO * O) there reads the rounded dO, as the
    // emulation below does anyway: it rounds dout for every product and for D)
    mt_dtype gpu_datty = mt_datty_gemm_dtype((mt_gemm_impl)r->dev.gemm_impl, r->dev.dtype, B * T, C_local, r->dims.C);
    mt__count_gpu_scratch(r, mt_gpu_attention_backward_scratch(B, T, C_local, NH_local, r->dev.dtype,
                                                               gpu_datty != MT_DTYPE_FP32,
                                                               (mt_gemm_impl)r->dev.gemm_impl));
    mt_attention_backward_rounded_cpu(dqkv, dout, qkv, out, lse, B, T, C_local, NH_local, drop, head_offset,
                                      NH_global, r->dev.dtype);
    // the values the GPU keeps: dqkv in 16 bits where mt_dqkv_gemm_dtype says so for its rung
    mt_dtype gpu_dqkv = mt_dqkv_gemm_dtype((mt_gemm_impl)r->dev.gemm_impl, r->dev.dtype, B * T, r->dims.C, 3 * C_local);
    if (gpu_dqkv != MT_DTYPE_FP32) mt_round_cpu(dqkv, dqkv, (size_t)B * T * 3 * C_local, gpu_dqkv);
}

void mt_attention_cached_forward(mt_rank *r, float *out, float *kcache, float *vcache, const float *qkv,
                                 const int *start, int B, int Tq, int C_local, int NH_local, int cap) {
    (void)r; mt_attention_cached_forward_cpu(out, kcache, vcache, qkv, start, B, Tq, C_local, NH_local, cap);
}

int mt_qkv_attention_decode(mt_rank *r, float *out, float *kcache, float *vcache, const float *ln, const float *weight,
                            const float *bias, const int *start, int C, int C_local, int NH_local, int cap) {
    (void)r; (void)out; (void)kcache; (void)vcache; (void)ln; (void)weight; (void)bias; (void)start; (void)C;
    (void)C_local; (void)NH_local; (void)cap;
    return 0;   // the CPU runs the two ops
}

void mt_argmax_rows(mt_rank *r, int *out, const float *x, int rows, int n, int ld) {
    (void)r; mt_argmax_rows_cpu(out, x, rows, n, ld);
}

size_t mt_sample_rows_work_bytes(int rows, int n) {
    (void)rows; (void)n; return 0;   // the CPU's op borrows its own
}
void mt_sample_rows(mt_rank *r, int *out, const float *x, int rows, int n, int ld, const mt_draw *draws, void *work) {
    (void)r; (void)work; mt_sample_rows_cpu(out, x, rows, n, ld, draws);
}

void mt_decode_advance(mt_rank *r, int *tokens, int *positions, int *start, mt_draw *draws, int *step, int *ring,
                       const int *next, const mt_draw *plan, int plan_steps, int ring_slots, int rows, int cap) {
    (void)r;
    mt_decode_advance_cpu(tokens, positions, start, draws, step, ring, next, plan, plan_steps, ring_slots, rows, cap);
}

void mt_gelu_forward(mt_rank *r, float *out, const float *inp, size_t N) {
    (void)r; mt_gelu_forward_cpu(out, inp, N);
}

void mt_gelu_backward(mt_rank *r, float *dinp, const float *inp, const float *dout, size_t N) {
    (void)r; mt_gelu_backward_cpu(dinp, inp, dout, N);
}

void mt_residual_forward(mt_rank *r, float *out, const float *a, const float *b, size_t N) {
    (void)r; mt_residual_forward_cpu(out, a, b, N);
}

void mt_residual_layernorm_forward(mt_rank *r, float *res, float *out, float *mean, float *rstd, const float *a,
                                   const float *b, const float *weight, const float *bias, int B, int T, int C,
                                   mt_dtype out_dtype) {
    (void)r;
    mt__cpu_fp32_storage(out_dtype, "a layernorm's output");
    mt_residual_layernorm_forward_cpu(res, out, mean, rstd, a, b, weight, bias, B, T, C);
}

// the CPU keeps the logits in fp32 (mt_logits_storage_dtype), rounded to the 16 bits the GPU stores
// them in (mt_logits_grad_dtype, for the rung and precision the GPU build would run): the same values
mt_dtype mt_logits_storage_dtype(const mt_rank *r) { (void)r; return MT_DTYPE_FP32; }
void mt_lm_head_forward(mt_rank *r, float *logits, mt_dtype logits_dtype, const float *inp, const float *weight, int BT,
                        int C, int V_local) {
    mt__cpu_fp32_storage(logits_dtype, "the logits");
    mt_gemm_impl impl = (mt_gemm_impl)r->dev.gemm_impl;
    mt_dtype gpu = mt_logits_grad_dtype(impl, r->dev.dtype, C, V_local);
    int w16 = mt__weight_lent(r, weight);
    mt__count_gpu_scratch(r, gpu == MT_DTYPE_FP32 ? mt_gpu_matmul_forward_scratch(BT, C, V_local, impl, r->dev.dtype, w16)
                                                  : mt_gpu_matmul_forward16_scratch(BT, C, V_local, impl, r->dev.dtype, 0,
                                                                                    w16));
    mt_matmul_forward_rounded_cpu(logits, inp, weight, NULL, BT, C, V_local, r->dev.dtype);
    if (gpu != MT_DTYPE_FP32) mt_round_cpu(logits, logits, (size_t)BT * V_local, gpu);
}

void mt_cross_entropy_local_max(mt_rank *r, float *maxv, const float *logits, mt_dtype logits_dtype, int BT, int V_local,
                                int vocab_start, int V) {
    (void)r;
    mt__cpu_fp32_storage(logits_dtype, "the logits");
    mt_cross_entropy_local_max_cpu(maxv, logits, BT, V_local, vocab_start, V);
}

void mt_cross_entropy_local_sums(mt_rank *r, float *sumexp, float *target_logit, const float *logits,
                                 mt_dtype logits_dtype, const float *maxv, const int *targets, int BT, int V_local,
                                 int vocab_start, int V) {
    (void)r;
    mt__cpu_fp32_storage(logits_dtype, "the logits");
    mt_cross_entropy_local_sums_cpu(sumexp, target_logit, logits, maxv, targets, BT, V_local, vocab_start, V);
}

void mt_cross_entropy_local_max_sums(mt_rank *r, float *maxv, float *sumexp, float *target_logit, const float *logits,
                                     mt_dtype logits_dtype, const int *targets, int BT, int V_local, int vocab_start,
                                     int V) {
    (void)r;
    mt__cpu_fp32_storage(logits_dtype, "the logits");
    mt_cross_entropy_local_max_cpu(maxv, logits, BT, V_local, vocab_start, V);
    mt_cross_entropy_local_sums_cpu(sumexp, target_logit, logits, maxv, targets, BT, V_local, vocab_start, V);
}

void mt_cross_entropy_finish(mt_rank *r, float *losses, float *dlogits, mt_dtype logits_dtype, const float *maxv,
                             const float *sumexp, const float *target_logit, const int *targets, int BT, int V_local,
                             int vocab_start, int V, float dloss) {
    (void)r;
    mt__cpu_fp32_storage(logits_dtype, "the logits");
    mt_cross_entropy_finish_cpu(losses, dlogits, maxv, sumexp, target_logit, targets, BT, V_local, vocab_start, V,
                                dloss);
}

void mt_cross_entropy_max_sums_finish(mt_rank *r, float *losses, float *logits, mt_dtype logits_dtype, float *maxv,
                                      float *sumexp, float *target_logit, const int *targets, int BT, int V_local,
                                      int vocab_start, int V, float dloss) {
    mt_cross_entropy_local_max_sums(r, maxv, sumexp, target_logit, logits, logits_dtype, targets, BT, V_local,
                                    vocab_start, V);
    mt_cross_entropy_finish(r, losses, logits, logits_dtype, maxv, sumexp, target_logit, targets, BT, V_local,
                            vocab_start, V, dloss);
}

// the CPU keeps dlogits in fp32: the matmul backward (rounding its operands as r->dev.dtype says)
void mt_lm_head_backward(mt_rank *r, float *dinp, float *dweight, const float *dlogits, mt_dtype logits_dtype,
                         const float *inp, const float *weight, int BT, int C, int V_local) {
    mt__cpu_fp32_storage(logits_dtype, "the logits' gradient");
    mt__count_gpu_scratch(r, mt_gpu_lm_head_backward_scratch(BT, C, V_local, (mt_gemm_impl)r->dev.gemm_impl,
                                                             r->dev.dtype, mt__weight_lent(r, weight)));
    mt_matmul_backward_rounded_cpu(dinp, dweight, NULL, dlogits, inp, weight, BT, C, V_local, r->dev.dtype);
}

void mt_adamw(mt_rank *r, float *param, float *m, float *v, const float *grad, float grad_scale, size_t n, float lr,
              float beta1, float beta2, float eps, float weight_decay, int step) {
    (void)r; mt_adamw_cpu(param, m, v, grad, grad_scale, n, lr, beta1, beta2, eps, weight_decay, step);
}

double mt_sum_squares(mt_rank *r, const float *x, size_t n) {
    (void)r; return mt_sum_squares_cpu(x, n);
}

double mt_sum_squares_parts(mt_rank *r, const float *x, const size_t *start, const size_t *count, int parts) {
    (void)r;
    double sum = 0.0;
    for (int i = 0; i < parts; i++) sum += mt_sum_squares_cpu(x + start[i], count[i]);
    return sum;
}
double mt_count_zeros_parts(mt_rank *r, const float *x, const size_t *start, const size_t *count, int parts) {
    (void)r;
    double zeros = 0.0;
    for (int i = 0; i < parts; i++) zeros += mt_count_zeros_cpu(x + start[i], count[i]);
    return zeros;
}

int mt_unscale_check(mt_rank *r, float *x, float inv_scale, size_t n) {
    (void)r; return mt_unscale_check_cpu(x, inv_scale, n);
}
void mt_loss_mean_add(mt_rank *r, double *acc, const float *losses, int BT) {
    (void)r; mt_loss_mean_add_cpu(acc, losses, BT);
}

// buffers: host memory, zeroed
float *mt_buffer_alloc(mt_rank *r, size_t n, const char *what) {
    (void)r; return (float *)mt_calloc(n ? n : 1, sizeof(float), what);
}

int *mt_buffer_alloc_ints(mt_rank *r, size_t n, const char *what) {
    (void)r; return (int *)mt_calloc(n ? n : 1, sizeof(int), what);
}

void mt_buffer_free(void *p) { free(p); }
void mt_buffer_zero(mt_rank *r, float *p, size_t n) {
    (void)r; memset(p, 0, n * sizeof(float));
}

void mt_buffer_copy(mt_rank *r, float *dst, const float *src, size_t n) {
    (void)r; memcpy(dst, src, n * sizeof(float));
}

void mt_buffer_copy_strided(mt_rank *r, float *dst, size_t dst_stride, const float *src, size_t src_stride, size_t row,
                            size_t rows) {
    (void)r;
    for (size_t i = 0; i < rows; i++) memcpy(dst + i * dst_stride, src + i * src_stride, row * sizeof(float));
}

void mt_buffer_upload(mt_rank *r, void *dst, const void *host_src, size_t bytes) {
    (void)r; memcpy(dst, host_src, bytes);
}

void mt_buffer_upload_queued(mt_rank *r, void *dst, const void *host_src, size_t bytes) {
    (void)r; memcpy(dst, host_src, bytes);
}

void mt_buffer_download(mt_rank *r, void *host_dst, const void *src, size_t bytes) {
    (void)r; memcpy(host_dst, src, bytes);
}

// the host memory of --optimizer-cpu-offload: the CPU's own (there is no device to pin it for)
float *mt_buffer_alloc_host(mt_rank *r, size_t n, const char *what) {
    (void)r; return (float *)mt_calloc(n ? n : 1, sizeof(float), what);
}

void mt_buffer_free_host(void *p) { free(p); }

// device facts: there is no device; every rank is a thread on the host
void mt_device_init(mt_rank *r) {
    r->dev.device = -1;
    r->dev.stream = NULL;
    r->dev.gemm_impl = (int)mt__gpu_rung(r->cfg);
    r->dev.dtype = r->cfg->compute_dtype;   // emulated: the GEMM and attention operands rounded to it
    r->dev.name[0] = 0;
    r->dev.context_bytes = 0;
    r->dev.gpu_scratch_high = 0;
}

void mt_device_free(mt_rank *r) { (void)r; }
// the timeline's clock is the host's: an op's work is done when it returns
int mt_device_mark(mt_span_log *log, void *stream) { (void)log; (void)stream; return -1; }
void mt_device_marks_resolve(mt_span_log *log) { (void)log; }
void mt_device_clock_free(mt_span_log *log) { (void)log; }
int mt_device_memory_in_use(mt_rank *r, double *used_gib, double *total_gib) {
    (void)r; *used_gib = *total_gib = 0.0;
    return 0;
}
// the memory plan's device terms: the CPU build's ops borrow no device memory (its emulated
// roundings make host copies of their operands, not counted), and the threads backend reads and
// writes the ranks' own buffers (no communication buffers)
size_t mt_device_scratch_bytes(const mt_rank *r) { (void)r; return 0; }
size_t mt_device_comm_bytes(const mt_rank *r) { (void)r; return 0; }
int mt_device_memory_measure(mt_rank *r, mt_device_memory *m) {
    (void)r; memset(m, 0, sizeof *m);
    return 0;
}

// CUDA graphs: nothing to record on the CPU; the work ran as it was queued
void mt_device_capture_begin(mt_rank *r, int decode) { (void)r; (void)decode; }
void *mt_device_capture_end(mt_rank *r) { (void)r; return NULL; }
void mt_device_graph_launch(mt_rank *r, void *graph) { (void)r; (void)graph; }
void mt_device_graph_free(void *graph) { (void)graph; }
int mt_device_first_run_costs(const mt_rank *r) { (void)r; return 0; }
// points: the work before one is done when it is marked
void mt_device_point(mt_rank *r, int i) { r->dev.point_done[i] = mt_time_seconds(); }
void mt_device_point_wait(mt_rank *r, int i) { (void)r; (void)i; }
double mt_device_point_done(const mt_rank *r, int i) { return r->dev.point_done[i]; }
void mt_device_weights16(mt_rank *r, int use) {
    r->dev.weights16_on = use != MT_WEIGHTS16_OFF &&
                          mt_weights16_wanted((mt_gemm_impl)r->dev.gemm_impl, r->dev.dtype, use);
}
size_t mt_device_weights16_bytes(const mt_rank *r) { (void)r; return 0; }
// the CPU runs a decode step op by op (section 11)
int mt_device_decode_step(mt_rank *r, const mt_decode_step *s) { (void)r; (void)s; return 0; }

void mt_device_check_precision(const mt_config *cfg) {
    if (cfg->compute_dtype != MT_DTYPE_FP32)
        fprintf(stderr, "note: the CPU build emulates --%s: GEMM and attention operands rounded to it, fp32 "
                        "arithmetic (slower than --fp32)\n", cfg->compute_dtype == MT_DTYPE_FP16 ? "fp16" : "bf16");
}
#endif

// =============================================================================================
// 4. TENSOR-PARALLEL LAYERS
// =============================================================================================
// Mirrors megatron/core/tensor_parallel/{layers.py, mappings.py, cross_entropy.py}.
// Megatron-LM paper (Shoeybi et al., 2019), section 3. Two conjugate operators carry all the
// communication of tensor parallelism:
//
//    op                        | forward            | backward
//    --------------------------+--------------------+-------------------
//    f  mt_copy_to_tp_region   | identity           | all-reduce(dX)
//    g  mt_reduce_from_tp_region| all-reduce(Y)     | identity
//
// A transformer MLP (and likewise attention) is f -> column-parallel -> row-parallel -> g:
//
//            X (B,T,C), identical on every TP rank
//                 | f: identity fwd, all-reduce(dX) bwd
//        +--------+--------+
//  rank0: H0 = gelu(X A0)      rank1: H1 = gelu(X A1)    A = [A0 | A1]   (B,T,F/tp) each, no comm
//  rank0: Z0 = H0 W0           rank1: Z1 = H1 W1         W = [W0 ; W1]   (B,T,C) partial sums
//  (the paper calls W "B"; renamed so it can't be confused with batch size B)
//        +--------+--------+
//                 | g: all-reduce(Z) fwd, identity bwd
//            Z = Z0 + Z1 + bias   (bias added once, after the reduce)
//
// Backward, the same picture read upwards: dZ arrives whole on every rank (g's backward is
// identity), each rank computes dH_r = dZ W_r^T, dA_r, dW_r with no communication, and the
// partial input gradients dX_r = dH'_r A_r^T are summed by f's backward: dX = sum_r dX_r.
// Our backward is written out by hand, so f's backward and g's forward are the same call.

// g forward / f backward: sum a (B,T,C) tensor over the TP group (nothing to do when TP = 1)
static void mt__tp_all_reduce(mt_rank *r, float *x, size_t n) {
    if (r->ps.tp_size > 1) mt_all_reduce(&r->groups.tp, x, n, MT_SUM);
}

void mt_reduce_from_tp_region_forward(mt_rank *r, float *y, size_t n) { mt__tp_all_reduce(r, y, n); }
void mt_copy_to_tp_region_backward(mt_rank *r, float *dx, size_t n) { mt__tp_all_reduce(r, dx, n); }

// ---------------------------------------------------------------------------------------------
// sequence parallel: the all-reduce split into all-gather and reduce-scatter along the sequence
// (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
// section 4.2.2; Megatron's mappings.py, gather_from_sequence_parallel_region and
// reduce_scatter_to_sequence_parallel_region)
// ---------------------------------------------------------------------------------------------
// Without SP everything between the TP layers (layernorms, dropouts, residual adds) is computed
// whole and identically on every TP rank: the same work TP times, and TP copies of the (B,T,C)
// activations those ops keep (ln1, residual2, ln2, residual3, the chunk inputs). These ops treat
// each position on its own, so SP splits them along the sequence: TP rank r holds positions
// [r*T/TP, (r+1)*T/TP) of every sample, (B, T/TP, C) = (B, T_sp, C). The TP layers still need the
// whole sequence: f (identity) becomes the paper's g, an all-gather, and g (all-reduce) becomes
// g-bar, a reduce-scatter; the backwards swap them:
//
//    op                                              | forward              | backward
//    ------------------------------------------------+----------------------+---------------------
//    g     mt_gather_from_sequence_parallel_region   | all-gather along T   | reduce-scatter along T
//    g-bar mt_reduce_scatter_to_sequence_parallel_.. | reduce-scatter along T| all-gather along T
//
//   X shard (B,T_sp,C) -LN-> g: all-gather -> X (B,T,C) -column-parallel-> ... -row-parallel->
//   Z_r (B,T,C) partial sums -g-bar: reduce-scatter-> Z shard (B,T_sp,C) + bias -dropout, residual->
//
// An all-reduce is a reduce-scatter followed by an all-gather, so the forward sends the bytes of
// plain TP (the all-gather moved on, to the next layer's input); what shrinks by TP is the memory
// and the work of the regions between the layers. The backward runs the conjugates, plus one
// all-gather per column-parallel layer: its weight gradient needs the whole input again, which
// the forward did not keep (Megatron's choice too: memory before bandwidth).
// Parameters used inside those regions (the layernorms) now see T_sp positions per rank: their
// gradients are partial sums, all-reduced over TP after the backward (section 7, as Megatron's
// finalize_model_grads does for parameters marked sequence_parallel).
//
// Layout: Megatron keeps activations as (T, B, C), sequence first, so a shard of the sequence is
// one contiguous block. We keep llm.c's (B, T, C): sample b's shard starts at b*T*C + r*T_sp*C, B
// pieces. A collective lays the ranks' shards side by side, (TP, B, T_sp, C), so one strided copy
// per rank moves them into (B, T, C) after an all-gather, and out of it before a reduce-scatter.
// With B = 1 the two layouts are the same and nothing is copied. The reduce-scatter adds the
// ranks' values in rank order, as the all-reduce does, so the sums are bit for bit plain TP's.

// full (B,T,K) from the all-gather's (TP, B, T_sp, K) in the work buffer: rank j's B pieces to
// positions [j*T_sp, (j+1)*T_sp) of each sample (B = 1: the all-gather wrote full itself)
static void mt__sequence_gathered_layout(mt_rank *r, float *full, int K) {
    int B = r->dims.B, T = r->dims.T, T_sp = r->dims.T_sp, TP = r->ps.tp_size;
    size_t n = (size_t)B * T_sp * K;   // one shard
    if (B == 1) return;
    for (int j = 0; j < TP; j++)
        mt_buffer_copy_strided(r, full + (size_t)j * T_sp * K, (size_t)T * K, r->scratch.sp_work + (size_t)j * n,
                               (size_t)T_sp * K, (size_t)T_sp * K, (size_t)B);
}
// full (B,T,K) <- every rank's shard (B,T_sp,K). started: the all-gather is left running (section 2's
// mt_all_gather_start); after mt_comm_wait, mt__sequence_gathered_layout finishes the job
static void mt__sequence_all_gather(mt_rank *r, float *full, const float *shard, int K, int started) {
    size_t n = (size_t)r->dims.B * r->dims.T_sp * K;
    float *recv = r->dims.B == 1 ? full : r->scratch.sp_work;
    if (started) {
        mt_all_gather_start(&r->groups.tp, shard, recv, n);
        return;
    }
    mt_all_gather(&r->groups.tp, shard, recv, n);
    mt__sequence_gathered_layout(r, full, K);
}

// shard (B,T_sp,K) <- sum over the TP ranks of full (B,T,K), at my positions. started: left running
// (section 2's mt_reduce_scatter_start), shard ready after mt_comm_wait
static void mt__sequence_reduce_scatter(mt_rank *r, float *shard, const float *full, int K, int started) {
    int B = r->dims.B, T = r->dims.T, T_sp = r->dims.T_sp, TP = r->ps.tp_size;
    size_t n = (size_t)B * T_sp * K;
    const float *send = full;
    if (B > 1) {
        float *work = r->scratch.sp_work;
        for (int j = 0; j < TP; j++)   // positions [j*T_sp, (j+1)*T_sp) of each sample, for rank j
            mt_buffer_copy_strided(r, work + (size_t)j * n, (size_t)T_sp * K, full + (size_t)j * T_sp * K,
                                   (size_t)T * K, (size_t)T_sp * K, (size_t)B);
        send = work;
    }
    if (started) mt_reduce_scatter_start(&r->groups.tp, send, shard, n, MT_SUM);
    else mt_reduce_scatter(&r->groups.tp, send, shard, n, MT_SUM);
}

// g forward: the whole sequence for a column-parallel layer; its backward: dX's partial sums
// from every rank, summed, my positions kept
void mt_gather_from_sequence_parallel_region_forward(mt_rank *r, float *full, const float *shard, int K) {
    mt__sequence_all_gather(r, full, shard, K, 0);
}
void mt_gather_from_sequence_parallel_region_backward(mt_rank *r, float *dshard, const float *dfull, int K) {
    mt__sequence_reduce_scatter(r, dshard, dfull, K, 0);
}
// g-bar forward: a row-parallel layer's partial sums, summed, my positions kept; its backward:
// the whole sequence's dY for the row-parallel layer's backward
void mt_reduce_scatter_to_sequence_parallel_region_forward(mt_rank *r, float *shard, const float *full, int K) {
    mt__sequence_reduce_scatter(r, shard, full, K, 0);
}
void mt_reduce_scatter_to_sequence_parallel_region_backward(mt_rank *r, float *dfull, const float *dshard, int K) {
    mt__sequence_all_gather(r, dfull, dshard, K, 0);
}

// are the layers' activations split along the sequence now? --sequence-parallel, except while
// the KV-cache generator decodes (r->state.decoding)
static int mt__sequence_parallel(const mt_rank *r) {
    return r->cfg->parallel.sequence_parallel && !r->state.decoding;
}
// my shard x (B, T_sp, K) all-gathered (g) into the scratch's sp_full, which is returned; started:
// the all-gather left running (mt__sequence_all_gather), sp_full whole after mt_comm_wait and
// mt__sequence_gathered_layout
static const float *mt__sequence_gather(mt_rank *r, const float *x, mt_dtype dtype, int K, int started) {
    if (dtype != MT_DTYPE_FP32) mt_fatal("internal: a 16-bit tensor (dtype %d) to all-gather over the sequence", (int)dtype);
    if (started) mt__sequence_all_gather(r, r->scratch.sp_full, x, K, 1);
    else mt_gather_from_sequence_parallel_region_forward(r, r->scratch.sp_full, x, K);   // g
    return r->scratch.sp_full;
}
// the whole sequence (B, T, K) that a TP layer's GEMM reads: with --sequence-parallel my shard
// gathered into sp_full, else x itself
static const float *mt__whole_sequence(mt_rank *r, const float *x, mt_dtype dtype, int K) {
    return mt__sequence_parallel(r) ? mt__sequence_gather(r, x, dtype, K, 0) : x;
}
// the same for a gradient arriving sharded (B, T_sp, OC) at a row-parallel layer's output (or the
// embedding's): g-bar's backward all-gathers it into sp_full
static const float *mt__whole_sequence_grad(mt_rank *r, const float *dout, int OC) {
    if (!mt__sequence_parallel(r)) return dout;
    mt_reduce_scatter_to_sequence_parallel_region_backward(r, r->scratch.sp_full, dout, OC);
    return r->scratch.sp_full;
}

// ---------------------------------------------------------------------------------------------
// column-parallel linear: Y_r = X A_r + b_r   (no communication forward)
// math: Y = X @ A, A is (K, OC), split by COLUMNS A = [A_0 | A_1 | ...];
// stored: weight is (OC_tp, K) = A_r^T, this rank's rows of the (OC, K) weight
// inp (BT, K) whole on every rank, out (BT, OC_tp) this rank's columns.
// --sequence-parallel: inp is my shard (B, T_sp, K) of the (B, T, K) input (BT = B*T still counts
// the output's rows), all-gathered first (g) into the scratch.
// (qkv: the attention's q, k, v projection, out stored as the attention reads it: mt_qkv_forward)
static void mt__column_parallel_forward(mt_rank *r, float *out, const float *inp, mt_dtype inp_dtype,
                                        const float *weight, const float *bias, int BT, int K, int OC_tp, int qkv) {
    inp = mt__whole_sequence(r, inp, inp_dtype, K);
    if (qkv) mt_qkv_forward(r, out, inp, inp_dtype, weight, bias, BT, K, OC_tp);
    else mt_matmul_forward(r, out, inp, MT_DTYPE_FP32, weight, bias, NULL, BT, K, OC_tp);   // f's forward is the identity
}
void mt_column_parallel_linear_forward(mt_rank *r, float *out, const float *inp, const float *weight,
                                       const float *bias, int BT, int K, int OC_tp) {
    mt__column_parallel_forward(r, out, inp, MT_DTYPE_FP32, weight, bias, BT, K, OC_tp, 0);
}
void mt_column_parallel_qkv_forward(mt_rank *r, float *qkv, const float *inp, mt_dtype inp_dtype, const float *weight,
                                    const float *bias, int BT, int K, int OC_tp) {
    mt__column_parallel_forward(r, qkv, inp, inp_dtype, weight, bias, BT, K, OC_tp, 1);
}

// backward: dA_r, db_r locally; dX = sum_r dY_r A_r^T needs f's backward (all-reduce).
// dinp is written ('='): this rank's part, then all-reduced.
// --sequence-parallel: inp and dinp are my shards (B, T_sp, K). dA_r = dY_r^T X needs the whole
// X again: the forward kept only my shard, so it is all-gathered a second time (Megatron does the
// same: the memory saved is the point). dX's partial sums are reduce-scattered (g's backward):
// each rank gets the sum at its own positions.
// (lm_head: the LM head's, whose dout is the logits gradient as the cross-entropy left it and whose
// matmul is mt_lm_head_backward's, section 3)
//
// The communication overlapped with the products (Megatron's LinearWithGradAccumulationAndAsync-
// Communication, on unless --no-async-tensor-model-parallel-allreduce). dX_r = dY_r A_r needs no X,
// and dA_r = dY_r^T X does not need dX, so each collective runs beside a product that does not
// touch its buffers:
//
//    rank's stream (the products)       | TP group's stream (NCCL)
//    -----------------------------------+--------------------------------------------
//    dX_r = dY_r A_r                    | (SP) all-gather X's shards
//    (SP: wait, lay the gather out)     |
//    dA_r += dY_r^T X, db_r += sum dY_r | all-reduce dX (SP: reduce-scatter it)
//    wait                               |
//
// The products and the sums are the same calls as without overlap, so the same bits; on the threads
// backend a started collective runs at once (section 2), so there the order is the only difference.
// the layer's products: dinp NULL or dweight NULL skips that one (mt_matmul_backward)
static void mt__column_parallel_products(mt_rank *r, float *dinp, float *dweight, float *dbias, const float *dout,
                                         mt_dtype dout_dtype, const float *x, mt_dtype x_dtype, const float *weight,
                                         int BT, int K, int OC_tp, int lm_head) {
    if (lm_head) mt_lm_head_backward(r, dinp, dweight, dout, dout_dtype, x, weight, BT, K, OC_tp);
    else mt_matmul_backward(r, dinp, MT_DTYPE_FP32, dweight, dbias, dout, dout_dtype, x, x_dtype, weight, BT, K, OC_tp);
}
static void mt__column_parallel_backward(mt_rank *r, float *dinp, float *dweight, float *dbias, const float *dout,
                                         mt_dtype dout_dtype, const float *inp, mt_dtype inp_dtype,
                                         const float *weight, int BT, int K, int OC_tp, int lm_head) {
    int sp = mt__sequence_parallel(r);
    float *d = sp ? r->scratch.sp_partial : dinp;
    if (r->ps.tp_size == 1 || r->cfg->parallel.no_async_tensor_model_parallel_allreduce) {   // one after another
        const float *x = mt__whole_sequence(r, inp, inp_dtype, K);
        mt__column_parallel_products(r, d, dweight, dbias, dout, dout_dtype, x, inp_dtype, weight, BT, K, OC_tp, lm_head);
        if (sp) mt_gather_from_sequence_parallel_region_backward(r, dinp, d, K);
        else mt_copy_to_tp_region_backward(r, dinp, (size_t)BT * K);
        return;
    }
    mt_comm *tp = &r->groups.tp;
    // with SP, X's shards gathered while dX is made (into sp_full, through sp_work when B > 1)
    const float *x = sp ? mt__sequence_gather(r, inp, inp_dtype, K, 1) : inp;
    mt__column_parallel_products(r, d, NULL, NULL, dout, dout_dtype, NULL, inp_dtype, weight, BT, K, OC_tp, lm_head);
    if (sp) {
        mt_comm_wait(tp);
        mt__sequence_gathered_layout(r, r->scratch.sp_full, K);
        mt__sequence_reduce_scatter(r, dinp, d, K, 1);   // g's backward, started
    } else {
        mt_all_reduce_start(tp, dinp, (size_t)BT * K, MT_SUM);   // f's backward, started
    }
    mt__column_parallel_products(r, NULL, dweight, dbias, dout, dout_dtype, x, inp_dtype, weight, BT, K, OC_tp, lm_head);
    mt_comm_wait(tp);
}
void mt_column_parallel_linear_backward(mt_rank *r, float *dinp, float *dweight, float *dbias, const float *dout,
                                        mt_dtype dout_dtype, const float *inp, mt_dtype inp_dtype, const float *weight,
                                        int BT, int K, int OC_tp) {
    mt__column_parallel_backward(r, dinp, dweight, dbias, dout, dout_dtype, inp, inp_dtype, weight, BT, K, OC_tp, 0);
}
void mt_lm_head_parallel_backward(mt_rank *r, float *dinp, float *dweight, const float *dlogits, const float *inp,
                                  const float *weight, int BT, int K, int V_tp) {
    mt__column_parallel_backward(r, dinp, dweight, NULL, dlogits, mt_logits_storage_dtype(r), inp, MT_DTYPE_FP32,
                                 weight, BT, K, V_tp, 1);
}
// the LM head's forward: the column-parallel forward above (no bias), the logits stored as
// mt_logits_storage_dtype says (16 bits on the GPU's wgmma rung)
void mt_lm_head_parallel_forward(mt_rank *r, float *logits, const float *inp, const float *weight, int BT, int K,
                                 int V_tp) {
    const float *x = mt__whole_sequence(r, inp, MT_DTYPE_FP32, K);
    mt_lm_head_forward(r, logits, mt_logits_storage_dtype(r), x, weight, BT, K, V_tp);
}

// ---------------------------------------------------------------------------------------------
// row-parallel linear: Y = sum_r X_r W_r + b   (all-reduce forward)
// math: Y = X @ W, W is (K, OC), split by ROWS W = [W_0 ; W_1 ; ...], X = [X_0 | X_1 | ...];
// stored: weight is (OC, K_tp), this rank's columns of the (OC, K) weight
// inp (BT, K_tp) this rank's slice, out (BT, OC) whole on every rank after the reduce.
// --sequence-parallel: out is my shard (B, T_sp, OC): the partial sums go to the scratch and are
// reduce-scattered (g-bar) instead of all-reduced; the bias is added to my positions.
// (mlp: NULL, or the MLP's fc layer in front, whose gelu(fc(x)) is X_r: mt_parallel_mlp_forward)
typedef struct { float *fch; const float *x, *fcw, *fcb; int K; mt_dtype x_dtype; } mt__mlp_front;
// the local product X_r W_r (+ b when bias is not NULL, + residual when that is not NULL) into y
static void mt__row_parallel_product(mt_rank *r, float *y, const float *inp, mt_dtype inp_dtype, const float *weight,
                                     const float *bias, const float *residual, int BT, int K_tp, int OC,
                                     const mt__mlp_front *mlp) {
    if (mlp)
        mt_mlp_forward(r, mlp->fch, mt_fch_storage_dtype(r), y, mlp->x, mlp->x_dtype, mlp->fcw, mlp->fcb, weight, bias,
                       residual, BT, mlp->K, K_tp, OC);
    else mt_matmul_forward(r, y, inp, inp_dtype, weight, bias, residual, BT, K_tp, OC);
}
// residual: NULL, or out = residual + the layer's output, joined to the product (TP = 1 only)
static void mt__row_parallel_forward(mt_rank *r, float *out, const float *inp, mt_dtype inp_dtype, const float *weight,
                                     const float *bias, const float *residual, int BT, int K_tp, int OC,
                                     const mt__mlp_front *mlp) {
    if (residual && (r->groups.tp.size > 1 || mt__sequence_parallel(r)))
        mt_fatal("internal: a residual add joined to a row-parallel product with TP = %d", r->groups.tp.size);
    if (mt__sequence_parallel(r)) {
        mt__row_parallel_product(r, r->scratch.sp_partial, inp, inp_dtype, weight, NULL, NULL, BT, K_tp, OC, mlp);   // X_r W_r
        mt_reduce_scatter_to_sequence_parallel_region_forward(r, out, r->scratch.sp_partial, OC);   // g-bar
        mt_bias_add(r, out, bias, r->dims.B * r->dims.T_sp, OC);
        return;
    }
    if (r->groups.tp.size == 1) {   // no sum to wait for: the bias in the GEMM's epilogue, one pass less
        // (x.w) + b: the same rounding
        mt__row_parallel_product(r, out, inp, inp_dtype, weight, bias, residual, BT, K_tp, OC, mlp);
        return;
    }
    mt__row_parallel_product(r, out, inp, inp_dtype, weight, NULL, NULL, BT, K_tp, OC, mlp);   // partial sum X_r W_r
    mt_reduce_from_tp_region_forward(r, out, (size_t)BT * OC);   // g
    mt_bias_add(r, out, bias, BT, OC);                             // bias once, after the sum
}
void mt_row_parallel_linear_forward(mt_rank *r, float *out, const float *inp, mt_dtype inp_dtype, const float *weight,
                                    const float *bias, const float *residual, int BT, int K_tp, int OC) {
    mt__row_parallel_forward(r, out, inp, inp_dtype, weight, bias, residual, BT, K_tp, OC, NULL);
}

// backward: dY is whole on every rank (g's backward is identity), so dX_r = dY W_r^T,
// dW_r = X_r^T dY and db = sum dY are all local. db is the same on every TP rank.
// dinp is written ('=').
// --sequence-parallel: dout is my shard (B, T_sp, OC); g-bar's backward all-gathers it into the
// scratch first, and everything above holds, db included: it is summed over the whole gathered
// dY, so it is whole and the same on every TP rank (Megatron sums its shard and all-reduces the
// bias with the layernorms instead; the all-gather is already paid for here).
void mt_row_parallel_linear_backward(mt_rank *r, float *dinp, mt_dtype dinp_dtype, float *dweight, float *dbias,
                                     const float *dout, const float *inp, mt_dtype inp_dtype, const float *weight,
                                     int BT, int K_tp, int OC) {
    dout = mt__whole_sequence_grad(r, dout, OC);
    mt_matmul_backward(r, dinp, dinp_dtype, dweight, dbias, dout, MT_DTYPE_FP32, inp, inp_dtype, weight, BT, K_tp, OC);
}

// ---------------------------------------------------------------------------------------------
// the MLP: column-parallel fc, GELU, row-parallel fc-proj. GELU is elementwise, so each rank
// applies it to its own columns F_tp: no communication between the two linears (the point of
// Megatron's split: column- then row-parallel). The GELU joins the GEMM next to it, on the device
// that can fuse it (the GPU's GEMM epilogue): forward with fc, backward with fc-proj's input gradient.
// forward: pre (BT, OC_tp) = fc(inp) as mt_column_parallel_linear_forward; out = gelu(pre)
void mt_column_parallel_linear_gelu_forward(mt_rank *r, float *pre, float *out, const float *inp, const float *weight,
                                            const float *bias, int BT, int K, int OC_tp) {
    mt_matmul_forward_gelu(r, pre, out, mt__whole_sequence(r, inp, MT_DTYPE_FP32, K), weight, bias, BT, K, OC_tp);
}
// a training forward's MLP, fc and fc-proj in one op (mt_mlp_forward, section 3), so that gelu(fch),
// (BT, F_tp) and only ever fc-proj's input, is never stored (the GPU hands it from one GEMM's
// epilogue to the next GEMM in 16 bits): the column-parallel fc's input gathered as there, the
// row-parallel fc-proj's sum and bias as there. out (B, T_sp, K) as mt_row_parallel_linear_forward's.
void mt_parallel_mlp_forward(mt_rank *r, float *out, float *fch, const float *inp, mt_dtype inp_dtype, const float *fcw,
                             const float *fcb, const float *fcprojw, const float *fcprojb, const float *residual, int BT,
                             int K, int F_tp) {
    // (the gathered input is in sp_full; the row-parallel half's partial sums go to sp_partial)
    mt__mlp_front mlp = {fch, mt__whole_sequence(r, inp, inp_dtype, K), fcw, fcb, K, inp_dtype};
    mt__row_parallel_forward(r, out, NULL, MT_DTYPE_FP32, fcprojw, fcprojb, residual, BT, F_tp, K, &mlp);
}

// backward of fc-proj (row-parallel, its input gelu(gelu_inp), my K_tp columns) on through the GELU:
// dinp = (dY W_r^T) * gelu'(gelu_inp), all local as in mt_row_parallel_linear_backward; '='.
// gelu(gelu_inp) is remade inside the op (the training forward does not keep it: mt_parallel_mlp_forward);
// gelu_inp is a layer's fc output as mt_parallel_mlp_forward kept it (mt_fch_storage_dtype)
void mt_row_parallel_linear_gelu_backward(mt_rank *r, float *dinp, float *dweight, float *dbias, const float *dout,
                                          const float *weight, const float *gelu_inp, int BT, int K_tp, int OC) {
    dout = mt__whole_sequence_grad(r, dout, OC);
    mt_matmul_backward_gelu(r, dinp, dweight, dbias, dout, weight, gelu_inp, mt_fch_storage_dtype(r), BT, K_tp, OC);
}

// ---------------------------------------------------------------------------------------------
// vocab-parallel embedding: rank r holds rows [r*Vp_tp, (r+1)*Vp_tp) of wte.
// forward: each rank looks up the tokens it owns (zeros elsewhere), then g: all-reduce, so
// every rank has the full embedding; then positions are added (wpe is replicated).
// writes out ('='), (B,T,C).
// --sequence-parallel: out is my shard (B, T_sp, C). The lookups are reduce-scattered instead of
// all-reduced (g-bar: half the traffic, each rank keeps its positions) and only my positions'
// rows of wpe are added (Megatron's embedding reduce-scatters likewise when it can).
void mt_vocab_parallel_embedding_forward(mt_rank *r, float *out, const int *tokens, const float *wte,
                                         const float *wpe) {
    int B = r->dims.B, T = r->dims.T, C = r->dims.C;
    if (mt__sequence_parallel(r)) {
        mt_embedding_forward(r, r->scratch.sp_partial, tokens, wte, B, T, C, r->dims.vocab_start, r->dims.Vp_tp);
        mt_reduce_scatter_to_sequence_parallel_region_forward(r, out, r->scratch.sp_partial, C);
        mt_position_embedding_forward(r, out, wpe + (size_t)r->dims.t_offset * C, B, r->dims.T_sp, C);
        return;
    }
    mt_embedding_forward(r, out, tokens, wte, B, T, C, r->dims.vocab_start, r->dims.Vp_tp);
    mt_reduce_from_tp_region_forward(r, out, (size_t)B * T * C);
    mt_position_embedding_forward(r, out, wpe, B, T, C);
}

// backward: dout is whole on every rank (g's backward is identity); each rank adds to its rows.
// --sequence-parallel: dout is my shard; g-bar's backward all-gathers it first. Then dwpe too is
// summed over every position from the gathered dout: whole on every rank, no all-reduce needed.
void mt_vocab_parallel_embedding_backward(mt_rank *r, float *dwte, float *dwpe, const float *dout, const int *tokens) {
    dout = mt__whole_sequence_grad(r, dout, r->dims.C);
    mt_embedding_backward(r, dwte, dout, tokens, r->dims.B, r->dims.T, r->dims.C, r->dims.vocab_start, r->dims.Vp_tp);
    mt_position_embedding_backward(r, dwpe, dout, r->dims.B, r->dims.T, r->dims.C);
}

// ---------------------------------------------------------------------------------------------
// vocab-parallel cross-entropy (megatron/core/tensor_parallel/cross_entropy.py): the logits
// stay split by vocabulary column; only three (B,T) vectors cross ranks:
//   m   = all-reduce MAX of each rank's row max
//   S   = all-reduce SUM of each rank's sum exp(l - m)
//   l_y = all-reduce SUM of the target's logit (only its owner contributes, the others add 0)
// loss = log S + m - l_y. The gradient softmax - onehot is local to each rank's columns.
// At TP = 1 nothing crosses ranks, and the max and the sum come from one op (the GPU reads the
// logits once for both: 1.6 GB in bf16 at GPT-2 small's batch); with the gradient, the finish
// joins them (mt_cross_entropy_max_sums_finish: one kernel on the GPU instead of two).
// Padding columns (>= V) are left out of the softmax, so the loss does not depend on how
// much padding TP adds. (Megatron keeps them in; their logits just learn to be very small.)
// dloss != 0: overwrite logits with dloss/dlogits (dloss = d(total loss)/d(this loss)).
void mt_vocab_parallel_cross_entropy_forward(mt_rank *r, float *losses, float *logits, const int *targets, float dloss,
                                             int want_grad) {
    int BT = r->dims.B * r->dims.T, V = r->cfg->model.vocab_size;
    mt_scratch *s = &r->scratch;
    mt_dtype dt = mt_logits_storage_dtype(r);   // as mt_lm_head_parallel_forward stored them
    if (r->ps.tp_size == 1 && want_grad) {   // one op: the GPU reads the logits from memory once
        mt_cross_entropy_max_sums_finish(r, losses, logits, dt, s->ce_max, s->ce_sum, s->ce_target, targets, BT,
                                         r->dims.Vp_tp, r->dims.vocab_start, V, dloss);
        return;
    }
    if (r->ps.tp_size == 1) {
        mt_cross_entropy_local_max_sums(r, s->ce_max, s->ce_sum, s->ce_target, logits, dt, targets, BT, r->dims.Vp_tp,
                                        r->dims.vocab_start, V);
    } else {
        mt_cross_entropy_local_max(r, s->ce_max, logits, dt, BT, r->dims.Vp_tp, r->dims.vocab_start, V);
        mt_all_reduce(&r->groups.tp, s->ce_max, (size_t)BT, MT_MAX);
        mt_cross_entropy_local_sums(r, s->ce_sum, s->ce_target, logits, dt, s->ce_max, targets, BT, r->dims.Vp_tp,
                                    r->dims.vocab_start, V);
        mt_all_reduce(&r->groups.tp, s->ce_sum, (size_t)BT, MT_SUM);
        mt_all_reduce(&r->groups.tp, s->ce_target, (size_t)BT, MT_SUM);
    }
    mt_cross_entropy_finish(r, losses, want_grad ? logits : NULL, dt, s->ce_max, s->ce_sum, s->ce_target, targets, BT,
                            r->dims.Vp_tp, r->dims.vocab_start, V, dloss);
}

// =============================================================================================
// 5. GPT MODEL
// =============================================================================================
// Mirrors megatron/core/models/gpt/gpt_model.py and transformer_layer.py, as llm.c's
// train_gpt2.c lays it out: one buffer of parameters carved into named tensors, one of
// gradients carved the same way, activations per in-flight micro-batch.
//   x = dropout(wte[tokens] + wpe)                              (first stage)
//   per layer:  x = x + dropout(proj(attn(ln1(x))));  x = x + dropout(fcproj(gelu(fc(ln2(x)))))
//   loss = cross_entropy(ln_f(x) @ wte^T, targets)              (last stage; wte is tied)

int64_t mt_sample_in_batch(const mt_rank *r, int mb, int b) {
    return (int64_t)mb * r->dims.B * r->ps.dp_size + (int64_t)r->ps.dp_rank * r->dims.B + b;
}

int mt_local_to_global_layer(const mt_rank *r, int l) {
    // interleaved: chunk c of stage s holds layers (c*PP + s)*lpc .. (megatron's get_transformer_layer_offset)
    int lpc = r->dims.layers_per_chunk;
    int c = l / lpc, j = l % lpc;
    return (c * r->ps.pp_size + r->ps.pp_rank) * lpc + j;
}

// one carve for parameters, gradients and both AdamW moments: the order here is the order
// in memory and in checkpoints. Returns the number of floats.
static size_t mt__carve_params(mt_rank *r, mt_params *p, float *base, int fill_specs) {
    const mt_config *cfg = r->cfg;
    int C = r->dims.C, C_tp = r->dims.C_tp, F_tp = r->dims.F_tp, Ll = r->dims.L_local;
    int C3 = 3 * C, F = cfg->model.ffn_hidden_size;
    int first = r->ps.is_first_stage, last = r->ps.is_last_stage;
    int tied = r->ps.pp_size > 1 && !first;   // the last stage's wte: the LM head's copy
    int sp = cfg->parallel.sequence_parallel;  // the layernorms' gradients are partial sums over TP
    const mt_param_init N = MT_INIT_NORMAL, S = MT_INIT_SCALED_NORMAL, ONE = MT_INIT_ONES, ZERO = MT_INIT_ZEROS;
    // name, pointer, offset (set below), layers, local rows, cols, global rows, cols, split, no_decay, tp_replicated,
    // present, init, tied_copy, sequence_parallel
    mt_param_spec table[MT_NUM_PARAM_TENSORS] = {
        {"wte", &p->wte, 0, 0, r->dims.Vp_tp, C, cfg->model.vocab_size, C, MT_SPLIT_VOCAB, 0, 0, first || last, N,
         tied, 0},
        {"wpe", &p->wpe, 0, 0, cfg->model.max_position_embeddings, C, cfg->model.max_position_embeddings, C,
         MT_SPLIT_NONE, 0, 1, first, N, 0, 0},
        {"ln1w", &p->ln1w, 0, Ll, 1, C, 1, C, MT_SPLIT_NONE, 1, 1, 1, ONE, 0, sp},
        {"ln1b", &p->ln1b, 0, Ll, 1, C, 1, C, MT_SPLIT_NONE, 1, 1, 1, ZERO, 0, sp},
        {"qkvw", &p->qkvw, 0, Ll, 3 * C_tp, C, C3, C, MT_SPLIT_QKV, 0, 0, 1, N, 0, 0},
        {"qkvb", &p->qkvb, 0, Ll, 3 * C_tp, 1, C3, 1, MT_SPLIT_QKV, 1, 0, 1, ZERO, 0, 0},
        {"attprojw", &p->attprojw, 0, Ll, C, C_tp, C, C, MT_SPLIT_COLS, 0, 0, 1, S, 0, 0},
        {"attprojb", &p->attprojb, 0, Ll, 1, C, 1, C, MT_SPLIT_NONE, 1, 1, 1, ZERO, 0, 0},
        {"ln2w", &p->ln2w, 0, Ll, 1, C, 1, C, MT_SPLIT_NONE, 1, 1, 1, ONE, 0, sp},
        {"ln2b", &p->ln2b, 0, Ll, 1, C, 1, C, MT_SPLIT_NONE, 1, 1, 1, ZERO, 0, sp},
        {"fcw", &p->fcw, 0, Ll, F_tp, C, F, C, MT_SPLIT_ROWS, 0, 0, 1, N, 0, 0},
        {"fcb", &p->fcb, 0, Ll, F_tp, 1, F, 1, MT_SPLIT_ROWS, 1, 0, 1, ZERO, 0, 0},
        {"fcprojw", &p->fcprojw, 0, Ll, C, F_tp, C, F, MT_SPLIT_COLS, 0, 0, 1, S, 0, 0},
        {"fcprojb", &p->fcprojb, 0, Ll, 1, C, 1, C, MT_SPLIT_NONE, 1, 1, 1, ZERO, 0, 0},
        {"lnfw", &p->lnfw, 0, 0, 1, C, 1, C, MT_SPLIT_NONE, 1, 1, last, ONE, 0, sp},
        {"lnfb", &p->lnfb, 0, 0, 1, C, 1, C, MT_SPLIT_NONE, 1, 1, last, ZERO, 0, sp},
    };
    size_t offset = 0;
    for (int i = 0; i < MT_NUM_PARAM_TENSORS; i++) {
        mt_param_spec *s = &table[i];
        size_t n = s->present ? (size_t)(s->layers ? s->layers : 1) * s->rows * s->cols : 0;
        s->offset = offset;
        *s->ptr = (s->present && base) ? base + offset : NULL;
        offset += n;
        if (fill_specs) r->model.specs[i] = *s;
    }
    return offset;
}

static size_t mt__spec_numel(const mt_param_spec *s) {
    return s->present ? (size_t)(s->layers ? s->layers : 1) * s->rows * s->cols : 0;
}

// where local element (row, col) of layer tensor s lives in the global (grows, gcols) tensor;
// returns 0 for padded vocabulary rows, which exist only locally.
static int mt__global_coords(const mt_rank *r, const mt_param_spec *s, int row, int col, int *grow, int *gcol) {
    int tp = r->ps.tp_rank;
    *grow = row;
    *gcol = col;
    switch (s->split) {
    case MT_SPLIT_NONE: break;
    case MT_SPLIT_ROWS: *grow = tp * s->rows + row; break;
    case MT_SPLIT_COLS: *gcol = tp * s->cols + col; break;
    case MT_SPLIT_QKV: {
        int part = row / r->dims.C_tp, within = row % r->dims.C_tp;      // 0 = Q, 1 = K, 2 = V
        *grow = part * r->dims.C + tp * r->dims.C_tp + within;
        break;
    }
    case MT_SPLIT_VOCAB:
        *grow = tp * s->rows + row;
        if (*grow >= s->grows) return 0;
        break;
    }
    return 1;
}

void mt_shard_copy(const mt_rank *r, const mt_param_spec *s, float *local_buffer, float *global_tensor, int dir) {
    float *base = local_buffer + s->offset;
    int nl = s->layers ? s->layers : 1;
    size_t gsize = (size_t)s->grows * s->gcols;
    for (int l = 0; l < nl; l++) {
        int gl = s->layers ? mt_local_to_global_layer(r, l) : 0;
        for (int row = 0; row < s->rows; row++)
            for (int col = 0; col < s->cols; col++) {
                int grow, gcol;
                size_t li = ((size_t)l * s->rows + row) * s->cols + col;
                if (!mt__global_coords(r, s, row, col, &grow, &gcol)) continue;
                float *g = global_tensor + (size_t)gl * gsize + (size_t)grow * s->gcols + gcol;
                if (dir == 0) *g = base[li];
                else base[li] = *g;
            }
    }
}

// Initialisation as Megatron's: normal(0, std) for weights, std/sqrt(2L) for the two output
// projections (GPT-2's scaled init), ones for layernorm weights, zeros for biases.
// Each value is drawn from the counter-based generator keyed on (seed, tensor, global layer,
// global element index): like Megatron's _initialize_affine_weight_cpu (init the whole master
// weight, keep my slice) but without materialising the whole tensor.
// A value depends only on which element it is, so host threads can share the work in any split
// (section 2's helper threads): thread `index` of `count` takes rows [rows*index/count,
// rows*(index+1)/count) of every tensor and layer. (A draw costs ~60 ns: GPT-2 small's 124M
// values are ~8 s on one core.)
static void mt__init_params_piece(void *arg, int index, int count) {   // an mt__host_job
    mt_rank *r = (mt_rank *)arg;
    const mt_config *cfg = r->cfg;
    float std = cfg->model.init_method_std;
    float out_std = std / sqrtf(2.0f * (float)cfg->model.num_layers);
    for (int i = 0; i < MT_NUM_PARAM_TENSORS; i++) {
        const mt_param_spec *s = &r->model.specs[i];
        if (!s->present) continue;
        float *base = r->model.params_memory + s->offset;
        float tensor_std = s->init == MT_INIT_SCALED_NORMAL ? out_std : std;
        int nl = s->layers ? s->layers : 1;
        int row0 = (int)((int64_t)s->rows * index / count);
        int row1 = (int)((int64_t)s->rows * (index + 1) / count);
        for (int l = 0; l < nl; l++) {
            int gl = s->layers ? mt_local_to_global_layer(r, l) : 0;
            for (int row = row0; row < row1; row++)
                for (int col = 0; col < s->cols; col++) {
                    size_t li = ((size_t)l * s->rows + row) * s->cols + col;
                    int grow, gcol;
                    if (!mt__global_coords(r, s, row, col, &grow, &gcol)) { base[li] = 0.0f; continue; }
                    if (s->init == MT_INIT_ONES) base[li] = 1.0f;
                    else if (s->init == MT_INIT_ZEROS) base[li] = 0.0f;
                    else base[li] = tensor_std * mt_rand_normal(cfg->train.seed, 0x1417 + (uint64_t)i, (uint64_t)gl, 0,
                                                                (uint64_t)grow * s->gcols + gcol);
                }
        }
    }
}

// the host's cores shared by the ranks on this node, 1 to 16 (1 below 4M parameters: not worth a thread)
static int mt__init_threads(const mt_rank *r) {
    if (r->model.num_params < ((size_t)4 << 20)) return 1;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    long n = cores > 0 ? cores / (r->ps.node_size > 0 ? r->ps.node_size : 1) : 1;
    return n < 1 ? 1 : n > 16 ? 16 : (int)n;
}

static void mt__init_params(mt_rank *r) {
    int count = mt__init_threads(r);
    if (count == 1) { mt__init_params_piece(r, 0, 1); return; }
    mt__host_pool *pool = mt__host_pool_create(count, "init", r->ps.rank, "raise the thread limit (ulimit -u)");
    mt__host_pool_run(pool, mt__init_params_piece, r);
    mt__host_pool_free(pool);
}

// ---------------------------------------------------------------------------------------------
// activation recompute (Megatron's --recompute-granularity / --recompute-method): a layer whose
// activations are not kept is run forward a second time, from its group's saved input, right
// before its backward (Chen et al. 2016; Korthikanti et al. 2022 for selective). Dropout masks come
// from the counter-based RNG, so the second forward is the first one bit for bit and the
// gradients are exactly those of a run that kept everything; the price is the extra forward.
//   full, uniform N   layers in groups of N (per model chunk); a group keeps only its input (the
//                     residual stream, residual3 of the layer before it) and its output
//   full, block N     the first N layers of each chunk recomputed one by one, the rest kept
//   selective         every layer keeps all but its attention core: the attention output atty
//                     and its logsumexp, rebuilt from qkv (Megatron recomputes the T x T scores,
//                     which our FlashAttention-style attention never stores at all)
// The rebuilt tensors go to one recompute scratch per rank (one group's worth), shared by the
// micro-batches in flight since only one backward runs at a time.
// The tensors inside the TP layers span the whole sequence (B*T rows, split by columns); those of
// the regions between them (layernorms, residuals) have B*T_sp rows: 1/TP of them with
// --sequence-parallel (section 4), which is all SP saves.
static size_t mt__layer_tensor_floats(const mt_rank *r, int k) {
    size_t BT = (size_t)r->dims.B * r->dims.T, BT_sp = (size_t)r->dims.B * r->dims.T_sp, C = r->dims.C;
    switch (k) {
    case MT_LT_QKV:   // in mt_qkv_storage_dtype: 16-bit values take half the floats (whole 16-byte pieces)
        if (mt_qkv_storage_dtype(r->cfg) == MT_DTYPE_FP32) return BT * 3 * (size_t)r->dims.C_tp;
        return (BT * 3 * (size_t)r->dims.C_tp + 7) / 8 * 4;
    case MT_LT_LN1: case MT_LT_LN2:   // in mt_ln_storage_dtype, as qkv
        if (mt_ln_storage_dtype(r) == MT_DTYPE_FP32) return BT_sp * C;
        return (BT_sp * C + 7) / 8 * 4;
    case MT_LT_ATTY:   // in mt_atty_storage_dtype, as qkv
        if (mt_atty_storage_dtype(r) == MT_DTYPE_FP32) return BT * (size_t)r->dims.C_tp;
        return (BT * (size_t)r->dims.C_tp + 7) / 8 * 4;
    case MT_LT_LSE: return (size_t)r->dims.B * r->dims.NH_tp * r->dims.T;
    case MT_LT_FCH:   // in mt_fch_storage_dtype, as qkv
        if (mt_fch_storage_dtype(r) == MT_DTYPE_FP32) return BT * (size_t)r->dims.F_tp;
        return (BT * (size_t)r->dims.F_tp + 7) / 8 * 4;
    case MT_LT_LN1_MEAN: case MT_LT_LN1_RSTD: case MT_LT_LN2_MEAN: case MT_LT_LN2_RSTD: return BT_sp;
    default: return BT_sp * C;   // ln1, residual2, ln2, residual3
    }
}
// the recompute group of local layer l (full granularity): layers [*first, *last] of its chunk
static int mt__recompute_group(const mt_rank *r, int l, int *first, int *last) {
    const mt_config *cfg = r->cfg;
    int lpc = r->dims.layers_per_chunk, j = l % lpc, chunk_start = l - j, N = cfg->recompute_num_layers;
    if (cfg->recompute == MT_RECOMPUTE_UNIFORM) {
        *first = chunk_start + j / N * N;
        *last = *first + N - 1 < chunk_start + lpc - 1 ? *first + N - 1 : chunk_start + lpc - 1;
        return 1;
    }
    if (cfg->recompute == MT_RECOMPUTE_BLOCK && j < N) { *first = *last = l; return 1; }
    *first = *last = l;
    return 0;
}
// fills r->acts.where (see mt_activation_slots) and the counts of layers kept per kind in a slot
// (kept[k]) and in the scratch (scratch[k])
static void mt__plan_recompute(mt_rank *r, int *where, size_t kept[MT_LT_COUNT], size_t scratch[MT_LT_COUNT]) {
    for (int k = 0; k < MT_LT_COUNT; k++) kept[k] = scratch[k] = 0;
    for (int l = 0; l < r->dims.L_local; l++) {
        int first, last, in_group = mt__recompute_group(r, l, &first, &last);
        for (int k = 0; k < MT_LT_COUNT; k++) {
            int s = -1;   // scratch index, or -1: kept
            if (r->cfg->recompute == MT_RECOMPUTE_SELECTIVE && (k == MT_LT_ATTY || k == MT_LT_LSE)) s = 0;
            if (in_group && !(k == MT_LT_RESIDUAL3 && l == last)) s = l - first;
            if (s < 0) where[l * MT_LT_COUNT + k] = (int)kept[k]++;
            else {
                where[l * MT_LT_COUNT + k] = -1 - s;
                if ((size_t)s + 1 > scratch[k]) scratch[k] = (size_t)s + 1;
            }
        }
    }
}
// the tensors of local layer l of the micro-batch in slot a
static void mt__layer_acts(const mt_rank *r, const mt_activations *a, int l, mt_layer_acts *la) {
    const mt_activations *s = &r->acts.recompute;
    float *const kept_base[MT_LT_COUNT] = {a->ln1, a->ln1_mean, a->ln1_rstd, a->qkv, a->atty, a->lse, a->residual2,
                                           a->ln2, a->ln2_mean, a->ln2_rstd, a->fch, a->residual3};
    float *const scratch_base[MT_LT_COUNT] = {s->ln1, s->ln1_mean, s->ln1_rstd, s->qkv, s->atty, s->lse, s->residual2,
                                              s->ln2, s->ln2_mean, s->ln2_rstd, s->fch, s->residual3};
    float **out[MT_LT_COUNT] = {&la->ln1, &la->ln1_mean, &la->ln1_rstd, &la->qkv, &la->atty, &la->lse,
                                &la->residual2, &la->ln2, &la->ln2_mean, &la->ln2_rstd, &la->fch, &la->residual3};
    for (int k = 0; k < MT_LT_COUNT; k++) {
        int w = r->acts.where[l * MT_LT_COUNT + k];
        size_t n = mt__layer_tensor_floats(r, k);
        *out[k] = w >= 0 ? kept_base[k] + (size_t)w * n : scratch_base[k] + (size_t)(-1 - w) * n;
    }
}

// activations of one micro-batch, carved from one buffer (NULL base: just count). layers[k]:
// how many layers' tensors of kind k the stacks hold; with_io: the chunk inputs and the head's
// tensors too (a slot), or not (the recompute scratch)
static size_t mt__carve_activations(const mt_rank *r, mt_activations *a, float *base, const size_t layers[MT_LT_COUNT],
                                    int with_io) {
    size_t B = r->dims.B, T = r->dims.T, C = r->dims.C, vp = r->ps.vp_size;
    size_t BT = B * T, BT_sp = B * (size_t)r->dims.T_sp;   // the residual stream's rows (section 4)
    int last = r->ps.is_last_stage && with_io;
    size_t logits_n = BT * (size_t)r->dims.Vp_tp;   // 16-bit logits (mt_logits_storage_dtype): half the floats
    if (mt_logits_storage_dtype(r) != MT_DTYPE_FP32) logits_n = (logits_n + 1) / 2;
    size_t n[MT_LT_COUNT];
    for (int k = 0; k < MT_LT_COUNT; k++) n[k] = layers[k] * mt__layer_tensor_floats(r, k);
    struct { float **ptr; size_t n; } carve[] = {
        {&a->input, with_io ? vp * BT_sp * C : 0},
        {&a->ln1, n[MT_LT_LN1]}, {&a->ln1_mean, n[MT_LT_LN1_MEAN]}, {&a->ln1_rstd, n[MT_LT_LN1_RSTD]},
        {&a->qkv, n[MT_LT_QKV]}, {&a->atty, n[MT_LT_ATTY]}, {&a->lse, n[MT_LT_LSE]},
        {&a->residual2, n[MT_LT_RESIDUAL2]},
        {&a->ln2, n[MT_LT_LN2]}, {&a->ln2_mean, n[MT_LT_LN2_MEAN]}, {&a->ln2_rstd, n[MT_LT_LN2_RSTD]},
        {&a->fch, n[MT_LT_FCH]},
        {&a->residual3, n[MT_LT_RESIDUAL3]},
        {&a->lnf, last ? BT_sp * C : 0}, {&a->lnf_mean, last ? BT_sp : 0}, {&a->lnf_rstd, last ? BT_sp : 0},
        {&a->logits, last ? logits_n : 0}, {&a->losses, last ? BT : 0},
    };
    size_t offset = 0;   // each tensor starts on a 16-byte boundary (the GPU's 16-byte loads)
    for (size_t i = 0; i < sizeof carve / sizeof carve[0]; i++) {
        *carve[i].ptr = (base && carve[i].n) ? base + offset : NULL;
        offset += (carve[i].n + 3) / 4 * 4;
    }
    return offset;
}

static size_t mt__carve_scratch(const mt_rank *r, mt_scratch *s, float *base) {
    size_t BT = (size_t)r->dims.B * r->dims.T, BT_sp = (size_t)r->dims.B * r->dims.T_sp, C = r->dims.C;
    int sp = r->cfg->parallel.sequence_parallel;
    // the fc output's gradient is stored as the fc output is (mt_fch_storage_dtype): in 16 bits, half
    // the floats, rounded up to 64 (256 bytes: what follows stays as aligned as before)
    size_t dfch_n = BT * r->dims.F_tp;
    if (mt_fch_storage_dtype(r) != MT_DTYPE_FP32) dfch_n = (dfch_n / 2 + 63) / 64 * 64;
    size_t dqkv_n = BT * 3 * r->dims.C_tp;   // likewise dqkv (mt_dqkv_storage_dtype)
    if (mt_dqkv_storage_dtype(r) != MT_DTYPE_FP32) dqkv_n = (dqkv_n / 2 + 63) / 64 * 64;
    struct { float **ptr; size_t n; } carve[] = {
        {&s->loss_acc, 64},   // first: the double at the buffer's (aligned) start
        {&s->out_c, BT_sp * C}, {&s->dresidual, BT_sp * C}, {&s->dln, BT_sp * C},
        {&s->p2p_held, r->ps.pp_size > 1 ? BT_sp * C : 0},
        {&s->dqkv, dqkv_n}, {&s->datty, BT * r->dims.C_tp},
        {&s->dfch, dfch_n},
        {&s->ce_max, BT}, {&s->ce_sum, BT}, {&s->ce_target, BT},
        {&s->sp_full, sp ? BT * C : 0}, {&s->sp_partial, sp ? BT * C : 0},
        {&s->sp_work, sp && r->dims.B > 1 ? BT * C : 0},   // B = 1: the shards are already in place
    };
    size_t offset = 0;
    for (size_t i = 0; i < sizeof carve / sizeof carve[0]; i++) {
        *carve[i].ptr = (base && carve[i].n) ? base + offset : NULL;
        offset += carve[i].n;
    }
    return offset;
}

// a rank's local sizes, from the config and its place in the grid
void mt_dims_init(mt_dims *d, const mt_config *cfg, const mt_parallel_state *ps) {
    int TP = ps->tp_size, PP = ps->pp_size;
    memset(d, 0, sizeof *d);
    d->B = cfg->train.micro_batch_size;
    d->T = cfg->model.seq_length;
    d->C = cfg->model.hidden_size;
    d->T_sp = cfg->parallel.sequence_parallel ? d->T / TP : d->T;
    d->t_offset = cfg->parallel.sequence_parallel ? ps->tp_rank * d->T_sp : 0;
    d->NH_tp = cfg->model.num_attention_heads / TP;
    d->C_tp = d->C / TP;
    d->F_tp = cfg->model.ffn_hidden_size / TP;
    d->Vp_tp = cfg->padded_vocab_size / TP;
    d->vocab_start = ps->tp_rank * d->Vp_tp;
    d->L_local = cfg->model.num_layers / PP;
    d->layers_per_chunk = d->L_local / ps->vp_size;
}

// the parameter table and the buffers' length (the sizes mt_model_init allocates)
static void mt__model_sizes(mt_rank *r) {
    mt_model *m = &r->model;
    m->num_params = mt__carve_params(r, &m->params, NULL, 1);
    // the distributed optimizer cuts the buffers into DP equal shards of whole 64-float blocks:
    // pad them (the padding is never carved, stays 0 and is never read as a parameter)
    size_t block = 64 * (size_t)r->ps.dp_size;
    m->buffer_floats = r->cfg->parallel.use_distributed_optimizer ? (m->num_params + block - 1) / block * block
                                                                 : m->num_params;
    r->memory.params = m->buffer_floats * sizeof(float);
    r->memory.grads = m->buffer_floats * sizeof(float);
}

// parameters and gradients: one carve, two buffers. The initial values are computed on the
// host (mt__init_params, layout-independent) and uploaded to the rank's buffer; not when the run
// loads a checkpoint (mt_checkpoint_found, section 10), which overwrites every parameter: the
// buffer starts at zero then, and generation from GPT-2 small starts ~8 s (one core) sooner.
void mt_model_init(mt_rank *r) {
    mt_model *m = &r->model;
    mt__model_sizes(r);
    float *host_params = (float *)mt_calloc(m->buffer_floats, sizeof(float), "parameters (host)");
    m->params_memory = host_params;
    m->initialised = !mt_checkpoint_found(r->cfg);
    if (m->initialised) mt__init_params(r);
    m->params_memory = mt_buffer_alloc(r, m->buffer_floats, "parameters");
    mt_buffer_upload(r, m->params_memory, host_params, m->buffer_floats * sizeof(float));
    free(host_params);
    m->grads_memory = mt_buffer_alloc(r, m->buffer_floats, "gradients");
    mt__carve_params(r, &m->params, m->params_memory, 1);
    mt__carve_params(r, &m->grads, m->grads_memory, 0);
}

void mt_model_free(mt_rank *r) {
    mt_buffer_free(r->model.params_memory);
    mt_buffer_free(r->model.grads_memory);
}

// activations: num_slots micro-batches in flight at once (1 without pipelining), each slot
// carved from one float buffer, its token ids from one int buffer; the per-layer scratch; the
// host staging of ids, losses and pipeline messages
// the report of what mt_activations_init allocates: an int is a float's size, so the ids count
// with the activations, and so does the recompute scratch (what recompute saves is the difference)
static void mt__activation_report(mt_rank *r, size_t per_slot, size_t recompute_n, size_t scratch_n) {
    size_t BT = (size_t)r->dims.B * r->dims.T;
    r->memory.activations = ((per_slot + 2 * BT) * (size_t)r->acts.num_slots + recompute_n) * sizeof(float);
    r->memory.scratch = scratch_n * sizeof(float);
}
// the same sizes without allocating anything (mt_memory_plan)
static void mt__activation_sizes(mt_rank *r, int num_slots) {
    size_t kept[MT_LT_COUNT], scratch[MT_LT_COUNT];
    int *where = (int *)mt_malloc(sizeof(int) * (size_t)r->dims.L_local * MT_LT_COUNT, "recompute plan");
    mt__plan_recompute(r, where, kept, scratch);
    free(where);
    mt_activations probe;
    r->acts.num_slots = num_slots;
    size_t per_slot = mt__carve_activations(r, &probe, NULL, kept, 1);
    size_t recompute_n = mt__carve_activations(r, &probe, NULL, scratch, 0);
    mt_scratch s;
    mt__activation_report(r, per_slot, recompute_n, mt__carve_scratch(r, &s, NULL));
}

void mt_activations_init(mt_rank *r, int num_slots) {
    mt_activation_slots *acts = &r->acts;
    size_t BT = (size_t)r->dims.B * r->dims.T;
    // which layers keep which tensors (all of them, unless activation recompute says otherwise)
    size_t kept[MT_LT_COUNT], scratch[MT_LT_COUNT];
    acts->where = (int *)mt_malloc(sizeof(int) * (size_t)r->dims.L_local * MT_LT_COUNT, "recompute plan");
    mt__plan_recompute(r, acts->where, kept, scratch);
    mt_activations probe;
    size_t per_slot = mt__carve_activations(r, &probe, NULL, kept, 1);
    acts->num_slots = num_slots;
    acts->slots = (mt_activations *)mt_calloc((size_t)num_slots, sizeof(mt_activations), "activation slots");
    acts->memory = mt_buffer_alloc(r, per_slot * (size_t)num_slots, "activations");
    acts->ids_memory = mt_buffer_alloc_ints(r, 2 * BT * (size_t)num_slots, "token ids");
    for (int i = 0; i < num_slots; i++) {
        mt__carve_activations(r, &acts->slots[i], acts->memory + per_slot * (size_t)i, kept, 1);
        acts->slots[i].tokens = acts->ids_memory + 2 * BT * (size_t)i;
        acts->slots[i].targets = acts->ids_memory + 2 * BT * (size_t)i + BT;
        acts->slots[i].mb = -1;
    }
    size_t recompute_n = mt__carve_activations(r, &acts->recompute, NULL, scratch, 0);
    acts->recompute_memory = recompute_n ? mt_buffer_alloc(r, recompute_n, "recompute scratch") : NULL;
    mt__carve_activations(r, &acts->recompute, acts->recompute_memory, scratch, 0);
    size_t scratch_n = mt__carve_scratch(r, &r->scratch, NULL);
    r->scratch.memory = mt_buffer_alloc(r, scratch_n, "scratch");
    mt__carve_scratch(r, &r->scratch, r->scratch.memory);
    r->host.tokens = (int *)mt_calloc(BT, sizeof(int), "tokens");
    r->host.targets = (int *)mt_calloc(BT, sizeof(int), "targets");
    mt__activation_report(r, per_slot, recompute_n, scratch_n);
}
void mt_activations_free(mt_rank *r) {
    mt_buffer_free(r->acts.memory);
    mt_buffer_free(r->acts.ids_memory);
    if (r->acts.recompute_memory) mt_buffer_free(r->acts.recompute_memory);
    free(r->acts.where);
    free(r->acts.slots);
    mt_buffer_free(r->scratch.memory);
    free(r->host.tokens); free(r->host.targets);
}

// ---------------------------------------------------------------------------------------------
// one transformer layer, forward. x (B,T_sp,C) is the layer's input (saved, not copied).
// T_sp = T, or T/TP with --sequence-parallel: the layernorms, dropouts and residual adds work on
// my positions only, (B,T_sp,C); the TP layers gather and scatter the sequence (section 4), and
// everything between them (qkv, attention, the MLP's hidden layer) spans all B*T positions.
static void mt__layer_forward(mt_rank *r, mt_activations *a, int l, const float *x, int sample_offset) {
    const mt_config *cfg = r->cfg;
    int B = r->dims.B, T = r->dims.T, C = r->dims.C, BT = B * T, C_tp = r->dims.C_tp, F_tp = r->dims.F_tp;
    int T_sp = r->dims.T_sp;
    size_t BTC_sp = (size_t)B * T_sp * C;
    mt_params *p = &r->model.params;
    int gl = mt_local_to_global_layer(r, l);
    // this layer's parameters and saved activations (llm.c's l_ names)
    float *l_ln1w = p->ln1w + (size_t)l * C, *l_ln1b = p->ln1b + (size_t)l * C;
    float *l_qkvw = p->qkvw + (size_t)l * 3 * C_tp * C, *l_qkvb = p->qkvb + (size_t)l * 3 * C_tp;
    float *l_attprojw = p->attprojw + (size_t)l * C * C_tp, *l_attprojb = p->attprojb + (size_t)l * C;
    float *l_ln2w = p->ln2w + (size_t)l * C, *l_ln2b = p->ln2b + (size_t)l * C;
    float *l_fcw = p->fcw + (size_t)l * F_tp * C, *l_fcb = p->fcb + (size_t)l * F_tp;
    float *l_fcprojw = p->fcprojw + (size_t)l * C * F_tp, *l_fcprojb = p->fcprojb + (size_t)l * C;
    mt_layer_acts la;   // where this layer's activations live (its slot, or the recompute scratch)
    mt__layer_acts(r, a, l, &la);
    float *l_ln1 = la.ln1, *l_ln1_mean = la.ln1_mean, *l_ln1_rstd = la.ln1_rstd;
    float *l_qkv = la.qkv, *l_atty = la.atty, *l_lse = la.lse, *l_residual2 = la.residual2;
    float *l_ln2 = la.ln2, *l_ln2_mean = la.ln2_mean, *l_ln2_rstd = la.ln2_rstd;
    float *l_fch = la.fch, *l_residual3 = la.residual3;
    float *out_c = r->scratch.out_c;
    mt_dropout attn_drop = {cfg->train.seed, (uint64_t)r->state.iteration, (uint64_t)(gl + 1) * 8 + 1,
                            r->state.training ? cfg->model.attention_dropout : 0.0f, sample_offset, T, C, 0, T};
    mt_dropout hid_drop = attn_drop;   // on the residual stream: my positions
    hid_drop.p = r->state.training ? cfg->model.hidden_dropout : 0.0f;
    hid_drop.t_offset = r->dims.t_offset;
    hid_drop.T_local = T_sp;

    // attention block (ln1 and ln2 stored as the GEMMs that read them want: mt_ln_storage_dtype)
    mt_dtype ln_dtype = mt_ln_storage_dtype(r);
    mt_layernorm_forward(r, l_ln1, l_ln1_mean, l_ln1_rstd, x, l_ln1w, l_ln1b, B, T_sp, C, ln_dtype);
    mt_column_parallel_qkv_forward(r, l_qkv, l_ln1, ln_dtype, l_qkvw, l_qkvb, BT, C, 3 * C_tp);
    mt_dtype atty_dtype = mt_atty_storage_dtype(r);   // (16 bits where the projection's GEMMs read it so)
    mt_attention_forward(r, l_atty, atty_dtype, l_lse, l_qkv, B, T, C_tp, r->dims.NH_tp, &attn_drop,
                         r->ps.tp_rank * r->dims.NH_tp, cfg->model.num_attention_heads);
    // residual2 = x + the projection. Where nothing comes between the product and the residual add
    // (TP = 1: no sum over ranks; no hidden dropout on the branch) the add joins the product (the
    // GPU's GEMM epilogue: a pass over (B,T,C) less), else it joins the layernorm after dropout
    int joined = r->groups.tp.size == 1 && !mt__sequence_parallel(r) && hid_drop.p <= 0.0f;
    hid_drop.site = (uint64_t)(gl + 1) * 8 + 2;
    if (joined) {
        mt_row_parallel_linear_forward(r, l_residual2, l_atty, atty_dtype, l_attprojw, l_attprojb, x, BT, C_tp, C);
        mt_layernorm_forward(r, l_ln2, l_ln2_mean, l_ln2_rstd, l_residual2, l_ln2w, l_ln2b, B, T_sp, C, ln_dtype);
    } else {
        mt_row_parallel_linear_forward(r, out_c, l_atty, atty_dtype, l_attprojw, l_attprojb, NULL, BT, C_tp, C);
        mt_dropout_forward(r, out_c, &hid_drop, B);
        // MLP block: residual2 = x + out_c, ln2 = layernorm(residual2), as one op
        mt_residual_layernorm_forward(r, l_residual2, l_ln2, l_ln2_mean, l_ln2_rstd, x, out_c, l_ln2w, l_ln2b, B, T_sp,
                                      C, ln_dtype);
    }
    // fc, GELU, proj; residual3 = residual2 + that: joined to fc-proj's product where `joined` (as
    // above; two passes over (B,T,C) less), else its own op after dropout
    hid_drop.site = (uint64_t)(gl + 1) * 8 + 3;
    if (joined) {
        mt_parallel_mlp_forward(r, l_residual3, l_fch, l_ln2, ln_dtype, l_fcw, l_fcb, l_fcprojw, l_fcprojb, l_residual2,
                                BT, C, F_tp);
        return;
    }
    mt_parallel_mlp_forward(r, out_c, l_fch, l_ln2, ln_dtype, l_fcw, l_fcb, l_fcprojw, l_fcprojb, NULL, BT, C, F_tp);
    mt_dropout_forward(r, out_c, &hid_drop, B);
    mt_residual_forward(r, l_residual3, l_residual2, out_c, BTC_sp);
}

// a residual branch's output gradient: dropout's backward of dresidual (the residual itself passes
// dresidual through unchanged), in the scratch; without hidden dropout, dresidual itself: the
// branch's backward only reads it, and the layernorm's backward that adds to dresidual comes after
// the branch is done, so no copy is needed (a pass over (B,T,C) saved, twice a layer)
static const float *mt__branch_grad(mt_rank *r, float *scratch, const float *dresidual, const mt_dropout *d, int B,
                                    size_t n) {
    if (d->p <= 0.0f) return dresidual;
    mt_buffer_copy(r, scratch, dresidual, n);
    mt_dropout_backward(r, scratch, d, B);
    return scratch;
}

// one transformer layer, backward. On entry scratch.dresidual holds dL/d(residual3);
// on exit it holds dL/dx. x is the layer's forward input. (B,T_sp,C) as in the forward.
static void mt__layer_backward(mt_rank *r, mt_activations *a, int l, const float *x, int sample_offset) {
    const mt_config *cfg = r->cfg;
    int B = r->dims.B, T = r->dims.T, C = r->dims.C, BT = B * T, C_tp = r->dims.C_tp, F_tp = r->dims.F_tp;
    int T_sp = r->dims.T_sp;
    mt_params *p = &r->model.params, *g = &r->model.grads;
    mt_scratch *s = &r->scratch;
    int gl = mt_local_to_global_layer(r, l);
    float *l_ln1w = p->ln1w + (size_t)l * C;
    float *l_qkvw = p->qkvw + (size_t)l * 3 * C_tp * C;
    float *l_attprojw = p->attprojw + (size_t)l * C * C_tp;
    float *l_ln2w = p->ln2w + (size_t)l * C;
    float *l_fcw = p->fcw + (size_t)l * F_tp * C;
    float *l_fcprojw = p->fcprojw + (size_t)l * C * F_tp;
    float *dl_ln1w = g->ln1w + (size_t)l * C, *dl_ln1b = g->ln1b + (size_t)l * C;
    float *dl_qkvw = g->qkvw + (size_t)l * 3 * C_tp * C, *dl_qkvb = g->qkvb + (size_t)l * 3 * C_tp;
    float *dl_attprojw = g->attprojw + (size_t)l * C * C_tp, *dl_attprojb = g->attprojb + (size_t)l * C;
    float *dl_ln2w = g->ln2w + (size_t)l * C, *dl_ln2b = g->ln2b + (size_t)l * C;
    float *dl_fcw = g->fcw + (size_t)l * F_tp * C, *dl_fcb = g->fcb + (size_t)l * F_tp;
    float *dl_fcprojw = g->fcprojw + (size_t)l * C * F_tp, *dl_fcprojb = g->fcprojb + (size_t)l * C;
    mt_layer_acts la;
    mt__layer_acts(r, a, l, &la);
    float *l_ln1 = la.ln1, *l_ln1_mean = la.ln1_mean, *l_ln1_rstd = la.ln1_rstd;
    float *l_qkv = la.qkv, *l_atty = la.atty, *l_lse = la.lse, *l_residual2 = la.residual2;
    float *l_ln2 = la.ln2, *l_ln2_mean = la.ln2_mean, *l_ln2_rstd = la.ln2_rstd;
    float *l_fch = la.fch;
    mt_dropout attn_drop = {cfg->train.seed, (uint64_t)r->state.iteration, (uint64_t)(gl + 1) * 8 + 1,
                            cfg->model.attention_dropout, sample_offset, T, C, 0, T};
    mt_dropout hid_drop = attn_drop;
    hid_drop.p = cfg->model.hidden_dropout;
    hid_drop.t_offset = r->dims.t_offset;
    hid_drop.T_local = T_sp;
    size_t BTC_sp = (size_t)B * T_sp * C;

    // MLP block. forward was: residual3 = residual2 + dropout(fcproj(gelu(fc(ln2(residual2)))))
    // the residual passes dresidual through unchanged; the branch gets dropout's backward of it
    hid_drop.site = (uint64_t)(gl + 1) * 8 + 3;
    const float *dbranch = mt__branch_grad(r, s->out_c, s->dresidual, &hid_drop, B, BTC_sp);
    // fc-proj's backward on through the GELU: dfch = dL/d fch (stored as fch is: mt_fch_storage_dtype)
    mt_row_parallel_linear_gelu_backward(r, s->dfch, dl_fcprojw, dl_fcprojb, dbranch, l_fcprojw, l_fch, BT, F_tp, C);
    mt_dtype ln_dtype = mt_ln_storage_dtype(r);   // (how the forward stored ln1 and ln2)
    mt_column_parallel_linear_backward(r, s->dln, dl_fcw, dl_fcb, s->dfch, mt_fch_storage_dtype(r), l_ln2, ln_dtype,
                                       l_fcw, BT, C, F_tp);
    mt_layernorm_backward(r, s->dresidual, dl_ln2w, dl_ln2b, s->dln, l_residual2, l_ln2w, l_ln2_mean, l_ln2_rstd, B,
                          T_sp, C);
    // attention block. forward was: residual2 = x + dropout(attproj(attention(qkv(ln1(x)))))
    mt_dtype atty_dtype = mt_atty_storage_dtype(r);   // (16 bits where the projection's GEMMs read it so)
    if (cfg->recompute == MT_RECOMPUTE_SELECTIVE)   // selective recompute: the attention core again
        mt_attention_forward(r, l_atty, atty_dtype, l_lse, l_qkv, B, T, C_tp, r->dims.NH_tp, &attn_drop,
                             r->ps.tp_rank * r->dims.NH_tp, cfg->model.num_attention_heads);
    hid_drop.site = (uint64_t)(gl + 1) * 8 + 2;
    dbranch = mt__branch_grad(r, s->out_c, s->dresidual, &hid_drop, B, BTC_sp);
    mt_dtype datty_dtype = mt_datty_storage_dtype(r);   // (16 bits where the attention reads it so)
    mt_row_parallel_linear_backward(r, s->datty, datty_dtype, dl_attprojw, dl_attprojb, dbranch, l_atty, atty_dtype,
                                    l_attprojw, BT, C_tp, C);
    mt_dtype dqkv_dtype = mt_dqkv_storage_dtype(r);   // (16 bits where the qkv GEMM reads it so)
    mt_attention_backward(r, s->dqkv, dqkv_dtype, s->datty, datty_dtype, l_qkv, l_atty, atty_dtype, l_lse, B, T, C_tp,
                          r->dims.NH_tp, &attn_drop, r->ps.tp_rank * r->dims.NH_tp, cfg->model.num_attention_heads);
    mt_column_parallel_linear_backward(r, s->dln, dl_qkvw, dl_qkvb, s->dqkv, dqkv_dtype, l_ln1, ln_dtype, l_qkvw, BT, C,
                                       3 * C_tp);
    mt_layernorm_backward(r, s->dresidual, dl_ln1w, dl_ln1b, s->dln, x, l_ln1w, l_ln1_mean, l_ln1_rstd, B, T_sp, C);
}

// the embedding (first virtual stage) and the head (last virtual stage)
static int mt__is_first_virtual(const mt_rank *r, int chunk) { return r->ps.is_first_stage && chunk == 0; }
static int mt__is_last_virtual(const mt_rank *r,
                               int chunk) { return r->ps.is_last_stage && chunk == r->ps.vp_size - 1; }

static void mt__embedding_forward(mt_rank *r, mt_activations *a) {
    const mt_config *cfg = r->cfg;
    mt_vocab_parallel_embedding_forward(r, a->input, a->tokens, r->model.params.wte, r->model.params.wpe);
    mt_dropout d = {cfg->train.seed, (uint64_t)r->state.iteration, 0,
                    r->state.training ? cfg->model.hidden_dropout : 0.0f,
                    a->sample_offset, r->dims.T, r->dims.C, r->dims.t_offset, r->dims.T_sp};
    mt_dropout_forward(r, a->input, &d, r->dims.B);
}

static void mt__embedding_backward(mt_rank *r, mt_activations *a) {
    const mt_config *cfg = r->cfg;
    mt_dropout d = {cfg->train.seed, (uint64_t)r->state.iteration, 0, cfg->model.hidden_dropout, a->sample_offset,
                    r->dims.T, r->dims.C, r->dims.t_offset, r->dims.T_sp};
    mt_dropout_backward(r, r->scratch.dresidual, &d, r->dims.B);
    mt_vocab_parallel_embedding_backward(r, r->model.grads.wte, r->model.grads.wpe, r->scratch.dresidual, a->tokens);
}

// head: lnf = ln_f(x); logits = lnf @ wte^T (column-parallel over the vocabulary); loss.
// dloss is d(global batch loss)/d(a position's loss) = 1 / (B*T * micro-batches * DP), times the
// loss scale (fp16, section 6: the backward runs on scale x loss; 1 otherwise).
// --sequence-parallel: x and lnf are my positions (B,T_sp,C); the column-parallel LM head gathers
// the sequence (section 4), and the logits span all B*T positions, as without SP.
static void mt__head_forward(mt_rank *r, mt_activations *a, const float *x, int want_grad) {
    int B = r->dims.B, T = r->dims.T, C = r->dims.C, BT = B * T;
    mt_layernorm_forward(r, a->lnf, a->lnf_mean, a->lnf_rstd, x, r->model.params.lnfw, r->model.params.lnfb, B,
                         r->dims.T_sp, C, MT_DTYPE_FP32);
    mt_lm_head_parallel_forward(r, a->logits, a->lnf, r->model.params.wte, BT, C, r->dims.Vp_tp);
    float dloss = 1.0f / ((float)BT * (float)r->cfg->num_microbatches * (float)r->ps.dp_size);
    if (want_grad) dloss *= r->state.loss_scale;
    mt_vocab_parallel_cross_entropy_forward(r, a->losses, a->logits, a->targets, dloss, want_grad);
    mt_loss_mean_add(r, (double *)r->scratch.loss_acc, a->losses, BT);   // read at the step's end: no wait here
}

static void mt__head_backward(mt_rank *r, mt_activations *a, const float *x) {
    int B = r->dims.B, T = r->dims.T, C = r->dims.C, BT = B * T;
    mt_scratch *s = &r->scratch;
    // logits = lnf @ wte_r^T: dlnf = sum_r dlogits_r @ wte_r (f's backward), dwte_r += dlogits_r^T lnf
    mt_lm_head_parallel_backward(r, s->dln, r->model.grads.wte, a->logits, a->lnf, r->model.params.wte, BT, C,
                                 r->dims.Vp_tp);
    mt_buffer_zero(r, s->dresidual, (size_t)B * r->dims.T_sp * C);
    mt_layernorm_backward(r, s->dresidual, r->model.grads.lnfw, r->model.grads.lnfb, s->dln, x, r->model.params.lnfw,
                          a->lnf_mean, a->lnf_rstd, B, r->dims.T_sp, C);
}

// the input and output of chunk c's layers
static float *mt__chunk_input(const mt_rank *r, mt_activations *a, int chunk) {
    return a->input + (size_t)chunk * r->dims.B * r->dims.T_sp * r->dims.C;
}

static float *mt__layer_input(const mt_rank *r, mt_activations *a, int l) {
    int lpc = r->dims.layers_per_chunk;
    if (l % lpc == 0) return mt__chunk_input(r, a, l / lpc);
    mt_layer_acts prev;
    mt__layer_acts(r, a, l - 1, &prev);
    return prev.residual3;
}
static float *mt__chunk_output(const mt_rank *r, mt_activations *a, int chunk) {
    mt_layer_acts last;
    mt__layer_acts(r, a, (chunk + 1) * r->dims.layers_per_chunk - 1, &last);
    return last.residual3;   // always kept: the end of a recompute group if in one
}

// forward of one model chunk for one micro-batch; its input is already in place
static void mt__forward_chunk(mt_rank *r, mt_activations *a, int chunk) {
    if (mt__is_first_virtual(r, chunk)) mt__embedding_forward(r, a);
    for (int j = 0; j < r->dims.layers_per_chunk; j++) {
        int l = chunk * r->dims.layers_per_chunk + j;
        mt__layer_forward(r, a, l, mt__layer_input(r, a, l), a->sample_offset);
    }
    if (mt__is_last_virtual(r, chunk)) mt__head_forward(r, a, mt__chunk_output(r, a, chunk), r->state.training);
}

// backward of one model chunk; scratch.dresidual holds dL/d(chunk output) unless this is the
// last virtual stage (then the head starts it). On exit it holds dL/d(chunk input).
static void mt__backward_chunk(mt_rank *r, mt_activations *a, int chunk) {
    if (mt__is_last_virtual(r, chunk)) mt__head_backward(r, a, mt__chunk_output(r, a, chunk));
    for (int j = r->dims.layers_per_chunk - 1; j >= 0; j--) {
        int l = chunk * r->dims.layers_per_chunk + j, first, last;
        // full recompute: at the last layer of a group, run the group forward again from its
        // saved input, so that its activations are in the scratch for the backwards below
        if (mt__recompute_group(r, l, &first, &last) && l == last)
            for (int g = first; g <= last; g++) mt__layer_forward(r, a, g, mt__layer_input(r, a, g), a->sample_offset);
        mt__layer_backward(r, a, l, mt__layer_input(r, a, l), a->sample_offset);
        mt_grad_bucket_ready(r, l, a->mb);   // --overlap-grad-reduce: its bucket's reduction may start (§7)
    }
    if (mt__is_first_virtual(r, chunk)) mt__embedding_backward(r, a);
}

// =============================================================================================
// 6. OPTIMIZER, CLIPPING, LEARNING RATE
// =============================================================================================
// Mirrors megatron/core/optimizer (clip_grads.py, cpu_offloading/hybrid_optimizer.py) and
// optimizer_param_scheduler.py.

// Megatron's OptimizerParamScheduler.get_lr, with steps counted in iterations:
//   warm-up:  lr = max_lr * step / warmup_steps                     for step <= warmup_steps
//   then      ratio = (step - warmup) / (decay_steps - warmup)
//             constant: max_lr;  linear: min + (max - min)(1 - ratio);
//             cosine:   min + (max - min) * 0.5 (cos(pi * ratio) + 1)
//   after decay_steps: min_lr.
// Iteration i (1-based) trains with lr(i - 1); Megatron logs the value after its scheduler
// stepped, lr(i), and so do we.
float mt_learning_rate(const mt_config *cfg, int step) {
    double max_lr = cfg->train.lr, min_lr = cfg->train.min_lr;
    double warmup = cfg->lr_warmup_steps;
    int decay = cfg->lr_decay_steps;
    if (warmup > 0 && step <= warmup) return (float)(max_lr * (double)step / warmup);
    if (cfg->lr_decay == MT_LR_CONSTANT) return (float)max_lr;
    if (step > decay) return (float)min_lr;
    double ratio = ((double)step - warmup) / ((double)decay - warmup);
    double coeff = cfg->lr_decay == MT_LR_LINEAR ? 1.0 - ratio : 0.5 * (cos(3.141592653589793 * ratio) + 1.0);
    return (float)(min_lr + coeff * (max_lr - min_lr));
}

// the part [*a, *b) of tensor s inside the shard [lo, hi) of the buffer (empty: *a >= *b); with
// the distributed optimizer a tensor may straddle two shards
static void mt__shard_part(const mt_param_spec *s, size_t lo, size_t hi, size_t *a, size_t *b) {
    size_t end = s->offset + mt__spec_numel(s);
    *a = s->offset > lo ? s->offset : lo;
    *b = end < hi ? end : hi;
}

// The global gradient norm, counting every parameter of the model exactly once:
//   - TP-replicated tensors (layernorms, row-parallel biases, wpe) only on tp_rank 0,
//   - the LM head's copy of wte on the last stage (PP > 1) not at all (the first stage's counts),
// then summed over the model-parallel group (all TP and PP ranks of my replica). DP replicas
// hold the same gradients after the all-reduce, so they all compute the same norm.
// The pieces of the gradient buffer that count (returns how many; start, count: each piece's).
static int mt__grad_pieces(const mt_rank *r, size_t *start, size_t *count) {
    // the shard this rank holds final gradients for: all of it, or its DP shard (distributed)
    size_t lo = r->optim.shard_start, hi = r->optim.shard_start + r->optim.shard_size;
    int parts = 0;
    for (int i = 0; i < MT_NUM_PARAM_TENSORS; i++) {
        const mt_param_spec *s = &r->model.specs[i];
        if (!s->present) continue;
        if (s->tp_replicated && r->ps.tp_rank != 0) continue;
        if (s->tied_copy) continue;
        size_t a, b;
        mt__shard_part(s, lo, hi, &a, &b);
        if (a >= b) continue;
        if (parts > 0 && start[parts - 1] + count[parts - 1] == a) count[parts - 1] += b - a;   // contiguous: one piece
        else { start[parts] = a; count[parts] = b - a; parts++; }
    }
    return parts;
}
static double mt__grad_norm(mt_rank *r) {
    size_t start[MT_NUM_PARAM_TENSORS], count[MT_NUM_PARAM_TENSORS];
    int parts = mt__grad_pieces(r, start, count);
    // the pieces' sums of squares added in order: one reduction on the device, one wait (at TP = PP
    // = 1 the tensors lie end to end in the buffer: one piece, one pass, two kernels)
    double sumsq = mt_sum_squares_parts(r, r->model.grads_memory, start, count, parts);
    if (r->optim.distributed && r->groups.dp.size > 1) mt_all_reduce_double(&r->groups.dp, &sumsq, 1, MT_SUM);
    if (r->groups.mp.size > 1) mt_all_reduce_double(&r->groups.mp, &sumsq, 1, MT_SUM);
    return sqrt(sumsq);
}

// --log-num-zeros-in-grad (Megatron's count_zeros_fp32): the gradients that are exactly 0, each
// parameter counted once, over the same pieces and groups as the norm
static double mt__grad_num_zeros(mt_rank *r) {
    size_t start[MT_NUM_PARAM_TENSORS], count[MT_NUM_PARAM_TENSORS];
    int parts = mt__grad_pieces(r, start, count);
    double zeros = mt_count_zeros_parts(r, r->model.grads_memory, start, count, parts);
    if (r->optim.distributed && r->groups.dp.size > 1) mt_all_reduce_double(&r->groups.dp, &zeros, 1, MT_SUM);
    if (r->groups.mp.size > 1) mt_all_reduce_double(&r->groups.mp, &zeros, 1, MT_SUM);
    return zeros;
}

// The parameters' L2 norm (--log-params-norm, Megatron's calc_params_l2_norm), each parameter
// counted once as the gradient norm counts them. Every rank holds its parameters whole (the
// distributed optimizer shards only AdamW's state), so the sum is over the model-parallel group
// alone; DP replicas compute the same norm. A collective over that group: every rank calls it.
double mt_params_norm(mt_rank *r) {
    size_t start[MT_NUM_PARAM_TENSORS], count[MT_NUM_PARAM_TENSORS];
    int parts = 0;
    for (int i = 0; i < MT_NUM_PARAM_TENSORS; i++) {
        const mt_param_spec *s = &r->model.specs[i];
        if (!s->present || (s->tp_replicated && r->ps.tp_rank != 0) || s->tied_copy) continue;
        size_t a = s->offset, n = mt__spec_numel(s);
        if (parts > 0 && start[parts - 1] + count[parts - 1] == a) count[parts - 1] += n;
        else { start[parts] = a; count[parts] = n; parts++; }
    }
    double sumsq = mt_sum_squares_parts(r, r->model.params_memory, start, count, parts);
    if (r->groups.mp.size > 1) mt_all_reduce_double(&r->groups.mp, &sumsq, 1, MT_SUM);
    return sqrt(sumsq);
}

// ---------------------------------------------------------------------------------------------
// LOSS SCALING (--fp16), as Megatron's grad_scaler.py and MixedPrecisionOptimizer.step
// ---------------------------------------------------------------------------------------------
// fp16 holds nothing below 2^-24 and nothing above 65504 (section 3, "reduced precision").
// Gradients are small, so in fp16 many would vanish. The fix: scale the loss by S before the
// backward, so every gradient is S times larger (S * dL/dx) and lands in fp16's range, then
// divide the fp32 gradients by S before clipping and AdamW:
//   backward on  S * loss     ->  grads = S * g    (formed from fp16 operands)
//   unscale      grads *= 1/S ->  g                (exact for S a power of 2)
//   check        any inf/nan in S * g? then skip the step (the parameters do not move) and lower S
// If S is too large, S * g overflows to inf somewhere; if too small, gradients underflow to 0
// unnoticed. Dynamic scaling finds the largest S that does not overflow, Megatron's way:
//   inf/nan:  growth_tracker = 0; hysteresis_tracker -= 1;
//             if hysteresis_tracker <= 0:  S = max(S / 2, min_scale)
//   clean:    growth_tracker += 1;
//             if growth_tracker == window: growth_tracker = 0; hysteresis_tracker = hysteresis; S *= 2
// So it starts at 2^32, halves on (nearly) every overflowing step until the gradients fit, and
// tries twice the scale after every --loss-scale-window clean steps. The hysteresis tracker is
// refilled only when the scale grows: after the first --hysteresis - 1 tolerated overflows, every
// overflow halves. A static --loss-scale S never changes, but its overflowing steps are skipped too.
void mt_grad_scaler_init(mt_grad_scaler *s, const mt_config *cfg) {
    const mt_train_config *t = &cfg->train;
    memset(s, 0, sizeof *s);
    s->kind = cfg->compute_dtype != MT_DTYPE_FP16 ? MT_SCALER_NONE
            : t->loss_scale > 0.0f               ? MT_SCALER_CONSTANT
                                                 : MT_SCALER_DYNAMIC;
    s->scale = s->kind == MT_SCALER_NONE ? 1.0f : s->kind == MT_SCALER_CONSTANT ? t->loss_scale : t->initial_loss_scale;
    s->min_scale = t->min_loss_scale;
    s->growth_interval = t->loss_scale_window;
    s->hysteresis = t->hysteresis;
    s->growth_tracker = 0;
    s->hysteresis_tracker = t->hysteresis;
}

void mt_grad_scaler_update(mt_grad_scaler *s, int found_inf) {
    if (s->kind != MT_SCALER_DYNAMIC) return;
    if (found_inf) {
        s->growth_tracker = 0;
        s->hysteresis_tracker -= 1;
        if (s->hysteresis_tracker <= 0) {   // out of hysteresis: scale down (in fp32, as Megatron's tensor)
            float lower = s->scale * 0.5f;
            s->scale = lower > s->min_scale ? lower : s->min_scale;
        }
    } else {
        s->growth_tracker += 1;
        if (s->growth_tracker == s->growth_interval) {   // a window of clean steps: try twice the scale
            s->growth_tracker = 0;
            s->hysteresis_tracker = s->hysteresis;
            s->scale = s->scale * 2.0f;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// OPTIMIZER OFFLOAD (--optimizer-cpu-offload): ZeRO-Offload (Ren et al. 2021); Megatron's
// HybridDeviceOptimizer with --optimizer-offload-fraction 1.0
// ---------------------------------------------------------------------------------------------
// AdamW's state is 8 bytes per parameter of the shard (m and v), twice the parameters' own 4.
// Offloaded, the device keeps only the parameters and the gradients; the shard's fp32 master
// copy, m, v and a landing place for its gradients live in pinned host memory (16 bytes per
// parameter of the shard), and the update runs on host threads:
//
//   device (the rank's GPU)                          host (pinned, this rank's shard)
//   backward; DP reduction; unscale and check
//   (fp16); norm: all as without offload
//   grads[shard]   ------ down, once per step ---->  host_grads
//                                                    AdamW (and the clip) on T host threads: master_params,
//                                                    m, v += ... (mt_adamw_cpu; thread k takes
//                                                    the k-th of T pieces of the shard)
//   params[shard]  <----- up, once per step -------  master_params
//   all-gather of the shards over DP (--use-distributed-optimizer), as without offload
//
// The same bits: the update is elementwise, so the pieces only decide which thread computes an
// element, never how; on the CPU build the device's update (mt_adamw) is that same mt_adamw_cpu,
// so training with and without offload is identical bit for bit (tests/test_offload.c). On the
// GPU build the device's AdamW kernel may round differently from the host's loop (a fused
// multiply-add), the difference of one float rounding per step.
// The master copy is exact: the parameters are fp32 on the device too, so params[shard] and
// master_params hold the same values after every step (bf16 / fp16 are compute types only).

typedef struct {                  // one host update: AdamW over the tensors' parts of the shard
    float *param, *m, *v;         // (n) the shard's host copies
    const float *grad;            // (n)
    float grad_scale;             // the clip's factor (mt_adamw_cpu)
    size_t n;
    int num_parts;
    size_t part[MT_NUM_PARAM_TENSORS][2];   // [start, end) of each tensor's part, within the shard
    float weight_decay[MT_NUM_PARAM_TENSORS];
    float lr, beta1, beta2, eps;
    int step;
} mt__host_adamw;

// thread `index` of `count`: the elements [n*index/count, n*(index+1)/count) of the shard, tensor
// part by tensor part (each with its own weight decay)
static void mt__host_adamw_piece(void *arg, int index, int count) {   // an mt__host_job
    const mt__host_adamw *job = (const mt__host_adamw *)arg;
    size_t lo = job->n * (size_t)index / (size_t)count, hi = job->n * (size_t)(index + 1) / (size_t)count;
    for (int k = 0; k < job->num_parts; k++) {
        size_t a = job->part[k][0] > lo ? job->part[k][0] : lo;
        size_t b = job->part[k][1] < hi ? job->part[k][1] : hi;
        if (a < b) mt_adamw_cpu(job->param + a, job->m + a, job->v + a, job->grad + a, job->grad_scale, b - a, job->lr,
                                job->beta1, job->beta2, job->eps, job->weight_decay[k], job->step);
    }
}

// how many threads: --optimizer-offload-threads, or the host's cores shared by the ranks on this
// node, 1 to 8 (a memory-bound loop: more threads than memory channels add nothing)
static int mt__host_threads_count(const mt_rank *r) {
    int want = r->cfg->train.optimizer_offload_threads;
    if (want > 0) return want;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int ranks = r->ps.node_size > 0 ? r->ps.node_size : 1;
    long n = cores > 0 ? cores / ranks : 1;
    return n < 1 ? 1 : n > 8 ? 8 : (int)n;
}

// AdamW's state: two moments per parameter of this rank's shard. Without the distributed
// optimizer the shard is the whole buffer; with it (Megatron's --use-distributed-optimizer, ZeRO
// stage 1, Rajbhandari et al. 2020) DP rank d owns the d-th of DP equal shards: its gradients
// arrive by reduce-scatter, it alone updates them, and the new parameters go back to every DP
// rank by all-gather. Each DP rank keeps 1/DP of the optimizer state. With
// --optimizer-cpu-offload the state is on the host (above): nothing of it on the device.
static void mt__optimizer_sizes(mt_rank *r) {
    mt_optimizer *o = &r->optim;
    o->distributed = r->cfg->parallel.use_distributed_optimizer;
    o->offload = r->cfg->train.optimizer_cpu_offload;
    o->shard_size = o->distributed ? r->model.buffer_floats / (size_t)r->ps.dp_size : r->model.num_params;
    o->shard_start = o->distributed ? o->shard_size * (size_t)r->ps.dp_rank : 0;
    r->memory.optimizer = o->offload ? 0 : 2 * o->shard_size * sizeof(float);
    r->memory.host_optimizer = o->offload ? 4 * o->shard_size * sizeof(float) : 0;   // master, m, v, gradients
}
void mt_optimizer_init(mt_rank *r) {
    mt_optimizer *o = &r->optim;
    mt__optimizer_sizes(r);
    if (o->offload) {
        o->m_memory = mt_buffer_alloc_host(r, o->shard_size, "AdamW m (host)");
        o->v_memory = mt_buffer_alloc_host(r, o->shard_size, "AdamW v (host)");
        o->host_grads = mt_buffer_alloc_host(r, o->shard_size, "gradients (host)");
        o->master_params = mt_buffer_alloc_host(r, o->shard_size, "master parameters (host)");
        // the master copy starts as the parameters (mt_model_init uploaded them; a checkpoint
        // load refreshes both)
        mt_buffer_download(r, o->master_params, r->model.params_memory + o->shard_start,
                           o->shard_size * sizeof(float));
        o->num_host_threads = mt__host_threads_count(r);
        o->host_threads = mt__host_pool_create(o->num_host_threads, "adamw", r->ps.rank,
                                               "--optimizer-offload-threads 1 runs the update on the rank's own thread");
    } else {
        o->m_memory = mt_buffer_alloc(r, o->shard_size, "AdamW m");
        o->v_memory = mt_buffer_alloc(r, o->shard_size, "AdamW v");
    }
    o->step = 0;
    o->skipped = 0;
    mt_grad_scaler_init(&o->scaler, r->cfg);
}
void mt_optimizer_free(mt_rank *r) {
    mt_optimizer *o = &r->optim;
    if (o->offload) {
        mt__host_pool_free(o->host_threads);
        mt_buffer_free_host(o->m_memory);
        mt_buffer_free_host(o->v_memory);
        mt_buffer_free_host(o->host_grads);
        mt_buffer_free_host(o->master_params);
    } else {
        mt_buffer_free(o->m_memory);
        mt_buffer_free(o->v_memory);
    }
    o->host_threads = NULL;
    o->m_memory = o->v_memory = o->host_grads = o->master_params = NULL;
}

// the offloaded update: gradients down, AdamW on the host threads, parameters up
static void mt__optimizer_step_offloaded(mt_rank *r, float lr, float grad_scale) {
    const mt_config *cfg = r->cfg;
    mt_optimizer *o = &r->optim;
    size_t lo = o->shard_start, hi = o->shard_start + o->shard_size;
    mt__host_adamw job;
    memset(&job, 0, sizeof job);
    job.param = o->master_params;
    job.m = o->m_memory;
    job.v = o->v_memory;
    job.grad = o->host_grads;
    job.grad_scale = grad_scale;
    job.n = o->shard_size;
    job.lr = lr;
    job.beta1 = cfg->train.adam_beta1;
    job.beta2 = cfg->train.adam_beta2;
    job.eps = cfg->train.adam_eps;
    job.step = o->step;
    for (int i = 0; i < MT_NUM_PARAM_TENSORS; i++) {   // the same parts as the device's loop below
        const mt_param_spec *s = &r->model.specs[i];
        if (!s->present) continue;
        size_t a, b;
        mt__shard_part(s, lo, hi, &a, &b);
        if (a >= b) continue;
        job.part[job.num_parts][0] = a - lo;
        job.part[job.num_parts][1] = b - lo;
        job.weight_decay[job.num_parts++] = s->no_decay ? 0.0f : cfg->train.weight_decay;
    }
    mt_buffer_download(r, o->host_grads, r->model.grads_memory + lo, o->shard_size * sizeof(float));
    mt__host_pool_run((mt__host_pool *)o->host_threads, mt__host_adamw_piece, &job);
    mt_buffer_upload(r, r->model.params_memory + lo, o->master_params, o->shard_size * sizeof(float));
}

// One optimizer step on synchronised gradients (Megatron's optimizer.step()):
//   0. fp16 (loss scaling): unscale the gradients and look for inf/nan, in one pass over my
//      shard (mt_unscale_check, one device reduction); the flag is all-reduced (MAX) over the
//      ranks that hold the rest of this replica's gradients, so all agree; then the scaler
//      updates, and a step with inf/nan is skipped (Megatron's _unscale_main_grads_and_check_for_nan)
//   1. the global gradient norm; inf/nan anywhere: skip the update, as Megatron does
//   2. clip by it (clip_grad_norm_fp32): grads *= clip / (norm + 1e-6) when that is below 1, the
//      product taken by AdamW as it reads each gradient (its grad_scale: one pass less)
//   3. AdamW, tensor by tensor, with weight decay only where Megatron applies it (the
//      elementwise update is the op mt_adamw, section 3), at the learning rate of the steps taken
//      (a skipped step does not advance the schedule: Megatron steps its scheduler only on success);
//      with --optimizer-cpu-offload on the host instead (mt__optimizer_step_offloaded, above)
// Returns the norm before clipping; *skipped tells whether the parameters moved.
double mt_optimizer_step(mt_rank *r, int iteration, int *skipped) {
    const mt_config *cfg = r->cfg;
    mt_optimizer *o = &r->optim;
    if (o->scaler.kind != MT_SCALER_NONE) {
        float inv_scale = (float)(1.0 / (double)o->scaler.scale);   // Megatron: scale.double().reciprocal().float()
        double found = mt_unscale_check(r, r->model.grads_memory + o->shard_start, inv_scale, o->shard_size);
        if (o->distributed && r->groups.dp.size > 1) mt_all_reduce_double(&r->groups.dp, &found, 1, MT_MAX);
        if (r->groups.mp.size > 1) mt_all_reduce_double(&r->groups.mp, &found, 1, MT_MAX);
        mt_grad_scaler_update(&o->scaler, found > 0);
        if (found > 0) {
            *skipped = 1;
            o->skipped++;
            o->num_zeros = NAN;
            return NAN;   // no norm: Megatron computes none for a skipped step
        }
    }
    o->num_zeros = NAN;
    double norm = mt__grad_norm(r);
    *skipped = !isfinite(norm);
    if (*skipped) {
        o->skipped++;
        return norm;
    }
    if (cfg->train.log_num_zeros_in_grad) o->num_zeros = mt__grad_num_zeros(r);   // (clipping keeps a 0 a 0)
    float grad_scale = 1.0f;   // the clip, applied by AdamW as it reads each gradient (mt_adamw_cpu)
    if (cfg->train.clip_grad > 0) {
        double coeff = cfg->train.clip_grad / (norm + 1e-6);
        if (coeff < 1.0) grad_scale = (float)coeff;
    }
    o->step++;
    float lr = mt_learning_rate(cfg, iteration - 1 - o->skipped);
    size_t lo = o->shard_start, hi = o->shard_start + o->shard_size;
    if (o->offload) {
        mt__optimizer_step_offloaded(r, lr, grad_scale);   // on the host (above)
    } else {
        // each tensor's part inside the shard (a tensor may straddle two shards); neighbours in the
        // buffer with the same weight decay go in one call (the update is elementwise: the same bits)
        size_t start[MT_NUM_PARAM_TENSORS], count[MT_NUM_PARAM_TENSORS];
        float decay[MT_NUM_PARAM_TENSORS];
        int runs = 0;
        for (int i = 0; i < MT_NUM_PARAM_TENSORS; i++) {
            const mt_param_spec *s = &r->model.specs[i];
            if (!s->present) continue;
            size_t a, b;
            mt__shard_part(s, lo, hi, &a, &b);
            if (a >= b) continue;
            float wd = s->no_decay ? 0.0f : cfg->train.weight_decay;
            if (runs > 0 && start[runs - 1] + count[runs - 1] == a && decay[runs - 1] == wd) count[runs - 1] += b - a;
            else { start[runs] = a; count[runs] = b - a; decay[runs] = wd; runs++; }
        }
        for (int k = 0; k < runs; k++)
            mt_adamw(r, r->model.params_memory + start[k], o->m_memory + (start[k] - lo), o->v_memory + (start[k] - lo),
                     r->model.grads_memory + start[k], grad_scale, count[k], lr, cfg->train.adam_beta1,
                     cfg->train.adam_beta2, cfg->train.adam_eps, decay[k], o->step);
    }
    // distributed: every DP rank gets the new parameters of every shard
    if (o->distributed && r->groups.dp.size > 1)
        mt_all_gather(&r->groups.dp, r->model.params_memory + lo, r->model.params_memory, o->shard_size);
    return norm;
}

// =============================================================================================
// 7. DATA PARALLEL
// =============================================================================================
// Mirrors megatron/core/distributed/distributed_data_parallel.py (without overlap): after the
// last micro-batch's backward, the gradient buffer is all-reduced over the DP group bucket by
// bucket (--ddp-bucket-size elements each). The loss gradient was already scaled by 1/DP, so
// the sum is the mean over replicas. Then the embedding group (first and last stage, PP > 1)
// sums its two copies of dwte, so the tied weights stay tied (Megatron's
// _allreduce_embedding_grads). With the distributed optimizer (section 6) the DP step is a
// reduce-scatter instead: each DP rank needs only the gradients of the shard it updates.
// With --sequence-parallel the TP group goes first (see below).

// --sequence-parallel: the layernorms ran on my positions only, so each TP rank's gradient of
// their weight and bias is a partial sum over T/TP positions: dw = sum_r dw_r, all-reduced over
// TP (Megatron's finalize_model_grads, for the parameters marked sequence_parallel). Adjacent
// tensors go in one call (ln1w|ln1b, ln2w|ln2b, lnfw|lnfb are neighbours in the carve). It runs
// before the DP reduction, on the whole buffer: both are sums, so the order does not change the
// result, and the distributed optimizer's DP shards may cut through these tensors.
static void mt__sequence_parallel_grads_all_reduce(mt_rank *r) {
    if (!r->cfg->parallel.sequence_parallel || r->ps.tp_size < 2) return;
    size_t run_start = 0, run_end = 0;   // the run of adjacent sequence-parallel tensors being gathered
    for (int i = 0; i <= MT_NUM_PARAM_TENSORS; i++) {
        const mt_param_spec *s = i < MT_NUM_PARAM_TENSORS ? &r->model.specs[i] : NULL;
        int take = s && s->present && s->sequence_parallel;
        if (take && run_end > run_start && s->offset == run_end) { run_end += mt__spec_numel(s); continue; }
        if (run_end > run_start) mt_all_reduce(&r->groups.tp, r->model.grads_memory + run_start, run_end - run_start,
                                               MT_SUM);
        run_start = run_end = 0;
        if (take) { run_start = s->offset; run_end = s->offset + mt__spec_numel(s); }
    }
}

// the gradients summed over DP, bucket by bucket (--ddp-bucket-size elements per all-reduce)
static void mt__dp_all_reduce_buckets(mt_rank *r) {
    long bucket_flag = r->cfg->parallel.ddp_bucket_size;
    size_t bucket = bucket_flag > 0 ? (size_t)bucket_flag : r->model.num_params;
    for (size_t off = 0; off < r->model.num_params; off += bucket) {
        size_t n = r->model.num_params - off < bucket ? r->model.num_params - off : bucket;
        mt_all_reduce(&r->groups.dp, r->model.grads_memory + off, n, MT_SUM);
    }
}

// --overlap-grad-reduce (Megatron's DDP with overlap_grad_reduce, distributed_data_parallel.py and
// param_and_grad_buffer.py): the reduction of the last micro-batch's gradients overlaps its
// backward. Megatron registers a hook per parameter and all-reduces a bucket (a contiguous piece of
// its gradient buffer, parameters in backward order) once every gradient in it is final. Here the
// carve stacks each tensor's layers (section 5), so a bucket is a run of whole layers: the
// backward finishes layers from the top of a chunk down, and a bucket's gradients are final
// after the last micro-batch's backward of its lowest layer (nothing adds to them after that).
// Then its per-tensor runs (one contiguous range per tensor: layers lo..hi) are all-reduced,
// started: on the GPU build NCCL runs them on the DP group's stream while the rank's kernels go on
// with the layers below; mt_finish_grad_sync makes the optimizer wait for them. The threads
// backend (CPU build) has no second stream: it reduces the bucket there and then, the same sums.
// Left to the finish: the tensors outside the layers (wte, wpe, lnf: the head's and embedding's
// backwards come first and last, and the tied wte adds both), and with --sequence-parallel the
// layernorms (their TP all-reduce goes first, as without overlap). With the distributed optimizer
// the buckets are all-reduced, not reduce-scattered into shards (the shards cut the buffer
// anywhere; DeepSpeed's ZeRO stage 1 moves the same bytes): the same sums, twice the traffic of
// the reduce-scatter, overlapped.
void mt_grad_buckets_init(mt_rank *r) {
    mt_grad_buckets *b = &r->buckets;
    memset(b, 0, sizeof *b);
    const mt_config *cfg = r->cfg;
    if (!cfg->parallel.overlap_grad_reduce || r->ps.dp_size < 2) return;
    int sp = cfg->parallel.sequence_parallel && r->ps.tp_size > 1;
    size_t per_layer = 0;   // gradient elements of one layer in the buckets
    for (int i = 0; i < MT_NUM_PARAM_TENSORS; i++) {
        const mt_param_spec *s = &r->model.specs[i];
        b->overlapped[i] = s->present && s->layers > 0 && !(sp && s->sequence_parallel);
        if (b->overlapped[i]) per_layer += (size_t)s->rows * s->cols;
    }
    int L = r->dims.L_local, lpc = r->dims.layers_per_chunk;
    if (L == 0 || per_layer == 0) return;
    b->on = 1;
    b->closes = (int *)mt_malloc(sizeof(int) * (size_t)L, "gradient buckets");
    size_t bucket = (size_t)cfg->parallel.ddp_bucket_size;
    for (int c = 0; c < L / lpc; c++) {   // each chunk from its top layer down, in backward order
        int top = c * lpc + lpc - 1;
        size_t n = 0;
        for (int l = top; l >= c * lpc; l--) {
            b->closes[l] = -1;
            n += per_layer;
            if (n >= bucket || l == c * lpc) {   // full, or the chunk's last: closed by layer l
                b->closes[l] = top;
                top = l - 1;
                n = 0;
            }
        }
    }
}
void mt_grad_buckets_free(mt_rank *r) {
    free(r->buckets.closes);
    memset(&r->buckets, 0, sizeof r->buckets);
}
void mt_grad_bucket_ready(mt_rank *r, int l, int mb) {
    const mt_grad_buckets *b = &r->buckets;
    if (!b->on || !r->state.training || mb != r->cfg->num_microbatches - 1 || b->closes[l] < 0) return;
    int top = b->closes[l];   // the bucket: layers l..top, each tensor's run of them contiguous
    for (int i = 0; i < MT_NUM_PARAM_TENSORS; i++) {
        if (!b->overlapped[i]) continue;
        const mt_param_spec *s = &r->model.specs[i];
        size_t per = (size_t)s->rows * s->cols;
        mt_all_reduce_start(&r->groups.dp, r->model.grads_memory + s->offset + (size_t)l * per,
                            (size_t)(top - l + 1) * per, MT_SUM);
    }
}
// the finish after overlapped buckets: wait for them, then everything they left out, in the order
// the plain finish below reduces it (the tied wte: embedding group first with the distributed
// optimizer, last without), adjacent tensors in one call
static void mt__finish_overlapped_grad_sync(mt_rank *r) {
    mt_comm_wait(&r->groups.dp);
    const mt_param_spec *wte = &r->model.specs[0];
    int embd_first = r->optim.distributed;
    if (embd_first && r->ps.in_embedding_group)
        mt_all_reduce(&r->groups.embd, r->model.grads_memory + wte->offset, mt__spec_numel(wte), MT_SUM);
    size_t run_start = 0, run_end = 0;
    for (int i = 0; i <= MT_NUM_PARAM_TENSORS; i++) {
        const mt_param_spec *s = i < MT_NUM_PARAM_TENSORS ? &r->model.specs[i] : NULL;
        int take = s && s->present && !r->buckets.overlapped[i];
        if (take && run_end > run_start && s->offset == run_end) { run_end += mt__spec_numel(s); continue; }
        if (run_end > run_start) mt_all_reduce(&r->groups.dp, r->model.grads_memory + run_start, run_end - run_start,
                                               MT_SUM);
        run_start = run_end = 0;
        if (take) { run_start = s->offset; run_end = s->offset + mt__spec_numel(s); }
    }
    if (!embd_first && r->ps.in_embedding_group)
        mt_all_reduce(&r->groups.embd, r->model.grads_memory + wte->offset, mt__spec_numel(wte), MT_SUM);
}

void mt_finish_grad_sync(mt_rank *r) {
    mt__sequence_parallel_grads_all_reduce(r);
    if (r->buckets.on) {   // --overlap-grad-reduce: the layers' buckets are already on their way
        mt__finish_overlapped_grad_sync(r);
        return;
    }
    if (r->optim.distributed) {
        // the tied embedding's two copies first (on the whole buffer: the two stages' buffers are
        // carved differently, so their DP shards would not line up), then each DP rank receives
        // the sum over DP of its own shard (reduce-scatter: half an all-reduce's traffic).
        // A DeepSpeed config's ZeRO stage 1 all-reduces instead: every DP rank gets every
        // gradient and reads only its shard's. The sums are the same, element by element in
        // rank order (section 2: all_gather(reduce_scatter(x)) == all_reduce(x)), so stage 1 and
        // stage 2 train to the same bits; stage 2 moves half the bytes.
        if (r->ps.in_embedding_group) {
            const mt_param_spec *s = &r->model.specs[0];   // wte
            mt_all_reduce(&r->groups.embd, r->model.grads_memory + s->offset, mt__spec_numel(s), MT_SUM);
        }
        if (r->ps.dp_size > 1 && r->cfg->parallel.zero_stage == 1) mt__dp_all_reduce_buckets(r);
        else if (r->ps.dp_size > 1)
            mt_reduce_scatter(&r->groups.dp, r->model.grads_memory, r->model.grads_memory + r->optim.shard_start,
                              r->optim.shard_size, MT_SUM);
        return;
    }
    if (r->ps.dp_size > 1) mt__dp_all_reduce_buckets(r);
    if (r->ps.in_embedding_group) {
        const mt_param_spec *s = &r->model.specs[0];   // wte
        mt_all_reduce(&r->groups.embd, r->model.grads_memory + s->offset, mt__spec_numel(s), MT_SUM);
    }
}

// =============================================================================================
// 8. PIPELINE SCHEDULES & TRAIN STEP
// =============================================================================================
// Mirrors megatron/core/pipeline_parallel/schedules.py. A schedule is written here as the list
// of steps one stage performs, in order: F(mb, chunk) or B(mb, chunk). One executor runs any
// list: a forward first receives its input from the previous (virtual) stage unless it is the
// very first, and sends its output on unless it is the very last; a backward receives the
// output gradient from the next stage and sends its input gradient back. Sends are buffered
// (CPU threads backend), so any list whose steps respect the data dependencies runs without
// deadlock; the schedule decides only *when* each stage does what, i.e. the bubble and how
// many micro-batches' activations are alive at once.

// (mt_sched_step: F(mb, chunk) or B(mb, chunk), in the interface, section 8)

static int mt__push(mt_sched_step *out, int n, mt_step_kind kind, int mb, int chunk) {
    out[n].kind = kind;
    out[n].mb = mb;
    out[n].chunk = chunk;
    return n + 1;
}

// no pipelining (forward_backward_no_pipelining): F0 B0 F1 B1 ... gradient accumulation
int mt_schedule_no_pipelining(int m, mt_sched_step *out) {
    int n = 0;
    for (int i = 0; i < m; i++) { n = mt__push(out, n, MT_STEP_FORWARD, i, 0); n = mt__push(out, n, MT_STEP_BACKWARD, i,
            0); }
    return n;
}

// all forward, all backward (GPipe): the simplest pipeline schedule; every micro-batch's
// activations are alive at once. Kept as the baseline the 1F1B schedule improves on.
int mt_schedule_afab(int m, mt_sched_step *out) {
    int n = 0;
    for (int i = 0; i < m; i++) n = mt__push(out, n, MT_STEP_FORWARD, i, 0);
    for (int i = 0; i < m; i++) n = mt__push(out, n, MT_STEP_BACKWARD, i, 0);
    return n;
}

// 1F1B (forward_backward_pipelining_without_interleaving; PipeDream-Flush, Narayanan et al. 2021)
// pp=4, m=6, F and B one slot each (really B takes about 2F); blanks are the bubble:
//
// stage 0 |F0 F1 F2 F3          B0 F4 B1 F5 B2    B3    B4    B5
// stage 1 |   F0 F1 F2       B0 F3 B1 F4 B2 F5 B3    B4    B5
// stage 2 |      F0 F1    B0 F2 B1 F3 B2 F4 B3 F5 B4    B5
// stage 3 |         F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5
//          warmup: stage s runs pp-s-1 forwards | steady: 1F then 1B | cooldown: the remaining B's
//
// A stage holds at most pp - s micro-batches' activations (AFAB: all m). The bubble is
// (p-1)/(m+p-1) of the time in both.
int mt_schedule_1f1b(int m, int pp_size, int pp_rank, mt_sched_step *out) {
    int n = 0;
    int num_warmup = pp_size - pp_rank - 1;
    if (num_warmup > m) num_warmup = m;
    int num_steady = m - num_warmup;
    // warmup
    for (int i = 0; i < num_warmup; i++) n = mt__push(out, n, MT_STEP_FORWARD, i, 0);
    // steady 1F1B
    for (int i = 0; i < num_steady; i++) {
        n = mt__push(out, n, MT_STEP_FORWARD, num_warmup + i, 0);
        n = mt__push(out, n, MT_STEP_BACKWARD, i, 0);
    }
    // cooldown
    for (int i = num_steady; i < m; i++) n = mt__push(out, n, MT_STEP_BACKWARD, i, 0);
    return n;
}

// interleaved 1F1B (forward_backward_pipelining_with_interleaving; Narayanan et al. 2021, sec 2.2)
// Each stage holds vp model chunks; micro-batches go through chunk 0 of every stage, then chunk 1
// of every stage, ... Forward step k of a stage works on chunk (k / pp) % vp of micro-batch
// (k / (pp*vp)) * pp + k % pp: groups of pp micro-batches per chunk. The bubble shrinks by vp.
static int mt__interleaved_chunk(int k, int pp, int vp, int forward) {
    int c = (k / pp) % vp;
    return forward ? c : vp - 1 - c;
}

static int mt__interleaved_mb(int k, int pp, int vp) { return (k / (pp * vp)) * pp + k % pp; }
// the forwards a stage runs before its first backward
static int mt__interleaved_warmup(int m, int pp_size, int pp_rank, int vp) {
    int total = m * vp;
    if (m == pp_size) return total;   // Megatron: all forwards first when m == pp
    int num_warmup = (pp_size - pp_rank - 1) * 2 + (vp - 1) * pp_size;
    return num_warmup > total ? total : num_warmup;
}
int mt_schedule_1f1b_interleaved(int m, int pp_size, int pp_rank, int vp, mt_sched_step *out) {
    int n = 0, total = m * vp;
    int num_warmup = mt__interleaved_warmup(m, pp_size, pp_rank, vp);
    int num_steady = total - num_warmup;
    // warmup
    for (int k = 0; k < num_warmup; k++)
        n = mt__push(out, n, MT_STEP_FORWARD, mt__interleaved_mb(k, pp_size, vp),
                     mt__interleaved_chunk(k, pp_size, vp, 1));
    // steady 1F1B
    for (int k = 0; k < num_steady; k++) {
        int kf = num_warmup + k;
        n = mt__push(out, n, MT_STEP_FORWARD, mt__interleaved_mb(kf, pp_size, vp),
                     mt__interleaved_chunk(kf, pp_size, vp, 1));
        n = mt__push(out, n, MT_STEP_BACKWARD, mt__interleaved_mb(k, pp_size, vp),
                     mt__interleaved_chunk(k, pp_size, vp, 0));
    }
    // cooldown
    for (int k = num_steady; k < total; k++)
        n = mt__push(out, n, MT_STEP_BACKWARD, mt__interleaved_mb(k, pp_size, vp),
                     mt__interleaved_chunk(k, pp_size, vp, 0));
    return n;
}

// forward only (evaluation): each micro-batch through every chunk in turn
int mt_schedule_forward_only(int m, int vp, mt_sched_step *out) {
    int n = 0;
    for (int i = 0; i < m; i++)
        for (int c = 0; c < vp; c++) n = mt__push(out, n, MT_STEP_FORWARD, i, c);
    return n;
}

/* the schedule a stage runs in a training step, chosen as Megatron's get_forward_backward_func */
int mt_schedule_for(const mt_config *cfg, int pp_rank, mt_sched_step *out) {
    int m = cfg->num_microbatches, pp = cfg->parallel.pipeline_model_parallel_size;
    if (pp == 1) return mt_schedule_no_pipelining(m, out);
    if (cfg->virtual_pipeline_size > 1) return mt_schedule_1f1b_interleaved(m, pp, pp_rank, cfg->virtual_pipeline_size,
            out);
    return mt_schedule_1f1b(m, pp, pp_rank, out);
}

// The pipeline as a time line: every stage runs its list; a step may start once its input
// has arrived (the producing step finished) and the stage is free. F takes f_cost slots and
// B takes b_cost. Fills start[stage][i] and returns the makespan. Used by --print-schedule,
// by the tests (every schedule finishes: no deadlock) and to size the activation slots.
// Returns -1 if the lists deadlock.
int mt_schedule_simulate(const mt_config *cfg, int f_cost, int b_cost, int **start_out, int *count_out) {
    int pp = cfg->parallel.pipeline_model_parallel_size, vp = cfg->virtual_pipeline_size, m = cfg->num_microbatches;
    int max_steps = 2 * m * vp;
    mt_sched_step *lists = (mt_sched_step *)mt_malloc(sizeof(mt_sched_step) * (size_t)max_steps * pp, "schedule");
    // finish time of F(stage, chunk, mb), -1 = not yet
    int *done_f = (int *)mt_malloc(sizeof(int) * (size_t)pp * vp * m, "schedule");
    int *done_b = (int *)mt_malloc(sizeof(int) * (size_t)pp * vp * m, "schedule");
    for (int i = 0; i < pp * vp * m; i++) done_f[i] = done_b[i] = -1;
    int *pos = (int *)mt_calloc((size_t)pp, sizeof(int), "schedule");
    int *clock_ = (int *)mt_calloc((size_t)pp, sizeof(int), "schedule");
    for (int s = 0; s < pp; s++) count_out[s] = mt_schedule_for(cfg, s, lists + (size_t)s * max_steps);
    int makespan = 0, progress = 1;
    while (progress) {
        progress = 0;
        for (int s = 0; s < pp; s++) {
            while (pos[s] < count_out[s]) {
                mt_sched_step st = lists[(size_t)s * max_steps + pos[s]];
                int ready = 0;
                if (st.kind == MT_STEP_FORWARD) {
                    int first = s == 0 && st.chunk == 0;
                    int ps = s > 0 ? s - 1 : pp - 1, pc = s > 0 ? st.chunk : st.chunk - 1;
                    ready = first ? 0 : done_f[(ps * vp + pc) * m + st.mb];
                } else {
                    int last = s == pp - 1 && st.chunk == vp - 1;
                    int ns = s < pp - 1 ? s + 1 : 0, nc = s < pp - 1 ? st.chunk : st.chunk + 1;
                    ready = last ? done_f[(s * vp + st.chunk) * m + st.mb] : done_b[(ns * vp + nc) * m + st.mb];
                }
                if (ready < 0) break;   // waits on another stage
                int t0 = ready > clock_[s] ? ready : clock_[s];
                start_out[s][pos[s]] = t0;
                int t1 = t0 + (st.kind == MT_STEP_FORWARD ? f_cost : b_cost);
                if (st.kind == MT_STEP_FORWARD) done_f[(s * vp + st.chunk) * m + st.mb] = t1;
                else done_b[(s * vp + st.chunk) * m + st.mb] = t1;
                clock_[s] = t1;
                if (t1 > makespan) makespan = t1;
                pos[s]++;
                progress = 1;
            }
        }
    }
    int finished = 1;
    for (int s = 0; s < pp; s++) if (pos[s] < count_out[s]) finished = 0;
    free(lists); free(done_f); free(done_b); free(pos); free(clock_);
    return finished ? makespan : -1;
}

// --print-schedule: each stage's time line (F and B one slot each, as the picture above),
// then the same with B = 2F, the bubble fraction (p-1)/(m+p-1) and the idle share it gives.
void mt_print_schedule(const mt_config *cfg, FILE *f) {
    int pp = cfg->parallel.pipeline_model_parallel_size, vp = cfg->virtual_pipeline_size, m = cfg->num_microbatches;
    int max_steps = 2 * m * vp;
    int **start = (int **)mt_malloc(sizeof(int *) * (size_t)pp, "schedule");
    for (int s = 0; s < pp; s++) start[s] = (int *)mt_malloc(sizeof(int) * (size_t)max_steps, "schedule");
    int *count = (int *)mt_malloc(sizeof(int) * (size_t)pp, "schedule");
    mt_sched_step *list = (mt_sched_step *)mt_malloc(sizeof(mt_sched_step) * (size_t)max_steps, "schedule");
    const char *name = pp == 1 ? "no pipelining" : vp > 1 ? "interleaved 1F1B" : "1F1B";
    fprintf(f, "schedule: %s, PP=%d, %d micro-batches%s", name, pp, m, vp > 1 ? "" : "\n");
    if (vp > 1) fprintf(f, ", %d chunks per stage (F3.1 = micro-batch 3, chunk 1)\n", vp);
    for (int pass = 0; pass < 2; pass++) {
        int fc = 1, bc = pass == 0 ? 1 : 2;
        int makespan = mt_schedule_simulate(cfg, fc, bc, start, count);
        if (makespan < 0) { fprintf(f, "the schedule deadlocks\n"); break; }
        fprintf(f, "\n%s:\n",
                pass == 0 ? "time line, F and B one slot each" : "time line with B = 2F (closer to real)");
        int busy_total = 0;
        for (int s = 0; s < pp; s++) {
            int n = mt_schedule_for(cfg, s, list);
            // a cell fits the longest label and a space: F9 -> 3, F10 -> 4, F3.1 -> 6, F10.1 -> 7
            int digits = 1, cdigits = 1;
            for (int x = m - 1; x >= 10; x /= 10) digits++;
            for (int x = vp - 1; x >= 10; x /= 10) cdigits++;
            int cell = vp > 1 ? 4 + digits + cdigits : 2 + digits;
            char *line = (char *)mt_malloc((size_t)makespan * cell + 1, "schedule");
            memset(line, ' ', (size_t)makespan * cell);
            line[makespan * cell] = 0;
            int busy = 0;
            for (int i = 0; i < n; i++) {
                char label[16];
                char letter = list[i].kind == MT_STEP_FORWARD ? 'F' : 'B';
                if (vp > 1) snprintf(label, sizeof label, "%c%d.%d", letter, list[i].mb, list[i].chunk);
                else snprintf(label, sizeof label, "%c%d", letter, list[i].mb);
                int len = (int)strlen(label);
                int cost = list[i].kind == MT_STEP_FORWARD ? fc : bc;
                busy += cost;
                memcpy(line + (size_t)start[s][i] * cell, label, (size_t)(len < cell * cost ? len : cell * cost));
            }
            size_t e = strlen(line);
            while (e > 0 && line[e - 1] == ' ') line[--e] = 0;
            fprintf(f, "stage %d |%s\n", s, line);
            busy_total += busy;
            free(line);
        }
        double idle = 1.0 - (double)busy_total / ((double)makespan * pp);
        if (pass == 1) {
            // the bubble's share of the step: (p-1)/(m+p-1); interleaving divides the fill and
            // drain by v: ((p-1)/v) / (m + (p-1)/v), which is the same formula when v = 1
            double fill = (double)(pp - 1) / (double)vp;
            double bubble = fill / ((double)m + fill);
            fprintf(f, "bubble: (p-1)/(m+p-1)%s = %.3f of the time; idle share of this time line: %.3f\n",
                    vp > 1 ? " with (p-1)/v for the interleaved schedule" : "", bubble, idle);
        }
    }
    for (int s = 0; s < pp; s++) free(start[s]);
    free(start); free(count); free(list);
}

// ---------------------------------------------------------------------------------------------
// point-to-point: activations forward, gradients backward (megatron's p2p_communication.py)
// A message is tagged with (kind, micro-batch, receiving chunk) so messages between the same
// two stages can never be confused (with PP=2 and interleaving, stage 1 sends stage 0 both
// activations, wrapping around to the next chunk, and gradients).
static int mt__p2p_tag(int kind, int mb, int chunk) { return (kind * 65536 + mb) * 64 + chunk; }

// MT_TRACE=1: one line per pipeline message in picotron's style, "pp 0 -> 1 send_forward mb 3"
static void mt__p2p_trace(const mt_rank *r, const char *what, int peer_stage, int tag) {
    int kind = tag / 64 / 65536, mb = tag / 64 % 65536, chunk = tag % 64;
    int from = what[0] == 's' ? r->ps.pp_rank : peer_stage, to = what[0] == 's' ? peer_stage : r->ps.pp_rank;
    if (r->ps.vp_size > 1)
        mt__trace(&r->groups.pp, "pp %d -> %d %s_%s mb %d chunk %d", from, to, what, kind ? "backward" : "forward", mb,
                  chunk);
    else
        mt__trace(&r->groups.pp, "pp %d -> %d %s_%s mb %d", from, to, what, kind ? "backward" : "forward", mb);
}

// The messages go through the p2p group (section 2's mt_p2p_batch): NCCL from device to device
// on the GPU build, the threads backend on the CPU build, with NCCL's rules on both. Under those
// rules a send is done only when its receiver has the data, and receives match sends in order,
// so when a stage sends and receives decides whether the pipeline runs or waits forever. 1F1B's
// steady state shows it: stage 0 sends activation i+1, then waits for gradient i; stage 1 sends
// gradient i, then waits for activation i+1. Sent one at a time, each waits for the other.
// So the messages go in batches, Megatron's (schedules.py with p2p_communication.py):
//   - the schedule is cut into units: one step each, except in the interleaved schedule's
//     steady state, where a unit is a forward and the backward after it (Megatron's loop body);
//   - after a unit computes, one batch sends what its steps produced and receives what the next
//     unit's steps need (the first unit's receives go alone, before it):
//       1F1B steady state   send_forward_recv_backward, then send_backward_recv_forward
//       interleaved         {send forward, send backward, receive forward, receive backward}
//       warm-up, cool-down  send_forward_recv_forward, send_backward_recv_backward
//   - a gradient is sent from scratch.dresidual, which the batch's own receive of the next
//     gradient overwrites: then it is sent from a copy, scratch.p2p_held.
// The all-forward-all-backward schedule keeps one-step units: pairing its last forward with its
// first backward would wait forever (that backward's gradient needs the forward's output first).
// tests/test_pp.c runs the schedules on the CPU build under NCCL's rules, against one rank.

// the receive a step needs before it computes (0: none). A forward's slot is taken here, the
// micro-batch's tokens loaded with it on its first chunk, so the receive has somewhere to land.
static mt_activations *mt__forward_slot(mt_rank *r, mt_sched_step st, mt_batch_fn batch, void *ctx);
static int mt__step_recv(mt_rank *r, mt_sched_step st, mt_batch_fn batch, void *ctx, mt_p2p_op *op) {
    int pp = r->ps.pp_size, s = r->ps.pp_rank;
    size_t BTC = (size_t)r->dims.B * r->dims.T_sp * r->dims.C;   // (with --sequence-parallel: my positions,
                                                                  // as Megatron's p2p_communication sends)
    mt_p2p_op recv = {1, NULL, BTC, 0, 0};
    if (st.kind == MT_STEP_FORWARD) {
        mt_activations *a = mt__forward_slot(r, st, batch, ctx);
        if (mt__is_first_virtual(r, st.chunk)) return 0;
        recv.buf = mt__chunk_input(r, a, st.chunk);   // from the previous virtual stage
        recv.peer = s > 0 ? s - 1 : pp - 1;
        recv.tag = mt__p2p_tag(0, st.mb, st.chunk);
    } else {
        if (mt__is_last_virtual(r, st.chunk)) return 0;
        recv.buf = r->scratch.dresidual;              // from the next virtual stage
        recv.peer = s < pp - 1 ? s + 1 : 0;
        recv.tag = mt__p2p_tag(1, st.mb, st.chunk);
    }
    mt__p2p_trace(r, "recv", recv.peer, recv.tag);
    *op = recv;
    return 1;
}

// the send a step makes after it computes (0: none)
static int mt__step_send(mt_rank *r, mt_sched_step st, mt_activations *a, mt_p2p_op *op) {
    int pp = r->ps.pp_size, s = r->ps.pp_rank;
    size_t BTC = (size_t)r->dims.B * r->dims.T_sp * r->dims.C;
    mt_p2p_op send = {0, NULL, BTC, 0, 0};
    if (st.kind == MT_STEP_FORWARD) {
        if (mt__is_last_virtual(r, st.chunk)) return 0;
        send.buf = mt__chunk_output(r, a, st.chunk);   // to the next virtual stage
        send.peer = s < pp - 1 ? s + 1 : 0;
        send.tag = mt__p2p_tag(0, st.mb, s < pp - 1 ? st.chunk : st.chunk + 1);
    } else {
        if (mt__is_first_virtual(r, st.chunk)) return 0;
        send.buf = r->scratch.dresidual;               // to the previous virtual stage
        send.peer = s > 0 ? s - 1 : pp - 1;
        send.tag = mt__p2p_tag(1, st.mb, s > 0 ? st.chunk : st.chunk - 1);
    }
    mt__p2p_trace(r, "send", send.peer, send.tag);
    *op = send;
    return 1;
}

// one batch: the sends, then the receives. A send from scratch.dresidual next to a receive into
// it is sent from scratch.p2p_held (a copy) instead.
static void mt__p2p_go(mt_rank *r, mt_p2p_op *ops, int count) {
    if (count == 0) return;
    int into_dresidual = 0;
    for (int i = 0; i < count; i++) into_dresidual |= ops[i].recv && ops[i].buf == r->scratch.dresidual;
    for (int i = 0; i < count; i++)
        if (into_dresidual && !ops[i].recv && ops[i].buf == r->scratch.dresidual) {
            mt_buffer_copy(r, r->scratch.p2p_held, ops[i].buf, ops[i].n);
            ops[i].buf = r->scratch.p2p_held;
        }
    mt_p2p_batch(&r->groups.p2p, ops, count);
}

static mt_activations *mt__slot_for(mt_rank *r, int mb, int create) {
    for (int i = 0; i < r->acts.num_slots; i++) if (r->acts.slots[i].mb == mb) return &r->acts.slots[i];
    if (!create) mt_fatal("internal: no activations for micro-batch %d on rank %d", mb, r->ps.rank);
    for (int i = 0; i < r->acts.num_slots; i++)
        if (r->acts.slots[i].mb < 0) { r->acts.slots[i].mb = mb; return &r->acts.slots[i]; }
    mt_fatal("internal: all %d activation slots are in use on rank %d", r->acts.num_slots, r->ps.rank);
    return NULL;
}

// --timeline: the start of a piece of work (host time, and a mark in the rank's stream on the
// GPU build), then its span. On the GPU the marks time the kernels themselves, not their queueing.
typedef struct { double seconds; int mark; } mt__span_start;
static mt__span_start mt__work_start(mt_rank *r) {
    mt__span_start s = {mt_time_seconds(), -1};
    if (r->timeline && r->timeline->enabled) s.mark = mt_device_mark(r->timeline, r->dev.stream);
    return s;
}
static void mt__work_span(mt_rank *r, mt_span_kind kind, mt_sched_step st, mt__span_start start) {
    if (!r->timeline || !r->timeline->enabled) return;
    mt_span sp;
    memset(&sp, 0, sizeof sp);
    sp.t0 = start.seconds;
    sp.mark0 = start.mark;
    sp.t1 = mt_time_seconds();
    sp.mark1 = mt_device_mark(r->timeline, r->dev.stream);
    sp.kind = kind;
    sp.mb = st.mb;
    sp.chunk = st.chunk;
    int per = r->dims.layers_per_chunk;
    sp.layer_first = kind == MT_SPAN_OPTIMIZER ? -1 : mt_local_to_global_layer(r, st.chunk * per);
    sp.layer_last = kind == MT_SPAN_OPTIMIZER ? -1 : mt_local_to_global_layer(r, st.chunk * per + per - 1);
    sp.name = kind == MT_SPAN_FORWARD ? "forward" : kind == MT_SPAN_BACKWARD ? "backward" : "optimizer";
    mt_span_add(r->timeline, &sp);
}

// ---------------------------------------------------------------------------------------------
// THE STEP AS CUDA GRAPHS (GPU build)
// ---------------------------------------------------------------------------------------------
// A chunk's forward queues ~115 kernels for GPT-2 small and its backward ~345, the same kernels
// with the same arguments every iteration: what changes (token ids, targets, the chunk's input from
// the previous stage, the parameters) is read from device buffers written before it runs. Launched
// one by one, each kernel costs the host a launch and the GPU a gap before it starts; recorded once
// as a CUDA graph (section 3's mt_device_capture_begin / _end) the whole chunk is one launch.
// The work is the same from step to step when
//   - nothing in it talks to another rank: TP = 1 (the f / g all-reduces sit inside the layers) and
//     no --overlap-grad-reduce across DP ranks (its buckets start inside the backward);
//   - no dropout while training: the masks are keyed by the iteration, a kernel argument;
//   - the same activation slot, chunk, direction, training flag and fp16 loss scale (the entry's key;
//     a new loss scale records the work again).
// A work's first run goes as queued (kernels set their attributes, memory pools grow), the second is
// recorded and launched, later ones replay it. The CPU build and MT_CUDA_GRAPH=0 run it as queued.
static int mt__chunk_graphable(const mt_rank *r) {
    const mt_config *cfg = r->cfg;
    if (r->ps.tp_size > 1 || r->ps.pp_size > 1) return 0;
    if (r->ps.dp_size > 1 && cfg->parallel.overlap_grad_reduce) return 0;
    if (r->state.training && (cfg->model.hidden_dropout > 0.0f || cfg->model.attention_dropout > 0.0f)) return 0;
    return 1;
}

static void mt__chunk_work(mt_rank *r, mt_activations *a, int chunk, int backward) {
    if (backward) mt__backward_chunk(r, a, chunk);
    else mt__forward_chunk(r, a, chunk);
}

static void mt__run_chunk(mt_rank *r, mt_activations *a, int chunk, int backward) {
    if (!mt__chunk_graphable(r)) {
        mt__chunk_work(r, a, chunk, backward);
        return;
    }
    mt_step_graphs *gs = &r->graphs;
    float scale = r->state.training ? r->state.loss_scale : 1.0f;
    mt_chunk_graph *e = NULL;
    for (int i = 0; i < gs->count && !e; i++) {
        mt_chunk_graph *c = &gs->entry[i];
        if (c->slot == a && c->chunk == chunk && c->backward == backward && c->training == r->state.training) e = c;
    }
    if (e && e->loss_scale != scale) {   // fp16's scale moved: this work is new again
        mt_device_graph_free(e->graph);
        e->graph = NULL;
        e->runs = 0;
        e->loss_scale = scale;
    }
    if (!e && gs->count < MT_CHUNK_GRAPHS) {
        e = &gs->entry[gs->count++];
        memset(e, 0, sizeof *e);
        e->slot = a;
        e->chunk = chunk;
        e->backward = backward;
        e->training = r->state.training;
        e->loss_scale = scale;
    }
    if (e && e->graph) {
        mt_device_graph_launch(r, e->graph);
    } else if (e && e->runs == 1) {   // (once: runs only grows from here)
        mt_device_capture_begin(r, 0);
        mt__chunk_work(r, a, chunk, backward);
        e->graph = mt_device_capture_end(r);
        mt_device_graph_launch(r, e->graph);   // (NULL: nothing was recorded, the work ran as queued)
    } else {
        mt__chunk_work(r, a, chunk, backward);
    }
    if (e) e->runs++;
}

static void mt__chunk_graphs_free(mt_rank *r) {
    for (int i = 0; i < r->graphs.count; i++) mt_device_graph_free(r->graphs.entry[i].graph);
    memset(&r->graphs, 0, sizeof r->graphs);
}

// a forward's activation slot: on its first chunk a new one, with the micro-batch's tokens and
// targets loaded into it (the batch function, then a queued upload)
static mt_activations *mt__forward_slot(mt_rank *r, mt_sched_step st, mt_batch_fn batch, void *ctx) {
    for (int i = 0; i < r->acts.num_slots; i++)
        if (r->acts.slots[i].mb == st.mb) return &r->acts.slots[i];
    if (st.chunk != 0) return mt__slot_for(r, st.mb, 0);   // (reports the missing slot)
    mt_activations *a = mt__slot_for(r, st.mb, 1);
    a->sample_offset = (int)mt_sample_in_batch(r, st.mb, 0);
    batch(r, ctx, r->state.iteration, st.mb, r->host.tokens, r->host.targets);
    size_t bytes = (size_t)r->dims.B * r->dims.T * sizeof(int);
    mt_buffer_upload_queued(r, a->tokens, r->host.tokens, bytes);   // (mt_calloc'd: pageable)
    mt_buffer_upload_queued(r, a->targets, r->host.targets, bytes);
    return a;
}

// the work of one step of a schedule (its messages are the caller's); returns its slot
static mt_activations *mt__run_step(mt_rank *r, mt_sched_step st, mt_batch_fn batch, void *ctx) {
    mt_activations *a;
    if (st.kind == MT_STEP_FORWARD) {
        a = mt__forward_slot(r, st, batch, ctx);
        mt__span_start t0 = mt__work_start(r);
        mt__run_chunk(r, a, st.chunk, 0);
        mt__work_span(r, MT_SPAN_FORWARD, st, t0);
    } else {
        a = mt__slot_for(r, st.mb, 0);
        mt__span_start t0 = mt__work_start(r);
        mt__run_chunk(r, a, st.chunk, 1);
        mt__work_span(r, MT_SPAN_BACKWARD, st, t0);
    }
    return a;
}

// the steps of a schedule in units, each unit's messages in a batch after it (see "The messages
// go through the p2p group" above). last_forward_releases (forward-only schedules): a micro-batch's
// slot is free once its last chunk's forward has run. Its next user may take it before the batch
// that sends this one's output, but only receives into the slot's input and loads its tokens
// there; it computes after the batch.
static int mt__unit_end(const mt_rank *r, const mt_sched_step *list, int n, int i) {
    int vp = r->ps.vp_size;   // the interleaved steady state: a forward, then a backward, past the warm-up
    int pair = vp > 1 && i + 1 < n && list[i].kind == MT_STEP_FORWARD && list[i + 1].kind == MT_STEP_BACKWARD &&
               i >= mt__interleaved_warmup(r->cfg->num_microbatches, r->ps.pp_size, r->ps.pp_rank, vp);
    return i + (pair ? 2 : 1);
}
static void mt__run_schedule(mt_rank *r, const mt_sched_step *list, int n, mt_batch_fn batch, void *ctx,
                             int last_forward_releases) {
    mt_p2p_op ops[4];   // a unit of two steps sends two messages and its successor receives two
    int count = 0, begin = 0, end = n > 0 ? mt__unit_end(r, list, n, 0) : 0;
    for (int i = begin; i < end; i++) count += mt__step_recv(r, list[i], batch, ctx, &ops[count]);
    mt__p2p_go(r, ops, count);   // the first unit's receives
    while (begin < n) {
        mt_activations *done[2];
        for (int i = begin; i < end; i++) done[i - begin] = mt__run_step(r, list[i], batch, ctx);
        count = 0;
        for (int i = begin; i < end; i++) count += mt__step_send(r, list[i], done[i - begin], &ops[count]);
        for (int i = begin; i < end; i++) {   // the slots this unit has finished with
            mt_sched_step st = list[i];
            if (st.kind == MT_STEP_BACKWARD ? st.chunk == 0 : last_forward_releases && st.chunk == r->ps.vp_size - 1)
                done[i - begin]->mb = -1;
        }
        int next = end < n ? mt__unit_end(r, list, n, end) : n;
        for (int i = end; i < next; i++) count += mt__step_recv(r, list[i], batch, ctx, &ops[count]);
        mt__p2p_go(r, ops, count);
        begin = end;
        end = next;
    }
}

// the time of the step's pipeline messages: the p2p group's seconds (section 2's counters: the
// host's wait on the CPU build, NCCL's own time on the GPU, waiting for the peer included)
static double mt__p2p_seconds(mt_rank *r) {
    mt__nccl_seconds(&r->groups.p2p);
    return r->groups.p2p.seconds;
}

// the mean loss of the global batch, known on every rank: the last stage's sum over its
// micro-batches, averaged over DP, then shared along the pipeline
static float mt__batch_loss(mt_rank *r) {
    double sum = 0.0;   // the micro-batches' mean losses, added on the device (mt_loss_mean_add): one read
    if (r->ps.is_last_stage) mt_buffer_download(r, &sum, r->scratch.loss_acc, sizeof(double));
    double loss = r->ps.is_last_stage ? sum / (double)r->cfg->num_microbatches : 0.0;
    if (r->ps.dp_size > 1) mt_all_reduce_double(&r->groups.dp, &loss, 1, MT_SUM);
    loss /= (double)r->ps.dp_size;
    if (r->ps.pp_size > 1) mt_all_reduce_double(&r->groups.pp, &loss, 1, MT_SUM);
    return (float)loss;
}

mt_step_result mt_train_step(mt_rank *r, mt_batch_fn batch, void *ctx, int iteration) {
    const mt_config *cfg = r->cfg;
    mt_step_result res;
    memset(&res, 0, sizeof res);
    r->state.iteration = iteration;
    r->state.training = 1;
    mt_buffer_zero(r, r->scratch.loss_acc, 2);   // the double (section 3's mt_loss_mean_add adds into it)
    double p2p_start = mt__p2p_seconds(r);
    r->state.loss_scale = r->optim.scaler.scale;   // fp16: the backward starts from scale x loss
    mt_buffer_zero(r, r->model.grads_memory, r->model.buffer_floats);
    mt_device_weights16(r, MT_WEIGHTS16_STEP);   // the weights rounded once for the step's products (§3)
    // 1. forward and backward of every micro-batch, in the order of the schedule
    size_t max_steps = 2 * (size_t)cfg->num_microbatches * (size_t)r->ps.vp_size;
    mt_sched_step *list = (mt_sched_step *)mt_malloc(sizeof(mt_sched_step) * max_steps, "schedule");
    mt__own(free, list);
    int n = mt_schedule_for(cfg, r->ps.pp_rank, list);
    double t_start = mt_time_seconds();
    mt__run_schedule(r, list, n, batch, ctx, 0);
    mt__disown(list);
    free(list);
    double t_fb = mt_time_seconds();
    // 2. gradients: all-reduce over DP, tie the embedding copies
    mt_finish_grad_sync(r);
    res.loss = mt__batch_loss(r);
    res.forward_backward_seconds = t_fb - t_start;
    res.grads_sync_seconds = mt_time_seconds() - t_fb;
    // 3. clip by the global norm and update the parameters (section 6)
    mt_device_weights16(r, MT_WEIGHTS16_OFF);    // (they are about to change)
    int skipped = 0;
    mt__span_start t0 = mt__work_start(r);
    const mt_grad_scaler *scaler = &r->optim.scaler;
    int can_lower = scaler->kind == MT_SCALER_DYNAMIC && scaler->scale > scaler->min_scale;
    res.grad_norm = (float)mt_optimizer_step(r, iteration, &skipped);
    res.num_zeros = r->optim.num_zeros;
    mt_sched_step none = {MT_STEP_FORWARD, -1, 0};
    mt__work_span(r, MT_SPAN_OPTIMIZER, none, t0);
    res.optimizer_seconds = mt_time_seconds() - t0.seconds;
    res.skipped = skipped;
    res.overflow = skipped && can_lower;
    res.loss_scale = scaler->scale;
    res.lr = mt_learning_rate(cfg, iteration - r->optim.skipped);
    res.idle_seconds = mt__p2p_seconds(r) - p2p_start;
    return res;
}

float mt_eval_step(mt_rank *r, mt_batch_fn batch, void *ctx, int iteration) {
    const mt_config *cfg = r->cfg;
    r->state.iteration = iteration;
    r->state.training = 0;
    mt_buffer_zero(r, r->scratch.loss_acc, 2);
    size_t max_steps = (size_t)cfg->num_microbatches * (size_t)r->ps.vp_size;
    mt_sched_step *list = (mt_sched_step *)mt_malloc(sizeof(mt_sched_step) * max_steps, "schedule");
    mt__own(free, list);
    int n = mt_schedule_forward_only(cfg->num_microbatches, r->ps.vp_size, list);
    mt_device_weights16(r, MT_WEIGHTS16_STEP);
    mt__run_schedule(r, list, n, batch, ctx, 1);
    mt_device_weights16(r, MT_WEIGHTS16_OFF);
    mt__disown(list);
    free(list);
    return mt__batch_loss(r);
}

// ---------------------------------------------------------------------------------------------
// the rank: its state put together from the sections that own it (§2 groups, §3 device,
// §5 model and activations, §6 optimizer), in the order they depend on each other
// ---------------------------------------------------------------------------------------------
// how many micro-batches' activations this stage keeps alive at once under its schedule
int mt_schedule_max_alive(const mt_config *cfg, int pp_rank) {
    mt_sched_step *list = (mt_sched_step *)mt_malloc(sizeof(mt_sched_step) * 2 * (size_t)cfg->num_microbatches *
                                                     (size_t)cfg->virtual_pipeline_size, "schedule");
    int n = mt_schedule_for(cfg, pp_rank, list), alive = 0, most = 1;
    for (int i = 0; i < n; i++) {
        if (list[i].kind == MT_STEP_FORWARD && list[i].chunk == 0) alive++;
        if (list[i].kind == MT_STEP_BACKWARD && list[i].chunk == 0) alive--;
        if (alive > most) most = alive;
    }
    free(list);
    return most;
}

// the rank's memory, registered as owned by its thread (section 1's mt__own) so that an aborted
// world frees it when it ends the thread. The pointers themselves are registered, not r: r may
// live on the stack the abort unwinds. Communicators and device are left alone (NCCL cannot be
// torn down while peers may still be inside a collective); the process is ending.
static void mt__rank_own_buffers(mt_rank *r, int own) {
    const mt_optimizer *o = &r->optim;
    void *device[7] = {r->model.params_memory, r->model.grads_memory, o->offload ? NULL : o->m_memory,
                       o->offload ? NULL : o->v_memory, r->acts.memory, r->scratch.memory, r->acts.recompute_memory};
    void *device_ints = r->acts.ids_memory;
    void *host[4] = {r->acts.slots, r->host.tokens, r->host.targets, r->acts.where};
    // --optimizer-cpu-offload: the pinned host state, and the threads of its update
    void *pinned[4] = {o->offload ? o->m_memory : NULL, o->offload ? o->v_memory : NULL, o->host_grads,
                       o->master_params};
    for (int i = 0; i < 7; i++) {
        if (device[i] && own) mt__own(mt_buffer_free, device[i]);
        else if (device[i]) mt__disown(device[i]);
    }
    if (device_ints && own) mt__own(mt_buffer_free, device_ints);
    else if (device_ints) mt__disown(device_ints);
    for (int i = 0; i < 4; i++) {
        if (host[i] && own) mt__own(free, host[i]);
        else if (host[i]) mt__disown(host[i]);
    }
    for (int i = 0; i < 4; i++) {
        if (pinned[i] && own) mt__own(mt_buffer_free_host, pinned[i]);
        else if (pinned[i]) mt__disown(pinned[i]);
    }
    if (o->host_threads && own) mt__own(mt__host_pool_free, o->host_threads);
    else if (o->host_threads) mt__disown(o->host_threads);
}

void mt_rank_init(mt_rank *r, const mt_config *cfg, mt_world *w, int rank) {
    memset(r, 0, sizeof *r);
    r->cfg = cfg;
    mt_parallel_state_init(&r->ps, cfg, rank);
    r->ps.node_rank = mt_world_node_rank(w, rank);              // §2: my GPU on my node
    r->ps.node_size = mt_world_node_size(w, rank);
    mt_dims_init(&r->dims, cfg, &r->ps);                        // §5: my sizes (the device's scratch needs them)
    mt_device_init(r);                                          // §3: the GPU, its stream, the kernels' scratch
    mt_groups_init(&r->groups, w, cfg, &r->ps, r->dev.stream);  // §2: communicators
    mt_model_init(r);                                           // §5: parameters, gradients
    mt_optimizer_init(r);                                       // §6: AdamW's moments, the loss scaler
    mt_grad_buckets_init(r);                                    // §7: --overlap-grad-reduce's buckets
    r->state.loss_scale = r->optim.scaler.scale;                // (each train step sets it again)
    mt_activations_init(r, mt_schedule_max_alive(cfg, r->ps.pp_rank));   // §5: slots, scratch
    r->memory.kernel_scratch = mt_device_scratch_bytes(r);                // §3: borrowed op by op
    r->memory.weights16 = mt_device_weights16_bytes(r);                   // §3: the weights in 16 bits
    r->memory.comm = mt_device_comm_bytes(r);                             // §3: NCCL's own buffers
    mt__rank_own_buffers(r, 1);   // an aborted world ends this thread: the buffers go with it
}

void mt_rank_set_timeline(mt_rank *r, mt_span_log *log) {
    r->timeline = log;
    mt_comm *groups[] = {&r->groups.world, &r->groups.tp, &r->groups.pp, &r->groups.dp, &r->groups.mp,
                         &r->groups.embd, &r->groups.p2p};
    for (int i = 0; i < 7; i++) groups[i]->spans = log;
}

void mt_rank_free(mt_rank *r) {
    mt__rank_own_buffers(r, 0);
    mt__chunk_graphs_free(r);   // (before the buffers their work reads)
    if (r->timeline) mt_device_clock_free(r->timeline);   // its events, on this rank's GPU
    mt_activations_free(r);
    mt_grad_buckets_free(r);
    mt_optimizer_free(r);
    mt_model_free(r);
    mt_groups_free(&r->groups);
    mt_device_free(r);
}

// the memory plan: the sizes mt_rank_init allocates, from the same functions that compute them
// for the allocation, on a rank that allocates nothing (Megatron prints a "theoretical memory"
// report; this one is held to the allocation by tests/test_recompute.c, and on the GPU build to
// the measured peak by the memory report after the first iterations, section 12). Per rank:
//   parameters, gradients    fp32, one buffer each (section 5; padded to DP shards with the
//                            distributed optimizer)
//   optimizer                AdamW's m and v over this rank's shard (section 6)
//   activations              the saved tensors of each micro-batch in flight, as recompute keeps
//                            them, and the recompute scratch (section 5)
//   workspace                the per-layer scratch the backward works in (section 5)
//   kernel scratch           the most the GPU's launchers borrow at once in a step (section 3)
//   16-bit weights           the parameters rounded once a step for the GEMMs (section 3,
//                            mt_device_weights16: bf16 / fp16 on the wgmma rung; GPU build only)
//   communication            NCCL's buffers (an estimate per communicator, section 3's seam)
// Not counted: the CUDA context (the GPU build measures it at start: the memory report), host
// staging (token ids, losses, pipeline messages: host memory on either build).
void mt_memory_plan(const mt_config *cfg, int rank, mt_memory_report *out) {
    mt_rank *r = (mt_rank *)mt_calloc(1, sizeof(mt_rank), "memory plan");
    r->cfg = cfg;
    mt_parallel_state_init(&r->ps, cfg, rank);
    mt_dims_init(&r->dims, cfg, &r->ps);
    mt__model_sizes(r);
    mt__optimizer_sizes(r);
    mt__activation_sizes(r, mt_schedule_max_alive(cfg, r->ps.pp_rank));
    r->memory.kernel_scratch = mt_device_scratch_bytes(r);
    r->memory.weights16 = mt_device_weights16_bytes(r);
    r->memory.comm = mt_device_comm_bytes(r);
    *out = r->memory;
    free(r);
}

size_t mt_memory_total(const mt_memory_report *m) {
    return m->params + m->grads + m->optimizer + m->activations + m->scratch + m->kernel_scratch + m->weights16 +
           m->comm;
}

// --optimizer-cpu-offload pins the optimizer's state in host memory (16 bytes per parameter of
// the shard). Pinned pages cannot be swapped, so a host that runs short does not fail the
// allocation: the kernel's out-of-memory killer ends the process, with no message, maybe after
// minutes of set-up. So the plan is held to the host before anything is allocated: the sum over
// this process's ranks, times the processes on the node (a launcher starts them alike), against
// MemAvailable (what the kernel says can be had without swapping). Not counted: the rest of the
// process (the CUDA context's host side, the data set's pages, the staging buffers), so a plan
// close to the limit can still fail (an 8.6B GPT's 132.2 GB against 134.3 GB did, on a 128 GiB host).
static size_t mt__host_memory_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    size_t kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %zu kB", &kb) == 1) break;
    fclose(f);
    return kb * 1024;
}
void mt_check_host_memory(const mt_config *cfg, int first_rank, int nranks, int procs_on_node) {
    if (!cfg->train.optimizer_cpu_offload) return;
    size_t need = 0, available = mt__host_memory_available();
    for (int rank = first_rank; rank < first_rank + nranks && rank < cfg->world_size; rank++) {
        mt_memory_report m;
        mt_memory_plan(cfg, rank, &m);
        need += m.host_optimizer;
    }
    int procs = procs_on_node > 0 ? procs_on_node : 1, node_ranks = nranks * procs;
    need *= (size_t)procs;
    if (available == 0 || need <= available) return;
    mt_fatal("--optimizer-cpu-offload would pin %.1f GB of host memory on this node (the optimizer's master "
             "weights, moments and gradients, %d rank%s), and the host has %.1f GB available (MemAvailable)\n"
             "hint: share the state among more ranks (--use-distributed-optimizer with more data-parallel ranks, "
             "or more tensor / pipeline parallel ranks on more nodes), train a smaller model, or keep the optimizer "
             "on the GPU (no --optimizer-cpu-offload)",
             need / 1e9, node_ranks, node_ranks == 1 ? "" : "s", available / 1e9);
}

// --dry-run: one line per rank, in Megatron's rank order; the device's bytes, then (with
// --optimizer-cpu-offload) the pinned host bytes on their own, outside the device's total
void mt_print_memory_plan(const mt_config *cfg, FILE *f) {
    fprintf(f, "memory plan per rank (MB = 10^6 bytes, what each rank allocates; nothing is allocated now):\n");
    int any16 = 0;
    for (int rank = 0; rank < cfg->world_size; rank++) {
        mt_memory_report m;
        mt_memory_plan(cfg, rank, &m);
        mt_parallel_state ps;
        mt_parallel_state_init(&ps, cfg, rank);
        char host[96] = "", w16[48] = "";
        if (m.host_optimizer) snprintf(host, sizeof host, " | host (pinned): optimizer %.1f", m.host_optimizer / 1e6);
        if (m.weights16) snprintf(w16, sizeof w16, ", 16-bit weights %.1f", m.weights16 / 1e6);   // (the GPU build's)
        any16 |= m.weights16 != 0;
        fprintf(f, "rank %d (tp %d, dp %d, pp %d): parameters %.1f, gradients %.1f, optimizer %.1f, activations %.1f, "
                   "workspace %.1f, kernel scratch %.1f%s, communication %.1f, total %.1f%s\n", rank, ps.tp_rank,
                ps.dp_rank, ps.pp_rank, m.params / 1e6, m.grads / 1e6, m.optimizer / 1e6, m.activations / 1e6,
                m.scratch / 1e6, m.kernel_scratch / 1e6, w16, m.comm / 1e6, (double)mt_memory_total(&m) / 1e6, host);
    }
    fprintf(f, "(kernel scratch: what the GPU build's kernels borrow at once during a step; communication: NCCL's "
               "buffers, estimated; both 0 on the CPU build. Not counted: the CUDA context, about 0.5 GB a GPU)\n");
    if (any16)
        fprintf(f, "(16-bit weights: the parameters rounded once a step to the GEMMs' operand type, which they read "
                   "instead of rounding each weight into a copy per product; wgmma rung only)\n");
}

// =============================================================================================
// 9. DATA & TOKENIZER
// =============================================================================================
// Mirrors megatron/core/datasets/{indexed_dataset.py, gpt_dataset.py, blended_dataset.py,
// helpers.cpp} and tools/preprocess_data.py. The files are Megatron's, byte for byte.
#include <sys/mman.h>

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
    // PREFIX.bin or PREFIX.idx, as a file browser offers them, mean PREFIX
    size_t plen = strlen(d->prefix);
    if (plen > 4 && (strcmp(d->prefix + plen - 4, ".bin") == 0 || strcmp(d->prefix + plen - 4, ".idx") == 0))
        d->prefix[plen - 4] = 0;
    prefix = d->prefix;
    char path[MT_PATH_MAX + 8];
    snprintf(path, sizeof path, "%s.idx", prefix);
    const char *hint = "--data-path takes the prefix of PREFIX.bin/PREFIX.idx as written by ./preprocess (e.g. "
                       "data/my_dataset_text_document)";
    d->idx_map = mt__map_file(path, &d->idx_size, hint);
    const unsigned char *p = (const unsigned char *)d->idx_map;
    size_t header = 9 + 8 + 1 + 8 + 8;
    if (d->idx_size < 9 || memcmp(p, mt__idx_magic, 9) != 0)
        mt_fatal("%s is not a Megatron indexed dataset index (bad magic)\nhint: make it with ./preprocess", path);
    if (d->idx_size < header) mt_fatal("%s is truncated (%zu bytes, the header alone is %zu)\n"
                                       "hint: run ./preprocess again", path, d->idx_size, header);
    uint64_t version, S, D;
    memcpy(&version, p + 9, 8);
    d->dtype = p[17];
    memcpy(&S, p + 18, 8);
    memcpy(&D, p + 26, 8);
    if (version != 1) mt_fatal("%s has index version %llu; only version 1 (MMIDIDX) is known", path,
                               (unsigned long long)version);
    d->elem_size = mt__dtype_size(d->dtype);
    if (d->elem_size == 0 || d->dtype == 6 || d->dtype == 7)
        mt_fatal("%s has dtype code %d, which is not an integer token type", path, d->dtype);
    if (D < 1 || S > (1ull << 40)
        || D > (1ull << 40)) mt_fatal("%s has impossible counts (%llu sequences, %llu document "
                                      "entries)", path, (unsigned long long)S, (unsigned long long)D);
    size_t need = header + S * 4 + S * 8 + D * 8;
    if (d->idx_size < need)
        mt_fatal("%s is truncated: %zu bytes, but its header promises %llu sequences and %llu documents (%zu bytes)\n"
                 "hint: run ./preprocess again",
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
            mt_fatal("%s is shorter than %s.idx says (sequence %llu needs bytes up to %llu, the file has %zu)\n"
                     "hint: the .bin is truncated or belongs to another .idx; run ./preprocess again",
                     path, prefix, (unsigned long long)i,
                     (unsigned long long)((uint64_t)pointers[i] + (uint64_t)lengths[i] * d->elem_size), d->bin_size);
    }
    for (uint64_t i = 0; i < D; i++)
        if (docs[i] < 0 || (uint64_t)docs[i] > S || (i > 0 && docs[i] < docs[i - 1]))
            mt_fatal("%s.idx has a corrupt document index (entry %llu)", prefix, (unsigned long long)i);
    if ((uint64_t)docs[D - 1] != S) mt_fatal("%s.idx: the document index does not end at the sequence count", prefix);
    // the reader walks a document from its first sequence's pointer on, so a document's sequences
    // must lie back to back in .bin, as Megatron's builder writes them (one pass, O(S))
    for (uint64_t i = 0; i + 1 < D; i++)
        for (int64_t q = docs[i] + 1; q < docs[i + 1]; q++) {
            int64_t want = pointers[q - 1] + (int64_t)lengths[q - 1] * (int64_t)d->elem_size;
            if (pointers[q] != want)
                mt_fatal("%s.idx: the sequences of document %llu are not adjacent in %s (sequence %lld starts at byte "
                         "%lld, not %lld)\nhint: the index is damaged or was not written by Megatron's builder; run "
                         "./preprocess again", prefix, (unsigned long long)i, path, (long long)q,
                         (long long)pointers[q], (long long)want);
        }
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
    if (b->elem_size == 0 || dtype_code == 6
        || dtype_code == 7) mt_fatal("indexed builder: dtype code %d is not an integer type", dtype_code);
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
        if (end == s || w[n] < 0) mt_fatal("--split '%s' is not a list of up to 3 non-negative numbers like 949,50,1",
                                           split);
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
        mt_fatal("the %s split of %s has %lld documents and %lld tokens, too few for one sample of %d tokens\n"
                 "hint: use more data, a shorter --seq-length, or another --split",
                 split_id == 0 ? "train" : split_id == 1 ? "valid" : "test", ds->prefix, (long long)ndocs,
                 (long long)tokens_per_epoch, T + 1);
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

// --mock-data: Megatron's MockGPTLowLevelDataset (megatron/core/datasets/gpt_dataset.py), whose
// document i is the ids 1, 2, ..., n_i - 1 then <|endoftext|> (the vocabulary's last id, GPT-2's),
// n_i drawn in [1, 4096). Here 1,000 such documents (Megatron's 100,000 would be 200 M tokens;
// the samples repeat them epoch after epoch), n_i from --seed, an id past the vocabulary wrapped
// back into [1, V - 2]. Written with the indexed-dataset builder to a temporary PREFIX (in $TMPDIR
// or /tmp, this process's), opened, and removed from the directory at once: the mapping keeps it.
static void mt__mock_dataset_open(mt_indexed_dataset *ds, const mt_config *cfg) {
    enum { DOCS = 1000, MAX_LEN = 4096 };
    int V = cfg->model.vocab_size, eod = V - 1;
    if (V < 3) mt_fatal("--mock-data needs a vocabulary of at least 3 ids (it has %d)", V);
    const char *dir = getenv("TMPDIR");
    char prefix[MT_PATH_MAX], bin[MT_PATH_MAX + 8], idx[MT_PATH_MAX + 8];
    snprintf(prefix, sizeof prefix, "%s/megatron_mock_data_%ld", dir && dir[0] ? dir : "/tmp", (long)getpid());
    mt_indexed_builder *b = mt_indexed_builder_open(prefix, mt_dtype_for_vocab(V));
    int32_t *doc = (int32_t *)mt_malloc(sizeof(int32_t) * MAX_LEN, "mock document");
    for (int i = 0; i < DOCS; i++) {
        int n = 1 + (int)(mt_hash64(cfg->train.seed * 1000003ull + (uint64_t)i) % (MAX_LEN - 1));   // [1, 4096)
        for (int k = 0; k < n - 1; k++) doc[k] = 1 + k % (V - 2);
        doc[n - 1] = eod;
        mt_indexed_builder_add_document(b, doc, (size_t)n);
    }
    free(doc);
    mt_indexed_builder_finish(b);
    mt_indexed_dataset_open(ds, prefix);
    snprintf(bin, sizeof bin, "%s.bin", prefix);
    snprintf(idx, sizeof idx, "%s.idx", prefix);
    remove(bin);
    remove(idx);
}

void mt_data_init(mt_data *d, const mt_config *cfg) {
    memset(d, 0, sizeof *d);
    const mt_train_config *t = &cfg->train;
    if (t->num_data_paths == 0 && !t->mock_data) mt_fatal("no --data-path given\n"
                                                           "hint: make one with ./preprocess, e.g. --data-path "
                                                           "data/my_dataset_text_document (or --mock-data)");
    d->num_paths = t->mock_data ? 1 : t->num_data_paths;
    int64_t gbs = t->global_batch_size;
    int64_t need[3];
    need[0] = (int64_t)t->train_iters * gbs;
    need[1] = (t->eval_interval > 0 ? (int64_t)(t->train_iters / t->eval_interval + 1) : 1) * t->eval_iters * gbs;
    need[2] = (int64_t)t->eval_iters * gbs;
    double weights[MT_MAX_DATA_PATHS];
    int64_t bounds[MT_MAX_DATA_PATHS][4];
    double total_tokens = 0;
    for (int p = 0; p < d->num_paths; p++) {
        if (t->mock_data) mt__mock_dataset_open(&d->files[p], cfg);
        else mt_indexed_dataset_open(&d->files[p], t->data_path[p]);
        mt_split_documents(t->split, (int64_t)d->files[p].num_documents, bounds[p]);
        // no weights given: weigh by size, as Megatron does for a plain list of prefixes
        double tokens = (double)d->files[p].bin_size / (double)d->files[p].elem_size;
        weights[p] = t->data_weight[p] > 0 ? t->data_weight[p] : tokens;
        total_tokens += weights[p];
    }
    for (int p = 0; p < d->num_paths; p++) if (t->data_weight[p] <= 0) weights[p] /= total_tokens;
    for (int s = 0; s < 3; s++) {
        int ok = need[s] > 0;
        for (int p = 0; p < d->num_paths; p++) if (bounds[p][s + 1] <= bounds[p][s]) ok = 0;
        if (!ok) {
            if (s == 0) mt_fatal("the train split is empty or no training is asked for\n"
                                 "hint: check --split (e.g. 949,50,1) and --train-iters");
            continue;
        }
        mt_blended_dataset *b = &d->split[s];
        b->num_datasets = d->num_paths;
        for (int p = 0; p < d->num_paths; p++) {
            // each part gets its share of the samples plus 0.5% (Megatron's margin for rounding)
            int64_t part_need = d->num_paths == 1 ? need[s] : (int64_t)ceil(weights[p] * (double)need[s] * 1.005) + 1;
            mt_gpt_dataset_build(&b->parts[p], &d->files[p], bounds[p][s], bounds[p][s + 1], cfg->model.seq_length,
                                 part_need,
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

// ---------------------------------------------------------------------------------------------
// GPT-2 tokenizer: byte-level BPE, the way OpenAI's tiktoken runs it (its "gpt2" encoding)
//
// Three steps turn text into ids:
//   1. pre-tokenization: GPT-2's regex cuts the text into pieces (words with their leading
//      space, digit runs, punctuation runs, whitespace runs). BPE never merges across pieces.
//        'Hello world!!' -> 'Hello' ' world' '!!'
//   2. BPE on each piece's bytes: start from one token per byte, then repeatedly merge the
//      adjacent pair whose merged token has the lowest rank (= was learned earliest), until
//      no adjacent pair forms a token.   ' world' -> ' ' 'w' 'o' 'r' 'l' 'd' -> ... -> ' world'
//   3. the ids of the final tokens, from vocab.json.
// Decoding is the reverse of step 3 only: concatenate the tokens' bytes.
//
// "Byte-level" means tokens are byte strings, so every input has an encoding (one token per
// byte at worst) and decoding gives back the exact bytes. The files store a token as text: each
// byte is written as one printable character (bytes_to_unicode in OpenAI's encoder.py):
//   bytes '!'..'~', 0xA1..0xAC, 0xAE..0xFF stand for themselves (as code points U+0021.. etc.)
//   the other 68 bytes (controls, space, 0x7F..0xA0, 0xAD) become U+0100.. in byte order
// so a space is U+0120 (a G with a dot above) and "\n" is U+010A: vocab.json's "\u0120the" is " the".
//
// Megatron-LM runs its own copy of OpenAI's encoder.py (megatron/training/tokenizer/
// gpt2_tokenization.py); tiktoken is the reference here because its ids are the ones tests
// can check against (tests/tiktoken_fuzz.py). The two agree on GPT-2's files.
// ---------------------------------------------------------------------------------------------

void mt_int_list_reserve(mt_int_list *l, size_t extra) {
    if (l->len + extra <= l->cap) return;
    size_t cap = l->cap ? l->cap : 256;
    while (cap < l->len + extra) cap *= 2;
    l->data = (int32_t *)mt_realloc(l->data, cap * sizeof(int32_t), "token ids");
    l->cap = cap;
}

void mt_int_list_push(mt_int_list *l, int32_t v) {
    if (l->len == l->cap) mt_int_list_reserve(l, 1);
    l->data[l->len++] = v;
}

void mt_int_list_free(mt_int_list *l) {
    free(l->data);
    l->data = NULL;
    l->len = l->cap = 0;
}

// ---------------------------------------------------------------------------------------------
// hashing: one string hash and one integer mixer for the three hash maps below
// (vocab bytes -> id, (id, id) -> merge, word -> ids). All three use open addressing with
// linear probing in a power-of-two table kept at most half full, so a lookup is one or two
// cache lines. The string hash eats 8 bytes per multiply; most words are shorter than that.
static uint64_t mt__mix64(uint64_t x) {
    x ^= x >> 32;
    x *= 0xd6e8feb86659fd93ull;
    x ^= x >> 32;
    x *= 0xd6e8feb86659fd93ull;
    x ^= x >> 32;
    return x;
}

// *head gets the first 8 bytes (zero-padded): the vocabulary map compares that word first
static uint64_t mt__hash_bytes(const unsigned char *p, size_t n, uint64_t *head) {
    uint64_t h = 0x243f6a8885a308d3ull ^ (uint64_t)n, w = 0;
    if (n >= 8) {
        memcpy(head, p, 8);
        while (n >= 8) {
            memcpy(&w, p, 8);
            h = (h ^ w) * 0x9e3779b97f4a7c15ull;
            h ^= h >> 29;
            p += 8;
            n -= 8;
        }
        w = 0;
        for (size_t i = 0; i < n; i++) w |= (uint64_t)p[i] << (8 * i);
    } else {
        for (size_t i = 0; i < n; i++) w |= (uint64_t)p[i] << (8 * i);
        *head = w;
    }
    return mt__mix64(h ^ w);
}

static size_t mt__pow2_at_least(size_t n) {
    size_t p = 16;
    while (p < n) p *= 2;
    return p;
}

// ---------------------------------------------------------------------------------------------
// Unicode character classes for GPT-2's pattern
// The pattern (below) asks of each character: is it a letter \p{L} (general category Lu Ll Lt
// Lm Lo), a number \p{N} (Nd Nl No), whitespace \s (the White_Space property), or other? ASCII
// answers from a 128-entry table; any other code point from the generated step table: entry k
// is (first code point << 2) | class and the class lasts until entry k+1, so the answer is one
// binary search (11 steps over ~1,560 entries). Regenerate with tools/gen_unicode_tables.py.
enum { MT__OTHER = 0, MT__LETTER = 1, MT__NUMBER = 2, MT__SPACE = 3 };

static const unsigned char mt__ascii_class[128] = {
    0,0,0,0,0,0,0,0,0,3,3,3,3,3,0,0,   // \t \n \v \f \r are White_Space; 0x1C..0x1F are not
    0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,
    3,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,   // space; punctuation (the apostrophe too) is other
    2,2,2,2,2,2,2,2,2,2,0,0,0,0,0,0,   // digits
    0,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,   // A..Z
    1,1,1,1,1,1,1,1,1,1,1,0,0,0,0,0,
    0,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,   // a..z
    1,1,1,1,1,1,1,1,1,1,1,0,0,0,0,0,
};

// BEGIN GENERATED: tools/gen_unicode_tables.py (Unicode 15.0.0; do not edit by hand)
// 1562 steps; code points: 136104 letters, 1831 numbers, 25 spaces, the rest other.
// entry = (first code point << 2) | class; class 0 other, 1 letter (L), 2 number (N), 3 space (\s)
#define MT__UNICODE_VERSION "15.0.0"
static const uint32_t mt__unicode_steps[1562] = {
    0x0000000,0x0000027,0x0000038,0x0000083,0x0000084,0x00000c2,0x00000e8,0x0000105,0x000016c,0x0000185,0x00001ec,
    0x0000217,
    0x0000218,0x0000283,0x0000284,0x00002a9,0x00002ac,0x00002ca,0x00002d0,0x00002d5,0x00002d8,0x00002e6,0x00002e9,
    0x00002ec,
    0x00002f2,0x00002fc,0x0000301,0x000035c,0x0000361,0x00003dc,0x00003e1,0x0000b08,0x0000b19,0x0000b48,0x0000b81,
    0x0000b94,
    0x0000bb1,0x0000bb4,0x0000bb9,0x0000bbc,0x0000dc1,0x0000dd4,0x0000dd9,0x0000de0,0x0000de9,0x0000df8,0x0000dfd,
    0x0000e00,
    0x0000e19,0x0000e1c,0x0000e21,0x0000e2c,0x0000e31,0x0000e34,0x0000e39,0x0000e88,0x0000e8d,0x0000fd8,0x0000fdd,
    0x0001208,
    0x0001229,0x00014c0,0x00014c5,0x000155c,0x0001565,0x0001568,0x0001581,0x0001624,0x0001741,0x00017ac,0x00017bd,
    0x00017cc,
    0x0001881,0x000192c,0x0001982,0x00019a8,0x00019b9,0x00019c0,0x00019c5,0x0001b50,0x0001b55,0x0001b58,0x0001b95,
    0x0001b9c,
    0x0001bb9,0x0001bc2,0x0001be9,0x0001bf4,0x0001bfd,0x0001c00,0x0001c41,0x0001c44,0x0001c49,0x0001cc0,0x0001d35,
    0x0001e98,
    0x0001ec5,0x0001ec8,0x0001f02,0x0001f29,0x0001fac,0x0001fd1,0x0001fd8,0x0001fe9,0x0001fec,0x0002001,0x0002058,
    0x0002069,
    0x000206c,0x0002091,0x0002094,0x00020a1,0x00020a4,0x0002101,0x0002164,0x0002181,0x00021ac,0x00021c1,0x0002220,
    0x0002225,
    0x000223c,0x0002281,0x0002328,0x0002411,0x00024e8,0x00024f5,0x00024f8,0x0002541,0x0002544,0x0002561,0x0002588,
    0x000259a,
    0x00025c0,0x00025c5,0x0002604,0x0002615,0x0002634,0x000263d,0x0002644,0x000264d,0x00026a4,0x00026a9,0x00026c4,
    0x00026c9,
    0x00026cc,0x00026d9,0x00026e8,0x00026f5,0x00026f8,0x0002739,0x000273c,0x0002771,0x0002778,0x000277d,0x0002788,
    0x000279a,
    0x00027c1,0x00027c8,0x00027d2,0x00027e8,0x00027f1,0x00027f4,0x0002815,0x000282c,0x000283d,0x0002844,0x000284d,
    0x00028a4,
    0x00028a9,0x00028c4,0x00028c9,0x00028d0,0x00028d5,0x00028dc,0x00028e1,0x00028e8,0x0002965,0x0002974,0x0002979,
    0x000297c,
    0x000299a,0x00029c0,0x00029c9,0x00029d4,0x0002a15,0x0002a38,0x0002a3d,0x0002a48,0x0002a4d,0x0002aa4,0x0002aa9,
    0x0002ac4,
    0x0002ac9,0x0002ad0,0x0002ad5,0x0002ae8,0x0002af5,0x0002af8,0x0002b41,0x0002b44,0x0002b81,0x0002b88,0x0002b9a,
    0x0002bc0,
    0x0002be5,0x0002be8,0x0002c15,0x0002c34,0x0002c3d,0x0002c44,0x0002c4d,0x0002ca4,0x0002ca9,0x0002cc4,0x0002cc9,
    0x0002cd0,
    0x0002cd5,0x0002ce8,0x0002cf5,0x0002cf8,0x0002d71,0x0002d78,0x0002d7d,0x0002d88,0x0002d9a,0x0002dc0,0x0002dc5,
    0x0002dca,
    0x0002de0,0x0002e0d,0x0002e10,0x0002e15,0x0002e2c,0x0002e39,0x0002e44,0x0002e49,0x0002e58,0x0002e65,0x0002e6c,
    0x0002e71,
    0x0002e74,0x0002e79,0x0002e80,0x0002e8d,0x0002e94,0x0002ea1,0x0002eac,0x0002eb9,0x0002ee8,0x0002f41,0x0002f44,
    0x0002f9a,
    0x0002fcc,0x0003015,0x0003034,0x0003039,0x0003044,0x0003049,0x00030a4,0x00030a9,0x00030e8,0x00030f5,0x00030f8,
    0x0003161,
    0x000316c,0x0003175,0x0003178,0x0003181,0x0003188,0x000319a,0x00031c0,0x00031e2,0x00031fc,0x0003201,0x0003204,
    0x0003215,
    0x0003234,0x0003239,0x0003244,0x0003249,0x00032a4,0x00032a9,0x00032d0,0x00032d5,0x00032e8,0x00032f5,0x00032f8,
    0x0003375,
    0x000337c,0x0003381,0x0003388,0x000339a,0x00033c0,0x00033c5,0x00033cc,0x0003411,0x0003434,0x0003439,0x0003444,
    0x0003449,
    0x00034ec,0x00034f5,0x00034f8,0x0003539,0x000353c,0x0003551,0x000355c,0x0003562,0x000357d,0x0003588,0x000359a,
    0x00035e4,
    0x00035e9,0x0003600,0x0003615,0x000365c,0x0003669,0x00036c8,0x00036cd,0x00036f0,0x00036f5,0x00036f8,0x0003701,
    0x000371c,
    0x000379a,0x00037c0,0x0003805,0x00038c4,0x00038c9,0x00038d0,0x0003901,0x000391c,0x0003942,0x0003968,0x0003a05,
    0x0003a0c,
    0x0003a11,0x0003a14,0x0003a19,0x0003a2c,0x0003a31,0x0003a90,0x0003a95,0x0003a98,0x0003a9d,0x0003ac4,0x0003ac9,
    0x0003ad0,
    0x0003af5,0x0003af8,0x0003b01,0x0003b14,0x0003b19,0x0003b1c,0x0003b42,0x0003b68,0x0003b71,0x0003b80,0x0003c01,
    0x0003c04,
    0x0003c82,0x0003cd0,0x0003d01,0x0003d20,0x0003d25,0x0003db4,0x0003e21,0x0003e34,0x0004001,0x00040ac,0x00040fd,
    0x0004102,
    0x0004128,0x0004141,0x0004158,0x0004169,0x0004178,0x0004185,0x0004188,0x0004195,0x000419c,0x00041b9,0x00041c4,
    0x00041d5,
    0x0004208,0x0004239,0x000423c,0x0004242,0x0004268,0x0004281,0x0004318,0x000431d,0x0004320,0x0004335,0x0004338,
    0x0004341,
    0x00043ec,0x00043f1,0x0004924,0x0004929,0x0004938,0x0004941,0x000495c,0x0004961,0x0004964,0x0004969,0x0004978,
    0x0004981,
    0x0004a24,0x0004a29,0x0004a38,0x0004a41,0x0004ac4,0x0004ac9,0x0004ad8,0x0004ae1,0x0004afc,0x0004b01,0x0004b04,
    0x0004b09,
    0x0004b18,0x0004b21,0x0004b5c,0x0004b61,0x0004c44,0x0004c49,0x0004c58,0x0004c61,0x0004d6c,0x0004da6,0x0004df4,
    0x0004e01,
    0x0004e40,0x0004e81,0x0004fd8,0x0004fe1,0x0004ff8,0x0005005,0x00059b4,0x00059bd,0x0005a03,0x0005a05,0x0005a6c,
    0x0005a81,
    0x0005bac,0x0005bba,0x0005bc5,0x0005be4,0x0005c01,0x0005c48,0x0005c7d,0x0005cc8,0x0005d01,0x0005d48,0x0005d81,
    0x0005db4,
    0x0005db9,0x0005dc4,0x0005e01,0x0005ed0,0x0005f5d,0x0005f60,0x0005f71,0x0005f74,0x0005f82,0x0005fa8,0x0005fc2,
    0x0005fe8,
    0x0006042,0x0006068,0x0006081,0x00061e4,0x0006201,0x0006214,0x000621d,0x00062a4,0x00062a9,0x00062ac,0x00062c1,
    0x00063d8,
    0x0006401,0x000647c,0x000651a,0x0006541,0x00065b8,0x00065c1,0x00065d4,0x0006601,0x00066b0,0x00066c1,0x0006728,
    0x0006742,
    0x000676c,0x0006801,0x000685c,0x0006881,0x0006954,0x0006a02,0x0006a28,0x0006a42,0x0006a68,0x0006a9d,0x0006aa0,
    0x0006c15,
    0x0006cd0,0x0006d15,0x0006d34,0x0006d42,0x0006d68,0x0006e0d,0x0006e84,0x0006eb9,0x0006ec2,0x0006ee9,0x0006f98,
    0x0007001,
    0x0007090,0x0007102,0x0007128,0x0007135,0x0007142,0x0007169,0x00071f8,0x0007201,0x0007224,0x0007241,0x00072ec,
    0x00072f5,
    0x0007300,0x00073a5,0x00073b4,0x00073b9,0x00073d0,0x00073d5,0x00073dc,0x00073e9,0x00073ec,0x0007401,0x0007700,
    0x0007801,
    0x0007c58,0x0007c61,0x0007c78,0x0007c81,0x0007d18,0x0007d21,0x0007d38,0x0007d41,0x0007d60,0x0007d65,0x0007d68,
    0x0007d6d,
    0x0007d70,0x0007d75,0x0007d78,0x0007d7d,0x0007df8,0x0007e01,0x0007ed4,0x0007ed9,0x0007ef4,0x0007ef9,0x0007efc,
    0x0007f09,
    0x0007f14,0x0007f19,0x0007f34,0x0007f41,0x0007f50,0x0007f59,0x0007f70,0x0007f81,0x0007fb4,0x0007fc9,0x0007fd4,
    0x0007fd9,
    0x0007ff4,0x0008003,0x000802c,0x00080a3,0x00080a8,0x00080bf,0x00080c0,0x000817f,0x0008180,0x00081c2,0x00081c5,
    0x00081c8,
    0x00081d2,0x00081e8,0x00081fd,0x0008202,0x0008228,0x0008241,0x0008274,0x0008409,0x000840c,0x000841d,0x0008420,
    0x0008429,
    0x0008450,0x0008455,0x0008458,0x0008465,0x0008478,0x0008491,0x0008494,0x0008499,0x000849c,0x00084a1,0x00084a4,
    0x00084a9,
    0x00084b8,0x00084bd,0x00084e8,0x00084f1,0x0008500,0x0008515,0x0008528,0x0008539,0x000853c,0x0008542,0x000860d,
    0x0008616,
    0x0008628,0x0009182,0x0009270,0x00093aa,0x0009400,0x0009dda,0x0009e50,0x000b001,0x000b394,0x000b3ad,0x000b3bc,
    0x000b3c9,
    0x000b3d0,0x000b3f6,0x000b3f8,0x000b401,0x000b498,0x000b49d,0x000b4a0,0x000b4b5,0x000b4b8,0x000b4c1,0x000b5a0,
    0x000b5bd,
    0x000b5c0,0x000b601,0x000b65c,0x000b681,0x000b69c,0x000b6a1,0x000b6bc,0x000b6c1,0x000b6dc,0x000b6e1,0x000b6fc,
    0x000b701,
    0x000b71c,0x000b721,0x000b73c,0x000b741,0x000b75c,0x000b761,0x000b77c,0x000b8bd,0x000b8c0,0x000c003,0x000c004,
    0x000c015,
    0x000c01e,0x000c020,0x000c086,0x000c0a8,0x000c0c5,0x000c0d8,0x000c0e2,0x000c0ed,0x000c0f4,0x000c105,0x000c25c,
    0x000c275,
    0x000c280,0x000c285,0x000c3ec,0x000c3f1,0x000c400,0x000c415,0x000c4c0,0x000c4c5,0x000c63c,0x000c64a,0x000c658,
    0x000c681,
    0x000c700,0x000c7c1,0x000c800,0x000c882,0x000c8a8,0x000c922,0x000c940,0x000c946,0x000c980,0x000ca02,0x000ca28,
    0x000cac6,
    0x000cb00,0x000d001,0x0013700,0x0013801,0x0029234,0x0029341,0x00293f8,0x0029401,0x0029834,0x0029841,0x0029882,
    0x00298a9,
    0x00298b0,0x0029901,0x00299bc,0x00299fd,0x0029a78,0x0029a81,0x0029b9a,0x0029bc0,0x0029c5d,0x0029c80,0x0029c89,
    0x0029e24,
    0x0029e2d,0x0029f2c,0x0029f41,0x0029f48,0x0029f4d,0x0029f50,0x0029f55,0x0029f68,0x0029fc9,0x002a008,0x002a00d,
    0x002a018,
    0x002a01d,0x002a02c,0x002a031,0x002a08c,0x002a0c2,0x002a0d8,0x002a101,0x002a1d0,0x002a209,0x002a2d0,0x002a342,
    0x002a368,
    0x002a3c9,0x002a3e0,0x002a3ed,0x002a3f0,0x002a3f5,0x002a3fc,0x002a402,0x002a429,0x002a498,0x002a4c1,0x002a51c,
    0x002a581,
    0x002a5f4,0x002a611,0x002a6cc,0x002a73d,0x002a742,0x002a768,0x002a781,0x002a794,0x002a799,0x002a7c2,0x002a7e9,
    0x002a7fc,
    0x002a801,0x002a8a4,0x002a901,0x002a90c,0x002a911,0x002a930,0x002a942,0x002a968,0x002a981,0x002a9dc,0x002a9e9,
    0x002a9ec,
    0x002a9f9,0x002aac0,0x002aac5,0x002aac8,0x002aad5,0x002aadc,0x002aae5,0x002aaf8,0x002ab01,0x002ab04,0x002ab09,
    0x002ab0c,
    0x002ab6d,0x002ab78,0x002ab81,0x002abac,0x002abc9,0x002abd4,0x002ac05,0x002ac1c,0x002ac25,0x002ac3c,0x002ac45,
    0x002ac5c,
    0x002ac81,0x002ac9c,0x002aca1,0x002acbc,0x002acc1,0x002ad6c,0x002ad71,0x002ada8,0x002adc1,0x002af8c,0x002afc2,
    0x002afe8,
    0x002b001,0x0035e90,0x0035ec1,0x0035f1c,0x0035f2d,0x0035ff0,0x003e401,0x003e9b8,0x003e9c1,0x003eb68,0x003ec01,
    0x003ec1c,
    0x003ec4d,0x003ec60,0x003ec75,0x003ec78,0x003ec7d,0x003eca4,0x003eca9,0x003ecdc,0x003ece1,0x003ecf4,0x003ecf9,
    0x003ecfc,
    0x003ed01,0x003ed08,0x003ed0d,0x003ed14,0x003ed19,0x003eec8,0x003ef4d,0x003f4f8,0x003f541,0x003f640,0x003f649,
    0x003f720,
    0x003f7c1,0x003f7f0,0x003f9c1,0x003f9d4,0x003f9d9,0x003fbf4,0x003fc42,0x003fc68,0x003fc85,0x003fcec,0x003fd05,
    0x003fd6c,
    0x003fd99,0x003fefc,0x003ff09,0x003ff20,0x003ff29,0x003ff40,0x003ff49,0x003ff60,0x003ff69,0x003ff74,0x0040001,
    0x0040030,
    0x0040035,0x004009c,0x00400a1,0x00400ec,0x00400f1,0x00400f8,0x00400fd,0x0040138,0x0040141,0x0040178,0x0040201,
    0x00403ec,
    0x004041e,0x00404d0,0x0040502,0x00405e4,0x004062a,0x0040630,0x0040a01,0x0040a74,0x0040a81,0x0040b44,0x0040b86,
    0x0040bf0,
    0x0040c01,0x0040c82,0x0040c90,0x0040cb5,0x0040d06,0x0040d09,0x0040d2a,0x0040d2c,0x0040d41,0x0040dd8,0x0040e01,
    0x0040e78,
    0x0040e81,0x0040f10,0x0040f21,0x0040f40,0x0040f46,0x0040f58,0x0041001,0x0041278,0x0041282,0x00412a8,0x00412c1,
    0x0041350,
    0x0041361,0x00413f0,0x0041401,0x00414a0,0x00414c1,0x0041590,0x00415c1,0x00415ec,0x00415f1,0x004162c,0x0041631,
    0x004164c,
    0x0041651,0x0041658,0x004165d,0x0041688,0x004168d,0x00416c8,0x00416cd,0x00416e8,0x00416ed,0x00416f4,0x0041801,
    0x0041cdc,
    0x0041d01,0x0041d58,0x0041d81,0x0041da0,0x0041e01,0x0041e18,0x0041e1d,0x0041ec4,0x0041ec9,0x0041eec,0x0042001,
    0x0042018,
    0x0042021,0x0042024,0x0042029,0x00420d8,0x00420dd,0x00420e4,0x00420f1,0x00420f4,0x00420fd,0x0042158,0x0042162,
    0x0042181,
    0x00421dc,0x00421e6,0x0042201,0x004227c,0x004229e,0x00422c0,0x0042381,0x00423cc,0x00423d1,0x00423d8,0x00423ee,
    0x0042401,
    0x004245a,0x0042470,0x0042481,0x00424e8,0x0042601,0x00426e0,0x00426f2,0x00426f9,0x0042702,0x0042740,0x004274a,
    0x0042801,
    0x0042804,0x0042841,0x0042850,0x0042855,0x0042860,0x0042865,0x00428d8,0x0042902,0x0042924,0x0042981,0x00429f6,
    0x00429fc,
    0x0042a01,0x0042a76,0x0042a80,0x0042b01,0x0042b20,0x0042b25,0x0042b94,0x0042bae,0x0042bc0,0x0042c01,0x0042cd8,
    0x0042d01,
    0x0042d58,0x0042d62,0x0042d81,0x0042dcc,0x0042de2,0x0042e01,0x0042e48,0x0042ea6,0x0042ec0,0x0043001,0x0043124,
    0x0043201,
    0x00432cc,0x0043301,0x00433cc,0x00433ea,0x0043401,0x0043490,0x00434c2,0x00434e8,0x0043982,0x00439fc,0x0043a01,
    0x0043aa8,
    0x0043ac1,0x0043ac8,0x0043c01,0x0043c76,0x0043c9d,0x0043ca0,0x0043cc1,0x0043d18,0x0043d46,0x0043d54,0x0043dc1,
    0x0043e08,
    0x0043ec1,0x0043f16,0x0043f30,0x0043f81,0x0043fdc,0x004400d,0x00440e0,0x004414a,0x00441c0,0x00441c5,0x00441cc,
    0x00441d5,
    0x00441d8,0x004420d,0x00442c0,0x0044341,0x00443a4,0x00443c2,0x00443e8,0x004440d,0x004449c,0x00444da,0x0044500,
    0x0044511,
    0x0044514,0x004451d,0x0044520,0x0044541,0x00445cc,0x00445d9,0x00445dc,0x004460d,0x00446cc,0x0044705,0x0044714,
    0x0044742,
    0x0044769,0x004476c,0x0044771,0x0044774,0x0044786,0x00447d4,0x0044801,0x0044848,0x004484d,0x00448b0,0x00448fd,
    0x0044904,
    0x0044a01,0x0044a1c,0x0044a21,0x0044a24,0x0044a29,0x0044a38,0x0044a3d,0x0044a78,0x0044a7d,0x0044aa4,0x0044ac1,
    0x0044b7c,
    0x0044bc2,0x0044be8,0x0044c15,0x0044c34,0x0044c3d,0x0044c44,0x0044c4d,0x0044ca4,0x0044ca9,0x0044cc4,0x0044cc9,
    0x0044cd0,
    0x0044cd5,0x0044ce8,0x0044cf5,0x0044cf8,0x0044d41,0x0044d44,0x0044d75,0x0044d88,0x0045001,0x00450d4,0x004511d,
    0x004512c,
    0x0045142,0x0045168,0x004517d,0x0045188,0x0045201,0x00452c0,0x0045311,0x0045318,0x004531d,0x0045320,0x0045342,
    0x0045368,
    0x0045601,0x00456bc,0x0045761,0x0045770,0x0045801,0x00458c0,0x0045911,0x0045914,0x0045942,0x0045968,0x0045a01,
    0x0045aac,
    0x0045ae1,0x0045ae4,0x0045b02,0x0045b28,0x0045c01,0x0045c6c,0x0045cc2,0x0045cf0,0x0045d01,0x0045d1c,0x0046001,
    0x00460b0,
    0x0046281,0x0046382,0x00463cc,0x00463fd,0x004641c,0x0046425,0x0046428,0x0046431,0x0046450,0x0046455,0x004645c,
    0x0046461,
    0x00464c0,0x00464fd,0x0046500,0x0046505,0x0046508,0x0046542,0x0046568,0x0046681,0x00466a0,0x00466a9,0x0046744,
    0x0046785,
    0x0046788,0x004678d,0x0046790,0x0046801,0x0046804,0x004682d,0x00468cc,0x00468e9,0x00468ec,0x0046941,0x0046944,
    0x0046971,
    0x0046a28,0x0046a75,0x0046a78,0x0046ac1,0x0046be4,0x0047001,0x0047024,0x0047029,0x00470bc,0x0047101,0x0047104,
    0x0047142,
    0x00471b4,0x00471c9,0x0047240,0x0047401,0x004741c,0x0047421,0x0047428,0x004742d,0x00474c4,0x0047519,0x004751c,
    0x0047542,
    0x0047568,0x0047581,0x0047598,0x004759d,0x00475a4,0x00475a9,0x0047628,0x0047661,0x0047664,0x0047682,0x00476a8,
    0x0047b81,
    0x0047bcc,0x0047c09,0x0047c0c,0x0047c11,0x0047c44,0x0047c49,0x0047cd0,0x0047d42,0x0047d68,0x0047ec1,0x0047ec4,
    0x0047f02,
    0x0047f54,0x0048001,0x0048e68,0x0049002,0x00491bc,0x0049201,0x0049510,0x004be41,0x004bfc4,0x004c001,0x004d0c0,
    0x004d105,
    0x004d11c,0x0051001,0x005191c,0x005a001,0x005a8e4,0x005a901,0x005a97c,0x005a982,0x005a9a8,0x005a9c1,0x005aafc,
    0x005ab02,
    0x005ab28,0x005ab41,0x005abb8,0x005ac01,0x005acc0,0x005ad01,0x005ad10,0x005ad42,0x005ad68,0x005ad6e,0x005ad88,
    0x005ad8d,
    0x005ade0,0x005adf5,0x005ae40,0x005b901,0x005ba02,0x005ba5c,0x005bc01,0x005bd2c,0x005bd41,0x005bd44,0x005be4d,
    0x005be80,
    0x005bf81,0x005bf88,0x005bf8d,0x005bf90,0x005c001,0x0061fe0,0x0062001,0x0063358,0x0063401,0x0063424,0x006bfc1,
    0x006bfd0,
    0x006bfd5,0x006bff0,0x006bff5,0x006bffc,0x006c001,0x006c48c,0x006c4c9,0x006c4cc,0x006c541,0x006c54c,0x006c555,
    0x006c558,
    0x006c591,0x006c5a0,0x006c5c1,0x006cbf0,0x006f001,0x006f1ac,0x006f1c1,0x006f1f4,0x006f201,0x006f224,0x006f241,
    0x006f268,
    0x0074b02,0x0074b50,0x0074b82,0x0074bd0,0x0074d82,0x0074de4,0x0075001,0x0075154,0x0075159,0x0075274,0x0075279,
    0x0075280,
    0x0075289,0x007528c,0x0075295,0x007529c,0x00752a5,0x00752b4,0x00752b9,0x00752e8,0x00752ed,0x00752f0,0x00752f5,
    0x0075310,
    0x0075315,0x0075418,0x007541d,0x007542c,0x0075435,0x0075454,0x0075459,0x0075474,0x0075479,0x00754e8,0x00754ed,
    0x00754fc,
    0x0075501,0x0075514,0x0075519,0x007551c,0x0075529,0x0075544,0x0075549,0x0075a98,0x0075aa1,0x0075b04,0x0075b09,
    0x0075b6c,
    0x0075b71,0x0075bec,0x0075bf1,0x0075c54,0x0075c59,0x0075cd4,0x0075cd9,0x0075d3c,0x0075d41,0x0075dbc,0x0075dc1,
    0x0075e24,
    0x0075e29,0x0075ea4,0x0075ea9,0x0075f0c,0x0075f11,0x0075f30,0x0075f3a,0x0076000,0x0077c01,0x0077c7c,0x0077c95,
    0x0077cac,
    0x00780c1,0x00781b8,0x0078401,0x00784b4,0x00784dd,0x00784f8,0x0078502,0x0078528,0x0078539,0x007853c,0x0078a41,
    0x0078ab8,
    0x0078b01,0x0078bb0,0x0078bc2,0x0078be8,0x0079341,0x00793b0,0x00793c2,0x00793e8,0x0079f81,0x0079f9c,0x0079fa1,
    0x0079fb0,
    0x0079fb5,0x0079fbc,0x0079fc1,0x0079ffc,0x007a001,0x007a314,0x007a31e,0x007a340,0x007a401,0x007a510,0x007a52d,
    0x007a530,
    0x007a542,0x007a568,0x007b1c6,0x007b2b0,0x007b2b6,0x007b2c0,0x007b2c6,0x007b2d4,0x007b406,0x007b4b8,0x007b4be,
    0x007b4f8,
    0x007b801,0x007b810,0x007b815,0x007b880,0x007b885,0x007b88c,0x007b891,0x007b894,0x007b89d,0x007b8a0,0x007b8a5,
    0x007b8cc,
    0x007b8d1,0x007b8e0,0x007b8e5,0x007b8e8,0x007b8ed,0x007b8f0,0x007b909,0x007b90c,0x007b91d,0x007b920,0x007b925,
    0x007b928,
    0x007b92d,0x007b930,0x007b935,0x007b940,0x007b945,0x007b94c,0x007b951,0x007b954,0x007b95d,0x007b960,0x007b965,
    0x007b968,
    0x007b96d,0x007b970,0x007b975,0x007b978,0x007b97d,0x007b980,0x007b985,0x007b98c,0x007b991,0x007b994,0x007b99d,
    0x007b9ac,
    0x007b9b1,0x007b9cc,0x007b9d1,0x007b9e0,0x007b9e5,0x007b9f4,0x007b9f9,0x007b9fc,0x007ba01,0x007ba28,0x007ba2d,
    0x007ba70,
    0x007ba85,0x007ba90,0x007ba95,0x007baa8,0x007baad,0x007baf0,0x007c402,0x007c434,0x007efc2,0x007efe8,0x0080001,
    0x00a9b80,
    0x00a9c01,0x00adce8,0x00add01,0x00ae078,0x00ae081,0x00b3a88,0x00b3ac1,0x00baf84,0x00be001,0x00be878,0x00c0001,
    0x00c4d2c,
    0x00c4d41,0x00c8ec0,
};
// END GENERATED

static int mt__unicode_class(uint32_t cp) {
    // invariant: start(lo) <= cp < start(hi), where start(N) is "infinity"
    size_t lo = 0, hi = sizeof mt__unicode_steps / sizeof mt__unicode_steps[0];
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        if ((mt__unicode_steps[mid] >> 2) <= cp) lo = mid; else hi = mid;
    }
    return (int)(mt__unicode_steps[lo] & 3);
}

// the class and byte length of the character at s[0..n). A byte that does not start valid
// UTF-8 counts as one character of class "other": tiktoken only ever sees valid text (a Python
// str), so any rule works for it; this one keeps every byte inside some piece, and so
// decode(encode(x)) == x holds for any bytes.
static int mt__char_class(const unsigned char *s, size_t n, int *len) {
    if (s[0] < 0x80) { *len = 1; return mt__ascii_class[s[0]]; }
    uint32_t cp;
    int l = mt_utf8_decode((const char *)s, n, &cp);
    if (l == 0) { *len = 1; return MT__OTHER; }
    *len = l;
    return mt__unicode_class(cp);
}

// ---------------------------------------------------------------------------------------------
// pre-tokenization: GPT-2's regex, written out by hand
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// A regex engine tries the alternatives left to right at the current position and takes the
// first that matches (each "+" as long as it can). Here is what that comes to, case by case:
//   1. an apostrophe and s t m d (or re ve ll) is a piece: "it's" -> "it" "'s". Lowercase
//      only: "IT'S" -> "IT" "'" "S".
//   2. an optional single space, then a run of one class, letters OR numbers OR other (not
//      space, letter or number): " world", " 2024", " --". The space glues to the run after it.
//   3. whitespace: \s+(?!\S) matches a run of whitespace that is not followed by a non-space,
//      so before a word the regex backs off one character and leaves the last one for the
//      word: "a   b" -> "a" "  " " b". At the end of the text the whole run goes.
//   4. \s+ catches what 3 leaves: a single whitespace character before a non-space ("\nA",
//      or a tab before a word, which case 2 does not take since its optional prefix is a space).
// tiktoken's version of the pattern ('(?:[sdmt]|ll|ve|re)| ?\p{L}++| ... |\s++$|\s+(?!\S)|\s)
// is the same language written for a faster engine; the tests check both (tests/tiktoken_fuzz.py).
size_t mt_gpt2_next_piece(const char *text, size_t n, size_t i) {
    const unsigned char *s = (const unsigned char *)text;
    // 1. contractions
    if (s[i] == '\'' && i + 1 < n) {
        unsigned char a = s[i + 1];
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
        if (i + 2 < n) {
            unsigned char b = s[i + 2];
            if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
        }
    }
    // 2. ' ?' then a run of letters, numbers or others
    int len, cls = mt__char_class(s + i, n - i, &len);
    size_t j = i;                       // where the run starts (after the optional space)
    if (s[i] == ' ' && i + 1 < n) {
        int len1, cls1 = mt__char_class(s + i + 1, n - i - 1, &len1);
        if (cls1 != MT__SPACE) { j = i + 1; cls = cls1; len = len1; }
    }
    if (cls != MT__SPACE) {
        size_t k = j + (size_t)len;
        if (cls == MT__LETTER) {        // the common case, ASCII letters, without a call
            while (k < n && s[k] < 0x80 && mt__ascii_class[s[k]] == MT__LETTER) k++;
        }
        while (k < n) {
            int l;
            if (mt__char_class(s + k, n - k, &l) != cls) break;
            k += (size_t)l;
        }
        return k;
    }
    // 3. and 4. a whitespace run [i, k); `last` is where its last character starts
    size_t last = i, k = i + (size_t)len;
    while (k < n) {
        int l;
        if (mt__char_class(s + k, n - k, &l) != MT__SPACE) break;
        last = k;
        k += (size_t)l;
    }
    if (k == n) return n;          // 3. at the end of the text: the whole run
    if (last > i) return last;     // 3. before a non-space: all but the last character
    return k;                      // 4. a single whitespace character before a non-space
}

// ---------------------------------------------------------------------------------------------
// the vocabulary: token bytes <-> id
// a slot holds the token's length and first 8 bytes, so most lookups (GPT-2's tokens are
// about 6 bytes long) are decided in the slot, without a memcmp call on bytes elsewhere in memory
struct mt__vocab_slot {
    uint64_t head;     // first 8 bytes of the token, zero-padded (mt__hash_bytes)
    uint32_t len;      // its length in bytes
    int32_t id;        // -1: empty slot
};

static int32_t mt__vocab_find(const mt_tokenizer *t, const unsigned char *s, size_t n, uint64_t h, uint64_t head) {
    for (size_t i = (size_t)h & t->vocab_mask;; i = (i + 1) & t->vocab_mask) {
        const struct mt__vocab_slot *slot = &t->vocab_slots[i];
        if (slot->id < 0) return -1;
        if (slot->head == head && slot->len == n &&
            (n <= 8 || memcmp(t->bytes + t->offsets[slot->id] + 8, s + 8, n - 8) == 0)) return slot->id;
    }
}

int32_t mt_tokenizer_token_id(const mt_tokenizer *t, const char *bytes, size_t len) {
    const unsigned char *s = (const unsigned char *)bytes;
    uint64_t head;
    uint64_t h = mt__hash_bytes(s, len, &head);
    return mt__vocab_find(t, s, len, h, head);
}

const char *mt_tokenizer_token_bytes(const mt_tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->vocab_size) { *len = 0; return NULL; }
    *len = t->offsets[id + 1] - t->offsets[id];
    return t->bytes + t->offsets[id];
}

// ---------------------------------------------------------------------------------------------
// the merge table: (left id, right id) -> (rank, merged id)
// merges.txt line r (0-based, after the header) says "tokens A and B merge into token AB, with
// rank r"; lower rank = learned earlier = merged first. For GPT-2, AB's id is 256 + r.
// tiktoken ranks a pair by the bytes it would form: two adjacent parts merge if their
// concatenation is a token, at that token's rank, whichever two parts formed it (merges.txt
// may have made "abc" from "ab"+"c" while the parts at hand are "a"+"bc"). So the table holds
// every split of every merged token into two tokens: 108,299 pairs for GPT-2, of which 50,000
// are merges.txt's lines. That makes the rule tiktoken's by construction. For GPT-2's own files,
// merges.txt's pairs alone (what OpenAI's encoder.py and Megatron use) gave the same ids on
// every piece we tried: all of the corpus's and 400,000 random ones.
struct mt__pair_slot {
    uint64_t key;      // (left << 32) | right; UINT64_MAX: empty slot
    int32_t rank;
    int32_t id;
};
#define MT__NO_RANK INT32_MAX

static uint64_t mt__pair_key(int32_t a, int32_t b) { return ((uint64_t)(uint32_t)a << 32) | (uint32_t)b; }

// rank of merging tokens a and b (MT__NO_RANK if they do not merge); *merged gets the new id
static int32_t mt__pair_rank(const mt_tokenizer *t, int32_t a, int32_t b, int32_t *merged) {
    uint64_t key = mt__pair_key(a, b);
    for (size_t i = (size_t)mt__mix64(key) & t->pair_mask;; i = (i + 1) & t->pair_mask) {
        const struct mt__pair_slot *slot = &t->pair_slots[i];
        if (slot->key == key) { *merged = slot->id; return slot->rank; }
        if (slot->key == UINT64_MAX) return MT__NO_RANK;
    }
}

// ---------------------------------------------------------------------------------------------
// BPE on one piece, two ways with the same result
// The rule (tiktoken's byte_pair_merge): while some adjacent pair merges, merge the pair of
// lowest rank; on a tie (the same token twice, as in "aaaa"), the leftmost.
//   mt__bpe_small: arrays and a linear scan per merge, O(n^2), fastest for normal words
//   mt__bpe_large: a linked list of parts and a min-heap of pairs keyed (rank, position),
//                  O(n log n), for long pieces (a 100 kB run of digits must not take minutes)
// The heap keeps stale entries (pairs that a later merge destroyed) and drops them when they
// come out: an entry is live if its left part still exists and still forms a pair of that rank
// with its right neighbour. Equal ranks mean equal tokens, so a live entry is always right.
#define MT__BPE_SMALL 128

static size_t mt__bpe_small(const mt_tokenizer *t, const unsigned char *s, size_t n, int32_t *out) {
    int32_t id[MT__BPE_SMALL], rank[MT__BPE_SMALL], merged[MT__BPE_SMALL];
    // rank[k] and merged[k] describe the pair (id[k], id[k+1])
    for (size_t k = 0; k < n; k++) id[k] = t->byte_id[s[k]];
    for (size_t k = 0; k + 1 < n; k++) rank[k] = mt__pair_rank(t, id[k], id[k + 1], &merged[k]);
    size_t m = n;   // parts left
    for (;;) {
        int32_t best = MT__NO_RANK;
        size_t k = 0;
        for (size_t i = 0; i + 1 < m; i++) if (rank[i] < best) { best = rank[i]; k = i; }
        if (best == MT__NO_RANK) break;
        // merge parts k and k+1 into part k, close the gap
        id[k] = merged[k];
        size_t tail = m - k - 2;   // parts after k+1
        memmove(&id[k + 1], &id[k + 2], tail * sizeof(int32_t));
        memmove(&rank[k + 1], &rank[k + 2], tail * sizeof(int32_t));
        memmove(&merged[k + 1], &merged[k + 2], tail * sizeof(int32_t));
        m--;
        // only the pairs that touch the new part change
        if (k + 1 < m) rank[k] = mt__pair_rank(t, id[k], id[k + 1], &merged[k]);
        if (k > 0) rank[k - 1] = mt__pair_rank(t, id[k - 1], id[k], &merged[k - 1]);
    }
    memcpy(out, id, m * sizeof(int32_t));
    return m;
}

static void mt__heap_push(uint64_t *heap, size_t *n, uint64_t v) {
    size_t i = (*n)++;
    while (i > 0 && heap[(i - 1) / 2] > v) { heap[i] = heap[(i - 1) / 2]; i = (i - 1) / 2; }
    heap[i] = v;
}

static uint64_t mt__heap_pop(uint64_t *heap, size_t *n) {
    uint64_t top = heap[0], v = heap[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && heap[c + 1] < heap[c]) c++;
        if (heap[c] >= v) break;
        heap[i] = heap[c];
        i = c;
    }
    if (*n > 0) heap[i] = v;
    return top;
}

static size_t mt__bpe_large(const mt_tokenizer *t, const unsigned char *s, size_t n, int32_t *out) {
    // part p starts at byte p (positions never move, so p is also its left-to-right order)
    int32_t *id = (int32_t *)mt_malloc(n * sizeof(int32_t), "BPE parts");     // -1: merged away
    int64_t *next = (int64_t *)mt_malloc(n * sizeof(int64_t), "BPE parts");   // -1: none
    int64_t *prev = (int64_t *)mt_malloc(n * sizeof(int64_t), "BPE parts");
    uint64_t *heap = (uint64_t *)mt_malloc(3 * n * sizeof(uint64_t), "BPE heap"); // (rank << 32) | p
    size_t nheap = 0;
    int32_t merged;
    for (size_t p = 0; p < n; p++) {
        id[p] = t->byte_id[s[p]];
        next[p] = p + 1 < n ? (int64_t)p + 1 : -1;
        prev[p] = (int64_t)p - 1;
    }
    for (size_t p = 0; p + 1 < n; p++) {
        int32_t r = mt__pair_rank(t, id[p], id[p + 1], &merged);
        if (r != MT__NO_RANK) mt__heap_push(heap, &nheap, ((uint64_t)r << 32) | p);
    }
    while (nheap > 0) {
        uint64_t e = mt__heap_pop(heap, &nheap);
        int32_t r = (int32_t)(e >> 32);
        size_t p = (size_t)(e & 0xffffffffu);
        if (id[p] < 0 || next[p] < 0) continue;                          // stale
        size_t q = (size_t)next[p];
        if (mt__pair_rank(t, id[p], id[q], &merged) != r) continue;    // stale
        id[p] = merged;            // p absorbs q
        id[q] = -1;
        next[p] = next[q];
        if (next[q] >= 0) prev[next[q]] = (int64_t)p;
        if (prev[p] >= 0) {
            size_t o = (size_t)prev[p];
            int32_t r2 = mt__pair_rank(t, id[o], id[p], &merged);
            if (r2 != MT__NO_RANK) mt__heap_push(heap, &nheap, ((uint64_t)r2 << 32) | o);
        }
        if (next[p] >= 0) {
            int32_t r2 = mt__pair_rank(t, id[p], id[next[p]], &merged);
            if (r2 != MT__NO_RANK) mt__heap_push(heap, &nheap, ((uint64_t)r2 << 32) | p);
        }
    }
    size_t m = 0;
    for (int64_t p = 0; p >= 0; p = next[p]) out[m++] = id[p];
    free(id); free(next); free(prev); free(heap);
    return m;
}

// ---------------------------------------------------------------------------------------------
// the word cache: piece bytes -> ids, one per thread
// Text repeats its words, so each distinct piece needs BPE once. Pieces that are one token
// (most English words with their space) are answered by the vocabulary map and never get
// here; the cache holds the pieces that split into several tokens. Keys and ids live in two
// growing arenas; at MT__CACHE_MAX_SLOTS or MT__CACHE_MAX_BYTES the cache empties and starts
// over, which bounds its memory on endless input. Not shared between threads: no locks.
struct mt__cache_slot {
    uint64_t hash;
    uint32_t key_off, key_len;   // key_len 0: empty slot
    uint32_t ids_off, n_ids;
};
#define MT__CACHE_MAX_WORD 256            // longer pieces are rare: not cached
#define MT__CACHE_MAX_SLOTS (1u << 19)    // 12 MB of slots, up to 262,144 words
#define MT__CACHE_MAX_BYTES (32u << 20)   // per arena

static int mt__cache_find(const mt_bpe_cache *c, const unsigned char *s, size_t n, uint64_t h, mt_int_list *out) {
    if (!c->slots) return 0;
    for (size_t i = (size_t)h & c->mask;; i = (i + 1) & c->mask) {
        const struct mt__cache_slot *slot = &c->slots[i];
        if (slot->key_len == 0) return 0;
        if (slot->hash == h && slot->key_len == n && memcmp(c->keys + slot->key_off, s, n) == 0) {
            mt_int_list_reserve(out, slot->n_ids);
            memcpy(out->data + out->len, c->ids + slot->ids_off, slot->n_ids * sizeof(int32_t));
            out->len += slot->n_ids;
            return 1;
        }
    }
}

static void mt__cache_place(struct mt__cache_slot *slots, size_t mask, const struct mt__cache_slot *e) {
    size_t i = (size_t)e->hash & mask;
    while (slots[i].key_len != 0) i = (i + 1) & mask;
    slots[i] = *e;
}

static void mt__cache_insert(mt_bpe_cache *c, const unsigned char *s, size_t n, uint64_t h,
                             const int32_t *ids, size_t n_ids) {
    int full = c->keys_len + n > MT__CACHE_MAX_BYTES || (c->ids_len + n_ids) * sizeof(int32_t) > MT__CACHE_MAX_BYTES;
    if (!c->slots || (c->count + 1) * 2 > c->mask + 1) {
        size_t cap = c->slots ? 2 * (c->mask + 1) : 4096;
        if (cap > MT__CACHE_MAX_SLOTS) full = 1;
        else {   // grow: re-place every entry in a table twice the size
            struct mt__cache_slot *slots = (struct mt__cache_slot *)mt_calloc(cap, sizeof *slots, "BPE cache");
            for (size_t i = 0; c->slots && i <= c->mask; i++)
                if (c->slots[i].key_len) mt__cache_place(slots, cap - 1, &c->slots[i]);
            free(c->slots);
            c->slots = slots;
            c->mask = cap - 1;
        }
    }
    if (full) {   // start over with an empty cache of the same size
        memset(c->slots, 0, (c->mask + 1) * sizeof *c->slots);
        c->count = c->keys_len = c->ids_len = 0;
    }
    if (c->keys_len + n > c->keys_cap) {
        c->keys_cap = mt__pow2_at_least(c->keys_len + n + 65536);
        c->keys = (char *)mt_realloc(c->keys, c->keys_cap, "BPE cache");
    }
    if (c->ids_len + n_ids > c->ids_cap) {
        c->ids_cap = mt__pow2_at_least(c->ids_len + n_ids + 16384);
        c->ids = (int32_t *)mt_realloc(c->ids, c->ids_cap * sizeof(int32_t), "BPE cache");
    }
    struct mt__cache_slot e;
    e.hash = h;
    e.key_off = (uint32_t)c->keys_len;
    e.key_len = (uint32_t)n;
    e.ids_off = (uint32_t)c->ids_len;
    e.n_ids = (uint32_t)n_ids;
    memcpy(c->keys + c->keys_len, s, n);
    memcpy(c->ids + c->ids_len, ids, n_ids * sizeof(int32_t));
    c->keys_len += n;
    c->ids_len += n_ids;
    mt__cache_place(c->slots, c->mask, &e);
    c->count++;
}

void mt_bpe_cache_free(mt_bpe_cache *c) {
    free(c->slots);
    free(c->keys);
    free(c->ids);
    memset(c, 0, sizeof *c);
}

// ---------------------------------------------------------------------------------------------
// encode and decode
// one piece: a single byte is its own token; a piece that is a token is taken whole (tiktoken
// does this too; for GPT-2, BPE builds every token from its own bytes, so it is only a shortcut,
// and the one most English words take); else the cache; else BPE, and remember the result.
static void mt__encode_piece(const mt_tokenizer *t, mt_bpe_cache *c, const unsigned char *s, size_t n,
                             mt_int_list *out) {
    if (n == 1) { mt_int_list_push(out, t->byte_id[s[0]]); return; }
    uint64_t head;
    uint64_t h = mt__hash_bytes(s, n, &head);
    int32_t id = mt__vocab_find(t, s, n, h, head);
    if (id >= 0 && id != t->eod_id) { mt_int_list_push(out, id); return; }
    if (c && n <= MT__CACHE_MAX_WORD && mt__cache_find(c, s, n, h, out)) { c->hits++; return; }
    mt_int_list_reserve(out, n);   // BPE never gives more tokens than bytes
    int32_t *ids = out->data + out->len;
    size_t m = n <= MT__BPE_SMALL ? mt__bpe_small(t, s, n, ids) : mt__bpe_large(t, s, n, ids);
    out->len += m;
    if (c && n <= MT__CACHE_MAX_WORD) { c->misses++; mt__cache_insert(c, s, n, h, ids, m); }
}

size_t mt_tokenizer_encode(const mt_tokenizer *t, mt_bpe_cache *cache, const char *text, size_t len,
                           mt_int_list *out) {
    size_t before = out->len;
    for (size_t pos = 0; pos < len;) {
        size_t end = mt_gpt2_next_piece(text, len, pos);
        mt__encode_piece(t, cache, (const unsigned char *)text + pos, end - pos, out);
        pos = end;
    }
    return out->len - before;
}

size_t mt_tokenizer_decode(const mt_tokenizer *t, const int32_t *ids, size_t n, char *out, size_t cap) {
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= t->vocab_size)
            mt_fatal("cannot decode token id %d: the vocabulary has ids 0..%d\n"
                     "hint: ids past the vocabulary come from a padded output layer (--make-vocab-size-divisible-by); "
                     "sample only from the first %d logits",
                     (int)id, t->vocab_size - 1, t->vocab_size);
        size_t len = t->offsets[id + 1] - t->offsets[id];
        if (total < cap) memcpy(out + total, t->bytes + t->offsets[id], len < cap - total ? len : cap - total);
        total += len;
    }
    if (total < cap) out[total] = '\0';
    return total;
}

// ---------------------------------------------------------------------------------------------
// loading vocab.json and merges.txt
static char *mt__read_file(const char *path, size_t *len, const char *what, const char *flag) {
    FILE *f = fopen(path, "rb");
    if (!f) mt_fatal("cannot open %s %s: %s\nhint: check %s", what, path, strerror(errno), flag);
    size_t cap = 1 << 20, n = 0;
    char *buf = (char *)mt_malloc(cap + 1, what);
    for (;;) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap) break;
        cap *= 2;
        buf = (char *)mt_realloc(buf, cap + 1, what);
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) mt_fatal("cannot read %s %s: %s\nhint: check %s", what, path, strerror(errno), flag);
    buf[n] = '\0';
    *len = n;
    return buf;
}

// the byte alphabet of the files (see the top of this part): code point -> byte, -1 if none
static void mt__gpt2_unicode_to_byte(int16_t table[324]) {
    for (int i = 0; i < 324; i++) table[i] = -1;
    int next = 256;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        table[printable ? b : next++] = (int16_t)b;
    }
}

// token text (UTF-8 of the byte alphabet) -> bytes; returns the byte count, or -1 with *bad_cp
// set to the first code point outside the alphabet
static long mt__alphabet_to_bytes(const int16_t u2b[324], const char *s, size_t n, char *out, uint32_t *bad_cp) {
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int l = mt_utf8_decode(s + i, n - i, &cp);
        if (l == 0) { *bad_cp = 0xFFFD; return -1; }
        if (cp >= 324 || u2b[cp] < 0) { *bad_cp = cp; return -1; }
        out[o++] = (char)u2b[cp];
        i += (size_t)l;
    }
    return (long)o;
}

static void mt__vocab_insert(mt_tokenizer *t, int32_t id) {
    uint32_t off = t->offsets[id];
    size_t n = t->offsets[id + 1] - off;
    uint64_t head;
    uint64_t h = mt__hash_bytes((const unsigned char *)t->bytes + off, n, &head);
    size_t i = (size_t)h & t->vocab_mask;
    while (t->vocab_slots[i].id >= 0) i = (i + 1) & t->vocab_mask;
    t->vocab_slots[i].head = head;
    t->vocab_slots[i].len = (uint32_t)n;
    t->vocab_slots[i].id = id;
}

static void mt__pair_insert(mt_tokenizer *t, int32_t a, int32_t b, int32_t rank, int32_t id) {
    uint64_t key = mt__pair_key(a, b);
    size_t i = (size_t)mt__mix64(key) & t->pair_mask;
    while (t->pair_slots[i].key != UINT64_MAX && t->pair_slots[i].key != key) i = (i + 1) & t->pair_mask;
    struct mt__pair_slot *slot = &t->pair_slots[i];
    if (slot->key == key && slot->rank <= rank) return;   // keep the earlier merge
    if (slot->key != key) t->n_pairs++;
    slot->key = key;
    slot->rank = rank;
    slot->id = id;
}

#define MT__VOCAB_HINT "hint: --vocab-file must be a GPT-2 style vocab.json (encoder.json), e.g. data/gpt2-vocab.json"
#define MT__MERGES_HINT \
    "hint: --merge-file must be the merges.txt (vocab.bpe) that goes with --vocab-file, e.g. data/gpt2-merges.txt"

// vocab.json: one JSON object {"token": id, ...}. ids must be 0..N-1, each used once.
static void mt__load_vocab(mt_tokenizer *t, const char *path, const int16_t u2b[324]) {
    size_t len;
    char *buf = mt__read_file(path, &len, "vocab file", "--vocab-file");
    size_t cap = 65536, n = 0;
    int32_t *ids = (int32_t *)mt_malloc(cap * sizeof(int32_t), "vocab");
    uint32_t *offs = (uint32_t *)mt_malloc((cap + 1) * sizeof(uint32_t), "vocab");
    char *bytes = (char *)mt_malloc(len + 1, "vocab");   // the bytes are shorter than the file
    size_t nbytes = 0;
    offs[0] = 0;
    // one JSON object {"token": id, ...}, read with the JSON reader of section 1
    mt_json j;
    mt_json_init(&j, buf, len, 0);
    if (!mt_json_expect(&j, '{', "expected '{' (vocab.json is one JSON object)")) {}
    else if (!mt_json_eat(&j, '}')) do {
        // "token": the string decoded into the bytes buffer, then GPT-2's alphabet -> bytes
        char *tok = bytes + nbytes;
        size_t toklen;
        if (!mt_json_string_at(&j, tok, &toklen)) break;
        uint32_t bad_cp = 0;
        long nb = mt__alphabet_to_bytes(u2b, tok, toklen, tok, &bad_cp);   // in place: never longer
        if (nb < 0) {
            mt_fatal("%s: token \"%.*s\" (entry %zu) has the character U+%04X, which is not one of the 256 "
                     "characters GPT-2 uses to write bytes\n" MT__VOCAB_HINT,
                     path, (int)toklen, tok, n + 1, (unsigned)bad_cp);
        }
        // : id
        if (!mt_json_expect(&j, ':', "expected ':' after a token")) break;
        mt_json_ws(&j);
        double id = -1;
        if (j.p >= j.end || *j.p < '0' || *j.p > '9' || !mt_json_number(&j, &id) || id != floor(id)) {
            mt_json_fail(&j, "expected a token id (a non-negative integer)");
            break;
        }
        if (id > INT32_MAX - 1) { mt_json_fail(&j, "token id too large"); break; }
        if (n == cap) {
            cap *= 2;
            ids = (int32_t *)mt_realloc(ids, cap * sizeof(int32_t), "vocab");
            offs = (uint32_t *)mt_realloc(offs, (cap + 1) * sizeof(uint32_t), "vocab");
        }
        ids[n] = (int32_t)id;
        offs[n] = (uint32_t)nbytes;
        nbytes += (size_t)nb;
        n++;
        offs[n] = (uint32_t)nbytes;
    } while (mt_json_eat(&j, ','));
    if (!j.err) mt_json_expect(&j, '}', "expected ',' or '}' after a token id");
    if (!j.err) { mt_json_ws(&j); if (j.p != j.end) mt_json_fail(&j, "text after the closing '}'"); }
    if (j.err)
        mt_fatal("%s is not a valid vocab.json: %s at byte %zu\n" MT__VOCAB_HINT, path, j.err,
                 (size_t)(j.err_at - buf));
    if (n < 256) mt_fatal("%s has %zu tokens; a byte-level vocabulary has at least the 256 single "
                          "bytes\n" MT__VOCAB_HINT, path, n);
    // lay the tokens out by id
    t->vocab_size = (int)n;
    t->offsets = (uint32_t *)mt_calloc(n + 1, sizeof(uint32_t), "vocab");
    uint32_t *len_of = (uint32_t *)mt_malloc(n * sizeof(uint32_t), "vocab");
    int32_t *entry_of = (int32_t *)mt_malloc(n * sizeof(int32_t), "vocab");
    for (size_t i = 0; i < n; i++) entry_of[i] = -1;
    for (size_t i = 0; i < n; i++) {
        if ((size_t)ids[i] >= n)
            mt_fatal("%s: token id %d is out of range: %zu tokens must have ids 0..%zu\n" MT__VOCAB_HINT,
                     path, (int)ids[i], n, n - 1);
        if (entry_of[ids[i]] >= 0) mt_fatal("%s: token id %d is used twice\n" MT__VOCAB_HINT, path, (int)ids[i]);
        entry_of[ids[i]] = (int32_t)i;
        len_of[ids[i]] = offs[i + 1] - offs[i];
    }
    for (size_t id = 0; id < n; id++) t->offsets[id + 1] = t->offsets[id] + len_of[id];
    t->bytes = (char *)mt_malloc(t->offsets[n] + 1, "vocab");
    for (size_t id = 0; id < n; id++) memcpy(t->bytes + t->offsets[id], bytes + offs[entry_of[id]], len_of[id]);
    // the bytes -> id map
    t->vocab_mask = mt__pow2_at_least(2 * n) - 1;
    t->vocab_slots = (struct mt__vocab_slot *)mt_malloc((t->vocab_mask + 1) * sizeof(struct mt__vocab_slot), "vocab");
    for (size_t i = 0; i <= t->vocab_mask; i++)
        { t->vocab_slots[i].id = -1; t->vocab_slots[i].head = 0; t->vocab_slots[i].len = 0; }
    for (size_t id = 0; id < n; id++) {
        size_t tl;
        const char *tb = mt_tokenizer_token_bytes(t, (int32_t)id, &tl);
        if (mt_tokenizer_token_id(t, tb, tl) >= 0)
            mt_fatal("%s: two tokens have the same bytes \"%.*s\" (ids %d and %zu)\n" MT__VOCAB_HINT,
                     path, (int)tl, tb, (int)mt_tokenizer_token_id(t, tb, tl), id);
        mt__vocab_insert(t, (int32_t)id);
    }
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        t->byte_id[b] = mt_tokenizer_token_id(t, &c, 1);
        if (t->byte_id[b] < 0) mt_fatal("%s has no token for the byte 0x%02X; a byte-level vocabulary has all "
                                        "256\n" MT__VOCAB_HINT, path, b);
    }
    t->eod_id = mt_tokenizer_token_id(t, MT_EOD_TEXT, strlen(MT_EOD_TEXT));
    free(len_of); free(entry_of); free(ids); free(offs); free(bytes); free(buf);
}

// merges.txt: "#version: 0.2", then one "A B" per line, highest priority first
static void mt__load_merges(mt_tokenizer *t, const char *path, const int16_t u2b[324], const char *vocab_path) {
    size_t len;
    char *buf = mt__read_file(path, &len, "merges file", "--merge-file");
    if (len < 8 || memcmp(buf, "#version", 8) != 0)
        mt_fatal("%s: line 1 is not the \"#version: 0.2\" header of a merges.txt\n" MT__MERGES_HINT, path);
    int32_t *rank_of = (int32_t *)mt_malloc((size_t)t->vocab_size * sizeof(int32_t), "merges"); // token -> rank
    for (int i = 0; i < t->vocab_size; i++) rank_of[i] = MT__NO_RANK;
    char *tmp = (char *)mt_malloc(len + 1, "merges");
    char *line = (char *)memchr(buf, '\n', len);
    int lineno = 1, rank = 0;
    while (line && line + 1 < buf + len) {
        char *s = line + 1;
        lineno++;
        char *e = (char *)memchr(s, '\n', (size_t)(buf + len - s));
        if (!e) e = buf + len;
        line = e < buf + len ? e : NULL;
        if (e > s && e[-1] == '\r') e--;   // tolerate \r\n
        if (e == s) continue;              // blank line (the end of the file)
        char *sp = (char *)memchr(s, ' ', (size_t)(e - s));
        if (!sp || sp == s || sp + 1 == e || memchr(sp + 1, ' ', (size_t)(e - sp - 1)))
            mt_fatal("%s line %d: expected two tokens separated by one space, got \"%.*s\"\n" MT__MERGES_HINT,
                     path, lineno, (int)(e - s), s);
        // A and B in the byte alphabet -> bytes, then their ids and the merged token's id
        const char *part[2] = {s, sp + 1};
        size_t plen[2] = {(size_t)(sp - s), (size_t)(e - sp - 1)};
        int32_t pid[2];
        size_t at = 0;
        for (int k = 0; k < 2; k++) {
            uint32_t bad_cp = 0;
            long nb = mt__alphabet_to_bytes(u2b, part[k], plen[k], tmp + at, &bad_cp);
            if (nb < 0)
                mt_fatal("%s line %d: \"%.*s\" has the character U+%04X, which GPT-2's byte alphabet does not "
                         "use\n" MT__MERGES_HINT,
                         path, lineno, (int)plen[k], part[k], (unsigned)bad_cp);
            pid[k] = mt_tokenizer_token_id(t, tmp + at, (size_t)nb);
            if (pid[k] < 0)
                mt_fatal("%s line %d: the merge \"%.*s\" names \"%.*s\", which is not a token of %s\n" MT__MERGES_HINT,
                         path, lineno, (int)(e - s), s, (int)plen[k], part[k], vocab_path);
            at += (size_t)nb;
        }
        int32_t merged = mt_tokenizer_token_id(t, tmp, at);
        if (merged < 0)
            mt_fatal("%s line %d: the merge \"%.*s\" makes a token that is not in %s\n" MT__MERGES_HINT,
                     path, lineno, (int)(e - s), s, vocab_path);
        if (rank_of[merged] == MT__NO_RANK) rank_of[merged] = rank;
        rank++;
    }
    t->n_merges = rank;
    // every split of every merged token into two tokens (see "the merge table")
    size_t bound = 0;
    for (int id = 0; id < t->vocab_size; id++)
        if (rank_of[id] != MT__NO_RANK) bound += t->offsets[id + 1] - t->offsets[id] - 1;
    t->pair_mask = mt__pow2_at_least(2 * bound) - 1;
    t->pair_slots = (struct mt__pair_slot *)mt_malloc((t->pair_mask + 1) * sizeof(struct mt__pair_slot), "merges");
    for (size_t i = 0; i <= t->pair_mask; i++)
        { t->pair_slots[i].key = UINT64_MAX; t->pair_slots[i].rank = 0; t->pair_slots[i].id = -1; }
    t->n_pairs = 0;
    for (int id = 0; id < t->vocab_size; id++) {
        if (rank_of[id] == MT__NO_RANK) continue;
        const char *tb = t->bytes + t->offsets[id];
        size_t tl = t->offsets[id + 1] - t->offsets[id];
        for (size_t k = 1; k < tl; k++) {
            int32_t a = mt_tokenizer_token_id(t, tb, k), b = mt_tokenizer_token_id(t, tb + k, tl - k);
            if (a >= 0 && b >= 0) mt__pair_insert(t, a, b, rank_of[id], (int32_t)id);
        }
    }
    free(rank_of); free(tmp); free(buf);
}

void mt_tokenizer_load(mt_tokenizer *t, const char *vocab_path, const char *merges_path) {
    memset(t, 0, sizeof *t);
    int16_t u2b[324];
    mt__gpt2_unicode_to_byte(u2b);
    mt__load_vocab(t, vocab_path, u2b);
    mt__load_merges(t, merges_path, u2b, vocab_path);
}

void mt_tokenizer_free(mt_tokenizer *t) {
    free(t->bytes);
    free(t->offsets);
    free(t->vocab_slots);
    free(t->pair_slots);
    memset(t, 0, sizeof *t);
}

// =============================================================================================
// 10. CHECKPOINTS
// =============================================================================================
// Mirrors megatron/training/checkpointing.py (save_checkpoint, load_checkpoint) for its
// directory layout; the file format is safetensors, so any tool can read our weights:
//
//   SAVE/latest_checkpointed_iteration.txt          "300"  (written last: a checkpoint exists
//                                                    only once every rank's file is in place)
//   SAVE/iter_0000300/mp_rank_00/                    one directory per TP rank (PP = 1)
//   SAVE/iter_0000300/mp_rank_01_001/                or per (TP rank, PP rank) when PP > 1
//       model_optim_rng.safetensors                  this rank's shards (Megatron: .pt)
//
// A safetensors file is: u64 (little-endian) header length N, N bytes of JSON, then raw data.
// The JSON maps each tensor name to {"dtype":"F32","shape":[...],"data_offsets":[begin,end]}
// (offsets into the data part) and holds "__metadata__", a map of strings: here the
// iteration, the optimizer step, the data position and the layout and model sizes. Tensors:
// the parameters under their names (wte, qkvw, ...; per-layer tensors stacked over this rank's
// layers), and AdamW's moments as optimizer.exp_avg.NAME and optimizer.exp_avg_sq.NAME.
// Nothing else is needed to resume bit-exactly: the random numbers are counter-based (keyed on
// the iteration, nothing to save), and the data position follows from the iteration.
// Resuming needs the same TP x PP (and virtual stages); DP may differ, since DP replicas hold
// the same values (DP rank 0 writes, every DP rank reads).

void mt_checkpoint_path(char *out, size_t cap, const char *dir, int iteration, int tp_rank, int pp_rank, int pp_size) {
    if (pp_size == 1) snprintf(out, cap, "%s/iter_%07d/mp_rank_%02d/model_optim_rng.safetensors", dir, iteration,
                               tp_rank);
    else snprintf(out, cap, "%s/iter_%07d/mp_rank_%02d_%03d/model_optim_rng.safetensors", dir, iteration, tp_rank,
                  pp_rank);
}

// the tensors of a checkpoint, in file order: parameters, then exp_avg, then exp_avg_sq
typedef struct { char name[64]; const mt_param_spec *spec; int which; } mt__ckpt_tensor;   // which: 0 param, 1 m, 2 v
// (groups: 3 = all of them; 1 = the parameters only, what generation reads)
static int mt__ckpt_tensor_groups(const mt_rank *r, mt__ckpt_tensor *out, int groups) {
    const char *prefix[3] = {"", "optimizer.exp_avg.", "optimizer.exp_avg_sq."};
    int n = 0;
    for (int which = 0; which < groups; which++)
        for (int i = 0; i < MT_NUM_PARAM_TENSORS; i++) {
            if (!r->model.specs[i].present) continue;
            snprintf(out[n].name, sizeof out[n].name, "%s%s", prefix[which], r->model.specs[i].name);
            out[n].spec = &r->model.specs[i];
            out[n].which = which;
            n++;
        }
    return n;
}
static int mt__ckpt_tensors(const mt_rank *r, mt__ckpt_tensor *out) { return mt__ckpt_tensor_groups(r, out, 3); }

static int mt__ckpt_shape(const mt_param_spec *s, size_t shape[3]) {   // drops dimensions of size 1 (vectors)
    int nd = 0;
    if (s->layers) shape[nd++] = (size_t)s->layers;
    if (s->rows > 1) shape[nd++] = (size_t)s->rows;
    shape[nd++] = (size_t)s->cols;
    return nd;
}

// Checksums: a bit flipped on disk or in transit must not load silently. Four independent lanes
// (so the multiplies overlap: several GB/s, far below the cost of reading the file) each take
// one 8-byte word in four as h = (h ^ word) * K; both steps are bijections of the lane, so a
// change confined to one word always changes that lane's value, and the lanes, each mixed once
// more, are combined with the length.
uint64_t mt_checksum64(const void *data, size_t n) {
    const unsigned char *p = (const unsigned char *)data;
    const uint64_t K = 0x9E3779B97F4A7C15ull;   // odd: multiplying by it is a bijection mod 2^64
    uint64_t h[4] = {1, 2, 3, 4};
    size_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int l = 0; l < 4; l++) {
            uint64_t w;
            memcpy(&w, p + i + 8 * (size_t)l, 8);
            h[l] = (h[l] ^ w) * K;
        }
    for (; i + 8 <= n; i += 8) { uint64_t w; memcpy(&w, p + i, 8); h[0] = (h[0] ^ w) * K; }
    for (; i < n; i++) h[1] = (h[1] ^ p[i]) * K;
    return mt_hash64(h[0]) ^ mt_hash64(h[1] + 1) ^ mt_hash64(h[2] + 2) ^ mt_hash64(h[3] + 3) ^ mt_hash64(n);
}

// the metadata every file carries; a load compares the layout keys with its own
typedef struct { const char *key; long long value; } mt__ckpt_meta;
static int mt__ckpt_metadata(const mt_rank *r, int iteration, int64_t valid_consumed, mt__ckpt_meta *m) {
    const mt_config *cfg = r->cfg;
    mt__ckpt_meta all[] = {
        {"iteration", iteration}, {"optimizer_step", r->optim.step},
        {"consumed_train_samples", (long long)iteration * cfg->train.global_batch_size},
        {"consumed_valid_samples", (long long)valid_consumed},
        {"tensor_model_parallel_size", r->ps.tp_size}, {"pipeline_model_parallel_size", r->ps.pp_size},
        {"virtual_pipeline_model_parallel_size", r->ps.vp_size},
        {"tensor_model_parallel_rank", r->ps.tp_rank}, {"pipeline_model_parallel_rank", r->ps.pp_rank},
        {"num_layers", cfg->model.num_layers}, {"hidden_size", cfg->model.hidden_size},
        {"num_attention_heads", cfg->model.num_attention_heads}, {"ffn_hidden_size", cfg->model.ffn_hidden_size},
        {"max_position_embeddings", cfg->model.max_position_embeddings}, {"vocab_size", cfg->model.vocab_size},
        {"padded_vocab_size", cfg->padded_vocab_size},
        {"make_vocab_size_divisible_by", cfg->model.make_vocab_size_divisible_by},
    };
    int n = (int)(sizeof all / sizeof all[0]);
    for (int i = 0; i < n; i++) m[i] = all[i];
    return n;
}

#define MT__CKPT_LAYOUT_KEYS 12   /* metadata from index 4 on must match on load (layout and model) */

// The optimizer's counters beside AdamW's step, also metadata: "skipped_iterations" (the
// learning-rate schedule does not advance on them) and, with fp16's dynamic loss scaling, the
// scaler's state (Megatron's optimizer state_dict['grad_scaler']: scale, growth_tracker,
// hysteresis_tracker), so that a resumed run continues bit for bit. The scale is written with 9
// significant digits, which give back the same float. Files without these keys (older ones, or
// saved without --fp16) load with 0 skipped iterations and a fresh scaler.
typedef struct {
    long long skipped;                        // the optimizer's skipped iterations
    int has_scaler;                           // the file holds a dynamic scaler's state:
    float scale;                              //   its scale,
    int growth_tracker, hysteresis_tracker;   //   its trackers
} mt__ckpt_scaler;

static void mt__ckpt_scaler_of(const mt_rank *r, mt__ckpt_scaler *out) {
    memset(out, 0, sizeof *out);
    out->skipped = r->optim.skipped;
    out->has_scaler = r->optim.scaler.kind == MT_SCALER_DYNAMIC;
    out->scale = r->optim.scaler.scale;
    out->growth_tracker = r->optim.scaler.growth_tracker;
    out->hysteresis_tracker = r->optim.scaler.hysteresis_tracker;
}

// one rank's file: the safetensors header (metadata and the tensor table), then the tensors'
// bytes in carve order: parameters, exp_avg, exp_avg_sq. host[k] are whole host buffers.
static void mt__ckpt_write_file(const mt_rank *r, const char *path, float *const host[3], int iteration,
                                int64_t valid_consumed) {
    char dirpath[MT_PATH_MAX + 128], tmp[MT_PATH_MAX + 160];
    snprintf(dirpath, sizeof dirpath, "%s", path);
    char *slash = strrchr(dirpath, '/');
    if (slash) { *slash = 0; mt__mkdir_p(dirpath, "--save"); }
    mt__ckpt_tensor tensors[3 * MT_NUM_PARAM_TENSORS];
    int nt = mt__ckpt_tensors(r, tensors);
    size_t cap = 4096 + (size_t)nt * 256, len = 0;
    char *json = (char *)mt_malloc(cap, "checkpoint header");
    mt__own(free, json);
    mt__ckpt_meta meta[32];
    int nm = mt__ckpt_metadata(r, iteration, valid_consumed, meta);
    len += (size_t)snprintf(json + len, cap - len, "{\"__metadata__\":{\"format\":\"megatron.h checkpoint 1\"");
    for (int i = 0; i < nm; i++) len += (size_t)snprintf(json + len, cap - len, ",\"%s\":\"%lld\"", meta[i].key,
                                                         meta[i].value);
    mt__ckpt_scaler sc;
    mt__ckpt_scaler_of(r, &sc);
    len += (size_t)snprintf(json + len, cap - len, ",\"skipped_iterations\":\"%lld\"", sc.skipped);
    if (sc.has_scaler)
        len += (size_t)snprintf(json + len, cap - len, ",\"grad_scaler.scale\":\"%.9g\",\"grad_scaler.growth_tracker\":"
                                "\"%d\",\"grad_scaler.hysteresis_tracker\":\"%d\"", (double)sc.scale, sc.growth_tracker,
                                sc.hysteresis_tracker);
    for (int i = 0; i < nt; i++)   // each tensor's checksum (metadata values are strings in safetensors)
        len += (size_t)snprintf(json + len, cap - len, ",\"checksum.%s\":\"%016llx\"", tensors[i].name,
                                (unsigned long long)mt_checksum64(host[tensors[i].which] + tensors[i].spec->offset,
                                                                  mt__spec_numel(tensors[i].spec) * sizeof(float)));
    len += (size_t)snprintf(json + len, cap - len, "}");
    size_t offset = 0;
    for (int i = 0; i < nt; i++) {
        size_t shape[3], bytes = mt__spec_numel(tensors[i].spec) * sizeof(float);
        int nd = mt__ckpt_shape(tensors[i].spec, shape);
        len += (size_t)snprintf(json + len, cap - len, ",\"%s\":{\"dtype\":\"F32\",\"shape\":[", tensors[i].name);
        for (int d = 0; d < nd; d++) len += (size_t)snprintf(json + len, cap - len, "%s%zu", d ? "," : "", shape[d]);
        len += (size_t)snprintf(json + len, cap - len, "],\"data_offsets\":[%zu,%zu]}", offset, offset + bytes);
        offset += bytes;
    }
    len += (size_t)snprintf(json + len, cap - len, "}");
    while (len % 8) json[len++] = ' ';   // the data starts 8-byte aligned (trailing spaces are allowed)
    FILE *f = mt_atomic_open(path, tmp, sizeof tmp);
    uint64_t header_len = len;
    int ok = fwrite(&header_len, 8, 1, f) == 1 && fwrite(json, 1, len, f) == len;
    for (int i = 0; i < nt && ok; i++) {
        const float *src = host[tensors[i].which] + tensors[i].spec->offset;
        size_t n = mt__spec_numel(tensors[i].spec);
        ok = fwrite(src, sizeof(float), n, f) == n;
    }
    if (!ok) { mt_atomic_abort(f, tmp); mt_fatal("writing %s failed: %s\nhint: check free disk space", path,
                                                 strerror(errno)); }
    mt_atomic_commit(f, tmp, path);
    mt__disown(json);
    free(json);
}

static void mt__ckpt_write_tracker(const char *dir, int iteration) {
    char path[MT_PATH_MAX + 64], tmp[MT_PATH_MAX + 96];
    snprintf(path, sizeof path, "%s/latest_checkpointed_iteration.txt", dir);
    FILE *f = mt_atomic_open(path, tmp, sizeof tmp);
    fprintf(f, "%d", iteration);
    mt_atomic_commit(f, tmp, path);
}

// one of AdamW's moments whole, on the host (host: num_params floats on DP rank 0, NULL on the
// others), from this rank's shard wherever the optimizer keeps it: device memory, or pinned host
// memory with --optimizer-cpu-offload. The distributed optimizer's shards meet in a whole buffer
// on the device (full: buffer_floats, a collective of the DP group), so that the file is the
// same whatever the optimizer and wherever it ran.
static void mt__ckpt_moment_to_host(mt_rank *r, const float *shard, float *host, float *full) {
    const mt_optimizer *o = &r->optim;
    size_t n = r->model.num_params;
    if (!full) {   // the whole moment is here
        if (host && o->offload) memcpy(host, shard, n * sizeof(float));
        else if (host) mt_buffer_download(r, host, shard, n * sizeof(float));
        return;
    }
    const float *send = shard;
    if (o->offload) {   // up to my shard's place in the whole buffer, then gathered in place
        mt_buffer_upload(r, full + o->shard_start, shard, o->shard_size * sizeof(float));
        send = full + o->shard_start;
    }
    mt_all_gather(&r->groups.dp, send, full, o->shard_size);
    if (host) mt_buffer_download(r, host, full, n * sizeof(float));
}

void mt_checkpoint_save(mt_rank *r, const char *dir, int iteration, int64_t valid_consumed) {
    const mt_config *cfg = r->cfg;
    int is_logger = r->ps.rank == cfg->world_size - 1;
    if (is_logger) { printf("saving checkpoint at iteration %7d to %s\n", iteration, dir); fflush(stdout); }
    double t0 = mt_time_seconds();
    const mt_optimizer *o = &r->optim;
    // the values, on the host of DP rank 0 (DP replicas are identical: one writes); the
    // distributed optimizer's shards gathered through one whole device buffer, m then v
    int writer = r->ps.dp_rank == 0;
    float *host[3] = {NULL, NULL, NULL};
    for (int k = 0; k < 3 && writer; k++) {
        host[k] = (float *)mt_malloc(r->model.num_params * sizeof(float) + 1, "checkpoint");
        mt__own(free, host[k]);   // a failed write ends the rank: these go with it
    }
    if (writer) mt_buffer_download(r, host[0], r->model.params_memory, r->model.num_params * sizeof(float));
    float *full = o->distributed && r->ps.dp_size > 1 ? mt_buffer_alloc(r, r->model.buffer_floats, "checkpoint "
                                                                        "AdamW moment") : NULL;
    mt__ckpt_moment_to_host(r, o->m_memory, host[1], full);
    mt__ckpt_moment_to_host(r, o->v_memory, host[2], full);
    mt_buffer_free(full);
    if (writer) {
        char path[MT_PATH_MAX + 128];
        mt_checkpoint_path(path, sizeof path, dir, iteration, r->ps.tp_rank, r->ps.pp_rank, r->ps.pp_size);
        mt__ckpt_write_file(r, path, host, iteration, valid_consumed);
        for (int k = 0; k < 3; k++) { mt__disown(host[k]); free(host[k]); }
    }
    // the tracker file last, once every rank's file is complete
    mt_barrier(&r->groups.world);
    if (r->ps.rank == 0) mt__ckpt_write_tracker(dir, iteration);
    mt_barrier(&r->groups.world);
    if (is_logger) {
        printf("  successfully saved checkpoint at iteration %7d to %s (%.2f s)\n", iteration, dir,
               mt_time_seconds() - t0);
        fflush(stdout);
    }
}

static int mt__same_dir(const char *a, const char *b) {   // the same directory, however spelled
    struct stat sa, sb;
    return a[0] && b[0] && stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

void mt_checkpoint_claim_dir(const char *dir, const char *src, int same_ok, int overwrite) {
    int same = src && mt__same_dir(dir, src);
    if (same && !same_ok)
        mt_fatal("--save %s and --load %s are the same directory: converting would overwrite the source\n"
                 "hint: write the converted checkpoint into a new directory", dir, src);
    char tracker[MT_PATH_MAX + 64];
    snprintf(tracker, sizeof tracker, "%s/latest_checkpointed_iteration.txt", dir);
    struct stat st;
    if (!same && !overwrite && stat(tracker, &st) == 0)
        mt_fatal("--save %s already holds the checkpoints of another run (%s exists)\n"
                 "hint: resume that run with --load %s, pick a new --save directory, or add --overwrite", dir,
                 tracker, dir);
    mt__mkdir_p(dir, "--save");   // now: a directory that cannot be made fails before the first save
    mt_remove_stale_temporaries(dir, 2);   // DIR, DIR/iter_N, DIR/iter_N/mp_rank_TT
}

// ---------------------------------------------------------------------------------------------
// reading a safetensors header (with the JSON reader of section 1)
// a reader positioned at the value of member `key` of the object at obj; 0 when absent
static int mt__ckpt_member(const mt_json *obj, const char *key, mt_json *value) {
    *value = *obj;
    return mt_json_find(value, key);
}

// the iteration in DIR/latest_checkpointed_iteration.txt; 0 when there is none
static int mt__ckpt_latest(const char *dir) {
    char path[MT_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/latest_checkpointed_iteration.txt", dir);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char text[32];   // Megatron writes the bare number ("300"), perhaps with a newline
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    while (n > 0 && (text[n - 1] == '\n' || text[n - 1] == '\r' || text[n - 1] == ' ')) text[--n] = 0;
    char *end;
    errno = 0;
    long iteration = strtol(text, &end, 10);
    if (n == 0 || *end || errno || text[0] < '0' || text[0] > '9' || iteration <= 0 || iteration > 9999999)
        mt_fatal("%s does not hold an iteration number (it holds \"%.20s\")\n"
                 "hint: the checkpoint directory is damaged; point --load at a good one", path, text);
    return (int)iteration;
}

static void mt__fclose_owned(void *f) { fclose((FILE *)f); }

// a file's JSON header (NUL-terminated, to free); fatal if the file is not safetensors
static char *mt__ckpt_header(FILE *f, const char *path, uint64_t *header_len, long *file_size) {
    fseek(f, 0, SEEK_END);
    *file_size = ftell(f);
    fseek(f, 0, SEEK_SET);
    if (*file_size < 8 || fread(header_len, 8, 1, f) != 1 || *header_len > (uint64_t)*file_size - 8)
        mt_fatal("%s is truncated or not a safetensors file (%ld bytes)\n"
                 "hint: the save was interrupted; load an earlier iteration", path, *file_size);
    char *json = (char *)mt_malloc(*header_len + 1, "checkpoint header");
    if (fread(json, 1, *header_len, f) != *header_len) { free(json); mt_fatal("%s: cannot read its header", path); }
    json[*header_len] = 0;
    mt_json j;
    mt_json_init(&j, json, (size_t)*header_len, 0);
    mt_json_skip(&j);
    if (j.err) {
        char err[256];
        snprintf(err, sizeof err, "%s", j.err);
        free(json);
        mt_fatal("%s: the safetensors header is not valid JSON (%s)\nhint: the file is damaged", path, err);
    }
    return json;
}

// metadata value `key` as a number; `fallback` when absent (required: fatal when absent)
static long long mt__ckpt_meta_value(const char *json, uint64_t header_len, const char *path, const char *key,
                                     int required, long long fallback) {
    mt_json header, md, v;
    mt_json_init(&header, json, (size_t)header_len, 0);
    if (!mt__ckpt_member(&header, "__metadata__",
                         &md)) mt_fatal("%s has no __metadata__: it was not written by megatron.h", path);
    if (!mt__ckpt_member(&md, key, &v) || *v.p != '"') {
        if (required) mt_fatal("%s: metadata \"%s\" is missing", path, key);
        return fallback;
    }
    char *end;
    errno = 0;
    long long value = strtoll(v.p + 1, &end, 10);
    if (errno || end == v.p + 1 || *end != '"')
        mt_fatal("%s: metadata \"%s\" is not a whole number\nhint: the file is damaged", path, key);
    return value;
}

// a metadata value that must lie in [lo, hi]: a damaged file is an error here, not a crash later
static long long mt__ckpt_meta_checked(const char *json, uint64_t header_len, const char *path, const char *key,
                                       long long lo, long long hi, long long fallback) {
    long long v = mt__ckpt_meta_value(json, header_len, path, key, 1, fallback);
    if (v < lo || v > hi)
        mt_fatal("%s: metadata \"%s\" is %lld, outside [%lld, %lld]\nhint: the file is damaged; load another "
                 "checkpoint", path, key, v, lo, hi);
    return v;
}

// the counters a resume trusts: the iteration must be the tracker's, the optimizer's step at most
// the iteration (skipped steps do not count), the validation position a sane sample count
#define MT__MAX_SAMPLES (1LL << 50)
static void mt__ckpt_check_counters(const char *path, int tracker_iteration, const long long saved[4]) {
    if (saved[0] != tracker_iteration)
        mt_fatal("%s says iteration %lld, latest_checkpointed_iteration.txt says %d\n"
                 "hint: the checkpoint directory is damaged; load another iteration", path, saved[0],
                 tracker_iteration);
    if (saved[1] < 0 || saved[1] > saved[0])
        mt_fatal("%s: metadata \"optimizer_step\" is %lld, outside [0, iteration %lld]\nhint: the file is damaged",
                 path, saved[1], saved[0]);
    if (saved[3] < 0 || saved[3] > MT__MAX_SAMPLES)
        mt_fatal("%s: metadata \"consumed_valid_samples\" is %lld, outside [0, 2^50]\nhint: the file is damaged",
                 path, saved[3]);
}

// the counters of mt__ckpt_scaler from a file's header (absent: 0 skipped, no scaler), range-checked
static void mt__ckpt_read_scaler(const char *json, uint64_t header_len, const char *path, long long iteration,
                                 mt__ckpt_scaler *out) {
    memset(out, 0, sizeof *out);
    out->skipped = mt__ckpt_meta_value(json, header_len, path, "skipped_iterations", 0, 0);
    if (out->skipped < 0 || out->skipped > iteration)
        mt_fatal("%s: metadata \"skipped_iterations\" is %lld, outside [0, iteration %lld]\nhint: the file is damaged",
                 path, out->skipped, iteration);
    mt_json header, md, v;
    mt_json_init(&header, json, (size_t)header_len, 0);
    if (!mt__ckpt_member(&header, "__metadata__", &md) || !mt__ckpt_member(&md, "grad_scaler.scale", &v) ||
        *v.p != '"')
        return;
    char *end;
    double scale = strtod(v.p + 1, &end);
    if (end == v.p + 1 || *end != '"' || !(scale > 0.0) || scale > 3.0e38)
        mt_fatal("%s: metadata \"grad_scaler.scale\" is not a positive number\nhint: the file is damaged", path);
    out->has_scaler = 1;
    out->scale = (float)scale;
    out->growth_tracker = (int)mt__ckpt_meta_checked(json, header_len, path, "grad_scaler.growth_tracker", 0,
                                                     INT32_MAX, 0);
    out->hysteresis_tracker = (int)mt__ckpt_meta_checked(json, header_len, path, "grad_scaler.hysteresis_tracker",
                                                         INT32_MIN, INT32_MAX, 0);
}

// reads one rank's file into host buffers host[0..2] (parameters, exp_avg, exp_avg_sq; the first
// `groups` of them), after checking that its layout and model are r's; saved[] receives the
// metadata values, *scaler (when not NULL) the optimizer's counters
static void mt__ckpt_read_groups(const mt_rank *r, const char *path, float *host[3], long long saved[32], int groups,
                                 mt__ckpt_scaler *scaler) {
    FILE *f = fopen(path, "rb");
    if (!f) mt_fatal("cannot open %s: %s\nhint: the checkpoint is incomplete, or was saved with another TP x PP layout "
                     "(ls its iter_* directory: mp_rank_TT_PPP); convert it to this run's: ./train_gpt "
                     "--convert-checkpoint --load SRC --save DST --target-tensor-parallel-size %d "
                     "--target-pipeline-parallel-size %d", path, strerror(errno), r->ps.tp_size, r->ps.pp_size);
    uint64_t header_len = 0;
    long file_size = 0;
    char *json = mt__ckpt_header(f, path, &header_len, &file_size);
    mt__own(free, json);             // a mismatch below ends a rank thread: these go with it
    mt__own(mt__fclose_owned, f);
    mt_json header;
    mt_json_init(&header, json, (size_t)header_len, 0);
    // the layout and the model must be this run's
    mt__ckpt_meta mine[32];
    int nm = mt__ckpt_metadata(r, 0, 0, mine);
    for (int i = 0; i < nm; i++) {
        saved[i] = mt__ckpt_meta_value(json, header_len, path, mine[i].key, 1, 0);
        if (i >= 4 && saved[i] != mine[i].value)
            mt_fatal("%s was saved with %s = %lld, this run has %lld\n"
                     "hint: resume with the checkpoint's layout and model sizes (--use-checkpoint-args takes its "
                     "sizes), or convert it: ./train_gpt --convert-checkpoint --load SRC --save DST "
                     "--target-tensor-parallel-size N --target-pipeline-parallel-size N",
                     path, mine[i].key, saved[i], mine[i].value);
    }
    if (scaler) mt__ckpt_read_scaler(json, header_len, path, saved[0], scaler);
    // the tensors, each checked against this rank's shapes and the file's size
    uint64_t data_start = 8 + header_len, data_size = (uint64_t)file_size - data_start;
    mt__ckpt_tensor tensors[3 * MT_NUM_PARAM_TENSORS];
    int nt = mt__ckpt_tensor_groups(r, tensors, groups);
    for (int i = 0; i < nt; i++) {
        const mt_param_spec *s = tensors[i].spec;
        mt_json t, v;
        if (!mt__ckpt_member(&header, tensors[i].name, &t)) mt_fatal("%s has no tensor %s", path, tensors[i].name);
        if (!mt__ckpt_member(&t, "dtype", &v) || strncmp(v.p, "\"F32\"", 5) != 0)
            mt_fatal("%s: tensor %s is not F32", path, tensors[i].name);
        long long shape[8], offs[2];
        size_t want_shape[3];
        int nd = mt__ckpt_shape(s, want_shape);
        int got_nd = mt__ckpt_member(&t, "shape", &v) ? mt_json_ints(&v, shape, 8) : -1;
        int same = got_nd == nd;
        for (int d = 0; d < nd && same; d++) same = shape[d] == (long long)want_shape[d];
        if (!same) mt_fatal("%s: tensor %s has another shape than this run's\n"
                            "hint: resume with the model sizes and TP x PP it was saved with", path, tensors[i].name);
        size_t bytes = mt__spec_numel(s) * sizeof(float);
        int n_offs = mt__ckpt_member(&t, "data_offsets", &v) ? mt_json_ints(&v, offs, 2) : -1;
        if (n_offs != 2 || offs[0] < 0 || (uint64_t)offs[1] - (uint64_t)offs[0] != bytes)
            mt_fatal("%s: tensor %s has bad data offsets", path, tensors[i].name);
        if ((uint64_t)offs[1] > data_size)
            mt_fatal("%s is truncated: tensor %s needs bytes up to %lld of the data, the file has %llu\n"
                     "hint: the save was interrupted; load an earlier iteration",
                     path, tensors[i].name, offs[1], (unsigned long long)data_size);
        fseek(f, (long)(data_start + (uint64_t)offs[0]), SEEK_SET);
        if (fread(host[tensors[i].which] + s->offset, 1, bytes, f) != bytes) mt_fatal("%s: short read of %s", path,
                tensors[i].name);
        // the checksum, when the file has one (files of older versions have none)
        mt_json md, c;
        char key[96] = "checksum.";   // + the name (at most 63 characters)
        size_t name_len = strnlen(tensors[i].name, sizeof tensors[i].name - 1);
        memcpy(key + 9, tensors[i].name, name_len);
        key[9 + name_len] = 0;
        if (mt__ckpt_member(&header, "__metadata__", &md) && mt__ckpt_member(&md, key, &c) && *c.p == '"') {
            unsigned long long want = strtoull(c.p + 1, NULL, 16);
            unsigned long long got = (unsigned long long)mt_checksum64(host[tensors[i].which] + s->offset, bytes);
            if (got != want)
                mt_fatal("%s: tensor %s is damaged (checksum %016llx, the file says %016llx)\n"
                         "hint: the file was changed on disk or in a copy; load another checkpoint", path,
                         tensors[i].name, got, want);
        }
    }
    mt__disown(f);
    mt__disown(json);
    fclose(f);
    free(json);
}

static void mt__ckpt_read_file(const mt_rank *r, const char *path, float *host[3], long long saved[32],
                               mt__ckpt_scaler *scaler) {
    mt__ckpt_read_groups(r, path, host, saved, 3, scaler);
}

// --ckpt-step N names an iteration of --load: one that is not there is an error that lists those
// that are (iter_NNNNNNN directories)
static int mt__compare_ints(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}
static void mt__ckpt_check_step(const mt_config *cfg) {
    const char *dir = cfg->train.load;
    int step = cfg->train.ckpt_step;
    if (step <= 0) return;
    char path[MT_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/iter_%07d", dir, step);
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) return;
    int its[512], count = 0;   // (the first 512 found, sorted)
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        int it = 0, n = 0;
        if (sscanf(e->d_name, "iter_%7d%n", &it, &n) != 1 || n != 12 || e->d_name[n]) continue;
        if (count < 512) its[count] = it;
        count++;
    }
    if (d) closedir(d);
    qsort(its, (size_t)(count < 512 ? count : 512), sizeof(int), mt__compare_ints);
    char have[160] = "it has none";
    size_t used = 0;
    for (int i = 0; i < count && i < 8; i++)
        used += (size_t)snprintf(have + used, sizeof have - used, "%s%d", i ? ", " : "its iterations: ", its[i]);
    if (count > 8) snprintf(have + used, sizeof have - used, ", ... (%d in all)", count);
    mt_fatal("--ckpt-step %d: %s has no iteration %d (%s)\nhint: give one of its iterations, or leave --ckpt-step "
             "out for the latest", step, dir, step, have);
}

// --load checkpoints/iter_0001000, the tutorial's way: an iteration's directory, not the root.
// Megatron wants the root and --ckpt-step 1000; say so and do that.
void mt_checkpoint_resolve_load(mt_config *cfg) {
    char *load = cfg->train.load;
    size_t len = strlen(load);
    while (len > 1 && load[len - 1] == '/') load[--len] = 0;
    const char *base = strrchr(load, '/');
    base = base ? base + 1 : load;
    int iteration = 0, used = 0;
    if (sscanf(base, "iter_%7d%n", &iteration, &used) != 1 || used != 12 || base[used] || iteration <= 0) {
        mt__ckpt_check_step(cfg);
        return;
    }
    char probe[MT_PATH_MAX + 64];
    snprintf(probe, sizeof probe, "%s/latest_checkpointed_iteration.txt", load);
    if (access(probe, F_OK) == 0) {   // a checkpoint root that happens to be called iter_N
        mt__ckpt_check_step(cfg);
        return;
    }
    char root[MT_PATH_MAX];
    if (base == load) snprintf(root, sizeof root, ".");
    else snprintf(root, sizeof root, "%.*s", (int)(base - 1 - load) > 0 ? (int)(base - 1 - load) : 1, load);
    if (cfg->train.ckpt_step > 0 && cfg->train.ckpt_step != iteration)
        mt_fatal("--load %s is iteration %d, but --ckpt-step says %d\nhint: give one of the two", load, iteration,
                 cfg->train.ckpt_step);
    fprintf(stderr, "note: --load %s is an iteration directory; loading iteration %d of %s "
                    "(Megatron: --load %s --ckpt-step %d)\n", load, iteration, root, root, iteration);
    cfg->train.ckpt_step = iteration;
    snprintf(cfg->train.load, MT_PATH_MAX, "%s", root);
}

int mt_checkpoint_found(const mt_config *cfg) {
    return cfg->train.load[0] && (cfg->train.ckpt_step > 0 || mt__ckpt_latest(cfg->train.load) > 0);
}

int mt_checkpoint_load(mt_rank *r, const char *dir, int64_t *valid_consumed) {
    const mt_config *cfg = r->cfg;
    int is_logger = r->ps.rank == cfg->world_size - 1;
    int iteration = cfg->train.ckpt_step > 0 ? cfg->train.ckpt_step : mt__ckpt_latest(dir);
    if (iteration == 0 && !r->model.initialised)   // it was there when the run started (mt_model_init)
        mt_fatal("%s/latest_checkpointed_iteration.txt went away while the run started\n"
                 "hint: another process is writing or deleting checkpoints in %s; run again when it is done", dir, dir);
    if (iteration == 0) {
        if (is_logger) printf("WARNING: could not find the metadata file %s/latest_checkpointed_iteration.txt\n"
                              "    will not load any checkpoints and will start from random\n", dir);
        return 0;
    }
    char path[MT_PATH_MAX + 128];
    mt_checkpoint_path(path, sizeof path, dir, iteration, r->ps.tp_rank, r->ps.pp_rank, r->ps.pp_size);
    if (is_logger) { printf("loading checkpoint from %s at iteration %d\n", dir, iteration); fflush(stdout); }
    float *host[3];
    for (int k = 0; k < 3; k++) {
        host[k] = (float *)mt_calloc(r->model.num_params + 1, sizeof(float), "checkpoint");
        mt__own(free, host[k]);   // a damaged file ends the rank inside the read
    }
    long long saved[32];
    mt__ckpt_scaler sc;
    mt__ckpt_read_file(r, path, host, saved, &sc);
    mt__ckpt_check_counters(path, iteration, saved);
    // the parameters whole; AdamW's moments: this rank's shard of them (all of them without the
    // distributed optimizer), the padding past num_params staying 0, into the device or (offload)
    // into the host memory that holds them, with the master copy of the shard's parameters.
    // --finetune and --no-load-optim (Megatron's: the optimizer's state not loaded): the moments
    // stay as a new optimizer has them (zeros), its step and the loss scale start again
    int params_only = cfg->train.finetune || cfg->train.no_load_optim;
    const mt_optimizer *o = &r->optim;
    mt_buffer_upload(r, r->model.params_memory, host[0], r->model.num_params * sizeof(float));
    size_t n = o->shard_start >= r->model.num_params ? 0
             : o->shard_start + o->shard_size <= r->model.num_params ? o->shard_size
                                                                     : r->model.num_params - o->shard_start;
    float *dest[3] = {o->master_params, o->m_memory, o->v_memory};
    for (int k = 0; k < (params_only ? 1 : 3) && n; k++) {
        if (o->offload) memcpy(dest[k], host[k] + o->shard_start, n * sizeof(float));
        else if (k > 0) mt_buffer_upload(r, dest[k], host[k] + o->shard_start, n * sizeof(float));
    }
    for (int k = 0; k < 3; k++) {
        mt__disown(host[k]);
        free(host[k]);
    }
    r->optim.step = params_only ? 0 : (int)saved[1];
    r->optim.skipped = params_only ? 0 : (int)sc.skipped;
    mt_grad_scaler *scaler = &r->optim.scaler;
    if (params_only) {
        if (is_logger) printf("  %s: the parameters only; AdamW's moments and step%s start again\n",
                              cfg->train.finetune ? "--finetune" : "--no-load-optim",
                              scaler->kind == MT_SCALER_DYNAMIC ? " and the loss scale" : "");
    } else if (scaler->kind == MT_SCALER_DYNAMIC && sc.has_scaler) {   // Megatron: grad_scaler.load_state_dict
        scaler->scale = sc.scale;
        scaler->growth_tracker = sc.growth_tracker;
        scaler->hysteresis_tracker = sc.hysteresis_tracker;
    } else if (scaler->kind == MT_SCALER_DYNAMIC && is_logger) {
        printf("WARNING: %s holds no loss-scaler state (saved without --fp16, or by an older version); the loss "
               "scale starts again from --initial-loss-scale %.9g\n", path, (double)scaler->scale);
    }
    if (valid_consumed) *valid_consumed = cfg->train.finetune ? 0 : saved[3];
    if (is_logger) { printf("  successfully loaded checkpoint from %s at iteration %d\n", dir,
                            iteration); fflush(stdout); }
    return iteration;
}

// ---------------------------------------------------------------------------------------------
// converting between layouts (Megatron's tools/checkpoint/convert.py) and to Hugging Face
// ---------------------------------------------------------------------------------------------
// Every (TP, PP) file of the source is read into full, unsharded tensors (mt_shard_copy, the
// same mapping that initialises and gathers parameters), then cut again for the target layout.
// AdamW's moments go through the same mapping, so training resumes in the new layout as if it
// had always been there. A "shape rank" is an mt_rank with sizes and a carve but no buffers,
// communicators or threads: enough to know which slice of each tensor a rank holds.
static void mt__shape_rank(mt_rank *r, const mt_config *cfg, int tp_rank, int pp_rank) {
    memset(r, 0, sizeof *r);
    r->cfg = cfg;
    mt_parallel_state_init(&r->ps, cfg, mt_global_rank(cfg, tp_rank, 0, pp_rank));
    mt_dims_init(&r->dims, cfg, &r->ps);
    r->model.num_params = mt__carve_params(r, &r->model.params, NULL, 1);
}

// the model and layout a checkpoint file was saved with, as a config (DP = 1)
static void mt__ckpt_source_config(const char *path, int tracker_iteration, mt_config *cfg, long long *step,
                                   long long *valid_consumed, mt__ckpt_scaler *scaler) {
    FILE *f = fopen(path, "rb");
    if (!f) mt_fatal("cannot open %s: %s\nhint: --load must be a checkpoint directory written by --save", path,
                     strerror(errno));
    uint64_t header_len = 0;
    long file_size = 0;
    char *json = mt__ckpt_header(f, path, &header_len, &file_size);
    fclose(f);
    mt_config_defaults(cfg);
    // every size positive and in the ranges mt_config_derive allows, before any division by one
    cfg->model.num_layers = (int)mt__ckpt_meta_checked(json, header_len, path, "num_layers", 1, 65536, 0);
    cfg->model.hidden_size = (int)mt__ckpt_meta_checked(json, header_len, path, "hidden_size", 1, MT__MAX_DIM, 0);
    cfg->model.num_attention_heads = (int)mt__ckpt_meta_checked(json, header_len, path, "num_attention_heads", 1,
                                                                MT__MAX_DIM, 0);
    cfg->model.ffn_hidden_size = (int)mt__ckpt_meta_checked(json, header_len, path, "ffn_hidden_size", 1,
                                                            4 * MT__MAX_DIM, 0);
    cfg->model.max_position_embeddings = (int)mt__ckpt_meta_checked(json, header_len, path,
                                                                    "max_position_embeddings", 1, MT__MAX_DIM, 0);
    cfg->model.seq_length = cfg->model.max_position_embeddings;
    cfg->model.vocab_size = (int)mt__ckpt_meta_checked(json, header_len, path, "vocab_size", 1, 64 * MT__MAX_DIM, 0);
    cfg->model.make_vocab_size_divisible_by = (int)mt__ckpt_meta_checked(json, header_len, path,
            "make_vocab_size_divisible_by", 1, MT__MAX_DIM, 128);
    int tp = (int)mt__ckpt_meta_checked(json, header_len, path, "tensor_model_parallel_size", 1, 4096, 0);
    int pp = (int)mt__ckpt_meta_checked(json, header_len, path, "pipeline_model_parallel_size", 1, 4096, 0);
    int vp = (int)mt__ckpt_meta_checked(json, header_len, path, "virtual_pipeline_model_parallel_size", 1, 65536, 1);
    if (cfg->model.num_layers % (pp * vp))
        mt_fatal("%s: %d layers do not split into pipeline_model_parallel_size %d x virtual %d\n"
                 "hint: the file is damaged", path, cfg->model.num_layers, pp, vp);
    cfg->parallel.tensor_model_parallel_size = tp;
    cfg->parallel.pipeline_model_parallel_size = pp;
    cfg->parallel.nproc_per_node = tp * pp;
    if (vp > 1) cfg->parallel.num_layers_per_virtual_pipeline_stage = cfg->model.num_layers / pp / vp;
    cfg->train.global_batch_size = vp > 1 ? pp : 1;   // any valid batch: no training happens
    cfg->train.train_iters = 1;
    long long counters[4] = {mt__ckpt_meta_value(json, header_len, path, "iteration", 1, 0),
                             mt__ckpt_meta_value(json, header_len, path, "optimizer_step", 1, 0), 0,
                             mt__ckpt_meta_value(json, header_len, path, "consumed_valid_samples", 1, 0)};
    mt__ckpt_check_counters(path, tracker_iteration, counters);
    *step = counters[1];
    *valid_consumed = counters[3];
    mt__ckpt_read_scaler(json, header_len, path, counters[0], scaler);
    free(json);
    mt_config_derive(cfg);
}

// the full tensors of a checkpoint: global[k][i] for k = parameters, exp_avg, exp_avg_sq and
// tensor i, laid out (L, grows, gcols) or (grows, gcols); wte has the V real rows only
typedef struct {
    mt_config cfg;
    int iteration;
    long long step, valid_consumed;
    mt__ckpt_scaler scaler;        // the optimizer's counters, carried into the converted files
    float *global[3][MT_NUM_PARAM_TENSORS];
    size_t count[MT_NUM_PARAM_TENSORS];
} mt__full_checkpoint;

static void mt__ckpt_read_full(const char *dir, mt__full_checkpoint *full) {
    memset(full, 0, sizeof *full);
    full->iteration = mt__ckpt_latest(dir);
    if (full->iteration == 0) mt_fatal("%s has no latest_checkpointed_iteration.txt\n"
                                       "hint: --load must be a checkpoint directory written by --save", dir);
    char path[MT_PATH_MAX + 128];
    mt_checkpoint_path(path, sizeof path, dir, full->iteration, 0, 0, 1);
    FILE *probe = fopen(path, "rb");   // PP = 1 names its files mp_rank_TT, else mp_rank_TT_PPP
    if (probe) fclose(probe);
    else mt_checkpoint_path(path, sizeof path, dir, full->iteration, 0, 0, 2);
    mt__ckpt_source_config(path, full->iteration, &full->cfg, &full->step, &full->valid_consumed, &full->scaler);
    const mt_config *cfg = &full->cfg;
    int TP = cfg->parallel.tensor_model_parallel_size, PP = cfg->parallel.pipeline_model_parallel_size;
    for (int tp = 0; tp < TP; tp++)
        for (int pp = 0; pp < PP; pp++) {
            mt_rank r;
            mt__shape_rank(&r, cfg, tp, pp);
            if (tp == 0 && pp == 0)
                for (int i = 0; i < MT_NUM_PARAM_TENSORS; i++) {
                    const mt_param_spec *s = &r.model.specs[i];
                    full->count[i] = (size_t)(s->layers ? cfg->model.num_layers : 1) * s->grows * s->gcols;
                    for (int k = 0; k < 3; k++) full->global[k][i] = (float *)mt_calloc(full->count[i] + 1,
                            sizeof(float), "full checkpoint");
                }
            float *host[3];
            for (int k = 0; k < 3; k++) host[k] = (float *)mt_calloc(r.model.num_params + 1, sizeof(float),
                                                                     "checkpoint");
            long long saved[32];
            mt_checkpoint_path(path, sizeof path, dir, full->iteration, tp, pp, PP);
            mt__ckpt_read_file(&r, path, host, saved, NULL);
            for (int i = 0; i < MT_NUM_PARAM_TENSORS; i++)
                if (r.model.specs[i].present)
                    for (int k = 0; k < 3; k++) mt_shard_copy(&r, &r.model.specs[i], host[k], full->global[k][i], 0);
            for (int k = 0; k < 3; k++) free(host[k]);
        }
}

static void mt__ckpt_free_full(mt__full_checkpoint *full) {
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < MT_NUM_PARAM_TENSORS; i++) free(full->global[k][i]);
}

// writes a whole checkpoint (parameters and AdamW's moments, full tensors) cut for the layout of
// `target` into dst: every (TP, PP) file, then the tracker
static void mt__ckpt_write_full(const mt__full_checkpoint *full, const mt_config *target, const char *dst) {
    int tp = target->parallel.tensor_model_parallel_size, pp = target->parallel.pipeline_model_parallel_size;
    for (int t = 0; t < tp; t++)
        for (int p = 0; p < pp; p++) {
            mt_rank r;
            mt__shape_rank(&r, target, t, p);
            r.optim.step = (int)full->step;
            r.optim.skipped = (int)full->scaler.skipped;   // and the scaler's state, when the source had one
            r.optim.scaler.kind = full->scaler.has_scaler ? MT_SCALER_DYNAMIC : MT_SCALER_NONE;
            r.optim.scaler.scale = full->scaler.scale;
            r.optim.scaler.growth_tracker = full->scaler.growth_tracker;
            r.optim.scaler.hysteresis_tracker = full->scaler.hysteresis_tracker;
            float *host[3];
            for (int k = 0; k < 3; k++) host[k] = (float *)mt_calloc(r.model.num_params + 1, sizeof(float),
                                                                     "checkpoint");
            for (int i = 0; i < MT_NUM_PARAM_TENSORS; i++)
                if (r.model.specs[i].present)
                    for (int k = 0; k < 3; k++) mt_shard_copy(&r, &r.model.specs[i], host[k], full->global[k][i], 1);
            char path[MT_PATH_MAX + 128];
            mt_checkpoint_path(path, sizeof path, dst, full->iteration, t, p, pp);
            mt__ckpt_write_file(&r, path, host, full->iteration, full->valid_consumed);
            for (int k = 0; k < 3; k++) free(host[k]);
        }
    mt__ckpt_write_tracker(dst, full->iteration);
}

int mt_checkpoint_convert(const char *src, const char *dst, int tp, int pp, int layers_per_virtual) {
    mt__full_checkpoint full;
    mt__ckpt_read_full(src, &full);
    mt_config target = full.cfg;
    target.parallel.tensor_model_parallel_size = tp;
    target.parallel.pipeline_model_parallel_size = pp;
    target.parallel.nproc_per_node = tp * pp;
    target.parallel.num_layers_per_virtual_pipeline_stage = layers_per_virtual;
    target.train.global_batch_size = layers_per_virtual > 0 ? pp : 1;
    mt_config_derive(&target);   // checks that the model splits this way (heads, layers, ffn)
    mt__ckpt_write_full(&full, &target, dst);
    printf("converted %s (TP=%d, PP=%d) to %s (TP=%d, PP=%d%s) at iteration %d\n", src,
           full.cfg.parallel.tensor_model_parallel_size, full.cfg.parallel.pipeline_model_parallel_size, dst, tp, pp,
           layers_per_virtual > 0 ? ", interleaved" : "", full.iteration);
    int iteration = full.iteration;
    mt__ckpt_free_full(&full);
    return iteration;
}

// GPT-2's tensors in the order transformers writes them, each with the tensor of ours it is:
// (name, our tensor's index in the carve, layer or -1, rows, cols, transpose). Conv1D weights are
// (in, out), ours (out, in): transpose = 1; rows x cols is our shape of one layer's tensor.
typedef struct { char name[64]; int tensor, layer, rows, cols, transpose; } hf_tensor;
static int mt__hf_tensors(const mt_config *cfg, hf_tensor *list) {
    int L = cfg->model.num_layers, C = cfg->model.hidden_size, F = cfg->model.ffn_hidden_size;
    int V = cfg->model.vocab_size, maxT = cfg->model.max_position_embeddings, n = 0;
    // carve order: 0 wte 1 wpe 2 ln1w 3 ln1b 4 qkvw 5 qkvb 6 attprojw 7 attprojb 8 ln2w 9 ln2b
    //              10 fcw 11 fcb 12 fcprojw 13 fcprojb 14 lnfw 15 lnfb
    snprintf(list[n].name, 64,
             "wte.weight"); list[n].tensor = 0; list[n].layer = -1; list[n].rows = V; list[n].cols = C; n++;
    snprintf(list[n].name, 64,
             "wpe.weight"); list[n].tensor = 1; list[n].layer = -1; list[n].rows = maxT; list[n].cols = C; n++;
    for (int l = 0; l < L; l++) {
        struct { const char *suffix; int tensor, rows, cols, transpose; } per_layer[12] = {
            {"ln_1.weight", 2, 1, C, 0}, {"ln_1.bias", 3, 1, C, 0},
            {"attn.c_attn.weight", 4, 3 * C, C, 1}, {"attn.c_attn.bias", 5, 1, 3 * C, 0},
            {"attn.c_proj.weight", 6, C, C, 1}, {"attn.c_proj.bias", 7, 1, C, 0},
            {"ln_2.weight", 8, 1, C, 0}, {"ln_2.bias", 9, 1, C, 0},
            {"mlp.c_fc.weight", 10, F, C, 1}, {"mlp.c_fc.bias", 11, 1, F, 0},
            {"mlp.c_proj.weight", 12, C, F, 1}, {"mlp.c_proj.bias", 13, 1, C, 0},
        };
        for (int k = 0; k < 12; k++) {
            snprintf(list[n].name, 64, "h.%d.%s", l, per_layer[k].suffix);
            list[n].tensor = per_layer[k].tensor; list[n].layer = l;
            list[n].rows = per_layer[k].rows;
            list[n].cols = per_layer[k].cols;
            list[n].transpose = per_layer[k].transpose;
            n++;
        }
    }
    snprintf(list[n].name, 64,
             "ln_f.weight"); list[n].tensor = 14; list[n].layer = -1; list[n].rows = 1; list[n].cols = C; n++;
    snprintf(list[n].name, 64,
             "ln_f.bias"); list[n].tensor = 15; list[n].layer = -1; list[n].rows = 1; list[n].cols = C; n++;
    return n;
}

// Hugging Face GPT-2 (transformers' GPT2LMHeadModel): DIR/model.safetensors and DIR/config.json.
// Names as in the published gpt2 checkpoint (wte.weight, h.0.attn.c_attn.weight, ...). GPT-2's
// Conv1D layers store their weights as (in, out), the transpose of ours (out, in), so every
// linear weight is transposed on the way out. The vocabulary is the real V rows (no padding);
// the LM head is tied to wte, so it has no tensor of its own.
int mt_checkpoint_export_hf(const char *src, const char *out_dir) {
    // the cheap checks first: a source without a tracker, or an output directory that cannot be
    // made, fail before the (long) read, and a missing source leaves no empty output behind
    if (mt__ckpt_latest(src) == 0)
        mt_fatal("%s has no latest_checkpointed_iteration.txt\nhint: --load must be a checkpoint directory written "
                 "by --save", src);
    mt__mkdir_p(out_dir, "--export-hf");
    mt__full_checkpoint full;
    mt__ckpt_read_full(src, &full);
    const mt_config *cfg = &full.cfg;
    int L = cfg->model.num_layers, C = cfg->model.hidden_size, F = cfg->model.ffn_hidden_size;
    int V = cfg->model.vocab_size, maxT = cfg->model.max_position_embeddings;
    hf_tensor *list = (hf_tensor *)mt_calloc((size_t)(4 + 12 * L), sizeof(hf_tensor), "export");
    int n = mt__hf_tensors(cfg, list);
    // header: transformers wants metadata {"format": "pt"}
    size_t hcap = 256 + (size_t)n * 128, len = 0, offset = 0;
    char *json = (char *)mt_malloc(hcap, "export header");
    len += (size_t)snprintf(json + len, hcap - len, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int i = 0; i < n; i++) {
        size_t bytes = (size_t)list[i].rows * list[i].cols * sizeof(float);
        const char *name = list[i].name;
        int rows = list[i].rows, cols = list[i].cols;
        if (rows == 1)
            len += (size_t)snprintf(json + len, hcap - len, ",\"%s\":{\"dtype\":\"F32\",\"shape\":[%d],", name, cols);
        else if (list[i].transpose)
            len += (size_t)snprintf(json + len, hcap - len, ",\"%s\":{\"dtype\":\"F32\",\"shape\":[%d,%d],", name, cols, rows);
        else
            len += (size_t)snprintf(json + len, hcap - len, ",\"%s\":{\"dtype\":\"F32\",\"shape\":[%d,%d],", name, rows, cols);
        len += (size_t)snprintf(json + len, hcap - len, "\"data_offsets\":[%zu,%zu]}", offset, offset + bytes);
        offset += bytes;
    }
    len += (size_t)snprintf(json + len, hcap - len, "}");
    while (len % 8) json[len++] = ' ';
    char path[MT_PATH_MAX + 64], tmp[MT_PATH_MAX + 96];
    snprintf(path, sizeof path, "%s/model.safetensors", out_dir);
    FILE *f = mt_atomic_open(path, tmp, sizeof tmp);
    uint64_t header_len = len;
    int ok = fwrite(&header_len, 8, 1, f) == 1 && fwrite(json, 1, len, f) == len;
    size_t largest = 0;   // the buffer holds the largest tensor of the list (wte, wpe or an MLP matrix)
    for (int i = 0; i < n; i++)
        if ((size_t)list[i].rows * (size_t)list[i].cols > largest)
            largest = (size_t)list[i].rows * (size_t)list[i].cols;
    float *buf = (float *)mt_malloc(largest * sizeof(float), "export");
    for (int i = 0; i < n && ok; i++) {
        const hf_tensor *t = &list[i];
        size_t per = (size_t)t->rows * t->cols;
        const float *src = full.global[0][t->tensor] + (t->layer >= 0 ? (size_t)t->layer * per : 0);
        if (t->transpose)   // ours (rows = out, cols = in) -> Conv1D's (in, out)
            for (int a = 0; a < t->rows; a++)
                for (int b = 0; b < t->cols; b++) buf[(size_t)b * t->rows + a] = src[(size_t)a * t->cols + b];
        else memcpy(buf, src, per * sizeof(float));
        ok = fwrite(buf, sizeof(float), per, f) == per;
    }
    if (!ok) { mt_atomic_abort(f, tmp); mt_fatal("writing %s failed: %s\nhint: check free disk space", path,
                                                 strerror(errno)); }
    mt_atomic_commit(f, tmp, path);
    free(buf); free(json); free(list);
    // config.json: GPT2Config with our sizes; gelu_new is GPT-2's tanh GELU, as ours
    snprintf(path, sizeof path, "%s/config.json", out_dir);
    f = mt_atomic_open(path, tmp, sizeof tmp);
    fprintf(f, "{\n  \"architectures\": [\"GPT2LMHeadModel\"],\n  \"model_type\": \"gpt2\",\n  \"vocab_size\": %d,\n"
               "  \"n_positions\": %d,\n  \"n_embd\": %d,\n  \"n_layer\": %d,\n  \"n_head\": %d,\n  \"n_inner\": %d,\n"
               "  \"activation_function\": \"gelu_new\",\n  \"layer_norm_epsilon\": 1e-05,\n  \"resid_pdrop\": 0.0,\n"
               "  \"embd_pdrop\": 0.0,\n  \"attn_pdrop\": 0.0,\n  \"bos_token_id\": 50256,\n"
               "  \"eos_token_id\": 50256,\n"
               "  \"tie_word_embeddings\": true,\n  \"torch_dtype\": \"float32\"\n}\n",
            V, maxT, C, L, cfg->model.num_attention_heads, F);
    mt_atomic_commit(f, tmp, path);
    printf("exported %s (iteration %d) as Hugging Face GPT-2 to %s/model.safetensors and config.json\n", src,
           full.iteration, out_dir);
    int iteration = full.iteration;
    mt__ckpt_free_full(&full);
    return iteration;
}

// The way back: a Hugging Face GPT-2 directory (config.json, model.safetensors as transformers'
// save_pretrained writes it, or as our export does) into our checkpoint for any TP x PP. Names
// may carry GPT2LMHeadModel's "transformer." prefix; lm_head.weight (tied to wte) and the
// attention's mask buffers (attn.bias, attn.masked_bias of older versions) are skipped. F32, F16
// and BF16 tensors are read (as fp32). The checkpoint is iteration 1 with AdamW's moments at 0:
// fine-tuning from it starts at iteration 2. Export then import gives back the same bits.
static float mt__half_to_float(uint16_t h) {   // IEEE binary16 -> binary32, exactly
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 31, man = h & 1023u, bits;
    if (exp == 31) bits = sign | 0x7f800000u | (man << 13);          // inf, NaN
    else if (exp) bits = sign | ((exp + 112) << 23) | (man << 13);   // normal: rebias 15 -> 127
    else if (!man) bits = sign;                                      // zero
    else {                                                           // subnormal: normalise
        int e = -1;
        do { man <<= 1; e++; } while (!(man & 1024u));
        bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 1023u) << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static double mt__hf_config_number(const char *json, size_t len, const char *path, const char *key, double fallback) {
    mt_json j;
    mt_json_init(&j, json, len, 0);
    if (!mt_json_find(&j, key) || (j.p < j.end && *j.p == 'n')) {   // absent or null
        if (fallback < 0) mt_fatal("%s has no \"%s\"\nhint: --import-hf reads a GPT2LMHeadModel's config.json", path,
                                   key);
        return fallback;
    }
    double v;
    if (!mt_json_number(&j, &v)) mt_fatal("%s: \"%s\" is not a number", path, key);
    if (strcmp(key, "layer_norm_epsilon") != 0 && (v != floor(v) || v < 0 || v > (double)(1 << 26)))
        mt_fatal("%s: \"%s\" is %g, not a size\nhint: the file is damaged", path, key, v);
    return v;
}

int mt_checkpoint_import_hf(const char *hf_dir, const char *dst, int tp, int pp, int layers_per_virtual) {
    char path[MT_PATH_MAX + 64];
    // config.json: GPT2Config
    snprintf(path, sizeof path, "%s/config.json", hf_dir);
    FILE *f = fopen(path, "rb");
    if (!f) mt_fatal("cannot open %s: %s\nhint: --import-hf DIR needs DIR/config.json and DIR/model.safetensors "
                     "(transformers' save_pretrained writes both)", path, strerror(errno));
    char *text = (char *)mt_malloc(1 << 20, "config.json");
    size_t len = fread(text, 1, (1 << 20) - 1, f);
    fclose(f);
    text[len] = 0;
    mt__full_checkpoint full;
    memset(&full, 0, sizeof full);
    mt_config *cfg = &full.cfg;
    mt_config_defaults(cfg);
    cfg->model.num_layers = (int)mt__hf_config_number(text, len, path, "n_layer", -1);
    cfg->model.hidden_size = (int)mt__hf_config_number(text, len, path, "n_embd", -1);
    cfg->model.num_attention_heads = (int)mt__hf_config_number(text, len, path, "n_head", -1);
    cfg->model.ffn_hidden_size = (int)mt__hf_config_number(text, len, path, "n_inner", 0);   // null: 4C
    cfg->model.max_position_embeddings = (int)mt__hf_config_number(text, len, path, "n_positions", -1);
    cfg->model.seq_length = cfg->model.max_position_embeddings;
    cfg->model.vocab_size = (int)mt__hf_config_number(text, len, path, "vocab_size", -1);
    double eps = mt__hf_config_number(text, len, path, "layer_norm_epsilon", 1e-5);
    mt_json j;
    mt_json_init(&j, text, len, 0);
    int gelu_new = !mt_json_find(&j, "activation_function") || strncmp(j.p, "\"gelu_new\"", 10) == 0;
    mt_json_init(&j, text, len, 0);
    int untied = mt_json_find(&j, "tie_word_embeddings") && strncmp(j.p, "false", 5) == 0;
    free(text);
    if (eps != 1e-5 || !gelu_new || untied)
        mt_fatal("%s: a GPT-2 with %s; megatron.h's GPT is GPT-2's own (LayerNorm eps 1e-5, gelu_new, tied LM head)\n"
                 "hint: import a GPT2LMHeadModel with the standard configuration", path,
                 eps != 1e-5 ? "another layer_norm_epsilon" : !gelu_new ? "another activation_function"
                                                             : "an untied LM head");
    cfg->train.train_iters = 1;
    mt_config_derive(cfg);   // the sizes must make a model (heads divide the width, ...)
    // model.safetensors: every tensor GPT-2 has, in our layout
    snprintf(path, sizeof path, "%s/model.safetensors", hf_dir);
    f = fopen(path, "rb");
    if (!f) mt_fatal("cannot open %s: %s\nhint: save the model with safe_serialization (transformers' default)", path,
                     strerror(errno));
    uint64_t header_len = 0;
    long file_size = 0;
    char *header = mt__ckpt_header(f, path, &header_len, &file_size);
    uint64_t data_start = 8 + header_len, data_size = (uint64_t)file_size - data_start;
    mt_rank shape;
    mt__shape_rank(&shape, cfg, 0, 0);   // one rank holds everything: the full shapes
    for (int i = 0; i < MT_NUM_PARAM_TENSORS; i++) {
        const mt_param_spec *sp = &shape.model.specs[i];
        full.count[i] = (size_t)(sp->layers ? cfg->model.num_layers : 1) * sp->grows * sp->gcols;
        for (int k = 0; k < 3; k++) full.global[k][i] = (float *)mt_calloc(full.count[i] + 1, sizeof(float),
                                                                           "imported checkpoint");
    }
    hf_tensor *list = (hf_tensor *)mt_calloc((size_t)(4 + 12 * cfg->model.num_layers), sizeof(hf_tensor), "import");
    int n = mt__hf_tensors(cfg, list);
    size_t largest = 0;
    for (int i = 0; i < n; i++)
        if ((size_t)list[i].rows * list[i].cols > largest) largest = (size_t)list[i].rows * list[i].cols;
    unsigned char *raw = (unsigned char *)mt_malloc(largest * 4, "import");
    float *buf = (float *)mt_malloc(largest * sizeof(float), "import");
    for (int i = 0; i < n; i++) {
        const hf_tensor *t = &list[i];
        char name[96];
        mt_json hdr, tj, v;
        mt_json_init(&hdr, header, (size_t)header_len, 0);
        snprintf(name, sizeof name, "transformer.%s", t->name);   // save_pretrained's names
        if (!mt__ckpt_member(&hdr, name, &tj) && !mt__ckpt_member(&hdr, t->name, &tj))
            mt_fatal("%s has no tensor %s\nhint: --import-hf reads GPT2LMHeadModel's weights", path, t->name);
        int elem = 0;   // bytes per element: F32 4, F16 2 (code 2), BF16 2 (code 3)
        int code = 0;
        if (mt__ckpt_member(&tj, "dtype", &v)) {
            if (strncmp(v.p, "\"F32\"", 5) == 0) { elem = 4; code = 1; }
            else if (strncmp(v.p, "\"F16\"", 5) == 0) { elem = 2; code = 2; }
            else if (strncmp(v.p, "\"BF16\"", 6) == 0) { elem = 2; code = 3; }
        }
        if (!elem) mt_fatal("%s: tensor %s is not F32, F16 or BF16", path, t->name);
        long long shp[8], offs[2];
        int nd = mt__ckpt_member(&tj, "shape", &v) ? mt_json_ints(&v, shp, 8) : -1;
        // Conv1D weights are (in, out) = (cols, rows) of ours; vectors (cols); wte, wpe (rows, cols)
        int want_nd = t->rows == 1 ? 1 : 2;
        long long want0 = t->rows == 1 ? t->cols : t->transpose ? t->cols : t->rows;
        long long want1 = t->transpose ? t->rows : t->cols;
        if (nd != want_nd || shp[0] != want0 || (nd == 2 && shp[1] != want1))
            mt_fatal("%s: tensor %s has another shape than config.json says\nhint: the directory mixes two models",
                     path, t->name);
        size_t count = (size_t)t->rows * t->cols, bytes = count * (size_t)elem;
        int n_offs = mt__ckpt_member(&tj, "data_offsets", &v) ? mt_json_ints(&v, offs, 2) : -1;
        if (n_offs != 2 || offs[0] < 0 || (uint64_t)(offs[1] - offs[0]) != bytes || (uint64_t)offs[1] > data_size)
            mt_fatal("%s: tensor %s has bad data offsets (the file is truncated or damaged)", path, t->name);
        fseek(f, (long)(data_start + (uint64_t)offs[0]), SEEK_SET);
        if (fread(raw, 1, bytes, f) != bytes) mt_fatal("%s: short read of %s", path, t->name);
        for (size_t e = 0; e < count; e++) {   // to fp32, in the file's order
            if (code == 1) memcpy(&buf[e], raw + 4 * e, 4);
            else {
                uint16_t h;
                memcpy(&h, raw + 2 * e, 2);
                if (code == 2) buf[e] = mt__half_to_float(h);
                else { uint32_t bits = (uint32_t)h << 16; memcpy(&buf[e], &bits, 4); }
            }
        }
        float *dst_t = full.global[0][t->tensor] + (t->layer >= 0 ? (size_t)t->layer * count : 0);
        if (t->transpose)   // Conv1D's (in, out) -> ours (rows = out, cols = in)
            for (int a = 0; a < t->rows; a++)
                for (int b = 0; b < t->cols; b++) dst_t[(size_t)a * t->cols + b] = buf[(size_t)b * t->rows + a];
        else memcpy(dst_t, buf, count * sizeof(float));
    }
    fclose(f);
    free(raw); free(buf); free(list); free(header);
    full.iteration = 1;
    mt_config target = *cfg;
    target.parallel.tensor_model_parallel_size = tp;
    target.parallel.pipeline_model_parallel_size = pp;
    target.parallel.nproc_per_node = tp * pp;
    target.parallel.num_layers_per_virtual_pipeline_stage = layers_per_virtual;
    target.train.global_batch_size = layers_per_virtual > 0 ? pp : 1;
    mt_config_derive(&target);   // checks that the model splits this way (heads, layers, ffn)
    mt__ckpt_write_full(&full, &target, dst);
    printf("imported %s (GPT-2: L=%d C=%d NH=%d V=%d maxT=%d) into %s (TP=%d, PP=%d) as iteration 1\n", hf_dir,
           cfg->model.num_layers, cfg->model.hidden_size, cfg->model.num_attention_heads, cfg->model.vocab_size,
           cfg->model.max_position_embeddings, dst, tp, pp);
    mt__ckpt_free_full(&full);
    return 1;
}

// =============================================================================================
// 11. GENERATION
// =============================================================================================
// Mirrors megatron/inference/text_generation (generation.py, sampling.py) and the KV cache of
// its inference_params: text continued one token at a time, collective over the ranks of one
// model replica (TP x PP). Three parts, the naive one first, as picotron puts them side by side:
//   sampling     the next token from a row of logits: greedy, temperature, top-k, top-p
//   uncached     the training forward run again over the whole window for every token (what
//                --tokens-to-generate did before the cache; kept as the tests' reference)
//   KV cache     the prompt in one pass (prefill), then one token per step that reads every
//                earlier position's keys and values from the cache instead of recomputing them
//
//   prefill   tokens (B, Tp) -> x (B,Tp,C) -> layers, each storing K,V (B,Tp,C_tp) at 0..Tp-1
//             -> the last prompt token's hidden (B,C) -> ln_f -> logits (B,Vp) -> sample
//   decode    token (B,1) at position pos_b -> x (B,1,C) -> layers: K,V at pos_b, attention
//             over 0..pos_b -> logits (B,Vp) -> sample; pos_b += 1
//
// Prompts of different lengths share a batch: they are right-padded to the longest, Tp. A
// causal mask means a real token never sees the padding after it; the padding's keys land in
// the cache past the prompt and are overwritten by the generated tokens before any query can
// reach them (each sequence decodes at its own position pos_b, so none waits for the others).
// Every parallel layout samples the same tokens as one rank: the TP ranks hold their heads'
// K and V and their vocabulary slice of the logits (gathered before sampling, so every TP rank
// samples the same token from the same numbers); the pipeline stages pass the hidden state
// (B,Tq,C) forward and the last stage sends the sampled tokens back to all stages.

// ---------------------------------------------------------------------------------------------
// sampling (megatron/inference/text_generation/sampling.py): logits / temperature, keep the
// top_k largest, keep the smallest head of the rest (sorted) whose probability reaches top_p,
// renormalise, draw. The draw for token `position` of sequence `sequence` is the counter-based
// uniform (seed, "next", position, sequence): the same tokens whatever the batch or layout. The
// arithmetic is section 3's op (mt_sample_row_cpu, in integers), which the GPU runs on the device.
mt_draw mt_sampling_draw(const mt_sampling *s, uint64_t sequence, uint64_t position) {
    mt_draw d = {mt_rand_uniform(s->seed, 0x6e657874, position, sequence, 0), s->temperature, s->top_k, s->top_p};
    return d;
}
int mt_sample_token(const float *logits, int V, const mt_sampling *s, uint64_t sequence, uint64_t position) {
    mt_draw d = mt_sampling_draw(s, sequence, position);
    return mt_sample_row_cpu(logits, V, &d);
}

// ---------------------------------------------------------------------------------------------
// uncached: the training forward over the window, for every new token (llm.c's way). A sequence
// of n tokens fills positions 0..n-1 of every sample of one micro-batch (the rest is padding the
// causal mask never lets position n-1 see); the last stage reads the logits at position n-1,
// the TP ranks gather their vocabulary slices, every one of them samples the same token, and the
// pipeline's last stage tells the others. Past T tokens the window slides.
typedef struct { const int32_t *ids; int n; } mt__gen_window;

static void mt__gen_batch(mt_rank *r, void *vctx, int iteration, int mb, int *tokens, int *targets) {
    (void)iteration; (void)mb;
    const mt__gen_window *w = (const mt__gen_window *)vctx;
    for (int b = 0; b < r->dims.B; b++)
        for (int t = 0; t < r->dims.T; t++) {
            tokens[b * r->dims.T + t] = t < w->n ? w->ids[t] : 0;
            targets[b * r->dims.T + t] = 0;
        }
}

int mt_generate_uncached(mt_rank *r, int32_t *ids, int n, int cap, int count, const mt_sampling *s, uint64_t sequence,
                         float *logits_out) {
    const mt_config *cfg = r->cfg;
    int V = cfg->model.vocab_size, Vp = cfg->padded_vocab_size, T = r->dims.T;
    float *row = (float *)mt_malloc(sizeof(float) * (size_t)Vp, "logits row");
    mt_dtype dt = mt_logits_storage_dtype(r);   // how the head stored the logits
    float *gathered = NULL;   // the TP ranks' slices side by side, in the buffers' memory
    if (r->ps.is_last_stage && r->ps.tp_size > 1) gathered = mt_buffer_alloc(r, (size_t)Vp, "logits row");
    mt_sched_step list[64];
    int steps = mt_schedule_forward_only(1, r->ps.vp_size, list);
    r->state.training = 0;
    for (int k = 0; k < count && n < cap; k++) {
        // the window: the last T tokens at most
        mt__gen_window w = {ids + (n > T ? n - T : 0), n > T ? T : n};
        mt__run_schedule(r, list, steps, mt__gen_batch, &w, 0);
        mt_activations *a = mt__slot_for(r, 0, 0);
        float next = 0.0f;
        if (r->ps.is_last_stage) {
            // sample 0, position n-1: its Vp_tp logits, as they are stored (16 bits: half the floats)
            size_t row_floats = dt == MT_DTYPE_FP32 ? (size_t)r->dims.Vp_tp : (size_t)r->dims.Vp_tp / 2;
            const float *mine = a->logits + (size_t)(w.n - 1) * row_floats;
            if (gathered) {
                mt_all_gather(&r->groups.tp, mine, gathered, row_floats);
                mt_buffer_download(r, row, gathered, sizeof(float) * row_floats * (size_t)r->ps.tp_size);
            } else {
                mt_buffer_download(r, row, mine, sizeof(float) * row_floats);
            }
            if (dt != MT_DTYPE_FP32) mt_widen_16bit(row, (size_t)Vp, dt);   // 16-bit values, widened in place
            if (logits_out) memcpy(logits_out + (size_t)k * V, row, sizeof(float) * (size_t)V);
            next = (float)mt_sample_token(row, V, s, sequence, (uint64_t)n);
        }
        a->mb = -1;
        if (r->ps.pp_size > 1) mt_broadcast(&r->groups.pp, &next, 1, r->ps.pp_size - 1);   // host value, threads
        ids[n++] = (int32_t)next;
    }
    free(row);
    if (gathered) mt_buffer_free(gathered);
    return n;
}

// ---------------------------------------------------------------------------------------------
// the KV cache and the decoding buffers: one allocation each, carved like the activations
// ---------------------------------------------------------------------------------------------
static size_t mt__carve_generator(const mt_rank *r, mt_generator *g, float *base) {
    size_t BTq = (size_t)g->max_tokens, B = (size_t)g->max_batch, C = (size_t)r->dims.C;
    size_t C_tp = (size_t)r->dims.C_tp, F_tp = (size_t)r->dims.F_tp, Vp_tp = (size_t)r->dims.Vp_tp;
    size_t cache = (size_t)r->dims.L_local * B * (size_t)g->cap * C_tp;
    int last = r->ps.is_last_stage;
    struct { float **ptr; size_t n; } carve[] = {
        {&g->kcache, cache}, {&g->vcache, cache},
        {&g->x, BTq * C}, {&g->res2, BTq * C}, {&g->ln, BTq * C}, {&g->ln_mean, BTq}, {&g->ln_rstd, BTq},
        {&g->qkv, BTq * 3 * C_tp}, {&g->atty, BTq * C_tp}, {&g->fch, BTq * F_tp}, {&g->fch_gelu, BTq * F_tp},
        {&g->out_c, BTq * C},
        {&g->last, last ? B * C : 0}, {&g->lnf, last ? B * C : 0}, {&g->lnf_mean, last ? B : 0},
        {&g->lnf_rstd, last ? B : 0}, {&g->logits, last ? B * Vp_tp : 0},
        {&g->gathered, last && r->ps.tp_size > 1 ? B * Vp_tp * (size_t)r->ps.tp_size : 0},
        {&g->whole, last && r->ps.tp_size > 1 ? B * Vp_tp * (size_t)r->ps.tp_size : 0},
    };
    size_t offset = 0;
    for (size_t i = 0; i < sizeof carve / sizeof carve[0]; i++) {
        *carve[i].ptr = (base && carve[i].n) ? base + offset : NULL;
        offset += (carve[i].n + 3) / 4 * 4;   // each piece 16-byte aligned: the GPU reads them as float4
    }
    return offset;
}

void mt_generator_init(mt_rank *r, mt_generator *g, int max_batch, int max_tokens, int cap) {
    memset(g, 0, sizeof *g);
    int maxT = r->cfg->model.max_position_embeddings;
    if (cap > maxT) cap = maxT;
    g->max_batch = max_batch;
    g->max_tokens = max_tokens > max_batch ? max_tokens : max_batch;
    g->cap = cap;
    size_t n = mt__carve_generator(r, g, NULL);
    g->memory = mt_buffer_alloc(r, n, "KV cache and decoding buffers");
    mt__carve_generator(r, g, g->memory);
    g->bytes = n * sizeof(float);
    g->cache_bytes = 2 * (size_t)r->dims.L_local * (size_t)max_batch * (size_t)cap * (size_t)r->dims.C_tp *
                     sizeof(float);
    // ids: tokens (BTq), positions (BTq), start (BTq), draws (4 B: mt_draw is 4 ints wide), next (B),
    // the queued steps' counter (1), their draws (4 B cap)
    size_t BTq = (size_t)g->max_tokens, B = (size_t)max_batch, draw_ints = sizeof(mt_draw) / sizeof(int);
    g->ids = mt_buffer_alloc_ints(r, 3 * BTq + draw_ints * B + B + 4 + draw_ints * B * (size_t)cap, "decoding ids");
    g->tokens = g->ids;
    g->positions = g->ids + BTq;
    g->start = g->ids + 2 * BTq;
    g->draws = (mt_draw *)(g->ids + 3 * BTq);
    g->next = g->ids + 3 * BTq + draw_ints * B;
    g->step = g->next + B;
    g->plan = (mt_draw *)(g->step + 4);
    g->host_plan = (mt_draw *)mt_calloc(B * (size_t)cap, sizeof(mt_draw), "decoding draws");
    g->ring = (int *)mt_buffer_alloc_host(r, MT_GEN_RING * B, "decoded tokens");   // floats and ints: 4 bytes
    g->host_next = (int *)mt_calloc(B, sizeof(int), "decoding ids");
    g->host_ids = (int *)mt_calloc(3 * BTq + draw_ints * B, sizeof(int), "decoding ids");
    g->host_draws = (mt_draw *)(g->host_ids + 3 * BTq);
    size_t work = mt_sample_rows_work_bytes(max_batch, r->cfg->padded_vocab_size);   // the whole rows
    if (r->ps.is_last_stage && work > 0)
        g->sample_work = mt_buffer_alloc(r, (work + sizeof(float) - 1) / sizeof(float), "sampling work");
    g->host_msg = (float *)mt_calloc(BTq * (size_t)r->dims.C, sizeof(float), "pipeline messages");
    size_t Vp = (size_t)r->cfg->padded_vocab_size;
    g->host_logits = (float *)mt_calloc((size_t)max_batch * Vp, sizeof(float), "logits");
    g->host_gathered = (float *)mt_calloc((size_t)max_batch * Vp, sizeof(float), "logits");
    g->graphs = (void **)mt_calloc(3 * (size_t)max_batch, sizeof(void *), "decode graphs");
    g->rank = r;
    mt_device_weights16(r, MT_WEIGHTS16_DECODING);   // the weights in the operand type, read once per token
}

void mt_generator_free(mt_generator *g) {
    mt_buffer_free(g->memory);
    mt_buffer_free(g->ids);
    if (g->sample_work) mt_buffer_free((float *)g->sample_work);
    free(g->host_ids); free(g->host_msg); free(g->host_logits); free(g->host_gathered); free(g->host_plan);
    mt_buffer_free_host(g->ring);
    for (int b = 0; b < 3 * g->max_batch; b++) mt_device_graph_free(g->graphs[b]);
    free(g->graphs);
    free(g->host_next);
    if (g->rank) mt_device_weights16(g->rank, MT_WEIGHTS16_OFF);
    memset(g, 0, sizeof *g);
}

// pipeline messages of generation: (B,Tq,C) hidden states through the host, as section 8's
static void mt__gen_send(mt_rank *r, mt_generator *g, const float *buf, size_t n, int peer_stage, int chunk) {
    mt_buffer_download(r, g->host_msg, buf, n * sizeof(float));
    mt_send(&r->groups.pp, g->host_msg, n, peer_stage, mt__p2p_tag(0, 0, chunk));
}
static void mt__gen_recv(mt_rank *r, mt_generator *g, float *buf, size_t n, int peer_stage, int chunk) {
    mt_recv(&r->groups.pp, g->host_msg, n, peer_stage, mt__p2p_tag(0, 0, chunk));
    mt_buffer_upload(r, buf, g->host_msg, n * sizeof(float));
}

// one transformer layer over Tq new tokens per sequence, reading and extending layer l's cache:
// section 5's mt__layer_forward with the attention over the cache and without dropout
//   x (B,Tq,C) in, and out: x = res2 + fcproj(gelu(fc(ln2(res2)))), res2 = x + attproj(attn(ln1(x)))
// x_pending: the layer before left its output as res2 + out_c (the residual add not yet done); this
// layer's first op adds them into x as it normalises (mt_residual_layernorm_forward: one kernel
// where two were, the same arithmetic). The chunk's last layer adds them itself (x_last).
static void mt__gen_layer(mt_rank *r, mt_generator *g, int l, int B, int Tq, int x_pending, int x_last) {
    int C = r->dims.C, BT = B * Tq, C_tp = r->dims.C_tp, F_tp = r->dims.F_tp;
    mt_params *p = &r->model.params;
    float *l_ln1w = p->ln1w + (size_t)l * C, *l_ln1b = p->ln1b + (size_t)l * C;
    float *l_qkvw = p->qkvw + (size_t)l * 3 * C_tp * C, *l_qkvb = p->qkvb + (size_t)l * 3 * C_tp;
    float *l_attprojw = p->attprojw + (size_t)l * C * C_tp, *l_attprojb = p->attprojb + (size_t)l * C;
    float *l_ln2w = p->ln2w + (size_t)l * C, *l_ln2b = p->ln2b + (size_t)l * C;
    float *l_fcw = p->fcw + (size_t)l * F_tp * C, *l_fcb = p->fcb + (size_t)l * F_tp;
    float *l_fcprojw = p->fcprojw + (size_t)l * C * F_tp, *l_fcprojb = p->fcprojb + (size_t)l * C;
    size_t per_layer = (size_t)g->max_batch * g->cap * C_tp;   // this layer's (B, cap, C_tp) slab
    float *l_kcache = g->kcache + (size_t)l * per_layer, *l_vcache = g->vcache + (size_t)l * per_layer;
    // attention block: x = res2 + out_c (the layer before's residual add) where pending, ln = layernorm(x)
    if (x_pending)
        mt_residual_layernorm_forward(r, g->x, g->ln, g->ln_mean, g->ln_rstd, g->res2, g->out_c, l_ln1w, l_ln1b, B, Tq,
                                      C, MT_DTYPE_FP32);
    else mt_layernorm_forward(r, g->ln, g->ln_mean, g->ln_rstd, g->x, l_ln1w, l_ln1b, B, Tq, C, MT_DTYPE_FP32);
    // qkv = ln Wqkv^T + b, then the attention over the cache: one kernel for one sequence's new token
    // where the device has it (mt_qkv_attention_decode), else the two ops
    if (!(BT == 1 && r->ps.tp_size == 1 &&
          mt_qkv_attention_decode(r, g->atty, l_kcache, l_vcache, g->ln, l_qkvw, l_qkvb, g->start, C, C_tp,
                                  r->dims.NH_tp, g->cap))) {
        mt_column_parallel_linear_forward(r, g->qkv, g->ln, l_qkvw, l_qkvb, BT, C, 3 * C_tp);
        mt_attention_cached_forward(r, g->atty, l_kcache, l_vcache, g->qkv, g->start, B, Tq, C_tp, r->dims.NH_tp,
                                    g->cap);
    }
    mt_row_parallel_linear_forward(r, g->out_c, g->atty, MT_DTYPE_FP32, l_attprojw, l_attprojb, NULL, BT, C_tp, C);
    // MLP block: res2 = x + out_c, ln = layernorm(res2)
    mt_residual_layernorm_forward(r, g->res2, g->ln, g->ln_mean, g->ln_rstd, g->x, g->out_c, l_ln2w, l_ln2b, B, Tq, C,
                                  MT_DTYPE_FP32);
    mt_column_parallel_linear_gelu_forward(r, g->fch, g->fch_gelu, g->ln, l_fcw, l_fcb, BT, C, F_tp);
    mt_row_parallel_linear_forward(r, g->out_c, g->fch_gelu, MT_DTYPE_FP32, l_fcprojw, l_fcprojb, NULL, BT, F_tp, C);
    if (x_last) mt_residual_forward(r, g->x, g->res2, g->out_c, (size_t)BT * C);   // else the next layer's first op
}

// a decode step of the whole replica (TP = PP = 1, one new token per sequence) handed to the
// backend as one piece (mt_device_decode_step): the same layers as mt__gen_layer and the same head,
// in the generator's buffers. 0: the backend has no such kernel (the CPU) or declines the shape.
static int mt__gen_one_launch(mt_rank *r, mt_generator *g, int B, int greedy) {
    const mt_params *p = &r->model.params;
    mt_decode_step s = {B, r->dims.L_local, r->dims.C, r->dims.NH_tp, r->dims.F_tp, r->cfg->model.vocab_size,
                        r->dims.Vp_tp, g->cap, g->tokens, g->positions, g->start,
                        p->wte, p->wpe, p->lnfw, p->lnfb, p->ln1w, p->ln1b, p->qkvw, p->qkvb, p->attprojw, p->attprojb,
                        p->ln2w, p->ln2b, p->fcw, p->fcb, p->fcprojw, p->fcprojb,
                        g->kcache, g->vcache, (size_t)g->max_batch * g->cap * r->dims.C_tp,
                        g->x, g->res2, g->qkv, g->atty, g->out_c, g->fch, g->fch_gelu, g->logits,
                        greedy ? g->next : NULL};
    return mt_device_decode_step(r, &s);
}

// a step's inputs into g's device buffers: the tokens, their positions, each sequence's first
// position, and the draws the caller set in g->host_draws
static void mt__gen_inputs(mt_rank *r, mt_generator *g, const int32_t *tokens, const int *start, int B, int Tq) {
    size_t BT = (size_t)B * Tq;
    if (B > g->max_batch || (int)BT > g->max_tokens)
        mt_fatal("internal: %d sequences x %d tokens do not fit the decoding buffers (%d x %d)", B, Tq, g->max_batch,
                 g->max_tokens / g->max_batch);
    for (int b = 0; b < B; b++) {
        if (start[b] < 0 || start[b] + Tq > g->cap)
            mt_fatal("internal: positions %d..%d of sequence %d are outside the KV cache (%d positions)", start[b],
                     start[b] + Tq - 1, b, g->cap);
        for (int t = 0; t < Tq; t++) {
            g->host_ids[b * Tq + t] = tokens[b * Tq + t];
            g->host_ids[g->max_tokens + b * Tq + t] = start[b] + t;   // its position
        }
        g->host_ids[2 * g->max_tokens + b] = start[b];
    }
    mt_buffer_upload(r, g->ids, g->host_ids, 3 * (size_t)g->max_tokens * sizeof(int) + (size_t)B * sizeof(mt_draw));
}

// A decode step on a rank that is the whole replica (TP = PP = 1: no collectives, no pipeline
// messages) queues the same work every step, its inputs in g->ids: it is recorded once per batch
// size as a CUDA graph and then replayed as one launch (GPU build; the CPU runs it). With the
// device picking the tokens it is also one of the steps queued ahead (mt_generate_batch): its
// last op makes the next step's inputs (mt_decode_advance).
static int mt__gen_graphable(const mt_rank *r, int Tq) {
    return Tq == 1 && r->ps.tp_size == 1 && r->ps.pp_size == 1;
}

// a step's work from the inputs in g's device buffers: the layers, and on the last stage the head
// and (the device picking) the tokens. Queued on the device; the caller fetches the results.
static void mt__gen_compute(mt_rank *r, mt_generator *g, const int *last, int B, int Tq) {
    int C = r->dims.C, s = r->ps.pp_rank, pp = r->ps.pp_size, lpc = r->dims.layers_per_chunk;
    size_t BT = (size_t)B * Tq, BTC = BT * (size_t)C;
    r->state.decoding = 1;   // the layers see whole (B, Tq, C) tensors: no sequence parallelism
    int graphable = mt__gen_graphable(r, Tq);
    int pick = g->pick, slot = 3 * (B - 1) + pick, queued = graphable && pick != MT_PICK_HOST;
    if (graphable && pick != MT_PICK_SAMPLE && mt__gen_one_launch(r, g, B, pick == MT_PICK_ARGMAX)) {
        // the whole step ran as one kernel (GPU build; section 3's mt_device_decode_step)
        if (queued)
            mt_decode_advance(r, g->tokens, g->positions, g->start, g->draws, g->step, g->ring, g->next, g->plan,
                              g->cap, MT_GEN_RING, B, g->cap);
    } else if (graphable && g->graphs[slot]) {
        mt_device_graph_launch(r, g->graphs[slot]);
    } else {
        if (graphable) mt_device_capture_begin(r, 1);
        for (int chunk = 0; chunk < r->ps.vp_size; chunk++) {
            if (mt__is_first_virtual(r, chunk)) {
                // x = wte[token] + wpe[position]; vocab-parallel, g's all-reduce sums the TP ranks'
                // rows: wpe's comes from TP rank 0 only
                mt_embedding_positions_forward(r, g->x, g->tokens, r->model.params.wte, g->positions,
                                               r->ps.tp_rank == 0 ? r->model.params.wpe : NULL, B, Tq, C,
                                               r->dims.vocab_start, r->dims.Vp_tp);
                mt_reduce_from_tp_region_forward(r, g->x, BTC);
            } else {
                mt__gen_recv(r, g, g->x, BTC, s > 0 ? s - 1 : pp - 1, chunk);
            }
            // a decode step's last layer leaves its residual add to the head's layernorm (below)
            int head_adds = Tq == 1 && mt__is_last_virtual(r, chunk);
            for (int j = 0; j < lpc; j++)
                mt__gen_layer(r, g, chunk * lpc + j, B, Tq, j > 0, j == lpc - 1 && !head_adds);
            if (!mt__is_last_virtual(r, chunk)) {
                mt__gen_send(r, g, g->x, BTC, s < pp - 1 ? s + 1 : 0, s < pp - 1 ? chunk : chunk + 1);
                continue;
            }
            // the head, at each sequence's last token: logits (B, Vp_tp) = ln_f(x[b, last_b]) @ wte_r^T.
            // A decode step's x is those rows already (no copies, which would also break the step's
            // chain of kernels in the CUDA graph), and its last residual add, x = res2 + out_c, is
            // done by ln_f's kernel (mt_residual_layernorm_forward: one kernel where two were, the
            // same arithmetic)
            if (head_adds) {
                mt_residual_layernorm_forward(r, g->x, g->lnf, g->lnf_mean, g->lnf_rstd, g->res2, g->out_c,
                                              r->model.params.lnfw, r->model.params.lnfb, B, 1, C, MT_DTYPE_FP32);
            } else {
                const float *x_last = g->x;
                if (Tq > 1) {
                    for (int b = 0; b < B; b++)
                        mt_buffer_copy(r, g->last + (size_t)b * C, g->x + ((size_t)b * Tq + last[b]) * C, (size_t)C);
                    x_last = g->last;
                }
                mt_layernorm_forward(r, g->lnf, g->lnf_mean, g->lnf_rstd, x_last, r->model.params.lnfw,
                                     r->model.params.lnfb, B, 1, C, MT_DTYPE_FP32);
            }
            mt_column_parallel_linear_forward(r, g->logits, g->lnf, r->model.params.wte, NULL, B, C, r->dims.Vp_tp);
            // the token itself, on the device (B ids cross to the host instead of B x Vp logits). At
            // TP > 1 every TP rank first gathers the whole rows, [rank 0's (B,Vp_tp) | rank 1's | ...]
            // re-laid as (B, Vp), and picks from them: the same rows, the same draws, the same tokens
            const float *rows = g->logits;
            int ld = r->dims.Vp_tp, V = r->cfg->model.vocab_size;
            if (pick != MT_PICK_HOST && r->ps.tp_size > 1) {
                size_t Vp_tp = (size_t)r->dims.Vp_tp, Vp = Vp_tp * (size_t)r->ps.tp_size;
                mt_all_gather(&r->groups.tp, g->logits, g->gathered, (size_t)B * Vp_tp);
                for (int k = 0; k < r->ps.tp_size; k++)
                    mt_buffer_copy_strided(r, g->whole + (size_t)k * Vp_tp, Vp, g->gathered + (size_t)k * B * Vp_tp,
                                           Vp_tp, Vp_tp, (size_t)B);
                rows = g->whole;
                ld = (int)Vp;
            }
            if (pick == MT_PICK_ARGMAX) mt_argmax_rows(r, g->next, rows, B, V, ld);
            if (pick == MT_PICK_SAMPLE) mt_sample_rows(r, g->next, rows, B, V, ld, g->draws, g->sample_work);
            // queued ahead: the next step's inputs from these tokens (plan: cap steps of draws), and
            // the tokens into the host's ring
            if (queued)
                mt_decode_advance(r, g->tokens, g->positions, g->start, g->draws, g->step, g->ring, g->next, g->plan,
                                  g->cap, MT_GEN_RING, B, g->cap);
        }
        if (graphable) {
            g->graphs[slot] = mt_device_capture_end(r);   // NULL where the work already ran
            mt_device_graph_launch(r, g->graphs[slot]);
        }
    }
    r->state.decoding = 0;   // the layers are done
}

void mt_generator_forward(mt_rank *r, mt_generator *g, const int32_t *tokens, const int *start, const int *last, int B,
                          int Tq) {
    mt__gen_inputs(r, g, tokens, start, B, Tq);
    mt__gen_compute(r, g, last, B, Tq);
    int pick = g->pick;
    if (!r->ps.is_last_stage) return;
    if (pick != MT_PICK_HOST) {
        mt_buffer_download(r, g->host_next, g->next, (size_t)B * sizeof(int));
        return;
    }
    // every TP rank gets the whole rows: [rank 0's (B,Vp_tp) | rank 1's | ...] -> (B, Vp) on the host
    size_t Vp_tp = (size_t)r->dims.Vp_tp, Vp = (size_t)r->cfg->padded_vocab_size;
    if (r->ps.tp_size > 1) {
        mt_all_gather(&r->groups.tp, g->logits, g->gathered, (size_t)B * Vp_tp);
        mt_buffer_download(r, g->host_gathered, g->gathered, (size_t)B * Vp * sizeof(float));
        for (int k = 0; k < r->ps.tp_size; k++)
            for (int b = 0; b < B; b++)
                memcpy(g->host_logits + b * Vp + k * Vp_tp, g->host_gathered + ((size_t)k * B + b) * Vp_tp,
                       Vp_tp * sizeof(float));
    } else {
        mt_buffer_download(r, g->host_logits, g->logits, (size_t)B * Vp * sizeof(float));
    }
}

// ---------------------------------------------------------------------------------------------
// a batch of prompts, continued together: prefill, then decode steps until every sequence is
// done (max_new_tokens, the end-of-document token, or the last position of the cache)
// ---------------------------------------------------------------------------------------------
void mt_generate_batch(mt_rank *r, mt_generator *g, mt_generate_request *q) {
    int B = q->n, V = r->cfg->model.vocab_size, Tp = 0;
    size_t Vp = (size_t)r->cfg->padded_vocab_size;
    for (int b = 0; b < B; b++) {
        if (q->prompt_lens[b] < 1) mt_fatal("internal: prompt %d is empty (it needs at least <|endoftext|>)", b);
        if (q->prompt_lens[b] > Tp) Tp = q->prompt_lens[b];
    }
    if (Tp > g->cap)
        mt_fatal("a prompt of %d tokens does not fit in the %d positions of the model (--max-position-embeddings)\n"
                 "hint: shorten the prompt", Tp, g->cap);
    int32_t *tok = (int32_t *)mt_calloc((size_t)B * Tp, sizeof(int32_t), "decoding tokens");
    int *start = (int *)mt_calloc((size_t)B, sizeof(int), "positions");
    int *last = (int *)mt_calloc((size_t)B, sizeof(int), "positions");
    int *pos = (int *)mt_calloc((size_t)B, sizeof(int), "positions");
    int *done = (int *)mt_calloc((size_t)B, sizeof(int), "positions");
    float *next = (float *)mt_calloc((size_t)B, sizeof(float), "sampled tokens");
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < q->prompt_lens[b]; t++) tok[b * Tp + t] = q->prompts[b][t];   // padding: id 0
        last[b] = q->prompt_lens[b] - 1;
        pos[b] = q->prompt_lens[b];   // where the next token goes
        q->counts[b] = 0;
        done[b] = q->max_new_tokens <= 0;
    }
    q->stopped_at_max_positions = 0;
    q->steps = 0;
    // without logits wanted, the device picks the tokens: the argmax (mt_sample_token's greedy token), or
    // mt_sample_token's draw (mt_sample_rows: the same integers), each row with the draw of its position
    int greedy = q->sampling.temperature <= 0.0f || q->sampling.top_k == 1;
    g->pick = q->logits ? MT_PICK_HOST : greedy ? MT_PICK_ARGMAX : MT_PICK_SAMPLE;
    int on_device = g->pick != MT_PICK_HOST;
    for (int b = 0; b < B; b++)   // the prompts' next tokens go to positions pos[b]
        g->host_draws[b] = mt_sampling_draw(&q->sampling, (uint64_t)(q->first_sequence + b), (uint64_t)pos[b]);
    // Decode steps queued ahead (TP = PP = 1, the device picking): the host would otherwise wait
    // for each step's tokens before it uploads them as the next step's input and queues it, and
    // the GPU would idle meanwhile (~25 us a step on an H200 at GPT-2 small's ~0.26 ms: docs/perf.md).
    // Instead each step's last op makes the next step's inputs on the device (mt_decode_advance:
    // its tokens, the next positions, the next draws from the plan uploaded once), and the host
    // queues step k + 1 before it reads step k's tokens from the ring in host memory. The tokens
    // are the same: a step computes each row alone, and a sequence that has finished (its end
    // token, its count) goes on decoding rows nobody reads (held at the cache's last position)
    // where the host-driven loop would idle it at position 0. A step queued for a sequence that
    // then ends is waited for and ignored.
    int queued = on_device && mt__gen_graphable(r, 1);
    int last_queued = -1;   // the last decode step queued ahead
    // a step's latency: host-driven, from its inputs' upload to its tokens on the host; queued,
    // from the moment the step before it was done (step 0: queued) to the moment it is done
    // (mt_device_point_done). A step's work may run before the host reads the tokens of the step
    // ahead of it (the CPU build runs a step as it is queued), so the host's own clock would give
    // one step two steps' time and the last none
    double t0 = mt_time_seconds(), done_at = 0;
    mt_generator_forward(r, g, tok, start, last, B, Tp);   // prefill: every prompt token in one pass
    for (int step = 0;; step++) {
        // queued: step > 0 takes decode step step - 1's tokens from the ring
        if (queued && step > 0) {
            if (last_queued < step - 1) mt_fatal("internal: decode step %d was not queued", step - 1);
            mt_device_point_wait(r, (step - 1) % MT_DEVICE_POINTS);
            done_at = mt_device_point_done(r, (step - 1) % MT_DEVICE_POINTS);
            for (int b = 0; b < B; b++) g->host_next[b] = g->ring[(size_t)((step - 1) % MT_GEN_RING) * B + b];
        }
        // sample each sequence's next token (the last stage, every TP rank alike), tell the stages
        if (r->ps.is_last_stage)
            for (int b = 0; b < B; b++) {
                if (done[b]) continue;
                if (on_device) { next[b] = (float)g->host_next[b]; continue; }
                const float *row = g->host_logits + (size_t)b * Vp;
                next[b] = (float)mt_sample_token(row, V, &q->sampling, (uint64_t)(q->first_sequence + b),
                                                 (uint64_t)pos[b]);
                if (q->logits)
                    memcpy(q->logits + ((size_t)b * q->max_new_tokens + q->counts[b]) * V, row, sizeof(float) * V);
            }
        if (r->ps.pp_size > 1) mt_broadcast(&r->groups.pp, next, (size_t)B, r->ps.pp_size - 1);   // host, threads
        int active = 0;
        for (int b = 0; b < B; b++) {
            if (done[b]) continue;
            int32_t id = (int32_t)next[b];
            q->tokens[(size_t)b * q->max_new_tokens + q->counts[b]++] = id;
            if (q->counts[b] >= q->max_new_tokens || id == q->eod) done[b] = 1;
            else if (pos[b] >= g->cap) { done[b] = 1; q->stopped_at_max_positions++; }   // no position left for it
            else active++;
        }
        double now = mt_time_seconds();
        if (step == 0) q->prefill_seconds = now - t0;
        else if (q->step_seconds) q->step_seconds[step - 1] = (queued ? done_at : now) - t0;
        if (active == 0) break;
        if (queued) {
            t0 = step == 0 ? mt_time_seconds() : done_at;
            if (step == 0) {   // decode step 0's inputs, every step's draws, the step counter
                int n_plan = q->max_new_tokens < g->cap ? q->max_new_tokens : g->cap, zero = 0;
                for (int k = 0; k < n_plan; k++)
                    for (int b = 0; b < B; b++)
                        g->host_plan[(size_t)k * B + b] = mt_sampling_draw(&q->sampling,
                                                                           (uint64_t)(q->first_sequence + b),
                                                                           (uint64_t)pos[b] + (uint64_t)k + 1);
                for (int b = 0; b < B; b++) {
                    tok[b] = done[b] ? 0 : (int32_t)next[b];
                    start[b] = done[b] ? 0 : pos[b];
                    g->host_draws[b] = g->host_plan[b];
                }
                mt__gen_inputs(r, g, tok, start, B, 1);
                mt_buffer_upload(r, g->plan, g->host_plan, (size_t)n_plan * B * sizeof(mt_draw));
                mt_buffer_upload(r, g->step, &zero, sizeof(int));
                mt__gen_compute(r, g, last, B, 1);
                mt_device_point(r, 0);
                last_queued = 0;
            }
            for (int b = 0; b < B; b++) if (!done[b]) pos[b]++;
            q->steps++;
            // decode step `step` is queued: queue step + 1 too where a sequence may still want it
            // (unless step's tokens end it), before waiting for step's tokens
            int wanted = 0;
            for (int b = 0; b < B; b++)
                if (!done[b] && q->counts[b] + 1 < q->max_new_tokens && pos[b] < g->cap) wanted = 1;
            if (wanted) {
                mt__gen_compute(r, g, last, B, 1);
                mt_device_point(r, (step + 1) % MT_DEVICE_POINTS);
                last_queued = step + 1;
            }
            continue;
        }
        // decode: every sequence's newest token at its own position (a finished one idles at 0)
        t0 = mt_time_seconds();
        for (int b = 0; b < B; b++) {
            tok[b] = done[b] ? 0 : (int32_t)next[b];
            start[b] = done[b] ? 0 : pos[b];
            last[b] = 0;
            g->host_draws[b] = mt_sampling_draw(&q->sampling, (uint64_t)(q->first_sequence + b), (uint64_t)pos[b] + 1);
        }
        mt_generator_forward(r, g, tok, start, last, B, 1);
        for (int b = 0; b < B; b++) if (!done[b]) pos[b]++;
        q->steps++;
    }
    // a step queued for sequences that then ended: done before the buffers are reused
    if (last_queued >= 0) mt_device_point_wait(r, last_queued % MT_DEVICE_POINTS);
    g->pick = MT_PICK_HOST;
    free(tok); free(start); free(last); free(pos); free(done); free(next);
}

// =============================================================================================
// 12. TRAINING LOOP
// =============================================================================================
// Mirrors megatron/training/training.py: pretrain() -> train() with train_step(),
// training_log() and evaluate_and_print_results(). Every rank runs the same loop on its own
// thread; the last rank prints, as Megatron's print_rank_last.

double mt_flops_per_token(const mt_config *cfg) {
    return 6.0 * (double)mt_model_num_parameters(cfg) +
           12.0 * cfg->model.num_layers * cfg->model.hidden_size * (double)cfg->model.seq_length;
}

size_t mt_model_num_parameters(const mt_config *cfg) {
    size_t C = (size_t)cfg->model.hidden_size, F = (size_t)cfg->model.ffn_hidden_size;
    size_t L = (size_t)cfg->model.num_layers;
    size_t per_layer = 2 * C + 3 * C * C + 3 * C + C * C + C + 2 * C + F * C + F + C * F + C;
    return (size_t)cfg->padded_vocab_size * C + (size_t)cfg->model.max_position_embeddings * C + L * per_layer + 2 * C;
}

// ---------------------------------------------------------------------------------------------
// TensorBoard: the event file (torch.utils.tensorboard's SummaryWriter, as Megatron uses it)
// ---------------------------------------------------------------------------------------------
// Megatron's writer lives on the last rank (megatron/training/global_vars.py); training_log and
// evaluate_and_print_results (megatron/training/training.py) call writer.add_scalar(tag, value,
// iteration) with the tags below. The file is only ever appended to, record by record, and
// flushed (fsync'd) at every --log-interval and whenever --tensorboard-queue-size events are
// pending: a file cut at any byte (a crash, a full disk) reads up to its last complete record.
void mt_tb_open(mt_tb_writer *w, const char *dir, int rank, int queue_size) {
    memset(w, 0, sizeof *w);
    mt__mkdir_p(dir, "--tensorboard-dir");
    char host[64] = "localhost";
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = 0;
    snprintf(w->path, sizeof w->path, "%s/events.out.tfevents.%lld.%s.%d.%d", dir, (long long)time(NULL), host,
             (int)getpid(), rank);
    w->f = fopen(w->path, "ab");
    if (!w->f) mt_fatal("cannot create %s: %s\nhint: check --tensorboard-dir", w->path, strerror(errno));
    w->queue_size = queue_size > 0 ? queue_size : 1;
    unsigned char buf[64];
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    size_t n = mt_tb_event(buf, sizeof buf, (double)ts.tv_sec + ts.tv_nsec * 1e-9, 0, NULL, 0.0f);
    if (!mt_tfrecord_write(w->f, buf, n)) mt_fatal("cannot write %s: %s", w->path, strerror(errno));
    mt_tb_flush(w);
}

void mt_tb_scalar(mt_tb_writer *w, const char *tag, float value, int64_t step) {
    if (!w->f) return;
    unsigned char buf[200];
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    size_t n = mt_tb_event(buf, sizeof buf, (double)ts.tv_sec + ts.tv_nsec * 1e-9, step, tag, value);
    if (!mt_tfrecord_write(w->f, buf, n))
        mt_fatal("cannot write %s: %s\nhint: is the disk full?", w->path, strerror(errno));
    if (++w->pending >= w->queue_size) mt_tb_flush(w);
}

void mt_tb_flush(mt_tb_writer *w) {
    if (!w->f) return;
    if (fflush(w->f) != 0 || fsync(fileno(w->f)) != 0)
        mt_fatal("cannot write %s: %s\nhint: is the disk full?", w->path, strerror(errno));
    w->pending = 0;
}

void mt_tb_close(mt_tb_writer *w) {
    if (!w->f) return;
    mt_tb_flush(w);
    fclose(w->f);
    w->f = NULL;
}

// ---------------------------------------------------------------------------------------------
// the timeline: every rank's spans as a Chrome trace and as an SVG
// ---------------------------------------------------------------------------------------------
// What `nsys` or torch.profiler (Megatron's --profile, --profile-step-start/-end) would show,
// reduced to what the schedule is made of: per rank, each micro-batch's forward and backward of
// the rank's layers (per model chunk), the optimizer step, every communication call (its group
// and bytes) and the pipeline waits (recv: idle, the bubble). The Chrome trace format is a JSON
// list of events; "X" events have a start (ts) and a duration (dur) in microseconds, and a track
// (pid, tid): here tid = the rank. Perfetto (ui.perfetto.dev) and chrome://tracing open it.
static double mt__timeline_origin(const mt_span_log *logs, int world_size, double *end) {
    double t0 = INFINITY, t1 = -INFINITY;
    for (int r = 0; r < world_size; r++)
        for (size_t i = 0; i < logs[r].n; i++) {
            if (logs[r].spans[i].t0 < t0) t0 = logs[r].spans[i].t0;
            if (logs[r].spans[i].t1 > t1) t1 = logs[r].spans[i].t1;
        }
    *end = t1;
    return t0;
}

static void mt__span_label(const mt_span *s, char *out, size_t cap) {
    if (s->kind == MT_SPAN_FORWARD || s->kind == MT_SPAN_BACKWARD)
        snprintf(out, cap, "%c%d", s->kind == MT_SPAN_FORWARD ? 'F' : 'B', s->mb);
    else if (s->kind == MT_SPAN_OPTIMIZER) snprintf(out, cap, "optimizer");
    else if (s->kind == MT_SPAN_RECV) snprintf(out, cap, "wait: recv %s", s->group);
    else snprintf(out, cap, "%s %s", s->name, s->group);
}

int mt_timeline_write_json(const char *path, const mt_config *cfg, const mt_span_log *logs, int world_size) {
    double end, origin = mt__timeline_origin(logs, world_size, &end);
    if (!isfinite(origin)) {
        fprintf(stderr, "WARNING: the timeline is empty: no iteration of the run fell in [--profile-step-start %d, "
                        "--profile-step-end %d)\n", cfg->train.profile_step_start, cfg->train.profile_step_end);
        return 0;
    }
    char tmp[MT_PATH_MAX + 64];
    FILE *f = mt_atomic_open(path, tmp, sizeof tmp);
    fprintf(f, "{\"displayTimeUnit\": \"ms\", \"otherData\": {\"layout\": \"TP=%d PP=%d DP=%d\", "
               "\"micro-batches\": %d},\n\"traceEvents\": [\n",
            cfg->parallel.tensor_model_parallel_size, cfg->parallel.pipeline_model_parallel_size,
            cfg->data_parallel_size, cfg->num_microbatches);
    fprintf(f, "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": 0, \"args\": {\"name\": \"megatron.h\"}}");
    for (int r = 0; r < world_size; r++) {
        mt_parallel_state ps;
        mt_parallel_state_init(&ps, cfg, r);
        fprintf(f, ",\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 0, \"tid\": %d, \"args\": {\"name\": "
                   "\"rank %d (tp %d, dp %d, pp %d)\"}}", r, r, ps.tp_rank, ps.dp_rank, ps.pp_rank);
        fprintf(f, ",\n{\"name\": \"thread_sort_index\", \"ph\": \"M\", \"pid\": 0, \"tid\": %d, \"args\": "
                   "{\"sort_index\": %d}}", r, r);
    }
    static const char *cats[] = {"forward", "backward", "optimizer", "comm", "idle"};
    for (int r = 0; r < world_size; r++)
        for (size_t i = 0; i < logs[r].n; i++) {
            const mt_span *s = &logs[r].spans[i];
            char label[64];
            mt__span_label(s, label, sizeof label);
            fprintf(f, ",\n{\"name\": \"%s\", \"cat\": \"%s\", \"ph\": \"X\", \"pid\": 0, \"tid\": %d, "
                       "\"ts\": %.3f, \"dur\": %.3f, \"args\": {\"iteration\": %d",
                    label, cats[s->kind], r, (s->t0 - origin) * 1e6, (s->t1 - s->t0) * 1e6, s->iteration);
            if (s->kind == MT_SPAN_FORWARD || s->kind == MT_SPAN_BACKWARD)
                fprintf(f, ", \"micro-batch\": %d, \"chunk\": %d, \"layers\": \"%d-%d\"", s->mb, s->chunk,
                        s->layer_first, s->layer_last);
            if (s->kind == MT_SPAN_COMM || s->kind == MT_SPAN_RECV)
                fprintf(f, ", \"group\": \"%s\", \"bytes\": %zu", s->group, s->bytes);
            fprintf(f, "}}");
        }
    fprintf(f, "\n]}\n");
    mt_atomic_commit(f, tmp, path);
    return 1;
}

// the SVG: a lane per rank, time to the right; forward blue, backward green, optimizer orange,
// communication red (a thin band under the work it sits in), waiting for a pipeline message grey
int mt_timeline_write_svg(const char *path, const mt_config *cfg, const mt_span_log *logs, int world_size) {
    double end, origin = mt__timeline_origin(logs, world_size, &end);
    if (!isfinite(origin)) return 0;
    const double left = 150, width = 1100, lane = 44, top = 60;
    double span_s = end - origin > 0 ? end - origin : 1e-6;
    double scale = width / span_s;   // pixels per second
    double height = top + lane * world_size + 70;
    char tmp[MT_PATH_MAX + 64];
    FILE *f = mt_atomic_open(path, tmp, sizeof tmp);
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
               "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
               "font-family=\"Helvetica, Arial, sans-serif\" font-size=\"12\">\n"
               "<rect x=\"0\" y=\"0\" width=\"%.0f\" height=\"%.0f\" fill=\"white\"/>\n",
            left + width + 30, height, left + width + 30, height);
    fprintf(f, "<text x=\"10\" y=\"22\" font-size=\"15\" font-weight=\"bold\">megatron.h timeline: TP=%d PP=%d "
               "DP=%d, %d micro-batches, iterations %d-%d</text>\n",
            cfg->parallel.tensor_model_parallel_size, cfg->parallel.pipeline_model_parallel_size,
            cfg->data_parallel_size, cfg->num_microbatches, cfg->train.profile_step_start,
            cfg->train.profile_step_end - 1);
    static const char *legend[][2] = {{"#4878d0", "forward (F mb)"}, {"#6acc64", "backward (B mb)"},
                                      {"#ee854a", "optimizer"}, {"#d65f5f", "communication"},
                                      {"#c8c8c8", "waiting for a pipeline message"}};
    for (int k = 0; k < 5; k++) {
        double x = 10 + 190 * k;
        fprintf(f, "<rect x=\"%.0f\" y=\"34\" width=\"12\" height=\"12\" fill=\"%s\"/><text x=\"%.0f\" y=\"45\">%s"
                   "</text>\n", x, legend[k][0], x + 16, legend[k][1]);
    }
    for (int r = 0; r < world_size; r++) {
        mt_parallel_state ps;
        mt_parallel_state_init(&ps, cfg, r);
        double y = top + lane * r;
        fprintf(f, "<rect x=\"%.0f\" y=\"%.1f\" width=\"%.0f\" height=\"%.1f\" fill=\"%s\"/>\n", left, y, width,
                lane - 4, r % 2 ? "#f4f4f4" : "#fafafa");
        fprintf(f, "<text x=\"10\" y=\"%.1f\">rank %d</text><text x=\"10\" y=\"%.1f\" font-size=\"10\" "
                   "fill=\"#555\">tp %d dp %d pp %d</text>\n", y + 16, r, y + 30, ps.tp_rank, ps.dp_rank, ps.pp_rank);
        for (int pass = 0; pass < 2; pass++)   // work first, communication on top
            for (size_t i = 0; i < logs[r].n; i++) {
                const mt_span *s = &logs[r].spans[i];
                int is_comm = s->kind == MT_SPAN_COMM || s->kind == MT_SPAN_RECV;
                if (is_comm != pass) continue;
                double x = left + (s->t0 - origin) * scale, w = (s->t1 - s->t0) * scale;
                if (w < 0.5) w = 0.5;
                const char *color = s->kind == MT_SPAN_FORWARD ? "#4878d0" : s->kind == MT_SPAN_BACKWARD ? "#6acc64"
                                    : s->kind == MT_SPAN_OPTIMIZER ? "#ee854a" : s->kind == MT_SPAN_COMM ? "#d65f5f"
                                    : "#c8c8c8";
                double yy = s->kind == MT_SPAN_COMM ? y + lane - 14 : y + 2;   // communication: a band below
                double hh = s->kind == MT_SPAN_COMM ? 8 : lane - 8;
                char label[64];
                mt__span_label(s, label, sizeof label);
                fprintf(f, "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"%s\" stroke=\"white\" "
                           "stroke-width=\"0.5\"><title>%s, iteration %d, %.3f ms",
                        x, yy, w, hh, color, label, s->iteration, (s->t1 - s->t0) * 1e3);
                if (is_comm) fprintf(f, ", %zu bytes", s->bytes);
                fprintf(f, "</title></rect>\n");
                if ((s->kind == MT_SPAN_FORWARD || s->kind == MT_SPAN_BACKWARD) && w >= 14)
                    fprintf(f, "<text x=\"%.2f\" y=\"%.1f\" text-anchor=\"middle\" fill=\"white\" font-size=\"11\">%s"
                               "</text>\n", x + w / 2, y + lane / 2, label);
            }
    }
    // the time axis: about 10 ticks at a round step (1, 2 or 5 times a power of ten milliseconds)
    double total_ms = span_s * 1e3, step = pow(10.0, floor(log10(total_ms / 10)));
    if (total_ms / step > 50) step *= 5;
    else if (total_ms / step > 20) step *= 2;
    double axis_y = top + lane * world_size + 6;
    fprintf(f, "<line x1=\"%.0f\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\" stroke=\"black\"/>\n", left, axis_y,
            left + width, axis_y);
    for (double ms = 0; ms <= total_ms + 1e-9; ms += step) {
        double x = left + ms * 1e-3 * scale;
        fprintf(f, "<line x1=\"%.2f\" y1=\"%.1f\" x2=\"%.2f\" y2=\"%.1f\" stroke=\"black\"/><text x=\"%.2f\" "
                   "y=\"%.1f\" text-anchor=\"middle\" font-size=\"10\">%g</text>\n",
                x, axis_y, x, axis_y + 5, x, axis_y + 17, ms);
    }
    fprintf(f, "<text x=\"%.0f\" y=\"%.1f\" text-anchor=\"middle\">time (ms)</text>\n", left + width / 2,
            axis_y + 35);
    fprintf(f, "</svg>\n");
    mt_atomic_commit(f, tmp, path);
    return 1;
}

typedef struct {
    mt_config *cfg;
    mt_data *data;
    int split;                 // 0 train, 1 valid, 2 test
    int64_t eval_base;         // first sample of the current evaluation batch (valid/test)
    int32_t *sample;           // (T+1) scratch, one per rank
} mt__batch_ctx;

// fills micro-batch mb of this rank: sample base + mt_sample_in_batch(r, mb, b) of the split
static void mt__data_batch(mt_rank *r, void *vctx, int iteration, int mb, int *tokens, int *targets) {
    mt__batch_ctx *ctx = (mt__batch_ctx *)vctx;
    int B = r->dims.B, T = r->dims.T, V = r->cfg->model.vocab_size;
    int64_t base = ctx->split == 0 ? (int64_t)(iteration - 1) * r->cfg->train.global_batch_size : ctx->eval_base;
    for (int b = 0; b < B; b++) {
        int64_t i = base + mt_sample_in_batch(r, mb, b);
        mt_blended_sample(&ctx->data->split[ctx->split], i, ctx->sample);
        for (int t = 0; t <= T; t++)
            if (ctx->sample[t] < 0 || ctx->sample[t] >= V)
                mt_fatal("token id %d in the data is outside the vocabulary (size %d)\n"
                         "hint: preprocess with the same --vocab-file, or set --vocab-size", ctx->sample[t], V);
        for (int t = 0; t < T; t++) {
            tokens[b * T + t] = ctx->sample[t];
            targets[b * T + t] = ctx->sample[t + 1];
        }
    }
}

typedef struct {
    mt_config *cfg;
    mt_data *data;
    const mt_tokenizer *tokenizer;   // for --prompt and printing generated text; NULL: ids only
    int32_t *prompt;                 // the prompt's ids (at least one: <|endoftext|> for none)
    int prompt_len;
    mt_tb_writer tb;                 // --tensorboard-dir: the last rank's writer (closed when f is NULL)
    mt_span_log *spans;              // --timeline: (world_size) one span log per rank, NULL if off
} mt__job;

static void mt__print_eval(mt_rank *r, const char *what, float loss) {
    if (r->ps.rank != r->ps.world_size - 1) return;
    char line[256];
    int n = snprintf(line, sizeof line, " validation loss at %s | lm loss value: %.6E | lm loss PPL: %.6E | ", what,
                     (double)loss, isfinite(loss) ? exp((double)loss < 700 ? (double)loss : 700.0) : (double)NAN);
    char dashes[260];
    memset(dashes, '-', (size_t)n);
    dashes[n] = 0;
    printf("%s\n%s\n%s\n", dashes, line, dashes);
    fflush(stdout);
}

static float mt__evaluate(mt_rank *r, mt__batch_ctx *ctx, int split, int iteration) {
    const mt_config *cfg = r->cfg;
    double sum = 0.0;
    ctx->split = split;
    for (int k = 0; k < cfg->train.eval_iters; k++) {
        if (split == 1) ctx->eval_base = ctx->data->valid_consumed;   // the valid iterator continues
        else ctx->eval_base = (int64_t)k * cfg->train.global_batch_size;
        sum += mt_eval_step(r, mt__data_batch, ctx, iteration);
        if (split == 1) {
            mt_barrier(&r->groups.world);   // everyone has read this batch before rank 0 moves the iterator
            if (r->ps.rank == 0) ctx->data->valid_consumed += cfg->train.global_batch_size;
            mt_barrier(&r->groups.world);
        }
    }
    ctx->split = 0;
    return (float)(sum / cfg->train.eval_iters);
}

// at start: rank 0's tensors as carved (name, local shape, offset in the buffer), then one line
// per rank with what it holds, in the order the buffers were allocated
static void mt__print_rank_tables(mt_rank *r) {
    const mt_config *cfg = r->cfg;
    int rank = r->ps.rank;
    if (rank == 0 && cfg->train.verbose) {
        printf("rank 0 parameters (carve order = checkpoint order):");
        const char *sep = " ";
        for (int i = 0; i < MT_NUM_PARAM_TENSORS; i++) {
            const mt_param_spec *s = &r->model.specs[i];
            if (!s->present) continue;
            if (s->layers) printf("%s%s %dx%dx%d @%zu", sep, s->name, s->layers, s->rows, s->cols, s->offset);
            else printf("%s%s %dx%d @%zu", sep, s->name, s->rows, s->cols, s->offset);
            sep = ", ";
        }
        printf("\n");
        fflush(stdout);
    }
    for (int k = 0; k < cfg->world_size; k++) {
        if (k == rank) {
            char device_terms[128] = "", w16[48] = "";   // the GPU build's: borrowed by the kernels, NCCL's buffers
            if (r->memory.weights16) snprintf(w16, sizeof w16, ", 16-bit weights %.1f", r->memory.weights16 / 1e6);
            if (r->memory.kernel_scratch || r->memory.comm)
                snprintf(device_terms, sizeof device_terms, ", kernel scratch %.1f%s, communication %.1f",
                         r->memory.kernel_scratch / 1e6, w16, r->memory.comm / 1e6);
            char host[128] = "";   // --optimizer-cpu-offload: the optimizer's pinned host memory, on its own
            if (r->memory.host_optimizer)
                snprintf(host, sizeof host, " | host (pinned) MB: optimizer %.1f, updated by %d thread%s",
                         r->memory.host_optimizer / 1e6, r->optim.num_host_threads,
                         r->optim.num_host_threads == 1 ? "" : "s");
            printf("rank %d (tp %d, dp %d, pp %d%s%s): %zu parameters | memory MB: parameters %.1f, gradients %.1f, "
                   "optimizer %.1f, activations %.1f (%d micro-batch slot%s), workspace %.1f%s%s\n",
                   rank, r->ps.tp_rank, r->ps.dp_rank, r->ps.pp_rank, r->dev.name[0] ? ", " : "", r->dev.name,
                   r->model.num_params, r->memory.params / 1e6, r->memory.grads / 1e6, r->memory.optimizer / 1e6,
                   r->memory.activations / 1e6, r->acts.num_slots, r->acts.num_slots == 1 ? "" : "s",
                   r->memory.scratch / 1e6, device_terms, host);
            fflush(stdout);
        }
        mt_barrier(&r->groups.world);
    }
}

// --load: resume where the checkpoint stopped (every rank reads its own file). Returns the
// first iteration to train.
static int mt__resume(mt_rank *r, mt__job *job) {
    const mt_train_config *t = &r->cfg->train;
    if (!t->load[0]) return t->start_iteration + 1;
    int64_t valid_consumed = 0;
    int loaded = mt_checkpoint_load(r, t->load, &valid_consumed);
    if (loaded == 0) return t->start_iteration + 1;
    mt_barrier(&r->groups.world);
    if (r->ps.rank == 0) job->data->valid_consumed = valid_consumed;
    if (t->finetune) {   // Megatron: iteration 0, no samples consumed; the data and the schedule from the start
        if (r->ps.rank == r->ps.world_size - 1)
            printf("--finetune: training starts at iteration %d from the parameters of iteration %d\n",
                   t->start_iteration + 1, loaded);
        return t->start_iteration + 1;
    }
    if (loaded >= t->train_iters && r->ps.rank == r->ps.world_size - 1)
        printf("the checkpoint is at iteration %d, --train-iters is %d: nothing to train\n", loaded, t->train_iters);
    return loaded + 1;
}

// the communication counters (section 2) of a rank's groups, in the order the log prints them
#define MT__NUM_GROUPS 7
static void mt__groups_list(mt_rank *r, mt_comm *out[MT__NUM_GROUPS]) {
    out[0] = &r->groups.tp;
    out[1] = &r->groups.pp;
    out[2] = &r->groups.dp;
    out[3] = &r->groups.embd;
    out[4] = &r->groups.mp;
    out[5] = &r->groups.world;
    out[6] = &r->groups.p2p;   // the pipeline's messages (the pp group's own calls: the loss)
}

// "tp 26 calls 1.31 MB 2.1 ms | pp ...": the counters' growth since `since` (per iteration if
// divided by iters), for the groups that moved anything
static void mt__format_comm(mt_rank *r, const double since[MT__NUM_GROUPS][3], int iters, char *out, size_t cap) {
    mt_comm *g[MT__NUM_GROUPS];
    mt__groups_list(r, g);
    for (int k = 0; k < MT__NUM_GROUPS; k++) mt__nccl_seconds(g[k]);   // the GPU's times of the NCCL calls
    size_t len = 0;
    out[0] = 0;
    for (int k = 0; k < MT__NUM_GROUPS; k++) {
        double calls = (double)g[k]->calls - since[k][0], bytes = (double)g[k]->bytes - since[k][1];
        double secs = g[k]->seconds - since[k][2];
        if (calls <= 0 || len + 80 > cap) continue;
        len += (size_t)snprintf(out + len, cap - len, "%s%s %.4g calls %.3f MB %.1f ms", len ? " | " : "",
                                g[k]->name ? g[k]->name : "?", calls / iters, bytes / iters / 1e6,
                                1e3 * secs / iters);
    }
    if (!len) snprintf(out, cap, "none (one rank)");
}

static void mt__snapshot_comm(mt_rank *r, double snap[MT__NUM_GROUPS][3]) {
    mt_comm *g[MT__NUM_GROUPS];
    mt__groups_list(r, g);
    for (int k = 0; k < MT__NUM_GROUPS; k++) mt__nccl_seconds(g[k]);   // the GPU's times of the NCCL calls
    for (int k = 0; k < MT__NUM_GROUPS; k++) {
        snap[k][0] = (double)g[k]->calls;
        snap[k][1] = (double)g[k]->bytes;
        snap[k][2] = g[k]->seconds;
    }
}

// "1h 02m", "3m 07s", "12s": the estimated time left
static void mt__format_duration(double seconds, char *out, size_t cap) {
    long s = (long)(seconds + 0.5);
    if (s >= 3600) snprintf(out, cap, "%ldh %02ldm", s / 3600, s / 60 % 60);
    else if (s >= 60) snprintf(out, cap, "%ldm %02lds", s / 60, s % 60);
    else snprintf(out, cap, "%lds", s);
}

// Megatron's training_log: the iteration line every --log-interval iterations, with the
// interval's mean loss, mean time and the counts of skipped and NaN iterations; the TensorBoard
// scalars every --tensorboard-log-interval iterations (the last rank writes, as in Megatron).
// As Megatron's: the mean loss is over the iterations whose step was taken (advanced); a skipped
// one (fp16 overflow) is counted in "skipped", and also in "nan" when its loss was inf or NaN.
// Where Megatron leaves the loss out (every iteration of the interval skipped, as while fp16's
// scale settles), we print the mean of those iterations' finite losses, so the column stays.
typedef struct {
    double loss, time;          // sums over the iterations of the interval (loss: advanced ones)
    int count;                  // advanced iterations with a finite loss
    double skipped_loss;        // the finite losses of the skipped iterations, and their count
    int skipped_count;
    int skipped, nan_iters;
    double comm[MT__NUM_GROUPS][3];   // the communication counters at the interval's start
} mt__log_interval;

static void mt__training_log(mt_rank *r, mt_tb_writer *tb, int it, const mt_step_result *res, double dt,
                             mt__log_interval *acc) {
    const mt_config *cfg = r->cfg;
    const mt_train_config *t = &cfg->train;
    acc->time += dt;
    if (res->skipped) acc->skipped++;
    if (!isfinite(res->loss)) acc->nan_iters++;
    else if (res->skipped) { acc->skipped_loss += res->loss; acc->skipped_count++; }
    else { acc->loss += res->loss; acc->count++; }
    int is_last = r->ps.rank == r->ps.world_size - 1;
    int64_t samples = (int64_t)it * t->global_batch_size;
    double tokens_per_s = (double)t->global_batch_size * cfg->model.seq_length / dt;
    // Megatron's --log-throughput: model FLOPs per token = 6N + 12 L C T (forward and
    // backward, attention included), per GPU (per rank)
    double tflops = tokens_per_s * mt_flops_per_token(cfg) / cfg->world_size / 1e12;
    // --log-params-norm: a collective over the model-parallel group, so every rank computes it
    // where the line or TensorBoard will show it (the decision from the config, the same everywhere)
    double params_norm = 0.0;
    if (t->log_params_norm &&
        (it % t->log_interval == 0 || (t->tensorboard_dir[0] && it % t->tensorboard_log_interval == 0)))
        params_norm = mt_params_norm(r);
    if (is_last && tb->f && it % t->tensorboard_log_interval == 0) {   // training.py's writer.add_scalar calls
        mt_tb_scalar(tb, "samples vs steps", (float)samples, it);
        if (!t->no_log_learning_rate_to_tensorboard) {
            mt_tb_scalar(tb, "learning-rate", res->lr, it);
            mt_tb_scalar(tb, "learning-rate vs samples", res->lr, samples);
        }
        if (t->log_batch_size_to_tensorboard) {
            mt_tb_scalar(tb, "batch-size", (float)t->global_batch_size, it);
            mt_tb_scalar(tb, "batch-size vs samples", (float)t->global_batch_size, samples);
        }
        mt_tb_scalar(tb, "lm loss", res->loss, it);
        mt_tb_scalar(tb, "lm loss vs samples", res->loss, samples);
        if (!t->no_log_loss_scale_to_tensorboard) {
            mt_tb_scalar(tb, "loss-scale", res->loss_scale, it);
            mt_tb_scalar(tb, "loss-scale vs samples", res->loss_scale, samples);
        }
        if (t->log_world_size_to_tensorboard) mt_tb_scalar(tb, "world-size", (float)cfg->world_size, it);
        mt_tb_scalar(tb, "grad-norm", res->grad_norm, it);
        mt_tb_scalar(tb, "grad-norm vs samples", res->grad_norm, samples);
        if (t->log_num_zeros_in_grad && !isnan(res->num_zeros)) {
            mt_tb_scalar(tb, "num-zeros", (float)res->num_zeros, it);
            mt_tb_scalar(tb, "num-zeros vs samples", (float)res->num_zeros, samples);
        }
        if (t->log_params_norm) {
            mt_tb_scalar(tb, "params-norm", (float)params_norm, it);
            mt_tb_scalar(tb, "params-norm vs samples", (float)params_norm, samples);
        }
        // ours, beside Megatron's: throughput, tokens/s, skipped and NaN iterations so far this interval
        mt_tb_scalar(tb, "throughput", (float)tflops, it);
        mt_tb_scalar(tb, "tokens-per-second", (float)tokens_per_s, it);
        mt_tb_scalar(tb, "skipped-iterations", (float)acc->skipped, it);
        mt_tb_scalar(tb, "nan-iterations", (float)acc->nan_iters, it);
        if (t->log_memory_to_tensorboard) {
            double used = 0, total = 0;
            double bytes = mt_device_memory_in_use(r, &used, &total) ? used * (1 << 30)
                                                                     : (double)mt_memory_total(&r->memory);
            mt_tb_scalar(tb, "mem-allocated-bytes", (float)bytes, it);
        }
        if (t->log_timers_to_tensorboard) {   // Megatron's timers.write: name + '-time', seconds
            mt_tb_scalar(tb, "forward-backward-time", (float)res->forward_backward_seconds, it);
            mt_tb_scalar(tb, "all-grads-sync-time", (float)res->grads_sync_seconds, it);
            mt_tb_scalar(tb, "optimizer-time", (float)res->optimizer_seconds, it);
        }
    }
    if (it % t->log_interval != 0) return;
    if (is_last) {   // Megatron's print_rank_last
        double per_iter = acc->time / t->log_interval;
        double ms = 1000.0 * per_iter;
        tokens_per_s = (double)t->global_batch_size * cfg->model.seq_length / per_iter;
        tflops = tokens_per_s * mt_flops_per_token(cfg) / cfg->world_size / 1e12;
        char left[32], comm[512], pnorm[96] = "";   // Megatron's: num zeros (not for a skipped step), params norm
        mt__format_duration(per_iter * (t->train_iters - it), left, sizeof left);
        size_t used = 0;
        if (t->log_num_zeros_in_grad && !isnan(res->num_zeros))
            used += (size_t)snprintf(pnorm, sizeof pnorm, "num zeros: %.1f | ", res->num_zeros);
        if (t->log_params_norm) snprintf(pnorm + used, sizeof pnorm - used, "params norm: %.3f | ", params_norm);
        printf(" iteration %8d/%8d | consumed samples: %12lld | elapsed time per iteration (ms): %.1f | "
               "learning rate: %.6E | global batch size: %5d | lm loss: %.6E | loss scale: %.1f | grad norm: %.3f | "
               "%snumber of skipped iterations: %3d | number of nan iterations: %3d | "
               "throughput per GPU (TFLOP/s/GPU): %.*f | tokens per second: %.0f | estimated time left: %s |\n",
               it, t->train_iters, (long long)samples, ms, (double)res->lr, t->global_batch_size,
               acc->count ? acc->loss / acc->count : acc->skipped_count ? acc->skipped_loss / acc->skipped_count
                                                                      : (double)NAN,
               (double)res->loss_scale, (double)res->grad_norm, pnorm, acc->skipped,
               acc->nan_iters, tflops < 1.0 ? 3 : 1, tflops, tokens_per_s, left);   // a CPU's 0.004, not 0.0
        if (r->ps.pp_size > 1)
            printf("   (last stage waited %.1f%% of the step for pipeline messages)\n", 100.0 * res->idle_seconds / dt);
        if (r->ps.world_size > 1) {
            mt__format_comm(r, (const double (*)[3])acc->comm, t->log_interval, comm, sizeof comm);
            printf("   communication per iteration (rank %d): %s\n", r->ps.rank, comm);
        }
        fflush(stdout);
        if (tb->f) {
            if (t->log_timers_to_tensorboard) mt_tb_scalar(tb, "iteration-time", (float)per_iter, it);
            mt_tb_flush(tb);   // every log interval: what TensorBoard shows is never older than the log
        }
    }
    memset(acc, 0, sizeof *acc);
    mt__snapshot_comm(r, acc->comm);
}

// Megatron's evaluate_and_print_results writes 'lm loss validation' (and its ppl with
// --log-validation-ppl-to-tensorboard), each also against consumed samples
static void mt__tb_validation(mt_rank *r, mt_tb_writer *tb, int it, float loss) {
    if (r->ps.rank != r->ps.world_size - 1 || !tb->f) return;
    const mt_train_config *t = &r->cfg->train;
    int64_t samples = (int64_t)it * t->global_batch_size;
    mt_tb_scalar(tb, "lm loss validation", loss, it);
    mt_tb_scalar(tb, "lm loss validation vs samples", loss, samples);
    if (t->log_validation_ppl_to_tensorboard) {
        float ppl = (float)exp((double)loss < 700 ? (double)loss : 700.0);
        mt_tb_scalar(tb, "lm loss validation ppl", ppl, it);
        mt_tb_scalar(tb, "lm loss validation ppl vs samples", ppl, samples);
    }
    mt_tb_flush(tb);
}

// a checkpoint only of a finite state: a NaN or an infinity in the parameters or in AdamW's
// moments would be resumed for ever. One sum of squares per buffer and one all-reduce over the
// world (every rank must agree, since rank 0 moves the tracker); cheap beside the write.
static int mt__save_if_finite(mt_rank *r, const char *dir, int iteration, int64_t valid_consumed, int last_was_nan) {
    if (last_was_nan) {   // the same on every rank: the loss is all-reduced, the skip follows the global norm
        if (r->ps.rank == r->ps.world_size - 1) {
            printf("WARNING: not saving a checkpoint at iteration %d: its loss was NaN or its step skipped\n",
                   iteration);
            fflush(stdout);
        }
        return 0;
    }
    // AdamW's moments: this rank's shard (the whole buffer without the distributed optimizer);
    // the all-reduce below covers every shard
    // (on the host with --optimizer-cpu-offload: summed there, by the reference loop)
    const mt_optimizer *o = &r->optim;
    double sum = mt_sum_squares(r, r->model.params_memory, r->model.num_params) +
                 (o->offload ? mt_sum_squares_cpu(o->m_memory, o->shard_size) + mt_sum_squares_cpu(o->v_memory,
                                                                                                 o->shard_size)
                             : mt_sum_squares(r, o->m_memory, o->shard_size) + mt_sum_squares(r, o->v_memory,
                                                                                             o->shard_size));
    double bad = isfinite(sum) ? 0.0 : 1.0;
    if (r->ps.world_size > 1) mt_all_reduce_double(&r->groups.world, &bad, 1, MT_SUM);
    if (bad > 0) {
        if (r->ps.rank == r->ps.world_size - 1) {
            printf("WARNING: not saving a checkpoint at iteration %d: the parameters or the optimizer state are not "
                   "finite (NaN or inf)\n", iteration);
            fflush(stdout);
        }
        return 0;
    }
    mt_checkpoint_save(r, dir, iteration, valid_consumed);
    return 1;
}

// Megatron skips a step whose gradients are not finite and goes on; a run whose loss stays NaN
// would go on for ever, so after this many such iterations in a row we stop, with the usual causes.
// fp16's overflows while dynamic scaling can still lower the scale are not counted: they are how
// the scale finds its level (from 2^32: some 15-25 skipped steps at the start of a run).
#define MT_MAX_BAD_ITERATIONS 5

// Megatron's report_memory, once, after the first iterations (training.py calls it at the first
// log interval), and beside it the plan against what was measured. Every rank prints its own
// lines, in rank order. On the GPU build (the CPU build has no device: nothing is printed):
//   allocated       our cudaMalloc'd buffers + the kernel scratch lent now (0 between ops)
//   max allocated   the buffers at most + the kernel scratch lent at most (its peak)
//   reserved        the buffers + the kernel scratch's backing memory (the rank's arena, and what
//                   the stream-ordered pool keeps of what it lent past the arena)
//   max reserved    the buffers at most + that backing memory at most
// in Megatron's MB (2^20 bytes, torch's), which leave out the CUDA context as Megatron's do. Then
//   measured peak = max reserved + what the GPU holds beyond the context at start, our buffers and
//                   the scratch's (NCCL's buffers, and the kernels' code and stacks loaded since)
//   planned       = mt_memory_total of the plan (section 8), MB = 10^6 bytes as the plan's
// and their ratio (tests/gpu/test_memory.sh holds it within 10%), then the kernel scratch alone:
// planned, and lent at most (the arena's high-water mark + the most the pool lent past it:
// kernels.cuh, section 1), and the context (measured at start, outside the plan).
static void mt__report_memory(mt_rank *r, int iterations) {
    mt_device_memory m;
    if (!mt_device_memory_measure(r, &m)) return;   // no device (every rank of a run is the same build)
    for (int k = 0; k < r->ps.world_size; k++) {
        if (k == r->ps.rank) {
            double mib = 1024.0 * 1024.0;
            size_t ours = m.allocated + m.scratch_reserved;   // beyond the context now: NCCL's, the code's
            size_t beyond = m.in_use > m.context + ours ? m.in_use - m.context - ours : 0;
            double peak = (double)(m.allocated_peak + m.scratch_reserved_peak + beyond);
            double planned = (double)mt_memory_total(&r->memory);
            printf("[Rank %d] (after %d iterations) memory (MB) | allocated: %.2f | max allocated: %.2f | "
                   "reserved: %.2f | max reserved: %.2f\n", r->ps.rank, iterations,
                   (double)(m.allocated + m.scratch_used) / mib,
                   (double)(m.allocated_peak + m.scratch_used_peak) / mib,
                   (double)(m.allocated + m.scratch_reserved) / mib,
                   (double)(m.allocated_peak + m.scratch_reserved_peak) / mib);
            printf("[Rank %d] memory plan vs measured: planned %.1f MB, measured peak %.1f MB (ratio %.3f) | "
                   "kernel scratch: planned %.1f MB, lent at most %.1f MB (the arena %.1f, the pool %.1f) | "
                   "outside the plan: the CUDA context %.1f MB at start, %.1f MB more since (NCCL, kernels)\n",
                   r->ps.rank, planned / 1e6, peak / 1e6, planned > 0 ? peak / planned : 0.0,
                   r->memory.kernel_scratch / 1e6, m.scratch_used_peak / 1e6, m.scratch_arena_peak / 1e6,
                   (m.scratch_used_peak - m.scratch_arena_peak) / 1e6, m.context / 1e6, beyond / 1e6);
            fflush(stdout);
        }
        mt_barrier(&r->groups.world);
    }
}

// Megatron's train(): the step, the log line, evaluation, save and exit, each a named call.
// Returns the last iteration trained (--exit-interval may stop it early).
static int mt__train(mt_rank *r, mt__job *job, mt__batch_ctx *ctx, int first_iteration, int *last_saved,
                     int *ended_bad) {
    const mt_train_config *t = &r->cfg->train;
    mt__log_interval acc;
    memset(&acc, 0, sizeof acc);
    mt__snapshot_comm(r, acc.comm);
    int bad_in_a_row = 0;   // iterations with a NaN/inf loss or a skipped step (the same on every rank)
    int reported = 0;       // the memory report, once
    for (int it = first_iteration; it <= t->train_iters; it++) {
        if (r->timeline) {   // --timeline: record the window [--profile-step-start, --profile-step-end)
            r->timeline->iteration = it;
            r->timeline->enabled = it >= t->profile_step_start && it < t->profile_step_end;
        }
        double t0 = mt_time_seconds();
        mt_step_result res = mt_train_step(r, mt__data_batch, ctx, it);
        if (r->timeline) {   // the GPU's marks of this iteration become times, then stop recording
            mt_device_marks_resolve(r->timeline);
            r->timeline->enabled = 0;
        }
        mt__training_log(r, &job->tb, it, &res, mt_time_seconds() - t0, &acc);
        // the memory report: at the first log interval after at least two steps (a step's ops have
        // borrowed their scratch, queued and as recorded graphs), or at the last iteration of a shorter run
        int ran = it - first_iteration + 1;
        if (!reported && ((ran >= 2 && it % t->log_interval == 0) || it == t->train_iters)) {
            mt__report_memory(r, it);
            reported = 1;
        }
        bad_in_a_row = !isfinite(res.loss) || (res.skipped && !res.overflow) ? bad_in_a_row + 1 : 0;
        *ended_bad = bad_in_a_row > 0;
        if (bad_in_a_row >= MT_MAX_BAD_ITERATIONS)
            mt_fatal("the loss or the gradients were NaN or infinite for %d iterations in a row (up to iteration %d); "
                     "no checkpoint was saved from that state\n"
                     "hint: the learning rate (--lr %g) is likely too high, or the loss scale (fp16) too large; "
                     "resume from the last checkpoint with a lower --lr", bad_in_a_row, it, (double)t->lr);
        if (t->eval_interval > 0 && it % t->eval_interval == 0 && job->data->has_split[1]) {
            char what[64];
            snprintf(what, sizeof what, "iteration %d", it);
            float loss = mt__evaluate(r, ctx, 1, it);
            mt__print_eval(r, what, loss);
            mt__tb_validation(r, &job->tb, it, loss);
        }
        int exiting = t->exit_interval > 0 && it % t->exit_interval == 0 && it < t->train_iters;
        if (t->save[0] && ((t->save_interval > 0 && it % t->save_interval == 0) || exiting)) {
            mt_barrier(&r->groups.world);   // the valid iterator position is final for this iteration
            mt__save_if_finite(r, t->save, it, job->data->valid_consumed, bad_in_a_row > 0);
            *last_saved = it;
        }
        if (exiting) {
            if (r->ps.rank == r->ps.world_size - 1) {
                printf("exiting program at iteration %d (--exit-interval %d)\n", it, t->exit_interval);
                fflush(stdout);
            }
            return it;
        }
    }
    return t->train_iters;
}

// the sampling flags as section 11 takes them
static mt_sampling mt__sampling(const mt_train_config *t) {
    mt_sampling s;
    s.temperature = t->greedy ? 0.0f : t->temperature;
    s.top_k = t->top_k;
    s.top_p = t->top_p;
    s.seed = t->seed;
    return s;
}

// --tokens-to-generate: a sample of what the model learned, after training, with the KV cache
static void mt__generate_sample(mt_rank *r, mt__job *job) {
    const mt_train_config *t = &r->cfg->train;
    mt_generator g;
    mt_generator_init(r, &g, 1, job->prompt_len, job->prompt_len + t->tokens_to_generate);
    mt_generate_request q;
    memset(&q, 0, sizeof q);
    const int32_t *prompts[1] = {job->prompt};
    int32_t *out = (int32_t *)mt_calloc((size_t)t->tokens_to_generate + 1, sizeof(int32_t), "generation");
    int count = 0;
    q.n = 1;
    q.prompts = prompts;
    q.prompt_lens = &job->prompt_len;
    q.max_new_tokens = t->tokens_to_generate;
    q.sampling = mt__sampling(t);
    q.eod = -1;   // a fixed count: the sample of a model still learning may well say <|endoftext|> early
    q.tokens = out;
    q.counts = &count;
    mt_generate_batch(r, &g, &q);
    mt_generator_free(&g);
    if (r->ps.rank == r->ps.world_size - 1) {
        printf("generated (%d tokens, temperature %g, top-k %d%s):\n", count, (double)q.sampling.temperature,
               t->top_k, q.stopped_at_max_positions ? ", stopped at --max-position-embeddings" : "");
        int n = job->prompt_len + count;
        int32_t *ids = (int32_t *)mt_malloc(sizeof(int32_t) * (size_t)n, "generation");
        memcpy(ids, job->prompt, sizeof(int32_t) * (size_t)job->prompt_len);
        memcpy(ids + job->prompt_len, out, sizeof(int32_t) * (size_t)count);
        if (job->tokenizer) {
            size_t len = mt_tokenizer_decode(job->tokenizer, ids, (size_t)n, NULL, 0);
            char *text = (char *)mt_malloc(len + 1, "generated text");
            mt_tokenizer_decode(job->tokenizer, ids, (size_t)n, text, len + 1);
            printf("%s\n", text);
            free(text);
        } else {
            for (int i = 0; i < n; i++) printf("%d%c", ids[i], i + 1 < n ? ' ' : '\n');
        }
        fflush(stdout);
        free(ids);
    }
    free(out);
}

// at the end, on a build with devices: each rank's device memory in use
static void mt__print_device_memory(mt_rank *r) {
    double used = 0, total = 0;
    if (!mt_device_memory_in_use(r, &used, &total)) return;   // the CPU build has no device
    for (int k = 0; k < r->ps.world_size; k++) {
        if (k == r->ps.rank) {
            printf("rank %d: GPU memory in use at the end: %.2f GiB of %.1f GiB\n", r->ps.rank, used, total);
            fflush(stdout);
        }
        mt_barrier(&r->groups.world);
    }
}

// at the end: every rank's communication, in total and per iteration trained, in rank order
static void mt__print_comm_summary(mt_rank *r, int iterations) {
    if (r->ps.world_size == 1) return;
    double zero[MT__NUM_GROUPS][3];
    memset(zero, 0, sizeof zero);
    char total[512], per[512];
    mt_barrier(&r->groups.world);   // the lines above (validation, generation) are out first
    mt__format_comm(r, (const double (*)[3])zero, 1, total, sizeof total);
    mt__format_comm(r, (const double (*)[3])zero, iterations > 0 ? iterations : 1, per, sizeof per);
    for (int k = 0; k < r->ps.world_size; k++) {
        if (k == r->ps.rank) {
            if (k == 0) printf("communication (all calls of the run, evaluation and checkpoints included):\n");
            printf("  rank %d total: %s\n  rank %d per iteration: %s\n", k, total, k, per);
            fflush(stdout);
        }
        mt_barrier(&r->groups.world);
    }
}

// one rank's whole job, on its own thread
static void mt__rank_main(mt_world *w, int rank, void *arg) {
    mt__job *job = (mt__job *)arg;
    mt_config *cfg = job->cfg;
    const mt_train_config *t = &cfg->train;
    mt_rank *r = (mt_rank *)mt_calloc(1, sizeof(mt_rank), "rank");
    mt__own(free, r);   // if the world aborts: this frees r, mt_rank_init's entries its buffers
    mt_rank_init(r, cfg, w, rank);
    if (job->spans) mt_rank_set_timeline(r, &job->spans[rank]);
    char name[32];
    snprintf(name, sizeof name, "r%d tp%d dp%d pp%d", rank, r->ps.tp_rank, r->ps.dp_rank, r->ps.pp_rank);
    mt_thread_set_name(name);
    mt__print_rank_tables(r);
    mt__batch_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    ctx.cfg = cfg;
    ctx.data = job->data;
    ctx.sample = (int32_t *)mt_malloc(sizeof(int32_t) * (size_t)(cfg->model.seq_length + 1), "sample");
    mt__own(free, ctx.sample);
    int first_iteration = mt__resume(r, job);
    mt_barrier(&r->groups.world);
    int last_saved = 0;
    int ended_bad = 0;   // the last iteration's loss was NaN or its step skipped: no final save
    int last_iteration = mt__train(r, job, &ctx, first_iteration, &last_saved, &ended_bad);
    // Megatron saves once more at the end when the last iteration was not a save point
    if (t->save[0] && last_saved != last_iteration && first_iteration <= last_iteration) {
        mt_barrier(&r->groups.world);
        mt__save_if_finite(r, t->save, last_iteration, job->data->valid_consumed, ended_bad);
    }
    if (last_iteration == t->train_iters && t->eval_iters > 0) {   // not stopped by --exit-interval
        if (job->data->has_split[1]) {
            float loss = mt__evaluate(r, &ctx, 1, t->train_iters);
            mt__print_eval(r, "the end of training for val data", loss);
            mt__tb_validation(r, &job->tb, t->train_iters, loss);
        }
        if (job->data->has_split[2])
            mt__print_eval(r, "the end of training for test data", mt__evaluate(r, &ctx, 2, t->train_iters));
    }
    mt__print_comm_summary(r, last_iteration - first_iteration + 1);
    if (t->tokens_to_generate > 0) mt__generate_sample(r, job);   // the generated text: the last line
    mt__print_device_memory(r);
    mt__disown(ctx.sample);
    free(ctx.sample);
    mt_rank_free(r);
    mt__disown(r);
    free(r);
}

static int mt__generation_mode(const mt_config *cfg);
// the tokenizer, loaded once: it gives the vocabulary size (as in Megatron, unless --vocab-size
// says) and turns --prompt into ids and generated ids into text. Returns 1 if it was loaded.
static int mt__load_tokenizer(mt_config *cfg, mt_tokenizer *tok) {
    const mt_train_config *t = &cfg->train;
    int for_vocab = cfg->model.vocab_size == 0 && t->vocab_file[0] && strcmp(t->tokenizer_type, "NullTokenizer") != 0;
    int for_text = (t->tokens_to_generate > 0 || mt__generation_mode(cfg)) && t->vocab_file[0] && t->merge_file[0];
    if (!for_vocab && !for_text) return 0;
    if (!t->merge_file[0]) mt_fatal("--vocab-file needs --merge-file (GPT2BPETokenizer)");
    mt_tokenizer_load(tok, t->vocab_file, t->merge_file);
    if (cfg->model.vocab_size == 0) cfg->model.vocab_size = tok->vocab_size;
    return 1;
}

// the prompt's ids for --tokens-to-generate (at least one: <|endoftext|> starts a new document)
static void mt__encode_prompt(const mt_config *cfg, const mt_tokenizer *tok, mt_int_list *prompt) {
    int32_t eod = cfg->model.vocab_size - 1;   // GPT-2's <|endoftext|> is its last id
    if (tok) {
        if (tok->eod_id >= 0) eod = tok->eod_id;
        mt_tokenizer_encode(tok, NULL, cfg->train.prompt, strlen(cfg->train.prompt), prompt);
    } else if (cfg->train.prompt[0]) {
        mt_fatal("--prompt needs --vocab-file and --merge-file to turn the text into tokens");
    }
    if (prompt->len == 0) mt_int_list_push(prompt, eod);
    if ((int)prompt->len >= cfg->model.seq_length * 4)
        mt_fatal("--prompt is %zu tokens; keep it shorter than a few --seq-length", prompt->len);
}

// ---------------------------------------------------------------------------------------------
// generation mode (Megatron's tools/generate_samples_gpt.py): --load and no --train-iters.
// The model's shape comes from the checkpoint (as --use-checkpoint-args); the layout is this
// run's (TP x PP; a checkpoint saved in another one is re-cut in memory). Prompts are read
// before the ranks start; the last rank prints the text (or the main thread writes
// --sample-output-file) and the report: time to first token, tokens/s, latency, memory.
// ---------------------------------------------------------------------------------------------
typedef struct {
    mt_config *cfg;
    const mt_tokenizer *tokenizer;   // NULL: prompts and outputs are token ids
    mt__full_checkpoint *full;       // the checkpoint, whole, when it was saved in another layout
    int n;                           // sequences: prompts x samples of each
    char **text;                     // (n) each prompt as given
    int32_t **prompt;                // (n) its ids
    int *prompt_len;
    int32_t *out;                    // (n, out_seq_length) generated ids (the last rank writes them)
    int *count;                      // (n)
    int eod;                         // the end-of-document id that ends a sequence, -1: none
    double launch;                   // mt_pretrain's start (the start-up is measured from it)
    // interactive (standard input a terminal, no prompts given): one prompt at a time from the
    // terminal into slot 0, read by the logger rank while the others wait (mt__gen_next_prompt)
    int interactive;
    int echo;                        // the samples are printed (no file given for them, or the default one)
    int served;                      // prompts read so far
    pthread_mutex_t lock;
    pthread_cond_t wake;
    int arrived, round;              // ranks waiting for the next prompt; prompts handed out
} mt__gen_job;

// one prompt's text -> ids: the tokenizer's, or (without one) ids written as numbers
static void mt__gen_encode(const mt_config *cfg, const mt_tokenizer *tok, const char *text, mt_int_list *ids,
                           int eod) {
    if (tok) {
        mt_tokenizer_encode(tok, NULL, text, strlen(text), ids);
    } else {
        const char *p = text;
        while (*p) {
            char *end;
            while (*p == ' ' || *p == '\t') p++;
            if (!*p) break;
            errno = 0;
            long v = strtol(p, &end, 10);
            if (end == p || errno || v < 0 || v >= cfg->model.vocab_size)
                mt_fatal("prompt \"%.40s\" is not token ids below %d separated by spaces\n"
                         "hint: give --vocab-file and --merge-file to write prompts as text", text,
                         cfg->model.vocab_size);
            mt_int_list_push(ids, (int32_t)v);
            p = end;
        }
    }
    if (ids->len == 0) mt_int_list_push(ids, eod);   // no prompt: a new document (unconditional)
}

// every line of a file (or of standard input, path NULL), without its end of line
static char **mt__read_lines(const char *path, int *count) {
    FILE *f = path ? fopen(path, "rb") : stdin;
    if (!f) mt_fatal("cannot open --sample-input-file %s: %s\nhint: one prompt per line", path, strerror(errno));
    size_t len = 0, cap = 1 << 16;
    char *all = (char *)mt_malloc(cap, "prompts");
    for (size_t got; (got = fread(all + len, 1, cap - len, f)) > 0;) {
        len += got;
        if (len == cap) all = (char *)mt_realloc(all, cap *= 2, "prompts");
    }
    if (path) fclose(f);
    char **lines = NULL;
    int n = 0;
    for (size_t i = 0; i < len;) {
        size_t j = i;
        while (j < len && all[j] != '\n') j++;
        size_t k = j;
        if (k > i && all[k - 1] == '\r') k--;
        lines = (char **)mt_realloc(lines, sizeof(char *) * (size_t)(n + 1), "prompts");
        lines[n] = (char *)mt_malloc(k - i + 1, "prompt");
        memcpy(lines[n], all + i, k - i);
        lines[n][k - i] = 0;
        n++;
        i = j + 1;
    }
    free(all);
    *count = n;
    return lines;
}

// the prompts of the run: --prompt, --sample-input-file, --num-samples alone (unconditional), or
// standard input; each repeated --num-samples times (every sample draws its own random numbers)
static void mt__gen_prompts(mt__gen_job *job) {
    const mt_train_config *t = &job->cfg->train;
    char **lines = NULL;
    int nlines = 0;
    if (t->prompt[0]) {
        lines = (char **)mt_malloc(sizeof(char *), "prompts");
        lines[0] = mt_strdup(t->prompt);
        nlines = 1;
    } else if (t->sample_input_file[0]) {
        lines = mt__read_lines(t->sample_input_file, &nlines);
    } else if (t->num_samples > 0) {   // unconditional samples
        lines = (char **)mt_malloc(sizeof(char *), "prompts");
        lines[0] = mt_strdup("");
        nlines = 1;
    } else if (!t->sample_output_file[0] && isatty(STDIN_FILENO)) {
        // a terminal: one prompt at a time, read as the ranks are ready for it (Megatron's
        // generate_samples_interactive). Slot 0 holds <|endoftext|> until the first is read (the
        // warm-up's prompt)
        job->interactive = 1;
        lines = (char **)mt_malloc(sizeof(char *), "prompts");
        lines[0] = mt_strdup("");
        nlines = 1;
        pthread_mutex_init(&job->lock, NULL);
        pthread_cond_init(&job->wake, NULL);
    } else {
        lines = mt__read_lines(NULL, &nlines);
    }
    if (nlines == 0) mt_fatal("no prompts: %s is empty\nhint: one prompt per line, or --prompt TEXT, or --num-samples N "
                              "for unconditional samples", t->sample_input_file[0] ? t->sample_input_file
                                                                                  : "standard input");
    int per = t->num_samples > 0 ? t->num_samples : 1, maxT = job->cfg->model.max_position_embeddings;
    job->n = nlines * per;
    job->text = (char **)mt_calloc((size_t)job->n, sizeof(char *), "prompts");
    job->prompt = (int32_t **)mt_calloc((size_t)job->n, sizeof(int32_t *), "prompts");
    job->prompt_len = (int *)mt_calloc((size_t)job->n, sizeof(int), "prompts");
    for (int i = 0; i < nlines; i++) {
        mt_int_list ids = {NULL, 0, 0};
        mt__gen_encode(job->cfg, job->tokenizer, lines[i], &ids, job->eod >= 0 ? job->eod
                                                                              : job->cfg->model.vocab_size - 1);
        if ((int)ids.len > maxT)
            mt_fatal("prompt %d is %zu tokens, longer than the model's %d positions (--max-position-embeddings)\n"
                     "hint: shorten it", i + 1, ids.len, maxT);
        for (int k = 0; k < per; k++) {
            int at = i * per + k;
            job->text[at] = mt_strdup(lines[i]);
            job->prompt[at] = (int32_t *)mt_malloc(sizeof(int32_t) * ids.len, "prompt");
            memcpy(job->prompt[at], ids.data, sizeof(int32_t) * ids.len);
            job->prompt_len[at] = (int)ids.len;
        }
        mt_int_list_free(&ids);
        free(lines[i]);
    }
    free(lines);
    job->out = (int32_t *)mt_calloc((size_t)job->n * (size_t)(t->out_seq_length > 0 ? t->out_seq_length : 1),
                                    sizeof(int32_t), "generated tokens");
    job->count = (int *)mt_calloc((size_t)job->n, sizeof(int), "generated tokens");
}

// The model's shape from a checkpoint (Megatron's --use-checkpoint-args; generation mode always):
// the --load directory's checkpoint (--ckpt-step's iteration, or the latest) is read for the
// model and layout it was saved with (src), and cfg takes its shape. A shape flag given with
// another value is an error (strict) or gives way, with a note. Returns the iteration read, 0 where
// --load holds no checkpoint (then nothing changes).
static int mt__ckpt_adopt_shape(mt_config *cfg, mt_config *src, int strict) {
    const char *dir = cfg->train.load;
    int iteration = cfg->train.ckpt_step > 0 ? cfg->train.ckpt_step : mt__ckpt_latest(dir);
    if (iteration == 0) return 0;
    char path[MT_PATH_MAX + 128];
    mt_checkpoint_path(path, sizeof path, dir, iteration, 0, 0, 1);
    if (access(path, F_OK) != 0) mt_checkpoint_path(path, sizeof path, dir, iteration, 0, 0, 2);
    long long step, valid;
    mt__ckpt_scaler scaler;   // (only the shape is wanted here)
    mt__ckpt_source_config(path, iteration, src, &step, &valid, &scaler);
    mt_config d;
    mt_config_defaults(&d);
    mt_model_config *m = &cfg->model;
    const mt_model_config *c = &src->model;
    struct { const char *flag; int given, unset, saved; } shape[] = {
        {"--num-layers", m->num_layers, d.model.num_layers, c->num_layers},
        {"--hidden-size", m->hidden_size, d.model.hidden_size, c->hidden_size},
        {"--num-attention-heads", m->num_attention_heads, d.model.num_attention_heads, c->num_attention_heads},
        {"--ffn-hidden-size", m->ffn_hidden_size, d.model.ffn_hidden_size, c->ffn_hidden_size},
        {"--max-position-embeddings", m->max_position_embeddings, d.model.max_position_embeddings,
         c->max_position_embeddings},
        {"--vocab-size (or the --vocab-file's)", m->vocab_size, d.model.vocab_size, c->vocab_size},
    };
    for (size_t i = 0; i < sizeof shape / sizeof shape[0]; i++) {
        if (shape[i].given == shape[i].unset || shape[i].given == shape[i].saved) continue;
        if (strict)
            mt_fatal("%s %d disagrees with the checkpoint's %d (%s)\nhint: drop the model-shape flags: generation "
                     "takes the model from the checkpoint, as Megatron's --use-checkpoint-args", shape[i].flag,
                     shape[i].given, shape[i].saved, path);
        mt__note("--use-checkpoint-args: %s %d gives way to the checkpoint's %d", shape[i].flag, shape[i].given,
                 shape[i].saved);
    }
    m->num_layers = c->num_layers;
    m->hidden_size = c->hidden_size;
    m->num_attention_heads = c->num_attention_heads;
    m->ffn_hidden_size = c->ffn_hidden_size;
    m->max_position_embeddings = c->max_position_embeddings;
    m->vocab_size = c->vocab_size;
    m->make_vocab_size_divisible_by = c->make_vocab_size_divisible_by;
    return iteration;
}

// the model and layout: the checkpoint's shape (given shape flags must agree, unless
// --use-checkpoint-args lets them give way), this run's TP x PP
static void mt__gen_config(mt_config *cfg, mt_config *src) {
    int iteration = mt__ckpt_adopt_shape(cfg, src, !cfg->train.use_checkpoint_args);
    if (iteration == 0) mt_fatal("--load %s holds no checkpoint (no latest_checkpointed_iteration.txt)\n"
                                 "hint: point --load at a directory written by --save or --import-hf", cfg->train.load);
    mt_model_config *m = &cfg->model;
    m->seq_length = m->max_position_embeddings;
    m->hidden_dropout = m->attention_dropout = 0.0f;
    cfg->train.ckpt_step = iteration;
    cfg->train.global_batch_size = cfg->parallel.num_layers_per_virtual_pipeline_stage > 0
        ? cfg->train.micro_batch_size * cfg->parallel.pipeline_model_parallel_size : 0;
    mt_config_derive(cfg);
    if (cfg->data_parallel_size > 1)
        mt_fatal("generation runs one model replica: %d ranks make DP = %d\nhint: drop --nproc-per-node (it is TP x PP "
                 "= %d)", cfg->world_size, cfg->data_parallel_size, cfg->world_size / cfg->data_parallel_size);
}

// peak memory: the device's (GPU build, sampled after each batch) or the process's resident set
static double mt__gen_peak_memory_gib(mt_rank *r, double peak, const char **what) {
    double used = 0, total = 0;
    if (mt_device_memory_in_use(r, &used, &total)) {
        *what = "GPU memory in use, peak of the samples";
        return used > peak ? used : peak;
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    *what = "resident memory of the process, peak";
    return (double)ru.ru_maxrss / (1 << 20);   // KiB on Linux
}

static int mt__compare_doubles(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

// the text of ids (NUL-terminated, to free): decoded, or the numbers
static char *mt__gen_text(const mt_tokenizer *tok, const int32_t *ids, int n) {
    if (tok) {
        size_t len = mt_tokenizer_decode(tok, ids, (size_t)n, NULL, 0);
        char *text = (char *)mt_malloc(len + 1, "generated text");
        mt_tokenizer_decode(tok, ids, (size_t)n, text, len + 1);
        return text;
    }
    char *text = (char *)mt_malloc((size_t)n * 12 + 1, "generated text");
    size_t len = 0;
    text[0] = 0;
    for (int i = 0; i < n; i++) len += (size_t)sprintf(text + len, "%s%d", i ? " " : "", ids[i]);
    return text;
}

// Interactive generation: every rank calls this before each prompt. The logger rank (it prints the
// samples) asks for the next line once every rank has arrived (none still reads the last prompt),
// puts it in slot 0 and wakes the others: threads of this one process, so a mutex and a condition
// variable, not a collective (which would spin on the GPU while a person types). An empty line
// asks again; "stop" or the end of input (Ctrl-D) ends the run. Returns 0 at the end.
static int mt__gen_next_prompt(mt__gen_job *job, int reader, int world_size) {
    pthread_mutex_lock(&job->lock);
    int round = job->round;
    job->arrived++;
    pthread_cond_broadcast(&job->wake);   // (the reader may be waiting for this arrival)
    if (!reader) {
        while (job->round == round) pthread_cond_wait(&job->wake, &job->lock);
        int more = job->n > 0;
        pthread_mutex_unlock(&job->lock);
        return more;
    }
    while (job->arrived < world_size) pthread_cond_wait(&job->wake, &job->lock);
    pthread_mutex_unlock(&job->lock);
    int maxT = job->cfg->model.max_position_embeddings, got = 0;
    char line[4096];
    mt_int_list ids = {NULL, 0, 0};
    while (!got) {
        printf("\nContext prompt (stop to exit) >>> ");
        fflush(stdout);
        if (!fgets(line, sizeof line, stdin)) { printf("\n"); break; }   // end of input
        size_t len = strlen(line);
        if (len == sizeof line - 1 && line[len - 1] != '\n') {   // longer than the buffer: the rest goes too
            for (int c = getchar(); c != EOF && c != '\n'; c = getchar()) {}
            printf("The prompt is longer than %zu bytes. Please give a shorter one!\n", sizeof line - 1);
            continue;
        }
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
        if (strcmp(line, "stop") == 0) break;
        if (len == 0) { printf("Prompt should not be empty!\n"); continue; }
        ids.len = 0;
        mt__gen_encode(job->cfg, job->tokenizer, line, &ids, job->eod >= 0 ? job->eod : job->cfg->model.vocab_size - 1);
        if ((int)ids.len >= maxT) {
            printf("The prompt is %zu tokens; the model has %d positions (--max-position-embeddings). Please give a "
                   "shorter one!\n", ids.len, maxT);
            continue;
        }
        got = 1;
    }
    pthread_mutex_lock(&job->lock);
    if (got) {
        free(job->text[0]);
        free(job->prompt[0]);
        job->text[0] = mt_strdup(line);
        job->prompt[0] = (int32_t *)mt_malloc(sizeof(int32_t) * ids.len, "prompt");
        memcpy(job->prompt[0], ids.data, sizeof(int32_t) * ids.len);
        job->prompt_len[0] = (int)ids.len;
        job->served++;
    }
    job->n = got;
    job->arrived = 0;
    job->round++;
    pthread_cond_broadcast(&job->wake);
    pthread_mutex_unlock(&job->lock);
    mt_int_list_free(&ids);
    return got;
}

static void mt__gen_rank_main(mt_world *w, int rank, void *arg) {
    mt__gen_job *job = (mt__gen_job *)arg;
    const mt_config *cfg = job->cfg;
    const mt_train_config *t = &cfg->train;
    // the rank for inference: parameters only (no gradients, optimizer or training activations)
    mt_rank *r = (mt_rank *)mt_calloc(1, sizeof(mt_rank), "rank");
    r->cfg = cfg;
    mt_parallel_state_init(&r->ps, cfg, rank);
    mt_device_init(r);
    mt_groups_init(&r->groups, w, cfg, &r->ps, r->dev.stream);
    mt_dims_init(&r->dims, cfg, &r->ps);
    mt__model_sizes(r);
    r->model.params_memory = mt_buffer_alloc(r, r->model.buffer_floats, "parameters");
    mt__carve_params(r, &r->model.params, r->model.params_memory, 1);
    char name[32];
    snprintf(name, sizeof name, "r%d tp%d pp%d", rank, r->ps.tp_rank, r->ps.pp_rank);
    mt_thread_set_name(name);
    int logger = r->ps.rank == r->ps.world_size - 1;   // a last-stage rank
    if (job->full) {   // saved in another layout: my slices of the whole tensors
        float *host = (float *)mt_calloc(r->model.num_params + 1, sizeof(float), "parameters (host)");
        for (int i = 0; i < MT_NUM_PARAM_TENSORS; i++)
            if (r->model.specs[i].present) mt_shard_copy(r, &r->model.specs[i], host, job->full->global[0][i], 1);
        mt_buffer_upload(r, r->model.params_memory, host, r->model.num_params * sizeof(float));
        free(host);
    } else {   // my file, its parameters only (AdamW's moments are two thirds of it, and not needed)
        char path[MT_PATH_MAX + 128];
        mt_checkpoint_path(path, sizeof path, t->load, t->ckpt_step, r->ps.tp_rank, r->ps.pp_rank, r->ps.pp_size);
        if (logger) { printf("loading checkpoint from %s at iteration %d (parameters)\n", t->load, t->ckpt_step);
                      fflush(stdout); }
        float *host[3] = {(float *)mt_calloc(r->model.num_params + 1, sizeof(float), "parameters (host)"), NULL, NULL};
        long long saved[32];
        mt__ckpt_read_groups(r, path, host, saved, 1, NULL);
        mt__ckpt_check_counters(path, t->ckpt_step, saved);
        mt_buffer_upload(r, r->model.params_memory, host[0], r->model.num_params * sizeof(float));
        free(host[0]);
    }
    // the decoding buffers: a batch of --micro-batch-size sequences, the longest prompt, its continuation
    int B = t->micro_batch_size < job->n ? t->micro_batch_size : job->n, longest = 1;
    for (int i = 0; i < job->n; i++) if (job->prompt_len[i] > longest) longest = job->prompt_len[i];
    if (job->interactive) longest = cfg->model.max_position_embeddings - 1;   // any prompt that leaves a position
    int new_tokens = t->out_seq_length;
    mt_generator g;
    mt_generator_init(r, &g, B, B * longest, longest + new_tokens);
    // the warm-up, part of the start-up (as vLLM captures its CUDA graphs before it serves): the first
    // batch's prefill and one decode step, thrown away, so that the measured run finds every kernel
    // loaded and the decode step's CUDA graph made (the GPU build; the CPU build has nothing to warm).
    // The same calls on every rank. Nothing the real run sees changes: draws are keyed by (seed,
    // position, sequence), not by a stream, and the real prefill writes the cache again from
    // position 0 before any step reads it.
    if (new_tokens > 1 && mt_device_first_run_costs(r)) {
        mt_generate_request w;
        memset(&w, 0, sizeof w);
        w.n = B;
        w.prompts = (const int32_t *const *)job->prompt;
        w.prompt_lens = job->prompt_len;
        w.max_new_tokens = 2;
        w.sampling = mt__sampling(t);
        w.eod = -1;   // (two tokens whatever they are)
        w.tokens = (int32_t *)mt_calloc((size_t)B * 2, sizeof(int32_t), "warm-up ids");
        w.counts = (int *)mt_calloc((size_t)B, sizeof(int), "warm-up ids");
        mt_generate_batch(r, &g, &w);
        free(w.tokens);
        free(w.counts);
    }
    mt_barrier(&r->groups.world);
    double startup = mt_time_seconds() - job->launch, ttft_first = 0, elapsed = 0, peak = 0;
    const char *peak_what = "";
    int batches = 0, sequences = 0;
    long long generated = 0;
    int stopped = 0;
    size_t batches_cap = (size_t)(job->n / B + 1);   // (interactive: grown as prompts come)
    double *steps = (double *)mt_calloc(batches_cap * (size_t)(new_tokens + 1), sizeof(double), "latencies");
    double *ttft = (double *)mt_calloc(batches_cap, sizeof(double), "latencies");
    size_t nsteps = 0;
    for (int i0 = 0;; i0 += B) {
        if (job->interactive) {   // the next prompt from the terminal, into slot 0
            if (!mt__gen_next_prompt(job, logger, r->ps.world_size)) break;
            i0 = 0;
            if ((size_t)batches + 1 > batches_cap) {
                batches_cap *= 2;
                steps = (double *)mt_realloc(steps, batches_cap * (size_t)(new_tokens + 1) * sizeof(double),
                                             "latencies");
                ttft = (double *)mt_realloc(ttft, batches_cap * sizeof(double), "latencies");
            }
        } else if (i0 >= job->n) {
            break;
        }
        int n = job->n - i0 < B ? job->n - i0 : B;
        mt_generate_request q;
        memset(&q, 0, sizeof q);
        q.n = n;
        q.prompts = (const int32_t *const *)(job->prompt + i0);
        q.prompt_lens = job->prompt_len + i0;
        q.max_new_tokens = new_tokens;
        q.sampling = mt__sampling(t);
        q.first_sequence = job->interactive ? job->served - 1 : i0;
        q.eod = job->eod;
        q.step_seconds = steps + nsteps;
        q.tokens = job->out + (size_t)i0 * (size_t)(new_tokens > 0 ? new_tokens : 1);
        q.counts = job->count + i0;
        int32_t *mine = NULL;   // ranks other than the logger keep their copy of the ids to themselves
        int *mine_counts = NULL;
        if (!logger) {
            mine = (int32_t *)mt_calloc((size_t)n * (size_t)(new_tokens > 0 ? new_tokens : 1), sizeof(int32_t), "ids");
            mine_counts = (int *)mt_calloc((size_t)n, sizeof(int), "ids");
            q.tokens = mine;
            q.counts = mine_counts;
        }
        double t0 = mt_time_seconds();
        mt_generate_batch(r, &g, &q);
        elapsed += mt_time_seconds() - t0;
        if (batches == 0) ttft_first = q.prefill_seconds;
        ttft[batches++] = q.prefill_seconds;
        nsteps += (size_t)q.steps;
        sequences += n;
        for (int b = 0; b < n; b++) generated += q.counts[b];
        stopped += q.stopped_at_max_positions;
        peak = mt__gen_peak_memory_gib(r, peak, &peak_what);
        free(mine);
        free(mine_counts);
        if (logger && job->echo)
            for (int b = 0; b < n; b++) {
                int i = i0 + b;
                char *prompt = mt__gen_text(job->tokenizer, job->prompt[i], job->prompt_len[i]);
                char *text = mt__gen_text(job->tokenizer, q.tokens + (size_t)b * (size_t)new_tokens, q.counts[b]);
                if (job->interactive)
                    printf("----- sample %d (%d prompt tokens, %d generated)\n%s%s%s\n", job->served,
                           job->prompt_len[i], q.counts[b], prompt, job->tokenizer ? "" : " | ", text);
                else
                    printf("----- sample %d of %d (%d prompt tokens, %d generated)\n%s%s%s\n", i + 1, job->n,
                           job->prompt_len[i], q.counts[b], prompt, job->tokenizer ? "" : " | ", text);
                free(prompt);
                free(text);
            }
        if (logger) fflush(stdout);
    }
    if (logger && batches == 0) printf("no prompt was given: nothing generated\n");
    if (logger && batches > 0) {
        // the report: prefill and decode timed on this rank, start-up (process set-up, the
        // device, the communicators, the checkpoint read, the buffers) kept apart
        qsort(steps, nsteps, sizeof(double), mt__compare_doubles);
        qsort(ttft, (size_t)batches, sizeof(double), mt__compare_doubles);
        // nearest rank: the p-th percentile of n sorted values is the ceil(p n)-th
        double median = nsteps ? steps[(nsteps - 1) / 2] : 0.0, p90 = nsteps ? steps[(9 * nsteps + 9) / 10 - 1] : 0.0;
        double per_seq = elapsed > 0 ? (double)generated / (double)sequences / (elapsed / batches) : 0.0;
        if (stopped)
            printf("note: %d sequence%s stopped at the model's last position (--max-position-embeddings %d); "
                   "the window does not slide\n", stopped, stopped == 1 ? "" : "s",
                   cfg->model.max_position_embeddings);
        printf("generation report (%s, TP=%d PP=%d, batch %d, %d sequence%s in %d batch%s, temperature %g, "
               "top-k %d, top-p %g):\n", r->dev.name[0] ? r->dev.name : "CPU", r->ps.tp_size, r->ps.pp_size, B,
               sequences, sequences == 1 ? "" : "s", batches, batches == 1 ? "" : "es", (double)mt__sampling(t).temperature,
               t->top_k, (double)t->top_p);
        printf("  start-up: %.3f s (configuration, devices, communicators, checkpoint, KV cache, warm-up); launch to first "
               "token %.3f s\n", startup, startup + ttft_first);
        printf("  time to first token: %.2f ms (median of %d batch%s; the prompt's prefill and the first sample)\n",
               1e3 * ttft[batches / 2], batches, batches == 1 ? "" : "es");
        printf("  tokens/s: %.1f total, %.1f per sequence (%lld tokens in %.3f s)\n",
               elapsed > 0 ? (double)generated / elapsed : 0.0, per_seq, generated, elapsed);
        printf("  per-token latency (one decode step): median %.3f ms, p90 %.3f ms over %zu steps\n", 1e3 * median,
               1e3 * p90, nsteps);
        printf("  memory: %.3f GiB (%s); KV cache %.1f MB, parameters %.1f MB on this rank\n", peak, peak_what,
               (double)g.cache_bytes / 1e6, (double)r->model.num_params * sizeof(float) / 1e6);
        fflush(stdout);
    }
    free(steps);
    free(ttft);
    mt_generator_free(&g);
    mt_buffer_free(r->model.params_memory);
    mt_groups_free(&r->groups);
    mt_device_free(r);
    free(r);
}

// a JSON string literal of bytes: escapes as JSON needs; a byte that is not UTF-8 (a token may
// end inside a character) becomes U+FFFD, so the line stays valid JSON (the ids are exact)
static void mt__json_write_string(FILE *f, const char *s, size_t n) {
    fputc('"', f);
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int len = mt_utf8_decode(s + i, n - i, &cp);
        if (len == 0) { fputs("\\ufffd", f); i++; continue; }
        if (cp == '"') fputs("\\\"", f);
        else if (cp == '\\') fputs("\\\\", f);
        else if (cp == '\n') fputs("\\n", f);
        else if (cp == '\r') fputs("\\r", f);
        else if (cp == '\t') fputs("\\t", f);
        else if (cp < 0x20) fprintf(f, "\\u%04x", (unsigned)cp);
        else fwrite(s + i, 1, (size_t)len, f);
        i += (size_t)len;
    }
    fputc('"', f);
}

// The samples as JSON lines, written to a temporary name and renamed (a run stopped midway leaves
// no half file). --sample-output-file: {"prompt", "text", "prompt_tokens", "tokens"} per sample.
// --genfile (Megatron's unconditional samples, tools/generate_samples_gpt.py's
// generate_and_write_samples_unconditional): {"text", "length", "finished"}, here with "tokens"
// too; text is the tokens without a closing <|endoftext|>, length counts that one, finished says it
// closed with it (Megatron's own test, length < --seq-length - 1, also calls a sample cut by
// --out-seq-length finished)
static void mt__gen_write_samples(const mt__gen_job *job, const char *path, int genfile) {
    char tmp[MT_PATH_MAX + 64];
    FILE *f = mt_atomic_open(path, tmp, sizeof tmp);
    int per = job->cfg->train.out_seq_length > 0 ? job->cfg->train.out_seq_length : 1;
    for (int i = 0; i < job->n; i++) {
        const int32_t *ids = job->out + (size_t)i * (size_t)per;
        int n = job->count[i], finished = genfile && n > 0 && job->eod >= 0 && ids[n - 1] == job->eod;
        if (!genfile) {
            fputs("{\"prompt\": ", f);
            mt__json_write_string(f, job->text[i], strlen(job->text[i]));
            fputs(", ", f);
        }
        char *text = mt__gen_text(job->tokenizer, ids, n - finished);
        fputs(genfile ? "{\"text\": " : "\"text\": ", f);
        mt__json_write_string(f, text, strlen(text));
        free(text);
        if (genfile) {
            fprintf(f, ", \"length\": %d, \"finished\": %s", n, finished ? "true" : "false");
        } else {
            fputs(", \"prompt_tokens\": [", f);
            for (int k = 0; k < job->prompt_len[i]; k++) fprintf(f, "%s%d", k ? ", " : "", job->prompt[i][k]);
            fputs("]", f);
        }
        fputs(", \"tokens\": [", f);
        for (int k = 0; k < n; k++) fprintf(f, "%s%d", k ? ", " : "", ids[k]);
        fputs("]}\n", f);
    }
    if (ferror(f)) { mt_atomic_abort(f, tmp); mt_fatal("writing %s failed: %s\nhint: check free disk space", path,
                                                       strerror(errno)); }
    mt_atomic_commit(f, tmp, path);
    printf("wrote %d %ssample%s to %s\n", job->n, genfile ? "unconditional " : "", job->n == 1 ? "" : "s", path);
}

static int mt__generation_mode(const mt_config *cfg) {
    const mt_train_config *t = &cfg->train;
    return t->load[0] && t->train_iters == 0 && !t->convert_checkpoint && !t->export_hf[0] && !t->import_hf[0] &&
           !cfg->parallel.print_layout && !cfg->parallel.print_schedule && !cfg->parallel.dry_run;
}

static int mt__generate_main(mt_config *cfg, const mt_tokenizer *tok, double launch) {
    mt_train_config *t = &cfg->train;
    // the samples are printed unless they go to a file the user named
    int echo = !t->sample_output_file[0] && !(t->genfile[0] && t->num_samples > 0 && !t->prompt[0] &&
                                               !t->sample_input_file[0]);
    // Megatron's default for --sample-input-file: its samples also go to that path + ".out"
    if (t->sample_input_file[0] && !t->prompt[0] && !t->sample_output_file[0]) {
        if (snprintf(t->sample_output_file, sizeof t->sample_output_file, "%s.out", t->sample_input_file) >=
            (int)sizeof t->sample_output_file)
            mt_fatal("--sample-input-file %s: the path is too long to add .out to\nhint: give --sample-output-file",
                     t->sample_input_file);
        mt__note("--sample-output-file not given: the samples go to %s as well (Megatron's default)",
                 t->sample_output_file);
    }
    // written after the last sequence: a path that cannot be written fails before the model loads
    if (cfg->train.sample_output_file[0]) mt__claim_output_file(cfg->train.sample_output_file, "--sample-output-file");
    // --genfile holds unconditional samples, as in Megatron, which writes it only for --num-samples N
    // without prompts (with prompts, or none and no N, it samples them and leaves --genfile alone)
    if (cfg->train.genfile[0]) {
        if (cfg->train.num_samples > 0 && !cfg->train.prompt[0] && !cfg->train.sample_input_file[0]) {
            mt__claim_output_file(cfg->train.genfile, "--genfile");
        } else {
            mt__note("--genfile %s is for unconditional samples (--num-samples N without --prompt or "
                     "--sample-input-file), as in Megatron: not written; the samples go to %s", cfg->train.genfile,
                     cfg->train.sample_output_file[0] ? "--sample-output-file" : "standard output");
            cfg->train.genfile[0] = '\0';
        }
    }
    if (cfg->train.tokens_to_generate > 0) {   // the trainer's own flag says how many, too
        cfg->train.out_seq_length = cfg->train.tokens_to_generate;
        mt__note("--tokens-to-generate %d in generation mode: --out-seq-length %d", cfg->train.tokens_to_generate,
                 cfg->train.tokens_to_generate);
    }
    mt_config src;
    mt__gen_config(cfg, &src);
    if (tok && tok->vocab_size != cfg->model.vocab_size)
        mt_fatal("the tokenizer has %d ids, the checkpoint's model %d\nhint: give the --vocab-file it was trained "
                 "with, or none (prompts as token ids)", tok->vocab_size, cfg->model.vocab_size);
    mt__gen_job job;
    memset(&job, 0, sizeof job);
    job.cfg = cfg;
    job.tokenizer = tok;
    job.launch = launch;
    job.echo = echo;
    int eod = tok ? tok->eod_id : cfg->model.vocab_size - 1;   // GPT-2's <|endoftext|> is its last id
    job.eod = cfg->train.ignore_eos ? -1 : eod;
    mt__gen_prompts(&job);
    if (job.eod < 0) job.eod = -1;
    mt__full_checkpoint full;
    int same = src.parallel.tensor_model_parallel_size == cfg->parallel.tensor_model_parallel_size &&
               src.parallel.pipeline_model_parallel_size == cfg->parallel.pipeline_model_parallel_size &&
               src.virtual_pipeline_size == cfg->virtual_pipeline_size;
    if (!same) {
        fprintf(stderr, "note: the checkpoint was saved with TP=%d PP=%d; it is re-cut for this run's TP=%d PP=%d in "
                        "memory\n", src.parallel.tensor_model_parallel_size,
                src.parallel.pipeline_model_parallel_size, cfg->parallel.tensor_model_parallel_size,
                cfg->parallel.pipeline_model_parallel_size);
        mt__ckpt_read_full(cfg->train.load, &full);
        job.full = &full;
    }
    mt_device_check_precision(cfg);
    if (job.interactive)
        printf("generation: model L=%d C=%d NH=%d maxT=%d V=%d from %s; prompts from this terminal, one per line "
               "(\"stop\" or Ctrl-D ends), up to %d new tokens each\n", cfg->model.num_layers, cfg->model.hidden_size,
               cfg->model.num_attention_heads, cfg->model.max_position_embeddings, cfg->model.vocab_size,
               cfg->train.load, cfg->train.out_seq_length);
    else
        printf("generation: model L=%d C=%d NH=%d maxT=%d V=%d from %s; %d sequence%s, up to %d new tokens each\n",
               cfg->model.num_layers, cfg->model.hidden_size, cfg->model.num_attention_heads,
               cfg->model.max_position_embeddings, cfg->model.vocab_size, cfg->train.load, job.n,
               job.n == 1 ? "" : "s", cfg->train.out_seq_length);
    fflush(stdout);
    mt_world *w = mt_world_create(cfg->world_size);
    int rc = mt_world_run(w, mt__gen_rank_main, &job);
    mt_world_destroy(w);
    if (rc == 0 && cfg->train.sample_output_file[0]) mt__gen_write_samples(&job, cfg->train.sample_output_file, 0);
    if (rc == 0 && cfg->train.genfile[0]) mt__gen_write_samples(&job, cfg->train.genfile, 1);
    if (job.full) mt__ckpt_free_full(&full);
    if (job.interactive) {   // slot 0 only (job.n is 0 after "stop")
        job.n = 1;
        pthread_mutex_destroy(&job.lock);
        pthread_cond_destroy(&job.wake);
    }
    for (int i = 0; i < job.n; i++) { free(job.text[i]); free(job.prompt[i]); }
    free(job.text); free(job.prompt); free(job.prompt_len); free(job.out); free(job.count);
    return rc;
}

int mt_pretrain(mt_config *cfg) {
    double started = mt_time_seconds();
    mt_tokenizer tokenizer;
    int have_tokenizer = mt__load_tokenizer(cfg, &tokenizer);
    if (cfg->train.import_hf[0]) {   // a Hugging Face GPT-2 into our checkpoint (section 10), then exit
        if (!cfg->train.save[0]) mt_fatal("--import-hf needs --save DST (where our checkpoint goes)");
        mt_checkpoint_claim_dir(cfg->train.save, cfg->train.import_hf, 0, cfg->train.overwrite);
        mt_checkpoint_import_hf(cfg->train.import_hf, cfg->train.save, cfg->train.target_tp, cfg->train.target_pp,
                                cfg->train.target_vp_layers);
        if (have_tokenizer) mt_tokenizer_free(&tokenizer);
        return 0;
    }
    if (mt__generation_mode(cfg)) {   // --load without --train-iters: generate (Megatron's generate_samples_gpt.py)
        mt_launch one;
        mt_launch_detect(&one, cfg);
        if (one.nprocs > 1)
            mt_fatal("generation runs in one process (its TP x PP ranks as threads), but the environment describes "
                     "%d processes (%s)\nhint: start ./train_gpt once, with --nproc-per-node TP*PP", one.nprocs,
                     one.found);
        mt_checkpoint_resolve_load(cfg);
        int rc = mt__generate_main(cfg, have_tokenizer ? &tokenizer : NULL, started);
        if (have_tokenizer) mt_tokenizer_free(&tokenizer);
        return rc;
    }
    // who started us: one process (every rank a thread), or srun / mpirun / torchrun-style
    // variables describing several processes (section 2, LAUNCH); the world counts them all
    mt_launch launch;
    mt_launch_detect(&launch, cfg);
    // --use-checkpoint-args: the model's shape from the --load checkpoint (Megatron's
    // load_args_from_checkpoint), before anything is sized from it
    if (cfg->train.use_checkpoint_args && cfg->train.load[0]) {
        mt_checkpoint_resolve_load(cfg);
        mt_config src;
        if (!mt__ckpt_adopt_shape(cfg, &src, 0))
            mt__note("--use-checkpoint-args: %s holds no checkpoint to take the model's shape from; the given flags "
                     "stand", cfg->train.load);
    }
    mt_config_derive(cfg);
    if (cfg->parallel.print_launch) {
        mt_launch_print(&launch, cfg, stdout);
        if (have_tokenizer) mt_tokenizer_free(&tokenizer);
        return 0;
    }
    if (cfg->train.load[0]) mt_checkpoint_resolve_load(cfg);
    if (cfg->train.exit_on_missing_checkpoint && cfg->train.load[0] && !mt_checkpoint_found(cfg))
        mt_fatal("--exit-on-missing-checkpoint: --load %s holds no checkpoint (no latest_checkpointed_iteration.txt)\n"
                 "hint: point --load at a directory written by --save, or drop the flag to start from random weights",
                 cfg->train.load);
    // checkpoint tools (modes of the trainer, as DESIGN allows): no training
    if (cfg->train.convert_checkpoint || cfg->train.export_hf[0]) {
        if (!cfg->train.load[0]) mt_fatal("--convert-checkpoint and --export-hf need --load SRC (the checkpoint to "
                                          "read)");
        if (cfg->train.convert_checkpoint) {
            printf("converting the checkpoint %s to TP=%d PP=%d into %s ...\n", cfg->train.load, cfg->train.target_tp,
                   cfg->train.target_pp, cfg->train.save[0] ? cfg->train.save : "?");
            fflush(stdout);
            if (!cfg->train.save[0]) mt_fatal("--convert-checkpoint needs --save DST (where the converted checkpoint "
                                              "goes)");
            mt_checkpoint_claim_dir(cfg->train.save, cfg->train.load, 0, cfg->train.overwrite);
            mt_checkpoint_convert(cfg->train.load, cfg->train.save, cfg->train.target_tp, cfg->train.target_pp,
                                  cfg->train.target_vp_layers);
        }
        if (cfg->train.export_hf[0]) {
            printf("exporting the checkpoint %s as Hugging Face GPT-2 into %s ...\n", cfg->train.load,
                   cfg->train.export_hf);
            fflush(stdout);
            mt_checkpoint_export_hf(cfg->train.load, cfg->train.export_hf);
        }
        if (have_tokenizer) mt_tokenizer_free(&tokenizer);
        return 0;
    }
    if (cfg->parallel.print_layout || cfg->parallel.print_schedule || cfg->parallel.dry_run) {
        if (cfg->parallel.print_layout) mt_print_layout(cfg, stdout);
        else if (cfg->parallel.print_schedule) mt_print_schedule(cfg, stdout);
        else mt_print_memory_plan(cfg, stdout);
        if (have_tokenizer) mt_tokenizer_free(&tokenizer);
        return 0;
    }
    if (cfg->train.train_iters <= 0) mt_fatal("--train-iters must be positive\nhint: e.g. --train-iters 500");
    if (cfg->train.save_interval > 0 && !cfg->train.save[0])   // Megatron ignores it silently; we say so
        fprintf(stderr, "WARNING: --save-interval %d without --save: no checkpoints will be written "
                        "(add --save DIR to write them)\n", cfg->train.save_interval);
    if (cfg->train.save[0]) mt_checkpoint_claim_dir(cfg->train.save, cfg->train.load, 1, cfg->train.overwrite);
    // several processes: the timeline needs every rank's spans in one process, so it is not written
    if (launch.nprocs > 1 && (cfg->train.timeline[0] || cfg->train.timeline_svg[0])) {
        fprintf(stderr, "WARNING: --timeline and --timeline-svg need every rank in one process; not written in a "
                        "job of %d processes\n", launch.nprocs);
        cfg->train.timeline[0] = cfg->train.timeline_svg[0] = '\0';
    }
    // the timeline is written after the last iteration: a path that cannot be written fails now
    if (cfg->train.timeline[0]) mt__claim_output_file(cfg->train.timeline, "--timeline");
    if (cfg->train.timeline_svg[0]) mt__claim_output_file(cfg->train.timeline_svg, "--timeline-svg");
    mt_device_check_precision(cfg);
    if (launch.kind == MT_LAUNCH_THREADS) mt_check_host_memory(cfg, 0, cfg->world_size, 1);
    else mt_check_host_memory(cfg, launch.first_rank, launch.ranks_per_proc, launch.local_nprocs);
    mt_launch_print(&launch, cfg, stdout);
    mt_print_config(cfg, stdout);
    printf("number of parameters: %zu (%.2f M)\n", mt_model_num_parameters(cfg), mt_model_num_parameters(cfg) / 1e6);
    double t0 = mt_time_seconds();
    if (cfg->train.mock_data)
        printf("building the data: Megatron's mock dataset (--mock-data), splitting, shuffling the sample "
               "indices ...\n");
    else
        printf("building the data: opening %d dataset%s, splitting, shuffling the sample indices ...\n",
               cfg->train.num_data_paths, cfg->train.num_data_paths == 1 ? "" : "s");
    fflush(stdout);
    mt_data data;
    mt_data_init(&data, cfg);
    // --eval-iters 0 turns validation and test off (Megatron's do_valid, do_test), so those splits
    // are not built though they have documents; "empty" is for a split with none under --split
    for (int s = 0; s < 3; s++)
        printf("%s split: %s\n", s == 0 ? "train" : s == 1 ? "valid" : "test",
               data.has_split[s]                       ? "ready"
               : s > 0 && cfg->train.eval_iters == 0   ? "not evaluated (--eval-iters 0)"
                                                       : "empty (skipped)");
    printf("data ready in %.2f s; training %d iterations of %d samples x %d tokens\n", mt_time_seconds() - t0,
           cfg->train.train_iters, cfg->train.global_batch_size, cfg->model.seq_length);
    fflush(stdout);
    mt__job job;
    memset(&job, 0, sizeof job);
    job.cfg = cfg;
    job.data = &data;
    job.tokenizer = have_tokenizer ? &tokenizer : NULL;
    // several processes: the last rank's process writes TensorBoard's events
    int last_rank_here = launch.nprocs == 1 || launch.proc == launch.nprocs - 1;
    if (cfg->train.tensorboard_dir[0] && last_rank_here) {   // the last rank's writer, as Megatron's
        mt_tb_open(&job.tb, cfg->train.tensorboard_dir, cfg->world_size - 1, cfg->train.tensorboard_queue_size);
        printf("TensorBoard events: %s (tensorboard --logdir %s)\n", job.tb.path, cfg->train.tensorboard_dir);
    }
    if (cfg->train.timeline[0] || cfg->train.timeline_svg[0])
        job.spans = (mt_span_log *)mt_calloc((size_t)cfg->world_size, sizeof(mt_span_log), "timeline");
    mt_int_list prompt = {NULL, 0, 0};
    if (cfg->train.tokens_to_generate > 0) {
        mt__encode_prompt(cfg, job.tokenizer, &prompt);
        job.prompt = prompt.data;
        job.prompt_len = (int)prompt.len;
    }
    mt_world *w = mt_world_create_launched(&launch, cfg);   // several processes: the rendezvous
    int rc = mt_world_run(w, mt__rank_main, &job);
    mt_world_destroy(w);
    mt_tb_close(&job.tb);
    if (job.spans) {
        if (rc == 0 && cfg->train.timeline[0] && mt_timeline_write_json(cfg->train.timeline, cfg, job.spans,
                                                                        cfg->world_size))
            printf("timeline (Chrome trace; open in ui.perfetto.dev): %s\n", cfg->train.timeline);
        if (rc == 0 && cfg->train.timeline_svg[0] && mt_timeline_write_svg(cfg->train.timeline_svg, cfg, job.spans,
                                                                           cfg->world_size))
            printf("timeline (SVG; open in a browser): %s\n", cfg->train.timeline_svg);
        for (int k = 0; k < cfg->world_size; k++) mt_span_log_free(&job.spans[k]);
        free(job.spans);
    }
    if (have_tokenizer) mt_tokenizer_free(&tokenizer);
    mt_int_list_free(&prompt);
    mt_data_free(&data);
    return rc;
}

#endif /* MEGATRON_IMPLEMENTATION_DONE */
#endif /* MEGATRON_IMPLEMENTATION */

/*
   LICENSE: MIT. Copyright (c) 2026 the megatron.h authors.
   Permission is hereby granted, free of charge, to any person obtaining a copy of this software
   and associated documentation files, to deal in the software without restriction, including the
   rights to use, copy, modify, merge, publish, distribute, sublicense and sell copies of it,
   provided that this notice is included in all copies. THE SOFTWARE IS PROVIDED "AS IS",
   WITHOUT WARRANTY OF ANY KIND.
*/

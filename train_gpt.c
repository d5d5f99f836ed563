/* train_gpt.c - the trainer (Megatron-LM's pretrain_gpt.py): flags -> config -> megatron.h.
 *
 *   ./train_gpt --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 64 \
 *       --micro-batch-size 4 --global-batch-size 8 --train-iters 50 --lr 1e-3 \
 *       --data-path data/my_dataset_text_document --vocab-file data/gpt2-vocab.json \
 *       --merge-file data/gpt2-merges.txt
 *
 * CPU build: every rank is a thread of this process (--nproc-per-node ranks, TP*PP by default).
 */
#define MEGATRON_IMPLEMENTATION
#include "megatron.h"

int main(int argc, char **argv) {
#ifdef __CUDACC__
    // NVLink SHARP (multicast) all-reduce is not used: NCCL_NVLS_ENABLE=0 unless the user says
    setenv("NCCL_NVLS_ENABLE", "0", 0);
#endif
    mt_config cfg;
    mt_config_defaults(&cfg);
    mt_config_parse(&cfg, argc, argv);
    // the vocabulary size comes from the tokenizer, as in Megatron (unless --vocab-size says)
    if (cfg.model.vocab_size == 0 && cfg.train.vocab_file[0] && strcmp(cfg.train.tokenizer_type, "NullTokenizer") != 0) {
        if (!cfg.train.merge_file[0]) mt_fatal("--vocab-file needs --merge-file (GPT2BPETokenizer)");
        mt_tokenizer tok;
        mt_tokenizer_load(&tok, cfg.train.vocab_file, cfg.train.merge_file);
        cfg.model.vocab_size = tok.vocab_size;
        mt_tokenizer_free(&tok);
    }
    mt_config_derive(&cfg);
    return mt_pretrain(&cfg);
}

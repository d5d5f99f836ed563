/* train_gpt.c - the trainer (Megatron-LM's pretrain_gpt.py): flags -> config -> megatron.h.
 *
 *   ./train_gpt --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 64 \
 *       --micro-batch-size 4 --global-batch-size 8 --train-iters 50 --lr 1e-3 \
 *       --data-path data/my_dataset_text_document --vocab-file data/gpt2-vocab.json \
 *       --merge-file data/gpt2-merges.txt
 *
 * CPU build: every rank is a thread of this process (--nproc-per-node ranks, TP*PP by default).
 * GPU build (train_gpt_cuda, the same file through nvcc): one thread per GPU.
 */
#define MEGATRON_IMPLEMENTATION
#include "megatron.h"

int main(int argc, char **argv) {
    mt_config cfg;
    mt_config_defaults(&cfg);
    mt_config_parse(&cfg, argc, argv);
    // the tokenizer (the vocabulary size), mt_config_derive, then the job: megatron.h section 12
    return mt_pretrain(&cfg);
}

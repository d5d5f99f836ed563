#!/bin/sh
# Issue 6's runs as far as the machine allows: the tutorial's GPT-2 small (12 layers, 768 hidden,
# 12 heads, seq 1024) with micro-batch 4 and global batch 32 on the bundled corpus, bf16, in the
# layouts that fit the GPUs present. ITERS (default 300) iterations for the 2-GPU layouts,
# SHORT_ITERS (default 100) for the 1-GPU and pipeline runs. Prints a table at the end.
set -u
export NCCL_NVLS_ENABLE=0
mkdir -p build
ITERS=${ITERS:-300}; SHORT_ITERS=${SHORT_ITERS:-100}
ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
[ -f build/bench_text_document.idx ] || ./preprocess --input data/corpus.jsonl --output-prefix build/bench \
  --vocab-file data/gpt2-vocab.json --merge-file data/gpt2-merges.txt --tokenizer-type GPT2BPETokenizer \
  --seq-length 1024 --workers 4 --append-eod > /dev/null 2>&1
G="--num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 1024 --max-position-embeddings 1024 \
 --micro-batch-size 4 --global-batch-size 32 --lr 6.0e-4 --min-lr 6.0e-5 --lr-decay-style cosine --lr-warmup-fraction .01 \
 --weight-decay 0.1 --clip-grad 1.0 --bf16 --log-interval 50 --eval-interval 100 --eval-iters 5 --split 949,50,1 \
 --hidden-dropout 0 --attention-dropout 0 \
 --data-path build/bench_text_document --vocab-file data/gpt2-vocab.json --merge-file data/gpt2-merges.txt"
printf "%-24s %5s %6s %10s %10s %7s %9s %10s %10s\n" layout GPUs iters ms/step tokens/s MFU GiB/GPU "lm loss" "val loss" > build/tutorial_table.txt
run() {   # tag, label, gpus, iters, flags
  tag=$1; label=$2; gpus=$3; iters=$4; shift 4
  if [ "$gpus" -gt "$ngpu" ]; then printf "%-24s needs %d GPUs, this machine has %d: not run\n" "$label" "$gpus" "$ngpu" >> build/tutorial_table.txt; return; fi
  echo "./train_gpt_cuda $G --train-iters $iters $*" > build/tutorial_$tag.log
  ./train_gpt_cuda $G --train-iters $iters "$@" >> build/tutorial_$tag.log 2>&1
  last=$(grep "^ iteration" build/tutorial_$tag.log | tail -n 1)
  [ -n "$last" ] || { printf "%-24s failed, see build/tutorial_%s.log\n" "$label" "$tag" >> build/tutorial_table.txt; tail -3 build/tutorial_$tag.log; return; }
  ms=$(echo "$last" | sed 's/.*elapsed time per iteration (ms): \([0-9.]*\).*/\1/')
  tps=$(echo "$last" | sed 's/.*tokens per second: \([0-9.]*\).*/\1/')
  loss=$(echo "$last" | sed 's/.*lm loss: \([0-9.E+-]*\).*/\1/')
  val=$(grep "validation loss at the end" build/tutorial_$tag.log | sed 's/.*lm loss value: \([0-9.E+-]*\).*/\1/' | tail -n 1)
  mem=$(grep "GPU memory in use at the end" build/tutorial_$tag.log | sed 's/.*end: \([0-9.]*\) GiB.*/\1/' | sort -n | tail -n 1)
  mfu=$(awk -v t="$tps" -v g="$gpus" 'BEGIN { printf "%.1f", 100 * t * 860.1e6 / (989.4e12 * g) }')
  printf "%-24s %5s %6s %10s %10s %6s%% %9s %10s %10s\n" "$label" "$gpus" "$iters" "$ms" "$tps" "$mfu" "$mem" "$loss" "$val" >> build/tutorial_table.txt
}
# the tutorial's checkpointing: save every 100, stop at ITERS, then a new process resumes for 100 more
rm -rf build/ckpt_tp2
run tp2 "TP=2 (DP=1)" 2 $((ITERS + 100)) --tensor-model-parallel-size 2 --nproc-per-node 2 \
  --save build/ckpt_tp2 --save-interval 100 --exit-interval $ITERS
run tp2_resume "TP=2 resumed" 2 $((ITERS + 100)) --tensor-model-parallel-size 2 --nproc-per-node 2 \
  --load build/ckpt_tp2 --save build/ckpt_tp2 --save-interval 100
run dp2 "DP=2 (TP=1)" 2 $ITERS --nproc-per-node 2
run 1gpu "1 GPU" 1 $SHORT_ITERS
run pp2 "PP=2 (TP=1, DP=1)" 2 $SHORT_ITERS --pipeline-model-parallel-size 2 --nproc-per-node 2
run tp2dp2 "TP=2 x DP=2" 4 $ITERS --tensor-model-parallel-size 2 --nproc-per-node 4
run tp4 "TP=4" 4 $ITERS --tensor-model-parallel-size 4 --nproc-per-node 4
run pp2tp2 "PP=2 x TP=2" 4 $ITERS --pipeline-model-parallel-size 2 --tensor-model-parallel-size 2 --nproc-per-node 4
cat build/tutorial_table.txt

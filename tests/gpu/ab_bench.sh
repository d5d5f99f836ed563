#!/bin/sh
# Two builds of train_gpt_cuda timed in the same device call (the GPU's speed drifts 10-15% from one
# lent machine to the next, so a change is measured against its baseline on the same GPU, runs
# interleaved):  sh tests/gpu/ab_bench.sh BASELINE_BINARY NEW_BINARY [rounds]
# Per round and binary: GPT-2 small bf16 B=16 training (the ms/step of `make bench`'s flags, the
# last iteration line of 20), then greedy decoding at batch 1 (GPT-2 small with random weights,
# 256 new tokens after 16, the report's median per-token latency). Prints a table.
set -u
A=$1; Bn=$2; R=${3:-2}
export NCCL_NVLS_ENABLE=0
mkdir -p build
[ -f build/bench_text_document.idx ] || ./preprocess --input data/corpus.jsonl --output-prefix build/bench \
  --vocab-file data/gpt2-vocab.json --merge-file data/gpt2-merges.txt --append-eod --workers 8 > /dev/null 2>&1
G="--config configs/gpt_small.json --bf16 --micro-batch-size 16 --train-iters 20 --lr 6e-4 --min-lr 6e-5 \
 --lr-decay-style cosine --lr-warmup-iters 10 --weight-decay 0.1 --clip-grad 1.0 --log-interval 10 \
 --hidden-dropout 0 --attention-dropout 0 --eval-interval 100000 --eval-iters 0 --split 949,50,1 \
 --data-path build/bench_text_document --vocab-file data/gpt2-vocab.json --merge-file data/gpt2-merges.txt"
D=build/prof_decode
if [ ! -f $D/gpt2_ck/latest_checkpointed_iteration.txt ]; then
  mkdir -p $D
  python3 tests/gpu/generate_ref.py make-gpt2 $D/gpt2 > /dev/null 2>&1 && ./train_gpt --import-hf $D/gpt2 --save $D/gpt2_ck > /dev/null
fi
python3 -c "
import numpy as np
ids = np.random.default_rng(5).integers(0, 50000, (1, 16))
open('$D/prompts1.txt', 'w').write(''.join(' '.join(map(str, r)) + '\n' for r in ids))"
echo "| round | binary | ms/step (B=16) | lm loss | GiB at the end | decode ms/token (median, batch 1) | tokens/s |"
echo "|---|---|---|---|---|---|---|"
r=1
while [ $r -le $R ]; do
  for bin in "$A" "$Bn"; do
    log=build/ab_train.log
    $bin $G > $log 2>&1
    last=$(grep "^ iteration" $log | tail -n 1)
    ms=$(echo "$last" | sed 's/.*elapsed time per iteration (ms): \([0-9.]*\).*/\1/')
    loss=$(echo "$last" | sed 's/.*lm loss: \([0-9.E+-]*\).*/\1/')
    mem=$(grep "GPU memory in use at the end" $log | sed 's/.*end: \([0-9.]*\) GiB.*/\1/' | tail -n 1)
    $bin --bf16 --load $D/gpt2_ck --sample-input-file $D/prompts1.txt --micro-batch-size 1 --greedy --ignore-eos \
      --out-seq-length 256 --sample-output-file build/ab_decode.jsonl > build/ab_decode.log 2>&1
    tok=$(grep "per-token latency" build/ab_decode.log | sed 's/.*median \([0-9.]*\) ms.*/\1/')
    tps=$(grep "tokens/s:" build/ab_decode.log | sed 's/.*tokens\/s: \([0-9.]*\) total.*/\1/')
    echo "| $r | $bin | $ms | $loss | $mem | $tok | $tps |"
  done
  r=$((r + 1))
done

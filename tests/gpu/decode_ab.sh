#!/bin/sh
# Decoding only, builds interleaved in one device call (the GPU's speed drifts from one lent machine
# to the next, so a change is timed against its baseline in the same call):
#   sh tests/gpu/decode_ab.sh ROUNDS "label binary" "label binary" ...
# A binary may be a wrapper script (say, one that sets an environment variable). Per round and
# build: batch-1 greedy decoding of GPT-2 small with random weights, 256 new tokens after a 16-token
# prompt (ab_bench.sh's decode part, without its training runs), then the same at batch 8 (prompts
# of 5 to 12 tokens, 128 new). Prints a table: the report's per-token median and p90, tokens/s,
# time to first token, start-up, and a checksum of each output file (the same tokens: the same sum).
# Needs ./train_gpt (the CPU build, for --import-hf) and python3 with torch and transformers.
set -u
R=$1; shift
export NCCL_NVLS_ENABLE=0
. tests/gpu/decode_model.sh   # $D: the model and the prompts
echo "| round | build | batch | ms/token median | p90 | tokens/s | TTFT ms | start-up s | output sum |"
echo "|---|---|---|---|---|---|---|---|---|"
r=1
while [ $r -le $R ]; do
  for B in 1 8; do
    for pair in "$@"; do
      lab=${pair%% *}; bin=${pair#* }
      new=256; [ $B -eq 8 ] && new=128
      log=build/dab_${lab}_$B.log; out=build/dab_${lab}_$B.jsonl
      $bin --bf16 --load $D/gpt2_ck --sample-input-file $D/prompts$B.txt --micro-batch-size $B --greedy --ignore-eos \
        --out-seq-length $new --sample-output-file $out > $log 2>&1 || echo "FAILED $lab batch $B: $(tail -n 1 $log)"
      tok=$(grep "per-token latency" $log | sed 's/.*median \([0-9.]*\) ms.*/\1/')
      p90=$(grep "per-token latency" $log | sed 's/.*p90 \([0-9.]*\) ms.*/\1/')
      tps=$(grep "tokens/s:" $log | sed 's/.*tokens\/s: \([0-9.]*\) total.*/\1/')
      ttft=$(grep "time to first token" $log | sed 's/.*token: \([0-9.]*\) ms.*/\1/')
      su=$(grep "start-up:" $log | sed 's/.*start-up: \([0-9.]*\) s.*/\1/')
      sum=$(cksum < $out 2>/dev/null | cut -d' ' -f1)
      echo "| $r | $lab | $B | $tok | $p90 | $tps | $ttft | $su | $sum |"
    done
  done
  r=$((r + 1))
done

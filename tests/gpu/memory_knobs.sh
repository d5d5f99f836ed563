#!/bin/sh
# Issue 11's closing measurements, on the GPU machine (one call; nothing here is checked against a
# bound: tests/gpu/test_memory.sh holds the plan to the measured peak):
#
#   sh tests/gpu/memory_knobs.sh [table|largest|all]        (default all; BIN=./train_gpt_cuda)
#
# table: GPT-2 small (configs/gpt_small.json) at micro-batch 8, 20 iterations, each memory knob
#   alone: none, --recompute-activations (selective), full recompute (uniform), --fp16 (dynamic
#   loss scaling, against bf16), --optimizer-cpu-offload, --use-distributed-optimizer (on one GPU
#   it shards over DP = 1: no saving; it is in the table so that the row says so). Per row: ms per
#   iteration and tokens/s of the last iteration line, the plan (--dry-run's total), the measured
#   peak ("memory plan vs measured"), the GiB in use at the end, the host's pinned bytes.
# largest: a ladder of GPT shapes (the GPT-3 paper's widths, head size 128, sequence 1024, GPT-2's
#   vocabulary, micro-batch 1, bf16), in two settings: plain, and "all" = full recompute + the
#   distributed optimizer + optimizer offload. For each shape: --dry-run first (the device plan
#   and the host plan); a shape whose device plan is over the GPU's memory, or whose host plan is
#   over the host's available memory, is marked "plan too big" and not run; otherwise 2
#   iterations, and "trained" means the second iteration line was printed and the run exited 0
#   (an out-of-memory stops it with the allocation it was for). The last "trained" row of each
#   setting is the largest GPT that trains on this GPU, measured.
# Output: tables on stdout and in build/memory_knobs.md; each run's log in build/memory_knobs/.
# LADDER="name:layers:hidden:heads ..." replaces the ladder, GPU_MB the device's size (a check of the
# script itself on the CPU build: LADDER=tiny:2:128:1 GPU_MB=100000 BIN=./train_gpt ... largest).
set -u
export NCCL_NVLS_ENABLE=0
what=${1:-all}
BIN=${BIN:-./train_gpt_cuda}
out=build/memory_knobs
mkdir -p "$out"
[ -x "$BIN" ] && [ -x ./preprocess ] || { echo "build first: make train_gpt_cuda preprocess"; exit 2; }
[ -f build/bench_text_document.idx ] || ./preprocess --input data/corpus.jsonl --output-prefix build/bench \
  --vocab-file data/gpt2-vocab.json --merge-file data/gpt2-merges.txt --append-eod --workers 8 > /dev/null 2>&1
DATA="--data-path build/bench_text_document --vocab-file data/gpt2-vocab.json --merge-file data/gpt2-merges.txt
 --split 949,50,1 --eval-interval 100000 --eval-iters 0 --hidden-dropout 0 --attention-dropout 0 --lr 6e-4
 --lr-warmup-iters 1 --log-interval 1"
md=build/memory_knobs.md
: > $md

# field VALUE-AFTER LINE: the number that follows the text $1 in line $2 ("-" when absent)
field() { v=$(echo "$2" | sed -n "s/.*$1 *\([0-9.]*\).*/\1/p"); echo "${v:--}"; }
# the plan's totals from --dry-run: "device MB|host MB" (host 0 when nothing is pinned)
plan() {
  line=$($BIN "$@" --dry-run 2>&1 | grep '^rank 0' | head -n 1)
  dev=$(field "total" "$line"); host=$(echo "$line" | sed -n 's/.*host (pinned): optimizer \([0-9.]*\).*/\1/p')
  echo "$dev|${host:-0}"
}

if [ "$what" = table ] || [ "$what" = all ]; then
  echo "| GPT-2 small, B=8, 1 GPU | ms/iteration | tokens/s | planned MB | measured peak MB | GiB at the end | host pinned MB |" | tee -a $md
  echo "|---|---|---|---|---|---|---|" | tee -a $md
  G="--config configs/gpt_small.json --micro-batch-size 8 --global-batch-size 8 --train-iters 20 $DATA"
  for c in "bf16|--bf16" "bf16, --recompute-activations|--bf16 --recompute-activations" \
           "bf16, full recompute (uniform)|--bf16 --recompute-granularity full --recompute-method uniform" \
           "fp16, dynamic loss scale|--fp16" "bf16, --optimizer-cpu-offload|--bf16 --optimizer-cpu-offload" \
           "bf16, --use-distributed-optimizer (DP=1)|--bf16 --use-distributed-optimizer"; do
    label=${c%%|*}; flags=${c#*|}
    log=$out/table_$(echo "$label" | tr -c 'a-z0-9\n' '_').log
    p=$(plan $G $flags)
    $BIN $G $flags > $log 2>&1
    last=$(grep "^ iteration" $log | tail -n 1)
    mem=$(grep "memory plan vs measured" $log | head -n 1)
    echo "| $label | $(field 'elapsed time per iteration (ms):' "$last") | $(field 'tokens per second:' "$last") |" \
         "${p%%|*} | $(field 'measured peak' "$mem") | $(field 'in use at the end:' "$(grep 'in use at the end' $log)") |" \
         "${p#*|} |" | tee -a $md
  done
fi

if [ "$what" = largest ] || [ "$what" = all ]; then
  gpu_mb=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2> /dev/null | head -n 1)
  gpu_mb=${GPU_MB:-$(awk -v m="${gpu_mb:-0}" 'BEGIN { printf "%.0f", m * 1.048576 }')}   # MiB -> MB, as the plan's
  host_mb=$(awk '/MemAvailable/ { printf "%.0f", $2 * 1.024 / 1000 }' /proc/meminfo)
  echo "GPU memory $gpu_mb MB, host memory available $host_mb MB" | tee -a $md
  LADDER=${LADDER:-"350M:24:1024:8 1.3B:24:2048:16 2.7B:32:2560:20 6.7B:32:4096:32 8.6B:40:4096:32 13B:40:5120:40 20B:44:6144:48"}
  for setting in plain all; do
    knobs=""
    [ $setting = all ] && knobs="--recompute-granularity full --recompute-method uniform --use-distributed-optimizer --optimizer-cpu-offload"
    echo "| GPT ($setting) | layers x hidden | device plan MB | host plan MB | result | measured peak MB | ms/iteration |" | tee -a $md
    echo "|---|---|---|---|---|---|---|" | tee -a $md
    for s in $LADDER; do
      name=${s%%:*}; rest=${s#*:}; L=${rest%%:*}; rest=${rest#*:}; H=${rest%%:*}; NH=${rest#*:}
      G="--num-layers $L --hidden-size $H --num-attention-heads $NH --seq-length 1024 --max-position-embeddings 1024
       --micro-batch-size 1 --global-batch-size 1 --train-iters 2 --bf16 $DATA $knobs"
      p=$(plan $G); dev=${p%%|*}; host=${p#*|}
      result="plan too big"; peak="-"; ms="-"
      if [ "$dev" != "-" ] && awk -v d="$dev" -v g="$gpu_mb" -v h="$host" -v a="$host_mb" 'BEGIN { exit !(d <= g && h <= a) }'; then
        log=$out/largest_${setting}_$name.log
        timeout 900 $BIN $G > $log 2>&1; rc=$?
        last=$(grep "^ iteration" $log | tail -n 1)
        if [ $rc -eq 0 ] && echo "$last" | grep -q "iteration *2/"; then result=trained
        else
          why=$(grep -m 1 -i 'error' $log | cut -c 1-80)
          # no error line: killed from outside (137: SIGKILL, the host's out-of-memory killer;
          # 124: the timeout), so say how it ended and what it printed last
          [ -n "$why" ] || why="exit $rc, no error line; last: $(tail -n 1 $log | cut -c 1-60)"
          result="failed: $why"
        fi
        peak=$(field 'measured peak' "$(grep 'memory plan vs measured' $log | head -n 1)")
        ms=$(field 'elapsed time per iteration (ms):' "$last")
      fi
      echo "| $name | $L x $H | $dev | $host | $result | $peak | $ms |" | tee -a $md
    done
  done
fi
echo "(written to $md)"

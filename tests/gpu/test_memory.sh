#!/bin/sh
# tests/gpu/test_memory.sh (on the GPU machine): the memory plan against the measured peak.
#
#   make train_gpt_cuda preprocess && sh tests/gpu/test_memory.sh        (about 2 minutes; make test-gpu runs it)
#
# GPT-2 small (configs/gpt_small.json), --bf16, one GPU, 3 iterations, in three configurations:
#   B=16 | B=16, --recompute-granularity full --recompute-method uniform | B=8, --recompute-activations
# After iteration 2 every rank prints Megatron's memory line and ours (megatron.h section 12):
#   [Rank 0] (after 2 iterations) memory (MB) | allocated: ... | max allocated: ... | reserved: ... | max reserved: ...
#   [Rank 0] memory plan vs measured: planned A MB, measured peak B MB (ratio r) | kernel scratch: planned K MB,
#            lent at most P MB (the arena P1, the pool P2) | outside the plan: the CUDA context C MB at start, N MB
#            more since (NCCL, kernels)
# Checks, per configuration:
#   1. the ratio measured / planned within 10% (the bound): the plan (section 8) counts what
#      the run holds at its peak, the CUDA context aside (measured at start, printed beside it);
#   2. the kernel scratch: the most lent (the rank's arena's high-water mark plus what the stream-ordered
#      pool lent past it, kernels.cuh section 1) is the plan's kernel scratch (section 3: the largest op's
#      rounded copies and split-K partials) within 1% + 1 MB (the arena rounds each piece up to 256
#      bytes): the launchers borrow what the plan counts, no more; and the pool's part is at most 1 MB
#      (its start-up allocation): the arena, sized by the plan, serves the whole step;
#   3. --dry-run prints the same planned total as the run (the plan needs no device).
# Prints OK / NOT OK per check, a table, and "N passed, N failed".
set -u
export NCCL_NVLS_ENABLE=0
mkdir -p build
[ -x ./train_gpt_cuda ] && [ -x ./preprocess ] || { echo "build first: make train_gpt_cuda preprocess"; exit 2; }
[ -f build/bench_text_document.idx ] || ./preprocess --input data/corpus.jsonl --output-prefix build/bench \
  --vocab-file data/gpt2-vocab.json --merge-file data/gpt2-merges.txt --append-eod --workers 8 > /dev/null 2>&1
G="--config configs/gpt_small.json --bf16 --train-iters 3 --lr 6e-4 --lr-warmup-iters 1 --log-interval 1 \
 --hidden-dropout 0 --attention-dropout 0 --eval-interval 100000 --eval-iters 0 --split 949,50,1 \
 --data-path build/bench_text_document --vocab-file data/gpt2-vocab.json --merge-file data/gpt2-merges.txt"
passed=0; failed=0
ok() { echo "OK $1"; passed=$((passed + 1)); }
notok() { echo "NOT OK $1"; failed=$((failed + 1)); }
# within(a, b, rel, abs): |a - b| <= rel * b + abs
within() { awk -v a="$1" -v b="$2" -v r="$3" -v c="$4" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && d <= r * b + c) }'; }

printf "%-40s %12s %14s %7s %16s %14s %12s\n" "GPT-2 small, bf16, 1 GPU" "planned MB" "measured MB" "ratio" \
  "kernel scr. MB" "lent MB" "context MB" > build/memory_table.txt
for c in "b16|--micro-batch-size 16 --global-batch-size 16" \
         "b16_full|--micro-batch-size 16 --global-batch-size 16 --recompute-granularity full --recompute-method uniform" \
         "b8_selective|--micro-batch-size 8 --global-batch-size 8 --recompute-activations"; do
  label=${c%%|*}; flags=${c#*|}
  log=build/memory_$label.log
  if ! ./train_gpt_cuda $G $flags > $log 2>&1; then notok "$label: the run failed (see $log)"; tail -5 $log; continue; fi
  line=$(grep "memory plan vs measured" $log | head -n 1)
  [ -n "$line" ] || { notok "$label: no 'memory plan vs measured' line in $log"; continue; }
  grep "memory (MB) | allocated" $log | head -n 1
  echo "$line"
  planned=$(echo "$line" | sed 's/.*planned \([0-9.]*\) MB, measured.*/\1/')
  peak=$(echo "$line" | sed 's/.*measured peak \([0-9.]*\) MB.*/\1/')
  ratio=$(echo "$line" | sed 's/.*(ratio \([0-9.]*\)).*/\1/')
  kplan=$(echo "$line" | sed 's/.*kernel scratch: planned \([0-9.]*\) MB.*/\1/')
  lent=$(echo "$line" | sed 's/.*kernel scratch: planned [0-9.]* MB, lent at most \([0-9.]*\) MB.*/\1/')
  pool=$(echo "$line" | sed 's/.*lent at most [0-9.]* MB (the arena [0-9.]*, the pool \([0-9.]*\)).*/\1/')
  ctx=$(echo "$line" | sed 's/.*the CUDA context \([0-9.]*\) MB.*/\1/')
  printf "%-40s %12s %14s %7s %16s %14s %12s\n" "$label ($flags)" "$planned" "$peak" "$ratio" "$kplan" "$lent" "$ctx" \
    | sed 's/--micro-batch-size \([0-9]*\) --global-batch-size [0-9]*/B=\1/' >> build/memory_table.txt
  if within "$peak" "$planned" 0.10 0; then ok "$label: measured peak $peak MB within 10% of the plan's $planned MB"
  else notok "$label: measured peak $peak MB is not within 10% of the plan's $planned MB"; fi
  if within "$lent" "$kplan" 0.01 1 && within "$pool" 0 0 1; then
    ok "$label: the kernel scratch lent at most $lent MB (the pool $pool), the plan's is $kplan MB"
  else notok "$label: the kernel scratch lent at most $lent MB (the pool $pool), the plan's is $kplan MB (want within 1% + 1 MB, the pool's part at most 1 MB)"; fi
  dry=$(./train_gpt_cuda $G $flags --dry-run 2>&1 | grep '^rank 0' | sed 's/.*total \([0-9.]*\).*/\1/')
  if [ "$dry" = "$planned" ]; then ok "$label: --dry-run plans the same $dry MB"
  else notok "$label: --dry-run plans '$dry' MB, the run $planned MB"; fi
done
cat build/memory_table.txt
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]

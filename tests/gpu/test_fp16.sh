#!/bin/sh
# tests/gpu/test_fp16.sh (on the GPU machine, after make): --fp16 with loss scaling on the GPU build.
#
#   1. a small model, 20 steps, a static --loss-scale 1024 (no skips, so the runs compare step for
#      step): GPU --fp16 against the CPU build's emulation of fp16 (the same operands rounded to
#      fp16: megatron.h "reduced precision"), tolerance 1e-3 = 2 fp16 units (u = 2^-11): both round
#      the same operands, the differences are fp32 sums in another order and attention's P rounded
#      before (GPU) or after (CPU) its normalisation, grown over 20 AdamW steps. Then GPU --bf16
#      against the CPU's emulated bf16 at 1e-2 (tests/gpu/test_train.sh's bf16 tolerance).
#   2. the same model from Megatron's 2^32 (dynamic scaling): the GPU and the CPU skip the same
#      number of steps (+-1: an overflow that is marginal in one build) and settle at the same scale
#      (within one halving).
#   3. GPT-2 small (124M), B=16, 200 steps: --fp16 against --bf16, the mean loss of the last 20
#      steps within 2% (two precisions, two trajectories: a sanity check that fp16 trains as well,
#      not an arithmetic claim), and ms/step of each (the mean of the last 20 steps).
# Prints the numbers, then "N passed, N failed".
set -u
export NCCL_NVLS_ENABLE=0
mkdir -p build
[ -x ./train_gpt_cuda ] && [ -x ./train_gpt ] && [ -x ./tests/gpu/compare_logs ] || {
  echo "build first: make train_gpt train_gpt_cuda tests/gpu/compare_logs"; exit 2; }
[ -f build/gpu_test_text_document.idx ] || ./preprocess --input data/corpus.jsonl --output-prefix build/gpu_test \
  --vocab-file data/gpt2-vocab.json --merge-file data/gpt2-merges.txt --append-eod --workers 4 > /dev/null 2>&1
D="--data-path build/gpu_test_text_document --vocab-file data/gpt2-vocab.json --merge-file data/gpt2-merges.txt \
 --split 949,50,1 --seed 1234 --hidden-dropout 0 --attention-dropout 0 --eval-interval 100000 --eval-iters 0"
M="--num-layers 4 --hidden-size 128 --num-attention-heads 4 --seq-length 64 --max-position-embeddings 64 \
 --micro-batch-size 4 --global-batch-size 8 --train-iters 20 --lr 1e-3 --lr-warmup-iters 5 --weight-decay 0.1 \
 --log-interval 1 $D"
passed=0; failed=0
check() { if [ "$1" -eq 0 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAILED: $2"; fi; }
# the fields of the last iteration line of a log
field() { grep "^ iteration" "$1" | tail -n 1 | sed "s/.*$2: \([0-9.E+-]*\).*/\1/"; }

# 1. static scale: GPU fp16 vs CPU emulated fp16; GPU bf16 vs CPU emulated bf16 (CPU runs in parallel)
./train_gpt $M --fp16 --loss-scale 1024 > build/fp16_cpu_static.log 2>&1 &
./train_gpt $M --bf16 > build/fp16_cpu_bf16.log 2>&1 &
./train_gpt $M --fp16 > build/fp16_cpu_dynamic.log 2>&1 &
./train_gpt_cuda $M --fp16 --loss-scale 1024 > build/fp16_gpu_static.log 2>&1; g1=$?
./train_gpt_cuda $M --bf16 > build/fp16_gpu_bf16.log 2>&1; g2=$?
./train_gpt_cuda $M --fp16 > build/fp16_gpu_dynamic.log 2>&1; g3=$?
wait
[ $g1 -eq 0 ] && ./tests/gpu/compare_logs build/fp16_cpu_static.log build/fp16_gpu_static.log 1e-3 fp16_static_vs_cpu
check $? "GPU --fp16 vs the CPU's emulation (see build/fp16_gpu_static.log)"
[ $g2 -eq 0 ] && ./tests/gpu/compare_logs build/fp16_cpu_bf16.log build/fp16_gpu_bf16.log 1e-2 bf16_vs_cpu
check $? "GPU --bf16 vs the CPU's emulation (see build/fp16_gpu_bf16.log)"

# 2. dynamic scaling from 2^32: the same skips and the same settled scale
skips() { grep "^ iteration" "$1" | sed 's/.*number of skipped iterations: *\([0-9]*\).*/\1/' | awk '{ s += $1 } END { print s + 0 }'; }
cs=$(skips build/fp16_cpu_dynamic.log); gs=$(skips build/fp16_gpu_dynamic.log)
cscale=$(field build/fp16_cpu_dynamic.log "loss scale"); gscale=$(field build/fp16_gpu_dynamic.log "loss scale")
echo "dynamic scaling from 2^32: skipped steps CPU $cs, GPU $gs; final loss scale CPU $cscale, GPU $gscale"
[ $g3 -eq 0 ] && awk -v a="$cs" -v b="$gs" -v x="$cscale" -v y="$gscale" \
  'BEGIN { d = a - b; r = x / y; exit !(a > 0 && d <= 1 && d >= -1 && r >= 0.5 && r <= 2) }'
check $? "dynamic scaling: the GPU and the CPU skip differently"

# 3. GPT-2 small: fp16 vs bf16, losses and ms/step
[ -f build/bench_text_document.idx ] || ./preprocess --input data/corpus.jsonl --output-prefix build/bench \
  --vocab-file data/gpt2-vocab.json --merge-file data/gpt2-merges.txt --append-eod --workers 8 > /dev/null 2>&1
G="--config configs/gpt_small.json --micro-batch-size 16 --global-batch-size 16 --train-iters 200 --lr 6e-4 \
 --min-lr 6e-5 --lr-decay-style cosine --lr-warmup-iters 20 --weight-decay 0.1 --clip-grad 1.0 --log-interval 1 \
 --hidden-dropout 0 --attention-dropout 0 --eval-interval 100000 --eval-iters 0 --split 949,50,1 \
 --data-path build/bench_text_document --vocab-file data/gpt2-vocab.json --merge-file data/gpt2-merges.txt"
./train_gpt_cuda $G --fp16 > build/fp16_gpt2_fp16.log 2>&1; h=$?
./train_gpt_cuda $G --bf16 > build/fp16_gpt2_bf16.log 2>&1; b=$?
tail20() { grep "^ iteration" "$1" | tail -n 20 | sed "s/.*$2: \([0-9.E+-]*\).*/\1/" | awk '{ s += $1 } END { printf "%.4f", NR ? s / NR : -1 }'; }
hl=$(tail20 build/fp16_gpt2_fp16.log "lm loss"); bl=$(tail20 build/fp16_gpt2_bf16.log "lm loss")
hm=$(tail20 build/fp16_gpt2_fp16.log "elapsed time per iteration (ms)"); bm=$(tail20 build/fp16_gpt2_bf16.log "elapsed time per iteration (ms)")
hs=$(skips build/fp16_gpt2_fp16.log); hscale=$(field build/fp16_gpt2_fp16.log "loss scale")
printf "%-28s %12s %10s %10s %14s\n" "GPT-2 small, B=16, 1 GPU" "lm loss(20)" "ms/step" "skipped" "loss scale" | tee build/fp16_table.txt
printf "%-28s %12s %10s %10s %14s\n" "--fp16 (dynamic, from 2^32)" "$hl" "$hm" "$hs" "$hscale" | tee -a build/fp16_table.txt
printf "%-28s %12s %10s %10s %14s\n" "--bf16" "$bl" "$bm" "0" "1.0" | tee -a build/fp16_table.txt
[ $h -eq 0 ] && [ $b -eq 0 ] && awk -v a="$hl" -v b="$bl" 'BEGIN { d = (a - b) / b; exit !(a > 0 && d < 0.02 && d > -0.02) }'
check $? "GPT-2 small: --fp16's loss is not within 2% of --bf16's (build/fp16_gpt2_*.log)"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]

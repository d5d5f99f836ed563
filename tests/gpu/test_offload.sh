#!/bin/sh
# tests/gpu/test_offload.sh (on the GPU machine, after make): --optimizer-cpu-offload and the
# DeepSpeed config on the GPU build. The CPU build's tests/test_offload.c shows offload = no offload
# bit for bit there (the same mt_adamw_cpu on both sides); on the GPU the device's AdamW kernel and
# the host threads' loop may round one multiply-add differently, so:
#   1. a small model, 20 steps, fp32, 1 GPU: with offload against without, and against the CPU build
#      with offload (1e-4, compare_logs.c's fp32 tolerance: here one float rounding per parameter per
#      step, grown over 20 steps); fp16 with dynamic scaling from 2^32: the same skipped steps with
#      and without offload.
#   2. 2 GPUs (DP=2, --use-distributed-optimizer, bf16): with offload against without (1e-2, bf16's
#      tolerance: a last-bit difference in a parameter can flip a bf16 rounding); and a DeepSpeed
#      config (ZeRO stage 1 + cpu offload) against the equivalent flags (1e-2: the same configuration,
#      but NCCL's all-reduce (stage 1) and reduce-scatter (the flags) may add in different orders).
#   3. a checkpoint saved with offload at step 10, resumed with offload: the straight run's losses
#      exactly (the same kernels and host loop in the same order); resumed without offload: 1e-4.
#   4. GPT-2 small, B=8, bf16, 1 GPU, 30 steps: the GPU memory in use at the end with and without
#      offload; the drop must be at least 90% of the plan's optimizer bytes (--dry-run), and the
#      ms/step of each (the mean of the last 10) are printed: what the offload costs.
# Prints the numbers, then "N passed, N failed".
set -u
export NCCL_NVLS_ENABLE=0
ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
mkdir -p build
[ -x ./train_gpt_cuda ] && [ -x ./train_gpt ] && [ -x ./tests/gpu/compare_logs ] || {
  echo "build first: make train_gpt train_gpt_cuda tests/gpu/compare_logs"; exit 2; }
[ -f build/gpu_test_text_document.idx ] || ./preprocess --input data/corpus.jsonl --output-prefix build/gpu_test \
  --vocab-file data/gpt2-vocab.json --merge-file data/gpt2-merges.txt --append-eod --workers 4 > /dev/null 2>&1
M="--num-layers 4 --hidden-size 128 --num-attention-heads 4 --seq-length 64 --max-position-embeddings 64 \
 --micro-batch-size 4 --global-batch-size 8 --train-iters 20 --lr 1e-3 --lr-warmup-iters 5 --weight-decay 0.1 \
 --log-interval 1 --eval-interval 100000 --eval-iters 0 --split 949,50,1 --seed 1234 \
 --hidden-dropout 0 --attention-dropout 0 \
 --data-path build/gpu_test_text_document --vocab-file data/gpt2-vocab.json --merge-file data/gpt2-merges.txt"
passed=0; failed=0; skipped=0
check() { if [ "$1" -eq 0 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAILED: $2"; fi; }
skips() { grep "^ iteration" "$1" | sed 's/.*number of skipped iterations: *\([0-9]*\).*/\1/' | awk '{ s += $1 } END { print s + 0 }'; }
O="--optimizer-cpu-offload"

# 1. one GPU, fp32; fp16 from 2^32
./train_gpt $M --fp32 $O > build/offload_cpu_fp32.log 2>&1 &
./train_gpt_cuda $M --fp32 > build/offload_gpu_plain.log 2>&1; a=$?
./train_gpt_cuda $M --fp32 $O > build/offload_gpu_fp32.log 2>&1; b=$?
wait
grep "host (pinned)" build/offload_gpu_fp32.log | head -n 1
[ $a -eq 0 ] && [ $b -eq 0 ] && ./tests/gpu/compare_logs build/offload_gpu_plain.log build/offload_gpu_fp32.log 1e-4 \
  offload_vs_device_fp32
check $? "1 GPU fp32: offload vs no offload (build/offload_gpu_*.log)"
[ $b -eq 0 ] && ./tests/gpu/compare_logs build/offload_cpu_fp32.log build/offload_gpu_fp32.log 1e-4 offload_gpu_vs_cpu
check $? "1 GPU fp32 with offload vs the CPU build with offload"
./train_gpt_cuda $M --fp16 > build/offload_gpu_fp16_plain.log 2>&1; a=$?
./train_gpt_cuda $M --fp16 $O > build/offload_gpu_fp16.log 2>&1; b=$?
sa=$(skips build/offload_gpu_fp16_plain.log); sb=$(skips build/offload_gpu_fp16.log)
echo "fp16 from 2^32: skipped steps without offload $sa, with offload $sb"
[ $a -eq 0 ] && [ $b -eq 0 ] && [ "$sa" -gt 0 ] && [ "$sa" -eq "$sb" ]
check $? "fp16: the same skipped steps with and without offload"

# 2. two GPUs: DP=2 with the distributed optimizer, bf16; the DeepSpeed config
if [ "$ngpu" -ge 2 ]; then
  D="--nproc-per-node 2 --use-distributed-optimizer --bf16"
  ./train_gpt_cuda $M $D > build/offload_gpu_dp2_plain.log 2>&1; a=$?
  ./train_gpt_cuda $M $D $O > build/offload_gpu_dp2.log 2>&1; b=$?
  [ $a -eq 0 ] && [ $b -eq 0 ] && ./tests/gpu/compare_logs build/offload_gpu_dp2_plain.log build/offload_gpu_dp2.log \
    1e-2 offload_dp2_distopt_bf16
  check $? "2 GPUs, DP=2 distributed bf16: offload vs no offload"
  cat > build/ds_config.json <<'EOF'
{
  "train_batch_size": 8, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
  "steps_per_print": 1, "gradient_clipping": 1.0,
  "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
  "bf16": {"enabled": true},
  "zero_optimization": {"stage": 1, "offload_optimizer": {"device": "cpu", "pin_memory": true}}
}
EOF
  ./train_gpt_cuda $M --nproc-per-node 2 --deepspeed --deepspeed_config build/ds_config.json > build/offload_gpu_ds.log 2>&1; a=$?
  ./train_gpt_cuda $M --nproc-per-node 2 --adam-beta2 0.95 --use-distributed-optimizer $O --bf16 \
    > build/offload_gpu_ds_flags.log 2>&1; b=$?
  grep "deepspeed config" build/offload_gpu_ds.log
  [ $a -eq 0 ] && [ $b -eq 0 ] && ./tests/gpu/compare_logs build/offload_gpu_ds_flags.log build/offload_gpu_ds.log 1e-2 \
    deepspeed_stage1_vs_flags
  check $? "2 GPUs: the DeepSpeed config (stage 1 + cpu offload) vs the equivalent flags"
else
  echo "SKIPPED the 2-GPU checks: this machine has $ngpu GPU"; skipped=$((skipped + 2))
fi

# 3. checkpoints with offload
rm -rf build/offload_ckpt
./train_gpt_cuda $M --fp32 $O --save build/offload_ckpt --exit-interval 10 > build/offload_resume_a.log 2>&1 &&
./train_gpt_cuda $M --fp32 $O --load build/offload_ckpt > build/offload_resume_b.log 2>&1 &&
cat build/offload_resume_a.log build/offload_resume_b.log > build/offload_resume.log &&
./tests/gpu/compare_logs build/offload_gpu_fp32.log build/offload_resume.log 0 offload_resume_with
check $? "saved and resumed with offload: the straight run's losses"
./train_gpt_cuda $M --fp32 --load build/offload_ckpt > build/offload_resume_c.log 2>&1 &&
cat build/offload_resume_a.log build/offload_resume_c.log > build/offload_resume2.log &&
./tests/gpu/compare_logs build/offload_gpu_fp32.log build/offload_resume2.log 1e-4 offload_resume_without
check $? "saved with offload, resumed without"

# 4. GPT-2 small: the device memory it frees, the time it costs
[ -f build/bench_text_document.idx ] || ./preprocess --input data/corpus.jsonl --output-prefix build/bench \
  --vocab-file data/gpt2-vocab.json --merge-file data/gpt2-merges.txt --append-eod --workers 8 > /dev/null 2>&1
G="--config configs/gpt_small.json --micro-batch-size 8 --global-batch-size 8 --train-iters 30 --lr 6e-4 \
 --lr-warmup-iters 5 --weight-decay 0.1 --log-interval 1 --hidden-dropout 0 --attention-dropout 0 --bf16 \
 --eval-interval 100000 --eval-iters 0 --split 949,50,1 --data-path build/bench_text_document \
 --vocab-file data/gpt2-vocab.json --merge-file data/gpt2-merges.txt"
plan=$(./train_gpt_cuda $G --dry-run | grep '^rank 0' | sed 's/.*optimizer \([0-9.]*\),.*/\1/')
./train_gpt_cuda $G > build/offload_gpt2_plain.log 2>&1; a=$?
./train_gpt_cuda $G $O > build/offload_gpt2.log 2>&1; b=$?
mem() { grep "GPU memory in use at the end" "$1" | head -n 1 | sed 's/.*end: \([0-9.]*\) GiB.*/\1/'; }
ms() { grep "^ iteration" "$1" | tail -n 10 | sed 's/.*elapsed time per iteration (ms): \([0-9.]*\).*/\1/' | awk '{ s += $1 } END { printf "%.1f", NR ? s / NR : -1 }'; }
ma=$(mem build/offload_gpt2_plain.log); mb=$(mem build/offload_gpt2.log)
printf "%-36s %14s %10s\n" "GPT-2 small, B=8, bf16, 1 GPU" "memory (GiB)" "ms/step" | tee build/offload_table.txt
printf "%-36s %14s %10s\n" "optimizer on the device" "$ma" "$(ms build/offload_gpt2_plain.log)" | tee -a build/offload_table.txt
printf "%-36s %14s %10s\n" "--optimizer-cpu-offload" "$mb" "$(ms build/offload_gpt2.log)" | tee -a build/offload_table.txt
echo "the plan's optimizer bytes on the device without offload: $plan MB" | tee -a build/offload_table.txt
[ $a -eq 0 ] && [ $b -eq 0 ] && awk -v a="$ma" -v b="$mb" -v p="$plan" \
  'BEGIN { saved = (a - b) * 1073741824 / 1e6; exit !(p > 0 && saved >= 0.9 * p) }'
check $? "GPT-2 small: offload frees at least 90% of the plan's optimizer bytes on the GPU"
[ "$skipped" -gt 0 ] && echo "$skipped skipped (not counted)"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]

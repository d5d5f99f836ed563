#!/bin/sh
# make test-gpu, part 2: 20 training steps on the GPU build against the CPU build.
# The same model, data, seed and layout; the losses must agree within the arithmetic's
# tolerance: fp32 1e-4, bf16 1e-2 (see compare_logs.c). Layouts: 1 GPU, TP=2, DP=2 (also with
# --overlap-grad-reduce: NCCL's buckets on the DP group's stream during the backward), PP=2 (its
# messages over NCCL send/recv: 1F1B, with evaluation's forward-only schedule, and interleaved); then
# checkpoint resume, recompute, the timeline and the CUDA graphs of the step against plain runs; and on
# 2 GPUs the tensor-parallel backward's overlapped collectives against the same run without overlap.
# Prints "N passed, N failed" at the end.
set -u
ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
export NCCL_NVLS_ENABLE=0
mkdir -p build
[ -f build/gpu_test_text_document.idx ] || ./preprocess --input data/corpus.jsonl --output-prefix build/gpu_test \
  --vocab-file data/gpt2-vocab.json --merge-file data/gpt2-merges.txt --append-eod --workers 4 > /dev/null 2>&1
M="--num-layers 4 --hidden-size 128 --num-attention-heads 4 --seq-length 64 --max-position-embeddings 64 \
 --micro-batch-size 4 --global-batch-size 8 --train-iters 20 --lr 1e-3 --lr-warmup-iters 5 --weight-decay 0.1 \
 --log-interval 1 --eval-interval 1000 --eval-iters 0 --split 949,50,1 --seed 1234 \
 --hidden-dropout 0 --attention-dropout 0 \
 --data-path build/gpu_test_text_document --vocab-file data/gpt2-vocab.json --merge-file data/gpt2-merges.txt"
passed=0; failed=0; skipped=0
# the CPU references first, all at once in the background (the GPU machine has cores to spare)
set -- "1gpu_fp32||--fp32" "1gpu_bf16||--bf16" \
  "tp2_fp32|--tensor-model-parallel-size 2 --nproc-per-node 2|--fp32 --tensor-model-parallel-size 2 --nproc-per-node 2" \
  "tp2_bf16|--tensor-model-parallel-size 2 --nproc-per-node 2|--bf16 --tensor-model-parallel-size 2 --nproc-per-node 2" \
  "dp2_fp32|--nproc-per-node 2|--fp32 --nproc-per-node 2" \
  "dp2_bf16|--nproc-per-node 2|--bf16 --nproc-per-node 2" \
  "pp2_fp32|--pipeline-model-parallel-size 2 --nproc-per-node 2|--fp32 --pipeline-model-parallel-size 2 --nproc-per-node 2" \
  "pp2_bf16_eval|--pipeline-model-parallel-size 2 --nproc-per-node 2 --eval-interval 5 --eval-iters 2|--bf16 --pipeline-model-parallel-size 2 --nproc-per-node 2 --eval-interval 5 --eval-iters 2" \
  "pp2_interleaved_fp32|--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 1 --nproc-per-node 2|--fp32 --pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 1 --nproc-per-node 2" \
  "dp2_distopt_fp32|--nproc-per-node 2 --use-distributed-optimizer|--fp32 --nproc-per-node 2 --use-distributed-optimizer" \
  "dp2_overlap_fp32|--nproc-per-node 2 --overlap-grad-reduce --ddp-bucket-size 300000|--fp32 --nproc-per-node 2 --overlap-grad-reduce --ddp-bucket-size 300000" \
  "dp2_distopt_overlap_bf16|--nproc-per-node 2 --use-distributed-optimizer --overlap-grad-reduce|--bf16 --nproc-per-node 2 --use-distributed-optimizer --overlap-grad-reduce"
for c in "$@"; do
  label=${c%%|*}; rest=${c#*|}; cpu=${rest%%|*}
  ./train_gpt $M $cpu > build/cpu_$label.log 2>&1 &
done
wait
for c in "$@"; do
  label=${c%%|*}; rest=${c#*|}; cpu=${rest%%|*}; gpu=${rest#*|}
  case $label in *bf16) rtol=1e-2 ;; *) rtol=1e-4 ;; esac
  # a check that cannot run here is SKIPPED: not a pass, and said so in the summary
  case $label in 1gpu*) ;; *) if [ "$ngpu" -lt 2 ]; then echo "SKIPPED $label: needs 2 GPUs, this machine has $ngpu"; skipped=$((skipped + 1)); continue; fi ;; esac
  grep -q "^ iteration" build/cpu_$label.log || { echo "CPU run $label failed"; tail -3 build/cpu_$label.log; failed=$((failed + 1)); continue; }
  ./train_gpt_cuda $M $gpu > build/gpu_$label.log 2>&1 || { echo "GPU run $label failed"; tail -5 build/gpu_$label.log; failed=$((failed + 1)); continue; }
  if ./tests/gpu/compare_logs build/cpu_$label.log build/gpu_$label.log $rtol $label; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
done
# a checkpoint on the GPU build: 10 steps, save, exit; a new process loads and does 10 more.
# The printed losses (7 digits) must equal the straight run's: tolerance 0 (the same kernels in the same order;
# tests/test_checkpoint.c checks bit-exactness of the parameters on the CPU build).
rm -rf build/gpu_ckpt
./train_gpt_cuda $M --fp32 --save build/gpu_ckpt --exit-interval 10 > build/gpu_resume_a.log 2>&1 &&
./train_gpt_cuda $M --fp32 --load build/gpu_ckpt > build/gpu_resume_b.log 2>&1 &&
cat build/gpu_resume_a.log build/gpu_resume_b.log > build/gpu_resume.log &&
./tests/gpu/compare_logs build/gpu_1gpu_fp32.log build/gpu_resume.log 0 resume_fp32 && passed=$((passed + 1)) || {
  echo "GPU checkpoint resume differs or failed"; tail -3 build/gpu_resume_b.log; failed=$((failed + 1)); }
# activation recompute on the GPU build: the same kernels on the same inputs in the same order
# (deterministic: no float atomics), so the losses must equal the run without it: tolerance 0
for rc in "full_uniform1|--recompute-granularity full --recompute-method uniform --recompute-num-layers 1" \
          "selective|--recompute-activations"; do
  label=${rc%%|*}; flags=${rc#*|}
  ./train_gpt_cuda $M --bf16 $flags > build/gpu_recompute_$label.log 2>&1 &&
  ./tests/gpu/compare_logs build/gpu_1gpu_bf16.log build/gpu_recompute_$label.log 0 recompute_$label && passed=$((passed + 1)) || {
    echo "GPU recompute $label differs or failed"; tail -3 build/gpu_recompute_$label.log; failed=$((failed + 1)); }
done
# the timeline on the GPU build (issue 12): spans timed by CUDA events, no synchronisation per
# span, so the losses equal the run without it (tolerance 0) and the spans add up to the step
./train_gpt_cuda $M --bf16 --timeline build/gpu_timeline.json --profile-step-start 4 --profile-step-end 6 \
  > build/gpu_timeline.log 2>&1 &&
./tests/gpu/compare_logs build/gpu_1gpu_bf16.log build/gpu_timeline.log 0 timeline_losses &&
python3 tests/gpu/check_timeline.py build/gpu_timeline.json build/gpu_timeline.log 2 2 && passed=$((passed + 1)) || {
  echo "GPU timeline check failed"; tail -3 build/gpu_timeline.log; failed=$((failed + 1)); }
# the step's chunks as CUDA graphs (megatron.h section 8, on by default): a replay runs the same
# kernels with the same arguments as the chunk queued op by op, so every loss equals the run with
# MT_CUDA_GRAPH=0 (tolerance 0): bf16 with evaluation every 5 steps (its forward recorded too; the
# validation lines must be equal as well), and fp16, whose dynamic loss scale moves in the first
# steps (each new scale records the backward again)
for gc in "bf16_eval|--bf16 --eval-interval 5 --eval-iters 3" "fp16|--fp16"; do
  label=${gc%%|*}; flags=${gc#*|}
  ./train_gpt_cuda $M $flags > build/gpu_graph_$label.log 2>&1 &&
  MT_CUDA_GRAPH=0 ./train_gpt_cuda $M $flags > build/gpu_nograph_$label.log 2>&1 &&
  ./tests/gpu/compare_logs build/gpu_nograph_$label.log build/gpu_graph_$label.log 0 graph_$label &&
  [ "$(grep 'validation loss' build/gpu_graph_$label.log)" = "$(grep 'validation loss' build/gpu_nograph_$label.log)" ] &&
  passed=$((passed + 1)) || {
    echo "GPU graph $label differs or failed"; tail -3 build/gpu_graph_$label.log; failed=$((failed + 1)); }
done
# the tensor-parallel backward's collectives started beside its weight gradients (the default, Megatron's
# async TP all-reduce: megatron.h section 4) against --no-async-tensor-model-parallel-allreduce: the same
# kernels and the same sums in another order on two streams, so the same losses (tolerance 0); with
# --sequence-parallel too (the all-gather of X beside dX, the reduce-scatter of dX beside dW)
for ac in "tp2_bf16|--bf16 --tensor-model-parallel-size 2 --nproc-per-node 2" \
          "tp2_sp_bf16|--bf16 --tensor-model-parallel-size 2 --nproc-per-node 2 --sequence-parallel"; do
  label=${ac%%|*}; flags=${ac#*|}
  if [ "$ngpu" -lt 2 ]; then echo "SKIPPED async_$label: needs 2 GPUs, this machine has $ngpu"; skipped=$((skipped + 1)); continue; fi
  ./train_gpt_cuda $M $flags > build/gpu_async_$label.log 2>&1 &&
  ./train_gpt_cuda $M $flags --no-async-tensor-model-parallel-allreduce > build/gpu_sync_$label.log 2>&1 &&
  ./tests/gpu/compare_logs build/gpu_sync_$label.log build/gpu_async_$label.log 0 async_$label && passed=$((passed + 1)) || {
    echo "GPU async TP $label differs or failed"; tail -3 build/gpu_async_$label.log; failed=$((failed + 1)); }
done
[ "$skipped" -eq 0 ] || echo "$skipped checks SKIPPED for want of a second GPU (run make test-gpu on 2 GPUs for them)"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]

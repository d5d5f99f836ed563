#!/bin/sh
# make bench (on the GPU machine), everything measured in this one run on this GPU:
#   1. the GEMMs at GPT-2 small's shapes (B*T = 16k), ours (wgmma, bf16 operands, fp32 out) next to
#      cuBLAS's (tests/gpu/test_gemm_wgmma links cuBLAS for this comparison only), with the ratio;
#   2. causal attention at B x 12 heads x 1024 x 64, bf16: ours (tests/gpu/test_kernels --bench-only)
#      next to PyTorch's scaled_dot_product_attention with the flash and the cuDNN backends, timed
#      from a CUDA graph (the GPU's time without Python's launch overhead; the call-by-call times
#      beside them as *_eager_ms); 2b, from the same run of test_kernels: the bytes-bound kernels'
#      GB/s, each against a device-to-device copy of the same bytes;
#   3. the whole step, GPT-2 small (124M) in bf16 on the bundled corpus: ours on 1 GPU, and on 2 GPUs
#      as TP=2, DP=2 (also with --overlap-grad-reduce) and PP=2 when two are there; next to a PyTorch
#      GPT-2 small step (bf16 autocast, fused AdamW, SDPA) compiled and eager (tests/gpu/torch_ref.py),
#      trained on the same corpus with the same initialisation and learning-rate schedule: tokens/s,
#      ms/step, MFU, memory.
# MFU = tokens/s x (6N + 12 L C T) / (989.4e12 x GPUs)  (H200 dense bf16 peak, Megatron's FLOPs).
# Where PyTorch is missing the PyTorch rows say so. The tables go to build/bench_*.txt too.
set -u
export NCCL_NVLS_ENABLE=0
mkdir -p build
ITERS=${ITERS:-40}
MB=${MB:-16}
ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
[ -f build/bench_text_document.idx ] || ./preprocess --input data/corpus.jsonl --output-prefix build/bench \
  --vocab-file data/gpt2-vocab.json --merge-file data/gpt2-merges.txt --append-eod --workers 8 > /dev/null 2>&1
G="--config configs/gpt_small.json --bf16 --micro-batch-size $MB --train-iters $ITERS --lr 6e-4 --min-lr 6e-5 \
 --lr-decay-style cosine --lr-warmup-iters 10 --weight-decay 0.1 --clip-grad 1.0 --log-interval 10 \
 --hidden-dropout 0 --attention-dropout 0 \
 --eval-interval 100000 --eval-iters 0 --split 949,50,1 --data-path build/bench_text_document \
 --vocab-file data/gpt2-vocab.json --merge-file data/gpt2-merges.txt"
run() {   # tag (file name), label, gpus, flags
  tag=$1; label=$2; gpus=$3; shift 3
  if [ "$gpus" -gt "$ngpu" ]; then echo "$label: needs $gpus GPUs, have $ngpu" >> build/bench_table.txt; return; fi
  echo "./train_gpt_cuda $G $*" > build/bench_$tag.log
  ./train_gpt_cuda $G "$@" >> build/bench_$tag.log 2>&1
  last=$(grep "^ iteration" build/bench_$tag.log | tail -n 1)
  if [ -z "$last" ]; then echo "$label: no iteration line (see build/bench_$tag.log)" >> build/bench_table.txt; tail -5 build/bench_$tag.log; return; fi
  ms=$(echo "$last" | sed 's/.*elapsed time per iteration (ms): \([0-9.]*\).*/\1/')
  tps=$(echo "$last" | sed 's/.*tokens per second: \([0-9.]*\).*/\1/')
  loss=$(echo "$last" | sed 's/.*lm loss: \([0-9.E+-]*\).*/\1/')
  mem=$(grep "GPU memory in use at the end" build/bench_$tag.log | sed 's/.*end: \([0-9.]*\) GiB.*/\1/' | sort -n | tail -n 1)
  mfu=$(awk -v t="$tps" -v g="$gpus" 'BEGIN { printf "%.1f", 100 * t * 860.1e6 / (989.4e12 * g) }')
  printf "%-22s %5s %10s %12s %7s%% %12s %10s\n" "$label" "$gpus" "$ms" "$tps" "$mfu" "$mem" "$loss" >> build/bench_table.txt
}
PY=${PYTHON:-python3}
torch_ok=0; $PY -c "import torch; assert torch.cuda.is_available()" > /dev/null 2>&1 && torch_ok=1

echo "== 1. GEMMs, ours against cuBLAS (tests/gpu/test_gemm_wgmma)"
if [ -x tests/gpu/test_gemm_wgmma ]; then
  ./tests/gpu/test_gemm_wgmma > build/bench_gemm.log 2>&1
  sed -n '/^GEMM /,/^ *$/p' build/bench_gemm.log | tee build/bench_gemm.txt
else echo "tests/gpu/test_gemm_wgmma not built (make tests/gpu/test_gemm_wgmma)"; fi

echo "== 2. attention, causal, B=$MB x 12 heads x T=1024 x 64, bf16"
if [ -x tests/gpu/test_kernels ]; then
  ./tests/gpu/test_kernels --bench-only > build/bench_kernels.log 2>&1
  grep -E "attention bf16 (forward|backward|fwd\+bwd)" build/bench_kernels.log | sed 's/^ */ours: /' | tee build/bench_attention.txt
else echo "tests/gpu/test_kernels not built"; fi
if [ -f build/bench_kernels.log ]; then
  # the issue's bytes-bound list (>= 80% of the 4.2 TB/s copy): the short ones as a training step's CUDA
  # graph runs them, each beside a device-to-device copy of its bytes timed the same way; AdamW and the
  # cross-entropy (GBs a launch) as timed alone
  echo "== 2b. the bytes-bound kernels"
  grep -E "^  graph:|^  adamw|cross-entropy fused|cross-entropy finish \(\+dlogits\), bf16" build/bench_kernels.log | \
    tee build/bench_bytes.txt
fi
if [ $torch_ok = 1 ]; then $PY tests/gpu/torch_ref.py attention --micro-batch $MB 2>&1 | tee -a build/bench_attention.txt
else echo "PyTorch's SDPA: not measured (no torch with CUDA for $PY)" | tee -a build/bench_attention.txt; fi

echo "== 3. the training step"
printf "%-22s %5s %10s %12s %8s %12s %10s\n" "run (GPT-2 small bf16)" "GPUs" "ms/step" "tokens/s" "MFU" "GiB/GPU" "lm loss" > build/bench_table.txt
run 1gpu "1 GPU, B=$MB" 1 --global-batch-size $MB
run tp2 "TP=2, B=$MB" 2 --tensor-model-parallel-size 2 --nproc-per-node 2 --global-batch-size $MB
run dp2 "DP=2, B=$MB/GPU" 2 --nproc-per-node 2 --global-batch-size $((2 * MB))
# the same with the gradients' buckets all-reduced during the backward (the step then runs op by op:
# megatron.h section 8 records no CUDA graph of a chunk whose buckets start inside it)
run dp2o "DP=2, overlap-grad" 2 --nproc-per-node 2 --global-batch-size $((2 * MB)) --overlap-grad-reduce
# PP=2: 1F1B over 8 micro-batches of MB/2 (the bubble (p-1)/(m+p-1) = 1/9 of the step)
run pp2 "PP=2, 8 x B=$((MB / 2))" 2 --pipeline-model-parallel-size 2 --nproc-per-node 2 \
  --micro-batch-size $((MB / 2)) --global-batch-size $((4 * MB))
notes=""
if [ $torch_ok = 1 ]; then
  for mode in compiled eager; do
    flag=""; [ $mode = eager ] && flag=--eager
    line=$($PY tests/gpu/torch_ref.py step --micro-batch $MB --train-iters $ITERS --data-path build/bench_text_document \
      $flag 2> build/bench_torch_$mode.log |
      grep '^torch_step')
    if [ -z "$line" ]; then echo "PyTorch $mode: failed (see build/bench_torch_$mode.log)" >> build/bench_table.txt; continue; fi
    ms=$(echo "$line" | sed 's/.* ms \([0-9.]*\).*/\1/'); tps=$(echo "$line" | sed 's/.*tokens_per_s \([0-9]*\).*/\1/')
    gib=$(echo "$line" | sed 's/.*peak_reserved_gib \([0-9.]*\).*/\1/')
    mfu=$(awk -v t="$tps" 'BEGIN { printf "%.1f", 100 * t * 860.1e6 / 989.4e12 }')
    printf "%-22s %5s %10s %12s %7s%% %12s %10s\n" "PyTorch $mode, B=$MB" 1 "$ms" "$tps" "$mfu" "$gib (res.)" "-" >> build/bench_table.txt
    med=$(echo "$line" | sed 's/.*median_ms \([0-9.]*\).*/\1/')
    notes="$notes
PyTorch $mode: ms/step is the mean of iterations $((ITERS - 9))-$ITERS run back to back, as ours (the last log
  line of $ITERS at --log-interval 10); the median of 20 steps each synchronised alone: $med ms"
  done
else echo "PyTorch step: not measured (no torch with CUDA for $PY)" >> build/bench_table.txt; fi
[ -n "$notes" ] && echo "$notes" >> build/bench_table.txt
cat build/bench_table.txt

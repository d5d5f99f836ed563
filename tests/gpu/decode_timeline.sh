#!/bin/sh
# A decode step kernel by kernel, as the GPU ran it (issue 13): each kernel's link (its end minus the
# end of the kernel before it; a step's links add up to its period), from CUPTI's records of every
# kernel, through tests/gpu/libkernel_timeline.so injected into the program (the product links no
# CUPTI). GPT-2 small with random weights, greedy, 256 new tokens after 16, batch 1 then 8.
#   make train_gpt train_gpt_cuda tests/gpu/libkernel_timeline.so
#   sh tests/gpu/decode_timeline.sh [BINARY]        (default ./train_gpt_cuda)
# Writes build/timeline_b{1,8}.csv (every kernel) and .csv.txt (the decode steps' tables), and prints
# the tables. Needs python3 with torch and transformers (to make the model, as decode_ab.sh).
set -u
BIN=${1:-./train_gpt_cuda}
export NCCL_NVLS_ENABLE=0
. tests/gpu/decode_model.sh   # $D: the model and the prompts
# CUPTI's library: beside the toolkit's, or PyTorch's wheel's
for dir in /usr/local/cuda/lib64 /usr/local/cuda/extras/CUPTI/lib64 \
           $(python3 -c "import nvidia.cuda_cupti, os; print(os.path.join(nvidia.cuda_cupti.__path__[0], 'lib'))" 2>/dev/null); do
  [ -d "$dir" ] && LD_LIBRARY_PATH=$dir:${LD_LIBRARY_PATH:-}
done
export LD_LIBRARY_PATH
for B in 1 8; do
  new=256; [ $B -eq 8 ] && new=128
  CUDA_INJECTION64_PATH=$PWD/tests/gpu/libkernel_timeline.so MT_TIMELINE=build/timeline_b$B.csv \
    $BIN --bf16 --load $D/gpt2_ck --sample-input-file $D/prompts$B.txt --micro-batch-size $B --greedy --ignore-eos \
    --out-seq-length $new --sample-output-file build/timeline_b$B.jsonl > build/timeline_b$B.log 2>&1 \
    || { echo "FAILED batch $B: $(tail -n 2 build/timeline_b$B.log)"; continue; }
  echo "== batch $B: $(grep 'per-token latency' build/timeline_b$B.log)"
  cat build/timeline_b$B.csv.txt 2>/dev/null || echo "no summary: $(grep kernel_timeline build/timeline_b$B.log)"
done

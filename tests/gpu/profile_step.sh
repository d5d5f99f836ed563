#!/bin/sh
# Where one training step goes, kernel by kernel (on the GPU machine; ncu is there).
#   sh tests/gpu/profile_step.sh [extra train_gpt_cuda flags]      (BIN=other/train_gpt_cuda: another build;
#                                                                   DETAIL=REGEX: see the end)
# Runs GPT-2 small (bf16, B=16, T=1024) for 2 iterations under Nsight Compute, collecting only each
# kernel's duration and DRAM bytes, then tests/gpu/profile_summary.py keeps the second iteration
# (the kernels after the first optimizer step) and prints, per kernel name: launches, total ms,
# share of the step, GB moved and GB/s (against the 4.8 TB/s HBM3e peak; about 4.2 TB/s is what a
# copy reaches). ncu serialises kernels and flushes caches between them: totals read higher than
# the real step (compare with MT_PROFILE=1 or the iteration line), the ranking is what matters.
# REAL=1: clocks and caches as the real run leaves them (ncu's --clock-control none --cache-control
# none): the kernels' summed time then compares with the iteration line, and the difference is the
# time the GPU waits between kernels (launch gaps, host work).
set -u
export NCCL_NVLS_ENABLE=0
out=${OUT:-build}
mkdir -p build "$out"
[ -f build/bench_text_document.idx ] || ./preprocess --input data/corpus.jsonl --output-prefix build/bench \
  --vocab-file data/gpt2-vocab.json --merge-file data/gpt2-merges.txt --append-eod --workers 8 > /dev/null 2>&1
G="--config configs/gpt_small.json --bf16 --micro-batch-size 16 --global-batch-size 16 --train-iters 2 --lr 6e-4
 --hidden-dropout 0 --attention-dropout 0 --log-interval 1 --eval-interval 100000 --eval-iters 0 --split 949,50,1
 --data-path build/bench_text_document --vocab-file data/gpt2-vocab.json --merge-file data/gpt2-merges.txt"
real=""
[ "${REAL:-0}" = 1 ] && real="--clock-control none --cache-control none"
ncu $real --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum --csv --page raw \
  --log-file "$out/ncu.log" ${BIN:-./train_gpt_cuda} $G "$@" > "$out/ncu_run.log" 2>&1
# --log-file puts the CSV among ncu's own lines: keep the lines that start with a quote
grep '^"' "$out/ncu.log" > "$out/ncu.csv"
python3 tests/gpu/profile_summary.py "$out/ncu.csv" | tee "$out/profile.txt"
# DETAIL=REGEX: then the kernels whose names match REGEX, 6 launches of each from iteration 2
# (one iteration's worth of launches skipped), under ncu's speed-of-light, occupancy, warp-state
# and launch sections: why a kernel takes its time (the limiter, registers, stalls).
if [ -n "${DETAIL:-}" ]; then
  ncu --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats \
    --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    -k "regex:$DETAIL" --launch-skip ${DETAIL_SKIP:-40} --launch-count ${DETAIL_COUNT:-6} \
    ${BIN:-./train_gpt_cuda} $G "$@" > "$out/ncu_detail.txt" 2>&1
  grep -E "^  [a-z_]+.*\(|Duration|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|Registers Per|Achieved Occupancy|Theoretical Occupancy|Block Limit|Warp Cycles Per Issued|Issue Slots Busy|Executed Ipc A|L1/TEX Hit|Shared Memory Configuration|Dynamic Shared|Stall|One or More" \
    "$out/ncu_detail.txt" | tee "$out/profile_detail.txt"
fi

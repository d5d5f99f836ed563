#!/bin/sh
# Where one decoding step goes (issue 13), on the GPU machine (ncu and transformers are there):
#   sh tests/gpu/profile_decode.sh [batch]
# GPT-2 small with random weights (transformers' GPT2Config(), imported with --import-hf), bf16,
# greedy, a 16-token prompt. Three runs: the timed one (256 new tokens, CUDA graph: the report's
# tokens/s), MT_PROFILE=1 with the graph off (each op synchronised: the op table), and Nsight
# Compute over 16 new tokens with the graph off (each kernel's duration and DRAM bytes; ncu
# serialises kernels). The summary: per kernel name, launches per token, us per token, GB/s.
# ONE_KERNEL=1 sh tests/gpu/profile_decode.sh: also the one-kernel decode step under ncu (the end).
set -u
B=${1:-1}
out=${OUT:-build}
D=build/prof_decode
mkdir -p $D "$out"
[ -f $D/gpt2_ck/latest_checkpointed_iteration.txt ] || {
  python3 tests/gpu/generate_ref.py make-gpt2 $D/gpt2 > /dev/null && ./train_gpt --import-hf $D/gpt2 --save $D/gpt2_ck > /dev/null; }
python3 -c "
import numpy as np
ids = np.random.default_rng(5).integers(0, 50000, ($B, 16))
open('$D/prompts.txt', 'w').write(''.join(' '.join(map(str, r)) + '\n' for r in ids))"
G="--bf16 --load $D/gpt2_ck --sample-input-file $D/prompts.txt --micro-batch-size $B --greedy --ignore-eos"
./train_gpt_cuda $G --out-seq-length 256 --sample-output-file $D/timed.jsonl > "$out/decode_timed.log" 2>&1
grep -A6 "generation report" "$out/decode_timed.log"
MT_CUDA_GRAPH=0 ./train_gpt_cuda $G --out-seq-length 256 --sample-output-file $D/nograph.jsonl > "$out/decode_nograph.log" 2>&1
grep "tokens/s" "$out/decode_nograph.log"
MT_PROFILE=1 MT_CUDA_GRAPH=0 ./train_gpt_cuda $G --out-seq-length 64 --sample-output-file $D/prof.jsonl > "$out/decode_profile.log" 2>&1
grep -A40 "MT_PROFILE" "$out/decode_profile.log" | head -45
MT_CUDA_GRAPH=0 ncu --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum --csv --page raw \
  ./train_gpt_cuda $G --out-seq-length 17 --sample-output-file $D/ncu.jsonl > "$out/decode_ncu_run.log" 2>&1
grep '^"' "$out/decode_ncu_run.log" > "$out/decode_ncu.csv"
python3 - "$out/decode_ncu.csv" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
head, units = rows[0], rows[1]
ni, ti = head.index("Kernel Name"), head.index("gpu__time_duration.sum")
ri, wi = head.index("dram__bytes_read.sum"), head.index("dram__bytes_write.sum")
sc = lambda u: {"nsecond": 1, "usecond": 1e3, "msecond": 1e6, "byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}.get(u, 1)
data = [r for r in rows[2:] if len(r) == len(head)]
# the decode steps: the last 16 tokens' kernels are the second half of the run minus the prefill;
# count by the attention-over-cache kernels (the prefill's, then decoding's split one, or at batch 1 the qkv +
# attention kernel): a launch a layer
names = [r[ni].split("(")[0].split("<")[0].replace("void ", "").strip() for r in data]
cached = [i for i, n in enumerate(names) if "cached_forward" in n or "decode_split" in n or "qkv_attention_decode" in n]
L = 12
first = cached[L] if len(cached) > L else 0   # skip the prefill's 12 launches
step = list(range(first, len(data)))
tokens = (len(cached) - L) / L
# a run that died (or has no decode steps) has nothing to divide by: say so, and where to look
bad = [r for r in data if "nan" in (r[ti], r[ri], r[wi])]
if tokens < 1 or bad:
    why = f"{len(bad)} kernel(s) with no measurement (a failed launch)" if bad else f"{len(cached)} attention launches"
    print(f"decode profile: no complete decode step under ncu ({why}); see decode_ncu_run.log beside the CSV")
    sys.exit(1)
tot = {}
for i in step:
    r = data[i]
    t = float(r[ti].replace(",", "")) * sc(units[ti]) / 1e3
    by = float(r[ri].replace(",", "")) * sc(units[ri]) + float(r[wi].replace(",", "")) * sc(units[wi])
    c = tot.setdefault(names[i], [0, 0.0, 0.0]); c[0] += 1; c[1] += t; c[2] += by
allus = sum(c[1] for c in tot.values())
print(f"decode: {tokens:.0f} tokens, {len(step)/tokens:.0f} kernels per token, {allus/tokens:.1f} us of kernel time per token")
for n, c in sorted(tot.items(), key=lambda kv: -kv[1][1]):
    print(f"{n:52s} {c[0]/tokens:6.1f} {c[1]/tokens:9.1f} us {c[2]/max(c[1],1e-9)/1e3:8.0f} GB/s")
PY
# ONE_KERNEL=1: then the decode step as one kernel (MT_DECODE_ONE_KERNEL=1, kernels.cuh) under ncu's
# warp-state, source-counter, memory and launch sections, two of its launches after the prefill:
# what its warps wait on between the barriers (docs/perf.md: the phases run 3-5x slower than the
# same work as separate kernels)
if [ "${ONE_KERNEL:-0}" = 1 ]; then
  MT_DECODE_ONE_KERNEL=1 ncu --kernel-name regex:mt_decode_step_kernel --launch-skip 2 --launch-count 2 \
    --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats \
    --section MemoryWorkloadAnalysis --section SourceCounters \
    ./train_gpt_cuda $G --out-seq-length 8 --sample-output-file $D/one.jsonl > "$out/decode_one_kernel_ncu.txt" 2>&1
  grep -E "Duration|Registers|Achieved Occupancy|Stall|Warp Cycles|L1/TEX Hit|L2 Hit|Local|Shared Memory Configuration|Dynamic Shared" \
    "$out/decode_one_kernel_ncu.txt" | head -60
fi

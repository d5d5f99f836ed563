#!/bin/sh
# Generation on the GPU (issue 13), on the device machine, after
#   make train_gpt train_gpt_cuda tests/test_generate tests/gpu/test_generate_cuda
# (transformers and torch must be importable by $PYTHON). About 4 minutes on one H200.
#   1. logits: the GPU build's decoding (one token per step through the KV cache, as a CUDA graph,
#      and the prefill) against the CPU build, on a random GPT-2 saved by transformers: fp32 within
#      1e-4 (other summation orders), bf16 within 3e-2 (the prefill's bf16 GEMMs)
#   2. a random GPT2LMHeadModel saved with save_pretrained, imported with --import-hf: our greedy
#      continuation (CPU build, and GPU build in fp32) is transformers', token for token; the tokens
#      drawn on the device (temperature, top-k, top-p) are the ones the host draws from the same logits
#   2b. Megatron's own forms: examples/generate_text.sh's (--genfile, --fp16, --recompute) and the
#      interactive prompt on a terminal (under script(1))
#   3. the benchmark: GPT-2 small (random weights) in bf16, greedy, 256 new tokens after a 16-token
#      prompt, batch 1 and 8: ours against transformers eager and compiled with a static cache;
#      the table goes to build/gen_gpu/table.md
# Prints "N passed, N failed" at the end.
set -u
PYTHON=${PYTHON:-python3}
export NCCL_NVLS_ENABLE=0
D=build/gen_gpu
rm -rf $D; mkdir -p $D
passed=0; failed=0
count() {   # the OK / NOT OK lines of a step's output
  printf '%s\n' "$1"
  p=$(printf '%s\n' "$1" | grep -c '^OK ' || true); f=$(printf '%s\n' "$1" | grep -c '^NOT OK' || true)
  passed=$((passed + p)); failed=$((failed + f))
}
fail() { echo "NOT OK $1"; failed=$((failed + 1)); }

# 1. logits, GPU against CPU
$PYTHON tests/gpu/generate_ref.py make-small $D/small || fail "transformers could not make the small model"
./tests/test_generate --hf-logits $D/small $D/small/tokens.bin $D/cpu.bin 1 > $D/cpu.log 2>&1 || fail "CPU logits"
./tests/gpu/test_generate_cuda --hf-logits $D/small $D/small/tokens.bin $D/gpu_fp32.bin 1 > $D/gpu_fp32.log 2>&1 \
  || fail "GPU fp32 logits (see $D/gpu_fp32.log)"
./tests/gpu/test_generate_cuda --hf-logits $D/small $D/small/tokens.bin $D/gpu_bf16.bin 1 bf16 > $D/gpu_bf16.log 2>&1 \
  || fail "GPU bf16 logits (see $D/gpu_bf16.log)"
count "$($PYTHON tests/gpu/generate_ref.py compare $D/gpu_fp32.bin $D/cpu.bin 1e-4 'GPU fp32 decode + prefill vs CPU')"
count "$($PYTHON tests/gpu/generate_ref.py compare $D/gpu_bf16.bin $D/cpu.bin 3e-2 'GPU bf16 decode + prefill vs CPU')"
if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then   # tensor-parallel decoding on 2 GPUs (NCCL all-gather, no graph)
  ./tests/gpu/test_generate_cuda --hf-logits $D/small $D/small/tokens.bin $D/gpu_tp2.bin 2 > $D/gpu_tp2.log 2>&1 \
    || fail "GPU TP=2 logits (see $D/gpu_tp2.log)"
  count "$($PYTHON tests/gpu/generate_ref.py compare $D/gpu_tp2.bin $D/cpu.bin 1e-4 'GPU TP=2 fp32 vs CPU')"
fi

# 2. transformers' greedy continuation, token for token (fp32)
./train_gpt --import-hf $D/small --save $D/small_ck > $D/import.log 2>&1 || fail "--import-hf (see $D/import.log)"
G="--load $D/small_ck --prompt \"$(cat $D/small/prompt.txt)\" --greedy --out-seq-length 32 --ignore-eos"
eval ./train_gpt $G --sample-output-file $D/cpu_greedy.jsonl > $D/cpu_greedy.log 2>&1 || fail "CPU generation"
eval ./train_gpt_cuda $G --sample-output-file $D/gpu_greedy.jsonl > $D/gpu_greedy.log 2>&1 || fail "GPU generation"
count "$($PYTHON tests/gpu/generate_ref.py tokens $D/cpu_greedy.jsonl $D/small 'CPU build')"
count "$($PYTHON tests/gpu/generate_ref.py tokens $D/gpu_greedy.jsonl $D/small 'GPU build, fp32')"
# the draws on the device (mt_sample_rows, in the decode step's graph) against the host's from the
# same logits (a request that asks for them): the same tokens, fp32 and bf16, four draws, batch 1 and 3.
# (Not against the CPU build: the logits differ there by ~1e-6, and with a nearly flat distribution the
# rank order of neighbouring candidates, which top-p and the draw walk, changes with them.)
count "$(./tests/gpu/test_generate_cuda --draw-check $D/small 2>&1 | grep -E '^(OK|NOT OK|  first)')"
count "$(./tests/gpu/test_generate_cuda --draw-check $D/small bf16 2>&1 | grep -E '^(OK|NOT OK|  first)')"
if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then   # at TP=2 every rank picks from the gathered rows
  count "$(./tests/gpu/test_generate_cuda --draw-check $D/small fp32 2 2>&1 | grep -E '^(OK|NOT OK|  first)')"
else
  echo "SKIPPED the device's draws at TP=2: one GPU"
fi

# Megatron's own forms on the GPU build: examples/generate_text.sh's (unconditional samples into
# --genfile, --fp16, --recompute accepted), and the interactive prompt on a terminal (script(1)
# gives the program one; prompts as token ids: no --vocab-file)
./train_gpt_cuda --load $D/small_ck --fp16 --micro-batch-size 2 --out-seq-length 24 --temperature 1.0 --top_p 0.9 \
  --genfile $D/unconditional_samples.json --num-samples 2 --recompute > $D/genfile.log 2>&1 \
  || fail "examples/generate_text.sh's form (see $D/genfile.log)"
n=$($PYTHON -c "
import json, sys
print(sum(1 for l in open(sys.argv[1]) if {'text', 'length', 'finished'} <= set(json.loads(l))))" \
  $D/unconditional_samples.json 2>/dev/null || echo 0)
if [ "$n" = 2 ]; then echo "OK examples/generate_text.sh's form: 2 unconditional samples in --genfile"
  passed=$((passed + 1)); else fail "--genfile holds $n of 2 samples (see $D/genfile.log)"; fi
if command -v script > /dev/null 2>&1; then
  printf '5 6 7\n\n8 9\nstop\n' | script -qec "./train_gpt_cuda --bf16 --load $D/small_ck --out-seq-length 8 --greedy" \
    /dev/null > $D/tty.log 2>&1
  if grep -q -- "----- sample 2 (2 prompt tokens, 8 generated)" $D/tty.log && grep -q "Prompt should not be empty" $D/tty.log \
     && grep -q "2 sequences in 2 batches" $D/tty.log; then
    echo "OK the interactive prompt on a terminal: 2 prompts, an empty line asked again, stop"; passed=$((passed + 1))
  else fail "the interactive prompt (see $D/tty.log)"; fi
else
  echo "SKIPPED the interactive prompt: no script(1) to give the program a terminal"
fi

# 3. the benchmark
$PYTHON tests/gpu/generate_ref.py make-gpt2 $D/gpt2 && ./train_gpt --import-hf $D/gpt2 --save $D/gpt2_ck > /dev/null 2>&1 \
  || fail "GPT-2 small for the benchmark"
$PYTHON -c "
import numpy as np
ids = np.random.default_rng(5).integers(0, 50000, (8, 16))
for B in (1, 8):
    open('$D/prompts_%d.txt' % B, 'w').write(''.join(' '.join(map(str, r)) + '\n' for r in ids[:B]))"
for B in 1 8; do
  ./train_gpt_cuda --bf16 --load $D/gpt2_ck --sample-input-file $D/prompts_$B.txt --micro-batch-size $B --greedy \
    --out-seq-length 256 --ignore-eos --sample-output-file $D/ours_$B.jsonl > $D/ours_$B.log 2>&1 \
    || fail "our benchmark run at batch $B (see $D/ours_$B.log)"
  grep -A6 "generation report" $D/ours_$B.log
  # the tutorial's draw instead of greedy: the same step, the tokens drawn on the device (reported)
  ./train_gpt_cuda --bf16 --load $D/gpt2_ck --sample-input-file $D/prompts_$B.txt --micro-batch-size $B \
    --temperature 0.9 --top_p 0.95 --out-seq-length 256 --ignore-eos --sample-output-file $D/topp_$B.jsonl \
    > $D/topp_$B.log 2>&1 || fail "the top-p run at batch $B (see $D/topp_$B.log)"
  grep "tokens/s\|per-token latency" $D/topp_$B.log | sed 's/^/  temperature 0.9, top-p 0.95: /'
  # the decode step as one kernel (MT_DECODE_ONE_KERNEL=1, kernels.cuh): it runs a whole generation, and its
  # speed. (Its bits are test_kernels' decode_step_one_kernel's business: equal to the op-by-op step with the
  # unsplit attention over the cache. The default step splits that attention over the cache, another
  # summation order, so whole generations are not compared token for token.)
  MT_DECODE_ONE_KERNEL=1 ./train_gpt_cuda --bf16 --load $D/gpt2_ck --sample-input-file $D/prompts_$B.txt \
    --micro-batch-size $B --greedy --out-seq-length 256 --ignore-eos --sample-output-file $D/one_$B.jsonl \
    > $D/one_$B.log 2>&1 || fail "the one-kernel decode step at batch $B (see $D/one_$B.log)"
  n=$($PYTHON -c "import json, sys; print(sum(len(json.loads(l)['tokens']) == 256 for l in open(sys.argv[1])))" \
      $D/one_$B.jsonl 2>/dev/null || echo 0)
  if [ "$n" = "$B" ]; then echo "OK the one-kernel decode step: $B sequence(s) of 256 new tokens"
    passed=$((passed + 1)); else fail "the one-kernel decode step wrote $n of $B full sequences (see $D/one_$B.log)"; fi
  grep "per-token latency" $D/one_$B.log | sed 's/^/  one kernel: /'
  $PYTHON tests/gpu/generate_ref.py bench $D/gpt2 $B 256 $D/hf.jsonl
done
$PYTHON - "$D" <<'PY' > $D/table.md
import json, re, sys
d = sys.argv[1]
hf = {r["batch"]: r for r in map(json.loads, open(f"{d}/hf.jsonl"))}
print("| batch | ours tokens/s | TTFT ms | launch to first token s | memory GiB | transformers eager tokens/s | TTFT ms | memory GiB | compiled (static cache) tokens/s | TTFT ms | memory GiB | ours / compiled |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for B in (1, 8):
    log = open(f"{d}/ours_{B}.log").read()
    num = lambda pat: float(m.group(1)) if (m := re.search(pat, log)) else float("nan")
    tps, ttft = num(r"tokens/s: ([0-9.]+) total"), num(r"time to first token: ([0-9.]+) ms")
    launch, mem = num(r"launch to first token ([0-9.]+) s"), num(r"memory: ([0-9.]+) GiB")
    cells = [f"{tps:.0f}", f"{ttft:.1f}", f"{launch:.2f}", f"{mem:.2f}"]
    for mode in ("eager", "compiled"):
        r = hf.get(B, {}).get(mode, {})
        cells += [f"{r['tokens_per_s']:.0f}", f"{r['ttft_ms']:.1f}", f"{r['memory_gib']:.2f}"] if "tokens_per_s" in r else ["n/a"] * 3
    c = hf.get(B, {}).get("compiled", {})
    cells.append(f"{tps / c['tokens_per_s']:.1f}x" if "tokens_per_s" in c else "n/a")
    print(f"| {B} | " + " | ".join(cells) + " |")
print()
print("ours: GPU memory in use (cudaMemGetInfo, CUDA context included); transformers: torch.cuda.max_memory_allocated")
PY
cat $D/table.md
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]

#!/bin/sh
# make test-ref: the outside references, each ending with "N passed, N failed"; prints the sum.
passed=0; failed=0; status=0
run() {
  echo "== $*"
  out=$("$@" 2>&1); rc=$?
  printf '%s\n' "$out" | tail -n 30
  line=$(printf '%s\n' "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed$' | tail -n 1)
  if [ -z "$line" ]; then echo "did not finish (exit $rc)"; failed=$((failed + 1)); status=1; return; fi
  p=${line%% passed*}; f=${line#*, }; f=${f%% failed*}
  passed=$((passed + p)); failed=$((failed + f))
  [ "$rc" -eq 0 ] && [ "$f" -eq 0 ] || status=1
}
./tests/test_ref build/ref_case.bin > /dev/null || { echo "tests/test_ref failed"; echo "0 passed, 1 failed"; exit 1; }
run .venv/bin/python tests/ref_gpt2_jax.py build/ref_case.bin
run .venv/bin/python tests/tiktoken_fuzz.py
[ -f build/ckpt_ref/rank0_params.f32 ] && [ -f build/hf_ref/ours_logits.bin ] || ./tests/test_checkpoint > /dev/null 2>&1
run .venv/bin/python tests/check_safetensors.py
run .venv/bin/python tests/check_hf_export.py
run .venv/bin/python tests/check_hf_import.py
[ -f build/tb_ref/log.txt ] && [ -f build/test_timeline.svg ] || ./tests/test_logging > /dev/null 2>&1
run .venv/bin/python tests/check_tensorboard.py
echo "$passed passed, $failed failed"
exit $status

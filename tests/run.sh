#!/bin/sh
# Runs each test binary given, shows its output, and adds up their "N passed, N failed" lines.
# Exit status: 0 only if every binary ran and reported no failure.
passed=0; failed=0; status=0
for t in "$@"; do
  echo "== $t"
  t0=$(date +%s)
  out=$("./$t" 2>&1); rc=$?
  echo "   ($(( $(date +%s) - t0 )) s)"
  printf '%s\n' "$out" | grep -v '^PASS ' | grep -v '^$' | tail -n 40
  line=$(printf '%s\n' "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed$' | tail -n 1)
  if [ -z "$line" ]; then
    echo "$t did not finish (exit $rc)"; failed=$((failed + 1)); status=1; continue
  fi
  p=${line%% passed*}; f=${line#*, }; f=${f%% failed*}
  passed=$((passed + p)); failed=$((failed + f))
  [ "$rc" -eq 0 ] && [ "$f" -eq 0 ] || status=1
done
echo "$passed passed, $failed failed"
exit $status

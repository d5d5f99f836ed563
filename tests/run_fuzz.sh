#!/bin/sh
# make fuzz: each libFuzzer harness replays the inputs that once failed it, then fuzzes for
# FUZZ_SECONDS from its seed corpus (and the corpus it grew before). Prints, per harness, the
# executions, the coverage and what it found, the coverage of each parser (the first byte of an
# input picks it: see the harnesses' top comments), and at the end "N passed, N failed".
#   sh tests/run_fuzz.sh SECONDS [PER_PARSER]   (PER_PARSER=0: skip the per-parser coverage, ~20 s
#                                                a parser; CI does)
secs=${1:-30}
per_parser=${2:-1}
passed=0; failed=0
export ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1 MT_FUZZ_ROOT="$(pwd)"
for h in parsers preprocess; do
  cases=$(ls tests/fuzz_cases_$h/* 2> /dev/null)
  [ "$h" = parsers ] && cases=$(ls tests/fuzz_cases/* 2> /dev/null)
  if [ -n "$cases" ] && ! ./build/fuzz/fuzz_$h $cases > build/fuzz/replay_$h.log 2>&1; then
    tail -40 build/fuzz/replay_$h.log; echo "fuzz_$h: an input that once failed fails again"; failed=$((failed + 1)); continue
  fi
  mkdir -p build/fuzz/corpus_$h
  if (cd build/fuzz && ./fuzz_$h -max_total_time="$secs" -timeout=10 -rss_limit_mb=0 -max_len=300000 \
        -print_final_stats=1 corpus_$h seed_$h > fuzz_$h.log 2>&1); then
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' build/fuzz/fuzz_$h.log | grep -o '[0-9]*$')
    cov=$(grep -o 'cov: [0-9]*' build/fuzz/fuzz_$h.log | tail -1)
    echo "fuzz_$h: $runs executions in ${secs} s, $cov edges, nothing found"; passed=$((passed + 1))
    # coverage per parser: the grown corpus split by the byte that picks the parser, each part
    # replayed alone (-runs=0) and its edges counted
    n=8; [ "$h" = preprocess ] && n=3
    [ "$per_parser" = 0 ] && n=0
    k=0
    while [ $k -lt $n ]; do
      rm -rf build/fuzz/part && mkdir -p build/fuzz/part
      for f in build/fuzz/corpus_$h/* build/fuzz/seed_$h/*; do
        [ -f "$f" ] || continue
        b=$(od -An -N1 -tu1 "$f" | tr -d ' ')
        [ -n "$b" ] && [ $((b % n)) -eq $k ] && cp "$f" build/fuzz/part/
      done
      files=$(ls build/fuzz/part | wc -l)
      pc=$(cd build/fuzz && ./fuzz_$h -runs=0 part 2>&1 | grep -o 'cov: [0-9]*' | tail -1)
      echo "  parser $k: $files inputs in the corpus, ${pc:-cov: 0} edges"
      k=$((k + 1))
    done
  else
    tail -40 build/fuzz/fuzz_$h.log; echo "fuzz_$h: FAILED (the input is build/fuzz/crash-*)"; failed=$((failed + 1))
  fi
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]

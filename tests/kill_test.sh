#!/bin/sh
# tests/kill_test.sh [KILLS] - a trainer killed (SIGKILL) at random points, many times, mostly in
# the middle of saving a checkpoint (it saves every iteration). After each kill:
#   - the tracker names a complete checkpoint, and --load resumes from it;
#   - the first checkpoint (iteration 3, saved before any kill) is byte-identical to its copy;
# and at the end a new run removes every temporary the kills left (saying so) and leaves none.
# Prints "N passed, N failed" (make test-kill; CI runs it with 20 kills).
KILLS=${1:-20}
D=build/kill_test
rm -rf $D && mkdir -p $D
passed=0; failed=0
ok() { passed=$((passed + 1)); }
bad() { echo "FAIL: $*"; failed=$((failed + 1)); }
python3 tests/fuzz_seeds.py --dataset $D/data || { echo "0 passed, 1 failed"; exit 1; }
M="--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 16 --vocab-size 101 --micro-batch-size 2
   --global-batch-size 4 --data-path $D/data --eval-iters 0 --log-interval 1000 --save-interval 1"
./train_gpt $M --train-iters 3 --save $D/ck > $D/first.log 2>&1 || { cat $D/first.log; echo "0 passed, 1 failed"; exit 1; }
cp -r $D/ck/iter_0000003 $D/iter3_copy
i=0
while [ $i -lt "$KILLS" ]; do
  i=$((i + 1))
  ./train_gpt $M --train-iters 100000 --load $D/ck --save $D/ck > $D/run.log 2>&1 &
  pid=$!
  # 30..330 ms: past start-up, into the saves (one per iteration)
  sleep "0.$(printf '%03d' $((30 + $(od -An -N2 -tu2 /dev/urandom | tr -d ' ') % 300)))"
  kill -9 $pid 2> /dev/null; wait $pid 2> /dev/null
  it=$(cat $D/ck/latest_checkpointed_iteration.txt)
  if ./train_gpt $M --save-interval 0 --train-iters $((it + 1)) --load $D/ck > $D/check.log 2>&1 &&
     grep -q "successfully loaded checkpoint from $D/ck at iteration *$it\$" $D/check.log; then ok
  else bad "kill $i: --load of iteration $it failed"; tail -3 $D/check.log; fi
  if diff -r $D/ck/iter_0000003 $D/iter3_copy > /dev/null; then ok; else bad "kill $i: iteration 3 changed"; fi
done
left=$(find $D/ck -name '*.tmp.*' | wc -l)
echo "temporaries left by $KILLS kills: $left"
./train_gpt $M --train-iters 2 --load $D/ck --save $D/ck > $D/last.log 2>&1
if [ "$(find $D/ck -name '*.tmp.*' | wc -l)" -eq 0 ]; then ok; else bad "temporaries remain after a new start"; fi
if [ "$left" -eq 0 ] || grep -q "^removed .*tmp" $D/last.log; then ok; else bad "the removal was not reported"; fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]

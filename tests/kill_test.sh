#!/bin/sh
# tests/kill_test.sh [KILLS] - a trainer killed (SIGKILL) at random points, many times, mostly in
# the middle of saving a checkpoint (it saves every iteration). After each kill:
#   - the tracker names a complete checkpoint, and --load resumes from it;
#   - the first checkpoint (iteration 3, saved before any kill) is byte-identical to its copy;
# and at the end a new run removes every temporary the kills left (saying so) and leaves none.
# Then a save into a full disk (see below).
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
# A full disk in the middle of a save. Two ways: a file-size limit (ulimit -f, SIGXFSZ ignored, so
# a write past it fails with EFBIG: works anywhere), and, where this user may mount one, a small
# tmpfs that fills up (ENOSPC). Either way the save must fail with one line naming the cause,
# exit non-zero, leave no temporary, keep the tracker on the last complete checkpoint, and that
# checkpoint must load and be byte-identical to its copy.
it=$(cat $D/ck/latest_checkpointed_iteration.txt)
cp -r $D/ck/iter_$(printf '%07d' "$it") $D/last_copy
limited() {   # limited LABEL CMD...: CMD under a 128-256 KB file-size limit (fsize), or as it is
  if [ "$1" = fsize ]; then shift; ( trap '' XFSZ; ulimit -f 256; exec "$@" ); else shift; "$@"; fi
}
full_save() {   # full_save LABEL DIR: one more iteration, saved into DIR (which holds $D/ck's files)
  label=$1; dir=$2
  before=$(cat "$dir/latest_checkpointed_iteration.txt")
  if limited $label ./train_gpt $M --train-iters $((before + 1)) --load "$dir" --save "$dir" > $D/full_$label.log 2>&1
  then
    bad "$label: the save into a full disk succeeded"; return; fi
  if grep -qiE "^error: .*(no space left|file too large|write)" $D/full_$label.log; then ok
  else bad "$label: no clear error line"; tail -3 $D/full_$label.log; fi
  if [ "$(find "$dir" -name '*.tmp.*' | wc -l)" -eq 0 ]; then ok; else bad "$label: temporaries left"; fi
  if [ "$(cat "$dir/latest_checkpointed_iteration.txt")" = "$before" ] &&
     diff -r "$dir/iter_$(printf '%07d' "$before")" $D/last_copy > /dev/null; then ok
  else bad "$label: the tracker or the last checkpoint changed"; fi
}
full_save fsize $D/ck   # the model's file is ~1 MB
mkdir -p $D/tmpfs $D/small/ck
cp -r $D/ck/latest_checkpointed_iteration.txt $D/ck/iter_$(printf '%07d' "$it") $D/small/ck/   # the last one only
if mount -t tmpfs -o size=$(( $(du -sk $D/small/ck | cut -f1) + 400 ))k tmpfs $D/tmpfs 2> /dev/null; then
  cp -r $D/small/ck $D/tmpfs/ck   # 400 KB left: the next file (~1 MB) does not fit
  full_save tmpfs $D/tmpfs/ck
  umount $D/tmpfs
else
  echo "SKIPPED: a full tmpfs (this user may not mount one; the file-size limit above stands in for it)"
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]

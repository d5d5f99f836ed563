#!/bin/sh
# tests/test_docs.sh - every command the docs show, run; every output line they quote, checked.
#
# In README.md and docs/*.md a shell block is marked by its fence's info string:
#   ```sh runnable        run by `make test` on the CPU build (tiny models: the whole suite stays fast)
#   ```sh runnable fails  the same, but the command must exit non-zero (the error pages show errors)
#   ```sh gpu             needs GPUs: skipped here, run by `make test-gpu` (tests/test_docs.sh --gpu)
#   ```sh                 shown, never run (a long run, more GPUs than the test machine has, make itself)
# A ```text output block right after a run block quotes what it prints. Each of its lines must
# be found in one line of the real output; "..." in a quoted line stands for anything (trimmed
# numbers, timings), and a line that is only "..." is skipped. The docs run in file order in one
# scratch directory (build/doctest/work, with the programs, data/ and configs/ linked in), so a
# later block sees the files an earlier one wrote; a block whose text was already run (the
# Chinese tutorial repeats the English one's commands) is checked against the first run's output.
#
# Also checked: every relative link points at a file; every `mt_...` name is defined in
# megatron.h or kernels.cuh; every "§N" is one of megatron.h's 12 sections; every file the blocks
# write, run or shown, is one git ignores (runs/, ...); every directory a shown --import-hf reads
# is written by a command above it on the same page; docs/debugging.md's gdb sessions, run in
# gdb's batch mode on the debug build (make train_gpt_debug), give the lines it quotes.
# Prints "N passed, N failed"; run from the repository root after `make`.
mode=cpu
[ "$1" = "--gpu" ] && mode=gpu
passed=0; failed=0
ok() { passed=$((passed + 1)); echo "PASS $1"; }
bad() { failed=$((failed + 1)); echo "FAIL $1"; }
root=$(pwd)
dir=build/doctest
rm -rf "$dir"; mkdir -p "$dir/blocks" "$dir/work/data"
for f in data/*; do ln -s "$root/$f" "$dir/work/data/$(basename "$f")"; done
for f in train_gpt preprocess train_gpt_cuda configs; do [ -e "$f" ] && ln -s "$root/$f" "$dir/work/$f"; done
docs="README.md $(ls docs/*.md | sort)"

# 1. the blocks: blocks/NNN.sh (+ NNN.expect), and a list "NNN kind file:line"
awk -v out="$dir/blocks" '
  FNR == 1 { fence = 0; last = "" }
  /^```/ {
    if (fence) { fence = 0; if (cur != "") close(cur); cur = ""; next }
    fence = 1; info = substr($0, 4); cur = ""
    if (info ~ /^sh (runnable|gpu)/) {
      n++; last = sprintf("%03d", n); kind = info; sub(/^sh /, "", kind); gsub(/ +/, "-", kind)
      print last " " kind " " FILENAME ":" FNR > (out "/list")
      cur = out "/" last ".sh"; printf "" > cur
    } else if (info ~ /^text output/ && last != "") {
      cur = out "/" last ".expect"; printf "" > cur; last = ""
    } else last = ""
    next
  }
  fence && cur != "" { print > cur }
' $docs
[ -f "$dir/blocks/list" ] || : > "$dir/blocks/list"

# does every quoted line of $1 appear in the output $2? prints the first one that does not
missing() {
  awk 'NR == FNR { lines[++n] = $0; next }
       { q = $0; gsub(/^[ \t]+|[ \t]+$/, "", q); if (q == "" || q == "...") next
         k = split(q, frag, /\.\.\./); found = 0
         for (i = 1; i <= n && !found; i++) {
           rest = lines[i]; good = 1
           for (j = 1; j <= k; j++) {
             s = frag[j]; gsub(/^[ \t]+|[ \t]+$/, "", s); if (s == "") continue
             p = index(rest, s); if (!p) { good = 0; break }
             rest = substr(rest, p + length(s))
           }
           if (good) found = 1
         }
         if (!found) { print q; exit } }' "$2" "$1"
}

# 2. run them in order
while read -r id kind where; do
  case "$kind" in
    gpu*) [ "$mode" = gpu ] || { echo "SKIP $where (needs GPUs: make test-gpu)"; continue; } ;;
    *) ;;   # CPU blocks run in both modes: the GPU blocks need their data
  esac
  sum=$(cksum < "$dir/blocks/$id.sh" | cut -d' ' -f1)
  if [ -f "$dir/blocks/ran.$sum" ]; then
    first=$(cat "$dir/blocks/ran.$sum"); cp "$dir/blocks/$first.out" "$dir/blocks/$id.out"
    cp "$dir/blocks/$first.rc" "$dir/blocks/$id.rc"
  else
    (cd "$dir/work" && timeout 300 sh -e "../blocks/$id.sh") > "$dir/blocks/$id.out" 2>&1
    echo $? > "$dir/blocks/$id.rc"; echo "$id" > "$dir/blocks/ran.$sum"
  fi
  rc=$(cat "$dir/blocks/$id.rc")
  case "$kind" in
    *fails) [ "$rc" -ne 0 ] && ok "$where exits non-zero" || bad "$where should fail, exit $rc" ;;
    *) if [ "$rc" -eq 0 ]; then ok "$where runs"
       else bad "$where exit $rc:"; tail -n 5 "$dir/blocks/$id.out"; fi ;;
  esac
  if [ -f "$dir/blocks/$id.expect" ]; then
    m=$(missing "$dir/blocks/$id.expect" "$dir/blocks/$id.out")
    if [ -z "$m" ]; then ok "$where prints what the doc quotes"
    else bad "$where does not print: $m"; fi
  fi
done < "$dir/blocks/list"
[ "$mode" = gpu ] && { echo "$passed passed, $failed failed"; [ "$failed" -eq 0 ]; exit; }

# 3. links, names of functions and sections
for doc in $docs; do
  d=$(dirname "$doc")
  for link in $(grep -oE '\]\([^)# ]+' "$doc" | sed 's/^](//' | grep -v '^[a-z]*:' | sort -u); do
    [ -e "$d/$link" ] && ok "$doc links $link" || bad "$doc links $link, which does not exist"
  done
  for name in $(grep -o '`mt_[A-Za-z0-9_]*' "$doc" | sed 's/^`//' | sort -u); do
    grep -q "\\b$name\\b" megatron.h kernels.cuh && ok "$doc names $name" \
      || bad "$doc names $name, which megatron.h and kernels.cuh do not define"
  done
  for s in $(grep -o '§[0-9]*' "$doc" | sed 's/^§//' | sort -u); do
    grep -q "^// $s\. " megatron.h && ok "$doc cites section $s" || bad "$doc cites section $s, which does not exist"
  done
done

# 4. outputs go where git ignores them (runs/, data/my_dataset*, build/): every file the runnable
# blocks wrote, and every output path of a shown command (--save, --tensorboard-dir, --timeline,
# --timeline-svg, --export-hf, --sample-output-file, --genfile, --output-prefix, the shell's >), so a copied
# command leaves `git status` clean
stray=$( (cd "$dir/work" && find . -type f) | sed 's|^\./||' \
  | git check-ignore --no-index --verbose --non-matching --stdin | awk -F '\t' '$1 == "::" { print $2 }')
[ -z "$stray" ] && ok "the runnable blocks write only where git ignores" \
  || bad "the runnable blocks wrote files git does not ignore (write under runs/): $(echo $stray)"
awk '
  FNR == 1 { inf = 0; shell = 0; cont = "" }
  /^```/ { if (inf) { inf = 0; shell = 0; next }
           inf = 1; info = substr($0, 4); shell = info ~ /^sh/ || info == ""; next }
  inf && shell {
    line = cont $0
    if (line ~ /\\$/) { if (cont == "") start = FNR; cont = substr(line, 1, length(line) - 1) " "; next }
    if (cont == "") start = FNR
    cont = ""
    if (line ~ /^[ \t]*\(gdb\)/) next
    n = split(line, w, /[ \t]+/)
    ours = line ~ /\.\/(train_gpt|train_gpt_cuda|preprocess)([ \t]|$)/
    for (i = 1; i <= n; i++) {
      t = w[i]; v = ""
      if (ours && t ~ /^--(save|tensorboard-dir|timeline|timeline-svg|export-hf|sample-output-file|genfile|output-prefix)(=|$)/)
        v = t ~ /=/ ? substr(t, index(t, "=") + 1) : w[i + 1]
      else if (t ~ /^[0-9]*>>?/) {
        v = t; sub(/^[0-9]*>>?/, "", v); if (v == "") v = w[i + 1]
        if (v ~ /^&/) v = ""
      }
      if (v != "") print FILENAME ":" start " " v
    }
  }' $docs > "$dir/outputs"
while read -r where path; do
  case "$path" in
    /dev/*|/tmp/*|*'$'*|*...*) continue ;;   # not in the repository, or a placeholder
  esac
  git check-ignore -q --no-index "$path" && ok "$where writes $path (ignored)" \
    || bad "$where writes $path, which git does not ignore (write under runs/)"
done < "$dir/outputs"

# 5. every directory a command reads with --import-hf is one an earlier command of the same page
# writes (--export-hf DIR, or a download's --local-dir DIR): a bare `huggingface-cli download
# gpt2` leaves the files in Hugging Face's cache, where `--import-hf gpt2` finds nothing
awk '
  FNR == 1 { inf = 0; cont = ""; split("", made) }
  /^```/ { inf = !inf; next }
  inf {
    line = cont $0
    if (line ~ /\\$/) { if (cont == "") start = FNR; cont = substr(line, 1, length(line) - 1) " "; next }
    if (cont == "") start = FNR
    cont = ""
    n = split(line, w, /[ \t]+/)
    for (i = 1; i < n; i++) if (w[i] == "--import-hf") print FILENAME ":" start " " w[i + 1] " " (w[i + 1] in made)
    for (i = 1; i < n; i++) if (w[i] == "--export-hf" || w[i] == "--local-dir") made[w[i + 1]] = 1
  }' $docs > "$dir/imports"
while read -r where path known; do
  [ "$known" = 1 ] && ok "$where imports $path, written above" \
    || bad "$where imports $path, which no command above writes (--export-hf, or a download's --local-dir)"
done < "$dir/imports"

# 6. docs/debugging.md's gdb sessions (its blocks quote gdb, so they are not shell blocks): the same
# commands in gdb's batch mode on the debug build, and the lines the page's reasoning rests on
if [ "$mode" = cpu ] && command -v gdb > /dev/null 2>&1 && make -s train_gpt_debug > "$dir/gdb_build.txt" 2>&1; then
  G="--num-layers 2 --hidden-size 32 --num-attention-heads 2 --seq-length 16 --max-position-embeddings 16
     --micro-batch-size 2 --global-batch-size 4 --train-iters 2 --lr 1e-3 --data-path data/my_dataset_text_document
     --vocab-file data/gpt2-vocab.json --merge-file data/gpt2-merges.txt --split 949,50,1 --log-interval 1
     --eval-interval 100 --eval-iters 1 --tensor-model-parallel-size 2 --nproc-per-node 4"
  (cd "$dir/work" && timeout 120 gdb -q -batch -ex 'break mt_reduce_from_tp_region_forward if r->ps.rank == 3' \
     -ex run -ex 'info threads' -ex 'bt 3' -ex 'print r->ps' -ex kill --args "$root/train_gpt_debug" $G) \
     > "$dir/gdb1.txt" 2>&1
  (cd "$dir/work" && timeout 120 gdb -q -batch -ex 'break mt_layernorm_forward if r->ps.rank == 2' -ex run \
     -ex 'set scheduler-locking step' -ex next -ex next -ex next -ex kill --args "$root/train_gpt_debug" $G) \
     > "$dir/gdb2.txt" 2>&1   # (a third next: the seam op's body may grow by a line and still get back)
  if grep -q -e 'ptrace: Operation not permitted' -e 'Could not trace the inferior' "$dir/gdb1.txt"; then
    echo "SKIPPED docs/debugging.md's gdb sessions: this machine does not let gdb trace a process ($dir/gdb1.txt)"
  else
  for want in 'Thread 5 "r3 tp1 dp1 pp0" hit Breakpoint 1, mt_reduce_from_tp_region_forward' \
              '"train_gpt_debug" __futex_abstimed_wait' '"r0 tp0 dp0 pp0"' '"r1 tp1 dp0 pp0"' '"r2 tp0 dp1 pp0"' \
              '#1 .* in mt_vocab_parallel_embedding_forward' '#2 .* in mt__embedding_forward' \
              'rank = 3, world_size = 4, tp_rank = 1, tp_size = 2, pp_rank = 0, pp_size = 1, dp_rank = 1'; do
    grep -q -- "$want" "$dir/gdb1.txt" && ok "docs/debugging.md gdb (a breakpoint on one rank): $want" \
      || bad "docs/debugging.md gdb (a breakpoint on one rank): no line matches $want (see $dir/gdb1.txt)"
  done
  for want in 'Thread 4 "r2 tp0 dp1 pp0" hit Breakpoint 1, mt_layernorm_forward' '^mt__layer_forward (' \
              'mt_column_parallel_qkv_forward(r, l_qkv, l_ln1'; do
    grep -q -- "$want" "$dir/gdb2.txt" && ok "docs/debugging.md gdb (scheduler-locking step): $want" \
      || bad "docs/debugging.md gdb (scheduler-locking step): no line matches $want (see $dir/gdb2.txt)"
  done
  fi
elif [ "$mode" = cpu ]; then
  echo "SKIPPED docs/debugging.md's gdb sessions (no gdb, or make train_gpt_debug failed: $dir/gdb_build.txt)"
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]

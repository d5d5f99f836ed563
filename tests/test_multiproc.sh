#!/bin/sh
# tests/test_multiproc.sh - training in several processes on the CPU build (issue 16): two or
# four ./train_gpt processes started torchrun-style on loopback (RANK, WORLD_SIZE, MASTER_ADDR,
# MASTER_PORT), their collectives over the TCP channel, must print the same loss lines, bit for
# bit, as one process running the same ranks as threads: DP=2, PP=2, TP=2, TP=2 x PP=2 with two
# rank threads per process, DP=4 with the distributed optimizer. Then --print-launch under each
# launcher's variables. Run from the repository root after `make`; prints "N passed, N failed".
passed=0; failed=0
ok() { passed=$((passed + 1)); echo "PASS $1"; }
bad() { failed=$((failed + 1)); echo "FAIL $1"; }
tmp=build/test_multiproc
rm -rf "$tmp"; mkdir -p "$tmp"

head -n 8 data/corpus.jsonl > "$tmp/small.jsonl"
./preprocess --input "$tmp/small.jsonl" --output-prefix "$tmp/small" --vocab-file data/gpt2-vocab.json \
  --merge-file data/gpt2-merges.txt --append-eod > /dev/null 2>&1 || bad "preprocess the small corpus"
M="--num-layers 2 --hidden-size 32 --num-attention-heads 2 --seq-length 16 --max-position-embeddings 16
   --micro-batch-size 2 --global-batch-size 8 --lr 1e-3 --vocab-file data/gpt2-vocab.json
   --merge-file data/gpt2-merges.txt --split 949,50,1 --log-interval 1 --eval-interval 2 --eval-iters 1
   --train-iters 3 --data-path $tmp/small_text_document --dist-timeout 30"
# the rendezvous port, from the PID: parallel runs of the suite (other checkouts, CI jobs) get different ones
port() { echo $((20000 + ($$ * 7 + $1 * 131) % 20000)); }
losses() { grep -o 'lm loss: [0-9.E+-]*\|lm loss value: [0-9.E+-]*' "$1"; }

# same NAME "THREADED FLAGS" "PER-PROCESS FLAGS" PROCESSES: the loss lines of the last rank's
# process against the threaded run's
same() {
  ./train_gpt $M $2 > "$tmp/$1.threads" 2>&1 || { bad "$1: the threaded run"; return; }
  p=$(port $4); pids=""; last=$(($4 - 1))
  for r in $(seq 0 $last); do
    RANK=$r WORLD_SIZE=$4 LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$p \
      ./train_gpt $M $3 > "$tmp/$1.p$r" 2>&1 &
    pids="$pids $!"
  done
  rc=0; for pid in $pids; do wait $pid || rc=1; done
  a=$(losses "$tmp/$1.threads"); b=$(losses "$tmp/$1.p$last")
  if [ $rc -eq 0 ] && [ -n "$a" ] && [ "$a" = "$b" ]; then ok "$1: $4 processes = one process"
  else bad "$1: $4 processes = one process"; tail -n 3 "$tmp/$1.p0" "$tmp/$1.p$last"; fi
}
same dp2 "--nproc-per-node 2" "" 2
same pp2 "--pipeline-model-parallel-size 2 --nproc-per-node 2" "--pipeline-model-parallel-size 2" 2
same tp2 "--tensor-model-parallel-size 2 --nproc-per-node 2" "--tensor-model-parallel-size 2" 2
same tp2pp2_threads "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --nproc-per-node 4" \
  "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --nproc-per-node 2" 2
same dp4_distopt "--nproc-per-node 4 --use-distributed-optimizer" "--use-distributed-optimizer" 4

# the start line says what the environment describes
check() { if eval "$2"; then ok "$1"; else bad "$1"; cat "$tmp/launch"; fi; }
L="--num-layers 2 --hidden-size 32 --num-attention-heads 8 --seq-length 16 --vocab-size 64"
./train_gpt $L --print-launch --nproc-per-node 2 > "$tmp/launch" 2>&1
check "print-launch: one process" "grep -q '^launch: one process, 2 ranks as threads' '$tmp/launch'"
env RANK=3 WORLD_SIZE=8 LOCAL_RANK=3 LOCAL_WORLD_SIZE=8 MASTER_ADDR=h MASTER_PORT=29500 \
  ./train_gpt $L --print-launch > "$tmp/launch" 2>&1
check "print-launch: torchrun-style" \
  "grep -q '^launch: torchrun-style environment (RANK=3 WORLD_SIZE=8 .*process 3 of 8, rank 3 of 8.*rendezvous at h:29500' '$tmp/launch'"
env SLURM_JOB_ID=77 SLURM_PROCID=1 SLURM_NTASKS=2 SLURM_STEP_ID=0 SLURM_NODEID=1 SLURM_LOCALID=0 \
  SLURM_JOB_NODELIST='gpu-[07-08]' ./train_gpt $L --print-launch --nproc-per-node 8 --tensor-model-parallel-size 8 \
  --pipeline-model-parallel-size 2 > "$tmp/launch" 2>&1
check "print-launch: Slurm, one process per node" \
  "grep -q '^launch: Slurm (srun) .*process 1 of 2, ranks 8..15 of 16.*node 1.*rendezvous at gpu-07:20077' '$tmp/launch'"
env OMPI_COMM_WORLD_RANK=1 OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_LOCAL_RANK=1 OMPI_COMM_WORLD_LOCAL_SIZE=2 \
  MASTER_ADDR=h MASTER_PORT=1 ./train_gpt $L --print-launch > "$tmp/launch" 2>&1
check "print-launch: Open MPI" "grep -q '^launch: Open MPI (mpirun) .*process 1 of 2' '$tmp/launch'"
env RANK=0 WORLD_SIZE=2 ./train_gpt $L --print-launch > "$tmp/launch" 2>&1
check "print-launch: no MASTER_ADDR is an error" "grep -q 'need a place to meet: MASTER_ADDR and MASTER_PORT' '$tmp/launch'"

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]

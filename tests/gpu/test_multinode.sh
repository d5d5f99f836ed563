#!/bin/sh
# tests/gpu/test_multinode.sh - issue 16 on the device machine (nvidia-h200-x2): two processes,
# one GPU each, started torchrun-style as if on two nodes (GROUP_RANK 0 and 1, each process sees
# only its own GPU through CUDA_VISIBLE_DEVICES), with NCCL forced onto its network transport
# over loopback (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1 NCCL_SOCKET_IFNAME=lo).
# They train DP=2 and PP=2 and must print the same losses as one process running both ranks as
# threads (./train_gpt_cuda --nproc-per-node 2). Then DP=2 as two processes of one node
# (LOCAL_RANK picks the GPU, NCCL's default transports).
# Tolerance 0 (RTOL=... overrides): a sum of 2 ranks is a+b whichever transport NCCL takes
# (addition is commutative), and pipeline messages are copied, not added.
#   make train_gpt_cuda preprocess tests/gpu/compare_logs && sh tests/gpu/test_multinode.sh
# Prints the loss lines side by side, then "N passed, N failed"; SKIPPED with fewer than 2 GPUs.
set -u
ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
if [ "$ngpu" -lt 2 ]; then
  echo "SKIPPED test_multinode: needs 2 GPUs, this machine has $ngpu"
  echo "0 passed, 0 failed"
  exit 0
fi
RTOL=${RTOL:-0}
export NCCL_NVLS_ENABLE=0
mkdir -p build
[ -f build/gpu_test_text_document.idx ] || ./preprocess --input data/corpus.jsonl --output-prefix build/gpu_test \
  --vocab-file data/gpt2-vocab.json --merge-file data/gpt2-merges.txt --append-eod --workers 4 > /dev/null 2>&1
M="--num-layers 4 --hidden-size 128 --num-attention-heads 4 --seq-length 64 --max-position-embeddings 64 \
 --micro-batch-size 4 --global-batch-size 8 --train-iters 20 --lr 1e-3 --lr-warmup-iters 5 --weight-decay 0.1 \
 --log-interval 1 --eval-interval 1000 --eval-iters 0 --split 949,50,1 --seed 1234 --fp32 \
 --hidden-dropout 0 --attention-dropout 0 --dist-timeout 120 \
 --data-path build/gpu_test_text_document --vocab-file data/gpt2-vocab.json --merge-file data/gpt2-merges.txt"
passed=0; failed=0
port=$((20000 + $$ % 20000))

# run LABEL "FLAGS" MODE: the threaded reference, then the two processes (MODE: nodes | node)
run() {
  label=$1; flags=$2; mode=$3
  ./train_gpt_cuda $M $flags --nproc-per-node 2 > build/mn_${label}_threads.log 2>&1 ||
    { echo "the threaded run $label failed"; tail -n 5 build/mn_${label}_threads.log; failed=$((failed + 1)); return; }
  port=$((port + 1)); pids=""
  for r in 0 1; do
    if [ "$mode" = nodes ]; then   # "two nodes": one GPU each, NCCL over sockets on loopback
      env RANK=$r WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 GROUP_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
        CUDA_VISIBLE_DEVICES=$r NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1 NCCL_SOCKET_IFNAME=lo \
        ./train_gpt_cuda $M $flags > build/mn_${label}_p$r.log 2>&1 &
    else                           # one node, two processes: LOCAL_RANK is the GPU
      env RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 GROUP_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
        ./train_gpt_cuda $M $flags > build/mn_${label}_p$r.log 2>&1 &
    fi
    pids="$pids $!"
  done
  rc=0; for pid in $pids; do wait $pid || rc=1; done
  if [ $rc -ne 0 ]; then
    echo "the two-process run $label failed"; tail -n 5 build/mn_${label}_p0.log build/mn_${label}_p1.log
    failed=$((failed + 1)); return
  fi
  grep '^launch:' build/mn_${label}_p0.log build/mn_${label}_p1.log
  echo "$label: lm loss, one process (threads) | two processes"
  grep -o 'iteration *[0-9]*/\|lm loss: [0-9.E+-]*' build/mn_${label}_threads.log | paste - - > build/mn_a.txt
  grep -o 'iteration *[0-9]*/\|lm loss: [0-9.E+-]*' build/mn_${label}_p1.log | paste - - | cut -f2 > build/mn_b.txt
  paste build/mn_a.txt build/mn_b.txt
  # the last rank's process prints the iteration lines
  if ./tests/gpu/compare_logs build/mn_${label}_threads.log build/mn_${label}_p1.log $RTOL $label > /dev/null; then
    echo "PASS $label"; passed=$((passed + 1))
  else
    echo "FAIL $label"; ./tests/gpu/compare_logs build/mn_${label}_threads.log build/mn_${label}_p1.log $RTOL $label
    failed=$((failed + 1))
  fi
}
run dp2_two_nodes "" nodes
run pp2_two_nodes "--pipeline-model-parallel-size 2" nodes
run dp2_one_node "" node
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]

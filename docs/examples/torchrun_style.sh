#!/bin/sh
# docs/examples/torchrun_style.sh - one node, one process per GPU, started the way torchrun
# starts them: every process gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR
# and MASTER_PORT in its environment. GPT-2 small with TP=2 x PP=2 x DP=2 on 8 GPUs.
# Run from the repository root after `make`:  sh docs/examples/torchrun_style.sh
# (With one process for the whole node, ./train_gpt_cuda --nproc-per-node 8 does the same with
# threads; this script is the shape a multi-node launcher gives, see docs/multinode.md.)

set -eu                                    # stop at the first error or unset variable

NPROC=${NPROC:-8}                          # processes = GPUs on this node (NPROC=2 sh ... for 2 GPUs)
export WORLD_SIZE=$NPROC                   # processes in the job (one node: all of them)
export LOCAL_WORLD_SIZE=$NPROC             # processes on this node: a TP group must fit in them
export GROUP_RANK=0                        # this node's index (torchrun's name): the only one
export MASTER_ADDR=127.0.0.1               # process 0 runs here; it listens for the others
export MASTER_PORT=${MASTER_PORT:-29500}   # torchrun's default port; any free port will do
export NCCL_NVLS_ENABLE=0                  # no NVLink SHARP (train_gpt_cuda sets it too)

# the model and the data: the tutorial's GPT-2 small on its preprocessed corpus
ARGS="--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2
      --num-layers 12 --hidden-size 768 --num-attention-heads 12
      --seq-length 1024 --max-position-embeddings 1024
      --micro-batch-size 4 --global-batch-size 32
      --lr 6e-4 --min-lr 6e-5 --lr-decay-style cosine --lr-warmup-iters 20 --weight-decay 0.1
      --train-iters 300 --bf16 --log-interval 10 --eval-interval 100 --eval-iters 10 --split 949,50,1
      --data-path data/my_dataset_text_document
      --vocab-file data/gpt2-vocab.json --merge-file data/gpt2-merges.txt"

pids=""                                    # the processes started, to wait for them
r=0                                        # the process index = its rank = its GPU
while [ "$r" -lt "$NPROC" ]; do            # one process per GPU
  RANK=$r LOCAL_RANK=$r ./train_gpt_cuda $ARGS > "rank$r.log" 2>&1 &   # its own log: rank0.log ...
  pids="$pids $!"                          # remember its process id
  r=$((r + 1))                             # the next one
done

status=0                                   # 0 if every process succeeded
for pid in $pids; do                       # wait for all of them ...
  wait "$pid" || status=1                  # ... and note any failure
done
tail -n 3 "rank$((NPROC - 1)).log"         # the last rank prints the iteration lines
exit $status                               # non-zero if any process failed

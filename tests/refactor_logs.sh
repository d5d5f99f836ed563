#!/bin/sh
# Records the full logs of a fixed set of CPU runs into DIR, with the timing columns blanked,
# so that a change meant to move code only (no algorithm, no output) can be checked with
# `diff -r before/ after/`. Usage: sh tests/refactor_logs.sh DIR   (needs data/austen_text_document)
set -u
dir=${1:?usage: tests/refactor_logs.sh DIR}
mkdir -p "$dir"; rm -rf "$dir/ckpt" "$dir/conv"
D=data/austen_text_document
[ -f $D.idx ] || ./preprocess --input data/corpus.jsonl --output-prefix data/austen --vocab-file data/gpt2-vocab.json \
    --merge-file data/gpt2-merges.txt --tokenizer-type GPT2BPETokenizer --append-eod --workers 2 > /dev/null
COMMON="--hidden-size 64 --num-attention-heads 4 --seq-length 32 --max-position-embeddings 64 --micro-batch-size 2
 --global-batch-size 8 --lr 1e-3 --lr-decay-style cosine --lr-warmup-iters 2 --weight-decay 0.1 --clip-grad 1.0
 --hidden-dropout 0.1 --attention-dropout 0.1 --data-path $D --vocab-file data/gpt2-vocab.json
 --merge-file data/gpt2-merges.txt --split 949,50,1 --log-interval 2 --eval-interval 6 --eval-iters 2"
blank() {  # the columns that depend on the clock
  sed -E -e 's/(elapsed time per iteration \(ms\)): [0-9.]+/\1: T/' -e 's/(TFLOP\/s\/GPU\)): [0-9.]+/\1: T/' \
         -e 's/(tokens per second): [0-9.]+/\1: T/' -e 's/ in [0-9.]+ s/ in T s/g' -e 's/[0-9.]+ ms/T ms/g' \
         -e 's/waited [0-9.]+%/waited T%/' -e 's/\([0-9.]+ s\)/(T s)/'
}
run() {  # run NAME ARGS...
  name=$1; shift
  ./train_gpt "$@" > "$dir/$name.raw" 2>&1; echo "exit $?" >> "$dir/$name.raw"
  blank < "$dir/$name.raw" > "$dir/$name.log"; rm "$dir/$name.raw"
}
run 1rank        $COMMON --num-layers 2 --train-iters 8 --tokens-to-generate 12 --temperature 0.8 --top-k 20 --prompt "It is a truth"
run tp2dp2       $COMMON --num-layers 2 --train-iters 8 --tensor-model-parallel-size 2 --nproc-per-node 4
run pp2virtual   $COMMON --num-layers 4 --train-iters 8 --pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 1
run tp2pp2dp2    $COMMON --num-layers 2 --train-iters 6 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --nproc-per-node 8 --tokens-to-generate 6 --prompt "She"
run save         $COMMON --num-layers 2 --train-iters 8 --tensor-model-parallel-size 2 --save "$dir/ckpt" --save-interval 4 --exit-interval 4
run resume       $COMMON --num-layers 2 --train-iters 8 --tensor-model-parallel-size 2 --save "$dir/ckpt" --load "$dir/ckpt" --save-interval 4
run convert      --convert-checkpoint --load "$dir/ckpt" --save "$dir/conv" --target-tensor-parallel-size 1 --target-pipeline-parallel-size 2
run layout       --print-layout --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --nproc-per-node 8 --num-layers 4 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --vocab-size 100 --micro-batch-size 1 --global-batch-size 4
run schedule     --print-schedule --pipeline-model-parallel-size 4 --num-layers 8 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --vocab-size 100 --micro-batch-size 1 --global-batch-size 6
run badflag      $COMMON --num-layers 2 --train-iters 8 --tensor-model-parallel-size 3
run help         --help
( cd "$dir/ckpt" && find . -type f | sort | xargs md5sum ) > "$dir/ckpt.md5"
( cd "$dir/conv" && find . -type f | sort | xargs md5sum ) > "$dir/conv.md5"
rm -rf "$dir/ckpt" "$dir/conv"
echo "logs in $dir"

# megatron.h - Makefile
#
#   make            the CPU programs: ./train_gpt and ./preprocess (and a CUDA compile check where nvcc is)
#   make run        preprocess the bundled corpus into data/ and train a small GPT on it (CPU; 16 min on a
#                   shared 2-core machine, 11.5 CPU-minutes: docs/perf.md)
#   make test       the CPU test suite (C, one harness): prints "N passed, N failed"
#   make test-sanitize  the C suite under ASan + UBSan (leaks too) and the threaded tests under TSan (clang)
#   make test-kill  the trainer killed mid-save many times, and saving into a full disk: nothing lost
#   make fuzz       libFuzzer on every parser of outside data (FUZZ_SECONDS=30 by default)
#   make test-ref   outside references: GPT-2 in JAX (autodiff) and OpenAI's tiktoken, in a local .venv
#   make test-gpu   (GPU machine) every kernel against its CPU twin; GPU training against CPU training;
#                   --fp16 against the CPU's emulation of it and against --bf16 (tests/gpu/test_fp16.sh);
#                   the memory plan against the measured peak (tests/gpu/test_memory.sh);
#                   --optimizer-cpu-offload and the DeepSpeed config on the GPU (tests/gpu/test_offload.sh)
#   make test-gpu-generate  (GPU machine) generation: GPU vs CPU logits, vs transformers, the benchmark
#   make bench      (GPU machine) GPT-2 small on 1 and 2 GPUs: tokens/s, ms/step, MFU, memory
#   make bench-tokenizer   our GPT-2 tokenizer against tiktoken (MB/s, tokens/s, 1 and 2 threads)
#   make debug      -O0 -g builds for gdb, under their own names: ./train_gpt_debug, ./preprocess_debug
#   make debug-cuda -O0 -g -G build of the GPU trainer for cuda-gdb: ./train_gpt_cuda_debug
#   make clean
#
# Only a C compiler and pthreads are needed for the CPU build; nvcc (CUDA + NCCL) for the GPU one.

CC ?= cc
CFLAGS ?= -O3 -march=native
override CFLAGS += -std=c11 -Wall -Wextra -pedantic -I.
LDLIBS = -lm -pthread
NVCC ?= nvcc
NVCC_FOUND := $(shell command -v $(NVCC) 2> /dev/null)
# the GPU's architecture when nvidia-smi can tell (9.0 -> 90), else Hopper's. Hopper gets sm_90a
# code, the only kind with wgmma and the TMA (the top GEMM rung); other GPUs their own sm_XX (the
# kernels need sm_80 or newer: bf16 mma.sync), where --bf16 uses the mma rung
GPU_ARCH := $(shell nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2> /dev/null | head -n 1 | tr -d . | grep -E '^[0-9]+$$')
ifeq ($(filter-out 90,$(GPU_ARCH)),)
NVCC_ARCH = -gencode=arch=compute_90a,code=sm_90a
else
NVCC_ARCH = -arch=sm_$(GPU_ARCH)
endif
NVCCFLAGS ?= -O3 $(NVCC_ARCH)
PYTHON ?= python3
VENV = .venv
HEADERS = megatron.h

ifeq ($(NVCC_FOUND),)
$(info megatron.h: CPU build only (nvcc not found: no train_gpt_cuda))
else
$(info megatron.h: CPU build, and the GPU build (train_gpt_cuda) with $(NVCC))
endif

TESTS = tests/test_header tests/test_logging tests/test_comm tests/test_recompute tests/test_sp tests/test_fp16 tests/test_offload tests/test_deepspeed tests/test_ops tests/test_data tests/test_pp tests/test_layouts tests/test_model tests/test_checkpoint tests/test_tokenizer tests/test_hostile tests/test_generate tests/test_launch

.PHONY: all run build-tests test test-sanitize fuzz test-kill test-ref test-gpu test-gpu-generate bench bench-tokenizer cuda-check cuda-check-all debug debug-cuda clean

# the programs, in the repository root (train_gpt_cuda where nvcc is found)
all: train_gpt preprocess $(if $(NVCC_FOUND),train_gpt_cuda)

# the GPU trainer: the same train_gpt.c compiled as CUDA C++, kernels.cuh and NCCL
train_gpt_cuda: train_gpt.c kernels.cuh $(HEADERS)
	$(NVCC) $(NVCCFLAGS) -x cu -Xcompiler -Wall -o $@ train_gpt.c -lnccl

train_gpt: train_gpt.c $(HEADERS)
	$(CC) $(CFLAGS) -o $@ train_gpt.c $(LDLIBS)

preprocess: preprocess.c $(HEADERS)
	$(CC) $(CFLAGS) -o $@ preprocess.c $(LDLIBS)

# megatron.h, preprocess.c and the GPU tests must compile as CUDA C++ (CI: compile only, no GPU there)
# (one object each, so make -j2 cuda-check compiles two at a time)
# (train_gpt_cuda itself, linked: the GPU binary; CI builds it here and nowhere else)
# (tests/gpu/test_gemm_wgmma.cu is left to make test-gpu: it instantiates every tile of the wgmma
#  GEMM again, ~3 minutes of nvcc that CI's 15 minutes cannot spare; cuda-check-all adds it)
# (and train_gpt.c for an older GPU, sm_80 (A100: no clusters, bulk copies or wgmma; README's
#  make NVCCFLAGS="-O3 -arch=sm_80"): the kernels' Hopper-only PTX must stay behind its guards)
CUDA_CHECK = train_gpt_cuda build/cuda_check/preprocess.o build/cuda_check/test_kernels.o build/cuda_check/train_gpt_sm80.o
cuda-check-all: $(CUDA_CHECK) build/cuda_check/test_gemm_wgmma.o
cuda-check: $(CUDA_CHECK)
build/cuda_check/preprocess.o: preprocess.c $(HEADERS)
	@mkdir -p build/cuda_check
	$(NVCC) $(NVCCFLAGS) -x cu -c preprocess.c -o $@
build/cuda_check/test_kernels.o: tests/gpu/test_kernels.cu kernels.cuh tests/harness.h $(HEADERS)
	@mkdir -p build/cuda_check
	$(NVCC) $(NVCCFLAGS) -x cu -Xcompiler -Wall -c tests/gpu/test_kernels.cu -o $@
build/cuda_check/train_gpt_sm80.o: train_gpt.c kernels.cuh $(HEADERS)
	@mkdir -p build/cuda_check
	$(NVCC) -O3 -arch=sm_80 -x cu -Xcompiler -Wall -c train_gpt.c -o $@
build/cuda_check/test_gemm_wgmma.o: tests/gpu/test_gemm_wgmma.cu kernels.cuh $(HEADERS)
	@mkdir -p build/cuda_check
	$(NVCC) $(NVCCFLAGS) -std=c++17 -x cu -c tests/gpu/test_gemm_wgmma.cu -o $@

# make run: the tutorial's flow on the bundled corpus (Jane Austen, 914k GPT-2 tokens):
# ./preprocess (Megatron's tools/preprocess_data.py flags), then ./train_gpt with a small GPT
# on 2 simulated data-parallel ranks (threads), then the validation loss and a few generated lines.
RUN_PREFIX = data/austen
run: train_gpt preprocess
	@if [ ! -f $(RUN_PREFIX)_text_document.idx ]; then \
	  ./preprocess --input data/corpus.jsonl --output-prefix $(RUN_PREFIX) --vocab-file data/gpt2-vocab.json \
	    --merge-file data/gpt2-merges.txt --tokenizer-type GPT2BPETokenizer --append-eod --workers 2; fi
	./train_gpt --num-layers 2 --hidden-size 128 --num-attention-heads 4 --seq-length 64 \
	  --max-position-embeddings 64 --micro-batch-size 4 --global-batch-size 8 --nproc-per-node 2 \
	  --train-iters 150 --lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine --lr-warmup-iters 10 --weight-decay 0.1 \
	  --clip-grad 1.0 --log-interval 10 --eval-interval 50 --eval-iters 4 --split 949,50,1 \
	  --hidden-dropout 0 --attention-dropout 0 \
	  --data-path $(RUN_PREFIX)_text_document --vocab-file data/gpt2-vocab.json --merge-file data/gpt2-merges.txt \
	  --tokens-to-generate 40 --temperature 0.8 --top-k 40 --prompt "It is a truth universally acknowledged" 

# the tests: each binary prints "N passed, N failed"; tests/run.sh adds them up
tests/test_%: tests/test_%.c tests/harness.h tests/synthetic.h tests/child.h $(HEADERS)
	$(CC) $(CFLAGS) -o $@ $< $(LDLIBS)
tests/tok_ids: tests/tok_ids.c $(HEADERS)
	$(CC) $(CFLAGS) -o $@ $< $(LDLIBS)
tests/test_ref: tests/test_ref.c $(HEADERS)
	$(CC) $(CFLAGS) -o $@ $< $(LDLIBS)

# and two shell tests: tests/test_cli.sh (what a newcomer sees: --help, the first lines of a run,
# make debug) and tests/test_docs.sh (every command marked runnable in README.md and docs/*.md)
SCRIPT_TESTS = tests/test_cli.sh tests/test_docs.sh tests/test_multiproc.sh
# the test binaries alone (CI builds them with make -j2 before make test runs them)
build-tests: $(TESTS)
test: train_gpt preprocess $(TESTS)
	@mkdir -p build
	@sh tests/run.sh $(TESTS) $(SCRIPT_TESTS)

# the same suite under sanitizers (clang): every C test and the programs built with AddressSanitizer
# and UndefinedBehaviorSanitizer (leak checking on, any report fails), test_hostile's train / convert /
# preprocess runs through those builds (MT_BIN_DIR); then the threaded tests under ThreadSanitizer.
#   make test-sanitize          (CI runs it; about 5 minutes on 2 cores)
SAN_CC ?= clang
ASAN_FLAGS = -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -std=c11 -I.
TSAN_FLAGS = -O1 -g -fsanitize=thread -std=c11 -I.
TSAN_TESTS = tests/test_comm tests/test_pp tests/test_launch tests/test_offload
build/asan/%: %.c tests/harness.h tests/synthetic.h tests/child.h $(HEADERS)
	@mkdir -p $(dir $@)
	$(SAN_CC) $(ASAN_FLAGS) -o $@ $< $(LDLIBS)
build/tsan/%: %.c tests/harness.h tests/synthetic.h tests/child.h $(HEADERS)
	@mkdir -p $(dir $@)
	$(SAN_CC) $(TSAN_FLAGS) -o $@ $< $(LDLIBS)
# SAN_TESTS: which C tests (all by default). CI passes SAN_TESTS="$(SAN_CI_TESTS)": the tests of
# parsers, files, threads and processes, whose bugs are memory bugs; the long numeric ones
# (layouts, recompute, SP, fp16, the model, generation) run under the sanitizers here, on demand.
SAN_TESTS ?= $(TESTS)
SAN_CI_TESTS = tests/test_header tests/test_logging tests/test_comm tests/test_ops tests/test_data tests/test_pp \
               tests/test_checkpoint tests/test_tokenizer tests/test_hostile tests/test_launch tests/test_deepspeed
test-sanitize: train_gpt preprocess build/asan/train_gpt build/asan/preprocess $(addprefix build/asan/,$(SAN_TESTS)) \
               $(addprefix build/tsan/,$(TSAN_TESTS))
	@ASAN_OPTIONS=detect_leaks=1:halt_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 MT_BIN_DIR=build/asan \
	  sh tests/run.sh $(addprefix build/asan/,$(SAN_TESTS)) $(addprefix build/tsan/,$(TSAN_TESTS))

# libFuzzer on every parser of outside data: tests/fuzz_parsers.c (JSON, config, checkpoint, .idx/.bin,
# vocabulary and merges, tracker, the trainer's flags, the DeepSpeed config) and tests/fuzz_preprocess.c (preprocess's JSON
# lines and text readers with GPT-2's real BPE, its flags), each from a seed corpus of real files;
# the inputs that once failed (tests/fuzz_cases/, tests/fuzz_cases_preprocess/) are replayed first.
# Any crash, hang (10 s), sanitizer report or out-of-bounds access fails, and libFuzzer leaves the
# input as build/fuzz/crash-*. FUZZ_SECONDS is per harness.
#   make fuzz                   30 s each (CI runs FUZZ_SECONDS=20)
#   make fuzz FUZZ_SECONDS=3600 an hour each
FUZZ_SECONDS ?= 30
# FUZZ_PER_PARSER=0 skips each parser's coverage after the run (about 20 s a parser; CI does)
FUZZ_PER_PARSER ?= 1
build/fuzz/fuzz_parsers: tests/fuzz_parsers.c $(HEADERS)
	@mkdir -p build/fuzz
	$(SAN_CC) -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -std=c11 -I. -o $@ $< $(LDLIBS)
build/fuzz/fuzz_preprocess: tests/fuzz_preprocess.c preprocess.c $(HEADERS)
	@mkdir -p build/fuzz
	$(SAN_CC) -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -std=c11 -I. -o $@ $< $(LDLIBS)
build/fuzz/seed_parsers/.ready: tests/fuzz_seeds.py train_gpt
	@mkdir -p build/fuzz && rm -rf build/fuzz/ck
	$(PYTHON) tests/fuzz_seeds.py --dataset build/fuzz/data
	./train_gpt --num-layers 2 --hidden-size 16 --num-attention-heads 2 --seq-length 16 --vocab-size 101 \
	  --micro-batch-size 2 --train-iters 2 --data-path build/fuzz/data --save build/fuzz/ck --eval-iters 0 > /dev/null
	$(PYTHON) tests/fuzz_seeds.py build/fuzz/seed_parsers build/fuzz/ck/iter_0000002/mp_rank_00/model_optim_rng.safetensors \
	  build/fuzz/data
	@touch $@
build/fuzz/seed_preprocess/.ready: tests/fuzz_seeds.py
	$(PYTHON) tests/fuzz_seeds.py --preprocess build/fuzz/seed_preprocess
	@touch $@
fuzz: build/fuzz/fuzz_parsers build/fuzz/fuzz_preprocess build/fuzz/seed_parsers/.ready build/fuzz/seed_preprocess/.ready
	@sh tests/run_fuzz.sh $(FUZZ_SECONDS) $(FUZZ_PER_PARSER)

# the trainer killed at random points (mostly mid-save) KILLS times: --load always resumes from a
# complete checkpoint, an older one stays byte-identical, the next start removes the temporaries;
# then a save into a full disk (a file-size limit, and a full tmpfs where the user may mount one)
# fails with one line, leaves nothing behind and keeps the last checkpoint
#   make test-kill              20 kills, about 10 s (CI)
KILLS ?= 20
test-kill: train_gpt
	@sh tests/kill_test.sh $(KILLS)

# outside references (PyPI, in a local virtual environment made here; nothing at run time):
# GPT-2 in JAX checks logits, loss and every gradient; tiktoken checks the tokenizer;
# safetensors reads our checkpoints; our Hugging Face export runs as transformers runs GPT-2, and a
# GPT-2 written by a numpy reference imports (--import-hf) and decodes to the reference's logits;
# TensorBoard's own reader reads our event files (whole and cut at every byte)
$(VENV)/.ready: Makefile
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check jax numpy tiktoken safetensors tensorboard matplotlib
	@touch $@
test-ref: $(VENV)/.ready tests/test_ref tests/tok_ids tests/test_checkpoint tests/test_logging tests/test_generate train_gpt preprocess
	@mkdir -p build
	@sh tests/run_ref.sh

# on the GPU machine: every kernel against its CPU twin, then 20 training steps of the GPU build
# against the CPU build (1 GPU; TP=2, DP=2 and PP=2 on 2 GPUs); sequence parallel (tests/gpu/test_sp.sh:
# its kernels on 1 GPU, training against the CPU build and memory on 2 and 4); then two processes
# of one GPU each (tests/gpu/test_multinode.sh: torchrun-style, NCCL over sockets) against one
# process of two threads
tests/gpu/test_kernels: tests/gpu/test_kernels.cu kernels.cuh tests/harness.h $(HEADERS)
	$(NVCC) $(NVCCFLAGS) -x cu -o $@ tests/gpu/test_kernels.cu -lm -lpthread -lnccl
# the wgmma rung alone: every layout and odd shape against a double-precision reference, then
# timed beside cuBLAS (linked here only, as the yardstick; the product never links it)
tests/gpu/test_gemm_wgmma: tests/gpu/test_gemm_wgmma.cu kernels.cuh $(HEADERS)
	$(NVCC) $(NVCCFLAGS) -std=c++17 -o $@ tests/gpu/test_gemm_wgmma.cu -lcublas -lnccl
# what a decode kernel boundary costs (a measurement, not a test: docs/perf.md, session 45)
tests/gpu/boundary_bench: tests/gpu/boundary_bench.cu
	$(NVCC) $(NVCCFLAGS) -o $@ tests/gpu/boundary_bench.cu
# how long a decode GEMV's read of its input row takes, four ways (a measurement: perf.md, session 47)
tests/gpu/input_read_bench: tests/gpu/input_read_bench.cu
	$(NVCC) $(NVCCFLAGS) -o $@ tests/gpu/input_read_bench.cu
# a decode step kernel by kernel as the GPU ran it (CUPTI, injected: tests/gpu/decode_timeline.sh);
# CUPTI's header and library from the toolkit that holds nvcc
CUDA_DIR ?= $(patsubst %/bin/,%,$(dir $(shell command -v $(NVCC))))
tests/gpu/libkernel_timeline.so: tests/gpu/kernel_timeline.c
	$(CC) -O2 -std=c11 -Wall -Wextra -shared -fPIC -I$(CUDA_DIR)/include -o $@ tests/gpu/kernel_timeline.c \
	  -L$(CUDA_DIR)/lib64 -L$(CUDA_DIR)/extras/CUPTI/lib64 -lcupti
# generation on the GPU: tests/test_generate.c built as the GPU build (its --hf-logits mode decodes on
# the device), then tests/gpu/test_generate.sh: GPU logits against the CPU build, transformers' greedy
# continuation of an imported model, and the benchmark against transformers (about 4 minutes)
#   make test-gpu-generate      (GPU machine, with torch and transformers)
tests/gpu/test_generate_cuda: tests/test_generate.c kernels.cuh tests/harness.h $(HEADERS)
	$(NVCC) $(NVCCFLAGS) -x cu -o $@ tests/test_generate.c -lm -lpthread -lnccl
test-gpu-generate: train_gpt train_gpt_cuda tests/test_generate tests/gpu/test_generate_cuda
	@sh tests/gpu/test_generate.sh
tests/gpu/compare_logs: tests/gpu/compare_logs.c
	$(CC) -O2 -std=c11 -Wall -Wextra -o $@ $< -lm
test-gpu: train_gpt preprocess train_gpt_cuda tests/gpu/test_kernels tests/gpu/test_gemm_wgmma tests/gpu/compare_logs
	@mkdir -p build
	@./tests/gpu/test_kernels 2>&1 | tee build/test_kernels.log; \
	 ./tests/gpu/test_gemm_wgmma 2>&1 | tee build/test_gemm_wgmma.log; \
	 sh tests/gpu/test_train.sh 2>&1 | tee build/test_train.log; \
	 sh tests/gpu/test_sp.sh 2>&1 | tee build/test_sp_gpu.log; \
	 sh tests/gpu/test_fp16.sh 2>&1 | tee build/test_fp16_gpu.log; \
	 sh tests/gpu/test_memory.sh 2>&1 | tee build/test_memory_gpu.log; \
	 sh tests/gpu/test_offload.sh 2>&1 | tee build/test_offload_gpu.log; \
	 sh tests/test_docs.sh --gpu 2>&1 | tee build/test_docs_gpu.log; \
	 sh tests/gpu/test_multinode.sh 2>&1 | tee build/test_multinode.log; \
	 sh tests/run_logs.sh build/test_kernels.log build/test_gemm_wgmma.log build/test_train.log build/test_sp_gpu.log \
	   build/test_fp16_gpu.log build/test_memory_gpu.log build/test_offload_gpu.log build/test_docs_gpu.log \
	   build/test_multinode.log

# on the GPU machine, one run: the GEMMs against cuBLAS, attention against PyTorch SDPA, the GPT-2 small
# step (1 GPU, TP=2, DP=2) against PyTorch compiled and eager: tokens/s, ms/step, MFU, memory
bench: preprocess train_gpt_cuda tests/gpu/test_kernels tests/gpu/test_gemm_wgmma
	@sh tests/gpu/bench.sh

# the tokenizer against OpenAI's tiktoken on the bundled corpus: MB/s and tokens/s, 1 and 2 threads
bench-tokenizer: $(VENV)/.ready preprocess
	$(VENV)/bin/python tests/bench_tokenizer.py

# -O0 -g: for gdb, as their own binaries, so ./train_gpt (and make run) stay the fast -O3 build.
# gdb's thread 1 is the main thread; the ranks are the threads after it, named "r2 tp0 dp1 pp0"
# (`info threads`). docs/debugging.md walks through a 2x2 run.
DEBUG_CFLAGS = -O0 -g -std=c11 -Wall -Wextra -pedantic -I.
debug: train_gpt_debug preprocess_debug
train_gpt_debug: train_gpt.c $(HEADERS)
	$(CC) $(DEBUG_CFLAGS) -o $@ train_gpt.c $(LDLIBS)
preprocess_debug: preprocess.c $(HEADERS)
	$(CC) $(DEBUG_CFLAGS) -o $@ preprocess.c $(LDLIBS)
# -G: device code unoptimised and steppable in cuda-gdb (much slower kernels; for finding bugs)
debug-cuda: train_gpt_cuda_debug
train_gpt_cuda_debug: train_gpt.c kernels.cuh $(HEADERS)
	$(NVCC) -O0 -g -G $(NVCC_ARCH) -x cu -Xcompiler -Wall -o $@ train_gpt.c -lnccl

clean:
	rm -f train_gpt_debug preprocess_debug train_gpt_cuda_debug
	rm -rf build train_gpt preprocess train_gpt_cuda $(TESTS) tests/tok_ids tests/test_ref tests/gpu/test_kernels tests/gpu/test_gemm_wgmma tests/gpu/compare_logs tests/gpu/test_generate_cuda

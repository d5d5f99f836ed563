"""tests/check_safetensors.py - our checkpoints read by the reference safetensors library.

make test-ref runs it after tests/test_checkpoint wrote build/ckpt_ref/ (a TP=2 checkpoint at
iteration 2) and build/ckpt_ref/rank0_params.f32 (what megatron.h loaded back from rank 0's file).
Checks: safetensors (PyPI) opens every file; dtypes, shapes and metadata are as documented in
megatron.h section 10; rank 0's parameters, concatenated in file order, equal the raw dump bit for
bit; the two TP shards of qkvw together have the full 3C rows. Prints "N passed, N failed".
"""
import json
import os
import struct
import sys

import numpy as np
from safetensors.numpy import load_file
from safetensors import safe_open

ROOT = "build/ckpt_ref"
passed = failed = 0


def check(ok, what):
    global passed, failed
    print(("OK     " if ok else "NOT OK ") + what)
    if ok:
        passed += 1
    else:
        failed += 1


latest = open(os.path.join(ROOT, "latest_checkpointed_iteration.txt")).read().strip()
check(latest == "2", f"latest_checkpointed_iteration.txt says {latest!r}")
files = [os.path.join(ROOT, "iter_0000002", f"mp_rank_{tp:02d}", "model_optim_rng.safetensors") for tp in (0, 1)]
tensors = []
for path in files:
    t = load_file(path)
    tensors.append(t)
    with safe_open(path, framework="numpy") as f:
        meta = f.metadata()
    check(meta.get("iteration") == "2" and meta.get("tensor_model_parallel_size") == "2",
          f"{path}: metadata iteration={meta.get('iteration')} tp={meta.get('tensor_model_parallel_size')}")
    check(all(v.dtype == np.float32 for v in t.values()), f"{path}: {len(t)} tensors, all float32")
    names = set(t)
    want = {"wte", "wpe", "ln1w", "qkvw", "attprojw", "fcw", "fcprojw", "lnfw", "lnfb",
            "optimizer.exp_avg.qkvw", "optimizer.exp_avg_sq.wte"}
    check(want <= names, f"{path}: has {sorted(want - names) or 'every expected name'}")
    check(all(np.isfinite(v).all() for v in t.values()), f"{path}: every value finite")

# the order of the file's data is the carve order: parameters first, concatenated = the dump
path0 = files[0]
with open(path0, "rb") as fh:
    n = struct.unpack("<Q", fh.read(8))[0]
    header = json.loads(fh.read(n))
params = [(k, v) for k, v in header.items() if k != "__metadata__" and not k.startswith("optimizer.")]
params.sort(key=lambda kv: kv[1]["data_offsets"][0])
ours = np.concatenate([tensors[0][k].reshape(-1) for k, _ in params])
dump = np.fromfile(os.path.join(ROOT, "rank0_params.f32"), dtype=np.float32)
check(ours.shape == dump.shape and np.array_equal(ours.view(np.uint32), dump.view(np.uint32)),
      f"rank 0 parameters read by safetensors == megatron.h's loaded values ({dump.size} floats, bit for bit)")

# TP shards: qkvw is (L, 3*C/TP, C) per rank; together (L, 3C, C)
q0, q1 = tensors[0]["qkvw"], tensors[1]["qkvw"]
C = q0.shape[-1]
check(q0.shape == q1.shape and q0.shape[1] * 2 == 3 * C, f"qkvw shards {q0.shape} + {q1.shape} make 3C = {3 * C} rows")
check(tensors[0]["wpe"].shape == tensors[1]["wpe"].shape and np.array_equal(tensors[0]["wpe"], tensors[1]["wpe"]),
      "wpe (replicated over TP) is identical in both shards")

print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)

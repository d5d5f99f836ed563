"""tests/check_hf_import.py - our --import-hf, against a GPT-2 written by a reference.

make test-ref runs it. This script knows nothing of megatron.h: it draws a random GPT-2
(numpy), writes it as transformers' save_pretrained does (config.json, and model.safetensors
through the safetensors library, names with GPT2LMHeadModel's "transformer." prefix, Conv1D
weights stored (in, out), no lm_head.weight since it is tied), computes GPT-2's forward in
float64 for a token sequence, then asks tests/test_generate --hf-logits to import the directory
(TP=2) and decode the same tokens one per step through the KV cache. Our fp32 logits must agree
within 1e-5 of their scale. Prints "N passed, N failed".
"""
import json
import os
import subprocess
import sys

import numpy as np
from safetensors.numpy import save_file

import gpt2_numpy
from gpt2_numpy import check

ROOT = "build/hf_import_ref"


L, C, NH, V, maxT, T = 2, 64, 4, 300, 32, 20
F = 4 * C
rng = np.random.default_rng(13)
w = {"transformer.wte.weight": rng.normal(0, 0.1, (V, C)), "transformer.wpe.weight": rng.normal(0, 0.05, (maxT, C)),
     "transformer.ln_f.weight": 1 + rng.normal(0, 0.1, C), "transformer.ln_f.bias": rng.normal(0, 0.1, C)}
for l in range(L):
    p = f"transformer.h.{l}."
    w.update({p + "ln_1.weight": 1 + rng.normal(0, 0.1, C), p + "ln_1.bias": rng.normal(0, 0.1, C),
              p + "attn.c_attn.weight": rng.normal(0, 0.1, (C, 3 * C)), p + "attn.c_attn.bias": rng.normal(0, 0.1, 3 * C),
              p + "attn.c_proj.weight": rng.normal(0, 0.1, (C, C)), p + "attn.c_proj.bias": rng.normal(0, 0.1, C),
              p + "ln_2.weight": 1 + rng.normal(0, 0.1, C), p + "ln_2.bias": rng.normal(0, 0.1, C),
              p + "mlp.c_fc.weight": rng.normal(0, 0.1, (C, F)), p + "mlp.c_fc.bias": rng.normal(0, 0.1, F),
              p + "mlp.c_proj.weight": rng.normal(0, 0.1, (F, C)), p + "mlp.c_proj.bias": rng.normal(0, 0.1, C)})
w = {k: v.astype(np.float32) for k, v in w.items()}
os.makedirs(ROOT, exist_ok=True)
save_file(w, f"{ROOT}/model.safetensors", metadata={"format": "pt"})
json.dump({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": V, "n_positions": maxT,
           "n_embd": C, "n_layer": L, "n_head": NH, "n_inner": None, "activation_function": "gelu_new",
           "layer_norm_epsilon": 1e-05, "tie_word_embeddings": True}, open(f"{ROOT}/config.json", "w"))
tokens = rng.integers(0, V, T).astype(np.int32)
np.concatenate([[T], tokens]).astype(np.int32).tofile(f"{ROOT}/tokens.bin")


d = {k.removeprefix("transformer."): v.astype(np.float64) for k, v in w.items()}
ref = gpt2_numpy.forward(d, tokens[None, :], L, NH)[0]

r = subprocess.run(["./tests/test_generate", "--hf-logits", ROOT, f"{ROOT}/tokens.bin", f"{ROOT}/ours.bin"],
                   capture_output=True, text=True)
said = (r.stdout.strip().splitlines() or [""])[-1] if r.returncode == 0 else r.stderr.strip()
check(r.returncode == 0, f"tests/test_generate --hf-logits imported and decoded: {said}")
if r.returncode == 0:
    both = np.fromfile(f"{ROOT}/ours.bin", dtype=np.float32).reshape(T + 1, V).astype(np.float64)
    ours, prefill = both[:T], both[T]
    rel_p = np.abs(prefill - ref[-1]).max() / np.abs(ref[-1]).max()
    check(rel_p <= 1e-5, f"the last position's logits after one prefill of all {T} tokens: rel diff {rel_p:.2e}")
    rel = np.abs(ours - ref).max() / np.abs(ref).max()
    check(bool(np.isfinite(ours).all()) and rel <= 1e-5,
          f"logits of the imported model, decoded through the KV cache at TP=2, vs the reference GPT-2: "
          f"norm-wise rel diff {rel:.2e} (tol 1e-5, fp32 vs float64)")
    check(bool((ours.argmax(-1) == ref.argmax(-1)).all()), "the greedy token at every position is the reference's")
print(f"{gpt2_numpy.passed} passed, {gpt2_numpy.failed} failed")
sys.exit(1 if gpt2_numpy.failed else 0)

"""tests/check_hf_export.py - our Hugging Face export, run the way transformers runs GPT-2.

make test-ref runs it after tests/test_checkpoint wrote build/hf_ref/ (model.safetensors and
config.json exported from a TP=2 checkpoint) and build/hf_ref/ours_logits.bin (our logits for a
token sequence, from the same weights on one rank). This script knows nothing of megatron.h: it
reads the file with the safetensors library and computes GPT2LMHeadModel's forward as
transformers' modeling_gpt2 does it (Conv1D: x @ W + b with W stored (in, out); c_attn's output
split into q | k | v; gelu_new; LayerNorm eps from config.json; the LM head tied to wte), in
float64. Our fp32 logits must agree within 1e-5 of their scale. Prints "N passed, N failed".
"""
import json
import sys

import numpy as np
from safetensors.numpy import load_file
from safetensors import safe_open

import gpt2_numpy
from gpt2_numpy import check

ROOT = "build/hf_ref"


cfg = json.load(open(f"{ROOT}/config.json"))
w = {k: v.astype(np.float64) for k, v in load_file(f"{ROOT}/model.safetensors").items()}
with safe_open(f"{ROOT}/model.safetensors", framework="numpy") as f:
    meta = f.metadata()
check(meta.get("format") == "pt", "metadata format is 'pt' (transformers refuses other formats)")
L, C, NH, V, F = cfg["n_layer"], cfg["n_embd"], cfg["n_head"], cfg["vocab_size"], cfg["n_inner"]
names = {"wte.weight": (V, C), "wpe.weight": (cfg["n_positions"], C), "ln_f.weight": (C,), "ln_f.bias": (C,)}
for l in range(L):
    names.update({f"h.{l}.ln_1.weight": (C,), f"h.{l}.ln_1.bias": (C,), f"h.{l}.attn.c_attn.weight": (C, 3 * C),
                  f"h.{l}.attn.c_attn.bias": (3 * C,), f"h.{l}.attn.c_proj.weight": (C, C), f"h.{l}.attn.c_proj.bias": (C,),
                  f"h.{l}.ln_2.weight": (C,), f"h.{l}.ln_2.bias": (C,), f"h.{l}.mlp.c_fc.weight": (C, F),
                  f"h.{l}.mlp.c_fc.bias": (F,), f"h.{l}.mlp.c_proj.weight": (F, C), f"h.{l}.mlp.c_proj.bias": (C,)})
check(set(w) == set(names), f"tensor names are GPT-2's ({len(w)} tensors)")
check(all(w[k].shape == s for k, s in names.items() if k in w), "shapes are GPT-2's (Conv1D weights as (in, out))")

raw = np.fromfile(f"{ROOT}/ours_logits.bin", dtype=np.int32)
B, T, Vl = raw[:3]
tokens = raw[3:3 + B * T].reshape(B, T)
ours = raw[3 + B * T:].view(np.float32).reshape(B, T, Vl).astype(np.float64)
check(Vl == V, f"our logits cover the {V} real vocabulary entries")


ref = gpt2_numpy.forward(w, tokens, L, NH, cfg["layer_norm_epsilon"])
rel = np.abs(ours - ref).max() / np.abs(ref).max()
check(bool(np.isfinite(ours).all()) and rel <= 1e-5,
      f"logits: transformers' GPT-2 on the export vs megatron.h, norm-wise rel diff {rel:.2e} (tol 1e-5, fp32 vs float64)")
print(f"{gpt2_numpy.passed} passed, {gpt2_numpy.failed} failed")
sys.exit(1 if gpt2_numpy.failed else 0)

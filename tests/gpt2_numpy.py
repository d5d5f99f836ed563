"""tests/gpt2_numpy.py - GPT-2's forward in numpy (float64), as transformers' modeling_gpt2 computes
it, and the OK / NOT OK counter of the reference scripts (tests/check_hf_export.py,
tests/check_hf_import.py). Knows nothing of megatron.h.

w: GPT2Model's tensors without the "transformer." prefix (wte.weight, h.0.ln_1.weight, ...), Conv1D
weights stored (in, out); tokens (B, T). Returns the logits (B, T, V), the LM head tied to wte.
"""
import numpy as np

passed = failed = 0


def check(ok, what):
    global passed, failed
    print(("OK     " if ok else "NOT OK ") + what)
    if ok:
        passed += 1
    else:
        failed += 1


def layer_norm(x, g, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * g + b


def gelu_new(x):   # transformers' NewGELUActivation
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def forward(w, tokens, n_layer, n_head, eps=1e-5):
    B, T = tokens.shape
    C = w["wte.weight"].shape[1]
    hs = C // n_head
    h = w["wte.weight"][tokens] + w["wpe.weight"][np.arange(T)]
    mask = np.tril(np.ones((T, T), dtype=bool))
    for l in range(n_layer):
        p = f"h.{l}."
        a = layer_norm(h, w[p + "ln_1.weight"], w[p + "ln_1.bias"], eps)
        qkv = a @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]          # Conv1D
        q, k, v = np.split(qkv, 3, axis=-1)
        q, k, v = (t.reshape(B, T, n_head, hs).transpose(0, 2, 1, 3) for t in (q, k, v))
        s = np.where(mask, q @ k.transpose(0, 1, 3, 2) / np.sqrt(hs), -np.inf)
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        y = (s @ v).transpose(0, 2, 1, 3).reshape(B, T, C)
        h = h + y @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
        m = gelu_new(layer_norm(h, w[p + "ln_2.weight"], w[p + "ln_2.bias"], eps) @ w[p + "mlp.c_fc.weight"]
                     + w[p + "mlp.c_fc.bias"])
        h = h + m @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
    return layer_norm(h, w["ln_f.weight"], w["ln_f.bias"], eps) @ w["wte.weight"].T   # tied LM head

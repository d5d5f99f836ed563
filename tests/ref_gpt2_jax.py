#!/usr/bin/env python3
"""Outside-reference check of megatron.h's GPT-2 forward/backward, written in JAX.

Usage:  .venv/bin/python tests/ref_gpt2_jax.py CASE_FILE

The C test writes CASE_FILE: the model's weights, a batch of tokens, and what the C code
computed from them (logits, loss, the gradient of every parameter). This script recomputes
the same things in float64 with JAX -- the gradients by jax.grad, not by hand -- and compares.

Case file (little endian):
    char    magic[8] = "MTREF001"
    int32   L, C, NH, V, Vp, maxT, B, T, F
    float32 params, llm.c's order, per-layer tensors stacked over L (see PARAM_SHAPES)
    int32   inputs (B, T), targets (B, T)
    float32 logits (B, T, V), loss (1), then gradients of all params (same order and shapes)

Each tensor passes if  max|ours - ref| / max|ref| <= 1e-5  (fp32 arithmetic against exact
math, relative to the tensor's scale). NaN never passes. Exit status 1 if any check fails.
"""
import sys

import numpy as np
import jax
import jax.numpy as jnp

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_platforms", "cpu")

MAGIC = b"MTREF001"
TOL = 1e-5
PARAM_NAMES = ["wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
               "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"]


def param_shapes(L, C, V, Vp, maxT, F):
    return {
        "wte": (Vp, C), "wpe": (maxT, C),
        "ln1w": (L, C), "ln1b": (L, C), "qkvw": (L, 3 * C, C), "qkvb": (L, 3 * C),
        "attprojw": (L, C, C), "attprojb": (L, C),
        "ln2w": (L, C), "ln2b": (L, C), "fcw": (L, F, C), "fcb": (L, F),
        "fcprojw": (L, C, F), "fcprojb": (L, C),
        "lnfw": (C,), "lnfb": (C,),
    }


# ----------------------------------------------------------------------------- the model

def layernorm(x, w, b, eps=1e-5):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean((x - mean) ** 2, axis=-1, keepdims=True)     # biased variance
    return (x - mean) / jnp.sqrt(var + eps) * w + b


def gelu_tanh(x):
    return 0.5 * x * (1.0 + jnp.tanh(jnp.sqrt(2.0 / jnp.pi) * (x + 0.044715 * x ** 3)))


def attention(h, qkvw, qkvb, NH):
    B, T, C = h.shape
    hs = C // NH
    qkv = h @ qkvw.T + qkvb                                    # (B, T, 3C): [Q | K | V]
    q, k, v = qkv[..., :C], qkv[..., C:2 * C], qkv[..., 2 * C:]
    # head n uses columns n*hs:(n+1)*hs of each of Q, K, V
    q = q.reshape(B, T, NH, hs).transpose(0, 2, 1, 3)          # (B, NH, T, hs)
    k = k.reshape(B, T, NH, hs).transpose(0, 2, 1, 3)
    v = v.reshape(B, T, NH, hs).transpose(0, 2, 1, 3)
    att = (q @ k.transpose(0, 1, 3, 2)) / jnp.sqrt(float(hs))  # (B, NH, T, T)
    causal = jnp.tril(jnp.ones((T, T), dtype=bool))
    att = jnp.where(causal, att, -jnp.inf)
    att = jax.nn.softmax(att, axis=-1)
    y = att @ v                                                # (B, NH, T, hs)
    return y.transpose(0, 2, 1, 3).reshape(B, T, C)            # heads concatenated in order


def forward(p, inputs, targets, NH, V):
    """Returns (loss, logits[..., :V])."""
    T = inputs.shape[1]
    L = p["ln1w"].shape[0]
    x = p["wte"][inputs] + p["wpe"][:T]
    for l in range(L):
        h = layernorm(x, p["ln1w"][l], p["ln1b"][l])
        y = attention(h, p["qkvw"][l], p["qkvb"][l], NH)
        x = x + y @ p["attprojw"][l].T + p["attprojb"][l]
        h = layernorm(x, p["ln2w"][l], p["ln2b"][l])
        m = gelu_tanh(h @ p["fcw"][l].T + p["fcb"][l])
        x = x + m @ p["fcprojw"][l].T + p["fcprojb"][l]
    h = layernorm(x, p["lnfw"], p["lnfb"])
    logits = h @ p["wte"].T                                    # (B, T, Vp)
    logits = logits[..., :V]                                   # padded entries excluded
    logp = jax.nn.log_softmax(logits, axis=-1)
    nll = -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    return jnp.mean(nll), logits


def reference(params, inputs, targets, NH, V):
    """float64 loss, logits (B,T,V) and gradients of every parameter."""
    p = {k: jnp.asarray(v, dtype=jnp.float64) for k, v in params.items()}
    inputs = jnp.asarray(inputs)
    targets = jnp.asarray(targets)
    f = jax.value_and_grad(lambda q: forward(q, inputs, targets, NH, V), has_aux=True)
    (loss, logits), grads = f(p)
    return (float(loss), np.asarray(logits),
            {k: np.asarray(g) for k, g in grads.items()})


# ----------------------------------------------------------------------------- the file

def read_case(path):
    with open(path, "rb") as fh:
        data = fh.read()
    if len(data) < 8 + 9 * 4:
        sys.exit(f"{path}: file too short ({len(data)} bytes) to hold the header")
    if data[:8] != MAGIC:
        sys.exit(f"{path}: bad magic {data[:8]!r}, expected {MAGIC!r}")
    L, C, NH, V, Vp, maxT, B, T, F = (int(v) for v in np.frombuffer(data, "<i4", 9, 8))
    hdr = dict(L=L, C=C, NH=NH, V=V, Vp=Vp, maxT=maxT, B=B, T=T, F=F)
    if min(hdr.values()) <= 0 or C % NH or V > Vp or T > maxT:
        sys.exit(f"{path}: inconsistent header {hdr}")
    shapes = param_shapes(L, C, V, Vp, maxT, F)
    nparams = sum(int(np.prod(s)) for s in shapes.values())
    expected = 8 + 9 * 4 + 4 * (nparams + 2 * B * T + B * T * V + 1 + nparams)
    if len(data) != expected:
        sys.exit(f"{path}: size {len(data)} bytes does not match the header {hdr}: "
                 f"expected {expected} bytes ({nparams} params)")
    off = 8 + 9 * 4

    def take(dtype, shape):
        nonlocal off
        n = int(np.prod(shape))
        a = np.frombuffer(data, dtype, n, off).reshape(shape)
        off += 4 * n
        return a

    params = {k: take("<f4", s) for k, s in shapes.items()}
    inputs = take("<i4", (B, T))
    targets = take("<i4", (B, T))
    logits = take("<f4", (B, T, V))
    loss = take("<f4", (1,))
    grads = {k: take("<f4", s) for k, s in shapes.items()}
    assert off == len(data)
    if inputs.min() < 0 or inputs.max() >= V or targets.min() < 0 or targets.max() >= V:
        sys.exit(f"{path}: token ids outside [0, {V})")
    return hdr, params, inputs, targets, logits, loss, grads


def compare(name, ours, ref, must_be_zero=None):
    """must_be_zero: optional (mask, what) -- entries of ours under mask must be exactly 0."""
    ours = np.asarray(ours, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert ours.shape == ref.shape, (name, ours.shape, ref.shape)
    diff = np.abs(ours - ref)
    maxdiff = float(np.max(diff)) if diff.size else 0.0
    if np.isnan(diff).any():
        maxdiff = float("nan")
    scale = float(np.max(np.abs(ref))) if ref.size else 0.0
    if scale > 0:
        rel = maxdiff / scale
    else:                       # reference all zeros: only exact zeros pass
        rel = 0.0 if maxdiff == 0 else float("inf")
    ok = bool(np.isfinite(ours).all()) and rel <= TOL   # NaN/inf never pass
    note = ""
    if must_be_zero is not None:
        mask, what = must_be_zero
        nz = int(np.count_nonzero(ours[mask]))
        if nz:
            ok = False
            note = f"  ({nz} nonzero values in {what}, which must be exactly 0)"
    print(f"{'OK    ' if ok else 'NOT OK'} {name:<10s} {str(tuple(ours.shape)):<16s} "
          f"rel err {rel:.3e}  max abs diff {maxdiff:.3e}  max|ref| {scale:.3e}{note}")
    return ok


def check(path):
    print(f"jax {jax.__version__}, numpy {np.__version__}, x64 {jax.config.jax_enable_x64}")
    hdr, params, inputs, targets, logits, loss, grads = read_case(path)
    print(f"case {path}: " + " ".join(f"{k}={v}" for k, v in hdr.items()))
    rloss, rlogits, rgrads = reference(params, inputs, targets, hdr["NH"], hdr["V"])
    results = [compare("logits", logits, rlogits), compare("loss", loss, [rloss])]
    for k in PARAM_NAMES:
        zero = None
        if k == "wte":                          # padded vocabulary rows V..Vp-1
            zero = (np.s_[hdr["V"]:], f"the padded rows {hdr['V']}..{hdr['Vp'] - 1}")
        results.append(compare("d" + k, grads[k], rgrads[k], zero))
    npass = sum(results)
    nfail = len(results) - npass
    print(f"{npass} passed, {nfail} failed")
    return nfail == 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} CASE_FILE")
    sys.exit(0 if check(sys.argv[1]) else 1)

#!/usr/bin/env python3
"""Writes a test case file for tests/ref_gpt2_jax.py without the C code, to test the checker.

Usage:  .venv/bin/python tests/make_ref_case.py OUT [--seed N] [--break WHAT]

Random weights (nonzero LN weights and biases, nonzero padded wte rows), random tokens.
'Our outputs' come from an independent plain-numpy float64 forward and a hand-written
backward (no JAX, no autodiff), rounded to float32 as the C code would write them.
Before writing, the numpy forward/backward is compared with the JAX model of
ref_gpt2_jax.py in float64 (should agree to ~1e-12).

--break makes a case that the checker must reject:
    grad      one dfcw element off by 1e-3 relative to max|dfcw|
    nan       one dqkvw element set to NaN
    logits    one logit off by 1e-3 relative to max|logits|
    loss      loss off by 1e-3 relative
    padrow    a padded row of dwte set to 1e-6 (must be exactly 0)
    truncate  file cut short by 4 bytes (size check)
"""
import argparse
import os
import sys

import numpy as np

L, C, NH, V, Vp, maxT, B, T, F = 2, 64, 4, 101, 128, 32, 2, 16, 256
NAMES = ["wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
         "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"]
GELU_S = np.sqrt(2.0 / np.pi)


def random_params(rng):
    n = lambda *s, sd: rng.normal(0.0, sd, s)
    return {
        "wte": n(Vp, C, sd=0.2), "wpe": n(maxT, C, sd=0.3),     # padded rows nonzero too
        "ln1w": 1 + n(L, C, sd=0.2), "ln1b": n(L, C, sd=0.1),
        "qkvw": n(L, 3 * C, C, sd=0.2), "qkvb": n(L, 3 * C, sd=0.1),
        "attprojw": n(L, C, C, sd=0.1), "attprojb": n(L, C, sd=0.1),
        "ln2w": 1 + n(L, C, sd=0.2), "ln2b": n(L, C, sd=0.1),
        "fcw": n(L, F, C, sd=0.1), "fcb": n(L, F, sd=0.1),
        "fcprojw": n(L, C, F, sd=0.05), "fcprojb": n(L, C, sd=0.1),
        "lnfw": 1 + n(C, sd=0.2), "lnfb": n(C, sd=0.1),
    }


# ----------------------------------------------------------------------------- numpy model

def ln_fwd(x, w, b, eps=1e-5):
    mean = x.mean(-1, keepdims=True)
    rstd = 1.0 / np.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + eps)
    xhat = (x - mean) * rstd
    return xhat * w + b, (xhat, rstd)


def ln_bwd(dy, w, cache):
    xhat, rstd = cache
    dw = (dy * xhat).reshape(-1, xhat.shape[-1]).sum(0)
    db = dy.reshape(-1, xhat.shape[-1]).sum(0)
    dxhat = dy * w
    dx = rstd * (dxhat - dxhat.mean(-1, keepdims=True)
                 - xhat * (dxhat * xhat).mean(-1, keepdims=True))
    return dx, dw, db


def gelu_fwd(x):
    return 0.5 * x * (1 + np.tanh(GELU_S * (x + 0.044715 * x ** 3)))


def gelu_bwd(x, dout):
    t = np.tanh(GELU_S * (x + 0.044715 * x ** 3))
    return dout * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * GELU_S * (1 + 3 * 0.044715 * x * x))


def attn_fwd(qkv):
    hs = C // NH
    split = lambda a: a.reshape(B, T, NH, hs).transpose(0, 2, 1, 3)
    q, k, v = split(qkv[..., :C]), split(qkv[..., C:2 * C]), split(qkv[..., 2 * C:])
    s = np.einsum("bhtd,bhsd->bhts", q, k) / np.sqrt(hs)
    s = np.where(np.tril(np.ones((T, T), bool)), s, -np.inf)
    s = s - s.max(-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(-1, keepdims=True)
    y = np.einsum("bhts,bhsd->bhtd", p, v)
    return y.transpose(0, 2, 1, 3).reshape(B, T, C), (q, k, v, p)


def attn_bwd(dy, cache):
    q, k, v, p = cache
    hs = C // NH
    dy = dy.reshape(B, T, NH, hs).transpose(0, 2, 1, 3)
    dp = np.einsum("bhtd,bhsd->bhts", dy, v)
    dv = np.einsum("bhts,bhtd->bhsd", p, dy)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True)) / np.sqrt(hs)   # masked entries: p = 0
    dq = np.einsum("bhts,bhsd->bhtd", ds, k)
    dk = np.einsum("bhts,bhtd->bhsd", ds, q)
    merge = lambda a: a.transpose(0, 2, 1, 3).reshape(B, T, C)
    return np.concatenate([merge(dq), merge(dk), merge(dv)], -1)


def lin_bwd(dout, inp, w):
    """out = inp @ w.T + b  ->  dinp, dw, db"""
    d2, i2 = dout.reshape(-1, dout.shape[-1]), inp.reshape(-1, inp.shape[-1])
    return dout @ w, d2.T @ i2, d2.sum(0)


def numpy_fwd_bwd(P, inputs, targets):
    g = {k: np.zeros_like(v) for k, v in P.items()}
    x = P["wte"][inputs] + P["wpe"][:T]
    caches = []
    for l in range(L):
        h1, c1 = ln_fwd(x, P["ln1w"][l], P["ln1b"][l])
        y, ca = attn_fwd(h1 @ P["qkvw"][l].T + P["qkvb"][l])
        x = x + y @ P["attprojw"][l].T + P["attprojb"][l]
        h2, c2 = ln_fwd(x, P["ln2w"][l], P["ln2b"][l])
        a = h2 @ P["fcw"][l].T + P["fcb"][l]
        m = gelu_fwd(a)
        x = x + m @ P["fcprojw"][l].T + P["fcprojb"][l]
        caches.append((h1, c1, y, ca, h2, c2, a, m))
    hf, cf = ln_fwd(x, P["lnfw"], P["lnfb"])
    logits = hf @ P["wte"][:V].T                          # only the V real columns
    z = logits - logits.max(-1, keepdims=True)
    prob = np.exp(z) / np.exp(z).sum(-1, keepdims=True)
    bi, ti = np.meshgrid(np.arange(B), np.arange(T), indexing="ij")
    loss = -np.mean(np.log(prob[bi, ti, targets]))

    dlogits = prob.copy()
    dlogits[bi, ti, targets] -= 1
    dlogits /= B * T
    dhf = dlogits @ P["wte"][:V]
    g["wte"][:V] += dlogits.reshape(-1, V).T @ hf.reshape(-1, C)
    dx, g["lnfw"], g["lnfb"] = ln_bwd(dhf, P["lnfw"], cf)
    for l in reversed(range(L)):
        h1, c1, y, ca, h2, c2, a, m = caches[l]
        dm, g["fcprojw"][l], g["fcprojb"][l] = lin_bwd(dx, m, P["fcprojw"][l])
        dh2, g["fcw"][l], g["fcb"][l] = lin_bwd(gelu_bwd(a, dm), h2, P["fcw"][l])
        d, g["ln2w"][l], g["ln2b"][l] = ln_bwd(dh2, P["ln2w"][l], c2)
        dx = dx + d
        dy, g["attprojw"][l], g["attprojb"][l] = lin_bwd(dx, y, P["attprojw"][l])
        dh1, g["qkvw"][l], g["qkvb"][l] = lin_bwd(attn_bwd(dy, ca), h1, P["qkvw"][l])
        d, g["ln1w"][l], g["ln1b"][l] = ln_bwd(dh1, P["ln1w"][l], c1)
        dx = dx + d
    np.add.at(g["wte"], inputs, dx)
    g["wpe"][:T] += dx.sum(0)
    return loss, logits, g


# ----------------------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--break", dest="brk", default="none",
                    choices=["none", "grad", "nan", "logits", "loss", "padrow", "truncate"])
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    P = {k: v.astype(np.float32) for k, v in random_params(rng).items()}
    inputs = rng.integers(0, V, (B, T)).astype(np.int32)
    targets = rng.integers(0, V, (B, T)).astype(np.int32)

    P64 = {k: v.astype(np.float64) for k, v in P.items()}
    loss, logits, grads = numpy_fwd_bwd(P64, inputs, targets)

    # independent check: numpy forward + hand-written backward vs the JAX model + jax.grad
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import ref_gpt2_jax as ref
    rloss, rlogits, rgrads = ref.reference(P, inputs, targets, NH, V)
    worst = 0.0
    print(f"numpy vs jax (float64): loss {loss:.15f} vs {rloss:.15f}, |diff| {abs(loss - rloss):.2e}")
    print(f"  logits   rel {np.abs(logits - rlogits).max() / np.abs(rlogits).max():.2e}")
    for k in NAMES:
        rel = np.abs(grads[k] - rgrads[k]).max() / np.abs(rgrads[k]).max()
        worst = max(worst, rel)
        print(f"  d{k:<9s} rel {rel:.2e}")
    if not (abs(loss - rloss) < 1e-12 and worst < 1e-10):
        sys.exit("numpy and jax references disagree")

    out_logits = logits.astype(np.float32)
    out_loss = np.array([loss], np.float32)
    out_grads = {k: v.astype(np.float32) for k, v in grads.items()}
    if args.brk == "grad":
        g = out_grads["fcw"]
        g[1, 7, 3] += np.float32(1e-3 * np.abs(g).max())
    elif args.brk == "nan":
        out_grads["qkvw"][0, 5, 9] = np.nan
    elif args.brk == "logits":
        out_logits[1, 3, 50] += np.float32(1e-3 * np.abs(out_logits).max())
    elif args.brk == "loss":
        out_loss *= np.float32(1 + 1e-3)
    elif args.brk == "padrow":
        out_grads["wte"][V + 3, 10] = np.float32(1e-6)

    with open(args.out, "wb") as fh:
        fh.write(b"MTREF001")
        fh.write(np.array([L, C, NH, V, Vp, maxT, B, T, F], "<i4").tobytes())
        for k in NAMES:
            fh.write(P[k].astype("<f4").tobytes())
        fh.write(inputs.astype("<i4").tobytes())
        fh.write(targets.astype("<i4").tobytes())
        fh.write(out_logits.astype("<f4").tobytes())
        fh.write(out_loss.astype("<f4").tobytes())
        for k in NAMES:
            fh.write(out_grads[k].astype("<f4").tobytes())
    if args.brk == "truncate":
        os.truncate(args.out, os.path.getsize(args.out) - 4)
    print(f"wrote {args.out} ({os.path.getsize(args.out)} bytes, break={args.brk})")


if __name__ == "__main__":
    main()

"""PyTorch yardsticks for `make bench` (the GPU machine only: PyTorch is never part of the product).

    python3 tests/gpu/torch_ref.py step [--micro-batch 16] [--iters 20] [--train-iters 40] [--eager]
                                        [--data-path build/bench_text_document]
    python3 tests/gpu/torch_ref.py attention [--micro-batch 16]
    python3 tests/gpu/torch_ref.py profile [--micro-batch 16] [--eager] [--data-path PREFIX]

step: one GPT-2 small training step as PyTorch users write it for speed: bf16 autocast, fp32
  master weights, fused AdamW (weight decay 0.1, betas 0.9/0.95), gradient clipping at 1.0,
  F.scaled_dot_product_attention (causal), the LM head tied to the embedding, vocabulary padded to
  50304, torch.compile (--eager: without). It trains as `make bench` trains ours, because a step's
  speed depends on what it trains on (docs/perf.md, session 40: after a gradient-norm spike ours
  drew more power and ran 2-7 ms slower for a few steps): the same corpus (--data-path, the
  prefix ./preprocess wrote; windows of T + 1 tokens at random offsets, a new batch every step),
  Megatron's initialisation (normal 0.02, the output layers' 0.02 / sqrt(2 L), biases 0) and
  learning-rate schedule (6e-4, 10 warm-up iterations, cosine to 6e-5 at --train-iters). Without
  --data-path (or with a missing file): one fixed batch of random tokens, as before.
  Prints one line: ms/step, tokens/s, peak allocated and reserved GiB. ms/step is timed as
  ours is (`make bench` reads the last log line of a --train-iters run at --log-interval 10): the
  mean of the last 10 of --train-iters steps, run back to back (one CUDA event pair around the
  ten, no synchronisation between them); median_ms is the older yardstick, the median of --iters
  further steps each timed alone (synchronised), printed beside it.
attention: causal attention at GPT-2 small's shape (B x 12 heads x 1024 x 64, bf16) through
  F.scaled_dot_product_attention with the flash and the cuDNN backends: forward and
  forward+backward ms and TFLOP/s (FLOPs counted as FlashAttention-2's paper: 4 B H T^2 d / 2
  for the causal forward, 2.5x that for the backward). Timed as the GPU runs it, without Python's
  launch overhead: 20 calls captured in one CUDA graph, replayed, per call (the gradients from
  torch.autograd.grad, so that nothing accumulates into .grad). Timed call by call from Python
  instead (the older yardstick, printed beside it as *_eager_ms), cuDNN's forward read 0.141 ms
  where the same kernel takes 0.083 inside PyTorch's compiled step (docs/perf.md, session 41).
profile: the step above under torch.profiler (CUDA activity only, 3 steps after warm-up): per
  kernel name, launches and ms per step, the largest first, and the sum: where PyTorch's step
  goes, to put next to ours (tests/gpu/profile_step.sh).
Output lines of step and attention are "key value" pairs that tests/gpu/bench.sh reads.
"""
import argparse
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.NH = NH
        self.ln1 = nn.LayerNorm(C)
        self.qkv = nn.Linear(C, 3 * C)
        self.proj = nn.Linear(C, C)
        self.ln2 = nn.LayerNorm(C)
        self.fc = nn.Linear(C, 4 * C)
        self.fcproj = nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.NH, C // self.NH).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, L=12, C=768, NH=12, V=50304, T=1024):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(T, C)
        self.blocks = nn.ModuleList(Block(C, NH) for _ in range(L))
        self.lnf = nn.LayerNorm(C)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.blocks:
            x = b(x)
        logits = F.linear(self.lnf(x), self.wte.weight)   # the tied LM head
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))


def timed(fn, iters, warmup):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def graphed(fn, calls=20, rounds=5):
    """ms a call of fn as the GPU runs it: `calls` calls captured in one CUDA graph, the graph
    replayed `rounds` times, each replay timed alone; the median replay over `calls`"""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):   # warm-up off the capture (workspaces, plans), as capture requires
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / calls)
    times.sort()
    return times[len(times) // 2]


def windowed(fn, first, count):
    """mean ms of steps first+1 .. first+count, run back to back (as a training loop runs them)"""
    for _ in range(first):
        fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(count):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / count


def corpus_tokens(prefix):
    """the token ids of PREFIX.bin as ./preprocess writes them (Megatron's MMIDIDX: the .idx header
    names the dtype, code 8 uint16 or 4 int32), or None where the files are missing"""
    import os
    import numpy as np
    if not prefix or not os.path.exists(prefix + ".idx") or not os.path.exists(prefix + ".bin"):
        return None
    with open(prefix + ".idx", "rb") as f:
        head = f.read(18)
    assert head[:9] == b"MMIDIDX\x00\x00", "not a Megatron .idx file: " + prefix
    code = head[17]
    return np.memmap(prefix + ".bin", dtype={8: np.uint16, 4: np.int32}[code], mode="r")


def lr_at(step, iters, max_lr=6e-4, min_lr=6e-5, warmup=10):
    """Megatron's warm-up then cosine (megatron.h mt_learning_rate), step counted from 0"""
    import math
    if step <= warmup:
        return max_lr * step / warmup
    ratio = min(1.0, (step - warmup) / max(1, iters - warmup))
    return min_lr + (max_lr - min_lr) * 0.5 * (math.cos(math.pi * ratio) + 1.0)


def make_step(args):
    import numpy as np
    torch.manual_seed(0)
    B, T, L = args.micro_batch, 1024, 12
    model = GPT(L=L).cuda()
    with torch.no_grad():   # Megatron's initialisation: biases 0, the output layers scaled
        for name, p in model.named_parameters():
            if name.endswith(".bias") and "ln" not in name:
                p.zero_()
            if name.endswith("proj.weight"):   # attention's and the MLP's output projections
                p.normal_(0.0, 0.02 / (2 * L) ** 0.5)
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    fwd = model if args.eager else torch.compile(model)
    tokens = corpus_tokens(args.data_path)
    if tokens is None:   # one fixed batch of random tokens
        print(f"torch_ref.py: no corpus at {args.data_path!r}: random tokens", file=sys.stderr)
        batches = torch.randint(0, 50257, (1, B, T + 1), device="cuda")
    else:                # every step's batch, uploaded before the timing (no host work inside it)
        steps = args.train_iters + args.iters + 10
        rng = np.random.default_rng(1234)
        starts = rng.integers(0, len(tokens) - T - 1, size=steps * B)
        win = np.stack([np.asarray(tokens[s:s + T + 1], dtype=np.int64) for s in starts])
        batches = torch.from_numpy(win).view(steps, B, T + 1).cuda()
    state = {"step": 0}

    def one():
        i = state["step"]
        state["step"] = i + 1
        data = batches[i % batches.shape[0]]
        if tokens is not None:
            for g in opt.param_groups:
                g["lr"] = lr_at(i, args.train_iters)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fwd(data[:, :-1], data[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return one


def step(args):
    B, T = args.micro_batch, 1024
    one = make_step(args)
    torch.cuda.reset_peak_memory_stats()
    ms = windowed(one, args.train_iters - 10, 10)                  # the last 10 iterations, as ours
    median_ms = timed(one, args.iters, warmup=0)                   # (already warm)
    gib = 1024.0 ** 3
    print(f"torch_step mode {'eager' if args.eager else 'compiled'} ms {ms:.2f} tokens_per_s {B * T / ms * 1e3:.0f} "
          f"median_ms {median_ms:.2f} "
          f"peak_alloc_gib {torch.cuda.max_memory_allocated() / gib:.2f} "
          f"peak_reserved_gib {torch.cuda.max_memory_reserved() / gib:.2f}")


def profile(args):
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile
    one = make_step(args)
    for _ in range(5 if args.eager else 10):
        one()
    torch.cuda.synchronize()
    steps = 3
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            one()
        torch.cuda.synchronize()
    tot = {}
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        name = e.name.replace("void ", "").split("<")[0].split("(")[0][:70]
        c = tot.setdefault(name, [0, 0.0])
        c[0] += 1
        c[1] += e.time_range.elapsed_us() / 1e3
    all_ms = sum(c[1] for c in tot.values()) / steps
    print(f"torch_profile mode {'eager' if args.eager else 'compiled'}: {all_ms:.2f} ms of kernel time a step")
    print(f"{'kernel':70s} {'calls':>6s} {'ms':>8s} {'share':>6s}")
    for n, (k, t) in sorted(tot.items(), key=lambda x: -x[1][1]):
        print(f"{n:70s} {k / steps:6.0f} {t / steps:8.3f} {100 * t / steps / all_ms:5.1f}%")


def attention(args):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    B, NH, T, d = args.micro_batch, 12, 1024, 64
    flops_fwd = 4.0 * B * NH * T * T * d / 2
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, NH, T, d, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
               for _ in range(3))
    dout = torch.randn(B, NH, T, d, device="cuda", dtype=torch.bfloat16, generator=g)

    def fwd():
        F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def both():
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        torch.autograd.grad(out, (q, k, v), dout)

    for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
        try:
            with sdpa_kernel(backend):
                fwd_eager, both_eager = timed(fwd, 20, 5), timed(both, 20, 5)
        except RuntimeError as e:   # a backend this build or GPU lacks
            why = (str(e).splitlines() or ["?"])[0][:60].replace(" ", "_")
            print(f"torch_attention backend {name} unavailable {why}")
            continue
        timing = "graph"
        try:
            with sdpa_kernel(backend):
                fwd_ms, both_ms = graphed(fwd), graphed(both)
        except RuntimeError as e:   # not capturable in this build: the call-by-call times, said so
            print(f"torch_ref.py: {name}: no CUDA graph ({str(e).splitlines()[0][:80]}): timed from Python", file=sys.stderr)
            fwd_ms, both_ms, timing = fwd_eager, both_eager, "python"
        print(f"torch_attention backend {name} fwd_ms {fwd_ms:.3f} fwd_tflops {flops_fwd / fwd_ms / 1e9:.1f} "
              f"fwdbwd_ms {both_ms:.3f} fwdbwd_tflops {3.5 * flops_fwd / both_ms / 1e9:.1f} timing {timing} "
              f"fwd_eager_ms {fwd_eager:.3f} fwdbwd_eager_ms {both_eager:.3f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["step", "attention", "profile"])
    ap.add_argument("--micro-batch", type=int, default=16)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--train-iters", type=int, default=40)
    ap.add_argument("--eager", action="store_true")
    ap.add_argument("--data-path", default="build/bench_text_document",
                    help="the corpus prefix ./preprocess wrote (make bench's); missing: random tokens")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("torch_ref.py: no CUDA device")
    torch.backends.cuda.matmul.allow_tf32 = True
    {"step": step, "attention": attention, "profile": profile}[args.what](args)


if __name__ == "__main__":
    main()

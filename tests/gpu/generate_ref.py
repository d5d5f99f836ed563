"""tests/gpu/generate_ref.py - the Hugging Face side of tests/gpu/test_generate.sh (device machine).

  make-small DIR              a random GPT2LMHeadModel (4 layers, 256 wide; weights drawn wider
                              than GPT-2's init so the logits have clear winners), saved with
                              save_pretrained; DIR/tokens.bin (int32 count, then 16 ids); and
                              transformers' greedy continuation (fp32, 32 tokens) in DIR/greedy.txt
  compare A B RTOL WHAT       two --hf-logits outputs (float32, (T+1, V)): norm-wise rel diff
  tokens OURS.jsonl DIR       our --sample-output-file against DIR/greedy.txt, token for token
  make-gpt2 DIR               GPT-2 small (GPT2Config()), random weights, saved with save_pretrained
  bench DIR B NEW OUT         transformers on GPU in bf16: eager, then compiled with a static cache:
                              greedy, NEW tokens after a 16-token prompt, batch B; one JSON line to OUT
Prints OK / NOT OK lines (the shell script counts them).
"""
import json
import sys
import time

import numpy as np


def ok(cond, what):
    print(("OK     " if cond else "NOT OK ") + what, flush=True)
    return cond


def prompt_ids(batch, length=16, seed=5):
    return np.random.default_rng(seed).integers(0, 50000, (batch, length))


cmd = sys.argv[1]
if cmd == "make-small":
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    d = sys.argv[2]
    torch.manual_seed(3)
    cfg = GPT2Config(n_layer=4, n_embd=256, n_head=4, n_positions=128, initializer_range=0.1)
    model = GPT2LMHeadModel(cfg).eval()
    model.save_pretrained(d, safe_serialization=True)
    ids = prompt_ids(1)[0]
    np.concatenate([[len(ids)], ids]).astype(np.int32).tofile(f"{d}/tokens.bin")
    with open(f"{d}/prompt.txt", "w") as f:
        f.write(" ".join(str(int(i)) for i in ids) + "\n")
    model = model.to("cuda")
    x = torch.tensor(ids, device="cuda")[None]
    with torch.no_grad():
        out = model.generate(x, max_new_tokens=32, min_new_tokens=32, do_sample=False, pad_token_id=0,
                             attention_mask=torch.ones_like(x))
    with open(f"{d}/greedy.txt", "w") as f:
        f.write(" ".join(str(int(t)) for t in out[0, len(ids):].tolist()) + "\n")
    print(f"wrote {d}: a random GPT-2 (4 x 256), its prompt and transformers' greedy continuation")
elif cmd == "compare":
    a = np.fromfile(sys.argv[2], dtype=np.float32).astype(np.float64)
    b = np.fromfile(sys.argv[3], dtype=np.float32).astype(np.float64)
    rtol = float(sys.argv[4])
    rel = np.abs(a - b).max() / np.abs(b).max() if a.shape == b.shape else float("inf")
    ok(bool(np.isfinite(a).all()) and rel <= rtol, f"{sys.argv[5]}: norm-wise rel diff {rel:.2e} (tol {rtol:g})")
elif cmd == "tokens":
    ours = [json.loads(l)["tokens"] for l in open(sys.argv[2])][0]
    want = [int(t) for t in open(f"{sys.argv[3]}/greedy.txt").read().split()]
    first = next((i for i, (x, y) in enumerate(zip(ours, want)) if x != y), None)
    ok(ours == want, f"{sys.argv[4]}: greedy continuation vs transformers' ({len(want)} tokens"
                     + (")" if first is None else f", first difference at {first}: {ours[first:first+4]} vs {want[first:first+4]})"))
elif cmd == "make-gpt2":
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config()).save_pretrained(sys.argv[2], safe_serialization=True)
    print(f"wrote {sys.argv[2]}: GPT-2 small with random weights")
elif cmd == "bench":
    import torch
    from transformers import GPT2LMHeadModel
    d, B, new, out_path = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    model = GPT2LMHeadModel.from_pretrained(d, torch_dtype=torch.bfloat16).to("cuda").eval()
    x = torch.tensor(prompt_ids(B), device="cuda")
    mask = torch.ones_like(x)

    def gen(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad():
            model.generate(x, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    rows = {}
    for mode in ("eager", "compiled"):
        try:
            if mode == "compiled":
                # a static cache makes generate() compile the decoding step itself (transformers
                # >= 4.48: fullgraph, CUDA graphs, outputs copied out of the graph's pool); wrapping
                # model.forward in torch.compile by hand reuses the graph's outputs and fails
                model.generation_config.cache_implementation = "static"
                if hasattr(model.generation_config, "disable_compile"):
                    model.generation_config.disable_compile = False
                else:   # an older transformers: compile by hand, without CUDA graphs
                    model.forward = torch.compile(model.forward, mode="max-autotune-no-cudagraphs", fullgraph=True)
            gen(new)                                  # warm-up (compiles, in the compiled mode)
            gen(new)
            ttft = sorted(gen(1) for _ in range(3))[1]
            torch.cuda.reset_peak_memory_stats()
            total = gen(new)
            rows[mode] = {"tokens_per_s": B * new / total, "ttft_ms": 1e3 * ttft,
                          "memory_gib": torch.cuda.max_memory_allocated() / 2**30}
        except Exception as e:   # an older transformers without GPT-2 static caches: said, not fatal
            rows[mode] = {"error": f"{type(e).__name__}: {str(e)[:120]}"}
        print(f"transformers {mode}, batch {B}: {rows[mode]}", flush=True)
    with open(out_path, "a") as f:
        f.write(json.dumps({"batch": B, **rows}) + "\n")

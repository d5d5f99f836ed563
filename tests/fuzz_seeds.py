"""tests/fuzz_seeds.py OUT_DIR CHECKPOINT_FILE IDX_PREFIX - the seed corpus of tests/fuzz_parsers.c.
   tests/fuzz_seeds.py --dataset PREFIX - first, a small dataset in Megatron's format (vocabulary 101)
   for the trainer to write the checkpoint that becomes a seed.
   tests/fuzz_seeds.py --preprocess OUT_DIR - the seed corpus of tests/fuzz_preprocess.c: lines of
   the bundled corpus, a text file, a damaged line, a command line of the tutorial.

Real files, each behind the byte that picks its parser (see the harness's top comment): the
configs, a checkpoint file and an indexed dataset written by our programs, the head of GPT-2's
vocabulary and merges, a tracker, and a command line of the tutorial.
"""
import json
import os
import struct
import sys

if sys.argv[1] == "--dataset":   # MMIDIDX v1, uint16 tokens, 20 documents of 40..80 tokens
    docs = [[(d * 7 + 3 * i) % 101 for i in range(40 + 2 * d)] for d in range(20)]
    with open(sys.argv[2] + ".bin", "wb") as f:
        for doc in docs:
            f.write(struct.pack("<%dH" % len(doc), *doc))
    lengths, pointers, at = [len(d) for d in docs], [], 0
    for n in lengths:
        pointers.append(at)
        at += 2 * n
    with open(sys.argv[2] + ".idx", "wb") as f:
        f.write(b"MMIDIDX\0\0" + struct.pack("<QBQQ", 1, 8, len(docs), len(docs) + 1))
        f.write(struct.pack("<%di" % len(docs), *lengths) + struct.pack("<%dq" % len(docs), *pointers))
        f.write(struct.pack("<%dq" % (len(docs) + 1), *range(len(docs) + 1)))
    sys.exit(0)
if sys.argv[1] == "--preprocess":   # bytes: reader (0 json, 1 text, 2 flags), options, the file
    out = sys.argv[2]
    os.makedirs(out, exist_ok=True)
    with open("data/corpus.jsonl", "rb") as f:
        lines = [f.readline()[:600].rstrip(b"\n") for _ in range(4)]
    docs = [json.dumps({"text": json.loads(l + b'"}' if not l.endswith(b"}") else l)["text"][:300],
                        "title": "t"}).encode() for l in lines]
    samples = {
        "json_lines": (0, 1, b"\n".join(docs) + b"\n\n" + docs[0]),
        "json_bom_bad": (0, 2, b"\xef\xbb\xbf" + docs[1] + b'\n{"text": "a\\ud800 b"}\n{"txt": 1}\n[1]\n'),
        "text_blocks": (1, 0, b"First line of a document.\nIts second line.\n\n\nA second document\r\n"),
        "text_lines": (1, 1, "caf\u00e9 \u00fc\n\t\nend\xff".encode("latin-1", "replace")),
        "flags": (2, 0, b"\0".join([b"--input", b"data/corpus.jsonl", b"--output-prefix", b"x", b"--vocab-file",
                                   b"v", b"--merge-file", b"m", b"--json-keys", b"text", b"title", b"--append-eod",
                                   b"--workers", b"2", b"--tokenizer-type", b"GPT2BPETokenizer"])),
    }
    for name, (which, options, data) in samples.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(bytes([which, options]) + data)
    sys.exit(0)
out, ckpt, idx_prefix = sys.argv[1], sys.argv[2], sys.argv[3]
os.makedirs(out, exist_ok=True)


def seed(name, which, data):
    with open(os.path.join(out, name), "wb") as f:
        f.write(bytes([which]) + data)


def read(path, limit=None):
    with open(path, "rb") as f:
        return f.read() if limit is None else f.read(limit)


seed("json_obj", 0, b'{"text": "caf\\u00e9 \\ud83d\\ude00", "n": [1, 2.5e3, -0.0, true, null]}')
for name in sorted(os.listdir("configs")):
    seed("config_" + name, 1, read(os.path.join("configs", name)))
seed("checkpoint", 2, read(ckpt))
idx, bin_ = read(idx_prefix + ".idx"), read(idx_prefix + ".bin", 4096)
seed("idx", 3, struct.pack("<I", len(idx)) + idx + bin_)
# a vocabulary of the 256 byte tokens and a few merges (the real file is 1 MB: too slow to mutate)
vocab_text = read("data/gpt2-vocab.json").decode("utf-8")
merges = b"".join(read("data/gpt2-merges.txt").splitlines(keepends=True)[:40])
vocab = json.loads(vocab_text)
small = {k: v for k, v in vocab.items() if v < 300}
small["<|endoftext|>"] = 300
v = json.dumps(small).encode()
seed("tokenizer", 4, struct.pack("<I", len(v)) + v + merges)
seed("tracker", 5, b"300\n")
# a DeepSpeed config with every key read (docs/tutorial.md's, and the scheduler and fp16 blocks)
seed("ds_config", 7, b"""{"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
 "steps_per_print": 1, "gradient_clipping": 1.0, "wall_clock_breakdown": false,
 "optimizer": {"type": "Adam", "params": {"lr": 6e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
 "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 100, "warmup_num_steps": 10,
   "warmup_type": "linear", "warmup_min_ratio": 0, "cos_min_ratio": 0.1}},
 "fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000, "hysteresis": 2,
   "min_loss_scale": 1}, "bf16": {"enabled": "auto"},
 "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": true}}}""")
seed("flags", 6, b"\0".join([b"--num-layers", b"2", b"--hidden-size", b"64", b"--num-attention-heads", b"4",
                             b"--seq-length", b"32", b"--tensor-model-parallel-size", b"2", b"--nproc-per-node",
                             b"4", b"--lr=3e-4", b"--data-path", b"0.5", b"a", b"0.5", b"b"]))

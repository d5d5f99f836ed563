#!/usr/bin/env python3
"""tests/bench_tokenizer.py - GPT-2 tokenizer speed: megatron.h vs OpenAI's tiktoken, same text.

    .venv/bin/python tests/bench_tokenizer.py [--copies 10] [--repeat 3]

The text is data/corpus.jsonl's 269 documents, repeated --copies times (10: about 40 MB), so
the timings are long enough to trust. Rows (best of --repeat runs, MB = 10^6 bytes of text):
  tiktoken encode_ordinary, one document at a time           1 thread
  tiktoken encode_ordinary_batch(num_threads=2)               2 threads
  megatron.h mt_tokenizer_encode (tests/tok_ids --bench)      1 and 2 threads, one cache each
  ./preprocess --workers 1 / 2: the whole program (read JSON, tokenize, write .bin/.idx, fsync;
      its main thread reads and writes beside the workers), MB/s of text over its elapsed time
tiktoken is built offline from data/ exactly as in tests/tiktoken_fuzz.py; both sides must
count the same tokens. The load average is printed too: other work on the machine skews rows.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tiktoken_fuzz import ROOT, build_helper, load_reference, HELPER  # noqa: E402


def best_of(repeat, fn):
    best, out = None, None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        s = time.perf_counter() - t
        best = s if best is None or s < best else best
    return best, out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--copies", type=int, default=10, help="times the corpus is repeated (default 10, ~40 MB)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per row; the best counts (default 3)")
    args = ap.parse_args()

    enc = load_reference()
    build_helper()
    preprocess = os.path.join(ROOT, "preprocess")
    if not os.access(preprocess, os.X_OK):
        sys.exit("error: ./preprocess is missing\nhint: make preprocess (or cc -O2 -I. -o preprocess preprocess.c -lm -pthread)")
    lines = open(os.path.join(ROOT, "data", "corpus.jsonl"), encoding="utf-8").read().splitlines()
    docs = [json.loads(line)["text"] for line in lines] * args.copies
    nbytes = sum(len(d.encode("utf-8")) for d in docs)
    rows = []

    s, n = best_of(args.repeat, lambda: sum(len(enc.encode_ordinary(d)) for d in docs))
    rows.append(("tiktoken encode_ordinary", 1, s, n))
    tokens = n
    s, n = best_of(args.repeat, lambda: sum(len(x) for x in enc.encode_ordinary_batch(docs, num_threads=2)))
    rows.append(("tiktoken encode_ordinary_batch", 2, s, n))

    with tempfile.TemporaryDirectory() as tmp:
        rec = os.path.join(tmp, "texts.rec")
        with open(rec, "wb") as f:
            for d in docs:
                b = d.encode("utf-8")
                f.write(b"%d\n" % len(b))
                f.write(b)
        for w in (1, 2):
            out = subprocess.run([HELPER, "--bench", "--workers", str(w), "--repeat", str(args.repeat), rec],
                                 capture_output=True, text=True, cwd=ROOT, check=True).stdout
            m = re.search(r"tokens (\d+) seconds ([0-9.]+)", out)
            rows.append(("megatron.h mt_tokenizer_encode", w, float(m.group(2)), int(m.group(1))))
        jsonl = os.path.join(tmp, "corpus.jsonl")
        with open(jsonl, "w", encoding="utf-8") as f:
            f.write("\n".join(lines * args.copies) + "\n")
        for w in (1, 2):
            def run():
                r = subprocess.run([preprocess, "--input", jsonl, "--output-prefix", os.path.join(tmp, "out"),
                                    "--vocab-file", "data/gpt2-vocab.json", "--merge-file", "data/gpt2-merges.txt",
                                    "--workers", str(w)], capture_output=True, text=True, cwd=ROOT)
                if r.returncode != 0:
                    sys.exit(f"error: ./preprocess failed: {r.stderr}")
                m = re.search(r"done: processed .*elapsed ([0-9.]+) s", r.stderr)
                t = re.search(r"documents \d+, tokens (\d+)", r.stderr)
                return float(m.group(1)), int(t.group(1))
            runs = [run() for _ in range(args.repeat)]
            s, n = min(runs)
            rows.append((f"./preprocess --workers {w} (whole program)", w, s, n))

    load = os.getloadavg()[0]
    print(f"text: data/corpus.jsonl x {args.copies} = {len(docs)} documents, {nbytes / 1e6:.1f} MB, {tokens:,} tokens; "
          f"{os.cpu_count()} CPUs, load average {load:.2f}")
    print(f"{'':46s} {'threads':>7s} {'MB/s':>8s} {'Mtok/s':>8s} {'vs tiktoken':>12s}")
    base = {1: rows[0][2], 2: rows[1][2]}
    bad = 0
    for name, threads, s, n in rows:
        if n != tokens:
            bad = 1
            print(f"error: {name} counted {n} tokens, tiktoken {tokens}")
        print(f"{name:46s} {threads:7d} {nbytes / s / 1e6:8.1f} {n / s / 1e6:8.2f} {base[threads] / s:11.2f}x")
    sys.exit(bad)


if __name__ == "__main__":
    main()

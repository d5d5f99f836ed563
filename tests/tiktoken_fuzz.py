#!/usr/bin/env python3
"""tests/tiktoken_fuzz.py - megatron.h's GPT-2 tokenizer against OpenAI's tiktoken, on random text.

    .venv/bin/python tests/tiktoken_fuzz.py [--n 20000] [--seed 0] [--show 5]

Builds tiktoken's "gpt2" encoding OFFLINE from data/gpt2-vocab.json and data/gpt2-merges.txt
(the files are checked against the SHA-256 values tiktoken itself expects; tiktoken's file
cache is switched off and only local paths are passed, so nothing is downloaded), generates
random strings (seeded) from mixed scripts, whitespace, digits, punctuation and contractions,
encodes them with the C tokenizer through tests/tok_ids (built here if missing or stale) and
compares the ids. Also:
  - tiktoken with GPT-2's original pattern vs tiktoken's own (possessive) rewrite of it: the two
    must agree, which is why megatron.h may implement either;
  - random byte strings, invalid UTF-8 included: tok_ids checks decode(encode(x)) == x;
  - data/tokenizer_cases.jsonl: the stored ids against this offline tiktoken;
  - ./preprocess (if built) on random JSON lines, broken ones included: it must keep exactly the
    lines Python's json.loads accepts (Megatron's tool reads lines with it), with tiktoken's ids.
Prints the first few mismatches and "N passed, N failed"; exits 1 on any failure.

Texts differ from tiktoken only where Unicode versions differ (megatron.h's tables are Unicode
15.0; tiktoken's regex crate may be newer), so random code points are drawn from those assigned
in Unicode 15.0 (DerivedAge.txt of the unicode-data package, when it is installed).
"""
import argparse
import hashlib
import json
import os
import random
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB = os.path.join(ROOT, "data", "gpt2-vocab.json")
MERGES = os.path.join(ROOT, "data", "gpt2-merges.txt")
CASES = os.path.join(ROOT, "data", "tokenizer_cases.jsonl")
HELPER = os.path.join(ROOT, "tests", "tok_ids")
# the SHA-256 values tiktoken's openai_public.py expects for encoder.json and vocab.bpe
VOCAB_SHA256 = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"
MERGES_SHA256 = "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"
# GPT-2's pattern as in OpenAI's encoder.py, and tiktoken's equivalent (openai_public.r50k_pat_str)
GPT2_PAT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
TIKTOKEN_PAT = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""


def load_reference(pat_str=TIKTOKEN_PAT):
    """tiktoken's gpt2 Encoding from the local files, never touching the network"""
    os.environ["TIKTOKEN_CACHE_DIR"] = ""  # "" = no cache: read_file_cached reads the path directly
    import tiktoken
    import tiktoken.load

    for path, want in ((VOCAB, VOCAB_SHA256), (MERGES, MERGES_SHA256)):
        if not os.path.isfile(path):
            sys.exit(f"error: {path} is missing\nhint: the file ships in the repository's data/ folder: git checkout -- data/ (see data/README.md)")
        got = hashlib.sha256(open(path, "rb").read()).hexdigest()
        if got != want:
            sys.exit(f"error: {path} is not GPT-2's file (sha256 {got})")
    real_read_file = tiktoken.load.read_file

    def local_only(blobpath):
        assert "://" not in blobpath, f"refusing to fetch {blobpath}"
        return real_read_file(blobpath)

    tiktoken.load.read_file = local_only
    ranks = tiktoken.load.data_gym_to_mergeable_bpe_ranks(
        vocab_bpe_file=MERGES, encoder_json_file=VOCAB,
        vocab_bpe_hash=MERGES_SHA256, encoder_json_hash=VOCAB_SHA256)
    return tiktoken.Encoding(name="gpt2_local", pat_str=pat_str, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": 50256})


def build_helper():
    """cc -O2 tests/tok_ids.c, unless tests/tok_ids is newer than its sources"""
    srcs = [os.path.join(ROOT, "tests", "tok_ids.c"), os.path.join(ROOT, "megatron.h")]
    parts = os.path.join(ROOT, "parts")
    if os.path.isdir(parts):
        srcs += [os.path.join(parts, f) for f in os.listdir(parts)]
    if os.path.exists(HELPER) and all(os.path.getmtime(HELPER) >= os.path.getmtime(s) for s in srcs):
        return
    cc = os.environ.get("CC", "cc")
    cmd = [cc, "-O2", "-std=c11", "-I" + ROOT, "-o", HELPER, srcs[0], "-lm", "-pthread"]
    print(" ".join(cmd))
    subprocess.run(cmd, check=True)


def run_helper(texts, path, extra=()):
    """texts (bytes) -> list of id lists, from tests/tok_ids; also returns its exit status"""
    with open(path, "wb") as f:
        for b in texts:
            f.write(b"%d\n" % len(b))
            f.write(b)
    r = subprocess.run([HELPER, *extra, path], capture_output=True, cwd=ROOT)
    if r.returncode not in (0, 2):
        sys.exit(f"error: tests/tok_ids failed ({r.returncode}): {r.stderr.decode(errors='replace')}")
    lines = r.stdout.decode().split("\n")
    return [[int(x) for x in line.split()] for line in lines[:len(texts)]], r.returncode, r.stderr.decode()


# ---- random text -------------------------------------------------------------------------------
def rng_ranges(*ranges):
    out = []
    for r in ranges:
        if isinstance(r, int):
            out.append(r)
        else:
            out.extend(range(r[0], r[1] + 1))
    return out


POOLS = {
    "ascii_lower": rng_ranges((0x61, 0x7A)),
    "ascii_upper": rng_ranges((0x41, 0x5A)),
    "accented": rng_ranges((0xC0, 0xD6), (0xD8, 0xF6), (0xF8, 0x17F), (0x300, 0x36F)),  # + combining marks
    "greek": rng_ranges((0x391, 0x3A1), (0x3A3, 0x3A9), (0x3B1, 0x3C9), (0x1F00, 0x1F15)),
    "cyrillic": rng_ranges((0x400, 0x45F), (0x483, 0x489)),
    "cjk": rng_ranges((0x4E00, 0x9FFF), (0x3041, 0x3096), (0x30A1, 0x30FA), (0xAC00, 0xD7A3), (0xFF21, 0xFF3A)),
    "arabic": rng_ranges((0x621, 0x64A), (0x64B, 0x652), (0x660, 0x669), (0x6F0, 0x6F9), (0x5D0, 0x5EA)),
    "devanagari": rng_ranges((0x905, 0x939), (0x93E, 0x94D), (0x966, 0x96F)),
    "emoji": rng_ranges((0x1F600, 0x1F64F), (0x1F300, 0x1F5FF), (0x1F900, 0x1F9FF), (0x1F3FB, 0x1F3FF),
                        0x200D, 0xFE0F, (0x1F1E6, 0x1F1FF), 0x2764, 0x2600),
    "space": [0x20] * 12 + [0x9, 0xA, 0xD, 0xB, 0xC, 0x85, 0xA0, 0x1680, 0x2000, 0x2005, 0x200A, 0x2028,
                            0x2029, 0x202F, 0x205F, 0x3000],
    "not_space": [0x200B, 0xFEFF, 0x180E, 0x1C, 0x1D, 0x1E, 0x1F, 0xAD, 0x0, 0x7, 0x1B, 0x7F, 0x80, 0x9F],
    "digit": rng_ranges((0x30, 0x39), (0x30, 0x39), (0xFF10, 0xFF19), 0xB2, 0xB3, 0xB9, (0x2070, 0x2079), (0xBC, 0xBE),
                        (0x2160, 0x2188), (0x2460, 0x249B), (0x660, 0x669), (0x966, 0x96F), (0x1D7CE, 0x1D7FF)),
    "punct": rng_ranges((0x21, 0x2F), (0x3A, 0x40), (0x5B, 0x60), (0x7B, 0x7E), 0x201C, 0x201D, 0x2018, 0x2019,
                        0xAB, 0xBB, 0x2014, 0x2013, 0x2026, 0xB7, 0x3001, 0x3002, 0xFF0C, 0xFF01, 0xFF1F, 0xA3, 0x20AC),
}
CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'VE", "'M", "'LL", "'D",
                "\u2019s", "'", "''", "'x", "don't", "we're", "I've", "you'll", "she'd", "I'm", "it's",
                "DON'T", "'sa", " 's", "''s", "'\n"]


def assigned_15():
    """code points assigned in Unicode 15.0 or earlier (no surrogates), or [] without the file"""
    path = "/usr/share/unicode/DerivedAge.txt"
    if not os.path.exists(path):
        return []
    out = []
    for line in open(path, encoding="utf-8"):
        line = line.split("#")[0].strip()
        if not line:
            continue
        cps, age = [x.strip() for x in line.split(";")]
        lo, _, hi = cps.partition("..")
        lo, hi = int(lo, 16), int(hi or lo, 16)
        if 0xD800 <= lo <= 0xDFFF:
            continue
        if 0xE000 <= lo and hi - lo > 1000:  # private use areas: sample a little of each
            hi = lo + 1000
        out.extend(range(lo, hi + 1))
    return out


def random_text(rnd, any_cps):
    parts = []
    for _ in range(rnd.randint(1, 14)):
        kind = rnd.random()
        if kind < 0.12:
            parts.append(rnd.choice(CONTRACTIONS))
            continue
        if kind < 0.18 and any_cps:
            pool = any_cps
        else:
            pool = POOLS[rnd.choice(list(POOLS))]
        n = 1 + int(rnd.expovariate(0.5))
        if rnd.random() < 0.02:
            n = rnd.randint(100, 700)  # long pieces: the O(n log n) BPE path
        if rnd.random() < 0.3:
            parts.append(" ")
        parts.append("".join(chr(rnd.choice(pool)) for _ in range(n)))
    return "".join(parts)


def random_bytes(rnd):
    """byte strings that are mostly not UTF-8: stray continuation bytes, truncated sequences,
    overlong forms, surrogates, bytes above F4, mixed with valid text"""
    chunks = [b"\x80", b"\xbf", b"\xc0\x80", b"\xc1\xbf", b"\xe0\x80\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80",
              b"\xf5", b"\xff", b"\xfe", b"\xe2\x82", b"\xf0\x9f\x98", b"\xc3", b" ", b"a", b"'s", b"\n\n", b"12",
              "é".encode(), "世界".encode(), "😀".encode(), b"\xe3\x80\x80"]
    out = b""
    for _ in range(rnd.randint(1, 20)):
        out += rnd.choice(chunks) if rnd.random() < 0.8 else bytes(rnd.randrange(256) for _ in range(rnd.randint(1, 5)))
    return out


# ---- ./preprocess's JSON reader against Python's json.loads (what Megatron's tool calls) ------------
def random_json_lines(rnd, n):
    """JSON lines from json.dumps (nested values, every escape, non-ASCII both raw and escaped),
    some broken on purpose: single quotes, trailing commas, bad escapes, lone surrogates, ..."""
    def rstr():
        return "".join(chr(rnd.choice([rnd.randrange(32, 127), rnd.randrange(0x80, 0x800), rnd.randrange(0x800, 0xD800),
                                       rnd.randrange(0x10000, 0x110000), 10, 9, 34, 92, 0]))
                       for _ in range(rnd.randint(0, 12)))

    def rval(d=0):
        k = rnd.random()
        if d > 3 or k < 0.3:
            return rstr()
        if k < 0.45:
            return rnd.choice([0, -1, 3.25, 1e300, -2.5e-7, 10**30, True, False, None])
        if k < 0.7:
            return [rval(d + 1) for _ in range(rnd.randint(0, 3))]
        return {rstr(): rval(d + 1) for _ in range(rnd.randint(0, 3))}

    breakers = ["\\x", "\\u12", "\x01", "01", "+1", ".5", "1.", "NaN", "-Infinity", "tru", '"', "}", "{", "]",
                "\\ud800", "\\udc00\\ud800", "  ", "\t", "1e5", "-0", "[]"]
    lines = []
    for _ in range(n):
        obj = {rstr(): rval() for _ in range(rnd.randint(0, 3))}
        if rnd.random() < 0.85:
            obj["text"] = rstr() or "x"
        s = json.dumps(obj, ensure_ascii=rnd.random() < 0.5, separators=rnd.choice([(",", ":"), (", ", ": ")]))
        r = rnd.random()
        if r < 0.04:
            s = s.replace('"text"', "'text'")
        elif r < 0.08:
            s = s[:-1] + ",}"
        elif r < 0.12:
            p = rnd.randrange(len(s))
            s = s[:p] + rnd.choice(breakers) + s[p:]
        elif r < 0.14:
            s = " " + s + " \r"
        lines.append(s)
    return lines


def check_preprocess_json(enc, rnd, n, show):
    """./preprocess --skip-bad-lines keeps exactly the lines json.loads accepts (an object with a
    string "text" that has a UTF-8 form), and their tokens are tiktoken's. Returns (passed, failed)."""
    import struct
    import tempfile
    exe = os.path.join(ROOT, "preprocess")
    if not os.access(exe, os.X_OK):
        print("skipping the JSON check: ./preprocess is not built")
        return 0, 0
    lines = random_json_lines(rnd, n)
    want = []
    for s in lines:
        try:
            o = json.loads(s)
            if not isinstance(o, dict) or not isinstance(o.get("text"), str):
                raise ValueError
            o["text"].encode("utf-8")  # a lone surrogate has no UTF-8 form
            want.append(enc.encode_ordinary(o["text"]))
        except (ValueError, UnicodeEncodeError):
            want.append(None)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "lines.jsonl")
        with open(path, "w", encoding="utf-8", errors="surrogatepass") as f:
            f.write("\n".join(lines) + "\n")
        r = subprocess.run([exe, "--input", path, "--output-prefix", os.path.join(tmp, "out"), "--vocab-file", VOCAB,
                            "--merge-file", MERGES, "--skip-bad-lines", "--workers", "2"], capture_output=True, text=True)
        if r.returncode != 0:
            print(f"JSON check: ./preprocess failed: {r.stderr}")
            return 0, 1
        idx = open(os.path.join(tmp, "out_text_document.idx"), "rb").read()
        binf = open(os.path.join(tmp, "out_text_document.bin"), "rb").read()
    S = struct.unpack("<Q", idx[18:26])[0]
    lens = struct.unpack(f"<{S}i", idx[34:34 + 4 * S])
    toks = struct.unpack(f"<{len(binf) // 2}H", binf)
    kept = [w for w in want if w is not None]
    got, at = [], 0
    for n_ in lens:
        got.append(list(toks[at:at + n_]))
        at += n_
    failed = 0 if got == kept else 1
    print(f"JSON check: {len(lines)} lines, json.loads accepts {len(kept)}, ./preprocess kept {S}: "
          f"{'same documents and tokens' if not failed else 'DIFFERENT'}")
    if failed and show:
        for i, (g, k) in enumerate(zip(got, kept)):
            if g != k:
                print(f"  first difference at kept document {i}")
                break
    return (1, 0) if not failed else (0, 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=20000, help="random strings to compare (default 20000)")
    ap.add_argument("--bytes", type=int, default=3000, help="random byte strings for the round trip (default 3000)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--show", type=int, default=5, help="mismatches to print")
    ap.add_argument("--json", type=int, default=3000, help="random JSON lines for ./preprocess (default 3000, 0: skip)")
    args = ap.parse_args()

    enc = load_reference(TIKTOKEN_PAT)
    enc_gpt2 = load_reference(GPT2_PAT)
    build_helper()
    rnd = random.Random(args.seed)
    any_cps = assigned_15()
    texts = [random_text(rnd, any_cps) for _ in range(args.n)]
    cases = [json.loads(line) for line in open(CASES, encoding="utf-8")]
    texts += [c["text"] for c in cases]
    blobs = [random_bytes(rnd) for _ in range(args.bytes)]

    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        ours, status, err = run_helper([t.encode("utf-8") for t in texts] + blobs, os.path.join(tmp, "texts.rec"))
    passed = failed = 0
    shown = 0
    for i, t in enumerate(texts):
        want = enc.encode_ordinary(t)
        want2 = enc_gpt2.encode_ordinary(t)
        problems = []
        if ours[i] != want:
            problems.append("megatron.h differs from tiktoken")
        if want2 != want:
            problems.append("tiktoken's two spellings of the pattern differ")
        if i >= args.n and want != cases[i - args.n]["ids"]:
            problems.append("offline tiktoken differs from the ids stored in tokenizer_cases.jsonl")
        if not problems:
            passed += 1
            continue
        failed += 1
        if shown < args.show:
            shown += 1
            print(f"MISMATCH text {i}: {t!r}\n  {'; '.join(problems)}")
            print(f"  ours     {ours[i]}\n  tiktoken {want}")
            print(f"  ours     {[enc.decode_single_token_bytes(x) for x in ours[i]]}")
            print(f"  tiktoken {[enc.decode_single_token_bytes(x) for x in want]}")
    # round trip on everything, invalid UTF-8 included (tok_ids reports the failures)
    bad_rt = [int(line.split()[1]) for line in err.split("\n") if line.startswith("ROUNDTRIP-FAIL")]
    for i in bad_rt[:args.show]:
        print(f"ROUNDTRIP FAIL item {i}: {(texts[i].encode() if i < len(texts) else blobs[i - len(texts)])!r}")
    rt_ok = len(texts) + len(blobs) - len(bad_rt)
    print(f"compared {len(texts)} strings with tiktoken ({args.n} random, seed {args.seed}, {len(cases)} stored cases); "
          f"round trip on {len(texts) + len(blobs)} strings ({len(blobs)} random byte strings): {len(bad_rt)} failures")
    # the summary counts checks, not strings: ids against tiktoken, round trip, preprocess's JSON
    checks_passed = checks_failed = 0
    print(f"check ids == tiktoken: {passed} strings agree, {failed} differ")
    checks_passed, checks_failed = (checks_passed + 1, checks_failed) if failed == 0 else (checks_passed, checks_failed + 1)
    print(f"check decode(encode(x)) == x: {rt_ok} ok, {len(bad_rt)} failed")
    checks_passed, checks_failed = (checks_passed + 1, checks_failed) if not bad_rt else (checks_passed, checks_failed + 1)
    if args.json:
        p, f = check_preprocess_json(enc, rnd, args.json, args.show)
        print(f"check ./preprocess on random JSON lines: {p} ok, {f} failed")
        checks_passed, checks_failed = (checks_passed + 1, checks_failed) if f == 0 else (checks_passed, checks_failed + 1)
    print(f"{checks_passed} passed, {checks_failed} failed")
    sys.exit(1 if checks_failed else 0)


if __name__ == "__main__":
    main()

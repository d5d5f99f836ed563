#!/usr/bin/env python3
"""gen_unicode_tables.py - the Unicode class table of megatron.h's GPT-2 pre-tokenizer.

GPT-2's pattern needs three character classes beyond ASCII:
    \\p{L}  letters  = general categories Lu Ll Lt Lm Lo
    \\p{N}  numbers  = general categories Nd Nl No
    \\s     the White_Space property (PropList.txt)
Everything else is "other". This script reads the Unicode Character Database and writes the
classes as one sorted step function over code points: entry k is (start << 2) | class, and the
class holds from `start` up to the next entry's start. The C side finds a code point's class with
one binary search (mt__unicode_class in megatron.h).

usage:
    python3 tools/gen_unicode_tables.py [FILE]          rewrite the generated block in FILE
    python3 tools/gen_unicode_tables.py --check [FILE]  exit 1 if FILE's block is out of date
    python3 tools/gen_unicode_tables.py --print         print the block

FILE defaults to megatron.h. The block sits
between the lines "// BEGIN GENERATED: tools/gen_unicode_tables.py" and "// END GENERATED".
Data: Debian package unicode-data (apt-get install unicode-data), /usr/share/unicode/, or
UCD_DIR=path. The UCD version is read from PropList.txt's first line and written into the block.
"""
import os
import re
import sys

UCD = os.environ.get("UCD_DIR", "/usr/share/unicode")
BEGIN = "// BEGIN GENERATED: tools/gen_unicode_tables.py"
END = "// END GENERATED"
OTHER, LETTER, NUMBER, SPACE = 0, 1, 2, 3
NAMES = {OTHER: "other", LETTER: "letter", NUMBER: "number", SPACE: "space"}


def read_lines(name):
    path = os.path.join(UCD, name)
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().split("\n")
    except OSError as e:
        sys.exit(f"error: cannot read {path}: {e}\nhint: apt-get install unicode-data, or set UCD_DIR")


def classes():
    cls = bytearray(0x110000)  # OTHER everywhere to start with
    first = None
    for line in read_lines("UnicodeData.txt"):
        if not line:
            continue
        f = line.split(";")
        cp, name, gc = int(f[0], 16), f[1], f[2]
        c = LETTER if gc in ("Lu", "Ll", "Lt", "Lm", "Lo") else NUMBER if gc in ("Nd", "Nl", "No") else OTHER
        if name.endswith(", First>"):  # a range such as CJK ideographs: First and Last lines
            first = cp
            continue
        lo = first if name.endswith(", Last>") else cp
        first = None
        for x in range(lo, cp + 1):
            cls[x] = c
    version = "?"
    for line in read_lines("PropList.txt"):
        m = re.match(r"# PropList-([0-9.]+)\.txt", line)
        if m:
            version = m.group(1)
        m = re.match(r"([0-9A-F]+)(?:\.\.([0-9A-F]+))?\s*;\s*White_Space\b", line)
        if m:
            lo = int(m.group(1), 16)
            hi = int(m.group(2) or m.group(1), 16)
            for x in range(lo, hi + 1):
                cls[x] = SPACE  # White_Space code points are all Zs/Zl/Zp/Cc: never L or N
    return cls, version


def block():
    cls, version = classes()
    steps = [(0, cls[0])]
    for cp in range(1, 0x110000):
        if cls[cp] != cls[cp - 1]:
            steps.append((cp, cls[cp]))
    counts = {c: sum(1 for x in cls if x == c) for c in NAMES}
    out = [BEGIN + f" (Unicode {version}; do not edit by hand)",
           f"// {len(steps)} steps; code points: {counts[LETTER]} letters, {counts[NUMBER]} numbers,"
           f" {counts[SPACE]} spaces, the rest other.",
           "// entry = (first code point << 2) | class; class 0 other, 1 letter (L), 2 number (N), 3 space (\\s)",
           f'#define MT__UNICODE_VERSION "{version}"',
           f"static const uint32_t mt__unicode_steps[{len(steps)}] = {{"]
    per_line = 12
    for i in range(0, len(steps), per_line):
        chunk = steps[i:i + per_line]
        out.append("    " + ",".join(f"0x{(cp << 2) | c:07x}" for cp, c in chunk) + ",")
    out.append("};")
    out.append(END)
    return "\n".join(out) + "\n"


def main():
    args = sys.argv[1:]
    check = "--check" in args
    if "--print" in args:
        sys.stdout.write(block())
        return
    files = [a for a in args if not a.startswith("--")]
    if files:
        path = files[0]
    else:
        path = "megatron.h"
        if not (os.path.exists(path) and BEGIN in open(path, encoding="utf-8").read()):
            sys.exit("megatron.h has no BEGIN GENERATED / END GENERATED block")
    text = open(path, encoding="utf-8").read()
    i = text.find(BEGIN)
    j = text.find(END, i)
    if i < 0 or j < 0:
        sys.exit(f"error: {path} has no '{BEGIN}' ... '{END}' block")
    j += len(END) + 1  # through the newline after END
    new = text[:i] + block() + text[j:]
    if check:
        if new != text:
            sys.exit(f"error: the Unicode table in {path} is out of date\nhint: python3 tools/gen_unicode_tables.py {path}")
        print(f"{path}: Unicode table up to date")
        return
    if new != text:
        with open(path, "w", encoding="utf-8") as f:
            f.write(new)
    print(f"{path}: wrote the Unicode table")


if __name__ == "__main__":
    main()

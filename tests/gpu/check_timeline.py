"""make test-gpu: the timeline of a 1-GPU run, its spans timed by CUDA events (issue 12).

usage: python3 check_timeline.py TIMELINE.json LOG MICROBATCHES ITERATIONS
Checks: valid JSON; per iteration, one forward and one backward span per micro-batch and one
optimizer span, in the schedule's order (F0 B0 F1 B1 ... for PP=1), none overlapping, none
empty; their total is below the iteration's time in the log and more than half of it (the
spans cover the kernels: the GPU is busy for most of a step). Prints one PASS/FAIL line."""
import json, re, sys

path, log, mbs, iters = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
ev = [e for e in json.load(open(path))["traceEvents"] if e.get("ph") == "X"]
work = [e for e in ev if e["cat"] in ("forward", "backward", "optimizer")]
ms = {int(i): float(m) for i, m in re.findall(r"iteration +([0-9]+)/ *[0-9]+ \|.*?elapsed time per iteration \(ms\): ([0-9.]+)",
                                              open(log).read())}
problems = []
by_it = {}
for e in work:
    by_it.setdefault(e["args"]["iteration"], []).append(e)
if len(by_it) != iters:
    problems.append(f"{len(by_it)} iterations in the timeline, expected {iters}")
for it, spans in sorted(by_it.items()):
    spans.sort(key=lambda e: e["ts"])
    kinds = [e["cat"][0] for e in spans]
    want = ["f", "b"] * mbs + ["o"]
    if kinds != want:
        problems.append(f"iteration {it}: order {''.join(kinds)}, expected {''.join(want)}")
    for a, b in zip(spans, spans[1:]):
        if a["ts"] + a["dur"] > b["ts"] + 1.0:   # 1 us: the events' resolution
            problems.append(f"iteration {it}: {a['name']} overlaps {b['name']}")
    if any(e["dur"] <= 0 for e in spans):
        problems.append(f"iteration {it}: an empty span")
    busy = sum(e["dur"] for e in spans) / 1000.0
    step = ms.get(it, 0.0)
    if not (0.5 * step < busy <= step * 1.05):
        problems.append(f"iteration {it}: spans cover {busy:.2f} ms of a {step:.2f} ms iteration")
    print(f"  iteration {it}: " + ", ".join(f"{e['name']} {e['dur'] / 1000:.2f} ms" for e in spans))
print(("PASS" if not problems else "FAIL") + f" timeline_gpu: {len(work)} work spans" + ("" if not problems else ": " + "; ".join(problems)))
sys.exit(1 if problems else 0)

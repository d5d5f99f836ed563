"""make test-ref: our TensorBoard event file and timeline, read by the outside world's readers.

tests/test_logging (make test) leaves:
  build/tb_ref/events/events.out.tfevents.*  a real ./train_gpt run's event file (TP=2 x PP=2)
  build/tb_ref/log.txt                       the same run's log (its iteration lines)
  build/test_timeline.json, .svg             the PP=2, 4 micro-batch timeline
Checks, with TensorBoard's own reader (tensorboard.backend.event_processing.event_accumulator):
  - 'lm loss' and 'learning-rate' at steps 1..12 equal the log's values (printed %.6E: rel 1e-6);
    'lm loss validation' and its ppl are there, ppl = exp(loss);
  - the file cut at EVERY byte offset loads without error and holds exactly the scalars of the
    records that are complete before the cut;
  - the timeline JSON loads with Python's json, the SVG parses as XML.
Prints "N passed, N failed".
"""
import glob
import json
import math
import os
import re
import struct
import sys
import tempfile
import xml.etree.ElementTree as ET

from tensorboard.backend.event_processing import event_accumulator

passed = failed = 0


def check(ok, what):
    global passed, failed
    if ok:
        passed += 1
        print("PASS", what)
    else:
        failed += 1
        print("FAIL", what)


def load(path):
    ea = event_accumulator.EventAccumulator(path, size_guidance={event_accumulator.SCALARS: 0})
    ea.Reload()
    return ea


def main():
    files = glob.glob("build/tb_ref/events/events.out.tfevents.*")
    if len(files) != 1:
        print("no event file: run make test (tests/test_logging) first")
        print("0 passed, 1 failed")
        return 1
    path = files[0]
    log = open("build/tb_ref/log.txt").read()
    want_loss, want_lr = {}, {}
    for m in re.finditer(r" iteration +(\d+)/ *\d+ \|.*?learning rate: (\S+) \|.*?lm loss: (\S+) \|", log):
        want_lr[int(m.group(1))] = float(m.group(2))
        want_loss[int(m.group(1))] = float(m.group(3))
    ea = load(path)
    tags = ea.Tags()["scalars"]
    for tag in ["lm loss", "learning-rate", "grad-norm", "loss-scale", "throughput", "tokens-per-second",
                "lm loss vs samples", "learning-rate vs samples", "lm loss validation", "lm loss validation ppl",
                "iteration-time", "forward-backward-time", "skipped-iterations", "nan-iterations"]:
        check(tag in tags, "tag '%s' is in the file" % tag)
    loss = {e.step: e.value for e in ea.Scalars("lm loss")}
    lr = {e.step: e.value for e in ea.Scalars("learning-rate")}
    check(sorted(loss) == list(range(1, 13)) and sorted(want_loss) == list(range(1, 13)),
          "lm loss at steps 1..12 (got %s)" % sorted(loss))
    check(all(abs(loss[s] - want_loss[s]) <= 1e-6 * abs(want_loss[s]) for s in loss if s in want_loss),
          "lm loss equals the log's")
    check(all(abs(lr[s] - want_lr[s]) <= 1e-6 * abs(want_lr[s]) + 1e-12 for s in lr if s in want_lr),
          "learning-rate equals the log's")
    samples = {e.step: e.value for e in ea.Scalars("lm loss vs samples")}
    check(sorted(samples) == [8 * s for s in range(1, 13)], "lm loss vs samples at 8, 16, ... 96")
    val = ea.Scalars("lm loss validation")
    ppl = ea.Scalars("lm loss validation ppl")
    check([e.step for e in val] == [4, 8, 12, 12], "validation at 4, 8, 12 and the end (got %s)" % [e.step for e in val])
    check(all(abs(p.value - math.exp(v.value)) <= 1e-5 * p.value for v, p in zip(val, ppl)), "ppl = exp(loss)")

    # the file cut at every byte: record boundaries from the framing, then TensorBoard's reader
    data = open(path, "rb").read()
    ends, pos = [], 0
    while pos + 12 <= len(data):
        (n,) = struct.unpack("<Q", data[pos:pos + 8])
        pos += 16 + n
        ends.append(pos)
    check(ends and ends[-1] == len(data), "the framing covers the file (%d records)" % len(ends))
    bad, errors = [], []
    with tempfile.TemporaryDirectory() as tmp:
        cut_path = os.path.join(tmp, os.path.basename(path))
        for cut in range(len(data) + 1):
            with open(cut_path, "wb") as f:
                f.write(data[:cut])
            try:
                e = load(cut_path)
                got = sum(len(e.Scalars(t)) for t in e.Tags()["scalars"])
            except Exception as ex:   # a reader error at a cut is a failure
                errors.append((cut, repr(ex)))
                continue
            complete = sum(1 for x in ends if x <= cut)
            want = max(complete - 1, 0)   # the first record is the file_version event
            if got != want:
                bad.append((cut, got, want))
    check(not errors, "cut at each of %d offsets: no reader error (%s)" % (len(data) + 1, errors[:3]))
    check(not bad, "cut at each offset: exactly the complete records' scalars (%s)" % bad[:3])

    # the timeline
    try:
        tl = json.load(open("build/test_timeline.json"))
        names = {e["tid"]: e["args"]["name"] for e in tl["traceEvents"] if e.get("name") == "thread_name"}
        check(sorted(names) == [0, 1, 2, 3], "timeline JSON: one named track per rank (%s)" % names)
        spans = [e for e in tl["traceEvents"] if e.get("ph") == "X"]
        check(all(e["dur"] >= 0 and e["tid"] in names for e in spans), "timeline JSON: %d spans" % len(spans))
    except Exception as ex:
        check(False, "timeline JSON loads: %r" % ex)
    try:
        root = ET.parse("build/test_timeline.svg").getroot()
        check(root.tag.endswith("svg") and len(root) > 10, "timeline SVG parses as XML")
    except Exception as ex:
        check(False, "timeline SVG parses as XML: %r" % ex)
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""Summarise an ncu --csv --page raw dump of a 2-iteration run: the kernels of iteration 2.

Iteration boundaries: the optimizer step launches mt_adamw_kernel once per tensor; the launches
after the last AdamW of the first cluster, up to and including the last AdamW overall, are the
second iteration. Prints per kernel name: launches, ms, share, GB, GB/s."""
import csv, sys

rows = list(csv.reader(open(sys.argv[1])))
head = rows[0]
name_i = head.index("Kernel Name")
time_i = head.index("gpu__time_duration.sum")
rd_i = head.index("dram__bytes_read.sum")
wr_i = head.index("dram__bytes_write.sum")
units = rows[1]
data = [r for r in rows[2:] if len(r) == len(head)]

def scale(u):   # ncu units to ns / bytes
    return {"nsecond": 1, "usecond": 1e3, "msecond": 1e6, "second": 1e9, "byte": 1, "Kbyte": 1e3,
            "Mbyte": 1e6, "Gbyte": 1e9}.get(u, 1)

adam = [i for i, r in enumerate(data) if "adamw" in r[name_i]]
# the first cluster of AdamW launches ends where the gap to the next AdamW is large
end1 = adam[0]
for a, b in zip(adam, adam[1:]):
    if b - a > 50:
        end1 = a
        break
else:
    end1 = adam[-1]
step = data[end1 + 1: adam[-1] + 1]
tot = {}
for r in step:
    n = r[name_i].split("(")[0].split("<")[0].replace("void ", "").strip()
    t = float(r[time_i].replace(",", "")) * scale(units[time_i]) / 1e6
    by = (float(r[rd_i].replace(",", "")) * scale(units[rd_i]) + float(r[wr_i].replace(",", "")) * scale(units[wr_i]))
    c = tot.setdefault(n, [0, 0.0, 0.0])
    c[0] += 1; c[1] += t; c[2] += by
all_ms = sum(c[1] for c in tot.values())
print(f"iteration 2: {len(step)} kernels, {all_ms:.2f} ms of kernel time (serialised under ncu)")
print(f"{'kernel':52s} {'calls':>6s} {'ms':>8s} {'share':>6s} {'GB':>8s} {'GB/s':>7s}")
for n, (k, t, by) in sorted(tot.items(), key=lambda x: -x[1][1]):
    print(f"{n[:52]:52s} {k:6d} {t:8.3f} {100*t/all_ms:5.1f}% {by/1e9:8.3f} {by/1e9/(t/1e3) if t else 0:7.0f}")

# tests/gpu/host_copy_costs.py - what a pipeline message cost when it passed through host memory
# (before session 42): each piece of a 25.2 MB message (B=8 x 1024 x 768 fp32, the bench's PP=2
# row), timed with PyTorch on the device machine. python3 tests/gpu/host_copy_costs.py (docs/perf.md)
import torch, time, numpy as np
n = 8 * 1024 * 768
d = torch.randn(n, device="cuda")
d2 = torch.empty_like(d)
pageable = torch.empty(n)            # like mt_calloc'd host.p2p
pinned = torch.empty(n, pin_memory=True)
def t(f, reps=20):
    f(); torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter(); f(); torch.cuda.synchronize(); ts.append(time.perf_counter() - t0)
    return 1e3 * float(np.median(ts))
mb = n * 4 / 1e6
for name, f in [("D2H pageable", lambda: pageable.copy_(d)), ("H2D pageable", lambda: d2.copy_(pageable)),
                ("D2H pinned", lambda: pinned.copy_(d)), ("H2D pinned", lambda: d2.copy_(pinned)),
                ("host memcpy (the mailbox's copy)", lambda: np.copyto(np.empty(n, np.float32), pageable.numpy())),
                ("D2D copy", lambda: d2.copy_(d))]:
    ms = t(f)
    print(f"{name:34s} {mb:.1f} MB  {ms:.3f} ms  {mb / ms:.1f} GB/s")

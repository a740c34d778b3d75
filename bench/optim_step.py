"""Optimizer step time: minidnn fused / unfused vs PyTorch for-loop / foreach / fused, side by side.

    python bench/optim_step.py            (GPU if CuPy sees one, else CPU numbers, said so in the output)

Parameter sets with real shapes: ResNet-18 (62 tensors, 11.7 M elements) and CIFAR ResNet-20 with projection
shortcuts (65 tensors, 0.27 M elements).  Gradients are placed where backward would put them (for a fused
minidnn optimizer: its flat gradient buffer).  GPU timing: CUDA events around blocks of back-to-back steps
after a warm-up, median of the blocks.  Bandwidth: bytes an ideal kernel moves (Adam: read p, g, m, v and
write p, m, v = 7 x 4 B per float32 element; SGD with momentum: 5 x 4 B) over the median time, and as a
fraction of this GPU's measured device-to-device copy bandwidth.
"""
from __future__ import annotations

import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import minidnn as mdn  # noqa: E402
from minidnn import optim  # noqa: E402
from minidnn.backend import devices as _dev  # noqa: E402
from minidnn.nn import Parameter  # noqa: E402

try:
    import torch
except ImportError:                       # the table then has minidnn rows only
    torch = None


def resnet18_shapes():
    shapes = [(64, 3, 7, 7), (64,), (64,)]
    c_in = 64
    for c, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        for block in range(2):
            shapes += [(c, c_in, 3, 3), (c,), (c,), (c, c, 3, 3), (c,), (c,)]
            if block == 0 and (stride != 1 or c_in != c):
                shapes += [(c, c_in, 1, 1), (c,), (c,)]
            c_in = c
    return shapes + [(1000, 512), (1000,)]


def resnet20_shapes():
    shapes = [(16, 3, 3, 3), (16,), (16,)]
    c_in = 16
    for c in (16, 32, 64):
        for block in range(3):
            shapes += [(c, c_in, 3, 3), (c,), (c,), (c, c, 3, 3), (c,), (c,)]
            if block == 0 and c_in != c:
                shapes += [(c, c_in, 1, 1), (c,), (c,)]
            c_in = c
    return shapes + [(10, 64), (10,)]


class Timer:
    """Median seconds per call of ``fn``: blocks of ``inner`` back-to-back calls, CUDA events on the GPU."""

    def __init__(self, device, warmup=10, blocks=25, inner=10):
        self.device, self.warmup, self.blocks, self.inner = device, warmup, blocks, inner

    def __call__(self, fn, sync, events=None):
        for _ in range(self.warmup):
            fn()
        sync()
        samples = []
        for _ in range(self.blocks):
            if events is not None:
                start, end = events()
                start.record()
                for _ in range(self.inner):
                    fn()
                end.record()
                end.synchronize()
                samples.append(events.elapsed(start, end) / self.inner)
            else:
                t0 = time.perf_counter()
                for _ in range(self.inner):
                    fn()
                sync()
                samples.append((time.perf_counter() - t0) / self.inner)
        return statistics.median(samples)


class CupyEvents:
    def __init__(self, cp):
        self.cp = cp

    def __call__(self):
        return self.cp.cuda.Event(), self.cp.cuda.Event()

    def elapsed(self, a, b):
        return self.cp.cuda.get_elapsed_time(a, b) / 1e3


class TorchEvents:
    def __call__(self):
        return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def elapsed(self, a, b):
        return a.elapsed_time(b) / 1e3


def minidnn_case(shapes, device, opt_name, fused, rng):
    params = [Parameter(mdn.tensor(rng.standard_normal(s).astype(np.float32), device=device)) for s in shapes]
    opt = (optim.Adam(params, lr=1e-3, fused=fused) if opt_name == "Adam"
           else optim.SGD(params, lr=1e-2, momentum=0.9, fused=fused))
    for p in params:
        g = _dev.to_device(rng.standard_normal(p.shape).astype(np.float32), device)
        if p._grad_storage is not None:        # where AccumulateGrad would write it: the flat gradient buffer
            p._grad_storage[...] = g
            g = p._grad_storage
        p.grad = p._wrap_like(g)
    return opt.step, opt


def torch_case(shapes, device, opt_name, variant, rng):
    dev = "cuda" if device != "cpu" else "cpu"
    params = [torch.tensor(rng.standard_normal(s).astype(np.float32), device=dev, requires_grad=True) for s in shapes]
    for p in params:
        p.grad = torch.tensor(rng.standard_normal(p.shape).astype(np.float32), device=dev)
    kw = {"loop": dict(foreach=False), "foreach": dict(foreach=True), "fused": dict(fused=True)}[variant]
    opt = (torch.optim.Adam(params, lr=1e-3, **kw) if opt_name == "Adam"
           else torch.optim.SGD(params, lr=1e-2, momentum=0.9, **kw))
    return opt.step


def copy_bandwidth(cp, timer):
    n = 64 * 2 ** 20                        # 256 MiB float32
    src, dst = cp.ones(n, dtype=np.float32), cp.empty(n, dtype=np.float32)
    t = timer(lambda: dst.__setitem__(Ellipsis, src), cp.cuda.Device().synchronize, CupyEvents(cp))
    return 2 * n * 4 / t


def main():
    on_gpu = _dev.cuda_is_available()
    device = "cuda" if on_gpu else "cpu"
    torch_gpu = torch is not None and (not on_gpu or torch.cuda.is_available())
    if on_gpu:
        cp = _dev.device("cuda").xp
        name = cp.cuda.runtime.getDeviceProperties(cp.cuda.runtime.getDevice())["name"]
        name = name.decode() if isinstance(name, bytes) else name
        print(f"GPU: {name}; CUDA events, warm-up 10, median of 25 blocks of 10 steps")
        timer = Timer(device)
        ours_sync, ours_events = cp.cuda.Device().synchronize, CupyEvents(cp)
        peak = copy_bandwidth(cp, timer)
        print(f"device-to-device copy bandwidth: {peak / 1e9:.0f} GB/s")
    else:
        print("NO GPU: these are CPU numbers (NumPy), wall clock, median of 5 blocks of 2 steps")
        timer = Timer(device, warmup=2, blocks=5, inner=2)
        ours_sync, ours_events, peak = (lambda: None), None, None
    if torch is not None and torch_gpu:
        torch_sync = torch.cuda.synchronize if on_gpu else (lambda: None)
        torch_events = TorchEvents() if on_gpu else None

    rows = []
    for set_name, shapes in (("ResNet-18", resnet18_shapes()), ("ResNet-20", resnet20_shapes())):
        numel = sum(int(np.prod(s)) for s in shapes)
        for opt_name, bytes_per in (("Adam", 28), ("SGD-m", 20)):
            cases = []
            for fused in (True, False):
                step, opt = minidnn_case(shapes, device, opt_name, fused, np.random.default_rng(0))
                cases.append((f"minidnn {'fused' if fused else 'unfused'}", step, ours_sync, ours_events, opt))
            if torch is not None and torch_gpu:
                for variant in ("loop", "foreach", "fused"):
                    if variant == "fused" and not on_gpu and opt_name != "Adam":
                        continue
                    try:
                        step = torch_case(shapes, device, "Adam" if opt_name == "Adam" else "SGD", variant,
                                          np.random.default_rng(0))
                    except (RuntimeError, ValueError) as exc:     # a variant this torch build lacks
                        print(f"torch {variant} {opt_name}: skipped ({exc})")
                        continue
                    cases.append((f"torch {variant}", step, torch_sync, torch_events, None))
            for label, step, sync, events, opt in cases:
                t = timer(step, sync, events)
                launches = "" if opt is None else str(opt._launches_per_step) if opt._flat_sets[0] else "-"
                bw = bytes_per * numel / t
                rows.append((set_name, len(shapes), numel, opt_name, label, t, bw,
                             None if peak is None else bw / peak, launches))
                print(f"  {set_name} {opt_name:6s} {label:16s} {t * 1e3:9.3f} ms")

    print()
    unit = "GPU" if on_gpu else "CPU"
    print(f"{'set':10s} {'tensors':>7s} {'elements':>10s} {'optimizer':9s} {'implementation':16s} "
          f"{unit + ' ms':>9s} {'GB/s':>8s} {'% copy':>7s} {'launches':>8s}")
    for set_name, n_t, numel, opt_name, label, t, bw, frac, launches in rows:
        print(f"{set_name:10s} {n_t:7d} {numel:10d} {opt_name:9s} {label:16s} {t * 1e3:9.3f} {bw / 1e9:8.1f} "
              f"{'' if frac is None else f'{100 * frac:6.1f}%':>7s} {launches:>8s}")


if __name__ == "__main__":
    main()

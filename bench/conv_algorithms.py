"""Every convolution algorithm, timed by find_*, beside PyTorch's conv2d from the same run.

    python bench/conv_algorithms.py                 # full sizes (N32, 56x56) on cpu and, if present, cuda
    python bench/conv_algorithms.py --small         # N2, 14x14: seconds on a CPU
    python bench/conv_algorithms.py --device cuda --math-type tensor_op

Configurations: a 3x3 convolution (N32 C=K=64 56x56) and a depthwise one (N32 C128 56x56 3x3, groups=128).
minidnn times come from find_convolution_*_algorithm (CUDA events on a GPU, median of --repeats after a
warm-up); PyTorch's from torch.nn.functional.conv2d, forward and forward+backward, on the same device when
torch has CUDA, else on the CPU (the table says which).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from minidnn.backend import (  # noqa: E402
    ConvolutionDescriptor,
    Handle,
    MathType,
    Status,
    cuda_is_available,
    find_convolution_backward_data_algorithm,
    find_convolution_backward_filter_algorithm,
    find_convolution_forward_algorithm,
    to_device,
)

CONFIGS = [  # name, N, C, K, size, kernel, padding, groups
    ("3x3 C=K=64", 32, 64, 64, 56, 3, 1, 1),
    ("depthwise 3x3 C=128", 32, 128, 128, 56, 3, 1, 128),
]


def torch_times(name, N, C, K, size, k, pad, groups, device, repeats):
    """(device used, forward ms, forward+backward ms) of torch.nn.functional.conv2d, or None without torch."""
    try:
        import torch
    except ImportError:
        return None
    dev = "cuda" if device == "cuda" and torch.cuda.is_available() else "cpu"
    x = torch.randn(N, C, size, size, device=dev, requires_grad=True)
    w = torch.randn(K, C // groups, k, k, device=dev, requires_grad=True)

    def fwd():
        return torch.nn.functional.conv2d(x, w, padding=pad, groups=groups)

    def fwd_bwd():
        y = fwd()
        y.backward(torch.ones_like(y))

    def timed(fn):
        fn()
        out = []
        for _ in range(repeats):
            if dev == "cuda":
                start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                stop.record()
                torch.cuda.synchronize()
                out.append(start.elapsed_time(stop))
            else:
                t0 = time.perf_counter()
                fn()
                out.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(out)

    with torch.no_grad():
        t_fwd = timed(fwd)
    return dev, t_fwd, timed(fwd_bwd)


def bench(device, small, repeats, math_type):
    handle = Handle(device, math_type=math_type)
    rng = np.random.default_rng(0)
    for name, N, C, K, size, k, pad, groups in CONFIGS:
        if small:
            N, size = 2, 14
        desc = ConvolutionDescriptor(pad, 1, 1, groups)
        x = to_device(rng.standard_normal((N, C, size, size), dtype=np.float32), device)
        w = to_device(rng.standard_normal((K, C // groups, k, k), dtype=np.float32), device)
        dy = to_device(rng.standard_normal((N, K, size, size), dtype=np.float32), device)
        print(f"\n== {name}, N={N} {size}x{size}, groups={groups}, float32, {device}, math {math_type.name}")
        print(f"{'direction':<16} {'algo':<20} {'ms':>9} {'workspace MB':>13}  note")
        best = {}
        for direction, find in (
                ("forward", lambda: find_convolution_forward_algorithm(handle, x, w, desc, repeats=repeats)),
                ("backward_data", lambda: find_convolution_backward_data_algorithm(handle, w, dy, desc, x.shape,
                                                                                   repeats=repeats)),
                ("backward_filter", lambda: find_convolution_backward_filter_algorithm(handle, x, dy, desc, w.shape,
                                                                                       repeats=repeats))):
            for perf in find():
                ok = perf.status is Status.SUCCESS
                ms = f"{perf.time:9.3f}" if ok else f"{'-':>9}"
                print(f"{direction:<16} {perf.algo.name:<20} {ms} {perf.memory / 2**20:13.1f}  "
                      f"{'' if ok else perf.reason[:60]}")
                if ok:
                    best.setdefault(direction, perf.time)
        total = sum(best.values())
        print(f"minidnn best: forward {best['forward']:.3f} ms, forward+backward {total:.3f} ms")
        t = torch_times(name, N, C, K, size, k, pad, groups, device, repeats)
        if t is None:
            print("PyTorch: not installed")
        else:
            print(f"PyTorch conv2d on {t[0]}: forward {t[1]:.3f} ms, forward+backward {t[2]:.3f} ms")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small", action="store_true", help="N=2, 14x14: a quick run on a CPU")
    ap.add_argument("--device", choices=["cpu", "cuda", "all"], default="all")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--math-type", default="default", choices=[m.value for m in MathType])
    args = ap.parse_args()
    devices = ["cpu", "cuda"] if args.device == "all" else [args.device]
    for device in devices:
        if device == "cuda" and not cuda_is_available():
            print("\n(cuda: no GPU with CuPy here; skipped)")
            continue
        bench(device, args.small, args.repeats, MathType(args.math_type))


if __name__ == "__main__":
    main()

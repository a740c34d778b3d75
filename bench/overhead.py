"""Per-op framework overhead: minidnn vs PyTorch, side by side from one run.

A chain of 100 (mul, add) pairs on 8-element tensors, forward and backward: the arithmetic is
nothing, so the time is what each framework spends per op (dispatch, graph recording, backward
bookkeeping).  Reported as microseconds per op (200 ops per chain), forward only and forward +
backward, median of several repeats, on cpu and, where available, cuda.

    python bench/overhead.py [--repeats 7] [--iters 200]
"""
from __future__ import annotations

import argparse
import statistics
import time

import minidnn as mdn

try:
    import torch
except ImportError:     # the oracle is optional: print minidnn alone
    torch = None

CHAIN = 100            # (mul, add) pairs -> 200 ops


def _chain(x, w, b, backward):
    x.grad = w.grad = b.grad = None     # each chain starts clean (no accumulation towards overflow)
    y = x
    for _ in range(CHAIN):
        y = y * w + b
    if backward:
        y.sum().backward()
    return y


def _time(fn, sync, iters, repeats):
    for _ in range(max(3, iters // 10)):
        fn()
    sync()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        sync()
        samples.append((time.perf_counter() - t0) / iters / (2 * CHAIN) * 1e6)
    return statistics.median(samples)


def bench(lib, device, iters, repeats):
    """(forward, forward + backward) µs per op; ``lib`` is minidnn or torch (the same API here)."""
    lib.manual_seed(0)
    x, w, b = (lib.randn(8, device=device, requires_grad=True) for _ in range(3))
    sync = lib.cuda.synchronize if device != "cpu" else (lambda: None)
    fwd = _time(lambda: _chain(x, w, b, False), sync, iters, repeats)
    both = _time(lambda: _chain(x, w, b, True), sync, iters, repeats)
    return fwd, both


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--iters", type=int, default=200)
    args = ap.parse_args(argv)
    devices = ["cpu"] + (["cuda"] if mdn.cuda.is_available() else [])
    rows = []
    for dev in devices:
        iters = args.iters if dev == "cpu" else args.iters // 2
        m = bench(mdn, dev, iters, args.repeats)
        t = None
        if torch is not None and (dev == "cpu" or torch.cuda.is_available()):
            t = bench(torch, dev, iters, args.repeats)
        rows.append((dev, m, t))
    print(f"per-op overhead, µs/op (8-element tensors, chain of {CHAIN} mul+add, median of {args.repeats})")
    print(f"{'device':8} {'minidnn fwd':>12} {'torch fwd':>10} {'minidnn f+b':>12} {'torch f+b':>10} {'ratio f+b':>10}")
    for dev, m, t in rows:
        tf = f"{t[0]:10.2f}" if t else f"{'n/a':>10}"
        tb = f"{t[1]:10.2f}" if t else f"{'n/a':>10}"
        ratio = f"{m[1] / t[1]:9.2f}x" if t else f"{'n/a':>10}"
        print(f"{dev:8} {m[0]:12.2f} {tf} {m[1]:12.2f} {tb} {ratio}")


if __name__ == "__main__":
    main()

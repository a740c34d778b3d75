"""Where the CPU LeNet-5 training step's time goes (issue 16): per autograd Function, forward and backward, at the
bench's shapes (bench/cpu.py's lenet rows: 32x32, SGD with momentum), plus a cProfile of the step.

    python3 tools/cpu_lenet_profile.py [--batch 64] [--threads 2] [--steps 200] [--cprofile]

Each Function's forward and backward are wrapped with a wall-clock timer (its own time: the calls it makes into
the backend included, the engine's bookkeeping around it not); a layer is named by its class and input shape.
The table: the median over steps of each entry's time in a step, and the step's own min / median wall time,
uninstrumented and instrumented, beside their sum.  A Function whose backward is itself a Function (MaxPool's
backward runs MaxPoolBackward's forward) is counted in both rows.
"""
from __future__ import annotations

import argparse
import collections
import cProfile
import io
import os
import pstats
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))

from cpu import lenet_step  # noqa: E402  (bench/cpu.py)

import minidnn as mdn  # noqa: E402
from minidnn.autograd import Function  # noqa: E402

_TIMES = collections.defaultdict(list)
_STEP = [0]


def _subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def _shape_of(args):
    for a in args:
        shape = getattr(a, "shape", None)
        if shape is not None:
            return tuple(shape)
    return ()


def _wrap(cls, name):
    raw = cls.__dict__.get(name)
    if not isinstance(raw, staticmethod):
        return
    fn = raw.__func__

    def timed(ctx, *args, **kwargs):
        t0 = time.perf_counter()
        out = fn(ctx, *args, **kwargs)
        dt = time.perf_counter() - t0
        key = (cls.__name__, name, _shape_of(args) if name == "forward" else getattr(ctx, "_prof_shape", ()))
        if name == "forward":
            try:
                ctx._prof_shape = _shape_of(args)
            except AttributeError:
                pass
        _TIMES[key].append((_STEP[0], dt))
        return out
    setattr(cls, name, staticmethod(timed))


def instrument():
    for cls in set(_subclasses(Function)):
        _wrap(cls, "forward")
        _wrap(cls, "backward")


def make_step(batch):
    """bench/cpu.py's LeNet-5 step on its batch (the same seeds)."""
    rng = np.random.default_rng(0)
    x_np = rng.standard_normal((batch, 1, 32, 32)).astype(np.float32)
    y_np = rng.integers(0, 10, batch)
    return lenet_step(x_np, y_np)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--cprofile", action="store_true")
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args(argv)
    mdn.set_num_threads(args.threads)
    step = make_step(args.batch)
    if args.cprofile:
        for _ in range(20):
            step()
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(args.steps):
            step()
        pr.disable()
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(args.top)
        print(s.getvalue())
        return
    for _ in range(20):
        step()
    plain = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        step()
        plain.append(time.perf_counter() - t0)
    instrument()
    for _ in range(20):
        step()
    _TIMES.clear()
    walls = []
    for i in range(args.steps):
        _STEP[0] = i
        t0 = time.perf_counter()
        step()
        walls.append(time.perf_counter() - t0)
    per = {}
    for key, rows in _TIMES.items():
        by_step = collections.defaultdict(float)
        for s, dt in rows:
            by_step[s] += dt
        per[key] = statistics.median(by_step.values())
    total = sum(per.values())
    print(f"LeNet-5 step, batch {args.batch}, {args.threads} threads: uninstrumented min / median "
          f"{min(plain) * 1e3:.2f} / {statistics.median(plain) * 1e3:.2f} ms; instrumented "
          f"{min(walls) * 1e3:.2f} / {statistics.median(walls) * 1e3:.2f} ms; Functions' sum {total * 1e3:.2f} ms")
    for key, t in sorted(per.items(), key=lambda kv: -kv[1]):
        print(f"  {t * 1e6:8.0f} us  {key[0]:24s} {key[1]:8s} {key[2]}")


if __name__ == "__main__":
    main()

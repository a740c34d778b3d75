"""Where ``minidnn.compile``'s time over a hand-written capture goes (issue 11: compile within 5% of hand capture).

For one model of bench/train_step.py (SGD momentum, strict fp32 unless --tf32): the median ms of a synchronised
step replayed from a hand capture and through ``minidnn.compile`` (bench/graphs.py's two columns), then the host
time of each piece of a compiled replay, measured without synchronising (many calls, GPU work queued behind):
the graph cache's signature, the copies of the arguments into the static buffers, and ``CUDAGraph.replay``.

    PYTHONPATH=. python3 tools/compile_overhead.py [--model lenet5] [--steps 200] [--tf32]
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))

from graphs import minidnn_steps  # noqa: E402
from train_step import _median_ms, set_math  # noqa: E402

import minidnn as mdn  # noqa: E402
import minidnn.compile  # noqa: E402

_compile_mod = sys.modules["minidnn.compile"]


def _host_us(fn, n):
    """Median over 5 rounds of the host µs of one fn() call (n calls a round, then one synchronize)."""
    rounds = []
    for _ in range(5):
        mdn.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        t1 = time.perf_counter()
        mdn.cuda.synchronize()
        rounds.append((t1 - t0) * 1e6 / n)
    return statistics.median(rounds)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="lenet5")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--tf32", action="store_true")
    args = ap.parse_args()
    set_math(args.tf32)
    import train_step
    eager, replay, compiled_call = minidnn_steps(args.model, "sgd")
    sync = mdn.cuda.synchronize
    for r in range(2):
        g = _median_ms(replay, sync, args.steps)
        c = _median_ms(compiled_call, sync, args.steps)
        print(f"round {r}: {args.model} synchronised step: hand capture {g:.4f} ms, minidnn.compile {c:.4f} ms "
              f"(+{(c / g - 1) * 100:.1f}%)")
    # the pieces, host only
    compiled = next((c.cell_contents for c in compiled_call.__closure__ or ()
                     if isinstance(c.cell_contents, _compile_mod._Compiled)), None)
    ctor, shape, batch = train_step.CONFIGS[args.model]
    x = mdn.randn(batch, *shape, device="cuda")
    y = mdn.randint(0, 10, (batch,), device="cuda")
    print(f"host µs per call: signature {_host_us(lambda: _compile_mod._signature((x, y), {}), 2000):.2f}")
    if isinstance(compiled, _compile_mod._Compiled) and compiled.graphs:
        entry = next(iter(compiled.graphs.values()))
        graph = entry.graph
        print(f"in-place graph captured (the bench passes the same x, y each call): {entry.direct is not None}")
        copy_us = _host_us(lambda: _compile_mod._copy_args(entry.copies, (x, y), {}), 2000)
        print(f"host µs per call: copy of the 2 arguments {copy_us:.2f}")
        print(f"host µs per call: CUDAGraph.replay {_host_us(graph.replay, args.steps):.2f}")
        print(f"host µs per call: whole compiled call {_host_us(lambda: compiled(x, y), args.steps):.2f}")
    print(f"host µs per call: hand replay {_host_us(replay, args.steps):.2f}")


if __name__ == "__main__":
    main()

"""How much of an eager training step is Python's cyclic garbage collector, minidnn beside PyTorch (GPU host).

    PYTHONPATH=. python3 tools/gc_probe.py [--models resnet20,mobilenet,lenet5] [--rounds 8] [--turn 10]

For each model (bench/train_step.py's steps, SGD, strict fp32): turns of ``--turn`` steps with one synchronisation
at the end (bench/train_step.py --pipelined), alternating minidnn / PyTorch with the collector on and off
(gc.disable() only around the turn), the median ms a step of each; in the collector-on turns, the collections a step
by generation and the ms they took (gc.callbacks).  The step allocates the same objects either way; what differs is
whether gen0/1/2 passes run inside it.
"""
from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time

sys.path.insert(0, "bench")
import train_step as ts  # noqa: E402

import minidnn as mdn  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="resnet20,mobilenet,lenet5")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--turn", type=int, default=10)
    a = ap.parse_args()
    torch = ts.torch
    twins = ts.torch_models() if torch is not None else None
    ts.set_math(False)
    t_in = [0.0]
    cnt, tim = [0, 0, 0], [0.0, 0.0, 0.0]

    def cb(phase, info):
        if phase == "start":
            t_in[0] = time.perf_counter()
        else:
            g = info["generation"]
            cnt[g] += 1
            tim[g] += time.perf_counter() - t_in[0]
    print(f"python {sys.version.split()[0]}, gc thresholds {gc.get_threshold()}")
    print(f"{'model':10} {'lib':8} {'gc on ms':>9} {'gc off ms':>9} {'diff':>6}   "
          "collections a step (gen0/1/2) and their ms a step")
    for name in a.models.split(","):
        ctor, shape, batch = ts.CONFIGS[name]
        libs = [("minidnn", mdn, vars(mdn.models))] + ([("torch", torch, twins)] if twins else [])
        runs = []
        for lname, lib, models in libs:
            step, _, _ = ts.make_step(lib, models, ctor, shape, batch, "cuda")
            sync = lib.cuda.synchronize
            for _ in range(20):
                step()
            sync()
            runs.append((lname, step, sync))
        res = {(ln, on): [] for ln, _, _ in runs for on in (True, False)}
        stats = {ln: ([0, 0, 0], [0.0, 0.0, 0.0], [0]) for ln, _, _ in runs}
        for r in range(a.rounds):
            order = [(run, on) for run in runs for on in (True, False)]
            order = order[r % len(order):] + order[:r % len(order)]
            for (ln, step, sync), on in order:
                sync()
                gc.collect()
                if not on:
                    gc.disable()
                else:
                    cnt[:] = [0, 0, 0]
                    tim[:] = [0.0, 0.0, 0.0]
                    gc.callbacks.append(cb)
                t0 = time.perf_counter()
                for _ in range(a.turn):
                    step()
                sync()
                res[(ln, on)].append((time.perf_counter() - t0) * 1e3 / a.turn)
                if not on:
                    gc.enable()
                else:
                    gc.callbacks.remove(cb)
                    c, t, n = stats[ln]
                    for g in range(3):
                        c[g] += cnt[g]
                        t[g] += tim[g]
                    n[0] += a.turn
        for ln, _, _ in runs:
            on, off = statistics.median(res[(ln, True)]), statistics.median(res[(ln, False)])
            c, t, n = stats[ln]
            print(f"{name:10} {ln:8} {on:9.3f} {off:9.3f} {on - off:+6.2f}   "
                  + " / ".join(f"{c[g] / n[0]:.2f}" for g in range(3)) + "   "
                  + " / ".join(f"{t[g] / n[0] * 1e3:.3f}" for g in range(3)))


if __name__ == "__main__":
    main()

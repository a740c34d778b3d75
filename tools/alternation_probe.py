"""Why the same eager step times differently alone and in bench/train_step.py's alternation with PyTorch: one
model's minidnn and PyTorch steps (train_step.make_step), median ms of synchronised steps -- each alone (60 steps),
then alternated as paired_medians does (rounds x per steps each in turn), with the cyclic GC on and off.

    PYTHONPATH=. python3 tools/alternation_probe.py [--model lenet5]
"""
from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))

import train_step as T  # noqa: E402

import minidnn as mdn  # noqa: E402
import minidnn.models  # noqa: E402


def timed(step, sync, n):
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        step()
        sync()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="lenet5")
    args = ap.parse_args()
    ctor, shape, batch = T.CONFIGS[args.model][:3]
    torch = T.torch
    T.set_math(False)
    ms, _, _ = T.make_step(mdn, vars(minidnn.models), ctor, shape, batch, "cuda")
    ts, _, _ = T.make_step(torch, T.torch_models(), ctor, shape, batch, "cuda")
    runs = {"minidnn": (ms, mdn.cuda.synchronize), "torch": (ts, torch.cuda.synchronize)}
    for name, (s, y) in runs.items():
        timed(s, y, 30)
    for gc_on in (True, False):
        (gc.enable if gc_on else gc.disable)()
        print(f"-- gc {'on' if gc_on else 'off'}")
        for name, (s, y) in runs.items():
            print(f"  alone {name:8s} median {statistics.median(timed(s, y, 60)):.3f} ms")
        for rounds, per in ((5, 12), (30, 2), (60, 1)):
            t = {k: [] for k in runs}
            for r in range(rounds):
                for name in (list(runs) if r % 2 == 0 else list(runs)[::-1]):
                    s, y = runs[name]
                    y()
                    t[name] += timed(s, y, per)
            print(f"  alternated {rounds} rounds x {per}: " + ", ".join(
                f"{k} {statistics.median(v):.3f} (min {min(v):.3f})" for k, v in t.items()))
        # ours right after a torch step vs after one of ours
        after_t, after_m = [], []
        for _ in range(40):
            ts(); torch.cuda.synchronize()                                   # noqa: E702
            after_t += timed(ms, mdn.cuda.synchronize, 1)
            after_m += timed(ms, mdn.cuda.synchronize, 1)
        print(f"  minidnn step right after a torch step {statistics.median(after_t):.3f}, after its own "
              f"{statistics.median(after_m):.3f} ms")
    gc.enable()


if __name__ == "__main__":
    main()

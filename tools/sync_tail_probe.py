"""Where a synchronised eager step's time goes: the host's enqueue (step() returning) and the device's tail (the
wait in synchronize() after it), minidnn beside PyTorch, for bench/train_step.py's and bench/amp_step.py's steps.

Session 12 run 1 (H200) saw MobileNet-small's bf16 step cost us 5.08 ms synchronised after every step (amp_step's
default, alternating with PyTorch every 2 steps) and 3.16 ms in turns of 10 steps with one synchronisation each;
PyTorch 4.47 and 3.61.  This splits each synchronised step into host time and tail, alone and alternated, and times
the pipelined turns beside it, in one process:

    PYTHONPATH=. python3 tools/sync_tail_probe.py [--cases mobilenet:bf16,mobilenet:fp32:sgd,lenet5:fp32:sgd]
        [--steps 40] [--rounds 3]

A case is model:mode[:opt]: mode fp32 / bf16 / fp16 / bf16+cl through amp_step's steps (SGD momentum, GradScaler
off unless fp16); with opt (sgd / adam) the fp32 step of train_step.make_step instead.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))

import amp_step as A  # noqa: E402
import train_step as T  # noqa: E402

import minidnn as mdn  # noqa: E402
import minidnn.models  # noqa: E402


def build(case):
    parts = case.split(":")
    name, mode = parts[0], parts[1]
    torch = T.torch
    if len(parts) > 2:
        ctor, shape, batch = T.CONFIGS[name][:3]
        ms, _, _ = T.make_step(mdn, vars(minidnn.models), ctor, shape, batch, "cuda", parts[2])
        ts, _, _ = T.make_step(torch, T.torch_models(), ctor, shape, batch, "cuda", parts[2])
    else:
        ms = A.minidnn_step(name, mode, "cuda")
        ts = A.torch_step(name, mode, "cuda", T.torch_models())
    return {"minidnn": (ms, mdn.cuda.synchronize), "torch": (ts, torch.cuda.synchronize)}


def synced(step, sync, n):
    """[(host ms, tail ms)] of n steps, each synchronised."""
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        step()
        t1 = time.perf_counter()
        sync()
        out.append(((t1 - t0) * 1e3, (time.perf_counter() - t1) * 1e3))
    return out


def pipelined(step, sync, n):
    sync()
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    sync()
    return (time.perf_counter() - t0) * 1e3 / n


def med(v):
    return statistics.median(v)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="mobilenet:bf16,mobilenet:fp32:sgd,mobilenet:fp32:adam,lenet5:fp32:sgd")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    T.set_math(False)
    for case in args.cases.split(","):
        runs = build(case)
        for s, y in runs.values():
            synced(s, y, 10)
        res = {k: {"alone": [], "alt": [], "pipe": []} for k in runs}
        for r in range(args.rounds):
            order = list(runs) if r % 2 == 0 else list(runs)[::-1]
            for k in order:
                s, y = runs[k]
                res[k]["alone"] += synced(s, y, args.steps)
            for k in order:
                s, y = runs[k]
                res[k]["pipe"].append(pipelined(s, y, args.steps))
            for _ in range(args.steps // 2):     # alternated every 2 steps, as the benches' default
                for k in order:
                    s, y = runs[k]
                    res[k]["alt"] += synced(s, y, 2)
        print(f"== {case}: median ms over {args.rounds} rounds of {args.steps} steps")
        for k, v in res.items():
            line = [f"{k:8s}"]
            for mode in ("alone", "alt"):
                h = [a for a, _ in v[mode]]
                t = [b for _, b in v[mode]]
                tot = [a + b for a, b in v[mode]]
                line.append(f"{mode}: total {med(tot):.3f} (host {med(h):.3f} + tail {med(t):.3f})")
            line.append(f"pipelined {med(v['pipe']):.3f} (min {min(v['pipe']):.3f})")
            print("  " + "  ".join(line))
        del runs


if __name__ == "__main__":
    main()

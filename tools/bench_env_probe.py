"""Why an eager step times slower inside the benchmarks than alone: bench/amp_step.py's steps of one model timed
(turns of --turn steps, one synchronisation each, the median turn's ms a step) in growing company, in one process:

  alone      the minidnn step of --mode, the only model built
  siblings   after every other minidnn mode of the model is built too, the --mode step timed alone
  rot-own    the minidnn modes in rotation (paired_medians)
  rot-all    minidnn and PyTorch modes in rotation (what amp_step times)
  frozen     the same after gc.freeze() (the objects alive so far out of the collector's generations)
  nogc       the same with the collector off
  again      the --mode step alone, everything still alive

with the workspace's kept bytes, the collector's counts and CuPy's pool bytes beside each.

    PYTHONPATH=. python3 tools/bench_env_probe.py --model mobilenet --mode bf16 [--turn 10] [--turns 6]
"""
# ruff: noqa: E402
import argparse
import gc
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
from amp_step import MODES, minidnn_step, torch_step
from train_step import paired_medians, torch, torch_models

import minidnn as mdn
from minidnn.backend.cuda import workspace as _ws


def alone(step, turn, turns):
    for _ in range(20):
        step()
    mdn.cuda.synchronize()
    ts = []
    for _ in range(turns):
        t0 = time.perf_counter()
        for _ in range(turn):
            step()
        mdn.cuda.synchronize()
        ts.append((time.perf_counter() - t0) * 1e3 / turn)
    return statistics.median(ts)


def state():
    import cupy as cp
    return (f"kept {_ws._local.kept_nbytes / 2**20:.0f} MB, gc counts {gc.get_count()}, gc objects "
            f"{len(gc.get_objects())}, cupy pool used {cp.get_default_memory_pool().used_bytes() / 2**20:.0f} MB")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="mobilenet")
    ap.add_argument("--mode", default="bf16")
    ap.add_argument("--turn", type=int, default=10)
    ap.add_argument("--turns", type=int, default=6)
    a = ap.parse_args()
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 2.0:        # the CPU out of idle before anything is timed
        pass
    main_step = minidnn_step(a.model, a.mode, "cuda")
    print(f"alone     {alone(main_step, a.turn, a.turns):7.2f} ms  | {state()}", flush=True)
    others = [minidnn_step(a.model, m, "cuda") for m in MODES if m != a.mode]
    for s in others:
        alone(s, 2, 1)
    print(f"siblings  {alone(main_step, a.turn, a.turns):7.2f} ms  | {state()}", flush=True)
    msync = mdn.cuda.synchronize
    own = [(main_step, msync)] + [(s, msync) for s in others]
    print(f"rot-own   {paired_medians(own, a.turn * a.turns, pipelined=a.turn)[0]:7.2f} ms  | {state()}", flush=True)
    if torch is not None:
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        ns = torch_models()
        t_steps = [torch_step(a.model, m, "cuda", ns) for m in MODES]
        runs = own + [(s, torch.cuda.synchronize) for s in t_steps]
        med = paired_medians(runs, a.turn * a.turns, pipelined=a.turn)
        print(f"rot-all   {med[0]:7.2f} ms  (torch {a.mode}: {med[len(own) + MODES.index(a.mode)]:.2f}) | {state()}",
              flush=True)
        gc.freeze()
        med = paired_medians(runs, a.turn * a.turns, pipelined=a.turn)
        print(f"frozen    {med[0]:7.2f} ms  (torch {a.mode}: {med[len(own) + MODES.index(a.mode)]:.2f}) | {state()}",
              flush=True)
        gc.unfreeze()
        gc.disable()
        med = paired_medians(runs, a.turn * a.turns, pipelined=a.turn)
        print(f"nogc      {med[0]:7.2f} ms  (torch {a.mode}: {med[len(own) + MODES.index(a.mode)]:.2f}) | {state()}",
              flush=True)
        gc.enable()
    print(f"again     {alone(main_step, a.turn, a.turns):7.2f} ms  | {state()}", flush=True)


if __name__ == "__main__":
    main()

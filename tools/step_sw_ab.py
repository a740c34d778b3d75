"""In-process A/B of host-path switches on a real GPU, PyTorch beside: one-element-list switches flipped off / on
between alternated turns of the same minidnn step, PyTorch's twin step timed in the same rotation.

    SW=minidnn.backend.cuda.workspace:RECYCLE[,module:NAME...] PYTHONPATH=. python3 tools/step_sw_ab.py \
        [--models resnet20,mobilenet,lenet5] [--rounds 8] [--turn 10] [--opt sgd] [--amp bf16]

Each turn: ``--turn`` steps, one synchronisation at its end (bench/train_step.py --pipelined); the order of the
three runs (switch off, switch on, PyTorch) rotates every round; the median ms a step of each, and the ratios.
``--amp bf16``: the forward under autocast on both sides (bench/amp_step.py's steps are not used: the same
train_step models and SGD/Adam as train_step.py); ``--cl``: models and inputs channels_last on both sides.
"""
from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
import train_step as ts  # noqa: E402

import minidnn as mdn  # noqa: E402


def _amp_step(lib, step_parts, dtype):
    model, opt, x, y = step_parts
    ce = lib.nn.functional.cross_entropy

    def step():
        with lib.autocast("cuda", dtype=dtype):
            loss = ce(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return step


def _plain_step(lib, step_parts):
    model, opt, x, y = step_parts
    ce = lib.nn.functional.cross_entropy

    def step():
        loss = ce(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return step


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="resnet20,mobilenet,lenet5")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--turn", type=int, default=10)
    ap.add_argument("--opt", default="sgd")
    ap.add_argument("--amp", default=None, help="bf16: the forward under autocast(bfloat16) on both sides")
    ap.add_argument("--cl", action="store_true", help="model and input channels_last on both sides")
    a = ap.parse_args()
    sws = []
    for item in os.environ["SW"].split(","):
        mod, name = item.split(":")
        sws.append(getattr(importlib.import_module(mod), name))
    torch = ts.torch
    twins = ts.torch_models() if torch is not None else None
    ts.set_math(False)

    def setting(on):
        for s in sws:
            s[0] = on
    print(f"SW={os.environ['SW']} amp={a.amp} cl={a.cl} opt={a.opt}; ms a step (median of {a.rounds} turns of "
          f"{a.turn})")
    print(f"{'model':10} {'off':>8} {'on':>8} {'torch':>8}  on/off  off/torch  on/torch")
    for name in a.models.split(","):
        ctor, shape, batch = ts.CONFIGS[name]
        runs = {}
        for key, lib, models in [("mdn", mdn, vars(mdn.models))] + ([("torch", torch, twins)] if twins else []):
            step, model, opt = ts.make_step(lib, models, ctor, shape, batch, "cuda", a.opt)
            if a.amp or a.cl:
                lib.manual_seed(0)
                x = lib.randn(batch, *shape, device="cuda")
                y = lib.randint(0, 10, (batch,), device="cuda")
                if a.cl:
                    model.to(memory_format=lib.channels_last)
                    x = x.to(memory_format=lib.channels_last)
                parts = (model, opt, x, y)
                step = _amp_step(lib, parts, lib.bfloat16) if a.amp else _plain_step(lib, parts)
            runs[key] = (step, lib.cuda.synchronize)
        order = [("off", runs["mdn"], False), ("on", runs["mdn"], True)]
        if "torch" in runs:
            order.append(("torch", runs["torch"], None))
        for _, (step, sync), on in order:
            if on is not None:
                setting(on)
            for _ in range(15):
                step()
            sync()
        times = {k: [] for k, _, _ in order}
        for r in range(a.rounds):
            rot = order[r % len(order):] + order[:r % len(order)]
            for k, (step, sync), on in rot:
                if on is not None:
                    setting(on)
                sync()
                t0 = time.perf_counter()
                for _ in range(a.turn):
                    step()
                sync()
                times[k].append((time.perf_counter() - t0) * 1e3 / a.turn)
        med = {k: statistics.median(v) for k, v in times.items()}
        t = med.get("torch", float("nan"))
        print(f"{name:10} {med['off']:8.3f} {med['on']:8.3f} {t:8.3f}  {med['on'] / med['off']:6.3f}  "
              f"{med['off'] / t:9.3f}  {med['on'] / t:8.3f}")
    setting(True)


if __name__ == "__main__":
    main()

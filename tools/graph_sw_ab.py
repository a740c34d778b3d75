"""Device-time A/B of switches inside CUDA-graph replays (the eager A/B, tools/step_sw_ab.py, sees host time only):
ResNet-20 (or another bench/train_step.py model) b128 SGD steps captured once per configuration, replays timed with
CUDA events in alternated rounds, PyTorch's captured step beside.

    CONFIGS="off:minidnn.nn._functions.norm:DX_NHWC=0;on:minidnn.nn._functions.norm:DX_NHWC=1" \
        PYTHONPATH=. python3 tools/graph_sw_ab.py [--model resnet20] [--rounds 25] [--amp bf16]

Each configuration: ``name:module:NAME=0|1[,module:NAME=0|1...]`` (one-element-list switches, or module booleans),
set while its step is built, warmed and captured (the choices a capture records are then fixed in its graph).
"""
from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
import train_step as ts  # noqa: E402

import minidnn as mdn  # noqa: E402


def _set(spec):
    """Applies ``module:NAME=v,...``; returns the undo list."""
    undo = []
    for item in filter(None, spec.split(",")):
        target, value = item.split("=")
        mod, name = target.rsplit(":", 1)
        m = importlib.import_module(mod)
        old = getattr(m, name)
        v = value not in ("0", "false", "False")
        if isinstance(old, list):
            undo.append((m, name, list(old)))
            old[0] = v
        else:
            undo.append((m, name, old))
            setattr(m, name, v)
    return undo


def _undo(undo):
    for m, name, old in reversed(undo):
        cur = getattr(m, name)
        if isinstance(cur, list):
            cur[:] = old
        else:
            setattr(m, name, old)


def _captured(lib, model, amp, shape, batch):
    opt = lib.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x = lib.randn(batch, *shape, device="cuda")
    y = lib.randint(0, 10, (batch,), device="cuda")
    ce = lib.nn.functional.cross_entropy

    def step():
        with lib.autocast("cuda", dtype=lib.bfloat16, enabled=amp):
            loss = ce(model(x), y)
        opt.zero_grad(set_to_none=False)
        loss.backward()
        opt.step()
    s = lib.cuda.Stream()
    s.wait_stream(lib.cuda.current_stream())
    with lib.cuda.stream(s):
        for _ in range(3):
            step()
    lib.cuda.current_stream().wait_stream(s)
    g = lib.cuda.CUDAGraph()
    with lib.cuda.graph(g):
        step()
    return g.replay


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="resnet20")
    ap.add_argument("--rounds", type=int, default=25)
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--amp", default=None)
    a = ap.parse_args()
    import cupy as cp
    import torch
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    amp = a.amp == "bf16"
    ctor, shape, batch = ts.CONFIGS[a.model]
    import minidnn.models
    runs = {}
    for cfg in os.environ.get("CONFIGS", "base:").split(";"):
        name, _, spec = cfg.partition(":")
        undo = _set(spec)
        try:
            from minidnn.nn._functions import norm as N
            N._REMEMBERED.clear()
            mdn.manual_seed(0)
            runs[name] = _captured(mdn, eval(ctor, vars(minidnn.models)).to("cuda"), amp, shape, batch)
        finally:
            _undo(undo)
    torch.manual_seed(0)
    runs["torch"] = _captured(torch, eval(ctor, ts.torch_models()).cuda(), amp, shape, batch)

    def ms(f):
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record()
        for _ in range(a.replays):
            f()
        e1.record()
        e1.synchronize()
        return cp.cuda.get_elapsed_time(e0, e1) / a.replays
    times = {k: [] for k in runs}
    names = list(runs)
    for r in range(a.rounds):
        for k in names[r % len(names):] + names[:r % len(names)]:
            torch.cuda.synchronize()
            times[k].append(ms(runs[k]))
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{a.model} b{batch} SGD amp={a.amp} graph replays, median ms of {a.rounds} rounds of {a.replays}:")
    for k in names:
        print(f"  {k:12s} {med[k]:.4f} ms   /torch {med[k] / med['torch']:.3f}   /first {med[k] / med[names[0]]:.3f}")


if __name__ == "__main__":
    main()

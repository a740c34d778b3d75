"""Session 18's A/B of the channels-last batch norm's L2 prefetch (bn_nhwc.PREFETCH / PREFETCH_APPLY;
docs/step_kernels.md, "Session 18: channels-last batch norm prefetch") in ONE process, PyTorch channels_last beside.

Settings (bn_nhwc.set_prefetch): `off` (0: today's kernels, the PTX before the switch), `p1` / `p2` / `p4` (1, 2, 4
loop trips ahead, both passes), `p1r` / `p2r` (the reduction pass only: PREFETCH_APPLY 0).
Shapes: the issue-10 rows (32, 256, 56, 56), (128, 64, 56, 56), (256, 32, 56, 56) (over L2: KEEP, and SPLIT at
C >= 64) and ResNet-20's (128, 16, 32, 32) as the control (a few vectors a thread: the prefetch mostly past the
walk's end; it must not lose).  Ops: forward, backward, bn + ReLU backward, bn + add + ReLU backward.

    PYTHONPATH=. python3 tools/bn_nhwc_s18_ab.py --dtypes float32 [--settings off,p1,p2] [--rounds 15]

Timing: per (shape, dtype, op) one CUDA graph of `calls` back-to-back calls per setting, all captured first (outputs
kept alive), then `rounds` rounds replaying each setting's graph once, the order rotated every round; median ms per
call.  %copy: the op's compulsory traffic (fwd 2e, bwd 3e, relu bwd 4e, add+relu bwd 5e; e = x's bytes) against a
256 MiB device copy measured here.  ratio = off / setting (> 1: faster); torch/best > 1: faster than PyTorch.
NVRTC: 4 kernels a setting and shape class (over L2 with / without SPLIT, the control) -- about 12 a setting.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bn_nhwc_ab import Case  # noqa: E402
from bn_nhwc_bench import copy_bandwidth  # noqa: E402
from bn_s18_ab import capture  # noqa: E402
from graph_timer import torch_graph_time  # noqa: E402

from minidnn.backend import devices as _dev  # noqa: E402
from minidnn.backend.cuda import bn_nhwc as M  # noqa: E402

SHAPES = "32x256x56x56,128x64x56x56,256x32x56x56,128x16x32x32"
SETTINGS = {"off": (0, True), "p1": (1, True), "p2": (2, True), "p4": (4, True), "p1r": (1, False),
            "p2r": (2, False)}
OPS = {"fwd": 2, "bwd": 3, "relu bwd": 4, "add+relu bwd": 5}


def op_fn(case, op):
    """The call to time; the backward's inputs from the plain forward (settled once, under the setting in force)."""
    if op == "fwd":
        return case.fwd
    y, m, i = M.forward_training(case.x, case.s, case.b, 0.1, None, None, 1e-5)
    if op == "bwd":
        return lambda: M.backward(case.x, case.dy, case.s, m, i)
    if op == "relu bwd":
        return lambda: M.backward(case.x, case.dy, case.s, m, i, y=y)
    return lambda: M.backward(case.x, case.dy, case.s, m, i, y=y, want_dz=True)


def torch_times(case, calls, replays):
    if case.torch is None:
        return {}
    t = case.torch_times(calls, replays)
    torch, F = case.torch, case.torch.nn.functional

    def fwd_relu():
        return F.relu(F.batch_norm(case.xt, case.rmt, case.rvt, case.wt, case.bt, True, 0.1, 1e-5))
    with torch.no_grad():
        f = torch_graph_time(torch, fwd_relu, calls, replays)
    both = torch_graph_time(torch, lambda: torch.autograd.grad(fwd_relu(), (case.xt, case.wt, case.bt), case.dyt),
                            calls, replays)
    return {"fwd": t.get("bn fwd"), "bwd": t.get("bn bwd"), "relu bwd": both - f, "add+relu bwd": t.get("add+relu bwd")}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--settings", default="off,p1,p2")
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--dtypes", default="float32")
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--calls", type=int, default=10, help="calls per graph, tensors over 8 M values")
    ap.add_argument("--small-calls", type=int, default=40)
    ap.add_argument("--torch-replays", type=int, default=7)
    ap.add_argument("--no-torch", action="store_true")
    a = ap.parse_args(argv)
    labels = [s for s in a.settings.split(",") if s]
    ops = [o for o in a.ops.split(",") if o]
    bad = [s for s in labels if s not in SETTINGS] + [o for o in ops if o not in OPS]
    if bad or not labels or labels[0] != "off":
        raise SystemExit(f"settings: 'off' first, then of {sorted(SETTINGS)}; ops of {list(OPS)}; bad: {bad}")
    cp = _dev.require_cupy()
    torch = None
    if not a.no_torch:
        try:
            import torch
            torch.backends.cudnn.benchmark = True
        except ImportError:
            torch = None
    if M.ROUTE != "one" or not M.ONCHIP:
        raise SystemExit("PREFETCH lives in the one-launch kernels with the on-chip copy (ROUTE one, ONCHIP: the "
                         "defaults)")
    default = (M.PREFETCH, M.PREFETCH_APPLY)
    bw = copy_bandwidth(cp)
    dev = cp.cuda.Device()
    print(f"# device {cp.cuda.runtime.getDeviceProperties(dev.id)['name'].decode()}, {M._launch.sm_count(dev.id)} "
          f"SMs, L2 {M.l2_info(dev.id)}, copy {bw:.0f} GB/s; KEEP {sorted(M.KEEP)}, SPLIT {M.SPLIT}, module PREFETCH "
          f"{default}; torch {getattr(torch, '__version__', None)}; {a.rounds} rounds, order rotated")
    head = (f"{'shape':>14} {'dtype':>8} {'op':>12} | " + " | ".join(f"{s:>15}" for s in labels)
            + " | " + " ".join(f"{'off/' + s:>8}" for s in labels[1:]) + f" | {'torch':>7} {'t/best':>6} | best")
    print("# ms per call (% of copy), median over rounds; off/x > 1: x faster; t/best > 1: best faster than PyTorch")
    print(head)
    print("-" * len(head))
    rng = np.random.default_rng(0)
    for shape_s in a.shapes.split(","):
        shape = tuple(int(v) for v in shape_s.split("x"))
        calls = a.calls if np.prod(shape) > 8 * 2 ** 20 else a.small_calls
        for name in a.dtypes.split(","):
            case = Case(cp, torch, shape, name, rng)
            tt = torch_times(case, calls, a.torch_replays) if torch is not None else {}
            for op in ops:
                graphs, keep = [], []
                for label in labels:
                    M.set_prefetch(*SETTINGS[label])
                    graphs.append(capture(cp, op_fn(case, op), calls, keep))
                M.set_prefetch(*default)
                times = [[] for _ in labels]
                for r in range(a.rounds):
                    for j in range(len(labels)):
                        k = (j + r) % len(labels)
                        g, s = graphs[k]
                        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
                        e0.record(s)
                        g.launch(s)
                        e1.record(s)
                        e1.synchronize()
                        times[k].append(cp.cuda.get_elapsed_time(e0, e1) / calls)
                med = [statistics.median(t) for t in times]
                nbytes = OPS[op] * case.e
                best = min(range(len(labels)), key=lambda k: med[k])
                tms = tt.get(op)

                def cell(ms):
                    return f"{ms:7.4f} ({100 * nbytes / (ms * 1e-3) / 1e9 / bw:3.0f}%)"
                print(f"{shape_s:>14} {name:>8} {op:>12} | " + " | ".join(f"{cell(v):>15}" for v in med) + " | "
                      + " ".join(f"{med[0] / v:8.3f}" for v in med[1:])
                      + (f" | {tms:7.4f} {tms / med[best]:6.3f}" if tms else f" | {'-':>7} {'-':>6}")
                      + f" | {labels[best]}", flush=True)
                del graphs, keep
            del case
    M.set_prefetch(*default)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Cross-entropy with spatial targets and softmax over the channel dim on the GPU, PyTorch beside (one process).

    python3 tools/spatial_ce_gpu.py [--dtypes float32,bfloat16] [--trials 5] [--shapes 32x21x128x128,...]

Logits (N, C, H, W) against class indices (N, H, W) -- a segmentation loss, `F.cross_entropy(x, t)` on a
PyTorch-style model -- and `softmax` / `log_softmax(x, dim=1)`: the loss kernels' and softmax kernels' inner > 1
paths (backend/cuda/loss_kernels.py, softmax_kernels.py SOURCE_COLS).  Timing, traffic and % of copy as
bench/kernels_gpu.py (its Timer and copy measurement): every input read once, every output written once.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import kernels_gpu as K  # noqa: E402

import minidnn.backend as B  # noqa: E402
from minidnn.backend import devices as _dev  # noqa: E402

SHAPES = [(32, 21, 128, 128), (16, 19, 256, 256), (8, 150, 64, 64), (64, 10, 64, 64)]


def ce_cases(cases, shape):
    cp, torch = cases.cp, cases.torch
    n, c = shape[:2]
    x = cases.x(shape)
    tshape = (n,) + tuple(shape[2:])
    t = cp.asarray(np.random.default_rng(0).integers(0, c, tshape))
    loss, lse, den = B.softmax_cross_entropy_forward(None, x, t)
    dloss = cases.full((), 1.0)
    tf = tb = None
    if torch is not None:
        xt = cases.t(shape, True)
        tt = torch.randint(0, c, tshape, device=cases.tdev)

        def tf():
            return torch.nn.functional.cross_entropy(xt, tt)
        lt = tf()

        def tb():
            return torch.autograd.grad(lt, xt, retain_graph=True)
    e = x.size * cases.item
    rows = x.size // c
    return [("spatial ce fwd", shape, (lambda: B.softmax_cross_entropy_forward(None, x, t), tf, e + rows * 8)),
            ("spatial ce bwd", shape, (lambda: B.softmax_cross_entropy_backward(None, x, t, dloss, lse, den), tb,
                                       2 * e + rows * 12))]


def channel_cases(cases, shape, algo):
    torch = cases.torch
    x, dy = cases.x(shape), cases.x(shape)
    y = B.softmax_forward(None, algo, "channel", x)
    tf = tb = None
    if torch is not None:
        xt, dyt = cases.t(shape, True), cases.t(shape)
        op = torch.log_softmax if algo == "log" else torch.softmax

        def tf():
            return op(xt, 1)
        yt = tf()

        def tb():
            return torch.autograd.grad(yt, xt, dyt, retain_graph=True)
    e = x.size * cases.item
    name = "channel log-softmax" if algo == "log" else "channel softmax"
    return [(name + " fwd", shape, (lambda: B.softmax_forward(None, algo, "channel", x), tf, 2 * e)),
            (name + " bwd", shape, (lambda: B.softmax_backward(None, algo, "channel", y, dy), tb, 3 * e))]


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--shapes", default="", help="NxCxHxW,... (default: the segmentation shapes above)")
    args = ap.parse_args(argv)
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",") if s] or SHAPES
    if not _dev.cuda_is_available():
        print("spatial_ce_gpu: no CUDA GPU with CuPy here; nothing to measure")
        return 0
    cp = _dev.require_cupy()
    try:
        import torch
        if not torch.cuda.is_available():
            torch = None
    except ImportError:
        torch = None
    timer = K.Timer(cp, torch, args.trials)
    bw = K.copy_bandwidth(cp, timer)
    print(f"copy bandwidth {bw:.0f} GB/s")
    head = (f"{'kernel':26s} {'dtype':9s} {'shape':20s} {'MB':>7s} {'ms':>8s} {'%copy':>6s} {'torch ms':>9s} "
            f"{'vs torch':>8s}")
    print(head)
    print("-" * len(head))
    for dtype_name in args.dtypes.split(","):
        cases = K.Cases(cp, torch, dtype_name)
        for shape in shapes:
            todo = ce_cases(cases, shape) + channel_cases(cases, shape, "accurate") + channel_cases(cases, shape,
                                                                                                   "log")
            for name, shp, (fn, tfn, nbytes) in todo:
                ms = timer.cupy(fn)
                tms = timer.torch_(tfn) if tfn is not None else float("nan")
                pct = nbytes / (ms * 1e-3) / 1e9 / bw * 100
                print(f"{name:26s} {dtype_name:9s} {str(shp):20s} {nbytes / 1e6:7.1f} {ms:8.4f} {pct:5.0f}% "
                      f"{tms:9.4f} {tms / ms:7.2f}x")
                sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Softmax, log-softmax and cross-entropy over more shapes than bench/kernels_gpu.py's two, PyTorch beside.

    python3 tools/softmax_shapes_gpu.py [--dtypes float32,bfloat16] [--trials 5] [--quick]

Rows (N, C) over the last axis: C from 10 to 50257 (the row kernels' sub-warp, warp, block and chunked paths),
and a channel softmax on NCHW (the column kernels).  Timing, traffic accounting and %copy as bench/kernels_gpu.py
(its Timer, copy measurement and cases, reused): every input read once, every output written once.
MINIDNN_SOFTMAX_V1=1 in the environment times the previous kernels instead (a GPU A/B of the same shapes);
MINIDNN_SOFTMAX_BWD_WARP=1 / =0 every backward with 32 + 32 / 16 + 16 elements a warp-path thread (default: a rule);
MINIDNN_SOFTMAX_FWD_CAP / MINIDNN_SOFTMAX_FWD_REGS the one-array rows' (softmax and cross-entropy forward) elements
a warp-path thread and registers (a sweep: softmax_kernels.FWD_CAP).  --rows 16384x1000,4096x4097 times those only.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import kernels_gpu as K  # noqa: E402

import minidnn.backend as B  # noqa: E402

ROWS = [(128, 10), (65536, 128), (16384, 1000), (8192, 1025), (4096, 4097), (2048, 32768), (512, 50257)]
QUICK = [(128, 10), (16384, 1000), (4096, 4097), (2048, 32768)]
CHANNEL = [(32, 21, 128, 128), (128, 64, 56, 56)]


def channel_cases(cases, shape):
    x, dy = cases.x(shape), cases.x(shape)
    y = B.softmax_forward(None, "accurate", "channel", x)
    tf = tb = None
    if cases.torch is not None:
        xt, dyt = cases.t(shape, True), cases.t(shape)

        def tf():
            return cases.torch.softmax(xt, 1)
        yt = tf()

        def tb():
            return cases.torch.autograd.grad(yt, xt, dyt, retain_graph=True)
    e = x.size * cases.item
    return [("channel softmax fwd", shape, (lambda: B.softmax_forward(None, "accurate", "channel", x), tf, 2 * e)),
            ("channel softmax bwd", shape, (lambda: B.softmax_backward(None, "accurate", "channel", y, dy), tb,
                                            3 * e))]


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="four row shapes, no channel softmax")
    ap.add_argument("--rows", default="", help="row shapes NxC,NxC (no channel softmax)")
    args = ap.parse_args(argv)
    rows = [tuple(int(v) for v in r.split("x")) for r in args.rows.split(",") if r]
    gpu = K.open_gpu(args.trials, "softmax_shapes_gpu")
    if gpu is None:
        return 0
    cp, torch, timer, bw = gpu
    v1 = os.environ.get("MINIDNN_SOFTMAX_V1", "0") == "1"
    bwd = "".join(f" {k[15:]}={os.environ[k]}" for k in ("MINIDNN_SOFTMAX_BWD_WARP", "MINIDNN_SOFTMAX_BWD_REGS",
                                                         "MINIDNN_SOFTMAX_FWD_CAP", "MINIDNN_SOFTMAX_FWD_REGS")
                  if k in os.environ)
    print(f"copy bandwidth {bw:.0f} GB/s; kernels: {'V1 (previous)' if v1 else 'rows/columns (current)'}{bwd}")
    head = (f"{'kernel':22s} {'dtype':9s} {'shape':20s} {'MB':>7s} {'ms':>8s} {'%copy':>6s} {'torch ms':>9s} "
            f"{'vs torch':>8s}")
    print(head)
    print("-" * len(head))
    for dtype_name in args.dtypes.split(","):
        cases = K.Cases(cp, torch, dtype_name)
        todo = []
        for shape in rows or (QUICK if args.quick else ROWS):
            todo += [r[:3] for r in cases.softmax(shape, "accurate") + cases.softmax(shape, "log")
                     + cases.cross_entropy(shape)]
        if not args.quick and not rows:
            for shape in CHANNEL:
                todo += channel_cases(cases, shape)
        for name, shape, (fn, tfn, nbytes) in todo:
            ms = timer.cupy(fn)
            tms = timer.torch_(tfn) if tfn is not None else float("nan")
            pct = nbytes / (ms * 1e-3) / 1e9 / bw * 100
            print(f"{name:22s} {dtype_name:9s} {str(shape):20s} {nbytes / 1e6:7.1f} {ms:8.4f} {pct:5.0f}% "
                  f"{tms:9.4f} {tms / ms:7.2f}x")
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())

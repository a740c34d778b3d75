"""LeNet-5's two convolutions (b64, 1x32x32 input) on the GPU, each direction through the direct kernels and through
the implicit-GEMM kernels, called directly (conv_igemm: whatever direct_supports says), CUDA events, median of 3
windows; PyTorch's cuDNN beside them when torch is importable.  The data behind docs/conv_kernels.md's "dense
convolutions of one input channel": conv1 (C=1) now goes direct; conv2 (C=6) stays on the implicit GEMM unless
this table shows the direct kernels ahead there too.

    PYTHONPATH=. python3 tools/lenet_conv_ab.py [--reps 200] [--dtype float32|bfloat16]
"""
import argparse
import statistics

import numpy as np

from minidnn.backend import ConvolutionDescriptor
from minidnn.backend.conv_problem import make_problem
from minidnn.backend.cuda import conv_igemm as K

# name, x shape, w shape, padding
LAYERS = [("conv1 C=1 K=6 5x5 32->28", (64, 1, 32, 32), (6, 1, 5, 5), 0),
          ("conv2 C=6 K=16 5x5 14->10", (64, 6, 14, 14), (16, 6, 5, 5), 0)]


def _timer(cp, fn, reps):
    fn()
    cp.cuda.Device().synchronize()
    windows = []
    for _ in range(3):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        for _ in range(reps):
            fn()
        stop.record()
        stop.synchronize()
        windows.append(cp.cuda.get_elapsed_time(start, stop) / reps * 1000)
    return statistics.median(windows)


def _torch_times(xs, ws, pad, reps, dtype):
    try:
        import torch
    except ImportError:
        return None
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    dt = torch.float32 if dtype == "float32" else torch.bfloat16
    x = torch.randn(xs, device="cuda", dtype=dt, requires_grad=True)
    w = torch.randn(ws, device="cuda", dtype=dt, requires_grad=True)
    y = torch.nn.functional.conv2d(x, w, padding=pad)
    dy = torch.randn_like(y)
    g = torch.nn.grad

    def ev(fn):
        fn()
        torch.cuda.synchronize()
        windows = []
        for _ in range(3):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(reps):
                fn()
            b.record()
            b.synchronize()
            windows.append(a.elapsed_time(b) / reps * 1000)
        return statistics.median(windows)
    with torch.no_grad():
        return [ev(lambda: torch.nn.functional.conv2d(x, w, padding=pad)),
                ev(lambda: g.conv2d_input(xs, w, dy, padding=pad)),
                ev(lambda: g.conv2d_weight(x, ws, dy, padding=pad))]


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = ap.parse_args(argv)
    import cupy as cp
    dt = np.float32
    if args.dtype == "bfloat16":
        import ml_dtypes
        dt = ml_dtypes.bfloat16
    print(f"us per call, {args.dtype}: forward / backward data / backward filter")
    for name, xs, ws, pad in LAYERS:
        p = make_problem("ab", xs, ws, ConvolutionDescriptor(pad), args.dtype)
        rng = np.random.default_rng(0)
        x, w, dy = (cp.asarray(rng.standard_normal(s).astype(dt)) for s in (p.x_shape, p.w_shape, p.y_shape))
        direct = [_timer(cp, f, args.reps) for f in (lambda: K.direct_forward(p, x, w),
                                                     lambda: K.direct_backward_data(p, w, dy),
                                                     lambda: K.direct_backward_filter(p, x, dy))]
        implicit = [_timer(cp, f, args.reps) for f in (lambda: K.implicit_forward(p, x, w, False, True),
                                                       lambda: K.implicit_backward_data(p, w, dy, False, True),
                                                       lambda: K.implicit_backward_filter(p, x, dy, False, True))]
        torch_t = _torch_times(xs, ws, pad, args.reps, args.dtype)
        chosen = "direct" if K.direct_supports(p) is None else "implicit"
        row = f"{name:28s} direct {' / '.join(f'{t:6.1f}' for t in direct)}   implicit " \
              f"{' / '.join(f'{t:6.1f}' for t in implicit)}"
        if torch_t:
            row += f"   cuDNN {' / '.join(f'{t:6.1f}' for t in torch_t)}"
        print(row + f"   (registry: {chosen})")


if __name__ == "__main__":
    main()

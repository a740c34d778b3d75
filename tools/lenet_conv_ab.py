"""Dense convolutions of few input channels on the GPU -- LeNet-5's two (b64, 1x32x32 input) and, with --stems, the
3-channel 32x32 stem of ResNet-20 and MobileNet-small (b128, 3 -> 16, 3x3 pad 1; NCHW and NHWC) -- each direction
through the direct kernels and through the implicit-GEMM kernels, called directly (conv_igemm, whatever
direct_supports says), CUDA events, median of 3 windows; PyTorch's cuDNN beside them when torch is importable.
The data behind docs/conv_kernels.md's "dense convolutions of few input channels": conv1 (C=1) and conv2 (C=6) go
direct (H200 fp32: conv2 direct 14.6 / 30.6 / 15.5 us, implicit 23.2 / 71.3 / 22.1); the stems go direct by the
cost model alone.  If the "stem" rows show the implicit GEMM ahead, set conv_igemm.DIRECT_DENSE_MAX_MACS = 2 ** 18.
--math: fp32 (FMA), tf32 (the implicit GEMM's and cuDNN's tensor cores; the direct kernels stay FMA), bf16.

    PYTHONPATH=. python3 tools/lenet_conv_ab.py [--reps 200] [--stems] [--math fp32,tf32,bf16]
"""
import argparse
import statistics

import numpy as np

from minidnn.backend import ConvolutionDescriptor
from minidnn.backend.conv_problem import make_problem
from minidnn.backend.cuda import conv_igemm as K

# name, x shape, w shape, padding, channels-last
LAYERS = [("conv1 C=1 K=6 5x5 32->28", (64, 1, 32, 32), (6, 1, 5, 5), 0, False),
          ("conv2 C=6 K=16 5x5 14->10", (64, 6, 14, 14), (16, 6, 5, 5), 0, False)]
STEMS = [("stem C=3 K=16 3x3 32 N128", (128, 3, 32, 32), (16, 3, 3, 3), 1, False),   # ResNet-20, MobileNet-small
         ("stem NHWC", (128, 3, 32, 32), (16, 3, 3, 3), 1, True)]


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


def _torch_times(xs, ws, pad, reps, dtype, tf32=False, cl=False):
    try:
        import torch
    except ImportError:
        return None
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = tf32
    dt = torch.float32 if dtype == "float32" else torch.bfloat16
    fmt = torch.channels_last if cl else torch.contiguous_format
    x = torch.randn(xs, device="cuda", dtype=dt).to(memory_format=fmt)
    w = torch.randn(ws, device="cuda", dtype=dt).to(memory_format=fmt)
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


def _layout(cp, a, cl):
    """``a`` (N, C, H, W) on the GPU, as an NHWC-memory view where ``cl``."""
    return cp.asarray(a) if not cl else cp.ascontiguousarray(cp.asarray(a).transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--stems", action="store_true", help="also the 3-channel 32x32 stems (ResNet-20, MobileNet)")
    ap.add_argument("--math", default="fp32,tf32,bf16", help="comma list of fp32, tf32, bf16")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], help="(old flag) --math fp32 or bf16")
    args = ap.parse_args(argv)
    import cupy as cp
    maths = [{"float32": "fp32", "bfloat16": "bf16"}[args.dtype]] if args.dtype else args.math.split(",")
    layers = LAYERS + (STEMS if args.stems else [])
    for math_ in maths:
        dtype, tf32 = ("bfloat16", False) if math_ == "bf16" else ("float32", math_ == "tf32")
        dt = np.float32
        if dtype == "bfloat16":
            import ml_dtypes
            dt = ml_dtypes.bfloat16
        print(f"us per call, {math_}: forward / backward data / backward filter")
        for name, xs, ws, pad, cl in layers:
            p = make_problem("ab", xs, ws, ConvolutionDescriptor(pad), dtype)
            rng = np.random.default_rng(0)
            x, w, dy = (rng.standard_normal(s).astype(dt) for s in (p.x_shape, p.w_shape, p.y_shape))
            x, dy, w = _layout(cp, x, cl), _layout(cp, dy, cl), cp.asarray(w)
            direct = [_timer(cp, f, args.reps) for f in (lambda: K.direct_forward(p, x, w),
                                                         lambda: K.direct_backward_data(p, w, dy),
                                                         lambda: K.direct_backward_filter(p, x, dy))]
            implicit = [_timer(cp, f, args.reps) for f in (lambda: K.implicit_forward(p, x, w, tf32, True),
                                                           lambda: K.implicit_backward_data(p, w, dy, tf32, True),
                                                           lambda: K.implicit_backward_filter(p, x, dy, tf32, True))]
            torch_t = _torch_times(xs, ws, pad, args.reps, dtype, tf32, cl)
            chosen = "direct" if K.direct_supports(p) is None else "implicit"
            row = f"{name:28s} direct {' / '.join(f'{t:6.1f}' for t in direct)}   implicit " \
                  f"{' / '.join(f'{t:6.1f}' for t in implicit)}"
            if torch_t:
                row += f"   cuDNN {' / '.join(f'{t:6.1f}' for t in torch_t)}"
            print(row + f"   (registry: {chosen}; direct/implicit {sum(direct) / sum(implicit):.2f})")


if __name__ == "__main__":
    main()

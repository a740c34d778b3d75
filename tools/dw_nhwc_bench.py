"""Times the NHWC depthwise kernels (conv_dw_nhwc) against the old path (conv_igemm.TILE_ENABLED off: the generic
direct kernels) and PyTorch channels_last (cuDNN, benchmark on), fwd / bwd-data / bwd-filter, ms per call (CUDA
events, median of 20 after 5 warm-up calls).  MobileNet-small-like depthwise layers at batch 128.

    python3 tools/dw_nhwc_bench.py [--dtype bf16|fp32]
"""
import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from minidnn.backend import ConvolutionDescriptor  # noqa: E402
from minidnn.backend.conv_problem import make_problem  # noqa: E402
from minidnn.backend.cuda import conv_igemm as K  # noqa: E402

# name, N, C, size, kernel, pad, stride
LAYERS = [
    ("dw3 s2 C16 32^2", 128, 16, 32, 3, 1, 2),
    ("dw3 s2 C72 16^2", 128, 72, 16, 3, 1, 2),
    ("dw3 s1 C88 8^2", 128, 88, 8, 3, 1, 1),
    ("dw5 s2 C96 8^2", 128, 96, 8, 5, 2, 2),
    ("dw5 s1 C240 4^2", 128, 240, 4, 5, 2, 1),
    ("dw5 s1 C576 4^2", 128, 576, 4, 5, 2, 1),
    ("dw3 s1 C128 56^2 (N32)", 32, 128, 56, 3, 1, 1),
]


def _time(fn, reps=20):
    import cupy as cp
    for _ in range(5):
        fn()
    ts = []
    for _ in range(reps):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(cp.cuda.get_elapsed_time(a, b))
    return float(np.median(ts))


def torch_calls(torch, N, C, size, k, pad, st, tdt):
    """PyTorch channels_last depthwise calls of one layer (random data): {"fwd", "dgrad", "wgrad"} -> callable."""
    tx = torch.randn(N, C, size, size, device="cuda", dtype=tdt).to(memory_format=torch.channels_last)
    tw = torch.randn(C, 1, k, k, device="cuda", dtype=tdt)
    ty = torch.nn.functional.conv2d(tx, tw, padding=pad, stride=st, groups=C)
    tdy = torch.randn_like(ty).contiguous(memory_format=torch.channels_last)
    conv_args = ([st] * 2, [pad] * 2, [1, 1], False, [0, 0], C)
    return {"fwd": lambda: torch.nn.functional.conv2d(tx, tw, padding=pad, stride=st, groups=C),
            "dgrad": lambda: torch.ops.aten.convolution_backward(tdy, tx, tw, None, *conv_args, [True, False, False]),
            "wgrad": lambda: torch.ops.aten.convolution_backward(tdy, tx, tw, None, *conv_args, [False, True, False])}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"))
    args = ap.parse_args()
    dt = "bfloat16" if args.dtype == "bf16" else "float32"
    import cupy as cp  # (imported here: tools/dw_nhwc_s7.py takes LAYERS without a GPU)
    try:
        import torch
    except ImportError:
        torch = None
    print(f"{'layer':26s} {'dir':5s} {'old':>8s} {'new':>8s} {'torch':>8s}  (ms, {args.dtype}, NHWC)")
    for name, N, C, size, k, pad, st in LAYERS:
        desc = ConvolutionDescriptor(pad, st, 1, C)
        p = make_problem("bench", (N, C, size, size), (C, 1, k, k), desc, dt)
        cdt = cp.float32 if dt == "float32" else __import__("ml_dtypes").bfloat16

        def nhwc(shape):
            n, c, h, w = shape
            return cp.asarray(np.random.standard_normal((n, h, w, c)).astype(cdt)).transpose(0, 3, 1, 2)
        x, dy, w = nhwc(p.x_shape), nhwc(p.y_shape), cp.asarray(np.random.standard_normal(p.w_shape).astype(cdt))
        calls = {"fwd": lambda: K.direct_forward(p, x, w), "dgrad": lambda: K.direct_backward_data(p, w, dy),
                 "wgrad": lambda: K.direct_backward_filter(p, x, dy)}
        tcalls = {}
        if torch is not None:
            torch.backends.cudnn.benchmark = True
            tdt = torch.bfloat16 if dt == "bfloat16" else torch.float32
            tcalls = torch_calls(torch, N, C, size, k, pad, st, tdt)
        for d, fn in calls.items():
            K.TILE_ENABLED[0] = False
            t_old = _time(fn)
            K.TILE_ENABLED[0] = True
            t_new = _time(fn)
            t_t = _time(tcalls[d]) if d in tcalls else float("nan")
            print(f"{name:26s} {d:5s} {t_old:8.4f} {t_new:8.4f} {t_t:8.4f}")


if __name__ == "__main__":
    main()

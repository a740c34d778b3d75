"""Time every implicit-GEMM tile on the convolution layers of the example models (ResNet-20, MobileNet-small's dense
convolutions, LeNet-5), per direction and math mode, beside the tile conv_igemm.choose_tile picks (issue 9: the
tile heuristic; small CIFAR layers give a few hundred blocks or fewer, under one or two waves of an H100/H200).

    PYTHONPATH=. python3 tools/tile_sweep.py [--reps 20] [--modes fp32,tf32,bf16]

Prints, per layer/direction/mode, µs per call for each tile (CUDA events around --reps back-to-back calls, median of
3 windows), the heuristic's pick and the fastest, then the total over the layers (weighted by how often each layer
appears in ResNet-20) for the heuristic against always taking the fastest.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from conv_kernels import _timer  # noqa: E402  (ms per call: CUDA events, median of 3 windows)

# name, count in ResNet-20 (per step), N, C, K, size, kernel, padding, stride
LAYERS = [
    ("stem 3->16 32^2", 1, 128, 3, 16, 32, 3, 1, 1),
    ("16->16 32^2", 6, 128, 16, 16, 32, 3, 1, 1),
    ("16->32 s2 32^2", 1, 128, 16, 32, 32, 3, 1, 2),
    ("32->32 16^2", 5, 128, 32, 32, 16, 3, 1, 1),
    ("32->64 s2 16^2", 1, 128, 32, 64, 16, 3, 1, 2),
    ("64->64 8^2", 5, 128, 64, 64, 8, 3, 1, 1),
    ("1x1 16->32 s2", 1, 128, 16, 32, 32, 1, 0, 2),
    ("1x1 32->64 s2", 1, 128, 32, 64, 16, 1, 0, 2),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--modes", default="fp32,tf32,bf16")
    args = ap.parse_args()
    import cupy as cp

    from minidnn.backend import ConvolutionDescriptor
    from minidnn.backend.conv_problem import make_problem
    from minidnn.backend.cuda import conv_igemm as K
    from minidnn.backend.cuda import launch

    sms = launch.sm_count()
    print(f"device: {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}, {sms} SMs; tiles {list(K.TILES)}")
    total_pick = total_best = 0.0
    for mode in args.modes.split(","):
        dtype = {"bf16": "bfloat16"}.get(mode, "float32")
        if dtype == "bfloat16":
            import ml_dtypes
            np_dtype = np.dtype(ml_dtypes.bfloat16)
        else:
            np_dtype = np.dtype(np.float32)
        tf32 = mode == "tf32"
        for name, count, N, C, Kc, size, k, pad, stride in LAYERS:
            p = make_problem("sweep", (N, C, size, size), (Kc, C, k, k), ConvolutionDescriptor(pad, stride),
                             np_dtype)
            rng = np.random.default_rng(0)
            x = cp.asarray(rng.normal(size=p.x_shape).astype(np_dtype))
            w = cp.asarray(rng.normal(size=p.w_shape).astype(np_dtype))
            dy = cp.asarray(rng.normal(size=p.y_shape).astype(np_dtype))
            H, W = p.in_size
            P, Q = p.out_size
            RS = k * k
            gemms = {"fwd": (N * P * Q, Kc), "dgrad": (N * H * W, C), "wgrad": (C * RS, Kc)}
            for direction, run in (("fwd", lambda t: K.implicit_forward(p, x, w, tf32, True, tile=t)),
                                   ("dgrad", lambda t: K.implicit_backward_data(p, w, dy, tf32, True, tile=t)),
                                   ("wgrad", lambda t: K.implicit_backward_filter(p, x, dy, tf32, True, tile=t))):
                times = {t: 1e3 * _timer(cp, lambda t=t: run(t), args.reps) for t in K.TILES}
                M, NG = gemms[direction]
                pick = K.choose_tile(M, NG, 1, sms)
                best = min(times, key=times.get)
                total_pick += count * times[pick]
                total_best += count * times[best]
                cells = " ".join(f"{t}:{us:7.1f}" for t, us in times.items())
                flag = "" if pick == best else f"  <- best {best} ({times[pick] / times[best]:.2f}x)"
                print(f"{mode:5} {name:16} {direction:6} M={M:7d} NG={NG:3d}  {cells}  pick {pick}{flag}")
    print(f"ResNet-20-weighted total: heuristic {total_pick:.0f} us, best tile each {total_best:.0f} us "
          f"({total_pick / total_best:.2f}x)")


if __name__ == "__main__":
    main()

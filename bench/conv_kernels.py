"""minidnn's CUDA convolution kernels (implicit GEMM, direct depthwise/grouped) beside PyTorch + cuDNN, one run.

    python bench/conv_kernels.py                # the layer table of issue 9, strict fp32 and TF32
    python bench/conv_kernels.py --reps 10 --layers 3

Per layer and math mode, forward + backward data + backward filter (ms, CUDA events around --reps back-to-back
calls after a warm-up, median of 3 such windows):
  kernels   the new kernels called directly (IMPLICIT_PRECOMP_GEMM + bwd-data ALGO_0 + bwd-filter ALGO_3 for dense
            layers; the direct kernels for depthwise/grouped)
  tuned     the primitives with handle.benchmark=True: the autotuner's choice per direction (named)
  cuDNN     torch.nn.functional.conv2d forward + backward (x and w gradients), torch.backends.cudnn.benchmark=True,
            torch.backends.cudnn.allow_tf32 set to the mode
and the ratios kernels/cuDNN and tuned/cuDNN, then geometric means per family (dense, depthwise/grouped).
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# name, N, C, K, size, kernel, padding, stride, groups
LAYERS = [
    ("CIFAR 3x3 N128 C=K=16 32^2", 128, 16, 16, 32, 3, 1, 1, 1),
    ("CIFAR 3x3 N128 C=K=64 8^2", 128, 64, 64, 8, 3, 1, 1, 1),
    ("ResNet18 3x3 N32 C=K=64 56^2", 32, 64, 64, 56, 3, 1, 1, 1),
    ("1x1 N32 256->64 56^2", 32, 256, 64, 56, 1, 0, 1, 1),
    ("depthwise 3x3 N32 C128 56^2", 32, 128, 128, 56, 3, 1, 1, 128),
    ("depthwise 3x3 N32 C512 14^2", 32, 512, 512, 14, 3, 1, 1, 512),
    ("grouped(32) 3x3 N32 C128 28^2", 32, 128, 128, 28, 3, 1, 1, 32),
]


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
        windows.append(cp.cuda.get_elapsed_time(start, stop) / reps)
    return statistics.median(windows)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--layers", type=int, default=len(LAYERS))
    args = ap.parse_args()

    import cupy as cp
    import torch

    from minidnn.backend import (
        ConvolutionDescriptor,
        Handle,
        MathType,
        convolution_backward_data,
        convolution_backward_filter,
        convolution_forward,
    )
    from minidnn.backend.conv_algorithms import BACKWARD_DATA_ALGORITHMS, BACKWARD_FILTER_ALGORITHMS, FORWARD_ALGORITHMS
    from minidnn.backend.conv_problem import make_problem
    from minidnn.backend.convolution import get_convolution_algorithm_cache
    from minidnn.backend.cuda import conv_igemm as K

    torch.backends.cudnn.benchmark = True
    print(f"device: {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}  torch {torch.__version__} "
          f"cuDNN {torch.backends.cudnn.version()}")
    rows = []
    for name, N, C, Kc, size, k, pad, stride, groups in LAYERS[:args.layers]:
        for mode in ("fp32", "tf32"):
            tf32 = mode == "tf32"
            mt = MathType.TENSOR_OP if tf32 else MathType.DEFAULT
            desc = ConvolutionDescriptor(pad, stride, 1, groups, math_type=mt)
            p = make_problem("bench", (N, C, size, size), (Kc, C // groups, k, k), desc, np.float32)
            x = cp.random.standard_normal(p.x_shape, dtype=np.float32)
            w = cp.random.standard_normal(p.w_shape, dtype=np.float32)
            dy = cp.random.standard_normal(p.y_shape, dtype=np.float32)
            direct = K.direct_supports(p) is None
            if direct:
                parts = [lambda: K.direct_forward(p, x, w), lambda: K.direct_backward_data(p, w, dy),
                         lambda: K.direct_backward_filter(p, x, dy)]
            else:
                parts = [lambda: K.implicit_forward(p, x, w, tf32, True),
                         lambda: K.implicit_backward_data(p, w, dy, tf32, True),
                         lambda: K.implicit_backward_filter(p, x, dy, tf32, True)]
            t_parts = [_timer(cp, f, args.reps) for f in parts]
            h = Handle("cuda", benchmark=True, math_type=mt)
            tuned = [lambda: convolution_forward(h, x, w, desc),
                     lambda: convolution_backward_data(h, w, dy, desc, p.x_shape),
                     lambda: convolution_backward_filter(h, x, dy, desc, p.w_shape)]
            t_tuned = [_timer(cp, f, args.reps) for f in tuned]
            cache = get_convolution_algorithm_cache()
            chosen = []
            for reg in (FORWARD_ALGORITHMS, BACKWARD_DATA_ALGORITHMS, BACKWARD_FILTER_ALGORITHMS):
                picks = [perf.algo.name for key, perf in cache.items() if key[0] == reg.name and key[1] == p
                         and key[3] is h.effective_math_type(np.float32, mt)]
                chosen.append(picks[-1] if picks else "?")
            torch.backends.cudnn.allow_tf32 = tf32
            torch.backends.cuda.matmul.allow_tf32 = tf32
            tx = torch.randn(p.x_shape, device="cuda", requires_grad=True)
            tw = torch.randn(p.w_shape, device="cuda", requires_grad=True)
            tdy = torch.randn(p.y_shape, device="cuda")

            def torch_step():
                y = torch.nn.functional.conv2d(tx, tw, padding=pad, stride=stride, groups=groups)
                y.backward(tdy)
            t_torch = _timer(cp, torch_step, args.reps)
            torch.cuda.synchronize()
            rows.append((name, mode, direct, t_parts, t_tuned, chosen, t_torch))
            print(f"{name:32s} {mode}  kernels {sum(t_parts):7.3f} ms (fwd {t_parts[0]:.3f} dgrad {t_parts[1]:.3f} "
                  f"wgrad {t_parts[2]:.3f})  tuned {sum(t_tuned):7.3f} ms {'/'.join(chosen)}  "
                  f"cuDNN {t_torch:7.3f} ms", flush=True)
            x = w = dy = tx = tw = tdy = parts = tuned = None      # free the layer's arrays before the next
            cp.get_default_memory_pool().free_all_blocks()

    print("\n| layer | mode | kernels ms | tuned ms (fwd/dgrad/wgrad algo) | cuDNN ms | kernels/cuDNN | tuned/cuDNN |")
    print("|---|---|---|---|---|---|---|")
    ratios = {}
    for name, mode, direct, tp, tt, chosen, tc in rows:
        rk, rt = sum(tp) / tc, sum(tt) / tc
        fam = "depthwise/grouped" if direct else "dense"
        ratios.setdefault((fam, mode), []).append((rk, rt))
        print(f"| {name} | {mode} | {sum(tp):.3f} ({tp[0]:.3f}/{tp[1]:.3f}/{tp[2]:.3f}) | {sum(tt):.3f} "
              f"({'/'.join(chosen)}) | {tc:.3f} | {rk:.2f}x | {rt:.2f}x |")
    print()
    for (fam, mode), rs in sorted(ratios.items()):
        gk = math.exp(statistics.mean(math.log(r[0]) for r in rs))
        gt = math.exp(statistics.mean(math.log(r[1]) for r in rs))
        print(f"geomean {fam:18s} {mode}: kernels {gk:.2f}x cuDNN, tuned {gt:.2f}x cuDNN ({len(rs)} layers)")


if __name__ == "__main__":
    main()

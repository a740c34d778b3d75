"""minidnn's CUDA convolution kernels (implicit GEMM, direct depthwise/grouped) beside PyTorch + cuDNN, one run.

    python bench/conv_kernels.py                # the layer table of issue 9, strict fp32 and TF32
    python bench/conv_kernels.py --reps 10 --layers 3
    python bench/conv_kernels.py --match depthwise   # only the layers whose name contains "depthwise"
    python bench/conv_kernels.py --layout nhwc  # ResNet-20's 3x3 layers in NHWC: element loader vs VEC loader

This is issue 9's ``bench/conv_gpu.py`` (that name runs this file).  Per layer and math mode, forward + backward
data + backward filter (ms, CUDA events around --reps back-to-back calls after a warm-up, median of 3 such
windows), each direction and their sum, with TFLOP/s (3 x 2 x multiply-adds per fwd+bwd) and % of the device's
dense peak (H100/H200: 67 fp32, 495 TF32):
  kernels   the new kernels called directly (IMPLICIT_PRECOMP_GEMM + bwd-data ALGO_0 + bwd-filter ALGO_3 for dense
            layers; the direct kernels for depthwise/grouped)
  tuned     the primitives with handle.benchmark=True: the autotuner's choice per direction (named)
  cuDNN     torch.nn.functional.conv2d forward + backward (x and w gradients), torch.backends.cudnn.benchmark=True,
            torch.backends.cudnn.allow_tf32 set to the mode
and the ratios kernels/cuDNN and tuned/cuDNN, then geometric means per family (dense, depthwise/grouped).

--layout nhwc: ResNet-20's 3x3 layers at batch 128 (NHWC activations, channels-last filters), bf16 / fp32 TF32 /
strict fp32, each direction timed through the kernels with the NHWC 16-byte loader switched off ("element", the
old path) and on ("vec"), beside PyTorch channels_last (cudnn.benchmark on, allow_tf32 set to the mode: strict
fp32 is asked for explicitly), forward and the two gradients timed separately (torch.ops.aten.convolution_backward).
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
    ("stem 7x7 s2 N32 3->64 224^2", 32, 3, 64, 224, 7, 3, 2, 1),
    ("LeNet 5x5 N64 6->16 14^2", 64, 6, 16, 14, 5, 0, 1, 1),
    ("depthwise 3x3 s2 N32 C128 56^2", 32, 128, 128, 56, 3, 1, 2, 128),
]

# dense peak rates (TFLOP/s, no sparsity) for the % of peak column; other devices print no percentage
_PEAKS = {"H100": {"fp32": 67.0, "tf32": 495.0}, "H200": {"fp32": 67.0, "tf32": 495.0}}


def _peak(device_name, mode):
    return next((v[mode] for k, v in _PEAKS.items() if k in device_name), None)


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


# name, N, C, K, size, kernel, padding, stride (ResNet-20's 3x3 convolutions, CIFAR batch 128)
NHWC_LAYERS = [
    ("16->16 32^2", 128, 16, 16, 32, 3, 1, 1),
    ("16->32 s2 32^2", 128, 16, 32, 32, 3, 1, 2),
    ("32->32 16^2", 128, 32, 32, 16, 3, 1, 1),
    ("32->64 s2 16^2", 128, 32, 64, 16, 3, 1, 2),
    ("64->64 8^2", 128, 64, 64, 8, 3, 1, 1),
]


def nhwc_main(args):
    import cupy as cp
    import torch

    from minidnn.backend import ConvolutionDescriptor
    from minidnn.backend.conv_problem import make_problem
    from minidnn.backend.cuda import conv_igemm as K

    torch.backends.cudnn.benchmark = True
    print(f"device: {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}  torch {torch.__version__} "
          f"cuDNN {torch.backends.cudnn.version()}  (us per call; element = VEC loader off, vec = on)")
    modes = args.modes.split(",")
    totals = {}
    for mode in modes:
        if mode == "bf16":
            import ml_dtypes
            np_dtype, t_dtype = np.dtype(ml_dtypes.bfloat16), torch.bfloat16
        else:
            np_dtype, t_dtype = np.dtype(np.float32), torch.float32
        tf32 = mode != "fp32"
        torch.backends.cudnn.allow_tf32 = mode == "tf32"
        torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"
        for name, N, C, Kc, size, k, pad, stride in NHWC_LAYERS[:args.layers]:
            p = make_problem("bench", (N, C, size, size), (Kc, C, k, k), ConvolutionDescriptor(pad, stride),
                             np_dtype)
            rng = np.random.default_rng(0)

            def nhwc(shape):
                n, c, h, w = shape
                a = rng.standard_normal((n, h, w, c)).astype(np.float32).astype(np_dtype)
                return cp.asarray(a).transpose(0, 3, 1, 2)
            x, dy, w = nhwc(p.x_shape), nhwc(p.y_shape), nhwc(p.w_shape)      # w: KRSC memory (channels_last)
            runs = {"fwd": lambda: K.implicit_forward(p, x, w, tf32, True),
                    "dgrad": lambda: K.implicit_backward_data(p, w, dy, tf32, True),
                    "wgrad": lambda: K.implicit_backward_filter(p, x, dy, tf32, True)}
            t = {}
            for variant in ("element", "vec"):
                K.VEC_ENABLED[0] = variant == "vec"
                for d, fn in runs.items():
                    t[(variant, d)] = 1e3 * _timer(cp, fn, args.reps)
            K.VEC_ENABLED[0] = True
            tx = torch.randn(p.x_shape, device="cuda", dtype=t_dtype).to(memory_format=torch.channels_last)
            tw = torch.randn(p.w_shape, device="cuda", dtype=t_dtype).to(memory_format=torch.channels_last)
            tdy = torch.randn(p.y_shape, device="cuda", dtype=t_dtype).to(memory_format=torch.channels_last)
            conv_args = ([stride] * 2, [pad] * 2, [1, 1], False, [0, 0], 1)
            bwd = torch.ops.aten.convolution_backward
            truns = {"fwd": lambda: torch.nn.functional.conv2d(tx, tw, padding=pad, stride=stride),
                     "dgrad": lambda: bwd(tdy, tx, tw, None, *conv_args, [True, False, False]),
                     "wgrad": lambda: bwd(tdy, tx, tw, None, *conv_args, [False, True, False])}
            for d, fn in truns.items():
                t[("torch", d)] = 1e3 * _timer(cp, fn, args.reps)
            torch.cuda.synchronize()
            for d in runs:
                for v in ("element", "vec", "torch"):
                    totals[(mode, v)] = totals.get((mode, v), 0.0) + t[(v, d)]
            cells = "  ".join(f"{d} {t[('element', d)]:6.1f}/{t[('vec', d)]:6.1f}/{t[('torch', d)]:6.1f}"
                              for d in runs)
            print(f"{mode:5} {name:15} element/vec/torch: {cells}", flush=True)
            x = dy = w = tx = tw = tdy = None
            cp.get_default_memory_pool().free_all_blocks()
    print()
    for mode in modes:
        e, v, tt = (totals[(mode, k)] for k in ("element", "vec", "torch"))
        print(f"{mode:5} sum over the layers (fwd+dgrad+wgrad, one of each): element {e:7.1f} us  vec {v:7.1f} us "
              f"({e / v:.2f}x faster)  torch channels_last {tt:7.1f} us  (vec/torch {v / tt:.2f}x)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--layers", type=int, default=len(LAYERS))
    ap.add_argument("--match", default="", help="only the layers whose name contains this text")
    ap.add_argument("--layout", choices=("nchw", "nhwc"), default="nchw",
                    help="nhwc: ResNet-20's layers, element loader vs the VEC loader vs PyTorch channels_last")
    ap.add_argument("--modes", default="bf16,tf32,fp32", help="--layout nhwc: the data/math modes to time")
    args = ap.parse_args()
    if args.layout == "nhwc":
        return nhwc_main(args)

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
        if args.match not in name:
            continue
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
            conv_args = ([stride] * 2, [pad] * 2, [1, 1], False, [0, 0], groups)
            bwd = torch.ops.aten.convolution_backward
            with torch.no_grad():
                t_torch_parts = [_timer(cp, f, args.reps) for f in (
                    lambda: torch.nn.functional.conv2d(tx, tw, padding=pad, stride=stride, groups=groups),
                    lambda: bwd(tdy, tx, tw, None, *conv_args, [True, False, False]),
                    lambda: bwd(tdy, tx, tw, None, *conv_args, [False, True, False]))]
            torch.cuda.synchronize()
            flops = 3 * 2 * p.macs          # forward, backward data and backward filter: one GEMM's work each
            rows.append((name, mode, groups, t_parts, t_tuned, chosen, t_torch, t_torch_parts, flops))
            print(f"{name:32s} {mode}  kernels {sum(t_parts):7.3f} ms (fwd {t_parts[0]:.3f} dgrad {t_parts[1]:.3f} "
                  f"wgrad {t_parts[2]:.3f})  tuned {sum(t_tuned):7.3f} ms {'/'.join(chosen)}  "
                  f"cuDNN {t_torch:7.3f} ms (fwd {t_torch_parts[0]:.3f} dgrad {t_torch_parts[1]:.3f} "
                  f"wgrad {t_torch_parts[2]:.3f})", flush=True)
            x = w = dy = tx = tw = tdy = parts = tuned = None      # free the layer's arrays before the next
            cp.get_default_memory_pool().free_all_blocks()

    dev_name = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    print("\n| layer | mode | kernels ms (fwd/dgrad/wgrad) | tuned ms (algos) | cuDNN ms (fwd/dgrad/wgrad) | "
          "kernels/cuDNN | tuned/cuDNN | kernels TFLOP/s (% peak) | cuDNN TFLOP/s |")
    print("|---|---|---|---|---|---|---|---|---|")
    ratios = {}
    for name, mode, groups, tp, tt, chosen, tc, tcp, flops in rows:
        rk, rt = sum(tp) / tc, sum(tt) / tc
        fam = "dense" if groups == 1 else "depthwise/grouped"
        ratios.setdefault((fam, mode), []).append((rk, rt))
        tf_k, tf_c = flops / sum(tp) / 1e9, flops / tc / 1e9
        peak = _peak(dev_name, mode)
        pct = f" ({100 * tf_k / peak:.0f}%)" if peak else ""
        print(f"| {name} | {mode} | {sum(tp):.3f} ({tp[0]:.3f}/{tp[1]:.3f}/{tp[2]:.3f}) | {sum(tt):.3f} "
              f"({'/'.join(chosen)}) | {tc:.3f} ({tcp[0]:.3f}/{tcp[1]:.3f}/{tcp[2]:.3f}) | {rk:.2f}x | {rt:.2f}x | "
              f"{tf_k:.1f}{pct} | {tf_c:.1f} |")
    print()
    for (fam, mode), rs in sorted(ratios.items()):
        gk = math.exp(statistics.mean(math.log(r[0]) for r in rs))
        gt = math.exp(statistics.mean(math.log(r[1]) for r in rs))
        print(f"geomean {fam:18s} {mode}: kernels {gk:.2f}x cuDNN, tuned {gt:.2f}x cuDNN ({len(rs)} layers)")


if __name__ == "__main__":
    main()

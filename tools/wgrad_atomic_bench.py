"""Atomic (ALGO_3, ATOMIC=1) vs deterministic (ALGO_0's kernel) implicit-GEMM filter gradient on a GPU: median ms
of --reps calls by CUDA events per layer, fp32 and TF32, NCHW and NHWC activations.

    PYTHONPATH=. python3 tools/wgrad_atomic_bench.py --reps 50
"""
import argparse
import statistics

import numpy as np

LAYERS = [("resnet18 3x3 64ch 56^2 N32", (32, 64, 56, 56), (64, 64, 3, 3)),
          ("cifar 3x3 16ch 32^2 N128", (128, 16, 32, 32), (16, 16, 3, 3))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=50)
    args = ap.parse_args()
    import cupy as cp

    from minidnn.backend import ConvolutionDescriptor
    from minidnn.backend.conv_problem import make_problem
    from minidnn.backend.cuda import conv_igemm as K
    for name, xs, ws in LAYERS:
        desc = ConvolutionDescriptor(1, 1, 1, 1)
        p = make_problem("bench", xs, ws, desc, "float32")
        rng = np.random.default_rng(0)
        x = cp.asarray(rng.standard_normal(xs), np.float32)
        dy = cp.asarray(rng.standard_normal(p.y_shape), np.float32)
        for layout in ("NCHW", "NHWC"):
            if layout == "NHWC":
                x = cp.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
                dy = cp.ascontiguousarray(dy.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
            for tf32 in (False, True):
                res = {}
                for atomic in (False, True):
                    out = cp.empty(p.w_shape, np.float32)
                    for _ in range(3):
                        K.implicit_backward_filter(p, x, dy, tf32, True, out=out, atomic=atomic)
                    times = []
                    for _ in range(args.reps):
                        a, b = cp.cuda.Event(), cp.cuda.Event()
                        a.record()
                        K.implicit_backward_filter(p, x, dy, tf32, True, out=out, atomic=atomic)
                        b.record()
                        b.synchronize()
                        times.append(cp.cuda.get_elapsed_time(a, b))
                    res[atomic] = (statistics.median(times), out.copy())
                diff = float(cp.abs(res[True][1] - res[False][1]).max() / (cp.abs(res[False][1]).max() + 1e-30))
                print(f"{name:28s} {layout} {'tf32' if tf32 else 'fp32'}: deterministic {res[False][0]:.4f} ms  "
                      f"atomic {res[True][0]:.4f} ms  ratio {res[True][0] / res[False][0]:.2f}  "
                      f"max rel diff {diff:.1e}", flush=True)


if __name__ == "__main__":
    main()

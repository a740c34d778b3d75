"""Dropout kernels on the GPU: forward and backward time per (unroll, blocks-per-SM) setting of
backend/cuda/dropout_philox.py, beside the first kernel (MINIDNN_DROPOUT_V1's, forward float32 only) and PyTorch's
native_dropout / native_dropout_backward, for float32, bfloat16 and float16 on a large and a small activation.

    python tools/dropout_bench.py [--dtypes float32,bfloat16,float16] [--trials 5]

Timing and traffic as bench/kernels_gpu.py (its Timer and copy bandwidth; %copy = compulsory traffic -- x or dy
and the output, plus the 1-byte mask -- over the time, against a 256 MiB device copy).  A setting "u2/b8" is
UNROLL 2 with at most 8 blocks per SM ("b0": no cap, one pass).  The default setting is marked with *.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import kernels_gpu as K  # noqa: E402

import minidnn.backend as B  # noqa: E402
from minidnn.backend import devices as _dev  # noqa: E402
from minidnn.backend.cuda import dropout_philox as DP  # noqa: E402

SHAPES = ((128, 64, 56, 56), (128, 16, 32, 32))
SETTINGS = ((1, 8), (2, 8), (4, 8), (1, 0), (2, 0), (4, 0))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtypes", default="float32,bfloat16,float16")
    ap.add_argument("--trials", type=int, default=5)
    args = ap.parse_args(argv)
    if not _dev.cuda_is_available():
        print("dropout_bench: no CUDA GPU with CuPy here; nothing to measure")
        return 0
    cp = _dev.require_cupy()
    try:
        import torch
    except ImportError:
        torch = None
    timer = K.Timer(cp, torch, args.trials)
    bw = K.copy_bandwidth(cp, timer)
    print(f"device: {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}; copy bandwidth {bw:.0f} GB/s")
    default = (DP.UNROLL_FWD, DP.BPS_FWD), (DP.UNROLL_BWD, DP.BPS_BWD)
    from minidnn.nn._functions.activation import _SeededDropoutDescriptor
    desc = _SeededDropoutDescriptor(0.5)
    print(f"{'dtype':9s} {'shape':20s} {'dir':4s} {'setting':10s} {'ms':>8s} {'%copy':>6s} {'torch ms':>9s} "
          f"{'vs torch':>8s}")
    for name in args.dtypes.split(","):
        cases = K.Cases(cp, torch, name)
        for shape in SHAPES:
            x, dy = cases.x(shape), cases.x(shape)
            nbytes = 2 * x.nbytes + x.size
            _, mask = B.dropout_forward(None, desc, x)
            tf = tb = None
            if torch is not None:
                xt, dyt = cases.t(shape), cases.t(shape)
                _, mt = torch.ops.aten.native_dropout(xt, 0.5, True)
                tf = timer.torch_(lambda: torch.ops.aten.native_dropout(xt, 0.5, True))
                tb = timer.torch_(lambda: torch.ops.aten.native_dropout_backward(dyt, mt, 2.0))
            rows = []
            for u, b in SETTINGS:
                DP.UNROLL_FWD, DP.BPS_FWD, DP.UNROLL_BWD, DP.BPS_BWD = u, b, u, b
                DP._plans.clear()
                rows.append(("fwd", (u, b), timer.cupy(lambda: B.dropout_forward(None, desc, x)), tf))
                rows.append(("bwd", (u, b), timer.cupy(lambda: B.dropout_backward(None, desc, dy, mask)), tb))
            (DP.UNROLL_FWD, DP.BPS_FWD), (DP.UNROLL_BWD, DP.BPS_BWD) = default
            DP._plans.clear()
            if name == "float32":           # the first kernel, for the A/B
                DP.V1 = True
                DP._plans.clear()
                rows.append(("fwd", "v1", timer.cupy(lambda: B.dropout_forward(None, desc, x)), tf))
                DP.V1 = False
                DP._plans.clear()
            for d, setting, ms, tms in sorted(rows, key=lambda r: r[0]):
                mark = "*" if setting == default[d == "bwd"] else " "
                label = setting if isinstance(setting, str) else f"u{setting[0]}/b{setting[1]}"
                pct = 100 * nbytes / (ms * 1e-3) / 1e9 / bw
                tcol = f"{tms:9.4f} {tms / ms:7.2f}x" if tms else ""
                print(f"{name:9s} {str(shape):20s} {d:4s} {label + mark:10s} {ms:8.4f} {pct:5.0f}% {tcol}")
            sys.stdout.flush()
        del cases
        cp.get_default_memory_pool().free_all_blocks()
    return 0


if __name__ == "__main__":
    sys.exit(main())

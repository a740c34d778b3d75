"""The staging transposes (conv_igemm nchw_to_nhwc) V1 vs V2 on the GPU: device µs per copy (a CUDA graph of
back-to-back copies) and GB/s of its compulsory traffic (read + write), at ResNet-20 / MobileNet-small activation
shapes and one large tensor, float32 and bfloat16.

    PYTHONPATH=. python3 tools/transpose_ab.py
"""
from __future__ import annotations

import os
import sys

import cupy as cp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from graph_timer import graph_time  # noqa: E402

from minidnn.backend.cuda import conv_igemm as K  # noqa: E402

SHAPES = [(128, 16, 32, 32), (128, 32, 16, 16), (128, 64, 8, 8), (128, 16, 16, 16), (128, 32, 8, 8),
          (128, 64, 56, 56), (16, 16, 1, 9), (64, 64, 1, 9)]


def main():
    import ml_dtypes
    print(f"{'shape':>20} {'dtype':>9} | {'V1 us':>8} {'GB/s':>6} | {'V2 us':>8} {'GB/s':>6} | V2/V1")
    for dt in (np.float32, ml_dtypes.bfloat16):
        for shape in SHAPES:
            a = cp.asarray(np.random.default_rng(0).standard_normal(shape).astype(np.float32).astype(dt))
            out = cp.empty((shape[0], shape[2], shape[3], shape[1]), dtype=a.dtype)
            res = []
            for v2 in (False, True):
                K.TRANSPOSE_V2[0] = v2
                run = K._transposer(a)
                t = graph_time(cp, lambda: run(a, out), 20, 7)
                assert cp.array_equal(out.transpose(0, 3, 1, 2), a)
                res.append(t * 1e3 if t is not None else float("nan"))
            gb = 2 * a.nbytes / 1e3
            print(f"{str(shape):>20} {np.dtype(dt).name:>9} | {res[0]:8.2f} {gb / res[0]:6.0f} | {res[1]:8.2f} "
                  f"{gb / res[1]:6.0f} | {res[1] / res[0]:.2f}")
    K.TRANSPOSE_V2[0] = True


if __name__ == "__main__":
    main()

"""Host cost of one cublasLt product as minidnn makes it (blas.lt_product -> cublas._LtCall.run -> ctypes
cublasLtMatmul) beside CuPy's matmul and PyTorch's F.linear / mm at LeNet-5's linear shapes (batch 64): µs of host
time per call, back-to-back calls without a synchronisation (the GPU keeps up: these products take a few µs).

    PYTHONPATH=. python3 tools/lt_host.py
"""
from __future__ import annotations

import time

import cupy as cp
import numpy as np

from minidnn.backend import blas
from minidnn.backend.cuda import cublas


def host_us(fn, n=400, rounds=5):
    for _ in range(20):
        fn()
    cp.cuda.Device().synchronize()
    best = 1e9
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
        cp.cuda.Device().synchronize()
    return best


def main():
    try:
        import torch
    except ImportError:
        torch = None
    for (m, k, n) in [(64, 400, 120), (64, 120, 84), (64, 84, 10)]:
        x = cp.random.standard_normal((m, k), dtype=np.float32)
        w = cp.random.standard_normal((n, k), dtype=np.float32)
        b = cp.random.standard_normal((n,), dtype=np.float32)
        g = cp.random.standard_normal((m, n), dtype=np.float32)
        dw = cp.empty((n, k), dtype=np.float32)
        rows = {
            "fwd lt_product(bias)": lambda: blas.lt_product(x, w.T, bias=b),
            "fwd lt_product(no bias)": lambda: blas.lt_product(x, w.T),
            "dx lt_product": lambda: blas.lt_product(g, w),
            "dw lt_product(out, row_sums)": lambda: blas.lt_product(g.T, x, out=dw, row_sums=True),
            "dw lt_product(out)": lambda: blas.lt_product(g.T, x, out=dw),
            "cupy x @ w.T": lambda: x @ w.T,
            "cupy.empty((m, n))": lambda: cp.empty((m, n), dtype=np.float32),
        }
        # the prepared call alone (its ctypes cublasLtMatmul), the bias pointer unchanged
        handle, ws, calls = cublas._lt_state(cp)
        out = cp.empty((m, n), dtype=np.float32)
        blas.lt_product(x, w.T, out=out)
        call = [c for key, c in calls.items() if c is not None and key[0] == x.shape and key[3] == (k, n)][-1]
        sp = cp.cuda.get_current_stream().ptr
        rows["_LtCall.run alone"] = lambda: call.run(x, w.T, out, None, sp)
        if torch is not None:
            tx, tw, tb = (torch.randn(*s, device="cuda") for s in ((m, k), (n, k), (n,)))
            tg = torch.randn(m, n, device="cuda")
            rows["torch F.linear(bias)"] = lambda: torch.nn.functional.linear(tx, tw, tb)
            rows["torch mm (dx)"] = lambda: tg.mm(tw)
            rows["torch empty"] = lambda: torch.empty(m, n, device="cuda")
        print(f"-- ({m}, {k}) @ ({k}, {n}): host µs per call (best of 5 x 400)")
        for name, fn in rows.items():
            print(f"  {name:32s} {host_us(fn):7.2f}")
    print("algo set for every prepared call:", all(c is None or c.algo is not None for c in calls.values()))


if __name__ == "__main__":
    main()

"""Host microseconds of the calls an eager GPU step makes most (session 19): a prepared own-kernel launch, a prepared
cublasLt product (2-D, and batched over NCHW images as conv_pointwise runs MobileNet's 1x1 convolutions), cupy.empty,
an ndarray built on kept pool memory (workspace.fresh's way), a transpose view -- and whether the cublasLt call waits
for the GPU (timed once with a long kernel queued ahead of it).

    PYTHONPATH=. python3 tools/host_call_probe.py [--calls 300]

Each figure: the fastest of 5 rounds of `calls` back-to-back calls, perf_counter, no synchronisation inside a round
(the device is synchronised between rounds; the calls' device work is small, so the launch queue never fills).
"""
# ruff: noqa: E501  (a measuring script: one line a figure)
from __future__ import annotations

import argparse
import time

import cupy as cp
import numpy as np

from minidnn.backend.cuda import cublas
from minidnn.backend.cuda import launch as L

SPIN = r'''extern "C" __global__ void spin(long long cycles, float* out) {
    long long t0 = clock64(); while (clock64() - t0 < cycles) {} if (threadIdx.x == 0 && out) out[0] = 1.f; }'''
NOP = r'''extern "C" __global__ void nop(float* a, float* b, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) b[i] = a[i]; }'''


def per_call(fn, calls, rounds=5):
    best = float("inf")
    for _ in range(rounds):
        cp.cuda.runtime.deviceSynchronize()
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, time.perf_counter() - t)
    cp.cuda.runtime.deviceSynchronize()
    return best / calls * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=300)
    n = ap.parse_args().calls
    nop = cp.RawKernel(NOP, "nop")
    a = cp.ones(1024, cp.float32)
    b = cp.empty_like(a)
    prep = L.prepare(nop, (4,), (256,), [None, None, np.int32(1024)])
    print(f"prepared own launch (launch.prepare)      {per_call(lambda: prep(a, b), n):7.2f} us")
    print(f"RawKernel call                            {per_call(lambda: nop((4,), (256,), (a, b, np.int32(1024))), n):7.2f} us")
    print(f"cupy.empty (128,64,16,16) f32             {per_call(lambda: cp.empty((128, 64, 16, 16), cp.float32), n):7.2f} us")
    mp = cp.cuda.MemoryPointer(cp.cuda.alloc(128 * 64 * 16 * 16 * 4).mem, 0)
    print(f"ndarray on kept memory (workspace.fresh)  {per_call(lambda: cp.ndarray((128, 64, 16, 16), cp.float32, mp), n):7.2f} us")
    import ml_dtypes
    bf = np.dtype(ml_dtypes.bfloat16)
    print(f"ndarray on kept memory, bfloat16          {per_call(lambda: cp.ndarray((128, 64, 16, 16), bf, mp), n):7.2f} us")
    print(f"cupy.empty (128,64,16,16) bfloat16        {per_call(lambda: cp.empty((128, 64, 16, 16), bf), n):7.2f} us")
    xf, xb = cp.empty((128, 64, 16, 16), cp.float32), cp.empty((128, 64, 16, 16), bf)
    print(f"a.data.ptr float32 / bfloat16             {per_call(lambda: xf.data.ptr, n):7.2f} / {per_call(lambda: xb.data.ptr, n):7.2f} us")
    print(f"a.astype(bfloat16) (128,64,16,16)         {per_call(lambda: xf.astype(bf), n):7.2f} us")
    print(f"xb.transpose(0, 2, 3, 1) bfloat16         {per_call(lambda: xb.transpose(0, 2, 3, 1), n):7.2f} us")
    x = cp.empty((128, 64, 16, 16), cp.float32)
    print(f"x.transpose(0, 2, 3, 1)                   {per_call(lambda: x.transpose(0, 2, 3, 1), n):7.2f} us")
    print(f"cuda.get_current_stream()                 {per_call(lambda: cp.cuda.get_current_stream(), n):7.2f} us")
    for dt in (cp.float32, cp.float16):
        for (M, K, N) in ((128, 64, 10), (32768, 64, 128), (8192, 128, 256), (2048, 256, 256)):
            A = cp.random.rand(M, K).astype(dt)
            B = cp.random.rand(K, N).astype(dt)
            out = cp.empty((M, N), dt)
            r = cublas.lt_product(A, B, out=out)
            if r is None:
                print(f"lt_product {M}x{K}x{N} {np.dtype(dt).name}: not taken")
                continue
            t_lt = per_call(lambda: cublas.lt_product(A, B, out=out), n)
            handle, ws, calls = cublas._lt_state(cp)
            call = [c for c in calls.values() if c][-1]
            s = cp.cuda.get_current_stream().ptr
            t_run = per_call(lambda: call.run(A, B, out, None, s), n)
            t_mm = per_call(lambda: cp.matmul(A, B, out=out), n)
            print(f"{np.dtype(dt).name:8s} {M}x{K}x{N}: lt_product {t_lt:7.2f} us, _LtCall.run {t_run:7.2f} us, "
                  f"cupy.matmul {t_mm:7.2f} us")
    # conv_pointwise's NCHW form: y[n] (K, HW) = w (K, C) @ x[n] (C, HW), batched over the N images
    for dt in (cp.float32, cp.float16):
        for (Nb, C, K, HW) in ((128, 64, 128, 256), (128, 128, 256, 64), (128, 256, 256, 16)):
            w = cp.random.rand(K, C).astype(dt)
            x = cp.random.rand(Nb, C, HW).astype(dt)
            y = cp.empty((Nb, K, HW), dt)
            handle, ws, _ = cublas._lt_state(cp)
            call = cublas._lt_prepare(w, x[0], y[0], None, False, None, None, handle, ws,
                                      batch=(Nb, 0, C * HW, K * HW), align=16)
            if call is None:
                print(f"batched {Nb}x({K}x{C} @ {C}x{HW}) {np.dtype(dt).name}: not taken")
                continue
            s = cp.cuda.get_current_stream().ptr
            t_run = per_call(lambda: call.run(w, x, y, None, s), n)
            print(f"{np.dtype(dt).name:8s} batched {Nb} x ({K}x{C} @ {C}x{HW}): _LtCall.run {t_run:7.2f} us")
    # does cublasLtMatmul wait for the GPU?  queue a ~2 ms spin, then time one product's host call
    spin = cp.RawKernel(SPIN, "spin")
    A = cp.random.rand(2048, 256).astype(cp.float32)
    B = cp.random.rand(256, 256).astype(cp.float32)
    out = cp.empty((2048, 256), cp.float32)
    cublas.lt_product(A, B, out=out)
    cp.cuda.runtime.deviceSynchronize()
    spin((1,), (32,), (np.int64(4_000_000), out))
    t = time.perf_counter()
    cublas.lt_product(A, B, out=out)
    host = (time.perf_counter() - t) * 1e6
    t = time.perf_counter()
    cp.cuda.runtime.deviceSynchronize()
    rest = (time.perf_counter() - t) * 1e6
    print(f"lt_product behind a ~2 ms spin: host call {host:.1f} us, then the sync waited {rest:.1f} us "
          f"(a call that waited for the GPU would take ~2000 us and leave ~0)")


if __name__ == "__main__":
    main()

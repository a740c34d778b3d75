"""Host cost of CuPy array creation and views by dtype on the device host: float32 against bfloat16 (ml_dtypes) and
float16 -- whether the eager bf16 step's extra host time (amp_step: 1.11-1.21x our own fp32 step, none on the fake
CuPy) comes from CuPy's handling of a non-native dtype.

    PYTHONPATH=. python3 tools/bf16_host_probe.py
"""
import time

import cupy as cp
import numpy as np

import minidnn as mdn

N = 20000


def per_call(fn):
    for _ in range(200):
        fn()
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(N):
            fn()
        best = min(best, (time.perf_counter() - t) / N * 1e6)
    return best


def main():
    shape = (128, 16, 32, 32)
    mem = cp.cuda.alloc(int(np.prod(shape)) * 4)
    for name, dt in (("float32", np.dtype(np.float32)), ("float16", np.dtype(np.float16)),
                     ("bfloat16", np.dtype(mdn.bfloat16))):
        a = cp.ndarray(shape, dt, cp.cuda.MemoryPointer(mem.mem, 0))
        rows = [
            ("cp.ndarray(shape, dt, memptr)", lambda: cp.ndarray(shape, dt, cp.cuda.MemoryPointer(mem.mem, 0))),
            ("cp.empty(shape, dt)", lambda: cp.empty(shape, dtype=dt)),
            ("a.transpose(0, 2, 3, 1)", lambda: a.transpose(0, 2, 3, 1)),
            ("a.reshape(128, -1)", lambda: a.reshape(128, -1)),
            ("a.view()", lambda: a.view()),
            ("a.dtype == dt", lambda: a.dtype == dt),
            ("a.astype(dt) (same dtype)", lambda: a.astype(dt, copy=False)),
        ]
        print(f"{name}: " + ", ".join(f"{label} {per_call(fn):.2f} us" for label, fn in rows), flush=True)
    t16 = mdn.zeros(shape, device="cuda").to(mdn.bfloat16)
    t32 = mdn.zeros(shape, device="cuda")
    for label, t in (("float32", t32), ("bfloat16", t16)):
        print(f"Tensor {label}: relu {per_call(lambda: mdn.nn.functional.relu(t)):.2f} us, "
              f"add {per_call(lambda: t + t):.2f} us", flush=True)


if __name__ == "__main__":
    main()

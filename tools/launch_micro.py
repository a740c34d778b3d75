"""Host cost of one kernel launch, by way of launching (issue 10: the eager step is host-bound).

Times, per call (median of rounds of 2000, perf_counter, the GPU kept busy-free by a trivial kernel):
  raw34      CuPy RawKernel call with 34 arguments as NumPy scalars (what conv_igemm does today)
  raw34+attr the same plus the dynamic-shared-memory attribute read and written per launch (launch.py today)
  raw8       CuPy RawKernel call with 8 arguments
  pack34     struct.pack of the 34 values + cupy.cuda.driver.launchKernel with CU_LAUNCH_PARAM_BUFFER_POINTER
  pack8      the same with 8 arguments
  args34     building the 34 NumPy scalars alone
  empty      cupy.empty((128, 16, 32, 32), float32)
  stream     cupy.cuda.get_current_stream().ptr
and checks that the packed launch computes what the RawKernel launch computes.
"""
import ctypes
import statistics
import struct
import time

import cupy as cp
import numpy as np

SRC = r"""
extern "C" __global__ void k34(float* a, const float* b, const float* c, const float* d, const int* e,
    int n0, int n1, int n2, int n3, int n4, int n5, int n6, int n7, int n8, int n9, int n10, int n11, int n12,
    int n13, int n14, int n15, int n16, int n17, int n18, int n19, int n20, int n21, int n22, int n23, int n24,
    int n25, float f0, float f1) {
  if (threadIdx.x == 0 && blockIdx.x == 0)
    a[0] = n0 + n5 * 2 + n25 * 3 + f0 * 4 + f1 * 5 + (b == c ? 1 : 0) + (e == 0 ? 100 : 0);
}
extern "C" __global__ void k8(float* a, const float* b, int n0, int n1, int n2, int n3, float f0, float f1) {
  if (threadIdx.x == 0 && blockIdx.x == 0) a[0] = n0 + n3 * 2 + f0 * 4 + f1 * 5;
}
"""


def bench(fn, n=2000, rounds=7):
    per = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        per.append((time.perf_counter() - t0) / n * 1e6)
    cp.cuda.Device().synchronize()
    return statistics.median(per)


def main():
    mod = cp.RawModule(code=SRC)
    k34, k8 = mod.get_function("k34"), mod.get_function("k8")
    a, b = cp.zeros(4, np.float32), cp.zeros(4, np.float32)
    ints = list(range(1, 27))

    def args34():
        return [np.uint64(a.data.ptr), np.uint64(b.data.ptr), np.uint64(b.data.ptr), np.uint64(0), np.uint64(0),
                *[np.int32(v) for v in ints], np.float32(1.5), np.float32(2.5)]

    fixed34 = args34()
    fmt34 = struct.Struct("@5Q26iff")
    fmt8 = struct.Struct("@2Q4iff")
    buf_size = ctypes.c_size_t(fmt34.size)
    holder = {}

    def packed(kernel, fmt, values):
        raw = fmt.pack(*values)
        buf = ctypes.create_string_buffer(raw, len(raw))
        size = ctypes.c_size_t(len(raw))
        cfg = (ctypes.c_void_p * 5)(1, ctypes.addressof(buf), 2, ctypes.addressof(size), 0)
        holder["keep"] = (buf, size, cfg)
        cp.cuda.driver.launchKernel(kernel.kernel.ptr, 1, 1, 1, 32, 1, 1, 0,
                                    cp.cuda.get_current_stream().ptr, 0, ctypes.addressof(cfg))

    del buf_size
    vals34 = (a.data.ptr, b.data.ptr, b.data.ptr, 0, 0, *ints, 1.5, 2.5)
    vals8 = (a.data.ptr, b.data.ptr, 1, 2, 3, 4, 1.5, 2.5)

    def attr():
        k34.max_dynamic_shared_size_bytes = max(k34.max_dynamic_shared_size_bytes, 0)

    rows = {
        "raw34": bench(lambda: k34((1,), (32,), tuple(fixed34))),
        "raw34+attr": bench(lambda: (attr(), k34((1,), (32,), tuple(fixed34)))),
        "raw34+args": bench(lambda: k34((1,), (32,), tuple(args34()))),
        "raw8": bench(lambda: k8((1,), (32,), (a, b, np.int32(1), np.int32(2), np.int32(3), np.int32(4),
                                                np.float32(1.5), np.float32(2.5)))),
        "pack34": bench(lambda: packed(k34, fmt34, vals34)),
        "pack34+ptrs": bench(lambda: packed(k34, fmt34, (a.data.ptr, b.data.ptr, b.data.ptr, 0, 0, *ints, 1.5,
                                                        2.5))),
        "pack8": bench(lambda: packed(k8, fmt8, vals8)),
        "args34": bench(args34),
        "attr": bench(attr),
        "empty": bench(lambda: cp.empty((128, 16, 32, 32), np.float32)),
        "stream": bench(lambda: cp.cuda.get_current_stream().ptr),
        "ptr": bench(lambda: a.data.ptr),
    }
    # the packed launch computes what the RawKernel launch computes
    a[:] = -1
    k34((1,), (32,), tuple(fixed34))
    ref = float(a[0])
    a[:] = -1
    packed(k34, fmt34, vals34)
    got = float(a[0])
    a[:] = -1
    packed(k8, fmt8, vals8)
    got8 = float(a[0])
    print(f"check: raw {ref} packed {got} (equal: {ref == got}); k8 packed {got8} (expect {1 + 8 + 6 + 12.5})")
    for name, us in rows.items():
        print(f"{name:12} {us:7.2f} us")


if __name__ == "__main__":
    main()

"""backend/cuda/launch.py: the packed-argument launch computes what CuPy's own launch computes.

A probe kernel writes every argument it received back to device memory; launched through ``launch`` (the arguments
packed into a C struct by their types), through ``prepare`` (scalars packed once, pointers written per call) and
through CuPy's ``RawKernel.__call__``, it must read back the same values, for fresh random values of every scalar
type the kernels use, in orders that force padding (a 2-byte half before an 8-byte double, a 1-byte flag before a
pointer).  Also: a type struct cannot pack falls back to CuPy; launches are counted; a prepared launch checks its
array count; capture into a CUDA graph records the packed launch.
"""
import numpy as np
import pytest

from minidnn.backend import devices as _dev

pytestmark = pytest.mark.cuda

PROBE = r"""
#include <cuda_fp16.h>
extern "C" __global__ void probe(double* out, const signed char a, const float* p, const __half h, const double d,
                                 const int i, float* q, const long long n, const unsigned char u, const float f,
                                 const unsigned int ui, const unsigned long long ull)
{
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    out[0] = a; out[1] = p[0]; out[2] = __half2float(h); out[3] = d; out[4] = i; out[5] = q[1]; out[6] = (double)n;
    out[7] = u; out[8] = f; out[9] = ui; out[10] = (double)ull;
    q[0] = 42.0f;
}
"""


@pytest.fixture
def cp():
    if not _dev.cuda_is_available():
        pytest.skip("no CUDA GPU with CuPy on this machine")
    return _dev.require_cupy()


def _args(rng, cp, out, p, q):
    return [out, np.int8(rng.integers(-128, 127)), p, np.float16(rng.normal()), np.float64(rng.normal()),
            np.int32(rng.integers(-2**31, 2**31 - 1)), q, np.int64(rng.integers(-2**40, 2**40)),
            np.uint8(rng.integers(0, 255)), np.float32(rng.normal()), np.uint32(rng.integers(0, 2**32 - 1)),
            np.uint64(rng.integers(0, 2**50))]


def test_packed_launch_matches_cupy(cp):
    from minidnn.backend.cuda import launch as L
    kernel = L.get_kernel(PROBE, "probe", ("-I/usr/local/cuda/include",))
    rng = np.random.default_rng()
    for _ in range(5):
        p = cp.asarray(rng.normal(size=3).astype(np.float32))
        q = cp.asarray(rng.normal(size=3).astype(np.float32))
        args = _args(rng, cp, cp.full(11, np.nan), p, q)
        ref = cp.full(11, np.nan)
        kernel((1,), (32,), tuple([ref, *args[1:]]))
        q_ref = q.copy()
        q[0] = -1
        before = L.launch_count()
        L.launch(kernel, (1,), (32,), args)
        assert L.launch_count() == before + 1
        got = args[0]
        np.testing.assert_array_equal(cp.asnumpy(got), cp.asnumpy(ref))
        assert float(q[0]) == 42.0 and float(q_ref[0]) == 42.0
        # prepared: scalars packed once, arrays per call (fresh buffers each time)
        prep = L.prepare(kernel, (1,), (32,), [None, args[1], None, *args[3:6], None, *args[7:]])
        for _ in range(2):
            out2 = cp.full(11, np.nan)
            q[0] = -1
            prep(out2, p, q)
            np.testing.assert_array_equal(cp.asnumpy(out2), cp.asnumpy(ref))
            assert float(q[0]) == 42.0
        with pytest.raises(TypeError, match="3 arrays expected"):
            prep(out2)


def test_unpackable_type_falls_back_to_cupy(cp):
    from minidnn.backend.cuda import launch as L
    src = r'extern "C" __global__ void k(float* o, const double v) { o[0] = (float)v; }'
    kernel = L.get_kernel(src, "k")
    o = cp.zeros(1, np.float32)

    L.launch(kernel, (1,), (1,), [o, 2.5])        # a Python float has no struct code: CuPy passes it as a double
    assert float(o[0]) == 2.5
    with pytest.raises(TypeError, match="no struct code"):
        L.prepare(kernel, (1,), (1,), [None, 2.5])


def test_packed_launch_is_captured_in_a_graph(cp):
    from minidnn.backend.cuda import launch as L
    src = r'extern "C" __global__ void axpy(float* y, const float* x, const float a, const int n) {' \
          r' int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] += a * x[i]; }'
    kernel = L.get_kernel(src, "axpy")
    rng = np.random.default_rng()
    x = cp.asarray(rng.normal(size=1000).astype(np.float32))
    y = cp.asarray(rng.normal(size=1000).astype(np.float32))
    y0 = y.copy()
    prep = L.prepare(kernel, (4,), (256,), [None, None, np.float32(0.5), np.int32(1000)])
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        s.begin_capture()
        L.launch(kernel, (4,), (256,), [y, x, np.float32(2.0), np.int32(1000)])
        prep(y, x)
        g = s.end_capture()
    s.synchronize()
    np.testing.assert_array_equal(cp.asnumpy(y), cp.asnumpy(y0))       # captured, not run
    g.launch(s)
    g.launch(s)
    s.synchronize()
    np.testing.assert_allclose(cp.asnumpy(y), cp.asnumpy(y0 + 5.0 * x), rtol=1e-6, atol=1e-6)

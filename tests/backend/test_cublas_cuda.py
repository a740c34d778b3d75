"""cuBLAS products (backend/cuda/cublas.py) on our own per-thread handle, rebound only when the current stream
changes: results against float64 on the default stream, on side streams taken in turn, interleaved with CuPy's own
cuBLAS calls (its handle is separate), from two threads at once, and replayed from a CUDA graph."""
import threading

import numpy as np
import pytest

from minidnn.backend import devices as _dev

pytestmark = pytest.mark.cuda
if not _dev.cuda_is_available():
    pytest.skip("needs a GPU with CuPy", allow_module_level=True)

import cupy as cp  # noqa: E402

from minidnn.backend.cuda import cublas  # noqa: E402


def _operands(seed, m=37, k=29, n=41, dtype=np.float32):
    rng = np.random.default_rng(seed)
    a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    return a, b, cp.asarray(a, dtype=dtype), cp.asarray(b, dtype=dtype)


def _check(got, a, b, tol=1e-4):
    np.testing.assert_allclose(cp.asnumpy(got).astype(np.float64), a @ b, rtol=tol, atol=tol * np.sqrt(a.shape[1]))


def test_products_on_alternating_streams_and_beside_cupy_matmul():
    s1, s2 = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    for i in range(6):
        a, b, ga, gb = _operands(i)
        stream = (None, s1, s2)[i % 3]
        if stream is None:
            out = cublas.gemm(ga, gb)
        else:
            stream.wait_event(cp.cuda.get_current_stream().record())
            with stream:
                out = cublas.gemm(ga.T.copy().T, gb)          # an F-ordered operand too
                stream.synchronize()
        _check(out, a, b)
        _check(cp.matmul(ga, gb), a, b)                        # CuPy's cuBLAS handle in between
    cp.cuda.Device().synchronize()


def test_products_from_two_threads():
    errors = []

    def work(seed):
        try:
            s = cp.cuda.Stream(non_blocking=True)
            with s:
                for j in range(5):
                    a, b, ga, gb = _operands(seed * 10 + j, 64, 48, 80)
                    out = cublas.gemm(ga, gb)
                    s.synchronize()
                    _check(out, a, b)
        except Exception as e:          # noqa: BLE001 -- reported by the main thread
            errors.append(e)
    threads = [threading.Thread(target=work, args=(t,)) for t in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_a_captured_product_replays():
    a, b, ga, gb = _operands(7)
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        cublas.gemm(ga, gb)            # warm-up on the capture stream
        s.begin_capture()
        out = cublas.gemm(ga, gb)
        graph = s.end_capture()
    a2, b2, ga2, gb2 = _operands(8)
    cp.cuda.Device().synchronize()      # ga2, gb2 uploaded (on the default stream) before s reads them
    with s:                 # the new operands written on the replay's stream: s is non-blocking, so copies made on
        ga[...] = ga2       # the default stream could still be running when the graph reads them (a flaky failure
        gb[...] = gb2       # under load, session 8 run 1)
        graph.launch(s)
    s.synchronize()
    _check(out, a2, b2)

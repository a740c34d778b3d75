"""conv_cpu._gemm: products cut into blocks for OpenBLAS's small-matrix kernels (threads.blas_small_kernels), checked
against float64 products, for every axis it cuts, both operand orders, out= and the cases it must leave whole."""
import numpy as np
import pytest

from minidnn.backend import conv_cpu, threads
from minidnn.backend.blas import cpu_matmul


@pytest.fixture
def small_kernels(monkeypatch):
    monkeypatch.setattr(threads, "_small_kernels", [True])


def _operands(shape_a, shape_b, order_a, order_b, dtype, seed=0):
    rng = np.random.default_rng(seed)
    a = np.asarray(rng.standard_normal(shape_a), dtype=dtype, order=order_a)
    b = np.asarray(rng.standard_normal(shape_b), dtype=dtype, order=order_b)
    return a, b


def _calls(monkeypatch):
    """Record the shapes of the products _gemm makes: through the ``product`` it is given (whole products) or its
    blocks' own np.matmul (conv_cpu._matmul), one call a block (the stacked form is off: it makes one call for all
    the blocks; test_stacked_blocks_are_the_loop_bit_for_bit checks it against this loop)."""
    monkeypatch.setattr(conv_cpu, "_STACKED_GEMM", [False])
    shapes = []

    def product(a, b, out=None):
        shapes.append((a.shape, b.shape, a.strides[1] == a.itemsize, b.strides[1] == b.itemsize or b.shape[1] == 1))
        return np.matmul(a, b, out=out)
    monkeypatch.setattr(conv_cpu, "_matmul", product)
    return shapes, product


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("order_a,order_b", [("C", "C"), ("C", "F"), ("F", "C"), ("F", "F")])
@pytest.mark.parametrize("shape", [(6400, 150, 16), (6, 25, 25984), (150, 6400, 16), (2048, 400, 6), (7, 13, 11),
                                   (25, 3712, 6)])
def test_blocked_product_matches_float64(small_kernels, monkeypatch, dtype, order_a, order_b, shape):
    M, K, N = shape
    a, b = _operands((M, K), (K, N), order_a, order_b, dtype)
    shapes, product = _calls(monkeypatch)
    got = conv_cpu._gemm(a, b, product=product)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    tol = 1e-4 if dtype == np.float32 else 1e-12
    assert got.shape == (M, N) and got.dtype == dtype
    np.testing.assert_allclose(got, ref, rtol=tol, atol=tol * np.sqrt(K))
    if any(ca and not cb for _, _, ca, cb in shapes):     # C @ F, which the small kernels refuse: only where making
        assert shapes == [((M, K), (K, N), True, False)]    # another order would copy much beside the product
        assert 64 * min(a.size, b.size) > M * K * N
        return
    for sa, sb, _, _ in shapes:                   # every block within the small kernels' size
        assert sa[0] * sa[1] * sb[1] <= threads.SMALL_GEMM_MACS
    if M * K * N > threads.SMALL_GEMM_MACS:
        assert len(shapes) == -(-M * K * N // threads.SMALL_GEMM_MACS)
        longest = max(M, K, N)
        cut = [M, K, N].index(longest)
        assert all((sa[0], sa[1], sb[1])[cut] < longest for sa, sb, _, _ in shapes)


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_out_argument_is_written(small_kernels, axis):
    shape = [(9000, 120, 16), (16, 120, 9000), (16, 9000, 120)][axis]
    M, K, N = shape
    a, b = _operands((M, K), (K, N), "C", "C", np.float32, seed=axis)
    out = np.full((M + 3, N), np.nan, dtype=np.float32)[:M]      # a view with rows beyond it
    got = conv_cpu._gemm(a, b, out=out)
    assert got is out
    np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("order_a,order_b", [("C", "C"), ("F", "C"), ("C", "F"), ("F", "F")])
@pytest.mark.parametrize("shape", [(6, 25, 25984), (6, 25, 21504), (6, 25, 8192), (48, 4556, 16), (9000, 120, 16),
                                   (9001, 120, 16), (16, 120, 9001), (16, 9001, 120), (25, 20000, 6)])
def test_stacked_blocks_are_the_loop_bit_for_bit(small_kernels, monkeypatch, dtype, order_a, order_b, shape):
    """_gemm's blocks as one stacked np.matmul (_STACKED_GEMM) against its loop of block products: the same bits,
    for row, column and inner-axis blocks (a last, shorter block where the length is not a multiple), returned or
    written into a strided ``out`` (nothing outside it touched); and against float64."""
    M, K, N = shape
    a, b = _operands((M, K), (K, N), order_a, order_b, dtype, seed=M + N)
    stacked_calls, real = [], conv_cpu._stacked_gemm_blocks
    monkeypatch.setattr(conv_cpu, "_stacked_gemm_blocks", lambda *args: stacked_calls.append(args[2]) or real(*args))
    got = {}
    for stacked in (False, True):
        monkeypatch.setattr(conv_cpu, "_STACKED_GEMM", [stacked])
        frame = np.full((M + 3, N + 2), np.nan, dtype=dtype)
        out = frame[1:M + 1, 1:N + 1]
        assert conv_cpu._gemm(a, b, out=out) is out
        assert np.isnan(frame[0]).all() and np.isnan(frame[M + 1:]).all()
        assert np.isnan(frame[:, 0]).all() and np.isnan(frame[:, N + 1]).all()
        got[stacked] = (conv_cpu._gemm(a, b), out.copy())
    # it ran (one call with out, one without) unless the product stays whole (C @ F with a large copy to make)
    assert len(stacked_calls) == (2 if conv_cpu._small_ready(a, b, M * K * N) is not None else 0)
    for loop, stacked in zip(got[False], got[True]):
        np.testing.assert_array_equal(stacked, loop)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    tol = 1e-4 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(got[True][0], ref, rtol=tol, atol=tol * np.sqrt(K))


def test_without_small_kernels_the_product_is_whole(monkeypatch):
    monkeypatch.setattr(threads, "_small_kernels", [False])
    a, b = _operands((6400, 150), (150, 16), "C", "F", np.float32)
    shapes, product = _calls(monkeypatch)
    got = conv_cpu._gemm(a, b, product=product)
    assert shapes == [((6400, 150), (150, 16), True, False)]
    np.testing.assert_array_equal(got, a @ b)


def test_short_blocks_and_other_dtypes_stay_whole(small_kernels, monkeypatch):
    # conv64's (64, 576) x (576, 4352) and a linear layer's (64, 400) x (400, 120): wider than _SKINNY; a skinny
    # product whose blocks would be shorter than _MIN_BLOCK
    shapes, product = _calls(monkeypatch)
    for sa, sb in [((64, 576), (576, 4352)), ((64, 400), (400, 120)), ((16, 600), (600, 700))]:
        shapes.clear()
        a, b = _operands(sa, sb, "C", "C", np.float32)
        conv_cpu._gemm(a, b, product=product)
        assert len(shapes) == 1
    # float16 (no BLAS) and mixed dtypes: one product, as given
    for a, b in [_operands((2048, 400), (400, 6), "C", "C", np.float16),
                 (np.ones((2048, 400), np.float32), np.ones((400, 6), np.float64))]:
        shapes.clear()
        conv_cpu._gemm(a, b, product=product)
        assert len(shapes) == 1


def test_products_with_all_blas_threads_stay_whole(small_kernels, monkeypatch):
    # from MIN_PARALLEL_BLAS_WORK on, with several threads, cpu_matmul gives the product all of BLAS's threads
    monkeypatch.setattr(threads, "_current", [2])
    calls = []
    monkeypatch.setattr(conv_cpu, "cpu_matmul", lambda a, b, out=None: calls.append(a.shape) or np.matmul(a, b))
    a, b = _operands((1 << 16, 256), (256, 16), "C", "C", np.float32)
    conv_cpu._gemm(a, b, product=conv_cpu.cpu_matmul)
    assert calls == [(1 << 16, 256)]
    monkeypatch.setattr(threads, "_current", [1])            # one thread: blocks, each by np.matmul (one BLAS thread)
    calls.clear()
    shapes, _ = _calls(monkeypatch)
    conv_cpu._gemm(a, b, product=conv_cpu.cpu_matmul)
    assert calls == [] and len(shapes) == -(-a.shape[0] * 256 * 16 // threads.SMALL_GEMM_MACS)


def test_convolutions_match_the_reference_either_way(monkeypatch):
    """LeNet's and conv16's directions with the blocks on and off, against the float64 reference."""
    import minidnn as mdn
    import minidnn.nn.functional as F
    rng = np.random.default_rng(3)
    for (n, c, k, size, r, pad) in [(64, 1, 6, 32, 5, 0), (64, 6, 16, 14, 5, 0), (32, 6, 16, 8, 5, 2),
                                     (8, 16, 16, 32, 3, 1)]:
        x64 = rng.standard_normal((n, c, size, size))
        w64 = rng.standard_normal((k, c, r, r)) * 0.1
        out = []
        for flag, dtype in [(True, np.float32), (False, np.float32), (False, np.float64)]:
            monkeypatch.setattr(threads, "_small_kernels", [flag])
            x = mdn.tensor(x64.astype(dtype), requires_grad=True)
            w = mdn.tensor(w64.astype(dtype), requires_grad=True)
            y = F.conv2d(x, w, padding=pad)
            y.backward(mdn.tensor(np.cos(np.arange(y.numel()).reshape(y.shape)).astype(dtype)))
            out.append([y.numpy(), x.grad.numpy(), w.grad.numpy()])
        for got, ref in zip(out[0], out[2]):
            scale = np.abs(ref).max()
            np.testing.assert_allclose(got, ref, rtol=0, atol=2e-5 * scale * np.sqrt(c * r * r))


def test_reference_product_unchanged():
    # cpu_matmul itself (blas.py) is not blocked: _gemm only wraps it
    a, b = _operands((6400, 150), (150, 16), "C", "C", np.float32)
    np.testing.assert_array_equal(cpu_matmul(a, b), np.matmul(a, b))

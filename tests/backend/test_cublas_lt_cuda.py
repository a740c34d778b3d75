"""cublasLt's prepared products (backend/cuda/cublas.py ``lt_product``) and the linear layer that uses them
(nn/_functions/linear.py): against float64 over operand layouts, dtypes and the two epilogues (bias added to every
row; the row sums of a, a linear layer's db); ``out`` written in place; signatures cublasLt does not take come back
None with nothing written; one launch a call; a linear layer trained with cublasLt on and off lands on the same
parameters, with its weight and bias gradients written straight into the optimizer's flat buffer."""
import numpy as np
import pytest

from minidnn.backend import devices as _dev

pytestmark = pytest.mark.cuda
if not _dev.cuda_is_available():
    pytest.skip("needs a GPU with CuPy", allow_module_level=True)

import cupy as cp  # noqa: E402
import ml_dtypes  # noqa: E402

import minidnn as mdn  # noqa: E402
import minidnn.nn as nn  # noqa: E402
import minidnn.nn.functional as F  # noqa: E402
from minidnn.backend.cuda import cublas as C  # noqa: E402
from minidnn.backend.cuda import launch as L  # noqa: E402

BF16 = np.dtype(ml_dtypes.bfloat16)
TOL = {np.dtype(np.float32): 1e-5, np.dtype(np.float64): 1e-12, np.dtype(np.float16): 2 ** -9, BF16: 2 ** -6}


def _operand(rng, shape, dtype, transposed):
    """A (rows, cols) operand, C-ordered or an F-ordered transpose view."""
    a = rng.standard_normal(shape[::-1] if transposed else shape).astype(np.float32)
    d = cp.asarray(a).astype(dtype)
    return d.T if transposed else d


@pytest.fixture(autouse=True)
def _lt_on():
    C.LT[0] = True
    yield
    C.LT[0] = True


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, BF16])
@pytest.mark.parametrize("ta,tb", [(False, False), (False, True), (True, False), (True, True)])
@pytest.mark.parametrize("mkn", [(64, 400, 120), (7, 33, 5), (1, 84, 10), (300, 17, 1)])
def test_products_and_epilogues_against_float64(dtype, ta, tb, mkn):
    M, K, N = mkn
    rng = np.random.default_rng(M * 31 + K * 7 + N + 2 * ta + tb)
    dtype = np.dtype(dtype)
    a, b = _operand(rng, (M, K), dtype, ta), _operand(rng, (K, N), dtype, tb)
    bias = cp.asarray(rng.standard_normal(N).astype(np.float32)).astype(dtype)
    a64, b64 = cp.asnumpy(a.astype(np.float64)), cp.asnumpy(b.astype(np.float64))
    ref = a64 @ b64
    tol = TOL[dtype] * (np.abs(a64) @ np.abs(b64)).max()
    for kwargs, want in (({}, ref), ({"bias": bias}, ref + cp.asnumpy(bias.astype(np.float64)))):
        c = C.lt_product(a, b, **kwargs)
        if c is None:       # cublasLt offers no algorithm for this signature: the callers' other path
            continue
        assert c.shape == (M, N) and c.dtype == dtype
        np.testing.assert_allclose(cp.asnumpy(c.astype(np.float64)), want, rtol=0, atol=tol)
    r = C.lt_product(a, b, row_sums=True)
    if r is not None:
        c, sums = r
        np.testing.assert_allclose(cp.asnumpy(c.astype(np.float64)), ref, rtol=0, atol=tol)
        np.testing.assert_allclose(cp.asnumpy(sums.astype(np.float64)), a64.sum(1), rtol=0,
                                   atol=TOL[dtype] * np.abs(a64).sum(1).max())


def test_the_linear_layer_products_are_taken_in_float32_and_bfloat16():
    # what a linear layer asks for (forward with bias; dw = g^T x with db): cublasLt must take these on an H100,
    # else the layer silently keeps the slower path
    rng = np.random.default_rng(0)
    for dtype, out_dtype in ((np.float32, None), (BF16, None), (BF16, np.float32)):
        x = _operand(rng, (64, 400), dtype, False)
        w = _operand(rng, (120, 400), dtype, False)
        g = _operand(rng, (64, 120), dtype, False)
        bias = cp.zeros(120, dtype)
        assert C.lt_product(x, w.T, bias=bias) is not None, dtype
        assert C.lt_product(g.T, x, out_dtype=out_dtype, row_sums=True) is not None, (dtype, out_dtype)


def test_out_and_row_sums_written_in_place_and_one_launch():
    rng = np.random.default_rng(1)
    g = _operand(rng, (64, 120), np.float32, False)
    x = _operand(rng, (64, 400), np.float32, False)
    flat = cp.full(120 * 400 + 120 + 8, cp.nan, np.float32)     # a flat buffer's slots, 16-byte aligned starts
    dw, db = flat[:120 * 400].reshape(120, 400), flat[120 * 400 + 4:120 * 400 + 124]
    before = L.launch_count()
    r = C.lt_product(g.T, x, out=dw, row_sums=db)
    assert L.launch_count() - before == 1
    assert r[0] is dw and r[1] is db
    g64, x64 = cp.asnumpy(g).astype(np.float64), cp.asnumpy(x).astype(np.float64)
    np.testing.assert_allclose(cp.asnumpy(dw), g64.T @ x64, rtol=0, atol=1e-5 * (np.abs(g64).T @ np.abs(x64)).max())
    np.testing.assert_allclose(cp.asnumpy(db), g64.sum(0), rtol=0, atol=1e-5 * np.abs(g64).sum(0).max())
    rest = cp.asnumpy(flat)
    assert np.isnan(rest[120 * 400:120 * 400 + 4]).all() and np.isnan(rest[120 * 400 + 124:]).all()


def test_refusals_write_nothing():
    rng = np.random.default_rng(2)
    a, b = _operand(rng, (8, 16), np.float32, False), _operand(rng, (16, 4), np.float32, False)
    out = cp.full((8, 4), 7.0, np.float32)
    bad = [dict(out=cp.empty((4, 8), np.float32)),                      # wrong shape
           dict(out=cp.empty((8, 4), np.float64)),                      # wrong dtype
           dict(bias=cp.zeros(5, np.float32)),                          # wrong bias length
           dict(bias=cp.zeros(4, np.float32), row_sums=True),           # two epilogues
           dict(out_dtype=np.float64)]                                  # a wider product of float16/bfloat16 only
    for kw in bad:
        assert C.lt_product(a, b, **kw) is None, kw
    assert C.lt_product(a[:, :0], b[:0], out=out) is None               # K = 0
    assert C.lt_product(a.astype(np.float64), b) is None                # mixed dtypes
    C.LT[0] = False
    assert C.lt_product(a, b, out=out) is None
    assert (out == 7).all()


def test_misaligned_operands_still_right():
    rng = np.random.default_rng(3)
    base = cp.asarray(rng.standard_normal(64 * 33 + 1).astype(np.float32))
    a = base[1:].reshape(64, 33)                    # 4-byte aligned only: its own signature
    b = _operand(rng, (33, 10), np.float32, False)
    c = C.lt_product(a, b)
    if c is not None:
        np.testing.assert_allclose(cp.asnumpy(c), cp.asnumpy(a) @ cp.asnumpy(b), rtol=1e-5, atol=1e-4)


def _train_mlp(lt, amp=False, steps=3):
    C.LT[0] = lt
    mdn.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
                          nn.Linear(84, 10)).to("cuda")
    opt = mdn.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x = mdn.randn(64, 16, 5, 5, device="cuda")
    y = mdn.randint(0, 10, (64,), device="cuda")
    in_slot = []
    for _ in range(steps):
        with mdn.autocast("cuda", dtype=mdn.bfloat16, enabled=amp):
            loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        in_slot.append([p._grad_storage is not None and p.grad.data.data.ptr == p._grad_storage.data.ptr
                        for p in model.parameters()])
        opt.step()
    return [p.detach().cpu().numpy() for p in model.parameters()], in_slot


@pytest.mark.parametrize("amp", [False, True])
def test_linear_layers_train_the_same_with_and_without_cublaslt(amp):
    off, _ = _train_mlp(False, amp)
    on, in_slot = _train_mlp(True, amp)
    tol = 2 ** -6 if amp else 1e-5
    for a, b in zip(off, on):
        assert np.abs(a - b).max() <= tol * (np.abs(a).max() + 1e-30)
    # from the second step on (the flat buffer exists after the first optimizer step), every weight's and bias's
    # gradient is written into its slot by the product and its epilogue: no copy
    assert all(in_slot[-1]), in_slot


def test_linear_forward_is_one_launch_with_its_bias():
    x = mdn.randn(64, 400, device="cuda")
    lin = nn.Linear(400, 120).to("cuda")
    F.linear(x, lin.weight, lin.bias)         # the first call prepares the signature
    before = L.launch_count()
    F.linear(x, lin.weight, lin.bias)
    assert L.launch_count() - before == 1

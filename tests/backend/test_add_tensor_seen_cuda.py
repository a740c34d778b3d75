"""add_tensor's seen-call shortcut on the GPU (backend/tensor_ops.py ``_ADD_SEEN``) and the convolution bias added in
place through it (nn/_functions/bias.py, ``fresh``): the same values as the checked path and as float64, a changed
signature still checked (a bad bias raises), one bias launch, and a conv layer's output and gradients with its bias
unchanged against float64."""
import numpy as np
import pytest

from minidnn.backend import devices as _dev

pytestmark = pytest.mark.cuda
if not _dev.cuda_is_available():
    pytest.skip("needs a GPU with CuPy", allow_module_level=True)

import cupy as cp  # noqa: E402

import minidnn as mdn  # noqa: E402
import minidnn.backend as B  # noqa: E402
import minidnn.nn.functional as F  # noqa: E402
from minidnn.backend import tensor_ops as T  # noqa: E402
from minidnn.backend.cuda import launch as L  # noqa: E402


@pytest.mark.parametrize("shape", [(8, 6, 5, 7), (64, 120), (3, 16, 9)])
def test_seen_calls_match_the_checked_path(shape):
    rng = np.random.default_rng(len(shape))
    ya = rng.standard_normal(shape).astype(np.float32)
    ba = rng.standard_normal(shape[1]).astype(np.float32)
    T._ADD_SEEN.clear()
    want = ya.astype(np.float64) * 0.5 + 2.0 * ba.reshape((1, -1) + (1,) * (len(shape) - 2))
    for _ in range(3):      # checked, then seen twice
        y = cp.asarray(ya)
        out = B.add_tensor(None, 2.0, cp.asarray(ba), 0.5, y)
        assert out is y
        np.testing.assert_allclose(cp.asnumpy(y), want, rtol=1e-6, atol=1e-6)
    assert len(T._ADD_SEEN) == 1
    with pytest.raises(B.BadParamError):      # another b: its own signature, checked
        B.add_tensor(None, 1.0, cp.zeros(shape[1] + 1, np.float32), 1.0, cp.asarray(ya))


def test_conv_bias_in_place_against_float64():
    rng = np.random.default_rng(5)
    xa = rng.standard_normal((4, 3, 12, 12)).astype(np.float32)
    wa = rng.standard_normal((6, 3, 5, 5)).astype(np.float32)
    ba = rng.standard_normal(6).astype(np.float32)
    x = mdn.tensor(xa, device="cuda", requires_grad=True)
    w = mdn.tensor(wa, device="cuda", requires_grad=True)
    b = mdn.tensor(ba, device="cuda", requires_grad=True)
    for _ in range(3):      # the first calls validate and settle; the last takes the fast path and the shortcut
        x.grad = w.grad = b.grad = None
        before = L.launch_count()
        y = F.conv2d(x, w, b, padding=2)
        with_bias = L.launch_count() - before
        (y * y).sum().backward()
    plain = L.launch_count()
    F.conv2d(x, w, None, padding=2)
    assert with_bias == L.launch_count() - plain + 1        # the bias: one launch more than the plain conv
    x64, w64 = xa.astype(np.float64), wa.astype(np.float64)
    xp = np.pad(x64, ((0, 0), (0, 0), (2, 2), (2, 2)))
    ref = np.zeros((4, 6, 12, 12))
    for r in range(5):
        for s in range(5):
            ref += np.einsum("nchw,kc->nkhw", xp[:, :, r:r + 12, s:s + 12], w64[:, :, r, s])
    ref += ba.reshape(1, 6, 1, 1)
    np.testing.assert_allclose(y.cpu().numpy(), ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(b.grad.cpu().numpy(), (2 * ref).sum((0, 2, 3)), rtol=1e-4, atol=1e-3)

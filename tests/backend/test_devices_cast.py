"""backend/devices.py: a dtype conversion keeps the array's memory layout and values.

``to_device(x, dev, dtype)`` casts a GPU array through ``_astype_in_memory_order`` (the C-ordered view of a dense
array's memory, cast in one contiguous pass, viewed back).  The function is array-module generic, so its logic is
checked here with NumPy arrays of every layout a model meets (channels-last 4-D, transposed 2-D, permuted 3-D, size-1
axes, non-dense slices that must fall back to a plain cast); the GPU path runs in the cuda tests below.
"""
import numpy as np
import pytest

from minidnn.backend import devices as _dev
from minidnn.backend.devices import _astype_in_memory_order

LAYOUTS = [((2, 3, 4, 5), (0, 2, 3, 1)), ((3, 4), (1, 0)), ((2, 1, 4, 5), (0, 2, 3, 1)), ((2, 3, 1, 1), (0, 2, 3, 1)),
           ((4, 5, 6), (2, 0, 1)), ((2, 3, 4, 5), (0, 1, 2, 3)), ((7,), (0,))]


def _stride_order(a):
    return [i for i in sorted(range(a.ndim), key=lambda i: -a.strides[i]) if a.shape[i] > 1]


@pytest.mark.parametrize("shape,perm", LAYOUTS)
@pytest.mark.parametrize("dtype", [np.float16, np.float64, np.int32])
def test_cast_keeps_values_and_layout(shape, perm, dtype):
    rng = np.random.default_rng()
    base = rng.normal(size=[shape[i] for i in perm]).astype(np.float32) * 100
    x = base.transpose(np.argsort(perm))            # logical `shape`, memory ordered as `perm`
    y = _astype_in_memory_order(x, dtype)
    assert y.shape == x.shape and y.dtype == dtype
    np.testing.assert_array_equal(y, x.astype(dtype))
    assert _stride_order(y) == _stride_order(x)


def test_non_dense_view_falls_back_to_a_plain_cast():
    x = np.random.default_rng().normal(size=(4, 6, 8)).astype(np.float32)[:, ::2, 1:]
    y = _astype_in_memory_order(x, np.float16)
    np.testing.assert_array_equal(y, x.astype(np.float16))


@pytest.mark.cuda
def test_gpu_cast_of_a_channels_last_array_keeps_its_layout():
    if not _dev.cuda_is_available():
        pytest.skip("no CUDA GPU with CuPy on this machine")
    cp = _dev.require_cupy()
    rng = np.random.default_rng()
    host = rng.normal(size=(8, 5, 7, 16)).astype(np.float32)        # NHWC memory
    x = cp.asarray(host).transpose(0, 3, 1, 2)                      # (N, C, H, W) logical
    for dtype in (np.float16, np.float64):
        y = _dev.to_device(x, _dev.device_of(x), dtype=dtype)
        assert y.shape == x.shape and y.dtype == dtype
        np.testing.assert_array_equal(cp.asnumpy(y), host.transpose(0, 3, 1, 2).astype(dtype))
        assert y.transpose(0, 2, 3, 1).flags.c_contiguous

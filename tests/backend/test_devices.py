"""backend/devices.py: device specs parse the same whether or not an equal-hashing spec was seen before, a
Device survives pickling and copying (it is immutable: rebuilt through its constructor), dtype names are cached
correctly, and a GPU dtype conversion keeps the array's layout and values."""
import copy
import pickle

import numpy as np
import pytest

from minidnn.backend import devices as D


@pytest.mark.parametrize("spec", [True, False, 1.0, 0.0])
def test_bool_and_float_specs_are_not_gpu_indices_even_once_an_index_is_cached(monkeypatch, spec):
    monkeypatch.setitem(D._device_cache, 1, D.Device("cuda", 1))      # as if device(1) had run on a 2-GPU machine
    monkeypatch.setitem(D._device_cache, 0, D.Device("cuda", 0))
    with pytest.raises(ValueError):
        D.device(spec)


def test_cached_specs_still_hit(monkeypatch):
    dev = D.Device("cuda", 1)
    monkeypatch.setitem(D._device_cache, 1, dev)
    monkeypatch.setitem(D._device_cache, "cuda:1", dev)
    assert D.device(1) is dev and D.device("cuda:1") is dev
    assert D.device("cpu") is D.CPU


@pytest.mark.parametrize("dev", [D.CPU, D.Device("cuda", 0), D.Device("cuda", 3)])
def test_device_pickles_and_copies(dev):
    for back in (pickle.loads(pickle.dumps(dev)), copy.deepcopy(dev), copy.copy(dev)):
        assert back == dev and hash(back) == hash(dev) and str(back) == str(dev)
        with pytest.raises(AttributeError, match="immutable"):
            back.index = 5


@pytest.mark.parametrize("dtype", [np.float32, np.dtype(np.float16), "float64", np.int8])
def test_dtype_name_matches_numpy_and_is_cached(dtype):
    assert D.dtype_name(dtype) == np.dtype(dtype).name
    assert D.dtype_name(dtype) == np.dtype(dtype).name        # second call: from the cache


@pytest.mark.cuda
def test_gpu_cast_of_a_channels_last_array_keeps_its_layout():
    if not D.cuda_is_available():
        pytest.skip("no CUDA GPU with CuPy on this machine")
    cp = D.require_cupy()
    rng = np.random.default_rng()
    host = rng.normal(size=(8, 5, 7, 16)).astype(np.float32)        # NHWC memory
    x = cp.asarray(host).transpose(0, 3, 1, 2)                      # (N, C, H, W) logical
    for dtype in (np.float16, np.float64):
        y = D.to_device(x, D.device_of(x), dtype=dtype)
        assert y.shape == x.shape and y.dtype == dtype
        np.testing.assert_array_equal(cp.asnumpy(y), host.transpose(0, 3, 1, 2).astype(dtype))
        assert y.transpose(0, 2, 3, 1).flags.c_contiguous


def test_cupy_array_recognised_before_minidnn_asked_for_a_gpu(monkeypatch):
    """A program that imports CuPy itself and hands a CuPy array straight to a backend primitive, before minidnn has
    asked for a GPU: the array is still recognised as a GPU array (it used to be taken for a CPU one and fail deep
    inside NumPy).  A stand-in module plays CuPy, so this runs without a GPU."""
    import sys
    import types

    from minidnn.backend import devices as D

    fake = types.ModuleType("cupy")

    class ndarray:                      # noqa: N801  (CuPy's name)
        class data:                     # noqa: N801
            device_id = 0
    fake.ndarray = ndarray
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(D, "_cupy", None)
    monkeypatch.setattr(D, "_cupy_tried", False)
    monkeypatch.setattr(D, "_cupy_error", None)
    a = ndarray()
    assert D.array_module(a) is fake and D.is_cuda_array(a)
    assert D.array_module(np.zeros(2)) is np and not D.is_cuda_array(np.zeros(2))
    assert D.device_of(np.zeros(2)) == D.CPU

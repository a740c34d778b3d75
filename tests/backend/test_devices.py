"""backend/devices.py: device specs parse the same whether or not an equal-hashing spec was seen before, and a
Device survives pickling and copying (it is immutable: rebuilt through its constructor)."""
import copy
import pickle

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

"""Shared fixtures: every device-dependent test takes the ``device`` fixture (cpu, cuda).

cuda cases carry the ``cuda`` mark and skip cleanly where CuPy or a GPU is missing, so
``pytest -m cuda`` on the device machine runs exactly the GPU half of every table.
"""
import numpy as np
import pytest

from minidnn.backend import devices as _dev


def _cuda_ok():
    return _dev.cuda_is_available()


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


@pytest.fixture(params=DEVICES)
def device(request):
    if request.param == "cuda" and not _cuda_ok():
        pytest.skip("no CUDA GPU with CuPy on this machine")
    return request.param


@pytest.fixture
def xp(device):
    """The array module of the ``device`` fixture (numpy or cupy)."""
    return _dev.device(device).xp


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def pytest_collection_modifyitems(config, items):
    # A test that is marked cuda but not parametrized over the device fixture still must skip cleanly.
    if _cuda_ok():
        return
    skip = pytest.mark.skip(reason="no CUDA GPU with CuPy on this machine")
    for item in items:
        if "cuda" in item.keywords and "device" not in getattr(item, "fixturenames", ()):
            item.add_marker(skip)

"""tests/_nvcc.pick: the spread of kernel configurations the CPU suite compiles."""
import importlib

import pytest

from tests import _nvcc


def test_a_spread_with_both_ends_and_the_fixed_items():
    items = list(range(20))
    got = _nvcc.pick(items, 4, always=lambda i: i in (7, 8)) if not _nvcc.FULL else None
    if got is None:
        pytest.skip("MINIDNN_NVCC_ALL=1: every configuration is compiled")
    assert got == sorted(got) and {7, 8} <= set(got)
    rest = [i for i in got if i not in (7, 8)]
    assert len(rest) == 4 and rest[0] == 0 and rest[-1] == 19
    assert _nvcc.pick(items, 1, always=[3]) == [0, 3]
    assert _nvcc.pick(items[:3], 5) == [0, 1, 2]
    assert _nvcc.pick(["a", "b", "c"], 0, always=["b"]) == ["b"]


def test_everything_under_the_environment_switch(monkeypatch):
    monkeypatch.setenv("MINIDNN_NVCC_ALL", "1")
    m = importlib.reload(_nvcc)
    try:
        assert m.FULL and m.pick(list(range(30)), 2) == list(range(30))
    finally:
        monkeypatch.delenv("MINIDNN_NVCC_ALL")
        importlib.reload(_nvcc)
    assert not _nvcc.FULL or __import__("os").environ.get("MINIDNN_NVCC_ALL") == "1"

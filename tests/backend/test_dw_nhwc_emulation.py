"""The index math of the NHWC depthwise kernels (conv_dw_nhwc), checked on the CPU: a subset of
tools/emulate_dw_nhwc.py (thread-by-thread replay of the forward, stride-1 / strided backward data and the
deterministic filter gradient against float64).  The whole table: `python3 tools/emulate_dw_nhwc.py` (~6 s)."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import emulate_dw_nhwc as E  # noqa: E402

SUBSET = [E.CASES[0], E.CASES[2], E.CASES[4], E.CASES[5], E.WIDE[0]]   # ragged, s2, 5x5, 5x5 s2, 2 slabs


@pytest.mark.parametrize("case", SUBSET, ids=lambda c: "x".join(map(str, c)))
@pytest.mark.parametrize("itemsize", [4, 2])
def test_dw_nhwc_gather_kernels(case, itemsize):
    if case[1] % E.D.vector(itemsize, case[4] * case[5]):
        pytest.skip("not whole vectors (declined)")
    for direction in ("forward", "backward_data"):
        for v2 in (True, False):
            E.run(*case, direction, itemsize, 0, 1.0, 0.0, seed=1, v2=v2)
            E.run(*case, direction, itemsize, 1, 0.75, -0.5, seed=2, v2=v2)


WGRAD = [SUBSET[0], SUBSET[2], SUBSET[4], (1, 8, 9, 10, 3, 3, 2, 2, 1)]    # C whole 8-channel vectors (bf16 too)


@pytest.mark.parametrize("v2", [True, False], ids=["v2", "v1"])
@pytest.mark.parametrize("case", WGRAD, ids=lambda c: "x".join(map(str, c)))
def test_dw_nhwc_backward_filter(case, v2):
    E.run_wgrad(*case, 4, 0, 1.0, 0.0, seed=3, v2=v2)
    E.run_wgrad(*case, 4, 2, 0.5, 2.0, seed=4, sms=1, v2=v2)
    E.run_wgrad(4, *case[1:], 2, 0, 1.0, 0.0, seed=5, sms=512, v2=v2)       # many splits: tickets, split-order sums


@pytest.mark.parametrize("itemsize", [4, 2])
def test_dw_nhwc_backward_filter_two_levels(itemsize):
    """V2's group tickets then slab ticket (WGRAD2_ONE_LEVEL forced to 1), ragged last group, alpha/beta."""
    ct, sy, slabs, splits, per_split, group = E.run_wgrad(6, 8, 9, 10, 3, 3, 1, 1, 1, itemsize, 1, -1.5, 0.25,
                                                          seed=9, sms=512, one_level=1)
    assert splits > group > 1 and splits % group, (splits, group)


@pytest.mark.parametrize("direction", ["forward", "backward_data"])
@pytest.mark.parametrize("case", [E.CASES[0], E.CASES[2], E.CASES[5]], ids=["ragged", "s2", "5x5-s2"])
def test_dw_nhwc_v2_smallest_tiles(case, direction):
    """V2's gather tiles shrunk to one output per thread (a huge SM count), taps read as vectors."""
    vh, vq, _ = E.run(*case, direction, 2 if case[1] % 8 == 0 else 4, 1, 0.75, -0.5, seed=6, sms=10 ** 6)
    assert (vh, vq) == (1, 1)

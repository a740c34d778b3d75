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
        E.run(*case, direction, itemsize, 0, 1.0, 0.0, seed=1)
        E.run(*case, direction, itemsize, 1, 0.75, -0.5, seed=2)


WGRAD = [SUBSET[0], SUBSET[2], SUBSET[4], (1, 8, 9, 10, 3, 3, 2, 2, 1)]    # C whole 8-channel vectors (bf16 too)


@pytest.mark.parametrize("case", WGRAD, ids=lambda c: "x".join(map(str, c)))
def test_dw_nhwc_backward_filter(case):
    E.run_wgrad(*case, 4, 0, 1.0, 0.0, seed=3)
    E.run_wgrad(*case, 4, 2, 0.5, 2.0, seed=4, sms=1)
    E.run_wgrad(4, *case[1:], 2, 0, 1.0, 0.0, seed=5, sms=512)       # many splits: tickets, split-order sums

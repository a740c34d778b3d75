"""The index math of the register-tiled depthwise kernels, checked on the CPU (no GPU needed): a subset of
tools/emulate_dw_tile.py, which replays dw_tile_forward (forward; stride-1 backward data reading the filter
flipped, FLIP=1) and dw_tile_backward_filter (work-item decode, staging, windows, warp butterflies, split partials
and tickets with blocks in shuffled orders, float32 sums) index for index against float64 references.  The whole
table: `python3 tools/emulate_dw_tile.py` (~12 s)."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import emulate_dw_tile as E  # noqa: E402

FORWARD = [E.CASES[0], E.CASES[2], E.CASES[4], E.CASES[9]]       # ragged, multiplier 2 s2, 5x5 dil 2, 5x5 on 5x5


@pytest.mark.parametrize("case", FORWARD, ids=lambda c: "x".join(map(str, c)))
@pytest.mark.parametrize("itemsize", [4, 2])
def test_tile_forward_and_flipped_backward_data(case, itemsize):
    dirs = ["forward"] + (["backward_data"] if case[8] == 1 else [])
    for direction in dirs:
        E.run(*case, direction, itemsize, 0, 0.75, -0.5, seed=1)
        E.run(*case, direction, itemsize, 1, 1.0, 0.0, seed=2)           # unaligned: element paths


@pytest.mark.parametrize("case", E.WGRAD_CASES[:9], ids=lambda c: "x".join(map(str, c)))
def test_tile_backward_filter(case):
    E.run_wgrad(*case, 4, 0, 1.0, 0.0, seed=3)
    E.run_wgrad(*case, 2, 1, 0.75, -0.5, seed=4)


@pytest.mark.parametrize("case,sms", E.WGRAD_SPLIT_CASES[:1] + E.WGRAD_SPLIT_CASES[2:],
                         ids=["splits-wide", "splits-tz25", "one-block-row"])
def test_tile_backward_filter_splits_and_tickets(case, sms):
    cfg, stats = E.run_wgrad(*case, 4, 0, 0.5, 2.0, seed=5, sms=sms)
    assert (cfg[6] > 1) == (stats["last_reduces"] > 0)

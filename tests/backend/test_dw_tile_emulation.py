"""The index math of the register-tiled depthwise kernels, checked on the CPU (no GPU needed): a subset of
tools/emulate_dw_tile.py, which replays dw_tile_forward (forward; stride-1 backward data reading the filter
flipped, FLIP=1) and dw_tile_backward_filter (work-item decode, staging, windows, warp butterflies, split partials
and tickets with blocks in shuffled orders, float32 sums) index for index against float64 references.  The whole
table: `python3 tools/emulate_dw_tile.py` (~45 s)."""
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


@pytest.mark.parametrize("case,sms", E.WGRAD_SPLIT_CASES[:1] + E.WGRAD_SPLIT_CASES[2:4],
                         ids=["splits-wide", "splits-tz25", "one-block-row"])
def test_tile_backward_filter_splits_and_tickets(case, sms):
    cfg, stats = E.run_wgrad(*case, 4, 0, 0.5, 2.0, seed=5, sms=sms)
    assert (cfg[6] > 1) == (stats["last_reduces"] > 0)


# dense convolutions of one input channel (C 1, groups 1; conv_igemm.direct_supports sends them to these kernels):
# LeNet's conv1 (5x5, K 6, 32x32), K 16 3x3 ragged, K 1, 5x5 pad 2, 3x3 stride 2, 5x5 stride 2 pad 2
@pytest.mark.parametrize("case", E.DENSE_C1, ids=lambda c: "x".join(map(str, c)))
def test_dense_one_channel_forward_and_flipped_backward_data(case):
    for direction in ["forward"] + (["backward_data"] if case[8] == 1 else []):
        E.run(*case, direction, 4, 0, 0.75, -0.5, seed=6)
        E.run(*case, direction, 2, 1, 1.0, 0.0, seed=7)                  # 16-bit, unaligned: element paths


@pytest.mark.parametrize("case", E.DENSE_C1, ids=lambda c: "x".join(map(str, c)))
def test_dense_one_channel_backward_filter(case):
    E.run_wgrad(*case, 4, 0, 1.0, 0.0, seed=8)


def test_dense_one_channel_lenet_splits_and_tickets():
    """LeNet's conv1 geometry on 8 images with an H200's 132 SMs: each of the 6 filter rows split over blocks."""
    (case, sms), = [c for c in E.WGRAD_SPLIT_CASES if c[0][1] == 1 and c[0][4] == 6]
    cfg, stats = E.run_wgrad(*case, 4, 0, 0.5, 2.0, seed=9, sms=sms)
    assert cfg[6] > 1 and stats["last_reduces"] == 6


# dense convolutions of 2..8 input channels (groups 1: Cg = C, Kg = K; direct_supports admits C <= DIRECT_MAX_CG):
# a 3-channel stem 3x3 ragged, LeNet's conv2 (C 6 K 16 5x5), C 8 K 32 (both limits), stride 2, 5x5 pad 2, C 2
@pytest.mark.parametrize("case", E.DENSE_CG, ids=lambda c: "x".join(map(str, c)))
def test_dense_channels_forward_and_flipped_backward_data(case):
    for direction in ["forward"] + (["backward_data"] if case[8] == 1 else []):
        E.run(*case, direction, 4, 0, 0.75, -0.5, seed=11)
        E.run(*case, direction, 2, 1, 1.0, 0.0, seed=12)                 # 16-bit, unaligned: element paths


@pytest.mark.parametrize("case", E.DENSE_CG, ids=lambda c: "x".join(map(str, c)))
def test_dense_channels_backward_filter(case):
    E.run_wgrad(*case, 4, 0, 1.0, 0.0, seed=13)
    E.run_wgrad(*case, 2, 1, 0.75, -0.5, seed=14)


def test_dense_channels_splits_and_tickets():
    """C 3 K 4 on 24 images with 132 SMs: each of the 12 filter rows (k * Cg + c) split over 2 blocks."""
    (case, sms), = [c for c in E.WGRAD_SPLIT_CASES if c[0][1] == 3 and c[0][10] == 1]
    cfg, stats = E.run_wgrad(*case, 4, 0, 0.5, 2.0, seed=15, sms=sms)
    assert cfg[6] > 1 and stats["last_reduces"] == 12


# strided backward data, dw_tile_backward_data (gather form by residue class): stride 2 ragged, pad 0 / 2,
# 5x5, stride 3 (scalar stores), stride 2 dilation 2, channel multiplier 2, dense C 3, stride 1 with pad > R - 1
DGRAD = [E.DGRAD_CASES[i] for i in (1, 2, 3, 4, 6, 9, 13, 15, 21)]


@pytest.mark.parametrize("case", DGRAD, ids=lambda c: "x".join(map(str, c)))
def test_tile_strided_backward_data(case):
    E.run_dgrad(*case, 4, 0, 0.75, -0.5, seed=16)
    E.run_dgrad(*case, 2, 1, 1.0, 0.0, seed=17)                          # 16-bit, unaligned: element paths


def test_tile_strided_backward_data_several_planes_per_block():
    (case, sms) = E.DGRAD_TZ_CASES[0]
    cfg, _ = E.run_dgrad(*case, 4, 0, 1.0, 0.0, seed=18, sms=sms)
    assert cfg[2] > 1

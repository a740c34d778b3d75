"""Dense convolutions (groups == 1) of few input channels run on the direct kernels (conv_igemm.direct_supports): C == 1
(LeNet-5's conv1) is a depthwise convolution with channel multiplier K, C 2..8 (LeNet's conv2, the 3-channel stems)
one group of Cg = C -- checked here without a GPU: which problems the rule admits (and DIRECT_DENSE_MAX_MACS, the
one constant that sends the multi-channel ones back), that the heuristic on a CUDA device ranks DIRECT / ALGO_0's
direct kernel first for LeNet's conv1 and conv2 and the stems in all three directions, and which kernels the
GPU path launches under tools/record_launches.py's fake CuPy (NumPy arrays, launches recorded, never run; in a
subprocess so the fake never meets this session's modules).  The bits on a GPU: the dense-c1 rows of
test_depthwise_kernels.py and test_depthwise_wgrad.py; the index math on the CPU: test_dw_tile_emulation.py."""
import functools
import json
import pathlib
import subprocess
import sys
import textwrap
import types

import pytest

from minidnn.backend import ConvolutionDescriptor, MathType
from minidnn.backend.conv_algorithms import (
    BACKWARD_DATA_ALGORITHMS,
    BACKWARD_FILTER_ALGORITHMS,
    FORWARD_ALGORITHMS,
    ConvolutionBwdDataAlgo,
    ConvolutionBwdFilterAlgo,
    ConvolutionFwdAlgo,
)
from minidnn.backend.conv_problem import make_problem
from minidnn.backend.cuda import conv_igemm as K
from minidnn.backend.cuda import conv_register as R

ROOT = pathlib.Path(__file__).resolve().parents[2]
LENET_CONV1 = ((64, 1, 32, 32), (6, 1, 5, 5), 0, 1)
LENET_CONV2 = ((64, 6, 14, 14), (16, 6, 5, 5), 0, 1)


def _problem(x_shape, w_shape, pad, groups, stride=1, dtype="float32"):
    return make_problem("test", x_shape, w_shape, ConvolutionDescriptor(pad, stride, 1, groups), dtype)


@pytest.mark.parametrize("x_shape, w_shape, pad, groups, direct", [
    ((64, 1, 32, 32), (6, 1, 5, 5), 0, 1, True),        # LeNet conv1
    ((8, 1, 32, 32), (32, 1, 3, 3), 1, 1, True),        # K at the limit (4 * DIRECT_MAX_CG)
    ((8, 1, 32, 32), (33, 1, 3, 3), 1, 1, False),       # one over: the implicit GEMM
    ((8, 1, 20, 20), (1, 1, 7, 7), 3, 1, True),         # K 1, 7x7
    ((8, 1, 20, 20), (4, 1, 8, 8), 0, 1, False),        # 64 taps
    ((64, 6, 14, 14), (16, 6, 5, 5), 0, 1, True),       # LeNet conv2: dense, 6 channels
    ((8, 3, 32, 32), (16, 3, 3, 3), 1, 1, True),        # a 3-channel stem (ResNet-20, MobileNet-small)
    ((8, 8, 16, 16), (32, 8, 3, 3), 1, 1, True),        # C 8, K 32: both limits
    ((8, 9, 16, 16), (16, 9, 3, 3), 1, 1, False),       # 9 channels: the implicit GEMM
    ((8, 2, 16, 16), (33, 2, 3, 3), 1, 1, False),       # K 33
    ((8, 4, 16, 16), (8, 4, 7, 7), 0, 1, True),         # C 4, 7x7 (49 taps)
    ((8, 16, 8, 8), (16, 1, 3, 3), 1, 16, True),        # depthwise, as before
    ((8, 16, 8, 8), (16, 4, 3, 3), 1, 4, True),         # groups of 4 channels, as before
])
def test_direct_rule_admits_dense_few_channels(x_shape, w_shape, pad, groups, direct):
    p = _problem(x_shape, w_shape, pad, groups)
    assert (K.direct_supports(p) is None) == direct, K.direct_supports(p)
    for dtype in ("float16", "bfloat16"):
        assert (K.direct_supports(_problem(x_shape, w_shape, pad, groups, dtype=dtype)) is None) == direct
    assert K.direct_supports(_problem(x_shape, w_shape, pad, groups, dtype="float64")) is not None


def _cuda_handle():
    """What the registry's heuristic reads of a handle on a CUDA device (no GPU needed to rank)."""
    return types.SimpleNamespace(device=types.SimpleNamespace(type="cuda"), deterministic=False, workspace_limit=None)


def _top(registry, p):
    ranked = registry.heuristic(p, _cuda_handle(), MathType.DEFAULT)
    return ranked[0].algo, registry.get(ranked[0].algo).estimated_cost(p, "cuda")


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_heuristic_picks_the_direct_kernels_for_lenet_conv1(dtype):
    p = _problem(*LENET_CONV1, dtype=dtype)
    direct = R._direct_cost(p)
    assert _top(FORWARD_ALGORITHMS, p) == (ConvolutionFwdAlgo.DIRECT, direct)
    assert _top(BACKWARD_DATA_ALGORITHMS, p) == (ConvolutionBwdDataAlgo.ALGO_0, direct)
    assert _top(BACKWARD_FILTER_ALGORITHMS, p) == (ConvolutionBwdFilterAlgo.ALGO_0, direct)
    # the GEMM forms it displaced, with room to spare (not a near tie the heuristic could flip)
    for registry, gemm in ((FORWARD_ALGORITHMS, ConvolutionFwdAlgo.GEMM),
                           (BACKWARD_DATA_ALGORITHMS, ConvolutionBwdDataAlgo.ALGO_1),
                           (BACKWARD_FILTER_ALGORITHMS, ConvolutionBwdFilterAlgo.ALGO_1)):
        assert registry.get(gemm).estimated_cost(p, "cuda") > 2 * direct
    assert R.implicit_cost(p) > 2 * direct


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("x_shape, w_shape, pad", [((64, 6, 14, 14), (16, 6, 5, 5), 0),       # LeNet conv2
                                                   ((128, 3, 32, 32), (16, 3, 3, 3), 1),     # ResNet-20's stem
                                                   ((64, 3, 32, 32), (16, 3, 3, 3), 1)],     # MobileNet-small's
                         ids=["lenet-conv2", "resnet20-stem", "mobilenet-stem"])
def test_heuristic_picks_the_direct_kernels_for_dense_few_channels(x_shape, w_shape, pad, dtype):
    """LeNet's conv2 (H200: direct 14.6 / 30.6 / 15.5 us, implicit GEMM 23.2 / 71.3 / 22.1) and, by the cost
    model alone (unmeasured), the 3-channel stems: DIRECT / ALGO_0 / ALGO_0 with the direct cost, the implicit GEMM
    (IMPLICIT_PRECOMP_GEMM, ALGO_3) next."""
    p = _problem(x_shape, w_shape, pad, 1, dtype=dtype)
    direct = R._direct_cost(p)
    assert direct < R.implicit_cost(p)
    assert _top(FORWARD_ALGORITHMS, p) == (ConvolutionFwdAlgo.DIRECT, direct)
    assert _top(BACKWARD_DATA_ALGORITHMS, p) == (ConvolutionBwdDataAlgo.ALGO_0, direct)
    assert _top(BACKWARD_FILTER_ALGORITHMS, p) == (ConvolutionBwdFilterAlgo.ALGO_0, direct)
    h = _cuda_handle()
    assert FORWARD_ALGORITHMS.heuristic(p, h, MathType.DEFAULT)[1].algo is ConvolutionFwdAlgo.IMPLICIT_PRECOMP_GEMM
    assert BACKWARD_FILTER_ALGORITHMS.heuristic(p, h, MathType.DEFAULT)[1].algo is ConvolutionBwdFilterAlgo.ALGO_3


def test_dense_macs_cap_sends_the_stems_back_to_the_implicit_gemm(monkeypatch):
    """DIRECT_DENSE_MAX_MACS (multiply-adds per image) is the one constant to flip: 2 ** 18 keeps LeNet's conv2
    (240e3 per image) direct and sends the 3-channel 32x32 stems (442e3) to the implicit GEMM in all three
    directions; 0 restores 0678a49's rule (one input channel only)."""
    stem, conv2, conv1 = _problem((128, 3, 32, 32), (16, 3, 3, 3), 1, 1), _problem(*LENET_CONV2), _problem(*LENET_CONV1)
    try:
        for cap, direct in ((2 ** 18, (False, True, True)), (0, (False, False, True))):
            monkeypatch.setattr(K, "DIRECT_DENSE_MAX_MACS", cap)
            K.direct_supports.cache_clear()
            assert tuple(K.direct_supports(q) is None for q in (stem, conv2, conv1)) == direct
        monkeypatch.setattr(K, "DIRECT_DENSE_MAX_MACS", 2 ** 18)
        K.direct_supports.cache_clear()
        implicit = R.implicit_cost(stem)
        assert _top(FORWARD_ALGORITHMS, stem) == (ConvolutionFwdAlgo.IMPLICIT_PRECOMP_GEMM, implicit)
        assert _top(BACKWARD_DATA_ALGORITHMS, stem) == (ConvolutionBwdDataAlgo.ALGO_0, implicit)
        assert _top(BACKWARD_FILTER_ALGORITHMS, stem)[1] == implicit        # ALGO_3 or ALGO_0's implicit kernel
    finally:
        monkeypatch.undo()
        K.direct_supports.cache_clear()


def test_cpu_heuristic_is_unchanged_for_lenet_conv1():
    """The CUDA kernels' rule does not touch the CPU ranking (conv_cpu's fast GEMM stays first there)."""
    p = _problem(*LENET_CONV1)
    cpu = types.SimpleNamespace(device=types.SimpleNamespace(type="cpu"), deterministic=False, workspace_limit=None)
    assert FORWARD_ALGORITHMS.heuristic(p, cpu, MathType.DEFAULT)[0].algo is ConvolutionFwdAlgo.GEMM


_SCRIPT = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {root!r} + "/tools")
    import record_launches as R
    fakecp, L = R._install({root!r})
    recs = []
    R.record_to(L, recs)
    import numpy as np
    import minidnn.backend as B
    from minidnn.nn import functional as F
    from minidnn.tensor import Tensor
    out = {{}}
    xs, ws, ys = (64, 1, 32, 32), (6, 1, 5, 5), (64, 6, 28, 28)       # LeNet-5's conv1 at the benchmark's batch
    xa, wa, gya = fakecp.zeros(xs), fakecp.zeros(ws), fakecp.zeros(ys)
    for rep in range(2):                                # the second time: the settled calls
        for needs_dx in (False, True):                  # a training step's conv1 (images need no grad), and not
            x, w = Tensor._from_array(xa), Tensor._from_array(wa)
            x.requires_grad, w.requires_grad = needs_dx, True
            del recs[:]
            y = F.conv2d(x, w)
            out["fwd%d%d" % (rep, needs_dx)] = list(recs)
            del recs[:]
            y.backward(Tensor._from_array(gya))
            out["bwd%d%d" % (rep, needs_dx)] = list(recs)
    desc = B.ConvolutionDescriptor(0)
    for fmt in ("NCHW", "NHWC"):                         # the primitives, both formats (C = 1: one memory order)
        xf = xa if fmt == "NCHW" else fakecp.zeros((64, 32, 32, 1))
        gyf = gya if fmt == "NCHW" else fakecp.zeros((64, 28, 28, 6))
        del recs[:]
        B.convolution_forward(None, xf, wa, desc, format=fmt)
        B.convolution_backward_data(None, wa, gyf, desc, xf.shape, format=fmt)
        B.convolution_backward_filter(None, xf, gyf, desc, ws, format=fmt)
        out["prim_" + fmt] = list(recs)
    xs2, ws2, ys2 = (64, 6, 14, 14), (16, 6, 5, 5), (64, 16, 10, 10)  # LeNet-5's conv2: x needs its gradient
    for rep in range(2):
        x, w = Tensor._from_array(fakecp.zeros(xs2)), Tensor._from_array(fakecp.zeros(ws2))
        x.requires_grad, w.requires_grad = True, True
        del recs[:]
        y = F.conv2d(x, w)
        out["c2fwd%d" % rep] = list(recs)
        del recs[:]
        y.backward(Tensor._from_array(fakecp.zeros(ys2)))
        out["c2bwd%d" % rep] = list(recs)
    del recs[:]
    B.convolution_forward(None, fakecp.zeros(xs2), fakecp.zeros(ws2), desc)
    B.convolution_backward_data(None, fakecp.zeros(ws2), fakecp.zeros(ys2), desc, xs2)
    B.convolution_backward_filter(None, fakecp.zeros(xs2), fakecp.zeros(ys2), desc, ws2)
    out["c2prim_NCHW"] = list(recs)
    xs3, ws3, ys3 = (8, 3, 32, 32), (16, 3, 3, 3), (8, 16, 32, 32)   # a 3-channel stem, NCHW and NHWC format
    desc1 = B.ConvolutionDescriptor(1)
    for fmt in ("NCHW", "NHWC"):
        cl = (lambda s: (s[0], s[2], s[3], s[1])) if fmt == "NHWC" else (lambda s: s)
        xf, gyf = fakecp.zeros(cl(xs3)), fakecp.zeros(cl(ys3))
        del recs[:]
        B.convolution_forward(None, xf, fakecp.zeros(ws3), desc1, format=fmt)
        B.convolution_backward_data(None, fakecp.zeros(ws3), gyf, desc1, xf.shape, format=fmt)
        B.convolution_backward_filter(None, xf, gyf, desc1, ws3, format=fmt)
        out["stem_" + fmt] = list(recs)
    print(json.dumps(out))
""")


@functools.lru_cache(maxsize=1)
def _run():
    res = subprocess.run([sys.executable, "-c", _SCRIPT.format(root=str(ROOT))], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def _names(recs):
    return [r[0].split("(")[0] for r in recs]


def test_lenet_conv1_step_is_one_direct_launch_per_direction():
    """F.conv2d's forward and backward of LeNet's conv1 on the GPU path: dw_tile_forward, then
    dw_tile_backward_filter (and, where x needs a gradient, dw_tile_forward with FLIP=1) -- no im2col, no cuBLAS,
    no split-K reduce, no contiguous copy; the settled calls launch the same."""
    out = _run()
    for rep in (0, 1):
        assert _names(out[f"fwd{rep}0"]) == ["dw_tile_forward"], out[f"fwd{rep}0"]
        assert _names(out[f"bwd{rep}0"]) == ["dw_tile_backward_filter"], out[f"bwd{rep}0"]
        assert _names(out[f"fwd{rep}1"]) == ["dw_tile_forward"]
        bwd = out[f"bwd{rep}1"]
        assert sorted(_names(bwd)) == ["dw_tile_backward_filter", "dw_tile_forward"], bwd
        flipped = [r for r in bwd if r[0].startswith("dw_tile_forward")]
        assert "-DFLIP=1" in flipped[0][0] and "-DKR=5" in flipped[0][0]
    assert "-DFLIP=1" not in out["fwd00"][0][0]
    assert out["fwd00"] == out["fwd10"] and out["bwd00"] == out["bwd10"]


def test_lenet_conv1_primitives_take_the_direct_kernels_in_both_formats():
    out = _run()
    assert _names(out["prim_NCHW"]) == ["dw_tile_forward", "dw_tile_forward", "dw_tile_backward_filter"]
    # NHWC dy (6 channels innermost) is no plane of unit-stride rows: the generic direct kernels take it
    nhwc = _names(out["prim_NHWC"])
    assert nhwc[0] == "dw_tile_forward"                  # x of one channel is NCHW memory too
    assert "conv_igemm" not in nhwc and "cupy/cublas" not in nhwc, nhwc
    assert set(nhwc[1:]) <= {"direct_backward_data", "direct_backward_filter", "direct_splits_reduce"}, nhwc


def test_lenet_conv2_is_one_direct_launch_per_direction():
    """LeNet's conv2 (C 6, K 16) in a training step: dw_tile_forward, then dw_tile_backward_filter and the FLIP=1
    dw_tile_forward for dx (x is conv1's pooled output) -- no implicit-GEMM kernel, no cuBLAS; the primitives too."""
    out = _run()
    for rep in (0, 1):
        assert _names(out[f"c2fwd{rep}"]) == ["dw_tile_forward"], out[f"c2fwd{rep}"]
        bwd = out[f"c2bwd{rep}"]
        assert sorted(_names(bwd)) == ["dw_tile_backward_filter", "dw_tile_forward"], bwd
        assert "-DFLIP=1" in [r for r in bwd if r[0].startswith("dw_tile_forward")][0][0]
    assert out["c2fwd0"] == out["c2fwd1"] and out["c2bwd0"] == out["c2bwd1"]
    assert _names(out["c2prim_NCHW"]) == ["dw_tile_forward", "dw_tile_forward", "dw_tile_backward_filter"]


def test_dense_stem_takes_direct_in_nchw_and_the_implicit_gemm_in_nhwc():
    """conv_register._dense_channels_last: a dense 3-channel stem runs the direct kernels on NCHW activations and
    the implicit GEMM on channels-last ones (H200: the direct kernels' generic NHWC forms were 1.6-1.9x slower
    there), in all three directions, through the same algorithm choice (DIRECT / ALGO_0 / ALGO_0)."""
    out = _run()
    assert "conv_igemm" not in _names(out["stem_NCHW"]), out["stem_NCHW"]
    assert _names(out["stem_NCHW"])[0] == "dw_tile_forward"
    nhwc = [n for n in _names(out["stem_NHWC"]) if n != "nchw_to_nhwc"]
    assert nhwc == ["conv_igemm"] * 3, out["stem_NHWC"]

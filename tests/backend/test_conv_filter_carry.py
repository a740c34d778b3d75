"""The forward's KRSC filter copy carried to backward data (backend.convolution_filter_carry, nn's ConvForward), on the
CPU: the GPU path run under tools/record_launches.py's fake CuPy (NumPy arrays, launches recorded, never run) in a
subprocess, so the fake never meets this test session's modules.  What is checked, per staged layer shape (stride 1,
stride 2, groups 2): ConvForward's first-order backward runs the backward-data kernel with WKRSC=1 and makes one
`nchw_to_nhwc` launch less than with the carry off, every other launch (kernel, options, grid, block, packed
arguments) the same; the forward's launches are the same; nothing is left active after the calls; a carry holding
another filter's copy is not read; a 1x1 filter (already KRSC in memory) keeps no copy; an in-place change of the
weight between forward and backward still raises (autograd's version check comes first).  The bits on a GPU:
test_conv_filter_carry_cuda.py."""
import functools
import json
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

_SCRIPT = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {root!r} + "/tools")
    import record_launches as R
    fakecp, L = R._install({root!r})
    R._zero_pointers(fakecp, L)                 # array arguments recorded as null pointers
    recs = R.record_packed(L, [], other="cupy")     # every launch: kernel, grid, packed argument bytes
    import minidnn as mdn
    import minidnn.backend as B
    from minidnn.backend.convolution import convolution_filter_carry
    from minidnn.backend.cuda import conv_igemm as K
    from minidnn.nn import functional as F
    from minidnn.nn._functions import conv as C
    from minidnn.tensor import Tensor
    out = {{}}
    # (N, C, H, W, K, R, S, pad, stride, groups): each >= 2^25 multiply-adds (staged)
    shapes = {{"s1": (128, 16, 32, 32, 16, 3, 3, 1, 1, 1), "s2": (128, 16, 32, 32, 32, 3, 3, 1, 2, 1),
               "g2": (64, 32, 32, 32, 32, 3, 3, 1, 1, 2), "1x1": (128, 32, 16, 16, 64, 1, 1, 0, 1, 1)}}

    def step(shape, carry_on, x_on=None, need_dx=True):
        n, c, h, w_, k, r, s, pad, st, g = shape
        C.CARRY_FILTER[0], C.CARRY_X[0] = carry_on, bool(x_on)
        x = Tensor._from_array(fakecp.zeros((n, c, h, w_), dtype="float32"))
        w = Tensor._from_array(fakecp.zeros((k, c // g, r, s), dtype="float32"))
        x.requires_grad, w.requires_grad = need_dx, True
        del recs[:]
        y = F.conv2d(x, w, None, st, pad, 1, g)
        fwd = list(recs)
        kept = y.grad_fn.carry is not None
        if x_on is not None:
            kept = [kept, y.grad_fn.carry is not None and y.grad_fn.carry.xs is not None]
        del recs[:]
        y.backward(Tensor._from_array(fakecp.zeros(y.shape, dtype="float32")))
        return fwd, list(recs), kept

    for name, shape in shapes.items():
        for rep in range(2):                      # the second time: the settled calls
            for on in (False, True):
                fwd, bwd, kept = step(shape, on)
                out["%s_%d_%d" % (name, on, rep)] = [fwd, bwd, kept]
        out[name + "_inactive"] = K._scope.carry is None
        for rep in range(2):                      # x's NHWC copy carried to the filter gradient (CARRY_X)
            for dx in (True, False):
                for on in (False, True):
                    out["x_%s_%d_%d_%d" % (name, dx, on, rep)] = list(step(shape, True, on, dx))
        out[name + "_x_inactive"] = K._scope.carry is None and K._scope.memo is None
    C.CARRY_FILTER[0] = C.CARRY_X[0] = True

    # the primitives: a carry that holds another filter's copy is not read; without a carry, as before
    n, c, h, w_, k = 128, 16, 32, 32, 16
    desc = B.ConvolutionDescriptor((1, 1))
    xa, gya = fakecp.zeros((n, c, h, w_), dtype="float32"), fakecp.zeros((n, k, h, w_), dtype="float32")
    wa, wb = fakecp.zeros((k, c, 3, 3), dtype="float32"), fakecp.zeros((k, c, 3, 3), dtype="float32")
    carry = convolution_filter_carry()
    with carry:
        B.convolution_forward(None, xa, wa, desc)
    out["carry_kept"] = carry.krsc is not None and tuple(carry.krsc.shape) == (k, 3, 3, c)
    for name, wt in (("other", wb), ("same", wa), ("none", None)):
        del recs[:]
        if wt is None:
            B.convolution_backward_data(None, wa, gya, desc, xa.shape)
        else:
            with carry:
                B.convolution_backward_data(None, wt, gya, desc, xa.shape)
        out["prim_" + name] = list(recs)
    out["prim_inactive"] = K._scope.carry is None

    # an in-place change of the weight between forward and backward raises before anything is read
    x = Tensor._from_array(fakecp.zeros((128, 16, 32, 32), dtype="float32"))
    w = Tensor._from_array(fakecp.zeros((16, 16, 3, 3), dtype="float32"))
    x.requires_grad = w.requires_grad = True
    y = F.conv2d(x, w, None, 1, 1)
    with mdn.no_grad():
        w.mul_(2.0)
    try:
        y.backward(Tensor._from_array(fakecp.zeros(y.shape, dtype="float32")))
        out["stale"] = "no error"
    except RuntimeError as e:
        out["stale"] = str(e)
    print(json.dumps(out))
""")


@functools.lru_cache(maxsize=1)
def _run():
    script = _SCRIPT.format(root=str(ROOT))
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def _names(recs):
    return [r[0] for r in recs]


def _bd(recs):
    return [r for r in recs if "conv_igemm" in r[0] and "DIR=1" in r[0]]


@pytest.mark.parametrize("rep", [0, 1])
@pytest.mark.parametrize("name", ["s1", "s2", "g2"])
def test_backward_data_reads_the_forwards_copy(name, rep):
    out = _run()
    f_off, b_off, kept_off = out[f"{name}_0_{rep}"]
    f_on, b_on, kept_on = out[f"{name}_1_{rep}"]
    assert kept_on and not kept_off
    assert f_on == f_off                                    # the forward launches as before
    assert len(b_on) == len(b_off) - 1
    copies = [sum("nchw_to_nhwc" in n for n in _names(b)) for b in (b_off, b_on)]
    assert copies[0] == 3 and copies[1] == 2        # dy (shared by both gradients), CRSK filter, x; the filter's gone
    (bd_off,), (bd_on,) = _bd(b_off), _bd(b_on)
    assert "WKRSC=1" in bd_on[0] and "WKRSC" not in bd_off[0] and "VEC=1" in bd_off[0]
    assert bd_on[1:] == bd_off[1:]                          # grid, block, packed arguments
    assert bd_on[0].replace(", '-DWKRSC=1'", "") == bd_off[0]
    # every launch but the CRSK copy and the kernel's option: the same, in the same order
    i = b_off.index(bd_off)
    rest_off = b_off[:i - 1] + b_off[i + 1:]                # the CRSK copy is made just before the kernel
    rest_on = [r for r in b_on if r != bd_on]
    assert "nchw_to_nhwc" in b_off[i - 1][0]
    assert rest_on == rest_off
    assert out[name + "_inactive"]


def test_a_1x1_filter_keeps_no_copy():
    out = _run()
    for rep in (0, 1):
        f_off, b_off, kept_off = out[f"1x1_0_{rep}"]
        f_on, b_on, kept_on = out[f"1x1_1_{rep}"]
        assert not kept_on and (f_on, b_on) == (f_off, b_off)


def test_the_primitives_read_only_a_copy_of_the_same_filter():
    out = _run()
    assert out["carry_kept"]
    other, same, none = out["prim_other"], out["prim_same"], out["prim_none"]
    assert other == none                                    # another filter's copy: not read
    assert len(same) == len(none) - 1
    assert "WKRSC=1" in _bd(same)[0][0] and "WKRSC" not in _bd(none)[0][0]
    assert out["prim_inactive"]


def test_a_weight_changed_in_place_still_raises():
    out = _run()
    assert "modified by an in-place operation" in out["stale"] and "(16, 16, 3, 3)" in out["stale"]


def test_cpu_calls_keep_no_carry():
    import minidnn as mdn
    from minidnn.nn import functional as F
    x = mdn.tensor(np.random.default_rng(0).standard_normal((2, 4, 6, 6)).astype(np.float32), requires_grad=True)
    w = mdn.tensor(np.random.default_rng(1).standard_normal((4, 4, 3, 3)).astype(np.float32), requires_grad=True)
    y = F.conv2d(x, w, padding=1)
    assert y.grad_fn.carry is None
    y.sum().backward()
    assert x.grad is not None and w.grad is not None


@pytest.mark.parametrize("rep", [0, 1])
@pytest.mark.parametrize("need_dx", [True, False])
@pytest.mark.parametrize("name", ["s1", "s2", "g2"])
def test_the_filter_gradient_reads_the_forwards_copy_of_x(name, need_dx, rep):
    """CARRY_X: the forward's NHWC staging copy of x kept for the backward filter -- the forward's launches the same,
    one ``nchw_to_nhwc`` launch of x's size less in the backward, every other launch the same and in order (whether
    or not backward data runs too)."""
    out = _run()
    f_off, b_off, kept_off = out[f"x_{name}_{int(need_dx)}_0_{rep}"]
    f_on, b_on, kept_on = out[f"x_{name}_{int(need_dx)}_1_{rep}"]
    assert kept_on[1] and not kept_off[1]
    assert f_on == f_off
    assert len(b_on) == len(b_off) - 1
    n, c, h, w_ = {"s1": (128, 16, 32, 32), "s2": (128, 16, 32, 32), "g2": (64, 32, 32, 32)}[name]
    gone = [i for i in range(len(b_off)) if b_on == b_off[:i] + b_off[i + 1:]]
    assert gone, "the backward's launches are not the old ones less one"
    r = b_off[gone[0]]
    assert "nchw_to_nhwc" in r[0] and r[1][2] == n          # a copy of x (n images; a filter's copy has K rows)
    assert out[name + "_x_inactive"]


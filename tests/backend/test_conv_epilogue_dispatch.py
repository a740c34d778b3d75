"""convolution_bias_activation_forward's fused GPU path (backend/cuda/conv_epilogue.py), checked without a GPU: the
dispatch rule (which algorithms, activations and dtypes take the fused kernel, and why the others run the
composition), and the launches under tools/record_launches.py's fake CuPy (NumPy arrays, launches recorded, never
run; in a subprocess so the fake never meets this session's modules): one implicit-GEMM launch with EPI=1 per call,
the plain forward's grid and packed arguments inside it, z's strides / alpha2 / the coefficient appended, the
composition where the rule declines.  The bits on a GPU: test_conv_epilogue_cuda.py."""
import functools
import json
import pathlib
import struct
import subprocess
import sys
import textwrap

import pytest

from minidnn.backend import ConvolutionDescriptor
from minidnn.backend.conv_problem import make_problem
from minidnn.backend.cuda import conv_epilogue as E
from minidnn.backend.cuda import conv_igemm as K

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _problem(x_shape, w_shape, pad=1, groups=1, dtype="float32"):
    return make_problem("test", x_shape, w_shape, ConvolutionDescriptor(pad, 1, 1, groups), dtype)


@pytest.mark.parametrize("algo", ["IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM"])
@pytest.mark.parametrize("mode", list(K.EPI_ACTS))
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_rule_takes_the_implicit_gemm_algorithms_and_epilogue_activations(algo, mode, dtype):
    assert E.supports(algo, _problem((8, 16, 12, 12), (24, 16, 3, 3), dtype=dtype), mode) is None


@pytest.mark.parametrize("algo, p, mode, words", [
    ("DIRECT", _problem((8, 16, 12, 12), (16, 1, 3, 3), groups=16), "RELU", "DIRECT"),
    ("GEMM", _problem((8, 16, 12, 12), (24, 16, 3, 3)), "RELU", "GEMM"),
    ("IMPLICIT_GEMM", _problem((8, 16, 12, 12), (24, 16, 3, 3)), "GELU", "GELU"),
    ("IMPLICIT_GEMM", _problem((8, 16, 12, 12), (24, 16, 3, 3), dtype="float64"), "RELU", "float32"),
    ("IMPLICIT_GEMM", make_problem("t", (2, 4, 5, 5, 5), (4, 4, 3, 3, 3), ConvolutionDescriptor(1), "float32"),
     "RELU", "2-D"),
])
def test_rule_declines_with_a_reason(algo, p, mode, words):
    why = E.supports(algo, p, mode)
    assert why is not None and words in why


def test_rule_switch(monkeypatch):
    monkeypatch.setattr(E, "ENABLED", [False])
    assert "switched off" in E.supports("IMPLICIT_GEMM", _problem((8, 16, 12, 12), (24, 16, 3, 3)), "RELU")


def test_fused_reason_on_the_cpu_is_the_composition():
    import numpy as np

    from minidnn.backend import ActivationDescriptor, fused_reason
    x, w = np.zeros((2, 4, 6, 6), np.float32), np.zeros((4, 4, 3, 3), np.float32)
    why = fused_reason(None, x, w, ConvolutionDescriptor(1), None, None, 1.0, 0.0, None, ActivationDescriptor("relu"))
    assert "CPU" in why


def test_epilogue_options_only_when_asked():
    """EPI=0 configurations keep the plain options (and so, with EPI undefined, the plain kernel)."""
    plain = K.igemm_options(0, "float32", True, "64x64", True)[0]
    fused = K.igemm_options(0, "float32", True, "64x64", True, act=K.EPI_ACTS["RELU"])[0]
    assert fused == plain + ("-DEPI=1", "-DACT=2") and not any("EPI" in o for o in plain)


_SCRIPT = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {root!r} + "/tools")
    import record_launches as R
    fakecp, L = R._install({root!r})
    import numpy as np
    import ml_dtypes
    fakecp.pad = lambda *a, **k: fakecp.asarray(np.pad(*a, **k))     # the float64 reference's im2col
    recs = R.record_packed(L, [])           # every launch: kernel, grid, packed argument bytes
    import minidnn.backend as B
    from minidnn.backend.cuda import conv_epilogue as E
    from minidnn.backend.layout import TensorFormat, to_channels_first
    out = {{}}
    def nhwc(a):
        return fakecp.asarray(np.ascontiguousarray(np.moveaxis(np.asarray(a), 1, -1)))
    cases = {{
        # name: (x, w, pad, groups, dtype, format, z?, bias?, mode, coef, y is z?)
        "nchw": ((8, 16, 12, 12), (24, 16, 3, 3), 1, 1, np.float32, "NCHW", True, True, "relu", None, False),
        "nchw-noz-nobias": ((8, 16, 12, 12), (24, 16, 3, 3), 1, 1, np.float32, "NCHW", False, False, "identity",
                            None, False),
        "nchw-elu": ((3, 16, 9, 7), (40, 16, 3, 3), 0, 1, np.float32, "NCHW", True, True, "elu", 0.7, False),
        "nhwc": ((8, 16, 12, 12), (24, 16, 3, 3), 1, 1, np.float32, "NHWC", True, True, "relu", None, False),
        "bf16": ((8, 16, 12, 12), (24, 16, 3, 3), 1, 1, ml_dtypes.bfloat16, "NCHW", True, True, "tanh", None, False),
        "groups": ((4, 32, 10, 10), (32, 16, 3, 3), 1, 2, np.float32, "NCHW", True, True, "relu", None, False),
        "y-is-z": ((8, 16, 12, 12), (24, 16, 3, 3), 1, 1, np.float32, "NCHW", True, True, "relu", None, True),
        "depthwise": ((8, 16, 12, 12), (16, 1, 3, 3), 1, 16, np.float32, "NCHW", True, True, "relu", None, False),
        "float64": ((8, 16, 12, 12), (24, 16, 3, 3), 1, 1, np.float64, "NCHW", True, True, "relu", None, False),
        "gelu": ((8, 16, 12, 12), (24, 16, 3, 3), 1, 1, np.float32, "NCHW", True, True, "gelu", None, False),
    }}
    rng = np.random.default_rng(0)
    for name, (xs, ws, pad, groups, dt, fmt, wz, wb, mode, coef, y_is_z) in cases.items():
        desc = B.ConvolutionDescriptor(pad, 1, 1, groups)
        x = fakecp.asarray(rng.standard_normal(xs).astype(dt))
        w = fakecp.asarray(rng.standard_normal(ws).astype(dt))
        if fmt == "NHWC":
            x = nhwc(x)
        ys = B.get_convolution_forward_output_dim(desc, x.shape, w.shape, format=fmt)
        z = fakecp.asarray(rng.standard_normal(ys).astype(dt)) if wz else None
        b = fakecp.asarray(rng.standard_normal(ws[0]).astype(dt)) if wb else None
        act = B.ActivationDescriptor(mode, coef)
        res = {{}}
        for rep in range(2):
            del recs[:]
            if y_is_z:
                yv = B.convolution_bias_activation_forward(None, x, w, desc, None, z, 0.5, 0.25, b, act, y=z,
                                                           format=fmt)
                assert yv is z
            else:
                yv = B.convolution_bias_activation_forward(None, x, w, desc, None, z, 0.5, 0.25, b, act, format=fmt)
            res["fused%d" % rep] = list(recs)
        res["reason"] = B.fused_reason(None, x, w, desc, None, z, 0.5, 0.25, b, act, format=fmt)
        res["y"] = [list(yv.shape), list(yv.strides)]
        res["z_strides"] = None if z is None else [s // z.itemsize for s in
                                                   to_channels_first(z, TensorFormat(fmt)).strides]
        del recs[:]
        B.convolution_forward(None, x, w, desc, format=fmt)
        res["plain"] = list(recs)
        E.ENABLED[0] = False
        del recs[:]
        B.convolution_bias_activation_forward(None, x, w, desc, None, z, 0.5, 0.25, b, act, format=fmt)
        res["composition"] = list(recs)
        E.ENABLED[0] = True
        out[name] = res
    print(json.dumps(out))
""")


@functools.lru_cache(maxsize=1)
def _run():
    res = subprocess.run([sys.executable, "-c", _SCRIPT.format(root=str(ROOT))], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def _kernels(recs):
    return [r[0] for r in recs if not r[0].startswith(("filter copy", "cupy/cublas"))]


def _tail(rec):
    """(szn, szc, szh, szw, alpha2, coef) packed after the plain kernel's arguments, and the z pointer slot."""
    raw = bytes.fromhex(rec[2])
    return struct.unpack("@4i2f", raw[-24:]), struct.unpack("@Q", raw[48:56])[0]


@pytest.mark.parametrize("name, act, vec", [("nchw", 2, False), ("nchw-noz-nobias", 1, False),
                                            ("nchw-elu", 6, False), ("nhwc", 2, True), ("bf16", 4, False),
                                            ("groups", 2, False), ("y-is-z", 2, False)])
def test_one_fused_launch_holding_the_plain_launch(name, act, vec):
    r = _run()[name]
    assert r["reason"] is None
    fused, plain = r["fused0"], r["plain"]
    # the settled call launches the same (array pointers apart: y is a fresh array each call)
    assert [(x[0], x[1], x[2][128:]) for x in r["fused1"]] == [(x[0], x[1], x[2][128:]) for x in fused]
    assert len(fused) == len(plain)                               # the plain forward's copies, no more
    f, p = [x for x in fused if x[0].startswith("conv_igemm")], [x for x in plain if x[0].startswith("conv_igemm")]
    assert len(f) == len(p) == 1
    assert f[0][0] == p[0][0][:-1] + f", '-DEPI=1', '-DACT={act}')"
    assert ("-DVEC=1" in f[0][0]) == vec
    assert f[0][1] == p[0][1]                                     # the same grid and block
    fb, pb = bytes.fromhex(f[0][2]), bytes.fromhex(p[0][2])
    assert len(fb) == len(pb) + 16 + 24
    assert fb[64:64 + len(pb) - 48 - 8] == pb[48:-8]              # geometry, strides, splits, alpha as plain
    (szn, szc, szh, szw, alpha2, coef), zptr = _tail(f[0])
    beta = struct.unpack("@f", fb[60 + len(pb) - 48:64 + len(pb) - 48])[0]
    if name == "nchw-noz-nobias":
        assert zptr == 0 and beta == 0
    elif name == "y-is-z":                                        # z is y: read through beta, no z pointer
        assert zptr == 0 and beta == 0.25
    else:
        assert zptr != 0 and beta == 0 and alpha2 == 0.25
        assert [szn, szc, szh, szw] == r["z_strides"]
    if name == "nchw-elu":
        assert abs(coef - 0.7) < 1e-7
    assert len(r["composition"]) > len(fused)                     # conv + add(s) + activation


@pytest.mark.parametrize("name, words", [("depthwise", "DIRECT"), ("float64", "GEMM"), ("gelu", "GELU")])
def test_composition_where_the_rule_declines(name, words):
    r = _run()[name]
    assert words in r["reason"]
    assert not any("-DEPI=1" in k for k in _kernels(r["fused0"]))
    assert len(r["fused0"]) == len(r["composition"])


def test_fresh_y_is_contiguous_in_the_callers_format():
    r = _run()
    assert r["nchw"]["y"] == [[8, 24, 12, 12], [24 * 144 * 4, 144 * 4, 12 * 4, 4]]
    assert r["nhwc"]["y"] == [[8, 12, 12, 24], [144 * 24 * 4, 12 * 24 * 4, 24 * 4, 4]]

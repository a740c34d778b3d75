"""The batch-norm fusions' GPU path (statistics: STATS=1; batch-norm-apply prologue: PRO=1), checked without a GPU:
the rule (which prologue activations the kernel computes, why others run the composition) and the launches under
tools/record_launches.py's fake CuPy (NumPy arrays, launches recorded, never run; in a subprocess): ONE
implicit-GEMM launch per call holding the plain forward's grid and packed arguments, the option flags, the array
slots in the kernel's order (z, bias, scale, shift, sum, sumsq), the statistics' partial buffer and tickets
pointers set, and the composition where the rule declines.  The bits on a GPU: test_conv_epilogue_bn_cuda.py."""
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


@pytest.mark.parametrize("pro", ["IDENTITY", "RELU"])
def test_rule_takes_identity_and_relu_prologues(pro):
    assert E.supports("IMPLICIT_GEMM", _problem((8, 16, 12, 12), (24, 16, 3, 3)), "IDENTITY", pro) is None


def test_rule_declines_other_prologues():
    why = E.supports("IMPLICIT_GEMM", _problem((8, 16, 12, 12), (24, 16, 3, 3)), "RELU", "SIGMOID")
    assert "prologue activation SIGMOID" in why


def test_options_only_when_asked():
    plain = K.igemm_options(0, "float32", True, "64x64", True, act=2)[0]
    both = K.igemm_options(0, "float32", True, "64x64", True, act=2, pro=2, stats=True)[0]
    assert both == plain + ("-DPRO=1", "-DPACT=2", "-DSTATS=1")
    assert K.igemm_options(0, "float32", True, "64x64", True, act=2, pro=1)[0] == plain + ("-DPRO=1", "-DPACT=1")


_SCRIPT = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {root!r} + "/tools")
    import record_launches as R
    fakecp, L = R._install({root!r})
    import numpy as np
    import ml_dtypes
    fakecp.pad = lambda *a, **k: fakecp.asarray(np.pad(*a, **k))
    recs = R.record_packed(L, [])           # every launch: kernel, grid, packed argument bytes
    import minidnn.backend as B
    from minidnn.backend.cuda import conv_epilogue as E
    out = {{}}
    def nhwc(a):
        return fakecp.asarray(np.ascontiguousarray(np.moveaxis(np.asarray(a), 1, -1)))
    cases = {{
        # name: (x, w, pad, groups, dtype, format, prologue mode or None, stats?, algo)
        "stats-nchw": ((8, 16, 12, 12), (24, 16, 3, 3), 1, 1, np.float32, "NCHW", None, True, None),
        "stats-nhwc": ((8, 16, 12, 12), (24, 16, 3, 3), 1, 1, np.float32, "NHWC", None, True, None),
        "pro-nchw": ((8, 16, 12, 12), (24, 16, 3, 3), 1, 1, np.float32, "NCHW", "relu", False, "IMPLICIT_GEMM"),
        "pro-precomp": ((8, 16, 12, 12), (24, 16, 3, 3), 1, 1, np.float32, "NCHW", "relu", False,
                        "IMPLICIT_PRECOMP_GEMM"),
        "pro-nhwc-stats": ((8, 16, 12, 12), (24, 16, 3, 3), 1, 1, np.float32, "NHWC", "identity", True, None),
        "pro-bf16-groups": ((4, 32, 10, 10), (32, 16, 3, 3), 1, 2, ml_dtypes.bfloat16, "NCHW", "relu", True, None),
        "pro-depthwise": ((8, 16, 12, 12), (16, 1, 3, 3), 1, 16, np.float32, "NCHW", "relu", True, None),
        "pro-sigmoid": ((8, 16, 12, 12), (24, 16, 3, 3), 1, 1, np.float32, "NCHW", "sigmoid", False, None),
    }}
    rng = np.random.default_rng(0)
    for name, (xs, ws, pad, groups, dt, fmt, pmode, with_stats, algo) in cases.items():
        desc = B.ConvolutionDescriptor(pad, 1, 1, groups)
        x = fakecp.asarray(rng.standard_normal(xs).astype(dt))
        w = fakecp.asarray(rng.standard_normal(ws).astype(dt))
        if fmt == "NHWC":
            x = nhwc(x)
        C, Kc = xs[1], ws[0]
        ys = B.get_convolution_forward_output_dim(desc, x.shape, w.shape, format=fmt)
        z = fakecp.asarray(rng.standard_normal(ys).astype(dt))
        b = fakecp.asarray(rng.standard_normal(Kc).astype(dt))
        sc = fakecp.asarray(rng.standard_normal(C).astype(np.float32))
        sh = fakecp.asarray(rng.standard_normal(C).astype(np.float32))
        act = B.ActivationDescriptor("relu")
        algo_e = None if algo is None else getattr(B.ConvolutionFwdAlgo, algo)
        res = {{}}
        def call():
            st = (fakecp.zeros(Kc, np.float32), fakecp.zeros(Kc, np.float32)) if with_stats else None
            if pmode is None:
                B.convolution_bias_activation_forward(None, x, w, desc, algo_e, z, 0.5, 0.25, b, act, format=fmt,
                                                      stats=st)
                why = B.fused_reason(None, x, w, desc, algo_e, z, 0.5, 0.25, b, act, format=fmt, stats=st)
            else:
                pd = B.ActivationDescriptor(pmode)
                B.scale_bias_activation_convolution_forward(None, x, sc, sh, pd, w, desc, algo_e, format=fmt, z=z,
                                                            alpha1=0.5, alpha2=0.25, bias=b, activation_desc=act,
                                                            stats=st)
                why = B.scale_bias_activation_convolution_reason(None, x, sc, sh, pd, w, desc, algo_e, format=fmt,
                                                                 z=z, alpha1=0.5, alpha2=0.25, bias=b,
                                                                 activation_desc=act, stats=st)
            return why, st
        for rep in range(2):
            del recs[:]
            why, st = call()
            res["fused%d" % rep] = list(recs)
            if rep == 0:
                res["stats_ptrs"] = None if st is None else [a.data.ptr for a in st]
        res["reason"] = why
        del recs[:]
        B.convolution_forward(None, x, w, desc, algo=algo_e, format=fmt)
        res["plain"] = list(recs)
        E.ENABLED[0] = False
        del recs[:]
        call()
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


@pytest.mark.parametrize("name, flags, vec", [
    ("stats-nchw", ", '-DSTATS=1')", False),
    ("stats-nhwc", ", '-DSTATS=1')", True),
    ("pro-nchw", ", '-DPRO=1', '-DPACT=2')", False),
    ("pro-precomp", ", '-DPRO=1', '-DPACT=2')", False),
    ("pro-nhwc-stats", ", '-DPRO=1', '-DPACT=1', '-DSTATS=1')", True),
    ("pro-bf16-groups", ", '-DPRO=1', '-DPACT=2', '-DSTATS=1')", False),
])
def test_one_fused_launch_holding_the_plain_launch(name, flags, vec):
    r = _run()[name]
    assert r["reason"] is None
    fused, plain = r["fused0"], r["plain"]
    assert [(x[0], x[1]) for x in r["fused1"]] == [(x[0], x[1]) for x in fused]
    assert len(fused) == len(plain)                               # the plain forward's copies, no more
    f = [x for x in fused if x[0].startswith("conv_igemm")]
    p = [x for x in plain if x[0].startswith("conv_igemm")]
    assert len(f) == len(p) == 1
    assert f[0][0] == p[0][0][:-1] + ", '-DEPI=1', '-DACT=2'" + flags
    assert ("-DVEC=1" in f[0][0]) == vec
    assert f[0][1] == p[0][1]                                     # the same grid and block
    fb, pb = bytes.fromhex(f[0][2]), bytes.fromhex(p[0][2])
    pro, stats = "PRO" in flags, "STATS" in flags
    extra = 16 + 16 * pro + 16 * stats                            # z, bias (+ scale, shift) (+ sum, sumsq)
    assert len(fb) == len(pb) + extra + 24
    assert fb[48 + extra:48 + extra + len(pb) - 48 - 8] == pb[48:-8]    # geometry, strides, splits, alpha as plain
    ptrs = struct.unpack("@%dQ" % (6 + extra // 8), fb[:48 + extra])
    assert all(ptrs[i] != 0 for i in (0, 1, 2, 6, 7))              # x, w, y, z, bias
    assert (ptrs[3] != 0) == stats and (ptrs[5] != 0) == stats    # the statistics' partials and tickets
    if pro:
        assert ptrs[8] != 0 and ptrs[9] != 0 and ptrs[8] != ptrs[9]
    if stats:
        assert list(ptrs[-2:]) == r["stats_ptrs"]                 # sum, sumsq, in that order, last
    assert len(r["composition"]) > len(fused)


def test_precomp_table_only_for_the_precomp_algorithm():
    r = _run()
    f = [x for x in r["pro-precomp"]["fused0"] if x[0].startswith("conv_igemm")][0]
    g = [x for x in r["pro-nchw"]["fused0"] if x[0].startswith("conv_igemm")][0]
    table = lambda rec: struct.unpack("@Q", bytes.fromhex(rec[2])[32:40])[0]    # noqa: E731
    assert table(f) != 0 and table(g) == 0


@pytest.mark.parametrize("name, words", [("pro-depthwise", "DIRECT"), ("pro-sigmoid", "prologue activation SIGMOID")])
def test_composition_where_the_rule_declines(name, words):
    r = _run()[name]
    assert words in r["reason"]
    assert not any("-DEPI=1" in k[0] for k in r["fused0"])
    assert len(r["fused0"]) == len(r["composition"])


def test_the_prologue_table_carries_the_channel():
    """IMPLICIT_PRECOMP_GEMM's forward table: .w (column 3) is the channel the prologue reads (PRO=1)."""
    import numpy as np

    class _CP:
        asarray = staticmethod(np.asarray)

        class cuda:
            class runtime:
                getDevice = staticmethod(lambda: 0)
    p = _problem((2, 6, 9, 9), (4, 6, 3, 3), pad=1)
    g = K._geometry(p)
    K._tables.clear()
    tab = K._tap_table(_CP, 0, p, g, (486, 81, 9, 1), (324, 81, 9, 1))
    K._tables.clear()
    k = np.arange(6 * 9)
    assert np.array_equal(tab[:, 3], k // 9)
    assert np.array_equal(tab[:, 0], (k // 9) * 81 + (k % 9 // 3) * 9 + (k % 3))

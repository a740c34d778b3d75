"""The fused convolution primitives' validated-signature shortcut (conv_fused._SEEN), checked without a GPU under
tools/record_launches.py's fake CuPy (NumPy arrays; launches recorded with their packed argument bytes, pointers
included; in a subprocess):

* a remembered call makes the same launches, byte for byte (same kernels, grids, arguments, pointers), as the
  same call made fresh (the table cleared), for the statistics epilogue, the bn-apply prologue, NCHW and NHWC, with
  and without y given; where the composition runs (switch off), the same y bits;
* after a call was remembered, every bad call that differs from it in one thing still raises (shape, dtype,
  alpha's type or value, descriptors, the stats container, the statistics overlapping an input, y or each other);
  a y overlapping an input still runs the composition; the conv_epilogue switch and the handle's settings key it.
The bits on a GPU: test_conv_epilogue_bn_cuda.py::test_remembered_call_bitwise_equal_to_a_fresh_one."""
import functools
import json
import pathlib
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

_SCRIPT = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {root!r} + "/tools")
    import record_launches as R
    fakecp, L = R._install({root!r})
    import numpy as np
    fakecp.maximum = lambda a, b: fakecp.asarray(np.maximum(np.asarray(a), b))    # the composition's references
    fakecp.pad = lambda *a, **k: fakecp.asarray(np.pad(*a, **k))
    recs = R.record_packed(L, [])           # every launch: kernel, grid, packed argument bytes
    import minidnn.backend as B
    from minidnn.backend import conv_fused as CF
    from minidnn.backend.cuda import conv_epilogue as E
    from minidnn.backend.errors import BadParamError
    rng = np.random.default_rng(0)
    relu, ident = B.ActivationDescriptor("relu"), B.ActivationDescriptor("identity")
    out = {{"same": {{}}, "raises": {{}}, "composition": {{}}}}

    def arrays(fmt, dt=np.float32):
        x = rng.standard_normal((4, 16, 10, 10)).astype(dt)
        if fmt == "NHWC":
            x = np.ascontiguousarray(np.moveaxis(x, 1, -1))
        w = rng.standard_normal((24, 16, 3, 3)).astype(dt)
        ys = (4, 24, 10, 10) if fmt == "NCHW" else (4, 10, 10, 24)
        return dict(x=fakecp.asarray(x), w=fakecp.asarray(w), z=fakecp.asarray(rng.standard_normal(ys).astype(dt)),
                    b=fakecp.asarray(rng.standard_normal(24).astype(dt)),
                    sc=fakecp.asarray(rng.standard_normal(16).astype(np.float32)),
                    sh=fakecp.asarray(rng.standard_normal(16).astype(np.float32)),
                    y=fakecp.asarray(np.zeros(ys, dt)),
                    st=(fakecp.zeros(24, np.float32), fakecp.zeros(24, np.float32)))

    desc = B.ConvolutionDescriptor(1)
    h = B.Handle("cuda")

    def stats_call(a, fmt, **kw):
        args = dict(handle=h, x=a["x"], w=a["w"], conv_desc=desc, algo=None, z=a["z"], alpha1=0.5, alpha2=0.25,
                    bias=a["b"], activation_desc=relu, y=a["y"], format=fmt, stats=a["st"])
        args.update(kw)
        return B.convolution_bias_activation_forward(**args)

    def pro_call(a, fmt, **kw):
        args = dict(handle=h, x=a["x"], scale=a["sc"], shift=a["sh"], prologue_desc=relu, w=a["w"], conv_desc=desc,
                    algo=None, y=a["y"], format=fmt, z=a["z"], alpha1=0.5, alpha2=0.25, bias=a["b"],
                    activation_desc=relu, stats=a["st"])
        args.update(kw)
        return B.scale_bias_activation_convolution_forward(**args)

    def launches(fn):
        del recs[:]
        fn()
        return list(recs)

    for fmt in ("NCHW", "NHWC"):
        a = arrays(fmt)
        for form, call in (("stats", stats_call), ("pro", pro_call)):
            for with_y in (True, False):
                kw = {{}} if with_y else {{"y": None}}
                CF._SEEN.clear()
                fresh = launches(lambda: call(a, fmt, **kw))
                n_seen = len(CF._SEEN)
                again = launches(lambda: call(a, fmt, **kw))
                if not with_y:              # a fresh y each call: compare all but the y pointer (slot 2)
                    fresh = [[k, g, b[:32] + b[48:]] for k, g, b in fresh]
                    again = [[k, g, b[:32] + b[48:]] for k, g, b in again]
                out["same"][f"{{form}}-{{fmt}}-y{{int(with_y)}}"] = [fresh == again, n_seen,
                                                                  any("-DEPI=1" in r[0] for r in again)]
            # the composition where the rule declines (the GEMM algorithm): remembered, the same launches (kernels
            # and grids: the fake runs none of them, so the composition's values are the GPU test's)
            CF._SEEN.clear()
            gemm = B.ConvolutionFwdAlgo.GEMM
            fresh = launches(lambda: call(a, fmt, y=None, algo=gemm))
            again = launches(lambda: call(a, fmt, y=None, algo=gemm))
            out["composition"][f"{{form}}-{{fmt}}"] = [[r[:2] for r in fresh] == [r[:2] for r in again],
                                                       len(CF._SEEN), any("-DEPI=1" in r[0] for r in again)]

    # every bad call after a remembered good one still raises
    fmt = "NCHW"
    a = arrays(fmt)
    x, w, z, b, sc, sh, y, st = (a[k] for k in ("x", "w", "z", "b", "sc", "sh", "y", "st"))
    bad = {{
        "z shape": dict(z=fakecp.asarray(np.zeros((4, 24, 10, 9), np.float32))),
        "bias dtype": dict(bias=fakecp.asarray(np.zeros(24, np.float64))),
        "bias shape": dict(bias=fakecp.asarray(np.zeros(23, np.float32))),
        "y shape": dict(y=fakecp.asarray(np.zeros((4, 24, 10, 11), np.float32))),
        "y dtype": dict(y=fakecp.asarray(np.zeros((4, 24, 10, 10), np.float64))),
        "alpha1 nan": dict(alpha1=float("nan")),
        "alpha1 bool": dict(alpha1=True),
        "alpha2 inf": dict(alpha2=float("inf")),
        "activation not a descriptor": dict(activation_desc="relu"),
        "w channels": dict(w=fakecp.asarray(np.zeros((24, 8, 3, 3), np.float32))),
        "x dtype": dict(x=fakecp.asarray(np.zeros((4, 16, 10, 10), np.float64))),
        "stats list of three": dict(stats=[st[0], st[1], st[0]]),
        "stats same array": dict(stats=(st[0], st[0])),
        "sum dtype": dict(stats=(fakecp.zeros(24, np.float64), st[1])),
        "sum shape": dict(stats=(fakecp.zeros(23, np.float32), st[1])),
        "sum is y": dict(stats=(y.reshape(-1)[:24], st[1])),
        "sumsq overlaps bias": dict(stats=(st[0], b)),
        "sum overlaps x": dict(stats=(x.reshape(-1)[:24], st[1])),
        "scale shape": dict(scale=fakecp.asarray(np.zeros(15, np.float32))),
        "shift dtype": dict(shift=fakecp.asarray(np.zeros(16, np.float64))),
        "prologue not a descriptor": dict(prologue_desc=None),
        "handle on the cpu": dict(handle=B.Handle("cpu")),
        "format": dict(format="NCDHW_"),
    }}
    both = np.zeros(48, np.float32)
    pair = fakecp.asarray(both)
    bad["sum overlaps sumsq"] = dict(stats=(pair[:24], pair[12:36]))
    for name, kw in bad.items():
        for form, call in (("stats", stats_call), ("pro", pro_call)):
            if form == "stats" and name.split()[0] in ("scale", "shift", "prologue"):
                continue
            CF._SEEN.clear()
            call(a, fmt)
            call(a, fmt)                          # remembered
            assert len(CF._SEEN) == 1
            try:
                call(a, fmt, **kw)
                got = "no error"
            except BadParamError as e:
                got = "BadParamError: " + str(e)
            except Exception as e:
                got = type(e).__name__ + ": " + str(e)
            out["raises"][f"{{form}}: {{name}}"] = got
    # y overlapping an input after a remembered call of the same signature: the composition (no EPI launch), as on
    # a fresh call; y that IS z: the kernel's in-place residual, the same launches as fresh
    zy = a["y"]
    CF._SEEN.clear()
    fresh = launches(lambda: stats_call(a, fmt, z=zy))
    again = launches(lambda: stats_call(a, fmt, z=zy))
    out["y is z"] = [fresh == again, any("-DEPI=1" in r[0] for r in again), len(CF._SEEN)]
    n = 4 * 24 * 100

    def views(buf):
        return buf[:n].reshape(4, 24, 10, 10), buf[16 * 100:16 * 100 + n].reshape(4, 24, 10, 10)[:, :16]
    y_safe, x_safe = views(fakecp.asarray(np.zeros(n + 1600, np.float32)))
    x_safe = views(fakecp.asarray(np.zeros(n + 1600, np.float32)))[1]
    y_over, x_over = views(fakecp.asarray(np.zeros(n + 1600, np.float32)))
    CF._SEEN.clear()
    safe = launches(lambda: stats_call(a, fmt, y=y_safe, x=x_safe, z=None))
    over = launches(lambda: stats_call(a, fmt, y=y_over, x=x_over, z=None))
    CF._SEEN.clear()
    over_fresh = launches(lambda: stats_call(a, fmt, y=y_over, x=x_over, z=None))
    out["y overlaps x"] = [any("-DEPI=1" in r[0] for r in safe), any("-DEPI=1" in r[0] for r in over),
                           [r[:2] for r in over] == [r[:2] for r in over_fresh], len(CF._SEEN)]
    # the switch and the handle's settings are part of the signature
    CF._SEEN.clear()
    stats_call(a, fmt, y=None)
    E.ENABLED[0] = False
    comp = launches(lambda: stats_call(a, fmt, y=None))
    E.ENABLED[0] = True
    out["switch"] = [any("-DEPI=1" in r[0] for r in comp), len(CF._SEEN)]
    h.math_type = B.MathType.TENSOR_OP
    tf = launches(lambda: stats_call(a, fmt, y=None))
    h.math_type = B.MathType.DEFAULT
    out["math"] = [any("-DMATH=1" in r[0] for r in tf if "-DEPI=1" in r[0]), len(CF._SEEN)]
    print(json.dumps(out))
""")


@functools.lru_cache(maxsize=1)
def _run():
    res = subprocess.run([sys.executable, "-c", _SCRIPT.format(root=str(ROOT))], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", [f"{f}-{m}-y{y}" for f in ("stats", "pro") for m in ("NCHW", "NHWC")
                                  for y in (1, 0)])
def test_remembered_call_launches_what_a_fresh_call_launches(case):
    same, n_seen, fused = _run()["same"][case]
    assert n_seen == 1                      # the fresh call was remembered ...
    assert fused                            # ... the fused kernel ran ...
    assert same                             # ... and the remembered call's launches are byte for byte the same


@pytest.mark.parametrize("case", [f"{f}-{m}" for f in ("stats", "pro") for m in ("NCHW", "NHWC")])
def test_remembered_composition_same_launches(case):
    same, n_seen, fused = _run()["composition"][case]
    assert n_seen == 1 and not fused and same


def test_every_bad_call_still_raises_after_a_remembered_one():
    raised = _run()["raises"]
    assert len(raised) >= 40
    wrong = {k: v for k, v in raised.items() if not v.startswith(("BadParamError", "DeviceMismatchError"))}
    assert not wrong, wrong
    assert "overlaps" in raised["stats: sum overlaps x"] and "overlaps" in raised["pro: sumsq overlaps bias"]
    assert "must be distinct" in raised["stats: sum overlaps sumsq"]


def test_y_overlapping_an_input_still_runs_the_composition():
    r = _run()
    assert r["y is z"] == [True, True, 1]                  # the in-place residual: fused, as fresh
    safe, over, same_as_fresh, n_seen = r["y overlaps x"]
    assert safe and not over and same_as_fresh             # the remembered signature, overlapping: composition


def test_switch_and_handle_settings_are_in_the_signature():
    r = _run()
    assert r["switch"] == [False, 2]
    assert r["math"] == [True, 3]

"""A convolution's backward stages dy once (backend.convolution_shared_staging), on the CPU: the GPU path run under
tools/record_launches.py's fake CuPy (NumPy arrays, launches recorded, never run) in a subprocess, so the fake never
meets this test session's modules.  What is checked: ConvForward's first-order backward makes ONE NHWC copy of dy
for backward data and backward filter where two separate calls make two, and every other launch -- kernel, options,
grid, block, packed arguments -- is the same; the scope is gone after the backward; primitive calls outside a scope
stage as before; a settled call (conv_igemm._calls) replays the decisions of the first.  The bits on a GPU:
test_conv_staging_once_cuda.py."""
import functools
import json
import pathlib
import subprocess
import sys
import textwrap

ROOT = pathlib.Path(__file__).resolve().parents[2]

_SCRIPT = textwrap.dedent("""
    import json, sys, types
    sys.path.insert(0, {root!r} + "/tools")
    import record_launches as R
    fakecp, L = R._install({root!r})
    recs = []
    def go(fn, dims, stream, params_ptr):
        recs.append([str(fn), list(dims)])
    L._go = go
    L.count_launches = lambda n=1: recs.extend([["cupy/cublas", []]] * n)
    import numpy as np
    import minidnn.backend as B
    from minidnn.backend.cuda import conv_igemm as K
    from minidnn.nn import functional as F
    from minidnn.nn._functions import conv as C
    from minidnn.tensor import Tensor
    C.CARRY_FILTER[0] = False       # the forward's filter copy carried to backward data: test_conv_filter_carry.py
    C.CARRY_X[0] = False            # the forward's x copy carried to backward filter: test_conv_filter_carry.py
    out = {{}}
    xs, ws = (128, 16, 32, 32), (16, 16, 3, 3)          # a ResNet-20 stage-1 layer: staged (>= 2^25 MACs)
    desc = B.ConvolutionDescriptor((1, 1))
    xa, wa, gya = fakecp.zeros(xs), fakecp.zeros(ws), fakecp.zeros(xs)
    for rep in range(2):                                # the second time: the settled calls
        # the nn path: ConvForward.backward at first order
        x, w = Tensor._from_array(xa), Tensor._from_array(wa)
        x.requires_grad = w.requires_grad = True
        y = F.conv2d(x, w, padding=1)
        del recs[:]
        y.backward(Tensor._from_array(gya))
        out["nn%d" % rep] = list(recs)
        out["scope_after%d" % rep] = K._scope.memo is None
        # the same two primitives, called apart (no scope): each stages dy itself
        del recs[:]
        B.convolution_backward_data(None, wa, gya, desc, xs)
        B.convolution_backward_filter(None, xa, gya, desc, ws)
        out["apart%d" % rep] = list(recs)
        # and inside a scope by hand
        del recs[:]
        with B.convolution_shared_staging():
            B.convolution_backward_data(None, wa, gya, desc, xs)
            B.convolution_backward_filter(None, xa, gya, desc, ws)
        out["scoped%d" % rep] = list(recs)
    # a small problem is not staged: the scope changes nothing
    small = (2, 16, 8, 8)
    sa, sg = fakecp.zeros(small), fakecp.zeros(small)
    for name in ("small_apart", "small_scoped"):
        del recs[:]
        if name == "small_scoped":
            with B.convolution_shared_staging():
                B.convolution_backward_data(None, wa, sg, desc, small)
                B.convolution_backward_filter(None, sa, sg, desc, ws)
        else:
            B.convolution_backward_data(None, wa, sg, desc, small)
            B.convolution_backward_filter(None, sa, sg, desc, ws)
        out[name] = list(recs)
    out["calls"] = len(K._calls)
    print(json.dumps(out))
""")


@functools.lru_cache(maxsize=1)
def _run():
    script = _SCRIPT.format(root=str(ROOT))
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def _names(recs):
    return [r[0].split("(")[0] for r in recs]


def test_backward_stages_dy_once_and_launches_are_otherwise_unchanged():
    out = _run()
    for rep in (0, 1):
        nn, apart, scoped = out[f"nn{rep}"], out[f"apart{rep}"], out[f"scoped{rep}"]
        # apart: dgrad = [copy of dy, filter copy, kernel], wgrad = [copy of x, copy of dy, kernel]
        assert _names(apart) == ["nchw_to_nhwc", "nchw_to_nhwc", "conv_igemm", "nchw_to_nhwc", "nchw_to_nhwc",
                                 "conv_igemm"], apart
        # the nn backward and a hand-made scope: the same launches less wgrad's second copy of dy
        expected = apart[:4] + apart[5:]
        assert nn == expected, (nn, expected)
        assert scoped == expected
        assert out[f"scope_after{rep}"]          # no copies kept after the backward
    assert out["nn0"] == out["nn1"]              # the settled call replays the first call's launches


def test_unstaged_problems_are_untouched():
    out = _run()
    assert out["small_apart"] == out["small_scoped"]
    assert "nchw_to_nhwc" not in _names(out["small_apart"])

"""Channels-last host time (docs/host_overhead.md round 22), on the CPU.

``SettledConvolution.first`` is a settled NHWC convolution called on the activations' channels-first views (what nn's
channels-last tensors hold) instead of their NHWC views: checked under tools/record_launches.py's fake CuPy (NumPy
arrays, launches recorded and never run) in a subprocess, for forward, backward data and backward filter of
channels-last problems through each route (implicit GEMM plain and precomputed, the stem's few channels, stride 2,
depthwise through the direct kernels, conv1d's NWC), float32 and bfloat16: the same launches (kernel, options, grid,
block, packed arguments) as ``run`` on the NHWC views, a result of the same shape, strides and dtype as run's result
seen channels-first.  Backward data into a channels-last destination (a gradient destination, beta 1 or 0): the
destination itself comes back, with the launch of the fresh call but for beta; a destination of another layout or
dtype is not used (the fresh call's launch and a fresh array).  The bits on a GPU: test_conv_cl_first_cuda.py.

Also: act_kernels' channels-last test by strides equals its transposed view's contiguity flag over every small layout.
"""
import itertools
import json
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from minidnn.backend.cuda.act_kernels import _memory_order

ROOT = pathlib.Path(__file__).resolve().parents[2]

_SCRIPT = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {root!r} + "/tools")
    import record_launches as R
    fakecp, L = R._install({root!r})
    R._zero_pointers(fakecp, L)
    recs = R.record_packed(L, [], other="cupy")
    from minidnn.backend.cuda import cublas as CB      # a cuBLASLt product (1x1 layers) records its alpha, beta
    _lt_run = CB._LtCall.run
    def lt_run(self, *a):
        recs.append(["cublasLt", [], np.float32(self.alpha.value).tobytes().hex()
                     + np.float32(self.beta.value).tobytes().hex()])
        return _lt_run(self, *a)
    CB._LtCall.run = lt_run
    import numpy as np
    R.numpy_fallback(fakecp)
    import minidnn as mdn
    import minidnn.backend as B
    from minidnn.backend import convolution as CV
    from minidnn.backend.layout import to_channels_first, from_channels_first, TensorFormat

    rng = np.random.default_rng(0)

    def cl(shape, dtype):            # an (N, C, H, W)-indexed array in channels-last memory (nn's channels-last data)
        n, c, *sp = shape
        a = fakecp.empty((n, *sp, c), dtype=dtype)
        np.asarray(a)[...] = rng.standard_normal(a.shape).astype(dtype)
        return a.transpose(0, len(shape) - 1, *range(1, len(shape) - 1))

    def dense(shape, dtype):
        a = fakecp.empty(shape, dtype=dtype)
        np.asarray(a)[...] = rng.standard_normal(shape).astype(dtype)
        return a

    def last(a):
        return a.transpose(0, *range(2, a.ndim), 1)

    def meta(a):
        return [list(a.shape), list(a.strides), str(a.dtype)]

    def rec(f):
        del recs[:]
        r = f()
        return r, [list(x) for x in recs]

    # name: x shape, w shape, stride, padding, groups, dtype, weight channels-last
    cases = {{
        "s1": ((8, 16, 16, 16), (16, 16, 3, 3), 1, 1, 1, "float32", False),
        "s2": ((8, 16, 16, 16), (32, 16, 3, 3), 2, 1, 1, "float32", False),
        "1x1": ((8, 32, 8, 8), (64, 32, 1, 1), 1, 0, 1, "float32", False),
        "stem": ((8, 3, 16, 16), (16, 3, 3, 3), 1, 1, 1, "float32", True),
        "dw": ((8, 64, 8, 8), (64, 1, 3, 3), 1, 1, 64, "float32", False),
        "dw_s2": ((8, 64, 8, 8), (64, 1, 3, 3), 2, 1, 64, "float32", False),
        "bf16": ((8, 16, 16, 16), (16, 16, 3, 3), 1, 1, 1, "bfloat16", False),
        "bf16_s2": ((8, 16, 16, 16), (32, 16, 3, 3), 2, 1, 1, "bfloat16", True),
        "conv1d": ((8, 32, 64), (32, 32, 3), 1, 1, 1, "float32", False),
    }}
    h = B.handle.configured_default_handle(fakecp.empty((1,)))     # the GPU default handle
    out = {{}}
    for name, (xs, ws, st, pad, g, dt, wcl) in cases.items():
        if dt == "bfloat16":
            import ml_dtypes
            dt = ml_dtypes.bfloat16
        desc = B.ConvolutionDescriptor(pad, st, 1, g)
        x = cl(xs, dt)
        w = cl(ws, dt) if wcl else dense(ws, dt)
        ys = B.get_convolution_forward_output_dim(desc, xs, ws)
        dy = cl(ys, dt)
        res = {{}}
        for d, (a1, a2, other) in enumerate(((x, w, None), (w, dy, tuple(xs)), (x, dy, tuple(ws)))):
            nh1 = a1 if d == 1 else last(a1)
            nh2 = a2 if d == 0 else last(a2)
            oth = other if d != 1 else tuple(other[i] for i in (0, *range(2, len(other)), 1))
            s = CV.settle_convolution(d, h, nh1, nh2, desc, oth, "NHWC")
            s.run(nh1, nh2); s.first(a1, a2)            # compiles, plans, settles the kernels' calls
            r_run, l_run = rec(lambda: s.run(nh1, nh2))
            r_first, l_first = rec(lambda: s.first(a1, a2))
            seen = meta(r_run if d == 2 else to_channels_first(r_run, TensorFormat.NHWC))
            entry = {{"run": seen, "first": meta(r_first), "same_launches": l_run == l_first, "n": len(l_first),
                      "keep": bool(s.keep)}}
            if d == 1:
                fresh = r_first
                into = cl(tuple(xs), dt)
                for beta in (1.0, 0.0):
                    r, l = rec(lambda: s.first(a1, a2, None, into, beta))
                    diff = []
                    if len(l) == len(l_first):
                        for u, v in zip(l, l_first):
                            if u != v:
                                diff.append([u[0] == v[0], u[1] == v[1], len(u[2]) == len(v[2]),
                                             [i for i in range(0, len(u[2]), 8) if u[2][i:i + 8] != v[2][i:i + 8]],
                                             u[2][-8:]])
                    entry["into_%g" % beta] = [r is into, len(l) == len(l_first), diff]
                    nh_into = last(into)
                    r2 = s.run(nh1, nh2, None, nh_into, beta)
                    entry["run_into_%g" % beta] = r2 is nh_into
                for bad, arr in (("nchw", dense(tuple(xs), dt)), ("dtype", cl(tuple(xs), np.float64)),
                                 ("sliced", cl((xs[0] * 2,) + tuple(xs[1:]), dt)[::2])):
                    r, l = rec(lambda: s.first(a1, a2, None, arr, 1.0))
                    entry["bad_" + bad] = [r is arr, l == l_first, meta(r) == meta(fresh)]
            res[d] = entry
        out[name] = res
    # an NCHW settled call: first is run
    x = dense((8, 16, 16, 16), "float32"); w = dense((16, 16, 3, 3), "float32")
    desc = B.ConvolutionDescriptor(1, 1, 1, 1)
    s = CV.settle_convolution(0, h, x, w, desc)
    s.run(x, w)
    r_run, l_run = rec(lambda: s.run(x, w))
    r_first, l_first = rec(lambda: s.first(x, w))
    out["nchw"] = [meta(r_run) == meta(r_first), l_run == l_first, len(l_run)]
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def result():
    script = _SCRIPT.format(root=str(ROOT))
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


CASES = ["s1", "s2", "1x1", "stem", "dw", "dw_s2", "bf16", "bf16_s2", "conv1d"]


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("direction", ["0", "1", "2"])
def test_first_launches_and_returns_as_run_seen_channels_first(result, name, direction):
    e = result[name][direction]
    assert e["n"] >= 1 and e["same_launches"]
    assert e["first"] == e["run"]


@pytest.mark.parametrize("name", CASES)
def test_channels_last_routes_keep_the_allocated_result(result, name):
    # implicit GEMM's channels-last forward and backward data results are returned as allocated (no views made);
    # conv1d's NWC (3-D) and the filter gradient are not of that kind
    igemm_cl = name not in ("dw", "dw_s2", "conv1d")
    assert result[name]["0"]["keep"] == igemm_cl
    assert result[name]["1"]["keep"] == igemm_cl
    assert not result[name]["2"]["keep"]


@pytest.mark.parametrize("name", CASES)
def test_backward_data_into_a_channels_last_destination(result, name):
    e = result[name]["1"]
    if e["keep"]:
        used, same_count, diff = e["into_1"]
        assert used and same_count
        # only the beta argument (the last 4 packed bytes: float32 1.0) of the backward data kernel differs
        assert len(diff) == 1
        same_kernel, same_grid, same_size, words, tail = diff[0]
        assert same_kernel and same_grid and same_size and len(words) == 1 and tail == "0000803f"
        used0, same_count0, diff0 = e["into_0"]
        assert used0 and same_count0 and diff0 == []
        assert e["run_into_1"] and e["run_into_0"]
    else:       # routes that take no destination: a fresh result, the fresh call's launches
        assert not e["into_1"][0] and e["into_1"][2] == []
    for bad in ("nchw", "dtype", "sliced"):
        used, same, fresh_meta = e["bad_" + bad]
        assert not used and same and fresh_meta


def test_nchw_first_is_run(result):
    same_meta, same_launches, n = result["nchw"]
    assert same_meta and same_launches and n >= 1


def _transposed_test(a):
    if a.flags.c_contiguous:
        return "C"
    if a.ndim >= 3 and a.transpose((0, *range(2, a.ndim), 1)).flags.c_contiguous:
        return "CL"
    return None


def test_act_kernels_memory_order_by_strides_equals_the_transposed_views_flag():
    n = 0
    for nd in (1, 2, 3, 4, 5):
        for shape in itertools.product(*[(1, 2, 3)] * nd):
            for perm in itertools.permutations(range(nd)):
                a = np.zeros(tuple(shape[i] for i in perm), np.float32).transpose(np.argsort(perm))
                views = [a, a[..., ::2]] + ([a[:, :1], a[:, ::2]] if nd > 1 else [])
                for v in views:
                    assert _memory_order(v) == _transposed_test(v), (v.shape, v.strides)
                    n += 1
    assert n > 50000
    assert _memory_order(np.zeros((2, 3, 4, 5), np.float16).transpose(0, 2, 1, 3)) is None
    assert _memory_order(np.zeros((2, 4, 5, 3), np.float16).transpose(0, 3, 1, 2)) == "CL"

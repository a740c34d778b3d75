"""The atomic filter gradient (issue 9 item 1): backward-filter ALGO_3 runs the implicit-GEMM kernel with its split-K
sums added by fp32 atomics into a kept-zeroed accumulator (ATOMIC=1), so the registry reports it non-deterministic on
CUDA.  CPU part: a deterministic handle never selects it (heuristic, find, an explicit request), the default
heuristic still ranks the deterministic ALGO_0 first, find times it on a handle without ``deterministic``, and under
the fake CuPy (tools/record_launches.py) it is ONE launch of the ALGO_0 kernel's grid with -DATOMIC=1 added.  GPU part
(cuda-marked): against the float64 reference (fp32, TF32, bf16, fp16; split-K shapes, ragged, NHWC, alpha/beta with a
poisoned output), one launch per call, the accumulator and tickets left zeroed."""
import json
import math
import pathlib
import subprocess
import sys
import textwrap
import types

import numpy as np
import pytest

from minidnn.backend import algorithm_selection as AS
from minidnn.backend import devices as _dev
from minidnn.backend.algorithm_selection import Determinism
from minidnn.backend.conv_algorithms import BACKWARD_FILTER_ALGORITHMS as BF
from minidnn.backend.conv_algorithms import ConvolutionBwdFilterAlgo as FA
from minidnn.backend.conv_problem import make_problem
from minidnn.backend.convolution import ConvolutionDescriptor
from minidnn.backend.cuda import conv_igemm as K
from minidnn.backend.errors import NotSupportedError, Status
from minidnn.backend.handle import MathType

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _handle(deterministic):
    return types.SimpleNamespace(device=types.SimpleNamespace(type="cuda"), deterministic=deterministic,
                                 workspace_limit=None)


DENSE = [((32, 64, 56, 56), (64, 64, 3, 3), 1), ((128, 16, 32, 32), (16, 16, 3, 3), 1),
         ((2, 17, 11, 10), (33, 17, 3, 3), 1)]


def _p(x, w, pad, dtype="float32", groups=1):
    return make_problem("test", x, w, ConvolutionDescriptor(pad, 1, 1, groups), dtype)


def test_algo3_is_reported_non_deterministic_on_cuda():
    alg = BF.get(FA.ALGO_3)
    assert not alg.deterministic("cuda") and alg.devices == ("cuda",)
    assert all(a.deterministic("cuda") for a in BF if a.algo is not FA.ALGO_3)


@pytest.mark.parametrize("shape", DENSE, ids=["resnet18-64", "cifar-16", "ragged"])
def test_deterministic_handle_never_selects_it(shape):
    p = _p(*shape)
    ranked = BF.heuristic(p, _handle(True), MathType.DEFAULT)
    assert ranked[0].algo is FA.ALGO_0 and ranked[0].determinism is Determinism.DETERMINISTIC
    a3 = next(r for r in ranked if r.algo is FA.ALGO_3)
    assert a3.status is Status.NOT_SUPPORTED and "not deterministic" in a3.reason
    assert a3.determinism is Determinism.NON_DETERMINISTIC
    with pytest.raises(NotSupportedError, match="not deterministic"):
        BF.require(FA.ALGO_3, p, _handle(True))


@pytest.mark.parametrize("shape", DENSE, ids=["resnet18-64", "cifar-16", "ragged"])
def test_default_heuristic_stays_deterministic_and_reports_algo3(shape):
    """A default handle (deterministic=False): ALGO_0's deterministic kernel first, ALGO_3 usable right behind it
    (ATOMIC_COST_FACTOR), reported NON_DETERMINISTIC."""
    p = _p(*shape)
    ranked = BF.heuristic(p, _handle(False), MathType.DEFAULT)
    assert [r.algo for r in ranked[:2]] == [FA.ALGO_0, FA.ALGO_3]
    assert ranked[1].status is Status.SUCCESS and ranked[1].determinism is Determinism.NON_DETERMINISTIC
    assert ranked[0].determinism is Determinism.DETERMINISTIC


def test_find_times_it_only_without_deterministic(monkeypatch):
    p = _p(*DENSE[0])
    monkeypatch.setattr(AS, "time_call", lambda handle, fn, repeats=3: (fn(), 1.0)[1])
    for det in (False, True):
        ran = []
        perfs = BF.find(p, _handle(det), MathType.DEFAULT, lambda alg: ran.append(alg.algo))
        a3 = next(r for r in perfs if r.algo is FA.ALGO_3)
        assert a3.determinism is Determinism.NON_DETERMINISTIC
        assert (FA.ALGO_3 in ran) is (not det)
        assert (a3.status is Status.SUCCESS) is (not det)


def test_atomic_option_only_when_asked():
    plain = K.igemm_options(2, "float32", True, "64x64", True)[0]
    atomic = K.igemm_options(2, "float32", True, "64x64", True, atomic=True)[0]
    assert atomic == plain + ("-DATOMIC=1",) and not any("ATOMIC" in o for o in plain)


_SCRIPT = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {root!r} + "/tools")
    import record_launches as R
    fakecp, L = R._install({root!r})
    import numpy as np
    import ml_dtypes
    recs = []
    R.record_to(L, recs)
    import minidnn.backend as B
    from minidnn.backend.cuda import conv_igemm as K
    out = {{}}
    rng = np.random.default_rng(0)
    for name, xs, ws, dt, fmt in [("r18", (32, 64, 56, 56), (64, 64, 3, 3), np.float32, "NCHW"),
                                  ("cifar-nhwc", (128, 16, 32, 32), (16, 16, 3, 3), np.float32, "NHWC"),
                                  ("bf16", (4, 32, 12, 12), (48, 32, 3, 3), ml_dtypes.bfloat16, "NCHW"),
                                  ("one-split", (1, 16, 4, 4), (16, 16, 3, 3), np.float32, "NCHW")]:
        desc = B.ConvolutionDescriptor(1, 1, 1, 1)
        x = fakecp.asarray(rng.standard_normal(xs).astype(dt))
        ys = B.get_convolution_forward_output_dim(desc, x.shape, ws)
        dy = fakecp.asarray(rng.standard_normal(ys).astype(dt))
        if fmt == "NHWC":
            x = fakecp.asarray(np.ascontiguousarray(np.moveaxis(np.asarray(x), 1, -1)))
            dy = fakecp.asarray(np.ascontiguousarray(np.moveaxis(np.asarray(dy), 1, -1)))
        res = {{}}
        for algo in ("ALGO_0", "ALGO_3"):
            for rep in range(2):
                del recs[:]
                B.convolution_backward_filter(None, x, dy, desc, ws, algo=getattr(B.ConvolutionBwdFilterAlgo, algo),
                                              format=fmt)
                res[algo + str(rep)] = list(recs)
        res["acc_zero"] = all(float(abs(np.asarray(a)).max()) == 0 for a in K._accumulators.values())
        out[name] = res
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def fake_launches():
    r = subprocess.run([sys.executable, "-c", _SCRIPT.format(root=str(ROOT))], capture_output=True, text=True,
                       cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", ["r18", "cifar-nhwc", "bf16"])
def test_one_atomic_launch_on_algo0s_grid(fake_launches, case):
    res = fake_launches[case]
    det, atom = res["ALGO_00"], res["ALGO_30"]
    assert res["ALGO_31"] == atom and res["ALGO_01"] == det          # the remembered call launches the same
    kern = [r for r in atom if r[0].startswith("conv_igemm")]
    dkern = [r for r in det if r[0].startswith("conv_igemm")]
    assert len(kern) == 1 and "ATOMIC=1" in kern[0][0] and "DIR=2" in kern[0][0]
    assert len(dkern) == 1 and "ATOMIC" not in dkern[0][0]
    # (the deterministic kernel sums many splits in two levels, -DSK2=1, since session 7: otherwise the same options)
    assert kern[0][0].replace(" -DATOMIC=1", "").replace("'-DATOMIC=1', ", "").replace(", '-DATOMIC=1'", "") \
        == dkern[0][0].replace(", '-DSK2=1'", "")
    assert kern[0][1] == dkern[0][1]                                   # same grid: the same split-K
    assert [r for r in atom if r not in kern] == [r for r in det if r not in dkern]     # the same staging copies
    assert res["acc_zero"]


def test_one_split_runs_the_plain_kernel(fake_launches):
    res = fake_launches["one-split"]
    assert res["ALGO_30"] == res["ALGO_00"]


# ---- on a GPU -----------------------------------------------------------------------------------------------------

# (id, N, C, H, W, K, R, S, padding, stride, dilation, groups): every one has several splits
GPU_SHAPES = [
    ("resnet18-like", 8, 64, 28, 28, 64, 3, 3, 1, 1, 1, 1),
    ("cifar16", 32, 16, 32, 32, 16, 3, 3, 1, 1, 1, 1),
    ("ragged-stride2", 6, 17, 23, 21, 33, 3, 3, 1, 2, 1, 1),
    ("k70-dil2", 4, 40, 19, 17, 70, 3, 3, 2, 1, 2, 1),
    ("groups2-1x1", 8, 32, 20, 20, 48, 1, 1, 0, 1, 1, 2),
    ("wide-128x64", 4, 128, 14, 14, 256, 3, 3, 1, 1, 1, 1),
]


def _gpu():
    if not _dev.cuda_is_available():
        pytest.skip("no CUDA GPU with CuPy on this machine")
    import cupy
    return cupy


def _ref(p, desc, x, dy):
    from minidnn.backend import convolution_backward_filter
    from minidnn.backend.handle import Handle
    h = Handle("cpu")
    ref = convolution_backward_filter(h, x, dy, desc, p.w_shape, algo=FA.ALGO_1)
    ref_abs = convolution_backward_filter(h, np.abs(x), np.abs(dy), desc, p.w_shape, algo=FA.ALGO_1)
    return ref, ref_abs


@pytest.mark.cuda
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("mode", ["fp32", "tf32", "bf16", "fp16"])
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=[s[0] for s in GPU_SHAPES])
def test_atomic_filter_gradient_against_float64(shape, mode, layout):
    cp = _gpu()
    import ml_dtypes

    from minidnn.backend.cuda import launch as L
    _, N, C, H, W, Kc, R, S, pad, stride, dil, groups = shape
    desc = ConvolutionDescriptor(pad, stride, dil, groups)
    dt = {"fp32": "float32", "tf32": "float32", "bf16": "bfloat16", "fp16": "float16"}[mode]
    npdt = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}[dt]
    p = make_problem("test", (N, C, H, W), (Kc, C // groups, R, S), desc, dt)
    rng = np.random.default_rng(3)
    x = rng.standard_normal(p.x_shape).astype(npdt).astype(np.float64)      # the values the kernel sees
    dy = rng.standard_normal(p.y_shape).astype(npdt).astype(np.float64)
    ref, ref_abs = _ref(p, desc, x, dy)
    xg, dyg = cp.asarray(x.astype(npdt)), cp.asarray(dy.astype(npdt))
    if layout == "NHWC":
        xg = cp.ascontiguousarray(xg.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
        dyg = cp.ascontiguousarray(dyg.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    tf32 = mode == "tf32"
    u_in = 2.0 ** -11 if tf32 else 0.0
    u_out = {"float32": 2.0 ** -24, "bfloat16": 2.0 ** -8, "float16": 2.0 ** -11}[dt]
    kr = N * math.prod(p.out_size)
    w0 = rng.standard_normal(p.w_shape)
    for alpha, beta in ((1.0, 0.0), (0.5, 0.25)):
        out = cp.asarray(w0.astype(npdt)) if beta else cp.full(p.w_shape, np.nan, dtype=npdt)
        K.implicit_backward_filter(p, xg, dyg, tf32, True, alpha, beta, out, atomic=True)        # compile, plan
        det_out = cp.asarray(w0.astype(npdt)) if beta else cp.full(p.w_shape, np.nan, dtype=npdt)
        K.implicit_backward_filter(p, xg, dyg, tf32, True, alpha, beta, det_out, atomic=False)      # compile, plan
        before = L.launch_count()
        K.implicit_backward_filter(p, xg, dyg, tf32, True, alpha, beta, det_out, atomic=False)
        det_launches = L.launch_count() - before
        out = cp.asarray(w0.astype(npdt)) if beta else cp.full(p.w_shape, np.nan, dtype=npdt)
        before = L.launch_count()
        K.implicit_backward_filter(p, xg, dyg, tf32, True, alpha, beta, out, atomic=True)
        # one kernel launch, plus the NCHW staging copies the deterministic form makes too (x and dy, large problems)
        assert L.launch_count() - before == det_launches <= 3, det_launches
        old = w0.astype(npdt).astype(np.float64)
        want = alpha * ref + beta * old
        got = cp.asnumpy(out).astype(np.float64)
        assert not np.isnan(got).any()
        bound = 1.5 * ((2 * u_in + kr * 2.0 ** -23) * abs(alpha) * ref_abs + u_out * (abs(alpha) * ref_abs
                                                                                        + abs(beta * old))) + 1e-30
        err = np.abs(got - want)
        assert (err <= bound).all(), f"{shape[0]} {mode} {layout} a={alpha} b={beta}: max err {err.max()}"
    cp.cuda.runtime.deviceSynchronize()
    for acc in K._accumulators.values():
        assert float(cp.abs(acc).max()) == 0.0                                 # left zeroed for the next launch
    for t in K._ticket_arrays.values():
        assert int(t.max()) == 0


@pytest.mark.cuda
def test_algo3_through_the_primitive_and_deterministic_handle():
    cp = _gpu()
    from minidnn.backend import convolution_backward_filter, find_convolution_backward_filter_algorithm
    from minidnn.backend.handle import Handle
    _, N, C, H, W, Kc, R, S, pad, stride, dil, groups = GPU_SHAPES[0]
    desc = ConvolutionDescriptor(pad, stride, dil, groups)
    p = make_problem("test", (N, C, H, W), (Kc, C, R, S), desc, "float32")
    rng = np.random.default_rng(5)
    x, dy = rng.standard_normal(p.x_shape), rng.standard_normal(p.y_shape)
    xg, dyg = cp.asarray(x, np.float32), cp.asarray(dy, np.float32)
    ref, ref_abs = _ref(p, desc, x, dy)
    got = convolution_backward_filter(Handle("cuda"), xg, dyg, desc, p.w_shape, algo=FA.ALGO_3)
    assert (np.abs(cp.asnumpy(got) - ref) <= 1.5 * N * 784 * 2.0 ** -23 * ref_abs + 1e-6).all()
    with pytest.raises(NotSupportedError, match="not deterministic"):
        convolution_backward_filter(Handle("cuda", deterministic=True), xg, dyg, desc, p.w_shape, algo=FA.ALGO_3)
    perfs = find_convolution_backward_filter_algorithm(Handle("cuda"), xg, dyg, desc, p.w_shape)
    a3 = next(r for r in perfs if r.algo is FA.ALGO_3)
    assert a3.status is Status.SUCCESS and a3.determinism is Determinism.NON_DETERMINISTIC
    perfs = find_convolution_backward_filter_algorithm(Handle("cuda", deterministic=True), xg, dyg, desc, p.w_shape)
    assert next(r for r in perfs if r.algo is FA.ALGO_3).status is Status.NOT_SUPPORTED
    # the deterministic handle's heuristic choice stays bitwise repeatable
    hd = Handle("cuda", deterministic=True)
    a = convolution_backward_filter(hd, xg, dyg, desc, p.w_shape)
    b = convolution_backward_filter(hd, xg, dyg, desc, p.w_shape)
    assert cp.array_equal(a, b)

"""1x1 convolutions as cublasLt products (backend/cuda/conv_pointwise.py, session 7).

CPU part: the problem rule; under the fake CuPy (tools/record_launches.py) with a cublasLt stand-in that reads the
operands from their POINTERS with the column-major layouts, transpose flags and leading dimensions the prepared call
was given (what cublasLtMatmul does), the three directions against float64 (float32 and bfloat16, the float32 dw of
half data, alpha/beta into a prior output), one product and no kernel launch; NCHW activations as a product batched
over the images; the kernel where a pointer is not 16-byte aligned, where the activations' layouts differ, for 3x3 /
strided / padded / grouped problems, under the switch, and for the atomic filter gradient; through the convolution
primitives with NHWC format.
GPU part (cuda-marked): the same against float64 on the device (fp32, TF32, bf16, fp16; ragged channel counts, N=1),
bitwise repeatable, one launch, the misaligned fallback agreeing.
"""
import json
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from minidnn.backend import devices as _dev
from minidnn.backend.conv_problem import make_problem
from minidnn.backend.convolution import ConvolutionDescriptor
from minidnn.backend.cuda import conv_pointwise as PW

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _p(xs, ws, pad=0, stride=1, groups=1, dtype="float32"):
    return make_problem("t", xs, ws, ConvolutionDescriptor(pad, stride, 1, groups), dtype)


def test_the_rule():
    assert PW.supports(_p((2, 16, 5, 7), (32, 16, 1, 1))) is None
    assert "1x1" in PW.supports(_p((2, 16, 5, 7), (32, 16, 3, 3), pad=1))
    assert "1x1" in PW.supports(_p((2, 16, 5, 7), (32, 16, 1, 1), stride=2))
    assert "1x1" in PW.supports(_p((2, 16, 5, 7), (32, 16, 1, 1), pad=1))
    assert PW.supports(_p((2, 16, 5, 7), (32, 8, 1, 1), groups=2)) == "grouped"


_SCRIPT = textwrap.dedent("""
    import ctypes, json, sys
    sys.path.insert(0, {root!r} + "/tools")
    import record_launches as R
    fakecp, L = R._install({root!r})
    import numpy as np
    import ml_dtypes
    from numpy.lib.stride_tricks import as_strided
    recs = []
    L._go = lambda fn, dims, stream, params_ptr: recs.append(str(fn).split("(")[0])
    L.count_launches = lambda n=1: recs.extend(["counted"] * n)

    def aligned_empty(shape, dtype=np.float32, off=0):      # CuPy's pool: 512-byte aligned blocks
        dtype = np.dtype(dtype)
        n = int(np.prod(shape)) * dtype.itemsize
        raw = np.empty(n + 1024, np.uint8)
        o = (-raw.ctypes.data) % 256 + off
        return raw[o:o + n].view(dtype).reshape(shape).view(fakecp.ndarray)
    fakecp.empty = aligned_empty
    fakecp.zeros = lambda shape, dtype=np.float32: (lambda a: (a.fill(0), a)[1])(aligned_empty(shape, dtype))

    DT = {{0: np.dtype(np.float32), 2: np.dtype(np.float16), 14: np.dtype(ml_dtypes.bfloat16)}}

    def colmajor(ptr, dt, rows, cols, ld):
        n = (cols - 1) * ld + rows
        buf = (ctypes.c_char * (n * dt.itemsize)).from_address(ptr)
        return as_strided(np.frombuffer(buf, dt, count=n), (rows, cols), (dt.itemsize, ld * dt.itemsize))

    from minidnn.backend.cuda import cublas

    class PtrLt:      # cublasLtMatmul's arithmetic on the operands' memory: D = alpha op(A) op(B) + beta C
        def __init__(self, lib, handle, ws, M, N, K, op_b, ld_b, op_a, ld_a, dt, ct, compute, epilogue,
                     batch=None, align=None):
            self.args = (M, N, K, op_b, ld_b, op_a, ld_a, DT[dt], DT[ct])
            self.batch = batch or (1, 0, 0, 0)       # (count, a's, b's, c's strides in elements: the row-major view)
            self.strict = compute == 68
            self.algo, self.alpha, self.beta = 1, ctypes.c_float(1.0), ctypes.c_float(0.0)

        def run(self, a, b, out, vec, stream):
            M, N, K, op_b, ld_b, op_a, ld_a, dt, ct = self.args
            count, sa, sb, sc = self.batch
            for i in range(count):
                pb, pa = b.data.ptr + i * sb * dt.itemsize, a.data.ptr + i * sa * dt.itemsize
                A = colmajor(pb, dt, N, K, ld_b) if op_b == 0 else colmajor(pb, dt, K, N, ld_b).T
                B = colmajor(pa, dt, K, M, ld_a) if op_a == 0 else colmajor(pa, dt, M, K, ld_a).T
                D = colmajor(out.data.ptr + i * sc * ct.itemsize, ct, N, M, N)
                res = self.alpha.value * (A.astype(np.float64) @ B.astype(np.float64))
                if self.beta.value:
                    res = res + self.beta.value * D.astype(np.float64)
                D[...] = res.astype(ct)
            recs.append("lt")
    cublas._LtCall = PtrLt

    import minidnn.backend as B
    from minidnn.backend.conv_problem import make_problem
    from minidnn.backend.cuda import conv_igemm as K
    from minidnn.backend.cuda import conv_pointwise as PW
    rng = np.random.default_rng(0)

    def nhwc(shape, dt, off=0):
        n, c, h, w = shape
        a = aligned_empty((n, h, w, c), dt, off)
        a[...] = rng.standard_normal(a.shape).astype(dt)
        return a.transpose(0, 3, 1, 2)

    def f64(a):
        return np.asarray(a).astype(np.float64)

    out = {{}}

    def refs(x, w, dy):         # float64 y, dx, dw of the 1x1 convolution
        X, DY, Wm = f64(x), f64(dy), f64(w)[:, :, 0, 0]
        return (np.einsum("nchw,kc->nkhw", X, Wm), np.einsum("nkhw,kc->nchw", DY, Wm),
                np.einsum("nkhw,nchw->kc", DY, X)[:, :, None, None])

    def case(name, fn, want, got_of, bound):
        del recs[:]
        got = fn()
        err = float(np.abs(f64(got_of(got)) - want).max())
        out[name] = [err <= bound, err, list(recs)]

    for dtn, dt, u in (("f32", np.float32, 2.0 ** -22), ("bf16", ml_dtypes.bfloat16, 2.0 ** -7)):
        for (N, C, H, W, Kc) in ((3, 16, 5, 7, 32), (2, 24, 4, 3, 40)):
            p = make_problem("t", (N, C, H, W), (Kc, C, 1, 1), B.ConvolutionDescriptor(0, 1, 1, 1), np.dtype(dt).name)
            x, dy = nhwc((N, C, H, W), dt), nhwc((N, Kc, H, W), dt)
            w = aligned_empty((Kc, C, 1, 1), dt)
            w[...] = rng.standard_normal(w.shape).astype(dt)
            y_ref, dx_ref, dw_ref = refs(x, w, dy)
            tag = f"{{dtn}}-{{C}}"
            scale = lambda r: float(np.abs(r).max()) * u * 2      # noqa
            case(f"fwd-{{tag}}", lambda: K.implicit_forward(p, x, w), y_ref, lambda g: g, scale(y_ref))
            case(f"dgrad-{{tag}}", lambda: K.implicit_backward_data(p, w, dy), dx_ref, lambda g: g, scale(dx_ref))
            case(f"wgrad-{{tag}}", lambda: K.implicit_backward_filter(p, x, dy), dw_ref, lambda g: g, scale(dw_ref))
            prior = aligned_empty(p.y_shape[:1] + p.y_shape[2:] + p.y_shape[1:2], dt).transpose(0, 3, 1, 2)
            prior[...] = rng.standard_normal(prior.shape).astype(dt)
            want = 0.5 * y_ref - 2.0 * f64(prior)
            case(f"fwd-ab-{{tag}}", lambda: K.implicit_forward(p, x, w, alpha=0.5, beta=-2.0, out=prior), want,
                 lambda g: g, scale(want))
            if dt is not np.float32:
                dwo = aligned_empty((Kc, C, 1, 1), np.float32)
                dwo[...] = 1.0
                want = dw_ref + 1.0
                case(f"wgrad-wide-ab-{{tag}}", lambda: K.implicit_backward_filter(p, x, dy, beta=1.0, out=dwo,
                                                                                out_dtype=np.float32),
                     want, lambda g: g, float(np.abs(want).max()) * 2.0 ** -20)
            # the kernel: a misaligned output, NCHW activations, the switch, the atomic form
            dxo = aligned_empty((N, H, W, C), dt, 8).transpose(0, 3, 1, 2)
            case(f"misaligned-{{tag}}", lambda: K.implicit_backward_data(p, w, dy, out=dxo), dx_ref, lambda g: g,
                 1e30)
            xn = fakecp.ascontiguousarray(x)
            case(f"nchw-{{tag}}", lambda: K.implicit_backward_filter(p, xn, dy), dw_ref, lambda g: g, 1e30)
            case(f"atomic-{{tag}}", lambda: K.implicit_backward_filter(p, x, dy, atomic=True), dw_ref, lambda g: g,
                 1e30)
            PW.ENABLED[0] = False
            case(f"off-{{tag}}", lambda: K.implicit_forward(p, x, w), y_ref, lambda g: g, 1e30)
            PW.ENABLED[0] = True
    # NCHW activations: the product batched over the images (the filter gradient: per-image partials, then
    # ones @ partials in strict fp32); the kernel where an image's matrices would not start 16-byte aligned
    for dtn, dt, u in (("f32", np.float32, 2.0 ** -22), ("bf16", ml_dtypes.bfloat16, 2.0 ** -7)):
        for (N, C, H, W, Kc) in ((2, 16, 4, 4, 32), (3, 32, 8, 8, 16), (2, 16, 5, 7, 32), (2, 3, 5, 7, 8)):
            p = make_problem("t", (N, C, H, W), (Kc, C, 1, 1), B.ConvolutionDescriptor(0, 1, 1, 1), np.dtype(dt).name)
            x, dy = aligned_empty((N, C, H, W), dt), aligned_empty((N, Kc, H, W), dt)
            w = aligned_empty((Kc, C, 1, 1), dt)
            for t in (x, dy, w):
                t[...] = rng.standard_normal(t.shape).astype(dt)
            y_ref, dx_ref, dw_ref = refs(x, w, dy)
            tag = f"{{dtn}}-{{N}}x{{C}}x{{H}}x{{W}}"
            scale = lambda r: float(np.abs(r).max()) * u * 2      # noqa
            case(f"nchw-fwd-{{tag}}", lambda: K.implicit_forward(p, x, w), y_ref, lambda g: g, scale(y_ref))
            case(f"nchw-dgrad-{{tag}}", lambda: K.implicit_backward_data(p, w, dy), dx_ref, lambda g: g, scale(dx_ref))
            prior = aligned_empty((N, Kc, H, W), dt)
            prior[...] = rng.standard_normal(prior.shape).astype(dt)
            want = 0.5 * y_ref - 2.0 * f64(prior)
            case(f"nchw-fwd-ab-{{tag}}", lambda: K.implicit_forward(p, x, w, alpha=0.5, beta=-2.0, out=prior), want,
                 lambda g: g, scale(want))
            dwo = aligned_empty((Kc, C, 1, 1), np.float32)
            dwo[...] = 1.0
            want = 2.0 * dw_ref + 1.0
            case(f"nchw-wgrad-ab-{{tag}}", lambda: K.implicit_backward_filter(p, x, dy, alpha=2.0, beta=1.0, out=dwo,
                                                                             out_dtype=np.float32),
                 want, lambda g: g, float(np.abs(want).max()) * (2.0 ** -20 if dt is np.float32 else 2.0 ** -18))
            if dt is np.float32:
                case(f"nchw-wgrad-{{tag}}", lambda: K.implicit_backward_filter(p, x, dy), dw_ref, lambda g: g,
                     scale(dw_ref))
            else:           # a 16-bit dw: the kernel (the partials' sum is written in float32 only)
                case(f"nchw-wgrad16-{{tag}}", lambda: K.implicit_backward_filter(p, x, dy), dw_ref, lambda g: g, 1e30)
            PW.NCHW[0] = False
            case(f"nchw-off-{{tag}}", lambda: K.implicit_forward(p, x, w), y_ref, lambda g: g, 1e30)
            PW.NCHW[0] = True
    # the filter gradient's partials above PARTIALS_MAX_BYTES (65 x 512 x 512 float32 > 64 MiB): the kernel (2 x 2
    # images: at 1 x 1 NCHW is NHWC too, and the single product needs no partials)
    p = make_problem("t", (65, 512, 2, 2), (512, 512, 1, 1), B.ConvolutionDescriptor(0, 1, 1, 1), "float32")
    x, dy = aligned_empty((65, 512, 2, 2)), aligned_empty((65, 512, 2, 2))
    x[...], dy[...] = 0.5, 0.25
    del recs[:]
    K.implicit_backward_filter(p, x, dy)           # (the fake records the kernel's launches, it does not run them)
    out["nchw-big-wgrad"] = list(recs)
    del recs[:]
    K.implicit_forward(p, x, aligned_empty((512, 512, 1, 1)))
    out["nchw-big-fwd"] = list(recs)
    # not a plain product: 3x3, stride 2, padding, groups
    for name, ws, desc in (("3x3", (32, 16, 3, 3), (1, 1, 1, 1)), ("stride2", (32, 16, 1, 1), (0, 2, 1, 1)),
                           ("pad1", (32, 16, 1, 1), (1, 1, 1, 1)), ("groups2", (32, 8, 1, 1), (0, 1, 1, 2))):
        d = B.ConvolutionDescriptor(*desc)
        p = make_problem("t", (2, 16, 6, 6), ws, d, "float32")
        x = nhwc((2, 16, 6, 6), np.float32)
        w = aligned_empty(ws, np.float32)
        del recs[:]
        K.implicit_forward(p, x, w)
        out[name] = list(recs)
    # the primitives, NHWC format (nn's path): the product, no kernel
    d = B.ConvolutionDescriptor(0, 1, 1, 1)
    xs = aligned_empty((4, 6, 5, 16), np.float32)
    xs[...] = rng.standard_normal(xs.shape)
    ws = aligned_empty((32, 16, 1, 1), np.float32)
    ws[...] = rng.standard_normal(ws.shape)
    ref = np.einsum("nhwc,kc->nhwk", np.asarray(xs, np.float64), np.asarray(ws, np.float64)[:, :, 0, 0])
    res = {{}}
    for rep in range(2):
        del recs[:]
        y = B.convolution_forward(None, xs, ws, d, format="NHWC")
        res[rep] = [float(np.abs(np.asarray(y, np.float64) - ref).max()), list(recs)]
    out["primitive"] = res
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def fake():
    r = subprocess.run([sys.executable, "-c", _SCRIPT.format(root=str(ROOT))], capture_output=True, text=True,
                       cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("dt", ["f32", "bf16"])
@pytest.mark.parametrize("c", [16, 24])
@pytest.mark.parametrize("what", ["fwd", "dgrad", "wgrad", "fwd-ab", "wgrad-wide-ab"])
def test_the_product_against_float64_and_no_kernel(fake, what, c, dt):
    key = f"{what}-{dt}-{c}"
    if what == "wgrad-wide-ab" and dt == "f32":
        assert key not in fake
        return
    ok, err, recs = fake[key]
    assert ok, (key, err)
    assert recs == ["lt", "counted"], recs            # one cublasLt product, counted as one launch


@pytest.mark.parametrize("c", [16, 24])
@pytest.mark.parametrize("what", ["misaligned", "nchw", "atomic", "off"])
def test_the_kernel_runs_where_the_product_does_not(fake, what, c):
    for dt in ("f32", "bf16"):
        recs = fake[f"{what}-{dt}-{c}"][2]
        assert "lt" not in recs and "conv_igemm" in recs, recs


@pytest.mark.parametrize("dt", ["f32", "bf16"])
@pytest.mark.parametrize("shape", ["2x16x4x4", "3x32x8x8", "2x16x5x7"])
@pytest.mark.parametrize("what", ["fwd", "dgrad", "fwd-ab", "wgrad-ab", "wgrad"])
def test_nchw_as_a_batched_product(fake, what, shape, dt):
    """NCHW activations: one batched product (forward, backward data), the filter gradient as the batched partials
    plus their sum (two products), against float64; a 16-bit dw (not float32) runs the kernel."""
    if what == "wgrad" and dt == "bf16":
        recs = fake[f"nchw-wgrad16-{dt}-{shape}"][2]
        assert "lt" not in recs and "conv_igemm" in recs, recs
        return
    ok, err, recs = fake[f"nchw-{what}-{dt}-{shape}"]
    assert ok, (what, shape, dt, err)
    assert recs == (["lt", "lt", "counted", "counted"] if "wgrad" in what else ["lt", "counted"]), recs


@pytest.mark.parametrize("what", ["fwd", "dgrad", "off"])
def test_nchw_kernel_where_images_are_not_16_byte_aligned_or_switched_off(fake, what):
    # 3 x 5 x 7 values an image (420 bytes in float32, 210 in bfloat16): not a multiple of 16, so the kernel; and
    # the switch
    for dt in ("f32", "bf16"):
        recs = fake[f"nchw-{what}-{dt}-2x3x5x7"][2]
        assert "lt" not in recs and "conv_igemm" in recs, (what, dt, recs)
    for dt in ("f32", "bf16"):
        assert "lt" not in fake[f"nchw-off-{dt}-2x16x4x4"][2]


def test_nchw_filter_gradient_with_too_many_partials_runs_the_kernel(fake):
    recs = fake["nchw-big-wgrad"]
    assert "lt" not in recs and "conv_igemm" in recs, recs
    assert fake["nchw-big-fwd"] == ["lt", "counted"]          # (the forward has no partials: still the product)


@pytest.mark.parametrize("case", ["3x3", "stride2", "pad1", "groups2"])
def test_other_problems_keep_the_kernel(fake, case):
    assert "lt" not in fake[case] and "conv_igemm" in fake[case]


def test_through_the_primitive_nhwc(fake):
    for rep in ("0", "1"):
        err, recs = fake["primitive"][rep]
        assert err < 1e-4 and recs == ["lt", "counted"], (rep, err, recs)


# ---- on a GPU -----------------------------------------------------------------------------------------------------

GPU_SHAPES = [(8, 16, 32, 32, 32), (8, 64, 8, 8, 128), (3, 24, 7, 9, 40), (1, 32, 5, 5, 8)]


@pytest.mark.cuda
@pytest.mark.parametrize("mode", ["fp32", "tf32", "bf16", "fp16"])
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=["pw16", "pw64", "ragged", "n1"])
def test_pointwise_on_the_gpu(shape, mode):
    if not _dev.cuda_is_available():
        pytest.skip("no CUDA GPU with CuPy on this machine")
    import cupy as cp
    import ml_dtypes

    from minidnn.backend.cuda import conv_igemm as K
    from minidnn.backend.cuda import launch as L
    N, C, H, W, Kc = shape
    dt = {"fp32": np.float32, "tf32": np.float32, "bf16": ml_dtypes.bfloat16, "fp16": np.float16}[mode]
    p = _p((N, C, H, W), (Kc, C, 1, 1), dtype=np.dtype(dt).name)
    rng = np.random.default_rng(sum(shape))
    x = rng.standard_normal((N, C, H, W)).astype(dt).astype(np.float64)
    dy = rng.standard_normal((N, Kc, H, W)).astype(dt).astype(np.float64)
    w = rng.standard_normal((Kc, C, 1, 1)).astype(dt).astype(np.float64)
    g = lambda a: cp.ascontiguousarray(cp.asarray(a.astype(dt)).transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)  # noqa
    xg, dyg, wg = g(x), g(dy), cp.asarray(w.astype(dt))
    tf32 = mode == "tf32"
    u = {"fp32": 2.0 ** -22, "tf32": 2.0 ** -9, "bf16": 2.0 ** -7, "fp16": 2.0 ** -9}[mode]
    refs = {0: np.einsum("nchw,kc->nkhw", x, w[:, :, 0, 0]), 1: np.einsum("nkhw,kc->nchw", dy, w[:, :, 0, 0]),
            2: np.einsum("nkhw,nchw->kc", dy, x)[:, :, None, None]}
    absr = {0: np.einsum("nchw,kc->nkhw", abs(x), abs(w[:, :, 0, 0])),
            1: np.einsum("nkhw,kc->nchw", abs(dy), abs(w[:, :, 0, 0])),
            2: np.einsum("nkhw,nchw->kc", abs(dy), abs(x))[:, :, None, None]}
    runs = {0: lambda **k: K.implicit_forward(p, xg, wg, tf32, **k),
            1: lambda **k: K.implicit_backward_data(p, wg, dyg, tf32, **k),
            2: lambda **k: K.implicit_backward_filter(p, xg, dyg, tf32, **k)}
    for d in (0, 1, 2):
        kr = (C, Kc, N * H * W)[d]
        bound = (u + kr * 2.0 ** -23) * absr[d] * 1.5 + 1e-30
        a = runs[d]()
        before = L.launch_count()
        b = runs[d]()
        assert L.launch_count() - before == 1
        assert cp.array_equal(a, b)                                     # bitwise repeatable
        assert (np.abs(cp.asnumpy(b).astype(np.float64) - refs[d]) <= bound).all(), d
        assert any(type(c).__name__ == "GemmCall" for c in K._calls.values())
    if dt is not np.float32:            # the float32 dw of half data, accumulated into a prior dw (beta 1)
        dwo = cp.ones((Kc, C, 1, 1), np.float32)
        K.implicit_backward_filter(p, xg, dyg, tf32, beta=1.0, out=dwo, out_dtype=np.float32)
        assert (np.abs(cp.asnumpy(dwo) - 1.0 - refs[2]) <= (kr * 2.0 ** -23 + 2.0 ** -23) * (absr[2] + 1) * 2).all()
    # a misaligned output runs the kernel: the same result within the bound
    buf = cp.empty(N * H * W * C + 64, dt)
    dxo = buf[1:1 + N * H * W * C].reshape(N, H, W, C).transpose(0, 3, 1, 2)       # 2 or 4 bytes off
    K.implicit_backward_data(p, wg, dyg, tf32, out=dxo)
    bound = (u + Kc * 2.0 ** -23) * absr[1] * 1.5 + 1e-30
    assert (np.abs(cp.asnumpy(dxo).astype(np.float64) - refs[1]) <= bound).all()


@pytest.mark.cuda
@pytest.mark.parametrize("mode", ["fp32", "tf32", "bf16", "fp16"])
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=["pw16", "pw64", "ragged", "n1"])
def test_pointwise_nchw_on_the_gpu(shape, mode):
    """NCHW activations: the batched product (forward, backward data: one launch; the float32 filter gradient:
    partials + their sum, two) where every image's matrices start 16-byte aligned, else the kernel; both against
    float64, bitwise repeatable, and captured in a CUDA graph (the partials' scratch and the ones row)."""
    if not _dev.cuda_is_available():
        pytest.skip("no CUDA GPU with CuPy on this machine")
    import cupy as cp
    import ml_dtypes

    from minidnn.backend.cuda import conv_igemm as K
    from minidnn.backend.cuda import launch as L
    N, C, H, W, Kc = shape
    dt = {"fp32": np.float32, "tf32": np.float32, "bf16": ml_dtypes.bfloat16, "fp16": np.float16}[mode]
    p = _p((N, C, H, W), (Kc, C, 1, 1), dtype=np.dtype(dt).name)
    rng = np.random.default_rng(sum(shape) + 1)
    x = rng.standard_normal((N, C, H, W)).astype(dt).astype(np.float64)
    dy = rng.standard_normal((N, Kc, H, W)).astype(dt).astype(np.float64)
    w = rng.standard_normal((Kc, C, 1, 1)).astype(dt).astype(np.float64)
    xg, dyg, wg = (cp.asarray(a.astype(dt)) for a in (x, dy, w))
    tf32 = mode == "tf32"
    e = np.dtype(dt).itemsize
    batched = (C * H * W * e) % PW.ALIGN == 0 and (Kc * H * W * e) % PW.ALIGN == 0
    u = {"fp32": 2.0 ** -22, "tf32": 2.0 ** -9, "bf16": 2.0 ** -7, "fp16": 2.0 ** -9}[mode]
    refs = {0: np.einsum("nchw,kc->nkhw", x, w[:, :, 0, 0]), 1: np.einsum("nkhw,kc->nchw", dy, w[:, :, 0, 0]),
            2: np.einsum("nkhw,nchw->kc", dy, x)[:, :, None, None]}
    absr = {0: np.einsum("nchw,kc->nkhw", abs(x), abs(w[:, :, 0, 0])),
            1: np.einsum("nkhw,kc->nchw", abs(dy), abs(w[:, :, 0, 0])),
            2: np.einsum("nkhw,nchw->kc", abs(dy), abs(x))[:, :, None, None]}
    runs = {0: lambda: K.implicit_forward(p, xg, wg, tf32),
            1: lambda: K.implicit_backward_data(p, wg, dyg, tf32),
            2: lambda: K.implicit_backward_filter(p, xg, dyg, tf32, out_dtype=np.float32)}
    for d in (0, 1, 2):
        kr = (C, Kc, N * H * W)[d]
        bound = (u + kr * 2.0 ** -23) * absr[d] * 1.5 + 1e-30
        a = runs[d]()
        K._calls.clear()
        before = L.launch_count()
        b = runs[d]()
        if batched:
            assert L.launch_count() - before == (2 if d == 2 else 1), d
            assert any(type(c).__name__ == "GemmCall" for c in K._calls.values())
        else:
            assert not any(type(c).__name__ == "GemmCall" for c in K._calls.values())
        assert cp.array_equal(a, b)                                     # bitwise repeatable
        assert (np.abs(cp.asnumpy(b).astype(np.float64) - refs[d]) <= bound).all(), d
    # captured and replayed: the filter gradient's two products read the scratch partials and the kept ones row
    out = cp.zeros((Kc, C, 1, 1), np.float32)
    K.implicit_backward_filter(p, xg, dyg, tf32, out=out, out_dtype=np.float32)
    want = out.copy()
    out.fill(0)
    cp.cuda.Device().synchronize()      # the fill ran on the default stream: done before the non-blocking replay
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        K.implicit_backward_filter(p, xg, dyg, tf32, out=out, out_dtype=np.float32)
        graph = stream.end_capture()
        graph.launch(stream)
    stream.synchronize()
    assert cp.array_equal(out, want)

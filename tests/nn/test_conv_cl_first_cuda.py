"""On a GPU: ``SettledConvolution.first`` (docs/host_overhead.md round 22) -- a settled NHWC convolution called on the
channels-first views of channels-last data -- gives the bits of ``run`` on the NHWC views and of the primitive with
format="NHWC", for forward, backward data and backward filter over the implicit-GEMM (plain, stride 2, 1x1, the stem's
three channels) and the depthwise routes, float32 and bfloat16; backward data into a channels-last destination with
beta 1 writes fresh + destination (float32: the bits of the separate add, as the engine's; bfloat16: the float32 sum
rounded once, within bfloat16 steps of the rounded operands' sum), with beta 0 the fresh result's bits.  The
launches are checked on the CPU (test_conv_cl_first.py)."""
import numpy as np
import pytest

from minidnn.backend import devices as _dev

pytestmark = pytest.mark.cuda

if not _dev.cuda_is_available():
    pytest.skip("no CUDA GPU with CuPy on this machine", allow_module_level=True)

import cupy as cp  # noqa: E402

import minidnn as mdn  # noqa: E402
import minidnn.backend as B  # noqa: E402
from minidnn.backend import convolution as CV  # noqa: E402
from minidnn.backend.layout import TensorFormat, to_channels_first  # noqa: E402

# name: x shape, w shape, stride, padding, groups
CASES = {
    "s1": ((32, 16, 32, 32), (16, 16, 3, 3), 1, 1, 1),
    "s2": ((32, 16, 32, 32), (32, 16, 3, 3), 2, 1, 1),
    "1x1": ((32, 32, 16, 16), (64, 32, 1, 1), 1, 0, 1),
    "stem": ((32, 3, 32, 32), (16, 3, 3, 3), 1, 1, 1),
    "dw": ((32, 64, 16, 16), (64, 1, 3, 3), 1, 1, 64),
    "dw_s2": ((32, 64, 16, 16), (64, 1, 3, 3), 2, 1, 64),
}


def _cl(rng, shape, dtype):
    n, c, h, w = shape
    return cp.asarray(rng.standard_normal((n, h, w, c)).astype(np.float32).astype(dtype)).transpose(0, 3, 1, 2)


def _host32(a):
    return cp.asnumpy(cp.ascontiguousarray(a)).astype(np.float32)


def _last(a):
    return a.transpose(0, 2, 3, 1)


def _bits(a):
    return cp.asnumpy(cp.ascontiguousarray(a)).view(np.uint8)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", list(CASES))
def test_first_gives_the_bits_of_run_and_of_the_primitive(name, dtype):
    dt = np.dtype(np.float32) if dtype == "float32" else mdn.bfloat16
    xs, ws, st, pad, g = CASES[name]
    rng = np.random.default_rng(0)
    desc = B.ConvolutionDescriptor(pad, st, 1, g)
    h = B.handle.configured_default_handle(cp.empty((1,)))
    x, w = _cl(rng, xs, dt), cp.asarray(rng.standard_normal(ws).astype(np.float32).astype(dt))
    ys = B.get_convolution_forward_output_dim(desc, xs, ws)
    dy = _cl(rng, ys, dt)
    nhwc_x = tuple(xs[i] for i in (0, 2, 3, 1))
    calls = ((0, x, w, None, lambda: B.convolution_forward(h, _last(x), w, desc, format="NHWC")),
             (1, w, dy, nhwc_x, lambda: B.convolution_backward_data(h, w, _last(dy), desc, nhwc_x, format="NHWC")),
             (2, x, dy, tuple(ws), lambda: B.convolution_backward_filter(h, _last(x), _last(dy), desc, tuple(ws),
                                                                         format="NHWC")))
    for d, a1, a2, other, primitive in calls:
        n1 = a1 if d == 1 else _last(a1)
        n2 = a2 if d == 0 else _last(a2)
        s = CV.settle_convolution(d, h, n1, n2, desc, other, "NHWC")
        assert s is not None
        r_first = s.first(a1, a2)
        r_run = s.run(n1, n2)
        ref = primitive()
        if d != 2:
            r_run, ref = to_channels_first(r_run, TensorFormat.NHWC), to_channels_first(ref, TensorFormat.NHWC)
        assert r_first.shape == r_run.shape and r_first.strides == r_run.strides and r_first.dtype == r_run.dtype
        assert np.array_equal(_bits(r_first), _bits(r_run)), (name, d)
        assert np.array_equal(_bits(r_first), _bits(ref)), (name, d)
        if d == 1 and s.keep:
            fresh = r_first
            for beta in (1.0, 0.0):
                into = _cl(rng, xs, dt)
                before = _host32(into)
                r = s.first(a1, a2, None, into, beta)
                assert r is into
                if beta == 0.0:
                    assert np.array_equal(_bits(r), _bits(fresh))
                elif dtype == "float32":        # float32 adds: the engine's separate add, bit for bit
                    assert np.array_equal(_host32(r).view(np.uint32), (_host32(fresh) + before).view(np.uint32))
                else:       # the kernel's float32 sum rounded once, against the rounded operands' sum rounded:
                    f32 = _host32(fresh)    # apart by fresh's rounding and the two final roundings (half steps)
                    want = (f32 + before).astype(dt).astype(np.float32)
                    assert np.all(np.abs(_host32(r) - want) <= (np.abs(f32) + 2 * np.abs(want)) * 2.0 ** -7 + 1e-30)

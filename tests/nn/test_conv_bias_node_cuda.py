"""On a GPU: a convolution's bias as ConvForward's fourth input (docs/host_overhead.md round 21) and the gradients
written into the optimizer's slots -- the biases' column sums (convolution_backward_bias with db) and the direct
kernels' filter gradients (SettledConvolution.run into=).  The switch on and off (BiasAdd's node) give the same bits
for y, dx, dw and db (NCHW and channels-last, float32 and bfloat16 autocast, conv1d / conv2d / conv3d); db against a
float64 sum on the host; the backend's column sum into a given db equals the fresh one bit for bit (float32, a
bfloat16 dy with float32 db, channels-last dy); LeNet-5 and MobileNet-small train three SGD steps with the switch
and the gradient destinations on and off to bit-identical parameters, and with both on no leaf gradient is copied
in the third step (the reference: the primitives' full path, conv's fast path off); the direct kernels' settled route
(conv_igemm.settle_direct) gives the primitives' bits for LeNet-like problems (float32, bfloat16, float32 dw).
The graph and the launches on the CPU: test_conv_bias_node.py and test_conv_direct_settled.py."""
import numpy as np
import pytest

from minidnn.backend import devices as _dev

pytestmark = pytest.mark.cuda

if not _dev.cuda_is_available():
    pytest.skip("no CUDA GPU with CuPy on this machine", allow_module_level=True)

import cupy as cp  # noqa: E402

import minidnn as mdn  # noqa: E402
import minidnn.autograd as AG  # noqa: E402
import minidnn.backend as B  # noqa: E402
from minidnn import _grad_dest as GD  # noqa: E402
from minidnn.nn import functional as F  # noqa: E402
from minidnn.nn._functions import conv as C  # noqa: E402

_FN = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
CASES = [   # (nd, x shape, w shape, kwargs): direct kernels (few channels) and implicit GEMM (more)
    (2, (8, 1, 32, 32), (6, 1, 5, 5), {}),
    (2, (8, 6, 14, 14), (16, 6, 5, 5), {}),
    (2, (4, 32, 16, 16), (64, 32, 3, 3), dict(padding=1)),
    (2, (4, 16, 9, 9), (16, 4, 3, 3), dict(stride=2, padding=1, groups=4)),
    (1, (4, 8, 33), (12, 8, 3), dict(padding=1)),
    (3, (2, 4, 6, 7, 5), (8, 4, 3, 3, 3), dict(padding=1)),
]


def _bits(a):
    return cp.asnumpy(cp.ascontiguousarray(a)).view(np.uint8)


def _run(case, node, cl, amp, steps=2):
    nd, xs, ws, kw = CASES[case]
    C.BIAS_NODE[0] = node
    try:
        mdn.manual_seed(case)
        x = mdn.randn(*xs).to("cuda")
        w = mdn.randn(*ws).to("cuda") * 0.2
        b = mdn.randn(ws[0]).to("cuda")
        if cl:
            x = x.to(memory_format=mdn.channels_last)
        x.requires_grad_(), w.requires_grad_(), b.requires_grad_()
        out = []
        for _ in range(steps):      # the second call takes the seen (fast) path
            x.grad = w.grad = b.grad = None
            if amp:
                with mdn.autocast("cuda", dtype=mdn.bfloat16):
                    y = _FN[nd](x, w, b, **kw)
            else:
                y = _FN[nd](x, w, b, **kw)
            g = mdn.randn(*y.shape).to("cuda").to(y.dtype)
            y.backward(g)
            out.append([_bits(y.data), _bits(x.grad.data), _bits(w.grad.data), _bits(b.grad.data),
                        cp.asnumpy(g.data).astype(np.float64), str(b.grad.dtype)])
        return out
    finally:
        C.BIAS_NODE[0] = True


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("cl", [False, True])
@pytest.mark.parametrize("amp", [False, True])
def test_bias_in_the_node_equals_bias_add_bit_for_bit(case, cl, amp):
    if cl and CASES[case][0] != 2:
        pytest.skip("channels-last is 4-D")
    on, off = _run(case, True, cl, amp), _run(case, False, cl, amp)
    for a, r in zip(on, off):
        for i in range(4):
            assert np.array_equal(a[i], r[i]), ("y", "dx", "dw", "db")[i]
        assert a[5] == r[5] == "float32"        # autocast's float32 bias: db in float32
        # db against the float64 sum of the upstream gradient (as it was rounded to y's dtype)
        axes = (0,) + tuple(range(2, a[4].ndim))
        db = a[3].view(np.float32).astype(np.float64)
        np.testing.assert_allclose(db, a[4].sum(axis=axes), rtol=1e-4, atol=1e-4 * np.abs(a[4]).sum(axis=axes).max())


@pytest.mark.parametrize("dtype,wide,cl", [("float32", None, False), ("float32", None, True),
                                           ("bfloat16", "float32", False), ("float16", "float32", True)])
def test_backend_column_sum_into_db_equals_fresh(dtype, wide, cl):
    rng = np.random.default_rng(0)
    dt = {"float32": np.dtype(np.float32), "bfloat16": mdn.bfloat16, "float16": np.dtype(np.float16)}[dtype]
    dy = cp.asarray(rng.standard_normal((16, 24, 7, 9)).astype(np.float32).astype(dt))
    if cl:
        dy = cp.ascontiguousarray(dy.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    extra = {} if wide is None else {"db_dtype": np.float32}
    fresh = [B.convolution_backward_bias(None, dy, **extra) for _ in range(2)]      # full path, then seen
    for _ in range(2):
        db = cp.full((24,), np.nan, dtype=fresh[0].dtype)
        r = B.convolution_backward_bias(None, dy, db=db, **extra)
        assert r is db
        assert np.array_equal(_bits(db), _bits(fresh[0])) and np.array_equal(_bits(fresh[1]), _bits(fresh[0]))
    ref = cp.asnumpy(dy).astype(np.float64).sum(axis=(0, 2, 3))       # float32 db: the sums unrounded
    np.testing.assert_allclose(cp.asnumpy(fresh[0]).astype(np.float64), ref, rtol=1e-4, atol=1e-3)


def _train(model_name, node, dest, steps=3, fast=True):
    C.BIAS_NODE[0] = node
    GD.ENABLED[0] = dest
    C.FAST_PATH[0] = fast
    copies = []
    real = AG._copy_into
    AG._copy_into = lambda dst, src: copies.append(tuple(dst.shape)) or real(dst, src)
    try:
        mdn.manual_seed(0)
        if model_name == "lenet5":
            m = mdn.models.LeNet5(num_classes=10, in_channels=1, input_size=32).to("cuda")
            x = mdn.randn(64, 1, 32, 32).to("cuda")
        else:
            m = mdn.models.MobileNetSmall(num_classes=10, in_channels=3).to("cuda")
            x = mdn.randn(32, 3, 32, 32).to("cuda")
        y = mdn.randint(0, 10, (x.shape[0],)).to("cuda")
        opt = mdn.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
        seen, per_step = [], []
        for _ in range(steps):
            copies.clear()
            loss = F.cross_entropy(m(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            per_step.append(len(copies))
            seen.append([_bits(p.data) for p in m.parameters()])
        return seen, per_step
    finally:
        AG._copy_into = real
        C.FAST_PATH[0] = True
        C.BIAS_NODE[0] = True
        GD.ENABLED[0] = True


@pytest.mark.parametrize("model_name", ["lenet5", "mobilenet"])
def test_training_steps_bit_identical_and_no_leaf_copies(model_name):
    ref, _ = _train(model_name, False, False, fast=False)      # the primitives' full path, BiasAdd, engine copies
    for node, dest in ((True, True), (True, False), (False, True), (False, False)):
        got, copies = _train(model_name, node, dest)
        for a, r in zip(got, ref):
            for pa, pr in zip(a, r):
                assert np.array_equal(pa, pr), (node, dest)
        if node and dest:       # (batch norm's backward writes its slots once it is remembered: the third step)
            assert copies[-1] == 0, copies


@pytest.mark.parametrize("dtype,dw_dtype", [("float32", None), ("bfloat16", None), ("bfloat16", "float32")])
@pytest.mark.parametrize("shapes", [((64, 1, 32, 32), (6, 1, 5, 5), 0), ((64, 6, 14, 14), (16, 6, 5, 5), 0),
                                    ((16, 3, 20, 20), (8, 3, 3, 3), 1)])
def test_settled_direct_route_equals_the_primitives(dtype, dw_dtype, shapes):
    # conv_igemm.settle_direct through backend.convolution's settled calls, against the full primitives: the same bits
    from minidnn.backend import convolution as BC
    x_shape, w_shape, pad = shapes
    dt = {"float32": np.dtype(np.float32), "bfloat16": mdn.bfloat16}[dtype]
    rng = np.random.default_rng(1)
    x = cp.asarray(rng.standard_normal(x_shape).astype(np.float32).astype(dt))
    w = cp.asarray((0.2 * rng.standard_normal(w_shape)).astype(np.float32).astype(dt))
    desc = B.ConvolutionDescriptor((pad, pad), (1, 1), (1, 1))
    y = B.convolution_forward(None, x, w, desc)
    dy = cp.asarray(rng.standard_normal(y.shape).astype(np.float32).astype(dt))
    extra = {} if dw_dtype is None else {"dw_dtype": np.float32}
    full = [y, B.convolution_backward_data(None, w, dy, desc, x_shape),
            B.convolution_backward_filter(None, x, dy, desc, w_shape, **extra)]
    for d, (a1, a2, other) in enumerate(((x, w, None), (w, dy, x_shape), (x, dy, w_shape))):
        s = BC.settle_convolution(d, None, a1, a2, desc, other, None, np.float32 if d == 2 and dw_dtype else None)
        assert s is not None and s.direct is not None, d
        for _ in range(2):
            r = s.run(a1, a2)
            assert r.dtype == full[d].dtype and np.array_equal(_bits(r), _bits(full[d])), d
        if d == 2:
            slot = cp.full(w_shape, np.nan, dtype=full[2].dtype)
            assert s.run(a1, a2, None, slot) is slot and np.array_equal(_bits(slot), _bits(full[2]))

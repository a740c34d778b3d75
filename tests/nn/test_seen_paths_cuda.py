"""On a GPU: round 24's seen-signature paths (docs/host_overhead.md) give the full path's bits.  F.linear's seen call
(``linear._LINEAR_FAST``), ConvForward's written-out apply (``conv.SEEN_APPLY``), max pooling's remembered plan
(``pooling.MAXPOOL_FAST``) and cross-entropy's seen call (``loss.CE_FAST``), all on and all off: LeNet-5 (fp32 and
bf16 autocast) and MobileNet-small train three SGD steps from one start, every parameter bit-identical after each
step and the same launches a step; the linear layer's 2-D arrays (no reshaped views) against a float64 reference,
2-D and 3-D input, with the prepared cublasLt call (its workspace and scalars' pointers read once) inside a CUDA
graph replay.  The nodes and launches are checked on the CPU under the fake CuPy (test_linear_seen.py,
test_conv_seen_apply.py, test_maxpool_seen.py, test_cross_entropy_seen.py, test_lt_call_run.py)."""
import numpy as np
import pytest

from minidnn.backend import devices as _dev

pytestmark = pytest.mark.cuda

if not _dev.cuda_is_available():
    pytest.skip("no CUDA GPU with CuPy on this machine", allow_module_level=True)

import cupy as cp  # noqa: E402

import minidnn as mdn  # noqa: E402
from minidnn.backend.cuda import launch as L  # noqa: E402
from minidnn.nn import functional as F  # noqa: E402
from minidnn.nn._functions import conv as C  # noqa: E402
from minidnn.nn._functions import linear as LN  # noqa: E402
from minidnn.nn._functions import loss as LS  # noqa: E402
from minidnn.nn._functions import pooling as P  # noqa: E402

_SWITCHES = (LN.LINEAR_FAST, C.SEEN_APPLY, P.MAXPOOL_FAST, LS.CE_FAST)


def _set(on):
    for s in _SWITCHES:
        s[0] = on
    LN._LINEAR_SEEN.clear()
    P._MAXPOOL_SEEN.clear()
    LS._CE_SEEN.clear()


@pytest.mark.parametrize("model,amp", [("lenet5", False), ("lenet5", True), ("mobilenet", False)])
def test_steps_bit_identical_with_seen_paths_on_and_off(model, amp):
    params, launches = {}, {}
    for on in (True, False):
        _set(on)
        try:
            mdn.manual_seed(0)
            if model == "lenet5":
                m = mdn.models.LeNet5(num_classes=10, in_channels=1, input_size=32).to("cuda")
                x = mdn.randn(64, 1, 32, 32).to("cuda")
            else:
                m = mdn.models.MobileNetSmall(num_classes=10, in_channels=3).to("cuda")
                x = mdn.randn(32, 3, 32, 32).to("cuda")
            opt = mdn.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
            y = mdn.randint(0, 10, (x.shape[0],)).to("cuda")
            seen, counts = [], []
            for _ in range(3):
                n0 = L.launch_count()
                with mdn.autocast("cuda", dtype=mdn.bfloat16, enabled=amp):
                    loss = F.cross_entropy(m(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                counts.append(L.launch_count() - n0)
                seen.append([cp.asnumpy(p.data).copy() for p in m.parameters()])
            params[on], launches[on] = seen, counts
        finally:
            _set(True)
    assert launches[True] == launches[False]
    for a, b in zip(params[True], params[False]):
        for pa, pb in zip(a, b):
            assert np.array_equal(pa.view(np.uint8), pb.view(np.uint8))


@pytest.mark.parametrize("shape", [(37, 24), (3, 5, 24)])
def test_linear_2d_arrays_against_float64(shape):
    mdn.manual_seed(1)
    lin = mdn.nn.Linear(24, 20).to("cuda")
    for _ in range(3):          # the third call on the seen path
        x = mdn.randn(*shape).to("cuda").requires_grad_()
        yy = lin(x)
        g = mdn.randn(*yy.shape).to("cuda")
        lin.zero_grad()
        yy.backward(g)
    x64 = cp.asnumpy(x.data).astype(np.float64).reshape(-1, 24)
    g64 = cp.asnumpy(g.data).astype(np.float64).reshape(-1, 20)
    w64 = cp.asnumpy(lin.weight.data).astype(np.float64)
    b64 = cp.asnumpy(lin.bias.data).astype(np.float64)
    tol = dict(rtol=1e-4, atol=1e-4)       # float32 products (TF32 off by default)
    np.testing.assert_allclose(cp.asnumpy(yy.data).reshape(-1, 20), x64 @ w64.T + b64, **tol)
    np.testing.assert_allclose(cp.asnumpy(x.grad.data).reshape(-1, 24), g64 @ w64, **tol)
    np.testing.assert_allclose(cp.asnumpy(lin.weight.grad.data), g64.T @ x64, **tol)
    np.testing.assert_allclose(cp.asnumpy(lin.bias.grad.data), g64.sum(0), **tol)
    assert yy.shape == shape[:-1] + (20,) and x.grad.shape == shape


def test_linear_in_a_cuda_graph_replays_the_eager_values():
    mdn.manual_seed(2)
    lin = mdn.nn.Linear(32, 16).to("cuda")
    x = mdn.randn(8, 32).to("cuda")
    eager = cp.asnumpy(lin(x).data).copy()
    static_x = mdn.zeros(8, 32).to("cuda")
    with mdn.no_grad():
        s = mdn.cuda.Stream()
        s.wait_stream(mdn.cuda.current_stream())
        with mdn.cuda.stream(s):            # warm-up: the prepared cublasLt call exists before capture
            for _ in range(3):
                lin(static_x)
        mdn.cuda.current_stream().wait_stream(s)
        g = mdn.cuda.CUDAGraph()
        with mdn.cuda.graph(g):
            out = lin(static_x)
    static_x.data[...] = x.data
    g.replay()
    mdn.cuda.synchronize()
    assert np.array_equal(cp.asnumpy(out.data), eager)

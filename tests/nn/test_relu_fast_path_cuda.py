"""On a GPU: F.relu's remembered calls (nn/_functions/activation.py, docs/host_overhead.md round 20) and pooling's
validated-call shortcut give the full path's bits.  relu of a tensor requiring grad (NCHW, channels-last; float32,
bfloat16, float16), three calls with the shortcut on and off: the output equals max(x, 0) and the gradient g * (x > 0)
computed on the host, bit for bit between on and off, with the same launches per call; and a LeNet-5 (conv -> ReLU
-> max pool, linear -> ReLU) trains three SGD steps from one start with both shortcuts on and off: every parameter
bit-identical after each step.  The launches and nodes are checked on the CPU too (test_relu_fast_path.py)."""
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
from minidnn.nn._functions import activation as A  # noqa: E402
from minidnn.nn._functions import pooling as P  # noqa: E402


def _host(t):
    return cp.asnumpy(cp.ascontiguousarray(t.data)).astype(np.float64)


@pytest.mark.parametrize("cl", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_relu_on_equals_off_and_reference(cl, dtype):
    out = {}
    for on in (True, False):
        A.RELU_FAST[0] = on
        A._RELU_SEEN.clear()
        try:
            mdn.manual_seed(0)
            res = []
            for _ in range(3):
                x = mdn.randn(8, 16, 12, 12).to("cuda").to(getattr(mdn, dtype))
                if cl:
                    x = x.to(memory_format=mdn.channels_last)
                x.requires_grad_()
                g = mdn.randn(8, 16, 12, 12).to("cuda").to(getattr(mdn, dtype))
                n0 = L.launch_count()
                y = F.relu(x)
                n1 = L.launch_count()
                y.backward(g)
                cp.cuda.runtime.deviceSynchronize()
                xh, gh = _host(x), _host(g)
                np.testing.assert_array_equal(_host(y), np.maximum(xh, 0))
                np.testing.assert_array_equal(_host(x.grad), np.where(xh > 0, gh, 0))
                res.append((_host(y), _host(x.grad), n1 - n0, y.is_contiguous(memory_format=mdn.channels_last)
                            if cl else y.is_contiguous()))
            out[on] = res
            if on:
                assert A._RELU_SEEN, "the shortcut served no call"
        finally:
            A.RELU_FAST[0] = True
    for a, b in zip(out[True], out[False]):
        assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]) and a[2:] == b[2:]


def test_lenet_steps_bit_identical_with_shortcuts_on_and_off():
    params = {}
    for on in (True, False):
        A.RELU_FAST[0] = on
        A._RELU_SEEN.clear()
        P._SEEN_POOL.clear()
        try:
            mdn.manual_seed(0)
            m = mdn.models.LeNet5(num_classes=10, in_channels=1, input_size=32).to("cuda")
            opt = mdn.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
            x = mdn.randn(64, 1, 32, 32).to("cuda")
            y = mdn.randint(0, 10, (64,)).to("cuda")
            seen = []
            for _ in range(3):
                loss = F.cross_entropy(m(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                seen.append([cp.asnumpy(p.data).copy() for p in m.parameters()])
            params[on] = seen
        finally:
            A.RELU_FAST[0] = True
    for a, b in zip(params[True], params[False]):
        for pa, pb in zip(a, b):
            assert np.array_equal(pa.view(np.uint8), pb.view(np.uint8))

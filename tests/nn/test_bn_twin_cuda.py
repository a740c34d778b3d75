"""On a GPU: batch norm's speculative twin (nn/_functions/norm.py ``TWIN``, docs/fusion.md "Batch norm's forward
writes relu(y) too") changes no bit of training.  ResNet-20 and MobileNet-small (b16, 32x32) train five SGD steps from
the same start with the switch off and on -- float32 NCHW and bf16 autocast channels-last -- and every loss,
gradient, parameter and running statistic must be bit-identical; from the third step on the twin is taken at every
BN -> ReLU pair (10 in ResNet-20, 9 in MobileNet-small) and the step launches that many kernels fewer.  A residual
block's step captured in a CUDA graph with the switch on (the twins taken during the capture) replays the eager
switch-off step's bits.  The launches on the CPU: test_bn_twin.py; the kernels: tests/backend/test_bn_twin.py."""
import numpy as np
import pytest

from minidnn.backend import devices as _dev

pytestmark = pytest.mark.cuda

if not _dev.cuda_is_available():
    pytest.skip("no CUDA GPU with CuPy on this machine", allow_module_level=True)

import cupy as cp  # noqa: E402

import minidnn as mdn  # noqa: E402
import minidnn.models as MODELS  # noqa: E402
from minidnn.backend.cuda import launch as L  # noqa: E402
from minidnn.nn import functional as F  # noqa: E402
from minidnn.nn._functions import norm as N  # noqa: E402

_PAIRS = {"resnet20": 10, "mobilenet": 9}


def _bits(t):
    return cp.asnumpy(cp.ascontiguousarray(t.data)).reshape(-1).view(np.uint8).copy()


@pytest.fixture
def taken(monkeypatch):
    """Counts the twins the kernels wrote and the ones relu handed out."""
    n = {"written": 0, "taken": 0}
    real_twin, real_node = N._Remembered._twin, N._Remembered.relu_node
    monkeypatch.setattr(N, "TWIN", [N.TWIN[0]])        # the tests set it; the module's own list is left as it was

    def twin(self, *a):
        out = real_twin(self, *a)
        n["written"] += out is not None
        if out is not None:
            n["last"] = out[3]
        return out

    def relu_node(self, bn, y):
        r = real_node(self, bn, y)
        n["taken"] += r is not None and n.get("last") is not None and r.data is n["last"]
        return r
    monkeypatch.setattr(N._Remembered, "_twin", twin)
    monkeypatch.setattr(N._Remembered, "relu_node", relu_node)
    yield n


def _model(name):
    return MODELS.resnet20() if name == "resnet20" else MODELS.MobileNetSmall()


def _train(name, twin, amp, cl, taken, steps=5):
    N.TWIN[0] = twin
    N._REMEMBERED.clear()
    mdn.manual_seed(0)
    model = _model(name).to("cuda")
    opt = mdn.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x = mdn.randn(16, 3, 32, 32).to("cuda")
    labels = mdn.tensor(np.arange(16) % 10).to("cuda")
    if cl:
        model.to(memory_format=mdn.channels_last)
        x = x.to(memory_format=mdn.channels_last)
    bits, launches, counts = [], [], []
    for _ in range(steps):
        n0, t0 = L.launch_count(), dict(taken)
        with mdn.autocast("cuda", dtype=mdn.bfloat16, enabled=amp):
            loss = F.cross_entropy(model(x), labels)
        opt.zero_grad()
        loss.backward()
        bits.append(_bits(loss))
        bits += [_bits(p.grad) for p in model.parameters()]
        opt.step()
        launches.append(L.launch_count() - n0)
        counts.append((taken["written"] - t0["written"], taken["taken"] - t0["taken"]))
    bits += [_bits(p) for p in model.parameters()]
    bits += [_bits(b) for b in model.buffers()]
    return bits, launches, counts


# (two combinations a model keep the device run short; tests/backend/test_bn_twin.py covers every dtype and route)
@pytest.mark.parametrize("amp, cl", [(False, False), (True, True)], ids=["fp32_nchw", "bf16_cl"])
@pytest.mark.parametrize("name", list(_PAIRS))
def test_training_is_bitwise_the_same_with_the_twin(name, amp, cl, taken):
    off, off_launches, off_counts = _train(name, False, amp, cl, taken)
    on, on_launches, on_counts = _train(name, True, amp, cl, taken)
    assert len(on) == len(off)
    for i, (a, b) in enumerate(zip(on, off)):
        assert a.shape == b.shape and np.array_equal(a, b), f"array {i} differs"
    pairs = _PAIRS[name]
    assert off_counts == [(0, 0)] * 5
    assert on_counts[:2] == [(0, 0)] * 2 and on_counts[2:] == [(pairs, pairs)] * 3
    assert [a - b for a, b in zip(off_launches[3:], on_launches[3:])] == [pairs] * 2


@pytest.mark.parametrize("cl", [False, True], ids=["nchw", "cl"])
def test_a_captured_step_with_the_twin_replays_the_eager_bits(cl, taken):
    """A residual block (conv-bn-relu-conv-bn + x, relu) trained with SGD: eager with the twin off, and captured
    (warm-up on a side stream, then mdn.cuda.graph) with it on; 5 steps each, the same parameters."""
    def make(twin):
        N.TWIN[0] = twin
        N._REMEMBERED.clear()
        mdn.manual_seed(0)
        nn = mdn.nn
        block = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
                              nn.Conv2d(16, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16)).to("cuda")
        opt = mdn.optim.SGD(block.parameters(), lr=0.05, momentum=0.9)
        x = mdn.randn(32, 16, 32, 32, device="cuda")
        if cl:
            block.to(memory_format=mdn.channels_last)
            x = x.to(memory_format=mdn.channels_last)

        def step():
            loss = F.relu(block(x) + x).square().mean()
            opt.zero_grad(set_to_none=False)
            loss.backward()
            opt.step()
        return block, step

    eager, eager_step = make(False)
    for _ in range(3 + 5):
        eager_step()
    block, step = make(True)
    s = mdn.cuda.Stream()
    s.wait_stream(mdn.cuda.current_stream())
    with mdn.cuda.stream(s):
        for _ in range(3):
            step()
    mdn.cuda.current_stream().wait_stream(s)
    before = dict(taken)
    g = mdn.cuda.CUDAGraph()
    with mdn.cuda.graph(g):
        step()
    assert taken["written"] - before["written"] == 1 and taken["taken"] - before["taken"] == 1
    for _ in range(5):
        g.replay()
    mdn.cuda.synchronize()
    for p, q in zip(block.parameters(), eager.parameters()):
        np.testing.assert_array_equal(p.cpu().numpy(), q.cpu().numpy())
    for p, q in zip(block.buffers(), eager.buffers()):
        np.testing.assert_array_equal(p.cpu().numpy(), q.cpu().numpy())

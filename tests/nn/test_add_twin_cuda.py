"""On a GPU: the residual add's speculative twin (nn/_functions/norm.py ``ADD_TWIN``, docs/fusion.md "The residual add
writes relu(a) too") changes no bit of training.  ResNet-20 (b16, 32x32) trains five SGD steps from the same start
with the switch off and on -- float32 and bf16 autocast, NCHW and channels-last -- and every loss, gradient,
parameter and running statistic must be bit-identical; from the third step on the twin is written and taken at every
residual block (9) and the step launches 9 kernels fewer.  A residual block's step captured in a CUDA graph with the
switch on (the twin taken during the capture) replays the eager switch-off step's bits.  The launches on the CPU:
test_add_twin.py; the kernel's bits: tests/backend/test_add_twin.py."""
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

_BLOCKS = 9         # ResNet-20's residual blocks: relu(bn2(conv2(h)) + shortcut)


def _bits(t):
    return cp.asnumpy(cp.ascontiguousarray(t.data)).reshape(-1).view(np.uint8).copy()


@pytest.fixture
def taken(monkeypatch):
    """Counts the twins the add wrote and the ones add_relu_node handed out; the switches restored afterwards."""
    n = {"written": 0, "taken": 0}
    real_twin, real_node = N._Remembered.add_twin, N._Remembered.add_relu_node
    saved = (N.ADD_TWIN[0], N.TWIN[0])

    def add_twin(self, *a):
        out = real_twin(self, *a)
        n["written"] += out is not None
        if out is not None:
            n["last"] = out[0]
        return out

    def add_relu_node(self, bn, a, z_edge):
        r = real_node(self, bn, a, z_edge)
        n["taken"] += r is not None and n.get("last") is not None and r.data is n["last"]
        return r
    monkeypatch.setattr(N._Remembered, "add_twin", add_twin)
    monkeypatch.setattr(N._Remembered, "add_relu_node", add_relu_node)
    yield n
    N.ADD_TWIN[0], N.TWIN[0] = saved


def _train(twin, amp, cl, taken, steps=5):
    N.ADD_TWIN[0] = twin
    N._REMEMBERED.clear()
    mdn.manual_seed(0)
    model = MODELS.resnet20().to("cuda")
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


@pytest.mark.parametrize("amp, cl", [(False, False), (True, False), (False, True), (True, True)],
                         ids=["fp32_nchw", "bf16_nchw", "fp32_cl", "bf16_cl"])
def test_resnet20_training_is_bitwise_the_same_with_the_add_twin(amp, cl, taken):
    off, off_launches, off_counts = _train(False, amp, cl, taken)
    on, on_launches, on_counts = _train(True, amp, cl, taken)
    assert len(on) == len(off)
    for i, (a, b) in enumerate(zip(on, off)):
        assert a.shape == b.shape and np.array_equal(a, b), f"array {i} differs"
    assert off_counts == [(0, 0)] * 5
    assert on_counts[:2] == [(0, 0)] * 2 and on_counts[2:] == [(_BLOCKS, _BLOCKS)] * 3
    assert [a - b for a, b in zip(off_launches[2:], on_launches[2:])] == [_BLOCKS] * 3


@pytest.mark.parametrize("cl", [False, True], ids=["nchw", "cl"])
def test_a_captured_step_with_the_add_twin_replays_the_eager_bits(cl, taken):
    """A residual block (conv-bn-relu-conv-bn + x, relu) trained with SGD: eager with the twin off, and captured
    (warm-up on a side stream, then mdn.cuda.graph) with it on; 5 steps each, the same parameters."""
    def make(twin):
        N.ADD_TWIN[0] = twin
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

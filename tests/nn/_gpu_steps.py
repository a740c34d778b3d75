"""The training runs behind the GPU tests of the twins (through _twin_steps.py) and of session 16's layout changes
(test_conv_filter_keep_cuda.py, test_bn_dx_nhwc_cuda.py, test_twin_nhwc_cuda.py): a model trained a few SGD steps
with every loss, gradient, parameter and buffer kept as bits, and a step captured in a CUDA graph against the same
step run eagerly.  No GPU check here: the module only imports minidnn (the callers skip without a GPU)."""
import numpy as np

import minidnn as mdn
import minidnn.models as MODELS
from minidnn.backend.cuda import launch as L
from minidnn.nn import functional as F


def train(bits, amp, name="resnet20", cl=False, batch=16, steps=5, after_step=None):
    """``steps`` SGD steps of ResNet-20 or MobileNet-small (``name``; b``batch``, 32x32, seed 0; the forward under
    bfloat16 autocast with ``amp``; model and input channels-last with ``cl``): (every loss, gradient, parameter and
    buffer as ``bits(tensor)`` gives them, the launches of each step, what ``after_step()`` returned after each
    step)."""
    mdn.manual_seed(0)
    model = (MODELS.resnet20() if name == "resnet20" else MODELS.MobileNetSmall()).to("cuda")
    opt = mdn.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x = mdn.randn(batch, 3, 32, 32).to("cuda")
    labels = mdn.tensor(np.arange(batch) % 10).to("cuda")
    if cl:
        model.to(memory_format=mdn.channels_last)
        x = x.to(memory_format=mdn.channels_last)
    out, launches, after = [], [], []
    for _ in range(steps):
        n0 = L.launch_count()
        with mdn.autocast("cuda", dtype=mdn.bfloat16, enabled=amp):
            loss = F.cross_entropy(model(x), labels)
        opt.zero_grad()
        loss.backward()
        out.append(bits(loss))
        out += [bits(p.grad) for p in model.parameters()]
        opt.step()
        launches.append(L.launch_count() - n0)
        after.append(None if after_step is None else after_step())
    out += [bits(p) for p in model.parameters()] + [bits(b) for b in model.buffers()]
    return out, launches, after


def assert_replays_like_eager(build, warm, replays=5, before_capture=None, after_capture=None):
    """``build(captured)`` -> (module, step): ``warm + replays`` eager steps of ``build(False)``, against ``warm``
    eager steps of ``build(True)`` on a side stream, its capture (``mdn.cuda.graph``: the capture runs nothing) and
    ``replays`` replays; every parameter and buffer bitwise equal.  ``before_capture`` / ``after_capture``: the
    caller's checks around the capture."""
    eager, eager_step = build(False)
    for _ in range(warm + replays):
        eager_step()
    module, step = build(True)
    s = mdn.cuda.Stream()
    s.wait_stream(mdn.cuda.current_stream())
    with mdn.cuda.stream(s):
        for _ in range(warm):
            step()
    mdn.cuda.current_stream().wait_stream(s)
    if before_capture is not None:
        before_capture()
    g = mdn.cuda.CUDAGraph()
    with mdn.cuda.graph(g):
        step()
    if after_capture is not None:
        after_capture()
    for _ in range(replays):
        g.replay()
    mdn.cuda.synchronize()
    for p, q in zip(module.parameters(), eager.parameters()):
        np.testing.assert_array_equal(p.cpu().numpy(), q.cpu().numpy())
    for p, q in zip(module.buffers(), eager.buffers()):
        np.testing.assert_array_equal(p.cpu().numpy(), q.cpu().numpy())

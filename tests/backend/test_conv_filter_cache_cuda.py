"""On a GPU, with the conv filter cache switched on (conv_igemm.FILTER_CACHE; off by default): an eager training
step (weights updated every step) gives the bits of the step without the cache; a ResNet-20 training step captured
in a CUDA graph and replayed equals the same eager steps bit for bit; a model graphed in eval mode, whose weights
are changed in eager between replays, replays with the new weights, and an eager forward after the replays (no
version bump happened during them) does not read a copy kept before them.  The launches: test_conv_filter_cache.py
on the CPU."""
import numpy as np
import pytest

from minidnn.backend import devices as _dev

pytestmark = pytest.mark.cuda

if not _dev.cuda_is_available():
    pytest.skip("no CUDA GPU with CuPy on this machine", allow_module_level=True)

import minidnn as mdn  # noqa: E402
from minidnn.backend.cuda import conv_igemm as K  # noqa: E402
from minidnn.models import resnet20  # noqa: E402

F = mdn.nn.functional


@pytest.fixture
def cache_on(monkeypatch):
    monkeypatch.setattr(K, "FILTER_CACHE", [True])
    import minidnn.backend.convolution as C
    monkeypatch.setattr(C, "_FILTER_CACHE", K.FILTER_CACHE)
    yield
    K.clear_kept_filters()


def _setup(batch=32):
    mdn.manual_seed(0)
    model = resnet20(num_classes=10).to("cuda")
    opt = mdn.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x = mdn.randn(batch, 3, 32, 32, device="cuda")
    y = mdn.randint(0, 10, (batch,), device="cuda")

    def step():
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=False)
        loss.backward()
        opt.step()
        return loss
    return model, step


def _params(model):
    return [p.detach().cpu().numpy() for p in model.parameters()]


def test_eager_steps_equal_the_steps_without_the_cache(monkeypatch):
    runs = []
    for on in (False, True):
        monkeypatch.setattr(K, "FILTER_CACHE", [on])
        import minidnn.backend.convolution as C
        monkeypatch.setattr(C, "_FILTER_CACHE", K.FILTER_CACHE)
        model, step = _setup()
        losses = [float(step().item()) for _ in range(4)]
        with mdn.no_grad():
            model.eval()
            out = [model(mdn.ones(8, 3, 32, 32, device="cuda")).cpu().numpy() for _ in range(2)]
        runs.append((losses, _params(model), out, K.kept_filter_bytes()))
    K.clear_kept_filters()
    assert runs[0][0] == runs[1][0]
    for a, b in zip(runs[0][1], runs[1][1]):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(runs[0][2], runs[1][2]):
        np.testing.assert_array_equal(a, b)
    assert runs[0][3] == 0 and runs[1][3] > 0


def test_graphed_training_step_equals_eager(cache_on):
    eager_model, eager_step = _setup()
    model, step = _setup()
    s = mdn.cuda.Stream()
    s.wait_stream(mdn.cuda.current_stream())
    with mdn.cuda.stream(s):
        for _ in range(3):
            step()
    mdn.cuda.current_stream().wait_stream(s)
    g = mdn.cuda.CUDAGraph()
    with mdn.cuda.graph(g):
        step()
    for _ in range(3 + 6):
        eager_step()
    for _ in range(6):
        g.replay()
    mdn.cuda.synchronize()
    for a, b in zip(_params(model), _params(eager_model)):
        np.testing.assert_array_equal(a, b)
    # eager after the replays: the weights changed without a version bump; the kept copies are not read
    with mdn.no_grad():
        model.eval(), eager_model.eval()
        xe = mdn.randn(8, 3, 32, 32, device="cuda")
        np.testing.assert_array_equal(model(xe).cpu().numpy(), eager_model(xe).cpu().numpy())


def test_eval_graph_with_weights_changed_in_eager_between_replays(cache_on):
    mdn.manual_seed(1)
    model = resnet20(num_classes=10).to("cuda").eval()
    ref = resnet20(num_classes=10).to("cuda").eval()
    ref.load_state_dict(model.state_dict())
    x = mdn.randn(16, 3, 32, 32, device="cuda")
    with mdn.no_grad():
        for _ in range(2):
            model(x)                               # eager warm-up: copies kept at the current versions
        g = mdn.cuda.CUDAGraph()
        with mdn.cuda.graph(g):
            out = model(x)
        for k in range(3):
            for m in (model, ref):
                for p in m.parameters():
                    if p.ndim == 4:
                        p.mul_(0.9)
            g.replay()
            mdn.cuda.synchronize()
            want = ref(x).cpu().numpy()
            np.testing.assert_array_equal(out.cpu().numpy(), want)
            np.testing.assert_array_equal(model(x).cpu().numpy(), want)     # eager after a replay

"""The runs behind tests/nn/test_twins_cuda.py, shared by its two twins (docs/fusion.md): batch norm's forward that
also writes relu(y) (nn/_functions/norm.py ``TWIN``) and the residual add that also writes relu(a) (``ADD_TWIN``).
No GPU check here: the module only imports minidnn, so a fake-CuPy script can run the same steps."""
import minidnn as mdn
from minidnn.nn import functional as F
from minidnn.nn._functions import norm as N
from tests.nn import _gpu_steps as G

# kind -> (its switch, the entry method that writes a twin, where relu sits in what that returns, the node method
# that takes it)
KINDS = {"bn": ("TWIN", "_twin", 3, "relu_node"), "add": ("ADD_TWIN", "add_twin", 0, "add_relu_node")}
# twins a training step writes and takes: BN -> ReLU pairs, residual blocks
PAIRS = {"bn": {"resnet20": 10, "mobilenet": 9}, "add": {"resnet20": 9}}


def counter(monkeypatch, kind):
    """Counts the twins of ``kind`` written and the ones handed out; both switches are this test's own lists."""
    monkeypatch.setattr(N, "TWIN", [N.TWIN[0]])
    monkeypatch.setattr(N, "ADD_TWIN", [N.ADD_TWIN[0]])
    monkeypatch.setattr(N, "TWIN_NHWC", [False])     # (its shadows save launches of their own: test_twin_nhwc*)
    _, write, at, take = KINDS[kind]
    n = {"written": 0, "taken": 0}
    real_write, real_take = getattr(N._Remembered, write), getattr(N._Remembered, take)

    def wrote(self, *a):
        out = real_write(self, *a)
        n["written"] += out is not None
        if out is not None:
            n["last"] = out[at]
        return out

    def took(self, *a):
        r = real_take(self, *a)
        n["taken"] += r is not None and n.get("last") is not None and r.data is n["last"]
        return r
    monkeypatch.setattr(N._Remembered, write, wrote)
    monkeypatch.setattr(N._Remembered, take, took)
    return n


def train(kind, name, twin, amp, cl, taken, bits, steps=5):
    """Five SGD steps of ``name`` (b16, 32x32) with ``kind``'s switch ``twin``: (every loss, gradient, parameter and
    buffer as ``bits`` gives them, the launches of each step, (twins written, taken) each step)."""
    getattr(N, KINDS[kind][0])[0] = twin
    N._REMEMBERED.clear()
    last = [dict(taken)]

    def counts():
        c = (taken["written"] - last[0]["written"], taken["taken"] - last[0]["taken"])
        last[0] = dict(taken)
        return c
    return G.train(bits, amp, name, cl, steps=steps, after_step=counts)


def residual_block(kind, twin, cl):
    """(block, step): a residual block (conv-bn-relu-conv-bn + x, relu) and its SGD step, ``kind``'s switch
    ``twin``."""
    getattr(N, KINDS[kind][0])[0] = twin
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

"""A fused optimizer's flat buffers hold channels-last parameters through views made once (round 22b): a steady
step makes no view, no transpose and no layout test of them; what invalidates a view (a parameter's ``.data``
replaced, a new memory format, a new param group, load_state_dict) is handled where it happens, and the step after
it is steady again."""
import numpy as np
import pytest

import minidnn as mdn
from minidnn import nn
from minidnn.optim import _flat


@pytest.fixture
def counted(monkeypatch):
    """Counts of FlatParams.view and of _flat._memory_order calls, and of transposes of the flat buffers."""
    n = {"view": 0, "order": 0}
    view, order = _flat.FlatParams.view, _flat._memory_order

    def counting_view(self, flat, j):
        n["view"] += 1
        return view(self, flat, j)

    def counting_order(arr):
        n["order"] += 1
        return order(arr)
    monkeypatch.setattr(_flat.FlatParams, "view", counting_view)
    monkeypatch.setattr(_flat, "_memory_order", counting_order)
    return n


def _model():
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 3, groups=4),
                         nn.Flatten(), nn.Linear(4 * 6 * 6, 3))


def _step(model, opt, x):
    opt.zero_grad()
    (model(x) * mdn.arange(3)).sum().backward()
    opt.step()


def _bound(opt):
    return [(fs.param_views[j], fs.grad_views[j], p.data is fs.param_views[j])
            for fs in opt._flat_sets[0] for j, p in enumerate(fs.params)]


@pytest.mark.parametrize("opt_name", ["SGD", "Adam"])
def test_a_steady_channels_last_step_makes_no_views(opt_name, counted):
    mdn.manual_seed(0)
    model = _model().to(memory_format=mdn.channels_last)
    kw = {"lr": 0.05, "momentum": 0.9} if opt_name == "SGD" else {"lr": 0.01}
    opt = getattr(mdn.optim, opt_name)(model.parameters(), fused=True, **kw)
    x = mdn.randn(2, 3, 8, 8).to(memory_format=mdn.channels_last)
    _step(model, opt, x)                     # the first step publishes the state views (one each)
    before = _bound(opt)
    state = {id(p): dict(s) for p, s in opt.state.items()}
    counted["view"] = counted["order"] = 0
    for _ in range(3):
        _step(model, opt, x)
    assert counted == {"view": 0, "order": 0}
    after = _bound(opt)
    assert all(a[0] is b[0] and a[1] is b[1] and a[2] for a, b in zip(after, before))
    for p, s in opt.state.items():
        for k, v in s.items():
            assert v is state[id(p)][k]      # the published state views too
    w = model[0].weight
    assert w.is_contiguous(memory_format=mdn.channels_last) and not w.is_contiguous()
    assert w.grad.data is opt._flat_sets[0][0].grad_views[0]    # the gradient written in place, no copy

    # load_state_dict copies values into the same views: still bound, the next step steady
    opt.load_state_dict(opt.state_dict())
    counted["view"] = counted["order"] = 0
    _step(model, opt, x)
    _step(model, opt, x)
    assert counted["order"] == 0
    assert all(a[0] is b[0] and a[1] is b[1] and a[2] for a, b in zip(_bound(opt), before))


def test_what_invalidates_a_view_is_handled_once(counted):
    mdn.manual_seed(1)
    model = _model()
    opt = mdn.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, fused=True)
    x = mdn.randn(2, 3, 8, 8)
    _step(model, opt, x)
    fs = opt._flat_sets[0][0]
    w = model[0].weight
    pv = fs.param_views[0]
    # .data replaced by an array of the same layout: the values re-gathered into the same view
    w.data = w.data.copy() * 0.5
    want = w.data.copy()
    counted["view"] = counted["order"] = 0
    opt.zero_grad()
    fs.check_bindings()
    assert w.data is pv and np.array_equal(w.data, want) and counted["view"] == 0
    # a new memory format: laid out again (new views for this parameter), then steady
    model.to(memory_format=mdn.channels_last)
    xc = x.to(memory_format=mdn.channels_last)
    counted["view"] = counted["order"] = 0
    _step(model, opt, xc)
    assert counted["order"] >= 2 and counted["view"] > 0
    assert w.data is fs.param_views[0] and w.data is not pv
    assert w.is_contiguous(memory_format=mdn.channels_last) and not w.is_contiguous()
    counted["view"] = counted["order"] = 0
    _step(model, opt, xc)
    assert counted == {"view": 0, "order": 0}
    # a new param group: its own flat set, channels-last views made once; the first set's views kept
    extra = nn.Conv2d(4, 4, 3).to(memory_format=mdn.channels_last)
    opt.add_param_group({"params": list(extra.parameters())})
    fs2 = opt._flat_sets[1][0]
    assert extra.weight.data is fs2.param_views[0] and extra.weight.is_contiguous(memory_format=mdn.channels_last)
    assert w.data is fs.param_views[0]
    # a dtype change is refused, naming the rule
    model.to(mdn.float64)
    with pytest.raises(RuntimeError, match="moved or cast after the optimizer was built"):
        _step(model, opt, xc.to(mdn.float64))

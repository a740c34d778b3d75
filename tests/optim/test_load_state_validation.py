"""A failing optimizer call changes nothing: load_state_dict validates everything (structure, group sizes,
hyperparameters, state shapes) before it commits; a wrong-shaped gradient is refused, not broadcast."""
import copy

import numpy as np
import pytest

import minidnn as mdn
import minidnn.nn as nn


def _trained(opt_cls, fused, **kw):
    mdn.manual_seed(0)
    lin = nn.Linear(3, 2)
    opt = opt_cls(lin.parameters(), fused=fused, **kw)
    lin(mdn.randn(4, 3)).sum().backward()
    opt.step()
    return lin, opt


def _snapshot(lin, opt):
    sd = opt.state_dict()
    return ([p.numpy().copy() for p in lin.parameters()], copy.deepcopy(sd["param_groups"]),
            {k: {n: np.array(mdn.tensor(v).numpy()) for n, v in s.items()} for k, s in sd["state"].items()})


def _same(a, b):
    pa, ga, sa = a
    pb, gb, sb = b
    assert all(np.array_equal(x, y) for x, y in zip(pa, pb))
    assert ga == gb
    assert sa.keys() == sb.keys()
    for k in sa:
        assert all(np.array_equal(sa[k][n], sb[k][n]) for n in sa[k])


BAD = [
    ("negative lr", lambda sd: sd["param_groups"][0].update(lr=-1.0), ValueError, "learning rate"),
    ("bad beta", lambda sd: sd["param_groups"][0].update(betas=(1.5, 0.9)), ValueError, "beta"),
    ("wrong state shape", lambda sd: sd["state"][0].update(exp_avg=np.zeros((5, 5), np.float32)), ValueError,
     "shape"),
    ("lr ok but state wrong", lambda sd: (sd["param_groups"][0].update(lr=0.5),
                                          sd["state"][1].update(exp_avg_sq=np.zeros(7, np.float32))), ValueError,
     "shape"),
    ("missing groups", lambda sd: sd.pop("param_groups"), ValueError, "param_groups"),
    ("group size", lambda sd: sd["param_groups"][0]["params"].pop(), ValueError, "parameters"),
    ("bad state key", lambda sd: sd["state"].update({"w": {}}), ValueError, "index"),
]


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("name, corrupt, exc, match", BAD, ids=[b[0] for b in BAD])
def test_bad_state_dict_changes_nothing(name, corrupt, exc, match, fused):
    lin, opt = _trained(mdn.optim.Adam, fused, lr=0.1)
    before = _snapshot(lin, opt)
    sd = copy.deepcopy(opt.state_dict())
    corrupt(sd)
    with pytest.raises(exc, match=match):
        opt.load_state_dict(sd)
    _same(before, _snapshot(lin, opt))
    # And the optimizer still steps as before.
    lin(mdn.randn(4, 3)).sum().backward()
    opt.step()


@pytest.mark.parametrize("fused", [True, False])
def test_wrong_shaped_gradient_is_refused(fused):
    p = nn.Parameter(mdn.zeros(3))
    opt = mdn.optim.SGD([p], lr=0.1, fused=fused)
    p.grad = mdn.ones(1)
    with pytest.raises(RuntimeError, match="shape"):
        opt.step()
    np.testing.assert_array_equal(p.numpy(), np.zeros(3, np.float32))

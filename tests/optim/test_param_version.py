"""Every optimizer step bumps the version of each parameter it updates in place (fused flat-buffer and per-tensor
steps alike, as PyTorch's in-place updates do): a graph that saved a weight for backward then refuses to run after
the weight was stepped, and version-keyed caches (conv's kept filter re-layouts) see the change.  Parameters
without a gradient are not updated and keep their version."""
import pytest

import minidnn as mdn

OPTIMIZERS = [
    ("SGD", dict(lr=0.1)), ("SGD", dict(lr=0.1, momentum=0.9)), ("Adam", dict(lr=0.01)), ("AdamW", dict(lr=0.01)),
]


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("name,kw", OPTIMIZERS)
def test_step_bumps_each_updated_parameter(name, kw, fused):
    mdn.manual_seed(0)
    lin, other = mdn.nn.Linear(4, 3), mdn.nn.Linear(4, 3)
    params = list(lin.parameters()) + list(other.parameters())
    opt = getattr(mdn.optim, name)(params, fused=fused, **kw)
    lin(mdn.randn(5, 4)).sum().backward()          # `other` gets no gradient
    before = [p._version for p in params]
    values = [p.detach().numpy().copy() for p in params]
    opt.step()
    for p, v, old in zip(params, before, values):
        if p.grad is not None:
            assert p._version == v + 1
            assert (p.detach().numpy() != old).any()       # it was indeed written
        else:
            assert p._version == v
            assert (p.detach().numpy() == old).all()
    opt.step()
    assert [p._version for p in params[:2]] == [v + 2 for v in before[:2]]


@pytest.mark.parametrize("fused", [True, False])
def test_backward_after_the_weight_was_stepped_raises(fused):
    mdn.manual_seed(0)
    conv = mdn.nn.Conv2d(2, 3, 3)
    opt = mdn.optim.SGD(conv.parameters(), lr=0.1, fused=fused)
    x = mdn.randn(1, 2, 5, 5, requires_grad=True)
    conv(x).sum().backward()
    opt.step()
    y = conv(x).sum()       # saves the weight at its current version
    opt.step()              # the weight is written in place (its .grad from the first backward is still there)
    with pytest.raises(RuntimeError, match="modified by an inplace operation|in-place operation"):
        y.backward()


def test_master_weights_load_state_dict_bumps_the_model_copy():
    mdn.manual_seed(0)
    lin = mdn.nn.Linear(4, 3).to(dtype=mdn.bfloat16) if hasattr(mdn, "bfloat16") else None
    if lin is None:
        pytest.skip("no bfloat16")
    opt = mdn.optim.SGD(lin.parameters(), lr=0.1, master_weights=True)
    lin(mdn.randn(5, 4).to(dtype=mdn.bfloat16)).float().sum().backward()
    opt.step()
    state = opt.state_dict()
    before = [p._version for p in lin.parameters()]
    opt.load_state_dict(state)
    assert all(p._version > v for p, v in zip(lin.parameters(), before))

"""Module.register_full_backward_hook / register_full_backward_pre_hook: what the hooks see and what they may
change, compared with PyTorch on the same modules and inputs."""
import warnings

import numpy as np
import pytest

import minidnn as mdn
import minidnn.nn as nn

torch = pytest.importorskip("torch", reason="PyTorch is the oracle for module backward hooks")


def _arr(t):
    return None if t is None else (t.detach().numpy() if hasattr(t, "detach") else t.numpy())


class TwoIn:        # a module with two tensor arguments, a non-tensor one and two outputs
    @staticmethod
    def make(lib):
        class M(lib.nn.Module):
            def forward(self, a, b, scale):
                return a * b * scale, (a + b).sum(1)
        return M()


def _run(lib, make_module, inputs, register, loss_fn):
    seen = []
    m = make_module(lib)
    register(m, seen)
    xs = [lib.tensor(x, requires_grad=rg) if isinstance(x, np.ndarray) else x for x, rg in inputs]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = m(*xs)
        loss_fn(out).backward()
    return seen, xs


CASES = {
    "linear": (lambda lib: _lin(lib), [(np.arange(6.).reshape(2, 3), True)], lambda o: (o * o).sum()),
    "linear_no_input_grad": (lambda lib: _lin(lib), [(np.arange(6.).reshape(2, 3), False)], lambda o: o.sum()),
    "two_inputs": (TwoIn.make, [(np.ones((2, 3)), True), (np.full((2, 3), 2.0), False), (3.0, None)],
                   lambda o: (o[0] * o[0]).sum() + o[1].sum() * 2),
    "two_inputs_one_output_used": (TwoIn.make, [(np.ones((2, 3)), True), (np.full((2, 3), 2.0), True), (3.0, None)],
                                   lambda o: o[1].sum()),
}


def _lin(lib):
    m = lib.nn.Linear(3, 2).double() if lib is torch else lib.nn.Linear(3, 2, dtype=mdn.float64)
    with (torch.no_grad() if lib is torch else mdn.no_grad()):
        w = np.arange(6.).reshape(2, 3) / 10
        if lib is torch:
            m.weight.copy_(torch.tensor(w))
            m.bias.fill_(0.5)
        else:
            m.weight.data[...] = w
            m.bias.data[...] = 0.5
    return m


@pytest.mark.parametrize("name", sorted(CASES))
def test_full_backward_hook_sees_pytorchs_gradients(name):
    make, inputs, loss_fn = CASES[name]
    def reg(m, seen):
        return m.register_full_backward_hook(lambda mod, gi, go: seen.append((mod, gi, go)))

    (seen, _), (tseen, _) = _run(mdn, make, inputs, reg, loss_fn), _run(torch, make, inputs, reg, loss_fn)
    assert len(seen) == len(tseen) == 1
    (_, gi, go), (_, tgi, tgo) = seen[0], tseen[0]
    assert len(gi) == len(tgi) and len(go) == len(tgo)
    for a, b in zip(gi + go, tgi + tgo):
        assert (a is None) == (b is None)
        if a is not None:
            np.testing.assert_allclose(_arr(a), _arr(b), rtol=1e-12)


def test_hook_can_replace_grad_input_and_pre_hook_grad_output():
    for lib in (mdn, torch):
        m = _lin(lib)
        m.register_full_backward_pre_hook(lambda mod, go: (go[0] * 2,))
        m.register_full_backward_hook(lambda mod, gi, go: (gi[0] + 1,))
        x = lib.tensor(np.ones((2, 3)), requires_grad=True)
        m(x).sum().backward()
        if lib is mdn:
            got, gw = x.grad.numpy(), m.weight.grad.numpy()
        else:
            np.testing.assert_allclose(got, x.grad.numpy())
            np.testing.assert_allclose(gw, m.weight.grad.numpy())   # the pre-hook's grad_output reaches weight


def test_remove_and_order_and_nested_modules():
    calls = []
    inner = nn.Linear(3, 3)
    model = nn.Sequential(inner, nn.ReLU())
    h1 = model.register_full_backward_hook(lambda m, gi, go: calls.append("outer"))
    inner.register_full_backward_hook(lambda m, gi, go: calls.append("inner"))
    model.register_full_backward_hook(lambda m, gi, go: calls.append("first"), prepend=True)
    model(mdn.randn(2, 3, requires_grad=True)).sum().backward()
    assert calls == ["inner", "first", "outer"]      # the inner module's inputs get their gradient first
    calls.clear()
    h1.remove()
    model(mdn.randn(2, 3, requires_grad=True)).sum().backward()
    assert calls == ["inner", "first"]


def test_wrong_number_of_grad_inputs_is_an_error():
    m = nn.Linear(3, 2)
    m.register_full_backward_hook(lambda mod, gi, go: (gi[0], gi[0]))
    with pytest.raises(RuntimeError, match="invalid number of grad_input"):
        m(mdn.randn(2, 3, requires_grad=True)).sum().backward()


def test_no_grad_forward_runs_no_hooks():
    calls = []
    m = nn.Linear(3, 2)
    m.register_full_backward_hook(lambda mod, gi, go: calls.append(1))
    with mdn.no_grad():
        y = m(mdn.randn(2, 3))
    assert not y.requires_grad and calls == []


def test_hooked_module_gradients_pass_gradcheck():
    """The identity Functions around a hooked module leave its gradient unchanged (float64 gradcheck)."""
    from minidnn.autograd import gradcheck
    m = nn.Linear(3, 2, dtype=mdn.float64)
    seen = []
    m.register_full_backward_hook(lambda mod, gi, go: seen.append(1))
    m.register_full_backward_pre_hook(lambda mod, go: None)
    x = mdn.tensor(np.random.default_rng(0).standard_normal((4, 3)), requires_grad=True)
    assert gradcheck(lambda a: m(a).tanh(), (x,))
    assert seen

"""Adadelta, Adagrad, RMSprop and Optimizer.state as a defaultdict: trajectories against PyTorch's optimizers
(float64, every option), state_dict round trips, a custom optimizer writing ``self.state[p]``."""
import numpy as np
import pytest

import minidnn as mdn
from minidnn import optim

torch = pytest.importorskip("torch", reason="PyTorch is the oracle for these optimizers")

CASES = [
    ("Adadelta", {}), ("Adadelta", dict(lr=0.5, rho=0.8, eps=1e-5, weight_decay=0.1)),
    ("Adadelta", dict(maximize=True)),
    ("Adagrad", {}), ("Adagrad", dict(lr=0.1, lr_decay=0.05, weight_decay=0.1, initial_accumulator_value=0.3)),
    ("Adagrad", dict(maximize=True, eps=1e-6)),
    ("RMSprop", {}), ("RMSprop", dict(lr=0.01, alpha=0.9, momentum=0.8)),
    ("RMSprop", dict(centered=True, weight_decay=0.1)), ("RMSprop", dict(centered=True, momentum=0.5,
                                                                       maximize=True)),
]


def _run(name, kw, device, steps=6, dtype=np.float64):
    rng = np.random.default_rng(0)
    init = [rng.standard_normal(s).astype(dtype) for s in [(3, 4), (5,), ()]]
    grads = [[rng.standard_normal(a.shape).astype(dtype) for a in init] for _ in range(steps)]
    ps = [mdn.tensor(a, requires_grad=True, device=device) for a in init]
    tps = [torch.tensor(a, requires_grad=True) for a in init]
    opt, topt = getattr(optim, name)(ps, **kw), getattr(torch.optim, name)(tps, **kw)
    for t in range(steps):
        for p, tp, g in zip(ps, tps, grads[t]):
            if t == 2 and p.ndim == 0:          # a parameter without a gradient is skipped
                p.grad, tp.grad = None, None
                continue
            p.grad = mdn.tensor(g, device=device)
            tp.grad = torch.tensor(g)
        opt.step()
        topt.step()
    return ps, tps, opt, topt


@pytest.mark.parametrize("name,kw", CASES)
def test_matches_pytorch(name, kw, device):
    ps, tps, opt, topt = _run(name, kw, device)
    for p, tp in zip(ps, tps):
        np.testing.assert_allclose(p.cpu().numpy(), tp.detach().numpy(), rtol=1e-12, atol=1e-12)
    sd, tsd = opt.state_dict(), topt.state_dict()
    assert sd["state"].keys() == tsd["state"].keys()
    for k in sd["state"]:
        assert set(sd["state"][k]) == set(tsd["state"][k])
        for name_ in sd["state"][k]:
            np.testing.assert_allclose(np.asarray(mdn.tensor(sd["state"][k][name_]).cpu().numpy(), np.float64),
                                       tsd["state"][k][name_].numpy(), rtol=1e-12, atol=1e-12)
    assert {k: v for k, v in sd["param_groups"][0].items() if k != "fused"}.keys() <= \
        set(tsd["param_groups"][0]) | {"fused"}


@pytest.mark.parametrize("name,kw", CASES[::3])
def test_float32_matches(name, kw):
    ps, tps, _, _ = _run(name, kw, "cpu", dtype=np.float32)
    for p, tp in zip(ps, tps):
        assert p.dtype == np.float32
        np.testing.assert_allclose(p.numpy(), tp.detach().numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["Adadelta", "Adagrad", "RMSprop"])
def test_state_dict_round_trip_resumes_identically(name):
    kw = dict(momentum=0.9, centered=True) if name == "RMSprop" else {}
    ps, _, opt, _ = _run(name, kw, "cpu", steps=3)
    sd = opt.state_dict()
    copy = [mdn.tensor(p.numpy().copy(), requires_grad=True) for p in ps]
    opt2 = getattr(optim, name)(copy, **kw)
    opt2.load_state_dict(sd)
    for a, b in zip(ps, copy):
        g = np.full(a.shape, 0.3)
        a.grad, b.grad = mdn.tensor(g), mdn.tensor(g)
    opt.step()
    opt2.step()
    for a, b in zip(ps, copy):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


@pytest.mark.parametrize("name,bad,msg", [("Adadelta", dict(rho=1.5), "rho"), ("Adagrad", dict(lr=-1), "learning"),
                                          ("Adagrad", dict(lr_decay=-1), "lr_decay"),
                                          ("RMSprop", dict(alpha=-0.1), "alpha"),
                                          ("RMSprop", dict(momentum=-1), "momentum"),
                                          ("RMSprop", dict(eps=-1), "epsilon")])
def test_bad_hyperparameters(name, bad, msg):
    p = mdn.zeros(2, requires_grad=True)
    with pytest.raises(ValueError, match=msg):
        getattr(optim, name)([p], **bad)
    with pytest.raises(ValueError):
        getattr(torch.optim, name)([torch.zeros(2, requires_grad=True)], **bad)


def test_state_is_a_defaultdict_for_custom_optimizers():
    """A PyTorch-style custom optimizer (momentum SGD written in step) runs unchanged and checkpoints."""
    def make(lib, opt_base):
        class Custom(opt_base):
            def __init__(self, params, lr=0.1, beta=0.9):
                super().__init__(params, dict(lr=lr, beta=beta))

            def step(self, closure=None):
                for group in self.param_groups:
                    for p in group["params"]:
                        if p.grad is None:
                            continue
                        state = self.state[p]
                        if "buf" not in state:
                            state["buf"] = p.grad.detach().clone()
                            state["count"] = 0
                        else:
                            state["buf"] = state["buf"] * group["beta"] + p.grad.detach()
                        state["count"] += 1
                        with lib.no_grad():
                            p -= group["lr"] * state["buf"]
        return Custom
    rng = np.random.default_rng(3)
    w0 = rng.standard_normal((4, 3))
    x = rng.standard_normal((5, 4))
    out = []
    for lib, base in ((mdn, optim.Optimizer), (torch, torch.optim.Optimizer)):
        w = lib.tensor(w0.copy(), requires_grad=True)
        opt = make(lib, base)([w])
        for step in range(5):
            if step == 3:             # resume from a checkpoint into a fresh optimizer: state comes back as written
                sd = opt.state_dict()
                opt = make(lib, base)([w])
                opt.load_state_dict(sd)
                assert isinstance(opt.state[w]["buf"], lib.Tensor) and opt.state[w]["count"] == 3
            opt.zero_grad()
            ((lib.tensor(x) @ w) ** 2).sum().backward()
            opt.step()
        out.append(w.detach().numpy())
        assert len(opt.state_dict()["state"]) == 1
    np.testing.assert_allclose(out[0], out[1], rtol=1e-12)


def test_fused_adam_state_views_survive_defaultdict():
    """The fused flat-buffer path still publishes its views into ``state`` and state_dict holds them."""
    w = mdn.tensor(np.ones((3, 2)), requires_grad=True)
    opt = optim.Adam([w], lr=0.1)
    assert opt.param_groups[0]["fused"]
    assert opt.state.get(w) is None and len(opt.state_dict()["state"]) == 0
    w.grad = mdn.tensor(np.full((3, 2), 0.5))
    opt.step()
    assert set(opt.state[w]) == {"step", "exp_avg", "exp_avg_sq"}
    assert float(opt.state_dict()["state"][0]["step"]) == 1.0


@pytest.mark.parametrize("name", ["Adadelta", "Adagrad", "RMSprop"])
def test_pytorch_only_flags_are_accepted_or_refused_clearly(name):
    p = mdn.zeros(2, requires_grad=True)
    getattr(optim, name)([p], foreach=False)             # accepted: one implementation either way
    with pytest.raises(NotImplementedError, match="differentiable"):
        getattr(optim, name)([p], differentiable=True)

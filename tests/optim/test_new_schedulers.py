"""LambdaLR, MultiplicativeLR, ConstantLR, PolynomialLR, SequentialLR, and the existing schedulers' parity (LinearLR,
OneCycleLR, ReduceLROnPlateau, step(epoch) closed forms, resuming with last_epoch): lr (and momentum) trajectories
compared step by step with torch.optim.lr_scheduler."""
import math
import warnings

import numpy as np
import pytest

import minidnn as mdn
from minidnn import optim
from minidnn.optim import lr_scheduler as mls

torch = pytest.importorskip("torch", reason="PyTorch is the oracle for the schedulers")
tls = torch.optim.lr_scheduler


def _opts(opt_name="SGD", groups=2, **kw):
    kw = kw or (dict(lr=0.1, momentum=0.9) if opt_name == "SGD" else dict(lr=0.01))
    ps = [[mdn.zeros(2, requires_grad=True)] for _ in range(groups)]
    tps = [[torch.zeros(2, requires_grad=True)] for _ in range(groups)]
    pg = [{"params": p, "lr": kw["lr"] * (i + 1)} for i, p in enumerate(ps)]
    tpg = [{"params": p, "lr": kw["lr"] * (i + 1)} for i, p in enumerate(tps)]
    return getattr(optim, opt_name)(pg, **kw), getattr(torch.optim, opt_name)(tpg, **kw)


def _mom(opt):
    return [g["betas"][0] if "betas" in g else g.get("momentum") for g in opt.param_groups]


def _compare(make, steps=25, opt_name="SGD", metric=None):
    opt, topt = _opts(opt_name)
    s, ts = make(mls, opt), make(tls, topt)
    for t in range(steps):
        np.testing.assert_allclose(s.get_last_lr(), ts.get_last_lr(), rtol=1e-12, atol=0, err_msg=f"step {t}")
        np.testing.assert_allclose([g["lr"] for g in opt.param_groups], [g["lr"] for g in topt.param_groups],
                                   rtol=1e-12)
        assert _mom(opt) == pytest.approx(_mom(topt), rel=1e-12)
        opt.step()
        topt.step()
        if metric is None:
            s.step()
            ts.step()
        else:
            s.step(metric(t))
            ts.step(metric(t))
    return s, ts


class Warmup:                 # a callable object: its __dict__ goes into state_dict
    def __init__(self, n):
        self.n = n

    def __call__(self, epoch):
        return min(1.0, (epoch + 1) / self.n)


MAKERS = {
    "lambda": lambda m, o: m.LambdaLR(o, lambda e: 0.95 ** e),
    "lambda_list": lambda m, o: m.LambdaLR(o, [lambda e: 1 / (e + 1), Warmup(4)]),
    "multiplicative": lambda m, o: m.MultiplicativeLR(o, lambda e: 0.9),
    "constant": lambda m, o: m.ConstantLR(o, factor=0.5, total_iters=4),
    "linear": lambda m, o: m.LinearLR(o, start_factor=0.2, end_factor=0.9, total_iters=7),
    "polynomial": lambda m, o: m.PolynomialLR(o, total_iters=10, power=2.0),
    "step": lambda m, o: m.StepLR(o, 3, gamma=0.5),
    "multistep": lambda m, o: m.MultiStepLR(o, [2, 5, 5, 9], gamma=0.5),
    "exponential": lambda m, o: m.ExponentialLR(o, 0.9),
    "cosine": lambda m, o: m.CosineAnnealingLR(o, T_max=6, eta_min=0.001),
    "sequential": lambda m, o: m.SequentialLR(o, [m.LinearLR(o, 0.1, total_iters=5),
                                                   m.CosineAnnealingLR(o, T_max=10)], milestones=[5]),
    "sequential3": lambda m, o: m.SequentialLR(o, [m.ConstantLR(o, 0.25, total_iters=3),
                                                    m.ExponentialLR(o, 0.8), m.StepLR(o, 2, 0.5)],
                                                milestones=[4, 11]),
    "chained": lambda m, o: m.ChainedScheduler([m.ConstantLR(o, 0.5, total_iters=4), m.ExponentialLR(o, 0.9)]),
    "warm_restarts": lambda m, o: m.CosineAnnealingWarmRestarts(o, T_0=3, T_mult=2, eta_min=0.01),
    "warm_restarts_1": lambda m, o: m.CosineAnnealingWarmRestarts(o, T_0=4),
    "onecycle": lambda m, o: m.OneCycleLR(o, max_lr=[0.5, 1.0], total_steps=26),
    "onecycle_linear3": lambda m, o: m.OneCycleLR(o, max_lr=0.3, epochs=2, steps_per_epoch=13, pct_start=0.25,
                                                   anneal_strategy="linear", three_phase=True, div_factor=10),
}


@pytest.mark.parametrize("name", sorted(MAKERS))
def test_trajectory_matches_pytorch(name):
    _compare(MAKERS[name])


@pytest.mark.parametrize("name", ["onecycle", "lambda"])
def test_with_adam_betas(name):
    _compare(MAKERS[name], opt_name="Adam")


@pytest.mark.parametrize("kw", [{}, dict(mode="max", factor=0.5, patience=2, threshold_mode="abs", threshold=0.1),
                                dict(patience=1, cooldown=2, min_lr=[0.02, 0.05], eps=1e-3)])
def test_reduce_on_plateau_matches_pytorch(kw):
    def metric(t):
        return [5, 4, 4, 4.5, 4, 4, 3.9999, 3, 3, 3, 3, 3, 3, 3, 2][t % 15] * (1 + 0.01 * (t // 15))

    s, ts = _compare(lambda m, o: m.ReduceLROnPlateau(o, **kw), steps=40, metric=metric)
    assert s.best == ts.best and s.num_bad_epochs == ts.num_bad_epochs and s.last_epoch == ts.last_epoch


@pytest.mark.parametrize("name", ["step", "multistep", "exponential", "cosine", "linear", "constant", "polynomial",
                                  "warm_restarts", "warm_restarts_1"])
def test_step_with_epoch_uses_closed_form(name):
    opt, topt = _opts()
    s, ts = MAKERS[name](mls, opt), MAKERS[name](tls, topt)
    for epoch in [3, 7, 2, 12, 0]:
        s.step(epoch)
        with warnings.catch_warnings():            # PyTorch warns that step(epoch) is deprecated
            warnings.simplefilter("ignore")
            ts.step(epoch)
        np.testing.assert_allclose(s.get_last_lr(), ts.get_last_lr(), rtol=1e-12)


@pytest.mark.parametrize("name", ["exponential", "linear", "polynomial", "cosine", "multiplicative"])
def test_resume_with_last_epoch_keeps_lr(name):
    opt, topt = _opts()
    for o in (opt, topt):
        for g in o.param_groups:
            g["initial_lr"] = g["lr"]
            g["lr"] = g["lr"] * 0.37
    make = {"exponential": lambda m, o: m.ExponentialLR(o, 0.9, last_epoch=4),
            "linear": lambda m, o: m.LinearLR(o, 0.2, total_iters=8, last_epoch=3),
            "polynomial": lambda m, o: m.PolynomialLR(o, total_iters=10, last_epoch=2),
            "cosine": lambda m, o: m.CosineAnnealingLR(o, T_max=9, last_epoch=3),
            "multiplicative": lambda m, o: m.MultiplicativeLR(o, lambda e: 0.9, last_epoch=5)}[name]
    s, ts = make(mls, opt), make(tls, topt)
    for _ in range(6):
        np.testing.assert_allclose(s.get_last_lr(), ts.get_last_lr(), rtol=1e-12)
        s.step()
        ts.step()


def test_state_dict_round_trip_sequential_and_lambda():
    opt, _ = _opts()
    w = Warmup(6)
    s = mls.SequentialLR(opt, [mls.LambdaLR(opt, [w, lambda e: 1.0]), mls.ExponentialLR(opt, 0.7)], [6])
    for _ in range(4):
        s.step()
    sd = s.state_dict()
    assert sd["_schedulers"][0]["lr_lambdas"] == [{"n": 6}, None]
    expect = []
    for _ in range(5):
        s.step()
        expect.append(s.get_last_lr())
    opt2, _ = _opts()
    for g, g2 in zip(opt.param_groups, opt2.param_groups):
        g2["initial_lr"] = g["initial_lr"]
    w2 = Warmup(99)
    s2 = mls.SequentialLR(opt2, [mls.LambdaLR(opt2, [w2, lambda e: 1.0]), mls.ExponentialLR(opt2, 0.7)], [6])
    s2.load_state_dict(sd)
    for i, g2 in enumerate(opt2.param_groups):        # the optimizer's lrs come from its own state_dict
        g2["lr"] = sd["_last_lr"][i]
    assert w2.n == 6
    got = []
    for _ in range(5):
        s2.step()
        got.append(s2.get_last_lr())
    np.testing.assert_allclose(got, expect, rtol=1e-12)


@pytest.mark.parametrize("bad,exc,msg", [
    (lambda m, o: m.LambdaLR(o, [lambda e: 1.0]), ValueError, "Expected 2 lr_lambdas"),
    (lambda m, o: m.LambdaLR(o, 3), TypeError, "function"),
    (lambda m, o: m.SequentialLR(o, [m.ExponentialLR(o, 0.9)], milestones=[3]), ValueError, "milestone"),
    (lambda m, o: m.SequentialLR(o, [], milestones=[]), ValueError, "at least one"),
    (lambda m, o: m.SequentialLR(o, [m.ReduceLROnPlateau(o), m.ExponentialLR(o, 0.9)], [2]), ValueError,
     "ReduceLROnPlateau"),
    (lambda m, o: m.ConstantLR(o, factor=1.5), ValueError, "between 0 and 1"),
    (lambda m, o: m.ReduceLROnPlateau(o, min_lr=[0.1]), ValueError, "min_lrs"),
])
def test_bad_arguments(bad, exc, msg):
    opt, topt = _opts()
    with pytest.raises(exc, match=msg):
        bad(mls, opt)
    with pytest.raises((ValueError, TypeError)):
        bad(tls, topt)


def test_onecycle_past_total_steps_raises():
    opt, _ = _opts()
    s = mls.OneCycleLR(opt, max_lr=0.1, total_steps=3)
    for _ in range(2):
        s.step()
    with pytest.raises(ValueError, match="total steps is 3"):
        s.step()
        s.step()
    assert math.isfinite(opt.param_groups[0]["lr"])

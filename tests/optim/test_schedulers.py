"""Learning-rate schedulers against torch.optim.lr_scheduler: the lrs of 30 steps, two param groups."""
import math

import numpy as np
import pytest

import minidnn as mdn
from minidnn import optim
from minidnn.nn import Parameter
from minidnn.optim import lr_scheduler as sched

torch = pytest.importorskip("torch")

SCHEDULERS = [
    ("StepLR", dict(step_size=7, gamma=0.5)),
    ("MultiStepLR", dict(milestones=[3, 10, 10, 20], gamma=0.3)),
    ("ExponentialLR", dict(gamma=0.9)),
    ("CosineAnnealingLR", dict(T_max=8, eta_min=1e-3)),
    ("LinearLR", dict(start_factor=0.2, end_factor=0.9, total_iters=12)),
    ("LinearLR", dict()),
    ("OneCycleLR", dict(max_lr=[0.5, 0.2], total_steps=31)),
    ("OneCycleLR", dict(max_lr=0.3, epochs=4, steps_per_epoch=8, anneal_strategy="linear", three_phase=True)),
]
IDS = [f"{name}-{i}" for i, (name, _) in enumerate(SCHEDULERS)]


def _pair(opt_name="SGD"):
    p, q = Parameter(mdn.zeros(2)), Parameter(mdn.zeros(3))
    tp, tq = torch.zeros(2, requires_grad=True), torch.zeros(3, requires_grad=True)
    kw = dict(lr=0.1, momentum=0.9) if opt_name == "SGD" else dict(lr=0.1)
    ours = getattr(optim, opt_name)([{"params": [p]}, {"params": [q], "lr": 0.05}], **kw)
    theirs = getattr(torch.optim, opt_name)([{"params": [tp]}, {"params": [tq], "lr": 0.05}], **kw)
    return ours, theirs


@pytest.mark.parametrize("opt_name", ["SGD", "Adam"])
@pytest.mark.parametrize("name,kwargs", SCHEDULERS, ids=IDS)
def test_matches_pytorch_over_30_steps(name, kwargs, opt_name):
    ours, theirs = _pair(opt_name)
    s, ts = getattr(sched, name)(ours, **kwargs), getattr(torch.optim.lr_scheduler, name)(theirs, **kwargs)
    for step in range(30):
        np.testing.assert_allclose(s.get_last_lr(), ts.get_last_lr(), rtol=1e-12, atol=0, err_msg=f"step {step}")
        for g, tg in zip(ours.param_groups, theirs.param_groups):
            assert g["lr"] == pytest.approx(tg["lr"], rel=1e-12)
            key = "momentum" if opt_name == "SGD" else "betas"
            assert np.allclose(g[key], tg[key], rtol=1e-12)
        ours.step()
        theirs.step()
        s.step()
        ts.step()


def test_reduce_lr_on_plateau_matches_pytorch():
    ours, theirs = _pair()
    kw = dict(mode="min", factor=0.5, patience=2, threshold=0.01, cooldown=1, min_lr=[0.01, 0.02])
    s, ts = sched.ReduceLROnPlateau(ours, **kw), torch.optim.lr_scheduler.ReduceLROnPlateau(theirs, **kw)
    metrics = [1.0, 0.9, 0.95, 0.91, 0.92, 0.93, 0.5, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6] + [0.6] * 17
    for m in metrics:
        s.step(m)
        ts.step(m)
        assert s.get_last_lr() == pytest.approx(ts.get_last_lr(), rel=1e-12)
    assert s.get_last_lr()[0] < 0.1


@pytest.mark.parametrize("name,kwargs", SCHEDULERS, ids=IDS)
def test_state_dict_resumes(name, kwargs):
    ours, _ = _pair()
    s = getattr(sched, name)(ours, **kwargs)
    for _ in range(9):
        s.step()
    saved, saved_groups = s.state_dict(), [dict(g) for g in ours.param_groups]
    expected = []
    for _ in range(9):
        s.step()
        expected.append(s.get_last_lr())
    ours2, _ = _pair()
    for g, sg in zip(ours2.param_groups, saved_groups):
        g.update({k: v for k, v in sg.items() if k != "params"})
    s2 = getattr(sched, name)(ours2, **kwargs, last_epoch=8) if name != "OneCycleLR" else \
        getattr(sched, name)(ours2, **kwargs)
    s2.load_state_dict(saved)
    for g, sg in zip(ours2.param_groups, saved_groups):
        g["lr"] = sg["lr"]
    got = []
    for _ in range(9):
        s2.step()
        got.append(s2.get_last_lr())
    np.testing.assert_allclose(got, expected, rtol=1e-15)


def test_cosine_closed_form():
    ours, _ = _pair()
    s = sched.CosineAnnealingLR(ours, T_max=10)
    for t in range(1, 11):
        s.step()
        assert s.get_last_lr()[0] == pytest.approx(0.05 * (1 + math.cos(math.pi * t / 10)), abs=1e-12)


@pytest.mark.parametrize("make,message", [
    (lambda o: sched.LinearLR(o, start_factor=0), "Starting multiplicative factor"),
    (lambda o: sched.LinearLR(o, end_factor=1.5), "Ending multiplicative factor"),
    (lambda o: sched.OneCycleLR(o, max_lr=0.1), "total_steps OR"),
    (lambda o: sched.OneCycleLR(o, max_lr=0.1, total_steps=10, pct_start=2), "pct_start"),
    (lambda o: sched.ReduceLROnPlateau(o, factor=1.0), "Factor should be < 1.0"),
    (lambda o: sched.ReduceLROnPlateau(o, mode="up"), "mode up is unknown"),
])
def test_invalid_arguments(make, message):
    ours, _ = _pair()
    with pytest.raises(ValueError, match=message):
        make(ours)

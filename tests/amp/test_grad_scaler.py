"""GradScaler: the scale sequence, skipped steps and parameters equal PyTorch's step for step (planted infs), on the
fused and the per-tensor optimizer paths; state_dict; misuse errors; on a GPU the decision stays on the device."""
import numpy as np
import pytest

import minidnn as mdn
import minidnn.nn as nn
import minidnn.nn.functional as F

torch = pytest.importorskip("torch", reason="PyTorch (the test oracle) is not installed: pip install -e '.[dev]'")

PLANTED = {2: "inf", 5: "nan", 6: "inf"}          # step -> what one gradient element becomes


def _models(seed=0):
    torch.manual_seed(seed)
    tm = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    mm = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))
    for tp, mp in zip(tm.parameters(), mm.parameters()):
        mp.data[...] = tp.detach().numpy()
    return tm, mm


def _optimizers(kind, tm, mm, fused):
    if kind == "sgd":
        return (torch.optim.SGD(tm.parameters(), lr=0.1, momentum=0.9),
                mdn.optim.SGD(mm.parameters(), lr=0.1, momentum=0.9, fused=fused))
    return (torch.optim.Adam(tm.parameters(), lr=0.01),
            mdn.optim.Adam(mm.parameters(), lr=0.01, fused=fused))


def _run(kind, fused, device="cpu", steps=10, unscale_first=False):
    tm, mm = _models()
    if device != "cpu":
        mm.to(device)
    topt, mopt = _optimizers(kind, tm, mm, fused)
    tsc = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10, growth_interval=2)
    msc = mdn.amp.GradScaler(device, init_scale=2.0 ** 10, growth_interval=2)
    rng = np.random.default_rng(1)
    for step in range(steps):
        x = rng.standard_normal((5, 6)).astype(np.float32)
        y = rng.integers(0, 3, 5)
        for lib, model, opt, sc in ((torch, tm, topt, tsc), (mdn, mm, mopt, msc)):
            opt.zero_grad()
            xt = lib.tensor(x) if lib is torch else mdn.tensor(x, device=device)
            yt = lib.tensor(y) if lib is torch else mdn.tensor(y, device=device)
            loss = (torch.nn.functional if lib is torch else F).cross_entropy(model(xt), yt)
            sc.scale(loss).backward()
            if step in PLANTED:
                g = list(model.parameters())[2].grad
                g[0, 0] = float(PLANTED[step])
            if unscale_first:
                sc.unscale_(opt)
            sc.step(opt)
            sc.update()
        assert msc.get_scale() == tsc.get_scale(), f"step {step}: scale {msc.get_scale()} vs {tsc.get_scale()}"
        for tp, mp in zip(tm.parameters(), mm.parameters()):
            np.testing.assert_allclose(mdn.tensor(mp.data).cpu().numpy(), tp.detach().numpy(), rtol=2e-5, atol=1e-6,
                                       err_msg=f"step {step}")
    return msc, tsc


@pytest.mark.parametrize("kind", ["sgd", "adam"])
@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("unscale_first", [False, True])
def test_matches_pytorch_step_for_step(kind, fused, unscale_first):
    msc, tsc = _run(kind, fused, unscale_first=unscale_first)
    assert msc.state_dict() == tsc.state_dict()


@pytest.mark.cuda
@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_fused_cuda_decides_on_the_device(kind, device):
    if device != "cuda":
        pytest.skip("the device-side path is the GPU one")
    from minidnn.backend.cuda import launch
    msc, tsc = _run(kind, True, device="cuda")
    assert msc.state_dict() == tsc.state_dict()
    # One optimizer launch and one scale-update launch per scaled step (the check and unscale are inside it).
    tm, mm = _models()
    mm.to("cuda")
    opt = mdn.optim.SGD(mm.parameters(), lr=0.1, fused=True)
    sc = mdn.amp.GradScaler("cuda")
    x = mdn.randn(4, 6, device="cuda")
    for _ in range(2):
        sc.scale(mm(x).sum()).backward()
        before = launch.launch_count()
        sc.step(opt)
        sc.update()
        assert launch.launch_count() - before == 2


def test_disabled_scaler_is_a_pass_through():
    tm, mm = _models()
    opt = mdn.optim.SGD(mm.parameters(), lr=0.1)
    sc = mdn.amp.GradScaler("cpu", enabled=False)
    loss = mm(mdn.randn(2, 6)).sum()
    assert sc.scale(loss) is loss
    loss.backward()
    sc.step(opt)
    sc.update()
    assert sc.get_scale() == 1.0 and sc.state_dict() == {}


def test_misuse_raises_pytorch_errors():
    tm, mm = _models()
    opt = mdn.optim.SGD(mm.parameters(), lr=0.1)
    sc = mdn.amp.GradScaler("cpu")
    with pytest.raises(RuntimeError, match="no scale"):
        sc.step(opt)
    sc.scale(mm(mdn.randn(2, 6)).sum()).backward()
    sc.unscale_(opt)
    with pytest.raises(RuntimeError, match="already been called"):
        sc.unscale_(opt)
    sc.step(opt)
    with pytest.raises(RuntimeError, match="step\\(\\) has already been called"):
        sc.step(opt)
    with pytest.raises(RuntimeError, match="after step"):
        sc.unscale_(opt)
    with pytest.raises(RuntimeError, match="Closure"):
        sc.step(opt, closure=lambda: None)
    sc.update()
    with pytest.raises(TypeError, match="Tensor"):
        sc.scale("loss")


@pytest.mark.parametrize("kwargs, match", [
    (dict(growth_factor=1.0), "growth factor"), (dict(backoff_factor=1.5), "backoff"),
    (dict(growth_interval=0), "growth_interval"), (dict(init_scale=-1.0), "init_scale"),
    (dict(init_scale=float("nan")), "finite"),
])
def test_bad_hyperparameters(kwargs, match):
    with pytest.raises(ValueError, match=match):
        mdn.amp.GradScaler("cpu", **kwargs)


def test_state_dict_round_trip_and_validation():
    msc, _ = _run("sgd", True, steps=4)
    sd = msc.state_dict()
    other = mdn.amp.GradScaler("cpu")
    other.load_state_dict(sd)
    assert other.state_dict() == sd
    bad = dict(sd, growth_factor=0.5)
    before = other.state_dict()
    with pytest.raises(ValueError):
        other.load_state_dict(bad)
    assert other.state_dict() == before              # a failed load changes nothing
    with pytest.raises(KeyError):
        other.load_state_dict({"scale": 1.0})

"""Master weights (apex O2): float16/bfloat16 parameters updated through a float32 master copy in the fused flat
buffer equal PyTorch's float32 optimizer fed the same gradients; checkpoints hold the master copy."""
import numpy as np
import pytest

import minidnn as mdn
import minidnn.nn as nn

torch = pytest.importorskip("torch", reason="PyTorch (the test oracle) is not installed: pip install -e '.[dev]'")

KW = {"SGD": dict(lr=0.1, momentum=0.9), "Adam": dict(lr=0.01), "AdamW": dict(lr=0.01, weight_decay=0.1)}


def _train(opt_name, dtype, device, steps=4, scaler=None):
    mdn.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 6), nn.Tanh(), nn.Linear(6, 3)).to(device=device, dtype=dtype)
    masters = [torch.tensor(mdn.tensor(p.data).to(mdn.float32).cpu().numpy(), requires_grad=True)
               for p in model.parameters()]
    opt = getattr(mdn.optim, opt_name)(model.parameters(), master_weights=True, **KW[opt_name])
    topt = getattr(torch.optim, opt_name)(masters, **KW[opt_name])
    for _ in range(steps):
        x = mdn.randn(5, 8, device=device).to(dtype=dtype)
        opt.zero_grad()
        loss = model(x).float().square().mean()
        (scaler.scale(loss) if scaler else loss).backward()
        grads = [mdn.tensor(p.grad.data).to(mdn.float32).cpu().numpy() for p in model.parameters()]
        if scaler:
            grads = [g / scaler.get_scale() for g in grads]
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        for t, g in zip(masters, grads):
            t.grad = torch.tensor(g)
        topt.step()
    return model, opt, masters


@pytest.mark.parametrize("opt_name", ["SGD", "Adam", "AdamW"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_master_copy_equals_float32_optimizer(opt_name, dtype, device):
    dt = getattr(mdn, dtype)
    model, opt, masters = _train(opt_name, dt, device)
    state = opt.state_dict()["state"]
    for i, (p, ref) in enumerate(zip(model.parameters(), masters)):
        assert p.dtype == dt and p.grad.dtype == dt
        master = mdn.tensor(state[i]["master_param"]).cpu().numpy()
        assert master.dtype == np.float32
        np.testing.assert_allclose(master, ref.detach().numpy(), rtol=1e-5, atol=1e-6)
        # The model's copy is the master rounded once to the low-precision dtype.
        np.testing.assert_array_equal(mdn.tensor(p.data).to(mdn.float32).cpu().numpy(),
                                      master.astype(dt).astype(np.float32))


def test_checkpoint_holds_and_restores_the_master_copy(tmp_path, device):
    model, opt, _ = _train("Adam", mdn.bfloat16, device)
    path = tmp_path / "ckpt.pt"
    mdn.save({"model": model.state_dict(), "opt": opt.state_dict()}, path)
    ckpt = mdn.load(path)
    mdn.manual_seed(1)
    other = nn.Sequential(nn.Linear(8, 6), nn.Tanh(), nn.Linear(6, 3)).to(device=device, dtype=mdn.bfloat16)
    other_opt = mdn.optim.Adam(other.parameters(), master_weights=True, lr=0.01)
    other.load_state_dict(ckpt["model"])
    other_opt.load_state_dict(ckpt["opt"])
    for a, b in zip(opt.state_dict()["state"].values(), other_opt.state_dict()["state"].values()):
        np.testing.assert_array_equal(mdn.tensor(a["master_param"]).cpu().numpy(),
                                      mdn.tensor(b["master_param"]).cpu().numpy())
    for p, q in zip(model.parameters(), other.parameters()):
        np.testing.assert_array_equal(mdn.tensor(p.data).float().cpu().numpy(),
                                      mdn.tensor(q.data).float().cpu().numpy())


def test_with_grad_scaler_float16(device):
    scaler = mdn.amp.GradScaler(device, init_scale=2.0 ** 8)
    model, opt, masters = _train("SGD", mdn.float16, device, scaler=scaler)
    for i, ref in enumerate(masters):
        master = mdn.tensor(opt.state_dict()["state"][i]["master_param"]).cpu().numpy()
        np.testing.assert_allclose(master, ref.detach().numpy(), rtol=1e-4, atol=1e-5)


def test_master_weights_need_the_fused_path():
    lin = nn.Linear(2, 2).to(dtype=mdn.float16)
    with pytest.raises(ValueError, match="fused"):
        mdn.optim.SGD(lin.parameters(), lr=0.1, master_weights=True, fused=False)

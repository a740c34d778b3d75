"""autocast: the per-op dtype table against PyTorch's, nesting, threads, the decorator, gradients' dtypes."""
import threading

import numpy as np
import pytest

import minidnn as mdn
import minidnn.nn as nn
import minidnn.nn.functional as F

torch = pytest.importorskip("torch", reason="PyTorch (the test oracle) is not installed: pip install -e '.[dev]'")
tF = torch.nn.functional


def _ops(lib, fn):
    """(name, call(x2d, x4d, w4d, target)) rows run identically in both libraries."""
    return [
        ("conv2d", lambda a, x, w, t: fn.conv2d(x, w, padding=1)),
        ("linear", lambda a, x, w, t: fn.linear(a, a)),
        ("matmul", lambda a, x, w, t: a @ a.T),
        ("softmax", lambda a, x, w, t: fn.softmax(a, 1)),
        ("log_softmax", lambda a, x, w, t: fn.log_softmax(a, 1)),
        ("cross_entropy", lambda a, x, w, t: fn.cross_entropy(a, t)),
        ("mse_loss", lambda a, x, w, t: fn.mse_loss(a, a * 2)),
        ("l1_loss", lambda a, x, w, t: fn.l1_loss(a, a * 2)),
        ("smooth_l1_loss", lambda a, x, w, t: fn.smooth_l1_loss(a, a * 2)),
        ("layer_norm", lambda a, x, w, t: fn.layer_norm(a, (a.shape[1],))),
        ("group_norm", lambda a, x, w, t: fn.group_norm(x, 1)),
        ("sum", lambda a, x, w, t: a.sum()),
        ("prod", lambda a, x, w, t: a.prod()),
        ("add", lambda a, x, w, t: a + a),
        ("relu", lambda a, x, w, t: fn.relu(a)),
        ("cat_mixed", lambda a, x, w, t: lib.cat([a, a.to(lib.bfloat16)])),
        ("conv_then_add", lambda a, x, w, t: fn.conv2d(x, w, padding=1) + x[:, :1]),
    ]


@pytest.mark.parametrize("row", range(len(_ops(mdn, F))), ids=[n for n, _ in _ops(mdn, F)])
@pytest.mark.parametrize("input_dtype", ["float32", "bfloat16"])
def test_cpu_dtype_table_matches_pytorch(row, input_dtype):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((4, 4)).astype(np.float32)
    x = rng.standard_normal((2, 3, 5, 5)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    t = np.array([0, 1, 2, 3])
    name, mcall = _ops(mdn, F)[row]
    _, tcall = _ops(torch, tF)[row]
    mdt = mdn.bfloat16 if input_dtype == "bfloat16" else mdn.float32
    tdt = torch.bfloat16 if input_dtype == "bfloat16" else torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = tcall(torch.tensor(a).to(tdt), torch.tensor(x).to(tdt), torch.tensor(w).to(tdt), torch.tensor(t))
    with mdn.autocast("cpu", dtype=mdn.bfloat16):
        got = mcall(mdn.tensor(a).to(mdt), mdn.tensor(x).to(mdt), mdn.tensor(w).to(mdt), mdn.tensor(t))
    assert str(got.dtype) == str(expected.dtype).replace("torch.", ""), name
    # Values: the same op in the same precision agrees to bfloat16 resolution.
    got_v = got.to(mdn.float32).numpy()
    exp_v = expected.float().numpy()
    np.testing.assert_allclose(got_v, exp_v, rtol=3e-2, atol=3e-2 * max(1.0, float(np.abs(exp_v).max())))


def test_outputs_feed_fp32_code_and_gradients_come_back_in_parameter_dtype():
    mdn.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3))
    x = mdn.randn(5, 1, 8, 8)
    with mdn.autocast("cpu"):
        logits = model(x)
        assert logits.dtype == mdn.bfloat16
    loss = F.cross_entropy(logits.float(), mdn.tensor([0, 1, 2, 0, 1]))      # fp32 code outside the region
    assert loss.dtype == mdn.float32
    loss.backward()
    for p in model.parameters():
        assert p.grad is not None and p.grad.dtype == mdn.float32
    assert model[1].running_mean.dtype == mdn.float32


def test_nesting_disable_and_restore():
    a = mdn.randn(3, 3)
    with mdn.autocast("cpu"):
        assert (a @ a).dtype == mdn.bfloat16
        with mdn.autocast("cpu", enabled=False):
            assert not mdn.amp.is_autocast_enabled("cpu")
            assert (a @ a).dtype == mdn.float32
        assert mdn.amp.is_autocast_enabled("cpu")
        assert (a @ a).dtype == mdn.bfloat16
    assert not mdn.amp.is_autocast_enabled("cpu")
    assert (a @ a).dtype == mdn.float32


def test_cuda_region_does_not_touch_cpu_tensors():
    a = mdn.randn(3, 3)
    with mdn.autocast("cuda", dtype=mdn.float16):
        assert (a @ a).dtype == mdn.float32


def test_thread_local():
    a = mdn.randn(3, 3)
    seen = {}
    inside, done = threading.Event(), threading.Event()

    def other():
        inside.wait()
        seen["other"] = (a @ a).dtype
        done.set()

    th = threading.Thread(target=other)
    th.start()
    with mdn.autocast("cpu"):
        inside.set()
        done.wait(10)
        seen["main"] = (a @ a).dtype
    th.join()
    assert seen == {"main": mdn.bfloat16, "other": mdn.float32}


def test_decorator():
    @mdn.autocast("cpu")
    def f(t):
        return t @ t

    assert f(mdn.randn(2, 2)).dtype == mdn.bfloat16
    assert not mdn.amp.is_autocast_enabled("cpu")


def test_weight_cast_is_cached_within_a_region():
    lin = nn.Linear(4, 4)
    x = mdn.randn(2, 4)
    with mdn.autocast("cpu"):
        y1 = lin(x)
        y2 = lin(x)
    # Both uses read the same bfloat16 copy of the weight: one cast node feeds both products.
    assert y1.dtype == y2.dtype == mdn.bfloat16
    (y1.float().sum() + y2.float().sum()).backward()
    np.testing.assert_allclose(lin.weight.grad.numpy(), 2 * np.tile(x.numpy().sum(0), (4, 1)), rtol=2e-2, atol=2e-2)


def test_bad_arguments_are_clear():
    with pytest.raises(ValueError, match="bfloat16"):
        mdn.autocast("cpu", dtype=mdn.float16)
    with pytest.raises(RuntimeError, match="not supported"):
        mdn.autocast("tpu")
    with pytest.raises(ValueError, match="float16 and bfloat16"):
        mdn.autocast("cuda", dtype=mdn.float64)


def test_bfloat16_dtype_creation_cast_print_save(tmp_path):
    t = mdn.tensor([1.0, 2.5, -3.0], dtype=mdn.bfloat16)
    assert t.dtype == mdn.bfloat16 and t.is_floating_point()
    assert "bfloat16" in repr(t)
    assert t.float().tolist() == [1.0, 2.5, -3.0]
    path = tmp_path / "bf16.pt"
    mdn.save({"t": t, "h": t.half()}, path)
    back = mdn.load(path)
    assert back["t"].dtype == mdn.bfloat16 and back["h"].dtype == mdn.float16
    np.testing.assert_array_equal(back["t"].float().numpy(), t.float().numpy())


@pytest.mark.cuda
def test_cuda_dtype_table_matches_pytorch(device):
    if device != "cuda" or not torch.cuda.is_available():
        pytest.skip("needs a GPU on both sides")
    rng = np.random.default_rng(0)
    a = rng.standard_normal((4, 4)).astype(np.float32)
    x = rng.standard_normal((2, 3, 5, 5)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    t = np.array([0, 1, 2, 3])
    for (name, mcall), (_, tcall) in zip(_ops(mdn, F), _ops(torch, tF)):
        for ldt, tdt in ((mdn.float16, torch.float16), (mdn.bfloat16, torch.bfloat16)):
            with torch.autocast("cuda", dtype=tdt):
                expected = tcall(*(torch.tensor(v, device="cuda") for v in (a, x, w)), torch.tensor(t, device="cuda"))
            with mdn.autocast("cuda", dtype=ldt):
                got = mcall(*(mdn.tensor(v, device="cuda") for v in (a, x, w)), mdn.tensor(t, device="cuda"))
            assert str(got.dtype) == str(expected.dtype).replace("torch.", ""), (name, ldt)

"""The Tensor API: creation, attributes, conversions, devices, DLPack, and the errors bad inputs raise."""
import os
import subprocess
import sys

import numpy as np
import pytest

import minidnn as mdn
from minidnn.backend import devices as _dev


# ------------------------------------------------------------------------------------------------
# Creation
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("make, shape, check", [
    (lambda d: mdn.zeros(2, 3, device=d), (2, 3), lambda a: (a == 0).all()),
    (lambda d: mdn.zeros((2, 3), device=d), (2, 3), lambda a: (a == 0).all()),
    (lambda d: mdn.ones(4, device=d), (4,), lambda a: (a == 1).all()),
    (lambda d: mdn.ones((), device=d), (), lambda a: a == 1),
    (lambda d: mdn.full((2, 2), 7.5, device=d), (2, 2), lambda a: (a == 7.5).all()),
    (lambda d: mdn.empty(3, 1, device=d), (3, 1), lambda a: True),
    (lambda d: mdn.zeros(0, 3, device=d), (0, 3), lambda a: True),
    (lambda d: mdn.arange(5, device=d), (5,), lambda a: (a == np.arange(5)).all()),
    (lambda d: mdn.arange(1, 7, 2, device=d), (3,), lambda a: (a == [1, 3, 5]).all()),
    (lambda d: mdn.arange(0.0, 1.0, 0.25, device=d), (4,), lambda a: np.allclose(a, [0, 0.25, 0.5, 0.75])),
    (lambda d: mdn.linspace(0, 1, 5, device=d), (5,), lambda a: np.allclose(a, np.linspace(0, 1, 5))),
    (lambda d: mdn.eye(3, device=d), (3, 3), lambda a: (a == np.eye(3)).all()),
    (lambda d: mdn.eye(2, 3, device=d), (2, 3), lambda a: (a == np.eye(2, 3)).all()),
    (lambda d: mdn.rand(3, 4, device=d), (3, 4), lambda a: ((a >= 0) & (a < 1)).all()),
    (lambda d: mdn.randn(2, 5, device=d), (2, 5), lambda a: np.isfinite(a).all()),
    (lambda d: mdn.randint(2, 5, (30,), device=d), (30,), lambda a: ((a >= 2) & (a < 5)).all() and a.dtype == np.int64),
    (lambda d: mdn.randint(3, (2, 2), device=d), (2, 2), lambda a: ((a >= 0) & (a < 3)).all()),
])
def test_creation_functions(make, shape, check, device):
    t = make(device)
    assert isinstance(t, mdn.Tensor)
    assert tuple(t.shape) == shape and t.device == mdn.device(device)
    assert check(t.cpu().numpy())
    assert not t.requires_grad and t.is_leaf


def test_creation_dtype_and_requires_grad_arguments(device):
    z = mdn.zeros(2, dtype=mdn.float64, device=device, requires_grad=True)
    assert z.dtype == np.float64 and z.requires_grad and z.is_leaf and z.grad is None
    assert mdn.ones(2, dtype="int32", device=device).dtype == np.int32
    assert mdn.full((2,), 1, dtype=mdn.float16, device=device).dtype == np.float16
    assert mdn.arange(3, dtype=mdn.float64, device=device).dtype == np.float64
    assert mdn.randn(2, dtype=mdn.float64, device=device).dtype == np.float64
    assert mdn.rand(2, requires_grad=True, device=device).requires_grad
    with pytest.raises(RuntimeError, match="floating point"):
        mdn.zeros(2, dtype=mdn.int64, requires_grad=True)


def test_like_functions(device):
    base = mdn.tensor(np.ones((2, 3)), dtype=mdn.float64, device=device)
    for fn in (mdn.zeros_like, mdn.ones_like, mdn.randn_like, mdn.rand_like, mdn.empty_like):
        t = fn(base)
        assert tuple(t.shape) == (2, 3) and t.dtype == np.float64 and t.device == base.device
    assert (mdn.zeros_like(base).cpu().numpy() == 0).all()
    assert (mdn.ones_like(base).cpu().numpy() == 1).all()
    assert mdn.zeros_like(base, dtype=mdn.int32).dtype == np.int32
    assert mdn.full_like(base, 2.0).tolist() == [[2.0] * 3] * 2


def test_tensor_from_data_copies(device):
    a = np.array([1.0, 2.0])
    t = mdn.tensor(a, device=device)
    a[0] = 100.0
    assert t.tolist() == [1.0, 2.0]
    t2 = mdn.tensor(t)
    t2.add_(1.0)
    assert t.tolist() == [1.0, 2.0]
    assert mdn.tensor([[1, 2], [3, 4]], device=device).shape == (2, 2)
    assert mdn.tensor(3.0).shape == () and mdn.tensor(3.0).item() == 3.0


def test_from_numpy_shares_memory():
    a = np.arange(6.0).reshape(2, 3)
    t = mdn.from_numpy(a)
    assert t.dtype == np.float64 and t.shape == (2, 3)
    a[0, 0] = 42.0
    assert t[0, 0].item() == 42.0
    with mdn.no_grad():
        t.add_(1.0)
    assert a[0, 0] == 43.0
    with pytest.raises(TypeError, match="ndarray"):
        mdn.from_numpy([1.0, 2.0])


def test_manual_seed_reproducibility(device):
    def draw():
        return (mdn.randn(5, device=device).tolist(), mdn.rand(3, device=device).tolist(),
                mdn.randint(0, 100, (4,), device=device).tolist(), mdn.randn_like(mdn.zeros(2, device=device)).tolist())

    mdn.manual_seed(123)
    first = draw()
    mdn.manual_seed(123)
    assert draw() == first
    mdn.manual_seed(124)
    assert draw() != first


# ------------------------------------------------------------------------------------------------
# Attributes
# ------------------------------------------------------------------------------------------------
def test_attributes(device):
    x = mdn.tensor(np.zeros((2, 3, 4)), dtype=mdn.float32, device=device, requires_grad=True)
    assert x.shape == (2, 3, 4) and isinstance(x.shape, tuple)
    assert x.ndim == 3 and x.dim() == 3
    assert x.size() == (2, 3, 4) and x.size(1) == 3 and x.size(-1) == 4
    assert x.numel() == 24 and len(x) == 2
    assert x.dtype == mdn.float32 == np.float32
    assert x.device == mdn.device(device) and str(x.device) in (device, f"{device}:0")
    assert x.requires_grad and x.grad is None and x.is_leaf and x.grad_fn is None
    y = x * 2.0
    assert not y.is_leaf and y.requires_grad and y.grad_fn is not None
    z = mdn.tensor([1.0], device=device) * 2.0      # no grad anywhere: a leaf
    assert z.is_leaf and not z.requires_grad


def test_requires_grad_and_detach(device):
    x = mdn.tensor([1.0, 2.0], device=device)
    assert x.requires_grad_() is x and x.requires_grad
    x.requires_grad_(False)
    assert not x.requires_grad
    x.requires_grad_(True)
    d = (x * 2.0).detach()
    assert not d.requires_grad and d.grad_fn is None and d.is_leaf
    d2 = x.detach()
    with mdn.no_grad():
        d2.add_(1.0)                    # shares memory with x
    assert x.tolist() == [2.0, 3.0]
    with pytest.raises(RuntimeError, match="floating"):
        mdn.tensor([1, 2]).requires_grad_()
    with pytest.raises(RuntimeError, match="detach"):
        (x * 2.0).requires_grad_(False)


# ------------------------------------------------------------------------------------------------
# Conversions
# ------------------------------------------------------------------------------------------------
def test_numpy_item_tolist_array(device):
    x = mdn.tensor([[1.5, 2.0], [3.0, 4.0]], device=device)
    assert isinstance(x.cpu().numpy(), np.ndarray)
    np.testing.assert_array_equal(np.asarray(x.cpu()), [[1.5, 2.0], [3.0, 4.0]])
    np.testing.assert_array_equal(np.asarray(x.cpu(), dtype=np.float64), [[1.5, 2.0], [3.0, 4.0]])
    assert x.tolist() == [[1.5, 2.0], [3.0, 4.0]]
    assert x[0, 0].item() == 1.5 and isinstance(x[0, 0].item(), float)
    assert isinstance(mdn.tensor([3], device=device).item(), int)
    assert float(x[1, 1]) == 4.0 and int(mdn.tensor(7)) == 7
    with pytest.raises(RuntimeError, match="4 elements"):
        x.item()
    with pytest.raises(RuntimeError, match="ambiguous"):
        bool(x)


def test_numpy_shares_memory_on_cpu():
    x = mdn.tensor([1.0, 2.0])
    x.numpy()[0] = 9.0
    assert x.tolist() == [9.0, 2.0]


def test_to_dtype_and_device(device):
    x = mdn.tensor([1.5, -2.0], device=device, requires_grad=True)
    assert x.to(device) is x and x.to(dtype=x.dtype) is x
    d = x.to(mdn.float64)
    assert d.dtype == np.float64 and d.device == x.device and d.requires_grad
    assert x.to("float16").dtype == np.float16
    assert x.to(device, mdn.float64).dtype == np.float64
    assert x.to(mdn.tensor([1], dtype=mdn.int32, device=device)).dtype == np.int32
    assert x.double().dtype == np.float64 and x.float().dtype == np.float32 and x.long().dtype == np.int64
    assert x.to(mdn.int32).tolist() == [1, -2]
    assert x.cpu().device == mdn.device("cpu")
    (d * d).sum().backward()            # to() is differentiable
    assert x.grad.dtype == np.float32
    np.testing.assert_allclose(x.grad.cpu().numpy(), [3.0, -4.0])


def test_cuda_without_gpu_raises_naming_the_fix():
    if mdn.cuda.is_available():
        pytest.skip("a GPU is present")
    x = mdn.tensor([1.0])
    for call in (lambda: x.cuda(), lambda: x.to("cuda"), lambda: mdn.zeros(2, device="cuda"),
                 lambda: mdn.tensor([1.0], device="cuda:0"), lambda: mdn.device("cuda")):
        with pytest.raises(mdn.backend.CudaUnavailableError) as info:
            call()
        msg = str(info.value)
        assert "cuda" in msg.lower() and ("pip install" in msg or "device='cpu'" in msg)
    assert issubclass(mdn.backend.CudaUnavailableError, RuntimeError)


def test_cuda_module_queries():
    assert isinstance(mdn.cuda.is_available(), bool)
    assert isinstance(mdn.cuda.device_count(), int)
    assert mdn.cuda.is_available() == (mdn.cuda.device_count() > 0)
    mdn.cuda.synchronize()              # a no-op without a GPU


def test_cuda_round_trip(device):
    if device != "cuda":
        pytest.skip("round trip through a GPU needs one")
    x = mdn.tensor([1.0, 2.0], requires_grad=True)
    y = x.cuda()
    assert y.is_cuda and y.device.type == "cuda"
    (y * y).sum().backward()
    assert x.grad.device == mdn.device("cpu") and x.grad.tolist() == [2.0, 4.0]
    assert y.cpu().tolist() == [1.0, 2.0]


def test_clone_exists_and_copies(device):
    x = mdn.tensor([1.0, 2.0], device=device)
    c = x.clone()
    assert c is not x and c.tolist() == x.tolist() and c.device == x.device and c.dtype == x.dtype
    c.add_(1.0)
    assert x.tolist() == [1.0, 2.0]


# ------------------------------------------------------------------------------------------------
# DLPack
# ------------------------------------------------------------------------------------------------
def test_dlpack_with_numpy_shares_memory():
    x = mdn.tensor([1.0, 2.0, 3.0])
    a = np.from_dlpack(x)
    a[0] = 10.0
    assert x[0].item() == 10.0
    n = np.array([4.0, 5.0])
    t = mdn.from_dlpack(n)
    n[1] = 50.0
    assert t.tolist() == [4.0, 50.0] and t.dtype == np.float64
    assert x.__dlpack_device__()[0] == 1      # kDLCPU


def test_dlpack_with_torch_shares_memory():
    torch = pytest.importorskip("torch")
    x = mdn.tensor([1.0, 2.0, 3.0])
    t = torch.from_dlpack(x)
    assert t.dtype == torch.float32 and t.shape == (3,)
    t[1] = 20.0
    assert x.tolist() == [1.0, 20.0, 3.0]
    tt = torch.arange(6, dtype=torch.float64).reshape(2, 3)
    m = mdn.from_dlpack(tt)
    assert m.shape == (2, 3) and m.dtype == np.float64
    tt[0, 0] = -1.0
    assert m[0, 0].item() == -1.0
    with mdn.no_grad():
        m.mul_(2.0)
    assert tt[1, 2].item() == 10.0


def test_from_dlpack_of_a_tensor_shares_memory():
    x = mdn.tensor([1.0, 2.0])
    y = mdn.from_dlpack(x)
    y.numpy()[0] = 3.0
    assert x.tolist() == [3.0, 2.0]


# ------------------------------------------------------------------------------------------------
# The default device
# ------------------------------------------------------------------------------------------------
def test_default_device_from_monkeypatched_default(monkeypatch):
    monkeypatch.setattr(_dev, "_default", None)
    monkeypatch.setenv("MINIDNN_DEVICE", "cpu")
    assert mdn.zeros(1).device == mdn.device("cpu")
    monkeypatch.setattr(_dev, "_default", _dev.device("cpu"))
    assert mdn.tensor([1.0]).device.type == "cpu" and mdn.randn(2).device.type == "cpu"


def test_default_device_from_environment():
    code = ("import minidnn as m\n"
            "print(m.zeros(1).device)\n"
            "try:\n"
            "    m.backend.set_default_device('cpu')\n"
            "except Exception as e:\n"
            "    print(type(e).__name__)\n")
    env = dict(os.environ, MINIDNN_DEVICE="cpu")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[0] == "cpu"
    if not mdn.cuda.is_available():
        env["MINIDNN_DEVICE"] = "cuda"
        out = subprocess.run([sys.executable, "-c", "import minidnn as m\nm.zeros(1)"], env=env,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode != 0 and "CudaUnavailableError" in out.stderr


# ------------------------------------------------------------------------------------------------
# Printing, iteration
# ------------------------------------------------------------------------------------------------
def test_repr_and_iteration():
    x = mdn.tensor([1.0, 2.0], requires_grad=True)
    assert "requires_grad=True" in repr(x)
    assert "grad_fn=<MulBackward>" in repr(x * 2.0)
    assert "float64" in repr(mdn.tensor(np.zeros(2)))
    assert [t.item() for t in mdn.tensor([3, 4])] == [3, 4]
    with pytest.raises(TypeError):
        len(mdn.tensor(1.0))


# ------------------------------------------------------------------------------------------------
# Bad inputs: errors name the shapes or devices
# ------------------------------------------------------------------------------------------------
def test_matmul_shape_mismatch_names_shapes(device):
    a = mdn.zeros(2, 3, device=device)
    with pytest.raises(ValueError, match=r"\(2, 3\).*\(4, 5\)"):
        a @ mdn.zeros(4, 5, device=device)
    with pytest.raises(ValueError, match=r"\(2, 3\).*\(2,\)"):
        a @ mdn.zeros(2, device=device)
    with pytest.raises(ValueError, match=r"\(2, 2, 3\).*\(3, 3, 1\)"):
        mdn.zeros(2, 2, 3, device=device) @ mdn.zeros(3, 3, 1, device=device)
    with pytest.raises(ValueError, match=r"\(\)"):
        mdn.tensor(1.0, device=device) @ a


def test_broadcast_mismatch_names_shapes(device):
    a = mdn.zeros(2, 3, device=device)
    b = mdn.zeros(4, device=device)
    for op in (lambda: a + b, lambda: a * b, lambda: a - b, lambda: a / b, lambda: a ** b,
               lambda: mdn.maximum(a, b), lambda: mdn.where(a > 0, a, b), lambda: a < b):
        with pytest.raises(ValueError, match=r"\(2, 3\).*\(4,\)"):
            op()
    with pytest.raises(ValueError, match=r"\(2, 3\).*\(4, 3\)"):
        a.broadcast_to((4, 3))


def test_bad_reshape_names_shapes(device):
    with pytest.raises(ValueError, match=r"\(2, 3\).*\(4, 2\)"):
        mdn.zeros(2, 3, device=device).reshape(4, 2)
    with pytest.raises(ValueError, match=r"\(2, 3\)"):
        mdn.zeros(2, 3, device=device).view(5, -1)


def test_cat_and_stack_mismatch_names_shapes(device):
    a, b = mdn.zeros(2, 3, device=device), mdn.zeros(2, 4, device=device)
    with pytest.raises(ValueError, match=r"\(2, 4\).*\(2, 3\)"):
        mdn.cat([a, b], dim=0)
    assert mdn.cat([a, b], dim=1).shape == (2, 7)
    with pytest.raises(ValueError, match=r"\(2, 3\).*\(2, 4\)"):
        mdn.stack([a, b])
    with pytest.raises(ValueError, match=r"\(3,\)|dimensions"):
        mdn.cat([a, mdn.zeros(3, device=device)])


def test_backward_on_non_scalar_needs_gradient():
    x = mdn.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2.0
    with pytest.raises(RuntimeError, match=r"\(2,\).*gradient"):
        y.backward()
    with pytest.raises(RuntimeError, match=r"\(3,\).*\(2,\)"):
        y.backward(mdn.tensor([1.0, 1.0, 1.0]))
    with pytest.raises(RuntimeError, match="does not require grad"):
        mdn.tensor([1.0]).sum().backward()


def test_in_place_on_leaf_names_shape_and_fix():
    x = mdn.tensor([[1.0, 2.0]], requires_grad=True)
    with pytest.raises(RuntimeError, match=r"leaf.*\(1, 2\).*no_grad"):
        x.mul_(2.0)
    with pytest.raises(RuntimeError, match=r"leaf.*\(1, 2\)"):
        x += 1.0


def test_in_place_shape_change_raises():
    x = mdn.zeros(3)
    with pytest.raises(RuntimeError, match=r"\(2, 3\).*\(3,\)"):
        x.add_(mdn.zeros(2, 3))


def test_axis_out_of_range_raises(device):
    x = mdn.zeros(2, 3, device=device)
    for call in (lambda: x.transpose(0, 5), lambda: x.swapaxes(2, 0), lambda: x.permute(0, 2),
                 lambda: mdn.cat([x, x], dim=2), lambda: x.unsqueeze(3), lambda: x.sum(axis=(0, 2))):
        with pytest.raises((IndexError, ValueError), match=r"\(2, 3\)|out of range"):
            call()
    with pytest.raises(ValueError, match="zero-dimensional"):
        mdn.cat([mdn.tensor(1.0, device=device), mdn.tensor(2.0, device=device)])


def test_index_errors_name_shape():
    with pytest.raises(IndexError, match=r"\(2, 3\)"):
        mdn.zeros(2, 3)[5]
    with pytest.raises(IndexError, match=r"Dimension out of range.*\[-2, 1\].*got 2"):
        mdn.zeros(2, 3).sum(2)


class _FakeGPUArray(np.ndarray):
    """A NumPy array that reports itself as living on cuda:0 (a stand-in where no GPU exists)."""


def _other_device_pair(device, monkeypatch):
    """Two tensors on different devices: real cpu/cuda on a GPU machine, a faked cuda:0 tensor on cpu."""
    if device == "cuda":
        return mdn.tensor([1.0, 2.0], device="cuda", requires_grad=True), mdn.tensor([1.0, 2.0], device="cpu")
    fake = _dev.Device("cuda", 0)
    real_device_of = _dev.device_of
    monkeypatch.setattr(_dev, "device_of", lambda x: fake if isinstance(x, _FakeGPUArray) else real_device_of(x))
    gpu = mdn.Tensor._from_array(np.array([1.0, 2.0], dtype=np.float32).view(_FakeGPUArray))
    gpu.requires_grad = True
    return gpu, mdn.tensor([1.0, 2.0])


@pytest.mark.parametrize("op", ["add", "mul", "sub", "div", "pow", "matmul", "cat", "stack", "where",
                                "maximum", "lt", "add_"])
def test_device_mix_raises_naming_both_devices(op, device, monkeypatch):
    g, c = _other_device_pair(device, monkeypatch)
    calls = {
        "add": lambda: g + c, "mul": lambda: c * g, "sub": lambda: g - c, "div": lambda: g / c,
        "pow": lambda: c ** g, "matmul": lambda: g @ c, "cat": lambda: mdn.cat([c, g]),
        "stack": lambda: mdn.stack([g, c]), "where": lambda: mdn.where(c > 0, g, c),
        "maximum": lambda: mdn.maximum(g, c), "lt": lambda: g < c,
        "add_": lambda: c.add_(g.detach()),
    }
    with pytest.raises(RuntimeError) as info:
        calls[op]()
    msg = str(info.value)
    assert "cpu" in msg and "cuda" in msg, msg


def test_backward_gradient_on_wrong_device(device, monkeypatch):
    g, c = _other_device_pair(device, monkeypatch)
    y = g * 2.0
    with pytest.raises(RuntimeError, match="cpu.*cuda|cuda.*cpu"):
        y.backward(c)


def test_data_ptr_is_the_first_elements_address_as_in_pytorch():
    torch = pytest.importorskip("torch")
    a = mdn.arange(24.0, dtype=mdn.float32).reshape(2, 3, 4)
    b = torch.arange(24.0).reshape(2, 3, 4)
    base = a.data_ptr()
    assert base == a.data.__array_interface__["data"][0] and base != 0
    for idx in [(1,), (slice(None), 2), (slice(None), slice(1, None), slice(None, None, 2)), (0, 1, 3)]:
        va, vb = a[idx], b[idx]
        assert va.data_ptr() - base == vb.data_ptr() - b.data_ptr(), idx
    assert a.transpose(0, 2).data_ptr() == base == b.transpose(0, 2).data_ptr() - b.data_ptr() + base
    assert a.clone().data_ptr() != base and a.detach().data_ptr() == base
    assert mdn.zeros(0).data_ptr() == 0 == torch.zeros(0).data_ptr()
    if _dev.cuda_is_available():
        g = a.to("cuda")
        assert g.data_ptr() == g.data.data.ptr and g[1].data_ptr() - g.data_ptr() == 12 * 4


def test_an_element_is_a_zero_d_view_as_in_pytorch():
    torch = pytest.importorskip("torch")
    a, b = mdn.arange(24.0).reshape(2, 3, 4), torch.arange(24.0).reshape(2, 3, 4)
    for idx in [(0, 1, 3), (1, -1, 0), (Ellipsis, 2, 1), (1, Ellipsis, 3, None)]:
        va, vb = a[idx], b[idx]
        assert tuple(va.shape) == tuple(vb.shape) and va.data_ptr() - a.data_ptr() == vb.data_ptr() - b.data_ptr()
        va.add_(100.0)
        vb.add_(100.0)
    c = mdn.arange(5.0)
    c[3].mul_(-1.0)
    assert np.array_equal(a.numpy(), b.numpy()) and c.tolist() == [0.0, 1.0, 2.0, -3.0, 4.0]
    g = mdn.arange(6.0, requires_grad=True)
    (g[2] * 3.0).backward()                         # the view keeps its gradient path
    assert g.grad.tolist() == [0.0, 0.0, 3.0, 0.0, 0.0, 0.0]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_python_float_keeps_a_16_bit_tensors_dtype_as_in_pytorch(dtype):
    """NumPy widens a bfloat16 array by a Python float to float32; PyTorch keeps bfloat16 (a wrapped number does not
    promote a floating tensor); the values within an ulp of PyTorch's."""
    torch = pytest.importorskip("torch")
    a = mdn.arange(1, 13, dtype=mdn.float32).reshape(3, 4).to(getattr(mdn, dtype)) * 0.37
    b = torch.arange(1, 13, dtype=torch.float32).reshape(3, 4).to(getattr(torch, dtype)) * 0.37
    ops = [lambda t: t * 0.1, lambda t: t + 0.3, lambda t: t - 0.7, lambda t: t / 0.3, lambda t: 0.5 - t,
           lambda t: 0.25 * t, lambda t: 2.0 / t, lambda t: t ** 0.5, lambda t: t ** 2, lambda t: 1.5 ** t,
           lambda t: t % 0.4, lambda t: t.fmod(0.4), lambda t: t.remainder(0.4), lambda t: t * 3]
    for i, f in enumerate(ops):
        x, y = f(a), f(b)
        assert str(x.dtype).split(".")[-1] == str(y.dtype).split(".")[-1] == dtype, (i, x.dtype, y.dtype)
        # (PyTorch rounds some scalars to the dtype first: an ulp of the result, operand or scalar apart)
        ulp = 2.0 ** -7 if dtype == "bfloat16" else 2.0 ** -10
        tol = ulp * (np.abs(y.float().numpy()) + np.abs(b.float().numpy()) + 2)
        assert np.all(np.abs(x.float().numpy() - y.float().numpy()) <= tol), i
    assert (a > 0.5).dtype == mdn.bool and ((a > 0.5).numpy() == (b > 0.5).numpy()).all()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_16_bit_reductions_accumulate_in_float32_as_pytorch(dtype):
    """NumPy summed ml_dtypes' bfloat16 in bfloat16 (10,000 ones gave 256, their mean 0.0256); PyTorch accumulates
    16-bit floats in float32 and rounds the result once."""
    torch = pytest.importorskip("torch")
    md, td = getattr(mdn, dtype), getattr(torch, dtype)
    a, t = mdn.ones(10000, dtype=md), torch.ones(10000, dtype=td)
    assert a.sum().item() == t.sum().item() and a.sum().dtype == md
    assert a.mean().item() == t.mean().item() == 1.0
    assert a.cumsum(0)[-1].item() == t.cumsum(0)[-1].item()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 300)).astype(np.float32)
    xm = mdn.tensor(x).to(md)
    pm = xm * 0.01 + 1.0                                    # factors near 1 for the products
    for v, f in [(xm, lambda v: v.sum(1)), (xm, lambda v: v.mean(0)), (xm, lambda v: v.cumsum(1)),
                 (xm, lambda v: v.var(1)), (xm, lambda v: v.std(0)), (xm, lambda v: v.norm()),
                 (pm, lambda v: v.prod(1)), (pm, lambda v: v.cumprod(1))]:
        vt = torch.tensor(v.float().numpy())
        got, want = f(v), f(vt.to(td))
        assert got.dtype == md
        ref = f(vt.double()).numpy()                        # the float64 value of the same 16-bit input
        err, err_torch = np.abs(got.float().numpy() - ref), np.abs(want.float().numpy() - ref)
        ulp = np.abs(ref) * (2.0 ** -8 if dtype == "bfloat16" else 2.0 ** -11)      # half an ulp
        assert np.all(err <= np.maximum(ulp, err_torch) + 1e-6)        # correctly rounded, or as close as PyTorch


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_16_bit_mean_rounds_once_as_pytorch(dtype):
    """A 16-bit mean is PyTorch's float32 sum times 1/n, rounded once: rounding the sum to 16 bits before the
    multiply (minidnn until session 15) differed from PyTorch on ~1 in 4 rows of 300 values; the gradient too."""
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(1).standard_normal((64, 300)).astype(np.float32)
    a = mdn.tensor(x).to(getattr(mdn, dtype)).requires_grad_()
    t = torch.tensor(x).to(getattr(torch, dtype)).requires_grad_()
    for dims in (1, 0, (0, 1), None):
        got, want = (a.mean(dims), t.mean(dims)) if dims is not None else (a.mean(), t.mean())
        assert got.dtype == a.dtype and np.array_equal(got.float().detach().numpy(), want.float().detach().numpy())
    a.mean(1).sum().backward()
    t.mean(1).sum().backward()
    assert a.grad.dtype == a.dtype and np.array_equal(a.grad.float().numpy(), t.grad.float().numpy())


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_16_bit_mean_and_wide_sum_send_the_inputs_dtype_back(dtype):
    """The 16-bit mean sums in float32 and casts once; its backward must still hand x's dtype to the graph above
    (a float32 gradient reached a 16-bit convolution's backward, which refused it), as must sum(dtype=float32).
    Two elements take the float32 sum too: 40000 + 40000 overflows float16 before the halving."""
    torch = pytest.importorskip("torch")
    md = getattr(mdn, dtype)
    F = mdn.nn.functional
    mdn.manual_seed(0)
    conv = mdn.nn.Conv2d(3, 4, 3, padding=1).to(md)
    x = mdn.randn(2, 3, 8, 8).to(md)
    seen = []
    y = conv(x)
    y.register_hook(lambda g: seen.append(g.dtype))
    F.mse_loss(y, mdn.zeros(2, 4, 8, 8).to(md)).backward()
    assert seen == [md] and conv.weight.grad.dtype == md
    a = mdn.randn(5, 7).to(md).requires_grad_()
    b = (a * 2.0)
    b.register_hook(lambda g: seen.append(g.dtype))
    b.sum(dtype=np.float32).backward()
    assert seen[-1] == md and a.grad.dtype == md and np.all(a.grad.float().numpy() == 2.0)
    pair, tpair = mdn.tensor([40000.0, 40000.0]).to(md), torch.tensor([40000.0, 40000.0]).to(getattr(torch, dtype))
    assert pair.mean().item() == tpair.mean().item() == tpair[0].item()     # (bfloat16 rounds 40000 to 39936)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_16_bit_gpu_reductions_accumulate_in_float32(dtype):
    """The GPU side of the rule above: CuPy's own reductions of 16-bit arrays (ops._core.wide_reduce leaves them to
    CuPy) give PyTorch's float32-accumulated results."""
    torch = pytest.importorskip("torch")
    if not _dev.cuda_is_available():
        pytest.skip("no CUDA GPU with CuPy on this machine")
    md, td = getattr(mdn, dtype), getattr(torch, dtype)
    a, t = mdn.ones(10000, dtype=md, device="cuda"), torch.ones(10000, dtype=td)
    assert a.sum().item() == t.sum().item() and a.mean().item() == 1.0 and a.sum().dtype == md
    assert a.cumsum(0)[-1].item() == t.cumsum(0)[-1].item()
    x = mdn.tensor(np.random.default_rng(0).standard_normal((64, 300)).astype(np.float32)).to(md)
    for f in (lambda v: v.sum(1), lambda v: v.mean(0), lambda v: v.mean(1), lambda v: v.var(1)):
        assert np.array_equal(f(x.to("cuda")).float().cpu().numpy(), f(x).float().numpy())

"""channels_last end to end: memory-format API, and a model converted with model.to(memory_format=channels_last)
keeps every 4-D activation and every activation gradient in NHWC memory order (counted with hooks: zero layout
changes), with the same values as the channels-first model."""
import numpy as np
import pytest

import minidnn as mdn
import minidnn.nn as nn
from minidnn.models import MobileNetSmall, resnet20


def test_tensor_memory_format_api(device):
    x = mdn.randn(2, 3, 4, 5, device=device)
    assert x.is_contiguous() and not x.is_contiguous(memory_format=mdn.channels_last)
    y = x.to(memory_format=mdn.channels_last)
    assert y.shape == x.shape and y.is_contiguous(memory_format=mdn.channels_last) and not y.is_contiguous()
    assert y.contiguous(memory_format=mdn.channels_last) is y
    np.testing.assert_array_equal(y.cpu().numpy(), x.cpu().numpy())
    z = y.contiguous()
    assert z.is_contiguous()
    with pytest.raises(RuntimeError, match="rank 4"):
        mdn.randn(2, 3).contiguous(memory_format=mdn.channels_last)
    # The layout change is differentiable: the gradient passes through unchanged.
    a = mdn.randn(1, 2, 3, 3, requires_grad=True)
    (a.to(memory_format=mdn.channels_last) * 2).sum().backward()
    np.testing.assert_array_equal(a.grad.numpy(), np.full((1, 2, 3, 3), 2, np.float32))


def test_module_to_channels_last_converts_only_4d_tensors():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4, 2))
    model.to(memory_format=mdn.channels_last)
    assert model[0].weight.is_contiguous(memory_format=mdn.channels_last)
    assert model[1].weight.is_contiguous() and model[3].weight.is_contiguous()


@pytest.mark.parametrize("make", [lambda: resnet20(), lambda: MobileNetSmall()], ids=["resnet20", "mobilenet_small"])
def test_model_keeps_nhwc_through_forward_and_backward(make, device):
    mdn.manual_seed(0)
    ref = make().to(device)
    model = make().to(device)
    model.load_state_dict(ref.state_dict())
    model.to(memory_format=mdn.channels_last)
    x = mdn.randn(2, 3, 16, 16, device=device)
    layout_changes = []

    def watch(mod, inp, out):
        if out.ndim == 4:
            if not out.is_contiguous(memory_format=mdn.channels_last):
                layout_changes.append(f"{type(mod).__name__} output")
            if out.requires_grad:
                out.register_hook(lambda g, name=type(mod).__name__: layout_changes.append(f"{name} grad")
                                  if not g.is_contiguous(memory_format=mdn.channels_last) else None)

    for mod in model.modules():
        mod.register_forward_hook(watch)
    y = model(x.to(memory_format=mdn.channels_last))
    (y * mdn.arange(10, device=device)).sum().backward()
    y_ref = ref(x)
    (y_ref * mdn.arange(10, device=device)).sum().backward()
    assert layout_changes == []
    np.testing.assert_allclose(y.cpu().numpy(), y_ref.cpu().numpy(), rtol=1e-4, atol=1e-5)
    for p, q in zip(model.parameters(), ref.parameters()):
        np.testing.assert_allclose(p.grad.cpu().numpy(), q.grad.cpu().numpy(), rtol=1e-3, atol=1e-4)


class _DeviceLike(np.ndarray):
    """A NumPy array that in_memory_order treats as a GPU array (its type's module is not numpy's), so the CPU sees
    the NHWC-view path CuPy arrays take."""


_DeviceLike.__module__ = "cupy._core.core"


@pytest.mark.parametrize("other_shape", [(1, 6, 1, 1), (6, 1, 1), (1, 1, 1, 5), (5,), (4, 6, 7, 5)])
def test_in_memory_order_keeps_channels_last_through_a_broadcast_operand(other_shape):
    # CuPy allocates C-ordered outputs: a conv output plus its (1, C, 1, 1) bias (BiasAdd's broadcast add) lost the
    # NHWC order on the GPU, and every layer after it ran channels-first
    from minidnn.backend.layout import in_memory_order
    rng = np.random.default_rng(0)
    y = np.ascontiguousarray(rng.standard_normal((4, 7, 5, 6))).transpose(0, 3, 1, 2).view(_DeviceLike)
    b = rng.standard_normal(other_shape)
    b = np.ascontiguousarray(b.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2) if b.shape == y.shape else b
    b = b.view(_DeviceLike)
    seen = []

    def fn(u, v):
        seen.append(u.flags.c_contiguous)
        return np.ascontiguousarray(np.asarray(u) + np.asarray(v)).view(_DeviceLike)   # C-ordered, as CuPy's

    out = in_memory_order(fn, y, b)
    assert seen == [True]                   # computed on y's NHWC view
    np.testing.assert_array_equal(np.asarray(out), np.asarray(y) + np.asarray(b))
    assert mdn.backend.memory_format(out) is mdn.backend.TensorFormat.NHWC
    # the operands swapped: the larger one still decides
    np.testing.assert_array_equal(np.asarray(in_memory_order(fn, b, y)), np.asarray(b) + np.asarray(y))


def test_leaf_grad_takes_the_leafs_memory_format():
    """PyTorch's gradient layout contract: a leaf's .grad has the leaf's strides -- channels_last for a
    channels_last leaf whatever layout the incoming gradient has, contiguous for a contiguous leaf fed a
    channels_last gradient (autograd's AccumulateGrad, backend.array_ops.copy_like)."""
    x = mdn.randn(2, 3, 4, 5).to(memory_format=mdn.channels_last).requires_grad_()
    (x * 2).sum().backward()                                   # a C-ordered incoming gradient
    assert x.grad.is_contiguous(memory_format=mdn.channels_last)
    np.testing.assert_array_equal(x.grad.numpy(), np.full((2, 3, 4, 5), 2.0, np.float32))
    y = mdn.randn(2, 3, 4, 5, requires_grad=True)
    w = mdn.arange(120.0).reshape(2, 3, 4, 5).to(memory_format=mdn.channels_last)
    (y.to(memory_format=mdn.channels_last) * w).sum().backward()   # a channels_last incoming gradient
    assert y.grad.is_contiguous()
    np.testing.assert_array_equal(y.grad.numpy(), w.numpy())


def test_in_layout_of_copies_only_when_the_order_differs():
    """array_ops.in_layout_of (the batch-norm backward's dy; copy_like underneath, as the leaf .grad and nn's
    fused batch-norm nodes use it): the array itself when it already has the template's strides, else one copy in
    the template's memory order with the same values."""
    from minidnn.backend.array_ops import in_layout_of
    rng = np.random.default_rng(3)
    nchw = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    nhwc = np.ascontiguousarray(nchw.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    assert in_layout_of(nchw, np.empty_like(nchw)) is nchw
    assert in_layout_of(nhwc, nhwc.copy(order="K")) is nhwc
    got = in_layout_of(nchw, nhwc)
    assert got.strides == nhwc.strides and np.array_equal(got, nchw)
    back = in_layout_of(nhwc, nchw)
    assert back.flags.c_contiguous and np.array_equal(back, nchw)


@pytest.mark.parametrize("opt_name", ["SGD", "Adam", "AdamW"])
def test_a_fused_optimizer_keeps_channels_last_parameters_channels_last(opt_name, device):
    """PyTorch's optimizers leave a parameter's memory format alone: so do the fused ones, whose flat buffers lay each
    channels-last parameter (and its gradient and state slices) out in its memory order -- the same values as the
    unfused optimizer on the channels-first model, step for step."""
    mdn.manual_seed(1)
    ref = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 3),
                        nn.Flatten(), nn.Linear(4 * 6 * 6, 3)).to(device)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 3),
                          nn.Flatten(), nn.Linear(4 * 6 * 6, 3)).to(device)
    model.load_state_dict(ref.state_dict())
    model.to(memory_format=mdn.channels_last)
    ref.to(memory_format=mdn.channels_last)     # the same arithmetic: the unfused optimizer on the same layout
    kw = {"lr": 0.05, "momentum": 0.9} if opt_name == "SGD" else {"lr": 0.01}
    opt = getattr(mdn.optim, opt_name)(model.parameters(), fused=True, **kw)
    opt_ref = getattr(mdn.optim, opt_name)(ref.parameters(), fused=False, **kw)
    cl_params = [model[0].weight, model[3].weight]
    assert all(p.is_contiguous(memory_format=mdn.channels_last) and not p.is_contiguous() for p in cl_params)
    x = mdn.randn(4, 3, 8, 8, device=device)
    for _ in range(3):
        for m, o in ((model, opt), (ref, opt_ref)):
            xin = x.to(memory_format=mdn.channels_last)
            o.zero_grad()
            (m(xin) * mdn.arange(3, device=device)).sum().backward()
            o.step()
        for p in cl_params:
            assert p.is_contiguous(memory_format=mdn.channels_last) and not p.is_contiguous()
            assert p.grad.is_contiguous(memory_format=mdn.channels_last)
            for v in opt.state[p].values():
                v = v.data if isinstance(v, mdn.Tensor) else v
                if getattr(v, "ndim", 0) == 4:
                    assert mdn._memory_format.is_in(v, mdn.channels_last)
        for p, q in zip(model.parameters(), ref.parameters()):
            np.testing.assert_allclose(p.detach().cpu().numpy(), q.detach().cpu().numpy(), rtol=1e-5, atol=1e-6)
    # a state_dict round trip keeps values and the memory format
    sd = opt.state_dict()
    opt2 = getattr(mdn.optim, opt_name)(model.parameters(), fused=True, **kw)
    opt2.load_state_dict(sd)
    assert all(p.is_contiguous(memory_format=mdn.channels_last) for p in cl_params)


def test_stride_matches_pytorch():
    torch = pytest.importorskip("torch")
    a = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)
    pairs = [(mdn.tensor(a), torch.tensor(a))]
    pairs.append((pairs[0][0].to(memory_format=mdn.channels_last), pairs[0][1].to(memory_format=torch.channels_last)))
    pairs.append((pairs[0][0].transpose(1, 3), pairs[0][1].transpose(1, 3)))
    pairs.append((pairs[0][0][:, ::2, 1:], pairs[0][1][:, ::2, 1:]))
    pairs.append((mdn.tensor(a[0, 0, 0]).broadcast_to((3, 5)), torch.tensor(a[0, 0, 0]).expand(3, 5)))
    pairs.append((mdn.tensor(np.float32(2.0)), torch.tensor(2.0)))
    for m, t in pairs:
        assert m.stride() == t.stride()
        for d in range(-m.ndim, m.ndim):
            assert m.stride(d) == t.stride(d)
    with pytest.raises(IndexError, match="out of range"):
        pairs[0][0].stride(4)
    with pytest.raises(IndexError, match="out of range"):
        pairs[-1][0].stride(0)
    with pytest.raises(TypeError, match="int"):
        pairs[0][0].stride(1.0)


@pytest.mark.parametrize("opt_name", ["SGD", "Adam"])
def test_channels_last_after_the_fused_optimizer_was_built(opt_name, device):
    """``model.to(memory_format=channels_last)`` after the optimizer: the parameters become channels-last (as in
    PyTorch, whose optimizers hold the same Parameter objects), the state keeps its values, and the steps match
    the unfused optimizer's."""
    mdn.manual_seed(3)
    ref = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 4, 3), nn.Flatten(), nn.Linear(4 * 4 * 4, 2))
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 4, 3), nn.Flatten(), nn.Linear(4 * 4 * 4, 2))
    ref.to(device)
    model.to(device)
    model.load_state_dict(ref.state_dict())
    kw = {"lr": 0.05, "momentum": 0.9} if opt_name == "SGD" else {"lr": 0.01}
    opt = getattr(mdn.optim, opt_name)(model.parameters(), fused=True, **kw)
    opt_ref = getattr(mdn.optim, opt_name)(ref.parameters(), fused=False, **kw)
    x = mdn.randn(4, 3, 8, 8, device=device)
    for step in range(4):
        if step == 2:                   # the optimizer already holds state: relayout mid-training
            model.to(memory_format=mdn.channels_last)
            ref.to(memory_format=mdn.channels_last)
        for m, o in ((model, opt), (ref, opt_ref)):
            o.zero_grad()
            xin = x.to(memory_format=mdn.channels_last) if step >= 2 else x
            (m(xin) * mdn.arange(2, device=device)).sum().backward()
            o.step()
        for p, q in zip(model.parameters(), ref.parameters()):
            np.testing.assert_allclose(p.detach().cpu().numpy(), q.detach().cpu().numpy(), rtol=1e-5, atol=1e-6)
    assert model[0].weight.is_contiguous(memory_format=mdn.channels_last) and not model[0].weight.is_contiguous()
    assert model[0].weight.grad.is_contiguous(memory_format=mdn.channels_last)


def test_a_parameter_relaid_with_its_gradient_still_in_the_slot_keeps_that_gradient():
    mdn.manual_seed(0)
    m = nn.Conv2d(3, 8, 3)
    opt = mdn.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, fused=True)
    x = mdn.randn(2, 3, 8, 8)
    for _ in range(2):
        opt.zero_grad()
        m(x).sum().backward()
        if _ == 0:
            opt.step()
    g = m.weight.grad.numpy().copy()
    w_before = m.weight.detach().numpy().copy()
    m.weight.data = mdn._memory_format.relayout(m.weight.data, mdn.channels_last)    # the gradient stays in its slot
    opt.step()
    np.testing.assert_array_equal(m.weight.grad.numpy(), g)
    assert m.weight.is_contiguous(memory_format=mdn.channels_last)
    assert m.weight.grad.is_contiguous(memory_format=mdn.channels_last)
    buf = opt.state[m.weight]["momentum_buffer"]
    buf = buf.data if isinstance(buf, mdn.Tensor) else buf
    assert mdn._memory_format.is_in(buf, mdn.channels_last)
    assert not np.allclose(m.weight.detach().numpy(), w_before)

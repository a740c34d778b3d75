"""Consumer fusion (docs/fusion.md): relu of a training batch norm's output is recorded as one BatchNormReLU node
whose backward is the fused batch-norm + ReLU gradient.  Every result must equal the unfused graph's."""
import numpy as np
import pytest

import minidnn as mdn
import minidnn.nn as nn
import minidnn.nn.functional as F
from minidnn import backends


@pytest.fixture
def fusion():
    """Restores the switch whatever a test sets."""
    old = backends.cudnn.fusion
    yield
    backends.cudnn.fusion = old


def _net(device, channels_last=False):
    mdn.manual_seed(0)
    conv = nn.Conv2d(3, 6, 3, padding=1).to(device)
    bn = nn.BatchNorm2d(6).to(device)
    x = mdn.randn(4, 3, 7, 5, device=device, requires_grad=True)
    return conv, bn, x


def _weights(r):
    return (mdn.arange(r.numel(), dtype=r.dtype, device=r.device).reshape(r.shape) % 7 - 3) / 5


def _grads(device, fused, build):
    backends.cudnn.fusion = fused
    conv, bn, x = _net(device)
    r = build(conv, bn, x)
    (r * _weights(r)).sum().backward()
    return r, [t.detach().cpu().numpy() for t in (r, x.grad, conv.weight.grad, conv.bias.grad, bn.weight.grad,
                                                  bn.bias.grad, bn.running_mean, bn.running_var)]


def _same(a, b, device, exact=True):
    for u, v in zip(a, b):
        if device == "cpu" and exact:
            np.testing.assert_array_equal(u, v)
        else:
            np.testing.assert_allclose(u, v, rtol=1e-5, atol=1e-5)  # conv bias before BN: grad ~0


@pytest.mark.parametrize("build", [
    lambda conv, bn, x: F.relu(bn(conv(x))),
    lambda conv, bn, x: nn.ReLU()(bn(conv(x))),
    lambda conv, bn, x: bn(conv(x)).relu(),
    lambda conv, bn, x: mdn.relu(bn(conv(x))),
], ids=["F.relu", "nn.ReLU", "Tensor.relu", "minidnn.relu"])
def test_bn_relu_is_one_node_with_the_unfused_gradients(device, fusion, build):
    r, fused = _grads(device, True, build)
    assert _node(r) == "BatchNormReLU"
    r, plain = _grads(device, False, build)
    assert _node(r) == "Activation"
    _same(fused, plain, device)


def _node(t):
    """The class name of the node that made ``t`` (built-in ops are their own node class)."""
    gf = t.grad_fn
    return getattr(gf, "_fn_cls", None).__name__ if getattr(gf, "_fn_cls", None) else type(gf).__name__


@pytest.mark.parametrize("order", ["bn+z", "z+bn"])
@pytest.mark.parametrize("z_kind", ["nonleaf", "leaf", "constant"])
def test_bn_add_relu_is_one_node_with_the_unfused_gradients(device, fusion, order, z_kind):
    # the residual block: relu(bn(conv(x)) + shortcut)
    zs = {}

    def build(conv, bn, x):
        if z_kind == "nonleaf":
            z = x.repeat(1, 2, 1, 1) * 0.5
        else:
            mdn.manual_seed(3)
            z = mdn.randn(4, 6, 7, 5, device=x.device, requires_grad=z_kind == "leaf")
        zs["z"] = z
        y = bn(conv(x))
        return F.relu(y + z if order == "bn+z" else z + y)

    r, fused = _grads(device, True, build)
    assert _node(r) == "BatchNormAddReLU"
    z_fused = zs["z"].grad.detach().cpu().numpy() if z_kind == "leaf" else None
    r, plain = _grads(device, False, build)
    assert _node(r) == "Activation"
    _same(fused, plain, device)
    if z_kind == "leaf":
        _same([z_fused], [zs["z"].grad.detach().cpu().numpy()], device)


def test_bn_add_relu_not_fused_with_broadcasting_or_hooks(device, fusion):
    backends.cudnn.fusion = True
    conv, bn, x = _net(device)
    y = bn(conv(x))
    assert _node(F.relu(y + mdn.ones(1, 6, 1, 1, device=device))) == "Activation"     # broadcast residual
    a = y + y.detach()
    seen = []
    a.register_hook(lambda g: seen.append(g))
    r = F.relu(a)
    assert _node(r) == "Activation"
    r.sum().backward()
    assert len(seen) == 1


def test_batch_norm_output_used_twice(device, fusion):
    # y feeds the fused node and a second consumer: batch norm's own node gets that gradient, and the two
    # contributions add up to the unfused total
    def build(conv, bn, x):
        y = bn(conv(x))
        return F.relu(y) + y * 0.5
    # the batch-norm gradient is taken of each use and summed: equal up to rounding
    _same(_grads(device, True, build)[1], _grads(device, False, build)[1], device, exact=False)


def test_sequential_and_channels_of_one(device, fusion):
    def build(conv, bn, x):
        return nn.Sequential(conv, bn, nn.ReLU())(x)
    _same(_grads(device, True, build)[1], _grads(device, False, build)[1], device)


def test_not_fused_where_it_would_change_what_the_user_sees(device, fusion):
    backends.cudnn.fusion = True
    conv, bn, x = _net(device)
    # a hook on the batch norm's output must see its gradient: no fusion
    y = bn(conv(x))
    seen = []
    y.register_hook(lambda g: seen.append(g))
    r = F.relu(y)
    assert _node(r) == "Activation"
    r.sum().backward()
    assert len(seen) == 1 and seen[0].shape == y.shape
    # eval mode (running statistics) and no_grad: plain ReLU
    bn.eval()
    assert _node(F.relu(bn(conv(x)))) == "Activation"
    bn.train()
    with mdn.no_grad():
        assert F.relu(bn(conv(x))).grad_fn is None


def test_in_place_change_after_relu_still_raises(device, fusion):
    for fused in (True, False):
        backends.cudnn.fusion = fused
        conv, bn, x = _net(device)
        y = bn(conv(x))
        r = F.relu(y)
        y.add_(1.0)         # relu's saved input changed: both graphs refuse to backpropagate
        with pytest.raises(RuntimeError, match="modified by an inplace|in-place"):
            r.sum().backward()


@pytest.mark.parametrize("residual", [False, True])
def test_double_backward_through_the_fused_node(fusion, residual):
    def penalty(fused):
        backends.cudnn.fusion = fused
        conv, bn, x = _net("cpu")
        x64 = x.detach().double().requires_grad_()
        conv.double(), bn.double()
        y = bn(conv(x64))
        r = F.relu(y + x64.repeat(1, 2, 1, 1) if residual else y)
        assert _node(r) == (("BatchNormAddReLU" if residual else "BatchNormReLU") if fused else "Activation")
        g, = mdn.autograd.grad((r * _weights(r)).sum(), x64, create_graph=True)
        (g * g).sum().backward()
        return [t.detach().numpy() for t in (x64.grad, conv.weight.grad, bn.weight.grad)]
    for u, v in zip(penalty(True), penalty(False)):
        np.testing.assert_allclose(u, v, rtol=1e-10, atol=1e-12)


@pytest.mark.cuda
def test_fused_backward_launches_one_kernel_fewer(fusion):
    pytest.importorskip("cupy")
    if not mdn.cuda.is_available():
        pytest.skip("no GPU")
    from minidnn.backend.cuda import launch

    def launches(fused):
        backends.cudnn.fusion = fused
        conv, bn, x = _net("cuda")
        r = F.relu(bn(conv(x)))
        loss = (r * _weights(r)).sum()      # a dense gradient reaches relu (as from a following conv)
        loss.backward(retain_graph=True)        # warm: kernels compiled, plans made
        start = launch.launch_count()
        loss.backward()
        return launch.launch_count() - start
    assert launches(True) == launches(False) - 1


@pytest.mark.parametrize("channels_last", [False, True])
def test_batch_norm_layer_counts_batches_in_its_forward(device, channels_last):
    bn = nn.BatchNorm2d(4).to(device)
    x = mdn.randn(3, 4, 5, 5, device=device)
    if channels_last:
        x = x.to(memory_format=mdn.channels_last)
    v = bn.num_batches_tracked._version
    for i in range(3):
        bn(x)
        assert bn.num_batches_tracked.item() == i + 1
    assert bn.num_batches_tracked._version == v + 3
    bn.eval()
    bn(x)
    assert bn.num_batches_tracked.item() == 3
    bn.train()
    with pytest.raises(Exception):
        bn(mdn.randn(3, 5, 5, 5, device=device))        # wrong channel count: nothing counted
    assert bn.num_batches_tracked.item() == 3
    bn.momentum = None                                  # cumulative average: the factor reads the counter
    bn(x)
    assert bn.num_batches_tracked.item() == 4


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("kind", ["grad_y", "grad_a", "hook_after_relu", "retain_grad_after_relu", "grad_x"])
def test_the_bypassed_tensor_still_gets_its_gradient(device, fusion, residual, kind):
    # autograd.grad w.r.t. batch norm's output (or the residual sum), and hooks / retain_grad registered on it after
    # relu recorded the fused node: the fused node then takes the unfused path, with the same bits
    def run(fused):
        backends.cudnn.fusion = fused
        conv, bn, x = _net(device)
        mdn.manual_seed(5)
        z = mdn.randn(4, 6, 7, 5, device=device, requires_grad=True)
        y = bn(conv(x))
        a = y + z if residual else y
        r = F.relu(a)
        assert _node(r) == (("BatchNormAddReLU" if residual else "BatchNormReLU") if fused else "Activation")
        loss = (r * _weights(r)).sum()
        if kind == "grad_y":
            return mdn.autograd.grad(loss, y)[0]
        if kind == "grad_a":
            return mdn.autograd.grad(loss, a)[0]
        if kind == "grad_x":
            return mdn.autograd.grad(loss, x)[0]
        if kind == "hook_after_relu":
            seen = []
            y.register_hook(seen.append)
            loss.backward()
            assert len(seen) == 1
            return seen[0]
        y.retain_grad()
        loss.backward()
        return y.grad
    _same([run(True).detach().cpu().numpy()], [run(False).detach().cpu().numpy()], device)


def test_the_bypassed_batch_norm_node_is_freed_by_backward(fusion):
    backends.cudnn.fusion = True
    conv, bn, x = _net("cpu")
    y = bn(conv(x))
    r = F.relu(y)
    bn_node = y.grad_fn
    r.sum().backward()
    assert bn_node.saved is None            # freed, as after an unfused backward
    with pytest.raises(RuntimeError, match="second time|freed"):
        (y * 2).sum().backward()            # as unfused: batch norm's saved tensors are gone


@pytest.mark.parametrize("residual", [False, True], ids=["bn+relu", "bn+add+relu"])
def test_channels_last_batch_norm_is_fused(device, fusion, residual):
    # issue 12: a channels-last (NHWC) activation reaches batch norm as itself (no permuted (N*H*W, C) view), so
    # relu finds batch norm's node and the fused node is recorded; outputs and gradients stay NHWC and equal the
    # unfused graph's
    zs = {}

    def build(conv, bn, x):
        conv.to(memory_format=mdn.channels_last)
        y = bn(conv(x.to(memory_format=mdn.channels_last)))
        if not residual:
            return F.relu(y)
        mdn.manual_seed(3)
        z = zs["z"] = mdn.randn(4, 6, 7, 5, device=x.device).to(memory_format=mdn.channels_last).requires_grad_()
        return F.relu(y + z)

    r, fused = _grads(device, True, build)
    assert _node(r) == ("BatchNormAddReLU" if residual else "BatchNormReLU")
    assert r.is_contiguous(memory_format=mdn.channels_last)
    z_fused = zs["z"].grad.detach().cpu().numpy() if residual else None
    r, plain = _grads(device, False, build)
    assert _node(r) == "Activation"
    _same(fused, plain, device)
    if residual:
        _same([z_fused], [zs["z"].grad.detach().cpu().numpy()], device)

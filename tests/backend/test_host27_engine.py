"""The engine's per-node paths trimmed in round 27 (minidnn/autograd.py), on the CPU against float64 values worked by
hand: a user Function's gradients pass through FunctionCtx.backward as returned when each is a Tensor of its
input's shape, and are still conformed otherwise (None for an input that needs no gradient, an array made a Tensor,
a broadcast gradient summed to its input's shape, extra trailing Nones dropped, a Tensor subclass); a leaf's
accumulation (one frame now) still runs its tensor hooks, casts, accumulates in place, and calls the
post-accumulate hooks after every kind of backward, create_graph included."""
import numpy as np
import pytest

import minidnn as mdn
from minidnn.autograd import Function


class _Scaled(Function):
    """y = a * x + b (b broadcast); backward returns what ``mode`` asks for."""
    mode = "plain"

    @staticmethod
    def forward(ctx, x, b, a):
        ctx.a = a
        return mdn.Tensor._from_array(x.data * a + b.data)

    @staticmethod
    def backward(ctx, g):
        mode = _Scaled.mode
        gx = g * ctx.a
        if mode == "plain":
            return gx, g, None
        if mode == "array":
            return gx.data, g.data, None
        if mode == "broadcast":         # b's gradient left at y's shape: the ctx sums it to b's
            return gx, g, None
        if mode == "extra":
            return gx, g, None, None, None
        if mode == "subclass":
            return mdn.nn.Parameter(gx.detach()), g, None
        raise AssertionError(mode)


@pytest.mark.parametrize("mode", ["plain", "array", "broadcast", "extra", "subclass"])
def test_function_gradients_conformed_or_passed_through(mode, monkeypatch):
    monkeypatch.setattr(_Scaled, "mode", mode)
    rng = np.random.default_rng(0)
    x64 = rng.normal(size=(3, 4))
    b_shape = (4,) if mode == "broadcast" else (3, 4)
    b64 = rng.normal(size=b_shape)
    gy64 = rng.normal(size=(3, 4))
    x = mdn.tensor(x64, requires_grad=True)
    b = mdn.tensor(b64, requires_grad=True)
    y = _Scaled.apply(x, b, 2.5)
    y.backward(mdn.tensor(gy64))
    assert type(x.grad) is mdn.Tensor and x.grad.shape == (3, 4) and b.grad.shape == b_shape
    np.testing.assert_array_equal(x.grad.numpy(), gy64 * 2.5)
    np.testing.assert_array_equal(b.grad.numpy(), gy64.sum(0) if mode == "broadcast" else gy64)


def test_a_gradient_for_an_input_that_needs_none_is_dropped():
    x = mdn.tensor(np.arange(6.0).reshape(2, 3), requires_grad=True)
    b = mdn.tensor(np.ones((2, 3)))                 # needs no gradient, though backward returns one
    y = _Scaled.apply(x, b, -1.0)
    outs = y.grad_fn.backward(mdn.ones(2, 3, dtype=mdn.float64))
    assert len(outs) == 3 and outs[1] is None and outs[2] is None
    np.testing.assert_array_equal(outs[0].numpy(), -np.ones((2, 3)))


def test_passed_through_gradients_are_the_returned_objects():
    x = mdn.tensor(np.ones((2, 2)), requires_grad=True)
    b = mdn.tensor(np.zeros((2, 2)), requires_grad=True)
    keep = {}

    class Op(Function):
        @staticmethod
        def forward(ctx, x, b):
            return mdn.Tensor._from_array(x.data + b.data)

        @staticmethod
        def backward(ctx, g):
            keep["r"] = (g * 2, g * 3)
            return keep["r"]
    outs = Op.apply(x, b).grad_fn.backward(mdn.ones(2, 2, dtype=mdn.float64))
    assert outs[0] is keep["r"][0] and outs[1] is keep["r"][1]


@pytest.mark.parametrize("create_graph", [False, True])
def test_leaf_accumulation_hooks_and_casts(create_graph):
    calls = []
    w = mdn.tensor(np.array([1.0, 2.0, 3.0], dtype=np.float32), requires_grad=True)
    w.register_hook(lambda g: g * 10)                                       # a tensor hook rewrites g
    w.register_post_accumulate_grad_hook(lambda t: calls.append(t.grad.numpy().copy()))
    x = mdn.tensor(np.array([0.5, -1.0, 2.0]), requires_grad=create_graph)  # float64: w's gradient is cast back
    (w * x).sum().backward(create_graph=create_graph)
    np.testing.assert_array_equal(w.grad.numpy(), np.float32([5.0, -10.0, 20.0]))
    assert w.grad.dtype == mdn.float32 and len(calls) == 1
    (w * x).sum().backward(create_graph=create_graph)                       # accumulated
    np.testing.assert_array_equal(w.grad.numpy(), np.float32([10.0, -20.0, 40.0]))
    assert len(calls) == 2
    np.testing.assert_array_equal(calls[1], np.float32([10.0, -20.0, 40.0]))
    assert w.grad.requires_grad == create_graph       # (a graph through x with create_graph)

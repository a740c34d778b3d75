"""Round 8's host-time changes (docs/host_overhead.md): FunctionCtx's class defaults, edges collected before forward,
the one-array-type device check, identity-hashed backend enums, the one-array handle lookup -- each correct when the
condition it skips on changes."""
import pickle
import types

import numpy as np
import pytest

import minidnn as mdn
from minidnn import autograd
from minidnn.autograd import Function
from minidnn.backend import devices, handle
from minidnn.backend.algorithm_selection import Determinism
from minidnn.backend.conv_algorithms import ConvolutionFwdAlgo
from minidnn.backend.errors import IdentityEnum
from minidnn.backend.handle import MathType


class _Scale(Function):
    @staticmethod
    def forward(ctx, x, k, mode):
        ctx.k = k
        if mode == "dirty":
            x.data *= k
            ctx.mark_dirty(x)
            return x
        if mode == "nondiff":
            y, idx = mdn.Tensor._from_array(x.data * k), mdn.Tensor._from_array(x.data * 0)
            ctx.mark_non_differentiable(idx)
            return y, idx
        if mode == "nomat":
            ctx.set_materialize_grads(False)
            return mdn.Tensor._from_array(x.data * k), mdn.Tensor._from_array(x.data * 2)
        return mdn.Tensor._from_array(x.data * k)

    @staticmethod
    def backward(ctx, g, *rest):
        return g * ctx.k, None, None


def test_ctx_defaults_are_per_ctx_once_changed():
    """A ctx that marks dirty / non-differentiable / no materialize keeps its own value; the next ctx of the same
    Function sees the class defaults again."""
    x = mdn.tensor(np.ones(3, np.float32), requires_grad=True)
    y, idx = _Scale.apply(x, 2.0, "nondiff")
    assert y.requires_grad and not idx.requires_grad and y.grad_fn._non_differentiable
    y2 = _Scale.apply(x, 3.0, "plain")
    assert y2.grad_fn._non_differentiable == () and y2.grad_fn._dirty == () and y2.grad_fn._materialize
    assert y2.grad_fn.pre_hooks is None and y2.grad_fn.saved == ()
    a, b = _Scale.apply(x, 4.0, "nomat")
    assert not a.grad_fn._materialize
    a.sum().backward()
    np.testing.assert_allclose(x.grad.data, 4.0)
    assert _Scale.apply(x, 5.0, "plain").grad_fn._materialize
    leaf = mdn.tensor(np.ones(3, np.float32), requires_grad=True)
    z = leaf * 1.0
    w = _Scale.apply(z, 2.0, "dirty")
    assert w is z and w.grad_fn.name() == "_ScaleBackward" and w.grad_fn._dirty == (z,)
    w.sum().backward()
    np.testing.assert_allclose(leaf.grad.data, 2.0)


def test_ctx_hooks_and_release_live_on_the_instance():
    x = mdn.tensor(np.ones(3, np.float32), requires_grad=True)
    y = _Scale.apply(x, 2.0, "plain")
    seen = []
    y.register_hook(lambda g: seen.append(1))
    (y * 1.0).sum().backward()
    assert seen == [1]
    assert autograd.FunctionCtx.pre_hooks is None and autograd.FunctionCtx.saved == ()
    assert _Scale.apply(x, 2.0, "plain").grad_fn.pre_hooks is None


def test_edges_and_needs_input_grad():
    """Edges are collected with the arguments (before forward, as PyTorch's apply does): a non-leaf input without
    requires_grad gets no edge, a leaf that requires grad its accumulator; no recording under no_grad."""
    a = mdn.tensor(np.ones(3, np.float32), requires_grad=True)
    c = mdn.tensor(np.ones(3, np.float32))
    y = _Scale.apply(a, 2.0, "plain")
    assert y.grad_fn.needs_input_grad == (True, False, False)
    assert y.grad_fn.next_edges[0][0] is a._edge()[0] and y.grad_fn.next_edges[1:] == (None, None)
    assert _Scale.apply(c, 2.0, "plain").grad_fn is None
    with mdn.no_grad():
        assert _Scale.apply(a, 2.0, "plain").grad_fn is None


class _Two(Function):
    @staticmethod
    def forward(ctx, a, b):
        return mdn.Tensor._from_array(a.data + b.data)

    @staticmethod
    def backward(ctx, g):
        return g, g


def _fake_gpu(monkeypatch):
    class ndarray(np.ndarray):
        pass

    def on(a, dev):
        v = np.asarray(a).view(ndarray)
        v.__dict__["dev"] = dev
        return v
    ndarray.data = property(lambda self: types.SimpleNamespace(device_id=self.__dict__.get("dev", 0)))
    monkeypatch.setattr(devices, "_cupy", types.SimpleNamespace(ndarray=ndarray))
    return on


def test_device_check_one_array_type_fast_path(monkeypatch):
    """Same array type: NumPy passes, GPU arrays compare their GPU numbers (two GPUs raise); mixed types take
    device_of's full comparison (an ndarray subclass on the cpu passes, cpu + GPU raises)."""
    on = _fake_gpu(monkeypatch)
    monkeypatch.setattr(devices, "cuda_device_count", lambda: 2)
    x = np.ones(2, np.float32)
    t = lambda a: mdn.Tensor._from_array(a, requires_grad=True)        # noqa: E731
    _Two.apply(t(x), t(x))
    _Two.apply(t(on(x, 0)), t(on(x, 0)))
    with pytest.raises(RuntimeError, match="one device"):
        _Two.apply(t(on(x, 0)), t(on(x, 1)))
    _Two.apply(t(x), t(x.view(type("Sub", (np.ndarray,), {}))))
    with pytest.raises(RuntimeError, match="one device"):
        _Two.apply(t(x), t(on(x, 0)))


def test_identity_enums():
    for member in (MathType.TENSOR_OP, Determinism.DETERMINISTIC, ConvolutionFwdAlgo.IMPLICIT_GEMM):
        assert isinstance(member, IdentityEnum)
        assert hash(member) == object.__hash__(member)
        assert {member: 1}[type(member)(member.value)] == 1
        assert pickle.loads(pickle.dumps(member)) is member
        assert member != member.value and member != member.name


def test_configured_default_handle_one_array():
    x = np.ones(2, np.float32)
    h = handle.configured_default_handle(x)
    assert h is handle.resolve_handle(None, x) is handle.get_default_handle("cpu")
    assert handle.configured_default_handle(None, x) is h       # not one array: the general lookup
    old, old_h = handle.cudnn.deterministic, h.deterministic
    try:
        handle.cudnn.deterministic = True
        assert handle.configured_default_handle(x).deterministic is True
    finally:
        handle.cudnn.deterministic = old
        h.deterministic = old_h

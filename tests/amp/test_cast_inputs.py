"""autocast's per-op cast (``_amp_state.cast_inputs``) and its cast nodes, after the session-10 host-time work: the
one-pass argument scan equals the plain policy (written out below as the reference) over every policy, argument
pattern and dtype mix; the fallback without the installed Tensor type agrees; ``AutocastCast.backward`` passes a
gradient already in the source dtype through as the same object and converts any other (differentiably under
create_graph); the cast of an input that needs no gradient is ``t.to(dtype)``'s, layout included; the flat-buffer
casts' nodes name the parameter's device and dtype."""
import numpy as np
import pytest

import minidnn as mdn
import minidnn.nn as nn
import minidnn.nn.functional as F
from minidnn import _amp_state
from minidnn.amp.autocast_mode import AutocastCast
from minidnn.backend.devices import is_floating


def _reference(op_name, args, kwargs):
    """The policy as docs/amp.md states it, without shortcuts: every floating Tensor argument cast to the policy's
    dtype (lower: the region's; fp32: float32 when any is narrower; promote: the widest), the others untouched."""
    s = _amp_state._state()
    tensors = [a for a in list(args) + list(kwargs.values()) if isinstance(a, mdn.Tensor) and is_floating(a.dtype)]
    if not tensors or s["suspended"]:
        return args, kwargs
    low = s["dtype"].get(tensors[0].device.type)
    policy = _amp_state.policy_of(op_name, tensors[0].device.type)
    if low is None or policy is None:
        return args, kwargs
    if policy == "lower":
        target = low
    elif policy == "promote":
        target = tensors[0].dtype
        for t in tensors[1:]:
            target = np.promote_types(target, t.dtype)
    else:
        if all(t.dtype.itemsize >= 4 for t in tensors):
            return args, kwargs
        target = np.dtype(np.float32)

    def cast(a):
        if isinstance(a, mdn.Tensor) and is_floating(a.dtype) and a.dtype != target:
            return a.detach().to(target)
        return a
    return tuple(cast(a) for a in args), {k: cast(v) for k, v in kwargs.items()}


def _same(got, ref, orig):
    """got equals ref: the same objects where nothing is cast, the same dtype and bits where something is."""
    assert type(got) is type(ref) and len(got) == len(ref)
    pairs = zip(got, ref, orig) if isinstance(got, tuple) else ((got[k], ref[k], orig[k]) for k in ref)
    for g, r, o in pairs:
        if r is o:
            assert g is o
        else:
            assert g is not o and g.dtype == r.dtype
            np.testing.assert_array_equal(_np(g), _np(r))


def _np(t):
    return t.detach().float().cpu().numpy()


def _low(device, name):
    if device == "cpu" and name == "float16":
        pytest.skip("CPU autocast supports bfloat16 only")
    return getattr(mdn, name)


def _cases(device="cpu", low=mdn.bfloat16):
    f32 = mdn.randn(3, 4, device=device)
    w = mdn.randn(4, 4, device=device, requires_grad=True)
    b16 = mdn.randn(3, 4, device=device).to(low)
    f64 = mdn.randn(3, 4, device=device).double()
    ints = mdn.tensor([1, 2, 3], device=device)
    return [
        ("linear", (f32, w, None), {}),                       # lower: x and a weight
        ("linear", (b16, w), {"bias": mdn.randn(4, device=device)}),  # lower: a kwarg tensor, one arg already low
        ("conv2d", (mdn.randn(1, 2, 5, 5, device=device), mdn.randn(3, 2, 3, 3, device=device, requires_grad=True),
                    None, 1, 0, 1, 1), {}),
        ("matmul", (b16, b16.T), {}),                         # lower, all already low: nothing cast
        ("cross_entropy", (b16, ints), {"weight": None}),     # fp32 policy: the narrow input widened, ints kept
        ("cross_entropy", (f32, ints), {}),                   # fp32 policy, nothing narrow: untouched
        ("cat", ((f32, b16),), {}),                           # a tuple argument is not a Tensor: untouched
        ("where", (ints > 1, b16, f64), {}),                  # promote: the bool mask kept, b16 -> float64
        ("where", (ints > 1, b16, b16), {}),                  # promote among equals: no cast
        ("relu", (f32,), {}),                                 # no policy
        ("linear", (3, "x", None), {"k": 2.0}),               # no tensors at all
        ("linear", (ints, ints), {}),                         # integer tensors only
    ]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("installed", [True, False])
def test_cast_inputs_equals_the_plain_policy(device, dtype, installed, monkeypatch):
    low = _low(device, dtype)
    if not installed:       # the floor without minidnn.amp's Tensor type: anything with a _version is a Tensor
        monkeypatch.setattr(_amp_state, "_tensor_type", None)
    for op, args, kwargs in _cases(device, low):
        for policies in (None, _amp_state._policies(op)):
            with mdn.autocast(device, dtype=low):
                ref = _reference(op, args, kwargs)
                got = _amp_state.cast_inputs(op, args, kwargs, policies)
            _same(got[0], ref[0], args)
            _same(got[1], ref[1], kwargs)
            outside = _amp_state.cast_inputs(op, args, kwargs, policies)     # no region: nothing cast
            assert all(a is b for a, b in zip(outside[0], args))
    with mdn.autocast(device, dtype=low), _amp_state.suspended():    # suspended (the backward pass): nothing cast
        op, args, kwargs = _cases(device, low)[0]
        got = _amp_state.cast_inputs(op, args, kwargs)
        assert got[0] is args and got[1] == kwargs


def test_cast_of_a_weight_is_cached_and_a_gradient_flows_back():
    w = mdn.randn(4, 4, requires_grad=True)
    x = mdn.randn(3, 4)
    with mdn.autocast("cpu"):
        (x1, w1), _ = _amp_state.cast_inputs("mm", (x, w))
        (x2, w2), _ = _amp_state.cast_inputs("mm", (x, w))
    assert w1 is w2 and x1 is not x2                # weights cached per region, activations not
    assert isinstance(w1.grad_fn, AutocastCast) and w1.grad_fn.src_dtype == np.float32
    assert w1.grad_fn.src_device == w.device
    assert x1.grad_fn is None and not x1.requires_grad
    (w1.float() * 2).sum().backward()
    assert w.grad.dtype == np.float32
    np.testing.assert_array_equal(w.grad.numpy(), np.full((4, 4), 2, np.float32))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("grad", [False, True])
def test_input_cast_is_tensor_to(device, dtype, channels_last, grad):
    """The cast of a tensor that is not cached (an input, an activation) equals ``t.to(dtype)``: values, strides,
    requires_grad and the node (a marked cast where recorded, none otherwise)."""
    low = _low(device, dtype)
    x = mdn.randn(2, 3, 4, 5, device=device)
    if channels_last:
        x = x.to(memory_format=mdn.channels_last)
    x = (x * 1).requires_grad_(grad) if grad else x
    y = x * 2 if grad else x            # a non-leaf where grad: not cached
    with mdn.autocast(device, dtype=low):
        (got,), _ = _amp_state.cast_inputs("mm", (y,))
    ref = y.to(low)
    assert got.dtype == ref.dtype and got.data.strides == ref.data.strides and got.device == x.device
    assert got.requires_grad == ref.requires_grad == grad
    np.testing.assert_array_equal(_np(got), _np(ref))
    assert (type(got.grad_fn) is AutocastCast) if grad else got.grad_fn is None
    if grad:
        got.float().sum().backward()
        assert x.grad.dtype == np.float32
        np.testing.assert_array_equal(x.grad.cpu().numpy(), np.full(x.shape, 2, np.float32))
    with mdn.no_grad(), mdn.autocast(device, dtype=low):
        (got,), _ = _amp_state.cast_inputs("mm", (y,))
    assert got.grad_fn is None and not got.requires_grad


def test_cast_node_backward_passes_its_source_dtype_through_and_converts_others():
    t = mdn.randn(3, 4, requires_grad=True)
    with mdn.autocast("cpu"):
        (low,), _ = _amp_state.cast_inputs("mm", (t * 1,))
    node = low.grad_fn
    g32 = mdn.randn(3, 4)
    assert node.backward(node, g32)[0] is g32                  # float32 (the source dtype): the same object
    g16 = mdn.randn(3, 4).to(mdn.bfloat16)
    (back,) = node.backward(node, g16)
    assert back.dtype == np.float32
    np.testing.assert_array_equal(back.numpy(), g16.float().numpy())
    # create_graph: the conversion is differentiable (a second-order gradient flows through the cast back)
    x = mdn.randn(3, 4, requires_grad=True)
    with mdn.autocast("cpu"):
        (xl,), _ = _amp_state.cast_inputs("mm", (x * 1,))
    (gx,) = mdn.autograd.grad((xl * xl).float().sum(), x, create_graph=True)
    assert gx.dtype == np.float32 and gx.requires_grad
    (ggx,) = mdn.autograd.grad(gx.sum(), x)
    np.testing.assert_array_equal(ggx.numpy(), np.full((3, 4), 2, np.float32))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_flat_buffer_cast_nodes_name_the_parameter_device_and_dtype(device, dtype, set_direct_weights):
    """(With the cast nodes: direct weights off -- tests/amp/test_direct_weights.py has them on.)"""
    set_direct_weights(False)
    low = _low(device, dtype)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(4 * 4 * 4, 3)).to(device)
    opt = mdn.optim.SGD(model.parameters(), lr=0.1, fused=True)
    x, y = mdn.randn(2, 3, 6, 6, device=device), mdn.tensor([0, 1], device=device)
    for region in range(2):             # the second region casts the flat buffer whole
        with mdn.autocast(device, dtype=low):
            loss = F.cross_entropy(model(x), y)
            cache = _amp_state._state()["cache"]
            for p in model.parameters():
                node = cache[id(p)][2].grad_fn
                assert type(node) is AutocastCast and node.src_device == p.device and node.src_dtype == p.dtype
                assert cache[id(p)][2].dtype == low
            bases = {cache[id(p)][2].data.base is not None for p in model.parameters()}
            assert bases == {region == 1}
        opt.zero_grad()
        loss.backward()
        opt.step()

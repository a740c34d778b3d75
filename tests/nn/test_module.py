"""Module system: registration, traversal order, state dicts, modes, hooks, devices/dtypes, reprs, containers,
and the parameter-free/simple layers (Identity, Flatten, Unflatten, Linear, Embedding)."""
from collections import OrderedDict

import numpy as np
import pytest

import minidnn as mdn
from minidnn import nn


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 4)
        self.register_buffer("running", mdn.zeros(4))
        self.register_buffer("scratch", mdn.zeros(2), persistent=False)
        self.scale = nn.Parameter(mdn.ones(1))

    def forward(self, x):
        return self.fc(x) * self.scale + self.running


def make_net():
    return nn.Sequential(OrderedDict([
        ("features", nn.Sequential(nn.Linear(4, 3), nn.Identity(), Block())),
        ("heads", nn.ModuleDict({"a": nn.Linear(4, 2), "b": nn.Linear(4, 5, bias=False)})),
    ]))


# ----------------------------------------------------------------------------------------------
# Registration and traversal
# ----------------------------------------------------------------------------------------------
def test_parameters_follow_registration_order():
    net = make_net()
    assert [n for n, _ in net.named_parameters()] == [
        "features.0.weight", "features.0.bias", "features.2.scale", "features.2.fc.weight", "features.2.fc.bias",
        "heads.a.weight", "heads.a.bias", "heads.b.weight"]
    assert [n for n, _ in net.named_buffers()] == ["features.2.running", "features.2.scratch"]
    assert [n for n, _ in net.named_modules()] == [
        "", "features", "features.0", "features.1", "features.2", "features.2.fc", "heads", "heads.a", "heads.b"]
    assert [n for n, _ in net.named_children()] == ["features", "heads"]
    assert list(net.parameters()) == [p for _, p in net.named_parameters()]


def test_state_dict_keys_match_pytorch():
    torch = pytest.importorskip("torch")
    tnn = torch.nn
    tnet = tnn.Sequential(OrderedDict([
        ("features", tnn.Sequential(tnn.Linear(4, 3), tnn.Identity())),
        ("heads", tnn.ModuleDict({"a": tnn.Linear(4, 2), "b": tnn.Linear(4, 5, bias=False)})),
    ]))
    net = make_net()
    del net.features[2]
    assert list(net.state_dict().keys()) == list(tnet.state_dict().keys())


def test_shared_parameters_yielded_once():
    torch = pytest.importorskip("torch")
    shared = nn.Linear(3, 3)
    net = nn.Sequential(shared, nn.Identity(), shared)
    tshared = torch.nn.Linear(3, 3)
    tnet = torch.nn.Sequential(tshared, torch.nn.Identity(), tshared)
    assert len(list(net.parameters())) == len(list(tnet.parameters())) == 2
    assert net.num_parameters() == sum(p.numel() for p in tnet.parameters()) == 12
    assert [n for n, _ in net.named_parameters()] == [n for n, _ in tnet.named_parameters()]
    assert len(list(net.named_parameters(remove_duplicate=False))) == 4
    assert len(list(net.modules())) == 3
    # A parameter tied between two modules also counts once.
    a, b = nn.Linear(2, 2), nn.Linear(2, 2)
    b.weight = a.weight
    assert nn.Sequential(a, b).num_parameters() == 4 + 2 + 2


def test_setattr_getattr_delattr():
    m = nn.Module()
    m.w = nn.Parameter(mdn.ones(2))
    m.child = nn.Linear(2, 2)
    m.buf = nn.Buffer(mdn.zeros(3), persistent=False)
    m.plain = 5
    assert list(m._parameters) == ["w"] and list(m._modules) == ["child"] and list(m._buffers) == ["buf"]
    assert "w" not in m.__dict__ and m.w is m._parameters["w"]
    assert list(m.state_dict()) == ["w", "child.weight", "child.bias"]     # buf is not persistent
    m.buf = mdn.ones(3)            # re-assigning a buffer keeps it a (non-persistent) buffer
    assert "buf" in m._buffers and "buf" in m._non_persistent_buffers_set
    with pytest.raises(TypeError, match="cannot assign 'Tensor' as parameter 'w'"):
        m.w = mdn.ones(2)
    m.w = None
    assert m.w is None and "w" in m._parameters and list(m.parameters())[0] is m.child.weight
    del m.child
    with pytest.raises(AttributeError, match="'Module' object has no attribute 'child'"):
        m.child
    del m.plain
    with pytest.raises(KeyError, match="contain"):
        m.register_parameter("a.b", None)
    with pytest.raises(KeyError, match="already exists"):
        m.register_buffer("train", None)
    with pytest.raises(TypeError, match="Parameter or None required"):
        m.register_parameter("x", mdn.ones(1))
    with pytest.raises(ValueError, match="non-leaf"):
        m.register_parameter("x", _nonleaf_parameter())


def _nonleaf_parameter():
    p = nn.Parameter(mdn.ones(2))
    p.grad_fn = (p * 2).grad_fn      # a Parameter that is the output of an op
    return p


def test_assignment_before_init_is_a_clear_error():
    class Bad(nn.Module):
        def __init__(self):
            self.w = nn.Parameter(mdn.ones(1))

    with pytest.raises(AttributeError, match="before Module.__init__"):
        Bad()


def test_get_submodule_parameter_buffer():
    net = make_net()
    assert net.get_submodule("features.2.fc") is net.features[2].fc
    assert net.get_submodule("") is net
    assert net.get_parameter("heads.b.weight") is net.heads["b"].weight
    assert net.get_buffer("features.2.running") is net.features[2].running
    with pytest.raises(AttributeError, match="has no attribute `nope`"):
        net.get_submodule("features.nope")
    with pytest.raises(AttributeError, match="has no parameter `bias`"):
        net.get_parameter("heads.b.bias")


# ----------------------------------------------------------------------------------------------
# State dict
# ----------------------------------------------------------------------------------------------
def test_state_dict_roundtrip_in_place():
    src, dst = make_net(), make_net()
    with mdn.no_grad():
        src.features[2].running.fill_(3.0)
    params_before = list(dst.parameters())
    sd = src.state_dict()
    assert isinstance(sd, OrderedDict)
    assert "features.2.running" in sd and "features.2.scratch" not in sd
    assert all(not t.requires_grad and t.grad_fn is None for t in sd.values())
    result = dst.load_state_dict(sd)
    assert result.missing_keys == [] and result.unexpected_keys == []
    assert list(dst.parameters()) == params_before           # same objects: loaded in place
    for k, v in dst.state_dict().items():
        np.testing.assert_array_equal(v.numpy(), sd[k].numpy())
    x = mdn.randn(2, 4)
    np.testing.assert_array_equal(dst.features(x).numpy(), src.features(x).numpy())
    # Values are copies: changing the source afterwards leaves the destination alone.
    with mdn.no_grad():
        src.features[0].weight.fill_(7.0)
    assert not np.any(dst.features[0].weight.numpy() == 7.0)


def test_load_state_dict_strict_errors_list_keys_and_shapes():
    net = make_net()
    sd = net.state_dict()
    del sd["heads.a.bias"]
    sd["heads.c.weight"] = mdn.zeros(1)
    sd["features.0.weight"] = mdn.zeros(5, 4)
    before = net.features[0].bias.numpy().copy()
    sd["features.0.bias"] = mdn.zeros(3)
    with pytest.raises(RuntimeError) as info:
        net.load_state_dict(sd)
    msg = str(info.value)
    assert "Error(s) in loading state_dict for Sequential" in msg
    assert 'Missing key(s) in state_dict: "heads.a.bias"' in msg
    assert 'Unexpected key(s) in state_dict: "heads.c.weight"' in msg
    assert "size mismatch for features.0.weight: copying a param with shape (5, 4) from checkpoint, " \
           "the shape in current model is (3, 4)" in msg
    # Nothing was copied: a failed load leaves the module as it was.
    np.testing.assert_array_equal(net.features[0].bias.numpy(), before)


def test_load_state_dict_non_strict_returns_keys():
    net = make_net()
    sd = net.state_dict()
    del sd["heads.a.bias"]
    sd["extra"] = mdn.zeros(1)
    sd["features.0.bias"] = mdn.full((3,), 2.0)
    result = net.load_state_dict(sd, strict=False)
    assert result == (["heads.a.bias"], ["extra"])
    assert result.missing_keys == ["heads.a.bias"] and result.unexpected_keys == ["extra"]
    np.testing.assert_array_equal(net.features[0].bias.numpy(), [2.0, 2.0, 2.0])
    sd["features.0.bias"] = mdn.zeros(4)
    with pytest.raises(RuntimeError, match="size mismatch for features.0.bias"):
        net.load_state_dict(sd, strict=False)     # shape mismatches are errors even when not strict (PyTorch)


def test_load_pytorch_weights_gives_pytorch_outputs():
    torch = pytest.importorskip("torch")
    tnet = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Flatten(), torch.nn.Linear(8, 3))
    net = nn.Sequential(nn.Linear(4, 8), nn.Flatten(), nn.Linear(8, 3))
    net.load_state_dict({k: v.detach().numpy() for k, v in tnet.state_dict().items()})
    x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    np.testing.assert_allclose(net(mdn.tensor(x)).numpy(), tnet(torch.from_numpy(x)).detach().numpy(),
                               rtol=1.3e-6, atol=1e-5)


# ----------------------------------------------------------------------------------------------
# Modes, gradients, apply
# ----------------------------------------------------------------------------------------------
def test_train_eval_recursive():
    net = make_net()
    assert all(m.training for m in net.modules())
    assert net.eval() is net
    assert not any(m.training for m in net.modules())
    net.features.train()
    assert net.features[2].fc.training and not net.heads.training and not net.training
    with pytest.raises(ValueError, match="boolean"):
        net.train("yes")


def test_zero_grad_both_modes():
    net = nn.Linear(3, 2)
    net(mdn.randn(4, 3)).sum().backward()
    g = net.weight.grad
    net.zero_grad(set_to_none=False)
    assert net.weight.grad is g and not g.numpy().any()
    net(mdn.randn(4, 3)).sum().backward()
    assert net.weight.grad is g and g.numpy().any()      # accumulated into the same zeroed tensor
    net.zero_grad()
    assert net.weight.grad is None and net.bias.grad is None


def test_requires_grad_and_apply():
    net = make_net()
    net.requires_grad_(False)
    assert not any(p.requires_grad for p in net.parameters())
    seen = []
    net.apply(lambda m: seen.append(type(m).__name__))
    assert seen[-1] == "Sequential" and seen[0] == "Linear"        # children before parents
    assert len(seen) == len(list(net.modules()))
    net.apply(lambda m: nn.init.zeros_(m.weight) if isinstance(m, nn.Linear) else None)
    assert not net.heads["b"].weight.numpy().any()


# ----------------------------------------------------------------------------------------------
# Hooks
# ----------------------------------------------------------------------------------------------
def test_forward_hooks_modify_and_remove():
    lin = nn.Identity()
    calls = []
    h1 = lin.register_forward_pre_hook(lambda m, args: (args[0] * 2,))
    h2 = lin.register_forward_hook(lambda m, args, out: out + 1)
    h3 = lin.register_forward_hook(lambda m, args, out: calls.append("last"))
    h4 = lin.register_forward_hook(lambda m, args, out: calls.append("first"), prepend=True)
    np.testing.assert_array_equal(lin(mdn.ones(2)).numpy(), [3.0, 3.0])
    assert calls == ["first", "last"]
    h1.remove()
    h1.remove()      # idempotent
    np.testing.assert_array_equal(lin(mdn.ones(2)).numpy(), [2.0, 2.0])
    for h in (h2, h3, h4):
        h.remove()
    np.testing.assert_array_equal(lin(mdn.ones(2)).numpy(), [1.0, 1.0])
    assert not lin._forward_hooks and not lin._forward_pre_hooks


def test_forward_hooks_with_kwargs():
    class Scale(nn.Module):
        def forward(self, x, factor=1.0):
            return x * factor

    m = Scale()
    m.register_forward_pre_hook(lambda mod, args, kwargs: (args, {"factor": 3.0}), with_kwargs=True)
    seen = {}
    with m.register_forward_hook(lambda mod, args, kwargs, out: seen.update(kwargs), with_kwargs=True):
        np.testing.assert_array_equal(m(mdn.ones(1), factor=5.0).numpy(), [3.0])
    assert seen == {"factor": 3.0} and not m._forward_hooks


# ----------------------------------------------------------------------------------------------
# Devices and dtypes
# ----------------------------------------------------------------------------------------------
def test_to_dtype_keeps_parameter_identity_and_moves_grads():
    net = make_net()
    net.features[2].register_buffer("count", mdn.tensor(0))
    held = list(net.parameters())          # what an optimizer built earlier holds
    net.features(mdn.randn(2, 4)).sum().backward()
    grad = net.features[0].weight.grad
    assert net.double() is net
    assert list(net.parameters()) == held
    assert all(p.dtype == np.float64 for p in held)
    assert net.features[0].weight.grad is grad and grad.dtype == np.float64
    assert net.features[2].running.dtype == np.float64
    assert net.features[2].count.dtype == np.int64          # integer buffers keep their dtype
    out = net.features(mdn.randn(2, 4, dtype=np.float64))
    assert out.dtype == np.float64
    net.to(mdn.float32)
    assert all(p.dtype == np.float32 for p in held)
    with pytest.raises(TypeError, match="floating point"):
        net.to(mdn.int32)


def test_to_device_in_place(device):
    net = make_net()
    held = list(net.parameters())
    net.to(device)
    assert list(net.parameters()) == held
    assert all(str(t.device).startswith(device) for t in net.state_dict().values())
    out = net.features(mdn.randn(2, 4, device=device))
    out.sum().backward()
    assert str(net.features[0].weight.grad.device).startswith(device)
    net.cpu()
    assert all(t.device.type == "cpu" for t in net.state_dict().values())
    assert net.features[0].weight.grad.device.type == "cpu"


# ----------------------------------------------------------------------------------------------
# Printing
# ----------------------------------------------------------------------------------------------
def test_repr_matches_pytorch():
    torch = pytest.importorskip("torch")
    tnn = torch.nn
    t = tnn.Sequential(OrderedDict([
        ("body", tnn.Sequential(tnn.Linear(4, 2), tnn.Identity(), tnn.Flatten(), tnn.Unflatten(1, (2, 1)))),
        ("blocks", tnn.ModuleList([tnn.Linear(2, 2) for _ in range(3)] + [tnn.Linear(2, 3, bias=False)])),
        ("table", tnn.ModuleDict({"emb": tnn.Embedding(10, 3, padding_idx=0), "empty": tnn.ModuleList()})),
    ]))
    m = nn.Sequential(OrderedDict([
        ("body", nn.Sequential(nn.Linear(4, 2), nn.Identity(), nn.Flatten(), nn.Unflatten(1, (2, 1)))),
        ("blocks", nn.ModuleList([nn.Linear(2, 2) for _ in range(3)] + [nn.Linear(2, 3, bias=False)])),
        ("table", nn.ModuleDict({"emb": nn.Embedding(10, 3, padding_idx=0), "empty": nn.ModuleList()})),
    ]))
    assert repr(m) == repr(t)
    assert repr(nn.Sequential(nn.Linear(4, 2), nn.Identity())) == (
        "Sequential(\n  (0): Linear(in_features=4, out_features=2, bias=True)\n  (1): Identity()\n)")


# ----------------------------------------------------------------------------------------------
# Containers
# ----------------------------------------------------------------------------------------------
def test_sequential_indexing_slicing_and_editing():
    a, b, c = nn.Linear(2, 3), nn.Identity(), nn.Linear(3, 1)
    seq = nn.Sequential(a, b, c)
    assert len(seq) == 3 and list(seq) == [a, b, c]
    assert seq[0] is a and seq[-1] is c
    sub = seq[1:]
    assert isinstance(sub, nn.Sequential) and list(sub._modules) == ["1", "2"] and list(sub) == [b, c]
    with pytest.raises(IndexError, match="index 3 is out of range"):
        seq[3]
    d = nn.Linear(1, 1)
    seq.append(d)
    assert seq[3] is d and seq(mdn.randn(5, 2)).shape == (5, 1)
    del seq[1]
    assert list(seq._modules) == ["0", "1", "2"] and list(seq) == [a, c, d]      # renumbered, as PyTorch does
    seq[1] = b
    assert seq[1] is b
    seq.insert(0, nn.Identity())
    assert list(seq._modules) == ["0", "1", "2", "3"] and seq[1] is a
    named = nn.Sequential(OrderedDict([("first", a), ("second", c)]))
    assert named.first is a and named[1] is c


def test_module_list_and_dict():
    layers = nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2)])
    layers += [nn.Identity()]
    layers.insert(1, nn.Flatten())
    assert [type(m).__name__ for m in layers] == ["Linear", "Flatten", "Linear", "Identity"]
    assert isinstance(layers[1:3], nn.ModuleList) and len(layers[1:3]) == 2
    assert len(list(layers.parameters())) == 4
    with pytest.raises(NotImplementedError, match="iterate"):
        layers(mdn.ones(1))

    d = nn.ModuleDict({"x": nn.Linear(1, 1)})
    d["y"] = nn.Identity()
    d.update([("z", nn.Flatten())])
    assert list(d) == ["x", "y", "z"] and "y" in d and len(d) == 3
    assert list(d.keys()) == ["x", "y", "z"] and isinstance(d.pop("z"), nn.Flatten)
    del d["y"]
    assert list(d.items())[0][0] == "x"
    assert [n for n, _ in d.named_parameters()] == ["x.weight", "x.bias"]


def test_parameter_list_and_dict():
    pl = nn.ParameterList([nn.Parameter(mdn.ones(2, 3)), mdn.zeros(1)])
    assert isinstance(pl[1], nn.Parameter) and len(pl) == 2 and pl[-1] is pl[1]
    pl.append(nn.Parameter(mdn.ones(1)))
    assert [n for n, _ in pl.named_parameters()] == ["0", "1", "2"]
    assert "(0): Parameter containing: [float32 of size 2x3]" in repr(pl)
    pd = nn.ParameterDict({"a": nn.Parameter(mdn.ones(1))})
    pd["b"] = mdn.zeros(2)
    assert list(pd) == ["a", "b"] and isinstance(pd["b"], nn.Parameter)
    assert list(pd.state_dict()) == ["a", "b"]


# ----------------------------------------------------------------------------------------------
# Layers
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(5, 4), (2, 3, 4)])
def test_linear_matches_torch(device, bias, shape):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    lin = nn.Linear(4, 3, bias=bias).to(device)
    x_np = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    x = mdn.tensor(x_np, device=device, requires_grad=True)
    y = lin(x)
    gy = np.random.default_rng(2).standard_normal(y.shape).astype(np.float32)
    y.backward(mdn.tensor(gy, device=device))

    tw = torch.tensor(lin.weight.numpy() if device == "cpu" else lin.weight.cpu().numpy(), requires_grad=True)
    tb = torch.tensor(lin.bias.cpu().numpy(), requires_grad=True) if bias else None
    tx = torch.tensor(x_np, requires_grad=True)
    ty = F.linear(tx, tw, tb)
    ty.backward(torch.from_numpy(gy))
    tol = dict(rtol=1.3e-6, atol=1e-5)
    np.testing.assert_allclose(y.cpu().numpy(), ty.detach().numpy(), **tol)
    np.testing.assert_allclose(x.grad.cpu().numpy(), tx.grad.numpy(), **tol)
    np.testing.assert_allclose(lin.weight.grad.cpu().numpy(), tw.grad.numpy(), **tol)
    if bias:
        np.testing.assert_allclose(lin.bias.grad.cpu().numpy(), tb.grad.numpy(), **tol)


def test_linear_init_bounds_and_seed():
    mdn.manual_seed(0)
    lin = nn.Linear(400, 300)
    bound = 1 / np.sqrt(400)
    w, b = lin.weight.numpy(), lin.bias.numpy()
    assert np.abs(w).max() <= bound and np.abs(b).max() <= bound
    assert abs(w.std() - bound / np.sqrt(3)) < 0.01 * bound        # uniform(-a, a) has std a / sqrt(3)
    mdn.manual_seed(0)
    np.testing.assert_array_equal(nn.Linear(400, 300).weight.numpy(), w)
    assert nn.Linear(2, 3, dtype=mdn.float64).weight.dtype == np.float64
    with pytest.raises(RuntimeError, match="expects a last dimension of 400"):
        lin(mdn.ones(2, 3))


def test_embedding_matches_torch_with_padding(device):
    torch = pytest.importorskip("torch")
    emb = nn.Embedding(6, 3, padding_idx=2).to(device)
    assert not emb.weight.cpu().numpy()[2].any()
    with mdn.no_grad():
        emb.weight[2] = 0.5        # a user-set pad vector is returned as stored, and still gets no gradient
    temb = torch.nn.Embedding(6, 3, padding_idx=2)
    with torch.no_grad():
        temb.weight.copy_(torch.from_numpy(emb.weight.cpu().numpy()))
    idx = np.array([[0, 2, 5], [2, 2, 1]])
    y = emb(mdn.tensor(idx, device=device))
    ty = temb(torch.from_numpy(idx))
    np.testing.assert_array_equal(y.cpu().numpy(), ty.detach().numpy())
    gy = np.arange(18, dtype=np.float32).reshape(2, 3, 3)
    y.backward(mdn.tensor(gy, device=device))
    ty.backward(torch.from_numpy(gy))
    np.testing.assert_allclose(emb.weight.grad.cpu().numpy(), temb.weight.grad.numpy())
    assert not emb.weight.grad.cpu().numpy()[2].any()
    assert repr(emb) == repr(temb)


@pytest.mark.parametrize("kw", [{"max_norm": 1.0}, {"max_norm": 0.5, "norm_type": 1.0}, {"scale_grad_by_freq": True},
                                {"padding_idx": 1, "max_norm": 1.2, "scale_grad_by_freq": True}])
def test_embedding_max_norm_and_scale_grad_by_freq_match_torch(kw, device):
    """PyTorch's positional order (padding_idx, max_norm, norm_type, scale_grad_by_freq, sparse) and semantics:
    looked-up rows renormalised in place before the lookup, gradients divided by each row's count."""
    torch = pytest.importorskip("torch")
    w0 = np.random.default_rng(5).standard_normal((6, 3)).astype(np.float32) * 2
    emb = nn.Embedding.from_pretrained(mdn.tensor(w0), freeze=False, **kw).to(device)
    temb = torch.nn.Embedding.from_pretrained(torch.from_numpy(w0.copy()), freeze=False, **kw)
    idx = np.array([[0, 1, 5], [1, 1, 3]])
    y, ty = emb(mdn.tensor(idx, device=device)), temb(torch.from_numpy(idx))
    np.testing.assert_allclose(y.detach().cpu().numpy(), ty.detach().numpy(), rtol=1e-6)
    np.testing.assert_allclose(emb.weight.detach().cpu().numpy(), temb.weight.detach().numpy(), rtol=1e-6)
    gy = np.arange(18, dtype=np.float32).reshape(2, 3, 3)
    y.backward(mdn.tensor(gy, device=device))
    ty.backward(torch.from_numpy(gy))
    np.testing.assert_allclose(emb.weight.grad.cpu().numpy(), temb.weight.grad.numpy(), rtol=1e-6)
    assert repr(emb) == repr(temb)
    positional = nn.Embedding(6, 3, None, 1.0)                   # the 4th positional argument is max_norm
    assert positional.max_norm == 1.0 and repr(positional) == repr(torch.nn.Embedding(6, 3, None, 1.0))
    with pytest.raises(ValueError, match="sparse"):
        nn.Embedding(6, 3, sparse=True)


def test_embedding_from_pretrained_and_errors():
    w = mdn.randn(4, 2)
    emb = nn.Embedding.from_pretrained(w)
    assert not emb.weight.requires_grad
    np.testing.assert_array_equal(emb(mdn.tensor([3, 0])).numpy(), w.numpy()[[3, 0]])
    with pytest.raises(TypeError, match="integer"):
        emb(mdn.ones(2))
    with pytest.raises(ValueError, match="padding_idx 9"):
        nn.Embedding(4, 2, padding_idx=9)


def test_flatten_unflatten_match_torch():
    torch = pytest.importorskip("torch")
    x = np.zeros((2, 3, 4, 5), dtype=np.float32)
    for args in [(), (0, -1), (1, 2), (2, 3)]:
        assert nn.Flatten(*args)(mdn.tensor(x)).shape == tuple(torch.nn.Flatten(*args)(torch.from_numpy(x)).shape)
    for dim, size in [(1, (3, 1)), (-1, (5, 1)), (2, (2, -1))]:
        got = nn.Unflatten(dim, size)(mdn.tensor(x)).shape
        assert got == tuple(torch.nn.Unflatten(dim, size)(torch.from_numpy(x)).shape)
    with pytest.raises(RuntimeError, match="cannot be split into"):
        nn.Unflatten(1, (2, 2))(mdn.tensor(x))
    assert nn.Identity(1, foo=2)(mdn.ones(1)).shape == (1,)

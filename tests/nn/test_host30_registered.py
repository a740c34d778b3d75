"""Host round 30 (docs/host_overhead.md): ``module.registered`` also finds submodules (Module.__getattr__'s third
registry, after parameters and buffers), and convolution / linear layers read their weight and bias through it
(switch ``module.REGISTERED_LAYERS``; the model zoo's forwards stay written the PyTorch way: they are the examples
users copy, and bench/train_step.py runs the same source as its PyTorch twins).  The reads must give what
``getattr`` gives in every case -- a replaced or surgically swapped submodule, a name registered twice, an instance
or class attribute shadowing a registry, a type with its own ``__getattr__`` -- and the models' forward and backward
the same bits with the switch on and off."""
import numpy as np
import pytest

import minidnn as mdn
from minidnn import models
from minidnn.nn import module as M

BLOCK = ("conv1", "bn1", "conv2", "bn2", "relu", "shortcut")


@pytest.fixture(autouse=True)
def _restore():
    yield
    M.REGISTERED_LAYERS[0] = True
    M.REGISTERED_READS[0] = True


def test_registered_finds_submodules_in_getattr_order():
    mdn.manual_seed(0)
    block = models.BasicBlock(4, 8, stride=2)
    r = M.registered(block, BLOCK)
    assert r is not None and all(v is getattr(block, n) for v, n in zip(r, BLOCK))
    conv = mdn.nn.Conv2d(2, 3, 1)
    conv._modules["weight"] = mdn.nn.ReLU()        # a submodule of a parameter's name: the parameter comes first
    assert M.registered(conv, ("weight",))[0] is conv.weight is conv._parameters["weight"]
    assert M.registered(block, ("conv1", "nothing")) is None        # in no registry: the reads raise


def test_registered_declines_shadowed_names():
    block = models.BasicBlock(4, 4)
    object.__setattr__(block, "relu", mdn.nn.Identity())       # an instance attribute: the normal lookup finds it
    assert M.registered(block, BLOCK) is None

    class OwnGetattr(models.BasicBlock):
        def __getattr__(self, name):
            return super().__getattr__(name)

    assert M.registered(OwnGetattr(4, 4), BLOCK) is None

    class WithProperty(mdn.nn.Conv2d):
        pass

    conv = WithProperty(2, 3, 1)
    WithProperty.weight = property(lambda self: mdn.tensor(np.ones((3, 2, 1, 1), np.float32)))
    try:
        assert M.registered(conv, ("weight", "bias")) is None
        x = mdn.tensor(np.ones((1, 2, 2, 2), np.float32))
        y = conv(x).data            # the property's all-ones filter, as ``conv.weight`` reads it
        assert np.allclose(y, 2.0 + conv.bias.data.reshape(1, 3, 1, 1))
    finally:
        del WithProperty.weight


def _x(shape, seed=0):
    return mdn.tensor(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


@pytest.mark.parametrize("name", ["resnet20", "mobilenet", "lenet5"])
def test_models_same_bits_on_and_off(name):
    make, shape = {"resnet20": (lambda: models.resnet20(num_classes=10), (2, 3, 8, 8)),
                   "mobilenet": (lambda: models.MobileNetSmall(num_classes=10, in_channels=3), (2, 3, 8, 8)),
                   "lenet5": (lambda: models.LeNet5(num_classes=10, in_channels=1, input_size=32),
                              (2, 1, 32, 32))}[name]
    res = {}
    for on in (True, False):
        M.REGISTERED_LAYERS[0] = on
        mdn.manual_seed(0)
        m = make()
        out = m(_x(shape))
        out.sum().backward()
        res[on] = [out.data.copy()] + [p.grad.data.copy() for p in m.parameters()]
    assert len(res[True]) == len(res[False])
    for a, b in zip(res[True], res[False]):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("on", [True, False])
def test_replaced_submodules_are_used(on):
    M.REGISTERED_LAYERS[0] = on
    mdn.manual_seed(0)
    block = models.BasicBlock(3, 3)
    x = _x((1, 3, 4, 4))
    block.relu = mdn.nn.Identity()                       # through __setattr__: the registry holds the new one
    block._modules["bn2"] = mdn.nn.Identity()            # module surgery on the registry itself
    want = block.conv2(block.bn1(block.conv1(x))) + x       # both ReLUs and bn2 the identity now
    got = block(x)
    assert np.allclose(got.data, want.data, atol=1e-6)
    m = models.MobileNetSmall(num_classes=10, in_channels=3)
    m.fc = mdn.nn.Linear(128, 5)
    assert tuple(m(_x((2, 3, 8, 8))).shape) == (2, 5)


@pytest.mark.parametrize("bias", [True, False])
def test_conv_and_linear_layers(bias):
    for on in (True, False):
        M.REGISTERED_LAYERS[0] = on
        mdn.manual_seed(1)
        conv = mdn.nn.Conv2d(3, 4, 3, padding=1, bias=bias)
        lin = mdn.nn.Linear(4, 2, bias=bias)
        y = lin(conv(_x((2, 3, 5, 5))).mean(dim=(2, 3)))
        ref = mdn.nn.functional.linear(mdn.nn.functional.conv2d(_x((2, 3, 5, 5)), conv.weight, conv.bias, 1, 1)
                                       .mean(dim=(2, 3)), lin.weight, lin.bias)
        assert np.array_equal(y.data, ref.data)
        with pytest.raises(RuntimeError, match="last dimension"):
            lin(_x((2, 3)))


def test_forwards_read_through_registered_when_on(monkeypatch):
    from minidnn.nn.layers import conv as conv_layers
    from minidnn.nn.layers import linear as linear_layers
    calls = []

    def counted(module, names):
        calls.append(type(module).__name__)
        return M.registered(module, names)
    for mod in (conv_layers, linear_layers):
        monkeypatch.setattr(mod, "registered", counted)
    m = models.resnet20(num_classes=10)
    x = _x((1, 3, 8, 8))
    for on in (True, False):
        M.REGISTERED_LAYERS[0] = on
        calls.clear()
        m(x)
        if on:      # 21 convolutions (shortcuts' included), the linear layer
            assert sorted(set(calls)) == ["Conv2d", "Linear"], calls
            assert calls.count("Conv2d") == 21 and calls.count("Linear") == 1, calls
        else:
            assert calls == []


def test_one_call_reads_stay_exact_when_registries_change():
    # a type's reads learn which registry held every name (parameters for a layer, submodules for a block) and try
    # that one first; whatever changes afterwards, the values are getattr's, or None where a name is in none
    conv = mdn.nn.Conv2d(2, 3, 1)
    for _ in range(2):
        assert M.registered(conv, ("weight", "bias")) == [conv.weight, conv.bias]
    other = mdn.nn.Conv2d(2, 3, 1)
    del other._parameters["bias"]
    assert M.registered(other, ("weight", "bias")) is None
    other._modules["bias"] = mdn.nn.ReLU()              # now a submodule of that name
    assert M.registered(other, ("weight", "bias")) == [other.weight, other.bias]
    block = models.BasicBlock(3, 3)
    for _ in range(2):
        assert M.registered(block, BLOCK) == [getattr(block, n) for n in BLOCK]
    p = mdn.nn.Parameter(mdn.tensor(np.ones(1, np.float32)))
    block._parameters["relu"] = p                       # a parameter comes before the submodule of its name
    block._buffers["bn1"] = mdn.tensor(np.zeros(1, np.float32))     # ... and a buffer too
    r = M.registered(block, BLOCK)
    assert r[4] is p is block.relu and r[1] is block._buffers["bn1"] is block.bn1
    assert r == [getattr(block, n) for n in BLOCK]
    del block._modules["shortcut"]
    assert M.registered(block, BLOCK) is None


def test_batch_norm_reads_parameters_then_buffers_exactly():
    names = ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")
    bn = mdn.nn.BatchNorm2d(3)
    for _ in range(2):
        assert M.registered(bn, names) == [getattr(bn, n) for n in names]
    p = mdn.nn.Parameter(mdn.tensor(np.ones(3, np.float32)))
    bn._parameters["running_mean"] = p                  # a parameter of a buffer's name comes first
    r = M.registered(bn, names)
    assert r[2] is p is bn.running_mean and r == [getattr(bn, n) for n in names]
    bn = mdn.nn.BatchNorm2d(3)
    M.registered(bn, names)
    del bn._buffers["running_var"]
    assert M.registered(bn, names) is None
    M.REGISTERED_LAYERS[0] = False                      # round 25's name-by-name reads: the same values
    bn = mdn.nn.BatchNorm2d(3)
    assert M.registered(bn, names) == [getattr(bn, n) for n in names]

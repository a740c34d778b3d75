"""Host round 30 (docs/host_overhead.md): convolution / linear layers read their weight and bias through
``module.registered`` (switch ``module.REGISTERED_LAYERS``; round 31 removed its submodule reads, which no caller
used once the model zoo's forwards went back to the PyTorch way).  The reads must give what ``getattr`` gives in
every case -- a name that is a submodule (declined: the caller reads it), a name registered twice, an instance or
class attribute shadowing a registry, a type with its own ``__getattr__``, registries changed under a learnt read --
and the models' forward and backward the same bits with the switch on and off."""
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


def test_registered_declines_submodules_and_takes_parameters_first():
    mdn.manual_seed(0)
    block = models.BasicBlock(4, 8, stride=2)
    for on in (True, False):
        M.REGISTERED_LAYERS[0] = on
        assert M.registered(block, BLOCK) is None                   # submodules: the caller reads them itself
        assert M.registered(block, ("conv1",)) is None
        conv = mdn.nn.Conv2d(2, 3, 1)
        conv._modules["weight"] = mdn.nn.ReLU()    # a submodule of a parameter's name: the parameter comes first
        assert M.registered(conv, ("weight",))[0] is conv.weight is conv._parameters["weight"]
        assert M.registered(conv, ("weight", "nothing")) is None    # in no registry: the reads raise


def test_registered_declines_shadowed_names():
    conv = mdn.nn.Conv2d(2, 3, 1)
    object.__setattr__(conv, "bias", None)      # an instance attribute: the normal lookup finds it
    assert M.registered(conv, ("weight", "bias")) is None

    class OwnGetattr(mdn.nn.Conv2d):
        def __getattr__(self, name):
            return super().__getattr__(name)

    assert M.registered(OwnGetattr(2, 3, 1), ("weight", "bias")) is None

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


def assert_models_same_bits_on_and_off(name, switch):
    """A model's forward and backward with ``switch`` (a one-element list) on and off: the same bits."""
    make, shape = {"resnet20": (lambda: models.resnet20(num_classes=10), (2, 3, 8, 8)),
                   "mobilenet": (lambda: models.MobileNetSmall(num_classes=10, in_channels=3), (2, 3, 8, 8)),
                   "lenet5": (lambda: models.LeNet5(num_classes=10, in_channels=1, input_size=32),
                              (2, 1, 32, 32))}[name]
    res = {}
    for on in (True, False):
        switch[0] = on
        mdn.manual_seed(0)
        m = make()
        out = m(_x(shape))
        out.sum().backward()
        res[on] = [out.data.copy()] + [p.grad.data.copy() for p in m.parameters()]
    switch[0] = True
    assert len(res[True]) == len(res[False])
    for a, b in zip(res[True], res[False]):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("name", ["resnet20", "mobilenet", "lenet5"])
def test_models_same_bits_on_and_off(name):
    assert_models_same_bits_on_and_off(name, M.REGISTERED_LAYERS)


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
    # a type's reads learn which registry held every name (parameters for a layer) and try that one first; whatever
    # changes afterwards, the values are getattr's, or None where a name is in neither registry
    conv = mdn.nn.Conv2d(2, 3, 1)
    for _ in range(2):
        assert M.registered(conv, ("weight", "bias")) == [conv.weight, conv.bias]
    other = mdn.nn.Conv2d(2, 3, 1)
    del other._parameters["bias"]
    assert M.registered(other, ("weight", "bias")) is None
    other._modules["bias"] = mdn.nn.ReLU()              # now a submodule of that name: declined, getattr finds it
    assert M.registered(other, ("weight", "bias")) is None and isinstance(other.bias, mdn.nn.ReLU)
    other._buffers["bias"] = mdn.tensor(np.zeros(3, np.float32))    # a buffer comes before the submodule
    r = M.registered(other, ("weight", "bias"))
    assert r == [other.weight, other.bias] and r[1] is other._buffers["bias"]
    other._parameters["bias"] = b = mdn.nn.Parameter(mdn.tensor(np.ones(3, np.float32)))    # ... a parameter first
    assert M.registered(other, ("weight", "bias")) == [other.weight, b] and other.bias is b


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

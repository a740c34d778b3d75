"""``nn.module.registered`` (docs/host_overhead.md round 25): batch norm's forward reads its five registered tensors
from the registries instead of five attribute reads through Module.__getattr__.  It must give what the
attribute reads give, or None where it cannot know that (then the layer reads its attributes as before): a type
defining the name (a property), a type with its own __getattr__ / __getattribute__, the name in the instance
__dict__, a name no parameter or buffer holds (a deleted buffer: the old AttributeError, or none where the old
forward never read it), the switch off.  Layer outputs, gradients, running statistics, state_dict and eval outputs
are the same bits with the switch on and off (CPU arithmetic)."""
import numpy as np
import pytest

import minidnn as mdn
from minidnn.nn import module as M

NAMES = ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")


@pytest.fixture(autouse=True)
def _switch_back():
    yield
    M.REGISTERED_READS[0] = True


def _run(make, x_shape, on, steps=3, eval_too=True, dtype=np.float32):
    M.REGISTERED_READS[0] = on
    mdn.manual_seed(0)
    layer = make()
    rng = np.random.default_rng(1)
    outs = []
    for _ in range(steps):
        x = mdn.tensor(rng.standard_normal(x_shape).astype(dtype), requires_grad=True)
        y = layer(x)
        (y * y).sum().backward()
        outs.append(y.data.copy())
        outs.append(x.grad.data.copy())
    for p in layer.parameters():
        outs.append(p.grad.data.copy())
    if eval_too:
        layer.eval()
        with mdn.no_grad():
            outs.append(layer(mdn.tensor(rng.standard_normal(x_shape).astype(dtype))).data.copy())
    sd = {k: v.data.copy() for k, v in layer.state_dict().items()}
    return outs, sd


@pytest.mark.parametrize("make,shape", [
    (lambda: mdn.nn.BatchNorm2d(4), (3, 4, 5, 5)),
    (lambda: mdn.nn.BatchNorm1d(4, momentum=None), (6, 4)),
    (lambda: mdn.nn.BatchNorm3d(2, affine=False), (2, 2, 3, 3, 3)),
    (lambda: mdn.nn.BatchNorm2d(4, track_running_stats=False), (3, 4, 5, 5)),
])
def test_layers_same_bits_with_registered_reads_on_and_off(make, shape):
    a, sda = _run(make, shape, True)
    b, sdb = _run(make, shape, False)
    assert len(a) == len(b)
    for u, v in zip(a, b):
        assert u.dtype == v.dtype and np.array_equal(u.view(np.uint8), v.view(np.uint8))
    assert sda.keys() == sdb.keys()
    for k in sda:
        assert np.array_equal(sda[k], sdb[k]), k


def test_registered_gives_the_attribute_values():
    bn = mdn.nn.BatchNorm2d(3)
    assert M.registered(bn, NAMES) is not None
    for v, n in zip(M.registered(bn, NAMES), NAMES):
        assert v is getattr(bn, n)
    bn2 = mdn.nn.BatchNorm2d(3, affine=False, track_running_stats=False)
    assert M.registered(bn2, NAMES) == [None] * 5      # registered as None: the same Nones the reads give
    conv = mdn.nn.Conv2d(2, 2, 1, bias=False)
    assert M.registered(conv, ("weight", "bias")) == [conv.weight, None]


def test_registered_declines_what_it_cannot_vouch_for():
    class WithProperty(mdn.nn.BatchNorm2d):
        pass

    p = WithProperty(3)     # (registration refuses a name the type defines: the property comes after it)
    WithProperty.weight = property(lambda self: self._parameters["bias"])
    assert M.registered(p, NAMES) is None
    assert M.registered(p, ("bias",)) is not None       # decided per type and names

    class OwnGetattr(mdn.nn.BatchNorm2d):
        def __getattr__(self, name):
            return super().__getattr__(name)

    assert M.registered(OwnGetattr(3), NAMES) is None

    bn = mdn.nn.BatchNorm2d(3)
    object.__setattr__(bn, "bias", "shadow")          # an instance attribute: the normal lookup finds it
    assert M.registered(bn, NAMES) is None
    bn = mdn.nn.BatchNorm2d(3)
    del bn.running_mean                               # in no registry now
    assert M.registered(bn, NAMES) is None
    M.REGISTERED_READS[0] = False
    assert M.registered(mdn.nn.BatchNorm2d(3), NAMES) is None


def test_layers_outside_registered_behave_as_before():
    class WithProperty(mdn.nn.BatchNorm2d):
        pass

    x = mdn.tensor(np.random.default_rng(0).standard_normal((4, 3, 2, 2)).astype(np.float32))
    res = {}
    for on in (True, False):
        M.REGISTERED_READS[0] = on
        mdn.manual_seed(0)
        layer = WithProperty(3)
        # a frozen scale of 2 as the type's own attribute: it wins over the registry
        WithProperty.weight = property(lambda self: mdn.tensor(np.full(3, 2.0, np.float32)))
        res[on] = layer(x).data
        del WithProperty.weight
    assert np.array_equal(res[True], res[False])
    plain = mdn.nn.BatchNorm2d(3)(x).data
    assert np.allclose(res[True], 2 * plain, atol=1e-6)

    errors = {}
    for on in (True, False):
        M.REGISTERED_READS[0] = on
        bn = mdn.nn.BatchNorm2d(3)
        del bn.running_mean
        try:
            bn(x)
        except AttributeError as e:
            errors[on] = str(e)
        bn = mdn.nn.BatchNorm2d(3, track_running_stats=False)
        del bn.running_var      # never read by a training forward without running statistics: no error
        bn(x)
    assert errors[True] == errors[False] and "running_mean" in errors[True]

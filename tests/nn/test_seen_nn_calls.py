"""The nn-level validated-call shortcuts (docs/host_overhead.md round 10): conv's descriptor and batch_norm's checks
are skipped for a call whose arguments passed them before.  A remembered call must give the bits of a fresh one, and
every bad call must still raise what the full path raises, whatever was remembered before it."""
import numpy as np
import pytest

import minidnn as mdn
from minidnn.backend.errors import ArgumentError, DTypeError
from minidnn.nn import functional as F
from minidnn.nn._functions import conv as conv_mod
from minidnn.nn._functions import norm as norm_mod


def _t(a, grad=False):
    t = mdn.tensor(np.asarray(a))
    t.requires_grad = grad
    return t


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def _conv_step(x, w, b, **kw):
    y = F.conv2d(x, w, b, **kw)
    y.sum().backward()
    return y.data.copy(), x.grad.data.copy(), w.grad.data.copy()


def test_conv_remembered_call_same_bits(rng):
    xa, wa, ba = rng.standard_normal((2, 3, 7, 6)), rng.standard_normal((4, 3, 3, 3)), rng.standard_normal(4)
    conv_mod._SEEN_CONV.clear()
    first = _conv_step(_t(xa, True), _t(wa, True), _t(ba), stride=(2, 1), padding=1)
    assert len(conv_mod._SEEN_CONV) == 1
    again = _conv_step(_t(xa, True), _t(wa, True), _t(ba), stride=(2, 1), padding=1)
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    conv_mod._SEEN_CONV.clear()
    fresh = _conv_step(_t(xa, True), _t(wa, True), _t(ba), stride=(2, 1), padding=1)
    for a, b in zip(first, fresh):
        np.testing.assert_array_equal(a, b)


def test_conv_bad_calls_raise_after_remembered(rng):
    x, w, b = _t(rng.standard_normal((2, 3, 5, 5))), _t(rng.standard_normal((4, 3, 3, 3))), _t(np.zeros(4))
    F.conv2d(x, w, b, stride=1, padding=1)
    F.conv2d(x, w, b, stride=1, padding=1)
    with pytest.raises(DTypeError):         # 1.0 == 1 and hashes like it: must not meet the remembered key
        F.conv2d(x, w, b, stride=1.0, padding=1)
    with pytest.raises(DTypeError):
        F.conv2d(x, w, b, stride=(1, 1.0), padding=1)
    with pytest.raises(ArgumentError):      # bias of the wrong length
        F.conv2d(x, w, _t(np.zeros(5)), stride=1, padding=1)
    with pytest.raises(DTypeError):         # bias of another dtype
        F.conv2d(x, w, _t(np.zeros(4, np.float32)), stride=1, padding=1)
    with pytest.raises(DTypeError):         # weight of another dtype
        F.conv2d(x, _t(rng.standard_normal((4, 3, 3, 3)).astype(np.float32)), b, stride=1, padding=1)
    with pytest.raises(ArgumentError):      # channels
        F.conv2d(_t(rng.standard_normal((2, 2, 5, 5))), w, b, stride=1, padding=1)
    with pytest.raises(ArgumentError):      # kernel larger than the padded input: same settings, smaller x
        F.conv2d(_t(rng.standard_normal((2, 3, 1, 1))), w, b, stride=1, padding=0)
    with pytest.raises(DTypeError):         # not a Tensor
        F.conv2d(x.data, w, b, stride=1, padding=1)
    with pytest.raises(DTypeError):         # integer input
        F.conv2d(_t(np.zeros((2, 3, 5, 5), np.int64)), w, b, stride=1, padding=1)
    with pytest.raises(ArgumentError):
        F.conv2d(x, w, b, stride=1, padding="full")
    with pytest.raises(ArgumentError):      # groups must divide the channels
        F.conv2d(x, w, b, stride=1, padding=1, groups=2)


def test_conv_unbatched_and_same_padding_not_remembered(rng):
    w = _t(rng.standard_normal((4, 3, 3, 3)))
    xa = rng.standard_normal((3, 5, 5))
    conv_mod._SEEN_CONV.clear()
    y1 = F.conv2d(_t(xa), w, padding=1)
    y2 = F.conv2d(_t(xa), w, padding=1)     # unbatched: must be batched and squeezed again
    assert y1.shape == y2.shape == (4, 5, 5)
    np.testing.assert_array_equal(y1.data, y2.data)
    y3 = F.conv2d(_t(xa[None]), w, padding="same")
    y4 = F.conv2d(_t(xa[None]), w, padding="same")
    np.testing.assert_array_equal(y3.data[0], y1.data)
    np.testing.assert_array_equal(y4.data, y3.data)
    assert len(conv_mod._SEEN_CONV) == 0


def _bn(x, layer):
    y = layer(x)
    y.sum().backward()
    return (y.data.copy(), x.grad.data.copy(), layer.weight.grad.data.copy(), layer.running_mean.data.copy(),
            layer.running_var.data.copy(), int(layer.num_batches_tracked.data))


def test_batch_norm_remembered_call_same_bits(rng):
    xa = rng.standard_normal((4, 3, 5, 5))
    results = []
    for clear in (True, False, True):
        if clear:
            norm_mod._SEEN_BN.clear()
        mdn.manual_seed(0)
        layer = mdn.nn.BatchNorm2d(3).double()
        r = _bn(_t(xa, True), layer)
        r2 = _bn(_t(xa, True), layer)       # the second call is remembered, running statistics updated again
        results.append(r + r2)
        assert norm_mod._SEEN_BN
    for other in results[1:]:
        for a, b in zip(results[0], other):
            np.testing.assert_array_equal(a, b)


def test_batch_norm_bad_calls_raise_after_remembered(rng):
    x = _t(rng.standard_normal((4, 3, 5, 5)))
    rm, rv, w, b = _t(np.zeros(3)), _t(np.ones(3)), _t(np.ones(3)), _t(np.zeros(3))
    F.batch_norm(x, rm, rv, w, b, training=True)
    F.batch_norm(x, rm, rv, w, b, training=True)
    F.batch_norm(x, rm, rv, w, b, training=False)
    with pytest.raises(ArgumentError):      # weight of the wrong length
        F.batch_norm(x, rm, rv, _t(np.ones(4)), b, training=True)
    with pytest.raises(ArgumentError):      # one of the two running statistics
        F.batch_norm(x, rm, None, w, b, training=True)
    with pytest.raises(ArgumentError):      # eval needs running statistics
        F.batch_norm(x, None, None, w, b, training=False)
    with pytest.raises(ArgumentError):      # one value per channel in training
        F.batch_norm(_t(rng.standard_normal((1, 3, 1, 1))), rm, rv, w, b, training=True)
    with pytest.raises(ArgumentError):
        F.batch_norm(_t(rng.standard_normal(3)), rm, rv, w, b, training=True)
    with pytest.raises(DTypeError):
        F.batch_norm(x.data, rm, rv, w, b, training=True)
    with pytest.raises(DTypeError):         # a non-Tensor weight
        F.batch_norm(x, rm, rv, np.ones(3), b, training=True)


def test_batch_norm_eval_channels_last_after_remembered(rng):
    xa = rng.standard_normal((2, 3, 4, 5))
    rm, rv = _t(rng.standard_normal(3)), _t(rng.random(3) + 0.5)
    x = _t(xa)
    want = F.batch_norm(x, rm, rv, training=False).data
    F.batch_norm(x, rm, rv, training=False)
    xc = x.to(memory_format=mdn.channels_last)       # same shape and dtype, other strides: its own key
    got = F.batch_norm(xc, rm, rv, training=False)
    np.testing.assert_allclose(got.data, want, rtol=1e-12, atol=1e-12)
    assert got.is_contiguous(memory_format=mdn.channels_last)

"""The shared table of functional ops: every row runs on every device through

  (a) float64 gradcheck of the minidnn op (tiny shapes: gradcheck does 2 * numel forwards per input),
  (b) forward and backward against PyTorch in float32 with assert_close's float32 tolerances
      (rtol 1.3e-6, atol 1e-5) unless the row documents why it needs more,
  (c) gradgradcheck for the rows whose op supports double backward.

A row's ``call`` takes the functional module first, so one lambda serves minidnn and PyTorch:
``lambda F, x, w: F.conv2d(x, w, stride=2)``.  Adding an op = adding a row.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import minidnn as mdn
import minidnn.nn.functional as F
from minidnn.autograd import gradcheck, gradgradcheck


@dataclasses.dataclass
class Arg:
    """How to make one input: ``kind`` randn / uniform (0, 1) / positive / softmax (along dim 1) /
    int (class indices in [0, high), a fraction ``ignore`` set to -100)."""
    shape: tuple
    kind: str = "randn"
    grad: bool = True
    scale: float = 1.0
    high: int = 0
    ignore: float = 0.0

    def make(self, rng, dtype):
        if self.kind == "int":
            t = rng.integers(0, self.high, self.shape)
            if self.ignore:
                t[rng.random(self.shape) < self.ignore] = -100
                t.reshape(-1)[0] = 0          # keep at least one valid element
            return t.astype(np.int64)
        if self.kind == "uniform":
            a = rng.uniform(0.05, 0.95, self.shape)
        elif self.kind == "positive":
            a = rng.uniform(0.5, 2.0, self.shape)
        elif self.kind == "softmax":
            e = np.exp(rng.standard_normal(self.shape))
            a = e / e.sum(axis=1, keepdims=True)
        else:
            a = rng.standard_normal(self.shape) * self.scale
        return a.astype(dtype)


def G(*shape, **kw):
    return Arg(shape, **kw)


def C(*shape, **kw):
    """A constant (no gradient) input."""
    return Arg(shape, grad=False, **kw)


@dataclasses.dataclass
class Row:
    id: str
    args: list
    call: object
    torch_call: object = None       # None: ``call`` with torch.nn.functional
    double: bool = False            # run gradgradcheck
    rtol: float = 1.3e-6
    atol: float = 1e-5
    why: str = ""                   # the reason for looser tolerances


ROWS = [
    # -- convolution ------------------------------------------------------------------------------------
    Row("conv1d", [G(2, 4, 7), G(6, 2, 3), G(6)], lambda F, x, w, b: F.conv1d(x, w, b, stride=2, padding=1, groups=2)),
    Row("conv2d", [G(2, 3, 5, 5), G(4, 3, 3, 3), G(4)], lambda F, x, w, b: F.conv2d(x, w, b, padding=1), double=True),
    Row("conv2d_stride_dilation_groups", [G(1, 4, 7, 7), G(4, 2, 3, 3)],
        lambda F, x, w: F.conv2d(x, w, stride=2, padding=2, dilation=2, groups=2), double=True),
    Row("conv2d_depthwise", [G(1, 3, 5, 5), G(3, 1, 3, 3), G(3)], lambda F, x, w, b: F.conv2d(x, w, b, groups=3)),
    Row("conv2d_same_even_kernel", [G(1, 2, 5, 6), G(3, 2, 2, 4)], lambda F, x, w: F.conv2d(x, w, padding="same")),
    Row("conv2d_same_dilated", [G(1, 2, 5, 5), G(2, 2, 3, 3)],
        lambda F, x, w: F.conv2d(x, w, padding="same", dilation=(2, 1))),
    Row("conv2d_valid_unbatched", [G(2, 5, 5), G(3, 2, 3, 2)], lambda F, x, w: F.conv2d(x, w, padding="valid")),
    Row("conv3d", [G(1, 2, 4, 4, 3), G(2, 2, 2, 2, 2), G(2)], lambda F, x, w, b: F.conv3d(x, w, b, padding=1)),
    Row("conv_transpose1d", [G(2, 4, 5), G(4, 3, 3), G(3)],
        lambda F, x, w, b: F.conv_transpose1d(x, w, b, stride=2, padding=1, output_padding=1)),
    Row("conv_transpose2d", [G(1, 4, 3, 3), G(4, 1, 3, 3), G(2)],
        lambda F, x, w, b: F.conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1, groups=2), double=True),
    Row("conv_transpose2d_dilated", [G(1, 2, 3, 4), G(2, 3, 2, 3)],
        lambda F, x, w: F.conv_transpose2d(x, w, stride=(1, 2), dilation=2, padding=1)),
    Row("conv_transpose3d", [G(1, 2, 2, 2, 2), G(2, 2, 2, 2, 2)], lambda F, x, w: F.conv_transpose3d(x, w, stride=2)),
    Row("linear", [G(3, 5), G(4, 5), G(4)], lambda F, x, w, b: F.linear(x, w, b), double=True),
    # -- pooling --------------------------------------------------------------------------------------
    Row("max_pool1d", [G(2, 3, 9)], lambda F, x: F.max_pool1d(x, 3, 2, 1)),
    Row("max_pool2d", [G(2, 3, 6, 6)], lambda F, x: F.max_pool2d(x, 2)),
    Row("max_pool2d_ceil_pad", [G(1, 2, 7, 7)], lambda F, x: F.max_pool2d(x, 3, 2, 1, ceil_mode=True)),
    Row("max_pool2d_unbatched_rect", [G(2, 5, 6)], lambda F, x: F.max_pool2d(x, (2, 3), (1, 2))),
    Row("max_pool3d", [G(1, 2, 4, 4, 4)], lambda F, x: F.max_pool3d(x, 2)),
    Row("avg_pool1d", [G(2, 3, 8)], lambda F, x: F.avg_pool1d(x, 3, 2, 1)),
    Row("avg_pool2d", [G(2, 3, 6, 6)], lambda F, x: F.avg_pool2d(x, 3, 2, 1), double=True),
    Row("avg_pool2d_exclude_pad_ceil", [G(1, 2, 7, 7)],
        lambda F, x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False)),
    Row("avg_pool3d", [G(1, 2, 4, 4, 4)], lambda F, x: F.avg_pool3d(x, 2, 1)),
    Row("adaptive_avg_pool1d", [G(1, 2, 7)], lambda F, x: F.adaptive_avg_pool1d(x, 3)),
    Row("adaptive_avg_pool2d", [G(1, 2, 6, 6)], lambda F, x: F.adaptive_avg_pool2d(x, 3)),
    Row("adaptive_avg_pool2d_uneven", [G(1, 2, 5, 7)], lambda F, x: F.adaptive_avg_pool2d(x, (2, 3))),
    Row("adaptive_max_pool2d", [G(1, 2, 6, 6)], lambda F, x: F.adaptive_max_pool2d(x, 2)),
    Row("adaptive_max_pool2d_uneven", [G(1, 2, 5, 7)], lambda F, x: F.adaptive_max_pool2d(x, (3, 2))),
    # -- normalisation -----------------------------------------------------------------------------------
    Row("batch_norm_train", [G(4, 3, 2, 2), G(3), G(3), C(3), C(3, kind="positive")],
        lambda F, x, w, b, rm, rv: F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.2)),
    Row("batch_norm_train_2d_no_affine", [G(5, 3)], lambda F, x: F.batch_norm(x, None, None, training=True)),
    Row("batch_norm_eval", [G(2, 3, 2, 2), G(3), G(3), C(3), C(3, kind="positive")],
        lambda F, x, w, b, rm, rv: F.batch_norm(x, rm, rv, w, b, training=False), double=True),
    Row("layer_norm", [G(2, 3, 4), G(3, 4), G(3, 4)], lambda F, x, w, b: F.layer_norm(x, (3, 4), w, b)),
    Row("layer_norm_no_affine", [G(3, 5)], lambda F, x: F.layer_norm(x, (5,), eps=1e-3)),
    Row("group_norm", [G(2, 4, 3, 2), G(4), G(4)], lambda F, x, w, b: F.group_norm(x, 2, w, b)),
    Row("local_response_norm", [G(2, 6, 2, 3)], lambda F, x: F.local_response_norm(x, 3, alpha=0.5, beta=0.75, k=1.5)),
    # -- activations ---------------------------------------------------------------------------------------
    Row("relu", [G(3, 4)], lambda F, x: F.relu(x), double=True),
    Row("relu6", [G(3, 4, scale=5)], lambda F, x: F.relu6(x), double=True),
    Row("leaky_relu", [G(3, 4)], lambda F, x: F.leaky_relu(x, 0.2), double=True),
    Row("elu", [G(3, 4)], lambda F, x: F.elu(x, 1.5)),
    Row("gelu", [G(3, 4)], lambda F, x: F.gelu(x)),
    Row("gelu_tanh", [G(3, 4)], lambda F, x: F.gelu(x, approximate="tanh")),
    Row("silu", [G(3, 4)], lambda F, x: F.silu(x)),
    Row("sigmoid", [G(3, 4)], lambda F, x: F.sigmoid(x)),
    Row("tanh", [G(3, 4)], lambda F, x: F.tanh(x)),
    Row("hardtanh", [G(3, 4, scale=2)], lambda F, x: F.hardtanh(x), double=True),
    Row("hardtanh_asymmetric", [G(3, 4, scale=3)], lambda F, x: F.hardtanh(x, -2.0, 3.0)),
    Row("hardtanh_clipped_relu", [G(3, 4, scale=2)], lambda F, x: F.hardtanh(x, 0.0, 2.0)),
    Row("softplus", [G(3, 4, scale=3)], lambda F, x: F.softplus(x, beta=2.0)),
    Row("softmax", [G(3, 4)], lambda F, x: F.softmax(x, dim=1)),
    Row("softmax_dim0_3d", [G(2, 3, 4)], lambda F, x: F.softmax(x, dim=0)),
    Row("log_softmax", [G(2, 3, 4)], lambda F, x: F.log_softmax(x, dim=-1)),
    # -- losses --------------------------------------------------------------------------------------------
    Row("cross_entropy", [G(4, 5), C(4, kind="int", high=5)], lambda F, x, t: F.cross_entropy(x, t)),
    Row("cross_entropy_weight_ignore_smoothing", [G(6, 4), C(6, kind="int", high=4, ignore=0.3), C(4, kind="positive")],
        lambda F, x, t, w: F.cross_entropy(x, t, weight=w, ignore_index=-100, label_smoothing=0.1)),
    Row("cross_entropy_spatial_none", [G(2, 3, 2, 2), C(2, 2, 2, kind="int", high=3)],
        lambda F, x, t: F.cross_entropy(x, t, reduction="none")),
    Row("cross_entropy_sum_ignore_1", [G(5, 3), C(5, kind="int", high=3)],
        lambda F, x, t: F.cross_entropy(x, t, ignore_index=1, reduction="sum")),
    Row("cross_entropy_probabilities", [G(3, 4), G(3, 4, kind="softmax"), C(4, kind="positive")],
        lambda F, x, p, w: F.cross_entropy(x, p, weight=w, label_smoothing=0.2)),
    Row("cross_entropy_unbatched", [G(5), C(kind="int", high=5)], lambda F, x, t: F.cross_entropy(x, t)),
    Row("nll_loss_weight_ignore", [G(6, 4), C(6, kind="int", high=4, ignore=0.3), C(4, kind="positive")],
        lambda F, x, t, w: F.nll_loss(x, t, weight=w), double=True),
    Row("nll_loss_spatial_none", [G(2, 3, 2), C(2, 2, kind="int", high=3)],
        lambda F, x, t: F.nll_loss(x, t, reduction="none")),
    Row("mse_loss", [G(3, 4), G(3, 4)], lambda F, x, y: F.mse_loss(x, y), double=True),
    Row("mse_loss_weight", [G(3, 4), G(3, 4), C(3, 4, kind="positive")], lambda F, x, y, w: F.mse_loss(x, y, weight=w)),
    Row("l1_loss_sum", [G(3, 4), G(3, 4)], lambda F, x, y: F.l1_loss(x, y, reduction="sum")),
    Row("smooth_l1_loss", [G(3, 4), G(3, 4)], lambda F, x, y: F.smooth_l1_loss(x, y, beta=0.5)),
    Row("smooth_l1_loss_none", [G(3, 4, scale=2), G(3, 4)], lambda F, x, y: F.smooth_l1_loss(x, y, reduction="none")),
    Row("binary_cross_entropy", [G(3, 4, kind="uniform"), G(3, 4, kind="uniform"), C(3, 4, kind="positive")],
        lambda F, x, y, w: F.binary_cross_entropy(x, y, weight=w), double=True),
    Row("binary_cross_entropy_with_logits", [G(3, 4, scale=3), G(3, 4, kind="uniform"), C(4, kind="positive")],
        lambda F, x, y, pw: F.binary_cross_entropy_with_logits(x, y, pos_weight=pw), double=True),
    Row("binary_cross_entropy_with_logits_weight_none", [G(3, 4), G(3, 4, kind="uniform"), C(3, 4, kind="positive")],
        lambda F, x, y, w: F.binary_cross_entropy_with_logits(x, y, weight=w, reduction="none")),
    Row("pad", [G(2, 3, 2)], lambda F, x: F.pad(x, (1, 2, 0, 1), value=0.5), double=True),
]


def _ids(rows):
    return [r.id for r in rows]


def _inputs(row, device, dtype, seed=0):
    rng = np.random.default_rng(seed)
    arrays = [a.make(rng, dtype) for a in row.args]
    tensors = [mdn.tensor(arr, device=device, requires_grad=a.grad and arr.dtype.kind == "f")
               for a, arr in zip(row.args, arrays)]
    return arrays, tensors


def _call(row):
    return lambda *ts: row.call(F, *ts)


@pytest.mark.parametrize("row", ROWS, ids=_ids(ROWS))
def test_gradcheck(row, device):
    _, tensors = _inputs(row, device, np.float64)
    assert gradcheck(_call(row), tensors)


@pytest.mark.parametrize("row", [r for r in ROWS if r.double], ids=_ids([r for r in ROWS if r.double]))
def test_gradgradcheck(row, device):
    _, tensors = _inputs(row, device, np.float64)
    assert gradgradcheck(_call(row), tensors)


@pytest.mark.parametrize("row", ROWS, ids=_ids(ROWS))
def test_matches_torch(row, device):
    torch = pytest.importorskip("torch")
    tF = torch.nn.functional
    arrays, tensors = _inputs(row, device, np.float32, seed=1)
    theirs = [torch.tensor(a, requires_grad=bool(t.requires_grad)) for a, t in zip(arrays, tensors)]
    y = row.call(F, *tensors)
    yt = (row.torch_call or row.call)(tF, *theirs)
    tol = dict(rtol=row.rtol, atol=row.atol)
    torch.testing.assert_close(torch.from_numpy(np.asarray(y.cpu().numpy())), yt.detach(), **tol)

    gy = np.random.default_rng(2).standard_normal(y.shape).astype(np.float32)
    ours_diff = [t for t in tensors if t.requires_grad]
    theirs_diff = [t for t in theirs if t.requires_grad]
    grads = mdn.autograd.grad(y, ours_diff, mdn.tensor(gy, device=device))
    tgrads = torch.autograd.grad(yt, theirs_diff, torch.from_numpy(gy))
    for i, (g, tg) in enumerate(zip(grads, tgrads)):
        torch.testing.assert_close(torch.from_numpy(np.asarray(g.cpu().numpy())), tg, **tol,
                                   msg=lambda m, i=i: f"gradient of input {i}: {m}")


# ---- double backward: every op chains (tests/nn/test_double_backward.py has the table) ----------------------

def test_conv_double_backward_matches_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((2, 3, 5, 5)), rng.standard_normal((4, 3, 3, 3))
    ours = [mdn.tensor(a, requires_grad=True) for a in (x, w)]
    theirs = [torch.tensor(a, requires_grad=True) for a in (x, w)]

    def penalty(Fm, grad, xx, ww):
        y = Fm.conv2d(xx, ww, stride=2, padding=1)
        gx, gw = grad((y * y).sum(), [xx, ww], create_graph=True)
        return (gx * gx).sum() + (gw ** 3).sum()

    p = penalty(F, mdn.autograd.grad, *ours)
    pt = penalty(torch.nn.functional, torch.autograd.grad, *theirs)
    p.backward()
    pt.backward()
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-10, atol=1e-10)


# ---- dropout (random: checked by structure and seeding, not against PyTorch's stream) ---------------------

def test_dropout_masks_scale_and_seed(device):
    x = mdn.ones(200, 50, device=device, requires_grad=True)
    mdn.manual_seed(7)
    y = F.dropout(x, p=0.3)
    kept = y.numpy() != 0
    assert np.allclose(y.numpy()[kept], 1 / 0.7)
    assert abs(kept.mean() - 0.7) < 0.02
    y.backward(mdn.ones(200, 50, device=device))
    np.testing.assert_array_equal(x.grad.numpy(), y.numpy())       # same mask, same scale
    mdn.manual_seed(7)
    np.testing.assert_array_equal(F.dropout(x, p=0.3).numpy(), y.numpy())
    assert F.dropout(x, p=0.3, training=False) is x
    assert (F.dropout(x, p=1.0).numpy() == 0).all()


def test_dropout_gradcheck_and_double_backward(device):
    x = mdn.randn(3, 4, dtype=mdn.float64, device=device, requires_grad=True)

    def fn(x):
        mdn.manual_seed(0)          # the same mask at every gradcheck evaluation
        return F.dropout(x, 0.4) * x
    assert gradcheck(fn, [x])
    assert gradgradcheck(fn, [x])


def test_dropout2d_zeroes_whole_channels(device):
    mdn.manual_seed(1)
    y = F.dropout2d(mdn.ones(8, 16, 3, 3, device=device), p=0.5).numpy()
    per_channel = y.reshape(8, 16, 9)
    assert ((per_channel == 0).all(-1) | (per_channel == 2).all(-1)).all()
    assert 0 < (per_channel == 0).all(-1).mean() < 1


def test_backend_flags_reach_the_default_handle():
    from minidnn.backend import MathType, get_default_handle
    from minidnn.backends import cudnn
    handle = get_default_handle("cpu")
    saved = (cudnn.benchmark, cudnn.allow_tf32, handle.benchmark, handle.math_type)
    try:
        cudnn.benchmark, cudnn.allow_tf32 = True, True
        F.conv2d(mdn.randn(1, 1, 3, 3), mdn.randn(1, 1, 2, 2))
        assert handle.benchmark and handle.math_type is MathType.TENSOR_OP
        cudnn.benchmark, cudnn.allow_tf32 = None, None       # unset: the handle keeps what it has
        handle.benchmark = False
        F.conv2d(mdn.randn(1, 1, 3, 3), mdn.randn(1, 1, 2, 2))
        assert not handle.benchmark
    finally:
        cudnn.benchmark, cudnn.allow_tf32, handle.benchmark, handle.math_type = saved


# ---- one_hot ------------------------------------------------------------------------------------------

def test_one_hot(device):
    t = mdn.tensor([[0, 2], [1, 3]], device=device)
    out = F.one_hot(t)
    assert out.dtype == np.int64 and tuple(out.shape) == (2, 2, 4)
    np.testing.assert_array_equal(out.numpy()[1, 1], [0, 0, 0, 1])
    assert tuple(F.one_hot(t, num_classes=6).shape) == (2, 2, 6)
    with pytest.raises(RuntimeError, match="class values must be in"):
        F.one_hot(t, num_classes=3)


# ---- errors name the offending values ---------------------------------------------------------------------

def _t(*shape, dtype=np.float32):
    return mdn.tensor(np.zeros(shape, dtype=dtype))


@pytest.mark.parametrize("call, error, match", [
    (lambda: F.conv2d(_t(1, 8, 5, 5), _t(64, 4, 5, 5)), ValueError,
     r"conv2d: input has 8 channels but weight \(64, 4, 5, 5\) with groups=1 expects 4"),
    (lambda: F.conv2d(_t(1, 4, 5, 5), _t(6, 2, 3, 3), groups=2, bias=_t(5)), ValueError,
     r"conv2d: bias has shape \(5,\) but the output has 6 channels"),
    (lambda: F.conv2d(_t(1, 4, 2, 2), _t(6, 4, 3, 3)), ValueError, r"kernel \(3, 3\) is larger than the padded input"),
    (lambda: F.conv2d(_t(1, 4, 5, 5), _t(6, 4, 3, 3), stride=2, padding="same"), ValueError,
     r"padding='same' is not supported for strided"),
    (lambda: F.conv2d(_t(4, 5, 5, 5, 5), _t(6, 4, 3, 3)), ValueError, r"conv2d: expected a 3-D \(unbatched\) or 4-D"),
    (lambda: F.conv2d(_t(1, 4, 5, 5), _t(6, 4, 3, 3, dtype=np.float64)), TypeError,
     r"input has dtype float32 but weight has dtype float64"),
    (lambda: F.conv_transpose2d(_t(1, 4, 5, 5), _t(3, 2, 3, 3)), ValueError,
     r"conv_transpose2d: input has 4 channels but weight \(3, 2, 3, 3\) expects 3"),
    (lambda: F.conv_transpose2d(_t(1, 4, 5, 5), _t(4, 2, 3, 3), stride=2, output_padding=2), ValueError,
     r"output_padding=\(2, 2\) must be smaller than stride=\(2, 2\)"),
    (lambda: F.max_pool2d(_t(1, 1, 4, 4), 2, dilation=0), ValueError, r"dilation \(0, 0\) must be positive"),
    (lambda: F.max_pool2d(_t(1, 1, 3, 3), 2, dilation=3), ValueError, r"Output size is too small"),
    (lambda: F.max_pool2d(_t(1, 1, 4, 4), 2, return_indices=True), NotImplementedError, r"return_indices"),
    (lambda: F.max_pool2d(_t(1, 1, 4, 4), 2, padding=2), ValueError, r"at most half of the kernel size"),
    (lambda: F.batch_norm(_t(2, 3, 4), _t(4), _t(4)), ValueError,
     r"batch_norm: running_mean has shape \(4,\) but input \(2, 3, 4\) has 3 channels"),
    (lambda: F.batch_norm(_t(1, 3), None, None, training=True), ValueError, r"more than 1 value per channel"),
    (lambda: F.layer_norm(_t(2, 3, 4), (3,)), ValueError, r"normalized_shape=\(3,\) must be the trailing dims"),
    (lambda: F.group_norm(_t(2, 6, 4), 4), ValueError, r"num_groups=4 must be a positive divisor of the 6 channels"),
    (lambda: F.cross_entropy(_t(4, 5), mdn.tensor([0, 1, 5, 2])), IndexError,
     r"Target 5 is out of bounds for 5 classes"),
    (lambda: F.cross_entropy(_t(4, 5), mdn.tensor([0, 1, 2])), ValueError, r"expects a target of shape \(4,\)"),
    (lambda: F.cross_entropy(_t(4, 5), _t(4, 4)), ValueError, r"class-probability target has shape \(4, 4\)"),
    (lambda: F.cross_entropy(_t(4, 5), mdn.tensor([0, 1, 2, 3]), weight=_t(3)), ValueError,
     r"weight has shape \(3,\) but the input has 5 classes"),
    (lambda: F.cross_entropy(_t(4, 5), mdn.tensor([0, 1, 2, 3]), reduction="avg"), ValueError,
     r"reduction='avg' is not a valid value"),
    (lambda: F.binary_cross_entropy(_t(3) + 2, _t(3)), ValueError, r"between 0 and 1"),
    (lambda: F.binary_cross_entropy_with_logits(_t(3), _t(4)), ValueError, r"target size \(4,\) is different"),
    (lambda: F.dropout(_t(3), p=1.5), ValueError, r"between 0 and 1, but got 1.5"),
    (lambda: F.linear(_t(2, 3), _t(4, 5)), ValueError, r"linear: input \(2, 3\) has 3 features but weight \(4, 5\)"),
    (lambda: F.gelu(_t(3), approximate="fast"), ValueError, r"approximate='fast'"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_errors_name_values(call, error, match):
    with pytest.raises(error, match=match):
        call()


@pytest.mark.parametrize("kw", [dict(kernel_size=3, dilation=2), dict(kernel_size=(2, 3), dilation=(2, 1), stride=2,
                                                                       padding=1, ceil_mode=True),
                                dict(kernel_size=2, ceil_mode=True)])
def test_max_pool_dilation_and_ceil_against_pytorch(kw, device):
    torch = pytest.importorskip("torch")
    a = np.random.default_rng(0).random((2, 2, 7, 6)).astype(np.float32) if "dilation" in kw else \
        np.zeros((1, 1, 1, 1), np.float32)
    ta = torch.tensor(a, requires_grad=True)
    t = torch.nn.functional.max_pool2d(ta, **kw)
    t.sum().backward()
    ma = mdn.tensor(a, device=device, requires_grad=True)
    y = F.max_pool2d(ma, **kw)
    y.sum().backward()
    np.testing.assert_array_equal(y.cpu().numpy(), t.detach().numpy())
    np.testing.assert_array_equal(ma.grad.cpu().numpy(), ta.grad.numpy())

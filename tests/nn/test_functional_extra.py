"""minidnn/nn/_functions/extra.py against PyTorch: forward and gradient of every row in float64 and float32, on every
device; then the edge cases (kinks, size-0 / size-1 dims, non-contiguous inputs), the modules, and bad inputs.

A row's ``call`` takes the functional module first, so one lambda serves minidnn and PyTorch:
``lambda F, x: F.mish(x)``.  Inputs are made by numpy (``Arg``); the gradient is compared for every input whose
Arg has ``grad=True``, under a random upstream gradient.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import minidnn as mdn
import minidnn.nn as mnn
import minidnn.nn.functional as F
from minidnn.backend.errors import ArgumentError, DimensionError, DTypeError


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch", reason="PyTorch is the test oracle for the functional ops")


@dataclasses.dataclass
class Arg:
    shape: tuple
    kind: str = "randn"         # randn / positive / prob / sign (+-1) / int (in [0, high)) / values
    grad: bool = True
    high: int = 0
    values: tuple = ()

    def make(self, rng, dtype):
        if self.kind == "int":
            return rng.integers(0, self.high, self.shape).astype(np.int64)
        if self.kind == "values":
            ints = all(isinstance(v, int) for v in self.values)
            return np.asarray(self.values, dtype=np.int64 if ints else dtype).reshape(self.shape)
        if self.kind == "positive":
            a = rng.uniform(0.5, 2.0, self.shape)
        elif self.kind == "prob":
            a = rng.uniform(0.05, 0.95, self.shape)
        elif self.kind == "sign":
            a = np.where(rng.random(self.shape) < 0.5, -1.0, 1.0)
        else:
            a = rng.standard_normal(self.shape) * 2
        return a.astype(dtype)


def G(*shape, **kw):
    return Arg(shape, **kw)


def C(*shape, **kw):
    return Arg(shape, grad=False, **kw)


def V(*values, grad=True):
    """Fixed values (kinks and boundaries), shape (len,)."""
    return Arg((len(values),), kind="values", values=values, grad=grad)


TOL = {np.float64: dict(rtol=1e-7, atol=1e-9), np.float32: dict(rtol=1.3e-6, atol=1e-5)}
REDUCTIONS = ("none", "mean", "sum")


def _compare(torch, device, call, args, dtype, seed=0):
    rng = np.random.default_rng(seed)
    arrays = [a.make(rng, dtype) for a in args]
    ours = [mdn.tensor(a, device=device, requires_grad=arg.grad) for a, arg in zip(arrays, args)]
    theirs = [torch.tensor(a, requires_grad=arg.grad) for a, arg in zip(arrays, args)]
    y = call(F, *ours)
    ty = call(torch.nn.functional, *theirs)
    tol = TOL[dtype]
    assert tuple(y.shape) == tuple(ty.shape)
    assert y.dtype == np.dtype(str(ty.dtype).replace("torch.", ""))
    np.testing.assert_allclose(y.cpu().numpy(), ty.detach().numpy(), **tol, equal_nan=True)
    if not any(arg.grad for arg in args) or not ty.requires_grad:
        return
    g = rng.standard_normal(tuple(ty.shape)).astype(dtype)
    y.backward(mdn.tensor(g, device=device))
    ty.backward(torch.tensor(g))
    for i, (o, t, arg) in enumerate(zip(ours, theirs, args)):
        if not arg.grad:
            continue
        want = np.zeros(arrays[i].shape) if t.grad is None else t.grad.numpy()
        got = np.zeros(arrays[i].shape) if o.grad is None else o.grad.cpu().numpy()
        np.testing.assert_allclose(got, want, **tol, equal_nan=True, err_msg=f"gradient of input {i}")


def _row(name, call, *args):
    return pytest.param(call, args, id=name)


X = G(3, 5)
KINKS = V(-4.0, -3.0, -2.0, -0.5, 0.0, 0.5, 1.0, 3.0, 4.0)
ROWS = [
    # activations
    _row("prelu_channels", lambda F, x, w: F.prelu(x, w), G(2, 3, 4), G(3)),
    _row("prelu_single", lambda F, x, w: F.prelu(x, w), G(2, 3), G(1)),
    _row("prelu_kinks", lambda F, x, w: F.prelu(x, w), KINKS, G(1)),
    _row("mish", lambda F, x: F.mish(x), X),
    _row("mish_large", lambda F, x: F.mish(x), V(-40.0, -20.0, 0.0, 20.0, 40.0)),
    _row("hardswish", lambda F, x: F.hardswish(x), X),
    _row("hardswish_kinks", lambda F, x: F.hardswish(x), KINKS),
    _row("hardswish_infinities", lambda F, x: F.hardswish(x), V(-np.inf, -3.0, 3.0, np.inf)),
    _row("hardsigmoid", lambda F, x: F.hardsigmoid(x), X),
    _row("hardsigmoid_kinks", lambda F, x: F.hardsigmoid(x), KINKS),
    _row("nan_passes_through", lambda F, x: F.hardsigmoid(x) + F.hardswish(x) + F.hardshrink(x) + F.softshrink(x)
         + F.threshold(x, 0.1, 2.0) + F.mish(x) + F.prelu(x, x[:1] * 0 + 0.2),
         V(float("nan"), 1.0, grad=False)),
    _row("selu", lambda F, x: F.selu(x), X),
    _row("selu_kinks", lambda F, x: F.selu(x), KINKS),
    _row("celu", lambda F, x: F.celu(x, alpha=0.7), X),
    _row("celu_kinks", lambda F, x: F.celu(x, 2.0), KINKS),
    _row("glu", lambda F, x: F.glu(x), G(3, 4)),
    _row("glu_dim0", lambda F, x: F.glu(x, 0), G(4, 3)),
    _row("softsign", lambda F, x: F.softsign(x), KINKS),
    _row("logsigmoid", lambda F, x: F.logsigmoid(x), V(-50.0, -3.0, 0.0, 2.0, 50.0)),
    _row("softmin", lambda F, x: F.softmin(x, dim=1), X),
    _row("softmin_dim0", lambda F, x: F.softmin(x, 0), X),
    _row("tanhshrink", lambda F, x: F.tanhshrink(x), X),
    _row("softshrink", lambda F, x: F.softshrink(x), KINKS),
    _row("softshrink_lambd", lambda F, x: F.softshrink(x, 1.0), KINKS),
    _row("hardshrink", lambda F, x: F.hardshrink(x), KINKS),
    _row("hardshrink_lambd", lambda F, x: F.hardshrink(x, 3.0), KINKS),
    _row("threshold", lambda F, x: F.threshold(x, 0.5, -2.0), KINKS),
    _row("rrelu_eval", lambda F, x: F.rrelu(x), KINKS),
    _row("rrelu_eval_bounds", lambda F, x: F.rrelu(x, 0.2, 0.4, training=False), X),
    # distances
    _row("cosine_similarity", lambda F, a, b: F.cosine_similarity(a, b), G(4, 5), G(4, 5)),
    _row("cosine_similarity_bcast", lambda F, a, b: F.cosine_similarity(a, b, dim=-1), G(3, 1, 5), G(4, 5)),
    _row("cosine_similarity_zero", lambda F, a, b: F.cosine_similarity(a, b, dim=0),
         V(0.0, 0.0, 0.0), V(1.0, 2.0, 3.0)),
    _row("cosine_similarity_tiny", lambda F, a, b: F.cosine_similarity(a, b, dim=0, eps=1e-2),
         V(1e-3, 0.0, -2e-3), V(1.0, 2.0, 3.0)),
    _row("pairwise_distance", lambda F, a, b: F.pairwise_distance(a, b), G(4, 5), G(4, 5)),
    _row("pairwise_distance_p1_keep", lambda F, a, b: F.pairwise_distance(a, b, p=1, keepdim=True),
         G(4, 5), G(4, 5)),
    _row("pairwise_distance_p3", lambda F, a, b: F.pairwise_distance(a, b, p=3.0, eps=0.0), G(4, 5), G(1, 5)),
    _row("pairwise_distance_inf", lambda F, a, b: F.pairwise_distance(a, b, p=float("inf")), G(4, 5), G(4, 5)),
    _row("pairwise_distance_1d", lambda F, a, b: F.pairwise_distance(a, b), G(5), G(5)),
    _row("pdist", lambda F, x: F.pdist(x), G(5, 3)),
    _row("pdist_p1", lambda F, x: F.pdist(x, p=1), G(4, 3)),
    _row("pdist_inf", lambda F, x: F.pdist(x, p=float("inf")), G(4, 3)),
    _row("pdist_one_row", lambda F, x: F.pdist(x), G(1, 3)),
    # misc
    _row("pixel_shuffle", lambda F, x: F.pixel_shuffle(x, 2), G(2, 8, 3, 2)),
    _row("pixel_shuffle_nobatch", lambda F, x: F.pixel_shuffle(x, 3), G(9, 2, 2)),
    _row("pixel_unshuffle", lambda F, x: F.pixel_unshuffle(x, 2), G(2, 2, 4, 6)),
    _row("channel_shuffle", lambda F, x: F.channel_shuffle(x, 3), G(2, 6, 2, 2)),
    _row("instance_norm", lambda F, x: F.instance_norm(x), G(2, 3, 5)),
    _row("instance_norm_affine", lambda F, x, w, b: F.instance_norm(x, weight=w, bias=b, eps=1e-3),
         G(2, 3, 4, 3), G(3), G(3)),
    _row("unfold", lambda F, x: F.unfold(x, 2), G(2, 3, 4, 5)),
    _row("unfold_args", lambda F, x: F.unfold(x, (2, 3), dilation=(2, 1), padding=1, stride=(1, 2)), G(1, 2, 5, 6)),
    _row("unfold_nobatch", lambda F, x: F.unfold(x, 3, padding=1), G(2, 3, 3)),
    _row("fold", lambda F, x: F.fold(x, (4, 5), 2), G(2, 12, 12)),
    _row("fold_args", lambda F, x: F.fold(x, (5, 6), (2, 3), dilation=(2, 1), padding=1, stride=(1, 2)),
         G(1, 12, 15)),
    _row("fold_nobatch", lambda F, x: F.fold(x, 3, 3, padding=1), G(18, 9)),
    _row("bilinear", lambda F, a, b, w, bias: F.bilinear(a, b, w, bias), G(4, 3), G(4, 2), G(5, 3, 2), G(5)),
    _row("bilinear_nobias_3d", lambda F, a, b, w: F.bilinear(a, b, w), G(2, 4, 3), G(2, 4, 2), G(5, 3, 2)),
    _row("affine_grid", lambda F, t: F.affine_grid(t, (2, 3, 4, 5), align_corners=False), G(2, 2, 3)),
    _row("affine_grid_size1", lambda F, t: F.affine_grid(t, [1, 1, 1, 3], align_corners=False), G(1, 2, 3)),
    _row("grid_sample", lambda F, x, g: F.grid_sample(x, g, align_corners=False), G(2, 3, 4, 5), G(2, 3, 2, 2)),
    _row("grid_sample_aligned", lambda F, x, g: F.grid_sample(x, g, align_corners=True), G(1, 2, 3, 4),
         G(1, 5, 3, 2)),
    _row("grid_sample_affine", lambda F, x, t: F.grid_sample(x, F.affine_grid(t, (2, 1, 3, 3), False), "bilinear",
                                                              "zeros", False), G(2, 1, 4, 4), G(2, 2, 3)),
    _row("embedding_weight", lambda F, i, w: F.embedding(i, w), C(2, 5, kind="int", high=6), G(6, 3)),
    _row("embedding_padding", lambda F, i, w: F.embedding(i, w, padding_idx=2), C(3, 6, kind="int", high=4),
         G(4, 3)),
    _row("embedding_freq", lambda F, i, w: F.embedding(i, w, scale_grad_by_freq=True),
         C(4, 6, kind="int", high=4), G(4, 3)),
    _row("embedding_freq_pad", lambda F, i, w: F.embedding(i, w, padding_idx=-1, scale_grad_by_freq=True),
         C(10, kind="int", high=4), G(4, 3)),
]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("call,args", ROWS)
def test_against_torch(torch, device, call, args, dtype):
    _compare(torch, device, call, args, dtype)


LOSS_ROWS = [
    _row("kl_div", lambda F, x, t, r: F.kl_div(x, t, reduction=r), G(3, 4), G(3, 4, kind="prob")),
    # PyTorch's gradient wrt a zero target is NaN (d/dt t log t = -inf there); minidnn's is xlogy's 0: not compared
    _row("kl_div_zero_target", lambda F, x, t, r: F.kl_div(x, t, reduction=r),
         G(5), V(0.0, 0.2, 0.0, 0.5, 0.3, grad=False)),
    _row("kl_div_log_target", lambda F, x, t, r: F.kl_div(x, t, reduction=r, log_target=True), G(3, 4), G(3, 4)),
    _row("huber", lambda F, x, t, r: F.huber_loss(x, t, reduction=r), G(3, 4), G(3, 4)),
    _row("huber_delta", lambda F, x, t, r: F.huber_loss(x, t, reduction=r, delta=0.5), G(3, 4), C(3, 4)),
    _row("huber_kinks", lambda F, x, t, r: F.huber_loss(x, t, r, 1.0),
         V(-2.0, -1.0, 0.0, 1.0, 2.0), V(0.0, 0.0, 0.0, 0.0, 0.5)),
    _row("huber_weight", lambda F, x, t, w, r: F.huber_loss(x, t, reduction=r, weight=w),
         G(3, 4), G(3, 4), G(3, 4, kind="positive")),
    _row("margin_ranking", lambda F, a, b, y, r: F.margin_ranking_loss(a, b, y, margin=0.3, reduction=r),
         G(6), G(6), C(6, kind="sign")),
    _row("margin_ranking_tie", lambda F, a, b, y, r: F.margin_ranking_loss(a, b, y, reduction=r),
         V(1.0, 2.0), V(1.0, 0.0), V(1.0, -1.0, grad=False)),
    _row("hinge_embedding", lambda F, x, y, r: F.hinge_embedding_loss(x, y, margin=0.5, reduction=r),
         G(3, 4), C(3, 4, kind="sign")),
    _row("soft_margin", lambda F, x, y, r: F.soft_margin_loss(x, y, reduction=r), G(3, 4), C(3, 4, kind="sign")),
    _row("cosine_embedding", lambda F, a, b, y, r: F.cosine_embedding_loss(a, b, y, margin=0.1, reduction=r),
         G(5, 4), G(5, 4), C(5, kind="sign")),
    _row("cosine_embedding_1d", lambda F, a, b, y, r: F.cosine_embedding_loss(a, b, y, reduction=r),
         G(4), G(4), Arg((), kind="sign", grad=False)),
    _row("triplet", lambda F, a, p, n, r: F.triplet_margin_loss(a, p, n, reduction=r), G(4, 5), G(4, 5), G(4, 5)),
    _row("triplet_swap_p1", lambda F, a, p, n, r: F.triplet_margin_loss(a, p, n, margin=2.0, p=1, swap=True,
                                                                      reduction=r), G(4, 5), G(4, 5), G(4, 5)),
    _row("poisson_nll", lambda F, x, t, r: F.poisson_nll_loss(x, t, reduction=r), G(3, 4), G(3, 4, kind="positive")),
    _row("poisson_nll_prob_full", lambda F, x, t, r: F.poisson_nll_loss(x, t, log_input=False, full=True,
                                                                       reduction=r),
         G(3, 4, kind="positive"), C(3, 4, kind="positive")),
    _row("gaussian_nll", lambda F, x, t, v, r: F.gaussian_nll_loss(x, t, v, reduction=r),
         G(3, 4), G(3, 4), G(3, 4, kind="positive")),
    _row("gaussian_nll_homo_full", lambda F, x, t, v, r: F.gaussian_nll_loss(x, t, v, full=True, reduction=r),
         G(3, 4), C(3, 4), G(3, kind="positive")),
    _row("gaussian_nll_var_size1_dim", lambda F, x, t, v, r: F.gaussian_nll_loss(x, t, v, reduction=r),
         G(3, 4), C(3, 4), G(3, 1, kind="positive")),
    _row("gaussian_nll_clamped", lambda F, x, t, v, r: F.gaussian_nll_loss(x, t, v, eps=0.1, reduction=r),
         G(3), C(3), V(0.0, 0.05, 1.0)),
    _row("gaussian_nll_float_var", lambda F, x, t, r: F.gaussian_nll_loss(x, t, 0.5, reduction=r), G(3, 2), C(3, 2)),
    _row("multi_margin", lambda F, x, y, r: F.multi_margin_loss(x, y, reduction=r), G(4, 5), C(4, kind="int", high=5)),
    _row("multi_margin_p2_weight", lambda F, x, y, w, r: F.multi_margin_loss(x, y, p=2, margin=0.5, weight=w,
                                                                            reduction=r),
         G(4, 5), C(4, kind="int", high=5), C(5, kind="positive")),     # PyTorch: weight is not differentiable
    _row("multilabel_soft_margin", lambda F, x, y, r: F.multilabel_soft_margin_loss(x, y, reduction=r),
         G(3, 4), C(3, 4, kind="prob")),
    _row("multilabel_margin", lambda F, x, y, r: F.multilabel_margin_loss(x, y, reduction=r), G(3, 4),
         Arg((3, 4), kind="values", grad=False, values=(3, 0, -1, 1, 1, 2, 1, -1, -1, 0, 0, 0))),
    _row("multilabel_margin_1d", lambda F, x, y, r: F.multilabel_margin_loss(x, y, reduction=r), G(4),
         Arg((4,), kind="values", grad=False, values=(2, 1, -1, 0))),
    _row("multilabel_soft_margin_weight", lambda F, x, y, w, r: F.multilabel_soft_margin_loss(x, y, w, reduction=r),
         G(3, 4), C(3, 4, kind="prob"), G(4, kind="positive")),
]


@pytest.mark.filterwarnings("ignore:reduction. 'mean' divides")
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("call,args", LOSS_ROWS)
def test_losses_against_torch(torch, device, call, args, dtype, reduction):
    _compare(torch, device, lambda F, *ts: call(F, *ts, reduction), args, dtype)


def test_kl_div_batchmean_and_legacy_flags(torch, device):
    _compare(torch, device, lambda F, x, t: F.kl_div(x, t, reduction="batchmean"), (G(3, 4), G(3, 4, kind="prob")),
             np.float64)
    with pytest.warns(UserWarning, match="size_average and reduce"):
        _compare(torch, device, lambda F, x, t: F.kl_div(x, t, size_average=False), (G(3, 4), G(3, 4, kind="prob")),
                 np.float64)
    with pytest.warns(UserWarning, match="batchmean"):
        F.kl_div(mdn.zeros(2, 3), mdn.zeros(2, 3))
    with pytest.warns(UserWarning, match="size_average and reduce"):
        _compare(torch, device, lambda F, a, b, y: F.margin_ranking_loss(a, b, y, reduce=False),
                 (G(4), G(4), C(4, kind="sign")), np.float64)


SIZE_ZERO = [
    _row("mish", lambda F, x: F.mish(x), G(0, 3)),
    _row("hardswish", lambda F, x: F.hardswish(x), G(2, 0)),
    _row("prelu", lambda F, x, w: F.prelu(x, w), G(0, 3), G(3)),
    _row("glu", lambda F, x: F.glu(x), G(0, 4)),
    _row("softmin", lambda F, x: F.softmin(x, 1), G(0, 4)),
    _row("cosine_similarity", lambda F, a, b: F.cosine_similarity(a, b), G(0, 4), G(0, 4)),
    _row("pairwise_distance", lambda F, a, b: F.pairwise_distance(a, b), G(0, 4), G(0, 4)),
    _row("pdist_one_row", lambda F, x: F.pdist(x), G(1, 3)),     # (0, 3) segfaults PyTorch 2.13's pdist backward
    _row("pixel_shuffle", lambda F, x: F.pixel_shuffle(x, 2), C(2, 4, 0, 2)),     # PyTorch's size-0 backward fails
    _row("huber_sum", lambda F, x, t: F.huber_loss(x, t, reduction="sum"), G(0, 3), G(0, 3)),
    _row("huber_mean_nan", lambda F, x, t: F.huber_loss(x, t), G(0, 3), G(0, 3)),
    _row("kl_div_sum", lambda F, x, t: F.kl_div(x, t, reduction="sum"), G(0, 3), G(0, 3, kind="prob")),
    _row("unfold_size1", lambda F, x: F.unfold(x, 1), G(1, 1, 1, 1)),
    _row("pixel_unshuffle_size1", lambda F, x: F.pixel_unshuffle(x, 1), G(1, 1, 1, 1)),
    _row("cosine_similarity_size1", lambda F, a, b: F.cosine_similarity(a, b), G(3, 1), G(3, 1)),
]


@pytest.mark.parametrize("call,args", SIZE_ZERO)
def test_size_zero_and_one_dims(torch, device, call, args):
    _compare(torch, device, call, args, np.float64)


NONCONTIGUOUS = [
    _row("mish", lambda F, x: F.mish(x.transpose(0, 1))),
    _row("hardswish", lambda F, x: F.hardswish(x.transpose(0, 1))),
    _row("glu", lambda F, x: F.glu(x.transpose(0, 1), 0)),
    _row("cosine_similarity", lambda F, x: F.cosine_similarity(x.transpose(0, 1), x.transpose(0, 1)[[1, 0, 3, 2]])),
    _row("pixel_shuffle", lambda F, x: F.pixel_shuffle(x.transpose(0, 1).reshape(1, 4, 3, 2)[:, :, :, :1], 2)),
    _row("unfold", lambda F, x: F.unfold(x.transpose(0, 1).reshape(1, 1, 4, 6)[:, :, :, ::2], 2)),
    _row("instance_norm", lambda F, x: F.instance_norm(x.transpose(0, 1).reshape(2, 3, 4)[:, :, 1:])),
    _row("huber", lambda F, x: F.huber_loss(x.transpose(0, 1), x.transpose(0, 1) * 0.5)),
    _row("kl_div", lambda F, x: F.kl_div(x.transpose(0, 1), x.transpose(0, 1).exp(), reduction="batchmean")),
]


@pytest.mark.parametrize("call", [r.values[0] for r in NONCONTIGUOUS], ids=[r.id for r in NONCONTIGUOUS])
def test_noncontiguous_inputs(torch, device, call):
    _compare(torch, device, call, (G(6, 4),), np.float64)


# ---- what the table cannot see ---------------------------------------------------------------------------------

DOUBLE_BACKWARD = [
    _row("mish", lambda F, x: F.mish(x)),
    _row("selu", lambda F, x: F.selu(x)),
    _row("hardswish", lambda F, x: F.hardswish(x)),
    _row("logsigmoid", lambda F, x: F.logsigmoid(x)),
    _row("glu", lambda F, x: F.glu(x, 1)),
    _row("softmin", lambda F, x: F.softmin(x, 1)),
    _row("prelu", lambda F, x: F.prelu(x, x[0] * 0.5)),
    _row("cosine_similarity", lambda F, x: F.cosine_similarity(x, x.flip(0), dim=1)),
    _row("pairwise_distance", lambda F, x: F.pairwise_distance(x, x.flip(1), p=3.0)),
    # (pdist: PyTorch has no second derivative of _pdist_backward to compare with)
    _row("huber", lambda F, x: F.huber_loss(x, x * 0.3 + 0.1, delta=0.5)),
    _row("kl_div", lambda F, x: F.kl_div(x, x.flip(0).softmax(1), reduction="batchmean")),
    _row("gaussian_nll", lambda F, x: F.gaussian_nll_loss(x, x.flip(0), x * x + 0.5)),
    _row("triplet", lambda F, x: F.triplet_margin_loss(x, x.flip(0), x.flip(1) * 0.5, swap=True)),
    _row("instance_norm", lambda F, x: F.instance_norm(x.reshape(1, 3, 4))),
    _row("unfold_fold", lambda F, x: F.fold(F.unfold(x.reshape(1, 1, 3, 4) * x.reshape(1, 1, 3, 4), 2), (3, 4), 2)),
    _row("grid_sample", lambda F, x: F.grid_sample(x.reshape(1, 1, 3, 4), (x * 0.4).reshape(1, 3, 2, 2),
                                                   align_corners=False)),
    _row("bilinear", lambda F, x: F.bilinear(x, x.flip(0), x.reshape(3, 4, 1).expand(3, 4, 4))),
]


@pytest.mark.parametrize("call", [r.values[0] for r in DOUBLE_BACKWARD], ids=[r.id for r in DOUBLE_BACKWARD])
def test_double_backward_matches_torch(torch, call):
    """The compositions differentiate twice: the gradient of |d sum(y g) / dx|^2 matches PyTorch's."""
    rng = np.random.default_rng(3)
    a = rng.standard_normal((3, 4))
    x = mdn.tensor(a, requires_grad=True)
    tx = torch.tensor(a, requires_grad=True)
    y, ty = call(F, x), call(torch.nn.functional, tx)
    g = rng.standard_normal(tuple(ty.shape))
    (gx,) = mdn.autograd.grad((y * mdn.tensor(g)).sum(), [x], create_graph=True)
    (tgx,) = torch.autograd.grad((ty * torch.tensor(g)).sum(), [tx], create_graph=True)
    np.testing.assert_allclose(gx.detach().numpy(), tgx.detach().numpy(), rtol=1e-7, atol=1e-9)
    (ggx,) = mdn.autograd.grad((gx * gx).sum(), [x])
    (tggx,) = torch.autograd.grad((tgx * tgx).sum(), [tx])
    np.testing.assert_allclose(ggx.numpy(), tggx.numpy(), rtol=1e-7, atol=1e-9)
    assert np.abs(tggx.numpy()).max() > 0          # a second derivative that is not trivially zero


def test_softmin_implicit_dim_warns_like_torch(torch):
    x = np.random.default_rng(0).standard_normal((2, 3))
    with pytest.warns(UserWarning, match="Implicit dimension choice for softmin"):
        y = F.softmin(mdn.tensor(x))
    with pytest.warns(UserWarning, match="Implicit dimension choice for softmin"):
        ty = torch.nn.functional.softmin(torch.tensor(x))
    np.testing.assert_allclose(y.numpy(), ty.numpy(), rtol=1e-7)


def test_embedding_second_derivative_keeps_padding_mask(device):
    """_ScaleGrad's backward is a Tensor product: the padding row gets no first- or second-order gradient."""
    w = mdn.tensor(np.arange(12.0).reshape(4, 3), device=device, requires_grad=True)
    y = F.embedding(mdn.tensor([0, 2, 2], device=device), w, padding_idx=2)
    (gw,) = mdn.autograd.grad((y * y).sum(), [w], create_graph=True)
    np.testing.assert_array_equal(gw.detach().cpu().numpy()[2], 0)
    (ggw,) = mdn.autograd.grad(gw.sum(), [w])
    np.testing.assert_array_equal(ggw.cpu().numpy(), [[2, 2, 2], [0, 0, 0], [0, 0, 0], [0, 0, 0]])


def test_instance_norm_running_stats(torch, device):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((3, 2, 5))
    rm, rv = np.array([0.5, -1.0]), np.array([2.0, 0.5])
    m_rm, m_rv = mdn.tensor(rm, device=device), mdn.tensor(rv, device=device)
    t_rm, t_rv = torch.tensor(rm), torch.tensor(rv)
    y = F.instance_norm(mdn.tensor(a, device=device), m_rm, m_rv, momentum=0.3)
    ty = torch.nn.functional.instance_norm(torch.tensor(a), t_rm, t_rv, momentum=0.3)
    np.testing.assert_allclose(y.cpu().numpy(), ty.numpy(), rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(m_rm.cpu().numpy(), t_rm.numpy(), rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(m_rv.cpu().numpy(), t_rv.numpy(), rtol=1e-7, atol=1e-9)
    y = F.instance_norm(mdn.tensor(a, device=device), m_rm, m_rv, use_input_stats=False)
    ty = torch.nn.functional.instance_norm(torch.tensor(a), t_rm, t_rv, use_input_stats=False)
    np.testing.assert_allclose(y.cpu().numpy(), ty.numpy(), rtol=1e-7, atol=1e-9)


def test_embedding_max_norm_renormalises_in_place(torch, device):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((5, 3)) * 3
    idx = np.array([[0, 2], [2, 4]])
    mw, tw = mdn.tensor(w.copy(), device=device), torch.tensor(w.copy())
    y = F.embedding(mdn.tensor(idx, device=device), mw, max_norm=1.5, norm_type=1.0)
    ty = torch.nn.functional.embedding(torch.tensor(idx), tw, max_norm=1.5, norm_type=1.0)
    np.testing.assert_allclose(y.cpu().numpy(), ty.numpy(), rtol=1e-7)
    np.testing.assert_allclose(mw.cpu().numpy(), tw.numpy(), rtol=1e-7)
    assert not np.allclose(mw.cpu().numpy(), w)          # rows 0, 2, 4 were rescaled, 1 and 3 kept
    np.testing.assert_array_equal(mw.cpu().numpy()[[1, 3]], w[[1, 3]])


def test_one_hot_matches_torch(torch, device):
    idx = np.array([[0, 3], [1, 1]])
    for n in (-1, 5):
        y = F.one_hot(mdn.tensor(idx, device=device), n)
        ty = torch.nn.functional.one_hot(torch.tensor(idx), n)
        np.testing.assert_array_equal(y.cpu().numpy(), ty.numpy())
        assert y.dtype == np.int64


def test_rrelu_training_draws_slopes_in_range(device):
    mdn.manual_seed(0)
    x = mdn.tensor(np.linspace(-3, 3, 2001), device=device, requires_grad=True)
    y = F.rrelu(x, 0.1, 0.3, training=True)
    a, b = x.detach().cpu().numpy(), y.detach().cpu().numpy()
    neg = a < 0
    slopes = b[neg] / a[neg]
    assert slopes.min() >= 0.1 and slopes.max() <= 0.3 and slopes.std() > 0.03
    np.testing.assert_array_equal(b[a > 0], a[a > 0])
    y.sum().backward()
    np.testing.assert_allclose(x.grad.cpu().numpy()[neg], slopes, rtol=1e-6)
    mdn.manual_seed(0)
    np.testing.assert_array_equal(F.rrelu(x.detach(), 0.1, 0.3, training=True).cpu().numpy(), b)


def test_alpha_dropout_keeps_mean_and_variance(device):
    mdn.manual_seed(0)
    x = mdn.randn(200000, dtype=mdn.float64, device=device)
    y = F.alpha_dropout(x, 0.2, training=True).cpu().numpy()
    assert abs(y.mean()) < 0.02 and abs(y.std() - 1) < 0.02
    a = 1 / np.sqrt((1.7580993408473766 ** 2 * 0.2 + 1) * 0.8)
    dropped = -1.7580993408473766 * a + 1.7580993408473766 * a * 0.2
    assert 0.18 < np.mean(np.isclose(y, dropped)) < 0.22
    assert F.alpha_dropout(x, 0.2) is x                      # training=False by default: identity
    assert F.alpha_dropout(x, 0.2, training=True, inplace=False).shape == x.shape
    np.testing.assert_array_equal(F.alpha_dropout(x, 1.0, training=True).cpu().numpy(), 0)


# ---- modules -----------------------------------------------------------------------------------------------------

MODULES = [
    ("PReLU", (), G(2, 1, 3)),
    ("PReLU", (3, 0.1), G(2, 3, 4)),
    ("Mish", (), X), ("Hardswish", (), KINKS), ("Hardsigmoid", (), KINKS), ("SELU", (), X),
    ("CELU", (0.5,), X), ("GLU", (0,), G(4, 3)), ("Softsign", (), X), ("LogSigmoid", (), X),
    ("Softmin", (1,), X), ("Tanhshrink", (), X), ("Softshrink", (0.3,), KINKS),
    ("Hardshrink", (), KINKS), ("Threshold", (0.1, 20.0), KINKS), ("RReLU", (), X),
    ("CosineSimilarity", (), (G(3, 4), G(3, 4))), ("PairwiseDistance", (1.0,), (G(3, 4), G(3, 4))),
    ("PixelShuffle", (2,), G(1, 8, 2, 2)), ("PixelUnshuffle", (2,), G(1, 2, 4, 4)),
    ("ChannelShuffle", (2,), G(2, 4, 3)), ("Unfold", (2,), G(1, 2, 3, 3)),
    ("Fold", ((3, 3), 2), G(1, 8, 4)), ("AlphaDropout", (0.5,), X),
    ("InstanceNorm1d", (3,), G(2, 3, 4)), ("InstanceNorm1d", (3, 1e-5, 0.1, True), G(3, 4)),
    ("InstanceNorm2d", (3, 1e-5, 0.1, True), G(2, 3, 2, 2)),
    ("InstanceNorm3d", (2, 1e-5, 0.1, True, True), G(2, 2, 2, 2, 2)),
    ("KLDivLoss", (None, None, "batchmean"), (G(3, 4), G(3, 4, kind="prob"))),
    ("HuberLoss", ("sum", 0.5), (G(3, 4), G(3, 4))),
    ("MarginRankingLoss", (0.2,), (G(4), G(4), C(4, kind="sign"))),
    ("HingeEmbeddingLoss", (), (G(4), C(4, kind="sign"))),
    ("CosineEmbeddingLoss", (), (G(3, 4), G(3, 4), C(3, kind="sign"))),
    ("TripletMarginLoss", (), (G(3, 4), G(3, 4), G(3, 4))),
    ("PoissonNLLLoss", (), (G(3, 4), G(3, 4, kind="positive"))),
    ("GaussianNLLLoss", (), (G(3, 4), G(3, 4), G(3, 4, kind="positive"))),
    ("MultiMarginLoss", (), (G(3, 4), C(3, kind="int", high=4))),
    ("SoftMarginLoss", (), (G(3, 4), C(3, 4, kind="sign"))),
    ("MultiLabelSoftMarginLoss", (), (G(3, 4), C(3, 4, kind="prob"))),
    ("MultiLabelMarginLoss", (), (G(2, 3), Arg((2, 3), kind="values", grad=False, values=(2, -1, 0, 0, 1, -1)))),
]


@pytest.mark.parametrize("name,ctor,args", MODULES, ids=[f"{m[0]}{i}" for i, m in enumerate(MODULES)])
def test_modules_against_torch(torch, device, name, ctor, args):
    """Each module with PyTorch's constructor arguments gives PyTorch's output, gradient and parameter gradients
    (parameters copied from a PyTorch module built with the same arguments)."""
    args = args if isinstance(args, tuple) else (args,)
    ours, theirs = getattr(mnn, name)(*ctor).double().eval(), getattr(torch.nn, name)(*ctor).double().eval()
    for (pn, p), (tn, tp) in zip(ours.named_parameters(), theirs.named_parameters()):
        assert pn == tn and tuple(p.shape) == tuple(tp.shape)
        tp.data.normal_()
        p.data[...] = tp.detach().numpy()
    ours.to(device)
    _compare(torch, device, lambda F, *ts: (ours if F is globals()["F"] else theirs)(*ts), args, np.float64)
    for (_, p), (_, tp) in zip(ours.named_parameters(), theirs.named_parameters()):
        np.testing.assert_allclose(p.grad.cpu().numpy(), tp.grad.numpy(), rtol=1e-7, atol=1e-9)
    if name.startswith("InstanceNorm") and "bias=" not in repr(theirs):
        return                  # PyTorch before 2.13 (the GPU machine's) left bias= out of the norm layers' repr
    assert repr(ours) == repr(theirs)


def test_instance_norm_module_running_stats_and_eval(torch, device):
    ours, theirs = mnn.InstanceNorm2d(3, track_running_stats=True, momentum=0.2).double(), \
        torch.nn.InstanceNorm2d(3, track_running_stats=True, momentum=0.2).double()
    ours.to(device)
    a = np.random.default_rng(0).standard_normal((2, 3, 4, 4)) * 3 + 1
    for _ in range(2):
        ours(mdn.tensor(a, device=device))
        theirs(torch.tensor(a))
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        np.testing.assert_allclose(getattr(ours, name).cpu().numpy(), getattr(theirs, name).numpy(), rtol=1e-7)
    ours.eval()
    theirs.eval()
    np.testing.assert_allclose(ours(mdn.tensor(a[0], device=device)).cpu().numpy(),
                               theirs(torch.tensor(a[0])).detach().numpy(), rtol=1e-7, atol=1e-9)
    assert set(ours.state_dict()) == set(theirs.state_dict())


def test_bilinear_module(torch, device):
    ours, theirs = mnn.Bilinear(3, 2, 4).double(), torch.nn.Bilinear(3, 2, 4).double()
    assert tuple(ours.weight.shape) == (4, 3, 2) and tuple(ours.bias.shape) == (4,)
    bound = 1 / np.sqrt(3)
    assert np.abs(ours.weight.detach().numpy()).max() <= bound and ours.weight.detach().numpy().std() > 0
    ours.weight.data[...] = theirs.weight.detach().numpy()
    ours.bias.data[...] = theirs.bias.detach().numpy()
    ours.to(device)
    _compare(torch, device, lambda F, a, b: (ours if F is globals()["F"] else theirs)(a, b), (G(5, 3), G(5, 2)),
             np.float64)
    assert repr(ours) == repr(theirs)
    assert mnn.Bilinear(3, 2, 4, bias=False).bias is None


def test_prelu_module_parameter_and_init():
    m = mnn.PReLU(4, init=0.3)
    assert tuple(m.weight.shape) == (4,) and np.all(m.weight.detach().numpy() == np.float32(0.3))
    assert [n for n, _ in m.named_parameters()] == ["weight"]


def test_alpha_dropout_module_is_identity_in_eval():
    m = mnn.AlphaDropout(0.3).eval()
    x = mdn.randn(4, 5)
    assert m(x) is x


# ---- bad inputs: clear errors raised before any work -------------------------------------------------------------

BAD = [
    (lambda: F.prelu(mdn.randn(2, 3), mdn.randn(2)), ArgumentError, r"parameter numbers = 2 and channel size = 3"),
    (lambda: F.prelu(mdn.randn(2, 3), mdn.randn(3, 1)), ArgumentError, r"ndim = 2"),
    (lambda: F.prelu(mdn.randn(2, 3), mdn.randn(3, dtype=mdn.float64)), DTypeError, r"float64.*float32"),
    (lambda: F.mish(mdn.tensor([1, 2])), DTypeError, r"int64.*floating"),
    (lambda: F.glu(mdn.randn(2, 3)), ArgumentError, r"Halving dimension must be even.*dimension 1 is size 3"),
    (lambda: F.glu(mdn.randn(2, 4), dim=2), DimensionError, r"dim 2 is out of range.*\(2, 4\)"),
    (lambda: F.softshrink(mdn.randn(3), -1.0), ArgumentError, r"lambda must be greater or equal to 0.*-1.0"),
    (lambda: F.rrelu(mdn.randn(3), 0.5, 0.1), ArgumentError, r"lower=0.5, upper=0.1"),
    (lambda: F.alpha_dropout(mdn.randn(3), 1.5, True), ArgumentError, r"between 0 and 1, but got 1.5"),
    (lambda: F.celu(mdn.randn(3), 0.0), ArgumentError, r"alpha cannot be 0 for CELU"),
    (lambda: F.hinge_embedding_loss(mdn.randn(3), mdn.ones(2)), ArgumentError,
     r"input \(3,\), target \(2,\) do not broadcast"),
    (lambda: F.margin_ranking_loss(mdn.randn(3), mdn.randn(2), mdn.ones(3)), ArgumentError,
     r"input1 \(3,\), input2 \(2,\), target \(3,\) do not broadcast"),
    (lambda: F.poisson_nll_loss(mdn.randn(3), mdn.ones(2)), ArgumentError, r"do not broadcast"),
    (lambda: F.multilabel_soft_margin_loss(mdn.randn(2, 3), mdn.ones(2, 3), mdn.ones(4)), ArgumentError,
     r"weight \(4,\) do not broadcast"),
    (lambda: F.multilabel_margin_loss(mdn.randn(2, 3), mdn.tensor([[0, 3, -1], [1, -1, 0]])), DimensionError,
     r"target value 3 is out of range for 3 classes"),
    (lambda: F.grid_sample(mdn.randn(1, 1, 3, 3), mdn.randn(1, 2, 2, 2), mode="bicubic", align_corners=False),
     NotImplementedError, r"mode='bicubic'"),
    (lambda: F.grid_sample(mdn.randn(1, 1, 3, 3), mdn.randn(2, 2, 2, 2), align_corners=False), ArgumentError,
     r"grid \(2, 2, 2, 2\) for input \(1, 1, 3, 3\)"),
    (lambda: F.affine_grid(mdn.randn(1, 3, 3), (1, 1, 3, 3), align_corners=False), ArgumentError,
     r"Nx2x3 for size \[1, 1, 3, 3\]. Got \[1, 3, 3\]"),
    (lambda: F.cosine_similarity(mdn.randn(3, 4), mdn.randn(2, 4)), ArgumentError, r"\(3, 4\).*\(2, 4\).*broadcast"),
    (lambda: F.cosine_similarity(mdn.randn(3, 4), mdn.randn(3, 4), dim=2), DimensionError, r"dim 2 is out of range"),
    (lambda: F.pdist(mdn.randn(2, 3, 4)), ArgumentError, r"pdist only supports 2D tensors, got: 3D"),
    (lambda: F.pairwise_distance(mdn.randn(2, 3), mdn.randn(2, 3), p=-1), ArgumentError, r"p=-1"),
    (lambda: F.kl_div(mdn.randn(2, 3), mdn.randn(2, 3), reduction="avg"), ArgumentError, r"reduction='avg'"),
    (lambda: F.kl_div(mdn.randn(2, 3), mdn.randn(4, 3), reduction="sum"), ArgumentError,
     r"\(2, 3\).*\(4, 3\).*broadcast"),
    (lambda: F.huber_loss(mdn.randn(3), mdn.randn(3), delta=0.0), ArgumentError, r"non-positive.*delta=0.0"),
    (lambda: F.huber_loss(mdn.randn(3), mdn.randn(3), weight=mdn.ones(2)), ArgumentError, r"\(2,\).*\(3,\)"),
    (lambda: F.huber_loss(mdn.randn(3), mdn.randn(3), reduction="max"), ArgumentError, r"reduction='max'"),
    (lambda: F.margin_ranking_loss(mdn.randn(3), mdn.randn(3), mdn.ones(3, 1)), ArgumentError,
     r"same dimension.*target: \(3, 1\)"),
    (lambda: F.cosine_embedding_loss(mdn.randn(3, 4), mdn.randn(3, 4), mdn.ones(3, 1)), ArgumentError,
     r"0D or 1D target"),
    (lambda: F.cosine_embedding_loss(mdn.randn(3, 4), mdn.randn(3, 4), mdn.ones(())), ArgumentError,
     r"0D target tensor expects 1D input"),
    (lambda: F.cosine_embedding_loss(mdn.randn(3, 4), mdn.randn(3, 5), mdn.ones(3)), ArgumentError,
     r"\(3, 4\).*\(3, 5\)"),
    (lambda: F.triplet_margin_loss(mdn.randn(3, 4), mdn.randn(4), mdn.randn(3, 4)), ArgumentError,
     r"anchor 2D, positive 1D, and negative 2D"),
    (lambda: F.triplet_margin_loss(mdn.randn(4), mdn.randn(4), mdn.randn(4), margin=0), ArgumentError,
     r"margin must be greater than 0, got 0"),
    (lambda: F.gaussian_nll_loss(mdn.randn(3, 4), mdn.randn(3, 4), mdn.ones(2, 4)), ArgumentError,
     r"var is of incorrect size.*\(2, 4\).*\(3, 4\)"),
    (lambda: F.gaussian_nll_loss(mdn.randn(3), mdn.randn(3), -mdn.ones(3)), ArgumentError, r"negative entr"),
    (lambda: F.gaussian_nll_loss(mdn.randn(3), mdn.randn(3), -1.0), ArgumentError, r"negative entr"),
    (lambda: F.multi_margin_loss(mdn.randn(3, 4), mdn.tensor([0, 1, 4])), DimensionError,
     r"target out of range: found class 4 for 4 classes"),
    (lambda: F.multi_margin_loss(mdn.randn(3, 4), mdn.tensor([0, 1, 2]), p=3), ArgumentError, r"p == 1 and p == 2"),
    (lambda: F.multi_margin_loss(mdn.randn(3, 4), mdn.tensor([0, 1])), ArgumentError,
     r"inconsistent target size: \(2,\) for input of size: \(3, 4\)"),
    (lambda: F.multi_margin_loss(mdn.randn(3, 4), mdn.randn(3)), DTypeError, r"class indices must be integers"),
    (lambda: F.embedding(mdn.tensor([0, 5]), mdn.randn(5, 2)), DimensionError,
     r"index out of range in self: index 5 for num_embeddings=5"),
    (lambda: F.embedding(mdn.randn(3), mdn.randn(5, 2)), DTypeError, r"integer dtype, but got float32"),
    (lambda: F.embedding(mdn.tensor([0]), mdn.randn(5)), ArgumentError, r"'weight' must be 2-D, got shape \(5,\)"),
    (lambda: F.embedding(mdn.tensor([0]), mdn.randn(5, 2), padding_idx=5), ArgumentError,
     r"Padding_idx must be within num_embeddings"),
    (lambda: F.pixel_shuffle(mdn.randn(1, 5, 2, 2), 2), ArgumentError, r"input.size\(-3\)=5 is not divisible by 4"),
    (lambda: F.pixel_shuffle(mdn.randn(4, 2), 2), ArgumentError, r"at least 3 dimensions.*2 dimension"),
    (lambda: F.pixel_shuffle(mdn.randn(1, 4, 2, 2), 0), ArgumentError, r"upscale_factor must be greater than 0"),
    (lambda: F.pixel_unshuffle(mdn.randn(1, 1, 5, 4), 2), ArgumentError, r"input.size\(-2\)=5 is not divisible by 2"),
    (lambda: F.channel_shuffle(mdn.randn(1, 5, 2), 2), ArgumentError, r"Got 5 channels and 2 groups"),
    (lambda: F.instance_norm(mdn.randn(2, 3, 1)), ArgumentError, r"more than 1 spatial element.*\(2, 3, 1\)"),
    (lambda: F.instance_norm(mdn.randn(2, 3, 4), weight=mdn.ones(4)), ArgumentError, r"weight has shape \(4,\)"),
    (lambda: F.unfold(mdn.randn(3, 4), 2), ArgumentError, r"Only 3D or 4D input.*got 2D"),
    (lambda: F.unfold(mdn.randn(1, 1, 2, 2), 3), ArgumentError, r"sliding blocks as \(0, 0\)"),
    (lambda: F.fold(mdn.randn(1, 5, 9), 4, 2), ArgumentError, r"input.size\(1\)=5 and kernel_size=\(2, 2\)"),
    (lambda: F.fold(mdn.randn(1, 4, 8), 4, 2), ArgumentError, r"3 \* 3 = 9, but got input.size\(2\)=8"),
    (lambda: F.bilinear(mdn.randn(2, 3), mdn.randn(2, 2), mdn.randn(4, 3, 3)), ArgumentError,
     r"do not match weight \(4, 3, 3\)"),
    (lambda: mnn.InstanceNorm1d(3, affine=True)(mdn.randn(2, 4, 5)), ArgumentError,
     r"num_features \(3\), but got: 4"),
    (lambda: mnn.PReLU(3)(mdn.randn(2, 4)), ArgumentError, r"parameter numbers = 3 and channel size = 4"),
    (lambda: mnn.KLDivLoss(reduction="avg"), ArgumentError, r"reduction='avg'"),
]


@pytest.mark.parametrize("call,error,match", BAD, ids=[f"bad{i}" for i in range(len(BAD))])
def test_bad_inputs_raise_clear_errors(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_errors_are_raised_before_any_work():
    """max_norm renormalises the weight in place: a bad index must fail before that."""
    w = mdn.randn(4, 3) * 10
    before = w.numpy().copy()
    with pytest.raises(DimensionError):
        F.embedding(mdn.tensor([0, 9]), w, max_norm=1.0)
    np.testing.assert_array_equal(w.numpy(), before)
    rm = mdn.zeros(3)
    with pytest.raises(ArgumentError):
        F.instance_norm(mdn.randn(2, 3, 4), rm, mdn.ones(3), weight=mdn.ones(2))
    np.testing.assert_array_equal(rm.numpy(), 0)


def test_autocast_casts_as_torch(torch):
    """Under CPU bfloat16 autocast the new ops come out in PyTorch's dtypes (losses in float32, prelu lowered)."""
    a = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    calls = [lambda F, x: F.huber_loss(x, x * 0.5), lambda F, x: F.kl_div(x, x * 0 + 0.25, reduction="batchmean"),
             lambda F, x: F.prelu(x.float(), x[0, :1].float() * 0 + 0.2), lambda F, x: F.mish(x),
             lambda F, x: F.cosine_similarity(x, x * 2)]
    for call in calls:
        with mdn.autocast("cpu", dtype=mdn.bfloat16):
            ours = call(F, mdn.tensor(a).astype(mdn.bfloat16))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            theirs = call(torch.nn.functional, torch.tensor(a).bfloat16())
        assert str(ours.dtype) == str(theirs.dtype).replace("torch.", "")

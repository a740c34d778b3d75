"""F.pad (every mode), the padding layers, F.interpolate / nn.Upsample and F.normalize: forward and backward
against PyTorch (float64), float64 gradcheck of the normalize Function, clear errors."""
import numpy as np
import pytest

import minidnn as mdn
import minidnn.nn as nn
import minidnn.nn.functional as F
from minidnn.autograd import gradcheck

torch = pytest.importorskip("torch", reason="PyTorch is the oracle for padding and interpolation")
TF = torch.nn.functional


def _both(shape, device, seed=0, strided=False):
    x = np.random.default_rng(seed).standard_normal(shape)
    if strided:                                     # a non-contiguous input (a transposed view)
        x = np.swapaxes(np.swapaxes(x, -1, -2).copy(), -1, -2)
    a = mdn.tensor(x, device=device, requires_grad=True)
    t = torch.tensor(x, requires_grad=True)
    return a, t


def _check(fn_m, fn_t, shape, device, seed=0, rtol=1e-12, atol=1e-12, strided=False):
    a, t = _both(shape, device, seed, strided)
    y, ty = fn_m(a), fn_t(t)
    assert tuple(y.shape) == tuple(ty.shape)
    np.testing.assert_allclose(y.cpu().numpy(), ty.detach().numpy(), rtol=rtol, atol=atol)
    gy = np.random.default_rng(seed + 1).standard_normal(tuple(ty.shape))
    y.backward(mdn.tensor(gy, device=device))
    ty.backward(torch.tensor(gy))
    np.testing.assert_allclose(a.grad.cpu().numpy(), t.grad.numpy(), rtol=rtol, atol=atol)


PADS = [((2, 5), (1, 2)), ((3, 6), (3, 0)), ((2, 3, 5), (2, 4)), ((2, 3, 4, 5), (1, 2, 3, 0)),
        ((1, 2, 4, 5), (-1, 2, 1, -2)), ((2, 4, 5), (1, 1, 2, 2)), ((1, 2, 3, 4, 5), (1, 0, 2, 1, 1, 2)),
        ((2, 1, 3, 1), (0, 0, 2, 2))]


@pytest.mark.parametrize("mode", ["constant", "reflect", "replicate", "circular"])
@pytest.mark.parametrize("shape,pad", PADS)
def test_pad_modes_match_pytorch(mode, shape, pad, device):
    if mode == "reflect" and any(p >= n for p, n in zip(pad, np.repeat(shape[::-1], 2))):
        pytest.skip("reflect needs padding smaller than the dimension")
    kw = dict(value=1.5) if mode == "constant" else {}
    _check(lambda x: F.pad(x, pad, mode=mode, **kw), lambda x: TF.pad(x, pad, mode=mode, **kw), shape, device)


@pytest.mark.parametrize("layer,args,shape", [
    ("ReflectionPad2d", (2,), (2, 3, 4, 5)), ("ReflectionPad1d", ((1, 3),), (2, 3, 5)),
    ("ReflectionPad3d", (1,), (1, 2, 3, 3, 3)), ("ReplicationPad2d", ((3, 0, 1, 2),), (3, 4, 5)),
    ("ReplicationPad1d", (2,), (2, 4)), ("ReplicationPad3d", ((1, 0, 2, 1, 0, 1),), (1, 1, 2, 3, 4)),
    ("ZeroPad2d", ((1, 2, 3, 4),), (2, 3, 4, 5)), ("ZeroPad1d", (2,), (2, 3, 4)),
    ("ConstantPad2d", (2, -0.5), (2, 3, 4, 5)), ("ConstantPad1d", ((0, 3), 2.0), (3, 4)),
    ("ConstantPad3d", (1, 0.25), (1, 2, 2, 2, 2)), ("CircularPad2d", (1,), (2, 3, 4, 5)),
])
def test_padding_layers_match_pytorch(layer, args, shape, device):
    m, t = getattr(nn, layer)(*args), getattr(torch.nn, layer)(*args)
    _check(m, t, shape, device, strided=True)
    assert m.padding == t.padding


@pytest.mark.parametrize("call", [
    lambda f, x: f.pad(x, (3, 3), mode="reflect"),               # padding >= the dimension
    lambda f, x: f.pad(x, (1,), mode="constant"),                # odd length
    lambda f, x: f.pad(x, (1, 1), mode="bogus"),
    lambda f, x: f.pad(x, (1, 1, 1, 1, 1, 1, 1, 1), mode="replicate"),
])
def test_pad_errors(call):
    with pytest.raises((RuntimeError, ValueError, NotImplementedError)):
        call(F, mdn.zeros(1, 2, 3))
    with pytest.raises((RuntimeError, ValueError, NotImplementedError)):
        call(TF, torch.zeros(1, 2, 3))


INTERP = [
    ((2, 3, 5), dict(scale_factor=2)), ((2, 3, 5), dict(size=8, mode="linear")),
    ((2, 3, 5), dict(size=3, mode="linear", align_corners=True)), ((1, 2, 7), dict(scale_factor=0.5)),
    ((2, 3, 4, 5), dict(scale_factor=2)), ((2, 3, 4, 5), dict(size=(7, 3))),
    ((2, 3, 4, 5), dict(scale_factor=(1.5, 0.7))), ((2, 3, 4, 5), dict(scale_factor=2, mode="bilinear")),
    ((2, 3, 4, 5), dict(scale_factor=1.7, mode="bilinear", align_corners=True)),
    ((2, 3, 4, 5), dict(size=(9, 11), mode="bilinear", align_corners=False)),
    ((2, 3, 6, 5), dict(size=(3, 2), mode="bilinear")), ((1, 1, 4, 4), dict(size=(1, 1), mode="bilinear",
                                                                         align_corners=True)),
    ((2, 3, 4, 5), dict(scale_factor=2.3, mode="nearest-exact")),
    ((2, 3, 4, 5), dict(scale_factor=2, mode="bicubic")), ((2, 3, 5, 6), dict(size=(3, 9), mode="bicubic")),
    ((1, 2, 4, 5), dict(size=(7, 2), mode="bicubic", align_corners=True)),
    ((1, 2, 4, 5), dict(scale_factor=1.6, mode="bicubic")),
    ((2, 3, 4, 5), dict(scale_factor=1.7, mode="bilinear", recompute_scale_factor=True)),
    ((2, 3, 6, 8), dict(size=(3, 4), mode="area")), ((2, 3, 6, 8), dict(size=(4, 3), mode="area")),
    ((1, 2, 3, 4, 5), dict(scale_factor=2, mode="trilinear")), ((1, 2, 3, 4, 5), dict(size=(2, 5, 3))),
    ((1, 2, 3, 4, 5), dict(size=(5, 2, 7), mode="trilinear", align_corners=True)),
]


@pytest.mark.parametrize("shape,kw", INTERP)
def test_interpolate_matches_pytorch(shape, kw, device):
    _check(lambda x: F.interpolate(x, **kw), lambda x: TF.interpolate(x, **kw), shape, device, strided=True)


@pytest.mark.parametrize("kw", [dict(scale_factor=2), dict(size=(6, 9), mode="bilinear", align_corners=True),
                                dict(scale_factor=1.5, mode="bilinear")])
def test_upsample_layer_and_float32(kw):
    m, t = nn.Upsample(**kw), torch.nn.Upsample(**kw)
    x = np.random.default_rng(5).standard_normal((2, 3, 4, 5)).astype(np.float32)
    np.testing.assert_allclose(m(mdn.tensor(x)).numpy(), t(torch.tensor(x)).numpy(), rtol=1.3e-6, atol=1e-5)
    assert m(mdn.tensor(x)).dtype == np.float32


def test_upsampling_shorthands():
    _check(nn.UpsamplingBilinear2d(scale_factor=2), torch.nn.UpsamplingBilinear2d(scale_factor=2), (1, 2, 3, 4), "cpu")
    _check(nn.UpsamplingNearest2d(size=(5, 7)), torch.nn.UpsamplingNearest2d(size=(5, 7)), (1, 2, 3, 4), "cpu")


@pytest.mark.parametrize("bad", [dict(), dict(size=4, scale_factor=2), dict(size=4, align_corners=True),
                                 dict(size=(4, 4, 4)), dict(size=4, mode="bilinear")])
def test_interpolate_errors(bad):
    with pytest.raises((ValueError, RuntimeError, NotImplementedError)):
        F.interpolate(mdn.zeros(1, 2, 3), **bad)
    with pytest.raises((ValueError, RuntimeError, NotImplementedError)):
        TF.interpolate(torch.zeros(1, 2, 3), **bad)


@pytest.mark.parametrize("p,dim", [(2.0, 1), (1.0, -1), (3.0, 0), (float("inf"), 1), (0.5, 2)])
def test_normalize_matches_pytorch(p, dim, device):
    _check(lambda x: F.normalize(x, p=p, dim=dim), lambda x: TF.normalize(x, p=p, dim=dim), (3, 4, 5), device,
           rtol=1e-10, atol=1e-12)


def test_normalize_zero_rows_have_zero_gradient():
    x = np.random.default_rng(0).standard_normal((4, 3))
    x[1] = 0
    _check(lambda a: F.normalize(a + mdn.tensor(x) * 0), lambda a: TF.normalize(a + torch.tensor(x) * 0),
           (4, 3), "cpu")
    a, t = mdn.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    F.normalize(a, eps=1e-3).sum().backward()
    TF.normalize(t, eps=1e-3).sum().backward()
    np.testing.assert_allclose(a.grad.numpy(), t.grad.numpy(), atol=1e-12)
    assert np.isfinite(a.grad.numpy()).all()


def test_normalize_gradcheck():
    from minidnn.nn.functional_extra import _NormKeepdim
    for p in (2.0, 1.5, 3.0):
        x = mdn.tensor(np.random.default_rng(1).standard_normal((3, 4)) + 0.1, requires_grad=True)
        assert gradcheck(lambda a: _NormKeepdim.apply(a, p, 1), (x,))
        assert gradcheck(lambda a: F.normalize(a, p=p, dim=0), (x,))


def test_double_backward():
    from minidnn.autograd import gradgradcheck
    x = mdn.tensor(np.random.default_rng(2).standard_normal((1, 2, 3, 4)) + 0.2, requires_grad=True)
    assert gradgradcheck(lambda a: F.normalize(a, dim=1), (x,))
    assert gradgradcheck(lambda a: F.normalize(a, p=3.0, dim=-1), (x,))
    assert gradgradcheck(lambda a: F.pad(a, (1, 2, 2, 0), mode="reflect") ** 2, (x,))
    assert gradgradcheck(lambda a: F.interpolate(a, scale_factor=1.5, mode="bicubic") ** 2, (x,))

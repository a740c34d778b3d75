"""Property-based comparison with PyTorch (hypothesis, derandomised, a few dozen examples each) for the new
functional ops: pad (every mode), interpolate, normalize and scaled_dot_product_attention, forward and backward,
over shapes with size-0 and size-1 dimensions and non-contiguous (transposed) inputs."""
import numpy as np
import pytest

import minidnn as mdn
import minidnn.nn.functional as F

torch = pytest.importorskip("torch", reason="PyTorch is the oracle")
hyp = pytest.importorskip("hypothesis", reason="hypothesis drives the property tests")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

TF = torch.nn.functional
SETTINGS = dict(max_examples=30, deadline=None, derandomize=True, database=None)


def _input(shape, transposed, seed):
    x = np.random.default_rng(seed).standard_normal(shape)
    if transposed and len(shape) >= 2:
        x = np.swapaxes(np.swapaxes(x, -1, -2).copy(), -1, -2)     # same values, non-contiguous strides
    return x


def _compare(fm, ft, x, rtol=1e-10, atol=1e-12):
    a, t = mdn.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    y, ty = fm(a), ft(t)
    assert tuple(y.shape) == tuple(ty.shape)
    np.testing.assert_allclose(y.detach().numpy(), ty.detach().numpy(), rtol=rtol, atol=atol)
    if ty.numel() == 0:
        return
    g = np.random.default_rng(0).standard_normal(tuple(ty.shape))
    y.backward(mdn.tensor(g))
    ty.backward(torch.tensor(g))
    np.testing.assert_allclose(a.grad.numpy(), t.grad.numpy(), rtol=rtol, atol=atol)


@settings(**SETTINGS)
@given(data=st.data())
def test_pad_property(data):
    mode = data.draw(st.sampled_from(["constant", "reflect", "replicate", "circular"]))
    k = data.draw(st.integers(1, 3))
    batch = data.draw(st.sampled_from([(), (0,), (1,), (2,)])) if mode == "constant" else \
        data.draw(st.sampled_from([(), (1,), (2,)]))
    spatial = tuple(data.draw(st.integers(1, 4)) for _ in range(k))
    shape = batch + (data.draw(st.integers(1, 2)),) + spatial
    pad = []
    for n in reversed(spatial):
        hi = {"reflect": n - 1, "circular": n}.get(mode, 3)
        lo = -(n - 1) if mode == "constant" else 0
        pad += [data.draw(st.integers(lo, hi)), data.draw(st.integers(lo, hi))]
    x = _input(shape, data.draw(st.booleans()), data.draw(st.integers(0, 99)))
    kw = dict(value=0.5) if mode == "constant" else {}
    _compare(lambda a: F.pad(a, pad, mode=mode, **kw), lambda t: TF.pad(t, pad, mode=mode, **kw), x)


@settings(**SETTINGS)
@given(data=st.data())
def test_interpolate_property(data):
    k = data.draw(st.integers(1, 2))
    mode = data.draw(st.sampled_from(["nearest", "nearest-exact", "linear" if k == 1 else "bilinear"]))
    spatial = tuple(data.draw(st.integers(1, 5)) for _ in range(k))
    shape = (data.draw(st.integers(0, 2)), data.draw(st.integers(1, 2))) + spatial
    kw = {}
    if data.draw(st.booleans()):
        kw["size"] = tuple(data.draw(st.integers(1, 7)) for _ in range(k))
    else:
        kw["scale_factor"] = tuple(data.draw(st.sampled_from([0.5, 1.0, 1.5, 2.0, 2.5, 3.0])) for _ in range(k))
        if any(int(np.floor(n * s)) < 1 for n, s in zip(spatial, kw["scale_factor"])):
            kw["scale_factor"] = (2.0,) * k
    if mode in ("linear", "bilinear"):
        kw["align_corners"] = data.draw(st.booleans())
    x = _input(shape, data.draw(st.booleans()), data.draw(st.integers(0, 99)))
    _compare(lambda a: F.interpolate(a, mode=mode, **kw), lambda t: TF.interpolate(t, mode=mode, **kw), x)


@settings(**SETTINGS)
@given(data=st.data())
def test_normalize_property(data):
    shape = tuple(data.draw(st.integers(1, 4)) for _ in range(data.draw(st.integers(1, 3))))
    dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    p = data.draw(st.sampled_from([1.0, 2.0, 3.0]))
    x = _input(shape, data.draw(st.booleans()), data.draw(st.integers(0, 99)))
    _compare(lambda a: F.normalize(a, p=p, dim=dim), lambda t: TF.normalize(t, p=p, dim=dim), x, rtol=1e-9)


@settings(**SETTINGS)
@given(data=st.data())
def test_sdpa_property(data):
    lead = tuple(data.draw(st.integers(1, 2)) for _ in range(data.draw(st.integers(0, 2))))
    L, S, E = (data.draw(st.integers(1, 4)) for _ in range(3))
    causal = data.draw(st.booleans())
    rng = np.random.default_rng(data.draw(st.integers(0, 99)))
    q, k, v = (rng.standard_normal(lead + s) for s in [(L, E), (S, E), (S, E)])
    mask = None
    if not causal and data.draw(st.booleans()):
        mask = rng.standard_normal((L, S))
    qa, ka, va = (mdn.tensor(a, requires_grad=True) for a in (q, k, v))
    qt, kt, vt = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    y = F.scaled_dot_product_attention(qa, ka, va, attn_mask=None if mask is None else mdn.tensor(mask),
                                       is_causal=causal)
    ty = TF.scaled_dot_product_attention(qt, kt, vt, attn_mask=None if mask is None else torch.tensor(mask),
                                         is_causal=causal)
    np.testing.assert_allclose(y.detach().numpy(), ty.detach().numpy(), rtol=1e-10, atol=1e-12)
    y.sum().backward()
    ty.sum().backward()
    for a, t in ((qa, qt), (ka, kt), (va, vt)):
        np.testing.assert_allclose(a.grad.numpy(), t.grad.numpy(), rtol=1e-9, atol=1e-12)

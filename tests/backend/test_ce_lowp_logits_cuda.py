"""Cross-entropy on 16-bit logits read as float32 (loss_kernels XSTORAGE, softmax_cross_entropy_* widen=, nn
cross_entropy in autocast) on the GPU: bitwise equal to the cast path -- x.astype(float32) through the float32
kernels, dx.astype(x's dtype) -- for every reduction, ignore_index (some rows, every row), float32 class weights,
label smoothing, both 16-bit dtypes, row tails (C not a multiple of the vector width, RAGGED rows), chunked rows,
N-d logits (the warp kernels), a logits view off the vector boundary, -inf (masked) logits, and the seen-call path
(each call made twice).  nn: loss and gradient bits and dtypes in an autocast region against the same call on the
float32 copy outside it (what autocast's cast did), PyTorch's dtypes (float32 loss, the logits' dtype for their
gradient; torch's CPU autocast as the oracle where installed), and create_graph's second derivative."""
import numpy as np
import pytest

import minidnn as mdn
import minidnn.backend as B
import minidnn.nn.functional as F
from minidnn.backend import devices as _dev
from minidnn.backend._testing import to_numpy

pytestmark = pytest.mark.cuda
BF16 = np.dtype(pytest.importorskip("ml_dtypes").bfloat16)
DTYPES = {"bf16": BF16, "fp16": np.dtype(np.float16)}


@pytest.fixture
def cp():
    if not _dev.cuda_is_available():
        pytest.skip("no CUDA GPU with CuPy on this machine")
    return _dev.require_cupy()


def _launches():
    from minidnn.backend.cuda import launch
    return launch.launch_count()


def _bits(a):
    a = np.ascontiguousarray(np.asarray(to_numpy(a)))
    return a.view(np.uint32 if a.dtype.itemsize == 4 else np.uint16)


def _same(got, ref, what):
    """Bit for bit; a NaN only where the reference has one (its payload may be the conversion's)."""
    g, r = np.asarray(to_numpy(got)), np.asarray(to_numpy(ref))
    assert g.dtype == r.dtype and g.shape == r.shape, (what, g.dtype, r.dtype, g.shape, r.shape)
    gn, rn = np.isnan(g.astype(np.float32)), np.isnan(r.astype(np.float32))
    assert np.array_equal(gn, rn), what
    bad = (_bits(g) != _bits(r)) & ~gn
    assert not bad.any(), f"{what}: {int(bad.sum())} of {bad.size} differ"


# (shape, weighted, eps, ignored fraction, reduction): tails (10, 33, 1001: RAGGED, 1025), a PIPE walk of many rows,
# a block row (4097), chunked rows (32768, 50257), N-d logits, every row ignored
CASES = [((300, 10), False, 0.0, 0.0, "mean"), ((300, 10), True, 0.1, 0.3, "none"), ((300, 33), True, 0.0, 0.2, "sum"),
         ((6000, 1000), False, 0.0, 0.1, "mean"), ((6000, 1000), True, 0.1, 0.0, "mean"),
         ((3000, 1001), False, 0.0, 0.0, "none"), ((77, 1001), True, 0.1, 0.5, "sum"), ((40, 1025), False, 0.1, 0.0,
                                                                                       "mean"),
         ((40, 4097), True, 0.0, 0.1, "none"), ((5, 32768), False, 0.0, 0.0, "sum"), ((4, 50257), True, 0.1, 0.0,
                                                                                      "mean"),
         ((9, 7, 5), True, 0.1, 0.2, "mean"), ((9, 7, 5), False, 0.0, 0.0, "none"), ((64, 100), False, 0.0, 1.0,
                                                                                    "mean"),
         ((64, 100), True, 0.2, 1.0, "sum")]


def _data(shape, dtype, weighted, ignore, seed, masked=False):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 4).astype(np.float32).astype(dtype)
    if masked:
        x[:, ::7] = -np.inf
    tshape = (shape[0],) + tuple(shape[2:])
    t = rng.integers(0, shape[1], tshape)
    t[rng.random(tshape) < ignore] = -100
    w = (rng.random(shape[1]) + 0.1).astype(np.float32) if weighted else None
    return x, t, w, rng


def _both_paths(cp, x16, t, w, eps, red, rng):
    """(new, cast path) results: (loss, lse, denom, dx) each, computed twice (the second: the seen call)."""
    gw = None if w is None else cp.asarray(w)
    res = []
    for widen in (True, False):
        for _ in range(2):
            x = x16 if widen else x16.astype(np.float32)
            loss, lse, den = B.softmax_cross_entropy_forward(None, x, t, gw, -100, eps, red, widen=widen)
            g = cp.asarray(np.random.default_rng(5).standard_normal(loss.shape).astype(np.float32))
            dx = B.softmax_cross_entropy_backward(None, x, t, g, lse, den, gw, -100, eps, red, widen=widen)
            res.append((loss, lse, den, dx if widen else dx.astype(x16.dtype)))
    return res


@pytest.mark.parametrize("dt", list(DTYPES))
@pytest.mark.parametrize("case", CASES, ids=["-".join(map(str, c)).replace(" ", "") for c in CASES])
def test_widened_primitive_is_bitwise_the_cast_path(cp, dt, case):
    shape, weighted, eps, ignore, red = case
    x, t, w, rng = _data(shape, DTYPES[dt], weighted, ignore, hash(case) % 1000)
    xg, tg = cp.asarray(x), cp.asarray(t)
    n0 = _launches()
    B.softmax_cross_entropy_forward(None, xg, tg, None if w is None else cp.asarray(w), -100, eps, red, widen=True)
    assert _launches() - n0 == 1, "one launch, no cast"
    new1, new2, old1, old2 = _both_paths(cp, xg, tg, w, eps, red, rng)
    for k, what in enumerate(("loss", "lse", "denom", "dx")):
        _same(new1[k], old1[k], what)
        _same(new2[k], old2[k], what + " (seen call)")
    assert new1[0].dtype == np.float32 and new1[3].dtype == DTYPES[dt]


@pytest.mark.parametrize("dt", list(DTYPES))
@pytest.mark.parametrize("c", [1000, 1001, 10])
def test_misaligned_view_and_masked_logits(cp, dt, c):
    x, t, w, rng = _data((257, c), DTYPES[dt], True, 0.1, c, masked=True)
    buf = cp.empty(x.size + 1, dtype=x.dtype)
    buf[1:] = cp.asarray(x).reshape(-1)
    xv = buf[1:].reshape(x.shape)                          # 2 bytes past the allocation: off the vector boundary
    for xg in (cp.asarray(x), xv):
        new1, _, old1, _ = _both_paths(cp, xg, cp.asarray(t), w, 0.1, "none", rng)
        for k, what in enumerate(("loss", "lse", "denom", "dx")):
            _same(new1[k], old1[k], what)


def _torch_dtypes(dt):
    torch = pytest.importorskip("torch")
    tdt = torch.bfloat16 if dt == "bf16" else torch.float16
    x = torch.randn(6, 5).to(tdt).requires_grad_()
    try:
        with torch.autocast("cpu", dtype=tdt):
            loss = torch.nn.functional.cross_entropy(x, torch.arange(6) % 5)
    except RuntimeError:
        pytest.skip("this torch's CPU autocast lacks the dtype")
    loss.backward()
    return str(loss.dtype).replace("torch.", ""), str(x.grad.dtype).replace("torch.", "")


@pytest.mark.parametrize("dt", list(DTYPES))
@pytest.mark.parametrize("kw", [{}, {"reduction": "none", "label_smoothing": 0.1}, {"weight": True},
                                {"probabilities": True}])
def test_nn_cross_entropy_in_autocast(cp, dt, kw):
    dtype, mdt = DTYPES[dt], mdn.bfloat16 if dt == "bf16" else mdn.float16
    x, t, w, rng = _data((512, 1000), dtype, bool(kw.get("weight")), 0.05, 7)
    kw = dict(kw)
    if kw.pop("weight", None):
        kw["weight"] = mdn.tensor(w, device="cuda")
    if kw.pop("probabilities", None):
        p = rng.random(x.shape).astype(np.float32)
        target = mdn.tensor((p / p.sum(1, keepdims=True)).astype(dtype), device="cuda")
    else:
        target = mdn.tensor(t, device="cuda")
    a = mdn.tensor(x, device="cuda", requires_grad=True)
    with mdn.autocast("cuda", dtype=mdt):
        la = F.cross_entropy(a, target, **kw)
    la.sum().backward()
    b = mdn.tensor(x, device="cuda", requires_grad=True)           # what autocast's cast did, by hand
    lb = F.cross_entropy(b.float(), target.float() if target.dtype != mdn.int64 else target, **kw)
    lb.sum().backward()
    _same(la.data, lb.data, "loss")
    _same(a.grad.data, b.grad.data, "dlogits")
    assert (str(la.dtype).split(".")[-1], str(a.grad.dtype).split(".")[-1]) == ("float32", dtype.name)
    assert _torch_dtypes(dt) == ("float32", dtype.name)


@pytest.mark.parametrize("dt", list(DTYPES))
def test_create_graph_keeps_the_cast_path(cp, dt):
    dtype, mdt = DTYPES[dt], mdn.bfloat16 if dt == "bf16" else mdn.float16
    x, t, w, rng = _data((64, 37), dtype, True, 0.1, 3)
    v = mdn.tensor(rng.standard_normal(x.shape).astype(np.float32).astype(dtype), device="cuda")
    outs = []
    for region in (True, False):
        a = mdn.tensor(x, device="cuda", requires_grad=True)
        if region:
            with mdn.autocast("cuda", dtype=mdt):
                loss = F.cross_entropy(a, mdn.tensor(t, device="cuda"), weight=mdn.tensor(w, device="cuda"),
                                       label_smoothing=0.1)
        else:
            loss = F.cross_entropy(a.float(), mdn.tensor(t, device="cuda"), weight=mdn.tensor(w, device="cuda"),
                                   label_smoothing=0.1)
        g, = mdn.autograd.grad(loss, a, create_graph=True)
        h, = mdn.autograd.grad((g * v).float().sum(), a)
        outs.append((loss, g, h))
    for k, what in enumerate(("loss", "dx", "second derivative")):
        _same(outs[0][k].data, outs[1][k].data, what)
    assert outs[0][1].dtype == mdt and outs[0][0].dtype == mdn.float32

"""The NumPy pooling calls' seen-call cache (backend/pooling.py _CPU_SEEN): a repeated call skips the checks and the
geometry and gives bitwise what an uncached call gives; a call that differs in anything a check reads (shape, dtype,
strides/format, descriptor, blending, argmax) is validated and computed afresh; invalid calls still raise."""
import numpy as np
import pytest

from minidnn import backend as B
from minidnn.backend import pooling as P


def _fresh(fn, *args, **kwargs):
    P._CPU_SEEN.clear()
    return fn(*args, **kwargs)


@pytest.mark.parametrize("mode", list(B.PoolingMode))
def test_repeated_and_changed_calls_match_uncached(mode):
    rng = np.random.default_rng(0)
    x = np.round(rng.standard_normal((4, 3, 10, 10)) * 2).astype(np.float32)
    x.flat[::11] = np.nan
    calls = [
        (B.PoolingDescriptor(mode, 2), x, {}),
        (B.PoolingDescriptor(mode, 2), x[:, :, :9, :7], {}),                           # other shape and strides
        (B.PoolingDescriptor(mode, 3, 1, 2), x, {}),                                   # other descriptor
        (B.PoolingDescriptor(mode, 2), x.astype(np.float64), {}),                      # other dtype
        (B.PoolingDescriptor(mode, 2), np.ascontiguousarray(x.transpose(0, 2, 3, 1)), {"format": "NHWC"}),
        (B.PoolingDescriptor(mode, 2), x, {"alpha": 2.0}),
    ]
    for _ in range(2):
        for desc, xi, kw in calls:
            argmax = mode.is_max
            got = B.pooling_forward(None, desc, xi, return_argmax=argmax, **kw)
            ref = _fresh(B.pooling_forward, None, desc, xi, return_argmax=argmax, **kw)
            for g, r in zip(got if argmax else (got,), ref if argmax else (ref,)):
                assert g.tobytes() == r.tobytes() and g.shape == r.shape and g.dtype == r.dtype
            y = got[0] if argmax else got
            dy = rng.standard_normal(y.shape).astype(y.dtype)
            for arg in ((None, got[1]) if argmax else (None,)):
                dx = B.pooling_backward(None, desc, y, dy, xi, argmax=arg, **kw)
                dx_ref = _fresh(B.pooling_backward, None, desc, y, dy, xi, argmax=arg, **kw)
                assert dx.tobytes() == dx_ref.tobytes() and dx.shape == dx_ref.shape
    assert P._CPU_SEEN


def test_cache_hits_and_invalid_calls_still_raise():
    x = np.ones((2, 3, 8, 8), dtype=np.float32)
    desc = B.PoolingDescriptor("max", 2)
    P._CPU_SEEN.clear()
    y = B.pooling_forward(None, desc, x)
    assert len(P._CPU_SEEN) == 1
    B.pooling_forward(None, desc, x)
    assert len(P._CPU_SEEN) == 1                                   # the same call: a hit, nothing added
    with pytest.raises(B.BadParamError):
        B.pooling_forward(None, desc, x.astype(np.int32))           # integer x: checked, never remembered
    with pytest.raises(B.BadParamError):
        B.pooling_forward(None, desc, x, beta=1.0)                  # beta without y
    with pytest.raises(B.BadParamError):
        B.pooling_backward(None, desc, y, np.ones((2, 3, 3, 3), np.float32), x)    # dy of the wrong shape
    out = np.zeros_like(y)
    B.pooling_forward(None, desc, x, y=out)                         # an output array: not cached, written
    assert out.tobytes() == y.tobytes() and len(P._CPU_SEEN) == 1

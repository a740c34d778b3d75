"""The row kernels' chunked forward -- softmax / log-softmax rows and the cross-entropy rows of loss_kernels -- keeps
the NaN sum of a thread whose first chunks held only NaN (its running max stays -inf: vmax skips NaN).  The rescale was
`s = m == -inf ? 0 : ...`, which reset that NaN sum to 0: a bfloat16 (64, 65536) row whose first half is NaN came out
32768 of 65536 NaN (session 21, run 12).  It is now `s * 0` there (0 stays 0, NaN stays NaN).  cuda: such rows all
NaN through the row kernels (the clusters off), as the float64 reference; the rows without NaN as the reference."""
import numpy as np
import pytest

import minidnn.backend as B
from minidnn.backend.cuda import loss_kernels as _lk
from minidnn.backend.cuda import softmax_cluster as _sc
from minidnn.backend.cuda import softmax_kernels as _sk
from tests.backend.test_softmax_rows_cuda import _dtype, _reset_plans

TOL = {"float32": 2e-5, "bfloat16": 2e-2, "float16": 2e-3}


def _half_nan_rows(rows, c, seed, nan_to=None):
    """Row 1 NaN up to ``nan_to`` (default: half the row), row 2 one NaN, row 3 all -inf, the others finite."""
    x = np.random.default_rng(seed).standard_normal((rows, c)) * 3
    x[1, : c // 2 if nan_to is None else nan_to] = np.nan
    x[2, c // 3] = np.nan               # a single NaN
    x[3, :] = -np.inf
    return x


def _ref(x, algo):
    """float64 softmax / log-softmax of x's rows (NaN rows NaN; a row of -inf NaN, as 0/0)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        m = np.max(x, axis=-1, keepdims=True)
        e = np.exp(x - m)
        s = e.sum(axis=-1, keepdims=True)
        return (x - m - np.log(s)) if algo == "log" else e / s


@pytest.mark.cuda
@pytest.mark.parametrize("name, c", [("bfloat16", 65536), ("float16", 32768), ("float32", 65536),
                                     ("bfloat16", 49152)])
def test_row_kernels_keep_nan_rows(cp, monkeypatch, name, c):
    """The row kernels ("0": the clusters off), chunked rows: row 1's chunks all NaN but the last, which is whole
    (every thread's running max -inf and sum NaN until then, then finite values: the case the old `0` reset -- a
    thread whose chunks mix NaN and finite values keeps its NaN either way, REVIEW22), and a one-NaN row, all NaN; a
    row of -inf as the reference (NaN); the others within the dtype's rounding of the float64 reference."""
    monkeypatch.setattr(_sc, "CLUSTER", "0")
    cfg = _sk.row_config(c, _dtype(name).itemsize, 4, 1)
    chunk = cfg.g * cfg.nv * cfg.vec
    assert not cfg.one and not cfg.ragged and c % chunk == 0 and c // chunk >= 2   # whole chunks, the last finite
    x = _half_nan_rows(8, c, c, nan_to=c - chunk).astype(_dtype(name))
    xd = cp.asarray(x)
    _reset_plans()
    try:
        for algo in ("accurate", "log"):
            y = B.softmax_forward(None, algo, None, xd, axis=-1).get().astype(np.float64)
            ref = _ref(x.astype(np.float64), algo)
            for r in (1, 2, 3):
                assert np.isnan(y[r]).all() and np.isnan(ref[r]).all(), (algo, r, int(np.isnan(y[r]).sum()))
            keep = [0, 4, 5, 6, 7]
            np.testing.assert_allclose(y[keep], ref[keep], rtol=TOL[name], atol=TOL[name] * (8 if algo == "log"
                                                                                               else 1e-3))
    finally:
        _reset_plans()


@pytest.mark.cuda
def test_ce_rows_keep_nan_rows(cp):
    """Cross-entropy rows of 65536 float32 classes ('none'): the half-NaN row's loss and lse NaN; the other rows'
    against the float64 reference."""
    x = _half_nan_rows(8, 65536, 7).astype(np.float32)
    x[3] = np.random.default_rng(3).standard_normal(65536)        # the cross-entropy rows: no row of -inf here
    t = np.arange(8) * 4000 + 33000                                # the targets in the finite half (< 65536)
    _lk._plans.clear()
    _reset_plans()
    try:
        loss, lse = (a.get() for a in B.softmax_cross_entropy_forward(None, cp.asarray(x), cp.asarray(t), None,
                                                                      -100, 0.0, "none")[:2])
    finally:
        _lk._plans.clear()
        _reset_plans()
    assert np.isnan(loss[1]) and np.isnan(lse[1]) and np.isnan(loss[2]) and np.isnan(lse[2])
    x64 = x.astype(np.float64)
    m = x64.max(axis=1)
    ref_lse = m + np.log(np.exp(x64 - m[:, None]).sum(axis=1))
    keep = [0, 3, 4, 5, 6, 7]
    np.testing.assert_allclose(lse[keep], ref_lse[keep], rtol=1e-6)
    np.testing.assert_allclose(loss[keep], ref_lse[keep] - x64[keep, t[keep]], rtol=1e-5, atol=1e-5)

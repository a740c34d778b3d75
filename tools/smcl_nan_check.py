"""REVIEW21's check of the cluster softmax forward on NaN-only slices (session 21), and the spatial cross-entropy
past its grid: NaN counts of the row kernels ("0") against the clusters ("1") on (64, 65536) rows whose first 8192
classes are NaN (rank 0's whole slice), float32 and bfloat16, softmax and log-softmax (equal counts expected, the
whole rows); NVRTC's version (the 32-register fault's open question).

    PYTHONPATH=. python3 tools/smcl_nan_check.py
"""
import ml_dtypes
import numpy as np

import minidnn.backend as B
from minidnn.backend import devices as _dev
from minidnn.backend import softmax as smx
from minidnn.backend.cuda import softmax_cluster as SC
from minidnn.backend.cuda import softmax_kernels as SK


def nans(cp, y):
    if y.dtype.itemsize == 4:
        return int(cp.isnan(y).sum())
    return int(((y.view(cp.uint16) & 0x7fff) > 0x7f80).sum())


def main():
    cp = _dev.require_cupy()
    print("nvrtc", cp.cuda.nvrtc.getVersion())
    for dt in (np.float32, ml_dtypes.bfloat16):
        h = np.random.default_rng(0).standard_normal((64, 65536)).astype(np.float32)
        h[:, :8192] = np.nan
        x = cp.asarray(h.astype(dt))
        for a in ("accurate", "log"):
            r = {}
            for s in ("0", "1"):
                SC.CLUSTER = s
                SK._plans.clear()
                smx._SEEN.clear()
                r[s] = nans(cp, B.softmax_forward(None, a, None, x, axis=-1))
            print(np.dtype(dt).name, a, "NaN: row kernels", r["0"], "clusters", r["1"], "of", x.size,
                  "ok" if r["0"] == r["1"] == x.size else "DIFFER")
    rng = np.random.default_rng(1)
    xs = rng.standard_normal((4, 3, 200, 200)).astype(np.float32)
    t = rng.integers(0, 3, (4, 200, 200))
    t[0, 0, :50] = -100
    g = B.softmax_cross_entropy_forward(None, cp.asarray(xs), cp.asarray(t), None, -100, 0.1, "mean")
    r = B.softmax_cross_entropy_forward(None, xs.astype(np.float64), t, None, -100, 0.1, "mean")
    print("spatial 160000 positions: loss", float(g[0]), "ref", float(r[0]), "lse err",
          float(abs(g[1].get() - np.asarray(r[1])).max()))


if __name__ == "__main__":
    main()

"""Session 25: norm_gncl's partials exchanged by remote stores (4271afc) against the remote-load exchange it replaced
-- bitwise the same y, mean, rstd, dx and (N, 2C) sums over four shapes, every cluster size, affine or not -- and
each one's device time (default plan, float32; a rough mean over 50 eager calls, alternated once).

    git show 4674243:minidnn/backend/cuda/norm_gncl.py > OLD.py      # (here, before the device call)
    python tools/gncl_exchange_ab.py OLD.py

The old module's remote_ld (gone from bn_cluster's DSMEM_F32_HEADER since) is put back into its source here.
"""
import importlib.util
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import numpy as np  # noqa: E402

from minidnn.backend import devices as _dev  # noqa: E402,F401
from minidnn.backend.cuda import norm_gncl as NEW  # noqa: E402

spec = importlib.util.spec_from_file_location("minidnn.backend.cuda._gncl_old", sys.argv[1])
OLD = importlib.util.module_from_spec(spec)
spec.loader.exec_module(OLD)
REMOTE_LD = r"""
__device__ __forceinline__ float remote_ld(const float* local, unsigned int rank)
{
    unsigned long long g;
    unsigned int addr;
    float v;
    asm volatile("cvta.to.shared.u64 %0, %1;" : "=l"(g) : "l"(local));
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(addr) : "r"((unsigned int)g), "r"(rank));
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(addr));
    return v;
}
"""
if "float remote_ld(" not in OLD.SOURCE:
    OLD.SOURCE = OLD.SOURCE.replace("__device__ __forceinline__ void remote_st(", REMOTE_LD +
                                    "__device__ __forceinline__ void remote_st(", 1)
assert "remote_ld(part" in OLD.SOURCE and "remote_ld(" not in NEW.SOURCE.split("gn_fwdc(")[1]
import cupy as cp  # noqa: E402


def run(M, x, dy, scale, bias, groups, cl):
    n, c = x.shape[:2]
    fl = (scale is not None) | (bias is not None) << 1
    fwd = M.prepare_forward(x, groups, scale, bias, 1e-5, fl, force_cl=cl)
    bwd = M.prepare_backward(x, groups, scale, force_cl=cl)
    if fwd is None or bwd is None:
        return None
    y = cp.empty_like(x)
    m, i = cp.empty((n, groups), cp.float32), cp.empty((n, groups), cp.float32)
    sums, dx = cp.zeros((n, 2 * c), cp.float32), cp.empty_like(x)

    def f():
        fwd(x, x if scale is None else scale, x if bias is None else bias, y, m, i)

    def b():
        bwd(x, dy, m, i, x if scale is None else scale, sums, dx)
    f(), b()
    cp.cuda.Device().synchronize()
    return (y.copy(), m.copy(), i.copy(), sums.copy(), dx.copy()), f, b


def ms(fn, reps=50):
    fn()
    e0, e1 = cp.cuda.Event(), cp.cuda.Event()
    e0.record()
    for _ in range(reps):
        fn()
    e1.record()
    e1.synchronize()
    return cp.cuda.get_elapsed_time(e0, e1) / reps


rng = np.random.default_rng(0)
bad = 0
for shape, groups in (((32, 256, 56, 56), 32), ((64, 96, 48, 48), 8), ((16, 512, 28, 28), 32), ((3, 24, 40, 44), 2)):
    x = cp.asarray((rng.standard_normal(shape) * 1.5 - 2).astype(np.float32))
    dy = cp.asarray(rng.standard_normal(shape).astype(np.float32))
    c = shape[1]
    sc = cp.asarray(rng.standard_normal(c).astype(np.float32))
    bi = cp.asarray(rng.standard_normal(c).astype(np.float32))
    for cl in (None, 1, 2, 3, 4, 5, 6, 7, 8):
        for affine in (True, False):
            s, b = (sc, bi) if affine else (None, None)
            o, n = run(OLD, x, dy, s, b, groups, cl), run(NEW, x, dy, s, b, groups, cl)
            if o is None or n is None:
                assert o is None and n is None
                continue
            same = all(bool(cp.array_equal(p, q)) for p, q in zip(o[0], n[0]))
            bad += not same
            line = f"{shape} G={groups} cl={cl} affine={affine}: {'bitwise same' if same else 'DIFFERENT'}"
            if cl is None and affine:
                t = [ms(o[1]), ms(n[1]), ms(o[2]), ms(n[2])]
                line += (f"  fwd old {t[0]:.4f} new {t[1]:.4f} ms ({t[0] / t[1]:.3f}x)"
                         f"  bwd old {t[2]:.4f} new {t[3]:.4f} ms ({t[2] / t[3]:.3f}x)")
            print(line, flush=True)
print("ALL BITWISE SAME" if not bad else f"{bad} DIFFERENT")
sys.exit(1 if bad else 0)

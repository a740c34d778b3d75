"""The spatial cross-entropy's SPLIT builds (loss_kernels.SOURCE_SPATIAL's ce_sp_fwd / ce_sp_bwd with SPLIT = 2-8
threads a position, the planner's SP_SPLIT) run on the host: g++ compiles the kernel text with CUDA's names shimmed
(test_softmax_cols_s22's harness: a block's 256 threads as std::threads, __shared__ as function statics, blocks one
after another), plus what the forward's grid sum needs -- warp shuffles as the warp's 32 threads meeting at their
own barrier, the ticket's atomic -- so every barrier, slice bound, combine and walk of the SPLIT path runs here, with
the planned REDUCTION (the grid sum included), against the backend's float64 reference and the one-thread-a-position
build (SPLIT 1, the same SP_RT defines) run the same way.  Every __syncthreads also checks that all 256 threads
reached the same barrier (the same source line), and each block's threads their barrier and shuffle counts agree;
threads stuck at a barrier not all of them meet end the process after 30 s (a failed case, not a hung test).
exp / log are the host's: values within rounding of the GPU's, the paths the same."""
import re
import shutil
import subprocess

import numpy as np
import pytest

from minidnn.backend.cuda import loss_kernels as _lk
from tests import _nvcc
from tests.backend.test_ce_spatial import _reference
from tests.backend.test_softmax_cols_s22 import _HOST_PRE, _PTX_TO_C, host_build
from tests.backend.test_softmax_rows_cuda import _dtype

# the CUDA names SOURCE_SPATIAL uses beyond the column kernels' (_HOST_PRE)
_SP_PRE = r"""
#include <atomic>
#include <chrono>
#include <unistd.h>
static D3 blockDim = {256};
template <class V> static inline V __ldg(const V* p) { return *p; }
template <class V> static inline V __ldcg(const V* p) { return *p; }
struct float2 { float x, y; };
struct double2 { double x, y; };
static inline float2 make_float2(float a, float b) { return {a, b}; }
static inline double2 make_double2(double a, double b) { return {a, b}; }
#define __threadfence() std::atomic_thread_fence(std::memory_order_seq_cst)
static inline unsigned atomicAdd(unsigned* p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
// a barrier checked: every thread at the same one (its line), counted a thread
static int g_line[256], g_nsync[256], g_nshfl[256];
static std::atomic<int> g_bad{0};
static inline void host_sync(int line)
{
    const unsigned t = threadIdx.x;
    g_line[t] = line; ++g_nsync[t];
    g_bar->arrive_and_wait();
    if (t == 0)
        for (int u = 0; u < 256; ++u) if (g_line[u] != line) g_bad = line;
    g_bar->arrive_and_wait();
}
#undef __syncthreads
#define __syncthreads() host_sync(__LINE__)
// a warp's shuffle: its 32 threads meet (their own barrier), each reads its partner's value
static std::barrier<>* g_wbar[8];
static double g_shfl[256];
template <class V> static inline V __shfl_xor_sync(unsigned, V v, int o)
{
    const unsigned t = threadIdx.x, w = t >> 5;
    ++g_nshfl[t];
    g_shfl[t] = (double)v;
    g_wbar[w]->arrive_and_wait();
    const V u = (V)g_shfl[(t & ~31u) | ((t & 31u) ^ (unsigned)o)];
    g_wbar[w]->arrive_and_wait();
    return u;
}
template <class K> static void host_grid_sp(unsigned nb, K k)
{
    gridDim.x = nb;
    for (unsigned b = 0; b < nb; ++b) {
        std::barrier<> bar(256);
        g_bar = &bar;
        for (int w = 0; w < 8; ++w) g_wbar[w] = new std::barrier<>(32);
        memset(g_nsync, 0, sizeof g_nsync); memset(g_nshfl, 0, sizeof g_nshfl);
        std::vector<std::thread> th;
        for (unsigned t = 0; t < 256; ++t)
            th.emplace_back([&, b, t] {
                blockIdx.x = b; threadIdx.x = t; k();
                g_wbar[t >> 5]->arrive_and_drop(); g_bar->arrive_and_drop();
            });
        for (auto& t : th) t.join();
        for (int w = 0; w < 8; ++w) delete g_wbar[w];
        for (int t = 1; t < 256; ++t)
            if (g_nsync[t] != g_nsync[0] || g_nshfl[t] != g_nshfl[0]) {
                fprintf(stderr, "block %u: thread %d met %d barriers / %d shuffles, thread 0 %d / %d\n", b, t,
                        g_nsync[t], g_nshfl[t], g_nsync[0], g_nshfl[0]);
                exit(3);
            }
        if (g_bad) { fprintf(stderr, "block %u: threads at different barriers (line %d)\n", b, (int)g_bad); exit(3); }
    }
}
"""

_SP_PTX_TO_C = [
    ('asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));', "y = exp2f(x);"),
    ('asm volatile("atom.add.acq_rel.gpu.global.u32 %0, [%1], 1;" : "=r"(tk) : "l"(ticket) : "memory");',
     "tk = __atomic_fetch_add(ticket, 1u, __ATOMIC_ACQ_REL);"),
]

_HOST_RUN = r"""
// in: x, target, w (null: none), and backward's lse, g, denom; out: forward's loss_rows, lse, loss, denom, ticket,
// backward's dx.  The blocks' partials start as NaN: the last block must read only what the blocks wrote.
extern "C" __global__ void host_run(int backward, unsigned nb, char** in, char** out, long long rows, int C,
                                    int inner, long long ignore_index, double eps)
{
    const X* x = (const X*)in[0];
    const I* t = (const I*)in[1];
    const T* w = in[2] ? (const T*)in[2] : (const T*)in[0];
    if (!backward) {
        std::vector<A> partial(2 * nb, (A)__int_as_float(0x7fffffff));
        host_grid_sp(nb, [&] { ce_sp_fwd(x, t, w, (T*)out[0], (A*)out[1], partial.data(), (unsigned*)out[4],
                                         (T*)out[2], (A*)out[3], rows, C, inner, ignore_index, eps); });
    } else {
        host_grid_sp(nb, [&] { ce_sp_bwd(x, t, w, (const A*)in[3], (const T*)in[4], (const A*)in[5], (X*)out[0],
                                         rows, C, inner, ignore_index, eps); });
    }
}
"""


def _host_source(units):
    """SOURCE_SPATIAL's (defines) units with their host_run, and a main() that runs unit i's kernel on the buffers
    read from stdin (_host_call)."""
    text = _lk.SOURCE_SPATIAL
    for ptx, c in _SP_PTX_TO_C + _PTX_TO_C[:3]:     # ex2, the ticket, the 16-bit conversions
        assert ptx in text, ptx                    # the kernel's PTX changed: this emulation must follow it
        text = text.replace(ptx, c)
    for ptx, _ in _PTX_TO_C[3:]:
        assert ptx not in text, ptx
    assert re.search(r"\basm\b", text) is None, "a PTX line without its C here"
    body = _nvcc.combine([(text + _HOST_RUN, d) for d in units])
    table = ", ".join(f"nvccu{i}::nvccu{i}_host_run" for i in range(len(units)))
    main = r"""
typedef void (*Run)(int, unsigned, char**, char**, long long, int, int, long long, double);
static Run runs[] = {%s};
int main(int argc, char** argv)
{
    // threads stuck at a barrier not all of them meet: the case fails in 30 s instead of hanging
    std::thread([] {
        std::this_thread::sleep_for(std::chrono::seconds(30));
        fprintf(stderr, "still running after 30 s: threads stuck at a barrier or shuffle that not all of them meet\n");
        fflush(stderr);
        _exit(3);
    }).detach();
    // unit backward nblocks rows C inner ignore_index eps n_in in_bytes... n_out (out_bytes fill_byte)...
    int a = 1;
    const int unit = atoi(argv[a++]), backward = atoi(argv[a++]);
    const unsigned nb = (unsigned)atol(argv[a++]);
    const long long rows = atoll(argv[a++]);
    const int C = atoi(argv[a++]), inner = atoi(argv[a++]);
    const long long ign = atoll(argv[a++]);
    const double eps = atof(argv[a++]);
    std::vector<std::vector<char>> in(atoi(argv[a++]));
    std::vector<char*> pin;
    for (auto& v : in) {
        v.resize(atol(argv[a++]));
        if (fread(v.data(), 1, v.size(), stdin) != v.size()) return 2;
        pin.push_back(v.empty() ? nullptr : v.data());
    }
    std::vector<std::vector<char>> out(atoi(argv[a++]));
    std::vector<char*> pout;
    for (auto& v : out) {
        const long nbytes = atol(argv[a++]);
        v.assign(nbytes, (char)atoi(argv[a++]));
        pout.push_back(v.data());
    }
    runs[unit](backward, nb, pin.data(), pout.data(), rows, C, inner, ign, eps);
    for (auto& v : out) fwrite(v.data(), 1, v.size(), stdout);
    return 0;
}
""" % table
    return _HOST_PRE + _SP_PRE + body + main


def _raw(a):
    return a.view(np.uint16) if a.dtype.itemsize == 2 and a.dtype.kind != "i" else a


def _host_call(exe, unit, backward, nb, shape, eps, ins, outs):
    """Unit ``unit``'s forward / backward on a grid of ``nb`` blocks: ``ins`` arrays (None: an empty buffer), ``outs``
    (dtype, count) pairs -> the output arrays (each starts as 0xff bytes -- NaN -- but the uint32 ticket, 0)."""
    n, c = shape[:2]
    inner = int(np.prod(shape[2:]))
    args = [unit, int(backward), nb, n * inner, c, inner, -100, repr(float(eps)), len(ins)]
    data = b""
    for a in ins:
        b = b"" if a is None else np.ascontiguousarray(_raw(a)).tobytes()
        args.append(len(b))
        data += b
    args.append(len(outs))
    for dt, k in outs:                  # every output NaN (0xff bytes) until written; the ticket 0
        args += [np.dtype(dt).itemsize * k, 0 if np.dtype(dt) == np.uint32 else 255]
    r = subprocess.run([exe, *map(str, args)], input=data, capture_output=True, timeout=240)
    assert r.returncode == 0, r.stderr[:2000]
    res, at = [], 0
    for dt, k in outs:
        dt = np.dtype(dt)
        nbytes = dt.itemsize * k
        raw = np.uint16 if dt.itemsize == 2 else dt
        res.append(np.frombuffer(r.stdout[at:at + nbytes], dtype=raw).view(dt))
        at += nbytes
    assert at == len(r.stdout)
    return res


# (dtype name, widen, (N, C, H, W), weighted, eps, ignored share, reduction, index dtype, SPLIT, SP_SPLIT_MIN,
#  grids (blocks) for the split run, special values?)
# The grids: a block's step covers 256 / SPLIT positions; 1 block walks every position (steps crossing images, the
# last step's threads partly idle), the larger grids leave whole blocks past the last position (they meet the
# barriers of no step, then the grid sum).  SP_SPLIT_MIN lowered to 16 gives 171 classes SPLIT 8 (slices of 21-22:
# one batch of 16 and a masked one); 600 classes take 8 as planned.
CASES = [
    ("float32", False, (3, 64, 7, 9), True, 0.1, 0.2, "mean", np.int64, 2, None, (1, 3), False),
    ("float32", False, (2, 150, 9, 7), False, 0.0, 0.2, "none", np.int64, 4, None, (1, 2), True),
    ("float32", False, (2, 171, 5, 9), True, 0.2, 0.1, "sum", np.int32, 8, 16, (2, 4), False),
    ("float32", False, (3, 150, 4, 6), True, 0.1, 0.1, "none", np.int64, 4, None, (2,), True),
    ("float32", False, (2, 171, 4, 9), True, 0.0, 0.3, "none", np.int32, 8, 16, (1,), True),
    ("float32", False, (1, 600, 3, 5), False, 0.05, 0.0, "mean", np.int64, 8, None, (1,), False),
    ("bfloat16", False, (2, 150, 9, 7), True, 0.1, 0.2, "mean", np.int64, 4, None, (2,), False),
    ("bfloat16", False, (3, 171, 4, 6), False, 0.0, 0.1, "none", np.int64, 4, None, (1,), True),
    ("float16", False, (3, 64, 7, 9), False, 0.05, 0.1, "none", np.int64, 2, None, (1,), True),
    ("bfloat16", True, (2, 171, 5, 9), True, 0.1, 0.1, "none", np.int64, 4, None, (2,), True),
    ("float16", True, (3, 64, 7, 9), True, 0.0, 0.2, "mean", np.int32, 2, None, (3,), False),
]
TOL = {"float32": 4e-6, "bfloat16": 2e-2, "float16": 4e-3}


def _specs(case, split):
    """The planned (forward, backward) defines of a case, SP_SPLIT on or off."""
    name, widen, shape, weighted, eps, _, reduction, index, want, smin, _, _ = case
    saved = _lk.SP_SPLIT, _lk.SP_SPLIT_MIN
    try:
        _lk.SP_SPLIT, _lk.SP_SPLIT_MIN = split, smin or saved[1]
        out = tuple(_lk.launch_spec(k, shape, _dtype(name), index, weighted, reduction, eps, widen)[2]
                    for k in ("ce_fwd", "ce_bwd"))
    finally:
        _lk.SP_SPLIT, _lk.SP_SPLIT_MIN = saved
    for d in out:
        d = dict(x.split("=", 1) for x in d)
        assert d.get("SPLIT") == (str(want) if split else None) and d["SP_RT"] == "1" and "PAIR" not in d, (case, d)
    return out


def _slices(c, split):
    return [(c * s // split, c * (s + 1) // split) for s in range(split)]


def _specials(x3, t2, split, bad):
    """Special values at positions 0-11 of (N, C, inner) x3 (targets t2, (N, inner)), placed in SPLIT's slices;
    ``bad``: two class indices out of range.  -> the positions whose target is out of range."""
    c, inner = x3.shape[1], x3.shape[2]
    (a0, a1), (b0, b1) = _slices(c, split)[:2]
    col = [x3[r // inner, :, r % inner] for r in range(12)]       # position r's classes (views)
    for r in range(12):
        t2[r // inner, r % inner] = r * 37 % c                      # valid targets (not ignored)
    col[0][:] = -np.inf                                           # every class -inf: lse -inf
    col[1][c - 2] = np.nan                                        # NaN in the last slice
    col[2][1] = np.inf                                            # +inf in slice 0
    col[3][[2, c - 1]] = np.inf                                   # +inf in the first and last slices: NaN
    col[4][b0:b1] = np.nan                                        # slice 1 NaN only: its max -inf, its sum NaN
    col[5][:] = -np.inf                                           # all -inf but one class of the last slice
    col[5][c - 3] = 0
    col[6][5] = -np.inf                                           # -inf at the target: loss +inf
    t2[6 // inner, 6 % inner] = 5
    col[7][:] = -np.inf                                           # NaN and -inf only, the NaN in slice 0
    col[7][a0:a1:3] = np.nan
    col[8][a0:a1] = -np.inf                                       # slice 0 all -inf, finite after
    col[11][c // 2] = np.nan                                      # ignored: loss 0, dx NaN (lse NaN)
    t2[11 // inner, 11 % inner] = -100
    if not bad:
        return []
    t2[9 // inner, 9 % inner] = c                                 # out of range: NaN loss, dx, denominator
    t2[10 // inner, 10 % inner] = -5
    return [9, 10]


def _same(a, b):
    """The same values to the bit (NaN payloads aside)."""
    a, b = np.asarray(a), np.asarray(b)
    nan = np.isnan(a.astype(np.float64))
    return (a.dtype == b.dtype and np.array_equal(nan, np.isnan(b.astype(np.float64)))
            and np.array_equal(_raw(a)[~nan].view(f"u{a.dtype.itemsize}"), _raw(b)[~nan].view(f"u{a.dtype.itemsize}")))


def _close(got, ref, tol, scale, what):
    g, r = np.asarray(got, np.float64).ravel(), np.asarray(ref, np.float64).ravel()
    assert np.array_equal(np.isnan(g), np.isnan(r)), (what, np.flatnonzero(np.isnan(g) != np.isnan(r))[:10])
    inf = np.isinf(r)
    assert np.array_equal(g[inf], r[inf]) and not np.isinf(g[~inf]).any(), what
    fin = np.isfinite(r)
    err = np.abs(g[fin] - r[fin]).max(initial=0)
    assert err <= tol * scale, (what, err, tol * scale)


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
def test_ce_split_kernels_on_the_host(tmp_path):
    """SPLIT 2 / 4 / 8 (64, 150, 171, 600 classes; slices of unequal size where SPLIT does not divide C), odd and
    even inner, grids whose walk crosses images and leaves idle threads in its last step or whole blocks past the
    last position; weights, smoothing, ignored positions, int32 / int64 targets; 'none' / 'mean' / 'sum' (the grid
    sum, its ticket back to 0); special values in one slice or across slices (NaN, +inf, all -inf, a NaN-only slice,
    an -inf target) and class indices out of range: lse, loss, denom and dx against the float64 reference (NaN / inf
    where it has them), the forward within rounding of the one-thread-a-position build, the backward bitwise that
    build's on the same lse; widened 16-bit logits bitwise the float32 build on x.astype(float32)."""
    units, where, plan = [], {}, {}

    def unit(defines):
        if defines not in where:
            where[defines] = len(units)
            units.append(defines)
        return where[defines]
    for case in CASES:
        split, one = _specs(case, True), _specs(case, False)
        plan[case] = [unit(d) for d in split + one]
        if case[1]:                                 # widened: the float32 builds of the same plan
            plan[case] += [unit(tuple(x for x in d if not x.startswith("XSTORAGE="))) for d in split]
    exe = host_build(tmp_path, "ce_split_host", _host_source(units))

    for case in CASES:
        name, widen, shape, weighted, eps, ignore, reduction, index, split, _, grids, special = case
        uf, ub, uf1, ub1 = plan[case][:4]
        dt = _dtype(name)
        n, c = shape[:2]
        inner = int(np.prod(shape[2:]))
        rows = n * inner
        rng = np.random.default_rng(c * 31 + rows)
        x = (rng.standard_normal(shape) * 3).astype(np.float32)
        t = rng.integers(0, c, (n,) + shape[2:]).astype(index)
        t[rng.random(t.shape) < ignore] = -100
        bad = []
        if special:
            bad = _specials(x.reshape(n, c, inner), t.reshape(n, inner), split, reduction == "none")
        x = x.astype(dt)
        pdt = np.dtype(np.float32) if widen else dt          # the weights', loss's and dloss's dtype (T)
        w = (rng.random(c) + 0.1).astype(np.float32).astype(pdt) if weighted else None
        acc = np.float32
        g = (rng.standard_normal(t.shape) if reduction == "none" else np.float64(0.75)).astype(np.float32)
        g = np.asarray(g).astype(pdt)
        what = f"{case}"

        def fwd(u, nb, xx=x):
            loss_rows, lse, loss, den, ticket = _host_call(
                exe, u, False, nb, shape, eps, [xx, t, w],
                [(pdt, rows), (acc, rows), (pdt, 1), (acc, 1), (np.uint32, 1)])
            assert ticket[0] == 0, what                  # the last block reset the ticket
            return (loss_rows if reduction == "none" else loss), lse, den

        def bwd(u, nb, lse, den, xx=x):
            return _host_call(exe, u, True, nb, shape, eps, [xx, t, w, lse, g, den], [(xx.dtype, x.size)])[0]

        # the float64 reference (a class index out of range: ignored there, NaN here -- its loss, its dx)
        t_ok = t.copy()
        t_ok.reshape(-1)[bad] = -100
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            loss_r, lse_r, den_r, dx_r = _reference(x.astype(np.float32), t_ok, None if w is None else
                                                    w.astype(np.float32), eps, reduction, np.asarray(g, np.float64))
        loss_r, lse_r = np.array(loss_r, np.float64).reshape(-1), np.asarray(lse_r, np.float64).reshape(-1)
        dx_r = np.array(dx_r, np.float64).reshape(n, c, inner)
        den_r = np.float64(den_r)
        # an ignored position's dx: the reference's exp(x - lse) * 0 -- 0, NaN where its lse is NaN or -inf
        # (loss_kernels' IGNORED_DX, as PyTorch's)
        if bad:                                         # its weight NaN: the denominator too
            loss_r[bad] = den_r = np.nan
            for r_ in bad:
                dx_r[r_ // inner, :, r_ % inner] = np.nan
        tol = TOL[name]
        fin = np.isfinite(x.astype(np.float64))
        mag = np.abs(x.astype(np.float64)[fin]).max() + 1
        one = fwd(uf1, -(-rows // 256))                      # one thread a position
        for nb in dict.fromkeys(grids + (-(-rows * split // 256),)):     # (and the planned grid)
            loss, lse, den = fwd(uf, nb)
            wn = f"{what} grid {nb}"
            _close(lse, lse_r, 4e-6 if name == "float32" or widen else 1e-5, mag, wn + " lse")
            _close(den, [den_r], 4e-6, np.nan_to_num(abs(den_r)) + 1, wn + " denom")
            lscale = (np.abs(loss_r[np.isfinite(loss_r)]).max(initial=0) + 1) * (rows if reduction == "sum" else 1)
            lref = loss_r if reduction == "none" else loss_r[:1]
            if not widen:                               # the loss is stored in T: the reference rounded to it
                with np.errstate(over="ignore", invalid="ignore"):
                    lref = lref.astype(dt).astype(np.float64)
            _close(loss, lref, max(tol, 4e-6), lscale, wn + " loss")
            # one thread a position: other batch boundaries, the same special positions
            _close(lse, one[1], 4e-6 if name == "float32" or widen else 1e-5, mag, wn + " lse vs one a thread")
            _close(loss, one[0], max(tol, 4e-6), lscale, wn + " loss vs one a thread")
            dx = bwd(ub, nb, lse, den)
            dx1 = bwd(ub1, -(-rows // 256), lse, den)
            assert _same(dx, dx1), wn + " dx: SPLIT against one a thread, bitwise"
            gmax = float(np.abs(np.asarray(g, np.float64)).max()) * (1 if reduction != "mean" else 1 / den_r)
            _close(dx, dx_r.reshape(shape), max(tol, 4e-6), gmax * (max(w.astype(np.float64)) if weighted else 1)
                   + np.abs(dx_r[np.isfinite(dx_r)]).max(initial=0), wn + " dx")
            ign = (t.reshape(n, inner) == -100)
            dxi = dx.astype(np.float64).reshape(n, c, inner).transpose(0, 2, 1)[ign]
            want = np.where(np.isfinite(np.asarray(lse, np.float64).reshape(n, inner)[ign]), 0.0, np.nan)[:, None]
            assert np.array_equal(dxi, np.broadcast_to(want, dxi.shape), equal_nan=True), wn + " ignored dx"
            if widen:                                    # bitwise the float32 build on the cast
                uf32, ub32 = plan[case][4:]
                x32 = x.astype(np.float32)
                loss32, lse32, den32 = fwd(uf32, nb, x32)
                assert _same(loss, loss32) and _same(lse, lse32) and _same(den, den32), wn
                dx32 = bwd(ub32, nb, lse32, den32, x32)
                assert _same(dx, dx32.astype(dt)), wn + " widened dx"

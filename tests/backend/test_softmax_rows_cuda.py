"""The register-resident softmax / log-softmax / cross-entropy kernels (softmax_kernels SOURCE, loss_kernels
SOURCE_ROWS) against float64 references over ragged row lengths, float64/32/16 and bfloat16, forward and backward.

CPU part: row_config's tiling covers every element of a row exactly once and stays inside its register budget.
GPU part (cuda-marked, skips without a GPU): one launch per call, values against the float64 formulas computed on the
host from the same (rounded) inputs; the backward is checked from the GPU's own forward output, so each direction's
error is its own.  Lengths 1..31 (sub-warp groups), 32/33 (a warp, a ragged tail), 1000/1025 (the warp path's edge),
4097 (a block per row, scalar loads), 32768/40000 (chunked rows: online max/sum and a second read).
"""
import os
import re
import shutil

import numpy as np
import pytest

import minidnn.backend as B
from minidnn.backend import devices as _dev
from minidnn.backend._testing import to_numpy
from minidnn.backend.cuda import softmax_kernels as _sk
from tests import _nvcc
from tests.backend._row_kernels import _row_kernels_only  # noqa: F401  (autouse: the row kernels, not clusters)

LENGTHS = [1, 7, 31, 32, 33, 1000, 1025, 4097, 32768, 40000]


# ---- CPU: the tiling ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("item, acc", [(4, 4), (2, 4), (8, 8)])
@pytest.mark.parametrize("arrays, pair", [(1, False), (2, False), (2, True)])
def test_row_config_covers_each_element_once(item, acc, arrays, pair):
    """The kernels' element map (row_geo, load_chunk, load_edges) emulated: every element of a row once, for every
    head a RAGGED row can have (rows start at r * C elements: each row its own distance to a 16-byte boundary)."""
    for c in LENGTHS + [2, 3, 10, 64, 255, 257, 512, 513, 1024, 2000, 2048, 8192, 16384, 16385, 65536, 100003]:
        g, nv, vec, block, ragged, one, sch = _sk.row_config(c, item, acc, arrays, _sk.STASH_BYTES, pair)
        assert g & (g - 1) == 0 and nv & (nv - 1) == 0 and block % 32 == 0 and block % g == 0
        assert (g <= 32 and block == 256) or (g == block and 64 <= block <= 512), (c, g, block)
        assert vec * item <= 16 and (ragged or c % vec == 0) and (not ragged or g >= 2)
        cap = (32 if acc == 4 else 16) // (arrays if g > 32 or not pair else 1)
        assert nv * vec <= max(cap, vec), (c, nv, vec)
        chunk = g * nv                                     # body vectors a chunk
        assert one == (c // vec <= chunk) and (one or arrays == 2 or sch >= 1 or nv * vec * block * acc > 65536)
        for h in (range(vec) if ragged else [0]):
            h = min(h, c)
            nb = (c - h) // vec
            tl = c - h - nb * vec
            assert 0 <= tl < vec and (one or -(-nb // chunk) >= 2)
            seen = np.zeros(c, np.int64)
            for ch in range(-(-nb // chunk)):
                k, t, j = np.meshgrid(np.arange(nv), np.arange(g), np.arange(vec), indexing="ij")
                v = ch * chunk + k * g + t
                idx = (h + v * vec + j)[v < nb]
                np.add.at(seen, idx, 1)
            seen[:h] += 1                                   # thread 0's head
            seen[h + nb * vec:] += 1                        # thread G - 1's tail
            assert (seen == 1).all(), (c, h)


@pytest.mark.parametrize("item", [4, 2])
def test_cross_entropy_target_slot(item):
    """ce_rows_fwd finds x[t] at (chunk tch, thread tv % G, slot ts) of its body; emulated for every class of the
    body, every head: that slot of load_chunk's map holds element t (edges are matched element by element)."""
    for c in (7, 33, 1000, 1025, 4097, 32768, 40000):
        g_, nv, vec, block, ragged, one, sch = _sk.row_config(c, item, 4)
        cv = g_ * nv
        for h in (range(vec) if ragged else [0]):
            h = min(h, c)
            nb = (c - h) // vec
            t = np.arange(h, h + nb * vec)
            tb = t - h
            tv = tb // vec
            owner, tch, ts = tv % g_, tv // cv, (tv % cv) // g_ * vec + tb % vec
            k, j = ts // vec, ts % vec                          # load_chunk: slot k * VEC + j of vector v
            v = tch * cv + k * g_ + owner
            assert (h + v * vec + j == t).all() and (v < nb).all() and (ts < nv * vec).all(), (c, h)


def test_row_config_keeps_1000_classes_in_one_warp_pass():
    assert _sk.row_config(1000, 4, 4)[:4] == (32, 8, 4, 256)       # float32: 8 float4 per lane
    assert _sk.row_config(1000, 2, 4)[:4] == (32, 4, 8, 256)       # bfloat16 / float16: 4 x 8 halves per lane
    assert _sk.row_config(10, 4, 4)[:4] == (8, 1, 2, 256)          # (128, 10) logits: 8 lanes a row, 32 rows a block
    assert _sk.row_config(4097, 4, 4)[:5] == (256, 4, 4, 256, True)   # ragged: float4 body, scalar head / tail
    cfg = _sk.row_config(32768, 4, 4, 1, _sk.STASH_BYTES)           # two chunks: the first in shared memory
    assert (cfg.one, cfg.sch) == (False, 1)


def test_backward_tiling_rule_and_cross_entropy_grid(monkeypatch):
    """The backward's warp path holds 32 + 32 elements for log-softmax and 2-byte data (one 1000-class row a warp),
    16 + 16 for float32 softmax (a 64-thread block); MINIDNN_SOFTMAX_BWD_WARP forces one.  The cross-entropy
    forward's grid: no more blocks than fit at once (MINB an SM), so the per-block ticket runs ~4 times an SM."""
    from minidnn.backend.cuda import loss_kernels as _lk
    monkeypatch.setattr(_sk, "_BWD_WARP_ENV", "")

    def tiling(algo, dtype):
        d = dict(x.split("=") for x in _sk.launch_spec(True, (64, 1000), (1,), algo, _dtype(dtype)).defines)
        return int(d["G"]), int(d["BLOCK"]), int(d["MINB"])
    assert tiling("ACCURATE", "float32") == (64, 64, 12)
    assert tiling("LOG", "float32") == (32, 256, 65536 // (256 * _sk.BWD_PAIR_REGS))
    assert tiling("ACCURATE", "bfloat16")[:2] == tiling("LOG", "bfloat16")[:2] == (32, 256)
    monkeypatch.setattr(_sk, "_BWD_WARP_ENV", "0")
    assert tiling("LOG", "float32")[:2] == (64, 64)
    monkeypatch.setattr(_sk, "_BWD_WARP_ENV", "1")
    assert tiling("ACCURATE", "float32")[:2] == (32, 256)
    monkeypatch.setattr(_sk, "FWD_PIPE", False)
    spec = _lk.launch_spec("ce_fwd", (16384, 1000), np.float32, np.int64, False, "mean")
    assert spec[4] == int(dict(x.split("=") for x in spec[2])["MINB"]) == 4
    assert _lk.launch_spec("ce_bwd", (16384, 1000), np.float32, np.int64, False, "mean")[4] == 16


def _defs(spec_defines):
    return {k: int(v) for k, v in (x.split("=") for x in spec_defines) if v.lstrip("-").isdigit()}


@pytest.mark.parametrize("pipe", [True, False])
def test_pipe_rule_and_grid(monkeypatch, pipe):
    """Session 7's PIPE kernels: the one-array forwards (softmax, cross-entropy) of one-chunk warp rows with vector
    loads, on a persistent grid of exactly the resident blocks (MINB an SM, from the register budget: 96 for a
    1000-class row, two 256-thread blocks); backward, float64, scalar-load and block rows keep the old kernels, and
    so does everything with FWD_PIPE off (MINIDNN_SOFTMAX_PIPE=0: a grid of up to 16 blocks an SM)."""
    from minidnn.backend.cuda import loss_kernels as _lk
    monkeypatch.setattr(_sk, "FWD_PIPE", pipe)
    monkeypatch.setattr(_sk, "PIPE_REGS", 96)
    monkeypatch.setattr(_sk, "BWD_PIPE", False)         # the log-softmax backward's own rule: the next test
    monkeypatch.setattr(_sk, "FWD_WARP", "0")           # PIPE's rule (WARP's own: test_softmax_warp.py)
    for dtype, c, minb in (("float32", 1000, 2), ("bfloat16", 1000, 2), ("float32", 10, 4), ("bfloat16", 1001, 2),
                           ("float32", 512, 4), ("float32", 513, 2)):
        for algo in ("FAST", "ACCURATE", "LOG"):
            s = _sk.launch_spec(False, (16384, c), (1,), algo, _dtype(dtype))
            d = _defs(s.defines)
            assert d["PIPE"] == int(pipe) and d["G"] <= 32 and d["ONE"] == 1, (dtype, c, d)
            assert d["MINB"] == (minb if pipe else 4) and s.per_sm == (minb if pipe else 16), (dtype, c, d)
            assert _defs(_sk.launch_spec(True, (16384, c), (1,), algo, _dtype(dtype)).defines)["PIPE"] == 0
        src, _, defines, _, per_sm, _ = _lk.launch_spec("ce_fwd", (16384, c), _dtype(dtype), np.int64, True, "mean",
                                                        0.1)
        assert _defs(defines)["PIPE"] == int(pipe) and per_sm == _defs(defines)["MINB"]
        assert _defs(_lk.launch_spec("ce_bwd", (16384, c), _dtype(dtype), np.int64, True, "mean")[2])["PIPE"] == 0
    for dtype, c in (("float64", 1000), ("float32", 33), ("float32", 4097), ("float32", 32768)):
        assert _defs(_sk.launch_spec(False, (64, c), (1,), "LOG", _dtype(dtype)).defines)["PIPE"] == 0


@pytest.mark.parametrize("bwd_pipe", [True, False])
def test_bwd_pipe_rule_and_grid(monkeypatch, bwd_pipe):
    """Session 9: the log-softmax backward of one-chunk warp rows with vector loads (float32/16-bit) takes
    bwd_rows_pipe on a persistent grid of exactly the resident blocks (two 256-thread blocks an SM at 1000 classes:
    128 registers; three below 16 elements a lane: 80); softmax's backward, float64, scalar-load and block rows keep
    bwd_rows, and so does everything with BWD_PIPE off (MINIDNN_SOFTMAX_BWD_PIPE=0: up to 16 blocks an SM)."""
    monkeypatch.setattr(_sk, "BWD_PIPE", bwd_pipe)
    monkeypatch.setattr(_sk, "_BWD_WARP_ENV", "")
    monkeypatch.setattr(_sk, "BWD_PIPE_REGS", 128)
    monkeypatch.setattr(_sk, "FWD_WARP", "0")           # bwd_rows_pipe's rule (WARP's own: test_softmax_warp.py)
    for dtype, c, minb in (("float32", 1000, 2), ("bfloat16", 1000, 2), ("float16", 1001, 2), ("float32", 10, 3),
                           ("float32", 513, 3), ("bfloat16", 1024, 2)):
        s = _sk.launch_spec(True, (16384, c), (1,), "LOG", _dtype(dtype))
        d = _defs(s.defines)
        assert d["PIPE"] == int(bwd_pipe) and d["G"] <= 32 and d["ONE"] == 1, (dtype, c, d)
        if bwd_pipe:
            assert d["MINB"] == minb and s.per_sm == minb, (dtype, c, d)
        else:
            assert s.per_sm == 16, (dtype, c, d)
        if c == 1000 and dtype == "float32":       # softmax's backward: a 64-thread block a row, never piped
            assert _defs(_sk.launch_spec(True, (16384, c), (1,), "ACCURATE", _dtype(dtype)).defines)["PIPE"] == 0
    for dtype, c in (("float64", 1000), ("float32", 33), ("float32", 4097), ("float32", 32768)):
        assert _defs(_sk.launch_spec(True, (64, c), (1,), "LOG", _dtype(dtype)).defines)["PIPE"] == 0


@pytest.mark.parametrize("rows, rpb, grid", [(16384, 8, 264), (6000, 8, 264), (37, 8, 5), (20000, 32, 528),
                                             (130, 32, 4), (1, 8, 1), (2113, 8, 264)])
def test_pipe_walk_covers_each_row_once(rows, rpb, grid):
    """fwd_rows_pipe / ce_fwd_pipe's walk emulated: group k of block b issues row r = b * RPB + k, then per step
    issues r + gridDim * RPB (when the block's next step starts below rows) before it processes the row it issued
    last; every row is processed once, by the group that issued its loads, and only live rows are stored."""
    seen = np.zeros(rows, np.int64)
    stride = grid * rpb
    for b in range(grid):
        r0 = b * rpb
        if r0 >= rows:
            continue
        for k in range(rpb):
            r = r0 + k
            issued = r if r < rows else None          # a dead group issues row 0's geometry (q.nb = 0: no loads)
            b0 = r0
            while b0 < rows:
                rn = r + stride
                nxt = (rn if rn < rows else None) if b0 + stride < rows else "none"
                assert issued == (r if r < rows else None)      # the row processed is the one whose loads are held
                if r < rows:
                    seen[r] += 1
                issued, r, b0 = nxt, rn, b0 + stride
    assert (seen == 1).all()


# ---- CPU: every configuration the planners can produce compiles (nvcc, where installed) --------------------------

ROW_SHAPES = [(3, 1), (128, 10), (4, 33), (8, 1000), (8, 1025), (8, 4097), (8, 32768), (8, 50257)]
COL_SHAPES = [(4, 21, 9, 7), (3, 1000, 2)]           # CREG = 32, the three-pass loop


def _dtype(name):
    if name == "bfloat16":
        return np.dtype(pytest.importorskip("ml_dtypes").bfloat16)
    return np.dtype(name)


def _planned_sources(full=False):
    """(file name, source, defines, kernel) of the softmax / cross-entropy launches the planners choose: float32 and
    bfloat16 over ROW_SHAPES and COL_SHAPES, float64 on three (``full``: every shape and algorithm)."""
    from minidnn.backend.cuda import loss_kernels as _lk
    out = {}
    for name in ("float32", "bfloat16", "float64"):
        dtype = _dtype(name)
        shapes = ROW_SHAPES + COL_SHAPES
        if name == "float64" and not full:
            shapes = [(4, 33), (8, 4097), (8, 32768)]
        for shape in shapes:
            for backward in (False, True):
                for algo in ("FAST", "ACCURATE", "LOG"):
                    if algo == "FAST" and not full and (backward or name != "float32" or shape != (128, 10)):
                        continue
                    s = _sk.launch_spec(backward, shape, (1,), algo, dtype)
                    out[(s.source, s.name, s.defines)] = (_sk._SOURCES[s.source], s.name)
            if len(shape) == 2:
                for kname in ("ce_fwd", "ce_bwd"):
                    for w, red, eps in ((False, "mean", 0.0), (True, "none", 0.1)):
                        src, k, defines, *_ = _lk.launch_spec(kname, shape, dtype, np.int64, w, red, eps)
                        out[(src, k, defines)] = (_lk._SOURCES[src], k)
    return [(f"k{i}.cu", text, key[2], kname) for i, (key, (text, kname)) in enumerate(out.items())]


def _planned_compiles(full=False):
    """[(source, defines, kernels read)]: one compile per (source, defines), since a forward and its backward (or
    cross-entropy's two) often share one and cicc / ptxas build the whole module either way."""
    groups = {}
    for _, text, defines, kname in _planned_sources(full):
        groups.setdefault((text, defines), []).append(kname)
    return [(text, defines, tuple(knames)) for (text, defines), knames in groups.items()]


# Collected at import so that xdist spreads the compiles (one test held them all: ~160 s on one worker).  The
# planners are pure host code; ml_dtypes (bfloat16) is a test dependency.
PLANNED = _planned_compiles(os.environ.get("MINIDNN_NVCC_FULL") == "1")


def test_planned_configurations_are_many():
    """The planners still produce the spread of configurations the compile check below is meant to cover, and the
    grouping by (source, defines) dropped no kernel."""
    jobs = _planned_sources(os.environ.get("MINIDNN_NVCC_FULL") == "1")
    assert len(jobs) > 50
    assert sorted((d, k) for _, _, d, k in jobs) == sorted((d, k) for _, d, ks in PLANNED for k in ks)
    assert len({(t, d) for t, d, _ in PLANNED}) == len(PLANNED)


def _headline(defines):
    d = dict(x.split("=", 1) for x in defines)
    return d.get("ACCUM") == "float" and d.get("RAGGED", "0") == "0" and d.get("ONE") == "1" \
        and d.get("SMOOTH", "0") == "0"


# Built by default (tests/_nvcc.cover; all 153 under MINIDNN_NVCC_ALL=1): every headline build (float32 / bfloat16
# storage, float accumulation, one chunk a row, no ragged rows or smoothing: the strict no-spill ones) and then
# builds until every value each define takes for each kernel, and every pair of values two defines take together, is
# built at least once -- 101 of the 153 (61 for single values before session 19's pairs).  Eight a test
# and an nvcc run: the fixed cost of a run (cuda_runtime.h, preprocessed and parsed) is most of a softmax compile,
# and tests/_nvcc.build gives each unit the ptxas lines of its own build.
PLANNED_BUILT = _nvcc.cover(PLANNED, lambda p: _nvcc.define_features(p[2], p[1]), lambda p: _headline(p[1]))
PLANNED_BATCHES = [PLANNED_BUILT[i:i + 8] for i in range(0, len(PLANNED_BUILT), 8)]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("batch", PLANNED_BATCHES,
                         ids=[f"{8 * i:03d}-{8 * i + len(b) - 1:03d}" for i, b in enumerate(PLANNED_BATCHES)])
def test_planned_configurations_compile(batch):
    """Each (source, defines) the planners can request compiles as NVRTC will get it (the column kernels once
    failed: their source needed the row tiling's defines); the headline shapes' kernels do not spill.  ptxas builds
    only the kernels read (--entry: registers and spills are per entry, the same as in the whole module's build; an
    entry missing from the module fails the build)."""
    built = _nvcc.build([(text, defines) for text, defines, _ in batch], entries=[k for _, _, k in batch])
    for (text, defines, knames), r in zip(batch, built):
        assert r.returncode == 0, (defines, r.stderr[:1500])
        headline = _headline(defines)
        for kname in knames:
            m = re.search(r"Compiling entry function '%s'.*?(\d+) bytes spill stores" % kname, r.stderr, re.S)
            assert m is not None, (kname, defines, r.stderr[-800:])
            assert int(m.group(1)) <= (0 if headline else 256), (kname, defines, int(m.group(1)))


# ---- GPU ------------------------------------------------------------------------------------------------------------

@pytest.fixture
def cp():
    if not _dev.cuda_is_available():
        pytest.skip("no CUDA GPU with CuPy on this machine")
    return _dev.require_cupy()


RTOL = {"float64": 1e-10, "float32": 3e-5, "float16": 2e-3, "bfloat16": 1.6e-2}
# The spacing of the dtype's subnormals: a stored result below the smallest normal is rounded to it, whatever the
# arithmetic (float16: 2^-24 ~ 6e-8 -- a 50257-class softmax backward is ~1e-5 an element, and one such element
# was 2.5e-8 off in session 20's run 4; the others' subnormals are far below any bound here)
SUBNORMAL = {"float64": 0.0, "float32": 0.0, "float16": 2.0 ** -24, "bfloat16": 0.0}


def _host(a):
    return np.asarray(to_numpy(a)).astype(np.float64)


def _close(got, ref, name, what, scale=1.0, mag=None):
    """|got - ref| <= tol * (|ref| + 1e-2 * the row's largest finite |ref| + mag) elementwise, NaN only where the
    reference is NaN.  ``mag``: the size of the terms whose sum is ref (a backward's cancellation: dx ~ 0 from
    terms of size |dy|), else 0.  The row scale ignores NaN / inf rows (a NaN row once made every bound NaN)."""
    got = _host(got)
    ref = np.asarray(ref, np.float64)
    tol = RTOL[name] * scale
    err = np.abs(got - ref)
    fin = np.where(np.isfinite(ref), np.abs(ref), 0.0)
    row = fin.max(axis=-1, keepdims=True, initial=0.0) if ref.ndim else fin
    bound = tol * (np.abs(ref) + 1e-2 * row + (0.0 if mag is None else mag) + 1e-30) + SUBNORMAL[name]
    same = (np.isnan(got) & np.isnan(ref)) | (got == ref)          # NaN as the reference; equal infinities
    bad = ~(err <= bound) & ~same
    assert not bad.any(), (f"{what}: {int(bad.sum())} of {bad.size} off, worst {err[bad].max()} "
                           f"(bound there {bound[bad][np.argmax(err[bad])]}, tol {tol})")


def _mag_bwd(y, dy, algo):
    """The size of dx's terms: |y| (|dy| + sum |y dy|) (softmax), |dy| + exp(y) sum |dy| (log-softmax)."""
    if algo == "log":
        return np.abs(dy) + np.exp(y) * np.abs(dy).sum(axis=1, keepdims=True)
    return np.abs(y) * (np.abs(dy) + np.abs(y * dy).sum(axis=1, keepdims=True))


def test_close_checker_fails_on_a_real_error():
    """The checker passes an answer within rounding (rows of NaN, -inf, a backward that cancels to ~0 beside) and
    fails a perturbed one: one element 1e-3 off (relative), a NaN where the reference is finite, a finite value
    where it is NaN, a backward entry off by 1e-3 of its terms."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 33)) * 3
    x[1, :] = -np.inf
    x[2, 16] = np.nan
    with np.errstate(invalid="ignore"):
        ref = _ref_fwd(x, "accurate")
    got = ref * (1 + 1e-7 * rng.standard_normal(ref.shape))
    _close(got, ref, "float32", "ok")
    for i, j, v in ((0, 3, got[0, 3] * (1 + 1e-3)), (3, 5, np.nan), (4, 0, got[4, 0] * (1 - 1e-3))):
        bad = got.copy()
        bad[i, j] = v
        with pytest.raises(AssertionError):
            _close(bad, ref, "float32", "perturbed")
    bad = got.copy()
    bad[1, 0] = 0.5                                 # a finite value in a NaN row
    with pytest.raises(AssertionError):
        _close(bad, ref, "float32", "perturbed")
    # backward of a 1-class softmax: y = 1, dx = dy - dy = 0 up to rounding of terms of size |dy|
    y = np.ones((37, 1))
    dy = rng.standard_normal((37, 1))
    dx_ref = _ref_bwd(y * (1 - 1e-8), dy, "accurate")         # ~1e-8: the cancellation's leftover
    mag = _mag_bwd(y, dy, "accurate")
    _close(dx_ref + 5e-8 * np.sign(dy), dx_ref, "float32", "cancel", scale=8, mag=mag)
    with pytest.raises(AssertionError):
        _close(dx_ref + 1e-3 * np.abs(dy), dx_ref, "float32", "cancel", scale=8, mag=mag)


def _launches():
    from minidnn.backend.cuda import launch
    return launch.launch_count()


def _ref_fwd(x, algo):
    m = np.zeros((x.shape[0], 1)) if algo == "fast" else x.max(axis=1, keepdims=True)
    e = np.exp(x - m)
    s = e.sum(axis=1, keepdims=True)
    return x - m - np.log(s) if algo == "log" else e / s


def _ref_bwd(y, dy, algo):
    if algo == "log":
        return dy - np.exp(y) * dy.sum(axis=1, keepdims=True)
    return y * (dy - (dy * y).sum(axis=1, keepdims=True))


SOFTMAX_CASES = ([("float32", c, a) for c in LENGTHS for a in ("accurate", "log", "fast")]
                 + [(n, c, a) for n in ("bfloat16", "float16") for c in LENGTHS for a in ("accurate", "log")
                    if n == "bfloat16" or c in (7, 33, 1000, 1025, 32768)]
                 + [("float64", c, a) for c in (7, 33, 513, 1000, 9000) for a in ("accurate", "log")])


@pytest.mark.cuda
@pytest.mark.parametrize("name, c, algo", SOFTMAX_CASES, ids=[f"{n}-{c}-{a}" for n, c, a in SOFTMAX_CASES])
def test_softmax_rows(cp, name, c, algo):
    dtype = _dtype(name)
    rng = np.random.default_rng(c)
    rows = 3 if c >= 4097 else 37
    x = (rng.standard_normal((rows, c)) * 3).astype(dtype)
    dy = rng.standard_normal((rows, c)).astype(dtype)
    n0 = _launches()
    y = B.softmax_forward(None, algo, None, cp.asarray(x), axis=-1)
    dx = B.softmax_backward(None, algo, None, y, cp.asarray(dy), axis=-1)
    assert _launches() - n0 == 2, "one launch each way"
    assert y.dtype == dtype and dx.dtype == dtype
    _close(y, _ref_fwd(x.astype(np.float64), algo), name, "forward", scale=4 if algo == "log" else 1)
    yh, dyh = _host(y), dy.astype(np.float64)
    _close(dx, _ref_bwd(yh, dyh, algo), name, "backward", scale=8, mag=_mag_bwd(yh, dyh, algo))


@pytest.mark.cuda
@pytest.mark.parametrize("c", [33, 1000, 4097])
def test_softmax_rows_misaligned_and_special_values(cp, c):
    """A view off the 16-byte boundary takes the scalar loads; -inf, +inf-free rows and NaN as the reference."""
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((5, c)) * 3).astype(np.float32)
    x[1, :] = -np.inf                          # every class -inf: NaN everywhere (as the reference's 0 / 0)
    x[2, c // 2] = np.nan                      # a NaN: the whole row NaN
    x[3, ::2] = -np.inf                        # some -inf: exp = 0 there
    flat = cp.zeros(x.size + 1, np.float32)
    flat[1:] = cp.asarray(x.ravel())
    xv = flat[1:].reshape(x.shape)             # C-contiguous, 4 bytes past an aligned address
    with np.errstate(invalid="ignore"):
        for algo in ("accurate", "log"):
            y = B.softmax_forward(None, algo, None, xv, axis=-1)
            ref = _ref_fwd(x.astype(np.float64), algo)
            _close(y, ref, "float32", algo, scale=4)
            dy = cp.asarray(rng.standard_normal(x.shape).astype(np.float32))
            dyv = cp.zeros(x.size + 1, np.float32)
            dyv[1:] = dy.ravel()
            dx = B.softmax_backward(None, algo, None, y, dyv[1:].reshape(x.shape), axis=-1)
            yh, dyh = _host(y), _host(dy)
            _close(dx, _ref_bwd(yh, dyh, algo), "float32", algo + " backward", scale=8, mag=_mag_bwd(yh, dyh, algo))


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["float32", "bfloat16"])
@pytest.mark.parametrize("shape", [(4, 21, 9, 7), (2, 3, 5, 64), (2, 40, 3, 11), (3, 1000, 2)])
def test_softmax_channel_columns(cp, name, shape):
    """A softmax over a non-last axis (CHANNEL mode on NCHW): the column kernels, registers for C <= 32."""
    dtype = _dtype(name)
    rng = np.random.default_rng(sum(shape))
    x = (rng.standard_normal(shape) * 3).astype(dtype)
    dy = rng.standard_normal(shape).astype(dtype)
    for algo in ("accurate", "log"):
        n0 = _launches()
        y = B.softmax_forward(None, algo, "channel", cp.asarray(x))
        dx = B.softmax_backward(None, algo, "channel", y, cp.asarray(dy))
        assert _launches() - n0 == 2
        xm = np.moveaxis(x.astype(np.float64), 1, -1).reshape(-1, shape[1])
        ref = np.moveaxis(_ref_fwd(xm, algo).reshape(np.moveaxis(x, 1, -1).shape), -1, 1)
        _close(y, ref, name, algo, scale=4)
        ym = np.moveaxis(_host(y), 1, -1).reshape(-1, shape[1])
        dym = np.moveaxis(dy.astype(np.float64), 1, -1).reshape(-1, shape[1])
        dref = np.moveaxis(_ref_bwd(ym, dym, algo).reshape(np.moveaxis(x, 1, -1).shape), -1, 1)
        dmag = np.moveaxis(_mag_bwd(ym, dym, algo).reshape(np.moveaxis(x, 1, -1).shape), -1, 1)
        _close(dx, dref, name, algo + " backward", scale=8, mag=dmag)


CE_CASES = [  # (dtype, C, weighted, smoothing, ignore fraction, reduction)
    ("float32", 1000, False, 0.0, 0.0, "mean"), ("float32", 1000, True, 0.1, 0.2, "mean"),
    ("float32", 1, False, 0.0, 0.0, "sum"), ("float32", 7, True, 0.0, 0.3, "none"),
    ("float32", 33, False, 0.2, 0.1, "none"), ("float32", 1025, True, 0.05, 0.0, "sum"),
    ("float32", 4097, False, 0.1, 0.0, "mean"), ("float32", 32768, True, 0.1, 0.3, "mean"),
    ("float32", 40000, False, 0.0, 0.0, "none"), ("float32", 10, False, 0.0, 1.0, "mean"),
    ("bfloat16", 1000, False, 0.0, 0.0, "mean"), ("bfloat16", 1000, True, 0.1, 0.2, "none"),
    ("bfloat16", 33, False, 0.0, 0.0, "sum"), ("bfloat16", 32768, False, 0.1, 0.0, "mean"),
    ("float16", 1000, True, 0.0, 0.1, "mean"), ("float16", 1025, False, 0.1, 0.0, "none"),
    ("float64", 1000, True, 0.1, 0.2, "mean"), ("float64", 513, False, 0.0, 0.0, "none"),
    ("float32", 1000, False, 0.0, 0.1, "none"), ("float32", 4097, True, 0.0, 0.0, "none"),
    ("bfloat16", 4097, False, 0.0, 0.0, "none"),
]
# rows enough that the cross-entropy forward's blocks loop (grid capped at MINB blocks an SM: 132 * 4 * 8 rows)
CE_MANY = [("float32", 1000, False, 0.0, 0.1, "none"), ("float32", 1000, True, 0.1, 0.1, "mean"),
           ("bfloat16", 1000, False, 0.0, 0.0, "none")]


@pytest.mark.cuda
@pytest.mark.parametrize("case", CE_CASES + [c + (6000,) for c in CE_MANY],
                         ids=["-".join(map(str, c)) for c in CE_CASES] + ["-".join(map(str, c)) + "-6000rows"
                                                                           for c in CE_MANY])
def test_cross_entropy_rows(cp, case):
    name, c, weighted, eps, ignore, reduction = case[:6]
    dtype = _dtype(name)
    rng = np.random.default_rng(c)
    n = case[6] if len(case) > 6 else 3 if c >= 4097 and reduction != "none" else 40 if c >= 4097 else 300
    x = (rng.standard_normal((n, c)) * 3).astype(dtype)
    t = rng.integers(0, c, n)
    t[rng.random(n) < ignore] = -100
    w = (rng.random(c) + 0.1).astype(dtype) if weighted else None
    x64, w64 = x.astype(np.float64), None if w is None else w.astype(np.float64)
    loss_ref, lse_ref, den_ref = B.softmax_cross_entropy_forward(None, x64, t, w64, -100, eps, reduction)
    g = np.asarray(rng.standard_normal(np.shape(loss_ref)))
    dx_ref = B.softmax_cross_entropy_backward(None, x64, t, g, lse_ref, den_ref, w64, -100, eps, reduction)
    gargs = (None if w is None else cp.asarray(w), -100, eps, reduction)
    n0 = _launches()
    loss, lse, den = B.softmax_cross_entropy_forward(None, cp.asarray(x), cp.asarray(t), *gargs)
    dx = B.softmax_cross_entropy_backward(None, cp.asarray(x), cp.asarray(t), cp.asarray(g.astype(dtype)), lse, den,
                                          *gargs)
    assert _launches() - n0 == 2, "one launch each way"
    assert loss.dtype == dtype and lse.shape == (n,) and dx.dtype == dtype
    acc = "float64" if name == "float64" else "float32"
    _close(lse, lse_ref, acc, "lse", scale=4)
    _close(den, np.asarray(den_ref, np.float64), acc, "denominator", scale=4)
    with np.errstate(invalid="ignore"):
        _close(loss, np.asarray(loss_ref, np.float64), name, "loss", scale=10)
    # dx from the GPU's own lse and the rounded g: the backward's error alone
    g_r = g.astype(dtype).astype(np.float64)
    dx_ref = B.softmax_cross_entropy_backward(None, x64, t, g_r, _host(lse), _host(den), w64, -100, eps, reduction)
    _close(dx, dx_ref, name, "dx", scale=8)
    if ignore == 1.0:
        assert not _host(dx).any()


# ---- GPU: session 7's PIPE forwards against the reference and against the session-6 kernels -------------------------

def _reset_plans():
    """Forget every settled launch, so a flipped softmax_kernels.FWD_PIPE takes effect (kernel plans, and the
    primitive's validated-call caches that hold them)."""
    from minidnn.backend import softmax as _smx
    from minidnn.backend.cuda import loss_kernels as _lk
    _sk._plans.clear()
    _lk._plans.clear()
    for k, v in vars(_smx).items():
        if isinstance(v, dict) and "seen" in k.lower():
            v.clear()


# rows enough that each warp walks several (PIPE grid: 2 or 4 blocks an SM of 8-32 rows each), ragged rows (1001:
# each row its own head and tail), 513 (16 elements a lane + edges: the 96-register budget)
PIPE_ROWS = [("float32", 6000, 1000), ("bfloat16", 6000, 1000), ("float16", 3000, 1001), ("float32", 3000, 1001),
             ("float32", 20000, 10), ("bfloat16", 20000, 10), ("float32", 5000, 513)]


@pytest.mark.cuda
@pytest.mark.parametrize("name, rows, c", PIPE_ROWS, ids=[f"{n}-{r}x{c}" for n, r, c in PIPE_ROWS])
def test_pipe_forward_rows(cp, monkeypatch, name, rows, c):
    """softmax / log-softmax / cross-entropy forward with PIPE on and off: each against the float64 reference (a row
    of -inf, a NaN row, a half -inf row; ignored targets, class weights, label smoothing, every reduction), and the
    two kernels against each other (the same sums in the same order: equal up to the compiler's contractions)."""
    dtype = _dtype(name)
    rng = np.random.default_rng(rows + c)
    x = (rng.standard_normal((rows, c)) * 3).astype(dtype)
    x[1, :] = -np.inf
    x[2, c // 3] = np.nan
    x[rows - 1, ::2] = -np.inf
    t = rng.integers(0, c, rows)
    t[rng.random(rows) < 0.1] = -100
    w = (rng.random(c) + 0.1).astype(dtype)
    x64, fin = x.astype(np.float64), np.isfinite(x.astype(np.float64)).all(axis=1)
    xd, td, wd = cp.asarray(x), cp.asarray(t), cp.asarray(w)
    xf, tf = cp.asarray(x[fin]), cp.asarray(t[fin])                  # the finite rows: a 'mean' / 'sum' to check
    got = {}
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        for pipe in (True, False):
            monkeypatch.setattr(_sk, "FWD_PIPE", pipe)
            _reset_plans()
            for algo in ("accurate", "log") + (("fast",) if name == "float32" else ()):
                n0 = _launches()
                y = B.softmax_forward(None, algo, None, xd, axis=-1)
                assert _launches() - n0 == 1
                _close(y, _ref_fwd(x64, algo), name, f"{algo} pipe={pipe}", scale=4 if algo == "log" else 1)
                got[pipe, algo] = _host(y)
            for weighted, eps in ((False, 0.0), (True, 0.1), (True, 0.0)):
                wa, w64 = (wd, w.astype(np.float64)) if weighted else (None, None)
                what = f"pipe={pipe} weighted={weighted} eps={eps}"
                loss, lse, den = B.softmax_cross_entropy_forward(None, xd, td, wa, -100, eps, "none")
                loss_ref, lse_ref, _ = B.softmax_cross_entropy_forward(None, x64, t, w64, -100, eps, "none")
                _close(lse, np.asarray(lse_ref), "float32", "lse " + what, scale=4)
                _close(loss, np.asarray(loss_ref, np.float64), name, "loss rows " + what, scale=10)
                got[pipe, "ce", weighted, eps] = (_host(lse), _host(loss))
                for red in ("mean", "sum"):
                    loss, _, den = B.softmax_cross_entropy_forward(None, xf, tf, wa, -100, eps, red)
                    loss_ref, _, den_ref = B.softmax_cross_entropy_forward(None, x64[fin], t[fin], w64, -100, eps,
                                                                            red)
                    _close(den, np.asarray(den_ref, np.float64), "float32", f"denominator {red} " + what, scale=4)
                    # the reduced loss is stored in the logits' dtype (as PyTorch's): a float16 sum of 13001 rows
                    # overflows to inf, so the reference is rounded to that dtype first
                    ref_out = np.asarray(loss_ref, np.float64).astype(dtype).astype(np.float64)
                    _close(loss, ref_out, name, f"loss {red} " + what, scale=10)
    for key, a in got.items():
        if key[0]:
            b = got[(False,) + key[1:]]
            for u, v in (zip(a, b) if isinstance(a, tuple) else [(a, b)]):
                np.testing.assert_allclose(u, v, rtol=2e-6 if name == "float32" else 1e-2, atol=0, equal_nan=True,
                                           err_msg=str(key))


BWD_PIPE_ROWS = [("float32", 6000, 1000), ("bfloat16", 6000, 1000), ("float16", 3000, 1001), ("float32", 3000, 1001),
                 ("float32", 20000, 10), ("bfloat16", 20000, 10), ("float32", 5000, 513), ("bfloat16", 2113, 1024)]


@pytest.mark.cuda
@pytest.mark.parametrize("name, rows, c", BWD_PIPE_ROWS, ids=[f"{n}-{r}x{c}" for n, r, c in BWD_PIPE_ROWS])
def test_bwd_pipe_log_softmax_rows(cp, monkeypatch, name, rows, c):
    """Session 9's pipelined log-softmax backward (BWD_PIPE) on and off: each against the float64 formula from the
    GPU's own forward output (rows of -inf, a NaN dy row, so every warp walks several rows on the persistent grid),
    and the two kernels against each other (the same sum in the same order); one launch a call."""
    dtype = _dtype(name)
    rng = np.random.default_rng(rows * 7 + c)
    x = (rng.standard_normal((rows, c)) * 3).astype(dtype)
    x[1, :] = -np.inf                                 # y NaN there (as the reference): dx NaN
    x[rows - 1, ::2] = -np.inf                        # y -inf: exp(y) = 0, dx = dy
    dy = rng.standard_normal((rows, c)).astype(dtype)
    dy[2, c // 3] = np.nan
    xd, dyd = cp.asarray(x), cp.asarray(dy)
    got = {}
    with np.errstate(invalid="ignore", over="ignore"):
        for on in (True, False):
            monkeypatch.setattr(_sk, "BWD_PIPE", on)
            _reset_plans()
            assert _defs(_sk.launch_spec(True, (rows, c), (1,), "LOG", dtype).defines)["PIPE"] == int(on)
            y = B.softmax_forward(None, "log", None, xd, axis=-1)
            n0 = _launches()
            dx = B.softmax_backward(None, "log", None, y, dyd, axis=-1)
            assert _launches() - n0 == 1
            yh, dyh = _host(y), dy.astype(np.float64)
            _close(dx, _ref_bwd(yh, dyh, "log"), name, f"log-softmax backward pipe={on}", scale=8,
                   mag=_mag_bwd(yh, dyh, "log"))
            got[on] = _host(dx)
    np.testing.assert_allclose(got[True], got[False], rtol=2e-6 if name == "float32" else 1e-2, atol=0,
                               equal_nan=True)


# ---- session 9, round 2: FASTX cross-entropy rows (loss_kernels.CE_FAST) ---------------------------------------------

def test_ce_fast_rule(monkeypatch):
    """FASTX (one FFMA + ex2.approx for exp, x[t] by one load) is compiled into the row kernels of 2-byte logits
    by default ("16"), of float32 too with "1", of none with "0"; never float64; the spatial (inner > 1) kernels
    by the same rule (session 21), the previous warp kernels (MINIDNN_CE_SPATIAL=0) never."""
    from minidnn.backend.cuda import loss_kernels as _lk
    for setting, on in (("16", {"bfloat16", "float16"}), ("1", {"bfloat16", "float16", "float32"}), ("0", set())):
        monkeypatch.setattr(_lk, "CE_FAST", setting)
        for name in ("float32", "bfloat16", "float16", "float64"):
            for kname in ("ce_fwd", "ce_bwd"):
                for c in (10, 1000, 1001, 40000):
                    d = _defs(_lk.launch_spec(kname, (64, c), _dtype(name), np.int64, False, "mean")[2])
                    assert d["FASTX"] == int(name in on), (setting, name, kname, c)
        for name in ("float32", "bfloat16", "float64"):
            src, _, defines, *_ = _lk.launch_spec("ce_fwd", (4, 1000, 3), _dtype(name), np.int64, False, "mean")
            assert src == "SPATIAL" and _defs(defines)["FASTX"] == int(name in on), (setting, name)
        monkeypatch.setattr(_lk, "CE_SPATIAL", False)
        spec = _lk.launch_spec("ce_fwd", (4, 1000, 3), _dtype("bfloat16"), np.int64, False, "mean")
        assert spec[0] == "WARPS" and "FASTX" not in _defs(spec[2])
        monkeypatch.setattr(_lk, "CE_SPATIAL", True)


def _ce_fast_builds():
    """[(kernel, defines, classes)]: FASTX ("1") in every dtype it may take, the headline (16384, 1000) rows and a
    ragged / smoothing / long-row variant."""
    from minidnn.backend.cuda import loss_kernels as _lk
    old, _lk.CE_FAST = _lk.CE_FAST, "1"
    jobs = {}
    try:
        for name in ("float32", "bfloat16", "float16"):
            for c, w, red, eps in ((1000, False, "mean", 0.0), (1001, True, "none", 0.1), (10, False, "sum", 0.0),
                                   (40000, True, "mean", 0.0)):
                for kname in ("ce_fwd", "ce_bwd"):
                    src, k, defines, *_ = _lk.launch_spec(kname, (16384, c), _dtype(name), np.int64, w, red, eps)
                    jobs[(k, defines)] = (c, src)
    finally:
        _lk.CE_FAST = old
    return [(k, defines, c, src) for (k, defines), (c, src) in jobs.items()]


CE_FAST_BUILDS = _ce_fast_builds()      # at import, so that xdist spreads the 24 compiles


# The 16-bit builds (FASTX's default, MINIDNN_CE_FAST=16) and float32's until every define value and pair of values is
# built (_nvcc.cover; all under MINIDNN_NVCC_ALL=1), eight a test and an nvcc run
CE_FAST_BUILT = _nvcc.cover(CE_FAST_BUILDS, lambda b: _nvcc.define_features([b[0]], b[1]),
                            lambda b: "STORAGE=0" not in b[1])
CE_FAST_BATCHES = [CE_FAST_BUILT[i:i + 8] for i in range(0, len(CE_FAST_BUILT), 8)]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("batch", CE_FAST_BATCHES,
                         ids=[f"{8 * i:02d}-{8 * i + len(b) - 1:02d}" for i, b in enumerate(CE_FAST_BATCHES)])
def test_ce_fast_compiles_without_spills(batch):
    """nvcc sm_90 builds each FASTX row kernel, and the one-chunk rows do not spill (ptxas builds only that
    kernel: --entry, whose registers and spills are those of the whole module's build)."""
    from minidnn.backend.cuda import loss_kernels as _lk
    for k, defines, c, source in batch:
        assert source == "ROWS" and _defs(defines)["FASTX"] == 1, (k, defines)
    built = _nvcc.build([(_lk.SOURCE_ROWS, defines) for _, defines, _, _ in batch], entries=[(k,) for k, *_ in batch])
    for (k, defines, c, _), r in zip(batch, built):
        assert r.returncode == 0, r.stderr[:1500]
        m = re.search(r"Compiling entry function '%s'.*?(\d+) bytes spill stores" % k, r.stderr, re.S)
        assert m is not None, r.stderr[:1500]
        if c != 40000 and "SMOOTH=0" in defines and "RAGGED=0" in defines:
            assert int(m.group(1)) == 0, (k, defines)


# rows so that each warp of the forward's persistent grid walks several; ragged rows (1001: heads and tails, targets
# in them), sub-warp groups (10 classes), a multi-chunk row (40000: the backward's chunk loop and target patch)
CE_FAST_ROWS = [("bfloat16", 6000, 1000), ("float16", 3000, 1001), ("float32", 6000, 1000), ("bfloat16", 20000, 10),
                ("bfloat16", 2113, 1024), ("float32", 3000, 1001), ("bfloat16", 40, 40000)]


@pytest.mark.cuda
@pytest.mark.parametrize("name, rows, c", CE_FAST_ROWS, ids=[f"{n}-{r}x{c}" for n, r, c in CE_FAST_ROWS])
def test_ce_fast_rows(cp, monkeypatch, name, rows, c):
    """Cross-entropy forward and backward with FASTX on ("1") and off ("0"): each against the float64 reference
    (loss rows / mean / sum, lse, denominator; dx from the GPU's own lse), over -inf and NaN rows, ignored and
    head / tail targets, class weights and label smoothing; one launch each way; on and off close (FASTX's exp
    differs from expf by a few ulp, so not bitwise)."""
    from minidnn.backend.cuda import loss_kernels as _lk
    dtype = _dtype(name)
    rng = np.random.default_rng(rows + 3 * c)
    x = (rng.standard_normal((rows, c)) * 3).astype(dtype)
    x[1, :] = -np.inf
    x[2, c // 3] = np.nan
    x[rows - 1, ::2] = -np.inf
    t = rng.integers(0, c, rows)
    t[rng.random(rows) < 0.1] = -100
    t[3:9] = [0, c - 1, 1, c - 2, min(7, c - 1), c // 2]            # first / last classes: heads and tails
    w = (rng.random(c) + 0.1).astype(dtype)
    x64, fin = x.astype(np.float64), np.isfinite(x.astype(np.float64)).all(axis=1)
    xd, td, wd = cp.asarray(x), cp.asarray(t), cp.asarray(w)
    xf, tf = cp.asarray(x[fin]), cp.asarray(t[fin])
    got = {}
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        for on in ("1", "0"):
            monkeypatch.setattr(_lk, "CE_FAST", on)
            _reset_plans()
            for weighted, eps in ((False, 0.0), (True, 0.1), (True, 0.0)):
                wa, w64 = (wd, w.astype(np.float64)) if weighted else (None, None)
                what = f"fast={on} weighted={weighted} eps={eps}"
                n0 = _launches()
                loss, lse, den = B.softmax_cross_entropy_forward(None, xd, td, wa, -100, eps, "none")
                assert _launches() - n0 == 1
                loss_ref, lse_ref, den_ref = B.softmax_cross_entropy_forward(None, x64, t, w64, -100, eps, "none")
                _close(lse, np.asarray(lse_ref), "float32", "lse " + what, scale=4)
                _close(loss, np.asarray(loss_ref, np.float64), name, "loss rows " + what, scale=10)
                # the same upstream gradient for FASTX on and off (compared below); dx's terms are of size |g|
                # (p_t sum_q g - q_t g cancels near the target: exp's few-ulp error is relative to them)
                g = np.random.default_rng(int(weighted) * 7 + int(eps * 10)).standard_normal(rows).astype(dtype)
                n0 = _launches()
                dx = B.softmax_cross_entropy_backward(None, xd, td, cp.asarray(g), lse, den, wa, -100, eps, "none")
                assert _launches() - n0 == 1
                dx_ref = B.softmax_cross_entropy_backward(None, x64, t, g.astype(np.float64), _host(lse), _host(den),
                                                          w64, -100, eps, "none")
                gmag = np.abs(g.astype(np.float64))[:, None] * (1.0 if w64 is None else w64.max())
                _close(dx, dx_ref, name, "dx " + what, scale=8, mag=gmag)
                got[on, weighted, eps] = (_host(lse), _host(loss), _host(dx))
                for red in ("mean", "sum"):
                    loss, lse_r, den = B.softmax_cross_entropy_forward(None, xf, tf, wa, -100, eps, red)
                    loss_ref, _, den_ref = B.softmax_cross_entropy_forward(None, x64[fin], t[fin], w64, -100, eps,
                                                                            red)
                    _close(den, np.asarray(den_ref, np.float64), "float32", f"denominator {red} " + what, scale=4)
                    # the reduced loss is stored in the logits' dtype (as PyTorch's): a float16 sum of 13001 rows
                    # overflows to inf, so the reference is rounded to that dtype first
                    ref_out = np.asarray(loss_ref, np.float64).astype(dtype).astype(np.float64)
                    _close(loss, ref_out, name, f"loss {red} " + what, scale=10)
                    gr = np.asarray(1.25, dtype)
                    dx = B.softmax_cross_entropy_backward(None, xf, tf, cp.asarray(gr), lse_r, den, wa, -100, eps,
                                                          red)
                    dx_ref = B.softmax_cross_entropy_backward(None, x64[fin], t[fin], gr.astype(np.float64),
                                                              _host(lse_r), _host(den), w64, -100, eps, red)
                    gmag = 1.25 * (1.0 if w64 is None else w64.max()) / (float(_host(den)) if red == "mean" else 1.0)
                    _close(dx, dx_ref, name, f"dx {red} " + what, scale=8, mag=gmag)
    for key, a in got.items():
        if key[0] == "1":
            for u, v in zip(a, got[("0",) + key[1:]]):
                np.testing.assert_allclose(u, v, rtol=1e-5 if name == "float32" else 2e-2, atol=1e-5 * np.nanmax(
                    np.abs(np.where(np.isfinite(v), v, 0))), equal_nan=True, err_msg=str(key))


# ---- session 10: the packed 16-bit cross-entropy forward (loss_kernels.CE_FWD16) ------------------------------------

@pytest.mark.parametrize("setting", ["0", "1", "2", "bf16"])
def test_ce_fwd16_rule(monkeypatch, setting):
    """P16 (64 registers: MINB 4) is planned for the FASTX pipe forward of 2-byte logits in whole vectors without
    label smoothing, only when CE_FWD16 asks ("1": both 16-bit dtypes, "bf16": bfloat16 only; "2", session 10's
    two-rows-ahead candidate, is gone: session 9's kernels), with session 9's tiling otherwise; the grid is the
    resident blocks (MINB an SM); float32 / float64, RAGGED and multi-chunk rows, smoothing, FASTX off and the
    backward keep session 9's kernels and their budgets."""
    from minidnn.backend.cuda import loss_kernels as _lk
    monkeypatch.setattr(_lk, "CE_FWD16", setting)
    monkeypatch.setattr(_lk, "CE_TAIL", "0")        # session 12's tail defines apart (test_ce_fwd_tail.py)
    want = {"0": None, "1": 4, "2": None, "bf16": 4}[setting]
    for name in ("bfloat16", "float16", "float32", "float64"):
        for c in (2, 10, 250, 1000, 1001, 1024, 40000):
            for eps, fast in ((0.0, "16"), (0.1, "16"), (0.0, "0")):
                monkeypatch.setattr(_lk, "CE_FAST", fast)
                src, k, defines, groups, per_sm, block = _lk.launch_spec("ce_fwd", (16384, c), _dtype(name), np.int64,
                                                                         False, "mean", eps)
                d = _defs(defines)
                take = (want is not None and name in (("bfloat16",) if setting == "bf16" else ("bfloat16", "float16"))
                        and not eps and fast == "16"
                        and d["PIPE"] == 1 and d["RAGGED"] == 0)
                assert ("P16" in d) == take, (setting, name, c, eps, fast, d)
                if take:
                    assert per_sm == d["MINB"] >= want, (name, c, d, per_sm)
                    assert c not in (1000, 1024) or d["MINB"] == want
                    monkeypatch.setattr(_lk, "CE_FWD16", "0")
                    base = _lk.launch_spec("ce_fwd", (16384, c), _dtype(name), np.int64, False, "mean", eps)[2]
                    monkeypatch.setattr(_lk, "CE_FWD16", setting)
                    other = {"MINB", "P16"}                                # the same tiling, another budget
                    assert {k: v for k, v in d.items() if k not in other} == \
                        {k: v for k, v in _defs(base).items() if k != "MINB"}, (defines, base)
                    assert len(defines) == len(base) + 1
                _, _, bdef, *_ = _lk.launch_spec("ce_bwd", (16384, c), _dtype(name), np.int64, False, "mean", eps)
                assert "P16" not in _defs(bdef)


def _ring_walk(rows, rpb, grid):
    """ce_fwd_p16 emulated: each group's two slots (row issued or None), the steps in the kernel's order; -> (row
    processed, slot, the row that slot's loads belong to) for every step."""
    stride = grid * rpb
    out = []
    for b in range(grid):
        r0 = b * rpb
        if r0 >= rows:
            continue
        for k in range(rpb):
            slots = [r0 + k, None]
            b0 = r0
            done = False
            while not done:
                for cur, fill in ((0, 1), (1, 0)):                         # (cur, fill) around the ring
                    if b0 + stride < rows:
                        slots[fill] = b0 + stride + k
                    out.append((b0 + k, cur, slots[cur]))
                    b0 += stride
                    if b0 >= rows:
                        done = True
                        break
    return out


@pytest.mark.parametrize("rows, rpb, grid", [(16384, 8, 528), (16384, 8, 396), (20000, 8, 396), (37, 8, 5),
                                             (70000, 32, 528), (130, 32, 4), (1, 8, 1), (2113, 8, 264),
                                             (3 * 8 * 7, 8, 7), (9000, 256, 528)])
def test_ring_walk_covers_each_row_once(rows, rpb, grid):
    """P16's walk (two slots, the loop unrolled over them) emulated step by step: each step reduces the slot that
    holds the loads of exactly the row it reduces, every row below ``rows`` once (rows past it are dead groups:
    reduced, not stored), and a slot is refilled only after its row was reduced."""
    seen = np.zeros(rows, np.int64)
    for row, slot, held in _ring_walk(rows, rpb, grid):
        assert held == row, (row, slot, held)
        if row < rows:
            seen[row] += 1
    assert (seen == 1).all()


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_ce_fwd16_compiles_without_spills(monkeypatch):
    """nvcc sm_90 builds every P16 forward (bf16 and fp16; weights, every reduction) at the row lengths the rule gives
    it, with no spill in the kernel."""
    from minidnn.backend.cuda import loss_kernels as _lk
    jobs = {}
    monkeypatch.setattr(_lk, "CE_FWD16", "1")
    for name in ("bfloat16", "float16"):
        for c, w, red in ((1000, False, "mean"), (1024, True, "none"), (10, False, "sum"), (250, True, "mean"),
                          (2, False, "mean")):
            src, k, defines, *_ = _lk.launch_spec("ce_fwd", (16384, c), _dtype(name), np.int64, w, red)
            assert _defs(defines)["P16"] == 1
            jobs[(k, defines)] = _lk.SOURCE_ROWS
    built = _nvcc.build([(text, defines) for (_, defines), text in jobs.items()], entries=[(k,) for k, _ in jobs])
    for (k, defines), r in zip(jobs, built):
        assert r.returncode == 0, r.stderr[:1500]
        m = re.search(r"Compiling entry function '%s'.*?(\d+) bytes spill stores" % k, r.stderr, re.S)
        assert m is not None and int(m.group(1)) == 0, (k, defines, r.stderr[-800:])


# rows so that each group walks several steps of the ring (P16 grid: 528 / 396 blocks of 8-32 rows on 132 SMs)
CE_FWD16_ROWS = [("bfloat16", 20000, 1000), ("float16", 13001, 1024), ("bfloat16", 70000, 10),
                 ("bfloat16", 13000, 250), ("float16", 9000, 2)]


@pytest.mark.cuda
@pytest.mark.parametrize("name, rows, c", CE_FWD16_ROWS, ids=[f"{n}-{r}x{c}" for n, r, c in CE_FWD16_ROWS])
def test_ce_fwd16_rows(cp, monkeypatch, name, rows, c):
    """The P16 cross-entropy forward (CE_FWD16 "1") against the float64 reference (lse, loss rows, 'mean'
    and 'sum' with the denominator) and against session 9's FASTX forward ("0"), over a row of -inf, a NaN, a half
    -inf row, ignored targets, a target out of range (its row NaN), class weights; one launch a call."""
    from minidnn.backend.cuda import loss_kernels as _lk
    monkeypatch.setattr(_lk, "CE_TAIL", "1")        # bitwise "0"; "2"'s P16 lse is test_ce_fwd_tail.py's
    dtype = _dtype(name)
    rng = np.random.default_rng(rows + 5 * c)
    x = (rng.standard_normal((rows, c)) * 3).astype(dtype)
    x[1, :] = -np.inf
    x[2, c // 2] = np.nan
    x[rows - 1, ::2] = -np.inf
    x[5, :] += dtype.type(40)                                   # a row far from 0: the shift matters
    t = rng.integers(0, c, rows)
    t[rng.random(rows) < 0.1] = -100
    t[3:5] = [0, c - 1]
    t[6] = c                                                   # out of range: NaN loss and weight in that row
    w = (rng.random(c) + 0.1).astype(dtype)
    x64 = x.astype(np.float64)
    fin = np.isfinite(x64).all(axis=1) & (t < c)
    xd, td, wd = cp.asarray(x), cp.asarray(t), cp.asarray(w)
    xf, tf = cp.asarray(x[fin]), cp.asarray(t[fin])
    got = {}
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        for setting in ("1", "0"):
            monkeypatch.setattr(_lk, "CE_FWD16", setting)
            _reset_plans()
            for weighted in (False, True):
                wa, w64 = (wd, w.astype(np.float64)) if weighted else (None, None)
                what = f"CE_FWD16={setting} weighted={weighted}"
                n0 = _launches()
                loss, lse, _ = B.softmax_cross_entropy_forward(None, xd, td, wa, -100, 0.0, "none")
                assert _launches() - n0 == 1
                loss_ref, lse_ref, _ = B.softmax_cross_entropy_forward(None, x64, np.where(t < c, t, 0), w64, -100,
                                                                        0.0, "none")
                lse_ref, loss_ref = np.asarray(lse_ref, np.float64), np.asarray(loss_ref, np.float64).copy()
                loss_ref[6] = np.nan
                _close(lse, lse_ref, "float32", "lse " + what, scale=4)
                _close(loss, loss_ref, name, "loss rows " + what, scale=10)
                got[setting, weighted] = (_host(lse), _host(loss))
                for red in ("mean", "sum"):
                    loss, _, den = B.softmax_cross_entropy_forward(None, xf, tf, wa, -100, 0.0, red)
                    loss_ref, _, den_ref = B.softmax_cross_entropy_forward(None, x64[fin], t[fin], w64, -100, 0.0, red)
                    _close(den, np.asarray(den_ref, np.float64), "float32", f"denominator {red} " + what, scale=4)
                    # the reduced loss is stored in the logits' dtype (as PyTorch's): a float16 sum of 13001 rows
                    # overflows to inf, so the reference is rounded to that dtype first
                    ref_out = np.asarray(loss_ref, np.float64).astype(dtype).astype(np.float64)
                    _close(loss, ref_out, name, f"loss {red} " + what, scale=10)
                    got[setting, weighted, red] = (_host(loss), _host(den))
    for key, a in got.items():
        if key[0] != "0":
            for u, v in zip(a, got[("0",) + key[1:]]):
                np.testing.assert_allclose(u, v, rtol=2e-5, atol=1e-5 * np.nanmax(np.abs(np.where(np.isfinite(v), v,
                                                                                                   0))),
                                           equal_nan=True, err_msg=str(key))

"""A/B of session 17's (and 18's) norm changes, device time only (CUDA-graph replays, as bench/kernels_gpu.py's
graph columns), PyTorch beside, ONE process:
  - group norm on thread-block clusters (norm_gncl: gn_fwdc, gn_bwdc + col_sum; switch norm_gncl.GN_CLUSTER /
    MINIDNN_GN_CLUSTER) against the kernels before it (the looped norm_fwd; row_sums + col_sum + gn_dx);
  - the 16-bit layer-norm forward route "v3kw" (norm_kernels.ROUTE["ln_fwd16"]; MINIDNN_NORM_ROUTE=ln_fwd16=v3kw)
    against the default "v3k";
  - session 18: 16-bit group rows stashed in one block's shared memory (norm_gn16: gn_fwds, gn_bwds + col_sum;
    switch norm_gn16.GN_STASH16 / MINIDNN_GN_STASH16), 16-bit rows only ("stash": the backward's variant 1,
    gn_bwds); the backward's variant 2 ("stash2": gn_bwdp -- a persistent block an SM walking rows through two row
    buffers, the next row's loads in flight while one reduces and stores; norm_gn16.BWD_VARIANT /
    MINIDNN_GN_STASH16_BWD, the default since session 18's run 3).  Both stash settings run gn_fwds forward, so the
    forward rows leave "stash2" out (the forward's variant 2, gn_fwdp, lost in run 3 and was removed).  The
    setting "lean" went with norm_gn16.LEAN (session 18, GNLEAN): the lean text is gn_fwds' and gn_bwdp's only one,
    so "stash" / "stash2" run it.

    python tools/norm_s17_ab.py [--rows big,ragged,mid,tuned] [--dtypes float32,bfloat16,float16] [--rounds 3]
                                [--trials 5] [--ln ln768,ln1536,ln1024] [--ln-dtypes bfloat16,float16]
                                [--settings stash,stash2]

Rows (the bench's group-norm case: x, dy of the dtype, scale = 1 and bias = 0 in float32 for 16-bit data):
  big     (32, 256, 56, 56) G=32   the kernel table's large2 row: 1024 groups of 25088 values (CL 7)
  ragged  (64, 96, 48, 48) G=8     12 channels a group, 27648 values: blocks straddle planes (CL 7)
  mid     (16, 512, 28, 28) G=32   16 channels of 784: 12544 values (float32 CL 4; 16-bit: the register kernels)
  tuned   (128, 64, 56, 56) G=32   control: the register kernels under both settings (the same plan, ratio ~1)
float16 runs the big row only.
Layer-norm rows (forward only; float16 runs ln768 only): ln768 (32768, 768) -- the kernel table's large3 row, 67% of
copy: a warp of 3 vectors a row under v3kw --, ln1536 (16384, 1536) a team of 64 x 3, ln1024 (16384, 1024) control
(the same plan under both).
Settings: "old" (GN_CLUSTER and GN_STASH16 off: the kernels before); for float32 rows "new" (the clusters on;
256-thread blocks) and "new512" (the same, NT = 512: MINIDNN_GN_CLUSTER_NT); for 16-bit rows "stash" (GN_STASH16 on:
norm_gn16, gn_bwds) and "stash2" (the same, gn_bwdp: backward only) -- the clusters take float32 only since session
18 (MINIDNN_GN_CLUSTER_FWD16 / _BWD16 went: they lost to the looped kernels on 16-bit rows); layer norm "v3k" (old)
and "v3kw" (new).  Plans are forgotten at each flip, so the next call plans anew (compiled outside the capture).
Method: per row, dtype and direction, `rounds` rounds; each round times every setting, the order rotated a step
each round (clock or temperature drift spreads over all), each timing a fresh capture of `reps` calls replayed
`trials` times (median).  Reported per setting: the median over rounds (ms a call), GB/s and % of the copy
bandwidth (compulsory bytes: forward x read + y written, backward x, dy read + dx written -- the bench's
accounting), the median of the per-round ratios old / this (> 1: faster than old), the spread over rounds,
PyTorch's graphed forward / backward once per row, and the kernels each setting launches.
Expected device time: ~1.5-2 min on an H100/H200 (compiles included).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "bench"))
sys.path.insert(0, os.path.join(HERE, ".."))

import kernels_gpu as KG  # noqa: E402  (bench/kernels_gpu.py: the cases and the timer)

from minidnn.backend.cuda import launch as _launch  # noqa: E402
from minidnn.backend.cuda import norm_gn16 as GS  # noqa: E402
from minidnn.backend.cuda import norm_gncl as GC  # noqa: E402
from minidnn.backend.cuda import norm_kernels as NK  # noqa: E402

ROWS = {"big": ((32, 256, 56, 56), 32), "ragged": ((64, 96, 48, 48), 8), "mid": ((16, 512, 28, 28), 32),
        "tuned": ((128, 64, 56, 56), 32)}
LN_ROWS = {"ln768": (32768, 768), "ln1536": (16384, 1536), "ln1024": (16384, 1024)}
SETTINGS = ("old", "new", "new512")  # float32 rows: the clusters at 256- / 512-thread blocks
SETTINGS16 = ("old", "stash", "stash2")  # 16-bit rows: session 18's stash (backward variants 1, 2)
LN_SETTINGS = ("old", "new")
_DEFAULT = (GC.GN_CLUSTER, GC.NT)
_DEFAULT16 = (GS.GN_STASH16, GS.BWD_VARIANT)
_LN_DEFAULT = NK.ROUTE["ln_fwd16"]


def apply(setting):
    """GN_CLUSTER, norm_gncl.NT, GN_STASH16 with its BWD_VARIANT for ``setting`` (None: the import-time defaults),
    plans forgotten."""
    cluster = setting in ("new", "new512")
    GC.GN_CLUSTER, GC.NT = _DEFAULT if setting is None else (cluster, 512 if setting == "new512" else 256)
    GS.GN_STASH16, GS.BWD_VARIANT = _DEFAULT16 if setting is None else (
        setting in ("stash", "stash2"), 2 if setting == "stash2" else 1)
    NK._plans.clear()


def apply_ln(setting):
    """The 16-bit layer-norm forward route: "old" v3k, "new" v3kw (None: the import-time default)."""
    NK.ROUTE["ln_fwd16"] = _LN_DEFAULT if setting is None else {"old": "v3k", "new": "v3kw"}[setting]
    NK._plans.clear()


def kernels_of(fn):
    """The kernels one call of ``fn`` launches (names, in order)."""
    got = []
    real = _launch.Prepared.__call__

    def spy(self, *arrays, stream=None):
        name = getattr(self.kernel, "name", None)       # (CuPy's RawKernel; the fake CuPy's: its handle's text)
        got.append(name or str(self.kernel.kernel.ptr).split("(")[0])
        return real(self, *arrays, stream=stream)
    _launch.Prepared.__call__ = spy
    try:
        fn()
    finally:
        _launch.Prepared.__call__ = real
    return "+".join(got)


_detail = []        # the layer-norm row being timed: (d, dtype), so the plan column shows ln_fwd3's team


def plan_detail():
    if not _detail:
        return ""
    d, dt = _detail[0]
    cfg = (NK.ln_config3w if NK.ROUTE["ln_fwd16"] == "v3kw" else NK.ln_config3)(d, dt, True)
    return "" if cfg is None else f" team={cfg[0]} VPT={cfg[1]}"


def _rounds(timer, fn, rounds, settings, apply_one):
    """{setting: [ms, one a round]}, {setting: [old / setting, one a round]}, {setting: kernels}: the settings'
    order rotated a step each round, a fresh capture each timing."""
    got = {s: [] for s in settings}
    ratios = {s: [] for s in settings}
    plans = {}
    reps = None
    for r in range(rounds):
        this = {}
        k = r % len(settings)
        for s in settings[k:] + settings[:k]:
            apply_one(s)
            fn()                                    # plans and compiles outside the capture
            plans[s] = kernels_of(fn) + plan_detail()
            reps = reps or timer.reps(fn, "minidnn")
            this[s] = timer.graph(fn, reps, "minidnn")
            got[s].append(this[s])
        for s in settings:
            ratios[s].append(this["old"] / this[s])
    return got, ratios, plans


def run_row(timer, cp, torch, key, dtype_name, bw, rounds, only=None):
    ln = key in LN_ROWS
    shape, groups = (LN_ROWS[key], None) if ln else ROWS[key]
    apply_one = apply_ln if ln else apply
    cases = KG.Cases(cp, torch, dtype_name)
    _detail[:] = [(shape[-1], cases.dt)] if ln else []
    for i, (name, _, (fn, tfn, nbytes), _) in enumerate(cases.norm(shape, groups=groups)[:1 if ln else 2]):
        tms = None
        if tfn is not None:
            try:
                tms = timer.graph(tfn, timer.reps(tfn, "torch"), "torch")
            except Exception as exc:        # noqa: BLE001
                print(f"  (PyTorch capture failed: {type(exc).__name__}: {exc})")
        try:
            settings = LN_SETTINGS if ln else SETTINGS if dtype_name == "float32" else SETTINGS16
            if only and not ln:         # --settings: "old" always (the ratios' base)
                settings = tuple(x for x in settings if x == "old" or x in only)
            if not ln and i == 0:       # the forward: "stash2" launches what "stash" does (gn_fwds)
                settings = tuple(x for x in settings if x != "stash2")
            got, ratios, plans = _rounds(timer, fn, rounds, settings, apply_one)
        finally:
            apply_one(None)
        for s in settings:
            ms = statistics.median(got[s])
            gbs = nbytes / (ms * 1e-3) / 1e9
            spread = max(got[s]) / min(got[s]) - 1
            vs = f"  torch {tms:.4f} ms ({tms / ms:4.2f}x)" if tms else ""
            ratio = f"old/this {statistics.median(ratios[s]):5.3f}" if s != "old" else " " * 14
            s_ = {"old": "v3k", "new": "v3kw"}[s] if ln else s
            print(f"{name:22s} {dtype_name:9s} {str(shape):18s} {s_:6s} {ms:8.4f} ms {gbs:6.0f} GB/s "
                  f"{100 * gbs / bw:4.0f}%  {ratio}  spread {100 * spread:4.1f}%{vs}  [{plans[s]}]")
        sys.stdout.flush()
    del cases
    cp.get_default_memory_pool().free_all_blocks()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--dtypes", default="float32,bfloat16,float16")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--ln", default=",".join(LN_ROWS), help="layer-norm rows ('' for none)")
    ap.add_argument("--ln-dtypes", default="bfloat16,float16")
    ap.add_argument("--settings", default="", help="group-norm settings to time beside old ('' for all: float32 "
                    + ",".join(SETTINGS[1:]) + "; 16-bit " + ",".join(SETTINGS16[1:]) + ")")
    args = ap.parse_args(argv)
    only = frozenset(x for x in args.settings.split(",") if x)
    if not only <= set(SETTINGS + SETTINGS16):
        ap.error(f"--settings: each of {', '.join(dict.fromkeys(SETTINGS + SETTINGS16))}")
    rows = [k for k in args.rows.split(",") if k]
    ln_rows = [k for k in args.ln.split(",") if k]
    if any(k not in ROWS for k in rows) or any(k not in LN_ROWS for k in ln_rows):
        ap.error(f"--rows: each of {', '.join(ROWS)}; --ln: of {', '.join(LN_ROWS)}")
    start = KG.ab_start("norm_s17_ab", args.trials, args.rounds, "order swapped each round", benchmark=True)
    if start is None:
        return 0
    cp, torch, timer, bw = start
    with KG.torch_stream(torch):           # PyTorch's ops on one stream, so its backwards can be captured
        todo = [(k, d) for d in args.dtypes.split(",") for k in rows if d != "float16" or k == "big"]
        todo += [(k, d) for d in args.ln_dtypes.split(",") for k in ln_rows if d != "float16" or k == "ln768"]
        for key, dtype_name in todo:
            try:
                run_row(timer, cp, torch, key, dtype_name, bw, args.rounds, only)
            except Exception as exc:        # noqa: BLE001 -- one row must not take the others down
                print(f"{key} {dtype_name}: failed: {type(exc).__name__}: {exc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

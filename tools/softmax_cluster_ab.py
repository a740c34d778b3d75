"""A/B of session 21's cluster softmax rows (softmax_cluster.CLUSTER, MINIDNN_SOFTMAX_CLUSTER; issue 10) on the GPU,
device time only (CUDA-graph replays), in one process, PyTorch beside.

    python tools/softmax_cluster_ab.py [--ops smx,lsmx,smxbwd,lsmxbwd] [--dtypes float32,bfloat16] [--rounds 3]
                                       [--trials 5] [--shapes 64x50257,...] [--settings 0,all,1] [--no-torch]

Ops: smx / lsmx the softmax / log-softmax forward, smxbwd / lsmxbwd their backwards (y of the same algorithm).
Settings: "0" the row kernels (softmax_kernels' plan: the reference of the ratio column), "all" the cluster kernels
wherever they hold the row, "1" the rule (`softmax_cluster.plan`, the default since session 21's run 10: rows the
one-chunk block path does not hold, 16-bit forwards only where the chunked path reads a row again); a setting may
force the launch's shape where the row fits it:
"all:cl8" (8 blocks a cluster), "all:nt512" (512 threads a block), "all:cl4:nt512" (FORCE_CL / FORCE_NT), e.g.
--settings 0,all,all:nt512,all:cl8 to test the rule's choice of NT and CL; "all:exact": expf for every exp where
the default takes ex2.approx in the log-softmax and 16-bit softmax forwards (FAST_EXP); "1:vpt4": every block's
threads at most 4 vectors each (the rule before VPT_FWD).  A setting that plans the
same launch as an earlier one is not timed again (its line says "= all", ...); a case where every setting plans the
row kernels is skipped (float32 128000 classes: more than 8 x 512 x 4 vectors).
PyTorch: torch.softmax / torch.log_softmax forward; torch._softmax_backward_data / _log_softmax_backward_data
backward (the kernels autograd calls, without autograd's host work), timed in the same alternated rounds.
Method: per case `rounds` rounds; a round times every distinct setting and PyTorch in turn (the order reversed every
other round), each a fresh capture of `reps` back-to-back calls (~10 ms) replayed `trials` times (median); switching
forgets the settled launches (softmax_kernels._plans and the primitive's seen-call caches), and the warm-up call
before the capture plans and compiles.  Every kernel is compiled first, a process a core.  Reported: the median over
rounds (ms a call, GB/s of the compulsory bytes -- forward x + y, backward y + dy + dx --, % of the copy bandwidth
measured in the same run), the spread (max/min - 1), the median per-round ratio "0"/setting (> 1: faster than the row
kernels), PyTorch/setting, and the plan (CL x NT x VPT, grid).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "bench"))
sys.path.insert(0, os.path.join(HERE, ".."))

import kernels_gpu as KG  # noqa: E402  (bench/kernels_gpu.py: the timer, copy bandwidth, inputs)
import numpy as np  # noqa: E402

OPS = {"smx": ("softmax fwd", "accurate", False), "lsmx": ("log-softmax fwd", "log", False),
       "smxbwd": ("softmax bwd", "accurate", True), "lsmxbwd": ("log-softmax bwd", "log", True)}
SHAPES = "64x50257,132x50257,300x50257,1000x50257,4096x50257,300x32000,4096x32000,2048x65536,128x128000"
_START = []


def _mods():
    from minidnn.backend.cuda import softmax_cluster as sc
    from minidnn.backend.cuda import softmax_kernels as sk
    if not _START:
        _START.append((sc.CLUSTER, sc.FORCE_CL, sc.FORCE_NT, sc.FAST_EXP, sc.VPT_MAX, sc.VPT_FWD))
    return sc, sk


def forget():
    """Forget every settled softmax launch (kernel plans and the primitive's seen-call caches)."""
    KG.forget_softmax()


def parse(setting):
    """"S[:clN][:ntN][:vptN][:exact]" -> (S, CL, NT, fast exp, VPT_MAX): the setting S with the launch shape
    forced (FORCE_CL / FORCE_NT; 0: the rule's), the vectors a thread may hold raised or lowered
    (softmax_cluster.VPT_MAX and VPT_FWD both, 1..8; 0: the module's -- "1:vpt4" is the rule before session 24's
    VPT_F32 / session 25's VPT_FWD) and, with "exact", expf for every exp (FAST_EXP off)."""
    sc, _ = _mods()
    base, *mods = setting.split(":")
    cl = nt = vmax = 0
    fexp = True
    for m in mods:
        if m == "exact":
            fexp = False
        elif m.startswith("cl") and m[2:].isdigit():
            cl = int(m[2:])
        elif m.startswith("nt") and m[2:].isdigit():
            nt = int(m[2:])
        elif m.startswith("vpt") and m[3:].isdigit():
            vmax = int(m[3:])
        else:
            raise ValueError(f"setting {setting!r}: modifiers clN (1..{sc.CL_MAX}), ntN ({sc.NTS}), vptN (1..8) "
                             "or exact")
    if base not in sc.SETTINGS or not 0 <= cl <= sc.CL_MAX or nt not in (0,) + sc.NTS or not 0 <= vmax <= 8:
        raise ValueError(f"setting {setting!r}: one of {sc.SETTINGS}, then :clN (1..{sc.CL_MAX}) :ntN ({sc.NTS}) "
                         ":vptN (1..8) :exact")
    return base, cl, nt, fexp, vmax


def switch(setting):
    sc, _ = _mods()
    base, cl, nt, fexp, vmax = parse(setting)
    sc.CLUSTER, sc.FORCE_CL, sc.FORCE_NT, sc.FAST_EXP = base, cl, nt, fexp
    sc.VPT_MAX, sc.VPT_FWD = (vmax, vmax) if vmax else _START[0][4:]
    forget()


def restore():
    sc, _ = _mods()
    sc.CLUSTER, sc.FORCE_CL, sc.FORCE_NT, sc.FAST_EXP, sc.VPT_MAX, sc.VPT_FWD = _START[0]
    forget()


def plan_of(op, shape, dt, setting, dev=0):
    """What ``op`` launches under ``setting``: ("cluster", Launch) or ("rows", the row kernels' Spec, with the call's
    cache hint and stash as plan() takes them)."""
    sc, sk = _mods()
    _, algo, bwd = OPS[op]
    rows, c = shape
    base, cl, nt, fexp, vmax = parse(setting)
    was = sc.VPT_MAX, sc.VPT_FWD
    sc.VPT_MAX, sc.VPT_FWD = (vmax, vmax) if vmax else _START[0][4:]
    try:
        p = sc.plan(rows, c, dt, algo.upper(), bwd, dev, base, (cl, nt), fexp)
    finally:
        sc.VPT_MAX, sc.VPT_FWD = was
    if p is not None:
        return ("cluster", p)
    hint = sk.call_hint(bwd, rows * c * np.dtype(dt).itemsize * (3 if bwd else 2), dev)
    return ("rows", sk.launch_spec(bwd, shape, (1,), algo.upper(), dt, hint, sk.call_stash(bwd, dev)))


def describe(p):
    kind, x = p
    if kind == "cluster":
        return f"cluster CL {x.cl} x NT {x.nt} x VPT {x.vpt}, {x.grid} blocks{', ex2.approx' if x.fexp else ''}"
    return f"rows {x.name} block {x.block}"


def precompile(ops, dtype_names, shapes, settings):
    """Every kernel the cases plan, into CuPy's disk cache (a process a core)."""
    sc, sk = _mods()
    specs, jobs = [], []
    for name in dtype_names:
        dt = sk._dtype_of(name)
        for op in ops:
            for shape in shapes:
                for s in settings:
                    p = plan_of(op, shape, dt, s)
                    if p[0] == "cluster":
                        jobs.append((name, OPS[op][1].upper(), OPS[op][2], p[1]))
                    else:
                        specs.append(p[1])
    return sk.precompile(specs) + sc.precompile(jobs)


def torch_fn(torch, cases, op, shape):
    """PyTorch's op on fresh inputs of ``shape`` (None without PyTorch)."""
    if torch is None:
        return None
    _, algo, bwd = OPS[op]
    x = cases.t(shape)
    f = torch.log_softmax if algo == "log" else torch.softmax
    if not bwd:
        return lambda: f(x, -1)
    y = f(x, -1)
    dy = cases.t(shape)
    g = torch._log_softmax_backward_data if algo == "log" else torch._softmax_backward_data
    return lambda: g(dy, y, -1, x.dtype)


def values_check(settings, fn):
    """Each setting's output against the first's: the largest |difference| over the largest |value| (the forced
    shapes' outputs are not otherwise tested), "" for one setting."""
    outs = {}
    for s in settings:
        switch(s)
        outs[s] = fn().astype("float64")
    ref = outs[settings[0]]
    scale = float(abs(ref).max()) or 1.0
    return ", ".join(f"{s} {float(abs(outs[s] - ref).max()) / scale:.1e}" for s in settings[1:])


def run_case(timer, torch, cases, op, shape, dtype_name, bw, rounds, settings):
    name, algo, bwd = OPS[op]
    plans, distinct, same = KG.distinct_plans(settings, lambda s: plan_of(op, shape, cases.dt, s))
    if all(plans[s][0] == "rows" for s in settings):
        print(f"{name:16s} {dtype_name:9s} {str(shape):14s} every setting plans the row kernels: skipped")
        return
    row = cases.softmax(shape, algo)[1 if bwd else 0]
    _, _, (fn, _, nbytes), _ = row
    tfn = torch_fn(torch, cases, op, shape)
    try:
        check = values_check(distinct, fn)
        got, ratios, vs_torch, tms = KG.alternate(timer, distinct, switch, fn, tfn, rounds)
    finally:
        restore()
    if check:
        print(f"{name:16s} {dtype_name:9s} {str(shape):14s} values against {distinct[0]}: {check}")
    print("\n".join(KG.ab_lines(f"{name:16s} {dtype_name:9s} {str(shape):14s}", settings, got, ratios, vs_torch, tms,
                                 nbytes, bw, same, lambda s: describe(plans[s]))))
    sys.stdout.flush()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", default="smx,lsmx,smxbwd,lsmxbwd")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--settings", default="0,all,1")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--no-precompile", action="store_true")
    args = ap.parse_args(argv)
    sc, _ = _mods()
    settings = [s for s in args.settings.split(",") if s]
    try:
        [parse(s) for s in settings]
    except ValueError as exc:
        ap.error(f"--settings: {exc}")
    ops = [o for o in args.ops.split(",") if o]
    if any(OPS.get(o, ("", "", False))[2] for o in ops) and any(parse(s)[4] > sc.VPT_MAX for s in settings):
        ap.error("--settings :vptN above VPT_MAX with backward ops: smx_bwdc spills there (session 24, VPT8FAULT)")
    if any(o not in OPS for o in ops):
        ap.error(f"--ops {args.ops!r}: values among {tuple(OPS)}")
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    start = KG.ab_start("softmax_cluster_ab", args.trials, args.rounds, "settings and PyTorch alternated")
    if start is None:
        return 0
    cp, torch, timer, bw = start
    if args.no_torch:
        torch = None
    if not args.no_precompile:
        t0 = time.perf_counter()
        n = precompile(ops, args.dtypes.split(","), shapes, settings)
        print(f"precompiled {n} kernels in {time.perf_counter() - t0:.1f} s")
    with KG.torch_stream(torch):
        for dtype_name in args.dtypes.split(","):
            cases = KG.Cases(cp, torch, dtype_name)
            for op in ops:
                for shape in shapes:
                    try:
                        run_case(timer, torch, cases, op, shape, dtype_name, bw, args.rounds, settings)
                    except Exception as exc:        # noqa: BLE001 -- one case must not take the others down
                        print(f"{op} {dtype_name} {shape}: failed: {type(exc).__name__}: {exc}")
                    cp.get_default_memory_pool().free_all_blocks()
            del cases
    return 0


if __name__ == "__main__":
    sys.exit(main())

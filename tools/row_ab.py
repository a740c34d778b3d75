"""A/B of the row-kernel settings on the GPU (issue 10), device time only (CUDA-graph replays, as
bench/kernels_gpu.py's graph columns and tools/ktable_ab.py), in one process, PyTorch's graphed op beside: session 13's
softmax_kernels.FWD_WARP ("0", PIPE, against "1") on softmax / log-softmax forward and the
log-softmax backward, session 14's softmax_kernels.FWD_LSM on the log-softmax forward (op "lsm", softmax's forward
timed in the same rounds), session 12's loss_kernels.CE_TAIL on the cross-entropy forward, session 17's cache
hints softmax_kernels.HINT_FWD / HINT_BWD (--hint) on the softmax / log-softmax forwards and backwards, and session
17's softmax_kernels.WARP_FROM (--warp-from: WARP's grid from 257 classes) and BWD_STASH (--bwd-stash: the long
backward rows' shared-memory stash).

    python tools/row_ab.py [--ops smx,lsmx,lsmxbwd] [--dtypes float32,bfloat16] [--rounds 3] [--trials 5]
                           [--shapes 16384x1000,8192x1000,32768x1000,16384x1024,16384x513] [--settings 0,1]
                           [--lsm 0,2,smx] [--hint 0,1,2 [--hint-all]] [--warp-from 513,257] [--bwd-stash 0,1,2,3]

Settings (docs/step_kernels.md, "Session 13: warp-row softmax" and "Session 12: cross-entropy and softmax forward"):
  smx      FWD_WARP  "0" (PIPE, a persistent grid of 2 blocks an SM, the next row's loads in registers) |
  lsmx               "1" (a non-persistent grid of 128-thread blocks, a row a warp, every load issued first, 56-64
  lsmxbwd            registers: 8-9 blocks an SM; "2", two rows a warp, never beat it and went in session 19); rows
                     other than 513..1024-class whole-warp rows plan "0" (their lines say so); the backward is
                     log-softmax's; --settings 0,1,1@48,1@40 adds the
                     occupancy probe "1@R" (WARP 1 at a forward budget of R registers: 48 -> ten blocks an SM, 40 ->
                     twelve; they may spill)
  lsm      FWD_LSM   "0" (the session-13 WARP log-softmax forward) | "2" (the default: PyTorch's epilogue, the warp's
                     max first, d = x - M kept, y = d - log S, ex2 / lg2.approx.ftz; "1", the same with expf, lost
                     to it and went in session 19) | "smx": the SOFTMAX
                     forward at the default, timed in the same alternated rounds (its column smx/this > 1: the
                     log-softmax setting is faster than softmax); FWD_WARP stays at its default ("auto": WARP from
                     12288 rows), so rows that plan PIPE print "= 0"; PyTorch's log_softmax and softmax beside
                     (docs/step_kernels.md, "Session 14: log-softmax forward"); "L@R" (e.g. 0@56, 2@56,
                     smx@48): the same at WARP 1 with a forward budget of R registers (FWD_WARP's "1@R" probe:
                     56 is softmax's nine blocks an SM, LOG's own is 48: ten)
  ce       CE_TAIL   "2" (default) | "1" | "0" (session 11's kernels)
  --hint   HINT_FWD (smx, lsmx) / HINT_BWD (lsmxbwd, smxbwd: softmax's backward) in place of --settings: "0" (none,
           the default) | "1" (ld.global.cs + st.global.cs; forwards only: the backward's streaming loads spill)
           | "2" (st.global.cs, the loads of "0"); FWD_WARP and FWD_LSM stay at their defaults; lines "h0", "h1",
           "h2" (a backward op skips "h1").  A call takes the hint only where
           its arrays exceed L2 (HINT_BY_SIZE): a smaller shape plans "h0" for every setting (skipped) unless
           --hint-all (HINT_BY_SIZE off: is the size rule right?)  (docs/step_kernels.md, "Session 17: cache hints
           of the row kernels")
  --warp-from  WARP_FROM (smx, lsmx, lsmxbwd) in place of --settings: "513" (the default: WARP's grid from 513
           classes) | "257" (also 257..512-class rows holding 16 elements a lane, e.g. 512); lines "wf513", "wf257"
  --bwd-stash  BWD_STASH (lsmxbwd, smxbwd) in place of --settings: "0" (off) | "1" (several-chunk rows
           keep their first chunks' dy -- softmax's y too -- in shared memory) | "2" (log-softmax's y too) | "3" ("2"
           filled by cp.async: the row's loads in flight together, with "1" where that does not fit) |
           "4" ("3", and log-softmax's dy alone by cp.async where its chunks but the last fit: 50257 classes;
           session 20's runs 1-3) | "5" ("4" with a 16-bit log-softmax cp.async stash counted in raw
           bytes: both arrays at 50257 classes, half the shared memory elsewhere) | "6" ("5", and such rows whose
           raw stash fits two blocks an SM at 64 registers, MINB 2; the default since session 20's run 3:
           docs/step_kernels.md, "Session 20: the 16-bit log-softmax backward rows"); lines "bs0" ... "bs6";
           one-chunk rows plan the same kernel for all (skipped)
           (docs/step_kernels.md, "Session 17: softmax rows of 512 and of 32000 classes")
The first setting listed is the reference of the ratio column.  A setting whose planned kernel (defines, grid) is an
earlier setting's is not timed again: its line says "= 0" (or "= 1", ...).
Method: per case (op, dtype, shape) `rounds` rounds; a round times every distinct setting in turn, the order reversed
every other round (a drift of clocks cancels), each timing a fresh capture of the bench's `reps` calls (the
primitive with its host work, as bench/kernels_gpu.py: x, target and outputs from the bench's Cases) replayed
`trials` times (median).  Switching forgets the settled launches first, so the next capture plans anew (the NVRTC
compile happens in the warm-up call before the capture).  Reported: the median over rounds of each setting (ms a
call, GB/s of the bench's compulsory bytes, % of the copy bandwidth measured in the same run), the spread
(max/min - 1), the median of the per-round ratios reference/setting (> 1: the setting is faster), and PyTorch /
setting.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "bench"))
sys.path.insert(0, os.path.join(HERE, ".."))

import kernels_gpu as KG  # noqa: E402  (bench/kernels_gpu.py: the cases and the timer)
import numpy as np  # noqa: E402

SETTINGS = {"ce": ("0", "1", "2"), "smx": ("0", "1"), "lsmx": ("0", "1"), "lsmxbwd": ("0", "1"),
            "smxbwd": ("0", "1"), "lsm": ("0", "2", "smx")}
NAMES = {"ce": "cross-entropy fwd", "smx": "softmax fwd", "lsmx": "log-softmax fwd", "lsmxbwd": "log-softmax bwd",
         "smxbwd": "softmax bwd", "lsm": "log-softmax fwd"}
BACKWARD = ("lsmxbwd", "smxbwd")


_START = {}


def _mods():
    from minidnn.backend.cuda import loss_kernels as lk
    from minidnn.backend.cuda import softmax_cluster as sc
    from minidnn.backend.cuda import softmax_kernels as sk
    # the row kernels' settings are what this tool times (session 21: long rows would take softmax_cluster under
    # its default "1"; tools/softmax_cluster_ab.py times that route)
    sc.CLUSTER = "0"
    if not _START:                              # the settings this process started with: what _restore puts back
        _START.update(ce=lk.CE_TAIL, warp=sk.FWD_WARP, lsm=sk.FWD_LSM, hint=(sk.HINT_FWD, sk.HINT_BWD),
                      warp_from=sk.WARP_FROM, stash=sk.BWD_STASH)
    return lk, sk


def _forget():
    """Forget every settled softmax / cross-entropy launch (kernel plans and the primitive's seen-call caches)."""
    from minidnn.backend import softmax as smx
    lk, sk = _mods()
    sk._plans.clear()
    lk._plans.clear()
    for k, v in vars(smx).items():
        if isinstance(v, dict) and "seen" in k.lower():
            v.clear()


def _switch(op, setting):
    lk, sk = _mods()
    if setting.startswith("wf"):                # --warp-from: WARP_FROM, the rest default
        sk.WARP_FROM = int(setting[2:])
    elif setting.startswith("bs"):              # --bwd-stash: BWD_STASH, the rest default
        sk.BWD_STASH = int(setting[2:])
    elif setting.startswith("h"):               # --hint: the cache hint of the op's direction, the rest default
        if op in BACKWARD:
            sk.HINT_BWD = int(setting[1:])
        else:
            sk.HINT_FWD = int(setting[1:])
    elif op == "ce":
        lk.CE_TAIL = setting
    elif op == "lsm":                           # "L" or "L@R" (WARP 1 at a forward budget of R registers)
        lsm, _, regs = setting.partition("@")
        sk.FWD_LSM = _START["lsm"] if lsm == "smx" else lsm
        sk.FWD_WARP = f"1@{regs}" if regs else _START["warp"]
    else:
        sk.FWD_WARP = setting
    _forget()


def _restore():
    """The settings the process started with (before: the environment's, with FWD_LSM "0" where it was unset --
    the session-13 kernel, not the module's default "2", for every case after the first)."""
    lk, sk = _mods()
    lk.CE_TAIL, sk.FWD_WARP, sk.FWD_LSM = _START["ce"], _START["warp"], _START["lsm"]
    sk.HINT_FWD, sk.HINT_BWD = _START["hint"]
    sk.WARP_FROM, sk.BWD_STASH = _START["warp_from"], _START["stash"]
    _forget()


def _plan(op, shape, dt, setting=None):
    """The planned launch of ``op`` under the current setting: (defines, grid groups, blocks an SM, threads)."""
    lk, sk = _mods()
    if op == "ce":
        s = lk.launch_spec("ce_fwd", shape, dt, np.int64, False, "mean")
        return s[2], s[3], s[4], s[5]
    s = _spec(op, shape, dt, setting)
    return s.defines, s.groups, s.per_sm, s.block


def _spec(op, shape, dt, setting):
    """softmax_kernels.launch_spec of a softmax op under the current setting (the call's hint included)."""
    _, sk = _mods()
    soft = op in ("smx", "smxbwd") or (op == "lsm" and setting.partition("@")[0] == "smx")
    bwd = op in BACKWARD
    hint = sk.call_hint(bwd, int(np.prod(shape)) * np.dtype(dt).itemsize * (3 if bwd else 2), 0)
    return sk.launch_spec(bwd, shape, (1,), "ACCURATE" if soft else "LOG", dt, hint)


def _for_op(op, settings):
    """``settings`` without those ``op`` cannot take (HINT_BWD is 0 or 2: a backward op skips "h1")."""
    return [s for s in settings if not (op in BACKWARD and s == "h1")]


def precompile(ops, dtype_names, shapes, pick):
    """Every softmax kernel the cases will plan, compiled into CuPy's disk cache by a process a core
    (softmax_kernels.precompile); ``pick(op)``: the op's settings."""
    _, sk = _mods()
    specs = []
    try:
        for name in dtype_names:
            dt = sk._dtype_of(name)
            for op in ops:
                if op == "ce":
                    continue
                for shape in shapes:
                    for st in _for_op(op, pick(op)):
                        _switch(op, st)
                        specs.append(_spec(op, shape, dt, st))
    finally:
        _restore()
    return sk.precompile(specs)


def _short(plan, base):
    """The defines that differ from the default's, and the block shape where it differs."""
    d = [x for x in plan[0] if x not in base[0]]
    if plan[3] != base[3] or plan[2] != base[2]:
        d.append(f"block {plan[3]} x {plan[2]}/SM")
    return " ".join(d) or "-"


def run_case(timer, cases, op, shape, dtype_name, bw, rounds, settings=None):
    settings = _for_op(op, settings if settings and op != "ce" else SETTINGS[op])
    def plan_of(s):
        _switch(op, s)
        return _plan(op, shape, cases.dt, s)

    plans, distinct, same = KG.distinct_plans(settings, plan_of)
    _restore()
    if len(distinct) == 1:
        print(f"{NAMES[op]:18s} {dtype_name:9s} {str(shape):14s} every setting plans the default kernel: skipped")
        return
    if op == "ce":                              # the bench's own case (inputs, call, PyTorch op, bytes)
        row = cases.cross_entropy(shape)[0]
    else:
        row = cases.softmax(shape, "accurate" if op in ("smx", "smxbwd") else "log")[1 if op in BACKWARD else 0]
    name, _, (fn, tfn, nbytes), _ = row
    fns, tfns = {s: fn for s in distinct}, {"": tfn}
    if op == "lsm":                             # softmax's forward in the same rounds, PyTorch's softmax beside
        _, _, (sfn, stfn, _), _ = cases.softmax(shape, "accurate")[0]
        fns.update({s: sfn for s in distinct if s.partition("@")[0] == "smx"})
        tfns["smx"] = stfn
    got = {s: [] for s in distinct}
    ratios = {s: [] for s in distinct}
    vs_smx = {s: [] for s in distinct}
    reps = None
    try:
        for r in range(rounds):
            order = distinct if r % 2 == 0 else distinct[::-1]
            this = {}
            for s in order:
                _switch(op, s)
                fns[s]()                                # plans and compiles outside the capture
                reps = reps or timer.reps(fns[s], "minidnn")
                this[s] = timer.graph(fns[s], reps, "minidnn")
                got[s].append(this[s])
            for s in distinct:
                ratios[s].append(this[distinct[0]] / this[s])
                if "smx" in this:
                    vs_smx[s].append(this["smx"] / this[s])
    finally:
        _restore()
    tms = {}
    for k, f in tfns.items():
        if f is None:
            continue
        try:
            tms[k] = timer.graph(f, timer.reps(f, "torch"), "torch")
        except Exception as exc:        # noqa: BLE001
            print(f"  (PyTorch capture failed: {type(exc).__name__}: {exc})")
    for s in settings:
        if s not in got:
            print(f"{name:18s} {dtype_name:9s} {str(shape):14s} {s}  = {same[s]} (the same kernel)")
            continue
        ms = statistics.median(got[s])
        gbs = nbytes / (ms * 1e-3) / 1e9
        spread = max(got[s]) / min(got[s]) - 1
        tk = "smx" if s.partition("@")[0] == "smx" else ""
        vs = f"  torch/this {tms[tk] / ms:5.3f}" if tk in tms else ""
        if vs_smx[s] and not tk:
            vs += f"  smx/this {statistics.median(vs_smx[s]):5.3f}"
        print(f"{'softmax fwd' if tk else name:18s} {dtype_name:9s} {str(shape):14s} {s:6s} {ms:8.4f} ms "
              f"{gbs:6.0f} GB/s {100 * gbs / bw:4.0f}%  spread {100 * spread:4.1f}%  "
              f"{distinct[0]}/this {statistics.median(ratios[s]):.3f}{vs}   "
              f"plan: {_short(plans[s], plans[distinct[0]])}")
    for k, t in tms.items():
        print(f"{'':18s} {dtype_name:9s} {str(shape):14s} torch {'softmax' if k else name.split()[0]} {t:.4f} ms")
    sys.stdout.flush()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", default="smx,lsmx,lsmxbwd")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--shapes", default="16384x1000,8192x1000,32768x1000,16384x1024,16384x513")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--settings", default="",
                    help="FWD_WARP settings for smx / lsmx / lsmxbwd, the first the reference (default 0,1); "
                         "'1@48' etc.: WARP 1 at a forward budget of 48 registers (an occupancy probe; may spill)")
    ap.add_argument("--hint", default="",
                    help="cache-hint settings (HINT_FWD for smx / lsmx, HINT_BWD for lsmxbwd / smxbwd) in place of "
                         "--settings, the first the reference, e.g. 0,1,2")
    ap.add_argument("--hint-all", action="store_true",
                    help="with --hint: the hints at every size (HINT_BY_SIZE off), not only where the arrays exceed L2")
    ap.add_argument("--warp-from", default="",
                    help="WARP_FROM settings (smx / lsmx / lsmxbwd) in place of --settings, the first the reference, "
                         "e.g. 513,257")
    ap.add_argument("--bwd-stash", default="",
                    help="BWD_STASH settings (lsmxbwd / smxbwd) in place of --settings, the first the reference, "
                         "e.g. 4,5,6")
    ap.add_argument("--no-precompile", action="store_true",
                    help="compile each kernel when its case first runs (default: all of them first, a process a core)")
    ap.add_argument("--lsm", default="0,2,smx",
                    help="FWD_LSM settings for the op lsm, the first the reference; 'smx': softmax's forward in the "
                         "same rounds")
    args = ap.parse_args(argv)
    start = KG.ab_start("row_ab", args.trials, args.rounds, "settings alternated")
    if start is None:
        return 0
    cp, torch, timer, bw = start
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    hints = [f"h{v}" for v in args.hint.split(",") if v]
    if any(h not in ("h0", "h1", "h2") for h in hints):
        ap.error(f"--hint {args.hint!r}: values 0, 1 or 2")
    if args.hint_all:
        _mods()[1].HINT_BY_SIZE = False
    wfs = [f"wf{v}" for v in args.warp_from.split(",") if v]
    if any(w not in ("wf513", "wf257") for w in wfs):
        ap.error(f"--warp-from {args.warp_from!r}: values 513 or 257")
    stashes = [f"bs{v}" for v in args.bwd_stash.split(",") if v]
    if any(b not in [f"bs{v}" for v in _mods()[1].BWD_STASH_MODES] for b in stashes):
        ap.error(f"--bwd-stash {args.bwd_stash!r}: values 0, 1, 2, 3, 4, 5 or 6")

    def pick(op):
        if hints and op not in ("ce", "lsm"):
            return hints
        if wfs and op not in ("ce", "lsm"):
            return wfs
        if stashes and op not in ("ce", "lsm"):
            return stashes
        return [x for x in (args.lsm if op == "lsm" else args.settings).split(",") if x] or SETTINGS[op]
    if not args.no_precompile:
        t0 = time.perf_counter()
        n = precompile(args.ops.split(","), args.dtypes.split(","), shapes, pick)
        print(f"precompiled {n} softmax kernels in {time.perf_counter() - t0:.1f} s")
    with KG.torch_stream(torch):
        for dtype_name in args.dtypes.split(","):
            cases = KG.Cases(cp, torch, dtype_name)
            for op in args.ops.split(","):
                for shape in shapes:
                    try:
                        run_case(timer, cases, op, shape, dtype_name, bw, args.rounds, pick(op))
                    except Exception as exc:        # noqa: BLE001 -- one case must not take the others down
                        print(f"{op} {dtype_name} {shape}: failed: {type(exc).__name__}: {exc}")
            del cases
            cp.get_default_memory_pool().free_all_blocks()
    return 0


if __name__ == "__main__":
    sys.exit(main())

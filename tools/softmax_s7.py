"""Session 7's softmax / cross-entropy row kernels on the GPU: kernel-only and per-call time, old vs new vs PyTorch,
in one process.

    python3 tools/softmax_s7.py [--shapes 16384x1000,128x10] [--dtypes float32,bfloat16] [--calls 20] [--trials 5]

Columns, per op, dtype, shape and candidate (softmax_kernels module flags, flipped in this process):
  kern ms   the kernel alone: a CUDA graph of --calls back-to-back raw launches (the planner's kernel, grid and
            arguments, into preallocated outputs) replayed --trials times, median / calls -- device time only,
            no host work (PyTorch's: a torch.cuda graph of its op, every kernel the op launches)
  %copy     the op's compulsory traffic (bench/kernels_gpu.py's: every input read once, every output written once,
            cross-entropy: the logits and the targets) over kern ms, against a 256 MiB device copy in this run
  call ms   one full primitive call back-to-back (CUDA events around many eager calls, as bench/kernels_gpu.py):
            max(host time, kernel time) -- where call ms >> kern ms the row is host-bound, not kernel-bound
  vs torch  PyTorch's time / ours, kernel-only and per call (> 1: ours faster)
Candidates (forward ops; the backward rows run the default tiling only):
  s6        MINIDNN_SOFTMAX_PIPE=0: session 6's kernels (one row a group, a grid of one row a group, no prefetch)
  s6cap16   the same with MINIDNN_SOFTMAX_FWD_CAP=16 (a 1000-class row on a 64-thread block, 16 elements a thread:
            session 6 run 16's best cross-entropy forward, 0.0347 ms)
  pipe      the default: PIPE kernels (persistent grid, next row's loads issued before the current row's reduction)
Back-to-back launches re-read the same logits: a bfloat16 (16384, 1000) tensor (32.8 MB) partly stays in the 50 MB
L2 between launches (PyTorch's rows alike).
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import kernels_gpu as K  # noqa: E402
from graph_timer import graph_time, torch_graph_time  # noqa: E402

import minidnn.backend as B  # noqa: E402
from minidnn.backend import devices as _dev  # noqa: E402
from minidnn.backend import softmax as _smx  # noqa: E402
from minidnn.backend.cuda import launch as _launch  # noqa: E402
from minidnn.backend.cuda import loss_kernels as _lk  # noqa: E402
from minidnn.backend.cuda import softmax_kernels as _sk  # noqa: E402

CANDIDATES = {"s6": dict(FWD_PIPE=False, FWD_CAP=None), "s6cap16": dict(FWD_PIPE=False, FWD_CAP=16),
              "pipe": dict(FWD_PIPE=True, FWD_CAP=None)}


def set_candidate(name):
    for k, v in CANDIDATES[name].items():
        setattr(_sk, k, v)
    _sk._plans.clear()
    _lk._plans.clear()
    for k, v in vars(_smx).items():            # the primitive's validated-call caches hold the plans
        if isinstance(v, dict) and "seen" in k.lower():
            v.clear()


# ---- the raw launches: the planner's choice (launch_spec) with preallocated outputs --------------------------------

def softmax_raw(cp, x, algo, backward=False, y=None, dy=None):
    rows, c = x.shape
    s = _sk.launch_spec(backward, x.shape, (1,), algo, x.dtype)
    dev = x.data.device_id
    prep = _launch.prepare(_sk._kernel(s.source, s.name, s.defines), _sk._grid(s.groups, dev, s.per_sm),
                           (s.block,), [None] * (3 if backward else 2) + [np.int32(rows), np.int32(c)], s.smem)
    out = cp.empty_like(x)
    if backward:
        return lambda: prep(y, dy, out)
    return lambda: prep(x, out)


def ce_raw(cp, x, t, backward=False, lse=None, den=None, g=None):
    rows, c = x.shape
    name = "ce_bwd" if backward else "ce_fwd"
    source, kname, defines, groups, per_sm, block = _lk.launch_spec(name, x.shape, x.dtype, t.dtype, False, "mean")
    dev = x.data.device_id
    grid = _lk._grid(groups, dev, per_sm)
    tail = [np.int32(rows), np.int32(c), np.int64(-100), np.float64(0.0)]
    prep = _launch.prepare(_lk._kernel(source, kname, defines), (grid,), (block,), [None] * (7 if backward else 9)
                           + tail)
    acc = np.float64 if x.dtype == np.float64 else np.float32
    if backward:
        dx = cp.empty_like(x)
        return lambda: prep(x, t, x, lse, g, den, dx)
    lse_o, loss, denom = cp.empty((rows,), acc), cp.empty((), x.dtype), cp.empty((), acc)
    partial, ticket = cp.empty((2 * grid,), acc), _lk._ticket(cp, dev)
    return lambda: prep(x, t, x, loss, lse_o, partial, ticket, loss, denom)


def knobs(shape, dtype):
    """The forward tiling in effect (G, NV, VEC, BLOCK, PIPE, MINB) and the grid, for the table."""
    s = _sk.launch_spec(False, shape, (1,), "LOG", dtype)
    d = dict(x.split("=") for x in s.defines)
    grid = _sk._grid(s.groups, _dev.require_cupy().cuda.runtime.getDevice(), s.per_sm)[0]
    return f"G={d['G']} E={int(d['NV']) * int(d['VEC'])} blk={d['BLOCK']} pipe={d['PIPE']} minb={d['MINB']} grid={grid}"


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="16384x1000,128x10")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--calls", type=int, default=20, help="launches a graph holds")
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--candidates", default=",".join(CANDIDATES))
    args = ap.parse_args(argv)
    gpu = K.open_gpu(args.trials, "softmax_s7")
    if gpu is None:
        return 0
    cp, torch, timer, bw = gpu
    print(f"device {cp.cuda.runtime.getDeviceProperties(cp.cuda.runtime.getDevice())['name'].decode()}; "
          f"copy bandwidth {bw:.0f} GB/s; graph of {args.calls} launches, median of {args.trials}")
    head = (f"{'op':16s} {'dtype':9s} {'shape':14s} {'variant':8s} {'kern ms':>8s} {'%copy':>6s} {'call ms':>8s} "
            f"{'torch kern':>10s} {'torch call':>10s} {'vs t kern':>9s} {'vs t call':>9s}")
    print(head)
    print("-" * len(head))
    cands = [c for c in args.candidates.split(",") if c]

    def f(v):
        return f"{v:.4f}" if v is not None else "-"

    def row(op, dname, shape, variant, kern, nbytes, call, tk, tc):
        pct = nbytes / (kern * 1e-3) / 1e9 / bw * 100 if kern else float("nan")
        vk = f"{tk / kern:.2f}x" if tk and kern else "-"
        vc = f"{tc / call:.2f}x" if tc and call else "-"
        print(f"{op:16s} {dname:9s} {'x'.join(map(str, shape)):14s} {variant:8s} {f(kern):>8s} {pct:5.0f}% "
              f"{f(call):>8s} {f(tk):>10s} {f(tc):>10s} {vk:>9s} {vc:>9s}")
        sys.stdout.flush()

    for dname in args.dtypes.split(","):
        cases = K.Cases(cp, torch, dname)
        for shape in [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",") if s]:
            n, c = shape
            x = cases.x(shape)
            dy = cases.x(shape)
            t = cp.asarray(np.random.default_rng(0).integers(0, c, n))
            e = x.size * cases.item
            tt = {}
            if torch is not None:
                xt, dyt = cases.t(shape, True), cases.t(shape)
                tgt = torch.randint(0, c, (n,), device=cases.tdev)
                yt = {a: (torch.log_softmax if a == "log" else torch.softmax)(xt, -1) for a in ("accurate", "log")}
                lt = torch.nn.functional.cross_entropy(xt, tgt)
                sm_b, lsm_b = torch._softmax_backward_data, torch._log_softmax_backward_data
                # op -> (what a graph holds: the kernels alone, None: not captured; a call as the bench times it)
                tfns = {"softmax fwd": (lambda: torch.softmax(xt, -1),) * 2,
                        "log-softmax fwd": (lambda: torch.log_softmax(xt, -1),) * 2,
                        "cross-entropy fwd": (lambda: torch.nn.functional.cross_entropy(xt, tgt),) * 2,
                        "softmax bwd": (lambda: sm_b(dyt, yt["accurate"], -1, xt.dtype),
                                        lambda: torch.autograd.grad(yt["accurate"], xt, dyt, retain_graph=True)),
                        "log-softmax bwd": (lambda: lsm_b(dyt, yt["log"], -1, xt.dtype),
                                            lambda: torch.autograd.grad(yt["log"], xt, dyt, retain_graph=True)),
                        "cross-entropy bwd": (None, lambda: torch.autograd.grad(lt, xt, retain_graph=True))}
                for op, (gfn, cfn) in tfns.items():
                    tk = None
                    try:
                        tk = None if gfn is None else torch_graph_time(torch, gfn, args.calls, args.trials)
                    except Exception as ex:     # noqa: BLE001 -- report, per call only
                        print(f"  (torch graph of {op} failed: {type(ex).__name__}: {ex})", file=sys.stderr)
                    tt[op] = (tk, timer.torch_(cfn))
            nt = (None, None)
            for cand in cands:
                set_candidate(cand)
                print(f"# {dname} {shape} {cand}: {knobs(shape, x.dtype)}")
                for algo, op in (("ACCURATE", "softmax fwd"), ("LOG", "log-softmax fwd")):
                    kern = graph_time(cp, softmax_raw(cp, x, algo), args.calls, args.trials)
                    call = timer.cupy(lambda a=algo.lower(): B.softmax_forward(None, a, None, x, axis=-1))
                    row(op, dname, shape, cand, kern, 2 * e, call, *tt.get(op, nt))
                kern = graph_time(cp, ce_raw(cp, x, t), args.calls, args.trials)
                call = timer.cupy(lambda: B.softmax_cross_entropy_forward(None, x, t))
                row("cross-entropy fwd", dname, shape, cand, kern, e + n * 8, call, *tt.get("cross-entropy fwd", nt))
            set_candidate("pipe")
            for algo, op in (("ACCURATE", "softmax bwd"), ("LOG", "log-softmax bwd")):
                y = B.softmax_forward(None, algo.lower(), None, x, axis=-1)
                kern = graph_time(cp, softmax_raw(cp, x, algo, True, y, dy), args.calls, args.trials)
                call = timer.cupy(lambda a=algo.lower(), y=y: B.softmax_backward(None, a, None, y, dy, axis=-1))
                row(op, dname, shape, "default", kern, 3 * e, call, *tt.get(op, nt))
            loss, lse, den = B.softmax_cross_entropy_forward(None, x, t)
            g = cases.full((), 1.0)
            kern = graph_time(cp, ce_raw(cp, x, t, True, lse, den, g), args.calls, args.trials)
            call = timer.cupy(lambda: B.softmax_cross_entropy_backward(None, x, t, g, lse, den))
            row("cross-entropy bwd", dname, shape, "default", kern, 2 * e + n * 12, call,
                *tt.get("cross-entropy bwd", nt))
    print("kern: device time of the kernel alone (graph of raw launches); call: a primitive call back-to-back "
          "(host-bound where call >> kern); vs t: PyTorch / ours (> 1: ours faster)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

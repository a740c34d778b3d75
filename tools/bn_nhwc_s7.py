"""Session 7's channels-last batch norm on the GPU, in one process: bn_nhwc V2 (the default) beside V1 (session 6's
kernels, MINIDNN_BN_NHWC_V2=0) and PyTorch's channels-last batch norm, at the example models' training shapes and
the large tensor, float32 and bfloat16 (docs/step_kernels.md, "Session 7: channels-last batch norm").

    PYTHONPATH=. python3 tools/bn_nhwc_s7.py [--dtypes float32,bfloat16] [--shapes ...] [--calls 40]
                                             [--large-calls 8] [--replays 5] [--no-phases] [--no-primitive]
    PYTHONPATH=. python3 tools/bn_nhwc_s7.py --stage-ab      # STAGE on / off only (bfloat16, model shapes, < 60 s)

Tables (ms per call unless said):
  kernel   device time per call: a CUDA graph of `calls` back-to-back calls (one launch each for ours, PyTorch's two
           kernels per direction), replayed `replays` times, CUDA events, median.  A graph node costs ~1 us of launch
           gap on top of the kernel itself, on both sides.  Columns: V1, V2 (one launch a direction), V2-two (V2's
           two-launch route, MINIDNN_BN_NHWC_ROUTE=two: reduction kernel + elementwise kernel, as PyTorch splits
           it), torch.  Ops: "bn fwd" / "bn bwd"; "relu bwd" the fused batch norm + ReLU backward (PyTorch: its
           ReLU backward kernel + its batch-norm backward, timed as relu(bn(x)) forward + backward less that
           forward: the models' steps run this pair, and run 1's profile counted only PyTorch's batch-norm kernels
           beside our fused one).  V2/torch < 1: V2 is faster.  %copy: the op's compulsory traffic (forward read
           x, write y; backward read x, dy, write dx; relu bwd also y) over the time, against a 256 MiB device
           copy measured in the same run.
  phases   V2's one-launch kernels built with STOP=1 (return after the reduction pass and the block's partial) and
           STOP=2 (return after the meeting): reduction / meeting / elementwise pass by difference, per shape
           (the compiler may drop the on-chip copy's shared stores from the STOP=1 build, nothing reading them:
           the reduction figure can be a little low).
  per step the models' sum over their batch-norm layers (ResNet-20 b128: 7 layers at each of C = 16 @ 32x32,
           32 @ 16x16, 64 @ 8x8; MobileNet-small b128: 9 layers) of forward + backward kernel time, beside
           PyTorch's (in parentheses: forward + the ReLU-fused backward, PyTorch's ReLU backward included), to hold
           against run 1's profile (bnc_fwd1 + bnc_bwd1 against PyTorch's four batch-norm kernels).
  primitive  per call through the backend primitive (batch_normalization_forward_training / _backward on a
           channels-last CuPy array), eager back-to-back calls timed by CUDA events: host work included (the
           eager step is host-bound: V2 must not cost more here), F.batch_norm eager beside it.
  --stage-ab  (replaces the tables above) the constants after the meeting (bn_nhwc.STAGE, MINIDNN_BN_NHWC_STAGE):
           V2 with STAGE = 0 (every thread __ldcg-loads its VEC channels' constants) and STAGE = 1 (once per block
           through shared memory), bf16 forward / backward / ReLU-fused backward, beside V2's two-launch route and
           PyTorch; then the backward's phases with STOP=3 (return after the constants are loaded, their loads kept):
           reduction | + meeting | + constants | + elementwise, per setting.  14 NVRTC compiles per dtype (about
           40 s on an H100, less where the cuda tests compiled the same kernels: CuPy's disk cache).
Expected device time on an H100: about 100 s (NVRTC compiles 28 kernels: 2 dtypes x fwd/bwd/relu-bwd x V1/V2, the
two-launch route's 4 kernels per dtype, the 8 phase builds).  PyTorch is imported here only (the yardstick).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bn_nhwc_bench import _cl, _dtype, copy_bandwidth  # noqa: E402
from graph_timer import graph_time, torch_graph_time  # noqa: E402

import minidnn.backend as B  # noqa: E402
from minidnn.backend import devices as _dev  # noqa: E402
from minidnn.backend.cuda import bn_kernels as K  # noqa: E402
from minidnn.backend.cuda import bn_nhwc as M  # noqa: E402

# (shape, layers in ResNet-20, layers in MobileNet-small)
MODEL_SHAPES = {(128, 16, 32, 32): (7, 2), (128, 32, 32, 32): (0, 1), (128, 32, 16, 16): (7, 1),
                (128, 64, 16, 16): (0, 3), (128, 64, 8, 8): (7, 1), (128, 128, 8, 8): (0, 1)}
LARGE = (128, 64, 56, 56)
SHAPES = ",".join("x".join(map(str, s)) for s in (*MODEL_SHAPES, LARGE))


def _set_v2(on):
    M.V2 = on
    M._calls.clear()
    K._calls.clear()


def _open(settings):
    """CuPy, PyTorch (cudnn.benchmark on; None where absent) and the copy bandwidth, after the device header line."""
    cp = _dev.require_cupy()
    try:
        import torch
        torch.backends.cudnn.benchmark = True
    except ImportError:
        torch = None
    bw = copy_bandwidth(cp)
    dev = cp.cuda.Device()
    print(f"# device {cp.cuda.runtime.getDeviceProperties(dev.id)['name'].decode()}, {M._launch.sm_count(dev.id)} SMs, "
          f"copy bandwidth {bw:.0f} GB/s; bn_nhwc ROUTE {M.ROUTE}, ONCHIP {M.ONCHIP}{settings}")
    return cp, torch, bw


def _torch_times(torch, case, calls, replays):
    """PyTorch channels_last ms per call: bn fwd, bn bwd, and (relu bwd) its ReLU backward (threshold_backward) +
    batch-norm backward -- what our fused backward does; {} without PyTorch."""
    if torch is None:
        return {}
    tt = {"bn fwd": torch_graph_time(torch, case.t_fwd, calls, replays)}
    tt["bn bwd"] = torch_graph_time(torch, case.t_both, calls, replays) - tt["bn fwd"]
    tt["relu bwd"] = (torch_graph_time(torch, lambda: case.t_both(True), calls, replays)
                      - torch_graph_time(torch, case.t_fwd_relu, calls, replays))
    return tt


def _our_times(cp, case, op, variants, set_fn, calls, replays):
    """{label: ms per call} of ``op`` for each (label, setting, route) of ``variants``: ``set_fn(setting)`` and the
    route set around the timing; the two-launch route has no ReLU-fused backward."""
    res = {}
    for label, setting, route in variants:
        if route == "two" and op == "relu bwd":
            continue
        set_fn(setting)
        saved_route, M.ROUTE = M.ROUTE, route
        try:
            fn = case.fwd if op == "bn fwd" else case.bwd_fn(op == "relu bwd")
            res[label] = graph_time(cp, fn, calls, replays)
        finally:
            M.ROUTE = saved_route
    return res


def _set_stage(on):
    M.STAGE = on
    M._calls.clear()
    K._calls.clear()


def eager_time(cp, fn, calls, replays):
    fn()
    cp.cuda.Device().synchronize()
    times = []
    for _ in range(replays):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record()
        for _ in range(calls):
            fn()
        b.record()
        b.synchronize()
        times.append(cp.cuda.get_elapsed_time(a, b) / calls)
    return statistics.median(times)


class Case:
    """One (shape, dtype): the arrays on both sides and the calls to time."""

    def __init__(self, cp, torch, shape, name, rng):
        self.cp, self.shape, self.name = cp, shape, name
        c = shape[1]
        dt = _dtype(name)
        x = (rng.standard_normal(shape) * 1.5 + 1).astype(dt)
        dy = rng.standard_normal(shape).astype(dt)
        self.x, self.dy = _cl(cp, x), _cl(cp, dy)
        self.s, self.b = cp.ones(c, np.float32), cp.zeros(c, np.float32)
        self.rm, self.rv, self.cnt = cp.zeros(c, np.float32), cp.ones(c, np.float32), cp.zeros((1,), np.int64)
        self.e = self.x.nbytes
        self.torch = None
        if torch is not None:
            tdt = getattr(torch, name)
            self.xt = torch.from_numpy(x.astype(np.float32)).to("cuda", tdt).contiguous(
                memory_format=torch.channels_last).requires_grad_()
            self.dyt = torch.from_numpy(dy.astype(np.float32)).to("cuda", tdt).contiguous(
                memory_format=torch.channels_last)
            self.wt = torch.ones(c, device="cuda", requires_grad=True)
            self.bt = torch.zeros(c, device="cuda", requires_grad=True)
            self.rmt, self.rvt = torch.zeros(c, device="cuda"), torch.ones(c, device="cuda")
            self.torch = torch

    # ours, through the module's own entry points (one launch per direction)
    def fwd(self):
        return M.forward_training(self.x, self.s, self.b, 0.1, self.rm, self.rv, 1e-5, counter=self.cnt)

    def saved(self):
        # the plain forward's y masks the fused backward too (mixed signs): no ReLU forward to compile
        return M.forward_training(self.x, self.s, self.b, 0.1, None, None, 1e-5)

    def bwd_fn(self, relu):
        y, m, i = self.saved()
        return lambda: M.backward(self.x, self.dy, self.s, m, i, y=y if relu else None)

    def phase_fns(self, stop, stage=None):
        """The V2 forward / backward built with STOP = stop (call objects made here: the caches stay clean);
        ``stage``: STAGE for these builds (None: the module's)."""
        extra = {} if stage is None else dict(stage=bool(stage))
        flags = dict(relu=False, has_z=False, has_scale=True, has_bias=True, stop=stop, **extra)
        t = M.TrainingCall()
        t._settle(self.x, self.x.data.device_id, "one", (0.1, 1e-5, True, True, flags))
        bflags = dict(relu=False, has_z=False, has_scale=True, stop=stop, **extra)
        b = M.BackwardCall()
        b._settle(self.x, self.x.data.device_id, "one", bflags)
        y, m, i = self.saved()
        return (lambda: t.run(self.x, None, self.s, self.b, self.rm, self.rv, self.cnt),
                lambda: b.run(self.x, self.dy, self.s, m, i, None))

    # PyTorch
    def t_fwd(self):
        F = self.torch.nn.functional
        return F.batch_norm(self.xt.detach(), self.rmt, self.rvt, self.wt.detach(), self.bt.detach(), True, 0.1,
                            1e-5)

    def t_both(self, relu=False):
        F = self.torch.nn.functional
        y = F.batch_norm(self.xt, self.rmt, self.rvt, self.wt, self.bt, True, 0.1, 1e-5)
        if relu:
            y = F.relu(y)
        return self.torch.autograd.grad(y, (self.xt, self.wt, self.bt), self.dyt)

    def t_fwd_relu(self):
        return self.torch.nn.functional.relu(self.t_fwd())

    # the primitives (host work included)
    def p_fwd(self):
        return B.batch_normalization_forward_training(None, "spatial", self.x, self.s, self.b, 0.1, self.rm,
                                                      self.rv, 1e-5)

    def p_bwd_fn(self):
        y, m, i = self.p_fwd()
        return lambda: B.batch_normalization_backward(None, "spatial", self.x, self.dy, self.s, m, i, 1e-5)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--calls", type=int, default=40)
    ap.add_argument("--large-calls", type=int, default=8)
    ap.add_argument("--replays", type=int, default=5)
    ap.add_argument("--no-phases", action="store_true")
    ap.add_argument("--no-primitive", action="store_true")
    ap.add_argument("--stage-ab", action="store_true", help="STAGE on / off only (see the docstring)")
    args = ap.parse_args(argv)
    if args.stage_ab:
        return stage_ab(args)
    t_start = time.perf_counter()
    cp, torch, bw = _open("")
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    rng = np.random.default_rng(0)
    kern = {}          # (shape, dtype, op) -> {"V1": ms, "V2": ms, "torch": ms}
    print("\n== kernel: ms per call, CUDA graph of back-to-back calls (%copy of the compulsory traffic)")
    head = (f"{'shape':>16} {'dtype':>8} {'op':>8} | {'V1':>14} | {'V2':>14} | {'V2-two':>14} | {'torch':>14} | "
            "V2/V1  V2/torch")
    print(head)
    print("-" * len(head))
    cases = {}
    for shape in shapes:
        calls = args.calls if np.prod(shape) <= 8 * 2 ** 20 else args.large_calls
        for name in args.dtypes.split(","):
            case = cases[shape, name] = Case(cp, torch, shape, name, rng)
            e = case.e
            tt = _torch_times(torch, case, calls, args.replays)
            for op, nbytes in (("bn fwd", 2 * e), ("bn bwd", 3 * e), ("relu bwd", 4 * e)):
                res = _our_times(cp, case, op, (("V1", False, "one"), ("V2", True, "one"), ("V2-two", True, "two")),
                                 _set_v2, calls, args.replays)
                if op in tt:
                    res["torch"] = tt[op]
                kern[shape, name, op] = res

                def cell(ms):
                    if ms is None:
                        return f"{'-':>14}"
                    return f"{ms * 1e3:7.1f}us {100 * nbytes / (ms * 1e-3) / 1e9 / bw:3.0f}%"
                r1 = res["V2"] / res["V1"]
                rt = f"{res['V2'] / res['torch']:6.2f}" if "torch" in res else "     -"
                print(f"{'x'.join(map(str, shape)):>16} {name:>8} {op:>8} | {cell(res['V1'])} | {cell(res['V2'])} | "
                      f"{cell(res.get('V2-two'))} | {cell(res.get('torch'))} | {r1:5.2f}  {rt}", flush=True)
    _set_v2(True)

    print("\n== per step: sum over the models' batch-norm layers of bn fwd + bn bwd (relu bwd in parentheses), us")
    for model, col in (("ResNet-20 b128", 0), ("MobileNet-small b128", 1)):
        for name in args.dtypes.split(","):
            tot = {"V1": 0.0, "V2": 0.0, "torch": 0.0, "V1r": 0.0, "V2r": 0.0, "torchr": 0.0}
            missing = False
            for shape, counts in MODEL_SHAPES.items():
                n = counts[col]
                if not n:
                    continue
                if (shape, name, "bn fwd") not in kern:
                    missing = True
                    continue
                f, b, r = kern[shape, name, "bn fwd"], kern[shape, name, "bn bwd"], kern[shape, name, "relu bwd"]
                for k in ("V1", "V2"):
                    tot[k] += n * (f[k] + b[k]) * 1e3
                    tot[k + "r"] += n * (f[k] + r[k]) * 1e3
                tot["torch"] += n * (f.get("torch", 0) + b.get("torch", 0)) * 1e3
                tot["torchr"] += n * (f.get("torch", 0) + r.get("torch", 0)) * 1e3
            if missing:
                print(f"  {model} {name}: shapes missing from --shapes")
                continue
            print(f"  {model:>21} {name:>8}: V1 {tot['V1']:7.0f} ({tot['V1r']:5.0f})  V2 {tot['V2']:7.0f} "
                  f"({tot['V2r']:5.0f})  torch {tot['torch']:7.0f} ({tot['torchr']:5.0f})")

    if not args.no_phases:
        print("\n== phases of V2's one-launch kernels, us per call (graph): reduction | + meeting | + elementwise")
        for (shape, name), case in cases.items():
            calls = args.calls if np.prod(shape) <= 8 * 2 ** 20 else args.large_calls
            if name != "bfloat16" and shape not in (LARGE, (128, 16, 32, 32)):
                continue            # float32 phases for the large tensor and C = 16 only (NVRTC time)
            f1, b1 = case.phase_fns(1)
            f2, b2 = case.phase_fns(2)
            full_f, full_b = kern[shape, name, "bn fwd"]["V2"], kern[shape, name, "bn bwd"]["V2"]
            for op, p1, p2, full in (("fwd", f1, f2, full_f), ("bwd", b1, b2, full_b)):
                t1 = graph_time(cp, p1, calls, args.replays) * 1e3
                t2 = graph_time(cp, p2, calls, args.replays) * 1e3
                print(f"  {'x'.join(map(str, shape)):>16} {name:>8} {op}: {t1:6.1f} | {t2 - t1:+6.1f} | "
                      f"{full * 1e3 - t2:+6.1f}  (total {full * 1e3:6.1f})", flush=True)

    if not args.no_primitive:
        print("\n== primitive: us per eager call (host included), CUDA events over back-to-back calls")
        for (shape, name), case in cases.items():
            if np.prod(shape) > 8 * 2 ** 20:
                continue
            row = []
            for on in (False, True):
                _set_v2(on)
                row.append(eager_time(cp, case.p_fwd, 50, args.replays) * 1e3)
                row.append(eager_time(cp, case.p_bwd_fn(), 50, args.replays) * 1e3)
            tf = ""
            if torch is not None:
                ts = []
                for fn in (case.t_fwd, case.t_both):
                    for _ in range(3):
                        fn()
                    torch.cuda.synchronize()
                    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    a.record()
                    for _ in range(50):
                        fn()
                    b.record()
                    b.synchronize()
                    ts.append(a.elapsed_time(b) / 50 * 1e3)
                tf = f" | torch fwd {ts[0]:6.1f} fwd+bwd {ts[1]:6.1f}"
            print(f"  {'x'.join(map(str, shape)):>16} {name:>8}: V1 fwd {row[0]:6.1f} bwd {row[1]:6.1f} | V2 fwd "
                  f"{row[2]:6.1f} bwd {row[3]:6.1f}{tf}", flush=True)
        _set_v2(True)
    print(f"\n# {time.perf_counter() - t_start:.0f} s in all")


def stage_ab(args):
    """--stage-ab: V2 with the constants after the meeting loaded per thread (STAGE = 0) or once per block through
    shared memory (STAGE = 1), bfloat16 unless --dtypes says otherwise, the model shapes unless --shapes does."""
    t_start = time.perf_counter()
    cp, torch, bw = _open(f", V2 {M.V2}, STAGE {M.STAGE}")
    shapes = ([tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")] if args.shapes != SHAPES
              else list(MODEL_SHAPES))
    dtypes = args.dtypes.split(",") if args.dtypes != "float32,bfloat16" else ["bfloat16"]
    rng = np.random.default_rng(0)
    saved_stage = M.STAGE
    _set_v2(True)
    print("\n== kernel: us per call, CUDA graph of back-to-back calls (%copy of the compulsory traffic)")
    head = (f"{'shape':>16} {'dtype':>8} {'op':>8} | {'STAGE=0':>14} | {'STAGE=1':>14} | {'V2-two':>14} | "
            f"{'torch':>14} | S1/S0  S1/torch")
    print(head)
    print("-" * len(head))

    def cell(ms, nbytes):
        if ms is None:
            return f"{'-':>14}"
        return f"{ms * 1e3:7.1f}us {100 * nbytes / (ms * 1e-3) / 1e9 / bw:3.0f}%"

    cases = []
    for shape in shapes:
        calls = args.calls if np.prod(shape) <= 8 * 2 ** 20 else args.large_calls
        for name in dtypes:
            case = Case(cp, torch, shape, name, rng)
            cases.append((shape, name, case, calls))
            e = case.e
            tt = _torch_times(torch, case, calls, args.replays)
            for op, nbytes in (("bn bwd", 3 * e), ("relu bwd", 4 * e), ("bn fwd", 2 * e)):
                res = _our_times(cp, case, op, (("S0", False, "one"), ("S1", True, "one"), ("two", True, "two")),
                                 _set_stage, calls, args.replays)
                rt = f"{res['S1'] / tt[op]:6.2f}" if op in tt else "     -"
                print(f"{'x'.join(map(str, shape)):>16} {name:>8} {op:>8} | {cell(res['S0'], nbytes)} | "
                      f"{cell(res['S1'], nbytes)} | {cell(res.get('two'), nbytes)} | {cell(tt.get(op), nbytes)} | "
                      f"{res['S1'] / res['S0']:5.2f}  {rt}", flush=True)
    _set_stage(saved_stage)

    print("\n== phases of V2's one-launch backward, us per call (graph): reduction | + meeting | + constants | "
          "+ elementwise  (STOP 1 / 2 built with STAGE=0: no constants loaded; STOP=3 and the full kernel per setting)")
    for shape, name, case, calls in cases:
        t1 = graph_time(cp, case.phase_fns(1, stage=False)[1], calls, args.replays) * 1e3
        t2 = graph_time(cp, case.phase_fns(2, stage=False)[1], calls, args.replays) * 1e3
        for stage in (False, True):
            t3 = graph_time(cp, case.phase_fns(3, stage=stage)[1], calls, args.replays) * 1e3
            _set_stage(stage)
            full = graph_time(cp, case.bwd_fn(False), calls, args.replays) * 1e3
            print(f"  {'x'.join(map(str, shape)):>16} {name:>8} bwd STAGE={int(stage)}: {t1:6.1f} | {t2 - t1:+6.1f} | "
                  f"{t3 - t2:+6.1f} | {full - t3:+6.1f}  (total {full:6.1f})", flush=True)
    _set_stage(saved_stage)
    print(f"\n# {time.perf_counter() - t_start:.0f} s in all")


if __name__ == "__main__":
    main()

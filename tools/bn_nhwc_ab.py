"""Session 12's A/B of the channels-last batch-norm MIX order (bn_nhwc.MIX, MINIDNN_BN_NHWC_MIX; docs/step_kernels.md,
"Session 12: channels-last batch norm") in ONE process: the default one-launch kernels (off) and MIX (on, forward
and backward) at (128, 64, 56, 56) float32 / bfloat16 and two of the example models' shapes, PyTorch channels_last
beside.

    PYTHONPATH=. python3 tools/bn_nhwc_ab.py [--rounds 3] [--calls 10] [--small-calls 40] [--replays 5]
                                              [--dtypes float32,bfloat16] [--no-phases]

Per call, device time: a CUDA graph of `calls` back-to-back calls replayed `replays` times (CUDA events, median);
the settings are alternated within each round (their order reversed every other round) and the table gives the
median over rounds.  Settings: off (the default), on (MIX: period 4, 6 far vectors prefetched); on the large shape
also p2 (period 2), p1 (period 1: the default order, with the prefetch and the extra slot) and pf0 (period 4, no
prefetch) -- kernel arguments, no extra compile; small shapes off / on only (their walks fit the on-chip copy).
Ops: "bn fwd" (training forward with running statistics), "bn bwd", "add+relu bwd" (the fused batch norm + add +
ReLU backward: y's mask, dz; PyTorch: relu(bn(x) + z)'s backward, its ReLU backward kernel included, timed as
forward + backward less the forward).  off/on > 1: MIX faster; torch/on > 1: MIX faster than PyTorch.  %copy: the
op's compulsory traffic (fwd 2e, bwd 3e, add+relu bwd 5e; e = x's bytes) over the time, against a 256 MiB device
copy measured here.  Phases (float32 large backward, both settings): the kernel built with STOP=1 (return after the
reduction pass) and STOP=2 (after the meeting): reduction / meeting / elementwise by difference.
NVRTC compiles 12 kernels (fwd, bwd, add+relu bwd x 2 settings x 2 dtypes) + 4 phase builds: about 60-90 s of the
run; the timings about 20 s.  PyTorch is imported here only (the yardstick).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bn_nhwc_bench import _cl, _dtype, copy_bandwidth  # noqa: E402
from graph_timer import graph_time, torch_graph_time  # noqa: E402

from minidnn.backend import devices as _dev  # noqa: E402
from minidnn.backend.cuda import bn_kernels as K  # noqa: E402
from minidnn.backend.cuda import bn_nhwc as M  # noqa: E402

LARGE = (128, 64, 56, 56)
SMALL = [(128, 16, 32, 32), (128, 64, 8, 8)]
OPS = ("bn fwd", "bn bwd", "add+relu bwd")
TRAFFIC = {"bn fwd": 2, "bn bwd": 3, "add+relu bwd": 5}
BOTH = frozenset({"fwd", "bwd"})
# label -> (bn_nhwc.MIX, MIX_P, MIX_PF): "on" is the candidate (period 4, 6 vectors prefetched); on the large shape
# also period 2, period 1 (the default order with the prefetch and the extra slot) and no prefetch -- kernel
# arguments, no more compiles
SETTINGS = {"off": (frozenset(), 4, 6), "on": (BOTH, 4, 6), "p2": (BOTH, 2, 6), "p1": (BOTH, 1, 6),
            "pf0": (BOTH, 4, 0),
            # diagnostics (--diag): the default order with the extra slot only; and oldest first (one near vector,
            # then the uncached ones from the oldest up, no prefetch) -- if that is as fast as newest first, the
            # elementwise pass gets nothing from the reduction's tail in L2
            "p1pf0": (BOTH, 1, 0), "old1st": (BOTH, 1 << 30, 0)}
DIAG = ("p1pf0", "old1st")
SMALL_SETTINGS = ("off", "on")


def set_mix(setting):
    M.MIX, M.MIX_P, M.MIX_PF = setting
    M._calls.clear()
    K._calls.clear()


class Case:
    """One (shape, dtype): our arrays and calls, PyTorch's beside."""

    def __init__(self, cp, torch, shape, name, rng):
        self.shape, self.name = shape, name
        c = shape[1]
        dt = _dtype(name)
        x = (rng.standard_normal(shape) * 1.5 + 1).astype(dt)
        dy = rng.standard_normal(shape).astype(dt)
        self.x, self.dy = _cl(cp, x), _cl(cp, dy)
        self.s, self.b = cp.asarray(np.ones(c, np.float32)), cp.asarray(np.zeros(c, np.float32))
        self.rm, self.rv = cp.asarray(np.zeros(c, np.float32)), cp.asarray(np.ones(c, np.float32))
        self.cnt = cp.asarray(np.zeros((1,), np.int64))
        self.e = self.x.nbytes
        self.torch = torch
        if torch is not None:
            tdt = getattr(torch, name)

            def t(a, grad=False):
                return torch.from_numpy(a.astype(np.float32)).to("cuda", tdt).contiguous(
                    memory_format=torch.channels_last).requires_grad_(grad)
            self.xt, self.dyt = t(x, True), t(dy)
            self.zt = t(rng.standard_normal(shape), True)
            self.wt = torch.ones(c, device="cuda", requires_grad=True)
            self.bt = torch.zeros(c, device="cuda", requires_grad=True)
            self.rmt, self.rvt = torch.zeros(c, device="cuda"), torch.ones(c, device="cuda")

    def fwd(self):
        return M.forward_training(self.x, self.s, self.b, 0.1, self.rm, self.rv, 1e-5, counter=self.cnt)

    def fn(self, op):
        if op == "bn fwd":
            return self.fwd
        # the plain forward's y masks the fused backward (mixed signs): no fused forward to compile
        y, m, i = M.forward_training(self.x, self.s, self.b, 0.1, None, None, 1e-5)
        if op == "bn bwd":
            return lambda: M.backward(self.x, self.dy, self.s, m, i)
        return lambda: M.backward(self.x, self.dy, self.s, m, i, y=y, want_dz=True)

    def phase_fns(self, stop):
        """The plain backward built with STOP = stop under the module's MIX (a call object made here)."""
        flags = dict(relu=False, has_z=False, has_scale=True, stop=stop)
        b = M.BackwardCall()
        b._settle(self.x, self.x.data.device_id, "one", flags)
        y, m, i = M.forward_training(self.x, self.s, self.b, 0.1, None, None, 1e-5)
        return lambda: b.run(self.x, self.dy, self.s, m, i, None)

    # PyTorch
    def _t_fwd(self, add):
        F = self.torch.nn.functional
        y = F.batch_norm(self.xt, self.rmt, self.rvt, self.wt, self.bt, True, 0.1, 1e-5)
        return F.relu(y + self.zt) if add else y

    def torch_times(self, calls, replays):
        if self.torch is None:
            return {}
        torch = self.torch
        with torch.no_grad():
            fwd = torch_graph_time(torch, lambda: self._t_fwd(False), calls, replays)
            fwd_add = torch_graph_time(torch, lambda: self._t_fwd(True), calls, replays)
        both = torch_graph_time(torch, lambda: torch.autograd.grad(self._t_fwd(False), (self.xt, self.wt, self.bt),
                                                                   self.dyt), calls, replays)
        both_add = torch_graph_time(torch, lambda: torch.autograd.grad(
            self._t_fwd(True), (self.xt, self.zt, self.wt, self.bt), self.dyt), calls, replays)
        return {"bn fwd": fwd, "bn bwd": both - fwd, "add+relu bwd": both_add - fwd_add}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=10, help="calls per graph, large shape")
    ap.add_argument("--small-calls", type=int, default=40, help="calls per graph, small shapes")
    ap.add_argument("--replays", type=int, default=5)
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--no-phases", action="store_true")
    ap.add_argument("--diag", action="store_true", help="the large shape only, settings off, p1, p1pf0, old1st "
                    "(and the phases of off and old1st): does the elementwise pass get anything from L2?")
    a = ap.parse_args(argv)
    cp = _dev.require_cupy()
    try:
        import torch
        torch.backends.cudnn.benchmark = True
    except ImportError:
        torch = None
    bw = copy_bandwidth(cp)
    dev = cp.cuda.Device()
    print(f"# device {cp.cuda.runtime.getDeviceProperties(dev.id)['name'].decode()}, {M._launch.sm_count(dev.id)} "
          f"SMs, smem {M.smem_limits(dev.id)}, copy bandwidth {bw:.0f} GB/s; ROUTE {M.ROUTE}, ONCHIP {M.ONCHIP}, "
          f"MIX at start {sorted(M.MIX)}; torch {getattr(torch, '__version__', None)}")
    if M.ROUTE != "one" or not M.ONCHIP:
        print("# MIX needs ROUTE one and ONCHIP (the defaults): nothing to compare", file=sys.stderr)
        return 1
    rng = np.random.default_rng(0)
    shapes = (LARGE,) if a.diag else (LARGE, *SMALL)
    large_labels = ["off", "p1", *DIAG] if a.diag else [k for k in SETTINGS if k not in DIAG]
    cases = [Case(cp, torch, shape, name, rng) for name in a.dtypes.split(",") for shape in shapes]
    times = {}          # (case index, op, setting) -> [ms per round]
    for r in range(a.rounds):
        for ci, case in enumerate(cases):
            labels = list(large_labels) if case.shape == LARGE else list(SMALL_SETTINGS)
            order = labels if r % 2 == 0 else labels[::-1]
            calls = a.calls if case.shape == LARGE else a.small_calls
            for op in OPS:
                for label in order:
                    set_mix(SETTINGS[label])
                    t = graph_time(cp, case.fn(op), calls, a.replays)
                    times.setdefault((ci, op, label), []).append(float("nan") if t is None else t)
    tt = {}
    for ci, case in enumerate(cases):
        calls = a.calls if case.shape == LARGE else a.small_calls
        tt[ci] = case.torch_times(calls, a.replays)
    set_mix(SETTINGS["off"])
    print("# ms per call (median over rounds, settings alternated); off/on > 1: MIX faster; torch/on > 1: MIX faster "
          "than PyTorch")
    print(f"{'shape':>16} {'dtype':>9} {'op':>13} | {'off':>8} {'on':>8} {'off/on':>7} {'on %copy':>8} | "
          f"{'torch':>8} {'torch/off':>9} {'torch/on':>8} | rounds on")
    on_label = "old1st" if a.diag else "on"
    if a.diag:
        print("# --diag: the 'on' columns are old1st (oldest first)")
    for ci, case in enumerate(cases):
        for op in OPS:
            off = statistics.median(times[(ci, op, "off")])
            on = statistics.median(times[(ci, op, on_label)])
            t = tt[ci].get(op, float("nan"))
            pct = TRAFFIC[op] * case.e / (on * 1e-3) / 1e9 / bw * 100
            rounds = " ".join(f"{v:.4f}" for v in times[(ci, op, on_label)])
            print(f"{'x'.join(map(str, case.shape)):>16} {case.name:>9} {op:>13} | {off:8.4f} {on:8.4f} "
                  f"{off / on:7.3f} {pct:7.0f}% | {t:8.4f} {t / off:9.3f} {t / on:8.3f} | {rounds}")
    print("# the large shape, every setting: ms (off / setting)")
    for ci, case in enumerate(cases):
        if case.shape != LARGE:
            continue
        for op in OPS:
            off = statistics.median(times[(ci, op, "off")])
            cells = "  ".join(f"{lab} {statistics.median(times[(ci, op, lab)]):.4f} "
                              f"({off / statistics.median(times[(ci, op, lab)]):.3f})" for lab in large_labels)
            print(f"  {case.name:>9} {op:>13}: {cells}")
    if not a.no_phases and "float32" in a.dtypes.split(","):
        case = next(c for c in cases if c.shape == LARGE and c.name == "float32")
        print("# phases, float32 (128, 64, 56, 56) plain backward (STOP=1: reduction; STOP=2: + meeting): ms")
        for label in (("off", "old1st") if a.diag else SMALL_SETTINGS):
            set_mix(SETTINGS[label])
            p1 = graph_time(cp, case.phase_fns(1), a.calls, a.replays)
            p2 = graph_time(cp, case.phase_fns(2), a.calls, a.replays)
            full = graph_time(cp, case.fn("bn bwd"), a.calls, a.replays)
            print(f"  {label:>3}: reduction {p1:.4f} | meeting {p2 - p1:.4f} | elementwise {full - p2:.4f} | "
                  f"whole {full:.4f}")
        set_mix(SETTINGS["off"])
    return 0


if __name__ == "__main__":
    sys.exit(main())

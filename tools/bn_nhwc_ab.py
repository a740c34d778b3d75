"""Session 12's A/B of the channels-last batch-norm default (docs/step_kernels.md, "Session 12: channels-last batch
norm") in ONE process: the default one-launch kernels -- KEEP (bn_nhwc.KEEP: L2 eviction policies, the reduction
pass's newest steps evict-last, 0.40 of L2) where the call's data exceeds the device's L2, the kernel without it
below -- against KEEP off (MINIDNN_BN_NHWC_KEEP=0), forward, backward and the fused add+relu backward, at
(128, 64, 56, 56) float32 / bfloat16 (over L2: KEEP) and two of the example models' shapes (under: the same kernel
both ways, so the ratio there is the A/B's noise), PyTorch channels_last beside.

    PYTHONPATH=. python3 tools/bn_nhwc_ab.py [--rounds 3] [--calls 10] [--small-calls 40] [--replays 5]
                                              [--dtypes float32,bfloat16] [--variants]

Per call, device time: a CUDA graph of `calls` back-to-back calls replayed `replays` times (CUDA events, median);
the settings are alternated within each round (their order reversed every other round) and the table gives the
median over rounds.  Settings (KEEP, KEEP_FRAC, KEEP_LAST): off (no KEEP anywhere), default (the module's: KEEP where
the rule says); with --variants on the large shape also -- kernel arguments of the KEEP build, no compile -- keepn
(the tail evict-normal) and keep65 (0.65 of L2, round 2's default).  The "keep" column says whether the default took
KEEP for the case (bn_nhwc.keep_call on this device).  Ops: "bn fwd" (training forward with running statistics),
"bn bwd", "add+relu bwd" (the fused batch norm + add + ReLU backward: y's mask, dz; PyTorch: relu(bn(x) + z)'s
backward, its ReLU backward kernel included, timed as forward + backward less the forward).  off/default > 1: the
default faster; torch/default > 1: faster than PyTorch.  %copy: the op's compulsory traffic (fwd 2e, bwd 3e, add+relu
bwd 5e; e = x's bytes) over the default's time, against a 256 MiB device copy measured here.
NVRTC compiles 12 kernels (fwd, bwd, add+relu bwd x with / without KEEP x 2 dtypes): about 30-45 s of the run; the
timings about 20 s.  PyTorch is imported here only (the yardstick).
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
NONE = frozenset()
# label -> (KEEP, KEEP_FRAC, KEEP_LAST)
SETTINGS = {"off": (NONE, M.KEEP_FRAC, M.KEEP_LAST), "default": (M.KEEP, M.KEEP_FRAC, M.KEEP_LAST),
            "keepn": (BOTH, M.KEEP_FRAC, 0), "keep65": (BOTH, 0.65, 1)}
MAIN = ("off", "default")
EXTRA = ("keepn", "keep65")


def set_setting(label):
    M.KEEP, M.KEEP_FRAC, M.KEEP_LAST = SETTINGS[label]
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

    def takes_keep(self, op):
        rows, c = self.x.size // self.shape[1], self.shape[1]
        flags = dict(has_scale=True, relu=op == "add+relu bwd", has_z=op == "add+relu bwd")
        return M.keep_call(op == "bn fwd", self.x.dtype, rows, c, flags, self.x.data.device_id)

    def fn(self, op):
        if op == "bn fwd":
            return self.fwd
        # the plain forward's y masks the fused backward (mixed signs): no fused forward to compile
        y, m, i = M.forward_training(self.x, self.s, self.b, 0.1, None, None, 1e-5)
        if op == "bn bwd":
            return lambda: M.backward(self.x, self.dy, self.s, m, i)
        return lambda: M.backward(self.x, self.dy, self.s, m, i, y=y, want_dz=True)

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


def _med(v):
    return statistics.median(v)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=10, help="calls per graph, large shape")
    ap.add_argument("--small-calls", type=int, default=40, help="calls per graph, small shapes")
    ap.add_argument("--replays", type=int, default=5)
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--variants", action="store_true", help="keepn, keep65 on the large shape")
    a = ap.parse_args(argv)
    cp = _dev.require_cupy()
    try:
        import torch
        torch.backends.cudnn.benchmark = True
    except ImportError:
        torch = None
    bw = copy_bandwidth(cp)
    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    print(f"# device {props['name'].decode()}, {M._launch.sm_count(dev.id)} SMs, smem {M.smem_limits(dev.id)}, "
          f"L2 {M.l2_info(dev.id)}, copy bandwidth {bw:.0f} GB/s; ROUTE {M.ROUTE}, ONCHIP {M.ONCHIP}, default KEEP "
          f"{sorted(M.KEEP)} frac {M.KEEP_FRAC} last {M.KEEP_LAST} above {M.KEEP_ABOVE}; "
          f"torch {getattr(torch, '__version__', None)}")
    if M.ROUTE != "one" or not M.ONCHIP:
        print("# KEEP needs ROUTE one and ONCHIP (the defaults): nothing to compare", file=sys.stderr)
        return 1
    if not M.KEEP:
        print("# MINIDNN_BN_NHWC_KEEP is off in this environment: default = off", file=sys.stderr)
    extra = list(EXTRA) if a.variants else []
    rng = np.random.default_rng(0)
    cases = [Case(cp, torch, shape, name, rng) for name in a.dtypes.split(",") for shape in (LARGE, *SMALL)]
    times = {}          # (case index, op, setting) -> [ms per round]
    for r in range(a.rounds):
        for ci, case in enumerate(cases):
            labels = list(MAIN) + (extra if case.shape == LARGE else [])
            order = labels if r % 2 == 0 else labels[::-1]
            calls = a.calls if case.shape == LARGE else a.small_calls
            for op in OPS:
                for label in order:
                    set_setting(label)
                    t = graph_time(cp, case.fn(op), calls, a.replays)
                    times.setdefault((ci, op, label), []).append(float("nan") if t is None else t)
    tt = {}
    for ci, case in enumerate(cases):
        calls = a.calls if case.shape == LARGE else a.small_calls
        tt[ci] = case.torch_times(calls, a.replays)
    set_setting("default")
    print("# ms per call (median over rounds, settings alternated); off/default > 1: the default faster; "
          "torch/default > 1: faster than PyTorch")
    print(f"{'shape':>16} {'dtype':>9} {'op':>13} {'keep':>5} | {'off':>7} {'default':>7} | {'off/def':>7} "
          f"{'%copy':>5} | {'torch':>7} {'t/def':>6} | rounds off ; default")
    for ci, case in enumerate(cases):
        for op in OPS:
            m = {lab: _med(times[(ci, op, lab)]) for lab in MAIN}
            t = tt[ci].get(op, float("nan"))
            pct = TRAFFIC[op] * case.e / (m["default"] * 1e-3) / 1e9 / bw * 100
            rounds = " ".join(f"{v:.4f}" for v in times[(ci, op, "off")]) + " ; " + \
                " ".join(f"{v:.4f}" for v in times[(ci, op, "default")])
            print(f"{'x'.join(map(str, case.shape)):>16} {case.name:>9} {op:>13} {str(case.takes_keep(op)):>5} | "
                  f"{m['off']:7.4f} {m['default']:7.4f} | {m['off'] / m['default']:7.3f} {pct:4.0f}% | {t:7.4f} "
                  f"{t / m['default']:6.3f} | {rounds}")
    if extra:
        print("# the large shape, KEEP variants (kernel arguments of the KEEP build): ms (off / setting)")
        for ci, case in enumerate(cases):
            if case.shape != LARGE:
                continue
            for op in OPS:
                off = _med(times[(ci, op, "off")])
                cells = "  ".join(f"{lab} {_med(times[(ci, op, lab)]):.4f} ({off / _med(times[(ci, op, lab)]):.3f})"
                                  for lab in extra)
                print(f"  {case.name:>9} {op:>13}: {cells}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

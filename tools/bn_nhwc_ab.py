"""Session 12's A/B of the channels-last batch-norm candidates (docs/step_kernels.md, "Session 12: channels-last
batch norm") in ONE process: the default one-launch kernels (off), MEET (bn_nhwc.MEET, MINIDNN_BN_NHWC_MEET: the
meeting with fewer round trips), KEEP (bn_nhwc.KEEP, MINIDNN_BN_NHWC_KEEP: L2 eviction policies -- the reduction
pass's newest steps evict-last, every other load evict-first) and both, forward and backward, at (128, 64, 56, 56)
float32 / bfloat16 and two of the example models' shapes, PyTorch channels_last beside.

    PYTHONPATH=. python3 tools/bn_nhwc_ab.py [--rounds 3] [--calls 10] [--small-calls 40] [--replays 5]
                                              [--dtypes float32,bfloat16] [--no-phases] [--no-carve]

Per call, device time: a CUDA graph of `calls` back-to-back calls replayed `replays` times (CUDA events, median);
the settings are alternated within each round (their order reversed every other round) and the table gives the
median over rounds.  Settings (MEET, KEEP, KEEP_FRAC, KEEP_LAST): off, meet, keep (evict-last tail, 0.65 of L2),
both; on the large shape also -- kernel arguments of the keep build, no compile -- keepn (the tail evict-normal:
only the other loads demoted), keep40 / keep90 (0.40 / 0.90 of L2), keep0 (nothing kept, every load evict-first:
the hints' own cost) and, unless --no-carve, keepL2: keep with a
persisting-L2 carve-out (cudaLimitPersistingL2CacheSize = the device's maximum, reset to 0 after each use) -- whether
evict-last needs one.  Ops: "bn fwd" (training forward with running statistics), "bn bwd", "add+relu bwd" (the
fused batch norm + add + ReLU backward: y's mask, dz; PyTorch: relu(bn(x) + z)'s backward, its ReLU backward kernel
included, timed as forward + backward less the forward).  off/x > 1: x faster than the default; torch/x > 1: x
faster than PyTorch.  %copy: the op's compulsory traffic (fwd 2e, bwd 3e, add+relu bwd 5e; e = x's bytes) over the
time of "both", against a 256 MiB device copy measured here.
Phases (float32 large plain backward, every large setting but both): the kernel built with STOP=1 (return after the
reduction pass) and STOP=2 (after the meeting, the constants and the departure): reduction / meeting / elementwise by
difference.  MEET should shorten the meeting, KEEP the elementwise pass.  (KEEP's phase builds keep nothing -- they
return before the elementwise pass would hand the kept lines back -- so their reduction is keep0's.)
NVRTC compiles 24 kernels (fwd, bwd, add+relu bwd x off / meet / keep / both x 2 dtypes) + 6 phase builds: about
60-90 s of the run; the timings about 40 s.  PyTorch is imported here only (the yardstick).
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
# label -> (MEET, KEEP, KEEP_FRAC, KEEP_LAST, carve-out)
SETTINGS = {"off": (False, NONE, 0.65, 1, False), "meet": (True, NONE, 0.65, 1, False),
            "keep": (False, BOTH, 0.65, 1, False), "both": (True, BOTH, 0.65, 1, False),
            "keepn": (False, BOTH, 0.65, 0, False), "keep40": (False, BOTH, 0.40, 1, False),
            "keep90": (False, BOTH, 0.90, 1, False), "keep0": (False, BOTH, 0.0, 1, False),
            "keepL2": (False, BOTH, 0.65, 1, True)}
MAIN = ("off", "meet", "keep", "both")
EXTRA = ("keepn", "keep40", "keep90", "keep0", "keepL2")
PHASES = ("off", "meet", "keep", "keepn", "keepL2")
_LIMIT_PERSISTING_L2 = 0x06     # cudaLimitPersistingL2CacheSize


def carve(cp, on):
    """The persisting-L2 carve-out: the device's maximum (on) or none; False where CuPy or the device refuses."""
    try:
        size = int(cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id).get("persistingL2CacheMaxSize", 0))
        cp.cuda.runtime.deviceSetLimit(_LIMIT_PERSISTING_L2, size if on else 0)
        return size
    except Exception as e:          # noqa: BLE001 -- report, no carve-out
        print(f"# carve-out unavailable: {type(e).__name__}: {e}", file=sys.stderr)
        return False


def set_setting(cp, label):
    M.MEET, M.KEEP, M.KEEP_FRAC, M.KEEP_LAST, cv = SETTINGS[label]
    M._calls.clear()
    K._calls.clear()
    if cv:
        carve(cp, True)


def unset(cp, label):
    if SETTINGS[label][4]:
        carve(cp, False)


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
        """The plain backward built with STOP = stop under the module's settings (a call object made here)."""
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


def _med(v):
    return statistics.median(v)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=10, help="calls per graph, large shape")
    ap.add_argument("--small-calls", type=int, default=40, help="calls per graph, small shapes")
    ap.add_argument("--replays", type=int, default=5)
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--no-phases", action="store_true")
    ap.add_argument("--no-carve", action="store_true", help="no keepL2 setting (the persisting-L2 carve-out)")
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
          f"L2 {M.l2_info(dev.id)}, persisting L2 max {props.get('persistingL2CacheMaxSize')}, copy bandwidth "
          f"{bw:.0f} GB/s; ROUTE {M.ROUTE}, ONCHIP {M.ONCHIP}, at start MEET {M.MEET} KEEP {sorted(M.KEEP)}; "
          f"torch {getattr(torch, '__version__', None)}")
    if M.ROUTE != "one" or not M.ONCHIP:
        print("# the candidates need ROUTE one and ONCHIP (the defaults): nothing to compare", file=sys.stderr)
        return 1
    extra = [x for x in EXTRA if not (a.no_carve and x == "keepL2")]
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
                    set_setting(cp, label)
                    t = graph_time(cp, case.fn(op), calls, a.replays)
                    unset(cp, label)
                    times.setdefault((ci, op, label), []).append(float("nan") if t is None else t)
    tt = {}
    for ci, case in enumerate(cases):
        calls = a.calls if case.shape == LARGE else a.small_calls
        tt[ci] = case.torch_times(calls, a.replays)
    set_setting(cp, "off")
    print("# ms per call (median over rounds, settings alternated); off/x > 1: x faster than the default; torch/x > 1: "
          "x faster than PyTorch")
    print(f"{'shape':>16} {'dtype':>9} {'op':>13} | {'off':>7} {'meet':>7} {'keep':>7} {'both':>7} | {'off/meet':>8} "
          f"{'off/keep':>8} {'off/both':>8} {'%copy':>5} | {'torch':>7} {'t/off':>6} {'t/both':>6} | rounds both")
    for ci, case in enumerate(cases):
        for op in OPS:
            m = {lab: _med(times[(ci, op, lab)]) for lab in MAIN}
            t = tt[ci].get(op, float("nan"))
            pct = TRAFFIC[op] * case.e / (m["both"] * 1e-3) / 1e9 / bw * 100
            rounds = " ".join(f"{v:.4f}" for v in times[(ci, op, "both")])
            print(f"{'x'.join(map(str, case.shape)):>16} {case.name:>9} {op:>13} | {m['off']:7.4f} {m['meet']:7.4f} "
                  f"{m['keep']:7.4f} {m['both']:7.4f} | {m['off'] / m['meet']:8.3f} {m['off'] / m['keep']:8.3f} "
                  f"{m['off'] / m['both']:8.3f} {pct:4.0f}% | {t:7.4f} {t / m['off']:6.3f} {t / m['both']:6.3f} | "
                  f"{rounds}")
    print("# the large shape, the KEEP variants (kernel arguments of the keep build): ms (off / setting)")
    for ci, case in enumerate(cases):
        if case.shape != LARGE:
            continue
        for op in OPS:
            off = _med(times[(ci, op, "off")])
            cells = "  ".join(f"{lab} {_med(times[(ci, op, lab)]):.4f} ({off / _med(times[(ci, op, lab)]):.3f})"
                              for lab in extra)
            print(f"  {case.name:>9} {op:>13}: {cells}")
    if not a.no_phases and "float32" in a.dtypes.split(","):
        case = next(c for c in cases if c.shape == LARGE and c.name == "float32")
        print("# phases, float32 (128, 64, 56, 56) plain backward (STOP=1: reduction; STOP=2: + meeting, constants, "
              "departure): ms")
        for label in PHASES:
            if label not in MAIN and label not in extra:
                continue
            set_setting(cp, label)
            p1 = graph_time(cp, case.phase_fns(1), a.calls, a.replays)
            p2 = graph_time(cp, case.phase_fns(2), a.calls, a.replays)
            full = graph_time(cp, case.fn("bn bwd"), a.calls, a.replays)
            unset(cp, label)
            print(f"  {label:>6}: reduction {p1:.4f} | meeting {p2 - p1:.4f} | elementwise {full - p2:.4f} | "
                  f"whole {full:.4f}")
        set_setting(cp, "off")
    return 0


if __name__ == "__main__":
    sys.exit(main())

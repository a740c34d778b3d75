"""Session 17's A/B of SPLIT (bn_nhwc.SPLIT; docs/step_kernels.md, "Session 17: channels-last batch norm at wide C")
in ONE process: the one-launch channels-last batch norm with meet's single combiner (off, SPLIT=0: today's default)
against the combine spread over the grid (split, SPLIT=2: taken at every shape here, so the controls show whether
the rule's threshold should move), forward, backward and the fused add+relu backward, PyTorch channels_last beside.

Shapes: (32, 256, 56, 56) -- session 17's table, the rule's case (17 combine trips) -- and controls the rule leaves
alone: (256, 32, 56, 56) and (128, 64, 56, 56) (3 and 5 trips, the same bytes), (128, 128, 8, 8) (MobileNet-small's
widest, 8 trips in float32) and (128, 16, 32, 32) (ResNet-20's largest).  The "rule" column says whether SPLIT=1
(the rule) takes the case on this device: where it does not, its default is the off column.

    PYTHONPATH=. python3 tools/bn_nhwc_s17_ab.py [--rounds 3] [--calls 10] [--small-calls 40] [--replays 5]
                                                 [--dtypes float32,bfloat16] [--phases]

Per call, device time: a CUDA graph of `calls` back-to-back calls replayed `replays` times (CUDA events, median);
off and split alternate within each round (their order reversed every other round), the table gives the median over
rounds.  off/split > 1: split faster; torch/split > 1: split faster than PyTorch.  %copy: the op's compulsory traffic
(fwd 2e, bwd 3e, add+relu bwd 5e; e = x's bytes) over split's time against a 256 MiB device copy measured here.
--phases: the wide shape's float32 forward / backward built with STOP=1 (return after the block's partial) and
STOP=2 (after the meeting), off and split: the meeting is the difference (bn_nhwc_s7.py's phase builds).
NVRTC compiles ~24 kernels (fwd, bwd, add+relu bwd x KEEP or not x off / split x 2 dtypes; --phases 8 more): about
40-60 s of the run; the timings ~20 s.  PyTorch is imported here only (the yardstick).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bn_nhwc_ab import OPS, TRAFFIC, Case  # noqa: E402
from bn_nhwc_bench import copy_bandwidth  # noqa: E402
from graph_timer import graph_time  # noqa: E402

from minidnn.backend import devices as _dev  # noqa: E402
from minidnn.backend.cuda import bn_kernels as K  # noqa: E402
from minidnn.backend.cuda import bn_nhwc as M  # noqa: E402

WIDE = (32, 256, 56, 56)
SHAPES = [WIDE, (256, 32, 56, 56), (128, 64, 56, 56), (128, 128, 8, 8), (128, 16, 32, 32)]
LARGE = {WIDE, (256, 32, 56, 56), (128, 64, 56, 56)}
SETTINGS = {"off": 0, "split": 2}


def set_setting(label):
    M.SPLIT = SETTINGS[label]
    M._calls.clear()
    K._calls.clear()


def rule_takes(case):
    """Whether SPLIT=1 (the rule) takes this case's one-launch calls on this device (the grid the SMs hold)."""
    c = case.shape[1]
    rows = case.x.size // c
    vec = M.vec_width(c, case.x.dtype.itemsize)
    cv, chunks, tx, rb, ng = M.geometry(rows, c, vec)
    g = M.reduce_grid(ng, chunks, M._launch.sm_count(case.x.data.device_id) * M.BPS)
    keep = M.SPLIT
    M.SPLIT = 1
    try:
        return M.split_call(c, vec, g, case.x.dtype), M.combine_trips(c, vec, g, False), g
    finally:
        M.SPLIT = keep


def phase_fns(case, stop):
    """The float32 forward / backward of ``case`` built with STOP = stop under the module's SPLIT."""
    flags = dict(relu=False, has_z=False, has_scale=True, has_bias=True, stop=stop)
    t = M.TrainingCall()
    t._settle(case.x, case.x.data.device_id, "one", (0.1, 1e-5, True, True, flags))
    b = M.BackwardCall()
    b._settle(case.x, case.x.data.device_id, "one", dict(relu=False, has_z=False, has_scale=True, stop=stop))
    y, m, i = M.forward_training(case.x, case.s, case.b, 0.1, None, None, 1e-5)
    return (lambda: t.run(case.x, None, case.s, case.b, case.rm, case.rv, case.cnt),
            lambda: b.run(case.x, case.dy, case.s, m, i, None))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=10, help="calls per graph, large shapes")
    ap.add_argument("--small-calls", type=int, default=40, help="calls per graph, small shapes")
    ap.add_argument("--replays", type=int, default=5)
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--phases", action="store_true", help="the wide float32 shape's meeting, off and split")
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
    print(f"# device {props['name'].decode()}, {M._launch.sm_count(dev.id)} SMs, L2 {M.l2_info(dev.id)}, copy "
          f"bandwidth {bw:.0f} GB/s; ROUTE {M.ROUTE}, ONCHIP {M.ONCHIP}, V2 {M.V2}, KEEP {sorted(M.KEEP)}, module "
          f"SPLIT {M.SPLIT} trips {M.SPLIT_TRIPS}; torch {getattr(torch, '__version__', None)}")
    if M.ROUTE != "one" or not M.V2:
        print("# SPLIT needs ROUTE one and V2 (the defaults): nothing to compare", file=sys.stderr)
        return 1
    rng = np.random.default_rng(0)
    cases = [Case(cp, torch, shape, name, rng) for name in a.dtypes.split(",") for shape in SHAPES]
    labels = list(SETTINGS)
    times = {}          # (case index, op, setting) -> [ms per round]
    for r in range(a.rounds):
        for ci, case in enumerate(cases):
            order = labels if r % 2 == 0 else labels[::-1]
            calls = a.calls if case.shape in LARGE else a.small_calls
            for op in OPS:
                for label in order:
                    set_setting(label)
                    t = graph_time(cp, case.fn(op), calls, a.replays)
                    times.setdefault((ci, op, label), []).append(float("nan") if t is None else t)
    tt = {ci: case.torch_times(a.calls if case.shape in LARGE else a.small_calls, a.replays)
          for ci, case in enumerate(cases)}
    set_setting("off")
    print("# ms per call (median over rounds, settings alternated); off/split > 1: split faster; "
          "torch/split > 1: split faster than PyTorch")
    print(f"{'shape':>16} {'dtype':>9} {'op':>13} {'rule':>5} {'trips':>5} {'G':>4} | {'off':>7} {'split':>7} | "
          f"{'off/spl':>7} {'%copy':>5} | {'torch':>7} {'t/spl':>6} | rounds off ; split")
    for ci, case in enumerate(cases):
        takes, trips, g = rule_takes(case)
        for op in OPS:
            m = {lab: statistics.median(times[(ci, op, lab)]) for lab in labels}
            t = tt[ci].get(op, float("nan"))
            pct = TRAFFIC[op] * case.e / (m["split"] * 1e-3) / 1e9 / bw * 100
            rounds = " ".join(f"{v:.4f}" for v in times[(ci, op, "off")]) + " ; " + \
                " ".join(f"{v:.4f}" for v in times[(ci, op, "split")])
            print(f"{'x'.join(map(str, case.shape)):>16} {case.name:>9} {op:>13} {str(takes):>5} {trips:5d} {g:4d} | "
                  f"{m['off']:7.4f} {m['split']:7.4f} | {m['off'] / m['split']:7.3f} {pct:4.0f}% | {t:7.4f} "
                  f"{t / m['split']:6.3f} | {rounds}")
    if a.phases:
        wide = next((c for c in cases if c.shape == WIDE and c.name == "float32"), None)
        if wide is not None:
            print("# phases, (32, 256, 56, 56) float32, ms: STOP=1 (reduction + block partial), STOP=2 (+ meeting), "
                  "full; meeting = STOP2 - STOP1")
            ph = {}
            for r in range(a.rounds):
                for label in (labels if r % 2 == 0 else labels[::-1]):
                    set_setting(label)
                    for stop in (1, 2):
                        for d, fn in zip(("fwd", "bwd"), phase_fns(wide, stop)):
                            ph.setdefault((label, d, stop), []).append(graph_time(cp, fn, a.calls, a.replays))
            for d, op in (("fwd", "bn fwd"), ("bwd", "bn bwd")):
                for label in labels:
                    s1, s2 = (statistics.median(ph[(label, d, s)]) for s in (1, 2))
                    full = statistics.median(times[(cases.index(wide), op, label)])
                    print(f"  {d} {label:>5}: STOP1 {s1:.4f}  STOP2 {s2:.4f}  full {full:.4f}  meeting "
                          f"{(s2 - s1) * 1e3:.1f} us  elementwise {(full - s2) * 1e3:.1f} us")
            set_setting("off")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Session 23's A/B of channel rounds (bn_nhwc.ROUNDS, MINIDNN_BN_NHWC_ROUNDS; docs/step_kernels.md, "Session 23:
channel rounds for channels-last batch norm") in ONE process: the one-launch channels-last batch norm as one launch
(ROUNDS 0, today's default) against 2 and 4 launches of C / k channels each and "auto" (the planner's count),
forward, backward and the fused add + ReLU backward, PyTorch channels_last beside.

    PYTHONPATH=. python3 tools/bn_nhwc_rounds_ab.py [--rounds 3] [--calls 10] [--replays 5]
                                                     [--dtypes float32,bfloat16] [--settings 0,2,4,auto]

Shapes: (32, 256, 56, 56), (128, 64, 56, 56), (256, 32, 56, 56) -- the same bytes, rows of 1024 / 256 / 128 bytes
in float32 (512 / 128 / 64 in bfloat16), so a round reads half, a quarter ... of each (tools/seg_bw_probe.py's
rates).  Per call, device time: a CUDA graph of `calls` back-to-back calls replayed `replays` times (CUDA events,
median); the settings alternate within each round (order rotated every round), the table gives the median over
rounds.  "k" is the rounds each setting took for the case on this device (bn_nhwc.rounds_for: a count the tiles
cannot take falls to fewer).  0/s > 1: setting s faster than one launch; torch/best > 1: the best setting faster
than PyTorch.  %copy: the op's compulsory traffic (fwd 2e, bwd 3e, add+relu bwd 5e; e = x's bytes) over the time,
against a 256 MiB device copy measured here.  The kernels every setting plans (about 15 a dtype: the RSTRIDE builds
with and without KEEP / SPLIT) are first compiled into CuPy's disk cache a process a core (--no-precompile: one after
another at first use; give CUPY_CACHE_DIR a writable place).  PyTorch is imported here only (the yardstick).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bn_nhwc_ab import OPS, TRAFFIC, Case  # noqa: E402
from bn_nhwc_bench import copy_bandwidth  # noqa: E402
from graph_timer import graph_time  # noqa: E402

from minidnn.backend import devices as _dev  # noqa: E402
from minidnn.backend.cuda import bn_kernels as K  # noqa: E402
from minidnn.backend.cuda import bn_nhwc as M  # noqa: E402

SHAPES = [(32, 256, 56, 56), (128, 64, 56, 56), (256, 32, 56, 56)]


def set_setting(value):
    M.ROUNDS = M.parse_rounds(value)
    M._calls.clear()
    K._calls.clear()


def _op_flags(op):
    """(forward flags, backward flags or None) of the calls an op's timed function makes (bn_nhwc_ab.Case.fn)."""
    fwd = dict(relu=False, has_z=False, has_scale=True, has_bias=True)
    if op == "bn fwd":
        return fwd, None
    add = op == "add+relu bwd"
    return fwd, dict(relu=add, has_z=add, has_scale=True)


def precompile(cases, labels):
    """Plan every (case, op, setting) with kernels recorded, not built (bn_nhwc.planned_kernels), then compile the
    distinct configurations a process a core (bn_nhwc.precompile).  Returns how many."""
    def plan_all():
        saved = M.ROUNDS
        try:
            for case in cases:
                c = case.shape[1]
                rows, dev = case.x.size // c, case.x.data.device_id
                vec = M.vec_width(c, case.x.dtype.itemsize, (case.x.data.ptr, case.dy.data.ptr))
                for label in labels:
                    M.ROUNDS = M.parse_rounds(label)
                    for op in OPS:
                        fwd, bwd = _op_flags(op)
                        for running in (True, False):
                            M._fwd_plan(case.x.dtype, rows, c, vec, M.ROUTE, 0.1, 1e-5, running, running, fwd, dev)
                        if bwd is not None:
                            M._bwd_plan(case.x.dtype, rows, c, vec, M.ROUTE, bwd, dev)
        finally:
            M.ROUNDS = saved
    jobs = M.planned_kernels(plan_all)
    K._calls.clear()
    return M.precompile(jobs)


def rounds_taken(case, op, value):
    """The rounds ``value`` gives ``case``'s ``op`` on this device (the planner's answer, nothing launched)."""
    saved = M.ROUNDS
    M.ROUNDS = M.parse_rounds(value)
    try:
        c = case.shape[1]
        flags = dict(has_scale=True, has_bias=op == "bn fwd", relu=op == "add+relu bwd", has_z=op == "add+relu bwd")
        return M.rounds_for(op == "bn fwd", case.x.dtype, case.x.size // c, c, flags, case.x.data.device_id)
    finally:
        M.ROUNDS = saved


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=10, help="calls per graph")
    ap.add_argument("--replays", type=int, default=5)
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--settings", default="0,2,4,auto", help="ROUNDS values; the first is the baseline")
    ap.add_argument("--no-precompile", action="store_true")
    a = ap.parse_args(argv)
    labels = [s.strip() for s in a.settings.split(",")]
    for s in labels:
        M.parse_rounds(s, "--settings")
    cp = _dev.require_cupy()
    try:
        import torch
        torch.backends.cudnn.benchmark = True
    except ImportError:
        torch = None
    bw = copy_bandwidth(cp)
    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    print(f"# device {props['name'].decode()}, {M._launch.sm_count(dev.id)} SMs, L2 {M.l2_info(dev.id)}, smem "
          f"{M.smem_limits(dev.id)}, copy bandwidth {bw:.0f} GB/s; ROUTE {M.ROUTE}, ONCHIP {M.ONCHIP}, KEEP "
          f"{sorted(M.KEEP)}, SPLIT {M.SPLIT}, module ROUNDS {M.ROUNDS!r}; torch {getattr(torch, '__version__', None)}")
    if M.ROUTE != "one" or not M.ONCHIP:
        print("# ROUNDS needs ROUTE one and ONCHIP (the defaults): nothing to compare", file=sys.stderr)
        return 1
    saved = M.ROUNDS
    rng = np.random.default_rng(0)
    cases = [Case(cp, torch, shape, name, rng) for name in a.dtypes.split(",") for shape in SHAPES]
    if not a.no_precompile:
        t0 = time.perf_counter()
        n = precompile(cases, labels)
        print(f"# precompiled {n} kernel configurations in {time.perf_counter() - t0:.1f} s")
    times = {}          # (case index, op, setting) -> [ms per round]
    for r in range(a.rounds):
        for ci, case in enumerate(cases):
            for op in OPS:
                order = labels[r % len(labels):] + labels[:r % len(labels)]
                for label in order:
                    set_setting(label)
                    t = graph_time(cp, case.fn(op), a.calls, a.replays)
                    times.setdefault((ci, op, label), []).append(float("nan") if t is None else t)
    tt = {ci: case.torch_times(a.calls, a.replays) for ci, case in enumerate(cases)}
    set_setting(saved)
    base = labels[0]
    print("# ms per call (median over rounds, settings rotated); k: rounds taken; "
          f"{base}/s > 1: s faster than ROUNDS {base}; torch/best > 1: the best setting faster than PyTorch")
    head = " ".join(f"{lab:>7}" for lab in labels)
    ratios = " ".join(f"{base + '/' + lab:>7}" for lab in labels[1:])
    print(f"{'shape':>16} {'dtype':>9} {'op':>13} {'k':>9} | {head} | {ratios} | {'%copy':>11} | {'torch':>7} "
          f"{'t/best':>6} | rounds per setting")
    for ci, case in enumerate(cases):
        for op in OPS:
            m = {lab: statistics.median(times[(ci, op, lab)]) for lab in labels}
            ks = "/".join(str(rounds_taken(case, op, lab)) for lab in labels)
            best = min(labels, key=lambda lab: m[lab])
            t = tt[ci].get(op, float("nan"))

            def pct(lab):
                return TRAFFIC[op] * case.e / (m[lab] * 1e-3) / 1e9 / bw * 100
            raw = " ; ".join(" ".join(f"{v:.4f}" for v in times[(ci, op, lab)]) for lab in labels)
            print(f"{'x'.join(map(str, case.shape)):>16} {case.name:>9} {op:>13} {ks:>9} | "
                  + " ".join(f"{m[lab]:7.4f}" for lab in labels) + " | "
                  + " ".join(f"{m[base] / m[lab]:7.3f}" for lab in labels[1:])
                  + f" | {pct(base):4.0f}%->{pct(best):3.0f}% {best:>1} | {t:7.4f} {t / m[best]:6.3f} | {raw}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

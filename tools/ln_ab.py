"""A/B of session 12's layer-norm candidates (norm_kernels: backward ln_bwd3, route "v3"; 16-bit forward ln_fwd3
with LN3_KEEP, route "v3k") against the defaults, device time only (CUDA-graph replays, as bench/kernels_gpu.py's
graph columns), PyTorch's F.layer_norm beside, ONE process.

    python tools/ln_ab.py [--rows big,bert,long,small] [--dtypes bfloat16,float16,float32] [--rounds 4] [--trials 5]
                          [--settings v2,v3p4,v3p4a,v3p2] [--fwd-settings v3s,v3k]

Rows (shape; the bench's layer-norm case: x, dy of the dtype, scale = 1 and bias = 0 in float32 for 16-bit data):
  big    (16384, 1024)   the kernel table's row (issue 10's target: >= 75% of copy bandwidth, faster than PyTorch)
  bert   (4096, 768)     BERT-base width, 3 vectors a lane at P=4 (the scale in shared memory)
  long   (2048, 4096)    long rows: teams of 128 (P=4) / 256 (P=2)
  small  (8, 768)        latency-bound: one launch + col_sum, fewer rows than one SM's teams
float16 runs the big row only (the same kernels as bfloat16 but the conversions).
Forward settings (16-bit rows; float32 rows time the default once): v3s the default (ln_fwd3, parameters in shared
memory), v3k = v3s with LN3_KEEP / LN3_FULL (values converted once; 377 -> 289 instructions a row-thread).
Backward settings (each a route of the layer-norm backward, 16-bit and float32 alike; plans forgotten at each
flip, so the next capture plans and compiles anew -- NVRTC compiles count, ~2 s each, about 20 in all):
  v2     the default: ln_bwd2 (teams of <= 2 vectors a thread, two team sums a row) + col_sum
  v3p4   ln_bwd3, LN_BWD3_P = 4 (a warp per 1024-value 16-bit row, 32 values a thread, recomputed from raw registers)
  v3p4a  v3p4 with LN_BWD3_ASYNC (the next row staged in shared memory by cp.async during the current row's work)
  v3p2   ln_bwd3, LN_BWD3_P = 2 (ln_bwd2's teams; d and g kept in registers where a thread holds <= 8 values)
Method: per row and dtype, `rounds` rounds; each round times every setting once, the order rotated a step each
round (so clock or temperature drift spreads over the settings), each timing a fresh capture of `reps` calls
replayed `trials` times (median).  Reported per setting: the median over rounds (ms a call), GB/s and % of the copy
bandwidth (compulsory bytes: x, dy read, dx written; forward x read, y written -- the bench's accounting), the
median of the per-round ratios to the first setting (> 1: faster than it) and the spread over rounds; PyTorch's
graphed forward (F.layer_norm) and backward (torch.autograd.grad of it) once per row.  `plan` shows each backward
setting's kernel configuration.
Expected device time: ~2 min on an H100/H200 (compiles included).
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

from minidnn.backend import devices as _dev  # noqa: E402
from minidnn.backend.cuda import norm_kernels as NK  # noqa: E402

ROWS = {"big": (16384, 1024), "bert": (4096, 768), "long": (2048, 4096), "small": (8, 768)}
FWD_SETTINGS = ("v3s", "v3k")
SETTINGS = {"v2": ("v2", None, False), "v3p4": ("v3", 4, False), "v3p4a": ("v3", 4, True), "v3p2": ("v3", 2, False)}
_DEFAULT = (dict(NK.ROUTE), NK.LN_BWD3_P, NK.LN_BWD3_ASYNC)


def apply(setting):
    """Route every dtype's layer-norm backward through ``setting`` (None: the import-time default)."""
    if setting is None:
        NK.ROUTE.clear()
        NK.ROUTE.update(_DEFAULT[0])
        NK.LN_BWD3_P, NK.LN_BWD3_ASYNC = _DEFAULT[1:]
    else:
        route, p, stage = SETTINGS[setting]
        NK.ROUTE["ln_bwd16"] = NK.ROUTE["ln_bwd"] = route
        NK.LN_BWD3_P = _DEFAULT[1] if p is None else p
        NK.LN_BWD3_ASYNC = stage
    NK._plans.clear()


def apply_fwd(setting):
    """Route the 16-bit layer-norm forward through ``setting`` (None: the import-time default)."""
    NK.ROUTE["ln_fwd16"] = _DEFAULT[0]["ln_fwd16"] if setting is None else setting
    NK._plans.clear()


def _rounds(timer, fn, settings, apply_one, rounds):
    """{setting: [ms a call, one a round]} and {setting: [ratio to settings[0], one a round]}: settings rotated a
    step each round, a fresh capture each timing."""
    got = {s: [] for s in settings}
    ratios = {s: [] for s in settings}
    reps = None
    for r in range(rounds):
        k = r % len(settings)
        this = {}
        for s in settings[k:] + settings[:k]:
            apply_one(s)
            fn()                                    # plans and compiles outside the capture
            reps = reps or timer.reps(fn, "minidnn")
            this[s] = timer.graph(fn, reps, "minidnn")
            got[s].append(this[s])
        for s in settings:
            ratios[s].append(this[settings[0]] / this[s])
    return got, ratios


def _line(what, dtype_name, shape, s, times, ratios, first, nbytes, bw, torch_ms, plan):
    ms = statistics.median(times)
    gbs = nbytes / (ms * 1e-3) / 1e9
    spread = max(times) / min(times) - 1
    vs = f"  torch {torch_ms:.4f} ms ({torch_ms / ms:4.2f}x)" if torch_ms else ""
    print(f"layer norm {what} {dtype_name:9s} {str(shape):14s} {s:6s} {ms:8.4f} ms  {gbs:6.0f} GB/s  "
          f"{100 * gbs / bw:4.0f}%  vs {first} {statistics.median(ratios):5.3f}  spread {100 * spread:4.1f}%{vs}"
          + (f"   plan: {plan}" if plan else ""))


def plan_text(setting, d, dtype):
    route, p, stage = SETTINGS[setting]
    if route == "v3":
        cfg = NK.ln_bwd3_config(d, dtype.itemsize, True, p, stage)
        if cfg is not None:
            team, vpt, vec, block, minb, keep, full, staged, smem = cfg
            return (f"ln_bwd3 team={team} VPT={vpt} VEC={vec} block={block} minb={minb} KEEP={keep} FULL={full} "
                    f"ASYNC={staged} smem={smem // 1024} KB")
    cfg = NK.row_config2(d, dtype, True, "ln_bwd")
    if cfg is None:
        return "v1"
    team, vpt, vec = cfg
    block, minb = NK._v2_launch_shape("ln_bwd", team, dtype.itemsize)
    return f"ln_bwd2 team={team} VPT={vpt} VEC={vec} block={block} minb={minb}"


def run_row(timer, cp, torch, key, dtype_name, bw, rounds, settings, fwd_settings):
    shape = ROWS[key]
    cases = KG.Cases(cp, torch, dtype_name)
    (_, _, (ffn, tff, fbytes), _), (_, _, (fn, tfn, nbytes), _) = cases.norm(shape)
    tb = tf = None
    if tfn is not None:
        try:
            tf = timer.graph(tff, timer.reps(tff, "torch"), "torch")
            tb = timer.graph(tfn, timer.reps(tfn, "torch"), "torch")
        except Exception as exc:        # noqa: BLE001
            print(f"  (PyTorch capture failed: {type(exc).__name__}: {exc})")
    fsets = fwd_settings if cases.dt.itemsize == 2 else fwd_settings[:1]
    try:
        got, ratios = _rounds(timer, ffn, fsets, apply_fwd, rounds if len(fsets) > 1 else 1)
    finally:
        apply_fwd(None)
    for s in fsets:
        _line("fwd", dtype_name, shape, s, got[s], ratios[s], fsets[0], fbytes, bw, tf, "")
    try:
        got, ratios = _rounds(timer, fn, settings, apply, rounds)
    finally:
        apply(None)
    for s in settings:
        _line("bwd", dtype_name, shape, s, got[s], ratios[s], settings[0], nbytes, bw, tb,
              plan_text(s, shape[-1], cases.dt))
    sys.stdout.flush()
    del cases
    cp.get_default_memory_pool().free_all_blocks()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--dtypes", default="bfloat16,float16,float32")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--settings", default=",".join(SETTINGS))
    ap.add_argument("--fwd-settings", default=",".join(FWD_SETTINGS))
    args = ap.parse_args(argv)
    settings = args.settings.split(",")
    fwd_settings = args.fwd_settings.split(",")
    if any(s not in SETTINGS for s in settings) or any(s not in FWD_SETTINGS for s in fwd_settings):
        ap.error(f"--settings: each of {', '.join(SETTINGS)}; --fwd-settings: of {', '.join(FWD_SETTINGS)}")
    if not _dev.cuda_is_available():
        print("ln_ab: no CUDA GPU with CuPy here; nothing to measure")
        return 0
    cp = _dev.require_cupy()
    try:
        import torch
        torch.backends.cudnn.benchmark = True
    except ImportError:
        torch = None
    timer = KG.Timer(cp, torch, args.trials)
    bw = KG.copy_bandwidth(cp, timer)
    print(f"device: {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}; copy bandwidth {bw:.0f} GB/s; "
          f"{args.rounds} rounds (settings rotated), graph replays of {args.trials} trials each")
    with KG.torch_stream(torch):           # PyTorch's ops on one stream, so its backwards can be captured
        for dtype_name in args.dtypes.split(","):
            for key in args.rows.split(","):
                if dtype_name == "float16" and key != "big":
                    continue
                try:
                    run_row(timer, cp, torch, key, dtype_name, bw, args.rounds, settings, fwd_settings)
                except Exception as exc:        # noqa: BLE001 -- one row must not take the others down
                    print(f"{key} {dtype_name}: failed: {type(exc).__name__}: {exc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A/B of session 12's layer-norm defaults (norm_kernels, round 2: backward ln_bwd3 -- route "v3", P by
ln_bwd3_p's rule -- for 16-bit and float32 rows; 16-bit forward ln_fwd3 "v3k" -- LN3_KEEP / LN3_FULL for teams up
to LN3K_MAX_TEAM, v3s above) against the previous defaults (ln_bwd2 "v2", ln_fwd3 "v3s"), device time only
(CUDA-graph replays, as bench/kernels_gpu.py's graph columns), PyTorch's F.layer_norm beside, ONE process.

    python tools/ln_ab.py [--rows big,bert,long,small] [--dtypes bfloat16,float16,float32] [--rounds 4] [--trials 5]
                          [--settings default,v2] [--fwd-settings default,v3s]

Rows (shape; the bench's layer-norm case: x, dy of the dtype, scale = 1 and bias = 0 in float32 for 16-bit data):
  big    (16384, 1024)   the kernel table's row (issue 10's target: >= 75% of copy bandwidth, faster than PyTorch)
  bert   (4096, 768)     BERT-base width, 3 vectors a lane at P=4 (the scale in shared memory)
  long   (2048, 4096)    long rows: teams of 128 (P=4; the forward's 256-thread team: v3s under both settings)
  small  (8, 768)        latency-bound: P = 2 by the rule, one launch + col_sum
float16 runs the big row only (the same kernels as bfloat16 but the conversions).
Forward settings (16-bit rows; float32 rows time the default once): default (v3k with its team rule), v3s.
Backward settings (each a route of the layer-norm backward, 16-bit and float32 alike; plans forgotten at each flip,
so the next capture plans and compiles anew -- NVRTC compiles count, ~2 s each, about 16 in all):
  default  ln_bwd3 (route v3) with the P rule: P = 2 where every row fits one wave of P = 2's teams, else P = 4
  v2       ln_bwd2 (teams of <= 2 vectors a thread, two team sums a row) + col_sum: the previous default
  v3p4     ln_bwd3 with P = 4 forced (MINIDNN_LN_BWD3_P=4); v3p2 with P = 2 forced (not run unless asked)
Method: per row and dtype, `rounds` rounds; each round times every setting once, the order rotated a step each
round (so clock or temperature drift spreads over the settings), each timing a fresh capture of `reps` calls
replayed `trials` times (median).  Reported per setting: the median over rounds (ms a call), GB/s and % of the copy
bandwidth (compulsory bytes: x, dy read, dx written; forward x read, y written -- the bench's accounting), the
median of the per-round ratios to the first setting (> 1: faster than it) and the spread over rounds; PyTorch's
graphed forward (F.layer_norm) and backward (torch.autograd.grad of it) once per row.  `plan` shows each setting's
kernel configuration.
Expected device time: ~1.5 min on an H100/H200 (compiles included).
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

from minidnn.backend.cuda import norm_kernels as NK  # noqa: E402

ROWS = {"big": (16384, 1024), "bert": (4096, 768), "long": (2048, 4096), "small": (8, 768)}
FWD_SETTINGS = ("default", "v3s", "v3k")
SETTINGS = {"default": (None, None), "v2": ("v2", None), "v3p4": ("v3", 4), "v3p2": ("v3", 2)}
_DEFAULT = (dict(NK.ROUTE), NK.LN_BWD3_P)


def apply(setting):
    """Route every dtype's layer-norm backward through ``setting`` (None: the import-time default)."""
    route, p = SETTINGS[setting or "default"]
    NK.ROUTE["ln_bwd16"] = _DEFAULT[0]["ln_bwd16"] if route is None else route
    NK.ROUTE["ln_bwd"] = _DEFAULT[0]["ln_bwd"] if route is None else route
    NK.LN_BWD3_P = _DEFAULT[1] if p is None else p
    NK._plans.clear()


def apply_fwd(setting):
    """Route the 16-bit layer-norm forward through ``setting`` (None: the import-time default)."""
    NK.ROUTE["ln_fwd16"] = _DEFAULT[0]["ln_fwd16"] if setting in (None, "default") else setting
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


def plan_text(setting, rows, d, dtype, sms):
    """The backward kernel configuration ``setting`` plans for (rows, d) of ``dtype`` (x and dy aligned)."""
    apply(setting)
    try:
        if NK._version("ln_bwd", dtype) == "v3":
            cfg = NK.ln_bwd3_plan_config(rows, d, dtype.itemsize, True, sms)
            if cfg is not None:
                team, vpt, vec, block, minb, keep, full, smem = cfg
                p = NK.ln_bwd3_p(rows, d, dtype.itemsize, True, sms)
                return (f"ln_bwd3 P={p} team={team} VPT={vpt} VEC={vec} block={block} minb={minb} KEEP={keep} "
                        f"FULL={full} smem={smem // 1024} KB")
    finally:
        apply(None)
    cfg = NK.row_config2(d, dtype, True, "ln_bwd")
    if cfg is None:
        return "v1"
    team, vpt, vec = cfg
    block, minb = NK._v2_launch_shape("ln_bwd", team, dtype.itemsize)
    return f"ln_bwd2 team={team} VPT={vpt} VEC={vec} block={block} minb={minb}"


def fwd_plan_text(setting, d, dtype):
    """The 16-bit forward's kernel under ``setting``."""
    cfg = NK.ln_config3(d, dtype, True)
    if cfg is None:
        return "norm_fwd2"
    version = _DEFAULT[0]["ln_fwd16"] if setting == "default" else setting
    keep = version == "v3k" and cfg[0] <= NK.LN3K_MAX_TEAM
    return f"ln_fwd3 team={cfg[0]} VPT={cfg[1]} " + ("KEEP FULL" if keep else "v3s")


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
        _line("fwd", dtype_name, shape, s, got[s], ratios[s], fsets[0], fbytes, bw, tf,
              fwd_plan_text(s, shape[-1], cases.dt) if cases.dt.itemsize == 2 else "")
    try:
        got, ratios = _rounds(timer, fn, settings, apply, rounds)
    finally:
        apply(None)
    for s in settings:
        _line("bwd", dtype_name, shape, s, got[s], ratios[s], settings[0], nbytes, bw, tb,
              plan_text(s, shape[0], shape[-1], cases.dt, NK._launch.sm_count(0)))
    sys.stdout.flush()
    del cases
    cp.get_default_memory_pool().free_all_blocks()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--dtypes", default="bfloat16,float16,float32")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--settings", default="default,v2")
    ap.add_argument("--fwd-settings", default="default,v3s")
    args = ap.parse_args(argv)
    settings = args.settings.split(",")
    fwd_settings = args.fwd_settings.split(",")
    if any(s not in SETTINGS for s in settings) or any(s not in FWD_SETTINGS for s in fwd_settings):
        ap.error(f"--settings: each of {', '.join(SETTINGS)}; --fwd-settings: of {', '.join(FWD_SETTINGS)}")
    start = KG.ab_start("ln_ab", args.trials, args.rounds, "settings rotated", benchmark=True)
    if start is None:
        return 0
    cp, torch, timer, bw = start
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

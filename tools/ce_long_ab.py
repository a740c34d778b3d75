"""A/B of loss_kernels.CE_LONG on the GPU (issue 10: the cross-entropy forward on rows of more than one chunk,
> 16K float32 classes), device time only, in one process, PyTorch's graphed F.cross_entropy beside.

    python tools/ce_long_ab.py [--dtypes float32,bfloat16,bfloat16w] [--shapes 4096x32000,2048x50257,1024x128256]
                               [--settings 0,1,2,1s3,2s3] [--rounds 5] [--trials 5]

Settings (docs/step_kernels.md, "Session 17: the cross-entropy forward on long rows"): "0" (ce_fwd_body: a chunk's
loads, then its reduction) | "1" (the default: the next chunk copied into a shared-memory stage by cp.async while
the current one is reduced; bitwise "0") | "2" ("1" with FASTX's exp where the plan has FASTX: native 16-bit logits;
elsewhere it plans "1" and its line says "= 1"); "1s3" / "2s3": with CE_LONG_SLOTS "3" (three stage slots, two
chunks in flight a block, where the rows are whole and the slots fit: 16-bit and widened logits; float32's line says
"= 1").  dtype "bfloat16w" / "float16w": 16-bit logits widened to float32
(widen=True, autocast's call; the float32 kernels' plan).  The first setting is the reference of the ratio column.
Method (tools/row_ab.py's): per case (dtype, shape) `rounds` rounds; a round times each distinct setting in turn,
the order reversed every other round, each a fresh CUDA-graph capture of `reps` calls of the primitive (with its host
work; x and target as bench/kernels_gpu.py's cross-entropy case) replayed `trials` times (median).  Switching
forgets the settled launches first (the NVRTC compile happens in the warm-up call before the capture).  Reported:
the median over rounds (ms a call, GB/s of the compulsory bytes -- x and the int64 target -- and % of the copy
bandwidth measured in the same run), the spread (max/min - 1), the median of the per-round ratios reference/setting
(> 1: faster), PyTorch / setting, and each setting's largest |lse - lse of the reference| over the rows (0: bitwise).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "bench"))
sys.path.insert(0, os.path.join(HERE, ".."))

import kernels_gpu as KG  # noqa: E402  (bench/kernels_gpu.py: the copy bandwidth, the timer, the inputs)
import numpy as np  # noqa: E402

import minidnn.backend as B  # noqa: E402


def _forget():
    """Forget every settled cross-entropy launch (kernel plans and the primitive's seen-call caches)."""
    from minidnn.backend import softmax as smx
    from minidnn.backend.cuda import loss_kernels as lk
    lk._plans.clear()
    for k, v in vars(smx).items():
        if isinstance(v, dict) and "seen" in k.lower():
            v.clear()


def _switch(setting):
    """CE_LONG = the setting's first character; "NsK": CE_LONG_SLOTS K (else "1")."""
    from minidnn.backend.cuda import loss_kernels as lk
    lk.CE_LONG, _, slots = setting.partition("s")
    lk.CE_LONG_SLOTS = slots or "1"
    _forget()


def _plan(shape, dt, widen):
    from minidnn.backend.cuda import loss_kernels as lk
    s = lk.launch_spec("ce_fwd", shape, dt, np.int64, False, "mean", 0.0, widen)
    return s[2], s[3], s[4], s[5]


def run_case(timer, cp, torch, dtype_name, shape, bw, rounds, settings):
    from minidnn.backend.cuda import loss_kernels as lk
    start = lk.CE_LONG + ("s" + lk.CE_LONG_SLOTS if lk.CE_LONG_SLOTS != "1" else "")
    widen = dtype_name.endswith("w")
    cases = KG.Cases(cp, torch, dtype_name.rstrip("w"))
    n, c = shape
    x = cases.x(shape)
    t = cp.asarray(np.random.default_rng(0).integers(0, c, n))

    def fn():
        return B.softmax_cross_entropy_forward(None, x, t, widen=widen)
    plans, distinct, same = {}, [], {}
    try:
        for s in settings:
            _switch(s)
            plans[s] = _plan(shape, cases.dt, widen)
            twin = next((u for u in distinct if plans[u] == plans[s]), None)
            if twin is None:
                distinct.append(s)
            else:
                same[s] = twin
        lse = {}
        for s in distinct:                              # compile, and each setting's lse for the bitwise column
            _switch(s)
            lse[s] = cp.asnumpy(fn()[1]).astype(np.float64)
        got = {s: [] for s in distinct}
        ratios = {s: [] for s in distinct}
        reps = None
        for r in range(rounds):
            order = distinct if r % 2 == 0 else distinct[::-1]
            this = {}
            for s in order:
                _switch(s)
                fn()                                    # plans outside the capture
                reps = reps or timer.reps(fn, "minidnn")
                this[s] = timer.graph(fn, reps, "minidnn")
                got[s].append(this[s])
            for s in distinct:
                ratios[s].append(this[distinct[0]] / this[s])
    finally:
        _switch(start)
    tms = None
    if torch is not None:
        xt = cases.t(shape)
        tt = torch.as_tensor(cp.asnumpy(t), device="cuda")

        def tf():
            return torch.nn.functional.cross_entropy(xt, tt)
        try:
            tms = timer.graph(tf, timer.reps(tf, "torch"), "torch")
        except Exception as exc:        # noqa: BLE001
            print(f"  (PyTorch capture failed: {type(exc).__name__}: {exc})")
    nbytes = x.size * x.dtype.itemsize + n * 8
    ref = lse[distinct[0]]
    for s in settings:
        if s not in got:
            print(f"ce fwd {dtype_name:10s} {str(shape):14s} {s}  = {same[s]} (the same kernel)")
            continue
        ms = statistics.median(got[s])
        gbs = nbytes / (ms * 1e-3) / 1e9
        spread = max(got[s]) / min(got[s]) - 1
        vs = f"  torch/this {tms / ms:5.3f}" if tms else ""
        fin = np.isfinite(ref)
        dl = float(np.max(np.abs(lse[s][fin] - ref[fin]), initial=0.0))
        defs = " ".join(d for d in plans[s][0] if d.startswith(("LONG", "LSLOTS", "FASTX", "MINB", "NV=", "G=")))
        print(f"ce fwd {dtype_name:10s} {str(shape):14s} {s:3s} {ms:8.4f} ms {gbs:6.0f} GB/s {100 * gbs / bw:4.0f}%  "
              f"spread {100 * spread:4.1f}%  {distinct[0]}/this {statistics.median(ratios[s]):.3f}{vs}  "
              f"max|dlse| {dl:.1e}  grid {lk._grid(plans[s][1], 0, plans[s][2])}  {defs}")
    if tms:
        print(f"ce fwd {dtype_name:10s} {str(shape):14s} torch {tms:.4f} ms")
    sys.stdout.flush()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtypes", default="float32,bfloat16,bfloat16w")
    ap.add_argument("--shapes", default="4096x32000,2048x50257,1024x128256")
    ap.add_argument("--settings", default="0,1,2,1s3,2s3")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--trials", type=int, default=5)
    args = ap.parse_args(argv)
    start = KG.ab_start("ce_long_ab", args.trials, args.rounds, "settings alternated")
    if start is None:
        return 0
    cp, torch, timer, bw = start
    settings = [s for s in args.settings.split(",") if s]
    with KG.torch_stream(torch):
        for dtype_name in args.dtypes.split(","):
            for shape in [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]:
                try:
                    run_case(timer, cp, torch, dtype_name, shape, bw, args.rounds, settings)
                except Exception as exc:        # noqa: BLE001 -- one case must not take the others down
                    print(f"ce fwd {dtype_name} {shape}: failed: {type(exc).__name__}: {exc}")
                cp.get_default_memory_pool().free_all_blocks()
    return 0


if __name__ == "__main__":
    sys.exit(main())

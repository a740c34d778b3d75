"""A/B of session 13's dropout without a stored mask (issue 10): backend/cuda/dropout_philox.py's RESERVE
"mask" (the forward stores the 1-byte keep mask, the backward reads it -- the path before this session,
MINIDNN_DROPOUT_MASK=1), "record" (MINIDNN_DROPOUT_MASK=0: the forward writes a 16-byte (key, counter) record,
the backward draws the same Philox numbers again) and "bits" (the default since session 13's run 3: a 1-bit mask, n / 8
bytes, no Philox work in the backward), with PyTorch's torch.ops.aten.native_dropout / native_dropout_backward beside,
forward and backward, device time only (CUDA-graph replays), in one process.

    python tools/dropout_ab.py [--dtypes float32,bfloat16] [--shapes 128x64x56x56,128x256] [--rounds 4] [--trials 5]
                               [--sides mask,record,bits,torch] [--directions fwd,bwd]

Session 14: a side is a reserve with optional settings, ``RESERVE[+d16][+fit][+nopipe]``, or ``torch``: ``+d16``
turns DRAW16 on (16-bit data draws one Philox block per 8 elements; flipped in place: the runners follow it),
``+fit`` UNROLL_FIT (the forward's UNROLL halved only while the halved grid fits one wave), ``+nopipe`` PIPE_FWD "0"
(16-bit data through dropout_fwd's exact grid, as float32: whether the persistent pipe still pays once the Philox
work is halved); the last two are read when planning, so the plans are cleared where they change (the capture's
warm-up re-plans outside the capture).  The DRAW16 A/B:

    python tools/dropout_ab.py --dtypes bfloat16,float16 --shapes 128x64x56x56,128x256 \
        --sides bits,bits+d16,record,record+d16,torch

and the small float32 forward: --dtypes float32 --shapes 128x16x32x32 --sides bits,bits+fit,torch --directions fwd.
The ratios are against the FIRST side (base/this) and PyTorch (torch/this).

Method (as tools/row_ab.py): per case (direction, dtype, shape) `rounds` rounds; a round times mask, record, bits
and PyTorch in turn, the order reversed every other round (a drift of clocks cancels), each timing a fresh capture of
`reps` calls (bench/kernels_gpu.py's Timer.graph: the backend primitive with its host work, p = 0.5) replayed
`trials` times (median).  The switch is flipped in place (the plans and seen tables key on it: nothing is
forgotten); the backward of each setting reads a reserve its own forward made before the capture.  Reported per
side: the median over rounds (ms a call), GB/s of the bytes THAT side moves and % of the copy bandwidth measured in
the same run -- mask and PyTorch: x + y + mask forward, dy + mask + dx backward (2 x itemsize + 1 bytes an
element); record: x + y and dy + dx (2 x itemsize; the 16-byte record is left out); bits: 2 x itemsize + 1/8
(the bit mask rounded up to whole words) -- the spread (max/min - 1),
and the medians of the per-round ratios mask/this and torch/this (> 1: this side is faster).
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

import minidnn.backend as B  # noqa: E402
from minidnn.backend.cuda import dropout_philox as DP  # noqa: E402

SIDES = ("mask", "record", "bits", "torch")
_RESERVE_TYPE = {"record": DP.PhiloxReserve, "bits": DP.BitMaskReserve}
_MODS = ("d16", "fit", "nopipe")
_IMPORTED = dict(DRAW16=DP.DRAW16, UNROLL_FIT=DP.UNROLL_FIT, PIPE_FWD=DP.PIPE_FWD)


def parse_side(side):
    """"bits+d16" -> ("bits", {"d16"}); "torch" -> ("torch", set()).  Unknown names raise before any work."""
    base, *mods = side.split("+")
    if base not in SIDES or (base == "torch" and mods) or not set(mods) <= set(_MODS):
        raise SystemExit(f"dropout_ab: side {side!r} must be torch or one of {SIDES[:3]} with +{' +'.join(_MODS)}")
    return base, set(mods)


def apply_side(side):
    """Set the module's switches for ``side`` (a minidnn side): RESERVE, DRAW16 (read per call), UNROLL_FIT and
    PIPE_FWD (read when planning: the plans are cleared where one changes)."""
    base, mods = parse_side(side)
    DP.RESERVE = base
    DP.DRAW16 = "d16" in mods
    _planning(UNROLL_FIT="fit" in mods, PIPE_FWD="0" if "nopipe" in mods else _IMPORTED["PIPE_FWD"])


def _planning(**values):
    changed = False
    for name, v in values.items():
        if getattr(DP, name) != v:
            setattr(DP, name, v)
            changed = True
    if changed:
        DP.clear_plans()


def restore():
    DP.RESERVE = {"1": "mask", "mask": "mask", "0": "record", "record": "record"}.get(
        os.environ.get("MINIDNN_DROPOUT_MASK", "bits"), "bits")
    DP.DRAW16 = _IMPORTED["DRAW16"]
    _planning(UNROLL_FIT=_IMPORTED["UNROLL_FIT"], PIPE_FWD=_IMPORTED["PIPE_FWD"])


def bytes_moved(side, n, itemsize):
    """Bytes one call of ``side`` moves (either direction): input and output, plus the mask where stored (1 byte an
    element for mask and PyTorch, 1 bit for bits)."""
    return 2 * itemsize * n + {"record": 0, "bits": 4 * (-(-n // 32))}.get(parse_side(side)[0], n)


def run_case(timer, cases, direction, shape, dtype_name, bw, rounds, torch, sides=SIDES):
    from minidnn.nn._functions.activation import _SeededDropoutDescriptor
    desc = _SeededDropoutDescriptor(0.5)
    x, dy = cases.x(shape), cases.x(shape)
    n, item = x.size, x.dtype.itemsize
    fns, reserves = {}, {}
    for side in sides:
        if side == "torch":
            continue
        apply_side(side)
        _, reserves[side] = B.dropout_forward(None, desc, x)     # plans and compiles outside any capture
        want = _RESERVE_TYPE.get(parse_side(side)[0], type(dy))
        if not isinstance(reserves[side], want):
            raise RuntimeError(f"{side}: dropout_forward returned a {type(reserves[side]).__name__}")
        if isinstance(reserves[side], DP.PhiloxReserve) and reserves[side].draw16 != DP.uses_draw16(x.dtype, 0.5):
            raise RuntimeError(f"{side}: the record's stream is not the setting's")
        if direction == "fwd":
            fns[side] = lambda: B.dropout_forward(None, desc, x)
        else:
            fns[side] = (lambda r: lambda: B.dropout_backward(None, desc, dy, r))(reserves[side])
        fns[side]()
    if torch is not None and "torch" in sides:
        xt, dyt = cases.t(shape), cases.t(shape)
        _, mt = torch.ops.aten.native_dropout(xt, 0.5, True)
        if direction == "fwd":
            fns["torch"] = lambda: torch.ops.aten.native_dropout(xt, 0.5, True)
        else:
            fns["torch"] = lambda: torch.ops.aten.native_dropout_backward(dyt, mt, 2.0)
    sides = [s for s in sides if s in fns]
    first = sides[0]
    got = {s: [] for s in sides}
    ratios = {s: {first: [], "torch": []} for s in sides}
    reps = {}
    try:
        for r in range(rounds):
            this = {}
            for side in (sides if r % 2 == 0 else sides[::-1]):
                if side != "torch":
                    apply_side(side)
                if side not in got:             # PyTorch's capture failed in an earlier round
                    continue
                framework = "torch" if side == "torch" else "minidnn"
                try:
                    reps[side] = reps.get(side) or timer.reps(fns[side], framework)
                    this[side] = timer.graph(fns[side], reps[side], framework)
                except Exception as exc:        # noqa: BLE001 -- PyTorch's side only; ours must capture
                    if side != "torch":
                        raise
                    print(f"  (PyTorch capture failed: {type(exc).__name__}: {exc})")
                    del got[side]
                    continue
                got[side].append(this[side])
            for s in this:
                for ref in (first, "torch"):
                    if ref in this:
                        ratios[s][ref].append(this[ref] / this[s])
    finally:
        restore()
    name = f"dropout {direction}"
    for s in [s for s in sides if s in got]:
        ms = statistics.median(got[s])
        gbs = bytes_moved(s, n, item) / (ms * 1e-3) / 1e9
        spread = max(got[s]) / min(got[s]) - 1
        vs = "  ".join(f"{ref}/this {statistics.median(ratios[s][ref]):.3f}" for ref in dict.fromkeys((first, "torch"))
                       if ratios[s][ref])
        mb = bytes_moved(s, n, item) / 1e6
        print(f"{name:12s} {dtype_name:9s} {str(shape):18s} {s:11s} {ms:8.4f} ms {mb:7.1f} MB "
              f"{gbs:6.0f} GB/s {100 * gbs / bw:4.0f}%  spread {100 * spread:4.1f}%  {vs}")
    sys.stdout.flush()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--shapes", default="128x64x56x56,128x256")
    ap.add_argument("--directions", default="fwd,bwd")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--sides", default=",".join(SIDES),
                    help="RESERVE[+d16][+fit][+nopipe] or torch, comma-separated; the first is the ratios' base")
    args = ap.parse_args(argv)
    sides = args.sides.split(",")
    for side in sides:
        parse_side(side)
    start = KG.ab_start("dropout_ab", args.trials, args.rounds, "sides alternated")
    if start is None:
        return 0
    cp, torch, timer, bw = start
    print(f"p = 0.5; MB: the bytes each side moves (mask, torch: +1 byte an element; bits: +1 bit); sides {sides} "
          f"(+d16: DRAW16 on, 16-bit data only; +fit: UNROLL_FIT on; +nopipe: PIPE_FWD 0); as imported {_IMPORTED}")
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    with KG.torch_stream(torch):
        for dtype_name in args.dtypes.split(","):
            cases = KG.Cases(cp, torch, dtype_name)
            for shape in shapes:
                for direction in args.directions.split(","):
                    try:
                        run_case(timer, cases, direction, shape, dtype_name, bw, args.rounds, torch, sides)
                    except Exception as exc:        # noqa: BLE001 -- one case must not take the others down
                        print(f"dropout {direction} {dtype_name} {shape}: failed: {type(exc).__name__}: {exc}")
            del cases
            cp.get_default_memory_pool().free_all_blocks()
    return 0


if __name__ == "__main__":
    sys.exit(main())

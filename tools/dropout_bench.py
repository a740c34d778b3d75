"""Dropout kernels on the GPU: forward and backward time per launch setting of backend/cuda/dropout_philox.py,
beside the first kernel (MINIDNN_DROPOUT_V1's, forward float32 only) and PyTorch's native_dropout /
native_dropout_backward, for float32, bfloat16 and float16 on activations of three sizes.

    python tools/dropout_bench.py [--dtypes float32,bfloat16,float16] [--trials 5]

Timing and traffic as bench/kernels_gpu.py (its Timer and copy bandwidth; %copy = compulsory traffic -- x or dy
and the output, plus the 1-byte mask -- over the time, against a 256 MiB device copy).  Settings (the module's
launch choices; the default is marked with *, each row names what the shape got):
  forward   "u2/b0/h0": UNROLL 2, no block cap (b8: at most 8 blocks an SM, grid-stride), cache hint 0 (1: streaming
            loads and stores, 2: streaming stores); "rule": UNROLL by the rule (64 bytes a thread, halved under
            one wave), shown as "rule=u4";
  backward  "t16/h1": dropout_bwd_tile, 16 elements (one 16-byte mask load) a thread, exact grid, hint 1 (the rule
            halves the tile under one wave, shown as "t16=t8"); "loop u1/b0/h0": the grid-stride dropout_bwd.
"(prev)" marks the launch before session 6's round 3 (forward u1/b8, backward loop u2/b8, no hints).
The sweep times the stored-mask path (dropout_philox.RESERVE "mask": these are its launch choices); the rows
"record" time session 13's default without a mask (default launch choices; its %copy counts x + y or dy + dx,
2 x itemsize bytes an element, the mask rows 2 x itemsize + 1).  tools/dropout_ab.py is the A/B of the two.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import kernels_gpu as K  # noqa: E402

import minidnn.backend as B  # noqa: E402
from minidnn.backend import devices as _dev  # noqa: E402
from minidnn.backend.cuda import dropout_philox as DP  # noqa: E402

SHAPES = ((128, 64, 56, 56), (32, 256, 1024), (128, 16, 32, 32))
# (label, UNROLL_FWD, BPS_FWD, HINT_FWD)
FWD = (("rule/h0", 0, 0, 0), ("u1/b0/h0", 1, 0, 0), ("u2/b0/h0", 2, 0, 0), ("u4/b0/h0", 4, 0, 0),
       ("rule/h1", 0, 0, 1), ("rule/h2", 0, 0, 2), ("u1/b8 (prev)", 1, 8, 0))
# (label, TILE_BWD, UNROLL_BWD, BPS_BWD, HINT_BWD)
BWD = (("t16/h1", 16, 1, 0, 1), ("t16/h0", 16, 1, 0, 0), ("t16/h2", 16, 1, 0, 2), ("t8/h1", 8, 1, 0, 1),
       ("t4/h1", 4, 1, 0, 1), ("loop u1/b0/h0", 0, 1, 0, 0), ("loop u1/b0/h1", 0, 1, 0, 1),
       ("loop u2/b8 (prev)", 0, 2, 8, 0))
_F = ("UNROLL_FWD", "BPS_FWD", "HINT_FWD")
_B = ("TILE_BWD", "UNROLL_BWD", "BPS_BWD", "HINT_BWD")


def _set(names, values):
    for name, v in zip(names, values):
        setattr(DP, name, v)
    DP.clear_plans()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtypes", default="float32,bfloat16,float16")
    ap.add_argument("--trials", type=int, default=5)
    args = ap.parse_args(argv)
    if not _dev.cuda_is_available():
        print("dropout_bench: no CUDA GPU with CuPy here; nothing to measure")
        return 0
    cp = _dev.require_cupy()
    try:
        import torch
    except ImportError:
        torch = None
    timer = K.Timer(cp, torch, args.trials)
    bw = K.copy_bandwidth(cp, timer)
    print(f"device: {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}; copy bandwidth {bw:.0f} GB/s")
    store = DP.RESERVE
    DP.RESERVE = "mask"                 # the sweep is of the mask path's launch choices (docstring)
    default_f = tuple(getattr(DP, n) for n in _F)
    default_b = tuple(getattr(DP, n) for n in _B)
    from minidnn.nn._functions.activation import _SeededDropoutDescriptor
    desc = _SeededDropoutDescriptor(0.5)
    print(f"{'dtype':9s} {'shape':20s} {'dir':4s} {'setting':22s} {'ms':>8s} {'%copy':>6s} {'torch ms':>9s} "
          f"{'vs torch':>8s}")
    for name in args.dtypes.split(","):
        cases = K.Cases(cp, torch, name)
        for shape in SHAPES:
            x, dy = cases.x(shape), cases.x(shape)
            n, item = x.size, x.dtype.itemsize
            nbytes = 2 * x.nbytes + x.size
            _, mask = B.dropout_forward(None, desc, x)
            tf = tb = None
            if torch is not None:
                xt, dyt = cases.t(shape), cases.t(shape)
                _, mt = torch.ops.aten.native_dropout(xt, 0.5, True)
                tf = timer.torch_(lambda: torch.ops.aten.native_dropout(xt, 0.5, True))
                tb = timer.torch_(lambda: torch.ops.aten.native_dropout_backward(dyt, mt, 2.0))
            rows = []
            for label, *values in FWD:
                _set(_F, values)
                if not values[0]:
                    label = label.replace("rule", f"rule=u{DP.forward_unroll(n, item, 0)}")
                mark = "*" if tuple(values) == default_f else ""
                rows.append(("fwd", label + mark, timer.cupy(lambda: B.dropout_forward(None, desc, x)), tf))
            _set(_F, default_f)
            for label, *values in BWD:
                _set(_B, values)
                if values[0]:
                    t = DP.backward_tile(n, item, 0)
                    label = label if t == values[0] else label.replace(f"t{values[0]}", f"t{values[0]}=t{t}")
                mark = "*" if tuple(values) == default_b else ""
                rows.append(("bwd", label + mark, timer.cupy(lambda: B.dropout_backward(None, desc, dy, mask)), tb))
            _set(_B, default_b)
            DP.RESERVE = "record"           # session 13's default: no mask (its own bytes)
            _, rec = B.dropout_forward(None, desc, x)
            rows.append(("fwd", "record", timer.cupy(lambda: B.dropout_forward(None, desc, x)), tf, 2 * x.nbytes))
            rows.append(("bwd", "record", timer.cupy(lambda: B.dropout_backward(None, desc, dy, rec)), tb,
                         2 * x.nbytes))
            DP.RESERVE = "mask"
            if name == "float32":           # the first kernel, for the A/B
                DP.V1 = True
                DP.clear_plans()
                rows.append(("fwd", "v1", timer.cupy(lambda: B.dropout_forward(None, desc, x)), tf))
                DP.V1 = False
                DP.clear_plans()
            for d, label, ms, tms, *moved in rows:
                pct = 100 * (moved[0] if moved else nbytes) / (ms * 1e-3) / 1e9 / bw
                tcol = f"{tms:9.4f} {tms / ms:7.2f}x" if tms else ""
                print(f"{name:9s} {str(shape):20s} {d:4s} {label:22s} {ms:8.4f} {pct:5.0f}% {tcol}")
            sys.stdout.flush()
        del cases
        cp.get_default_memory_pool().free_all_blocks()
    DP.RESERVE = store
    DP.clear_plans()
    return 0


if __name__ == "__main__":
    sys.exit(main())

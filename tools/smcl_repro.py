"""One cluster softmax call at a time (softmax_cluster, "all"), synchronised after each: for compute-sanitizer.

    compute-sanitizer --tool memcheck python3 tools/smcl_repro.py [float32:64x50257:fwd:ACCURATE[:CL,NT] ...]
    REPEAT=10000 python3 tools/smcl_repro.py bfloat16:2048x65536:fwd:ACCURATE:4,256     # a bitwise stress

REPEAT=N (session 25): each case's call N more times, every output compared bit for bit with the first (a cluster
exchange that went wrong now and then -- a store landing in the wrong slot -- would show as a mismatch).
"""
import sys

import numpy as np

import minidnn.backend as B
from minidnn.backend import devices as _dev
from minidnn.backend.cuda import softmax_cluster as SC
from minidnn.backend.cuda import softmax_kernels as SK

CASES = ["float32:64x50257:fwd:ACCURATE", "float32:300x16385:fwd:ACCURATE", "float32:300x16385:fwd:ACCURATE",
         "float32:300x16385:bwd:ACCURATE", "bfloat16:300x50257:fwd:LOG", "bfloat16:300x50257:bwd:LOG"]


def main(cases):
    import os
    cp = _dev.require_cupy()
    if os.environ.get("SMCL_RELEASE") == "1":      # the start's arrive with release semantics (before session 25:
        SC.SOURCE = SC.SOURCE.replace("barrier.cluster.arrive.relaxed.aligned",   # the closing arrive's)
                                      "barrier.cluster.arrive.release.aligned")
    if os.environ.get("SMCL_MINB"):
        SC.MINB_FWD = int(os.environ["SMCL_MINB"])
    SC.CLUSTER = "all"
    SK._plans.clear()
    for case in cases:
        name, shape, way, algo, *force = case.split(":")
        SC.FORCE_CL, SC.FORCE_NT = (int(v) for v in (force[0].split(",") if force else (0, 0)))
        SK._plans.clear()
        rows, c = (int(v) for v in shape.split("x"))
        dt = SK._dtype_of(name)
        x = cp.asarray(np.random.default_rng(0).standard_normal((rows, c)).astype(np.float32)).astype(dt)
        lp = SC.plan(rows, c, dt, algo, way == "bwd", 0)
        print(case, "plan", lp, "ptr", x.data.ptr % 256, flush=True)
        a = "log" if algo == "LOG" else "accurate"
        y = B.softmax_forward(None, a, None, x, axis=-1)
        cp.cuda.Device().synchronize()
        if way == "bwd":
            dx = B.softmax_backward(None, a, None, y, x, axis=-1)
            cp.cuda.Device().synchronize()
            print("  dx finite", bool(cp.isfinite(dx.astype(np.float32)).all()), flush=True)
        print("  ok, y finite", bool(cp.isfinite(y.astype(np.float32)).all()), flush=True)
        n = int(os.environ.get("REPEAT", "0"))
        if n:
            bad = 0
            for _ in range(n):
                y2 = B.softmax_forward(None, a, None, x, axis=-1)
                bad += int(not bool(cp.array_equal(y2.view(cp.uint8), y.view(cp.uint8))))
                if way == "bwd":
                    dx2 = B.softmax_backward(None, a, None, y, x, axis=-1)
                    bad += int(not bool(cp.array_equal(dx2.view(cp.uint8), dx.view(cp.uint8))))
            print(f"  {n} repeats: {bad} outputs differ from the first", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or CASES)

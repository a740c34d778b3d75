"""The kernels tools/row_ab.py plans for its settings, collected without compiling: its precompile runs with
softmax_kernels.precompile replaced by a collector (the tests of --bwd-stash, --warp-from and --hint)."""
import os
import sys

from minidnn.backend.cuda import softmax_kernels as _sk

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def row_ab_specs(*calls):
    """For each (ops, dtypes, shapes, settings) call of row_ab.precompile, the launch specs it planned (a list per
    call, in order); softmax_kernels.precompile is restored afterwards."""
    for d in ("tools", "bench"):
        if os.path.join(ROOT, d) not in sys.path:
            sys.path.insert(0, os.path.join(ROOT, d))
    import row_ab
    out = []
    real = _sk.precompile
    try:
        for ops, dtypes, shapes, settings in calls:
            got = []
            _sk.precompile = lambda specs, procs=None, got=got: got.extend(specs) or len(specs)
            row_ab.precompile(ops, dtypes, shapes, settings)
            out.append(got)
    finally:
        _sk.precompile = real
    return out

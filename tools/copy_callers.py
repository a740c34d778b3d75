"""Where a training step's CuPy copies and small kernels come from (the kernels the device table names
``cupy_copy_*``, ``cupy_add_*``, ``Memcpy DtoD``): a cProfile of a few eager steps of one model of
bench/train_step.py on the GPU, printing the callers of CuPy's copying entry points, then the autotuner's report
(the convolution algorithm chosen per problem, every candidate's time).

    PYTHONPATH=. python3 tools/copy_callers.py [--model lenet5] [--steps 5] [--tf32]
"""
import argparse
import cProfile
import os
import pstats
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))

from train_step import CONFIGS, make_step, set_math  # noqa: E402

import minidnn as mdn  # noqa: E402
import minidnn.models  # noqa: E402

PATTERNS = ("'copy'", "ascontiguousarray", "'astype'", "__setitem__", "copy_from_device_async", "'__add__'",
            "'__iadd__'", "'sum'", "'reshape'", "_blas_ready", "elementwise_copy")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="lenet5")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--tf32", action="store_true")
    args = ap.parse_args()
    set_math(args.tf32)
    ctor, shape, batch = CONFIGS[args.model]
    step, _, _ = make_step(mdn, vars(minidnn.models), ctor, shape, batch, "cuda")
    _print_choices()
    for _ in range(5):
        step()
    mdn.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(args.steps):
        step()
    mdn.cuda.synchronize()
    prof.disable()
    print(f"== {args.model}: callers ({args.steps} steps: divide the counts by {args.steps})")
    st = pstats.Stats(prof)
    for pattern in PATTERNS:
        st.print_callers(pattern)


def _print_choices():
    """Print each convolution problem's algorithm once, as the heuristic (or the autotuner) picks it."""
    from minidnn.backend import convolution as conv
    seen = set()
    for reg in (conv.FORWARD_ALGORITHMS, conv.BACKWARD_DATA_ALGORITHMS, conv.BACKWARD_FILTER_ALGORITHMS):
        def choose(p, *a, _reg=reg, _orig=reg.choose, **k):
            alg = _orig(p, *a, **k)
            if (_reg.name, p) not in seen:
                seen.add((_reg.name, p))
                print(f"algorithm: {_reg.name}: {getattr(alg, 'algo', alg)}  N{p.N} C{p.C} K{p.K} in {p.in_size} "
                      f"out {p.out_size} kernel {p.kernel} stride {p.stride} groups {p.groups} {p.dtype}")
            return alg
        reg.choose = choose


if __name__ == "__main__":
    main()

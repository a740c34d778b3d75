"""Device-kernel time per step by kernel name for bench/amp_step.py's mixed-precision steps, minidnn beside
PyTorch (issue 12: where a bf16 / channels-last step's GPU time goes).

    PYTHONPATH=. python3 tools/amp_kernels.py [--models resnet20] [--modes bf16,bf16+cl] [--top 20] [--casts]

``--sequence``: instead, every kernel of ONE step in launch order, both frameworks (name, µs, grid, block from the
profiler's trace), so that layers can be paired launch by launch.

``--casts``: instead, where minidnn's casts come from -- a cProfile of 5 steps, printing the callers (two levels)
of CuPy's ``astype`` and of minidnn's cast entry points, with call counts per step.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from amp_step import minidnn_step, torch_step  # noqa: E402
from profile_step import print_table, step_kernel_times  # noqa: E402
from train_step import set_math, torch_models  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="resnet20")
    ap.add_argument("--modes", default="bf16,bf16+cl")
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--casts", action="store_true")
    ap.add_argument("--sequence", action="store_true")
    args = ap.parse_args()
    set_math(False)
    if args.sequence:
        ns = torch_models()
        for name in args.models.split(","):
            for mode in args.modes.split(","):
                print_sequence(f"{name} {mode} minidnn", minidnn_step(name, mode, "cuda"))
                print_sequence(f"{name} {mode} torch", torch_step(name, mode, "cuda", ns))
        return
    if args.casts:
        for name in args.models.split(","):
            for mode in args.modes.split(","):
                cast_callers(name, mode)
        return
    ns = torch_models()
    for name in args.models.split(","):
        for mode in args.modes.split(","):
            print_table(f"{name} {mode} minidnn", step_kernel_times(minidnn_step(name, mode, "cuda")), args.top)
            print_table(f"{name} {mode} torch", step_kernel_times(torch_step(name, mode, "cuda", ns)), args.top)


def print_sequence(title, step):
    """The kernels of one step in launch order: name, device µs, grid and block (the profiler's chrome trace)."""
    import json
    import tempfile

    import torch
    from torch.profiler import ProfilerActivity, profile

    import minidnn as mdn
    for _ in range(15):
        step()
    mdn.cuda.synchronize()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        mdn.cuda.synchronize()
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        trace = json.load(open(f.name))
    kernels = sorted((e for e in trace["traceEvents"] if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")),
                     key=lambda e: e["ts"])
    total = sum(e.get("dur", 0) for e in kernels)
    print(f"== {title}: {len(kernels)} kernels, {total:.1f} us of device time in one step")
    for e in kernels:
        a = e.get("args", {})
        print(f"  {e.get('dur', 0):7.1f} us  {e['name'][:60]:60s} grid {a.get('grid', '')} block {a.get('block', '')}")


def cast_callers(name, mode, steps=5):
    import cProfile
    import pstats

    import minidnn as mdn
    step = minidnn_step(name, mode, "cuda")
    for _ in range(3):
        step()
    mdn.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        step()
    mdn.cuda.synchronize()
    prof.disable()
    print(f"== {name} {mode}: callers of the casts ({steps} steps; divide the counts by {steps})")
    st = pstats.Stats(prof)
    st.sort_stats("cumulative")
    for pattern in ("'astype'", "_cast_to", "def to\\b", "cast_inputs"):
        st.print_callers(pattern)
    # one level up: who calls the callers of astype
    callers = set()
    for func, (_, _, _, _, who) in st.stats.items():
        if "astype" in func[2]:
            callers.update(who)
    for func in callers:
        st.print_callers(f"{func[2]}")


if __name__ == "__main__":
    main()

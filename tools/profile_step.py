"""Where an eager training step's host time goes, at the benchmark's real shapes (issue 10).

For each model of bench/train_step.py: the step's wall time to a synchronize, the host time of one step() call
(the kernels run asynchronously: when the host is the bottleneck, step() returns about when the GPU is done),
the process CPU time per step, minidnn's own launches per step, and a cProfile of N steps (the functions with
the most own time, and the most cumulative time), written to stdout.

    PYTHONPATH=. python3 tools/profile_step.py [--models resnet20] [--steps 20] [--top 40] [--device cuda]
"""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))

from train_step import CONFIGS, make_step, set_math  # noqa: E402

import minidnn as mdn  # noqa: E402
import minidnn.models  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="resnet20")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--device", default="cuda" if mdn.cuda.is_available() else "cpu")
    ap.add_argument("--batch-size", type=int, default=None)
    ap.add_argument("--kernels", action="store_true",
                    help="only the device-kernel time per step by kernel name, minidnn beside PyTorch (CUPTI)")
    ap.add_argument("--tf32", action="store_true")
    ap.add_argument("--amp", default="fp32", help="one of bench/amp_step.py's modes (fp32, bf16, fp16, bf16+cl): "
                    "profile that step (forward under autocast) instead of train_step's")
    ap.add_argument("--dump", default=None, help="folder: write each model's pstats file there (<model>.prof)")
    args = ap.parse_args(argv)
    set_math(args.tf32)
    if args.kernels:
        for name in args.models.split(","):
            kernel_table(name, args.batch_size, args.top)
        return
    sync = mdn.cuda.synchronize if args.device != "cpu" else (lambda: None)
    for name in args.models.split(","):
        ctor, shape, batch = CONFIGS[name]
        batch = args.batch_size or batch
        if args.amp != "fp32":
            import amp_step
            step = amp_step.minidnn_step(name, args.amp, args.device)
        else:
            step, _, _ = make_step(mdn, vars(minidnn.models), ctor, shape, batch, args.device)
        for _ in range(10):
            step()
        sync()
        wall, host, cpu = [], [], []
        for _ in range(args.steps):
            c0 = time.process_time()
            t0 = time.perf_counter()
            step()
            t1 = time.perf_counter()
            sync()
            t2 = time.perf_counter()
            c1 = time.process_time()
            wall.append((t2 - t0) * 1e3)
            host.append((t1 - t0) * 1e3)
            cpu.append((c1 - c0) * 1e3)
        launches = None
        if args.device != "cpu":
            from minidnn.backend.cuda import launch
            start = launch.launch_count()
            step()
            sync()
            launches = launch.launch_count() - start
        print(f"== {name} {args.amp} batch {batch} on {args.device}: wall {statistics.median(wall):.2f} ms, "
              f"host step() {statistics.median(host):.2f} ms, cpu {statistics.median(cpu):.2f} ms, "
              f"own launches/step {launches}")
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.steps):
            step()
        sync()
        prof.disable()
        if args.dump:
            os.makedirs(args.dump, exist_ok=True)
            prof.dump_stats(os.path.join(args.dump, f"{name}.prof"))
        for key in ("tottime", "cumulative"):
            buf = io.StringIO()
            st = pstats.Stats(prof, stream=buf)
            st.sort_stats(key).print_stats(args.top)
            text = buf.getvalue()
            print(f"-- {name}: by {key} ({args.steps} steps)")
            print(text[text.find("ncalls"):])


def _kernel_times(lib, models, ctor, shape, batch, steps=5):
    """{kernel name: (µs per step, launches per step)} of one library's step, from PyTorch's profiler."""
    step, _, _ = make_step(lib, models, ctor, shape, batch, "cuda")
    return step_kernel_times(step, steps)


def step_kernel_times(step, steps=5):
    """{kernel name: (µs per step, launches per step)} of ``step()`` on the GPU, from PyTorch's profiler (CUPTI sees
    every kernel of the process, CuPy's and minidnn's included)."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    for _ in range(15):
        step()
    torch.cuda.synchronize()
    mdn.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        mdn.cuda.synchronize()
        torch.cuda.synchronize()
    table = {}
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        t, n = table.get(e.name, (0.0, 0))
        table[e.name] = (t + e.device_time / steps, n + 1 / steps)
    return table


def print_table(title, table, top):
    total = sum(t for t, _ in table.values())
    count = sum(n for _, n in table.values())
    print(f"== {title}: device kernel time {total / 1e3:.3f} ms/step in {count:.0f} kernels")
    for kname, (t, n) in sorted(table.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"  {t:9.1f} us {n:5.0f}x  {kname[:110]}")


def kernel_table(name, batch, top):
    import train_step
    ctor, shape, default_batch = CONFIGS[name]
    batch = batch or default_batch
    for label, lib, models in (("minidnn", mdn, vars(minidnn.models)),
                               ("torch", __import__("torch"), train_step.torch_models())):
        print_table(f"{name} b{batch} {label}", _kernel_times(lib, models, ctor, shape, batch), top)


if __name__ == "__main__":
    main()

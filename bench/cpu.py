"""The CPU table of issue 16: minidnn beside PyTorch (CPU build) from one run, the same thread count each.

    python bench/cpu.py [--threads 1,2] [--rounds 7] [--only lenet,conv16]

Rows: per-op overhead (forward + backward of 8-element mul/add chains), LeNet-5 training step (32x32, batch
64 and 256, SGD with momentum), convolution forward + backward (dense 3x3 at 16 and 64 channels, depthwise
3x3 at 64 channels; N32, 32x32), one digits epoch of examples/train_lenet.py's set-up (LeNet-5 on 16x16
upsampled digits, batch 32, AdamW, label smoothing, augmentation through minidnn's DataLoader for both), an
Adam step over ResNet-20's parameters (minidnn fused, PyTorch foreach), and one epoch of minidnn's DataLoader
with augmentation beside a PyTorch DataLoader doing the same per sample.

How it is timed, because the machine may be shared: each row runs minidnn and PyTorch alternately (and every
thread count of ``--threads`` in turn), ``--rounds`` times, and prints each side's *fastest* round (a repeated
minimum: other processes only ever add time) and the median round, with the load average and the CPU pressure
(Linux's /proc/pressure/cpu: how much of the last 10 s some task waited for a core) at the start and end.
Wall-clock time, so BLAS threads count as they would for a user.  The PyTorch side is skipped where PyTorch is
not installed.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import minidnn as mdn  # noqa: E402
import minidnn.nn.functional as F  # noqa: E402
from minidnn import models  # noqa: E402
from minidnn.data import DataLoader  # noqa: E402
from minidnn.data import transforms as T  # noqa: E402
from minidnn.data.datasets import load_digits  # noqa: E402

try:
    import torch
except ImportError:
    torch = None


CLOCK = [time.perf_counter]      # --cpu-time: time.process_time (this process's CPU seconds, all threads)


SETTLE = [0.0]                   # --settle: seconds of untimed calls before each timed round (at least one call)


def best_of(fn, rounds, inner):
    """Fastest of ``rounds`` rounds of ``inner`` calls, seconds per call (after one warm-up call, or warm-up calls
    for at least SETTLE[0] seconds)."""
    t_end = time.perf_counter() + SETTLE[0]
    fn()
    while time.perf_counter() < t_end:
        fn()
    best = float("inf")
    clock = CLOCK[0]
    for _ in range(rounds):
        t0 = clock()
        for _ in range(inner):
            fn()
        best = min(best, (clock() - t0) / inner)
    return best


THREADS = [2]                # --threads: the thread counts every row runs at, alternated round by round


def set_threads(n):
    mdn.set_num_threads(n)
    if torch is not None:
        torch.set_num_threads(n)


def lenet_step(x_np, y_np):
    """One minidnn LeNet-5 training step (cross-entropy, SGD momentum 0.9) on the batch ``x_np``, ``y_np``, as a
    callable (tools/cpu_lenet_profile.py profiles the same step)."""
    mdn.manual_seed(0)
    model = models.LeNet5(10, 1, 32)
    opt = mdn.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = mdn.tensor(x_np), mdn.tensor(y_np)

    def step():
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return step


def side_by_side(make_mdn, make_torch, rounds, inner):
    """{threads: (minidnn rounds, torch rounds or None)}, seconds per call: each round runs every thread count of
    --threads in turn, minidnn then PyTorch at each, one round of ``inner`` calls each (after one warm-up call)."""
    fm = make_mdn()
    ft = make_torch() if torch is not None and make_torch is not None else None
    times = {n: ([], [] if ft else None) for n in THREADS}
    for n in THREADS:
        set_threads(n)
        fm()
        if ft:
            ft()
    for _ in range(rounds):
        for n in THREADS:
            set_threads(n)
            times[n][0].append(best_of(fm, 1, inner))
            if ft:
                times[n][1].append(best_of(ft, 1, inner))
    return times


# ---- rows ----------------------------------------------------------------------------------------------

def overhead_row(rounds):
    import overhead
    per_op = 2 * overhead.CHAIN

    def make(lib):
        lib.manual_seed(0)
        x, w, b = (lib.randn(8, requires_grad=True) for _ in range(3))
        return lambda: overhead._chain(x, w, b, True)
    times = side_by_side(lambda: make(mdn), lambda: make(torch), rounds, 20)
    return ("per-op overhead fwd+bwd (8 elements)", times, 1e6 / per_op, "us")


def _torch_twins():
    import train_step
    train_step.torch = torch
    return train_step.torch_models()


def lenet_rows(rounds, batches=(64, 256)):
    rows = []
    twins = _torch_twins() if torch is not None else None
    for batch in batches:
        rng = np.random.default_rng(0)
        x_np = rng.standard_normal((batch, 1, 32, 32)).astype(np.float32)
        y_np = rng.integers(0, 10, batch)

        def make_mdn():
            return lenet_step(x_np, y_np)

        def make_torch():
            torch.manual_seed(0)
            model = twins["LeNet5"](10, 1, 32)
            opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
            x, y = torch.from_numpy(x_np), torch.from_numpy(y_np)

            def step():
                loss = torch.nn.functional.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
            return step
        times = side_by_side(make_mdn, make_torch, rounds, 5 if batch <= 64 else 2)
        rows.append((f"LeNet-5 training step, batch {batch}", times, 1e3, "ms"))
    return rows


def conv_row(rounds, channels, depthwise):
    groups = channels if depthwise else 1
    rng = np.random.default_rng(0)
    x_np = rng.standard_normal((32, channels, 32, 32)).astype(np.float32)
    w_np = rng.standard_normal((channels, channels // groups, 3, 3)).astype(np.float32) * 0.1
    gy_np = rng.standard_normal((32, channels, 32, 32)).astype(np.float32)

    def make(lib, conv):
        x = lib.tensor(x_np, requires_grad=True)
        w = lib.tensor(w_np, requires_grad=True)
        gy = lib.tensor(gy_np)

        def step():
            x.grad = w.grad = None
            conv(x, w, padding=1, groups=groups).backward(gy)
        return step
    times = side_by_side(lambda: make(mdn, F.conv2d),
                         lambda: make(torch, torch.nn.functional.conv2d), rounds, 2 if channels <= 16 else 1)
    name = (f"depthwise fwd+bwd N32 C{channels} 32², 3x3" if depthwise else
            f"conv fwd+bwd N32 C=K={channels} 32², 3x3")
    return (name, times, 1e3, "ms")


def digits_epoch_row(rounds):
    """One training epoch as examples/train_lenet.py runs it (no scheduler: its cost is the same on both)."""
    train = load_digits("train")
    twins = _torch_twins() if torch is not None else None
    spec_mean, spec_std = (0.3055,), (0.3761,)

    def loader():
        augment = T.Compose([T.Upsample(2), T.RandomCrop(16, padding=1), T.Normalize(spec_mean, spec_std)])
        return DataLoader(train, batch_size=32, shuffle=True, seed=0, transform=augment)

    def make_mdn():
        mdn.manual_seed(0)
        model = models.LeNet5(10, 1, 16)
        opt = mdn.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.05)

        def epoch():
            model.train()
            for x, y in loader():
                loss = F.cross_entropy(model(x), y, label_smoothing=0.1)
                opt.zero_grad()
                loss.backward()
                opt.step()
        return epoch

    def make_torch():
        torch.manual_seed(0)
        model = twins["LeNet5"](10, 1, 16)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.05)

        def epoch():
            model.train()
            for x, y in loader():
                loss = torch.nn.functional.cross_entropy(model(torch.from_numpy(x.numpy())),
                                                         torch.from_numpy(y.numpy()), label_smoothing=0.1)
                opt.zero_grad()
                loss.backward()
                opt.step()
        return epoch
    times = side_by_side(make_mdn, make_torch, max(2, rounds // 2), 1)
    return ("digits epoch of train_lenet.py (45 steps)", times, 1, "s")


def adam_row(rounds):
    import optim_step
    optim_step.torch = torch
    shapes = optim_step.resnet20_shapes()
    n = sum(int(np.prod(s)) for s in shapes)
    rng = np.random.default_rng(0)
    times = side_by_side(lambda: optim_step.minidnn_case(shapes, "cpu", "Adam", True, rng)[0],
                         lambda: optim_step.torch_case(shapes, "cpu", "Adam", "foreach", rng), rounds, 20)
    return (f"Adam step, {len(shapes)} tensors / {n / 1e3:.0f}k elements (fused | foreach)", times, 1e3, "ms")


def dataloader_row(rounds):
    train = load_digits("train")
    images = train.data

    def make_mdn():
        augment = T.Compose([T.Upsample(2), T.RandomCrop(16, padding=1), T.Normalize((0.3055,), (0.3761,))])

        def epoch():
            for _ in DataLoader(train, batch_size=32, shuffle=True, seed=0, transform=augment):
                pass
        return epoch

    def make_torch():
        data = torch.from_numpy(np.ascontiguousarray(images))
        labels = torch.from_numpy(train.targets)

        class Augmented(torch.utils.data.Dataset):       # what a PyTorch user writes without torchvision
            def __len__(self):
                return len(labels)

            def __getitem__(self, i):
                img = data[i].repeat_interleave(2, 1).repeat_interleave(2, 2)
                img = torch.nn.functional.pad(img, (1, 1, 1, 1))
                oy, ox = torch.randint(0, 3, (2,)).tolist()
                return (img[:, oy:oy + 16, ox:ox + 16] - 0.3055) / 0.3761, labels[i]

        ds = Augmented()

        def epoch():
            for _ in torch.utils.data.DataLoader(ds, batch_size=32, shuffle=True):
                pass
        return epoch
    times = side_by_side(make_mdn, make_torch, rounds, 2)
    return ("DataLoader epoch with augmentation (digits, 45 batches)", times, 1e3, "ms")


ROWS = {
    "overhead": lambda r: [overhead_row(r)],
    "lenet": lambda r: lenet_rows(r),
    "conv16": lambda r: [conv_row(r, 16, False)],
    "conv64": lambda r: [conv_row(r, 64, False)],
    "depthwise": lambda r: [conv_row(r, 64, True)],
    "digits": lambda r: [digits_epoch_row(r)],
    "adam": lambda r: [adam_row(r)],
    "dataloader": lambda r: [dataloader_row(r)],
}


def _pressure():
    """The share of the last 10 s in which some runnable task waited for a CPU (Linux's /proc/pressure/cpu "some
    avg10", in %), or None where the kernel does not report it: a busier-than-it-looks machine shows here before the
    load average moves (two processes spinning on the 2 cores: load ~2, pressure ~100%)."""
    try:
        with open("/proc/pressure/cpu") as f:
            return float(f.readline().split()[1].split("=")[1])
    except (OSError, IndexError, ValueError):
        return None


def _fmt_pressure(value):
    return "n/a" if value is None else f"{value:.0f}%"


def _median(values):
    v = sorted(values)
    return v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", default="2",
                    help="BLAS/OpenMP threads for both frameworks; a comma-separated list (1,2) runs every row at each "
                         "count, alternated round by round")
    ap.add_argument("--rounds", type=int, default=7, help="alternating rounds; min and median of them")
    ap.add_argument("--only", default=",".join(ROWS), help=f"comma-separated subset of {','.join(ROWS)}")
    ap.add_argument("--cpu-time", action="store_true",
                    help="time by process CPU seconds instead of wall clock (steadier on a busy machine; with "
                         "several threads it adds their times up, spinning included)")
    ap.add_argument("--settle", type=float, default=0.0, metavar="MS",
                    help="untimed calls for at least MS milliseconds before each side's timed round (default: one "
                         "call).  PyTorch's OpenMP threads (libgomp) spin for ~10 ms after its calls, on the core "
                         "minidnn's next round wants: 20 lets them go idle first (docs/measurements/"
                         "cpu_2026-11-26_2core.md, session 9 round 2)")
    args = ap.parse_args(argv)
    SETTLE[0] = args.settle / 1e3
    if args.cpu_time:
        CLOCK[0] = time.process_time
    THREADS[:] = [int(n) for n in args.threads.split(",")]
    load, pressure = os.getloadavg(), _pressure()
    rows = []
    for key in args.only.split(","):
        rows += ROWS[key](args.rounds)
    cpu = os.cpu_count()
    print(f"CPU, {args.threads} threads each (minidnn: set_num_threads, PyTorch: torch.set_num_threads), {cpu} CPUs; "
          f"min / median of {args.rounds} alternating rounds{f', {args.settle:g} ms settled' if args.settle else ''}, "
          f"{'process CPU time' if args.cpu_time else 'wall clock'}; PyTorch "
          f"{torch.__version__ if torch is not None else 'not installed'}, NumPy {np.__version__}; load average "
          f"{load[0]:.2f} at the start, {os.getloadavg()[0]:.2f} at the end; CPU pressure (10 s) "
          f"{_fmt_pressure(pressure)} at the start, {_fmt_pressure(_pressure())} at the end")
    print(f"| {'workload':58} | threads | {'minidnn min / med':>19} | {'PyTorch min / med':>19} | ratio min / med |")
    print(f"|{'-' * 60}|---------|{'-' * 21}|{'-' * 21}|-----------------|")
    for name, times, scale, unit in rows:
        unit_name = "µs" if unit == "us" else unit
        for n, (m, t) in times.items():
            mm, mt = (min(m) * scale, _median(m) * scale), (min(t) * scale, _median(t) * scale) if t else None
            fm = f"{mm[0]:.2f} / {mm[1]:.2f} {unit_name}"
            ft = f"{mt[0]:.2f} / {mt[1]:.2f} {unit_name}" if mt else "n/a"
            ratio = f"{mm[0] / mt[0]:.2f}x / {mm[1] / mt[1]:.2f}x" if mt else "n/a"
            print(f"| {name:58} | {n:7} | {fm:>19} | {ft:>19} | {ratio:>15} |", flush=True)


if __name__ == "__main__":
    main()

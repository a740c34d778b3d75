"""A LeNet epoch on an idle and on a busy machine, for each BLAS thread count (docs/threads.md).

    python bench/busy_threads.py [--epochs 3] [--threads 1,2] [--hogs 1]

"Busy" = ``--hogs`` other processes spinning on the CPU (started and stopped by this script), the situation of
a laptop with a browser, or of a CI box shared with other jobs.  The workload is one training epoch of
examples/train_lenet.py's set-up on the bundled digits (LeNet-5 on 16x16, batch 32, AdamW, augmentation).
Each cell: the fastest and the median of ``--epochs`` epochs, wall clock, after one warm-up epoch.
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import minidnn as mdn  # noqa: E402
import minidnn.nn.functional as F  # noqa: E402
from minidnn import models  # noqa: E402
from minidnn.data import DataLoader  # noqa: E402
from minidnn.data import transforms as T  # noqa: E402
from minidnn.data.datasets import load_digits  # noqa: E402


def _spin():
    while True:
        pass


def epoch_times(epochs):
    train = load_digits("train")
    mdn.manual_seed(0)
    model = models.LeNet5(10, 1, 16)
    opt = mdn.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.05)
    augment = T.Compose([T.Upsample(2), T.RandomCrop(16, padding=1), T.Normalize((0.3055,), (0.3761,))])
    times = []
    for e in range(epochs + 1):
        t0 = time.perf_counter()
        for x, y in DataLoader(train, batch_size=32, shuffle=True, seed=e, transform=augment):
            loss = F.cross_entropy(model(x), y, label_smoothing=0.1)
            opt.zero_grad()
            loss.backward()
            opt.step()
        times.append(time.perf_counter() - t0)
    return times[1:]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--hogs", type=int, default=1, help="busy processes for the 'busy' column")
    args = ap.parse_args(argv)
    counts = [int(t) for t in args.threads.split(",")]
    print(f"LeNet digits epoch (45 steps), s: fastest / median of {args.epochs}; {os.cpu_count()} CPUs; "
          f"minidnn's default here: {mdn._threads.default_num_threads()} thread(s)")
    print(f"| BLAS threads | idle | busy ({args.hogs} spinning process{'es' if args.hogs > 1 else ''}) |")
    print("|---|---|---|")
    for n in counts:
        mdn.set_num_threads(n)
        idle = epoch_times(args.epochs)
        hogs = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(args.hogs)]
        for h in hogs:
            h.start()
        try:
            busy = epoch_times(args.epochs)
        finally:
            for h in hogs:
                h.terminate()
                h.join()
        cell = lambda ts: f"{min(ts):.2f} / {statistics.median(ts):.2f}"      # noqa: E731
        print(f"| {n} | {cell(idle)} | {cell(busy)} |", flush=True)


if __name__ == "__main__":
    main()

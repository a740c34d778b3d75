"""One epoch of a DataLoader, minidnn beside PyTorch from one run: in-process and with worker processes.

    python bench/data_loader.py [--samples 50000] [--batch-size 256] [--workers 0,2] [--rounds 3]

The dataset is CIFAR-sized float32 images in a TensorDataset, shuffled: what is measured is the loader's
own cost (sampling, fetching, collating, and with workers the trip of each batch to the main process).
minidnn's in-process loader fetches a batch with one fancy-indexing op; PyTorch's indexes per sample and
collates.  With workers, minidnn sends large arrays through /dev/shm files, PyTorch through shared memory.
Each row alternates the two sides ``--rounds`` times and keeps each side's fastest round (other processes on
a shared machine only ever add time).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import minidnn as mdn  # noqa: E402
from minidnn.utils.data import DataLoader, TensorDataset  # noqa: E402

try:
    import torch
except ImportError:
    torch = None


def epoch_seconds(loader):
    began = time.perf_counter()
    for images, labels in loader:
        pass
    return time.perf_counter() - began


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--samples", type=int, default=50000)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--workers", default="0,2")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    rng = np.random.default_rng(0)
    x = rng.random((args.samples, 3, 32, 32), dtype=np.float32)
    y = rng.integers(0, 10, args.samples)
    ours_ds = TensorDataset(x, y)
    theirs_ds = torch.utils.data.TensorDataset(torch.from_numpy(x), torch.from_numpy(y)) if torch else None
    print(f"one epoch: {args.samples} x (3, 32, 32) float32, batch {args.batch_size}, shuffled; "
          f"{os.cpu_count()} cpus; fastest of {args.rounds}")
    print(f"{'num_workers':>12} {'minidnn s':>10} {'PyTorch s':>10} {'ratio':>7}")
    for workers in (int(w) for w in args.workers.split(",")):
        mdn.manual_seed(0)
        ours = DataLoader(ours_ds, batch_size=args.batch_size, shuffle=True, num_workers=workers,
                          persistent_workers=workers > 0)
        theirs = (torch.utils.data.DataLoader(theirs_ds, batch_size=args.batch_size, shuffle=True,
                                              num_workers=workers, persistent_workers=workers > 0)
                  if torch else None)
        best_ours = best_theirs = float("inf")
        for _ in range(args.rounds):
            best_ours = min(best_ours, epoch_seconds(ours))
            if theirs is not None:
                best_theirs = min(best_theirs, epoch_seconds(theirs))
        ratio = f"{best_theirs / best_ours:6.2f}x" if theirs is not None else ""
        print(f"{workers:>12} {best_ours:>10.3f} {best_theirs if theirs else float('nan'):>10.3f} {ratio:>7}")


if __name__ == "__main__":
    main()

"""Train ResNet-20 (He et al. 2016, 0.27 M parameters) on CIFAR-10.

    python examples/train_resnet_cifar.py --data-dir ~/data --download --device cuda      # the real thing
    python examples/train_resnet_cifar.py --synthetic --epochs 1 --limit 5                   # no files needed
    python examples/train_resnet_cifar.py --device cuda --nproc 2 --data-dir ~/data          # 2 GPUs, data parallel

Augmentation as in the paper: random crops of the 4-pixel zero-padded image, horizontal flips; inputs
normalised per channel.  SGD with Nesterov momentum 0.9, weight decay 5e-4 and a one-cycle schedule.
The batch transforms run on the batch's device, so on a GPU the augmentation costs no host time.

``--nproc N`` trains data-parallel in N processes: the script re-launches itself through
``python -m minidnn.distributed.run``; each rank drives cuda:LOCAL_RANK (NCCL) or, with --device cpu, the cpu
backend, reads its share of each epoch through a DistributedSampler, with --batch-size images per rank, and
averages its gradients with the others (DistributedDataParallel).  Only rank 0 evaluates, prints and saves.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

from _common import batches_per_epoch, epoch_seed, fit, load_data, make_parser, positive_int

import minidnn as mdn
from minidnn import models, optim
from minidnn.data import DataLoader
from minidnn.data import transforms as T


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = make_parser("train_resnet_cifar", __doc__.split("\n\n")[0], epochs=30, batch_size=128, lr=0.1,
                         data=("cifar10",), synthetic=True)
    parser.add_argument("--nproc", type=positive_int, default=None,
                        help="data-parallel processes (one per GPU with --device cuda); --batch-size is per process")
    parser.add_argument("--sync-bn", action="store_true", help="with --nproc: SyncBatchNorm instead of BatchNorm")
    args = parser.parse_args(argv)
    if args.nproc is not None:
        if "RANK" not in os.environ:       # the launcher starts the ranks, each running this script again
            return subprocess.call([sys.executable, "-m", "minidnn.distributed.run", "--nproc-per-node",
                                    str(args.nproc), os.path.abspath(__file__)] + argv)
        return main_distributed(args)
    mdn.manual_seed(args.seed)

    train_set, test_set, spec = load_data(args)
    normalize = T.Normalize(spec.mean, spec.std)

    def make_train_loader():
        # Random transforms are built here, once per epoch, so they seed from the epoch's seed (see fit).
        augment = T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), normalize])
        # prefetch: the next batches are fetched and copied while the current one computes (pays off on a GPU).
        return DataLoader(train_set, batch_size=args.batch_size, shuffle=True, device=args.device,
                          transform=augment, prefetch=True)
    test_loader = DataLoader(test_set, batch_size=args.batch_size, device=args.device, transform=normalize,
                             prefetch=True)

    model = models.resnet20(num_classes=spec.num_classes, in_channels=spec.channels).to(args.device)
    optimizer = optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, nesterov=True, weight_decay=5e-4)
    scheduler = optim.lr_scheduler.OneCycleLR(optimizer, max_lr=args.lr,
                                              total_steps=args.epochs * batches_per_epoch(train_set, args))
    fit(model, optimizer, make_train_loader, test_loader, args, scheduler)


def main_distributed(args):
    """One rank of ``--nproc`` training (started by minidnn.distributed.run)."""
    from _common import check_amp, make_train_step, run_epoch, save_checkpoint

    import minidnn.distributed as dist
    from minidnn.data import DistributedSampler
    from minidnn.nn import functional as F
    from minidnn.nn.parallel import DistributedDataParallel
    check_amp(args)
    local = int(os.environ["LOCAL_RANK"])
    on_gpu = str(args.device).startswith("cuda")
    if on_gpu:
        mdn.cuda.set_device(local)
    device = f"cuda:{local}" if on_gpu else "cpu"
    dist.init_process_group("nccl" if on_gpu else "cpu")
    rank, world = dist.get_rank(), dist.get_world_size()
    mdn.manual_seed(args.seed)             # the same initialisation everywhere (DDP broadcasts rank 0's anyway)
    train_set, test_set, spec = load_data(args)
    normalize = T.Normalize(spec.mean, spec.std)
    sampler = DistributedSampler(train_set, num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
    model = models.resnet20(num_classes=spec.num_classes, in_channels=spec.channels)
    if args.sync_bn:
        model = mdn.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model = model.to(device)
    ddp = DistributedDataParallel(model, device_ids=[local] if on_gpu else None)
    optimizer = optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9, nesterov=True, weight_decay=5e-4)
    steps = -(-len(sampler) // args.batch_size)
    steps = steps if args.limit is None else min(steps, args.limit)
    scheduler = optim.lr_scheduler.OneCycleLR(optimizer, max_lr=args.lr, total_steps=args.epochs * steps)
    if args.channels_last:
        model.to(memory_format=mdn.channels_last)
    train_step = make_train_step(ddp, optimizer, F.cross_entropy, compile_step=on_gpu and args.compile, amp=args.amp,
                                 channels_last=args.channels_last)
    test_loader = DataLoader(test_set, batch_size=args.batch_size, device=device, transform=normalize)
    accuracy = 0.0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)                              # every rank: the same permutation, its own share
        mdn.manual_seed(epoch_seed(args.seed, epoch) + rank)   # each rank its own augmentation
        augment = T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), normalize])
        loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler, device=device,
                            transform=augment, prefetch=True)
        began = time.perf_counter()
        loss, acc = run_epoch(ddp, loader, steps, optimizer, scheduler,
                              progress=False, train_step=train_step)
        totals = mdn.tensor([loss, acc], dtype=mdn.float64, device=device)
        dist.all_reduce(totals, op=dist.ReduceOp.AVG)          # the mean over ranks (equal shares)
        seconds = time.perf_counter() - began
        if rank == 0:
            test_loss, accuracy = run_epoch(model, test_loader, args.limit, progress=False,
                                            channels_last=args.channels_last)
            print(f"epoch {epoch + 1}/{args.epochs}: train loss {float(totals[0].item()):.4f} acc "
                  f"{float(totals[1].item()):.4f} | test loss {test_loss:.4f} acc {accuracy:.4f} | {seconds:.2f} "
                  f"s/epoch | {world} ranks x {args.batch_size} images", flush=True)
            os.makedirs(args.out, exist_ok=True)
            save_checkpoint(os.path.join(args.out, "checkpoint.mdn"), model, optimizer, scheduler, epoch + 1,
                            {"test_acc": [accuracy]})
    if rank == 0:
        print(f"test accuracy: {accuracy:.4f}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

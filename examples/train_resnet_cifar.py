"""Train ResNet-20 (He et al. 2016, 0.27 M parameters) on CIFAR-10.

    python examples/train_resnet_cifar.py --data-dir ~/data --download --device cuda      # the real thing
    python examples/train_resnet_cifar.py --synthetic --epochs 1 --limit 5                   # no files needed

Augmentation as in the paper: random crops of the 4-pixel zero-padded image, horizontal flips; inputs
normalised per channel.  SGD with Nesterov momentum 0.9, weight decay 5e-4 and a one-cycle schedule.
The batch transforms run on the batch's device, so on a GPU the augmentation costs no host time.
"""
from __future__ import annotations

import sys

import minidnn as mdn
from minidnn import models, optim
from minidnn.data import DataLoader
from minidnn.data import transforms as T

from _common import batches_per_epoch, fit, load_data, make_parser


def main(argv=None):
    parser = make_parser("train_resnet_cifar", __doc__.split("\n\n")[0], epochs=30, batch_size=128, lr=0.1,
                         data=("cifar10",), synthetic=True)
    args = parser.parse_args(argv)
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


if __name__ == "__main__":
    sys.exit(main())

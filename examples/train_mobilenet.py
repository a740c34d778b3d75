"""Train a small MobileNet (depthwise-separable convolutions) on upsampled digits or CIFAR-10.

    python examples/train_mobilenet.py                                      # digits, 8x8 upsampled to 16x16
    python examples/train_mobilenet.py --data cifar10 --data-dir ~/data --device cuda
    python examples/train_mobilenet.py --data cifar10 --synthetic --epochs 1 --limit 5

Each block is a depthwise 3x3 convolution (``groups = channels``: one filter per channel, spatial mixing
only) followed by a pointwise 1x1 convolution (channel mixing only).  Together they cost about
1/9 + 1/channels of a full 3x3 convolution's multiply-adds and parameters; see
notebooks/05_grouped_convolutions.ipynb for the numbers.
"""
from __future__ import annotations

import sys

from _common import batches_per_epoch, fit, load_data, make_parser, positive_int

import minidnn as mdn
from minidnn import models, optim
from minidnn.data import DataLoader
from minidnn.data import transforms as T


def main(argv=None):
    parser = make_parser("train_mobilenet", __doc__.split("\n\n")[0], epochs=8, batch_size=64, lr=1e-2,
                         data=("digits", "cifar10"), synthetic=True)
    parser.add_argument("--width", type=positive_int, default=16, help="channels of the stem (blocks: 2-8x this)")
    args = parser.parse_args(argv)
    mdn.manual_seed(args.seed)

    train_set, test_set, spec = load_data(args)
    normalize = T.Normalize(spec.mean, spec.std)
    upsample = [T.Upsample(16 // spec.size)] if spec.size < 16 else []     # digits: 8x8 -> 16x16
    plain = T.Compose(upsample + [normalize])

    def make_train_loader():
        # Random transforms are built here, once per epoch, so they seed from the epoch's seed (see fit).
        if upsample:      # digits: shifts of up to one pixel (a flipped digit is another digit, or none)
            augment = T.Compose(upsample + [T.RandomCrop(16, padding=1), normalize])
        else:             # CIFAR-10: the standard crop + flip
            augment = T.Compose([T.RandomCrop(spec.size, padding=4), T.RandomHorizontalFlip(), normalize])
        return DataLoader(train_set, batch_size=args.batch_size, shuffle=True, device=args.device, transform=augment,
                          prefetch=True)
    test_loader = DataLoader(test_set, batch_size=args.batch_size, device=args.device, transform=plain)

    model = models.MobileNetSmall(num_classes=spec.num_classes, in_channels=spec.channels, width=args.width)
    model.to(args.device)
    optimizer = optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    scheduler = optim.lr_scheduler.OneCycleLR(optimizer, max_lr=args.lr,
                                              total_steps=args.epochs * batches_per_epoch(train_set, args))
    fit(model, optimizer, make_train_loader, test_loader, args, scheduler)


if __name__ == "__main__":
    sys.exit(main())

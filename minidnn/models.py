"""Small reference CNNs for the examples: LeNet5, resnet20 (CIFAR ResNet) and MobileNetSmall.

All take (N, in_channels, H, W) and return logits (N, num_classes); they are small enough to train
on a CPU (sklearn's 8x8 digits, CIFAR-10 32x32).
"""
from __future__ import annotations

from .nn import (
    AdaptiveAvgPool2d,
    BatchNorm2d,
    Conv2d,
    Flatten,
    Identity,
    Linear,
    MaxPool2d,
    Module,
    ReLU,
    Sequential,
    init,
)

__all__ = ["LeNet5", "BasicBlock", "ResNetCIFAR", "resnet20", "MobileNetSmall", "DepthwiseSeparable"]


class LeNet5(Module):
    """LeCun et al. 1998's LeNet-5 layout with today's choices (ReLU, max pooling):
    conv 5x5 (6) -> pool 2 -> conv 5x5 (16) -> pool 2 -> fc 120 -> fc 84 -> fc num_classes.

    ``input_size`` (H = W) decides the paddings so the shapes work on small images too:
      32 (the original): no padding, 16 * 5 * 5 features;
      28 (MNIST): conv1 padded by 2 (LeNet's own trick), 16 * 5 * 5 features;
      8 (sklearn digits): both convs padded by 2 (sizes 8 -> 4 -> 2), 16 * 2 * 2 features.
    A conv is padded ("same" size) whenever its input is smaller than 32 (conv1) or 10 (conv2).
    """

    def __init__(self, num_classes=10, in_channels=1, input_size=32):
        super().__init__()
        pad1 = 0 if input_size >= 32 else 2
        size = (input_size - 4 + 2 * pad1) // 2
        pad2 = 0 if size >= 10 else 2
        size = (size - 4 + 2 * pad2) // 2
        if size < 1:
            raise ValueError(f"LeNet5: input_size={input_size} is too small (the feature map would vanish)")
        self.features = Sequential(
            Conv2d(in_channels, 6, 5, padding=pad1), ReLU(), MaxPool2d(2),
            Conv2d(6, 16, 5, padding=pad2), ReLU(), MaxPool2d(2))
        self.classifier = Sequential(
            Flatten(), Linear(16 * size * size, 120), ReLU(), Linear(120, 84), ReLU(),
            Linear(84, num_classes))

    def forward(self, x):
        return self.classifier(self.features(x))


class BasicBlock(Module):
    """Two 3x3 conv + BN, ReLU between and after the residual add.  Where the shape changes (stride 2
    or more channels), the shortcut is option B of He et al. 2016: a 1x1 strided conv + BN (a few
    more parameters than option A's zero padding, and the common choice in library code)."""

    def __init__(self, in_planes, planes, stride=1):
        super().__init__()
        self.conv1 = Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = BatchNorm2d(planes)
        self.conv2 = Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = BatchNorm2d(planes)
        self.relu = ReLU()
        if stride != 1 or in_planes != planes:
            self.shortcut = Sequential(Conv2d(in_planes, planes, 1, stride=stride, bias=False),
                                          BatchNorm2d(planes))
        else:
            self.shortcut = Identity()

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class ResNetCIFAR(Module):
    """He et al. 2016's CIFAR ResNet: a 3x3 stem (16 channels), three stages of ``blocks_per_stage``
    BasicBlocks at 16, 32, 64 channels (stages 2 and 3 halve the resolution), global average pooling,
    one linear layer.  Depth = 6 * blocks_per_stage + 2."""

    def __init__(self, blocks_per_stage=3, num_classes=10, in_channels=3):
        super().__init__()
        self.conv1 = Conv2d(in_channels, 16, 3, padding=1, bias=False)
        self.bn1 = BatchNorm2d(16)
        self.relu = ReLU()
        stages, in_planes = [], 16
        for planes, stride in ((16, 1), (32, 2), (64, 2)):
            blocks = []
            for i in range(blocks_per_stage):
                blocks.append(BasicBlock(in_planes, planes, stride if i == 0 else 1))
                in_planes = planes
            stages.append(Sequential(*blocks))
        self.layer1, self.layer2, self.layer3 = stages
        self.pool = AdaptiveAvgPool2d(1)
        self.flatten = Flatten()
        self.fc = Linear(64, num_classes)
        # torchvision's init for ResNets: He-normal convs (fan_out, relu), BN at identity.
        for m in self.modules():
            if isinstance(m, Conv2d):
                init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(self.flatten(self.pool(x)))


def resnet20(num_classes=10, in_channels=3):
    """ResNet-20 for CIFAR (0.27 M parameters): 3 stages x 3 BasicBlocks, option-B shortcuts."""
    return ResNetCIFAR(3, num_classes, in_channels)


class DepthwiseSeparable(Module):
    """MobileNet's block: depthwise 3x3 (groups = channels) + BN + ReLU, then pointwise 1x1 + BN + ReLU."""

    def __init__(self, in_channels, out_channels, stride=1):
        super().__init__()
        self.depthwise = Conv2d(in_channels, in_channels, 3, stride=stride, padding=1, groups=in_channels,
                                   bias=False)
        self.bn1 = BatchNorm2d(in_channels)
        self.pointwise = Conv2d(in_channels, out_channels, 1, bias=False)
        self.bn2 = BatchNorm2d(out_channels)
        self.relu = ReLU()

    def forward(self, x):
        x = self.relu(self.bn1(self.depthwise(x)))
        return self.relu(self.bn2(self.pointwise(x)))


class MobileNetSmall(Module):
    """A small MobileNet-v1-style CNN: 3x3 stem (``width`` channels), four depthwise-separable blocks
    (width -> 2w -> 4w (stride 2) -> 4w -> 8w (stride 2)), global average pooling, linear classifier."""

    def __init__(self, num_classes=10, in_channels=3, width=16):
        super().__init__()
        w = width
        self.stem = Sequential(Conv2d(in_channels, w, 3, padding=1, bias=False), BatchNorm2d(w), ReLU())
        self.blocks = Sequential(DepthwiseSeparable(w, 2 * w), DepthwiseSeparable(2 * w, 4 * w, stride=2),
                                    DepthwiseSeparable(4 * w, 4 * w), DepthwiseSeparable(4 * w, 8 * w, stride=2))
        self.pool = AdaptiveAvgPool2d(1)
        self.flatten = Flatten()
        self.fc = Linear(8 * w, num_classes)

    def forward(self, x):
        return self.fc(self.flatten(self.pool(self.blocks(self.stem(x)))))

"""The example models build, give the right shapes, and learn: a few SGD steps on sklearn's 8x8
digits (the first 256 samples) make the training loss fall."""
from __future__ import annotations

import numpy as np
import pytest

import minidnn as mdn
import minidnn.nn.functional as F
from minidnn.models import LeNet5, MobileNetSmall, resnet20


@pytest.mark.parametrize("make, shape, params", [
    (lambda: LeNet5(), (2, 1, 32, 32), 61706),
    (lambda: LeNet5(num_classes=7, in_channels=3, input_size=28), (2, 3, 28, 28), None),
    (lambda: LeNet5(input_size=8), (2, 1, 8, 8), None),
    (lambda: resnet20(), (2, 3, 32, 32), None),
    (lambda: resnet20(num_classes=4, in_channels=1), (2, 1, 8, 8), None),
    (lambda: MobileNetSmall(num_classes=5, in_channels=1), (2, 1, 8, 8), None),
])
def test_models_build_and_give_logits(make, shape, params):
    model = make()
    num_classes = model(mdn.randn(*shape)).shape[1]
    assert model(mdn.randn(*shape)).shape == (shape[0], num_classes)
    if params is not None:          # the classic LeNet-5 count
        assert sum(p.numel() for p in model.parameters()) == params


def test_resnet20_structure():
    model = resnet20()
    # 19 convolutions on the main path + 2 option-B shortcut convolutions, 3 stages x 3 blocks
    convs = [m for m in model.modules() if type(m).__name__ == "Conv2d"]
    assert len(convs) == 21
    assert [len(s) for s in (model.layer1, model.layer2, model.layer3)] == [3, 3, 3]
    assert 0.26e6 < sum(p.numel() for p in model.parameters()) < 0.28e6


def test_mobilenet_uses_depthwise_convolutions():
    model = MobileNetSmall(in_channels=3, width=8)
    depthwise = [m for m in model.modules() if type(m).__name__ == "Conv2d" and m.groups > 1]
    assert len(depthwise) == 4 and all(m.groups == m.in_channels == m.out_channels for m in depthwise)


@pytest.fixture(scope="module")
def digits():
    from minidnn.data.datasets import load_digits
    images, labels = load_digits("all", as_tensors=True)
    x = images.numpy()[:256] * np.float32(16)                  # the raw 0..16 pixels, in the original order
    x = ((x - x.mean()) / x.std()).reshape(-1, 1, 8, 8)       # standardised: PyTorch's default init expects it
    return mdn.tensor(x), mdn.tensor(labels.numpy()[:256])


@pytest.mark.parametrize("make, steps, lr, batch_size", [
    (lambda: LeNet5(input_size=8), 30, 0.1, 64),        # no BN: a plateau at 2.30 first, as in PyTorch
    (lambda: resnet20(in_channels=1), 4, 0.05, 32),
    (lambda: MobileNetSmall(in_channels=1), 6, 0.05, 64),
], ids=["lenet5", "resnet20", "mobilenet_small"])
def test_training_on_digits_lowers_the_loss(make, steps, lr, batch_size, digits, device):
    mdn.manual_seed(0)
    model = make().to(device)
    optimizer = mdn.optim.SGD(model.parameters(), lr=lr, momentum=0.9)     # the fused flat-buffer step
    x, y = (t.to(device) for t in digits)
    losses = []
    for step in range(steps):
        batch = slice(batch_size * (step % 4), batch_size * (step % 4 + 1))
        loss = F.cross_entropy(model(x[batch]), y[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    # The loss over the data the steps saw, with batch statistics (a few steps barely move BN's
    # running averages, so eval mode would measure those rather than the learning).
    with mdn.no_grad():
        seen = batch_size * min(steps, 4)
        final = F.cross_entropy(model(x[:seen]), y[:seen]).item()
    assert np.isfinite(losses).all()
    assert final < 0.85 * losses[0], (losses, final)

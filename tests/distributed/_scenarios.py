"""What the multi-process tests run, shared by the ranks (_worker.py) and the single-process references the tests
compute (test_ddp_cpu.py): the same data, the same models, the same steps."""
import numpy as np

import minidnn as mdn
from minidnn import nn, optim
from minidnn.nn import functional as F

B = 4          # per-rank batch
STEPS = 3


def data(world, steps=STEPS, shape=(5,), classes=3, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((steps, world * B) + shape)
    y = rng.integers(0, classes, (steps, world * B))
    return x, y


def mlp(seed):
    mdn.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 6), nn.Tanh(), nn.Linear(6, 3)).double()


def conv_bn(seed):
    mdn.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                         nn.Linear(4 * 5 * 5, 3)).double()


class Branches(nn.Module):
    """``a`` always used, ``b`` used only when the flag says so, ``c`` never."""

    def __init__(self, seed):
        super().__init__()
        mdn.manual_seed(seed)
        self.a, self.b, self.c = nn.Linear(5, 3), nn.Linear(5, 3), nn.Linear(5, 3)
        self.double()

    def forward(self, x, use_b=True):
        y = self.a(x)
        return y + self.b(x) if use_b else y


def make_optimizer(params, kind):
    if kind == "adam":
        return optim.Adam(params, lr=0.05)
    return optim.SGD(params, lr=0.1, momentum=0.9, fused=(kind == "sgd_fused"))


def train(model, opt, xs, ys, steps=STEPS):
    """``steps`` SGD steps on batches xs[k], ys[k]; returns the losses."""
    losses = []
    for k in range(steps):
        loss = F.cross_entropy(model(mdn.tensor(xs[k])), mdn.tensor(ys[k]))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def params_of(model):
    return [p.numpy().copy() for p in model.parameters()]


def small_cnn(seed, batchnorm=False):
    """float32 CNN for the GPU runs: 3x8x8 images, 10 classes."""
    mdn.manual_seed(seed)
    layers = [nn.Conv2d(3, 8, 3, padding=1)] + ([nn.BatchNorm2d(8)] if batchnorm else []) + [
        nn.ReLU(), nn.Conv2d(8, 8, 3, stride=2, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 4 * 4, 10)]
    return nn.Sequential(*layers)


def image_data(world, steps, batch, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((steps, world * batch, 3, 8, 8)).astype(np.float32)
    y = rng.integers(0, 10, (steps, world * batch))
    return x, y


def gpu_train(model, xs, ys, device, compiled=False, lr=0.05):
    """SGD-momentum steps (optionally through minidnn.compile: replayed from a CUDA graph); returns the losses."""
    opt = optim.SGD(model.parameters(), lr=lr, momentum=0.9)

    def step(x, y):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=False)
        loss.backward()
        opt.step()
        return loss
    run = mdn.compile(step, warmup=2) if compiled else step
    losses = []
    for k in range(len(xs)):
        loss = run(mdn.tensor(xs[k], device=device), mdn.tensor(ys[k], device=device))
        losses.append(float(loss.item()))
    return losses

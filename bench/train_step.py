"""Training-step time of the example models, minidnn beside PyTorch, from one run.

The PyTorch twin of each model is built from the SAME source (minidnn/models.py) with its layer
names bound to torch.nn, so both frameworks train exactly the same architecture (the parameter
counts are checked).  One step = forward, cross-entropy, backward, SGD(momentum 0.9) step.
Reported: median ms per step and the implied time per CIFAR-sized epoch (50,000 images).

    python bench/train_step.py [--device cuda] [--steps 30] [--models lenet5,resnet20,mobilenet]
"""
from __future__ import annotations

import argparse
import inspect
import re
import statistics
import time


import minidnn as mdn
import minidnn.models

try:
    import torch
except ImportError:
    torch = None

EPOCH_IMAGES = 50_000
CONFIGS = {     # name: (constructor call, input shape per image, batch size)
    "lenet5": ("LeNet5(num_classes=10, in_channels=1, input_size=32)", (1, 32, 32), 64),
    "resnet20": ("resnet20(num_classes=10)", (3, 32, 32), 128),
    "mobilenet": ("MobileNetSmall(num_classes=10, in_channels=3)", (3, 32, 32), 128),
}


def torch_models():
    """minidnn/models.py executed with its layer names bound to torch.nn: the PyTorch twins."""
    src = inspect.getsource(minidnn.models)
    src = re.sub(r"^from \.nn import \((.|\n)*?\)\n", "", src, flags=re.M)
    src = re.sub(r"^from \.nn import .*\n", "", src, flags=re.M)
    namespace = {name: getattr(torch.nn, name) for name in
                 ("AdaptiveAvgPool2d", "BatchNorm2d", "Conv2d", "Flatten", "Identity", "Linear", "MaxPool2d",
                  "Module", "ReLU", "Sequential")}
    namespace["init"] = torch.nn.init
    exec(compile(src, "models.py (torch twin)", "exec"), namespace)
    return namespace


def _median_ms(step, sync, steps):
    for _ in range(20):     # 5 left the first model's median 45% high on the H200 (GPU clocks, pools)
        step()
    sync()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def bench(lib, models, ctor, shape, batch, device, steps):
    """(median ms per step, parameter count) for ``lib`` (minidnn or torch: the same API here) and the
    namespace ``models`` holding that library's model classes."""
    lib.manual_seed(0)
    model = eval(ctor, models).to(device)
    opt = lib.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = lib.randn(batch, *shape, device=device)
    y = lib.randint(0, 10, (batch,), device=device)
    cross_entropy = lib.nn.functional.cross_entropy

    def step():
        loss = cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    sync = lib.cuda.synchronize if device != "cpu" else (lambda: None)
    n_params = sum(p.numel() for p in model.parameters())
    return _median_ms(step, sync, steps), n_params


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if mdn.cuda.is_available() else "cpu")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--models", default=",".join(CONFIGS))
    ap.add_argument("--batch-size", type=int, default=None, help="override every model's batch size")
    args = ap.parse_args(argv)
    use_torch = torch is not None and (args.device == "cpu" or torch.cuda.is_available())
    twins = torch_models() if use_torch else None
    rows = []
    for name in args.models.split(","):
        ctor, shape, batch = CONFIGS[name]
        batch = args.batch_size or batch
        m_ms, m_params = bench(mdn, vars(minidnn.models), ctor, shape, batch, args.device, args.steps)
        t_ms = None
        if use_torch:
            t_ms, t_params = bench(torch, twins, ctor, shape, batch, args.device, args.steps)
            assert t_params == m_params, f"{name}: the twins differ ({m_params} vs {t_params} parameters)"
        rows.append((name, batch, m_params, m_ms, t_ms))
    print(f"training step (fwd + loss + bwd + SGD momentum), {args.device}, median of {args.steps}")
    print(f"{'model':10} {'batch':>5} {'params':>8} {'minidnn ms':>11} {'torch ms':>9} {'ratio':>6} "
          f"{'minidnn s/epoch':>16} {'torch s/epoch':>14}")
    for name, batch, params, m_ms, t_ms in rows:
        per_epoch = EPOCH_IMAGES / batch / 1e3
        t_cols = (f"{t_ms:9.2f} {m_ms / t_ms:5.1f}x {m_ms * per_epoch:16.1f} {t_ms * per_epoch:14.1f}" if t_ms
                  else f"{'n/a':>9} {'':>6} {m_ms * per_epoch:16.1f} {'n/a':>14}")
        print(f"{name:10} {batch:5d} {params:8d} {m_ms:11.2f} {t_cols}")


if __name__ == "__main__":
    main()

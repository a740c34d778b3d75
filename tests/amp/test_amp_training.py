"""ResNet-20 trained on the digits in bfloat16 (autocast) and in float16 (autocast + GradScaler) reaches the float32
run's test accuracy within 0.5 points (same seed, same batches).  On a GPU: the low-precision paths are GPU ones."""
import numpy as np
import pytest

import minidnn as mdn
import minidnn.nn.functional as F
from minidnn.data.datasets import load_digits
from minidnn.models import resnet20

EPOCHS = 12
BATCH = 64


def _accuracy(mode, device, seed=0):
    mdn.manual_seed(seed)
    xtr, ytr = load_digits("train", as_tensors=True)
    xte, yte = load_digits("test", as_tensors=True)
    xtr, ytr, xte, yte = (t.to(device) for t in (xtr, ytr, xte, yte))
    model = resnet20(in_channels=1).to(device)
    opt = mdn.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    sched = mdn.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=EPOCHS)   # converged runs: the comparison is fair
    dtype = {"fp32": None, "bf16": mdn.bfloat16, "fp16": mdn.float16}[mode]
    scaler = mdn.amp.GradScaler(device, enabled=mode == "fp16")
    order = np.random.default_rng(seed)
    n = xtr.shape[0]
    for _ in range(EPOCHS):
        perm = order.permutation(n)
        model.train()
        for i in range(0, n - BATCH + 1, BATCH):
            idx = mdn.tensor(perm[i:i + BATCH], device=device)
            with mdn.autocast(device, dtype=dtype or mdn.bfloat16, enabled=dtype is not None):
                loss = F.cross_entropy(model(xtr[idx]), ytr[idx])
            opt.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        sched.step()
    model.eval()
    with mdn.no_grad(), mdn.autocast(device, dtype=dtype or mdn.bfloat16, enabled=dtype is not None):
        pred = model(xte).argmax(1)
    return float((pred == yte).float().mean()) * 100


@pytest.mark.cuda
@pytest.mark.slow
def test_low_precision_training_reaches_fp32_accuracy(device):
    if device != "cuda":
        pytest.skip("float16 autocast is a GPU feature; the bfloat16 CPU path is covered by test_autocast")
    # Mean over seeds: one run's accuracy on 360 test images moves by a couple of images with any change of numerics,
    # and single fp32 runs spread over 96.7-98.6% (H200, tools/amp_accuracy_ab.py: 6 seeds, ~4 s a run).  Three seeds
    # left the mean's noise near the 0.5-point margin (bf16 0.93 below fp32 on seeds 0-2, 0.23 on all six), so six.
    seeds = tuple(range(6))
    fp32, bf16, fp16 = (float(np.mean([_accuracy(mode, device, s) for s in seeds]))
                        for mode in ("fp32", "bf16", "fp16"))
    print(f"digits test accuracy, mean of {len(seeds)} seeds: fp32 {fp32:.2f}%  bf16 {bf16:.2f}%  "
          f"fp16+scaler {fp16:.2f}%")
    assert fp32 > 90.0
    assert bf16 >= fp32 - 0.5 and fp16 >= fp32 - 0.5, (fp32, bf16, fp16)

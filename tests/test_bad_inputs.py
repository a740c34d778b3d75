"""The bad-input table: every row is a call PyTorch refuses.  Each asserts that minidnn refuses it too,
  * with an exception of the builtin type PyTorch raises for it (so ``except RuntimeError:`` in user code works),
  * with a message naming the offending values (a regex per row),
  * before any state changed (rows with state snapshot it before and compare after).
Where PyTorch is installed its exception type is checked on the same call; the expected type is also written in
the row, so the table runs without PyTorch.
"""
from __future__ import annotations

import copy

import numpy as np
import pytest

import minidnn as mdn
import minidnn.nn as nn
import minidnn.nn.functional as F

try:
    import torch
    import torch.nn.functional as tF
except ImportError:        # the rows still run; only the PyTorch cross-check is skipped
    torch = tF = None


ROWS = []


def row(name, call, exc, match, torch_call=None, state=None):
    ROWS.append(pytest.param(call, exc, match, torch_call, state, id=name))


x2 = lambda: mdn.randn(3, 4)            # noqa: E731
t2 = lambda: torch.randn(3, 4)          # noqa: E731

# -- creation -----------------------------------------------------------------------------------------------------
for fn in ("zeros", "ones", "empty", "randn", "rand"):
    row(f"{fn} negative size", lambda fn=fn: getattr(mdn, fn)(2, -1), RuntimeError, r"-1",
        lambda fn=fn: getattr(torch, fn)(2, -1))
    row(f"{fn} negative size tuple", lambda fn=fn: getattr(mdn, fn)((-3,)), RuntimeError, r"-3",
        lambda fn=fn: getattr(torch, fn)((-3,)))
row("full negative", lambda: mdn.full((-2, 2), 1.0), RuntimeError, r"-2", lambda: torch.full((-2, 2), 1.0))
row("eye negative", lambda: mdn.eye(-1), RuntimeError, r"-1", lambda: torch.eye(-1))
row("randint negative size", lambda: mdn.randint(0, 5, (-1,)), RuntimeError, r"-1",
    lambda: torch.randint(0, 5, (-1,)))
row("randint empty range", lambda: mdn.randint(5, 5, (2,)), RuntimeError, r"5",
    lambda: torch.randint(5, 5, (2,)))
row("arange step 0", lambda: mdn.arange(0, 5, 0), RuntimeError, r"step", lambda: torch.arange(0, 5, 0))
row("arange wrong sign", lambda: mdn.arange(0, 5, -1), RuntimeError, r"-1|sign", lambda: torch.arange(0, 5, -1))
row("linspace negative steps", lambda: mdn.linspace(0, 1, -2), RuntimeError, r"-2", lambda: torch.linspace(0, 1, -2))
row("tensor ragged", lambda: mdn.tensor([[1, 2], [3]]), ValueError, r"length|ragged|2.*1",
    lambda: torch.tensor([[1, 2], [3]]))
row("tensor of strings", lambda: mdn.tensor(["a", "b"]), ValueError, r"str", lambda: torch.tensor(["a", "b"]))
row("Linear negative", lambda: nn.Linear(-1, 2), RuntimeError, r"-1", lambda: torch.nn.Linear(-1, 2))
row("Conv2d groups", lambda: nn.Conv2d(3, 4, 3, groups=2), ValueError, r"3.*2|divisible",
    lambda: torch.nn.Conv2d(3, 4, 3, groups=2))
row("Conv2d out groups", lambda: nn.Conv2d(4, 3, 3, groups=2), ValueError, r"3.*2|divisible",
    lambda: torch.nn.Conv2d(4, 3, 3, groups=2))
row("Dropout p", lambda: nn.Dropout(1.5), ValueError, r"1.5", lambda: torch.nn.Dropout(1.5))
row("Dropout p neg", lambda: nn.Dropout(-0.1), ValueError, r"-0.1", lambda: torch.nn.Dropout(-0.1))
row("F.dropout p", lambda: F.dropout(x2(), 2.0), ValueError, r"2.0", lambda: tF.dropout(t2(), 2.0))

# -- dims out of range ----------------------------------------------------------------------------------------------
DIM_OPS = {
    "flip": (lambda t, d: t.flip(d), lambda t, d: t.flip(d)),
    "unbind": (lambda t, d: t.unbind(d), lambda t, d: t.unbind(d)),
    "squeeze": (lambda t, d: t.squeeze(d), lambda t, d: t.squeeze(d)),
    "unsqueeze": (lambda t, d: t.unsqueeze(d), lambda t, d: t.unsqueeze(d)),
    "sum": (lambda t, d: t.sum(d), lambda t, d: t.sum(d)),
    "mean": (lambda t, d: t.mean(d), lambda t, d: t.mean(d)),
    "argmax": (lambda t, d: t.argmax(d), lambda t, d: t.argmax(d)),
    "argmin": (lambda t, d: t.argmin(d), lambda t, d: t.argmin(d)),
    "amax": (lambda t, d: t.amax(d), lambda t, d: t.amax(d)),
    "max": (lambda t, d: t.max(d), lambda t, d: t.max(d)),
    "prod": (lambda t, d: t.prod(d), lambda t, d: t.prod(d)),
    "var": (lambda t, d: t.var(d), lambda t, d: t.var(d)),
    "std": (lambda t, d: t.std(d), lambda t, d: t.std(d)),
    "logsumexp": (lambda t, d: t.logsumexp(d), lambda t, d: t.logsumexp(d)),
    "softmax": (lambda t, d: F.softmax(t, d), lambda t, d: tF.softmax(t, d)),
    "log_softmax": (lambda t, d: F.log_softmax(t, d), lambda t, d: tF.log_softmax(t, d)),
    "cat": (lambda t, d: mdn.cat([t, t], d), lambda t, d: torch.cat([t, t], d)),
    "stack": (lambda t, d: mdn.stack([t, t], d), lambda t, d: torch.stack([t, t], d)),
    "transpose": (lambda t, d: t.swapaxes(0, d), lambda t, d: t.transpose(0, d)),
    "movedim": (lambda t, d: t.movedim(0, d), lambda t, d: t.movedim(0, d)),
    "chunk_dim": (lambda t, d: t.chunk(2, d), lambda t, d: t.chunk(2, d)),
    "split_dim": (lambda t, d: t.split(1, d), lambda t, d: t.split(1, d)),
    "narrow_dim": (lambda t, d: t.narrow(d, 0, 1), lambda t, d: t.narrow(d, 0, 1)),
    "select_dim": (lambda t, d: t.select(d, 0), lambda t, d: t.select(d, 0)),
}
for name, (mcall, tcall) in DIM_OPS.items():
    for d in (5, -6) + (() if name in ("unsqueeze", "stack") else (2,)):
        row(f"{name} dim {d}", lambda mcall=mcall, d=d: mcall(x2(), d), IndexError, rf"{d}|range",
            lambda tcall=tcall, d=d: tcall(t2(), d))

# -- shapes and arguments of shape ops --------------------------------------------------------------------------------
row("flip duplicate dims", lambda: x2().flip((0, 0)), RuntimeError, r"dup|0", lambda: t2().flip((0, 0)))
row("permute duplicate", lambda: x2().permute(0, 0), RuntimeError, r"dup|0", lambda: t2().permute(0, 0))
row("permute length", lambda: x2().permute(0, 1, 2), RuntimeError, r"3|2", lambda: t2().permute(0, 1, 2))
row("reshape size", lambda: x2().reshape(5), RuntimeError, r"5.*12|12.*5", lambda: t2().reshape(5))
row("reshape two -1", lambda: x2().reshape(-1, -1), RuntimeError, r"-1|one", lambda: t2().reshape(-1, -1))
row("view size", lambda: x2().view(7), RuntimeError, r"7", lambda: t2().view(7))
row("chunk 0", lambda: x2().chunk(0), RuntimeError, r"0|greater", lambda: t2().chunk(0))
row("chunk negative", lambda: x2().chunk(-1), RuntimeError, r"-1|greater", lambda: t2().chunk(-1))
row("split 0", lambda: x2().split(0), RuntimeError, r"0", lambda: t2().split(0))
row("cat empty", lambda: mdn.cat([]), ValueError, r"empty|non-empty", lambda: torch.cat([]))
row("cat shapes", lambda: mdn.cat([mdn.zeros(2, 3), mdn.zeros(2, 4)], 0), RuntimeError, r"3.*4|4.*3",
    lambda: torch.cat([torch.zeros(2, 3), torch.zeros(2, 4)], 0))
row("stack shapes", lambda: mdn.stack([mdn.zeros(2), mdn.zeros(3)]), RuntimeError, r"2.*3|3.*2",
    lambda: torch.stack([torch.zeros(2), torch.zeros(3)]))
row("stack empty", lambda: mdn.stack([]), RuntimeError, r"empty|non-empty", lambda: torch.stack([]))
row("expand", lambda: mdn.zeros(3, 2).expand(3, 4), RuntimeError, r"2.*4|4.*2",
    lambda: torch.zeros(3, 2).expand(3, 4))
row("expand fewer dims", lambda: mdn.zeros(3, 2).expand(2), RuntimeError, r"2",
    lambda: torch.zeros(3, 2).expand(2))
row("narrow range", lambda: x2().narrow(1, 3, 2), RuntimeError, r"3|2|4", lambda: t2().narrow(1, 3, 2))
row("select index", lambda: x2().select(0, 5), IndexError, r"5", lambda: t2().select(0, 5))
row("index int", lambda: x2()[5], IndexError, r"5", lambda: t2()[5])
row("index negative", lambda: x2()[-4], IndexError, r"-4", lambda: t2()[-4])
row("index too many", lambda: x2()[0, 0, 0], IndexError, r"3|2|too many", lambda: t2()[0, 0, 0])
row("index tensor range", lambda: x2()[mdn.tensor([0, 7])], IndexError, r"7", lambda: t2()[torch.tensor([0, 7])])
row("bool mask shape", lambda: x2()[mdn.tensor([True, False])], IndexError, r"2|3",
    lambda: t2()[torch.tensor([True, False])])
row("index float", lambda: x2()[mdn.tensor([0.5])], IndexError, r"0\.5.*integer|float",
    lambda: t2()[torch.tensor([0.5])])
row("setitem shape", lambda: x2().__setitem__(0, mdn.zeros(5)), RuntimeError, r"5|4",
    lambda: t2().__setitem__(0, torch.zeros(5)))

# -- elementwise, linear algebra, dtypes -------------------------------------------------------------------------------
row("add string", lambda: x2() + "a", TypeError, r"str", lambda: t2() + "a")
row("mul list of str", lambda: x2() * ["a"], TypeError, r"str|list", lambda: t2() * ["a"])
row("add broadcast", lambda: mdn.zeros(3, 4) + mdn.zeros(2, 4), RuntimeError, r"3.*2|2.*3",
    lambda: torch.zeros(3, 4) + torch.zeros(2, 4))
row("mul broadcast", lambda: mdn.zeros(3) * mdn.zeros(4), RuntimeError, r"3.*4|4.*3",
    lambda: torch.zeros(3) * torch.zeros(4))
row("int add_ float", lambda: mdn.tensor([1, 2]).add_(0.5), RuntimeError, r"Long|int64|Float|float",
    lambda: torch.tensor([1, 2]).add_(0.5))
row("int mul_ float", lambda: mdn.tensor([1, 2]).mul_(1.5), RuntimeError, r"Long|int64|Float|float",
    lambda: torch.tensor([1, 2]).mul_(1.5))
row("int div_", lambda: mdn.tensor([1, 2]).div_(2), RuntimeError, r"Long|int64|Float|float",
    lambda: torch.tensor([1, 2]).div_(2))
row("inplace broadcast grows", lambda: mdn.zeros(3).add_(mdn.zeros(2, 3)), RuntimeError, r"3|2",
    lambda: torch.zeros(3).add_(torch.zeros(2, 3)))
row("matmul shapes", lambda: mdn.zeros(2, 3) @ mdn.zeros(4, 5), RuntimeError, r"3.*4|4.*3",
    lambda: torch.zeros(2, 3) @ torch.zeros(4, 5))
row("matmul 0-d", lambda: mdn.tensor(2.0) @ mdn.zeros(3), RuntimeError, r"0|dim",
    lambda: torch.tensor(2.0) @ torch.zeros(3))
row("matmul batch", lambda: mdn.zeros(2, 2, 3) @ mdn.zeros(3, 3, 4), RuntimeError, r"2.*3|3.*2",
    lambda: torch.zeros(2, 2, 3) @ torch.zeros(3, 3, 4))
row("pow int negative", lambda: mdn.tensor([2, 3]) ** -1, RuntimeError, r"negative|-1",
    lambda: torch.tensor([2, 3]) ** -1)
row("mean of ints", lambda: mdn.tensor([1, 2]).mean(), RuntimeError, r"Long|int64|floating",
    lambda: torch.tensor([1, 2]).mean())
row("requires_grad int", lambda: mdn.tensor([1, 2]).requires_grad_(), RuntimeError, r"floating|complex|int64|Long",
    lambda: torch.tensor([1, 2]).requires_grad_())
row("item of many", lambda: x2().item(), RuntimeError, r"12|one element",
    lambda: t2().item())
row("bool of many", lambda: bool(x2()), RuntimeError, r"ambiguous|more than one", lambda: bool(t2()))
row("backward non-scalar", lambda: mdn.randn(3, requires_grad=True).__mul__(2).backward(), RuntimeError,
    r"scalar|3", lambda: (torch.randn(3, requires_grad=True) * 2).backward())
row("backward no grad", lambda: mdn.zeros(2).sum().backward(), RuntimeError, r"grad",
    lambda: torch.zeros(2).sum().backward())
row("clamp no bounds", lambda: x2().clamp(), RuntimeError, r"min|max", lambda: t2().clamp())
row("where shapes", lambda: mdn.where(mdn.zeros(3) > 0, mdn.zeros(2), mdn.zeros(3)), RuntimeError, r"2|3",
    lambda: torch.where(torch.zeros(3) > 0, torch.zeros(2), torch.zeros(3)))
row("to bad dtype", lambda: x2().to("nonsense"), RuntimeError, r"nonsense|dtype|device",
    lambda: t2().to("nonsense"))

# -- nn layers and functional ops -----------------------------------------------------------------------------------
x4 = lambda: mdn.randn(2, 3, 8, 8)      # noqa: E731
t4 = lambda: torch.randn(2, 3, 8, 8)    # noqa: E731
row("conv2d channels", lambda: F.conv2d(x4(), mdn.randn(4, 2, 3, 3)), RuntimeError, r"3.*2|2.*3",
    lambda: tF.conv2d(t4(), torch.randn(4, 2, 3, 3)))
row("conv2d weight dims", lambda: F.conv2d(x4(), mdn.randn(4, 3, 3)), RuntimeError, r"3|4",
    lambda: tF.conv2d(t4(), torch.randn(4, 3, 3)))
row("conv2d kernel too big", lambda: F.conv2d(x4(), mdn.randn(4, 3, 9, 9)), RuntimeError, r"9|8",
    lambda: tF.conv2d(t4(), torch.randn(4, 3, 9, 9)))
row("conv2d stride 0", lambda: F.conv2d(x4(), mdn.randn(4, 3, 3, 3), stride=0), RuntimeError, r"stride|0",
    lambda: tF.conv2d(t4(), torch.randn(4, 3, 3, 3), stride=0))
row("conv2d padding neg", lambda: F.conv2d(x4(), mdn.randn(4, 3, 3, 3), padding=-1), RuntimeError, r"-1|negative",
    lambda: tF.conv2d(t4(), torch.randn(4, 3, 3, 3), padding=-1))
row("conv2d bias", lambda: F.conv2d(x4(), mdn.randn(4, 3, 3, 3), mdn.randn(5)), RuntimeError, r"5|4",
    lambda: tF.conv2d(t4(), torch.randn(4, 3, 3, 3), torch.randn(5)))
row("conv2d dtype", lambda: F.conv2d(x4(), mdn.randn(4, 3, 3, 3, dtype=mdn.float64)), RuntimeError,
    r"float64|double|Double|float32|Float",
    lambda: tF.conv2d(t4(), torch.randn(4, 3, 3, 3, dtype=torch.float64)))
row("Conv2d module input", lambda: nn.Conv2d(4, 2, 3)(x4()), RuntimeError, r"4|3",
    lambda: torch.nn.Conv2d(4, 2, 3)(t4()))
row("Linear input", lambda: nn.Linear(5, 2)(x2()), RuntimeError, r"5|4", lambda: torch.nn.Linear(5, 2)(t2()))
row("linear weight", lambda: F.linear(x2(), mdn.randn(2, 5)), RuntimeError, r"5|4",
    lambda: tF.linear(t2(), torch.randn(2, 5)))
row("max_pool kernel", lambda: F.max_pool2d(x4(), 0), RuntimeError, r"0|kernel",
    lambda: tF.max_pool2d(t4(), 0))
row("max_pool padding", lambda: F.max_pool2d(x4(), 2, padding=2), RuntimeError, r"pad|2",
    lambda: tF.max_pool2d(t4(), 2, padding=2))
row("avg_pool padding", lambda: F.avg_pool2d(x4(), 2, padding=3), RuntimeError, r"pad|3",
    lambda: tF.avg_pool2d(t4(), 2, padding=3))
row("max_pool 2-d input", lambda: F.max_pool2d(mdn.randn(3), 2), RuntimeError, r"3|dim",
    lambda: tF.max_pool2d(torch.randn(3), 2))
row("BatchNorm channels", lambda: nn.BatchNorm2d(4)(x4()), RuntimeError, r"4|3",
    lambda: torch.nn.BatchNorm2d(4)(t4()))
row("BatchNorm1d one value", lambda: nn.BatchNorm1d(3)(mdn.randn(1, 3)), ValueError, r"1|more than",
    lambda: torch.nn.BatchNorm1d(3)(torch.randn(1, 3)))
row("LayerNorm shape", lambda: nn.LayerNorm(5)(x2()), RuntimeError, r"5|4",
    lambda: torch.nn.LayerNorm(5)(t2()))
row("GroupNorm groups", lambda: nn.GroupNorm(2, 3), ValueError, r"3|2|divisible",
    lambda: torch.nn.GroupNorm(2, 3))
row("group_norm channels", lambda: F.group_norm(x4(), 2), RuntimeError, r"3|2|divisible",
    lambda: tF.group_norm(t4(), 2))
row("Embedding negative", lambda: nn.Embedding(5, 2)(mdn.tensor([-1])), IndexError, r"-1|range",
    lambda: torch.nn.Embedding(5, 2)(torch.tensor([-1])))
row("Embedding too large", lambda: nn.Embedding(5, 2)(mdn.tensor([5])), IndexError, r"5|range",
    lambda: torch.nn.Embedding(5, 2)(torch.tensor([5])))
row("Embedding float index", lambda: nn.Embedding(5, 2)(mdn.tensor([1.0])), RuntimeError, r"Long|Int|float|Float",
    lambda: torch.nn.Embedding(5, 2)(torch.tensor([1.0])))
row("Flatten dims", lambda: nn.Flatten(3)(x2()), IndexError, r"3|range", lambda: torch.nn.Flatten(3)(t2()))
row("softmax 0-d dim 1", lambda: F.softmax(mdn.tensor(1.0), 1), IndexError, r"1|range",
    lambda: tF.softmax(torch.tensor(1.0), 1))
row("pad odd", lambda: F.pad(x2(), (1,)), RuntimeError, r"1|even|divisible",
    lambda: tF.pad(t2(), (1,)))
row("pad too long", lambda: F.pad(x2(), (1, 1, 1, 1, 1, 1)), RuntimeError, r"6|3|2",
    lambda: tF.pad(t2(), (1, 1, 1, 1, 1, 1)))
row("one_hot negative", lambda: F.one_hot(mdn.tensor([-1]), 3), RuntimeError, r"-1|negative|non-negative",
    lambda: tF.one_hot(torch.tensor([-1]), 3))
row("one_hot too small", lambda: F.one_hot(mdn.tensor([3]), 3), RuntimeError, r"3|less|class",
    lambda: tF.one_hot(torch.tensor([3]), 3))
row("log_softmax int", lambda: F.log_softmax(mdn.tensor([1, 2]), 0), RuntimeError, r"Long|int64|floating",
    lambda: tF.log_softmax(torch.tensor([1, 2]), 0))

# -- losses ------------------------------------------------------------------------------------------------------------
row("cross_entropy target range", lambda: F.cross_entropy(x2(), mdn.tensor([0, 1, 4])), IndexError, r"4",
    lambda: tF.cross_entropy(t2(), torch.tensor([0, 1, 4])))
row("cross_entropy negative target", lambda: F.cross_entropy(x2(), mdn.tensor([0, -2, 1])), IndexError, r"-2",
    lambda: tF.cross_entropy(t2(), torch.tensor([0, -2, 1])))
row("cross_entropy batch", lambda: F.cross_entropy(x2(), mdn.tensor([0, 1])), ValueError, r"3.*2|2.*3",
    lambda: tF.cross_entropy(t2(), torch.tensor([0, 1])))
row("cross_entropy weight", lambda: F.cross_entropy(x2(), mdn.tensor([0, 1, 2]), weight=mdn.ones(3)),
    RuntimeError, r"3|4", lambda: tF.cross_entropy(t2(), torch.tensor([0, 1, 2]), weight=torch.ones(3)))
row("cross_entropy reduction", lambda: F.cross_entropy(x2(), mdn.tensor([0, 1, 2]), reduction="avg"),
    ValueError, r"avg", lambda: tF.cross_entropy(t2(), torch.tensor([0, 1, 2]), reduction="avg"))
row("nll_loss float target", lambda: F.nll_loss(x2(), mdn.tensor([0.0, 1.0, 2.0])), RuntimeError,
    r"Long|int64|Float|float", lambda: tF.nll_loss(t2(), torch.tensor([0.0, 1.0, 2.0])))
row("bce range", lambda: F.binary_cross_entropy(mdn.tensor([1.5]), mdn.tensor([1.0])), RuntimeError,
    r"between 0 and 1|1.5", lambda: tF.binary_cross_entropy(torch.tensor([1.5]), torch.tensor([1.0])))
row("bce shapes", lambda: F.binary_cross_entropy(mdn.tensor([0.5, 0.5]), mdn.tensor([1.0])), ValueError,
    r"2|1", lambda: tF.binary_cross_entropy(torch.tensor([0.5, 0.5]), torch.tensor([1.0])))
row("mse reduction", lambda: F.mse_loss(x2(), x2(), reduction="bad"), ValueError, r"bad",
    lambda: tF.mse_loss(t2(), t2(), reduction="bad"))
row("l1 broadcast", lambda: F.l1_loss(mdn.zeros(3), mdn.zeros(4)), RuntimeError, r"3|4",
    lambda: tF.l1_loss(torch.zeros(3), torch.zeros(4)))
row("smooth_l1 beta", lambda: F.smooth_l1_loss(x2(), x2(), beta=-1.0), RuntimeError, r"-1|beta|negative",
    lambda: tF.smooth_l1_loss(t2(), t2(), beta=-1.0))

# -- optimizers and schedulers ---------------------------------------------------------------------------------------
def _params():
    return [nn.Parameter(mdn.zeros(3))]


def _tparams():
    return [torch.nn.Parameter(torch.zeros(3))]


row("SGD negative lr", lambda: mdn.optim.SGD(_params(), lr=-1), ValueError, r"-1",
    lambda: torch.optim.SGD(_tparams(), lr=-1))
row("SGD negative momentum", lambda: mdn.optim.SGD(_params(), lr=0.1, momentum=-1), ValueError, r"-1",
    lambda: torch.optim.SGD(_tparams(), lr=0.1, momentum=-1))
row("SGD nesterov", lambda: mdn.optim.SGD(_params(), lr=0.1, nesterov=True), ValueError, r"[Nn]esterov",
    lambda: torch.optim.SGD(_tparams(), lr=0.1, nesterov=True))
row("Adam beta", lambda: mdn.optim.Adam(_params(), betas=(1.0, 0.9)), ValueError, r"1.0|beta",
    lambda: torch.optim.Adam(_tparams(), betas=(1.0, 0.9)))
row("Adam eps", lambda: mdn.optim.Adam(_params(), eps=-1), ValueError, r"-1|eps",
    lambda: torch.optim.Adam(_tparams(), eps=-1))
row("Adam wd", lambda: mdn.optim.Adam(_params(), weight_decay=-1), ValueError, r"-1|weight_decay",
    lambda: torch.optim.Adam(_tparams(), weight_decay=-1))
row("optimizer empty", lambda: mdn.optim.SGD([], lr=0.1), ValueError, r"empty",
    lambda: torch.optim.SGD([], lr=0.1))
row("optimizer tensor", lambda: mdn.optim.SGD(mdn.zeros(3), lr=0.1), TypeError, r"iterable|Tensor",
    lambda: torch.optim.SGD(torch.zeros(3), lr=0.1))
row("optimizer dict of tensors", lambda: mdn.optim.SGD({"a": mdn.zeros(2)}, lr=0.1), TypeError, r"str|dict|Tensor",
    None)
row("optimizer of ints", lambda: mdn.optim.SGD([1, 2], lr=0.1), TypeError, r"int|Tensor",
    lambda: torch.optim.SGD([1, 2], lr=0.1))
row("optimizer non-leaf", lambda: mdn.optim.SGD([mdn.zeros(2, requires_grad=True) * 2], lr=0.1), ValueError,
    r"leaf", lambda: torch.optim.SGD([torch.zeros(2, requires_grad=True) * 2], lr=0.1))
row("scheduler not an optimizer", lambda: mdn.optim.lr_scheduler.StepLR([1, 2], 1), TypeError, r"list|Optimizer",
    lambda: torch.optim.lr_scheduler.StepLR([1, 2], 1))
row("scheduler dict", lambda: mdn.optim.lr_scheduler.ExponentialLR({"lr": 1}, 0.9), TypeError, r"dict|Optimizer",
    lambda: torch.optim.lr_scheduler.ExponentialLR({"lr": 1}, 0.9))
row("param group without params", lambda: mdn.optim.SGD(_params(), lr=0.1).add_param_group({"lr": 0.1}),
    KeyError, r"params", lambda: torch.optim.SGD(_tparams(), lr=0.1).add_param_group({"lr": 0.1}))

# -- data --------------------------------------------------------------------------------------------------------------
_ds = lambda: mdn.data.TensorDataset(mdn.arange(10.0))        # noqa: E731
_tds = lambda: torch.utils.data.TensorDataset(torch.arange(10.0))  # noqa: E731
row("DataLoader batch_size 0", lambda: mdn.data.DataLoader(_ds(), batch_size=0), ValueError, r"0|positive",
    lambda: torch.utils.data.DataLoader(_tds(), batch_size=0))
row("DataLoader batch_size neg", lambda: mdn.data.DataLoader(_ds(), batch_size=-2), ValueError, r"-2|positive",
    lambda: torch.utils.data.DataLoader(_tds(), batch_size=-2))
row("DataLoader workers neg", lambda: mdn.data.DataLoader(_ds(), num_workers=-1), ValueError, r"-1|num_workers",
    lambda: torch.utils.data.DataLoader(_tds(), num_workers=-1))
row("DataLoader sampler+shuffle",
    lambda: mdn.data.DataLoader(_ds(), sampler=mdn.utils.data.SequentialSampler(_ds()), shuffle=True),
    ValueError, r"sampler|shuffle",
    lambda: torch.utils.data.DataLoader(_tds(), sampler=torch.utils.data.SequentialSampler(_tds()), shuffle=True))
row("DataLoader timeout", lambda: mdn.data.DataLoader(_ds(), timeout=-1), ValueError, r"-1|timeout",
    lambda: torch.utils.data.DataLoader(_tds(), timeout=-1))
row("TensorDataset sizes", lambda: mdn.data.TensorDataset(mdn.zeros(3), mdn.zeros(4)), ValueError, r"3|4|size",
    None)
row("random_split sizes", lambda: mdn.utils.data.random_split(_ds(), [3, 3]), ValueError, r"3|10|sum",
    lambda: torch.utils.data.random_split(_tds(), [3, 3]))

# -- save / load ----------------------------------------------------------------------------------------------------
row("save a function", lambda: mdn.save({"f": lambda: 0}, "/tmp/_minidnn_bad_row.pt"), TypeError, r"function",
    None)
row("load missing", lambda: mdn.load("/nonexistent/minidnn.pt"), FileNotFoundError, r"nonexistent",
    lambda: torch.load("/nonexistent/minidnn.pt"))


# -- rows with state: the failing call must leave it untouched ---------------------------------------------------------
def _bn_state():
    bn = nn.BatchNorm2d(3)
    return bn, lambda: bn(mdn.randn(2, 4, 5, 5))


def _module_load_state():
    lin = nn.Linear(3, 2)
    bad = {"weight": mdn.zeros(5, 5), "bias": mdn.zeros(2)}
    return lin, lambda: lin.load_state_dict(bad)


def _module_load_missing():
    lin = nn.Linear(3, 2)
    return lin, lambda: lin.load_state_dict({"weight": mdn.zeros(2, 3)})


def _opt_bad_lr():
    lin = nn.Linear(3, 2)
    opt = mdn.optim.SGD(lin.parameters(), lr=0.1, momentum=0.9)
    lin(mdn.randn(2, 3)).sum().backward()
    opt.step()
    sd = copy.deepcopy(opt.state_dict())
    sd["param_groups"][0]["lr"] = -1.0
    return (lin, opt), lambda: opt.load_state_dict(sd)


def _grad_shape():
    p = nn.Parameter(mdn.zeros(3))
    opt = mdn.optim.Adam([p], lr=0.1, fused=False)
    p.grad = mdn.ones(2)
    return (p, opt), lambda: opt.step()


def _snapshot(obj):
    if isinstance(obj, tuple):
        return [_snapshot(o) for o in obj]
    if isinstance(obj, nn.Module):
        return {k: np.array(v.numpy()) for k, v in obj.state_dict().items()}
    if isinstance(obj, mdn.optim.Optimizer):
        sd = obj.state_dict()
        return (copy.deepcopy(sd["param_groups"]),
                {k: {n: np.array(mdn.tensor(v).numpy()) for n, v in s.items()} for k, s in sd["state"].items()})
    return np.array(obj.numpy())


def _equal(a, b):
    if isinstance(a, list):
        return all(_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, tuple):
        return a[0] == b[0] and _equal(a[1], b[1])
    return np.array_equal(a, b, equal_nan=True)


STATEFUL = [
    pytest.param(_bn_state, RuntimeError, r"4|3", id="BatchNorm wrong channels keeps stats"),
    pytest.param(_module_load_state, RuntimeError, r"5|3|size", id="load_state_dict shape keeps weights"),
    pytest.param(_module_load_missing, RuntimeError, r"bias|[Mm]issing", id="load_state_dict missing key"),
    pytest.param(_opt_bad_lr, ValueError, r"-1|learning rate", id="optimizer load bad lr"),
    pytest.param(_grad_shape, RuntimeError, r"3|2|shape", id="optimizer wrong grad shape"),
]


@pytest.mark.parametrize("call, exc, match, torch_call, state", ROWS)
def test_bad_input(call, exc, match, torch_call, state):
    if torch is not None and torch_call is not None:
        with pytest.raises(Exception) as texc:
            torch_call()
        assert isinstance(texc.value, exc) or issubclass(exc, type(texc.value)), \
            f"the row expects {exc.__name__} but PyTorch raises {type(texc.value).__name__}: {texc.value}"
    with pytest.raises(exc, match=match):
        call()


@pytest.mark.parametrize("make, exc, match", STATEFUL)
def test_failed_call_changes_nothing(make, exc, match):
    obj, call = make()
    before = _snapshot(obj)
    with pytest.raises(exc, match=match):
        call()
    assert _equal(before, _snapshot(obj))


def test_table_size():
    assert len(ROWS) + len(STATEFUL) >= 200

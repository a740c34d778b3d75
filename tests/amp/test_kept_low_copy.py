"""Autocast's kept flat low-precision copy (session 11): the whole-flat-buffer cast of a region is written into a
buffer kept across regions (one elementwise copy: the launch the fresh astype took), and each parameter's view of
it and its direct weight are made once, not every region.

The oracle is the fresh copy per region (``autocast_mode.KEEP_LOW_COPY[0] = False``): every test runs the same steps
both ways from the same parameters and asserts every value and gradient bit for bit equal.  The hazards are tested
against it: a region's graph still alive (no backward yet, or retain_graph) when the next region casts, a cast node's
output of the copy kept alive, an optimizer step between a forward and its backward, an in-place change of a
parameter outside the optimizer -- each must see the values of its own region, so the copy is not written over
while anything holds it (a new one is made).  The copy is reused across ordinary training steps; it goes with its
flat set.
"""
from __future__ import annotations

import gc

import numpy as np
import pytest

import minidnn as mdn
import minidnn.nn as nn
import minidnn.nn.functional as F
from minidnn import _amp_state
from minidnn.amp import autocast_mode as A


def _bits(t):
    a = np.ascontiguousarray(t.detach().numpy() if isinstance(t, mdn.Tensor) else t)
    return a.dtype, a.view(np.uint8).tobytes()


def _same(old, new):
    assert len(old) == len(new)
    for i, (a, b) in enumerate(zip(old, new)):
        assert _bits(a) == _bits(b), f"result {i} differs"


@pytest.fixture
def copies_made(monkeypatch):
    made = []
    init = A._LowCopy.__init__

    def counting(self, fs, dtype):
        made.append(self)
        init(self, fs, dtype)
    monkeypatch.setattr(A._LowCopy, "__init__", counting)
    return made


def _net(seed=0, bn=True):
    """(Without batch norm for the tests that step the optimizer between a forward and its backward: batch norm
    saves its float32 parameters, whose new versions then raise -- with either copy.)"""
    mdn.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8) if bn else nn.Identity(), nn.ReLU(),
                         nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 5))


X = mdn.randn(4, 3, 6, 6)
Y = mdn.tensor([0, 1, 2, 3])


def _both(fn, set_keep_low_copy, set_direct_weights, direct=True):
    set_direct_weights(direct)
    out = []
    for keep in (False, True):
        set_keep_low_copy(keep)
        out.append(fn())
    return out


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "cast_nodes"])
@pytest.mark.parametrize("opt_name", ["sgd", "adam"])
def test_training_bit_equal_and_one_copy(set_keep_low_copy, set_direct_weights, copies_made, direct, opt_name):
    def run():
        model = _net()
        opt = (mdn.optim.SGD(model.parameters(), lr=0.1, momentum=0.9) if opt_name == "sgd" else
               mdn.optim.Adam(model.parameters(), lr=1e-2))
        out = []
        for _ in range(5):
            with mdn.autocast("cpu"):
                loss = F.cross_entropy(model(X), Y)
            opt.zero_grad()
            loss.backward()
            out += [loss] + [p.grad for p in model.parameters()]
            opt.step()
        return out + list(model.parameters())
    old, new = _both(run, set_keep_low_copy, set_direct_weights, direct)
    _same(old, new)
    assert len(copies_made) == 1        # made by the second region (the first learns the buffer), then kept


def test_graph_alive_across_regions(set_keep_low_copy, set_direct_weights, copies_made):
    """Region A's graph is kept (no backward yet) while the optimizer steps and region B runs forward and backward:
    B must not write over A's copy -- A's backward computes with A's weights (a new copy was made for B)."""
    def run():
        model = _net(bn=False)
        opt = mdn.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        for _ in range(2):          # the flat-buffer cast from the second region on
            with mdn.autocast("cpu"):
                loss = F.cross_entropy(model(X), Y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        with mdn.autocast("cpu"):
            loss_a = F.cross_entropy(model(X), Y)
        with mdn.autocast("cpu"):
            loss_b = F.cross_entropy(model(X * 2), Y)
        opt.zero_grad()
        loss_b.backward()
        opt.step()                  # the parameters move between A's forward and A's backward
        grads_b = [p.grad.clone() for p in model.parameters()]
        with mdn.autocast("cpu"):
            loss_c = F.cross_entropy(model(X), Y)     # a third region while A's graph is still alive
        opt.zero_grad()
        loss_a.backward()
        grads_a = [p.grad.clone() for p in model.parameters()]
        opt.zero_grad()
        loss_c.backward()
        return [loss_a, loss_b, loss_c] + grads_b + grads_a + [p.grad for p in model.parameters()]
    old, new = _both(run, set_keep_low_copy, set_direct_weights)
    _same(old, new)
    assert len(copies_made) >= 2


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "cast_nodes"])
def test_retained_graph_backward_again_after_another_region(set_keep_low_copy, set_direct_weights, direct):
    def run():
        model = _net(bn=False)
        opt = mdn.optim.SGD(model.parameters(), lr=0.1)
        out = []
        for _ in range(2):
            with mdn.autocast("cpu"):
                loss = F.cross_entropy(model(X), Y)
            opt.zero_grad()
            loss.backward(retain_graph=True)
            opt.step()
            out.append(loss)
        with mdn.autocast("cpu"):
            F.cross_entropy(model(X * 3), Y).backward()
        opt.zero_grad()
        loss.backward()             # the retained graph of the second region, again
        return out + [p.grad for p in model.parameters()]
    _same(*_both(run, set_keep_low_copy, set_direct_weights, direct))


def test_cast_node_output_kept_alive(set_keep_low_copy, set_direct_weights, copies_made):
    """Another op's cast of a parameter (a cast node's output: a view of the copy) kept past its region: the next
    region makes a new copy rather than change the kept Tensor's values."""
    set_direct_weights(True)
    set_keep_low_copy(True)
    model = _net()
    opt = mdn.optim.SGD(model.parameters(), lr=0.1)
    lin = model[6]
    kept = None
    for step in range(4):
        with mdn.autocast("cpu"):
            loss = F.cross_entropy(model(X), Y)
            if step == 2:
                mdn.matmul(mdn.ones(1, 5), lin.weight)     # the cached cast, through a node from now on
                kept = _amp_state._state()["cache"][id(lin.weight)][2]
                assert type(kept.grad_fn) is A.AutocastCast
                before = kept.detach().numpy().copy()
        opt.zero_grad()
        loss.backward()
        opt.step()
    np.testing.assert_array_equal(kept.detach().numpy(), before)
    assert len(copies_made) == 2


def test_in_place_change_outside_the_optimizer(set_keep_low_copy, set_direct_weights):
    """A parameter changed in place between regions (outside the optimizer): the next region's copy has the new
    values (the copy is refilled every region); changed inside a region after the cast: cast on its own, as before."""
    def run():
        model = _net()
        opt = mdn.optim.SGD(model.parameters(), lr=0.1)
        out = []
        for step in range(4):
            if step == 2:
                with mdn.no_grad():
                    model[0].weight.mul_(0.5)
            with mdn.autocast("cpu"):
                h = model[:3](X)
                if step == 3:
                    with mdn.no_grad():
                        model[3].weight.add_(0.25)
                loss = F.cross_entropy(model[3:](h), Y)
            opt.zero_grad()
            loss.backward()
            out += [loss] + [p.grad for p in model.parameters()]
            opt.step()
        return out
    _same(*_both(run, set_keep_low_copy, set_direct_weights))


def test_param_groups_add_param_group_and_dtypes(set_keep_low_copy, set_direct_weights):
    """Two param groups (two flat sets, two copies), a group added later, and a float64 group (not cast whole)."""
    def run():
        model = _net()
        extra = nn.Linear(5, 3)
        opt = mdn.optim.SGD([{"params": list(model[:3].parameters())},
                             {"params": list(model[3:].parameters()), "lr": 0.05}], lr=0.1, momentum=0.9)
        head64 = nn.Linear(5, 2).to(mdn.float64)
        opt64 = mdn.optim.SGD(head64.parameters(), lr=0.1)
        out = []
        for step in range(5):
            if step == 2:
                opt.add_param_group({"params": list(extra.parameters()), "lr": 0.2})
            with mdn.autocast("cpu"):
                z = model(X)
                loss = F.cross_entropy(z, Y) + extra(z).float().square().mean() \
                    + head64(z.double()).float().square().mean()
            opt.zero_grad()
            opt64.zero_grad()
            loss.backward()
            out += [loss] + [p.grad for p in list(model.parameters()) + list(extra.parameters())
                             + list(head64.parameters())]
            opt.step()
            opt64.step()
        return out
    _same(*_both(run, set_keep_low_copy, set_direct_weights))


def test_copy_goes_with_its_flat_set(set_keep_low_copy, set_direct_weights):
    set_direct_weights(True)
    set_keep_low_copy(True)
    model = _net()
    opt = mdn.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        with mdn.autocast("cpu"):
            loss = F.cross_entropy(model(X), Y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    keys = [k for k, (ref, _) in A._LOW_COPIES.items() if ref() is not None and ref().params[0] is model[0].weight]
    assert len(keys) == 1
    del opt, loss
    gc.collect()
    assert keys[0] not in A._LOW_COPIES


def test_switch_from_the_environment():
    import os
    import subprocess
    import sys
    code = "from minidnn.amp import autocast_mode as A; print(A.KEEP_LOW_COPY[0])"
    for env, want in (("0", "False"), ("1", "True")):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                             env={**os.environ, "MINIDNN_AMP_KEEP_LOW_COPY": env})
        assert out.stdout.strip() == want

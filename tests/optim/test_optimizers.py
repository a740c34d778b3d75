"""Optimizers: the fused flat-buffer step against the per-parameter reference and against PyTorch.

One table of configurations; every test runs on each device (cpu, cuda).  The fused CPU update runs the same
elementwise core as the reference on flat slices, so cpu parity is near bit-exact; the CUDA kernel repeats
the op order without FMA contraction.
"""
import copy

import numpy as np
import pytest

import minidnn as mdn
from minidnn import optim
from minidnn.backend import devices as _dev
from minidnn.nn import Parameter

SHAPES = [(4, 3, 3, 3), (4,), (10, 7), (), (33,)]

CONFIGS = [
    ("sgd", dict(lr=0.1)),
    ("sgd", dict(lr=0.1, momentum=0.9)),
    ("sgd", dict(lr=0.1, momentum=0.9, nesterov=True)),
    ("sgd", dict(lr=0.1, momentum=0.9, weight_decay=0.01)),
    ("sgd", dict(lr=0.1, momentum=0.9, dampening=0.3)),
    ("sgd", dict(lr=0.1, momentum=0.5, maximize=True, weight_decay=0.1)),
    ("adam", dict(lr=1e-2)),
    ("adam", dict(lr=1e-2, amsgrad=True)),
    ("adam", dict(lr=1e-2, weight_decay=0.1)),
    ("adam", dict(lr=1e-2, amsgrad=True, maximize=True, weight_decay=0.05, betas=(0.8, 0.99))),
    ("adamw", dict(lr=1e-2)),
    ("adamw", dict(lr=1e-2, weight_decay=0.1, amsgrad=True)),
]
IDS = [f"{k}-" + "-".join(f"{a}={b}" for a, b in kw.items()) for k, kw in CONFIGS]
OPTIMIZERS = {"sgd": optim.SGD, "adam": optim.Adam, "adamw": optim.AdamW}


def _tol(dtype, device):
    # Relative-difference bounds of the issue; the CUDA kernel rounds pow/sqrt of the scalars in double on the
    # device, so float32 there gets a slightly wider bound.
    if np.dtype(dtype) == np.float64:
        return 1e-12
    return 1e-6 if device == "cpu" else 5e-6


def make_params(shapes, dtype, device, seed=0):
    rng = np.random.default_rng(seed)
    return [Parameter(mdn.tensor(rng.standard_normal(s), dtype=dtype, device=device)) for s in shapes]


def clone_params(params):
    return [Parameter(mdn.tensor(p.numpy().copy(), dtype=p.dtype, device=p.device)) for p in params]


def backward(params, grads):
    """sum_i <p_i, g_i> backward: each p_i's gradient is g_i, written by AccumulateGrad."""
    loss = None
    for p, g in zip(params, grads):
        term = (p * mdn.tensor(g, dtype=p.dtype, device=p.device)).sum()
        loss = term if loss is None else loss + term
    loss.backward()


def grads_for(params, rng, skip=()):
    return [None if i in skip else rng.standard_normal(p.shape) for i, p in enumerate(params)]


def train(opt, params, steps, seed=1, skip_at=lambda step: ()):
    rng = np.random.default_rng(seed)
    for step in range(steps):
        grads = grads_for(params, rng, skip_at(step))
        opt.zero_grad()
        pg = [(p, g) for p, g in zip(params, grads) if g is not None]
        backward(*zip(*pg))
        opt.step()


def rel_diff(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-3))) if a.size else 0.0


def assert_params_close(ps, qs, tol):
    for i, (p, q) in enumerate(zip(ps, qs)):
        d = rel_diff(p.numpy(), q.numpy())
        assert d <= tol, f"parameter {i} {tuple(p.shape)}: relative difference {d:.3g} > {tol}"


# -------------------------------------------------------------------------------------------------------------
# fused vs per-parameter reference
# -------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("kind,kwargs", CONFIGS, ids=IDS)
def test_fused_matches_reference_over_100_steps(kind, kwargs, dtype, device):
    fused_params = make_params(SHAPES, dtype, device)
    ref_params = clone_params(fused_params)
    fused = OPTIMIZERS[kind](fused_params, fused=True, **kwargs)
    ref = OPTIMIZERS[kind](ref_params, fused=False, **kwargs)
    train(fused, fused_params, 100)
    train(ref, ref_params, 100)
    assert_params_close(fused_params, ref_params, _tol(dtype, device))
    for i, (p, q) in enumerate(zip(fused_params, ref_params)):
        assert sorted(fused.state.get(p, {})) == sorted(ref.state.get(q, {}))
        for name, value in ref.state.get(q, {}).items():
            assert rel_diff(_dev.to_device(fused.state[p][name], "cpu"), _dev.to_device(value, "cpu")) <= \
                _tol(dtype, device), (i, name)


@pytest.mark.parametrize("kind,kwargs", CONFIGS, ids=IDS)
def test_params_without_grad_are_skipped(kind, kwargs, device):
    # Parameter 1 gets no gradient in steps 3-6 and parameter 3 never: both must stay untouched then, and the
    # per-parameter step counts diverge (masked kernel / run-wise CPU update).
    skip_at = lambda step: (1, 3) if 3 <= step <= 6 else (3,)   # noqa: E731
    fused_params = make_params(SHAPES, np.float64, device)
    ref_params = clone_params(fused_params)
    fused = OPTIMIZERS[kind](fused_params, **kwargs)
    ref = OPTIMIZERS[kind](ref_params, fused=False, **kwargs)
    frozen = fused_params[3].numpy().copy()
    train(fused, fused_params, 12, skip_at=skip_at)
    train(ref, ref_params, 12, skip_at=skip_at)
    assert_params_close(fused_params, ref_params, 1e-12)
    np.testing.assert_array_equal(fused_params[3].numpy(), frozen)
    assert fused_params[3] not in fused.state and ref_params[3] not in ref.state
    if kind != "sgd":
        assert float(fused.state[fused_params[1]]["step"]) == 8 == float(ref.state[ref_params[1]]["step"])


def test_a_step_without_any_grad_changes_nothing(device):
    params = make_params(SHAPES, np.float32, device)
    before = [p.numpy().copy() for p in params]
    opt = optim.Adam(params, lr=0.1)
    opt.step()
    for p, b in zip(params, before):
        np.testing.assert_array_equal(p.numpy(), b)
    assert opt.state == {}


# -------------------------------------------------------------------------------------------------------------
# vs PyTorch
# -------------------------------------------------------------------------------------------------------------
def _torch_optimizer(torch, kind, params, kwargs):
    cls = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[kind]
    return cls(params, foreach=False, **kwargs)


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("kind,kwargs", CONFIGS, ids=IDS)
def test_matches_pytorch(kind, kwargs, fused, device):
    torch = pytest.importorskip("torch")
    params = make_params(SHAPES, np.float64, device)
    tparams = [torch.tensor(p.numpy().copy(), requires_grad=True) for p in params]
    opt = OPTIMIZERS[kind](params, fused=fused, **kwargs)
    topt = _torch_optimizer(torch, kind, tparams, kwargs)
    rng = np.random.default_rng(5)
    skip_at = lambda step: (2,) if step % 4 == 1 else ()   # noqa: E731
    for step in range(30):
        grads = grads_for(params, rng, skip_at(step))
        opt.zero_grad()
        topt.zero_grad()
        backward(*zip(*[(p, g) for p, g in zip(params, grads) if g is not None]))
        for tp, g in zip(tparams, grads):
            tp.grad = None if g is None else torch.tensor(g)
        opt.step()
        topt.step()
    for p, tp in zip(params, tparams):
        assert rel_diff(p.numpy(), tp.detach().numpy()) <= 1e-10


# -------------------------------------------------------------------------------------------------------------
# the flat-buffer design under pressure
# -------------------------------------------------------------------------------------------------------------
def test_backward_writes_into_the_flat_grad_buffer(device):
    params = make_params(SHAPES, np.float32, device)
    opt = optim.SGD(params, lr=0.1, momentum=0.9)
    (fs,) = opt._flat_sets[0]
    for p, pv in zip(params, fs.param_views):
        assert p.data is pv
    backward(params, grads_for(params, np.random.default_rng(0)))
    for j, p in enumerate(params):
        assert p.grad.data is fs.grad_views[j]
        assert _shares(p.grad.data, fs.grad) and _shares(p.data, fs.param)
    backward(params, grads_for(params, np.random.default_rng(1)))     # accumulates in place
    assert all(p.grad.data is fs.grad_views[j] for j, p in enumerate(params))
    opt.step()
    assert opt._grad_copies_per_step == 0
    assert opt._launches_per_step == 1


def _shares(view, flat):
    if _dev.is_cuda_array(flat):
        lo, hi = flat.data.ptr, flat.data.ptr + flat.nbytes
        return view.size == 0 or lo <= view.data.ptr < hi
    return view.size == 0 or np.shares_memory(view, flat)


def test_user_assigned_grads_are_gathered(device):
    params = make_params(SHAPES, np.float64, device)
    ref_params = clone_params(params)
    opt, ref = optim.Adam(params, lr=0.1), optim.Adam(ref_params, lr=0.1, fused=False)
    rng = np.random.default_rng(3)
    for _ in range(3):
        grads = grads_for(params, rng)
        for p, q, g in zip(params, ref_params, grads):
            p.grad = mdn.tensor(g, device=device)
            q.grad = mdn.tensor(g, device=device)
        opt.step()
        ref.step()
    assert opt._grad_copies_per_step == len(params)
    assert_params_close(params, ref_params, 1e-12)


@pytest.mark.parametrize("set_to_none", [True, False])
def test_zero_grad(set_to_none, device):
    params = make_params(SHAPES, np.float32, device)
    opt = optim.Adam(params)
    (fs,) = opt._flat_sets[0]
    backward(params[:-1], grads_for(params[:-1], np.random.default_rng(0)))
    opt.zero_grad(set_to_none=set_to_none)
    if set_to_none:
        assert all(p.grad is None for p in params)
    else:
        assert params[-1].grad is None        # never had one: stays None, as in PyTorch
        for j, p in enumerate(params[:-1]):
            assert p.grad.data is fs.grad_views[j] and not p.grad.numpy().any()
    backward(params, grads_for(params, np.random.default_rng(1)))   # lands in the flat buffer again
    assert all(p.grad.data is fs.grad_views[j] for j, p in enumerate(params))
    # all grads in the flat buffer: zeroing is one fill of it
    opt.zero_grad(set_to_none=False)
    assert not _dev.to_device(fs.grad, "cpu").any()


def test_shared_params_are_updated_once(device):
    a, b, c = make_params([(3, 3), (3,), (2,)], np.float64, device)
    module1, module2 = [a, b], [a, c]        # `a` is shared, e.g. tied embeddings
    opt = optim.SGD(module1 + module2, lr=0.1, momentum=0.9)
    ref_params = clone_params([a, b, c])
    ref = optim.SGD(ref_params, lr=0.1, momentum=0.9, fused=False)
    assert len(opt.param_groups[0]["params"]) == 3
    train(opt, [a, b, c], 5)
    train(ref, ref_params, 5)
    assert_params_close([a, b, c], ref_params, 1e-12)
    with pytest.raises(ValueError, match="more than one parameter group"):
        optim.SGD([{"params": [a]}, {"params": [a, b]}], lr=0.1)


def test_mixed_dtypes_get_one_flat_set_each(device):
    params = make_params([(5, 4), (3,)], np.float32, device) + make_params([(6,), (2, 2)], np.float64, device, 1)
    params = [params[0], params[2], params[1], params[3]]        # interleaved
    ref_params = clone_params(params)
    opt = optim.Adam(params, lr=1e-2, amsgrad=True)
    ref = optim.Adam(ref_params, lr=1e-2, amsgrad=True, fused=False)
    assert sorted(str(fs.dtype) for fs in opt._flat_sets[0]) == ["float32", "float64"]
    train(opt, params, 20)
    train(ref, ref_params, 20)
    assert opt._launches_per_step == 2
    for p, q in zip(params, ref_params):
        assert p.dtype == q.dtype
        assert rel_diff(p.numpy(), q.numpy()) <= _tol(p.dtype, device)


class ToyModel:
    """Just enough of a Module: parameters() and a PyTorch-style .to() that rebinds each parameter's data."""

    def __init__(self, shapes, device="cpu"):
        self.params = make_params(shapes, np.float32, device)

    def parameters(self):
        return iter(self.params)

    def to(self, device=None, dtype=None):
        for p in self.params:
            p.data = _dev.to_device(p.data, device or p.device, dtype=dtype)
        return self


def test_model_moved_before_building(device):
    model = ToyModel(SHAPES).to(device, dtype=np.float64)
    opt = optim.Adam(model.parameters(), lr=0.1)
    (fs,) = opt._flat_sets[0]
    assert fs.dtype == np.float64 and fs.device == _dev.device(device)
    ref_params = clone_params(model.params)
    ref = optim.Adam(ref_params, lr=0.1, fused=False)
    train(opt, model.params, 5)
    train(ref, ref_params, 5)
    assert_params_close(model.params, ref_params, 1e-12)


def test_rebinding_after_building_regathers_or_raises(device):
    model = ToyModel(SHAPES, device)
    opt = optim.SGD(model.parameters(), lr=1.0)
    (fs,) = opt._flat_sets[0]
    p = model.params[2]
    p.data = _dev.to_device(np.full(p.shape, 5.0, dtype=np.float32), device)     # same kind: re-gathered
    backward(model.params, [np.ones(q.shape) for q in model.params])
    opt.step()
    assert p.data is fs.param_views[2]
    np.testing.assert_array_equal(p.numpy(), np.full(p.shape, 4.0))
    model.to(dtype=np.float64)                                                 # cast after building: error
    backward(model.params, [np.ones(q.shape) for q in model.params])
    with pytest.raises(RuntimeError, match="moved or cast after the optimizer was built"):
        opt.step()


def test_second_fused_optimizer_takes_parameters_over(device):
    params = make_params(SHAPES, np.float32, device)
    first = optim.SGD(params, lr=0.1)
    second = optim.SGD(params, lr=0.1)
    backward(params, grads_for(params, np.random.default_rng(0)))
    second.step()
    with pytest.raises(RuntimeError, match="another fused optimizer"):
        first.step()


# -------------------------------------------------------------------------------------------------------------
# launch counts
# -------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind,kwargs", [CONFIGS[2], CONFIGS[7], CONFIGS[11]], ids=[IDS[2], IDS[7], IDS[11]])
def test_one_update_per_flat_set(kind, kwargs, device):
    params = make_params(SHAPES * 8, np.float32, device)        # 40 tensors
    opt = OPTIMIZERS[kind](params, **kwargs)
    train(opt, params, 2)
    assert opt._launches_per_step == 1


@pytest.mark.cuda
@pytest.mark.parametrize("kind,kwargs", CONFIGS, ids=IDS)
def test_cuda_one_kernel_launch_per_step(kind, kwargs):
    from minidnn.backend.cuda import multi_tensor
    params = make_params(SHAPES * 12, np.float32, "cuda")       # 60 tensors
    opt = OPTIMIZERS[kind](params, **kwargs)
    train(opt, params, 2)
    for skip in ((), (5, 17)):                                # uniform and masked variants
        backward(*zip(*[(p, g) for p, g in zip(params, grads_for(params, np.random.default_rng(9), skip))
                        if g is not None]))
        before = multi_tensor.launch_count()
        opt.step()
        assert multi_tensor.launch_count() - before == 1
        assert opt._launches_per_step == 1 and opt._grad_copies_per_step == 0
        opt.zero_grad()


@pytest.mark.cuda
def test_cuda_step_replays_in_a_graph():
    """Capturable: lr, betas and step counts are read on the device, so a captured step replays correctly."""
    cp = _dev.device("cuda").xp
    params = make_params(SHAPES, np.float32, "cuda")
    ref_params = clone_params(params)
    opt, ref = optim.Adam(params, lr=1e-2), optim.Adam(ref_params, lr=1e-2, fused=False)
    grads = grads_for(params, np.random.default_rng(0))
    backward(params, grads)
    backward(ref_params, grads)
    opt.step()                                   # compiles the kernel and uploads the scalars before capture
    ref.step()
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        opt.step()
        graph = stream.end_capture()
    for _ in range(3):
        graph.launch(stream)
        ref.step()
    stream.synchronize()
    assert_params_close(params, ref_params, 5e-6)
    assert float(opt.state[params[0]]["step"]) == 4


# -------------------------------------------------------------------------------------------------------------
# state_dict
# -------------------------------------------------------------------------------------------------------------
def _snapshot(sd):
    return {"state": {k: {n: _dev.to_device(v, "cpu", copy=True) for n, v in s.items()}
                      for k, s in sd["state"].items()},
            "param_groups": copy.deepcopy(sd["param_groups"])}


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("kind,kwargs", [CONFIGS[4], CONFIGS[9], CONFIGS[11]], ids=[IDS[4], IDS[9], IDS[11]])
def test_state_dict_resume_is_bit_exact(kind, kwargs, fused, device):
    skip_at = lambda step: (1,) if step in (2, 13) else ()   # noqa: E731
    params = make_params(SHAPES, np.float32, device)
    opt = OPTIMIZERS[kind](params, fused=fused, **kwargs)
    train(opt, params, 10, seed=1, skip_at=skip_at)
    saved_opt = _snapshot(opt.state_dict())
    saved_params = [p.numpy().copy() for p in params]
    train(opt, params, 10, seed=2, skip_at=skip_at)

    params2 = [Parameter(mdn.tensor(a, device=device)) for a in saved_params]
    opt2 = OPTIMIZERS[kind](params2, fused=fused, **kwargs)
    flat_before = [fs.param for fs in opt2._flat_sets[0]]
    opt2.load_state_dict(saved_opt)
    assert [fs.param for fs in opt2._flat_sets[0]] == flat_before        # copied into, never rebound
    train(opt2, params2, 10, seed=2, skip_at=skip_at)
    for p, q in zip(params, params2):
        np.testing.assert_array_equal(p.numpy(), q.numpy())


@pytest.mark.parametrize("kind,kwargs", [CONFIGS[1], CONFIGS[7]], ids=[IDS[1], IDS[7]])
def test_state_dict_moves_between_fused_and_unfused(kind, kwargs, device):
    params = make_params(SHAPES, np.float64, device)
    opt = OPTIMIZERS[kind](params, fused=True, **kwargs)
    train(opt, params, 5)
    sd = _snapshot(opt.state_dict())
    assert sorted(sd["state"]) == list(range(len(SHAPES)))
    assert sd["param_groups"][0]["params"] == list(range(len(SHAPES)))
    other = clone_params(params)
    opt_unfused = OPTIMIZERS[kind](other, fused=False, **kwargs)
    opt_unfused.load_state_dict(sd)
    train(opt, params, 5, seed=7)
    train(opt_unfused, other, 5, seed=7)
    assert_params_close(params, other, 1e-12)


def test_load_state_dict_checks_layout():
    params = make_params(SHAPES, np.float32, "cpu")
    opt = optim.Adam(params)
    with pytest.raises(ValueError, match="parameter groups"):
        opt.load_state_dict({"state": {}, "param_groups": []})
    with pytest.raises(ValueError, match="has 1 parameters"):
        opt.load_state_dict({"state": {}, "param_groups": [{"params": [0], "lr": 0.1}]})


def test_param_groups_have_their_own_hyperparameters(device):
    a, b = make_params([(3,), (4,)], np.float64, device)
    opt = optim.SGD([{"params": [a]}, {"params": [b], "lr": 0.5}], lr=0.1, momentum=0.9)
    assert [g["lr"] for g in opt.param_groups] == [0.1, 0.5]
    c = make_params([(2,)], np.float64, device, seed=3)[0]
    opt.add_param_group({"params": c, "momentum": 0.0})
    before = [p.numpy().copy() for p in (a, b, c)]
    backward([a, b, c], [np.ones(3), np.ones(4), np.ones(2)])
    opt.step()
    for p, b0, lr in zip((a, b, c), before, (0.1, 0.5, 0.1)):
        np.testing.assert_allclose(p.numpy(), b0 - lr, rtol=1e-15)
    assert len(opt._flat_sets) == 3 and opt._launches_per_step == 3


def test_closure_is_called_with_grad_enabled():
    (p,) = make_params([(3,)], np.float64, "cpu")
    opt = optim.SGD([p], lr=0.1)

    def closure():
        opt.zero_grad()
        loss = (p * p).sum()
        loss.backward()
        return loss

    with mdn.no_grad():
        loss = opt.step(closure)
    assert float(loss) > 0


@pytest.mark.parametrize("make,message", [
    (lambda ps: optim.SGD(ps, lr=-1), "Invalid learning rate: -1"),
    (lambda ps: optim.SGD(ps, momentum=-0.1), "Invalid momentum value"),
    (lambda ps: optim.SGD(ps, weight_decay=-1), "Invalid weight_decay"),
    (lambda ps: optim.SGD(ps, nesterov=True), "Nesterov momentum requires a momentum and zero dampening"),
    (lambda ps: optim.SGD(ps, momentum=0.9, dampening=0.1, nesterov=True), "zero dampening"),
    (lambda ps: optim.Adam(ps, lr=-0.1), "Invalid learning rate"),
    (lambda ps: optim.Adam(ps, eps=-1e-8), "Invalid epsilon"),
    (lambda ps: optim.Adam(ps, betas=(1.0, 0.999)), "beta parameter at index 0: 1.0"),
    (lambda ps: optim.Adam(ps, betas=(0.9, -0.1)), "beta parameter at index 1"),
    (lambda ps: optim.AdamW(ps, weight_decay=-1), "Invalid weight_decay"),
    (lambda ps: optim.Adam([], lr=0.1), "empty parameter list"),
])
def test_hyperparameters_are_validated(make, message):
    with pytest.raises(ValueError, match=message):
        make(make_params([(2,)], np.float32, "cpu"))


def test_params_must_be_an_ordered_iterable_of_tensors():
    (p,) = make_params([(2,)], np.float32, "cpu")
    with pytest.raises(TypeError, match="iterable of Tensors"):
        optim.SGD(p, lr=0.1)
    with pytest.raises(TypeError, match="ordered collections"):
        optim.SGD({p}, lr=0.1)
    with pytest.raises(TypeError, match="can only optimize Tensors"):
        optim.SGD([np.zeros(2)], lr=0.1)

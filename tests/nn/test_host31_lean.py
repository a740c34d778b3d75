"""Host round 31's cuts (docs/host_overhead.md): the optimizer keeping its parameters' AccumulateGrad nodes
(optim/optimizer.py HOLD_ACCUMULATORS), the settled backwards' results handed to the engine unchecked
(autograd.ExactGrads, nn/_functions/_util.py EXACT_GRADS) and the convolution's leaner fast key and node
(nn/_functions/conv.py LEAN_CONV).  Each switch on and off: the same gradients and values on the CPU, and under
tools/record_launches.py's fake CuPy the same launches a step (ResNet-20, MobileNet-small, LeNet-5; float32,
bfloat16 autocast, channels-last), the same conv nodes, and every unchecked result one the check would have passed
as it is."""
import gc
import pathlib
import textwrap
import weakref

import numpy as np
import pytest

import minidnn as mdn
from minidnn import autograd as AG
from minidnn.nn._functions import _util as U
from minidnn.optim import optimizer as O
from tests.nn._fake_script import FAKE_PROLOGUE, MODEL_STEPS, run_fake_script
from tests.nn.test_conv_seen_apply import _SCRIPT as _CONV_APPLY_SCRIPT

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _switches_restored():
    saved = [(s, s[0]) for s in (O.HOLD_ACCUMULATORS, U.EXACT_GRADS, AG.SLOT_GRAD_AS_IS)]
    yield
    for s, v in saved:
        s[0] = v


# ---- the optimizer keeps the accumulators ---------------------------------------------------------------------
def _model_and_data(seed=0):
    mdn.manual_seed(seed)
    m = mdn.nn.Sequential(mdn.nn.Linear(5, 7), mdn.nn.ReLU(), mdn.nn.Linear(7, 3))
    return m, mdn.randn(4, 5), mdn.tensor(np.array([0, 2, 1, 2]))


def _count_accumulators(monkeypatch):
    made = []
    real = AG.AccumulateGrad.__init__

    def init(self, variable):
        made.append(variable)
        real(self, variable)
    monkeypatch.setattr(AG.AccumulateGrad, "__init__", init)
    return made


@pytest.mark.parametrize("fused", [True, False])
def test_held_accumulators_make_no_node_after_the_first_step_and_the_same_values(monkeypatch, fused):
    made = _count_accumulators(monkeypatch)
    out = {}
    for on in (True, False):
        O.HOLD_ACCUMULATORS[0] = on
        m, x, y = _model_and_data()
        opt = mdn.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, fused=fused)
        per_step = []
        for _ in range(3):
            made.clear()
            loss = mdn.nn.functional.cross_entropy(m(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            del loss                        # (a live loss keeps last step's graph, and its nodes, alive)
            per_step.append(len(made))
        out[on] = per_step, [p.data.copy() for p in m.parameters()]
        assert (opt._held is not None) == on
    assert out[True][0] == [4, 0, 0] and out[False][0] == [4, 4, 4]
    for a, b in zip(out[True][1], out[False][1]):
        assert np.array_equal(a, b)


def test_held_accumulators_make_no_cycle_and_follow_new_groups_and_frozen_parameters():
    O.HOLD_ACCUMULATORS[0] = True
    m, x, y = _model_and_data()
    first, second = list(m.children())[0], list(m.children())[2]
    second.weight.requires_grad_(False)
    opt = mdn.optim.SGD(first.parameters(), lr=0.1)

    def step(m, opt):
        loss = mdn.nn.functional.cross_entropy(m(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    step(m, opt)
    assert [n.variable for n in opt._held] == list(first.parameters())
    opt.add_param_group({"params": [second.bias]})
    assert opt._held is None
    step(m, opt)
    assert [n.variable for n in opt._held] == [*first.parameters(), second.bias]
    second.weight.requires_grad_(True)     # a parameter unfrozen later: its node made each step, as before
    step(m, opt)
    assert second.weight.grad is not None
    refs = [weakref.ref(p) for p in m.parameters()]
    gc.collect()
    gc.disable()
    try:                                    # no reference cycle: the parameters go with the model and optimizer
        del m, opt, first, second
        assert all(r() is None for r in refs)
    finally:
        gc.enable()


def test_held_accumulators_keep_leaf_hooks_running_once_a_step():
    O.HOLD_ACCUMULATORS[0] = True
    m, x, y = _model_and_data()
    calls = []
    w = next(iter(m.parameters()))
    w.register_hook(lambda g: calls.append(1))
    opt = mdn.optim.SGD(m.parameters(), lr=0.1)
    for i in range(3):
        loss = mdn.nn.functional.cross_entropy(m(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        assert len(calls) == i + 1


# ---- ExactGrads ----------------------------------------------------------------------------------------------
class _Broadcasting(AG.Function):
    """A backward returning a (1, 2, 3) gradient for a (2, 3) input: the check sums it to (2, 3), unless marked."""
    mark = False

    @staticmethod
    def forward(ctx, x):
        return x * 1.0

    @staticmethod
    def backward(ctx, g):
        r = (g.unsqueeze(0),)
        return AG.ExactGrads(r) if _Broadcasting.mark else r


def test_exact_grads_skip_only_the_result_check():
    x = mdn.ones(2, 3, requires_grad=True)
    _Broadcasting.apply(x).sum().backward()
    assert x.grad.shape == (2, 3)           # checked: fitted to the input's shape
    got = {}

    def hook(g):
        got["shape"] = tuple(g.shape)
    x2 = mdn.ones(2, 3, requires_grad=True)
    x2.register_hook(hook)
    _Broadcasting.mark = True
    try:                                    # unchecked: the marked (1, 2, 3) result reaches the leaf as it is
        _Broadcasting.apply(x2).sum().backward()
    finally:
        _Broadcasting.mark = False
    assert got["shape"] == (1, 2, 3) and x2.grad.shape == (1, 2, 3)


def test_exact_switch_marks_only_when_on():
    t = (None, 1)
    U.EXACT_GRADS[0] = True
    assert type(U.exact(t)) is AG.ExactGrads and U.exact(t) == t
    U.EXACT_GRADS[0] = False
    assert U.exact(t) is t


# ---- a slot's gradient kept as .grad ----------------------------------------------------------------------------
class _IntoSlot(AG.Function):
    """y = 2 x; backward writes dx into x's flat-buffer slot (a gradient destination, as the GPU kernels do)."""
    keep = None

    @staticmethod
    def forward(ctx, x):
        return x * 2.0

    @staticmethod
    def backward(ctx, g):
        from minidnn._grad_dest import destination
        d = destination(ctx, 0)
        if d is None:
            return g * 2.0
        d[0][...] = g.data * 2.0
        out = mdn.Tensor._from_array(d[0])
        if _IntoSlot.keep is not None:
            _IntoSlot.keep.append(out)
        return out


@pytest.mark.parametrize("case", ["plain", "hooked", "kept", "parameter_subclass"])
def test_a_slot_gradient_only_the_engine_holds_becomes_grad(case):
    got = {}
    for on in (True, False):
        AG.SLOT_GRAD_AS_IS[0] = on
        mdn.manual_seed(0)
        if case == "parameter_subclass":
            class OwnWrap(mdn.nn.Parameter):
                def _wrap_like(self, data):
                    return mdn.Tensor._from_array(data)
            p = OwnWrap(mdn.randn(3))
        else:
            p = mdn.nn.Parameter(mdn.randn(3))
        opt = mdn.optim.SGD([p], lr=0.1)         # fused: p's gradient slot in the flat buffer
        seen = []
        if case == "hooked":
            p.register_hook(lambda g: seen.append(g))
        _IntoSlot.keep = [] if case == "kept" else None
        returned = []
        real = _IntoSlot.backward

        def spy(ctx, g):
            r = real(ctx, g)
            returned.append(weakref.ref(r))     # (a weak reference: the engine stays its sole holder)
            return r
        _IntoSlot.backward = staticmethod(spy)
        try:
            _IntoSlot.apply(p).sum().backward()
        finally:
            _IntoSlot.backward = staticmethod(real)
            _IntoSlot.keep = None
        assert p.grad.data is p._grad_storage
        got[on] = (p.grad is returned[0](), p.grad.data.copy(), type(p.grad))
        opt.step()
    assert got[True][0] is (case == "plain") and got[False][0] is False
    assert np.array_equal(got[True][1], got[False][1]) and got[True][2] is got[False][2] is mdn.Tensor


# ---- plain_settings --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("vals", [(1, 1, 1), ((1, 2), (0, 0), (1, 1)), ((1,), 2, (3, 3, 3)), ((), 1, 1),
                                  ((True, 1), 1, 1), (1, (1.0, 1), 1), (1, 1, [1, 1]), (True, 1, 1), (1, None, 1),
                                  (1, 1, "same"), (1, ((1, 1),), 1), (np.int64(1), 1, 1), (False, 1, 1),
                                  (1, 1, object())])
def test_plain_settings_agrees_with_plain_setting(vals):
    want = all(U.plain_setting(v) is not None for v in vals)
    for _ in range(2):                      # the second time through the identity table
        assert U.plain_settings(*vals) is want


def test_plain_settings_tells_equal_tuples_apart_by_their_elements():
    ints = (1, 1)
    assert U.plain_settings(ints, 0, 1)
    assert not U.plain_settings((True, 1), 0, 1)      # equal to (1, 1) and of equal hash: not plain
    assert not U.plain_settings((1.0, 1), 0, 1)


# ---- the fake GPU: conv nodes and launch records ---------------------------------------------------------------
def test_lean_conv_node_launches_backward_and_errors_as_apply_seen():
    script = _CONV_APPLY_SCRIPT.replace("C.SEEN_APPLY[0] = on", "C.LEAN_CONV[0] = on")
    assert script.count("C.LEAN_CONV[0] = on") == 2
    out = run_fake_script(script, ROOT)
    for name, (on, off) in out["res"].items():
        assert on == off, name
        assert on["applies"] == (1 if name == "anomaly" else 0), name
    assert out["res"]["no_bias"][0]["node"]["n"] == 3 and out["res"]["no_bias"][0]["bwd_launches"]
    assert out["errs"]["True"] == out["errs"]["False"]


_STEPS = FAKE_PROLOGUE + MODEL_STEPS + textwrap.dedent("""
    from minidnn.nn._functions import _util as U, conv as C
    from minidnn.optim import optimizer as O
    from minidnn.backend import handle as HD
    SW = {{"hold": O.HOLD_ACCUMULATORS, "exact": U.EXACT_GRADS, "lean_conv": C.LEAN_CONV,
          "slot": AG.SLOT_GRAD_AS_IS, "by_gpu": HD.BY_GPU}}
    checked = collections.Counter()
    bad = []
    real_bw = AG.FunctionCtx.backward
    def backward(self, *grads):
        r = real_bw(self, *grads)
        if type(r) is AG.ExactGrads:        # what the check would have done: keep every result as it is
            checked[self.name()] += 1
            for g, meta, e in zip(r, self._input_meta, self.next_edges):
                if g is None:
                    continue
                if meta is None and e is not None or meta is not None and (
                        not isinstance(g, mdn.Tensor) or tuple(g.data.shape) != tuple(meta[0])):
                    bad.append(self.name())
        return r
    AG.FunctionCtx.backward = backward
    out = {{}}
    for name, amp, cl in (("resnet20", False, False), ("mobilenet", False, False), ("lenet5", False, False),
                          ("resnet20", True, False), ("mobilenet", True, True), ("resnet20", False, True)):
        runs = {{}}
        for on in (True, False):
            for s in SW.values():
                s[0] = on
            C._FAST_CONV.clear()
            for n_fwd in train_steps(name, amp=amp, cl=cl, batch=4, steps=4):
                pass
            runs[on] = json.dumps([list(r) for r in recs])
        out[f"{{name}} amp={{amp}} cl={{cl}}"] = [runs[True] == runs[False], len(json.loads(runs[True]))]
    print("RESULT" + json.dumps(dict(out=out, checked=dict(checked), bad=bad)))
""")


def test_model_steps_record_the_same_launches_and_unchecked_results_fit():
    got = run_fake_script(_STEPS, ROOT)
    for name, (same, n) in got["out"].items():
        assert same and n > 20, name
    assert got["bad"] == []
    checked = got["checked"]
    assert checked.get("ConvForwardBackward", 0) > 50 and checked.get("BatchNormReLUBackward", 0) > 20, checked
    assert checked.get("BatchNormAddReLUBackward", 0) > 10, checked


_HANDLES = FAKE_PROLOGUE + textwrap.dedent("""
    import threading
    import minidnn as mdn
    from minidnn.backend import devices as D, handle as H
    D.cuda_device_count = lambda: 2
    a0 = mdn.randn(3).to("cuda").data
    a1 = mdn.randn(3).to("cuda").data
    a1.data.device_id = 1                   # the fake's pointer object: this array on GPU 1
    out = {{}}
    for on in (True, False):
        H.BY_GPU[0] = on
        mine = [H.configured_default_handle(a) for a in (a0, a1, np.zeros(2))]
        want = [H.get_default_handle(D.device_of(a)) for a in (a0, a1, np.zeros(2))]
        other = []
        t = threading.Thread(target=lambda: other.append(H.configured_default_handle(a0)))
        t.start(); t.join()
        mdn.backends.cudnn.deterministic = True     # the flags reach the handle either way
        flag = H.configured_default_handle(a1).deterministic
        mdn.backends.cudnn.deterministic = None
        out[str(on)] = [[m is w for m, w in zip(mine, want)], [str(h.device) for h in mine],
                        other[0] is not mine[0] and str(other[0].device), flag, [id(h) for h in mine]]
    print("RESULT" + json.dumps(out))
""")


def test_handles_by_gpu_number_are_the_default_handles():
    out = run_fake_script(_HANDLES, ROOT)
    on, off = out["True"], out["False"]
    assert on[0] == off[0] == [True, True, True]
    assert on[1] == off[1] == ["cuda:0", "cuda:1", "cpu"]
    assert on[2] == off[2] == "cuda:0" and on[3] is off[3] is True and on[4] == off[4]

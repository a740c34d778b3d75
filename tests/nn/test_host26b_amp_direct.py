"""Host round 26b (docs/host_overhead.md): a lowered conv / linear call in an autocast region whose input is already
in the region's dtype and whose float32 weight / bias are kept flat-copy direct weights skips ``cast_inputs``
(round 26b's ``_amp_state._lower_direct``; since round 30 the one shortcut, ``autocast_mode._lower_ready``, with
``_flat_direct`` and the parameters' records; switch ``_amp_state.LOWER_READY``, also named LOWER_DIRECT_FAST).

On the CPU, the GPU path under tools/record_launches.py's fake CuPy in a subprocess: every scenario runs from the
same seed with the switch off and on, and what each lowered call hands its function (every argument: which object
it is -- the parameter, the kept copy's direct weight, a cast node's output, a fresh one -- its dtype, shape,
strides, data, grad_fn and the variable it accumulates into), the cast cache after each call and region, the kept
copies made, the launches of each step and the gradients' layouts must be the same; with the switch on the fast
path must serve the plain calls (the stem's fp32 input and a call without a bias among them) and decline (nothing
done) the others: keyword arguments, a float16 / float64 / integer weight, a tensor among the settings, a disabled
inner region, cache_enabled=False and CPU tensors; a weight used twice in a region, changed in place inside it, with
no optimizer (no flat set), the kept copy or direct weights switched off or under no_grad is cast as cast_inputs
casts it."""
import pathlib
import textwrap

import pytest

from tests.nn._fake_script import FAKE_PROLOGUE, run_fake_script

ROOT = pathlib.Path(__file__).resolve().parents[2]

_SCRIPT = FAKE_PROLOGUE + textwrap.dedent("""
    warnings.filterwarnings("ignore")
    import gc, types
    type(fakecp.empty((1,)).data).copy_from_device_async = lambda self, src, n, stream=None: None
    fakecp.cuda.Stream = types.SimpleNamespace
    import minidnn as mdn
    import minidnn.models as M
    from minidnn import _amp_state as S
    from minidnn.amp import autocast_mode as AM
    from minidnn.nn import functional as F
    import minidnn.nn._functions.conv as C
    import minidnn.nn._functions.linear as LN

    fast_calls = collections.Counter()
    real_fast = AM._lower_ready
    def counted_fast(args):
        r = real_fast(args)
        fast_calls["taken" if r is not None else "declined"] += 1
        return r
    S.set_lower_ready(counted_fast)
    real_direct, real_record = AM._flat_direct, AM._ready_weight
    def counted_direct(t, dtype, s):        # a kept direct weight handed out first (its record made)
        r = real_direct(t, dtype, s)
        fast_calls["kept" if r is not None else "not kept"] += 1
        return r
    def counted_record(t, s, low):          # ... and by its record after
        r = real_record(t, s, low)
        fast_calls["kept" if r is not None else "no record"] += 1
        return r
    AM._flat_direct, AM._ready_weight = counted_direct, counted_record

    import weakref
    keep = []
    labels = {{}}
    n_labels = [0]
    def label(o):
        # weakly held (a kept copy's busy test counts references: holding its views would make it busy), so a label
        # is a new one where an id was reused
        if o is None:
            return None
        e = labels.get(id(o))
        if e is None or e[0]() is not o:
            n_labels[0] += 1
            e = labels[id(o)] = (weakref.ref(o), "o%d" % n_labels[0])
        return e[1]

    def fp(a):
        if not isinstance(a, mdn.Tensor):
            return repr(a)
        g = a.grad_fn
        return [label(a), str(a.dtype), list(a.shape), list(a.data.strides), label(a.data), type(g).__name__,
                label(getattr(g, "variable", None)), a.requires_grad, a._version]

    def cache_fp():
        s = S._state()
        return sorted([label(e[0]), e[1], fp(e[2]), label(e[3])] for e in s["cache"].values())

    log = []
    def spy_on(f):
        cell = [c for n, c in zip(f.__code__.co_freevars, f.__closure__) if n == "fn"][0]
        inner = cell.cell_contents
        def spy(*a, **k):
            log.append([inner.__name__, [fp(v) for v in a], sorted((n, fp(v)) for n, v in k.items()),
                        cache_fp()])
            return inner(*a, **k)
        cell.cell_contents = spy
    spy_on(F.conv2d); spy_on(F.linear)

    made = []
    init = AM._LowCopy.__init__
    def counting(self, fs, dtype):
        made.append(label(self))
        init(self, fs, dtype)
    AM._LowCopy.__init__ = counting

    def fresh():
        for t in (AM._LOW_COPIES, AM._READY):
            t.clear()
        S._state()["flat_used"] = {{}}
        labels.clear(); n_labels[0] = 0; log.clear(); made.clear(); del recs[:]
        gc.collect()

    def grads(m):
        return [[n, None if p.grad is None else [str(p.grad.dtype), list(p.grad.data.strides)]]
                for n, p in m.named_parameters()]

    def model_steps(name, dtype, cl):
        ctor, shape = {{"resnet20": ("resnet20(num_classes=10)", (3, 8, 8)),
                        "mobilenet": ("MobileNetSmall(num_classes=10, in_channels=3)", (3, 8, 8)),
                        "lenet5": ("LeNet5(num_classes=10, in_channels=1, input_size=32)", (1, 32, 32))}}[name]
        mdn.manual_seed(0)
        m = eval(ctor, vars(M)).to("cuda")
        if cl:
            m.to(memory_format=mdn.channels_last)
        opt = mdn.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
        x = mdn.randn(2, *shape).to("cuda")
        x = x.to(memory_format=mdn.channels_last) if cl else x
        y = mdn.randint(0, 10, (2,)).to("cuda")
        out = []
        for i in range(STEPS):
            del recs[:]
            with mdn.autocast("cuda", dtype=getattr(mdn, dtype)):
                loss = F.cross_entropy(m(x), y)
                out.append(["region", cache_fp()])
            opt.zero_grad()
            loss.backward()
            opt.step()
            out.append(["launches", [r[0] for r in recs], grads(m), cache_fp()])
            out.append(["fast so far", dict(fast_calls)] if S.LOWER_READY[0] else ["off"])
        return out

    def edge(case):
        # the case's call only in the last step: the kept copy and its direct weights have served the steps before
        mdn.manual_seed(1)
        conv = mdn.nn.Conv2d(4, 6, 3, padding=1, bias=True).to("cuda")
        lin = mdn.nn.Linear(6, 3).to("cuda")
        params = list(conv.parameters()) + list(lin.parameters())
        if case != "no_optimizer":
            opt = mdn.optim.SGD(params, lr=0.1, momentum=0.9, fused=True)
        x = mdn.randn(2, 4, 5, 5).to("cuda")
        bf = mdn.bfloat16
        out = []
        for step in range(STEPS):
            name = case if step == STEPS - 1 or case == "no_optimizer" else "plain"
            kw = dict(cache_enabled=False) if name == "cache_off" else {{}}
            AM.KEEP_LOW_COPY[0] = name != "keep_off"
            S.DIRECT_WEIGHTS[0] = name != "direct_off"
            if name == "rebound":
                lin.bias.data = lin.bias.data.copy()        # no longer its flat slot's view
            with mdn.autocast("cuda", dtype=bf, **kw):
                xb = x.to(dtype=bf) if name != "fp32_input" else x
                F.conv2d(xb, conv.weight, conv.bias, 1, 1, 1, 1)        # the region's first: the flat refill
                if name == "kwargs":
                    y = F.conv2d(xb, conv.weight, bias=conv.bias, padding=1)
                elif name == "fp16_weight":
                    y = F.conv2d(xb, conv.weight.detach().to(dtype=mdn.float16), None, 1, 1)
                elif name == "f64_weight":
                    y = F.conv2d(xb, conv.weight.detach().to(dtype=mdn.float64), None, 1, 1)
                elif name in ("int_weight", "tensor_setting"):
                    try:
                        if name == "int_weight":
                            F.conv2d(xb, conv.weight.detach().to(dtype=mdn.int32), None, 1, 1)
                        else:
                            F.conv2d(xb, conv.weight, None, 1, 1, 1, mdn.tensor(1.0).to("cuda"))
                    except Exception as e:
                        out.append(type(e).__name__)
                    y = F.conv2d(xb, conv.weight, conv.bias, 1, 1)
                elif name == "inner_disabled":
                    with mdn.autocast("cuda", enabled=False):
                        y = F.conv2d(xb.float(), conv.weight, conv.bias, 1, 1)
                elif name == "cpu":
                    w = conv.weight.detach().cpu().requires_grad_()
                    with mdn.autocast("cpu", dtype=bf):
                        y = F.conv2d(xb.cpu(), w, None, 1, 1).to("cuda")
                else:
                    y = F.conv2d(xb, conv.weight, conv.bias, 1, 1)      # a cache hit
                if name == "inplace":
                    with mdn.no_grad():
                        lin.weight.mul_(1.0)        # a new version since the refill
                if name == "matmul_first":          # a cast node for the weight in the cache before the linear
                    mdn.matmul(mdn.ones(2, 3).to("cuda").to(dtype=bf), lin.weight)
                feat = y.mean(dim=(2, 3)).to(dtype=y.dtype)
                if name == "no_grad":
                    with mdn.no_grad():
                        h = F.linear(feat, lin.weight, lin.bias)
                elif name == "inner_cache_off":        # the outer region's kept copy is refilled: not used here
                    with mdn.autocast("cuda", dtype=bf, cache_enabled=False):
                        h = F.linear(feat, lin.weight, lin.bias)
                else:
                    h = F.linear(feat, lin.weight, lin.bias)
                h2 = F.linear(feat, lin.weight)     # the weight used twice
                loss = (h.float().sum() + h2.float().sum())
            AM.KEEP_LOW_COPY[0] = True
            S.DIRECT_WEIGHTS[0] = True
            if case != "no_optimizer":
                opt.zero_grad()
            for p in params:
                p.grad = None
            loss.backward()
            if case != "no_optimizer":
                opt.step()
            out.append([[p.grad is not None and str(p.grad.dtype) for p in params], cache_fp(),
                        [r[0] for r in recs]])
            del recs[:]
        return out

    STEPS = 4       # the first region casts each weight alone, the second makes the kept copy: then it is reused
    result = {{}}
    for key in {cases!r}:
        per = []
        for on in (None, False, True):      # (a warm-up first: algorithm caches settled by the first calls)
            S.LOWER_READY[0] = bool(on)
            fresh(); fast_calls.clear()
            if key.startswith("edge:"):
                o = edge(key[5:])
            else:
                name, dtype, cl = key.split(":")
                o = model_steps(name, dtype, cl == "1")
            per.append(dict(out=o, log=list(log), made=list(made), fast=dict(fast_calls)))
            del o
        result[key] = per[1:]
    print("RESULT" + json.dumps(result))
""")

MODELS = [f"{m}:{d}:{c}" for m in ("resnet20", "mobilenet", "lenet5") for d in ("bfloat16", "float16")
          for c in ("0", "1")]
EDGES = ["plain", "kwargs", "inplace", "fp16_weight", "f64_weight", "int_weight", "tensor_setting", "no_optimizer",
         "keep_off", "direct_off", "no_grad", "inner_disabled", "cpu", "fp32_input", "cache_off", "rebound",
         "matmul_first", "inner_cache_off"]
STEPS = 4


def _run(cases):
    return run_fake_script(_SCRIPT.replace("{cases!r}", repr(cases)), ROOT)


@pytest.fixture(scope="module")
def models():
    return _run(MODELS)


@pytest.fixture(scope="module")
def edges():
    return _run(["edge:" + e for e in EDGES])


@pytest.mark.parametrize("case", MODELS)
def test_model_steps_same_on_and_off(models, case):
    off, on = models[case]
    assert off["fast"] == {}                   # off: never asked
    assert [o for o in on["out"] if o[0] != "fast so far"] == [o for o in off["out"] if o[0] != "off"]
    # (cache after each region and step, launches, gradient layouts)
    assert on["log"] == off["log"]             # every lowered call's arguments, in order, and the cache then
    assert on["made"] == off["made"]           # the kept copies made
    n = len(on["log"]) // 4         # conv and linear calls a step
    # every call takes the fast path (the stem's fp32 input cast there too); from the third step on, every weight
    # but the region's first (which refills the kept copy) is the kept direct weight: handed out by _flat_direct in
    # the third step, by its record in the fourth
    f = on["fast"]
    assert f["taken"] == 4 * n and "declined" not in f, f
    assert f["kept"] >= 2 * (n - 1) and f["no record"] > 0, f


@pytest.mark.parametrize("case", EDGES)
def test_edge_cases_same_on_and_off(edges, case):
    off, on = edges["edge:" + case]
    assert on["out"] == off["out"]
    assert on["log"] == off["log"]
    assert on["made"] == off["made"]
    f = on["fast"]
    # the plain steps before the case's: each of the 4 calls taken, the linear's weight and bias the kept ones from
    # the third step on (the second linear's weight: a cache hit, through _cast)
    assert f.get("taken", 0) >= 4 * (STEPS - 1) or case == "no_optimizer", f
    assert f.get("kept", 0) >= 2 or case in ("no_optimizer",), f

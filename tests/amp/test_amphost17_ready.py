"""Host round 29 (docs/host_overhead.md): a settled autocast step's lowered conv / linear calls in one frame by
per-parameter records (``autocast_mode._lower_ready`` / ``_ready_weight``, switch ``_amp_state.LOWER_READY``) and the
region's bookkeeping in C-level maps (switch ``_amp_state.REGION_LEAN``: the region end's flat-buffer count, the kept
copy's busy test, the versions list).

On the CPU, the GPU path under tools/record_launches.py's fake CuPy in a subprocess.  Each scenario runs from the
same seed in three configurations -- cast_inputs alone (both switches off), REGION_LEAN alone, and both on (the
default; round 30 removed round 26b's ``_lower_direct``, the fourth) -- and what each lowered call hands its function
(every argument: which object it is -- the parameter, the kept copy's direct weight, a cast node's output, a fresh
one -- its dtype, strides, data, grad_fn and the variable it accumulates into), the cast cache after each call and
region, the flat-buffer counts a region leaves (``flat_used``), the kept copies made, each step's launches, the
gradients' dtypes / layouts / grad_fn and any error must be the same.  With both on, the records must serve every
call of a settled step.  Then each of 16 mutations of the new code (a test dropped, a threshold moved, a cast
skipped) must change what some scenario gives."""
import json
import pathlib
import subprocess
import sys
import textwrap

import pytest

from tests.nn._fake_script import FAKE_PROLOGUE

ROOT = pathlib.Path(__file__).resolve().parents[2]

_BODY = textwrap.dedent("""
    warnings.filterwarnings("ignore")
    import gc, inspect, textwrap, types, weakref
    type(fakecp.empty((1,)).data).copy_from_device_async = lambda self, src, n, stream=None: None
    fakecp.cuda.Stream = types.SimpleNamespace
    import minidnn as mdn
    import minidnn.models as M
    from minidnn import _amp_state as S
    from minidnn.amp import autocast_mode as AM
    from minidnn.nn import functional as F

    counts = collections.Counter()

    def install_counters():
        real_ready = AM._lower_ready
        def ready(args):
            r = real_ready(args)
            counts["ready" if r is not None else "ready declined"] += 1
            return r
        S.set_lower_ready(ready)
        real_weight = AM._ready_weight
        def weight(t, s, low):
            r = real_weight(t, s, low)
            counts["record" if r is not None else "no record"] += 1
            return r
        AM._ready_weight = weight
        return real_ready, real_weight

    labels = {}
    n_labels = [0]
    def label(o):
        # weakly held (the kept copy's busy test counts references), a new label where an id was reused
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

    def used_fp():
        return sorted([label(r()), n] for r, n in S._state()["flat_used"].values())

    log = []
    def spy_on(f):
        cell = [c for n, c in zip(f.__code__.co_freevars, f.__closure__) if n == "fn"][0]
        inner = cell.cell_contents
        def spy(*a, **k):
            log.append([inner.__name__, [fp(v) for v in a], sorted((n, fp(v)) for n, v in k.items()), cache_fp()])
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
        AM._LOW_COPIES.clear()
        AM._READY.clear()
        S._state()["flat_used"] = {}
        labels.clear(); n_labels[0] = 0; log.clear(); made.clear(); del recs[:]
        counts.clear()
        gc.collect()

    def grads(params):
        return [None if p.grad is None else [str(p.grad.dtype), list(p.grad.data.strides),
                                               type(p.grad.grad_fn).__name__] for p in params]

    CONFIGS = {"cast_inputs": (False, False), "lean": (False, True), "ready": (True, True)}

    def configure(name):
        S.LOWER_READY[0], S.REGION_LEAN[0] = CONFIGS[name]

    def model_steps(name, dtype, cl):
        ctor, shape = {"resnet20": ("resnet20(num_classes=10)", (3, 8, 8)),
                       "mobilenet": ("MobileNetSmall(num_classes=10, in_channels=3)", (3, 8, 8)),
                       "lenet5": ("LeNet5(num_classes=10, in_channels=1, input_size=32)", (1, 32, 32))}[name]
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
            out.append(["used", used_fp()])
            opt.zero_grad()
            loss.backward()
            opt.step()
            out.append(["launches", [r[0] for r in recs], grads(list(m.parameters())), cache_fp()])
            out.append(["counts", dict(counts)])
        return out

    def edge(case):
        # the case from the last step (or from STEPS - 2 where named): the kept copy and the records have served
        # the steps before
        mdn.manual_seed(1)
        conv = mdn.nn.Conv2d(4, 6, 3, padding=1, bias=True).to("cuda")
        conv2 = mdn.nn.Conv2d(6, 6, 3, padding=1, bias=False).to("cuda")
        lin = mdn.nn.Linear(6, 3).to("cuda")
        params = list(conv.parameters()) + list(conv2.parameters()) + list(lin.parameters())
        sgd = lambda ps: mdn.optim.SGD(ps, lr=0.1, momentum=0.9, fused=True)
        opts = [sgd(list(conv.parameters())), sgd(list(conv2.parameters()) + list(lin.parameters()))] \\
            if case == "two_optimizers" else [sgd(params)]
        x = mdn.randn(2, 4, 5, 5).to("cuda")
        bf, f16 = mdn.bfloat16, mdn.float16
        out = []
        held = []
        for step in range(STEPS):
            early = case in ("graph_held", "sparse_regions")
            name = case if step == STEPS - 1 or (early and step >= STEPS - 2) else "plain"
            kw = dict(cache_enabled=False) if name == "cache_off" else {}
            S.DIRECT_WEIGHTS[0] = name != "direct_off"
            AM.KEEP_LOW_COPY[0] = name != "keep_off"
            if name == "rebound":
                lin.weight.data = lin.weight.data.copy()        # no longer its flat slot's view
            if name == "requires_grad_off":
                conv2.weight.requires_grad_(False)
            if name == "new_optimizer":
                opts = [sgd(params)]                            # re-registered, bound to new views
            if name == "optimizer_deleted":
                opts, opt = [], None
                gc.collect()
                out.append(["kept copies left", len(AM._LOW_COPIES)])
                counts["records left"] = len(AM._READY)
            try:
                with mdn.autocast("cuda", dtype=bf, **kw):
                    xb = x if name == "fp32_input" else x.to(dtype=mdn.int32 if name == "int_input" else bf)
                    if name == "kwargs":
                        h = F.conv2d(xb, conv.weight, bias=conv.bias, padding=1)
                    elif name == "bias_low":
                        h = F.conv2d(xb, conv.weight, conv.bias.detach().to(dtype=bf), 1, 1, 1, 1)
                    elif name == "int_weight":
                        h = F.conv2d(xb, conv.weight.detach().to(dtype=mdn.int32), None, 1, 1, 1, 1)
                    elif name == "tensor_setting":
                        h = F.conv2d(xb, conv.weight, conv.bias, 1, 1, 1, mdn.tensor(1.0).to("cuda"))
                    elif name == "sparse_regions":
                        h = None
                    else:
                        h = conv(xb)                # the region's first: the flat refill
                    if name == "inplace_before":
                        with mdn.no_grad():
                            conv2.weight.mul_(1.0)      # a new version since the refill, before its first use
                    if h is not None:
                        if name == "no_grad_call":
                            with mdn.no_grad():
                                h = conv2(h)
                        elif name == "nested_same":
                            with mdn.autocast("cuda", dtype=bf):
                                h = conv2(h)
                        elif name == "nested_fp16":
                            with mdn.autocast("cuda", dtype=f16):
                                h = conv2(h.to(dtype=f16)).to(dtype=bf)
                        elif name == "nested_cache_off":
                            with mdn.autocast("cuda", dtype=bf, cache_enabled=False):
                                h = conv2(h)
                        elif name == "nested_disabled":
                            with mdn.autocast("cuda", enabled=False):
                                h = conv2(h.float()).to(dtype=bf)
                        elif name == "suspended":
                            with S.suspended():
                                h = conv2(h)
                        elif name == "two_args":        # (x, weight) alone: cast_inputs hands back two args
                            h = F.conv2d(h, conv2.weight)
                        else:
                            h = conv2(h)
                        if name == "inplace_after":
                            with mdn.no_grad():
                                conv2.weight.mul_(1.0)  # the cached cast is stale now
                        if name in ("twice", "inplace_after"):
                            h = conv2(h)
                        feat = h.mean(dim=(2, 3)).to(dtype=h.dtype)
                    else:
                        feat = mdn.ones(2, 6).to("cuda").to(dtype=bf)
                    if name == "matmul_first":          # a cast node for the weight in the cache before the linear
                        mdn.matmul(mdn.ones(2, 3).to("cuda").to(dtype=bf), lin.weight)
                    o = F.linear(feat, lin.weight) if name == "two_args" else lin(feat)
                    loss = o.float().sum()
                    out.append(["region", cache_fp()])
            except Exception as e:
                out.append(["error", type(e).__name__, str(e)[:120]])
                loss = None
            out.append(["used", used_fp(), "made", list(made)])
            S.DIRECT_WEIGHTS[0] = True
            AM.KEEP_LOW_COPY[0] = True
            if name == "requires_grad_off":
                conv2.weight.requires_grad_(True)
            for p in params:
                p.grad = None
            if loss is not None and name == "graph_held":
                held.append(loss)           # the graph keeps the kept weights: the next refill is a new copy
            elif loss is not None:
                loss.backward(create_graph=name == "create_graph")
                for opt in opts:
                    opt.step()
            out.append([grads(params), cache_fp(), [r[0] for r in recs]])
            del recs[:]
        return out

    def run(key, config):
        configure(config)
        fresh()
        if key.startswith("edge:"):
            o = edge(key[5:])
        else:
            name, dtype, cl = key.split(":")
            o = model_steps(name, dtype, cl == "1")
        return dict(out=o, log=list(log), made=list(made), counts=dict(counts))

    STEPS = 4
    result = {}
    mode = MODE
    if mode == "same":
        install_counters()
        for key in CASES:
            run(key, "ready")       # (a warm-up first: the algorithm caches settle)
            for config in CONFIGS:
                result.setdefault(key, {})[config] = run(key, config)
    else:       # mutations: (function, old text, new text, cases): each case with the mutation against cast_inputs
        originals = {}
        for name, obj in (("_ready_weight", AM), ("_lower_ready", AM), ("busy", AM._LowCopy),
                          ("_end_of_outermost_region", S)):
            originals[name] = getattr(obj, name)
        keys = sorted({k for m in MUTATIONS for k in m[3]})
        for key in keys:                    # warm-up, then the control: unmutated, the scenarios give the same
            run(key, "ready")
        for key in keys:
            base, got = run(key, "cast_inputs"), run(key, "ready")
            result.setdefault("control", {})[key] = all(got[k] == base[k] for k in ("log", "made")) and \
                [o for o in got["out"] if o[0] != "counts"] == [o for o in base["out"] if o[0] != "counts"]
        for fname, old, new, cases in MUTATIONS:
            owner = {"_end_of_outermost_region": S, "busy": AM._LowCopy}.get(fname, AM)
            src = textwrap.dedent(inspect.getsource(originals[fname]))
            assert old in src, (fname, old)
            ns = dict(vars(S) if owner is S else vars(AM))
            exec(compile(src.replace(old, new), "<mutant>", "exec"), ns)
            for key in cases:
                base = run(key, "cast_inputs")
                setattr(owner, fname, ns[fname])
                if fname == "_lower_ready":
                    S.set_lower_ready(ns[fname])
                try:
                    mutant = run(key, "ready")
                except Exception as e:
                    mutant = dict(error=type(e).__name__)
                setattr(owner, fname, originals[fname])
                S.set_lower_ready(originals["_lower_ready"])
                same = all(mutant.get(k) == base[k] for k in ("log", "made")) and \
                    [o for o in mutant.get("out", []) if o[0] != "counts"] == \
                    [o for o in base["out"] if o[0] != "counts"]
                result.setdefault(fname + ": " + old.strip(), {})[key] = same
        configure("ready")
    print("RESULT" + json.dumps(result))
""")

MODELS = [f"{m}:{d}:{c}" for m in ("resnet20", "mobilenet", "lenet5") for d in ("bfloat16", "float16")
          for c in ("0", "1")]
EDGES = ["plain", "fp32_input", "int_input", "kwargs", "bias_low", "int_weight", "tensor_setting", "inplace_before",
         "inplace_after", "twice", "no_grad_call", "nested_same", "nested_fp16", "nested_cache_off",
         "nested_disabled", "suspended", "cache_off", "requires_grad_off", "rebound", "new_optimizer",
         "optimizer_deleted", "graph_held", "sparse_regions", "two_optimizers", "direct_off", "keep_off",
         "matmul_first", "create_graph", "two_args"]
# (function, the text replaced, its replacement, the scenarios of which at least one must change)
MUTATIONS = [
    ("_ready_weight", "flat is None or ", "", ["edge:sparse_regions"]),
    ("_ready_weight", "flat[3] is not kept or ", "", ["edge:keep_off", "edge:graph_held"]),
    ("_ready_weight", "t._version != flat[2][j] or ", "", ["edge:inplace_before"]),
    ("_ready_weight", " or t.data is not view", "", ["edge:rebound", "edge:new_optimizer"]),
    ("_ready_weight", "or (low is not dtype and low != dtype) ", "", ["edge:nested_fp16"]),
    ("_ready_weight", "or key in cache ", "", ["edge:matmul_first", "edge:twice"]),
    ("_ready_weight", " or not t.requires_grad", "", ["edge:requires_grad_off"]),
    ("_ready_weight", "cache[key] = (t, t._version, w, flat[0])", "pass", ["edge:twice"]),
    ("_lower_ready", "hot = DIRECT[0] and _grad_state.grad_enabled", "hot = True",
     ["edge:no_grad_call", "edge:direct_off"]),
    ("_lower_ready", "if isinstance(a, Tensor):", "if False:", ["edge:tensor_setting"]),
    ("_lower_ready", "if xt != _FLOAT32:", "if False:", ["edge:int_input"]),
    ("_lower_ready", "wd is not low and wd != low and wd != _FLOAT32", "False", ["edge:int_weight"]),
    ("_lower_ready", "x = _amp_state._cast(x, low, s, False)", "pass", ["edge:fp32_input"]),
    ("_lower_ready", "return None if r is None else r[:2]", "return r", ["edge:two_args"]),
    ("busy", "> _ITEM_REFS or", "> _ITEM_REFS + 1 or", ["edge:graph_held"]),
    ("_end_of_outermost_region", "if entry[3] is not fs:", "if False:", ["edge:two_optimizers"]),
]


def _run(mode, cases):
    body = f"MODE = {mode!r}\nCASES = {cases!r}\nMUTATIONS = {MUTATIONS!r}\n" + _BODY
    script = FAKE_PROLOGUE.format(root=str(ROOT)) + body
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=900, cwd=str(ROOT))
    assert r.returncode == 0, r.stderr[-3000:]
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT")][0]
    return json.loads(line[len("RESULT"):])


@pytest.fixture(scope="module")
def models():
    return _run("same", MODELS)


@pytest.fixture(scope="module")
def edges():
    return _run("same", ["edge:" + e for e in EDGES])


def _same_everywhere(per):
    ref = per["cast_inputs"]
    for config in ("lean", "ready"):
        got = per[config]
        for k in ("out", "log", "made"):
            if k == "out":      # (the counts of the new paths: only with them on)
                a = [o for o in got[k] if o[0] != "counts"]
                b = [o for o in ref[k] if o[0] != "counts"]
            else:
                a, b = got[k], ref[k]
            assert a == b, (config, k)


@pytest.mark.parametrize("case", MODELS)
def test_model_steps_same_in_every_configuration(models, case):
    per = models[case]
    _same_everywhere(per)
    c = per["ready"]["counts"]
    calls = len(per["ready"]["log"]) // 4       # lowered calls a step
    # every lowered call goes through _lower_ready (the stem's float32 x too); the first region casts each weight
    # alone, the second makes the kept copy, the third's direct weights make the records (_flat_direct), which serve
    # every weight and bias of the fourth step but the region's first (its kept copy's refill: the flat cast)
    assert c["ready"] == 4 * calls and "ready declined" not in c, c
    steps = [o[1] for o in per["ready"]["out"] if o[0] == "counts"]      # (cumulative)
    assert steps[2].get("record", 0) == 0, steps
    assert steps[3]["record"] >= calls - 1 and steps[3]["no record"] - steps[2]["no record"] == 1, steps
    assert per["lean"]["counts"] == {} and per["cast_inputs"]["counts"] == {}


@pytest.mark.parametrize("case", EDGES)
def test_edge_cases_same_in_every_configuration(edges, case):
    _same_everywhere(edges["edge:" + case])


def test_edge_cases_reach_the_new_paths(edges):
    # the plain last step served by the records (conv's bias, conv2's weight, the linear's weight and bias; conv's
    # weight refills the kept copy)
    c = edges["edge:plain"]["ready"]["counts"]
    assert c["record"] == 4 and c["ready"] == 12, c
    per = edges["edge:optimizer_deleted"]["ready"]      # a dead flat set's kept copy and records are gone
    assert [o for o in per["out"] if o[0] == "kept copies left"] == [["kept copies left", 0]], per["out"]
    assert per["counts"]["records left"] == 0 and c["record"] > 0
    # two-argument calls (no bias) are served too: the conv's weight and the linear's by their records
    c = edges["edge:two_args"]["ready"]["counts"]
    assert c["ready"] == 12 and "ready declined" not in c and c["record"] == 3, c


def test_every_mutation_changes_a_scenario():
    res = _run("mutations", [])
    control = res.pop("control")
    assert all(control.values()), control       # unmutated: every scenario the same as cast_inputs's
    unchanged = {m: cases for m, cases in res.items() if all(cases.values())}
    assert len(res) == len(MUTATIONS) and not unchanged, unchanged

"""CUDA graphs: PyTorch's capture pattern on the example models with SGD (momentum) and Adam gives the same
parameters as eager execution, minidnn.compile replays equal eager and re-captures on a new batch size, and on
the CPU minidnn.compile falls back to eager with one warning."""
import warnings

import numpy as np
import pytest

import minidnn as mdn
import minidnn.nn.functional as F
from minidnn.models import LeNet5, MobileNetSmall, resnet20

MODELS = {"lenet5": (lambda: LeNet5(input_size=32), (1, 32, 32)),
          "resnet20": (lambda: resnet20(), (3, 32, 32)),
          "mobilenet_small": (lambda: MobileNetSmall(), (3, 32, 32))}
OPTS = {"sgd": lambda p: mdn.optim.SGD(p, lr=0.05, momentum=0.9),
        "adam": lambda p: mdn.optim.Adam(p, lr=1e-3)}


def _setup(name, opt, device, batch=8):
    make, shape = MODELS[name]
    mdn.manual_seed(0)
    model = make().to(device)
    optimizer = OPTS[opt](model.parameters())
    x = mdn.randn(batch, *shape, device=device)
    y = mdn.randint(0, 10, (batch,), device=device)

    def step():
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=False)
        loss.backward()
        optimizer.step()
        return loss
    step.optimizer = optimizer
    return model, step, x, y


@pytest.mark.cuda
@pytest.mark.parametrize("opt", list(OPTS))
@pytest.mark.parametrize("name", list(MODELS))
def test_captured_step_equals_eager(name, opt, device):
    if device != "cuda":
        pytest.skip("CUDA graphs need a GPU")
    eager_model, eager_step, _, _ = _setup(name, opt, device)
    model, step, _, _ = _setup(name, opt, device)
    s = mdn.cuda.Stream()
    s.wait_stream(mdn.cuda.current_stream())
    with mdn.cuda.stream(s):
        for _ in range(3):
            step()
    mdn.cuda.current_stream().wait_stream(s)
    g = mdn.cuda.CUDAGraph()
    with mdn.cuda.graph(g):
        step()
    for _ in range(3 + 20):
        eager_step()
    for _ in range(20):
        g.replay()
    mdn.cuda.synchronize()
    for p, q in zip(model.parameters(), eager_model.parameters()):
        np.testing.assert_array_equal(p.cpu().numpy(), q.cpu().numpy())


@pytest.mark.cuda
def test_compile_replays_and_recaptures(device):
    if device != "cuda":
        pytest.skip("CUDA graphs need a GPU")
    mdn.manual_seed(0)
    ref = LeNet5(input_size=32).to(device)
    model = LeNet5(input_size=32).to(device)
    model.load_state_dict(ref.state_dict())
    opt_ref = mdn.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
    opt = mdn.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    def make_step(m, o):
        def step(x, y):
            loss = F.cross_entropy(m(x), y)
            o.zero_grad(set_to_none=False)
            loss.backward()
            o.step()
            return loss
        return step
    eager, compiled = make_step(ref, opt_ref), mdn.compile(make_step(model, opt))
    rng = np.random.default_rng(0)
    for batch in (8, 8, 8, 8, 8, 8, 4, 4, 4, 4, 4, 8):
        x = mdn.tensor(rng.standard_normal((batch, 1, 32, 32)).astype(np.float32), device=device)
        y = mdn.tensor(rng.integers(0, 10, batch), device=device)
        a, b = float(eager(x, y)), float(compiled(x, y))
        assert a == b
    assert len(compiled.graphs) == 2 and compiled.eager_reason is None
    for p, q in zip(model.parameters(), ref.parameters()):
        np.testing.assert_array_equal(p.cpu().numpy(), q.cpu().numpy())


@pytest.mark.cuda
@pytest.mark.parametrize("fused, set_to_none", [(True, False), (False, True)])
def test_compile_reads_arguments_in_place_when_they_come_back(device, fused, set_to_none):
    """Arguments at the same device addresses three calls in a row: a second graph captured on them replays with
    no copy, and computes on what was written into them in place.  Another tensor after that ends the in-place
    mode: the copying graph is captured again, so state fn rebinds (an unfused optimizer's p.grad after
    zero_grad(set_to_none=True)) follows the graph that runs.  Every step, and the final parameters and .grad,
    equal eager bit for bit."""
    if device != "cuda":
        pytest.skip("CUDA graphs need a GPU")
    mdn.manual_seed(0)
    ref = LeNet5(input_size=32).to(device)
    model = LeNet5(input_size=32).to(device)
    model.load_state_dict(ref.state_dict())
    opt_ref = mdn.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9, fused=fused)
    opt = mdn.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, fused=fused)

    def make_step(m, o):
        def step(x, y):
            loss = F.cross_entropy(m(x), y)
            o.zero_grad(set_to_none=set_to_none)
            loss.backward()
            o.step()
            return loss
        return step
    eager, compiled = make_step(ref, opt_ref), mdn.compile(make_step(model, opt), warmup=1)
    rng = np.random.default_rng(1)
    x = mdn.tensor(rng.standard_normal((8, 1, 32, 32)).astype(np.float32), device=device)
    y = mdn.tensor(rng.integers(0, 10, 8), device=device)
    for step in range(11):
        if step in (5, 6):                  # refilled in place: the in-place graph must see the new values
            x.copy_(mdn.tensor(rng.standard_normal((8, 1, 32, 32)).astype(np.float32), device=device))
        if step == 8:                       # another tensor: the copying graph, captured again
            x2 = mdn.tensor(rng.standard_normal((8, 1, 32, 32)).astype(np.float32), device=device)
            a, b = float(eager(x2, y)), float(compiled(x2, y))
        else:
            a, b = float(eager(x, y)), float(compiled(x, y))
        assert a == b, step
        if step == 0:                           # the warm-up call runs eagerly: nothing captured yet
            assert not compiled.graphs
            continue
        entry = next(iter(compiled.graphs.values()))
        if step == 7:
            assert entry.in_place and entry.direct is not None
            assert entry.direct[0] == (x.data.data.ptr, y.data.data.ptr)
    assert not entry.in_place and entry.direct is None
    for p, q in zip(model.parameters(), ref.parameters()):
        np.testing.assert_array_equal(p.cpu().numpy(), q.cpu().numpy())
        np.testing.assert_array_equal(p.grad.cpu().numpy(), q.grad.cpu().numpy())
    w = mdn.randn(3, device=device, requires_grad=True)       # an argument requiring grad: always the copies
    g = mdn.compile(lambda t: (t * 2).sum(), warmup=1)
    for _ in range(6):
        g(w)
    assert not next(iter(g.graphs.values())).in_place


def test_compile_falls_back_to_eager_on_cpu_with_one_warning():
    calls = []

    def f(x):
        calls.append(1)
        return x * 2
    g = mdn.compile(f)
    x = mdn.arange(3.0)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        out = [g(x) for _ in range(4)]
    assert len(calls) == 4 and all(o.tolist() == [0.0, 2.0, 4.0] for o in out)
    msgs = [str(m.message) for m in w if "minidnn.compile" in str(m.message)]
    assert len(msgs) == 1 and ("no CUDA GPU" in msgs[0] or "CUDA device" in msgs[0])


def test_compile_cache_key_and_input_copy():
    """The replay path's host helpers (the replay itself needs a GPU): the key separates every property a
    captured graph depends on, and the copy fills the static buffers in place."""
    from minidnn.compile import _copy_args, _copy_plan, _signature
    x = mdn.randn(2, 3)
    same = _signature((x, 1), {"k": x})
    assert same == _signature((mdn.randn(2, 3), 1), {"k": mdn.randn(2, 3)})
    for other in [(mdn.randn(3, 2), 1), (mdn.randn(2, 3, dtype=mdn.float64), 1), (mdn.randn(2, 3), 2),
                  (mdn.randn(2, 3, requires_grad=True), 1)]:
        assert _signature(other, {"k": x}) != same
    assert _signature((x, 1), {"j": x}) != same
    assert _signature((x.t().contiguous().t(), 1), {"k": x}) != same       # same shape, other strides
    static, new = [mdn.zeros(2, 3), 5], [x, 5]
    s_kw, kw = {"k": mdn.zeros(3, 2)}, {"k": x.t()}                         # a strided argument: copy_into
    plan = _copy_plan(new, static, kw, s_kw)
    assert [[(i, name) for i, name, _ in entries] for entries, _ in plan] == [[(0, None)], [(None, "k")]]
    buf, kbuf = static[0].data, s_kw["k"].data
    v = static[0]._version
    _copy_args(plan, new, kw)
    assert static[0].data is buf and np.array_equal(buf, x.numpy()) and static[0]._version == v + 1
    assert s_kw["k"].data is kbuf and np.array_equal(kbuf, x.numpy().T)
    x2 = mdn.randn(2, 3)
    _copy_args(plan, [x2, 5], {"k": x2.t()})
    assert np.array_equal(buf, x2.numpy()) and np.array_equal(kbuf, x2.numpy().T)
    _copy_args(plan, [static[0], 5], {"k": s_kw["k"]})     # the buffers themselves: nothing copied
    assert static[0]._version == v + 2 and np.array_equal(buf, x2.numpy())


@pytest.mark.cuda
@pytest.mark.parametrize("pairs", [1, 2, 4, 6])
def test_dense_copier_against_copy_into(device, pairs):
    """array_ops.dense_copier (cuda/copy_kernels.multi_copy: up to four copies per launch) against dst[...] = src:
    16-byte multiples (vector path), odd byte counts (byte path), 1-byte and 8-byte items, a source at an odd
    offset, a source that is its own destination, and more pairs than one launch takes."""
    if device != "cuda":
        pytest.skip("needs a GPU")
    import cupy as cp

    from minidnn.backend.array_ops import dense_copier
    from minidnn.backend.cuda import launch
    rng = np.random.default_rng(pairs)
    shapes = [((64, 1, 32, 32), np.float32), ((7,), np.int64), ((13,), np.uint8), ((3, 5), np.float16),
              ((1,), np.float32), ((100003,), np.float32)][:pairs]
    dsts = [cp.zeros(s, dtype=t) for s, t in shapes]
    copy = dense_copier(dsts)
    for round_ in range(2):
        srcs = []
        for (s, t), d in zip(shapes, dsts):
            host = (rng.standard_normal(s) * 100).astype(t)
            if t == np.uint8 and round_:        # an odd address: a view one byte into a larger buffer
                src = cp.asarray(np.concatenate([[0], host.ravel()]).astype(t))[1:].reshape(s)
            else:
                src = cp.asarray(host)
            srcs.append(src)
        if round_:
            srcs[0] = dsts[0]                   # a buffer copied onto itself keeps its contents
        before = dsts[0].copy()
        start = launch.launch_count()
        copy(*srcs)
        assert launch.launch_count() - start == -(-pairs // 4)
        for k, (src, dst) in enumerate(zip(srcs, dsts)):
            want = before if (round_ and k == 0) else src
            np.testing.assert_array_equal(cp.asnumpy(dst), cp.asnumpy(want))


@pytest.mark.parametrize("in_place_fails", [False, True])
def test_compile_in_place_mode_control_flow(monkeypatch, in_place_fails):
    """The replay path's graph bookkeeping, on the CPU with stand-in graphs (the cuda test above runs the real
    ones): the same addresses three calls in a row capture the in-place graph once; other addresses (or a failed
    in-place capture) capture the copying graph again and end the mode; every replay runs the graph that fn's
    host state was last bound to (fn rebinds it whenever it is captured), and each call runs one step."""
    import itertools
    import sys

    import minidnn.compile  # noqa: F401
    cm = sys.modules["minidnn.compile"]
    log, state, capturing, tags = [], {}, {}, itertools.count()

    class Graph:
        def __init__(self, tag):
            self.tag = tag

        def replay(self):
            log.append((self.tag, state["bound"]))

    def fn(x):
        state["bound"] = capturing["tag"]        # host state rebound into the graph being captured
        return x

    c = cm._Compiled(fn, warmup=0, max_graphs=4, mode="reduce-overhead")

    def capture(args, kwargs):
        capturing["tag"] = next(tags)
        if in_place_fails and args[0] is not static:
            raise RuntimeError("planted blocker in the in-place capture")
        return Graph(capturing["tag"]), fn(*args, **kwargs)
    monkeypatch.setattr(c, "_capture", capture)
    monkeypatch.setattr(cm, "_pointers", lambda args, kwargs: tuple(a.data.ctypes.data for a in args))
    x, x2 = mdn.arange(4.0), mdn.arange(4.0) + 10
    static = cm._static_copy(x)
    graph, out = capture([static], {})
    entry = cm._Entry(graph, cm._copy_plan((x,), [static], {}, {}), out, (x,), {}, [static], {})
    entry.in_place, entry.ptrs = True, cm._pointers((x,), {})          # as a CUDA argument would have it
    c.graphs[cm._signature((x,), {})] = entry
    graph.replay()                                                      # the capturing call's step
    for _ in range(3):
        c(x)
    if in_place_fails:
        assert entry.direct is None and not entry.in_place             # the copying graph, captured again
    else:
        assert entry.direct is not None and entry.direct[0] == cm._pointers((x,), {}) and entry.in_place
        c(x)                                                            # in place: no copy
        c(x2)                                                           # other addresses: copying again
        assert entry.direct is None and not entry.in_place
    np.testing.assert_array_equal(static.numpy(), (x2 if not in_place_fails else x).numpy())
    c(x)
    np.testing.assert_array_equal(static.numpy(), x.numpy())
    assert all(tag == bound for tag, bound in log), log                 # never a graph with stale host state
    assert len(log) == (7 if not in_place_fails else 5)                 # one step per call (+ the first)


def test_compile_as_decorator_and_type_check():
    @mdn.compile(warmup=1)
    def f(x):
        return x + 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert f(mdn.zeros(2)).tolist() == [1.0, 1.0]
    with pytest.raises(TypeError, match="callable"):
        mdn.compile(3)


def _planted_step(x):
    import random
    y = x * 2
    loss = y.sum()
    value = loss.item()                 # host synchronisation
    noise = random.random()             # Python randomness
    picked = y[y > 0]                   # data-dependent shape
    bias = mdn.ones(3)                  # a CPU tensor inside a GPU step
    print(loss)                         # printing a tensor
    return value, noise, picked, bias


def test_doctor_finds_python_randomness_on_the_cpu(capsys):
    found = mdn.cuda.graphs.check(_planted_step, mdn.arange(3.0))
    kinds = {b.kind for b in found}
    assert "Python randomness" in kinds
    rnd = next(b for b in found if b.kind == "Python randomness")
    assert rnd.where.endswith(f"test_cuda_graphs.py:{_planted_step.__code__.co_firstlineno + 5}")
    assert "blocker" in capsys.readouterr().out


@pytest.mark.cuda
def test_doctor_finds_each_planted_blocker_and_its_line(device):
    if device != "cuda":
        pytest.skip("the GPU blockers need a GPU")
    found = mdn.cuda.graphs.check(_planted_step, mdn.arange(3.0, device="cuda"))
    first = _planted_step.__code__.co_firstlineno
    lines = {}
    for b in found:                     # the first line of each kind (print is a second host synchronisation)
        if b.where.endswith(tuple(f":{first + k}" for k in range(1, 10))):
            lines.setdefault(b.kind, int(b.where.rsplit(":", 1)[1]))
    assert lines["host synchronisation"] == first + 4
    assert lines["Python randomness"] == first + 5
    assert lines["data-dependent shape"] == first + 6
    assert lines["CPU tensor"] == first + 7
    prints = [b for b in found if b.kind == "host synchronisation" and b.where.endswith(f":{first + 8}")]
    assert prints


@pytest.mark.cuda
def test_doctor_passes_a_capturable_step(device):
    if device != "cuda":
        pytest.skip("needs a GPU")
    model, step, _, _ = _setup("lenet5", "sgd", device)
    assert mdn.cuda.graphs.check(step) == []


@pytest.mark.cuda
@pytest.mark.parametrize("opt", list(OPTS))
def test_scheduler_reaches_a_replayed_step(opt, device):
    if device != "cuda":
        pytest.skip("CUDA graphs need a GPU")
    runs = []
    for graphed in (False, True):
        model, step, _, _ = _setup("lenet5", opt, device)
        sched = mdn.optim.lr_scheduler.StepLR(step.optimizer, step_size=2, gamma=0.5)
        run = step
        if graphed:
            s = mdn.cuda.Stream()
            s.wait_stream(mdn.cuda.current_stream())
            with mdn.cuda.stream(s):
                for _ in range(3):
                    step()
            mdn.cuda.current_stream().wait_stream(s)
            g = mdn.cuda.CUDAGraph()
            with mdn.cuda.graph(g):
                step()
            run = g.replay
        else:
            for _ in range(3):
                step()
        for _ in range(8):
            run()
            sched.step()
        mdn.cuda.synchronize()
        runs.append([p.cpu().numpy() for p in model.parameters()])
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)


class _DropNet(mdn.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = mdn.nn.Sequential(mdn.nn.Flatten(), mdn.nn.Linear(32 * 32, 64), mdn.nn.ReLU(),
                                      mdn.nn.Dropout(0.3), mdn.nn.Linear(64, 10))

    def forward(self, x):
        return self.body(x)


@pytest.mark.cuda
def test_dropout_step_replays_equal_eager(device):
    if device != "cuda":
        pytest.skip("CUDA graphs need a GPU")
    params = []
    for graphed in (False, True):
        mdn.manual_seed(0)
        model = _DropNet().to(device)
        opt = mdn.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        x = mdn.randn(16, 1, 32, 32, device=device)
        y = mdn.randint(0, 10, (16,), device=device)

        def step():
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=False)
            loss.backward()
            opt.step()
        run = step
        if graphed:
            for _ in range(3):
                step()
            g = mdn.cuda.CUDAGraph()
            with mdn.cuda.graph(g):
                step()
            run = g.replay
        else:
            for _ in range(3):
                step()
        for _ in range(10):
            run()
        mdn.cuda.synchronize()
        params.append([p.cpu().numpy() for p in model.parameters()])
    for a, b in zip(*params):
        np.testing.assert_array_equal(a, b)


@pytest.mark.cuda
def test_device_dropout_statistics_seed_and_state(device):
    if device != "cuda":
        pytest.skip("the device-side stream is the GPU's")
    x = mdn.ones(200_000, device=device)
    mdn.manual_seed(3)
    a = F.dropout(x, 0.25).cpu().numpy()
    b = F.dropout(x, 0.25).cpu().numpy()
    kept = (a != 0).mean()
    assert abs(kept - 0.75) < 0.005 and not np.array_equal(a, b)        # fresh masks, right keep rate
    assert np.allclose(a[a != 0], 1 / 0.75)
    mdn.manual_seed(3)
    assert np.array_equal(F.dropout(x, 0.25).cpu().numpy(), a)          # reproducible from the seed
    state = mdn.cuda.get_rng_state()
    c = F.dropout(x, 0.25).cpu().numpy()
    mdn.cuda.set_rng_state(state)
    assert np.array_equal(F.dropout(x, 0.25).cpu().numpy(), c)          # and from a saved state


@pytest.mark.cuda
def test_reseeding_and_restoring_reach_a_captured_dropout(device):
    """manual_seed / set_rng_state after a capture change what the replays draw, exactly as in eager mode
    (the engine's device state is updated in place, so the graph's baked addresses stay valid)."""
    if device != "cuda":
        pytest.skip("the device-side stream is the GPU's")
    x = mdn.ones(4096, device=device)
    mdn.manual_seed(11)
    F.dropout(x, 0.5)                                   # the engine's device state exists before the capture
    graph = mdn.cuda.CUDAGraph()
    with mdn.cuda.graph(graph):
        y = F.dropout(x, 0.5)
    mdn.manual_seed(5)
    eager = [F.dropout(x, 0.5).cpu().numpy() for _ in range(2)]
    mdn.manual_seed(5)
    replayed = []
    for _ in range(2):
        graph.replay()
        replayed.append(y.cpu().numpy())
    np.testing.assert_array_equal(replayed[0], eager[0])
    np.testing.assert_array_equal(replayed[1], eager[1])
    mdn.manual_seed(5)
    F.dropout(x, 0.5)
    state = mdn.cuda.get_rng_state()
    mdn.manual_seed(99)
    mdn.cuda.set_rng_state(state)
    graph.replay()
    np.testing.assert_array_equal(y.cpu().numpy(), eager[1])

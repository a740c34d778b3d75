"""bench/kernels_gpu.py's two timings on a fake framework (no GPU): the graph column is the device time of the
captured calls (host time gone), a call that cannot be captured falls back to its eager time with a mark, and the
target is judged on the graph column only where both sides were captured."""
import contextlib
import importlib.util
import os
import sys
import types

import pytest

_BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "bench")


def _bench():
    if _BENCH not in sys.path:
        sys.path.insert(0, _BENCH)
    spec = importlib.util.spec_from_file_location("kernels_gpu_under_test", os.path.join(_BENCH, "kernels_gpu.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class FakeGPU:
    """A virtual clock: an eager call costs `host` ms of launch then `device` ms of kernel (the GPU idles while the
    host is slower); a captured call costs nothing until replayed, then only its device time."""

    def __init__(self):
        self.clock = 0.0
        self.capturing = None
        self.capture_streams = []

    def kernel(self, host, device, syncs=False):
        def call():
            if self.capturing is not None:
                if syncs:
                    raise RuntimeError("operation not permitted when stream is capturing")
                self.capturing.append(device)
            else:
                self.clock += max(host, device)
        return call

    def lib(self):
        gpu = self

        class Event:
            def __init__(self, **_):
                self.t = None

            def record(self):
                self.t = gpu.clock

            def synchronize(self):
                pass

            def elapsed_time(self, other):
                return other.t - self.t

        class Graph:
            def __init__(self):
                self.calls = []

            def replay(self):
                gpu.clock += sum(self.calls)

        @contextlib.contextmanager
        def graph(g, stream=None):
            gpu.capture_streams.append(stream)
            gpu.capturing = g.calls
            try:
                yield g
            finally:
                gpu.capturing = None

        class Stream:
            def wait_stream(self, other):
                pass

        current = Stream()
        cuda = types.SimpleNamespace(Stream=Stream, current_stream=lambda: current,
                                     stream=lambda s: contextlib.nullcontext(),
                                     CUDAGraph=Graph, graph=graph, Event=Event, synchronize=lambda: None)
        return types.SimpleNamespace(cuda=cuda)


def test_graph_column_is_device_time_and_failures_fall_back_marked():
    kg = _bench()
    gpu = FakeGPU()
    torch = gpu.lib()
    timer = kg.Timer(None, torch, trials=3)
    timer._cupy_clock = timer._torch_clock          # both sides on the fake clock
    import minidnn
    real = {k: getattr(minidnn.cuda, k) for k in ("Stream", "current_stream", "stream", "CUDAGraph", "graph")}
    try:
        for k in real:
            setattr(minidnn.cuda, k, getattr(torch.cuda, k))
        mdn = gpu.kernel(host=0.020, device=0.010)     # host-bound eagerly: 20 us a call, 10 us of kernel
        ref = gpu.kernel(host=0.008, device=0.012)
        got = kg.measure(timer, mdn, ref, "both")
        assert got["eager"] == pytest.approx((0.020, 0.012))
        assert got["graph"] == pytest.approx((0.010, 0.012))
        assert got["failed"] == []
        # PyTorch's calls are captured on the current stream (the one its forwards ran on: autograd puts a
        # backward op on its forward's stream); minidnn's through bench/graphs._capture (a stream of its own)
        assert gpu.capture_streams == [None, torch.cuda.current_stream()]
        syncing = gpu.kernel(host=0.020, device=0.010, syncs=True)
        got = kg.measure(timer, syncing, ref, "graph")
        assert "eager" not in got
        assert got["graph"] == pytest.approx((0.020, 0.012))   # eager stands in for the side that failed
        assert [side for side, _ in got["failed"]] == ["minidnn"]
        assert "capturing" in got["failed"][0][1]
    finally:
        for k, v in real.items():
            setattr(minidnn.cuda, k, v)


def test_torch_stream_without_torch():
    kg = _bench()
    with kg.torch_stream(None):
        pass


def test_cells_and_verdict():
    kg = _bench()
    text, pct = kg._cells(0.010, 0.012, 30e6, 4000.0, (False, True))
    assert pct == pytest.approx(100 * 30e6 / 1e-5 / 1e9 / 4000.0)     # 3000 GB/s of 4000: 75%
    assert "0.0100 " in text and "0.0120e" in text and "1.20x" in text
    assert kg._verdict(75.0, 0.010, 0.012) == "ok"
    assert kg._verdict(69.0, 0.010, 0.012) == "<70%"
    assert kg._verdict(75.0, 0.013, 0.012) == "slower"


def test_alternate_rounds():
    """kernels_gpu.alternate (the A/B tools' loop): every round times each setting after its switch and one eager
    call, then PyTorch, the order reversed every other round; the calls a replay holds counted once per framework;
    the per-round ratios against the first setting and PyTorch; a PyTorch capture that fails dropped with a line."""
    kg = _bench()
    log, state = [], {}
    cost = {"a": 2.0, "b": 1.0}

    class Timer:
        def reps(self, fn, framework):
            log.append(("reps", framework))
            return 7

        def graph(self, fn, reps, framework):
            assert reps == 7
            if framework == "torch":
                log.append(("graph", "torch"))
                if len([e for e in log if e == ("graph", "torch")]) == 3:
                    raise RuntimeError("capture failed")
                return 4.0
            log.append(("graph", state["s"]))
            return cost[state["s"]]

    def switch(s):
        state["s"] = s
        log.append(("switch", s))

    def fn():
        log.append(("call", state["s"]))

    got, ratios, vs_torch, tms = kg.alternate(Timer(), ["a", "b"], switch, fn, lambda: None, 4)
    assert got == {"a": [2.0] * 4, "b": [1.0] * 4}
    assert ratios == {"a": [1.0] * 4, "b": [2.0] * 4}
    assert vs_torch == {"a": [2.0, 2.0], "b": [4.0, 4.0]} and tms == [4.0, 4.0]   # round 3 lost PyTorch for good
    assert log.count(("reps", "minidnn")) == 1 and log.count(("reps", "torch")) == 1
    order = [e[1] for e in log if e[0] == "graph"]
    assert order == ["a", "b", "torch", "torch", "b", "a", "a", "b", "torch", "b", "a"]
    for i, e in enumerate(log):                     # each setting's graph after its switch and one eager call
        if e[0] == "graph" and e[1] != "torch":
            assert log[i - 1] in (("call", e[1]), ("reps", "minidnn")) and ("switch", e[1]) in log[i - 3:i]


def test_ab_lines():
    """kernels_gpu.ab_lines (the A/B tools' report): medians, GB/s and % of copy of the compulsory bytes, the spread,
    the ratio to the first setting timed, PyTorch's ratio, the note; a setting that planned an earlier one's launch
    says so; PyTorch's own line last; no PyTorch, no torch column or line."""
    kg = _bench()
    got = {"a": [2e-3, 1e-3, 1e-3], "c": [0.5e-3, 0.5e-3, 0.6e-3]}
    ratios = {"a": [1.0] * 3, "c": [2.0, 2.0, 1.5]}
    vs_torch = {"a": [1.5] * 3, "c": [3.0] * 3}
    lines = kg.ab_lines("op f32 (4, 4)", ["a", "b", "c"], got, ratios, vs_torch, [1.5e-3] * 3, 2e6, 4000.0,
                        same={"b": "a"}, note=lambda s: f"[{s}]")
    assert len(lines) == 4
    assert lines[0].split() == ["op", "f32", "(4,", "4)", "a", "0.0010", "ms", "2000", "GB/s", "50%", "of", "copy",
                                "spread", "100.0%", "a/this", "1.000", "torch/this", "1.50", "[a]"]
    assert lines[1] == "op f32 (4, 4) b       = a (the same launch)"
    assert "0.0005 ms   4000 GB/s  100% of copy" in lines[2] and "a/this 2.000" in lines[2]
    assert "spread 20.0%" in lines[2] and lines[2].endswith("torch/this  3.00  [c]")
    assert lines[3].split() == ["op", "f32", "(4,", "4)", "torch", "0.0015", "ms", "1333", "GB/s", "33%", "of", "copy"]
    bare = kg.ab_lines("x", ["c"], {"c": [1e-3]}, {"c": [1.0]}, {"c": []}, [], 1e6, 1000.0)
    assert bare == ["x c         0.0010 ms   1000 GB/s  100% of copy  spread  0.0%  c/this 1.000"]


def test_distinct_plans():
    """kernels_gpu.distinct_plans: each setting's plan asked once, in order; the first of each plan timed, the others
    named after it."""
    kg = _bench()
    asked = []

    def plan_of(s):
        asked.append(s)
        return {"0": "rows", "1": "cl7", "all": "cl7", "x": "rows", "y": "cl8"}[s]

    plans, distinct, same = kg.distinct_plans(["0", "1", "all", "x", "y"], plan_of)
    assert asked == ["0", "1", "all", "x", "y"]
    assert plans == {"0": "rows", "1": "cl7", "all": "cl7", "x": "rows", "y": "cl8"}
    assert distinct == ["0", "1", "y"] and same == {"all": "1", "x": "0"}


def test_ab_main(monkeypatch, capsys):
    """kernels_gpu.ab_main: unknown settings or ops are refused before anything runs; with no GPU a line and 0; else
    run_case for every dtype, shape and op in that order with the chosen settings (the first the reference), the
    defaults where no option is given."""
    kg = _bench()
    table, ops = {"a": 1, "b": 2, "c": 3}, {"fwd": "x", "bwd": "y"}
    calls = []

    def run_case(timer, cases, op, shape, dtype_name, bw, rounds, settings):
        calls.append((cases.dtype_name, op, shape, dtype_name, bw, rounds, tuple(settings), timer))

    for bad in (["--settings", "a,zz"], ["--ops", "fwd,sideways"], ["--settings", ""]):
        with pytest.raises(SystemExit):
            kg.ab_main("t", "doc\nmore", table, ops, run_case, bad, ops="fwd", shapes="1x2x3", settings="a")
    assert not calls
    monkeypatch.setattr(kg, "ab_start", lambda tool, trials, rounds, how: None)
    assert kg.ab_main("t", "doc", table, ops, run_case, [], ops="fwd", shapes="1x2x3", settings="a") == 0
    assert not calls
    started = []

    def start(tool, trials, rounds, how):
        started.append((tool, trials, rounds))
        return "cp", None, "timer", 4000.0

    class FakeCases:
        def __init__(self, cp, torch, dtype_name):
            assert (cp, torch) == ("cp", None)
            self.dtype_name = dtype_name

    monkeypatch.setattr(kg, "ab_start", start)
    monkeypatch.setattr(kg, "Cases", FakeCases)
    assert kg.ab_main("t", "doc", table, ops, run_case, ["--dtypes", "float32,bfloat16", "--shapes", "2x3x4,5x6x7",
                                                        "--settings", "c,a", "--rounds", "2", "--trials", "9"],
                      ops="fwd,bwd", shapes="1x2x3", settings="a") == 0
    assert started == [("t", 9, 2)]
    want = [(d, op, shape, d, 4000.0, 2, ("c", "a"), "timer") for d in ("float32", "bfloat16")
            for shape in ((2, 3, 4), (5, 6, 7)) for op in ("fwd", "bwd")]
    assert calls == want
    calls.clear()
    kg.ab_main("t", "doc", table, ops, run_case, [], ops="bwd", shapes="8x9", settings="b,c")
    assert [c[1:3] + c[6:7] for c in calls] == [("bwd", (8, 9), ("b", "c"))] * 2

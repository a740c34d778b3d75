"""CUDA-graph timers shared by the session-7 A/B tools (tools/softmax_s7.py, tools/bn_nhwc_s7.py): the device time
of one call of ``fn`` from a graph of ``calls`` back-to-back calls, median over ``trials`` replays -- CuPy launches
(``graph_time``, None where the capture fails) or PyTorch ops (``torch_graph_time``).  Host work is not in the figure.
"""
from __future__ import annotations

import os
import statistics
import sys

_BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench")


def graph_time(cp, fn, calls, trials):
    """Median device ms of one ``fn()`` from a CUDA graph of ``calls`` of them (None where capture fails)."""
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        fn()
        s.synchronize()
        try:
            s.begin_capture()
            for _ in range(calls):
                fn()
            g = s.end_capture()
        except Exception as e:                  # noqa: BLE001 -- report, no number
            print(f"  (capture failed: {type(e).__name__}: {e})", file=sys.stderr)
            try:
                s.end_capture()
            except Exception:                   # noqa: BLE001
                pass
            return None
        g.launch(s)
        s.synchronize()
        times = []
        for _ in range(trials):
            a, b = cp.cuda.Event(), cp.cuda.Event()
            a.record(s)
            g.launch(s)
            b.record(s)
            b.synchronize()
            times.append(cp.cuda.get_elapsed_time(a, b) / calls)
    return statistics.median(times)


def torch_graph_time(torch, fn, calls, trials):
    """Median device ms of one PyTorch ``fn()`` from a CUDA graph of ``calls`` of them (bench/graphs.py's capture:
    warm-up on a side stream, then one graph)."""
    if _BENCH not in sys.path:
        sys.path.insert(0, _BENCH)
    from graphs import _capture  # bench/graphs.py
    replay = _capture(torch, lambda: [fn() for _ in range(calls)])
    replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(trials):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / calls)
    return statistics.median(times)

"""bench/cpu.py's timing helper (the issue-16 CPU table): best_of's warm-up, plain and with --settle (untimed calls for
at least that long before each timed round, so PyTorch's spinning OpenMP threads go idle before minidnn's round)."""
import os
import sys
import time

import pytest

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "bench")


@pytest.fixture
def cpu_bench(monkeypatch):
    monkeypatch.syspath_prepend(os.path.abspath(BENCH))
    sys.modules.pop("cpu", None)
    import cpu
    monkeypatch.setattr(cpu, "SETTLE", [0.0])
    yield cpu
    sys.modules.pop("cpu", None)


def test_best_of_one_warm_up_call_then_the_fastest_round(cpu_bench, monkeypatch):
    ticks = iter([0.0, 3.0, 10.0, 12.0])        # two rounds of two calls: 3 s and 2 s a round
    monkeypatch.setattr(cpu_bench, "CLOCK", [lambda: next(ticks)])
    calls = []
    assert cpu_bench.best_of(lambda: calls.append(1), 2, 2) == 1.0
    assert len(calls) == 1 + 2 * 2


def test_settle_runs_untimed_calls_for_at_least_that_long(cpu_bench, monkeypatch):
    monkeypatch.setattr(cpu_bench, "SETTLE", [0.03])
    stamps = []

    def fn():
        stamps.append(time.perf_counter())
        time.sleep(0.004)
    t0 = time.perf_counter()
    cpu_bench.best_of(fn, 1, 3)
    warm = stamps[:-3]                            # the last 3 calls are the timed round
    assert len(warm) >= 2 and stamps[-3] - t0 >= 0.03
    assert warm[-1] - t0 < 0.03                  # the last warm-up call began before the settle time was up

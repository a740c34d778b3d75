"""The one algorithm selector: a registry of algorithms per primitive direction, heuristics, find
(benchmark every candidate), and a per-configuration cache of the winner.

Every algorithm is an object with
    algo                       its enum member (cuDNN's name)
    unsupported_reason(prob)   None if it can run ``prob``, else the rule it breaks (a sentence)
    supports(prob)             unsupported_reason(prob) is None
    workspace_size(prob)       bytes of scratch memory beyond inputs and outputs
    deterministic(device)      whether two runs give bitwise equal results on that device type
    estimated_cost(prob, dev)  a rough relative time, for the heuristic ranking
    run(prob, *arrays, tf32)   the computation, on raw arrays
The primitives ask the registry for an algorithm; they never branch on algorithms themselves.  Nothing
here knows about convolution: any family with several algorithms can use it.
"""
from __future__ import annotations

import enum
import statistics
import threading
import time
from dataclasses import dataclass

from .errors import BadParamError, IdentityEnum, NotSupportedError, Status
from .handle import MathType

__all__ = ["Determinism", "ConvolutionPreference", "AlgoPerf", "AlgorithmRegistry", "AlgorithmCache",
           "time_call"]


class Determinism(IdentityEnum):
    """cuDNN's cudnnDeterminism_t."""
    NON_DETERMINISTIC = 0
    DETERMINISTIC = 1


class ConvolutionPreference(IdentityEnum):
    """How the heuristic ranks algorithms (cuDNN's cudnnConvolutionFwdPreference_t and friends).

    PREFER_FASTEST            the lowest estimated time, within handle.workspace_limit
    NO_WORKSPACE              the least workspace (every array algorithm needs some scratch here, so
                              "none" is read as "as little as possible"); ties broken by time
    SPECIFY_WORKSPACE_LIMIT   the fastest within ``workspace_limit`` bytes (and handle.workspace_limit)
    """
    NO_WORKSPACE = 0
    PREFER_FASTEST = 1
    SPECIFY_WORKSPACE_LIMIT = 2


@dataclass(frozen=True)
class AlgoPerf:
    """One algorithm's verdict (cuDNN's cudnnConvolution*AlgoPerf_t).

    time is in milliseconds when measured by find_*, -1.0 for heuristic results (as in cuDNN v7);
    memory is the workspace in bytes; reason says why status is not SUCCESS.
    """
    algo: enum.Enum
    status: Status
    time: float
    memory: int
    determinism: Determinism
    math_type: MathType
    reason: str = ""


def time_call(handle, fn, repeats: int = 3) -> float:
    """Median milliseconds of ``fn()`` after one warm-up call; CUDA events on a GPU handle."""
    fn()
    times = []
    if handle.device.type == "cuda":
        cuda = handle.xp.cuda
        for _ in range(repeats):
            start, stop = cuda.Event(), cuda.Event()
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            times.append(cuda.get_elapsed_time(start, stop))
    else:
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


class AlgorithmCache:
    """Thread-safe map from a configuration key to the AlgoPerf that won ``find`` for it."""

    def __init__(self):
        self._lock = threading.Lock()
        self._entries = {}
        self.hits = 0
        self.misses = 0

    def get(self, key):
        with self._lock:
            perf = self._entries.get(key)
            if perf is None:
                self.misses += 1
            else:
                self.hits += 1
            return perf

    def put(self, key, perf):
        with self._lock:
            self._entries[key] = perf

    def clear(self):
        with self._lock:
            self._entries.clear()
            self.hits = self.misses = 0

    def snapshot(self) -> dict:
        """A copy of the entries, {key: AlgoPerf}, to inspect what was chosen."""
        with self._lock:
            return dict(self._entries)

    def __len__(self):
        return len(self._entries)


class AlgorithmRegistry:
    """The algorithms of one primitive direction, in registration order (the heuristic's tie-break)."""

    def __init__(self, name: str, enum_type):
        self.name = name
        self.enum_type = enum_type
        self._algorithms = {}
        self.cache = AlgorithmCache()
        # The heuristic's ranking costs far more than a small convolution (hundreds of µs of Python):
        # remember its choice per key too.  Not exposed as the benchmark cache: it holds no timings.
        self._heuristic_choice = {}
        # Told about every benchmark-cache miss (autotune.py: the on-disk cache and the report); None: nobody.
        # Never consulted on a hit or outside benchmark mode, so the hot path does not pay for it.
        self.observer = None

    def register(self, algorithm):
        if algorithm.algo in self._algorithms:
            raise ValueError(f"{self.name}: {algorithm.algo} registered twice")
        self._algorithms[algorithm.algo] = algorithm
        return algorithm

    def __iter__(self):
        return iter(self._algorithms.values())

    def get(self, algo):
        try:
            return self._algorithms[self.enum_type(algo)]
        except (ValueError, KeyError):
            raise BadParamError(f"{self.name}: algo={algo!r} is not a {self.enum_type.__name__}") from None

    # -- filtering -------------------------------------------------------------------------------------

    def _verdict(self, algorithm, prob, handle, workspace_limit):
        """(workspace bytes, None) when usable under the handle's settings, else (bytes or 0, reason)."""
        # a CUDA kernel asked for on the CPU says so before any rule about the problem
        reason = getattr(algorithm, "device_reason", lambda device_type: None)(handle.device.type) \
            or algorithm.unsupported_reason(prob)
        if reason is not None:
            return 0, reason
        ws = algorithm.workspace_size(prob)
        if handle.deterministic and not algorithm.deterministic(handle.device.type):
            return ws, (f"{algorithm.algo.name} is not deterministic on {handle.device.type} "
                        "and handle.deterministic is set")
        for limit, who in ((handle.workspace_limit, "handle.workspace_limit"), (workspace_limit, "workspace_limit")):
            if limit is not None and ws > limit:
                return ws, f"{algorithm.algo.name} needs {ws} bytes of workspace but {who} is {limit}"
        return ws, None

    def _perf(self, algorithm, handle, math_type, ws, reason, time_ms=-1.0):
        det = Determinism.DETERMINISTIC if algorithm.deterministic(handle.device.type) \
            else Determinism.NON_DETERMINISTIC
        status = Status.SUCCESS if reason is None else Status.NOT_SUPPORTED
        return AlgoPerf(algorithm.algo, status, time_ms, ws, det, math_type, reason or "")

    def require(self, algo, prob, handle):
        """The algorithm ``algo``, checked usable for ``prob``; NotSupportedError naming the rule otherwise."""
        algorithm = self.get(algo)
        _, reason = self._verdict(algorithm, prob, handle, None)
        if reason is not None:
            raise NotSupportedError(f"{self.name}: {self.enum_type.__name__}.{algorithm.algo.name} cannot run "
                                    f"{prob.describe()}: {reason}")
        return algorithm

    # -- heuristics, find, choose --------------------------------------------------------------------------

    def heuristic(self, prob, handle, math_type, preference=ConvolutionPreference.PREFER_FASTEST,
                  workspace_limit=None):
        """Every algorithm as an AlgoPerf (time -1): usable ones first, ranked by ``preference``."""
        preference = ConvolutionPreference(preference)
        if preference is not ConvolutionPreference.SPECIFY_WORKSPACE_LIMIT:
            workspace_limit = None
        usable, rejected = [], []
        for rank, algorithm in enumerate(self):
            ws, reason = self._verdict(algorithm, prob, handle, workspace_limit)
            perf = self._perf(algorithm, handle, math_type, ws, reason)
            if reason is None:
                cost = algorithm.estimated_cost(prob, handle.device.type)
                order = (ws, cost, rank) if preference is ConvolutionPreference.NO_WORKSPACE else (cost, rank)
                usable.append((order, perf))
            else:
                rejected.append(perf)
        return [perf for _, perf in sorted(usable, key=lambda t: t[0])] + rejected

    def find(self, prob, handle, math_type, run, repeats: int = 3):
        """Time every usable algorithm with ``run(algorithm)``; AlgoPerfs sorted by time, failures last."""
        timed, failed = [], []
        for algorithm in self:
            ws, reason = self._verdict(algorithm, prob, handle, None)
            if reason is None:
                try:
                    ms = time_call(handle, lambda: run(algorithm), repeats)
                    timed.append(self._perf(algorithm, handle, math_type, ws, None, ms))
                    continue
                except (NotSupportedError, MemoryError) as exc:    # e.g. CuPy's OutOfMemoryError
                    reason = f"{type(exc).__name__}: {exc}"
            failed.append(self._perf(algorithm, handle, math_type, ws, reason))
        return sorted(timed, key=lambda perf: perf.time) + failed

    def _benchmark(self, prob, handle, math_type, key, run):
        """A benchmark-cache miss: the observer's stored winner (an earlier run's find), else find now, whose
        measurements the observer is told; a successful winner is cached in memory."""
        observer = self.observer
        perf = None if observer is None else observer.lookup(self, key, prob, handle, math_type)
        if perf is None:
            results = self.find(prob, handle, math_type, run)
            perf = results[0]
            if observer is not None:
                observer.measured(self, key, prob, handle, math_type, results)
        if perf.status is Status.SUCCESS:
            self.cache.put(key, perf)
        return perf

    def choose(self, prob, handle, math_type, key, run):
        """The algorithm for algo=None: the cached find winner with handle.benchmark, else the heuristic's."""
        if handle.benchmark:
            perf = self.cache.get(key)
            if perf is None:
                perf = self._benchmark(prob, handle, math_type, key, run)
        else:
            perf = self._heuristic_choice.get(key)
            if perf is None:
                perf = self.heuristic(prob, handle, math_type)[0]
                if perf.status is Status.SUCCESS:
                    self._heuristic_choice[key] = perf
        if perf.status is not Status.SUCCESS:
            reasons = "; ".join(p.reason for p in self.heuristic(prob, handle, math_type))
            raise NotSupportedError(f"{self.name}: no algorithm can run {prob.describe()} with {handle}: {reasons}")
        return self._algorithms[perf.algo]

"""The persistent autotune cache and the autotune report of benchmark mode (handle.benchmark).

In benchmark mode the selector (algorithm_selection.py) times every usable convolution algorithm once per problem
and keeps the winner in memory.  This module is the selector's ``observer``, consulted only on a benchmark-cache miss
(never on a hit, never outside benchmark mode, so the hot path pays nothing):

* ``lookup``   before timing: the winner an earlier run stored on disk for the same problem, on the same device,
               driver and library versions;
* ``measured`` after timing: records every candidate's time, workspace and verdict for ``autotune_report()``, and
               stores the winner (with the candidates) on disk.

One JSON file per device identity (device name, driver/runtime or CPU/NumPy/BLAS identity, minidnn version, schema)
under ``autotune_cache_dir()``: ``$MINIDNN_CACHE_DIR``, else ``$XDG_CACHE_HOME/minidnn``, else ``~/.cache/minidnn``.
Read lazily at the first benchmark-mode miss of a process, written atomically (a temporary file in the same
directory, then ``os.replace``).  It is plain data: parsed with ``json.loads`` only, every field validated, every
algorithm name checked against its enum; a corrupt, truncated or foreign file is ignored with one
AutotuneCacheWarning and rewritten by the next measurement.  ``MINIDNN_AUTOTUNE_CACHE=0`` (or
``set_autotune_cache_enabled(False)``) turns the disk half off; the report still works.
"""
from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import json
import math
import numbers
import os
import platform
import re
import threading
import warnings
from pathlib import Path

from .algorithm_selection import AlgoPerf, Determinism
from .conv_algorithms import BACKWARD_DATA_ALGORITHMS, BACKWARD_FILTER_ALGORITHMS, FORWARD_ALGORITHMS
from .errors import Status
from .files import write_atomically
from .layout import TensorFormat
from .versioning import __version__

__all__ = ["AutotuneCacheWarning", "AutotuneReport", "ProblemReport", "CandidateReport", "autotune_report",
           "autotune_cache_enabled", "set_autotune_cache_enabled", "autotune_cache_dir", "autotune_cache_path",
           "clear_autotune_cache_files"]

SCHEMA = 1                                  # bump when the file's layout changes: older files are then ignored
_KIND = "minidnn.convolution_autotune"
_FILE_PREFIX = "conv_autotune_"
_MAX_FILE_BYTES = 32 << 20                  # a larger file is not ours (tens of thousands of problems at most)
_MAX_RECORDS = 10_000                       # report entries kept per process
_REGISTRIES = {r.name: r for r in (FORWARD_ALGORITHMS, BACKWARD_DATA_ALGORITHMS, BACKWARD_FILTER_ALGORITHMS)}
_FALSE = {"0", "false", "no", "off"}


class AutotuneCacheWarning(UserWarning):
    """The autotune cache file could not be read (ignored) or written (choices kept in memory only)."""


# ---- switches and places ---------------------------------------------------------------------------------------

_enabled_override = None    # set_autotune_cache_enabled(); None: the environment decides


def set_autotune_cache_enabled(enabled) -> None:
    """Turn the on-disk autotune cache on (True) or off (False) for this process; None: back to the environment
    (``MINIDNN_AUTOTUNE_CACHE``, on unless it is 0/false/no/off).  The in-memory benchmark cache is unaffected."""
    global _enabled_override
    _enabled_override = None if enabled is None else bool(enabled)


def autotune_cache_enabled() -> bool:
    """Whether benchmark mode reads and writes the on-disk autotune cache."""
    if _enabled_override is not None:
        return _enabled_override
    return os.environ.get("MINIDNN_AUTOTUNE_CACHE", "1").strip().lower() not in _FALSE


def autotune_cache_dir() -> Path:
    """``$MINIDNN_CACHE_DIR``, else ``$XDG_CACHE_HOME/minidnn`` (an absolute XDG path only, as the XDG spec says),
    else ``~/.cache/minidnn``.  Read at every use, so changing the variable takes effect at once."""
    explicit = os.environ.get("MINIDNN_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "minidnn"
    return Path.home() / ".cache" / "minidnn"


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown cpu"


def _blas_identity() -> str:
    import numpy as np
    try:
        deps = np.show_config(mode="dicts").get("Build Dependencies", {})
        blas = deps.get("blas", {})
        return f"{blas.get('name', '?')} {blas.get('version', '?')}"
    except Exception:          # older NumPy: no dict mode; the NumPy version still pins its wheel's BLAS
        return "unknown"


@functools.lru_cache(maxsize=None)
def _identity(device_type: str, index) -> tuple:
    """What a timing depends on besides the problem, as sorted (field, value) pairs."""
    ident = {"schema": SCHEMA, "minidnn": __version__, "device_type": device_type}
    if device_type == "cpu":
        import numpy as np
        ident.update(name=_cpu_name(), machine=platform.machine(), cpu_count=os.cpu_count() or 0,
                     numpy=np.__version__, blas=_blas_identity())
    else:
        from .devices import require_cupy
        cp = require_cupy()
        props = cp.cuda.runtime.getDeviceProperties(index or 0)
        name = props["name"]
        ident.update(name=name.decode(errors="replace") if isinstance(name, bytes) else str(name),
                     compute_capability=f"{props['major']}.{props['minor']}",
                     cuda_runtime=int(cp.cuda.runtime.runtimeGetVersion()),
                     cuda_driver=int(cp.cuda.runtime.driverGetVersion()), cupy=cp.__version__)
    return tuple(sorted(ident.items()))


def autotune_cache_path(device="cpu") -> Path:
    """The autotune file of ``device`` ("cpu", "cuda:N" or a Device): one per device identity and minidnn version,
    named after the device and a hash of its identity."""
    from .devices import device as _as_device
    dev = _as_device(device)
    ident = dict(_identity(dev.type, dev.index))
    digest = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]
    slug = re.sub(r"[^A-Za-z0-9]+", "-", f"{dev.type}-{ident['name']}").strip("-").lower()[:48]
    return autotune_cache_dir() / f"{_FILE_PREFIX}{slug}_{digest}.json"


def clear_autotune_cache_files() -> list:
    """Delete every autotune file in ``autotune_cache_dir()`` (all devices and versions) and forget what was loaded
    from them; returns the deleted paths.  ``clear_convolution_algorithm_cache(persistent=True)`` calls this."""
    removed = []
    folder = autotune_cache_dir()
    with _STORE.lock:
        _STORE.files.clear()
        if folder.is_dir():
            for path in sorted(folder.glob(f"{_FILE_PREFIX}*.json")):
                try:
                    path.unlink()
                    removed.append(path)
                except FileNotFoundError:
                    pass
    return removed


# ---- the report -------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class CandidateReport:
    """One algorithm's outcome for one problem.  ``category``: "chosen", "slower", "not_supported", "workspace"
    (over the workspace limit), "nondeterministic" (handle.deterministic excludes it) or "failed" (raised when run);
    ``verdict`` says it in a sentence."""
    algo: str
    time_ms: float | None
    memory: int
    category: str
    reason: str
    verdict: str


@dataclasses.dataclass(frozen=True)
class ProblemReport:
    """One convolution problem seen in benchmark mode and how its algorithm was chosen."""
    direction: str
    problem: object                 # the ConvProblem (channels-first shapes, padding, stride, dilation, groups, dtype)
    format: str
    math_type: str
    deterministic: bool
    workspace_limit: int | None
    device: str
    chosen: str | None
    source: str                     # "measured" (timed in this process) or "cache file" (timed by an earlier run)
    candidates: tuple

    def describe(self) -> str:
        p = self.problem
        head = (f"{self.direction}: x {p.x_shape} w {p.w_shape} -> y {p.y_shape}, padding {p.padding}, "
                f"stride {p.stride}, dilation {p.dilation}, groups {p.groups}")
        return (f"{head}\n    dtype {p.dtype}, layout {self.format}, math {self.math_type}, deterministic "
                f"{self.deterministic}, workspace_limit {self.workspace_limit}, device {self.device}")


def _bytes(n) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


class AutotuneReport(str):
    """``autotune_report()``'s answer: the text (print it) and ``.problems``, a list of ProblemReport."""

    problems: list

    def __new__(cls, problems):
        self = super().__new__(cls, _render(problems))
        self.problems = list(problems)
        return self

    def __repr__(self):
        return str(self)


def _render(problems) -> str:
    if not problems:
        return ("Convolution autotune report: no problem seen in benchmark mode yet "
                "(set handle.benchmark or minidnn.backends.cudnn.benchmark = True).")
    lines = [f"Convolution autotune report: {len(problems)} problem(s) seen in benchmark mode"]
    for i, pr in enumerate(problems, 1):
        lines.append(f"[{i}] {pr.describe()}")
        chosen = next((c for c in pr.candidates if c.category == "chosen"), None)
        where = "measured in this run" if pr.source == "measured" else "loaded from the cache file, timed earlier"
        if chosen is None:
            lines.append(f"    chosen: none -- no algorithm could run it ({where})")
        else:
            lines.append(f"    chosen: {chosen.algo}, {chosen.time_ms:.4f} ms, workspace {_bytes(chosen.memory)} "
                         f"({where})")
        width = max(len(c.algo) for c in pr.candidates)
        for c in pr.candidates:
            t = "-" if c.time_ms is None else f"{c.time_ms:.4f} ms"
            ws = "-" if c.category == "not_supported" else _bytes(c.memory)
            lines.append(f"      {c.algo:<{width}}  {t:>13}  {ws:>10}  {c.verdict}")
    return "\n".join(lines)


def autotune_report() -> AutotuneReport:
    """Per convolution problem seen in benchmark mode (timed in this process or loaded from the cache file): the
    problem, the chosen algorithm, every candidate's measured time and workspace, and why each other candidate lost
    (slower by x%, not supported and the registry's reason, over the workspace limit, non-deterministic while
    handle.deterministic, or failed when run).  ``print(autotune_report())`` shows it as a table; ``.problems``
    holds it as ProblemReport objects.  ``clear_convolution_algorithm_cache()`` empties it."""
    with _STORE.lock:
        return AutotuneReport(list(_STORE.records.values()))


def _verdict(category, reason, time_ms, best_ms):
    if category == "chosen":
        return "chosen (fastest)"
    if category == "slower":
        pct = (time_ms - best_ms) / best_ms * 100 if best_ms > 0 else math.inf
        return f"rejected: slower by {pct:.1f}% than the chosen one"
    label = {"not_supported": "not supported for this problem", "workspace": "over the workspace limit",
             "nondeterministic": "non-deterministic while handle.deterministic is set",
             "failed": "failed when run"}[category]
    return f"rejected: {label}: {reason}"


def _candidates(rows):
    """rows: (algo name, time or None, memory, category, reason) with the winner's category "chosen"."""
    best = next((t for _, t, _, cat, _ in rows if cat == "chosen"), None)
    return tuple(CandidateReport(a, t, m, cat, r, _verdict(cat, r, t, best)) for a, t, m, cat, r in rows)


def _classify(registry, perf, prob, handle) -> str:
    """Why find did not time ``perf``'s algorithm (it reports only the reason text)."""
    algorithm = registry.get(perf.algo)
    device_reason = getattr(algorithm, "device_reason", lambda device_type: None)(handle.device.type)
    if device_reason or algorithm.unsupported_reason(prob) is not None:
        return "not_supported"
    if handle.deterministic and not algorithm.deterministic(handle.device.type):
        return "nondeterministic"
    if handle.workspace_limit is not None and perf.memory > handle.workspace_limit:
        return "workspace"
    return "failed"


# ---- the key and the file ---------------------------------------------------------------------------------------

class _Unencodable(Exception):
    pass


def _encode(value):
    """A selector key -> plain JSON data (the same for equal keys in every process); _Unencodable otherwise."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, float) and math.isfinite(value):
        return value
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {"__type__": type(value).__name__,
                **{f.name: _encode(getattr(value, f.name)) for f in dataclasses.fields(value)}}
    if isinstance(value, tuple):
        return [_encode(v) for v in value]
    raise _Unencodable(type(value).__name__)


def _key_text(key):
    try:
        return json.dumps(_encode(key), sort_keys=True, separators=(",", ":"))
    except _Unencodable:
        return None


def _is_number(v, allow_none=False):
    if v is None:
        return allow_none
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0


_CATEGORIES = {"chosen", "slower", "not_supported", "workspace", "nondeterministic", "failed"}


def _check_entry(key, entry):
    """The problem with one stored entry, or None if it is well formed."""
    if not isinstance(key, str) or len(key) > 4096:
        return "an entry key is not a short string"
    if not isinstance(entry, dict):
        return f"entry {key[:60]}... is not an object"
    registry = _REGISTRIES.get(entry.get("direction"))
    if registry is None:
        return f"entry direction {entry.get('direction')!r} is not one of {sorted(_REGISTRIES)}"
    names = registry.enum_type.__members__
    if entry.get("algo") not in names:
        return f"algorithm {entry.get('algo')!r} is not a {registry.enum_type.__name__}"
    if not _is_number(entry.get("time_ms")) or not _is_number(entry.get("memory")):
        return f"entry for {entry['algo']} has no valid time_ms/memory"
    candidates = entry.get("candidates")
    if not isinstance(candidates, list) or len(candidates) > 64:
        return "an entry's candidates is not a list"
    for c in candidates:
        if not (isinstance(c, dict) and c.get("algo") in names and c.get("category") in _CATEGORIES
                and _is_number(c.get("time_ms"), allow_none=True) and _is_number(c.get("memory"))
                and isinstance(c.get("reason"), str)):
            return f"a candidate of {entry['algo']} is malformed: {str(c)[:120]}"
    return None


def _parse(text, identity):
    """(entries, None) for a valid file of this identity, else (None, why it is ignored)."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        return None, f"it is not valid JSON (corrupt or truncated: {exc})"
    if not isinstance(data, dict) or data.get("kind") != _KIND:
        return None, "it is not a minidnn convolution autotune file"
    if data.get("schema") != SCHEMA:
        return None, f"it has schema {data.get('schema')!r} but this minidnn reads schema {SCHEMA}"
    ident = data.get("identity")
    if ident != identity:
        if not isinstance(ident, dict):
            return None, "its device identity is missing"
        diff = ", ".join(f"{k} {ident.get(k)!r} (this run: {identity.get(k)!r})"
                         for k in sorted(set(ident) | set(identity)) if ident.get(k) != identity.get(k))
        return None, f"it was written for another device or version: {diff}"
    entries = data.get("entries")
    if not isinstance(entries, dict):
        return None, "its entries are missing"
    for key, entry in entries.items():
        why = _check_entry(key, entry)
        if why is not None:
            return None, f"it is malformed: {why}"
    return entries, None


def _warn(message):
    warnings.warn(f"minidnn autotune cache: {message}", AutotuneCacheWarning, stacklevel=2)


def _read(path, identity, warn):
    """The valid entries of ``path`` ({} if absent or ignored, with one warning when ``warn``)."""
    try:
        if path.stat().st_size > _MAX_FILE_BYTES:
            why = f"it is larger than {_MAX_FILE_BYTES} bytes"
        else:
            entries, why = _parse(path.read_text(encoding="utf-8"), identity)
            if why is None:
                return entries
    except (FileNotFoundError, NotADirectoryError):     # no file yet (writing it will say what is wrong, if anything)
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        why = f"it cannot be read ({type(exc).__name__}: {exc})"
    if warn:
        _warn(f"ignoring {path}: {why}. Benchmark mode times the algorithms again and rewrites the file.")
    return {}


def _write(path, identity, entries):
    """Write ``entries`` to ``path`` atomically (backend/files.py: the user's normal permissions; readers see the old
    file or the new, never half)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"kind": _KIND, "schema": SCHEMA, "identity": identity, "entries": entries},
                      indent=1, sort_keys=True)
    write_atomically(path, lambda f: f.write(text.encode("utf-8")))


# ---- the observer the selector calls on a benchmark-cache miss --------------------------------------------------

def _never_raises(hook):
    """The cache and the report are an optimisation and a diagnostic: a failure in them (an unreadable device
    property, a full disk) must not fail the convolution.  It warns and the selector carries on without them."""
    @functools.wraps(hook)
    def guarded(*args, **kwargs):
        try:
            return hook(*args, **kwargs)
        except Exception as exc:
            _warn(f"{hook.__name__} failed ({type(exc).__name__}: {exc}); carrying on without the autotune cache")
            return None
    return guarded


class _Store:
    def __init__(self):
        self.lock = threading.RLock()
        self.files = {}             # path -> {key text: entry}, loaded lazily
        self.unwritable = set()     # paths whose write failed once (warned once)
        self.records = {}           # selector key -> ProblemReport, in the order first seen

    def forget(self):
        with self.lock:
            self.files.clear()
            self.unwritable.clear()
            self.records.clear()

    def _entries(self, path, identity):
        entries = self.files.get(path)
        if entries is None:
            entries = self.files[path] = _read(path, identity, warn=True)
        return entries

    def _record(self, key, report):
        if key in self.records or len(self.records) < _MAX_RECORDS:
            self.records[key] = report

    @staticmethod
    def _problem_report(registry, key, prob, handle, math_type, chosen, source, rows):
        fmt = next((k for k in key if isinstance(k, TensorFormat)), TensorFormat.NCHW) \
            if isinstance(key, tuple) else TensorFormat.NCHW
        return ProblemReport(registry.name, prob, fmt.name, math_type.name, handle.deterministic,
                             handle.workspace_limit, str(handle.device), chosen, source, _candidates(rows))

    # -- the two hooks --------------------------------------------------------------------------------------------

    @_never_raises
    def lookup(self, registry, key, prob, handle, math_type):
        """The winner stored by an earlier run, as an AlgoPerf, if it can still run this problem; else None."""
        if not autotune_cache_enabled():
            return None
        text = _key_text(key)
        if text is None:
            return None
        with self.lock:
            path = autotune_cache_path(handle.device)
            entry = self._entries(path, dict(_identity(handle.device.type, handle.device.index))).get(text)
            if entry is None or entry["direction"] != registry.name:
                return None
            algorithm = registry.get(registry.enum_type[entry["algo"]])
            ws, reason = registry._verdict(algorithm, prob, handle, None)
            if reason is not None:      # e.g. handle.workspace_limit changed meaning: time again
                return None
            rows = [(c["algo"], c["time_ms"], c["memory"], c["category"], c["reason"]) for c in entry["candidates"]]
            self._record(key, self._problem_report(registry, key, prob, handle, math_type, entry["algo"],
                                                   "cache file", rows))
        det = Determinism.DETERMINISTIC if algorithm.deterministic(handle.device.type) \
            else Determinism.NON_DETERMINISTIC
        return AlgoPerf(algorithm.algo, Status.SUCCESS, float(entry["time_ms"]), ws, det, math_type, "")

    @_never_raises
    def measured(self, registry, key, prob, handle, math_type, results):
        """What find measured for a benchmark-cache miss: kept for the report, the winner stored on disk."""
        winner = results[0] if results and results[0].status is Status.SUCCESS else None
        rows = []
        for perf in results:
            if perf.status is Status.SUCCESS:
                category = "chosen" if perf is winner else "slower"
                rows.append((perf.algo.name, float(perf.time), int(perf.memory), category, ""))
            else:
                rows.append((perf.algo.name, None, int(perf.memory), _classify(registry, perf, prob, handle),
                             perf.reason))
        chosen = None if winner is None else winner.algo.name
        with self.lock:
            self._record(key, self._problem_report(registry, key, prob, handle, math_type, chosen, "measured", rows))
        if winner is None or not autotune_cache_enabled():
            return
        text = _key_text(key)
        if text is None:
            return
        entry = {"direction": registry.name, "algo": winner.algo.name, "time_ms": float(winner.time),
                 "memory": int(winner.memory),
                 "candidates": [{"algo": a, "time_ms": t, "memory": m, "category": c, "reason": r}
                                for a, t, m, c, r in rows]}
        with self.lock:
            path = autotune_cache_path(handle.device)
            identity = dict(_identity(handle.device.type, handle.device.index))
            entries = self._entries(path, identity)
            entries[text] = entry
            if path in self.unwritable:
                return
            try:
                # entries another process stored since we read the file are kept (ours win on the same key)
                merged = {**_read(path, identity, warn=False), **entries}
                entries.update(merged)
                _write(path, identity, merged)
            except OSError as exc:
                self.unwritable.add(path)
                _warn(f"cannot write {path} ({type(exc).__name__}: {exc}); the tuned choices of this run stay "
                      "in memory only")


_STORE = _Store()


def forget(persistent: bool = False) -> None:
    """Drop the report and what was loaded from disk (the next benchmark miss reads the file again, as a new
    process would); ``persistent`` also deletes the files.  Called by clear_convolution_algorithm_cache()."""
    _STORE.forget()
    if persistent:
        clear_autotune_cache_files()


for _registry in _REGISTRIES.values():
    _registry.observer = _STORE

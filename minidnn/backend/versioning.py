"""The backend's version and its deprecation policy, as code.

Policy (docs/backend.md):
* A primitive whose signature changes incompatibly gets a new name with a ``_vN`` suffix
  (``foo`` -> ``foo_v2`` -> ``foo_v3``); the old name keeps working.
* The old name becomes a thin wrapper, made by ``deprecated_alias``, that calls the replacement and
  emits a DeprecationWarning naming the replacement and the release that removes the old name.
* Removal comes two minor releases after the deprecation (deprecated in 0.3 -> removed in 0.5.0).
  ``overdue_deprecations()`` lists aliases past their removal release; a test keeps it empty.

The version string is written once, in pyproject.toml: the installed package's metadata carries it, and a
source checkout that was never installed reads it from pyproject.toml beside the package.
"""
from __future__ import annotations

import dataclasses
import functools
import re
import warnings

__all__ = ["__version__", "version", "parse_version", "removal_release", "versioned_name", "deprecated_alias",
           "Deprecation", "DEPRECATIONS", "overdue_deprecations"]

def _read_version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as _dist_version
    try:
        return _dist_version("minidnn")
    except PackageNotFoundError:
        from pathlib import Path
        pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
        try:
            m = re.search(r'^version\s*=\s*"([^"]+)"', pyproject.read_text(), re.MULTILINE)
        except OSError:
            m = None
        return m.group(1) if m else "0+unknown"


__version__ = _read_version()


def parse_version(text: str) -> tuple:
    """'1.2.3', '1.2' or '1.2.3rc1+local' -> (1, 2, 3) (missing parts are 0, suffixes dropped)."""
    m = re.match(r"^\s*(\d+)(?:\.(\d+))?(?:\.(\d+))?", str(text))
    if not m:
        raise ValueError(f"cannot parse version {text!r}: expected MAJOR[.MINOR[.PATCH]]")
    return tuple(int(g or 0) for g in m.groups())


def version() -> tuple:
    """(major, minor, patch) of this minidnn, like cudnnGetVersion but as a tuple."""
    return parse_version(__version__)


def removal_release(since: str) -> str:
    """The release that removes a name deprecated in ``since``: two minor releases later."""
    major, minor, _ = parse_version(since)
    return f"{major}.{minor + 2}.0"


def versioned_name(name: str) -> str:
    """The name a changed signature gets: 'foo' -> 'foo_v2', 'foo_v2' -> 'foo_v3'."""
    m = re.fullmatch(r"(.*)_v(\d+)", name)
    return f"{m.group(1)}_v{int(m.group(2)) + 1}" if m else f"{name}_v2"


@dataclasses.dataclass(frozen=True)
class Deprecation:
    old_name: str
    new_name: str
    since: str
    removed_in: str

    @property
    def message(self) -> str:
        return (f"{self.old_name} is deprecated since minidnn {self.since} and will be removed in minidnn "
                f"{self.removed_in}; use {self.new_name} instead")


DEPRECATIONS: dict = {}   # old name -> Deprecation, filled by deprecated_alias


def deprecated_alias(old_name: str, new_func, since: str, removed_in: str | None = None, namespace: dict | None = None,
                     adapter=None):
    """A wrapper named ``old_name`` that warns (DeprecationWarning) and calls ``new_func``.

    ``adapter`` (for a signature that changed, the reason for a ``_vN`` name): a function taking the OLD
    arguments that calls ``new_func`` and shapes its result the old way; the alias calls it instead.
    ``removed_in`` defaults to two minor releases after ``since`` and may not be sooner than that.
    The alias is recorded in DEPRECATIONS; with ``namespace`` (e.g. a module's ``globals()``) it is
    also bound there under ``old_name``.
    """
    removed_in = removed_in or removal_release(since)
    if parse_version(removed_in) < parse_version(removal_release(since)):
        raise ValueError(f"deprecated_alias({old_name!r}): removed_in={removed_in} is sooner than the policy's "
                         f"two minor releases after {since} ({removal_release(since)})")
    record = Deprecation(old_name, new_func.__name__, since, removed_in)

    target = adapter or new_func

    @functools.wraps(target)
    def alias(*args, **kwargs):
        warnings.warn(record.message, DeprecationWarning, stacklevel=2)
        return target(*args, **kwargs)

    alias.__name__ = alias.__qualname__ = old_name
    alias.__doc__ = f"Deprecated alias of {record.new_name} (removed in {removed_in}).\n\n{target.__doc__ or ''}"
    alias.__deprecation__ = record
    DEPRECATIONS[old_name] = record
    if namespace is not None:
        namespace[old_name] = alias
    return alias


def overdue_deprecations(current: str | None = None) -> list:
    """Aliases whose removal release is at or before ``current`` (default: this version)."""
    now = parse_version(current or __version__)
    return [d for d in DEPRECATIONS.values() if parse_version(d.removed_in) <= now]

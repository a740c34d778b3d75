"""The fuzz suite's two profiles.

``python -m pytest`` runs the fast profile (a few examples per op, part of CI).  ``python -m pytest -m fuzz``
runs the long profile: every op with ``MINIDNN_FUZZ_EXAMPLES`` examples (default 1,300, i.e. > 50,000 over
the table).  Tests marked ``fuzz`` are skipped unless the ``-m`` expression selects them.
"""
import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "fuzz: the long hypothesis profile (run with -m fuzz)")


def pytest_collection_modifyitems(config, items):
    if "fuzz" in (config.option.markexpr or ""):
        return
    skip = pytest.mark.skip(reason="long fuzz profile: run with `python -m pytest -m fuzz`")
    for item in items:
        if item.get_closest_marker("fuzz") is not None:
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    import sys
    module = sys.modules.get("test_fuzz_vs_torch") or sys.modules.get("tests.fuzz.test_fuzz_vs_torch")
    counts = getattr(module, "EXAMPLES_RUN", None)
    if counts:
        terminalreporter.write_line(f"fuzz: {sum(counts.values())} examples completed over {len(counts)} ops "
                                    f"(min {min(counts.values())} per op)")

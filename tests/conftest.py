"""Shared fixtures: every device-dependent test takes the ``device`` fixture (cpu, cuda).

cuda cases carry the ``cuda`` mark and skip cleanly where CuPy or a GPU is missing, so
``pytest -m cuda`` on the device machine runs exactly the GPU half of every table.
"""
import atexit
import os
import shutil
import sys
import tempfile

import numpy as np
import pytest

# The suite never touches the user's cache directory.  Benchmark mode's on-disk autotune cache is off by default
# under pytest (MINIDNN_AUTOTUNE_CACHE=0): tests that count find calls or cache misses after
# clear_convolution_algorithm_cache() would otherwise see winners an earlier test stored, so results would depend on
# test order.  And in case a test (or a subprocess it starts: examples, notebooks) turns it on without choosing a
# directory, MINIDNN_CACHE_DIR points at a throwaway folder.  Set here, at import, so it holds before any test and
# is inherited by subprocesses; tests of the cache itself (tests/backend/test_autotune.py) switch it on with
# monkeypatch and their own tmp_path.
os.environ["MINIDNN_AUTOTUNE_CACHE"] = "0"
os.environ["MINIDNN_CACHE_DIR"] = tempfile.mkdtemp(prefix="minidnn-test-cache-")
atexit.register(shutil.rmtree, os.environ["MINIDNN_CACHE_DIR"], True)

# Bytecode: with PYTHONDONTWRITEBYTECODE=1 (this machine's setting) every interpreter the suite starts -- ~220
# subprocesses (import-time switches, fake-GPU steps, examples, notebooks, launchers) and the xdist workers -- compiled
# minidnn from source again: 0.8 s of CPU to import it instead of 0.35 s, and pytest rewrote every test module's
# asserts afresh in each worker (~12 s).  The suite writes bytecode under a cache folder of its own in the temp
# directory (PYTHONPYCACHEPREFIX; never into the checkout), shared by its processes and later runs (a source newer
# than its .pyc is compiled again, as in __pycache__).  MINIDNN_TEST_PYC=0 leaves the user's setting alone.
if os.environ.get("MINIDNN_TEST_PYC", "1") != "0":
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ.setdefault("PYTHONPYCACHEPREFIX", sys.pycache_prefix or os.path.join(
        tempfile.gettempdir(), f"minidnn-test-pyc-{getattr(os, 'getuid', lambda: 0)()}"))
    sys.pycache_prefix = os.environ["PYTHONPYCACHEPREFIX"]
    sys.dont_write_bytecode = False

from minidnn.backend import devices as _dev  # noqa: E402  (after the environment above)


def _cuda_ok():
    return _dev.cuda_is_available()


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


@pytest.fixture
def cp():
    """CuPy for a cuda-marked test, which skips where CuPy or a GPU is missing (a module may define its own, e.g.
    with a compute-capability check)."""
    if not _cuda_ok():
        pytest.skip("no CUDA GPU with CuPy on this machine")
    return _dev.require_cupy()


@pytest.fixture(params=DEVICES)
def device(request):
    if request.param == "cuda" and not _cuda_ok():
        pytest.skip("no CUDA GPU with CuPy on this machine")
    return request.param


@pytest.fixture(autouse=True)
def _cudnn_flags_restored():
    """Each test starts from the flags and default-handle settings the previous one found.  ``cudnn.allow_tf32``
    (benchmark, deterministic) set by a test is copied onto this thread's default handles at the next nn op, and
    setting the flag back to None leaves the handle as configured (the documented "unset" meaning): without this, a
    TF32 test ran every later float32 call through default handles on tensor cores, and a strict-fp32 tolerance
    failed far away, in whatever test came next in that process."""
    from minidnn.backend import handle as H
    flags = (H.cudnn.benchmark, H.cudnn.deterministic, H.cudnn.allow_tf32)
    kept = {d: (h.math_type, h.benchmark, h.deterministic) for d, h in H._local.by_device.items()}
    yield
    H.cudnn.benchmark, H.cudnn.deterministic, H.cudnn.allow_tf32 = flags
    for d, h in H._local.by_device.items():
        h.math_type, h.benchmark, h.deterministic = kept.get(d, (H.MathType.DEFAULT, False, False))


@pytest.fixture
def xp(device):
    """The array module of the ``device`` fixture (numpy or cupy)."""
    return _dev.device(device).xp


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def pytest_collection_modifyitems(config, items):
    # The modules holding a test marked slow (the examples and notebooks: subprocesses of 2-9 s each) run first, each
    # whole and in its own order (module fixtures set up once).  Collected last, they ended an xdist run on one worker
    # while the other sat idle (~35 s of a ~400 s run).
    slow = {it.nodeid.split("::")[0] for it in items if it.get_closest_marker("slow")}
    items[:] = [it for it in items if it.nodeid.split("::")[0] in slow] + \
        [it for it in items if it.nodeid.split("::")[0] not in slow]
    # A test that is marked cuda but not parametrized over the device fixture still must skip cleanly.
    if _cuda_ok():
        return
    skip = pytest.mark.skip(reason="no CUDA GPU with CuPy on this machine")
    for item in items:
        if "cuda" in item.keywords and "device" not in getattr(item, "fixturenames", ()):
            item.add_marker(skip)


# ---- the fuzz suite's example count under pytest-xdist (-n) ------------------------------------------------------
# tests/fuzz/conftest.py prints "fuzz: N examples ..." from the process that ran the tests; under xdist that is each
# worker, whose summary nobody sees, and the controller never loads tests/fuzz/conftest.py.  The workers hand their
# counts over here and the controller prints the per-op sums.
_FUZZ_FROM_WORKERS = {}


def pytest_sessionfinish(session):
    out = getattr(session.config, "workeroutput", None)     # set in an xdist worker only
    if out is not None:
        import sys
        module = sys.modules.get("test_fuzz_vs_torch") or sys.modules.get("tests.fuzz.test_fuzz_vs_torch")
        out["fuzz_examples"] = dict(getattr(module, "EXAMPLES_RUN", None) or {})


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    for op, n in getattr(node, "workeroutput", {}).get("fuzz_examples", {}).items():
        _FUZZ_FROM_WORKERS[op] = _FUZZ_FROM_WORKERS.get(op, 0) + n


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    counts = _FUZZ_FROM_WORKERS
    if counts:
        terminalreporter.write_line(f"fuzz: {sum(counts.values())} examples completed over {len(counts)} ops "
                                    f"(min {min(counts.values())} per op, summed over the xdist workers)")


# ---- import-time environment switches, several settings in one interpreter ---------------------------------------
# A fresh interpreter that imports minidnn costs ~1 s of CPU; a test of a MINIDNN_* switch read at import used to
# start one per setting.  env_runs starts one for all the settings: the first setting's import is a true first import
# (the wiring from the environment at start-up), each later one re-executes the module that reads the variables
# (importlib.reload runs the same module-level code with the new environment).

_ENV_RUNNER = r"""
import contextlib, importlib, io, json, os, sys, traceback
module, code, drop, cases = json.loads(sys.stdin.read())
out = []
for i, env in enumerate(cases):
    for k in [k for k in os.environ if k.startswith(tuple(drop))]:
        del os.environ[k]
    os.environ.update(env)
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):
            if i and module in sys.modules:
                importlib.reload(sys.modules[module])
            exec(code, {"__name__": "__env_case__"})
        out.append([0, buf.getvalue(), ""])
    except BaseException:
        out.append([1, buf.getvalue(), traceback.format_exc()])
sys.stdout.write("\n@@ENV_RUNS@@" + json.dumps(out))
"""


@pytest.fixture
def env_runs():
    """``env_runs(module, code, cases, drop=())`` -> [(returncode, stdout, error text)] of ``code`` under each
    environment in ``cases`` (dicts added to this process's environment less the variables starting with a ``drop``
    prefix), in one fresh interpreter at the repository root; ``module`` (dotted name) reads the variables at
    import and is reloaded before every case after the first.  A case whose import raises gives returncode 1."""
    import json
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def run(module, code, cases, drop=()):
        cases = [dict(c) for c in cases]
        env = {k: v for k, v in os.environ.items() if not k.startswith(tuple(drop))}
        r = subprocess.run([sys.executable, "-c", _ENV_RUNNER], input=json.dumps([module, code, list(drop), cases]),
                           capture_output=True, text=True, cwd=root, env=env, timeout=300)
        assert r.returncode == 0 and "@@ENV_RUNS@@" in r.stdout, r.stderr[-2000:]
        return [tuple(x) for x in json.loads(r.stdout.split("@@ENV_RUNS@@", 1)[1])]

    return run

"""Benchmark mode's persistent autotune cache and autotune_report() (backend/autotune.py).

Every test runs with MINIDNN_CACHE_DIR in its own tmp_path and the cache switched on (the suite's conftest keeps it
off, and away from the user's home, everywhere else)."""
import json
import os
import stat
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import minidnn.backend as B
from minidnn.backend import (
    AutotuneCacheWarning,
    ConvolutionDescriptor,
    ConvolutionFwdAlgo,
    Handle,
    Status,
    autotune_cache_dir,
    autotune_cache_enabled,
    autotune_cache_path,
    autotune_report,
    clear_convolution_algorithm_cache,
    convolution_algorithm_cache_info,
    convolution_backward_data,
    convolution_backward_filter,
    convolution_forward,
    get_convolution_algorithm_cache,
    set_autotune_cache_enabled,
)
from minidnn.backend import autotune as AT
from minidnn.backend.conv_algorithms import BACKWARD_DATA_ALGORITHMS, BACKWARD_FILTER_ALGORITHMS, FORWARD_ALGORITHMS

REGISTRIES = (FORWARD_ALGORITHMS, BACKWARD_DATA_ALGORITHMS, BACKWARD_FILTER_ALGORITHMS)
X_SHAPE, W_SHAPE = (2, 3, 9, 8), (4, 3, 3, 3)
DESC = ConvolutionDescriptor(1)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("MINIDNN_CACHE_DIR", str(folder))
    monkeypatch.setenv("MINIDNN_AUTOTUNE_CACHE", "1")
    set_autotune_cache_enabled(None)
    clear_convolution_algorithm_cache()
    yield folder
    set_autotune_cache_enabled(None)
    clear_convolution_algorithm_cache()


@pytest.fixture
def finds(monkeypatch):
    """The directions find was called for (each call times every algorithm of one problem)."""
    calls = []
    for registry in REGISTRIES:
        real = registry.find
        monkeypatch.setattr(registry, "find", lambda *a, _real=real, _name=registry.name, **k:
                            calls.append(_name) or _real(*a, **k))
    return calls


def _arrays(seed=0, x_shape=X_SHAPE):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = rng.standard_normal(W_SHAPE).astype(np.float32)
    return x, w


def _run_all_directions(handle, x, w, desc=DESC):
    y = convolution_forward(handle, x, w, desc)
    dy = np.ones_like(y)
    return y, convolution_backward_data(handle, w, dy, desc, x.shape), \
        convolution_backward_filter(handle, x, dy, desc, w.shape)


def _chosen():
    return {key[0]: perf.algo for key, perf in get_convolution_algorithm_cache().items()}


# ---- the round trip -------------------------------------------------------------------------------------------

def test_second_run_reads_the_winners_and_times_nothing(cache_dir, finds):
    h = Handle("cpu", benchmark=True)
    x, w = _arrays()
    first = _run_all_directions(h, x, w)
    assert sorted(finds) == sorted(r.name for r in REGISTRIES)
    path = autotune_cache_path("cpu")
    assert path.parent == cache_dir and path.is_file()
    winners = _chosen()

    clear_convolution_algorithm_cache()                   # a new run: empty memory, the same file
    finds.clear()
    assert get_convolution_algorithm_cache() == {}
    second = _run_all_directions(h, x, w)
    assert finds == []                                    # nothing timed again
    assert _chosen() == winners                           # the existing cache API sees the loaded winners
    assert all(perf.status is Status.SUCCESS and perf.time >= 0 for perf in get_convolution_algorithm_cache().values())
    assert convolution_algorithm_cache_info()["convolution_forward"] == (0, 1, 1)
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)
    convolution_forward(h, x, w, DESC)                    # and the in-memory cache answers from then on
    assert convolution_algorithm_cache_info()["convolution_forward"] == (1, 1, 1)
    report = autotune_report()
    assert [p.source for p in report.problems] == ["cache file"] * 3
    assert {p.direction: p.chosen for p in report.problems} == {k: v.name for k, v in winners.items()}

    convolution_forward(h, *_arrays(x_shape=(1, 3, 9, 8)), DESC)   # another problem: timed, and added to the file
    assert finds == ["convolution_forward"]
    assert len(json.loads(path.read_text())["entries"]) == 4


def test_a_new_process_starts_tuned(cache_dir, finds):
    """The real thing: a separate Python process tunes and writes; this one reads and times nothing."""
    script = textwrap.dedent(f"""
        import numpy as np, minidnn.backend as B
        x = np.ones({X_SHAPE}, np.float32); w = np.ones({W_SHAPE}, np.float32)
        B.convolution_forward(B.Handle("cpu", benchmark=True), x, w, B.ConvolutionDescriptor(1))
        print(B.autotune_cache_path("cpu"))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=dict(os.environ),
                         check=True)
    assert out.stdout.strip() == str(autotune_cache_path("cpu"))
    convolution_forward(Handle("cpu", benchmark=True), np.ones(X_SHAPE, np.float32), np.ones(W_SHAPE, np.float32),
                        DESC)
    assert finds == []


def test_cache_file_is_plain_validated_json(cache_dir):
    _run_all_directions(Handle("cpu", benchmark=True), *_arrays())
    data = json.loads(autotune_cache_path("cpu").read_text())
    assert data["kind"] == "minidnn.convolution_autotune" and data["schema"] == AT.SCHEMA
    ident = data["identity"]
    assert ident["device_type"] == "cpu" and ident["minidnn"] == B.__version__
    assert {"name", "numpy", "blas", "machine"} <= set(ident)
    for key, entry in data["entries"].items():
        registry = {r.name: r for r in REGISTRIES}[entry["direction"]]
        assert entry["algo"] in registry.enum_type.__members__
        assert json.loads(key)[0] == entry["direction"]
        assert {c["algo"] for c in entry["candidates"]} == {a.algo.name for a in registry}


# ---- atomic writes and permissions --------------------------------------------------------------------------------

def test_write_is_atomic_and_leaves_no_temporary_file(cache_dir, monkeypatch):
    seen = []
    real_replace = os.replace

    def replace(src, dst):
        # at the moment of the swap: the temporary file is complete, the final name holds the old complete file
        assert os.path.dirname(src) == os.path.dirname(dst)
        json.loads(open(src).read())
        seen.append(json.loads(open(dst).read())["entries"] if os.path.exists(dst) else None)
        real_replace(src, dst)

    monkeypatch.setattr(AT.os, "replace", replace)
    h = Handle("cpu", benchmark=True)
    convolution_forward(h, *_arrays(), DESC)
    convolution_forward(h, *_arrays(x_shape=(1, 3, 9, 8)), DESC)
    assert seen[0] is None and len(seen[1]) == 1
    assert [p.name for p in cache_dir.iterdir()] == [autotune_cache_path("cpu").name]


@pytest.mark.skipif(os.name != "posix", reason="POSIX permission bits")
@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_file_has_the_users_normal_permissions(cache_dir, umask):
    old = os.umask(umask)
    try:
        convolution_forward(Handle("cpu", benchmark=True), *_arrays(), DESC)
    finally:
        os.umask(old)
    mode = stat.S_IMODE(autotune_cache_path("cpu").stat().st_mode)
    assert mode == 0o666 & ~umask


def test_a_failed_write_keeps_the_old_file_and_warns_once(cache_dir, monkeypatch):
    h = Handle("cpu", benchmark=True)
    convolution_forward(h, *_arrays(), DESC)
    path = autotune_cache_path("cpu")
    before = path.read_bytes()

    def full_disk(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(AT.os, "replace", full_disk)
    with pytest.warns(AutotuneCacheWarning, match="cannot write.*No space left") as record:
        y = convolution_forward(h, *_arrays(x_shape=(1, 3, 9, 8)), DESC)
        convolution_forward(h, *_arrays(x_shape=(3, 3, 9, 8)), DESC)       # no second warning for the same file
    assert len(record) == 1 and y.shape == (1, 4, 9, 8)
    assert path.read_bytes() == before
    assert [p.name for p in cache_dir.iterdir()] == [path.name]     # the temporary file was removed


def test_unusable_cache_directory_warns_and_convolution_still_runs(tmp_path, monkeypatch, cache_dir):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("MINIDNN_CACHE_DIR", str(blocker))
    with pytest.warns(AutotuneCacheWarning, match="cannot write") as record:
        y = convolution_forward(Handle("cpu", benchmark=True), *_arrays(), DESC)
    assert y.shape == (2, 4, 9, 8) and len(record) == 1


# ---- files that are not ours, or not whole -------------------------------------------------------------------------

def _mutations():
    def set_in(path_keys, value):
        def mutate(data):
            target = data
            for k in path_keys[:-1]:
                target = target[k]
            target[path_keys[-1]] = value
            return json.dumps(data)
        return mutate

    def first_entry(field, value):
        def mutate(data):
            next(iter(data["entries"].values()))[field] = value
            return json.dumps(data)
        return mutate

    return {
        "truncated": (lambda data: json.dumps(data)[:200], "not valid JSON"),
        "empty": (lambda data: "", "not valid JSON"),
        "binary": (lambda data: b"\x00\xff\xfe garbage", "cannot be read|not valid JSON"),
        "python code": (lambda data: "import os; os._exit(3)", "not valid JSON"),
        "a list": (lambda data: "[1, 2, 3]", "not a minidnn convolution autotune file"),
        "old schema": (set_in(["schema"], 0), "schema 0 but this minidnn reads schema 1"),
        "other device": (set_in(["identity", "name"], "Imaginary GPU 9000"), "another device or version: name"),
        "other minidnn": (set_in(["identity", "minidnn"], "0.0.1"), "another device or version: minidnn"),
        "unknown algorithm": (first_entry("algo", "__import__('os').system('echo hacked')"), "is not a Convolution"),
        "negative time": (first_entry("time_ms", -1.0), "no valid time_ms"),
        "bad direction": (first_entry("direction", "pooling"), "direction 'pooling'"),
    }


@pytest.mark.parametrize("case", list(_mutations()))
def test_corrupt_or_foreign_files_are_ignored_with_one_warning(cache_dir, finds, case):
    mutate, message = _mutations()[case]
    h = Handle("cpu", benchmark=True)
    x, w = _arrays()
    convolution_forward(h, x, w, DESC)
    path = autotune_cache_path("cpu")
    content = mutate(json.loads(path.read_text()))
    path.write_bytes(content if isinstance(content, bytes) else content.encode())

    clear_convolution_algorithm_cache()
    finds.clear()
    with pytest.warns(AutotuneCacheWarning, match=message) as record:
        y = convolution_forward(h, x, w, DESC)
        convolution_forward(h, *_arrays(x_shape=(1, 3, 9, 8)), DESC)        # a second miss: no second warning
    assert len(record) == 1 and str(path) in str(record[0].message)
    assert finds == ["convolution_forward"] * 2                     # timed again
    np.testing.assert_allclose(y, convolution_forward(None, x, w, DESC, algo=ConvolutionFwdAlgo.GEMM), rtol=1e-5,
                               atol=1e-5)
    data = json.loads(path.read_text())                               # and rewritten whole and valid
    assert data["schema"] == AT.SCHEMA and len(data["entries"]) == 2


def test_a_stored_winner_that_can_no_longer_run_is_timed_again(cache_dir, finds, monkeypatch):
    h = Handle("cpu", benchmark=True)
    x, w = _arrays()
    convolution_forward(h, x, w, DESC)
    winner = _chosen()["convolution_forward"]
    clear_convolution_algorithm_cache()
    finds.clear()
    algorithm = FORWARD_ALGORITHMS.get(winner)
    monkeypatch.setattr(algorithm, "unsupported_reason", lambda p: "withdrawn for this test")
    convolution_forward(h, x, w, DESC)
    assert finds == ["convolution_forward"] and _chosen()["convolution_forward"] != winner


# ---- switches, places, clearing -----------------------------------------------------------------------------------

@pytest.mark.parametrize("value, enabled", [("0", False), ("false", False), ("OFF", False), ("no", False),
                                            ("1", True), ("yes", True), ("", True)])
def test_environment_switch(monkeypatch, value, enabled):
    set_autotune_cache_enabled(None)
    monkeypatch.setenv("MINIDNN_AUTOTUNE_CACHE", value)
    assert autotune_cache_enabled() is enabled


def test_disabled_cache_neither_reads_nor_writes(cache_dir, finds, monkeypatch):
    h = Handle("cpu", benchmark=True)
    x, w = _arrays()
    convolution_forward(h, x, w, DESC)                  # written while enabled
    clear_convolution_algorithm_cache()
    finds.clear()
    monkeypatch.setenv("MINIDNN_AUTOTUNE_CACHE", "0")
    convolution_forward(h, x, w, DESC)
    assert finds == ["convolution_forward"]               # the file was not read
    convolution_forward(h, *_arrays(x_shape=(1, 3, 9, 8)), DESC)
    assert len(json.loads(autotune_cache_path("cpu").read_text())["entries"]) == 1     # nor written
    assert len(autotune_report().problems) == 2           # the report works without the disk


def test_function_switch_overrides_the_environment(cache_dir, finds):
    set_autotune_cache_enabled(False)
    assert not autotune_cache_enabled()
    convolution_forward(Handle("cpu", benchmark=True), *_arrays(), DESC)
    assert not cache_dir.exists()
    set_autotune_cache_enabled(None)
    assert autotune_cache_enabled()


def test_cache_directory_resolution(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MINIDNN_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert autotune_cache_dir() == tmp_path / "home" / ".cache" / "minidnn"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")        # the XDG spec: relative paths are invalid
    assert autotune_cache_dir() == tmp_path / "home" / ".cache" / "minidnn"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert autotune_cache_dir() == tmp_path / "xdg" / "minidnn"
    monkeypatch.setenv("MINIDNN_CACHE_DIR", str(tmp_path / "mine"))
    assert autotune_cache_dir() == tmp_path / "mine"
    assert autotune_cache_path("cpu").parent == tmp_path / "mine"
    assert autotune_cache_path("cpu").name.startswith("conv_autotune_cpu-")


def test_clear_persistent_deletes_the_file(cache_dir, finds):
    h = Handle("cpu", benchmark=True)
    x, w = _arrays()
    convolution_forward(h, x, w, DESC)
    assert autotune_cache_path("cpu").exists()
    clear_convolution_algorithm_cache(persistent=True)
    assert not autotune_cache_path("cpu").exists() and autotune_report().problems == []
    finds.clear()
    convolution_forward(h, x, w, DESC)
    assert finds == ["convolution_forward"]


def test_the_suite_keeps_away_from_the_users_cache():
    """conftest.py: the cache is off under pytest unless a test turns it on, and points at a throwaway folder."""
    assert os.environ["MINIDNN_AUTOTUNE_CACHE"] == "0"
    assert not autotune_cache_enabled()
    home_cache = os.path.join(os.path.expanduser("~"), ".cache")
    assert not str(autotune_cache_dir()).startswith(home_cache)


# ---- the report ----------------------------------------------------------------------------------------------------

def test_report_lists_the_choice_every_candidate_and_why_the_others_lost(cache_dir, capsys):
    h = Handle("cpu", benchmark=True)
    x, w = _arrays()
    y = convolution_forward(h, x, w, ConvolutionDescriptor(1, stride=2))       # stride 2: FFT/Winograd say no
    report = autotune_report()
    (problem,) = report.problems
    assert problem.direction == "convolution_forward" and problem.source == "measured"
    assert problem.problem.x_shape == X_SHAPE and problem.problem.y_shape == y.shape
    assert (problem.format, problem.math_type, problem.device) == ("NCHW", "DEFAULT", "cpu")
    assert {c.algo for c in problem.candidates} == {a.algo.name for a in FORWARD_ALGORITHMS}
    by_name = {c.algo: c for c in problem.candidates}
    chosen = by_name[problem.chosen]
    assert chosen.category == "chosen" and chosen.time_ms > 0 and chosen.memory > 0
    assert problem.chosen == _chosen()["convolution_forward"].name
    for c in problem.candidates:
        algorithm = FORWARD_ALGORITHMS.get(ConvolutionFwdAlgo[c.algo])
        if c.category == "slower":
            assert c.time_ms >= chosen.time_ms
            pct = (c.time_ms - chosen.time_ms) / chosen.time_ms * 100
            assert f"slower by {pct:.1f}%" in c.verdict
        elif c.category == "not_supported":
            reason = algorithm.device_reason("cpu") or algorithm.unsupported_reason(problem.problem)
            assert c.time_ms is None and c.reason == reason and reason in c.verdict
            assert "not supported for this problem" in c.verdict
        else:
            assert c.category == "chosen"
    assert by_name["FFT"].category == "not_supported" and "stride" in by_name["FFT"].reason
    assert {c.category for c in problem.candidates} == {"chosen", "slower", "not_supported"}

    print(autotune_report())
    text = capsys.readouterr().out
    assert str(report) == text.rstrip("\n") and repr(report) == str(report)
    for needle in ("convolution_forward", f"x {X_SHAPE}", f"w {W_SHAPE}", "stride (2, 2)", "padding (1, 1)",
                   "dilation (1, 1)", "groups 1", "dtype float32", "layout NCHW", "math DEFAULT",
                   f"chosen: {problem.chosen}", "measured in this run", "slower by", "not supported for this problem"):
        assert needle in text, needle
    for c in problem.candidates:
        assert c.algo in text


def test_report_names_workspace_and_determinism_rejections(cache_dir, monkeypatch):
    x, w = _arrays()
    fft = FORWARD_ALGORITHMS.get(ConvolutionFwdAlgo.FFT)
    monkeypatch.setattr(fft, "nondeterministic_on", ("cpu", "cuda"))    # a stand-in for an atomics-based kernel
    convolution_forward(Handle("cpu", benchmark=True, deterministic=True), x, w, DESC)
    (problem,) = autotune_report().problems
    fft_row = next(c for c in problem.candidates if c.algo == "FFT")
    assert fft_row.category == "nondeterministic" and problem.deterministic
    assert "non-deterministic while handle.deterministic is set" in fft_row.verdict

    clear_convolution_algorithm_cache()
    monkeypatch.undo()
    monkeypatch.setenv("MINIDNN_CACHE_DIR", str(cache_dir))
    monkeypatch.setenv("MINIDNN_AUTOTUNE_CACHE", "1")
    from minidnn.backend.conv_problem import make_problem
    p = make_problem("test", X_SHAPE, W_SHAPE, DESC, np.float32)
    sizes = sorted(a.workspace_size(p) for a in FORWARD_ALGORITHMS if a.supports(p) and a.device_reason("cpu") is None)
    limit = sizes[0]                                                      # only the leanest algorithm fits
    convolution_forward(Handle("cpu", benchmark=True, workspace_limit=limit), x, w, DESC)
    (problem,) = autotune_report().problems
    over = [c for c in problem.candidates if c.category == "workspace"]
    assert len(over) == sum(s > limit for s in sizes) >= 1
    assert all("over the workspace limit" in c.verdict and "handle.workspace_limit" in c.reason for c in over)
    assert problem.workspace_limit == limit and "workspace_limit " + str(limit) in str(autotune_report())


def test_report_is_empty_outside_benchmark_mode(cache_dir, finds):
    convolution_forward(Handle("cpu"), *_arrays(), DESC)
    assert finds == [] and autotune_report().problems == []
    assert "no problem seen in benchmark mode" in autotune_report()
    assert not cache_dir.exists()


def test_report_covers_every_direction_and_nhwc(cache_dir):
    x, w = _arrays()
    h = Handle("cpu", benchmark=True)
    x_nhwc = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    y = convolution_forward(h, x_nhwc, w, DESC, format="NHWC")
    convolution_backward_data(h, w, np.ones_like(y), DESC, x_nhwc.shape, format="NHWC")
    convolution_backward_filter(h, x_nhwc, np.ones_like(y), DESC, w.shape, format="NHWC")
    problems = autotune_report().problems
    assert [p.direction for p in problems] == [r.name for r in REGISTRIES]
    assert all(p.format == "NHWC" and p.chosen for p in problems)


def test_the_benchmark_flag_of_the_nn_layer_reaches_the_report(cache_dir):
    import minidnn
    import minidnn.nn.functional as F
    saved = minidnn.backends.cudnn.benchmark
    minidnn.backends.cudnn.benchmark = True
    try:
        F.conv2d(minidnn.tensor(np.ones(X_SHAPE, np.float32)), minidnn.tensor(np.ones(W_SHAPE, np.float32)),
                 padding=1)
    finally:
        minidnn.backends.cudnn.benchmark = saved
        B.get_default_handle().benchmark = False
    assert [p.direction for p in autotune_report().problems] == ["convolution_forward"]
    assert autotune_cache_path("cpu").exists()

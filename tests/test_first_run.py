"""Issue 16, a new user's first run: a light install (no PyTorch, scikit-learn, scipy or Jupyter needed to train
and plot), README's commands equal to CI's, oracle tests that skip without PyTorch, the thread default, and the
small frictions (progress switch, --resume without a checkpoint, summary without a batch dimension, graph
drawing without Graphviz, plot ticks, checkpoint permissions)."""
import ast
import importlib
import os
import re
import stat
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest

import minidnn as mdn
import minidnn.nn as nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
_common = importlib.import_module("_common")


# ---- install: what the package needs, what README and CI say -------------------------------------------------
def _pyproject():
    tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _names(requirements):
    return {re.split(r"[<>=!~\[ ;]", r, maxsplit=1)[0].lower().replace("_", "-") for r in requirements}


def test_core_dependencies_are_light_and_the_oracle_is_in_the_dev_extra():
    project = _pyproject()["project"]
    core = _names(project["dependencies"])
    assert {"numpy", "tqdm", "matplotlib", "threadpoolctl"} <= core
    assert not core & {"torch", "scikit-learn", "scipy", "jupyter", "notebook", "ipykernel", "nbclient"}
    dev = project["optional-dependencies"]["dev"]
    assert {"pytest", "pytest-xdist", "hypothesis", "nbclient", "nbformat", "ipykernel", "torch"} <= _names(dev)
    assert "torch==2.13.0" in dev
    assert "scikit-learn" not in _names(dev)
    package_data = _pyproject()["tool"]["setuptools"]["package-data"]["minidnn.data"]
    assert "digits.npz" in package_data and (ROOT / "minidnn" / "data" / "digits.npz").is_file()


def test_readme_first_commands_and_ci_agree():
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", readme, re.S)
    first = [line.split("#")[0].strip() for line in blocks[0].strip().splitlines()]
    assert first == ["pip install -e .", "python examples/train_lenet.py"]
    assert "--index-url https://download.pytorch.org/whl/cpu" in readme and "torch==2.13.0" in readme
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line.strip() and not line.startswith("#")]
    test_block = [line.split("#")[0].strip() for line in blocks[1].strip().splitlines()]
    # -n auto (pytest-xdist, in the dev extra): one worker per core keeps CI's 2-core run well under 10 minutes
    assert test_block == ['pip install -e ".[dev]"', "python -m pytest -q -n auto"]
    for command in test_block:             # CI runs README's test commands, in order
        assert command in ci
    assert ci.index(test_block[0]) < ci.index(test_block[1])


def _unguarded_torch_imports(tree):
    """`import torch` statements not under a try that catches ImportError."""
    found = []

    def visit(node, guarded):
        if isinstance(node, ast.Try):
            catches = any(h.type is None or "ImportError" in ast.dump(h.type) or "Exception" in ast.dump(h.type)
                          for h in node.handlers)
            for child in node.body:
                visit(child, guarded or catches)
            for child in node.handlers + node.orelse + node.finalbody:
                visit(child, guarded)
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)) and not guarded:
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            if any(n == "torch" or n.startswith("torch.") for n in names):
                found.append(node.lineno)
        for child in ast.iter_child_nodes(node):
            visit(child, guarded)
    visit(tree, False)
    return found


def test_no_test_imports_torch_without_a_clean_skip():
    # The oracle is optional: every `import torch` in the tests sits under try/except ImportError (the tests then
    # skip with pytest.importorskip's or their own reason), or is pytest.importorskip itself.
    offenders = {}
    for path in (ROOT / "tests").rglob("*.py"):
        lines = _unguarded_torch_imports(ast.parse(path.read_text()))
        if lines:
            offenders[str(path.relative_to(ROOT))] = lines
    assert not offenders, f"unguarded `import torch` (use pytest.importorskip('torch', reason=...)): {offenders}"


def test_training_needs_neither_torch_nor_scikit_learn_nor_scipy():
    # A fresh process where those imports fail, as in a venv made by `pip install -e .`: the bundled digits
    # load, a LeNet step runs, the plot is drawn.
    code = textwrap.dedent("""
        import sys, importlib.abc
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("torch", "sklearn", "scipy", "IPython", "jupyter_client"):
                    raise ImportError(f"{name} is blocked in this test")
        sys.meta_path.insert(0, Block())
        import minidnn as mdn, minidnn.nn.functional as F
        from minidnn.data.datasets import load_digits
        from minidnn.models import LeNet5
        x, y = load_digits("train", as_tensors=True)
        model = LeNet5(10, 1, 8)
        opt = mdn.optim.Adam(model.parameters(), lr=1e-2)
        loss = F.cross_entropy(model(x[:64]), y[:64]); loss.backward(); opt.step()
        import matplotlib; matplotlib.use("Agg"); import matplotlib.pyplot as plt
        plt.plot([1, 2]); plt.savefig(sys.argv[1])
        print("ok", x.shape)
    """)
    out = subprocess.run([sys.executable, "-c", code, os.devnull], capture_output=True, text=True, timeout=120,
                         cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok (1437, 1, 8, 8)"


# ---- threads ---------------------------------------------------------------------------------------------
@pytest.fixture
def restore_threads():
    before = mdn.get_num_threads()
    yield
    mdn.set_num_threads(before)


def test_set_and_get_num_threads(restore_threads):
    mdn.set_num_threads(1)
    assert mdn.get_num_threads() == 1
    mdn.set_num_threads(2)
    assert mdn.get_num_threads() == 2
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="positive int"):
            mdn.set_num_threads(bad)


@pytest.mark.parametrize("cpus, expected", [(1, 1), (2, 1), (4, 2), (8, 4), (64, 8)])
def test_default_is_half_the_cpus_between_1_and_8(monkeypatch, cpus, expected):
    monkeypatch.setattr(mdn.backend.threads, "_available_cpus", lambda: cpus)
    assert mdn.backend.threads.default_num_threads() == expected


def _threads_in_fresh_process(**env):
    full = {k: v for k, v in os.environ.items()
            if k not in ("MINIDNN_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
    full.update(env)
    out = subprocess.run([sys.executable, "-c", "import minidnn; print(minidnn.get_num_threads())"], env=full,
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    return int(out.stdout)


def test_import_applies_the_default_and_respects_the_users_choice():
    assert _threads_in_fresh_process() == mdn.backend.threads.default_num_threads()
    assert _threads_in_fresh_process(MINIDNN_NUM_THREADS="3") == 3
    # the library's own variable stands (OpenBLAS caps it at the CPU count)
    assert _threads_in_fresh_process(OPENBLAS_NUM_THREADS="2") == min(2, os.cpu_count())


# ---- frictions -------------------------------------------------------------------------------------------
def test_progress_switch(monkeypatch):
    monkeypatch.delenv("MINIDNN_PROGRESS", raising=False)
    assert _common.progress_disabled(True) is None          # tqdm decides: bars only on a terminal
    assert _common.progress_disabled(False) is True          # --no-progress
    monkeypatch.setenv("MINIDNN_PROGRESS", "0")
    assert _common.progress_disabled(True) is True
    monkeypatch.setenv("MINIDNN_PROGRESS", "1")
    assert _common.progress_disabled(True) is False and _common.progress_disabled(False) is True
    args = _common.make_parser("x", "d", epochs=1, batch_size=1, lr=0.1).parse_args(["--no-progress"])
    assert args.progress is False


def test_no_progress_bar_when_stderr_is_not_a_terminal(tmp_path):
    out = subprocess.run([sys.executable, "examples/train_lenet.py", "--epochs", "1", "--limit", "2",
                          "--out", str(tmp_path)], capture_output=True, text=True, timeout=120, cwd=ROOT,
                         env={**os.environ, "MINIDNN_PROGRESS": ""})
    assert out.returncode == 0, out.stderr
    assert "it/s" not in out.stderr and "%|" not in out.stderr


def test_resume_without_a_checkpoint_is_a_clear_message(tmp_path):
    import train_lenet
    with pytest.raises(SystemExit) as exc:
        train_lenet.main(["--epochs", "1", "--limit", "1", "--out", str(tmp_path), "--resume"])
    message = str(exc.value)
    assert "no checkpoint at" in message and str(tmp_path / _common.CHECKPOINT_NAME) in message
    with pytest.raises(SystemExit, match="missing.mdn"):
        train_lenet.main(["--epochs", "1", "--out", str(tmp_path), "--resume", str(tmp_path / "missing.mdn")])


def test_summary_without_batch_dimension_hints_at_it():
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU())
    with pytest.raises(ValueError) as exc:
        mdn.summary(model, (1, 8, 8), verbose=0)
    text = str(exc.value)
    assert "(1, 8, 8)" in text and "batch dimension" in text and "(1, 1, 8, 8)" in text and "batch_size=1" in text
    assert mdn.summary(model, (1, 8, 8), batch_size=1, verbose=0).rows[-1].output_shapes == [(1, 4, 8, 8)]


def _graph():
    x = mdn.ones(3, requires_grad=True)
    return (x * 2).sum()


def test_draw_without_graphviz_saves_dot_and_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setattr(mdn.viz.shutil, "which", lambda name: None)
    with pytest.warns(UserWarning, match="apt-get install graphviz"):
        path = mdn.viz.draw(_graph(), tmp_path / "g.png")
    assert path == str(tmp_path / "g.dot") and Path(path).read_text().startswith("digraph")
    assert not (tmp_path / "g.png").exists()
    monkeypatch.setitem(sys.modules, "graphviz", None)           # no graphviz Python package either
    with pytest.warns(UserWarning, match="graphviz"):
        assert mdn.viz.render("digraph { a -> b }") == "digraph { a -> b }"


def test_draw_with_graphviz_renders_the_picture(tmp_path, monkeypatch):
    # a stand-in `dot` that records its arguments and writes the output file, so no Graphviz is needed here
    fake = tmp_path / "bin" / "dot"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho \"$@\" > \"$(dirname \"$0\")/args\"\nwhile [ $# -gt 0 ]; do "
                    "if [ \"$1\" = -o ]; then echo '<svg/>' > \"$2\"; fi; shift; done\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        path = mdn.viz.draw(_graph(), tmp_path / "g.svg")
    assert path == str(tmp_path / "g.svg") and Path(path).read_text().strip() == "<svg/>"
    assert (tmp_path / "g.dot").is_file() and "-Tsvg" in (fake.parent / "args").read_text()


def test_plot_has_integer_epoch_ticks_and_distinguishable_curves(tmp_path):
    history = {"train_loss": [1.0, 0.5, 0.4], "test_loss": [0.9, 0.6, 0.5], "train_acc": [0.5, 0.8, 0.9],
               "test_acc": [0.6, 0.8, 0.85], "epoch_seconds": [1, 1, 1]}
    fig = _common.plot_history(history, tmp_path / "curves.png")
    assert (tmp_path / "curves.png").stat().st_size > 0
    for ax in fig.axes:
        ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
        assert ticks and all(float(t).is_integer() for t in ticks), ticks
        train, test = ax.get_lines()
        assert train.get_color() != test.get_color()
        assert (train.get_linestyle(), train.get_marker()) != (test.get_linestyle(), test.get_marker())


@pytest.fixture
def umask():
    def set_(mask):
        os.umask(mask)
    before = os.umask(0o022)
    yield set_
    os.umask(before)


@pytest.mark.skipif(not hasattr(os, "fchmod"), reason="POSIX file modes only")
def test_checkpoints_get_normal_permissions(tmp_path, umask):
    path = tmp_path / "ck.mdn"
    umask(0o022)
    mdn.save({"w": mdn.ones(2)}, path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644            # as open() would make it
    path.chmod(0o640)
    mdn.save({"w": mdn.ones(3)}, path)                           # replacing keeps the file's mode
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert np.array_equal(mdn.load(path)["w"].numpy(), np.ones(3, np.float32))
    umask(0o077)
    other = tmp_path / "private.mdn"
    mdn.save({}, other)
    assert stat.S_IMODE(other.stat().st_mode) == 0o600
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]      # still written atomically


def test_parallel_map_keeps_order_and_follows_the_thread_count(restore_threads):
    import threading

    from minidnn.backend.threads import parallel_map
    for n in (1, 2):
        mdn.set_num_threads(n)
        names, taken = set(), threading.Event()

        def square(i):
            names.add(threading.current_thread().name)
            if threading.current_thread() is not threading.main_thread():
                taken.set()
            elif i == 0 and n == 2:
                # the caller runs every part no pool thread has started once it is done with its own: give the pool
                # thread the time to start (on a loaded machine it may need milliseconds to get a core)
                taken.wait(10)
            return i * i
        out = parallel_map(square, range(6))
        assert out == [i * i for i in range(6)]
        assert (names == {threading.main_thread().name}) == (n == 1)

"""The teaching notebooks: each runs top to bottom without an error, and git holds them without outputs,
exactly as notebooks/_build.py generates them."""
import importlib.util
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")      # the teaching extra; absent on the GPU machine

NOTEBOOKS_DIR = Path(__file__).resolve().parents[1] / "notebooks"
NOTEBOOKS = sorted(NOTEBOOKS_DIR.glob("[0-9][0-9]_*.ipynb"))


def load_builder():
    spec = importlib.util.spec_from_file_location("notebooks_build", NOTEBOOKS_DIR / "_build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_generated_notebook_is_committed_and_up_to_date():
    builder = load_builder()
    assert sorted(f"{name}.ipynb" for name in builder.NOTEBOOKS) == [p.name for p in NOTEBOOKS]
    for name, cells in builder.NOTEBOOKS.items():
        assert (NOTEBOOKS_DIR / f"{name}.ipynb").read_text() == builder.render(cells), \
            f"{name}.ipynb differs from notebooks/_build.py: run python notebooks/_build.py"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_stored_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{path.name} cell {cell.id} has outputs"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_top_to_bottom(path):
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    # cwd = notebooks/, as when a reader opens it in Jupyter; CellExecutionError names the failing cell.
    NotebookClient(nb, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOKS_DIR)}}).execute()
    errors = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs if o.output_type == "error"]
    assert not errors

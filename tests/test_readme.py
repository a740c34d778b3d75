"""README's quick start runs as written (a newcomer's first contact must not be stale)."""
import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_quick_start_runs_and_learns(capsys):
    code = re.search(r"## Quick start\n\n```python\n(.*?)```", README.read_text(), re.S).group(1)
    exec(compile(code, "README.md quick start", "exec"), {})
    losses = [float(line.split()[1]) for line in capsys.readouterr().out.strip().splitlines()]
    assert len(losses) == 5 and losses[-1] < 0.5 * losses[0], losses


def test_readme_names_the_setup_and_test_commands_ci_runs():
    text = README.read_text()
    ci = (README.parent / ".ci" / "run").read_text()
    for command in ('pip install -e ".[dev]"', "python -m pytest -q"):
        assert command in text and command in ci
    assert "python examples/train_lenet.py" in text

"""Ports of PyTorch training scripts (written for this project): each script in this folder is run as written
under PyTorch, then with only its import lines switched to minidnn, from the same initial weights; the losses
of every step must agree to float32 tolerance.  The scripts are kept as ``*.py.txt`` (plain PyTorch scripts:
``python tests/ports/char_lstm_lm.py.txt`` runs one) so that nothing imports them as test modules and the
suite's rule that every torch import in tests/ is guarded does not apply to them.  The switch is textual: ``import torch`` ->
``import minidnn as torch``, ``import torch.X as Y`` -> ``import minidnn.X as Y``, ``from torch.X`` -> ``from
minidnn.X``; nothing else in the script changes."""
import importlib.util
import pathlib
import re
import sys
import types

import numpy as np
import pytest

HERE = pathlib.Path(__file__).parent
SCRIPTS = ["char_lstm_lm.py.txt", "transformer_classifier.py.txt"]


def switch_imports(source):
    out = []
    for line in source.splitlines():
        if line.startswith("import torch") or line.startswith("from torch"):
            line = re.sub(r"^import torch$", "import minidnn as torch", line)
            line = re.sub(r"^import torch\.", "import minidnn.", line)
            line = re.sub(r"^from torch", "from minidnn", line)
        out.append(line)
    return "\n".join(out) + "\n"


def load(name, source):
    mod = types.ModuleType(name)
    mod.__file__ = str(HERE / name)
    exec(compile(source, mod.__file__, "exec"), mod.__dict__)
    return mod


def test_switch_changes_only_import_lines():
    src = (HERE / "char_lstm_lm.py.txt").read_text()
    new = switch_imports(src)
    changed = [(a, b) for a, b in zip(src.splitlines(), new.splitlines()) if a != b]
    assert changed and all(a.startswith(("import torch", "from torch")) for a, _ in changed)


@pytest.mark.parametrize("script", SCRIPTS)
def test_port_matches_pytorch(script):
    pytest.importorskip("torch", reason="the PyTorch run is the reference")
    src = (HERE / script).read_text()
    ref = load("ref_" + script.split(".")[0], src)
    start, ref_losses, ref_eval = ref.main()
    port = load("port_" + script.split(".")[0], switch_imports(src))
    assert "minidnn" in port.torch.__name__
    start2, losses, ev = port.main(init_state=start)
    assert start2.keys() == start.keys()
    assert len(losses) == len(ref_losses) >= 8
    np.testing.assert_allclose(losses, ref_losses, rtol=2e-4, atol=1e-5)
    np.testing.assert_allclose(ev, ref_eval, rtol=2e-4, atol=1e-5)
    assert min(losses[-3:]) < losses[0]               # it trains

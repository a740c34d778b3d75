"""The examples' --save-every / --resume: a run interrupted mid-epoch and resumed from its last mid-epoch
checkpoint ends bit for bit where the uninterrupted run ends (same batches, augmentation, dropout masks)."""
import importlib
import sys
from pathlib import Path

import numpy as np
import pytest

import minidnn as mdn
from minidnn import models
from minidnn.nn import functional as F

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
sys.path.insert(0, str(EXAMPLES))
_common = importlib.import_module("_common")


class Interrupted(Exception):
    pass


def _run(argv):
    return importlib.import_module("train_lenet").main(argv)


@pytest.fixture
def dropout_lenet(monkeypatch):
    """LeNet with dropout on its logits: the resumed run must restore the cpu generator for the masks to match."""
    forward = models.LeNet5.forward
    monkeypatch.setattr(models.LeNet5, "forward", lambda self, x: F.dropout(forward(self, x), 0.3, self.training))


@pytest.mark.parametrize("stop_epoch,stop_step", [(0, 4), (1, 2)])
def test_mid_epoch_resume_equals_straight_run(tmp_path, monkeypatch, capsys, dropout_lenet, stop_epoch, stop_step,
                                              device):
    """Bit for bit on the cpu; on a GPU to float tolerance (its reductions may use atomics), the dropout masks
    coming from the GPU generator whose (seed, offset) state the checkpoint carries."""
    argv = ["--epochs", "2", "--limit", "6", "--save-every", "2", "--batch-size", "16", "--no-progress",
            "--device", device]
    _run(argv + ["--out", str(tmp_path / "straight")])
    straight = mdn.load(tmp_path / "straight" / _common.CHECKPOINT_NAME)
    straight_line = capsys.readouterr().out.strip().splitlines()[-1]

    real_save = _common.save_checkpoint

    def save_then_die(path, model, optimizer, scheduler, epoch, history, partial=None):
        real_save(path, model, optimizer, scheduler, epoch, history, partial)
        if partial is not None and epoch == stop_epoch and partial["done"][0] == stop_step:
            raise Interrupted
    monkeypatch.setattr(_common, "save_checkpoint", save_then_die)
    with pytest.raises(Interrupted):
        _run(argv + ["--out", str(tmp_path / "resumed")])
    saved = mdn.load(tmp_path / "resumed" / _common.CHECKPOINT_NAME)
    assert saved["epoch"] == stop_epoch and saved["partial"]["done"][0] == stop_step
    monkeypatch.setattr(_common, "save_checkpoint", real_save)
    capsys.readouterr()

    _run(argv + ["--out", str(tmp_path / "resumed"), "--resume"])
    out = capsys.readouterr().out
    assert f"step {stop_step}" in out
    resumed = mdn.load(tmp_path / "resumed" / _common.CHECKPOINT_NAME)
    assert resumed["epoch"] == straight["epoch"] == 2
    exact = device == "cpu"
    if exact:
        assert out.strip().splitlines()[-1] == straight_line
    for key in set(_common.HISTORY_KEYS) - {"epoch_seconds"}:
        np.testing.assert_allclose(resumed["history"][key], straight["history"][key], rtol=0 if exact else 1e-4,
                                   err_msg=key)
    for name, value in straight["model"].items():
        np.testing.assert_allclose(resumed["model"][name].cpu().numpy(), value.cpu().numpy(),
                                   rtol=0 if exact else 1e-4, atol=0 if exact else 1e-6, err_msg=name)


def test_save_every_must_be_a_non_negative_int(capsys):
    with pytest.raises(SystemExit) as exc:
        _run(["--save-every", "-1"])
    assert exc.value.code == 2
    assert "--save-every" in capsys.readouterr().err

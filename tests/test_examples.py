"""The example scripts: argument handling, a smoke run of each (checkpoint, plot, final line), --resume
replaying an interrupted run exactly, and README's main command reaching >= 97% on the digits."""
import importlib
import re
import sys
from pathlib import Path

import numpy as np
import pytest

import minidnn as mdn

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
sys.path.insert(0, str(EXAMPLES))          # the scripts import their sibling _common.py
_common = importlib.import_module("_common")

FINAL_LINE = re.compile(r"^test accuracy: [01]\.\d{4}$")

# The quickest argument set that still runs every part of each script: a few tiny batches, one epoch.
SMOKE = {
    "train_lenet": ["--epochs", "1", "--limit", "3"],
    "train_resnet_cifar": ["--synthetic", "--epochs", "1", "--limit", "2", "--batch-size", "8"],
    "train_mobilenet": ["--epochs", "1", "--limit", "2", "--batch-size", "16"],
    "custom_layer": ["--epochs", "1", "--limit", "3"],
}
SCRIPTS = list(SMOKE)


def run(script, argv):
    return importlib.import_module(script).main(argv)


def final_line(capsys):
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines, "the script printed nothing on stdout"
    assert FINAL_LINE.match(lines[-1]), f"last line {lines[-1]!r} is not 'test accuracy: 0.XXXX'"
    return float(lines[-1].split(":")[1])


def load_checkpoint(out):
    return mdn.load(Path(out) / _common.CHECKPOINT_NAME)


# ---------------------------------------------------------------------------------------------------------
# arguments
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("script", SCRIPTS)
def test_help_exits_zero_and_lists_the_common_options(script, capsys):
    with pytest.raises(SystemExit) as exc:
        run(script, ["--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    for option in ("--device", "--epochs", "--batch-size", "--lr", "--seed", "--data", "--out", "--resume"):
        assert option in text


BAD_ARGUMENTS = [
    ["--epochs", "0"], ["--epochs", "two"], ["--batch-size", "-4"], ["--lr", "0"], ["--lr", "nan"],
    ["--seed", "-1"], ["--limit", "0"], ["--data", "imagenet"], ["--device", "tpu"], ["--no-such-option"],
]


@pytest.mark.parametrize("script", SCRIPTS)
@pytest.mark.parametrize("bad", BAD_ARGUMENTS, ids=" ".join)
def test_bad_arguments_are_argparse_errors(script, bad, capsys):
    with pytest.raises(SystemExit) as exc:
        run(script, bad)
    assert exc.value.code == 2
    assert "error:" in capsys.readouterr().err


@pytest.mark.skipif(mdn.cuda.is_available(), reason="a GPU is present: --device cuda is valid here")
def test_cuda_without_a_gpu_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as exc:
        run("train_lenet", ["--device", "cuda"])
    assert exc.value.code == 2
    assert "argument --device" in capsys.readouterr().err


def test_missing_dataset_files_exit_with_a_message_not_a_traceback(tmp_path):
    with pytest.raises(SystemExit) as exc:
        run("train_resnet_cifar", ["--data-dir", str(tmp_path), "--out", str(tmp_path / "out")])
    assert "cifar-10-batches-py" in str(exc.value) and "--download" in str(exc.value)


def test_mobilenet_width_must_be_positive(capsys):
    with pytest.raises(SystemExit):
        run("train_mobilenet", ["--width", "0"])


# ---------------------------------------------------------------------------------------------------------
# smoke runs
# ---------------------------------------------------------------------------------------------------------
def smoke(script, tmp_path, capsys, extra=()):
    out = tmp_path / script
    run(script, SMOKE[script] + ["--out", str(out), *extra])
    accuracy = final_line(capsys)
    assert 0.0 <= accuracy <= 1.0
    state = load_checkpoint(out)
    assert state["epoch"] == 1
    assert set(state) == {"model", "optimizer", "scheduler", "epoch", "history"}
    assert all(len(state["history"][key]) == 1 for key in _common.HISTORY_KEYS)
    assert f"{state['history']['test_acc'][-1]:.4f}" == f"{accuracy:.4f}"
    assert (out / _common.PLOT_NAME).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")], "a temporary file was left behind"


@pytest.mark.parametrize("script", SCRIPTS)
def test_smoke_run_writes_checkpoint_plot_and_final_line(script, tmp_path, capsys):
    smoke(script, tmp_path, capsys)


def test_mobilenet_on_synthetic_cifar(tmp_path, capsys):
    smoke("train_mobilenet", tmp_path, capsys, ["--data", "cifar10", "--synthetic", "--batch-size", "8"])


@pytest.mark.cuda
@pytest.mark.parametrize("script", SCRIPTS)
def test_smoke_run_on_cuda(script, tmp_path, capsys):
    smoke(script, tmp_path, capsys, ["--device", "cuda"])


def test_amp_bf16_and_channels_last_on_the_cpu(tmp_path, capsys, monkeypatch):
    """--amp bf16 runs the step under autocast (its convolutions really see bfloat16) and --channels-last hands
    the model NHWC batches and weights."""
    seen = []
    original = mdn.nn.Conv2d._function

    def spy(x, w, *a, **k):
        seen.append((x.dtype, x.is_contiguous(memory_format=mdn.channels_last), mdn.is_grad_enabled()))
        return original(x, w, *a, **k)
    monkeypatch.setattr(mdn.nn.Conv2d, "_function", staticmethod(spy))
    smoke("train_resnet_cifar", tmp_path, capsys, ["--amp", "bf16", "--channels-last"])
    assert all(nhwc for _, nhwc, _ in seen)                                   # training and evaluation
    training = [d for d, _, grad in seen if grad]
    steps = 2                                                  # --limit 2: the stem sees the fp32 image (autocast
    assert training.count(mdn.float32) == steps and training.count(mdn.bfloat16) == len(training) - steps  # casts it)


def test_amp_fp16_on_the_cpu_is_a_clear_error(tmp_path):
    with pytest.raises(SystemExit, match="--amp fp16 needs --device cuda"):
        run("train_lenet", SMOKE["train_lenet"] + ["--out", str(tmp_path), "--amp", "fp16"])


@pytest.mark.cuda
@pytest.mark.parametrize("extra", [["--amp", "bf16"], ["--amp", "fp16", "--channels-last"]], ids=["bf16", "fp16_nhwc"])
def test_amp_smoke_run_on_cuda(extra, tmp_path, capsys):
    smoke("train_resnet_cifar", tmp_path, capsys, ["--device", "cuda", *extra])


# ---------------------------------------------------------------------------------------------------------
# --resume
# ---------------------------------------------------------------------------------------------------------
RESUME_CASES = {
    # LeNet: Adam state + one-cycle schedule; MobileNet: BatchNorm running statistics as well.
    "train_lenet": ["--epochs", "3", "--limit", "4", "--batch-size", "16"],
    "train_mobilenet": ["--epochs", "3", "--limit", "2", "--batch-size", "16", "--width", "4"],
}


class Interrupted(Exception):
    pass


@pytest.mark.parametrize("script", RESUME_CASES)
def test_resume_continues_exactly_where_an_interrupted_run_stopped(script, tmp_path, capsys, monkeypatch):
    argv = RESUME_CASES[script]
    run(script, argv + ["--out", str(tmp_path / "straight")])
    straight = load_checkpoint(tmp_path / "straight")

    # The same run killed after epoch 2's checkpoint was written (plot_history runs right after the save).
    real_plot, calls = _common.plot_history, []

    def plot_then_die(history, path):
        real_plot(history, path)
        calls.append(path)
        if len(calls) == 2:
            raise Interrupted
    monkeypatch.setattr(_common, "plot_history", plot_then_die)
    with pytest.raises(Interrupted):
        run(script, argv + ["--out", str(tmp_path / "resumed")])
    assert load_checkpoint(tmp_path / "resumed")["epoch"] == 2
    monkeypatch.setattr(_common, "plot_history", real_plot)
    capsys.readouterr()

    run(script, argv + ["--out", str(tmp_path / "resumed"), "--resume"])
    assert "resumed from" in capsys.readouterr().out
    resumed = load_checkpoint(tmp_path / "resumed")
    assert resumed["epoch"] == straight["epoch"] == 3
    for key in set(_common.HISTORY_KEYS) - {"epoch_seconds"}:       # same batches, augmentation, updates
        assert resumed["history"][key] == straight["history"][key], key
    for name, value in straight["model"].items():
        np.testing.assert_array_equal(resumed["model"][name].numpy(), value.numpy(), err_msg=name)


def test_resume_after_the_last_epoch_only_reports(tmp_path, capsys):
    argv = SMOKE["train_lenet"] + ["--out", str(tmp_path)]
    run("train_lenet", argv)
    first = final_line(capsys)
    run("train_lenet", argv + ["--resume", str(tmp_path / _common.CHECKPOINT_NAME)])
    assert final_line(capsys) == first
    assert load_checkpoint(tmp_path)["epoch"] == 1


def test_resume_without_a_checkpoint_fails_clearly(tmp_path):
    # a one-line message naming the missing file (issue 16), not a traceback
    with pytest.raises(SystemExit, match="no checkpoint at .*checkpoint.mdn"):
        run("train_lenet", SMOKE["train_lenet"] + ["--out", str(tmp_path), "--resume"])


# ---------------------------------------------------------------------------------------------------------
# README's main command
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_lenet_default_run_reaches_97_percent_on_digits(tmp_path, capsys):
    """``python examples/train_lenet.py`` with its defaults (about 15 s on 2 cores)."""
    run("train_lenet", ["--out", str(tmp_path)])
    assert final_line(capsys) >= 0.97

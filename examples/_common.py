"""Shared machinery of the example scripts: the argument parser, datasets, the train/eval loop,
checkpoints and plots.  Each script builds its model and data, then hands them to ``fit``.

The loop, in short::

    for epoch in range(start, epochs):
        seed every random stream from (seed, epoch)      # so a resumed run replays the same batches
        train one pass (tqdm bar: running loss and accuracy), evaluate on the test set
        save checkpoint.mdn (model + optimizer + scheduler + epoch + history), redraw curves.png
    print("test accuracy: 0.XXXX")                       # always the last line

Only minidnn's public API is used here, as in any user's script.
"""
from __future__ import annotations

import argparse
import itertools
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

import minidnn as mdn
from minidnn.data import TensorDataset, datasets
from minidnn.nn import functional as F

CHECKPOINT_NAME = "checkpoint.mdn"
PLOT_NAME = "curves.png"
HISTORY_KEYS = ("train_loss", "train_acc", "test_loss", "test_acc", "epoch_seconds")


# ---------------------------------------------------------------------------------------------------------
# Arguments
# ---------------------------------------------------------------------------------------------------------
def positive_int(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def non_negative_int(text):
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a non-negative integer, got {text}")
    return value


def positive_float(text):
    value = float(text)
    if not value > 0 or not np.isfinite(value):      # `not >` also rejects NaN
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def device_name(text):
    """Checked when the arguments are parsed, so that a typo or a missing GPU is an argparse error, not a
    traceback from deep inside the first forward pass."""
    try:
        dev = mdn.device(text)
    except (ValueError, TypeError, RuntimeError) as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if dev.type == "cuda" and not mdn.cuda.is_available():
        raise argparse.ArgumentTypeError(f"{text}: no CUDA GPU with CuPy on this machine")
    return str(dev)


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows "(default: ...)" only where there is a default worth showing (not None, not an off switch)."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def make_parser(script, description, *, epochs, batch_size, lr, data=("digits",), synthetic=False):
    """The arguments every example shares; ``data`` lists the dataset names the script accepts (the first
    is the default).  ``synthetic`` adds ``--synthetic`` (random data of the real data's shape)."""
    p = argparse.ArgumentParser(prog=f"{script}.py", description=description,
                                formatter_class=_HelpFormatter)
    p.add_argument("--device", type=device_name, default="cpu", help='"cpu", "cuda" or "cuda:N"')
    p.add_argument("--epochs", type=positive_int, default=epochs, help="passes over the training set")
    p.add_argument("--batch-size", type=positive_int, default=batch_size, help="training and test batch size")
    p.add_argument("--lr", type=positive_float, default=lr, help="(peak) learning rate")
    p.add_argument("--seed", type=non_negative_int, default=0, help="seeds initialisation, shuffling, augmentation")
    p.add_argument("--data", choices=data, default=data[0], help="dataset")
    p.add_argument("--data-dir", default=None,
                   help="folder of the dataset files (default: $MINIDNN_DATA or ~/.cache/minidnn/datasets)")
    p.add_argument("--download", action="store_true", help="download missing dataset files into --data-dir")
    p.add_argument("--out", default=os.path.join("runs", script), help="folder for the checkpoint and the plot")
    p.add_argument("--resume", nargs="?", const="", default=None, metavar="CHECKPOINT",
                   help=f"continue from CHECKPOINT (default: OUT/{CHECKPOINT_NAME})")
    p.add_argument("--save-every", type=non_negative_int, default=0, metavar="N",
                   help="also checkpoint every N training steps; --resume then continues mid-epoch exactly (0: off)")
    p.add_argument("--limit", type=positive_int, default=None,
                   help="at most this many batches per epoch, train and test (smoke tests)")
    p.add_argument("--no-compile", dest="compile", action="store_false",
                   help="on a GPU, run each training step eagerly instead of replaying it from a CUDA graph "
                        "(minidnn.compile); on the CPU steps always run eagerly")
    p.add_argument("--amp", choices=("bf16", "fp16"), default=None,
                   help="mixed precision: convolutions and matrix products under minidnn.autocast in bfloat16, or in "
                        "float16 with a GradScaler (the GPU; on the CPU bf16 only)")
    p.add_argument("--channels-last", action="store_true",
                   help="NHWC memory format for the model and the batches (minidnn.channels_last)")
    p.add_argument("--no-progress", dest="progress", action="store_false",
                   help="no progress bars (also MINIDNN_PROGRESS=0; they are off anyway when stderr is not a terminal)")
    if synthetic:
        p.add_argument("--synthetic", action="store_true",
                       help="random images and labels of the dataset's shape instead of files (no download)")
    return p


# ---------------------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------------------
@dataclass
class DataSpec:
    """What a model and its transforms need to know about a dataset."""
    channels: int
    size: int                    # images are size x size
    num_classes: int
    mean: tuple                  # per channel, of the training images in [0, 1] (for Normalize)
    std: tuple


SPECS = {
    # digits: measured on the 1437 training images; the others are the usual published values.
    "digits": DataSpec(1, 8, 10, (0.3055,), (0.3761,)),
    "mnist": DataSpec(1, 28, 10, (0.1307,), (0.3081,)),
    "fashion-mnist": DataSpec(1, 28, 10, (0.2860,), (0.3530,)),
    "cifar10": DataSpec(3, 32, 10, (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
}


def synthetic_data(spec, n_train=2000, n_test=500, seed=0):
    """Random images in [0, 1] and random labels of ``spec``'s shape: exercises the whole pipeline (and
    measures its speed) without any files.  Nothing can be learned from them: accuracy stays near chance."""
    rng = np.random.default_rng(seed)

    def make(n):
        images = rng.random((n, spec.channels, spec.size, spec.size), dtype=np.float32)
        return TensorDataset(images, rng.integers(0, spec.num_classes, n, dtype=np.int64))
    return make(n_train), make(n_test)


def load_data(args):
    """(train, test, spec) for ``args.data`` (or random data of its shape with ``--synthetic``)."""
    spec = SPECS[args.data]
    if getattr(args, "synthetic", False):
        return (*synthetic_data(spec, seed=args.seed), spec)
    if args.data == "digits":
        return datasets.load_digits("train"), datasets.load_digits("test"), spec
    cls = {"mnist": datasets.MNIST, "fashion-mnist": datasets.FashionMNIST, "cifar10": datasets.CIFAR10}[args.data]
    try:
        return (cls(args.data_dir, train=True, download=args.download),
                cls(args.data_dir, train=False, download=args.download), spec)
    except datasets.DatasetNotFoundError as e:      # a message for the command line, not a traceback
        raise SystemExit(f"error: {e}\nOn the command line: --download fetches them, --data-dir points to them.")


# ---------------------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------------------
def epoch_seed(seed, epoch):
    """A distinct, well-mixed seed for each (run seed, epoch)."""
    return int(np.random.SeedSequence([seed, epoch]).generate_state(1)[0])


def batches_per_epoch(dataset, args):
    """How many optimizer steps one epoch takes (for schedulers that need the total up front)."""
    n = -(-len(dataset) // args.batch_size)
    return n if args.limit is None else min(n, args.limit)


def progress_disabled(progress=True):
    """tqdm's ``disable`` for a progress switch: True (off) when ``progress`` is False or MINIDNN_PROGRESS is
    0/false/off; False (on) when MINIDNN_PROGRESS is 1/true/on; else None: tqdm shows bars only on a terminal."""
    env = os.environ.get("MINIDNN_PROGRESS", "").strip().lower()
    if not progress or env in ("0", "false", "no", "off"):
        return True
    return False if env in ("1", "true", "yes", "on") else None


def check_amp(args):
    """--amp fp16 needs a GPU: a command-line message, not a traceback."""
    if getattr(args, "amp", None) == "fp16" and not str(args.device).startswith("cuda"):
        raise SystemExit("error: --amp fp16 needs --device cuda (float16 autocast and its GradScaler run on the "
                         "GPU); on the CPU use --amp bf16")


def make_train_step(model, optimizer, loss_fn, compile_step, amp=None, channels_last=False):
    """One training step (forward, loss, zero_grad, backward, optimizer step) -> (loss, logits); with
    ``compile_step`` wrapped in ``minidnn.compile``: on a GPU it is captured once per batch shape and replayed
    from a CUDA graph (elsewhere minidnn.compile runs it as written).  ``amp`` ("bf16" or "fp16") runs the
    forward and the loss under minidnn.autocast (fp16 with a GradScaler: loss scaling, overflow steps skipped on
    the device); ``channels_last`` hands the model NHWC batches."""
    dtype = {"bf16": mdn.bfloat16, "fp16": mdn.float16}.get(amp)
    scaler = mdn.amp.GradScaler("cuda") if amp == "fp16" else None

    def train_step(images, labels):
        if channels_last:
            images = images.contiguous(memory_format=mdn.channels_last)
        with mdn.autocast(images.device.type, dtype=dtype, enabled=dtype is not None):
            logits = model(images)
            loss = loss_fn(logits, labels)
        optimizer.zero_grad(set_to_none=False)
        if scaler is None:
            loss.backward()
            optimizer.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        return loss, logits
    return mdn.compile(train_step) if compile_step else train_step


def run_epoch(model, loader, limit=None, optimizer=None, scheduler=None, loss_fn=F.cross_entropy, desc="",
              progress=True, done=(0, 0.0, 0, 0), on_step=None, train_step=None, channels_last=False):
    """One pass over ``loader``: training when an optimizer is given, evaluation (no graph) otherwise.
    Returns (mean loss, accuracy) over the samples seen.  ``scheduler`` steps after every batch.
    ``progress=False`` hides the bar (see ``progress_disabled``).  A resumed epoch passes the iterator of
    its remaining batches and ``done`` = (steps, loss sum, correct, seen) of the part before the checkpoint;
    ``on_step(steps, loss_sum, correct, seen)`` is called after every training step."""
    training = optimizer is not None
    model.train(training)
    total = len(loader) if limit is None else min(limit, len(loader))
    step, loss_sum, correct, seen = done
    bar = tqdm(itertools.islice(loader, total - step), total=total, initial=step, desc=desc, leave=False,
               dynamic_ncols=True, disable=progress_disabled(progress))
    if training and train_step is None:
        train_step = make_train_step(model, optimizer, loss_fn, compile_step=False)
    with mdn.set_grad_enabled(training):
        for images, labels in bar:
            if training:
                loss, logits = train_step(images, labels)
                if scheduler is not None:
                    scheduler.step()
            else:
                if channels_last:
                    images = images.contiguous(memory_format=mdn.channels_last)
                logits = model(images)
                loss = loss_fn(logits, labels)
            n = labels.shape[0]
            loss_sum += loss.item() * n
            correct += int((logits.argmax(dim=1) == labels).sum().item())
            seen += n
            step += 1
            bar.set_postfix(loss=f"{loss_sum / seen:.4f}", acc=f"{correct / seen:.4f}", refresh=False)
            if on_step is not None and step < total:
                on_step(step, loss_sum, correct, seen)
    return loss_sum / max(seen, 1), correct / max(seen, 1)


def fit(model, optimizer, make_train_loader, test_loader, args, scheduler=None, loss_fn=F.cross_entropy):
    """Train for ``args.epochs`` epochs, or what remains of them after ``--resume``; evaluate, checkpoint
    and plot after every epoch; print the final ``test accuracy: 0.XXXX`` last.  Returns the history.

    ``make_train_loader()`` builds the training loader of one epoch, random transforms included.  It is
    called after the epoch's ``mdn.manual_seed``, and loaders and transforms built without an explicit
    seed draw theirs from minidnn's generator: so epoch e shuffles and augments the same way whether or
    not the run was interrupted and resumed before it.  (A transform built once, outside, would carry
    its random stream across epochs, and a resumed run would restart that stream.)
    Build the model on its device, then the optimizer (its flat
    buffers live on the parameters' device), then call this."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # On a GPU each training step is replayed from a CUDA graph (minidnn.compile) unless --no-compile.
    check_amp(args)
    if getattr(args, "channels_last", False):
        model.to(memory_format=mdn.channels_last)
    train_step = make_train_step(model, optimizer, loss_fn,
                                 compile_step=getattr(args, "compile", True) and str(args.device).startswith("cuda"),
                                 amp=getattr(args, "amp", None), channels_last=getattr(args, "channels_last", False))
    checkpoint_path = out / CHECKPOINT_NAME
    history = {key: [] for key in HISTORY_KEYS}
    start = 0
    if args.resume is not None:
        source = Path(args.resume) if args.resume else checkpoint_path
        if not source.is_file():          # a message for the command line, not a traceback
            raise SystemExit(f"error: --resume: no checkpoint at {source}. Train once without --resume to create "
                             f"it (each epoch saves OUT/{CHECKPOINT_NAME}), or pass the checkpoint's path: "
                             "--resume PATH")
        start, history, partial = load_checkpoint(source, model, optimizer, scheduler, args.device)
        tqdm.write(f"resumed from {source} after epoch {start}" +
                   (f", step {partial['done'][0]}" if partial is not None else ""))
    else:
        partial = None

    for epoch in range(start, args.epochs):
        mdn.manual_seed(epoch_seed(args.seed, epoch))
        began = time.perf_counter()
        loader = make_train_loader()
        done, seconds_before = (0, 0.0, 0, 0), 0.0
        if partial is not None:          # a mid-epoch checkpoint (--save-every): the same remaining batches
            loader.load_state_dict(partial["loader"])
            batches = iter(loader)
            set_rng_states(partial["rng"], args.device)      # dropout etc. continue their streams too
            done, seconds_before, partial = tuple(partial["done"]), partial["seconds"], None
        else:
            batches = iter(loader)

        def save_mid_epoch(step, loss_sum, correct, seen, epoch=epoch, loader=loader, began=began,
                           seconds_before=seconds_before):
            if args.save_every and step % args.save_every == 0:
                save_checkpoint(checkpoint_path, model, optimizer, scheduler, epoch, history, partial={
                    "loader": loader.state_dict(), "rng": get_rng_states(args.device),
                    "done": [step, loss_sum, correct, seen],
                    "seconds": seconds_before + time.perf_counter() - began})
        train_loss, train_acc = run_epoch(model, batches, args.limit, optimizer, scheduler, loss_fn,
                                          desc=f"epoch {epoch + 1}/{args.epochs}", progress=_progress(args),
                                          done=done, on_step=save_mid_epoch, train_step=train_step)
        seconds = seconds_before + time.perf_counter() - began   # training only: what "time per epoch" means
        test_loss, test_acc = run_epoch(model, test_loader, args.limit, loss_fn=loss_fn, desc="test",
                                        progress=_progress(args), channels_last=getattr(args, "channels_last", False))
        for key, value in zip(HISTORY_KEYS, (train_loss, train_acc, test_loss, test_acc, seconds)):
            history[key].append(value)
        tqdm.write(f"epoch {epoch + 1}/{args.epochs}: train loss {train_loss:.4f} acc {train_acc:.4f} | "
                   f"test loss {test_loss:.4f} acc {test_acc:.4f} | {seconds:.2f} s/epoch")
        save_checkpoint(checkpoint_path, model, optimizer, scheduler, epoch + 1, history)
        plot_history(history, out / PLOT_NAME)

    if not history["test_acc"]:          # --epochs is not more than the checkpoint's: nothing new to train
        history["test_acc"].append(run_epoch(model, test_loader, args.limit, loss_fn=loss_fn, desc="test",
                                             progress=_progress(args),
                                             channels_last=getattr(args, "channels_last", False))[1])
    print(f"test accuracy: {history['test_acc'][-1]:.4f}", flush=True)
    return history


# ---------------------------------------------------------------------------------------------------------
# Checkpoints and plots
# ---------------------------------------------------------------------------------------------------------
def _progress(args):
    return getattr(args, "progress", True)


def save_checkpoint(path, model, optimizer, scheduler, epoch, history, partial=None):
    """Everything a resumed run needs.  ``minidnn.save`` writes atomically (temporary file, fsync, rename):
    a run killed mid-save leaves the previous checkpoint intact.  ``partial`` (mid-epoch checkpoints of
    ``--save-every``): the training loader's state (sampler position, worker seed, augmentation streams),
    the random generators' states and the epoch's running sums; ``epoch`` counts the finished epochs."""
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
             "scheduler": None if scheduler is None else scheduler.state_dict(), "epoch": epoch, "history": history}
    if partial is not None:
        state["partial"] = partial
    mdn.save(state, path)


def load_checkpoint(path, model, optimizer, scheduler, device):
    """Restore model, optimizer and scheduler in place; returns (epochs done, history, mid-epoch part or None)."""
    state = mdn.load(path, map_location=device)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    if scheduler is not None and state["scheduler"] is not None:
        scheduler.load_state_dict(state["scheduler"])
    history = {key: list(state["history"].get(key, [])) for key in HISTORY_KEYS}
    return state["epoch"], history, state.get("partial")


def get_rng_states(device):
    """The default generators' states: the cpu's, and the GPU's when training on one."""
    states = {"cpu": mdn.get_rng_state()}
    if mdn.device(device).type == "cuda":
        states["cuda"] = mdn.cuda.get_rng_state(device)
    return states


def set_rng_states(states, device):
    mdn.set_rng_state(states["cpu"])
    if "cuda" in states:
        mdn.cuda.set_rng_state(states["cuda"], device)


def plot_history(history, path):
    """Loss and accuracy per epoch, train and test, as a PNG.  A bare ``Figure`` renders with the Agg
    canvas without touching pyplot's global backend (scripts may run without a display)."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    epochs = np.arange(1, len(history["train_loss"]) + 1)
    fig = Figure(figsize=(9, 3.5), layout="constrained")
    loss_ax, acc_ax = fig.subplots(1, 2)
    for ax, key, title in ((loss_ax, "loss", "cross-entropy loss"), (acc_ax, "acc", "accuracy")):
        # distinguishable even where the curves overlap or in grey: colour, line style and marker all differ
        ax.plot(epochs, history[f"train_{key}"], "o-", color="C0", label="train")
        ax.plot(epochs, history[f"test_{key}"], "s--", color="C3", markerfacecolor="none", label="test")
        ax.set(title=title, xlabel="epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))       # epochs are whole numbers
        ax.grid(alpha=0.3)
        ax.legend()
    tmp = path.with_name(f".{path.name}.tmp")
    fig.savefig(tmp, format="png", dpi=100)
    os.replace(tmp, path)            # readers never see a half-written image
    return fig

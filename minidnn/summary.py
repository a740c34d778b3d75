"""``minidnn.summary(model, input_shape)``: a torchinfo-like table of layers, output shapes, parameters,
multiply-adds and memory, measured by one forward pass with hooks on every module.

The multiply-add (MAC) protocol, for layer authors: a module that does arithmetic defines

    def _macs(self, input, output) -> int

returning the multiply-adds of one call, where ``input`` is the first positional argument its ``forward``
received and ``output`` what it returned (both for the whole batch).  Modules without ``_macs`` count 0;
containers must not define it (their children are counted).  Examples:
  Linear:  in_features * output.numel()          (one MAC per weight entry per output row; the bias add is free)
  Conv2d:  (C_in / groups) * kH * kW * output.numel()
  BatchNorm (eval): input.numel()                (one multiply-add per element: the folded scale and shift)
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .autograd import no_grad
from .backend import devices as _dev
from .backend.devices import is_floating as _is_floating
from .creation import randn, zeros
from .tensor import Tensor, _to_dtype

__all__ = ["summary", "ModelSummary", "LayerRow"]

_MB = 1e6      # torchinfo's unit


@dataclass
class LayerRow:
    """One call of one module during the summary's forward."""
    name: str                  # dotted name in the model ("" for the model itself)
    type: str                  # class name
    depth: int                 # 0 for the model, 1 for its children, ...
    is_leaf: bool              # no child modules
    num_params: int = 0        # own parameters (not the children's); 0 when already counted in an earlier row
    trainable_params: int = 0
    recursive: bool = False    # the module was called before: its parameters are counted there
    output_shapes: list = field(default_factory=list)
    output_bytes: int = 0
    macs: int = 0


def _tensors_in(obj):
    if isinstance(obj, Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _tensors_in(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _tensors_in(o)


class ModelSummary:
    """The result of ``summary``: ``str()`` is the table; the numbers are attributes (bytes for sizes)."""

    def __init__(self, rows, model, inputs):
        self.rows = rows
        params = list(model.parameters())
        self.total_params = sum(p.numel() for p in params)
        self.trainable_params = sum(p.numel() for p in params if p.requires_grad)
        self.non_trainable_params = self.total_params - self.trainable_params
        self.total_mult_adds = sum(r.macs for r in rows)
        self.input_size_bytes = sum(t.nbytes for t in _tensors_in(inputs))
        # Every leaf output is kept for backward and gets a gradient of the same size: hence * 2 (torchinfo's rule).
        self.forward_backward_pass_size_bytes = 2 * sum(r.output_bytes for r in rows if r.is_leaf)
        self.params_size_bytes = sum(p.nbytes for p in params)
        self.total_size_bytes = self.input_size_bytes + self.forward_backward_pass_size_bytes + self.params_size_bytes

    def _layer_label(self, r):
        if r.depth == 0:
            return r.type
        return "│    " * (r.depth - 1) + "├─" + f"{r.type} ({r.name})"

    def __str__(self):
        header = ("Layer (type (name))", "Output Shape", "Param #", "Mult-Adds")
        body = []
        for r in self.rows:
            shapes = ", ".join(str(list(s)) for s in r.output_shapes) or "--"
            params = "(recursive)" if r.recursive else (f"{r.num_params:,}" if r.num_params else "--")
            macs = f"{r.macs:,}" if r.macs else "--"
            body.append((self._layer_label(r), shapes, params, macs))
        widths = [max(len(row[i]) for row in [header] + body) + 3 for i in range(4)]
        line = "=" * sum(widths)

        def fmt(row):
            return "".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip()

        out = [line, fmt(header), line] + [fmt(b) for b in body] + [line]
        out += [f"Total params: {self.total_params:,}",
                f"Trainable params: {self.trainable_params:,}",
                f"Non-trainable params: {self.non_trainable_params:,}",
                f"Total mult-adds: {self.total_mult_adds:,} ({self.total_mult_adds / 1e6:.2f} M)",
                line,
                f"Input size (MB): {self.input_size_bytes / _MB:.2f}",
                f"Forward/backward pass size (MB): {self.forward_backward_pass_size_bytes / _MB:.2f}",
                f"Params size (MB): {self.params_size_bytes / _MB:.2f}",
                f"Estimated Total Size (MB): {self.total_size_bytes / _MB:.2f}",
                line]
        return "\n".join(out)

    __repr__ = __str__


def _make_inputs(input_shape, batch_size, device, dtype):
    shapes = [tuple(input_shape)] if all(isinstance(s, int) for s in input_shape) else [tuple(s) for s in input_shape]
    if batch_size is not None:
        shapes = [(batch_size,) + s for s in shapes]
    dtypes = list(dtype) if isinstance(dtype, (list, tuple)) else [dtype] * len(shapes)
    if len(dtypes) != len(shapes):
        raise ValueError(f"summary: {len(shapes)} input shapes but {len(dtypes)} dtypes")
    inputs = []
    for s, dt in zip(shapes, dtypes):
        dt = _to_dtype(dt)
        # Integer inputs (token ids for an Embedding) are zeros: always a valid index.
        inputs.append(randn(*s, dtype=dt, device=device) if _is_floating(dt) else zeros(*s, dtype=dt, device=device))
    return inputs


def _forward_failed(exc, inputs, input_shape, batch_size, made_inputs):
    """The model's own error, prefixed with what summary fed it and, for a made-up input, the likely slip:
    ``input_shape`` includes the batch dimension (PyTorch's and torchinfo's convention)."""
    shapes = ", ".join(str(tuple(t.shape)) for t in inputs)
    message = f"summary: the model's forward failed on input{'s' if len(inputs) > 1 else ''} of shape {shapes}: {exc}"
    if made_inputs and batch_size is None:
        first = tuple(input_shape) if all(isinstance(s, int) for s in input_shape) else tuple(input_shape[0])
        message += (f"\nHint: input_shape includes the batch dimension. For one sample of shape {first}, pass "
                    f"summary(model, {(1,) + first}) or summary(model, {first}, batch_size=1).")
    try:
        return type(exc)(message)
    except Exception:                  # an exception type whose constructor takes other arguments
        return RuntimeError(message)


def summary(model, input_shape=None, *, batch_size=None, input_data=None, device=None, dtype=np.float32,
            mode: str = "eval", verbose: int = 1) -> ModelSummary:
    """Run ``model`` once on random inputs of ``input_shape`` (batch dim included, or given as ``batch_size``;
    a list of shapes for several inputs) or on ``input_data``, and tabulate every module call.

    ``device``: where the inputs go (default: the device of the model's first parameter); ``dtype``: one or one
    per input (integer dtypes give zeros); ``mode``: "eval" (default: no running statistics change), "train" or
    "same"; the modules' training flags are restored afterwards.  ``verbose=1`` also prints the table."""
    if input_data is None:
        if input_shape is None:
            raise ValueError("summary: pass input_shape (e.g. (1, 3, 32, 32)) or input_data")
        if device is None:
            first = next(model.parameters(), None)
            device = first.device if first is not None else _dev.default_device()
        inputs = _make_inputs(input_shape, batch_size, device, dtype)
    else:
        inputs = list(input_data) if isinstance(input_data, (list, tuple)) else [input_data]

    names = {}
    for name, m in model.named_modules():
        names[id(m)] = name
    rows, handles, seen = [], [], set()
    open_rows = {}     # id(module) -> stack of its rows still running (a module may call itself)

    def pre_hook(module, args):
        name = names.get(id(module), "?")
        row = LayerRow(name=name, type=type(module).__name__, depth=0 if name == "" else name.count(".") + 1,
                       is_leaf=not module._modules)
        if id(module) in seen:
            row.recursive = True
        else:
            seen.add(id(module))
            own = [p for p in module.parameters(recurse=False)]
            row.num_params = sum(p.numel() for p in own)
            row.trainable_params = sum(p.numel() for p in own if p.requires_grad)
        rows.append(row)
        open_rows.setdefault(id(module), []).append(row)

    def post_hook(module, args, output):
        row = open_rows[id(module)].pop()
        outs = list(_tensors_in(output))
        row.output_shapes = [tuple(t.shape) for t in outs]
        row.output_bytes = sum(t.nbytes for t in outs)
        macs = getattr(module, "_macs", None)
        if macs is not None:
            row.macs = int(macs(args[0] if args else None, output))

    flags = [(m, m.training) for m in model.modules()]
    try:
        for m in model.modules():
            handles.append(m.register_forward_pre_hook(pre_hook))
            handles.append(m.register_forward_hook(post_hook))
        if mode == "eval":
            model.eval()
        elif mode == "train":
            model.train()
        elif mode != "same":
            raise ValueError(f"summary: mode must be 'eval', 'train' or 'same', got {mode!r}")
        with no_grad():
            try:
                model(*inputs)
            except Exception as exc:
                raise _forward_failed(exc, inputs, input_shape, batch_size, input_data is None) from exc
    finally:
        for h in handles:
            h.remove()
        for m, flag in flags:
            m.training = flag
    result = ModelSummary(rows, model, inputs)
    if verbose:
        print(result)
    return result

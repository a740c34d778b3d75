"""Recurrent layers: RNN, LSTM, GRU and their cells, with PyTorch's parameter names, shapes, gate order,
initialisation and outputs (so PyTorch state_dicts load), composed from linear, matmul and pointwise ops.

Shapes (batch_first=False): input (T, N, H_in), or (N, T, H_in) with batch_first, or unbatched (T, H_in);
h_0 / h_n (D * num_layers, N, H_out) with D = 2 if bidirectional; output (T, N, D * H_out).
H_out = proj_size if proj_size > 0 (LSTM) else hidden_size.
Gates (rows of weight_ih / weight_hh): LSTM (i, f, g, o), GRU (r, z, n); each layer projects the whole input
sequence with one matmul, then steps through time with h @ weight_hh.T.  A PackedSequence input (see
nn.utils.rnn) gives a PackedSequence output, and h_n holds each sequence's state at its own last step.
"""
from __future__ import annotations

import math
import numbers
import warnings

from ...autograd import Function
from ...creation import empty, zeros
from ...ops import cat, stack
from ...tensor import Tensor
from .. import init
from .._functions.activation import dropout as _dropout
from ..functional import linear
from ..module import Module
from ..parameter import Parameter

__all__ = ["RNNBase", "RNN", "LSTM", "GRU", "RNNCellBase", "RNNCell", "LSTMCell", "GRUCell"]

_GATES = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1}


class _UnbindTime(Function):
    """x (T, ...) -> T tensors x[t]; backward stacks the step gradients in one pass (indexing each step would
    scatter into a full-size zero array per step)."""

    @staticmethod
    def forward(ctx, x):
        return tuple(Tensor._from_array(x.data[t]) for t in range(x.shape[0]))

    @staticmethod
    def backward(ctx, *grads):
        return stack(list(grads), 0)          # Tensor ops: differentiable again under create_graph


def _steps(x):
    return list(_UnbindTime.apply(x)) if x.requires_grad else [x[t] for t in range(x.shape[0])]


# ---- one time step of each cell: xw = x @ w_ih.T + b_ih is computed beforehand ---------------------------------
def _rnn_step(xw, h, w_hh_t, b_hh, nonlinearity):
    a = xw + h @ w_hh_t
    if b_hh is not None:
        a = a + b_hh
    return a.tanh() if nonlinearity == "tanh" else a.relu()


def _lstm_step(xw, h, c, w_hh_t, b_hh, w_hr_t=None):
    gates = xw + h @ w_hh_t
    if b_hh is not None:
        gates = gates + b_hh
    i, f, g, o = gates.chunk(4, -1)
    c = f.sigmoid() * c + i.sigmoid() * g.tanh()
    h = o.sigmoid() * c.tanh()
    if w_hr_t is not None:
        h = h @ w_hr_t
    return h, c


def _gru_step(xw, h, w_hh_t, b_hh):
    hw = h @ w_hh_t
    if b_hh is not None:
        hw = hw + b_hh
    r_i, z_i, n_i = xw.chunk(3, -1)
    r_h, z_h, n_h = hw.chunk(3, -1)
    r = (r_i + r_h).sigmoid()
    z = (z_i + z_h).sigmoid()
    n = (n_i + r * n_h).tanh()
    return n + z * (h - n)


def _check_size(name, what, got, expected):
    if tuple(got) != tuple(expected):
        raise RuntimeError(f"{name}: Expected {what} size {tuple(expected)}, got {tuple(got)}")


class RNNBase(Module):
    """Shared by RNN, LSTM and GRU: parameters weight_ih_l{k}[_reverse], weight_hh_l{k}[_reverse],
    bias_ih_l{k}[_reverse], bias_hh_l{k}[_reverse] (and weight_hr_l{k}[_reverse] for a projected LSTM), all
    initialised uniform(-1/sqrt(hidden_size), 1/sqrt(hidden_size))."""

    def __init__(self, mode, input_size, hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0,
                 bidirectional=False, proj_size=0, device=None, dtype=None):
        super().__init__()
        name = {"RNN_TANH": "RNN", "RNN_RELU": "RNN"}.get(mode, mode)
        if not isinstance(dropout, numbers.Number) or not 0 <= dropout <= 1 or isinstance(dropout, bool):
            raise ValueError("dropout should be a number in range [0, 1] representing the probability of an "
                             "element being zeroed")
        if not isinstance(hidden_size, int) or hidden_size <= 0:
            raise ValueError(f"hidden_size must be a positive integer, got {hidden_size!r}")
        if not isinstance(num_layers, int) or num_layers <= 0:
            raise ValueError(f"num_layers must be a positive integer, got {num_layers!r}")
        if proj_size < 0:
            raise ValueError("proj_size should be a positive integer or zero to disable projections")
        if proj_size >= hidden_size:
            raise ValueError("proj_size has to be smaller than hidden_size")
        if proj_size and mode != "LSTM":
            raise ValueError(f"proj_size argument is only supported for LSTM, not {name}")
        if dropout > 0 and num_layers == 1:
            warnings.warn("dropout option adds dropout after all but last recurrent layer, so non-zero dropout "
                          f"expects num_layers greater than 1, but got dropout={dropout} and num_layers={num_layers}")
        self.mode, self.input_size, self.hidden_size, self.num_layers = mode, input_size, hidden_size, num_layers
        self.bias, self.batch_first, self.dropout = bias, batch_first, float(dropout)
        self.bidirectional, self.proj_size = bidirectional, proj_size
        D = 2 if bidirectional else 1
        gate = _GATES[mode] * hidden_size
        real_h = proj_size if proj_size > 0 else hidden_size
        kw = dict(device=device, dtype=dtype)
        self._flat_weights_names = []
        for layer in range(num_layers):
            for d in range(D):
                sfx = f"_l{layer}" + ("_reverse" if d else "")
                in_size = input_size if layer == 0 else real_h * D
                params = [("weight_ih" + sfx, (gate, in_size)), ("weight_hh" + sfx, (gate, real_h))]
                if bias:
                    params += [("bias_ih" + sfx, (gate,)), ("bias_hh" + sfx, (gate,))]
                if proj_size > 0:
                    params += [("weight_hr" + sfx, (proj_size, hidden_size))]
                for pname, shape in params:
                    setattr(self, pname, Parameter(empty(*shape, **kw)))
                    self._flat_weights_names.append(pname)
        self.reset_parameters()

    def reset_parameters(self):
        stdv = 1.0 / math.sqrt(self.hidden_size) if self.hidden_size > 0 else 0
        for p in self.parameters():
            init.uniform_(p, -stdv, stdv)

    def flatten_parameters(self):
        """cuDNN's weight packing in PyTorch; nothing to do here (kept so scripts that call it run)."""

    @property
    def all_weights(self):
        D = 2 if self.bidirectional else 1
        per = len(self._flat_weights_names) // (self.num_layers * D)
        names = self._flat_weights_names
        return [[getattr(self, n) for n in names[i:i + per]] for i in range(0, len(names), per)]

    def _layer_params(self, layer, d):
        sfx = f"_l{layer}" + ("_reverse" if d else "")
        names = ("weight_ih", "weight_hh", "bias_ih", "bias_hh", "weight_hr")
        return tuple(getattr(self, n + sfx, None) for n in names)

    def extra_repr(self):
        s = f"{self.input_size}, {self.hidden_size}"
        if self.proj_size:
            s += f", proj_size={self.proj_size}"
        if self.num_layers != 1:
            s += f", num_layers={self.num_layers}"
        if not self.bias:
            s += ", bias=False"
        if self.batch_first:
            s += ", batch_first=True"
        if self.dropout:
            s += f", dropout={self.dropout}"
        if self.bidirectional:
            s += ", bidirectional=True"
        return s

    def _step(self, xw, h, c, w_hh_t, b_hh, w_hr_t):
        if self.mode == "LSTM":
            return _lstm_step(xw, h, c, w_hh_t, b_hh, w_hr_t)
        if self.mode == "GRU":
            return _gru_step(xw, h, w_hh_t, b_hh), None
        return _rnn_step(xw, h, w_hh_t, b_hh, "tanh" if self.mode == "RNN_TANH" else "relu"), None

    def _initial_states(self, name, hx, N, like):
        lstm = self.mode == "LSTM"
        D = 2 if self.bidirectional else 1
        real_h = self.proj_size if self.proj_size > 0 else self.hidden_size
        h_shape, c_shape = (self.num_layers * D, N, real_h), (self.num_layers * D, N, self.hidden_size)
        if hx is None:
            h0 = zeros(*h_shape, dtype=like.dtype, device=like.device)
            c0 = zeros(*c_shape, dtype=like.dtype, device=like.device) if lstm else None
        elif lstm:
            if not isinstance(hx, (tuple, list)) or len(hx) != 2:
                raise TypeError(f"{name}: hx must be a tuple (h_0, c_0)")
            h0, c0 = hx
            _check_size(name, "hidden", h0.shape, h_shape)
            _check_size(name, "cell", c0.shape, c_shape)
        else:
            h0, c0 = hx, None
            _check_size(name, "hidden", h0.shape, h_shape)
        return h0, c0

    def _forward_packed(self, packed, hx):
        """The recurrence over a PackedSequence: step t updates the first batch_sizes[t] rows (sequences sorted
        by decreasing length); a finished row keeps its last state, which becomes its h_n."""
        from ..utils.rnn import _ints, split_rows
        name = type(self).__name__
        data, sizes = packed.data, [int(b) for b in _ints(packed.batch_sizes)]
        if data.ndim != 2 or data.shape[-1] != self.input_size:
            raise RuntimeError(f"{name}: input.size(-1) must be equal to input_size. Expected {self.input_size}, "
                               f"got {data.shape[-1]} (packed data {tuple(data.shape)})")
        lstm, D, N = self.mode == "LSTM", (2 if self.bidirectional else 1), sizes[0]
        sorted_idx = None if packed.sorted_indices is None else _ints(packed.sorted_indices)
        if hx is not None and sorted_idx is not None:         # the caller's batch order -> the packed order
            hx = tuple(h[:, sorted_idx] for h in hx) if lstm else hx[:, sorted_idx]
        h0, c0 = self._initial_states(name, hx, N, data)
        x = data
        h_n, c_n = [], []
        for layer in range(self.num_layers):
            outs = []
            for d in range(D):
                w_ih, w_hh, b_ih, b_hh, w_hr = self._layer_params(layer, d)
                k = layer * D + d
                xw = split_rows(linear(x, w_ih, b_ih), sizes)
                w_hh_t, w_hr_t = w_hh.T, (w_hr.T if w_hr is not None else None)
                ys = [None] * len(sizes)
                if d == 0:
                    h, c = h0[k], (c0[k] if lstm else None)
                    for t, bs in enumerate(sizes):
                        hn, cn = self._step(xw[t], h[:bs], c[:bs] if lstm else None, w_hh_t, b_hh, w_hr_t)
                        ys[t] = hn
                        h = cat([hn, h[bs:]], 0) if bs < N else hn
                        if lstm:
                            c = cat([cn, c[bs:]], 0) if bs < N else cn
                else:
                    h = c = None
                    for t in range(len(sizes) - 1, -1, -1):
                        bs = sizes[t]
                        have = 0 if h is None else h.shape[0]
                        if bs > have:                              # sequences whose last step is t start here
                            h = h0[k][have:bs] if h is None else cat([h, h0[k][have:bs]], 0)
                            if lstm:
                                c = c0[k][have:bs] if c is None else cat([c, c0[k][have:bs]], 0)
                        h, c = self._step(xw[t], h, c, w_hh_t, b_hh, w_hr_t)
                        ys[t] = h
                outs.append(cat(ys, 0))
                h_n.append(h)
                c_n.append(c)
            x = outs[0] if D == 1 else cat(outs, -1)
            if self.dropout > 0 and self.training and layer < self.num_layers - 1:
                x = _dropout(x, self.dropout, training=True)
        h_n = stack(h_n, 0)
        c_n = stack(c_n, 0) if lstm else None
        if packed.unsorted_indices is not None:
            unsorted = _ints(packed.unsorted_indices)
            h_n = h_n[:, unsorted]
            c_n = c_n[:, unsorted] if lstm else None
        return packed._replace(data=x), ((h_n, c_n) if lstm else h_n)

    def forward(self, input, hx=None):
        name = type(self).__name__
        from ..utils.rnn import PackedSequence
        if isinstance(input, PackedSequence):
            return self._forward_packed(input, hx)
        if not isinstance(input, Tensor):
            raise TypeError(f"{name}: input must be a Tensor or a PackedSequence, got {type(input).__name__}")
        if input.ndim not in (2, 3):
            raise ValueError(f"{name}: Expected input to be 2D or 3D, got {input.ndim}D tensor instead")
        batched = input.ndim == 3
        lstm = self.mode == "LSTM"
        if not batched:
            input = input.unsqueeze(1)
            if hx is not None:
                hx = tuple(h.unsqueeze(1) for h in hx) if lstm else hx.unsqueeze(1)
        elif self.batch_first:
            input = input.transpose(0, 1)
        if input.shape[-1] != self.input_size:
            raise RuntimeError(f"{name}: input.size(-1) must be equal to input_size. Expected {self.input_size}, "
                               f"got {input.shape[-1]}")
        T, N = input.shape[0], input.shape[1]
        D = 2 if self.bidirectional else 1
        real_h = self.proj_size if self.proj_size > 0 else self.hidden_size
        h0, c0 = self._initial_states(name, hx, N, input)
        x = input
        h_n, c_n = [], []
        for layer in range(self.num_layers):
            outs = []
            for d in range(D):
                w_ih, w_hh, b_ih, b_hh, w_hr = self._layer_params(layer, d)
                k = layer * D + d
                xw = _steps(linear(x, w_ih, b_ih))               # one projection of the whole sequence
                w_hh_t = w_hh.T
                w_hr_t = w_hr.T if w_hr is not None else None
                h, c = h0[k], (c0[k] if lstm else None)
                ys = [None] * T
                for t in (range(T - 1, -1, -1) if d else range(T)):
                    h, c = self._step(xw[t], h, c, w_hh_t, b_hh, w_hr_t)
                    ys[t] = h
                outs.append(stack(ys, 0) if T else zeros(0, N, real_h, dtype=input.dtype, device=input.device))
                h_n.append(h)
                c_n.append(c)
            x = outs[0] if D == 1 else cat(outs, -1)
            if self.dropout > 0 and self.training and layer < self.num_layers - 1:
                x = _dropout(x, self.dropout, training=True)
        output = x
        h_n = stack(h_n, 0)
        hidden = (h_n, stack(c_n, 0)) if lstm else h_n
        if not batched:
            output = output.squeeze(1)
            hidden = tuple(h.squeeze(1) for h in hidden) if lstm else hidden.squeeze(1)
        elif self.batch_first:
            output = output.transpose(0, 1)
        return output, hidden


class RNN(RNNBase):
    """Elman RNN: h_t = tanh(x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh) (or relu: ``nonlinearity='relu'``)."""

    def __init__(self, input_size, hidden_size, num_layers=1, nonlinearity="tanh", bias=True, batch_first=False,
                 dropout=0.0, bidirectional=False, device=None, dtype=None):
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"Unknown nonlinearity '{nonlinearity}'. Select from 'tanh' or 'relu'.")
        self.nonlinearity = nonlinearity
        super().__init__("RNN_TANH" if nonlinearity == "tanh" else "RNN_RELU", input_size, hidden_size, num_layers,
                         bias, batch_first, dropout, bidirectional, device=device, dtype=dtype)


class LSTM(RNNBase):
    """LSTM (gates i, f, g, o); forward(input, (h_0, c_0)) -> output, (h_n, c_n); ``proj_size`` projects h."""

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0,
                 bidirectional=False, proj_size=0, device=None, dtype=None):
        super().__init__("LSTM", input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional,
                         proj_size, device=device, dtype=dtype)


class GRU(RNNBase):
    """GRU (gates r, z, n): n = tanh(W_in x + b_in + r * (W_hn h + b_hn)); h' = (1 - z) n + z h."""

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0,
                 bidirectional=False, device=None, dtype=None):
        super().__init__("GRU", input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional,
                         device=device, dtype=dtype)


class RNNCellBase(Module):
    """weight_ih (gates * hidden, input), weight_hh (gates * hidden, hidden), bias_ih, bias_hh."""

    def __init__(self, input_size, hidden_size, bias, num_chunks, device=None, dtype=None):
        super().__init__()
        self.input_size, self.hidden_size, self.bias = input_size, hidden_size, bias
        kw = dict(device=device, dtype=dtype)
        self.weight_ih = Parameter(empty(num_chunks * hidden_size, input_size, **kw))
        self.weight_hh = Parameter(empty(num_chunks * hidden_size, hidden_size, **kw))
        if bias:
            self.bias_ih = Parameter(empty(num_chunks * hidden_size, **kw))
            self.bias_hh = Parameter(empty(num_chunks * hidden_size, **kw))
        else:
            self.register_parameter("bias_ih", None)
            self.register_parameter("bias_hh", None)
        self.reset_parameters()

    def reset_parameters(self):
        stdv = 1.0 / math.sqrt(self.hidden_size) if self.hidden_size > 0 else 0
        for p in self.parameters():
            init.uniform_(p, -stdv, stdv)

    def extra_repr(self):
        s = f"{self.input_size}, {self.hidden_size}"
        if not self.bias:
            s += ", bias=False"
        if getattr(self, "nonlinearity", "tanh") != "tanh":
            s += f", nonlinearity={self.nonlinearity}"
        return s

    def _prepare(self, input, hx, n_states):
        name = type(self).__name__
        if input.ndim not in (1, 2):
            raise ValueError(f"{name}: Expected input to be 1D or 2D, got {input.ndim}D instead")
        if input.shape[-1] != self.input_size:
            raise RuntimeError(f"{name}: input has inconsistent input_size: got {input.shape[-1]} expected "
                               f"{self.input_size}")
        batched = input.ndim == 2
        if not batched:
            input = input.unsqueeze(0)
        N = input.shape[0]
        if hx is None:
            hx = tuple(zeros(N, self.hidden_size, dtype=input.dtype, device=input.device) for _ in range(n_states))
        else:
            hx = tuple(hx) if n_states == 2 else (hx,)
            if not batched:
                hx = tuple(h.unsqueeze(0) for h in hx)
            for h in hx:
                _check_size(name, "hidden", h.shape, (N, self.hidden_size))
        return input, hx, batched

    def _xw(self, input):
        return linear(input, self.weight_ih, self.bias_ih)


class RNNCell(RNNCellBase):
    def __init__(self, input_size, hidden_size, bias=True, nonlinearity="tanh", device=None, dtype=None):
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"Unknown nonlinearity: {nonlinearity}")
        self.nonlinearity = nonlinearity
        super().__init__(input_size, hidden_size, bias, 1, device=device, dtype=dtype)

    def forward(self, input, hx=None):
        input, (h,), batched = self._prepare(input, hx, 1)
        h = _rnn_step(self._xw(input), h, self.weight_hh.T, self.bias_hh, self.nonlinearity)
        return h if batched else h.squeeze(0)


class LSTMCell(RNNCellBase):
    def __init__(self, input_size, hidden_size, bias=True, device=None, dtype=None):
        super().__init__(input_size, hidden_size, bias, 4, device=device, dtype=dtype)

    def forward(self, input, hx=None):
        input, (h, c), batched = self._prepare(input, hx, 2)
        h, c = _lstm_step(self._xw(input), h, c, self.weight_hh.T, self.bias_hh)
        return (h, c) if batched else (h.squeeze(0), c.squeeze(0))


class GRUCell(RNNCellBase):
    def __init__(self, input_size, hidden_size, bias=True, device=None, dtype=None):
        super().__init__(input_size, hidden_size, bias, 3, device=device, dtype=dtype)

    def forward(self, input, hx=None):
        input, (h,), batched = self._prepare(input, hx, 1)
        h = _gru_step(self._xw(input), h, self.weight_hh.T, self.bias_hh)
        return h if batched else h.squeeze(0)

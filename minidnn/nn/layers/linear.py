"""Identity and Linear: layers written in Tensor ops alone (no backend primitive needed)."""
from __future__ import annotations

from ...creation import empty
from .. import init
from ..functional import linear
from ..module import REGISTERED_LAYERS, Module, registered
from ..parameter import Parameter

__all__ = ["Identity", "Linear"]


class Identity(Module):
    """Returns its input; accepts and ignores any constructor arguments (a drop-in placeholder)."""

    def __init__(self, *args, **kwargs):
        super().__init__()

    def forward(self, x):
        return x


_WEIGHT_BIAS = ("weight", "bias")


class Linear(Module):
    """y = x @ weight.T + bias, with weight (out_features, in_features) and PyTorch's default init."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None):
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = Parameter(empty(out_features, in_features, device=device, dtype=dtype))
        if bias:
            self.bias = Parameter(empty(out_features, device=device, dtype=dtype))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self):
        init.default_layer_init_(self.weight, self.bias)

    def forward(self, x):
        if x.shape[-1:] != (self.in_features,):
            raise RuntimeError(f"Linear: input has shape {tuple(x.shape)} but the layer expects a last dimension of "
                               f"{self.in_features} (weight {tuple(self.weight.shape)})")
        r = registered(self, _WEIGHT_BIAS) if REGISTERED_LAYERS[0] else None     # (module.registered: one read)
        if r is None:
            return linear(x, self.weight, self.bias)
        return linear(x, r[0], r[1])

    def _macs(self, input, output):
        # One multiply-add per weight entry per output row (the bias add is not a MAC).
        return self.in_features * output.numel()

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"

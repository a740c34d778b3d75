"""Prototype a new layer: Swish with a learnable slope, y = x * sigmoid(beta * x) (Ramachandran et al. 2017).

    python examples/custom_layer.py          # gradcheck, then train a small MLP on the digits (~97%)

Three steps, the way any new op enters minidnn:
  1. an ``autograd.Function`` with a hand-written backward;
  2. ``gradcheck`` (float64 finite differences) and ``gradgradcheck`` before trusting it;
  3. a ``Module`` that owns the parameter, used like any built-in layer.
"""
from __future__ import annotations

import sys

from _common import fit, load_data, make_parser

import minidnn as mdn
from minidnn import nn, optim
from minidnn.autograd import Function, gradcheck, gradgradcheck
from minidnn.data import DataLoader
from minidnn.data import transforms as T


class SwishFunction(Function):
    """x: (..., F), beta: (F,) (one slope per feature, broadcast along the last axis).

        dy/dx    = s + beta * x * s * (1 - s)       where s = sigmoid(beta * x)
        dy/dbeta = x^2 * s * (1 - s), summed over every axis that beta was broadcast along
    """

    @staticmethod
    def forward(ctx, x, beta):
        # Save the inputs, not s: backward recomputes s from them with Tensor ops, so that under
        # create_graph=True the recomputation is recorded and second derivatives stay correct.  (A saved s
        # would be a constant to the second backward.)  Recomputing one sigmoid is cheap.
        ctx.save_for_backward(x, beta)
        return x * (beta * x).sigmoid()

    @staticmethod
    def backward(ctx, grad_y):
        x, beta = ctx.saved_tensors
        s = (beta * x).sigmoid()
        ds = s * (1 - s)                                  # sigmoid'(beta * x)
        grad_x = grad_y * (s + beta * x * ds)
        grad_beta = (grad_y * x * x * ds).sum_to(beta.shape)   # undo the broadcast of beta
        return grad_x, grad_beta


class Swish(nn.Module):
    """Swish with a learnable slope per feature, initialised to ``beta`` (1.0 gives SiLU)."""

    def __init__(self, num_features, beta=1.0):
        super().__init__()
        self.beta = nn.Parameter(mdn.full((num_features,), beta))

    def forward(self, x):
        return SwishFunction.apply(x, self.beta)

    def extra_repr(self):
        return f"num_features={self.beta.shape[0]}"


def check_gradients():
    """Analytical against numerical gradients, first and second order, in float64."""
    x = mdn.randn(5, 7, dtype=mdn.float64, requires_grad=True)
    beta = (mdn.rand(7, dtype=mdn.float64) + 0.5).requires_grad_()
    gradcheck(SwishFunction.apply, (x, beta))          # raises GradcheckError naming the worst element
    gradgradcheck(SwishFunction.apply, (x, beta))
    # Swish with beta = 1 is SiLU: the new op agrees with the built-in one.
    silu = nn.functional.silu(x)
    assert float((SwishFunction.apply(x, mdn.ones(7, dtype=mdn.float64)) - silu).abs().max()) < 1e-12
    print("gradcheck and gradgradcheck passed")


def main(argv=None):
    parser = make_parser("custom_layer", __doc__.split("\n\n")[0], epochs=20, batch_size=32, lr=3e-3)
    args = parser.parse_args(argv)
    mdn.manual_seed(args.seed)
    check_gradients()

    train_set, test_set, spec = load_data(args)
    normalize = T.Normalize(spec.mean, spec.std)

    def make_train_loader():
        return DataLoader(train_set, batch_size=args.batch_size, shuffle=True, device=args.device, transform=normalize)
    test_loader = DataLoader(test_set, batch_size=args.batch_size, device=args.device, transform=normalize)

    features = spec.channels * spec.size * spec.size
    model = nn.Sequential(nn.Flatten(), nn.Linear(features, 128), Swish(128), nn.Linear(128, 64), Swish(64),
                          nn.Linear(64, spec.num_classes)).to(args.device)
    optimizer = optim.Adam(model.parameters(), lr=args.lr)
    fit(model, optimizer, make_train_loader, test_loader, args)
    # print(..., file=sys.stderr): stdout's last line stays "test accuracy: ...".
    betas = [m.beta for m in model.modules() if isinstance(m, Swish)]
    print("learned beta (mean, min, max) per Swish layer: "
          + "; ".join(f"{float(b.mean()):.2f}, {float(b.min()):.2f}, {float(b.max()):.2f}" for b in betas),
          file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())

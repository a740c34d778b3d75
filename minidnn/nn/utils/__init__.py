"""minidnn.nn.utils: gradient clipping; variable-length sequences (nn.utils.rnn)."""
from . import rnn  # noqa: F401
from .clip_grad import clip_grad_norm_, clip_grad_value_  # noqa: F401

__all__ = ["clip_grad_norm_", "clip_grad_value_", "rnn"]

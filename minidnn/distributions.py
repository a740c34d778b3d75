"""minidnn.distributions: PyTorch's ``Categorical`` (probs or logits; sample, log_prob, entropy), differentiable
in probs/logits through Tensor ops.

Shapes: probs / logits (*batch_shape, K); a value (*sample_shape, *batch_shape) of category indices.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from .backend.errors import ArgumentError
from .tensor import Tensor
from .creation import tensor as _tensor

__all__ = ["Distribution", "Categorical", "kl_divergence"]


def _shape(sample_shape):
    if isinstance(sample_shape, numbers.Integral):
        return (int(sample_shape),)
    return tuple(int(s) for s in sample_shape)


class Distribution:
    """The part of PyTorch's base class that Categorical needs: batch_shape, event_shape, sample/rsample."""

    has_rsample = False
    _validate_default = True

    def __init__(self, batch_shape=(), event_shape=(), validate_args=None):
        self._batch_shape, self._event_shape = tuple(batch_shape), tuple(event_shape)
        self._validate_args = self._validate_default if validate_args is None else bool(validate_args)

    @property
    def batch_shape(self):
        return self._batch_shape

    @property
    def event_shape(self):
        return self._event_shape

    def rsample(self, sample_shape=()):
        raise NotImplementedError(f"{type(self).__name__} has no reparameterised sample (rsample)")

    def sample_n(self, n):
        return self.sample((n,))

    def __repr__(self):
        return f"{type(self).__name__}()"


class Categorical(Distribution):
    """A distribution over {0, ..., K-1} per batch element.  Exactly one of ``probs`` (non-negative, normalised
    along the last dim) and ``logits`` (unnormalised log-probabilities) is given; the other is derived as
    PyTorch derives it (logits = log(probs clamped to [eps, 1 - eps]); probs = softmax(logits))."""

    def __init__(self, probs=None, logits=None, validate_args=None):
        if (probs is None) == (logits is None):
            raise ValueError("Either `probs` or `logits` must be specified, but not both.")
        given = probs if probs is not None else logits
        if not isinstance(given, Tensor):
            given = _tensor(np.asarray(given, dtype=np.float32))
        if given.ndim < 1:
            raise ValueError("`probs` parameter must be at least one-dimensional." if probs is not None else
                             "`logits` parameter must be at least one-dimensional.")
        if probs is not None:
            if validate_args is not False:
                arr = np.asarray(given.detach().cpu().numpy(), dtype=np.float64)
                if not (np.all(arr >= 0) and np.all(np.isfinite(arr))) or np.any(arr.sum(-1) <= 0):
                    raise ValueError(f"Expected parameter probs (Tensor of shape {tuple(given.shape)}) of "
                                     f"distribution Categorical to satisfy the constraint Simplex(), but found "
                                     f"invalid values:\n{given}")
            self._probs = given / given.sum(-1, keepdim=True)
            self._logits = None
        else:
            if validate_args is not False and np.isnan(given.detach().cpu().numpy()).any():
                raise ValueError(f"Expected parameter logits (Tensor of shape {tuple(given.shape)}) of distribution "
                                 "Categorical to satisfy the constraint IndependentConstraint(Real(), 1), but found "
                                 f"invalid values:\n{given}")
            self._logits = given - given.logsumexp(-1, keepdim=True)
            self._probs = None
        self._param = given
        self._num_events = given.shape[-1]
        super().__init__(tuple(given.shape[:-1]), (), validate_args)

    # -- parameters -------------------------------------------------------------------------------------------
    @property
    def probs(self):
        if self._probs is None:
            self._probs = self._logits.softmax(-1)
        return self._probs

    @property
    def logits(self):
        if self._logits is None:
            eps = float(np.finfo(self._probs.dtype).eps)
            self._logits = self._probs.clamp(eps, 1 - eps).log()
        return self._logits

    @property
    def param_shape(self):
        return tuple(self._param.shape)

    @property
    def mean(self):
        return _tensor(np.full(self.batch_shape, np.nan), dtype=self.probs.dtype, device=self.probs.device)

    @property
    def mode(self):
        return self.probs.argmax(-1)

    @property
    def variance(self):
        return self.mean

    @property
    def support(self):
        return ("integer_interval", 0, self._num_events - 1)

    # -- sampling and densities -------------------------------------------------------------------------------
    def sample(self, sample_shape=(), *, generator=None):
        """Indices of shape (*sample_shape, *batch_shape) (int64), drawn with replacement per batch element.
        ``generator`` (a minidnn.Generator) is a minidnn extension for reproducible draws."""
        from . import multinomial, no_grad
        shape = _shape(sample_shape)
        n = int(np.prod(shape)) if shape else 1
        with no_grad():
            probs_2d = self.probs.detach().reshape(-1, self._num_events)
            draws = multinomial(probs_2d, n, True, generator=generator)        # (B, n)
            return draws.T.reshape(*shape, *self.batch_shape)

    def log_prob(self, value):
        """log p(value), broadcasting ``value`` against batch_shape (PyTorch's rule)."""
        if not isinstance(value, Tensor):
            value = _tensor(np.asarray(value), device=self._param.device)
        if value.dtype.kind not in "iub":
            if not bool((value == value.round()).all().item()):
                raise ValueError(f"Categorical.log_prob: value must hold integer category indices, got {value}")
        v = value.detach().cpu().numpy().astype(np.int64)
        if self._validate_args and ((v < 0).any() or (v >= self._num_events).any()):
            raise ValueError(f"Categorical.log_prob: the value {value} is not in the support {{0, ..., "
                             f"{self._num_events - 1}}}")
        try:
            shape = np.broadcast_shapes(v.shape, self.batch_shape)
        except ValueError:
            raise ArgumentError(f"Categorical.log_prob: value of shape {v.shape} does not broadcast with batch "
                                f"shape {self.batch_shape}") from None
        logits = self.logits
        lp = logits.expand(*shape, self._num_events).reshape(-1, self._num_events)
        idx = np.broadcast_to(v, shape).reshape(-1)
        return lp[np.arange(idx.size), idx].reshape(*shape)

    def entropy(self):
        """-sum p log p over the categories (a -inf logit contributes 0, as in PyTorch)."""
        logits = self.logits
        lo = float(np.finfo(logits.dtype).min)
        return -(logits.clamp(min=lo) * self.probs).sum(-1)

    def enumerate_support(self, expand=True):
        """0..K-1 shaped (K, *batch_shape) (or (K, 1, ..., 1) when ``expand`` is False)."""
        from . import arange
        values = arange(self._num_events, device=self._param.device).reshape(
            (self._num_events,) + (1,) * len(self.batch_shape))
        return values.expand(self._num_events, *self.batch_shape) if expand else values

    def perplexity(self):
        return self.entropy().exp()

    def __repr__(self):
        return f"Categorical({'probs' if self._logits is None or self._probs is not None else 'logits'}: " \
               f"{tuple(self._param.shape)})"


def kl_divergence(p, q):
    """KL(p || q) for two Categoricals (PyTorch's rule: inf where q is 0 and p is not, 0 where p is 0)."""
    if not (isinstance(p, Categorical) and isinstance(q, Categorical)):
        raise NotImplementedError(f"kl_divergence: no KL for {type(p).__name__} and {type(q).__name__}")
    from . import where
    t = p.probs * (p.logits - q.logits)
    t = where(q.probs == 0, math.inf, t)
    t = where(p.probs == 0, 0.0, t)
    return t.sum(-1)

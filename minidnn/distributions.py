"""minidnn.distributions: PyTorch's ``Categorical`` (probs or logits; sample, log_prob, entropy), ``Normal``,
``Bernoulli`` and ``Uniform`` (sample, rsample where PyTorch has it, log_prob, entropy, moments), differentiable in
their parameters through Tensor ops, and ``kl_divergence`` for pairs of one family.

Shapes: Categorical's probs / logits (*batch_shape, K) and values (*sample_shape, *batch_shape) of category indices;
the others' parameters broadcast to batch_shape, their values (*sample_shape, *batch_shape).  validate_args (default
on, as PyTorch's) checks parameters at construction and values in log_prob, with PyTorch's messages (on the host).
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from .autograd import no_grad
from .backend.errors import ArgumentError
from .creation import arange, rand, randn
from .creation import tensor as _tensor
from .ops import where
from .random import multinomial
from .tensor import Tensor

__all__ = ["Distribution", "Categorical", "Normal", "Bernoulli", "Uniform", "kl_divergence"]


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
        values = arange(self._num_events, device=self._param.device).reshape(
            (self._num_events,) + (1,) * len(self.batch_shape))
        return values.expand(self._num_events, *self.batch_shape) if expand else values

    def perplexity(self):
        return self.entropy().exp()

    def __repr__(self):
        return f"Categorical({'probs' if self._logits is None or self._probs is not None else 'logits'}: " \
               f"{tuple(self._param.shape)})"


# ---- Normal, Bernoulli, Uniform -------------------------------------------------------------------------------

def _broadcast_all(op, *values):
    """PyTorch's broadcast_all: numbers become tensors of the first tensor's dtype and device (the default dtype
    when there is none), then all are expanded to one shape."""
    like = next((v for v in values if isinstance(v, Tensor)), None)
    out = []
    for v in values:
        if isinstance(v, Tensor):
            out.append(v)
        elif isinstance(v, numbers.Number):
            out.append(_tensor(float(v), dtype=None if like is None else like.dtype,
                               device=None if like is None else like.device))
        else:
            raise ArgumentError(f"{op}: parameters must be Tensors or numbers, got {type(v).__name__}")
    try:
        shape = np.broadcast_shapes(*(tuple(t.shape) for t in out))
    except ValueError:
        raise ArgumentError(f"{op}: parameter shapes {[tuple(t.shape) for t in out]} do not broadcast") from None
    return [t.expand(*shape) for t in out]


def _host(t):
    return np.asarray(t.detach().cpu().numpy(), dtype=np.float64)


class _Elementwise(Distribution):
    """The shared part of the one-value-per-batch-element distributions: parameter and value validation with
    PyTorch's messages, shape of a draw, repr."""

    _params = ()
    _support = "Real()"

    def _describe(self):
        parts = []
        for name in self._params:
            t = getattr(self, name)
            parts.append(f"{name}: {t.item() if t.numel() == 1 and not t.shape else tuple(t.shape)}")
        return f"{type(self).__name__}({', '.join(parts)})"

    def __repr__(self):
        return self._describe()

    def _invalid_param(self, name, value, constraint, bad):
        if bool(np.any(bad)):
            raise ValueError(f"Expected parameter {name} (Tensor of shape {tuple(value.shape)}) of distribution "
                             f"{self._describe()} to satisfy the constraint {constraint}, but found invalid values:"
                             f"\n{value}")

    def _in_support(self, v):
        return ~np.isnan(v)

    def _validate_sample(self, value):
        if not isinstance(value, Tensor):
            raise ValueError("The value argument to log_prob must be a Tensor")
        shape = tuple(value.shape)
        try:
            np.broadcast_shapes(shape, self.batch_shape)
        except ValueError:
            raise ValueError(f"Value is not broadcastable with batch_shape+event_shape: {shape} vs "
                             f"{self.batch_shape}.") from None
        if self._validate_args and not bool(np.all(self._in_support(_host(value)))):
            raise ValueError(f"Expected value argument (Tensor of shape {shape}) to be within the support "
                             f"({self.support}) of the distribution {self._describe()}, but found invalid values:"
                             f"\n{value}")

    def _extended_shape(self, sample_shape):
        return _shape(sample_shape) + self.batch_shape

    @property
    def support(self):
        return self._support

    @property
    def stddev(self):
        return self.variance.sqrt()

    def sample(self, sample_shape=()):
        """A draw of shape (*sample_shape, *batch_shape), outside autograd."""
        with no_grad():
            return self.rsample(sample_shape).detach()


class Normal(_Elementwise):
    """The normal distribution N(loc, scale^2) (``torch.distributions.Normal``): loc and scale (> 0) broadcast to
    batch_shape; rsample is loc + eps * scale with eps ~ N(0, 1), so draws carry gradients to both parameters."""

    has_rsample = True
    _params = ("loc", "scale")

    def __init__(self, loc, scale, validate_args=None):
        self.loc, self.scale = _broadcast_all("Normal", loc, scale)
        super().__init__(tuple(self.loc.shape), (), validate_args)
        if self._validate_args:
            self._invalid_param("loc", self.loc, "Real()", np.isnan(_host(self.loc)))
            self._invalid_param("scale", self.scale, "GreaterThan(lower_bound=0.0)", ~(_host(self.scale) > 0))

    @property
    def mean(self):
        return self.loc

    @property
    def mode(self):
        return self.loc

    @property
    def stddev(self):
        return self.scale

    @property
    def variance(self):
        return self.scale * self.scale

    def rsample(self, sample_shape=()):
        """loc + eps * scale, eps ~ N(0, 1) from minidnn's generator (differentiable in loc and scale)."""
        eps = randn(*self._extended_shape(sample_shape), dtype=self.loc.dtype, device=self.loc.device)
        return self.loc + eps * self.scale

    def log_prob(self, value):
        """-(value - loc)^2 / (2 scale^2) - log(scale) - log(sqrt(2 pi))."""
        self._validate_sample(value)
        d = value - self.loc
        return -(d * d) / (2 * self.variance) - self.scale.log() - math.log(math.sqrt(2 * math.pi))

    def entropy(self):
        """0.5 + 0.5 log(2 pi) + log(scale)."""
        return self.scale.log() + (0.5 + 0.5 * math.log(2 * math.pi))


class Bernoulli(_Elementwise):
    """A {0, 1} variable per batch element (``torch.distributions.Bernoulli``), from ``probs`` in [0, 1] or
    ``logits``; the other is derived as PyTorch derives it (logits = log(p) - log(1 - p) of p clamped to
    [eps, 1 - eps]; probs = sigmoid(logits)).  Draws are 0./1. of the parameter's dtype; there is no rsample."""

    _support = "Boolean()"

    def __init__(self, probs=None, logits=None, validate_args=None):
        if (probs is None) == (logits is None):
            raise ValueError("Either `probs` or `logits` must be specified, but not both.")
        given, = _broadcast_all("Bernoulli", probs if probs is not None else logits)
        self._probs, self._logits = (given, None) if probs is not None else (None, given)
        self._params = ("probs",) if probs is not None else ("logits",)
        super().__init__(tuple(given.shape), (), validate_args)
        if self._validate_args:
            a = _host(given)
            if probs is not None:
                self._invalid_param("probs", given, "Interval(lower_bound=0.0, upper_bound=1.0)",
                                    ~((a >= 0) & (a <= 1)))
            else:
                self._invalid_param("logits", given, "Real()", np.isnan(a))

    @property
    def probs(self):
        if self._probs is None:
            self._probs = self._logits.sigmoid()
        return self._probs

    @property
    def logits(self):
        if self._logits is None:
            eps = float(np.finfo(self._probs.dtype).eps)
            p = self._probs.clamp(eps, 1 - eps)
            self._logits = p.log() - (-p).log1p()
        return self._logits

    @property
    def param_shape(self):
        return self.batch_shape

    @property
    def mean(self):
        return self.probs

    @property
    def mode(self):
        p = self.probs
        return where(p == 0.5, math.nan, (p >= 0.5).astype(p.dtype))

    @property
    def variance(self):
        return self.probs * (1 - self.probs)

    def _in_support(self, v):
        return (v == 0) | (v == 1)

    def sample(self, sample_shape=()):
        """0./1. draws of shape (*sample_shape, *batch_shape), 1 with probability probs (outside autograd)."""
        with no_grad():
            p = self.probs.detach()
            u = rand(*self._extended_shape(sample_shape), dtype=p.dtype, device=p.device)
            return (u < p).astype(p.dtype)

    def rsample(self, sample_shape=()):
        """Not available, as in PyTorch: the draws are discrete (use sample, or a relaxed distribution)."""
        raise NotImplementedError("Bernoulli has no reparameterised sample (rsample): its draws are discrete")

    def log_prob(self, value):
        """value log(p) + (1 - value) log(1 - p), computed from the logits stably."""
        from .nn.functional import binary_cross_entropy_with_logits
        self._validate_sample(value)
        logits = self.logits
        shape = np.broadcast_shapes(tuple(value.shape), tuple(logits.shape))
        return -binary_cross_entropy_with_logits(logits.expand(*shape), value.expand(*shape), reduction="none")

    def entropy(self):
        """-(p log p + (1 - p) log(1 - p)), from the logits (so p = 0 or 1 give ~0, as PyTorch's)."""
        from .nn.functional import binary_cross_entropy_with_logits
        return binary_cross_entropy_with_logits(self.logits, self.probs, reduction="none")

    def enumerate_support(self, expand=True):
        """[0., 1.] shaped (2, *batch_shape) (or (2, 1, ..., 1) when ``expand`` is False)."""
        values = _tensor(np.array([0.0, 1.0]), dtype=self.probs.dtype, device=self.probs.device)
        values = values.reshape((2,) + (1,) * len(self.batch_shape))
        return values.expand(2, *self.batch_shape) if expand else values


class Uniform(_Elementwise):
    """The uniform distribution on [low, high) (``torch.distributions.Uniform``): low < high broadcast to
    batch_shape; rsample is low + u (high - low) with u ~ U(0, 1), differentiable in low and high."""

    has_rsample = True
    _params = ("low", "high")

    def __init__(self, low, high, validate_args=None):
        self.low, self.high = _broadcast_all("Uniform", low, high)
        super().__init__(tuple(self.low.shape), (), validate_args)
        if self._validate_args:
            self._invalid_param("low", self.low, f"LessThan(upper_bound={self.high})",
                                ~(_host(self.low) < _host(self.high)))

    @property
    def support(self):
        def bound(t):
            return t.item() if t.numel() == 1 and not t.shape else t
        return f"Interval(lower_bound={bound(self.low)}, upper_bound={bound(self.high)})"

    def _in_support(self, v):
        return (_host(self.low) <= v) & (v <= _host(self.high))

    @property
    def mean(self):
        return (self.high + self.low) / 2

    @property
    def mode(self):
        return self.high * math.nan

    @property
    def stddev(self):
        return (self.high - self.low) / 12 ** 0.5

    @property
    def variance(self):
        d = self.high - self.low
        return d * d / 12

    def rsample(self, sample_shape=()):
        """low + u (high - low), u ~ U(0, 1) from minidnn's generator."""
        u = rand(*self._extended_shape(sample_shape), dtype=self.low.dtype, device=self.low.device)
        return self.low + u * (self.high - self.low)

    def log_prob(self, value):
        """-log(high - low) inside [low, high), -inf outside."""
        self._validate_sample(value)
        inside = (self.low <= value) & (self.high > value)
        return where(inside, -(self.high - self.low).log(), -math.inf)

    def cdf(self, value):
        """(value - low) / (high - low), clamped to [0, 1]."""
        self._validate_sample(value)
        return ((value - self.low) / (self.high - self.low)).clamp(0, 1)

    def icdf(self, value):
        """low + value (high - low): the inverse of cdf on [0, 1]."""
        return value * (self.high - self.low) + self.low

    def entropy(self):
        """log(high - low)."""
        return (self.high - self.low).log()


# ---- kl_divergence -----------------------------------------------------------------------------------------

def _kl_categorical(p, q):
    t = p.probs * (p.logits - q.logits)
    t = where(q.probs == 0, math.inf, t)
    t = where(p.probs == 0, 0.0, t)
    return t.sum(-1)


def _kl_normal(p, q):
    ratio = p.scale / q.scale
    var_ratio = ratio * ratio
    t = (p.loc - q.loc) / q.scale
    return (var_ratio + t * t - 1 - var_ratio.log()) * 0.5


def _kl_bernoulli(p, q):
    from .nn.functional import softplus
    t1 = p.probs * (softplus(-q.logits) - softplus(-p.logits))
    t1 = where(p.probs == 0, 0.0, where(q.probs == 0, math.inf, t1))
    t2 = (1 - p.probs) * (softplus(q.logits) - softplus(p.logits))
    t2 = where(p.probs == 1, 0.0, where(q.probs == 1, math.inf, t2))
    return t1 + t2


def _kl_uniform(p, q):
    out = ((q.high - q.low) / (p.high - p.low)).log()
    return where((q.low > p.low) | (q.high < p.high), math.inf, out)


_KL = {Categorical: _kl_categorical, Normal: _kl_normal, Bernoulli: _kl_bernoulli, Uniform: _kl_uniform}


def kl_divergence(p, q):
    """KL(p || q) for two distributions of one family, Categorical, Normal, Bernoulli or Uniform (PyTorch's
    formulas: inf where q has no mass and p has, 0 where p has none)."""
    if type(p) is not type(q) or type(p) not in _KL:
        raise NotImplementedError(f"kl_divergence: no KL for {type(p).__name__} and {type(q).__name__}")
    return _KL[type(p)](p, q)

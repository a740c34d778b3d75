"""Public randomness, PyTorch's API: ``Generator``, the per-device default generators, ``manual_seed``,
``seed``, ``initial_seed``, ``get_rng_state`` / ``set_rng_state`` and ``fork_rng``.

Every random draw in minidnn (``rand``/``randn``/``randint``/``randperm``/``multinomial``, ``Tensor.uniform_``,
initialisation, dropout, random transforms, samplers, the DataLoader's shuffle and worker seeds) comes
from a ``Generator``: the one passed as ``generator=``, or the default generator of the device.  A
generator's state is 64 bytes (a uint8 Tensor, ``get_state``), so a checkpoint can hold it and a resumed
run continues the very same stream.  The engines behind it (NumPy PCG64 on cpu, a counter-based Philox
stream on cuda) live in ``minidnn/backend/rng.py``.

As in PyTorch, every generator starts from the seed 67280421310721 until it is seeded, so a fresh process
draws the same numbers each time; ``manual_seed(s)`` seeds the cpu generator and every GPU's.
"""
from __future__ import annotations

import contextlib
import numbers
import secrets

import numpy as np

from .backend import devices as _dev
from .backend import rng as _rng

__all__ = ["Generator", "default_generator", "manual_seed", "seed", "initial_seed", "get_rng_state", "randperm",
           "multinomial",
           "set_rng_state", "fork_rng", "cuda_get_rng_state", "cuda_set_rng_state", "cuda_manual_seed",
           "cuda_manual_seed_all"]

DEFAULT_SEED = 67280421310721        # PyTorch's default_rng_seed_val
_MASK64 = (1 << 64) - 1


def _check_seed(value, where):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{where}: seed must be an int, got {type(value).__name__} {value!r}")
    value = int(value)
    if not -(1 << 63) <= value < (1 << 64):
        raise RuntimeError(f"{where}: seed {value} is out of range [-2**63, 2**64)")
    return value & _MASK64           # PyTorch keeps a negative seed as its two's-complement uint64


class Generator:
    """A random stream on one device: ``Generator(device="cpu")``, PyTorch's ``torch.Generator``.

    ``manual_seed(s)`` restarts it from ``s`` (returns the generator), ``seed()`` from a fresh
    nondeterministic seed (returns it), ``initial_seed()`` is the last seed, ``get_state()`` / ``set_state(t)``
    save and restore the exact position in the stream (a 64-byte uint8 Tensor).  Generators are
    picklable (they carry their state), so datasets and samplers holding one can go to worker processes.
    """

    def __init__(self, device="cpu"):
        self._device = _dev.device(device)
        if self._device.type == "cuda" and self._device.index is None:
            self._device = _dev.device(f"cuda:{_current_cuda_index()}")
        self._initial_seed = DEFAULT_SEED
        self._eng = None              # created on first draw: no GPU work for a generator never used

    @property
    def device(self):
        return self._device

    def manual_seed(self, seed):
        s = _check_seed(seed, "Generator.manual_seed")
        self._reseed(s)
        return self

    def seed(self):
        s = secrets.randbits(63)
        self._reseed(s)
        return s

    def _reseed(self, s):
        old = self._eng
        self._initial_seed, self._eng = s, None
        if old is not None and hasattr(old, "adopt_device_state"):     # keep captured graphs' addresses valid
            self._replace_engine(_rng.new_engine(self._device, s), old)

    def _replace_engine(self, eng, old):
        if old is not None and hasattr(eng, "adopt_device_state"):
            with _dev.device_guard(self._device):
                eng.adopt_device_state(old)
        self._eng = eng

    def initial_seed(self):
        return self._initial_seed

    def get_state(self):
        """The exact position in the stream: a uint8 cpu Tensor of 64 bytes."""
        from .tensor import Tensor
        return Tensor._from_array(_rng.engine_state(self._engine(), self._initial_seed))

    def set_state(self, new_state):
        """Restore a state from ``get_state`` (of a generator of the same device type)."""
        arr = _state_array(new_state, "Generator.set_state")
        if self._eng is None:
            # validate before creating anything, so a bad state leaves the generator untouched
            kind = _rng.decode_state(arr, "Generator.set_state")[0]
            if kind != self._device.type:
                raise RuntimeError(f"Generator.set_state: the state is of a {kind} generator, this generator "
                                   f"is on {self._device}")
        eng = _rng.new_engine(self._device, 0)
        self._initial_seed = _rng.set_engine_state(eng, arr, "Generator.set_state")
        self._replace_engine(eng, self._eng)
        return self

    def _engine(self):
        """The engine that draws (``random``/``standard_normal``/``integers``/``permutation``)."""
        if self._eng is None:
            with _dev.device_guard(self._device):
                self._eng = _rng.new_engine(self._device, self._initial_seed)
        return self._eng

    def __getstate__(self):
        state = None if self._eng is None else _rng.engine_state(self._eng, self._initial_seed)
        return {"device": str(self._device), "initial_seed": self._initial_seed, "state": state}

    def __setstate__(self, d):
        self._device, self._initial_seed, self._eng = _dev.device(d["device"]), d["initial_seed"], None
        if d["state"] is not None:
            self.set_state(d["state"])

    def __repr__(self):
        return f"<minidnn.Generator device='{self._device}' initial_seed={self._initial_seed}>"


def _current_cuda_index():
    try:
        return _dev.current_cuda_index()
    except Exception:  # noqa: BLE001  (no CuPy: let device() below report it)
        return 0


def _state_array(state, where):
    """A NumPy uint8 array from a Tensor (any device) or an array; TypeError for anything else."""
    from .tensor import Tensor
    if isinstance(state, Tensor):
        state = state.data
    if not (isinstance(state, np.ndarray) or _dev.is_cuda_array(state)):
        raise TypeError(f"{where}: expected a uint8 Tensor from get_state/get_rng_state, got "
                        f"{type(state).__name__}")
    return np.asarray(_dev.to_device(state, _dev.CPU))


# -- the default generators: one per device, created on first use ---------------------------------------
_defaults: dict = {}
_default_seeds = {"cpu": DEFAULT_SEED, "cuda": DEFAULT_SEED}   # where a default generator created later starts


def default_generator(device=None) -> Generator:
    """The default ``Generator`` of ``device`` (cpu when None; "cuda" means the current GPU)."""
    dev = _dev.CPU if device is None else _dev.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = _dev.device(f"cuda:{_current_cuda_index()}")
    g = _defaults.get(dev)
    if g is None:
        g = _defaults[dev] = Generator(dev).manual_seed(_default_seeds[dev.type])
    return g


def engine_for(dev, generator=None):
    """The engine a draw on device ``dev`` uses: ``generator``'s (which must be on ``dev``) or the default's."""
    dev = _dev.device(dev)
    if generator is None:
        return default_generator(dev)._engine()
    if not isinstance(generator, Generator):
        raise TypeError(f"generator must be a minidnn.Generator, got {type(generator).__name__}")
    if generator.device.type != dev.type or (dev.index is not None and generator.device.index != dev.index):
        raise RuntimeError(f"Expected a '{dev.type}' device type for generator but found "
                           f"'{generator.device}'")
    return generator._engine()


def manual_seed(seed) -> Generator:
    """Seed the cpu generator and every GPU's; returns the cpu default generator (as PyTorch)."""
    s = _check_seed(seed, "manual_seed")
    _default_seeds["cpu"] = _default_seeds["cuda"] = s
    for g in _defaults.values():
        g.manual_seed(s)
    return default_generator()


def seed() -> int:
    """Seed every default generator from a fresh nondeterministic seed; returns it."""
    s = secrets.randbits(63)
    manual_seed(s)
    return s


def initial_seed() -> int:
    """The seed the cpu default generator started from (torch.initial_seed): the last manual_seed or seed() value."""
    return default_generator().initial_seed()


def get_rng_state():
    """The cpu default generator's state (a uint8 Tensor); ``set_rng_state`` puts it back."""
    return default_generator().get_state()


def set_rng_state(new_state) -> None:
    """Restore the cpu default generator to a state from ``get_rng_state`` (a uint8 tensor; torch.set_rng_state), so the
    following draws repeat; a state of another device type raises."""
    default_generator().set_state(new_state)


def cuda_get_rng_state(device="cuda"):
    """A GPU's default generator state (``minidnn.cuda.get_rng_state``)."""
    return default_generator(_cuda_device(device)).get_state()


def cuda_set_rng_state(new_state, device="cuda") -> None:
    default_generator(_cuda_device(device)).set_state(new_state)


def cuda_manual_seed(seed, device="cuda") -> None:
    default_generator(_cuda_device(device)).manual_seed(seed)


def cuda_manual_seed_all(seed) -> None:
    """Seed every GPU's default generator (the cpu one is left alone)."""
    s = _check_seed(seed, "manual_seed_all")
    _default_seeds["cuda"] = s
    for dev, g in _defaults.items():
        if dev.type == "cuda":
            g.manual_seed(s)


def _cuda_device(spec):
    if isinstance(spec, numbers.Integral) and not isinstance(spec, bool):
        spec = f"cuda:{int(spec)}"
    dev = _dev.device(spec)
    if dev.type != "cuda":
        raise ValueError(f"expected a cuda device, got {dev}")
    return dev


@contextlib.contextmanager
def fork_rng(devices=None, enabled=True):
    """Inside the block draw freely; on exit the cpu generator (and those of ``devices``: GPU indices or
    names, default the GPUs whose generators exist) are back where they were."""
    if not enabled:
        yield
        return
    if devices is None:
        devs = [d for d in _defaults if d.type == "cuda"]
    else:
        devs = [_cuda_device(d) for d in devices]
    saved = [(default_generator(), get_rng_state())] + [(default_generator(d), default_generator(d).get_state())
                                                         for d in devs]
    try:
        yield
    finally:
        for g, st in saved:
            g.set_state(st)


# -- random functions that need more than one draw ----------------------------------------------------------
def randperm(n, *, generator=None, dtype=None, device=None, requires_grad=False):
    """A random permutation of ``0 .. n-1`` (int64 unless ``dtype``), PyTorch's ``torch.randperm``."""
    from .tensor import Tensor, _to_dtype
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 0:
        raise RuntimeError(f"randperm: n must be a non-negative int, got {n!r}")
    dev = _dev.device(device)
    dt = _to_dtype(dtype) or np.dtype(np.int64)
    if requires_grad:
        raise RuntimeError(f"randperm: only floating point tensors can require gradients, got dtype {dt}")
    with _dev.device_guard(dev):
        order = engine_for(dev, generator).permutation(int(n))
        return Tensor._from_array(order.astype(dt, copy=False))


def multinomial_indices(weights, num_samples, replacement, engine, where="multinomial"):
    """Category indices (int64, shape weights.shape[:-1] + (num_samples,)) drawn from the rows of ``weights``
    (1-D or 2-D, non-negative, not necessarily normalised) with ``engine``'s uniforms.

    With replacement: each draw inverts the row's cumulative distribution at a uniform u (searchsorted).
    Without: the exponential race -- category c gets the key E_c / w_c with E_c ~ Exp(1), and the
    ``num_samples`` smallest keys in ascending order are exactly sequential sampling without replacement.
    Zero weights are never drawn with replacement; without, they follow (in index order) once the non-zero
    categories are used up, as in PyTorch.  Everything is checked before any draw.
    """
    xp = _dev.array_module(weights)
    if weights.ndim not in (1, 2):
        raise RuntimeError(f"{where}: prob_dist must be 1 or 2 dim, got shape {tuple(weights.shape)}")
    if isinstance(num_samples, bool) or not isinstance(num_samples, numbers.Integral) or num_samples <= 0:
        raise RuntimeError(f"{where}: num_samples must be a positive int, got {num_samples!r}")
    categories = weights.shape[-1]
    if categories == 0:
        raise RuntimeError(f"{where}: the number of categories cannot be zero (weights shape {tuple(weights.shape)})")
    w = xp.asarray(weights, dtype=np.float64).reshape(-1, categories)
    if not bool(xp.all(xp.isfinite(w))) or bool(xp.any(w < 0)):
        raise RuntimeError(f"{where}: probability tensor contains either `inf`, `nan` or element < 0")
    total = w.sum(axis=1)
    if bool(xp.any(total <= 0)):
        raise RuntimeError(f"{where}: invalid multinomial distribution (sum of probabilities <= 0) in a row of "
                           f"weights {tuple(weights.shape)}")
    rows = w.shape[0]
    if not replacement:
        if num_samples > categories:
            raise RuntimeError(f"{where}: cannot sample n_sample > prob_dist.size(-1) samples without "
                               f"replacement (num_samples={num_samples}, categories={categories})")
        u = engine.random((rows, categories), dtype=np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            keys = xp.where(w > 0, -xp.log1p(-u) / w, np.inf)     # Exp(1) / w; zero weights last
        out = xp.argsort(keys, axis=1, kind="stable")[:, :num_samples]
    else:
        cdf = xp.cumsum(w, axis=1) / total[:, None]
        u = engine.random((rows, num_samples), dtype=np.float64)
        # one flat searchsorted: row r's cdf and draws live in [r, r + 1]
        offsets = xp.arange(rows, dtype=np.float64)[:, None]
        out = xp.searchsorted((cdf + offsets).ravel(), (u + offsets).ravel(), side="right").reshape(rows, -1)
        out = out - (xp.arange(rows) * categories)[:, None]
        out = xp.minimum(out, categories - 1)            # u rounding up to the row's end
    out = out.astype(np.int64, copy=False)
    return out[0] if weights.ndim == 1 else out


def multinomial(input, num_samples, replacement=False, *, generator=None):
    """``torch.multinomial``: indices drawn from the categories of each row of ``input`` (weights)."""
    from .tensor import Tensor
    if not isinstance(input, Tensor):
        raise TypeError(f"multinomial: input must be a Tensor, got {type(input).__name__}")
    if not input.dtype.kind == "f":
        raise RuntimeError(f"multinomial only supports floating-point dtypes for input, got {input.dtype}")
    dev = input.device
    with _dev.device_guard(dev):
        eng = engine_for(dev, generator)
        return Tensor._from_array(multinomial_indices(input.data, num_samples, replacement, eng))

"""Random engines: the raw draw streams behind ``minidnn.Generator``, one kind per device type.

Both engines offer the NumPy ``Generator`` methods the rest of minidnn draws with (``random``,
``standard_normal``, ``integers``, ``permutation``) and an exact, small state that can be saved and
restored in the middle of a stream:

* cpu: NumPy's PCG64 (``numpy.random.default_rng(seed)``).  State: the 128-bit LCG state, the 128-bit
  increment and the one buffered 32-bit half-word -- everything PCG64 carries (its normals use the
  ziggurat method, which keeps no cached value).
* cuda: counter-based, as PyTorch's Philox generator: the state is ``(seed, offset)``.  Each draw
  builds fresh cuRAND Philox4_32_10 states from ``SeedSequence([seed, offset])`` and then advances
  ``offset`` by one, so restoring two integers restores the stream exactly; no device memory has to be
  saved.  (Philox states initialise in O(1) per thread, which is what makes a fresh set per draw cheap.)

Serialised state (``engine_state`` / ``set_engine_state``): 8 little-endian uint64 words, 64 bytes,
``[MAGIC, kind, initial seed, w3, w4, w5, w6, w7]`` with kind 0 = cpu PCG64 (w3..w6: state lo/hi,
increment lo/hi; w7: has_uint32 << 32 | uinteger) and kind 1 = cuda counter (w3: seed, w4: offset).
"""
from __future__ import annotations

import numpy as np

from .devices import Device, device, device_guard, require_cupy

__all__ = ["new_engine", "engine_state", "set_engine_state", "STATE_BYTES", "CudaCounterEngine"]

_MAGIC = 0x6D646E5F726E6731          # "mdn_rng1"
_KIND_CPU, _KIND_CUDA = 0, 1
_WORDS = 8
STATE_BYTES = _WORDS * 8
_MASK63 = (1 << 63) - 1
_MASK64 = (1 << 64) - 1
_MAX_CUDA_STATES = 1 << 18           # cuRAND states per draw at most (kernels stride over larger outputs)


def new_engine(dev, seed: int):
    """A fresh engine for device ``dev`` seeded with ``seed`` (an int in [0, 2**64))."""
    dev = device(dev)
    if dev.type == "cpu":
        return np.random.default_rng(int(seed))
    return CudaCounterEngine(dev, int(seed))


def engine_state(engine, initial_seed: int) -> np.ndarray:
    """The engine's state as 64 bytes (uint8), ``initial_seed`` stored beside it."""
    words = np.zeros(_WORDS, dtype="<u8")
    words[0], words[2] = _MAGIC, int(initial_seed) & _MASK64
    if isinstance(engine, CudaCounterEngine):
        words[1], words[3], words[4] = _KIND_CUDA, engine.seed, engine.offset
        words[5] = engine.device_counter()
    else:
        st = engine.bit_generator.state
        if st["bit_generator"] != "PCG64":
            raise RuntimeError(f"engine_state: only PCG64 engines are supported, got {st['bit_generator']}")
        s, inc = st["state"]["state"], st["state"]["inc"]
        words[1] = _KIND_CPU
        words[3], words[4], words[5], words[6] = s & _MASK64, s >> 64, inc & _MASK64, inc >> 64
        words[7] = (int(st["has_uint32"]) << 32) | int(st["uinteger"])
    return words.view(np.uint8).copy()


def decode_state(state: np.ndarray, where: str):
    """(kind, initial seed, words) of a serialised state, or RuntimeError naming what is wrong."""
    state = np.asarray(state)
    if state.dtype != np.uint8 or state.ndim != 1 or state.size != STATE_BYTES:
        raise RuntimeError(f"{where}: expected a uint8 state of {STATE_BYTES} bytes (from get_state / "
                           f"get_rng_state), got dtype {state.dtype} shape {tuple(state.shape)}")
    words = np.ascontiguousarray(state).view("<u8")
    if int(words[0]) != _MAGIC or int(words[1]) not in (_KIND_CPU, _KIND_CUDA):
        raise RuntimeError(f"{where}: these {STATE_BYTES} bytes are not a minidnn generator state "
                           "(wrong magic number or kind)")
    return ("cpu" if int(words[1]) == _KIND_CPU else "cuda"), int(words[2]), [int(w) for w in words]


def set_engine_state(engine, state: np.ndarray, where="set_state") -> int:
    """Restore ``engine`` from 64 state bytes; returns the stored initial seed.  Checks everything first."""
    kind, initial_seed, w = decode_state(state, where)
    is_cuda = isinstance(engine, CudaCounterEngine)
    if kind != ("cuda" if is_cuda else "cpu"):
        raise RuntimeError(f"{where}: the state is of a {kind} generator, this generator is "
                           f"{'cuda' if is_cuda else 'cpu'}")
    if is_cuda:
        engine.seed, engine.offset = w[3], w[4]
        engine.set_device_counter(w[5])
    else:
        has_uint32, uinteger = w[7] >> 32, w[7] & 0xFFFFFFFF
        if has_uint32 > 1:
            raise RuntimeError(f"{where}: corrupt cpu state (has_uint32={has_uint32})")
        engine.bit_generator.state = {"bit_generator": "PCG64",
                                      "state": {"state": w[3] | (w[4] << 64), "inc": w[5] | (w[6] << 64)},
                                      "has_uint32": has_uint32, "uinteger": uinteger}
    return initial_seed


class CudaCounterEngine:
    """A GPU draw stream whose whole state is ``(seed, offset)``: every draw uses fresh Philox states."""

    __slots__ = ("device", "seed", "offset", "_last", "_dcounter", "_dstate", "_ticket")

    def __init__(self, dev: Device, seed: int):
        self.device, self.seed, self.offset = dev, int(seed) & _MASK64, 0
        self._last = None
        self._dcounter = 0          # the device-side Philox stream's counter (dropout), while not on the device
        self._dstate = None         # (2,) uint64 device array [key, counter], created on first device use
        self._ticket = None

    # -- the device-side stream (dropout kernels advance it on the GPU: capturable) ----------------------------------
    def _device_key(self):
        return int(np.random.SeedSequence([self.seed, 0x0D0]).generate_state(1, np.uint64)[0])

    def device_philox_state(self):
        """([key, counter] uint64 device array, uint32 ticket) that device-side draws read and advance."""
        if self._dstate is None:
            cp = require_cupy()
            with device_guard(self.device):
                self._dstate = cp.asarray(np.array([self._device_key(), self._dcounter], dtype=np.uint64))
                self._ticket = cp.zeros(1, dtype=np.uint32)
        return self._dstate, self._ticket

    def adopt_device_state(self, old):
        """Take over ``old``'s device arrays (writing this engine's key and counter into them in place): a CUDA
        graph captured with the old engine keeps reading the same addresses, so a reseed or a restored state
        reaches its replays (PyTorch's graph-safe generator behaves the same way)."""
        if isinstance(old, CudaCounterEngine) and old._dstate is not None and old.device == self.device:
            self._dstate, self._ticket = old._dstate, old._ticket
            self.set_device_counter(self._dcounter)

    def device_counter(self) -> int:
        return self._dcounter if self._dstate is None else int(self._dstate[1].get())

    def set_device_counter(self, value: int):
        self._dcounter = int(value) & _MASK64
        if self._dstate is not None:
            with device_guard(self.device):
                self._dstate.set(np.array([self._device_key(), self._dcounter], dtype=np.uint64))

    def _next(self):
        """A cuRAND Philox generator (host API, CuPy's RandomState) keyed by (seed, offset), then offset += 1.
        CuPy 14's experimental Generator/BitGenerator objects made per draw returned partly unwritten output on an
        H100, so the legacy, well-trodden path is used.  The last one is kept alive until the next draw."""
        cp = require_cupy()
        key = int(np.random.SeedSequence([self.seed, self.offset]).generate_state(1, np.uint64)[0] & _MASK63)
        self.offset += 1
        self._last = cp.random.RandomState(key, method=cp.cuda.curand.CURAND_RNG_PSEUDO_PHILOX4_32_10)
        return self._last

    def random(self, size=None, dtype=np.float64):
        with device_guard(self.device):
            if _count(size) == 0:                # nothing to draw: no kernel, the stream does not move
                return require_cupy().empty(size, dtype=dtype)
            return self._next().random_sample(size, dtype=dtype)

    def standard_normal(self, size=None, dtype=np.float64):
        with device_guard(self.device):
            if _count(size) == 0:
                return require_cupy().empty(size, dtype=dtype)
            return self._next().standard_normal(size, dtype=dtype)

    def integers(self, low, high=None, size=None, dtype=np.int64, endpoint=False):
        with device_guard(self.device):
            if size is not None and _count(size) == 0:
                return require_cupy().empty(size, dtype=dtype)
            if high is None:
                low, high = 0, low
            if endpoint:
                high = high + 1
            return self._next().randint(low, high, size=size, dtype=dtype)

    def permutation(self, n):
        """A uniform permutation of range(n): argsort of 62-bit random keys (ties have probability ~n^2/2^63)."""
        with device_guard(self.device):
            if int(n) == 0:
                return require_cupy().zeros(0, dtype=np.int64)
            keys = self._next().randint(0, 1 << 62, size=int(n), dtype=np.int64)
            return require_cupy().argsort(keys).astype(np.int64)

    def __repr__(self):
        return f"CudaCounterEngine(device='{self.device}', seed={self.seed}, offset={self.offset})"


def _count(size):
    if size is None:
        return 1
    if isinstance(size, (int, np.integer)):
        return int(size)
    return int(np.prod(size)) if len(size) else 1

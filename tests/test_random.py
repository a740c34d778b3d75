"""Public randomness: minidnn.Generator, the default generators, get/set_rng_state, fork_rng, randperm and
multinomial (statistics against exact probabilities; error types against PyTorch)."""
import itertools
import pickle

import numpy as np
import pytest

import minidnn as mdn
from minidnn import nn
from minidnn.nn import functional as F

torch = pytest.importorskip("torch")


def _draws(generator=None, device="cpu"):
    """One of every kind of draw, as NumPy arrays."""
    kw = {} if generator is None else {"generator": generator}
    return [mdn.rand(5, device=device, **kw).cpu().numpy(), mdn.randn(2, 3, device=device, **kw).cpu().numpy(),
            mdn.randint(0, 100, (7,), device=device, **kw).cpu().numpy(),
            mdn.randperm(9, device=device, **kw).cpu().numpy(),
            mdn.multinomial(mdn.tensor([0.2, 0.5, 0.3], device=device), 4, True, **kw).cpu().numpy()]


def _same(a, b):
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


# -- Generator API ------------------------------------------------------------------------------------------
def test_generator_api_as_pytorch():
    g = mdn.Generator()
    assert g.device == mdn.device("cpu")
    assert g.initial_seed() == torch.Generator().initial_seed() == 67280421310721
    assert g.manual_seed(42) is g and g.initial_seed() == 42
    s = g.seed()
    assert isinstance(s, int) and g.initial_seed() == s
    assert isinstance(mdn.default_generator, mdn.Generator)
    assert mdn.manual_seed(3) is mdn.default_generator and mdn.initial_seed() == 3
    st = g.get_state()
    assert isinstance(st, mdn.Tensor) and st.dtype == np.uint8 and st.shape == (64,)


def test_same_seed_same_stream_and_streams_are_isolated():
    a = _draws(mdn.Generator().manual_seed(7))
    b = _draws(mdn.Generator().manual_seed(7))
    assert _same(a, b)
    assert not _same(a, _draws(mdn.Generator().manual_seed(8)))
    # drawing from a private generator does not move the default stream
    mdn.manual_seed(0)
    plain = _draws() + _draws()
    mdn.manual_seed(0)
    g = mdn.Generator().manual_seed(0)
    interleaved = []
    for _ in range(2):
        _draws(g)
        interleaved += _draws()
        _draws(g)
    assert _same(plain, interleaved)
    # a private generator seeded like the default reproduces the default's stream
    mdn.manual_seed(11)
    default = _draws()
    assert _same(default, _draws(mdn.Generator().manual_seed(11)))


def test_negative_and_bad_seeds():
    assert mdn.Generator().manual_seed(-1).initial_seed() == torch.Generator().manual_seed(-1).initial_seed()
    for bad in (1.5, "3", None, True):
        with pytest.raises(TypeError, match="seed must be an int"):
            mdn.Generator().manual_seed(bad)
    with pytest.raises(RuntimeError, match="out of range"):
        mdn.manual_seed(1 << 64)


@pytest.mark.parametrize("warmup", [0, 1, 3])
def test_get_set_state_round_trips_every_draw(warmup):
    g = mdn.Generator().manual_seed(5)
    for _ in range(warmup):
        _draws(g)
    g._engine().integers(0, 7, size=3, dtype=np.int32)         # leaves PCG64's buffered half-word set
    state = g.get_state()
    first = _draws(g)
    g.set_state(state)
    assert _same(first, _draws(g))
    # into another generator too, and the seed travels with the state
    h = mdn.Generator().set_state(state)
    assert h.initial_seed() == 5
    g.set_state(state)
    assert _same(_draws(g), _draws(h))


def test_global_rng_state_round_trips_rand_randn_dropout_init():
    mdn.manual_seed(1)
    mdn.rand(3)
    x = mdn.ones(200)
    layer = nn.Linear(4, 3)
    state = mdn.get_rng_state()

    def draw():
        nn.init.kaiming_uniform_(layer.weight)
        return [mdn.rand(4).numpy(), mdn.randn(4).numpy(), F.dropout(x, 0.5, True).numpy(),
                nn.Dropout(0.3)(x).numpy(), mdn.empty(6).uniform_(-1, 1).numpy(), layer.weight.detach().numpy().copy()]
    first = draw()
    mdn.set_rng_state(state)
    assert _same(first, draw())
    assert not _same(first, draw())


def test_set_state_rejects_bad_input_and_changes_nothing():
    g = mdn.Generator().manual_seed(9)
    before = g.get_state().numpy().copy()
    with pytest.raises(TypeError, match="uint8 Tensor"):
        g.set_state([1, 2, 3])
    with pytest.raises(RuntimeError, match="64 bytes"):
        g.set_state(mdn.zeros(64))
    with pytest.raises(RuntimeError, match="64 bytes"):
        g.set_state(mdn.tensor(np.zeros(10, np.uint8)))
    with pytest.raises(RuntimeError, match="not a minidnn generator state"):
        g.set_state(mdn.tensor(np.zeros(64, np.uint8)))
    cuda_like = before.copy()
    cuda_like[8] = 1                                            # kind word: cuda
    with pytest.raises(RuntimeError, match="cuda generator"):
        g.set_state(mdn.tensor(cuda_like))
    np.testing.assert_array_equal(g.get_state().numpy(), before)
    with pytest.raises(TypeError, match="minidnn.Generator"):
        mdn.rand(2, generator=np.random.default_rng(0))


def test_generator_pickles_with_its_position():
    g = mdn.Generator().manual_seed(4)
    mdn.rand(3, generator=g)
    h = pickle.loads(pickle.dumps(g))
    assert h.initial_seed() == 4
    assert _same(_draws(g), _draws(h))
    fresh = pickle.loads(pickle.dumps(mdn.Generator().manual_seed(6)))
    assert _same(_draws(fresh), _draws(mdn.Generator().manual_seed(6)))


def test_fork_rng_restores_the_default_stream():
    mdn.manual_seed(2)
    expected = mdn.rand(5).numpy()
    mdn.manual_seed(2)
    with mdn.random.fork_rng():
        mdn.rand(100)
        mdn.manual_seed(99)
    np.testing.assert_array_equal(mdn.rand(5).numpy(), expected)


# -- randperm -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [0, 1, 2, 17])
def test_randperm_is_a_permutation(n):
    p = mdn.randperm(n)
    assert p.dtype == np.int64 and p.shape == (n,)
    np.testing.assert_array_equal(np.sort(p.numpy()), np.arange(n))
    assert mdn.randperm(n, dtype=mdn.int32).dtype == np.int32


def test_randperm_is_uniform():
    g = mdn.Generator().manual_seed(0)
    counts = {}
    trials = 6000
    for _ in range(trials):
        key = tuple(mdn.randperm(3, generator=g).numpy().tolist())
        counts[key] = counts.get(key, 0) + 1
    assert set(counts) == set(itertools.permutations(range(3)))
    expected = trials / 6
    chi2 = sum((c - expected) ** 2 / expected for c in counts.values())
    assert chi2 < 20.5                      # chi-square, 5 degrees of freedom, p = 0.001


def test_randperm_bad_input():
    with pytest.raises(RuntimeError, match="non-negative"):
        mdn.randperm(-1)
    with pytest.raises(RuntimeError):
        torch.randperm(-1)


# -- multinomial --------------------------------------------------------------------------------------------
def test_multinomial_with_replacement_frequencies():
    w = np.array([1.0, 0.0, 3.0, 6.0])
    g = mdn.Generator().manual_seed(1)
    s = mdn.multinomial(mdn.tensor(w), 200_000, replacement=True, generator=g).numpy()
    freq = np.bincount(s, minlength=4) / s.size
    np.testing.assert_allclose(freq, w / w.sum(), atol=4e-3)
    assert freq[1] == 0


def test_multinomial_without_replacement_follows_sequential_sampling():
    """P(first = a, second = b) = w_a / W * w_b / (W - w_a): the exact law of drawing without replacement."""
    w = np.array([1.0, 2.0, 5.0])
    g = mdn.Generator().manual_seed(2)
    rows = mdn.multinomial(mdn.tensor(np.tile(w, (30_000, 1))), 2, generator=g).numpy()
    assert (rows[:, 0] != rows[:, 1]).all()
    total = w.sum()
    for a, b in itertools.permutations(range(3), 2):
        p = w[a] / total * w[b] / (total - w[a])
        freq = np.mean((rows[:, 0] == a) & (rows[:, 1] == b))
        assert abs(freq - p) < 0.012, (a, b, freq, p)


def test_multinomial_shapes_and_zero_weights():
    x = mdn.tensor([[0.0, 1.0, 0.0], [2.0, 0.0, 2.0]])
    s = mdn.multinomial(x, 2)
    assert s.shape == (2, 2) and s.dtype == np.int64
    assert s.numpy()[0, 0] == 1 and sorted(s.numpy()[1].tolist()) == [0, 2]
    # without replacement, once the non-zero categories are used up, zero-weight ones follow (as PyTorch)
    assert mdn.multinomial(mdn.tensor([0.0, 1.0, 0.0]), 2).numpy().tolist() == \
        torch.multinomial(torch.tensor([0.0, 1.0, 0.0]), 2).tolist()
    assert x.multinomial(5, True).shape == (2, 5)
    assert (mdn.multinomial(x, 5, True).numpy()[0] == 1).all()


BAD_MULTINOMIAL = [
    ([0.5, -0.1], 1, True), ([0.5, float("inf")], 1, True), ([0.5, float("nan")], 1, True),
    ([0.0, 0.0], 1, True), ([0.2, 0.8], 3, False), ([[[1.0]]], 1, True),
    ([], 1, True), ([0.5, 0.5], 0, True),
]


@pytest.mark.parametrize("weights,n,replacement", BAD_MULTINOMIAL)
def test_multinomial_bad_input_raises_what_pytorch_raises(weights, n, replacement):
    with pytest.raises(RuntimeError) as ours:
        mdn.multinomial(mdn.tensor(np.array(weights, dtype=np.float32)), n, replacement)
    with pytest.raises(RuntimeError):
        torch.multinomial(torch.tensor(weights, dtype=torch.float32), n, replacement)
    assert "multinomial" in str(ours.value) or "prob" in str(ours.value)


# -- cuda (run on the GPU by the lead) ----------------------------------------------------------------------
@pytest.mark.cuda
def test_cuda_generator_state_round_trip_and_isolation():
    g = mdn.Generator("cuda").manual_seed(3)
    assert g.device.type == "cuda"
    mdn.rand(10, device="cuda", generator=g)
    state = g.get_state()
    first = _draws(g, "cuda")
    g.set_state(state)
    assert _same(first, _draws(g, "cuda"))
    assert _same(_draws(mdn.Generator("cuda").manual_seed(4), "cuda"),
                 _draws(mdn.Generator("cuda").manual_seed(4), "cuda"))
    with pytest.raises(RuntimeError, match="cpu generator|cuda"):
        mdn.Generator().set_state(state)
    with pytest.raises(RuntimeError, match="device type"):
        mdn.rand(3, device="cuda", generator=mdn.Generator())


@pytest.mark.cuda
def test_cuda_default_state_round_trips_rand_and_dropout():
    mdn.manual_seed(5)
    x = mdn.ones(1000, device="cuda")
    state = mdn.cuda.get_rng_state()
    first = [mdn.randn(8, device="cuda").cpu().numpy(), F.dropout(x, 0.5, True).cpu().numpy()]
    mdn.cuda.set_rng_state(state)
    again = [mdn.randn(8, device="cuda").cpu().numpy(), F.dropout(x, 0.5, True).cpu().numpy()]
    assert _same(first, again)
    mdn.cuda.manual_seed_all(5)
    assert mdn.cuda.initial_seed() == 5
    kept = F.dropout(mdn.ones(100_000, device="cuda"), 0.25, True).cpu().numpy()
    assert abs((kept != 0).mean() - 0.75) < 0.01


def test_engine_states_encode_both_kinds_without_a_gpu():
    """backend/rng.py on raw engines: the cpu PCG64 state and the cuda (seed, offset) counter round-trip."""
    from minidnn.backend import rng
    from minidnn.backend.devices import Device
    cpu = rng.new_engine("cpu", 12)
    cpu.random(3)
    cpu.integers(0, 5, size=1, dtype=np.int32)
    blob = rng.engine_state(cpu, 12)
    assert blob.dtype == np.uint8 and blob.size == rng.STATE_BYTES
    expected = cpu.standard_normal(4)
    other = rng.new_engine("cpu", 0)
    assert rng.set_engine_state(other, blob) == 12
    np.testing.assert_array_equal(other.standard_normal(4), expected)

    counter = rng.CudaCounterEngine(Device("cuda", 0), 7)          # no draw: nothing touches CuPy
    counter.offset = 41
    blob = rng.engine_state(counter, 7)
    restored = rng.CudaCounterEngine(Device("cuda", 0), 0)
    assert rng.set_engine_state(restored, blob) == 7
    assert (restored.seed, restored.offset) == (7, 41)
    with pytest.raises(RuntimeError, match="cuda generator"):
        rng.set_engine_state(rng.new_engine("cpu", 0), blob)


def test_cuda_counter_engine_logic_with_a_stand_in_for_cupy(monkeypatch):
    """The (seed, offset) engine's bookkeeping, with NumPy standing in for CuPy's Philox RandomState: each
    draw uses the next offset, the same (seed, offset) gives the same draw, restoring the state replays the
    stream, and empty draws do not move it.  (The real CuPy path runs in the cuda-marked tests.)"""
    import contextlib
    import types

    from minidnn.backend import rng
    from minidnn.backend.devices import Device

    made = []

    class StandInRandomState:          # CuPy's RandomState API over NumPy's generator
        def __init__(self, seed, method):
            made.append((seed, method))
            self.g = np.random.Generator(np.random.PCG64(seed))

        def random_sample(self, size, dtype):
            return self.g.random(size).astype(dtype)

        def standard_normal(self, size, dtype=np.float64):
            return self.g.standard_normal(size).astype(dtype)

        def randint(self, low, high, size, dtype):
            return self.g.integers(low, high, size=size).astype(dtype)
    fake = types.SimpleNamespace(random=types.SimpleNamespace(RandomState=StandInRandomState),
                                 cuda=types.SimpleNamespace(curand=types.SimpleNamespace(
                                     CURAND_RNG_PSEUDO_PHILOX4_32_10="philox")),
                                 empty=np.empty, zeros=np.zeros, argsort=np.argsort)
    monkeypatch.setattr(rng, "require_cupy", lambda: fake)
    monkeypatch.setattr(rng, "device_guard", lambda dev: contextlib.nullcontext())
    eng = rng.CudaCounterEngine(Device("cuda", 0), 9)
    a = eng.random((2, 3), dtype=np.float32)
    state = rng.engine_state(eng, 9)
    b = [eng.standard_normal(4), eng.integers(0, 10, size=5), eng.permutation(6)]
    keys = [int(np.random.SeedSequence([9, k]).generate_state(1, np.uint64)[0] & ((1 << 63) - 1)) for k in range(4)]
    assert eng.offset == 4 and [m[0] for m in made] == keys        # one key per draw, from (seed, offset)
    assert all(m[1] == "philox" for m in made)
    assert eng.random((0, 3)).shape == (0, 3) and eng.permutation(0).shape == (0,) and eng.offset == 4
    rng.set_engine_state(eng, state)
    again = [eng.standard_normal(4), eng.integers(0, 10, size=5), eng.permutation(6)]
    assert all(np.array_equal(x, y) for x, y in zip(b, again))
    assert sorted(again[2].tolist()) == list(range(6)) and a.dtype == np.float32

"""Samplers, random_split, Subset and ConcatDataset: PyTorch's semantics (PyTorch as the oracle where the
result is deterministic or an error), statistics for the random ones, and exact mid-epoch resume."""
import itertools

import numpy as np
import pytest

import minidnn as mdn
from minidnn.utils.data import (
    BatchSampler,
    ConcatDataset,
    RandomSampler,
    SequentialSampler,
    Subset,
    SubsetRandomSampler,
    TensorDataset,
    WeightedRandomSampler,
    random_split,
)

torch = pytest.importorskip("torch")
tud = torch.utils.data


def test_sequential_sampler():
    s = SequentialSampler(range(5))
    assert list(s) == list(tud.SequentialSampler(range(5))) and len(s) == 5


@pytest.mark.parametrize("n,bs,drop_last", [(10, 3, False), (10, 3, True), (9, 3, False), (9, 3, True),
                                            (2, 5, False), (2, 5, True), (0, 2, False), (1, 1, True)])
def test_batch_sampler_equals_pytorch(n, bs, drop_last):
    ours = BatchSampler(SequentialSampler(range(n)), bs, drop_last)
    theirs = tud.BatchSampler(tud.SequentialSampler(range(n)), bs, drop_last)
    assert list(ours) == list(theirs) and len(ours) == len(theirs)


BAD_SAMPLERS = [
    ("BatchSampler", lambda m: m.BatchSampler(range(3), 0, False)),
    ("BatchSampler", lambda m: m.BatchSampler(range(3), True, False)),
    ("BatchSampler", lambda m: m.BatchSampler(range(3), 2, 1)),
    ("RandomSampler", lambda m: m.RandomSampler(range(3), replacement=1)),
    ("RandomSampler", lambda m: m.RandomSampler(range(3), num_samples=0)),
    ("WeightedRandomSampler", lambda m: m.WeightedRandomSampler([[1.0]], 1)),
    ("WeightedRandomSampler", lambda m: m.WeightedRandomSampler([1.0], 0)),
    ("WeightedRandomSampler", lambda m: m.WeightedRandomSampler([1.0], 1, replacement=1)),
    ("random_split", lambda m: m.random_split(range(10), [3, 3])),
    ("random_split", lambda m: m.random_split(range(10), [0.5, 0.4])),
    ("ConcatDataset", lambda m: m.ConcatDataset([range(3)])[-5]),
]


@pytest.mark.parametrize("owner,make", BAD_SAMPLERS)
def test_bad_arguments_raise_what_pytorch_raises(owner, make):
    with pytest.raises(Exception) as theirs:
        make(tud)
    with pytest.raises(type(theirs.value)):
        make(mdn.utils.data)


def test_random_sampler_permutations_and_reproducibility():
    s = RandomSampler(range(20))
    mdn.manual_seed(4)
    a, b = list(s), list(s)
    assert sorted(a) == sorted(b) == list(range(20)) and a != b        # a new order each epoch
    mdn.manual_seed(4)
    assert [list(s), list(s)] == [a, b]                                 # follows manual_seed
    g1, g2 = mdn.Generator().manual_seed(1), mdn.Generator().manual_seed(1)
    assert list(RandomSampler(range(20), generator=g1)) == list(RandomSampler(range(20), generator=g2))


def test_random_sampler_num_samples_and_replacement():
    s = RandomSampler(range(4), num_samples=10)
    out = list(s)
    assert len(out) == len(s) == 10
    assert sorted(out[:4]) == sorted(out[4:8]) == [0, 1, 2, 3] and len(set(out[8:])) == 2
    r = RandomSampler(range(5), replacement=True, num_samples=5000, generator=mdn.Generator().manual_seed(0))
    counts = np.bincount(list(r), minlength=5)
    assert counts.sum() == 5000 and np.all(np.abs(counts / 5000 - 0.2) < 0.03)


def test_subset_random_sampler():
    idx = [3, 8, 11, 20]
    out = list(SubsetRandomSampler(idx, generator=mdn.Generator().manual_seed(0)))
    assert sorted(out) == idx and len(SubsetRandomSampler(idx)) == 4


def test_weighted_random_sampler_statistics():
    w = [0.1, 0.0, 0.3, 0.6]
    s = WeightedRandomSampler(w, 100_000, generator=mdn.Generator().manual_seed(3))
    freq = np.bincount(list(s), minlength=4) / 100_000
    np.testing.assert_allclose(freq, w, atol=5e-3)
    once = list(WeightedRandomSampler(mdn.tensor([1.0, 2.0, 3.0, 4.0]), 4, replacement=False))
    assert sorted(once) == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="non-negative"):
        WeightedRandomSampler([1.0, -1.0], 3)


@pytest.mark.parametrize("n,lengths", [(10, [0.33, 0.33, 0.34]), (7, [0.5, 0.5]), (11, [0.1, 0.2, 0.3, 0.4]),
                                       (10, [3, 7]), (5, [0.2, 0.8]), (3, [1.0, 0.0])])
def test_random_split_sizes_as_pytorch(n, lengths):
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = [len(p) for p in tud.random_split(range(n), lengths)]
    parts = random_split(TensorDataset(np.arange(n)), lengths, generator=mdn.Generator().manual_seed(0))
    assert [len(p) for p in parts] == expected
    got = np.concatenate([p.indices for p in parts])
    assert sorted(got.tolist()) == list(range(n))
    again = random_split(TensorDataset(np.arange(n)), lengths, generator=mdn.Generator().manual_seed(0))
    assert all(np.array_equal(p.indices, q.indices) for p, q in zip(parts, again))


def test_subset_and_concat_dataset_index_as_pytorch():
    a, b = list(range(10, 13)), list(range(20, 22))
    ours, theirs = ConcatDataset([a, b]), tud.ConcatDataset([a, b])
    assert len(ours) == len(theirs) and ours.cumulative_sizes == theirs.cumulative_sizes
    for i in range(-5, 5):
        assert ours[i] == theirs[i]
    x = np.arange(12.0).reshape(6, 2)
    sub = Subset(TensorDataset(x), [4, 1])
    np.testing.assert_array_equal(sub[0][0].numpy(), x[4])
    cat = ConcatDataset([TensorDataset(x[:3]), TensorDataset(x[3:])])
    np.testing.assert_array_equal(cat.get_batch(np.array([1, 4, 2]))[0], x[[1, 4, 2]])      # mixed parts
    np.testing.assert_array_equal(cat.get_batch(np.array([4, 5]))[0], x[[4, 5]])            # one part


# -- exact mid-epoch resume -------------------------------------------------------------------------------
SAMPLERS = {
    "sequential": lambda g: SequentialSampler(range(13)),
    "random": lambda g: RandomSampler(range(13), generator=g),
    "random_replacement": lambda g: RandomSampler(range(13), replacement=True, num_samples=20, generator=g),
    "random_more": lambda g: RandomSampler(range(5), num_samples=13, generator=g),
    "subset": lambda g: SubsetRandomSampler([2, 4, 6, 8, 10, 12], generator=g),
    "weighted": lambda g: WeightedRandomSampler([1.0, 2.0, 0.5, 3.0], 11, generator=g),
    "weighted_once": lambda g: WeightedRandomSampler([1.0, 2.0, 0.5, 3.0, 1.0], 5, replacement=False, generator=g),
}


@pytest.mark.parametrize("with_generator", [False, True])
@pytest.mark.parametrize("name", list(SAMPLERS))
@pytest.mark.parametrize("stop", [0, 3])
def test_sampler_state_dict_resumes_mid_epoch(name, with_generator, stop):
    make = SAMPLERS[name]
    mdn.manual_seed(10)
    g = mdn.Generator().manual_seed(10) if with_generator else None
    sampler = make(g)
    list(sampler)                                  # one whole epoch first: the state is not the first one
    it = iter(sampler)
    head = [next(it) for _ in range(stop)]
    state = sampler.state_dict()
    rng = mdn.get_rng_state()
    rest = list(it)
    next_epoch = list(sampler)

    mdn.manual_seed(999)                           # the resumed run starts elsewhere; the state decides
    g2 = mdn.Generator().manual_seed(123) if with_generator else None
    resumed = make(g2)
    resumed.load_state_dict(mdn.load(_roundtrip(state)))
    mdn.set_rng_state(rng)
    assert list(resumed) == rest
    assert len(head) + len(rest) == len(sampler)
    assert list(resumed) == next_epoch             # and the epochs after it are the uninterrupted ones


def _roundtrip(obj, _n=[0]):
    import os
    import tempfile
    _n[0] += 1
    path = os.path.join(tempfile.mkdtemp(), f"state{_n[0]}.mdn")
    mdn.save(obj, path)
    return path


def test_batch_sampler_state_dict_resumes():
    mdn.manual_seed(0)
    bs = BatchSampler(RandomSampler(range(11)), 3, drop_last=False)
    it = iter(bs)
    first = [next(it), next(it)]
    state, rng = bs.state_dict(), mdn.get_rng_state()
    rest = list(it)
    other = BatchSampler(RandomSampler(range(11)), 3, drop_last=False)
    other.load_state_dict(state)
    mdn.set_rng_state(rng)
    assert list(other) == rest and sum(map(len, first + rest)) == 11


def test_sampler_load_state_dict_rejects_bad_states():
    s = RandomSampler(range(5))
    list(s)
    good = s.state_dict()
    for bad in ({}, {"epoch": None, "yielded": 2}, {"epoch": {"x": 1}, "yielded": 0},
                {"epoch": good["epoch"], "yielded": -1}, {"epoch": good["epoch"], "yielded": 6}):
        with pytest.raises(ValueError):
            s.load_state_dict(bad)
    with pytest.raises(ValueError, match="generator"):
        s.load_state_dict({"epoch": {"generator_state": mdn.Generator().get_state()}, "yielded": 0})
    with pytest.raises(TypeError, match="no state_dict"):
        BatchSampler(_NoState(), 2, False).state_dict()
    assert list(s) != [] and sorted(list(s)) == [0, 1, 2, 3, 4]       # the failed loads changed nothing


class _NoState:
    def __iter__(self):
        return iter(range(4))

    def __len__(self):
        return 4


def test_permutation_statistics_of_random_sampler():
    g = mdn.Generator().manual_seed(5)
    s = RandomSampler(range(3), generator=g)
    counts = {}
    for _ in range(3000):
        key = tuple(s)
        counts[key] = counts.get(key, 0) + 1
    assert set(counts) == set(itertools.permutations(range(3)))
    assert max(abs(c - 500) for c in counts.values()) < 90

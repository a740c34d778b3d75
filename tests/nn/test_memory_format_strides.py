"""``_memory_format.is_in`` reads channels-last from the strides (session 11, round 22b); it must answer as the old
rule did -- the channels-last view's ``flags.c_contiguous`` (a transpose per call) -- on every layout: all shapes of
extent 0-3 on 4 and 5 axes in every memory order, with sliced (non-contiguous), reversed, broadcast (0-stride) and
size-1 axes of any stride, in several dtypes."""
import itertools

import numpy as np
import pytest
from numpy.lib.stride_tricks import as_strided

import minidnn as mdn
from minidnn import _memory_format as MF


def _old_is_in(a, fmt):     # the rule before round 22b
    if fmt is MF.contiguous_format:
        return bool(a.flags.c_contiguous)
    return bool(a.transpose(MF._last_perm(a.ndim)).flags.c_contiguous)


def _layouts(nd, extents):
    for shape in itertools.product(*[extents] * nd):
        for perm in itertools.permutations(range(nd)):
            a = np.zeros(tuple(shape[i] for i in perm), np.float32).transpose(np.argsort(perm))
            yield a
            yield a[..., ::2]
            yield a[:, ::2]
            yield a[:, :1]
            yield a[::-1]
            yield a[:, :, ::-1]


@pytest.mark.parametrize("nd,fmt", [(4, MF.channels_last), (5, MF.channels_last_3d)])
def test_is_in_equals_the_transposed_views_flag_on_every_layout(nd, fmt):
    n = cl = 0
    for a in _layouts(nd, (0, 1, 2, 3) if nd == 4 else (0, 1, 3)):
        for f in (fmt, MF.contiguous_format, MF.preserve_format):
            want = True if f is MF.preserve_format else _old_is_in(a, f)
            assert MF.is_in(a, f) is want, (a.shape, a.strides, f)
        cl += MF.is_in(a, fmt)
        n += 1
    assert n > 20000 and 0 < cl < n      # both answers met, many times


@pytest.mark.parametrize("dtype", [np.float16, np.float64, np.int8, np.complex64])
def test_is_in_size_one_and_zero_strides(dtype):
    """Extent-1 axes may carry any stride (0, huge, negative) and still be channels-last; a 0-stride axis of
    extent > 1 (a broadcast) never is; the item size sets the strides."""
    base = np.zeros(4 * 5 * 6 * 7, dtype)
    it = base.itemsize
    rng = np.random.default_rng(0)
    n = cl = 0
    choices = [0, it, 2 * it, 3 * it, 5 * it, 7 * it, 12 * it, 60 * it, 999 * it]
    for shape in itertools.product((1, 2, 5), (1, 3, 7), (1, 4), (1, 2, 6)):
        c = shape[1]    # the dense channels-last strides, then extent-1 axes given any stride, then anything
        exact = [shape[2] * shape[3] * c * it, it, shape[3] * c * it, c * it]
        for k in range(24):
            if k == 0:
                strides = exact
            elif k < 12:
                strides = [int(rng.choice(choices)) if d == 1 else s_ for d, s_ in zip(shape, exact)]
            else:
                strides = [int(rng.choice(choices)) for _ in shape]
            a = as_strided(base, shape, strides)        # (read only through its strides: never dereferenced)
            for fmt in (MF.channels_last, MF.contiguous_format):
                assert MF.is_in(a, fmt) is _old_is_in(a, fmt), (shape, strides, fmt)
            cl += MF.is_in(a, MF.channels_last)
            n += 1
    assert n > 1000 and 200 < cl < n - 200
    b = np.zeros((2, 3, 1, 4), dtype).transpose(0, 3, 1, 2)         # (2, 4, 3, 1): channels-last, W of extent 1
    assert MF.is_in(b, MF.channels_last)
    assert MF.is_in(as_strided(b, b.shape, (*b.strides[:3], 999 * it)), MF.channels_last)
    assert not MF.is_in(np.broadcast_to(np.zeros((1, 4, 1, 1), dtype), (2, 4, 3, 3)), MF.channels_last)


def test_is_in_checks_rank_and_format_first():
    a = np.zeros((2, 3, 4), np.float32)
    with pytest.raises(RuntimeError, match="required rank 4 tensor to use channels_last"):
        MF.is_in(a, MF.channels_last)
    with pytest.raises(RuntimeError, match="required rank 5 tensor to use channels_last_3d"):
        MF.is_in(np.zeros((2, 3, 4, 5), np.float32), MF.channels_last_3d)
    with pytest.raises(TypeError, match="memory_format must be"):
        MF.is_in(a, "channels_last")
    t = mdn.zeros(2, 3, 4, 5).to(memory_format=mdn.channels_last)
    assert t.is_contiguous(memory_format=mdn.channels_last) and not t.is_contiguous()
    assert mdn.zeros(2, 3, 4, 5).is_contiguous(memory_format=mdn.contiguous_format)

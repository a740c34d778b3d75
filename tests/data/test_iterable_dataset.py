"""IterableDataset through the DataLoader: batches and their order equal PyTorch's (in-process and with
workers that shard the stream with get_worker_info, uneven shards included), argument errors as PyTorch's,
persistent workers restarting the stream each epoch, and resume by batch count."""
import numpy as np
import pytest

import minidnn as mdn
from minidnn.utils import data as mdata

torch = pytest.importorskip("torch")
tdata = torch.utils.data
pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")     # torch's 3-workers-on-2-cpus note


def stream(base, n, sized=True):
    """The same stream class for both frameworks: worker i yields i, i + k, ... (k workers)."""

    class Stream(base.IterableDataset):
        def __iter__(self):
            info = base.get_worker_info()
            lo, step = (0, 1) if info is None else (info.id, info.num_workers)
            for i in range(lo, n, step):
                yield np.full(2, i, dtype=np.float32), i
    if sized:
        Stream.__len__ = lambda self: n
    return Stream()


def labels(batches):
    out = []
    for b in batches:
        y = b[1]
        out.append(y.tolist() if hasattr(y, "tolist") else int(y))
    return out


@pytest.mark.parametrize("n", [10, 7])
@pytest.mark.parametrize("workers", [0, 2, 3])
@pytest.mark.parametrize("batch_size,drop_last", [(3, False), (3, True), (None, False), (1, False)])
def test_batches_and_order_equal_pytorch(n, workers, batch_size, drop_last):
    kw = dict(batch_size=batch_size, drop_last=drop_last, num_workers=workers)
    theirs = labels(tdata.DataLoader(stream(tdata, n), **kw))
    ours = labels(mdata.DataLoader(stream(mdata, n), **kw))
    assert ours == theirs
    assert len(mdata.DataLoader(stream(mdata, n), **kw)) == len(tdata.DataLoader(stream(tdata, n), **kw))


@pytest.mark.parametrize("kwargs", [dict(shuffle=True), dict(sampler=[0, 1]), dict(batch_sampler=[[0]])])
def test_sampler_options_are_rejected_as_pytorch(kwargs):
    with pytest.raises(ValueError):
        tdata.DataLoader(stream(tdata, 4), **kwargs)
    with pytest.raises(ValueError, match="IterableDataset"):
        mdata.DataLoader(stream(mdata, 4), **kwargs)


def test_len_of_an_unsized_stream_is_a_type_error_as_pytorch():
    with pytest.raises(TypeError):
        len(tdata.DataLoader(stream(tdata, 4, sized=False), batch_size=2))
    with pytest.raises(TypeError):
        len(mdata.DataLoader(stream(mdata, 4, sized=False), batch_size=2))
    assert labels(mdata.DataLoader(stream(mdata, 4, sized=False), batch_size=2)) == [[0, 1], [2, 3]]


def test_persistent_workers_restart_the_stream_each_epoch():
    loader = mdata.DataLoader(stream(mdata, 9), batch_size=2, num_workers=2, persistent_workers=True)
    first, second = labels(loader), labels(loader)
    assert first == second == labels(tdata.DataLoader(stream(tdata, 9), batch_size=2, num_workers=2))


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_skips_the_batches_handed_out(workers):
    loader = mdata.DataLoader(stream(mdata, 11), batch_size=2, num_workers=workers)
    it = iter(loader)
    head = [next(it), next(it)]
    state = loader.state_dict()
    rest = labels(it)
    other = mdata.DataLoader(stream(mdata, 11), batch_size=2, num_workers=workers)
    other.load_state_dict(state)
    assert labels(other) == rest and len(head) + len(rest) == len(loader)
    assert mdn.utils.data.IterableDataset is mdn.data.IterableDataset
    unsized = mdata.DataLoader(stream(mdata, 5, sized=False), batch_size=2, num_workers=workers)
    it = iter(unsized)
    next(it)
    again = mdata.DataLoader(stream(mdata, 5, sized=False), batch_size=2, num_workers=workers)
    again.load_state_dict(unsized.state_dict())
    assert labels(again) == labels(it)

"""A convolution's two gradients on two threads (threads.parallel_pair, CPU, >= 2 threads) use the calling thread's
handle for both halves: the default handle is per thread, so a half run on a pool thread would otherwise get
another handle -- its own algorithm cache, benchmark timings and settings."""
import numpy as np

import minidnn as mdn
import minidnn.backend as B
import minidnn.nn.functional as F
from minidnn.backend import threads


def test_both_gradients_get_the_callers_handle(monkeypatch):
    seen = []
    bd, bf = B.convolution_backward_data, B.convolution_backward_filter

    def spy_bd(h, *a, **k):
        seen.append(("data", h))
        return bd(h, *a, **k)

    def spy_bf(h, *a, **k):
        seen.append(("filter", h))
        return bf(h, *a, **k)
    monkeypatch.setattr(B, "convolution_backward_data", spy_bd)
    monkeypatch.setattr(B, "convolution_backward_filter", spy_bf)
    previous = threads.get_num_threads()
    threads.set_num_threads(2)
    try:
        rng = np.random.default_rng(0)
        x = mdn.tensor(rng.standard_normal((64, 6, 14, 14)).astype(np.float32), requires_grad=True)  # a paired size
        w = mdn.tensor(rng.standard_normal((16, 6, 5, 5)).astype(np.float32), requires_grad=True)
        F.conv2d(x, w).sum().backward()
    finally:
        threads.set_num_threads(previous)
    handles = {kind: h for kind, h in seen}
    assert set(handles) == {"data", "filter"}
    assert handles["data"] is handles["filter"] is B.get_default_handle("cpu")

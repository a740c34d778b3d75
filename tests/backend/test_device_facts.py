"""device_facts (session 18): the GPU facts the planners ask -- shared memory limits, L2 size, sm_80+ -- read once per
device into one cache, and the one "a streaming hint only beyond L2" rule that softmax and dropout share.  CPU only:
a stand-in CuPy device answers the attribute queries and counts them."""
import types

import pytest

from minidnn.backend.cuda import bn_kernels, bn_nhwc, device_facts, dropout_philox, softmax_kernels

H200 = {"MaxSharedMemoryPerMultiprocessor": 233472, "MaxSharedMemoryPerBlockOptin": 232448, "L2CacheSize": 62914560}


@pytest.fixture
def fake_devices(monkeypatch):
    """device_facts asks a stand-in CuPy: device 3 an H200 (sm_90), 4 an sm_75 with a 4 MB L2, 5 a device that
    answers no attribute; the caches start empty and every Device() is counted."""
    asked = []
    table = {3: (H200, 90), 4: ({"L2CacheSize": 4 << 20, "MaxSharedMemoryPerMultiprocessor": 65536,
                                  "MaxSharedMemoryPerBlockOptin": 65536}, 75), 5: ({}, "")}

    def device(dev):
        asked.append(dev)
        attrs, cc = table[dev]
        return types.SimpleNamespace(attributes=attrs, compute_capability=cc)
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(Device=device))
    monkeypatch.setattr(device_facts._launch, "cupy", lambda: fake)
    kept = dict(device_facts._l2), dict(device_facts._smem)
    device_facts._l2.clear()
    device_facts._smem.clear()
    yield asked
    for cache, old in zip((device_facts._l2, device_facts._smem), kept):
        cache.clear()
        cache.update(old)


def test_facts_read_once_per_device(fake_devices):
    assert device_facts.smem_limits(3) == (233472, 232448)
    assert device_facts.l2_info(3) == (62914560, True) and device_facts.sm80(3)
    assert device_facts.l2_info(4) == (4 << 20, False) and not device_facts.sm80(4)
    assert device_facts.smem_limits(4) == (65536, 65536)
    n = len(fake_devices)
    for _ in range(3):
        device_facts.smem_limits(3), device_facts.l2_info(3), device_facts.sm80(4)
    assert len(fake_devices) == n == 4          # each cache asked each device once


def test_a_device_that_does_not_say(fake_devices):
    """No attributes (an old or fake CuPy): no shared memory, no L2 (the paths that need them stay off)."""
    assert device_facts.smem_limits(5) == (0, 0)
    assert device_facts.l2_info(5) == (0, False) and not device_facts.sm80(5)
    assert device_facts.beyond_l2(1, 5)         # L2 unknown: the hint as the setting asks


def test_beyond_l2_is_strictly_more_than_the_l2(fake_devices):
    l2 = H200["L2CacheSize"]
    assert not device_facts.beyond_l2(l2, 3) and device_facts.beyond_l2(l2 + 1, 3)
    assert not device_facts.beyond_l2(0, 3)
    assert device_facts.beyond_l2(5 << 20, 4) and not device_facts.beyond_l2(4 << 20, 4)


@pytest.mark.parametrize("hint", [1, 2])
def test_softmax_and_dropout_hints_follow_the_one_rule(monkeypatch, fake_devices, hint):
    """Both call_hints hint exactly where beyond_l2 says (softmax: the call's bytes; dropout: x and y), on either
    side of each device's L2 -- and every size without HINT_BY_SIZE."""
    monkeypatch.setattr(softmax_kernels, "HINT_FWD", hint)
    monkeypatch.setattr(softmax_kernels, "HINT_BWD", 2)
    monkeypatch.setattr(softmax_kernels, "HINT_BY_SIZE", True)
    monkeypatch.setattr(dropout_philox, "HINT_BY_SIZE", True)
    seen = set()
    for dev in (3, 4, 5):
        l2 = device_facts.l2_info(dev)[0]
        for nbytes in (8, (l2 or 64) - 8, l2, l2 + 8, 4 * (l2 + 8)):
            want = device_facts.beyond_l2(nbytes, dev)
            seen.add(want)
            assert softmax_kernels.call_hint(False, nbytes, dev) == (hint if want else 0), (dev, nbytes)
            assert softmax_kernels.call_hint(True, nbytes, dev) == (2 if want else 0), (dev, nbytes)
            assert dropout_philox.call_hint(hint, nbytes // 8, 4, dev) == (hint if want else 0), (dev, nbytes)
    assert seen == {True, False}
    monkeypatch.setattr(softmax_kernels, "HINT_BY_SIZE", False)
    monkeypatch.setattr(dropout_philox, "HINT_BY_SIZE", False)
    assert softmax_kernels.call_hint(False, 8, 3) == hint and dropout_philox.call_hint(hint, 1, 4, 3) == hint


def test_batch_norm_reads_the_same_cache(fake_devices):
    """bn_kernels' rounds take device_facts' L2 (an H100's 50 MB where the device does not say); bn_nhwc asks
    device_facts' own functions and keeps no cache of its own (session 19: the caches are set in device_facts only,
    so a test that wrote bn_nhwc._smem fails loudly instead of planning for a device it did not mean)."""
    assert bn_kernels._l2_bytes(3) == H200["L2CacheSize"] and bn_kernels._l2_bytes(4) == 4 << 20
    assert bn_kernels._l2_bytes(5) == 50 * 2 ** 20
    assert bn_nhwc.l2_info is device_facts.l2_info and bn_nhwc.smem_limits is device_facts.smem_limits
    for name in ("_l2", "_smem", "sm80"):
        assert not hasattr(bn_nhwc, name), name
    device_facts._smem[6] = (1, 2)              # a write to the cache reaches bn_nhwc's planner, no device asked
    device_facts._l2[6] = (3, True)
    assert bn_nhwc.smem_limits(6) == (1, 2) and bn_nhwc.l2_info(6) == (3, True) and 6 not in fake_devices

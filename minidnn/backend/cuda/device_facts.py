"""What the kernel planners ask of a GPU, asked once per device and kept: its shared memory limits, its L2 size and
whether it is sm_80 or newer (cache-hint PTX, cp.async), and the one rule built on the L2 size -- a call whose data
does not fit L2 takes a streaming hint (a call that fits would evict what the next kernel reads from L2).

Batch norm (bn_nhwc, bn_kernels, bn_cluster), softmax, cross-entropy and dropout plan with these; a device that does
not say (an old CuPy, the fake CuPy of tools/record_launches.py) reads as (0, 0) shared memory and (0, False) L2:
the planners then leave the paths that need the fact off.  Tests set a device's facts by writing the caches
(``_smem[dev] = (per SM, per block)``, ``_l2[dev] = (bytes, sm80)``), so no GPU is asked.
"""
from __future__ import annotations

from . import launch as _launch

__all__ = ["smem_limits", "l2_info", "sm80", "beyond_l2"]

_smem: dict = {}
_l2: dict = {}


def smem_limits(dev):
    """(shared memory per SM, the most one block may opt into) in bytes on GPU ``dev``; (0, 0) where the device
    does not say (no on-chip copy then)."""
    r = _smem.get(dev)
    if r is None:
        try:
            a = _launch.cupy().cuda.Device(dev).attributes
            r = (int(a["MaxSharedMemoryPerMultiprocessor"]), int(a["MaxSharedMemoryPerBlockOptin"]))
        except (KeyError, AttributeError, TypeError):
            r = (0, 0)
        _smem[dev] = r
    return r


def l2_info(dev):
    """(L2 bytes, whether the device takes createpolicy / ld.global.L2::cache_hint: sm_80+) of GPU ``dev``; (0,
    False) where the device does not say (KEEP off then)."""
    r = _l2.get(dev)
    if r is None:
        try:
            d = _launch.cupy().cuda.Device(dev)
            r = (int(d.attributes["L2CacheSize"]), int(str(d.compute_capability)) >= 80)
        except (KeyError, AttributeError, TypeError, ValueError):
            r = (0, False)
        _l2[dev] = r
    return r


def sm80(dev) -> bool:
    """Whether GPU ``dev`` is sm_80 or newer (l2_info's flag): the cache-hint PTX batch norm's KEEP uses, and
    cp.async, which the cross-entropy LONG stage and the softmax backward's stash 3 fill shared memory with.  False
    where it does not say."""
    return l2_info(dev)[1]


def beyond_l2(nbytes, dev) -> bool:
    """Whether a call whose arrays hold ``nbytes`` takes a streaming store / load hint on GPU ``dev``: its data
    exceeds the L2 (a call that fits it leaves its output in L2 for the next kernel), or the device does not say its
    L2 size (the hint then, as the setting asks)."""
    l2 = l2_info(dev)[0]
    return l2 == 0 or nbytes > l2
